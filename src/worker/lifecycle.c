/* lifecycle.c - one event through its states: decode, claim, admit, run, record, settle
 *
 * DESIGN: see include/obx/obx_worker.h; the states and the transition table, with each move's
 * test, are docs/worker-lifecycle.md. Owns the run of one event
 * on a runner thread (worker_run_job, worker_handle): decode the envelope (malformed: the DLQ),
 * claim its inbox entry (a live peer's claim is never run here; an expired one is taken over),
 * admit it behind its parked key (BLOCKED), look up and run its pipeline once (a run stopped at
 * an http-request call waits on the IO thread, io.c, the event kept in its job, and goes on in
 * worker_handle_resume on whichever runner is free when the call ended), record the
 * outcome (only the recording is retried; DONE and SKIPPED grouped with other runs' in one
 * transaction by the recorder, batch.c, whose batch function is worker_record_batch; a fresh
 * Kafka record's claim grouped by the claimer, worker_claim_batch), then a retry tier (intent
 * before publish) or the DLQ
 * (worker_dead_letter: the one way out of every failure that is not a retry). Never touches a
 * source's consumer, offsets or acks (kafka.c, workq.c, sink.c settle the outcome it hands
 * back) and never moves a parked key's head (parking.c). */
#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_event.h"
#include "obx/obx_health.h"
#include "obx/obx_inbox.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_schema.h"
#include "obx/obx_trace.h"
#include "worker_int.h"

/* ---- states ------------------------------------------------------------------------------
 * The transition table, with each move's action, bound and test, is docs/worker-lifecycle.md;
 * moves[] is its code form, checked on every move. */

static const char *const state_names[] = {
  "queued", "decoded", "claimed", "running", "waiting", "recording", "releasing", "waiting_gap", "done",
  "skipped", "duplicate", "blocked", "retrying", "dead", "malformed", "given_back", "lost",
};
_Static_assert(sizeof state_names / sizeof state_names[0] == WORKER_NSTATES, "a name per state");

#define TO(s) (1u << (s))
/* From each state on the way, where an event may go; an end state goes nowhere. */
static const unsigned moves[WORKER_NSTATES] = {
  [WORKER_QUEUED] = TO(WORKER_DECODED) | TO(WORKER_DEAD) | TO(WORKER_MALFORMED) | TO(WORKER_INFRA) |
                    TO(WORKER_WAITING_GAP),
  [WORKER_WAITING_GAP] = TO(WORKER_QUEUED) | TO(WORKER_INFRA),
  [WORKER_DECODED] = TO(WORKER_CLAIMED) | TO(WORKER_BLOCKED) | TO(WORKER_DUPLICATE) | TO(WORKER_RELEASING) |
                     TO(WORKER_DEAD) | TO(WORKER_INFRA),
  [WORKER_CLAIMED] = TO(WORKER_RUNNING),
  [WORKER_RUNNING] = TO(WORKER_WAITING) | TO(WORKER_RECORDING) | TO(WORKER_DEAD) | TO(WORKER_LOST) | TO(WORKER_INFRA),
  [WORKER_WAITING] = TO(WORKER_RUNNING),
  [WORKER_RECORDING] = TO(WORKER_RELEASING) | TO(WORKER_DONE) | TO(WORKER_SKIPPED) | TO(WORKER_RETRYING) |
                       TO(WORKER_DEAD) | TO(WORKER_LOST) | TO(WORKER_INFRA),
  [WORKER_RELEASING] = TO(WORKER_DONE) | TO(WORKER_SKIPPED) | TO(WORKER_DUPLICATE) | TO(WORKER_INFRA),
};
#undef TO

const char *worker_state_name(worker_state_t state) {
  assert((unsigned)state < WORKER_NSTATES);
  return state_names[state];
}

worker_state_t worker_state_move(const char *id, worker_state_t from, worker_state_t to) {
  assert((unsigned)from < WORKER_NSTATES && (unsigned)to < WORKER_NSTATES);
  if (!(moves[from] & (1u << to))) {
    fprintf(stderr, "%s:%d: event %s: no move from %s to %s in the lifecycle table\n", __FILE__, __LINE__,
            id ? id : "?", state_names[from], state_names[to]);
    abort();
  }
  obx_log_event(OBX_LOG_DEBUG, id, NULL, "%s -> %s", state_names[from], state_names[to]);
  worker_count_move(from, to);
  return to;
}

static worker_outcome_t worker_handle(event_t *e, int32_t partition, int64_t offset);
static worker_outcome_t worker_handle_resume(event_t *e, CURLcode rc);

/* An event_t (it holds bson_t values: 128-byte aligned, zeroed). */
static event_t *event_new(void) {
  size_t bytes = (sizeof(event_t) + _Alignof(event_t) - 1) / _Alignof(event_t) * _Alignof(event_t);
  event_t *e = aligned_alloc(_Alignof(event_t), bytes);
  assert(e);
  memset(e, 0, bytes);
  return e;
}

/* The runners' callback (sched.c): one event end to end, then its outcome back to its source.
 * Nothing runs before the worker's collections and indexes exist (the schema guard); an HTTP
 * event is answered 503 meanwhile (the sender delivers again). worker_handle bounds its own
 * retries: it returns WORKER_INFRA only when the event could be put nowhere (or the worker
 * stops), and the source then gives it back. When the event's pipeline stops at an http-request
 * call, the job goes to the IO thread (io.c) with the event kept in it, and this runner is free;
 * the call's end brings the job back here (job->event set), where the run goes on. */
bool worker_run_job(void *ctx, job_t *job) {
  obx_worker_t *w = ctx;
  event_t *e = job->event;
  if (e) {
    job->outcome = worker_handle_resume(e, job->call_result);
  } else {
    job->outcome = WORKER_INFRA;
    while (!obx_schema_guard_wait(w->schema, 100)) {
      if (atomic_load(&w->stop) || job->source == WORKER_SOURCE_HTTP) { /* HTTP: 503, sent again */
        worker_state_move(job->msg.message_id, worker_job_state(job), WORKER_INFRA);
        goto done;
      }
      obx_health_stamp("waiting for the schema");
    }
    if (!worker_keyseq_admit(w, job)) return false; /* deferred behind its key's missing keySeq */
    size_t klen;
    const char *k = obx_envelope_partition_key(&job->msg, &klen);
    e = job->event = event_new();
    *e = (event_t){.w = w, .source = job->source, .msg = &job->msg, .key = strndup(k, klen)};
    assert(e->key);
    klen = strlen(e->key);
    if (job->source == WORKER_SOURCE_KAFKA && worker_lost_key(w, e->key, klen, job->generation, false))
      worker_wait_key_elsewhere(w, e->key);
    job->outcome = job->source == WORKER_SOURCE_KAFKA ? worker_handle(e, job->partition, job->offset)
                                                      : worker_handle(e, -1, -1);
  }
  if (job->outcome == WORKER_WAITING) {
    job->call = obx_pipeline_run_waiting(e->run);
    worker_io_submit(w->io, job); /* the job is the IO thread's now */
    return false;
  }
  if (job->outcome == WORKER_DECODED || job->outcome == WORKER_RECORDING) { /* a batch write's now */
    /* a run whose outcome is being written frees its in-flight slot: the intake may go on */
    if (job->outcome == WORKER_RECORDING && worker_sched_recording(w->sched, job, w->max_inflight) &&
        job->source == WORKER_SOURCE_KAFKA)
      worker_kafka_wake(w);
    worker_batcher_submit(job->outcome == WORKER_DECODED ? w->claimer : w->recorder, job);
    return false;
  }
  if (job->source == WORKER_SOURCE_KAFKA && job->outcome == WORKER_LOST)
    worker_lost_key(w, e->key, strlen(e->key), job->generation, true);
  free(e->key);
  free(e);
  job->event = NULL;
  worker_count_outcome(w, job->outcome);
  worker_keyseq_settled(w, job, job->outcome);
done:
  worker_job_complete(w, job);
  return true;
}

