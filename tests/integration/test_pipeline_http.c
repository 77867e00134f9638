/* test_pipeline_http.c - http-request nodes against the scripted local HTTP server
 *
 * Each case runs a start -> call pipeline whose call hits one scripted path of the stub on
 * 127.0.0.1 and checks the run status, the failure class and the step recorded. The stub is
 * on loopback, so the egress policy allows 127.0.0.0/8 explicitly; one case proves that
 * without that allowance the same URL is refused before any request reaches the server. Two
 * cases drive resumable runs (obx_pipeline_start / obx_pipeline_resume) through a multi handle. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_httpd.h"
#include "obx/obx_pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TIMEOUT_MS 1500
#define MAX_BYTES 4096

static obx_test_httpd_t *httpd;

static int setup(void **state) {
  httpd = obx_test_httpd_start();
  return httpd ? 0 : -1;
}

static int teardown(void **state) {
  obx_test_httpd_stop(httpd);
  return 0;
}

static obx_pipeline_t *call_pipeline(const char *url, const char *on_error) {
  char json[2048];
  snprintf(json, sizeof json,
           "{\"trigger\": \"order.post\", \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"call\", \"type\": \"http-request\", \"onError\": \"%s\", \"config\": {"
           "  \"method\": \"POST\", \"url\": \"%s\","
           "  \"headers\": {\"X-Order\": \"{{orderNumber}}\", \"X-Trace\": \"corr-{{event.correlationId}}\"},"
           "  \"body\": {\"number\": \"{{orderNumber}}\", \"total\": \"{{order.totalAmount}}\", \"items\": \"{{order.items}}\"}}},"
           "{\"id\": \"ok\", \"type\": \"log\", \"config\": {\"message\": \"sent {{orderNumber}}: {{steps.call.output.body.id}}\"}},"
           "{\"id\": \"failed\", \"type\": \"log\", \"config\": {\"message\": \"call failed\"}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"call\"},"
           "{\"from\": \"call\", \"to\": \"ok\", \"branch\": \"success\"},"
           "{\"from\": \"call\", \"to\": \"failed\", \"branch\": \"failure\"}]}",
           on_error, url);
  obx_pipeline_t *pipeline = NULL;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("pipeline: %s", err.msg);
  return pipeline;
}

/* A pipeline of start -> one http-request node "c" whose config members are `config`. */
static obx_pipeline_t *one_call_pipeline(const char *config) {
  char json[1024];
  snprintf(json, sizeof json,
           "{\"nodes\": [{\"id\": \"start\", \"type\": \"start\"}, {\"id\": \"c\", \"type\": \"http-request\","
           " \"config\": {%s}}], \"edges\": [{\"from\": \"start\", \"to\": \"c\"}]}",
           config);
  obx_pipeline_t *pipeline = NULL;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("pipeline {%s}: %s", config, err.msg);
  return pipeline;
}

/* Runs the one-call pipeline of config on `in` through egress, which must succeed, and copies the
 * request it sent into *req (obx_test_httpd_request_cleanup). */
static void run_one_call(const char *config, const obx_pipeline_input_t *in, obx_egress_t *egress,
                         obx_test_httpd_request_t *req) {
  obx_pipeline_t *pipeline = one_call_pipeline(config);
  int before = obx_test_httpd_nrequests(httpd);
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, in, egress);
  assert_int_equal(obx_pipeline_run_status(run), OBX_PIPELINE_SUCCEEDED);
  assert_true(obx_test_httpd_request(httpd, before, req));
  obx_pipeline_run_destroy(run);
  obx_pipeline_destroy(pipeline);
}

static bson_t *order_context(void) {
  bson_error_t berr;
  bson_t *ctx = bson_new_from_json(
    (const uint8_t *)"{\"orderNumber\": \"A-1\", \"event\": {\"id\": \"ev-1\", \"correlationId\": \"c-9\"},"
                     "\"order\": {\"totalAmount\": {\"$numberDecimal\": \"12.50\"}, \"items\": [{\"sku\": \"X\", \"qty\": 2}]}}",
    -1, &berr);
  assert_non_null(ctx);
  return ctx;
}

/* For a table of run_one_call cases: scripts path to answer {}, opens egress (loopback allowed)
 * and returns the order context they run on. */
