/* test_devmongo_failpoint.c - devmongod fail points (failCommand, failGetMoreAfterCursorCheckout)
 *
 * DESIGN: one devmongod per group. Each test configures a fail point through the driver,
 * observes the effect through the driver, and switches it off again; the "count" field of the
 * configureFailPoint reply tells how often the previous configuration fired. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_fixture.h"

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;

static int setup(void **state) { return obx_test_fixture_mongo_setup(&g_m, NULL, &g_client); }

static int teardown(void **state) { return obx_test_fixture_mongo_teardown(&g_m, g_client); }

static int64_t fail_point(const char *json) { return obx_test_fail_point(g_client, json); }

static int64_t fail_off(const char *name) {
  char json[128];
  snprintf(json, sizeof json, "{\"configureFailPoint\": \"%s\", \"mode\": \"off\"}", name);
  return fail_point(json);
}

/* Runs {cmd: 1} on admin (never retried by the driver); returns the error code, 0 on success. */
static uint32_t run_cmd(mongoc_client_t *client, const char *cmd_name, bson_t *reply_out) {
  bson_t *cmd = BCON_NEW(cmd_name, BCON_INT32(1));
  bson_t reply;
  bson_error_t error;
  bool ok = mongoc_client_command_simple(client, "admin", cmd, NULL, &reply, &error);
  bson_destroy(cmd);
  if (reply_out) bson_copy_to(&reply, reply_out);
  bson_destroy(&reply);
  return ok ? 0 : error.code ? error.code : 1;
}

static void test_times_always_off(void **state) {
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 2}, \"data\": "
             "{\"failCommands\": [\"ping\"], \"errorCode\": 2}}");
  assert_int_equal(run_cmd(g_client, "buildInfo", NULL), 0); /* not listed: untouched, not counted */
  assert_int_equal(run_cmd(g_client, "ping", NULL), 2);
  assert_int_equal(run_cmd(g_client, "ping", NULL), 2);
  assert_int_equal(run_cmd(g_client, "ping", NULL), 0);
  assert_int_equal(fail_off("failCommand"), 2);
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": \"alwaysOn\", \"data\": "
             "{\"failCommands\": [\"ping\"], \"errorCode\": 2}}");
  for (int i = 0; i < 5; i++) assert_int_equal(run_cmd(g_client, "ping", NULL), 2);
  assert_int_equal(fail_off("failCommand"), 5);
  assert_int_equal(run_cmd(g_client, "ping", NULL), 0);
  /* skip: the first N matching commands pass, then it stays on */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"skip\": 2}, \"data\": "
             "{\"failCommands\": [\"ping\"], \"errorCode\": 2}}");
  assert_int_equal(run_cmd(g_client, "ping", NULL), 0);
  assert_int_equal(run_cmd(g_client, "ping", NULL), 0);
  assert_int_equal(run_cmd(g_client, "ping", NULL), 2);
  assert_int_equal(run_cmd(g_client, "ping", NULL), 2);
  assert_int_equal(fail_off("failCommand"), 2);
}

static void test_error_labels(void **state) {
  bson_t reply;
  /* explicit labels replace the server's */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"ping\"], \"errorCode\": 10107, \"errorLabels\": [\"Custom\"]}}");
  assert_int_equal(run_cmd(g_client, "ping", &reply), 10107);
  assert_true(mongoc_error_has_label(&reply, "Custom"));
  assert_false(mongoc_error_has_label(&reply, "RetryableWriteError"));
  bson_destroy(&reply);
  /* without them a retryable insert gets RetryableWriteError: the driver retries and succeeds */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"insert\"], \"errorCode\": 10107}}");
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "fp", "labels");
  bson_error_t error;
  bson_t *doc = BCON_NEW("_id", BCON_INT32(1));
  assert_true(mongoc_collection_insert_one(c, doc, NULL, NULL, &error));
  assert_int_equal(fail_off("failCommand"), 1);
  assert_int_equal(mongoc_collection_estimated_document_count(c, NULL, NULL, NULL, &error), 1);
  /* a non-retriable code is not labelled and surfaces */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"insert\"], \"errorCode\": 11601}}");
  bson_t *doc2 = BCON_NEW("_id", BCON_INT32(2));
  assert_false(mongoc_collection_insert_one(c, doc2, NULL, &reply, &error));
  assert_int_equal(error.code, 11601);
  assert_false(mongoc_error_has_label(&reply, "RetryableWriteError"));
  bson_destroy(&reply);
  bson_destroy(doc);
  bson_destroy(doc2);
  mongoc_collection_destroy(c);
}

