/* worker_int.h - private interface between the worker's files
 *
 * DESIGN: one file per responsibility (the event's states: docs/worker-lifecycle.md):
 *   worker.c     the role's wiring: start, stop, /readyz
 *   kafka.c      the Kafka source: consumer, offsets (offsets.c), held partitions, rebalances
 *   workq.c      the work-queue source (RabbitMQ P.work) and the periodic chores of its thread
 *   sink.c       the HTTP source (CloudEvents sink)
 *   jobs.c       a job between a source and the runners: queued by key, handed back to settle
 *   sched.c      the per-key queues and the runner threads
 *   keyseq.c     a key's gap in keySeq: an event waits (bounded) for its predecessor to settle
 *   io.c         the IO thread: the http-request calls of every event in flight (libcurl multi)
 *   batch.c      the batch threads: claims of fresh events and recordings of finished runs, grouped
 *   lifecycle.c  one event through its states (worker_run_job, worker_handle)
 *   steps.c      bounded retries of one step, publishes to the ladder
 *   claims.c     the claims this process holds, their renewal thread, and the keys whose claim it lost
 *   parking.c    a parked key handed on to its next BLOCKED event
 *   retrysweep.c retries whose tier message did not come back in time, republished to the work queue
 *   stats.c      counters and gauges
 * The worker's state (struct obx_worker) is shared; each field says which thread owns it. */
#ifndef OBX_WORKER_INT_H
#define OBX_WORKER_INT_H

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "obx/obx_envelope.h"
#include "obx/obx_event.h"
#include "obx/obx_http.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_schema.h"
#include "obx/obx_trace.h"
#include "obx/obx_worker.h"

#define INFRA_BACKOFF_MIN_MS 100
#define INFRA_BACKOFF_MAX_MS 5000
#define LOST_KEYS 64 /* keys remembered after their claim was taken over (worker_run_job) */
#define KEYSEQ_SETTLED_SLOTS 4096 /* keys whose last settled keySeq this process remembers (keyseq.c) */
#define CLAIM_BATCH_MAX 500 /* fresh events claimed in one insertMany (batch.c) */
#define RECORD_BATCH_MAX 64 /* finished runs recorded in one transaction (batch.c) */

typedef enum { WORKER_SOURCE_KAFKA, WORKER_SOURCE_WORK, WORKER_SOURCE_HTTP } worker_source_t;

/* The states of one event in this process (docs/worker-lifecycle.md: the transition table;
 * lifecycle.c moves between them, worker_state_move). The first eight are on the way; from
 * WORKER_DONE on they are where a run ends: the outcome its source settles. */
typedef enum {
  WORKER_QUEUED,    /* an envelope from a source, queued behind its key (sched.c) */
  WORKER_DECODED,   /* a CloudEvent; its inbox entry not claimed by this run yet */
  WORKER_CLAIMED,   /* this process holds the inbox entry's claim (owner + leaseUntil, renewed) */
  WORKER_RUNNING,   /* its pipeline is looked up and run, once */
  WORKER_WAITING,   /* its run waits for an http-request call on the IO thread (io.c); no runner held */
  WORKER_RECORDING, /* the run's outcome transaction (compare-and-set on the claim), then a tier or the DLQ */
  WORKER_RELEASING, /* a finished head from the work queue hands its parked key on (parking.c) */
  WORKER_WAITING_GAP, /* its key's earlier event (keySeq - 1) has not settled here: deferred in its key's queue (keyseq.c) */
  WORKER_DONE,      /* pipeline succeeded, recorded */
  WORKER_SKIPPED,   /* no enabled pipeline (or a disabled one), recorded */
  WORKER_DUPLICATE, /* already handled: skipped */
  WORKER_BLOCKED,   /* stored BLOCKED behind its key's head */
  WORKER_RETRYING,  /* published to a retry tier, recorded */
  WORKER_DEAD,      /* published to the DLQ, recorded */
  WORKER_MALFORMED, /* HTTP only: not a CloudEvent (Kafka/AMQP malformed input ends DEAD) */
  WORKER_INFRA,     /* MongoDB or RabbitMQ unavailable: nothing recorded, try again */
  WORKER_LOST,      /* its claim was taken over while it ran: nothing recorded, the peer settles it */
  WORKER_NSTATES
} worker_state_t;

