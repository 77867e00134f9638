/* sweeper.c - publishes PENDING events the change stream missed; the whole relay in poll mode
 *
 * DESIGN: events are claimed in batches of OUTBOX_BATCH_SIZE, three round trips a batch
 * whatever the size of the outbox:
 *   1. find the oldest due, unclaimed PENDING events: {status: PENDING, availableAt: [from,
 *      bound], claimedUntil absent or past} sorted {availableAt, _id}, _id only — backed by
 *      outbox_status_available {status, availableAt, _id} (src/lib/schema.c): equality, range
 *      and sort in the index's order, no in-memory sort, the scan stops at the batch;
 *   2. updateMany {_id $in those, still PENDING and unclaimed} $set {claimedBy: owner,
 *      claimedUntil: until}, `until` (now + max(relay.lease, 30 s)) unique to the batch;
 *   3. find {_id $in those, claimedBy: owner, claimedUntil: until} (the _id index): what this
 *      relay holds, put back in the order of step 1.
 * Every step filters on this relay's bucket (relay_bucket_filter); step 2 writes the bucket of
 * an event that had none, and an event without one whose key falls in another bucket is given
 * that bucket instead of being claimed (claim_assign), for the sweeper of its holder.
 * Steps 2 and 3 also filter on partitionKey $in the batch's keys (when each event has one): the
 * shard key of a sharded outbox, so they go only to the shards that hold those keys.
 * The claim is the MongoDB analogue of SELECT ... FOR UPDATE SKIP LOCKED: several relays never
 * publish the same event at the same time (a claim outlives the publish it protects), and a
 * deposed leader that has not noticed yet cannot take what the new one claimed. The report's
 * outbox update removes the claim. A relay that dies leaves claims behind: the next leader
 * holds their keys and releases them when it takes the lease (relay_claims_release), so their
 * events are published at once and before their keys' later ones, not when the claims expire.
 *
 * A pass resumes where the previous batch ended (availableAt >= the last claimed one), so a
 * long recovery never rescans the events in flight or the held keys it already skipped; the
 * pass ends when a batch comes back short, and the next starts from the oldest again.
 *
 * The upper bound on availableAt depends on who else publishes:
 *   poll mode      now: the sweeper is the only publisher.
 *   stream mode    min(now, the checkpoint's cluster time) - OUTBOX_POLL_INTERVAL_MS: the
 *                  checkpoint only passes changes the stream has answered, so an event older
 *                  than it is one the stream will never publish (a retry after its backoff,
 *                  the head of a held key, a change before the stream existed), and an event
 *                  of a key committed after it is the stream's, which publishes it after the
 *                  key's earlier events. The grace covers a writer's clock (availableAt is
 *                  written before the commit) and the length of its transaction. The sweeper
 *                  also runs only while the stream is caught up or down.
 *   full sweep     the time the open of the stream was answered (first start without a
 *                  checkpoint, a restart from now), at or after the stream's start: what is
 *                  committed after it is the stream's, so an event written during the scan is
 *                  published once, by the stream; one written while the open was on its way
 *                  may be published by both. */
#include "relay/relay_int.h"

#include <stdlib.h>
#include <string.h>

#include "obx/obx_bucket.h"
#include "obx/obx_health.h"
#include "obx/obx_log.h"

#define RELAY_CLAIM_MIN_MS 30000

/* The filter of unclaimed PENDING events with availableAt in [from, bound] (from 0: no floor). */
static bson_t *claim_filter(obx_relay_t *relay, int64_t from_ms, int64_t bound_ms, int64_t now) {
  bson_t *query = BCON_NEW("status", "PENDING");
  bson_t range;
  BSON_APPEND_DOCUMENT_BEGIN(query, "availableAt", &range);
  if (from_ms > 0) BSON_APPEND_DATE_TIME(&range, "$gte", from_ms);
  BSON_APPEND_DATE_TIME(&range, "$lte", bound_ms);
  bson_append_document_end(query, &range);
  bson_t *free_claim = BCON_NEW("$or", "[", "{", "claimedUntil", "{", "$exists", BCON_BOOL(false), "}", "}",
                                "{", "claimedUntil", "{", "$lte", BCON_DATE_TIME(now), "}", "}", "]");
  bson_concat(query, free_claim);
  bson_destroy(free_claim);
  relay_bucket_filter(relay, query, OBX_BUCKET_FIELD);
  return query;
}

