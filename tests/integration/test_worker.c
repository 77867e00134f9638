/* test_worker.c - the worker end to end: Kafka -> worker -> devmongod, RabbitMQ ladder
 *
 * DESIGN: each test starts a devmongod, a topic of 3 partitions on the run's Kafka broker,
 * a scripted HTTP server standing in for the ERP, and an in-process worker with a short ladder
 * (200ms,500ms) under a RabbitMQ prefix of its own. The order.post pipeline posts to
 * /erp/<orderNumber>, so each event's fate is scripted by its own path. Events are produced
 * in CloudEvents binary mode exactly as the relay does (obx_event_to_kafka). Skipped when
 * AMQP_URL is not set (scripts/test.sh sets it). */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_conf.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_worker.h"
#include "obx_test.h"
#include "obx_test_httpd.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_fixture.h"
#include "obx/obx_ops.h"
#include "worker_test.h"

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

/* A counter series of /metrics; 0 while it was never incremented (not printed yet). */
static double counter(const char *series) {
  double v = wt_metric(series);
  return v < 0 ? 0 : v;
}

static void want_delta(const char *series, double before, double want) {
  double got = counter(series) - before;
  if (got != want) fail_msg("/metrics %s grew by %g, want %g", series, got, want);
}

static void test_success_and_no_pipeline(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  obx_event_t ev, other;
  wt_event(&ev, "OrderConfirmed", "K-1", "N-1");
  wt_event(&other, "InvoiceIssued", "K-2", "N-2");
  wt_route(fx, "N-1", 200);
  wt_produce(fx, &ev);
  wt_produce(fx, &other);
  wt_wait_status(fx, ev.id, "DONE");
  wt_wait_status(fx, other.id, "SKIPPED");
  assert_int_equal(wt_executions(fx, ev.id), 1);
  assert_int_equal(wt_executions(fx, other.id), 0);
  assert_int_equal(wt_erp_calls(fx, "N-1"), 1);
  assert_int_equal(wt_inbox_int(fx, ev.id, "attempts"), 1);
  obx_event_cleanup(&ev);
  obx_event_cleanup(&other);
}

static void test_duplicates_are_skipped(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  obx_event_t ev, after;
  wt_event(&ev, "OrderConfirmed", "K-1", "D-1");
  wt_event(&after, "OrderConfirmed", "K-1", "D-2");
  wt_route(fx, "D-1", 200);
  wt_route(fx, "D-2", 200);
  for (int i = 0; i < 3; i++) wt_produce(fx, &ev);
  wt_produce(fx, &after);
  wt_wait_status(fx, after.id, "DONE");
  wt_wait_status(fx, ev.id, "DONE");
  obx_worker_stats_t s;
  int64_t deadline = obx_test_now_ms() + 20000;
  do obx_worker_stats(fx->worker, &s);
  while (s.duplicates < 2 && obx_test_now_ms() < deadline);
  if (s.duplicates != 2) fail_msg("duplicates: got %llu, want 2", (unsigned long long)s.duplicates);
  assert_int_equal(wt_erp_calls(fx, "D-1"), 1);
  assert_int_equal(wt_executions(fx, ev.id), 1);
  obx_event_cleanup(&ev);
  obx_event_cleanup(&after);
}

static void test_transient_failure_succeeds_on_tier_two(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  fx->attempts = 4;
  /* A long second tier leaves the test time to script the ERP's success before the last try. */
  wt_conf_set(fx, "worker.retry_ladder", "200ms,3s");
  wt_start_worker(fx);
  /* Counters are process-wide and earlier tests of this file also moved them: compare deltas. */
  double tier1 = counter("outboxd_worker_retries_total{tier=\"1\"}");
  double tier2 = counter("outboxd_worker_retries_total{tier=\"2\"}");
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "K-1", "T-1");
  wt_route(fx, "T-1", 503);
  wt_produce(fx, &ev);
  /* First attempt and the tier-1 retry fail; the tier-2 retry succeeds. */
  wt_wait_calls(fx, "T-1", 2);
  wt_route(fx, "T-1", 200);
  wt_wait_status(fx, ev.id, "DONE");
  assert_int_equal(wt_erp_calls(fx, "T-1"), 3);
  assert_int_equal(wt_inbox_int(fx, ev.id, "attempts"), 3);
  assert_int_equal(wt_executions(fx, ev.id), 3); /* every attempt is tracked */
  obx_worker_stats_t s;
  obx_worker_stats(fx->worker, &s);
  assert_int_equal(s.retries[0], 1);
  assert_int_equal(s.retries[1], 1);
  assert_int_equal(s.dlq, 0);
  want_delta("outboxd_worker_retries_total{tier=\"1\"}", tier1, 1);
  want_delta("outboxd_worker_retries_total{tier=\"2\"}", tier2, 1);
  wt_wait_unparked(fx, "K-1");
  char extra[96];
  snprintf(extra, sizeof extra, "%s.retry.3000ms", fx->prefix);
  const char *queues[] = {extra};
  wt_delete_amqp(queues, 1, NULL);
  obx_event_cleanup(&ev);
}

