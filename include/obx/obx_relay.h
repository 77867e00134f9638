/* obx_relay.h - the relay role: outbox change stream (and sweeper) to Kafka
 *
 * DESIGN: the relay owns one thread that reads the `outbox` collection (a change stream on
 * inserts and on updates that set status back to PENDING, plus a sweeper for PENDING events the
 * stream missed), produces each event as a CloudEvents binary-mode record (DESIGN.md §4) with an
 * idempotent (optionally transactional) librdkafka producer, and only after Kafka acknowledges
 * (transactional: commits) marks the event PUBLISHED and
 * advances the resume-token checkpoint in `relay_checkpoints`. The outbox is split into
 * RELAY_BUCKETS buckets (murmur2(partitionKey) mod B, obx_bucket.h), each with its own lease in
 * `leases`, checkpoint and change stream: one publisher per bucket keeps per-key order, and
 * several relays share the buckets through heartbeats in `relay_members` (a fair share each,
 * src/relay/buckets.c); with one bucket one relay publishes and the others stand by. The
 * sweeper's leased claims keep two relays from publishing one event at the same time during a
 * handover. See src/relay/relay.c for a bucket's loop.
 *
 * The producer is exposed on its own so that tests and benchmarks can drive it. */
#ifndef OBX_RELAY_H
#define OBX_RELAY_H

#include <stdbool.h>
#include <stdint.h>
#include "obx_conf.h"
#include "obx_err.h"
#include "obx_event.h"
#include "obx_http.h"

/* ---- the role ----------------------------------------------------------------------------- */

typedef struct obx_relay obx_relay_t;

/* Starts the relay's threads, one per bucket and one sharing them (outboxd's role table). conf is borrowed until obx_relay_stop; http
 * may be NULL (the metrics go to the process registry that GET /metrics renders). The thread creates the outbox indexes (retrying
 * while MongoDB is down), then runs; Kafka being down is not an error. Returns an owned
 * obx_relay_t *, NULL with err on a bad configuration. */
void *obx_relay_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
/* Stops intake, waits up to 5 s for the reports of what is in flight, records them, writes the
 * checkpoints, releases the leases and the membership, frees. NULL is a no-op. */
void obx_relay_stop(void *relay);

/* ---- producer ---------------------------------------------------------------------------- */

typedef struct obx_relay_producer obx_relay_producer_t;

/* One delivery report. Borrowed for the duration of the callback. */
typedef struct {
  void *opaque;        /* as passed to obx_relay_producer_send */
  bool ok;             /* acknowledged by every in-sync replica (acks=all) */
  obx_err_t err;       /* when !ok: the Kafka error, retriable or not */
  int32_t partition;
  int64_t offset;      /* -1 when unknown */
} obx_relay_ack_t;

typedef void (*obx_relay_ack_fn)(const obx_relay_ack_t *ack, void *ctx);

/* The transactional.id of the relay's producer for `bucket` (0 with one bucket): the
 * relay.transactional_id key, else "outboxd-<mongo.db>-<kafka.topic>", then "-<bucket>". */
void obx_relay_transactional_id(const obx_conf_t *conf, int bucket, char *out, size_t len);
/* Creates an idempotent producer (enable.idempotence=true, acks=all,
 * partitioner=murmur2_random, message.timeout.ms=0: no local timeout) for conf->kafka_brokers; conf's `kafka.*` passthrough keys are
 * applied before the guarantees, which they cannot change (without the `kafka.` prefix);
 * librdkafka logs go to ours. With a transactional_id it is transactional: it must be fenced
 * in (obx_relay_producer_fence) before it sends, and a report is ok only once the record's
 * transaction is committed (src/relay/producer.c). `ack` is called from
 * obx_relay_producer_poll on the polling thread, once per sent record. Returns owned. */
obx_relay_producer_t *obx_relay_producer_new(const obx_conf_t *conf, const char *transactional_id,
                                             obx_relay_ack_fn ack, void *ctx, obx_err_t *err);
/* Transactional: init_transactions, once per producer (a no-op after it succeeded, and without a
 * transactional.id): the broker aborts the open transaction of any earlier producer of the
 * transactional.id and fences it, so it can no longer write. Blocks up to timeout_ms; false with
 * err (retriable: call again) when the coordinator did not answer in time. */
bool obx_relay_producer_fence(obx_relay_producer_t *producer, int timeout_ms, obx_err_t *err);
/* Destroys; records still queued get their failed delivery reports first. NULL is a no-op. */
void obx_relay_producer_destroy(obx_relay_producer_t *producer);
/* Queues rec (copied) for `topic`; opaque comes back in the delivery report. A full local
 * queue is a retriable error. */
bool obx_relay_producer_send(obx_relay_producer_t *producer, const char *topic,
                             const obx_kafka_record_t *rec, void *opaque, obx_err_t *err);
/* Serves delivery reports, waiting up to timeout_ms for the first; returns how many events
 * were served. */
int obx_relay_producer_poll(obx_relay_producer_t *producer, int timeout_ms);
/* Makes a wait in obx_relay_producer_poll return now (or the next one, when none is waiting);
 * the one call safe from any thread while the producer lives. */
void obx_relay_producer_wake(obx_relay_producer_t *producer);
/* Records sent and not yet reported (NULL, a bucket not held: 0). */
int obx_relay_producer_pending(const obx_relay_producer_t *producer);
/* Serves reports until nothing is pending or timeout_ms passes; true when nothing is left (NULL:
 * true). */
bool obx_relay_producer_flush(obx_relay_producer_t *producer, int timeout_ms);
/* True after the producer hit a fatal error (a broken sequence, fenced by a newer producer of its
 * transactional.id): it must be destroyed and recreated (NULL: false). */
bool obx_relay_producer_fatal(const obx_relay_producer_t *producer);
/* True for the idempotent producer without a message timeout: it has the gap-less guarantee
 * (enable.gapless.guarantee), so when the broker refuses a record no later record of its
 * partition is written (the producer turns fatal; the later ones fail, purged or out of order). */
bool obx_relay_producer_gapless(const obx_relay_producer_t *producer);
/* Whether a failed report is Kafka refusing that record (an attempt of the event), rather than
 * a purge or the state of a fatal producer (no attempt: it is published again). */
bool obx_relay_producer_refused(const obx_relay_producer_t *producer, const obx_relay_ack_t *ack);
/* Whether the producer reaches a broker and `topic` exists there with a leader for every
 * partition: one Metadata request for all topics (a request naming the topic could create it
 * on a broker with auto.create.topics.enable), answered within timeout_ms. False with err
 * naming the topic, or the brokers and why they cannot be reached. Thread-safe: any thread may
 * call it while the producer lives. NULL: false, "not created yet". */
bool obx_relay_producer_check(obx_relay_producer_t *producer, const char *topic, const char *brokers,
                              int timeout_ms, obx_err_t *err);

#endif
