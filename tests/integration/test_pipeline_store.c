/* test_pipeline_store.c - pipelines and their runs in MongoDB (devmongod)
 *
 * DESIGN: one devmongod for the group, one database per test. Proves: validation on save,
 * versioning, org scoping, one enabled pipeline per trigger, apply of config files, and the
 * commit of a run: order status, outbox event and execution document together, atomically
 * with the caller's transaction. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_fixture.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;

static int setup(void **state) { return obx_test_fixture_mongo_setup(&g_m, NULL, &g_client); }

static int teardown(void **state) { return obx_test_fixture_mongo_teardown(&g_m, g_client); }

#define DEF_TAG                                                                                                     \
  "{'name':'tagger','trigger':'event.OrderShipped','nodes':[{'id':'start','type':'start'},"                         \
  "{'id':'tag','type':'set-status','config':{'statusTag':'shipped','name':'Shipped {{orderNumber}}'}},"             \
  "{'id':'emit','type':'emit-event','config':{'eventType':'CustomerNotified','payload':{'n':'{{orderNumber}}',"     \
  "'total':'{{order.totalAmount}}'}}}],"                                                                            \
  "'edges':[{'from':'start','to':'tag'},{'from':'tag','to':'emit','branch':'success'}]}"

static void test_create_update_scope(void **state) {
  const char *db = "pl_crud";
  obx_err_t err = OBX_ERR_INIT;
  bson_t saved = BSON_INITIALIZER, again = BSON_INITIALIZER, got = BSON_INITIALIZER;
  bson_t *def = obx_test_json(DEF_TAG);

  /* orgId/version/_id in the body are ignored: the store owns them */
  BSON_APPEND_UTF8(def, "orgId", "someone-else");
  BSON_APPEND_INT32(def, "version", 41);
  if (!obx_pipeline_store_create(g_client, db, "org-a", def, &saved, &err)) fail_msg("create: %s", err.msg);
  const char *id = obx_test_doc_str(&saved, "_id");
  assert_non_null(id);
  assert_string_equal(obx_test_doc_str(&saved, "orgId"), "org-a");
  assert_int_equal(obx_test_doc_int(&saved, "version"), 1);

  /* a second enabled pipeline of the same trigger is a conflict; a disabled one is fine */
  bson_t *twin = obx_test_json(DEF_TAG);
  assert_false(obx_pipeline_store_create(g_client, db, "org-a", twin, NULL, &err));
  assert_int_equal(err.domain, OBX_ERR_CONFLICT);
  assert_non_null(strstr(err.msg, "already enabled for trigger event.OrderShipped"));
  BSON_APPEND_BOOL(twin, "enabled", false);
  if (!obx_pipeline_store_create(g_client, db, "org-a", twin, NULL, &err)) fail_msg("disabled twin: %s", err.msg);
  /* another org has its own namespace */
  bson_t *twin_b = obx_test_json(DEF_TAG);
  if (!obx_pipeline_store_create(g_client, db, "org-b", twin_b, NULL, &err)) fail_msg("org-b: %s", err.msg);

  /* update: version + 1, validated, org-scoped */
  bson_t *changed = obx_test_json("{'name':'tagger','trigger':'event.OrderShipped','enabled':true,"
                             "'nodes':[{'id':'start','type':'start'}]}");
  if (!obx_pipeline_store_update(g_client, db, "org-a", id, changed, &again, &err)) fail_msg("update: %s", err.msg);
  assert_int_equal(obx_test_doc_int(&again, "version"), 2);
  assert_false(obx_pipeline_store_update(g_client, db, "org-b", id, changed, NULL, &err));
  assert_int_equal(err.domain, OBX_ERR_NOT_FOUND);
  bson_t *bad = obx_test_json("{'trigger':'event.OrderShipped','nodes':[{'id':'start','type':'start'},"
                         "{'id':'x','type':'teleport'}]}");
  assert_false(obx_pipeline_store_update(g_client, db, "org-a", id, bad, NULL, &err));
  assert_int_equal(err.domain, OBX_ERR_PIPELINE);
  assert_string_equal(err.msg, "node \"x\": unknown type \"teleport\"");
  bson_t *no_trigger = obx_test_json("{'nodes':[{'id':'start','type':'start'}]}");
  assert_false(obx_pipeline_store_create(g_client, db, "org-a", no_trigger, NULL, &err));
  assert_non_null(strstr(err.msg, "\"trigger\" is required"));

  assert_true(obx_pipeline_store_get(g_client, db, "org-a", id, &got, &err));
  assert_int_equal(obx_test_doc_int(&got, "version"), 2);
  assert_false(obx_pipeline_store_get(g_client, db, "org-b", id, &got, &err));
  assert_int_equal(err.domain, OBX_ERR_NOT_FOUND);

  obx_pipeline_t *enabled = NULL;
  assert_true(obx_pipeline_store_find_enabled(g_client, db, NULL, "org-a", "event.OrderShipped", &enabled, &err));
  assert_non_null(enabled);
  assert_string_equal(obx_pipeline_id(enabled), id);
  assert_int_equal(obx_pipeline_version(enabled), 2);
  obx_pipeline_destroy(enabled);
  assert_true(obx_pipeline_store_find_enabled(g_client, db, NULL, "org-a", "order.post", &enabled, &err));
  assert_null(enabled);

  bson_t list = BSON_INITIALIZER;
  assert_true(obx_pipeline_store_list(g_client, db, "org-a", &list, &err));
  assert_non_null(obx_test_doc_str(&list, "pipelines.1._id"));
  assert_null(obx_test_doc_str(&list, "pipelines.2._id"));
  bson_destroy(&list);

  bson_destroy(no_trigger);
  bson_destroy(bad);
  bson_destroy(changed);
  bson_destroy(twin_b);
  bson_destroy(twin);
  bson_destroy(def);
  bson_destroy(&got);
  bson_destroy(&again);
  bson_destroy(&saved);
}

