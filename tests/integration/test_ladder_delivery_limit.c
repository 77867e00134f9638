/* test_ladder_delivery_limit.c - every quorum queue of the ladder declares its delivery limit,
 * against the real RabbitMQ (AMQP_URL, OBX_RMQ_DIR: scripts/test.sh sets both)
 *
 * test_declared_limits: the queues as RabbitMQ lists them (`rabbitmqctl list_queues name
 * arguments` through scripts/rabbitmq.sh ctl) carry x-delivery-limit: P.work and the tiers
 * OBX_LADDER_WORK_DELIVERY_LIMIT, P.dlq OBX_LADDER_DLQ_DELIVERY_LIMIT, and P.work dead-letters
 * into P.dlq. test_limit_parks_in_dlq: a work-queue message given back (nack, requeue) past the
 * limit is parked in P.dlq by RabbitMQ, not dropped, and read from there as class "exhausted" with
 * a reason naming the queue and its limit (x-death). test_existing_queue_kept: a P.work declared
 * by an older outboxd (no limit) is used as it is: the ladder connects and publishes. */
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
} fx_t;

static void fx_init(fx_t *fx) {
  static int seq;
  obx_test_require(getenv("AMQP_URL") && getenv("OBX_RMQ_DIR"), "no RabbitMQ node for this run (AMQP_URL, OBX_RMQ_DIR)");
  memset(fx, 0, sizeof *fx);
  snprintf(fx->prefix, sizeof fx->prefix, "obxlimit.%d.%d", (int)getpid(), seq++);
  fx->opts = (obx_ladder_opts_t){.url = getenv("AMQP_URL"), .prefix = fx->prefix, .tiers_ms = tiers, .ntiers = 2};
  obx_err_t err = OBX_ERR_INIT;
  fx->ladder = obx_ladder_new(&fx->opts, &err);
  if (!fx->ladder) fail_msg("obx_ladder_new: %s", err.msg);
}

static void fx_cleanup(fx_t *fx) {
  wt_delete_topology(fx->ladder, fx->prefix);
  obx_ladder_destroy(fx->ladder);
}

/* What `rabbitmqctl list_queues name arguments` prints now ("name\targuments" lines). */
static char listing[1 << 20];

static void list_queues(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "'%s/scripts/rabbitmq.sh' ctl -q list_queues name arguments", OBX_SOURCE_DIR);
  listing[0] = '\n';
  if (obx_test_sh(cmd, listing + 1, sizeof listing - 1) != 0) fail_msg("%s failed", cmd);
}

/* The arguments of queue in the last listing, or fails the test. */
static void queue_arguments(const char *queue, char *out, size_t outlen) {
  char needle[160];
  snprintf(needle, sizeof needle, "\n%s\t", queue);
  const char *at = strstr(listing, needle);
  if (!at) fail_msg("queue %s is not listed by rabbitmqctl", queue);
  at += strlen(needle);
  snprintf(out, outlen, "%.*s", (int)strcspn(at, "\n"), at);
}

static void expect_arg(const char *queue, const char *want) {
  char args[2048];
  queue_arguments(queue, args, sizeof args);
  if (!strstr(args, want)) fail_msg("%s: arguments %s lack %s", queue, args, want);
  printf("%s: %s\n", queue, args);
}

static void test_declared_limits(void **state) {
  fx_t fx;
  fx_init(&fx);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_connect(fx.ladder, &err)) fail_msg("connect: %s", err.msg);
  char want[128], dlq_route[160];
  snprintf(want, sizeof want, "{\"x-delivery-limit\",%d}", OBX_LADDER_WORK_DELIVERY_LIMIT);
  snprintf(dlq_route, sizeof dlq_route, "{\"x-dead-letter-routing-key\",\"%s\"}", obx_ladder_dlq_queue(fx.ladder));
  list_queues();
  expect_arg(obx_ladder_work_queue(fx.ladder), want);
  expect_arg(obx_ladder_work_queue(fx.ladder), dlq_route);
  for (int i = 0; i < obx_ladder_ntiers(fx.ladder); i++) expect_arg(obx_ladder_tier_queue(fx.ladder, i), want);
  snprintf(want, sizeof want, "{\"x-delivery-limit\",%d}", OBX_LADDER_DLQ_DELIVERY_LIMIT);
  expect_arg(obx_ladder_dlq_queue(fx.ladder), want);
  fx_cleanup(&fx);
}

