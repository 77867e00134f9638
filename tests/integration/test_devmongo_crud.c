/* test_devmongo_crud.c - devmongod CRUD, cursors, bulk writes, indexes and TTL via libmongoc
 *
 * DESIGN: one devmongod for the whole group (setup/teardown), one collection per test. Every
 * assertion goes through the public driver API the product uses. */
#include <stdio.h>
#include <string.h>

#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_fixture.h"

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;

static int setup(void **state) { return obx_test_fixture_mongo_setup(&g_m, "--ttl-interval-ms 100", &g_client); }

static int teardown(void **state) { return obx_test_fixture_mongo_teardown(&g_m, g_client); }

static mongoc_collection_t *coll(const char *name) {
  return mongoc_client_get_collection(g_client, "crud", name);
}

static void insert(mongoc_collection_t *c, const char *json) {
  bson_error_t error;
  bson_t *doc = obx_test_bson(json);
  if (!mongoc_collection_insert_one(c, doc, NULL, NULL, &error)) fail_msg("insert %s: %s", json, error.message);
  bson_destroy(doc);
}

/* Runs find and returns the concatenated relaxed JSON of the results' field `field`. */
static void find_field(mongoc_collection_t *c, const char *filter, const char *opts,
                       const char *field, char *out, size_t outlen) {
  bson_t *f = obx_test_bson(filter), *o = opts ? obx_test_bson(opts) : NULL;
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, f, o, NULL);
  const bson_t *doc;
  out[0] = 0;
  while (mongoc_cursor_next(cur, &doc)) {
    bson_iter_t it;
    char part[128] = "-";
    if (bson_iter_init_find(&it, doc, field)) {
      if (BSON_ITER_HOLDS_UTF8(&it)) snprintf(part, sizeof part, "%s", bson_iter_utf8(&it, NULL));
      else snprintf(part, sizeof part, "%lld", (long long)bson_iter_as_int64(&it));
    }
    size_t o2 = strlen(out);
    snprintf(out + o2, outlen - o2, "%s%s", o2 ? "," : "", part);
  }
  bson_error_t error;
  if (mongoc_cursor_error(cur, &error)) fail_msg("find %s: %s", filter, error.message);
  mongoc_cursor_destroy(cur);
  bson_destroy(f);
  bson_destroy(o);
}

static void expect_find(mongoc_collection_t *c, const char *filter, const char *opts, const char *want) {
  char got[2048];
  find_field(c, filter, opts, "k", got, sizeof got);
  if (strcmp(got, want)) fail_msg("find %s %s: got [%s] want [%s]", filter, opts ? opts : "", got, want);
}

/* createIndexes with one index {key, name, ...opts}, named the way the driver names it. */
static bool try_create_index(mongoc_collection_t *c, const char *keys_json, const char *opts_json,
                             bson_error_t *error) {
  bson_t *keys = obx_test_bson(keys_json), *opts = opts_json ? obx_test_bson(opts_json) : bson_new();
  char *name = mongoc_collection_keys_to_index_string(keys);
  bson_t *spec = bson_new(), *cmd = bson_new(), arr;
  BSON_APPEND_DOCUMENT(spec, "key", keys);
  BSON_APPEND_UTF8(spec, "name", name);
  bson_concat(spec, opts);
  BSON_APPEND_UTF8(cmd, "createIndexes", mongoc_collection_get_name(c));
  bson_append_array_begin(cmd, "indexes", -1, &arr);
  BSON_APPEND_DOCUMENT(&arr, "0", spec);
  bson_append_array_end(cmd, &arr);
  bool ok = mongoc_collection_write_command_with_opts(c, cmd, NULL, NULL, error);
  bson_destroy(cmd);
  bson_destroy(spec);
  bson_free(name);
  bson_destroy(keys);
  bson_destroy(opts);
  return ok;
}

static void create_index(mongoc_collection_t *c, const char *keys_json, const char *opts_json) {
  bson_error_t error;
  if (!try_create_index(c, keys_json, opts_json, &error))
    fail_msg("createIndexes %s: %s", keys_json, error.message);
}

static void test_find_filters_sort_projection(void **state) {
  mongoc_collection_t *c = coll("find");
  insert(c, "{\"_id\": 1, \"k\": 1, \"s\": \"PENDING\", \"n\": 5, \"tags\": [\"a\", \"b\"], \"o\": {\"x\": 1}}");
  insert(c, "{\"_id\": 2, \"k\": 2, \"s\": \"PUBLISHED\", \"n\": 10, \"tags\": [\"b\"], \"o\": {\"x\": 2}}");
  insert(c, "{\"_id\": 3, \"k\": 3, \"s\": \"FAILED\", \"n\": 15}");
  insert(c, "{\"_id\": 4, \"k\": 4, \"s\": \"PENDING\", \"n\": 20, \"o\": {\"x\": 2}}");
  expect_find(c, "{\"s\": \"PENDING\"}", NULL, "1,4");
  expect_find(c, "{\"s\": {\"$in\": [\"FAILED\", \"PUBLISHED\"]}}", NULL, "2,3");
  expect_find(c, "{\"s\": {\"$nin\": [\"PENDING\"]}}", NULL, "2,3");
  expect_find(c, "{\"s\": {\"$ne\": \"PENDING\"}}", NULL, "2,3");
  expect_find(c, "{\"n\": {\"$gt\": 5, \"$lte\": 15}}", NULL, "2,3");
  expect_find(c, "{\"o\": {\"$exists\": false}}", NULL, "3");
  expect_find(c, "{\"o.x\": 2}", NULL, "2,4");
  expect_find(c, "{\"tags\": \"b\"}", NULL, "1,2");
  expect_find(c, "{\"$or\": [{\"k\": 1}, {\"n\": {\"$gte\": 20}}]}", NULL, "1,4");
  expect_find(c, "{\"$and\": [{\"s\": \"PENDING\"}, {\"n\": {\"$lt\": 10}}]}", NULL, "1");
  expect_find(c, "{}", "{\"sort\": {\"n\": -1}}", "4,3,2,1");
  expect_find(c, "{}", "{\"sort\": {\"s\": 1, \"k\": -1}, \"skip\": 1, \"limit\": 2}", "4,1");
  char got[256];
  find_field(c, "{\"_id\": 2}", "{\"projection\": {\"k\": 0}}", "k", got, sizeof got);
  assert_string_equal(got, "-");
  find_field(c, "{\"_id\": 2}", "{\"projection\": {\"s\": 1}}", "s", got, sizeof got);
  assert_string_equal(got, "PUBLISHED");
  mongoc_collection_destroy(c);
}