static void test_exhaustion_to_dlq_then_redrive(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "K-1", "X-1");
  wt_route(fx, "X-1", 503);
  wt_produce(fx, &ev);
  wt_wait_status(fx, ev.id, "DEAD");
  assert_int_equal(wt_erp_calls(fx, "X-1"), 3);
  assert_int_equal(wt_inbox_int(fx, ev.id, "attempts"), 3);
  assert_true(wt_key_parked(fx, "K-1"));
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 1);

  /* The DLQ copy says why and carries the history. */
  wt_dlq_seen_t seen = {0};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_dlq_browse(fx->ladder, 0, NULL, wt_dlq_collect, &seen, &err)) fail_msg("browse: %s", err.msg);
  assert_int_equal(seen.n, 1);
  assert_string_equal(seen.id[0], ev.id);
  if (strncmp(seen.reason[0], "attempts exhausted", 18) != 0) fail_msg("reason: got %s", seen.reason[0]);
  assert_int_equal(seen.attempt[0], 3);

  wt_route(fx, "X-1", 200);
  int moved = 0; /* the fixture runs no drain: the message is still on the queue */
  if (!obx_ladder_dlq_redrive(fx->ladder, NULL, NULL, false, NULL, &moved, &err)) fail_msg("redrive: %s", err.msg);
  assert_int_equal(moved, 1);
  wt_wait_status(fx, ev.id, "DONE");
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 0);
  assert_int_equal(wt_erp_calls(fx, "X-1"), 4);
  wt_wait_unparked(fx, "K-1");
  obx_event_cleanup(&ev);
}

static void test_terminal_failure_goes_straight_to_dlq(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  double terminal = counter("outboxd_worker_dlq_published_total{class=\"terminal\"}");
  double tier1 = counter("outboxd_worker_retries_total{tier=\"1\"}");
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "K-9", "B-1");
  wt_route(fx, "B-1", 400);
  wt_produce(fx, &ev);
  wt_wait_status(fx, ev.id, "DEAD");
  assert_int_equal(wt_erp_calls(fx, "B-1"), 1);
  assert_int_equal(wt_inbox_int(fx, ev.id, "attempts"), 1);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 1);
  obx_worker_stats_t s;
  obx_worker_stats(fx->worker, &s);
  assert_int_equal(s.retries[0], 0);
  assert_int_equal(s.dlq, 1);
  want_delta("outboxd_worker_dlq_published_total{class=\"terminal\"}", terminal, 1);
  want_delta("outboxd_worker_retries_total{tier=\"1\"}", tier1, 0);
  obx_event_cleanup(&ev);
}

static void test_malformed_record_goes_to_dlq_and_partition_moves_on(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  /* Same key, so the same partition: the good event behind the bad one must still run. */
  wt_produce_raw(fx, "K-5", "{not json", "0190f0e0-0000-7000-8000-00000000bad1");
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "K-5", "M-1");
  wt_route(fx, "M-1", 200);
  wt_produce(fx, &ev);
  wt_wait_status(fx, ev.id, "DONE");
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 1);
  wt_dlq_seen_t seen = {0};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_dlq_browse(fx->ladder, 0, NULL, wt_dlq_collect, &seen, &err)) fail_msg("browse: %s", err.msg);
  assert_int_equal(seen.n, 1);
  assert_string_equal(seen.id[0], "0190f0e0-0000-7000-8000-00000000bad1");
  if (strncmp(seen.reason[0], "malformed CloudEvent", 20) != 0) fail_msg("reason: got %s", seen.reason[0]);
  obx_event_cleanup(&ev);
}