static bson_t *one_call_cases(const char *path, obx_egress_t *egress) {
  obx_test_httpd_route_t route = {.path = path, .body = "{}"};
  obx_test_httpd_route(httpd, &route);
  assert_true(obx_egress_init(egress, "", "127.0.0.0/8", 1000, TIMEOUT_MS, MAX_BYTES, NULL));
  return order_context();
}

static obx_pipeline_run_t *run_against(const char *path, const char *nets, const char *on_error) {
  obx_egress_t egress;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_egress_init(&egress, "", nets, 1000, TIMEOUT_MS, MAX_BYTES, &err)) fail_msg("%s", err.msg);
  egress.allow_public = true; /* every host passes the URL check: the address check is what these tests see */
  obx_pipeline_t *pipeline = call_pipeline(obx_test_httpd_url(httpd, path), on_error);
  bson_t *ctx = order_context();
  obx_pipeline_input_t in = {.context = ctx, .org_id = "org-1", .event_id = "ev-1", .correlation_id = "c-9",
                             .aggregate_type = "Order", .aggregate_id = "o-1", .attempt = 1};
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, &egress);
  bson_destroy(ctx);
  obx_pipeline_destroy(pipeline);
  obx_egress_cleanup(&egress);
  return run;
}

static void test_success(void **state) {
  obx_test_httpd_route_t route = {.path = "/ok", .status = 201, .body = "{\"id\": \"erp-77\", \"accepted\": true}"};
  obx_test_httpd_route(httpd, &route);
  int before = obx_test_httpd_nrequests(httpd);
  obx_pipeline_run_t *run = run_against("/ok", "127.0.0.0/8", "abort");
  const bson_t *exec = obx_pipeline_run_execution(run);
  if (obx_pipeline_run_status(run) != OBX_PIPELINE_SUCCEEDED) fail_msg("got %s: %s", obx_test_doc_str(exec, "status"), obx_test_doc_str(exec, "error"));
  assert_int_equal(obx_test_doc_int(exec, "steps.1.output.status"), 201);
  assert_string_equal(obx_test_doc_str(exec, "steps.1.output.body.id"), "erp-77");
  assert_string_equal(obx_test_doc_str(exec, "steps.2.nodeId"), "ok");
  assert_string_equal(obx_test_doc_str(exec, "steps.2.output.message"), "sent A-1: erp-77");
  assert_true(obx_test_doc_int(exec, "steps.1.durationMs") >= 0);

  /* what the server received: templated headers and a JSON body with the types kept */
  obx_test_httpd_request_t req;
  assert_int_equal(obx_test_httpd_nrequests(httpd), before + 1);
  assert_true(obx_test_httpd_request(httpd, before, &req));
  assert_string_equal(req.method, "POST");
  assert_string_equal(req.path, "/ok");
  assert_string_equal(obx_test_httpd_request_header(&req, "x-order"), "A-1");
  assert_string_equal(obx_test_httpd_request_header(&req, "x-trace"), "corr-c-9");
  assert_string_equal(obx_test_httpd_request_header(&req, "content-type"), "application/json");
  assert_string_equal(req.body, "{\"number\":\"A-1\",\"total\":12.50,\"items\":[{\"sku\":\"X\",\"qty\":2}]}");
  obx_test_httpd_request_cleanup(&req);
  obx_pipeline_run_destroy(run);
}

