/* event.c - the event envelope and its three external forms (obx_event.h)
 *
 * DESIGN: obx_event_t owns every string and the payload. The three decoders (outbox document,
 * binary-mode Kafka record, structured-mode CloudEvent JSON) collect raw attribute values
 * first and then go through the same checks (attr_dup and obx_event_finalize), so a field is
 * validated the same way whichever door it came in by. Errors are OBX_ERR_INPUT, terminal,
 * and start with the attribute name as the sender spelt it (ce_id, id, aggregateId, ...).
 * The payload travels as relaxed extended JSON: Decimal128 values become {"$numberDecimal":
 * "..."} and dates {"$date": ...}; libbson's JSON reader turns both back into BSON types. */
#include "obx/obx_event.h"
#include "obx/obx_trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CE_SPECVERSION "1.0"
#define CE_CONTENT_TYPE "application/json"

void obx_event_init(obx_event_t *ev) {
  memset(ev, 0, sizeof *ev);
  bson_init(&ev->payload);
}

void obx_event_cleanup(obx_event_t *ev) {
  if (!ev) return;
  free(ev->event_type);
  free(ev->org_id);
  free(ev->aggregate_type);
  free(ev->aggregate_id);
  free(ev->partition_key);
  free(ev->correlation_id);
  free(ev->causation_id);
  free(ev->source);
  free(ev->traceparent);
  free(ev->tracestate);
  bson_destroy(&ev->payload);
  memset(ev, 0, sizeof *ev);
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void reset(obx_event_t *ev) {
  obx_event_cleanup(ev);
  obx_event_init(ev);
}

void obx_event_copy(obx_event_t *dst, const obx_event_t *src) {
  reset(dst);
  memcpy(dst->id, src->id, sizeof dst->id);
  dst->event_type = dup_or_null(src->event_type);
  dst->event_version = src->event_version;
  dst->org_id = dup_or_null(src->org_id);
  dst->aggregate_type = dup_or_null(src->aggregate_type);
  dst->aggregate_id = dup_or_null(src->aggregate_id);
  dst->partition_key = dup_or_null(src->partition_key);
  dst->correlation_id = dup_or_null(src->correlation_id);
  dst->causation_id = dup_or_null(src->causation_id);
  dst->source = dup_or_null(src->source);
  dst->traceparent = dup_or_null(src->traceparent);
  dst->tracestate = dup_or_null(src->tracestate);
  bson_destroy(&dst->payload);
  bson_copy_to(&src->payload, &dst->payload);
  dst->occurred_at_ms = src->occurred_at_ms;
  dst->key_seq = src->key_seq;
}

/* Checks one string attribute and stores a copy in *dst (NULL when absent and optional; an
 * empty optional value counts as absent). */
static bool attr_dup(char **dst, const char *v, size_t len, const char *prefix, const char *name, bool required,
                     obx_err_t *err) {
  free(*dst);
  *dst = NULL;
  if (!v || len == 0) {
    if (!required) return true;
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s%s: %s", prefix, name, v ? "empty" : "missing");
    return false;
  }
  if (len > OBX_EVENT_MAX_ATTR_LEN) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s%s: longer than %d bytes", prefix, name, OBX_EVENT_MAX_ATTR_LEN);
    return false;
  }
  if (memchr(v, '\0', len) || !bson_utf8_validate(v, len, false)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s%s: not valid UTF-8 text", prefix, name);
    return false;
  }
  *dst = strndup(v, len);
  return true;
}

static bool check_id(const char *v, size_t len, const char *what, obx_err_t *err) {
  if (len > OBX_UUID_LEN) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: longer than %d characters", what, OBX_UUID_LEN);
    return false;
  }
  if (memchr(v, '\0', len) || !bson_utf8_validate(v, len, false)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: not valid UTF-8 text", what);
    return false;
  }
  return true;
}

/* Re-checks a field already set by a caller through the same rules as decoded input. */
static bool recheck(char **field, const char *name, bool required, obx_err_t *err) {
  char *v = *field;
  *field = NULL;
  bool ok = attr_dup(field, v, v ? strlen(v) : 0, "", name, required, err);
  free(v);
  return ok;
}

/* Trace context is optional and never fails an event (W3C: an invalid traceparent is ignored):
 * an invalid traceparent drops both fields, an invalid tracestate drops itself. */