static void test_limit_parks_in_dlq(void **state) {
  fx_t fx;
  fx_init(&fx);
  obx_err_t err = OBX_ERR_INIT;
  obx_envelope_t msg, got;
  wt_envelope(&msg, "limit-1", "k");
  if (!obx_ladder_publish_work(fx.ladder, &msg, &err)) fail_msg("publish: %s", err.msg);
  obx_ladder_consumer_t *work = obx_ladder_consumer_new(&fx.opts, 1, &err);
  assert_non_null(work);
  int deliveries = 0;
  while (deliveries <= OBX_LADDER_WORK_DELIVERY_LIMIT + 5 && wt_ladder_next(work, &got, 1500)) {
    deliveries++;
    assert_string_equal(got.message_id, "limit-1");
    if (!obx_ladder_consumer_nack(work, &got, true, &err)) fail_msg("nack: %s", err.msg);
    obx_envelope_cleanup(&got);
  }
  obx_envelope_cleanup(&got);
  printf("delivered %d times from %s (x-delivery-limit %d)\n", deliveries, obx_ladder_work_queue(fx.ladder),
         OBX_LADDER_WORK_DELIVERY_LIMIT);
  if (deliveries != OBX_LADDER_WORK_DELIVERY_LIMIT + 1)
    fail_msg("delivered %d times, want the limit plus one (%d)", deliveries, OBX_LADDER_WORK_DELIVERY_LIMIT + 1);
  obx_ladder_consumer_t *dlq = obx_ladder_dlq_consumer_new(&fx.opts, 1, &err);
  assert_non_null(dlq);
  if (!wt_ladder_next(dlq, &got, 10000)) fail_msg("the message past the limit is not in %s", obx_ladder_dlq_queue(fx.ladder));
  assert_string_equal(got.message_id, "limit-1");
  /* RabbitMQ's own dead-lettering (x-death) names the class and the cause */
  printf("in the DLQ: class %s, reason %s\n", got.failure_class ? got.failure_class : "(none)",
         got.reason ? got.reason : "(none)");
  assert_non_null(got.failure_class);
  assert_string_equal(got.failure_class, "exhausted");
  assert_non_null(got.reason);
  assert_non_null(strstr(got.reason, "x-delivery-limit"));
  assert_non_null(strstr(got.reason, obx_ladder_work_queue(fx.ladder)));
  assert_true(obx_ladder_consumer_ack(dlq, &got, &err));
  obx_envelope_cleanup(&got);
  obx_envelope_cleanup(&msg);
  obx_ladder_consumer_destroy(dlq);
  obx_ladder_consumer_destroy(work);
  fx_cleanup(&fx);
}

static void test_existing_queue_kept(void **state) {
  fx_t fx;
  fx_init(&fx);
  /* P.work as outboxd declared it before the limit: quorum, nothing else */
  amqp_connection_state_t conn = wt_amqp_open();
  amqp_table_entry_t quorum = {amqp_cstring_bytes("x-queue-type"), {AMQP_FIELD_KIND_UTF8, {.bytes = amqp_cstring_bytes("quorum")}}};
  amqp_table_t table = {1, &quorum};
  amqp_queue_declare(conn, 1, amqp_cstring_bytes(obx_ladder_work_queue(fx.ladder)), 0, 1, 0, 0, table);
  assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);

  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_connect(fx.ladder, &err)) fail_msg("connect with an older work queue: %s", err.msg);
  obx_envelope_t msg;
  wt_envelope(&msg, "kept-1", "k");
  if (!obx_ladder_publish_work(fx.ladder, &msg, &err)) fail_msg("publish to the older work queue: %s", err.msg);
  obx_envelope_cleanup(&msg);
  char args[2048];
  list_queues();
  queue_arguments(obx_ladder_work_queue(fx.ladder), args, sizeof args);
  if (strstr(args, "x-delivery-limit")) fail_msg("the older work queue changed: %s", args);
  char want[128];
  snprintf(want, sizeof want, "{\"x-delivery-limit\",%d}", OBX_LADDER_DLQ_DELIVERY_LIMIT);
  expect_arg(obx_ladder_dlq_queue(fx.ladder), want); /* the rest of the topology is declared after it */
  fx_cleanup(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_declared_limits),
    cmocka_unit_test(test_limit_parks_in_dlq),
    cmocka_unit_test(test_existing_queue_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
