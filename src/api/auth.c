/* auth.c - bearer API keys, hashed at rest
 *
 * DESIGN: the keys file is read once at start; the api_keys collection (see obx_auth.h) is
 * read by a thread now and every api.keys_refresh, its set replacing the previous database
 * set. Entries are never freed before obx_auth_destroy: a key the database no longer grants is
 * marked revoked, so an entry borrowed by a request in flight stays valid; a rwlock guards the
 * list. Lookups hash the presented key with SHA-256 (libcrypto) and compare against every
 * entry with CRYPTO_memcmp, so timing does not reveal which entry nearly matched. Reads
 * api.keys_file; the watcher reads api_keys through the caller's obx_mongo_t. */
#include "obx/obx_auth.h"
#include "obx/obx_event.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "obx/obx_log.h"
#include "obx/obx_mongo.h"

struct obx_auth {
  pthread_rwlock_t lock;
  obx_auth_key_t **keys; /* owned, each owned; never shrinks before destroy */
  int nkeys, cap;
  /* the api_keys watcher, when started */
  obx_mongo_t *mongo; /* borrowed */
  int64_t interval_ms;
  bool watching, stopping;
  pthread_t watcher;
  pthread_mutex_t mu;
  pthread_cond_t cond;
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

bool obx_auth_validate_name(const char *name, obx_err_t *err) {
  if (!valid_token(name, "-_.@") || strlen(name) > 64) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "key name '%s' must be 1 to 64 letters, digits, '-', '_', '.' or '@'", name);
    return false;
  }
  return true;
}

static void auth_key_cleanup(obx_auth_key_t *key) {
  for (int i = 0; i < key->nperms; i++) free(key->perms[i]);
  free(key->perms);
  free(key->org_id);
  free(key->name);
}

