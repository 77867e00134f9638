/* test_devmongo_plan.c - devmongod's query planner, explain and profiler via libmongoc
 *
 * DESIGN: one devmongod; two collections hold the same documents, one with secondary indexes
 * (compound with a descending field, single, multikey, partial, sparse) and one with none.
 * Every query of a table must return the same documents in the same order from both (the
 * indexes change how, never what), and explain must name the plan mongod would show: IXSCAN
 * under FETCH with totalKeysExamined / totalDocsExamined, a SORT stage only when no index
 * gives the order, COLLSCAN when no index applies. The profiler (system.profile at level 2)
 * records the same plan for every query, as mongod's does. */
#include <stdio.h>
#include <string.h>

#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_fixture.h"

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;
static mongoc_collection_t *g_ix, *g_plain;

#define NDOCS 600

static void command(const char *db, const char *json, bson_t *reply) {
  bson_error_t error;
  bson_t *cmd = obx_test_bson(json);
  bson_t local;
  if (!mongoc_client_command_simple(g_client, db, cmd, NULL, reply ? reply : &local, &error))
    fail_msg("%s: %s", json, error.message);
  if (!reply) bson_destroy(&local);
  bson_destroy(cmd);
}

static int setup(void **state) {
  if (obx_test_fixture_mongo_setup(&g_m, NULL, &g_client)) return -1;
  g_ix = mongoc_client_get_collection(g_client, "plan", "ix");
  g_plain = mongoc_client_get_collection(g_client, "plan", "plain");
  for (int i = 0; i < NDOCS; i++) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"_id\": %d, \"a\": %d, \"b\": %d, \"tags\": [%d, %d], \"s\": \"k%03d\", %s \"d\": {\"$date\": %lld}, "
             "\"m\": %s}",
             i, i % 10, i, i % 3, 10 + i % 5, i % 50, i % 4 == 0 ? "\"sp\": 1," : "", 1700000000000LL + i * 1000LL,
             i % 7 == 0 ? "null" : i % 11 == 0 ? "\"str\"" : "1.5");
    bson_t *doc = obx_test_bson(json);
    bson_error_t error;
    if (!mongoc_collection_insert_one(g_ix, doc, NULL, NULL, &error) ||
        !mongoc_collection_insert_one(g_plain, doc, NULL, NULL, &error))
      return -1;
    bson_destroy(doc);
  }
  command("plan", "{\"createIndexes\": \"ix\", \"indexes\": ["
                  "{\"key\": {\"a\": 1, \"b\": -1}, \"name\": \"a_1_b_-1\"},"
                  "{\"key\": {\"b\": 1}, \"name\": \"b_1\"},"
                  "{\"key\": {\"tags\": 1}, \"name\": \"tags_1\"},"
                  "{\"key\": {\"d\": -1}, \"name\": \"d_-1\"},"
                  "{\"key\": {\"s\": 1}, \"name\": \"s_partial\", \"partialFilterExpression\": {\"a\": {\"$gt\": 5}}},"
                  "{\"key\": {\"sp\": 1}, \"name\": \"sp_sparse\", \"sparse\": true}]}", NULL);
  return 0;
}

static int teardown(void **state) {
  mongoc_collection_destroy(g_ix);
  mongoc_collection_destroy(g_plain);
  return obx_test_fixture_mongo_teardown(&g_m, g_client);
}

static int int_cmp(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return x < y ? -1 : x > y;
}

/* The _ids a find returns as "1,2,3": in their order when opts sorts, else ascending (without
 * a sort the order is the plan's, as in mongod). */
static void ids_of(mongoc_collection_t *c, const char *filter, const char *opts, char *out, size_t cap) {
  static int ids[NDOCS * 2];
  size_t nids = 0;
  bson_t *f = obx_test_bson(filter), *o = opts ? obx_test_bson(opts) : NULL;
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, f, o, NULL);
  const bson_t *doc;
  bson_error_t error;
  size_t len = 0;
  out[0] = 0;
  while (mongoc_cursor_next(cur, &doc)) {
    bson_iter_t it;
    bson_iter_init_find(&it, doc, "_id");
    if (nids < NDOCS * 2) ids[nids++] = bson_iter_int32(&it);
  }
  if (mongoc_cursor_error(cur, &error)) fail_msg("find %s: %s", filter, error.message);
  if (!opts || !strstr(opts, "sort")) qsort(ids, nids, sizeof *ids, int_cmp);
  for (size_t i = 0; i < nids; i++)
    len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%d", len ? "," : "", ids[i]);
  mongoc_cursor_destroy(cur);
  bson_destroy(f);
  bson_destroy(o);
}

