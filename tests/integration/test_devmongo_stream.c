/* test_devmongo_stream.c - devmongod change streams via libmongoc
 *
 * DESIGN: one devmongod per group (a second, with a tiny oplog, for the history-lost case).
 * Streams are opened with mongoc_collection_watch / mongoc_database_watch exactly as the
 * relay does; waiting is bounded by maxAwaitTimeMS and obx_test deadlines, never by sleeps. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_fixture.h"

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;

static int setup(void **state) { return obx_test_fixture_mongo_setup(&g_m, NULL, &g_client); }

static int teardown(void **state) { return obx_test_fixture_mongo_teardown(&g_m, g_client); }

static void run_ok(mongoc_collection_t *c, const char *what, bool ok, const bson_error_t *error) {
  if (!ok) fail_msg("%s on %s: %s", what, mongoc_collection_get_name(c), error->message);
}

static void insert(mongoc_collection_t *c, const char *json) {
  bson_error_t error;
  bson_t *doc = obx_test_bson(json);
  run_ok(c, "insert", mongoc_collection_insert_one(c, doc, NULL, NULL, &error), &error);
  bson_destroy(doc);
}

static mongoc_change_stream_t *watch(mongoc_collection_t *c, const char *pipeline, const char *opts) {
  bson_t *p = obx_test_bson(pipeline ? pipeline : "{\"pipeline\": []}"), *o = opts ? obx_test_bson(opts) : NULL;
  mongoc_change_stream_t *cs = mongoc_collection_watch(c, p, o);
  bson_destroy(p);
  bson_destroy(o);
  const bson_t *err_doc;
  bson_error_t error;
  if (mongoc_change_stream_error_document(cs, &error, &err_doc)) fail_msg("watch: %s", error.message);
  return cs;
}

/* Next event within timeout_ms (copied, caller destroys), or NULL. */
static bson_t *next_event(mongoc_change_stream_t *cs, int timeout_ms) {
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  const bson_t *ev;
  bson_error_t error;
  const bson_t *err_doc;
  do {
    if (mongoc_change_stream_next(cs, &ev)) return bson_copy(ev);
    if (mongoc_change_stream_error_document(cs, &error, &err_doc)) {
      print_message("stream error: %s (code %u)\n", error.message, error.code);
      return NULL;
    }
  } while (obx_test_now_ms() < deadline);
  return NULL;
}

static const char *str_at(const bson_t *doc, const char *path) {
  bson_iter_t it, f;
  if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &f) && BSON_ITER_HOLDS_UTF8(&f))
    return bson_iter_utf8(&f, NULL);
  return "";
}

static int64_t int_at(const bson_t *doc, const char *path) {
  bson_iter_t it, f;
  if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &f) && BSON_ITER_HOLDS_NUMBER(&f))
    return bson_iter_as_int64(&f);
  return -999;
}

static bool has(const bson_t *doc, const char *path) {
  bson_iter_t it, f;
  return bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &f);
}

static void expect_op(const bson_t *ev, const char *op, int id) {
  assert_non_null(ev);
  if (strcmp(str_at(ev, "operationType"), op) || int_at(ev, "documentKey._id") != id) {
    char *json = bson_as_relaxed_extended_json(ev, NULL);
    fail_msg("got event %s, want %s of _id %d", json, op, id);
  }
}

