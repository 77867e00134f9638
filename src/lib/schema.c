/* schema.c - the collections and indexes of outboxd, and the one function that ensures them
 *
 * DESIGN: the table below is the only place a collection or an index is declared; roles call
 * obx_schema_ensure with their OBX_SCHEMA_* bit and never create indexes themselves. For each
 * collection: `create` (NamespaceExists is success), then listIndexes once and, per declared
 * index, the first existing index with the same key pattern (field names in order, numeric
 * directions compared by value) stands for it whatever its name; options that change what the
 * index means (unique, partialFilterExpression) must agree; a TTL expiry that differs is set
 * with collMod on the existing index's name; no equivalent index means createIndexes. Never
 * drops anything. Stateless apart from the guard's thread; thread-safe. */
#include "obx/obx_schema.h"
#include "obx/obx_event.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_log.h"

#define SCHEMA_NAMESPACE_EXISTS 48
#define SCHEMA_RETRY_MIN_MS 250
#define SCHEMA_RETRY_MAX_MS 5000

/* ---- the table ----------------------------------------------------------------------------- */

static const obx_schema_index_t orders_indexes[] = {
  {"orders_org_number", "{\"orgId\": 1, \"orderNumber\": 1}", "{\"unique\": true}", OBX_SCHEMA_TTL_NONE},
  {"orders_org_idempotency", "{\"orgId\": 1, \"idempotencyKey\": 1}",
   "{\"unique\": true, \"partialFilterExpression\": {\"idempotencyKey\": {\"$exists\": true}}}", OBX_SCHEMA_TTL_NONE},
  {"orders_org_created", "{\"orgId\": 1, \"createdAt\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
};

static const obx_schema_index_t outbox_indexes[] = {
  /* the sweeper: equality on status, sort {availableAt, _id} (src/relay/sweeper.c) */
  {"outbox_status_available", "{\"status\": 1, \"availableAt\": 1, \"_id\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
  /* a new holder's takeover (src/relay/keys.c relay_keys_load, src/relay/sweeper.c
   * relay_claims_release): the PENDING events being retried, and those an earlier holder
   * claimed, oldest first, with the bucket in the key; partial, so the takeover reads what
   * matches, not the backlog (the queries repeat these expressions, so the planner may use them) */
  {"outbox_pending_retried", "{\"status\": 1, \"bucket\": 1, \"attempts\": 1}",
   "{\"partialFilterExpression\": {\"status\": \"PENDING\", \"attempts\": {\"$gt\": 0}}}", OBX_SCHEMA_TTL_NONE},
  {"outbox_pending_claimed", "{\"status\": 1, \"availableAt\": 1, \"_id\": 1, \"bucket\": 1}",
   "{\"partialFilterExpression\": {\"status\": \"PENDING\", \"claimedUntil\": {\"$exists\": true}}}",
   OBX_SCHEMA_TTL_NONE},
  /* a released key's waiting events, in order: sort {keySeq, occurredAt, _id} (src/relay/keys.c);
   * named apart from the {partitionKey, status, keySeq} index it replaces, which an older schema
   * may still hold (never dropped here, no longer used) */
  {"outbox_key_status_seq_occurred_id", "{\"partitionKey\": 1, \"status\": 1, \"keySeq\": 1, \"occurredAt\": 1, \"_id\": 1}",
   NULL, OBX_SCHEMA_TTL_NONE},
  /* the operators' lists (GET /api/outbox, outboxctl outbox list), newest first, by org and
   * status, by org, and by status across orgs (also the oldest PENDING for the lag) */
  {"outbox_org_status_occurred_id", "{\"orgId\": 1, \"status\": 1, \"occurredAt\": -1, \"_id\": -1}", NULL,
   OBX_SCHEMA_TTL_NONE},
  {"outbox_org_occurred_id", "{\"orgId\": 1, \"occurredAt\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"outbox_status_occurred_id", "{\"status\": 1, \"occurredAt\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"outbox_occurred_id", "{\"occurredAt\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  /* PUBLISHED events expire after outbox.retention */
  {"outbox_published_ttl", "{\"publishedAt\": 1}", "{\"partialFilterExpression\": {\"status\": \"PUBLISHED\"}}",
   OBX_SCHEMA_TTL_OUTBOX},
};

static const obx_schema_index_t inbox_indexes[] = {
  {"inbox_processed_ttl", "{\"processedAt\": 1}", NULL, OBX_SCHEMA_TTL_INBOX},
  {"inbox_key_status_seq", "{\"_id.consumer\": 1, \"partitionKey\": 1, \"status\": 1, \"seq\": 1}", NULL,
   OBX_SCHEMA_TTL_NONE},
  {"inbox_status_received", "{\"status\": 1, \"receivedAt\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"inbox_type_received", "{\"eventType\": 1, \"receivedAt\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
  /* the operators' lists and replays of one consumer: by status newest first, by status, type
   * or key in arrival order, and one entry by event id */
  {"inbox_consumer_status_newest", "{\"_id.consumer\": 1, \"status\": 1, \"receivedAt\": -1, \"_id.eventId\": -1}",
   NULL, OBX_SCHEMA_TTL_NONE},
  {"inbox_consumer_status_arrival", "{\"_id.consumer\": 1, \"status\": 1, \"receivedAt\": 1, \"seq\": 1}", NULL,
   OBX_SCHEMA_TTL_NONE},
  {"inbox_consumer_type_arrival", "{\"_id.consumer\": 1, \"eventType\": 1, \"receivedAt\": 1, \"seq\": 1}", NULL,
   OBX_SCHEMA_TTL_NONE},
  {"inbox_consumer_key_arrival", "{\"_id.consumer\": 1, \"partitionKey\": 1, \"receivedAt\": 1, \"seq\": 1}", NULL,
   OBX_SCHEMA_TTL_NONE},
  {"inbox_consumer_newest", "{\"_id.consumer\": 1, \"receivedAt\": -1, \"_id.eventId\": -1}", NULL,
   OBX_SCHEMA_TTL_NONE},
  {"inbox_event", "{\"_id.eventId\": 1, \"_id.consumer\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
  /* the retry sweep: a consumer's sent retries past their due time (src/worker/retrysweep.c) */
  {"inbox_consumer_retry_due", "{\"_id.consumer\": 1, \"status\": 1, \"retrySent\": 1, \"retryDueAt\": 1}", NULL,
   OBX_SCHEMA_TTL_NONE},
};

/* the parked keys of one consumer, oldest first (GET /api/keys, outboxctl keys, the counts) */
static const obx_schema_index_t parked_indexes[] = {
  {"parked_consumer_since", "{\"_id.consumer\": 1, \"since\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
};

static const obx_schema_index_t pipelines_indexes[] = {
  {"pipelines_enabled_trigger", "{\"orgId\": 1, \"trigger\": 1}",
   "{\"unique\": true, \"partialFilterExpression\": {\"enabled\": true}}", OBX_SCHEMA_TTL_NONE},
  {"pipelines_org_name", "{\"orgId\": 1, \"name\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
};

static const obx_schema_index_t executions_indexes[] = {
  {"executions_pipeline", "{\"orgId\": 1, \"pipelineId\": 1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  /* one inbox entry's executions (GET /api/inbox/:id, outboxctl inbox show) */
  {"executions_event", "{\"eventId\": 1, \"startedAt\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
};

/* the operators' dead-letter store (src/ops/ops_dead_letters.c): dedup on write, lists newest
 * failure first by org/type/key, the oldest waiting one for the gauge, lookups by event */
static const obx_schema_index_t dead_letters_indexes[] = {
  {"dl_dedup", "{\"dedupKey\": 1}", "{\"unique\": true}", OBX_SCHEMA_TTL_NONE},
  {"dl_last", "{\"lastFailureAt\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"dl_org_last", "{\"orgId\": 1, \"lastFailureAt\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"dl_type_last_id", "{\"type\": 1, \"lastFailureAt\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"dl_state_last", "{\"state\": 1, \"lastFailureAt\": 1, \"_id\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"dl_key_last", "{\"key\": 1, \"lastFailureAt\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"dl_state_first", "{\"state\": 1, \"firstFailureAt\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"dl_event", "{\"eventId\": 1}", NULL, OBX_SCHEMA_TTL_NONE},
};

/* the operators' audit query (GET /api/audit, outboxctl audit list), newest first {when: -1,
 * _id: -1} for every org, one org, one action (audit_org_when_id and audit_action_when_id
 * replace audit_org_when and audit_action_when, which left the _id tie-break to an in-memory sort) */
static const obx_schema_index_t audit_indexes[] = {
  {"audit_when_id", "{\"when\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"audit_org_when_id", "{\"orgId\": 1, \"when\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"audit_action_when_id", "{\"action\": 1, \"when\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
  {"audit_org_action_when", "{\"orgId\": 1, \"action\": 1, \"when\": -1, \"_id\": -1}", NULL, OBX_SCHEMA_TTL_NONE},
};

#define N(a) (int)(sizeof a / sizeof a[0])
#define ALL (OBX_SCHEMA_API | OBX_SCHEMA_RELAY | OBX_SCHEMA_WORKER | OBX_SCHEMA_CTL)

static const obx_schema_collection_t collections[] = {
  {"orders", OBX_SCHEMA_API, orders_indexes, N(orders_indexes)},
  /* API and pipelines write events, the relay publishes them, operators reprocess them */
  {"outbox", ALL, outbox_indexes, N(outbox_indexes)},
  /* the per-key counters behind keySeq, written by obx_outbox_append in the writer's transaction */
  {"outbox_keys", OBX_SCHEMA_API | OBX_SCHEMA_WORKER, NULL, 0},
  {"relay_checkpoints", OBX_SCHEMA_RELAY, NULL, 0},
  {"leases", OBX_SCHEMA_RELAY, NULL, 0},
  /* the relays' heartbeats, by which they share the buckets (src/relay/buckets.c) */
  {"relay_members", OBX_SCHEMA_RELAY, NULL, 0},
  {"inbox", OBX_SCHEMA_WORKER | OBX_SCHEMA_API | OBX_SCHEMA_CTL, inbox_indexes, N(inbox_indexes)},
  {"parked_keys", OBX_SCHEMA_WORKER | OBX_SCHEMA_API | OBX_SCHEMA_CTL, parked_indexes, N(parked_indexes)},
  {"audit_log", OBX_SCHEMA_API | OBX_SCHEMA_CTL, audit_indexes, N(audit_indexes)},
  /* the worker's drain writes it, operators read, redrive and delete it */
  {"dead_letters", OBX_SCHEMA_WORKER | OBX_SCHEMA_API | OBX_SCHEMA_CTL, dead_letters_indexes, N(dead_letters_indexes)},
  {"api_keys", OBX_SCHEMA_API | OBX_SCHEMA_CTL, NULL, 0},
  {"pipelines", OBX_SCHEMA_API | OBX_SCHEMA_WORKER | OBX_SCHEMA_CTL, pipelines_indexes, N(pipelines_indexes)},
  {"pipeline_executions", OBX_SCHEMA_API | OBX_SCHEMA_WORKER, executions_indexes, N(executions_indexes)},
};

const obx_schema_collection_t *obx_schema_collections(int *n) {
  *n = N(collections);
  return collections;
}

const obx_schema_collection_t *obx_schema_collection(const char *name) {
  for (int i = 0; i < N(collections); i++)
    if (strcmp(collections[i].name, name) == 0) return &collections[i];
  return NULL;
}

/* ---- comparing index definitions --------------------------------------------------------- */

/* Same fields in the same order, same directions (1 == 1.0 == NumberLong(1); "hashed" ==
 * "hashed"). */
static bool keys_equal(const bson_t *a, const bson_t *b) {
  bson_iter_t ia, ib;
  if (!bson_iter_init(&ia, a) || !bson_iter_init(&ib, b)) return false;
  for (;;) {
    bool na = bson_iter_next(&ia), nb = bson_iter_next(&ib);
    if (!na || !nb) return na == nb;
    if (strcmp(bson_iter_key(&ia), bson_iter_key(&ib)) != 0) return false;
    if (BSON_ITER_HOLDS_NUMBER(&ia) && BSON_ITER_HOLDS_NUMBER(&ib)) {
      if (bson_iter_as_double(&ia) != bson_iter_as_double(&ib)) return false;
    } else if (BSON_ITER_HOLDS_UTF8(&ia) && BSON_ITER_HOLDS_UTF8(&ib)) {
      if (strcmp(bson_iter_utf8(&ia, NULL), bson_iter_utf8(&ib, NULL)) != 0) return false;
    } else {
      return false;
    }
  }
}

static bool doc_at(const bson_t *doc, const char *key, bson_t *out) {
  bson_iter_t it;
  uint32_t len;
  const uint8_t *data;
  if (!bson_iter_init_find(&it, doc, key) || !BSON_ITER_HOLDS_DOCUMENT(&it)) return false;
  bson_iter_document(&it, &len, &data);
  return bson_init_static(out, data, len);
}

static bool flag_at(const bson_t *doc, const char *key) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, key) && bson_iter_as_bool(&it);
}

static int64_t ttl_seconds(const obx_schema_index_t *index, const obx_conf_t *conf) {
  switch (index->ttl) {
  case OBX_SCHEMA_TTL_OUTBOX: return conf->outbox_retention / 1000;
  case OBX_SCHEMA_TTL_INBOX: return conf->inbox_retention / 1000;
  case OBX_SCHEMA_TTL_NONE: break;
  }
  return -1;
}

/* The declared options that define what the index means agree with the existing index's. */
static bool options_agree(const bson_t *want, const bson_t *have) {
  if (flag_at(want, "unique") != flag_at(have, "unique")) return false;
  bson_t wp, hp;
  bool w = doc_at(want, "partialFilterExpression", &wp), h = doc_at(have, "partialFilterExpression", &hp);
  return w == h && (!w || bson_equal(&wp, &hp));
}

/* ---- ensuring ----------------------------------------------------------------------------- */

static bool parse_json(const char *json, bson_t *out, const char *what, obx_err_t *err) {
  bson_error_t berr;
  if (bson_init_from_json(out, json, -1, &berr)) return true;
  obx_err_set(err, OBX_ERR_INPUT, 0, false, "schema %s: %s", what, berr.message); /* a bug in the table */
  return false;
}

static bool run_command(mongoc_database_t *db, const bson_t *cmd, const char *what, bool *exists, obx_err_t *err) {
  bson_t reply;
  bson_error_t berr;
  bool ok = mongoc_database_write_command_with_opts(db, cmd, NULL, &reply, &berr);
  if (!ok && exists && berr.code == SCHEMA_NAMESPACE_EXISTS) {
    *exists = true;
    ok = true;
  } else if (!ok) {
    obx_err_from_bson(err, &berr, &reply);
    obx_err_prefix(err, "%s", what);
  }
  bson_destroy(&reply);
  return ok;
}

static bool ensure_collection(mongoc_database_t *db, const char *name, obx_err_t *err) {
  bson_t *cmd = BCON_NEW("create", BCON_UTF8(name));
  char what[128];
  bool exists = false;
  snprintf(what, sizeof what, "create %s", name);
  bool ok = run_command(db, cmd, what, &exists, err);
  if (ok && !exists) obx_info("collection %s created", name);
  bson_destroy(cmd);
  return ok;
}

/* Copies the existing index definitions of `coll` into *have (an array document). */
static bool list_indexes(mongoc_collection_t *coll, bson_t *have, obx_err_t *err) {
  mongoc_cursor_t *cursor = mongoc_collection_find_indexes_with_opts(coll, NULL);
  const bson_t *index;
  char key[16];
  int i = 0;
  while (mongoc_cursor_next(cursor, &index)) {
    snprintf(key, sizeof key, "%d", i++);
    BSON_APPEND_DOCUMENT(have, key, index);
  }
  bool ok = obx_mongo_cursor_end(cursor, err);
  if (!ok) obx_err_prefix(err, "listIndexes %s", mongoc_collection_get_name(coll));
  return ok;
}

/* The existing index with keys' pattern, copied into *found (false when there is none). */
static bool find_by_keys(const bson_t *have, const bson_t *keys, bson_t *found) {
  bson_iter_t it;
  bson_iter_init(&it, have);
  while (bson_iter_next(&it)) {
    uint32_t len;
    const uint8_t *data;
    bson_t index, key;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it)) continue;
    bson_iter_document(&it, &len, &data);
    if (!bson_init_static(&index, data, len) || !doc_at(&index, "key", &key) || !keys_equal(&key, keys)) continue;
    bson_concat(found, &index);
    return true;
  }
  return false;
}

static bool ensure_index(mongoc_database_t *db, const char *collection, const bson_t *have,
                         const obx_schema_index_t *index, const obx_conf_t *conf, obx_err_t *err) {
  bool ok = false, found = false;
  bson_t keys = BSON_INITIALIZER, options = BSON_INITIALIZER, existing = BSON_INITIALIZER;
  bson_t *cmd = NULL;
  char what[160];
  int64_t ttl = ttl_seconds(index, conf);
  if (!parse_json(index->keys, &keys, index->name, err)) goto done;
  if (index->options && !parse_json(index->options, &options, index->name, err)) goto done;
  if (ttl >= 0) BSON_APPEND_INT64(&options, "expireAfterSeconds", ttl);

  found = find_by_keys(have, &keys, &existing);
  if (found) {
    bson_iter_t it;
    const char *name = bson_iter_init_find(&it, &existing, "name") && BSON_ITER_HOLDS_UTF8(&it)
                         ? bson_iter_utf8(&it, NULL) : "?";
    bool has_ttl = bson_iter_init_find(&it, &existing, "expireAfterSeconds") && BSON_ITER_HOLDS_NUMBER(&it);
    int64_t have_ttl = has_ttl ? bson_iter_as_int64(&it) : -1;
    if (!options_agree(&options, &existing) || (ttl >= 0) != has_ttl) {
      obx_err_set(err, OBX_ERR_MONGO, 0, false,
                  "index %s.%s: the existing index %s has the same keys %s but other options (want %s%s); "
                  "drop it or give it those options", collection, index->name, name, index->keys,
                  index->options ? index->options : "none", ttl >= 0 ? " with a TTL" : "");
      goto done;
    }
    if (strcmp(name, index->name) != 0) obx_debug("index %s.%s: the existing %s has its keys", collection, index->name, name);
    if (ttl >= 0 && have_ttl != ttl) {
      cmd = BCON_NEW("collMod", BCON_UTF8(collection), "index", "{", "name", BCON_UTF8(name), "expireAfterSeconds",
                     BCON_INT64(ttl), "}");
      snprintf(what, sizeof what, "collMod %s.%s", collection, name);
      ok = run_command(db, cmd, what, NULL, err);
      if (ok) obx_info("index %s.%s: expiry %lld s -> %lld s", collection, name, (long long)have_ttl, (long long)ttl);
      goto done;
    }
    ok = true;
    goto done;
  }
  {
    bson_t arr, spec;
    cmd = bson_new();
    BSON_APPEND_UTF8(cmd, "createIndexes", collection);
    BSON_APPEND_ARRAY_BEGIN(cmd, "indexes", &arr);
    BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &spec);
    BSON_APPEND_DOCUMENT(&spec, "key", &keys);
    BSON_APPEND_UTF8(&spec, "name", index->name);
    bson_concat(&spec, &options);
    bson_append_document_end(&arr, &spec);
    bson_append_array_end(cmd, &arr);
  }
  snprintf(what, sizeof what, "createIndexes %s.%s", collection, index->name);
  ok = run_command(db, cmd, what, NULL, err);
done:
  bson_destroy(cmd);
  bson_destroy(&existing);
  bson_destroy(&options);
  bson_destroy(&keys);
  return ok;
}

bool obx_schema_ensure(obx_mongo_t *mongo, const obx_conf_t *conf, unsigned roles, obx_err_t *err) {
  mongoc_client_t *client = obx_mongo_pop(mongo);
  mongoc_database_t *db = mongoc_client_get_database(client, obx_mongo_db_name(mongo));
  bool ok = true;
  for (int c = 0; ok && c < N(collections); c++) {
    const obx_schema_collection_t *decl = &collections[c];
    if (!(decl->roles & roles)) continue;
    ok = ensure_collection(db, decl->name, err);
    if (!ok || !decl->nindexes) continue;
    mongoc_collection_t *coll = mongoc_database_get_collection(db, decl->name);
    bson_t have = BSON_INITIALIZER;
    ok = list_indexes(coll, &have, err);
    for (int i = 0; ok && i < decl->nindexes; i++) ok = ensure_index(db, decl->name, &have, &decl->indexes[i], conf, err);
    bson_destroy(&have);
    mongoc_collection_destroy(coll);
  }
  mongoc_database_destroy(db);
  obx_mongo_push(mongo, client);
  return ok;
}

/* ---- the guard ---------------------------------------------------------------------------- */

struct obx_schema_guard {
  obx_mongo_t *mongo;
  const obx_conf_t *conf;
  unsigned roles;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool ready, stopping;
  obx_err_t last; /* the last failure, for /readyz */
};

static bool guard_ready(void *ctx, obx_err_t *err) {
  obx_schema_guard_t *guard = ctx;
  pthread_mutex_lock(&guard->mu);
  bool ready = guard->ready;
  if (!ready)
    obx_err_set(err, OBX_ERR_MONGO, 0, true, "schema not ensured yet%s%s", guard->last.msg[0] ? ": " : "",
                guard->last.msg);
  pthread_mutex_unlock(&guard->mu);
  return ready;
}

static void *guard_main(void *arg) {
  obx_schema_guard_t *guard = arg;
  int64_t wait_ms = SCHEMA_RETRY_MIN_MS;
  for (int attempt = 1;; attempt++) {
    obx_err_t err = OBX_ERR_INIT;
    /* the ping fails fast while MongoDB is down, so a stop is not held up by server selection */
    bool ok = obx_mongo_ping(guard->mongo, &err) && obx_schema_ensure(guard->mongo, guard->conf, guard->roles, &err);
    pthread_mutex_lock(&guard->mu);
    if (ok) {
      guard->ready = true;
      pthread_cond_broadcast(&guard->cond);
    } else {
      guard->last = err;
      if (attempt == 1 || attempt % 20 == 0) obx_warn("schema (attempt %d): %s; retrying", attempt, err.msg);
      struct timespec until = obx_time_deadline(CLOCK_REALTIME, wait_ms);
      if (!guard->stopping) pthread_cond_timedwait(&guard->cond, &guard->mu, &until);
      wait_ms = wait_ms * 2 > SCHEMA_RETRY_MAX_MS ? SCHEMA_RETRY_MAX_MS : wait_ms * 2;
    }
    bool done = ok || guard->stopping;
    pthread_mutex_unlock(&guard->mu);
    if (ok) obx_info("schema ready");
    if (done) return NULL;
  }
}

obx_schema_guard_t *obx_schema_guard_start(obx_mongo_t *mongo, const obx_conf_t *conf, unsigned roles,
                                           obx_http_t *http, const char *check_name) {
  obx_schema_guard_t *guard = calloc(1, sizeof *guard);
  if (!guard) abort();
  guard->mongo = mongo;
  guard->conf = conf;
  guard->roles = roles;
  pthread_mutex_init(&guard->mu, NULL);
  pthread_cond_init(&guard->cond, NULL);
  if (pthread_create(&guard->thread, NULL, guard_main, guard) != 0) abort();
  if (http) obx_http_add_ready_check(http, check_name, guard_ready, guard);
  return guard;
}

bool obx_schema_guard_wait(obx_schema_guard_t *guard, int timeout_ms) {
  struct timespec until = obx_time_deadline(CLOCK_REALTIME, timeout_ms);
  pthread_mutex_lock(&guard->mu);
  while (!guard->ready && !guard->stopping && pthread_cond_timedwait(&guard->cond, &guard->mu, &until) == 0) {
  }
  bool ready = guard->ready;
  pthread_mutex_unlock(&guard->mu);
  return ready;
}

void obx_schema_guard_destroy(obx_schema_guard_t *guard) {
  if (!guard) return;
  pthread_mutex_lock(&guard->mu);
  guard->stopping = true;
  pthread_cond_broadcast(&guard->cond);
  pthread_mutex_unlock(&guard->mu);
  pthread_join(guard->thread, NULL);
  pthread_cond_destroy(&guard->cond);
  pthread_mutex_destroy(&guard->mu);
  free(guard);
}
