/* obx_trace.h - W3C trace context, spans and their OTLP/HTTP JSON export
 *
 * DESIGN: the one tracing module of outboxd (no OpenTelemetry C SDK is packaged for Debian).
 *  - Context: W3C Trace Context (https://www.w3.org/TR/trace-context/): traceparent
 *    "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>" and tracestate (up to 32
 *    "key=value" members, 512 bytes). Parsing follows the spec: lowercase hex only, all-zero ids
 *    and version ff are invalid, a higher version may carry more fields after a '-'. An invalid
 *    traceparent is ignored (a new trace starts); an invalid tracestate is dropped.
 *  - Spans: obx_span_start makes a child of a parent context (or a root), with random ids
 *    (getrandom); the span records name, kind, start/end (CLOCK_REALTIME ns), attributes,
 *    links and status, and is owned by the calling thread until obx_span_end, which hands a
 *    sampled span to the exporter and frees it. Unsampled spans record nothing but still carry
 *    a context to propagate.
 *  - Sampling: OTEL_TRACES_SAMPLER always_on | always_off | traceidratio | parentbased_always_on
 *    (default) | parentbased_always_off | parentbased_traceidratio, ratio OTEL_TRACES_SAMPLER_ARG
 *    (0..1, default 1). The ratio compares the last 8 bytes of the trace id, so every process
 *    decides the same for one trace.
 *  - Export: OTLP/HTTP JSON (POST <endpoint>, Content-Type application/json) on libcurl from
 *    one exporter thread, to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT +
 *    "/v1/traces"; OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP[_TRACES]_HEADERS,
 *    OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT, OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE,
 *    OTEL_BSP_MAX_EXPORT_BATCH_SIZE. Without an endpoint (and without OTEL_TRACES_EXPORTER=otlp)
 *    nothing is exported; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn export off.
 *    Ending a span never blocks on the network: it takes the queue's mutex to append, and a full
 *    queue drops the span. A failed export drops its batch (no retry: the event path never waits
 *    for a collector). Counters: outboxd_trace_spans_exported_total,
 *    outboxd_trace_spans_dropped_total{reason="queue_full"|"export_failed"}.
 *  - Current context: one per thread (obx_trace_set_current); log.c writes its traceId and
 *    spanId into every line, so logs written while an event is handled correlate.
 * Span names and attributes follow the OpenTelemetry semantic conventions (HTTP, MongoDB,
 * messaging: Kafka and RabbitMQ). */
#ifndef OBX_TRACE_H
#define OBX_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx_err.h"

#define OBX_TRACEPARENT_LEN 55   /* "00-" 32 "-" 16 "-" 2 */
#define OBX_TRACESTATE_MAX 512
#define OBX_TRACE_ID_HEX 32
#define OBX_SPAN_ID_HEX 16

typedef struct {
  uint8_t trace_id[16];
  uint8_t span_id[8];
  uint8_t flags;                        /* bit 0: sampled */
  bool valid;
  char state[OBX_TRACESTATE_MAX + 1];   /* tracestate, "" when none */
} obx_trace_ctx_t;

/* Parses a traceparent (tp, tp_len bytes) and an optional tracestate (NULL or ts_len 0: none)
 * into out. False (out->valid false) when the traceparent is invalid; an invalid tracestate
 * alone leaves out->state empty. */
bool obx_trace_parse(const char *tp, size_t tp_len, const char *ts, size_t ts_len, obx_trace_ctx_t *out);
/* True when s (len bytes) is a valid tracestate list (W3C §3.3). */
bool obx_tracestate_valid(const char *s, size_t len);
/* Formats ctx as a version-00 traceparent (56 bytes with the NUL). ctx must be valid. */
void obx_trace_format(const obx_trace_ctx_t *ctx, char out[OBX_TRACEPARENT_LEN + 1]);
/* Lowercase hex of the trace id (33 bytes) and span id (17 bytes). */
void obx_trace_ids_hex(const obx_trace_ctx_t *ctx, char trace_hex[OBX_TRACE_ID_HEX + 1],
                       char span_hex[OBX_SPAN_ID_HEX + 1]);
static inline bool obx_trace_sampled(const obx_trace_ctx_t *ctx) { return ctx && ctx->valid && (ctx->flags & 1); }

/* ---- sampling ------------------------------------------------------------------------------- */

typedef enum {
  OBX_SAMPLER_ALWAYS_ON,
  OBX_SAMPLER_ALWAYS_OFF,
  OBX_SAMPLER_RATIO,
  OBX_SAMPLER_PARENT_ALWAYS_ON,
  OBX_SAMPLER_PARENT_ALWAYS_OFF,
  OBX_SAMPLER_PARENT_RATIO,
} obx_sampler_kind_t;

