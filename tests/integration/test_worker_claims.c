/* test_worker_claims.c - an inbox entry is a claim: no event ever runs in two places at once
 *
 * DESIGN: the scripted ERP records when each call arrived and when it was answered, with its
 * Idempotency-Key (<eventId>:<nodeId>); two calls of one key whose times overlap are one event
 * running in two places at once, which must never happen. Four cases:
 *   - two `outboxd --roles worker` replicas, the second joining mid-run (a rebalance), while the
 *     test forces redeliveries: copies of running, queued and finished events on the work queue
 *     and the same records produced to Kafka again;
 *   - an entry claimed by a process that went away: the next delivery waits for its lease and
 *     takes it over;
 *   - the paused worker (issue 19): a replica SIGSTOPped 20 s in the middle of a call that fails;
 *     the other takes its partitions, takes over the claim once its lease is past and finishes
 *     the event and the later events of its key; resumed, the paused one records nothing for the
 *     event it no longer owns (no outcome, no retry, no DLQ copy) and no event of the key runs
 *     after a later one; once more resumed while the other's call of the event still runs: the
 *     resumed one's next event of the key waits for it;
 *   - intent before publish: the outcome transactions' commits are held 1.5 s by a fail point
 *     while the first retry tier's TTL is 100 ms, two replicas: no concurrent run, the retries
 *     run exactly once more, and no key stays parked without a message. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

#define NREPLICAS 2

static obx_test_outboxd_t replicas[NREPLICAS]; /* stopped by teardown, also when the test fails */

static int teardown(void **state) {
  wt_stop_worker_processes(replicas, NREPLICAS);
  wt_teardown(*state);
  return 0;
}

/* Pairs of ERP calls with the same Idempotency-Key whose [arrived, answered] times overlap (an
 * unanswered call lasts until now); *calls receives the number of calls. */
static int overlapping_calls(wt_fx_t *fx, int *calls) {
  int n = obx_test_httpd_nrequests(fx->httpd), overlaps = 0;
  obx_test_httpd_request_t *reqs = calloc((size_t)n + 1, sizeof *reqs);
  for (int i = 0; i < n; i++) obx_test_httpd_request(fx->httpd, i, &reqs[i]);
  int64_t now = 0;
  for (int i = 0; i < n; i++)
    if (reqs[i].end_ms > now) now = reqs[i].end_ms;
  now += 1000000;
  for (int i = 0; i < n; i++) {
    const char *ki = obx_test_httpd_request_header(&reqs[i], "idempotency-key");
    for (int j = i + 1; ki && j < n; j++) {
      const char *kj = obx_test_httpd_request_header(&reqs[j], "idempotency-key");
      if (!kj || strcmp(ki, kj) != 0) continue;
      int64_t ei = reqs[i].end_ms ? reqs[i].end_ms : now, ej = reqs[j].end_ms ? reqs[j].end_ms : now;
      if (reqs[i].start_ms < ej && reqs[j].start_ms < ei) {
        print_message("overlap: %s called at %lld-%lld and %lld-%lld\n", ki, (long long)reqs[i].start_ms,
                      (long long)ei, (long long)reqs[j].start_ms, (long long)ej);
        overlaps++;
      }
    }
  }
  for (int i = 0; i < n; i++) obx_test_httpd_request_cleanup(&reqs[i]);
  free(reqs);
  *calls = n;
  return overlaps;
}

static void publish_copy(wt_fx_t *fx, const obx_event_t *ev) {
  obx_envelope_t copy;
  obx_envelope_init(&copy);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_envelope_from_event(&copy, ev, &err) || !obx_ladder_publish_work(fx->ladder, &copy, &err))
    fail_msg("copy of %s: %s", ev->id, err.msg);
  obx_envelope_cleanup(&copy);
}

/* Every tier queue, the work queue and the DLQ are empty. */
static void wait_queues_empty(wt_fx_t *fx) {
  for (int i = 0; i < obx_ladder_ntiers(fx->ladder); i++) wt_wait_depth(fx, obx_ladder_tier_queue(fx->ladder, i), 0);
  wt_wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 0);
}