static void auth_key_init(obx_auth_key_t *key, const char *hash, const char *org_id, const char *perms,
                          const char *name) {
  memset(key, 0, sizeof *key);
  memcpy(key->hash, hash, OBX_AUTH_HASH_LEN + 1);
  key->org_id = strdup(org_id);
  key->name = name ? strdup(name) : NULL;
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

/* Appends a new entry; the caller holds the write lock (or is the only user). */
static obx_auth_key_t *auth_append(obx_auth_t *auth, const char *hash, const char *org_id, const char *perms,
                                   const char *name) {
  if (auth->nkeys == auth->cap) {
    auth->cap = auth->cap ? 2 * auth->cap : 8;
    auth->keys = realloc(auth->keys, (size_t)auth->cap * sizeof *auth->keys);
  }
  obx_auth_key_t *key = malloc(sizeof *key);
  auth_key_init(key, hash, org_id, perms, name);
  key->index = auth->nkeys;
  auth->keys[auth->nkeys++] = key;
  return key;
}

obx_auth_t *obx_auth_load(const char *path, obx_err_t *err) {
  obx_auth_t *auth = calloc(1, sizeof *auth);
  pthread_rwlock_init(&auth->lock, NULL);
  pthread_mutex_init(&auth->mu, NULL);
  pthread_cond_init(&auth->cond, NULL);
  if (!path || !*path) return auth;
  FILE *f = fopen(path, "r");
  char line[1024];
  int lineno = 0;
  bool ok = false;
  if (!f) {
    obx_err_set(err, OBX_ERR_CONF, errno, false, "api.keys_file %s: %s", path, strerror(errno));
    goto done;
  }
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char *hash_end = strchr(line, '#');
    if (hash_end) *hash_end = '\0';
    char hash[128], org[128], perms[512], name[128], extra[2];
    int n = sscanf(line, "%127s %127s %511s %127s %1s", hash, org, perms, name, extra);
    if (n <= 0) continue;
    if ((n != 3 && n != 4) || !valid_hash(hash)) {
      obx_err_set(err, OBX_ERR_CONF, 0, false,
                  "api.keys_file %s:%d: expected '<sha256 hex> <orgId> <perm,...> [<name>]'", path, lineno);
      goto done;
    }
    if (!obx_auth_validate_entry(org, perms, err) || (n == 4 && !obx_auth_validate_name(name, err))) {
      obx_err_prefix(err, "api.keys_file %s:%d", path, lineno);
      goto done;
    }
    auth_append(auth, hash, org, perms, n == 4 ? name : NULL);
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
  if (auth->watching) {
    pthread_mutex_lock(&auth->mu);
    auth->stopping = true;
    pthread_cond_signal(&auth->cond);
    pthread_mutex_unlock(&auth->mu);
    pthread_join(auth->watcher, NULL);
  }
  for (int i = 0; i < auth->nkeys; i++) {
    auth_key_cleanup(auth->keys[i]);
    free(auth->keys[i]);
  }
  free(auth->keys);
  pthread_cond_destroy(&auth->cond);
  pthread_mutex_destroy(&auth->mu);
  pthread_rwlock_destroy(&auth->lock);
  free(auth);
}

int obx_auth_count(obx_auth_t *auth) {
  pthread_rwlock_rdlock(&auth->lock);
  int n = auth->nkeys;
  pthread_rwlock_unlock(&auth->lock);
  return n;
}

const obx_auth_key_t *obx_auth_find(obx_auth_t *auth, const char *key) {
  char hash[OBX_AUTH_HASH_LEN + 1];
  const obx_auth_key_t *found = NULL;
  if (!key || !*key) return NULL;
  obx_auth_hash(key, hash);
  pthread_rwlock_rdlock(&auth->lock);
  for (int i = 0; i < auth->nkeys; i++)
    if (CRYPTO_memcmp(hash, auth->keys[i]->hash, OBX_AUTH_HASH_LEN) == 0 && !auth->keys[i]->revoked) found = auth->keys[i];
  pthread_rwlock_unlock(&auth->lock);
  return found;
}

static bool same_perms(const obx_auth_key_t *key, const char *perms) {
  size_t off = 0;
  for (int i = 0; i < key->nperms; i++) {
    size_t len = strlen(key->perms[i]);
    if (strncmp(perms + off, key->perms[i], len) != 0 || perms[off + len] != (i + 1 < key->nperms ? ',' : '\0'))
      return false;
    off += len + 1;
  }
  return true;
}

void obx_auth_set_db_keys(obx_auth_t *auth, const obx_auth_entry_t *entries, int n) {
  pthread_rwlock_wrlock(&auth->lock);
  int before = auth->nkeys;
  bool *kept = calloc((size_t)before + 1, sizeof *kept);
  for (int e = 0; e < n; e++) {
    obx_err_t err = OBX_ERR_INIT;
    if (!valid_hash(entries[e].hash) || !obx_auth_validate_entry(entries[e].org_id, entries[e].perms, &err) ||
        (entries[e].name && !obx_auth_validate_name(entries[e].name, &err))) {
      obx_warn("api_keys document %d of %d skipped: %s", e + 1, n, err.msg[0] ? err.msg : "_id must be a SHA-256 in lowercase hex");
      continue;
    }
    int match = -1;
    for (int i = 0; i < before && match < 0; i++) {
      const obx_auth_key_t *k = auth->keys[i];
      if (k->from_db && !k->revoked && strcmp(k->hash, entries[e].hash) == 0 &&
          strcmp(k->org_id, entries[e].org_id) == 0 && same_perms(k, entries[e].perms) &&
          (k->name ? entries[e].name && strcmp(k->name, entries[e].name) == 0 : !entries[e].name))
        match = i;
    }
    if (match >= 0) kept[match] = true;
    else auth_append(auth, entries[e].hash, entries[e].org_id, entries[e].perms, entries[e].name)->from_db = true;
  }
  for (int i = 0; i < before; i++)
    if (auth->keys[i]->from_db && !kept[i]) auth->keys[i]->revoked = true;
  pthread_rwlock_unlock(&auth->lock);
  free(kept);
}

/* Reads the enabled documents of api_keys into the database set. The ping fails fast while
 * MongoDB is down, so a stop is not held up by server selection. */
static bool auth_refresh(obx_auth_t *auth, obx_err_t *err) {
  if (!obx_mongo_ping(auth->mongo, err)) return false;
  mongoc_client_t *client = obx_mongo_pop(auth->mongo);
  mongoc_collection_t *coll = obx_mongo_collection(auth->mongo, client, "api_keys");
  bson_t *filter = BCON_NEW("disabled", "{", "$ne", BCON_BOOL(true), "}");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(coll, filter, NULL, NULL);
  obx_auth_entry_t *entries = NULL;
  char **perms = NULL;
  int n = 0, cap = 0;
  const bson_t *doc;
  bson_iter_t it, arr;
  while (mongoc_cursor_next(cursor, &doc)) {
    const char *hash = bson_iter_init_find(&it, doc, "_id") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    const char *org = bson_iter_init_find(&it, doc, "orgId") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    const char *name = bson_iter_init_find(&it, doc, "name") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
    bson_string_t *joined = bson_string_new(NULL);
    if (bson_iter_init_find(&it, doc, "permissions") && BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr))
      while (bson_iter_next(&arr))
        if (BSON_ITER_HOLDS_UTF8(&arr)) bson_string_append_printf(joined, "%s%s", joined->len ? "," : "", bson_iter_utf8(&arr, NULL));
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      entries = realloc(entries, (size_t)cap * sizeof *entries);
      perms = realloc(perms, (size_t)cap * sizeof *perms);
    }
    perms[n] = bson_string_free(joined, false);
    entries[n] = (obx_auth_entry_t){strdup(hash), strdup(org), perms[n], name ? strdup(name) : NULL};
    n++;
  }
  bool ok = obx_mongo_cursor_end(cursor, err);
  if (ok) obx_auth_set_db_keys(auth, entries, n);
  for (int i = 0; i < n; i++) {
    free((char *)entries[i].hash);
    free((char *)entries[i].org_id);
    free((char *)entries[i].name);
    bson_free(perms[i]);
  }
  free(entries);
  free(perms);
  bson_destroy(filter);
  mongoc_collection_destroy(coll);
  obx_mongo_push(auth->mongo, client);
  return ok;
}

