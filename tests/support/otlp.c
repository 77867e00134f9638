/* otlp.c - the stub OTLP/HTTP JSON collector of the tests (obx_test_otlp.h)
 *
 * DESIGN: owns one obx_test_httpd; parsing happens in the test's thread on demand, from the
 * captured request bodies, so the server threads only store requests. */
#include "obx_test_otlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test.h"
#include "obx_test_httpd.h"

struct obx_test_otlp {
  obx_test_httpd_t *httpd;
  char endpoint[64];
};

obx_test_otlp_t *obx_test_otlp_start(void) {
  obx_test_otlp_t *otlp = calloc(1, sizeof *otlp);
  if (!otlp || !(otlp->httpd = obx_test_httpd_start())) {
    free(otlp);
    return NULL;
  }
  obx_test_httpd_route_t r = {.path = "/v1/traces", .status = 200, .body = "{}"};
  obx_test_httpd_route(otlp->httpd, &r);
  snprintf(otlp->endpoint, sizeof otlp->endpoint, "http://127.0.0.1:%d", obx_test_httpd_port(otlp->httpd));
  return otlp;
}

void obx_test_otlp_stop(obx_test_otlp_t *otlp) {
  if (!otlp) return;
  obx_test_httpd_stop(otlp->httpd);
  free(otlp);
}

const char *obx_test_otlp_endpoint(const obx_test_otlp_t *otlp) { return otlp->endpoint; }

int obx_test_otlp_requests(obx_test_otlp_t *otlp) { return obx_test_httpd_nrequests(otlp->httpd); }

/* Copies the string at dotted path `path` below it (a document iterator's current element). */
static void copy_str(const bson_iter_t *it, const char *path, char *out, size_t outlen) {
  bson_iter_t child, found;
  out[0] = '\0';
  if ((BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) && bson_iter_recurse(it, &child) &&
      bson_iter_find_descendant(&child, path, &found) && BSON_ITER_HOLDS_UTF8(&found))
    snprintf(out, outlen, "%s", bson_iter_utf8(&found, NULL));
}

static int64_t get_int(const bson_iter_t *it, const char *path) {
  bson_iter_t child, found;
  if (bson_iter_recurse(it, &child) && bson_iter_find_descendant(&child, path, &found) && BSON_ITER_HOLDS_NUMBER(&found))
    return bson_iter_as_int64(&found);
  return 0;
}

/* Appends the attributes array at `it` (OTLP KeyValue list) to out as key -> text. */
static void read_attrs(bson_iter_t *arr, bson_t *out, const char *only_key, char *only_out, size_t only_len) {
  while (bson_iter_next(arr)) {
    char key[128], value[512];
    copy_str(arr, "key", key, sizeof key);
    bson_iter_t kv, v;
    value[0] = '\0';
    if (bson_iter_recurse(arr, &kv) && bson_iter_find_descendant(&kv, "value", &v) && bson_iter_recurse(&v, &kv) &&
        bson_iter_next(&kv)) {
      if (BSON_ITER_HOLDS_UTF8(&kv)) snprintf(value, sizeof value, "%s", bson_iter_utf8(&kv, NULL));
      else if (BSON_ITER_HOLDS_BOOL(&kv)) snprintf(value, sizeof value, "%s", bson_iter_bool(&kv) ? "true" : "false");
      else if (BSON_ITER_HOLDS_NUMBER(&kv)) snprintf(value, sizeof value, "%lld", (long long)bson_iter_as_int64(&kv));
    }
    if (out) BSON_APPEND_UTF8(out, key, value);
    if (only_key && strcmp(key, only_key) == 0) snprintf(only_out, only_len, "%s", value);
  }
}

