/* test_dm_query.c - devmongod's query language: value order, matching, updates, upsert seeds,
 * sort, projection and aggregation, each as a table of documents written in extended JSON */
#include "obx_test.h"
#include "dm_query.h"

#include <stdio.h>
#include <string.h>

#define NOW_MS 1700000000000LL

/* Copies src renaming keys that start with '%' to '$': libbson's JSON reader takes "$type",
 * "$regex" and "$options" keys for legacy extended JSON (binary, regex), so the tables write
 * those operators as "%type", "%regex" and "%options". */
static void rename_keys(const bson_t *src, bson_t *dst) {
  bson_iter_t it;
  bson_iter_init(&it, src);
  while (bson_iter_next(&it)) {
    const char *key = bson_iter_key(&it);
    char *name = key[0] == '%' ? bson_strdup_printf("$%s", key + 1) : bson_strdup(key);
    if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
      uint32_t len;
      const uint8_t *data;
      bson_t sub, child;
      if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
        bson_iter_document(&it, &len, &data);
        bson_append_document_begin(dst, name, -1, &child);
      } else {
        bson_iter_array(&it, &len, &data);
        bson_append_array_begin(dst, name, -1, &child);
      }
      bson_init_static(&sub, data, len);
      rename_keys(&sub, &child);
      if (BSON_ITER_HOLDS_DOCUMENT(&it))
        bson_append_document_end(dst, &child);
      else
        bson_append_array_end(dst, &child);
    } else {
      bson_append_value(dst, name, -1, bson_iter_value(&it));
    }
    bson_free(name);
  }
}

static bson_t *json(const char *text) {
  bson_error_t error;
  bson_t *b = bson_new_from_json((const uint8_t *)text, -1, &error);
  if (!b) fail_msg("bad test JSON %s: %s", text, error.message);
  bson_t *renamed = bson_new();
  rename_keys(b, renamed);
  bson_destroy(b);
  return renamed;
}

static char *as_json(const bson_t *b) { return bson_as_canonical_extended_json(b, NULL); }

/* Fails with got/want when the documents differ byte for byte (types included). */
static void expect_doc(const char *name, const bson_t *got, const char *want_json) {
  bson_t *want = json(want_json);
  if (!bson_equal(got, want)) {
    char *g = as_json(got), *w = as_json(want);
    print_error("%s:\n  got  %s\n  want %s\n", name, g, w);
    bson_free(g);
    bson_free(w);
    bson_destroy(want);
    fail();
  }
  bson_destroy(want);
}

/* ---- value order ---- */

