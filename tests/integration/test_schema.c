/* test_schema.c - the schema module (obx_schema.h) against devmongod
 *
 * DESIGN: each test uses a fresh database. Each role alone gets exactly the collections the
 * table says it touches, each with its declared indexes; an equivalent index a DBA made under
 * another name is accepted (no second index on the same keys) and its TTL set from the
 * configuration; a same-keys index with other options is refused with a message naming it;
 * outboxd started with one role creates its collections before /readyz turns 200. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_conf.h"
#include "obx/obx_mongo.h"
#include "obx/obx_schema.h"
#include "obx_test.h"
#include "obx_test_kafka.h"
#include "obx_test_doc.h"
#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;

static int setup(void **state) { return obx_test_fixture_mongo_setup(&g_m, NULL, &g_client); }
static int teardown(void **state) { return obx_test_fixture_mongo_teardown(&g_m, g_client); }

static void conf_for(obx_conf_t *conf, const char *db) {
  obx_err_t err = OBX_ERR_INIT;
  obx_conf_init(conf);
  assert_true(obx_conf_set(conf, "mongo.uri", g_m.uri, &err));
  assert_true(obx_conf_set(conf, "mongo.db", db, &err));
}

static bool has_collection(const char *db, const char *name) {
  mongoc_database_t *d = mongoc_client_get_database(g_client, db);
  bson_error_t berr;
  char **names = mongoc_database_get_collection_names_with_opts(d, NULL, &berr);
  if (!names) fail_msg("listCollections on %s: %s", db, berr.message); /* an error is not "absent" */
  bool found = false;
  for (int i = 0; names && names[i]; i++) found |= strcmp(names[i], name) == 0;
  bson_strfreev(names);
  mongoc_database_destroy(d);
  return found;
}

/* How many indexes of db.coll have the key pattern `keys` (JSON); the name of the last in name. */
static int indexes_with_keys(const char *db, const char *coll, const char *keys, char *name, size_t len,
                             int64_t *expire) {
  mongoc_collection_t *c = mongoc_client_get_collection(g_client, db, coll);
  mongoc_cursor_t *cursor = mongoc_collection_find_indexes_with_opts(c, NULL);
  bson_t *want = obx_test_json(keys);
  const bson_t *index;
  int n = 0;
  while (mongoc_cursor_next(cursor, &index)) {
    bson_iter_t it;
    uint32_t klen;
    const uint8_t *data;
    bson_t key;
    if (!bson_iter_init_find(&it, index, "key") || !BSON_ITER_HOLDS_DOCUMENT(&it)) continue;
    bson_iter_document(&it, &klen, &data);
    bson_init_static(&key, data, klen);
    char *a = bson_as_relaxed_extended_json(&key, NULL), *b = bson_as_relaxed_extended_json(want, NULL);
    bool same = strcmp(a, b) == 0;
    bson_free(a);
    bson_free(b);
    if (!same) continue;
    n++;
    if (name && bson_iter_init_find(&it, index, "name")) snprintf(name, len, "%s", bson_iter_utf8(&it, NULL));
    if (expire) *expire = bson_iter_init_find(&it, index, "expireAfterSeconds") ? bson_iter_as_int64(&it) : -1;
  }
  mongoc_cursor_destroy(cursor);
  bson_destroy(want);
  mongoc_collection_destroy(c);
  return n;
}

static void create_index(const char *db, const char *coll, const char *spec) {
  mongoc_database_t *d = mongoc_client_get_database(g_client, db);
  char json[512];
  snprintf(json, sizeof json, "{\"createIndexes\": \"%s\", \"indexes\": [%s]}", coll, spec);
  bson_t *cmd = obx_test_json(json);
  bson_error_t berr;
  if (!mongoc_database_write_command_with_opts(d, cmd, NULL, NULL, &berr)) fail_msg("createIndexes: %s", berr.message);
  bson_destroy(cmd);
  mongoc_database_destroy(d);
}

/* Each role alone: exactly its collections, each with every declared index under our name. */
static void test_each_role_alone_on_a_fresh_database(void **state) {
  static const struct {
    const char *name;
    unsigned role;
  } roles[] = {{"api", OBX_SCHEMA_API}, {"relay", OBX_SCHEMA_RELAY}, {"worker", OBX_SCHEMA_WORKER}, {"ctl", OBX_SCHEMA_CTL}};
  int ncoll;
  const obx_schema_collection_t *colls = obx_schema_collections(&ncoll);
  for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++) {
    char db[64];
    snprintf(db, sizeof db, "schema_alone_%s", roles[r].name);
    obx_conf_t conf;
    obx_err_t err = OBX_ERR_INIT;
    conf_for(&conf, db);
    obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
    assert_non_null(mongo);
    if (!obx_schema_ensure(mongo, &conf, roles[r].role, &err)) fail_msg("%s: %s", roles[r].name, err.msg);
    if (!obx_schema_ensure(mongo, &conf, roles[r].role, &err)) fail_msg("%s again: %s", roles[r].name, err.msg);
    int touched = 0;
    for (int c = 0; c < ncoll; c++) {
      bool mine = colls[c].roles & roles[r].role;
      touched += mine;
      if (has_collection(db, colls[c].name) != mine)
        fail_msg("role %s: collection %s: got %s want %s", roles[r].name, colls[c].name,
                 mine ? "absent" : "present", mine ? "present" : "absent");
      for (int i = 0; mine && i < colls[c].nindexes; i++) {
        char name[128] = "";
        int n = indexes_with_keys(db, colls[c].name, colls[c].indexes[i].keys, name, sizeof name, NULL);
        if (n != 1 || strcmp(name, colls[c].indexes[i].name) != 0)
          fail_msg("role %s: %s index %s: got %d named %s, want one", roles[r].name, colls[c].name,
                   colls[c].indexes[i].keys, n, name);
      }
    }
    assert_true(touched > 0);
    obx_mongo_destroy(mongo);
    obx_conf_cleanup(&conf);
  }
  /* the sweeper's sort is backed: equality on status, then availableAt, _id */
  const obx_schema_collection_t *outbox = obx_schema_collection("outbox");
  bool sweep = false;
  for (int i = 0; outbox && i < outbox->nindexes; i++)
    sweep |= strcmp(outbox->indexes[i].keys, "{\"status\": 1, \"availableAt\": 1, \"_id\": 1}") == 0;
  assert_true(sweep);
}