/* Runs DEF_TAG on order o-1 of org-a; returns the run (owned). */
static obx_pipeline_run_t *run_tagger(const bson_t *ctx, const char *order_id) {
  obx_pipeline_t *pipeline = NULL;
  obx_err_t err = OBX_ERR_INIT;
  bson_t *def = obx_test_json(DEF_TAG);
  BSON_APPEND_UTF8(def, "_id", "pl-1");
  if (!obx_pipeline_parse(def, &pipeline, &err)) fail_msg("%s", err.msg);
  obx_pipeline_input_t in = {.context = ctx, .org_id = "org-a", .event_id = "ev-shipped", .correlation_id = "corr-1",
                             .aggregate_type = "Order", .aggregate_id = order_id, .attempt = 3};
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, NULL);
  assert_int_equal(obx_pipeline_run_status(run), OBX_PIPELINE_SUCCEEDED);
  obx_pipeline_destroy(pipeline);
  bson_destroy(def);
  return run;
}

static void insert_order(const char *db, const char *id) {
  mongoc_collection_t *orders = mongoc_client_get_collection(g_client, db, "orders");
  bson_t *order = BCON_NEW("_id", BCON_UTF8(id), "orgId", BCON_UTF8("org-a"), "orderNumber", BCON_UTF8("N-1"),
                           "status", BCON_UTF8("CONFIRMED"));
  bson_error_t berr;
  if (!mongoc_collection_insert_one(orders, order, NULL, NULL, &berr)) fail_msg("insert order: %s", berr.message);
  bson_destroy(order);
  mongoc_collection_destroy(orders);
}

