/* obx_test_otlp.h - a stub OpenTelemetry collector: OTLP/HTTP JSON spans received by a test
 *
 * DESIGN: a scripted HTTP server (obx_test_httpd) answering 200 on POST /v1/traces; every
 * request body is kept, and obx_test_otlp_spans parses all of them (resourceSpans ->
 * scopeSpans -> spans) into flat records the test searches by trace, name and parent. Attribute
 * values are kept as text (intValue is a string in OTLP JSON; booleans read "true"/"false"). */
#ifndef OBX_TEST_OTLP_H
#define OBX_TEST_OTLP_H

#include <stdbool.h>
#include <bson/bson.h>

typedef struct obx_test_otlp obx_test_otlp_t;

#define OBX_TEST_SPAN_MAX_LINKS 4

typedef struct {
  char trace_id[33], span_id[17], parent_id[17]; /* parent_id "" for a root */
  char name[160];
  int kind;       /* OTLP SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer */
  int status;     /* 0 unset, 1 ok, 2 error */
  char service[64]; /* resource service.name */
  bson_t *attrs;  /* key -> text value (heap: a bson_t must not move) */
  int nlinks;
  char link_trace[OBX_TEST_SPAN_MAX_LINKS][33], link_span[OBX_TEST_SPAN_MAX_LINKS][17];
  char link_reason[OBX_TEST_SPAN_MAX_LINKS][32];
} obx_test_span_t;

typedef struct {
  obx_test_span_t *v;
  int n;
} obx_test_spans_t;

/* NULL when the server cannot start. */
obx_test_otlp_t *obx_test_otlp_start(void);
void obx_test_otlp_stop(obx_test_otlp_t *otlp);
/* "http://127.0.0.1:<port>": the value of OTEL_EXPORTER_OTLP_ENDPOINT (static per collector). */
const char *obx_test_otlp_endpoint(const obx_test_otlp_t *otlp);
/* Export requests received so far. */
int obx_test_otlp_requests(obx_test_otlp_t *otlp);
/* Every span received so far (fails the test on a body that is not OTLP JSON). */
void obx_test_otlp_spans(obx_test_otlp_t *otlp, obx_test_spans_t *out);
void obx_test_spans_cleanup(obx_test_spans_t *spans);
/* The first span of trace_id (NULL: any) whose name starts with name_prefix and whose parent is
 * parent_id (NULL: any), or NULL. */
const obx_test_span_t *obx_test_spans_find(const obx_test_spans_t *spans, const char *trace_id,
                                           const char *name_prefix, const char *parent_id);
/* How many spans match (same arguments). */
int obx_test_spans_count(const obx_test_spans_t *spans, const char *trace_id, const char *name_prefix,
                         const char *parent_id);
/* An attribute's text, or NULL. */
const char *obx_test_span_attr(const obx_test_span_t *span, const char *key);

#endif
