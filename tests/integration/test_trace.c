/* test_trace.c - one trace from POST /orders to the ERP call, through the real processes
 *
 * DESIGN: the worker fixture (devmongod, a topic on the run's Kafka broker, RabbitMQ names of its own, the scripted
 * ERP) plus a stub OTLP collector (tests/support/otlp.c); one real `outboxd` with every role
 * exports to it (OTEL_EXPORTER_OTLP_ENDPOINT, 100 ms batches). Orders come in with a known
 * traceparent; the test follows the parent links span by span: request -> MongoDB transaction
 * -> relay publish -> worker consume -> pipeline run -> step -> http-request client span, whose
 * id is the parent-id of the traceparent the ERP received. A retry through the ladder is a
 * child of the failed attempt; a redrive from the DLQ starts a new trace linked to it, an inbox
 * replay one linked to the publish; an event emitted by a pipeline stays in the trace. With the
 * collector away every event still arrives, and the dropped spans are counted on /metrics.
 * Log lines naming the event carry its traceId/spanId. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_trace.h"
#include "obx_test_doc.h"
#include "obx_test_otlp.h"
#include "worker_test.h"

typedef struct {
  wt_fx_t *fx;
  obx_test_otlp_t *otlp;
  obx_test_outboxd_t d;
  char key[128];
  char publish[160], process[160]; /* the Kafka spans' names: "publish <topic>", "process <topic>" */
} tt_fx_t;

/* Starts outboxd (every role) on the fixture, exporting to endpoint. */
static void start_outboxd(tt_fx_t *t, const char *endpoint) {
  char keys_path[512], keys_arg[600];
  snprintf(keys_path, sizeof keys_path, "%s/trace-keys-%d", obx_test_tmpdir(), (int)getpid());
  obx_test_apikey_add(keys_path, WT_ORG, "*", t->key);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  char bufs[WT_NCONF][320], *args[2 * WT_NCONF + 8];
  int n = wt_conf_args(t->fx, bufs, args);
  args[n++] = "-X";
  args[n++] = keys_arg;
  args[n++] = "-X";
  args[n++] = "log.level=debug";
  args[n] = NULL;
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint, 1);
  setenv("OTEL_BSP_SCHEDULE_DELAY", "100", 1);
  setenv("OTEL_SERVICE_NAME", "outboxd-under-test", 1);
  bool started = obx_test_outboxd_start(&t->d, args);
  unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT");
  unsetenv("OTEL_BSP_SCHEDULE_DELAY");
  unsetenv("OTEL_SERVICE_NAME");
  if (!started) fail_msg("outboxd did not start");
  if (!obx_test_file_contains(t->d.proc.log_path, "\"outboxd running\"", 30000) ||
      !obx_test_wait_for(obx_test_http_ready, &t->d.port, 30000, 50))
    fail_msg("outboxd did not get ready; log: %s", t->d.proc.log_path);
}

static int setup(void **state) {
  if (!getenv("AMQP_URL")) return 0;
  tt_fx_t *t = calloc(1, sizeof *t);
  t->fx = wt_setup(2, NULL);
  snprintf(t->publish, sizeof t->publish, "publish %s", t->fx->topic);
  snprintf(t->process, sizeof t->process, "process %s", t->fx->topic);
  t->otlp = obx_test_otlp_start();
  if (!t->otlp) fail_msg("the stub OTLP collector did not start");
  *state = t;
  return 0;
}

static int teardown(void **state) {
  tt_fx_t *t = *state;
  if (!t) return 0;
  obx_test_outboxd_stop(&t->d);
  obx_test_otlp_stop(t->otlp);
  wt_teardown(t->fx);
  free(t);
  return 0;
}

/* POST /orders with a traceparent (NULL: none); the event id into event_id. A 503 (the schema
 * not created yet) is tried again, as its Retry-After asks. */
