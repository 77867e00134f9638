/* worker.c - the worker role: Kafka / work queue / HTTP sink -> inbox -> pipeline -> ladder
 *
 * DESIGN: see include/obx/obx_worker.h. The Kafka thread owns the consumer and the per-partition
 * offset bookkeeping (offsets.c); the work-queue thread owns the AMQP consumer and settles its messages; lane
 * threads own nothing but their queue and run events (handle()). Every source turns its input
 * into an obx_ladder_msg_t (the CloudEvent in binary form), so the retry tiers, the DLQ and the
 * inbox see one shape. Reads mongo.*, kafka.*, amqp.url, worker.*, inbox.retention, egress.*,
 * pipelines.cache_ttl (the same enabled-pipeline cache as the api's order.pre lookup). */
#include "obx/obx_worker.h"

#include <assert.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_event.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ladder.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "obx/obx_mongo.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_trace.h"
#include "worker_int.h"

#define LANE_QUEUE_CAP 16 /* bounds how long the Kafka thread can block on a slow lane */
#define INFRA_BACKOFF_MIN_MS 100
#define INFRA_BACKOFF_MAX_MS 5000
#define REVOKE_DRAIN_MS 30000

/* ---- jobs and lanes --------------------------------------------------------------------- */

typedef struct job {
  worker_source_t source;
  obx_ladder_msg_t msg;
  int32_t partition;        /* JOB from Kafka */
  int64_t offset;
  uint64_t generation;      /* assignment generation the offset belongs to */
  worker_http_wait_t *wait; /* HTTP: the handler waiting for the outcome */
  worker_outcome_t outcome;
  struct job *next;
} job_t;

typedef struct {
  obx_worker_t *worker;
  int index;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t nonempty, nonfull;
  job_t *head, *tail;
  int n;
} lane_t;

struct obx_worker {
  const obx_conf_t *conf;
  const char *consumer;     /* inbox consumer name = WORKER_GROUP */
  const char *db;
  int max_attempts;
  obx_mongo_t *mongo;
  obx_ladder_t *ladder;
  obx_ladder_opts_t ladder_opts;
  obx_egress_t egress;
  bool egress_ok;
  obx_pipeline_cache_t *pipelines; /* enabled pipeline per (org, trigger), PIPELINES_CACHE_TTL */

  lane_t *lanes;
  int nlanes;
  atomic_bool stop;

  rd_kafka_t *rk;
  pthread_t kafka_thread;
  bool kafka_running;
  worker_offsets_t offsets; /* Kafka thread only */
  uint64_t generation;      /* bumped on every rebalance; Kafka thread writes, lanes copy via job */

  obx_ladder_consumer_t *wq;
  pthread_t wq_thread;
  bool wq_running;

  pthread_mutex_t done_mu;  /* completions handed back by the lanes */
  job_t *kafka_done, *wq_done;

  worker_stats_t stats;
};

static uint32_t key_hash(const char *s, size_t len) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
  return h;
}

static const char *msg_partition_key(const obx_ladder_msg_t *msg, size_t *len) {
  const char *k = obx_ladder_msg_header(msg, "ce_partitionkey");
  if (k) {
    *len = strlen(k);
    return k;
  }
  *len = msg->key ? msg->key_len : 0;
  return msg->key ? msg->key : "";
}

static void job_free(job_t *job) {
  if (!job) return;
  obx_ladder_msg_cleanup(&job->msg);
  free(job);
}

/* Blocks while the lane is full; false when stopping (the job is then not queued). */
static bool lane_push(obx_worker_t *w, job_t *job) {
  size_t klen;
  const char *key = msg_partition_key(&job->msg, &klen);
  lane_t *lane = &w->lanes[key_hash(key, klen) % (uint32_t)w->nlanes];
  pthread_mutex_lock(&lane->mu);
  while (lane->n >= LANE_QUEUE_CAP && !atomic_load(&w->stop)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&lane->nonfull, &lane->mu, &ts);
  }
  bool ok = !atomic_load(&w->stop);
  if (ok) {
    job->next = NULL;
    if (lane->tail) lane->tail->next = job;
    else lane->head = job;
    lane->tail = job;
    lane->n++;
    pthread_cond_signal(&lane->nonempty);
  }
  pthread_mutex_unlock(&lane->mu);
  return ok;
}

