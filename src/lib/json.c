/* json.c - JSON at the edges: the strict body parser and the renderer that cannot fail
 *
 * DESIGN: see obx_json.h. Rendering tries libbson first when the document holds no date (the
 * common case costs one walk extra); otherwise, or when libbson fails, a view of the document
 * is built (dates as RFC 3339 strings, keys and string values — UTF-8, code, symbol — with
 * invalid bytes replaced, every other value copied as is) and rendered. Never writes anywhere
 * but its outputs. */
#include "obx/obx_json.h"
#include "obx/obx_event.h" /* obx_time_format_rfc3339 */

#include <ctype.h>
#include <string.h>

bool obx_json_parse(const char *json, size_t len, bson_t *out, obx_err_t *err) {
  bson_init(out);
  size_t start = 0;
  while (start < len && isspace((unsigned char)json[start])) start++;
  if (start == len) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "the body is empty (want a JSON object)");
    return false;
  }
  if (json[start] != '{') {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "want a JSON object");
    return false;
  }
  bson_json_reader_t *reader = bson_json_data_reader_new(true, len);
  bson_json_data_reader_ingest(reader, (const uint8_t *)json, len);
  bson_error_t berr = {0};
  bson_t extra = BSON_INITIALIZER;
  bool ok = false;
  if (bson_json_reader_read(reader, out, &berr) != 1) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "not valid JSON: %s", berr.message);
  } else if (bson_json_reader_read(reader, &extra, &berr) != 0) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "data after the JSON object (one object per body)");
  } else {
    ok = true;
  }
  bson_destroy(&extra);
  bson_json_reader_destroy(reader);
  if (!ok) bson_reinit(out);
  return ok;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 when there is none (overlong
 * forms, surrogates and code points above U+10FFFF are invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  unsigned cp, min;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
  else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

char *obx_json_utf8_repair(const char *s, size_t len, size_t *out_len, int *replaced) {
  const unsigned char *p = (const unsigned char *)s;
  char *out = bson_malloc(3 * len + 1); /* each byte becomes at most the 3 of U+FFFD */
  size_t n = 0;
  int bad = 0;
  for (size_t i = 0; i < len;) {
    size_t seq = utf8_seq(p + i, len - i);
    if (!seq) {
      memcpy(out + n, "\xef\xbf\xbd", 3);
      n += 3;
      bad++;
      i++;
      continue;
    }
    memcpy(out + n, s + i, seq);
    n += seq;
    i += seq;
  }
  out[n] = '\0';
  *out_len = n;
  if (replaced) *replaced = bad;
  return out;
}

/* The repaired copy of one string (owned), its length in *len; adds to *replaced. */
static char *repaired(const char *s, size_t slen, size_t *len, int *replaced) {
  int bad;
  char *out = obx_json_utf8_repair(s, slen, len, &bad);
  *replaced += bad;
  return out;
}

static bool view_doc(const bson_t *doc, bson_t *out, int *replaced);

static bool view_value(bson_iter_t *it, bson_t *out, int *replaced) {
  size_t klen;
  char *key = repaired(bson_iter_key(it), strlen(bson_iter_key(it)), &klen, replaced);
  bool ok = true;
  switch (bson_iter_type(it)) {
  case BSON_TYPE_UTF8:
  case BSON_TYPE_CODE:
  case BSON_TYPE_SYMBOL: {
    uint32_t len;
    const char *s = BSON_ITER_HOLDS_UTF8(it) ? bson_iter_utf8(it, &len)
                    : BSON_ITER_HOLDS_CODE(it) ? bson_iter_code(it, &len) : bson_iter_symbol(it, &len);
    size_t vlen;
    char *v = repaired(s, len, &vlen, replaced);
    ok = bson_append_utf8(out, key, (int)klen, v, (int)vlen);
    bson_free(v);
    break;
  }
  case BSON_TYPE_DOCUMENT:
  case BSON_TYPE_ARRAY: {
    const uint8_t *data;
    uint32_t len;
    bson_t sub, child;
    bool is_doc = BSON_ITER_HOLDS_DOCUMENT(it);
    if (is_doc) bson_iter_document(it, &len, &data);
    else bson_iter_array(it, &len, &data);
    ok = bson_init_static(&sub, data, len);
    if (ok) {
      ok = is_doc ? bson_append_document_begin(out, key, (int)klen, &child)
                  : bson_append_array_begin(out, key, (int)klen, &child);
      ok = ok && view_doc(&sub, &child, replaced);
      ok = (is_doc ? bson_append_document_end(out, &child) : bson_append_array_end(out, &child)) && ok;
    }
    break;
  }
  case BSON_TYPE_DATE_TIME: {
    char ts[32];
    obx_time_format_rfc3339(bson_iter_date_time(it), ts);
    ok = bson_append_utf8(out, key, (int)klen, ts, -1);
    break;
  }
  default: ok = bson_append_iter(out, key, (int)klen, it);
  }
  bson_free(key);
  return ok;
}

static bool view_doc(const bson_t *doc, bson_t *out, int *replaced) {
  bson_iter_t it;
  if (!bson_iter_init(&it, doc)) return false;
  while (bson_iter_next(&it))
    if (!view_value(&it, out, replaced)) return false;
  return true;
}

/* Whether doc holds a date at any depth (it walks a structurally valid document). */
static bool holds_date(bson_iter_t *it) {
  while (bson_iter_next(it)) {
    bson_iter_t sub;
    if (BSON_ITER_HOLDS_DATE_TIME(it)) return true;
    if ((BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) && bson_iter_recurse(it, &sub) && holds_date(&sub))
      return true;
  }
  return false;
}

char *obx_json_render(const bson_t *doc, size_t *len, int *replaced) {
  int fixed = 0;
  size_t n = 0, offset;
  /* libbson renders a document it cannot walk as "{ }": check the structure first */
  bool valid = bson_validate(doc, BSON_VALIDATE_NONE, &offset);
  bson_iter_t it;
  bool dates = valid && bson_iter_init(&it, doc) && holds_date(&it);
  char *json = valid && !dates ? bson_as_relaxed_extended_json(doc, &n) : NULL;
  if (!json && valid) {
    bson_t copy = BSON_INITIALIZER;
    if (view_doc(doc, &copy, &fixed)) json = bson_as_relaxed_extended_json(&copy, &n);
    bson_destroy(&copy);
  }
  if (!json) {
    json = bson_strdup("{ \"error\" : \"not a valid BSON document\" }");
    n = strlen(json);
  }
  if (len) *len = n;
  if (replaced) *replaced = fixed;
  return json;
}