static void post_order(tt_fx_t *t, const char *number, const char *traceparent, char event_id[OBX_UUID_LEN + 1]) {
  char body[256], h[128];
  snprintf(body, sizeof body, "{\"customerEmail\": \"c@example.com\", \"amount\": \"10.00\", \"orderNumber\": \"%s\"}",
           number);
  snprintf(h, sizeof h, "traceparent: %s", traceparent ? traceparent : "");
  const char *headers[] = {h, NULL};
  obx_test_http_resp_t resp;
  int64_t deadline = obx_test_now_ms() + 30000;
  for (;;) {
    obx_test_http(t->d.port, "POST", "/orders", t->key, body, traceparent ? headers : NULL, &resp);
    if (resp.status != 503 || obx_test_now_ms() > deadline) break;
    obx_test_http_resp_cleanup(&resp);
    usleep(100 * 1000);
  }
  if (resp.status != 201) fail_msg("POST /orders %s: got %ld, want 201: %s", number, resp.status, resp.body);
  bson_iter_t it;
  if (!bson_iter_init(&it, &resp.json) || !bson_iter_find_descendant(&it, "eventIds.0", &it) || !BSON_ITER_HOLDS_UTF8(&it))
    fail_msg("POST /orders: no eventIds in %s", resp.body);
  snprintf(event_id, OBX_UUID_LEN + 1, "%s", bson_iter_utf8(&it, NULL));
  obx_test_http_resp_cleanup(&resp);
}

/* Waits until the collector holds a span of trace (NULL: any) named name_prefix... with parent
 * (NULL: any); spans receives the snapshot it was found in (the caller cleans it up). */
static const obx_test_span_t *await_span(tt_fx_t *t, obx_test_spans_t *spans, const char *trace, const char *name,
                                         const char *parent) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  for (;;) {
    obx_test_otlp_spans(t->otlp, spans);
    const obx_test_span_t *s = obx_test_spans_find(spans, trace, name, parent);
    if (s) return s;
    if (obx_test_now_ms() > deadline) {
      for (int i = 0; i < spans->n; i++)
        print_message("  have: %s %s parent=%s '%s'\n", spans->v[i].trace_id, spans->v[i].span_id,
                      spans->v[i].parent_id, spans->v[i].name);
      fail_msg("no span '%s' of trace %s with parent %s (%d spans received)", name, trace ? trace : "*",
               parent ? parent : "*", spans->n);
    }
    obx_test_spans_cleanup(spans);
    usleep(50 * 1000);
  }
}

static void expect_attr(const obx_test_span_t *s, const char *key, const char *want) {
  const char *got = obx_test_span_attr(s, key);
  if (!got || strcmp(got, want) != 0) fail_msg("span '%s' %s: got %s, want %s", s->name, key, got ? got : "(none)", want);
}

/* The trace id and parent-id of the traceparent of the ERP's last call for order `number`. */
static void erp_traceparent(tt_fx_t *t, const char *number, char trace[33], char span[17]) {
  obx_test_httpd_request_t req;
  int i = wt_last_call_index(t->fx, number);
  if (!obx_test_httpd_request(t->fx->httpd, i, &req)) fail_msg("no ERP request for %s", number);
  const char *tp = obx_test_httpd_request_header(&req, "traceparent");
  obx_trace_ctx_t ctx;
  if (!tp || !obx_trace_parse(tp, strlen(tp), NULL, 0, &ctx)) fail_msg("ERP request %d: traceparent %s", i, tp ? tp : "(none)");
  obx_trace_ids_hex(&ctx, trace, span);
  obx_test_httpd_request_cleanup(&req);
}

/* await_span for the span id alone (copied to id). */
static void await_id(tt_fx_t *t, const char *trace, const char *name, const char *parent, char id[17]) {
  obx_test_spans_t spans;
  snprintf(id, 17, "%s", await_span(t, &spans, trace, name, parent)->span_id);
  obx_test_spans_cleanup(&spans);
}

/* The document of `collection` whose `field` is value, into doc (initialised here). */
static void find_doc(tt_fx_t *t, const char *collection, const char *field, const char *value, bson_t *doc) {
  mongoc_collection_t *c = mongoc_client_get_collection(t->fx->client, obx_mongo_db_name(t->fx->mongo), collection);
  bson_t *filter = BCON_NEW(field, value);
  bool found = false;
  obx_err_t err = OBX_ERR_INIT;
  bson_init(doc);
  if (!obx_mongo_find_one(c, filter, NULL, NULL, doc, &found, &err) || !found)
    fail_msg("%s %s=%s: not found (%s)", collection, field, value, err.msg);
  mongoc_collection_destroy(c);
  bson_destroy(filter);
}

/* Every line of outboxd's log that names event_id carries a traceId (and a spanId); returns how
 * many lines carry `trace` and, when span is set, how many of those carry that spanId. */
