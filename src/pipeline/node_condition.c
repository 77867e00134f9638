/* node_condition.c - branches on a value of the context
 *
 * DESIGN: config { path, operator, value }. `path` is a context path (like a template's,
 * without braces; "steps.<node>.output..." reads earlier outputs); `value` may be templated.
 * Operators: eq, ne, gt, gte, lt, lte (numbers compare as numbers, strings bytewise),
 * exists, notExists, contains (substring, or array element), in (value is an array).
 * Outcome "true" or "false". A missing path compares as absent: eq/gt/... are false, ne and
 * notExists true. Ordering two values of different kinds is a terminal error. */
#include "pipeline_int.h"

#include <string.h>

static const char *const condition_outcomes[] = {"true", "false", NULL};
static const char *const operators[] = {"eq", "ne", "gt", "gte", "lt", "lte", "exists", "notExists", "contains", "in",
                                        NULL};

static bool needs_value(const char *op) { return strcmp(op, "exists") != 0 && strcmp(op, "notExists") != 0; }

static bool condition_validate(const bson_t *config, obx_err_t *err) {
  if (!obx_node_config_require_str(config, "path", err) || !obx_node_config_require_str(config, "operator", err))
    return false;
  const char *path = obx_node_config_str(config, "path");
  if (strstr(path, "{{")) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.path: a plain path (\"order.totalAmount\"), no braces");
    return false;
  }
  const char *op = obx_node_config_str(config, "operator");
  const char *const *o = operators;
  while (*o && strcmp(*o, op) != 0) o++;
  if (!*o) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false,
                "config.operator: \"%s\" (want eq, ne, gt, gte, lt, lte, exists, notExists, contains, in)", op);
    return false;
  }
  bson_iter_t it;
  if (needs_value(op) && !bson_iter_init_find(&it, config, "value")) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.value: required by operator \"%s\"", op);
    return false;
  }
  if (strcmp(op, "in") == 0 && !BSON_ITER_HOLDS_ARRAY(&it) && !BSON_ITER_HOLDS_UTF8(&it)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.value: operator \"in\" needs an array");
    return false;
  }
  return true;
}

static const char *kind(const bson_iter_t *it) {
  double d;
  if (obx_json_number(it, &d)) return "number";
  switch (bson_iter_type(it)) {
  case BSON_TYPE_UTF8: return "string";
  case BSON_TYPE_BOOL: return "boolean";
  case BSON_TYPE_DOCUMENT: return "object";
  case BSON_TYPE_ARRAY: return "array";
  case BSON_TYPE_NULL: return "null";
  default: return "value";
  }
}

/* <0, 0, >0; false when the two values cannot be ordered. */
static bool compare(const bson_iter_t *a, const bson_iter_t *b, int *cmp) {
  double x, y;
  if (obx_json_number(a, &x) && obx_json_number(b, &y)) {
    *cmp = x < y ? -1 : x > y;
    return true;
  }
  if (BSON_ITER_HOLDS_UTF8(a) && BSON_ITER_HOLDS_UTF8(b)) {
    *cmp = strcmp(bson_iter_utf8(a, NULL), bson_iter_utf8(b, NULL));
    return true;
  }
  if (BSON_ITER_HOLDS_BOOL(a) && BSON_ITER_HOLDS_BOOL(b)) {
    *cmp = (int)bson_iter_bool(a) - (int)bson_iter_bool(b);
    return true;
  }
  return false;
}

static bool equal(const bson_iter_t *a, const bson_iter_t *b) {
  int cmp;
  if (compare(a, b, &cmp)) return cmp == 0;
  bson_string_t *x = bson_string_new(NULL), *y = bson_string_new(NULL);
  obx_json_append_value(x, a);
  obx_json_append_value(y, b);
  bool eq = strcmp(x->str, y->str) == 0;
  bson_string_free(x, true);
  bson_string_free(y, true);
  return eq;
}

static bool array_has(const bson_iter_t *array, const bson_iter_t *needle) {
  bson_iter_t el;
  if (!BSON_ITER_HOLDS_ARRAY(array) || !bson_iter_recurse(array, &el)) return false;
  while (bson_iter_next(&el))
    if (equal(&el, needle)) return true;
  return false;
}

static bool condition_run(obx_node_ctx_t *ctx, const bson_t *config, bson_t *output, const char **outcome,
                          obx_err_t *err) {
  const char *path = obx_node_config_str(config, "path");
  const char *op = obx_node_config_str(config, "operator");
  bson_iter_t actual, value;
  bool found = obx_template_lookup(ctx->input->context, ctx->steps, path, &actual);
  bool has_value = bson_iter_init_find(&value, config, "value");
  bool result = false;
  int cmp = 0;
  if (strcmp(op, "exists") == 0 || strcmp(op, "notExists") == 0) {
    result = found == (op[0] == 'e');
  } else if (!found || !has_value) {
    result = strcmp(op, "ne") == 0;
  } else if (strcmp(op, "eq") == 0 || strcmp(op, "ne") == 0) {
    result = equal(&actual, &value) == (op[0] == 'e');
  } else if (strcmp(op, "contains") == 0) {
    if (BSON_ITER_HOLDS_UTF8(&actual) && BSON_ITER_HOLDS_UTF8(&value))
      result = strstr(bson_iter_utf8(&actual, NULL), bson_iter_utf8(&value, NULL)) != NULL;
    else
      result = array_has(&actual, &value);
  } else if (strcmp(op, "in") == 0) {
    if (!BSON_ITER_HOLDS_ARRAY(&value)) {
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.value: operator \"in\" needs an array");
      return false;
    }
    result = array_has(&value, &actual);
  } else {
    if (!compare(&actual, &value, &cmp)) {
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "operator \"%s\": cannot order %s (%s) against config.value (%s)",
                  op, path, kind(&actual), kind(&value));
      return false;
    }
    if (strcmp(op, "gt") == 0) result = cmp > 0;
    else if (strcmp(op, "gte") == 0) result = cmp >= 0;
    else if (strcmp(op, "lt") == 0) result = cmp < 0;
    else result = cmp <= 0;
  }
  BSON_APPEND_BOOL(output, "result", result);
  if (found) bson_append_iter(output, "actual", -1, &actual);
  *outcome = result ? "true" : "false";
  return true;
}

const obx_node_type_t obx_node_condition = {"condition", condition_outcomes, condition_validate, condition_run};
