/* obx_ladder.h - the RabbitMQ retry ladder and parking-lot DLQ
 *
 * DESIGN: DESIGN.md §6. Topology, declared idempotently on every (re)connect, names built from
 * a prefix P (WORKER_QUEUE_PREFIX, default "outboxd"):
 *   P.retry             direct exchange the worker publishes failed events to
 *   P.retry.<ms>ms      one durable quorum queue per RETRY_LADDER tier, bound to P.retry with
 *                       its own name as routing key; x-message-ttl = the tier delay;
 *                       dead-lettered (at-least-once strategy, overflow reject-publish) through
 *                       the default exchange to P.work when the TTL expires
 *   P.work              durable quorum queue the worker consumes to run retries; a message
 *                       delivered more than OBX_LADDER_WORK_DELIVERY_LIMIT times (given back by
 *                       lost connections, crash loops, infra give-backs) is dead-lettered
 *                       (at-least-once) into P.dlq by RabbitMQ, with x-death reason delivery_limit
 *   P.dlq               durable quorum queue, the parking lot
 * Every queue declares x-delivery-limit (tiers and P.work OBX_LADDER_WORK_DELIVERY_LIMIT, P.dlq
 * OBX_LADDER_DLQ_DELIVERY_LIMIT) instead of inheriting RabbitMQ 4.x's default of 20. A queue
 * that already exists with other arguments is used as it is, with a warning.
 * Tier queues are named by their delay, so changing RETRY_LADDER declares new queues instead of
 * failing on an argument mismatch; old tiers keep draining into P.work.
 *
 * A message carries the CloudEvent in Kafka binary form: the ce_* / content-type headers as
 * AMQP headers (utf8 strings), the payload as the body, message-id = ce_id, plus x-key (the
 * record key), x-attempt (int), x-first-failure-at (RFC 3339), x-last-error, x-failure-class
 * (transient|terminal|malformed), x-history (JSON array of {attempt, at, class, error}),
 * x-reason (DLQ only), x-source ("topic/partition/offset") and x-replay (operator replays: the replay id).
 * Malformed records travel the same way with the headers they had and a generated message-id.
 *
 * Every publish uses publisher confirms (basic.ack/nack awaited with a deadline) and
 * mandatory=true (an unroutable message is an error). Connections are opened by obx_amqp.h (TCP
 * or TLS, heartbeats); the publisher's is serviced by obx_ladder_tick, the consumer's by its
 * wait. A lost connection is reopened with exponential backoff (100 ms doubling to 10 s) on the
 * next call, so the worker starts with RabbitMQ down and catches up. Not thread-safe per object except where
 * said: obx_ladder_t serialises its calls with a mutex; a consumer belongs to one thread.
 *
 * DLQ browsing (list/peek/redrive) uses basic.get without ack on a private channel and closes
 * the channel at the end, so everything not acked is returned to the DLQ; browsing bumps the
 * quorum queue's delivery count of the messages it saw, nothing else. Redrive publishes a
 * message back to P.work with the attempt count reset, waits for the confirm, and only then acks
 * its DLQ copy. */
#ifndef OBX_LADDER_H
#define OBX_LADDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "obx_amqp.h"
#include "obx_envelope.h"
#include "obx_err.h"
#include "obx_event.h"

/* x-delivery-limit of P.work and the tiers, and of P.dlq (never reached: the DLQ is the end). */
#define OBX_LADDER_WORK_DELIVERY_LIMIT 100
#define OBX_LADDER_DLQ_DELIVERY_LIMIT 1000000000
/* AMQP field names are short strings; longer header names are left out of a publish, and so are
 * empty ones (rabbitmq-c cannot consume a message whose headers hold an empty name). */
#define OBX_LADDER_MAX_NAME 128
/* Longest header value a publish carries (a message's headers travel in one AMQP frame). */
#define OBX_LADDER_MAX_VALUE 32768
/* Longest body a DLQ publish carries (well under RabbitMQ's max_message_size); longer ones are cut
 * there (tiers and the work queue carry the whole event). */
#define OBX_LADDER_MAX_BODY (8 * 1024 * 1024)

typedef struct {
  const char *url;          /* AMQP URL, amqp_parse_url syntax; borrowed during _new */
  const char *prefix;       /* queue/exchange name prefix; NULL: "outboxd" */
  const int64_t *tiers_ms;  /* RETRY_LADDER delays; copied */
  int ntiers;
  int confirm_timeout_ms;   /* 0: 5000; also bounds connect, TLS handshake and login */
  obx_amqp_settings_t amqp; /* heartbeat and TLS (obx_amqp_settings_from_conf); zero: defaults */
} obx_ladder_opts_t;

/* Describes, into buf, what a publish cannot carry as it is: a message id that is not a valid
 * AMQP message-id (over 255 bytes or not UTF-8: left out), header values that are not UTF-8
 * (sent as AMQP byte arrays, bytes unchanged), values over OBX_LADDER_MAX_VALUE (cut), names
 * over OBX_LADDER_MAX_NAME or empty (left out), a body over OBX_LADDER_MAX_BODY (cut), headers past the limit. Empty when nothing; returns the
 * length. The worker appends it to a DLQ message's reason. */