/* Sleeps up to ms unless the worker stops; returns false when stopping. */
static bool nap(obx_worker_t *w, int64_t ms) {
  int64_t end = obx_time_now_ms() + ms;
  while (!atomic_load(&w->stop)) {
    int64_t left = end - obx_time_now_ms();
    if (left <= 0) return true;
    struct timespec ts = {0, (left > 50 ? 50 : left) * 1000000L};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* Naps *backoff_ms, then doubles it up to INFRA_BACKOFF_MAX_MS; false when stopping. */
static bool nap_backoff(obx_worker_t *w, int64_t *backoff_ms) {
  if (!nap(w, *backoff_ms)) return false;
  *backoff_ms = *backoff_ms * 2 > INFRA_BACKOFF_MAX_MS ? INFRA_BACKOFF_MAX_MS : *backoff_ms * 2;
  return true;
}

static void complete(obx_worker_t *w, job_t *job) {
  if (job->source == WORKER_SOURCE_HTTP) {
    worker_http_complete(job->wait, job->outcome);
    job_free(job);
    return;
  }
  pthread_mutex_lock(&w->done_mu);
  job_t **list = job->source == WORKER_SOURCE_KAFKA ? &w->kafka_done : &w->wq_done;
  job->next = *list;
  *list = job;
  pthread_mutex_unlock(&w->done_mu);
}

/* ---- metrics: per-worker numbers (obx_worker_stats) and the process registry (/metrics) --- */

static struct {
  obx_counter_t *consumed, *duplicates, *malformed, *runs, *blocked, *retries, *dlq;
  obx_gauge_t *lag, *parked;
} metrics;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_register(void) {
  metrics.consumed = obx_metrics_counter("outboxd_worker_consumed_total", "Events received by the worker", "source");
  metrics.duplicates =
    obx_metrics_counter("outboxd_worker_duplicates_total", "Events skipped because the inbox already had them", NULL);
  metrics.malformed =
    obx_metrics_counter("outboxd_worker_malformed_total", "Records that were not CloudEvents (sent to the DLQ)", NULL);
  metrics.runs = obx_metrics_counter("outboxd_worker_pipeline_runs_total", "Pipeline runs by status", "status");
  metrics.blocked =
    obx_metrics_counter("outboxd_worker_blocked_total", "Events stored BLOCKED behind the head of their key", NULL);
  metrics.retries = obx_metrics_counter("outboxd_worker_retries_total", "Publishes to the retry ladder by tier", "tier");
  metrics.dlq = obx_metrics_counter("outboxd_worker_dlq_published_total", "Publishes to the parking-lot DLQ", "class");
  metrics.lag =
    obx_metrics_gauge("outboxd_worker_consumer_lag", "Kafka messages behind over the assigned partitions", NULL);
  metrics.parked = obx_metrics_gauge("outboxd_worker_parked_keys", "Business keys parked behind a failing event", NULL);
}

static const char *const source_names[] = {"kafka", "amqp", "http"};

static void count_consumed(obx_worker_t *w, worker_source_t source) {
  atomic_fetch_add(&w->stats.consumed, 1);
  obx_counter_inc(metrics.consumed, source_names[source]);
}

static void count_run(obx_worker_t *w, obx_pipeline_status_t status) {
  atomic_fetch_add(status == OBX_PIPELINE_SUCCEEDED ? &w->stats.runs_succeeded
                   : status == OBX_PIPELINE_FAILED  ? &w->stats.runs_failed
                                                    : &w->stats.runs_skipped,
                   1);
  obx_counter_inc(metrics.runs, obx_pipeline_status_name(status));
}

static void count_retry(obx_worker_t *w, int tier) {
  atomic_fetch_add(&w->stats.retries[tier], 1);
  char label[16];
  snprintf(label, sizeof label, "%d", tier + 1);
  obx_counter_inc(metrics.retries, label);
}

static void count_dlq(obx_worker_t *w, const char *failure_class) {
  atomic_fetch_add(&w->stats.dlq, 1);
  obx_counter_inc(metrics.dlq, failure_class);
}

static void set_lag(obx_worker_t *w, int64_t lag) {
  atomic_store(&w->stats.lag, lag);
  obx_gauge_set(metrics.lag, (double)lag);
}

static void set_parked(obx_worker_t *w, int64_t n) {
  atomic_store(&w->stats.parked_keys, n);
  obx_gauge_set(metrics.parked, (double)n);
}

static void count_outcome(obx_worker_t *w, worker_outcome_t outcome) {
  switch (outcome) {
  case WORKER_DUPLICATE:
    atomic_fetch_add(&w->stats.duplicates, 1);
    obx_counter_inc(metrics.duplicates);
    break;
  case WORKER_BLOCKED:
    atomic_fetch_add(&w->stats.blocked, 1);
    obx_counter_inc(metrics.blocked);
    break;
  default: break;
  }
}

static void *lane_main(void *arg) {
  lane_t *lane = arg;
  obx_worker_t *w = lane->worker;
  char name[16];
  snprintf(name, sizeof name, "obx-lane-%d", lane->index);
  pthread_setname_np(pthread_self(), name);
  obx_log_set_role("worker");
  for (;;) {
    pthread_mutex_lock(&lane->mu);
    while (!lane->head && !atomic_load(&w->stop)) pthread_cond_wait(&lane->nonempty, &lane->mu);
    job_t *job = lane->head;
    if (atomic_load(&w->stop) || !job) {
      pthread_mutex_unlock(&lane->mu);
      break;
    }
    lane->head = job->next;
    if (!lane->head) lane->tail = NULL;
    lane->n--;
    pthread_cond_signal(&lane->nonfull);
    pthread_mutex_unlock(&lane->mu);

    int64_t backoff = INFRA_BACKOFF_MIN_MS;
    for (;;) {
      job->outcome = job->source == WORKER_SOURCE_KAFKA
                       ? worker_handle(w, job->source, &job->msg, job->partition, job->offset)
                       : worker_handle(w, job->source, &job->msg, -1, -1);
      /* MongoDB or RabbitMQ unavailable: retry the same event; HTTP callers retry themselves. */
      if (job->outcome != WORKER_INFRA || job->source == WORKER_SOURCE_HTTP) break;
      if (!nap_backoff(w, &backoff)) break;
    }
    count_outcome(w, job->outcome);
    complete(w, job);
  }
  return NULL;
}

/* ---- event handling ------------------------------------------------------------------------ */

#define PUBLISH_DLQ (-1)
#define PUBLISH_WORK (-2)

/* Publishes to retry tier `tier`, to the DLQ (PUBLISH_DLQ) or to the work queue (PUBLISH_WORK),
 * with retries while RabbitMQ is away; false only when the worker stops. */
static bool publish_until_confirmed(obx_worker_t *w, const obx_ladder_msg_t *msg, int tier) {
  int64_t backoff = INFRA_BACKOFF_MIN_MS;
  for (;;) {
    obx_err_t err = OBX_ERR_INIT;
    bool ok = tier >= 0 ? obx_ladder_publish_retry(w->ladder, msg, tier, &err)
              : tier == PUBLISH_DLQ ? obx_ladder_publish_dlq(w->ladder, msg, &err)
                                    : obx_ladder_publish_work(w->ladder, msg, &err);
    if (ok) return true;
    obx_log_event(OBX_LOG_WARN, msg->message_id, NULL, "publish to %s failed, retrying: %s",
                  tier >= 0 ? "retry tier" : tier == PUBLISH_DLQ ? "DLQ" : "work queue", err.msg);
    if (!err.retriable) return false;
    if (!nap_backoff(w, &backoff)) return false;
  }
}

static worker_outcome_t handle_malformed(obx_worker_t *w, obx_ladder_msg_t *msg, const obx_err_t *cause) {
  atomic_fetch_add(&w->stats.malformed, 1);
  obx_counter_inc(metrics.malformed);
  if (!msg->message_id) {
    const char *id = obx_ladder_msg_header(msg, "ce_id");
    char gen[OBX_UUID_LEN + 1];
    if (!id) {
      obx_uuid7(gen);
      id = gen;
    }
    msg->message_id = strdup(id);
  }
  char reason[320];
  snprintf(reason, sizeof reason, "malformed CloudEvent: %s", cause->msg);
  obx_ladder_msg_fail(msg, "malformed", cause->msg, obx_time_now_ms());
  free(msg->reason);
  msg->reason = strdup(reason);
  obx_log_event(OBX_LOG_WARN, msg->message_id, NULL, "%s; parking it in the DLQ", reason);
  if (!publish_until_confirmed(w, msg, PUBLISH_DLQ)) return WORKER_INFRA;
  count_dlq(w, "malformed");
  return WORKER_DEAD;
}

/* Points the message's ce_traceparent at the current span (the attempt that failed), so its
 * retry, or a redrive from the DLQ, links to it. */
static void msg_continue_trace(obx_ladder_msg_t *msg) {
  const obx_trace_ctx_t *trace = obx_trace_current();
  if (!trace) return;
  char tp[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(trace, tp);
  int i = 0;
  while (i < msg->nheaders && strcmp(msg->headers[i].name, "ce_traceparent") != 0) i++;
  if (i == OBX_LADDER_MAX_HEADERS) return;
  if (i == msg->nheaders) msg->headers[msg->nheaders++].name = strdup("ce_traceparent");
  free(msg->headers[i].value);
  msg->headers[i].value = strdup(tp);
  msg->headers[i].value_len = strlen(tp);
}

/* The consumer span of one delivery (messaging semconv): a child of the event's traceparent;
 * for a redrive or a replay, whose original trace finished long ago, a new trace with a link to
 * it. A work-queue message at attempt 0 with a history is a redrive (attempts reset, history
 * kept). */
static obx_span_t *consume_span(obx_worker_t *w, worker_source_t source, const obx_ladder_msg_t *msg,
                                const obx_event_t *ev, int32_t partition, int64_t offset) {
  obx_trace_ctx_t origin;
  obx_trace_parse(ev->traceparent, ev->traceparent ? strlen(ev->traceparent) : 0, ev->tracestate,
                  ev->tracestate ? strlen(ev->tracestate) : 0, &origin);
  bool relinked = source == WORKER_SOURCE_WORK && (msg->replay || (msg->attempt == 0 && msg->history));
  const char *dest = source == WORKER_SOURCE_KAFKA ? w->conf->kafka_topic
                     : source == WORKER_SOURCE_WORK ? obx_ladder_work_queue(w->ladder) : "http";
  char name[300];
  snprintf(name, sizeof name, "process %s", dest);
  obx_span_t *span = obx_span_start(name, OBX_SPAN_CONSUMER, relinked ? NULL : &origin);
  if (relinked) obx_span_add_link(span, &origin, msg->replay ? "replay" : "redrive");
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
  if (!obx_inbox_set_status(client, db, session, t->w->consumer, t->ev->id, t->status, t->attempts, t->last_error,
                            exec_id, err))
    return false;
  if (t->park && !obx_inbox_park_key(client, db, session, t->w->consumer, t->ev->partition_key, t->ev->id,
                                     obx_inbox_status_name(t->status), err))
    return false;
  return true;
}

/* Runs the pipeline of ev and records the outcome. msg is the ladder form (attempt count). */
static worker_outcome_t run_event(obx_worker_t *w, mongoc_client_t *client, obx_ladder_msg_t *msg,
                                  const obx_event_t *ev) {
  worker_outcome_t outcome = WORKER_INFRA;
  obx_err_t err = OBX_ERR_INIT;
  obx_pipeline_t *pipeline = NULL;
  obx_pipeline_run_t *run = NULL;
  bson_t ctx = BSON_INITIALIZER;
  char trigger[160];
  obx_pipeline_trigger_for_event(ev->event_type, trigger, sizeof trigger);
  int attempt = msg->attempt + 1;

  if (!obx_pipeline_cache_find_enabled(w->pipelines, client, w->db, ev->org_id, trigger, &pipeline, &err)) {
    obx_log_event(OBX_LOG_WARN, ev->id, ev->correlation_id, "pipeline lookup failed: %s", err.msg);
    goto done;
  }
  outcome_txn_t t = {.w = w, .ev = ev, .attempts = attempt};
  if (!pipeline) {
    t.status = OBX_INBOX_SKIPPED;
    t.attempts = msg->attempt;
    outcome = WORKER_SKIPPED;
  } else {
    obx_pipeline_context_from_event(ev, &ctx);
    obx_pipeline_input_t in = {.context = &ctx, .org_id = ev->org_id, .trigger = trigger, .event_id = ev->id,
                               .correlation_id = ev->correlation_id, .aggregate_type = ev->aggregate_type,
                               .aggregate_id = ev->aggregate_id, .partition_key = ev->partition_key,
                               .attempt = attempt};
    run = obx_pipeline_execute(pipeline, &in, &w->egress);
    t.run = run;
    count_run(w, obx_pipeline_run_status(run));
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
      obx_ladder_msg_fail(msg, transient ? "transient" : "terminal", rerr->msg, obx_time_now_ms());
      if (transient && attempt < w->max_attempts) {
        int tier = attempt - 1;
        if (!publish_until_confirmed(w, msg, tier)) goto done;
        int ntiers = obx_ladder_ntiers(w->ladder);
        count_retry(w, tier < ntiers ? tier : ntiers - 1);
        t.status = OBX_INBOX_RETRYING;
        outcome = WORKER_RETRYING;
        obx_log_event(OBX_LOG_INFO, ev->id, ev->correlation_id, "attempt %d failed (transient: %s); retry tier %d",
                      attempt, rerr->msg, tier + 1);
      } else {
        free(msg->reason);
        msg->reason = strdup(transient ? "attempts exhausted" : "terminal failure");
        if (!publish_until_confirmed(w, msg, PUBLISH_DLQ)) goto done;
        count_dlq(w, transient ? "transient" : "terminal");
        t.status = OBX_INBOX_DEAD;
        outcome = WORKER_DEAD;
        obx_log_event(OBX_LOG_WARN, ev->id, ev->correlation_id, "attempt %d failed (%s: %s); parked in the DLQ",
                      attempt, transient ? "attempts exhausted" : "terminal", rerr->msg);
      }
      break;
    }
    }
  }
  if (!obx_mongo_transaction(w->mongo, outcome_txn, &t, &err)) {
    obx_log_event(OBX_LOG_WARN, ev->id, ev->correlation_id, "recording the outcome failed: %s", err.msg);
    outcome = WORKER_INFRA;
  }
done:
  obx_pipeline_run_destroy(run);
  obx_pipeline_destroy(pipeline);
  bson_destroy(&ctx);
  return outcome;
}

/* Stores a fresh event of a parked key: BLOCKED when the key is still parked behind another
 * head (holding it, see obx_inbox_hold_key), else RECEIVED. One transaction. */
typedef struct {
  obx_worker_t *w;
  const obx_inbox_entry_t *entry;
  bool blocked, inserted;
  obx_inbox_status_t existing;
} admit_t;

static bool admit_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  admit_t *a = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  const obx_event_t *ev = a->entry->event;
  return obx_inbox_hold_key(client, a->w->db, session, a->w->consumer, ev->partition_key, ev->id, &a->blocked,
                            err) &&
         obx_inbox_claim(client, a->w->db, session, a->entry, a->blocked ? OBX_INBOX_BLOCKED : OBX_INBOX_RECEIVED,
                         &a->inserted, &a->existing, err);
}

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

