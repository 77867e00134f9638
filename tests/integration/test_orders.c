/* test_orders.c - POST /orders against devmongod through the real outboxd binary
 *
 * One devmongod and one `outboxd --roles api` serve every test of the group (each test uses
 * its own order numbers and idempotency keys); the MongoDB-down test runs its own pair. */
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static obx_test_mongo_t mongo;
static obx_test_outboxd_t outboxd;
static mongoc_client_t *client;
static char keys_path[300];
static char key_acme[64], key_globex[64], key_reader[64];

/* Processes a single test starts; stopped by test_teardown even when the test fails. */
static obx_test_outboxd_t extra_outboxd;
static obx_test_mongo_t extra_mongo;

static const char seed_body[] = "{\"customerEmail\": \"customer@company.com\", \"amount\": \"149.90\"}";

/* ---- helpers ----------------------------------------------------------------------------- */

/* Documents of coll matching filter_json (a plain find: no aggregation needed). */
static int64_t count(const char *coll, const char *filter_json) {
  bson_error_t berr;
  bson_t filter;
  const bson_t *doc;
  int64_t n = 0;
  assert_true(bson_init_from_json(&filter, filter_json, -1, &berr));
  mongoc_collection_t *c = mongoc_client_get_collection(client, "outboxd", coll);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, NULL, NULL);
  while (mongoc_cursor_next(cursor, &doc)) n++;
  if (mongoc_cursor_error(cursor, &berr)) {
    print_error("count %s %s: %s\n", coll, filter_json, berr.message);
    fail();
  }
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  bson_destroy(&filter);
  return n;
}

/* The first document of coll matching {field: value}; false when none. */
static bool find_one(const char *coll, const char *field, const char *value, bson_t *out) {
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, field, value);
  mongoc_collection_t *c = mongoc_client_get_collection(client, "outboxd", coll);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, NULL, NULL);
  const bson_t *doc;
  bool found = mongoc_cursor_next(cursor, &doc);
  if (found) bson_copy_to(doc, out);
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  bson_destroy(&filter);
  return found;
}

static int64_t failpoint(const char *json) { return obx_test_fail_point(client, json); }

