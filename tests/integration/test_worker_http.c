/* test_worker_http.c - WORKER_SOURCE=http: the CloudEvents sink (Knative mode)
 *
 * DESIGN: the worker runs in process with the same devmongod / RabbitMQ / scripted ERP fixture
 * as the Kafka tests; its sink listens on a port of its own (worker.sink_port=0), apart from
 * the API's server. Binary and structured CloudEvents go through the same inbox, pipeline and
 * ladder path; the reply is 200 once the outcome is durable, 400 for something that is not a
 * CloudEvent, 401 without the sink token, 200 "dead" (parked in the DLQ) for a valid
 * CloudEvent outboxd cannot run, and 503 when MongoDB is down, so the broker delivers again.
 * test_cloudevents_sdk sends events built by the official CloudEvents SDK (npm cloudevents,
 * tests/node) in binary and structured mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/wait.h>
#include <unistd.h>

#include "obx/obx_http.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

#define SINK_TOKEN "sink-token-0123456789abcdef"
#define AUTH "Authorization: Bearer " SINK_TOKEN

static int setup(void **state) { return wt_sink_setup(state, SINK_TOKEN); }

/* Sends method path (body NULL: none) to the sink with the given headers, whose Content-Type
 * replaces the shared helper's default. Returns the status (0: no answer); the response body
 * is copied to out. */
static long call_port(int port, const char *method, const char *path, const char *body, const char *const headers[],
                      char *out, size_t outlen) {
  obx_test_http_resp_t resp;
  obx_test_http(port, method, path, NULL, body, headers, &resp);
  snprintf(out, outlen, "%s", resp.body);
  long status = resp.status;
  obx_test_http_resp_cleanup(&resp);
  return status;
}

static long call(wt_sink_fx_t *s, const char *method, const char *path, const char *body, const char *const headers[],
                 char *out, size_t outlen) {
  return call_port(s->port, method, path, body, headers, out, outlen);
}

static long post(wt_sink_fx_t *s, const char *body, const char *const headers[], char *out, size_t outlen) {
  return call(s, "POST", "/", body, headers, out, outlen);
}

static void test_binary_and_structured_events(void **state) {
  WT_NEED_BROKER();
  wt_sink_fx_t *s = *state;
  wt_fx_t *fx = s->fx;
  wt_route(fx, "H-1", 200);
  wt_route(fx, "H-2", 503);
  char id1[OBX_UUID_LEN + 1], id2[OBX_UUID_LEN + 1], hdr_id[64], out[1024];
  obx_uuid7(id1);
  obx_uuid7(id2);

  /* Binary mode: ce-* headers, the payload as the body. */
  snprintf(hdr_id, sizeof hdr_id, "ce-id: %s", id1);
  const char *binary[] = {"ce-specversion: 1.0", hdr_id, "ce-type: OrderConfirmed", "ce-source: /test/orders",
                          "ce-subject: Order/HK-1", "ce-partitionkey: HK-1", "ce-orgid: " WT_ORG,
                          "ce-time: 2026-11-29T18:00:00.000Z", "ce-keyseq: 7", "Content-Type: application/json", AUTH, NULL};
  long status = post(s, "{\"orderNumber\": \"H-1\"}", binary, out, sizeof out);
  if (status != 200) fail_msg("binary event: got %ld (%s), want 200", status, out);
  assert_non_null(strstr(out, "\"done\""));
  wt_wait_status(fx, id1, "DONE"); /* durable before the reply: already there */
  assert_int_equal(wt_erp_calls(fx, "H-1"), 1);
  assert_int_equal(wt_inbox_int(fx, id1, "seq"), 7); /* the key's order is the writer's (ce-keyseq) */

  /* The same event again is a duplicate, still 200. */
  status = post(s, "{\"orderNumber\": \"H-1\"}", binary, out, sizeof out);
  assert_int_equal(status, 200);
  assert_non_null(strstr(out, "\"duplicate\""));
  assert_int_equal(wt_erp_calls(fx, "H-1"), 1);

  /* Structured mode, failing transiently: accepted (200) once RETRYING is recorded. */
  char structured[1024];
  snprintf(structured, sizeof structured,
           "{\"specversion\": \"1.0\", \"id\": \"%s\", \"type\": \"OrderConfirmed\", \"source\": \"/test/orders\","
           " \"subject\": \"Order/HK-2\", \"partitionkey\": \"HK-2\", \"orgid\": \"" WT_ORG "\","
           " \"time\": \"2026-11-29T18:00:01.000Z\", \"keyseq\": 8, \"datacontenttype\": \"application/json\","
           " \"data\": {\"orderNumber\": \"H-2\"}}",
           id2);
  const char *ce_json[] = {"Content-Type: application/cloudevents+json", AUTH, NULL};
  status = post(s, structured, ce_json, out, sizeof out);
  if (status != 200) fail_msg("structured event: got %ld (%s), want 200", status, out);
  assert_non_null(strstr(out, "\"retrying\""));
  wt_wait_status(fx, id2, "RETRYING");
  wt_route(fx, "H-2", 200);
  wt_wait_status(fx, id2, "DONE"); /* the work queue ran it again */
  assert_int_equal(wt_inbox_int(fx, id2, "seq"), 8);

  /* Not a CloudEvent. */
  const char *plain[] = {"Content-Type: application/json", AUTH, NULL};
  status = post(s, "{\"hello\": 1}", plain, out, sizeof out);
  if (status != 400) fail_msg("plain JSON: got %ld (%s), want 400", status, out);
}