static void test_commit_writes_effects_and_execution(void **state) {
  const char *db = "pl_commit";
  obx_err_t err = OBX_ERR_INIT;
  insert_order(db, "o-1");
  bson_t *ctx = obx_test_json("{'orderNumber':'N-1','order':{'totalAmount':{'$numberDecimal':'99.90'}}}");
  obx_pipeline_run_t *run = run_tagger(ctx, "o-1");
  if (!obx_pipeline_run_commit(run, g_client, db, NULL, &err)) fail_msg("commit: %s", err.msg);

  bson_t order = BSON_INITIALIZER, ev = BSON_INITIALIZER, exec = BSON_INITIALIZER;
  bson_t *by_id = BCON_NEW("_id", BCON_UTF8("o-1"));
  assert_true(obx_test_find_one(g_client, db, "orders", by_id, &order));
  assert_string_equal(obx_test_doc_str(&order, "status"), "CONFIRMED"); /* the business status is untouched */
  assert_string_equal(obx_test_doc_str(&order, "statusHistory.0.statusTag"), "shipped");
  assert_string_equal(obx_test_doc_str(&order, "statusHistory.0.name"), "Shipped N-1");
  assert_string_equal(obx_test_doc_str(&order, "statusHistory.0.phase"), "event.OrderShipped");
  assert_string_equal(obx_test_doc_str(&order, "statusHistory.0.executionId"), obx_pipeline_run_execution_id(run));
  assert_string_equal(obx_test_doc_str(&order, "pipelineStatus.statusTag"), "shipped");

  const obx_event_t *emitted = obx_pipeline_run_event(run, 0);
  bson_t *ev_filter = BCON_NEW("_id", BCON_UTF8(emitted->id));
  assert_true(obx_test_find_one(g_client, db, "outbox", ev_filter, &ev));
  assert_string_equal(obx_test_doc_str(&ev, "eventType"), "CustomerNotified");
  assert_string_equal(obx_test_doc_str(&ev, "status"), "PENDING");
  assert_string_equal(obx_test_doc_str(&ev, "causationId"), "ev-shipped");
  assert_string_equal(obx_test_doc_str(&ev, "correlationId"), "corr-1");
  assert_string_equal(obx_test_doc_str(&ev, "partitionKey"), "o-1");
  assert_string_equal(obx_test_doc_str(&ev, "payload.n"), "N-1");

  bson_t *exec_filter = BCON_NEW("_id", BCON_UTF8(obx_pipeline_run_execution_id(run)));
  assert_true(obx_test_find_one(g_client, db, "pipeline_executions", exec_filter, &exec));
  assert_string_equal(obx_test_doc_str(&exec, "status"), "SUCCEEDED");
  assert_string_equal(obx_test_doc_str(&exec, "pipelineId"), "pl-1");
  assert_string_equal(obx_test_doc_str(&exec, "eventId"), "ev-shipped");
  assert_int_equal(obx_test_doc_int(&exec, "attempt"), 3);
  assert_string_equal(obx_test_doc_str(&exec, "steps.1.nodeId"), "tag");
  assert_string_equal(obx_test_doc_str(&exec, "steps.2.output.eventId"), emitted->id);
  assert_true(obx_test_doc_int(&exec, "durationMs") >= 0);

  bson_destroy(exec_filter);
  bson_destroy(ev_filter);
  bson_destroy(by_id);
  bson_destroy(&exec);
  bson_destroy(&ev);
  bson_destroy(&order);
  obx_pipeline_run_destroy(run);
  bson_destroy(ctx);
}

typedef struct {
  obx_pipeline_run_t *run;
  const char *db;
  obx_err_t err;
  bool fail_after;
} caller_txn_t;

/* The caller's transaction: its own write, then the run's commit, then maybe a failure. */
static bool caller_cb(mongoc_client_session_t *session, void *ctx, bson_t **reply, bson_error_t *error) {
  caller_txn_t *t = ctx;
  mongoc_collection_t *inbox = mongoc_client_get_collection(g_client, t->db, "inbox");
  bson_t opts = BSON_INITIALIZER;
  bson_t *doc = BCON_NEW("_id", BCON_UTF8("inbox-1"));
  bool ok = mongoc_client_session_append(session, &opts, error) &&
            mongoc_collection_insert_one(inbox, doc, &opts, NULL, error) &&
            obx_pipeline_run_commit(t->run, g_client, t->db, session, &t->err);
  if (!ok && t->err.domain != OBX_ERR_NONE) bson_set_error(error, MONGOC_ERROR_COMMAND, 2, "%s", t->err.msg);
  if (ok && t->fail_after) {
    bson_set_error(error, MONGOC_ERROR_COMMAND, 1, "caller gives up");
    ok = false;
  }
  bson_destroy(doc);
  bson_destroy(&opts);
  mongoc_collection_destroy(inbox);
  return ok;
}

