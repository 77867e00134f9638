/* keys.c - per-key order: a window of events in flight per partition key, the queue behind it, holds
 *
 * DESIGN: every event the relay publishes goes through relay_keys_submit. A key has at most
 * key_window events in flight, in order (the producer keeps a partition's order):
 * relay.key_window (default 1) when the producer has the gap-less guarantee
 * (obx_relay_producer_gapless: the idempotent producer without a message timeout), else 1
 * (the transactional producer, or a
 * kafka.message.timeout.ms: the next event is produced only after Kafka acknowledged the
 * previous). Either way an event Kafka refuses never has a later event of its key written
 * after it: with one in flight there is none on its way; with several, the refusal makes the
 * producer fatal before any later record of the partition is written (librdkafka fails the
 * later ones: purged, or out of order at the broker), the relay replaces it and leads again
 * from the checkpoint, and the refused event's report (the broker's code, after the fatal
 * error: obx_relay_producer_refused) is its attempt. A refused event (any failed delivery
 * report but a purge) holds its key: it is the head, recorded FAILED at once with the broker's
 * reason when the error is not retriable, else PENDING with a backoff, retried by the sweeper.
 * A later event of a held key that comes back failed too (the same refused batch) is not an
 * attempt: it stays PENDING behind the head. While a key is held, its later events are not
 * published: they stay PENDING in the outbox (the queue behind the head is dropped, its stream slots
 * done) and the sweeper leaves them alone; only the head may be published. The hold ends when
 * the head is published (its retry succeeded, or an operator reprocessed or fixed it) or is no
 * longer there to publish (an operator skipped it: SKIPPED, or deleted it; relay_keys_check
 * looks every sweep interval). Then the key's PENDING events are published in keySeq order
 * (then occurredAt, _id) before anything newer of that key. A new leader rebuilds the holds
 * from the outbox: the oldest FAILED event of a key, or a PENDING one with failed attempts.
 *
 *   key state   event                          next state, action
 *   idle        submit                         busy, produce
 *   busy        submit, window not full        busy, produce
 *   busy        submit, window full            busy, queue it
 *   busy        ack ok                         busy/idle, produce the next queued
 *   busy        ack failed (not a purge)       held, drop the queue (left PENDING)
 *   busy        purge (step-down, shutdown)    idle, drop the queue (the window is reset)
 *   held        ack failed of a later event    held, not an attempt (left PENDING, slot done)
 *   held        submit of the head, read back  held+busy, produce it
 *   held        submit of the head's insert    held, not published (the stream read it again)
 *   held        submit of another event        held, not published (left PENDING)
 *   held        head published / gone          releasing: publish the key's PENDING events
 *
 * Owned by the relay thread, like every message. Counted: outboxd_relay_held_keys. */
#include "relay/relay_int.h"

#include "obx/obx_bucket.h"

#include <stdlib.h>
#include <string.h>

#include "obx/obx_log.h"

#define KEYS_BUCKETS 4096
#define KEYS_LOAD_MAX 10000

typedef struct relay_queued {
  bson_t *doc;
  obx_relay_msg_t *msg;
  struct relay_queued *next;
} relay_queued_t;

struct relay_key {
  char *key;
  int inflight;             /* events of the key in flight (at most key_window) */
  relay_queued_t *head, *tail;
  char *held_id;            /* relay_id_key of the head holding the key; NULL: not held */
  bson_value_t held_idv;
  char reason[256];
  bool release_due;         /* the head is resolved: publish the key's PENDING events */
  struct relay_key *next;   /* hash chain */
};

/* The hash chain of a key, by Kafka's murmur2 (obx_bucket.h: the hash the buckets use too). */
static size_t key_slot(const char *key) {
  return (uint32_t)obx_murmur2(key, strlen(key)) % KEYS_BUCKETS;
}

