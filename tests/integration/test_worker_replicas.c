/* test_worker_replicas.c - per-key order with two worker processes in one group
 *
 * DESIGN: two `outboxd --roles worker` (the real binary) share WORKER_GROUP, the topic's two
 * partitions and the work queue, so a head's retry may come back through the replica that does
 * not own its key's partition. Keys K-A and K-B each have a head that fails (503) until the test
 * scripts success, and three later events that wait BLOCKED behind it; events of other keys
 * must finish while the heads still fail. Two extra copies of K-A's head go to the work queue
 * once it can succeed, so several processes may finish that head at once. The scripted ERP's
 * recorded calls give the order of execution: per key, the head's first success, then its later
 * events in offset order, each exactly once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test_outboxd.h"
#include "worker_test.h"

#define NREPLICAS 2
#define NLATER 3
#define NOTHER 4

static obx_test_outboxd_t replicas[NREPLICAS]; /* stopped by teardown, also when the test fails */

static int setup(void **state) {
  if (!getenv("AMQP_URL")) return 0;
  wt_fx_t *fx = wt_setup(2, NULL);
  *state = fx;
  return fx ? 0 : -1;
}

static int teardown(void **state) {
  wt_fx_t *fx = *state;
  for (int i = 0; i < NREPLICAS; i++) obx_test_outboxd_stop(&replicas[i]);
  if (fx) {
    char extra[96];
    snprintf(extra, sizeof extra, "%s.retry.3000ms", fx->prefix);
    const char *queues[] = {extra};
    wt_delete_amqp(queues, 1, NULL);
  }
  wt_teardown(fx);
  return 0;
}

static void start_replica(wt_fx_t *fx, obx_test_outboxd_t *d) {
  char bufs[WT_NCONF][320], *args[2 * WT_NCONF + 8];
  int n = 0;
  args[n++] = "--roles";
  args[n++] = "worker";
  n += wt_conf_args(fx, bufs, args + n);
  args[n++] = "-X";
  args[n++] = "kafka.session.timeout.ms=6000";
  args[n++] = "-X";
  args[n++] = "kafka.heartbeat.interval.ms=1000";
  args[n] = NULL;
  if (!obx_test_outboxd_start(d, args)) fail_msg("outboxd --roles worker did not start");
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
  for (int i = 0; i < NREPLICAS; i++) start_replica(fx, &replicas[i]);

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
    obx_ladder_msg_t copy;
    obx_ladder_msg_init(&copy);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ladder_msg_from_event(&copy, &head_ev[0], &err) || !obx_ladder_publish_work(fx->ladder, &copy, &err))
      fail_msg("copy of the head: %s", err.msg);
    obx_ladder_msg_cleanup(&copy);
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

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_two_replicas_keep_key_order, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
