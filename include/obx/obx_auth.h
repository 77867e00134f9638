/* obx_auth.h - bearer API keys, hashed at rest
 *
 * DESIGN: API_KEYS_FILE holds one key per line, `#` starts a comment:
 *     <sha256 of the key, 64 lowercase hex> <orgId> <permission>[,<permission>...]
 * e.g. `3f0a...9c acme orders:write,outbox:read`. The clear key is never stored: a request's
 * key is hashed and compared (constant time) with every entry. Keys look like
 * `obx_<43 base64url chars>` (32 random bytes); `outboxctl apikey new` prints one with its
 * line. Permissions (DESIGN.md §7): orders:write, orders:read, outbox:read, outbox:reprocess,
 * inbox:read, inbox:replay, dlq:read, dlq:redrive, pipelines:read, pipelines:write. A key with
 * permission `*` has them all. The table is immutable after loading: thread-safe. */
#ifndef OBX_AUTH_H
#define OBX_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include "obx_err.h"

#define OBX_AUTH_HASH_LEN 64
#define OBX_AUTH_KEY_LEN 47 /* "obx_" + 43 */

typedef struct obx_auth obx_auth_t;

typedef struct {
  int index;                /* 0 .. obx_auth_count() - 1, in file order */
  char hash[OBX_AUTH_HASH_LEN + 1];
  char *org_id;
  char **perms;
  int nperms;
} obx_auth_key_t;

/* Loads the keys file; path NULL or "" gives an empty table (every protected route answers
 * 401). A malformed line fails with its line number (OBX_ERR_CONF). Returns owned. */
obx_auth_t *obx_auth_load(const char *path, obx_err_t *err);
void obx_auth_destroy(obx_auth_t *auth);
int obx_auth_count(const obx_auth_t *auth);
/* The entry for a clear key, or NULL; borrowed for the life of auth. */
const obx_auth_key_t *obx_auth_find(const obx_auth_t *auth, const char *key);
bool obx_auth_key_allows(const obx_auth_key_t *key, const char *permission);

/* sha256(key) as lowercase hex. */
void obx_auth_hash(const char *key, char out[OBX_AUTH_HASH_LEN + 1]);
/* sha256 of any bytes as lowercase hex (request fingerprints). */
void obx_sha256_hex(const void *data, size_t len, char out[OBX_AUTH_HASH_LEN + 1]);
/* A fresh random key from the OpenSSL CSPRNG. */
bool obx_auth_key_generate(char out[OBX_AUTH_KEY_LEN + 1], obx_err_t *err);
/* Checks an org id and a comma-separated permission list as they may appear in the file. */
bool obx_auth_validate_entry(const char *org_id, const char *perms, obx_err_t *err);

#endif
