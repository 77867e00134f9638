/* stream.c - the relay's change stream on `outbox` and its checkpoint window
 *
 * DESIGN: the stream matches inserts, replacements and updates that set status to PENDING
 * (a reprocessed FAILED event) of this relay's bucket (fullDocument.bucket, or none given:
 * relay_bucket_filter; such an event is this relay's when its key falls in the bucket), with
 * fullDocument updateLookup; an update whose looked-up
 * document is no longer PENDING (published meanwhile, deleted) is skipped. It is read only while
 * fewer than relay.max_inflight events are unacknowledged and the window has room: when Kafka is
 * down the relay stops reading and memory stays flat.
 *
 * The window holds one slot per change read, in stream order; a slot is done when its event's
 * outcome is written to the outbox (or it was skipped). The checkpoint moves to the token of
 * the last slot of the done prefix, never further. An empty batch adds a done slot with the
 * postBatchResumeToken, so an idle relay keeps its checkpoint (and lag) current. Consecutive
 * done slots collapse into the newest one.
 *
 * The reader: in stream mode each relay has a second thread that owns nothing but the waits.
 * It calls mongoc_change_stream_next on a client of its own (the stream is opened and closed on
 * the relay thread, while the reader is not inside a call) and queues a copy of each change,
 * of each empty batch's postBatchResumeToken (coalesced: only the newest waits) and of an error
 * (then it stops until the stream is reopened); it reads only as many changes as the relay
 * thread allowed (its credit: the room under relay.max_inflight and the window), so the queue is
 * bounded. Each item queued wakes the relay thread (relay_wake: its wait in the producer's poll
 * returns), so the relay waits for "a change or a delivery report", whichever comes first,
 * instead of blocking in an awaiting getMore while reports of what it produced wait (which cost
 * up to RELAY_STREAM_AWAIT_MS of commit-to-ack latency per event). A change the getMore waited
 * for (RELAY_STREAM_HEAD_US) marks the stream caught up, as an empty batch does.
 *
 *   reader state   event                                  next, action
 *   idle           credit > 0 and a stream                reading: next()
 *   reading        a change                               idle/reading: queued, credit - 1
 *   reading        an empty batch                         reading: its token queued (replaces a
 *                                                         queued one)
 *   reading        an error                               failed: queued; the relay thread
 *                                                         handles it (relay_stream_failed)
 *   any            the relay thread closes the stream     waits for the call in progress, the
 *                                                         queue dropped, idle
 *   any            stop (the end of relay_main)           the thread ends
 *
 * Errors: the driver resumes once by itself on resumable errors; anything else closes the
 * stream. Errors it cannot resume from restart it (relay_stream_restart): the cause is counted
 * (outboxd_relay_stream_restarts_total{cause}) and logged by name, the stream reopens from the
 * current time and every PENDING event is published by a full sweep, so nothing is lost:
 *
 *   error                                 cause                  reopens
 *   286 ChangeStreamHistoryLost           history_lost           from now
 *   280 ChangeStreamFatalError            fatal_error            from now
 *   260 InvalidResumeToken                invalid_resume_token   from now
 *   an invalidate event (drop, rename)    invalidate             startAfter its token (the rule
 *                                                                for a stream after invalidate),
 *                                                                the schema ensured again
 *   other errors                          -                      from the newest token read, a
 *                                                                second later; after
 *                                                                RELAY_STREAM_REOPEN_LIMIT in a
 *                                                                row: reopen_failed, from now
 *
 * The open and the sweep happen in relay_stream_step (never inside the error path), so an
 * error repeated on every open backs off instead of recursing. */
#include "relay/relay_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_log.h"

#define RELAY_STREAM_READS_PER_STEP 256
#define RELAY_HISTORY_LOST 286
#define RELAY_FATAL_ERROR 280
#define RELAY_INVALID_RESUME_TOKEN 260
#define RELAY_STREAM_REOPEN_LIMIT 10
#define RELAY_STREAM_RETRY_MS 1000
/* An awaiting getMore returns an empty batch after this long: the reader's idle round trip, and
 * the longest a close of the stream waits for the getMore in progress. */
