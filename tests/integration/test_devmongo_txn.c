/* test_devmongo_txn.c - devmongod sessions, transactions and retryable writes via libmongoc
 *
 * DESIGN: one devmongod per group; each test uses its own collection. Transactions are driven
 * through mongoc_client_session_* exactly as the product drives them; fail points inject the
 * errors that make the driver retry. */
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

static void fail_point(const char *json) { obx_test_fail_point(g_client, json); }

static int64_t count(mongoc_collection_t *c, const bson_t *opts) {
  bson_error_t error;
  bson_t filter = BSON_INITIALIZER;
  int64_t n = 0;
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, &filter, opts, NULL);
  const bson_t *doc;
  while (mongoc_cursor_next(cur, &doc)) n++;
  if (mongoc_cursor_error(cur, &error)) fail_msg("find: %s", error.message);
  mongoc_cursor_destroy(cur);
  return n;
}

static bson_t *session_opts(mongoc_client_session_t *cs) {
  bson_t *opts = bson_new();
  bson_error_t error;
  assert_true(mongoc_client_session_append(cs, opts, &error));
  return opts;
}

static void test_isolation_and_commit(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "iso");
  bson_error_t error;
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  assert_non_null(cs);
  bson_t *opts = session_opts(cs);
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  bson_t *a = BCON_NEW("_id", BCON_INT32(1)), *b = BCON_NEW("_id", BCON_INT32(2));
  assert_true(mongoc_collection_insert_one(c, a, opts, NULL, &error));
  assert_true(mongoc_collection_insert_one(c, b, opts, NULL, &error));
  assert_int_equal(count(c, opts), 2);   /* own writes visible inside */
  assert_int_equal(count(c, NULL), 0);   /* nothing visible outside */
  bson_t *outside = BCON_NEW("_id", BCON_INT32(3));
  assert_true(mongoc_collection_insert_one(c, outside, NULL, NULL, &error));
  assert_int_equal(count(c, opts), 2);   /* the snapshot does not see a later commit */
  assert_true(mongoc_client_session_commit_transaction(cs, NULL, &error));
  assert_int_equal(count(c, NULL), 3);
  bson_destroy(outside);
  /* committing again re-sends commitTransaction: the server answers ok and writes nothing */
  assert_true(mongoc_client_session_commit_transaction(cs, NULL, &error));
  assert_int_equal(count(c, NULL), 3);
  bson_destroy(a);
  bson_destroy(b);
  bson_destroy(opts);
  mongoc_client_session_destroy(cs);
  mongoc_collection_destroy(c);
}

/* A transaction's $inc and insert, committed three times, are applied once. */
static void test_repeated_commit_applies_once(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "recommit");
  bson_error_t error;
  bson_t *counter = BCON_NEW("_id", "counter", "n", BCON_INT32(0));
  assert_true(mongoc_collection_insert_one(c, counter, NULL, NULL, &error));
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  assert_non_null(cs);
  bson_t *opts = session_opts(cs);
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  bson_t *q = BCON_NEW("_id", "counter"), *inc = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
  bson_t *doc = BCON_NEW("_id", "written-once");
  assert_true(mongoc_collection_update_one(c, q, inc, opts, NULL, &error));
  assert_true(mongoc_collection_insert_one(c, doc, opts, NULL, &error));
  for (int i = 0; i < 3; i++)
    if (!mongoc_client_session_commit_transaction(cs, NULL, &error)) fail_msg("commit %d: %s", i + 1, error.message);
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  const bson_t *found;
  bson_iter_t it;
  int32_t n = mongoc_cursor_next(cur, &found) && bson_iter_init_find(&it, found, "n") ? bson_iter_int32(&it) : -1;
  mongoc_cursor_destroy(cur);
  int64_t docs = count(c, NULL);
  if (n != 1 || docs != 2) fail_msg("after 3 commits: got n=%d and %lld documents, want n=1 and 2", n, (long long)docs);
  bson_destroy(doc);
  bson_destroy(inc);
  bson_destroy(q);
  bson_destroy(opts);
  bson_destroy(counter);
  mongoc_client_session_destroy(cs);
  mongoc_collection_destroy(c);
}