static void test_event_shapes(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "shapes");
  bson_error_t error;
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 200}");
  insert(c, "{\"_id\": 1, \"a\": 1, \"b\": 2, \"arr\": [1, 2, 3]}");
  bson_t *q = obx_test_bson("{\"_id\": 1}"), *u = obx_test_bson("{\"$set\": {\"a\": 5}, \"$unset\": {\"b\": \"\"}}");
  run_ok(c, "update", mongoc_collection_update_one(c, q, u, NULL, NULL, &error), &error);
  bson_t *r = obx_test_bson("{\"z\": 1}");
  run_ok(c, "replace", mongoc_collection_replace_one(c, q, r, NULL, NULL, &error), &error);
  run_ok(c, "delete", mongoc_collection_delete_one(c, q, NULL, NULL, &error), &error);
  bson_t *ev = next_event(cs, 10000);
  expect_op(ev, "insert", 1);
  assert_true(strlen(str_at(ev, "_id._data")) > 0);
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, ev, "clusterTime") && BSON_ITER_HOLDS_TIMESTAMP(&it));
  assert_true(bson_iter_init_find(&it, ev, "wallTime") && BSON_ITER_HOLDS_DATE_TIME(&it));
  assert_string_equal(str_at(ev, "ns.db"), "cs");
  assert_string_equal(str_at(ev, "ns.coll"), "shapes");
  assert_int_equal(int_at(ev, "fullDocument.b"), 2);
  assert_false(has(ev, "lsid"));
  bson_destroy(ev);
  ev = next_event(cs, 10000);
  expect_op(ev, "update", 1);
  assert_int_equal(int_at(ev, "updateDescription.updatedFields.a"), 5);
  assert_string_equal(str_at(ev, "updateDescription.removedFields.0"), "b");
  assert_true(has(ev, "updateDescription.truncatedArrays"));
  assert_false(has(ev, "fullDocument"));
  bson_destroy(ev);
  ev = next_event(cs, 10000);
  expect_op(ev, "replace", 1);
  assert_int_equal(int_at(ev, "fullDocument.z"), 1);
  bson_destroy(ev);
  ev = next_event(cs, 10000);
  expect_op(ev, "delete", 1);
  bson_destroy(ev);
  mongoc_change_stream_destroy(cs);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(r);
  mongoc_collection_destroy(c);
}


/* The code of the error the stream reports within timeout_ms (0: none); *label_out (may be
 * NULL) tells whether it carried NonResumableChangeStreamError. */
static uint32_t stream_error(mongoc_change_stream_t *cs, int timeout_ms, bool *non_resumable) {
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  const bson_t *ev, *err_doc = NULL;
  bson_error_t error;
  do {
    if (mongoc_change_stream_next(cs, &ev)) fail_msg("an event came where an error was due");
    if (mongoc_change_stream_error_document(cs, &error, &err_doc)) {
      if (non_resumable) *non_resumable = err_doc && mongoc_error_has_label(err_doc, "NonResumableChangeStreamError");
      return error.code;
    }
  } while (obx_test_now_ms() < deadline);
  return 0;
}

/* A value of updateDescription.updatedFields by its (dotted) name. */
static bool updated_field(const bson_t *ev, const char *name, bson_value_t *out) {
  bson_iter_t it, f;
  if (!bson_iter_init(&it, ev) || !bson_iter_find_descendant(&it, "updateDescription.updatedFields", &f) ||
      !BSON_ITER_HOLDS_DOCUMENT(&f) || !bson_iter_recurse(&f, &it) || !bson_iter_find(&it, name))
    return false;
  *out = *bson_iter_value(&it);
  return true;
}

static void update(mongoc_collection_t *c, const char *q_json, const char *u_json) {
  bson_error_t error;
  bson_t *q = obx_test_bson(q_json);
  bson_iter_t it;
  bson_t *u;
  if (u_json[0] == '[') {
    bson_t *wrap = obx_test_bson(bson_strdup_printf("{\"p\": %s}", u_json));
    bson_iter_init_find(&it, wrap, "p");
    uint32_t len;
    const uint8_t *data;
    bson_iter_array(&it, &len, &data);
    u = bson_new_from_data(data, len);
    bson_destroy(wrap);
  } else {
    u = obx_test_bson(u_json);
  }
  run_ok(c, "update", mongoc_collection_update_one(c, q, u, NULL, NULL, &error), &error);
  bson_destroy(q);
  bson_destroy(u);
}

/* fullDocument appears on update events only when asked for: updateLookup reads the current
 * document; whenAvailable / required give the post-image recorded for collections with
 * changeStreamPreAndPostImages (null, or error 47, without it); fullDocumentBeforeChange the
 * pre-image. */