#define RELAY_STREAM_AWAIT_MS 100
/* A change whose read took this long was answered by an awaiting getMore: the stream is at its
 * head (a buffered change or a getMore over a backlog returns in well under this on a LAN). */
#define RELAY_STREAM_HEAD_US 2000

const char *const relay_stream_cause_names[RELAY_STREAM_NCAUSES] = {
  "history_lost", "fatal_error", "invalid_resume_token", "invalidate", "reopen_failed",
};

void relay_window_init(relay_window_t *window, size_t cap) {
  window->slots = calloc(cap, sizeof *window->slots);
  if (!window->slots) abort();
  window->cap = cap;
  window->first = window->end = 0;
}

void relay_window_cleanup(relay_window_t *window) {
  for (uint64_t s = window->first; s < window->end; s++) bson_destroy(window->slots[s % window->cap].token);
  free(window->slots);
  window->slots = NULL;
}

void relay_window_reset(obx_relay_t *relay) {
  relay_window_t *window = &relay->window;
  for (; window->first < window->end; window->first++) {
    relay_slot_t *slot = &window->slots[window->first % window->cap];
    bson_destroy(slot->token);
    slot->token = NULL;
  }
}

bool relay_window_full(const relay_window_t *window) {
  return window->end - window->first + 1 >= window->cap;
}

static void window_checkpoint_to(obx_relay_t *relay, bson_t *token, int64_t cluster_s) {
  bson_destroy(relay->ckpt_token);
  relay->ckpt_token = token;
  relay->ckpt_cluster_s = cluster_s;
  relay->ckpt_dirty = true;
}

/* Moves the checkpoint over the done prefix. */
static void window_advance(obx_relay_t *relay) {
  relay_window_t *window = &relay->window;
  while (window->first < window->end) {
    relay_slot_t *slot = &window->slots[window->first % window->cap];
    if (slot->state != SLOT_DONE) break;
    window_checkpoint_to(relay, slot->token, slot->cluster_s);
    slot->token = NULL;
    window->first++;
  }
}

uint64_t relay_window_push(obx_relay_t *relay, bson_t *token, int64_t cluster_s, relay_slot_state_t state) {
  relay_window_t *window = &relay->window;
  if (state == SLOT_DONE && window->first == window->end) {
    window_checkpoint_to(relay, token, cluster_s);
    return window->end;
  }
  if (state == SLOT_DONE) {
    relay_slot_t *tail = &window->slots[(window->end - 1) % window->cap];
    if (tail->state == SLOT_DONE) {
      bson_destroy(tail->token);
      tail->token = token;
      tail->cluster_s = cluster_s;
      return window->end - 1;
    }
  }
  BSON_ASSERT(!relay_window_full(window));
  relay_slot_t *slot = &window->slots[window->end % window->cap];
  slot->token = token;
  slot->cluster_s = cluster_s;
  slot->state = state;
  return window->end++;
}

void relay_window_done(obx_relay_t *relay, uint64_t seq) {
  relay_window_t *window = &relay->window;
  if (seq < window->first || seq >= window->end) return; /* from before a reset */
  window->slots[seq % window->cap].state = SLOT_DONE;
  window_advance(relay);
}

/* ---- the reader ------------------------------------------------------------------------ */

typedef enum { ITEM_CHANGE, ITEM_IDLE, ITEM_ERROR } reader_item_kind_t;

typedef struct reader_item {
  reader_item_kind_t kind;
  bson_t *doc;         /* the change; the empty batch's resume token (may be NULL); the error reply (may be NULL) */
  bson_error_t berr;   /* ITEM_ERROR */
  bool at_head;        /* ITEM_CHANGE: the getMore waited for it */
  int64_t read_ms;     /* when the call returned: an empty batch's token is the head then, not
                          when the relay thread takes it (a change committed meanwhile is after it) */
  struct reader_item *next;
} reader_item_t;