static void test_abort_all_or_nothing(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "abort");
  bson_error_t error;
  bson_t reply;
  bson_t *seed = BCON_NEW("_id", BCON_INT32(1), "n", BCON_INT32(0));
  assert_true(mongoc_collection_insert_one(c, seed, NULL, NULL, &error));
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  bson_t *opts = session_opts(cs);
  /* abort: nothing lands */
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  bson_t *doc = BCON_NEW("_id", BCON_INT32(2));
  assert_true(mongoc_collection_insert_one(c, doc, opts, NULL, &error));
  assert_true(mongoc_client_session_abort_transaction(cs, &error));
  assert_int_equal(count(c, NULL), 1);
  /* an error inside the transaction aborts it: the update made before it is lost and the
   * commit answers NoSuchTransaction with TransientTransactionError */
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
  assert_true(mongoc_collection_update_one(c, q, u, opts, NULL, &error));
  assert_false(mongoc_collection_insert_one(c, seed, opts, &reply, &error));
  assert_int_equal(error.code, 11000);
  bson_destroy(&reply);
  assert_false(mongoc_client_session_commit_transaction(cs, &reply, &error));
  assert_int_equal(error.code, 251);
  assert_true(mongoc_error_has_label(&reply, "TransientTransactionError"));
  bson_destroy(&reply);
  mongoc_client_session_abort_transaction(cs, NULL);
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  const bson_t *got;
  assert_true(mongoc_cursor_next(cur, &got));
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, got, "n"));
  assert_int_equal(bson_iter_int32(&it), 0);
  mongoc_cursor_destroy(cur);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(doc);
  bson_destroy(seed);
  bson_destroy(opts);
  mongoc_client_session_destroy(cs);
  mongoc_collection_destroy(c);
}

/* A plain (non-transactional) update of _id 1 with maxTimeMS: false with the error. */
static bool update_with_max_time(mongoc_collection_t *c, int ms, bson_error_t *error) {
  bson_t *cmd = BCON_NEW("update", BCON_UTF8(mongoc_collection_get_name(c)), "updates", "[", "{", "q", "{", "_id",
                         BCON_INT32(1), "}", "u", "{", "$set", "{", "by", "outside", "}", "}", "}", "]", "maxTimeMS",
                         BCON_INT32(ms));
  bson_t reply;
  bool ok = mongoc_collection_write_command_with_opts(c, cmd, NULL, &reply, error);
  bson_destroy(&reply);
  bson_destroy(cmd);
  return ok;
}

static void test_write_conflict(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "conflict");
  bson_error_t error;
  bson_t reply;
  bson_t *seed = BCON_NEW("_id", BCON_INT32(1), "n", BCON_INT32(0));
  assert_true(mongoc_collection_insert_one(c, seed, NULL, NULL, &error));
  mongoc_client_session_t *s1 = mongoc_client_start_session(g_client, NULL, &error);
  mongoc_client_session_t *s2 = mongoc_client_start_session(g_client, NULL, &error);
  bson_t *o1 = session_opts(s1), *o2 = session_opts(s2);
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
  assert_true(mongoc_client_session_start_transaction(s1, NULL, &error));
  assert_true(mongoc_client_session_start_transaction(s2, NULL, &error));
  assert_true(mongoc_collection_update_one(c, q, u, o1, NULL, &error));
  /* second writer of the same document loses */
  assert_false(mongoc_collection_update_one(c, q, u, o2, &reply, &error));
  assert_int_equal(error.code, 112);
  assert_true(mongoc_error_has_label(&reply, "TransientTransactionError"));
  bson_destroy(&reply);
  /* a non-transactional writer waits for the transaction (here up to its maxTimeMS: 50) */
  int64_t t0 = obx_test_now_ms();
  assert_false(update_with_max_time(c, 200, &error));
  assert_int_equal(error.code, 50);
  assert_true(obx_test_now_ms() - t0 >= 150);
  assert_false(mongoc_client_session_commit_transaction(s2, &reply, &error));
  assert_int_equal(error.code, 251);
  bson_destroy(&reply);
  assert_true(mongoc_client_session_commit_transaction(s1, NULL, &error));
  /* a transaction that started before a later commit of the document conflicts as well */
  assert_true(mongoc_client_session_start_transaction(s2, NULL, &error));
  bson_t *other = BCON_NEW("_id", BCON_INT32(99));
  assert_true(mongoc_collection_insert_one(c, other, o2, NULL, &error));
  assert_true(mongoc_collection_update_one(c, q, u, NULL, NULL, &error));
  assert_false(mongoc_collection_update_one(c, q, u, o2, &reply, &error));
  assert_int_equal(error.code, 112);
  bson_destroy(&reply);
  mongoc_client_session_abort_transaction(s2, NULL);
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  const bson_t *got;
  bson_iter_t it;
  assert_true(mongoc_cursor_next(cur, &got));
  assert_true(bson_iter_init_find(&it, got, "n"));
  assert_int_equal(bson_iter_int32(&it), 2);
  mongoc_cursor_destroy(cur);
  bson_destroy(other);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(seed);
  bson_destroy(o1);
  bson_destroy(o2);
  mongoc_client_session_destroy(s1);
  mongoc_client_session_destroy(s2);
  mongoc_collection_destroy(c);
}