static void test_commit_joins_caller_transaction(void **state) {
  static const struct {
    bool fail_after;
    const char *order_id; /* "o-missing": set-status finds no order -> commit fails */
    int64_t want_docs;    /* outbox, executions and inbox documents after the transaction */
  } cases[] = {
    {true, "o-2", 0},
    {false, "o-missing", 0},
    {false, "o-2", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char db[32];
    snprintf(db, sizeof db, "pl_txn_%zu", i);
    insert_order(db, "o-2");
    bson_t *ctx = obx_test_json("{'orderNumber':'N-2','order':{'totalAmount':5}}");
    caller_txn_t t = {.run = run_tagger(ctx, cases[i].order_id), .db = db, .fail_after = cases[i].fail_after};
    bson_error_t berr;
    mongoc_client_session_t *session = mongoc_client_start_session(g_client, NULL, &berr);
    assert_non_null(session);
    bool ok = mongoc_client_session_with_transaction(session, caller_cb, NULL, &t, NULL, &berr);
    mongoc_client_session_destroy(session);
    assert_int_equal(ok, cases[i].want_docs == 1);
    if (strcmp(cases[i].order_id, "o-missing") == 0) {
      assert_int_equal(t.err.domain, OBX_ERR_NOT_FOUND);
      assert_non_null(strstr(t.err.msg, "order o-missing of org org-a not found"));
    }
    int64_t outbox = obx_test_count(g_client, db, "outbox", NULL), execs = obx_test_count(g_client, db, "pipeline_executions", NULL),
            inbox = obx_test_count(g_client, db, "inbox", NULL);
    if (outbox != cases[i].want_docs || execs != cases[i].want_docs || inbox != cases[i].want_docs)
      fail_msg("case %zu: got outbox=%lld executions=%lld inbox=%lld, want %lld each", i, (long long)outbox,
               (long long)execs, (long long)inbox, (long long)cases[i].want_docs);
    bson_t *tagged = BCON_NEW("_id", BCON_UTF8("o-2"), "statusHistory.0.statusTag", BCON_UTF8("shipped"));
    assert_int_equal(obx_test_count(g_client, db, "orders", tagged), cases[i].want_docs);
    bson_destroy(tagged);
    obx_pipeline_run_destroy(t.run);
    bson_destroy(ctx);
  }
}

static void test_executions_paging(void **state) {
  const char *db = "pl_paging";
  obx_err_t err = OBX_ERR_INIT;
  char ids[5][OBX_UUID_LEN + 1];
  insert_order(db, "o-3");
  bson_t *ctx = obx_test_json("{'orderNumber':'N-3','order':{'totalAmount':1}}");
  for (int i = 0; i < 5; i++) {
    obx_pipeline_run_t *run = run_tagger(ctx, "o-3");
    if (!obx_pipeline_run_commit(run, g_client, db, NULL, &err)) fail_msg("commit %d: %s", i, err.msg);
    memcpy(ids[i], obx_pipeline_run_execution_id(run), sizeof ids[i]);
    obx_pipeline_run_destroy(run);
  }
  static const struct {
    int limit;
    int before, after; /* index into ids, -1 none */
    const char *want;  /* indexes shown, newest first */
    int want_next;     /* index or -1 (null) */
  } cases[] = {
    {2, -1, -1, "43", 3}, {2, 3, -1, "21", 1}, {2, 1, -1, "0", -1},
    {10, -1, -1, "43210", -1}, {2, -1, 1, "32", 2}, {2, -1, 4, "", -1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bson_t page = BSON_INITIALIZER;
    const char *before = cases[c].before >= 0 ? ids[cases[c].before] : NULL;
    const char *after = cases[c].after >= 0 ? ids[cases[c].after] : NULL;
    if (!obx_pipeline_store_executions(g_client, db, "org-a", "pl-1", cases[c].limit, before, after, &page, &err))
      fail_msg("case %zu: %s", c, err.msg);
    char got[16] = "";
    for (int k = 0; k < 10; k++) {
      char path[32];
      snprintf(path, sizeof path, "executions.%d._id", k);
      const char *id = obx_test_doc_str(&page, path);
      if (!id) break;
      for (int j = 0; j < 5; j++)
        if (strcmp(id, ids[j]) == 0) got[strlen(got)] = (char)('0' + j);
    }
    if (strcmp(got, cases[c].want) != 0) fail_msg("case %zu: got %s, want %s", c, got, cases[c].want);
    const char *next = obx_test_doc_str(&page, "next");
    if (cases[c].want_next < 0 ? next != NULL : !next || strcmp(next, ids[cases[c].want_next]) != 0)
      fail_msg("case %zu: got next %s", c, next ? next : "null");
    bson_destroy(&page);
  }
  bson_t page = BSON_INITIALIZER;
  assert_true(obx_pipeline_store_executions(g_client, db, "org-b", "pl-1", 10, NULL, NULL, &page, &err));
  assert_null(obx_test_doc_str(&page, "executions.0._id")); /* another org sees nothing */
  bson_destroy(&page);
  assert_false(obx_pipeline_store_executions(g_client, db, "org-a", "pl-1", 0, NULL, NULL, &page, &err));
  assert_int_equal(err.domain, OBX_ERR_INPUT);
  bson_destroy(ctx);
}

static void test_apply_config_dir(void **state) {
  const char *db = "pl_apply";
  char dir[512];
  snprintf(dir, sizeof dir, "%s/config/pipelines", OBX_SOURCE_DIR);
  static const struct {
    bool dry_run;
    const char *want;    /* in the report */
    int64_t want_stored; /* pipelines stored afterwards */
  } cases[] = {
    {true, "create    ", 0},
    {false, "create    ", 2},
    {false, "unchanged ", 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *report = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&report, &len);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_pipeline_store_apply_path(g_client, db, dir, cases[i].dry_run, out, &err)) fail_msg("apply: %s", err.msg);
    fclose(out);
    if (!strstr(report, cases[i].want) || !strstr(report, "order-post-erp.json") || !strstr(report, "order-shipped-notify.json"))
      fail_msg("case %zu: report\n%s\nwant lines with \"%s\"", i, report, cases[i].want);
    assert_int_equal(obx_test_count(g_client, db, "pipelines", NULL), cases[i].want_stored);
    free(report);
  }
  /* a changed file is an update (version 2); an invalid one is reported by name */
  char path[600];
  snprintf(path, sizeof path, "%s/changed.json", obx_test_tmpdir());
  obx_test_write_file(path, "{\"name\": \"order-post-erp\", \"orgId\": \"demo\", \"trigger\": \"order.post\","
                            " \"enabled\": false, \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}]}");
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_pipeline_store_apply_path(g_client, db, path, false, NULL, &err));
  bson_t *filter = BCON_NEW("name", BCON_UTF8("order-post-erp"), "version", BCON_INT32(2), "enabled", BCON_BOOL(false));
  assert_int_equal(obx_test_count(g_client, db, "pipelines", filter), 1);
  bson_destroy(filter);
  obx_test_write_file(path, "{\"name\": \"broken\", \"orgId\": \"demo\", \"trigger\": \"order.post\","
                            " \"nodes\": [{\"id\": \"a\", \"type\": \"log\"}]}");
  assert_false(obx_pipeline_store_apply_path(g_client, db, path, true, NULL, &err));
  assert_non_null(strstr(err.msg, "changed.json: node \"a\" (log): config.message: required"));
  remove(path);
}

