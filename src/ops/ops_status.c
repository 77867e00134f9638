/* ops_status.c - the whole system at a glance (`outboxctl status`, GET /api/status)
 *
 * DESIGN: see obx_ops.h. Reads the relay's leases, checkpoints and members, the outbox and
 * inbox counts, the dead_letters store, the parked keys and (when RabbitMQ answers) the DLQ
 * depth, and says what is degraded. Writes nothing.
 *
 * The relay's bucket count B (RELAY_BUCKETS, src/relay/buckets.c) is read from the data, so an
 * operator's outboxctl needs no RELAY_BUCKETS of its own: the B of the live members'
 * heartbeats (relay_members.buckets), else the B of the newest bucket lease ("relay.<b>/<B>"),
 * else 1. With B = 1 the relay is the lease "relay" and the checkpoint "outbox"; with B > 1 each
 * bucket b has the lease "relay.<b>/<B>" and the checkpoint "outbox.<b>/<B>" (the ids of
 * obx_bucket.h), and the status lists every bucket's holder and checkpoint age, the oldest
 * checkpoint standing for the relay's, and a bucket without a live holder is degraded. */
#include <stdio.h>
#include <string.h>

#include "obx/obx_bucket.h"
#include "obx/obx_inbox.h"
#include "ops/ops_int.h"

#define OPS_LAG_DEGRADED_MS 60000 /* relay lag an operator must look at */
#define OPS_MAX_BUCKETS 4096      /* above any RELAY_BUCKETS a deployment uses (obx_conf.h bounds it) */


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

/* Copies each document of coll that filter matches (with opts, NULL for none) into *docs (an array). */
static bool read_docs(mongoc_collection_t *coll, const bson_t *filter, const bson_t *opts, bson_t *docs, obx_err_t *err) {
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(coll, filter, opts, NULL);
  const bson_t *doc;
  int n = 0;
  while (mongoc_cursor_next(cursor, &doc)) ops_array_doc(docs, n++, doc);
  return obx_mongo_cursor_end(cursor, err);
}

/* Copies each document of coll whose _id is a bucket's id of that base (obx_bucket_id: the base
 * itself, or "<base>." followed by anything) into *docs (an array). */
static bool read_ids(mongoc_collection_t *coll, const char *base, bson_t *docs, obx_err_t *err) {
  char regex[64];
  snprintf(regex, sizeof regex, "^%s\\.", base);
  bson_t *filter = BCON_NEW("$or", "[", "{", "_id", BCON_UTF8(base), "}", "{", "_id", "{", "$regex", BCON_UTF8(regex), "}",
                            "}", "]");
  bool ok = read_docs(coll, filter, NULL, docs, err);
  bson_destroy(filter);
  return ok;
}

static int64_t date_of(const bson_t *doc, const char *field) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, field) && BSON_ITER_HOLDS_DATE_TIME(&it) ? bson_iter_date_time(&it) : 0;
}

/* The document of `arr` whose _id is id, into *out (static); false when none. */
static bool find_in(const bson_t *arr, const char *id, bson_t *out) {
  bson_iter_t it;
  bson_iter_init(&it, arr);
  while (bson_iter_next(&it)) {
    uint32_t len;
    const uint8_t *data;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it)) continue;
    bson_iter_document(&it, &len, &data);
    if (!bson_init_static(out, data, len)) continue;
    const char *have = obx_mongo_doc_str(out, "_id");
    if (have && strcmp(have, id) == 0) return true;
  }
  return false;
}

/* B, from the live members (members: their documents), else the newest bucket lease. */
static int relay_buckets_of(const bson_t *members, const bson_t *leases) {
  bson_iter_t it, f;
  int nb = 0;
  int64_t newest = -1;
  bson_iter_init(&it, members);
  while (!nb && bson_iter_next(&it))
    if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &f) && bson_iter_find(&f, "buckets") &&
        BSON_ITER_HOLDS_INT32(&f) && bson_iter_int32(&f) >= 1 && bson_iter_int32(&f) <= OPS_MAX_BUCKETS)
      nb = bson_iter_int32(&f);
  if (nb) return nb;
  bson_iter_init(&it, leases);
  while (bson_iter_next(&it)) {
    uint32_t len;
    const uint8_t *data;
    bson_t lease;
    int32_t b, lb;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it)) continue;
    bson_iter_document(&it, &len, &data);
    if (!bson_init_static(&lease, data, len) ||
        !obx_bucket_id_parse(obx_mongo_doc_str(&lease, "_id"), OBX_BUCKET_LEASE_ID, &b, &lb) || lb > OPS_MAX_BUCKETS)
      continue;
    if (date_of(&lease, "expiresAt") > newest) {
      newest = date_of(&lease, "expiresAt");
      nb = lb;
    }
  }
  return nb ? nb : 1;
}