static void test_retryable_write_once(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "retry");
  bson_error_t error;
  bson_t *seed = BCON_NEW("_id", BCON_INT32(1), "n", BCON_INT32(0));
  assert_true(mongoc_collection_insert_one(c, seed, NULL, NULL, &error));
  /* the update executes, then the reply carries a retryable writeConcernError: the driver
   * retries with the same txnNumber and the server answers from its record */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"update\"], \"writeConcernError\": {\"code\": 91, "
             "\"errmsg\": \"Replication is being shut down\"}}}");
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
  bson_t reply;
  assert_true(mongoc_collection_update_one(c, q, u, NULL, &reply, &error));
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, &reply, "modifiedCount"));
  assert_int_equal(bson_iter_as_int64(&it), 1);
  bson_destroy(&reply);
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  const bson_t *got;
  assert_true(mongoc_cursor_next(cur, &got));
  assert_true(bson_iter_init_find(&it, got, "n"));
  assert_int_equal(bson_iter_int32(&it), 1);
  mongoc_cursor_destroy(cur);
  /* a network error before execution (closeConnection) is retried and runs once */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"update\"], \"closeConnection\": true}}");
  assert_true(mongoc_collection_update_one(c, q, u, NULL, NULL, &error));
  cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  assert_true(mongoc_cursor_next(cur, &got));
  assert_true(bson_iter_init_find(&it, got, "n"));
  assert_int_equal(bson_iter_int32(&it), 2);
  mongoc_cursor_destroy(cur);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(seed);
  mongoc_collection_destroy(c);
}

static int32_t field_n(mongoc_collection_t *c, const bson_t *q) {
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  const bson_t *got;
  bson_iter_t it;
  int32_t n = mongoc_cursor_next(cur, &got) && bson_iter_init_find(&it, got, "n") ? bson_iter_int32(&it) : -1;
  mongoc_cursor_destroy(cur);
  return n;
}

/* Switches onPrimaryTransactionalWrite off; returns how often it fired. */
static int64_t txn_write_fp_off(void) {
  return obx_test_fail_point(g_client, "{\"configureFailPoint\": \"onPrimaryTransactionalWrite\", \"mode\": \"off\"}");
}

/* onPrimaryTransactionalWrite: the write commits and the connection closes before the reply
 * (the driver retries with the same txnNumber and must get the stored result, not a second
 * execution), or the write fails before it commits (the retry executes it once). */