static relay_key_t *key_find(obx_relay_t *relay, const char *key, bool create) {
  if (!relay->keys) {
    relay->keys = calloc(KEYS_BUCKETS, sizeof *relay->keys);
    if (!relay->keys) abort();
  }
  relay_key_t **slot = &relay->keys[key_slot(key)];
  for (relay_key_t *k = *slot; k; k = k->next)
    if (strcmp(k->key, key) == 0) return k;
  if (!create) return NULL;
  relay_key_t *k = calloc(1, sizeof *k);
  if (!k) abort();
  k->key = strdup(key);
  k->next = *slot;
  *slot = k;
  return k;
}

/* Frees k when it holds nothing: no event in flight or queued, no hold, no release due (its
 * PENDING events still to publish, relay_keys_tick). */
static void key_gc(obx_relay_t *relay, relay_key_t *k) {
  if (k->inflight || k->head || k->held_id || k->release_due) return;
  relay_key_t **slot = &relay->keys[key_slot(k->key)];
  while (*slot != k) slot = &(*slot)->next;
  *slot = k->next;
  free(k->key);
  free(k);
}

const char *relay_doc_key(const bson_t *doc) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, doc, "partitionKey") && BSON_ITER_HOLDS_UTF8(&it)) return bson_iter_utf8(&it, NULL);
  if (bson_iter_init_find(&it, doc, "aggregateId") && BSON_ITER_HOLDS_UTF8(&it)) return bson_iter_utf8(&it, NULL);
  return NULL;
}

/* An event that is not published now (it stays PENDING). Held: its stream slot is done, the
 * release publishes it. Not held (a purge): the slot stays, so the checkpoint never passes it. */
static void key_drop(obx_relay_t *relay, obx_relay_msg_t *msg, bool held) {
  if (held && msg->from == RELAY_FROM_STREAM) relay_window_done(relay, msg->seq);
  relay_msg_free(msg);
}

static void key_drop_queue(obx_relay_t *relay, relay_key_t *k) {
  while (k->head) {
    relay_queued_t *q = k->head;
    k->head = q->next;
    relay->nqueued--;
    key_drop(relay, q->msg, k->held_id != NULL);
    bson_destroy(q->doc);
    free(q);
  }
  k->tail = NULL;
}

/* Holds k behind msg's event; a new hold is logged at `level` (a refusal: error; a takeover's
 * hold of a claimed event: debug, relay_claims_release counts them in one line). */
static void key_hold(obx_relay_t *relay, relay_key_t *k, const obx_relay_msg_t *msg, obx_log_level_t level) {
  if (!k->held_id) {
    relay->nheld++;
    k->held_id = strdup(msg->id);
    bson_value_copy(&msg->idv, &k->held_idv);
    obx_log_event(level, msg->id + 1, NULL, "key %s held: its later events wait until this event is "
                  "published, reprocessed, fixed or skipped (%s)", k->key, msg->error);
  }
  snprintf(k->reason, sizeof k->reason, "%s", msg->error);
  k->release_due = false;
}

static void key_unhold(obx_relay_t *relay, relay_key_t *k) {
  if (!k->held_id) return;
  relay->nheld--;
  free(k->held_id);
  k->held_id = NULL;
  bson_value_destroy(&k->held_idv);
}

static int key_window(const obx_relay_t *relay) {
  return obx_relay_producer_gapless(relay->producer) ? (int)relay->conf->relay_key_window : 1;
}

void relay_keys_submit(obx_relay_t *relay, const bson_t *doc, obx_relay_msg_t *msg) {
  const char *key = relay_doc_key(doc);
  relay_msg_set_id(msg, doc);
  if (!key) {
    relay_publish(relay, doc, msg); /* malformed without a key: it fails on its own */
    return;
  }
  relay_key_t *k = key_find(relay, key, true);
  bool head = k->held_id && msg->id && strcmp(k->held_id, msg->id) == 0;
  /* a held key's head was attempted after it was inserted: the insert read again from the
   * stream (a new leadership resumes before the attempt) shows it PENDING as it was, so only a
   * document read back (a reprocess's update, the sweeper's retry) publishes it */
  if (k->held_id && (!head || msg->as_inserted)) {
    key_drop(relay, msg, true);
    return;
  }
  msg->pkey = strdup(key);
  if (k->head || k->inflight >= key_window(relay)) {
    relay_queued_t *q = calloc(1, sizeof *q);
    if (!q) abort();
    q->doc = bson_copy(doc);
    q->msg = msg;
    if (k->tail) k->tail->next = q;
    else k->head = q;
    k->tail = q;
    relay->nqueued++;
    return;
  }
  k->inflight++;
  relay_publish(relay, doc, msg);
}

