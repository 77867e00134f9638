/* test_worker_crash.c - kill -9 of the worker mid-run loses nothing and runs nothing twice
 *
 * DESIGN: outboxd --roles worker (the real binary) consumes 30 events of 4 keys whose ERP call
 * takes 400 ms; it is killed with SIGKILL once some are done and the scripted ERP holds a call whose
 * answer is still pending, then started again. The stub records a request before it waits, so
 * a call first seen by a poll that began less than the ERP delay before the kill cannot have
 * been answered: that event was in flight. Every event must end DONE with exactly one pipeline
 * execution; an event DONE before the kill keeps its single ERP call, and one in flight at the
 * kill (its HTTP call made, its transaction not committed) is run again from scratch, which
 * leaves a single execution record. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test_outboxd.h"
#include "worker_test.h"

#define NEVENTS 30 /* the scripted ERP holds at most 32 routes */
#define ERP_DELAY_MS 400

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

static bool is_done(wt_fx_t *fx, const char *id) {
  bson_t doc;
  bson_iter_t it;
  bool done = wt_inbox(fx, id, &doc) && bson_iter_init_find(&it, &doc, "status") && BSON_ITER_HOLDS_UTF8(&it) &&
              strcmp(bson_iter_utf8(&it, NULL), "DONE") == 0;
  bson_destroy(&doc);
  return done;
}

/* Polls until at least 3 events are DONE and a call the ERP has not answered yet is known, then
 * sends SIGKILL. A call is known unanswered when the previous poll (begun at prev_start) saw no
 * call of that event and the kill goes out before prev_start + ERP_DELAY_MS. */
static void kill_with_call_in_flight(wt_fx_t *fx, obx_test_outboxd_t *d, char nums[NEVENTS][16]) {
  bool called[NEVENTS] = {false};
  /* The first poll has no predecessor: the calls it finds may be old. */
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS, prev_start = -1;
  for (;;) {
    int64_t start = obx_test_now_ms();
    int fresh = 0;
    for (int i = 0; i < NEVENTS; i++)
      if (!called[i] && wt_erp_calls(fx, nums[i]) > 0) {
        called[i] = true;
        fresh++;
      }
    bool enough = fresh && prev_start >= 0 && wt_inbox_count(fx, "DONE") >= 3;
    if (enough && obx_test_now_ms() - prev_start < ERP_DELAY_MS / 2) { /* the answer is still pending */
      obx_test_proc_stop(&d->proc, SIGKILL, 5000);
      return;
    }
    if (obx_test_now_ms() > deadline) fail_msg("no moment with 3 events DONE and an ERP call pending");
    prev_start = start;
    usleep(5000);
  }
}

static void test_kill_9_mid_run(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.attempts", "3");
  obx_event_t ev[NEVENTS];
  char nums[NEVENTS][16];
  /* Four keys: a key's calls run one after the other, so at any moment some events are done and
   * others wait for the ERP (30 keys would start their 30 calls at once and end them together). */
  for (int i = 0; i < NEVENTS; i++) {
    char key[16];
    snprintf(nums[i], sizeof nums[i], "C-%d", i);
    snprintf(key, sizeof key, "K-%d", i % 4);
    wt_event(&ev[i], "OrderConfirmed", key, nums[i]);
    wt_route_delay(fx, nums[i], 200, ERP_DELAY_MS);
    wt_produce(fx, &ev[i]);
  }
  obx_test_outboxd_t *d = &outboxd;
  wt_start_worker_process(fx, d);
  kill_with_call_in_flight(fx, d, nums);
  /* The process is gone: what is DONE now was committed before the kill. */
  bool done_before[NEVENTS], in_flight[NEVENTS];
  int ndone = 0, nflight = 0;
  for (int i = 0; i < NEVENTS; i++) {
    done_before[i] = is_done(fx, ev[i].id);
    in_flight[i] = !done_before[i] && wt_erp_calls(fx, nums[i]) > 0;
    ndone += done_before[i];
    nflight += in_flight[i];
  }
  if (ndone < 3 || ndone >= NEVENTS) fail_msg("events DONE at the kill: got %d, want 3..%d", ndone, NEVENTS - 1);
  if (nflight < 1) fail_msg("events with an ERP call but no outcome at the kill: got 0, want >= 1");

  wt_start_worker_process(fx, d);
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
    int n = wt_erp_calls(fx, nums[i]);
    calls += n;
    const char *what = done_before[i] ? "DONE before the kill" : in_flight[i] ? "in flight at the kill" : "not started";
    if (runs != 1) fail_msg("event %d (%s, %s): %lld executions, want 1", i, ev[i].id, what, (long long)runs);
    if (done_before[i] && n != 1) fail_msg("event %d (%s): %d ERP calls, want 1", i, what, n);
    if (n < 1) fail_msg("event %d (%s): %d ERP calls, want >= 1", i, what, n);
  }
  print_message("done at kill: %d of %d, in flight: %d; ERP calls %d (repeated in-flight calls: %d)\n", ndone,
                NEVENTS, nflight, calls, calls - NEVENTS);
  for (int i = 0; i < NEVENTS; i++) obx_event_cleanup(&ev[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_kill_9_mid_run, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
