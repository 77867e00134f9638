/* obx_schema.h - every collection and index outboxd uses, declared once
 *
 * DESIGN: one table (src/lib/schema.c) names each collection, the roles that touch it and its
 * indexes (name, key pattern, options). A role calls obx_schema_ensure for its own roles
 * before it serves: the collections are created explicitly (MongoDB 4.2 and cross-shard
 * transactions refuse to create one implicitly inside a transaction), then the indexes.
 * Existing indexes are matched by key pattern, not by name: an equivalent index a DBA created
 * under another name is accepted; one whose options differ (unique, partialFilterExpression)
 * is an error naming both; a TTL index whose expiry differs from the configured retention is
 * updated with collMod. Roles retry until it succeeds (obx_schema_guard_t does the retrying
 * for a role without a setup thread of its own) and answer /readyz false until then. */
#ifndef OBX_SCHEMA_H
#define OBX_SCHEMA_H

#include <stdbool.h>
#include "obx_conf.h"
#include "obx_err.h"
#include "obx_http.h"
#include "obx_mongo.h"

/* Who touches a collection (a bit set). */
enum {
  OBX_SCHEMA_API = 1u << 0,    /* the api role: orders, pipelines, operators' routes */
  OBX_SCHEMA_RELAY = 1u << 1,  /* the relay role */
  OBX_SCHEMA_WORKER = 1u << 2, /* the worker role and its pipelines */
  OBX_SCHEMA_CTL = 1u << 3,    /* outboxctl */
};

/* A TTL index's expiry comes from a retention key of the configuration. */
typedef enum { OBX_SCHEMA_TTL_NONE, OBX_SCHEMA_TTL_OUTBOX, OBX_SCHEMA_TTL_INBOX } obx_schema_ttl_t;

typedef struct {
  const char *name;    /* the name we create it under */
  const char *keys;    /* key pattern, relaxed extended JSON */
  const char *options; /* unique / partialFilterExpression, JSON; NULL for none */
  obx_schema_ttl_t ttl;
} obx_schema_index_t;

typedef struct {
  const char *name;
  unsigned roles;      /* OBX_SCHEMA_* that read or write it */
  const obx_schema_index_t *indexes;
  int nindexes;
} obx_schema_collection_t;

/* The table; borrowed, static. */
const obx_schema_collection_t *obx_schema_collections(int *n);
/* The declaration of `name`, NULL when it is not ours. */
const obx_schema_collection_t *obx_schema_collection(const char *name);

/* Ensures every collection touched by one of `roles` and its indexes, once. False with err
 * (retriable for network/server errors; not retriable for a conflicting index, whose message
 * names the existing index) on failure; what succeeded stays done. */
bool obx_schema_ensure(obx_mongo_t *mongo, const obx_conf_t *conf, unsigned roles, obx_err_t *err);

/* ---- a thread that retries obx_schema_ensure until it succeeds ------------------------- */

typedef struct obx_schema_guard obx_schema_guard_t;

/* Starts the retrying thread (mongo and conf borrowed until obx_schema_guard_destroy). When http
 * is not NULL a readiness check `check_name` answers false (with the last error) until done. */
obx_schema_guard_t *obx_schema_guard_start(obx_mongo_t *mongo, const obx_conf_t *conf, unsigned roles,
                                           obx_http_t *http, const char *check_name);
/* Waits up to timeout_ms for the schema; true once it is ensured. */
bool obx_schema_guard_wait(obx_schema_guard_t *guard, int timeout_ms);
/* Stops the thread and frees. NULL is a no-op. The readiness check must not run afterwards
 * (the HTTP server is stopped before the roles). */
void obx_schema_guard_destroy(obx_schema_guard_t *guard);

#endif