/* The events of one batch: their _ids and partitionKeys, in the order of step 1. */
typedef struct {
  bson_value_t *ids;
  char **keys;   /* partitionKey of each (NULL: none) */
  int n;
} claim_batch_t;

/* Appends {_id: {$in: ids}} to query, and {partitionKey: {$in: keys}} when every event has one
 * (the shard key of a sharded outbox: the write goes only to the shards holding those keys). */
static void append_ids(bson_t *query, const claim_batch_t *b) {
  bson_t id, in;
  char idx[16];
  bool keyed = true;
  BSON_APPEND_DOCUMENT_BEGIN(query, "_id", &id);
  BSON_APPEND_ARRAY_BEGIN(&id, "$in", &in);
  for (int i = 0; i < b->n; i++) {
    snprintf(idx, sizeof idx, "%d", i);
    BSON_APPEND_VALUE(&in, idx, &b->ids[i]);
    keyed = keyed && b->keys[i];
  }
  bson_append_array_end(&id, &in);
  bson_append_document_end(query, &id);
  if (!keyed) return;
  BSON_APPEND_DOCUMENT_BEGIN(query, "partitionKey", &id);
  BSON_APPEND_ARRAY_BEGIN(&id, "$in", &in);
  for (int i = 0; i < b->n; i++) {
    snprintf(idx, sizeof idx, "%d", i);
    BSON_APPEND_UTF8(&in, idx, b->keys[i]);
  }
  bson_append_array_end(&id, &in);
  bson_append_document_end(query, &id);
}

/* A due event without a valid bucket that is not this relay's: its bucket is written, so that
 * the sweeper of that bucket's holder finds it (this one never claims it). A failure leaves it
 * as it was, for the next pass. */
static void claim_assign(obx_relay_t *relay, const bson_t *doc) {
  bson_iter_t it;
  bson_t *filter = bson_new();
  if (bson_iter_init_find(&it, doc, "_id")) bson_append_iter(filter, "_id", 3, &it);
  if (bson_iter_init_find(&it, doc, "partitionKey")) bson_append_iter(filter, "partitionKey", -1, &it);
  relay_bucket_filter(relay, filter, OBX_BUCKET_FIELD); /* still without one */
  bson_t *update = BCON_NEW("$set", "{", OBX_BUCKET_FIELD, BCON_INT32(relay_doc_bucket(relay, doc)), "}");
  bson_error_t berr;
  if (!mongoc_collection_update_one(relay->outbox, filter, update, NULL, NULL, &berr))
    obx_warn("giving an outbox event its bucket: %s", berr.message);
  bson_destroy(update);
  bson_destroy(filter);
}

/* Step 1: the _ids and partitionKeys (copies into b) of this relay's bucket among up to `want`
 * due events, and the last availableAt; returns how many it found (of any bucket: a short batch
 * ends the pass), -1 on an error. */
static int claim_candidates(obx_relay_t *relay, int64_t bound_ms, int64_t now, int want, claim_batch_t *b,
                            int64_t *last_ms, obx_err_t *err) {
  bson_t *query = claim_filter(relay, relay->sweep_from_ms, bound_ms, now);
  relay_keys_filter(relay, query); /* a held key's events wait for its head */
  bson_t *opts = BCON_NEW("sort", "{", "availableAt", BCON_INT32(1), "_id", BCON_INT32(1), "}",
                          "projection", "{", "_id", BCON_INT32(1), "availableAt", BCON_INT32(1), "partitionKey",
                          BCON_INT32(1), "aggregateId", BCON_INT32(1), OBX_BUCKET_FIELD, BCON_INT32(1), "}",
                          "limit", BCON_INT64(want), "batchSize", BCON_INT64(want));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(relay->outbox, query, opts, NULL);
  const bson_t *doc;
  bson_iter_t it;
  int found = 0;
  b->n = 0;
  while (found < want && mongoc_cursor_next(cursor, &doc)) {
    if (!bson_iter_init_find(&it, doc, "_id")) continue;
    found++;
    if (bson_iter_init_find(&it, doc, "availableAt") && BSON_ITER_HOLDS_DATE_TIME(&it))
      *last_ms = bson_iter_date_time(&it);
    if (!relay_doc_mine(relay, doc)) {
      claim_assign(relay, doc); /* a writer left its bucket out: it is another relay's */
      continue;
    }
    bson_iter_init_find(&it, doc, "_id");
    bson_value_copy(bson_iter_value(&it), &b->ids[b->n]);
    b->keys[b->n] = bson_iter_init_find(&it, doc, "partitionKey") && BSON_ITER_HOLDS_UTF8(&it)
                      ? strdup(bson_iter_utf8(&it, NULL)) : NULL;
    b->n++;
  }
  int n = obx_mongo_cursor_end(cursor, err) ? found : -1;
  bson_destroy(opts);
  bson_destroy(query);
  return n;
}