/* The partial unique index backs the one-enabled-per-trigger rule against racing saves. */
static void test_unique_enabled_index(void **state) {
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  obx_conf_init(&conf);
  assert_true(obx_conf_set(&conf, "mongo.uri", g_m.uri, &err));
  assert_true(obx_conf_set(&conf, "mongo.db", "pl_index", &err));
  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  assert_non_null(mongo);
  if (!obx_schema_ensure(mongo, &conf, OBX_SCHEMA_API, &err)) fail_msg("schema: %s", err.msg);
  assert_true(obx_schema_ensure(mongo, &conf, OBX_SCHEMA_API, &err)); /* idempotent */
  static const struct {
    const char *doc;
    bool want_ok;
  } cases[] = {
    {"{'_id':'p1','orgId':'o','trigger':'order.post','enabled':true}", true},
    {"{'_id':'p2','orgId':'o','trigger':'order.post','enabled':false}", true},
    {"{'_id':'p3','orgId':'o','trigger':'order.post','enabled':true}", false},
    {"{'_id':'p4','orgId':'other','trigger':'order.post','enabled':true}", true},
  };
  mongoc_collection_t *coll = mongoc_client_get_collection(g_client, "pl_index", "pipelines");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *doc = obx_test_json(cases[i].doc);
    bson_error_t berr;
    bool ok = mongoc_collection_insert_one(coll, doc, NULL, NULL, &berr);
    if (ok != cases[i].want_ok) fail_msg("case %zu %s: got ok=%d (%s)", i, cases[i].doc, ok, ok ? "" : berr.message);
    bson_destroy(doc);
  }
  mongoc_collection_destroy(coll);
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
}

#define DEF_PRE(name, enabled)                                                                                      \
  "{'name':'" name "','trigger':'order.pre','enabled':" enabled ",'nodes':[{'id':'start','type':'start'}]}"

/* The enabled order.pre pipeline of org through cache: its name, or "none". */
static const char *cached_name(obx_pipeline_cache_t *cache, const char *db, const char *org, char *out, size_t outlen) {
  obx_err_t err = OBX_ERR_INIT;
  obx_pipeline_t *p = NULL;
  if (!obx_pipeline_cache_find_enabled(cache, g_client, db, org, "order.pre", &p, &err)) fail_msg("lookup: %s", err.msg);
  snprintf(out, outlen, "%s", p ? obx_pipeline_name(p) : "none");
  obx_pipeline_destroy(p);
  return out;
}

