/* test_dm_server.c - devmongod's server logic in-process (no sockets): commands, indexes,
 * transactions, retryable writes, change streams, parked getMores, fail points, TTL
 *
 * DESIGN: drives dm_cmd_run with command documents exactly as dm_net.c would after framing,
 * so the whole server state machine runs under the sanitizers in the unit pass. One store for
 * the binary (it is process-wide), each test in its own database. The socket side is covered
 * by tests/integration/test_devmongo_*.c through libmongoc. */
#include <stdio.h>
#include <string.h>

#include "obx_test.h"
#include "dm_query.h"
#include "dm_server.h"

static char g_appname[DM_APPNAME_MAX];

typedef struct {
  int act;
  bson_t reply;
  int64_t park_deadline_ms;
} result_t;

/* Runs one command given as relaxed JSON; db is added as $db. */
static void run_opts(const char *db, const char *json, bool rerun, bool final_run, result_t *res) {
  bson_error_t error;
  bson_t *body = bson_new_from_json((const uint8_t *)json, -1, &error);
  if (!body) fail_msg("bad json %s: %s", json, error.message);
  BSON_APPEND_UTF8(body, "$db", db);
  dm_req_t req = {0};
  req.body = body;
  req.appname = g_appname;
  req.local_addr = "127.0.0.1:27017";
  req.conn_id = 1;
  req.rerun = rerun;
  req.final_run = final_run;
  bson_init(&req.reply);
  res->act = dm_cmd_run(&req);
  res->park_deadline_ms = req.park_deadline_ms;
  bson_steal(&res->reply, &req.reply);
  bson_destroy(body);
}

static void run(const char *db, const char *json, result_t *res) { run_opts(db, json, false, false, res); }

static double num_at(const bson_t *doc, const char *path) {
  bson_iter_t it, f;
  if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &f) &&
      (BSON_ITER_HOLDS_NUMBER(&f) || BSON_ITER_HOLDS_BOOL(&f)))
    return bson_iter_as_double(&f);
  return -999;
}

static const char *str_at(const bson_t *doc, const char *path) {
  bson_iter_t it, f;
  if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &f) && BSON_ITER_HOLDS_UTF8(&f))
    return bson_iter_utf8(&f, NULL);
  return "";
}

static int array_len(const bson_t *doc, const char *path) {
  bson_iter_t it, f, child;
  int n = 0;
  if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, path, &f) ||
      !bson_iter_recurse(&f, &child))
    return -1;
  while (bson_iter_next(&child)) n++;
  return n;
}

/* Runs json and checks ok / error code, printing the reply on mismatch; returns the reply. */
static void expect(const char *db, const char *json, int want_code, result_t *res) {
  run(db, json, res);
  int code = num_at(&res->reply, "ok") == 1 ? 0 : (int)num_at(&res->reply, "code");
  if (code != want_code) {
    char *got = bson_as_relaxed_extended_json(&res->reply, NULL);
    fail_msg("%s: got %s, want code %d", json, got, want_code);
  }
}

static void expect_done(const char *db, const char *json, int want_code) {
  result_t res;
  expect(db, json, want_code, &res);
  bson_destroy(&res.reply);
}

static int setup(void **state) {
  dm_options_t opts = {.set_name = "rs0", .oplog_cap = 50, .ttl_interval_ms = 1000,
                       .txn_lifetime_ms = 60000};
  dm_store_init(&opts);
  return 0;
}

static int teardown(void **state) {
  dm_cmd_cleanup();
  dm_session_kill_all();
  dm_store_cleanup();
  return 0;
}

static void test_hello_and_envelope(void **state) {
  result_t res;
  expect("admin", "{\"isMaster\": 1, \"helloOk\": true, \"client\": {\"application\": {\"name\": \"app1\"}}}", 0, &res);
  assert_true(num_at(&res.reply, "ismaster") == 1);
  assert_int_equal((int)num_at(&res.reply, "maxWireVersion"), 17);
  assert_string_equal(str_at(&res.reply, "setName"), "rs0");
  assert_string_equal(str_at(&res.reply, "hosts.0"), "127.0.0.1:27017");
  assert_string_equal(g_appname, "app1");
  assert_true(bson_has_field(&res.reply, "$clusterTime"));
  assert_true(bson_has_field(&res.reply, "operationTime"));
  bson_destroy(&res.reply);
  expect("admin", "{\"nope\": 1}", 59, &res);
  assert_string_equal(str_at(&res.reply, "codeName"), "CommandNotFound");
  bson_destroy(&res.reply);
}