static void test_value_compare(void **state) {
  static const struct {
    const char *a, *b; /* {"v": ...} documents */
    int want;          /* sign */
  } cases[] = {
    {"{\"v\": 1}", "{\"v\": 1.0}", 0},
    {"{\"v\": 1}", "{\"v\": {\"$numberLong\": \"1\"}}", 0},
    {"{\"v\": 1}", "{\"v\": {\"$numberDecimal\": \"1.0\"}}", 0},
    {"{\"v\": 2}", "{\"v\": {\"$numberDecimal\": \"1.5\"}}", 1},
    {"{\"v\": {\"$numberLong\": \"9007199254740993\"}}", "{\"v\": 9007199254740992.0}", 1},
    {"{\"v\": {\"$numberDouble\": \"NaN\"}}", "{\"v\": {\"$numberDouble\": \"-Infinity\"}}", -1},
    {"{\"v\": {\"$numberDouble\": \"NaN\"}}", "{\"v\": {\"$numberDouble\": \"NaN\"}}", 0},
    {"{\"v\": null}", "{\"v\": 0}", -1},
    {"{\"v\": {\"$minKey\": 1}}", "{\"v\": null}", -1},
    {"{\"v\": {\"$maxKey\": 1}}", "{\"v\": {\"$date\": {\"$numberLong\": \"0\"}}}", 1},
    {"{\"v\": 100}", "{\"v\": \"1\"}", -1},
    {"{\"v\": \"a\"}", "{\"v\": \"ab\"}", -1},
    {"{\"v\": \"b\"}", "{\"v\": \"ab\"}", 1},
    {"{\"v\": \"z\"}", "{\"v\": {}}", -1},
    {"{\"v\": {\"a\": 1}}", "{\"v\": {\"a\": 2}}", -1},
    {"{\"v\": {\"a\": 1}}", "{\"v\": {\"b\": 0}}", -1},
    {"{\"v\": {\"a\": 1}}", "{\"v\": {\"a\": 1, \"b\": 0}}", -1},
    {"{\"v\": {\"a\": 5}}", "{\"v\": {\"a\": \"x\"}}", -1},
    {"{\"v\": {}}", "{\"v\": []}", -1},
    {"{\"v\": [1, 2]}", "{\"v\": [1, 3]}", -1},
    {"{\"v\": [1, 2]}", "{\"v\": [1]}", 1},
    {"{\"v\": []}", "{\"v\": {\"$binary\": {\"base64\": \"\", \"subType\": \"00\"}}}", -1},
    {"{\"v\": {\"$oid\": \"000000000000000000000001\"}}", "{\"v\": {\"$oid\": \"000000000000000000000002\"}}", -1},
    {"{\"v\": {\"$oid\": \"ffffffffffffffffffffffff\"}}", "{\"v\": false}", -1},
    {"{\"v\": false}", "{\"v\": true}", -1},
    {"{\"v\": true}", "{\"v\": {\"$date\": {\"$numberLong\": \"-5\"}}}", -1},
    {"{\"v\": {\"$date\": {\"$numberLong\": \"-5\"}}}", "{\"v\": {\"$date\": {\"$numberLong\": \"3\"}}}", -1},
    {"{\"v\": {\"$date\": {\"$numberLong\": \"9\"}}}", "{\"v\": {\"$timestamp\": {\"t\": 1, \"i\": 1}}}", -1},
    {"{\"v\": {\"$timestamp\": {\"t\": 1, \"i\": 2}}}", "{\"v\": {\"$timestamp\": {\"t\": 2, \"i\": 1}}}", -1},
    {"{\"v\": {\"$timestamp\": {\"t\": 4294967295, \"i\": 1}}}", "{\"v\": {\"$timestamp\": {\"t\": 1, \"i\": 1}}}", 1},
    {"{\"v\": {\"$regularExpression\": {\"pattern\": \"a\", \"options\": \"\"}}}", "{\"v\": {\"$timestamp\": {\"t\": 1, \"i\": 1}}}", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *a = json(cases[i].a), *b = json(cases[i].b);
    bson_value_t va, vb;
    assert_true(dm_get_path(a, "v", &va));
    assert_true(dm_get_path(b, "v", &vb));
    int got = dm_value_compare(&va, &vb), back = dm_value_compare(&vb, &va);
    got = got < 0 ? -1 : got > 0;
    back = back < 0 ? -1 : back > 0;
    if (got != cases[i].want || back != -cases[i].want)
      fail_msg("compare(%s, %s): got %d (reverse %d), want %d", cases[i].a, cases[i].b, got, back,
               cases[i].want);
    bson_destroy(a);
    bson_destroy(b);
  }
}

static void test_get_path(void **state) {
  bson_t *doc = json("{\"a\": {\"b\": {\"c\": 5}}, \"items\": [{\"q\": 1}, {\"q\": 2}]}");
  bson_value_t v;
  assert_true(dm_get_path(doc, "a.b.c", &v));
  assert_int_equal(v.value_type, BSON_TYPE_INT32);
  assert_int_equal(v.value.v_int32, 5);
  assert_true(dm_get_path(doc, "items.1.q", &v));
  assert_int_equal(v.value.v_int32, 2);
  assert_true(dm_get_path(doc, "a.b", &v));
  assert_int_equal(v.value_type, BSON_TYPE_DOCUMENT);
  assert_false(dm_get_path(doc, "a.x", &v));
  assert_false(dm_get_path(doc, "items.q", &v));
  bson_destroy(doc);
}

/* ---- matching ---- */

static const struct {
  const char *doc, *filter;
  int want;
} match_cases[] = {
  /* equality */
  {"{\"a\": 1}", "{\"a\": 1}", 1},
  {"{\"a\": 1}", "{\"a\": 2}", 0},
  {"{\"a\": 1}", "{\"a\": 1.0}", 1},
  {"{\"a\": {\"$numberLong\": \"1\"}}", "{\"a\": 1}", 1},
  {"{\"a\": \"x\"}", "{\"a\": \"x\"}", 1},
  {"{\"a\": \"1\"}", "{\"a\": 1}", 0},
  {"{}", "{}", 1},
  {"{\"a\": 1, \"b\": 2}", "{\"a\": 1, \"b\": 2}", 1},
  {"{\"a\": 1, \"b\": 2}", "{\"a\": 1, \"b\": 3}", 0},
  {"{\"a\": {\"b\": 1, \"c\": 2}}", "{\"a\": {\"b\": 1, \"c\": 2}}", 1},
  {"{\"a\": {\"b\": 1, \"c\": 2}}", "{\"a\": {\"c\": 2, \"b\": 1}}", 0},
  {"{\"a\": {\"b\": 1, \"c\": 2}}", "{\"a\": {\"b\": 1}}", 0},
  /* null and missing */
  {"{\"b\": 1}", "{\"a\": null}", 1},
  {"{\"a\": null}", "{\"a\": null}", 1},
  {"{\"a\": 0}", "{\"a\": null}", 0},
  {"{\"a\": [1, null]}", "{\"a\": null}", 1},
  {"{\"a\": {\"c\": 1}}", "{\"a.b\": null}", 1},
  {"{\"a\": [{\"b\": 1}, {\"c\": 1}]}", "{\"a.b\": null}", 1},
  {"{\"a\": [{\"b\": 1}, {\"b\": 2}]}", "{\"a.b\": null}", 0},
  {"{\"a\": null}", "{\"a\": {\"$exists\": true}}", 1},
  {"{\"b\": 1}", "{\"a\": {\"$exists\": true}}", 0},
  {"{\"b\": 1}", "{\"a\": {\"$exists\": false}}", 1},
  {"{\"a\": 1}", "{\"a\": {\"$exists\": 0}}", 0},
  {"{\"a\": [{\"c\": 1}]}", "{\"a.b\": {\"$exists\": false}}", 1},
  {"{\"a\": [{\"c\": 1}, {\"b\": 1}]}", "{\"a.b\": {\"$exists\": true}}", 1},
  {"{\"a\": []}", "{\"a\": {\"$exists\": true}}", 1},
  /* comparisons and type bracketing */
  {"{\"a\": 5}", "{\"a\": {\"$gt\": 4}}", 1},
  {"{\"a\": 5}", "{\"a\": {\"$gt\": 5}}", 0},
  {"{\"a\": 5}", "{\"a\": {\"$gte\": 5}}", 1},
  {"{\"a\": 5}", "{\"a\": {\"$lt\": 5.5}}", 1},
  {"{\"a\": 5}", "{\"a\": {\"$lte\": 4.9}}", 0},
  {"{\"a\": 5}", "{\"a\": {\"$gt\": 1, \"$lt\": 10}}", 1},
  {"{\"a\": 5}", "{\"a\": {\"$gt\": 1, \"$lt\": 3}}", 0},
  {"{\"a\": \"5\"}", "{\"a\": {\"$gt\": 1}}", 0},
  {"{\"a\": 5}", "{\"a\": {\"$gt\": \"1\"}}", 0},
  {"{\"a\": \"b\"}", "{\"a\": {\"$gt\": \"a\"}}", 1},
  {"{\"b\": 1}", "{\"a\": {\"$lt\": 5}}", 0},
  {"{\"b\": 1}", "{\"a\": {\"$gte\": null}}", 1},
  {"{\"b\": 1}", "{\"a\": {\"$gt\": null}}", 0},
  {"{\"a\": {\"$date\": {\"$numberLong\": \"2000\"}}}", "{\"a\": {\"$lt\": {\"$date\": {\"$numberLong\": \"3000\"}}}}", 1},
  {"{\"a\": {\"$date\": {\"$numberLong\": \"2000\"}}}", "{\"a\": {\"$lt\": 3000}}", 0},
  {"{\"a\": {\"$numberDecimal\": \"2.5\"}}", "{\"a\": {\"$gt\": 2, \"$lt\": 3}}", 1},
  {"{\"a\": {\"$numberDouble\": \"NaN\"}}", "{\"a\": {\"$lt\": 5}}", 0},
  {"{\"a\": {\"$numberDouble\": \"NaN\"}}", "{\"a\": {\"$gte\": {\"$numberDouble\": \"NaN\"}}}", 1},
  {"{\"a\": 1}", "{\"a\": {\"$gt\": {\"$numberDouble\": \"NaN\"}}}", 0},
  {"{\"a\": \"x\"}", "{\"a\": {\"$gt\": {\"$minKey\": 1}}}", 1},
  {"{\"a\": \"x\"}", "{\"a\": {\"$lt\": {\"$minKey\": 1}}}", 0},
  {"{\"a\": {\"$date\": {\"$numberLong\": \"5\"}}}", "{\"a\": {\"$lte\": {\"$maxKey\": 1}}}", 1},
  {"{\"b\": 1}", "{\"a\": {\"$lt\": {\"$maxKey\": 1}}}", 0},
  {"{\"a\": {\"$maxKey\": 1}}", "{\"a\": {\"$gte\": {\"$maxKey\": 1}}}", 1},
  {"{\"a\": {\"$numberDouble\": \"NaN\"}}", "{\"a\": {\"$numberDouble\": \"NaN\"}}", 1},
  {"{\"a\": [1, 10]}", "{\"a\": {\"$gt\": 5, \"$lt\": 8}}", 1},
  {"{\"a\": [1, 10]}", "{\"a\": {\"$elemMatch\": {\"$gt\": 5, \"$lt\": 8}}}", 0},
  {"{\"a\": [1, 6]}", "{\"a\": {\"$elemMatch\": {\"$gt\": 5, \"$lt\": 8}}}", 1},
  /* $eq / $ne */
  {"{\"a\": 1}", "{\"a\": {\"$eq\": 1}}", 1},
  {"{\"a\": [1, 2]}", "{\"a\": {\"$eq\": 2}}", 1},
  {"{\"a\": 1}", "{\"a\": {\"$ne\": 1}}", 0},
  {"{\"a\": 2}", "{\"a\": {\"$ne\": 1}}", 1},
  {"{\"b\": 2}", "{\"a\": {\"$ne\": 1}}", 1},
  {"{\"a\": [1, 2]}", "{\"a\": {\"$ne\": 1}}", 0},
  {"{\"a\": null}", "{\"a\": {\"$ne\": null}}", 0},
  {"{\"b\": 1}", "{\"a\": {\"$ne\": null}}", 0},
  {"{\"a\": 3}", "{\"a\": {\"$ne\": null}}", 1},
  /* $in / $nin */
  {"{\"a\": 2}", "{\"a\": {\"$in\": [1, 2, 3]}}", 1},
  {"{\"a\": 4}", "{\"a\": {\"$in\": [1, 2, 3]}}", 0},
  {"{\"a\": [4, 3]}", "{\"a\": {\"$in\": [1, 2, 3]}}", 1},
  {"{\"b\": 1}", "{\"a\": {\"$in\": [null]}}", 1},
  {"{\"a\": \"Bob\"}", "{\"a\": {\"$in\": [{\"$regularExpression\": {\"pattern\": \"^b\", \"options\": \"i\"}}]}}", 1},
  {"{\"a\": [1, 2]}", "{\"a\": {\"$in\": [[1, 2]]}}", 1},
  {"{\"a\": 4}", "{\"a\": {\"$in\": []}}", 0},
  {"{\"a\": 4}", "{\"a\": {\"$nin\": [1, 2]}}", 1},
  {"{\"a\": 2}", "{\"a\": {\"$nin\": [1, 2]}}", 0},
  {"{\"b\": 1}", "{\"a\": {\"$nin\": [1, 2]}}", 1},
  {"{\"a\": [3, 2]}", "{\"a\": {\"$nin\": [1, 2]}}", 0},
  {"{\"status\": \"PENDING\"}", "{\"status\": {\"$in\": [\"PENDING\", \"FAILED\"]}}", 1},
  /* dotted paths and arrays */
  {"{\"a\": {\"b\": {\"c\": 1}}}", "{\"a.b.c\": 1}", 1},
  {"{\"a\": {\"b\": {\"c\": 1}}}", "{\"a.b.c\": 2}", 0},
  {"{\"a\": {\"b\": 5}}", "{\"a.b.c\": null}", 1},
  {"{\"a\": [1, 2, 3]}", "{\"a\": 2}", 1},
  {"{\"a\": [1, 2, 3]}", "{\"a\": [1, 2, 3]}", 1},
  {"{\"a\": [1, 2, 3]}", "{\"a\": [1, 2]}", 0},
  {"{\"a\": [[1, 2], 3]}", "{\"a\": [1, 2]}", 1},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items.sku\": \"b\"}", 1},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items.qty\": {\"$gt\": 4}}", 1},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items.qty\": {\"$gt\": 5}}", 0},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items.0.sku\": \"a\"}", 1},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items.1.sku\": \"a\"}", 0},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items.sku\": \"b\", \"items.qty\": 1}", 1},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items\": {\"$elemMatch\": {\"sku\": \"b\", \"qty\": 1}}}", 0},
  {"{\"items\": [{\"sku\": \"a\", \"qty\": 1}, {\"sku\": \"b\", \"qty\": 5}]}", "{\"items\": {\"$elemMatch\": {\"sku\": \"b\", \"qty\": {\"$gte\": 5}}}}", 1},
  {"{\"a\": [10, 20]}", "{\"a.1\": 20}", 1},
  {"{\"items\": [{\"sku\": \"a\"}]}", "{\"items.0.sku\": null}", 0},
  {"{\"items\": [{\"sku\": \"a\"}, {\"x\": 1}]}", "{\"items.1.sku\": null}", 1},
  {"{\"items\": [{\"sku\": \"a\"}]}", "{\"items.5.sku\": {\"$exists\": false}}", 1},
  {"{\"a\": [{\"0\": \"k\"}]}", "{\"a.0\": {\"0\": \"k\"}}", 1},
  {"{\"a\": [{\"3\": \"k\"}]}", "{\"a.3\": \"k\"}", 1},
  {"{\"a\": [10, 20]}", "{\"a.2\": {\"$exists\": true}}", 0},
  {"{\"a\": [{\"b\": [{\"c\": 7}]}]}", "{\"a.b.c\": 7}", 1},
  {"{\"a\": {\"b\": {\"c\": {\"d\": {\"e\": {\"f\": {\"g\": {\"h\": {\"i\": {\"j\": 1}}}}}}}}}}", "{\"a.b.c.d.e.f.g.h.i.j\": 1}", 1},
  {"{\"a_very_long_field_name_that_keeps_going_and_going\": {\"another_rather_long_field_name_here\": {\"and_a_third_long_one_to_pass_the_limit\": 5}}}",
   "{\"a_very_long_field_name_that_keeps_going_and_going.another_rather_long_field_name_here.and_a_third_long_one_to_pass_the_limit\": 5}", 1},
  /* $type */
  {"{\"a\": \"x\"}", "{\"a\": {\"%type\": \"string\"}}", 1},
  {"{\"a\": \"x\"}", "{\"a\": {\"%type\": 2}}", 1},
  {"{\"a\": 1}", "{\"a\": {\"%type\": \"string\"}}", 0},
  {"{\"a\": 1.5}", "{\"a\": {\"%type\": \"number\"}}", 1},
  {"{\"a\": {\"$numberLong\": \"3\"}}", "{\"a\": {\"%type\": \"long\"}}", 1},
  {"{\"a\": 3}", "{\"a\": {\"%type\": [\"long\", \"int\"]}}", 1},
  /* a type list of any length: the match is at entry 41 */
  {"{\"a\": \"x\"}", "{\"a\": {\"%type\": [\"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"double\", \"string\"]}}", 1},
  {"{\"a\": null}", "{\"a\": {\"%type\": \"null\"}}", 1},
  {"{\"b\": 1}", "{\"a\": {\"%type\": \"null\"}}", 0},
  {"{\"a\": [1]}", "{\"a\": {\"%type\": \"array\"}}", 1},
  {"{\"a\": [\"x\", 1]}", "{\"a\": {\"%type\": \"string\"}}", 1},
  {"{\"a\": {\"$date\": {\"$numberLong\": \"1\"}}}", "{\"a\": {\"%type\": \"date\"}}", 1},
  {"{\"a\": {\"$oid\": \"5f0c0c0c0c0c0c0c0c0c0c0c\"}}", "{\"a\": {\"%type\": \"objectId\"}}", 1},
  /* $size / $all / $elemMatch */
  {"{\"a\": [1, 2]}", "{\"a\": {\"$size\": 2}}", 1},
  {"{\"a\": [1, 2]}", "{\"a\": {\"$size\": 1}}", 0},
  {"{\"a\": []}", "{\"a\": {\"$size\": 0}}", 1},
  {"{\"a\": 5}", "{\"a\": {\"$size\": 1}}", 0},
  {"{\"a\": [1, 2, 3]}", "{\"a\": {\"$all\": [3, 1]}}", 1},
  {"{\"a\": [1, 2, 3]}", "{\"a\": {\"$all\": [3, 4]}}", 0},
  {"{\"a\": 3}", "{\"a\": {\"$all\": [3]}}", 1},
  {"{\"a\": [1]}", "{\"a\": {\"$all\": []}}", 0},
  {"{\"a\": [{\"x\": 1}, {\"x\": 2}]}", "{\"a\": {\"$all\": [{\"$elemMatch\": {\"x\": 2}}]}}", 1},
  {"{\"a\": [[1, 2], [3]]}", "{\"a\": {\"$elemMatch\": {\"$size\": 1}}}", 1},
  {"{\"a\": 5}", "{\"a\": {\"$elemMatch\": {\"$gt\": 1}}}", 0},
  {"{\"a\": [{\"x\": 1}]}", "{\"a\": {\"$elemMatch\": {\"$or\": [{\"x\": 2}, {\"x\": 1}]}}}", 1},
  /* $regex */
  {"{\"a\": \"Hello\"}", "{\"a\": {\"%regex\": \"^hel\"}}", 0},
  {"{\"a\": \"Hello\"}", "{\"a\": {\"%regex\": \"^hel\", \"%options\": \"i\"}}", 1},
  {"{\"a\": \"Hello\"}", "{\"a\": {\"$regularExpression\": {\"pattern\": \"l+o$\", \"options\": \"\"}}}", 1},
  {"{\"a\": \"order-42\"}", "{\"a\": {\"%regex\": \"^order-\\\\d+$\"}}", 1},
  {"{\"a\": \"order-4x\"}", "{\"a\": {\"%regex\": \"^order-\\\\d+$\"}}", 0},
  {"{\"a\": \"a b\"}", "{\"a\": {\"%regex\": \"a\\\\sb\"}}", 1},
  {"{\"a\": 12}", "{\"a\": {\"%regex\": \"1\"}}", 0},
  {"{\"a\": [\"x\", \"yes\"]}", "{\"a\": {\"%regex\": \"^y\"}}", 1},
  /* $not */
  {"{\"a\": 5}", "{\"a\": {\"$not\": {\"$gt\": 3}}}", 0},
  {"{\"a\": 2}", "{\"a\": {\"$not\": {\"$gt\": 3}}}", 1},
  {"{\"b\": 2}", "{\"a\": {\"$not\": {\"$gt\": 3}}}", 1},
  {"{\"a\": \"abc\"}", "{\"a\": {\"$not\": {\"$regularExpression\": {\"pattern\": \"^a\", \"options\": \"\"}}}}", 0},
  /* $mod */
  {"{\"a\": 10}", "{\"a\": {\"$mod\": [4, 2]}}", 1},
  {"{\"a\": 11}", "{\"a\": {\"$mod\": [4, 2]}}", 0},
  {"{\"a\": 1e300}", "{\"a\": {\"$mod\": [7, 100]}}", 0},
  {"{\"a\": -10.5}", "{\"a\": {\"$mod\": [4, -2]}}", 1},
  /* logical */
  {"{\"a\": 1, \"b\": 2}", "{\"$and\": [{\"a\": 1}, {\"b\": 2}]}", 1},
  {"{\"a\": 1, \"b\": 2}", "{\"$and\": [{\"a\": 1}, {\"b\": 3}]}", 0},
  {"{\"a\": 1}", "{\"$or\": [{\"a\": 2}, {\"a\": 1}]}", 1},
  {"{\"a\": 3}", "{\"$or\": [{\"a\": 2}, {\"a\": 1}]}", 0},
  {"{\"a\": 3}", "{\"$nor\": [{\"a\": 2}, {\"a\": 1}]}", 1},
  {"{\"a\": 1}", "{\"$nor\": [{\"a\": 2}, {\"a\": 1}]}", 0},
  {"{\"a\": 1, \"b\": 5}", "{\"b\": 5, \"$or\": [{\"a\": 1}, {\"c\": 1}], \"$and\": [{\"b\": {\"$gt\": 1}}]}", 1},
  {"{\"a\": 1}", "{\"$comment\": \"hi\", \"a\": 1}", 1},
  {"{\"a\": 5, \"b\": 3}", "{\"$expr\": {\"$gt\": [\"$a\", \"$b\"]}}", 1},
  {"{\"a\": 1, \"b\": 3}", "{\"$expr\": {\"$gt\": [\"$a\", \"$b\"]}}", 0},
  /* the shape outboxd queries */
  {"{\"_id\": \"e1\", \"status\": \"PENDING\", \"availableAt\": {\"$date\": {\"$numberLong\": \"1000\"}}}",
   "{\"status\": \"PENDING\", \"availableAt\": {\"$lte\": {\"$date\": {\"$numberLong\": \"2000\"}}}}", 1},
  {"{\"_id\": {\"consumer\": \"c\", \"eventId\": \"e\"}}", "{\"_id\": {\"consumer\": \"c\", \"eventId\": \"e\"}}", 1},
  {"{\"_id\": {\"consumer\": \"c\", \"eventId\": \"e\"}}", "{\"_id.eventId\": \"e\"}", 1},
};

static void test_match(void **state) {
  for (size_t i = 0; i < sizeof match_cases / sizeof match_cases[0]; i++) {
    bson_t *doc = json(match_cases[i].doc), *filter = json(match_cases[i].filter);
    bson_error_t error = {0};
    assert_true(dm_match_validate(filter, &error));
    int got = dm_match(doc, filter, &error);
    if (got != match_cases[i].want)
      fail_msg("case %zu: match(%s, %s): got %d (%s), want %d", i, match_cases[i].doc,
               match_cases[i].filter, got, got < 0 ? error.message : "", match_cases[i].want);
    bson_destroy(doc);
    bson_destroy(filter);
  }
}