static void trace_check(obx_event_t *ev) {
  obx_trace_ctx_t ctx;
  if (ev->traceparent && !obx_trace_parse(ev->traceparent, strlen(ev->traceparent), NULL, 0, &ctx)) {
    free(ev->traceparent);
    ev->traceparent = NULL;
  }
  if (ev->tracestate && (!ev->traceparent || !*ev->tracestate ||
                         !obx_tracestate_valid(ev->tracestate, strlen(ev->tracestate)))) {
    free(ev->tracestate);
    ev->tracestate = NULL;
  }
}

bool obx_event_finalize(obx_event_t *ev, obx_err_t *err) {
  if (!ev->id[0]) obx_uuid7(ev->id);
  if (!check_id(ev->id, strlen(ev->id), "id", err)) return false;
  if (!recheck(&ev->event_type, "eventType", true, err) || !recheck(&ev->org_id, "orgId", true, err) ||
      !recheck(&ev->aggregate_type, "aggregateType", true, err) ||
      !recheck(&ev->aggregate_id, "aggregateId", true, err) ||
      !recheck(&ev->partition_key, "partitionKey", false, err) ||
      !recheck(&ev->correlation_id, "correlationId", false, err) ||
      !recheck(&ev->causation_id, "causationId", false, err) || !recheck(&ev->source, "source", false, err))
    return false;
  if (ev->event_version == 0) ev->event_version = 1;
  if (ev->event_version < 0) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "eventVersion: %d is not a positive integer", (int)ev->event_version);
    return false;
  }
  if (!ev->partition_key) ev->partition_key = strdup(ev->aggregate_id);
  if (ev->occurred_at_ms == 0) ev->occurred_at_ms = obx_time_now_ms();
  trace_check(ev);
  return true;
}

/* ---- outbox document -------------------------------------------------------------------- */

static void append_str_or_null(bson_t *doc, const char *key, const char *v) {
  if (v)
    BSON_APPEND_UTF8(doc, key, v);
  else
    BSON_APPEND_NULL(doc, key);
}

bool obx_event_to_outbox(const obx_event_t *ev, bson_t *out, obx_err_t *err) {
  if (!ev->id[0] || !ev->event_type || !ev->org_id || !ev->aggregate_type || !ev->aggregate_id) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "event is not finalized (id, eventType, orgId, aggregateType and "
                                              "aggregateId are required)");
    return false;
  }
  BSON_APPEND_UTF8(out, "_id", ev->id);
  BSON_APPEND_UTF8(out, "eventType", ev->event_type);
  BSON_APPEND_INT32(out, "eventVersion", ev->event_version > 0 ? ev->event_version : 1);
  BSON_APPEND_UTF8(out, "orgId", ev->org_id);
  BSON_APPEND_UTF8(out, "aggregateType", ev->aggregate_type);
  BSON_APPEND_UTF8(out, "aggregateId", ev->aggregate_id);
  BSON_APPEND_UTF8(out, "partitionKey", ev->partition_key ? ev->partition_key : ev->aggregate_id);
  append_str_or_null(out, "correlationId", ev->correlation_id);
  append_str_or_null(out, "causationId", ev->causation_id);
  if (ev->source) BSON_APPEND_UTF8(out, "source", ev->source);
  if (ev->traceparent) BSON_APPEND_UTF8(out, "traceparent", ev->traceparent);
  if (ev->tracestate) BSON_APPEND_UTF8(out, "tracestate", ev->tracestate);
  BSON_APPEND_DOCUMENT(out, "payload", &ev->payload);
  BSON_APPEND_DATE_TIME(out, "occurredAt", ev->occurred_at_ms);
  BSON_APPEND_UTF8(out, "status", "PENDING");
  BSON_APPEND_INT32(out, "attempts", 0);
  BSON_APPEND_DATE_TIME(out, "availableAt", ev->occurred_at_ms);
  BSON_APPEND_NULL(out, "lastError");
  return true;
}

/* A string field of an outbox document: absent and null read as NULL; other types are errors. */
static bool doc_str(const bson_t *doc, const char *name, char **dst, bool required, obx_err_t *err) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, name) || BSON_ITER_HOLDS_NULL(&it)) return attr_dup(dst, NULL, 0, "", name, required, err);
  if (!BSON_ITER_HOLDS_UTF8(&it)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: must be a string", name);
    return false;
  }
  uint32_t len;
  const char *v = bson_iter_utf8(&it, &len);
  return attr_dup(dst, v, len, "", name, required, err);
}