static void test_failure_table(void **state) {
  static const struct {
    const char *name;
    obx_test_httpd_route_t route;
    obx_failure_class_t want_class;
    const char *want_error;
  } cases[] = {
    {"500", {.path = "/e500", .status = 500, .body = "{}"}, OBX_FAILURE_TRANSIENT, "HTTP 500 from"},
    {"503", {.path = "/e503", .status = 503}, OBX_FAILURE_TRANSIENT, "HTTP 503"},
    {"429", {.path = "/e429", .status = 429}, OBX_FAILURE_TRANSIENT, "HTTP 429"},
    {"404", {.path = "/e404", .status = 404}, OBX_FAILURE_TERMINAL, "HTTP 404"},
    {"400", {.path = "/e400", .status = 400}, OBX_FAILURE_TERMINAL, "HTTP 400"},
    {"timeout", {.path = "/slow-answer", .delay_ms = 30000}, OBX_FAILURE_TRANSIENT, "Timeout was reached"},
    {"slow body", {.path = "/slow-body", .body = "{\"a\":1}", .body_bytes = 4000, .chunk_delay_ms = 200, .chunk_bytes = 16},
     OBX_FAILURE_TRANSIENT, "Timeout was reached"},
    {"redirect", {.path = "/moved", .status = 302, .location = "/ok-elsewhere"}, OBX_FAILURE_TERMINAL,
     "HTTP 302 redirect to http://127.0.0.1"},
    {"oversized", {.path = "/big", .body = "0123456789", .body_bytes = 100000}, OBX_FAILURE_TERMINAL,
     "response larger than 4096 bytes"},
    {"oversized chunked", {.path = "/big-chunked", .body = "0123456789", .body_bytes = 100000, .chunked = true},
     OBX_FAILURE_TERMINAL, "response larger than 4096 bytes"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_httpd_route(httpd, &cases[i].route);
    int64_t t0 = obx_test_now_ms();
    obx_pipeline_run_t *run = run_against(cases[i].route.path, "127.0.0.0/8", "abort");
    int64_t elapsed = obx_test_now_ms() - t0;
    const bson_t *exec = obx_pipeline_run_execution(run);
    const char *error = obx_test_doc_str(exec, "steps.1.error");
    if (obx_pipeline_run_status(run) != OBX_PIPELINE_FAILED) fail_msg("%s: got %s, want FAILED", cases[i].name, obx_test_doc_str(exec, "status"));
    if (obx_pipeline_run_failure_class(run) != cases[i].want_class)
      fail_msg("%s: got class %s, want %s (%s)", cases[i].name, obx_failure_class_name(obx_pipeline_run_failure_class(run)),
               obx_failure_class_name(cases[i].want_class), error);
    if (!error || !strstr(error, cases[i].want_error)) fail_msg("%s: got error \"%s\", want \"%s\"", cases[i].name, error, cases[i].want_error);
    assert_string_equal(obx_test_doc_str(exec, "failureClass"), obx_failure_class_name(cases[i].want_class));
    assert_string_equal(obx_test_doc_str(exec, "steps.1.failureClass"), obx_failure_class_name(cases[i].want_class));
    assert_null(obx_test_doc_str(exec, "steps.2.nodeId")); /* abort: nothing after the failed step */
    /* timeouts are bounded by the total timeout, not by the server's delay */
    if (elapsed > TIMEOUT_MS + 8000) fail_msg("%s: took %lld ms, want about %d", cases[i].name, (long long)elapsed, TIMEOUT_MS);
    obx_pipeline_run_destroy(run);
  }
}

/* Each method reaches the server as configured, with or without a body. */
static void test_methods(void **state) {
  static const struct {
    const char *config; /* inside "config": {...} */
    const char *want_method, *want_body;
  } cases[] = {
    {"\"url\": \"%s\"", "GET", ""},
    {"\"url\": \"%s\", \"body\": {\"a\": 1}", "POST", "{\"a\":1}"},
    {"\"url\": \"%s\", \"method\": \"PUT\", \"body\": [1, \"{{orderNumber}}\"]", "PUT", "[1,\"A-1\"]"},
    {"\"url\": \"%s\", \"method\": \"PATCH\", \"body\": \"{{orderNumber}}\"", "PATCH", "\"A-1\""},
    {"\"url\": \"%s\", \"method\": \"DELETE\"", "DELETE", ""},
    {"\"url\": \"%s\", \"method\": \"GET\", \"body\": {\"q\": 1}", "GET", "{\"q\":1}"},
    {"\"url\": \"%s\", \"method\": \"POST\"", "POST", ""},
  };
  obx_egress_t egress;
  bson_t *ctx = one_call_cases("/m", &egress);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char config[512];
    snprintf(config, sizeof config, cases[i].config, obx_test_httpd_url(httpd, "/m"));
    obx_pipeline_input_t in = {.context = ctx, .org_id = "o"};
    obx_test_httpd_request_t req;
    run_one_call(config, &in, &egress, &req);
    if (strcmp(req.method, cases[i].want_method) != 0 || strcmp(req.body, cases[i].want_body) != 0)
      fail_msg("case %zu: got %s %s, want %s %s", i, req.method, req.body, cases[i].want_method, cases[i].want_body);
    obx_test_httpd_request_cleanup(&req);
  }
  bson_destroy(ctx);
  obx_egress_cleanup(&egress);
}