static void test_match_errors(void **state) {
  static const struct {
    const char *filter;
    uint32_t code;
    const char *msg; /* substring */
  } cases[] = {
    {"{\"a\": {\"$foo\": 1}}", 2, "unknown operator: $foo"},
    {"{\"$foo\": 1}", 2, "unknown top level operator: $foo"},
    {"{\"a\": {\"$in\": 1}}", 2, "$in needs an array"},
    {"{\"a\": {\"$nin\": {}}}", 2, "$nin needs an array"},
    {"{\"$or\": []}", 2, "nonempty"},
    {"{\"$and\": {}}", 2, "must be an array"},
    {"{\"a\": {\"%type\": \"nope\"}}", 2, "Unknown type name alias: nope"},
    {"{\"a\": {\"$size\": \"x\"}}", 2, "$size"},
    {"{\"a\": {\"%regex\": \"(\"}}", 51091, "Regular expression is invalid"},
    {"{\"a\": {\"$elemMatch\": {\"b\": {\"$bad\": 1}}}}", 2, "unknown operator: $bad"},
    {"{\"x\": {\"$elemMatch\": {\"$gt\": 1, \"$worse\": 1}}}", 2, "unknown operator: $worse"},
    {"{\"a\": {\"$not\": 5}}", 2, "$not"},
    {"{\"x\": 1, \"a\": {\"$gt\": 1, \"$zz\": 1}}", 2, "unknown operator: $zz"},
    {"{\"a\": {\"$in\": [{\"$gt\": 1}]}}", 2, "cannot nest $ under $in"},
    {"{\"a\": {\"$mod\": [0, 1]}}", 2, "divisor cannot be 0"},
    {"{\"a\": {\"%type\": 1e300}}", 2, "Invalid numerical type code"},
    {"{\"a\": {\"%type\": 3.5}}", 2, "Invalid numerical type code: 3.5"},
  };
  bson_t *doc = json("{\"a\": [1, {\"b\": 2}], \"x\": 2}"), *empty = bson_new();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *filter = json(cases[i].filter);
    /* a non-matching document and an empty one both report the bad filter */
    for (int d = 0; d < 2; d++) {
      bson_error_t error = {0};
      int got = dm_match(d ? empty : doc, filter, &error);
      if (got != -1 || error.code != cases[i].code || !strstr(error.message, cases[i].msg))
        fail_msg("%s: got %d code %u \"%s\", want -1 code %u \"%s\"", cases[i].filter, got,
                 error.code, error.message, cases[i].code, cases[i].msg);
    }
    bson_error_t error = {0};
    assert_false(dm_match_validate(filter, &error));
    assert_int_equal(error.code, cases[i].code);
    bson_destroy(filter);
  }
  bson_destroy(doc);
  bson_destroy(empty);
}

/* ---- updates ---- */

static const struct {
  const char *doc, *update;
  bool insert;
  const char *want, *desc; /* desc NULL: not checked */
} update_cases[] = {
  {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"a\": 2}}", false, "{\"_id\": 1, \"a\": 2}",
   "{\"updatedFields\": {\"a\": 2}, \"removedFields\": []}"},
  {"{\"_id\": 1}", "{\"$set\": {\"a-c\": 1, \"a.b\": 2}}", false, "{\"_id\": 1, \"a\": {\"b\": 2}, \"a-c\": 1}", NULL},
  {"{\"_id\": 1}", "{\"$set\": {\"o.10\": 1, \"o.9\": 2, \"o.x\": 3}}", false, "{\"_id\": 1, \"o\": {\"9\": 2, \"10\": 1, \"x\": 3}}", NULL},
  {"{\"_id\": 1}", "{\"$set\": {\"b\": 1, \"a\": 2}}", false, "{\"_id\": 1, \"a\": 2, \"b\": 1}",
   "{\"updatedFields\": {\"a\": 2, \"b\": 1}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"a\": 1}}", false, "{\"_id\": 1, \"a\": 1}",
   "{\"updatedFields\": {}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"a\": 1.0}}", false, "{\"_id\": 1, \"a\": 1.0}",
   "{\"updatedFields\": {\"a\": 1.0}, \"removedFields\": []}"},
  {"{\"_id\": 1}", "{\"$set\": {\"a.b.c.d.e.f.g.h.i\": 1}}", false,
   "{\"_id\": 1, \"a\": {\"b\": {\"c\": {\"d\": {\"e\": {\"f\": {\"g\": {\"h\": {\"i\": 1}}}}}}}}}", NULL},
  {"{\"_id\": 1}", "{\"$set\": {\"a.b.c\": 1}}", false, "{\"_id\": 1, \"a\": {\"b\": {\"c\": 1}}}",
   "{\"updatedFields\": {\"a\": {\"b\": {\"c\": 1}}}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": {\"x\": 1}}", "{\"$set\": {\"a.b\": 2}}", false,
   "{\"_id\": 1, \"a\": {\"x\": 1, \"b\": 2}}", "{\"updatedFields\": {\"a.b\": 2}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": {\"y\": 1}}", "{\"$set\": {\"a\": {\"x\": 1}}}", false, "{\"_id\": 1, \"a\": {\"x\": 1}}",
   "{\"updatedFields\": {\"a\": {\"x\": 1}}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": {\"x\": 1, \"y\": 1}}", "{\"$set\": {\"a.x\": 2}, \"$unset\": {\"a.y\": 1}}", false,
   "{\"_id\": 1, \"a\": {\"x\": 2}}", "{\"updatedFields\": {\"a.x\": 2}, \"removedFields\": [\"a.y\"]}"},
  {"{\"_id\": 1, \"items\": [{\"qty\": 1}, {\"qty\": 2}]}", "{\"$set\": {\"items.1.qty\": 5}}", false,
   "{\"_id\": 1, \"items\": [{\"qty\": 1}, {\"qty\": 5}]}",
   "{\"updatedFields\": {\"items.1.qty\": 5}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": [1]}", "{\"$set\": {\"a.3\": 4}}", false, "{\"_id\": 1, \"a\": [1, null, null, 4]}",
   "{\"updatedFields\": {\"a.1\": null, \"a.2\": null, \"a.3\": 4}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"status\": \"PENDING\", \"attempts\": 0}",
   "{\"$set\": {\"status\": \"PUBLISHED\"}, \"$inc\": {\"attempts\": 1}, \"$currentDate\": {\"publishedAt\": true}}",
   false, "{\"_id\": 1, \"status\": \"PUBLISHED\", \"attempts\": 1, \"publishedAt\": {\"$date\": {\"$numberLong\": \"1700000000000\"}}}",
   "{\"updatedFields\": {\"status\": \"PUBLISHED\", \"attempts\": 1, \"publishedAt\": {\"$date\": {\"$numberLong\": \"1700000000000\"}}}, \"removedFields\": []}"},
  /* $unset */
  {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"$unset\": {\"a\": \"\"}}", false, "{\"_id\": 1, \"b\": 2}",
   "{\"updatedFields\": {}, \"removedFields\": [\"a\"]}"},
  {"{\"_id\": 1, \"a\": {\"b\": 1, \"c\": 2}}", "{\"$unset\": {\"a.b\": 1}}", false, "{\"_id\": 1, \"a\": {\"c\": 2}}",
   "{\"updatedFields\": {}, \"removedFields\": [\"a.b\"]}"},
  {"{\"_id\": 1}", "{\"$unset\": {\"a.b\": 1}}", false, "{\"_id\": 1}", "{\"updatedFields\": {}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": [1, 2]}", "{\"$unset\": {\"a.0\": 1}}", false, "{\"_id\": 1, \"a\": [null, 2]}", NULL},
  /* $inc / $mul with type promotion */
  {"{\"_id\": 1, \"n\": 1}", "{\"$inc\": {\"n\": 2}}", false, "{\"_id\": 1, \"n\": 3}", NULL},
  {"{\"_id\": 1, \"n\": 1}", "{\"$inc\": {\"n\": 0.5}}", false, "{\"_id\": 1, \"n\": 1.5}", NULL},
  {"{\"_id\": 1, \"n\": 2147483647}", "{\"$inc\": {\"n\": 1}}", false,
   "{\"_id\": 1, \"n\": {\"$numberLong\": \"2147483648\"}}", NULL},
  {"{\"_id\": 1, \"n\": {\"$numberLong\": \"5\"}}", "{\"$inc\": {\"n\": 1}}", false,
   "{\"_id\": 1, \"n\": {\"$numberLong\": \"6\"}}", NULL},
  {"{\"_id\": 1}", "{\"$inc\": {\"c.n\": 3}}", false, "{\"_id\": 1, \"c\": {\"n\": 3}}", NULL},
  {"{\"_id\": 1, \"n\": 3}", "{\"$mul\": {\"n\": 4}}", false, "{\"_id\": 1, \"n\": 12}", NULL},
  {"{\"_id\": 1, \"n\": 65536}", "{\"$mul\": {\"n\": 65536}}", false, "{\"_id\": 1, \"n\": {\"$numberLong\": \"4294967296\"}}", NULL},
  {"{\"_id\": 1, \"n\": {\"$numberLong\": \"9223372036854775807\"}}", "{\"$inc\": {\"n\": 1}}", false,
   "{\"_id\": 1, \"n\": 9223372036854775808.0}", NULL},
  {"{\"_id\": 1, \"n\": {\"$numberDecimal\": \"1.5\"}}", "{\"$inc\": {\"n\": 1}}", false,
   "{\"_id\": 1, \"n\": {\"$numberDecimal\": \"2.5\"}}", NULL},
  {"{\"_id\": 1, \"n\": 2}", "{\"$mul\": {\"n\": {\"$numberLong\": \"3\"}}}", false, "{\"_id\": 1, \"n\": {\"$numberLong\": \"6\"}}", NULL},
  {"{\"_id\": 1}", "{\"$mul\": {\"n\": 4}}", false, "{\"_id\": 1, \"n\": 0}", NULL},
  {"{\"_id\": 1, \"n\": 1}", "{\"$inc\": {\"n\": -1}}", false, "{\"_id\": 1, \"n\": 0}",
   "{\"updatedFields\": {\"n\": 0}, \"removedFields\": []}"},
  /* $min / $max */
  {"{\"_id\": 1, \"n\": 5}", "{\"$min\": {\"n\": 3}}", false, "{\"_id\": 1, \"n\": 3}", NULL},
  {"{\"_id\": 1, \"n\": 5}", "{\"$min\": {\"n\": 7}}", false, "{\"_id\": 1, \"n\": 5}", NULL},
  {"{\"_id\": 1, \"n\": 5}", "{\"$max\": {\"n\": 7}}", false, "{\"_id\": 1, \"n\": 7}", NULL},
  {"{\"_id\": 1}", "{\"$max\": {\"n\": 7}}", false, "{\"_id\": 1, \"n\": 7}", NULL},
  /* $push / $addToSet / $pull / $pop */
  {"{\"_id\": 1}", "{\"$push\": {\"a\": 1}}", false, "{\"_id\": 1, \"a\": [1]}",
   "{\"updatedFields\": {\"a\": [1]}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": [1]}", "{\"$push\": {\"a\": [2]}}", false, "{\"_id\": 1, \"a\": [1, [2]]}", NULL},
  {"{\"_id\": 1, \"a\": [1]}", "{\"$push\": {\"a\": {\"$each\": [2, 3]}}}", false, "{\"_id\": 1, \"a\": [1, 2, 3]}",
   "{\"updatedFields\": {\"a.1\": 2, \"a.2\": 3}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": [1, 2]}", "{\"$push\": {\"a\": {\"$each\": [3, 4], \"$slice\": -3}}}", false,
   "{\"_id\": 1, \"a\": [2, 3, 4]}", NULL},
  {"{\"_id\": 1, \"a\": [1, 2]}", "{\"$push\": {\"a\": {\"$each\": [0], \"$position\": 0}}}", false,
   "{\"_id\": 1, \"a\": [0, 1, 2]}", "{\"updatedFields\": {\"a\": [0, 1, 2]}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": [3, 1]}", "{\"$push\": {\"a\": {\"$each\": [2], \"$sort\": 1}}}", false,
   "{\"_id\": 1, \"a\": [1, 2, 3]}", NULL},
  {"{\"_id\": 1, \"a\": [{\"s\": 2}, {\"s\": 1}]}", "{\"$push\": {\"a\": {\"$each\": [{\"s\": 3}], \"$sort\": {\"s\": -1}, \"$slice\": 2}}}",
   false, "{\"_id\": 1, \"a\": [{\"s\": 3}, {\"s\": 2}]}", NULL},
  {"{\"_id\": 1, \"a\": [1, 2]}", "{\"$addToSet\": {\"a\": 2}}", false, "{\"_id\": 1, \"a\": [1, 2]}",
   "{\"updatedFields\": {}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": [1, 2]}", "{\"$addToSet\": {\"a\": {\"$each\": [2, 3, 3]}}}", false,
   "{\"_id\": 1, \"a\": [1, 2, 3]}", NULL},
  {"{\"_id\": 1, \"a\": [1, 2, 3, 2]}", "{\"$pull\": {\"a\": 2}}", false, "{\"_id\": 1, \"a\": [1, 3]}",
   "{\"updatedFields\": {\"a\": [1, 3]}, \"removedFields\": []}"},
  {"{\"_id\": 1, \"a\": [1, 5, 7]}", "{\"$pull\": {\"a\": {\"$gte\": 5}}}", false, "{\"_id\": 1, \"a\": [1]}", NULL},
  {"{\"_id\": 1, \"a\": [{\"k\": 1, \"v\": 1}, {\"k\": 2}]}", "{\"$pull\": {\"a\": {\"k\": 2}}}", false,
   "{\"_id\": 1, \"a\": [{\"k\": 1, \"v\": 1}]}", NULL},
  {"{\"_id\": 1}", "{\"$pull\": {\"a\": 1}}", false, "{\"_id\": 1}", NULL},
  {"{\"_id\": 1, \"a\": [1, 2, 3]}", "{\"$pullAll\": {\"a\": [1, 3]}}", false, "{\"_id\": 1, \"a\": [2]}", NULL},
  {"{\"_id\": 1, \"a\": [1, 2, 3]}", "{\"$pop\": {\"a\": -1}}", false, "{\"_id\": 1, \"a\": [2, 3]}", NULL},
  {"{\"_id\": 1, \"a\": [1, 2, 3]}", "{\"$pop\": {\"a\": 1}}", false, "{\"_id\": 1, \"a\": [1, 2]}", NULL},
  /* $rename */
  {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"$rename\": {\"a\": \"c\"}}", false, "{\"_id\": 1, \"b\": 2, \"c\": 1}",
   "{\"updatedFields\": {\"c\": 1}, \"removedFields\": [\"a\"]}"},
  {"{\"_id\": 1, \"a\": {\"x\": 1}}", "{\"$rename\": {\"a.x\": \"b.y\"}}", false,
   "{\"_id\": 1, \"a\": {}, \"b\": {\"y\": 1}}",
   "{\"updatedFields\": {\"b\": {\"y\": 1}}, \"removedFields\": [\"a.x\"]}"},
  {"{\"_id\": 1}", "{\"$rename\": {\"a\": \"b\"}}", false, "{\"_id\": 1}", NULL},
  /* $setOnInsert and $currentDate */
  {"{\"_id\": 1}", "{\"$setOnInsert\": {\"a\": 1}, \"$set\": {\"b\": 2}}", false, "{\"_id\": 1, \"b\": 2}", NULL},
  {"{\"k\": 1}", "{\"$setOnInsert\": {\"a\": 1}, \"$set\": {\"b\": 2}}", true, "{\"k\": 1, \"a\": 1, \"b\": 2}", NULL},
  {"{\"_id\": 1}", "{\"$currentDate\": {\"d\": {\"%type\": \"date\"}}}", false,
   "{\"_id\": 1, \"d\": {\"$date\": {\"$numberLong\": \"1700000000000\"}}}", NULL},
  {"{\"_id\": 1}", "{\"$currentDate\": {\"t\": {\"%type\": \"timestamp\"}}}", false,
   "{\"_id\": 1, \"t\": {\"$timestamp\": {\"t\": 1700000000, \"i\": 1}}}", NULL},
  /* _id kept, same _id allowed, moved first */
  {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"_id\": 1}}", false, "{\"_id\": 1, \"a\": 1}", NULL},
  {"{\"a\": 1}", "{\"$set\": {\"_id\": 7}}", true, "{\"_id\": 7, \"a\": 1}", NULL},
  /* replacement */
  {"{\"_id\": 1, \"a\": 1, \"b\": 1}", "{\"c\": 3}", false, "{\"_id\": 1, \"c\": 3}",
   "{\"updatedFields\": {\"c\": 3}, \"removedFields\": [\"a\", \"b\"]}"},
  {"{\"_id\": 1, \"a\": 1}", "{\"a\": 2, \"_id\": 1}", false, "{\"_id\": 1, \"a\": 2}", NULL},
  {"{}", "{\"a\": 2, \"_id\": 5}", true, "{\"_id\": 5, \"a\": 2}", NULL},
  {"{\"_id\": 1, \"a\": 1}", "{}", false, "{\"_id\": 1}", NULL},
  /* empty operator documents are accepted (mongod 5.0+) */
  {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {}}", false, "{\"_id\": 1, \"a\": 1}", NULL},
};

static void test_update(void **state) {
  for (size_t i = 0; i < sizeof update_cases / sizeof update_cases[0]; i++) {
    bson_t *doc = json(update_cases[i].doc), *update = json(update_cases[i].update);
    bson_t out = BSON_INITIALIZER, desc = BSON_INITIALIZER;
    bson_error_t error = {0};
    char name[512];
    snprintf(name, sizeof name, "case %zu: %s on %s", i, update_cases[i].update, update_cases[i].doc);
    if (!dm_update_apply(doc, update, update_cases[i].insert, &out, &desc, NOW_MS, &error))
      fail_msg("%s: failed: %u %s", name, error.code, error.message);
    expect_doc(name, &out, update_cases[i].want);
    if (update_cases[i].desc) expect_doc(name, &desc, update_cases[i].desc);
    /* the description is optional */
    bson_t out2 = BSON_INITIALIZER;
    assert_true(dm_update_apply(doc, update, update_cases[i].insert, &out2, NULL, NOW_MS, &error));
    assert_true(bson_equal(&out, &out2));
    bson_destroy(&out2);
    bson_destroy(&out);
    bson_destroy(&desc);
    bson_destroy(doc);
    bson_destroy(update);
  }
}

static void test_update_errors(void **state) {
  static const struct {
    const char *doc, *update;
    uint32_t code;
    const char *msg;
  } cases[] = {
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1}, \"$inc\": {\"a\": 1}}", 40,
     "Updating the path 'a' would create a conflict at 'a'"},
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1, \"a.b\": 1}}", 40, "would create a conflict at 'a'"},
    {"{\"_id\": 1}", "{\"$set\": {\"a.b\": 1}, \"$unset\": {\"a\": 1}}", 40, "conflict at 'a'"},
    {"{\"_id\": 1}", "{\"$rename\": {\"a\": \"b\"}, \"$set\": {\"b\": 1}}", 40, "conflict"},
    {"{\"_id\": 1}", "{\"$set\": {\"_id\": 2}}", 66, "immutable field '_id'"},
    {"{\"_id\": 1}", "{\"$unset\": {\"_id\": 1}}", 66, "immutable field '_id'"},
    {"{\"_id\": 1}", "{\"_id\": 2, \"a\": 1}", 66, "'_id' was found to have been altered"},
    {"{\"_id\": 1, \"a\": \"x\"}", "{\"$inc\": {\"a\": 1}}", 14, "Cannot apply $inc to a value of non-numeric type"},
    {"{\"_id\": 1}", "{\"$inc\": {\"a\": \"x\"}}", 14, "Cannot increment with non-numeric argument"},
    {"{\"_id\": 1}", "{\"$mul\": {\"a\": null}}", 14, "Cannot multiply with non-numeric argument"},
    {"{\"_id\": 1}", "{\"$foo\": {\"a\": 1}}", 9, "Unknown modifier: $foo"},
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1}, \"b\": 2}", 9, "mixes update operators and replacement"},
    {"{\"_id\": 1}", "{\"$set\": 5}", 9, "Modifiers operate on fields"},
    {"{\"_id\": 1, \"a\": 5}", "{\"$set\": {\"a.b\": 1}}", 28, "Cannot create field 'b' in element {a: 5}"},
    {"{\"_id\": 1, \"a\": [1]}", "{\"$set\": {\"a.x\": 1}}", 28, "Cannot create field 'x'"},
    {"{\"_id\": 1, \"a\": 5}", "{\"$push\": {\"a\": 1}}", 2, "The field 'a' must be an array but is of type int"},
    {"{\"_id\": 1, \"a\": 5}", "{\"$addToSet\": {\"a\": 1}}", 2, "must be an array"},
    {"{\"_id\": 1, \"a\": 5}", "{\"$pull\": {\"a\": 1}}", 2, "Cannot apply $pull to a non-array value"},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": 1}}}", 2, "$each"},
    {"{\"_id\": 1}", "{\"$currentDate\": {\"a\": {\"%type\": \"x\"}}}", 2, "$currentDate"},
    {"{\"_id\": 1}", "{\"$rename\": {\"a\": 1}}", 2, "must be a string"},
    {"{\"_id\": 1}", "{\"$set\": {\"\": 1}}", 56, "empty update path"},
    {"{\"_id\": 1}", "{\"$set\": {\"a..b\": 1}}", 56, "empty update path"},
    {"{\"_id\": 1, \"a\": [1]}", "{\"$pop\": {\"a\": 2}}", 9, "$pop"},
    {"{\"_id\": 1, \"a\": [1]}", "{\"$set\": {\"a.99999999\": 1}}", 2, "can't backfill more than 1500000 elements"},
    {"{\"_id\": 1, \"a\": [1]}", "{\"$inc\": {\"a.99999999.b\": 1}}", 2, "can't backfill"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *doc = json(cases[i].doc), *update = json(cases[i].update);
    bson_t out = BSON_INITIALIZER, desc = BSON_INITIALIZER;
    bson_error_t error = {0};
    bool ok = dm_update_apply(doc, update, false, &out, &desc, NOW_MS, &error);
    if (ok || error.code != cases[i].code || !strstr(error.message, cases[i].msg))
      fail_msg("%s on %s: got ok=%d code %u \"%s\", want code %u \"%s\"", cases[i].update,
               cases[i].doc, ok, error.code, error.message, cases[i].code, cases[i].msg);
    assert_true(bson_empty(&out)); /* nothing written on failure */
    bson_destroy(&out);
    bson_destroy(&desc);
    bson_destroy(doc);
    bson_destroy(update);
  }
}