/* Copies the embedded document at it into ev->payload. */
static bool payload_from_iter(obx_event_t *ev, const bson_iter_t *it, const char *what, obx_err_t *err) {
  if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: not a %s", what, strcmp(what, "data") == 0 ? "JSON object" : "document");
    return false;
  }
  uint32_t len;
  const uint8_t *data;
  bson_t view;
  bson_iter_document(it, &len, &data);
  if (!bson_init_static(&view, data, len)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: corrupt document", what);
    return false;
  }
  bson_destroy(&ev->payload);
  bson_copy_to(&view, &ev->payload);
  return true;
}

bool obx_event_from_outbox(obx_event_t *ev, const bson_t *doc, obx_err_t *err) {
  bson_iter_t it;
  reset(ev);
  if (!bson_iter_init_find(&it, doc, "_id") || !BSON_ITER_HOLDS_UTF8(&it)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "_id: missing or not a string");
    return false;
  }
  uint32_t idlen;
  const char *id = bson_iter_utf8(&it, &idlen);
  if (idlen == 0) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "_id: empty");
    return false;
  }
  if (!check_id(id, idlen, "_id", err)) return false;
  memcpy(ev->id, id, idlen);
  ev->id[idlen] = '\0';
  if (!doc_str(doc, "eventType", &ev->event_type, true, err) || !doc_str(doc, "orgId", &ev->org_id, true, err) ||
      !doc_str(doc, "aggregateType", &ev->aggregate_type, true, err) ||
      !doc_str(doc, "aggregateId", &ev->aggregate_id, true, err) ||
      !doc_str(doc, "partitionKey", &ev->partition_key, false, err) ||
      !doc_str(doc, "correlationId", &ev->correlation_id, false, err) ||
      !doc_str(doc, "causationId", &ev->causation_id, false, err) || !doc_str(doc, "source", &ev->source, false, err))
    return false;
  if (bson_iter_init_find(&it, doc, "eventVersion")) {
    if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) < 1 || bson_iter_as_int64(&it) > INT32_MAX ||
        (BSON_ITER_HOLDS_DOUBLE(&it) && bson_iter_double(&it) != (double)bson_iter_as_int64(&it))) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "eventVersion: must be a positive integer");
      return false;
    }
    ev->event_version = (int32_t)bson_iter_as_int64(&it);
  }
  if (!bson_iter_init_find(&it, doc, "payload")) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "payload: missing");
    return false;
  }
  if (!payload_from_iter(ev, &it, "payload", err)) return false;
  if (!bson_iter_init_find(&it, doc, "occurredAt") || !BSON_ITER_HOLDS_DATE_TIME(&it)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "occurredAt: missing or not a date");
    return false;
  }
  ev->occurred_at_ms = bson_iter_date_time(&it);
  if (bson_iter_init_find(&it, doc, "keySeq") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (!BSON_ITER_HOLDS_INT32(&it) && !BSON_ITER_HOLDS_INT64(&it)) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "keySeq: must be an integer");
      return false;
    }
    if (bson_iter_as_int64(&it) < 1) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "keySeq: must be positive");
      return false;
    }
    ev->key_seq = bson_iter_as_int64(&it);
  }
  /* optional trace context: anything but a string is ignored, like an invalid value */
  if (bson_iter_init_find(&it, doc, "traceparent") && BSON_ITER_HOLDS_UTF8(&it))
    ev->traceparent = strdup(bson_iter_utf8(&it, NULL));
  if (bson_iter_init_find(&it, doc, "tracestate") && BSON_ITER_HOLDS_UTF8(&it))
    ev->tracestate = strdup(bson_iter_utf8(&it, NULL));
  return obx_event_finalize(ev, err);
}

/* ---- CloudEvents attributes shared by the binary and structured decoders ------------------ */

enum {
  A_SPECVERSION,
  A_ID,
  A_SOURCE,
  A_TYPE,
  A_TIME,
  A_SUBJECT,
  A_PARTITIONKEY,
  A_ORGID,
  A_CORRELATIONID,
  A_CAUSATIONID,
  A_EVENTVERSION,
  A_TRACEPARENT,
  A_TRACESTATE,
  A_KEYSEQ,
  A_COUNT
};
static const char *const attr_names[A_COUNT] = {"specversion",  "id",    "source",        "type",
                                                "time",         "subject", "partitionkey", "orgid",
                                                "correlationid", "causationid", "eventversion",
                                                "traceparent",  "tracestate",   "keyseq"};

typedef struct {
  const char *v; /* NULL when absent */
  size_t len;
} attr_t;