/* Step 2: claims those still free; false on a MongoDB error. */
static bool claim_mark(obx_relay_t *relay, const claim_batch_t *b, int64_t bound_ms, int64_t now, int64_t until,
                       obx_err_t *err) {
  bson_t *query = claim_filter(relay, 0, bound_ms, now);
  append_ids(query, b);
  bson_t *update = BCON_NEW("$set", "{", "claimedBy", BCON_UTF8(relay->owner), "claimedUntil", BCON_DATE_TIME(until),
                            OBX_BUCKET_FIELD, BCON_INT32(relay->bucket), "}"); /* given one before publishing */
  bson_t reply;
  bson_error_t berr;
  bool ok = mongoc_collection_update_many(relay->outbox, query, update, NULL, &reply, &berr);
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  bson_destroy(&reply);
  bson_destroy(update);
  bson_destroy(query);
  return ok;
}

typedef struct {
  char *key; /* relay_id_key */
  int pos;   /* in the order of step 1 */
} claim_pos_t;

static int claim_pos_cmp(const void *a, const void *b) {
  return strcmp(((const claim_pos_t *)a)->key, ((const claim_pos_t *)b)->key);
}

/* Step 3: the documents this batch holds, into docs[] at their step-1 position (the others stay
 * empty); false on a MongoDB error. */
static bool claim_fetch(obx_relay_t *relay, const claim_batch_t *b, int64_t until, bson_t *docs, obx_err_t *err) {
  const bson_value_t *ids = b->ids;
  int n = b->n;
  claim_pos_t *pos = malloc((size_t)n * sizeof *pos);
  if (!pos) abort();
  for (int i = 0; i < n; i++) {
    bson_t wrap = BSON_INITIALIZER;
    BSON_APPEND_VALUE(&wrap, "_id", &ids[i]);
    pos[i].key = relay_id_key(&wrap);
    pos[i].pos = i;
    bson_destroy(&wrap);
  }
  qsort(pos, (size_t)n, sizeof *pos, claim_pos_cmp);
  bson_t *query = BCON_NEW("claimedBy", BCON_UTF8(relay->owner), "claimedUntil", BCON_DATE_TIME(until));
  append_ids(query, b);
  bson_t *opts = BCON_NEW("batchSize", BCON_INT64(n));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(relay->outbox, query, opts, NULL);
  const bson_t *doc;
  while (mongoc_cursor_next(cursor, &doc)) {
    claim_pos_t probe = {relay_id_key(doc), 0};
    const claim_pos_t *hit = probe.key ? bsearch(&probe, pos, (size_t)n, sizeof *pos, claim_pos_cmp) : NULL;
    if (hit && bson_empty(&docs[hit->pos])) bson_copy_to_excluding_noinit(doc, &docs[hit->pos], "", NULL);
    free(probe.key);
  }
  bool ok = obx_mongo_cursor_end(cursor, err);
  bson_destroy(opts);
  bson_destroy(query);
  for (int i = 0; i < n; i++) free(pos[i].key);
  free(pos);
  return ok;
}

/* Claims and publishes one batch of up to `want` events due by bound_ms; returns how many
 * were found (claimed or not: a short batch ends the pass), -1 on a MongoDB error. */
