/* test_worker_retrysweep.c - a retry whose tier message does not come back is run once anyway
 *
 * DESIGN: the worker under test has one retry tier of 3 s and WORKER_RETRY_GRACE 1 s, on the
 * run's RabbitMQ node (scripts/rabbitmq.sh). An event's first attempt answers 503 (transient):
 * it is recorded RETRYING, its copy goes to the tier, retrySent and retryDueAt are written. The
 * test then takes the copy out of the tier before it expires, which is what RabbitMQ 3.10 does
 * to it for dead_letter_worker_publisher_confirm_timeout (180 s by default) when the tier
 * dead-letters it before the exchange is back after a restart: purged (the message is gone), or
 * held by the test and put in the work queue after the sweep's copy ran (the late original).
 * Either way the retry sweep (src/worker/retrysweep.c) republishes the attempt after due +
 * grace, it runs once (ERP calls, executions), the metric and the entry count the sweep, and a
 * late original is skipped. Every wait polls with a deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker_test.h"

#define TIER_MS 3000
#define GRACE_MS 1000

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

static double swept_total(void) {
  double v = wt_metric("outboxd_worker_retry_swept_total{tier=\"1\"}");
  return v < 0 ? 0 : v;
}

/* Waits until the first attempt is RETRYING with its tier copy sent; returns retryDueAt. */
static int64_t wait_sent(wt_fx_t *fx, const char *id) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  for (;;) {
    bson_t doc;
    bson_iter_t it;
    bool found = wt_inbox(fx, id, &doc);
    const char *status = found ? obx_mongo_doc_str(&doc, "status") : NULL;
    bool sent = found && bson_iter_init_find(&it, &doc, "retrySent") && BSON_ITER_HOLDS_BOOL(&it) && bson_iter_bool(&it);
    int64_t due = found && bson_iter_init_find(&it, &doc, "retryDueAt") && BSON_ITER_HOLDS_DATE_TIME(&it)
                    ? bson_iter_date_time(&it) : 0;
    bool ready = status && strcmp(status, "RETRYING") == 0 && sent && due > 0;
    bson_destroy(&doc);
    if (ready) return due;
    if (obx_test_now_ms() > deadline) fail_msg("event %s: never RETRYING with its tier copy sent and due", id);
    usleep(10000);
  }
}

/* The worker with one 3 s tier and a 1 s grace; ev (key and order number num) is produced, its
 * first ERP call answers 503, and once the attempt is RETRYING with its tier copy sent the ERP
 * answers 200. Returns retryDueAt; *swept0 receives the sweep counter before. */
static int64_t start(wt_fx_t *fx, obx_event_t *ev, const char *num, double *swept0) {
  char tier[32], grace[32];
  snprintf(tier, sizeof tier, "%dms", TIER_MS);
  snprintf(grace, sizeof grace, "%dms", GRACE_MS);
  wt_conf_set(fx, "worker.retry_ladder", tier);
  wt_conf_set(fx, "worker.retry_grace", grace);
  wt_delete_topology(fx->ladder, fx->prefix); /* the fixture's publisher names this ladder's tiers */
  obx_ladder_destroy(fx->ladder);
  obx_ladder_opts_t lo = {.url = getenv("AMQP_URL"), .prefix = fx->prefix, .tiers_ms = fx->conf.retry_ladder.ms,
                          .ntiers = fx->conf.retry_ladder.n};
  obx_err_t err = OBX_ERR_INIT;
  fx->ladder = obx_ladder_new(&lo, &err);
  if (!fx->ladder || !obx_ladder_connect(fx->ladder, &err)) fail_msg("ladder: %s", err.msg);
  wt_start_worker(fx);
  wt_event(ev, "OrderConfirmed", num, num);
  wt_route(fx, num, 503);
  *swept0 = swept_total();
  wt_produce(fx, ev);
  int64_t due = wait_sent(fx, ev->id);
  wt_route(fx, num, 200);
  return due;
}

/* The start time of the last ERP call of num (wall clock, ms); *calls receives how many. */
static int64_t last_call_ms(wt_fx_t *fx, const char *num, int *calls) {
  int last = wt_calls(fx, num, calls);
  obx_test_httpd_request_t req;
  if (last < 0 || !obx_test_httpd_request(fx->httpd, last, &req)) fail_msg("no ERP call of %s", num);
  int64_t at = req.start_ms;
  obx_test_httpd_request_cleanup(&req);
  return at;
}

/* The attempt ran once more (2 ERP calls, 2 executions), after due + grace, through one sweep. */
static void check_ran_once_after_the_sweep(wt_fx_t *fx, const obx_event_t *ev, const char *num, int64_t due,
                                           double swept0) {
  wt_wait_status(fx, ev->id, "DONE");
  int calls = 0;
  int64_t at = last_call_ms(fx, num, &calls);
  if (calls != 2) fail_msg("ERP calls: got %d, want 2 (the 503, then the swept attempt once)", calls);
  if (wt_executions(fx, ev->id) != 2) fail_msg("executions: got %lld, want 2", (long long)wt_executions(fx, ev->id));
  if (at < due + GRACE_MS)
    fail_msg("the swept attempt ran %lld ms after its due time, before the grace of %d ms", (long long)(at - due),
             GRACE_MS);
  print_message("the swept attempt ran %lld ms after its due time (grace %d ms)\n", (long long)(at - due), GRACE_MS);
  if (swept_total() != swept0 + 1) fail_msg("outboxd_worker_retry_swept_total: got +%.0f, want +1", swept_total() - swept0);
  if (wt_inbox_int(fx, ev->id, "retrySwept") != 1)
    fail_msg("retrySwept: got %lld, want 1", (long long)wt_inbox_int(fx, ev->id, "retrySwept"));
  obx_worker_stats_t s;
  obx_worker_stats(fx->worker, &s);
  if (s.swept != 1) fail_msg("obx_worker_stats swept: got %llu, want 1", (unsigned long long)s.swept);
}