static bool attr_equals(const attr_t *a, const char *s) { return a->len == strlen(s) && memcmp(a->v, s, a->len) == 0; }

/* A positive decimal integer attribute (eventversion, keyseq) into *out; at most max. */
static bool attr_positive(const attr_t *a, const char *prefix, const char *name, int64_t max, int64_t *out, obx_err_t *err) {
  char *tmp = NULL;
  if (!attr_dup(&tmp, a->v, a->len, prefix, name, true, err)) return false;
  char *end;
  errno = 0;
  long long v = strtoll(tmp, &end, 10);
  bool ok = *end == '\0' && tmp[0] != '+' && tmp[0] != '-' && errno == 0 && v >= 1 && v <= max;
  if (ok) *out = v;
  else obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s%s: '%s' is not a positive integer", prefix, name, tmp);
  free(tmp);
  return ok;
}

/* Fills ev from the attributes; prefix is "ce_" for Kafka headers, "" for structured JSON. */
static bool decode_attrs(obx_event_t *ev, const attr_t *a, const char *prefix, obx_err_t *err) {
  char *tmp = NULL;
  bool ok = false;
  if (!a[A_SPECVERSION].v) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%sspecversion: missing", prefix);
    goto done;
  }
  if (!attr_equals(&a[A_SPECVERSION], CE_SPECVERSION)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%sspecversion: unsupported '%.*s' (want " CE_SPECVERSION ")", prefix,
                (int)(a[A_SPECVERSION].len > 16 ? 16 : a[A_SPECVERSION].len), a[A_SPECVERSION].v);
    goto done;
  }
  if (!attr_dup(&tmp, a[A_ID].v, a[A_ID].len, prefix, "id", true, err)) goto done;
  char what[32];
  snprintf(what, sizeof what, "%sid", prefix);
  if (!check_id(tmp, strlen(tmp), what, err)) goto done;
  memcpy(ev->id, tmp, strlen(tmp) + 1);
  if (!attr_dup(&ev->source, a[A_SOURCE].v, a[A_SOURCE].len, prefix, "source", true, err) ||
      !attr_dup(&ev->event_type, a[A_TYPE].v, a[A_TYPE].len, prefix, "type", true, err) ||
      !attr_dup(&ev->org_id, a[A_ORGID].v, a[A_ORGID].len, prefix, "orgid", true, err) ||
      !attr_dup(&ev->partition_key, a[A_PARTITIONKEY].v, a[A_PARTITIONKEY].len, prefix, "partitionkey", false, err) ||
      !attr_dup(&ev->correlation_id, a[A_CORRELATIONID].v, a[A_CORRELATIONID].len, prefix, "correlationid", false,
                err) ||
      !attr_dup(&ev->causation_id, a[A_CAUSATIONID].v, a[A_CAUSATIONID].len, prefix, "causationid", false, err) ||
      !attr_dup(&ev->traceparent, a[A_TRACEPARENT].v, a[A_TRACEPARENT].len, prefix, "traceparent", false, err) ||
      !attr_dup(&ev->tracestate, a[A_TRACESTATE].v, a[A_TRACESTATE].len, prefix, "tracestate", false, err))
    goto done;

  if (!attr_dup(&tmp, a[A_SUBJECT].v, a[A_SUBJECT].len, prefix, "subject", true, err)) goto done;
  char *slash = strchr(tmp, '/');
  if (!slash || slash == tmp || slash[1] == '\0') {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%ssubject: '%s' is not <aggregateType>/<aggregateId>", prefix, tmp);
    goto done;
  }
  ev->aggregate_type = strndup(tmp, (size_t)(slash - tmp));
  ev->aggregate_id = strdup(slash + 1);

  if (a[A_TIME].v) {
    if (!attr_dup(&tmp, a[A_TIME].v, a[A_TIME].len, prefix, "time", true, err)) goto done;
    if (!obx_time_parse_rfc3339(tmp, &ev->occurred_at_ms)) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "%stime: '%s' is not an RFC 3339 timestamp", prefix, tmp);
      goto done;
    }
  }
  int64_t v;
  if (a[A_EVENTVERSION].v) {
    if (!attr_positive(&a[A_EVENTVERSION], prefix, "eventversion", INT32_MAX, &v, err)) goto done;
    ev->event_version = (int32_t)v;
  }
  if (a[A_KEYSEQ].v && !attr_positive(&a[A_KEYSEQ], prefix, "keyseq", INT64_MAX, &ev->key_seq, err)) goto done;
  ok = obx_event_finalize(ev, err);
