/* parking.c - a parked key handed on: the head finished, the next BLOCKED event goes
 *
 * DESIGN: owns the release of a parked key after its head finished (worker_release_if_head): one
 * transaction per step moves the head to the oldest BLOCKED event (or unparks the key), then the
 * new head is sent to the work queue; a stored BLOCKED entry that no longer decodes goes to the
 * DLQ (class malformed) instead of holding its key. The steps are serialised per key in MongoDB
 * across worker processes (obx_inbox.h). Never runs an event, and never parks a key (the
 * lifecycle's outcome and DEAD transactions do). */
#include <stdio.h>
#include <string.h>

#include "obx/obx_event.h"
#include "obx/obx_inbox.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "worker_int.h"

/* One release step of a key after its head `done` finished, in a transaction: the head moves
 * to the oldest BLOCKED event (obx_inbox_move_head, the per-key lock), or the key is unparked
 * when none is left. Every step, every BLOCKED store (obx_inbox_hold_key) and every unpark
 * writes the parked_keys document, so concurrent ones in other worker processes conflict and
 * run again: of two processes that finished the same head only one moves it. */
typedef struct {
  obx_worker_t *w;
  const char *key;
  const char *done;
  bool may_resend;  /* done's message came back from the broker (the process that took the step
                     * stopped), or this process retries its own step */
  bson_t next;   /* inbox entry of the new head, to send to the work queue */
  bool send;     /* next holds an event to send */
  bool unparked;
} step_t;

static bool step_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  step_t *s = ctx;
  obx_worker_t *w = s->w;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  bson_t parked = BSON_INITIALIZER;
  bool found = false, ok = false;
  s->send = s->unparked = false;
  bson_reinit(&s->next);
  if (!obx_inbox_key_get(client, w->db, session, w->consumer, s->key, &parked, &found, err)) goto done;
  ok = true;
  if (!found) goto done;
  const char *head = obx_mongo_doc_str(&parked, "headEventId"), *released_by = obx_mongo_doc_str(&parked, "releasedBy");
  if (!head || strcmp(head, s->done) != 0) {
    /* Moved on already. When this head moved it, the new head is not recorded as sent and this
     * is the broker's redelivery of the head's message (the process that moved it stopped
     * before sending), send it again. */
    bool entry = false;
    bson_iter_t it;
    bool sent = bson_iter_init_find(&it, &parked, "sent") && BSON_ITER_HOLDS_BOOL(&it) && bson_iter_bool(&it);
    if (s->may_resend && head && released_by && strcmp(released_by, s->done) == 0 && !sent) {
      ok = obx_inbox_get(client, w->db, session, w->consumer, head, &s->next, &entry, err);
      const char *status = entry ? obx_mongo_doc_str(&s->next, "status") : NULL;
      s->send = ok && status && strcmp(status, obx_inbox_status_name(OBX_INBOX_BLOCKED)) == 0;
    }
    goto done;
  }
  ok = obx_inbox_next_blocked(client, w->db, session, w->consumer, s->key, &s->next, &found, err);
  if (ok && found) {
    const char *next = obx_mongo_doc_str(&s->next, "_id.eventId");
    bool moved = false;
    ok = next && obx_inbox_move_head(client, w->db, session, w->consumer, s->key, s->done, next, &moved, err);
    s->send = ok && moved;
  } else if (ok) {
    ok = obx_inbox_unpark_key(client, w->db, session, w->consumer, s->key, err);
    s->unparked = ok;
  }
done:
  bson_destroy(&parked);
  return ok;
}

/* The raw form of a stored entry that no longer decodes, for the DLQ: its headers, key and
 * payload (as relaxed extended JSON) exactly as stored. */
static void msg_from_entry_raw(obx_envelope_t *msg, const bson_t *doc) {
  obx_ce_header_t headers[OBX_ENVELOPE_MAX_HEADERS];
  int n = 0;
  bson_iter_t it, child;
  if (bson_iter_init_find(&it, doc, "headers") && BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &child))
    while (bson_iter_next(&child) && n < OBX_ENVELOPE_MAX_HEADERS) {
      if (!BSON_ITER_HOLDS_UTF8(&child)) continue;
      uint32_t len;
      headers[n].name = bson_iter_key(&child);
      headers[n].value = bson_iter_utf8(&child, &len);
      headers[n++].len = len;
    }
  const char *key = obx_mongo_doc_str(doc, "partitionKey");
  char *json = NULL;
  size_t json_len = 0;
  if (bson_iter_init_find(&it, doc, "payload")) {
    bson_t wrap = BSON_INITIALIZER;
    bson_append_iter(&wrap, "payload", -1, &it);
    json = bson_as_relaxed_extended_json(&wrap, &json_len);
    bson_destroy(&wrap);
  }
  obx_envelope_from_record(msg, obx_mongo_doc_str(doc, "_id.eventId"), key, key ? strlen(key) : 0, json, json_len,
                             headers, n);
  bson_free(json);
}