static int log_lines_with_trace(tt_fx_t *t, const char *event_id, const char *trace, const char *span, int *with_span) {
  FILE *f = fopen(t->d.proc.log_path, "r");
  if (!f) fail_msg("no log %s", t->d.proc.log_path);
  char needle_ev[80], needle_tr[64], needle_sp[48], *line = NULL;
  size_t cap = 0;
  snprintf(needle_ev, sizeof needle_ev, "\"eventId\":\"%s\"", event_id);
  snprintf(needle_tr, sizeof needle_tr, "\"traceId\":\"%s\"", trace);
  snprintf(needle_sp, sizeof needle_sp, "\"spanId\":\"%s\"", span ? span : "");
  int n = 0;
  *with_span = 0;
  while (getline(&line, &cap, f) > 0) {
    if (strstr(line, needle_ev) && (!strstr(line, "\"traceId\":\"") || !strstr(line, "\"spanId\":\"")))
      fail_msg("log line of event %s without traceId/spanId: %s", event_id, line);
    if (strstr(line, needle_tr)) {
      n++;
      if (span && strstr(line, needle_sp)) (*with_span)++;
    }
  }
  free(line);
  fclose(f);
  return n;
}

static void test_one_trace_end_to_end(void **state) {
  WT_NEED_BROKER();
  tt_fx_t *t = *state;
  start_outboxd(t, obx_test_otlp_endpoint(t->otlp));
  wt_route(t->fx, "TR-1", 200);
  const char *trace = "4bf92f3577b34da6a3ce929d0e0e4736", *caller = "00f067aa0ba902b7";
  char tp[64], id[OBX_UUID_LEN + 1];
  snprintf(tp, sizeof tp, "00-%s-%s-01", trace, caller);
  post_order(t, "TR-1", tp, id);
  wt_wait_calls(t->fx, "TR-1", 1);
  wt_wait_status(t->fx, id, "DONE");

  obx_test_spans_t spans;
  const obx_test_span_t *server = await_span(t, &spans, trace, "POST /orders", caller);
  assert_int_equal(server->kind, 2);
  expect_attr(server, "http.request.method", "POST");
  expect_attr(server, "http.route", "/orders");
  expect_attr(server, "http.response.status_code", "201");
  assert_string_equal(server->service, "outboxd-under-test");
  char server_id[17];
  snprintf(server_id, sizeof server_id, "%s", server->span_id);
  obx_test_spans_cleanup(&spans);

  /* each hop is the child of the one before, in one trace */
  const struct {
    const char *name;
    int kind;
    const char *attr, *value;
  } chain[] = {
    {"transaction ", 3, "db.system", "mongodb"},
    {t->publish, 4, "messaging.system", "kafka"},
    {t->process, 5, "messaging.system", "kafka"},
    {"pipeline order.post", 1, "outboxd.pipeline.status", "SUCCEEDED"},
    {"step notify", 1, "outboxd.step.type", "http-request"},
    {"POST", 3, "http.response.status_code", "200"},
  };
  char parent[17], ids[6][17];
  snprintf(parent, sizeof parent, "%s", server_id);
  for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++) {
    const obx_test_span_t *s = await_span(t, &spans, trace, chain[i].name, parent);
    if (s->kind != chain[i].kind) fail_msg("span '%s': kind %d, want %d", s->name, s->kind, chain[i].kind);
    expect_attr(s, chain[i].attr, chain[i].value);
    if (i == 2) expect_attr(s, "messaging.message.id", id);
    snprintf(ids[i], sizeof ids[i], "%s", s->span_id);
    snprintf(parent, sizeof parent, "%s", s->span_id);
    obx_test_spans_cleanup(&spans);
  }
  /* the step "start" ran under the same pipeline span */
  char start_id[17];
  await_id(t, trace, "step start", ids[3], start_id);

  /* the ERP got the client span as parent */
  char got_trace[33], got_span[17];
  erp_traceparent(t, "TR-1", got_trace, got_span);
  assert_string_equal(got_trace, trace);
  if (strcmp(got_span, ids[5]) != 0) fail_msg("ERP traceparent parent-id %s, want the http-request span %s", got_span, ids[5]);

  /* the outbox document, the inbox entry and the execution store the context */
  bson_t doc;
  find_doc(t, "outbox", "_id", id, &doc);
  char want_tp[64];
  snprintf(want_tp, sizeof want_tp, "00-%s-%s-01", trace, ids[0]);
  assert_string_equal(obx_mongo_doc_str(&doc, "traceparent"), want_tp);
  bson_destroy(&doc);
  bson_t entry;
  assert_true(wt_inbox(t->fx, id, &entry));
  snprintf(want_tp, sizeof want_tp, "00-%s-%s-01", trace, ids[2]);
  assert_string_equal(obx_mongo_doc_str(&entry, "traceparent"), want_tp);
  bson_destroy(&entry);
  find_doc(t, "pipeline_executions", "eventId", id, &doc);
  assert_string_equal(obx_mongo_doc_str(&doc, "traceId"), trace);
  assert_string_equal(obx_mongo_doc_str(&doc, "spanId"), ids[3]);
  bson_destroy(&doc);

  /* logs: the API's line (request span) and the worker's lines (its spans) carry the trace */
  int with_span;
  int n = log_lines_with_trace(t, id, trace, server_id, &with_span);
  if (n < 2 || with_span < 1) fail_msg("log lines with trace %s: got %d (%d with the request span), want >= 2 (>= 1)", trace, n, with_span);
}