static void test_mongo_down_is_503(void **state) {
  WT_NEED_BROKER();
  wt_sink_fx_t *s = *state;
  obx_test_mongo_stop(&s->fx->m);
  char id[OBX_UUID_LEN + 1], hdr_id[64], out[1024];
  obx_uuid7(id);
  snprintf(hdr_id, sizeof hdr_id, "ce-id: %s", id);
  const char *binary[] = {"ce-specversion: 1.0", hdr_id, "ce-type: OrderConfirmed", "ce-source: /test/orders",
                          "ce-subject: Order/HK-3", "ce-partitionkey: HK-3", "ce-orgid: " WT_ORG,
                          "ce-time: 2026-11-29T18:00:00.000Z", "ce-keyseq: 7", "Content-Type: application/json", AUTH, NULL};
  long status = post(s, "{\"orderNumber\": \"H-3\"}", binary, out, sizeof out);
  if (status != 503) fail_msg("with MongoDB down: got %ld (%s), want 503", status, out);
  /* And the sink says it is not ready, so no traffic is routed to it. */
  char body[1024];
  long ready = call(s, "GET", "/readyz", NULL, NULL, body, sizeof body);
  if (ready != 503) fail_msg("/readyz with MongoDB down: got %ld (%s), want 503", ready, body);
}

/* The sink's own listener: the token is checked, the API's server has no sink route, a valid
 * CloudEvent without outboxd's attributes is parked in the DLQ (200, never a 4xx a broker would
 * drop), and Knative's dead letters land in the DLQ with the reason. */
static void test_auth_listener_and_dead_letters(void **state) {
  WT_NEED_BROKER();
  wt_sink_fx_t *s = *state;
  wt_fx_t *fx = s->fx;
  wt_route(fx, "H-9", 200);
  char id[OBX_UUID_LEN + 1], hdr_id[64], out[1024];
  obx_uuid7(id);
  snprintf(hdr_id, sizeof hdr_id, "ce-id: %s", id);
  static const struct {
    const char *name, *auth;
    long want;
  } auth_cases[] = {
    {"no token", NULL, 401},
    {"wrong bearer", "Authorization: Bearer sink-token-0123456789abcdeX", 401},
    {"prefix of the token", "Authorization: Bearer sink-token", 401},
    {"basic with the token as password", "Authorization: Basic a25hdGl2ZTpzaW5rLXRva2VuLTAxMjM0NTY3ODlhYmNkZWY=", 200},
    {"bearer", AUTH, 200},
  };
  for (size_t i = 0; i < sizeof auth_cases / sizeof auth_cases[0]; i++) {
    const char *h[] = {"ce-specversion: 1.0", hdr_id, "ce-type: OrderConfirmed", "ce-source: /test/orders",
                       "ce-subject: Order/HK-9", "ce-orgid: " WT_ORG, "Content-Type: application/json",
                       auth_cases[i].auth, NULL};
    long status = post(s, "{\"orderNumber\": \"H-9\"}", h, out, sizeof out);
    if (status != auth_cases[i].want) fail_msg("%s: got %ld (%s), want %ld", auth_cases[i].name, status, out, auth_cases[i].want);
  }
  /* never next to the API */
  const char *ok_hdrs[] = {"ce-specversion: 1.0", hdr_id, "ce-type: OrderConfirmed", "ce-source: /test/orders",
                           "ce-subject: Order/HK-9", "ce-orgid: " WT_ORG, "Content-Type: application/json", AUTH, NULL};
  long api = call_port(s->api_port, "POST", "/", "{}", ok_hdrs, out, sizeof out);
  if (api != 404 && api != 405) fail_msg("POST / on the API's server: got %ld, want 404", api);

  /* valid CloudEvents that outboxd cannot run: optional attributes left out -> parked, 200 */
  uint32_t before = 0, after = 0;
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_ladder_queue_depth(fx->ladder, obx_ladder_dlq_queue(fx->ladder), &before, &err));
  const char *minimal[] = {"ce-specversion: 1.0", "ce-id: not-a-uuid-but-valid", "ce-type: com.example.Ping",
                           "ce-source: urn:example", AUTH, NULL};
  long status = post(s, NULL, minimal, out, sizeof out);
  if (status != 200 || !strstr(out, "\"dead\"")) fail_msg("minimal binary CloudEvent: got %ld (%s), want 200 dead", status, out);
  const char *ce_json[] = {"Content-Type: application/cloudevents+json; charset=utf-8", AUTH, NULL};
  status = post(s, "{\"specversion\":\"1.0\",\"id\":\"x-1\",\"type\":\"com.example.Ping\",\"source\":\"urn:example\"}",
                ce_json, out, sizeof out);
  if (status != 200 || !strstr(out, "\"dead\"")) fail_msg("minimal structured CloudEvent: got %ld (%s), want 200 dead", status, out);
  /* a dead letter from Knative */
  const char *dead[] = {"ce-specversion: 1.0", "ce-id: dl-1", "ce-type: OrderConfirmed", "ce-source: /outboxd",
                        "ce-knativeerrorcode: 500", "ce-knativeerrordest: http://outboxd-sink/", AUTH,
                        "Content-Type: application/json", NULL};
  status = call(s, "POST", "/dead-letter", "{\"orderNumber\":\"H-10\"}", dead, out, sizeof out);
  if (status != 200) fail_msg("dead letter: got %ld (%s), want 200", status, out);
  assert_true(obx_ladder_queue_depth(fx->ladder, obx_ladder_dlq_queue(fx->ladder), &after, &err));
  if (after != before + 3) fail_msg("DLQ depth: got %u, want %u", after, before + 3);
}