static int64_t failpoint_off(void) {
  return failpoint("{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
}

/* The value of one series in outboxd's /metrics (0 when absent): an unlabelled metric's name or
 * name{label="value",...} with the labels in the order the metric declares them. */
static double metric(const char *series) {
  obx_test_http_resp_t resp;
  char needle[256];
  double v = 0;
  assert_true(obx_test_http(outboxd.port, "GET", "/metrics", NULL, NULL, NULL, &resp));
  snprintf(needle, sizeof needle, "\n%s ", series);
  const char *p = strstr(resp.body, needle);
  if (p) v = strtod(p + strlen(needle), NULL);
  obx_test_http_resp_cleanup(&resp);
  return v;
}

#define TXN_COMMITTED "outboxd_mongo_transactions_total{result=\"committed\"}"
#define TXN_CONFLICT "outboxd_mongo_transactions_total{result=\"conflict\"}"
#define TXN_FAILED "outboxd_mongo_transactions_total{result=\"failed\"}"

typedef struct {
  double committed, conflict, failed;
} txn_counts_t;

static txn_counts_t txn_counts(void) {
  return (txn_counts_t){metric(TXN_COMMITTED), metric(TXN_CONFLICT), metric(TXN_FAILED)};
}

/* The transaction outcomes counted since `before` are exactly the wanted ones. */
static void expect_txn_delta(txn_counts_t before, double committed, double conflict, double failed, const char *what) {
  txn_counts_t now = txn_counts();
  txn_counts_t got = {now.committed - before.committed, now.conflict - before.conflict, now.failed - before.failed};
  if (got.committed != committed || got.conflict != conflict || got.failed != failed) {
    print_error("%s: transactions committed/conflict/failed went up by %g/%g/%g, want %g/%g/%g\n", what,
                got.committed, got.conflict, got.failed, committed, conflict, failed);
    fail();
  }
}

static void post_order(const char *key, const char *body, const char *idem_key, obx_test_http_resp_t *resp) {
  char header[300];
  const char *headers[] = {header, NULL};
  snprintf(header, sizeof header, "Idempotency-Key: %s", idem_key ? idem_key : "");
  assert_true(obx_test_http(outboxd.port, "POST", "/orders", key, body, idem_key ? headers : NULL, resp));
}

static void expect_status(const obx_test_http_resp_t *resp, long want, const char *what) {
  if (resp->status != want) {
    print_error("%s: got HTTP %ld %s, want %ld\n", what, resp->status, resp->body, want);
    fail();
  }
}

/* extra: one more "key=value" setting, or NULL. */
static bool start_outboxd(obx_test_outboxd_t *d, const char *uri, const char *extra) {
  char mongo_arg[300], keys_arg[340];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  char *args[] = {"--roles", "api", "-X", mongo_arg, "-X", keys_arg, "-X", "http.max_body=4096",
                  extra ? "-X" : NULL, (char *)extra, NULL};
  return obx_test_outboxd_start(d, args);
}

static int group_teardown(void **state) {
  int status = obx_test_outboxd_stop(&outboxd);
  if (client) mongoc_client_destroy(client);
  client = NULL;
  obx_test_mongo_stop(&mongo);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int group_setup(void **state) {
  if (!obx_test_mongo_start(&mongo, NULL)) return -1;
  client = obx_test_mongo_client(&mongo, NULL, "test_orders");
  snprintf(keys_path, sizeof keys_path, "%s/api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "acme", "orders:write,orders:read", key_acme);
  obx_test_apikey_add(keys_path, "globex", "orders:write,orders:read", key_globex);
  obx_test_apikey_add(keys_path, "acme", "orders:read", key_reader);
  if (start_outboxd(&outboxd, mongo.uri, NULL) && obx_test_wait_for(obx_test_http_ready, &outboxd.port, 60000, 50))
    return 0;
  fprintf(stderr, "outboxd never became ready; log: %s\n", outboxd.proc.log_path);
  group_teardown(state);
  return -1;
}

static int test_setup(void **state) {
  memset(&extra_outboxd, 0, sizeof extra_outboxd);
  memset(&extra_mongo, 0, sizeof extra_mongo);
  return 0;
}

static int test_teardown(void **state) {
  obx_test_outboxd_stop(&extra_outboxd);
  obx_test_mongo_stop(&extra_mongo);
  return 0;
}

/* ---- tests ------------------------------------------------------------------------------- */

/* Seed 001's payload as is: one order and one fat OrderConfirmed event, in MongoDB. */
static void test_create_seed_payload(void **state) {
  obx_test_http_resp_t resp;
  post_order(key_acme, seed_body, NULL, &resp);
  expect_status(&resp, 201, "POST seed payload");
  const char *id = obx_test_http_json_str(&resp, "id");
  const char *number = obx_test_http_json_str(&resp, "orderNumber");
  assert_non_null(id);
  assert_non_null(number);
  assert_true(strncmp(number, "ORD-", 4) == 0);
  assert_string_equal(obx_test_http_json_str(&resp, "totalAmount"), "149.90");
  bson_iter_t it, ids;
  assert_true(bson_iter_init_find(&it, &resp.json, "eventIds") && bson_iter_recurse(&it, &ids) && bson_iter_next(&ids));
  char event_id[64];
  snprintf(event_id, sizeof event_id, "%s", bson_iter_utf8(&ids, NULL));

  bson_t order, event;
  assert_true(find_one("orders", "_id", id, &order));
  assert_true(bson_iter_init_find(&it, &order, "totalAmount") && BSON_ITER_HOLDS_DECIMAL128(&it));
  bson_decimal128_t dec;
  char s[BSON_DECIMAL128_STRING];
  bson_iter_decimal128(&it, &dec);
  bson_decimal128_to_string(&dec, s);
  assert_string_equal(s, "149.90");
  assert_true(bson_iter_init_find(&it, &order, "orgId"));
  assert_string_equal(bson_iter_utf8(&it, NULL), "acme");
  assert_true(bson_iter_init_find(&it, &order, "currency"));
  assert_string_equal(bson_iter_utf8(&it, NULL), "BRL");

  assert_true(find_one("outbox", "_id", event_id, &event));
  static const struct {
    const char *path, *want;
  } fields[] = {{"eventType", "OrderConfirmed"}, {"status", "PENDING"},           {"orgId", "acme"},
                {"aggregateType", "Order"},      {"payload.totalAmount", "149.90"}, {"payload.customerEmail", "customer@company.com"}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    bson_iter_t f;
    const char *got = bson_iter_init(&it, &event) && bson_iter_find_descendant(&it, fields[i].path, &f) &&
                          BSON_ITER_HOLDS_UTF8(&f) ? bson_iter_utf8(&f, NULL) : "(missing)";
    if (strcmp(got, fields[i].want) != 0) {
      print_error("outbox.%s: got %s, want %s\n", fields[i].path, got, fields[i].want);
      fail();
    }
  }
  assert_true(bson_iter_init_find(&it, &event, "aggregateId"));
  assert_string_equal(bson_iter_utf8(&it, NULL), id);
  assert_true(bson_iter_init(&it, &event) && bson_iter_find_descendant(&it, "payload.orderNumber", &ids));
  assert_string_equal(bson_iter_utf8(&ids, NULL), number);
  bson_destroy(&event);
  bson_destroy(&order);

  /* GET by the owner; another org's key sees nothing. */
  char path[128];
  obx_test_http_resp_t got;
  snprintf(path, sizeof path, "/orders/%s", id);
  assert_true(obx_test_http(outboxd.port, "GET", path, key_reader, NULL, NULL, &got));
  expect_status(&got, 200, "GET own order");
  assert_string_equal(obx_test_http_json_str(&got, "totalAmount"), "149.90");
  assert_string_equal(obx_test_http_json_str(&got, "orderNumber"), number);
  obx_test_http_resp_cleanup(&got);
  assert_true(obx_test_http(outboxd.port, "GET", path, key_globex, NULL, NULL, &got));
  expect_status(&got, 404, "GET other org's order");
  obx_test_http_resp_cleanup(&got);
  obx_test_http_resp_cleanup(&resp);
}

static void test_items_totals(void **state) {
  const char *body =
    "{\"customerEmail\": \"a@b.co\", \"currency\": \"USD\", \"orderNumber\": \"ITEMS-1\","
    " \"externalCodes\": {\"erp\": \"E-1\"},"
    " \"items\": [{\"sku\": \"A\", \"quantity\": 3, \"unitPrice\": \"0.10\"},"
    "             {\"sku\": \"B\", \"quantity\": 7, \"unitPrice\": \"19.99\"}]}";
  obx_test_http_resp_t resp;
  post_order(key_acme, body, NULL, &resp);
  expect_status(&resp, 201, "POST items");
  assert_string_equal(obx_test_http_json_str(&resp, "orderNumber"), "ITEMS-1");
  assert_string_equal(obx_test_http_json_str(&resp, "totalAmount"), "140.23");
  assert_int_equal(count("outbox", "{\"payload.orderNumber\": \"ITEMS-1\", \"payload.externalCodes.erp\": \"E-1\"}"), 1);
  obx_test_http_resp_cleanup(&resp);
}

/* /metrics counts a POST: by route, method and status, in the route's latency histogram, and
 * its transaction as committed (nothing as conflict or failed). */
static void test_metrics_count_a_post(void **state) {
  static const char *const series[] = {
    "outboxd_http_requests_total{route=\"/orders\",method=\"POST\",status=\"201\"}",
    "outboxd_http_request_duration_seconds_count{route=\"/orders\"}",
    "outboxd_http_request_duration_seconds_bucket{route=\"/orders\",le=\"+Inf\"}",
  };
  enum { NSERIES = sizeof series / sizeof series[0] };
  double before[NSERIES];
  for (int i = 0; i < NSERIES; i++) before[i] = metric(series[i]);
  txn_counts_t txns = txn_counts();
  obx_test_http_resp_t resp;
  post_order(key_acme, "{\"customerEmail\": \"m@b.co\", \"amount\": \"3.00\", \"orderNumber\": \"METRICS-1\"}", NULL,
             &resp);
  expect_status(&resp, 201, "POST");
  obx_test_http_resp_cleanup(&resp);
  for (int i = 0; i < NSERIES; i++) {
    double got = metric(series[i]) - before[i];
    if (got != 1) {
      print_error("%s went up by %g, want 1\n", series[i], got);
      fail();
    }
  }
  expect_txn_delta(txns, 1, 0, 0, "one created order");
}

typedef struct {
  const char *name, *body, *fields;
} bad_case_t;

static void test_validation_table(void **state) {
  static const bad_case_t cases[] = {
    {"not json", "{customerEmail", "body"},
    {"two objects", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1.00\"}{\"amount\": \"2.00\"}", "body"},
    {"empty object", "{}", "customerEmail items"},
    {"bad email and float amount", "{\"customerEmail\": \"x\", \"amount\": 1.5}", "customerEmail amount"},
    {"bad items", "{\"customerEmail\": \"a@b.co\", \"items\": [{\"sku\": \"A\", \"quantity\": -1}]}",
     "items[0].quantity items[0].unitPrice"},
    {"unknown field", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1\", \"note\": \"x\"}", "note"},
  };
  int64_t orders_before = count("orders", "{}"), events_before = count("outbox", "{}");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_http_resp_t resp;
    post_order(key_acme, cases[i].body, NULL, &resp);
    char ctype[128] = "", got[256] = "";
    obx_test_http_header(&resp, "Content-Type", ctype, sizeof ctype);
    bson_iter_t it, arr, f;
    if (bson_iter_init_find(&it, &resp.json, "errors") && bson_iter_recurse(&it, &arr)) {
      while (bson_iter_next(&arr)) {
        bson_iter_t e;
        bson_iter_recurse(&arr, &e);
        if (bson_iter_find(&e, "field")) {
          f = e;
          size_t n = strlen(got);
          snprintf(got + n, sizeof got - n, "%s%s", n ? " " : "", bson_iter_utf8(&f, NULL));
        }
      }
    }
    if (resp.status != 400 || strcmp(ctype, "application/problem+json") != 0 || strcmp(got, cases[i].fields) != 0) {
      print_error("%s: got %ld %s [%s], want 400 application/problem+json [%s]\n", cases[i].name, resp.status, ctype,
                  got, cases[i].fields);
      fail();
    }
    obx_test_http_resp_cleanup(&resp);
  }
  assert_int_equal(count("orders", "{}"), orders_before);
  assert_int_equal(count("outbox", "{}"), events_before);
}

static void test_auth(void **state) {
  static const struct {
    const char *name, *method, *path, *key;
    long want;
  } cases[] = {
    {"no key", "POST", "/orders", NULL, 401},
    {"unknown key", "POST", "/orders", "obx_not-a-key", 401},
    {"key without orders:write", "POST", "/orders", "READER", 403},
    {"other org's id", "GET", "/orders/0190f000-0000-7000-8000-000000000000", "READER", 404},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_http_resp_t resp;
    const char *key = cases[i].key && strcmp(cases[i].key, "READER") == 0 ? key_reader : cases[i].key;
    assert_true(obx_test_http(outboxd.port, cases[i].method, cases[i].path, key, seed_body, NULL, &resp));
    if (resp.status != cases[i].want) {
      print_error("%s: got %ld %s, want %ld\n", cases[i].name, resp.status, resp.body, cases[i].want);
      fail();
    }
    obx_test_http_resp_cleanup(&resp);
  }
}

static void test_idempotency(void **state) {
  const char *body = "{\"customerEmail\": \"i@b.co\", \"amount\": \"10.00\", \"orderNumber\": \"IDEM-1\"}";
  const char *other = "{\"customerEmail\": \"i@b.co\", \"amount\": \"11.00\", \"orderNumber\": \"IDEM-2\"}";
  obx_test_http_resp_t first, again, mismatch;
  post_order(key_acme, body, "idem-key-1", &first);
  expect_status(&first, 201, "first POST");
  post_order(key_acme, body, "idem-key-1", &again);
  expect_status(&again, 201, "retried POST");
  assert_string_equal(first.body, again.body);
  char replayed[16] = "";
  assert_true(obx_test_http_header(&again, "Idempotent-Replayed", replayed, sizeof replayed));
  assert_int_equal(count("orders", "{\"orderNumber\": \"IDEM-1\"}"), 1);
  assert_int_equal(count("outbox", "{\"payload.orderNumber\": \"IDEM-1\"}"), 1);
  int64_t orders_before = count("orders", "{}"), events_before = count("outbox", "{}");
  post_order(key_acme, other, "idem-key-1", &mismatch);
  expect_status(&mismatch, 422, "same key, other body");
  assert_int_equal(count("orders", "{\"orderNumber\": \"IDEM-2\"}"), 0);
  assert_int_equal(count("outbox", "{\"payload.orderNumber\": \"IDEM-2\"}"), 0);
  assert_int_equal(count("orders", "{}"), orders_before);
  assert_int_equal(count("outbox", "{}"), events_before);
  /* Keys are per org: globex may use the same key for its own order. */
  obx_test_http_resp_t globex;
  post_order(key_globex, other, "idem-key-1", &globex);
  expect_status(&globex, 201, "same key, other org");
  obx_test_http_resp_cleanup(&globex);
  obx_test_http_resp_cleanup(&mismatch);
  obx_test_http_resp_cleanup(&again);
  obx_test_http_resp_cleanup(&first);
}

#define RACERS 4

typedef struct {
  const char *body, *idem_key; /* idem_key: NULL for none */
  pthread_barrier_t *barrier; /* NULL: start at once */
  long status;   /* out */
  char id[64];   /* out: the order id of a 201 */
} racer_t;

static void *race(void *arg) {
  racer_t *r = arg;
  obx_test_http_resp_t resp;
  if (r->barrier) pthread_barrier_wait(r->barrier);
  post_order(key_acme, r->body, r->idem_key, &resp);
  r->status = resp.status;
  const char *id = resp.status == 201 ? obx_test_http_json_str(&resp, "id") : NULL;
  snprintf(r->id, sizeof r->id, "%s", id ? id : "");
  obx_test_http_resp_cleanup(&resp);
  return NULL;
}

/* RACERS POSTs of body at once, released together. */
static void race_all(racer_t racers[RACERS], const char *body, const char *idem_key) {
  pthread_barrier_t barrier;
  pthread_t threads[RACERS];
  pthread_barrier_init(&barrier, NULL, RACERS);
  for (int i = 0; i < RACERS; i++) {
    racers[i] = (racer_t){.body = body, .idem_key = idem_key, .barrier = &barrier};
    pthread_create(&threads[i], NULL, race, &racers[i]);
  }
  for (int i = 0; i < RACERS; i++) pthread_join(threads[i], NULL);
  pthread_barrier_destroy(&barrier);
}

/* One wins; the others lose the race on {orgId, orderNumber}: 409, counted as conflicts, not
 * as failed transactions. */
static void test_concurrent_order_number(void **state) {
  const char *body = "{\"customerEmail\": \"r@b.co\", \"amount\": \"5.00\", \"orderNumber\": \"RACE-1\"}";
  racer_t racers[RACERS];
  txn_counts_t txns = txn_counts();
  race_all(racers, body, NULL);
  int created = 0, conflicts = 0;
  for (int i = 0; i < RACERS; i++) {
    created += racers[i].status == 201;
    conflicts += racers[i].status == 409;
  }
  if (created != 1 || conflicts != RACERS - 1) {
    print_error("got %d x 201 and %d x 409, want 1 and %d\n", created, conflicts, RACERS - 1);
    fail();
  }
  assert_int_equal(count("orders", "{\"orderNumber\": \"RACE-1\"}"), 1);
  assert_int_equal(count("outbox", "{\"payload.orderNumber\": \"RACE-1\"}"), 1);
  expect_txn_delta(txns, 1, RACERS - 1, 0, "a race for one order number");
}

/* No orderNumber in the body: every attempt generates its own number, so only the unique
 * {orgId, idempotencyKey} stops a second order. A retry replays the first answer; RACERS
 * concurrent first tries all get 201 with one id; one order and one event either way. */
static void test_idempotency_generated_number(void **state) {
  static const struct {
    const char *name, *email, *key;
    bool concurrent;
  } cases[] = {
    {"retried", "gen-seq@b.co", "idem-gen-seq", false},
    {"concurrent", "gen-race@b.co", "idem-gen-race", true},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char body[160], filter[160];
    snprintf(body, sizeof body, "{\"customerEmail\": \"%s\", \"amount\": \"7.00\"}", cases[c].email);
    racer_t racers[RACERS];
    int n = cases[c].concurrent ? RACERS : 2;
    txn_counts_t txns = txn_counts();
    if (cases[c].concurrent) {
      race_all(racers, body, cases[c].key);
    } else {
      for (int i = 0; i < n; i++) {
        racers[i] = (racer_t){.body = body, .idem_key = cases[c].key};
        race(&racers[i]);
      }
    }
    for (int i = 0; i < n; i++) {
      if (racers[i].status != 201 || racers[i].id[0] == '\0' || strcmp(racers[i].id, racers[0].id) != 0) {
        print_error("%s: POST %d got HTTP %ld id '%s', want 201 with the id of POST 0 '%s'\n", cases[c].name, i,
                    racers[i].status, racers[i].id, racers[0].id);
        fail();
      }
    }
    snprintf(filter, sizeof filter, "{\"customerEmail\": \"%s\"}", cases[c].email);
    int64_t orders = count("orders", filter);
    snprintf(filter, sizeof filter, "{\"payload.customerEmail\": \"%s\"}", cases[c].email);
    int64_t events = count("outbox", filter);
    snprintf(filter, sizeof filter, "{\"aggregateId\": \"%s\"}", racers[0].id);
    int64_t events_of_id = count("outbox", filter);
    if (orders != 1 || events != 1 || events_of_id != 1) {
      print_error("%s: got %lld orders, %lld events (%lld of order %s), want 1, 1 (1)\n", cases[c].name,
                  (long long)orders, (long long)events, (long long)events_of_id, racers[0].id);
      fail();
    }
    /* Losers of the race end on the duplicate key (conflict) or find the winner first (no
     * transaction): never a failed transaction. */
    txn_counts_t now = txn_counts();
    if (now.committed - txns.committed != 1 || now.failed != txns.failed ||
        now.conflict - txns.conflict > n - 1) {
      print_error("%s: transactions committed/conflict/failed went up by %g/%g/%g, want 1/at most %d/0\n",
                  cases[c].name, now.committed - txns.committed, now.conflict - txns.conflict,
                  now.failed - txns.failed, n - 1);
      fail();
    }
  }
}

/* A commit that fails for good leaves neither the order nor its event. */
static void test_commit_failure_writes_nothing(void **state) {
  txn_counts_t txns = txn_counts();
  failpoint("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1},"
            " \"data\": {\"failCommands\": [\"commitTransaction\"], \"errorCode\": 8}}");
  obx_test_http_resp_t resp;
  post_order(key_acme, "{\"customerEmail\": \"f@b.co\", \"amount\": \"1.00\", \"orderNumber\": \"FAIL-1\"}", NULL, &resp);
  if (resp.status < 500) {
    print_error("failed commit: got %ld %s, want 5xx\n", resp.status, resp.body);
    fail();
  }
  assert_int_equal(failpoint_off(), 1);
  expect_txn_delta(txns, 0, 0, 1, "a commit failing for good");
  assert_int_equal(count("orders", "{\"orderNumber\": \"FAIL-1\"}"), 0);
  assert_int_equal(count("outbox", "{\"payload.orderNumber\": \"FAIL-1\"}"), 0);
  obx_test_http_resp_cleanup(&resp);
}

/* Transient failures are retried by the transaction and commit exactly one of each. */
static void test_transient_errors_retried(void **state) {
  static const struct {
    const char *number, *failpoint;
    int body_reruns; /* TransientTransactionError reruns the body; a commit retry does not */
  } cases[] = {
    {"RETRY-COMMIT-TRANSIENT",
     "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": "
     "[\"commitTransaction\"], \"errorCode\": 112, \"errorLabels\": [\"TransientTransactionError\"]}}", 1},
    {"RETRY-COMMIT-UNKNOWN",
     "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": "
     "[\"commitTransaction\"], \"errorCode\": 91, \"errorLabels\": [\"UnknownTransactionCommitResult\"]}}", 0},
    {"RETRY-INSERT-TRANSIENT",
     "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": "
     "[\"insert\"], \"errorCode\": 112, \"errorLabels\": [\"TransientTransactionError\"]}}", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char body[256], filter[128];
    snprintf(body, sizeof body, "{\"customerEmail\": \"t@b.co\", \"amount\": \"2.00\", \"orderNumber\": \"%s\"}",
             cases[i].number);
    double reruns = metric("outboxd_mongo_transaction_retries_total");
    failpoint(cases[i].failpoint);
    obx_test_http_resp_t resp;
    post_order(key_acme, body, NULL, &resp);
    int64_t fired = failpoint_off();
    double got_reruns = metric("outboxd_mongo_transaction_retries_total") - reruns;
    if (resp.status != 201 || fired != 1 || got_reruns != cases[i].body_reruns) {
      print_error("%s: got %ld %s, fail point fired %lld, body reruns %g; want 201, 1, %d\n", cases[i].number,
                  resp.status, resp.body, (long long)fired, got_reruns, cases[i].body_reruns);
      fail();
    }
    snprintf(filter, sizeof filter, "{\"orderNumber\": \"%s\"}", cases[i].number);
    assert_int_equal(count("orders", filter), 1);
    snprintf(filter, sizeof filter, "{\"payload.orderNumber\": \"%s\"}", cases[i].number);
    assert_int_equal(count("outbox", filter), 1);
    obx_test_http_resp_cleanup(&resp);
  }
}

static void test_http_errors(void **state) {
  char big[6000];
  memset(big, ' ', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  big[0] = '{';
  big[sizeof big - 2] = '}';
  static const char *const chunked[] = {"Transfer-Encoding: chunked", NULL};
  static const struct {
    const char *name, *method, *path;
    bool big, chunked; /* chunked: no Content-Length, the limit applies while reading */
    long want;
    const char *allow;
  } cases[] = {
    {"body over http.max_body", "POST", "/orders", true, false, 413, NULL},
    {"chunked body over http.max_body", "POST", "/orders", true, true, 413, NULL},
    {"unknown path", "GET", "/nope", false, false, 404, NULL},
    {"wrong method", "DELETE", "/orders", false, false, 405, "POST"},
    {"wrong method on a pattern", "POST", "/orders/abc", false, false, 405, "GET"},
    {"healthz", "GET", "/healthz", false, false, 200, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_http_resp_t resp;
    assert_true(obx_test_http(outboxd.port, cases[i].method, cases[i].path, key_acme, cases[i].big ? big : NULL,
                              cases[i].chunked ? chunked : NULL, &resp));
    char allow[64] = "";
    obx_test_http_header(&resp, "Allow", allow, sizeof allow);
    if (resp.status != cases[i].want || (cases[i].allow && strcmp(allow, cases[i].allow) != 0)) {
      print_error("%s: got %ld (Allow: %s), want %ld (Allow: %s)\n", cases[i].name, resp.status, allow, cases[i].want,
                  cases[i].allow ? cases[i].allow : "");
      fail();
    }
    obx_test_http_resp_cleanup(&resp);
  }
}

typedef struct {
  int port;
  const char *needle;
} probe_t;

/* /readyz answers 503 with a detail containing needle. */
static bool readyz_503_says(void *ctx) {
  probe_t *p = ctx;
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(p->port, "GET", "/readyz", NULL, NULL, NULL, &resp) && resp.status == 503 &&
            strstr(resp.body, p->needle);
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

/* outboxd starts and answers /healthz while MongoDB is down; /readyz says why, then turns
 * 200 once MongoDB is up, and orders go through. */
static void test_mongo_down_then_up(void **state) {
  obx_test_mongo_t *down = &extra_mongo;
  assert_true(obx_test_mongo_start(down, NULL));
  int port = down->port;
  char uri[64];
  snprintf(uri, sizeof uri, "mongodb://127.0.0.1:%d/?replicaSet=rs0", port);
  obx_test_mongo_stop(down);

  obx_test_outboxd_t *d = &extra_outboxd;
  assert_true(start_outboxd(d, uri, NULL));
  obx_test_http_resp_t resp;
  assert_true(obx_test_http(d->port, "GET", "/healthz", NULL, NULL, NULL, &resp));
  expect_status(&resp, 200, "healthz with MongoDB down");
  obx_test_http_resp_cleanup(&resp);
  probe_t probe = {d->port, "MongoDB unreachable"};
  assert_true(obx_test_wait_for(readyz_503_says, &probe, 20000, 100));
  assert_true(obx_test_http(d->port, "POST", "/orders", key_acme, seed_body, NULL, &resp));
  expect_status(&resp, 503, "POST with MongoDB down");
  obx_test_http_resp_cleanup(&resp);

  char args[32];
  snprintf(args, sizeof args, "--port %d", port);
  assert_true(obx_test_mongo_start(&extra_mongo, args));
  assert_true(obx_test_wait_for(obx_test_http_ready, &d->port, 60000, 200));
  assert_true(obx_test_http(d->port, "POST", "/orders", key_acme, seed_body, NULL, &resp));
  expect_status(&resp, 201, "POST once MongoDB is up");
  obx_test_http_resp_cleanup(&resp);

  int status = obx_test_outboxd_stop(d);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* API_RATE_LIMIT=1: a burst of 2 passes, then 429 with Retry-After; other keys are not
 * affected. */
static void test_rate_limit(void **state) {
  obx_test_outboxd_t *d = &extra_outboxd;
  assert_true(start_outboxd(d, mongo.uri, "api.rate_limit=1"));
  long got[10];
  char retry_after[16] = "";
  int limited = 0;
  for (int i = 0; i < 10; i++) {
    obx_test_http_resp_t resp;
    assert_true(obx_test_http(d->port, "GET", "/orders/none", key_reader, NULL, NULL, &resp));
    got[i] = resp.status;
    if (resp.status == 429) {
      limited++;
      obx_test_http_header(&resp, "Retry-After", retry_after, sizeof retry_after);
    }
    obx_test_http_resp_cleanup(&resp);
  }
  if (got[0] != 404 || got[1] != 404 || limited == 0 || atoi(retry_after) < 1) {
    print_error("got %ld %ld then %d x 429 (Retry-After %s); want 404 404 then some 429 with Retry-After >= 1\n",
                got[0], got[1], limited, retry_after);
    fail();
  }
  obx_test_http_resp_t other;
  assert_true(obx_test_http(d->port, "GET", "/orders/none", key_globex, NULL, NULL, &other));
  expect_status(&other, 404, "another key while the first is limited");
  obx_test_http_resp_cleanup(&other);
  int status = obx_test_outboxd_stop(d);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_create_seed_payload),
    cmocka_unit_test(test_items_totals),
    cmocka_unit_test(test_metrics_count_a_post),
    cmocka_unit_test(test_validation_table),
    cmocka_unit_test(test_auth),
    cmocka_unit_test(test_idempotency),
    cmocka_unit_test(test_concurrent_order_number),
    cmocka_unit_test(test_idempotency_generated_number),
    cmocka_unit_test(test_commit_failure_writes_nothing),
    cmocka_unit_test(test_transient_errors_retried),
    cmocka_unit_test(test_http_errors),
    cmocka_unit_test_setup_teardown(test_rate_limit, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_mongo_down_then_up, test_setup, test_teardown),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