/* One lease's holder ({holder|leader: owner or null, epoch, leaseExpiresAt}) and its
 * checkpoint's age ({checkpointAt, checkpointAgeMs}) into out; *held: a live holder. */
static void append_holder(bson_t *out, const char *holder_field, const bson_t *lease, bool has_lease, const bson_t *ckpt,
                          int64_t now, bool *held) {
  bson_t none = BSON_INITIALIZER;
  const char *owner = has_lease ? obx_mongo_doc_str(lease, "owner") : NULL;
  bson_iter_t it;
  *held = owner && date_of(lease, "expiresAt") > now;
  if (*held) BSON_APPEND_UTF8(out, holder_field, owner);
  else bson_append_null(out, holder_field, -1);
  if (has_lease && bson_iter_init_find(&it, lease, "epoch") && BSON_ITER_HOLDS_NUMBER(&it))
    BSON_APPEND_INT64(out, "epoch", bson_iter_as_int64(&it));
  append_age(out, "leaseExpiresAt", NULL, has_lease ? lease : &none, "expiresAt", now);
  append_age(out, "checkpointAt", "checkpointAgeMs", ckpt ? ckpt : &none, "updatedAt", now);
}

/* relay.buckets, relay.bucketHolders (B > 1) and the summary fields; *unheld: buckets without a live holder. */
static void status_buckets(bson_t *relay, int nb, const bson_t *leases, const bson_t *ckpts, int64_t now, int *unheld) {
  bson_t arr, entry, lease, ckpt;
  char id[OBX_BUCKET_ID_LEN], idx[16];
  int64_t oldest_ckpt = INT64_MAX;
  bool every_ckpt = true;
  *unheld = 0;
  BSON_APPEND_INT32(relay, "buckets", nb);
  if (nb == 1) {
    bool held, has_ckpt = find_in(ckpts, OBX_BUCKET_CHECKPOINT_ID, &ckpt);
    bool has_lease = find_in(leases, OBX_BUCKET_LEASE_ID, &lease);
    append_holder(relay, "leader", &lease, has_lease, has_ckpt ? &ckpt : NULL, now, &held);
    *unheld = !held;
    return;
  }
  BSON_APPEND_ARRAY_BEGIN(relay, "bucketHolders", &arr);
  for (int b = 0; b < nb; b++) {
    bool held;
    obx_bucket_id(id, sizeof id, OBX_BUCKET_LEASE_ID, b, nb);
    bool has_lease = find_in(leases, id, &lease);
    obx_bucket_id(id, sizeof id, OBX_BUCKET_CHECKPOINT_ID, b, nb);
    bool has_ckpt = find_in(ckpts, id, &ckpt);
    snprintf(idx, sizeof idx, "%d", b);
    BSON_APPEND_DOCUMENT_BEGIN(&arr, idx, &entry);
    BSON_APPEND_INT32(&entry, "bucket", b);
    append_holder(&entry, "holder", &lease, has_lease, has_ckpt ? &ckpt : NULL, now, &held);
    bson_append_document_end(&arr, &entry);
    *unheld += !held;
    int64_t at = has_ckpt ? date_of(&ckpt, "updatedAt") : 0;
    if (!at) every_ckpt = false;
    else if (at < oldest_ckpt) oldest_ckpt = at;
  }
  bson_append_array_end(relay, &arr);
  /* the relay's checkpoint: the oldest bucket's (none while a bucket has none) */
  if (every_ckpt && oldest_ckpt != INT64_MAX) {
    BSON_APPEND_DATE_TIME(relay, "checkpointAt", oldest_ckpt);
    BSON_APPEND_INT64(relay, "checkpointAgeMs", now > oldest_ckpt ? now - oldest_ckpt : 0);
  } else {
    BSON_APPEND_NULL(relay, "checkpointAt");
    BSON_APPEND_NULL(relay, "checkpointAgeMs");
  }
}