typedef struct {
  const char *filter, *opts;  /* opts: find options (sort, limit, skip) */
  const char *plan;           /* the IXSCAN's index name, or COLLSCAN / IDHACK */
  bool sort_stage;
  int64_t max_keys, max_docs; /* upper bounds on what the plan examines (-1: any); a scan may
                                 also read the key just past an exclusive end */
} plan_case_t;

static const plan_case_t k_cases[] = {
  {"{\"a\": 3}", "{\"sort\": {\"b\": -1}}", "a_1_b_-1", false, 60, 60},
  {"{\"a\": 3}", "{\"sort\": {\"b\": 1}}", "a_1_b_-1", false, 60, 60},
  {"{\"a\": 3, \"b\": {\"$gte\": 100, \"$lt\": 300}}", NULL, "a_1_b_-1", false, 21, 20},
  {"{\"b\": {\"$gt\": 100, \"$lte\": 200}}", "{\"sort\": {\"b\": 1}}", "b_1", false, 101, 100},
  {"{\"b\": {\"$lt\": 50}}", "{\"sort\": {\"b\": -1}, \"limit\": 5}", "b_1", false, 6, 5},
  {"{}", "{\"sort\": {\"b\": -1}, \"limit\": 3}", "b_1", false, 3, 3},
  {"{}", "{\"sort\": {\"d\": 1}, \"skip\": 10, \"limit\": 3}", "d_-1", false, 13, 13},
  {"{\"a\": {\"$in\": [2, 7]}}", "{\"sort\": {\"b\": -1}}", "a_1_b_-1", false, 120, 120}, /* SORT_MERGE */
  {"{\"a\": {\"$in\": [7, 2, 2]}, \"b\": {\"$gt\": 500}}", NULL, "a_1_b_-1", false, 22, 20},
  {"{\"tags\": 2}", NULL, "tags_1", false, 200, 200},
  {"{\"tags\": {\"$gte\": 11, \"$lte\": 12}}", NULL, "tags_1", false, 480, 480},
  {"{\"tags\": {\"$all\": [1, 13]}, \"b\": {\"$lt\": 100}}", NULL, "b_1", false, 100, 100},
  {"{\"$and\": [{\"a\": 1}, {\"b\": {\"$lt\": 200}}]}", "{\"sort\": {\"b\": -1}}", "a_1_b_-1", false, 21, 20},
  {"{\"d\": {\"$gte\": {\"$date\": 1700000100000}, \"$lt\": {\"$date\": 1700000110000}}}", NULL, "d_-1", false, 11, 10},
  {"{\"s\": \"k007\", \"a\": {\"$gt\": 5}}", NULL, "s_partial", false, 12, 12},
  {"{\"s\": \"k007\"}", NULL, "COLLSCAN", false, -1, NDOCS},
  {"{\"sp\": 1}", NULL, "sp_sparse", false, 150, 150},
  {"{\"sp\": null}", NULL, "COLLSCAN", false, -1, NDOCS},
  {"{\"m\": {\"$gt\": 1}}", NULL, "COLLSCAN", false, -1, NDOCS},
  {"{\"m\": null}", "{\"sort\": {\"s\": 1, \"b\": 1}}", "COLLSCAN", true, -1, NDOCS},
  {"{\"_id\": 42}", NULL, "IDHACK", false, 1, 1},
  {"{\"_id\": {\"$gte\": 590}}", "{\"sort\": {\"_id\": -1}}", "_id_", false, 10, 10},
  {"{\"b\": {\"$gt\": 10, \"$lt\": 5}}", NULL, "b_1", false, 1, 0},
};

static void explain(const char *filter, const char *opts, bson_t *reply) {
  char json[2048];
  snprintf(json, sizeof json, "{\"explain\": {\"find\": \"ix\", \"filter\": %s%s%.*s}, \"verbosity\": \"executionStats\"}",
           filter, opts ? ", " : "", opts ? (int)strlen(opts) - 2 : 0, opts ? opts + 1 : "");
  command("plan", json, reply);
}

