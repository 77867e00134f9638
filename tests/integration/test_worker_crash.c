/* test_worker_crash.c - kill -9 of the worker mid-run loses nothing and runs nothing twice
 *
 * DESIGN: outboxd --roles worker (the real binary) consumes 30 events whose ERP call takes
 * 150 ms; it is killed with SIGKILL once some are done and started again. Every event must end
 * DONE with exactly one pipeline execution: an event whose outcome was recorded is never run
 * again, and one in flight at the kill (its HTTP call made, its transaction not committed) is
 * run again from scratch, which leaves a single execution record. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test_outboxd.h"
#include "worker_test.h"

#define NEVENTS 30 /* the scripted ERP holds at most 32 routes */

/* The killed worker may die inside a transaction that already wrote an event's inbox entry.
 * MongoDB keeps such a transaction (and its write locks) until transactionLifetimeLimitSeconds
 * (60 s by default) ends it; until then the restarted worker's writes to that entry conflict and
 * are retried. devmongod models the same limit; a short one keeps the test within its deadline. */
static int setup(void **state) { return wt_setup_state_with(state, "--txn-lifetime-ms 3000"); }

static obx_test_outboxd_t outboxd; /* stopped by teardown, also when the test fails */

static int teardown(void **state) {
  obx_test_outboxd_stop(&outboxd);
  wt_teardown(*state);
  return 0;
}

static void start_worker_process(wt_fx_t *fx, obx_test_outboxd_t *d) {
  char bufs[WT_NCONF][320], *args[2 * WT_NCONF + 8];
  int n = 0;
  args[n++] = "--roles";
  args[n++] = "worker";
  n += wt_conf_args(fx, bufs, args + n);
  /* The killed member leaves no goodbye: a short session lets the group move on quickly. */
  args[n++] = "-X";
  args[n++] = "kafka.session.timeout.ms=6000";
  args[n++] = "-X";
  args[n++] = "kafka.heartbeat.interval.ms=1000";
  args[n] = NULL;
  if (!obx_test_outboxd_start(d, args)) fail_msg("outboxd --roles worker did not start");
}

static int64_t count_status(wt_fx_t *fx, const char *status) {
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "_id.consumer", fx->group);
  BSON_APPEND_UTF8(&filter, "status", status);
  int64_t n = wt_count(fx, "inbox", &filter);
  bson_destroy(&filter);
  return n;
}

static void test_kill_9_mid_run(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.attempts", "3");
  obx_event_t ev[NEVENTS];
  for (int i = 0; i < NEVENTS; i++) {
    char num[16];
    snprintf(num, sizeof num, "C-%d", i);
    wt_event(&ev[i], "OrderConfirmed", num, num);
    wt_route_delay(fx, num, 200, 150);
    wt_produce(fx, &ev[i]);
  }
  obx_test_outboxd_t *d = &outboxd;
  start_worker_process(fx, d);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (count_status(fx, "DONE") < 6 && obx_test_now_ms() < deadline) usleep(5000);
  int64_t done_at_kill = count_status(fx, "DONE");
  if (done_at_kill < 6) fail_msg("only %lld events done before the kill", (long long)done_at_kill);
  obx_test_proc_stop(&d->proc, SIGKILL, 5000);
  int64_t after_kill = count_status(fx, "DONE");
  if (after_kill >= NEVENTS) fail_msg("all events finished before the kill; the test proves nothing");

  start_worker_process(fx, d);
  for (int i = 0; i < NEVENTS; i++) wt_wait_status(fx, ev[i].id, "DONE");
  /* The worker's numbers are on the shared /metrics. */
  obx_test_http_resp_t resp;
  assert_true(obx_test_http(d->port, "GET", "/metrics", NULL, NULL, NULL, &resp));
  const char *names[] = {"outboxd_worker_consumed_total{source=\"kafka\"}",
                         "outboxd_worker_pipeline_runs_total{status=\"SUCCEEDED\"}", "outboxd_worker_consumer_lag",
                         "outboxd_worker_parked_keys", "outboxd_worker_duplicates_total"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!resp.body || !strstr(resp.body, names[i])) fail_msg("/metrics lacks %s:\n%s", names[i], resp.body);
  obx_test_http_resp_cleanup(&resp);
  obx_test_outboxd_stop(d);

  int calls = 0;
  for (int i = 0; i < NEVENTS; i++) {
    int64_t runs = wt_executions(fx, ev[i].id);
    if (runs != 1) fail_msg("event %d (%s): %lld executions, want 1", i, ev[i].id, (long long)runs);
    char num[16];
    snprintf(num, sizeof num, "C-%d", i);
    calls += wt_erp_calls(fx, num);
  }
  print_message("done at kill: %lld of %d; ERP calls %d (repeated in-flight calls: %d)\n", (long long)after_kill,
                NEVENTS, calls, calls - NEVENTS);
  for (int i = 0; i < NEVENTS; i++) obx_event_cleanup(&ev[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_kill_9_mid_run, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
