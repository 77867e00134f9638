/* test_mongo_cursor.c - obx_mongo_cursor_end against devmongod: the one ending of a cursor
 *
 * DESIGN: one devmongod for the group. A find that succeeds ends true and leaves err alone; a
 * find the server refuses (failCommand, BadValue: the driver does not retry it) ends false with
 * the server's code, and retriable exactly when the server's reply carries a retry label (the
 * reply is read, not only the driver's error); a NULL err drops the error; a NULL cursor is no
 * read (true). */
#include <stdio.h>
#include <string.h>

#include "obx/obx_mongo.h"
#include "obx_test.h"
#include "obx_test_fixture.h"

#define BAD_VALUE 2 /* neither transient nor retryable: the label alone makes it retriable */

static obx_test_mongo_t g_m;
static mongoc_client_t *g_client;

static int setup(void **state) { return obx_test_fixture_mongo_setup(&g_m, NULL, &g_client); }
static int teardown(void **state) { return obx_test_fixture_mongo_teardown(&g_m, g_client); }

/* A find of every document of the test's collection, read to its end; *n: the documents read. */
static mongoc_cursor_t *find_all(mongoc_collection_t *coll, int *n) {
  bson_t filter = BSON_INITIALIZER;
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(coll, &filter, NULL, NULL);
  const bson_t *doc;
  *n = 0;
  while (mongoc_cursor_next(cursor, &doc)) (*n)++;
  bson_destroy(&filter);
  return cursor;
}

/* failCommand on find, once, with BadValue and the given errorLabels (a JSON array, or NULL). */
static void fail_next_find(const char *labels) {
  char json[256];
  snprintf(json, sizeof json,
           "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": [\"find\"], "
           "\"errorCode\": %d%s%s}}",
           BAD_VALUE, labels ? ", \"errorLabels\": " : "", labels ? labels : "");
  obx_test_fail_point(g_client, json);
}

static void test_cursor_end(void **state) {
  mongoc_collection_t *coll = mongoc_client_get_collection(g_client, "cursor_end", "docs");
  bson_t *doc = BCON_NEW("_id", BCON_INT32(1));
  bson_error_t berr;
  if (!mongoc_collection_insert_one(coll, doc, NULL, NULL, &berr)) fail_msg("insert: %s", berr.message);
  bson_destroy(doc);

  static const struct {
    const char *name, *labels; /* labels: NULL, the find succeeds */
    bool fails, retriable;
  } cases[] = {
    {"a find that succeeds", NULL, false, false},
    {"BadValue", "[]", true, false},
    {"BadValue labelled TransientTransactionError", "[\"TransientTransactionError\"]", true, true},
    {"BadValue labelled ResumableChangeStreamError", "[\"ResumableChangeStreamError\"]", true, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].labels) fail_next_find(cases[i].labels);
    obx_err_t err = OBX_ERR_INIT;
    int n;
    mongoc_cursor_t *cursor = find_all(coll, &n);
    bool ok = obx_mongo_cursor_end(cursor, &err);
    if (ok == cases[i].fails) fail_msg("%s: got %s, want %s", cases[i].name, ok ? "true" : "false", ok ? "false" : "true");
    if (!cases[i].fails) {
      if (n != 1 || err.domain != 0) fail_msg("%s: got %d documents and err domain %d, want 1 and err untouched", cases[i].name, n, err.domain);
      continue;
    }
    if (err.domain != OBX_ERR_MONGO || err.code != BAD_VALUE)
      fail_msg("%s: got err domain %d code %d (%s), want mongo %d", cases[i].name, err.domain, err.code, err.msg, BAD_VALUE);
    if (err.retriable != cases[i].retriable)
      fail_msg("%s: got retriable %d want %d (%s)", cases[i].name, err.retriable, cases[i].retriable, err.msg);
  }

  /* NULL err: the failure is still told, its error dropped; a NULL cursor is no read */
  fail_next_find("[]");
  int n;
  if (obx_mongo_cursor_end(find_all(coll, &n), NULL)) fail_msg("NULL err: got true for a failed find, want false");
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_mongo_cursor_end(NULL, &err) || err.domain != 0) fail_msg("NULL cursor: got false or an error, want true");
  mongoc_collection_destroy(coll);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_cursor_end),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
