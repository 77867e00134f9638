/* test_request_deadline.c - a hung MongoDB bounds every request instead of hanging it
 *
 * One devmongod, paused with SIGSTOP (it keeps accepting connections and never answers, as a
 * hung server does), and `outboxd --roles api` with api.request_timeout=1s. Paused: /readyz
 * answers 503 within 1 s; POST /orders and GET /orders/:id answer 503 within the deadline (plus
 * scheduling slack); after SIGCONT the abandoned order is never committed (its transaction was
 * aborted, not retried until MongoDB came back), while a new order commits. */
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define REQUEST_TIMEOUT_MS 1000
#define SLACK_MS 1500          /* scheduling on 2 busy cores */
#define READYZ_BOUND_MS 1000

static obx_test_mongo_t mongo;
static mongoc_client_t *client;
static obx_test_outboxd_t outboxd;
static char keys_path[300], key[64];
static bool paused;

static void pause_mongo(bool on) {
  assert_int_equal(kill(mongo.proc.pid, on ? SIGSTOP : SIGCONT), 0);
  paused = on;
}

static int group_setup(void **state) {
  if (obx_test_fixture_mongo_setup(&mongo, NULL, &client) != 0) return -1;
  snprintf(keys_path, sizeof keys_path, "%s/api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "acme", "orders:write,orders:read", key);
  char mongo_arg[300], keys_arg[340], timeout_arg[64];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  snprintf(timeout_arg, sizeof timeout_arg, "api.request_timeout=%d", REQUEST_TIMEOUT_MS);
  char *args[] = {"--roles", "api", "-X", mongo_arg, "-X", keys_arg, "-X", timeout_arg, NULL};
  if (!obx_test_outboxd_start(&outboxd, args)) return -1;
  return obx_test_wait_for(obx_test_http_ready, &outboxd.port, 30000, 100) ? 0 : -1;
}

static int group_teardown(void **state) {
  if (paused) kill(mongo.proc.pid, SIGCONT);
  int status = obx_test_outboxd_stop(&outboxd);
  obx_test_fixture_mongo_teardown(&mongo, client);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Makes the request and fails unless it answered want within bound_ms; returns the time taken. */
static int64_t timed(const char *method, const char *path, const char *body, long want, int64_t bound_ms) {
  obx_test_http_resp_t resp;
  int64_t t0 = obx_test_now_ms();
  assert_true(obx_test_http(outboxd.port, method, path, key, body, NULL, &resp));
  int64_t took = obx_test_now_ms() - t0;
  if (resp.status != want || took > bound_ms)
    fail_msg("%s %s: got %ld after %lld ms (%s), want %ld within %lld ms", method, path, resp.status, (long long)took,
             resp.body, want, (long long)bound_ms);
  if (want == 503 && strcmp(path, "/readyz") != 0) {
    char retry[16];
    if (!obx_test_http_header(&resp, "Retry-After", retry, sizeof retry)) fail_msg("%s %s: 503 without Retry-After", method, path);
  }
  obx_test_http_resp_cleanup(&resp);
  return took;
}

static int64_t orders_numbered(const char *number) {
  bson_t *filter = BCON_NEW("orderNumber", BCON_UTF8(number));
  bson_error_t berr;
  mongoc_collection_t *c = mongoc_client_get_collection(client, "outboxd", "orders");
  int64_t n = mongoc_collection_count_documents(c, filter, NULL, NULL, NULL, &berr);
  if (n < 0) fail_msg("count: %s", berr.message);
  mongoc_collection_destroy(c);
  bson_destroy(filter);
  return n;
}

static bool order_created(void *number) {
  char body[200];
  snprintf(body, sizeof body, "{\"customerEmail\": \"a@company.com\", \"amount\": \"1.00\", \"orderNumber\": \"%s\"}",
           (const char *)number);
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(outboxd.port, "POST", "/orders", key, body, NULL, &resp) && resp.status == 201;
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

static void test_readyz_within_a_second(void **state) {
  pause_mongo(true);
  int64_t worst = 0;
  for (int i = 0; i < 3; i++) {
    int64_t took = timed("GET", "/readyz", NULL, 503, READYZ_BOUND_MS);
    if (took > worst) worst = took;
  }
  pause_mongo(false);
  assert_true(obx_test_wait_for(obx_test_http_ready, &outboxd.port, 20000, 100));
  print_message("/readyz with MongoDB paused: 503 in %lld ms at worst\n", (long long)worst);
}

static void test_abandoned_order_never_commits(void **state) {
  pause_mongo(true);
  int64_t post = timed("POST", "/orders", "{\"customerEmail\": \"a@company.com\", \"amount\": \"1.00\", \"orderNumber\": \"DL-ABANDONED\"}",
                       503, REQUEST_TIMEOUT_MS + SLACK_MS);
  int64_t get = timed("GET", "/orders/no-such-order", NULL, 503, REQUEST_TIMEOUT_MS + SLACK_MS);
  pause_mongo(false);
  /* MongoDB works again: a new order commits ... */
  if (!obx_test_wait_for(order_created, "DL-AFTER", 20000, 200)) fail_msg("no order committed after SIGCONT");
  /* ... and the abandoned one never does (the old code retried its transaction until MongoDB
   * answered and committed it seconds after its client had been told 503) */
  int64_t until = obx_test_now_ms() + 5000;
  while (obx_test_now_ms() < until) {
    if (orders_numbered("DL-ABANDONED") != 0) fail_msg("the order abandoned with 503 was committed after SIGCONT");
    poll(NULL, 0, 100);
  }
  assert_int_equal(orders_numbered("DL-AFTER"), 1);
  print_message("MongoDB paused: POST /orders 503 in %lld ms, GET /orders/:id 503 in %lld ms (api.request_timeout %d ms)\n",
                (long long)post, (long long)get, REQUEST_TIMEOUT_MS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_readyz_within_a_second),
    cmocka_unit_test(test_abandoned_order_never_commits),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