static void test_images(void **state) {
  mongoc_database_t *db = mongoc_client_get_database(g_client, "cs");
  bson_error_t error;
  bson_t *create = obx_test_bson("{\"create\": \"images\", \"changeStreamPreAndPostImages\": {\"enabled\": true}}");
  run_ok(NULL, "create", mongoc_database_command_simple(db, create, NULL, NULL, &error), &error);
  bson_destroy(create);
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "images");
  mongoc_collection_t *plain = mongoc_client_get_collection(g_client, "cs", "noimages");
  mongoc_change_stream_t *when = watch(c, NULL, "{\"fullDocument\": \"whenAvailable\", "
                                       "\"fullDocumentBeforeChange\": \"required\", \"maxAwaitTimeMS\": 200}");
  mongoc_change_stream_t *look = watch(c, NULL, "{\"fullDocument\": \"updateLookup\", \"maxAwaitTimeMS\": 200}");
  mongoc_change_stream_t *none = watch(plain, NULL, "{\"fullDocument\": \"whenAvailable\", \"maxAwaitTimeMS\": 200}");
  mongoc_change_stream_t *req = watch(plain, NULL, "{\"fullDocument\": \"required\", \"maxAwaitTimeMS\": 200}");
  insert(c, "{\"_id\": 1, \"v\": 1}");
  update(c, "{\"_id\": 1}", "{\"$set\": {\"v\": 2}}");
  update(c, "{\"_id\": 1}", "{\"$set\": {\"v\": 3}}");
  insert(plain, "{\"_id\": 1, \"v\": 1}");
  update(plain, "{\"_id\": 1}", "{\"$set\": {\"v\": 2}}");
  bson_t *ev = next_event(when, 10000);
  expect_op(ev, "insert", 1);
  assert_false(has(ev, "fullDocumentBeforeChange"));
  bson_destroy(ev);
  ev = next_event(when, 10000);
  expect_op(ev, "update", 1);
  assert_int_equal(int_at(ev, "fullDocument.v"), 2);             /* the post-image of this update */
  assert_int_equal(int_at(ev, "fullDocumentBeforeChange.v"), 1);
  bson_destroy(ev);
  bson_destroy(next_event(look, 10000));
  ev = next_event(look, 10000);
  expect_op(ev, "update", 1);
  assert_int_equal(int_at(ev, "fullDocument.v"), 3);             /* updateLookup: the current one */
  assert_false(has(ev, "fullDocumentBeforeChange"));
  bson_destroy(ev);
  bson_destroy(next_event(none, 10000));
  ev = next_event(none, 10000);
  expect_op(ev, "update", 1);
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, ev, "fullDocument") && BSON_ITER_HOLDS_NULL(&it));
  bson_destroy(ev);
  /* the batch holding the update fails as a whole, as mongod's getMore does */
  assert_int_equal(stream_error(req, 10000, NULL), 47);
  mongoc_change_stream_destroy(when);
  mongoc_change_stream_destroy(look);
  mongoc_change_stream_destroy(none);
  mongoc_change_stream_destroy(req);
  mongoc_collection_destroy(c);
  mongoc_collection_destroy(plain);
  mongoc_database_destroy(db);
}

/* A pipeline update that shortens an array reports truncatedArrays; changed elements and
 * sub-fields are reported by full path. */
static void test_truncated_arrays(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "truncated");
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 200}");
  insert(c, "{\"_id\": 1, \"arr\": [1, 2, 3, 4], \"sub\": {\"x\": 1, \"y\": 2}}");
  update(c, "{\"_id\": 1}", "[{\"$set\": {\"arr\": {\"$literal\": [1, 9]}, \"sub\": {\"$literal\": {\"x\": 1, \"y\": 5}}}}]");
  bson_destroy(next_event(cs, 10000));
  bson_t *ev = next_event(cs, 10000);
  expect_op(ev, "update", 1);
  char *json = bson_as_relaxed_extended_json(ev, NULL);
  bson_value_t v;
  if (!updated_field(ev, "arr.1", &v) || v.value_type != BSON_TYPE_INT32 || v.value.v_int32 != 9 ||
      !updated_field(ev, "sub.y", &v) || updated_field(ev, "arr", &v) ||
      strcmp(str_at(ev, "updateDescription.truncatedArrays.0.field"), "arr") ||
      int_at(ev, "updateDescription.truncatedArrays.0.newSize") != 2)
    fail_msg("got %s, want updatedFields {arr.1: 9, sub.y: 5} and truncatedArrays [{field: arr, newSize: 2}]", json);
  bson_free(json);
  bson_destroy(ev);
  mongoc_change_stream_destroy(cs);
  mongoc_collection_destroy(c);
}