static void test_per_key_order_with_failing_head(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  fx->attempts = 4;
  wt_start_worker(fx);
  obx_event_t head, later[3], other;
  wt_event(&head, "OrderConfirmed", "K-7", "H-0");
  const char *nums[] = {"H-1", "H-2", "H-3"};
  for (int i = 0; i < 3; i++) {
    wt_event(&later[i], "OrderConfirmed", "K-7", nums[i]);
    wt_route(fx, nums[i], 200);
  }
  wt_event(&other, "OrderConfirmed", "K-8", "O-1");
  wt_route(fx, "O-1", 200);
  wt_route(fx, "H-0", 503);
  wt_produce(fx, &head);
  for (int i = 0; i < 3; i++) wt_produce(fx, &later[i]);
  wt_produce(fx, &other);

  /* While the head retries, its key's later events wait BLOCKED; other keys run. */
  wt_wait_status(fx, other.id, "DONE");
  for (int i = 0; i < 3; i++) wt_wait_status(fx, later[i].id, "BLOCKED");
  assert_true(wt_key_parked(fx, "K-7"));
  assert_int_equal(wt_erp_calls(fx, "H-1"), 0);

  wt_wait_calls(fx, "H-0", 2);
  wt_route(fx, "H-0", 200);
  wt_wait_status(fx, head.id, "DONE");
  for (int i = 0; i < 3; i++) wt_wait_status(fx, later[i].id, "DONE");
  wt_wait_unparked(fx, "K-7");
  /* The ERP saw the key's events in order: the head's success, then H-1, H-2, H-3. */
  int last_head = wt_last_call_index(fx, "H-0");
  int prev = last_head;
  for (int i = 0; i < 3; i++) {
    int at = wt_last_call_index(fx, nums[i]);
    if (at <= prev) fail_msg("%s reached the ERP at request %d, want after %d", nums[i], at, prev);
    prev = at;
  }
  obx_event_cleanup(&head);
  for (int i = 0; i < 3; i++) obx_event_cleanup(&later[i]);
  obx_event_cleanup(&other);
}

static void test_different_keys_run_in_parallel(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  /* Eight keys whose ERP call takes 1.5 s each. A lane claims its next event only after the
   * previous one finished, so events claimed within 1 s of the first ran side by side. */
  enum { N = 8 };
  obx_event_t ev[N];
  char num[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(num[i], sizeof num[i], "P-%d", i);
    wt_event(&ev[i], "OrderConfirmed", num[i], num[i]);
    wt_route_delay(fx, num[i], 200, 1500);
  }
  for (int i = 0; i < N; i++) wt_produce(fx, &ev[i]);
  int64_t received[N], first = INT64_MAX;
  for (int i = 0; i < N; i++) {
    wt_wait_status(fx, ev[i].id, "DONE");
    bson_t doc;
    bson_iter_t it;
    assert_true(wt_inbox(fx, ev[i].id, &doc));
    assert_true(bson_iter_init_find(&it, &doc, "receivedAt") && BSON_ITER_HOLDS_DATE_TIME(&it));
    received[i] = bson_iter_date_time(&it);
    if (received[i] < first) first = received[i];
    bson_destroy(&doc);
  }
  int together = 0;
  for (int i = 0; i < N; i++) together += received[i] - first < 1000;
  if (together < 2) fail_msg("events started within 1 s of the first: got %d, want >= 2 with 4 lanes", together);
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
}

/* Ten events of one key whose ERP calls take between 20 and 300 ms, with four lanes: the ERP
 * receives each call after the previous one of the key was answered, in offset order; events of
 * other keys produced after them reach the ERP before the key's last one. */