/* What worker_handle returns: WORKER_WAITING (the run goes on in worker_handle_resume after its
 * call), WORKER_DECODED (its claim goes to the claimer, batch.c) or WORKER_RECORDING (its
 * outcome goes to the recorder, batch.c), each going on in worker_handle_resume after the write;
 * or the state the run ended in (WORKER_DONE and after), which its source settles. */
typedef worker_state_t worker_outcome_t;

/* "queued", "decoded", ... "given_back" (WORKER_INFRA), "lost". */
const char *worker_state_name(worker_state_t state);
/* Moves an event from one state to the next: a move the transition table does not allow is a
 * bug (abort); logs it (debug) and counts it (outboxd_worker_transitions_total{from,to}).
 * Returns `to`. id: the event's (may be NULL). */
worker_state_t worker_state_move(const char *id, worker_state_t from, worker_state_t to);

typedef struct {
  atomic_uint_fast64_t consumed, duplicates, malformed, runs_succeeded, runs_failed, runs_skipped, blocked, dlq;
  atomic_uint_fast64_t revocations, swept;
  atomic_uint_fast64_t retries[OBX_CONF_MAX_LIST];
  atomic_int_fast64_t lag, parked_keys, paused_partitions;
  atomic_int_fast64_t fetched_records, prefetched_records; /* librdkafka's statistics, -1: none yet */
  atomic_uint_fast64_t kafka_stats_reports;
} worker_stats_t;

typedef struct worker_http_wait worker_http_wait_t;
typedef struct worker_batcher worker_batcher_t;

/* The CloudEvents sink (sink.c): its own listener on worker.sink_port, token-authenticated.
 * Started by the worker in http mode; stopped first when the worker stops (waits for its
 * running requests). */
typedef struct worker_sink worker_sink_t;
worker_sink_t *worker_sink_start(obx_worker_t *w, const obx_conf_t *conf, obx_mongo_t *mongo, obx_err_t *err);
int worker_sink_port(const worker_sink_t *sink);
/* Whether the worker's collections and indexes are in place (its runners run events only then). */
bool worker_schema_ready(obx_worker_t *w);
void worker_sink_stop(worker_sink_t *sink);

struct worker_event;

/* One event handed from a source to the runners and back: the envelope and where it came from. */
typedef struct worker_job {
  worker_source_t source;
  obx_envelope_t msg;       /* the envelope */
  int32_t partition;          /* from Kafka */
  int64_t offset;
  uint64_t generation;        /* assignment generation the offset belongs to */
  worker_http_wait_t *wait;   /* HTTP: the handler waiting for the outcome */
  worker_outcome_t outcome;
  struct worker_event *event; /* lifecycle.c: the event while its run waits for a call */
  CURL *call;                 /* that call (io.c drives it) */
  CURLcode call_result;       /* and its result, set when it ended */
  void *sched_key;            /* sched.c: the key queue it runs under */
  int64_t key_seq;            /* the writer's per-key sequence (ce_keyseq; set by worker_job_push), 0: none */
  int64_t gap_since;          /* keyseq.c: when it began to wait for its key's event key_seq - 1 (ms), 0: not waiting */
  int64_t gap_backoff;        /* keyseq.c: its next re-check's delay (ms) */
  struct worker_job *next;
} worker_job_t;

typedef worker_job_t job_t;

/* Where an event stands among its key's events (the inbox entry's seq, the order BLOCKED events
 * are released in): the writer's per-key sequence (outbox keySeq, carried as ce_keyseq) when the
 * event has one; else its Kafka offset (which orders a key only while the topic's partition count
 * stays), else the receive time (jobs.c). */