/* Walks winningPlan to its leaf: the stage names on the way as "SORT>FETCH>IXSCAN". */
static void stage_chain(const bson_t *reply, char *out, size_t cap, bson_t *leaf) {
  bson_iter_t it, child;
  bson_iter_init(&it, reply);
  assert_true(bson_iter_find_descendant(&it, "queryPlanner.winningPlan", &child));
  uint32_t len;
  const uint8_t *data;
  bson_iter_document(&child, &len, &data);
  bson_t stage;
  bson_init_static(&stage, data, len);
  out[0] = 0;
  for (;;) {
    bson_iter_t f;
    size_t o = strlen(out);
    if (bson_iter_init_find(&f, &stage, "stage")) snprintf(out + o, cap - o, "%s%s", o ? ">" : "", bson_iter_utf8(&f, NULL));
    if (!bson_iter_init_find(&f, &stage, "inputStage")) break;
    bson_iter_document(&f, &len, &data);
    bson_init_static(&stage, data, len);
  }
  bson_copy_to(&stage, leaf);
}

static int64_t stat_of(const bson_t *reply, const char *path) {
  bson_iter_t it, f;
  bson_iter_init(&it, reply);
  return bson_iter_find_descendant(&it, path, &f) ? bson_iter_as_int64(&f) : -1;
}

static void test_same_results_and_plans(void **state) {
  static char got[NDOCS * 8], want[NDOCS * 8];
  for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
    const plan_case_t *pc = &k_cases[i];
    ids_of(g_ix, pc->filter, pc->opts, got, sizeof got);
    ids_of(g_plain, pc->filter, pc->opts, want, sizeof want);
    if (strcmp(got, want)) fail_msg("%s %s: indexed collection returned [%s], unindexed [%s]", pc->filter,
                                    pc->opts ? pc->opts : "", got, want);
    bson_t reply, leaf;
    explain(pc->filter, pc->opts, &reply);
    char chain[256];
    stage_chain(&reply, chain, sizeof chain, &leaf);
    bson_iter_t f;
    const char *leaf_stage = bson_iter_init_find(&f, &leaf, "stage") ? bson_iter_utf8(&f, NULL) : "";
    bool sort_stage = !strncmp(chain, "SORT>", 5) || strstr(chain, ">SORT>");
    if (strstr(pc->filter, "$in\": [2, 7]") && strncmp(chain, "SORT_MERGE>", 11))
      fail_msg("%s: winning plan %s, want SORT_MERGE over the $in runs", pc->filter, chain);
    const char *got_plan = leaf_stage;
    if (!strcmp(leaf_stage, "IXSCAN") && bson_iter_init_find(&f, &leaf, "indexName")) got_plan = bson_iter_utf8(&f, NULL);
    if (strcmp(pc->plan, got_plan) || sort_stage != pc->sort_stage)
      fail_msg("%s %s: winning plan %s (%s), want %s%s", pc->filter, pc->opts ? pc->opts : "", chain, got_plan,
               pc->plan, pc->sort_stage ? " under SORT" : "");
    int64_t keys = stat_of(&reply, "executionStats.totalKeysExamined");
    int64_t docs = stat_of(&reply, "executionStats.totalDocsExamined");
    int64_t n = stat_of(&reply, "executionStats.nReturned");
    size_t want_n = want[0] ? 1 : 0;
    for (const char *p = want; *p; p++) want_n += *p == ',';
    if ((pc->max_keys >= 0 && keys > pc->max_keys + 1) || docs > pc->max_docs || n != (int64_t)want_n)
      fail_msg("%s %s: totalKeysExamined %lld, totalDocsExamined %lld, nReturned %lld; want keys <= %lld, "
               "docs <= %lld, n = %zu", pc->filter, pc->opts ? pc->opts : "", (long long)keys, (long long)docs,
               (long long)n, (long long)pc->max_keys, (long long)pc->max_docs, want_n);
    if (!strcmp(leaf_stage, "IXSCAN")) {
      assert_true(bson_iter_init_find(&f, &leaf, "indexBounds") && BSON_ITER_HOLDS_DOCUMENT(&f));
      assert_true(bson_iter_init_find(&f, &leaf, "isMultiKey"));
      assert_int_equal(bson_iter_as_bool(&f), strcmp(pc->plan, "tags_1") == 0);
    }
    bson_destroy(&leaf);
    bson_destroy(&reply);
  }
}

/* Each query (filter, find options) returns the same _ids from the indexed collection as from the
 * one without indexes; with need_docs, at least one. */