/* After the head `done` of a parked key finished: hands the head on to the next BLOCKED event
 * and sends it to the work queue, where any worker process runs it and, when it finishes, takes
 * the next step; so BLOCKED events run one at a time in seq order. An entry that no longer
 * decodes cannot block its key forever: it is marked DEAD and the step goes on past it. */
static worker_outcome_t release_key(obx_worker_t *w, mongoc_client_t *client, const char *key, const char *done,
                                    bool may_resend) {
  char cur[OBX_UUID_LEN + 1];
  snprintf(cur, sizeof cur, "%s", done);
  for (;;) {
    obx_err_t err = OBX_ERR_INIT;
    step_t s = {.w = w, .key = key, .done = cur, .may_resend = may_resend};
    bson_init(&s.next);
    if (!obx_mongo_transaction(w->mongo, step_txn, &s, &err)) {
      bson_destroy(&s.next);
      obx_warn("releasing key %s: %s", key, err.msg);
      return WORKER_INFRA;
    }
    if (s.unparked) obx_info("key %s released", key);
    if (!s.send) {
      bson_destroy(&s.next);
      return WORKER_DONE;
    }
    obx_event_t ev;
    obx_event_init(&ev);
    obx_ladder_msg_t msg;
    obx_ladder_msg_init(&msg);
    worker_outcome_t outcome = WORKER_DONE;
    const char *next = obx_mongo_doc_str(&s.next, "_id.eventId");
    snprintf(cur, sizeof cur, "%s", next ? next : "");
    if (!obx_inbox_entry_event(&s.next, &ev, &err) || !obx_ladder_msg_from_event(&msg, &ev, &err)) {
      obx_warn("blocked entry %s of key %s does not decode (%s); marking it DEAD", cur, key, err.msg);
      outcome = obx_inbox_set_status(client, w->db, NULL, w->consumer, cur, OBX_INBOX_DEAD, -1, err.msg, NULL, &err)
                  ? WORKER_SKIPPED : WORKER_INFRA;
    } else {
      obx_log_event(OBX_LOG_INFO, ev.id, ev.correlation_id, "key %s: next in order after %s", key, done);
      outcome = publish_until_confirmed(w, &msg, PUBLISH_WORK) ? WORKER_DONE : WORKER_INFRA;
      /* Not recorded: a redelivered copy of `done` sends it once more (at least once). */
      if (outcome == WORKER_DONE && !obx_inbox_mark_sent(client, w->db, NULL, w->consumer, key, cur, &err))
        obx_log_event(OBX_LOG_WARN, ev.id, ev.correlation_id, "recording the send failed: %s", err.msg);
    }
    obx_ladder_msg_cleanup(&msg);
    obx_event_cleanup(&ev);
    bson_destroy(&s.next);
    if (outcome != WORKER_SKIPPED) return outcome; /* SKIPPED: past an undecodable entry */
  }
}