int64_t worker_key_order(int64_t key_seq, int64_t offset);


/* ---- scheduling (sched.c): per-key queues run by a pool of threads -------------------------- */
typedef struct worker_sched worker_sched_t;
/* Runs a job and hands it on (true); the scheduler does not touch the job afterwards. False: the
 * job waits outside (worker_sched_hold, then worker_sched_resume) and its key stays running. */
typedef bool (*worker_run_fn)(void *ctx, worker_job_t *job);
/* Starts nthreads runners. Owned; NULL with err set when a thread cannot start. */
worker_sched_t *worker_sched_new(int nthreads, worker_run_fn run, void *ctx, obx_err_t *err);
/* Lets each runner finish its current job and the held jobs end, then hands every queued job to
 * left (may be NULL). */
void worker_sched_destroy(worker_sched_t *sched, void (*left)(void *ctx, worker_job_t *job), void *ctx);
/* Queues job behind the earlier jobs of key (takes it); never blocks. A job with a key_seq goes
 * before the queued jobs of its key with a higher one (a key's events that arrive out of their
 * write order, from two partitions after the topic grew, run in it), others at the end.
 * *key_depth and *inflight (may be NULL) receive the key's queued + running count and the total
 * after the push. */
void worker_sched_push(worker_sched_t *sched, worker_job_t *job, const char *key, size_t len, int *key_depth,
                       int *inflight);
/* Called by the run callback, which then returns false: the running job may not run yet. It goes
 * back to the head of its key's queue, which no runner takes for wait_ms, or until a job of the
 * key is queued ahead of it (an earlier event of the key came to this process), and the key is no
 * longer running. The job is re-run from the start then. */
void worker_sched_defer(worker_sched_t *sched, worker_job_t *job, int64_t wait_ms);
/* A running job is about to wait outside the runners (its call, io.c): a stopping scheduler keeps
 * its runners until it came back and ended. Called before the job is handed over. */
void worker_sched_hold(worker_sched_t *sched);
/* A held job can go on: queued for the next free runner, ahead of fresh keys; its key stayed
 * running. Any thread. */
void worker_sched_resume(worker_sched_t *sched, worker_job_t *job);
int worker_sched_key_depth(worker_sched_t *sched, const char *key, size_t len);
/* The hash of a business key (FNV-1a, 64 bits): the per-key queues' (sched.c) and the keySeq
 * memory's (keyseq.c). */
uint64_t worker_key_hash(const char *key, size_t len);

/* ---- the IO thread (io.c): every http-request call in flight, in one libcurl multi handle ---- */
typedef struct worker_io worker_io_t;
/* Owned; NULL with err when the multi handle or the thread cannot be made. */
worker_io_t *worker_io_start(worker_sched_t *sched, obx_err_t *err);
/* Drives job->call; when it ends, sets job->call_result and resumes the job (worker_sched_resume).
 * The caller no longer touches the job. */
void worker_io_submit(worker_io_t *io, worker_job_t *job);
/* After worker_sched_destroy (no call left): ends the thread, frees. NULL is a no-op. */
void worker_io_stop(worker_io_t *io);
/* Queued and running jobs, those being recorded left out (worker_sched_recording). */
int worker_sched_inflight(worker_sched_t *sched);
/* A running job's run is over and its outcome goes to be written (the recorder, batch.c): it
 * leaves the in-flight count for the recording one while that holds fewer than cap jobs, so the
 * intake may take another event meanwhile; its key stays running until the job ends, so the
 * key's next event still starts only once this outcome is written. Returns whether it moved. */
bool worker_sched_recording(worker_sched_t *sched, worker_job_t *job, int cap);
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

/* ---- the worker's state ----------------------------------------------------------------- */

/* One assigned partition as the Kafka intake reads it (kafka.c): from its own fetch queue, which
 * librdkafka fills up to queued.max.messages.kbytes / queued.min.messages and then stops
 * fetching for; a held partition is simply not read, so nothing it prefetched is dropped. */