static void test_retry_after_lost_reply(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "lostreply");
  bson_error_t error;
  bson_t reply;
  bson_iter_t it;
  bson_t *seed = BCON_NEW("_id", BCON_INT32(1), "n", BCON_INT32(0));
  assert_true(mongoc_collection_insert_one(c, seed, NULL, NULL, &error));
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
  fail_point("{\"configureFailPoint\": \"onPrimaryTransactionalWrite\", \"mode\": {\"times\": 1}}");
  if (!mongoc_collection_update_one(c, q, u, NULL, &reply, &error)) fail_msg("update: %s", error.message);
  assert_true(bson_iter_init_find(&it, &reply, "modifiedCount"));
  assert_int_equal(bson_iter_as_int64(&it), 1);
  bson_destroy(&reply);
  assert_int_equal(txn_write_fp_off(), 1); /* the reply was lost once: the driver retried */
  int32_t n = field_n(c, q);
  if (n != 1) fail_msg("$inc retried after a lost reply: got n=%d, want 1", n);
  /* an insert of three documents: a second execution would fail with E11000 */
  bson_t *docs[3];
  for (int i = 0; i < 3; i++) docs[i] = BCON_NEW("_id", BCON_INT32(10 + i));
  fail_point("{\"configureFailPoint\": \"onPrimaryTransactionalWrite\", \"mode\": {\"times\": 1}, "
             "\"data\": {\"closeConnection\": true}}");
  if (!mongoc_collection_insert_many(c, (const bson_t **)docs, 3, NULL, &reply, &error))
    fail_msg("insert_many: %s", error.message);
  assert_true(bson_iter_init_find(&it, &reply, "insertedCount"));
  assert_int_equal(bson_iter_as_int64(&it), 3);
  bson_destroy(&reply);
  assert_int_equal(txn_write_fp_off(), 1);
  /* findAndModify returns the stored value: the document after the first (only) $inc */
  fail_point("{\"configureFailPoint\": \"onPrimaryTransactionalWrite\", \"mode\": {\"times\": 1}}");
  mongoc_find_and_modify_opts_t *fam = mongoc_find_and_modify_opts_new();
  mongoc_find_and_modify_opts_set_update(fam, u);
  mongoc_find_and_modify_opts_set_flags(fam, MONGOC_FIND_AND_MODIFY_RETURN_NEW);
  if (!mongoc_collection_find_and_modify_with_opts(c, q, fam, &reply, &error)) fail_msg("findAndModify: %s", error.message);
  bson_t value;
  assert_true(bson_iter_init_find(&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT(&it));
  uint32_t len;
  const uint8_t *data;
  bson_iter_document(&it, &len, &data);
  bson_init_static(&value, data, len);
  assert_true(bson_iter_init_find(&it, &value, "n"));
  assert_int_equal(bson_iter_int32(&it), 2);
  bson_destroy(&reply);
  mongoc_find_and_modify_opts_destroy(fam);
  assert_int_equal(txn_write_fp_off(), 1);
  assert_int_equal(field_n(c, q), 2);
  /* failBeforeCommitExceptionCode: nothing applied, RetryableWriteError, the retry applies it */
  fail_point("{\"configureFailPoint\": \"onPrimaryTransactionalWrite\", \"mode\": {\"times\": 1}, "
             "\"data\": {\"failBeforeCommitExceptionCode\": 91}}");
  if (!mongoc_collection_update_one(c, q, u, NULL, NULL, &error)) fail_msg("update: %s", error.message);
  assert_int_equal(txn_write_fp_off(), 1);
  assert_int_equal(field_n(c, q), 3);
  /* without retryable writes the same failure surfaces and nothing is applied */
  mongoc_client_t *plain = obx_test_mongo_client(&g_m, NULL, NULL);
  mongoc_uri_t *uri = mongoc_uri_copy(mongoc_client_get_uri(plain));
  mongoc_client_destroy(plain);
  mongoc_uri_set_option_as_bool(uri, MONGOC_URI_RETRYWRITES, false);
  plain = mongoc_client_new_from_uri(uri);
  mongoc_client_set_error_api(plain, MONGOC_ERROR_API_VERSION_2);
  mongoc_collection_t *pc = mongoc_client_get_collection(plain, "txn", "lostreply");
  fail_point("{\"configureFailPoint\": \"onPrimaryTransactionalWrite\", \"mode\": {\"times\": 1}, "
             "\"data\": {\"failBeforeCommitExceptionCode\": 91}}");
  /* no txnNumber without retryWrites: the fail point does not apply, the write runs once */
  if (!mongoc_collection_update_one(pc, q, u, NULL, NULL, &error)) fail_msg("update: %s", error.message);
  assert_int_equal(field_n(c, q), 4);
  assert_int_equal(txn_write_fp_off(), 0);
  mongoc_collection_destroy(pc);
  mongoc_client_destroy(plain);
  mongoc_uri_destroy(uri);
  for (int i = 0; i < 3; i++) bson_destroy(docs[i]);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(seed);
  mongoc_collection_destroy(c);
}

