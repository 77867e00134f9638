/* trace.c - W3C trace context, spans, sampling and the OTLP/HTTP JSON exporter (obx_trace.h)
 *
 * DESIGN: a span belongs to the thread that started it until obx_span_end; ending a sampled
 * span appends it to one bounded queue (g_exp.mutex, no I/O under it) or drops it with a count
 * when the queue is full. The exporter thread owns the libcurl handle: it wakes when a batch is
 * full or the schedule delay passes, takes up to a batch off the queue, encodes it outside the
 * lock and POSTs it with a timeout; a failed request drops the batch with a count and a warning
 * logged once per outage (and an info line when the collector answers again). While the
 * collector is away, batches are dropped without being encoded and one request per second
 * probes it (EXPORT_PROBE_MS), so an outage costs less than a working collector. The sampler is
 * set once by obx_trace_start before any role runs and only read afterwards. Never reads or
 * writes outboxd's configuration table: the OTEL_* variables are the OpenTelemetry ones. */
#include "obx/obx_trace.h"
#include "obx/obx_event.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <bson/bson.h>

#include "obx/obx_log.h"
#include "obx/obx_metrics.h"

/* ---- hex and the traceparent ---------------------------------------------------------------- */

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1; /* uppercase is invalid in a traceparent */
}

/* Decodes 2*n lowercase hex characters into n bytes; false on a bad character. */
static bool hex_decode(const char *s, uint8_t *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return true;
}

static void hex_encode(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

static bool all_zero(const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (b[i]) return false;
  return true;
}

static bool lcalpha(char c) { return c >= 'a' && c <= 'z'; }
static bool digit(char c) { return c >= '0' && c <= '9'; }
static bool key_char(char c) { return lcalpha(c) || digit(c) || c == '_' || c == '-' || c == '*' || c == '/'; }
static bool value_char(char c) { return c >= 0x20 && c <= 0x7e && c != ',' && c != '='; }

/* A tracestate key (W3C §3.3.1.3.1): simple-key, or tenant-id "@" system-id. */
static bool tracestate_key_valid(const char *k, size_t len) {
  const char *at = memchr(k, '@', len);
  if (!at) {
    if (len < 1 || len > 256 || !lcalpha(k[0])) return false;
    for (size_t i = 1; i < len; i++)
      if (!key_char(k[i])) return false;
    return true;
  }
  size_t tlen = (size_t)(at - k), slen = len - tlen - 1;
  if (tlen < 1 || tlen > 241 || slen < 1 || slen > 14) return false;
  if (!lcalpha(k[0]) && !digit(k[0])) return false;
  for (size_t i = 1; i < tlen; i++)
    if (!key_char(k[i])) return false;
  if (!lcalpha(at[1])) return false;
  for (size_t i = 1; i < slen; i++)
    if (!key_char(at[1 + i])) return false;
  return true;
}

bool obx_tracestate_valid(const char *s, size_t len) {
  if (len > OBX_TRACESTATE_MAX) return false;
  const char *keys[32];
  size_t key_lens[32];
  int nkeys = 0;
  size_t i = 0;
  while (i <= len) {
    size_t end = i;
    while (end < len && s[end] != ',') end++;
    size_t a = i, b = end;
    while (a < b && (s[a] == ' ' || s[a] == '\t')) a++;
    while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) b--;
    if (b > a) { /* empty members are allowed and ignored */
      const char *eq = memchr(s + a, '=', b - a);
      if (!eq) return false;
      size_t klen = (size_t)(eq - (s + a)), vlen = b - (size_t)(eq - s) - 1;
      if (!tracestate_key_valid(s + a, klen) || vlen < 1 || vlen > 256 || eq[vlen] == ' ') return false;
      for (size_t j = 0; j < vlen; j++)
        if (!value_char(eq[1 + j])) return false;
      if (nkeys == 32) return false;
      for (int k = 0; k < nkeys; k++)
        if (key_lens[k] == klen && memcmp(keys[k], s + a, klen) == 0) return false;
      keys[nkeys] = s + a;
      key_lens[nkeys++] = klen;
    }
    i = end + 1;
  }
  return true;
}