struct relay_reader {
  obx_relay_t *relay;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cond;       /* credit given, stream closed, stop; a call ended (for a closer) */
  mongoc_client_t *client;   /* the stream's: used by the reader's calls and by open/close between them */
  mongoc_collection_t *outbox;
  /* under mu */
  mongoc_change_stream_t *stream; /* what it may read (NULL: closed) */
  int credit;                /* changes it may still read */
  bool reading;              /* inside mongoc_change_stream_next */
  bool failed;               /* an error is queued: no reads until the stream is reopened */
  bool stop;
  reader_item_t *head, *tail;
  int queued;                /* changes in the queue */
};

static void item_free(reader_item_t *item) {
  if (!item) return;
  bson_destroy(item->doc);
  free(item);
}

/* Queues item (mu held); an empty batch after an empty batch replaces it. */
static void reader_push(relay_reader_t *reader, reader_item_t *item) {
  if (item->kind == ITEM_IDLE && reader->tail && reader->tail->kind == ITEM_IDLE) {
    bson_destroy(reader->tail->doc);
    reader->tail->doc = item->doc;
    reader->tail->read_ms = item->read_ms;
    item->doc = NULL;
    item_free(item);
    return;
  }
  if (item->kind == ITEM_CHANGE) {
    reader->queued++;
    reader->credit--;
  }
  if (item->kind == ITEM_ERROR) reader->failed = true;
  if (reader->tail) reader->tail->next = item;
  else reader->head = item;
  reader->tail = item;
}

static reader_item_t *reader_take(relay_reader_t *reader) {
  pthread_mutex_lock(&reader->mu);
  reader_item_t *item = reader->head;
  if (item) {
    reader->head = item->next;
    if (!reader->head) reader->tail = NULL;
    if (item->kind == ITEM_CHANGE) reader->queued--;
  }
  pthread_mutex_unlock(&reader->mu);
  return item;
}

/* One call on the stream (mu not held): the item it gives. */
static reader_item_t *reader_next(mongoc_change_stream_t *stream) {
  reader_item_t *item = calloc(1, sizeof *item);
  if (!item) abort();
  const bson_t *change, *reply = NULL;
  int64_t t0 = bson_get_monotonic_time();
  if (mongoc_change_stream_next(stream, &change)) {
    item->kind = ITEM_CHANGE;
    item->doc = bson_copy(change);
    item->at_head = bson_get_monotonic_time() - t0 >= RELAY_STREAM_HEAD_US;
  } else if (mongoc_change_stream_error_document(stream, &item->berr, &reply)) {
    item->kind = ITEM_ERROR;
    item->doc = reply && !bson_empty(reply) ? bson_copy(reply) : NULL;
  } else {
    const bson_t *pbrt = mongoc_change_stream_get_resume_token(stream);
    item->kind = ITEM_IDLE;
    item->doc = pbrt ? bson_copy(pbrt) : NULL;
  }
  item->read_ms = obx_time_now_ms();
  return item;
}

static void *reader_main(void *arg) {
  relay_reader_t *reader = arg;
  obx_log_set_role("relay");
  pthread_mutex_lock(&reader->mu);
  while (!reader->stop) {
    if (!reader->stream || reader->credit <= 0 || reader->failed) {
      pthread_cond_wait(&reader->cond, &reader->mu);
      continue;
    }
    mongoc_change_stream_t *stream = reader->stream;
    reader->reading = true;
    pthread_mutex_unlock(&reader->mu);
    reader_item_t *item = reader_next(stream);
    pthread_mutex_lock(&reader->mu);
    reader->reading = false;
    pthread_cond_broadcast(&reader->cond); /* a close waits for the call to end */
    bool wake = item->kind != ITEM_IDLE || !reader->tail || reader->tail->kind != ITEM_IDLE;
    reader_push(reader, item); /* the stream cannot have changed: a close waits for the call */
    pthread_mutex_unlock(&reader->mu);
    if (wake) relay_wake(reader->relay);
    pthread_mutex_lock(&reader->mu);
  }
  pthread_mutex_unlock(&reader->mu);
  return NULL;
}

