/* retrysweep.c - retries whose tier message did not come back: republished to the work queue
 *
 * DESIGN: a retry's tier copy is due back in the work queue at retryDueAt (the confirm of its
 * tier publish + the tier's delay, obx_inbox_retry_sent). RabbitMQ can hold it far longer: after
 * a restart 3.10 brings a vhost's quorum queues back before its exchanges, and a tier that
 * dead-letters an expired message then tries again only after
 * dead_letter_worker_publisher_confirm_timeout (180 s by default); a tier purged or deleted by
 * hand loses it. Every few seconds the work-queue thread (workq.c) looks for the consumer's
 * sent retries past retryDueAt + WORKER_RETRY_GRACE (index inbox_consumer_retry_due), takes
 * each by compare-and-set on (RETRYING, attempts, the due time it read) so that of several
 * replicas sweeping at once one republishes it, moves its due time on (the grace, doubled per
 * sweep of the same attempt, so a slow work queue does not fill with copies), and publishes the
 * stored event at that attempt to the work queue. Whichever copy of the attempt comes first
 * takes the entry (obx_inbox_take on RETRYING and the attempt) and runs it; the other finds the
 * entry moved on and is skipped, so the attempt runs once. Never runs an event, never writes a
 * status. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_event.h"
#include "obx/obx_inbox.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "worker_int.h"

#define SWEEP_BATCH 100   /* retries republished per sweep at most */
#define SWEEP_DOUBLINGS 6 /* the grace doubles per sweep of one attempt, up to 64 times */

typedef struct {
  obx_worker_t *w;
  mongoc_client_t *client;
  int64_t now;
} sweep_t;

static int64_t doc_date(const bson_t *doc, const char *field) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, field) && BSON_ITER_HOLDS_DATE_TIME(&it) ? bson_iter_date_time(&it) : 0;
}

static int doc_int(const bson_t *doc, const char *field) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, field) && BSON_ITER_HOLDS_INT(&it) ? (int)bson_iter_as_int64(&it) : 0;
}

/* One overdue retry: taken (compare-and-set), then its stored event at the recorded attempt to
 * the work queue. A publish that fails leaves it to the next sweep, past the new due time. */
static bool sweep_one(void *ctx, const bson_t *doc) {
  sweep_t *s = ctx;
  obx_worker_t *w = s->w;
  const char *id = obx_mongo_doc_str(doc, "_id.eventId");
  int attempts = doc_int(doc, "attempts"), swept = doc_int(doc, "retrySwept");
  int64_t due = doc_date(doc, "retryDueAt"), grace = w->conf->worker_retry_grace;
  if (!id || attempts < 1) return true;
  int64_t next = s->now + (grace << (swept < SWEEP_DOUBLINGS ? swept : SWEEP_DOUBLINGS));
  bool taken = false;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_retry_sweep_take(s->client, w->db, w->consumer, id, attempts, due, next, &taken, &err)) {
    obx_log_event(OBX_LOG_WARN, id, NULL, "retry sweep: taking the overdue attempt %d failed: %s", attempts, err.msg);
    return false; /* MongoDB is not answering: the next sweep */
  }
  if (!taken) return true; /* a peer swept it, or it moved on */
  obx_event_t ev;
  obx_event_init(&ev);
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  int ntiers = obx_ladder_ntiers(w->ladder), tier = attempts - 1 < ntiers ? attempts - 1 : ntiers - 1;
  char due_at[32];
  obx_time_format_rfc3339(due, due_at);
  const char *last_error = obx_mongo_doc_str(doc, "lastError");
  if (!obx_inbox_entry_event(doc, &ev, &err) || !obx_envelope_from_event(&msg, &ev, &err)) {
    obx_log_event(OBX_LOG_ERROR, id, NULL, "retry sweep: attempt %d is overdue and its stored event does not decode "
                  "(%s); swept again at the next due time", attempts, err.msg);
  } else {
    msg.attempt = attempts - 1; /* the copy of the recorded attempt, as its tier would have sent it */
    const char *replay = obx_mongo_doc_str(doc, "retryReplay");
    if (replay) msg.replay_id = strdup(replay);
    obx_envelope_fail(&msg, "transient", last_error ? last_error : "", s->now);
    if (!obx_ladder_publish_work(w->ladder, &msg, &err)) {
      obx_log_event(OBX_LOG_WARN, id, ev.correlation_id, "retry sweep: republishing attempt %d failed (%s); "
                    "swept again at the next due time", attempts, err.msg);
    } else {
      worker_count_swept(w, tier);
      obx_log_event(OBX_LOG_WARN, id, ev.correlation_id,
                    "retry sweep: attempt %d's message of retry tier %d (%s) was due back at %s and has not run it "
                    "%" PRId64 " ms later (WORKER_RETRY_GRACE %" PRId64 " ms): republished to the work queue; "
                    "whichever copy comes first runs it, the other is skipped",
                    attempts, tier + 1, obx_ladder_tier_queue(w->ladder, tier), due_at, s->now - due, grace);
    }
  }
  obx_envelope_cleanup(&msg);
  obx_event_cleanup(&ev);
  return true;
}

void worker_retry_sweep(obx_worker_t *w) {
  if (obx_ladder_ntiers(w->ladder) == 0) return;
  sweep_t s = {.w = w, .client = obx_mongo_pop(w->mongo), .now = obx_time_now_ms()};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_retry_overdue(s.client, w->db, w->consumer, s.now - w->conf->worker_retry_grace, SWEEP_BATCH,
                               sweep_one, &s, &err))
    obx_warn("retry sweep: reading the overdue retries failed: %s", err.msg);
  obx_mongo_push(w->mongo, s.client);
}
