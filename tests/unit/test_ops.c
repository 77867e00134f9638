/* test_ops.c - the pure parts of the operator operations (obx_ops.h): status names per store,
 * parking-lot messages as dead_letters documents, dead-letter filter checks. */
#include "obx_test.h"
#include "obx_test_doc.h"

#include <stdlib.h>
#include <string.h>

#include "obx/obx_ops.h"

static void test_status_check(void **state) {
  (void)state;
  static const struct {
    obx_ops_store_t store;
    const char *status;
    bool ok;
  } cases[] = {
    {OBX_OPS_OUTBOX, "PENDING", true},  {OBX_OPS_OUTBOX, "PUBLISHED", true}, {OBX_OPS_OUTBOX, "FAILED", true},
    {OBX_OPS_OUTBOX, "DONE", false},    {OBX_OPS_OUTBOX, "pending", false},  {OBX_OPS_OUTBOX, "", false},
    {OBX_OPS_INBOX, "RECEIVED", true},  {OBX_OPS_INBOX, "BLOCKED", true},    {OBX_OPS_INBOX, "DEAD", true},
    {OBX_OPS_INBOX, "SKIPPED", true},   {OBX_OPS_INBOX, "PENDING", false},   {OBX_OPS_INBOX, "DEADLY", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_ops_status_check(cases[i].store, cases[i].status, &err);
    if (ok != cases[i].ok)
      fail_msg("%s status \"%s\": got %d, want %d", obx_ops_store_name(cases[i].store), cases[i].status, ok, cases[i].ok);
    if (!ok) {
      assert_int_equal(err.domain, OBX_ERR_INPUT);
      /* the message names every accepted value */
      const char *want = cases[i].store == OBX_OPS_OUTBOX ? "PENDING, PUBLISHED, FAILED" : "RECEIVED, PROCESSING, DONE";
      if (!strstr(err.msg, want)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, want);
    }
  }
}

static void test_dl_from_msg(void **state) {
  (void)state;
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  static const obx_ce_header_t headers[] = {{"ce_id", "e-1", 3},
                                            {"ce_type", "OrderConfirmed", 14},
                                            {"ce_orgid", "acme", 4},
                                            {OBX_OPS_REDRIVE_COUNT_HEADER, "2", 1},
                                            {OBX_OPS_REDRIVE_ID_HEADER, "r-9", 3}};
  obx_envelope_from_record(&msg, "e-1", "K-1", 3, "{\"n\": 1}", 8, headers, 5);
  obx_envelope_fail(&msg, "transient", "HTTP 503", 1700000000000);
  obx_envelope_fail(&msg, "terminal", "HTTP 400", 1700000001000);
  msg.reason = strdup("terminal failure");

  bson_t doc = BSON_INITIALIZER;
  obx_ops_dl_from_msg(&msg, &doc);
  static const struct {
    const char *path, *want;
  } fields[] = {
    {"eventId", "e-1"}, {"type", "OrderConfirmed"}, {"key", "K-1"}, {"orgId", "acme"}, {"failureClass", "terminal"},
    {"reason", "terminal failure"}, {"lastError", "HTTP 400"}, {"headers.ce_orgid", "acme"}, {"body", "{\"n\": 1}"},
    {"history.0.error", "HTTP 503"}, {"history.1.class", "terminal"}, {"state", "dead"},
    {"dedupKey", "e-1/2/2/1700000000000"}, {"previousRedriveId", "r-9"},
  };
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    const char *got = obx_test_doc_str(&doc, fields[i].path);
    if (!got || strcmp(got, fields[i].want) != 0)
      fail_msg("%s: got %s, want %s", fields[i].path, got ? got : "(none)", fields[i].want);
  }
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, &doc, "attempts") && bson_iter_as_int64(&it) == 2);
  assert_true(bson_iter_init_find(&it, &doc, "redriveCount") && bson_iter_as_int64(&it) == 2);
  assert_true(bson_iter_init_find(&it, &doc, "firstFailureAt") && bson_iter_date_time(&it) == 1700000000000);
  assert_true(bson_iter_init_find(&it, &doc, "lastFailureAt") && bson_iter_date_time(&it) == 1700000001000);
  /* the redrive headers are bookkeeping, not part of the stored CloudEvent */
  assert_null(obx_test_doc_str(&doc, "headers." OBX_OPS_REDRIVE_COUNT_HEADER));
  bson_destroy(&doc);
  obx_envelope_cleanup(&msg);
}

static void test_dl_filter_check(void **state) {
  (void)state;
  static const struct {
    obx_ops_dl_filter_t f;
    bool ok;
    const char *names;
  } cases[] = {
    {{.failure_class = "terminal"}, true, NULL},
    {{.failure_class = "exhausted"}, true, NULL},
    {{.failure_class = "infra"}, true, NULL},
    {{.failure_class = "fatal"}, false, "malformed, terminal, exhausted, infra"},
    {{.state = "redriven"}, true, NULL},
    {{.state = "gone"}, false, "dead, redriving, redriven"},
    {{.since_ms = 2000, .until_ms = 1000}, false, "ends before it starts"},
    {{.since_ms = 1000, .until_ms = 2000}, true, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_ops_dl_filter_check(&cases[i].f, &err);
    if (ok != cases[i].ok) fail_msg("case %zu: got %d, want %d (%s)", i, ok, cases[i].ok, err.msg);
    if (!ok && (err.domain != OBX_ERR_INPUT || !strstr(err.msg, cases[i].names)))
      fail_msg("case %zu: got \"%s\", want an input error naming %s", i, err.msg, cases[i].names);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_status_check),
    cmocka_unit_test(test_dl_from_msg),
    cmocka_unit_test(test_dl_filter_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