static void test_cursor_batches(void **state) {
  mongoc_collection_t *c = coll("cursor");
  for (int i = 0; i < 250; i++) {
    char json[64];
    snprintf(json, sizeof json, "{\"k\": %d}", i);
    insert(c, json);
  }
  bson_t *f = obx_test_bson("{}"), *o = obx_test_bson("{\"batchSize\": 7, \"sort\": {\"k\": 1}}");
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, f, o, NULL);
  const bson_t *doc;
  int n = 0;
  while (mongoc_cursor_next(cur, &doc)) {
    bson_iter_t it;
    assert_true(bson_iter_init_find(&it, doc, "k"));
    assert_int_equal(bson_iter_int32(&it), n);
    n++;
    if (n == 10) assert_int_not_equal(mongoc_cursor_get_id(cur), 0);
  }
  assert_int_equal(n, 250);
  mongoc_cursor_destroy(cur);
  /* abandoning an open cursor sends killCursors; a getMore on it then fails with 43 */
  cur = mongoc_collection_find_with_opts(c, f, o, NULL);
  assert_true(mongoc_cursor_next(cur, &doc));
  int64_t id = mongoc_cursor_get_id(cur);
  assert_int_not_equal(id, 0);
  mongoc_cursor_destroy(cur);
  bson_t *gm = BCON_NEW("getMore", BCON_INT64(id), "collection", "cursor");
  bson_t reply;
  bson_error_t error;
  assert_false(mongoc_client_command_simple(g_client, "crud", gm, NULL, &reply, &error));
  assert_int_equal(error.code, 43);
  bson_destroy(&reply);
  bson_destroy(gm);
  bson_destroy(f);
  bson_destroy(o);
  mongoc_collection_destroy(c);
}

static void test_bulk_ordered_unordered(void **state) {
  mongoc_collection_t *c = coll("bulk");
  bson_error_t error;
  bson_t reply;
  for (int ordered = 1; ordered >= 0; ordered--) {
    bson_t *opts = BCON_NEW("ordered", BCON_BOOL(ordered));
    mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(c, opts);
    const char *docs[] = {"{\"_id\": 1}", "{\"_id\": 2}", "{\"_id\": 1}", "{\"_id\": 3}"};
    for (int i = 0; i < 4; i++) {
      bson_t *d = obx_test_bson(docs[i]);
      mongoc_bulk_operation_insert(bulk, d);
      bson_destroy(d);
    }
    assert_false(mongoc_bulk_operation_execute(bulk, &reply, &error));
    bson_iter_t it, we;
    assert_true(bson_iter_init_find(&it, &reply, "nInserted"));
    /* ordered (empty collection) stops at the duplicate at index 2; unordered (second round:
     * 1 and 2 exist) fails indexes 0, 1, 2 and still inserts 3 */
    assert_int_equal(bson_iter_as_int64(&it), ordered ? 2 : 1);
    assert_true(bson_iter_init_find(&it, &reply, "writeErrors"));
    assert_true(bson_iter_recurse(&it, &we) && bson_iter_next(&we));
    bson_t first;
    uint32_t len;
    const uint8_t *data;
    bson_iter_document(&we, &len, &data);
    bson_init_static(&first, data, len);
    bson_iter_t f;
    assert_true(bson_iter_init_find(&f, &first, "index"));
    assert_int_equal(bson_iter_int32(&f), ordered ? 2 : 0);
    assert_true(bson_iter_init_find(&f, &first, "code"));
    assert_int_equal(bson_iter_int32(&f), 11000);
    bson_destroy(&reply);
    mongoc_bulk_operation_destroy(bulk);
    bson_destroy(opts);
  }
  bson_t *all = obx_test_bson("{}");
  assert_int_equal(mongoc_collection_estimated_document_count(c, NULL, NULL, NULL, &error), 3);
  bson_destroy(all);
  mongoc_collection_destroy(c);
}