/* ---- the event's lifecycle ---------------------------------------------------------------- */

/* Moves the event to `next` (worker_state_move); returns next. */
static worker_state_t event_move(event_t *e, worker_state_t next) {
  e->state = worker_state_move(e->ev.id[0] ? e->ev.id : e->msg->message_id, e->state, next);
  return next;
}

/* The stored entry of a DEAD event: status, attempts, the reason, and its key parked with it as
 * the head (so later events of the key wait, as behind a failed pipeline run). */
typedef struct {
  obx_worker_t *w;
  const obx_event_t *ev;
  const obx_inbox_cas_t *cas;
  int attempts;
  const char *reason;
} dead_txn_t;

static bool dead_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  dead_txn_t *t = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  return obx_inbox_set_status_owned(client, t->w->db, session, t->w->consumer, t->ev->id, t->cas, OBX_INBOX_DEAD,
                                    t->attempts, t->reason, NULL, err) &&
         obx_inbox_park_key(client, t->w->db, session, t->w->consumer, t->ev->partition_key, t->ev->id,
                            obx_inbox_status_name(OBX_INBOX_DEAD), err);
}

static bool dead_step(void *ctx, obx_err_t *err) {
  dead_txn_t *t = ctx;
  return obx_mongo_transaction(t->w->mongo, dead_txn, t, err);
}

/* Gives the envelope a message id the DLQ can carry (the event id; a generated one when the
 * record's own is not a valid AMQP message-id, which the reason then says). */
static void ensure_message_id(obx_envelope_t *msg, const obx_event_t *ev) {
  if (!msg->message_id) {
    const char *id = ev && ev->id[0] ? ev->id : obx_envelope_header(msg, "ce_id");
    if (id) msg->message_id = strdup(id);
  }
  if (!msg->message_id || strlen(msg->message_id) > 255 ||
      !bson_utf8_validate(msg->message_id, strlen(msg->message_id), false)) {
    char gen[OBX_UUID_LEN + 1];
    obx_uuid7(gen);
    free(msg->message_id);
    msg->message_id = strdup(gen);
  }
}

/* Ends an event in the DLQ: the one way out of every failure that is not a retry. Records the
 * failed attempt (class, cause) on the envelope, its reason with what the publish could not carry
 * as it is, publishes it (confirmed, bounded), then, when the event has an inbox entry, marks it
 * DEAD with the reason and parks its key. `attempted`: the failure was already recorded on the
 * envelope (a pipeline run's). When the DLQ cannot be reached within the bounds the inbox entry
 * holds the event (DEAD, the reason says so, replayable); without one either, the event is given
 * back to its source (WORKER_INFRA). */
worker_outcome_t worker_dead_letter(event_t *e, const char *failure_class, const char *cause, bool attempted) {
  obx_worker_t *w = e->w;
  obx_envelope_t *msg = e->msg;
  const obx_event_t *ev = e->ev.id[0] ? &e->ev : NULL;
  if (!attempted) obx_envelope_fail(msg, failure_class, cause, obx_time_now_ms());
  free(msg->failure_class);
  msg->failure_class = strdup(failure_class);
  char original[OBX_LADDER_MAX_NAME + 80] = "";
  const char *ce_id = obx_envelope_header(msg, "ce_id");
  ensure_message_id(msg, ev);
  if (ce_id && strcmp(ce_id, msg->message_id) != 0)
    snprintf(original, sizeof original, "; message id %s generated (the record's ce_id is %zu bytes%s)",
             msg->message_id, strlen(ce_id), bson_utf8_validate(ce_id, strlen(ce_id), false) ? "" : ", not UTF-8");
  char notes[512], reason[2000];
  obx_ladder_carry_notes(msg, notes, sizeof notes);
  snprintf(reason, sizeof reason, "%s%s%s%s", cause, original, notes[0] ? "; " : "", notes);
  free(msg->reason);
  msg->reason = strdup(reason);
  obx_log_event(OBX_LOG_WARN, msg->message_id, ev ? ev->correlation_id : NULL, "dead-lettered (%s): %s",
                failure_class, reason);

  obx_err_t err = OBX_ERR_INIT;
  step_result_t published = worker_publish(w, msg, PUBLISH_DLQ, &err);
  if (published == STEP_OK) worker_count_dlq(w, failure_class);
  if (!e->claimed) return published == STEP_OK ? WORKER_DEAD : WORKER_INFRA;
  char stored[2400];
  snprintf(stored, sizeof stored, "%s%s%s", reason, published == STEP_OK ? "" : "; not in the DLQ: ",
           published == STEP_OK ? "" : err.msg);
  dead_txn_t t = {.w = w, .ev = &e->ev, .cas = &e->cas, .attempts = msg->attempt, .reason = stored};
  step_result_t recorded = worker_retry_step(w, "recording DEAD", e->ev.id, dead_step, &t, 0, true, &err);
  if (recorded != STEP_OK && published != STEP_OK) return WORKER_INFRA;
  return WORKER_DEAD;
}

/* Points the message's ce_traceparent at the current span (the attempt that failed), so its
 * retry, or a redrive from the DLQ, links to it. */
