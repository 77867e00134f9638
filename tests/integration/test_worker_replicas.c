/* test_worker_replicas.c - per-key order with two worker processes in one group
 *
 * DESIGN: two `outboxd --roles worker` (the real binary) share WORKER_GROUP, the topic's two
 * partitions and the work queue, so a head's retry may come back through the replica that does
 * not own its key's partition. Keys K-A and K-B each have a head that fails (503) until the test
 * scripts success, and three later events that wait BLOCKED behind it; events of other keys
 * must finish while the heads still fail. Two extra copies of K-A's head go to the work queue
 * once it can succeed, so several processes may finish that head at once. The scripted ERP's
 * recorded calls give the order of execution: per key, the head's first success, then its later
 * events in offset order, each exactly once. A second test plays a process stopping between a
 * head hand-over and its send. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test_outboxd.h"
#include "worker_test.h"

#define NREPLICAS 2
#define NLATER 3
#define NOTHER 4

static obx_test_outboxd_t replicas[NREPLICAS]; /* stopped by teardown, also when the test fails */

static int setup(void **state) { return wt_setup_state_on(state, 2, NULL); }

static int teardown(void **state) {
  wt_fx_t *fx = *state;
  wt_stop_worker_processes(replicas, NREPLICAS);
  if (fx) {
    char extra[96];
    snprintf(extra, sizeof extra, "%s.retry.3000ms", fx->prefix);
    const char *queues[] = {extra};
    wt_delete_amqp(queues, 1, NULL);
  }
  wt_teardown(fx);
  return 0;
}

/* Index of the nth (0-based) request to /erp/<num>, -1 when there are fewer. */
static int nth_call(wt_fx_t *fx, const char *num, int nth) {
  char path[64];
  snprintf(path, sizeof path, "/erp/%s", num);
  int total = obx_test_httpd_nrequests(fx->httpd), seen = 0, at = -1;
  for (int i = 0; i < total && at < 0; i++) {
    obx_test_httpd_request_t req;
    if (!obx_test_httpd_request(fx->httpd, i, &req)) continue;
    if (strcmp(req.path, path) == 0 && seen++ == nth) at = i;
    obx_test_httpd_request_cleanup(&req);
  }
  return at;
}

/* The head's first success (its call number `failures`), then the later events of its key,
 * each called once, in offset order. */
static void want_key_order(wt_fx_t *fx, const char *head, int failures, const char *const *later) {
  int prev = nth_call(fx, head, failures);
  if (prev < 0) fail_msg("%s: no call after its %d failures", head, failures);
  for (int i = 0; i < NLATER; i++) {
    int calls = 0, at = wt_calls(fx, later[i], &calls);
    if (calls != 1) fail_msg("%s reached the ERP %d times, want once", later[i], calls);
    if (at <= prev) fail_msg("%s reached the ERP at request %d, want after %d (%s)", later[i], at, prev,
                             i ? later[i - 1] : head);
    prev = at;
  }
}