bool obx_trace_parse(const char *tp, size_t tp_len, const char *ts, size_t ts_len, obx_trace_ctx_t *out) {
  memset(out, 0, sizeof *out);
  if (!tp || tp_len < OBX_TRACEPARENT_LEN) return false;
  uint8_t version;
  if (!hex_decode(tp, &version, 1) || version == 0xff) return false;
  if (version == 0 && tp_len != OBX_TRACEPARENT_LEN) return false;
  if (version > 0 && tp_len > OBX_TRACEPARENT_LEN && tp[OBX_TRACEPARENT_LEN] != '-') return false;
  if (tp[2] != '-' || tp[35] != '-' || tp[52] != '-') return false;
  if (!hex_decode(tp + 3, out->trace_id, 16) || !hex_decode(tp + 36, out->span_id, 8) ||
      !hex_decode(tp + 53, &out->flags, 1))
    return false;
  if (all_zero(out->trace_id, 16) || all_zero(out->span_id, 8)) {
    memset(out, 0, sizeof *out);
    return false;
  }
  out->flags &= 1; /* only the sampled flag is defined for version 00 */
  out->valid = true;
  if (ts && ts_len && obx_tracestate_valid(ts, ts_len)) {
    memcpy(out->state, ts, ts_len);
    out->state[ts_len] = '\0';
  }
  return true;
}

void obx_trace_format(const obx_trace_ctx_t *ctx, char out[OBX_TRACEPARENT_LEN + 1]) {
  char t[OBX_TRACE_ID_HEX + 1], s[OBX_SPAN_ID_HEX + 1];
  obx_trace_ids_hex(ctx, t, s);
  snprintf(out, OBX_TRACEPARENT_LEN + 1, "00-%s-%s-%02x", t, s, ctx->flags & 1);
}

void obx_trace_ids_hex(const obx_trace_ctx_t *ctx, char trace_hex[OBX_TRACE_ID_HEX + 1],
                       char span_hex[OBX_SPAN_ID_HEX + 1]) {
  hex_encode(ctx->trace_id, 16, trace_hex);
  hex_encode(ctx->span_id, 8, span_hex);
}

/* ---- sampling -------------------------------------------------------------------------------- */

static const struct {
  const char *name;
  obx_sampler_kind_t kind;
} sampler_names[] = {
  {"always_on", OBX_SAMPLER_ALWAYS_ON},
  {"always_off", OBX_SAMPLER_ALWAYS_OFF},
  {"traceidratio", OBX_SAMPLER_RATIO},
  {"parentbased_always_on", OBX_SAMPLER_PARENT_ALWAYS_ON},
  {"parentbased_always_off", OBX_SAMPLER_PARENT_ALWAYS_OFF},
  {"parentbased_traceidratio", OBX_SAMPLER_PARENT_RATIO},
};

bool obx_sampler_parse(const char *name, const char *arg, obx_sampler_t *out, obx_err_t *err) {
  out->kind = OBX_SAMPLER_PARENT_ALWAYS_ON;
  out->ratio = 1.0;
  if (name && *name) {
    size_t i = 0, n = sizeof sampler_names / sizeof sampler_names[0];
    while (i < n && strcmp(sampler_names[i].name, name) != 0) i++;
    if (i == n) {
      obx_err_set(err, OBX_ERR_CONF, 0, false,
                  "OTEL_TRACES_SAMPLER: unknown sampler '%s' (allowed: always_on, always_off, traceidratio, "
                  "parentbased_always_on, parentbased_always_off, parentbased_traceidratio)",
                  name);
      return false;
    }
    out->kind = sampler_names[i].kind;
  }
  bool uses_ratio = out->kind == OBX_SAMPLER_RATIO || out->kind == OBX_SAMPLER_PARENT_RATIO;
  if (uses_ratio && arg && *arg) {
    char *end;
    double r = strtod(arg, &end);
    if (*end != '\0' || !(r >= 0.0 && r <= 1.0)) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "OTEL_TRACES_SAMPLER_ARG: '%s' is not a ratio between 0 and 1", arg);
      return false;
    }
    out->ratio = r;
  }
  return true;
}

static bool ratio_decide(double ratio, const uint8_t trace_id[16]) {
  if (ratio >= 1.0) return true;
  if (ratio <= 0.0) return false;
  uint64_t v = 0;
  for (int i = 8; i < 16; i++) v = v << 8 | trace_id[i];
  return (double)(v >> 11) < ratio * (double)(UINT64_C(1) << 53);
}