static void same_as_scan(const char *queries[][2], size_t n, bool need_docs) {
  static char got[NDOCS * 8], want[NDOCS * 8];
  for (size_t i = 0; i < n; i++) {
    ids_of(g_ix, queries[i][0], queries[i][1], got, sizeof got);
    ids_of(g_plain, queries[i][0], queries[i][1], want, sizeof want);
    if (strcmp(got, want)) fail_msg("%s: indexed [%s], unindexed [%s]", queries[i][0], got, want);
    if (need_docs && !want[0]) fail_msg("%s: no document (the case tests nothing)", queries[i][0]);
  }
}

/* Writes keep the ordered indexes in step: updated, deleted and re-inserted documents. */
static void test_indexes_follow_writes(void **state) {
  mongoc_collection_t *cs[2] = {g_ix, g_plain};
  for (int k = 0; k < 2; k++) {
    bson_error_t error;
    bson_t *q = obx_test_bson("{\"a\": 4}"), *u = obx_test_bson("{\"$inc\": {\"b\": 10000}, \"$set\": {\"tags\": [99]}}");
    if (!mongoc_collection_update_many(cs[k], q, u, NULL, NULL, &error)) fail_msg("update: %s", error.message);
    bson_t *dq = obx_test_bson("{\"a\": 5}");
    if (!mongoc_collection_delete_many(cs[k], dq, NULL, NULL, &error)) fail_msg("delete: %s", error.message);
    bson_t *doc = obx_test_bson("{\"_id\": 100000, \"a\": 5, \"b\": -1, \"tags\": [99, 99]}");
    if (!mongoc_collection_insert_one(cs[k], doc, NULL, NULL, &error)) fail_msg("insert: %s", error.message);
    bson_destroy(q);
    bson_destroy(u);
    bson_destroy(dq);
    bson_destroy(doc);
  }
  const char *queries[][2] = {{"{\"b\": {\"$gte\": 10000}}", "{\"sort\": {\"b\": 1}}"},
                              {"{\"a\": 5}", "{\"sort\": {\"b\": -1}}"},
                              {"{\"tags\": 99}", "{\"sort\": {\"_id\": 1}}"},
                              {"{\"b\": {\"$lt\": 20}}", "{\"sort\": {\"b\": -1}}"}};
  same_as_scan(queries, sizeof queries / sizeof *queries, false);
}

/* Updates that change some indexes' keys and not others' (an unindexed field only; a key of one
 * index; a document moved out of and into the partial index's filter; the sparse field added and
 * removed): devmongod rewrites only the entries whose keys changed, as mongod does, and every
 * index still answers as a collection scan would. */
static void test_updates_touch_only_changed_indexes(void **state) {
  mongoc_collection_t *cs[2] = {g_ix, g_plain};
  const char *updates[][2] = {
    {"{\"a\": 1}", "{\"$set\": {\"x\": \"only an unindexed field\"}}"},
    {"{\"a\": 2}", "{\"$set\": {\"d\": {\"$date\": 1600000000000}}}"},
    {"{\"a\": 6}", "{\"$set\": {\"a\": 3}}"},      /* out of s_partial (a > 5), a_1_b_-1 moved */
    {"{\"a\": 7}", "{\"$set\": {\"sp\": 2}}"},     /* into sp_sparse for those without sp */
    {"{\"a\": 8}", "{\"$unset\": {\"sp\": \"\"}}"}, /* out of it */
    {"{\"a\": 9}", "{\"$set\": {\"s\": \"k999\"}}"}, /* s_partial's key, a unchanged */
    {"{\"a\": 0}", "{\"$set\": {\"a\": 9}}"},      /* into s_partial, s unchanged */
  };
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < sizeof updates / sizeof *updates; i++) {
      bson_error_t error;
      bson_t *q = obx_test_bson(updates[i][0]), *u = obx_test_bson(updates[i][1]);
      if (!mongoc_collection_update_many(cs[k], q, u, NULL, NULL, &error)) fail_msg("update: %s", error.message);
      bson_destroy(q);
      bson_destroy(u);
    }
  const char *queries[][2] = {{"{\"a\": {\"$gt\": 5}, \"s\": {\"$gte\": \"k000\"}}", "{\"sort\": {\"s\": 1, \"_id\": 1}}"},
                              {"{\"a\": 3}", "{\"sort\": {\"b\": -1}}"},
                              {"{\"a\": {\"$in\": [0, 6, 9]}}", "{\"sort\": {\"a\": 1, \"b\": -1}}"},
                              {"{\"sp\": {\"$exists\": true}}", "{\"sort\": {\"sp\": 1, \"_id\": 1}}"},
                              {"{\"d\": {\"$lt\": {\"$date\": 1700000000000}}}", "{\"sort\": {\"d\": -1, \"_id\": 1}}"},
                              {"{\"x\": {\"$exists\": true}}", "{\"sort\": {\"b\": 1}}"}};
  same_as_scan(queries, sizeof queries / sizeof *queries, true);
}