/* The tier's message is gone (purged before it expired): the sweep republishes the attempt after
 * due + grace and it runs once. */
static void test_lost_tier_message_is_swept_and_runs_once(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev;
  double swept0;
  int64_t due = start(fx, &ev, "RS-1", &swept0);
  amqp_connection_state_t conn = wt_amqp_open();
  amqp_queue_purge_ok_t *purged = amqp_queue_purge(conn, 1, amqp_cstring_bytes(obx_ladder_tier_queue(fx->ladder, 0)));
  assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
  uint32_t n = purged->message_count;
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  if (n != 1) fail_msg("purged %u messages from the tier, want its 1 (expired already? %lld ms left)", n,
                       (long long)(due - obx_time_now_ms()));
  check_ran_once_after_the_sweep(fx, &ev, "RS-1", due, swept0);
  wt_wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
  obx_event_cleanup(&ev);
}

/* The tier's message comes late, after the sweep's copy ran: it is skipped, never run again. */
static void test_late_tier_message_after_the_sweep_never_runs(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev;
  double swept0;
  int64_t due = start(fx, &ev, "RS-2", &swept0);
  amqp_connection_state_t conn = wt_amqp_open();
  amqp_rpc_reply_t r = amqp_basic_get(conn, 1, amqp_cstring_bytes(obx_ladder_tier_queue(fx->ladder, 0)), 1);
  assert_int_equal(r.reply_type, AMQP_RESPONSE_NORMAL);
  if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
    fail_msg("the tier holds no message (expired already? %lld ms left)", (long long)(due - obx_time_now_ms()));
  amqp_message_t held;
  assert_int_equal(amqp_read_message(conn, 1, &held, 0).reply_type, AMQP_RESPONSE_NORMAL);
  check_ran_once_after_the_sweep(fx, &ev, "RS-2", due, swept0);
  obx_worker_stats_t s;
  obx_worker_stats(fx->worker, &s);
  uint64_t dups = s.duplicates;
  assert_int_equal(amqp_basic_publish(conn, 1, amqp_empty_bytes, amqp_cstring_bytes(obx_ladder_work_queue(fx->ladder)),
                                      0, 0, &held.properties, held.body),
                   AMQP_STATUS_OK);
  amqp_destroy_message(&held);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while ((obx_worker_stats(fx->worker, &s), s.duplicates) == dups && obx_test_now_ms() < deadline) usleep(20000);
  if (s.duplicates != dups + 1) fail_msg("the late copy was not skipped as a duplicate");
  wt_wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
  int calls = 0;
  wt_calls(fx, "RS-2", &calls);
  if (calls != 2 || wt_executions(fx, ev.id) != 2)
    fail_msg("after the late copy: %d ERP calls, %lld executions; want 2 and 2", calls,
             (long long)wt_executions(fx, ev.id));
  obx_event_cleanup(&ev);
}

/* Two replicas sweeping the same overdue retry at once: the compare-and-set on (RETRYING,
 * attempts, the due time read) lets one take it; the other, and a sweep of an attempt the entry
 * moved past, take nothing. Straight on the inbox (no worker runs). */
static void test_two_sweepers_take_an_overdue_retry_once(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "RS-3", "RS-3");
  const char *db = obx_mongo_db_name(fx->mongo);
  obx_inbox_entry_t entry = {.consumer = fx->group, .event = &ev, .source_kind = "amqp", .seq = 1};
  bool inserted = false, taken[3] = {false, false, false};
  obx_inbox_status_t existing;
  obx_err_t err = OBX_ERR_INIT;
  int64_t due = obx_time_now_ms() - 5000, next = obx_time_now_ms() + 60000;
  if (!obx_inbox_claim(fx->client, db, NULL, &entry, OBX_INBOX_RECEIVED, &inserted, &existing, &err) || !inserted ||
      !obx_inbox_set_status(fx->client, db, NULL, fx->group, ev.id, OBX_INBOX_RETRYING, 1, "503", NULL, &err) ||
      !obx_inbox_retry_sent(fx->client, db, fx->group, ev.id, 1, due, NULL, &err))
    fail_msg("storing a sent retry: %s", err.msg);
  for (int i = 0; i < 2; i++)
    if (!obx_inbox_retry_sweep_take(fx->client, db, fx->group, ev.id, 1, due, next + i, &taken[i], &err))
      fail_msg("sweep take: %s", err.msg);
  if (!taken[0] || taken[1]) fail_msg("taken by the first sweeper %d, by the second %d; want 1 and 0", taken[0], taken[1]);
  if (!obx_inbox_retry_sweep_take(fx->client, db, fx->group, ev.id, 2, next, next + 1, &taken[2], &err))
    fail_msg("sweep take: %s", err.msg);
  if (taken[2]) fail_msg("a sweep of attempt 2 took the entry at attempt 1");
  assert_int_equal(wt_inbox_int(fx, ev.id, "retrySwept"), 1);
  obx_event_cleanup(&ev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_lost_tier_message_is_swept_and_runs_once, setup, teardown),
    cmocka_unit_test_setup_teardown(test_late_tier_message_after_the_sweep_never_runs, setup, teardown),
    cmocka_unit_test_setup_teardown(test_two_sweepers_take_an_overdue_retry_once, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
