/* auth.c - bearer API keys, hashed at rest
 *
 * DESIGN: the keys file is read once at start into an immutable array (see obx_auth.h);
 * lookups hash the presented key with SHA-256 (libcrypto) and compare against every entry with
 * CRYPTO_memcmp, so timing does not reveal which entry nearly matched. Reads api.keys_file. */
#include "obx/obx_auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

struct obx_auth {
  obx_auth_key_t *keys;
  int nkeys;
};

void obx_sha256_hex(const void *data, size_t len, char out[OBX_AUTH_HASH_LEN + 1]) {
  static const char hex[] = "0123456789abcdef";
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(data, len, md);
  for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  out[OBX_AUTH_HASH_LEN] = '\0';
}

void obx_auth_hash(const char *key, char out[OBX_AUTH_HASH_LEN + 1]) { obx_sha256_hex(key, strlen(key), out); }

bool obx_auth_key_generate(char out[OBX_AUTH_KEY_LEN + 1], obx_err_t *err) {
  static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  unsigned char raw[33] = {0}; /* 32 random bytes, padded to a multiple of 3 */
  if (RAND_bytes(raw, 32) != 1) {
    obx_err_set(err, OBX_ERR_SYS, 0, true, "RAND_bytes failed");
    return false;
  }
  char *p = out + 4;
  memcpy(out, "obx_", 4);
  for (int i = 0; i < 33; i += 3) {
    unsigned v = (unsigned)raw[i] << 16 | (unsigned)raw[i + 1] << 8 | raw[i + 2];
    for (int k = 3; k >= 0; k--) *p++ = b64url[(v >> (6 * k)) & 63];
  }
  out[OBX_AUTH_KEY_LEN] = '\0'; /* 256 bits need 43 characters; drop the padding one */
  return true;
}

static bool valid_token(const char *s, const char *extra) {
  if (!*s) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr(extra, *s)) return false;
  return true;
}

bool obx_auth_validate_entry(const char *org_id, const char *perms, obx_err_t *err) {
  if (!valid_token(org_id, "-_.")) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "org id '%s' must be letters, digits, '-', '_' or '.'", org_id);
    return false;
  }
  if (!valid_token(perms, ":,*-_") || perms[strlen(perms) - 1] == ',' || strstr(perms, ",,") || perms[0] == ',') {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "permissions '%s' must be a comma-separated list like orders:write,outbox:read", perms);
    return false;
  }
  return true;
}

static void auth_key_cleanup(obx_auth_key_t *key) {
  for (int i = 0; i < key->nperms; i++) free(key->perms[i]);
  free(key->perms);
  free(key->org_id);
}

static void auth_key_init(obx_auth_key_t *key, const char *hash, const char *org_id, const char *perms) {
  memcpy(key->hash, hash, OBX_AUTH_HASH_LEN + 1);
  key->org_id = strdup(org_id);
  key->nperms = 1;
  for (const char *c = perms; *c; c++) key->nperms += *c == ',';
  key->perms = calloc((size_t)key->nperms, sizeof *key->perms);
  char *copy = strdup(perms), *save = NULL;
  int i = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) key->perms[i++] = strdup(tok);
  free(copy);
}

static bool valid_hash(const char *s) {
  if (strlen(s) != OBX_AUTH_HASH_LEN) return false;
  for (; *s; s++)
    if (!isdigit((unsigned char)*s) && !(*s >= 'a' && *s <= 'f')) return false;
  return true;
}

obx_auth_t *obx_auth_load(const char *path, obx_err_t *err) {
  obx_auth_t *auth = calloc(1, sizeof *auth);
  if (!path || !*path) return auth;
  FILE *f = fopen(path, "r");
  char line[1024];
  int lineno = 0, cap = 0;
  bool ok = false;
  if (!f) {
    obx_err_set(err, OBX_ERR_CONF, errno, false, "api.keys_file %s: %s", path, strerror(errno));
    goto done;
  }
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char *hash_end = strchr(line, '#');
    if (hash_end) *hash_end = '\0';
    char hash[128], org[128], perms[512], extra[2];
    int n = sscanf(line, "%127s %127s %511s %1s", hash, org, perms, extra);
    if (n <= 0) continue;
    if (n != 3 || !valid_hash(hash)) {
      obx_err_set(err, OBX_ERR_CONF, 0, false,
                  "api.keys_file %s:%d: expected '<sha256 hex> <orgId> <perm,...>'", path, lineno);
      goto done;
    }
    if (!obx_auth_validate_entry(org, perms, err)) {
      obx_err_prefix(err, "api.keys_file %s:%d", path, lineno);
      goto done;
    }
    if (auth->nkeys == cap) {
      cap = cap ? 2 * cap : 8;
      auth->keys = realloc(auth->keys, (size_t)cap * sizeof *auth->keys);
    }
    auth->keys[auth->nkeys].index = auth->nkeys;
    auth_key_init(&auth->keys[auth->nkeys++], hash, org, perms);
  }
  ok = true;
done:
  if (f) fclose(f);
  if (!ok) {
    obx_auth_destroy(auth);
    auth = NULL;
  }
  return auth;
}

void obx_auth_destroy(obx_auth_t *auth) {
  if (!auth) return;
  for (int i = 0; i < auth->nkeys; i++) auth_key_cleanup(&auth->keys[i]);
  free(auth->keys);
  free(auth);
}

int obx_auth_count(const obx_auth_t *auth) { return auth->nkeys; }

const obx_auth_key_t *obx_auth_find(const obx_auth_t *auth, const char *key) {
  char hash[OBX_AUTH_HASH_LEN + 1];
  const obx_auth_key_t *found = NULL;
  if (!key || !*key) return NULL;
  obx_auth_hash(key, hash);
  for (int i = 0; i < auth->nkeys; i++)
    if (CRYPTO_memcmp(hash, auth->keys[i].hash, OBX_AUTH_HASH_LEN) == 0) found = &auth->keys[i];
  return found;
}

bool obx_auth_key_allows(const obx_auth_key_t *key, const char *permission) {
  for (int i = 0; i < key->nperms; i++)
    if (strcmp(key->perms[i], "*") == 0 || strcmp(key->perms[i], permission) == 0) return true;
  return false;
}