static void test_is_replacement(void **state) {
  bson_t *a = json("{\"a\": 1}"), *b = json("{\"$set\": {\"a\": 1}}"), *c = bson_new();
  assert_true(dm_update_is_replacement(a));
  assert_false(dm_update_is_replacement(b));
  assert_true(dm_update_is_replacement(c));
  bson_destroy(a);
  bson_destroy(b);
  bson_destroy(c);
}

static void test_upsert_seed(void **state) {
  static const struct {
    const char *filter, *want;
    uint32_t code; /* 0: success */
  } cases[] = {
    {"{\"a\": 1}", "{\"a\": 1}", 0},
    {"{\"a\": 1, \"_id\": \"x\"}", "{\"_id\": \"x\", \"a\": 1}", 0},
    {"{\"a.b\": 1, \"a.c\": 2}", "{\"a\": {\"b\": 1, \"c\": 2}}", 0},
    {"{\"a\": {\"$eq\": 3}, \"b\": {\"$gt\": 1}}", "{\"a\": 3}", 0},
    {"{\"$and\": [{\"a\": 1}, {\"b\": 2}], \"c\": {\"$in\": [1]}}", "{\"a\": 1, \"b\": 2, \"c\": 1}", 0},
    {"{\"$or\": [{\"a\": 1}]}", "{\"a\": 1}", 0},
    {"{\"$or\": [{\"a\": 1}, {\"b\": 1}]}", "{}", 0},
    {"{\"a\": {\"$in\": [\"x\"]}, \"b\": {\"$in\": [1, 2]}, \"c\": {\"$in\": []}}", "{\"a\": \"x\"}", 0},
    {"{\"a\": {\"$regularExpression\": {\"pattern\": \"x\", \"options\": \"\"}}}", "{}", 0},
    {"{\"_id\": {\"consumer\": \"c\", \"eventId\": \"e\"}}", "{\"_id\": {\"consumer\": \"c\", \"eventId\": \"e\"}}", 0},
    {"{\"$and\": [{\"a\": 1}, {\"a\": 2}]}", NULL, 54},
    {"{\"a\": 1, \"a.b\": 2}", NULL, 54},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *filter = json(cases[i].filter), out = BSON_INITIALIZER;
    bson_error_t error = {0};
    bool ok = dm_upsert_seed(filter, &out, &error);
    if (cases[i].code) {
      if (ok || error.code != cases[i].code)
        fail_msg("%s: got ok=%d code %u, want code %u", cases[i].filter, ok, error.code, cases[i].code);
    } else {
      if (!ok) fail_msg("%s: %s", cases[i].filter, error.message);
      expect_doc(cases[i].filter, &out, cases[i].want);
    }
    bson_destroy(&out);
    bson_destroy(filter);
  }
}

/* ---- sort ---- */

/* Sorts the documents of {"d": [...]} by spec and compares the resulting _id order. */
static void check_sort(const char *docs_json, const char *sort_json, const char *want_ids) {
  bson_t *docs = json(docs_json), *sort = json(sort_json);
  bson_t items[16], *sorted[16];
  size_t n = 0;
  bson_iter_t it, arr;
  assert_true(bson_iter_init_find(&it, docs, "d") && bson_iter_recurse(&it, &arr));
  while (bson_iter_next(&arr) && n < 16) {
    uint32_t len;
    const uint8_t *data;
    bson_iter_document(&arr, &len, &data);
    bson_init_static(&items[n], data, len);
    sorted[n] = &items[n];
    n++;
  }
  /* insertion sort: stable, so equal keys keep input order */
  for (size_t i = 1; i < n; i++) {
    bson_t *x = sorted[i];
    size_t j = i;
    while (j > 0 && dm_sort_compare(sorted[j - 1], x, sort) > 0) {
      sorted[j] = sorted[j - 1];
      j--;
    }
    sorted[j] = x;
  }
  char got[256] = "";
  for (size_t i = 0; i < n; i++) {
    bson_value_t id;
    assert_true(dm_get_path(sorted[i], "_id", &id));
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", id.value.v_int32);
  }
  if (strcmp(got, want_ids) != 0) fail_msg("sort %s by %s: got %s, want %s", docs_json, sort_json, got, want_ids);
  bson_destroy(docs);
  bson_destroy(sort);
}

static void test_sort(void **state) {
  check_sort("{\"d\": [{\"_id\": 1, \"a\": 3}, {\"_id\": 2, \"a\": 1}, {\"_id\": 3, \"a\": 2}]}", "{\"a\": 1}", "2,3,1");
  check_sort("{\"d\": [{\"_id\": 1, \"a\": 3}, {\"_id\": 2, \"a\": 1}, {\"_id\": 3, \"a\": 2}]}", "{\"a\": -1}", "1,3,2");
  check_sort("{\"d\": [{\"_id\": 1, \"a\": 1, \"b\": 1}, {\"_id\": 2, \"a\": 1, \"b\": 2}, {\"_id\": 3, \"a\": 0, \"b\": 0}]}",
             "{\"a\": 1, \"b\": -1}", "3,2,1");
  /* missing < null < numbers < strings */
  check_sort("{\"d\": [{\"_id\": 1, \"a\": \"x\"}, {\"_id\": 2, \"a\": null}, {\"_id\": 3}, {\"_id\": 4, \"a\": 5}]}",
             "{\"a\": 1}", "3,2,4,1");
  check_sort("{\"d\": [{\"_id\": 1, \"a\": \"x\"}, {\"_id\": 2, \"a\": null}, {\"_id\": 3}, {\"_id\": 4, \"a\": 5}]}",
             "{\"a\": -1}", "1,4,2,3");
  /* dotted paths */
  check_sort("{\"d\": [{\"_id\": 1, \"o\": {\"t\": 9}}, {\"_id\": 2, \"o\": {\"t\": 4}}]}", "{\"o.t\": 1}", "2,1");
  /* arrays: ascending by the smallest element, descending by the largest */
  check_sort("{\"d\": [{\"_id\": 1, \"a\": [5, 1]}, {\"_id\": 2, \"a\": [2, 3]}, {\"_id\": 3, \"a\": 4}]}", "{\"a\": 1}",
             "1,2,3");
  check_sort("{\"d\": [{\"_id\": 1, \"a\": [5, 1]}, {\"_id\": 2, \"a\": [2, 3]}, {\"_id\": 3, \"a\": 4}]}", "{\"a\": -1}",
             "1,3,2");
  check_sort("{\"d\": [{\"_id\": 1, \"a\": [{\"q\": 7}, {\"q\": 0}]}, {\"_id\": 2, \"a\": [{\"q\": 3}]}]}", "{\"a.q\": 1}",
             "1,2");
  /* numbers of different types interleave */
  check_sort("{\"d\": [{\"_id\": 1, \"a\": 2.5}, {\"_id\": 2, \"a\": {\"$numberLong\": \"2\"}}, {\"_id\": 3, \"a\": 3}]}",
             "{\"a\": 1}", "2,1,3");
  /* equal keys keep their order; an empty spec orders nothing */
  check_sort("{\"d\": [{\"_id\": 1, \"a\": 1}, {\"_id\": 2, \"a\": 1}]}", "{\"a\": -1}", "1,2");
  check_sort("{\"d\": [{\"_id\": 2}, {\"_id\": 1}]}", "{}", "2,1");
  check_sort("{\"d\": [{\"_id\": 2, \"t\": {\"$date\": {\"$numberLong\": \"5\"}}}, {\"_id\": 1, \"t\": {\"$date\": {\"$numberLong\": \"2\"}}}]}",
             "{\"t\": 1}", "1,2");
}

