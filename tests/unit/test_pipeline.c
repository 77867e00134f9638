/* test_pipeline.c - pipeline definitions, templates, branching, execution documents
 *
 * Pure engine tests: no MongoDB, no HTTP server. Definitions are written with single quotes
 * (obx_test_json_quotes() turns them into JSON) to keep the tables readable. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx/obx_pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_metrics.h"
#include "../../src/pipeline/pipeline_int.h"

static char *read_fixture(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", OBX_SOURCE_DIR, rel);
  char *text = obx_test_read_file(path);
  if (!text) fail_msg("cannot read %s", path);
  return text;
}

/* ---- validation ------------------------------------------------------------------------- */

#define START "{'id':'start','type':'start'}"

static void test_validation_table(void **state) {
  static const struct {
    const char *def;
    const char *want; /* substring of the error; NULL: valid */
  } cases[] = {
    {"{'nodes':[" START "]}", NULL},
    {"[1,2", "not a JSON object"},
    {"{'nodes':[" START "]}{'nodes':[]}", "data after the JSON object"},
    {"{'nodes':[" START "],'$x':1}", "key \"$x\": keys may not start with"},
    {"{'nodes':[" START ",{'id':'l','type':'log','config':{'message':'m','a':[{'.b':1}]}}]}", "key \"nodes.1.config.a.0..b\""},
    {"{}", "\"nodes\" must be an array"},
    {"{'nodes':[]}", "\"nodes\" is empty"},
    {"{'nodes':[" START ",{'id':'x','type':'http-reqest'}]}", "node \"x\": unknown type \"http-reqest\""},
    {"{'nodes':[{'id':'a','type':'log','config':{'message':'m'}}]}", "no node of type \"start\""},
    {"{'nodes':[" START ",{'id':'s2','type':'start'}]}",
     "node \"s2\": second start node (\"start\" is already the start)"},
    {"{'nodes':[" START ",{'id':'start','type':'log','config':{'message':'m'}}]}", "node \"start\": duplicate node id"},
    {"{'nodes':[" START ",{'type':'log'}]}", "node 1: \"id\" must be a non-empty string"},
    {"{'nodes':[" START ",{'id':'a.b','type':'log','config':{'message':'m'}}]}",
     "node \"a.b\": id may hold letters, digits, '_' and '-' only"},
    {"{'nodes':[" START "],'edges':[{'from':'start','to':'nowhere'}]}",
     "edge 0 (start -> nowhere): unknown node \"nowhere\""},
    {"{'nodes':[" START "],'edges':[{'from':'ghost','to':'start'}]}", "edge 0 (ghost -> start): unknown node \"ghost\""},
    {"{'nodes':[" START ",{'id':'a','type':'log','config':{'message':'m'}}],'edges':[{'from':'a','to':'start'}]}",
     "edge 0 (a -> start): the start node cannot have incoming edges"},
    {"{'nodes':[" START ",{'id':'a','type':'log','config':{'message':'m'}},{'id':'b','type':'log','config':{'message':'m'}}],"
     "'edges':[{'from':'start','to':'a'},{'from':'a','to':'b'},{'from':'b','to':'a'}]}",
     "edge 2 (b -> a): closes a cycle"},
    {"{'nodes':[" START ",{'id':'a','type':'log','config':{'message':'m'}}],'edges':[{'from':'a','to':'a'}]}",
     "edge 0 (a -> a): closes a cycle"},
    {"{'nodes':[" START ",{'id':'n','type':'log','config':{'message':'hi {{orderNumber'}}]}",
     "node \"n\" (log): config.message: bad template: unclosed \"{{\""},
    {"{'nodes':[" START ",{'id':'n','type':'http-request','config':{'url':'http://x/','body':{'a':['{{}}']}}}]}",
     "node \"n\" (http-request): config.body.a.0: bad template: empty template path"},
    {"{'nodes':[" START ",{'id':'n','type':'log','config':{'message':'{{a b}}'}}]}",
     "config.message: bad template: bad character 'b' in template path"},
    {"{'nodes':[" START ",{'id':'n','type':'http-request','config':{}}]}",
     "node \"n\" (http-request): config.url: required"},
    {"{'nodes':[" START ",{'id':'n','type':'http-request','config':{'url':'file:///etc/passwd'}}]}",
     "node \"n\" (http-request): config.url: egress refused: scheme \"file\""},
    {"{'nodes':[" START ",{'id':'n','type':'http-request','config':{'url':'http://x/','method':'TRACE'}}]}",
     "config.method: \"TRACE\""},
    {"{'nodes':[" START ",{'id':'n','type':'http-request','config':{'url':'http://x/','timeoutMs':0}}]}",
     "config.timeoutMs: an integer from 1 to 300000"},
    {"{'nodes':[" START ",{'id':'n','type':'http-request','config':{'url':'http://x/','headers':{'X-A':1}}}]}",
     "config.headers.X-A: a header name with a string value"},
    {"{'nodes':[" START ",{'id':'n','type':'set-status','config':{'name':'x'}}]}",
     "node \"n\" (set-status): config.statusTag: required"},
    {"{'nodes':[" START ",{'id':'n','type':'emit-event','config':{'eventType':'Bad Type!'}}]}",
     "node \"n\" (emit-event): config.eventType: \"Bad Type!\""},
    {"{'nodes':[" START ",{'id':'n','type':'emit-event','config':{'eventType':'X','payload':[1]}}]}",
     "config.payload: must be an object"},
    {"{'nodes':[" START ",{'id':'c','type':'condition','config':{'path':'a','operator':'like','value':1}}]}",
     "node \"c\" (condition): config.operator: \"like\""},
    {"{'nodes':[" START ",{'id':'c','type':'condition','config':{'path':'a','operator':'eq'}}]}",
     "config.value: required by operator \"eq\""},
    {"{'nodes':[" START ",{'id':'c','type':'condition','config':{'path':'{{a}}','operator':'exists'}}]}",
     "config.path: a plain path"},
    {"{'nodes':[" START ",{'id':'l','type':'log','config':{'message':'m','level':'loud'}}]}",
     "config.level: \"loud\""},
    {"{'nodes':[" START ",{'id':'c','type':'condition','config':{'path':'a','operator':'exists'}},"
     "{'id':'l','type':'log','config':{'message':'m'}}],'edges':[{'from':'start','to':'c'},{'from':'c','to':'l','branch':'success'}]}",
     "edge 1 (c -> l): branch \"success\" is not an outcome of a condition node (\"true\", \"false\", \"failure\")"},
    {"{'nodes':[" START ",{'id':'l','type':'log','config':{'message':'m'}}],'edges':[{'from':'start','to':'l','branch':'true'}]}",
     "edge 0 (start -> l): branch \"true\" is not an outcome of a start node"},
    {"{'nodes':[" START ",{'id':'l','type':'log','onError':'retry','config':{'message':'m'}}]}",
     "node \"l\": onError must be \"abort\" or \"continue\""},
    {"{'nodes':[" START "],'edges':[{'from':'start'}]}", "edge 0 (start -> ?): \"from\" and \"to\" are required"},
    {"{'trigger':'order.during','nodes':[" START "]}", "trigger \"order.during\": must be order.pre, order.post or event.<Type>"},
    {"{'trigger':'event.','nodes':[" START "]}", "trigger \"event.\""},
    {"{'version':0,'nodes':[" START "]}", "\"version\" must be a positive integer"},
    {"{'enabled':'yes','nodes':[" START "]}", "\"enabled\" must be true or false"},
    {"{'nodes':[" START ",{'id':'n','type':'log','config':'m'}]}", "node \"n\": \"config\" must be an object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *json = obx_test_json_quotes(cases[i].def);
    obx_pipeline_t *pipeline = NULL;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_pipeline_parse_json(json, &pipeline, &err);
    if (!cases[i].want) {
      if (!ok) fail_msg("case %zu %s: got error \"%s\", want valid", i, json, err.msg);
    } else {
      if (ok) fail_msg("case %zu %s: got valid, want error containing \"%s\"", i, json, cases[i].want);
      if (!strstr(err.msg, cases[i].want))
        fail_msg("case %zu %s:\n got  \"%s\"\n want \"%s\"", i, json, err.msg, cases[i].want);
      assert_int_equal(err.domain, OBX_ERR_PIPELINE);
      assert_false(err.retriable);
      assert_null(pipeline);
    }
    obx_pipeline_destroy(pipeline);
    free(json);
  }
}

static void test_seed_example_parses(void **state) {
  char *json = read_fixture("tests/fixtures/pipelines/seed-order-post.json");
  obx_pipeline_t *pipeline = NULL;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("seed example: %s", err.msg);
  assert_true(obx_pipeline_enabled(pipeline));
  assert_int_equal(obx_pipeline_version(pipeline), 1);
  assert_null(obx_pipeline_trigger(pipeline));
  obx_pipeline_destroy(pipeline);
  free(json);
}

/* The shipped samples validate, with the fields `outboxctl pipelines apply` needs. */
static void test_config_samples_parse(void **state) {
  static const char *const files[] = {"config/pipelines/order-post-erp.json", "config/pipelines/order-shipped-notify.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char *json = read_fixture(files[i]);
    obx_pipeline_t *pipeline = NULL;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("%s: %s", files[i], err.msg);
    assert_non_null(obx_pipeline_name(pipeline));
    assert_non_null(obx_pipeline_org_id(pipeline));
    assert_true(obx_pipeline_trigger_valid(obx_pipeline_trigger(pipeline)));
    obx_pipeline_destroy(pipeline);
    free(json);
  }
}

static void test_triggers(void **state) {
  char buf[64];
  assert_string_equal(obx_pipeline_trigger_for_event("OrderConfirmed", buf, sizeof buf), "order.post");
  assert_string_equal(obx_pipeline_trigger_for_event("OrderShipped", buf, sizeof buf), "event.OrderShipped");
  assert_true(obx_pipeline_trigger_valid("order.pre"));
  assert_true(obx_pipeline_trigger_valid("event.Order.Shipped-v2"));
  assert_false(obx_pipeline_trigger_valid("event.a b"));
  assert_false(obx_pipeline_trigger_valid("order"));
  assert_false(obx_pipeline_trigger_valid(NULL));
}

/* ---- templates -------------------------------------------------------------------------- */

static bson_t *template_context(void) {
  bson_t *ctx = obx_test_json("{'orderNumber':'A-1','order':{'n':3,'big':{'$numberLong':'9007199254740993'},"
                         "'ratio':0.25,'paid':true,'note':null,'items':[{'sku':'X'},{'sku':'Y'}],"
                         "'totalAmount':{'$numberDecimal':'12.50'}},'event':{'id':'e1'}}");
  return ctx;
}

static void test_template_table(void **state) {
  static const struct {
    const char *config;
    const char *want; /* rendered config as plain JSON (single quotes), or the error substring */
    bool ok;
  } cases[] = {
    {"{'a':'{{orderNumber}}'}", "{'a':'A-1'}", true},
    {"{'a':'{{order.n}}'}", "{'a':3}", true},
    {"{'a':'{{ order.n }}'}", "{'a':3}", true},
    {"{'a':'{{order.big}}'}", "{'a':9007199254740993}", true},
    {"{'a':'{{order.ratio}}'}", "{'a':0.25}", true},
    {"{'a':'{{order.paid}}'}", "{'a':true}", true},
    {"{'a':'{{order.note}}'}", "{'a':null}", true},
    {"{'a':'{{order.totalAmount}}'}", "{'a':12.50}", true},
    {"{'a':'{{order.items}}'}", "{'a':[{'sku':'X'},{'sku':'Y'}]}", true},
    {"{'a':'{{order.items.1.sku}}'}", "{'a':'Y'}", true},
    {"{'a':'#{{orderNumber}} = {{order.totalAmount}} x{{order.n}}'}", "{'a':'#A-1 = 12.50 x3'}", true},
    {"{'a':'paid={{order.paid}} note={{order.note}}'}", "{'a':'paid=true note=null'}", true},
    {"{'a':'items {{order.items.0}}'}", "{'a':'items {\\'sku\\':\\'X\\'}'}", true},
    {"{'b':{'c':['{{event.id}}',2,'x']}}", "{'b':{'c':['e1',2,'x']}}", true},
    {"{'n':5,'t':true,'s':'plain text'}", "{'n':5,'t':true,'s':'plain text'}", true},
    {"{'a':'{{order.nope}}'}", "config.a: template {{order.nope}}: path \"order.nope\" not found", false},
    {"{'a':{'b':'x {{missing}} y'}}", "config.a.b: template {{missing}}: path \"missing\" not found", false},
    {"{'a':'{{}}'}", "config.a: bad template: empty template path", false},
    {"{'a':'{{a'}", "config.a: bad template: unclosed", false},
    {"{'a':'a}} b'}", "config.a: bad template: \"}}\" without \"{{\"", false},
    {"{'a':'{{a..b}}'}", "bad template path \"a..b\"", false},
  };
  bson_t *ctx = template_context();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *config = obx_test_json(cases[i].config);
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_template_render_doc(config, ctx, NULL, &out, &err);
    char *want = obx_test_json_quotes(cases[i].want);
    if (ok != cases[i].ok) fail_msg("case %zu %s: got ok=%d (%s), want ok=%d", i, cases[i].config, ok, err.msg, cases[i].ok);
    if (ok) {
      bson_string_t *got = bson_string_new(NULL);
      obx_json_append_doc(got, &out, false);
      if (strcmp(got->str, want) != 0) fail_msg("case %zu %s:\n got  %s\n want %s", i, cases[i].config, got->str, want);
      bson_string_free(got, true);
    } else if (!strstr(err.msg, want)) {
      fail_msg("case %zu %s:\n got  \"%s\"\n want \"%s\"", i, cases[i].config, err.msg, want);
    }
    free(want);
    bson_destroy(&out);
    bson_destroy(config);
  }
  bson_destroy(ctx);
}