/* A transient ERP failure retries through the ladder in the same trace (the retry's consumer
 * span is the failed attempt's child); a terminal one goes to the DLQ and its redrive is a new
 * trace linked to the attempt that failed. */
static void test_retry_and_redrive(void **state) {
  WT_NEED_BROKER();
  tt_fx_t *t = *state;
  start_outboxd(t, obx_test_otlp_endpoint(t->otlp));
  char work_span_name[128];
  snprintf(work_span_name, sizeof work_span_name, "process %s.work", t->fx->prefix);

  /* retry */
  const char *trace = "0af7651916cd43dd8448eb211c80319c";
  char tp[64], id[OBX_UUID_LEN + 1];
  snprintf(tp, sizeof tp, "00-%s-b7ad6b7169203331-01", trace);
  wt_route(t->fx, "TR-2", 503);
  post_order(t, "TR-2", tp, id);
  wt_wait_calls(t->fx, "TR-2", 1);
  wt_route(t->fx, "TR-2", 200);
  wt_wait_calls(t->fx, "TR-2", 2);
  wt_wait_status(t->fx, id, "DONE");
  obx_test_spans_t spans;
  const obx_test_span_t *first = await_span(t, &spans, trace, t->process, NULL);
  assert_int_equal(first->status, 2); /* the failed attempt */
  char first_id[17];
  snprintf(first_id, sizeof first_id, "%s", first->span_id);
  obx_test_spans_cleanup(&spans);
  const obx_test_span_t *retry = await_span(t, &spans, trace, work_span_name, first_id);
  expect_attr(retry, "messaging.system", "rabbitmq");
  expect_attr(retry, "outboxd.attempt", "2");
  char retry_id[17], run_id[17], step_id[17], call_id[17];
  snprintf(retry_id, sizeof retry_id, "%s", retry->span_id);
  obx_test_spans_cleanup(&spans);
  await_id(t, trace, "pipeline order.post", retry_id, run_id);
  await_id(t, trace, "step notify", run_id, step_id);
  await_id(t, trace, "POST", step_id, call_id);
  char got_trace[33], got_span[17];
  erp_traceparent(t, "TR-2", got_trace, got_span);
  assert_string_equal(got_trace, trace);
  assert_string_equal(call_id, got_span);
  /* the worker's "retry tier" line was written under the failed attempt's span */
  int with_span;
  log_lines_with_trace(t, id, trace, first_id, &with_span);
  if (with_span < 1) fail_msg("no log line of the failed attempt with spanId %s", first_id);

  /* redrive */
  const char *trace3 = "11111111111111111111111111111111";
  char id3[OBX_UUID_LEN + 1];
  snprintf(tp, sizeof tp, "00-%s-2222222222222222-01", trace3);
  wt_route(t->fx, "TR-3", 400);
  post_order(t, "TR-3", tp, id3);
  wt_wait_status(t->fx, id3, "DEAD");
  char dead_id[17];
  await_id(t, trace3, t->process, NULL, dead_id);
  wt_route(t->fx, "TR-3", 200);
  char body[160];
  snprintf(body, sizeof body, "/api/dlq?eventId=%s", id3);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS; /* the worker's drain stores the dead letter */
  obx_test_http_resp_t resp;
  for (;;) {
    obx_test_http_expect(t->d.port, "GET", body, t->key, NULL, 200, &resp);
    bool stored = obx_test_doc_int(&resp.json, "count") == 1;
    obx_test_http_resp_cleanup(&resp);
    if (stored) break;
    if (obx_test_now_ms() > deadline) fail_msg("the dead letter of %s never reached the store", id3);
    usleep(50 * 1000);
  }
  snprintf(body, sizeof body, "{\"all\": true, \"eventId\": \"%s\"}", id3);
  obx_test_http_expect(t->d.port, "POST", "/api/dlq/redrive", t->key, body, 200, &resp);
  obx_test_http_resp_cleanup(&resp);
  wt_wait_calls(t->fx, "TR-3", 2);
  wt_wait_status(t->fx, id3, "DONE");
  erp_traceparent(t, "TR-3", got_trace, got_span);
  if (strcmp(got_trace, trace3) == 0) fail_msg("the redrive continued the finished trace %s; want a new, linked one", trace3);
  const obx_test_span_t *redriven = await_span(t, &spans, got_trace, work_span_name, "");
  assert_int_equal(redriven->nlinks, 1);
  assert_string_equal(redriven->link_trace[0], trace3);
  if (strcmp(redriven->link_span[0], dead_id) != 0)
    fail_msg("redrive link: span %s, want the attempt that failed %s", redriven->link_span[0], dead_id);
  assert_string_equal(redriven->link_reason[0], "redrive");
  obx_test_spans_cleanup(&spans);
}