bool obx_sampler_decide(const obx_sampler_t *sampler, const obx_trace_ctx_t *parent, const uint8_t trace_id[16]) {
  bool has_parent = parent && parent->valid;
  switch (sampler->kind) {
  case OBX_SAMPLER_ALWAYS_ON: return true;
  case OBX_SAMPLER_ALWAYS_OFF: return false;
  case OBX_SAMPLER_RATIO: return ratio_decide(sampler->ratio, trace_id);
  case OBX_SAMPLER_PARENT_ALWAYS_ON: return has_parent ? obx_trace_sampled(parent) : true;
  case OBX_SAMPLER_PARENT_ALWAYS_OFF: return has_parent ? obx_trace_sampled(parent) : false;
  case OBX_SAMPLER_PARENT_RATIO:
    return has_parent ? obx_trace_sampled(parent) : ratio_decide(sampler->ratio, trace_id);
  }
  return true;
}

/* ---- spans ------------------------------------------------------------------------------------ */

typedef enum { ATTR_STR, ATTR_INT, ATTR_BOOL } attr_type_t;

typedef struct {
  char *key;
  attr_type_t type;
  char *s;
  int64_t i;
} span_attr_t;

#define SPAN_MAX_LINKS 4

struct obx_span {
  obx_trace_ctx_t ctx;
  uint8_t parent_id[8];
  bool has_parent, recording;
  char *name;
  obx_span_kind_t kind;
  int64_t start_ns, end_ns;
  span_attr_t *attrs;
  int nattrs, cap;
  obx_trace_ctx_t links[SPAN_MAX_LINKS];
  char *link_reasons[SPAN_MAX_LINKS];
  int nlinks;
  int status;
  char *status_msg;
  struct obx_span *next; /* in the export queue */
};

static obx_sampler_t g_sampler = {OBX_SAMPLER_PARENT_ALWAYS_ON, 1.0};

