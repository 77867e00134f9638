/* test_json.c - obx_json: the strict body parser (one object, nothing after it) and the
 * renderer that cannot fail (invalid UTF-8 in keys and strings becomes U+FFFD, at any depth;
 * long values whole; a corrupt document still renders; dates at any depth are RFC 3339 UTC
 * strings with milliseconds, never {"$date": ...}). */
#include "obx_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_json.h"

static void test_parse_table(void **state) {
  static const struct {
    const char *json;
    const char *want; /* NULL: accepted; else substring of the error */
  } cases[] = {
    {"{\"a\": 1}", NULL},
    {"  {\"a\": 1}  \n\t", NULL},
    {"{\"a\": {\"b\": [1, 2]}}", NULL},
    {"{\"a\": 1}{\"b\": 2}", "data after the JSON object"},
    {"{\"a\": 1} {\"b\": 2}", "data after the JSON object"},
    {"{\"a\": 1} x", "not valid JSON"},
    {"{\"a\": 1} {", "data after the JSON object"},
    {"{\"a\": 1}]", "not valid JSON"},
    {"", "the body is empty"},
    {"   ", "the body is empty"},
    {"[1, 2]", "want a JSON object"},
    {"42", "want a JSON object"},
    {"{", "not valid JSON"},
    {"{\"a\": \"\xff\"}", "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t doc;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_json_parse(cases[i].json, strlen(cases[i].json), &doc, &err);
    if (!cases[i].want && !ok) fail_msg("case %zu %s: got refused (%s), want accepted", i, cases[i].json, err.msg);
    if (cases[i].want && ok) fail_msg("case %zu %s: got accepted, want \"%s\"", i, cases[i].json, cases[i].want);
    if (cases[i].want && (!strstr(err.msg, cases[i].want) || err.domain != OBX_ERR_INPUT))
      fail_msg("case %zu %s:\n got  %s\n want %s", i, cases[i].json, err.msg, cases[i].want);
    if (!ok) assert_int_equal(bson_count_keys(&doc), 0);
    bson_destroy(&doc);
  }
}

/* rendered must parse back as one object whose string at path equals want. */
static void expect_field(const char *rendered, const char *path, const char *want, size_t want_len) {
  bson_t back;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_json_parse(rendered, strlen(rendered), &back, &err)) fail_msg("rendered JSON does not parse: %s\n%.300s", err.msg, rendered);
  bson_iter_t it, v;
  uint32_t len = 0;
  const char *got = bson_iter_init(&it, &back) && bson_iter_find_descendant(&it, path, &v) && BSON_ITER_HOLDS_UTF8(&v)
                      ? bson_iter_utf8(&v, &len) : NULL;
  if (!got || len != want_len || memcmp(got, want, want_len) != 0)
    fail_msg("%s: got %.80s (%u bytes), want %.80s (%zu bytes)", path, got ? got : "(absent)", len, want, want_len);
  bson_destroy(&back);
}

#define FFFD "\xef\xbf\xbd"

static void test_render_invalid_utf8(void **state) {
  bson_t doc = BSON_INITIALIZER, headers, arr;
  /* a dead letter as the tools see it: non-UTF-8 id, key, header name and value, body */
  bson_append_utf8(&doc, "id", -1, "ev-\xff\xfe" "-1", -1);
  bson_append_utf8(&doc, "key", -1, "k\xc3", -1);              /* truncated 2-byte sequence */
  BSON_APPEND_DOCUMENT_BEGIN(&doc, "headers", &headers);
  bson_append_utf8(&headers, "ce_\x80type", -1, "Order\xed\xa0\x80" "Confirmed", -1); /* a surrogate */
  bson_append_utf8(&headers, "ce_source", -1, "ok", -1);
  bson_append_document_end(&doc, &headers);
  BSON_APPEND_ARRAY_BEGIN(&doc, "history", &arr);
  bson_append_utf8(&arr, "0", -1, "\xc0\xaf" " overlong", -1);
  bson_append_array_end(&doc, &arr);
  bson_append_utf8(&doc, "body", -1, "nul\0" "here \xf4\x90\x80\x80", 13);  /* NUL kept; above U+10FFFF replaced */
  BSON_APPEND_INT32(&doc, "attempts", 3);
  assert_null(bson_as_relaxed_extended_json(&doc, NULL)); /* what crashed the tools */
  size_t len;
  int replaced;
  char *json = obx_json_render(&doc, &len, &replaced);
  assert_non_null(json);
  assert_int_equal(len, strlen(json));
  expect_field(json, "id", "ev-" FFFD FFFD "-1", strlen("ev-" FFFD FFFD "-1"));
  expect_field(json, "key", "k" FFFD, strlen("k" FFFD));
  expect_field(json, "headers.ce_" FFFD "type", "Order" FFFD FFFD FFFD "Confirmed", strlen("Order" FFFD FFFD FFFD "Confirmed"));
  expect_field(json, "headers.ce_source", "ok", 2);
  expect_field(json, "history.0", FFFD FFFD " overlong", strlen(FFFD FFFD " overlong"));
  expect_field(json, "body", "nul\0here " FFFD FFFD FFFD FFFD, 9 + 12);
  assert_non_null(strstr(json, "\"attempts\" : 3"));
  assert_int_equal(replaced, 2 + 1 + 1 + 3 + 2 + 4);
  bson_free(json);
  bson_destroy(&doc);
}

