/* ops_page.c - the page reader of every operator list, and small shared helpers
 *
 * DESIGN: see ops_int.h. A page asks MongoDB for limit + 1 documents: the extra one only says
 * whether a next page exists. The cursor names the last item's sort key, so a page is stable
 * under inserts (new documents sort before it) and costs one index range scan. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_int.h"

void ops_array_doc(bson_t *arr, int i, const bson_t *doc) {
  char idx[16];
  const char *key;
  bson_uint32_to_string((uint32_t)i, &key, idx, sizeof idx);
  BSON_APPEND_DOCUMENT(arr, key, doc);
}

void ops_array_utf8(bson_t *arr, int i, const char *s) {
  char idx[16];
  const char *key;
  bson_uint32_to_string((uint32_t)i, &key, idx, sizeof idx);
  BSON_APPEND_UTF8(arr, key, s);
}

bool ops_need_ladder(const obx_ops_t *ops, obx_err_t *err) {
  if (ops->ladder) return true;
  obx_err_set(err, OBX_ERR_AMQP, 0, true, "RabbitMQ is not configured");
  return false;
}

void ops_time_range(bson_t *filter, const char *field, int64_t since_ms, int64_t until_ms) {
  if (!since_ms && !until_ms) return;
  bson_t range;
  BSON_APPEND_DOCUMENT_BEGIN(filter, field, &range);
  if (since_ms) BSON_APPEND_DATE_TIME(&range, "$gte", since_ms);
  if (until_ms) BSON_APPEND_DATE_TIME(&range, "$lte", until_ms);
  bson_append_document_end(filter, &range);
}

/* "<ms>~<id>" -> ms, id (borrowed from the cursor). */
static bool cursor_parse(const char *cursor, int64_t *ms, const char **id) {
  char *end;
  long long v = strtoll(cursor, &end, 10);
  if (end == cursor || *end != '~' || !end[1]) return false;
  *ms = v;
  *id = end + 1;
  return true;
}

bool ops_find_page(const obx_ops_t *ops, const char *collection, const bson_t *filter, const char *date_field,
                   const char *id_field, int dir, const bson_t *projection, const obx_ops_page_t *page, bson_t *out, obx_err_t *err) {
  int limit = page && page->limit ? page->limit : OBX_OPS_DEFAULT_LIMIT;
  if (limit < 1 || limit > OBX_OPS_MAX_LIMIT) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "limit must be from 1 to %d", OBX_OPS_MAX_LIMIT);
    return false;
  }
  bson_t query = BSON_INITIALIZER, opts = BSON_INITIALIZER, child, items;
  if (page && page->after) {
    int64_t ms;
    const char *id;
    if (!cursor_parse(page->after, &ms, &id)) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "cursor \"%s\" is not a `next` value of a previous page", page->after);
      return false;
    }
    const char *cmp = dir < 0 ? "$lt" : "$gt";
    bson_t *after = BCON_NEW("$or", "[", "{", date_field, "{", cmp, BCON_DATE_TIME(ms), "}", "}", "{", date_field,
                             BCON_DATE_TIME(ms), id_field, "{", cmp, BCON_UTF8(id), "}", "}", "]");
    bson_t arr;
    BSON_APPEND_ARRAY_BEGIN(&query, "$and", &arr);
    ops_array_doc(&arr, 0, filter);
    ops_array_doc(&arr, 1, after);
    bson_append_array_end(&query, &arr);
    bson_destroy(after);
  } else {
    bson_concat(&query, filter);
  }
  BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &child);
  BSON_APPEND_INT32(&child, date_field, dir);
  BSON_APPEND_INT32(&child, id_field, dir);
  bson_append_document_end(&opts, &child);
  BSON_APPEND_INT64(&opts, "limit", limit + 1);
  if (projection) BSON_APPEND_DOCUMENT(&opts, "projection", projection);

  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, collection);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &query, &opts, NULL);
  const bson_t *doc;
  int n = 0;
  char next[160] = "";
  bool more = false;
  BSON_APPEND_ARRAY_BEGIN(out, "items", &items);
  while (mongoc_cursor_next(cursor, &doc)) {
    if (n == limit) {
      more = true;
      break;
    }
    ops_array_doc(&items, n++, doc);
    bson_iter_t it;
    int64_t ms = bson_iter_init_find(&it, doc, date_field) && BSON_ITER_HOLDS_DATE_TIME(&it) ? bson_iter_date_time(&it) : 0;
    const char *id = obx_mongo_doc_str(doc, id_field);
    snprintf(next, sizeof next, "%" PRId64 "~%s", ms, id ? id : "");
  }
  bson_append_array_end(out, &items);
  BSON_APPEND_INT32(out, "count", n);
  if (more) BSON_APPEND_UTF8(out, "next", next);
  else BSON_APPEND_NULL(out, "next");
  bool ok = obx_mongo_cursor_end(cursor, err);
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  bson_destroy(&opts);
  bson_destroy(&query);
  return ok;
}