static void random_bytes(uint8_t *b, size_t n) {
  do {
    size_t got = 0;
    while (got < n) {
      ssize_t r = getrandom(b + got, n - got, 0);
      if (r <= 0) abort(); /* the kernel's generator does not fail for a few bytes */
      got += (size_t)r;
    }
  } while (all_zero(b, n));
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

obx_span_t *obx_span_start(const char *name, obx_span_kind_t kind, const obx_trace_ctx_t *parent) {
  obx_span_t *span = calloc(1, sizeof *span);
  if (!span) abort();
  if (parent && parent->valid) {
    memcpy(span->ctx.trace_id, parent->trace_id, 16);
    memcpy(span->parent_id, parent->span_id, 8);
    memcpy(span->ctx.state, parent->state, sizeof span->ctx.state);
    span->has_parent = true;
  } else {
    random_bytes(span->ctx.trace_id, 16);
  }
  random_bytes(span->ctx.span_id, 8);
  span->ctx.valid = true;
  span->recording = obx_sampler_decide(&g_sampler, parent, span->ctx.trace_id);
  span->ctx.flags = span->recording ? 1 : 0;
  if (span->recording) {
    span->name = strdup(name);
    span->kind = kind;
    span->start_ns = now_ns();
  }
  return span;
}

const obx_trace_ctx_t *obx_span_ctx(const obx_span_t *span) { return &span->ctx; }

static span_attr_t *attr_slot(obx_span_t *span, const char *key) {
  for (int i = 0; i < span->nattrs; i++)
    if (strcmp(span->attrs[i].key, key) == 0) {
      free(span->attrs[i].s);
      span->attrs[i].s = NULL;
      return &span->attrs[i];
    }
  if (span->nattrs == span->cap) {
    span->cap = span->cap ? span->cap * 2 : 8;
    span->attrs = realloc(span->attrs, (size_t)span->cap * sizeof *span->attrs);
    if (!span->attrs) abort();
  }
  span_attr_t *a = &span->attrs[span->nattrs++];
  memset(a, 0, sizeof *a);
  a->key = strdup(key);
  return a;
}

void obx_span_set_str(obx_span_t *span, const char *key, const char *value) {
  if (!span || !span->recording || !value) return;
  span_attr_t *a = attr_slot(span, key);
  a->type = ATTR_STR;
  a->s = strdup(value);
}

void obx_span_set_int(obx_span_t *span, const char *key, int64_t value) {
  if (!span || !span->recording) return;
  span_attr_t *a = attr_slot(span, key);
  a->type = ATTR_INT;
  a->i = value;
}

void obx_span_set_bool(obx_span_t *span, const char *key, bool value) {
  if (!span || !span->recording) return;
  span_attr_t *a = attr_slot(span, key);
  a->type = ATTR_BOOL;
  a->i = value;
}

void obx_span_add_link(obx_span_t *span, const obx_trace_ctx_t *ctx, const char *reason) {
  if (!span || !span->recording || !ctx || !ctx->valid || span->nlinks == SPAN_MAX_LINKS) return;
  span->links[span->nlinks] = *ctx;
  span->link_reasons[span->nlinks++] = reason ? strdup(reason) : NULL;
}

void obx_span_set_error(obx_span_t *span, const char *message) {
  if (!span || !span->recording) return;
  span->status = 2;
  free(span->status_msg);
  span->status_msg = message ? strdup(message) : NULL;
}

void obx_span_set_ok(obx_span_t *span) {
  if (!span || !span->recording) return;
  span->status = 1;
  free(span->status_msg);
  span->status_msg = NULL;
}

static void span_free(obx_span_t *span) {
  for (int i = 0; i < span->nattrs; i++) {
    free(span->attrs[i].key);
    free(span->attrs[i].s);
  }
  for (int i = 0; i < span->nlinks; i++) free(span->link_reasons[i]);
  free(span->attrs);
  free(span->status_msg);
  free(span->name);
  free(span);
}

/* ---- the thread's current context ----------------------------------------------------------------- */

static _Thread_local obx_trace_ctx_t t_current;

void obx_trace_set_current(const obx_trace_ctx_t *ctx) {
  if (ctx && ctx->valid)
    t_current = *ctx;
  else
    t_current.valid = false;
}

const obx_trace_ctx_t *obx_trace_current(void) { return t_current.valid ? &t_current : NULL; }

/* ---- OTLP JSON ---------------------------------------------------------------------------------- */

typedef struct {
  char *s;
  size_t len, cap;
} buf_t;

static void buf_add(buf_t *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    b->s = realloc(b->s, cap);
    if (!b->s) abort();
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

static void buf_str(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }

static void buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(buf_t *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string (quoted); text that is not valid UTF-8 is written as "". */
static void buf_json_str(buf_t *b, const char *s) {
  char *esc = bson_utf8_escape_for_json(s, -1);
  buf_str(b, "\"");
  if (esc) buf_str(b, esc);
  buf_str(b, "\"");
  bson_free(esc);
}

static void buf_kv_str(buf_t *b, const char *key, const char *value) {
  buf_str(b, "{\"key\":");
  buf_json_str(b, key);
  buf_str(b, ",\"value\":{\"stringValue\":");
  buf_json_str(b, value);
  buf_str(b, "}}");
}

static void encode_span(buf_t *b, const obx_span_t *span) {
  char t[OBX_TRACE_ID_HEX + 1], s[OBX_SPAN_ID_HEX + 1];
  obx_trace_ids_hex(&span->ctx, t, s);
  buf_printf(b, "{\"traceId\":\"%s\",\"spanId\":\"%s\"", t, s);
  if (span->has_parent) {
    hex_encode(span->parent_id, 8, s);
    buf_printf(b, ",\"parentSpanId\":\"%s\"", s);
  }
  if (span->ctx.state[0]) {
    buf_str(b, ",\"traceState\":");
    buf_json_str(b, span->ctx.state);
  }
  buf_str(b, ",\"name\":");
  buf_json_str(b, span->name ? span->name : "");
  buf_printf(b, ",\"kind\":%d,\"startTimeUnixNano\":\"%lld\",\"endTimeUnixNano\":\"%lld\",\"attributes\":[",
             (int)span->kind, (long long)span->start_ns, (long long)span->end_ns);
  for (int i = 0; i < span->nattrs; i++) {
    const span_attr_t *a = &span->attrs[i];
    if (i) buf_str(b, ",");
    if (a->type == ATTR_STR) {
      buf_kv_str(b, a->key, a->s);
      continue;
    }
    buf_str(b, "{\"key\":");
    buf_json_str(b, a->key);
    if (a->type == ATTR_INT)
      buf_printf(b, ",\"value\":{\"intValue\":\"%lld\"}}", (long long)a->i);
    else
      buf_printf(b, ",\"value\":{\"boolValue\":%s}}", a->i ? "true" : "false");
  }
  buf_str(b, "]");
  if (span->nlinks) {
    buf_str(b, ",\"links\":[");
    for (int i = 0; i < span->nlinks; i++) {
      obx_trace_ids_hex(&span->links[i], t, s);
      buf_printf(b, "%s{\"traceId\":\"%s\",\"spanId\":\"%s\",\"attributes\":[", i ? "," : "", t, s);
      if (span->link_reasons[i]) buf_kv_str(b, "outboxd.link.reason", span->link_reasons[i]);
      buf_str(b, "]}");
    }
    buf_str(b, "]");
  }
  buf_printf(b, ",\"status\":{\"code\":%d", span->status);
  if (span->status_msg) {
    buf_str(b, ",\"message\":");
    buf_json_str(b, span->status_msg);
  }
  buf_str(b, "}}");
}

/* Percent-decodes s[0..n) into a new string (W3C Baggage / OTEL_* list values). */
static char *pct_decode(const char *s, size_t n) {
  char *out = malloc(n + 1), *o = out;
  if (!out) abort();
  for (size_t i = 0; i < n; i++) {
    int hi, lo;
    if (s[i] == '%' && i + 2 < n &&
        (hi = hexval((char)(s[i + 1] | 0x20))) >= 0 && (lo = hexval((char)(s[i + 2] | 0x20))) >= 0) {
      *o++ = (char)(hi << 4 | lo);
      i += 2;
    } else {
      *o++ = s[i];
    }
  }
  *o = '\0';
  return out;
}

typedef bool (*kv_fn)(void *ctx, const char *key, const char *value);

/* Walks a "k=v,k2=v2" list (spaces around items trimmed, values percent-decoded); false when
 * an item has no '=' or an empty key, or when fn says so. */
static bool kv_list(const char *list, kv_fn fn, void *ctx) {
  const char *p = list;
  bool ok = true;
  while (ok && p && *p) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n && (*p == ' ' || *p == '\t')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    if (n) {
      const char *eq = memchr(p, '=', n);
      size_t klen = eq ? (size_t)(eq - p) : 0;
      while (klen && (p[klen - 1] == ' ')) klen--;
      if (!eq || klen == 0) return false;
      char *key = strndup(p, klen);
      const char *v = eq + 1;
      size_t vlen = n - (size_t)(v - p);
      while (vlen && *v == ' ') v++, vlen--;
      char *value = pct_decode(v, vlen);
      ok = fn(ctx, key, value);
      free(key);
      free(value);
    }
    p = end ? end + 1 : NULL;
  }
  return ok;
}

typedef struct {
  buf_t *b;
  int n;
  bool has_service;
  const char *service_name;
} resource_ctx_t;

static bool resource_attr(void *ctx, const char *key, const char *value) {
  resource_ctx_t *r = ctx;
  if (strcmp(key, "service.name") == 0) {
    if (r->service_name) return true; /* OTEL_SERVICE_NAME wins */
    r->has_service = true;
  }
  if (r->n++) buf_str(r->b, ",");
  buf_kv_str(r->b, key, value);
  return true;
}

/* The "resource" object of resourceSpans. Bad items of the attribute list are skipped here
 * (obx_trace_opts_from_env refuses them before the exporter starts). */
static void encode_resource(buf_t *b, const char *service_name, const char *resource_attributes) {
  resource_ctx_t r = {.b = b, .service_name = service_name};
  buf_str(b, "{\"attributes\":[");
  if (resource_attributes) kv_list(resource_attributes, resource_attr, &r);
  if (!r.has_service) {
    if (r.n++) buf_str(b, ",");
    buf_kv_str(b, "service.name", service_name ? service_name : "outboxd");
  }
  buf_str(b, ",");
  buf_kv_str(b, "telemetry.sdk.name", "outboxd");
  buf_str(b, ",");
  buf_kv_str(b, "telemetry.sdk.language", "c");
  buf_str(b, "]}");
}

static char *encode_batch(const char *resource_json, obx_span_t *const *spans, int n) {
  buf_t b = {0};
  buf_str(&b, "{\"resourceSpans\":[{\"resource\":");
  buf_str(&b, resource_json);
  buf_str(&b, ",\"scopeSpans\":[{\"scope\":{\"name\":\"outboxd\"},\"spans\":[");
  for (int i = 0; i < n; i++) {
    if (i) buf_str(&b, ",");
    encode_span(&b, spans[i]);
  }
  buf_str(&b, "]}]}]}");
  return b.s;
}

char *obx_trace_encode(obx_span_t *const *spans, int n, const char *service_name, const char *resource_attributes) {
  buf_t r = {0};
  encode_resource(&r, service_name, resource_attributes);
  char *out = encode_batch(r.s, spans, n);
  free(r.s);
  return out;
}

/* ---- the exporter ---------------------------------------------------------------------------------- */

static struct {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  pthread_t thread;
  bool running, stopping;
  obx_span_t *head, *tail;
  int count;
  obx_trace_opts_t opts;
  char *url, *resource_json;
  struct curl_slist *headers;
  obx_counter_t *exported, *dropped;
  atomic_uint_fast64_t n_exported, n_queue_full, n_export_failed;
} g_exp = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static void count_dropped(const char *reason, int n) {
  if (strcmp(reason, "queue_full") == 0)
    atomic_fetch_add(&g_exp.n_queue_full, (uint64_t)n);
  else
    atomic_fetch_add(&g_exp.n_export_failed, (uint64_t)n);
  if (g_exp.dropped) obx_counter_add(g_exp.dropped, n, reason);
}

void obx_span_end(obx_span_t *span) {
  if (!span) return;
  if (!span->recording) {
    span_free(span);
    return;
  }
  span->end_ns = now_ns();
  pthread_mutex_lock(&g_exp.mutex);
  if (!g_exp.running || g_exp.stopping) {
    pthread_mutex_unlock(&g_exp.mutex);
    span_free(span);
    return;
  }
  if (g_exp.count >= g_exp.opts.max_queue) {
    pthread_mutex_unlock(&g_exp.mutex);
    span_free(span);
    count_dropped("queue_full", 1);
    return;
  }
  span->next = NULL;
  if (g_exp.tail)
    g_exp.tail->next = span;
  else
    g_exp.head = span;
  g_exp.tail = span;
  if (++g_exp.count == g_exp.opts.max_batch) pthread_cond_signal(&g_exp.cond);
  pthread_mutex_unlock(&g_exp.mutex);
}

#define EXPORT_PROBE_MS 1000

static size_t discard_body(char *ptr, size_t size, size_t nmemb, void *userdata) { return size * nmemb; }

/* POSTs one batch; true when the collector answered 2xx. */
static bool export_batch(CURL *curl, obx_span_t **spans, int n, char *why, size_t whylen) {
  char *body = encode_batch(g_exp.resource_json, spans, n);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  free(body);
  if (rc != CURLE_OK) {
    snprintf(why, whylen, "%s", curl_easy_strerror(rc));
    return false;
  }
  if (status < 200 || status > 299) {
    snprintf(why, whylen, "HTTP %ld", status);
    return false;
  }
  return true;
}

static void *exporter_main(void *arg) {
  obx_log_set_role("trace");
  CURL *curl = curl_easy_init();
  obx_span_t **batch = calloc((size_t)g_exp.opts.max_batch, sizeof *batch);
  if (!curl || !batch) abort();
  curl_easy_setopt(curl, CURLOPT_URL, g_exp.url);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, g_exp.headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)g_exp.opts.timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)g_exp.opts.timeout_ms);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard_body);
  bool away = false;
  int64_t final_deadline = 0, next_probe = 0;

  pthread_mutex_lock(&g_exp.mutex);
  for (;;) {
    if (!g_exp.stopping && g_exp.count < g_exp.opts.max_batch) {
      struct timespec ts = obx_time_deadline(CLOCK_MONOTONIC, g_exp.opts.schedule_delay_ms);
      pthread_cond_timedwait(&g_exp.cond, &g_exp.mutex, &ts);
    }
    if (g_exp.stopping && !final_deadline) final_deadline = obx_time_mono_ms() + g_exp.opts.timeout_ms;
    int n = 0;
    while (g_exp.head && n < g_exp.opts.max_batch) {
      batch[n++] = g_exp.head;
      g_exp.head = g_exp.head->next;
      g_exp.count--;
    }
    if (!g_exp.head) g_exp.tail = NULL;
    bool last = g_exp.stopping && !g_exp.head;
    pthread_mutex_unlock(&g_exp.mutex);

    if (n) {
      char why[256] = "";
      int64_t now = obx_time_mono_ms();
      bool late = final_deadline && now > final_deadline, skip = late || (away && now < next_probe);
      if (late) snprintf(why, sizeof why, "stopping: out of time");
      if (!skip && export_batch(curl, batch, n, why, sizeof why)) {
        atomic_fetch_add(&g_exp.n_exported, (uint64_t)n);
        obx_counter_add(g_exp.exported, n);
        if (away) obx_info("trace export to %s works again", g_exp.url);
        away = false;
      } else {
        count_dropped("export_failed", n);
        if (!away) obx_warn("trace export to %s failed (%s): spans are dropped until it answers", g_exp.url, why);
        if (!skip) next_probe = obx_time_mono_ms() + EXPORT_PROBE_MS;
        away = true;
      }
      for (int i = 0; i < n; i++) span_free(batch[i]);
    }
    pthread_mutex_lock(&g_exp.mutex);
    if (last || (g_exp.stopping && !g_exp.head)) break;
  }
  pthread_mutex_unlock(&g_exp.mutex);
  free(batch);
  curl_easy_cleanup(curl);
  return NULL;
}