static void test_two_replicas_never_run_an_event_twice_at_once(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  enum { N = 40 };
  wt_conf_set(fx, "worker.lease", "2s");
  obx_event_t ev[N];
  for (int i = 0; i < N; i++) {
    char key[16], num[16];
    snprintf(key, sizeof key, "K-%d", i % 20);
    snprintf(num, sizeof num, "C-%d", i);
    wt_event(&ev[i], "OrderConfirmed", key, num);
    wt_route_delay(fx, num, 200, 200 + (i % 6) * 100);
  }
  wt_start_worker_process(fx, &replicas[0]);
  for (int i = 0; i < N; i++) wt_produce(fx, &ev[i]);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_inbox_count(fx, "DONE") < 5 && obx_test_now_ms() < deadline) usleep(20000);
  /* Forced redeliveries while events run: work-queue copies and the same Kafka records again. */
  for (int i = 0; i < N / 2; i++) publish_copy(fx, &ev[i]);
  for (int i = 0; i < N / 4; i++) wt_produce(fx, &ev[i]);
  wt_start_worker_process(fx, &replicas[1]); /* the group rebalances mid-run */
  for (int i = N / 4; i < N; i++) publish_copy(fx, &ev[i]);
  for (int i = 0; i < N; i++) wt_wait_status(fx, ev[i].id, "DONE");
  wait_queues_empty(fx);
  int calls = 0, overlaps = overlapping_calls(fx, &calls);
  for (int i = 0; i < N; i++) {
    int64_t runs = wt_executions(fx, ev[i].id);
    if (runs != 1) fail_msg("event %d: %lld executions, want 1", i, (long long)runs);
  }
  print_message("%d events, %d forced copies, %d ERP calls, overlapping calls of one event: %d\n", N, N + N / 4,
                calls, overlaps);
  if (overlaps) fail_msg("%d pairs of calls of one event overlapped, want 0", overlaps);
  assert_int_equal(calls, N);
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
}

static void test_expired_claim_is_taken_over(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.lease", "2s");
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "K-X", "X-1");
  wt_route(fx, "X-1", 200);
  /* A process claimed the event and went away: its lease ends 3 s from now. */
  int64_t until = obx_time_now_ms() + 3000;
  bson_t *doc = BCON_NEW("_id", "{", "consumer", BCON_UTF8(fx->group), "eventId", BCON_UTF8(ev.id), "}", "status",
                         BCON_UTF8("RECEIVED"), "attempts", BCON_INT32(0), "partitionKey", BCON_UTF8("K-X"), "seq",
                         BCON_INT64(0), "owner", BCON_UTF8("gone:1:0"), "leaseUntil", BCON_DATE_TIME(until),
                         "receivedAt", BCON_DATE_TIME(obx_time_now_ms()));
  mongoc_collection_t *inbox = mongoc_client_get_collection(fx->client, obx_mongo_db_name(fx->mongo), "inbox");
  bson_error_t berr;
  if (!mongoc_collection_insert_one(inbox, doc, NULL, NULL, &berr)) fail_msg("insert: %s", berr.message);
  mongoc_collection_destroy(inbox);
  bson_destroy(doc);
  wt_start_worker(fx);
  wt_produce(fx, &ev);
  wt_wait_status(fx, ev.id, "DONE");
  obx_test_httpd_request_t req;
  assert_true(obx_test_httpd_request(fx->httpd, 0, &req));
  print_message("the live claim ended at %lld; the call came %lld ms after it\n", (long long)until,
                (long long)(req.start_ms - until));
  if (req.start_ms < until) fail_msg("the event ran %lld ms before the claim's lease ended", (long long)(until - req.start_ms));
  obx_test_httpd_request_cleanup(&req);
  assert_int_equal(wt_erp_calls(fx, "X-1"), 1);
  assert_int_equal(wt_executions(fx, ev.id), 1);
  bson_t entry;
  assert_true(wt_inbox(fx, ev.id, &entry));
  const char *owner = obx_mongo_doc_str(&entry, "owner");
  if (!owner || strcmp(owner, "gone:1:0") == 0) fail_msg("owner after the take-over: %s", owner ? owner : "(none)");
  bson_destroy(&entry);
  obx_event_cleanup(&ev);
}

/* Lines of a log file holding `what`. */
/* Earliest arrival and latest answer of the calls to /erp/<num> (answer 0: one still open). */
static void call_span(wt_fx_t *fx, const char *num, int64_t *first_start, int64_t *last_end) {
  char path[64];
  snprintf(path, sizeof path, "/erp/%s", num);
  *first_start = INT64_MAX;
  *last_end = -1;
  int n = obx_test_httpd_nrequests(fx->httpd);
  for (int i = 0; i < n; i++) {
    obx_test_httpd_request_t req;
    if (!obx_test_httpd_request(fx->httpd, i, &req)) continue;
    if (strcmp(req.path, path) == 0) {
      if (req.start_ms < *first_start) *first_start = req.start_ms;
      if (*last_end != 0 && (req.end_ms == 0 || req.end_ms > *last_end)) *last_end = req.end_ms;
    }
    obx_test_httpd_request_cleanup(&req);
  }
}