typedef struct {
  const obx_test_mongo_t *m;
  const char *coll;
  bool ok;
  bson_error_t error;
  int64_t done_ms;
} waiter_t;

/* A second client's plain $inc of _id 1 (it blocks while a transaction holds the document). */
static void *waiting_update(void *p) {
  waiter_t *w = p;
  mongoc_client_t *client = obx_test_mongo_client(w->m, NULL, "waiter");
  mongoc_collection_t *c = mongoc_client_get_collection(client, "txn", w->coll);
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
  w->ok = mongoc_collection_update_one(c, q, u, NULL, NULL, &w->error);
  w->done_ms = obx_test_now_ms();
  bson_destroy(q);
  bson_destroy(u);
  mongoc_collection_destroy(c);
  mongoc_client_destroy(client);
  return NULL;
}

/* mongod makes a write outside a transaction wait for a transaction that wrote the document
 * (its write conflict is retried inside the server): it applies after the commit, on top. */
static void test_outside_writer_waits(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "waits");
  bson_error_t error;
  bson_t *seed = BCON_NEW("_id", BCON_INT32(1), "n", BCON_INT32(0));
  assert_true(mongoc_collection_insert_one(c, seed, NULL, NULL, &error));
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  bson_t *opts = session_opts(cs);
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$inc", "{", "n", BCON_INT32(10), "}");
  assert_true(mongoc_collection_update_one(c, q, u, opts, NULL, &error));
  waiter_t w = {&g_m, "waits", false, {0}, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiting_update, &w), 0);
  /* the waiter cannot finish while the document is locked: give it a bounded chance to */
  int64_t until = obx_test_now_ms() + 500;
  while (obx_test_now_ms() < until && !w.done_ms) {
    bson_t *ping = BCON_NEW("ping", BCON_INT32(1));
    mongoc_client_command_simple(g_client, "admin", ping, NULL, NULL, NULL);
    bson_destroy(ping);
  }
  assert_int_equal(w.done_ms, 0);
  int64_t commit_ms = obx_test_now_ms();
  assert_true(mongoc_client_session_commit_transaction(cs, NULL, &error));
  pthread_join(th, NULL);
  if (!w.ok) fail_msg("the waiting update failed: %s (code %u)", w.error.message, w.error.code);
  assert_true(w.done_ms >= commit_ms);
  assert_int_equal(field_n(c, q), 11);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(seed);
  bson_destroy(opts);
  mongoc_client_session_destroy(cs);
  mongoc_collection_destroy(c);
}

static bool command_in_txn(mongoc_client_session_t *cs, const char *json, bson_error_t *error) {
  bson_t *cmd = obx_test_bson(json), reply;
  bson_t *opts = session_opts(cs);
  bool ok = mongoc_client_write_command_with_opts(g_client, "txn", cmd, opts, &reply, error);
  bson_destroy(&reply);
  bson_destroy(opts);
  bson_destroy(cmd);
  return ok;
}

/* mongod >= 4.4: create and createIndexes of a collection that does not exist yet run inside
 * a transaction, are seen by it, and vanish with an abort; an index on an existing collection
 * and other catalog commands fail with 263. */