static void msg_continue_trace(obx_envelope_t *msg) {
  const obx_trace_ctx_t *trace = obx_trace_current();
  if (!trace) return;
  char tp[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(trace, tp);
  int i = 0;
  while (i < msg->nheaders && strcmp(msg->headers[i].name, "ce_traceparent") != 0) i++;
  if (i == OBX_ENVELOPE_MAX_HEADERS) return;
  if (i == msg->nheaders) msg->headers[msg->nheaders++].name = strdup("ce_traceparent");
  free(msg->headers[i].value);
  msg->headers[i].value = strdup(tp);
  msg->headers[i].value_len = strlen(tp);
}

/* The consumer span of one delivery (messaging semconv): a child of the event's traceparent;
 * for a redrive or a replay, whose original trace finished long ago, a new trace with a link to
 * it. A work-queue message at attempt 0 with a history is a redrive (attempts reset, history
 * kept). */
static obx_span_t *consume_span(obx_worker_t *w, worker_source_t source, const obx_envelope_t *msg,
                                const obx_event_t *ev, int32_t partition, int64_t offset) {
  obx_trace_ctx_t origin;
  obx_trace_parse(ev->traceparent, ev->traceparent ? strlen(ev->traceparent) : 0, ev->tracestate,
                  ev->tracestate ? strlen(ev->tracestate) : 0, &origin);
  bool relinked = source == WORKER_SOURCE_WORK && (msg->replay_id || (msg->attempt == 0 && msg->history));
  const char *dest = source == WORKER_SOURCE_KAFKA ? w->conf->kafka_topic
                     : source == WORKER_SOURCE_WORK ? obx_ladder_work_queue(w->ladder) : "http";
  char name[300];
  snprintf(name, sizeof name, "process %s", dest);
  obx_span_t *span = obx_span_start(name, OBX_SPAN_CONSUMER, relinked ? NULL : &origin);
  if (relinked) obx_span_add_link(span, &origin, msg->replay_id ? "replay" : "redrive");
  if (source != WORKER_SOURCE_HTTP)
    obx_span_set_str(span, "messaging.system", source == WORKER_SOURCE_KAFKA ? "kafka" : "rabbitmq");
  obx_span_set_str(span, "messaging.operation.type", "process");
  obx_span_set_str(span, "messaging.operation.name", "process");
  obx_span_set_str(span, "messaging.destination.name", dest);
  obx_span_set_str(span, "messaging.message.id", ev->id);
  obx_span_set_str(span, "messaging.consumer.group.name", w->consumer);
  if (source == WORKER_SOURCE_KAFKA) {
    char p[16];
    snprintf(p, sizeof p, "%d", (int)partition);
    obx_span_set_str(span, "messaging.destination.partition.id", p);
    obx_span_set_int(span, "messaging.kafka.message.offset", offset);
    obx_span_set_str(span, "messaging.kafka.message.key", ev->partition_key);
  }
  obx_span_set_str(span, "outboxd.event.type", ev->event_type);
  obx_span_set_str(span, "outboxd.org_id", ev->org_id);
  obx_span_set_int(span, "outboxd.attempt", msg->attempt + 1);
  return span;
}

/* What the outcome transaction writes. */
typedef struct {
  obx_worker_t *w;
  obx_pipeline_run_t *run;  /* NULL when no pipeline ran */
  const obx_event_t *ev;
  const obx_inbox_cas_t *cas; /* the run's claim (compare-and-set) */
  obx_inbox_status_t status;
  int attempts;
  const char *last_error;
  bool park;                /* park the key with this event as head */
} outcome_txn_t;

static bool outcome_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  outcome_txn_t *t = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  const char *db = t->w->db;
  if (t->run && !obx_pipeline_run_commit(t->run, client, db, session, err)) return false;
  const char *exec_id = t->run ? obx_pipeline_run_execution_id(t->run) : NULL;
  if (!obx_inbox_set_status_owned(client, db, session, t->w->consumer, t->ev->id, t->cas, t->status, t->attempts,
                                  t->last_error, exec_id, err))
    return false;
  if (t->park && !obx_inbox_park_key(client, db, session, t->w->consumer, t->ev->partition_key, t->ev->id,
                                     obx_inbox_status_name(t->status), err))
    return false;
  return true;
}

static bool outcome_step(void *ctx, obx_err_t *err) {
  outcome_txn_t *t = ctx;
  return obx_mongo_transaction(t->w->mongo, outcome_txn, t, err);
}

static bool lookup_step(void *ctx, obx_err_t *err) {
  event_t *e = ctx;
  obx_pipeline_destroy(e->pipeline);
  e->pipeline = NULL;
  return obx_pipeline_cache_find_enabled(e->w->pipelines, e->client, e->w->db, e->ev.org_id, e->trigger, &e->pipeline,
                                         err);
}

/* Records the outcome of a finished run (or of no run). Only the recording is retried: the run's
 * result is kept, so a pipeline that ran is never run again because its recording failed. When
 * the claim is no longer this run's (taken over by a peer after the lease, or moved on) nothing
 * is recorded and the event is the peer's (WORKER_DUPLICATE). When the recording cannot be
 * made, the event is dead-lettered (class terminal for a non-retriable error, infra when the
 * bounds are spent). */
static worker_outcome_t record(event_t *e, outcome_txn_t *t, worker_outcome_t outcome, bool dlq_published) {
  if (e->state != WORKER_RECORDING) event_move(e, WORKER_RECORDING);
  obx_err_t err = OBX_ERR_INIT;
  step_result_t r = worker_retry_step(e->w, "recording the outcome", e->ev.id, outcome_step, t, 0, true, &err);
  if (r == STEP_OK) return outcome;
  if (err.domain == OBX_ERR_CONFLICT) {
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id, "%s; this run's outcome is not recorded", err.msg);
    return WORKER_LOST;
  }
  char cause[700];
  snprintf(cause, sizeof cause, "recording the outcome (%s) failed: %s", obx_inbox_status_name(t->status), err.msg);
  if (dlq_published) { /* the DLQ has it already: only the inbox is left to say DEAD */
    dead_txn_t d = {.w = e->w, .ev = &e->ev, .cas = &e->cas, .attempts = e->msg->attempt, .reason = cause};
    return worker_retry_step(e->w, "recording DEAD", e->ev.id, dead_step, &d, 0, true, &err) == STEP_OK ? WORKER_DEAD
                                                                                                   : outcome;
  }
  return worker_dead_letter(e, r == STEP_FAILED ? "terminal" : "infra", cause, outcome == WORKER_RETRYING);
}

/* The operator replay a tier copy of this run belongs to (recorded with the send, so the retry
 * sweep's copy carries it too), NULL when none. */
static const char *tier_replay(const event_t *e) {
  return e->source == WORKER_SOURCE_WORK ? e->msg->replay_id : NULL;
}

/* A transient failure with attempts left goes up the ladder, intent first: one transaction
 * records the run, RETRYING with the attempt number and the parked key (compare-and-set on the
 * claim); then the confirmed publish to the tier; then retrySent. A copy is therefore never on a
 * tier before its attempt is recorded, so it cannot run early; a copy of an attempt the entry no
 * longer records never runs (obx_inbox_take). When the process stops between the commit and the
 * worker_publish, the next delivery of the event finds the intent unsent past its lease and publishes
 * it (resend_intent). When the tier cannot be reached within the bounds, the DLQ. */
static worker_outcome_t retry(event_t *e, outcome_txn_t *t, int attempt, const char *error) {
  obx_worker_t *w = e->w;
  t->status = OBX_INBOX_RETRYING;
  worker_outcome_t outcome = record(e, t, WORKER_RETRYING, false);
  if (outcome != WORKER_RETRYING) return outcome; /* not this run's any more, or dead-lettered */
  obx_err_t err = OBX_ERR_INIT;
  int tier = attempt - 1;
  if (worker_publish(w, e->msg, tier, &err) != STEP_OK) {
    char cause[700];
    snprintf(cause, sizeof cause, "attempt %d failed (%s) and the retry tier cannot be reached: %s", attempt, error,
             err.msg);
    free(e->msg->reason);
    e->msg->reason = NULL;
    return worker_dead_letter(e, "infra", cause, true); /* DEAD from this run's unsent RETRYING */
  }
  int ntiers = obx_ladder_ntiers(w->ladder);
  worker_count_retry(w, tier < ntiers ? tier : ntiers - 1);
  obx_log_event(OBX_LOG_INFO, e->ev.id, e->ev.correlation_id, "attempt %d failed (transient: %s); retry tier %d",
                attempt, error, tier + 1);
  if (!obx_inbox_retry_sent(e->client, w->db, w->consumer, e->ev.id, attempt,
                            obx_time_now_ms() + obx_ladder_tier_ms(w->ladder, tier), tier_replay(e), &err))
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                  "recording the tier publish failed (%s): the copy runs anyway, a later delivery may send another",
                  err.msg);
  return WORKER_RETRYING;
}