static void test_template_keeps_types(void **state) {
  static const struct {
    const char *path;
    bson_type_t type;
  } cases[] = {
    {"{{order.n}}", BSON_TYPE_INT32},         {"{{order.big}}", BSON_TYPE_INT64},
    {"{{order.ratio}}", BSON_TYPE_DOUBLE},    {"{{order.totalAmount}}", BSON_TYPE_DECIMAL128},
    {"{{order.items}}", BSON_TYPE_ARRAY},     {"{{order}}", BSON_TYPE_DOCUMENT},
    {"{{order.paid}}", BSON_TYPE_BOOL},       {"{{order.note}}", BSON_TYPE_NULL},
    {"n={{order.n}}", BSON_TYPE_UTF8},
  };
  bson_t *ctx = template_context();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t config = BSON_INITIALIZER, out = BSON_INITIALIZER;
    bson_iter_t it;
    BSON_APPEND_UTF8(&config, "v", cases[i].path);
    assert_true(obx_template_render_doc(&config, ctx, NULL, &out, NULL));
    assert_true(bson_iter_init_find(&it, &out, "v"));
    if (bson_iter_type(&it) != cases[i].type)
      fail_msg("%s: got BSON type 0x%x, want 0x%x", cases[i].path, bson_iter_type(&it), cases[i].type);
    bson_destroy(&out);
    bson_destroy(&config);
  }
  bson_destroy(ctx);
}