static void test_same_key_in_offset_order_while_other_keys_run(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.concurrency", "4");
  wt_start_worker(fx);
  enum { N = 10, NOTHER = 4 };
  obx_event_t ev[N], other[NOTHER];
  char num[N][16], onum[NOTHER][16];
  for (int i = 0; i < N; i++) {
    snprintf(num[i], sizeof num[i], "S-%d", i);
    wt_event(&ev[i], "OrderConfirmed", "K-S", num[i]);
    wt_route_delay(fx, num[i], 200, 20 + (i * 137) % 281);
  }
  for (int i = 0; i < NOTHER; i++) {
    char key[16];
    snprintf(onum[i], sizeof onum[i], "SO-%d", i);
    snprintf(key, sizeof key, "K-SO-%d", i); /* four keys: some land on other lanes than K-S */
    wt_event(&other[i], "OrderConfirmed", key, onum[i]);
    wt_route(fx, onum[i], 200);
  }
  for (int i = 0; i < N; i++) wt_produce(fx, &ev[i]);
  for (int i = 0; i < NOTHER; i++) wt_produce(fx, &other[i]);
  for (int i = 0; i < N; i++) wt_wait_status(fx, ev[i].id, "DONE");
  for (int i = 0; i < NOTHER; i++) wt_wait_status(fx, other[i].id, "DONE");
  int prev = -1;
  for (int i = 0; i < N; i++) {
    int calls = 0, at = wt_calls(fx, num[i], &calls);
    if (calls != 1) fail_msg("%s: %d ERP calls, want 1", num[i], calls);
    if (at <= prev) fail_msg("%s reached the ERP as request %d, want after %d (%s)", num[i], at, prev,
                             i ? num[i - 1] : "");
    prev = at;
  }
  int overtook = 0;
  for (int i = 0; i < NOTHER; i++) overtook += wt_last_call_index(fx, onum[i]) < prev;
  if (overtook < 1) fail_msg("events of other keys reaching the ERP before %s: got 0, want >= 1", num[N - 1]);
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
  for (int i = 0; i < NOTHER; i++) obx_event_cleanup(&other[i]);
}

/* A string field of the first document of collection matching filter; "" when none. */
static void find_str(wt_fx_t *fx, const char *collection, const bson_t *filter, const char *field, char *out,
                     size_t outlen) {
  mongoc_collection_t *c = mongoc_client_get_collection(fx->client, obx_mongo_db_name(fx->mongo), collection);
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it;
  out[0] = '\0';
  if (mongoc_cursor_next(cur, &doc) && bson_iter_init_find(&it, doc, field) && BSON_ITER_HOLDS_UTF8(&it))
    snprintf(out, outlen, "%s", bson_iter_utf8(&it, NULL));
  mongoc_cursor_destroy(cur);
  mongoc_collection_destroy(c);
}

/* Any type other than OrderConfirmed runs the enabled event.<Type> pipeline: here it calls the
 * ERP and emits ShipmentNotified, whose outbox document is written with the inbox outcome (it
 * is there as soon as the entry says DONE) and names the triggering event as its cause. The
 * first commit of the outcome fails with a retriable error: its emitted event and execution go
 * with it, only the recording is retried (the pipeline is not run again), and exactly one of
 * each is left. */
static void test_event_pipeline_emits_into_outbox(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  char json[2048];
  snprintf(json, sizeof json,
           "{\"name\": \"shipped\", \"trigger\": \"event.OrderShipped\", \"enabled\": true, \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"notify\", \"type\": \"http-request\", \"onError\": \"abort\", \"config\": {"
           "  \"method\": \"POST\", \"url\": \"%s/{{orderNumber}}\", \"body\": {\"n\": \"{{orderNumber}}\"}}},"
           "{\"id\": \"emit\", \"type\": \"emit-event\", \"config\": {\"eventType\": \"ShipmentNotified\","
           "  \"payload\": {\"orderNumber\": \"{{orderNumber}}\"}}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"notify\"}, {\"from\": \"notify\", \"to\": \"emit\"}]}",
           obx_test_httpd_url(fx->httpd, "/erp"));
  wt_create_pipeline_json(fx, json);
  obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
                                  "{\"failCommands\": [\"commitTransaction\"], \"errorCode\": 91}}");
  wt_start_worker(fx);
  obx_event_t ev;
  wt_event(&ev, "OrderShipped", "K-E", "E-1");
  wt_route(fx, "E-1", 200);
  wt_produce(fx, &ev);
  wt_wait_status(fx, ev.id, "DONE");
  int64_t fired =
    obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  if (fired != 1) fail_msg("failed commits: got %lld, want 1", (long long)fired);
  bson_t *filter = BCON_NEW("causationId", BCON_UTF8(ev.id));
  int64_t emitted = wt_count(fx, "outbox", filter);
  if (emitted != 1) fail_msg("outbox events caused by %s once its inbox entry is DONE: got %lld, want 1", ev.id,
                             (long long)emitted);
  char got[128];
  find_str(fx, "outbox", filter, "eventType", got, sizeof got);
  assert_string_equal(got, "ShipmentNotified");
  find_str(fx, "outbox", filter, "aggregateId", got, sizeof got);
  assert_string_equal(got, "K-E");
  bson_destroy(filter);
  assert_int_equal(wt_executions(fx, ev.id), 1);
  /* Only the recording was retried: the pipeline (its HTTP call) ran once. */
  assert_int_equal(wt_erp_calls(fx, "E-1"), 1);
  filter = BCON_NEW("eventId", BCON_UTF8(ev.id), "trigger", BCON_UTF8("event.OrderShipped"));
  find_str(fx, "pipeline_executions", filter, "status", got, sizeof got);
  bson_destroy(filter);
  assert_string_equal(got, "SUCCEEDED");
  obx_event_cleanup(&ev);
}