/* A stage that changes _id opens fine and fails (280, non-resumable) on the getMore that
 * would return such an event; an unknown stage fails at once with 40324, a known one a stream
 * may not carry with 20. */
static void test_stage_errors(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "stagerr");
  const char *modifying[] = {"{\"pipeline\": [{\"$project\": {\"_id\": 0}}]}",
                             "{\"pipeline\": [{\"$addFields\": {\"_id\": \"x\"}}]}",
                             "{\"pipeline\": [{\"$match\": {\"operationType\": \"insert\"}}, {\"$replaceRoot\": {\"newRoot\": \"$fullDocument\"}}]}"};
  for (size_t i = 0; i < sizeof modifying / sizeof *modifying; i++) {
    mongoc_change_stream_t *cs = watch(c, modifying[i], "{\"maxAwaitTimeMS\": 200}");
    insert(c, bson_strdup_printf("{\"_id\": %d}", (int)i + 1));
    bool non_resumable = false;
    uint32_t code = stream_error(cs, 10000, &non_resumable);
    if (code != 280 || !non_resumable) fail_msg("%s: got code %u, want 280 NonResumableChangeStreamError", modifying[i], code);
    mongoc_change_stream_destroy(cs);
  }
  const struct { const char *pipeline; uint32_t code; } at_open[] = {
    {"{\"pipeline\": [{\"$nosuchstage\": {}}]}", 40324},
    {"{\"pipeline\": [{\"$group\": {\"_id\": null}}]}", 20},
  };
  for (size_t i = 0; i < sizeof at_open / sizeof *at_open; i++) {
    bson_t *p = obx_test_bson(at_open[i].pipeline);
    mongoc_change_stream_t *cs = mongoc_collection_watch(c, p, NULL);
    const bson_t *err_doc;
    bson_error_t error;
    assert_true(mongoc_change_stream_error_document(cs, &error, &err_doc));
    if (error.code != at_open[i].code) fail_msg("%s: got %u (%s), want %u", at_open[i].pipeline, error.code, error.message, at_open[i].code);
    mongoc_change_stream_destroy(cs);
    bson_destroy(p);
  }
  mongoc_collection_destroy(c);
}


/* renameCollection moves the documents; a stream on the old name sees rename (with `to`),
 * then invalidate; an existing target needs dropTarget. */
static void test_rename_and_invalidate(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "before_rename");
  mongoc_collection_t *t = mongoc_client_get_collection(g_client, "cs", "after_rename");
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 200}");
  insert(c, "{\"_id\": 1}");
  insert(t, "{\"_id\": 50}");
  bson_error_t error;
  bson_t *cmd = obx_test_bson("{\"renameCollection\": \"cs.before_rename\", \"to\": \"cs.after_rename\"}");
  assert_false(mongoc_client_command_simple(g_client, "admin", cmd, NULL, NULL, &error));
  assert_int_equal(error.code, 48);
  bson_destroy(cmd);
  cmd = obx_test_bson("{\"renameCollection\": \"cs.before_rename\", \"to\": \"cs.after_rename\", \"dropTarget\": true}");
  run_ok(c, "renameCollection", mongoc_client_command_simple(g_client, "admin", cmd, NULL, NULL, &error), &error);
  bson_destroy(cmd);
  assert_int_equal(mongoc_collection_count_documents(t, &(bson_t)BSON_INITIALIZER, NULL, NULL, NULL, &error), 1);
  bson_t *ev = next_event(cs, 10000);
  expect_op(ev, "insert", 1);
  bson_destroy(ev);
  ev = next_event(cs, 10000);
  assert_non_null(ev);
  assert_string_equal(str_at(ev, "operationType"), "rename");
  assert_string_equal(str_at(ev, "ns.coll"), "before_rename");
  assert_string_equal(str_at(ev, "to.coll"), "after_rename");
  bson_destroy(ev);
  ev = next_event(cs, 10000);
  assert_non_null(ev);
  assert_string_equal(str_at(ev, "operationType"), "invalidate");
  bson_destroy(ev);
  cmd = obx_test_bson("{\"renameCollection\": \"cs.nosuch\", \"to\": \"cs.other\"}");
  assert_false(mongoc_client_command_simple(g_client, "admin", cmd, NULL, NULL, &error));
  assert_int_equal(error.code, 26);
  bson_destroy(cmd);
  mongoc_change_stream_destroy(cs);
  mongoc_collection_destroy(c);
  mongoc_collection_destroy(t);
}

