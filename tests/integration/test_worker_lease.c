/* test_worker_lease.c - a running event's claim stays its owner's for as long as it runs
 *
 * DESIGN: the worker runs in process (worker_test.h fixture) as a static member (WORKER_INSTANCE_ID)
 * with WORKER_LEASE 1 s; the ERP holds each call 3.5 s, so every run outlasts its lease three
 * times over. The test itself is the peer: every 50 ms it tries to take the claims of the running
 * events over (obx_inbox_take, what a replica that meets the event does) as another process of
 * the same member and as a process of another member. Neither may ever succeed while the event
 * runs: the claim is renewed by the worker's renewal thread, and a live claim is nobody's to
 * take, not even a process of the same member.
 *
 * test_claims_renewed_while_runs_outlast_the_lease: two events on two keys run; the peer never
 * takes a claim; each event is DONE with one ERP call and one execution.
 * test_claims_renewed_while_the_worker_stops: the worker is stopped (obx_worker_destroy, what
 * SIGTERM does) while both calls are in flight; the stop lets the runs finish, and the claims
 * stay renewed until they have: the peer never takes one, and each event is DONE once. (Before,
 * the renewal ran on the work-queue thread, which the stop ends first: the leases ran out
 * under the finishing runs, and the chaos `rebalance` scenario saw a restarted process of the same
 * member take live claims at once: 147 events ran twice in its long run.) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_inbox.h"
#include "worker_test.h"

#define LEASE "1s"
#define CALL_MS 3500
#define NEV 2

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

typedef struct {
  wt_fx_t *fx;
  obx_event_t ev[NEV];
  char num[NEV][16];
  char member[64];
  int tries;
} lease_fx_t;

static void start(lease_fx_t *l, wt_fx_t *fx) {
  memset(l, 0, sizeof *l);
  l->fx = fx;
  snprintf(l->member, sizeof l->member, "lease-%d", (int)getpid());
  wt_conf_set(fx, "worker.lease", LEASE);
  wt_conf_set(fx, "worker.instance_id", l->member);
  for (int i = 0; i < NEV; i++) {
    char key[16];
    snprintf(l->num[i], sizeof l->num[i], "LS-%d", i);
    snprintf(key, sizeof key, "LK-%d", i);
    wt_event(&l->ev[i], "OrderConfirmed", key, l->num[i]);
    wt_route_delay(fx, l->num[i], 200, CALL_MS);
  }
  wt_start_worker(fx);
  for (int i = 0; i < NEV; i++) wt_produce(fx, &l->ev[i]);
  for (int i = 0; i < NEV; i++) wt_wait_calls(fx, l->num[i], 1); /* both in flight */
}

/* One round of the peer: tries to take every running claim as a process of the same member and
 * as one of another member; fails the test when any is taken. */
static void peer_round(lease_fx_t *l) {
  wt_fx_t *fx = l->fx;
  const char *db = obx_mongo_db_name(fx->mongo);
  for (int i = 0; i < NEV; i++) {
    bson_t doc;
    if (!wt_inbox(fx, l->ev[i].id, &doc)) continue;
    const char *status = obx_mongo_doc_str(&doc, "status");
    obx_inbox_status_t st = OBX_INBOX_DONE;
    if (status && strcmp(status, "RECEIVED") == 0) st = OBX_INBOX_RECEIVED;
    if (status && strcmp(status, "PROCESSING") == 0) st = OBX_INBOX_PROCESSING;
    bson_destroy(&doc);
    if (st == OBX_INBOX_DONE) continue; /* not running (any more) */
    const char *members[] = {l->member, "another-member"};
    for (int m = 0; m < 2; m++) {
      char owner[96];
      snprintf(owner, sizeof owner, "peer:%d:%d", (int)getpid(), m);
      bool taken = false;
      obx_err_t err = OBX_ERR_INIT;
      if (!obx_inbox_take(fx->client, db, fx->conf.worker_group, l->ev[i].id, owner, members[m], 1000, st, -1, 0,
                          &taken, &err))
        fail_msg("take: %s", err.msg);
      l->tries++;
      if (taken)
        fail_msg("event %d: its running claim was taken by a peer of %s after %d tries", i,
                 m == 0 ? "the same member" : "another member", l->tries);
    }
  }
}

static bool all_done(lease_fx_t *l) {
  for (int i = 0; i < NEV; i++) {
    bson_t doc;
    if (!wt_inbox(l->fx, l->ev[i].id, &doc)) return false;
    const char *status = obx_mongo_doc_str(&doc, "status");
    bool done = status && strcmp(status, "DONE") == 0;
    bson_destroy(&doc);
    if (!done) return false;
  }
  return true;
}

/* The peer's rounds until both events are DONE (bounded), then one run each. */
static void peer_until_done(lease_fx_t *l) {
  int64_t deadline = obx_test_now_ms() + 4 * CALL_MS + WT_WAIT_MS;
  while (!all_done(l)) {
    if (obx_test_now_ms() > deadline) fail_msg("the events were not DONE within %d ms", 4 * CALL_MS + WT_WAIT_MS);
    peer_round(l);
    usleep(50000);
  }
  print_message("the peer tried %d take-overs of running claims: none taken\n", l->tries);
  if (l->tries < 20) fail_msg("only %d take-over tries: the runs did not outlast the lease under watch", l->tries);
  for (int i = 0; i < NEV; i++) {
    assert_int_equal(wt_erp_calls(l->fx, l->num[i]), 1);
    assert_int_equal(wt_executions(l->fx, l->ev[i].id), 1);
  }
}

static void finish(lease_fx_t *l) {
  for (int i = 0; i < NEV; i++) obx_event_cleanup(&l->ev[i]);
}

static void test_claims_renewed_while_runs_outlast_the_lease(void **state) {
  WT_NEED_BROKER();
  lease_fx_t l;
  start(&l, *state);
  peer_until_done(&l);
  finish(&l);
}

static void *stop_worker(void *p) {
  wt_fx_t *fx = p;
  obx_worker_destroy(fx->worker); /* waits for the runners to finish their events */
  return NULL;
}

static void test_claims_renewed_while_the_worker_stops(void **state) {
  WT_NEED_BROKER();
  lease_fx_t l;
  wt_fx_t *fx = *state;
  start(&l, fx);
  pthread_t stopper;
  assert_int_equal(pthread_create(&stopper, NULL, stop_worker, fx), 0);
  peer_until_done(&l);
  pthread_join(stopper, NULL);
  fx->worker = NULL;
  finish(&l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_claims_renewed_while_runs_outlast_the_lease, setup, teardown),
    cmocka_unit_test_setup_teardown(test_claims_renewed_while_the_worker_stops, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