/* Every call of an event run carries <eventId>:<nodeId> (plus :<replayId> for an operator's
 * replay) in Idempotency-Key, under the node's own header name if it gives one, never with
 * idempotencyHeader false or without an event (order.pre); a header the node sets itself wins. */
static void test_idempotency_key(void **state) {
  static const struct {
    const char *extra;      /* config members after url */
    const char *event_id, *replay_id;
    const char *header;     /* lower-case name looked for */
    const char *want;       /* NULL: absent */
  } cases[] = {
    {"", "ev-1", NULL, "idempotency-key", "ev-1:c"},
    {"", "ev-1", "rp-9", "idempotency-key", "ev-1:c:rp-9"},
    {", \"idempotencyHeader\": \"X-Request-Id\"", "ev-2", NULL, "x-request-id", "ev-2:c"},
    {", \"idempotencyHeader\": \"X-Request-Id\"", "ev-2", NULL, "idempotency-key", NULL},
    {", \"idempotencyHeader\": false", "ev-3", NULL, "idempotency-key", NULL},
    {", \"headers\": {\"idempotency-key\": \"mine-{{orderNumber}}\"}", "ev-4", NULL, "idempotency-key", "mine-A-1"},
    {"", NULL, NULL, "idempotency-key", NULL},
  };
  obx_egress_t egress;
  bson_t *ctx = one_call_cases("/idem", &egress);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char config[512];
    snprintf(config, sizeof config, "\"url\": \"%s\"%s", obx_test_httpd_url(httpd, "/idem"), cases[i].extra);
    obx_pipeline_input_t in = {.context = ctx, .org_id = "o", .event_id = cases[i].event_id,
                               .replay_id = cases[i].replay_id};
    obx_test_httpd_request_t req;
    run_one_call(config, &in, &egress, &req);
    const char *got = obx_test_httpd_request_header(&req, cases[i].header);
    if (cases[i].want ? !got || strcmp(got, cases[i].want) != 0 : got != NULL)
      fail_msg("case %zu: %s: got %s, want %s", i, cases[i].header, got ? got : "(none)",
               cases[i].want ? cases[i].want : "(none)");
    obx_test_httpd_request_cleanup(&req);
  }
  /* a header name that is not one is refused when the pipeline is saved */
  obx_pipeline_t *pipeline = NULL;
  obx_err_t err = OBX_ERR_INIT;
  assert_false(obx_pipeline_parse_json(
    "{\"nodes\": [{\"id\": \"start\", \"type\": \"start\"}, {\"id\": \"c\", \"type\": \"http-request\","
    " \"config\": {\"url\": \"http://127.0.0.1/x\", \"idempotencyHeader\": \"bad name\"}}],"
    " \"edges\": [{\"from\": \"start\", \"to\": \"c\"}]}", &pipeline, &err));
  assert_non_null(strstr(err.msg, "config.idempotencyHeader"));
  bson_destroy(ctx);
  obx_egress_cleanup(&egress);
}

