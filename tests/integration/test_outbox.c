/* test_outbox.c - obx_outbox_append against devmongod: keySeq per key in commit order
 *
 * DESIGN: writer threads append events in their own transactions (obx_mongo_transaction);
 * several write the same key at once. Each key's keySeq values are then exactly 1..n, each
 * writer's own events of a key increase in its commit order, and an aborted transaction leaves
 * neither its event nor a gap. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_conf.h"
#include "obx/obx_event.h"
#include "obx/obx_mongo.h"
#include "obx/obx_outbox.h"
#include "obx/obx_schema.h"
#include "obx_test.h"
#include "obx_test_fixture.h"

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;

static int setup(void **state) { return obx_test_fixture_mongo_setup(&g_m, NULL, &g_client); }
static int teardown(void **state) { return obx_test_fixture_mongo_teardown(&g_m, g_client); }

#define WRITERS 3
#define PER_WRITER 30
#define KEYS 2

typedef struct {
  obx_mongo_t *mongo;
  int writer, n;
  const char *key;
  bool abort_it;
} append_t;

static bool append_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  append_t *a = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  mongoc_collection_t *outbox = obx_mongo_collection(a->mongo, client, "outbox");
  obx_event_t ev;
  obx_event_init(&ev);
  ev.event_type = strdup("Seq");
  ev.org_id = strdup("org-1");
  ev.aggregate_type = strdup("Thing");
  ev.aggregate_id = strdup(a->key);
  BSON_APPEND_INT32(&ev.payload, "writer", a->writer);
  BSON_APPEND_INT32(&ev.payload, "n", a->n);
  bool ok = obx_outbox_append(session, outbox, &ev, err);
  if (ok && a->abort_it) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "aborted on purpose");
    ok = false;
  }
  obx_event_cleanup(&ev);
  mongoc_collection_destroy(outbox);
  return ok;
}

static void *writer_main(void *arg) {
  append_t *base = arg;
  for (int i = 0; i < PER_WRITER; i++) {
    append_t a = *base;
    a.n = i;
    a.key = i % KEYS ? "K-odd" : "K-even";
    a.abort_it = i % 10 == 9; /* every tenth is rolled back */
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_mongo_transaction(a.mongo, append_txn, &a, &err);
    if (ok == a.abort_it) {
      print_error("writer %d event %d: got %s (%s)\n", a.writer, i, ok ? "commit" : "failure", err.msg);
      base->n = -1;
    }
  }
  return NULL;
}

static void test_key_seq_follows_commit_order(void **state) {
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  obx_conf_init(&conf);
  assert_true(obx_conf_set(&conf, "mongo.uri", g_m.uri, &err));
  assert_true(obx_conf_set(&conf, "mongo.db", "outbox_seq", &err));
  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  if (!obx_schema_ensure(mongo, &conf, OBX_SCHEMA_API, &err)) fail_msg("schema: %s", err.msg);
  pthread_t threads[WRITERS];
  append_t args[WRITERS];
  for (int w = 0; w < WRITERS; w++) {
    args[w] = (append_t){.mongo = mongo, .writer = w};
    assert_int_equal(pthread_create(&threads[w], NULL, writer_main, &args[w]), 0);
  }
  for (int w = 0; w < WRITERS; w++) pthread_join(threads[w], NULL);
  for (int w = 0; w < WRITERS; w++) if (args[w].n < 0) fail_msg("writer %d saw an unexpected outcome", w);

  /* per key: keySeq 1..n exactly once; per writer and key: increasing with n */
  mongoc_collection_t *outbox = mongoc_client_get_collection(g_client, "outbox_seq", "outbox");
  static const char *const keys[] = {"K-even", "K-odd"};
  int committed[KEYS] = {0};
  for (int i = 0; i < PER_WRITER; i++) committed[i % KEYS] += i % 10 == 9 ? 0 : WRITERS;
  for (int k = 0; k < KEYS; k++) {
    bson_t *filter = BCON_NEW("partitionKey", BCON_UTF8(keys[k]));
    bson_t *opts = BCON_NEW("sort", "{", "keySeq", BCON_INT32(1), "}");
    mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(outbox, filter, opts, NULL);
    const bson_t *doc;
    int64_t want = 1;
    int last_n[WRITERS];
    for (int w = 0; w < WRITERS; w++) last_n[w] = -1;
    while (mongoc_cursor_next(cursor, &doc)) {
      bson_iter_t it;
      int64_t seq = bson_iter_init_find(&it, doc, "keySeq") && BSON_ITER_HOLDS_INT64(&it) ? bson_iter_int64(&it) : -1;
      if (seq != want) fail_msg("key %s: got keySeq %lld want %lld", keys[k], (long long)seq, (long long)want);
      want++;
      int writer = -1, n = -1;
      if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "payload.writer", &it)) writer = bson_iter_int32(&it);
      if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "payload.n", &it)) n = bson_iter_int32(&it);
      assert_in_range(writer, 0, WRITERS - 1);
      if (n <= last_n[writer]) fail_msg("key %s writer %d: event %d after %d in keySeq order", keys[k], writer, n, last_n[writer]);
      last_n[writer] = n;
    }
    mongoc_cursor_destroy(cursor);
    if (want - 1 != committed[k])
      fail_msg("key %s: got %lld events want %d", keys[k], (long long)(want - 1), committed[k]);
    bson_destroy(opts);
    bson_destroy(filter);
  }
  mongoc_collection_destroy(outbox);
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_key_seq_follows_commit_order),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
