/* test_pipeline_api.c - /api/pipelines and order.pre through the real outboxd binary
 *
 * One devmongod, one scripted HTTP server (in this process, on 127.0.0.1) and one
 * `outboxd --roles api` allowed to reach loopback (egress.allow_networks=127.0.0.0/8) with
 * PIPELINES_DIR pointing at a temp directory holding one definition. Each test uses its own
 * org so that their order.pre pipelines never meet. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_httpd.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

static obx_test_mongo_t mongo;
static obx_test_outboxd_t outboxd;
static obx_test_httpd_t *httpd;
static mongoc_client_t *client;
static char key_acme[64], key_acme_reader[64], key_globex[64], key_initech[64], key_filed[64];

static const char order_body[] = "{\"customerEmail\": \"customer@company.com\", \"amount\": \"149.90\"}";

static int group_setup(void **state) {
  char keys_path[300], dir[300], file[400], mongo_arg[300], keys_arg[340], dir_arg[340];
  if (!(httpd = obx_test_httpd_start())) return -1;
  if (!obx_test_mongo_start(&mongo, NULL)) return -1;
  client = obx_test_mongo_client(&mongo, NULL, "test_pipeline_api");
  snprintf(keys_path, sizeof keys_path, "%s/pipeline-api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "acme", "pipelines:read,pipelines:write,orders:write", key_acme);
  obx_test_apikey_add(keys_path, "acme", "pipelines:read", key_acme_reader);
  obx_test_apikey_add(keys_path, "globex", "pipelines:read,pipelines:write", key_globex);
  obx_test_apikey_add(keys_path, "initech", "pipelines:read,pipelines:write,orders:write", key_initech);
  obx_test_apikey_add(keys_path, "filed", "pipelines:read", key_filed);
  snprintf(dir, sizeof dir, "%s/pipelines", obx_test_tmpdir());
  mkdir(dir, 0755);
  snprintf(file, sizeof file, "%s/audit.json", dir);
  obx_test_write_file(file, "{\"name\": \"audit\", \"orgId\": \"filed\", \"trigger\": \"event.OrderShipped\","
                            " \"nodes\": [{\"id\": \"start\", \"type\": \"start\"},"
                            " {\"id\": \"log\", \"type\": \"log\","
                            " \"config\": {\"message\": \"shipped {{orderNumber}}\"}}],"
                            " \"edges\": [{\"from\": \"start\", \"to\": \"log\"}]}");
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  snprintf(dir_arg, sizeof dir_arg, "pipelines.dir=%s", dir);
  char *args[] = {"--roles", "api", "-X", mongo_arg, "-X", keys_arg, "-X", dir_arg,
                  "-X", "egress.allow_networks=127.0.0.0/8", "-X", "egress.timeout=3000", NULL};
  if (!obx_test_outboxd_start(&outboxd, args)) return -1;
  if (!obx_test_wait_for(obx_test_http_ready, &outboxd.port, 60000, 50)) {
    fprintf(stderr, "outboxd never became ready; log: %s\n", outboxd.proc.log_path);
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  int status = obx_test_outboxd_stop(&outboxd);
  if (client) mongoc_client_destroy(client);
  obx_test_mongo_stop(&mongo);
  obx_test_httpd_stop(httpd);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- helpers ----------------------------------------------------------------------------- */

static void request(const char *method, const char *path, const char *key, const char *body, long want,
                    obx_test_http_resp_t *resp) {
  obx_test_http_expect(outboxd.port, method, path, key, body, want, resp);
}