static void test_update_lookup_and_match(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "lookup");
  bson_error_t error;
  mongoc_change_stream_t *look = watch(c, NULL, "{\"fullDocument\": \"updateLookup\", \"maxAwaitTimeMS\": 200}");
  mongoc_change_stream_t *only = watch(
    c, "{\"pipeline\": [{\"$match\": {\"operationType\": \"update\", \"fullDocument.s\": {\"$ne\": 1}}}, "
       "{\"$project\": {\"documentKey\": 1, \"operationType\": 1}}]}",
    "{\"fullDocument\": \"updateLookup\", \"maxAwaitTimeMS\": 200}");
  insert(c, "{\"_id\": 1, \"s\": 0}");
  bson_t *q = obx_test_bson("{\"_id\": 1}"), *u = obx_test_bson("{\"$inc\": {\"s\": 2}}");
  run_ok(c, "update", mongoc_collection_update_one(c, q, u, NULL, NULL, &error), &error);
  bson_t *ev = next_event(look, 10000);
  expect_op(ev, "insert", 1);
  bson_destroy(ev);
  ev = next_event(look, 10000);
  expect_op(ev, "update", 1);
  assert_int_equal(int_at(ev, "fullDocument.s"), 2);
  bson_destroy(ev);
  ev = next_event(only, 10000);
  expect_op(ev, "update", 1);
  assert_false(has(ev, "ns"));           /* projected away */
  assert_true(has(ev, "_id._data"));     /* the token survives */
  bson_destroy(ev);
  mongoc_change_stream_destroy(look);
  mongoc_change_stream_destroy(only);
  bson_destroy(q);
  bson_destroy(u);
  mongoc_collection_destroy(c);
}

static void test_transaction_events(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "txn");
  bson_error_t error;
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 200}");
  mongoc_client_session_t *sess = mongoc_client_start_session(g_client, NULL, &error);
  bson_t *opts = bson_new();
  assert_true(mongoc_client_session_append(sess, opts, &error));
  assert_true(mongoc_client_session_start_transaction(sess, NULL, &error));
  bson_t *a = obx_test_bson("{\"_id\": 1}"), *b = obx_test_bson("{\"_id\": 2}");
  run_ok(c, "insert", mongoc_collection_insert_one(c, a, opts, NULL, &error), &error);
  insert(c, "{\"_id\": 10}"); /* outside the transaction, committed first */
  run_ok(c, "insert", mongoc_collection_insert_one(c, b, opts, NULL, &error), &error);
  assert_true(mongoc_client_session_commit_transaction(sess, NULL, &error));
  insert(c, "{\"_id\": 11}");
  int want[] = {10, 1, 2, 11};
  for (int i = 0; i < 4; i++) {
    bson_t *ev = next_event(cs, 10000);
    expect_op(ev, "insert", want[i]);
    bool txn = want[i] < 10;
    assert_int_equal(has(ev, "lsid.id"), txn);
    if (txn) assert_int_equal(int_at(ev, "txnNumber"), 1);
    bson_destroy(ev);
  }
  mongoc_change_stream_destroy(cs);
  bson_destroy(a);
  bson_destroy(b);
  bson_destroy(opts);
  mongoc_client_session_destroy(sess);
  mongoc_collection_destroy(c);
}

