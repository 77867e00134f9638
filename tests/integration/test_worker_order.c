/* test_worker_order.c - per-key order from the source: the topic's partition count grows mid-run
 * and a key's events still run in write order (issue 11 item 8)
 *
 * DESIGN: on the run's real Kafka broker, a topic with 2 partitions; the relay and the worker run
 * in this process with a 500 ms metadata refresh, so both see new partitions within a second.
 * The key's events are written through the library call (obx_outbox_append in a transaction:
 * keySeq 1, 2, 3...), published by the relay (ce_keyseq) and run by the worker's order.post
 * pipeline, which calls the scripted ERP once per event (POST /erp/<orderNumber>); the ERP's
 * request log is the order of execution. The key is chosen so that murmur2 sends it to partition
 * p of 2 and to a partition >= 2 of 6. Its second event fails (503) until the test scripts
 * success, so the key is parked and its third event waits BLOCKED; then the topic grows to 6
 * partitions (AdminClient CreatePartitions) and later events of the key are written until they
 * land on the new partition, where their offsets start again at 0, below the third event's: an
 * order by Kafka offset would run them before it. Once the head succeeds, every event must run
 * exactly once, each after the one written before it (ordered by offset, as before ce_keyseq,
 * the sixth ran before the fifth). A second case writes the key's events across the growth with
 * no failure while the key has a backlog (its first call takes 3 s), so the growth's rebalance
 * reads both partitions again with events of the key unfinished: every event still runs once,
 * in write order. That the key's queue itself follows keySeq whatever the arrival order is
 * tests/unit/test_worker_sched.c's.
 *
 * Across two replicas (src/worker/keyseq.c): two `outboxd --roles worker` processes of one group,
 * each owning one of the topic's 2 partitions (probe events tell that the group settled so); a key's
 * keySeq 2 is produced to one replica's partition first, keySeq 1 to the other's only once
 * keySeq 2 waits for it, with an ERP call of 2 s: keySeq 2's call starts after keySeq 1's ended
 * (the ERP records each call's start and end). Without the wait keySeq 2 ran before keySeq 1 was
 * even written. And the bound: a keySeq whose predecessor never comes runs after WORKER_GAP_WAIT
 * (2 s here), counted in outboxd_worker_keyseq_gaps_total{outcome="timeout"}, while another key
 * runs meanwhile; delivered again, it is a duplicate at once (its entry exists: no second wait). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "obx/obx_bucket.h"
#include "obx/obx_outbox.h"
#include "obx/obx_relay.h"
#include "obx_test_doc.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

#define GROWN 6
#define MAX_EVENTS 48

static void *relay;                    /* stopped by teardown, also when a test fails */
static obx_test_outboxd_t replicas[2]; /* the keySeq gap case's worker processes, stopped by teardown */

typedef struct {
  wt_fx_t *fx;
  char key[32];
  int head;                            /* the index of the event that fails first (-1: none) */
  int slow;                            /* the index of the event whose call takes 3 s (-1: none) */
  int n;                               /* events written */
  char ids[MAX_EVENTS][OBX_UUID_LEN + 1];
  char nums[MAX_EVENTS][48];           /* orderNumber: <key>-<n>, the ERP path */
} order_t;

static int setup(void **state) {
  int rc = wt_setup_state_on(state, 2, NULL);
  wt_fx_t *fx = *state;
  if (fx) {
    wt_conf_set(fx, "kafka.topic.metadata.refresh.interval.ms", "500");
    wt_conf_set(fx, "kafka.session.timeout.ms", "6000"); /* the group settles quickly when a member joins */
    wt_conf_set(fx, "kafka.heartbeat.interval.ms", "1000");
    fx->attempts = 100; /* the head keeps failing (200 ms, then 500 ms apart) until the test lets it succeed */
  }
  return rc;
}

static int teardown(void **state) {
  obx_relay_stop(relay);
  relay = NULL;
  wt_stop_worker_processes(replicas, 2);
  wt_teardown(*state);
  return 0;
}