/* ---- projection ---- */

static void test_project(void **state) {
  static const struct {
    const char *doc, *proj, *want;
  } cases[] = {
    {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"a\": 1}", "{\"_id\": 1, \"a\": 1}"},
    {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"a\": true, \"_id\": 0}", "{\"a\": 1}"},
    {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"a\": 0}", "{\"_id\": 1, \"b\": 2}"},
    {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"_id\": 0}", "{\"a\": 1, \"b\": 2}"},
    {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"_id\": 1}", "{\"_id\": 1}"},
    {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{}", "{\"_id\": 1, \"a\": 1, \"b\": 2}"},
    {"{\"_id\": 1, \"b\": 2, \"a\": 1}", "{\"a\": 1, \"b\": 1}", "{\"_id\": 1, \"b\": 2, \"a\": 1}"},
    {"{\"_id\": 1, \"a\": {\"x\": 1, \"y\": 2}, \"b\": 3}", "{\"a.x\": 1}", "{\"_id\": 1, \"a\": {\"x\": 1}}"},
    {"{\"_id\": 1, \"a\": {\"x\": 1, \"y\": 2}, \"b\": 3}", "{\"a.x\": 0}", "{\"_id\": 1, \"a\": {\"y\": 2}, \"b\": 3}"},
    {"{\"_id\": 1, \"a\": {\"x\": 1, \"y\": 2}}", "{\"a\": {\"y\": 1}}", "{\"_id\": 1, \"a\": {\"y\": 2}}"},
    {"{\"_id\": 1, \"a\": {\"y\": 2}}", "{\"a.z\": 1}", "{\"_id\": 1, \"a\": {}}"},
    {"{\"_id\": 1, \"a\": 5}", "{\"a.z\": 1}", "{\"_id\": 1}"},
    {"{\"_id\": 1, \"items\": [{\"s\": 1, \"q\": 2}, {\"s\": 3, \"q\": 4}, 7]}", "{\"items.q\": 1, \"_id\": 0}",
     "{\"items\": [{\"q\": 2}, {\"q\": 4}]}"},
    {"{\"_id\": 1, \"items\": [{\"s\": 1, \"q\": 2}, 7]}", "{\"items.q\": 0}", "{\"_id\": 1, \"items\": [{\"s\": 1}, 7]}"},
    {"{\"_id\": 1, \"a\": [1, 2, 3, 4]}", "{\"a\": {\"$slice\": 2}}", "{\"_id\": 1, \"a\": [1, 2]}"},
    {"{\"_id\": 1, \"a\": [1, 2, 3, 4], \"b\": 1}", "{\"a\": {\"$slice\": -1}}", "{\"_id\": 1, \"a\": [4], \"b\": 1}"},
    {"{\"_id\": 1, \"a\": [1, 2, 3, 4]}", "{\"a\": {\"$slice\": [1, 2]}}", "{\"_id\": 1, \"a\": [2, 3]}"},
    {"{\"_id\": 1, \"a\": [1, 2]}", "{\"a\": {\"$slice\": 1e300}}", "{\"_id\": 1, \"a\": [1, 2]}"},
    {"{\"_id\": 1, \"a\": [1, 2]}", "{\"a\": {\"$slice\": -1e300}}", "{\"_id\": 1, \"a\": [1, 2]}"},
    {"{\"_id\": 1, \"a\": [1, 2, 3]}", "{\"a\": {\"$slice\": [-2, 1]}}", "{\"_id\": 1, \"a\": [2]}"},
    {"{\"_id\": 1, \"a\": 2, \"b\": 3}", "{\"a\": 1, \"sum\": {\"$add\": [\"$a\", \"$b\"]}}", "{\"_id\": 1, \"a\": 2, \"sum\": 5}"},
    {"{\"_id\": 1, \"a\": 2}", "{\"c\": \"$a\", \"_id\": 0}", "{\"c\": 2}"},
    {"{\"_id\": 1, \"a\": 2}", "{\"x.y\": \"$a\"}", "{\"_id\": 1, \"x\": {\"y\": 2}}"},
    {"{\"_id\": 1, \"a\": 2}", "{\"m\": \"$missing\"}", "{\"_id\": 1}"},
    {"{\"_id\": 1, \"a\": 2, \"b\": 3}", "{\"b\": 1, \"_id\": \"$a\"}", "{\"_id\": 2, \"b\": 3}"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *doc = json(cases[i].doc), *proj = json(cases[i].proj), out = BSON_INITIALIZER;
    bson_error_t error = {0};
    char name[256];
    snprintf(name, sizeof name, "project %s by %s", cases[i].doc, cases[i].proj);
    if (!dm_project(doc, proj, &out, &error)) fail_msg("%s: %u %s", name, error.code, error.message);
    expect_doc(name, &out, cases[i].want);
    bson_destroy(&out);
    bson_destroy(doc);
    bson_destroy(proj);
  }
  /* NULL projection copies */
  bson_t *doc = json("{\"_id\": 1, \"a\": 1}"), out = BSON_INITIALIZER;
  assert_true(dm_project(doc, NULL, &out, NULL));
  assert_true(bson_equal(doc, &out));
  bson_destroy(&out);
  bson_destroy(doc);
}

static void test_project_errors(void **state) {
  static const struct {
    const char *proj;
    uint32_t code;
    const char *msg;
  } cases[] = {
    {"{\"a\": 1, \"b\": 0}", 2, "Cannot do exclusion on field b in inclusion projection"},
    {"{\"a\": 0, \"b\": 1}", 2, "Cannot do inclusion on field b in exclusion projection"},
    {"{\"a\": 0, \"c\": \"$x\"}", 2, "Cannot do inclusion on field c"},
    {"{\"a\": 1, \"a.b\": 1}", 31250, "Path collision at a.b"},
    {"{\"a.b\": 1, \"a\": 1}", 31250, "Path collision at a"},
    {"{\"a\": {}}", 51270, "empty sub-projection"},
    {"{\"a\": {\"$bogus\": 1}}", 168, "Unrecognized expression '$bogus'"},
  };
  bson_t *doc = json("{\"_id\": 1, \"a\": 1, \"b\": 2}");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *proj = json(cases[i].proj), out = BSON_INITIALIZER;
    bson_error_t error = {0};
    bool ok = dm_project(doc, proj, &out, &error);
    if (ok || error.code != cases[i].code || !strstr(error.message, cases[i].msg))
      fail_msg("%s: got ok=%d code %u \"%s\", want code %u \"%s\"", cases[i].proj, ok, error.code,
               error.message, cases[i].code, cases[i].msg);
    bson_destroy(&out);
    bson_destroy(proj);
  }
  /* _id: 0 is allowed in an inclusion projection, "_id": 1 in an exclusion one */
  bson_t *proj = json("{\"_id\": 1, \"a\": 0}"), out = BSON_INITIALIZER;
  assert_true(dm_project(doc, proj, &out, NULL));
  expect_doc("_id:1 with exclusion", &out, "{\"_id\": 1, \"b\": 2}");
  bson_destroy(&out);
  bson_destroy(proj);
  bson_destroy(doc);
}

/* ---- aggregation ---- */

/* Runs pipeline over the documents of {"d": [...]}; compares the output with {"d": [...]}. */
static void check_agg(const char *docs_json, const char *pipeline_json, const char *want_json) {
  bson_t *docs = json(docs_json), *pipeline_doc = json(pipeline_json), pipeline;
  bson_t items[16], *in[16];
  size_t n = 0, nout = 0;
  bson_t **out = NULL;
  bson_iter_t it, arr;
  bson_error_t error = {0};

  assert_true(bson_iter_init_find(&it, docs, "d") && bson_iter_recurse(&it, &arr));
  while (bson_iter_next(&arr) && n < 16) {
    uint32_t len;
    const uint8_t *data;
    bson_iter_document(&arr, &len, &data);
    bson_init_static(&items[n], data, len);
    in[n] = &items[n];
    n++;
  }
  uint32_t len;
  const uint8_t *data;
  assert_true(bson_iter_init_find(&it, pipeline_doc, "p"));
  bson_iter_array(&it, &len, &data);
  bson_init_static(&pipeline, data, len);
  if (!dm_aggregate(in, n, &pipeline, &out, &nout, &error))
    fail_msg("pipeline %s: %u %s", pipeline_json, error.code, error.message);
  bson_t got = BSON_INITIALIZER, got_arr;
  bson_append_array_begin(&got, "d", 1, &got_arr);
  for (size_t i = 0; i < nout; i++) {
    char key[32];
    snprintf(key, sizeof key, "%zu", i);
    bson_append_document(&got_arr, key, -1, out[i]);
  }
  bson_append_array_end(&got, &got_arr);
  expect_doc(pipeline_json, &got, want_json);
  bson_destroy(&got);
  dm_docs_free(out, nout);
  bson_destroy(docs);
  bson_destroy(pipeline_doc);
}

#define ORDERS                                                                                      \
  "{\"d\": [{\"_id\": 1, \"org\": \"a\", \"status\": \"PENDING\", \"total\": 10, \"items\": [\"x\", \"y\"]}," \
  " {\"_id\": 2, \"org\": \"b\", \"status\": \"PUBLISHED\", \"total\": 5, \"items\": []},"                \
  " {\"_id\": 3, \"org\": \"a\", \"status\": \"PUBLISHED\", \"total\": 2.5, \"items\": [\"z\"]},"          \
  " {\"_id\": 4, \"org\": \"c\", \"status\": \"PENDING\", \"total\": {\"$numberLong\": \"7\"}}]}"

static void test_aggregate(void **state) {
  check_agg(ORDERS, "{\"p\": []}",
            "{\"d\": [{\"_id\": 1, \"org\": \"a\", \"status\": \"PENDING\", \"total\": 10, \"items\": [\"x\", \"y\"]},"
            " {\"_id\": 2, \"org\": \"b\", \"status\": \"PUBLISHED\", \"total\": 5, \"items\": []},"
            " {\"_id\": 3, \"org\": \"a\", \"status\": \"PUBLISHED\", \"total\": 2.5, \"items\": [\"z\"]},"
            " {\"_id\": 4, \"org\": \"c\", \"status\": \"PENDING\", \"total\": {\"$numberLong\": \"7\"}}]}");
  /* countDocuments as libmongoc sends it */
  check_agg(ORDERS, "{\"p\": [{\"$match\": {\"status\": \"PENDING\"}}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}]}",
            "{\"d\": [{\"_id\": 1, \"n\": 2}]}");
  check_agg(ORDERS, "{\"p\": [{\"$match\": {\"status\": \"NONE\"}}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}]}",
            "{\"d\": []}");
  check_agg(ORDERS, "{\"p\": [{\"$match\": {\"status\": \"PENDING\"}}, {\"$count\": \"n\"}]}", "{\"d\": [{\"n\": 2}]}");
  check_agg(ORDERS, "{\"p\": [{\"$match\": {\"org\": \"zz\"}}, {\"$count\": \"n\"}]}", "{\"d\": []}");
  check_agg(ORDERS, "{\"p\": [{\"$skip\": 1}, {\"$limit\": 2}, {\"$project\": {\"_id\": 1}}]}",
            "{\"d\": [{\"_id\": 2}, {\"_id\": 3}]}");
  check_agg(ORDERS, "{\"p\": [{\"$sort\": {\"total\": -1}}, {\"$project\": {\"total\": 1}}]}",
            "{\"d\": [{\"_id\": 1, \"total\": 10}, {\"_id\": 4, \"total\": {\"$numberLong\": \"7\"}},"
            " {\"_id\": 2, \"total\": 5}, {\"_id\": 3, \"total\": 2.5}]}");
  /* totals with _id null; int + long + double sums to double */
  check_agg(ORDERS,
            "{\"p\": [{\"$group\": {\"_id\": null, \"total\": {\"$sum\": \"$total\"}, \"n\": {\"$sum\": 1},"
            " \"avg\": {\"$avg\": \"$total\"}, \"min\": {\"$min\": \"$total\"}, \"max\": {\"$max\": \"$total\"},"
            " \"c\": {\"$count\": {}}}}]}",
            "{\"d\": [{\"_id\": null, \"total\": 24.5, \"n\": 4, \"avg\": 6.125, \"min\": 2.5, \"max\": 10, \"c\": 4}]}");
  check_agg(ORDERS,
            "{\"p\": [{\"$match\": {\"_id\": {\"$in\": [1, 2]}}}, {\"$group\": {\"_id\": null, \"t\": {\"$sum\": \"$total\"}}}]}",
            "{\"d\": [{\"_id\": null, \"t\": 15}]}");
  check_agg(ORDERS,
            "{\"p\": [{\"$match\": {\"_id\": {\"$in\": [1, 4]}}}, {\"$group\": {\"_id\": null, \"t\": {\"$sum\": \"$total\"}}}]}",
            "{\"d\": [{\"_id\": null, \"t\": {\"$numberLong\": \"17\"}}]}");
  /* group by key, first-seen order, then sorted */
  check_agg(ORDERS,
            "{\"p\": [{\"$group\": {\"_id\": \"$org\", \"n\": {\"$sum\": 1}, \"ids\": {\"$push\": \"$_id\"},"
            " \"first\": {\"$first\": \"$status\"}, \"last\": {\"$last\": \"$status\"}}}, {\"$sort\": {\"n\": -1, \"_id\": 1}}]}",
            "{\"d\": [{\"_id\": \"a\", \"n\": 2, \"ids\": [1, 3], \"first\": \"PENDING\", \"last\": \"PUBLISHED\"},"
            " {\"_id\": \"b\", \"n\": 1, \"ids\": [2], \"first\": \"PUBLISHED\", \"last\": \"PUBLISHED\"},"
            " {\"_id\": \"c\", \"n\": 1, \"ids\": [4], \"first\": \"PENDING\", \"last\": \"PENDING\"}]}");
  check_agg(ORDERS,
            "{\"p\": [{\"$group\": {\"_id\": {\"s\": \"$status\"}, \"orgs\": {\"$addToSet\": \"$org\"}}}]}",
            "{\"d\": [{\"_id\": {\"s\": \"PENDING\"}, \"orgs\": [\"a\", \"c\"]}, {\"_id\": {\"s\": \"PUBLISHED\"}, \"orgs\": [\"b\", \"a\"]}]}");
  check_agg(ORDERS, "{\"p\": [{\"$group\": {\"_id\": \"$nothing\", \"m\": {\"$max\": \"$nothing\"}, \"a\": {\"$avg\": \"$nothing\"}}}]}",
            "{\"d\": [{\"_id\": null, \"m\": null, \"a\": null}]}");
  /* $unwind */
  check_agg(ORDERS, "{\"p\": [{\"$unwind\": \"$items\"}, {\"$project\": {\"items\": 1}}]}",
            "{\"d\": [{\"_id\": 1, \"items\": \"x\"}, {\"_id\": 1, \"items\": \"y\"}, {\"_id\": 3, \"items\": \"z\"}]}");
  check_agg(ORDERS,
            "{\"p\": [{\"$unwind\": {\"path\": \"$items\", \"preserveNullAndEmptyArrays\": true, \"includeArrayIndex\": \"i\"}},"
            " {\"$project\": {\"items\": 1, \"i\": 1}}]}",
            "{\"d\": [{\"_id\": 1, \"items\": \"x\", \"i\": {\"$numberLong\": \"0\"}}, {\"_id\": 1, \"items\": \"y\", \"i\": {\"$numberLong\": \"1\"}},"
            " {\"_id\": 2, \"i\": null}, {\"_id\": 3, \"items\": \"z\", \"i\": {\"$numberLong\": \"0\"}}, {\"_id\": 4, \"i\": null}]}");
  /* $addFields / $set / $unset / $replaceRoot */
  check_agg("{\"d\": [{\"_id\": 1, \"a\": 2, \"b\": {\"c\": 3}}]}",
            "{\"p\": [{\"$addFields\": {\"s\": {\"$add\": [\"$a\", \"$b.c\"]}, \"b.d\": \"$a\", \"a\": \"$$REMOVE\"}}]}",
            "{\"d\": [{\"_id\": 1, \"b\": {\"c\": 3, \"d\": 2}, \"s\": 5}]}");
  check_agg("{\"d\": [{\"_id\": 1, \"a\": 2}]}", "{\"p\": [{\"$set\": {\"x\": {\"y\": {\"$literal\": \"$a\"}}}}]}",
            "{\"d\": [{\"_id\": 1, \"a\": 2, \"x\": {\"y\": \"$a\"}}]}");
  check_agg("{\"d\": [{\"_id\": 1, \"a\": 5}]}", "{\"p\": [{\"$addFields\": {\"a.b\": 1, \"n.m\": \"$$REMOVE\"}}]}",
            "{\"d\": [{\"_id\": 1, \"a\": {\"b\": 1}}]}");
  check_agg("{\"d\": [{\"_id\": 1, \"o\": {\"items\": [7, 8], \"k\": 1}}, {\"_id\": 2, \"o\": {\"items\": 9}}]}",
            "{\"p\": [{\"$unwind\": {\"path\": \"$o.items\", \"includeArrayIndex\": \"o.i\"}}]}",
            "{\"d\": [{\"_id\": 1, \"o\": {\"items\": 7, \"k\": 1, \"i\": {\"$numberLong\": \"0\"}}},"
            " {\"_id\": 1, \"o\": {\"items\": 8, \"k\": 1, \"i\": {\"$numberLong\": \"1\"}}},"
            " {\"_id\": 2, \"o\": {\"items\": 9, \"i\": null}}]}");
  check_agg("{\"d\": [{\"_id\": 1, \"a\": 2, \"b\": 3, \"c\": 4}]}", "{\"p\": [{\"$unset\": [\"a\", \"c\"]}]}",
            "{\"d\": [{\"_id\": 1, \"b\": 3}]}");
  check_agg("{\"d\": [{\"_id\": 1, \"a\": 2, \"b\": 3}]}", "{\"p\": [{\"$unset\": \"b\"}]}", "{\"d\": [{\"_id\": 1, \"a\": 2}]}");
  check_agg("{\"d\": [{\"_id\": 1, \"in\": {\"x\": 1}}]}", "{\"p\": [{\"$replaceRoot\": {\"newRoot\": \"$in\"}}]}",
            "{\"d\": [{\"x\": 1}]}");
  check_agg("{\"d\": [{\"_id\": 1, \"in\": {\"x\": 1}}]}", "{\"p\": [{\"$replaceWith\": {\"k\": \"$_id\"}}]}",
            "{\"d\": [{\"k\": 1}]}");
  /* a $match after other stages, and $sort on ties keeping input order */
  check_agg(ORDERS,
            "{\"p\": [{\"$project\": {\"org\": 1}}, {\"$match\": {\"org\": \"a\"}}, {\"$sort\": {\"org\": 1}}]}",
            "{\"d\": [{\"_id\": 1, \"org\": \"a\"}, {\"_id\": 3, \"org\": \"a\"}]}");
}

static void test_expressions(void **state) {
  static const struct {
    const char *expr, *want; /* {"v": <expr>} evaluated on the doc below, want {"v": ...} or {} */
  } cases[] = {
    {"{\"v\": \"$a\"}", "{\"v\": 2}"},
    {"{\"v\": \"$o.p\"}", "{\"v\": \"q\"}"},
    {"{\"v\": \"$arr.k\"}", "{\"v\": [1, 2]}"},
    {"{\"v\": \"$nope\"}", "{}"},
    {"{\"v\": \"$$ROOT.a\"}", "{\"v\": 2}"},
    {"{\"v\": {\"$eq\": [\"$a\", 2]}}", "{\"v\": true}"},
    {"{\"v\": {\"$eq\": [\"$nope\", null]}}", "{\"v\": false}"},
    {"{\"v\": {\"$ne\": [\"$a\", 2]}}", "{\"v\": false}"},
    {"{\"v\": {\"$gte\": [\"$a\", 2.0]}}", "{\"v\": true}"},
    {"{\"v\": {\"$lt\": [\"$a\", \"str\"]}}", "{\"v\": true}"},
    {"{\"v\": {\"$cmp\": [\"$a\", 1]}}", "{\"v\": 1}"},
    {"{\"v\": {\"$and\": [true, \"$a\"]}}", "{\"v\": true}"},
    {"{\"v\": {\"$and\": [true, 0]}}", "{\"v\": false}"},
    {"{\"v\": {\"$or\": [false, \"$nope\"]}}", "{\"v\": false}"},
    {"{\"v\": {\"$not\": [\"$nope\"]}}", "{\"v\": true}"},
    {"{\"v\": {\"$cond\": [{\"$gt\": [\"$a\", 1]}, \"big\", \"small\"]}}", "{\"v\": \"big\"}"},
    {"{\"v\": {\"$cond\": {\"if\": false, \"then\": 1, \"else\": 0}}}", "{\"v\": 0}"},
    {"{\"v\": {\"$ifNull\": [\"$nope\", \"dflt\"]}}", "{\"v\": \"dflt\"}"},
    {"{\"v\": {\"$ifNull\": [\"$a\", \"dflt\"]}}", "{\"v\": 2}"},
    {"{\"v\": {\"$add\": [1, 2, 3]}}", "{\"v\": 6}"},
    {"{\"v\": {\"$add\": [1, 0.5]}}", "{\"v\": 1.5}"},
    {"{\"v\": {\"$add\": [1, null]}}", "{\"v\": null}"},
    {"{\"v\": {\"$add\": [\"$d\", 1000]}}", "{\"v\": {\"$date\": {\"$numberLong\": \"3000\"}}}"},
    {"{\"v\": {\"$subtract\": [10, 4]}}", "{\"v\": 6}"},
    {"{\"v\": {\"$subtract\": [\"$d\", {\"$date\": {\"$numberLong\": \"500\"}}]}}", "{\"v\": {\"$numberLong\": \"1500\"}}"},
    {"{\"v\": {\"$subtract\": [\"$d\", 1000]}}", "{\"v\": {\"$date\": {\"$numberLong\": \"1000\"}}}"},
    {"{\"v\": {\"$multiply\": [\"$a\", 3]}}", "{\"v\": 6}"},
    {"{\"v\": {\"$multiply\": [2147483647, 2]}}", "{\"v\": {\"$numberLong\": \"4294967294\"}}"},
    {"{\"v\": {\"$divide\": [7, 2]}}", "{\"v\": 3.5}"},
    {"{\"v\": {\"$toString\": \"$a\"}}", "{\"v\": \"2\"}"},
    {"{\"v\": {\"$toString\": 2.5}}", "{\"v\": \"2.5\"}"},
    {"{\"v\": {\"$toString\": \"$d\"}}", "{\"v\": \"1970-01-01T00:00:02.000Z\"}"},
    {"{\"v\": {\"$toString\": {\"$oid\": \"5f0c0c0c0c0c0c0c0c0c0c0c\"}}}", "{\"v\": \"5f0c0c0c0c0c0c0c0c0c0c0c\"}"},
    {"{\"v\": {\"$toString\": \"$nope\"}}", "{\"v\": null}"},
    {"{\"v\": {\"$concat\": [\"$o.p\", \"-\", {\"$toString\": \"$a\"}]}}", "{\"v\": \"q-2\"}"},
    {"{\"v\": {\"$toUpper\": \"$o.p\"}}", "{\"v\": \"Q\"}"},
    {"{\"v\": {\"$size\": \"$arr\"}}", "{\"v\": 2}"},
    {"{\"v\": {\"$in\": [2, [1, 2]]}}", "{\"v\": true}"},
    {"{\"v\": {\"$arrayElemAt\": [\"$arr.k\", -1]}}", "{\"v\": 2}"},
    {"{\"v\": {\"%type\": \"$o\"}}", "{\"v\": \"object\"}"},
    {"{\"v\": {\"%type\": \"$nope\"}}", "{\"v\": \"missing\"}"},
    {"{\"v\": {\"$literal\": {\"$add\": 1}}}", "{\"v\": {\"$add\": 1}}"},
    {"{\"v\": [\"$a\", \"$nope\"]}", "{\"v\": [2, null]}"},
    {"{\"v\": {\"x\": \"$a\", \"y\": \"$nope\"}}", "{\"v\": {\"x\": 2}}"},
    {"{\"v\": {\"$sum\": [\"$a\", 3, \"x\"]}}", "{\"v\": 5}"},
    {"{\"v\": {\"$sum\": \"$arr.k\"}}", "{\"v\": 3}"},
    {"{\"v\": {\"$sum\": \"$nope\"}}", "{\"v\": 0}"},
    {"{\"v\": {\"$avg\": [1, 2]}}", "{\"v\": 1.5}"},
    {"{\"v\": {\"$max\": \"$arr.k\"}}", "{\"v\": 2}"},
    {"{\"v\": {\"$min\": [\"$nope\", 4, 3]}}", "{\"v\": 3}"},
    {"{\"v\": {\"$mergeObjects\": [\"$o\", {\"p\": 1, \"r\": 2}, null]}}", "{\"v\": {\"p\": 1, \"r\": 2}}"},
    {"{\"v\": {\"$mergeObjects\": [{\"a\": 1}, \"$o\"]}}", "{\"v\": {\"a\": 1, \"p\": \"q\"}}"},
    {"{\"v\": {\"$toLong\": \"$d\"}}", "{\"v\": {\"$numberLong\": \"2000\"}}"},
    {"{\"v\": {\"$toInt\": \"42\"}}", "{\"v\": 42}"},
    {"{\"v\": {\"$toInt\": 2.9}}", "{\"v\": 2}"},
    {"{\"v\": {\"$toDouble\": true}}", "{\"v\": 1.0}"},
    {"{\"v\": {\"$toDecimal\": \"$a\"}}", "{\"v\": {\"$numberDecimal\": \"2\"}}"},
    {"{\"v\": {\"$toBool\": 0}}", "{\"v\": false}"},
    {"{\"v\": {\"$toBool\": \"\"}}", "{\"v\": true}"},
    {"{\"v\": {\"$toLong\": \"$nope\"}}", "{\"v\": null}"},
    {"{\"v\": {\"$abs\": -3}}", "{\"v\": 3}"},
    {"{\"v\": {\"$abs\": -2147483648}}", "{\"v\": {\"$numberLong\": \"2147483648\"}}"},
    {"{\"v\": {\"$abs\": -1.5}}", "{\"v\": 1.5}"},
  };
  bson_t *doc = json("{\"_id\": 1, \"a\": 2, \"o\": {\"p\": \"q\"}, \"arr\": [{\"k\": 1}, {\"k\": 2}],"
                     " \"d\": {\"$date\": {\"$numberLong\": \"2000\"}}}");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    /* evaluated through $replaceWith so only the public entry point is used */
    char pipeline_json[512];
    snprintf(pipeline_json, sizeof pipeline_json, "{\"p\": [{\"$replaceWith\": %s}]}", cases[i].expr);
    bson_t *pipeline_doc = json(pipeline_json), pipeline, **out = NULL;
    bson_iter_t it;
    uint32_t len;
    const uint8_t *data;
    size_t nout = 0;
    bson_error_t error = {0};
    bson_t *in[1] = {doc};
    assert_true(bson_iter_init_find(&it, pipeline_doc, "p"));
    bson_iter_array(&it, &len, &data);
    bson_init_static(&pipeline, data, len);
    if (!dm_aggregate(in, 1, &pipeline, &out, &nout, &error))
      fail_msg("%s: %u %s", cases[i].expr, error.code, error.message);
    assert_int_equal(nout, 1);
    expect_doc(cases[i].expr, out[0], cases[i].want);
    dm_docs_free(out, nout);
    bson_destroy(pipeline_doc);
  }
  bson_destroy(doc);
}

