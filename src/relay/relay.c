/* relay.c - one bucket's relay: lifecycle, leadership, delivery reports, checkpoints
 *
 * DESIGN: one thread (relay_main) owns the MongoDB client, the producer, the change stream and
 * every message; delivery reports are served on it by relay_serve, so no state is locked.
 * The loop: renew or acquire the lease (stream mode) -> take the changes the stream's reader
 * read, up to the in-flight bound (stream.c) -> serve reports and write their outbox updates
 * in one unordered bulk -> sweep PENDING events the stream missed (sweeper.c) -> write the
 * checkpoint. Its one wait is the producer's poll, which a delivery report or a change the
 * reader queued ends (relay_wake), and which lasts no longer than the report batch's delay. Every
 * event goes through keys.c: one in flight per partition key, and a refused one holds its key.
 *
 * One obx_relay_t publishes one bucket of the outbox (buckets.c owns the group of them and
 * decides which buckets this process may hold: relay->allowed).
 *
 * Leadership (both modes): `leases` {_id: relay->lease_id ("relay", or "relay.<b>/<B>"), owner,
 * epoch, expiresAt}. While allowed, a standby takes the lease with findAndModify once it expired
 * (the epoch goes up by one); the leader renews every lease/3 and stops publishing when it could
 * not renew before its own view of the expiry; a leader no longer allowed hands the bucket over
 * (relay_hand_over: reports recorded, checkpoint written, lease released).
 * Checkpoint writes carry the epoch in their filter (an upsert that collides on _id means a newer
 * leader exists: step down). One publisher keeps per-key order; the sweeper's claims also keep a
 * deposed leader that has not noticed yet from publishing what the new one claimed.
 *
 * An event leaves PENDING only after its delivery report: PUBLISHED with publishedAt and the
 * Kafka coordinates; a failed report records attempts, lastError and a backed-off availableAt
 * (FAILED at OUTBOX_MAX_ATTEMPTS) for the sweeper. Reads relay.*, outbox.*, kafka.* keys. */
#include "relay/relay_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obx/obx_bucket.h"
#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_schema.h"

#define RELAY_REPORT_BATCH 256
#define RELAY_REPORT_DELAY_MS 2
#define RELAY_LOOP_WAIT_MS 20 /* the longest wait of the loop with nothing to do */
#define RELAY_HANDOVER_WAIT_MS 30000 /* a hand-over waits this long for the reports of what is in flight */
#define RELAY_CE_SOURCE "/outboxd"
#define RELAY_FENCE_MS 250
#define RELAY_READY_METADATA_MS 800 /* /readyz answers within the probe's 2 s with the MongoDB ping */

/* ---- lists and small helpers -------------------------------------------------------------- */

void relay_list_push(relay_list_t *list, obx_relay_msg_t *msg) {
  msg->next = NULL;
  msg->prev = list->tail;
  if (list->tail) list->tail->next = msg;
  else list->head = msg;
  list->tail = msg;
  list->n++;
}

void relay_list_remove(relay_list_t *list, obx_relay_msg_t *msg) {
  if (msg->prev) msg->prev->next = msg->next;
  else list->head = msg->next;
  if (msg->next) msg->next->prev = msg->prev;
  else list->tail = msg->prev;
  msg->prev = msg->next = NULL;
  list->n--;
}

static bool list_has(const relay_list_t *list, const char *id) {
  for (const obx_relay_msg_t *msg = list->head; msg; msg = msg->next)
    if (msg->id && strcmp(msg->id, id) == 0) return true;
  return false;
}

char *relay_id_key(const bson_t *doc) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, "_id")) return NULL;
  if (BSON_ITER_HOLDS_UTF8(&it)) {
    uint32_t len;
    const char *s = bson_iter_utf8(&it, &len);
    char *key = malloc(len + 2);
    if (!key) abort();
    key[0] = 's';
    memcpy(key + 1, s, len + 1);
    return key;
  }
  bson_t wrap = BSON_INITIALIZER;
  bson_append_iter(&wrap, "_id", 3, &it);
  char *json = bson_as_canonical_extended_json(&wrap, NULL);
  bson_destroy(&wrap);
  size_t len = strlen(json);
  char *key = malloc(len + 2);
  if (!key) abort();
  key[0] = (char)('a' + (int)bson_iter_type(&it) % 26);
  memcpy(key + 1, json, len + 1);
  bson_free(json);
  return key;
}

void relay_msg_set_id(obx_relay_msg_t *msg, const bson_t *doc) {
  bson_iter_t it;
  if (msg->id) return;
  msg->id = relay_id_key(doc);
  if (bson_iter_init_find(&it, doc, "_id")) bson_value_copy(bson_iter_value(&it), &msg->idv);
  if (bson_iter_init_find(&it, doc, "partitionKey") && BSON_ITER_HOLDS_UTF8(&it))
    msg->shard_key = strdup(bson_iter_utf8(&it, NULL));
}

/* The filter of msg's outbox update: its _id, its partitionKey (the shard key of a sharded
 * outbox: the update goes to one shard instead of all), still PENDING. */
static bson_t *relay_msg_selector(const obx_relay_msg_t *msg) {
  bson_t *selector = bson_new();
  BSON_APPEND_VALUE(selector, "_id", &msg->idv);
  if (msg->shard_key) BSON_APPEND_UTF8(selector, "partitionKey", msg->shard_key);
  BSON_APPEND_UTF8(selector, "status", "PENDING");
  return selector;
}

void relay_msg_free(obx_relay_msg_t *msg) {
  if (!msg) return;
  free(msg->id);
  free(msg->pkey);
  free(msg->shard_key);
  if (msg->idv.value_type) bson_value_destroy(&msg->idv);
  free(msg);
}

static const char *msg_name(const obx_relay_msg_t *msg) { return msg->id ? msg->id + 1 : "(no _id)"; }