void relay_keys_acked(obx_relay_t *relay, obx_relay_msg_t *msg) {
  if (!msg->pkey) return;
  relay_key_t *k = key_find(relay, msg->pkey, false);
  if (!k) return;
  /* producing the next event may report its failure at once, re-entering here for the same
   * key: only the outermost call may free k */
  relay->keys_depth++;
  if (k->inflight > 0) k->inflight--;
  bool head = k->held_id && msg->id && strcmp(k->held_id, msg->id) == 0;
  if (!msg->ok && !msg->purged && k->held_id && !head) {
    /* a later event of a key an earlier refusal holds (the same refused batch): not an
     * attempt; it stays PENDING behind the head, which the release publishes it after */
    msg->purged = true;
    if (msg->from == RELAY_FROM_STREAM) relay_window_done(relay, msg->seq);
  }
  if (!msg->ok) {
    if (!msg->purged) key_hold(relay, k, msg, OBX_LOG_ERROR);
    key_drop_queue(relay, k);
  } else {
    if (k->held_id && msg->id && strcmp(k->held_id, msg->id) == 0) {
      key_unhold(relay, k);
      k->release_due = true; /* its PENDING events, in order, before anything newer */
      relay->release_due = true;
    }
    while (k->head && k->inflight < key_window(relay)) {
      relay_queued_t *q = k->head;
      k->head = q->next;
      if (!k->head) k->tail = NULL;
      relay->nqueued--;
      k->inflight++;
      relay_publish(relay, q->doc, q->msg); /* a failure re-enters and drops the queue */
      bson_destroy(q->doc);
      free(q);
    }
  }
  if (--relay->keys_depth == 0) key_gc(relay, k);
}

/* Publishes the PENDING events of a released key in keySeq order; the ones already in flight
 * or queued are left to their message. */
static bool key_release(obx_relay_t *relay, relay_key_t *k) {
  bson_t *filter = BCON_NEW("partitionKey", BCON_UTF8(k->key), "status", "PENDING");
  bson_t *opts = BCON_NEW("sort", "{", "keySeq", BCON_INT32(1), "occurredAt", BCON_INT32(1), "_id", BCON_INT32(1), "}",
                          "limit", BCON_INT64(relay->conf->relay_max_inflight));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(relay->outbox, filter, opts, NULL);
  const bson_t *doc;
  int n = 0;
  char *key = strdup(k->key); /* k may be freed by a submit's gc */
  while (mongoc_cursor_next(cursor, &doc)) {
    if (relay_doc_inflight(relay, doc, true)) continue;
    obx_relay_msg_t *msg = calloc(1, sizeof *msg);
    if (!msg) abort();
    msg->from = RELAY_FROM_SWEEP;
    relay_keys_submit(relay, doc, msg);
    n++;
  }
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_mongo_cursor_end(cursor, &err);
  if (!ok) obx_warn("releasing key %s: %s (will retry)", key, err.msg);
  else obx_info("key %s released: publishing its %d waiting events in order", key, n);
  free(key);
  bson_destroy(opts);
  bson_destroy(filter);
  return ok;
}

void relay_keys_tick(obx_relay_t *relay) {
  if (!relay->release_due || !relay->keys) return;
  relay->release_due = false;
  for (size_t b = 0; b < KEYS_BUCKETS; b++)
    for (relay_key_t *k = relay->keys[b], *next; k; k = next) {
      next = k->next;
      if (!k->release_due) continue;
      k->release_due = false;
      char *name = strdup(k->key);
      bool ok = key_release(relay, k); /* a failed publish inside may free k */
      relay_key_t *again = key_find(relay, name, false);
      free(name);
      if (!ok && again) {
        again->release_due = relay->release_due = true;
        return;
      }
      if (again) key_gc(relay, again);
    }
}