bool relay_reader_start(obx_relay_t *relay, obx_err_t *err) {
  relay_reader_t *reader = calloc(1, sizeof *reader);
  if (!reader) abort();
  reader->relay = relay;
  pthread_mutex_init(&reader->mu, NULL);
  pthread_cond_init(&reader->cond, NULL);
  reader->client = obx_mongo_pop(relay->mongo);
  reader->outbox = obx_mongo_collection(relay->mongo, reader->client, "outbox");
  if (pthread_create(&reader->thread, NULL, reader_main, reader) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "relay: cannot start the change stream's reader of bucket %d", relay->bucket);
    mongoc_collection_destroy(reader->outbox);
    obx_mongo_push(relay->mongo, reader->client);
    pthread_cond_destroy(&reader->cond);
    pthread_mutex_destroy(&reader->mu);
    free(reader);
    return false;
  }
  relay->reader = reader;
  return true;
}

void relay_reader_stop(obx_relay_t *relay) {
  relay_reader_t *reader = relay->reader;
  if (!reader) return;
  relay_stream_close(relay);
  pthread_mutex_lock(&reader->mu);
  reader->stop = true;
  pthread_cond_broadcast(&reader->cond);
  pthread_mutex_unlock(&reader->mu);
  pthread_join(reader->thread, NULL);
  relay->reader = NULL;
  mongoc_collection_destroy(reader->outbox);
  obx_mongo_push(relay->mongo, reader->client);
  pthread_cond_destroy(&reader->cond);
  pthread_mutex_destroy(&reader->mu);
  free(reader);
}

/* Lets the reader read on: as many changes as fit under relay.max_inflight and in the window,
 * less what it already queued. */
static void reader_grant(obx_relay_t *relay) {
  relay_reader_t *reader = relay->reader;
  relay_window_t *window = &relay->window;
  int64_t room = relay->conf->relay_max_inflight - relay_pending(relay);
  int64_t slots = (int64_t)window->cap - (int64_t)(window->end - window->first) - 3; /* an empty batch's slot too */
  if (slots < room) room = slots;
  pthread_mutex_lock(&reader->mu);
  reader->stream = relay->stream;
  room -= reader->queued;
  bool more = room > reader->credit;
  reader->credit = room > 0 ? (int)room : 0;
  if (more) pthread_cond_broadcast(&reader->cond);
  pthread_mutex_unlock(&reader->mu);
}

/* ---- the stream ------------------------------------------------------------------------- */

void relay_stream_close(obx_relay_t *relay) {
  relay_reader_t *reader = relay->reader;
  if (reader) {
    pthread_mutex_lock(&reader->mu);
    reader->stream = NULL;
    while (reader->reading) pthread_cond_wait(&reader->cond, &reader->mu);
    while (reader->head) {
      reader_item_t *item = reader->head;
      reader->head = item->next;
      item_free(item);
    }
    reader->tail = NULL;
    reader->queued = reader->credit = 0;
    reader->failed = false;
    pthread_mutex_unlock(&reader->mu);
  }
  mongoc_change_stream_destroy(relay->stream);
  relay->stream = NULL;
  relay->caught_up = false;
}

static void relay_stream_failed(obx_relay_t *relay, const bson_error_t *berr, const bson_t *reply);