/* A second worker joins the group mid-run, so the first one's partitions are revoked while its
 * runners hold events. The revoke drops the queued events (the next owner reads them) and waits
 * for the running ones; commits made while the group rebalances may be refused, and whatever is
 * read again is a finished duplicate for the inbox: every event runs exactly once. The group is
 * on the real broker (the fixture); the 6 s session timeout is kept from kafka-mockd, whose
 * coordinator held a join to a non-empty group for session.timeout.ms - 1 s. */
static void test_rebalance_runs_each_event_once(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  enum { N = 30 };
  obx_event_t ev[N];
  for (int i = 0; i < N; i++) {
    char num[16];
    snprintf(num, sizeof num, "G-%d", i);
    wt_event(&ev[i], "OrderConfirmed", num, num);
    wt_route_delay(fx, num, 200, 500); /* about 4 s of work: the join lands in the middle */
    wt_produce(fx, &ev[i]);
  }
  wt_conf_set(fx, "kafka.session.timeout.ms", "6000");
  wt_conf_set(fx, "kafka.heartbeat.interval.ms", "1000");
  wt_start_worker(fx);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_inbox_count(fx, "DONE") < 4 && obx_test_now_ms() < deadline) usleep(5000);
  obx_err_t err = OBX_ERR_INIT;
  obx_worker_t *second = obx_worker_new(&fx->conf, NULL, &err);
  if (!second) fail_msg("second worker: %s", err.msg);
  for (int i = 0; i < N; i++) wt_wait_status(fx, ev[i].id, "DONE");
  obx_worker_stats_t a, b;
  obx_worker_stats(fx->worker, &a);
  obx_worker_stats(second, &b);
  obx_worker_destroy(second);
  for (int i = 0; i < N; i++) {
    int64_t runs = wt_executions(fx, ev[i].id);
    if (runs != 1) fail_msg("event %d: %lld executions, want 1", i, (long long)runs);
  }
  if (wt_inbox_count(fx, "DONE") != N) fail_msg("DONE entries: got %lld, want %d", (long long)wt_inbox_count(fx, "DONE"), N);
  print_message("first worker ran %llu, second %llu, duplicates %llu\n", (unsigned long long)a.runs_succeeded,
                (unsigned long long)b.runs_succeeded, (unsigned long long)(a.duplicates + b.duplicates));
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
}

/* Records produced before the worker starts are behind it: one key keeps them in one lane whose
 * ERP call takes 200 ms, so the consumer can run at most a lane's queue ahead of the pipeline and
 * the lag stays above 0 for seconds; once every event is DONE it falls to 0. The gauge is read
 * from /metrics and from obx_worker_stats in the same poll. */
static void test_consumer_lag_metric(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  enum { N = 60 };
  obx_event_t ev[N];
  wt_route_delay(fx, "L-1", 200, 200);
  for (int i = 0; i < N; i++) {
    wt_event(&ev[i], "OrderConfirmed", "K-L", "L-1");
    wt_produce(fx, &ev[i]);
  }
  wt_start_worker(fx);
  obx_worker_stats_t s;
  double shown = -1;
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  do {
    usleep(20000);
    shown = wt_metric("outboxd_worker_consumer_lag");
    obx_worker_stats(fx->worker, &s);
  } while (!(shown > 0 && s.lag > 0) && obx_test_now_ms() < deadline);
  if (!(shown > 0 && s.lag > 0))
    fail_msg("consumer lag while %d records wait: got /metrics %g, stats %lld, want > 0", N, shown, (long long)s.lag);
  if (s.lag > N) fail_msg("consumer lag: got %lld, want <= %d", (long long)s.lag, N);
  for (int i = 0; i < N; i++) wt_wait_status(fx, ev[i].id, "DONE");
  deadline = obx_test_now_ms() + WT_WAIT_MS;
  do {
    usleep(20000);
    shown = wt_metric("outboxd_worker_consumer_lag");
    obx_worker_stats(fx->worker, &s);
  } while (!(shown == 0 && s.lag == 0) && obx_test_now_ms() < deadline);
  if (!(shown == 0 && s.lag == 0))
    fail_msg("consumer lag with every record done: got /metrics %g, stats %lld, want 0", shown, (long long)s.lag);
  assert_int_equal(wt_erp_calls(fx, "L-1"), N);
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
}