static bool env_int(const char *name, int min, int max, int *out, obx_err_t *err) {
  const char *v = getenv(name);
  if (!v || !*v) return true;
  char *end;
  long n = strtol(v, &end, 10);
  if (*end != '\0' || n < min || n > max) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "%s: '%s' is not an integer in %d..%d", name, v, min, max);
    return false;
  }
  *out = (int)n;
  return true;
}

/* The signal-specific variable, else the general one. */
static const char *env_either(const char *specific, const char *general, const char **which) {
  const char *v = getenv(specific);
  *which = specific;
  if (v && *v) return v;
  *which = general;
  v = getenv(general);
  return v && *v ? v : NULL;
}

static bool accept_kv(void *ctx, const char *key, const char *value) { return true; }

bool obx_trace_opts_from_env(obx_trace_opts_t *opts, bool *export, obx_err_t *err) {
  static char url[2048]; /* read once by main, before any thread */
  const char *which;
  memset(opts, 0, sizeof *opts);
  *export = false;
  if (!obx_sampler_parse(getenv("OTEL_TRACES_SAMPLER"), getenv("OTEL_TRACES_SAMPLER_ARG"), &opts->sampler, err))
    return false;
  opts->service_name = getenv("OTEL_SERVICE_NAME");
  if (opts->service_name && !*opts->service_name) opts->service_name = NULL;
  opts->resource_attributes = getenv("OTEL_RESOURCE_ATTRIBUTES");
  if (opts->resource_attributes && !kv_list(opts->resource_attributes, accept_kv, NULL)) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "OTEL_RESOURCE_ATTRIBUTES: want key=value pairs separated by commas");
    return false;
  }
  opts->headers = env_either("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS", &which);
  if (opts->headers && !kv_list(opts->headers, accept_kv, NULL)) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "%s: want name=value pairs separated by commas", which);
    return false;
  }
  const char *timeout = env_either("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT", &which);
  if (timeout && !env_int(which, 1, 600000, &opts->timeout_ms, err)) return false;
  if (!env_int("OTEL_BSP_SCHEDULE_DELAY", 1, 600000, &opts->schedule_delay_ms, err) ||
      !env_int("OTEL_BSP_MAX_QUEUE_SIZE", 1, 1000000, &opts->max_queue, err) ||
      !env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1, 100000, &opts->max_batch, err))
    return false;
  const char *protocol = env_either("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL", &which);
  if (protocol && strcmp(protocol, "http/json") != 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "%s: '%s' is not supported (outboxd exports http/json)", which, protocol);
    return false;
  }
  const char *disabled = getenv("OTEL_SDK_DISABLED"), *exporter = getenv("OTEL_TRACES_EXPORTER");
  if ((disabled && strcasecmp(disabled, "true") == 0) || (exporter && strcmp(exporter, "none") == 0)) return true;
  if (exporter && *exporter && strcmp(exporter, "otlp") != 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "OTEL_TRACES_EXPORTER: '%s' is not supported (otlp or none)", exporter);
    return false;
  }
  const char *traces = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), *base = getenv("OTEL_EXPORTER_OTLP_ENDPOINT");
  if (traces && *traces) {
    snprintf(url, sizeof url, "%s", traces);
  } else if (base && *base) {
    size_t n = strlen(base);
    snprintf(url, sizeof url, "%.*s/v1/traces", (int)(n && base[n - 1] == '/' ? n - 1 : n), base);
  } else if (exporter && strcmp(exporter, "otlp") == 0) {
    snprintf(url, sizeof url, "http://localhost:4318/v1/traces");
  } else {
    return true;
  }
  if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "%s: '%s' is not an http:// or https:// URL",
                traces && *traces ? "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" : "OTEL_EXPORTER_OTLP_ENDPOINT", url);
    return false;
  }
  opts->endpoint = url;
  *export = true;
  return true;
}