/* ---- runs ------------------------------------------------------------------------------- */

static obx_pipeline_t *parse_fixture(const char *name) {
  char rel[128];
  snprintf(rel, sizeof rel, "tests/fixtures/pipelines/%s", name);
  char *json = read_fixture(rel);
  obx_pipeline_t *pipeline = NULL;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("%s: %s", name, err.msg);
  free(json);
  return pipeline;
}

/* "start,big,vip,..." from the execution's steps; "!" marks a FAILED step. */
static void steps_path(const bson_t *execution, char *out, size_t outlen) {
  bson_iter_t it, steps;
  out[0] = '\0';
  assert_true(bson_iter_init_find(&it, execution, "steps"));
  assert_true(bson_iter_recurse(&it, &steps));
  while (bson_iter_next(&steps)) {
    bson_iter_t f;
    const char *node = "?", *status = "?";
    bson_iter_recurse(&steps, &f);
    if (bson_iter_find(&f, "nodeId")) node = bson_iter_utf8(&f, NULL);
    bson_iter_recurse(&steps, &f);
    if (bson_iter_find(&f, "status")) status = bson_iter_utf8(&f, NULL);
    size_t len = strlen(out);
    snprintf(out + len, outlen - len, "%s%s%s", len ? "," : "", strcmp(status, "FAILED") == 0 ? "!" : "", node);
  }
}

