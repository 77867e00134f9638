/* worker.c - the worker role: Kafka / work queue / HTTP sink -> inbox -> pipeline -> ladder
 *
 * DESIGN: see include/obx/obx_worker.h. The Kafka thread owns the consumer, the per-partition
 * offset bookkeeping (offsets.c) and the paused partitions; the work-queue thread owns the AMQP
 * consumer and settles its messages; the runner threads (sched.c) own nothing but the event they
 * run (worker_handle). Every source turns its input into an envelope (obx_ladder_msg_t: the
 * CloudEvent in binary form), so the retry tiers, the DLQ and the inbox see one shape. Reads
 * mongo.*, kafka.*, amqp.url, worker.*, inbox.retention, egress.*, pipelines.cache_ttl (the same
 * enabled-pipeline cache as the api's order.pre lookup). */
#include "obx/obx_worker.h"

#include <assert.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obx/obx_event.h"
#include "obx/obx_health.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ladder.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_schema.h"
#include "obx/obx_trace.h"
#include "worker_int.h"

#define KEY_QUEUE_CAP 64  /* events of one key held before its partition is paused */
#define INFRA_BACKOFF_MIN_MS 100
#define INFRA_BACKOFF_MAX_MS 5000
#define REVOKE_DRAIN_MS 30000
#define LOST_KEYS 64 /* keys remembered after their claim was taken over (run_job) */

/* ---- jobs ------------------------------------------------------------------------------ */

typedef worker_job_t job_t;

typedef struct {
  int32_t partition;
  char *key;      /* the key whose queue was full (or the last one pushed when the bound was) */
  size_t len;
} paused_t;

struct obx_worker {
  const obx_conf_t *conf;
  worker_sink_t *sink;      /* http mode: the CloudEvents sink (sink.c) */
  const char *consumer;     /* inbox consumer name = WORKER_GROUP */
  const char *db;
  int max_attempts;
  int infra_attempts;       /* WORKER_INFRA_ATTEMPTS */
  char owner[128];          /* this process's name on its inbox claims: host:pid:uuid */
  const char *member;       /* WORKER_INSTANCE_ID when set: claims of a restarted process of it are its own */
  int64_t lease_ms;         /* WORKER_LEASE */
  pthread_mutex_t claims_mu; /* the events this process runs now (their leases are renewed) */
  char (*claims)[OBX_UUID_LEN + 1];
  struct {
    char *key;
    size_t len;
    uint64_t generation;
  } lost[LOST_KEYS];        /* keys whose claim was taken over (run_job), under claims_mu */
  int nlost;
  int nclaims, claims_cap;
  int64_t infra_timeout_ms; /* WORKER_INFRA_TIMEOUT */
  obx_mongo_t *mongo;
  obx_schema_guard_t *schema; /* runners start once the worker's collections and indexes exist */
  obx_ladder_t *ladder;
  obx_ladder_opts_t ladder_opts;
  obx_egress_t egress;
  bool egress_ok;
  obx_pipeline_cache_t *pipelines; /* enabled pipeline per (org, trigger), PIPELINES_CACHE_TTL */

  worker_sched_t *sched;    /* per-key queues and the runner threads (sched.c) */
  int nrunners;             /* ORDER_POST_CONCURRENCY */
  int max_inflight;         /* WORKER_MAX_INFLIGHT */
  atomic_bool stop;
  atomic_int assigned;      /* partitions of the last assignment; -1 until the group is joined */

  rd_kafka_t *rk;
  pthread_t kafka_thread;
  bool kafka_running;
  worker_offsets_t offsets; /* Kafka thread only */
  int kafka_jobs;           /* Kafka thread only: dispatched, not yet taken back */
  paused_t *paused;         /* Kafka thread only: partitions paused by a full key or bound */
  int npaused;
  uint64_t generation;      /* bumped on every rebalance; Kafka thread writes, jobs carry it */

  obx_ladder_consumer_t *wq;
  pthread_t wq_thread;
  bool wq_running;

  pthread_mutex_t done_mu;  /* completions handed back by the runners */
  job_t *kafka_done, *wq_done;

  worker_stats_t stats;
  obx_ops_drain_t *drain; /* parking-lot queue -> dead_letters (src/ops/ops_drain.c) */
};

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

/* Queues a job behind the earlier ones of its key (never blocks); *key_depth and *inflight
 * (may be NULL) receive the key's depth and the worker's events in flight after the push. */