/* A stored BLOCKED entry that no longer decodes cannot hold its key forever: its raw form goes to
 * the DLQ (class malformed) and the entry says DEAD; the release step then goes on past it. */
static bool dead_letter_entry(obx_worker_t *w, mongoc_client_t *client, const bson_t *doc, const char *id,
                              const char *key, const obx_err_t *cause, obx_err_t *err) {
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  msg_from_entry_raw(&msg, doc);
  char why[700];
  snprintf(why, sizeof why, "blocked entry of key %s does not decode: %s", key, cause->msg);
  event_t e = {.w = w, .source = WORKER_SOURCE_WORK, .msg = &msg, .client = client};
  obx_event_init(&e.ev);
  worker_outcome_t outcome = worker_dead_letter(&e, "malformed", why, false);
  obx_event_cleanup(&e.ev);
  bool ok = outcome == WORKER_DEAD &&
            obx_inbox_set_status(client, w->db, NULL, w->consumer, id, OBX_INBOX_DEAD, -1, msg.reason, NULL, err);
  if (outcome != WORKER_DEAD) obx_err_set(err, OBX_ERR_AMQP, 0, true, "the DLQ cannot be reached");
  obx_envelope_cleanup(&msg);
  return ok;
}

/* After the head `done` of a parked key finished: hands the head on to the next BLOCKED event
 * and sends it to the work queue, where any worker process runs it and, when it finishes, takes
 * the next step; so BLOCKED events run one at a time in seq order. */
static bool release_key(obx_worker_t *w, mongoc_client_t *client, const char *key, const char *done, bool may_resend,
                        obx_err_t *err) {
  char cur[OBX_UUID_LEN + 1];
  snprintf(cur, sizeof cur, "%s", done);
  for (;;) {
    step_t s = {.w = w, .key = key, .done = cur, .may_resend = may_resend};
    bson_init(&s.next);
    if (!obx_mongo_transaction(w->mongo, step_txn, &s, err)) {
      bson_destroy(&s.next);
      obx_err_prefix(err, "releasing key %s", key);
      return false;
    }
    if (s.unparked) obx_info("key %s released", key);
    if (!s.send) {
      bson_destroy(&s.next);
      return true;
    }
    obx_event_t ev;
    obx_event_init(&ev);
    obx_envelope_t msg;
    obx_envelope_init(&msg);
    bool ok = true, past = false;
    const char *next = obx_mongo_doc_str(&s.next, "_id.eventId");
    snprintf(cur, sizeof cur, "%s", next ? next : "");
    obx_err_t derr = OBX_ERR_INIT;
    if (!obx_inbox_entry_event(&s.next, &ev, &derr) || !obx_envelope_from_event(&msg, &ev, &derr)) {
      ok = dead_letter_entry(w, client, &s.next, cur, key, &derr, err);
      past = ok;
    } else {
      obx_log_event(OBX_LOG_INFO, ev.id, ev.correlation_id, "key %s: next in order after %s", key, done);
      ok = worker_publish(w, &msg, PUBLISH_WORK, err) == STEP_OK;
      /* Not recorded: a redelivered copy of `done` sends it once more (at least once). */
      obx_err_t merr = OBX_ERR_INIT;
      if (ok && !obx_inbox_mark_sent(client, w->db, NULL, w->consumer, key, cur, &merr))
        obx_log_event(OBX_LOG_WARN, ev.id, ev.correlation_id, "recording the send failed: %s", merr.msg);
    }
    obx_envelope_cleanup(&msg);
    obx_event_cleanup(&ev);
    bson_destroy(&s.next);
    if (!past) return ok;
  }
}

typedef struct {
  event_t *e;
  bool may_resend;
} release_t;

/* When the finished event is, or was, the head of its parked key, takes the release step. */
static bool release_step(void *ctx, obx_err_t *err) {
  release_t *r = ctx;
  event_t *e = r->e;
  bool parked = false;
  if (!obx_inbox_key_parked(e->client, e->w->db, NULL, e->w->consumer, e->ev.partition_key, &parked, NULL, err))
    return false;
  if (!parked) return true;
  if (release_key(e->w, e->client, e->ev.partition_key, e->ev.id, r->may_resend, err)) return true;
  r->may_resend = true; /* a hand-over this process moved but did not send is its own to send */
  return false;
}

/* After an event from the work queue finished: hands its key on when it is the head. False when
 * the step cannot be taken within the bounds: the event's message is then given back to the
 * broker (WORKER_INFRA), comes back redelivered as a finished duplicate, and takes the step. */
bool worker_release_if_head(event_t *e) {
  release_t r = {.e = e, .may_resend = e->msg->redelivered};
  obx_err_t err = OBX_ERR_INIT;
  if (worker_retry_step(e->w, "releasing the key", e->ev.id, release_step, &r, 0, false, &err) == STEP_OK) return true;
  obx_warn("key %s is handed on when the message of %s comes back", e->ev.partition_key, e->ev.id);
  return false;
}