/* Before a failed run goes up the ladder or to the DLQ: is the event still this process's? A
 * process that stalled past its lease (paused, swapped out) finds its claim taken over and
 * sends nothing; the new owner settles the event. When MongoDB cannot say, it goes on (at least
 * once). */
static bool claim_held(event_t *e) {
  bson_t doc = BSON_INITIALIZER;
  bool found = false;
  obx_err_t err = OBX_ERR_INIT;
  bool held = true;
  if (obx_inbox_get(e->client, e->w->db, NULL, e->w->consumer, e->ev.id, &doc, &found, &err) && found) {
    const char *owner = obx_mongo_doc_str(&doc, "owner"), *status = obx_mongo_doc_str(&doc, "status");
    held = owner && strcmp(owner, e->w->owner) == 0 && status &&
           (strcmp(status, obx_inbox_status_name(OBX_INBOX_RECEIVED)) == 0 ||
            strcmp(status, obx_inbox_status_name(OBX_INBOX_PROCESSING)) == 0);
  }
  bson_destroy(&doc);
  if (!held)
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                  "the claim was taken over while the pipeline ran: its failure is not sent on");
  return held;
}

static worker_outcome_t settle_run(event_t *e);

/* Whether the claim renewal (claims.c) found this run's claim lost: taken over by a peer, or its
 * lease passed unrenewed. The run then stops before `step` and records nothing; the owner of the
 * claim settles the event. */
static bool claim_lost(event_t *e, const char *step) {
  if (!worker_claim_lost(e->w, e->ev.id)) return false;
  obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                "the claim was lost before %s: this run stops, its outcome is not recorded", step);
  return true;
}

/* Looks the event's pipeline up and starts its run once. WORKER_WAITING when the run stops at an
 * http-request call (e->run waits; worker_handle_resume goes on), else its settled outcome. */
static worker_outcome_t run_event(event_t *e) {
  obx_worker_t *w = e->w;
  obx_envelope_t *msg = e->msg;
  const obx_event_t *ev = &e->ev;
  obx_err_t err = OBX_ERR_INIT;
  obx_pipeline_trigger_for_event(ev->event_type, e->trigger, sizeof e->trigger);
  event_move(e, WORKER_RUNNING);

  step_result_t looked = worker_retry_step(w, "pipeline lookup", ev->id, lookup_step, e,
                                    e->source == WORKER_SOURCE_HTTP ? 1 : 0, false, &err);
  if (looked == STEP_STOPPED || (looked == STEP_EXHAUSTED && e->source == WORKER_SOURCE_HTTP)) return WORKER_INFRA;
  if (looked != STEP_OK) {
    char cause[600];
    snprintf(cause, sizeof cause, "pipeline lookup failed: %s", err.msg);
    return worker_dead_letter(e, looked == STEP_FAILED ? "terminal" : "infra", cause, false);
  }
  if (e->pipeline) {
    if (claim_lost(e, "the pipeline")) return WORKER_LOST;
    bson_t ctx = BSON_INITIALIZER;
    obx_pipeline_context_from_event(ev, &ctx);
    obx_pipeline_input_t in = {.context = &ctx, .org_id = ev->org_id, .trigger = e->trigger, .event_id = ev->id,
                               .correlation_id = ev->correlation_id, .aggregate_type = ev->aggregate_type,
                               .aggregate_id = ev->aggregate_id, .partition_key = ev->partition_key,
                               .replay_id = e->source == WORKER_SOURCE_WORK ? msg->replay_id : NULL,
                               .attempt = msg->attempt + 1};
    e->run = obx_pipeline_start(e->pipeline, &in, &w->egress); /* the run keeps a copy of the input */
    bson_destroy(&ctx);
    if (obx_pipeline_run_waiting(e->run)) return WORKER_WAITING;
  }
  return settle_run(e);
}

/* Settles the event's finished run (e->run; NULL: no enabled pipeline): recorded, retried on a
 * tier, or in the DLQ. */
static worker_outcome_t settle_run(event_t *e) {
  obx_worker_t *w = e->w;
  obx_envelope_t *msg = e->msg;
  const obx_event_t *ev = &e->ev;
  worker_outcome_t outcome = WORKER_INFRA;
  obx_pipeline_run_t *run = e->run;
  int attempt = msg->attempt + 1;
  outcome_txn_t t = {.w = w, .ev = ev, .cas = &e->cas, .attempts = attempt};
  bool dlq_published = false;
  if (run && claim_lost(e, obx_pipeline_run_waiting(run) ? "its next call" : "recording the run")) {
    outcome = WORKER_LOST;
    goto done;
  }
  if (!run) {
    t.status = OBX_INBOX_SKIPPED;
    t.attempts = msg->attempt;
    outcome = WORKER_SKIPPED;
  } else {
    t.run = run;
    worker_count_run(w, obx_pipeline_run_status(run));
    switch (obx_pipeline_run_status(run)) {
    case OBX_PIPELINE_SUCCEEDED:
      t.status = OBX_INBOX_DONE;
      outcome = WORKER_DONE;
      break;
    case OBX_PIPELINE_SKIPPED:
      t.status = OBX_INBOX_SKIPPED;
      outcome = WORKER_SKIPPED;
      break;
    case OBX_PIPELINE_FAILED: {
      const obx_err_t *rerr = obx_pipeline_run_error(run);
      bool transient = obx_pipeline_run_failure_class(run) == OBX_FAILURE_TRANSIENT;
      t.last_error = rerr->msg;
      t.park = true;
      msg_continue_trace(msg);
      obx_envelope_fail(msg, transient ? "transient" : "terminal", rerr->msg, obx_time_now_ms());
      if (transient && attempt < w->max_attempts) {
        outcome = retry(e, &t, attempt, rerr->msg);
        goto done;
      }
      if (!claim_held(e)) { /* the DLQ copy goes before the recording: look first */
        outcome = WORKER_LOST;
        goto done;
      }
      /* Terminal, or attempts exhausted: the DLQ. */
      char cause[700];
      snprintf(cause, sizeof cause, "%s after attempt %d: %s", transient ? "attempts exhausted" : "terminal failure",
               attempt, rerr->msg);
      const char *fclass = transient ? "exhausted" : "terminal";
      free(msg->reason);
      msg->reason = NULL;
      /* The run's record and DEAD go in one transaction below; the DLQ copy goes first. */
      bool claimed = e->claimed;
      e->claimed = false;
      outcome = worker_dead_letter(e, fclass, cause, true);
      e->claimed = claimed;
      dlq_published = outcome == WORKER_DEAD;
      t.status = OBX_INBOX_DEAD;
      t.last_error = msg->reason;
      t.attempts = msg->attempt;
      outcome = WORKER_DEAD;
      obx_log_event(OBX_LOG_WARN, ev->id, ev->correlation_id, "attempt %d failed (%s: %s); parked in the DLQ",
                    attempt, fclass, rerr->msg);
      break;
    }
    }
  }
  if (outcome == WORKER_DONE || outcome == WORKER_SKIPPED) { /* the recorder's, with other runs' (batch.c) */
    e->recorded = outcome;
    e->record_status = t.status;
    e->record_attempts = t.attempts;
    event_move(e, WORKER_RECORDING);
    return WORKER_RECORDING; /* the run is kept until its outcome is written (record_written) */
  }
  outcome = record(e, &t, outcome, dlq_published);
done:
  obx_pipeline_run_destroy(run);
  e->run = NULL;
  return outcome;
}