typedef enum {
  INTAKE_READING,    /* read while the worker and the last record's key have room */
  INTAKE_HELD_KEY,   /* the key of its last record holds KEY_QUEUE_CAP events */
  INTAKE_HELD_BOUND, /* records wait while the worker holds WORKER_MAX_INFLIGHT events */
} intake_hold_t;

typedef struct {
  int32_t partition;
  rd_kafka_queue_t *queue; /* its fetch queue, not forwarded to the consumer queue */
  intake_hold_t hold;
  char *key;               /* INTAKE_HELD_KEY: the full key */
  size_t len;
} intake_part_t;

/* One claim this process holds (claims.c). */
typedef struct {
  char id[OBX_UUID_LEN + 1];
  int64_t until; /* the lease last written (claimed or renewed) */
  bool lost;     /* a renewal found it no longer this process's */
} worker_claim_t;

struct obx_worker {
  const obx_conf_t *conf;
  worker_sink_t *sink;      /* http mode: the CloudEvents sink (sink.c) */
  const char *consumer;     /* inbox consumer name = WORKER_GROUP */
  const char *db;
  int max_attempts;
  int infra_attempts;       /* WORKER_INFRA_ATTEMPTS */
  char owner[128];          /* this process's name on its inbox claims: host:pid:uuid */
  const char *member;       /* WORKER_INSTANCE_ID when set (recorded on its claims) */
  int64_t lease_ms;         /* WORKER_LEASE */
  int64_t gap_wait_ms;      /* WORKER_GAP_WAIT: longest wait for a key's missing earlier keySeq; 0: none */
  pthread_mutex_t settled_mu; /* keyseq.c: the keySeq last settled by this process, per key hash slot */
  struct {
    uint64_t key_hash;
    int64_t seq;
  } settled[KEYSEQ_SETTLED_SLOTS];
  pthread_mutex_t claims_mu; /* the events this process runs now (their leases are renewed) */
  worker_claim_t *claims;
  pthread_t renew_thread;   /* the claims' lease renewal (claims.c) */
  pthread_mutex_t renew_mu;
  pthread_cond_t renew_cv;
  bool renew_stop, renew_running;
  struct {
    char *key;
    size_t len;
    uint64_t generation;
  } lost[LOST_KEYS];        /* keys whose claim was taken over (run_job), under claims_mu */
  int nlost;
  int nclaims, claims_cap;
  int64_t infra_timeout_ms; /* WORKER_INFRA_TIMEOUT */
  obx_mongo_t *mongo;
  obx_schema_guard_t *schema; /* runners start once the worker's collections and indexes exist */
  obx_ladder_t *ladder;
  obx_ladder_opts_t ladder_opts;
  obx_egress_t egress;
  bool egress_ok;
  obx_pipeline_cache_t *pipelines; /* enabled pipeline per (org, trigger), PIPELINES_CACHE_TTL */

  worker_sched_t *sched;    /* per-key queues and the runner threads (sched.c) */
  worker_io_t *io;          /* the IO thread of the http-request calls (io.c) */
  worker_batcher_t *claimer;  /* fresh Kafka events' claims, grouped (batch.c) */
  worker_batcher_t *recorder; /* finished runs' outcomes, grouped in one transaction (batch.c) */
  int nrunners;             /* ORDER_POST_CONCURRENCY */
  int max_inflight;         /* WORKER_MAX_INFLIGHT */
  atomic_bool stop;
  atomic_int assigned;      /* partitions of the last assignment; -1 until the group is joined */

