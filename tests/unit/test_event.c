/* test_event.c - UUIDv7, RFC 3339, and the outbox / Kafka / structured CloudEvent forms */
#include "obx_test.h"
#include "obx/obx_event.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- UUIDv7 ----------------------------------------------------------------------------- */

static void test_uuid_format(void **state) {
  char id[OBX_UUID_LEN + 1];
  int64_t before = obx_time_now_ms();
  obx_uuid7(id);
  int64_t after = obx_time_now_ms();
  assert_int_equal(strlen(id), 36);
  assert_true(obx_uuid_valid(id));
  assert_int_equal(id[14], '7');                      /* version */
  assert_non_null(strchr("89ab", id[19]));            /* variant 10 */
  for (const char *p = id; *p; p++) assert_true(*p == '-' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
  char hex[13];
  memcpy(hex, id, 8);
  memcpy(hex + 8, id + 9, 4);
  hex[12] = '\0';
  int64_t ts = strtoll(hex, NULL, 16);
  if (ts < before || ts > after + 1) fail_msg("timestamp %lld not within [%lld, %lld]", (long long)ts, (long long)before, (long long)after);

  static const struct {
    const char *s;
    bool valid;
  } cases[] = {
    {"0190f0a8-1c2b-7d3e-8f40-123456789abc", true}, {"0190F0A8-1C2B-7D3E-8F40-123456789ABC", true},
    {"550e8400-e29b-41d4-a716-446655440000", true}, {"0190f0a8-1c2b-7d3e-8f40-123456789ab", false},
    {"0190f0a8-1c2b-7d3e-8f40-123456789abcd", false}, {"0190f0a81c2b-7d3e-8f40-123456789abcd", false},
    {"0190f0a8-1c2b-7d3e-8f40-123456789abg", false}, {"", false}, {NULL, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (obx_uuid_valid(cases[i].s) != cases[i].valid) fail_msg("%s: got %d want %d", cases[i].s, !cases[i].valid, cases[i].valid);
}

static void test_uuid_monotonic(void **state) {
  enum { N = 20000 };
  char prev[OBX_UUID_LEN + 1], cur[OBX_UUID_LEN + 1];
  obx_uuid7(prev);
  for (int i = 0; i < N; i++) {
    obx_uuid7(cur);
    if (strcmp(cur, prev) <= 0) fail_msg("id %d not increasing: %s after %s", i, cur, prev);
    memcpy(prev, cur, sizeof prev);
  }
}

#define UTHREADS 4
#define UPER 5000
static char uuids[UTHREADS * UPER][OBX_UUID_LEN + 1];

static void *uuid_worker(void *arg) {
  int t = (int)(intptr_t)arg;
  for (int i = 0; i < UPER; i++) obx_uuid7(uuids[t * UPER + i]);
  return NULL;
}

static int cmp_uuid(const void *a, const void *b) { return strcmp(a, b); }

static void test_uuid_threads(void **state) {
  pthread_t th[UTHREADS];
  for (int t = 0; t < UTHREADS; t++) pthread_create(&th[t], NULL, uuid_worker, (void *)(intptr_t)t);
  for (int t = 0; t < UTHREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < UTHREADS; t++)
    for (int i = 1; i < UPER; i++)
      if (strcmp(uuids[t * UPER + i], uuids[t * UPER + i - 1]) <= 0) fail_msg("thread %d: id %d not increasing", t, i);
  qsort(uuids, UTHREADS * UPER, sizeof uuids[0], cmp_uuid);
  for (int i = 1; i < UTHREADS * UPER; i++)
    if (strcmp(uuids[i], uuids[i - 1]) == 0) fail_msg("duplicate id %s", uuids[i]);
}

/* ---- time ------------------------------------------------------------------------------- */

static void test_time(void **state) {
  static const struct {
    const char *in;
    bool ok;
    int64_t ms;
    const char *formatted;
  } cases[] = {
    {"2026-11-29T18:00:00.123Z", true, 1795975200123LL, "2026-11-29T18:00:00.123Z"},
    {"2026-11-29T18:00:00Z", true, 1795975200000LL, "2026-11-29T18:00:00.000Z"},
    {"2026-11-29T15:00:00.5-03:00", true, 1795975200500LL, "2026-11-29T18:00:00.500Z"},
    {"2026-11-29t18:00:00.123456z", true, 1795975200123LL, "2026-11-29T18:00:00.123Z"},
    {"1970-01-01T00:00:00Z", true, 0, "1970-01-01T00:00:00.000Z"},
    {"1969-12-31T23:59:59.999Z", true, -1, "1969-12-31T23:59:59.999Z"},
    {"2024-02-29T00:00:00Z", true, 1709164800000LL, "2024-02-29T00:00:00.000Z"},
    {"2026-02-29T00:00:00Z", false, 0, NULL},
    {"2026-13-01T00:00:00Z", false, 0, NULL},
    {"2026-11-29T24:00:00Z", false, 0, NULL},
    {"2026-11-29T18:00:00", false, 0, NULL},
    {"2026-11-29 18:00", false, 0, NULL},
    {"2026-11-29T18:00:00.Z", false, 0, NULL},
    {"2026-11-29T18:00:00Zjunk", false, 0, NULL},
    {"yesterday", false, 0, NULL},
    {"", false, 0, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t ms = 0;
    bool ok = obx_time_parse_rfc3339(cases[i].in, &ms);
    if (ok != cases[i].ok || (ok && ms != cases[i].ms))
      fail_msg("%s: got ok=%d ms=%lld want ok=%d ms=%lld", cases[i].in, ok, (long long)ms, cases[i].ok, (long long)cases[i].ms);
    if (ok) {
      char out[32];
      obx_time_format_rfc3339(ms, out);
      if (strcmp(out, cases[i].formatted) != 0) fail_msg("format %lld: got %s want %s", (long long)ms, out, cases[i].formatted);
    }
  }
}

/* ---- the envelope ----------------------------------------------------------------------- */

static void sample_event(obx_event_t *ev) {
  obx_event_init(ev);
  ev->event_type = strdup("OrderConfirmed");
  ev->event_version = 2;
  ev->org_id = strdup("org-1");
  ev->aggregate_type = strdup("Order");
  ev->aggregate_id = strdup("ord/42"); /* a slash inside the id survives ce_subject */
  ev->correlation_id = strdup("corr-1");
  ev->causation_id = strdup("cause-1");
  ev->occurred_at_ms = 1795975200123LL;
  bson_decimal128_t dec;
  bson_decimal128_from_string("1234.50", &dec);
  bson_t items, item;
  BSON_APPEND_UTF8(&ev->payload, "orderNumber", "A-1001");
  BSON_APPEND_DECIMAL128(&ev->payload, "totalAmount", &dec);
  BSON_APPEND_UTF8(&ev->payload, "customer", "Jo\xc3\xa3o \"Q\"");
  BSON_APPEND_INT32(&ev->payload, "count", 3);
  BSON_APPEND_BOOL(&ev->payload, "paid", true);
  BSON_APPEND_NULL(&ev->payload, "note");
  BSON_APPEND_DOUBLE(&ev->payload, "weight", 2.5);
  BSON_APPEND_DATE_TIME(&ev->payload, "dueAt", 1795975200000LL);
  BSON_APPEND_ARRAY_BEGIN(&ev->payload, "items", &items);
  BSON_APPEND_DOCUMENT_BEGIN(&items, "0", &item);
  BSON_APPEND_UTF8(&item, "sku", "X");
  bson_append_document_end(&items, &item);
  bson_append_array_end(&ev->payload, &items);
}

static void assert_same_event(const obx_event_t *got, const obx_event_t *want, bool same_source) {
#define SAME_STR(f)                                                                                        \
  if ((got->f == NULL) != (want->f == NULL) || (got->f && strcmp(got->f, want->f) != 0))                  \
    fail_msg(#f ": got %s want %s", got->f ? got->f : "(null)", want->f ? want->f : "(null)");
  assert_string_equal(got->id, want->id);
  SAME_STR(event_type);
  SAME_STR(org_id);
  SAME_STR(aggregate_type);
  SAME_STR(aggregate_id);
  SAME_STR(partition_key);
  SAME_STR(correlation_id);
  SAME_STR(causation_id);
  if (same_source) SAME_STR(source);
#undef SAME_STR
  assert_int_equal(got->event_version, want->event_version);
  assert_int_equal(got->occurred_at_ms, want->occurred_at_ms);
  if (!bson_equal(&got->payload, &want->payload)) {
    char *g = bson_as_canonical_extended_json(&got->payload, NULL), *w = bson_as_canonical_extended_json(&want->payload, NULL);
    fail_msg("payload: got %s want %s", g, w);
  }
}

static void test_finalize(void **state) {
  obx_event_t ev;
  obx_event_init(&ev);
  obx_err_t err = OBX_ERR_INIT;
  assert_false(obx_event_finalize(&ev, &err));
  assert_int_equal(err.domain, OBX_ERR_INPUT);
  assert_non_null(strstr(err.msg, "eventType: missing"));
  ev.event_type = strdup("X");
  ev.org_id = strdup("o");
  ev.aggregate_type = strdup("Order");
  ev.aggregate_id = strdup("1");
  int64_t before = obx_time_now_ms();
  assert_true(obx_event_finalize(&ev, &err));
  assert_true(obx_uuid_valid(ev.id));
  assert_string_equal(ev.partition_key, "1");
  assert_int_equal(ev.event_version, 1);
  assert_true(ev.occurred_at_ms >= before);
  obx_event_t copy;
  obx_event_init(&copy);
  copy.event_type = strdup("replaced");
  BSON_APPEND_INT32(&copy.payload, "old", 1);
  obx_event_copy(&copy, &ev);
  assert_same_event(&copy, &ev, true);
  obx_event_cleanup(&copy);
  ev.event_version = -1;
  assert_false(obx_event_finalize(&ev, &err));
  assert_non_null(strstr(err.msg, "eventVersion"));
  obx_event_cleanup(&ev);
  obx_event_cleanup(NULL);
}

static void test_round_trip(void **state) {
  obx_event_t ev, back, from_kafka, from_json;
  obx_err_t err = OBX_ERR_INIT;
  sample_event(&ev);
  assert_true(obx_event_finalize(&ev, &err));
  assert_string_equal(ev.partition_key, "ord/42");

  /* outbox document */
  bson_t doc;
  bson_init(&doc);
  assert_true(obx_event_to_outbox(&ev, &doc, &err));
  bson_iter_t it;
  static const char *const order[] = {"_id", "eventType", "eventVersion", "orgId", "aggregateType", "aggregateId",
                                      "partitionKey", "correlationId", "causationId", "payload", "occurredAt",
                                      "status", "attempts", "availableAt", "lastError"};
  assert_true(bson_iter_init(&it, &doc));
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    assert_true(bson_iter_next(&it));
    if (strcmp(bson_iter_key(&it), order[i]) != 0) fail_msg("field %zu: got %s want %s", i, bson_iter_key(&it), order[i]);
  }
  assert_true(bson_iter_init_find(&it, &doc, "status"));
  assert_string_equal(bson_iter_utf8(&it, NULL), "PENDING");
  assert_true(bson_iter_init_find(&it, &doc, "attempts") && BSON_ITER_HOLDS_INT32(&it) && bson_iter_int32(&it) == 0);
  assert_true(bson_iter_init_find(&it, &doc, "occurredAt") && BSON_ITER_HOLDS_DATE_TIME(&it));
  assert_int_equal(bson_iter_date_time(&it), ev.occurred_at_ms);
  assert_true(bson_iter_init_find(&it, &doc, "availableAt") && bson_iter_date_time(&it) == ev.occurred_at_ms);
  assert_true(bson_iter_init_find(&it, &doc, "lastError") && BSON_ITER_HOLDS_NULL(&it));
  assert_true(bson_iter_init_find(&it, &doc, "eventVersion") && bson_iter_int32(&it) == 2);
  assert_false(bson_iter_init_find(&it, &doc, "source"));

  obx_event_init(&back);
  if (!obx_event_from_outbox(&back, &doc, &err)) fail_msg("from_outbox: %s", err.msg);
  assert_same_event(&back, &ev, true);
  bson_destroy(&doc);

  /* Kafka record */
  obx_kafka_record_t rec;
  assert_true(obx_event_to_kafka(&back, "/outboxd/test", &rec, &err));
  assert_int_equal(rec.key_len, strlen("ord/42"));
  assert_memory_equal(rec.key, "ord/42", rec.key_len);
  assert_non_null(strstr(rec.value, "\"$numberDecimal\""));
  assert_non_null(strstr(rec.value, "1234.50"));
  static const struct {
    const char *name, *value;
  } want_headers[] = {
    {"ce_specversion", "1.0"}, {"ce_id", NULL}, {"ce_source", "/outboxd/test"}, {"ce_type", "OrderConfirmed"},
    {"ce_time", "2026-11-29T18:00:00.123Z"}, {"ce_subject", "Order/ord/42"}, {"ce_partitionkey", "ord/42"},
    {"ce_orgid", "org-1"}, {"ce_correlationid", "corr-1"}, {"ce_causationid", "cause-1"}, {"ce_eventversion", "2"},
    {"content-type", "application/json"},
  };
  assert_int_equal(rec.nheaders, (int)(sizeof want_headers / sizeof want_headers[0]));
  for (int i = 0; i < rec.nheaders; i++) {
    const char *want = want_headers[i].value ? want_headers[i].value : ev.id;
    assert_string_equal(rec.headers[i].name, want_headers[i].name);
    if (rec.headers[i].len != strlen(want) || memcmp(rec.headers[i].value, want, rec.headers[i].len) != 0)
      fail_msg("%s: got %.*s want %s", rec.headers[i].name, (int)rec.headers[i].len, (const char *)rec.headers[i].value, want);
  }
  obx_event_init(&from_kafka);
  if (!obx_event_from_kafka(&from_kafka, rec.key, rec.key_len, rec.value, rec.value_len, rec.headers, rec.nheaders, &err))
    fail_msg("from_kafka: %s", err.msg);
  assert_same_event(&from_kafka, &ev, false);
  assert_string_equal(from_kafka.source, "/outboxd/test");

  /* structured mode: the same attributes as one JSON document */
  bson_t ce, data;
  bson_init(&ce);
  for (int i = 0; i < rec.nheaders; i++) {
    if (strncmp(rec.headers[i].name, "ce_", 3) != 0) continue;
    bson_append_utf8(&ce, rec.headers[i].name + 3, -1, rec.headers[i].value, (int)rec.headers[i].len);
  }
  BSON_APPEND_UTF8(&ce, "datacontenttype", "application/json");
  assert_true(bson_init_from_json(&data, rec.value, (ssize_t)rec.value_len, NULL));
  BSON_APPEND_DOCUMENT(&ce, "data", &data);
  size_t jlen;
  char *json = bson_as_relaxed_extended_json(&ce, &jlen);
  obx_event_init(&from_json);
  if (!obx_event_from_ce_json(&from_json, json, jlen, &err)) fail_msg("from_ce_json: %s (%s)", err.msg, json);
  assert_same_event(&from_json, &from_kafka, true);
  /* decoding into a used event replaces it */
  if (!obx_event_from_ce_json(&from_json, json, jlen, &err)) fail_msg("from_ce_json again: %s", err.msg);
  assert_same_event(&from_json, &from_kafka, true);
  bson_free(json);
  bson_destroy(&data);
  bson_destroy(&ce);

  obx_kafka_record_cleanup(&rec);
  obx_kafka_record_cleanup(&rec); /* idempotent */
  obx_event_cleanup(&from_json);
  obx_event_cleanup(&from_kafka);
  obx_event_cleanup(&back);
  obx_event_cleanup(&ev);
}

/* A good binary-mode record that each rejection case alters in one place. */
typedef struct {
  const char *name, *value; /* value NULL: header dropped */
} hdr_t;

static const hdr_t good_headers[] = {
  {"ce_specversion", "1.0"}, {"ce_id", "0190f0a8-1c2b-7d3e-8f40-123456789abc"}, {"ce_source", "/svc"},
  {"ce_type", "OrderConfirmed"}, {"ce_time", "2026-11-29T18:00:00.123Z"}, {"ce_subject", "Order/42"},
  {"ce_orgid", "org-1"}, {"ce_eventversion", "1"}, {"content-type", "application/json"},
};
#define NGOOD ((int)(sizeof good_headers / sizeof good_headers[0]))

static void test_kafka_rejections(void **state) {
  static char long_key[OBX_EVENT_MAX_ATTR_LEN + 2];
  memset(long_key, 'k', sizeof long_key - 1);
  static const struct {
    const char *name;
    const char *header, *value; /* header to replace (value NULL: remove); NULL: none */
    const char *payload;        /* NULL: {"a":1} */
    bool long_key;
    const char *want;           /* error prefix; NULL: accepted */
  } cases[] = {
    {"accepted as is", NULL, NULL, NULL, false, NULL},
    {"missing ce_id", "ce_id", NULL, NULL, false, "ce_id: missing"},
    {"empty ce_id", "ce_id", "", NULL, false, "ce_id: empty"},
    {"ce_id too long", "ce_id", "0190f0a8-1c2b-7d3e-8f40-123456789abcdef", NULL, false, "ce_id: longer than 36"},
    {"missing specversion", "ce_specversion", NULL, NULL, false, "ce_specversion: missing"},
    {"bad specversion", "ce_specversion", "0.3", NULL, false, "ce_specversion: unsupported '0.3'"},
    {"missing source", "ce_source", NULL, NULL, false, "ce_source: missing"},
    {"missing type", "ce_type", NULL, NULL, false, "ce_type: missing"},
    {"type not UTF-8", "ce_type", "Order\xff", NULL, false, "ce_type: not valid UTF-8"},
    {"bad time", "ce_time", "29/11/2026", NULL, false, "ce_time: '29/11/2026' is not an RFC 3339"},
    {"time without zone", "ce_time", "2026-11-29T18:00:00", NULL, false, "ce_time:"},
    {"missing subject", "ce_subject", NULL, NULL, false, "ce_subject: missing"},
    {"subject without slash", "ce_subject", "Order42", NULL, false, "ce_subject: 'Order42' is not"},
    {"subject without id", "ce_subject", "Order/", NULL, false, "ce_subject:"},
    {"missing orgid", "ce_orgid", NULL, NULL, false, "ce_orgid: missing"},
    {"eventversion zero", "ce_eventversion", "0", NULL, false, "ce_eventversion: '0' is not a positive integer"},
    {"eventversion text", "ce_eventversion", "v2", NULL, false, "ce_eventversion: 'v2'"},
    {"eventversion negative", "ce_eventversion", "-1", NULL, false, "ce_eventversion:"},
    {"eventversion huge", "ce_eventversion", "99999999999", NULL, false, "ce_eventversion:"},
    {"content type", "content-type", "text/plain", NULL, false, "content-type: 'text/plain'"},
    {"content type charset", "content-type", "application/json; charset=utf-8", NULL, false, NULL},
    {"no content type", "content-type", NULL, NULL, false, NULL},
    {"no time: now", "ce_time", NULL, NULL, false, NULL},
    {"payload array", NULL, NULL, "[1,2]", false, "payload: not a JSON object"},
    {"payload string", NULL, NULL, "\"x\"", false, "payload: not a JSON object"},
    {"payload empty", NULL, NULL, "", false, "payload: empty"},
    {"payload broken", NULL, NULL, "{\"a\":", false, "payload: invalid JSON"},
    {"oversize key", NULL, NULL, NULL, true, "key: longer than 1024 bytes"},
    {"oversize partitionkey", "ce_partitionkey", long_key, NULL, false, "ce_partitionkey: longer than 1024 bytes"},
    {"keyseq", "ce_keyseq", "12", NULL, false, NULL},
    {"keyseq zero", "ce_keyseq", "0", NULL, false, "ce_keyseq: '0' is not a positive integer"},
    {"keyseq text", "ce_keyseq", "seven", NULL, false, "ce_keyseq: 'seven' is not a positive integer"},
    {"keyseq past int64", "ce_keyseq", "9223372036854775808", NULL, false, "ce_keyseq:"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    obx_ce_header_t h[NGOOD + 1];
    int n = 0;
    bool replaced = false;
    for (int i = 0; i < NGOOD; i++) {
      const char *v = good_headers[i].value;
      if (cases[c].header && strcmp(cases[c].header, good_headers[i].name) == 0) {
        replaced = true;
        v = cases[c].value;
        if (!v) continue;
      }
      h[n++] = (obx_ce_header_t){good_headers[i].name, v, strlen(v)};
    }
    if (cases[c].header && !replaced && cases[c].value)
      h[n++] = (obx_ce_header_t){cases[c].header, cases[c].value, strlen(cases[c].value)};
    const char *payload = cases[c].payload ? cases[c].payload : "{\"a\":1}";
    const char *key = cases[c].long_key ? long_key : "42";
    obx_event_t ev;
    obx_event_init(&ev);
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_event_from_kafka(&ev, key, strlen(key), payload, strlen(payload), h, n, &err);
    if (cases[c].want == NULL) {
      if (!ok) fail_msg("%s: rejected: %s", cases[c].name, err.msg);
      assert_string_equal(ev.aggregate_id, "42");
      assert_string_equal(ev.partition_key, "42");
    } else {
      if (ok) fail_msg("%s: accepted, want error '%s'", cases[c].name, cases[c].want);
      if (strncmp(err.msg, cases[c].want, strlen(cases[c].want)) != 0)
        fail_msg("%s: got '%s' want prefix '%s'", cases[c].name, err.msg, cases[c].want);
      assert_int_equal(err.domain, OBX_ERR_INPUT);
      assert_false(err.retriable);
    }
    obx_event_cleanup(&ev);
  }
}

static void test_ce_json_rejections(void **state) {
  static const struct {
    const char *name, *json, *want;
  } cases[] = {
    {"good", "{\"specversion\":\"1.0\",\"id\":\"e1\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"Order/1\","
             "\"orgid\":\"o\",\"eventversion\":3,\"partitionkey\":\"pk\",\"time\":\"2026-11-29T18:00:00Z\","
             "\"data\":{\"total\":{\"$numberDecimal\":\"10.10\"}}}", NULL},
    {"missing id", "{\"specversion\":\"1.0\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"Order/1\",\"orgid\":\"o\",\"data\":{}}",
     "id: missing"},
    {"id not string", "{\"specversion\":\"1.0\",\"id\":5,\"source\":\"/s\",\"type\":\"T\",\"subject\":\"Order/1\",\"orgid\":\"o\",\"data\":{}}",
     "id: must be a string"},
    {"bad specversion", "{\"specversion\":\"0.3\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"data\":{}}",
     "specversion: unsupported '0.3'"},
    {"data array", "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"data\":[1]}",
     "data: not a JSON object"},
    {"data missing", "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\"}",
     "data: missing"},
    {"data_base64", "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"data_base64\":\"eA==\"}",
     "data_base64:"},
    {"bad time", "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"time\":\"now\",\"data\":{}}",
     "time: 'now' is not an RFC 3339"},
    {"bad eventversion", "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"eventversion\":\"x\",\"data\":{}}",
     "eventversion: 'x'"},
    {"eventversion double", "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"eventversion\":1.5,\"data\":{}}",
     "eventversion: must be a string"},
    {"content type", "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"datacontenttype\":\"text/xml\",\"data\":{}}",
     "datacontenttype: 'text/xml'"},
    {"not an object", "[1,2,3]", "cloudevent: not a JSON object"},
    {"broken json", "{\"specversion\":", "cloudevent: invalid JSON"},
    {"empty", "", "cloudevent: not a JSON object"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    obx_event_t ev;
    obx_event_init(&ev);
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_event_from_ce_json(&ev, cases[c].json, strlen(cases[c].json), &err);
    if (!cases[c].want) {
      if (!ok) fail_msg("%s: rejected: %s", cases[c].name, err.msg);
      assert_int_equal(ev.event_version, 3);
      assert_string_equal(ev.partition_key, "pk");
      bson_iter_t it;
      assert_true(bson_iter_init_find(&it, &ev.payload, "total") && BSON_ITER_HOLDS_DECIMAL128(&it));
    } else {
      if (ok) fail_msg("%s: accepted, want '%s'", cases[c].name, cases[c].want);
      if (strncmp(err.msg, cases[c].want, strlen(cases[c].want)) != 0)
        fail_msg("%s: got '%s' want prefix '%s'", cases[c].name, err.msg, cases[c].want);
    }
    obx_event_cleanup(&ev);
  }
}

/* keySeq goes from the outbox document to ce_keyseq, back from a record, and from structured
 * mode as a JSON integer or a string; an event without it has none anywhere. */
static void test_key_seq_travels(void **state) {
  (void)state;
  static const char *const docs[] = {
    "{\"_id\":\"e1\",\"eventType\":\"T\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\","
    "\"payload\":{},\"occurredAt\":{\"$date\":1000},\"keySeq\":{\"$numberLong\":\"4294967301\"}}",
    "{\"_id\":\"e1\",\"eventType\":\"T\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\","
    "\"payload\":{},\"occurredAt\":{\"$date\":1000}}",
  };
  static const int64_t want[] = {4294967301LL, 0};
  for (int d = 0; d < 2; d++) {
    bson_t *doc = bson_new_from_json((const uint8_t *)docs[d], -1, NULL);
    obx_event_t ev, back;
    obx_event_init(&ev);
    obx_event_init(&back);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_event_from_outbox(&ev, doc, &err)) fail_msg("from_outbox: %s", err.msg);
    assert_int_equal(ev.key_seq, want[d]);
    obx_kafka_record_t rec;
    assert_true(obx_event_to_kafka(&ev, "/s", &rec, &err));
    const obx_ce_header_t *h = NULL;
    for (int i = 0; i < rec.nheaders; i++)
      if (strcmp(rec.headers[i].name, "ce_keyseq") == 0) h = &rec.headers[i];
    if (want[d]) {
      assert_non_null(h);
      assert_int_equal(h->len, strlen("4294967301"));
      assert_memory_equal(h->value, "4294967301", h->len);
    } else {
      assert_null(h);
    }
    if (!obx_event_from_kafka(&back, rec.key, rec.key_len, rec.value, rec.value_len, rec.headers, rec.nheaders, &err))
      fail_msg("from_kafka: %s", err.msg);
    assert_int_equal(back.key_seq, want[d]);
    obx_event_copy(&back, &ev);
    assert_int_equal(back.key_seq, want[d]);
    obx_kafka_record_cleanup(&rec);
    obx_event_cleanup(&back);
    obx_event_cleanup(&ev);
    bson_destroy(doc);
  }
  static const char *const json[] = {
    "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"keyseq\":9,\"data\":{}}",
    "{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"/s\",\"type\":\"T\",\"subject\":\"O/1\",\"orgid\":\"o\",\"keyseq\":\"9\",\"data\":{}}",
  };
  for (int j = 0; j < 2; j++) {
    obx_event_t ev;
    obx_event_init(&ev);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_event_from_ce_json(&ev, json[j], strlen(json[j]), &err)) fail_msg("from_ce_json: %s", err.msg);
    assert_int_equal(ev.key_seq, 9);
    obx_event_cleanup(&ev);
  }
}

static void test_outbox_rejections(void **state) {
  static const struct {
    const char *name, *json, *want;
  } cases[] = {
    {"good", "{\"_id\":\"e1\",\"eventType\":\"T\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\","
             "\"payload\":{},\"occurredAt\":{\"$date\":1000},\"correlationId\":null}", NULL},
    {"missing _id", "{\"eventType\":\"T\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":{},\"occurredAt\":{\"$date\":1}}",
     "_id: missing"},
    {"missing eventType", "{\"_id\":\"e\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":{},\"occurredAt\":{\"$date\":1}}",
     "eventType: missing"},
    {"orgId number", "{\"_id\":\"e\",\"eventType\":\"T\",\"orgId\":5,\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":{},\"occurredAt\":{\"$date\":1}}",
     "orgId: must be a string"},
    {"payload array", "{\"_id\":\"e\",\"eventType\":\"T\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":[],\"occurredAt\":{\"$date\":1}}",
     "payload: not a document"},
    {"occurredAt string", "{\"_id\":\"e\",\"eventType\":\"T\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":{},\"occurredAt\":\"today\"}",
     "occurredAt: missing or not a date"},
    {"keySeq string", "{\"_id\":\"e\",\"eventType\":\"T\",\"keySeq\":\"3\",\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":{},\"occurredAt\":{\"$date\":1}}",
     "keySeq: must be an integer"},
    {"keySeq zero", "{\"_id\":\"e\",\"eventType\":\"T\",\"keySeq\":0,\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":{},\"occurredAt\":{\"$date\":1}}",
     "keySeq: must be positive"},
    {"eventVersion zero", "{\"_id\":\"e\",\"eventType\":\"T\",\"eventVersion\":0,\"orgId\":\"o\",\"aggregateType\":\"Order\",\"aggregateId\":\"1\",\"payload\":{},\"occurredAt\":{\"$date\":1}}",
     "eventVersion: must be a positive integer"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bson_t *doc = bson_new_from_json((const uint8_t *)cases[c].json, -1, NULL);
    assert_non_null(doc);
    obx_event_t ev;
    obx_event_init(&ev);
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_event_from_outbox(&ev, doc, &err);
    if (!cases[c].want) {
      if (!ok) fail_msg("%s: rejected: %s", cases[c].name, err.msg);
      assert_null(ev.correlation_id);
      assert_string_equal(ev.partition_key, "1");
      assert_int_equal(ev.occurred_at_ms, 1000);
    } else {
      if (ok) fail_msg("%s: accepted, want '%s'", cases[c].name, cases[c].want);
      if (strncmp(err.msg, cases[c].want, strlen(cases[c].want)) != 0)
        fail_msg("%s: got '%s' want prefix '%s'", cases[c].name, err.msg, cases[c].want);
    }
    obx_event_cleanup(&ev);
    bson_destroy(doc);
  }
  /* an unfinalized event cannot be written */
  obx_event_t ev;
  obx_event_init(&ev);
  bson_t out;
  bson_init(&out);
  obx_err_t err = OBX_ERR_INIT;
  assert_false(obx_event_to_outbox(&ev, &out, &err));
  obx_kafka_record_t rec;
  assert_false(obx_event_to_kafka(&ev, "/s", &rec, &err));
  obx_kafka_record_cleanup(&rec);
  bson_destroy(&out);
  obx_event_cleanup(&ev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_uuid_format),      cmocka_unit_test(test_uuid_monotonic),  cmocka_unit_test(test_uuid_threads),
    cmocka_unit_test(test_time),             cmocka_unit_test(test_finalize),        cmocka_unit_test(test_round_trip),
    cmocka_unit_test(test_kafka_rejections), cmocka_unit_test(test_ce_json_rejections), cmocka_unit_test(test_outbox_rejections),
    cmocka_unit_test(test_key_seq_travels),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
