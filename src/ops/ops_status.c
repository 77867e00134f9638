/* ops_status.c - the whole system at a glance (`outboxctl status`, GET /api/status)
 *
 * DESIGN: see obx_ops.h. Reads the relay's lease and checkpoint, the outbox and inbox counts,
 * the dead_letters store, the parked keys and (when RabbitMQ answers) the DLQ depth, and says
 * what is degraded. Writes nothing. */
#include <stdio.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "ops/ops_int.h"

#define OPS_RELAY_LEASE_ID "relay"       /* leases._id of the relay (src/relay/relay_int.h) */
#define OPS_RELAY_CHECKPOINT_ID "outbox" /* relay_checkpoints._id */
#define OPS_LAG_DEGRADED_MS 60000        /* relay lag an operator must look at */


static void append_age(bson_t *out, const char *at_field, const char *age_field, const bson_t *doc, const char *src,
                       int64_t now) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, doc, src) && BSON_ITER_HOLDS_DATE_TIME(&it)) {
    int64_t at = bson_iter_date_time(&it);
    BSON_APPEND_DATE_TIME(out, at_field, at);
    if (age_field) BSON_APPEND_INT64(out, age_field, now > at ? now - at : 0);
  } else {
    BSON_APPEND_NULL(out, at_field);
    if (age_field) BSON_APPEND_NULL(out, age_field);
  }
}

/* How many partition keys have a FAILED event: the relay holds their later events (src/relay/keys.c). */
static bool count_held_keys(mongoc_collection_t *outbox, int64_t *n, obx_err_t *err) {
  bson_t *cmd = BCON_NEW("distinct", BCON_UTF8(mongoc_collection_get_name(outbox)), "key", "partitionKey", "query", "{",
                         "status", "FAILED", "}");
  bson_t reply;
  bson_error_t berr;
  bson_iter_t it, values;
  bool ok = mongoc_collection_read_command_with_opts(outbox, cmd, NULL, NULL, &reply, &berr);
  *n = 0;
  if (ok && bson_iter_init_find(&it, &reply, "values") && bson_iter_recurse(&it, &values))
    while (bson_iter_next(&values)) (*n)++;
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  bson_destroy(&reply);
  bson_destroy(cmd);
  return ok;
}

static bool status_relay(const obx_ops_t *ops, mongoc_client_t *client, bson_t *relay, obx_err_t *err) {
  int64_t now = obx_time_now_ms();
  bson_t lease = BSON_INITIALIZER, ckpt = BSON_INITIALIZER, oldest = BSON_INITIALIZER;
  bson_t *lease_q = BCON_NEW("_id", BCON_UTF8(OPS_RELAY_LEASE_ID));
  bson_t *ckpt_q = BCON_NEW("_id", BCON_UTF8(OPS_RELAY_CHECKPOINT_ID));
  bson_t *due_q = BCON_NEW("status", BCON_UTF8("PENDING"), "availableAt", "{", "$lte", BCON_DATE_TIME(now), "}");
  bson_t *pending_q = BCON_NEW("status", BCON_UTF8("PENDING"));
  bson_t *sort = BCON_NEW("occurredAt", BCON_INT32(1));
  mongoc_collection_t *leases = obx_mongo_collection(ops->mongo, client, "leases");
  mongoc_collection_t *ckpts = obx_mongo_collection(ops->mongo, client, "relay_checkpoints");
  mongoc_collection_t *outbox = obx_mongo_collection(ops->mongo, client, "outbox");
  bool has_lease = false, has_ckpt = false, has_oldest = false;
  bson_error_t berr;
  bool ok = obx_mongo_find_one(leases, lease_q, NULL, NULL, &lease, &has_lease, err) &&
            obx_mongo_find_one(ckpts, ckpt_q, NULL, NULL, &ckpt, &has_ckpt, err) &&
            obx_mongo_find_one(outbox, due_q, sort, NULL, &oldest, &has_oldest, err);
  int64_t pending = ok ? mongoc_collection_count_documents(outbox, pending_q, NULL, NULL, NULL, &berr) : 0, held = 0;
  if (ok && pending < 0) {
    obx_err_from_bson(err, &berr, NULL);
    ok = false;
  }
  ok = ok && count_held_keys(outbox, &held, err);
  if (ok) {
    const char *owner = has_lease ? obx_mongo_doc_str(&lease, "owner") : NULL;
    bson_iter_t it;
    int64_t expires = bson_iter_init_find(&it, &lease, "expiresAt") && BSON_ITER_HOLDS_DATE_TIME(&it)
                        ? bson_iter_date_time(&it) : 0;
    if (owner && expires > now) BSON_APPEND_UTF8(relay, "leader", owner);
    else BSON_APPEND_NULL(relay, "leader");
    if (bson_iter_init_find(&it, &lease, "epoch") && BSON_ITER_HOLDS_NUMBER(&it))
      BSON_APPEND_INT64(relay, "epoch", bson_iter_as_int64(&it));
    append_age(relay, "leaseExpiresAt", NULL, &lease, "expiresAt", now);
    append_age(relay, "checkpointAt", "checkpointAgeMs", &ckpt, "updatedAt", now);
    BSON_APPEND_INT64(relay, "pending", pending);
    BSON_APPEND_INT64(relay, "heldKeys", held);
    if (has_oldest) {
      append_age(relay, "oldestPendingAt", "lagMs", &oldest, "occurredAt", now);
    } else {
      BSON_APPEND_NULL(relay, "oldestPendingAt");
      BSON_APPEND_INT64(relay, "lagMs", 0);
    }
  }
  mongoc_collection_destroy(outbox);
  mongoc_collection_destroy(ckpts);
  mongoc_collection_destroy(leases);
  bson_destroy(sort);
  bson_destroy(pending_q);
  bson_destroy(due_q);
  bson_destroy(ckpt_q);
  bson_destroy(lease_q);
  bson_destroy(&oldest);
  bson_destroy(&ckpt);
  bson_destroy(&lease);
  return ok;
}