static void test_resume_options(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "resume");
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 200}");
  for (int i = 1; i <= 4; i++) {
    char json[32];
    snprintf(json, sizeof json, "{\"_id\": %d}", i);
    insert(c, json);
  }
  bson_t *ev1 = next_event(cs, 10000), *ev2 = next_event(cs, 10000);
  expect_op(ev1, "insert", 1);
  expect_op(ev2, "insert", 2);
  mongoc_change_stream_destroy(cs);
  bson_iter_t it;
  bson_t token;
  uint32_t len;
  const uint8_t *data;
  assert_true(bson_iter_init_find(&it, ev1, "_id"));
  bson_iter_document(&it, &len, &data);
  bson_init_static(&token, data, len);
  const char *keys[] = {"resumeAfter", "startAfter"};
  for (int k = 0; k < 2; k++) {
    bson_t *opts = bson_new();
    BSON_APPEND_DOCUMENT(opts, keys[k], &token);
    BSON_APPEND_INT32(opts, "maxAwaitTimeMS", 200);
    bson_t pipeline = BSON_INITIALIZER;
    mongoc_change_stream_t *rs = mongoc_collection_watch(c, &pipeline, opts);
    for (int want = 2; want <= 4; want++) {
      bson_t *ev = next_event(rs, 10000);
      expect_op(ev, "insert", want);
      bson_destroy(ev);
    }
    mongoc_change_stream_destroy(rs);
    bson_destroy(opts);
  }
  /* startAtOperationTime: events at or after the given cluster time */
  uint32_t t, i;
  assert_true(bson_iter_init_find(&it, ev2, "clusterTime"));
  bson_iter_timestamp(&it, &t, &i);
  bson_t *opts = BCON_NEW("startAtOperationTime", BCON_TIMESTAMP(t, i), "maxAwaitTimeMS", BCON_INT32(200));
  bson_t pipeline = BSON_INITIALIZER;
  mongoc_change_stream_t *rs = mongoc_collection_watch(c, &pipeline, opts);
  bson_t *ev = next_event(rs, 10000);
  expect_op(ev, "insert", 2);
  bson_destroy(ev);
  mongoc_change_stream_destroy(rs);
  bson_destroy(opts);
  bson_destroy(ev1);
  bson_destroy(ev2);
  mongoc_collection_destroy(c);
}

typedef struct {
  mongoc_client_pool_t *pool;
  int delay_ms;
} delayed_insert_t;

static void *insert_later(void *p) {
  delayed_insert_t *d = p;
  struct timespec ts = {d->delay_ms / 1000, (long)(d->delay_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL); /* the point of the test: the write happens while getMore waits */
  mongoc_client_t *client = mongoc_client_pool_pop(d->pool);
  mongoc_collection_t *c = mongoc_client_get_collection(client, "cs", "await");
  bson_t *doc = BCON_NEW("_id", BCON_INT32(7));
  mongoc_collection_insert_one(c, doc, NULL, NULL, NULL);
  bson_destroy(doc);
  mongoc_collection_destroy(c);
  mongoc_client_pool_push(d->pool, client);
  return NULL;
}

static void test_await_data_timing(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "await");
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 700}");
  const bson_t *ev;
  /* an idle getMore waits about maxAwaitTimeMS, then returns an empty batch */
  int64_t t0 = obx_test_now_ms();
  assert_false(mongoc_change_stream_next(cs, &ev));
  int64_t waited = obx_test_now_ms() - t0;
  if (waited < 600 || waited > 5000) fail_msg("idle getMore took %lld ms, want ~700", (long long)waited);
  mongoc_change_stream_destroy(cs);
  /* a write during the wait is delivered at once, not at the end of the wait */
  cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 8000}");
  mongoc_uri_t *uri = mongoc_uri_new(g_m.uri);
  delayed_insert_t d = {mongoc_client_pool_new(uri), 300};
  pthread_t th;
  t0 = obx_test_now_ms();
  pthread_create(&th, NULL, insert_later, &d);
  bool got = mongoc_change_stream_next(cs, &ev);
  waited = obx_test_now_ms() - t0;
  pthread_join(th, NULL);
  assert_true(got);
  expect_op(ev, "insert", 7);
  if (waited > 6000) fail_msg("event arrived after %lld ms, want soon after the insert", (long long)waited);
  mongoc_change_stream_destroy(cs);
  mongoc_client_pool_destroy(d.pool);
  mongoc_uri_destroy(uri);
  mongoc_collection_destroy(c);
}