/* Inside a transaction an index scan sees the transaction's own writes and its snapshot. */
static void test_transaction_reads_through_index(void **state) {
  bson_error_t error;
  mongoc_client_session_t *cs = mongoc_client_start_session(g_client, NULL, &error);
  bson_t opts = BSON_INITIALIZER;
  assert_true(mongoc_client_session_append(cs, &opts, &error));
  assert_true(mongoc_client_session_start_transaction(cs, NULL, &error));
  bson_t *doc = obx_test_bson("{\"_id\": 200000, \"a\": 3, \"b\": 900000}");
  assert_true(mongoc_collection_insert_one(g_ix, doc, &opts, NULL, &error));
  bson_t *outside = obx_test_bson("{\"_id\": 200001, \"a\": 3, \"b\": 900001}");
  assert_true(mongoc_collection_insert_one(g_ix, outside, NULL, NULL, &error)); /* after the snapshot */
  bson_t *f = obx_test_bson("{\"a\": 3}");
  bson_t *o = obx_test_bson("{\"sort\": {\"b\": -1}, \"limit\": 1}");
  bson_concat(o, &opts);
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(g_ix, f, o, NULL);
  const bson_t *got;
  assert_true(mongoc_cursor_next(cur, &got));
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, got, "_id"));
  assert_int_equal(bson_iter_int32(&it), 200000);
  mongoc_cursor_destroy(cur);
  assert_true(mongoc_client_session_abort_transaction(cs, &error));
  bson_destroy(doc);
  bson_destroy(outside);
  bson_destroy(f);
  bson_destroy(o);
  bson_destroy(&opts);
  mongoc_client_session_destroy(cs);
}

/* update, delete, findAndModify, count and aggregate are planned the same way; the profiler
 * records each selection with mongod's fields. */