static void test_update_upsert_delete(void **state) {
  mongoc_collection_t *c = coll("update");
  bson_error_t error;
  bson_t reply;
  bson_iter_t it;
  insert(c, "{\"_id\": 1, \"k\": 1, \"n\": 1, \"list\": []}");
  insert(c, "{\"_id\": 2, \"k\": 2, \"n\": 1}");
  bson_t *q = obx_test_bson("{\"_id\": 1}"), *u = obx_test_bson("{\"$set\": {\"s\": \"X\"}, \"$inc\": {\"n\": 2}, "
                                         "\"$push\": {\"list\": 7}, \"$unset\": {\"k\": \"\"}, "
                                         "\"$currentDate\": {\"at\": true}}");
  assert_true(mongoc_collection_update_one(c, q, u, NULL, &reply, &error));
  assert_true(bson_iter_init_find(&it, &reply, "modifiedCount"));
  assert_int_equal(bson_iter_as_int64(&it), 1);
  bson_destroy(&reply);
  bson_destroy(u);
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  const bson_t *doc;
  assert_true(mongoc_cursor_next(cur, &doc));
  assert_true(bson_iter_init_find(&it, doc, "n"));
  assert_int_equal(bson_iter_as_int64(&it), 3);
  assert_false(bson_iter_init_find(&it, doc, "k"));
  assert_true(bson_iter_init_find(&it, doc, "at") && BSON_ITER_HOLDS_DATE_TIME(&it));
  mongoc_cursor_destroy(cur);
  bson_destroy(q);
  /* upsert: seeded from the filter, $setOnInsert applied, id reported */
  q = obx_test_bson("{\"k\": 9}");
  u = obx_test_bson("{\"$set\": {\"s\": \"new\"}, \"$setOnInsert\": {\"created\": true}}");
  bson_t *opts = obx_test_bson("{\"upsert\": true}");
  assert_true(mongoc_collection_update_one(c, q, u, opts, &reply, &error));
  assert_true(bson_iter_init_find(&it, &reply, "upsertedId"));
  bson_destroy(&reply);
  expect_find(c, "{\"created\": true, \"s\": \"new\"}", NULL, "9");
  /* a second upsert with the same filter matches instead */
  assert_true(mongoc_collection_update_one(c, q, u, opts, &reply, &error));
  assert_false(bson_iter_init_find(&it, &reply, "upsertedId"));
  bson_destroy(&reply);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(opts);
  /* replacement keeps _id; update_many; delete */
  q = obx_test_bson("{\"_id\": 2}");
  u = obx_test_bson("{\"k\": 22}");
  assert_true(mongoc_collection_replace_one(c, q, u, NULL, NULL, &error));
  expect_find(c, "{\"_id\": 2}", NULL, "22");
  bson_destroy(u);
  /* an aggregation-pipeline update */
  u = obx_test_bson("[{\"$set\": {\"k\": {\"$add\": [\"$k\", 1]}}}]");
  if (!mongoc_collection_update_one(c, q, u, NULL, NULL, &error)) fail_msg("pipeline update: %s", error.message);
  expect_find(c, "{\"_id\": 2}", NULL, "23");
  bson_destroy(q);
  bson_destroy(u);
  /* an unacknowledged write (moreToCome, no reply) lands, and the connection stays in step */
  bson_t *w0 = obx_test_bson("{\"writeConcern\": {\"w\": 0}}"), *d50 = obx_test_bson("{\"_id\": 50, \"k\": 50}");
  assert_true(mongoc_collection_insert_one(c, d50, w0, NULL, &error));
  expect_find(c, "{\"_id\": 50}", NULL, "50");
  bson_destroy(w0);
  bson_destroy(d50);
  q = obx_test_bson("{\"_id\": 50}");
  assert_true(mongoc_collection_delete_one(c, q, NULL, NULL, &error));
  bson_destroy(q);
  q = obx_test_bson("{}");
  u = obx_test_bson("{\"$set\": {\"all\": 1}}");
  assert_true(mongoc_collection_update_many(c, q, u, NULL, &reply, &error));
  assert_true(bson_iter_init_find(&it, &reply, "matchedCount"));
  assert_int_equal(bson_iter_as_int64(&it), 3);
  bson_destroy(&reply);
  bson_destroy(u);
  bson_t *dq = obx_test_bson("{\"k\": 23}");
  assert_true(mongoc_collection_delete_one(c, dq, NULL, &reply, &error));
  assert_true(bson_iter_init_find(&it, &reply, "deletedCount"));
  assert_int_equal(bson_iter_as_int64(&it), 1);
  bson_destroy(&reply);
  bson_destroy(dq);
  assert_true(mongoc_collection_delete_many(c, q, NULL, &reply, &error));
  assert_true(bson_iter_init_find(&it, &reply, "deletedCount"));
  assert_int_equal(bson_iter_as_int64(&it), 2);
  bson_destroy(&reply);
  bson_destroy(q);
  mongoc_collection_destroy(c);
}