  rd_kafka_t *rk;
  pthread_t kafka_thread;
  bool kafka_running;
  worker_offsets_t offsets; /* Kafka thread only */
  int kafka_jobs;           /* Kafka thread only: dispatched, not yet taken back */
  intake_part_t *parts;     /* Kafka thread only: the assigned partitions, read in turns */
  int nparts;
  int nheld;              /* Kafka thread only: how many of them are held */
  int intake_inflight;      /* Kafka thread only: events in flight when last looked at */
  int64_t last_commit_ms;   /* Kafka thread only: the last asynchronous commit */
  rd_kafka_queue_t *consumer_q; /* rebalances, errors and logs (the partitions' records are not forwarded to it) */
  int wake[2];              /* a pipe: the queues' IO events and the runners' completions wake the Kafka thread */
  atomic_bool wake_armed;   /* the Kafka thread waits for a completion (a partition is held) */
  uint64_t generation;      /* bumped on every rebalance; Kafka thread writes, jobs carry it */

  obx_ladder_consumer_t *wq;
  pthread_t wq_thread;
  bool wq_running;

  pthread_mutex_t done_mu;  /* completions handed back by the runners */
  job_t *kafka_done, *wq_done;

  worker_stats_t stats;
  obx_ops_drain_t *drain; /* parking-lot queue -> dead_letters (src/ops/ops_drain.c) */
};


/* ---- jobs (jobs.c) ------------------------------------------------------------------------ */
void worker_job_free(job_t *job);
/* Queues a job behind the earlier ones of its key (never blocks); *key_depth and *inflight
 * (may be NULL) receive the key's depth and the worker's events in flight after the push. */
void worker_job_push(obx_worker_t *w, job_t *job, int *key_depth, int *inflight);
/* Hands a job's outcome back to its source (HTTP: answered and freed; else the source's list). */
void worker_job_complete(obx_worker_t *w, job_t *job);
/* Where a job not being run stands: WORKER_WAITING_GAP when deferred for its key's gap in keySeq
 * (keyseq.c), else WORKER_QUEUED (a source that gives it back moves it from there). */
worker_state_t worker_job_state(const job_t *job);

/* ---- keySeq gaps (keyseq.c) ------------------------------------------------------------------ */
/* Before a job's run: true when it may run now (no keySeq, not from Kafka, WORKER_GAP_WAIT 0, its
 * key's event key_seq - 1 settled in this consumer's inbox, or the wait is up: a warning and
 * outboxd_worker_keyseq_gaps_total{outcome="timeout"}); false when it waits: deferred in its key's
 * queue (worker_sched_defer), the caller returns false to the scheduler. */
bool worker_keyseq_admit(obx_worker_t *w, job_t *job);
/* After a job's run ended in `outcome`: when that is one its key's next keySeq may follow (DONE,
 * SKIPPED, BLOCKED, RETRYING, DEAD: recorded in the inbox), remembers (key, keySeq) so the next
 * one's admission needs no lookup. */
void worker_keyseq_settled(obx_worker_t *w, const job_t *job, worker_outcome_t outcome);

/* ---- the lifecycle (lifecycle.c) ------------------------------------------------------------ */
typedef enum {
  CLAIM_TAKEN, /* this process holds the claim */
  CLAIM_LIVE,  /* a live peer holds it */
  CLAIM_MOVED, /* the entry is no longer in the status (or attempt) it was met in */
} claim_t;

/* What a batch write (batch.c) did for one event of it. */
typedef enum {
  BATCH_NONE,    /* not written in a batch: the event's own path (lifecycle.c) */
  BATCH_WRITTEN, /* written with the others */
  BATCH_LOST,    /* recorder: its claim's compare-and-set did not hold, nothing of it written */
} batch_result_t;