static void test_catalog_in_transaction(void **state) {
  bson_error_t error;
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  if (!command_in_txn(cs, "{\"create\": \"newcoll\"}", &error)) fail_msg("create in a transaction: %s", error.message);
  if (!command_in_txn(cs, "{\"createIndexes\": \"newcoll\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", \"unique\": true}]}", &error))
    fail_msg("createIndexes on the new collection: %s", error.message);
  if (!command_in_txn(cs, "{\"createIndexes\": \"newcoll2\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\"}]}", &error))
    fail_msg("createIndexes creating a collection: %s", error.message);
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "newcoll");
  bson_t *opts = session_opts(cs);
  bson_t *a = BCON_NEW("k", BCON_INT32(1));
  assert_true(mongoc_collection_insert_one(c, a, opts, NULL, &error));
  assert_int_equal(count(c, opts), 1); /* the transaction sees its collection */
  assert_false(mongoc_collection_insert_one(c, a, opts, NULL, &error)); /* and its unique index */
  assert_int_equal(error.code, 11000);
  mongoc_client_session_abort_transaction(cs, NULL);
  /* the abort took the collections with it */
  mongoc_database_t *db = mongoc_client_get_database(g_client, "txn");
  assert_false(mongoc_database_has_collection(db, "newcoll", &error));
  assert_false(mongoc_database_has_collection(db, "newcoll2", &error));
  /* committed: the collection and its index stay */
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  assert_true(command_in_txn(cs, "{\"createIndexes\": \"newcoll\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", \"unique\": true}]}", &error));
  assert_true(mongoc_collection_insert_one(c, a, opts, NULL, &error));
  assert_true(mongoc_client_session_commit_transaction(cs, NULL, &error));
  assert_true(mongoc_database_has_collection(db, "newcoll", &error));
  assert_false(mongoc_collection_insert_one(c, a, NULL, NULL, &error));
  assert_int_equal(error.code, 11000);
  /* on an existing collection: 263, and the transaction is aborted */
  const char *refused[] = {"{\"createIndexes\": \"newcoll\", \"indexes\": [{\"key\": {\"z\": 1}, \"name\": \"z_1\"}]}",
                           "{\"drop\": \"newcoll\"}", "{\"dropIndexes\": \"newcoll\", \"index\": \"k_1\"}",
                           "{\"collMod\": \"newcoll\"}"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
    assert_true(mongoc_collection_insert_one(c, BCON_NEW("k", BCON_INT32(100 + (int)i)), opts, NULL, &error));
    if (command_in_txn(cs, refused[i], &error) || error.code != 263)
      fail_msg("%s in a transaction: got code %u (%s), want 263", refused[i], error.code, error.message);
    assert_false(mongoc_client_session_commit_transaction(cs, NULL, &error));
    assert_int_equal(error.code, 251);
  }
  assert_true(mongoc_database_has_collection(db, "newcoll", &error));
  bson_destroy(a);
  bson_destroy(opts);
  mongoc_database_destroy(db);
  mongoc_collection_destroy(c);
  mongoc_client_session_destroy(cs);
}

typedef struct {
  mongoc_collection_t *c;
  int calls;
} cb_ctx_t;

static bool txn_body(mongoc_client_session_t *cs, void *ctx, bson_t **reply, bson_error_t *error) {
  cb_ctx_t *cb = ctx;
  cb->calls++;
  bson_t *opts = session_opts(cs);
  bson_t *doc = BCON_NEW("attempt", BCON_INT32(cb->calls)), filter = BSON_INITIALIZER;
  bool ok = mongoc_collection_insert_one(cb->c, doc, opts, NULL, error);
  if (ok) {
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(cb->c, &filter, opts, NULL);
    const bson_t *got;
    while (mongoc_cursor_next(cur, &got)) continue;
    ok = !mongoc_cursor_error_document(cur, error, (const bson_t **)reply);
    if (!ok && *reply) *reply = bson_copy(*reply);
    mongoc_cursor_destroy(cur);
  }
  if (ok) ok = mongoc_collection_insert_one(cb->c, doc, opts, NULL, error);
  bson_destroy(doc);
  bson_destroy(opts);
  return ok;
}