/* assert_string_equal that names the value and survives NULL */
#define check_str(got, want)                                                                       \
  do {                                                                                             \
    const char *g_ = (got), *w_ = (want);                                                          \
    if (!g_ || strcmp(g_, w_) != 0) fail_msg("%s: got %s, want %s", #got, g_ ? g_ : "(null)", w_); \
  } while (0)

static void test_branching(void **state) {
  static const struct {
    const char *context;
    const char *aggregate_id; /* NULL makes set-status fail (tolerated: onError continue) */
    const char *want_path;
    int want_statuses;
  } cases[] = {
    {"{'orderNumber':'B-1','order':{'totalAmount':250}}", "o-1", "start,big,vip,tag,emit", 1},
    {"{'orderNumber':'B-2','order':{'totalAmount':{'$numberDecimal':'99.99'}}}", "o-2", "start,big,small,emit", 0},
    {"{'orderNumber':'B-3','order':{'totalAmount':100}}", NULL, "start,big,vip,!tag,tag-failed,!emit", 0},
  };
  obx_pipeline_t *pipeline = parse_fixture("branching.json");
  obx_counter_t *runs = obx_metrics_counter("outboxd_pipeline_runs_total", "Pipeline runs by trigger and final status",
                                            "trigger,status");
  double ok_before = obx_metrics_value(runs, "event.OrderShipped", "SUCCEEDED");
  double failed_before = obx_metrics_value(runs, "event.OrderShipped", "FAILED");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *ctx = obx_test_json(cases[i].context);
    obx_pipeline_input_t in = {.context = ctx, .org_id = "org-1", .event_id = "ev-1", .correlation_id = "corr-1",
                               .aggregate_type = "Order", .aggregate_id = cases[i].aggregate_id, .attempt = 2};
    obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, NULL);
    char path[256];
    steps_path(obx_pipeline_run_execution(run), path, sizeof path);
    if (strcmp(path, cases[i].want_path) != 0) fail_msg("case %zu: got path %s, want %s", i, path, cases[i].want_path);
    /* without an aggregate set-status fails (tolerated) and emit-event fails (abort) */
    if (!cases[i].aggregate_id) {
      assert_int_equal(obx_pipeline_run_status(run), OBX_PIPELINE_FAILED);
      assert_int_equal(obx_pipeline_run_failure_class(run), OBX_FAILURE_TERMINAL);
    } else {
      assert_int_equal(obx_pipeline_run_status(run), OBX_PIPELINE_SUCCEEDED);
      assert_int_equal(obx_pipeline_run_nevents(run), 1);
      const obx_event_t *ev = obx_pipeline_run_event(run, 0);
      check_str(ev->event_type, "OrderClassified");
      check_str(ev->causation_id, "ev-1");
      check_str(ev->correlation_id, "corr-1");
      check_str(ev->partition_key, cases[i].aggregate_id);
      check_str(ev->aggregate_id, cases[i].aggregate_id);
      check_str(ev->org_id, "org-1");
      assert_true(obx_uuid_valid(ev->id));
      check_str(obx_test_doc_str(&ev->payload, "orderNumber"), i == 0 ? "B-1" : "B-2");
    }
    int nstatuses = 0;
    bson_iter_t it;
    bson_iter_init(&it, obx_pipeline_run_statuses(run));
    while (bson_iter_next(&it)) nstatuses++;
    assert_int_equal(nstatuses, cases[i].want_statuses);
    const bson_t *exec = obx_pipeline_run_execution(run);
    check_str(obx_test_doc_str(exec, "orgId"), "org-1");
    check_str(obx_test_doc_str(exec, "eventId"), "ev-1");
    check_str(obx_test_doc_str(exec, "trigger"), "event.OrderShipped");
    check_str(obx_test_doc_str(exec, "_id"), obx_pipeline_run_execution_id(run));
    assert_true(bson_iter_init_find(&it, exec, "attempt"));
    assert_int_equal(bson_iter_int32(&it), 2);
    obx_pipeline_run_destroy(run);
    bson_destroy(ctx);
  }
  assert_int_equal((int)(obx_metrics_value(runs, "event.OrderShipped", "SUCCEEDED") - ok_before), 2);
  assert_int_equal((int)(obx_metrics_value(runs, "event.OrderShipped", "FAILED") - failed_before), 1);
  obx_pipeline_destroy(pipeline);
}