/* timeoutMs shortens the policy's total timeout, never lengthens it. */
static void test_node_timeout(void **state) {
  static const struct {
    int node_timeout_ms;
    int64_t max_elapsed_ms, min_elapsed_ms;
  } cases[] = {
    {200, TIMEOUT_MS - 100, 150},            /* shorter: wins */
    {60000, TIMEOUT_MS + 8000, TIMEOUT_MS - 100}, /* longer: the policy's TIMEOUT_MS still applies */
  };
  obx_test_httpd_route_t route = {.path = "/stall", .delay_ms = 30000};
  obx_test_httpd_route(httpd, &route);
  obx_egress_t egress;
  assert_true(obx_egress_init(&egress, "", "127.0.0.0/8", 1000, TIMEOUT_MS, MAX_BYTES, NULL));
  bson_t ctx = BSON_INITIALIZER;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char config[512];
    snprintf(config, sizeof config, "\"url\": \"%s\", \"timeoutMs\": %d", obx_test_httpd_url(httpd, "/stall"),
             cases[i].node_timeout_ms);
    obx_pipeline_t *pipeline = one_call_pipeline(config);
    obx_pipeline_input_t in = {.context = &ctx, .org_id = "o"};
    int64_t t0 = obx_test_now_ms();
    obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, &egress);
    int64_t elapsed = obx_test_now_ms() - t0;
    assert_int_equal(obx_pipeline_run_failure_class(run), OBX_FAILURE_TRANSIENT);
    if (elapsed > cases[i].max_elapsed_ms || elapsed < cases[i].min_elapsed_ms)
      fail_msg("case %zu: timeoutMs %d gave up after %lld ms, want %lld..%lld", i, cases[i].node_timeout_ms,
               (long long)elapsed, (long long)cases[i].min_elapsed_ms, (long long)cases[i].max_elapsed_ms);
    obx_pipeline_run_destroy(run);
    obx_pipeline_destroy(pipeline);
  }
  obx_egress_cleanup(&egress);
}

/* A redirect is never followed: the target path receives no request. */
static void test_redirect_not_followed(void **state) {
  obx_test_httpd_route_t moved = {.path = "/to-private", .status = 307, .location = "http://169.254.169.254/latest/meta-data/"};
  obx_test_httpd_route(httpd, &moved);
  int before = obx_test_httpd_nrequests(httpd);
  obx_pipeline_run_t *run = run_against("/to-private", "127.0.0.0/8", "abort");
  assert_int_equal(obx_pipeline_run_failure_class(run), OBX_FAILURE_TERMINAL);
  assert_non_null(strstr(obx_pipeline_run_error(run)->msg, "redirect to http://169.254.169.254/latest/meta-data/ refused"));
  assert_int_equal(obx_test_httpd_nrequests(httpd), before + 1);
  obx_pipeline_run_destroy(run);
}

/* The same loopback URL without EGRESS_ALLOW_NETWORKS: refused, the server never called. */
static void test_loopback_refused_without_allowance(void **state) {
  obx_test_httpd_route_t route = {.path = "/ok", .status = 200, .body = "{}"};
  obx_test_httpd_route(httpd, &route);
  int before = obx_test_httpd_nrequests(httpd);
  obx_pipeline_run_t *run = run_against("/ok", "", "abort");
  assert_int_equal(obx_pipeline_run_status(run), OBX_PIPELINE_FAILED);
  assert_int_equal(obx_pipeline_run_failure_class(run), OBX_FAILURE_TERMINAL);
  const char *error = obx_test_doc_str(obx_pipeline_run_execution(run), "steps.1.error");
  if (!error || !strstr(error, "egress refused: 127.0.0.1 is loopback"))
    fail_msg("got \"%s\", want a loopback refusal", error ? error : "(null)");
  assert_int_equal(obx_test_httpd_nrequests(httpd), before);
  obx_pipeline_run_destroy(run);
}

/* onError continue: the failure branch runs and the run succeeds. */
static void test_continue_takes_failure_branch(void **state) {
  obx_test_httpd_route_t route = {.path = "/down", .status = 502};
  obx_test_httpd_route(httpd, &route);
  obx_pipeline_run_t *run = run_against("/down", "127.0.0.0/8", "continue");
  const bson_t *exec = obx_pipeline_run_execution(run);
  assert_int_equal(obx_pipeline_run_status(run), OBX_PIPELINE_SUCCEEDED);
  assert_string_equal(obx_test_doc_str(exec, "steps.1.status"), "FAILED");
  assert_string_equal(obx_test_doc_str(exec, "steps.1.failureClass"), "transient");
  assert_string_equal(obx_test_doc_str(exec, "steps.2.nodeId"), "failed");
  assert_null(obx_test_doc_str(exec, "steps.3.nodeId"));
  obx_pipeline_run_destroy(run);
}

/* The seed's order.post example, byte for byte (https://erp.exemplo.com/orders), against a
 * local HTTPS server: erp.exemplo.com:443 is pinned to the stub (as a DNS answer would be),
 * the stub's self-signed certificate is the egress CA bundle, loopback is allowed. */
