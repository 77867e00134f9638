/* test_ops_idle.c - the operators' API keeps its RabbitMQ connection through idle periods
 *
 * `outboxd --roles api` with RabbitMQ: GET /api/status reaches RabbitMQ (the DLQ depth), then
 * nothing happens for 3 minutes — longer than the broker waits for a silent peer (2 heartbeat
 * intervals) — and GET /api/status answers 200 with the depth on the same connection: outboxd's
 * log shows one connection of the API's ladder, not a reconnect. Without heartbeats the broker
 * closes the connection after about a minute and the next calls answered 503. The 3 minutes are
 * what the test is about (an idle period), not a wait for a condition. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define IDLE_MS (3 * 60 * 1000)

static int count_lines(const char *path, const char *needle) {
  char *text = obx_test_read_file(path);
  int n = 0;
  for (const char *p = text; p && (p = strstr(p, needle)); p++) n++;
  free(text);
  return n;
}

static void test_status_after_idle(void **state) {
  (void)state;
  obx_test_require(getenv("AMQP_URL") != NULL, "AMQP_URL not set: this test needs RabbitMQ");
  obx_test_mongo_t mongo;
  if (!obx_test_mongo_start(&mongo, NULL)) fail_msg("devmongod did not start");
  char keys_path[300], key[64], mongo_arg[300], keys_arg[340], amqp_arg[600], prefix_arg[100];
  snprintf(keys_path, sizeof keys_path, "%s/idle-api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "acme", "status:read", key);
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  snprintf(amqp_arg, sizeof amqp_arg, "amqp.url=%s", getenv("AMQP_URL"));
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=idle.%d", (int)getpid());
  char *args[] = {"--roles", "api", "-X", mongo_arg, "-X", keys_arg, "-X", amqp_arg, "-X", prefix_arg, NULL};
  obx_test_outboxd_t d;
  memset(&d, 0, sizeof d);
  if (!obx_test_outboxd_start(&d, args)) fail_msg("outboxd did not start");
  if (!obx_test_wait_for(obx_test_http_ready, &d.port, 60000, 50)) fail_msg("outboxd never became ready");

  obx_test_http_resp_t resp;
  obx_test_http_expect(d.port, "GET", "/api/status", key, NULL, 200, &resp);
  if (obx_test_doc_int(&resp.json, "dlq.depth") < 0) fail_msg("status before the idle period: no DLQ depth: %s", resp.body);
  obx_test_http_resp_cleanup(&resp);
  const char *connected = "(outboxd ladder)\"";
  int before = count_lines(d.proc.log_path, connected);
  if (before != 1) fail_msg("API ladder connections before idling: got %d, want 1; log %s", before, d.proc.log_path);

  int64_t end = obx_test_now_ms() + IDLE_MS;
  while (obx_test_now_ms() < end) usleep(500 * 1000);

  int64_t t0 = obx_test_now_ms();
  obx_test_http_expect(d.port, "GET", "/api/status", key, NULL, 200, &resp);
  int64_t took = obx_test_now_ms() - t0;
  if (obx_test_doc_int(&resp.json, "dlq.depth") < 0) fail_msg("status after 3 minutes idle: no DLQ depth: %s", resp.body);
  obx_test_http_resp_cleanup(&resp);
  int after = count_lines(d.proc.log_path, connected);
  printf("after %d s idle: GET /api/status 200 in %lld ms; API ladder connections %d -> %d\n", IDLE_MS / 1000,
         (long long)took, before, after);
  if (after != before) fail_msg("the API's RabbitMQ connection was lost while idle (%d connections); log %s", after, d.proc.log_path);
  if (count_lines(d.proc.log_path, "connection lost") != 0) fail_msg("the log reports a lost connection: %s", d.proc.log_path);

  int status = obx_test_outboxd_stop(&d);
  obx_test_mongo_stop(&mongo);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("outboxd: status 0x%x", status);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_status_after_idle)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