/* A key that murmur2 sends to a partition of 2 and to a partition >= 2 of GROWN. */
static void pick_key(order_t *o, const char *base) {
  for (int i = 0;; i++) {
    snprintf(o->key, sizeof o->key, "%s-%d", base, i);
    if (obx_bucket_of(o->key, strlen(o->key), GROWN) >= 2) return;
  }
}

static bool append_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  order_t *o = ctx;
  mongoc_collection_t *outbox = obx_mongo_collection(o->fx->mongo, mongoc_client_session_get_client(session), "outbox");
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", o->key, o->nums[o->n]);
  memcpy(o->ids[o->n], ev.id, sizeof ev.id);
  bool ok = obx_outbox_append(session, outbox, &ev, err);
  obx_event_cleanup(&ev);
  mongoc_collection_destroy(outbox);
  return ok;
}

/* Writes the key's next event through the library call; returns its index. */
static int write_event(order_t *o) {
  assert_true(o->n < MAX_EVENTS);
  snprintf(o->nums[o->n], sizeof o->nums[0], "%s-%02d", o->key, o->n + 1);
  if (o->n != o->head) wt_route_delay(o->fx, o->nums[o->n], 200, o->n == o->slow ? 3000 : 0);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_mongo_transaction(o->fx->mongo, append_txn, o, &err)) fail_msg("append: %s", err.msg);
  return o->n++;
}

/* The inbox entry of event i, waited for: its partition and offset. */
static void wait_entry(order_t *o, int i, int64_t *partition, int64_t *offset) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  for (;;) {
    bson_t doc;
    bool found = wt_inbox(o->fx, o->ids[i], &doc);
    *partition = found ? obx_test_doc_int(&doc, "source.partition") : -1;
    *offset = found ? obx_test_doc_int(&doc, "source.offset") : -1;
    bson_destroy(&doc);
    if (found) return;
    if (obx_test_now_ms() > deadline) fail_msg("event %d (%s) never reached the inbox", i + 1, o->nums[i]);
    usleep(20000);
  }
}

/* Raises the topic's partition count to n (Kafka's CreatePartitions). */
static void grow_topic(const char *bootstrap, const char *topic, int n) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  assert_int_equal(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr, sizeof errstr), RD_KAFKA_CONF_OK);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  if (!rk) fail_msg("admin client: %s", errstr);
  rd_kafka_NewPartitions_t *np = rd_kafka_NewPartitions_new(topic, (size_t)n, errstr, sizeof errstr);
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  rd_kafka_CreatePartitions(rk, &np, 1, NULL, q);
  rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
  size_t nres = 0;
  const rd_kafka_topic_result_t **res =
    ev ? rd_kafka_CreatePartitions_result_topics(rd_kafka_event_CreatePartitions_result(ev), &nres) : NULL;
  bool ok = nres == 1 && rd_kafka_topic_result_error(res[0]) == RD_KAFKA_RESP_ERR_NO_ERROR;
  char why[256];
  snprintf(why, sizeof why, "%s", !ev ? "no answer in 30 s" : nres ? rd_kafka_topic_result_error_string(res[0]) : "no result");
  if (ev) rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_NewPartitions_destroy(np);
  rd_kafka_destroy(rk);
  if (!ok) fail_msg("CreatePartitions %s -> %d: %s", topic, n, why);
}

/* Writes an event of the key every 250 ms (its relay publishes within milliseconds) until one
 * is stored from a partition >= 2 (the relay's producer refreshed its metadata: 500 ms), for at
 * most 10 s; returns the index of the first such event. */
static int write_until_new_partition(order_t *o) {
  int64_t deadline = obx_test_now_ms() + 10000;
  for (;;) {
    int64_t next = obx_test_now_ms() + 250;
    int i = write_event(o);
    int64_t partition, offset;
    wait_entry(o, i, &partition, &offset);
    if (partition >= 2) return i;
    if (obx_test_now_ms() > deadline || o->n == MAX_EVENTS) fail_msg("no event of %s reached a new partition", o->key);
    while (obx_test_now_ms() < next) usleep(10000); /* the pace of the writes, not a wait for a condition */
  }
}

/* Every event ran to DONE, each exactly once after the one written before it finished: its
 * first ERP call comes after the previous event's last (successful) call. */
