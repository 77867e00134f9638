/* json.c - BSON values as plain JSON for HTTP bodies, step outputs and interpolation
 *
 * DESIGN: libbson's extended JSON writes Decimal128 as {"$numberDecimal": ...} and dates as
 * {"$date": ...}; external systems called by http-request nodes expect plain JSON, so values
 * are written here: Decimal128 as a number literal, dates as RFC 3339 strings, ObjectIds as
 * hex strings; types with no JSON meaning (binary, regex, ...) as null; string bytes that are
 * not valid UTF-8 as U+FFFD (obx_json_utf8_repair). Pure functions. */
#include "pipeline_int.h"

#include "obx/obx_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A JSON string literal of s[0..len); bytes that are not valid UTF-8 become U+FFFD. */
static void append_string(bson_string_t *out, const char *s, size_t len) {
  char *fixed = NULL;
  if (!bson_utf8_validate(s, len, true)) s = fixed = obx_json_utf8_repair(s, len, &len, NULL);
  bson_string_append_c(out, '"');
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
    case '"': bson_string_append(out, "\\\""); break;
    case '\\': bson_string_append(out, "\\\\"); break;
    case '\n': bson_string_append(out, "\\n"); break;
    case '\r': bson_string_append(out, "\\r"); break;
    case '\t': bson_string_append(out, "\\t"); break;
    default:
      if (c < 0x20)
        bson_string_append_printf(out, "\\u%04x", c);
      else
        bson_string_append_c(out, (char)c);
    }
  }
  bson_string_append_c(out, '"');
  bson_free(fixed);
}

static void append_double(bson_string_t *out, double d) {
  if (!isfinite(d)) {
    bson_string_append(out, "null");
    return;
  }
  char buf[40];
  snprintf(buf, sizeof buf, "%.15g", d);
  if (strtod(buf, NULL) != d) snprintf(buf, sizeof buf, "%.17g", d);
  bson_string_append(out, buf);
}

bool obx_json_number(const bson_iter_t *iter, double *out) {
  switch (bson_iter_type(iter)) {
  case BSON_TYPE_INT32: *out = bson_iter_int32(iter); return true;
  case BSON_TYPE_INT64: *out = (double)bson_iter_int64(iter); return true;
  case BSON_TYPE_DOUBLE: *out = bson_iter_double(iter); return true;
  case BSON_TYPE_DECIMAL128: {
    bson_decimal128_t dec;
    char buf[BSON_DECIMAL128_STRING];
    bson_iter_decimal128(iter, &dec);
    bson_decimal128_to_string(&dec, buf);
    char *end;
    *out = strtod(buf, &end);
    return *end == '\0';
  }
  default: return false;
  }
}

void obx_json_append_value(bson_string_t *out, const bson_iter_t *iter) {
  switch (bson_iter_type(iter)) {
  case BSON_TYPE_UTF8: {
    uint32_t len;
    const char *s = bson_iter_utf8(iter, &len);
    append_string(out, s, len);
    break;
  }
  case BSON_TYPE_INT32: bson_string_append_printf(out, "%d", bson_iter_int32(iter)); break;
  case BSON_TYPE_INT64: bson_string_append_printf(out, "%lld", (long long)bson_iter_int64(iter)); break;
  case BSON_TYPE_DOUBLE: append_double(out, bson_iter_double(iter)); break;
  case BSON_TYPE_DECIMAL128: {
    bson_decimal128_t dec;
    char buf[BSON_DECIMAL128_STRING];
    bson_iter_decimal128(iter, &dec);
    bson_decimal128_to_string(&dec, buf);
    double d;
    /* NaN and Infinity have no JSON number form */
    if (obx_json_number(iter, &d) && isfinite(d))
      bson_string_append(out, buf);
    else
      bson_string_append(out, "null");
    break;
  }
  case BSON_TYPE_BOOL: bson_string_append(out, bson_iter_bool(iter) ? "true" : "false"); break;
  case BSON_TYPE_DATE_TIME: {
    char ts[32];
    obx_time_format_rfc3339(bson_iter_date_time(iter), ts);
    append_string(out, ts, strlen(ts));
    break;
  }
  case BSON_TYPE_OID: {
    char hex[25];
    bson_oid_to_string(bson_iter_oid(iter), hex);
    append_string(out, hex, 24);
    break;
  }
  case BSON_TYPE_DOCUMENT:
  case BSON_TYPE_ARRAY: {
    const uint8_t *data;
    uint32_t len;
    bson_t sub;
    if (BSON_ITER_HOLDS_DOCUMENT(iter))
      bson_iter_document(iter, &len, &data);
    else
      bson_iter_array(iter, &len, &data);
    if (bson_init_static(&sub, data, len))
      obx_json_append_doc(out, &sub, BSON_ITER_HOLDS_ARRAY(iter));
    else
      bson_string_append(out, "null");
    break;
  }
  default: bson_string_append(out, "null"); break;
  }
}

void obx_json_append_doc(bson_string_t *out, const bson_t *doc, bool array) {
  bson_iter_t it;
  bool first = true;
  bson_string_append_c(out, array ? '[' : '{');
  if (bson_iter_init(&it, doc)) {
    while (bson_iter_next(&it)) {
      if (!first) bson_string_append_c(out, ',');
      first = false;
      if (!array) {
        const char *key = bson_iter_key(&it);
        append_string(out, key, strlen(key));
        bson_string_append_c(out, ':');
      }
      obx_json_append_value(out, &it);
    }
  }
  bson_string_append_c(out, array ? ']' : '}');
}

void obx_json_append_text(bson_string_t *out, const bson_iter_t *iter) {
  if (BSON_ITER_HOLDS_UTF8(iter)) {
    bson_string_append(out, bson_iter_utf8(iter, NULL));
    return;
  }
  if (BSON_ITER_HOLDS_DATE_TIME(iter)) {
    char ts[32];
    obx_time_format_rfc3339(bson_iter_date_time(iter), ts);
    bson_string_append(out, ts);
    return;
  }
  if (BSON_ITER_HOLDS_OID(iter)) {
    char hex[25];
    bson_oid_to_string(bson_iter_oid(iter), hex);
    bson_string_append(out, hex);
    return;
  }
  obx_json_append_value(out, iter);
}