static void test_find_and_modify(void **state) {
  mongoc_collection_t *c = coll("fam");
  bson_error_t error;
  bson_t reply;
  bson_iter_t it, v;
  insert(c, "{\"_id\": 1, \"k\": 1, \"s\": \"PENDING\"}");
  insert(c, "{\"_id\": 2, \"k\": 2, \"s\": \"PENDING\"}");
  bson_t *q = obx_test_bson("{\"s\": \"PENDING\"}"), *sort = obx_test_bson("{\"k\": -1}");
  bson_t *u = obx_test_bson("{\"$set\": {\"s\": \"TAKEN\"}}");
  mongoc_find_and_modify_opts_t *opts = mongoc_find_and_modify_opts_new();
  mongoc_find_and_modify_opts_set_sort(opts, sort);
  mongoc_find_and_modify_opts_set_update(opts, u);
  mongoc_find_and_modify_opts_set_flags(opts, MONGOC_FIND_AND_MODIFY_RETURN_NEW);
  assert_true(mongoc_collection_find_and_modify_with_opts(c, q, opts, &reply, &error));
  assert_true(bson_iter_init_find(&it, &reply, "value") && bson_iter_recurse(&it, &v));
  assert_true(bson_iter_find(&v, "_id"));
  assert_int_equal(bson_iter_int32(&v), 2);
  assert_true(bson_iter_init_find(&it, &reply, "value") && bson_iter_recurse(&it, &v));
  assert_true(bson_iter_find(&v, "s"));
  assert_string_equal(bson_iter_utf8(&v, NULL), "TAKEN");
  bson_destroy(&reply);
  mongoc_find_and_modify_opts_destroy(opts);
  /* remove returns the removed document */
  opts = mongoc_find_and_modify_opts_new();
  mongoc_find_and_modify_opts_set_flags(opts, MONGOC_FIND_AND_MODIFY_REMOVE);
  assert_true(mongoc_collection_find_and_modify_with_opts(c, q, opts, &reply, &error));
  assert_true(bson_iter_init_find(&it, &reply, "value") && bson_iter_recurse(&it, &v));
  assert_true(bson_iter_find(&v, "_id"));
  assert_int_equal(bson_iter_int32(&v), 1);
  bson_destroy(&reply);
  mongoc_find_and_modify_opts_destroy(opts);
  expect_find(c, "{}", NULL, "2");
  bson_destroy(q);
  bson_destroy(sort);
  bson_destroy(u);
  mongoc_collection_destroy(c);
}

static void test_count_distinct_aggregate(void **state) {
  mongoc_collection_t *c = coll("agg");
  bson_error_t error;
  insert(c, "{\"k\": 1, \"org\": \"a\", \"v\": 10}");
  insert(c, "{\"k\": 2, \"org\": \"a\", \"v\": 5}");
  insert(c, "{\"k\": 3, \"org\": \"b\", \"v\": 1}");
  bson_t *q = obx_test_bson("{\"org\": \"a\"}");
  assert_int_equal(mongoc_collection_count_documents(c, q, NULL, NULL, NULL, &error), 2);
  bson_t *none = obx_test_bson("{\"org\": \"zz\"}");
  assert_int_equal(mongoc_collection_count_documents(c, none, NULL, NULL, NULL, &error), 0);
  bson_t *cmd = BCON_NEW("distinct", "agg", "key", "org");
  bson_t reply;
  assert_true(mongoc_collection_read_command_with_opts(c, cmd, NULL, NULL, &reply, &error));
  bson_iter_t it, arr;
  assert_true(bson_iter_init_find(&it, &reply, "values") && bson_iter_recurse(&it, &arr));
  int n = 0;
  while (bson_iter_next(&arr)) n++;
  assert_int_equal(n, 2);
  bson_destroy(&reply);
  bson_destroy(cmd);
  bson_t *pipeline = obx_test_bson("[{\"$match\": {\"v\": {\"$gte\": 5}}}, {\"$group\": {\"_id\": \"$org\", "
                       "\"total\": {\"$sum\": \"$v\"}}}, {\"$sort\": {\"_id\": 1}}]");
  mongoc_cursor_t *cur = mongoc_collection_aggregate(c, MONGOC_QUERY_NONE, pipeline, NULL, NULL);
  const bson_t *doc;
  assert_true(mongoc_cursor_next(cur, &doc));
  assert_true(bson_iter_init_find(&it, doc, "total"));
  assert_int_equal(bson_iter_as_int64(&it), 15);
  assert_false(mongoc_cursor_next(cur, &doc));
  assert_false(mongoc_cursor_error(cur, &error));
  mongoc_cursor_destroy(cur);
  bson_destroy(pipeline);
  bson_destroy(q);
  bson_destroy(none);
  mongoc_collection_destroy(c);
}

/* The values of field k (or n, as $count names it) of an aggregate's results, comma-separated. */
static void aggregate_field(mongoc_collection_t *c, const char *pipeline_json, char *out, size_t outlen) {
  bson_t *pipeline = obx_test_bson(pipeline_json);
  mongoc_cursor_t *cur = mongoc_collection_aggregate(c, MONGOC_QUERY_NONE, pipeline, NULL, NULL);
  const bson_t *doc;
  out[0] = 0;
  while (mongoc_cursor_next(cur, &doc)) {
    bson_iter_t it;
    bool has = bson_iter_init_find(&it, doc, "k") || bson_iter_init_find(&it, doc, "n");
    size_t len = strlen(out);
    snprintf(out + len, outlen - len, "%s%lld", len ? "," : "", has ? (long long)bson_iter_as_int64(&it) : -1LL);
  }
  bson_error_t error;
  if (mongoc_cursor_error(cur, &error)) fail_msg("aggregate %s: %s", pipeline_json, error.message);
  mongoc_cursor_destroy(cur);
  bson_destroy(pipeline);
}

/* $skip, $limit and $count in an aggregate, and countDocuments with skip/limit options (which
 * libmongoc turns into the same stages). */