/* Events built by the official CloudEvents SDK for JavaScript, binary and structured mode. */
static void test_cloudevents_sdk(void **state) {
  WT_NEED_BROKER();
  wt_sink_fx_t *s = *state;
  wt_fx_t *fx = s->fx;
  char script[512], mods[512];
  snprintf(script, sizeof script, "%s/tests/node/send-cloudevents.mjs", OBX_SOURCE_DIR);
  snprintf(mods, sizeof mods, "%s/tests/node/node_modules/cloudevents", OBX_SOURCE_DIR);
  obx_test_require(access(mods, F_OK) == 0, "npm cloudevents in tests/node (scripts/install-deps.sh)");
  wt_route(fx, "SDK-B", 200);
  wt_route(fx, "SDK-S", 200);
  char id_b[OBX_UUID_LEN + 1], id_s[OBX_UUID_LEN + 1], url[64], env_url[96], env_ids[160];
  obx_uuid7(id_b);
  obx_uuid7(id_s);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/", s->port);
  snprintf(env_url, sizeof env_url, "SINK_URL=%s", url);
  snprintf(env_ids, sizeof env_ids, "EVENT_IDS=%s,%s", id_b, id_s);
  char *env[] = {env_url, env_ids, "SINK_TOKEN=" SINK_TOKEN, "EVENT_ORG=" WT_ORG, NULL};
  char *argv[] = {"/usr/bin/node", script, NULL};
  obx_test_proc_t proc;
  assert_true(obx_test_spawn(&proc, argv, env));
  pid_t pid = proc.pid;
  if (!obx_test_wait_for(obx_test_pid_gone, &pid, 60000, 50)) fail_msg("node did not finish; log %s", proc.log_path);
  int status = obx_test_proc_stop(&proc, SIGKILL, 1000);
  if (!obx_test_file_contains(proc.log_path, "binary 200", 0) || !obx_test_file_contains(proc.log_path, "structured 200", 0))
    fail_msg("the SDK's events were not accepted (status %d); log %s", status, proc.log_path);
  wt_wait_status(fx, id_b, "DONE");
  wt_wait_status(fx, id_s, "DONE");
  assert_int_equal(wt_erp_calls(fx, "SDK-B"), 1);
  assert_int_equal(wt_erp_calls(fx, "SDK-S"), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_binary_and_structured_events, setup, wt_sink_teardown),
    cmocka_unit_test_setup_teardown(test_auth_listener_and_dead_letters, setup, wt_sink_teardown),
    cmocka_unit_test_setup_teardown(test_cloudevents_sdk, setup, wt_sink_teardown),
    cmocka_unit_test_setup_teardown(test_mongo_down_is_503, setup, wt_sink_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
