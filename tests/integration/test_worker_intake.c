/* test_worker_intake.c - the Kafka poll thread never blocks: a hung key holds its partition only
 *
 * DESIGN: one key's first call hangs for 20 s (egress.timeout raised above it) with more of its
 * events queued behind it than a key may hold, so its partition is held; 1,000 events of other
 * keys complete while it hangs, their partitions' offsets are committed (read back by a consumer
 * of the group that never joins it), and the member stays in the group past
 * max.poll.interval.ms (no revocation). The held partition keeps what librdkafka prefetched for
 * it, and every record is fetched once (librdkafka's statistics). When the call returns, the
 * key's events run in order. */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker_test.h"

#define NOTHER 1000
#define KEY_CAP 64 /* the events a key may hold (kafka.c KEY_QUEUE_CAP) */
#define NHUNG 80   /* more than that */
#define HANG_MS 20000

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

/* The committed offsets of the fixture's group, per partition (-1: none). */
static void committed(wt_fx_t *fx, int64_t out[3]) {
  char errstr[256];
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  rd_kafka_conf_set(c, "bootstrap.servers", fx->broker.bootstrap, errstr, sizeof errstr);
  rd_kafka_conf_set(c, "group.id", fx->group, errstr, sizeof errstr);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, errstr, sizeof errstr);
  assert_non_null(rk);
  rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(3);
  for (int p = 0; p < 3; p++) rd_kafka_topic_partition_list_add(parts, fx->topic, p);
  rd_kafka_resp_err_t rerr = rd_kafka_committed(rk, parts, 10000);
  if (rerr) fail_msg("committed: %s", rd_kafka_err2str(rerr));
  for (int p = 0; p < 3; p++) out[p] = parts->elems[p].offset;
  rd_kafka_topic_partition_list_destroy(parts);
  rd_kafka_destroy(rk);
}