static void test_two_replicas_keep_key_order(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.attempts", "4");
  /* A long second tier leaves the test time to script the heads' success before the last try. */
  wt_conf_set(fx, "worker.retry_ladder", "200ms,3s");
  for (int i = 0; i < NREPLICAS; i++) wt_start_worker_process(fx, &replicas[i]);

  const char *keys[2] = {"K-A", "K-B"}, *heads[2] = {"HA-0", "HB-0"};
  const char *later[2][NLATER] = {{"HA-1", "HA-2", "HA-3"}, {"HB-1", "HB-2", "HB-3"}};
  const char *others[NOTHER] = {"O-1", "O-2", "O-3", "O-4"};
  obx_event_t head_ev[2], later_ev[2][NLATER], other_ev[NOTHER];
  for (int k = 0; k < 2; k++) {
    wt_event(&head_ev[k], "OrderConfirmed", keys[k], heads[k]);
    wt_route(fx, heads[k], 503);
    for (int i = 0; i < NLATER; i++) {
      wt_event(&later_ev[k][i], "OrderConfirmed", keys[k], later[k][i]);
      wt_route(fx, later[k][i], 200);
    }
  }
  for (int i = 0; i < NOTHER; i++) {
    wt_event(&other_ev[i], "OrderConfirmed", others[i], others[i]);
    wt_route(fx, others[i], 200);
  }
  for (int k = 0; k < 2; k++) wt_produce(fx, &head_ev[k]);
  for (int i = 0; i < NLATER; i++)
    for (int k = 0; k < 2; k++) wt_produce(fx, &later_ev[k][i]);
  for (int i = 0; i < NOTHER; i++) wt_produce(fx, &other_ev[i]);

  /* While the heads retry, other keys finish and the later events wait. */
  for (int i = 0; i < NOTHER; i++) wt_wait_status(fx, other_ev[i].id, "DONE");
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < NLATER; i++) wt_wait_status(fx, later_ev[k][i].id, "BLOCKED");
    assert_true(wt_key_parked(fx, keys[k]));
  }
  for (int k = 0; k < 2; k++) {
    bson_t doc;
    wt_inbox(fx, head_ev[k].id, &doc);
    bson_iter_t it;
    const char *status = bson_iter_init_find(&it, &doc, "status") ? bson_iter_utf8(&it, NULL) : "";
    if (strcmp(status, "DONE") == 0) fail_msg("head %s DONE before its success was scripted", heads[k]);
    bson_destroy(&doc);
    for (int i = 0; i < NLATER; i++) assert_int_equal(wt_erp_calls(fx, later[k][i]), 0);
  }

  /* The second attempt of each head fails too; the third (tier 2, 3 s later) succeeds. */
  for (int k = 0; k < 2; k++) wt_wait_calls(fx, heads[k], 2);
  for (int k = 0; k < 2; k++) wt_route(fx, heads[k], 200);
  /* Two more copies of K-A's head on the work queue: several processes may finish the same head
   * at once, and only one of them may hand the key on. */
  for (int c = 0; c < 2; c++) {
    obx_envelope_t copy;
    obx_envelope_init(&copy);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_envelope_from_event(&copy, &head_ev[0], &err) || !obx_ladder_publish_work(fx->ladder, &copy, &err))
      fail_msg("copy of the head: %s", err.msg);
    obx_envelope_cleanup(&copy);
  }
  for (int k = 0; k < 2; k++) {
    wt_wait_status(fx, head_ev[k].id, "DONE");
    for (int i = 0; i < NLATER; i++) wt_wait_status(fx, later_ev[k][i].id, "DONE");
    wt_wait_unparked(fx, keys[k]);
    want_key_order(fx, heads[k], 2, later[k]);
    for (int i = 0; i < NLATER; i++) assert_int_equal(wt_executions(fx, later_ev[k][i].id), 1);
  }
  /* Which replica ran the retries is the broker's choice; report it. */
  for (int r = 0; r < NREPLICAS; r++) {
    obx_test_http_resp_t resp;
    const char *needle = "outboxd_worker_consumed_total{source=\"amqp\"} ";
    if (obx_test_http(replicas[r].port, "GET", "/metrics", NULL, NULL, NULL, &resp) && resp.body &&
        strstr(resp.body, needle))
      print_message("replica %d: %.0f work-queue events\n", r, strtod(strstr(resp.body, needle) + strlen(needle), NULL));
    obx_test_http_resp_cleanup(&resp);
  }
  for (int k = 0; k < 2; k++) {
    obx_event_cleanup(&head_ev[k]);
    for (int i = 0; i < NLATER; i++) obx_event_cleanup(&later_ev[k][i]);
  }
  for (int i = 0; i < NOTHER; i++) obx_event_cleanup(&other_ev[i]);
}

/* Stores ev in the inbox as the worker would, with status and seq. */
static void store(wt_fx_t *fx, const obx_event_t *ev, obx_inbox_status_t status, int64_t seq) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_to_kafka(ev, NULL, &rec, &err)) fail_msg("to_kafka: %s", err.msg);
  const char *names[OBX_CE_MAX_HEADERS];
  char *values[OBX_CE_MAX_HEADERS];
  for (int i = 0; i < rec.nheaders; i++) {
    names[i] = rec.headers[i].name;
    values[i] = strndup(rec.headers[i].value, rec.headers[i].len);
  }
  obx_inbox_entry_t entry = {.consumer = fx->group, .event = ev, .header_names = names,
                             .header_values = (const char *const *)values, .nheaders = rec.nheaders,
                             .source_kind = "amqp", .seq = seq};
  bool inserted = false;
  obx_inbox_status_t existing;
  if (!obx_inbox_claim(fx->client, obx_mongo_db_name(fx->mongo), NULL, &entry, status, &inserted, &existing, &err) ||
      !inserted)
    fail_msg("store %s: %s", ev->id, inserted ? err.msg : "already there");
  for (int i = 0; i < rec.nheaders; i++) free(values[i]);
  obx_kafka_record_cleanup(&rec);
}