/* ---- group commit: finished runs recorded together --------------------------------------- */

typedef struct {
  obx_worker_t *w;
  event_t **events;
  int n;
  obx_inbox_outcome_t *outcomes;
  bool *written;
} record_batch_t;

/* One transaction for the batch: every event's inbox status, compare-and-set on its own claim
 * (one bulk); then the runs of those whose claim held: their pipeline_executions documents in
 * one insertMany, a run with effects (set-status, emit-event) through its own commit. An event
 * whose claim did not hold writes nothing; the others commit. */
static bool record_batch_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  record_batch_t *b = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  const char *db = b->w->db;
  if (!obx_inbox_set_status_owned_many(client, db, session, b->w->consumer, b->outcomes, b->n, b->written, err))
    return false;
  bson_t opts;
  bson_error_t berr;
  bson_init(&opts);
  if (!mongoc_client_session_append(session, &opts, &berr)) {
    obx_err_from_bson(err, &berr, NULL);
    bson_destroy(&opts);
    return false;
  }
  mongoc_collection_t *executions = mongoc_client_get_collection(client, db, "pipeline_executions");
  mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(executions, &opts);
  bool ok = true, any = false;
  for (int i = 0; ok && i < b->n; i++) {
    obx_pipeline_run_t *run = b->events[i]->run;
    if (!b->written[i] || !run) continue;
    if (bson_empty(obx_pipeline_run_statuses(run)) && obx_pipeline_run_nevents(run) == 0) {
      ok = mongoc_bulk_operation_insert_with_opts(bulk, obx_pipeline_run_execution(run), NULL, &berr);
      if (!ok) obx_err_from_bson(err, &berr, NULL);
      any = true;
    } else {
      ok = obx_pipeline_run_commit(run, client, db, session, err);
    }
  }
  if (ok && any) {
    bson_t reply;
    ok = mongoc_bulk_operation_execute(bulk, &reply, &berr) != 0;
    if (!ok) obx_err_from_bson(err, &berr, &reply);
    bson_destroy(&reply);
  }
  mongoc_bulk_operation_destroy(bulk);
  mongoc_collection_destroy(executions);
  bson_destroy(&opts);
  return ok;
}

/* The recorder's batch function (batch.c): the outcomes of up to RECORD_BATCH_MAX finished runs
 * (DONE, SKIPPED) in one transaction. Each event's result: written, lost (its claim did not
 * hold), or, when the transaction failed, none: record_written records it alone. */
void worker_record_batch(obx_worker_t *w, job_t **jobs, int n) {
  event_t *events[RECORD_BATCH_MAX];
  obx_inbox_outcome_t outcomes[RECORD_BATCH_MAX];
  bool written[RECORD_BATCH_MAX];
  assert(n <= RECORD_BATCH_MAX);
  for (int i = 0; i < n; i++) {
    event_t *e = events[i] = jobs[i]->event;
    outcomes[i] = (obx_inbox_outcome_t){.event_id = e->ev.id, .cas = &e->cas, .status = e->record_status,
                                        .attempts = e->record_attempts,
                                        .execution_id = e->run ? obx_pipeline_run_execution_id(e->run) : NULL};
  }
  record_batch_t b = {.w = w, .events = events, .n = n, .outcomes = outcomes, .written = written};
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_mongo_transaction(w->mongo, record_batch_txn, &b, &err);
  if (!ok) obx_warn("recording %d runs together failed (%s): each is recorded alone", n, err.msg);
  for (int i = 0; i < n; i++) events[i]->batched = !ok ? BATCH_NONE : written[i] ? BATCH_WRITTEN : BATCH_LOST;
}

/* After the recorder (the runner that resumes the event): written, its outcome stands; lost,
 * nothing was recorded (the claim's owner settles the event); the batch failed: recorded alone
 * (record: its own bounded retries, and the DLQ when that cannot be done), the run not repeated. */
static worker_outcome_t record_written(event_t *e) {
  worker_outcome_t outcome = e->recorded;
  if (e->batched == BATCH_LOST) {
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                  "the claim is no longer this process's at attempt %d (taken over or moved on); this run's "
                  "outcome is not recorded", e->cas.attempts);
    outcome = WORKER_LOST;
  } else if (e->batched == BATCH_NONE) {
    outcome_txn_t t = {.w = e->w, .run = e->run, .ev = &e->ev, .cas = &e->cas, .status = e->record_status,
                       .attempts = e->record_attempts};
    outcome = record(e, &t, outcome, false);
  }
  obx_pipeline_run_destroy(e->run);
  e->run = NULL;
  return outcome;
}

/* ---- claims of fresh Kafka events, together ---------------------------------------------- */

/* The claimer's batch function (batch.c): one read of the events' keys' parks, then the events
 * of keys not parked inserted claimed in one insertMany. An event inserted there is claimed
 * (registered with the renewal at once); every other one (its key parked, a duplicate, an entry
 * the insert refused, or the batch failed) takes its own path when it resumes (admit_step). */
void worker_claim_batch(obx_worker_t *w, job_t **jobs, int n) {
  const char **keys = malloc((size_t)n * sizeof *keys);
  bool *parked = malloc((size_t)n * sizeof *parked), *inserted = malloc((size_t)n * sizeof *inserted);
  obx_inbox_entry_t *entries = malloc((size_t)n * sizeof *entries);
  event_t **fresh = malloc((size_t)n * sizeof *fresh);
  assert(keys && parked && inserted && entries && fresh);
  for (int i = 0; i < n; i++) {
    event_t *e = jobs[i]->event;
    e->batched = BATCH_NONE;
    keys[i] = e->ev.partition_key ? e->ev.partition_key : "";
  }
  mongoc_client_t *client = obx_mongo_pop(w->mongo);
  obx_err_t err = OBX_ERR_INIT;
  int m = 0;
  if (obx_inbox_keys_parked(client, w->db, w->consumer, keys, n, parked, &err)) {
    for (int i = 0; i < n; i++)
      if (!parked[i]) {
        fresh[m] = jobs[i]->event;
        entries[m] = fresh[m]->entry;
        m++;
      }
    if (obx_inbox_claim_many(client, w->db, entries, m, inserted, &err)) {
      for (int i = 0; i < m; i++)
        if (inserted[i]) {
          fresh[i]->batched = BATCH_WRITTEN;
          worker_claims_add(w, fresh[i]->ev.id);
        }
    } else {
      obx_info("claiming %d events together failed (%s): each claims alone", m, err.msg);
    }
  } else {
    obx_info("reading %d keys' parks failed (%s): each event claims alone", n, err.msg);
  }
  obx_mongo_push(w->mongo, client);
  free(fresh);
  free(entries);
  free(inserted);
  free(parked);
  free(keys);
}