/* Another process changes the pipeline: a write that bypasses this process's store. */
static void foreign_set(const char *db, const char *id, const char *update_json) {
  mongoc_collection_t *coll = mongoc_client_get_collection(g_client, db, "pipelines");
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id)), *update = obx_test_json(update_json);
  bson_error_t berr;
  if (!mongoc_collection_update_one(coll, filter, update, NULL, NULL, &berr)) fail_msg("update: %s", berr.message);
  bson_destroy(update);
  bson_destroy(filter);
  mongoc_collection_destroy(coll);
}

typedef struct {
  obx_pipeline_cache_t *cache;
  const char *db, *org, *want;
} cache_wait_t;

static bool cache_says(void *ctx) {
  cache_wait_t *w = ctx;
  char got[64];
  return strcmp(cached_name(w->cache, w->db, w->org, got, sizeof got), w->want) == 0;
}

#define EXPECT_NAME(cache, org, want, what)                                                                         \
  do {                                                                                                              \
    char got_[64];                                                                                                  \
    if (strcmp(cached_name(cache, db, org, got_, sizeof got_), want) != 0)                                          \
      fail_msg("%s: got %s, want %s", what, got_, want);                                                            \
  } while (0)

/* The order.pre cache: answers (pipeline or none) are kept for the TTL, so another process's
 * write is seen late; this process's own saves are seen at once; TTL 0 reads every time. */
static void test_enabled_cache(void **state) {
  const char *db = "pl_cache";
  obx_err_t err = OBX_ERR_INIT;
  bson_t saved = BSON_INITIALIZER;
  obx_pipeline_cache_t *longttl = obx_pipeline_cache_new(600000), *shortttl = obx_pipeline_cache_new(300),
                       *off = obx_pipeline_cache_new(0);

  EXPECT_NAME(longttl, "org-c", "none", "before any pipeline");
  bson_t *def = obx_test_json(DEF_PRE("first", "true"));
  if (!obx_pipeline_store_create(g_client, db, "org-c", def, &saved, &err)) fail_msg("create: %s", err.msg);
  char id[64];
  snprintf(id, sizeof id, "%s", obx_test_doc_str(&saved, "_id"));
  EXPECT_NAME(longttl, "org-c", "first", "after this process created it (the cached none is stale)");
  EXPECT_NAME(longttl, "org-d", "none", "another org");
  EXPECT_NAME(shortttl, "org-c", "first", "short TTL");

  /* another process disables it: the cached answer stands until the TTL */
  foreign_set(db, id, "{'$set': {'enabled': false}}");
  EXPECT_NAME(longttl, "org-c", "first", "foreign write within the TTL (served from the cache)");
  EXPECT_NAME(off, "org-c", "none", "TTL 0 (no cache)");
  cache_wait_t w = {shortttl, db, "org-c", "none"};
  if (!obx_test_wait_for(cache_says, &w, 10000, 50)) fail_msg("short TTL: the foreign write was not seen in 10 s");

  /* this process saves again: every cache sees it at once */
  bson_t *renamed = obx_test_json(DEF_PRE("second", "true"));
  if (!obx_pipeline_store_update(g_client, db, "org-c", id, renamed, NULL, &err)) fail_msg("update: %s", err.msg);
  EXPECT_NAME(longttl, "org-c", "second", "after this process updated it");
  EXPECT_NAME(shortttl, "org-c", "second", "short TTL, after this process updated it");
  const char *action;
  bson_t *disabled = obx_test_json(DEF_PRE("second", "false"));
  BSON_APPEND_UTF8(disabled, "orgId", "org-c");
  if (!obx_pipeline_store_apply(g_client, db, NULL, disabled, false, &action, NULL, &err)) fail_msg("apply: %s", err.msg);
  assert_string_equal(action, "update");
  EXPECT_NAME(longttl, "org-c", "none", "after this process disabled it by apply");

  bson_destroy(disabled);
  bson_destroy(renamed);
  bson_destroy(def);
  bson_destroy(&saved);
  obx_pipeline_cache_destroy(off);
  obx_pipeline_cache_destroy(shortttl);
  obx_pipeline_cache_destroy(longttl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_create_update_scope),
    cmocka_unit_test(test_commit_writes_effects_and_execution),
    cmocka_unit_test(test_commit_joins_caller_transaction),
    cmocka_unit_test(test_executions_paging),
    cmocka_unit_test(test_apply_config_dir),
    cmocka_unit_test(test_unique_enabled_index),
    cmocka_unit_test(test_enabled_cache),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