/* An order.pre pipeline calling `path` on the stub, then tagging the order and emitting an event. */
static void create_pre_pipeline(const char *key, const char *path) {
  char body[2048];
  snprintf(body, sizeof body,
           "{\"name\": \"screening\", \"trigger\": \"order.pre\", \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"screen\", \"type\": \"http-request\", \"config\": {\"url\": \"%s\","
           "  \"body\": {\"number\": \"{{orderNumber}}\", \"total\": \"{{order.totalAmount}}\"}}},"
           "{\"id\": \"tag\", \"type\": \"set-status\", \"config\": {\"statusTag\": \"screened\", \"name\": \"Screened by {{steps.screen.output.body.by}}\"}},"
           "{\"id\": \"emit\", \"type\": \"emit-event\", \"config\": {\"eventType\": \"OrderScreened\","
           "  \"payload\": {\"orderNumber\": \"{{orderNumber}}\", \"score\": \"{{steps.screen.output.body.score}}\"}}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"screen\"}, {\"from\": \"screen\", \"to\": \"tag\", \"branch\": \"success\"},"
           "{\"from\": \"tag\", \"to\": \"emit\"}]}",
           obx_test_httpd_url(httpd, path));
  obx_test_http_resp_t resp;
  request("POST", "/api/pipelines", key, body, 201, &resp);
  obx_test_http_resp_cleanup(&resp);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_routes(void **state) {
  obx_test_http_resp_t resp;
  const char *def = "{\"name\": \"n1\", \"trigger\": \"event.OrderShipped\", \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}]}";

  request("POST", "/api/pipelines", key_acme,
          "{\"trigger\": \"order.post\", \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}, {\"id\": \"x\", \"type\": \"teleport\"}]}",
          422, &resp);
  assert_non_null(strstr(resp.body, "node \\\"x\\\": unknown type \\\"teleport\\\""));
  assert_string_equal(obx_test_doc_str(&resp.json, "errors.0.field"), "nodes.x");
  assert_non_null(strstr(resp.headers, "application/problem+json"));
  obx_test_http_resp_cleanup(&resp);
  request("POST", "/api/pipelines", key_acme,
          "{\"trigger\": \"order.post\", \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}],"
          " \"edges\": [{\"from\": \"start\", \"to\": \"gone\"}]}",
          422, &resp);
  assert_string_equal(obx_test_doc_str(&resp.json, "errors.0.field"), "edges.0");
  obx_test_http_resp_cleanup(&resp);
  request("POST", "/api/pipelines", key_acme, "{not json", 400, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("POST", "/api/pipelines", key_acme_reader, def, 403, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("POST", "/api/pipelines", NULL, def, 401, &resp);
  obx_test_http_resp_cleanup(&resp);

  request("POST", "/api/pipelines", key_acme, def, 201, &resp);
  char id[64], path[128], location[160];
  snprintf(id, sizeof id, "%s", obx_test_http_json_str(&resp, "_id"));
  assert_string_equal(obx_test_http_json_str(&resp, "orgId"), "acme");
  assert_true(obx_test_http_header(&resp, "Location", location, sizeof location));
  snprintf(path, sizeof path, "/api/pipelines/%s", id);
  assert_string_equal(location, path);
  obx_test_http_resp_cleanup(&resp);

  request("POST", "/api/pipelines", key_acme, def, 409, &resp); /* second enabled event.OrderShipped */
  obx_test_http_resp_cleanup(&resp);
  request("GET", "/api/pipelines", key_acme_reader, NULL, 200, &resp);
  assert_string_equal(obx_test_doc_str(&resp.json, "pipelines.0._id"), id);
  obx_test_http_resp_cleanup(&resp);
  request("GET", "/api/pipelines", key_globex, NULL, 200, &resp);
  assert_null(obx_test_doc_str(&resp.json, "pipelines.0._id"));
  obx_test_http_resp_cleanup(&resp);
  request("GET", path, key_globex, NULL, 404, &resp);
  obx_test_http_resp_cleanup(&resp);

  const char *changed = "{\"name\": \"n1\", \"trigger\": \"event.OrderShipped\", \"enabled\": false,"
                        " \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}]}";
  request("PUT", path, key_globex, changed, 404, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("PUT", path, key_acme, changed, 200, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("GET", path, key_acme, NULL, 200, &resp);
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, &resp.json, "version"));
  assert_int_equal(bson_iter_as_int64(&it), 2);
  obx_test_http_resp_cleanup(&resp);

  char exec_path[200];
  snprintf(exec_path, sizeof exec_path, "%s/executions?limit=0", path);
  request("GET", exec_path, key_acme, NULL, 400, &resp);
  obx_test_http_resp_cleanup(&resp);
  snprintf(exec_path, sizeof exec_path, "%s/executions", path);
  request("GET", exec_path, key_globex, NULL, 404, &resp);
  obx_test_http_resp_cleanup(&resp);
}

/* Keys MongoDB cannot store ($- or .-prefixed, at any depth) are refused with 422 naming their
 * path, on create and on update; a body of two JSON objects is 400, never half-read. */
static void test_refused_keys_and_trailing_data(void **state) {
  obx_test_http_resp_t resp;
  static const struct {
    const char *def, *field;
  } bad[] = {
    {"{\"trigger\": \"order.post\", \"nodes\": [{\"id\": \"start\", \"type\": \"start\"},"
     " {\"id\": \"l\", \"type\": \"log\", \"config\": {\"message\": \"m\", \"$where\": 1}}]}", "nodes.1.config.$where"},
    {"{\"trigger\": \"order.post\", \"$set\": {}, \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}]}", "$set"},
    {"{\"trigger\": \"order.post\", \"nodes\": [{\"id\": \"start\", \"type\": \"start\", \".x\": 1}]}", "nodes.0..x"},
  };
  const char *def = "{\"name\": \"keys\", \"trigger\": \"event.KeysChecked\", \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}]}";
  request("POST", "/api/pipelines", key_acme, def, 201, &resp);
  char path[128];
  snprintf(path, sizeof path, "/api/pipelines/%s", obx_test_http_json_str(&resp, "_id"));
  obx_test_http_resp_cleanup(&resp);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (int put = 0; put < 2; put++) {
      request(put ? "PUT" : "POST", put ? path : "/api/pipelines", key_acme, bad[i].def, 422, &resp);
      const char *field = obx_test_doc_str(&resp.json, "errors.0.field");
      if (!field || strcmp(field, bad[i].field) != 0 || !strstr(resp.body, "keys may not start with"))
        fail_msg("%s %s: got %s, want 422 naming %s", put ? "PUT" : "POST", bad[i].def, resp.body, bad[i].field);
      obx_test_http_resp_cleanup(&resp);
    }
  }
  char two[512];
  snprintf(two, sizeof two, "%s%s", def, "{\"name\": \"second\"}");
  request("POST", "/api/pipelines", key_acme, two, 400, &resp);
  assert_non_null(strstr(resp.body, "data after the JSON object"));
  obx_test_http_resp_cleanup(&resp);
  request("PUT", path, key_acme, two, 400, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("GET", path, key_acme, NULL, 200, &resp); /* unchanged by the refused updates */
  assert_string_equal(obx_test_http_json_str(&resp, "name"), "keys");
  obx_test_http_resp_cleanup(&resp);
}

static void test_order_pre_success(void **state) {
  obx_test_httpd_route_t route = {.path = "/screen-ok", .body = "{\"by\": \"riskco\", \"score\": 7}"};
  obx_test_httpd_route(httpd, &route);
  create_pre_pipeline(key_acme, "/screen-ok");
  int before = obx_test_httpd_nrequests(httpd);
  obx_test_http_resp_t resp;
  request("POST", "/orders", key_acme, order_body, 201, &resp);
  char order_id[64];
  const char *oid = obx_test_http_json_str(&resp, "id");
  assert_non_null(oid);
  snprintf(order_id, sizeof order_id, "%s", oid);
  obx_test_http_resp_cleanup(&resp);

  /* the stub saw the order, with the total as a JSON number */
  obx_test_httpd_request_t req;
  assert_true(obx_test_httpd_request(httpd, before, &req));
  assert_non_null(strstr(req.body, "\"total\":149.90"));
  obx_test_httpd_request_cleanup(&req);

  bson_t order = BSON_INITIALIZER, screened = BSON_INITIALIZER, exec = BSON_INITIALIZER;
  bson_t *by_id = BCON_NEW("_id", BCON_UTF8(order_id));
  assert_true(obx_test_find_one(client, "outboxd", "orders", by_id, &order));
  assert_string_equal(obx_test_doc_str(&order, "statusHistory.0.statusTag"), "screened");
  assert_string_equal(obx_test_doc_str(&order, "statusHistory.0.name"), "Screened by riskco");
  assert_string_equal(obx_test_doc_str(&order, "statusHistory.0.phase"), "order.pre");
  bson_t *ev_filter = BCON_NEW("aggregateId", BCON_UTF8(order_id), "eventType", BCON_UTF8("OrderScreened"));
  assert_true(obx_test_find_one(client, "outboxd", "outbox", ev_filter, &screened));
  assert_string_equal(obx_test_doc_str(&screened, "status"), "PENDING");
  assert_string_equal(obx_test_doc_str(&screened, "partitionKey"), order_id);
  bson_t *confirmed = BCON_NEW("aggregateId", BCON_UTF8(order_id), "eventType", BCON_UTF8("OrderConfirmed"));
  assert_int_equal(obx_test_count(client, "outboxd", "outbox", confirmed), 1);
  bson_t *exec_filter = BCON_NEW("aggregateId", BCON_UTF8(order_id), "trigger", BCON_UTF8("order.pre"));
  assert_true(obx_test_find_one(client, "outboxd", "pipeline_executions", exec_filter, &exec));
  assert_string_equal(obx_test_doc_str(&exec, "status"), "SUCCEEDED");
  assert_string_equal(obx_test_doc_str(&exec, "steps.1.nodeId"), "screen");

  /* and the API shows it */
  char path[200];
  snprintf(path, sizeof path, "/api/pipelines/%s/executions?limit=5", obx_test_doc_str(&exec, "pipelineId"));
  request("GET", path, key_acme, NULL, 200, &resp);
  assert_string_equal(obx_test_doc_str(&resp.json, "executions.0._id"), obx_test_doc_str(&exec, "_id"));
  obx_test_http_resp_cleanup(&resp);

  bson_destroy(exec_filter);
  bson_destroy(confirmed);
  bson_destroy(ev_filter);
  bson_destroy(by_id);
  bson_destroy(&exec);
  bson_destroy(&screened);
  bson_destroy(&order);
}

/* A failing order.pre rejects the order and writes nothing but its execution record. */
static void test_order_pre_rejects(void **state) {
  static const struct {
    int stub_status;
    long want_http;
    const char *want_class;
  } cases[] = {
    {404, 422, "terminal"},
    {500, 503, "transient"},
  };
  obx_test_httpd_route_t route = {.path = "/screen-no"};
  route.status = cases[0].stub_status;
  obx_test_httpd_route(httpd, &route);
  create_pre_pipeline(key_initech, "/screen-no");
  bson_t *org = BCON_NEW("orgId", BCON_UTF8("initech"));
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    route.status = cases[i].stub_status;
    obx_test_httpd_route(httpd, &route);
    obx_test_http_resp_t resp;
    request("POST", "/orders", key_initech, order_body, cases[i].want_http, &resp);
    assert_non_null(strstr(resp.headers, "application/problem+json"));
    obx_test_http_resp_cleanup(&resp);
    assert_int_equal(obx_test_count(client, "outboxd", "orders", org), 0);
    assert_int_equal(obx_test_count(client, "outboxd", "outbox", org), 0);
    bson_t *failed = BCON_NEW("orgId", BCON_UTF8("initech"), "status", BCON_UTF8("FAILED"), "failureClass",
                              BCON_UTF8(cases[i].want_class));
    assert_int_equal(obx_test_count(client, "outboxd", "pipeline_executions", failed), 1);
    bson_destroy(failed);
  }
  bson_destroy(org);
}

static bool filed_listed(void *ctx) {
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(outboxd.port, "GET", "/api/pipelines", key_filed, NULL, NULL, &resp) && resp.status == 200 &&
            obx_test_doc_str(&resp.json, "pipelines.0.name") && strcmp(obx_test_doc_str(&resp.json, "pipelines.0.name"), "audit") == 0;
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

static void test_pipelines_dir_applied_at_start(void **state) {
  assert_true(obx_test_wait_for(filed_listed, NULL, 30000, 50));
}

/* Runs outboxctl with args against this test's devmongod; returns its exit status and copies
 * its output (stdout + stderr) to out. */
static int outboxctl(const char *const args[], char *out, size_t outlen) {
  char mongo_arg[300];
  char *argv[16];
  int n = 0;
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  argv[n++] = (char *)obx_test_build_path("outboxctl");
  for (int i = 0; args[i]; i++) argv[n++] = (char *)args[i];
  argv[n++] = "-X";
  argv[n++] = mongo_arg;
  argv[n] = NULL;
  obx_test_proc_t proc = {0};
  assert_true(obx_test_spawn(&proc, argv, NULL));
  int64_t deadline = obx_test_now_ms() + 30000;
  int status = -1;
  for (;;) { /* waitpid here: obx_test_proc_alive would drop the exit status */
    pid_t r = waitpid(proc.pid, &status, WNOHANG);
    if (r == proc.pid) break;
    if (r < 0 || obx_test_now_ms() >= deadline) {
      obx_test_proc_stop(&proc, SIGKILL, 1000);
      fail_msg("outboxctl did not exit within 30 s; log %s", proc.log_path);
    }
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
  FILE *f = fopen(proc.log_path, "r");
  size_t got = f ? fread(out, 1, outlen - 1, f) : 0;
  out[got] = '\0';
  if (f) fclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_outboxctl_apply_and_list(void **state) {
  char dir[400], out[4096];
  snprintf(dir, sizeof dir, "%s/config/pipelines", OBX_SOURCE_DIR);
  static const struct {
    const char *sub, *arg2;
    int want_rc;
    const char *want;
  } cases[] = {
    {"apply", "--dry-run", 0, "create    "},
    {"list", "--org=demo", 0, "ORG"},
    {"apply", NULL, 0, "create    "},
    {"apply", NULL, 0, "unchanged "},
    {"list", "--org=demo", 0, "order-shipped-notify"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *args[] = {"pipelines", cases[i].sub, strcmp(cases[i].sub, "apply") == 0 ? dir : cases[i].arg2,
                          strcmp(cases[i].sub, "apply") == 0 ? cases[i].arg2 : NULL, NULL};
    int rc = outboxctl(args, out, sizeof out);
    if (rc != cases[i].want_rc || !strstr(out, cases[i].want))
      fail_msg("case %zu (pipelines %s): got rc %d output\n%s\nwant rc %d and \"%s\"", i, cases[i].sub, rc, out,
               cases[i].want_rc, cases[i].want);
  }
  assert_non_null(strstr(out, "order-post-erp"));
  assert_null(strstr(out, "audit")); /* another org */

  /* an invalid file: exit 1, the node at fault named */
  char bad[400];
  snprintf(bad, sizeof bad, "%s/bad-pipeline.json", obx_test_tmpdir());
  obx_test_write_file(bad, "{\"name\": \"bad\", \"orgId\": \"demo\", \"trigger\": \"order.post\","
                           " \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}],"
                           " \"edges\": [{\"from\": \"start\", \"to\": \"nowhere\"}]}");
  const char *args[] = {"pipelines", "apply", bad, NULL};
  int rc = outboxctl(args, out, sizeof out);
  if (rc != 1 || !strstr(out, "edge 0 (start -> nowhere): unknown node \"nowhere\""))
    fail_msg("invalid file: got rc %d output\n%s", rc, out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_routes),
    cmocka_unit_test(test_refused_keys_and_trailing_data),
    cmocka_unit_test(test_order_pre_success),
    cmocka_unit_test(test_order_pre_rejects),
    cmocka_unit_test(test_pipelines_dir_applied_at_start),
    cmocka_unit_test(test_outboxctl_apply_and_list),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