/* relay.members: the live members {owner, buckets, held, expiresAt}, in owner order. */
static void status_members(bson_t *relay, const bson_t *members) {
  bson_t arr, entry;
  bson_iter_t it, f;
  char idx[16];
  int n = 0;
  BSON_APPEND_ARRAY_BEGIN(relay, "members", &arr);
  bson_iter_init(&it, members);
  while (bson_iter_next(&it)) {
    uint32_t len;
    const uint8_t *data;
    bson_t member;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it)) continue;
    bson_iter_document(&it, &len, &data);
    if (!bson_init_static(&member, data, len) || !obx_mongo_doc_str(&member, "_id")) continue;
    snprintf(idx, sizeof idx, "%d", n++);
    BSON_APPEND_DOCUMENT_BEGIN(&arr, idx, &entry);
    BSON_APPEND_UTF8(&entry, "owner", obx_mongo_doc_str(&member, "_id"));
    if (bson_iter_init_find(&f, &member, "buckets") && BSON_ITER_HOLDS_NUMBER(&f))
      BSON_APPEND_INT32(&entry, "buckets", (int32_t)bson_iter_as_int64(&f));
    if (bson_iter_init_find(&f, &member, "held") && BSON_ITER_HOLDS_ARRAY(&f)) bson_append_iter(&entry, "held", -1, &f);
    else {
      bson_t none;
      BSON_APPEND_ARRAY_BEGIN(&entry, "held", &none);
      bson_append_array_end(&entry, &none);
    }
    BSON_APPEND_DATE_TIME(&entry, "expiresAt", date_of(&member, "expiresAt"));
    bson_append_document_end(&arr, &entry);
  }
  bson_append_array_end(relay, &arr);
}

static bool status_relay(const obx_ops_t *ops, mongoc_client_t *client, bson_t *relay, int *unheld, obx_err_t *err) {
  int64_t now = obx_time_now_ms();
  bson_t oldest = BSON_INITIALIZER, leases_arr = BSON_INITIALIZER, ckpts_arr = BSON_INITIALIZER,
         members_arr = BSON_INITIALIZER;
  bson_t *due_q = BCON_NEW("status", BCON_UTF8("PENDING"), "availableAt", "{", "$lte", BCON_DATE_TIME(now), "}");
  bson_t *pending_q = BCON_NEW("status", BCON_UTF8("PENDING"));
  bson_t *live_q = BCON_NEW("expiresAt", "{", "$gt", BCON_DATE_TIME(now), "}");
  bson_t *by_owner = BCON_NEW("sort", "{", "_id", BCON_INT32(1), "}");
  bson_t *sort = BCON_NEW("occurredAt", BCON_INT32(1));
  mongoc_collection_t *leases = obx_mongo_collection(ops->mongo, client, "leases");
  mongoc_collection_t *ckpts = obx_mongo_collection(ops->mongo, client, "relay_checkpoints");
  mongoc_collection_t *members = obx_mongo_collection(ops->mongo, client, "relay_members");
  mongoc_collection_t *outbox = obx_mongo_collection(ops->mongo, client, "outbox");
  bool has_oldest = false;
  bson_error_t berr;
  bool ok = read_ids(leases, OBX_BUCKET_LEASE_ID, &leases_arr, err) &&
            read_ids(ckpts, OBX_BUCKET_CHECKPOINT_ID, &ckpts_arr, err) &&
            obx_mongo_find_one(outbox, due_q, sort, NULL, &oldest, &has_oldest, err) &&
            read_docs(members, live_q, by_owner, &members_arr, err);
  int64_t pending = ok ? mongoc_collection_count_documents(outbox, pending_q, NULL, NULL, NULL, &berr) : 0, held = 0;
  if (ok && pending < 0) {
    obx_err_from_bson(err, &berr, NULL);
    ok = false;
  }
  ok = ok && count_held_keys(outbox, &held, err);
  if (ok) {
    status_buckets(relay, relay_buckets_of(&members_arr, &leases_arr), &leases_arr, &ckpts_arr, now, unheld);
    status_members(relay, &members_arr);
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
  mongoc_collection_destroy(members);
  mongoc_collection_destroy(ckpts);
  mongoc_collection_destroy(leases);
  bson_destroy(sort);
  bson_destroy(by_owner);
  bson_destroy(live_q);
  bson_destroy(pending_q);
  bson_destroy(due_q);
  bson_destroy(&members_arr);
  bson_destroy(&ckpts_arr);
  bson_destroy(&leases_arr);
  bson_destroy(&oldest);
  return ok;
}

static void degraded_add(bson_t *arr, int *n, const char *reason) { ops_array_utf8(arr, (*n)++, reason); }

bool obx_ops_status(const obx_ops_t *ops, const char *org, bson_t *out, obx_err_t *err) {
  bson_t relay, outbox, inbox, dlq, dead, degraded;
  int64_t parked = 0, dead_count = 0, dead_oldest = 0;
  int unheld = 0;
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  BSON_APPEND_DOCUMENT_BEGIN(out, "relay", &relay);
  bool ok = status_relay(ops, client, &relay, &unheld, err);
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
      bson_iter_t b;
      if (!bson_iter_init_find(&b, &relay_doc, "bucketHolders")) {
        if (unheld) degraded_add(&degraded, &n, "no relay leader");
      } else if (unheld) {
        char why[96];
        snprintf(why, sizeof why, "%d relay bucket%s without a holder", unheld, unheld > 1 ? "s" : "");
        degraded_add(&degraded, &n, why);
      }
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