bool relay_stream_open(obx_relay_t *relay) {
  bson_t *pipeline = bson_new(), stages, stage, match;
  BSON_APPEND_ARRAY_BEGIN(pipeline, "pipeline", &stages);
  BSON_APPEND_DOCUMENT_BEGIN(&stages, "0", &stage);
  BSON_APPEND_DOCUMENT_BEGIN(&stage, "$match", &match);
  BCON_APPEND(&match, "$or", "[",
    "{", "operationType", "insert", "}",
    "{", "operationType", "replace", "fullDocument.status", "PENDING", "}",
    "{", "operationType", "update", "updateDescription.updatedFields.status", "PENDING", "}",
    "]");
  relay_bucket_filter(relay, &match, "fullDocument.bucket"); /* its bucket, or none given yet */
  bson_append_document_end(&stage, &match);
  bson_append_document_end(&stages, &stage);
  bson_append_array_end(pipeline, &stages);
  int32_t batch = relay->conf->relay_max_inflight < 1000 ? (int32_t)relay->conf->relay_max_inflight : 1000;
  bson_t *opts = BCON_NEW("fullDocument", "updateLookup", "maxAwaitTimeMS", BCON_INT64(RELAY_STREAM_AWAIT_MS),
                          "batchSize", BCON_INT32(batch));
  if (relay->start_after) BSON_APPEND_DOCUMENT(opts, "startAfter", relay->start_after);
  else if (relay->read_token) BSON_APPEND_DOCUMENT(opts, "resumeAfter", relay->read_token);
  relay_stream_close(relay);
  relay->stream = mongoc_collection_watch(relay->reader->outbox, pipeline, opts); /* the reader reads it */
  /* the full sweep's bound: taken once the aggregate is answered, so at or after the stream's
   * start. Taken before it was sent, an event written while the aggregate was on its way (the
   * reader's client connecting, a loaded server) was neither the sweep's (written after the
   * bound) nor the stream's (committed before its start), and went out with a later sweep,
   * after the key's later events */
  relay->stream_opened_ms = obx_time_now_ms();
  bson_destroy(opts);
  bson_destroy(pipeline);

  bson_error_t berr;
  const bson_t *reply = NULL;
  if (mongoc_change_stream_error_document(relay->stream, &berr, &reply)) {
    relay_stream_failed(relay, &berr, reply);
    return false;
  }
  obx_info("change stream on outbox opened (%s)",
           relay->start_after ? "after an invalidate" : relay->read_token ? "resuming" : "from now");
  bson_destroy(relay->start_after);
  relay->start_after = NULL;
  relay_metrics_gauges(relay);
  return true;
}

void relay_stream_restart(obx_relay_t *relay, relay_stream_cause_t cause, bson_t *start_after, const char *detail) {
  relay_metrics_stream_restart(relay, cause);
  obx_error("change stream restarted (%s: %s): reopening %s and publishing every PENDING event",
            relay_stream_cause_names[cause], detail, start_after ? "after the invalidate" : "from now");
  relay_stream_close(relay);
  relay_window_reset(relay);
  bson_destroy(relay->read_token);
  relay->read_token = NULL;
  bson_destroy(relay->start_after);
  relay->start_after = start_after;
  relay->open_failures = 0;
  relay->sweep_due = true;
  relay->next_stream_open_ms = obx_time_now_ms();
  /* the outbox was dropped: create it (and its indexes) again before writers need it */
  if (cause == RELAY_STREAM_INVALIDATED) relay_ensure_schema(relay);
  relay_metrics_gauges(relay);
}

static void relay_stream_failed(obx_relay_t *relay, const bson_error_t *berr, const bson_t *reply) {
  obx_err_t err = OBX_ERR_INIT;
  obx_err_from_bson(&err, berr, reply);
  relay_stream_close(relay);
  switch (berr->code) {
  case RELAY_HISTORY_LOST: relay_stream_restart(relay, RELAY_STREAM_HISTORY_LOST, NULL, err.msg); return;
  case RELAY_FATAL_ERROR: relay_stream_restart(relay, RELAY_STREAM_FATAL, NULL, err.msg); return;
  case RELAY_INVALID_RESUME_TOKEN: relay_stream_restart(relay, RELAY_STREAM_INVALID_TOKEN, NULL, err.msg); return;
  default: break;
  }
  if (++relay->open_failures >= RELAY_STREAM_REOPEN_LIMIT && (relay->read_token || relay->start_after)) {
    char detail[400];
    snprintf(detail, sizeof detail, "%d failures in a row, the last: %s", relay->open_failures, err.msg);
    relay_stream_restart(relay, RELAY_STREAM_REOPEN_FAILED, NULL, detail);
    relay->next_stream_open_ms = obx_time_now_ms() + RELAY_STREAM_RETRY_MS;
    return;
  }
  obx_warn("change stream: %s (reopening)", err.msg);
  relay->next_stream_open_ms = obx_time_now_ms() + RELAY_STREAM_RETRY_MS;
  relay_metrics_gauges(relay);
}