bool relay_inflight_has(const obx_relay_t *relay, const char *id, bool stream_too) {
  return list_has(&relay->inflight_sweep, id) || list_has(&relay->reported, id) ||
         (stream_too && list_has(&relay->inflight_stream, id));
}

int relay_pending(const obx_relay_t *relay) {
  return relay->inflight_stream.n + relay->inflight_sweep.n + relay->reported.n + relay->nqueued;
}

int64_t relay_backoff_ms(int32_t attempts) {
  int64_t ms = 1000;
  for (int32_t i = 1; i < attempts && ms < 600000; i++) ms *= 2;
  return ms < 600000 ? ms : 600000;
}

void relay_wake(obx_relay_t *relay) {
  pthread_mutex_lock(&relay->wake_mu);
  if (relay->producer) obx_relay_producer_wake(relay->producer);
  pthread_mutex_unlock(&relay->wake_mu);
}

static void relay_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- delivery reports --------------------------------------------------------------------- */

static void relay_on_ack(const obx_relay_ack_t *ack, void *ctx);

/* The bucket's producer, created when it leads the bucket and destroyed when it steps down
 * (a relay holding 2 of 12 buckets has 2): with relay.fencing=transactions, transactional, with
 * the bucket's transactional.id (fenced in when the bucket's lease is taken). */
static obx_relay_producer_t *relay_producer_new(obx_relay_t *relay, obx_err_t *err) {
  char txn_id[256];
  bool transactional = strcmp(relay->conf->relay_fencing, "transactions") == 0;
  if (transactional) obx_relay_transactional_id(relay->conf, relay->bucket, txn_id, sizeof txn_id);
  return obx_relay_producer_new(relay->conf, transactional ? txn_id : NULL, relay_on_ack, relay, err);
}

/* Destroys the producer (its last reports arrive here, purged); none is a no-op. */
static void relay_producer_drop(obx_relay_t *relay) {
  if (!relay->producer) return;
  pthread_mutex_lock(&relay->ready_mu); /* /readyz must not ask the producer being destroyed */
  pthread_mutex_lock(&relay->wake_mu);  /* nor the reader wake it (it never holds its own lock then) */
  obx_relay_producer_destroy(relay->producer);
  relay->producer = NULL;
  pthread_mutex_unlock(&relay->wake_mu);
  pthread_mutex_unlock(&relay->ready_mu);
  relay_metrics_gauges(relay);
}

/* Makes tp (a traceparent, NULL or invalid: none) the thread's current context for log lines. */
static void relay_trace_current(const char *tp) {
  obx_trace_ctx_t ctx;
  obx_trace_parse(tp, tp ? strlen(tp) : 0, NULL, 0, &ctx);
  obx_trace_set_current(&ctx);
}

static void relay_on_ack(const obx_relay_ack_t *ack, void *ctx) {
  obx_relay_t *relay = ctx;
  obx_relay_msg_t *msg = ack->opaque;
  const obx_trace_ctx_t *trace = obx_trace_current(); /* the record's publish span (producer.c) */
  if (trace) obx_trace_format(trace, msg->traceparent);
  relay_list_remove(msg->from == RELAY_FROM_STREAM ? &relay->inflight_stream : &relay->inflight_sweep, msg);
  msg->ok = ack->ok;
  msg->partition = ack->partition;
  msg->offset = ack->offset;
  if (ack->ok) {
    relay_metrics_count(relay, RELAY_COUNT_PUBLISHED);
    relay_metrics_observe_ack(relay, obx_time_now_ms() - msg->occurred_ms);
  } else {
    snprintf(msg->error, sizeof msg->error, "%s", ack->err.msg);
    /* A purge (shutdown, stepping down) is not an attempt, nor a failure of a producer that hit
     * a fatal error (it is replaced, and the event published again from the checkpoint), except
     * the broker's refusal of the record that made it fatal (the gap-less guarantee) */
    msg->purged = !obx_relay_producer_refused(relay->producer, ack);
    msg->permanent = !ack->err.retriable;
    if (!msg->purged) {
      relay_metrics_count(relay, RELAY_COUNT_PUBLISH_ERROR);
      obx_log_event(OBX_LOG_WARN, msg_name(msg), NULL, "publish failed: %s", msg->error);
    }
  }
  if (!relay->reported.n) relay->first_report_ms = obx_time_now_ms();
  relay_list_push(&relay->reported, msg);
  relay_keys_acked(relay, msg); /* the key's next event, or its hold */
}

/* The outbox update for one report, appended to bulk. */
static void relay_report_update(obx_relay_t *relay, mongoc_bulk_operation_t *bulk,
                                const obx_relay_msg_t *msg, int64_t now) {
  bson_t *selector = relay_msg_selector(msg);
  bson_t update = BSON_INITIALIZER, set, unset;
  bson_append_document_begin(&update, "$set", -1, &set);
  BSON_APPEND_INT32(&set, OBX_BUCKET_FIELD, relay->bucket); /* a writer may have left it out */
  if (msg->ok) {
    bson_t kafka;
    BSON_APPEND_UTF8(&set, "status", "PUBLISHED");
    BSON_APPEND_DATE_TIME(&set, "publishedAt", now);
    bson_append_document_begin(&set, "kafka", -1, &kafka);
    BSON_APPEND_UTF8(&kafka, "topic", relay->conf->kafka_topic);
    BSON_APPEND_INT32(&kafka, "partition", msg->partition);
    BSON_APPEND_INT64(&kafka, "offset", msg->offset);
    bson_append_document_end(&set, &kafka);
  } else {
    int32_t attempts = msg->attempts + 1;
    BSON_APPEND_INT32(&set, "attempts", attempts);
    BSON_APPEND_UTF8(&set, "lastError", msg->error);
    BSON_APPEND_DATE_TIME(&set, "availableAt", now + relay_backoff_ms(attempts));
    /* status is written only when it changes: an update that names status PENDING would be
     * picked up by the change stream at once, defeating the backoff. */
    if (msg->terminal || msg->permanent || attempts >= relay->conf->outbox_max_attempts)
      BSON_APPEND_UTF8(&set, "status", "FAILED");
  }
  bson_append_document_end(&update, &set);
  bson_append_document_begin(&update, "$unset", -1, &unset);
  BSON_APPEND_UTF8(&unset, "claimedBy", "");
  BSON_APPEND_UTF8(&unset, "claimedUntil", "");
  bson_append_document_end(&update, &unset);
  bson_error_t berr;
  if (!mongoc_bulk_operation_update_one_with_opts(bulk, selector, &update, NULL, &berr))
    obx_error("outbox update for %s: %s", msg_name(msg), berr.message); /* a malformed update is a bug */
  bson_destroy(&update);
  bson_destroy(selector);
}