static void test_close_connection(void **state) {
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"ping\"], \"closeConnection\": true}}");
  bson_t *cmd = BCON_NEW("ping", BCON_INT32(1));
  bson_error_t error;
  bson_t reply;
  assert_false(mongoc_client_command_simple(g_client, "admin", cmd, NULL, &reply, &error));
  assert_int_equal(error.domain, MONGOC_ERROR_STREAM);
  bson_destroy(&reply);
  assert_true(mongoc_client_command_simple(g_client, "admin", cmd, NULL, &reply, &error));
  bson_destroy(&reply);
  bson_destroy(cmd);
}

typedef struct {
  uint32_t code;
  int64_t took_ms;
  volatile int done;
} blocked_t;

static void *blocked_ping(void *p) {
  blocked_t *b = p;
  mongoc_client_t *client = obx_test_mongo_client(&g_m, NULL, "blocked-app");
  int64_t t0 = obx_test_now_ms();
  b->code = run_cmd(client, "ping", NULL);
  b->took_ms = obx_test_now_ms() - t0;
  mongoc_client_destroy(client);
  __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void test_block_connection_and_app_name(void **state) {
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"ping\"], \"appName\": \"blocked-app\", \"blockConnection\": true, "
             "\"blockTimeMS\": 3000, \"errorCode\": 91}}");
  /* another application is neither blocked nor counted */
  assert_int_equal(run_cmd(g_client, "ping", NULL), 0);
  blocked_t b = {0};
  pthread_t th;
  pthread_create(&th, NULL, blocked_ping, &b);
  /* while that command waits, this connection keeps being served: with a server that slept,
   * one of these pings would take the whole block time */
  int pings = 0;
  int64_t worst = 0;
  while (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE)) {
    int64_t t0 = obx_test_now_ms();
    assert_int_equal(run_cmd(g_client, "ping", NULL), 0);
    if (obx_test_now_ms() - t0 > worst) worst = obx_test_now_ms() - t0;
    pings++;
  }
  pthread_join(th, NULL);
  assert_int_equal(b.code, 91);
  if (b.took_ms < 2900) fail_msg("blocked ping took %lld ms, want >= 3000", (long long)b.took_ms);
  if (pings < 3 || worst >= 2000)
    fail_msg("%d pings, slowest %lld ms, while one connection was blocked 3000 ms", pings, (long long)worst);
  assert_int_equal(fail_off("failCommand"), 1);
}

static void test_write_concern_error(void **state) {
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"insert\"], \"writeConcernError\": {\"code\": 100, "
             "\"codeName\": \"UnsatisfiableWriteConcern\", \"errmsg\": \"Not enough data-bearing nodes\"}}}");
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "fp", "wce");
  bson_error_t error;
  bson_t reply;
  bson_t *doc = BCON_NEW("_id", BCON_INT32(1));
  /* the write happens, the reply carries the writeConcernError */
  assert_false(mongoc_collection_insert_one(c, doc, NULL, &reply, &error));
  assert_int_equal(error.code, 100);
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, &reply, "writeConcernErrors"));
  bson_destroy(&reply);
  assert_int_equal(mongoc_collection_estimated_document_count(c, NULL, NULL, NULL, &error), 1);
  bson_destroy(doc);
  mongoc_collection_destroy(c);
  assert_int_equal(fail_off("failCommand"), 1);
}

static void test_fail_get_more_after_checkout(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "fp", "getmore");
  bson_error_t error;
  for (int i = 0; i < 5; i++) {
    bson_t *doc = BCON_NEW("i", BCON_INT32(i));
    assert_true(mongoc_collection_insert_one(c, doc, NULL, NULL, &error));
    bson_destroy(doc);
  }
  fail_point("{\"configureFailPoint\": \"failGetMoreAfterCursorCheckout\", \"mode\": {\"times\": 1}, "
             "\"data\": {\"errorCode\": 96}}");
  bson_t filter = BSON_INITIALIZER;
  bson_t *opts = BCON_NEW("batchSize", BCON_INT32(2));
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, &filter, opts, NULL);
  const bson_t *doc;
  int n = 0;
  while (mongoc_cursor_next(cur, &doc)) n++;
  assert_int_equal(n, 2); /* first batch only */
  assert_true(mongoc_cursor_error(cur, &error));
  assert_int_equal(error.code, 96);
  mongoc_cursor_destroy(cur);
  assert_int_equal(fail_off("failGetMoreAfterCursorCheckout"), 1);
  bson_destroy(opts);
  mongoc_collection_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_times_always_off),
    cmocka_unit_test(test_error_labels),
    cmocka_unit_test(test_close_connection),
    cmocka_unit_test(test_block_connection_and_app_name),
    cmocka_unit_test(test_write_concern_error),
    cmocka_unit_test(test_fail_get_more_after_checkout),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