static void test_abort_and_continue(void **state) {
  static const struct {
    const char *on_error;
    obx_pipeline_status_t want_status;
    const char *want_path;
  } cases[] = {
    {"abort", OBX_PIPELINE_FAILED, "start,!bad"},
    {"continue", OBX_PIPELINE_SUCCEEDED, "start,!bad,after"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char def[1024];
    snprintf(def, sizeof def,
             "{'nodes':[" START ",{'id':'bad','type':'log','onError':'%s','config':{'message':'{{nope}}'}},"
             "{'id':'after','type':'log','config':{'message':'after'}}],"
             "'edges':[{'from':'start','to':'bad'},{'from':'bad','to':'after'}]}",
             cases[i].on_error);
    char *json = obx_test_json_quotes(def);
    obx_pipeline_t *pipeline = NULL;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("%s", err.msg);
    bson_t ctx = BSON_INITIALIZER;
    obx_pipeline_input_t in = {.context = &ctx, .org_id = "o", .trigger = "order.post"};
    obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, NULL);
    char path[128];
    steps_path(obx_pipeline_run_execution(run), path, sizeof path);
    if (strcmp(path, cases[i].want_path) != 0) fail_msg("onError %s: got path %s, want %s", cases[i].on_error, path, cases[i].want_path);
    assert_int_equal(obx_pipeline_run_status(run), cases[i].want_status);
    const bson_t *exec = obx_pipeline_run_execution(run);
    check_str(obx_test_doc_str(exec, "steps.1.error"), "config.message: template {{nope}}: path \"nope\" not found in the context");
    check_str(obx_test_doc_str(exec, "steps.1.failureClass"), "terminal");
    if (cases[i].want_status == OBX_PIPELINE_FAILED) {
      assert_int_equal(obx_pipeline_run_failure_class(run), OBX_FAILURE_TERMINAL);
      check_str(obx_test_doc_str(exec, "status"), "FAILED");
      check_str(obx_test_doc_str(exec, "failureClass"), "terminal");
      assert_non_null(strstr(obx_pipeline_run_error(run)->msg, "node \"bad\": config.message"));
    } else {
      check_str(obx_test_doc_str(exec, "status"), "SUCCEEDED");
      assert_int_equal(obx_pipeline_run_failure_class(run), OBX_FAILURE_NONE);
    }
    obx_pipeline_run_destroy(run);
    obx_pipeline_destroy(pipeline);
    free(json);
  }
}