/* After ev (from the work queue) finished: when it is, or was, the head of its parked key,
 * takes the release step, retrying while MongoDB or RabbitMQ is away. False when the worker
 * stops with the step undone: ev's message is then given back to the broker (WORKER_INFRA),
 * comes back redelivered, and finishes it. */
static bool release_if_head(obx_worker_t *w, mongoc_client_t *client, const obx_event_t *ev, bool may_resend) {
  int64_t backoff = INFRA_BACKOFF_MIN_MS;
  for (;;) {
    bool parked = false;
    obx_err_t err = OBX_ERR_INIT;
    if (obx_inbox_key_parked(client, w->db, NULL, w->consumer, ev->partition_key, &parked, NULL, &err)) {
      if (!parked || release_key(w, client, ev->partition_key, ev->id, may_resend) != WORKER_INFRA) return true;
      may_resend = true; /* a hand-over this process moved but did not send is its own to send */
    } else {
      obx_log_event(OBX_LOG_WARN, ev->id, ev->correlation_id, "parked-key lookup failed: %s", err.msg);
    }
    if (!nap_backoff(w, &backoff)) {
      obx_warn("stopping: key %s is handed on when its head's message comes back", ev->partition_key);
      return false;
    }
  }
}

worker_outcome_t worker_handle(obx_worker_t *w, worker_source_t source, obx_ladder_msg_t *msg, int32_t partition,
                               int64_t offset) {
  obx_event_t ev;
  obx_event_init(&ev);
  obx_err_t err = OBX_ERR_INIT;
  worker_outcome_t outcome = WORKER_INFRA;
  if (!obx_ladder_msg_to_event(msg, &ev, &err)) {
    obx_event_cleanup(&ev);
    return source == WORKER_SOURCE_HTTP ? WORKER_MALFORMED : handle_malformed(w, msg, &err);
  }
  if (!msg->message_id) msg->message_id = strdup(ev.id); /* the ladder and the DLQ find it by id */
  obx_span_t *span = consume_span(w, source, msg, &ev, partition, offset);
  obx_trace_set_current(obx_span_ctx(span)); /* logs, the pipeline's spans and its HTTP calls */
  char traceparent[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(obx_span_ctx(span), traceparent);
  mongoc_client_t *client = obx_mongo_pop(w->mongo);
  const char *names[OBX_LADDER_MAX_HEADERS], *values[OBX_LADDER_MAX_HEADERS];
  for (int i = 0; i < msg->nheaders; i++) {
    names[i] = msg->headers[i].name;
    values[i] = msg->headers[i].value;
  }
  obx_inbox_entry_t entry = {.consumer = w->consumer, .event = &ev, .header_names = names, .header_values = values,
                             .nheaders = msg->nheaders, .seq = offset >= 0 ? offset : obx_time_now_ms(),
                             .traceparent = traceparent};
  if (source == WORKER_SOURCE_KAFKA) {
    entry.topic = w->conf->kafka_topic;
    entry.partition = partition;
    entry.offset = offset;
  } else {
    entry.source_kind = source == WORKER_SOURCE_HTTP ? "http" : "amqp";
  }

  /* A fresh event of a parked key waits behind the head. Retries and redrives (work queue)
   * are heads or released events themselves. */
  bool parked = false;
  char head[OBX_UUID_LEN + 1] = "";
  if (source != WORKER_SOURCE_WORK &&
      !obx_inbox_key_parked(client, w->db, NULL, w->consumer, ev.partition_key, &parked, head, &err)) {
    obx_log_event(OBX_LOG_WARN, ev.id, ev.correlation_id, "parked-key lookup failed: %s", err.msg);
    goto done;
  }
  bool blocked = parked && strcmp(head, ev.id) != 0;
  bool inserted = false;
  obx_inbox_status_t existing = OBX_INBOX_RECEIVED;
  if (blocked) {
    /* The head may finish in another worker process right now: decide and store together. */
    admit_t a = {.w = w, .entry = &entry};
    if (!obx_mongo_transaction(w->mongo, admit_txn, &a, &err)) {
      obx_log_event(OBX_LOG_WARN, ev.id, ev.correlation_id, "inbox claim failed: %s", err.msg);
      goto done;
    }
    blocked = a.blocked;
    inserted = a.inserted;
    existing = a.existing;
  } else if (!obx_inbox_claim(client, w->db, NULL, &entry, OBX_INBOX_RECEIVED, &inserted, &existing, &err)) {
    obx_log_event(OBX_LOG_WARN, ev.id, ev.correlation_id, "inbox claim failed: %s", err.msg);
    goto done;
  }
  if (inserted && blocked) {
    obx_log_event(OBX_LOG_INFO, ev.id, ev.correlation_id, "key %s is parked behind %s: stored BLOCKED",
                  ev.partition_key, head);
    outcome = WORKER_BLOCKED;
    goto done;
  }
  if (!inserted) {
    bool finished = existing == OBX_INBOX_DONE || existing == OBX_INBOX_SKIPPED;
    /* From Kafka or HTTP, an event the ladder, the DLQ or its key already owns is a duplicate
     * too; from the work queue those are exactly the events to run again. */
    bool owned = existing == OBX_INBOX_RETRYING || existing == OBX_INBOX_DEAD || existing == OBX_INBOX_BLOCKED;
    bool replay = source == WORKER_SOURCE_WORK && msg->replay;
    if ((finished && !replay) || (source != WORKER_SOURCE_WORK && owned)) {
      obx_log_event(OBX_LOG_DEBUG, ev.id, ev.correlation_id, "duplicate (%s): skipped",
                    obx_inbox_status_name(existing));
      outcome = WORKER_DUPLICATE;
      /* A finished head that comes back (a copy, or a release interrupted by a stop) still
       * hands its key on. */
      if (finished && source == WORKER_SOURCE_WORK && !release_if_head(w, client, &ev, msg->redelivered))
        outcome = WORKER_INFRA;
      goto done;
    }
    if (existing != OBX_INBOX_RECEIVED &&
        !obx_inbox_set_status(client, w->db, NULL, w->consumer, ev.id, OBX_INBOX_PROCESSING, -1, NULL, NULL, &err)) {
      obx_log_event(OBX_LOG_WARN, ev.id, ev.correlation_id, "inbox update failed: %s", err.msg);
      goto done;
    }
  }
  outcome = run_event(w, client, msg, &ev);
  if ((outcome == WORKER_DONE || outcome == WORKER_SKIPPED) && source == WORKER_SOURCE_WORK &&
      !release_if_head(w, client, &ev, msg->redelivered))
    outcome = WORKER_INFRA;
done:
  obx_mongo_push(w->mongo, client);
  obx_event_cleanup(&ev);
  if (outcome == WORKER_RETRYING || outcome == WORKER_DEAD || outcome == WORKER_INFRA)
    obx_span_set_error(span, msg->last_error ? msg->last_error : "MongoDB or RabbitMQ unavailable");
  obx_span_set_bool(span, "outboxd.duplicate", outcome == WORKER_DUPLICATE);
  obx_trace_set_current(NULL);
  obx_span_end(span);
  return outcome;
}

/* ---- Kafka ------------------------------------------------------------------------------- */

static void kafka_commit(obx_worker_t *w, const int32_t *parts, const int64_t *next, int n, bool sync) {
  if (n == 0) return;
  rd_kafka_topic_partition_list_t *offsets = rd_kafka_topic_partition_list_new(n);
  for (int i = 0; i < n; i++) rd_kafka_topic_partition_list_add(offsets, w->conf->kafka_topic, parts[i])->offset = next[i];
  rd_kafka_resp_err_t rerr = rd_kafka_commit(w->rk, offsets, sync ? 0 : 1);
  if (rerr) obx_warn("offset commit failed: %s", rd_kafka_err2str(rerr));
  rd_kafka_topic_partition_list_destroy(offsets);
}

/* Takes the lanes' completions and commits the contiguous finished offsets. */
static void kafka_commit_done(obx_worker_t *w, bool sync) {
  pthread_mutex_lock(&w->done_mu);
  job_t *list = w->kafka_done;
  w->kafka_done = NULL;
  pthread_mutex_unlock(&w->done_mu);
  for (job_t *job = list, *next; job; job = next) {
    next = job->next;
    if (job->generation == w->generation && job->outcome != WORKER_INFRA)
      worker_offsets_done(&w->offsets, job->partition, job->offset);
    job_free(job);
  }
  int max = w->offsets.n ? w->offsets.n : 1;
  int32_t parts[max];
  int64_t next[max];
  int n = worker_offsets_advance(&w->offsets, parts, next, max);
  kafka_commit(w, parts, next, n, sync);
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t rerr, rd_kafka_topic_partition_list_t *parts, void *opaque) {
  obx_worker_t *w = opaque;
  if (rerr == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
    /* Let in-flight events finish and commit them, so the next owner does not run them too. */
    int64_t deadline = obx_time_now_ms() + REVOKE_DRAIN_MS;
    for (;;) {
      kafka_commit_done(w, true);
      if (worker_offsets_idle(&w->offsets) || atomic_load(&w->stop) || obx_time_now_ms() > deadline) break;
      struct timespec ts = {0, 20 * 1000000L};
      nanosleep(&ts, NULL);
    }
    worker_offsets_clear(&w->offsets);
    w->generation++;
    rd_kafka_assign(rk, NULL);
    obx_info("partitions revoked (%d)", parts->cnt);
  } else if (rerr == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    worker_offsets_clear(&w->offsets);
    w->generation++;
    rd_kafka_assign(rk, parts);
    obx_info("partitions assigned (%d)", parts->cnt);
  } else {
    rd_kafka_assign(rk, NULL);
  }
}

static void kafka_update_lag(obx_worker_t *w) {
  rd_kafka_topic_partition_list_t *parts = NULL;
  if (rd_kafka_assignment(w->rk, &parts) || !parts) return;
  rd_kafka_position(w->rk, parts);
  int64_t lag = 0;
  for (int i = 0; i < parts->cnt; i++) {
    int64_t lo, hi;
    if (rd_kafka_get_watermark_offsets(w->rk, parts->elems[i].topic, parts->elems[i].partition, &lo, &hi)) continue;
    int64_t pos = parts->elems[i].offset >= 0 ? parts->elems[i].offset : lo;
    if (hi > pos) lag += hi - pos;
  }
  set_lag(w, lag);
  rd_kafka_topic_partition_list_destroy(parts);
}

static void kafka_dispatch(obx_worker_t *w, const rd_kafka_message_t *rkm) {
  job_t *job = calloc(1, sizeof *job);
  assert(job);
  job->source = WORKER_SOURCE_KAFKA;
  job->partition = rkm->partition;
  job->offset = rkm->offset;
  job->generation = w->generation;
  obx_ce_header_t hdrs[OBX_LADDER_MAX_HEADERS];
  int n = 0;
  rd_kafka_headers_t *kh = NULL;
  if (rd_kafka_message_headers(rkm, &kh) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char *name;
    const void *val;
    size_t size;
    for (size_t i = 0; n < OBX_LADDER_MAX_HEADERS && !rd_kafka_header_get_all(kh, i, &name, &val, &size); i++)
      hdrs[n++] = (obx_ce_header_t){name, val, size};
  }
  obx_ladder_msg_init(&job->msg);
  obx_ladder_msg_from_record(&job->msg, NULL, rkm->key, rkm->key_len, rkm->payload, rkm->len, hdrs, n);
  char src[256];
  snprintf(src, sizeof src, "%s/%" PRId32 "/%" PRId64, w->conf->kafka_topic, rkm->partition, rkm->offset);
  job->msg.source = strdup(src);
  count_consumed(w, WORKER_SOURCE_KAFKA);
  worker_offsets_add(&w->offsets, rkm->partition, rkm->offset);
  if (!lane_push(w, job)) job_free(job); /* stopping: not committed, redelivered later */
}

static void *kafka_main(void *arg) {
  obx_worker_t *w = arg;
  pthread_setname_np(pthread_self(), "obx-kafka");
  obx_log_set_role("worker");
  int64_t last_lag = 0, last_recommit = obx_time_now_ms();
  while (!atomic_load(&w->stop)) {
    rd_kafka_message_t *rkm = rd_kafka_consumer_poll(w->rk, 100);
    if (rkm) {
      if (!rkm->err) kafka_dispatch(w, rkm);
      else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        obx_warn("kafka consumer: %s", rd_kafka_message_errstr(rkm));
      rd_kafka_message_destroy(rkm);
    }
    kafka_commit_done(w, false);
    int64_t now = obx_time_now_ms();
    if (now - last_lag >= 2000) {
      kafka_update_lag(w);
      last_lag = now;
    }
    if (now - last_recommit >= 5000) {
      /* Asynchronous commits can fail unseen (broker away): repeat the current points. */
      int max = w->offsets.n ? w->offsets.n : 1;
      int32_t parts[max];
      int64_t next[max];
      kafka_commit(w, parts, next, worker_offsets_points(&w->offsets, parts, next, max), false);
      last_recommit = now;
    }
  }
  return NULL;
}

static bool kafka_start(obx_worker_t *w, obx_err_t *err) {
  char errstr[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  struct {
    const char *k, *v;
  } props[] = {
    {"bootstrap.servers", w->conf->kafka_brokers}, {"group.id", w->conf->worker_group},
    {"enable.auto.commit", "false"},                {"enable.auto.offset.store", "false"},
    {"auto.offset.reset", "earliest"},              {"client.id", "outboxd-worker"},
  };
  for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)
    if (rd_kafka_conf_set(kc, props[i].k, props[i].v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) goto conf_fail;
  for (int i = 0; i < w->conf->npassthrough; i++) {
    const char *key = w->conf->passthrough[i].key;
    if (strncmp(key, "kafka.", 6) != 0) continue;
    if (rd_kafka_conf_set(kc, key + 6, w->conf->passthrough[i].value, errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
      goto conf_fail;
  }
  rd_kafka_conf_set_rebalance_cb(kc, rebalance_cb);
  rd_kafka_conf_set_opaque(kc, w);
  obx_log_route_kafka(kc);
  w->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, errstr, sizeof errstr);
  if (!w->rk) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, false, "kafka consumer: %s", errstr);
    rd_kafka_conf_destroy(kc); /* rd_kafka_new takes the conf only on success */
    return false;
  }
  rd_kafka_poll_set_consumer(w->rk);
  rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, w->conf->kafka_topic, RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t rerr = rd_kafka_subscribe(w->rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  if (rerr) {
    obx_err_from_kafka(err, rerr, "subscribe");
    return false;
  }
  if (pthread_create(&w->kafka_thread, NULL, kafka_main, w) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the Kafka thread");
    return false;
  }
  w->kafka_running = true;
  return true;
conf_fail:
  obx_err_set(err, OBX_ERR_CONF, 0, false, "kafka consumer config: %s", errstr);
  rd_kafka_conf_destroy(kc);
  return false;
}

/* ---- work queue ----------------------------------------------------------------------------- */

static void wq_settle(obx_worker_t *w) {
  pthread_mutex_lock(&w->done_mu);
  job_t *list = w->wq_done;
  w->wq_done = NULL;
  pthread_mutex_unlock(&w->done_mu);
  for (job_t *job = list, *next; job; job = next) {
    next = job->next;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = job->outcome == WORKER_INFRA ? obx_ladder_consumer_nack(w->wq, &job->msg, true, &err)
                                           : obx_ladder_consumer_ack(w->wq, &job->msg, &err);
    if (!ok) obx_warn("settling a work queue message failed (it will be redelivered): %s", err.msg);
    job_free(job);
  }
}

static void *wq_main(void *arg) {
  obx_worker_t *w = arg;
  pthread_setname_np(pthread_self(), "obx-workq");
  obx_log_set_role("worker");
  int64_t last_warn = 0, last_parked = 0, last_tick = 0;
  while (!atomic_load(&w->stop)) {
    wq_settle(w);
    if (obx_time_now_ms() - last_tick >= 1000) { /* in every mode: heartbeats, reconnects */
      obx_ladder_tick(w->ladder);
      last_tick = obx_time_now_ms();
    }
    if (obx_time_now_ms() - last_parked >= 5000) {
      last_parked = obx_time_now_ms();
      mongoc_client_t *client = obx_mongo_pop(w->mongo);
      int64_t n = -1;
      obx_err_t err = OBX_ERR_INIT;
      if (obx_inbox_count_parked(client, w->db, w->consumer, &n, &err)) set_parked(w, n);
      obx_mongo_push(w->mongo, client);
    }
    job_t *job = calloc(1, sizeof *job);
    assert(job);
    job->source = WORKER_SOURCE_WORK;
    obx_ladder_msg_init(&job->msg);
    bool got = false;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ladder_consumer_next(w->wq, &job->msg, 200, &got, &err)) {
      if (obx_time_now_ms() - last_warn > 10000) {
        obx_warn("work queue: %s", err.msg);
        last_warn = obx_time_now_ms();
      }
      job_free(job);
      nap(w, 200);
      continue;
    }
    if (!got) {
      job_free(job);
      continue;
    }
    count_consumed(w, WORKER_SOURCE_WORK);
    if (!lane_push(w, job)) job_free(job); /* unacked: redelivered */
  }
  wq_settle(w);
  return NULL;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

obx_worker_t *obx_worker_new(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  obx_worker_t *w = calloc(1, sizeof *w);
  assert(w);
  w->conf = conf;
  w->consumer = conf->worker_group;
  w->max_attempts = (int)conf->order_post_attempts;
  w->nlanes = (int)conf->order_post_concurrency;
  pthread_once(&metrics_once, metrics_register);
  atomic_store(&w->stats.lag, -1);
  atomic_store(&w->stats.parked_keys, -1);
  pthread_mutex_init(&w->done_mu, NULL);
  bool http_mode = strcmp(conf->worker_source, "http") == 0;
  if (http_mode && !http) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "WORKER_SOURCE=http needs the HTTP server");
    goto fail;
  }
  if (!(w->mongo = obx_mongo_new(conf, err))) goto fail;
  w->db = obx_mongo_db_name(w->mongo);
  w->pipelines = obx_pipeline_cache_new(conf->pipeline_cache_ttl);
  if (!obx_egress_init_conf(&w->egress, conf, err)) goto fail;
  w->egress_ok = true;
  w->ladder_opts = (obx_ladder_opts_t){.url = conf->amqp_url, .prefix = conf->worker_queue_prefix,
                                       .tiers_ms = conf->retry_ladder.ms, .ntiers = conf->retry_ladder.n};
  obx_amqp_settings_from_conf(&w->ladder_opts.amqp, conf);
  if (!(w->ladder = obx_ladder_new(&w->ladder_opts, err))) goto fail;
  obx_err_t soft = OBX_ERR_INIT;
  if (!obx_ladder_connect(w->ladder, &soft)) obx_warn("RabbitMQ not reachable yet (%s); will retry", soft.msg);
  if (!obx_inbox_ensure_indexes(w->mongo, conf->inbox_retention, &soft))
    obx_warn("inbox indexes not created yet (%s); will retry", soft.msg);
  if (!(w->wq = obx_ladder_consumer_new(&w->ladder_opts, 2 * w->nlanes, err))) goto fail;

  w->lanes = calloc((size_t)w->nlanes, sizeof *w->lanes);
  assert(w->lanes);
  for (int i = 0; i < w->nlanes; i++) {
    lane_t *lane = &w->lanes[i];
    lane->worker = w;
    lane->index = i;
    pthread_mutex_init(&lane->mu, NULL);
    pthread_cond_init(&lane->nonempty, NULL);
    pthread_cond_init(&lane->nonfull, NULL);
    if (pthread_create(&lane->thread, NULL, lane_main, lane) != 0) {
      obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start lane %d", i);
      w->nlanes = i;
      goto fail;
    }
  }
  if (pthread_create(&w->wq_thread, NULL, wq_main, w) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the work queue thread");
    goto fail;
  }
  w->wq_running = true;
  if (http_mode) worker_http_register(w, http, w->mongo);
  else if (!kafka_start(w, err)) goto fail;
  obx_info("worker started: %s source, %d lanes, %d attempts, %d retry tiers, consumer %s",
           http_mode ? "http" : "kafka", w->nlanes, w->max_attempts, conf->retry_ladder.n, w->consumer);
  return w;
fail:
  obx_worker_destroy(w);
  return NULL;
}