/* One event on its way through worker_handle: what it is, where it came from, what happened. */
typedef struct worker_event {
  obx_worker_t *w;
  worker_source_t source;
  obx_envelope_t *msg;   /* the envelope; attempts, reason and history are updated on it */
  obx_event_t ev;          /* decoded */
  mongoc_client_t *client;
  obx_inbox_entry_t entry;
  char traceparent[OBX_TRACEPARENT_LEN + 1]; /* the consumer span's, stored on the entry */
  const char *names[OBX_ENVELOPE_MAX_HEADERS], *values[OBX_ENVELOPE_MAX_HEADERS];
  bool claimed;            /* an inbox entry exists for it and this process holds its claim */
  obx_inbox_cas_t cas;     /* that claim: every status write of this run is conditional on it */
  worker_state_t state;    /* where it is in its lifecycle (lifecycle.c, event_move) */
  claim_t claim;
  char holder[128];        /* CLAIM_LIVE: the peer */
  /* admit */
  bool blocked, inserted;
  obx_inbox_status_t existing;
  char head[OBX_UUID_LEN + 1];
  /* lookup */
  obx_pipeline_t *pipeline;
  char trigger[160];
  /* run: kept while the run waits for a call (WORKER_WAITING) */
  obx_pipeline_run_t *run;
  obx_span_t *span;        /* the consumer span, open until the event ends */
  char *key;               /* the key its job was queued under (the run may change the headers) */
  /* batched writes (batch.c): the claimer's insert, the recorder's group commit */
  batch_result_t batched;
  worker_outcome_t recorded; /* the outcome the recorder writes (WORKER_DONE, WORKER_SKIPPED) */
  obx_inbox_status_t record_status;
  int record_attempts;
} event_t;

/* The runners' callback (sched.c): one event end to end, then its outcome back to its source;
 * false while its run waits for a call (io.c has the job; the callback runs again to go on). */
bool worker_run_job(void *ctx, job_t *job);
/* The batch writes (batch.c's batch functions, on its threads): each event of jobs[0..n) gets its
 * result in e->batched. */
void worker_claim_batch(obx_worker_t *w, job_t **jobs, int n);
void worker_record_batch(obx_worker_t *w, job_t **jobs, int n);
/* Ends an event in the DLQ (class, cause); see lifecycle.c. */
worker_outcome_t worker_dead_letter(event_t *e, const char *failure_class, const char *cause, bool attempted);

/* ---- batch threads (batch.c) ---------------------------------------------------------------- */
typedef void (*worker_batch_fn)(obx_worker_t *w, job_t **jobs, int n);
/* Starts a thread that writes the jobs submitted to it with fn, up to max at a time. Owned;
 * NULL with err when the thread cannot start. label: "claims", "recordings" (health, metrics). */
worker_batcher_t *worker_batcher_start(obx_worker_t *w, const char *label, worker_batch_fn fn, int max,
                                       obx_err_t *err);
/* Holds job (worker_sched_hold) until it is written, then resumes it (worker_sched_resume). */
void worker_batcher_submit(worker_batcher_t *b, job_t *job);
/* After worker_sched_destroy (nothing held left): ends the thread, frees. NULL is a no-op. */
void worker_batcher_stop(worker_batcher_t *b);

/* ---- bounded steps (steps.c) ---------------------------------------------------------------- */
typedef enum {
  STEP_OK,
  STEP_FAILED,    /* non-retriable error: retrying cannot help */
  STEP_EXHAUSTED, /* retriable, but WORKER_INFRA_ATTEMPTS tries or WORKER_INFRA_TIMEOUT are spent */
  STEP_STOPPED,   /* the worker stops */
} step_result_t;

typedef bool (*step_fn)(void *ctx, obx_err_t *err);

/* Sleeps up to ms unless the worker stops; returns false when stopping. */
bool worker_nap(obx_worker_t *w, int64_t ms);
/* Naps *backoff_ms, then doubles it up to INFRA_BACKOFF_MAX_MS; false when stopping. */
bool worker_nap_backoff(obx_worker_t *w, int64_t *backoff_ms);
step_result_t worker_retry_step(obx_worker_t *w, const char *what, const char *event_id, step_fn fn, void *ctx,
                                int tries, bool finish, obx_err_t *err);
#define PUBLISH_DLQ (-1)
#define PUBLISH_WORK (-2)
/* Publishes to retry tier `tier` (0-based), PUBLISH_DLQ or PUBLISH_WORK, confirmed and bounded. */
step_result_t worker_publish(obx_worker_t *w, const obx_envelope_t *msg, int tier, obx_err_t *err);