/* A process moved the head of K-R from the finished H to the BLOCKED E and stopped before
 * sending E. A copy of H that merely arrives (a redrive) must not send E (the mover may still
 * be about to); H's message redelivered by the broker (the mover is gone) sends it, E runs
 * once, and the key is unparked. */
static void test_redelivered_head_sends_the_unsent_next(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  const char *db = obx_mongo_db_name(fx->mongo);
  obx_event_t head, next;
  wt_event(&head, "OrderConfirmed", "K-R", "R-0");
  wt_event(&next, "OrderConfirmed", "K-R", "R-1");
  wt_route(fx, "R-0", 200);
  wt_route(fx, "R-1", 200);
  store(fx, &head, OBX_INBOX_DONE, 1);
  store(fx, &next, OBX_INBOX_BLOCKED, 2);
  obx_err_t err = OBX_ERR_INIT;
  bool moved = false;
  if (!obx_inbox_park_key(fx->client, db, NULL, fx->group, "K-R", head.id, "RETRYING", &err) ||
      !obx_inbox_move_head(fx->client, db, NULL, fx->group, "K-R", head.id, next.id, &moved, &err) || !moved)
    fail_msg("park and move: %s", err.msg);

  obx_envelope_t msg;
  obx_envelope_init(&msg);
  if (!obx_envelope_from_event(&msg, &head, &err) || !obx_ladder_publish_work(fx->ladder, &msg, &err))
    fail_msg("copy of the head: %s", err.msg);
  wt_start_worker(fx);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  obx_worker_stats_t st;
  do {
    usleep(20000);
    obx_worker_stats(fx->worker, &st);
  } while (st.duplicates < 1 && obx_test_now_ms() < deadline);
  if (st.duplicates < 1) fail_msg("the copy of the head: got %llu duplicates, want 1", (unsigned long long)st.duplicates);
  wt_wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
  wt_wait_status(fx, next.id, "BLOCKED");
  assert_int_equal(wt_erp_calls(fx, "R-1"), 0);
  assert_true(wt_key_parked(fx, "K-R"));
  obx_worker_destroy(fx->worker);
  fx->worker = NULL;

  /* The same message taken and given back unacked: the broker redelivers it. */
  if (!obx_ladder_publish_work(fx->ladder, &msg, &err)) fail_msg("head: %s", err.msg);
  obx_ladder_opts_t lo = {.url = getenv("AMQP_URL"), .prefix = fx->prefix, .tiers_ms = fx->conf.retry_ladder.ms,
                          .ntiers = fx->conf.retry_ladder.n};
  obx_ladder_consumer_t *taker = obx_ladder_consumer_new(&lo, 1, &err);
  if (!taker) fail_msg("consumer: %s", err.msg);
  obx_envelope_t got;
  obx_envelope_init(&got);
  bool have = false;
  deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (!have && obx_test_now_ms() < deadline)
    if (!obx_ladder_consumer_next(taker, &got, 200, &have, &err)) print_message("consume: %s\n", err.msg);
  if (!have) fail_msg("the head's message never reached the work queue");
  obx_envelope_cleanup(&got);
  obx_ladder_consumer_destroy(taker);
  wt_start_worker(fx);
  wt_wait_status(fx, next.id, "DONE");
  wt_wait_unparked(fx, "K-R");
  assert_int_equal(wt_erp_calls(fx, "R-1"), 1);
  assert_int_equal(wt_erp_calls(fx, "R-0"), 0); /* the head itself is never run again */
  obx_envelope_cleanup(&msg);
  obx_event_cleanup(&head);
  obx_event_cleanup(&next);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_two_replicas_keep_key_order, setup, teardown),
    cmocka_unit_test_setup_teardown(test_redelivered_head_sends_the_unsent_next, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