static void test_aggregate_errors(void **state) {
  static const struct {
    const char *pipeline;
    uint32_t code;
    const char *msg;
  } cases[] = {
    {"{\"p\": [{\"$bogus\": {}}]}", 40324, "Unrecognized pipeline stage name: '$bogus'"},
    {"{\"p\": [{\"$match\": {}, \"$sort\": {\"a\": 1}}]}", 40323, "exactly one field"},
    {"{\"p\": [{\"$match\": {\"a\": {\"$foo\": 1}}}]}", 2, "unknown operator: $foo"},
    {"{\"p\": [{\"$limit\": 0}]}", 15958, "positive"},
    {"{\"p\": [{\"$skip\": -1}]}", 15956, "non-negative"},
    {"{\"p\": [{\"$sort\": {\"a\": 2}}]}", 15975, "$sort key ordering"},
    {"{\"p\": [{\"$group\": {\"n\": {\"$sum\": 1}}}]}", 15955, "must include an _id"},
    {"{\"p\": [{\"$group\": {\"_id\": null, \"n\": {\"$median\": 1}}}]}", 15952, "unknown group operator '$median'"},
    {"{\"p\": [{\"$project\": {}}]}", 51272, "at least one field"},
    {"{\"p\": [{\"$count\": \"$x\"}]}", 40156, "count field"},
    {"{\"p\": [{\"$unwind\": \"items\"}]}", 28818, "prefixed with a '$'"},
    {"{\"p\": [{\"$replaceRoot\": {\"newRoot\": \"$a\"}}]}", 40228, "must evaluate to an object"},
    {"{\"p\": [{\"$addFields\": {\"x\": {\"$nope\": 1}}}]}", 168, "Unrecognized expression '$nope'"},
    {"{\"p\": [{\"$addFields\": {\"x\": \"$$nothing\"}}]}", 17276, "Use of undefined variable: nothing"},
    {"{\"p\": [{\"$addFields\": {\"x\": {\"$add\": [1, \"s\"]}}}]}", 14, "$add only supports numeric"},
    {"{\"p\": [{\"$addFields\": {\"x\": {\"$size\": \"$a\"}}}]}", 17124, "must be an array"},
    {"{\"p\": [{\"$addFields\": {\"x\": {\"$toInt\": \"12x\"}}}]}", 241, "Failed to parse number '12x'"},
    {"{\"p\": [{\"$addFields\": {\"x\": {\"$toInt\": 3000000000}}}]}", 241, "overflow"},
    {"{\"p\": [{\"$addFields\": {\"x\": {\"$mergeObjects\": [1]}}}]}", 40400, "requires object inputs"},
    {"{\"p\": [{\"$addFields\": {\"x\": {\"$abs\": \"s\"}}}]}", 28765, "$abs only supports numeric"},
  };
  bson_t *doc = json("{\"_id\": 1, \"a\": 5}");
  bson_t *in[1] = {doc};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_t *pipeline_doc = json(cases[i].pipeline), pipeline, **out = NULL;
    bson_iter_t it;
    uint32_t len;
    const uint8_t *data;
    size_t nout = 7;
    bson_error_t error = {0};
    assert_true(bson_iter_init_find(&it, pipeline_doc, "p"));
    bson_iter_array(&it, &len, &data);
    bson_init_static(&pipeline, data, len);
    bool ok = dm_aggregate(in, 1, &pipeline, &out, &nout, &error);
    if (ok || error.code != cases[i].code || !strstr(error.message, cases[i].msg))
      fail_msg("%s: got ok=%d code %u \"%s\", want code %u \"%s\"", cases[i].pipeline, ok, error.code,
               error.message, cases[i].code, cases[i].msg);
    assert_null(out);
    assert_int_equal(nout, 0);
    bson_destroy(pipeline_doc);
  }
  bson_destroy(doc);
}