static void sched_push(obx_worker_t *w, job_t *job, int *key_depth, int *inflight) {
  size_t klen;
  const char *key = msg_partition_key(&job->msg, &klen);
  worker_sched_push(w->sched, job, key, klen, key_depth, inflight);
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
  obx_gauge_t *lag, *parked, *paused;
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
  metrics.paused = obx_metrics_gauge("outboxd_worker_paused_partitions",
                                     "Kafka partitions paused because a key's queue or the in-flight bound is full", NULL);
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

static void set_paused_gauge(obx_worker_t *w) {
  atomic_store(&w->stats.paused_partitions, w->npaused);
  obx_gauge_set(metrics.paused, (double)w->npaused);
}

static void count_outcome(obx_worker_t *w, worker_outcome_t outcome) {
  switch (outcome) {
  case WORKER_DUPLICATE:
  case WORKER_LOST:
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

/* ---- keys whose claim was lost: after a pause (SIGSTOP, a stall past the lease) the Kafka
 * thread learns that its partitions moved only at its next poll, while the runner of a key would
 * go on with the key's next queued record. A key whose claim was taken over is remembered with
 * its assignment generation; its next records of that generation wait while a peer holds a live
 * claim on an event of the key (bounded by two leases), so none runs before the peer's earlier
 * event of the key is settled. */

/* Whether (key, generation) is remembered; with add, remembers it (the oldest goes). */
static bool lost_key(obx_worker_t *w, const char *key, size_t len, uint64_t generation, bool add) {
  bool found = false;
  pthread_mutex_lock(&w->claims_mu);
  for (int i = 0; i < LOST_KEYS && !found; i++)
    found = w->lost[i].key && w->lost[i].generation == generation && w->lost[i].len == len &&
            memcmp(w->lost[i].key, key, len) == 0;
  if (add && !found) {
    int i = w->nlost++ % LOST_KEYS;
    free(w->lost[i].key);
    w->lost[i].key = malloc(len + 1);
    assert(w->lost[i].key);
    memcpy(w->lost[i].key, key, len);
    w->lost[i].key[len] = '\0';
    w->lost[i].len = len;
    w->lost[i].generation = generation;
  }
  pthread_mutex_unlock(&w->claims_mu);
  return found;
}

static void wait_key_elsewhere(obx_worker_t *w, const char *key) {
  mongoc_client_t *client = obx_mongo_pop(w->mongo);
  int64_t deadline = obx_time_now_ms() + 2 * w->lease_ms, backoff = INFRA_BACKOFF_MIN_MS;
  bool claimed = true, logged = false;
  obx_err_t err = OBX_ERR_INIT;
  while (obx_time_now_ms() < deadline &&
         obx_inbox_key_claimed_elsewhere(client, w->db, w->consumer, key, w->owner, &claimed, &err) && claimed) {
    if (!logged) obx_info("key %.64s: a peer runs an event of it after this process lost a claim: waiting", key);
    logged = true;
    obx_health_stamp("waiting for a peer's event of the key");
    if (!nap_backoff(w, &backoff)) break;
  }
  obx_mongo_push(w->mongo, client);
}

/* The runners' callback (sched.c): one event end to end, then its outcome back to its source.
 * Nothing runs before the worker's collections and indexes exist (the schema guard); an HTTP
 * event is answered 503 meanwhile (the sender delivers again). worker_handle bounds its own
 * retries: it returns WORKER_INFRA only when the event could be put nowhere (or the worker
 * stops), and the source then gives it back. */
static void run_job(void *ctx, job_t *job) {
  obx_worker_t *w = ctx;
  job->outcome = WORKER_INFRA;
  while (!obx_schema_guard_wait(w->schema, 100)) {
    if (atomic_load(&w->stop) || job->source == WORKER_SOURCE_HTTP) goto done; /* HTTP: 503, sent again */
    obx_health_stamp("waiting for the schema");
  }
  size_t klen;
  const char *k = msg_partition_key(&job->msg, &klen);
  char *key = strndup(k, klen); /* the run may change the envelope's headers */
  assert(key);
  klen = strlen(key);
  if (job->source == WORKER_SOURCE_KAFKA && lost_key(w, key, klen, job->generation, false)) wait_key_elsewhere(w, key);
  job->outcome = job->source == WORKER_SOURCE_KAFKA
                   ? worker_handle(w, job->source, &job->msg, job->partition, job->offset)
                   : worker_handle(w, job->source, &job->msg, -1, -1);
  if (job->source == WORKER_SOURCE_KAFKA && job->outcome == WORKER_LOST) lost_key(w, key, klen, job->generation, true);
  free(key);
  count_outcome(w, job->outcome);
done:
  complete(w, job);
}

/* ---- claims: the events this process runs, their leases renewed by the work-queue thread ---- */

static void claims_add(obx_worker_t *w, const char *id) {
  pthread_mutex_lock(&w->claims_mu);
  if (w->nclaims == w->claims_cap) {
    w->claims_cap = w->claims_cap ? w->claims_cap * 2 : 16;
    w->claims = realloc(w->claims, (size_t)w->claims_cap * sizeof *w->claims);
    assert(w->claims);
  }
  snprintf(w->claims[w->nclaims++], OBX_UUID_LEN + 1, "%s", id);
  pthread_mutex_unlock(&w->claims_mu);
}

static void claims_remove(obx_worker_t *w, const char *id) {
  pthread_mutex_lock(&w->claims_mu);
  for (int i = 0; i < w->nclaims; i++)
    if (strcmp(w->claims[i], id) == 0) {
      memcpy(w->claims[i], w->claims[--w->nclaims], sizeof w->claims[i]);
      break;
    }
  pthread_mutex_unlock(&w->claims_mu);
}

/* Extends the leases of every event this process runs (one write; a third of the lease apart). */
static void claims_renew(obx_worker_t *w, mongoc_client_t *client) {
  pthread_mutex_lock(&w->claims_mu);
  int n = w->nclaims;
  char(*copy)[OBX_UUID_LEN + 1] = n ? malloc((size_t)n * sizeof *copy) : NULL;
  if (n) memcpy(copy, w->claims, (size_t)n * sizeof *copy);
  pthread_mutex_unlock(&w->claims_mu);
  if (!n) return;
  const char **ids = malloc((size_t)n * sizeof *ids);
  assert(ids);
  for (int i = 0; i < n; i++) ids[i] = copy[i];
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_renew(client, w->db, w->consumer, w->owner, ids, n, w->lease_ms, &err))
    obx_warn("renewing %d claims failed (a peer may take them over after the lease): %s", n, err.msg);
  free(ids);
  free(copy);
}

/* ---- bounded steps ------------------------------------------------------------------------ */

typedef enum {
  STEP_OK,
  STEP_FAILED,    /* non-retriable error: retrying cannot help */
  STEP_EXHAUSTED, /* retriable, but WORKER_INFRA_ATTEMPTS tries or WORKER_INFRA_TIMEOUT are spent */
  STEP_STOPPED,   /* the worker stops */
} step_result_t;

typedef bool (*step_fn)(void *ctx, obx_err_t *err);

/* Runs one step of an event until it succeeds, fails for good, spends its bounds or the worker
 * stops. tries caps the tries below the configured bound (1: no retry, the HTTP sink's caller
 * retries itself). A step after the pipeline ran (`finish`) is not abandoned by a stop before its
 * bounds: its retries only ever repeat the recording, never the run. */
static step_result_t retry_step(obx_worker_t *w, const char *what, const char *event_id, step_fn fn, void *ctx,
                                int tries, bool finish, obx_err_t *err) {
  int64_t backoff = INFRA_BACKOFF_MIN_MS, since = obx_time_now_ms();
  int max = tries > 0 && tries < w->infra_attempts ? tries : w->infra_attempts;
  for (int n = 1;; n++) {
    obx_health_stamp(what); /* a runner retrying a step goes round */
    obx_err_clear(err);
    if (fn(ctx, err)) return STEP_OK;
    if (!err->retriable) {
      obx_log_event(OBX_LOG_WARN, event_id, NULL, "%s failed (not retriable): %s", what, err->msg);
      return STEP_FAILED;
    }
    /* A stopping worker gives a finishing step three tries more at most: shutdown is bounded. */
    if (n >= max || obx_time_now_ms() - since >= w->infra_timeout_ms || (finish && atomic_load(&w->stop) && n >= 3)) {
      obx_log_event(OBX_LOG_WARN, event_id, NULL, "%s failed %d times in %" PRId64 " ms, giving up: %s", what, n,
                    obx_time_now_ms() - since, err->msg);
      return STEP_EXHAUSTED;
    }
    obx_log_event(OBX_LOG_WARN, event_id, NULL, "%s failed (try %d of %d), retrying: %s", what, n, max, err->msg);
    if (finish && atomic_load(&w->stop)) {
      struct timespec ts = {0, backoff * 1000000L};
      nanosleep(&ts, NULL);
      backoff = backoff * 2 > INFRA_BACKOFF_MAX_MS ? INFRA_BACKOFF_MAX_MS : backoff * 2;
    } else if (!nap_backoff(w, &backoff)) {
      if (!finish) return STEP_STOPPED;
    }
  }
}

#define PUBLISH_DLQ (-1)
#define PUBLISH_WORK (-2)

typedef struct {
  obx_worker_t *w;
  const obx_ladder_msg_t *msg;
  int tier; /* retry tier, PUBLISH_DLQ or PUBLISH_WORK */
} publish_t;

static bool publish_step(void *ctx, obx_err_t *err) {
  publish_t *p = ctx;
  return p->tier >= 0 ? obx_ladder_publish_retry(p->w->ladder, p->msg, p->tier, err)
         : p->tier == PUBLISH_DLQ ? obx_ladder_publish_dlq(p->w->ladder, p->msg, err)
                                  : obx_ladder_publish_work(p->w->ladder, p->msg, err);
}

static step_result_t publish(obx_worker_t *w, const obx_ladder_msg_t *msg, int tier, obx_err_t *err) {
  publish_t p = {.w = w, .msg = msg, .tier = tier};
  const char *what = tier >= 0 ? "publish to the retry tier" : tier == PUBLISH_DLQ ? "publish to the DLQ"
                                                                                   : "publish to the work queue";
  return retry_step(w, what, msg->message_id, publish_step, &p, 0, true, err);
}

/* ---- the event's lifecycle ---------------------------------------------------------------- */

typedef enum {
  CLAIM_TAKEN, /* this process holds the claim */
  CLAIM_LIVE,  /* a live peer holds it */
  CLAIM_MOVED, /* the entry is no longer in the status (or attempt) it was met in */
} claim_t;

/* One event on its way through worker_handle: what it is, where it came from, what happened. */
typedef struct {
  obx_worker_t *w;
  worker_source_t source;
  obx_ladder_msg_t *msg;   /* the envelope; attempts, reason and history are updated on it */
  obx_event_t ev;          /* decoded */
  mongoc_client_t *client;
  obx_inbox_entry_t entry;
  const char *names[OBX_LADDER_MAX_HEADERS], *values[OBX_LADDER_MAX_HEADERS];
  bool claimed;            /* an inbox entry exists for it and this process holds its claim */
  obx_inbox_cas_t cas;     /* that claim: every status write of this run is conditional on it */
  claim_t claim;
  char holder[128];        /* CLAIM_LIVE: the peer */
  /* admit */
  bool blocked, inserted;
  obx_inbox_status_t existing;
  char head[OBX_UUID_LEN + 1];
  /* lookup */
  obx_pipeline_t *pipeline;
  char trigger[160];
} event_t;

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
static void ensure_message_id(obx_ladder_msg_t *msg, const obx_event_t *ev) {
  if (!msg->message_id) {
    const char *id = ev && ev->id[0] ? ev->id : obx_ladder_msg_header(msg, "ce_id");
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
static worker_outcome_t dead_letter(event_t *e, const char *failure_class, const char *cause, bool attempted) {
  obx_worker_t *w = e->w;
  obx_ladder_msg_t *msg = e->msg;
  const obx_event_t *ev = e->ev.id[0] ? &e->ev : NULL;
  if (!attempted) obx_ladder_msg_fail(msg, failure_class, cause, obx_time_now_ms());
  free(msg->failure_class);
  msg->failure_class = strdup(failure_class);
  char original[OBX_LADDER_MAX_NAME + 80] = "";
  const char *ce_id = obx_ladder_msg_header(msg, "ce_id");
  ensure_message_id(msg, ev);
  if (ce_id && strcmp(ce_id, msg->message_id) != 0)
    snprintf(original, sizeof original, "; message id %s generated (the record's ce_id is %zu bytes%s)",
             msg->message_id, strlen(ce_id), bson_utf8_validate(ce_id, strlen(ce_id), false) ? "" : ", not UTF-8");
  char notes[512], reason[2000];
  obx_ladder_msg_carry_notes(msg, notes, sizeof notes);
  snprintf(reason, sizeof reason, "%s%s%s%s", cause, original, notes[0] ? "; " : "", notes);
  free(msg->reason);
  msg->reason = strdup(reason);
  obx_log_event(OBX_LOG_WARN, msg->message_id, ev ? ev->correlation_id : NULL, "dead-lettered (%s): %s",
                failure_class, reason);

  obx_err_t err = OBX_ERR_INIT;
  step_result_t published = publish(w, msg, PUBLISH_DLQ, &err);
  if (published == STEP_OK) count_dlq(w, failure_class);
  if (!e->claimed) return published == STEP_OK ? WORKER_DEAD : WORKER_INFRA;
  char stored[2400];
  snprintf(stored, sizeof stored, "%s%s%s", reason, published == STEP_OK ? "" : "; not in the DLQ: ",
           published == STEP_OK ? "" : err.msg);
  dead_txn_t t = {.w = w, .ev = &e->ev, .cas = &e->cas, .attempts = msg->attempt, .reason = stored};
  step_result_t recorded = retry_step(w, "recording DEAD", e->ev.id, dead_step, &t, 0, true, &err);
  if (recorded != STEP_OK && published != STEP_OK) return WORKER_INFRA;
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
  obx_err_t err = OBX_ERR_INIT;
  step_result_t r = retry_step(e->w, "recording the outcome", e->ev.id, outcome_step, t, 0, true, &err);
  if (r == STEP_OK) return outcome;
  if (err.domain == OBX_ERR_CONFLICT) {
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id, "%s; this run's outcome is not recorded", err.msg);
    return WORKER_LOST;
  }
  char cause[700];
  snprintf(cause, sizeof cause, "recording the outcome (%s) failed: %s", obx_inbox_status_name(t->status), err.msg);
  if (dlq_published) { /* the DLQ has it already: only the inbox is left to say DEAD */
    dead_txn_t d = {.w = e->w, .ev = &e->ev, .cas = &e->cas, .attempts = e->msg->attempt, .reason = cause};
    return retry_step(e->w, "recording DEAD", e->ev.id, dead_step, &d, 0, true, &err) == STEP_OK ? WORKER_DEAD
                                                                                                   : outcome;
  }
  return dead_letter(e, r == STEP_FAILED ? "terminal" : "infra", cause, outcome == WORKER_RETRYING);
}

/* A transient failure with attempts left goes up the ladder, intent first: one transaction
 * records the run, RETRYING with the attempt number and the parked key (compare-and-set on the
 * claim); then the confirmed publish to the tier; then retrySent. A copy is therefore never on a
 * tier before its attempt is recorded, so it cannot run early; a copy of an attempt the entry no
 * longer records never runs (obx_inbox_take). When the process stops between the commit and the
 * publish, the next delivery of the event finds the intent unsent past its lease and publishes
 * it (resend_intent). When the tier cannot be reached within the bounds, the DLQ. */
static worker_outcome_t retry(event_t *e, outcome_txn_t *t, int attempt, const char *error) {
  obx_worker_t *w = e->w;
  t->status = OBX_INBOX_RETRYING;
  worker_outcome_t outcome = record(e, t, WORKER_RETRYING, false);
  if (outcome != WORKER_RETRYING) return outcome; /* not this run's any more, or dead-lettered */
  obx_err_t err = OBX_ERR_INIT;
  int tier = attempt - 1;
  if (publish(w, e->msg, tier, &err) != STEP_OK) {
    char cause[700];
    snprintf(cause, sizeof cause, "attempt %d failed (%s) and the retry tier cannot be reached: %s", attempt, error,
             err.msg);
    free(e->msg->reason);
    e->msg->reason = NULL;
    return dead_letter(e, "infra", cause, true); /* DEAD from this run's unsent RETRYING */
  }
  int ntiers = obx_ladder_ntiers(w->ladder);
  count_retry(w, tier < ntiers ? tier : ntiers - 1);
  obx_log_event(OBX_LOG_INFO, e->ev.id, e->ev.correlation_id, "attempt %d failed (transient: %s); retry tier %d",
                attempt, error, tier + 1);
  if (!obx_inbox_retry_sent(e->client, w->db, w->consumer, e->ev.id, attempt, &err))
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

/* Runs the pipeline of the event once and settles it: recorded, retried on a tier, or in the DLQ. */
static worker_outcome_t run_event(event_t *e) {
  obx_worker_t *w = e->w;
  obx_ladder_msg_t *msg = e->msg;
  const obx_event_t *ev = &e->ev;
  worker_outcome_t outcome = WORKER_INFRA;
  obx_err_t err = OBX_ERR_INIT;
  obx_pipeline_run_t *run = NULL;
  bson_t ctx = BSON_INITIALIZER;
  obx_pipeline_trigger_for_event(ev->event_type, e->trigger, sizeof e->trigger);
  int attempt = msg->attempt + 1;

  step_result_t looked = retry_step(w, "pipeline lookup", ev->id, lookup_step, e,
                                    e->source == WORKER_SOURCE_HTTP ? 1 : 0, false, &err);
  if (looked == STEP_STOPPED || (looked == STEP_EXHAUSTED && e->source == WORKER_SOURCE_HTTP)) goto done;
  if (looked != STEP_OK) {
    char cause[600];
    snprintf(cause, sizeof cause, "pipeline lookup failed: %s", err.msg);
    outcome = dead_letter(e, looked == STEP_FAILED ? "terminal" : "infra", cause, false);
    goto done;
  }
  outcome_txn_t t = {.w = w, .ev = ev, .cas = &e->cas, .attempts = attempt};
  bool dlq_published = false;
  if (!e->pipeline) {
    t.status = OBX_INBOX_SKIPPED;
    t.attempts = msg->attempt;
    outcome = WORKER_SKIPPED;
  } else {
    obx_pipeline_context_from_event(ev, &ctx);
    obx_pipeline_input_t in = {.context = &ctx, .org_id = ev->org_id, .trigger = e->trigger, .event_id = ev->id,
                               .correlation_id = ev->correlation_id, .aggregate_type = ev->aggregate_type,
                               .aggregate_id = ev->aggregate_id, .partition_key = ev->partition_key,
                               .replay_id = e->source == WORKER_SOURCE_WORK ? msg->replay_id : NULL,
                               .attempt = attempt};
    run = obx_pipeline_execute(e->pipeline, &in, &w->egress);
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
      outcome = dead_letter(e, fclass, cause, true);
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
  outcome = record(e, &t, outcome, dlq_published);
done:
  obx_pipeline_run_destroy(run);
  bson_destroy(&ctx);
  return outcome;
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

/* Takes the claim of an entry met in `existing`. A retry tier's copy (work queue, attempt > 0,
 * not an operator's replay) runs only when its attempt is the one the entry records: a stale or
 * early copy never runs. When the claim is not taken, the entry tells whether a live peer runs it
 * (RECEIVED or PROCESSING under a lease that is not past) or it moved on. */
static bool take_step(void *ctx, obx_err_t *err) {
  event_t *e = ctx;
  obx_worker_t *w = e->w;
  bool tier_copy = e->source == WORKER_SOURCE_WORK && e->msg->attempt > 0 && !e->msg->replay_id;
  bool taken = false;
  if (!obx_inbox_take(e->client, w->db, w->consumer, e->ev.id, w->owner, w->member, w->lease_ms, e->existing,
                      tier_copy ? e->msg->attempt : -1, e->msg->attempt, &taken, err))
    return false;
  e->claim = CLAIM_TAKEN;
  if (taken) return true;
  bson_t doc = BSON_INITIALIZER;
  bool found = false;
  bool ok = obx_inbox_get(e->client, w->db, NULL, w->consumer, e->ev.id, &doc, &found, err);
  bson_iter_t it;
  int64_t until = found && bson_iter_init_find(&it, &doc, "leaseUntil") && BSON_ITER_HOLDS_DATE_TIME(&it)
                    ? bson_iter_date_time(&it) : 0;
  const char *holder = found ? obx_mongo_doc_str(&doc, "owner") : NULL, *status = obx_mongo_doc_str(&doc, "status");
  bool running = status && (strcmp(status, obx_inbox_status_name(OBX_INBOX_RECEIVED)) == 0 ||
                            strcmp(status, obx_inbox_status_name(OBX_INBOX_PROCESSING)) == 0);
  e->claim = running && until > obx_time_now_ms() && holder && strcmp(holder, w->owner) != 0 ? CLAIM_LIVE : CLAIM_MOVED;
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
  obx_ladder_msg_fail(e->msg, "transient", last_error ? last_error : "", obx_time_now_ms());
  if (publish(w, e->msg, attempts - 1, &err) != STEP_OK) {
    obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                  "the unsent tier copy of attempt %d cannot be published (%s); the next delivery tries again",
                  attempts, err.msg);
    goto done;
  }
  obx_log_event(OBX_LOG_WARN, e->ev.id, e->ev.correlation_id,
                "attempt %d was recorded RETRYING but its tier copy was never sent: sent now", attempts);
  if (!obx_inbox_retry_sent(e->client, w->db, w->consumer, e->ev.id, attempts, &err))
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
      if (!nap_backoff(w, &backoff)) return WORKER_INFRA;
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
  if (obx_ladder_ntiers(w->ladder) == 0 || publish(w, e->msg, 0, &err) != STEP_OK) return WORKER_INFRA;
  obx_log_event(OBX_LOG_INFO, e->ev.id, e->ev.correlation_id, "sent to the first retry tier to look again later");
  return WORKER_DUPLICATE;
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

/* The raw form of a stored entry that no longer decodes, for the DLQ: its headers, key and
 * payload (as relaxed extended JSON) exactly as stored. */
static void msg_from_entry_raw(obx_ladder_msg_t *msg, const bson_t *doc) {
  obx_ce_header_t headers[OBX_LADDER_MAX_HEADERS];
  int n = 0;
  bson_iter_t it, child;
  if (bson_iter_init_find(&it, doc, "headers") && BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &child))
    while (bson_iter_next(&child) && n < OBX_LADDER_MAX_HEADERS) {
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
  obx_ladder_msg_from_record(msg, obx_mongo_doc_str(doc, "_id.eventId"), key, key ? strlen(key) : 0, json, json_len,
                             headers, n);
  bson_free(json);
}

/* A stored BLOCKED entry that no longer decodes cannot hold its key forever: its raw form goes to
 * the DLQ (class malformed) and the entry says DEAD; the release step then goes on past it. */
static bool dead_letter_entry(obx_worker_t *w, mongoc_client_t *client, const bson_t *doc, const char *id,
                              const char *key, const obx_err_t *cause, obx_err_t *err) {
  obx_ladder_msg_t msg;
  obx_ladder_msg_init(&msg);
  msg_from_entry_raw(&msg, doc);
  char why[700];
  snprintf(why, sizeof why, "blocked entry of key %s does not decode: %s", key, cause->msg);
  event_t e = {.w = w, .source = WORKER_SOURCE_WORK, .msg = &msg, .client = client};
  obx_event_init(&e.ev);
  worker_outcome_t outcome = dead_letter(&e, "malformed", why, false);
  obx_event_cleanup(&e.ev);
  bool ok = outcome == WORKER_DEAD &&
            obx_inbox_set_status(client, w->db, NULL, w->consumer, id, OBX_INBOX_DEAD, -1, msg.reason, NULL, err);
  if (outcome != WORKER_DEAD) obx_err_set(err, OBX_ERR_AMQP, 0, true, "the DLQ cannot be reached");
  obx_ladder_msg_cleanup(&msg);
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
    obx_ladder_msg_t msg;
    obx_ladder_msg_init(&msg);
    bool ok = true, past = false;
    const char *next = obx_mongo_doc_str(&s.next, "_id.eventId");
    snprintf(cur, sizeof cur, "%s", next ? next : "");
    obx_err_t derr = OBX_ERR_INIT;
    if (!obx_inbox_entry_event(&s.next, &ev, &derr) || !obx_ladder_msg_from_event(&msg, &ev, &derr)) {
      ok = dead_letter_entry(w, client, &s.next, cur, key, &derr, err);
      past = ok;
    } else {
      obx_log_event(OBX_LOG_INFO, ev.id, ev.correlation_id, "key %s: next in order after %s", key, done);
      ok = publish(w, &msg, PUBLISH_WORK, err) == STEP_OK;
      /* Not recorded: a redelivered copy of `done` sends it once more (at least once). */
      obx_err_t merr = OBX_ERR_INIT;
      if (ok && !obx_inbox_mark_sent(client, w->db, NULL, w->consumer, key, cur, &merr))
        obx_log_event(OBX_LOG_WARN, ev.id, ev.correlation_id, "recording the send failed: %s", merr.msg);
    }
    obx_ladder_msg_cleanup(&msg);
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
static bool release_if_head(event_t *e) {
  release_t r = {.e = e, .may_resend = e->msg->redelivered};
  obx_err_t err = OBX_ERR_INIT;
  if (retry_step(e->w, "releasing the key", e->ev.id, release_step, &r, 0, false, &err) == STEP_OK) return true;
  obx_warn("key %s is handed on when the message of %s comes back", e->ev.partition_key, e->ev.id);
  return false;
}

/* Header checks the decoder does not make: the inbox stores every header, so each must be a
 * UTF-8 string, and none of the record's may be left behind. */
static bool check_headers(const obx_ladder_msg_t *msg, obx_err_t *err) {
  if (msg->dropped_headers) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%d headers, over the limit of %d",
                msg->nheaders + msg->dropped_headers, OBX_LADDER_MAX_HEADERS);
    return false;
  }
  for (int i = 0; i < msg->nheaders; i++) {
    const obx_ladder_header_t *h = &msg->headers[i];
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

worker_outcome_t worker_handle(obx_worker_t *w, worker_source_t source, obx_ladder_msg_t *msg, int32_t partition,
                               int64_t offset) {
  event_t e = {.w = w, .source = source, .msg = msg};
  obx_event_init(&e.ev);
  obx_err_t err = OBX_ERR_INIT;
  worker_outcome_t outcome = WORKER_INFRA;
  int pre_tries = source == WORKER_SOURCE_HTTP ? 1 : 0; /* the sink's caller retries a 503 itself */

  /* decode: anything that cannot be decoded is dead-lettered as it came (class malformed). */
  if (!obx_ladder_msg_to_event(msg, &e.ev, &err) || !check_headers(msg, &err)) {
    obx_event_cleanup(&e.ev);
    obx_event_init(&e.ev);
    if (source == WORKER_SOURCE_HTTP) return WORKER_MALFORMED;
    atomic_fetch_add(&w->stats.malformed, 1);
    obx_counter_inc(metrics.malformed);
    char cause[600];
    snprintf(cause, sizeof cause, "malformed CloudEvent: %s", err.msg);
    outcome = dead_letter(&e, "malformed", cause, false);
    obx_event_cleanup(&e.ev);
    return outcome;
  }
  if (!msg->message_id) msg->message_id = strdup(e.ev.id); /* the ladder and the DLQ find it by id */
  obx_span_t *span = consume_span(w, source, msg, &e.ev, partition, offset);
  obx_trace_set_current(obx_span_ctx(span)); /* logs, the pipeline's spans and its HTTP calls */
  char traceparent[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(obx_span_ctx(span), traceparent);
  e.client = obx_mongo_pop(w->mongo);
  for (int i = 0; i < msg->nheaders; i++) {
    e.names[i] = msg->headers[i].name;
    e.values[i] = msg->headers[i].value;
  }
  e.entry = (obx_inbox_entry_t){.consumer = w->consumer, .event = &e.ev, .header_names = e.names,
                                .header_values = e.values, .nheaders = msg->nheaders,
                                .seq = offset >= 0 ? offset : obx_time_now_ms(), .traceparent = traceparent,
                                .owner = w->owner, .member = w->member, .lease_ms = w->lease_ms};
  if (source == WORKER_SOURCE_KAFKA) {
    e.entry.topic = w->conf->kafka_topic;
    e.entry.partition = partition;
    e.entry.offset = offset;
  } else {
    e.entry.source_kind = source == WORKER_SOURCE_HTTP ? "http" : "amqp";
  }

  /* claim */
  step_result_t admitted = retry_step(w, "inbox claim", e.ev.id, admit_step, &e, pre_tries, false, &err);
  if (admitted == STEP_STOPPED || (admitted == STEP_EXHAUSTED && source == WORKER_SOURCE_HTTP)) goto done;
  if (admitted != STEP_OK) {
    char cause[600];
    snprintf(cause, sizeof cause, "the inbox cannot store the event: %s", err.msg);
    outcome = dead_letter(&e, admitted == STEP_FAILED ? "malformed" : "infra", cause, false);
    goto done;
  }
  if (e.inserted && e.blocked) {
    obx_log_event(OBX_LOG_INFO, e.ev.id, e.ev.correlation_id, "key %s is parked behind %s: stored BLOCKED",
                  e.ev.partition_key, e.head);
    outcome = WORKER_BLOCKED;
    goto done;
  }
  if (!e.inserted) {
    if (e.existing == OBX_INBOX_RETRYING && resend_intent(&e)) { /* the copy sent now carries it on */
      outcome = WORKER_DUPLICATE;
      goto done;
    }
    bool finished = e.existing == OBX_INBOX_DONE || e.existing == OBX_INBOX_SKIPPED;
    /* From Kafka or HTTP, an event the ladder, the DLQ or its key already owns is a duplicate
     * too; from the work queue those are exactly the events to run again. */
    bool owned = e.existing == OBX_INBOX_RETRYING || e.existing == OBX_INBOX_DEAD || e.existing == OBX_INBOX_BLOCKED;
    bool replay = source == WORKER_SOURCE_WORK && msg->replay_id;
    if ((finished && !replay) || (source != WORKER_SOURCE_WORK && owned)) {
      obx_log_event(OBX_LOG_DEBUG, e.ev.id, e.ev.correlation_id, "duplicate (%s): skipped",
                    obx_inbox_status_name(e.existing));
      outcome = WORKER_DUPLICATE;
      /* A finished head that comes back (a copy, or a release interrupted by a stop) still
       * hands its key on. */
      if (finished && source == WORKER_SOURCE_WORK && !release_if_head(&e)) outcome = WORKER_INFRA;
      goto done;
    }
    /* claim: never run what a live peer runs; take over an expired claim */
    step_result_t r = retry_step(w, "inbox claim", e.ev.id, take_step, &e, pre_tries, false, &err);
    if (r == STEP_STOPPED || (r == STEP_EXHAUSTED && source == WORKER_SOURCE_HTTP)) goto done;
    if (r != STEP_OK) {
      char cause[600];
      snprintf(cause, sizeof cause, "claiming the inbox entry failed: %s", err.msg);
      outcome = dead_letter(&e, r == STEP_FAILED ? "terminal" : "infra", cause, false);
      goto done;
    }
    if (e.claim != CLAIM_TAKEN) {
      outcome = claim_not_taken(&e);
      if (e.claim != CLAIM_TAKEN) goto done;
    }
  }
  /* the claim's attempts: a fresh entry's 0, a taken one's the copy's (obx_inbox_take) */
  e.cas = (obx_inbox_cas_t){.owner = w->owner, .attempts = e.inserted ? 0 : msg->attempt, .lease_ms = w->lease_ms};
  e.claimed = true;
  claims_add(w, e.ev.id);
  outcome = run_event(&e);
  if ((outcome == WORKER_DONE || outcome == WORKER_SKIPPED) && source == WORKER_SOURCE_WORK && !release_if_head(&e))
    outcome = WORKER_INFRA;
done:
  if (e.claimed) claims_remove(w, e.ev.id);
  obx_pipeline_destroy(e.pipeline);
  if (e.client) obx_mongo_push(w->mongo, e.client);
  obx_event_cleanup(&e.ev);
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

/* Takes the runners' completions and commits the contiguous finished offsets. */
static void kafka_commit_done(obx_worker_t *w, bool sync) {
  pthread_mutex_lock(&w->done_mu);
  job_t *list = w->kafka_done;
  w->kafka_done = NULL;
  pthread_mutex_unlock(&w->done_mu);
  for (job_t *job = list, *next; job; job = next) {
    next = job->next;
    if (job->generation == w->generation && job->outcome != WORKER_INFRA)
      worker_offsets_done(&w->offsets, job->partition, job->offset);
    w->kafka_jobs--;
    job_free(job);
  }
  int max = w->offsets.n ? w->offsets.n : 1;
  int32_t parts[max];
  int64_t next[max];
  int n = worker_offsets_advance(&w->offsets, parts, next, max);
  kafka_commit(w, parts, next, n, sync);
}

/* ---- intake: paused partitions -------------------------------------------------------------
 * The Kafka thread never blocks on a full key or a full worker: after a push that fills the
 * key's queue (KEY_QUEUE_CAP) or the bound (WORKER_MAX_INFLIGHT) it pauses that record's
 * partition (rd_kafka_pause_partitions: what was fetched for it is dropped and fetched again
 * from the next offset on resume), and resumes it once the key is half drained and the worker
 * is under three quarters of the bound. Polls, rebalances and commits go on meanwhile. */

static void partition_toggle(obx_worker_t *w, int32_t partition, bool pause) {
  rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(list, w->conf->kafka_topic, partition);
  rd_kafka_resp_err_t rerr = pause ? rd_kafka_pause_partitions(w->rk, list) : rd_kafka_resume_partitions(w->rk, list);
  if (rerr) obx_warn("%s partition %" PRId32 ": %s", pause ? "pausing" : "resuming", partition, rd_kafka_err2str(rerr));
  rd_kafka_topic_partition_list_destroy(list);
}

static void kafka_pause(obx_worker_t *w, int32_t partition, const char *key, size_t len, int depth, int inflight) {
  for (int i = 0; i < w->npaused; i++)
    if (w->paused[i].partition == partition) return;
  partition_toggle(w, partition, true);
  w->paused = realloc(w->paused, (size_t)(w->npaused + 1) * sizeof *w->paused);
  assert(w->paused);
  paused_t *p = &w->paused[w->npaused++];
  p->partition = partition;
  p->key = malloc(len + 1);
  assert(p->key);
  memcpy(p->key, key, len);
  p->key[len] = '\0';
  p->len = len;
  obx_info("partition %" PRId32 " paused: key %.64s holds %d events, %d in flight (bound %d)", partition, p->key,
           depth, inflight, w->max_inflight);
  set_paused_gauge(w);
}

static void kafka_resume_drained(obx_worker_t *w) {
  int inflight = worker_sched_inflight(w->sched);
  for (int i = 0; i < w->npaused;) {
    paused_t *p = &w->paused[i];
    if (inflight > w->max_inflight * 3 / 4 || worker_sched_key_depth(w->sched, p->key, p->len) > KEY_QUEUE_CAP / 2) {
      i++;
      continue;
    }
    partition_toggle(w, p->partition, false);
    obx_info("partition %" PRId32 " resumed", p->partition);
    free(p->key);
    w->paused[i] = w->paused[--w->npaused];
    set_paused_gauge(w);
  }
}

/* Forgets the pauses (a rebalance: what is assigned next starts unpaused). */
static void kafka_pauses_clear(obx_worker_t *w) {
  for (int i = 0; i < w->npaused; i++) free(w->paused[i].key);
  w->npaused = 0;
  set_paused_gauge(w);
}

static bool is_kafka_job(void *ctx, const job_t *job) {
  (void)ctx;
  return job->source == WORKER_SOURCE_KAFKA;
}

static void drop_kafka_job(void *ctx, job_t *job) {
  obx_worker_t *w = ctx;
  w->kafka_jobs--;
  job_free(job);
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t rerr, rd_kafka_topic_partition_list_t *parts, void *opaque) {
  obx_worker_t *w = opaque;
  if (rerr == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
    /* Events not started are dropped (not committed: the next owner reads them); the running
     * ones may finish and be committed, so the next owner does not run them too. */
    int dropped = w->sched ? worker_sched_drop(w->sched, is_kafka_job, drop_kafka_job, w) : 0;
    int64_t deadline = obx_time_now_ms() + REVOKE_DRAIN_MS;
    for (;;) {
      kafka_commit_done(w, true);
      if (w->kafka_jobs <= 0 || atomic_load(&w->stop) || obx_time_now_ms() > deadline) break;
      struct timespec ts = {0, 20 * 1000000L};
      nanosleep(&ts, NULL);
    }
    worker_offsets_clear(&w->offsets);
    kafka_pauses_clear(w);
    w->generation++;
    rd_kafka_assign(rk, NULL);
    atomic_fetch_add(&w->stats.revocations, 1);
    obx_info("partitions revoked (%d; %d queued events left to the next owner, %d still running)", parts->cnt,
             dropped, w->kafka_jobs);
  } else if (rerr == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    worker_offsets_clear(&w->offsets);
    kafka_pauses_clear(w);
    w->generation++;
    rd_kafka_assign(rk, parts);
    rd_kafka_resume_partitions(rk, parts);
    atomic_store(&w->assigned, parts->cnt);
    obx_info("partitions assigned (%d)", parts->cnt);
  } else {
    rd_kafka_assign(rk, NULL);
  }
}

/* /readyz "worker": the consumer group is joined (Kafka source) and RabbitMQ is connected. */
static bool worker_ready(void *ctx, obx_err_t *err) {
  obx_worker_t *w = ctx;
  if (strcmp(w->conf->worker_source, "kafka") == 0 && atomic_load(&w->assigned) < 0) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, true, "no partition assignment yet from consumer group %s", w->consumer);
    return false;
  }
  if (!obx_ladder_connected(w->ladder)) {
    obx_err_set(err, OBX_ERR_AMQP, 0, true, "not connected to RabbitMQ (%s)", obx_ladder_work_queue(w->ladder));
    return false;
  }
  return true;
}

/* Records behind over the assigned partitions: from the first one not finished (or the
 * position, when all read ones are) to the high watermark. */
static void kafka_update_lag(obx_worker_t *w) {
  rd_kafka_topic_partition_list_t *parts = NULL;
  if (rd_kafka_assignment(w->rk, &parts) || !parts) return;
  rd_kafka_position(w->rk, parts);
  int64_t lag = 0;
  for (int i = 0; i < parts->cnt; i++) {
    int64_t lo, hi;
    if (rd_kafka_get_watermark_offsets(w->rk, parts->elems[i].topic, parts->elems[i].partition, &lo, &hi)) continue;
    int64_t pos = worker_offsets_pending_low(&w->offsets, parts->elems[i].partition);
    if (pos < 0) pos = parts->elems[i].offset >= 0 ? parts->elems[i].offset : lo;
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
  int n = 0, dropped = 0;
  rd_kafka_headers_t *kh = NULL;
  if (rd_kafka_message_headers(rkm, &kh) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char *name;
    const void *val;
    size_t size;
    for (size_t i = 0; !rd_kafka_header_get_all(kh, i, &name, &val, &size); i++)
      if (n < OBX_LADDER_MAX_HEADERS) hdrs[n++] = (obx_ce_header_t){name, val, size};
      else dropped++; /* counted: such a record is dead-lettered as malformed, never cut silently */
  }
  obx_ladder_msg_init(&job->msg);
  obx_ladder_msg_from_record(&job->msg, NULL, rkm->key, rkm->key_len, rkm->payload, rkm->len, hdrs, n);
  job->msg.dropped_headers = dropped;
  char src[256];
  snprintf(src, sizeof src, "%s/%" PRId32 "/%" PRId64, w->conf->kafka_topic, rkm->partition, rkm->offset);
  job->msg.source = strdup(src);
  count_consumed(w, WORKER_SOURCE_KAFKA);
  worker_offsets_add(&w->offsets, rkm->partition, rkm->offset);
  w->kafka_jobs++;
  int depth = 0, inflight = 0;
  size_t klen;
  const char *key = msg_partition_key(&job->msg, &klen);
  char keycopy[OBX_EVENT_MAX_ATTR_LEN + 1];
  if (klen > OBX_EVENT_MAX_ATTR_LEN) klen = OBX_EVENT_MAX_ATTR_LEN;
  memcpy(keycopy, key, klen); /* the job belongs to the runners after the push */
  sched_push(w, job, &depth, &inflight);
  if (depth >= KEY_QUEUE_CAP || inflight >= w->max_inflight)
    kafka_pause(w, rkm->partition, keycopy, klen, depth, inflight);
}

static void *kafka_main(void *arg) {
  obx_worker_t *w = arg;
  pthread_setname_np(pthread_self(), "obx-kafka");
  obx_log_set_role("worker");
  int64_t last_lag = 0, last_recommit = obx_time_now_ms();
  obx_health_register("worker", "kafka poll");
  while (!atomic_load(&w->stop)) {
    obx_health_stamp("polling Kafka");
    rd_kafka_message_t *rkm = rd_kafka_consumer_poll(w->rk, 100);
    if (rkm) {
      obx_health_stamp("queueing a record behind its key");
      if (!rkm->err) kafka_dispatch(w, rkm);
      else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        obx_warn("kafka consumer: %s", rd_kafka_message_errstr(rkm));
      rd_kafka_message_destroy(rkm);
    }
    kafka_commit_done(w, false);
    if (w->npaused) kafka_resume_drained(w);
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
  obx_health_unregister();
  return NULL;
}

/* The consumer's guarantees are not configurable: offsets are committed by the worker, only after
 * an event's outcome is in the inbox, and partitions are assigned eagerly by rebalance_cb. */
static bool kafka_passthrough_allowed(const char *name, const char *value, obx_err_t *err) {
  if ((strcmp(name, "enable.auto.commit") == 0 || strcmp(name, "enable.auto.offset.store") == 0) &&
      strcmp(value, "false") != 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false,
                "kafka.%s=%s is refused: the worker commits an offset only once its event's outcome is in the inbox",
                name, value);
    return false;
  }
  if (strcmp(name, "partition.assignment.strategy") == 0 && strstr(value, "cooperative")) {
    obx_err_set(err, OBX_ERR_CONF, 0, false,
                "kafka.partition.assignment.strategy=%s is refused: the worker rebalances eagerly "
                "(range or roundrobin); use worker.instance_id (static membership) to avoid rebalances on restart",
                value);
    return false;
  }
  if (strcmp(name, "group.id") == 0 || strcmp(name, "group.instance.id") == 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "kafka.%s is refused: set %s (it also names the inbox consumer)", name,
                strcmp(name, "group.id") == 0 ? "worker.group" : "worker.instance_id");
    return false;
  }
  return true;
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
  if (w->conf->worker_instance_id[0] &&
      rd_kafka_conf_set(kc, "group.instance.id", w->conf->worker_instance_id, errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
    goto conf_fail;
  for (int i = 0; i < w->conf->npassthrough; i++) {
    const char *key = w->conf->passthrough[i].key;
    if (strncmp(key, "kafka.", 6) != 0) continue;
    if (!kafka_passthrough_allowed(key + 6, w->conf->passthrough[i].value, err)) {
      rd_kafka_conf_destroy(kc);
      return false;
    }
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
  int64_t last_warn = 0, last_parked = 0, last_tick = 0, last_renew = 0;
  obx_health_register("worker", "work queue");
  while (!atomic_load(&w->stop)) {
    obx_health_stamp("settling work queue messages");
    wq_settle(w);
    if (obx_time_now_ms() - last_tick >= 1000) { /* in every mode: heartbeats, reconnects */
      obx_ladder_tick(w->ladder);
      last_tick = obx_time_now_ms();
    }
    if (obx_time_now_ms() - last_renew >= w->lease_ms / 3) {
      last_renew = obx_time_now_ms();
      mongoc_client_t *client = obx_mongo_pop(w->mongo);
      claims_renew(w, client);
      obx_mongo_push(w->mongo, client);
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
    sched_push(w, job, NULL, NULL); /* bounded by the prefetch */
  }
  obx_health_unregister();
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
  w->infra_attempts = (int)conf->worker_infra_attempts;
  w->infra_timeout_ms = conf->worker_infra_timeout;
  w->lease_ms = conf->worker_lease;
  char host[64] = "worker", uuid[OBX_UUID_LEN + 1];
  gethostname(host, sizeof host - 1);
  obx_uuid7(uuid);
  snprintf(w->owner, sizeof w->owner, "%s:%d:%s", host, (int)getpid(), uuid);
  w->member = conf->worker_instance_id[0] ? conf->worker_instance_id : NULL;
  pthread_mutex_init(&w->claims_mu, NULL);
  w->nrunners = (int)conf->order_post_concurrency;
  w->max_inflight = (int)conf->worker_max_inflight;
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
  w->schema = obx_schema_guard_start(w->mongo, conf, OBX_SCHEMA_WORKER, http, "worker-schema");
  if (!(w->wq = obx_ladder_consumer_new(&w->ladder_opts, 2 * w->nrunners, err))) goto fail;
  if (conf->worker_dlq_drain && !(w->drain = obx_ops_drain_start(conf, err))) goto fail;

  if (!(w->sched = worker_sched_new(w->nrunners, run_job, w, err))) goto fail;
  if (pthread_create(&w->wq_thread, NULL, wq_main, w) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the work queue thread");
    goto fail;
  }
  w->wq_running = true;
  atomic_store(&w->assigned, -1);
  if (http) obx_http_add_ready_check(http, "worker", worker_ready, w);
  if (http_mode) {
    if (!(w->sink = worker_sink_start(w, conf, w->mongo, err))) goto fail;
  } else if (!kafka_start(w, err)) {
    goto fail;
  }
  obx_info("worker started: %s source, %d runners, %d events in flight at most, %d attempts, %d retry tiers, "
           "consumer %s", http_mode ? "http" : "kafka", w->nrunners, w->max_inflight, w->max_attempts,
           conf->retry_ladder.n, w->consumer);
  return w;
fail:
  obx_worker_destroy(w);
  return NULL;
}

/* A job still queued at the stop: HTTP callers get 503; Kafka records are not committed and
 * work-queue messages not acked, so both come back. */
static void job_left(void *ctx, job_t *job) {
  if (job->source == WORKER_SOURCE_HTTP) {
    job->outcome = WORKER_INFRA;
    complete(ctx, job);
  } else {
    job_free(job);
  }
}

void obx_worker_destroy(obx_worker_t *w) {
  if (!w) return;
  atomic_store(&w->stop, true);
  obx_ops_drain_stop(w->drain);
  if (w->kafka_running) pthread_join(w->kafka_thread, NULL);
  if (w->wq_running) pthread_join(w->wq_thread, NULL);
  worker_sched_destroy(w->sched, job_left, w); /* lets each runner finish its current event */
  w->sched = NULL;
  if (w->rk) {
    kafka_commit_done(w, true);
    rd_kafka_consumer_close(w->rk);
    rd_kafka_destroy(w->rk);
  }
  worker_offsets_clear(&w->offsets);
  kafka_pauses_clear(w);
  free(w->paused);
  if (w->wq) wq_settle(w);
  /* every sink request waiting on a runner has its answer (503 from job_left): the listener
   * stops without waiting on runners that no longer run; later requests found w->stop and got 503 */
  worker_sink_stop(w->sink);
  w->sink = NULL;
  for (job_t *job = w->kafka_done, *next; job; job = next) {
    next = job->next;
    job_free(job);
  }
  obx_ladder_consumer_destroy(w->wq);
  obx_ladder_destroy(w->ladder);
  if (w->egress_ok) obx_egress_cleanup(&w->egress);
  obx_pipeline_cache_destroy(w->pipelines);
  obx_schema_guard_destroy(w->schema);
  obx_mongo_destroy(w->mongo);
  pthread_mutex_destroy(&w->done_mu);
  pthread_mutex_destroy(&w->claims_mu);
  free(w->claims);
  for (int i = 0; i < LOST_KEYS; i++) free(w->lost[i].key);
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
  s->paused_partitions = atomic_load(&w->stats.paused_partitions);
  s->revocations = atomic_load(&w->stats.revocations);
  s->in_flight = w->sched ? worker_sched_inflight(w->sched) : 0;
}

bool worker_enqueue_http(obx_worker_t *w, obx_ladder_msg_t *msg, worker_http_wait_t *wait) {
  job_t *job = calloc(1, sizeof *job);
  assert(job);
  job->source = WORKER_SOURCE_HTTP;
  job->msg = *msg; /* ownership moves to the job */
  obx_ladder_msg_init(msg);
  job->wait = wait;
  if (atomic_load(&w->stop)) {
    *msg = job->msg;
    free(job);
    return false;
  }
  count_consumed(w, WORKER_SOURCE_HTTP);
  sched_push(w, job, NULL, NULL); /* bounded by the HTTP server's connections */
  return true;
}

void *obx_worker_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  return obx_worker_new(conf, http, err);
}

void obx_worker_stop(void *worker) { obx_worker_destroy(worker); }

int obx_worker_sink_port(const obx_worker_t *w) { return worker_sink_port(w->sink); }

bool worker_schema_ready(obx_worker_t *w) { return obx_schema_guard_wait(w->schema, 0); }