static void test_condition_operators(void **state) {
  static const struct {
    const char *config;
    const char *want; /* "true", "false" or an error substring */
  } cases[] = {
    {"{'path':'order.n','operator':'eq','value':3}", "true"},
    {"{'path':'order.n','operator':'eq','value':3.0}", "true"},
    {"{'path':'order.n','operator':'ne','value':3}", "false"},
    {"{'path':'order.totalAmount','operator':'gt','value':12.4}", "true"},
    {"{'path':'order.totalAmount','operator':'lte','value':'{{order.n}}'}", "false"},
    {"{'path':'orderNumber','operator':'eq','value':'A-1'}", "true"},
    {"{'path':'orderNumber','operator':'lt','value':'B'}", "true"},
    {"{'path':'orderNumber','operator':'contains','value':'-'}", "true"},
    {"{'path':'order.tags','operator':'contains','value':'vip'}", "true"},
    {"{'path':'order.tags','operator':'contains','value':'new'}", "false"},
    {"{'path':'orderNumber','operator':'in','value':['A-1','A-2']}", "true"},
    {"{'path':'order.n','operator':'in','value':[1,2]}", "false"},
    {"{'path':'order.missing','operator':'exists'}", "false"},
    {"{'path':'order.missing','operator':'notExists'}", "true"},
    {"{'path':'order.n','operator':'exists'}", "true"},
    {"{'path':'order.missing','operator':'eq','value':1}", "false"},
    {"{'path':'order.missing','operator':'ne','value':1}", "true"},
    {"{'path':'order.paid','operator':'eq','value':true}", "true"},
    {"{'path':'order.items','operator':'eq','value':[{'sku':'X'},{'sku':'Y'}]}", "true"},
    {"{'path':'orderNumber','operator':'gt','value':5}", "operator \"gt\": cannot order orderNumber (string) against config.value (number)"},
  };
  bson_t *ctx = obx_test_json("{'orderNumber':'A-1','order':{'n':3,'paid':true,'tags':['vip','eu'],"
                         "'items':[{'sku':'X'},{'sku':'Y'}],'totalAmount':{'$numberDecimal':'12.50'}}}");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char def[1024];
    snprintf(def, sizeof def,
             "{'nodes':[" START ",{'id':'c','type':'condition','config':%s}],'edges':[{'from':'start','to':'c'}]}",
             cases[i].config);
    char *json = obx_test_json_quotes(def);
    obx_pipeline_t *pipeline = NULL;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_pipeline_parse_json(json, &pipeline, &err)) fail_msg("case %zu: %s", i, err.msg);
    obx_pipeline_input_t in = {.context = ctx, .org_id = "o"};
    obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, NULL);
    const bson_t *exec = obx_pipeline_run_execution(run);
    const char *got = obx_pipeline_run_status(run) == OBX_PIPELINE_SUCCEEDED ? obx_test_doc_str(exec, "steps.1.outcome")
                                                                              : obx_test_doc_str(exec, "steps.1.error");
    if (!got || !strstr(got, cases[i].want)) fail_msg("case %zu %s: got %s, want %s", i, cases[i].config, got ? got : "(null)", cases[i].want);
    obx_pipeline_run_destroy(run);
    obx_pipeline_destroy(pipeline);
    free(json);
  }
  bson_destroy(ctx);
}