/* Valid documents render exactly as libbson renders them; long values come out whole. */
static void test_render_valid_and_long(void **state) {
  char id[301], *key = malloc(10241);
  memset(id, 'i', 300);
  id[300] = '\0';
  memset(key, 'k', 10240);
  key[10240] = '\0';
  bson_t doc = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&doc, "id", id);
  BSON_APPEND_UTF8(&doc, "key", key);
  BSON_APPEND_UTF8(&doc, "name", "S\xc3\xa3o Paulo \xf0\x9f\x9a\x9a");
  char *want = bson_as_relaxed_extended_json(&doc, NULL);
  int replaced = -1;
  char *json = obx_json_render(&doc, NULL, &replaced);
  assert_string_equal(json, want);
  assert_int_equal(replaced, 0);
  expect_field(json, "id", id, 300);
  expect_field(json, "key", key, 10240);
  bson_free(json);
  bson_free(want);
  bson_destroy(&doc);
  free(key);
}

/* Dates render as RFC 3339 UTC strings with milliseconds wherever they stand: top level, in a
 * sub-document, in an array, next to a string that needs repair; the rest as libbson has it. */
static void test_render_dates(void **state) {
  bson_t doc = BSON_INITIALIZER, sub, arr, entry;
  BSON_APPEND_DATE_TIME(&doc, "firstFailureAt", 1764594000123); /* 2025-12-01T13:00:00.123Z */
  BSON_APPEND_DOCUMENT_BEGIN(&doc, "redrive", &sub);
  BSON_APPEND_DATE_TIME(&sub, "at", 0);
  BSON_APPEND_INT64(&sub, "count", 2);
  bson_append_document_end(&doc, &sub);
  BSON_APPEND_ARRAY_BEGIN(&doc, "history", &arr);
  BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &entry);
  BSON_APPEND_DATE_TIME(&entry, "at", -1); /* one millisecond before the epoch */
  bson_append_utf8(&entry, "reason", -1, "bad \xff", -1);
  bson_append_document_end(&arr, &entry);
  BSON_APPEND_DATE_TIME(&arr, "1", 253402300799999); /* the last millisecond of year 9999 */
  bson_append_array_end(&doc, &arr);
  BSON_APPEND_UTF8(&doc, "state", "dead");
  int replaced = -1;
  char *json = obx_json_render(&doc, NULL, &replaced);
  if (strstr(json, "$date")) fail_msg("got %s, want no {\"$date\": ...}", json);
  expect_field(json, "firstFailureAt", "2025-12-01T13:00:00.123Z", 24);
  expect_field(json, "redrive.at", "1970-01-01T00:00:00.000Z", 24);
  expect_field(json, "history.0.at", "1969-12-31T23:59:59.999Z", 24);
  expect_field(json, "history.0.reason", "bad " FFFD, strlen("bad " FFFD));
  expect_field(json, "history.1", "9999-12-31T23:59:59.999Z", 24);
  expect_field(json, "state", "dead", 4);
  assert_non_null(strstr(json, "\"count\" : 2"));
  assert_int_equal(replaced, 1);
  bson_free(json);
  bson_destroy(&doc);
}

static void test_render_corrupt_document(void **state) {
  uint8_t bytes[] = {16, 0, 0, 0, 0x02, 'a', 0, 200, 0, 0, 0, 'x', 0, 0, 0, 0}; /* string length beyond the document */
  bson_t doc;
  assert_true(bson_init_static(&doc, bytes, sizeof bytes));
  char *json = obx_json_render(&doc, NULL, NULL);
  assert_string_equal(json, "{ \"error\" : \"not a valid BSON document\" }");
  bson_free(json);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_parse_table),
    cmocka_unit_test(test_render_invalid_utf8),
    cmocka_unit_test(test_render_valid_and_long),
    cmocka_unit_test(test_render_corrupt_document),
    cmocka_unit_test(test_render_dates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
