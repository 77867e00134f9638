/* test_worker_handover.c - a worker killed mid-run and restarted under the same
 * WORKER_INSTANCE_ID resumes its partitions at once, without waiting out its Kafka session
 *
 * DESIGN: outboxd --roles worker (the real binary) runs as a static member of its group
 * (worker.instance_id, Kafka's group.instance.id) with a 30 s session timeout, on a topic of
 * its own on the run's real Kafka broker (the fixture). One key's events run one at a time;
 * the scripted ERP holds the call of one of them, and while that call is in flight the worker
 * is killed with SIGKILL and started again with the same instance id. The figure is the time
 * from the kill to the next pipeline call the ERP receives (the held event run again by the
 * restarted worker): a dynamic member would wait for the broker to expire the dead member's
 * session (30 s here) before the partition is assigned again; a static member takes its place
 * at once, and runs the held event again once the killed process's claim is past its lease (3 s
 * here: a live claim is never taken, not even by the same member). The test asserts the figure is well under the session timeout and prints it, then
 * that every event ends DONE with one execution, in offset order, the held event's two calls
 * carrying the same Idempotency-Key. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test_outboxd.h"
#include "worker_test.h"

#define NEVENTS 8
#define HELD 3                 /* the event whose ERP call is in flight at the kill */
#define SESSION_MS 30000       /* kafka.session.timeout.ms of the worker */
#define HANDOVER_MAX_MS 10000  /* a third of it: no session expiry, no rebalance wait */
#define LEASE "3s"             /* worker.lease: the held event's claim is free 3 s after the kill at most */

static obx_test_outboxd_t outboxd; /* stopped by teardown, also when the test fails */

static int setup(void **state) { return wt_setup_state_with(state, NULL); }

static int teardown(void **state) {
  obx_test_outboxd_stop(&outboxd);
  wt_teardown(*state);
  return 0;
}

/* The worker as a static member of the fixture's group. */
static void start_static_worker(wt_fx_t *fx, const char *instance_id) {
  char id_arg[160], session_arg[64];
  snprintf(id_arg, sizeof id_arg, "worker.instance_id=%s", instance_id);
  snprintf(session_arg, sizeof session_arg, "kafka.session.timeout.ms=%d", SESSION_MS);
  /* the killed process's claim of the held event is taken over once its lease is past (a live
   * claim is nobody's, not even the same member's): a short lease keeps the handover short */
  const char *const extra[] = {id_arg, session_arg, "worker.lease=" LEASE, NULL};
  wt_start_worker_process_with(fx, &outboxd, extra);
}

/* The Idempotency-Key header of the n-th (0-based) call to /erp/<num> into out; false when none. */
static bool call_key(wt_fx_t *fx, const char *num, int n, char *out, size_t outlen) {
  char path[512];
  snprintf(path, sizeof path, "/erp/%s", num);
  int seen = 0, total = obx_test_httpd_nrequests(fx->httpd);
  bool found = false;
  for (int i = 0; i < total && !found; i++) {
    obx_test_httpd_request_t req;
    if (!obx_test_httpd_request(fx->httpd, i, &req)) continue;
    if (strcmp(req.path, path) == 0 && seen++ == n) {
      const char *v = obx_test_httpd_request_header(&req, "idempotency-key");
      snprintf(out, outlen, "%s", v ? v : "");
      found = v != NULL;
    }
    obx_test_httpd_request_cleanup(&req);
  }
  return found;
}

static void test_restart_with_same_instance_id_resumes_at_once(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  char instance[96];
  snprintf(instance, sizeof instance, "worker-handover-%d", (int)getpid());
  obx_event_t ev[NEVENTS];
  char num[NEVENTS][32];
  for (int i = 0; i < NEVENTS; i++) {
    snprintf(num[i], sizeof num[i], "HO-%d", i);
    wt_event(&ev[i], "OrderConfirmed", "HO", num[i]); /* one key: one event at a time, in order */
    wt_route_delay(fx, num[i], 200, i == HELD ? 60000 : 0); /* the held call outlives the worker */
  }
  start_static_worker(fx, instance);
  for (int i = 0; i < NEVENTS; i++) wt_produce(fx, &ev[i]);
  wt_wait_calls(fx, num[HELD], 1); /* in flight: the ERP holds its answer */
  for (int i = 0; i < HELD; i++) wt_wait_status(fx, ev[i].id, "DONE");

  /* kill -9 mid-call; the held event answers at once from now on */
  wt_route(fx, num[HELD], 200);
  int64_t t0 = obx_test_now_ms();
  obx_test_proc_stop(&outboxd.proc, SIGKILL, 5000);
  start_static_worker(fx, instance);
  int64_t deadline = t0 + 2 * SESSION_MS;
  while (wt_erp_calls(fx, num[HELD]) < 2 && obx_test_now_ms() < deadline) usleep(5000);
  int64_t handover = obx_test_now_ms() - t0;
  if (wt_erp_calls(fx, num[HELD]) < 2) fail_msg("no pipeline call within %d ms of the kill", 2 * SESSION_MS);
  print_message("worker handover (static membership, session %d ms): kill -9 -> restart -> next pipeline call in "
                "%lld ms\n", SESSION_MS, (long long)handover);
  if (handover > HANDOVER_MAX_MS)
    fail_msg("kill -> next call took %lld ms, want <= %d ms (session timeout %d ms: a rebalance wait)",
             (long long)handover, HANDOVER_MAX_MS, SESSION_MS);

  for (int i = 0; i < NEVENTS; i++) wt_wait_status(fx, ev[i].id, "DONE");
  for (int i = 0; i < NEVENTS; i++) {
    int64_t runs = wt_executions(fx, ev[i].id);
    if (runs != 1) fail_msg("event %d: %lld executions, want 1", i, (long long)runs);
    int calls = wt_erp_calls(fx, num[i]);
    if (calls != (i == HELD ? 2 : 1)) fail_msg("ERP calls for %s: got %d, want %d", num[i], calls, i == HELD ? 2 : 1);
    if (i > 0 && wt_last_call_index(fx, num[i]) < wt_last_call_index(fx, num[i - 1]))
      fail_msg("event %d of key HO ran before event %d", i, i - 1);
  }
  char first[128], second[128];
  if (!call_key(fx, num[HELD], 0, first, sizeof first) || !call_key(fx, num[HELD], 1, second, sizeof second) ||
      strcmp(first, second) != 0)
    fail_msg("the held event's calls: Idempotency-Key \"%s\" then \"%s\", want the same", first, second);
  assert_int_equal(obx_test_outboxd_stop(&outboxd), 0);
  for (int i = 0; i < NEVENTS; i++) obx_event_cleanup(&ev[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_restart_with_same_instance_id_resumes_at_once, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