static void test_disabled_is_skipped(void **state) {
  char *json = obx_test_json_quotes("{'enabled':false,'nodes':[" START "]}");
  obx_pipeline_t *pipeline = NULL;
  assert_true(obx_pipeline_parse_json(json, &pipeline, NULL));
  bson_t ctx = BSON_INITIALIZER;
  obx_pipeline_input_t in = {.context = &ctx, .org_id = "o"};
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, NULL);
  assert_int_equal(obx_pipeline_run_status(run), OBX_PIPELINE_SKIPPED);
  check_str(obx_test_doc_str(obx_pipeline_run_execution(run), "status"), "SKIPPED");
  obx_pipeline_run_destroy(run);
  obx_pipeline_destroy(pipeline);
  free(json);
}

static void test_output_bounded(void **state) {
  /* a log message of 10 KiB: the step output is replaced by a bounded preview */
  char *big = malloc(10241);
  memset(big, 'x', 10240);
  big[10240] = '\0';
  bson_t *ctx = bson_new();
  BSON_APPEND_UTF8(ctx, "big", big);
  char *json = obx_test_json_quotes("{'nodes':[" START ",{'id':'l','type':'log','config':{'message':'{{big}}','level':'debug'}}],"
                 "'edges':[{'from':'start','to':'l'}]}");
  obx_pipeline_t *pipeline = NULL;
  assert_true(obx_pipeline_parse_json(json, &pipeline, NULL));
  obx_pipeline_input_t in = {.context = ctx, .org_id = "o"};
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, NULL);
  const bson_t *exec = obx_pipeline_run_execution(run);
  bson_iter_t it, v;
  bson_iter_init(&it, exec);
  assert_true(bson_iter_find_descendant(&it, "steps.1.output.truncated", &v));
  assert_true(bson_iter_bool(&v));
  const char *preview = obx_test_doc_str(exec, "steps.1.output.preview");
  assert_non_null(preview);
  assert_true(strlen(preview) <= 1024);
  assert_true(exec->len < 8192);
  obx_pipeline_run_destroy(run);
  obx_pipeline_destroy(pipeline);
  bson_destroy(ctx);
  free(json);
  free(big);
}