/* Replica 0 is SIGSTOPped in the middle of the head's call (a 503); replica 1 takes the
 * partitions and the claim, its own call of the head lasting head_ms. head_ms 0: it finishes the
 * key during a PAUSE_MS pause; else replica 0 resumes while replica 1's call of the head runs,
 * and replica 0's next event of the key waits for it. */
static void paused_worker(wt_fx_t *fx, int head_ms) {
  enum { NLATER = 5, PAUSE_MS = 20000 };
  wt_conf_set(fx, "worker.lease", "3s");
  obx_event_t head, later[NLATER];
  wt_event(&head, "OrderConfirmed", "K-P", "P-0");
  wt_route_delay(fx, "P-0", 503, 2000); /* the paused worker's call fails: the case that used to climb the ladder */
  for (int i = 0; i < NLATER; i++) {
    char num[16];
    snprintf(num, sizeof num, "P-%d", i + 1);
    wt_event(&later[i], "OrderConfirmed", "K-P", num);
    wt_route(fx, num, 200);
  }
  wt_start_worker_process(fx, &replicas[0]);
  wt_produce(fx, &head);
  for (int i = 0; i < NLATER; i++) wt_produce(fx, &later[i]);
  wt_wait_calls(fx, "P-0", 1);
  if (kill(replicas[0].proc.pid, SIGSTOP) != 0) fail_msg("SIGSTOP failed");
  int64_t paused = obx_test_now_ms();
  wt_route_delay(fx, "P-0", 200, head_ms); /* the next owner's call succeeds */
  wt_start_worker_process(fx, &replicas[1]);
  int64_t took = -1;
  if (head_ms == 0) {
    wt_wait_status(fx, head.id, "DONE");
    for (int i = 0; i < NLATER; i++) wt_wait_status(fx, later[i].id, "DONE");
    took = obx_test_now_ms() - paused;
    if (took >= PAUSE_MS) fail_msg("the other replica finished the key %lld ms into the pause, want < %d", (long long)took, PAUSE_MS);
    while (obx_test_now_ms() - paused < PAUSE_MS) usleep(100000);
  } else {
    wt_wait_calls(fx, "P-0", 2); /* the next owner runs the head: resume while it does */
    if (wt_inbox_count(fx, "DONE") > 0) fail_msg("the head finished before the resume, want it running");
  }
  int64_t pause_ms = obx_test_now_ms() - paused;
  if (kill(replicas[0].proc.pid, SIGCONT) != 0) fail_msg("SIGCONT failed");
  /* Resumed, its call answers 503: the run's claim is gone, so nothing is recorded or sent. */
  char line[512] = "";
  int64_t deadline = obx_test_now_ms() + 15000;
  while (!line[0] && obx_test_now_ms() < deadline) {
    FILE *f = fopen(replicas[0].proc.log_path, "r");
    char buf[4096];
    while (f && fgets(buf, sizeof buf, f))
      if (strstr(buf, head.id) && strstr(buf, "not recorded")) snprintf(line, sizeof line, "%.500s", buf);
    if (f) fclose(f);
    if (!line[0]) usleep(100000);
  }
  if (!line[0]) fail_msg("the resumed worker did not log that it recorded nothing for %s", head.id);
  wt_wait_status(fx, head.id, "DONE");
  for (int i = 0; i < NLATER; i++) wt_wait_status(fx, later[i].id, "DONE");
  print_message("paused %lld ms, the next owner's call of the head %d ms; the key finished %lld ms into the pause; "
                "resumed: %s", (long long)pause_ms, head_ms, (long long)took, line);
  wait_queues_empty(fx);
  assert_int_equal(wt_executions(fx, head.id), 1); /* the next owner's run only */
  wt_wait_unparked(fx, "K-P");
  /* Per key: every call of an event starts after every call of the earlier ones ended, each once. */
  int calls = 0;
  (void)wt_calls(fx, "P-0", &calls);
  assert_int_equal(calls, 2);
  int64_t start, prev_end;
  call_span(fx, "P-0", &start, &prev_end);
  for (int i = 0; i < NLATER; i++) {
    char num[16];
    snprintf(num, sizeof num, "P-%d", i + 1);
    int n = 0;
    (void)wt_calls(fx, num, &n);
    if (n != 1) fail_msg("%s reached the ERP %d times, want once", num, n);
    int64_t end;
    call_span(fx, num, &start, &end);
    if (prev_end <= 0 || start < prev_end)
      fail_msg("%s was called at %lld, before an earlier event of its key was answered (%lld)", num, (long long)start,
               (long long)prev_end);
    prev_end = end;
  }
  int overlaps = overlapping_calls(fx, &calls);
  if (overlaps) fail_msg("%d pairs of calls of one event overlapped, want 0", overlaps);
  obx_event_cleanup(&head);
  for (int i = 0; i < NLATER; i++) obx_event_cleanup(&later[i]);
}