static bool add_header(void *ctx, const char *key, const char *value) {
  struct curl_slist **list = ctx;
  size_t n = strlen(key) + strlen(value) + 3;
  char *line = malloc(n);
  if (!line) abort();
  snprintf(line, n, "%s: %s", key, value);
  *list = curl_slist_append(*list, line);
  free(line);
  return true;
}

bool obx_trace_start(const obx_trace_opts_t *opts, obx_err_t *err) {
  g_sampler = opts->sampler;
  if (!opts->endpoint) return true;
  pthread_mutex_lock(&g_exp.mutex);
  bool running = g_exp.running;
  pthread_mutex_unlock(&g_exp.mutex);
  if (running) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "trace exporter already started");
    return false;
  }
  g_exp.opts = *opts;
  if (!g_exp.opts.timeout_ms) g_exp.opts.timeout_ms = 10000;
  if (!g_exp.opts.schedule_delay_ms) g_exp.opts.schedule_delay_ms = 5000;
  if (!g_exp.opts.max_queue) g_exp.opts.max_queue = 2048;
  if (!g_exp.opts.max_batch) g_exp.opts.max_batch = 512;
  if (g_exp.opts.max_batch > g_exp.opts.max_queue) g_exp.opts.max_batch = g_exp.opts.max_queue;
  g_exp.url = strdup(opts->endpoint);
  buf_t r = {0};
  encode_resource(&r, opts->service_name, opts->resource_attributes);
  g_exp.resource_json = r.s;
  g_exp.headers = curl_slist_append(NULL, "Content-Type: application/json");
  if (opts->headers) kv_list(opts->headers, add_header, &g_exp.headers);
  g_exp.opts.endpoint = g_exp.url;
  g_exp.opts.service_name = g_exp.opts.resource_attributes = g_exp.opts.headers = NULL; /* not kept */
  g_exp.exported = obx_metrics_counter("outboxd_trace_spans_exported_total",
                                       "Spans the OTLP collector accepted", NULL);
  g_exp.dropped = obx_metrics_counter("outboxd_trace_spans_dropped_total",
                                      "Spans dropped: export queue full, or the collector failed or was away",
                                      "reason");
  obx_counter_add(g_exp.dropped, 0, "queue_full");
  obx_counter_add(g_exp.dropped, 0, "export_failed");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g_exp.cond, &ca);
  pthread_condattr_destroy(&ca);
  g_exp.stopping = false;
  g_exp.running = true;
  if (pthread_create(&g_exp.thread, NULL, exporter_main, NULL) != 0) {
    g_exp.running = false;
    obx_err_set(err, OBX_ERR_SYS, 0, false, "trace exporter thread: cannot start");
    return false;
  }
  obx_info("exporting traces to %s (OTLP/HTTP JSON)", g_exp.url);
  return true;
}

