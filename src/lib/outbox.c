/* outbox.c - append domain events to the outbox inside the caller's transaction
 *
 * DESIGN: the document comes from obx_event_to_outbox so every writer (API, pipelines, other
 * services) produces the same public schema; then, in the same transaction, the key's counter
 * in `outbox_keys` {_id: partitionKey, seq} goes up by one (findAndModify $inc, upsert) and
 * its new value is the event's `keySeq`, and the document is inserted. Two transactions that
 * append to one key conflict on the counter (a write conflict: the driver runs one of them
 * again), so keySeq follows commit order per key. The document also carries its `bucket`
 * (obx_bucket.h) among the process's RELAY_BUCKETS (obx_outbox_set_buckets, one atomic set at
 * start). Thread-safe. */
#include "obx/obx_outbox.h"

#include <assert.h>
#include <stdatomic.h>
#include <string.h>

#include "obx/obx_bucket.h"

#define OUTBOX_KEYS "outbox_keys"

static atomic_int g_buckets = 1;

void obx_outbox_set_buckets(int32_t buckets) {
  assert(buckets >= 1 && buckets <= OBX_BUCKET_MAX);
  atomic_store(&g_buckets, buckets);
}

/* The next keySeq of `key` into *seq, in session's transaction. */
static bool outbox_next_seq(mongoc_collection_t *outbox, const bson_t *session_opts, const char *key, int64_t *seq,
                            obx_err_t *err) {
  bson_t *cmd = BCON_NEW("findAndModify", BCON_UTF8(OUTBOX_KEYS), "query", "{", "_id", BCON_UTF8(key), "}", "update",
                         "{", "$inc", "{", "seq", BCON_INT64(1), "}", "}", "upsert", BCON_BOOL(true), "new",
                         BCON_BOOL(true));
  bson_t reply;
  bson_error_t berr;
  bson_iter_t it;
  bool ok = mongoc_collection_write_command_with_opts(outbox, cmd, session_opts, &reply, &berr);
  if (!ok) {
    obx_err_from_bson(err, &berr, &reply);
    obx_err_prefix(err, "%s counter of key %s", OUTBOX_KEYS, key);
  } else if (bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "value.seq", &it) &&
             BSON_ITER_HOLDS_NUMBER(&it)) {
    *seq = bson_iter_as_int64(&it);
  } else {
    ok = false;
    obx_err_set(err, OBX_ERR_MONGO, 0, true, "%s counter of key %s: no value in the reply", OUTBOX_KEYS, key);
  }
  bson_destroy(&reply);
  bson_destroy(cmd);
  return ok;
}

bool obx_outbox_append(mongoc_client_session_t *session, mongoc_collection_t *outbox,
                       const obx_event_t *event, obx_err_t *err) {
  assert(mongoc_client_session_in_transaction(session));
  bool ok = false;
  obx_event_t ev;
  bson_t doc = BSON_INITIALIZER, opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  bson_error_t berr;
  int64_t seq = 0;
  obx_event_init(&ev);
  obx_event_copy(&ev, event);
  if (!obx_event_finalize(&ev, err) || !obx_event_to_outbox(&ev, &doc, err)) goto done;
  if (!mongoc_client_session_append(session, &opts, &berr)) {
    obx_err_from_bson(err, &berr, NULL);
    goto done;
  }
  if (!outbox_next_seq(outbox, &opts, ev.partition_key, &seq, err)) goto done;
  BSON_APPEND_INT64(&doc, OBX_OUTBOX_KEY_SEQ, seq);
  BSON_APPEND_INT32(&doc, OBX_BUCKET_FIELD,
                    obx_bucket_of(ev.partition_key, strlen(ev.partition_key), atomic_load(&g_buckets)));
  bson_destroy(&reply);
  if (!mongoc_collection_insert_one(outbox, &doc, &opts, &reply, &berr)) {
    obx_err_from_bson(err, &berr, &reply);
    obx_err_prefix(err, "outbox insert of event %s", ev.id);
    goto done;
  }
  ok = true;
done:
  bson_destroy(&reply);
  bson_destroy(&opts);
  bson_destroy(&doc);
  obx_event_cleanup(&ev);
  return ok;
}