static void test_paused_worker_records_nothing_it_lost(void **state) {
  WT_NEED_BROKER();
  paused_worker(*state, 0);
}

static void test_paused_worker_waits_for_the_peers_head(void **state) {
  WT_NEED_BROKER();
  paused_worker(*state, 4000); /* under the node's 5 s timeout */
}

static void test_retry_intent_before_publish(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  enum { N = 4 };
  wt_conf_set(fx, "worker.retry_ladder", "100ms,200ms");
  wt_conf_set(fx, "worker.lease", "2s");
  obx_event_t ev[N];
  for (int i = 0; i < N; i++) {
    char key[16], num[16];
    snprintf(key, sizeof key, "K-R%d", i);
    snprintf(num, sizeof num, "R-%d", i);
    wt_event(&ev[i], "OrderConfirmed", key, num);
    wt_route(fx, num, 503);
  }
  /* Every outcome commit is held 1.5 s: far longer than the first tier's 100 ms TTL. */
  obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 12}, \"data\": "
                                  "{\"failCommands\": [\"commitTransaction\"], \"blockConnection\": true, "
                                  "\"blockTimeMS\": 1500}}");
  for (int i = 0; i < NREPLICAS; i++) wt_start_worker_process(fx, &replicas[i]);
  for (int i = 0; i < N; i++) wt_produce(fx, &ev[i]);
  /* Each event's retry succeeds: its route turns 200 as soon as its first call came (the retry
   * is 1.6 s away at least: the held commit, then the tier). */
  bool flipped[N] = {false};
  int nflipped = 0;
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (nflipped < N && obx_test_now_ms() < deadline) {
    for (int i = 0; i < N; i++) {
      char num[16];
      snprintf(num, sizeof num, "R-%d", i);
      if (flipped[i] || wt_erp_calls(fx, num) < 1) continue;
      wt_route(fx, num, 200);
      flipped[i] = true;
      nflipped++;
    }
    usleep(5000);
  }
  if (nflipped < N) fail_msg("first calls: %d of %d events", nflipped, N);
  for (int i = 0; i < N; i++) wt_wait_status(fx, ev[i].id, "DONE");
  obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  wait_queues_empty(fx);
  for (int i = 0; i < N; i++) {
    char num[16];
    snprintf(num, sizeof num, "R-%d", i);
    int64_t runs = wt_executions(fx, ev[i].id);
    if (wt_erp_calls(fx, num) != 2 || runs != 2)
      fail_msg("%s: %d calls, %lld executions, want 2 and 2 (one retry)", num, wt_erp_calls(fx, num), (long long)runs);
    char key[16];
    snprintf(key, sizeof key, "K-R%d", i);
    wt_wait_unparked(fx, key); /* the DONE head releases its key right after its record */
  }
  /* A tier copy published before its attempt was recorded would meet the run's live claim. */
  int early = 0;
  for (int r = 0; r < NREPLICAS; r++) early += wt_log_lines(replicas[r].proc.log_path, "who runs it now");
  int calls = 0, overlaps = overlapping_calls(fx, &calls);
  print_message("%d events retried once through a 100 ms tier with commits held 1.5 s: %d calls, %d overlapping, "
                "%d copies that met a live claim\n", N, calls, overlaps, early);
  if (overlaps) fail_msg("%d pairs of calls of one event overlapped, want 0", overlaps);
  if (early) fail_msg("%d tier copies arrived while their attempt still ran, want 0", early);
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_two_replicas_never_run_an_event_twice_at_once, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_expired_claim_is_taken_over, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_paused_worker_records_nothing_it_lost, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_paused_worker_waits_for_the_peers_head, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_retry_intent_before_publish, wt_setup_state, teardown),
  };
  if (getenv("OBX_TEST_FILTER")) cmocka_set_test_filter(getenv("OBX_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
