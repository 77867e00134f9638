/* test_ladder.c - envelopes and ladder connection behaviour that need no broker */
#include <stdlib.h>
#include <string.h>

#include "obx/obx_ladder.h"
#include "obx_test.h"

static void test_fail_records_history(void **state) {
  struct {
    const char *cls, *error, *want_entry;
  } cases[] = {
    {"transient", "HTTP 503", "{\"attempt\":1,\"at\":\"1970-01-01T00:00:01.000Z\",\"class\":\"transient\",\"error\":\"HTTP 503\"}"},
    {"transient", "say \"hi\"\n", "{\"attempt\":2,\"at\":\"1970-01-01T00:00:02.000Z\",\"class\":\"transient\",\"error\":\"say \\\"hi\\\"\\u000a\"}"},
    {"terminal", "back\\slash", "{\"attempt\":3,\"at\":\"1970-01-01T00:00:03.000Z\",\"class\":\"terminal\",\"error\":\"back\\\\slash\"}"},
  };
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  char want[1024] = "[";
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_envelope_fail(&msg, cases[i].cls, cases[i].error, 1000 * (int64_t)(i + 1));
    if (i) strcat(want, ",");
    strcat(want, cases[i].want_entry);
    char full[1100];
    snprintf(full, sizeof full, "%s]", want);
    if (strcmp(msg.history, full) != 0) fail_msg("history after %zu failures:\n got %s\nwant %s", i + 1, msg.history, full);
    assert_int_equal(msg.attempt, (int)i + 1);
    assert_string_equal(msg.failure_class, cases[i].cls);
    assert_string_equal(msg.last_error, cases[i].error);
  }
  assert_int_equal(msg.first_failure_ms, 1000);
  obx_envelope_cleanup(&msg);
}

static void test_from_record_copies_everything(void **state) {
  obx_ce_header_t h[] = {{"ce_id", "abc", 3}, {"ce_type", "X", 1}, {"empty", NULL, 0}};
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  char key[] = "K", body[] = "{}";
  obx_envelope_from_record(&msg, "abc", key, 1, body, 2, h, 3);
  key[0] = body[0] = 'x';
  assert_string_equal(msg.message_id, "abc");
  assert_memory_equal(msg.key, "K", 1);
  assert_memory_equal(msg.body, "{}", 2);
  assert_int_equal(msg.nheaders, 3);
  assert_string_equal(obx_envelope_header(&msg, "ce_type"), "X");
  assert_string_equal(obx_envelope_header(&msg, "empty"), "");
  assert_null(obx_envelope_header(&msg, "ce_source"));
  obx_envelope_cleanup(&msg);
}

static void test_bad_urls_are_config_errors(void **state) {
  const char *urls[] = {"", "http://x/", "amqp://host:notaport/"};
  int64_t tiers[] = {100};
  for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
    obx_ladder_opts_t opts = {.url = urls[i], .tiers_ms = tiers, .ntiers = 1};
    obx_err_t err = OBX_ERR_INIT;
    obx_ladder_t *ladder = obx_ladder_new(&opts, &err);
    if (ladder) fail_msg("url %s: got a ladder, want a config error", urls[i]);
    assert_int_equal(err.domain, OBX_ERR_CONF);
    assert_false(err.retriable);
  }
}

static void test_names_follow_prefix_and_delays(void **state) {
  int64_t tiers[] = {200, 30000};
  obx_ladder_opts_t opts = {.url = "amqp://guest:guest@127.0.0.1:1/%2F", .prefix = "p", .tiers_ms = tiers, .ntiers = 2};
  obx_ladder_t *ladder = obx_ladder_new(&opts, NULL);
  assert_non_null(ladder);
  assert_string_equal(obx_ladder_work_queue(ladder), "p.work");
  assert_string_equal(obx_ladder_dlq_queue(ladder), "p.dlq");
  assert_string_equal(obx_ladder_tier_queue(ladder, 0), "p.retry.200ms");
  assert_string_equal(obx_ladder_tier_queue(ladder, 1), "p.retry.30000ms");
  assert_null(obx_ladder_tier_queue(ladder, 2));
  assert_int_equal(obx_ladder_ntiers(ladder), 2);
  obx_ladder_destroy(ladder);
}

/* RabbitMQ down at start: creating the ladder works; a publish fails retriable and the next
 * attempt waits for the backoff instead of hammering the broker. */
static void test_unreachable_broker_is_retriable_with_backoff(void **state) {
  int64_t tiers[] = {100};
  obx_ladder_opts_t opts = {.url = "amqp://guest:guest@127.0.0.1:1/%2F", .tiers_ms = tiers, .ntiers = 1,
                            .confirm_timeout_ms = 1000};
  obx_err_t err = OBX_ERR_INIT;
  obx_ladder_t *ladder = obx_ladder_new(&opts, &err);
  assert_non_null(ladder);
  assert_false(obx_ladder_connected(ladder));
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  obx_envelope_from_record(&msg, "id", NULL, 0, "{}", 2, NULL, 0);
  assert_false(obx_ladder_publish_retry(ladder, &msg, 0, &err));
  assert_int_equal(err.domain, OBX_ERR_AMQP);
  assert_true(err.retriable);
  obx_err_clear(&err);
  assert_false(obx_ladder_publish_dlq(ladder, &msg, &err));
  assert_true(err.retriable);
  if (!strstr(err.msg, "next attempt in")) fail_msg("second attempt inside the backoff: got %s", err.msg);
  obx_ladder_tick(ladder);
  obx_envelope_cleanup(&msg);
  obx_ladder_destroy(ladder);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_fail_records_history),
    cmocka_unit_test(test_from_record_copies_everything),
    cmocka_unit_test(test_bad_urls_are_config_errors),
    cmocka_unit_test(test_names_follow_prefix_and_delays),
    cmocka_unit_test(test_unreachable_broker_is_retriable_with_backoff),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
