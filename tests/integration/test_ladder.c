/* test_ladder.c - the retry ladder and DLQ against a real RabbitMQ (AMQP_URL)
 *
 * DESIGN: each test declares its own topology under a unique prefix with a short ladder
 * (200ms,500ms) and deletes it at the end. Skipped when AMQP_URL is not set (scripts/test.sh
 * sets it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_ladder.h"
#include "obx_test.h"
#include "worker_test.h"

static const int64_t tiers[] = {200, 500};

typedef struct {
  char prefix[64];
  obx_ladder_opts_t opts;
  obx_ladder_t *ladder;
  obx_ladder_consumer_t *consumer;
} fx_t;

static int setup(void **state) {
  if (!getenv("AMQP_URL")) return 0;
  static int seq;
  fx_t *fx = calloc(1, sizeof *fx);
  snprintf(fx->prefix, sizeof fx->prefix, "obxtest.%d.%d", (int)getpid(), seq++);
  fx->opts = (obx_ladder_opts_t){.url = getenv("AMQP_URL"), .prefix = fx->prefix, .tiers_ms = tiers, .ntiers = 2};
  obx_err_t err = OBX_ERR_INIT;
  fx->ladder = obx_ladder_new(&fx->opts, &err);
  if (!fx->ladder) fail_msg("obx_ladder_new: %s", err.msg);
  if (!obx_ladder_connect(fx->ladder, &err)) fail_msg("connect: %s", err.msg);
  fx->consumer = obx_ladder_consumer_new(&fx->opts, 4, &err);
  assert_non_null(fx->consumer);
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fx_t *fx = *state;
  if (!fx) return 0;
  obx_ladder_consumer_destroy(fx->consumer);
  wt_delete_topology(fx->ladder, fx->prefix);
  obx_ladder_destroy(fx->ladder);
  free(fx);
  return 0;
}

/* Waits for the next work-queue message; fails the test after timeout_ms. */
static void next_msg(fx_t *fx, obx_envelope_t *got, int timeout_ms) {
  if (!wt_ladder_next(fx->consumer, got, timeout_ms)) fail_msg("no message on the work queue within %d ms", timeout_ms);
}

static uint32_t depth(fx_t *fx, const char *queue) {
  uint32_t n = 0;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_queue_depth(fx->ladder, queue, &n, &err)) fail_msg("depth of %s: %s", queue, err.msg);
  return n;
}

typedef struct {
  fx_t *fx;
  const char *queue;
  uint32_t want;
} depth_ctx_t;

static bool depth_is(void *p) {
  depth_ctx_t *d = p;
  return depth(d->fx, d->queue) == d->want;
}

static void wait_depth(fx_t *fx, const char *queue, uint32_t want) {
  depth_ctx_t d = {fx, queue, want};
  if (!obx_test_wait_for(depth_is, &d, 10000, 50))
    fail_msg("depth of %s: got %u, want %u", queue, depth(fx, queue), want);
}

static void test_topology_is_idempotent(void **state) {
  WT_NEED_BROKER();
  fx_t *fx = *state;
  obx_err_t err = OBX_ERR_INIT;
  /* A second process declaring the same topology, and one with a changed ladder. */
  obx_ladder_t *again = obx_ladder_new(&fx->opts, &err);
  if (!obx_ladder_connect(again, &err)) fail_msg("second declare: %s", err.msg);
  obx_ladder_destroy(again);
  int64_t other_tiers[] = {200, 700};
  obx_ladder_opts_t opts = fx->opts;
  opts.tiers_ms = other_tiers;
  obx_ladder_t *changed = obx_ladder_new(&opts, &err);
  if (!obx_ladder_connect(changed, &err)) fail_msg("declare with a changed ladder: %s", err.msg);
  char want[96];
  snprintf(want, sizeof want, "%s.retry.700ms", fx->prefix);
  assert_string_equal(obx_ladder_tier_queue(changed, 1), want);
  uint32_t n = 1;
  if (!obx_ladder_queue_depth(changed, want, &n, &err)) fail_msg("new tier queue: %s", err.msg);
  assert_int_equal(n, 0);
  obx_ladder_destroy(changed);
  const char *extra[] = {want};
  wt_delete_amqp(extra, 1, NULL);
  assert_int_equal(depth(fx, obx_ladder_work_queue(fx->ladder)), 0);
}

static amqp_table_entry_t str_arg(const char *key, const char *value) {
  amqp_table_entry_t e = {.key = amqp_cstring_bytes(key), .value = {.kind = AMQP_FIELD_KIND_UTF8}};
  e.value.value.bytes = amqp_cstring_bytes(value);
  return e;
}

