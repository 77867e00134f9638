/* doc.c - BSON/JSON helpers of obx_test_doc.h */
#include "obx_test_doc.h"
#include "obx_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool find_path(const bson_t *doc, const char *path, bson_iter_t *value) {
  bson_iter_t it;
  return bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, value);
}

const char *obx_test_doc_str(const bson_t *doc, const char *path) {
  bson_iter_t v;
  return find_path(doc, path, &v) && BSON_ITER_HOLDS_UTF8(&v) ? bson_iter_utf8(&v, NULL) : NULL;
}

int64_t obx_test_doc_int(const bson_t *doc, const char *path) {
  bson_iter_t v;
  return find_path(doc, path, &v) && BSON_ITER_HOLDS_NUMBER(&v) ? bson_iter_as_int64(&v) : -1;
}

char *obx_test_json_quotes(const char *single_quoted) {
  char *out = strdup(single_quoted);
  for (char *p = out; *p; p++)
    if (*p == '\'') *p = '"';
  return out;
}

bson_t *obx_test_bson(const char *json) {
  bson_error_t berr;
  bson_t *doc = bson_new_from_json((const uint8_t *)json, -1, &berr);
  if (!doc) fail_msg("bad test JSON %s: %s", json, berr.message);
  return doc;
}

bson_t *obx_test_json(const char *single_quoted) {
  char *json = obx_test_json_quotes(single_quoted);
  bson_t *doc = obx_test_bson(json);
  free(json);
  return doc;
}

char *obx_test_read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)(n > 0 ? n : 0) + 1);
  size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
  buf[got] = '\0';
  fclose(f);
  return buf;
}

void obx_test_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) fail_msg("cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

int64_t obx_test_count(mongoc_client_t *client, const char *db, const char *coll, const bson_t *filter) {
  bson_t empty = BSON_INITIALIZER;
  bson_error_t berr;
  mongoc_collection_t *c = mongoc_client_get_collection(client, db, coll);
  int64_t n = mongoc_collection_count_documents(c, filter ? filter : &empty, NULL, NULL, NULL, &berr);
  mongoc_collection_destroy(c);
  if (n < 0) fail_msg("count %s.%s: %s", db, coll, berr.message);
  return n;
}

bool obx_test_find_one(mongoc_client_t *client, const char *db, const char *coll, const bson_t *filter, bson_t *out) {
  mongoc_collection_t *c = mongoc_client_get_collection(client, db, coll);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, filter, NULL, NULL);
  const bson_t *doc;
  bool found = mongoc_cursor_next(cursor, &doc);
  if (found) bson_copy_to(doc, out);
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  return found;
}