/* Waits until this worker's parked-key count is want, then /metrics must show the same. */
static void wait_parked_keys(wt_fx_t *fx, int64_t want) {
  obx_worker_stats_t s;
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  do {
    obx_worker_stats(fx->worker, &s);
    if (s.parked_keys == want) break;
    usleep(50000);
  } while (obx_test_now_ms() < deadline);
  if (s.parked_keys != want) fail_msg("parked keys (stats): got %lld, want %lld", (long long)s.parked_keys, (long long)want);
  double shown = wt_metric("outboxd_worker_parked_keys");
  if (shown != (double)want) fail_msg("/metrics outboxd_worker_parked_keys: got %g, want %lld", shown, (long long)want);
}

/* A terminal failure parks its key with a later event BLOCKED behind it: one parked key; an
 * operator release runs the blocked event and unparks the key: none. */
static void test_parked_keys_metric(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  obx_event_t head, later, other;
  wt_event(&head, "OrderConfirmed", "K-P", "PK-0");
  wt_event(&later, "OrderConfirmed", "K-P", "PK-1");
  wt_event(&other, "OrderConfirmed", "K-Q", "PK-2");
  wt_route(fx, "PK-0", 400);
  wt_route(fx, "PK-1", 200);
  wt_route(fx, "PK-2", 200);
  wt_produce(fx, &head);
  wt_produce(fx, &later);
  wt_produce(fx, &other);
  wt_wait_status(fx, head.id, "DEAD");
  wt_wait_status(fx, later.id, "BLOCKED");
  wt_wait_status(fx, other.id, "DONE");
  wait_parked_keys(fx, 1);

  obx_ops_t ops = {fx->mongo, fx->ladder, fx->group, "tester", "--who"};
  bson_t out = BSON_INITIALIZER;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ops_key_release(&ops, NULL, "K-P", false, &out, &err)) fail_msg("release: %s", err.msg);
  assert_string_equal(obx_mongo_doc_str(&out, "nextEvent"), later.id);
  bson_destroy(&out);
  wt_wait_status(fx, later.id, "DONE");
  wt_wait_unparked(fx, "K-P");
  wait_parked_keys(fx, 0);
  obx_event_cleanup(&head);
  obx_event_cleanup(&later);
  obx_event_cleanup(&other);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_success_and_no_pipeline, setup, teardown),
    cmocka_unit_test_setup_teardown(test_duplicates_are_skipped, setup, teardown),
    cmocka_unit_test_setup_teardown(test_transient_failure_succeeds_on_tier_two, setup, teardown),
    cmocka_unit_test_setup_teardown(test_exhaustion_to_dlq_then_redrive, setup, teardown),
    cmocka_unit_test_setup_teardown(test_terminal_failure_goes_straight_to_dlq, setup, teardown),
    cmocka_unit_test_setup_teardown(test_malformed_record_goes_to_dlq_and_partition_moves_on, setup, teardown),
    cmocka_unit_test_setup_teardown(test_per_key_order_with_failing_head, setup, teardown),
    cmocka_unit_test_setup_teardown(test_different_keys_run_in_parallel, setup, teardown),
    cmocka_unit_test_setup_teardown(test_rebalance_runs_each_event_once, setup, teardown),
    cmocka_unit_test_setup_teardown(test_same_key_in_offset_order_while_other_keys_run, setup, teardown),
    cmocka_unit_test_setup_teardown(test_event_pipeline_emits_into_outbox, setup, teardown),
    cmocka_unit_test_setup_teardown(test_consumer_lag_metric, setup, teardown),
    cmocka_unit_test_setup_teardown(test_parked_keys_metric, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