done:
  free(tmp);
  return ok;
}

/* Parses a JSON object into ev->payload; `what` names the attribute in errors. */
static bool payload_from_json(obx_event_t *ev, const char *json, size_t len, const char *what, obx_err_t *err) {
  size_t i = 0;
  while (i < len && (json[i] == ' ' || json[i] == '\t' || json[i] == '\r' || json[i] == '\n')) i++;
  if (i == len) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: empty", what);
    return false;
  }
  if (json[i] != '{') {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: not a JSON object", what);
    return false;
  }
  bson_error_t berr;
  bson_destroy(&ev->payload);
  if (!bson_init_from_json(&ev->payload, json, (ssize_t)len, &berr)) {
    bson_init(&ev->payload);
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: invalid JSON: %s", what, berr.message);
    return false;
  }
  return true;
}

/* ---- binary-mode Kafka record ----------------------------------------------------------- */

bool obx_event_to_kafka(const obx_event_t *ev, const char *source, obx_kafka_record_t *rec, obx_err_t *err) {
  memset(rec, 0, sizeof *rec);
  const char *src = ev->source ? ev->source : source;
  if (!ev->id[0] || !ev->event_type || !ev->org_id || !ev->aggregate_type || !ev->aggregate_id) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "event is not finalized (id, eventType, orgId, aggregateType and "
                                              "aggregateId are required)");
    return false;
  }
  if (!src || !*src) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "ce_source: missing (the event has no source and none was given)");
    return false;
  }
  const char *pkey = ev->partition_key ? ev->partition_key : ev->aggregate_id;
  char time[32], version[16], key_seq[24];
  obx_time_format_rfc3339(ev->occurred_at_ms, time);
  snprintf(version, sizeof version, "%d", ev->event_version > 0 ? (int)ev->event_version : 1);
  snprintf(key_seq, sizeof key_seq, "%lld", (long long)ev->key_seq);

  struct {
    const char *name, *v1, *v2; /* value = v1 [+ "/" + v2] */
  } h[] = {
    {"ce_specversion", CE_SPECVERSION, NULL},
    {"ce_id", ev->id, NULL},
    {"ce_source", src, NULL},
    {"ce_type", ev->event_type, NULL},
    {"ce_time", time, NULL},
    {"ce_subject", ev->aggregate_type, ev->aggregate_id},
    {"ce_partitionkey", pkey, NULL},
    {"ce_orgid", ev->org_id, NULL},
    {"ce_correlationid", ev->correlation_id, NULL},
    {"ce_causationid", ev->causation_id, NULL},
    {"ce_eventversion", version, NULL},
    {"ce_traceparent", ev->traceparent, NULL},
    {"ce_tracestate", ev->tracestate, NULL},
    {"ce_keyseq", ev->key_seq > 0 ? key_seq : NULL, NULL},
    {"content-type", CE_CONTENT_TYPE, NULL},
  };
  size_t n = sizeof h / sizeof h[0], total = 0;
  for (size_t i = 0; i < n; i++)
    if (h[i].v1) total += strlen(h[i].v1) + (h[i].v2 ? strlen(h[i].v2) + 1 : 0) + 1;
  rec->strings_ = malloc(total);
  if (!rec->strings_) abort();
  char *p = rec->strings_;
  for (size_t i = 0; i < n; i++) {
    if (!h[i].v1) continue;
    int len = h[i].v2 ? sprintf(p, "%s/%s", h[i].v1, h[i].v2) : sprintf(p, "%s", h[i].v1);
    rec->headers[rec->nheaders].name = h[i].name;
    rec->headers[rec->nheaders].value = p;
    rec->headers[rec->nheaders].len = (size_t)len;
    rec->nheaders++;
    p += len + 1;
  }
  rec->key = strdup(pkey);
  rec->key_len = strlen(pkey);
  rec->value = bson_as_relaxed_extended_json(&ev->payload, &rec->value_len);
  if (!rec->value) {
    obx_kafka_record_cleanup(rec);
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "payload: cannot be written as JSON");
    return false;
  }
  return true;
}

void obx_kafka_record_cleanup(obx_kafka_record_t *rec) {
  if (!rec) return;
  free(rec->key);
  bson_free(rec->value);
  free(rec->strings_);
  memset(rec, 0, sizeof *rec);
}

/* The first header named `name`, or NULL. */
static const obx_ce_header_t *find_header(const obx_ce_header_t *headers, int nheaders, const char *name) {
  for (int i = 0; i < nheaders; i++)
    if (headers[i].name && strcmp(headers[i].name, name) == 0) return &headers[i];
  return NULL;
}