static void test_seed_example_runs_unchanged(void **state) {
  char dir[300], cmd[2000], cert_path[400], key_path[400];
  snprintf(dir, sizeof dir, "%s/seed-tls", obx_test_tmpdir());
  snprintf(cert_path, sizeof cert_path, "%s/cert.pem", dir);
  snprintf(key_path, sizeof key_path, "%s/key.pem", dir);
  snprintf(cmd, sizeof cmd,
           "mkdir -p '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
           "-subj /CN=erp.exemplo.com -addext subjectAltName=DNS:erp.exemplo.com -keyout '%s' -out '%s' 2>/dev/null",
           dir, key_path, cert_path);
  obx_test_require(system(cmd) == 0, "the openssl CLI could not make a test certificate (apt-get install openssl)");
  char *cert = obx_test_read_file(cert_path), *key = obx_test_read_file(key_path);
  assert_non_null(cert);
  assert_non_null(key);
  obx_test_httpd_t *tls = obx_test_httpd_start_tls(cert, key);
  if (!tls) fail_msg("HTTPS stub did not start");
  obx_test_httpd_route_t route = {.path = "/orders", .body = "{\"erpId\": \"E-1\"}"};
  obx_test_httpd_route(tls, &route);

  char pin[128];
  obx_egress_t egress;
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_egress_init(&egress, "erp.exemplo.com", "127.0.0.0/8", 2000, 5000, MAX_BYTES, &err));
  snprintf(pin, sizeof pin, "erp.exemplo.com:443:127.0.0.1:%d", obx_test_httpd_port(tls));
  assert_true(obx_egress_add_connect_to(&egress, pin, &err));
  egress.ca_file = bson_strdup(cert_path);

  char fixture[400];
  snprintf(fixture, sizeof fixture, "%s/tests/fixtures/pipelines/seed-order-post.json", OBX_SOURCE_DIR);
  char *json = obx_test_read_file(fixture);
  obx_pipeline_t *pipeline = NULL;
  if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("seed: %s", err.msg);

  /* the OrderConfirmed fat event, as POST /orders writes it */
  obx_event_t ev;
  obx_event_init(&ev);
  ev.event_type = strdup("OrderConfirmed");
  ev.org_id = strdup("demo");
  ev.aggregate_type = strdup("Order");
  ev.aggregate_id = strdup("ord-1");
  BSON_APPEND_UTF8(&ev.payload, "orderId", "ord-1");
  BSON_APPEND_UTF8(&ev.payload, "orderNumber", "N-1001");
  BSON_APPEND_UTF8(&ev.payload, "totalAmount", "149.90");
  assert_true(obx_event_finalize(&ev, &err));
  bson_t ctx = BSON_INITIALIZER;
  obx_pipeline_context_from_event(&ev, &ctx);
  obx_pipeline_input_t in = {.context = &ctx, .org_id = "demo", .trigger = "order.post", .event_id = ev.id,
                             .aggregate_type = "Order", .aggregate_id = "ord-1", .attempt = 1};
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, &egress);
  const bson_t *exec = obx_pipeline_run_execution(run);
  if (obx_pipeline_run_status(run) != OBX_PIPELINE_SUCCEEDED) fail_msg("seed run: %s", obx_test_doc_str(exec, "error"));
  assert_string_equal(obx_test_doc_str(exec, "steps.1.output.body.erpId"), "E-1");
  assert_string_equal(obx_test_doc_str(exec, "steps.2.nodeId"), "ok");
  assert_string_equal(obx_test_doc_str(obx_pipeline_run_statuses(run), "0.name"), "Integrado ao ERP");
  assert_string_equal(obx_test_doc_str(obx_pipeline_run_statuses(run), "0.phase"), "order.post");

  obx_test_httpd_request_t req;
  assert_true(obx_test_httpd_request(tls, 0, &req));
  assert_string_equal(req.method, "POST");
  assert_string_equal(req.path, "/orders");
  assert_string_equal(obx_test_httpd_request_header(&req, "host"), "erp.exemplo.com");
  assert_string_equal(req.body, "{\"number\":\"N-1001\",\"total\":\"149.90\"}");
  obx_test_httpd_request_cleanup(&req);

  obx_pipeline_run_destroy(run);
  bson_destroy(&ctx);
  obx_event_cleanup(&ev);
  obx_pipeline_destroy(pipeline);
  free(json);
  obx_egress_cleanup(&egress);
  obx_test_httpd_stop(tls);
  free(key);
  free(cert);
}

