/* obx_envelope.h - the envelope: the record that carries every event through the worker
 *
 * DESIGN: every source turns its input into an envelope (a Kafka record, a work-queue or DLQ
 * message, an HTTP CloudEvent), so the inbox, the retry tiers, the DLQ and the operator tools
 * see one shape: the CloudEvent in Kafka binary form (ce_* / content-type headers, the record
 * key, the payload as body) plus its delivery history (attempts, failure class, reason, history,
 * source, replay id) and, for a message received from a queue, its delivery tag. How the ladder
 * carries it on AMQP is obx_ladder.h's; how an event becomes one, obx_event.h's
 * (obx_event_to_kafka). Every pointer is owned by the envelope (obx_envelope_cleanup). */
#ifndef OBX_ENVELOPE_H
#define OBX_ENVELOPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "obx_err.h"
#include "obx_event.h"

/* One header limit everywhere: the Kafka decoder, the envelope, the ladder and the inbox keep as many. */
#define OBX_ENVELOPE_MAX_HEADERS OBX_CE_MAX_HEADERS

typedef struct {
  char *name;
  char *value;              /* NUL-terminated; value_len excludes the NUL */
  size_t value_len;
} obx_envelope_header_t;

/* One event on its way: a record, a message or a request. Every pointer is owned by it
 * (obx_envelope_cleanup). */
typedef struct {
  char *message_id;         /* ce_id, or a generated id for malformed records */
  char *key;                /* record key (partitionKey); may be NULL */
  size_t key_len;
  char *body;               /* CloudEvent payload */
  size_t body_len;
  obx_envelope_header_t headers[OBX_ENVELOPE_MAX_HEADERS]; /* CloudEvent headers */
  int nheaders;
  int dropped_headers;      /* headers of the record past OBX_ENVELOPE_MAX_HEADERS (not carried) */
  int attempt;              /* failed attempts so far */
  int64_t first_failure_ms; /* 0: none yet */
  char *last_error;
  char *failure_class;      /* "transient" | "terminal" | "malformed" */
  char *reason;             /* why it is in the DLQ */
  char *history;            /* JSON array, NULL: [] */
  char *source;             /* "topic/partition/offset", optional */
  char *replay_id;          /* operator replay (x-replay: its id): run again even when the inbox says DONE;
                             * NULL for every other message */
  /* Set on messages received from a queue. */
  uint64_t delivery_tag;
  bool redelivered;
  uint64_t epoch_;          /* private: connection the message arrived on */
} obx_envelope_t;

void obx_envelope_init(obx_envelope_t *msg);
void obx_envelope_cleanup(obx_envelope_t *msg);
/* A new NUL-terminated copy of len bytes (which may hold NULs): how every field of an envelope is
 * filled, so obx_envelope_cleanup frees it. */
char *obx_envelope_copy(const void *bytes, size_t len);
/* Appends a header (name and value copied); past OBX_ENVELOPE_MAX_HEADERS it is counted in
 * dropped_headers instead. */
void obx_envelope_add_header(obx_envelope_t *msg, const char *name, size_t name_len, const void *value,
                             size_t value_len);
/* Fills msg (after init) from a Kafka record in binary mode: headers, key and value copied. */
void obx_envelope_from_record(obx_envelope_t *msg, const char *message_id, const void *key, size_t key_len,
                              const void *value, size_t value_len, const obx_ce_header_t *headers, int nheaders);
/* Fills msg (after init) from an event, in the form obx_event_to_kafka gives it. */
bool obx_envelope_from_event(obx_envelope_t *msg, const obx_event_t *ev, obx_err_t *err);
/* Decodes the CloudEvent a message carries (obx_event_from_kafka). ev must be initialised. */
bool obx_envelope_to_event(const obx_envelope_t *msg, obx_event_t *ev, obx_err_t *err);
/* Records one failed attempt: attempt++, first failure time (if unset), last error, class and a
 * history entry. */
void obx_envelope_fail(obx_envelope_t *msg, const char *failure_class, const char *error, int64_t now_ms);
/* Value of a CloudEvent header, or NULL (borrowed from msg). */
const char *obx_envelope_header(const obx_envelope_t *msg, const char *name);
/* The business key the event is ordered by: its ce_partitionkey header, else the record key,
 * else "" (borrowed from msg; *len receives its length). */
const char *obx_envelope_partition_key(const obx_envelope_t *msg, size_t *len);

#endif