/* Stores a fresh event of a parked key: BLOCKED when the key is still parked behind another
 * head (holding it, see obx_inbox_hold_key), else RECEIVED. One transaction. */
static bool admit_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  event_t *e = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  return obx_inbox_hold_key(client, e->w->db, session, e->w->consumer, e->ev.partition_key, e->ev.id, &e->blocked,
                            err) &&
         obx_inbox_claim(client, e->w->db, session, &e->entry, e->blocked ? OBX_INBOX_BLOCKED : OBX_INBOX_RECEIVED,
                         &e->inserted, &e->existing, err);
}

/* Admission: a fresh event of a parked key waits behind the head (BLOCKED); retries and
 * redrives (work queue) are heads or released events themselves. Then the inbox entry. */
static bool admit_step(void *ctx, obx_err_t *err) {
  event_t *e = ctx;
  obx_worker_t *w = e->w;
  bool parked = false;
  e->head[0] = '\0';
  e->blocked = e->inserted = false;
  e->existing = OBX_INBOX_RECEIVED;
  if (e->source != WORKER_SOURCE_WORK &&
      !obx_inbox_key_parked(e->client, w->db, NULL, w->consumer, e->ev.partition_key, &parked, e->head, err))
    return false;
  e->blocked = parked && strcmp(e->head, e->ev.id) != 0;
  if (e->blocked) /* the head may finish in another worker process right now: decide and store together */
    return obx_mongo_transaction(w->mongo, admit_txn, e, err);
  return obx_inbox_claim(e->client, w->db, NULL, &e->entry, OBX_INBOX_RECEIVED, &e->inserted, &e->existing, err);
}

/* Takes the claim of an entry met in `existing`. A retry tier's copy (work queue, attempt > 0: a
 * retry of an operator's replay too, whose first copy is at attempt 0) runs only when its
 * attempt is the one the entry records: a stale or early copy never runs, nor the late one of two
 * copies of an attempt (the tier's and the retry sweep's). When the claim is not taken, the entry tells whether a live peer runs it
 * (RECEIVED or PROCESSING under a lease that is not past) or it moved on. */
static bool take_step(void *ctx, obx_err_t *err) {
  event_t *e = ctx;
  obx_worker_t *w = e->w;
  bool tier_copy = e->source == WORKER_SOURCE_WORK && e->msg->attempt > 0;
  bool taken = false;
  if (!obx_inbox_take(e->client, w->db, w->consumer, e->ev.id, w->owner, w->member, w->lease_ms, e->existing,
                      tier_copy ? e->msg->attempt : -1, e->msg->attempt, &taken, err))
    return false;
  e->claim = CLAIM_TAKEN;
  if (taken) return true;
  bson_t doc = BSON_INITIALIZER;
  bool found = false;
  bool ok = obx_inbox_get(e->client, w->db, NULL, w->consumer, e->ev.id, &doc, &found, err);
  const char *holder = found ? obx_mongo_doc_str(&doc, "owner") : NULL, *status = obx_mongo_doc_str(&doc, "status");
  bool running = status && (strcmp(status, obx_inbox_status_name(OBX_INBOX_RECEIVED)) == 0 ||
                            strcmp(status, obx_inbox_status_name(OBX_INBOX_PROCESSING)) == 0);
  bson_iter_t it;
  bool same_attempt = !tier_copy || (bson_iter_init_find(&it, &doc, "attempts") && BSON_ITER_HOLDS_INT(&it) &&
                                     bson_iter_as_int64(&it) == e->msg->attempt);
  /* Still running this attempt under a peer: live, even when its lease passed since the take
   * looked (the copy comes back and takes it then; skipped as moved on, it would be lost). */
  e->claim = running && same_attempt && holder && strcmp(holder, w->owner) != 0 ? CLAIM_LIVE : CLAIM_MOVED;
  if (e->claim == CLAIM_LIVE) snprintf(e->holder, sizeof e->holder, "%s", holder);
  bson_destroy(&doc);
  return ok;
}

/* An entry met RETRYING whose intent's owner went away between its commit and the tier publish
 * (retrySent false, the intent's lease past): this delivery publishes the tier copy of the
 * recorded attempt, so a parked key never waits for a message that is nowhere. A work-queue copy
 * of exactly that attempt is the publish itself and sends nothing. True when it sent the copy. */
static bool resend_intent(event_t *e) {
  obx_worker_t *w = e->w;
  bson_t doc = BSON_INITIALIZER;
  bool found = false, taken = false, sent = false;
  obx_err_t err = OBX_ERR_INIT;
  bson_iter_t it;
  if (!obx_inbox_get(e->client, w->db, NULL, w->consumer, e->ev.id, &doc, &found, &err) || !found ||
      !bson_iter_init_find(&it, &doc, "retrySent") || !BSON_ITER_HOLDS_BOOL(&it) || bson_iter_bool(&it))
    goto done;
  int attempts = bson_iter_init_find(&it, &doc, "attempts") && BSON_ITER_HOLDS_INT(&it) ? (int)bson_iter_as_int64(&it) : 0;
  if (attempts < 1 || (e->source == WORKER_SOURCE_WORK && e->msg->attempt == attempts)) goto done;
  if (!obx_inbox_take_resend(e->client, w->db, w->consumer, e->ev.id, w->owner, w->lease_ms, attempts, &taken, &err) ||
      !taken)
    goto done;
  const char *last_error = obx_mongo_doc_str(&doc, "lastError");
  e->msg->attempt = attempts - 1;
  obx_envelope_fail(e->msg, "transient", last_error ? last_error : "", obx_time_now_ms());
  if (worker_publish(w, e->msg, attempts - 1, &err) != STEP_OK) {
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                  "the unsent tier copy of attempt %d cannot be published (%s); the next delivery tries again",
                  attempts, err.msg);
    goto done;
  }
  obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                "attempt %d was recorded RETRYING but its tier copy was never sent: sent now", attempts);
  if (!obx_inbox_retry_sent(e->client, w->db, w->consumer, e->ev.id, attempts,
                            obx_time_now_ms() + obx_ladder_tier_ms(w->ladder, attempts - 1), tier_replay(e), &err))
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id, "recording the tier publish failed: %s", err.msg);
  sent = true;
done:
  bson_destroy(&doc);
  return sent;
}