bool obx_event_from_kafka(obx_event_t *ev, const void *key, size_t key_len, const void *value, size_t value_len,
                          const obx_ce_header_t *headers, int nheaders, obx_err_t *err) {
  reset(ev);
  attr_t a[A_COUNT] = {{0}};
  for (int i = 0; i < A_COUNT; i++) {
    char name[32];
    snprintf(name, sizeof name, "ce_%s", attr_names[i]);
    const obx_ce_header_t *h = find_header(headers, nheaders, name);
    if (h) {
      a[i].v = h->value ? h->value : "";
      a[i].len = h->value ? h->len : 0;
    }
  }
  if (key && key_len > OBX_EVENT_MAX_ATTR_LEN) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "key: longer than %d bytes", OBX_EVENT_MAX_ATTR_LEN);
    return false;
  }
  if (!a[A_PARTITIONKEY].v && key && key_len) {
    a[A_PARTITIONKEY].v = key;
    a[A_PARTITIONKEY].len = key_len;
  }
  const obx_ce_header_t *ct = find_header(headers, nheaders, "content-type");
  if (ct && ct->value) {
    size_t n = strlen(CE_CONTENT_TYPE);
    if (ct->len < n || strncasecmp(ct->value, CE_CONTENT_TYPE, n) != 0 || (ct->len > n && ((const char *)ct->value)[n] != ';')) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "content-type: '%.*s' is not " CE_CONTENT_TYPE,
                  (int)(ct->len > 64 ? 64 : ct->len), (const char *)ct->value);
      return false;
    }
  }
  if (!decode_attrs(ev, a, "ce_", err)) return false;
  return payload_from_json(ev, value ? value : "", value ? value_len : 0, "payload", err);
}

/* ---- structured-mode JSON --------------------------------------------------------------- */

bool obx_event_from_ce_json(obx_event_t *ev, const char *json, size_t len, obx_err_t *err) {
  reset(ev);
  bson_t doc;
  bson_error_t berr;
  bool ok = false;
  char numbers[2][24]; /* eventversion, keyseq given as JSON integers */
  size_t i = 0;
  while (i < len && (json[i] == ' ' || json[i] == '\t' || json[i] == '\r' || json[i] == '\n')) i++;
  if (i == len || json[i] != '{') {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "cloudevent: not a JSON object");
    return false;
  }
  if (!bson_init_from_json(&doc, json, (ssize_t)len, &berr)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "cloudevent: invalid JSON: %s", berr.message);
    return false;
  }
  attr_t a[A_COUNT] = {{0}};
  bson_iter_t it;
  for (int k = 0; k < A_COUNT; k++) {
    if (!bson_iter_init_find(&it, &doc, attr_names[k]) || BSON_ITER_HOLDS_NULL(&it)) continue;
    if (BSON_ITER_HOLDS_UTF8(&it)) {
      uint32_t l;
      a[k].v = bson_iter_utf8(&it, &l);
      a[k].len = l;
    } else if ((k == A_EVENTVERSION || k == A_KEYSEQ) && (BSON_ITER_HOLDS_INT32(&it) || BSON_ITER_HOLDS_INT64(&it))) {
      snprintf(numbers[k == A_KEYSEQ], sizeof numbers[0], "%lld", (long long)bson_iter_as_int64(&it));
      a[k].v = numbers[k == A_KEYSEQ];
      a[k].len = strlen(a[k].v);
    } else {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "%s: must be a string", attr_names[k]);
      goto done;
    }
  }
  if (bson_iter_init_find(&it, &doc, "datacontenttype")) {
    const char *ct = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    size_t n = strlen(CE_CONTENT_TYPE);
    if (strncasecmp(ct, CE_CONTENT_TYPE, n) != 0 || (ct[n] != '\0' && ct[n] != ';')) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "datacontenttype: '%.64s' is not " CE_CONTENT_TYPE, ct);
      goto done;
    }
  }
  if (bson_iter_init_find(&it, &doc, "data_base64")) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "data_base64: binary data is not supported (want a JSON object in data)");
    goto done;
  }
  if (!decode_attrs(ev, a, "", err)) goto done;
  if (!bson_iter_init_find(&it, &doc, "data")) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "data: missing");
    goto done;
  }
  ok = payload_from_iter(ev, &it, "data", err);
done:
  bson_destroy(&doc);
  return ok;
}