static void relay_stream_handle(obx_relay_t *relay, const bson_t *change) {
  bson_iter_t it, doc_it;
  bson_t *token = NULL;
  int64_t cluster_s = obx_time_now_ms() / 1000;
  uint32_t len;
  const uint8_t *data;

  if (bson_iter_init_find(&it, change, "_id") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    bson_iter_document(&it, &len, &data);
    token = bson_new_from_data(data, len);
  }
  if (!token) return; /* the server always sends one; without it the change cannot be resumed from */
  if (bson_iter_init_find(&it, change, "operationType") && BSON_ITER_HOLDS_UTF8(&it) &&
      strcmp(bson_iter_utf8(&it, NULL), "invalidate") == 0) {
    relay_stream_restart(relay, RELAY_STREAM_INVALIDATED, token, "the outbox collection was dropped or renamed");
    return;
  }
  bson_destroy(relay->read_token);
  relay->read_token = bson_copy(token);
  if (bson_iter_init_find(&it, change, "clusterTime") && BSON_ITER_HOLDS_TIMESTAMP(&it)) {
    uint32_t t, i;
    bson_iter_timestamp(&it, &t, &i);
    cluster_s = t;
  }

  bson_t doc;
  bool pending = false;
  if (bson_iter_init_find(&it, change, "fullDocument") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    bson_iter_document(&it, &len, &data);
    if (bson_init_static(&doc, data, len) && bson_iter_init_find(&doc_it, &doc, "status") &&
        BSON_ITER_HOLDS_UTF8(&doc_it) && strcmp(bson_iter_utf8(&doc_it, NULL), "PENDING") == 0 &&
        bson_iter_init_find(&doc_it, &doc, "_id"))
      /* any _id type: published or FAILED, never skipped; one without a bucket is published by
       * the relay of the bucket its key falls in (every relay's stream sees it) */
      pending = relay_doc_mine(relay, &doc) && !relay_doc_inflight(relay, &doc, false);
  }
  if (!pending) {
    relay_window_push(relay, token, cluster_s, SLOT_DONE);
    return;
  }
  obx_relay_msg_t *msg = calloc(1, sizeof *msg);
  if (!msg) abort();
  msg->from = RELAY_FROM_STREAM;
  msg->as_inserted = bson_iter_init_find(&it, change, "operationType") && BSON_ITER_HOLDS_UTF8(&it) &&
                     strcmp(bson_iter_utf8(&it, NULL), "insert") == 0;
  msg->seq = relay_window_push(relay, token, cluster_s, SLOT_INFLIGHT);
  relay_keys_submit(relay, &doc, msg);
}

bool relay_stream_step(obx_relay_t *relay) {
  if (!relay->stream) {
    if (obx_time_now_ms() < relay->next_stream_open_ms) return false;
    if (!relay_stream_open(relay)) return false;
  }
  if (relay->sweep_due) {
    /* after a restart from now: the stream is open, so what is committed from here on is its */
    relay->sweep_due = false;
    if (!relay_sweep_all(relay) && relay->leader && !relay->stopping) relay->sweep_due = true;
    return false;
  }
  int read = 0;
  while (read < RELAY_STREAM_READS_PER_STEP && !relay->stopping && relay->stream) {
    if (relay_pending(relay) >= relay->conf->relay_max_inflight || relay_window_full(&relay->window)) break;
    reader_item_t *item = reader_take(relay->reader);
    if (!item) break;
    if (item->kind == ITEM_CHANGE) {
      relay->caught_up = false;
      relay->open_failures = 0;
      relay_stream_handle(relay, item->doc);
      read++;
      relay_serve(relay, 0, false); /* may step down, closing the stream */
      if (item->at_head && relay->stream) {
        relay->caught_up = true;
      }
    } else if (item->kind == ITEM_ERROR) {
      relay_stream_failed(relay, &item->berr, item->doc);
    } else {
      const bson_t *pbrt = item->doc;
      if (pbrt && (!relay->read_token || !bson_equal(pbrt, relay->read_token))) {
        bson_destroy(relay->read_token);
        relay->read_token = bson_copy(pbrt);
        relay_window_push(relay, bson_copy(pbrt), item->read_ms / 1000, SLOT_DONE);
      }
      relay->caught_up = true;
      relay->open_failures = 0;
    }
    item_free(item);
  }
  if (relay->stream) reader_grant(relay);
  return read > 0;
}
