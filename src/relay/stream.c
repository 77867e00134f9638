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

#include <stdlib.h>
#include <string.h>

#include "obx/obx_log.h"

#define RELAY_STREAM_READS_PER_STEP 256
#define RELAY_HISTORY_LOST 286
#define RELAY_FATAL_ERROR 280
#define RELAY_INVALID_RESUME_TOKEN 260
#define RELAY_STREAM_REOPEN_LIMIT 10
#define RELAY_STREAM_RETRY_MS 1000
/* An idle getMore blocks the relay thread this long; delivery reports that arrive meanwhile wait
 * for it, so it bounds the ack latency added at low load (at the cost of idle getMores). */
#define RELAY_STREAM_AWAIT_MS 20
#define RELAY_STREAM_HOLD_MS 50
/* A read that waited this long was answered by an awaiting getMore: the stream is at its head,
 * so the next read would block for RELAY_STREAM_AWAIT_MS while the reports of what was just
 * produced wait. The step ends as caught up instead (a buffered change or a getMore over a
 * backlog returns in well under this on a LAN). */
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

/* ---- the stream ------------------------------------------------------------------------- */

void relay_stream_close(obx_relay_t *relay) {
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
  relay->stream_opened_ms = obx_time_now_ms();
  relay->stream = mongoc_collection_watch(relay->outbox, pipeline, opts);
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
  /* Caught up with events in flight: wait for their reports instead of blocking in an idle
   * getMore (which would hold them up to RELAY_STREAM_AWAIT_MS), but not for long. */
  if (relay->caught_up && relay_pending(relay) > 0 && obx_time_now_ms() - relay->caught_up_ms < RELAY_STREAM_HOLD_MS)
    return false;
  int read = 0;
  while (read < RELAY_STREAM_READS_PER_STEP && !relay->stopping && relay->stream) {
    if (relay_pending(relay) >= relay->conf->relay_max_inflight || relay_window_full(&relay->window)) break;
    const bson_t *change;
    int64_t t0 = bson_get_monotonic_time();
    if (mongoc_change_stream_next(relay->stream, &change)) {
      bool at_head = bson_get_monotonic_time() - t0 >= RELAY_STREAM_HEAD_US;
      relay->caught_up = false;
      relay->open_failures = 0;
      relay_stream_handle(relay, change);
      read++;
      relay_serve(relay, 0, false);
      if (at_head && relay->stream) {
        relay->caught_up = true;
        relay->caught_up_ms = obx_time_now_ms();
        break;
      }
      continue;
    }
    bson_error_t berr;
    const bson_t *reply = NULL;
    if (mongoc_change_stream_error_document(relay->stream, &berr, &reply)) {
      relay_stream_failed(relay, &berr, reply);
      break;
    }
    const bson_t *pbrt = mongoc_change_stream_get_resume_token(relay->stream);
    if (pbrt && (!relay->read_token || !bson_equal(pbrt, relay->read_token))) {
      bson_destroy(relay->read_token);
      relay->read_token = bson_copy(pbrt);
      relay_window_push(relay, bson_copy(pbrt), obx_time_now_ms() / 1000, SLOT_DONE);
    }
    relay->caught_up = true;
    relay->caught_up_ms = obx_time_now_ms();
    relay->open_failures = 0;
    break;
  }
  return read > 0;
}