static void test_post_batch_token_advances(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "pbrt");
  mongoc_collection_t *other = mongoc_client_get_collection(g_client, "cs", "pbrt_other");
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 100}");
  const bson_t *ev;
  char prev[128] = "";
  for (int round = 0; round < 3; round++) {
    assert_false(mongoc_change_stream_next(cs, &ev));
    const bson_t *tok = mongoc_change_stream_get_resume_token(cs);
    assert_non_null(tok);
    char now[128];
    snprintf(now, sizeof now, "%s", str_at(tok, "_data"));
    assert_true(strlen(now) > 0);
    if (strcmp(now, prev) <= 0) fail_msg("token did not advance while idle: %s then %s", prev, now);
    snprintf(prev, sizeof prev, "%s", now);
    insert(other, "{}"); /* writes elsewhere move the position too */
  }
  mongoc_change_stream_destroy(cs);
  mongoc_collection_destroy(c);
  mongoc_collection_destroy(other);
}

static void test_history_lost(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, "--oplog-size 5"));
  mongoc_client_t *client = obx_test_mongo_client(&m, NULL, NULL);
  mongoc_collection_t *c = mongoc_client_get_collection(client, "cs", "lost");
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 100}");
  insert(c, "{\"_id\": 1}");
  bson_t *ev = next_event(cs, 10000);
  expect_op(ev, "insert", 1);
  mongoc_change_stream_destroy(cs);
  for (int i = 2; i < 12; i++) {
    char json[32];
    snprintf(json, sizeof json, "{\"_id\": %d}", i);
    insert(c, json);
  }
  bson_iter_t it;
  bson_t token;
  uint32_t len;
  const uint8_t *data;
  assert_true(bson_iter_init_find(&it, ev, "_id"));
  bson_iter_document(&it, &len, &data);
  bson_init_static(&token, data, len);
  bson_t *opts = bson_new();
  BSON_APPEND_DOCUMENT(opts, "resumeAfter", &token);
  bson_t pipeline = BSON_INITIALIZER;
  cs = mongoc_collection_watch(c, &pipeline, opts);
  const bson_t *doc, *err_doc;
  bson_error_t error;
  assert_false(mongoc_change_stream_next(cs, &doc));
  assert_true(mongoc_change_stream_error_document(cs, &error, &err_doc));
  assert_int_equal(error.code, 286);
  mongoc_change_stream_destroy(cs);
  bson_destroy(opts);
  bson_destroy(ev);
  mongoc_collection_destroy(c);
  mongoc_client_destroy(client);
  obx_test_mongo_stop(&m);
}

static int64_t fail_point(const char *json) { return obx_test_fail_point(g_client, json); }

/* Reads ids first..last in order from cs. */
static void expect_ids(mongoc_change_stream_t *cs, int first, int last) {
  for (int id = first; id <= last; id++) {
    bson_t *ev = next_event(cs, 15000);
    expect_op(ev, "insert", id);
    bson_destroy(ev);
  }
}

