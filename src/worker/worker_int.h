/* worker_int.h - private interface between the worker's files (worker.c, sink.c)
 *
 * DESIGN: worker.c owns the threads and handle(); sink.c turns HTTP requests into ladder
 * messages, queues them on the worker's lanes and waits for their outcome. */
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
} worker_outcome_t;

typedef struct {
  atomic_uint_fast64_t consumed, duplicates, malformed, runs_succeeded, runs_failed, runs_skipped, blocked, dlq;
  atomic_uint_fast64_t retries[OBX_CONF_MAX_LIST];
  atomic_int_fast64_t lag, parked_keys;
} worker_stats_t;

typedef struct worker_http_wait worker_http_wait_t;

/* The CloudEvents sink (sink.c): its own listener on worker.sink_port, token-authenticated.
 * Started by the worker in http mode; stopped first when the worker stops (waits for its
 * running requests). */
typedef struct worker_sink worker_sink_t;
worker_sink_t *worker_sink_start(obx_worker_t *w, const obx_conf_t *conf, obx_mongo_t *mongo, obx_err_t *err);
int worker_sink_port(const worker_sink_t *sink);
/* Whether the worker's collections and indexes are in place (its lanes run events only then). */
bool worker_schema_ready(obx_worker_t *w);
void worker_sink_stop(worker_sink_t *sink);

/* Offsets handed to lanes, per partition, in order (offsets.c). */
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

/* Records an offset handed to a lane (increasing per partition; going back starts over). */
void worker_offsets_add(worker_offsets_t *offsets, int32_t partition, int64_t offset);
/* Marks an offset finished; unknown partitions or offsets are ignored. */
void worker_offsets_done(worker_offsets_t *offsets, int32_t partition, int64_t offset);
/* Fills up to max (partition, next offset to commit) pairs whose contiguous finished prefix
 * grew since the last call; returns how many. */
int worker_offsets_advance(worker_offsets_t *offsets, int32_t *partitions, int64_t *next, int max);
/* Every partition's current commit point (to commit again after a failed asynchronous
 * commit); returns how many. */
int worker_offsets_points(const worker_offsets_t *offsets, int32_t *partitions, int64_t *next, int max);
/* True when every handed-out offset is finished (and advanced past). */
bool worker_offsets_idle(const worker_offsets_t *offsets);
void worker_offsets_clear(worker_offsets_t *offsets);

/* Runs one event end to end (see obx_worker.h); msg may be updated (attempts, reason).
 * partition/offset: the Kafka position (-1 otherwise). */
worker_outcome_t worker_handle(obx_worker_t *w, worker_source_t source, obx_ladder_msg_t *msg, int32_t partition,
                               int64_t offset);
/* Queues an HTTP event on its lane; takes msg's contents on success (msg is then empty).
 * The lane calls worker_http_complete(wait, outcome) when done. False when stopping. */
bool worker_enqueue_http(obx_worker_t *w, obx_ladder_msg_t *msg, worker_http_wait_t *wait);
void worker_http_complete(worker_http_wait_t *wait, worker_outcome_t outcome);

#endif