static void test_with_transaction_retries(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "txn", "withtxn");
  bson_error_t error;
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  /* the first attempt's find fails with WriteConflict after its insert: the server labels it
   * TransientTransactionError, with_transaction runs the callback again */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"find\"], \"errorCode\": 112}}");
  cb_ctx_t cb = {c, 0};
  bson_t reply;
  bool ok = mongoc_client_session_with_transaction(cs, txn_body, NULL, &cb, &reply, &error);
  if (!ok) print_message("with_transaction: %s\n", error.message);
  assert_true(ok);
  bson_destroy(&reply);
  assert_int_equal(cb.calls, 2);
  bson_t *first = BCON_NEW("attempt", BCON_INT32(1));
  assert_int_equal(mongoc_collection_count_documents(c, first, NULL, NULL, NULL, &error), 0);
  assert_int_equal(count(c, NULL), 2); /* only the second attempt's two documents */
  /* a commit failing once with a retryable error (RetryableWriteError) is retried */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"commitTransaction\"], \"errorCode\": 91}}");
  ok = mongoc_client_session_with_transaction(cs, txn_body, NULL, &cb, &reply, &error);
  if (!ok) print_message("with_transaction: %s\n", error.message);
  assert_true(ok);
  bson_destroy(&reply);
  assert_int_equal(cb.calls, 3);
  assert_int_equal(count(c, NULL), 4);
  bson_destroy(first);
  mongoc_client_session_destroy(cs);
  mongoc_collection_destroy(c);
}

static void test_no_such_transaction(void **state) {
  bson_error_t error;
  bson_t reply;
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  bson_t *cmd = BCON_NEW("find", "x", "txnNumber", BCON_INT64(42), "autocommit", BCON_BOOL(false));
  bson_t *opts = session_opts(cs);
  assert_false(mongoc_client_read_command_with_opts(g_client, "txn", cmd, NULL, opts, &reply, &error));
  assert_int_equal(error.code, 251);
  assert_true(mongoc_error_has_label(&reply, "TransientTransactionError"));
  bson_destroy(&reply);
  bson_destroy(cmd);
  bson_destroy(opts);
  mongoc_client_session_destroy(cs);
}

static mongoc_collection_t *g_expiry_coll;

static bool outside_update_works(void *ctx) {
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$set", "{", "by", "outside", "}");
  bool ok = mongoc_collection_update_one(g_expiry_coll, q, u, NULL, NULL, NULL);
  bson_destroy(q);
  bson_destroy(u);
  return ok;
}

static void test_abandoned_transaction_expires(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, "--txn-lifetime-ms 300 --ttl-interval-ms 50"));
  mongoc_client_t *client = obx_test_mongo_client(&m, NULL, NULL);
  g_expiry_coll = mongoc_client_get_collection(client, "txn", "expiry");
  bson_error_t error;
  bson_t reply;
  bson_t *seed = BCON_NEW("_id", BCON_INT32(1));
  assert_true(mongoc_collection_insert_one(g_expiry_coll, seed, NULL, NULL, &error));
  mongoc_client_session_t *cs = mongoc_client_start_session(client, NULL, &error);
  bson_t *opts = session_opts(cs);
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  bson_t *q = BCON_NEW("_id", BCON_INT32(1)), *u = BCON_NEW("$set", "{", "by", "txn", "}");
  assert_true(mongoc_collection_update_one(g_expiry_coll, q, u, opts, NULL, &error));
  /* the transaction is abandoned: an outside writer waits (with maxTimeMS: 50), and one that
   * waits without a limit goes through once the lifetime limit aborts the transaction */
  assert_false(update_with_max_time(g_expiry_coll, 50, &error));
  assert_int_equal(error.code, 50);
  assert_true(obx_test_wait_for(outside_update_works, NULL, 20000, 50));
  assert_false(mongoc_client_session_commit_transaction(cs, &reply, &error));
  assert_int_equal(error.code, 251);
  bson_destroy(&reply);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(opts);
  bson_destroy(seed);
  mongoc_client_session_destroy(cs);
  mongoc_collection_destroy(g_expiry_coll);
  mongoc_client_destroy(client);
  obx_test_mongo_stop(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_isolation_and_commit),
    cmocka_unit_test(test_repeated_commit_applies_once),
    cmocka_unit_test(test_abort_all_or_nothing),
    cmocka_unit_test(test_write_conflict),
    cmocka_unit_test(test_retryable_write_once),
    cmocka_unit_test(test_retry_after_lost_reply),
    cmocka_unit_test(test_outside_writer_waits),
    cmocka_unit_test(test_catalog_in_transaction),
    cmocka_unit_test(test_with_transaction_retries),
    cmocka_unit_test(test_no_such_transaction),
    cmocka_unit_test(test_abandoned_transaction_expires),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