bool obx_trace_start_from_env(obx_err_t *err) {
  obx_trace_opts_t opts;
  bool export;
  return obx_trace_opts_from_env(&opts, &export, err) && obx_trace_start(&opts, err);
}

void obx_trace_stop(void) {
  pthread_mutex_lock(&g_exp.mutex);
  if (!g_exp.running) {
    pthread_mutex_unlock(&g_exp.mutex);
    return;
  }
  g_exp.stopping = true;
  pthread_cond_signal(&g_exp.cond);
  pthread_mutex_unlock(&g_exp.mutex);
  pthread_join(g_exp.thread, NULL);
  pthread_mutex_lock(&g_exp.mutex);
  while (g_exp.head) { /* ended after the last round */
    obx_span_t *next = g_exp.head->next;
    span_free(g_exp.head);
    g_exp.head = next;
  }
  g_exp.tail = NULL;
  g_exp.count = 0;
  g_exp.running = false;
  pthread_mutex_unlock(&g_exp.mutex);
  pthread_cond_destroy(&g_exp.cond);
  curl_slist_free_all(g_exp.headers);
  g_exp.headers = NULL;
  free(g_exp.url);
  free(g_exp.resource_json);
  g_exp.url = g_exp.resource_json = NULL;
}

void obx_trace_stats(obx_trace_stats_t *out) {
  out->exported = atomic_load(&g_exp.n_exported);
  out->dropped_queue_full = atomic_load(&g_exp.n_queue_full);
  out->dropped_export_failed = atomic_load(&g_exp.n_export_failed);
  pthread_mutex_lock(&g_exp.mutex);
  out->queued = (uint64_t)g_exp.count;
  pthread_mutex_unlock(&g_exp.mutex);
}