static void test_count_skip_limit(void **state) {
  static const struct {
    const char *pipeline, *want; /* want: "" when no document comes back */
  } aggs[] = {
    {"[{\"$match\": {\"org\": \"a\"}}, {\"$skip\": 1}, {\"$limit\": 2}, {\"$count\": \"n\"}]", "2"},
    {"[{\"$match\": {\"org\": \"a\"}}, {\"$skip\": 4}, {\"$limit\": 2}, {\"$count\": \"n\"}]", "1"},
    {"[{\"$match\": {\"org\": \"a\"}}, {\"$skip\": 5}, {\"$count\": \"n\"}]", ""},
    {"[{\"$match\": {\"org\": \"a\"}}, {\"$count\": \"n\"}]", "5"},
    {"[{\"$match\": {\"org\": \"a\"}}, {\"$sort\": {\"k\": -1}}, {\"$skip\": 1}, {\"$limit\": 2}]", "4,3"},
  };
  static const struct {
    const char *opts;
    int64_t want;
  } counts[] = {
    {NULL, 5}, {"{\"skip\": 1, \"limit\": 2}", 2}, {"{\"skip\": 3}", 2},
    {"{\"limit\": 10}", 5}, {"{\"skip\": 10}", 0}, {"{\"skip\": 4, \"limit\": 2}", 1},
  };
  mongoc_collection_t *c = coll("skiplimit");
  for (int k = 1; k <= 6; k++) {
    char doc[64];
    snprintf(doc, sizeof doc, "{\"k\": %d, \"org\": \"%s\"}", k, k <= 5 ? "a" : "b");
    insert(c, doc);
  }
  for (size_t i = 0; i < sizeof aggs / sizeof aggs[0]; i++) {
    char got[128];
    aggregate_field(c, aggs[i].pipeline, got, sizeof got);
    if (strcmp(got, aggs[i].want) != 0) fail_msg("aggregate %s: got [%s] want [%s]", aggs[i].pipeline, got, aggs[i].want);
  }
  bson_t *q = obx_test_bson("{\"org\": \"a\"}");
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    bson_error_t error;
    bson_t *opts = counts[i].opts ? obx_test_bson(counts[i].opts) : NULL;
    int64_t got = mongoc_collection_count_documents(c, q, opts, NULL, NULL, &error);
    if (got != counts[i].want)
      fail_msg("countDocuments {org: a} %s: got %lld (%s) want %lld", counts[i].opts ? counts[i].opts : "", (long long)got,
               got < 0 ? error.message : "", (long long)counts[i].want);
    bson_destroy(opts);
  }
  bson_destroy(q);
  mongoc_collection_destroy(c);
}

static void test_collections_and_indexes(void **state) {
  mongoc_database_t *db = mongoc_client_get_database(g_client, "crud_admin");
  bson_error_t error;
  mongoc_collection_t *c = mongoc_database_create_collection(db, "made", NULL, &error);
  assert_non_null(c);
  assert_null(mongoc_database_create_collection(db, "made", NULL, &error));
  assert_int_equal(error.code, 48);
  create_index(c, "{\"orgId\": 1, \"orderNumber\": 1}", NULL);
  char **names = mongoc_database_get_collection_names_with_opts(db, NULL, &error);
  assert_non_null(names);
  assert_string_equal(names[0], "made");
  assert_null(names[1]);
  bson_strfreev(names);
  mongoc_cursor_t *cur = mongoc_collection_find_indexes_with_opts(c, NULL);
  const bson_t *doc;
  int n = 0;
  bool found = false;
  while (mongoc_cursor_next(cur, &doc)) {
    bson_iter_t it;
    n++;
    if (bson_iter_init_find(&it, doc, "name") && !strcmp(bson_iter_utf8(&it, NULL), "orgId_1_orderNumber_1"))
      found = true;
  }
  mongoc_cursor_destroy(cur);
  assert_int_equal(n, 2);
  assert_true(found);
  assert_true(mongoc_collection_drop_index(c, "orgId_1_orderNumber_1", &error));
  assert_true(mongoc_collection_drop(c, &error));
  assert_false(mongoc_collection_drop(c, &error));
  assert_int_equal(error.code, 26);
  mongoc_collection_destroy(c);
  c = mongoc_database_get_collection(db, "other");
  insert(c, "{\"a\": 1}");
  assert_true(mongoc_database_drop(db, &error));
  names = mongoc_database_get_collection_names_with_opts(db, NULL, &error);
  assert_null(names[0]);
  bson_strfreev(names);
  mongoc_collection_destroy(c);
  mongoc_database_destroy(db);
}

static bool try_insert(mongoc_collection_t *c, const char *json, bson_error_t *error) {
  bson_t *doc = obx_test_bson(json);
  bool ok = mongoc_collection_insert_one(c, doc, NULL, NULL, error);
  bson_destroy(doc);
  return ok;
}