static void test_context_from_event(void **state) {
  obx_event_t ev;
  obx_event_init(&ev);
  ev.event_type = strdup("OrderConfirmed");
  ev.org_id = strdup("org-1");
  ev.aggregate_type = strdup("Order");
  ev.aggregate_id = strdup("ord-1");
  ev.correlation_id = strdup("corr-1");
  bson_t *payload = obx_test_json("{'orderNumber':'N-7','totalAmount':'12.50','event':'clash'}");
  bson_destroy(&ev.payload);
  bson_copy_to(payload, &ev.payload);
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_event_finalize(&ev, &err));
  bson_t ctx = BSON_INITIALIZER;
  obx_pipeline_context_from_event(&ev, &ctx);
  check_str(obx_test_doc_str(&ctx, "orderNumber"), "N-7");
  check_str(obx_test_doc_str(&ctx, "order.totalAmount"), "12.50");
  check_str(obx_test_doc_str(&ctx, "payload.orderNumber"), "N-7");
  check_str(obx_test_doc_str(&ctx, "event.id"), ev.id);
  check_str(obx_test_doc_str(&ctx, "event.type"), "OrderConfirmed");
  check_str(obx_test_doc_str(&ctx, "event.correlationId"), "corr-1");
  check_str(obx_test_doc_str(&ctx, "event.partitionKey"), "ord-1");
  bson_destroy(&ctx);
  bson_destroy(payload);
  obx_event_cleanup(&ev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_validation_table),
    cmocka_unit_test(test_seed_example_parses),
    cmocka_unit_test(test_config_samples_parse),
    cmocka_unit_test(test_triggers),
    cmocka_unit_test(test_template_table),
    cmocka_unit_test(test_template_keeps_types),
    cmocka_unit_test(test_branching),
    cmocka_unit_test(test_abort_and_continue),
    cmocka_unit_test(test_condition_operators),
    cmocka_unit_test(test_disabled_is_skipped),
    cmocka_unit_test(test_output_bounded),
    cmocka_unit_test(test_context_from_event),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