/* Resumable runs (obx_pipeline_start / obx_pipeline_resume): two runs of a start -> a -> b
 * pipeline, each call 300 ms, driven by one multi handle here as the worker's IO thread drives
 * its calls. Each run stops at every call; the two runs' calls overlap (the stub's start and end
 * times), each run's own calls never do and come in node order; the execution documents are
 * those of obx_pipeline_execute (steps, outputs, the Idempotency-Key of each node). */
static void test_resumable_runs_overlap(void **state) {
  obx_test_httpd_route_t route = {.path = "/slow", .status = 200, .body = "{\"ok\": true}", .delay_ms = 300};
  obx_test_httpd_route(httpd, &route);
  char json[1024];
  snprintf(json, sizeof json,
           "{\"nodes\": [{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"a\", \"type\": \"http-request\", \"config\": {\"url\": \"%s\", \"body\": {\"n\": \"{{orderNumber}}\"}}},"
           "{\"id\": \"b\", \"type\": \"http-request\", \"config\": {\"url\": \"%s\", \"body\": {\"prev\": \"{{steps.a.output.status}}\"}}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"a\"}, {\"from\": \"a\", \"to\": \"b\"}]}",
           obx_test_httpd_url(httpd, "/slow"), obx_test_httpd_url(httpd, "/slow"));
  obx_pipeline_t *pipeline = NULL;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("pipeline: %s", err.msg);
  obx_egress_t egress;
  assert_true(obx_egress_init(&egress, "", "127.0.0.0/8", 1000, 5000, MAX_BYTES, NULL));
  egress.allow_public = true;
  int before = obx_test_httpd_nrequests(httpd);
  obx_pipeline_run_t *runs[2];
  const char *ids[2] = {"ev-r0", "ev-r1"};
  for (int i = 0; i < 2; i++) {
    bson_t *ctx = order_context();
    obx_pipeline_input_t in = {.context = ctx, .org_id = "org-1", .event_id = ids[i], .aggregate_type = "Order",
                               .aggregate_id = "o-1", .attempt = 1};
    runs[i] = obx_pipeline_start(pipeline, &in, &egress);
    bson_destroy(ctx); /* the run keeps its own copy of the input */
    assert_non_null(obx_pipeline_run_waiting(runs[i]));
  }
  assert_int_equal(obx_test_httpd_nrequests(httpd), before); /* nothing sent before it is performed */
  CURLM *multi = curl_multi_init();
  for (int i = 0; i < 2; i++) {
    curl_easy_setopt(obx_pipeline_run_waiting(runs[i]), CURLOPT_PRIVATE, (char *)runs[i]);
    curl_multi_add_handle(multi, obx_pipeline_run_waiting(runs[i]));
  }
  int waiting = 2, rounds = 0;
  while (waiting > 0 && rounds++ < 1000) {
    int running = 0, left = 0;
    curl_multi_perform(multi, &running);
    curl_multi_poll(multi, NULL, 0, 50, NULL);
    for (CURLMsg *m; (m = curl_multi_info_read(multi, &left));) {
      if (m->msg != CURLMSG_DONE) continue;
      CURL *easy = m->easy_handle;
      CURLcode rc = m->data.result;
      char *priv = NULL;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
      obx_pipeline_run_t *run = (obx_pipeline_run_t *)priv;
      curl_multi_remove_handle(multi, easy);
      obx_pipeline_resume(run, rc);
      CURL *next = obx_pipeline_run_waiting(run);
      if (!next) {
        waiting--;
        continue;
      }
      curl_easy_setopt(next, CURLOPT_PRIVATE, (char *)run);
      curl_multi_add_handle(multi, next);
    }
  }
  curl_multi_cleanup(multi);
  assert_int_equal(waiting, 0);
  for (int i = 0; i < 2; i++) {
    const bson_t *exec = obx_pipeline_run_execution(runs[i]);
    if (obx_pipeline_run_status(runs[i]) != OBX_PIPELINE_SUCCEEDED) fail_msg("run %d: %s", i, obx_test_doc_str(exec, "error"));
    assert_string_equal(obx_test_doc_str(exec, "steps.1.nodeId"), "a");
    assert_string_equal(obx_test_doc_str(exec, "steps.2.nodeId"), "b");
    assert_int_equal(obx_test_doc_int(exec, "steps.2.output.status"), 200);
    assert_true(obx_test_doc_int(exec, "steps.1.durationMs") >= 250); /* a step's duration includes its wait */
    assert_string_equal(obx_test_doc_str(exec, "eventId"), ids[i]);
  }
  assert_int_equal(obx_test_httpd_nrequests(httpd), before + 4);
  obx_test_httpd_request_t req[4];
  int64_t start[2][2], end[2][2]; /* [run][node] */
  for (int i = 0; i < 4; i++) {
    assert_true(obx_test_httpd_request(httpd, before + i, &req[i]));
    const char *key = obx_test_httpd_request_header(&req[i], "idempotency-key");
    assert_non_null(key);
    int r = strncmp(key, "ev-r1:", 6) == 0;
    int node = strcmp(strchr(key, ':') + 1, "b") == 0;
    if (node == 1) assert_string_equal(req[i].body, "{\"prev\":200}");
    start[r][node] = req[i].start_ms;
    end[r][node] = req[i].end_ms;
  }
  for (int r = 0; r < 2; r++) assert_true(end[r][0] <= start[r][1]); /* a run's calls in order, never at once */
  assert_true(start[0][0] < end[1][0] && start[1][0] < end[0][0]);   /* the two runs' calls at once */
  for (int i = 0; i < 4; i++) obx_test_httpd_request_cleanup(&req[i]);
  for (int i = 0; i < 2; i++) obx_pipeline_run_destroy(runs[i]);
  obx_pipeline_destroy(pipeline);
  obx_egress_cleanup(&egress);
}