static void add_span(obx_test_spans_t *out, bson_iter_t *s, const char *service) {
  out->v = realloc(out->v, (size_t)(out->n + 1) * sizeof *out->v);
  obx_test_span_t *span = &out->v[out->n++];
  memset(span, 0, sizeof *span);
  span->attrs = bson_new();
  snprintf(span->service, sizeof span->service, "%s", service);
  copy_str(s, "traceId", span->trace_id, sizeof span->trace_id);
  copy_str(s, "spanId", span->span_id, sizeof span->span_id);
  copy_str(s, "parentSpanId", span->parent_id, sizeof span->parent_id);
  copy_str(s, "name", span->name, sizeof span->name);
  span->kind = (int)get_int(s, "kind");
  span->status = (int)get_int(s, "status.code");
  bson_iter_t child, arr;
  if (bson_iter_recurse(s, &child) && bson_iter_find(&child, "attributes") && bson_iter_recurse(&child, &arr))
    read_attrs(&arr, span->attrs, NULL, NULL, 0);
  if (bson_iter_recurse(s, &child) && bson_iter_find(&child, "links") && bson_iter_recurse(&child, &arr)) {
    while (bson_iter_next(&arr) && span->nlinks < OBX_TEST_SPAN_MAX_LINKS) {
      int i = span->nlinks++;
      copy_str(&arr, "traceId", span->link_trace[i], sizeof span->link_trace[i]);
      copy_str(&arr, "spanId", span->link_span[i], sizeof span->link_span[i]);
      bson_iter_t l, la;
      if (bson_iter_recurse(&arr, &l) && bson_iter_find(&l, "attributes") && bson_iter_recurse(&l, &la))
        read_attrs(&la, NULL, "outboxd.link.reason", span->link_reason[i], sizeof span->link_reason[i]);
    }
  }
}

void obx_test_otlp_spans(obx_test_otlp_t *otlp, obx_test_spans_t *out) {
  memset(out, 0, sizeof *out);
  int n = obx_test_httpd_nrequests(otlp->httpd);
  for (int r = 0; r < n; r++) {
    obx_test_httpd_request_t req;
    if (!obx_test_httpd_request(otlp->httpd, r, &req)) continue;
    bson_t doc;
    bson_error_t berr;
    if (!bson_init_from_json(&doc, req.body, (ssize_t)req.body_len, &berr))
      fail_msg("OTLP request %d is not JSON (%s): %.200s", r, berr.message, req.body);
    bson_iter_t rs, rsa;
    if (bson_iter_init_find(&rs, &doc, "resourceSpans") && bson_iter_recurse(&rs, &rsa)) {
      while (bson_iter_next(&rsa)) {
        char service[64] = "";
        bson_iter_t c, attrs;
        if (bson_iter_recurse(&rsa, &c) && bson_iter_find_descendant(&c, "resource.attributes", &attrs) &&
            bson_iter_recurse(&attrs, &attrs))
          read_attrs(&attrs, NULL, "service.name", service, sizeof service);
        bson_iter_t ss, ssa;
        if (!bson_iter_recurse(&rsa, &ss) || !bson_iter_find(&ss, "scopeSpans") || !bson_iter_recurse(&ss, &ssa))
          continue;
        while (bson_iter_next(&ssa)) {
          bson_iter_t sp, spa;
          if (!bson_iter_recurse(&ssa, &sp) || !bson_iter_find(&sp, "spans") || !bson_iter_recurse(&sp, &spa)) continue;
          while (bson_iter_next(&spa)) add_span(out, &spa, service);
        }
      }
    }
    bson_destroy(&doc);
    obx_test_httpd_request_cleanup(&req);
  }
}

void obx_test_spans_cleanup(obx_test_spans_t *spans) {
  for (int i = 0; i < spans->n; i++) bson_destroy(spans->v[i].attrs);
  free(spans->v);
  memset(spans, 0, sizeof *spans);
}

static bool matches(const obx_test_span_t *s, const char *trace_id, const char *name_prefix, const char *parent_id) {
  return (!trace_id || strcmp(s->trace_id, trace_id) == 0) &&
         (!name_prefix || strncmp(s->name, name_prefix, strlen(name_prefix)) == 0) &&
         (!parent_id || strcmp(s->parent_id, parent_id) == 0);
}

const obx_test_span_t *obx_test_spans_find(const obx_test_spans_t *spans, const char *trace_id,
                                           const char *name_prefix, const char *parent_id) {
  for (int i = 0; i < spans->n; i++)
    if (matches(&spans->v[i], trace_id, name_prefix, parent_id)) return &spans->v[i];
  return NULL;
}

int obx_test_spans_count(const obx_test_spans_t *spans, const char *trace_id, const char *name_prefix,
                         const char *parent_id) {
  int n = 0;
  for (int i = 0; i < spans->n; i++) n += matches(&spans->v[i], trace_id, name_prefix, parent_id);
  return n;
}

const char *obx_test_span_attr(const obx_test_span_t *span, const char *key) {
  bson_iter_t it;
  return bson_iter_init_find(&it, span->attrs, key) && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
}