/* ---- properties over every combination of small documents and clauses ---- */

static const char *prop_docs[] = {
  "{\"_id\": 1}",
  "{\"_id\": 2, \"a\": 1, \"b\": \"x\"}",
  "{\"_id\": 3, \"a\": null, \"b\": [1, 2, 3]}",
  "{\"_id\": 4, \"a\": [1, [2, 3], {\"c\": 4}], \"b\": {\"c\": 5}}",
  "{\"_id\": 5, \"a\": {\"c\": [{\"d\": 1}, {\"d\": 2}]}, \"b\": 2.5}",
  "{\"_id\": 6, \"a\": \"str\", \"b\": {\"$numberLong\": \"7\"}, \"t\": {\"$date\": {\"$numberLong\": \"9\"}}}",
  "{\"_id\": 7, \"a\": [], \"b\": [[]], \"c\": {}}",
  "{\"_id\": 8, \"a\": [{\"c\": 1}, {\"c\": null}, 3], \"b\": true}",
  "{\"_id\": {\"k\": 1}, \"a\": {\"$numberDecimal\": \"1.0\"}, \"b\": {\"$oid\": \"5f0c0c0c0c0c0c0c0c0c0c0c\"}}",
  "{\"_id\": 10, \"a\": {\"$numberDouble\": \"NaN\"}, \"b\": {\"$minKey\": 1}, \"c\": {\"$maxKey\": 1}}",
};

static const char *prop_filters[] = {
  "{\"a\": 1}", "{\"a\": null}", "{\"a.c\": 1}", "{\"a.c.d\": {\"$gte\": 2}}", "{\"a\": {\"$exists\": true}}",
  "{\"b\": {\"$in\": [1, \"x\", null]}}", "{\"b\": {\"$nin\": [2.5]}}", "{\"a\": {\"$ne\": 1}}",
  "{\"a\": {\"$size\": 0}}", "{\"a\": {\"%type\": \"array\"}}", "{\"a\": {\"$elemMatch\": {\"c\": {\"$lte\": 1}}}}",
  "{\"a\": {\"$all\": [1]}}", "{\"a\": {\"%regex\": \"^s\"}}", "{\"a\": {\"$not\": {\"$gt\": 0}}}",
  "{\"$or\": [{\"a\": 1}, {\"b\": 2.5}]}", "{\"b.c\": {\"$lt\": 6}}", "{\"a.1\": [2, 3]}", "{\"a.0.c\": 1}",
  "{\"_id\": {\"$gt\": 3}}", "{\"c\": {\"$exists\": false}}", "{\"a\": {\"$gte\": null}}", "{\"b\": {\"$mod\": [2, 1]}}",
};

static const char *prop_updates[] = {
  "{\"$set\": {\"a\": 2}}", "{\"$set\": {\"a.c\": 2}}", "{\"$set\": {\"a.1\": 9}}", "{\"$unset\": {\"a\": 1}}",
  "{\"$unset\": {\"a.0\": 1}}", "{\"$inc\": {\"b\": 1}}", "{\"$mul\": {\"z\": 2}}", "{\"$push\": {\"a\": 1}}",
  "{\"$addToSet\": {\"b\": {\"$each\": [1, 9]}}}", "{\"$pull\": {\"a\": {\"$gt\": 0}}}", "{\"$pop\": {\"b\": 1}}",
  "{\"$rename\": {\"a\": \"r\"}}", "{\"$min\": {\"b\": 0}}", "{\"$max\": {\"a\": \"zz\"}}", "{\"$currentDate\": {\"a.d\": true}}",
  "{\"$set\": {\"_id\": 1}}", "{\"x\": 1}",
};

static void test_properties(void **state) {
  size_t nd = sizeof prop_docs / sizeof prop_docs[0], nf = sizeof prop_filters / sizeof prop_filters[0];
  size_t nu = sizeof prop_updates / sizeof prop_updates[0];
  bson_t *docs[16], *filters[32];
  for (size_t i = 0; i < nd; i++) docs[i] = json(prop_docs[i]);
  for (size_t i = 0; i < nf; i++) filters[i] = json(prop_filters[i]);
  bson_t *asc = json("{\"a\": 1, \"b\": -1}");

  for (size_t d = 0; d < nd; d++) {
    /* matching: $nor negates, $and conjoins, $or disjoins */
    for (size_t f = 0; f < nf; f++) {
      int m = dm_match(docs[d], filters[f], NULL);
      assert_true(m == 0 || m == 1);
      bson_t nor = BSON_INITIALIZER, arr;
      bson_append_array_begin(&nor, "$nor", -1, &arr);
      bson_append_document(&arr, "0", -1, filters[f]);
      bson_append_array_end(&nor, &arr);
      if (dm_match(docs[d], &nor, NULL) != !m)
        fail_msg("$nor of %s on %s does not negate %d", prop_filters[f], prop_docs[d], m);
      bson_destroy(&nor);
      for (size_t g = 0; g < nf; g++) {
        int n = dm_match(docs[d], filters[g], NULL);
        const char *ops[2] = {"$and", "$or"};
        for (int o = 0; o < 2; o++) {
          bson_t both = BSON_INITIALIZER, list;
          bson_append_array_begin(&both, ops[o], -1, &list);
          bson_append_document(&list, "0", -1, filters[f]);
          bson_append_document(&list, "1", -1, filters[g]);
          bson_append_array_end(&both, &list);
          int want = o == 0 ? (m && n) : (m || n);
          if (dm_match(docs[d], &both, NULL) != want)
            fail_msg("%s of %s, %s on %s: want %d", ops[o], prop_filters[f], prop_filters[g], prop_docs[d], want);
          bson_destroy(&both);
        }
      }
    }
    /* updates keep _id and either succeed or fail with a code; the description of a
     * successful update is consistent with the result */
    for (size_t u = 0; u < nu; u++) {
      bson_t *update = json(prop_updates[u]), out = BSON_INITIALIZER, desc = BSON_INITIALIZER;
      bson_error_t error = {0};
      if (dm_update_apply(docs[d], update, false, &out, &desc, NOW_MS, &error)) {
        bson_value_t id_before, id_after;
        assert_true(dm_get_path(docs[d], "_id", &id_before));
        assert_true(dm_get_path(&out, "_id", &id_after));
        assert_int_equal(dm_value_compare(&id_before, &id_after), 0);
        bson_iter_t it, field;
        assert_true(bson_iter_init_find(&it, &desc, "updatedFields") && bson_iter_recurse(&it, &field));
        while (bson_iter_next(&field)) {
          bson_value_t now;
          if (!dm_get_path(&out, bson_iter_key(&field), &now) ||
              dm_value_compare(&now, bson_iter_value(&field)) != 0)
            fail_msg("%s on %s: updatedFields.%s disagrees with the result", prop_updates[u], prop_docs[d],
                     bson_iter_key(&field));
        }
        assert_true(bson_iter_init_find(&it, &desc, "removedFields") && bson_iter_recurse(&it, &field));
        while (bson_iter_next(&field)) {
          bson_value_t gone;
          if (dm_get_path(&out, bson_iter_utf8(&field, NULL), &gone))
            fail_msg("%s on %s: removed %s still present", prop_updates[u], prop_docs[d], bson_iter_utf8(&field, NULL));
        }
      } else {
        assert_true(error.code != 0);
        assert_true(bson_empty(&out));
      }
      bson_destroy(&out);
      bson_destroy(&desc);
      bson_destroy(update);
    }
    /* sort order is antisymmetric and reflexive */
    assert_int_equal(dm_sort_compare(docs[d], docs[d], asc), 0);
    for (size_t e = 0; e < nd; e++) {
      int x = dm_sort_compare(docs[d], docs[e], asc), y = dm_sort_compare(docs[e], docs[d], asc);
      if ((x > 0) - (x < 0) != -((y > 0) - (y < 0)))
        fail_msg("sort of %s vs %s not antisymmetric: %d %d", prop_docs[d], prop_docs[e], x, y);
    }
    /* excluding a field makes it missing; including it keeps it equal */
    bson_t *excl = json("{\"a\": 0}"), *incl = json("{\"a\": 1}"), ex = BSON_INITIALIZER, in = BSON_INITIALIZER;
    assert_true(dm_project(docs[d], excl, &ex, NULL));
    assert_true(dm_project(docs[d], incl, &in, NULL));
    bson_value_t v, w;
    assert_false(dm_get_path(&ex, "a", &v));
    if (dm_get_path(docs[d], "a", &v)) {
      assert_true(dm_get_path(&in, "a", &w));
      assert_int_equal(dm_value_compare(&v, &w), 0);
    }
    assert_int_equal(bson_count_keys(&in) + bson_count_keys(&ex), bson_count_keys(docs[d]) + 1);
    bson_destroy(&ex);
    bson_destroy(&in);
    bson_destroy(excl);
    bson_destroy(incl);
  }
  /* a $group total equals the per-document sum; $count equals the matching documents */
  for (size_t f = 0; f < nf; f++) {
    size_t want = 0;
    for (size_t d = 0; d < nd; d++) want += dm_match(docs[d], filters[f], NULL) == 1;
    bson_t pipeline = BSON_INITIALIZER, stage, **out = NULL;
    size_t nout = 0;
    BSON_APPEND_DOCUMENT_BEGIN(&pipeline, "0", &stage);
    BSON_APPEND_DOCUMENT(&stage, "$match", filters[f]);
    bson_append_document_end(&pipeline, &stage);
    BSON_APPEND_DOCUMENT_BEGIN(&pipeline, "1", &stage);
    BSON_APPEND_UTF8(&stage, "$count", "n");
    bson_append_document_end(&pipeline, &stage);
    assert_true(dm_aggregate(docs, nd, &pipeline, &out, &nout, NULL));
    if (want == 0) {
      assert_int_equal(nout, 0);
    } else {
      bson_value_t n;
      assert_int_equal(nout, 1);
      assert_true(dm_get_path(out[0], "n", &n));
      if ((size_t)n.value.v_int32 != want) fail_msg("$count of %s: got %d, want %zu", prop_filters[f], n.value.v_int32, want);
    }
    dm_docs_free(out, nout);
    bson_destroy(&pipeline);
  }
  bson_destroy(asc);
  for (size_t i = 0; i < nd; i++) bson_destroy(docs[i]);
  for (size_t i = 0; i < nf; i++) bson_destroy(filters[i]);
}