/* ---- claims (claims.c) ---------------------------------------------------------------------- */
/* The registry of the claims this process holds: an event is added once claimed and removed
 * when its run has ended; the renewal thread (started before any source, stopped after the
 * runners) extends them all every third of the lease. */
void worker_claims_add(obx_worker_t *w, const char *id);
void worker_claims_remove(obx_worker_t *w, const char *id);
/* Whether the claim of a registered event is lost: a renewal found it no longer this process's,
 * or its lease passed without a renewal. Its run must stop and record nothing. */
bool worker_claim_lost(obx_worker_t *w, const char *id);
bool worker_claims_start(obx_worker_t *w, obx_err_t *err);
void worker_claims_stop(obx_worker_t *w);
/* Whether (key, generation) is remembered as lost; with add, remembers it (the oldest goes). */
bool worker_lost_key(obx_worker_t *w, const char *key, size_t len, uint64_t generation, bool add);
/* Waits, up to two leases, while a peer holds a live claim on an event of key. */
void worker_wait_key_elsewhere(obx_worker_t *w, const char *key);

/* ---- parking (parking.c) -------------------------------------------------------------------- */
/* After an event from the work queue finished: hands its key on when it is the head; false when
 * that cannot be done within the bounds (the message is given back and takes the step later). */
bool worker_release_if_head(event_t *e);

/* ---- the retry sweep (retrysweep.c) --------------------------------------------------------- */
/* Republishes to the work queue each sent retry of this consumer past its due time plus
 * WORKER_RETRY_GRACE, once across replicas (compare-and-set); the work-queue thread calls it. */
void worker_retry_sweep(obx_worker_t *w);

/* ---- sources (kafka.c, workq.c) ------------------------------------------------------------- */
bool worker_kafka_start(obx_worker_t *w, obx_err_t *err);
void worker_kafka_close(obx_worker_t *w);
/* A Kafka job's outcome was handed back (worker_job_complete, any thread): wakes the Kafka thread
 * when it waits for one to read a held partition again. */
void worker_kafka_wake(obx_worker_t *w);
bool worker_wq_start(obx_worker_t *w, obx_err_t *err);
/* Acks or nacks the work-queue messages whose outcome the runners handed back. */
void worker_wq_settle(obx_worker_t *w);

/* ---- numbers (stats.c) ---------------------------------------------------------------------- */
void worker_metrics_init(void);
void worker_count_consumed(obx_worker_t *w, worker_source_t source);
void worker_count_run(obx_worker_t *w, obx_pipeline_status_t status);
void worker_count_retry(obx_worker_t *w, int tier);
void worker_count_dlq(obx_worker_t *w, const char *failure_class);
void worker_count_swept(obx_worker_t *w, int tier);
void worker_count_malformed(obx_worker_t *w);
void worker_count_outcome(obx_worker_t *w, worker_outcome_t outcome);
void worker_count_move(worker_state_t from, worker_state_t to);
/* A wait for a key's missing earlier keySeq ended: "filled" (it settled) or "timeout" (ran without it). */
void worker_count_keyseq_gap(const char *outcome);
void worker_set_lag(obx_worker_t *w, int64_t lag);
void worker_set_parked(obx_worker_t *w, int64_t n);
void worker_set_paused_gauge(obx_worker_t *w);
/* One librdkafka statistics report: records fetched for the assigned partitions, and not read yet. */
void worker_set_fetched(obx_worker_t *w, int64_t fetched, int64_t prefetched);

/* Queues an HTTP event behind the earlier events of its key; takes msg's contents on success
 * (msg is then empty). The runner calls worker_http_complete(wait, outcome) when done. False
 * when stopping. */
bool worker_enqueue_http(obx_worker_t *w, obx_envelope_t *msg, worker_http_wait_t *wait);
void worker_http_complete(worker_http_wait_t *wait, worker_outcome_t outcome);

#endif