/* A claim not taken. Moved on (finished, or a copy of another attempt): a duplicate. Held by a
 * live peer: the event is never run here. A work-queue copy goes back to the first retry tier
 * (it comes back after the delay and looks again); a Kafka record waits, holding its key, up to
 * two leases for the peer to finish or its claim to expire, then goes the same way; an HTTP
 * delivery is answered 503 (the sender delivers again). */
static worker_outcome_t claim_not_taken(event_t *e) {
  obx_worker_t *w = e->w;
  if (e->claim == CLAIM_MOVED) {
    obx_log_event(OBX_LOG_INFO, e->ev.id, e->ev.correlation_id, "stale copy (attempt %d): the entry moved on; skipped",
                  e->msg->attempt);
    return WORKER_DUPLICATE;
  }
  obx_log_event(OBX_LOG_INFO, e->ev.id, e->ev.correlation_id, "claimed by %s, who runs it now: not run here", e->holder);
  if (e->source == WORKER_SOURCE_HTTP) return WORKER_INFRA;
  if (e->source == WORKER_SOURCE_KAFKA) {
    int64_t deadline = obx_time_now_ms() + 2 * w->lease_ms, backoff = INFRA_BACKOFF_MIN_MS;
    while (obx_time_now_ms() < deadline) {
      if (!worker_nap_backoff(w, &backoff)) return WORKER_INFRA;
      obx_err_t err = OBX_ERR_INIT;
      if (!admit_step(e, &err)) continue;
      if (e->existing == OBX_INBOX_RETRYING) (void)resend_intent(e);
      if (e->existing == OBX_INBOX_DONE || e->existing == OBX_INBOX_SKIPPED || e->existing == OBX_INBOX_RETRYING ||
          e->existing == OBX_INBOX_DEAD || e->existing == OBX_INBOX_BLOCKED)
        return WORKER_DUPLICATE; /* the peer settled it */
      if (take_step(e, &err) && e->claim == CLAIM_TAKEN) return WORKER_DONE; /* taken over: the caller runs it */
      if (e->claim == CLAIM_MOVED) return WORKER_DUPLICATE;
    }
  }
  obx_err_t err = OBX_ERR_INIT;
  if (obx_ladder_ntiers(w->ladder) == 0 || worker_publish(w, e->msg, 0, &err) != STEP_OK) return WORKER_INFRA;
  obx_log_event(OBX_LOG_INFO, e->ev.id, e->ev.correlation_id, "sent to the first retry tier to look again later");
  return WORKER_DUPLICATE;
}

/* Header checks the decoder does not make: the inbox stores every header, so each must be a
 * UTF-8 string, and none of the record's may be left behind. */
static bool check_headers(const obx_envelope_t *msg, obx_err_t *err) {
  if (msg->dropped_headers) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%d headers, over the limit of %d",
                msg->nheaders + msg->dropped_headers, OBX_ENVELOPE_MAX_HEADERS);
    return false;
  }
  for (int i = 0; i < msg->nheaders; i++) {
    const obx_envelope_header_t *h = &msg->headers[i];
    if (!bson_utf8_validate(h->name, strlen(h->name), false) || strlen(h->name) > OBX_LADDER_MAX_NAME) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "a header name (%zu bytes) is not a UTF-8 string of at most %d bytes",
                  strlen(h->name), OBX_LADDER_MAX_NAME);
      return false;
    }
    if (!bson_utf8_validate(h->value, h->value_len, false)) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "header %s: the value (%zu bytes) is not UTF-8", h->name,
                  h->value_len);
      return false;
    }
  }
  return true;
}

/* After the event's run was settled: a work-queue head that finished hands its key on. */
static worker_outcome_t after_run(event_t *e, worker_outcome_t outcome) {
  if ((outcome == WORKER_DONE || outcome == WORKER_SKIPPED) && e->source == WORKER_SOURCE_WORK) {
    event_move(e, WORKER_RELEASING);
    if (!worker_release_if_head(e)) return WORKER_INFRA;
  }
  return outcome;
}

/* The event's end, whatever its outcome: its claim leaves the renewed ones, its consumer span
 * ends; what it held goes back. */
static worker_outcome_t event_end(event_t *e, worker_outcome_t outcome) {
  obx_worker_t *w = e->w;
  event_move(e, outcome);
  if (e->claimed) worker_claims_remove(w, e->ev.id);
  obx_pipeline_destroy(e->pipeline);
  if (e->client) obx_mongo_push(w->mongo, e->client);
  obx_event_cleanup(&e->ev);
  if (outcome == WORKER_RETRYING || outcome == WORKER_DEAD || outcome == WORKER_INFRA)
    obx_span_set_error(e->span, e->msg->last_error ? e->msg->last_error : "MongoDB or RabbitMQ unavailable");
  obx_span_set_bool(e->span, "outboxd.duplicate", outcome == WORKER_DUPLICATE);
  obx_trace_set_current(NULL);
  obx_span_end(e->span);
  return outcome;
}

/* The event leaves its runner until a batch write or its call is done (held): it holds no
 * MongoDB client meanwhile. Returns held. */
static worker_outcome_t event_hand_off(event_t *e, worker_outcome_t held) {
  if (e->client) obx_mongo_push(e->w->mongo, e->client);
  e->client = NULL;
  obx_trace_set_current(NULL);
  return held;
}

static worker_outcome_t claim_and_run(event_t *e);

/* One event from its decoding to its settled outcome (see obx_worker.h); e->msg may be updated
 * (attempts, reason). partition/offset: the Kafka position (-1 otherwise). WORKER_WAITING when its
 * run stopped at a call: e keeps everything, worker_handle_resume goes on. */
static worker_outcome_t worker_handle(event_t *e, int32_t partition, int64_t offset) {
  obx_worker_t *w = e->w;
  worker_source_t source = e->source;
  obx_envelope_t *msg = e->msg;
  obx_event_init(&e->ev);
  obx_err_t err = OBX_ERR_INIT;

  /* decode: anything that cannot be decoded is dead-lettered as it came (class malformed). */
  if (!obx_envelope_to_event(msg, &e->ev, &err) || !check_headers(msg, &err)) {
    obx_event_cleanup(&e->ev);
    obx_event_init(&e->ev);
    if (source == WORKER_SOURCE_HTTP) return event_move(e, WORKER_MALFORMED);
    worker_count_malformed(w);
    char cause[600];
    snprintf(cause, sizeof cause, "malformed CloudEvent: %s", err.msg);
    worker_outcome_t outcome = event_move(e, worker_dead_letter(e, "malformed", cause, false));
    obx_event_cleanup(&e->ev);
    return outcome;
  }
  if (!msg->message_id) msg->message_id = strdup(e->ev.id); /* the ladder and the DLQ find it by id */
  e->span = consume_span(w, source, msg, &e->ev, partition, offset);
  obx_trace_set_current(obx_span_ctx(e->span)); /* logs, the pipeline's spans and its HTTP calls */
  event_move(e, WORKER_DECODED);
  obx_trace_format(obx_span_ctx(e->span), e->traceparent);
  for (int i = 0; i < msg->nheaders; i++) {
    e->names[i] = msg->headers[i].name;
    e->values[i] = msg->headers[i].value;
  }
  e->entry = (obx_inbox_entry_t){.consumer = w->consumer, .event = &e->ev, .header_names = e->names,
                                .header_values = e->values, .nheaders = msg->nheaders,
                                .seq = worker_key_order(e->ev.key_seq, offset), .traceparent = e->traceparent,
                                .owner = w->owner, .member = w->member, .lease_ms = w->lease_ms};
  if (source == WORKER_SOURCE_KAFKA) {
    e->entry.topic = w->conf->kafka_topic;
    e->entry.partition = partition;
    e->entry.offset = offset;
  } else {
    e->entry.source_kind = source == WORKER_SOURCE_HTTP ? "http" : "amqp";
  }
  /* a fresh Kafka record is claimed with the other records in flight (the claimer, batch.c) */
  if (source == WORKER_SOURCE_KAFKA) return event_hand_off(e, WORKER_DECODED);
  e->client = obx_mongo_pop(w->mongo);
  return claim_and_run(e);
}