static void *auth_watch(void *arg) {
  obx_auth_t *auth = arg;
  obx_log_set_role("api");
  for (int failures = 0;;) {
    obx_err_t err = OBX_ERR_INIT;
    if (auth_refresh(auth, &err)) failures = 0;
    else if (failures++ % 20 == 0) obx_warn("api_keys not read (the previous keys stay): %s", err.msg);
    pthread_mutex_lock(&auth->mu);
    struct timespec until = obx_time_deadline(CLOCK_REALTIME, auth->interval_ms);
    while (!auth->stopping && pthread_cond_timedwait(&auth->cond, &auth->mu, &until) == 0) {}
    bool stop = auth->stopping;
    pthread_mutex_unlock(&auth->mu);
    if (stop) return NULL;
  }
}

bool obx_auth_watch_db(obx_auth_t *auth, obx_mongo_t *mongo, int64_t interval_ms, obx_err_t *err) {
  auth->mongo = mongo;
  auth->interval_ms = interval_ms;
  if (pthread_create(&auth->watcher, NULL, auth_watch, auth) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "api_keys: cannot start the refresh thread");
    return false;
  }
  auth->watching = true;
  return true;
}

bool obx_auth_key_allows(const obx_auth_key_t *key, const char *permission) {
  for (int i = 0; i < key->nperms; i++)
    if (strcmp(key->perms[i], "*") == 0 || strcmp(key->perms[i], permission) == 0) return true;
  return false;
}