void obx_worker_destroy(obx_worker_t *w) {
  if (!w) return;
  atomic_store(&w->stop, true);
  for (int i = 0; i < w->nlanes; i++) {
    pthread_mutex_lock(&w->lanes[i].mu);
    pthread_cond_broadcast(&w->lanes[i].nonempty);
    pthread_cond_broadcast(&w->lanes[i].nonfull);
    pthread_mutex_unlock(&w->lanes[i].mu);
  }
  if (w->kafka_running) pthread_join(w->kafka_thread, NULL);
  if (w->wq_running) pthread_join(w->wq_thread, NULL);
  for (int i = 0; i < w->nlanes; i++) pthread_join(w->lanes[i].thread, NULL);
  if (w->rk) {
    kafka_commit_done(w, true);
    rd_kafka_consumer_close(w->rk);
    rd_kafka_destroy(w->rk);
  }
  worker_offsets_clear(&w->offsets);
  if (w->wq) wq_settle(w);
  for (int i = 0; i < w->nlanes; i++) {
    for (job_t *job = w->lanes[i].head, *next; job; job = next) {
      next = job->next;
      if (job->source == WORKER_SOURCE_HTTP) {
        job->outcome = WORKER_INFRA;
        complete(w, job);
      } else {
        job_free(job);
      }
    }
    pthread_mutex_destroy(&w->lanes[i].mu);
    pthread_cond_destroy(&w->lanes[i].nonempty);
    pthread_cond_destroy(&w->lanes[i].nonfull);
  }
  for (job_t *job = w->kafka_done, *next; job; job = next) {
    next = job->next;
    job_free(job);
  }
  free(w->lanes);
  obx_ladder_consumer_destroy(w->wq);
  obx_ladder_destroy(w->ladder);
  if (w->egress_ok) obx_egress_cleanup(&w->egress);
  obx_pipeline_cache_destroy(w->pipelines);
  obx_mongo_destroy(w->mongo);
  pthread_mutex_destroy(&w->done_mu);
  free(w);
}