static void test_profiler_and_other_commands(void **state) {
  bson_t reply;
  command("plan", "{\"profile\": 2}", &reply);
  assert_int_equal(stat_of(&reply, "was"), 0);
  bson_destroy(&reply);
  bson_error_t error;
  bson_t *q = obx_test_bson("{\"a\": 2, \"b\": {\"$gte\": 100}}"), *u = obx_test_bson("{\"$set\": {\"seen\": true}}");
  if (!mongoc_collection_update_many(g_ix, q, u, NULL, NULL, &error)) fail_msg("update: %s", error.message);
  int64_t n = mongoc_collection_count_documents(g_ix, q, NULL, NULL, NULL, &error);
  assert_true(n > 0);
  bson_t *m = obx_test_bson("{\"c\": 1}");
  mongoc_collection_count_documents(g_ix, m, NULL, NULL, NULL, &error);
  command("plan", "{\"profile\": 0}", NULL);
  const char *want[][2] = {{"update", "IXSCAN { a: 1, b: -1 }"}, {"command", "IXSCAN { a: 1, b: -1 }"}, {"command", "COLLSCAN"}};
  mongoc_collection_t *prof = mongoc_client_get_collection(g_client, "plan", "system.profile");
  bson_t empty = BSON_INITIALIZER;
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(prof, &empty, NULL, NULL);
  const bson_t *doc;
  size_t i = 0;
  while (mongoc_cursor_next(cur, &doc)) {
    bson_iter_t it;
    assert_true(i < 3);
    assert_true(bson_iter_init_find(&it, doc, "op"));
    assert_string_equal(bson_iter_utf8(&it, NULL), want[i][0]);
    assert_true(bson_iter_init_find(&it, doc, "planSummary"));
    assert_string_equal(bson_iter_utf8(&it, NULL), want[i][1]);
    assert_true(bson_iter_init_find(&it, doc, "ns"));
    assert_string_equal(bson_iter_utf8(&it, NULL), "plan.ix");
    assert_true(bson_iter_init_find(&it, doc, "hasSortStage"));
    assert_true(bson_iter_init_find(&it, doc, "keysExamined"));
    assert_true(bson_iter_init_find(&it, doc, "docsExamined"));
    i++;
  }
  assert_int_equal(i, 3);
  mongoc_cursor_destroy(cur);
  mongoc_collection_destroy(prof);
  /* explain of the other commands: the top stage over the same access plan */
  const char *cmds[][2] = {
    {"{\"explain\": {\"update\": \"ix\", \"updates\": [{\"q\": {\"b\": 7}, \"u\": {\"$set\": {\"x\": 1}}}]}}", "UPDATE>FETCH>IXSCAN"},
    {"{\"explain\": {\"delete\": \"ix\", \"deletes\": [{\"q\": {\"a\": 1}, \"limit\": 1}]}}", "DELETE>FETCH>IXSCAN"},
    {"{\"explain\": {\"findAndModify\": \"ix\", \"query\": {\"a\": 1}, \"sort\": {\"b\": 1}, \"update\": {\"$set\": {\"x\": 1}}}}", "UPDATE>FETCH>IXSCAN"},
    {"{\"explain\": {\"count\": \"ix\", \"query\": {\"zz\": 1}}}", "COUNT>COLLSCAN"},
    {"{\"explain\": {\"aggregate\": \"ix\", \"pipeline\": [{\"$match\": {\"a\": 6}}, {\"$sort\": {\"b\": -1}}, {\"$limit\": 2}], \"cursor\": {}}}", "FETCH>IXSCAN"},
    {"{\"explain\": {\"aggregate\": \"ix\", \"pipeline\": [{\"$sort\": {\"zz\": 1}}], \"cursor\": {}}}", "SORT>COLLSCAN"},
  };
  for (size_t k = 0; k < sizeof cmds / sizeof *cmds; k++) {
    bson_t leaf;
    char chain[256];
    command("plan", cmds[k][0], &reply);
    stage_chain(&reply, chain, sizeof chain, &leaf);
    if (strcmp(chain, cmds[k][1])) fail_msg("%s: winning plan %s, want %s", cmds[k][0], chain, cmds[k][1]);
    bson_destroy(&leaf);
    bson_destroy(&reply);
  }
  /* explain never writes */
  bson_t *x = obx_test_bson("{\"x\": 1}");
  assert_int_equal(mongoc_collection_count_documents(g_ix, x, NULL, NULL, NULL, &error), 0);
  bson_destroy(x);
  bson_destroy(&empty);
  bson_destroy(q);
  bson_destroy(u);
  bson_destroy(m);
}


/* --plan-log with a filter holding a string that is not UTF-8 (the product may store such ids):
 * the line is written with a placeholder and the server keeps serving (it crashed on it). */
static void test_plan_log_non_utf8(void **state) {
  char dir[512], args[600];
  snprintf(dir, sizeof dir, "%s/planlog-%d", obx_test_tmpdir(), (int)getpid());
  snprintf(args, sizeof args, "--plan-log %s", dir);
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, args));
  mongoc_client_t *client = obx_test_mongo_client(&m, NULL, "plan-log-test");
  mongoc_collection_t *c = mongoc_client_get_collection(client, "plan", "utf8");
  bson_t doc = BSON_INITIALIZER, filter = BSON_INITIALIZER;
  bson_append_utf8(&doc, "_id", 3, "\xff\xfe-id", 5);
  bson_append_utf8(&filter, "_id", 3, "\xff\xfe-id", 5);
  bson_error_t error;
  assert_true(mongoc_collection_insert_one(c, &doc, NULL, NULL, &error));
  for (int i = 0; i < 2; i++) { /* the second find needs the server alive after the first */
    int64_t n = mongoc_collection_count_documents(c, &filter, NULL, NULL, NULL, &error);
    if (n != 1) fail_msg("find by a non-UTF-8 _id with --plan-log: %s", error.message);
  }
  char path[700];
  snprintf(path, sizeof path, "%s/devmongod-%d.jsonl", dir, (int)m.proc.pid);
  assert_true(obx_test_file_contains(path, "not UTF-8", 5000));
  bson_destroy(&doc);
  bson_destroy(&filter);
  mongoc_collection_destroy(c);
  mongoc_client_destroy(client);
  obx_test_mongo_stop(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_same_results_and_plans),
    cmocka_unit_test(test_indexes_follow_writes),
    cmocka_unit_test(test_updates_touch_only_changed_indexes),
    cmocka_unit_test(test_transaction_reads_through_index),
    cmocka_unit_test(test_profiler_and_other_commands),
    cmocka_unit_test(test_plan_log_non_utf8),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