static amqp_table_entry_t i64_arg(const char *key, int64_t value) {
  amqp_table_entry_t e = {.key = amqp_cstring_bytes(key), .value = {.kind = AMQP_FIELD_KIND_I64}};
  e.value.value.i64 = value;
  return e;
}

/* Declares a durable queue with args on a channel of its own; returns 0 when the broker
 * accepted it, else the reply code of the channel close (406: arguments differ). */
static int declare(amqp_connection_state_t conn, amqp_channel_t ch, const char *queue, amqp_table_entry_t *args,
                   int nargs) {
  amqp_channel_open(conn, ch);
  if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) fail_msg("channel %d did not open", ch);
  amqp_table_t table = {.num_entries = nargs, .entries = args};
  amqp_queue_declare(conn, ch, amqp_cstring_bytes(queue), 0, 1, 0, 0, table);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) {
    amqp_channel_close(conn, ch, AMQP_REPLY_SUCCESS);
    return 0;
  }
  if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION || r.reply.id != AMQP_CHANNEL_CLOSE_METHOD)
    fail_msg("declare %s: reply type %d (method 0x%x), want a channel close", queue, r.reply_type, r.reply.id);
  amqp_channel_close_ok_t ok = {0};
  amqp_send_method(conn, ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
  return ((amqp_channel_close_t *)r.reply.decoded)->reply_code;
}

/* The tiers and the DLQ are quorum queues with the ladder's arguments (x-delivery-limit included): the broker accepts a
 * re-declaration with exactly those and closes the channel with PRECONDITION_FAILED (406) for a
 * classic queue, a missing queue type or another TTL. */
static void test_queues_are_quorum_with_their_arguments(void **state) {
  WT_NEED_BROKER();
  fx_t *fx = *state;
  amqp_connection_state_t conn = wt_amqp_open();
  const char *work = obx_ladder_work_queue(fx->ladder), *dlq = obx_ladder_dlq_queue(fx->ladder);
  amqp_channel_t ch = 2;
  for (int i = 0; i < 2; i++) {
    const char *tier = obx_ladder_tier_queue(fx->ladder, i);
    amqp_table_entry_t same[] = {str_arg("x-queue-type", "quorum"), i64_arg("x-message-ttl", tiers[i]),
                                 str_arg("x-dead-letter-exchange", ""), str_arg("x-dead-letter-routing-key", work),
                                 str_arg("x-dead-letter-strategy", "at-least-once"),
                                 str_arg("x-overflow", "reject-publish"),
                                 i64_arg("x-delivery-limit", OBX_LADDER_WORK_DELIVERY_LIMIT)};
    int got = declare(conn, ch++, tier, same, 7);
    if (got != 0) fail_msg("re-declare %s with its own arguments: got reply %d, want accepted", tier, got);
    amqp_table_entry_t classic[] = {str_arg("x-queue-type", "classic"), i64_arg("x-message-ttl", tiers[i]),
                                    str_arg("x-dead-letter-exchange", ""),
                                    str_arg("x-dead-letter-routing-key", work)};
    if ((got = declare(conn, ch++, tier, classic, 4)) != AMQP_PRECONDITION_FAILED)
      fail_msg("re-declare %s as a classic queue: got reply %d, want 406", tier, got);
    same[1] = i64_arg("x-message-ttl", tiers[i] + 1);
    if ((got = declare(conn, ch++, tier, same, 7)) != AMQP_PRECONDITION_FAILED)
      fail_msg("re-declare %s with another TTL: got reply %d, want 406", tier, got);
    if ((got = declare(conn, ch++, tier, NULL, 0)) != AMQP_PRECONDITION_FAILED)
      fail_msg("re-declare %s without arguments: got reply %d, want 406", tier, got);
  }
  amqp_table_entry_t quorum[] = {str_arg("x-queue-type", "quorum"), i64_arg("x-delivery-limit", OBX_LADDER_DLQ_DELIVERY_LIMIT)},
                     classic[] = {str_arg("x-queue-type", "classic")};
  int got = declare(conn, ch++, dlq, quorum, 2);
  if (got != 0) fail_msg("re-declare %s as quorum with its delivery limit: got reply %d, want accepted", dlq, got);
  if ((got = declare(conn, ch++, dlq, classic, 1)) != AMQP_PRECONDITION_FAILED)
    fail_msg("re-declare %s as a classic queue: got reply %d, want 406", dlq, got);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
}