typedef struct {
  obx_sampler_kind_t kind;
  double ratio; /* 0..1 */
} obx_sampler_t;

/* Reads a sampler from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG values (NULL: unset). */
bool obx_sampler_parse(const char *name, const char *arg, obx_sampler_t *out, obx_err_t *err);
/* The decision for a new span of trace_id whose parent is `parent` (NULL or invalid: a root). */
bool obx_sampler_decide(const obx_sampler_t *sampler, const obx_trace_ctx_t *parent, const uint8_t trace_id[16]);

/* ---- spans ---------------------------------------------------------------------------------- */

/* OTLP SpanKind values. */
typedef enum {
  OBX_SPAN_INTERNAL = 1,
  OBX_SPAN_SERVER = 2,
  OBX_SPAN_CLIENT = 3,
  OBX_SPAN_PRODUCER = 4,
  OBX_SPAN_CONSUMER = 5,
} obx_span_kind_t;

typedef struct obx_span obx_span_t;

/* Starts a span: a child of parent when it is valid (same trace id, parent's span id as
 * parentSpanId, its tracestate), else a root of a new trace. Sampled per the process's
 * sampler. Never NULL. Owned by the caller until obx_span_end. */
obx_span_t *obx_span_start(const char *name, obx_span_kind_t kind, const obx_trace_ctx_t *parent);
/* The span's own context (borrowed until obx_span_end): what goes into an outgoing traceparent. */
const obx_trace_ctx_t *obx_span_ctx(const obx_span_t *span);
/* Attributes (copied; a key set twice keeps the last value). No-ops on unsampled spans. */
void obx_span_set_str(obx_span_t *span, const char *key, const char *value);
void obx_span_set_int(obx_span_t *span, const char *key, int64_t value);
void obx_span_set_bool(obx_span_t *span, const char *key, bool value);
/* A link to another context (a redrive's or replay's original trace), with an optional
 * "outboxd.link.reason" attribute. Invalid contexts are ignored. */
void obx_span_add_link(obx_span_t *span, const obx_trace_ctx_t *ctx, const char *reason);
/* Status ERROR with a message (OTLP status code 2); obx_span_set_ok sets code 1. */
void obx_span_set_error(obx_span_t *span, const char *message);
void obx_span_set_ok(obx_span_t *span);
/* Ends the span now, queues it for export when sampled, frees it. NULL is a no-op. */
void obx_span_end(obx_span_t *span);

/* ---- the thread's current context ------------------------------------------------------------ */

/* Sets the calling thread's current context (copied; NULL or invalid clears it). */
void obx_trace_set_current(const obx_trace_ctx_t *ctx);
/* The calling thread's current context, NULL when none. Borrowed until the next set. */
const obx_trace_ctx_t *obx_trace_current(void);

/* ---- the exporter ------------------------------------------------------------------------------ */

typedef struct {
  const char *endpoint;      /* full URL of the traces endpoint */
  const char *service_name;  /* NULL: "outboxd" */
  const char *resource_attributes; /* OTEL_RESOURCE_ATTRIBUTES syntax, may be NULL */
  const char *headers;       /* OTEL_EXPORTER_OTLP_HEADERS syntax, may be NULL */
  int timeout_ms;            /* per export request; 0: 10000 */
  int schedule_delay_ms;     /* longest wait before a partial batch is sent; 0: 5000 */
  int max_queue;             /* 0: 2048 */
  int max_batch;             /* 0: 512 */
  obx_sampler_t sampler;
} obx_trace_opts_t;

/* Reads the OTEL_* variables from the environment (getenv) into opts (strings borrowed from
 * the environment); *export is false when no export is configured. Names the bad variable. */
bool obx_trace_opts_from_env(obx_trace_opts_t *opts, bool *export, obx_err_t *err);
/* Sets the sampler and, when opts->endpoint is set, starts the exporter thread. Called once by
 * main before the roles start; without it spans are sampled always-on-parent-based and dropped
 * at end (context still propagates). */
bool obx_trace_start(const obx_trace_opts_t *opts, obx_err_t *err);
/* obx_trace_opts_from_env + obx_trace_start. */
bool obx_trace_start_from_env(obx_err_t *err);
/* Stops the exporter: what is queued is sent in one last round (bounded by the timeout), then
 * the thread exits. Safe when never started. */
void obx_trace_stop(void);

typedef struct {
  uint64_t exported, dropped_queue_full, dropped_export_failed, queued;
} obx_trace_stats_t;
void obx_trace_stats(obx_trace_stats_t *out);

/* OTLP/HTTP JSON of n spans with the given resource (exposed for tests); caller frees. */
char *obx_trace_encode(obx_span_t *const *spans, int n, const char *service_name, const char *resource_attributes);

#endif
