/* test_worker_http.c - WORKER_SOURCE=http: the CloudEvents sink (Knative mode)
 *
 * DESIGN: the worker runs in process on a real HTTP server (obx_http, port 0) with the same
 * devmongod / RabbitMQ / scripted ERP fixture as the Kafka tests. Binary and structured
 * CloudEvents go through the same inbox, pipeline and ladder path; the reply is 200 once the
 * outcome is durable, 400 for something that is not a CloudEvent and 503 when MongoDB is
 * down, so the broker delivers again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_http.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

typedef struct {
  wt_fx_t *fx;
  obx_http_t *http;
  int port;
} sink_fx_t;

static int setup(void **state) {
  if (!getenv("AMQP_URL")) return 0;
  sink_fx_t *s = calloc(1, sizeof *s);
  s->fx = wt_setup(1, NULL);
  wt_conf_set(s->fx, "worker.source", "http");
  wt_conf_set(s->fx, "http.port", "0");
  wt_conf_set(s->fx, "http.bind", "127.0.0.1");
  obx_err_t err = OBX_ERR_INIT;
  s->http = obx_http_new(&s->fx->conf, &err);
  if (!s->http) fail_msg("http: %s", err.msg);
  s->fx->worker = obx_worker_new(&s->fx->conf, s->http, &err);
  if (!s->fx->worker) fail_msg("worker: %s", err.msg);
  if (!obx_http_start(s->http, &err)) fail_msg("http start: %s", err.msg);
  s->port = obx_http_port(s->http);
  *state = s;
  return 0;
}

static int teardown(void **state) {
  sink_fx_t *s = *state;
  if (!s) return 0;
  obx_http_stop(s->http);
  obx_worker_destroy(s->fx->worker);
  s->fx->worker = NULL;
  obx_http_destroy(s->http);
  wt_teardown(s->fx);
  free(s);
  return 0;
}

/* Sends method path (body NULL: none) to the sink with the given headers, whose Content-Type
 * replaces the shared helper's default. Returns the status (0: no answer); the response body
 * is copied to out. */
static long call(sink_fx_t *s, const char *method, const char *path, const char *body, const char *const headers[],
                 char *out, size_t outlen) {
  obx_test_http_resp_t resp;
  obx_test_http(s->port, method, path, NULL, body, headers, &resp);
  snprintf(out, outlen, "%s", resp.body);
  long status = resp.status;
  obx_test_http_resp_cleanup(&resp);
  return status;
}

static long post(sink_fx_t *s, const char *body, const char *const headers[], char *out, size_t outlen) {
  return call(s, "POST", "/", body, headers, out, outlen);
}

static void test_binary_and_structured_events(void **state) {
  WT_NEED_BROKER();
  sink_fx_t *s = *state;
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
                          "ce-time: 2026-11-29T18:00:00.000Z", "Content-Type: application/json", NULL};
  long status = post(s, "{\"orderNumber\": \"H-1\"}", binary, out, sizeof out);
  if (status != 200) fail_msg("binary event: got %ld (%s), want 200", status, out);
  assert_non_null(strstr(out, "\"done\""));
  wt_wait_status(fx, id1, "DONE"); /* durable before the reply: already there */
  assert_int_equal(wt_erp_calls(fx, "H-1"), 1);

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
           " \"time\": \"2026-11-29T18:00:01.000Z\", \"datacontenttype\": \"application/json\","
           " \"data\": {\"orderNumber\": \"H-2\"}}",
           id2);
  const char *ce_json[] = {"Content-Type: application/cloudevents+json", NULL};
  status = post(s, structured, ce_json, out, sizeof out);
  if (status != 200) fail_msg("structured event: got %ld (%s), want 200", status, out);
  assert_non_null(strstr(out, "\"retrying\""));
  wt_wait_status(fx, id2, "RETRYING");
  wt_route(fx, "H-2", 200);
  wt_wait_status(fx, id2, "DONE"); /* the work queue ran it again */

  /* Not a CloudEvent. */
  const char *plain[] = {"Content-Type: application/json", NULL};
  status = post(s, "{\"hello\": 1}", plain, out, sizeof out);
  if (status != 400) fail_msg("plain JSON: got %ld (%s), want 400", status, out);
}

static void test_mongo_down_is_503(void **state) {
  WT_NEED_BROKER();
  sink_fx_t *s = *state;
  obx_test_mongo_stop(&s->fx->m);
  char id[OBX_UUID_LEN + 1], hdr_id[64], out[1024];
  obx_uuid7(id);
  snprintf(hdr_id, sizeof hdr_id, "ce-id: %s", id);
  const char *binary[] = {"ce-specversion: 1.0", hdr_id, "ce-type: OrderConfirmed", "ce-source: /test/orders",
                          "ce-subject: Order/HK-3", "ce-partitionkey: HK-3", "ce-orgid: " WT_ORG,
                          "ce-time: 2026-11-29T18:00:00.000Z", "Content-Type: application/json", NULL};
  long status = post(s, "{\"orderNumber\": \"H-3\"}", binary, out, sizeof out);
  if (status != 503) fail_msg("with MongoDB down: got %ld (%s), want 503", status, out);
  /* And the sink says it is not ready, so no traffic is routed to it. */
  char body[1024];
  long ready = call(s, "GET", "/readyz", NULL, NULL, body, sizeof body);
  if (ready != 503) fail_msg("/readyz with MongoDB down: got %ld (%s), want 503", ready, body);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_binary_and_structured_events, setup, teardown),
    cmocka_unit_test_setup_teardown(test_mongo_down_is_503, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