void obx_worker_stats(obx_worker_t *w, obx_worker_stats_t *s) {
  memset(s, 0, sizeof *s);
  s->consumed = atomic_load(&w->stats.consumed);
  s->duplicates = atomic_load(&w->stats.duplicates);
  s->malformed = atomic_load(&w->stats.malformed);
  s->runs_succeeded = atomic_load(&w->stats.runs_succeeded);
  s->runs_failed = atomic_load(&w->stats.runs_failed);
  s->runs_skipped = atomic_load(&w->stats.runs_skipped);
  s->blocked = atomic_load(&w->stats.blocked);
  for (int i = 0; i < OBX_CONF_MAX_LIST; i++) s->retries[i] = atomic_load(&w->stats.retries[i]);
  s->dlq = atomic_load(&w->stats.dlq);
  s->lag = atomic_load(&w->stats.lag);
  s->parked_keys = atomic_load(&w->stats.parked_keys);
}

bool worker_enqueue_http(obx_worker_t *w, obx_ladder_msg_t *msg, worker_http_wait_t *wait) {
  job_t *job = calloc(1, sizeof *job);
  assert(job);
  job->source = WORKER_SOURCE_HTTP;
  job->msg = *msg; /* ownership moves to the job */
  obx_ladder_msg_init(msg);
  job->wait = wait;
  count_consumed(w, WORKER_SOURCE_HTTP);
  if (lane_push(w, job)) return true;
  *msg = job->msg;
  free(job);
  return false;
}

void *obx_worker_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  return obx_worker_new(conf, http, err);
}

void obx_worker_stop(void *worker) { obx_worker_destroy(worker); }