static void expect_write_order(order_t *o, int head_calls_at_least) {
  int head = o->head;
  for (int i = 0; i < o->n; i++) wt_wait_status(o->fx, o->ids[i], "DONE");
  int prev_last = -1;
  for (int i = 0; i < o->n; i++) {
    char path[96];
    snprintf(path, sizeof path, "/erp/%s", o->nums[i]);
    int first = -1, last = -1, calls = 0, total = obx_test_httpd_nrequests(o->fx->httpd);
    for (int r = 0; r < total; r++) {
      obx_test_httpd_request_t req;
      if (!obx_test_httpd_request(o->fx->httpd, r, &req)) continue;
      if (strcmp(req.path, path) == 0) {
        if (first < 0) first = r;
        last = r;
        calls++;
      }
      obx_test_httpd_request_cleanup(&req);
    }
    int want_calls = i == head ? head_calls_at_least : 1;
    if (i == head ? calls < want_calls : calls != want_calls)
      fail_msg("%s: %d ERP calls, want %s%d", o->nums[i], calls, i == head ? "at least " : "", want_calls);
    if (first < prev_last)
      fail_msg("%s (keySeq %d) ran at request %d, before %s finished at request %d", o->nums[i], i + 1, first,
               o->nums[i - 1], prev_last);
    prev_last = last;
  }
}

static void start(order_t *o, wt_fx_t *fx, const char *base, int head, int slow) {
  memset(o, 0, sizeof *o);
  o->fx = fx;
  o->head = head;
  o->slow = slow;
  pick_key(o, base);
  wt_start_worker(fx);
  obx_err_t err = OBX_ERR_INIT;
  if (!(relay = obx_relay_start(&fx->conf, NULL, &err))) fail_msg("relay: %s", err.msg);
}

/* The key's head fails and parks it; its later events wait BLOCKED on the old partition and on
 * the new one, where offsets start again at 0; the head succeeds: all run in write order. */
static void test_parked_key_across_partition_growth(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  order_t o;
  start(&o, fx, "grow-park", 1, -1);
  char head_num[48];
  snprintf(head_num, sizeof head_num, "%s-02", o.key);
  wt_route(fx, head_num, 503);
  for (int i = 0; i < 3; i++) write_event(&o);
  wt_wait_status(fx, o.ids[1], "RETRYING");
  wt_wait_status(fx, o.ids[2], "BLOCKED");
  int64_t old_partition, third_offset;
  wait_entry(&o, 2, &old_partition, &third_offset);
  assert_true(old_partition < 2);

  grow_topic(fx->broker.bootstrap, fx->topic, GROWN);
  int moved = write_until_new_partition(&o);
  write_event(&o); /* and one more behind it */
  int64_t partition, offset;
  wait_entry(&o, moved, &partition, &offset);
  printf("%s: events 1-%d on partition %lld (event 3 at offset %lld), event %d on partition %lld at offset %lld\n",
         o.key, moved, (long long)old_partition, (long long)third_offset, moved + 1, (long long)partition, (long long)offset);
  /* the case the source sequence exists for: by offset the new partition's event would come first */
  assert_true(offset < third_offset);
  for (int i = 2; i < o.n; i++) wt_wait_status(fx, o.ids[i], "BLOCKED");

  wt_route(fx, head_num, 200);
  expect_write_order(&o, 2);
}

/* No failure, a backlog at the growth: the key's events are written across it while the worker
 * runs them; the events of the new partition run after every earlier one of the old partition. */
static void test_running_key_across_partition_growth(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  order_t o;
  start(&o, fx, "grow-run", -1, 0); /* a backlog of the key when the topic grows */
  for (int i = 0; i < 3; i++) write_event(&o);
  grow_topic(fx->broker.bootstrap, fx->topic, GROWN);
  write_until_new_partition(&o);
  for (int i = 0; i < 3; i++) write_event(&o);
  expect_write_order(&o, 1);
}

/* ---- keySeq gaps across replicas ---- */

/* The owner (process) recorded on an event's inbox entry into out. */
static void entry_owner(wt_fx_t *fx, const char *id, char *out, size_t len) {
  bson_t doc;
  bool found = wt_inbox(fx, id, &doc);
  const char *owner = found ? obx_mongo_doc_str(&doc, "owner") : NULL;
  snprintf(out, len, "%s", owner ? owner : "");
  bson_destroy(&doc);
}