static void degraded_add(bson_t *arr, int *n, const char *reason) { ops_array_utf8(arr, (*n)++, reason); }

bool obx_ops_status(const obx_ops_t *ops, const char *org, bson_t *out, obx_err_t *err) {
  bson_t relay, outbox, inbox, dlq, dead, degraded;
  int64_t parked = 0, dead_count = 0, dead_oldest = 0;
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  BSON_APPEND_DOCUMENT_BEGIN(out, "relay", &relay);
  bool ok = status_relay(ops, client, &relay, err);
  bson_append_document_end(out, &relay);
  BSON_APPEND_DOCUMENT_BEGIN(out, "outbox", &outbox);
  ok = ok && ops_counts_with(ops, client, OBX_OPS_OUTBOX, org, &outbox, err);
  bson_append_document_end(out, &outbox);
  BSON_APPEND_DOCUMENT_BEGIN(out, "inbox", &inbox);
  ok = ok && ops_counts_with(ops, client, OBX_OPS_INBOX, org, &inbox, err);
  bson_append_document_end(out, &inbox);
  ok = ok && (org || obx_inbox_count_parked(client, obx_mongo_db_name(ops->mongo), ops->consumer, &parked, err)) &&
       obx_ops_dl_stats(ops->mongo, client, org, &dead_count, &dead_oldest, err);
  obx_mongo_push(ops->mongo, client);
  if (ok && org) { /* parked keys belong to the org of their head event */
    bson_t keys = BSON_INITIALIZER;
    bson_iter_t it;
    ok = obx_ops_keys_list(ops, org, &keys, err);
    parked = ok && bson_iter_init_find(&it, &keys, "count") ? bson_iter_as_int64(&it) : 0;
    bson_destroy(&keys);
  }
  if (!ok) return false;
  BSON_APPEND_DOCUMENT_BEGIN(out, "deadLetters", &dead);
  BSON_APPEND_INT64(&dead, "count", dead_count);
  if (dead_oldest) BSON_APPEND_DATE_TIME(&dead, "oldestAt", dead_oldest);
  else BSON_APPEND_NULL(&dead, "oldestAt");
  bson_append_document_end(out, &dead);
  BSON_APPEND_DOCUMENT_BEGIN(out, "dlq", &dlq);
  uint32_t depth = 0;
  obx_err_t qerr = OBX_ERR_INIT;
  bool amqp_ok = ops_need_ladder(ops, &qerr) &&
                 obx_ladder_queue_depth(ops->ladder, obx_ladder_dlq_queue(ops->ladder), &depth, &qerr);
  if (amqp_ok) {
    BSON_APPEND_INT64(&dlq, "depth", depth);
  } else {
    BSON_APPEND_NULL(&dlq, "depth");
    BSON_APPEND_UTF8(&dlq, "error", qerr.msg);
  }
  bson_append_document_end(out, &dlq);
  BSON_APPEND_INT64(out, "parkedKeys", parked);

  int n = 0;
  bson_t relay_doc;
  bson_iter_t it;
  BSON_APPEND_ARRAY_BEGIN(out, "degraded", &degraded);
  const uint8_t *data;
  uint32_t len;
  if (bson_iter_init_find(&it, out, "relay") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    bson_iter_document(&it, &len, &data);
    if (bson_init_static(&relay_doc, data, len)) {
      if (!obx_mongo_doc_str(&relay_doc, "leader")) degraded_add(&degraded, &n, "no relay leader");
      if (bson_iter_init_find(&it, &relay_doc, "lagMs") && bson_iter_as_int64(&it) > OPS_LAG_DEGRADED_MS)
        degraded_add(&degraded, &n, "relay lag over a minute");
    }
  }
  if (dead_count > 0) degraded_add(&degraded, &n, "dead letters waiting");
  if (parked > 0) degraded_add(&degraded, &n, "parked keys");
  if (!amqp_ok) degraded_add(&degraded, &n, "RabbitMQ unreachable");
  bson_append_array_end(out, &degraded);
  return true;
}