static int relay_sweep_batch(obx_relay_t *relay, int64_t bound_ms, int want) {
  int64_t now = obx_time_now_ms(), last_ms = 0;
  int64_t claim_ms = relay->conf->relay_lease > RELAY_CLAIM_MIN_MS ? relay->conf->relay_lease : RELAY_CLAIM_MIN_MS;
  int64_t until = now + claim_ms;
  if (until <= relay->last_claim_until_ms) until = relay->last_claim_until_ms + 1; /* unique to the batch */
  relay->last_claim_until_ms = until;
  claim_batch_t b = {calloc((size_t)want, sizeof *b.ids), calloc((size_t)want, sizeof *b.keys), 0};
  bson_t *docs = malloc((size_t)want * sizeof *docs);
  if (!b.ids || !b.keys || !docs) abort();
  obx_err_t err = OBX_ERR_INIT;
  int n = claim_candidates(relay, bound_ms, now, want, &b, &last_ms, &err);
  for (int i = 0; i < b.n; i++) bson_init(&docs[i]);
  bool ok = n >= 0;
  if (b.n > 0) ok = claim_mark(relay, &b, bound_ms, now, until, &err) && claim_fetch(relay, &b, until, docs, &err);
  if (!ok) obx_warn("sweeper claim: %s", err.msg);
  for (int i = 0; ok && i < b.n; i++) {
    if (bson_empty(&docs[i]) || relay_doc_inflight(relay, &docs[i], true)) continue; /* taken meanwhile */
    obx_relay_msg_t *msg = calloc(1, sizeof *msg);
    if (!msg) abort();
    msg->from = RELAY_FROM_SWEEP;
    relay_keys_submit(relay, &docs[i], msg);
  }
  if (ok) relay->sweep_from_ms = n == want ? last_ms : 0; /* a short batch ends the pass */
  for (int i = 0; i < b.n; i++) {
    bson_value_destroy(&b.ids[i]);
    free(b.keys[i]);
    bson_destroy(&docs[i]);
  }
  free(b.ids);
  free(b.keys);
  free(docs);
  return ok ? n : -1;
}

int64_t relay_sweep_bound(const obx_relay_t *relay) {
  int64_t now = obx_time_now_ms();
  if (relay->poll_mode) return now;
  int64_t ckpt_ms = relay->ckpt_cluster_s * 1000;
  return (ckpt_ms < now ? ckpt_ms : now) - relay->conf->outbox_poll_interval;
}

int relay_sweep(obx_relay_t *relay, int64_t bound_ms) {
  int room = relay->conf->relay_max_inflight - relay_pending(relay);
  int want = relay->conf->outbox_batch_size < room ? relay->conf->outbox_batch_size : room;
  if (want <= 0 || relay->stopping) return 0;
  int found = relay_sweep_batch(relay, bound_ms, want);
  if (found > 0) obx_debug("sweeper found %d events", found);
  return found;
}

bool relay_claims_release(obx_relay_t *relay) {
  /* the filter of partial index outbox_pending_claimed (src/lib/schema.c): O(claims), not O(backlog) */
  bson_t *filter = BCON_NEW("status", "PENDING", "claimedUntil", "{", "$exists", BCON_BOOL(true), "}");
  relay_bucket_filter(relay, filter, OBX_BUCKET_FIELD); /* its bucket's (claims write the bucket) */
  bson_t *update = BCON_NEW("$unset", "{", "claimedBy", "", "claimedUntil", "", "}");
  bson_t reply;
  bson_error_t berr;
  bool ok = mongoc_collection_update_many(relay->outbox, filter, update, NULL, &reply, &berr);
  if (!ok) obx_warn("releasing the claims of an earlier leadership: %s", berr.message);
  else {
    bson_iter_t it;
    int64_t n = bson_iter_init_find(&it, &reply, "modifiedCount") ? bson_iter_as_int64(&it) : 0;
    if (n > 0) obx_info("released %lld claims of an earlier leadership (their keys are held until they are published)", (long long)n);
  }
  bson_destroy(&reply);
  bson_destroy(update);
  bson_destroy(filter);
  return ok;
}

bool relay_sweep_all(obx_relay_t *relay) {
  int64_t bound = relay->stream_opened_ms; /* what is committed after the open's answer is the stream's */
  int64_t total = 0;
  relay->sweep_from_ms = 0;
  for (;;) {
    obx_health_stamp("full sweep: claiming");
    int found = relay_sweep(relay, bound);
    if (found < 0) return false;
    total += found;
    if (found == 0 && relay_pending(relay) == 0 && relay->sweep_from_ms == 0) break;
    /* serve reports while the in-flight bound is reached (or the pass waits for its last ones) */
    obx_health_stamp("full sweep: awaiting delivery reports");
    relay_serve(relay, found == 0 || relay_pending(relay) >= relay->conf->relay_max_inflight ? 20 : 0, false);
    relay_keys_tick(relay);
    if (relay->stopping || !relay->leader || !atomic_load(&relay->allowed)) return false; /* or handing over */
  }
  relay_serve(relay, 0, true);
  obx_info("published the PENDING events found by a full scan (%lld claimed)", (long long)total);
  return relay->leader && !relay->stopping;
}
