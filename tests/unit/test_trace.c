/* test_trace.c - W3C trace context, sampling, spans, OTLP JSON, the exporter's queue and drops */
#include "obx_test.h"
#include "obx_test_httpd.h"
#include "obx/obx_event.h"
#include "obx/obx_log.h"
#include "obx/obx_trace.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TP_OK "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static void test_traceparent_table(void **state) {
  static const struct {
    const char *in;
    bool valid;
    const char *formatted; /* what it is written back as (NULL: the input) */
  } cases[] = {
    {TP_OK, true, NULL},
    {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true, NULL},
    {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", true,
     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},                      /* unknown flags dropped */
    {"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds", true,
     TP_OK},                                                                         /* a later version: its prefix */
    {"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true, TP_OK},
    {"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", false, NULL},       /* no '-' after the flags */
    {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false, NULL},   /* version 00 is exact */
    {"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false, NULL},        /* version ff */
    {"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false, NULL},        /* zero trace id */
    {"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false, NULL},        /* zero parent id */
    {"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false, NULL},        /* uppercase */
    {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", false, NULL},        /* bad flags */
    {"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false, NULL},        /* bad separator */
    {"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", false, NULL},         /* short trace id */
    {"", false, NULL},
    {"zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_trace_ctx_t ctx;
    bool got = obx_trace_parse(cases[i].in, strlen(cases[i].in), NULL, 0, &ctx);
    if (got != cases[i].valid) fail_msg("case %zu '%s': got valid=%d, want %d", i, cases[i].in, got, cases[i].valid);
    assert_int_equal(ctx.valid, got);
    if (!got) continue;
    char out[OBX_TRACEPARENT_LEN + 1];
    obx_trace_format(&ctx, out);
    const char *want = cases[i].formatted ? cases[i].formatted : cases[i].in;
    if (strcmp(out, want) != 0) fail_msg("case %zu: formatted %s, want %s", i, out, want);
  }
}

static void test_tracestate_table(void **state) {
  static const struct {
    const char *in;
    bool valid;
  } cases[] = {
    {"rojo=00f067aa0ba902b7", true},
    {"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", true},
    {"rojo=1 , congo=2", true},            /* optional white space */
    {"a=1,,b=2", true},                    /* empty members are ignored */
    {"tenant@vendor=x", true},             /* multi-tenant key */
    {"a*b/c_d-e=v", true},
    {"", true},
    {"Rojo=1", false},                     /* uppercase key */
    {"rojo", false},                       /* no value */
    {"rojo=", false},                      /* empty value */
    {"rojo=a=b", false},                   /* '=' in the value */
    {"rojo=1,rojo=2", false},              /* duplicate key */
    {"1abc=x", false},                     /* simple key starts with a letter */
    {"tenant@Vendor=x", false},
    {"tenant@toolongsystemid1=x", false},  /* system id up to 14 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bool got = obx_tracestate_valid(cases[i].in, strlen(cases[i].in));
    if (got != cases[i].valid) fail_msg("case %zu '%s': got %d, want %d", i, cases[i].in, got, cases[i].valid);
  }
  /* 33 members, and more than 512 bytes, are too many */
  char many[600] = "";
  for (int i = 0; i < 33; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%sk%d=v", i ? "," : "", i);
  assert_false(obx_tracestate_valid(many, strlen(many)));
  char big[600];
  memset(big, 'v', sizeof big);
  memcpy(big, "k=", 2);
  assert_false(obx_tracestate_valid(big, sizeof big));

  /* a valid traceparent with a bad tracestate keeps the context, not the state */
  obx_trace_ctx_t ctx;
  assert_true(obx_trace_parse(TP_OK, strlen(TP_OK), "Bad=1", 5, &ctx));
  assert_string_equal(ctx.state, "");
  assert_true(obx_trace_parse(TP_OK, strlen(TP_OK), "rojo=1", 6, &ctx));
  assert_string_equal(ctx.state, "rojo=1");
}

static void test_sampler_table(void **state) {
  obx_trace_ctx_t sampled, unsampled;
  assert_true(obx_trace_parse(TP_OK, strlen(TP_OK), NULL, 0, &sampled));
  unsampled = sampled;
  unsampled.flags = 0;
  uint8_t low[16] = {0}, high[16];
  memset(high, 0xff, sizeof high);
  static const struct {
    const char *name, *arg;
    int parent; /* 0 none, 1 sampled, 2 unsampled */
    bool low_id, want;
  } cases[] = {
    {NULL, NULL, 0, true, true}, /* default parentbased_always_on */
    {NULL, NULL, 2, true, false},
    {"always_on", NULL, 2, true, true},
    {"always_off", NULL, 1, true, false},
    {"parentbased_always_off", NULL, 0, true, false},
    {"parentbased_always_off", NULL, 1, true, true},
    {"traceidratio", "0.5", 0, true, true},
    {"traceidratio", "0.5", 0, false, false},
    {"traceidratio", "0", 0, true, false},
    {"parentbased_traceidratio", "0.5", 0, false, false},
    {"parentbased_traceidratio", "0.5", 1, false, true}, /* the parent decides */
    {"parentbased_traceidratio", "0", 0, true, false},
    {"parentbased_traceidratio", "1", 0, false, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_sampler_t s;
    obx_err_t err = OBX_ERR_INIT;
    assert_true(obx_sampler_parse(cases[i].name, cases[i].arg, &s, &err));
    const obx_trace_ctx_t *parent = cases[i].parent == 1 ? &sampled : cases[i].parent == 2 ? &unsampled : NULL;
    bool got = obx_sampler_decide(&s, parent, cases[i].low_id ? low : high);
    if (got != cases[i].want) fail_msg("case %zu (%s %s): got %d, want %d", i, cases[i].name, cases[i].arg, got, cases[i].want);
  }
  /* a ratio samples about that share of random trace ids */
  obx_sampler_t s;
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_sampler_parse("traceidratio", "0.25", &s, &err));
  int hits = 0;
  for (int i = 0; i < 4000; i++) {
    obx_span_t *span = obx_span_start("x", OBX_SPAN_INTERNAL, NULL);
    hits += obx_sampler_decide(&s, NULL, obx_span_ctx(span)->trace_id);
    obx_span_end(span);
  }
  if (hits < 800 || hits > 1200) fail_msg("ratio 0.25 of 4000: got %d sampled, want 800..1200", hits);

  static const struct {
    const char *name, *arg, *msg;
  } bad[] = {
    {"sometimes", NULL, "OTEL_TRACES_SAMPLER: unknown sampler 'sometimes'"},
    {"traceidratio", "1.5", "OTEL_TRACES_SAMPLER_ARG: '1.5' is not a ratio"},
    {"parentbased_traceidratio", "half", "OTEL_TRACES_SAMPLER_ARG: 'half' is not a ratio"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    obx_err_t e = OBX_ERR_INIT;
    assert_false(obx_sampler_parse(bad[i].name, bad[i].arg, &s, &e));
    if (!strstr(e.msg, bad[i].msg)) fail_msg("got '%s', want '%s'", e.msg, bad[i].msg);
  }
}

static void test_span_ids_and_parent(void **state) {
  obx_trace_ctx_t parent;
  assert_true(obx_trace_parse(TP_OK, strlen(TP_OK), "rojo=1", 6, &parent));
  obx_span_t *child = obx_span_start("child", OBX_SPAN_CLIENT, &parent);
  const obx_trace_ctx_t *c = obx_span_ctx(child);
  assert_memory_equal(c->trace_id, parent.trace_id, 16);
  assert_memory_not_equal(c->span_id, parent.span_id, 8);
  assert_string_equal(c->state, "rojo=1");
  assert_true(obx_trace_sampled(c));
  obx_span_t *root = obx_span_start("root", OBX_SPAN_SERVER, NULL), *root2 = obx_span_start("root", OBX_SPAN_SERVER, NULL);
  assert_memory_not_equal(obx_span_ctx(root)->trace_id, obx_span_ctx(root2)->trace_id, 16);
  obx_trace_ctx_t unsampled = parent;
  unsampled.flags = 0;
  obx_span_t *quiet = obx_span_start("quiet", OBX_SPAN_INTERNAL, &unsampled);
  assert_false(obx_trace_sampled(obx_span_ctx(quiet)));   /* propagates "not sampled" */
  assert_true(obx_span_ctx(quiet)->valid);
  obx_span_end(quiet);
  obx_span_end(root2);
  obx_span_end(root);
  obx_span_end(child);
  obx_span_end(NULL);
}

/* Finds value.<type> of the attribute `key` in an OTLP attributes array. */
static bool find_attr(const bson_t *span, const char *key, const char *type, bson_iter_t *value) {
  char path[64];
  snprintf(path, sizeof path, "value.%s", type);
  bson_iter_t it, arr;
  if (!bson_iter_init_find(&it, span, "attributes") || !bson_iter_recurse(&it, &arr)) return false;
  while (bson_iter_next(&arr)) {
    bson_iter_t k, v;
    if (bson_iter_recurse(&arr, &k) && bson_iter_find(&k, "key") && strcmp(bson_iter_utf8(&k, NULL), key) == 0 &&
        bson_iter_recurse(&arr, &v) && bson_iter_find_descendant(&v, path, value))
      return true;
  }
  return false;
}

static void test_otlp_json(void **state) {
  obx_trace_ctx_t parent, other;
  assert_true(obx_trace_parse(TP_OK, strlen(TP_OK), NULL, 0, &parent));
  const char *tp2 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  assert_true(obx_trace_parse(tp2, strlen(tp2), NULL, 0, &other));
  obx_span_t *span = obx_span_start("POST /orders", OBX_SPAN_SERVER, &parent);
  obx_span_set_str(span, "http.request.method", "POST");
  obx_span_set_str(span, "quote", "a \"b\"\n");
  obx_span_set_int(span, "http.response.status_code", 201);
  obx_span_set_int(span, "http.response.status_code", 503); /* the last value wins */
  obx_span_set_bool(span, "retry", true);
  obx_span_add_link(span, &other, "redrive");
  obx_span_set_error(span, "boom");
  char *json = obx_trace_encode(&span, 1, "svc", "deployment.environment=test,service.name=ignored,team=a%2Cb");
  bson_error_t berr;
  bson_t doc;
  if (!bson_init_from_json(&doc, json, -1, &berr)) fail_msg("not JSON (%s): %s", berr.message, json);

  bson_iter_t it;
  assert_true(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "resourceSpans.0.resource.attributes", &it));
  char *res = bson_as_relaxed_extended_json(&doc, NULL);
  assert_non_null(strstr(res, "{ \"key\" : \"service.name\", \"value\" : { \"stringValue\" : \"svc\" } }"));
  assert_null(strstr(res, "ignored"));
  assert_non_null(strstr(res, "\"team\", \"value\" : { \"stringValue\" : \"a,b\" }"));
  bson_free(res);

  assert_true(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "resourceSpans.0.scopeSpans.0.spans.0", &it));
  uint32_t len;
  const uint8_t *data;
  bson_iter_document(&it, &len, &data);
  bson_t s;
  bson_init_static(&s, data, len);
  const obx_trace_ctx_t *c = obx_span_ctx(span);
  char t[33], sp[17];
  obx_trace_ids_hex(c, t, sp);
  static const struct {
    const char *path, *want;
  } strs[] = {{"traceId", "4bf92f3577b34da6a3ce929d0e0e4736"}, {"parentSpanId", "00f067aa0ba902b7"},
              {"name", "POST /orders"}, {"status.message", "boom"},
              {"links.0.traceId", "0af7651916cd43dd8448eb211c80319c"}, {"links.0.spanId", "b7ad6b7169203331"},
              {"links.0.attributes.0.value.stringValue", "redrive"}};
  for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
    bson_iter_t f;
    if (!bson_iter_init(&f, &s) || !bson_iter_find_descendant(&f, strs[i].path, &f) || !BSON_ITER_HOLDS_UTF8(&f))
      fail_msg("%s: missing", strs[i].path);
    if (strcmp(bson_iter_utf8(&f, NULL), strs[i].want) != 0)
      fail_msg("%s: got %s, want %s", strs[i].path, bson_iter_utf8(&f, NULL), strs[i].want);
  }
  bson_iter_t f;
  assert_true(bson_iter_init(&f, &s) && bson_iter_find_descendant(&f, "spanId", &f));
  assert_string_equal(bson_iter_utf8(&f, NULL), sp);
  assert_true(bson_iter_init(&f, &s) && bson_iter_find_descendant(&f, "kind", &f));
  assert_int_equal(bson_iter_as_int64(&f), 2);
  assert_true(bson_iter_init(&f, &s) && bson_iter_find_descendant(&f, "status.code", &f));
  assert_int_equal(bson_iter_as_int64(&f), 2);
  assert_true(find_attr(&s, "http.response.status_code", "intValue", &f));
  assert_string_equal(bson_iter_utf8(&f, NULL), "503");
  assert_true(find_attr(&s, "quote", "stringValue", &f));
  assert_string_equal(bson_iter_utf8(&f, NULL), "a \"b\"\n");
  assert_true(find_attr(&s, "retry", "boolValue", &f));
  assert_true(bson_iter_bool(&f));
  bson_destroy(&doc);
  free(json);
  obx_span_end(span);
}

static void test_env_options(void **state) {
  static const struct {
    const char *var, *value, *msg; /* msg NULL: accepted */
  } cases[] = {
    {"OTEL_TRACES_SAMPLER", "never", "OTEL_TRACES_SAMPLER: unknown sampler"},
    {"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' is not supported"},
    {"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", NULL},
    {"OTEL_EXPORTER_OTLP_HEADERS", "novalue", "OTEL_EXPORTER_OTLP_HEADERS: want name=value"},
    {"OTEL_EXPORTER_OTLP_HEADERS", "api-key=secret,x=1", NULL},
    {"OTEL_BSP_MAX_QUEUE_SIZE", "0", "OTEL_BSP_MAX_QUEUE_SIZE: '0' is not an integer"},
    {"OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "OTEL_EXPORTER_OTLP_TIMEOUT: 'soon'"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector", "OTEL_EXPORTER_OTLP_ENDPOINT: 'ftp://collector/v1/traces'"},
    {"OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER: 'zipkin' is not supported"},
    {"OTEL_RESOURCE_ATTRIBUTES", "a=1,b", "OTEL_RESOURCE_ATTRIBUTES"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setenv(cases[i].var, cases[i].value, 1);
    obx_trace_opts_t opts;
    bool export;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_trace_opts_from_env(&opts, &export, &err);
    unsetenv(cases[i].var);
    if (ok != !cases[i].msg) fail_msg("%s=%s: got ok=%d (%s)", cases[i].var, cases[i].value, ok, err.msg);
    if (cases[i].msg && !strstr(err.msg, cases[i].msg)) fail_msg("got '%s', want '%s'", err.msg, cases[i].msg);
  }
  static const struct {
    const char *traces, *base, *exporter, *want; /* want NULL: no export */
  } urls[] = {
    {NULL, NULL, NULL, NULL},
    {NULL, "http://otel:4318", NULL, "http://otel:4318/v1/traces"},
    {NULL, "http://otel:4318/", NULL, "http://otel:4318/v1/traces"},
    {"http://tempo:4318/custom", "http://otel:4318", NULL, "http://tempo:4318/custom"},
    {NULL, NULL, "otlp", "http://localhost:4318/v1/traces"},
    {NULL, "http://otel:4318", "none", NULL},
  };
  for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
    if (urls[i].traces) setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", urls[i].traces, 1);
    if (urls[i].base) setenv("OTEL_EXPORTER_OTLP_ENDPOINT", urls[i].base, 1);
    if (urls[i].exporter) setenv("OTEL_TRACES_EXPORTER", urls[i].exporter, 1);
    obx_trace_opts_t opts;
    bool export;
    obx_err_t err = OBX_ERR_INIT;
    assert_true(obx_trace_opts_from_env(&opts, &export, &err));
    unsetenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT");
    unsetenv("OTEL_TRACES_EXPORTER");
    assert_int_equal(export, urls[i].want != NULL);
    if (urls[i].want) assert_string_equal(opts.endpoint, urls[i].want);
  }
}

typedef struct {
  obx_test_httpd_t *httpd;
  int want;
} wait_ctx_t;

static bool have_requests(void *p) {
  wait_ctx_t *w = p;
  return obx_test_httpd_nrequests(w->httpd) >= w->want;
}

static bool queue_empty(void *p) {
  obx_trace_stats_t st;
  obx_trace_stats(&st);
  return st.queued == 0;
}

static obx_trace_opts_t opts_for(const char *url, int delay_ms, int queue, int batch) {
  obx_trace_opts_t o = {.endpoint = url, .service_name = "unit", .headers = "x-tenant=acme,authorization=Bearer%20t",
                        .timeout_ms = 3000, .schedule_delay_ms = delay_ms, .max_queue = queue, .max_batch = batch};
  o.sampler.kind = OBX_SAMPLER_PARENT_ALWAYS_ON;
  return o;
}

/* Spans reach the collector in batches with the configured headers. */
static void test_exporter_batches(void **state) {
  obx_test_httpd_t *httpd = obx_test_httpd_start();
  assert_non_null(httpd);
  obx_test_httpd_route_t r = {.path = "/v1/traces", .status = 200, .body = "{}"};
  obx_test_httpd_route(httpd, &r);
  obx_trace_opts_t o = opts_for(obx_test_httpd_url(httpd, "/v1/traces"), 50, 100, 3);
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_trace_start(&o, &err));
  obx_trace_stats_t before, after;
  obx_trace_stats(&before);
  for (int i = 0; i < 7; i++) obx_span_end(obx_span_start("batched", OBX_SPAN_INTERNAL, NULL));
  wait_ctx_t w = {httpd, 3}; /* 3 + 3 + 1 */
  assert_true(obx_test_wait_for(have_requests, &w, 10000, 10));
  obx_trace_stop();
  obx_trace_stats(&after);
  assert_int_equal(after.exported - before.exported, 7);
  obx_test_httpd_request_t req;
  assert_true(obx_test_httpd_request(httpd, 0, &req));
  assert_string_equal(req.method, "POST");
  assert_string_equal(obx_test_httpd_request_header(&req, "content-type"), "application/json");
  assert_string_equal(obx_test_httpd_request_header(&req, "x-tenant"), "acme");
  assert_string_equal(obx_test_httpd_request_header(&req, "authorization"), "Bearer t");
  assert_non_null(strstr(req.body, "\"name\":\"batched\""));
  obx_test_httpd_request_cleanup(&req);
  obx_test_httpd_stop(httpd);
}

/* A collector that is away (connection refused) or answers 5xx: spans are dropped and counted,
 * ending a span stays immediate. */
static void test_exporter_collector_away(void **state) {
  obx_test_httpd_t *httpd = obx_test_httpd_start();
  obx_test_httpd_route_t r = {.path = "/v1/traces", .status = 503};
  obx_test_httpd_route(httpd, &r);
  static const char *paths[] = {"/v1/traces", NULL};
  for (int round = 0; round < 2; round++) {
    char url[128];
    if (paths[round])
      snprintf(url, sizeof url, "%s", obx_test_httpd_url(httpd, paths[round]));
    else
      snprintf(url, sizeof url, "http://127.0.0.1:1/v1/traces"); /* nothing listens on port 1 */
    obx_trace_opts_t o = opts_for(url, 20, 100, 10);
    obx_err_t err = OBX_ERR_INIT;
    assert_true(obx_trace_start(&o, &err));
    obx_trace_stats_t before, after;
    obx_trace_stats(&before);
    int64_t t0 = obx_test_now_ms();
    for (int i = 0; i < 5; i++) obx_span_end(obx_span_start("lost", OBX_SPAN_INTERNAL, NULL));
    int64_t spent = obx_test_now_ms() - t0;
    assert_true(obx_test_wait_for(queue_empty, NULL, 10000, 10));
    obx_trace_stop();
    obx_trace_stats(&after);
    if (after.dropped_export_failed - before.dropped_export_failed != 5)
      fail_msg("round %d: dropped %llu, want 5", round,
               (unsigned long long)(after.dropped_export_failed - before.dropped_export_failed));
    assert_int_equal(after.exported - before.exported, 0);
    if (spent > 500) fail_msg("ending 5 spans took %lld ms", (long long)spent);
  }
  obx_test_httpd_stop(httpd);
}

/* While the collector is away, batches are dropped unencoded between probes (one a second):
 * six failed batches make far fewer than six requests. */
static void test_exporter_probes_while_away(void **state) {
  obx_test_httpd_t *httpd = obx_test_httpd_start();
  obx_test_httpd_route_t r = {.path = "/v1/traces", .status = 503};
  obx_test_httpd_route(httpd, &r);
  obx_trace_opts_t o = opts_for(obx_test_httpd_url(httpd, "/v1/traces"), 10, 100, 1);
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_trace_start(&o, &err));
  obx_trace_stats_t before, after;
  obx_trace_stats(&before);
  obx_span_end(obx_span_start("first", OBX_SPAN_INTERNAL, NULL));
  wait_ctx_t w = {httpd, 1};
  assert_true(obx_test_wait_for(have_requests, &w, 10000, 5));
  for (int i = 0; i < 5; i++) obx_span_end(obx_span_start("more", OBX_SPAN_INTERNAL, NULL));
  assert_true(obx_test_wait_for(queue_empty, NULL, 10000, 5));
  obx_trace_stop();
  obx_trace_stats(&after);
  assert_int_equal(after.dropped_export_failed - before.dropped_export_failed, 6);
  int requests = obx_test_httpd_nrequests(httpd);
  if (requests > 3) fail_msg("6 batches while away: %d requests, want at most 3 (probes)", requests);
  obx_test_httpd_stop(httpd);
}

/* A full queue drops new spans (counted) instead of waiting. */
static void test_exporter_queue_full(void **state) {
  obx_test_httpd_t *httpd = obx_test_httpd_start();
  obx_test_httpd_route_t r = {.path = "/v1/traces", .status = 200, .delay_ms = 1500}; /* a slow collector */
  obx_test_httpd_route(httpd, &r);
  obx_trace_opts_t o = opts_for(obx_test_httpd_url(httpd, "/v1/traces"), 10000, 4, 4);
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_trace_start(&o, &err));
  obx_trace_stats_t before, after;
  obx_trace_stats(&before);
  for (int i = 0; i < 4; i++) obx_span_end(obx_span_start("first", OBX_SPAN_INTERNAL, NULL));
  assert_true(obx_test_wait_for(queue_empty, NULL, 10000, 5)); /* the exporter took them: busy posting */
  int64_t t0 = obx_test_now_ms();
  for (int i = 0; i < 7; i++) obx_span_end(obx_span_start("second", OBX_SPAN_INTERNAL, NULL));
  int64_t spent = obx_test_now_ms() - t0;
  obx_trace_stats(&after);
  assert_int_equal(after.dropped_queue_full - before.dropped_queue_full, 3);
  assert_int_equal(after.queued, 4);
  if (spent > 500) fail_msg("ending 7 spans took %lld ms", (long long)spent);
  obx_trace_stop(); /* sends the 4 queued ones */
  obx_trace_stats(&after);
  assert_int_equal(after.exported - before.exported, 8);
  obx_test_httpd_stop(httpd);
}

/* Log lines carry the thread's current context. */
static void test_log_fields(void **state) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  obx_log_set_stream(f);
  obx_trace_ctx_t ctx;
  assert_true(obx_trace_parse(TP_OK, strlen(TP_OK), NULL, 0, &ctx));
  obx_trace_set_current(&ctx);
  obx_info("inside");
  assert_non_null(obx_trace_current());
  obx_trace_set_current(NULL);
  obx_info("outside");
  obx_log_set_stream(NULL);
  fclose(f);
  char *second = strchr(buf, '\n') + 1;
  assert_non_null(strstr(buf, "\"traceId\":\"4bf92f3577b34da6a3ce929d0e0e4736\",\"spanId\":\"00f067aa0ba902b7\""));
  assert_true(strstr(buf, "traceId") < second);
  assert_null(strstr(second, "traceId"));
  assert_null(obx_trace_current());
  free(buf);
}

/* The event envelope carries the context through the outbox document and the Kafka headers;
 * an invalid one is dropped, never an error (third-party writers may leave it out). */
static void test_event_trace_fields(void **state) {
  static const struct {
    const char *tp, *ts, *want_tp, *want_ts;
  } cases[] = {
    {TP_OK, "rojo=1", TP_OK, "rojo=1"},
    {TP_OK, NULL, TP_OK, NULL},
    {TP_OK, "Bad", TP_OK, NULL},
    {"00-xyz", "rojo=1", NULL, NULL},
    {NULL, "rojo=1", NULL, NULL},
    {NULL, NULL, NULL, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_event_t ev, back, from_kafka;
    obx_event_init(&ev);
    obx_event_init(&back);
    obx_event_init(&from_kafka);
    ev.event_type = strdup("OrderConfirmed");
    ev.org_id = strdup("o");
    ev.aggregate_type = strdup("Order");
    ev.aggregate_id = strdup("a1");
    ev.source = strdup("/t");
    if (cases[i].tp) ev.traceparent = strdup(cases[i].tp);
    if (cases[i].ts) ev.tracestate = strdup(cases[i].ts);
    obx_err_t err = OBX_ERR_INIT;
    assert_true(obx_event_finalize(&ev, &err));
    bson_t doc = BSON_INITIALIZER;
    assert_true(obx_event_to_outbox(&ev, &doc, &err));
    assert_true(obx_event_from_outbox(&back, &doc, &err));
    obx_kafka_record_t rec;
    assert_true(obx_event_to_kafka(&back, NULL, &rec, &err));
    assert_true(obx_event_from_kafka(&from_kafka, rec.key, rec.key_len, rec.value, rec.value_len, rec.headers,
                                     rec.nheaders, &err));
    const obx_event_t *got[] = {&ev, &back, &from_kafka};
    for (int g = 0; g < 3; g++) {
      if ((got[g]->traceparent == NULL) != (cases[i].want_tp == NULL) ||
          (cases[i].want_tp && strcmp(got[g]->traceparent, cases[i].want_tp) != 0))
        fail_msg("case %zu form %d: traceparent %s, want %s", i, g, got[g]->traceparent, cases[i].want_tp);
      if ((got[g]->tracestate == NULL) != (cases[i].want_ts == NULL) ||
          (cases[i].want_ts && strcmp(got[g]->tracestate, cases[i].want_ts) != 0))
        fail_msg("case %zu form %d: tracestate %s, want %s", i, g, got[g]->tracestate, cases[i].want_ts);
    }
    bool header = false;
    for (int h = 0; h < rec.nheaders; h++) header |= strcmp(rec.headers[h].name, "ce_traceparent") == 0;
    assert_int_equal(header, cases[i].want_tp != NULL);
    obx_kafka_record_cleanup(&rec);
    bson_destroy(&doc);
    obx_event_cleanup(&from_kafka);
    obx_event_cleanup(&back);
    obx_event_cleanup(&ev);
  }
  /* a third-party outbox document with a traceparent of the wrong type still relays */
  bson_t *doc = BCON_NEW("_id", "0190f5c2-0000-7000-8000-000000000001", "eventType", "X", "orgId", "o",
                         "aggregateType", "A", "aggregateId", "1", "payload", "{", "}", "occurredAt", BCON_DATE_TIME(1),
                         "traceparent", BCON_INT32(7));
  obx_event_t ev;
  obx_event_init(&ev);
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_event_from_outbox(&ev, doc, &err));
  assert_null(ev.traceparent);
  obx_event_cleanup(&ev);
  bson_destroy(doc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_traceparent_table),
    cmocka_unit_test(test_tracestate_table),
    cmocka_unit_test(test_sampler_table),
    cmocka_unit_test(test_span_ids_and_parent),
    cmocka_unit_test(test_otlp_json),
    cmocka_unit_test(test_env_options),
    cmocka_unit_test(test_exporter_batches),
    cmocka_unit_test(test_exporter_collector_away),
    cmocka_unit_test(test_exporter_probes_while_away),
    cmocka_unit_test(test_exporter_queue_full),
    cmocka_unit_test(test_log_fields),
    cmocka_unit_test(test_event_trace_fields),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
