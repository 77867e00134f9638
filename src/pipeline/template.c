/* template.c - {{path}} templates in node configs
 *
 * DESIGN: a template is "{{" path "}}" with optional blanks inside the braces; a path is
 * dotted segments of letters, digits, '_', '-' and '$' (array elements by index: items.0.sku).
 * A string that is exactly one template is replaced by the value with its BSON type (a
 * number stays a number, an object an object); templates embedded in text are interpolated
 * as text (obx_json_append_text). Paths starting with "steps." read the outputs of nodes
 * already run; all others read the caller's context. Errors name the field
 * ("config.body.number") and the path; a missing path is terminal. */
#include "pipeline_int.h"

#include <ctype.h>
#include <string.h>

typedef struct {
  const char *start; /* of "{{" */
  const char *end;   /* one past "}}" */
  char path[256];
} tmpl_ref_t;

static bool path_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '$' || c == '.'; }

/* Finds the next template at or after s. Returns 0 none, 1 found, -1 syntax error (msg set). */
static int next_ref(const char *s, tmpl_ref_t *ref, char *msg, size_t msglen) {
  const char *open = strstr(s, "{{");
  const char *close = strstr(s, "}}");
  if (close && (!open || close < open)) {
    snprintf(msg, msglen, "\"}}\" without \"{{\"");
    return -1;
  }
  if (!open) return 0;
  const char *p = open + 2;
  while (*p == ' ') p++;
  const char *pstart = p;
  while (*p && path_char(*p)) p++;
  const char *pend = p;
  while (*p == ' ') p++;
  if (strncmp(p, "}}", 2) != 0) {
    if (!*p || !strstr(p, "}}"))
      snprintf(msg, msglen, "unclosed \"{{\"");
    else
      snprintf(msg, msglen, "bad character '%c' in template path", *p);
    return -1;
  }
  size_t n = (size_t)(pend - pstart);
  if (n == 0) {
    snprintf(msg, msglen, "empty template path");
    return -1;
  }
  if (n >= sizeof ref->path) {
    snprintf(msg, msglen, "template path longer than %zu characters", sizeof ref->path - 1);
    return -1;
  }
  if (pstart[0] == '.' || pend[-1] == '.' || memmem(pstart, n, "..", 2)) {
    snprintf(msg, msglen, "bad template path \"%.*s\"", (int)n, pstart);
    return -1;
  }
  memcpy(ref->path, pstart, n);
  ref->path[n] = '\0';
  ref->start = open;
  ref->end = p + 2;
  return 1;
}

static bool check_string(const char *s, const char *field, obx_err_t *err) {
  tmpl_ref_t ref;
  char msg[160];
  int r;
  while ((r = next_ref(s, &ref, msg, sizeof msg)) == 1) s = ref.end;
  if (r < 0) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "%s: bad template: %s", field, msg);
    return false;
  }
  return true;
}

static void join_field(char *out, size_t outlen, const char *prefix, const char *key) {
  snprintf(out, outlen, "%s%s%s", prefix, prefix[0] ? "." : "", key);
}

static bool check_iter(bson_iter_t *it, const char *prefix, obx_err_t *err) {
  while (bson_iter_next(it)) {
    char field[256];
    join_field(field, sizeof field, prefix, bson_iter_key(it));
    if (BSON_ITER_HOLDS_UTF8(it)) {
      if (!check_string(bson_iter_utf8(it, NULL), field, err)) return false;
    } else if (BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) {
      bson_iter_t child;
      if (bson_iter_recurse(it, &child) && !check_iter(&child, field, err)) return false;
    }
  }
  return true;
}

bool obx_template_check_doc(const bson_t *doc, obx_err_t *err) {
  bson_iter_t it;
  if (!bson_iter_init(&it, doc)) return true;
  return check_iter(&it, "config", err);
}

bool obx_template_lookup(const bson_t *context, const bson_t *steps, const char *path, bson_iter_t *value) {
  bson_iter_t it;
  const bson_t *doc = context;
  if (steps && strncmp(path, "steps.", 6) == 0) {
    doc = steps;
    path += 6;
  }
  if (!doc || !bson_iter_init(&it, doc)) return false;
  return bson_iter_find_descendant(&it, path, value);
}

typedef struct {
  const bson_t *context, *steps;
  obx_err_t *err;
} render_t;

static bool missing(render_t *r, const char *field, const char *path) {
  obx_err_set(r->err, OBX_ERR_PIPELINE, 0, false, "%s: template {{%s}}: path \"%s\" not found in the context", field,
              path, path);
  return false;
}

/* Appends the rendered form of string s under key to out. */
static bool render_string(render_t *r, const char *s, const char *key, bson_t *out, const char *field) {
  tmpl_ref_t ref;
  char msg[160];
  int found = next_ref(s, &ref, msg, sizeof msg);
  if (found < 0) {
    obx_err_set(r->err, OBX_ERR_PIPELINE, 0, false, "%s: bad template: %s", field, msg);
    return false;
  }
  if (found == 0) {
    bson_append_utf8(out, key, -1, s, -1);
    return true;
  }
  bson_iter_t value;
  if (ref.start == s && *ref.end == '\0') { /* whole value: keep the type */
    if (!obx_template_lookup(r->context, r->steps, ref.path, &value)) return missing(r, field, ref.path);
    bson_append_iter(out, key, -1, &value);
    return true;
  }
  bson_string_t *text = bson_string_new(NULL);
  const char *p = s;
  bool ok = true;
  while (found == 1) {
    bson_string_append_printf(text, "%.*s", (int)(ref.start - p), p);
    if (!obx_template_lookup(r->context, r->steps, ref.path, &value)) {
      ok = missing(r, field, ref.path);
      goto done;
    }
    obx_json_append_text(text, &value);
    p = ref.end;
    found = next_ref(p, &ref, msg, sizeof msg);
  }
  if (found < 0) {
    obx_err_set(r->err, OBX_ERR_PIPELINE, 0, false, "%s: bad template: %s", field, msg);
    ok = false;
    goto done;
  }
  bson_string_append(text, p);
  bson_append_utf8(out, key, -1, text->str, (int)text->len);
done:
  bson_string_free(text, true);
  return ok;
}

static bool render_iter(render_t *r, bson_iter_t *it, bson_t *out, const char *prefix) {
  while (bson_iter_next(it)) {
    const char *key = bson_iter_key(it);
    char field[256];
    join_field(field, sizeof field, prefix, key);
    if (BSON_ITER_HOLDS_UTF8(it)) {
      if (!render_string(r, bson_iter_utf8(it, NULL), key, out, field)) return false;
    } else if (BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) {
      bool sub_array = BSON_ITER_HOLDS_ARRAY(it);
      bson_iter_t child;
      bson_t sub;
      if (!bson_iter_recurse(it, &child)) continue;
      if (sub_array)
        bson_append_array_begin(out, key, -1, &sub);
      else
        bson_append_document_begin(out, key, -1, &sub);
      bool ok = render_iter(r, &child, &sub, field);
      if (sub_array)
        bson_append_array_end(out, &sub);
      else
        bson_append_document_end(out, &sub);
      if (!ok) return false;
    } else {
      bson_append_iter(out, key, -1, it);
    }
  }
  return true;
}

bool obx_template_render_doc(const bson_t *in, const bson_t *context, const bson_t *steps, bson_t *out,
                             obx_err_t *err) {
  render_t r = {context, steps, err};
  bson_iter_t it;
  if (!bson_iter_init(&it, in)) return true;
  return render_iter(&r, &it, out, "config");
}
