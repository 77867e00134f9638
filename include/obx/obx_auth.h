/* obx_auth.h - bearer API keys, hashed at rest
 *
 * DESIGN: API_KEYS_FILE holds one key per line, `#` starts a comment:
 *     <sha256 of the key, 64 lowercase hex> <orgId> <permission>[,<permission>...] [<name>]
 * e.g. `3f0a...9c acme orders:write,outbox:read ops-alice`. The name (letters, digits, '-', '_',
 * '.', '@') is who the key's operator actions are recorded as in audit_log. The clear key is never stored: a request's
 * key is hashed and compared (constant time) with every entry. Keys look like
 * `obx_<43 base64url chars>` (32 random bytes); `outboxctl apikey new` prints one with its
 * line. Permissions (DESIGN.md §7): orders:write, orders:read, outbox:read, outbox:reprocess,
 * inbox:read, inbox:replay, dlq:read, dlq:redrive, pipelines:read, pipelines:write. A key with
 * permission `*` has them all.
 * Keys may also live in MongoDB, collection `api_keys`, one document per key:
 *     {_id: <sha256 hex of the key>, orgId, permissions: [...], createdAt, disabled?: true}
 * (`outboxctl apikey new --store db`), and an optional `name`. obx_auth_watch_db reads it at start and every
 * API_KEYS_REFRESH; its keys join the file's, and a key disabled or removed there stops
 * working at the next refresh. Lookups and refreshes are thread-safe. */
#ifndef OBX_AUTH_H
#define OBX_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "obx_err.h"

#define OBX_AUTH_HASH_LEN 64
#define OBX_AUTH_KEY_LEN 47 /* "obx_" + 43 */

typedef struct obx_auth obx_auth_t;

typedef struct obx_mongo obx_mongo_t;

typedef struct {
  int index;                /* 0 .. obx_auth_count() - 1: file order, then database keys as first seen */
  char hash[OBX_AUTH_HASH_LEN + 1];
  char *org_id;
  char **perms;
  int nperms;
  char *name;               /* recorded as the operator (audit_log who); NULL when the key has none */
  bool from_db;             /* from api_keys */
  bool revoked;             /* no longer in api_keys (read under the table's lock) */
} obx_auth_key_t;

/* One key as api_keys holds it; perms comma-separated. */
typedef struct {
  const char *hash;
  const char *org_id;
  const char *perms;
  const char *name; /* NULL: none */
} obx_auth_entry_t;

/* Loads the keys file; path NULL or "" gives an empty table (every protected route answers
 * 401). A malformed line fails with its line number (OBX_ERR_CONF). Returns owned. */
obx_auth_t *obx_auth_load(const char *path, obx_err_t *err);
/* Stops the watcher, if any, and frees every entry. */
void obx_auth_destroy(obx_auth_t *auth);
/* Number of entries ever held (revoked ones included): an upper bound of obx_auth_key_t.index. */
int obx_auth_count(obx_auth_t *auth);
/* The entry for a clear key, or NULL; borrowed for the life of auth (a later revocation does
 * not free it). */
const obx_auth_key_t *obx_auth_find(obx_auth_t *auth, const char *key);
/* Makes entries the database set: an entry equal to a held database key (hash, org and
 * permissions) keeps it, a new one is added, held database keys not in entries are revoked.
 * Invalid entries are skipped with a warning. File keys are untouched. Copies what it keeps. */
void obx_auth_set_db_keys(obx_auth_t *auth, const obx_auth_entry_t *entries, int n);
/* Starts a thread reading api_keys through mongo (borrowed: it must outlive auth) now and
 * every interval_ms; a failed read keeps the previous set and is logged. Stopped by
 * obx_auth_destroy. */
bool obx_auth_watch_db(obx_auth_t *auth, obx_mongo_t *mongo, int64_t interval_ms, obx_err_t *err);
bool obx_auth_key_allows(const obx_auth_key_t *key, const char *permission);

/* sha256(key) as lowercase hex. */
void obx_auth_hash(const char *key, char out[OBX_AUTH_HASH_LEN + 1]);
/* sha256 of any bytes as lowercase hex (request fingerprints). */
void obx_sha256_hex(const void *data, size_t len, char out[OBX_AUTH_HASH_LEN + 1]);
/* A fresh random key from the OpenSSL CSPRNG. */
bool obx_auth_key_generate(char out[OBX_AUTH_KEY_LEN + 1], obx_err_t *err);
/* Checks an org id and a comma-separated permission list as they may appear in the file. */
bool obx_auth_validate_entry(const char *org_id, const char *perms, obx_err_t *err);
/* Checks a key's name: 1..64 letters, digits, '-', '_', '.' or '@'. */
bool obx_auth_validate_name(const char *name, obx_err_t *err);

#endif
