/* obx_worker.h - the worker role: domain events -> inbox -> pipelines, with the retry ladder
 *
 * DESIGN: DESIGN.md §1, §3, §5, §6. Sources: a Kafka consumer group (WORKER_GROUP) on
 * KAFKA_TOPIC, or (WORKER_SOURCE=http) a CloudEvents HTTP sink on the shared HTTP server; and
 * always the RabbitMQ work queue that the retry tiers dead-letter into. Each event goes through
 * one lifecycle, written down state by state, move by move (with the test of each move) in
 * docs/worker-lifecycle.md and followed by src/worker/lifecycle.c (worker_state_t, one function
 * that moves an event and refuses a move the table does not have):
 *   queued behind its key -> decode (malformed -> DLQ with the reason) -> claim the inbox entry
 *   {consumer, eventId} (owner + lease; a finished duplicate is skipped and counted, a live
 *   peer's claim never run here, an expired one taken over) -> parked key? store BLOCKED ->
 *   trigger (OrderConfirmed -> order.post, T -> event.T) -> no enabled pipeline: SKIPPED -> run
 *   the pipeline once -> one transaction, compare-and-set on the claim: execution + emitted
 *   events + inbox status (+ parked key) -> settle (offset commit, ack, HTTP answer). A head of a
 *   parked key that finishes from the work queue hands the key on to its oldest BLOCKED event
 *   (sent to the work queue) or unparks it; these steps are serialised per key in MongoDB,
 *   across worker processes (obx_inbox.h).
 * A transient failure is recorded first (RETRYING with the attempt and the parked key, the
 * intent), then published to the next retry tier (confirmed), then marked sent; after
 * ORDER_POST_ATTEMPTS attempts, or at once for a terminal failure, it goes to the DLQ and the
 * inbox says DEAD. The order is never undone. A Kafka offset is committed only when every
 * earlier offset of its partition has its outcome in the inbox (contiguous commits).
 * Every failure is classified and bounded: each step retries a retriable error at most
 * WORKER_INFRA_ATTEMPTS times within WORKER_INFRA_TIMEOUT, a non-retriable one ends the event;
 * either way it is dead-lettered (x-failure-class malformed | terminal | exhausted | infra,
 * x-reason naming the cause; README "The message format"). A pipeline that ran is never run
 * again because its recording failed: only the recording is retried.
 *
 * Threads: one Kafka poll thread (owns the consumer, the offset trackers and the held partitions), one
 * work-queue thread (owns the AMQP consumer, acks), ORDER_POST_CONCURRENCY runner threads
 * (sched.c), one IO thread (io.c: every http-request call in flight, in a libcurl multi handle).
 * Every event is queued behind the earlier events of its key (partitionKey) and a key is run by
 * one runner at a time, so one key's events run in their writer's keySeq order (else arrival
 * order) while other keys run in parallel; an event whose key's previous keySeq has not settled
 * in the inbox waits for it, holding no runner, up to WORKER_GAP_WAIT (keyseq.c); a run that reaches an http-request call hands it to the IO thread and frees its
 * runner, and goes on on a runner when the call ended, its key held meanwhile. Up to
 * WORKER_MAX_INFLIGHT events (queued, running or waiting for a call) are in flight; a key whose
 * call hangs holds its own queue only. The poll thread
 * never blocks: it reads each partition from the partition's own fetch queue, and when a key
 * holds 64 events (or the worker WORKER_MAX_INFLIGHT) it holds the partition concerned (does not
 * read it; what was prefetched for it stays) until the key is half drained and the worker under
 * three quarters of the bound; polls, heartbeats and commits go on. Runners hand outcomes back
 * through locked lists. */
#ifndef OBX_WORKER_H
#define OBX_WORKER_H

#include <stdbool.h>
#include <stdint.h>
#include <bson/bson.h>
#include "obx_conf.h"
#include "obx_err.h"
#include "obx_http.h"
#include "obx_ladder.h"
#include "obx_mongo.h"

typedef struct obx_worker obx_worker_t;

typedef struct {
  uint64_t consumed;        /* events received from any source */
  uint64_t duplicates;      /* finished duplicates skipped */
  uint64_t malformed;       /* undecodable records sent to the DLQ */
  uint64_t runs_succeeded, runs_failed, runs_skipped;
  uint64_t blocked;         /* events stored BLOCKED behind their key's head */
  uint64_t retries[OBX_CONF_MAX_LIST]; /* publishes per retry tier */
  uint64_t dlq;             /* DLQ publishes */
  uint64_t swept;           /* retries republished by the retry sweep (their tier's message overdue) */
  int64_t lag;              /* Kafka consumer lag over the assigned partitions (-1: unknown) */
  int64_t parked_keys;      /* last count of parked keys (-1: unknown) */
  int64_t paused_partitions; /* Kafka partitions held (not read) because a key's queue or the bound is full */
  /* From librdkafka's statistics (kafka.statistics.interval.ms; -1 while none came): records
   * fetched for the assigned partitions (each fetched once unless something dropped prefetched
   * records), records fetched and not read yet (a held partition's among them), reports read. */
  int64_t fetched_records, prefetched_records;
  uint64_t kafka_stats_reports;
  int64_t in_flight;        /* events queued or running (not those whose outcome is being written) */
  uint64_t revocations;     /* Kafka partition revocations (rebalances that took partitions away) */
} obx_worker_stats_t;

/* Creates and starts the worker from conf (borrowed for the life of the worker). With
 * WORKER_SOURCE=http the sink routes are added to `http` (required then; borrowed). Starts
 * while Kafka, RabbitMQ or MongoDB are down. Returns owned; stop with obx_worker_destroy. */
obx_worker_t *obx_worker_new(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
/* Stops intake, lets the runners finish their current event, commits, frees. NULL is a no-op. */
void obx_worker_destroy(obx_worker_t *worker);
/* The CloudEvents sink's bound port (WORKER_SOURCE=http), 0 in Kafka mode. */
int obx_worker_sink_port(const obx_worker_t *worker);
void obx_worker_stats(obx_worker_t *worker, obx_worker_stats_t *stats);

/* The role table entry of outboxd. */
void *obx_worker_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
void obx_worker_stop(void *worker);

/* Operator operations on the worker's state (replays, key release, dead letters) live in the
 * ops module (obx_ops.h); the worker starts its drain of the parking-lot queue (obx_ops_drain_start). */

#endif
