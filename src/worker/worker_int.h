/* worker_int.h - private interface between the worker's files (worker.c, sched.c, offsets.c, sink.c)
 *
 * DESIGN: worker.c owns the sources' threads and the event's lifecycle (worker_handle); sched.c
 * the per-key queues and the runner threads; offsets.c which Kafka offsets may be committed;
 * sink.c turns HTTP requests into envelopes, queues them and waits for their outcome. */
#ifndef OBX_WORKER_INT_H
#define OBX_WORKER_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "obx/obx_http.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_worker.h"

typedef enum { WORKER_SOURCE_KAFKA, WORKER_SOURCE_WORK, WORKER_SOURCE_HTTP } worker_source_t;

typedef enum {
  WORKER_DONE,      /* pipeline succeeded, recorded */
  WORKER_SKIPPED,   /* no enabled pipeline (or a disabled one), recorded */
  WORKER_DUPLICATE, /* already handled: skipped */
  WORKER_BLOCKED,   /* stored BLOCKED behind its key's head */
  WORKER_RETRYING,  /* published to a retry tier, recorded */
  WORKER_DEAD,      /* published to the DLQ, recorded */
  WORKER_MALFORMED, /* HTTP only: not a CloudEvent (Kafka/AMQP malformed input ends DEAD) */
  WORKER_INFRA,     /* MongoDB or RabbitMQ unavailable: nothing recorded, try again */
  WORKER_LOST,      /* its claim was taken over while it ran: nothing recorded, the peer settles it */
} worker_outcome_t;

typedef struct {
  atomic_uint_fast64_t consumed, duplicates, malformed, runs_succeeded, runs_failed, runs_skipped, blocked, dlq;
  atomic_uint_fast64_t revocations;
  atomic_uint_fast64_t retries[OBX_CONF_MAX_LIST];
  atomic_int_fast64_t lag, parked_keys, paused_partitions;
} worker_stats_t;

typedef struct worker_http_wait worker_http_wait_t;

/* The CloudEvents sink (sink.c): its own listener on worker.sink_port, token-authenticated.
 * Started by the worker in http mode; stopped first when the worker stops (waits for its
 * running requests). */
typedef struct worker_sink worker_sink_t;
worker_sink_t *worker_sink_start(obx_worker_t *w, const obx_conf_t *conf, obx_mongo_t *mongo, obx_err_t *err);
int worker_sink_port(const worker_sink_t *sink);
/* Whether the worker's collections and indexes are in place (its runners run events only then). */
bool worker_schema_ready(obx_worker_t *w);
void worker_sink_stop(worker_sink_t *sink);

/* One event handed from a source to the runners and back: the envelope and where it came from. */
typedef struct worker_job {
  worker_source_t source;
  obx_ladder_msg_t msg;       /* the envelope */
  int32_t partition;          /* from Kafka */
  int64_t offset;
  uint64_t generation;        /* assignment generation the offset belongs to */
  worker_http_wait_t *wait;   /* HTTP: the handler waiting for the outcome */
  worker_outcome_t outcome;
  struct worker_job *next;
} worker_job_t;

/* ---- scheduling (sched.c): per-key queues run by a pool of threads -------------------------- */
typedef struct worker_sched worker_sched_t;
/* Runs a job and hands it on; the scheduler does not touch the job afterwards. */
typedef void (*worker_run_fn)(void *ctx, worker_job_t *job);
/* Starts nthreads runners. Owned; NULL with err set when a thread cannot start. */
worker_sched_t *worker_sched_new(int nthreads, worker_run_fn run, void *ctx, obx_err_t *err);
/* Lets each runner finish its current job, then hands every queued job to left (may be NULL). */
void worker_sched_destroy(worker_sched_t *sched, void (*left)(void *ctx, worker_job_t *job), void *ctx);
/* Queues job behind the earlier jobs of key (takes it); never blocks. *key_depth and *inflight
 * (may be NULL) receive the key's queued + running count and the total after the push. */
void worker_sched_push(worker_sched_t *sched, worker_job_t *job, const char *key, size_t len, int *key_depth,
                       int *inflight);
int worker_sched_key_depth(worker_sched_t *sched, const char *key, size_t len);
int worker_sched_inflight(worker_sched_t *sched);
/* Removes the queued (not started) jobs `which` selects, handing each to `dropped`; returns how
 * many. Called with the scheduler's lock held: the callbacks must not call back into it. */
int worker_sched_drop(worker_sched_t *sched, bool (*which)(void *ctx, const worker_job_t *job),
                      void (*dropped)(void *ctx, worker_job_t *job), void *ctx);

/* Offsets handed to the runners, per partition, in order (offsets.c). */
typedef struct {
  int32_t partition;
  int64_t *offsets;
  bool *done;
  int start, n, cap;
  int64_t committed; /* last commit point handed out (next offset to read), -1 none */
} worker_partition_offsets_t;

typedef struct {
  worker_partition_offsets_t *parts;
  int n;
} worker_offsets_t; /* zero-initialised; worker_offsets_clear frees */

/* Records an offset handed to the runners (increasing per partition; going back starts over). */
void worker_offsets_add(worker_offsets_t *offsets, int32_t partition, int64_t offset);
/* Marks an offset finished; unknown partitions or offsets are ignored. */
void worker_offsets_done(worker_offsets_t *offsets, int32_t partition, int64_t offset);
/* Fills up to max (partition, next offset to commit) pairs whose contiguous finished prefix
 * grew since the last call; returns how many. */
int worker_offsets_advance(worker_offsets_t *offsets, int32_t *partitions, int64_t *next, int max);
/* Every partition's current commit point (to commit again after a failed asynchronous
 * commit); returns how many. */
int worker_offsets_points(const worker_offsets_t *offsets, int32_t *partitions, int64_t *next, int max);
/* The lowest handed-out offset of a partition not finished yet, -1 when none. */
int64_t worker_offsets_pending_low(const worker_offsets_t *offsets, int32_t partition);
/* True when every handed-out offset is finished (and advanced past). */
bool worker_offsets_idle(const worker_offsets_t *offsets);
void worker_offsets_clear(worker_offsets_t *offsets);

/* Runs one event end to end (see obx_worker.h); msg may be updated (attempts, reason).
 * partition/offset: the Kafka position (-1 otherwise). */
worker_outcome_t worker_handle(obx_worker_t *w, worker_source_t source, obx_ladder_msg_t *msg, int32_t partition,
                               int64_t offset);
/* Queues an HTTP event behind the earlier events of its key; takes msg's contents on success
 * (msg is then empty). The runner calls worker_http_complete(wait, outcome) when done. False
 * when stopping. */
bool worker_enqueue_http(obx_worker_t *w, obx_ladder_msg_t *msg, worker_http_wait_t *wait);
void worker_http_complete(worker_http_wait_t *wait, worker_outcome_t outcome);

#endif