/* The update of one document was refused (a write error of the bulk: a DBA's validator or
 * unique index, ...): that document alone becomes FAILED with the reason, so it cannot stall
 * the others nor be published again and again. */
static void relay_report_refused(obx_relay_t *relay, obx_relay_msg_t *msg, int code, const char *why) {
  char reason[512];
  msg->refused = true;
  if (msg->ok)
    snprintf(reason, sizeof reason, "published to %s partition %d offset %lld, but the outbox update was refused (%d): %s",
             relay->conf->kafka_topic, msg->partition, (long long)msg->offset, code, why);
  else
    snprintf(reason, sizeof reason, "the outbox update after a failed publish (%s) was refused (%d): %s", msg->error, code, why);
  bson_t *selector = relay_msg_selector(msg);
  bson_t *update = BCON_NEW("$set", "{", "status", "FAILED", "lastError", BCON_UTF8(reason), "}", "$unset", "{",
                            "claimedBy", "", "claimedUntil", "", "}");
  bson_error_t berr;
  bool ok = mongoc_collection_update_one(relay->outbox, selector, update, NULL, NULL, &berr);
  relay_metrics_count(relay, RELAY_COUNT_FAILED);
  obx_log_event(OBX_LOG_ERROR, msg_name(msg), NULL, "event FAILED: %s%s%s", reason, ok ? "" : "; and marking it FAILED: ",
                ok ? "" : berr.message);
  bson_destroy(update);
  bson_destroy(selector);
}

/* Writes the outbox updates of every report in one unordered bulk; on success the messages
 * are done (their window slots too). A write error touches only its own document
 * (relay_report_refused); any other MongoDB error keeps them all for the next call. */