/* The event's claim and run: inserted claimed already by the claimer (e->batched), else its
 * entry is stored or met here (admit_step); then its run (run_event). */
static worker_outcome_t claim_and_run(event_t *e) {
  obx_worker_t *w = e->w;
  worker_source_t source = e->source;
  obx_envelope_t *msg = e->msg;
  obx_err_t err = OBX_ERR_INIT;
  worker_outcome_t outcome = WORKER_INFRA;
  int pre_tries = source == WORKER_SOURCE_HTTP ? 1 : 0; /* the sink's caller retries a 503 itself */
  if (e->batched == BATCH_WRITTEN) { /* inserted claimed, and registered, by the claimer */
    e->inserted = true;
    e->claimed = true;
    goto claimed;
  }

  /* claim */
  step_result_t admitted = worker_retry_step(w, "inbox claim", e->ev.id, admit_step, e, pre_tries, false, &err);
  if (admitted == STEP_STOPPED || (admitted == STEP_EXHAUSTED && source == WORKER_SOURCE_HTTP)) goto done;
  if (admitted != STEP_OK) {
    char cause[600];
    snprintf(cause, sizeof cause, "the inbox cannot store the event: %s", err.msg);
    outcome = worker_dead_letter(e, admitted == STEP_FAILED ? "malformed" : "infra", cause, false);
    goto done;
  }
  if (e->inserted && e->blocked) {
    obx_log_event(OBX_LOG_INFO, e->ev.id, e->ev.correlation_id, "key %s is parked behind %s: stored BLOCKED",
                  e->ev.partition_key, e->head);
    outcome = WORKER_BLOCKED;
    goto done;
  }
  if (!e->inserted) {
    if (e->existing == OBX_INBOX_RETRYING && resend_intent(e)) { /* the copy sent now carries it on */
      outcome = WORKER_DUPLICATE;
      goto done;
    }
    bool finished = e->existing == OBX_INBOX_DONE || e->existing == OBX_INBOX_SKIPPED;
    /* From Kafka or HTTP, an event the ladder, the DLQ or its key already owns is a duplicate
     * too; from the work queue those are exactly the events to run again. */
    bool owned = e->existing == OBX_INBOX_RETRYING || e->existing == OBX_INBOX_DEAD || e->existing == OBX_INBOX_BLOCKED;
    bool replay = source == WORKER_SOURCE_WORK && msg->replay_id;
    if ((finished && !replay) || (source != WORKER_SOURCE_WORK && owned)) {
      obx_log_event(OBX_LOG_DEBUG, e->ev.id, e->ev.correlation_id, "duplicate (%s): skipped",
                    obx_inbox_status_name(e->existing));
      outcome = WORKER_DUPLICATE;
      /* A finished head that comes back (a copy, or a release interrupted by a stop) still
       * hands its key on. */
      if (finished && source == WORKER_SOURCE_WORK) {
        event_move(e, WORKER_RELEASING);
        if (!worker_release_if_head(e)) outcome = WORKER_INFRA;
      }
      goto done;
    }
    /* claim: never run what a live peer runs; take over an expired claim */
    step_result_t r = worker_retry_step(w, "inbox claim", e->ev.id, take_step, e, pre_tries, false, &err);
    if (r == STEP_STOPPED || (r == STEP_EXHAUSTED && source == WORKER_SOURCE_HTTP)) goto done;
    if (r != STEP_OK) {
      char cause[600];
      snprintf(cause, sizeof cause, "claiming the inbox entry failed: %s", err.msg);
      outcome = worker_dead_letter(e, r == STEP_FAILED ? "terminal" : "infra", cause, false);
      goto done;
    }
    if (e->claim != CLAIM_TAKEN) {
      outcome = claim_not_taken(e);
      if (e->claim != CLAIM_TAKEN) goto done;
    }
  }
  e->claimed = true;
  worker_claims_add(w, e->ev.id);
claimed:
  /* the claim's attempts: a fresh entry's 0, a taken one's the copy's (obx_inbox_take) */
  e->cas = (obx_inbox_cas_t){.owner = w->owner, .attempts = e->inserted ? 0 : msg->attempt, .lease_ms = w->lease_ms};
  event_move(e, WORKER_CLAIMED);
  outcome = run_event(e);
  if (outcome == WORKER_WAITING) event_move(e, WORKER_WAITING);
  if (outcome == WORKER_WAITING || outcome == WORKER_RECORDING) return event_hand_off(e, outcome);
  outcome = after_run(e, outcome);
done:
  return event_end(e, outcome);
}

/* The event goes on after what held it outside the runners: its claim written by the claimer
 * (WORKER_DECODED: claimed, or on to its own claim), its outcome by the recorder
 * (WORKER_RECORDING), or its call ended (io.c; WORKER_WAITING): on to its next call (waiting
 * again), a batch write, or its end, then settled and ended as worker_handle ends it. */
static worker_outcome_t worker_handle_resume(event_t *e, CURLcode rc) {
  obx_trace_set_current(obx_span_ctx(e->span));
  if (e->state == WORKER_DECODED) {
    e->client = obx_mongo_pop(e->w->mongo);
    return claim_and_run(e);
  }
  if (e->state == WORKER_RECORDING) {
    e->client = obx_mongo_pop(e->w->mongo);
    return event_end(e, after_run(e, record_written(e)));
  }
  event_move(e, WORKER_RUNNING);
  worker_outcome_t outcome;
  if (worker_claim_lost(e->w, e->ev.id)) { /* no further call: settle_run stops the run */
    e->client = obx_mongo_pop(e->w->mongo);
    outcome = settle_run(e);
  } else {
    obx_pipeline_resume(e->run, rc);
    if (obx_pipeline_run_waiting(e->run)) {
      event_move(e, WORKER_WAITING);
      obx_trace_set_current(NULL);
      return WORKER_WAITING;
    }
    e->client = obx_mongo_pop(e->w->mongo);
    outcome = settle_run(e);
  }
  if (outcome == WORKER_RECORDING) return event_hand_off(e, outcome);
  return event_end(e, after_run(e, outcome));
}
