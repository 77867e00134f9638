/* stats.c - the worker's numbers: obx_worker_stats and the process registry's (/metrics)
 *
 * DESIGN: owns the worker's counters and gauges and their metric names; every other file counts
 * through these functions. Never decides anything from them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "obx/obx_metrics.h"
#include "obx/obx_pipeline.h"
#include "worker_int.h"

static struct {
  obx_counter_t *consumed, *duplicates, *malformed, *runs, *blocked, *retries, *dlq, *moves, *swept, *gaps;
  obx_gauge_t *lag, *parked, *paused, *prefetched;
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
  metrics.swept = obx_metrics_counter("outboxd_worker_retry_swept_total",
                                      "Retries republished to the work queue because their tier's message was overdue (retry sweep)",
                                      "tier");
  metrics.dlq = obx_metrics_counter("outboxd_worker_dlq_published_total", "Publishes to the parking-lot DLQ", "class");
  metrics.moves = obx_metrics_counter("outboxd_worker_transitions_total",
                                      "Moves of events between lifecycle states (docs/worker-lifecycle.md)", "from,to");
  metrics.gaps = obx_metrics_counter("outboxd_worker_keyseq_gaps_total",
                                     "Waits of an event for its key's missing earlier keySeq, by how they ended "
                                     "(filled: it settled; timeout: WORKER_GAP_WAIT passed, the event ran without it)",
                                     "outcome");
  metrics.lag =
    obx_metrics_gauge("outboxd_worker_consumer_lag", "Kafka messages behind over the assigned partitions", NULL);
  metrics.parked = obx_metrics_gauge("outboxd_worker_parked_keys", "Business keys parked behind a failing event", NULL);
  metrics.paused = obx_metrics_gauge("outboxd_worker_paused_partitions",
                                     "Kafka partitions held (not read) because a key's queue or the in-flight bound is full",
                                     NULL);
  metrics.prefetched = obx_metrics_gauge("outboxd_worker_prefetched_records",
                                         "Kafka records fetched and not read yet (kafka.statistics.interval.ms)", NULL);
}

void worker_metrics_init(void) { pthread_once(&metrics_once, metrics_register); }

static const char *const source_names[] = {"kafka", "amqp", "http"};

void worker_count_consumed(obx_worker_t *w, worker_source_t source) {
  atomic_fetch_add(&w->stats.consumed, 1);
  obx_counter_inc(metrics.consumed, source_names[source]);
}

void worker_count_run(obx_worker_t *w, obx_pipeline_status_t status) {
  atomic_fetch_add(status == OBX_PIPELINE_SUCCEEDED ? &w->stats.runs_succeeded
                   : status == OBX_PIPELINE_FAILED  ? &w->stats.runs_failed
                                                    : &w->stats.runs_skipped,
                   1);
  obx_counter_inc(metrics.runs, obx_pipeline_status_name(status));
}

void worker_count_retry(obx_worker_t *w, int tier) {
  atomic_fetch_add(&w->stats.retries[tier], 1);
  char label[16];
  snprintf(label, sizeof label, "%d", tier + 1);
  obx_counter_inc(metrics.retries, label);
}

void worker_count_dlq(obx_worker_t *w, const char *failure_class) {
  atomic_fetch_add(&w->stats.dlq, 1);
  obx_counter_inc(metrics.dlq, failure_class);
}

void worker_count_swept(obx_worker_t *w, int tier) {
  atomic_fetch_add(&w->stats.swept, 1);
  char label[16];
  snprintf(label, sizeof label, "%d", tier + 1);
  obx_counter_inc(metrics.swept, label);
}

void worker_set_lag(obx_worker_t *w, int64_t lag) {
  atomic_store(&w->stats.lag, lag);
  obx_gauge_set(metrics.lag, (double)lag);
}

void worker_set_fetched(obx_worker_t *w, int64_t fetched, int64_t prefetched) {
  atomic_store(&w->stats.fetched_records, fetched);
  atomic_store(&w->stats.prefetched_records, prefetched);
  atomic_fetch_add(&w->stats.kafka_stats_reports, 1);
  obx_gauge_set(metrics.prefetched, (double)prefetched);
}

void worker_set_parked(obx_worker_t *w, int64_t n) {
  atomic_store(&w->stats.parked_keys, n);
  obx_gauge_set(metrics.parked, (double)n);
}

void worker_set_paused_gauge(obx_worker_t *w) {
  atomic_store(&w->stats.paused_partitions, w->nheld);
  obx_gauge_set(metrics.paused, (double)w->nheld);
}

void worker_count_outcome(obx_worker_t *w, worker_outcome_t outcome) {
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

void worker_count_move(worker_state_t from, worker_state_t to) {
  obx_counter_inc(metrics.moves, worker_state_name(from), worker_state_name(to));
}

void worker_count_keyseq_gap(const char *outcome) { obx_counter_inc(metrics.gaps, outcome); }

void worker_count_malformed(obx_worker_t *w) {
  atomic_fetch_add(&w->stats.malformed, 1);
  obx_counter_inc(metrics.malformed);
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
  s->fetched_records = atomic_load(&w->stats.fetched_records);
  s->prefetched_records = atomic_load(&w->stats.prefetched_records);
  s->kafka_stats_reports = atomic_load(&w->stats.kafka_stats_reports);
  s->revocations = atomic_load(&w->stats.revocations);
  s->swept = atomic_load(&w->stats.swept);
  s->in_flight = w->sched ? worker_sched_inflight(w->sched) : 0;
}