/* A DBA's indexes under other names stand for ours; the TTL follows outbox.retention. */
static void test_equivalent_index_under_another_name(void **state) {
  const char *db = "schema_dba";
  create_index(db, "outbox", "{\"key\": {\"status\": 1, \"availableAt\": 1, \"_id\": 1}, \"name\": \"dba_sweep\"}");
  create_index(db, "outbox", "{\"key\": {\"publishedAt\": 1}, \"name\": \"dba_ttl\", \"expireAfterSeconds\": 3600, "
                             "\"partialFilterExpression\": {\"status\": \"PUBLISHED\"}}");
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  conf_for(&conf, db);
  assert_true(obx_conf_set(&conf, "outbox.retention", "2d", &err));
  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  if (!obx_schema_ensure(mongo, &conf, OBX_SCHEMA_RELAY, &err)) fail_msg("ensure: %s", err.msg);
  char name[128];
  int64_t expire = 0;
  assert_int_equal(indexes_with_keys(db, "outbox", "{\"status\": 1, \"availableAt\": 1, \"_id\": 1}", name, sizeof name, NULL), 1);
  assert_string_equal(name, "dba_sweep");
  assert_int_equal(indexes_with_keys(db, "outbox", "{\"publishedAt\": 1}", name, sizeof name, &expire), 1);
  assert_string_equal(name, "dba_ttl");
  if (expire != 2 * 86400) fail_msg("dba_ttl expireAfterSeconds: got %lld want %d", (long long)expire, 2 * 86400);
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
}

/* Same keys, other meaning (not unique): refused, naming the existing index; nothing dropped. */
static void test_conflicting_index_is_named(void **state) {
  const char *db = "schema_conflict";
  create_index(db, "orders", "{\"key\": {\"orgId\": 1, \"orderNumber\": 1}, \"name\": \"dba_orders\"}");
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  conf_for(&conf, db);
  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  assert_false(obx_schema_ensure(mongo, &conf, OBX_SCHEMA_API, &err));
  if (!strstr(err.msg, "dba_orders") || !strstr(err.msg, "orders_org_number")) fail_msg("error: %s", err.msg);
  assert_false(err.retriable);
  assert_int_equal(indexes_with_keys(db, "orders", "{\"orgId\": 1, \"orderNumber\": 1}", NULL, 0, NULL), 1);
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
}

/* outboxd with one role on a fresh database: its collections exist once /readyz says 200 (the
 * relay, which leads, is ready only with its topic on a reachable broker: a topic of the test's
 * own on the run's broker). */
static void test_outboxd_role_alone_ready_after_schema(void **state) {
  static const char *const roles[] = {"relay", "api"};
  obx_test_broker_t kafka;
  char topic[128], topic_arg[160];
  obx_test_require(obx_test_broker_shared(&kafka), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)");
  assert_true(obx_test_broker_topic(&kafka, "schema", 1, NULL, topic, sizeof topic));
  snprintf(topic_arg, sizeof topic_arg, "kafka.topic=%s", topic);
  for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++) {
    char db[64], uri[300], dbarg[80], kafka_arg[600];
    snprintf(db, sizeof db, "schema_process_%s", roles[r]);
    snprintf(uri, sizeof uri, "mongo.uri=%s", g_m.uri);
    snprintf(dbarg, sizeof dbarg, "mongo.db=%s", db);
    snprintf(kafka_arg, sizeof kafka_arg, "kafka.brokers=%s", kafka.bootstrap);
    char *args[] = {"--roles", (char *)roles[r], "-X", uri, "-X", dbarg, "-X", kafka_arg, "-X", topic_arg, NULL};
    obx_test_outboxd_t d;
    assert_true(obx_test_outboxd_start(&d, args));
    if (!obx_test_wait_for(obx_test_http_ready, &d.port, 30000, 50)) {
      obx_test_outboxd_stop(&d);
      fail_msg("outboxd --roles %s: /readyz never 200", roles[r]);
    }
    int status = obx_test_outboxd_stop(&d); /* what it created before /readyz said 200 stays */
    int ncoll;
    const obx_schema_collection_t *colls = obx_schema_collections(&ncoll);
    unsigned bit = r == 0 ? OBX_SCHEMA_RELAY : OBX_SCHEMA_API;
    const char *missing = NULL;
    for (int c = 0; c < ncoll && !missing; c++)
      if ((colls[c].roles & bit) && !has_collection(db, colls[c].name)) missing = colls[c].name;
    if (missing) fail_msg("--roles %s ready without collection %s", roles[r], missing);
    assert_int_equal(status, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_each_role_alone_on_a_fresh_database),
    cmocka_unit_test(test_equivalent_index_under_another_name),
    cmocka_unit_test(test_conflicting_index_is_named),
    cmocka_unit_test(test_outboxd_role_alone_ready_after_schema),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