static void test_tiers_return_to_work_queue_after_their_delay(void **state) {
  WT_NEED_BROKER();
  fx_t *fx = *state;
  struct {
    int tier;
    int64_t min_ms;
  } cases[] = {{0, 150}, {1, 450}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char id[40];
    snprintf(id, sizeof id, "0190f0e0-0000-7000-8000-00000000000%zu", i);
    obx_envelope_t msg, got;
    wt_envelope(&msg, id, "K-1");
    for (int a = 0; a <= cases[i].tier; a++) obx_envelope_fail(&msg, "transient", "HTTP 503 from \"erp\"", 1000 + a);
    obx_err_t err = OBX_ERR_INIT;
    int64_t t0 = obx_test_now_ms();
    if (!obx_ladder_publish_retry(fx->ladder, &msg, cases[i].tier, &err)) fail_msg("publish: %s", err.msg);
    next_msg(fx, &got, 15000);
    int64_t waited = obx_test_now_ms() - t0;
    if (waited < cases[i].min_ms) fail_msg("tier %d came back after %lld ms, want >= %lld", cases[i].tier,
                                           (long long)waited, (long long)cases[i].min_ms);
    assert_string_equal(got.message_id, id);
    assert_int_equal(got.attempt, cases[i].tier + 1);
    assert_int_equal(got.first_failure_ms, 1000);
    assert_string_equal(got.failure_class, "transient");
    assert_string_equal(got.last_error, "HTTP 503 from \"erp\"");
    assert_non_null(strstr(got.history, "\"error\":\"HTTP 503 from \\\"erp\\\"\""));
    assert_string_equal(obx_envelope_header(&got, "ce_type"), "OrderConfirmed");
    assert_string_equal(obx_envelope_header(&got, "ce_id"), id);
    assert_int_equal(got.key_len, 3);
    assert_memory_equal(got.key, "K-1", 3);
    assert_int_equal(got.body_len, msg.body_len);
    assert_memory_equal(got.body, msg.body, msg.body_len);
    if (!obx_ladder_consumer_ack(fx->consumer, &got, &err)) fail_msg("ack: %s", err.msg);
    obx_envelope_cleanup(&got);
    obx_envelope_cleanup(&msg);
  }
  wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
}

static bool match_id(void *ctx, const obx_envelope_t *msg) {
  return msg->message_id && strcmp(msg->message_id, ctx) == 0;
}

typedef struct {
  int n;
  char ids[8][40];
} seen_t;

static bool collect(void *ctx, const obx_envelope_t *msg) {
  seen_t *s = ctx;
  if (s->n < 8) snprintf(s->ids[s->n++], 40, "%s", msg->message_id);
  return true;
}

static void test_dlq_browse_redrive_purge(void **state) {
  WT_NEED_BROKER();
  fx_t *fx = *state;
  const char *dlq = obx_ladder_dlq_queue(fx->ladder);
  const char *ids[] = {"0190f0e0-0000-7000-8000-0000000000a1", "0190f0e0-0000-7000-8000-0000000000b2",
                       "0190f0e0-0000-7000-8000-0000000000c3"};
  obx_err_t err = OBX_ERR_INIT;
  for (int i = 0; i < 3; i++) {
    obx_envelope_t msg;
    wt_envelope(&msg, ids[i], "K-2");
    obx_envelope_fail(&msg, "terminal", "HTTP 400", 5000);
    msg.reason = strdup("terminal failure");
    if (!obx_ladder_publish_dlq(fx->ladder, &msg, &err)) fail_msg("publish dlq: %s", err.msg);
    obx_envelope_cleanup(&msg);
  }
  wait_depth(fx, dlq, 3);

  /* Browsing is not destructive, and a limit stops it. */
  seen_t all = {0}, one = {0};
  if (!obx_ladder_dlq_browse(fx->ladder, 0, NULL, collect, &all, &err)) fail_msg("browse: %s", err.msg);
  assert_int_equal(all.n, 3);
  for (int i = 0; i < 3; i++) {
    bool found = false;
    for (int j = 0; j < all.n; j++) found |= strcmp(all.ids[j], ids[i]) == 0;
    if (!found) fail_msg("browse did not list %s", ids[i]);
  }
  if (!obx_ladder_dlq_browse(fx->ladder, 1, NULL, collect, &one, &err)) fail_msg("browse: %s", err.msg);
  assert_int_equal(one.n, 1);
  wait_depth(fx, dlq, 3);

  /* Dry run counts, moves nothing. */
  int moved = -1;
  if (!obx_ladder_dlq_redrive(fx->ladder, match_id, (void *)ids[1], true, NULL, &moved, &err))
    fail_msg("dry run: %s", err.msg);
  assert_int_equal(moved, 1);
  wait_depth(fx, dlq, 3);
  assert_int_equal(depth(fx, obx_ladder_work_queue(fx->ladder)), 0);

  /* Redrive one by id: back on the work queue, attempts reset, history and headers kept. */
  if (!obx_ladder_dlq_redrive(fx->ladder, match_id, (void *)ids[1], false, NULL, &moved, &err))
    fail_msg("redrive: %s", err.msg);
  assert_int_equal(moved, 1);
  wait_depth(fx, dlq, 2);
  obx_envelope_t got;
  next_msg(fx, &got, 10000);
  assert_string_equal(got.message_id, ids[1]);
  assert_int_equal(got.attempt, 0);
  assert_null(got.reason);
  assert_non_null(strstr(got.history, "HTTP 400"));
  assert_string_equal(obx_envelope_header(&got, "ce_id"), ids[1]);
  assert_true(obx_ladder_consumer_ack(fx->consumer, &got, &err));
  obx_envelope_cleanup(&got);

  /* An id that is not there moves nothing. */
  if (!obx_ladder_dlq_redrive(fx->ladder, match_id, "nope", false, NULL, &moved, &err)) fail_msg("%s", err.msg);
  assert_int_equal(moved, 0);

  uint32_t purged = 0;
  if (!obx_ladder_dlq_purge(fx->ladder, &purged, &err)) fail_msg("purge: %s", err.msg);
  assert_int_equal(purged, 2);
  wait_depth(fx, dlq, 0);
}