/* An event emitted by a pipeline (emit-event) is published and processed in the same trace, a
 * child of the step that emitted it; an inbox replay starts a new trace linked to the span the
 * stored event came with (the relay's publish). */
static void test_emitted_event_and_replay(void **state) {
  WT_NEED_BROKER();
  tt_fx_t *t = *state;
  /* org-wt's order.post (fixture) calls the ERP; org-emit's emits TraceEmitted, whose
   * event.TraceEmitted pipeline calls the ERP at /erp/<n>x */
  char json[1024];
  snprintf(json, sizeof json,
           "{\"name\": \"emit\", \"trigger\": \"order.post\", \"enabled\": true, \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"emit\", \"type\": \"emit-event\", \"config\": {\"eventType\": \"TraceEmitted\","
           "  \"payload\": {\"n\": \"{{orderNumber}}\"}}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"emit\"}]}");
  const char *emitted_pipeline =
    "{\"name\": \"emitted\", \"trigger\": \"event.TraceEmitted\", \"enabled\": true, \"nodes\": ["
    "{\"id\": \"start\", \"type\": \"start\"},"
    "{\"id\": \"call\", \"type\": \"http-request\", \"config\": {\"method\": \"POST\", \"url\": \"%s/{{payload.n}}x\","
    "  \"body\": {}}}], \"edges\": [{\"from\": \"start\", \"to\": \"call\"}]}";
  char json2[1024];
  snprintf(json2, sizeof json2, emitted_pipeline, obx_test_httpd_url(t->fx->httpd, "/erp"));
  const char *defs[] = {json, json2};
  for (int i = 0; i < 2; i++)
    obx_test_pipeline_create(t->fx->client, obx_mongo_db_name(t->fx->mongo), "org-emit", defs[i]);
  char keys_path[512], emit_key[128], fixture_key[128];
  snprintf(keys_path, sizeof keys_path, "%s/trace-keys-%d", obx_test_tmpdir(), (int)getpid());
  obx_test_apikey_add(keys_path, "org-emit", "*", emit_key); /* beside the fixture's key */
  start_outboxd(t, obx_test_otlp_endpoint(t->otlp));
  snprintf(fixture_key, sizeof fixture_key, "%s", t->key);

  /* emitted */
  const char *trace = "33333333333333333333333333333333";
  char tp[64], id[OBX_UUID_LEN + 1];
  snprintf(tp, sizeof tp, "00-%s-4444444444444444-01", trace);
  wt_route(t->fx, "EM-1x", 200);
  snprintf(t->key, sizeof t->key, "%s", emit_key);
  post_order(t, "EM-1", tp, id);
  wt_wait_calls(t->fx, "EM-1x", 1);
  char emit_step[17], publish[17], consume[17], got_trace[33], got_span[17];
  await_id(t, trace, "step emit", NULL, emit_step);
  await_id(t, trace, t->publish, emit_step, publish);
  obx_test_spans_t spans;
  const obx_test_span_t *c = await_span(t, &spans, trace, t->process, publish);
  expect_attr(c, "outboxd.event.type", "TraceEmitted");
  snprintf(consume, sizeof consume, "%s", c->span_id);
  obx_test_spans_cleanup(&spans);
  await_id(t, trace, "pipeline event.TraceEmitted", consume, got_span);
  erp_traceparent(t, "EM-1x", got_trace, got_span);
  assert_string_equal(got_trace, trace);

  /* replay of a finished event of the fixture's org */
  snprintf(t->key, sizeof t->key, "%s", fixture_key);
  const char *trace2 = "55555555555555555555555555555555";
  char id2[OBX_UUID_LEN + 1], publish2[17];
  snprintf(tp, sizeof tp, "00-%s-6666666666666666-01", trace2);
  wt_route(t->fx, "RP-1", 200);
  post_order(t, "RP-1", tp, id2);
  wt_wait_calls(t->fx, "RP-1", 1);
  wt_wait_status(t->fx, id2, "DONE");
  await_id(t, trace2, t->publish, NULL, publish2);
  char path[128];
  snprintf(path, sizeof path, "/api/inbox/%s/replay", id2);
  obx_test_http_resp_t resp;
  obx_test_http_expect(t->d.port, "POST", path, t->key, NULL, 202, &resp);
  obx_test_http_resp_cleanup(&resp);
  wt_wait_calls(t->fx, "RP-1", 2);
  erp_traceparent(t, "RP-1", got_trace, got_span);
  if (strcmp(got_trace, trace2) == 0) fail_msg("the replay continued the finished trace %s; want a new, linked one", trace2);
  char work_span_name[128];
  snprintf(work_span_name, sizeof work_span_name, "process %s.work", t->fx->prefix);
  const obx_test_span_t *replayed = await_span(t, &spans, got_trace, work_span_name, "");
  assert_int_equal(replayed->nlinks, 1);
  assert_string_equal(replayed->link_trace[0], trace2);
  assert_string_equal(replayed->link_span[0], publish2);
  assert_string_equal(replayed->link_reason[0], "replay");
  obx_test_spans_cleanup(&spans);
}