static void test_unique_compound_partial(void **state) {
  mongoc_collection_t *c = coll("uniq");
  bson_error_t error;
  create_index(c, "{\"orgId\": 1, \"orderNumber\": 1}", "{\"unique\": true}");
  create_index(c, "{\"orgId\": 1, \"idem\": 1}",
               "{\"unique\": true, \"partialFilterExpression\": {\"idem\": {\"$exists\": true}}}");
  assert_true(try_insert(c, "{\"orgId\": \"o1\", \"orderNumber\": 1}", &error));
  assert_true(try_insert(c, "{\"orgId\": \"o2\", \"orderNumber\": 1}", &error));
  assert_false(try_insert(c, "{\"orgId\": \"o1\", \"orderNumber\": 1}", &error));
  assert_int_equal(error.code, 11000);
  if (!strstr(error.message, "E11000 duplicate key error") ||
      !strstr(error.message, "dup key: { orgId: \"o1\", orderNumber: 1 }"))
    fail_msg("got errmsg [%s]", error.message);
  /* partial: documents without idem never collide; with it they do */
  assert_true(try_insert(c, "{\"orgId\": \"o1\", \"orderNumber\": 2}", &error));
  assert_true(try_insert(c, "{\"orgId\": \"o1\", \"orderNumber\": 3, \"idem\": \"x\"}", &error));
  assert_false(try_insert(c, "{\"orgId\": \"o1\", \"orderNumber\": 4, \"idem\": \"x\"}", &error));
  assert_int_equal(error.code, 11000);
  assert_true(try_insert(c, "{\"orgId\": \"o2\", \"orderNumber\": 4, \"idem\": \"x\"}", &error));
  /* an update into a duplicate is refused too; the numeric key 1.0 equals 1 */
  bson_t *q = obx_test_bson("{\"orderNumber\": 2}"), *u = obx_test_bson("{\"$set\": {\"orderNumber\": 1.0}}");
  assert_false(mongoc_collection_update_one(c, q, u, NULL, NULL, &error));
  assert_int_equal(error.code, 11000);
  bson_destroy(q);
  bson_destroy(u);
  /* creating a unique index over existing duplicates fails */
  assert_false(try_create_index(c, "{\"orgId\": 1}", "{\"unique\": true}", &error));
  assert_int_equal(error.code, 11000);
  mongoc_collection_destroy(c);
}

static mongoc_collection_t *g_ttl;

static bool ttl_gone(void *ctx) {
  bson_error_t error;
  bson_t *f = obx_test_bson("{\"kind\": \"old\"}");
  int64_t n = mongoc_collection_count_documents(g_ttl, f, NULL, NULL, NULL, &error);
  bson_destroy(f);
  return n == 0;
}

static void test_ttl_with_delete_event(void **state) {
  g_ttl = coll("ttl");
  bson_error_t error;
  create_index(g_ttl, "{\"publishedAt\": 1}",
               "{\"expireAfterSeconds\": 1, \"partialFilterExpression\": {\"status\": \"PUBLISHED\"}}");
  mongoc_change_stream_t *cs = mongoc_collection_watch(g_ttl, &(bson_t)BSON_INITIALIZER, NULL);
  int64_t old = (int64_t)time(NULL) * 1000 - 60000;
  bson_t *a = BCON_NEW("_id", BCON_INT32(1), "kind", "old", "status", "PUBLISHED", "publishedAt", BCON_DATE_TIME(old));
  bson_t *b = BCON_NEW("_id", BCON_INT32(2), "kind", "pending", "status", "PENDING", "publishedAt", BCON_DATE_TIME(old));
  bson_t *d = BCON_NEW("_id", BCON_INT32(3), "kind", "fresh", "status", "PUBLISHED", "publishedAt",
                       BCON_DATE_TIME((int64_t)time(NULL) * 1000 + 3600000));
  assert_true(mongoc_collection_insert_one(g_ttl, a, NULL, NULL, &error));
  assert_true(mongoc_collection_insert_one(g_ttl, b, NULL, NULL, &error));
  assert_true(mongoc_collection_insert_one(g_ttl, d, NULL, NULL, &error));
  assert_true(obx_test_wait_for(ttl_gone, NULL, 20000, 50));
  assert_int_equal(mongoc_collection_estimated_document_count(g_ttl, NULL, NULL, NULL, &error), 2);
  /* the stream sees three inserts then the TTL delete of _id 1 */
  const bson_t *ev;
  int inserts = 0, deletes = 0;
  int64_t deadline = obx_test_now_ms() + 20000;
  while (deletes == 0 && obx_test_now_ms() < deadline) {
    if (!mongoc_change_stream_next(cs, &ev)) continue;
    bson_iter_t it;
    assert_true(bson_iter_init_find(&it, ev, "operationType"));
    if (!strcmp(bson_iter_utf8(&it, NULL), "insert")) inserts++;
    if (!strcmp(bson_iter_utf8(&it, NULL), "delete")) {
      deletes++;
      bson_iter_t k;
      assert_true(bson_iter_init_find(&it, ev, "documentKey") && bson_iter_recurse(&it, &k) &&
                  bson_iter_find(&k, "_id"));
      assert_int_equal(bson_iter_int32(&k), 1);
    }
  }
  assert_int_equal(inserts, 3);
  assert_int_equal(deletes, 1);
  mongoc_change_stream_destroy(cs);
  bson_destroy(a);
  bson_destroy(b);
  bson_destroy(d);
  mongoc_collection_destroy(g_ttl);
}


/* Runs a command (JSON) on db crud; returns the error code (0: ok). */
static uint32_t command_code(const char *json) {
  bson_error_t error;
  bson_t *cmd = obx_test_bson(json), reply;
  bool ok = mongoc_client_command_simple(g_client, "crud", cmd, NULL, &reply, &error);
  bson_destroy(&reply);
  bson_destroy(cmd);
  return ok ? 0 : error.code;
}

/* Collation other than "simple" fails (mongod's code for a locale it cannot build) wherever
 * it is given, instead of being ignored. */
