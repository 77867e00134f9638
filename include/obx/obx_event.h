/* obx_event.h - the domain event envelope, its outbox document and its CloudEvents form
 *
 * DESIGN: obx_event_t is the one in-memory form of a domain event. It maps to
 *  - the outbox document of DESIGN.md §3 (obx_event_to_outbox / obx_event_from_outbox), and
 *  - a Kafka record in CloudEvents 1.0 binary mode (DESIGN.md §4): key = partitionKey,
 *    value = payload as relaxed JSON, headers ce_specversion, ce_id, ce_source, ce_type,
 *    ce_time (RFC 3339, ms), ce_subject (<aggregateType>/<aggregateId>), ce_partitionkey,
 *    ce_orgid, ce_correlationid, ce_causationid, ce_eventversion, content-type, the
 *    CloudEvents distributed-tracing extensions ce_traceparent / ce_tracestate and the
 *    per-key sequence ce_keyseq (the outbox's keySeq) when present.
 *  - CloudEvents structured mode JSON (HTTP sink) via obx_event_from_ce_json.
 * Decoding rejects malformed input (missing required attribute, bad specversion, payload that
 * is not a JSON object, bad time) with an OBX_ERR_INPUT error naming the attribute.
 * Ids are UUIDv7 strings (time-ordered, RFC 9562). */
#ifndef OBX_EVENT_H
#define OBX_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <bson/bson.h>
#include "obx_err.h"

#define OBX_UUID_LEN 36
/* Longest accepted string attribute (partition key, ids, type, ...), in bytes. */
#define OBX_EVENT_MAX_ATTR_LEN 1024

typedef struct {
  char id[OBX_UUID_LEN + 1];  /* event id = CloudEvents id = inbox dedup key */
  char *event_type;           /* "OrderConfirmed" */
  int32_t event_version;      /* >= 1 */
  char *org_id;
  char *aggregate_type;       /* "Order" */
  char *aggregate_id;
  char *partition_key;        /* defaults to aggregate_id */
  char *correlation_id;       /* optional */
  char *causation_id;         /* optional */
  char *source;               /* CloudEvents source, e.g. "/outboxd/orders"; optional in the outbox */
  char *traceparent;          /* W3C trace context of the span that wrote the event; optional */
  char *tracestate;           /* optional; finalize drops invalid values of both (never an error) */
  bson_t payload;             /* a document; owned */
  int64_t occurred_at_ms;     /* ms since the epoch */
  int64_t key_seq;            /* the writer's per-key sequence (outbox keySeq, extension keyseq); 0: none */
} obx_event_t;

/* A Kafka header as produced/consumed (value not NUL-terminated). */
typedef struct {
  const char *name;
  const void *value;
  size_t len;
} obx_ce_header_t;

#define OBX_CE_MAX_HEADERS 24

/* A Kafka record in binary mode. Strings point into `buf` storage owned by the record. */
typedef struct {
  char *key;                 /* partitionKey */
  size_t key_len;
  char *value;               /* payload JSON */
  size_t value_len;
  obx_ce_header_t headers[OBX_CE_MAX_HEADERS];
  int nheaders;
  char *strings_;            /* private storage for header values */
} obx_kafka_record_t;

/* Writes a new UUIDv7 string (36 chars + NUL) into out. Thread-safe; monotonic within a process. */
void obx_uuid7(char out[OBX_UUID_LEN + 1]);
bool obx_uuid_valid(const char *s);

/* init zeroes and creates an empty payload; cleanup frees all fields (safe after init). */
void obx_event_init(obx_event_t *ev);
void obx_event_cleanup(obx_event_t *ev);
/* Copies src into dst, an initialised event whose previous contents are freed (clean dst up). */
void obx_event_copy(obx_event_t *dst, const obx_event_t *src);
/* Fills id (if empty), occurred_at (if 0), partition_key (= aggregate_id if NULL), version (1
 * if 0) and checks the required fields. */
bool obx_event_finalize(obx_event_t *ev, obx_err_t *err);

/* The decoders below (from_outbox, from_kafka, from_ce_json) take an initialised ev, reset it
 * first, and leave it initialised (possibly partly filled) on failure: always clean it up. */

/* Outbox document: the envelope plus status PENDING, attempts 0, availableAt = occurredAt,
 * lastError null. `out` must be initialised by the caller (bson_init). */
bool obx_event_to_outbox(const obx_event_t *ev, bson_t *out, obx_err_t *err);
/* Reads the envelope fields of an outbox document (status fields ignored). */
bool obx_event_from_outbox(obx_event_t *ev, const bson_t *doc, obx_err_t *err);

/* Binary-mode Kafka record; `source` is the ce_source to use when ev->source is NULL.
 * Free with obx_kafka_record_cleanup. */
bool obx_event_to_kafka(const obx_event_t *ev, const char *source, obx_kafka_record_t *rec, obx_err_t *err);
void obx_kafka_record_cleanup(obx_kafka_record_t *rec);
/* Decodes a binary-mode record; headers are looked up by name. */
bool obx_event_from_kafka(obx_event_t *ev, const void *key, size_t key_len, const void *value,
                          size_t value_len, const obx_ce_header_t *headers, int nheaders, obx_err_t *err);
/* Decodes a structured-mode CloudEvent JSON document (application/cloudevents+json). */
bool obx_event_from_ce_json(obx_event_t *ev, const char *json, size_t len, obx_err_t *err);

/* RFC 3339 UTC with milliseconds: "2026-11-29T18:00:00.123Z" (25 bytes incl. NUL). */
void obx_time_format_rfc3339(int64_t ms, char out[32]);
bool obx_time_parse_rfc3339(const char *s, int64_t *ms);
int64_t obx_time_now_ms(void);
/* Milliseconds of CLOCK_MONOTONIC: for intervals and deadlines, never a wall-clock time. */
int64_t obx_time_mono_ms(void);
/* The moment ms milliseconds from now on `clock` (CLOCK_REALTIME, or CLOCK_MONOTONIC for a
 * condition variable set to it), for pthread_cond_timedwait. */
struct timespec obx_time_deadline(clockid_t clock, int64_t ms);

#endif