static void test_redrive_all(void **state) {
  WT_NEED_BROKER();
  fx_t *fx = *state;
  obx_err_t err = OBX_ERR_INIT;
  for (int i = 0; i < 4; i++) {
    char id[40];
    snprintf(id, sizeof id, "0190f0e0-0000-7000-8000-00000000001%d", i);
    obx_envelope_t msg;
    wt_envelope(&msg, id, "K-3");
    if (!obx_ladder_publish_dlq(fx->ladder, &msg, &err)) fail_msg("publish dlq: %s", err.msg);
    obx_envelope_cleanup(&msg);
  }
  wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 4);
  int moved = 0;
  if (!obx_ladder_dlq_redrive(fx->ladder, NULL, NULL, false, NULL, &moved, &err)) fail_msg("redrive: %s", err.msg);
  assert_int_equal(moved, 4);
  wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 0);
  for (int i = 0; i < 4; i++) {
    obx_envelope_t got;
    next_msg(fx, &got, 10000);
    assert_true(obx_ladder_consumer_ack(fx->consumer, &got, &err));
    obx_envelope_cleanup(&got);
  }
  wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
}

/* An idle publisher that is ticked keeps its connection past several heartbeat timeouts. */
static void test_ticked_idle_connection_survives_heartbeats(void **state) {
  WT_NEED_BROKER();
  fx_t *fx = *state;
  obx_ladder_opts_t opts = fx->opts;
  opts.amqp.heartbeat_s = 1;
  obx_err_t err = OBX_ERR_INIT;
  obx_ladder_t *ladder = obx_ladder_new(&opts, &err);
  if (!obx_ladder_connect(ladder, &err)) fail_msg("connect: %s", err.msg);
  int64_t idle_until = obx_test_now_ms() + 4000; /* four heartbeat periods without traffic */
  while (obx_test_now_ms() < idle_until) {
    obx_ladder_tick(ladder);
    if (!obx_ladder_connected(ladder)) fail_msg("the idle connection was dropped");
    usleep(200 * 1000);
  }
  obx_envelope_t msg;
  wt_envelope(&msg, "0190f0e0-0000-7000-8000-0000000000d4", "K-4");
  if (!obx_ladder_publish_dlq(ladder, &msg, &err)) fail_msg("publish after idling: %s", err.msg);
  obx_envelope_cleanup(&msg);
  obx_ladder_destroy(ladder);
  wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_topology_is_idempotent, setup, teardown),
    cmocka_unit_test_setup_teardown(test_queues_are_quorum_with_their_arguments, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tiers_return_to_work_queue_after_their_delay, setup, teardown),
    cmocka_unit_test_setup_teardown(test_dlq_browse_redrive_purge, setup, teardown),
    cmocka_unit_test_setup_teardown(test_redrive_all, setup, teardown),
    cmocka_unit_test_setup_teardown(test_ticked_idle_connection_survives_heartbeats, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
