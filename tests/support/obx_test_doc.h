/* obx_test_doc.h - small BSON/JSON helpers for tests that inspect documents
 *
 * DESIGN: tests read fields by dotted path ("steps.1.output.status") and write JSON with
 * single quotes to keep tables readable; collection helpers run plain finds (devmongod or a
 * real server). A helper that cannot do its job fails the running cmocka test. */
#ifndef OBX_TEST_DOC_H
#define OBX_TEST_DOC_H

#include <stdint.h>
#include <bson/bson.h>
#include <mongoc/mongoc.h>

/* The string at a dotted path, NULL when absent or not a string. Borrowed from doc. */
const char *obx_test_doc_str(const bson_t *doc, const char *path);
/* The number at a dotted path as an integer, -1 when absent or not a number. */
int64_t obx_test_doc_int(const bson_t *doc, const char *path);
/* "{'a': 1}" -> "{\"a\": 1}" (the text has no literal single quote); caller frees. */
char *obx_test_json_quotes(const char *single_quoted);
/* Parses single-quoted JSON (obx_test_json_quotes); owned, bson_destroy. */
bson_t *obx_test_json(const char *single_quoted);
/* Parses JSON as written (double quotes); owned, bson_destroy. */
bson_t *obx_test_bson(const char *json);
/* A whole file, NUL-terminated; NULL when it cannot be read. Caller frees. */
char *obx_test_read_file(const char *path);
/* Creates or replaces the file at path with text. */
void obx_test_write_file(const char *path, const char *text);
/* Documents of db.coll matching filter (NULL: all). */
int64_t obx_test_count(mongoc_client_t *client, const char *db, const char *coll, const bson_t *filter);
/* The first document of db.coll matching filter, copied to out (initialised by the caller,
 * e.g. BSON_INITIALIZER); false when none. */
bool obx_test_find_one(mongoc_client_t *client, const char *db, const char *coll, const bson_t *filter, bson_t *out);

#endif