/* A run destroyed while it waits: its call is never sent, its spans end (no leak under ASan). */
static void test_destroy_waiting_run(void **state) {
  obx_test_httpd_route_t route = {.path = "/never", .status = 200};
  obx_test_httpd_route(httpd, &route);
  int before = obx_test_httpd_nrequests(httpd);
  char config[256];
  snprintf(config, sizeof config, "\"url\": \"%s\"", obx_test_httpd_url(httpd, "/never"));
  obx_pipeline_t *pipeline = one_call_pipeline(config);
  obx_egress_t egress;
  assert_true(obx_egress_init(&egress, "", "127.0.0.0/8", 1000, 5000, MAX_BYTES, NULL));
  bson_t *ctx = order_context();
  obx_pipeline_input_t in = {.context = ctx, .org_id = "org-1", .event_id = "ev-d", .attempt = 1};
  obx_pipeline_run_t *run = obx_pipeline_start(pipeline, &in, &egress);
  assert_non_null(obx_pipeline_run_waiting(run));
  obx_pipeline_run_destroy(run);
  obx_pipeline_run_t *sent = obx_pipeline_execute(pipeline, &in, &egress); /* the same call, performed: it arrives */
  assert_int_equal(obx_pipeline_run_status(sent), OBX_PIPELINE_SUCCEEDED);
  obx_pipeline_run_destroy(sent);
  assert_int_equal(obx_test_httpd_nrequests(httpd), before + 1);
  bson_destroy(ctx);
  obx_pipeline_destroy(pipeline);
  obx_egress_cleanup(&egress);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_success),
    cmocka_unit_test(test_failure_table),
    cmocka_unit_test(test_methods),
    cmocka_unit_test(test_idempotency_key),
    cmocka_unit_test(test_node_timeout),
    cmocka_unit_test(test_redirect_not_followed),
    cmocka_unit_test(test_loopback_refused_without_allowance),
    cmocka_unit_test(test_continue_takes_failure_branch),
    cmocka_unit_test(test_seed_example_runs_unchanged),
    cmocka_unit_test(test_resumable_runs_overlap),
    cmocka_unit_test(test_destroy_waiting_run),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