/* Waits until the two replicas own one partition each: a probe event (no keySeq) per partition,
 * again every 500 ms, until the two latest ran in two processes. */
static void wait_partitions_split(wt_fx_t *fx) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  for (int round = 0;; round++) {
    char owners[2][128];
    for (int p = 0; p < 2; p++) {
      char num[32];
      snprintf(num, sizeof num, "probe-%d-%d", round, p);
      obx_event_t ev;
      wt_event(&ev, "OrderConfirmed", num, num);
      wt_route(fx, num, 200);
      wt_produce_to(fx, &ev, p);
      wt_wait_status(fx, ev.id, "DONE");
      entry_owner(fx, ev.id, owners[p], sizeof owners[p]);
      obx_event_cleanup(&ev);
    }
    if (strcmp(owners[0], owners[1]) != 0) return;
    if (obx_test_now_ms() > deadline) fail_msg("the two replicas never owned a partition each");
    usleep(500 * 1000); /* the pace of the probes, not a wait for a condition */
  }
}

static double gap_metric(const char *outcome) {
  char series[96];
  snprintf(series, sizeof series, "outboxd_worker_keyseq_gaps_total{outcome=\"%s\"}", outcome);
  double v = wt_metric(series);
  return v < 0 ? 0 : v;
}

static double waits_begun(void) {
  double v = wt_metric("outboxd_worker_transitions_total{from=\"queued\",to=\"waiting_gap\"}");
  return v < 0 ? 0 : v;
}

/* The ERP's record of the (only) call to /erp/<num>. */
static void call_of(wt_fx_t *fx, const char *num, obx_test_httpd_request_t *req) {
  int i = wt_last_call_index(fx, num);
  if (i < 0 || !obx_test_httpd_request(fx->httpd, i, req)) fail_msg("no ERP call of %s", num);
}

/* Lines of both replicas' logs that contain what. */
static int replica_lines(const char *what) {
  return wt_log_lines(replicas[0].proc.log_path, what) + wt_log_lines(replicas[1].proc.log_path, what);
}

/* Two `outboxd --roles worker` replicas, one partition each; a key's keySeq 2 on one replica's
 * partition, keySeq 1 on the other's written only once keySeq 2 waits, its call taking 2 s:
 * keySeq 2 never starts before keySeq 1 ended. */
static void test_two_replicas_wait_for_the_earlier_keyseq(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  for (int i = 0; i < 2; i++) wt_start_worker_process(fx, &replicas[i]);
  wait_partitions_split(fx);
  obx_event_t ev[2];
  char num[2][16];
  for (int i = 0; i < 2; i++) {
    snprintf(num[i], sizeof num[i], "KS2-%d", i + 1);
    wt_event(&ev[i], "OrderConfirmed", "KS2", num[i]);
    ev[i].key_seq = i + 1;
    wt_route_delay(fx, num[i], 200, i == 0 ? 2000 : 0);
  }
  wt_produce_to(fx, &ev[1], 1);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (replica_lines("keySeq 2 waits for it") < 1 && obx_test_now_ms() < deadline) usleep(10000);
  if (wt_erp_calls(fx, num[1]) != 0) fail_msg("keySeq 2 ran before keySeq 1 was written");
  if (replica_lines("keySeq 2 waits for it") < 1) fail_msg("keySeq 2 never waited for keySeq 1");
  wt_produce_to(fx, &ev[0], 0);
  wt_wait_status(fx, ev[0].id, "DONE");
  wt_wait_status(fx, ev[1].id, "DONE");
  char owners[2][128];
  for (int i = 0; i < 2; i++) entry_owner(fx, ev[i].id, owners[i], sizeof owners[i]);
  if (strcmp(owners[0], owners[1]) == 0) fail_msg("both keySeqs ran in one replica (%s)", owners[0]);
  obx_test_httpd_request_t first, next;
  call_of(fx, num[0], &first);
  call_of(fx, num[1], &next);
  printf("keySeq 1 on %s: call %lld-%lld ms; keySeq 2 on %s: call starts at %lld ms\n", owners[0], 0LL,
         (long long)(first.end_ms - first.start_ms), owners[1], (long long)(next.start_ms - first.start_ms));
  if (next.start_ms < first.end_ms)
    fail_msg("keySeq 2's call started %lld ms before keySeq 1's ended", (long long)(first.end_ms - next.start_ms));
  if (wt_erp_calls(fx, num[0]) != 1 || wt_erp_calls(fx, num[1]) != 1)
    fail_msg("ERP calls: %d and %d, want 1 each", wt_erp_calls(fx, num[0]), wt_erp_calls(fx, num[1]));
  if (replica_lines("keySeq 1 of key KS2 settled after") != 1) fail_msg("the wait did not end with keySeq 1 settled");
  obx_test_httpd_request_cleanup(&first);
  obx_test_httpd_request_cleanup(&next);
  for (int i = 0; i < 2; i++) obx_event_cleanup(&ev[i]);
}