size_t obx_ladder_carry_notes(const obx_envelope_t *msg, char *buf, size_t cap);

typedef struct obx_ladder obx_ladder_t;

/* Creates the publisher side. Does not connect: the first call that needs the broker does, so
 * this succeeds with RabbitMQ down. Fails only on a bad URL or bad options. Owned. */
obx_ladder_t *obx_ladder_new(const obx_ladder_opts_t *opts, obx_err_t *err);
void obx_ladder_destroy(obx_ladder_t *ladder);
/* Connects and declares the topology now (respecting the reconnect backoff). */
bool obx_ladder_connect(obx_ladder_t *ladder, obx_err_t *err);
bool obx_ladder_connected(obx_ladder_t *ladder);
/* Services the connection (heartbeats) and reconnects when due; call about once a second. */
void obx_ladder_tick(obx_ladder_t *ladder);
int obx_ladder_ntiers(const obx_ladder_t *ladder);
/* Queue names (borrowed, live as long as the ladder). */
const char *obx_ladder_work_queue(const obx_ladder_t *ladder);
const char *obx_ladder_dlq_queue(const obx_ladder_t *ladder);
const char *obx_ladder_tier_queue(const obx_ladder_t *ladder, int tier);
/* The delay of retry tier `tier` (0-based; past the last, the last's), 0 without tiers. */
int64_t obx_ladder_tier_ms(const obx_ladder_t *ladder, int tier);

/* Publishes to retry tier `tier` (0-based), to the DLQ, or straight to the work queue, and waits
 * for the confirm. One attempt: on a connection problem the error is retriable and the next call
 * reconnects. */
bool obx_ladder_publish_retry(obx_ladder_t *ladder, const obx_envelope_t *msg, int tier, obx_err_t *err);
bool obx_ladder_publish_dlq(obx_ladder_t *ladder, const obx_envelope_t *msg, obx_err_t *err);
bool obx_ladder_publish_work(obx_ladder_t *ladder, const obx_envelope_t *msg, obx_err_t *err);

/* Message counts of a queue (passive declare). */
bool obx_ladder_queue_depth(obx_ladder_t *ladder, const char *queue, uint32_t *messages, obx_err_t *err);

/* DLQ operations. `match` NULL selects every message; visit returns false to stop early. */
typedef bool (*obx_ladder_match_fn)(void *ctx, const obx_envelope_t *msg);
typedef bool (*obx_ladder_visit_fn)(void *ctx, const obx_envelope_t *msg);
/* Browses up to `limit` (0: all) matching messages without removing them. */
bool obx_ladder_dlq_browse(obx_ladder_t *ladder, int limit, obx_ladder_match_fn match, obx_ladder_visit_fn visit,
                           void *ctx, obx_err_t *err);
/* Moves matching messages back to the work queue with attempts reset (x-attempt 0, history
 * kept, x-redriven-at added). dry_run: only counts. *moved receives the count. visit (may be
 * NULL) sees each message before it is moved. */
bool obx_ladder_dlq_redrive(obx_ladder_t *ladder, obx_ladder_match_fn match, void *ctx, bool dry_run,
                            obx_ladder_visit_fn visit, int *moved, obx_err_t *err);
/* Empties the DLQ; *purged receives the count removed. */
bool obx_ladder_dlq_purge(obx_ladder_t *ladder, uint32_t *purged, obx_err_t *err);

/* Consumer of the work queue: its own connection, manual ack, prefetch. Owned by one thread. */
typedef struct obx_ladder_consumer obx_ladder_consumer_t;

obx_ladder_consumer_t *obx_ladder_consumer_new(const obx_ladder_opts_t *opts, int prefetch, obx_err_t *err);
/* The same on the parking-lot queue P.dlq (the dead-letter store's drain, src/ops/ops_drain.c). */
obx_ladder_consumer_t *obx_ladder_dlq_consumer_new(const obx_ladder_opts_t *opts, int prefetch, obx_err_t *err);
void obx_ladder_consumer_destroy(obx_ladder_consumer_t *consumer);
/* Waits up to timeout_ms for the next message. Returns true with *got false on timeout; false
 * on a broker problem (the next call reconnects, after the backoff). msg must be initialised;
 * the caller cleans it up. Unacked messages of a lost connection are redelivered by the broker. */
bool obx_ladder_consumer_next(obx_ladder_consumer_t *consumer, obx_envelope_t *msg, int timeout_ms, bool *got,
                              obx_err_t *err);
/* Settles a message received by this consumer. A message from a connection that has since been
 * lost cannot be settled (the broker redelivers it): the call then succeeds without effect. */
bool obx_ladder_consumer_ack(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, obx_err_t *err);
bool obx_ladder_consumer_nack(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, bool requeue,
                              obx_err_t *err);

#endif