static void test_crud_and_cursor(void **state) {
  result_t res;
  expect("u1", "{\"insert\": \"c\", \"documents\": [{\"_id\": 1, \"a\": 1}, {\"_id\": 2, \"a\": 2}, "
               "{\"_id\": 1}, {\"_id\": 3, \"a\": 3}], \"ordered\": false}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "n"), 3);
  assert_int_equal((int)num_at(&res.reply, "writeErrors.0.index"), 2);
  assert_int_equal((int)num_at(&res.reply, "writeErrors.0.code"), 11000);
  bson_destroy(&res.reply);
  expect("u1", "{\"find\": \"c\", \"filter\": {\"a\": {\"$gte\": 2}}, \"sort\": {\"a\": -1}, \"batchSize\": 1}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "cursor.firstBatch.0._id"), 3);
  double id = num_at(&res.reply, "cursor.id");
  assert_true(id > 0);
  assert_string_equal(str_at(&res.reply, "cursor.ns"), "u1.c");
  bson_destroy(&res.reply);
  char gm[128];
  snprintf(gm, sizeof gm, "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"c\"}", (long long)id);
  expect("u1", gm, 0, &res);
  assert_int_equal((int)num_at(&res.reply, "cursor.nextBatch.0._id"), 2);
  assert_true(num_at(&res.reply, "cursor.id") == 0);
  bson_destroy(&res.reply);
  expect_done("u1", gm, 43);
  expect("u1", "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 9}, \"u\": {\"$set\": {\"a\": 9}}, "
               "\"upsert\": true}, {\"q\": {}, \"u\": {\"$inc\": {\"a\": 1}}, \"multi\": true}]}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "n"), 5);
  assert_int_equal((int)num_at(&res.reply, "nModified"), 4);
  assert_int_equal((int)num_at(&res.reply, "upserted.0._id"), 9);
  bson_destroy(&res.reply);
  expect("u1", "{\"findAndModify\": \"c\", \"query\": {\"_id\": 9}, \"remove\": true}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "value.a"), 10);
  bson_destroy(&res.reply);
  expect("u1", "{\"delete\": \"c\", \"deletes\": [{\"q\": {\"a\": {\"$lt\": 4}}, \"limit\": 0}]}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "n"), 2);
  bson_destroy(&res.reply);
  expect("u1", "{\"count\": \"c\"}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "n"), 1);
  bson_destroy(&res.reply);
  expect_done("u1", "{\"drop\": \"c\"}", 0);
  expect_done("u1", "{\"drop\": \"c\"}", 26);
}

static void test_unique_index(void **state) {
  result_t res;
  expect_done("u2", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", "
                    "\"unique\": true, \"partialFilterExpression\": {\"k\": {\"$exists\": true}}}]}", 0);
  expect_done("u2", "{\"insert\": \"c\", \"documents\": [{\"_id\": 1, \"k\": \"x\"}, {\"_id\": 2}, {\"_id\": 3}]}", 0);
  expect("u2", "{\"insert\": \"c\", \"documents\": [{\"_id\": 4, \"k\": \"x\"}]}", 0, &res);
  assert_string_equal(str_at(&res.reply, "writeErrors.0.errmsg"),
                      "E11000 duplicate key error collection: u2.c index: k_1 dup key: { k: \"x\" }");
  bson_destroy(&res.reply);
  expect("u2", "{\"listIndexes\": \"c\", \"cursor\": {}}", 0, &res);
  assert_int_equal(array_len(&res.reply, "cursor.firstBatch"), 2);
  bson_destroy(&res.reply);
}

static void test_index_options_and_coll_mod(void **state) {
  result_t res;
  const char *ttl100 = "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"at\": 1}, \"name\": \"at_1\", "
                       "\"expireAfterSeconds\": 100}]}";
  expect_done("u9", ttl100, 0);
  expect_done("u9", ttl100, 0); /* the same definition again: no-op */
  expect_done("u9", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"at\": 1}, \"name\": \"at_1\", "
                    "\"expireAfterSeconds\": 5}]}", 85);
  expect_done("u9", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"other\": 1}, \"name\": \"at_1\"}]}", 86);
  expect("u9", "{\"collMod\": \"c\", \"index\": {\"name\": \"at_1\", \"expireAfterSeconds\": 5}}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "expireAfterSeconds_old"), 100);
  assert_int_equal((int)num_at(&res.reply, "expireAfterSeconds_new"), 5);
  bson_destroy(&res.reply);
  expect("u9", "{\"listIndexes\": \"c\", \"cursor\": {}}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "cursor.firstBatch.1.expireAfterSeconds"), 5);
  bson_destroy(&res.reply);
  expect_done("u9", "{\"collMod\": \"c\", \"index\": {\"name\": \"_id_\", \"expireAfterSeconds\": 5}}", 72);
  expect_done("u9", "{\"collMod\": \"c\", \"index\": {\"name\": \"nope\", \"expireAfterSeconds\": 5}}", 27);
}

static void test_transaction_and_conflict(void **state) {
  const char *a = "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAAQ==\", \"subType\": \"04\"}}}";
  const char *b = "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAAg==\", \"subType\": \"04\"}}}";
  char cmd[512];
  result_t res;
  expect_done("u3", "{\"insert\": \"c\", \"documents\": [{\"_id\": 1, \"n\": 0}]}", 0);
  snprintf(cmd, sizeof cmd, "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$inc\": {\"n\": 1}}}], "
           "%s, \"txnNumber\": 1, \"startTransaction\": true, \"autocommit\": false}", a);
  expect_done("u3", cmd, 0);
  snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": 2}], %s, \"txnNumber\": 1, "
           "\"autocommit\": false}", a);
  expect_done("u3", cmd, 0);
  /* inside: own writes; outside: nothing */
  snprintf(cmd, sizeof cmd, "{\"find\": \"c\", %s, \"txnNumber\": 1, \"autocommit\": false}", a);
  expect("u3", cmd, 0, &res);
  assert_int_equal(array_len(&res.reply, "cursor.firstBatch"), 2);
  bson_destroy(&res.reply);
  expect("u3", "{\"find\": \"c\"}", 0, &res);
  assert_int_equal(array_len(&res.reply, "cursor.firstBatch"), 1);
  assert_int_equal((int)num_at(&res.reply, "cursor.firstBatch.0.n"), 0);
  bson_destroy(&res.reply);
  /* second writer: WriteConflict with the transient label */
  snprintf(cmd, sizeof cmd, "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$set\": {\"n\": 5}}}], "
           "%s, \"txnNumber\": 1, \"startTransaction\": true, \"autocommit\": false}", b);
  expect("u3", cmd, 112, &res);
  assert_string_equal(str_at(&res.reply, "errorLabels.0"), "TransientTransactionError");
  bson_destroy(&res.reply);
  snprintf(cmd, sizeof cmd, "{\"commitTransaction\": 1, %s, \"txnNumber\": 1, \"autocommit\": false}", b);
  expect_done("admin", cmd, 251);
  snprintf(cmd, sizeof cmd, "{\"commitTransaction\": 1, %s, \"txnNumber\": 1, \"autocommit\": false}", a);
  expect_done("admin", cmd, 0);
  expect_done("admin", cmd, 0); /* idempotent */
  expect("u3", "{\"find\": \"c\", \"filter\": {\"_id\": 1}}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "cursor.firstBatch.0.n"), 1);
  bson_destroy(&res.reply);
  /* retryable write: executed once per (lsid, txnNumber) */
  snprintf(cmd, sizeof cmd, "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$inc\": {\"n\": 1}}}], "
           "%s, \"txnNumber\": 7}", b);
  expect_done("u3", cmd, 0);
  expect("u3", cmd, 0, &res);
  assert_int_equal((int)num_at(&res.reply, "nModified"), 1);
  bson_destroy(&res.reply);
  expect("u3", "{\"find\": \"c\", \"filter\": {\"_id\": 1}}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "cursor.firstBatch.0.n"), 2);
  bson_destroy(&res.reply);
  snprintf(cmd, sizeof cmd, "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$inc\": {\"n\": 1}}}], "
           "%s, \"txnNumber\": 6}", b);
  expect_done("u3", cmd, 225);
  snprintf(cmd, sizeof cmd, "{\"endSessions\": [{\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAAg==\", "
           "\"subType\": \"04\"}}}]}");
  expect_done("admin", cmd, 0);
}

static void test_snapshot_reads(void **state) {
  const char *a = "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAACg==\", \"subType\": \"04\"}}}";
  char cmd[512];
  result_t res;
  expect_done("u7", "{\"insert\": \"c\", \"documents\": [{\"_id\": 1, \"v\": 1}, {\"_id\": 2, \"v\": 1}]}", 0);
  snprintf(cmd, sizeof cmd, "{\"find\": \"c\", \"sort\": {\"_id\": 1}, %s, \"txnNumber\": 1, "
           "\"startTransaction\": true, \"autocommit\": false}", a);
  expect("u7", cmd, 0, &res);
  assert_int_equal(array_len(&res.reply, "cursor.firstBatch"), 2);
  bson_destroy(&res.reply);
  /* committed by others after the snapshot: an update, a delete, an insert */
  expect_done("u7", "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$set\": {\"v\": 2}}}]}", 0);
  expect_done("u7", "{\"delete\": \"c\", \"deletes\": [{\"q\": {\"_id\": 2}, \"limit\": 1}]}", 0);
  expect_done("u7", "{\"insert\": \"c\", \"documents\": [{\"_id\": 3, \"v\": 1}]}", 0);
  /* the transaction still reads its snapshot, by scan and by _id */
  snprintf(cmd, sizeof cmd, "{\"find\": \"c\", \"filter\": {\"v\": 1}, %s, \"txnNumber\": 1, "
           "\"autocommit\": false}", a);
  expect("u7", cmd, 0, &res);
  assert_int_equal(array_len(&res.reply, "cursor.firstBatch"), 2);
  bson_destroy(&res.reply);
  snprintf(cmd, sizeof cmd, "{\"find\": \"c\", \"filter\": {\"_id\": 1}, %s, \"txnNumber\": 1, "
           "\"autocommit\": false}", a);
  expect("u7", cmd, 0, &res);
  assert_int_equal((int)num_at(&res.reply, "cursor.firstBatch.0.v"), 1);
  bson_destroy(&res.reply);
  /* writing a document changed since the snapshot is a write conflict (even a deleted one) */
  snprintf(cmd, sizeof cmd, "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 2}, \"u\": {\"$set\": "
           "{\"v\": 9}}}], %s, \"txnNumber\": 1, \"autocommit\": false}", a);
  expect_done("u7", cmd, 112);
  /* the conflict aborted it; with no transaction open the kept history is gone */
  assert_int_equal(dm_coll_get("u7", "c")->history.n, 0);
  expect("u7", "{\"find\": \"c\", \"filter\": {\"v\": 1}}", 0, &res);
  assert_int_equal(array_len(&res.reply, "cursor.firstBatch"), 1);
  bson_destroy(&res.reply);
}

static void test_unique_key_conflict_between_transactions(void **state) {
  const char *c1 = "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAADA==\", \"subType\": \"04\"}}}";
  const char *c2 = "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAADQ==\", \"subType\": \"04\"}}}";
  char cmd[512];
  result_t res;
  expect_done("u8", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", "
                    "\"unique\": true}]}", 0);
  snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": 1, \"k\": \"x\"}], %s, "
           "\"txnNumber\": 1, \"startTransaction\": true, \"autocommit\": false}", c1);
  expect_done("u8", cmd, 0);
  /* a different _id with the same unique key: the second transaction conflicts at once */
  snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": 2, \"k\": \"x\"}], %s, "
           "\"txnNumber\": 1, \"startTransaction\": true, \"autocommit\": false}", c2);
  expect("u8", cmd, 112, &res);
  assert_string_equal(str_at(&res.reply, "errorLabels.0"), "TransientTransactionError");
  bson_destroy(&res.reply);
  snprintf(cmd, sizeof cmd, "{\"commitTransaction\": 1, %s, \"txnNumber\": 1, \"autocommit\": false}", c1);
  expect_done("admin", cmd, 0);
  /* retried after the commit: now a plain duplicate key */
  snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": 2, \"k\": \"x\"}], %s, "
           "\"txnNumber\": 2, \"startTransaction\": true, \"autocommit\": false}", c2);
  expect("u8", cmd, 0, &res);
  assert_int_equal((int)num_at(&res.reply, "writeErrors.0.code"), 11000);
  bson_destroy(&res.reply);
  /* an aborted transaction releases its key locks */
  snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": 3, \"k\": \"y\"}], %s, "
           "\"txnNumber\": 3, \"startTransaction\": true, \"autocommit\": false}", c2);
  expect_done("u8", cmd, 0);
  snprintf(cmd, sizeof cmd, "{\"abortTransaction\": 1, %s, \"txnNumber\": 3, \"autocommit\": false}", c2);
  expect_done("admin", cmd, 0);
  snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": 4, \"k\": \"y\"}], %s, "
           "\"txnNumber\": 2, \"startTransaction\": true, \"autocommit\": false}", c1);
  expect_done("u8", cmd, 0);
  snprintf(cmd, sizeof cmd, "{\"commitTransaction\": 1, %s, \"txnNumber\": 2, \"autocommit\": false}", c1);
  expect_done("admin", cmd, 0);
}

static void test_change_stream_and_park(void **state) {
  result_t res;
  expect("u4", "{\"aggregate\": \"c\", \"pipeline\": [{\"$changeStream\": {}}, "
               "{\"$match\": {\"operationType\": \"insert\"}}], \"cursor\": {}}", 0, &res);
  double id = num_at(&res.reply, "cursor.id");
  assert_true(id > 0);
  assert_int_equal(array_len(&res.reply, "cursor.firstBatch"), 0);
  char first_token[64];
  snprintf(first_token, sizeof first_token, "%s", str_at(&res.reply, "cursor.postBatchResumeToken._data"));
  bson_destroy(&res.reply);
  char gm[160];
  snprintf(gm, sizeof gm, "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"c\", \"maxTimeMS\": 50}",
           (long long)id);
  /* nothing yet: the getMore parks with a deadline */
  run("u4", gm, &res);
  assert_int_equal(res.act, DM_ACT_PARK);
  assert_true(res.park_deadline_ms > 0);
  bson_destroy(&res.reply);
  expect_done("u4", "{\"insert\": \"c\", \"documents\": [{\"_id\": 1}]}", 0);
  expect_done("u4", "{\"delete\": \"c\", \"deletes\": [{\"q\": {\"_id\": 1}, \"limit\": 1}]}", 0);
  /* re-run after the write: the insert passes the $match, the delete does not */
  run_opts("u4", gm, true, false, &res);
  assert_int_equal(res.act, DM_ACT_REPLY);
  assert_int_equal(array_len(&res.reply, "cursor.nextBatch"), 1);
  assert_string_equal(str_at(&res.reply, "cursor.nextBatch.0.operationType"), "insert");
  assert_int_equal((int)num_at(&res.reply, "cursor.nextBatch.0.documentKey._id"), 1);
  char after[64];
  snprintf(after, sizeof after, "%s", str_at(&res.reply, "cursor.postBatchResumeToken._data"));
  assert_true(strcmp(after, first_token) > 0);
  bson_destroy(&res.reply);
  /* at the deadline an empty batch, with the token still advancing */
  run_opts("u4", gm, true, true, &res);
  assert_int_equal(res.act, DM_ACT_REPLY);
  assert_int_equal(array_len(&res.reply, "cursor.nextBatch"), 0);
  assert_true(strcmp(str_at(&res.reply, "cursor.postBatchResumeToken._data"), after) > 0);
  bson_destroy(&res.reply);
  /* a token from before the bounded oplog's window is history lost */
  for (int i = 0; i < 60; i++) expect_done("u4", "{\"insert\": \"d\", \"documents\": [{}]}", 0);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "{\"aggregate\": \"c\", \"pipeline\": [{\"$changeStream\": {\"resumeAfter\": "
           "{\"_data\": \"%s\"}}}], \"cursor\": {}}", first_token);
  expect("u4", cmd, 286, &res);
  assert_string_equal(str_at(&res.reply, "errorLabels.0"), "NonResumableChangeStreamError");
  bson_destroy(&res.reply);
  /* a stage dropping _id opens (mongod fails the getMore that returns such an event: see
   * test_devmongo_stream's test_stage_errors) */
  expect_done("u4", "{\"aggregate\": \"c\", \"pipeline\": [{\"$changeStream\": {}}, {\"$project\": {\"_id\": 0}}], "
                    "\"cursor\": {}}", 0);
}

static void test_fail_command(void **state) {
  result_t res;
  expect_done("admin", "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
                       "{\"failCommands\": [\"insert\"], \"errorCode\": 91}}", 0);
  expect("u5", "{\"insert\": \"c\", \"documents\": [{}], \"lsid\": {\"id\": {\"$binary\": {\"base64\": "
               "\"AAAAAAAAAAAAAAAAAAAAAw==\", \"subType\": \"04\"}}}, \"txnNumber\": 1}", 91, &res);
  assert_string_equal(str_at(&res.reply, "errorLabels.0"), "RetryableWriteError");
  bson_destroy(&res.reply);
  expect_done("u5", "{\"insert\": \"c\", \"documents\": [{}]}", 0);
  expect_done("admin", "{\"configureFailPoint\": \"failCommand\", \"mode\": \"alwaysOn\", \"data\": "
                       "{\"failCommands\": [\"ping\"], \"closeConnection\": true}}", 0);
  run("admin", "{\"ping\": 1}", &res);
  assert_int_equal(res.act, DM_ACT_CLOSE);
  bson_destroy(&res.reply);
  expect_done("admin", "{\"configureFailPoint\": \"failCommand\", \"mode\": \"alwaysOn\", \"data\": "
                       "{\"failCommands\": [\"ping\"], \"blockConnection\": true, \"blockTimeMS\": 10}}", 0);
  run("admin", "{\"ping\": 1}", &res);
  assert_int_equal(res.act, DM_ACT_BLOCK);
  bson_destroy(&res.reply);
  run_opts("admin", "{\"ping\": 1}", true, false, &res); /* after the block the command runs */
  assert_int_equal(res.act, DM_ACT_REPLY);
  assert_true(num_at(&res.reply, "ok") == 1);
  bson_destroy(&res.reply);
  expect("admin", "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "count"), 1);
  bson_destroy(&res.reply);
}

static void test_ttl_pass(void **state) {
  result_t res;
  expect_done("u6", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"at\": 1}, \"name\": \"at_1\", "
                    "\"expireAfterSeconds\": 0, \"partialFilterExpression\": {\"s\": \"DONE\"}}]}", 0);
  expect_done("u6", "{\"insert\": \"c\", \"documents\": [{\"_id\": 1, \"s\": \"DONE\", \"at\": {\"$date\": 1000}}, "
                    "{\"_id\": 2, \"s\": \"OPEN\", \"at\": {\"$date\": 1000}}, {\"_id\": 3, \"s\": \"DONE\"}]}", 0);
  uint64_t before = dm_oplog_last_seq();
  dm_ttl_pass();
  assert_int_equal(dm_oplog_last_seq(), before + 1);
  assert_int_equal(dm_oplog_get(before + 1)->op, DM_OP_DELETE);
  expect("u6", "{\"count\": \"c\"}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "n"), 2);
  bson_destroy(&res.reply);
}

/* ---- index lookups ---- */

static int64_t scanned_objects(void) {
  result_t res;
  expect("admin", "{\"serverStatus\": 1}", 0, &res);
  int64_t n = (int64_t)num_at(&res.reply, "metrics.queryExecutor.scannedObjects");
  bson_destroy(&res.reply);
  return n;
}

/* Runs count with the filter; fails with got/want unless it is want, and, when want_scanned
 * is not -1, unless exactly that many documents were examined. */
static void expect_count(const char *db, const char *filter, int want, int want_scanned) {
  char cmd[1024];
  result_t res;
  snprintf(cmd, sizeof cmd, "{\"count\": \"c\", \"query\": %s}", filter);
  int64_t before = scanned_objects();
  expect(db, cmd, 0, &res);
  int got = (int)num_at(&res.reply, "n");
  bson_destroy(&res.reply);
  int64_t scanned = scanned_objects() - before;
  if (got != want) fail_msg("count %s: got %d, want %d", filter, got, want);
  if (want_scanned >= 0 && scanned != want_scanned)
    fail_msg("count %s: examined %lld documents, want %d", filter, (long long)scanned, want_scanned);
}

static const struct {
  const char *filter;
  int want, scanned; /* scanned -1: a scan (every document) */
} lookup_cases[] = {
  /* _id documents, as the inbox keys its entries */
  {"{\"_id\": {\"consumer\": \"w\", \"eventId\": \"e7\"}}", 1, 1},
  {"{\"_id\": {\"$eq\": {\"consumer\": \"w\", \"eventId\": \"e7\"}}}", 1, 1},
  {"{\"$and\": [{\"_id\": {\"consumer\": \"w\", \"eventId\": \"e7\"}}, {\"n\": 7}]}", 1, 1},
  {"{\"_id\": {\"consumer\": \"w\", \"eventId\": \"e7\"}, \"n\": 8}", 0, 1},
  {"{\"_id\": {\"consumer\": \"w\", \"eventId\": \"nope\"}}", 0, 0},
  {"{\"_id\": {\"eventId\": \"e7\", \"consumer\": \"w\"}}", 0, 0}, /* field order counts */
  {"{\"_id\": {\"consumer\": \"w\"}}", 0, 0},
  {"{\"_id.consumer\": \"w\", \"_id.eventId\": \"e7\"}", 1, -1},
  {"{\"_id\": {\"$in\": [{\"consumer\": \"w\", \"eventId\": \"e7\"}]}}", 1, 1}, /* an ordered _id scan */
  /* numbers of any type inside the key are the same key */
  {"{\"_id\": {\"num\": 3}}", 1, 1},
  {"{\"_id\": {\"num\": 3.0}}", 1, 1},
  {"{\"_id\": {\"num\": {\"$numberLong\": \"3\"}}}", 1, 1},
  {"{\"_id\": {\"num\": {\"$numberDecimal\": \"3\"}}}", 1, 1},
  {"{\"_id\": 42.0}", 1, 1},
  /* a unique secondary index, alone and compound */
  {"{\"email\": \"u7@x\"}", 1, 1},
  {"{\"email\": {\"$eq\": \"u7@x\"}, \"n\": {\"$gt\": 6}}", 1, 1},
  {"{\"email\": \"nobody@x\"}", 0, 0},
  {"{\"email\": {\"$in\": [\"u7@x\"]}}", 1, 1},
  {"{\"email\": null}", 3, -1}, /* a sparse index cannot answer null */
  {"{\"org\": \"o1\", \"num\": 2}", 1, 1},
  {"{\"org\": \"o1\", \"num\": {\"$numberLong\": \"2\"}}", 1, 1},
  {"{\"org\": \"o1\"}", 10, 10}, /* the compound index's prefix */
  /* multikey: an array on the key path makes equality match elements; no hash lookup, the
   * ordered index holds every element */
  {"{\"tag\": \"red\"}", 1, 1},
  {"{\"tag\": \"t5\"}", 1, 1},
};

static void test_index_lookups(void **state) {
  char cmd[512];
  expect_done("ix", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"email\": 1}, \"name\": \"email_1\", "
                    "\"unique\": true, \"sparse\": true}, {\"key\": {\"org\": 1, \"num\": 1}, \"name\": "
                    "\"org_num\", \"unique\": true}, {\"key\": {\"tag\": 1}, \"name\": \"tag_1\", \"unique\": true, "
                    "\"sparse\": true}]}", 0);
  for (int i = 0; i < 10; i++) {
    snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": {\"consumer\": \"w\", \"eventId\": "
             "\"e%d\"}, \"n\": %d, \"email\": \"u%d@x\", \"org\": \"o1\", \"num\": %d, \"tag\": \"t%d\"}]}",
             i, i, i, i, i);
    expect_done("ix", cmd, 0);
  }
  expect_done("ix", "{\"insert\": \"c\", \"documents\": [{\"_id\": {\"num\": {\"$numberLong\": \"3\"}}, "
                    "\"org\": \"o2\", \"num\": 1}, {\"_id\": 42, \"org\": \"o2\", \"num\": 2}, {\"_id\": 43, "
                    "\"org\": \"o2\", \"num\": 3, \"tag\": [\"red\", \"blue\"]}]}", 0);
  int total = 13;
  for (size_t i = 0; i < sizeof lookup_cases / sizeof lookup_cases[0]; i++)
    expect_count("ix", lookup_cases[i].filter, lookup_cases[i].want,
                 lookup_cases[i].scanned < 0 ? total : lookup_cases[i].scanned);

  /* writes find their document through the index and keep it current */
  expect_done("ix", "{\"update\": \"c\", \"updates\": [{\"q\": {\"email\": \"u1@x\"}, \"u\": {\"$set\": "
                    "{\"email\": \"new1@x\"}}}]}", 0);
  expect_count("ix", "{\"email\": \"u1@x\"}", 0, 0);
  expect_count("ix", "{\"email\": \"new1@x\", \"n\": 1}", 1, 1);
  expect_done("ix", "{\"findAndModify\": \"c\", \"query\": {\"_id\": {\"consumer\": \"w\", \"eventId\": \"e2\"}}, "
                    "\"update\": {\"$set\": {\"num\": 20}}}", 0);
  expect_count("ix", "{\"org\": \"o1\", \"num\": 2}", 0, 0);
  expect_count("ix", "{\"org\": \"o1\", \"num\": 20}", 1, 1);
  expect_done("ix", "{\"delete\": \"c\", \"deletes\": [{\"q\": {\"email\": \"u4@x\"}, \"limit\": 1}]}", 0);
  expect_count("ix", "{\"email\": \"u4@x\"}", 0, 0);
  expect_count("ix", "{\"_id\": {\"consumer\": \"w\", \"eventId\": \"e4\"}}", 0, 0);
  result_t res;
  expect("ix", "{\"aggregate\": \"c\", \"pipeline\": [{\"$match\": {\"email\": \"u5@x\"}}, {\"$count\": \"n\"}], "
               "\"cursor\": {}}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "cursor.firstBatch.0.n"), 1);
  bson_destroy(&res.reply);
  /* a malformed filter fails even when the lookup finds nothing */
  expect_done("ix", "{\"find\": \"c\", \"filter\": {\"email\": \"none@x\", \"n\": {\"$bogus\": 1}}}", 2);
  /* a dropped index no longer answers; a dropped collection starts empty */
  expect_done("ix", "{\"dropIndexes\": \"c\", \"index\": \"email_1\"}", 0);
  expect_count("ix", "{\"email\": \"u5@x\"}", 1, total - 1);
  expect_done("ix", "{\"drop\": \"c\"}", 0);
  expect_count("ix", "{\"_id\": {\"consumer\": \"w\", \"eventId\": \"e5\"}}", 0, 0);
}

/* Index keys hold numbers exactly as the matcher compares them: one key for one value across
 * types, different keys for values a double cannot tell apart. */
static void test_index_number_keys(void **state) {
  result_t res;
  expect_done("ixn", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", "
                     "\"unique\": true}]}", 0);
  expect("ixn", "{\"insert\": \"c\", \"documents\": [{\"_id\": 1, \"k\": {\"$numberLong\": \"9007199254740993\"}}, "
                "{\"_id\": 2, \"k\": {\"$numberLong\": \"9007199254740992\"}}, {\"_id\": 3, \"k\": "
                "{\"$numberDecimal\": \"0.1\"}}, {\"_id\": 4, \"k\": 0.1}, {\"_id\": 5, \"k\": 1}, "
                "{\"_id\": 6, \"k\": {\"$numberDouble\": \"-0.0\"}}]}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "n"), 6);
  bson_destroy(&res.reply);
  expect("ixn", "{\"insert\": \"c\", \"documents\": [{\"_id\": 7, \"k\": {\"$numberDecimal\": \"1.0\"}}]}", 0, &res);
  assert_int_equal((int)num_at(&res.reply, "writeErrors.0.code"), 11000);
  bson_destroy(&res.reply);
  static const struct {
    const char *filter;
    int id;
  } cases[] = {
    {"{\"k\": {\"$numberLong\": \"9007199254740993\"}}", 1},
    {"{\"k\": {\"$numberLong\": \"9007199254740992\"}}", 2},
    {"{\"k\": 9007199254740992.0}", 2},
    {"{\"k\": {\"$numberDecimal\": \"0.1\"}}", 3},
    {"{\"k\": 0.1}", 4},
    {"{\"k\": {\"$numberDecimal\": \"1.00\"}}", 5},
    {"{\"k\": 1.0}", 5},
    {"{\"k\": 0}", 6},
    {"{\"_id\": {\"$numberDecimal\": \"4\"}}", 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "{\"find\": \"c\", \"filter\": %s}", cases[i].filter);
    int64_t before = scanned_objects();
    expect("ixn", cmd, 0, &res);
    int n = array_len(&res.reply, "cursor.firstBatch"), id = (int)num_at(&res.reply, "cursor.firstBatch.0._id");
    bson_destroy(&res.reply);
    int64_t scanned = scanned_objects() - before;
    if (n != 1 || id != cases[i].id || scanned != 1)
      fail_msg("find %s: got %d documents (_id %d, %lld examined), want _id %d alone, 1 examined",
               cases[i].filter, n, id, (long long)scanned, cases[i].id);
  }
}

/* The lookup finds exactly what a scan with dm_match finds, for values of every kind that
 * compare equal across types or only nearly so. */
static void test_index_lookup_equals_scan(void **state) {
  static const char *values[] = {
    "1", "1.0", "{\"$numberLong\": \"1\"}", "{\"$numberDecimal\": \"1\"}", "{\"$numberDecimal\": \"1.000\"}",
    "2.5", "{\"$numberDecimal\": \"2.5\"}", "0", "{\"$numberDouble\": \"-0.0\"}", "{\"$numberDouble\": \"NaN\"}",
    "{\"$numberDecimal\": \"NaN\"}", "{\"$numberDouble\": \"Infinity\"}", "{\"$numberDecimal\": \"Infinity\"}",
    "{\"$numberLong\": \"9223372036854775807\"}", "9223372036854775807.0", "\"1\"", "\"\"", "true", "false",
    "{\"$date\": {\"$numberLong\": \"1\"}}", "{\"$oid\": \"5f0c0c0c0c0c0c0c0c0c0c0c\"}", "{\"a\": 1}", "{\"a\": 1.0}",
    "{\"a\": {\"$numberLong\": \"1\"}}", "{\"a\": [1, 2]}", "{\"a\": [1.0, 2.0]}", "{\"a\": {\"b\": \"x\"}}",
    "{\"b\": 1, \"a\": 1}", "{}", "{\"$minKey\": 1}", "{\"$maxKey\": 1}", "{\"$timestamp\": {\"t\": 1, \"i\": 2}}",
    "{\"$binary\": {\"base64\": \"AQI=\", \"subType\": \"00\"}}", "{\"$symbol\": \"1\"}",
  };
  size_t nv = sizeof values / sizeof values[0];
  char cmd[512];
  result_t res;
  expect_done("ixs", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", "
                     "\"unique\": true}]}", 0);
  for (size_t i = 0; i < nv; i++) {
    /* as k and, in another document, as _id: duplicates are refused, the rest stored */
    snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": %zu, \"k\": %s}]}", i, values[i]);
    expect_done("ixs", cmd, 0);
    snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": %s, \"by\": \"id\"}]}", values[i]);
    expect_done("ixs", cmd, 0);
  }
  expect("ixs", "{\"find\": \"c\", \"batchSize\": 1000}", 0, &res);
  bson_iter_t it, batch;
  assert_true(bson_iter_init(&it, &res.reply) && bson_iter_find_descendant(&it, "cursor.firstBatch", &batch));
  bson_t all_docs;
  uint32_t len;
  const uint8_t *data;
  bson_iter_array(&batch, &len, &data);
  bson_init_static(&all_docs, data, len);
  for (size_t i = 0; i < nv; i++) {
    for (int field = 0; field < 2; field++) {
      const char *name = field ? "_id" : "k";
      char filter_json[256];
      snprintf(filter_json, sizeof filter_json, "{\"%s\": %s}", name, values[i]);
      bson_error_t error;
      bson_t *filter = bson_new_from_json((const uint8_t *)filter_json, -1, &error);
      if (!filter) fail_msg("bad json %s: %s", filter_json, error.message);
      int want = 0;
      bson_iter_t d;
      bson_iter_init(&d, &all_docs);
      while (bson_iter_next(&d)) {
        bson_t doc;
        bson_iter_document(&d, &len, &data);
        bson_init_static(&doc, data, len);
        want += dm_match(&doc, filter, NULL) == 1;
      }
      bson_destroy(filter);
      snprintf(cmd, sizeof cmd, "{\"find\": \"c\", \"filter\": %s}", filter_json);
      int64_t before = scanned_objects();
      result_t found;
      expect("ixs", cmd, 0, &found);
      int got = array_len(&found.reply, "cursor.firstBatch");
      bson_destroy(&found.reply);
      int64_t scanned = scanned_objects() - before;
      if (got != want || scanned > 1)
        fail_msg("find %s: got %d documents (%lld examined), the scan finds %d (want at most 1 examined)",
                 filter_json, got, (long long)scanned, want);
    }
  }
  bson_destroy(&res.reply);
}

/* Inside a transaction a lookup sees the transaction's own writes and its snapshot. */
static void test_index_lookups_in_transaction(void **state) {
  const char *a = "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAIA==\", \"subType\": \"04\"}}}";
  char cmd[640];
  result_t res;
  expect_done("ixt", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", "
                     "\"unique\": true}]}", 0);
  expect_done("ixt", "{\"insert\": \"c\", \"documents\": [{\"_id\": {\"d\": 1}, \"k\": \"old\"}, "
                     "{\"_id\": {\"d\": 2}, \"k\": \"gone\"}]}", 0);
  snprintf(cmd, sizeof cmd, "{\"insert\": \"c\", \"documents\": [{\"_id\": {\"d\": 3}, \"k\": \"mine\"}], %s, "
           "\"txnNumber\": 1, \"startTransaction\": true, \"autocommit\": false}", a);
  expect_done("ixt", cmd, 0);
  /* committed by others after the snapshot */
  expect_done("ixt", "{\"update\": \"c\", \"updates\": [{\"q\": {\"k\": \"old\"}, \"u\": {\"$set\": {\"k\": \"new\"}}}]}", 0);
  expect_done("ixt", "{\"delete\": \"c\", \"deletes\": [{\"q\": {\"k\": \"gone\"}, \"limit\": 1}]}", 0);
  static const struct {
    const char *filter;
    int in_txn, outside;
  } cases[] = {
    {"{\"k\": \"mine\"}", 1, 0},
    {"{\"_id\": {\"d\": 3}}", 1, 0},
    {"{\"k\": \"old\"}", 1, 0},
    {"{\"k\": \"new\"}", 0, 1},
    {"{\"k\": \"gone\"}", 1, 0},
    {"{\"_id\": {\"d\": 2}}", 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(cmd, sizeof cmd, "{\"find\": \"c\", \"filter\": %s, %s, \"txnNumber\": 1, \"autocommit\": false}",
             cases[i].filter, a);
    expect("ixt", cmd, 0, &res);
    int got = array_len(&res.reply, "cursor.firstBatch");
    bson_destroy(&res.reply);
    if (got != cases[i].in_txn) fail_msg("in the transaction %s: got %d, want %d", cases[i].filter, got, cases[i].in_txn);
    expect_count("ixt", cases[i].filter, cases[i].outside, -1);
  }
  snprintf(cmd, sizeof cmd, "{\"commitTransaction\": 1, %s, \"txnNumber\": 1, \"autocommit\": false}", a);
  expect_done("admin", cmd, 0);
  expect_count("ixt", "{\"k\": \"mine\"}", 1, 1);
  expect_count("ixt", "{\"_id\": {\"d\": 3}}", 1, 1);
}

/* Documents removed by the TTL pass leave the lookups too. */
static void test_index_lookups_after_ttl(void **state) {
  expect_done("ixl", "{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"at\": 1}, \"name\": \"at_1\", "
                     "\"expireAfterSeconds\": 0}, {\"key\": {\"k\": 1}, \"name\": \"k_1\", \"unique\": true}]}", 0);
  expect_done("ixl", "{\"insert\": \"c\", \"documents\": [{\"_id\": {\"d\": 1}, \"k\": \"a\", \"at\": {\"$date\": 1000}}, "
                     "{\"_id\": {\"d\": 2}, \"k\": \"b\"}]}", 0);
  expect_count("ixl", "{\"k\": \"a\"}", 1, 1);
  dm_ttl_pass();
  expect_count("ixl", "{\"k\": \"a\"}", 0, 0);
  expect_count("ixl", "{\"_id\": {\"d\": 1}}", 0, 0);
  expect_count("ixl", "{\"k\": \"b\"}", 1, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_hello_and_envelope),
    cmocka_unit_test(test_crud_and_cursor),
    cmocka_unit_test(test_unique_index),
    cmocka_unit_test(test_index_options_and_coll_mod),
    cmocka_unit_test(test_transaction_and_conflict),
    cmocka_unit_test(test_snapshot_reads),
    cmocka_unit_test(test_unique_key_conflict_between_transactions),
    cmocka_unit_test(test_change_stream_and_park),
    cmocka_unit_test(test_fail_command),
    cmocka_unit_test(test_ttl_pass),
    cmocka_unit_test(test_index_lookups),
    cmocka_unit_test(test_index_number_keys),
    cmocka_unit_test(test_index_lookup_equals_scan),
    cmocka_unit_test(test_index_lookups_in_transaction),
    cmocka_unit_test(test_index_lookups_after_ttl),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