/* keySeq 1 never comes: keySeq 2 runs once WORKER_GAP_WAIT (2 s) passed, with the timeout
 * counted; an event of another key, produced after it, runs before it. */
static void test_missing_keyseq_runs_after_the_gap_wait(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.gap_wait", "2s");
  wt_start_worker(fx);
  obx_event_t lone, other;
  wt_event(&lone, "OrderConfirmed", "KT", "KT-2");
  lone.key_seq = 2;
  wt_event(&other, "OrderConfirmed", "KO", "KO-1");
  wt_route(fx, "KT-2", 200);
  wt_route(fx, "KO-1", 200);
  double timeouts = gap_metric("timeout");
  int64_t t0 = obx_time_now_ms(); /* the ERP's clock: wall-clock ms */
  wt_produce_to(fx, &lone, 0);
  wt_produce_to(fx, &other, 0);
  wt_wait_status(fx, lone.id, "DONE");
  obx_test_httpd_request_t req;
  call_of(fx, "KT-2", &req);
  printf("keySeq 2 without keySeq 1: ran %lld ms after it was produced (WORKER_GAP_WAIT 2 s)\n",
         (long long)(req.start_ms - t0));
  if (req.start_ms - t0 < 2000) fail_msg("keySeq 2 ran %lld ms after it came, want >= 2000", (long long)(req.start_ms - t0));
  if (gap_metric("timeout") < timeouts + 1) fail_msg("keyseq_gaps_total{timeout} did not grow");
  if (wt_last_call_index(fx, "KO-1") < 0 || wt_last_call_index(fx, "KO-1") > wt_last_call_index(fx, "KT-2"))
    fail_msg("the other key waited behind the gap");
  /* the record again (a redelivery): its entry exists, it is a duplicate without a second wait */
  double waits = waits_begun();
  double dups = wt_metric("outboxd_worker_transitions_total{from=\"decoded\",to=\"duplicate\"}");
  wt_produce_to(fx, &lone, 0);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_metric("outboxd_worker_transitions_total{from=\"decoded\",to=\"duplicate\"}") < (dups < 0 ? 0 : dups) + 1 &&
         obx_test_now_ms() < deadline)
    usleep(10000);
  if (wt_metric("outboxd_worker_transitions_total{from=\"decoded\",to=\"duplicate\"}") < (dups < 0 ? 0 : dups) + 1)
    fail_msg("the redelivered keySeq 2 was not skipped as a duplicate");
  if (waits_begun() != waits) fail_msg("the redelivered keySeq 2 waited for the gap again");
  if (wt_erp_calls(fx, "KT-2") != 1) fail_msg("ERP calls of KT-2: got %d, want 1", wt_erp_calls(fx, "KT-2"));
  obx_test_httpd_request_cleanup(&req);
  obx_event_cleanup(&lone);
  obx_event_cleanup(&other);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_two_replicas_wait_for_the_earlier_keyseq, setup, teardown),
    cmocka_unit_test_setup_teardown(test_missing_keyseq_runs_after_the_gap_wait, setup, teardown),
    cmocka_unit_test_setup_teardown(test_parked_key_across_partition_growth, setup, teardown),
    cmocka_unit_test_setup_teardown(test_running_key_across_partition_growth, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