static void test_collation_refused(void **state) {
  mongoc_collection_t *c = coll("collation");
  insert(c, "{\"k\": \"a\"}");
  const char *refused[] = {
    "{\"find\": \"collation\", \"filter\": {}, \"collation\": {\"locale\": \"fr\"}}",
    "{\"aggregate\": \"collation\", \"pipeline\": [], \"cursor\": {}, \"collation\": {\"locale\": \"en\", \"strength\": 2}}",
    "{\"update\": \"collation\", \"updates\": [{\"q\": {}, \"u\": {\"$set\": {\"x\": 1}}, \"collation\": {\"locale\": \"de\"}}]}",
    "{\"delete\": \"collation\", \"deletes\": [{\"q\": {}, \"limit\": 0, \"collation\": {\"locale\": \"de\"}}]}",
    "{\"createIndexes\": \"collation\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", \"collation\": {\"locale\": \"fr\"}}]}",
    "{\"count\": \"collation\", \"query\": {}, \"collation\": {\"locale\": \"fr\"}}",
  };
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    uint32_t code = command_code(refused[i]);
    if (code != 2) fail_msg("%s: got code %u, want 2", refused[i], code);
  }
  assert_int_equal(command_code("{\"find\": \"collation\", \"filter\": {}, \"collation\": {\"locale\": \"simple\"}}"), 0);
  expect_find(c, "{}", NULL, "a"); /* nothing was written by the refused update/delete */
  mongoc_collection_destroy(c);
}

/* $out replaces the target's documents (keeping its indexes); $merge matches on _id or on a
 * unique index's fields with whenMatched / whenNotMatched. */
static void test_out_and_merge(void **state) {
  mongoc_collection_t *src = coll("agg_src"), *out = coll("agg_out"), *into = coll("agg_into");
  for (int i = 1; i <= 4; i++) {
    char json[64];
    snprintf(json, sizeof json, "{\"_id\": %d, \"k\": %d, \"g\": %d}", i, i * 10, i % 2);
    insert(src, json);
  }
  insert(out, "{\"_id\": 99, \"k\": 990}");
  assert_int_equal(command_code("{\"aggregate\": \"agg_src\", \"pipeline\": [{\"$match\": {\"g\": 1}}, {\"$out\": \"agg_out\"}], \"cursor\": {}}"), 0);
  expect_find(out, "{}", "{\"sort\": {\"_id\": 1}}", "10,30");
  insert(into, "{\"_id\": 1, \"k\": 0, \"keep\": true}");
  insert(into, "{\"_id\": 7, \"k\": 70}");
  assert_int_equal(command_code("{\"aggregate\": \"agg_src\", \"pipeline\": [{\"$merge\": {\"into\": \"agg_into\"}}], \"cursor\": {}}"), 0);
  expect_find(into, "{}", "{\"sort\": {\"_id\": 1}}", "10,20,30,40,70");
  char got[256];
  find_field(into, "{\"_id\": 1}", NULL, "keep", got, sizeof got);
  assert_string_equal(got, "1"); /* merge kept the target's other fields */
  assert_int_equal(command_code("{\"aggregate\": \"agg_src\", \"pipeline\": [{\"$set\": {\"k\": 5}}, {\"$merge\": "
                                "{\"into\": \"agg_into\", \"whenMatched\": \"replace\", \"whenNotMatched\": \"discard\"}}], \"cursor\": {}}"), 0);
  find_field(into, "{\"_id\": 1}", NULL, "keep", got, sizeof got);
  assert_string_equal(got, "-");
  assert_int_equal(command_code("{\"aggregate\": \"agg_src\", \"pipeline\": [{\"$merge\": {\"into\": \"agg_into\", \"whenMatched\": \"fail\"}}], \"cursor\": {}}"), 11000);
  assert_int_equal(command_code("{\"aggregate\": \"agg_src\", \"pipeline\": [{\"$merge\": {\"into\": \"agg_into\", \"on\": \"k\"}}], \"cursor\": {}}"), 51183);
  mongoc_collection_destroy(src);
  mongoc_collection_destroy(out);
  mongoc_collection_destroy(into);
}


/* arrayFilters: $[<id>] updates the elements its filter matches, $[] every element, through
 * update_one and findAndModify; an unknown or unused identifier fails as in mongod. */
static void test_array_filters(void **state) {
  mongoc_collection_t *c = coll("arrayfilters");
  insert(c, "{\"_id\": 1, \"k\": 1, \"items\": [{\"sku\": \"a\", \"q\": 1}, {\"sku\": \"b\", \"q\": 5}, {\"sku\": \"a\", \"q\": 7}], \"n\": [1, 2, 3]}");
  bson_error_t error;
  bson_t *q = obx_test_bson("{\"_id\": 1}");
  bson_t *u = obx_test_bson("{\"$inc\": {\"items.$[it].q\": 10}, \"$set\": {\"n.$[]\": 0}}");
  bson_t *opts = obx_test_bson("{\"arrayFilters\": [{\"it.sku\": \"a\"}]}");
  if (!mongoc_collection_update_one(c, q, u, opts, NULL, &error)) fail_msg("update with arrayFilters: %s", error.message);
  bson_t *want = obx_test_bson("{\"_id\": 1, \"k\": 1, \"items\": [{\"sku\": \"a\", \"q\": 11}, {\"sku\": \"b\", \"q\": 5}, "
                               "{\"sku\": \"a\", \"q\": 17}], \"n\": [0, 0, 0]}");
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
  const bson_t *got;
  assert_true(mongoc_cursor_next(cur, &got));
  if (!bson_equal(got, want)) fail_msg("after arrayFilters: got %s", bson_as_relaxed_extended_json(got, NULL));
  mongoc_cursor_destroy(cur);
  /* findAndModify with a filter on the element itself */
  assert_int_equal(command_code("{\"findAndModify\": \"arrayfilters\", \"query\": {\"_id\": 1}, \"update\": "
                                "{\"$set\": {\"n.$[z]\": 9}}, \"arrayFilters\": [{\"z\": {\"$gte\": 0}}]}"), 0);
  /* an identifier without a filter, and a filter nobody uses */
  assert_int_equal(command_code("{\"findAndModify\": \"arrayfilters\", \"query\": {\"_id\": 1}, \"update\": "
                                "{\"$set\": {\"items.$[x].q\": 0}}, \"arrayFilters\": [{\"y.q\": 1}]}"), 2);
  assert_int_equal(command_code("{\"findAndModify\": \"arrayfilters\", \"query\": {\"_id\": 1}, \"update\": "
                                "{\"$set\": {\"k\": 2}}, \"arrayFilters\": [{\"y.q\": 1}]}"), 9);
  expect_find(c, "{\"n\": 9}", NULL, "1");
  bson_destroy(want);
  bson_destroy(opts);
  bson_destroy(u);
  bson_destroy(q);
  mongoc_collection_destroy(c);
}


