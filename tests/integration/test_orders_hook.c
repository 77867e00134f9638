/* test_orders_hook.c - the order.pre hook contract of POST /orders (obx_api.h)
 *
 * The api role runs in this process on devmongod with a test hook standing in for the
 * pipeline engine: execute may reject (422) or fail transiently (503) before anything is
 * written; commit writes inside the order's transaction (its events land with the order, and
 * its failure leaves nothing); release is called once per execute. */
#include "obx_test.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_api.h"
#include "obx/obx_http.h"
#include "obx/obx_outbox.h"

static obx_test_mongo_t mongo;
static mongoc_client_t *client;
static obx_conf_t conf;
static obx_http_t *http;
static void *api;
static char key[64];
static int executes, releases;
static pthread_mutex_t counts_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *order_str(const bson_t *order, const char *field) {
  bson_iter_t it;
  return bson_iter_init_find(&it, order, field) && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
}

/* run = the order's number and id, "NUMBER ID". */
static bool hook_execute(void *ctx, const char *org_id, const bson_t *order, void **run, obx_err_t *err) {
  const char *email = order_str(order, "customerEmail");
  pthread_mutex_lock(&counts_mu);
  executes++;
  pthread_mutex_unlock(&counts_mu);
  if (strncmp(email, "reject@", 7) == 0) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "order.pre: customer %s is blocked", email);
    return false;
  }
  if (strncmp(email, "later@", 6) == 0) {
    obx_err_set(err, OBX_ERR_CURL, 503, true, "order.pre: credit check unavailable");
    return false;
  }
  char *state = malloc(160);
  snprintf(state, 160, "%s %s", order_str(order, "orderNumber"), order_str(order, "_id"));
  *run = state;
  return true;
}

/* Appends an OrderScreened event for the order, or fails for numbers starting HOOKFAIL. */
static bool hook_commit(void *ctx, void *run, mongoc_client_session_t *session, obx_err_t *err) {
  char number[80], id[80];
  sscanf(run, "%79s %79s", number, id);
  if (strncmp(number, "HOOKFAIL", 8) == 0) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "order.pre: emit-event failed");
    return false;
  }
  obx_event_t ev;
  obx_event_init(&ev);
  ev.event_type = strdup("OrderScreened");
  ev.org_id = strdup("acme");
  ev.aggregate_type = strdup("Order");
  ev.aggregate_id = strdup(id);
  BSON_APPEND_UTF8(&ev.payload, "orderNumber", number);
  mongoc_collection_t *outbox =
    mongoc_client_get_collection(mongoc_client_session_get_client(session), "outboxd", "outbox");
  bool ok = obx_event_finalize(&ev, err) && obx_outbox_append(session, outbox, &ev, err);
  mongoc_collection_destroy(outbox);
  obx_event_cleanup(&ev);
  return ok;
}

static void hook_release(void *ctx, void *run) {
  pthread_mutex_lock(&counts_mu);
  releases++;
  pthread_mutex_unlock(&counts_mu);
  free(run);
}

static int64_t count(const char *coll, const char *field, const char *value) {
  bson_t filter = BSON_INITIALIZER;
  const bson_t *doc;
  int64_t n = 0;
  BSON_APPEND_UTF8(&filter, field, value);
  mongoc_collection_t *c = mongoc_client_get_collection(client, "outboxd", coll);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, NULL, NULL);
  while (mongoc_cursor_next(cursor, &doc)) n++;
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  bson_destroy(&filter);
  return n;
}

static int group_teardown(void **state) {
  obx_http_stop(http);
  obx_api_stop(api);
  obx_http_destroy(http);
  api = http = NULL;
  obx_api_set_pre_hook(NULL);
  obx_conf_cleanup(&conf);
  if (client) mongoc_client_destroy(client);
  client = NULL;
  obx_test_mongo_stop(&mongo);
  return 0;
}

static int group_setup(void **state) {
  char keys_path[300], uri_arg[300], keys_arg[340];
  char *overrides[] = {uri_arg, keys_arg, "http.port=0", "http.bind=127.0.0.1"};
  obx_err_t err = OBX_ERR_INIT;
  static const obx_api_pre_hook_t hook = {hook_execute, hook_commit, hook_release, NULL};
  obx_conf_init(&conf);
  if (!obx_test_mongo_start(&mongo, NULL)) return -1;
  client = obx_test_mongo_client(&mongo, NULL, "test_orders_hook");
  snprintf(keys_path, sizeof keys_path, "%s/hook-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "acme", "orders:write", key);
  snprintf(uri_arg, sizeof uri_arg, "mongo.uri=%s", mongo.uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  obx_api_set_pre_hook(&hook);
  if (!obx_conf_load(&conf, NULL, (char *const[]){NULL}, overrides, 4, &err) || !(http = obx_http_new(&conf, &err)) ||
      !obx_http_start(http, &err) || !(api = obx_api_start(&conf, http, &err)) ||
      !obx_test_wait_for(obx_test_http_ready, &(int){obx_http_port(http)}, 60000, 50)) {
    fprintf(stderr, "setup: %s\n", err.msg[0] ? err.msg : "api never became ready");
    group_teardown(state);
    return -1;
  }
  return 0;
}

static void post(const char *email, const char *number, obx_test_http_resp_t *resp) {
  char body[256];
  snprintf(body, sizeof body, "{\"customerEmail\": \"%s\", \"amount\": \"9.99\", \"orderNumber\": \"%s\"}", email, number);
  assert_true(obx_test_http(obx_http_port(http), "POST", "/orders", key, body, NULL, resp));
}

static void test_hook(void **state) {
  static const struct {
    const char *name, *email, *number;
    long want_status;
    int want_orders, want_events; /* OrderConfirmed + OrderScreened when the hook commits */
  } cases[] = {
    {"hook events join the order", "ok@b.co", "HOOK-OK", 201, 1, 2},
    {"execute rejects", "reject@b.co", "HOOK-REJECT", 422, 0, 0},
    {"execute transient", "later@b.co", "HOOK-LATER", 503, 0, 0},
    {"commit fails", "ok@b.co", "HOOKFAIL-1", 500, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_http_resp_t resp;
    post(cases[i].email, cases[i].number, &resp);
    int64_t orders = count("orders", "orderNumber", cases[i].number);
    int64_t events = count("outbox", "payload.orderNumber", cases[i].number);
    if (resp.status != cases[i].want_status || orders != cases[i].want_orders || events != cases[i].want_events) {
      print_error("%s: got %ld %s, %lld orders, %lld events; want %ld, %d, %d\n", cases[i].name, resp.status,
                  resp.body, (long long)orders, (long long)events, cases[i].want_status, cases[i].want_orders,
                  cases[i].want_events);
      fail();
    }
    obx_test_http_resp_cleanup(&resp);
  }
  pthread_mutex_lock(&counts_mu);
  int e = executes, r = releases;
  pthread_mutex_unlock(&counts_mu);
  /* rejected and failed executes hold no run; every run handed out is released */
  if (e != 4 || r != 2) {
    print_error("got %d executes and %d releases, want 4 and 2\n", e, r);
    fail();
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_hook),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
