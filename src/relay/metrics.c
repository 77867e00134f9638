/* metrics.c - the relay's Prometheus metrics
 *
 * DESIGN: every number has one writer, the relay thread, through the functions below; each
 * updates the relay's own counters (obx_relay_t.counters, read by tests) and the process-wide
 * registry (obx_metrics.h, rendered by GET /metrics). The registry's metrics live for the whole
 * process, so the relays of a process's buckets add to the same series; its gauges are the sums
 * over the buckets of the group (buckets.c), the lag the largest. */
#include "relay/relay_int.h"

#include "obx/obx_metrics.h"

/* Commit-to-ack latency buckets, seconds: a healthy stream relay acks in milliseconds, the
 * seed's 2 s poller in seconds, a Kafka outage in minutes. */
static const double latency_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

static struct {
  obx_counter_t *published, *publish_errors, *failed, *stream_restarts;
  obx_gauge_t *inflight, *lag, *leader, *stream_up, *held_keys, *producers;
  obx_histogram_t *latency;
} m;

void relay_metrics_register(void) {
  m.published = obx_metrics_counter("outboxd_relay_published_total", "Events acknowledged by Kafka", "topic");
  m.publish_errors = obx_metrics_counter("outboxd_relay_publish_errors_total",
                                         "Publish attempts that failed (Kafka error, timeout, malformed event)", "topic");
  m.failed = obx_metrics_counter("outboxd_relay_failed_total", "Events that became FAILED (attempts exhausted or malformed)", NULL);
  m.stream_restarts = obx_metrics_counter("outboxd_relay_stream_restarts_total",
                                          "Change stream errors it could not resume from, by cause (history_lost 286, fatal_error 280, "
                                          "invalid_resume_token 260, invalidate, reopen_failed): each reopened the stream from now "
                                          "and published every PENDING event", "cause");
  m.held_keys = obx_metrics_gauge("outboxd_relay_held_keys",
                                  "Partition keys whose later events wait behind an event Kafka refused (FAILED or retrying): "
                                  "reprocess, fix or skip the head", NULL);
  m.stream_up = obx_metrics_gauge("outboxd_relay_stream_up",
                                  "Change streams open, one per bucket held (with one bucket: 1 while the leader's is open; "
                                  "0 on a standby and in poll mode)", NULL);
  m.inflight = obx_metrics_gauge("outboxd_relay_inflight", "Events produced and not yet recorded after their delivery report", NULL);
  m.lag = obx_metrics_gauge("outboxd_relay_lag_seconds",
                            "Now minus the cluster time (1 s resolution) of the checkpoint position, the newest change up to "
                            "which every outcome is recorded; 0 when the stream is caught up with nothing in flight, on a "
                            "standby, and in poll mode", NULL);
  m.leader = obx_metrics_gauge("outboxd_relay_leader",
                               "Buckets whose lease this process holds (with one bucket: 1 while it holds the relay lease)", NULL);
  m.producers = obx_metrics_gauge("outboxd_relay_producers",
                                  "Kafka producers of this process: one per bucket it leads, created when the bucket is taken "
                                  "and destroyed when it is lost", NULL);
  m.latency = obx_metrics_histogram("outboxd_relay_commit_to_ack_seconds",
                                    "From the event's occurredAt (its commit) to Kafka's acknowledgement",
                                    NULL, latency_buckets, (int)(sizeof latency_buckets / sizeof latency_buckets[0]));
}

void relay_metrics_count(obx_relay_t *relay, relay_count_t which) {
  const char *topic = relay->conf->kafka_topic;
  switch (which) {
  case RELAY_COUNT_PUBLISHED:
    relay->counters.published++;
    obx_counter_inc(m.published, topic);
    break;
  case RELAY_COUNT_PUBLISH_ERROR:
    relay->counters.publish_errors++;
    obx_counter_inc(m.publish_errors, topic);
    break;
  case RELAY_COUNT_FAILED:
    relay->counters.failed++;
    obx_counter_inc(m.failed);
    break;
  }
}

void relay_metrics_stream_restart(obx_relay_t *relay, relay_stream_cause_t cause) {
  relay->counters.recoveries[cause]++;
  obx_counter_inc(m.stream_restarts, relay_stream_cause_names[cause]);
}

void relay_metrics_observe_ack(obx_relay_t *relay, int64_t ms) {
  obx_histogram_observe(m.latency, (double)(ms > 0 ? ms : 0) / 1000.0);
}

void relay_metrics_gauges(obx_relay_t *relay) {
  relay->counters.leader = relay->leader;
  if (!relay->leader) relay->counters.lag_ms = 0; /* a standby's lag is the leader's to report */
  relay->counters.inflight = relay_pending(relay);
  relay->counters.stream_up = relay->stream != NULL;
  relay->counters.held_keys = relay->nheld;
  relay->counters.producer = relay->producer != NULL;
  /* the process's gauges: the sums over its buckets (the lag: the largest) */
  relay_gauges_t g = {relay->leader, relay->counters.inflight, relay->counters.stream_up, relay->nheld,
                      relay->counters.producer, relay->counters.lag_ms};
  if (relay->group) relay_group_gauges(relay, &g);
  obx_gauge_set(m.held_keys, g.held_keys);
  obx_gauge_set(m.stream_up, g.stream_up);
  obx_gauge_set(m.leader, g.held);
  obx_gauge_set(m.inflight, g.inflight);
  obx_gauge_set(m.producers, g.producers);
  obx_gauge_set(m.lag, (double)g.lag_ms / 1000.0);
}