void relay_keys_check(obx_relay_t *relay) {
  if (!relay->nheld) return;
  for (size_t b = 0; b < KEYS_BUCKETS; b++)
    for (relay_key_t *k = relay->keys[b]; k; k = k->next) {
      if (!k->held_id || k->inflight) continue;
      bson_t *filter = bson_new();
      BSON_APPEND_VALUE(filter, "_id", &k->held_idv);
      bson_t head = BSON_INITIALIZER;
      bool found = false;
      obx_err_t err = OBX_ERR_INIT;
      if (obx_mongo_find_one(relay->outbox, filter, NULL, NULL, &head, &found, &err)) {
        const char *status = obx_mongo_doc_str(&head, "status");
        if (!found || !status || (strcmp(status, "FAILED") != 0 && strcmp(status, "PENDING") != 0)) {
          obx_info("key %s released: its head is %s", k->key, found ? status ? status : "?" : "gone");
          key_unhold(relay, k);
          k->release_due = relay->release_due = true;
        }
      } else {
        obx_warn("checking the head of held key %s: %s", k->key, err.msg);
      }
      bson_destroy(&head);
      bson_destroy(filter);
    }
}

/* Holds the keys of the documents `filter` (sorted by `sort`, may be NULL) finds: the first
 * of a key is its head; each new hold logged at `level`. */
static bool keys_load_from(obx_relay_t *relay, bson_t *filter, bson_t *sort, const char *why_default,
                           obx_log_level_t level) {
  bson_t *opts = BCON_NEW("limit", BCON_INT64(KEYS_LOAD_MAX));
  if (sort) BSON_APPEND_DOCUMENT(opts, "sort", sort);
  relay_bucket_filter(relay, filter, OBX_BUCKET_FIELD); /* the keys of this relay's bucket */
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(relay->outbox, filter, opts, NULL);
  const bson_t *doc;
  while (mongoc_cursor_next(cursor, &doc)) {
    const char *key = relay_doc_key(doc);
    if (!key || !relay_doc_mine(relay, doc)) continue;
    relay_key_t *k = key_find(relay, key, true);
    if (k->held_id) continue; /* the oldest is the head */
    obx_relay_msg_t msg;
    memset(&msg, 0, sizeof msg);
    relay_msg_set_id(&msg, doc);
    const char *why = obx_mongo_doc_str(doc, "lastError");
    snprintf(msg.error, sizeof msg.error, "%s", why ? why : why_default);
    key_hold(relay, k, &msg, level);
    free(msg.id);
    free(msg.shard_key);
    if (msg.idv.value_type) bson_value_destroy(&msg.idv);
  }
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_mongo_cursor_end(cursor, &err);
  if (!ok) obx_warn("loading held keys: %s", err.msg);
  bson_destroy(opts);
  bson_destroy(sort);
  bson_destroy(filter);
  return ok;
}

bool relay_keys_load(obx_relay_t *relay) {
  /* FAILED heads oldest first (index {status, occurredAt, _id}); then PENDING ones being retried
   * (one per key at most: a key has one event in flight; partial index outbox_pending_retried);
   * then PENDING ones an earlier leader claimed (the stream must not publish their keys' later
   * events first; oldest first, partial index outbox_pending_claimed). The two PENDING filters
   * repeat those indexes' partialFilterExpression (src/lib/schema.c), so a server may use them:
   * a takeover reads what matches, not the PENDING backlog. */
  return keys_load_from(relay, BCON_NEW("status", "FAILED"), BCON_NEW("occurredAt", BCON_INT32(1), "_id", BCON_INT32(1)),
                        "a failed publish", OBX_LOG_ERROR) &&
         keys_load_from(relay, BCON_NEW("status", "PENDING", "attempts", "{", "$gt", BCON_INT32(0), "}"), NULL,
                        "a failed publish", OBX_LOG_ERROR) &&
         keys_load_from(relay, BCON_NEW("status", "PENDING", "claimedUntil", "{", "$exists", BCON_BOOL(true), "}"),
                        BCON_NEW("availableAt", BCON_INT32(1), "_id", BCON_INT32(1)),
                        "claimed by an earlier leader, not yet published", OBX_LOG_DEBUG);
}