/* Malformed requests from clients end in an error with a code, never in a crash. */
static void test_malformed_inputs(void **state) {
  static const char *filters[] = {
    "{\"a\": {\"%regex\": 5}}", "{\"a\": {\"%options\": \"i\"}}", "{\"a\": {\"$elemMatch\": 5}}",
    "{\"a\": {\"$size\": -1}}", "{\"a\": {\"$all\": 5}}", "{\"a\": {\"$mod\": \"x\"}}",
    "{\"a\": {\"$mod\": [1]}}", "{\"a\": {\"%type\": []}}", "{\"a\": {\"%type\": {}}}", "{\"$and\": [5]}",
    "{\"$or\": [{}]}", "{\"\": 1}", "{\"a..b\": 1}", "{\"a\": {\"$not\": {}}}", "{\"a\": {\"%regex\": \"[\"}}",
    "{\"a\": {\"%regex\": \"x\", \"%options\": \"q\"}}", "{\"$expr\": {\"$bogus\": 1}}", "{\"$expr\": \"$a\"}",
    "{\"a\": {\"$exists\": {}}}", "{\"a\": {\"$in\": [[], {}, null]}}",
  };
  static const char *updates[] = {
    "{\"$push\": {\"a\": {\"$each\": [1], \"$slice\": \"x\"}}}", "{\"$push\": {\"a\": {\"$slice\": 1}}}",
    "{\"$push\": {\"a\": {\"$each\": [1], \"$sort\": 2}}}", "{\"$push\": {\"a\": {\"$each\": [1], \"$bad\": 1}}}",
    "{\"$pop\": {\"a\": \"x\"}}", "{\"$currentDate\": {\"a\": 5}}", "{\"$rename\": {\"a\": \"\"}}",
    "{\"$rename\": {\"a\": \"a.b\"}}", "{\"$rename\": {\"a\": \"a\"}}", "{\"$pullAll\": {\"a\": 1}}", "{\"$set\": {\"a.$\": 1}}",
    "{\"$set\": {\"a.\": 1}}", "{\"$inc\": {\"a\": {\"$numberDouble\": \"NaN\"}}}", "{\"$mul\": {\"a\": 1e308}}",
    "{\"$set\": {\"a.99999999\": 1}}", "{\"$unset\": 1}", "{\"$addToSet\": {\"a\": {\"$each\": {}}}}",
  };
  static const char *pipelines[] = {
    "{\"p\": [{\"$group\": {\"_id\": \"$$CURRENT\", \"x\": 5}}]}", "{\"p\": [{\"$unwind\": {}}]}", "{\"p\": [{\"$sort\": {}}]}",
    "{\"p\": [{\"$replaceRoot\": 5}]}", "{\"p\": [{\"$count\": \"\"}]}", "{\"p\": [{\"$skip\": \"x\"}]}",
    "{\"p\": [{\"$limit\": 1.5}]}", "{\"p\": [5]}", "{\"p\": [{}]}", "{\"p\": [{\"$project\": {\"a\": \"$$bad\"}}]}",
    "{\"p\": [{\"$addFields\": {\"x\": {\"$add\": 1, \"$sub\": 2}}}]}", "{\"p\": [{\"$unset\": [1]}]}",
    "{\"p\": [{\"$group\": {\"_id\": null, \"a.b\": {\"$sum\": 1}}}]}", "{\"p\": [{\"$match\": 5}]}",
    "{\"p\": [{\"$addFields\": {\"x\": {\"$cond\": {\"if\": true}}}}]}", "{\"p\": [{\"$addFields\": {\"x\": {\"$eq\": [1]}}}]}",
    "{\"p\": [{\"$unwind\": {\"path\": \"$a\", \"other\": 1}}]}", "{\"p\": [{\"$addFields\": {\"x\": {\"$divide\": [1, 0]}}}]}",
  };
  bson_t *doc = json("{\"_id\": 1, \"a\": [1, {\"b\": 2}], \"s\": \"x\"}");
  for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++) {
    bson_t *filter = json(filters[i]);
    bson_error_t error = {0};
    int m = dm_match(doc, filter, &error);
    if (m < -1 || m > 1 || (m == -1 && error.code == 0)) fail_msg("%s: got %d code %u", filters[i], m, error.code);
    bson_destroy(filter);
  }
  for (size_t i = 0; i < sizeof updates / sizeof updates[0]; i++) {
    bson_t *update = json(updates[i]), out = BSON_INITIALIZER;
    bson_error_t error = {0};
    if (!dm_update_apply(doc, update, false, &out, NULL, NOW_MS, &error) && error.code == 0)
      fail_msg("%s: failed without a code", updates[i]);
    bson_destroy(&out);
    bson_destroy(update);
  }
  for (size_t i = 0; i < sizeof pipelines / sizeof pipelines[0]; i++) {
    bson_t *pipeline_doc = json(pipelines[i]), pipeline, **out = NULL, *in[1] = {doc};
    bson_iter_t it;
    uint32_t len;
    const uint8_t *data;
    size_t nout = 0;
    bson_error_t error = {0};
    assert_true(bson_iter_init_find(&it, pipeline_doc, "p"));
    bson_iter_array(&it, &len, &data);
    bson_init_static(&pipeline, data, len);
    if (dm_aggregate(in, 1, &pipeline, &out, &nout, &error))
      dm_docs_free(out, nout);
    else if (error.code == 0)
      fail_msg("%s: failed without a code", pipelines[i]);
    bson_destroy(pipeline_doc);
  }
  bson_destroy(doc);
}

/* ---- path lengths ---- */

/* A dotted path of n components of len characters each ("aaa.bbb.ccc"). Owned. */
static char *make_path(size_t n, size_t len) {
  char *path = bson_malloc(n * (len + 1) + 1), *o = path;
  for (size_t i = 0; i < n; i++) {
    if (i) *o++ = '.';
    memset(o, 'a' + (int)(i % 26), len);
    o += len;
  }
  *o = '\0';
  return path;
}

/* {_id: 1, <p0>: {<p1>: ... {<pn-1>: leaf}}} for the dotted path. */
static bson_t *nested_doc(const char *path, const bson_value_t *leaf) {
  char *copy = bson_strdup(path), *save = NULL;
  const char *parts[256];
  size_t n = 0;
  for (char *t = strtok_r(copy, ".", &save); t && n < 256; t = strtok_r(NULL, ".", &save)) parts[n++] = t;
  bson_t *cur = bson_new();
  bson_append_value(cur, parts[n - 1], -1, leaf);
  for (size_t i = n - 1; i-- > 0;) {
    bson_t *outer = bson_new();
    bson_append_document(outer, parts[i], -1, cur);
    bson_destroy(cur);
    cur = outer;
  }
  bson_t *doc = bson_new();
  BSON_APPEND_INT32(doc, "_id", 1);
  bson_concat(doc, cur);
  bson_destroy(cur);
  bson_free(copy);
  return doc;
}

static bson_t *one_field(const char *key, const bson_value_t *v) {
  bson_t *b = bson_new();
  bson_append_value(b, key, -1, v);
  return b;
}

static bson_t *op_doc(const char *op, const char *key, const bson_value_t *v) {
  bson_t *inner = one_field(key, v), *b = bson_new();
  bson_append_document(b, op, -1, inner);
  bson_destroy(inner);
  return b;
}

static void expect_match(const char *what, const char *path, const bson_t *doc, const bson_t *filter,
                         int want) {
  bson_error_t error = {0};
  int got = dm_match(doc, filter, &error);
  if (got != want)
    fail_msg("%s on a %zu-character path: got %d (%s), want %d", what, strlen(path), got,
             error.message, want);
}

/* Every operation that splits a dotted path, across the sizes where the split changes strategy
 * (components and characters around the in-place limits, and far beyond them). */
static void test_path_lengths(void **state) {
  static const size_t counts[] = {1, 2, 7, 8, 9, 16, 64, 200};
  static const size_t lens[] = {1, 13, 14, 15, 16, 59, 60, 118, 119, 120, 121, 300};
  bson_value_t seven = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 7};
  bson_value_t eight = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 8};
  bson_value_t one = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 1};
  bson_value_t empty = {.value_type = BSON_TYPE_UTF8, .value.v_utf8 = {"", 0}};
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      char *path = make_path(counts[ci], lens[li]);
      bson_t *doc = nested_doc(path, &seven), *other = nested_doc(path, &eight);
      bson_t *eq7 = one_field(path, &seven), *eq8 = one_field(path, &eight);
      bson_error_t error = {0};
      bson_value_t v;

      expect_match("equality", path, doc, eq7, 1);
      expect_match("inequality", path, doc, eq8, 0);
      assert_true(dm_get_path(doc, path, &v));
      assert_int_equal(v.value.v_int32, 7);

      bson_t *inc = op_doc("$inc", path, &one), out = BSON_INITIALIZER;
      if (!dm_update_apply(doc, inc, false, &out, NULL, NOW_MS, &error))
        fail_msg("$inc on a %zu-character path: %s", strlen(path), error.message);
      expect_match("$inc result", path, &out, eq8, 1);
      bson_destroy(&out);
      bson_destroy(inc);

      bson_t *unset = op_doc("$unset", path, &empty);
      bson_init(&out);
      assert_true(dm_update_apply(doc, unset, false, &out, NULL, NOW_MS, &error));
      expect_match("$unset result", path, &out, eq7, 0);
      bson_destroy(&out);
      bson_destroy(unset);

      bson_init(&out);
      assert_true(dm_upsert_seed(eq7, &out, &error));
      expect_match("upsert seed", path, &out, eq7, 1);
      bson_destroy(&out);

      bson_t *sort = one_field(path, &one);
      assert_true(dm_sort_compare(doc, other, sort) < 0);
      bson_init(&out);
      if (!dm_project(doc, sort, &out, &error))
        fail_msg("projection of a %zu-character path: %s", strlen(path), error.message);
      expect_match("projection", path, &out, eq7, 1);
      bson_destroy(&out);
      bson_destroy(sort);

      /* aggregation: $match, a "$path" expression and $unwind over the same path */
      char *ref = bson_strdup_printf("$%s", path);
      bson_t *pipeline = BCON_NEW("0", "{", "$match", BCON_DOCUMENT(eq7), "}",
                                  "1", "{", "$addFields", "{", "copy", BCON_UTF8(ref), "}", "}",
                                  "2", "{", "$unwind", "{", "path", BCON_UTF8(ref),
                                  "includeArrayIndex", BCON_UTF8(path), "}", "}");
      bson_t *in[1] = {doc}, **res = NULL;
      size_t nres = 0;
      if (!dm_aggregate(in, 1, pipeline, &res, &nres, &error))
        fail_msg("pipeline over a %zu-character path: %s", strlen(path), error.message);
      assert_int_equal(nres, 1);
      bson_iter_t it;
      assert_true(bson_iter_init_find(&it, res[0], "copy"));
      assert_int_equal(bson_iter_as_int64(&it), 7);
      dm_docs_free(res, nres);
      bson_destroy(pipeline);
      bson_free(ref);

      bson_destroy(eq7);
      bson_destroy(eq8);
      bson_destroy(doc);
      bson_destroy(other);
      bson_free(path);
    }
  }
}

/* Empty components are refused (code 2) wherever a path is split, short or long. */
static void test_path_empty_components(void **state) {
  char *long_part = make_path(1, 300), *many = make_path(40, 3);
  char *paths[] = {
    bson_strdup(""), bson_strdup("."), bson_strdup("a."), bson_strdup(".a"), bson_strdup("a..b"),
    bson_strdup_printf("%s.", long_part), bson_strdup_printf(".%s", long_part),
    bson_strdup_printf("%s..%s", long_part, long_part), bson_strdup_printf("%s..x", many),
    bson_strdup_printf("%s.", many),
  };
  bson_value_t one = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 1};
  bson_t *doc = json("{\"_id\": 1, \"a\": {\"b\": 1}}");
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    bson_t *filter = one_field(paths[i], &one), *set = op_doc("$set", paths[i], &one);
    bson_t out = BSON_INITIALIZER;
    bson_error_t error = {0};
    int m = dm_match(doc, filter, &error);
    if (m != -1 || error.code != 2)
      fail_msg("filter on '%.20s...' (%zu chars): got %d code %u, want -1 code 2", paths[i],
               strlen(paths[i]), m, error.code);
    memset(&error, 0, sizeof error);
    if (dm_update_apply(doc, set, false, &out, NULL, NOW_MS, &error) || error.code == 0)
      fail_msg("$set of '%.20s...' (%zu chars): accepted or no code", paths[i], strlen(paths[i]));
    bson_destroy(&out);
    bson_init(&out);
    memset(&error, 0, sizeof error);
    if (dm_project(doc, filter, &out, &error) || error.code == 0)
      fail_msg("projection of '%.20s...' (%zu chars): accepted or no code", paths[i], strlen(paths[i]));
    bson_destroy(&out);
    bson_destroy(filter);
    bson_destroy(set);
    bson_free(paths[i]);
  }
  bson_destroy(doc);
  bson_free(long_part);
  bson_free(many);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_value_compare), cmocka_unit_test(test_get_path),
    cmocka_unit_test(test_match),         cmocka_unit_test(test_match_errors),
    cmocka_unit_test(test_update),        cmocka_unit_test(test_update_errors),
    cmocka_unit_test(test_is_replacement), cmocka_unit_test(test_upsert_seed),
    cmocka_unit_test(test_sort),          cmocka_unit_test(test_project),
    cmocka_unit_test(test_project_errors), cmocka_unit_test(test_aggregate),
    cmocka_unit_test(test_expressions),   cmocka_unit_test(test_aggregate_errors),
    cmocka_unit_test(test_properties),    cmocka_unit_test(test_malformed_inputs),
    cmocka_unit_test(test_path_lengths),  cmocka_unit_test(test_path_empty_components),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