static bool relay_write_reports(obx_relay_t *relay) {
  if (!relay->reported.n) return true;
  bson_t *opts = BCON_NEW("ordered", BCON_BOOL(false));
  mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(relay->outbox, opts);
  int64_t now = obx_time_now_ms();
  int updates = 0;
  obx_relay_msg_t **sent = malloc((size_t)relay->reported.n * sizeof *sent);
  if (!sent) abort();
  for (obx_relay_msg_t *msg = relay->reported.head; msg; msg = msg->next) {
    if (msg->purged) continue;
    relay_report_update(relay, bulk, msg, now);
    sent[updates++] = msg;
  }
  bool ok = true;
  if (updates) {
    bson_t reply;
    bson_error_t berr;
    bson_iter_t it, errs;
    ok = mongoc_bulk_operation_execute(bulk, &reply, &berr) != 0;
    bool write_errors = !ok && bson_iter_init_find(&it, &reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY(&it) &&
                        bson_iter_recurse(&it, &errs) && !bson_iter_init_find(&it, &reply, "writeConcernErrors");
    if (write_errors) {
      /* the bulk ran (unordered): the refused updates are listed, every other one is written */
      while (bson_iter_next(&errs)) {
        bson_iter_t e;
        int index = -1, code = 0;
        const char *why = "?";
        if (!BSON_ITER_HOLDS_DOCUMENT(&errs) || !bson_iter_recurse(&errs, &e)) continue;
        while (bson_iter_next(&e)) {
          if (!strcmp(bson_iter_key(&e), "index")) index = (int)bson_iter_as_int64(&e);
          else if (!strcmp(bson_iter_key(&e), "code")) code = (int)bson_iter_as_int64(&e);
          else if (!strcmp(bson_iter_key(&e), "errmsg") && BSON_ITER_HOLDS_UTF8(&e)) why = bson_iter_utf8(&e, NULL);
        }
        if (index >= 0 && index < updates) relay_report_refused(relay, sent[index], code, why);
      }
      ok = true;
    } else if (!ok) {
      obx_err_t err = OBX_ERR_INIT;
      obx_err_from_bson(&err, &berr, &reply);
      obx_warn("outbox updates after %d delivery reports: %s (will retry)", updates, err.msg);
    }
    bson_destroy(&reply);
  }
  free(sent);
  mongoc_bulk_operation_destroy(bulk);
  bson_destroy(opts);
  if (!ok) return false;
  while (relay->reported.head) {
    obx_relay_msg_t *msg = relay->reported.head;
    relay_list_remove(&relay->reported, msg);
    if (!msg->ok && !msg->purged && !msg->refused && (msg->terminal || msg->permanent || msg->attempts + 1 >= relay->conf->outbox_max_attempts)) {
      relay_metrics_count(relay, RELAY_COUNT_FAILED);
      relay_trace_current(msg->traceparent);
      obx_log_event(OBX_LOG_ERROR, msg_name(msg), NULL, "event FAILED after %d attempts: %s", msg->attempts + 1, msg->error);
      obx_trace_set_current(NULL);
    }
    /* a purged event was not handled: the checkpoint must not pass it (it is read again) */
    if (msg->from == RELAY_FROM_STREAM && !msg->purged) relay_window_done(relay, msg->seq);
    relay_msg_free(msg);
  }
  return true;
}

/* ---- leadership --------------------------------------------------------------------------- */

static void relay_lease_step_down(obx_relay_t *relay, const char *why);

bool relay_find_and_modify(mongoc_collection_t *collection, const bson_t *query, const bson_t *sort,
                           const bson_t *update, bool upsert, const bson_t *extra, bson_t *value, obx_err_t *err) {
  mongoc_find_and_modify_opts_t *opts = mongoc_find_and_modify_opts_new();
  mongoc_find_and_modify_opts_set_update(opts, update);
  if (extra) mongoc_find_and_modify_opts_append(opts, extra);
  if (sort) mongoc_find_and_modify_opts_set_sort(opts, sort);
  mongoc_find_and_modify_opts_set_flags(opts, MONGOC_FIND_AND_MODIFY_RETURN_NEW |
                                              (upsert ? MONGOC_FIND_AND_MODIFY_UPSERT : 0));
  bson_t reply;
  bson_error_t berr;
  bson_iter_t it;
  bool ok = mongoc_collection_find_and_modify_with_opts(collection, query, opts, &reply, &berr);
  if (ok && bson_iter_init_find(&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    uint32_t len;
    const uint8_t *data;
    bson_iter_document(&it, &len, &data);
    bson_t doc;
    if (bson_init_static(&doc, data, len)) bson_copy_to_excluding_noinit(&doc, value, "", NULL);
  } else if (!ok) {
    obx_err_from_bson(err, &berr, &reply);
  }
  bson_destroy(&reply);
  mongoc_find_and_modify_opts_destroy(opts);
  return ok;
}

/* findAndModify on `leases`; *value receives a copy of the returned document (or stays empty).
 * Returns false on an error other than a duplicate key (a lost upsert race). */
static bool relay_lease_modify(obx_relay_t *relay, const bson_t *query, const bson_t *update, bool upsert,
                               bson_t *value) {
  obx_err_t err = OBX_ERR_INIT;
  bson_t majority = BSON_INITIALIZER;
  obx_mongo_append_majority(relay->mongo, &majority); /* a lease a rollback could undo elects two leaders */
  bool ok = relay_find_and_modify(relay->leases, query, NULL, update, upsert, &majority, value, &err);
  bson_destroy(&majority);
  if (ok) return true;
  if (obx_err_is_duplicate_key(&err)) return true;
  obx_warn("lease: %s", err.msg);
  return false;
}

static void relay_lease_acquire(obx_relay_t *relay) {
  int64_t now = obx_time_now_ms(), lease = relay->conf->relay_lease;
  bson_t *query = BCON_NEW("_id", BCON_UTF8(relay->lease_id), "$or", "[",
                           "{", "expiresAt", "{", "$lte", BCON_DATE_TIME(now), "}", "}",
                           "{", "owner", BCON_UTF8(relay->owner), "}", "]");
  bson_t *update = BCON_NEW("$set", "{", "owner", BCON_UTF8(relay->owner), "expiresAt", BCON_DATE_TIME(now + lease),
                            "bucket", BCON_INT32(relay->bucket), "buckets", BCON_INT32(relay->nbuckets), "}",
                            "$inc", "{", "epoch", BCON_INT64(1), "}");
  bson_t value = BSON_INITIALIZER;
  bson_iter_t it;
  if (relay_lease_modify(relay, query, update, true, &value) && bson_iter_init_find(&it, &value, "epoch") &&
      BSON_ITER_HOLDS_NUMBER(&it)) {
    relay->epoch = bson_iter_as_int64(&it);
    relay->leader = true;
    relay->lease_until_ms = now + lease;
    relay_metrics_gauges(relay);
    if (relay->nbuckets > 1)
      obx_info("relay holds bucket %d of %d (epoch %lld, owner %s)", relay->bucket, relay->nbuckets,
               (long long)relay->epoch, relay->owner);
    else
      obx_info("relay is the leader (epoch %lld, owner %s)", (long long)relay->epoch, relay->owner);
  }
  bson_destroy(&value);
  bson_destroy(update);
  bson_destroy(query);
}

static void relay_lease_renew(obx_relay_t *relay) {
  int64_t now = obx_time_now_ms(), lease = relay->conf->relay_lease;
  bson_t *query = BCON_NEW("_id", BCON_UTF8(relay->lease_id), "owner", BCON_UTF8(relay->owner), "epoch", BCON_INT64(relay->epoch));
  bson_t *update = BCON_NEW("$set", "{", "expiresAt", BCON_DATE_TIME(now + lease), "}");
  bson_t value = BSON_INITIALIZER;
  bool ok = relay_lease_modify(relay, query, update, false, &value);
  if (ok && !bson_empty(&value)) relay->lease_until_ms = now + lease;
  else if (ok) relay_lease_step_down(relay, "the lease was taken over");
  else if (now >= relay->lease_until_ms - lease / 10) relay_lease_step_down(relay, "the lease could not be renewed in time");
  bson_destroy(&value);
  bson_destroy(update);
  bson_destroy(query);
}

static void relay_lease_release(obx_relay_t *relay) {
  bson_t *query = BCON_NEW("_id", BCON_UTF8(relay->lease_id), "owner", BCON_UTF8(relay->owner), "epoch", BCON_INT64(relay->epoch));
  bson_t *update = BCON_NEW("$set", "{", "expiresAt", BCON_DATE_TIME(0), "}");
  bson_t value = BSON_INITIALIZER;
  relay_lease_modify(relay, query, update, false, &value);
  bson_destroy(&value);
  bson_destroy(update);
  bson_destroy(query);
}

/* Stops publishing: closes the stream, waits briefly for the reports of what is in flight and
 * writes them, forgets the window (a new leader resumes from the checkpoint). */
static void relay_lease_step_down(obx_relay_t *relay, const char *why) {
  obx_warn("relay steps down: %s", why);
  relay->leader = false;
  relay->led = false;
  relay_metrics_gauges(relay);
  relay_stream_close(relay);
  obx_relay_producer_flush(relay->producer, 2000);
  relay_producer_drop(relay); /* a bucket not held has no producer (what is left is purged) */
  relay_write_reports(relay);
  relay_window_reset(relay);
  relay_keys_reset(relay);
}

static void relay_checkpoint_write(obx_relay_t *relay);

/* The group gives the bucket to another relay (a fair share, buckets.c). Intake stops (the
 * stream is closed, the loop only serves reports); once no record is in flight (called again on
 * every tick meanwhile, at most RELAY_HANDOVER_WAIT_MS) the reports are recorded, the checkpoint
 * written and the lease released, so the next holder starts at once from where this one ended
 * and never publishes a key while this relay's producer still holds an event of it. After the
 * bound (Kafka unreachable) it hands over anyway, and what is still in flight may be published
 * twice. */
static void relay_hand_over(obx_relay_t *relay) {
  int64_t now = obx_time_now_ms();
  int pending = obx_relay_producer_pending(relay->producer);
  if (!relay->handover_since_ms) {
    relay->handover_since_ms = now;
    obx_info("relay hands bucket %d of %d over (the group's fair share) once its %d events in flight are reported",
             relay->bucket, relay->nbuckets, pending);
    relay_stream_close(relay);
  }
  if (pending > 0 && now - relay->handover_since_ms < RELAY_HANDOVER_WAIT_MS) return;
  if (pending > 0)
    obx_warn("relay hands bucket %d over with %d events still in flight after %d ms (they may be published twice)",
             relay->bucket, pending, RELAY_HANDOVER_WAIT_MS);
  relay->handover_since_ms = 0;
  relay_write_reports(relay);
  relay_checkpoint_write(relay);
  relay_lease_step_down(relay, "bucket handed over");
  relay_lease_release(relay);
}

/* Renews the lease held, hands it over when the group does not allow it, and (may_take: only at
 * the top of the loop) takes it while the group allows it. A lease is never taken from inside a
 * sweep, a stream step or a report wait (relay_serve): a relay that stepped down there would
 * lead again in the middle of its earlier leadership's work, without relay_lead_begin (its
 * keys' queues dropped, their claimed events left for 30 s, their later events published
 * first). */
static void relay_lease_tick(obx_relay_t *relay, bool may_take) {
  int64_t now = obx_time_now_ms(), lease = relay->conf->relay_lease;
  bool allowed = atomic_load(&relay->allowed);
  if (relay->leader && relay->lease_lapsed) relay_lease_step_down(relay, "its lease ran out before it was renewed");
  relay->lease_lapsed = false;
  if (relay->leader && !allowed) relay_hand_over(relay);
  if (allowed) relay->handover_since_ms = 0; /* allowed again before the hand-over ended */
  if (!relay->leader && !allowed) {
    relay->next_lease_ms = 0; /* once allowed: an attempt at once */
    return;
  }
  int64_t take_at = atomic_load(&relay->take_at_ms);
  if (!relay->leader && take_at && now >= take_at) {
    atomic_store(&relay->take_at_ms, 0); /* a standby tries when the holder's lease ends, not a poll later */
    relay->next_lease_ms = 0;
  }
  if (now < relay->next_lease_ms || (!relay->leader && !may_take)) return;
  if (relay->leader) relay_lease_renew(relay);
  else relay_lease_acquire(relay);
  relay->next_lease_ms = now + (relay->leader ? lease / 3 : lease / 10);
}

/* ---- checkpoint --------------------------------------------------------------------------- */

/* Reads the checkpoint into ckpt_token (NULL when there is none); false on a MongoDB error. */
static bool relay_checkpoint_load(obx_relay_t *relay) {
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(relay->ckpt_id));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(relay->checkpoints, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it;
  bson_destroy(relay->ckpt_token);
  relay->ckpt_token = NULL;
  if (mongoc_cursor_next(cursor, &doc)) {
    if (bson_iter_init_find(&it, doc, "resumeToken") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
      uint32_t len;
      const uint8_t *data;
      bson_iter_document(&it, &len, &data);
      relay->ckpt_token = bson_new_from_data(data, len);
    }
    if (bson_iter_init_find(&it, doc, "clusterTime") && BSON_ITER_HOLDS_NUMBER(&it))
      relay->ckpt_cluster_s = bson_iter_as_int64(&it);
  }
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_mongo_cursor_end(cursor, &err);
  if (!ok) obx_warn("checkpoint: %s", err.msg);
  bson_destroy(filter);
  return ok;
}

/* Writes the checkpoint if it moved, fenced by our epoch. */
static void relay_checkpoint_write(obx_relay_t *relay) {
  if (!relay->ckpt_dirty || !relay->ckpt_token || !relay->leader) return;
  bson_t *selector = BCON_NEW("_id", BCON_UTF8(relay->ckpt_id), "epoch", "{", "$lte", BCON_INT64(relay->epoch), "}");
  bson_t *update = BCON_NEW("$set", "{", "resumeToken", BCON_DOCUMENT(relay->ckpt_token), "clusterTime",
                            BCON_INT64(relay->ckpt_cluster_s), "epoch", BCON_INT64(relay->epoch), "owner",
                            BCON_UTF8(relay->owner), "updatedAt", BCON_DATE_TIME(obx_time_now_ms()), "}");
  bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
  obx_mongo_append_majority(relay->mongo, opts); /* a checkpoint a rollback could undo republishes, never loses */
  bson_t reply;
  bson_error_t berr;
  if (mongoc_collection_update_one(relay->checkpoints, selector, update, opts, &reply, &berr)) {
    relay->ckpt_dirty = false;
  } else {
    obx_err_t err = OBX_ERR_INIT;
    obx_err_from_bson(&err, &berr, &reply);
    if (obx_err_is_duplicate_key(&err)) relay_lease_step_down(relay, "a newer epoch wrote the checkpoint");
    else obx_warn("checkpoint: %s", err.msg);
  }
  bson_destroy(&reply);
  bson_destroy(opts);
  bson_destroy(update);
  bson_destroy(selector);
}

static void relay_update_lag(obx_relay_t *relay) {
  relay_window_t *window = &relay->window;
  bool idle = window->first == window->end && relay->caught_up && !relay->ckpt_dirty;
  int64_t lag = 0;
  if (!idle && relay->ckpt_cluster_s > 0) lag = obx_time_now_ms() - relay->ckpt_cluster_s * 1000;
  relay->counters.lag_ms = lag > 0 ? lag : 0;
}

/* ---- publishing ----------------------------------------------------------------------------- */

void relay_publish(obx_relay_t *relay, const bson_t *doc, obx_relay_msg_t *msg) {
  obx_event_t ev;
  obx_kafka_record_t rec;
  obx_err_t err = OBX_ERR_INIT;
  bson_iter_t it;
  obx_event_init(&ev);
  memset(&rec, 0, sizeof rec);
  relay_msg_set_id(msg, doc);
  if (bson_iter_init_find(&it, doc, "attempts") && BSON_ITER_HOLDS_NUMBER(&it))
    msg->attempts = (int32_t)bson_iter_as_int64(&it);
  msg->occurred_ms = obx_time_now_ms();

  if (!relay->producer) {
    /* stepped down meanwhile (a bucket not led has no producer): nothing leaves, the event stays
     * PENDING (no attempt) for the next leadership */
    snprintf(msg->error, sizeof msg->error, "the bucket is not led (no producer)");
    msg->purged = true;
    if (!relay->reported.n) relay->first_report_ms = obx_time_now_ms();
    relay_list_push(&relay->reported, msg);
    relay_keys_acked(relay, msg);
    goto done;
  }
  if (msg->occurred_ms >= relay->lease_until_ms - relay->conf->relay_lease / 10) {
    /* its own view of the lease ran out (the thread stalled past a renewal): another relay may
     * hold the bucket by now, so nothing leaves; the event stays PENDING (no attempt), the relay
     * steps down at its next lease tick and leads again from the checkpoint if it still can */
    snprintf(msg->error, sizeof msg->error, "the lease ran out before it was renewed");
    msg->purged = true;
    relay->lease_lapsed = true;
    if (!relay->reported.n) relay->first_report_ms = obx_time_now_ms();
    relay_list_push(&relay->reported, msg);
    relay_keys_acked(relay, msg);
    goto done;
  }
  if (!obx_event_from_outbox(&ev, doc, &err) || !obx_event_to_kafka(&ev, RELAY_CE_SOURCE, &rec, &err)) {
    msg->terminal = true; /* a malformed event never becomes publishable by retrying */
    goto failed;
  }
  msg->occurred_ms = ev.occurred_at_ms;
  if (!obx_relay_producer_send(relay->producer, relay->conf->kafka_topic, &rec, msg, &err)) goto failed;
  relay_list_push(msg->from == RELAY_FROM_STREAM ? &relay->inflight_stream : &relay->inflight_sweep, msg);
  goto done;

failed:
  snprintf(msg->error, sizeof msg->error, "%s", err.msg);
  msg->permanent = !err.retriable;
  /* a producer that hit a fatal error refuses everything: it is replaced, this is no attempt */
  msg->purged = !msg->terminal && obx_relay_producer_fatal(relay->producer);
  if (!msg->purged) {
    relay_trace_current(ev.traceparent); /* the context the event was written under, when it decoded */
    obx_log_event(OBX_LOG_WARN, msg_name(msg), ev.correlation_id, "cannot publish: %s", err.msg);
    obx_trace_set_current(NULL);
    relay_metrics_count(relay, RELAY_COUNT_PUBLISH_ERROR);
  }
  if (!relay->reported.n) relay->first_report_ms = obx_time_now_ms();
  relay_list_push(&relay->reported, msg);
  relay_keys_acked(relay, msg); /* the key is held behind it */
done:
  obx_kafka_record_cleanup(&rec);
  obx_event_cleanup(&ev);
}

void relay_serve(obx_relay_t *relay, int timeout_ms, bool force) {
  relay_lease_tick(relay, false); /* first: a thread that stalled renews (or steps down) before it produces more */
  if (relay->producer) obx_relay_producer_poll(relay->producer, timeout_ms);
  else if (timeout_ms > 0) relay_sleep_ms(timeout_ms); /* a standby's pace */
  int64_t now = obx_time_now_ms();
  bool all_in = relay->inflight_stream.n + relay->inflight_sweep.n == 0; /* nothing more to batch with */
  if (relay->reported.n && (force || all_in || relay->reported.n >= RELAY_REPORT_BATCH ||
                            now - relay->first_report_ms >= RELAY_REPORT_DELAY_MS))
    relay_write_reports(relay);
  relay_lease_tick(relay, false);
  relay_metrics_gauges(relay);
}

/* ---- set-up and the loop ------------------------------------------------------------------ */

/* The relay's collections and indexes (obx_schema.h); the reason is kept for /readyz. */
bool relay_ensure_schema(obx_relay_t *relay) {
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_mongo_ping(relay->mongo, &err) && obx_schema_ensure(relay->mongo, relay->conf, OBX_SCHEMA_RELAY, &err);
  pthread_mutex_lock(&relay->ready_mu);
  relay->schema_ready = ok;
  if (!ok) snprintf(relay->not_ready, sizeof relay->not_ready, "schema not ensured yet: %s", err.msg);
  pthread_mutex_unlock(&relay->ready_mu);
  if (!ok) obx_warn("relay schema: %s (retrying)", err.msg);
  return ok;
}

/* One bucket's part of /readyz "relay" (on the probe thread; buckets.c asks each): the relay's
 * collections are in place, and then either it does not hold its bucket (nothing else to need),
 * or it holds it with, when check_producer, a producer that reaches Kafka with the topic there
 * (obx_relay_producer_check) and (stream mode) its change stream open. ready_mu keeps the
 * producer from being replaced meanwhile. */
bool relay_ready(obx_relay_t *relay, bool check_producer, obx_err_t *err) {
  pthread_mutex_lock(&relay->ready_mu);
  bool ready = relay->schema_ready;
  if (!ready) {
    obx_err_set(err, OBX_ERR_MONGO, 0, true, "%s", relay->not_ready);
  } else if (atomic_load(&relay->counters.leader)) {
    /* Kafka first: with relay.fencing=transactions a leader cannot fence its producer in (and
     * so open its stream) without it */
    if (check_producer)
      ready = obx_relay_producer_check(relay->producer, relay->conf->kafka_topic, relay->conf->kafka_brokers,
                                       RELAY_READY_METADATA_MS, err);
    if (ready && !relay->poll_mode && !atomic_load(&relay->counters.stream_up)) {
      ready = false;
      obx_err_set(err, OBX_ERR_MONGO, 0, true, "the leader's change stream on %s.outbox%s is not open (reopening; see the log)",
                  relay->conf->mongo_db, relay->nbuckets > 1 ? " (one of its buckets)" : "");
    }
  }
  pthread_mutex_unlock(&relay->ready_mu);
  return ready;
}

/* Becoming the leader: the bucket's producer created (relay_producer_new), the held keys from the outbox and the claims of an earlier leadership
 * released (sweeper.c); then (stream mode) resume from the
 * checkpoint, or (none yet) start from now and publish every PENDING event first. False when
 * the outbox or the checkpoint could not be read (try again later: a missing checkpoint must
 * not be mistaken for an unreadable one). */
static bool relay_lead_begin(obx_relay_t *relay) {
  obx_err_t err = OBX_ERR_INIT;
  bool fresh = !relay->producer;
  if (fresh) {
    obx_relay_producer_t *producer = relay_producer_new(relay, &err);
    if (!producer) {
      obx_error("creating the Kafka producer of bucket %d: %s (retrying)", relay->bucket, err.msg);
      return false;
    }
    pthread_mutex_lock(&relay->ready_mu); /* /readyz and the reader's wake read it */
    pthread_mutex_lock(&relay->wake_mu);
    relay->producer = producer;
    pthread_mutex_unlock(&relay->wake_mu);
    pthread_mutex_unlock(&relay->ready_mu);
  }
  /* short, well within the stall bound: init_transactions goes on in the background and the
   * next turn resumes it; a producer just created first finds its coordinator, so it is given
   * up to a third of the lease (the renewal is due then), not a turn of the loop a second later */
  int fence_ms = fresh && relay->conf->relay_lease / 3 > RELAY_FENCE_MS ? (int)(relay->conf->relay_lease / 3) : RELAY_FENCE_MS;
  if (!obx_relay_producer_fence(relay->producer, fence_ms, &err)) {
    obx_warn("fencing earlier producers of the transactional.id: %s (retrying)", err.msg);
    return false;
  }
  relay_keys_reset(relay);
  if (!relay_keys_load(relay) || !relay_claims_release(relay)) return false;
  if (relay->poll_mode) return true;
  if (!relay_checkpoint_load(relay)) return false;
  bson_destroy(relay->read_token);
  relay->read_token = relay->ckpt_token ? bson_copy(relay->ckpt_token) : NULL;
  bson_destroy(relay->start_after); /* from a stream of an earlier leadership */
  relay->start_after = NULL;
  relay->ckpt_dirty = false;
  relay_stream_open(relay);
  if (!relay->ckpt_token) {
    obx_info("no checkpoint: publishing PENDING events, then following the stream from now");
    /* cut short (a hand-over began, an error): the stream step sweeps again while it leads */
    if (!relay_sweep_all(relay) && relay->leader && !relay->stopping) relay->sweep_due = true;
  }
  return true;
}


/* A producer that hit a fatal error (a broken sequence, fenced by a newer leader's producer)
 * accepts no more records. Step down (the checkpoint never passed an unacknowledged event; the
 * producer is destroyed, its purged records stay PENDING, untouched) and lead again from the
 * checkpoint at the next lease tick, with a new producer (relay_lead_begin). */
static void relay_producer_renew(obx_relay_t *relay) {
  if (relay->leader) {
    /* the refusal that made it fatal is recorded and the checkpoint moved over what is done,
     * so the next leadership reads less again */
    relay_write_reports(relay);
    relay_checkpoint_write(relay);
    relay_lease_step_down(relay, "the Kafka producer hit a fatal error");
  }
  relay_producer_drop(relay);
  relay_write_reports(relay);
  obx_info("Kafka producer replaced after a fatal error (the new one is created when the bucket is led again)");
}

static void *relay_main(void *arg) {
  obx_relay_t *relay = arg;
  const obx_conf_t *conf = relay->conf;
  char loop[32] = "main";
  if (relay->nbuckets > 1) snprintf(loop, sizeof loop, "bucket %d", relay->bucket);
  obx_log_set_role("relay");
  obx_health_register("relay", loop);
  relay->client = obx_mongo_pop(relay->mongo);
  relay->outbox = obx_mongo_collection(relay->mongo, relay->client, "outbox");
  relay->checkpoints = obx_mongo_collection(relay->mongo, relay->client, "relay_checkpoints");
  relay->leases = obx_mongo_collection(relay->mongo, relay->client, "leases");

  for (;;) {
    obx_health_stamp("ensuring the schema");
    if (relay->stopping || relay_ensure_schema(relay)) break;
    relay_sleep_ms(1000);
  }

  while (!relay->stopping) {
    obx_health_stamp(relay->leader ? "renewing the lease" : "standby: taking the lease");
    if (obx_relay_producer_fatal(relay->producer)) relay_producer_renew(relay);
    relay_lease_tick(relay, true);
    if (!relay->leader) {
      relay_serve(relay, 50, true); /* reports of what was in flight when we stepped down */
      continue;
    }
    if (!atomic_load(&relay->allowed)) {
      relay_serve(relay, 20, true); /* handing the bucket over: no intake, reports only */
      continue;
    }
    if (!relay->led) {
      obx_health_stamp("becoming the leader");
      relay->led = relay_lead_begin(relay) && relay->leader; /* it may have stepped down meanwhile */
      if (!relay->led) relay_serve(relay, 1000, false);
      continue;
    }

    obx_health_stamp("reading the change stream");
    bool busy = !relay->poll_mode && relay_stream_step(relay);
    obx_health_stamp("serving delivery reports");
    /* the loop's wait: a delivery report or a change from the reader ends it (relay_wake), and
     * it ends by the time the reports waiting are due to be written */
    int wait_ms = RELAY_LOOP_WAIT_MS;
    if (relay->reported.n) {
      int64_t due = relay->first_report_ms + RELAY_REPORT_DELAY_MS - obx_time_now_ms();
      wait_ms = due <= 0 ? 0 : due < wait_ms ? (int)due : wait_ms;
    }
    relay_serve(relay, busy ? 0 : wait_ms, false);
    relay_keys_tick(relay);

    int64_t now = obx_time_now_ms();
    bool stream_behind = relay->stream && !relay->caught_up;
    if (relay->led && now >= relay->next_sweep_ms && !stream_behind && relay_pending(relay) < conf->relay_max_inflight) {
      obx_health_stamp("sweeping PENDING events");
      relay_keys_check(relay);
      int found = relay_sweep(relay, relay_sweep_bound(relay));
      bool more = relay->poll_mode && found > 0 && relay->sweep_from_ms != 0; /* the pass goes on */
      relay->next_sweep_ms = more ? now : now + conf->outbox_poll_interval;
    }
    if (!relay->poll_mode && now >= relay->next_ckpt_ms) {
      obx_health_stamp("writing the checkpoint");
      relay_write_reports(relay);
      relay_checkpoint_write(relay);
      relay->next_ckpt_ms = now + conf->relay_checkpoint_interval;
    }
    relay_update_lag(relay);
  }

  /* Shutdown: intake stopped; finish what is in flight, record it, checkpoint, hand over. The
   * stop is bounded by shutdown.grace, not by the stall bound. */
  obx_health_unregister();
  relay_reader_stop(relay); /* closes the stream */
  obx_relay_producer_flush(relay->producer, 5000);
  relay_write_reports(relay);
  relay_checkpoint_write(relay);
  if (relay->leader) relay_lease_release(relay);
  relay->leader = false;
  relay_metrics_gauges(relay);
  mongoc_collection_destroy(relay->leases);
  mongoc_collection_destroy(relay->checkpoints);
  mongoc_collection_destroy(relay->outbox);
  return NULL;
}

static void relay_destroy(obx_relay_t *relay) {
  if (!relay) return;
  obx_relay_producer_destroy(relay->producer); /* purges: reports of the rest are dropped below */
  while (relay->reported.head) {
    obx_relay_msg_t *msg = relay->reported.head;
    relay_list_remove(&relay->reported, msg);
    relay_msg_free(msg);
  }
  if (relay->client) obx_mongo_push(relay->mongo, relay->client);
  relay_window_cleanup(&relay->window);
  pthread_mutex_destroy(&relay->ready_mu);
  pthread_mutex_destroy(&relay->wake_mu);
  bson_destroy(relay->read_token);
  bson_destroy(relay->ckpt_token);
  bson_destroy(relay->start_after);
  relay_keys_reset(relay);
  free(relay->keys);
  free(relay);
}

obx_relay_t *relay_new(const obx_conf_t *conf, obx_mongo_t *mongo, const char *owner, int32_t bucket) {
  obx_relay_t *relay = calloc(1, sizeof *relay);
  if (!relay) abort();
  relay->conf = conf;
  relay->mongo = mongo;
  pthread_mutex_init(&relay->ready_mu, NULL);
  pthread_mutex_init(&relay->wake_mu, NULL);
  snprintf(relay->not_ready, sizeof relay->not_ready, "schema not ensured yet");
  relay->poll_mode = strcmp(conf->relay_mode, "poll") == 0;
  snprintf(relay->owner, sizeof relay->owner, "%s", owner);
  relay->bucket = bucket;
  relay->nbuckets = (int32_t)conf->relay_buckets;
  obx_bucket_id(relay->lease_id, sizeof relay->lease_id, OBX_BUCKET_LEASE_ID, bucket, relay->nbuckets);
  obx_bucket_id(relay->ckpt_id, sizeof relay->ckpt_id, OBX_BUCKET_CHECKPOINT_ID, bucket, relay->nbuckets);
  relay_window_init(&relay->window, (size_t)conf->relay_max_inflight * 4 + 8);
  return relay; /* its producer is created when it leads the bucket (relay_lead_begin) */
}

bool relay_run(obx_relay_t *relay, obx_err_t *err) {
  if (!relay->poll_mode && !relay_reader_start(relay, err)) return false;
  relay->running = pthread_create(&relay->thread, NULL, relay_main, relay) == 0;
  if (relay->running) return true;
  relay_reader_stop(relay);
  obx_err_set(err, OBX_ERR_SYS, 0, false, "relay: cannot start the thread of bucket %d", relay->bucket);
  return false;
}

void relay_stop(obx_relay_t *relay) {
  if (!relay) return;
  relay->stopping = true;
  if (relay->running) pthread_join(relay->thread, NULL);
  relay_destroy(relay);
}