static int64_t find_count(mongoc_collection_t *c, const bson_t *opts, bson_error_t *error) {
  bson_t filter = BSON_INITIALIZER;
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, &filter, opts, NULL);
  const bson_t *doc;
  int64_t n = 0;
  while (mongoc_cursor_next(cur, &doc)) n++;
  if (mongoc_cursor_error(cur, error)) n = -1;
  mongoc_cursor_destroy(cur);
  return n;
}

/* A snapshot session (libmongoc keeps the atClusterTime of its first read) reads at that time;
 * once a write lands after it, devmongod has no history to serve it: SnapshotTooOld, as mongod
 * answers past its history window. */
static void test_snapshot_session(void **state) {
  mongoc_collection_t *c = coll("snapshot");
  insert(c, "{\"_id\": 1}");
  bson_error_t error;
  mongoc_session_opt_t *so = mongoc_session_opts_new();
  mongoc_session_opts_set_snapshot(so, true);
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, so, &error);
  assert_non_null(cs);
  bson_t opts = BSON_INITIALIZER;
  assert_true(mongoc_client_session_append(cs, &opts, &error));
  if (find_count(c, &opts, &error) != 1) fail_msg("first snapshot read: %s", error.message);
  if (find_count(c, &opts, &error) != 1) fail_msg("second snapshot read at the same time: %s", error.message);
  insert(c, "{\"_id\": 2}");
  assert_int_equal(find_count(c, &opts, &error), -1);
  assert_int_equal(error.code, 239);
  bson_destroy(&opts);
  mongoc_client_session_destroy(cs);
  mongoc_session_opts_destroy(so);
  mongoc_collection_destroy(c);
}


/* `let` variables are visible as $$name in $expr (find, aggregate, update filters) and in
 * pipeline expressions; an undefined one fails with 17276. */
static void test_let_variables(void **state) {
  mongoc_collection_t *c = coll("letvars");
  insert(c, "{\"_id\": 1, \"k\": 1}");
  insert(c, "{\"_id\": 2, \"k\": 5}");
  expect_find(c, "{\"$expr\": {\"$gt\": [\"$k\", \"$$lim\"]}}", "{\"let\": {\"lim\": 2}}", "5");
  char json[512];
  snprintf(json, sizeof json, "%s", "{\"aggregate\": \"letvars\", \"pipeline\": [{\"$match\": {\"$expr\": {\"$lt\": [\"$k\", \"$$lim.max\"]}}}, "
           "{\"$set\": {\"tag\": \"$$who\"}}, {\"$out\": \"letvars_out\"}], \"cursor\": {}, \"let\": {\"lim\": {\"max\": 3}, \"who\": \"ops\"}}");
  assert_int_equal(command_code(json), 0);
  mongoc_collection_t *out = coll("letvars_out");
  char got[64];
  find_field(out, "{}", NULL, "tag", got, sizeof got);
  assert_string_equal(got, "ops");
  assert_int_equal(command_code("{\"update\": \"letvars\", \"updates\": [{\"q\": {\"$expr\": {\"$eq\": [\"$k\", \"$$one\"]}}, "
                                "\"u\": {\"$set\": {\"hit\": 1}}}], \"let\": {\"one\": 1}}"), 0);
  expect_find(c, "{\"hit\": 1}", NULL, "1");
  assert_int_equal(command_code("{\"find\": \"letvars\", \"filter\": {\"$expr\": {\"$eq\": [\"$k\", \"$$nope\"]}}}"), 17276);
  mongoc_collection_destroy(out);
  mongoc_collection_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_find_filters_sort_projection),
    cmocka_unit_test(test_cursor_batches),
    cmocka_unit_test(test_bulk_ordered_unordered),
    cmocka_unit_test(test_update_upsert_delete),
    cmocka_unit_test(test_find_and_modify),
    cmocka_unit_test(test_count_distinct_aggregate),
    cmocka_unit_test(test_count_skip_limit),
    cmocka_unit_test(test_collections_and_indexes),
    cmocka_unit_test(test_unique_compound_partial),
    cmocka_unit_test(test_ttl_with_delete_event),
    cmocka_unit_test(test_collation_refused),
    cmocka_unit_test(test_out_and_merge),
    cmocka_unit_test(test_array_filters),
    cmocka_unit_test(test_snapshot_session),
    cmocka_unit_test(test_let_variables),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