/* Produces ev without waiting for its delivery (wt_produce flushes each record). */
static void produce_async(wt_fx_t *fx, const obx_event_t *ev) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_to_kafka(ev, NULL, &rec, &err)) fail_msg("to_kafka: %s", err.msg);
  rd_kafka_headers_t *hdrs = rd_kafka_headers_new((size_t)rec.nheaders);
  for (int i = 0; i < rec.nheaders; i++)
    rd_kafka_header_add(hdrs, rec.headers[i].name, -1, rec.headers[i].value, (ssize_t)rec.headers[i].len);
  rd_kafka_resp_err_t rerr;
  while ((rerr = rd_kafka_producev(fx->producer, RD_KAFKA_V_TOPIC(fx->topic), RD_KAFKA_V_KEY(rec.key, rec.key_len),
                                   RD_KAFKA_V_VALUE(rec.value, rec.value_len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                   RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
    rd_kafka_poll(fx->producer, 10);
  if (rerr) fail_msg("produce: %s", rd_kafka_err2str(rerr));
  obx_kafka_record_cleanup(&rec);
}

/* The worker's stats once librdkafka's statistics have been reported twice more (one report
 * made wholly after the call). */
static void fresh_kafka_stats(wt_fx_t *fx, obx_worker_stats_t *s) {
  obx_worker_stats(fx->worker, s);
  uint64_t from = s->kafka_stats_reports;
  int64_t deadline = obx_test_now_ms() + 10000;
  while (s->kafka_stats_reports < from + 2 && obx_test_now_ms() < deadline) {
    usleep(20000);
    obx_worker_stats(fx->worker, s);
  }
  if (s->kafka_stats_reports < from + 2) fail_msg("no librdkafka statistics report within 10 s");
}

static int64_t high_watermark(wt_fx_t *fx, int32_t partition) {
  int64_t lo, hi;
  rd_kafka_resp_err_t rerr = rd_kafka_query_watermark_offsets(fx->producer, fx->topic, partition, &lo, &hi, 10000);
  if (rerr) fail_msg("watermarks: %s", rd_kafka_err2str(rerr));
  return hi;
}

static void test_hung_key_holds_only_its_partition(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "egress.timeout", "40s");
  wt_conf_set(fx, "kafka.max.poll.interval.ms", "10000");
  wt_conf_set(fx, "kafka.session.timeout.ms", "6000");
  wt_conf_set(fx, "kafka.heartbeat.interval.ms", "1000");
  wt_conf_set(fx, "kafka.statistics.interval.ms", "100");
  wt_start_worker(fx);

  obx_event_t *hung = calloc(NHUNG, sizeof *hung), *other = calloc(NOTHER, sizeof *other);
  char num[32];
  wt_event(&hung[0], "OrderConfirmed", "K-HANG", "H-0");
  wt_route_delay(fx, "H-0", 200, HANG_MS);
  wt_produce(fx, &hung[0]);
  wt_wait_calls(fx, "H-0", 1);
  int64_t t0 = obx_test_now_ms();
  bson_t doc;
  bson_iter_t it, d;
  wt_inbox(fx, hung[0].id, &doc);
  assert_true(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "source.partition", &d));
  int32_t hung_partition = (int32_t)bson_iter_as_int64(&d);
  bson_destroy(&doc);
  for (int i = 0; i < NOTHER; i++) {
    snprintf(num, sizeof num, "O-%d", i);
    wt_event(&other[i], "OrderConfirmed", num, num);
    wt_route(fx, num, 200);
    produce_async(fx, &other[i]);
  }
  for (int i = 1; i < NHUNG; i++) {
    snprintf(num, sizeof num, "H-%d", i);
    wt_event(&hung[i], "OrderConfirmed", "K-HANG", num);
    wt_route(fx, num, 200);
    produce_async(fx, &hung[i]);
  }
  if (rd_kafka_flush(fx->producer, 20000)) fail_msg("produce: flush timed out");
  int64_t deadline = t0 + HANG_MS - 2000;
  while (wt_inbox_count(fx, "DONE") < NOTHER && obx_test_now_ms() < deadline) usleep(50000);
  int64_t done = wt_inbox_count(fx, "DONE");
  if (done < NOTHER) fail_msg("events of other keys DONE while one key hangs: got %lld, want %d", (long long)done, NOTHER);
  print_message("%d events of other keys done %lld ms after the hung call started\n", NOTHER,
                (long long)(obx_test_now_ms() - t0));
  assert_int_equal(wt_erp_calls(fx, "H-1"), 0);
  obx_worker_stats_t s;
  for (;;) { /* the hung key's events are read right behind the others */
    obx_worker_stats(fx->worker, &s);
    if (s.paused_partitions == 1 || obx_test_now_ms() > deadline) break;
    usleep(20000);
  }
  if (s.paused_partitions != 1) fail_msg("held partitions: got %lld, want 1", (long long)s.paused_partitions);
  /* The held partition is not read, and what librdkafka prefetched for it stays prefetched: the
   * hung key's events past the 64 it holds (a paused partition's would have been dropped). */
  fresh_kafka_stats(fx, &s);
  print_message("records prefetched and not read while the partition is held: %lld\n", (long long)s.prefetched_records);
  assert_int_equal(s.prefetched_records, NHUNG - KEY_CAP);

  /* Offsets of the other partitions are committed up to their end; the hung one's stays behind. */
  int64_t c[3], want[3];
  for (int p = 0; p < 3; p++) want[p] = high_watermark(fx, p);
  for (;;) {
    committed(fx, c);
    bool all = true;
    for (int p = 0; p < 3; p++)
      if (p != hung_partition && c[p] != want[p]) all = false;
    if (all || obx_test_now_ms() > deadline) break;
    usleep(200000);
  }
  for (int p = 0; p < 3; p++) {
    print_message("partition %d: committed %lld, end %lld%s\n", p, (long long)c[p], (long long)want[p],
                  p == hung_partition ? " (the hung key's)" : "");
    if (p != hung_partition && c[p] != want[p]) fail_msg("partition %d committed %lld, want %lld", p, (long long)c[p], (long long)want[p]);
    if (p == hung_partition && c[p] >= want[p]) fail_msg("the hung key's partition committed past its hung event");
  }
  /* Past max.poll.interval.ms (10 s) since the call hung: still a member, never revoked. */
  while (obx_test_now_ms() - t0 < 12000) usleep(100000);
  obx_worker_stats(fx->worker, &s);
  assert_int_equal(s.revocations, 0);
  assert_int_equal(s.paused_partitions, 1);

  /* The call returns (HANG_MS after it started): the key's events run, in order. */
  while (obx_test_now_ms() - t0 < HANG_MS) usleep(100000);
  for (int i = 0; i < NHUNG; i++) wt_wait_status(fx, hung[i].id, "DONE");
  int last = -1;
  for (int i = 0; i < NHUNG; i++) {
    snprintf(num, sizeof num, "H-%d", i);
    int idx = wt_last_call_index(fx, num);
    if (idx <= last)
      fail_msg("H-%d reached the ERP (request %d) before an earlier event of its key (request %d); H-0 called %d times", i,
               idx, last, wt_erp_calls(fx, "H-0"));
    last = idx;
  }
  obx_worker_stats(fx->worker, &s);
  assert_int_equal(s.revocations, 0);
  /* Each record was fetched from the broker once: holding a partition never made librdkafka drop
   * and fetch again what it had prefetched (rd_kafka_pause_partitions does, on every resume). */
  fresh_kafka_stats(fx, &s);
  print_message("records fetched %lld, produced %d\n", (long long)s.fetched_records, NHUNG + NOTHER);
  assert_int_equal(s.fetched_records, NHUNG + NOTHER);
  for (int i = 0; i < NHUNG; i++) obx_event_cleanup(&hung[i]);
  for (int i = 0; i < NOTHER; i++) obx_event_cleanup(&other[i]);
  free(hung);
  free(other);
}

/* The in-flight bound holds every partition with a record waiting: with WORKER_MAX_INFLIGHT 20
 * and the calls of 40 events of 40 keys slow, 20 run while the other 20 stay prefetched, unread
 * (no call of theirs starts); once the first ones end, they run; every record is fetched once. */
#define BOUND 20
#define NBOUND 40
#define BOUND_CALL_MS 4000

/* Starts the worker at WORKER_MAX_INFLIGHT BOUND (statistics every 100 ms) with NBOUND events of
 * NBOUND keys, prefix-<i>, whose calls take delay_ms(i) (routes set, nothing produced yet).
 * Returns the fixture's request count before them. */
static int start_bounded(wt_fx_t *fx, obx_event_t ev[NBOUND], const char *prefix, int (*delay_ms)(int i)) {
  char bound[16], num[32];
  snprintf(bound, sizeof bound, "%d", BOUND);
  wt_conf_set(fx, "worker.max_inflight", bound);
  wt_conf_set(fx, "kafka.statistics.interval.ms", "100");
  wt_conf_set(fx, "egress.timeout", "20s"); /* above the slow calls */
  int before = obx_test_httpd_nrequests(fx->httpd);
  wt_start_worker(fx);
  for (int i = 0; i < NBOUND; i++) {
    snprintf(num, sizeof num, "%s-%d", prefix, i);
    wt_event(&ev[i], "OrderConfirmed", num, num);
    wt_route_delay(fx, num, 200, delay_ms(i));
  }
  return before;
}

static int bound_call_ms(int i) {
  (void)i;
  return BOUND_CALL_MS;
}

/* Flushes the producer, then waits up to within_ms for want calls since before; returns them. */
static int flush_then_wait_calls(wt_fx_t *fx, int before, int want, int within_ms) {
  if (rd_kafka_flush(fx->producer, 20000)) fail_msg("produce: flush timed out");
  int64_t deadline = obx_test_now_ms() + within_ms;
  while (obx_test_httpd_nrequests(fx->httpd) - before < want && obx_test_now_ms() < deadline) usleep(10000);
  return obx_test_httpd_nrequests(fx->httpd) - before;
}

static void test_bound_holds_the_partitions_with_records_waiting(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev[NBOUND];
  int before = start_bounded(fx, ev, "B", bound_call_ms);
  for (int i = 0; i < NBOUND; i++) produce_async(fx, &ev[i]);
  int calls = flush_then_wait_calls(fx, before, BOUND, WT_WAIT_MS);
  if (calls < BOUND) fail_msg("calls started: got %d, want %d", calls, BOUND);
  obx_worker_stats_t s;
  fresh_kafka_stats(fx, &s); /* within the first calls' BOUND_CALL_MS */
  calls = obx_test_httpd_nrequests(fx->httpd) - before;
  print_message("in flight %lld, calls %d, partitions held %lld, records prefetched and not read %lld\n",
                (long long)s.in_flight, calls, (long long)s.paused_partitions, (long long)s.prefetched_records);
  assert_int_equal(s.in_flight, BOUND);
  assert_int_equal(calls, BOUND);
  if (s.paused_partitions < 1) fail_msg("partitions held at the bound: got %lld", (long long)s.paused_partitions);
  assert_int_equal(s.prefetched_records, NBOUND - BOUND);

  for (int i = 0; i < NBOUND; i++) wt_wait_status(fx, ev[i].id, "DONE");
  fresh_kafka_stats(fx, &s);
  print_message("records fetched %lld, produced %d; partitions held %lld\n", (long long)s.fetched_records, NBOUND,
                (long long)s.paused_partitions);
  assert_int_equal(s.fetched_records, NBOUND);
  assert_int_equal(s.paused_partitions, 0);
  for (int i = 0; i < NBOUND; i++) obx_event_cleanup(&ev[i]);
}

/* A partition held at the bound is read again as soon as the worker is under it: with
 * WORKER_MAX_INFLIGHT 20, 20 events in flight (one call of 1.5 s, 19 of 6 s) and 20 more
 * events held, the short call's end lets exactly one held event in while the 19 still run
 * (before, the intake waited for three quarters of the bound, here 5 more ends, and the 20th
 * slot stayed empty until the slow calls ended). */
#define REFILL_SHORT_MS 1500
#define REFILL_SLOW_MS 6000

static int refill_call_ms(int i) { return i == 0 ? REFILL_SHORT_MS : REFILL_SLOW_MS; }

static void test_bound_refills_as_each_event_ends(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev[NBOUND];
  int before = start_bounded(fx, ev, "R", refill_call_ms);
  for (int i = 0; i < BOUND; i++) produce_async(fx, &ev[i]); /* the bound's first 20, R-0 among them */
  flush_then_wait_calls(fx, before, BOUND, WT_WAIT_MS);
  for (int i = BOUND; i < NBOUND; i++) produce_async(fx, &ev[i]);
  flush_then_wait_calls(fx, before, BOUND, 0); /* the flush; the calls are counted after the statistics */
  obx_worker_stats_t s;
  fresh_kafka_stats(fx, &s);
  int calls = obx_test_httpd_nrequests(fx->httpd) - before;
  print_message("before R-0 ends: calls %d, in flight %lld, partitions held %lld, prefetched %lld\n", calls,
                (long long)s.in_flight, (long long)s.paused_partitions, (long long)s.prefetched_records);
  if (calls != BOUND || s.paused_partitions < 1 || s.prefetched_records != NBOUND - BOUND)
    fail_msg("R-0 ended before the other 20 events were held (calls %d): the machine was too slow for this test",
             calls);
  wt_wait_status(fx, ev[0].id, "DONE");
  int64_t ended = obx_test_now_ms();
  calls = flush_then_wait_calls(fx, before, BOUND + 1, 2000); /* the slow calls end more than 4 s after R-0 */
  obx_worker_stats(fx->worker, &s);
  print_message("%d calls started %lld ms after R-0 ended (19 slow ones still running); in flight %lld\n", calls,
                (long long)(obx_test_now_ms() - ended), (long long)s.in_flight);
  assert_int_equal(calls, BOUND + 1);
  assert_int_equal(s.in_flight, BOUND);
  for (int i = 0; i < NBOUND; i++) wt_wait_status(fx, ev[i].id, "DONE");
  for (int i = 0; i < NBOUND; i++) obx_event_cleanup(&ev[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_hung_key_holds_only_its_partition, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bound_holds_the_partitions_with_records_waiting, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bound_refills_as_each_event_ends, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