/* Series value on outboxd's GET /metrics; -1 when absent. */
static double metric(tt_fx_t *t, const char *series) {
  obx_test_http_resp_t resp;
  obx_test_http(t->d.port, "GET", "/metrics", NULL, NULL, NULL, &resp);
  double v = -1;
  size_t n = strlen(series);
  for (const char *line = resp.body; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, series, n) == 0 && line[n] == ' ') {
      v = strtod(line + n + 1, NULL);
      break;
    }
  obx_test_http_resp_cleanup(&resp);
  return v;
}

/* With the collector away, every event still reaches the ERP; spans are dropped and counted. */
static void test_collector_down_loses_nothing(void **state) {
  WT_NEED_BROKER();
  tt_fx_t *t = *state;
  start_outboxd(t, "http://127.0.0.1:1"); /* nothing listens on port 1 */
  char ids[5][OBX_UUID_LEN + 1], num[16];
  for (int i = 0; i < 5; i++) {
    snprintf(num, sizeof num, "TD-%d", i);
    wt_route(t->fx, num, 200);
    post_order(t, num, NULL, ids[i]);
  }
  for (int i = 0; i < 5; i++) {
    snprintf(num, sizeof num, "TD-%d", i);
    wt_wait_calls(t->fx, num, 1);
    wt_wait_status(t->fx, ids[i], "DONE");
  }
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  double dropped;
  while ((dropped = metric(t, "outboxd_trace_spans_dropped_total{reason=\"export_failed\"}")) < 5 * 7 &&
         obx_test_now_ms() < deadline)
    usleep(50 * 1000);
  if (dropped < 5 * 7) fail_msg("dropped spans: got %.0f, want >= 35 (7 per order)", dropped);
  assert_true(metric(t, "outboxd_trace_spans_exported_total") == 0);
  assert_true(obx_test_file_contains(t->d.proc.log_path, "spans are dropped until it answers", 1000));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_one_trace_end_to_end, setup, teardown),
    cmocka_unit_test_setup_teardown(test_retry_and_redrive, setup, teardown),
    cmocka_unit_test_setup_teardown(test_emitted_event_and_replay, setup, teardown),
    cmocka_unit_test_setup_teardown(test_collector_down_loses_nothing, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