void relay_keys_filter(obx_relay_t *relay, bson_t *query) {
  if (!relay->nheld) return;
  bson_t nor, clause, in, nin, keys, heads;
  int n = 0;
  char idx[16];
  BSON_APPEND_ARRAY_BEGIN(query, "$nor", &nor);
  BSON_APPEND_DOCUMENT_BEGIN(&nor, "0", &clause);
  BSON_APPEND_DOCUMENT_BEGIN(&clause, "partitionKey", &in);
  BSON_APPEND_ARRAY_BEGIN(&in, "$in", &keys);
  for (size_t b = 0; b < KEYS_BUCKETS; b++)
    for (relay_key_t *k = relay->keys[b]; k; k = k->next)
      if (k->held_id) {
        snprintf(idx, sizeof idx, "%d", n++);
        BSON_APPEND_UTF8(&keys, idx, k->key);
      }
  bson_append_array_end(&in, &keys);
  bson_append_document_end(&clause, &in);
  BSON_APPEND_DOCUMENT_BEGIN(&clause, "_id", &nin);
  BSON_APPEND_ARRAY_BEGIN(&nin, "$nin", &heads);
  n = 0;
  for (size_t b = 0; b < KEYS_BUCKETS; b++)
    for (relay_key_t *k = relay->keys[b]; k; k = k->next)
      if (k->held_id) {
        snprintf(idx, sizeof idx, "%d", n++);
        BSON_APPEND_VALUE(&heads, idx, &k->held_idv);
      }
  bson_append_array_end(&nin, &heads);
  bson_append_document_end(&clause, &nin);
  bson_append_document_end(&nor, &clause);
  bson_append_array_end(query, &nor);
}

void relay_keys_reset(obx_relay_t *relay) {
  /* the reports of what is still in flight no longer count against a key's window */
  relay_list_t *lists[] = {&relay->inflight_stream, &relay->inflight_sweep};
  for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++)
    for (obx_relay_msg_t *msg = lists[l]->head; msg; msg = msg->next) {
      free(msg->pkey);
      msg->pkey = NULL;
    }
  if (!relay->keys) return;
  for (size_t b = 0; b < KEYS_BUCKETS; b++)
    while (relay->keys[b]) {
      relay_key_t *k = relay->keys[b];
      key_unhold(relay, k); /* first: the dropped events keep their slots (the window is reset) */
      key_drop_queue(relay, k);
      relay->keys[b] = k->next;
      free(k->key);
      free(k);
    }
  relay->release_due = false;
}

bool relay_keys_queued_has(const obx_relay_t *relay, const char *pkey, const char *id) {
  if (!relay->keys || !relay->nqueued) return false;
  size_t first = pkey ? key_slot(pkey) : 0, last = pkey ? first : KEYS_BUCKETS - 1;
  for (size_t b = first; b <= last; b++)
    for (const relay_key_t *k = relay->keys[b]; k; k = k->next) {
      if (pkey && strcmp(k->key, pkey) != 0) continue;
      for (const relay_queued_t *q = k->head; q; q = q->next)
        if (q->msg->id && strcmp(q->msg->id, id) == 0) return true;
    }
  return false;
}

bool relay_doc_inflight(const obx_relay_t *relay, const bson_t *doc, bool stream_too) {
  char *id = relay_id_key(doc);
  bool has = id && (relay_inflight_has(relay, id, stream_too) || relay_keys_queued_has(relay, relay_doc_key(doc), id));
  free(id);
  return has;
}