static void test_resume_after_faults(void **state) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, "cs", "faults");
  mongoc_change_stream_t *cs = watch(c, NULL, "{\"maxAwaitTimeMS\": 200, \"batchSize\": 2}");
  for (int i = 1; i <= 9; i++) {
    char json[32];
    snprintf(json, sizeof json, "{\"_id\": %d}", i);
    insert(c, json);
  }
  expect_ids(cs, 1, 3);
  /* dropped connection on getMore: the driver re-runs aggregate with resumeAfter */
  fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": "
             "{\"failCommands\": [\"getMore\"], \"closeConnection\": true}}");
  expect_ids(cs, 4, 6);
  assert_int_equal(fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}"), 1);
  /* a resumable error after cursor checkout carries ResumableChangeStreamError: resumed too */
  fail_point("{\"configureFailPoint\": \"failGetMoreAfterCursorCheckout\", \"mode\": {\"times\": 1}, "
             "\"data\": {\"errorCode\": 6}}");
  expect_ids(cs, 7, 9);
  assert_int_equal(
    fail_point("{\"configureFailPoint\": \"failGetMoreAfterCursorCheckout\", \"mode\": \"off\"}"), 1);
  const bson_t *ev;
  assert_false(mongoc_change_stream_next(cs, &ev)); /* nothing repeated */
  mongoc_change_stream_destroy(cs);
  mongoc_collection_destroy(c);
}

static void test_database_watch_and_drop(void **state) {
  mongoc_database_t *db = mongoc_client_get_database(g_client, "csdb");
  mongoc_collection_t *a = mongoc_database_get_collection(db, "a");
  mongoc_collection_t *b = mongoc_database_get_collection(db, "b");
  bson_t pipeline = BSON_INITIALIZER;
  bson_t *opts = BCON_NEW("maxAwaitTimeMS", BCON_INT32(200));
  mongoc_change_stream_t *dbs = mongoc_database_watch(db, &pipeline, opts);
  mongoc_change_stream_t *all = mongoc_client_watch(g_client, &pipeline, opts);
  mongoc_change_stream_t *cs = watch(a, NULL, "{\"maxAwaitTimeMS\": 200}");
  mongoc_collection_t *elsewhere = mongoc_client_get_collection(g_client, "csdb_other", "x");
  insert(elsewhere, "{\"_id\": 0}");
  insert(a, "{\"_id\": 1}");
  insert(b, "{\"_id\": 2}");
  /* the cluster-wide stream sees all three databases' writes, in order */
  for (int id = 0; id <= 2; id++) {
    bson_t *ev = next_event(all, 10000);
    expect_op(ev, "insert", id);
    bson_destroy(ev);
  }
  mongoc_change_stream_destroy(all);
  mongoc_collection_destroy(elsewhere);
  bson_t *ev = next_event(dbs, 10000);
  expect_op(ev, "insert", 1);
  assert_string_equal(str_at(ev, "ns.coll"), "a");
  bson_destroy(ev);
  ev = next_event(dbs, 10000);
  expect_op(ev, "insert", 2);
  assert_string_equal(str_at(ev, "ns.coll"), "b");
  bson_destroy(ev);
  /* dropping the watched collection: drop, then invalidate */
  bson_error_t error;
  assert_true(mongoc_collection_drop(a, &error));
  ev = next_event(cs, 10000);
  expect_op(ev, "insert", 1);
  bson_destroy(ev);
  ev = next_event(cs, 10000);
  assert_non_null(ev);
  assert_string_equal(str_at(ev, "operationType"), "drop");
  bson_destroy(ev);
  ev = next_event(cs, 10000);
  assert_non_null(ev);
  assert_string_equal(str_at(ev, "operationType"), "invalidate");
  bson_destroy(ev);
  mongoc_change_stream_destroy(cs);
  mongoc_change_stream_destroy(dbs);
  bson_destroy(opts);
  mongoc_collection_destroy(a);
  mongoc_collection_destroy(b);
  mongoc_database_destroy(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_event_shapes),
    cmocka_unit_test(test_update_lookup_and_match),
    cmocka_unit_test(test_transaction_events),
    cmocka_unit_test(test_resume_options),
    cmocka_unit_test(test_await_data_timing),
    cmocka_unit_test(test_post_batch_token_advances),
    cmocka_unit_test(test_history_lost),
    cmocka_unit_test(test_resume_after_faults),
    cmocka_unit_test(test_database_watch_and_drop),
    cmocka_unit_test(test_images),
    cmocka_unit_test(test_truncated_arrays),
    cmocka_unit_test(test_stage_errors),
    cmocka_unit_test(test_rename_and_invalidate),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
