/* relay_int.h - state shared by the relay's files (buckets.c, relay.c, stream.c, sweeper.c, keys.c)
 *
 * DESIGN: the relay role is a group (buckets.c) of one obx_relay_t per bucket of the outbox
 * (RELAY_BUCKETS); each obx_relay_t runs the whole relay for its bucket on its own thread: its
 * lease, producer, change stream, sweeper and checkpoint. Everything of an obx_relay_t is owned
 * by its thread; nothing is locked except the counters read by /metrics and the group (atomics),
 * `allowed`, which the group's thread sets, and the change stream's reader (stream.c: a second
 * thread per relay in stream mode that only waits in the stream's getMores and hands what they
 * return over through a bounded queue, so the relay thread never blocks in an awaiting getMore
 * while delivery reports wait). A published event is an obx_relay_msg_t from send to the end of
 * its bookkeeping: in flight (sent, no report) -> reported (report in, outbox not yet updated)
 * -> done (outbox updated, freed). Stream messages also hold a slot of the checkpoint window:
 * an ordered ring of resume tokens, one per change read (and one per empty batch, carrying the
 * postBatchResumeToken); the checkpoint only moves over a prefix of done slots. */
#ifndef OBX_RELAY_INT_H
#define OBX_RELAY_INT_H

#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "obx/obx_bucket.h"
#include "obx/obx_conf.h"
#include "obx/obx_event.h"
#include "obx/obx_http.h"
#include "obx/obx_mongo.h"
#include "obx/obx_relay.h"
#include "obx/obx_trace.h"

typedef struct relay_group relay_group_t; /* buckets.c */

typedef enum { RELAY_FROM_STREAM, RELAY_FROM_SWEEP } relay_from_t;

typedef struct obx_relay_msg {
  char *id;             /* relay_id_key of the document's _id (owned; NULL without one) */
  bson_value_t idv;     /* the _id itself, whatever its BSON type (owned copy) */
  relay_from_t from;
  uint64_t seq;         /* stream: window slot */
  int32_t attempts;     /* attempts recorded before this publish */
  int64_t occurred_ms;  /* commit time used for the commit-to-ack latency */
  bool ok;              /* the delivery report's verdict */
  bool terminal;        /* malformed: FAILED at once */
  bool purged;          /* dropped by a purge (shutdown, step-down): not an attempt */
  bool refused;         /* its outbox update was refused: FAILED by relay_report_refused */
  bool permanent;       /* the error will not go away by retrying: FAILED at once */
  bool as_inserted;     /* stream: its document is the insert's, not read back (keys.c) */
  char *pkey;           /* its partition key while keys.c tracks it (owned) */
  char *shard_key;      /* the document's partitionKey field (owned; NULL without one): in every
                           update's filter, so a sharded outbox routes it to one shard */
  int32_t partition;
  int64_t offset;
  char error[256];
  char traceparent[OBX_TRACEPARENT_LEN + 1]; /* its publish span, for the log lines after the report */
  struct obx_relay_msg *prev, *next; /* in `inflight` until reported, then in `reported` */
} obx_relay_msg_t;

typedef struct {
  obx_relay_msg_t *head, *tail;
  int n;
} relay_list_t;

typedef struct relay_key relay_key_t; /* keys.c */
typedef struct relay_reader relay_reader_t; /* stream.c */

typedef enum { SLOT_INFLIGHT, SLOT_DONE } relay_slot_state_t;

/* Why the change stream was restarted from the current time with a full sweep (stream.c). */
typedef enum {
  RELAY_STREAM_HISTORY_LOST,   /* 286 ChangeStreamHistoryLost: the resume point left the oplog */
  RELAY_STREAM_FATAL,          /* 280 ChangeStreamFatalError: the stream cannot go on from there */
  RELAY_STREAM_INVALID_TOKEN,  /* 260 InvalidResumeToken: the checkpoint's token is refused */
  RELAY_STREAM_INVALIDATED,    /* an invalidate event: the outbox was dropped or renamed */
  RELAY_STREAM_REOPEN_FAILED,  /* RELAY_STREAM_REOPEN_LIMIT opens in a row failed from one token */
  RELAY_STREAM_NCAUSES
} relay_stream_cause_t;

extern const char *const relay_stream_cause_names[RELAY_STREAM_NCAUSES];

typedef struct {
  bson_t *token;
  int64_t cluster_s;    /* cluster time (seconds) of the change, or of the batch end */
  relay_slot_state_t state;
} relay_slot_t;

typedef struct {
  relay_slot_t *slots;
  size_t cap;
  uint64_t first, end;  /* slots [first, end) are live; slot of seq s is slots[s % cap] */
} relay_window_t;

/* The relay's own copy of its metrics (tests read them; metrics.c writes them). */
typedef struct {
  atomic_uint_fast64_t published, publish_errors, failed;
  atomic_uint_fast64_t recoveries[RELAY_STREAM_NCAUSES]; /* change stream restarts by cause */
  atomic_int stream_up, held_keys;
  atomic_int inflight;
  atomic_int leader;
  atomic_int producer;      /* 1 while it has a Kafka producer (it leads the bucket) */
  atomic_int_fast64_t lag_ms;
} relay_counters_t;

typedef struct obx_relay {
  const obx_conf_t *conf; /* borrowed from the caller for the life of the relay */
  char owner[128];      /* the group's host:pid:serial, written into leases and claims */
  bool poll_mode;
  relay_group_t *group; /* the group it belongs to (NULL: a relay a test builds by itself) */
  int32_t bucket, nbuckets;    /* this relay's bucket among RELAY_BUCKETS */
  char lease_id[OBX_BUCKET_ID_LEN]; /* leases._id of its bucket (obx_bucket_id) */
  char ckpt_id[OBX_BUCKET_ID_LEN];  /* relay_checkpoints._id of its bucket */
  atomic_bool allowed;  /* the group lets it hold its bucket (take the lease, or keep it) */
  atomic_int_fast64_t take_at_ms; /* the group saw another relay's lease of it expire then: try at once */

  pthread_t thread;
  bool running;         /* thread started (relay_run) */
  atomic_bool stopping;

  obx_mongo_t *mongo;       /* the group's pool (borrowed) */
  mongoc_client_t *client;
  mongoc_collection_t *outbox, *checkpoints, *leases;
  obx_relay_producer_t *producer;

  /* leadership */
  bool leader;
  bool led;                 /* relay_lead_begin ran for this leadership */
  int64_t epoch;
  int64_t lease_until_ms;   /* our own view: stop publishing after this */
  int64_t next_lease_ms;
  int64_t handover_since_ms; /* handing the bucket over since (0: not) */
  bool lease_lapsed;        /* relay_publish found its view of the lease run out: step down */

  /* change stream */
  mongoc_change_stream_t *stream; /* on the reader's client; read only by the reader thread */
  relay_reader_t *reader;   /* stream mode: the thread waiting in the stream's getMores */
  pthread_mutex_t wake_mu;  /* the producer pointer, for the reader's relay_wake */
  bson_t *read_token;       /* newest token read from the stream (owned) */
  bool caught_up;           /* the last read returned an empty batch */
  int64_t next_stream_open_ms;
  int64_t stream_opened_ms; /* when the open of the current stream was sent (a full sweep's bound) */
  int open_failures;        /* consecutive failed opens or reads since the last good read */
  bson_t *start_after;      /* after an invalidate: open with startAfter this token (owned) */
  bool sweep_due;           /* a restart from now: publish every PENDING event once it is open */
  relay_window_t window;

  /* checkpoint */
  bson_t *ckpt_token;       /* newest token whose window prefix is done (owned) */
  int64_t ckpt_cluster_s;
  bool ckpt_dirty;
  int64_t next_ckpt_ms;

  /* messages */
  relay_list_t inflight_stream, inflight_sweep, reported;
  int64_t first_report_ms;

  int64_t next_sweep_ms;
  int64_t sweep_from_ms;        /* the pass in progress resumes at this availableAt (0: none) */
  int64_t last_claim_until_ms;  /* claimedUntil of the last batch (each batch's is unique) */
  relay_counters_t counters;

  /* per-key order (keys.c) */
  relay_key_t **keys;       /* hash table by partition key */
  int nheld, nqueued;
  int keys_depth;           /* relay_keys_acked calls in progress (it re-enters) */
  bool release_due;

  /* readiness (GET /readyz runs on an HTTP thread) */
  pthread_mutex_t ready_mu;
  bool schema_ready;
  char not_ready[320];      /* why not ready */
} obx_relay_t;

/* buckets.c */
/* The bucket of an outbox document among relay->nbuckets: its `bucket` field when that is an
 * int32 in range, else murmur2 of its partition key (relay_doc_key) mod B (0 without a key). */
int32_t relay_doc_bucket(const obx_relay_t *relay, const bson_t *doc);
/* Whether doc is of relay's bucket (always, with one bucket). */
bool relay_doc_mine(const obx_relay_t *relay, const bson_t *doc);
/* Appends to a query on `outbox` the condition "of this bucket or without a valid bucket"
 * ({field: {$nin: the other buckets}}; nothing with one bucket). field is "bucket" or, in a
 * change stream, "fullDocument.bucket". Documents without a valid bucket still need
 * relay_doc_mine. */
void relay_bucket_filter(const obx_relay_t *relay, bson_t *query, const char *field);
/* The relay of bucket b of a group obx_relay_start returned (tests; NULL for a NULL group).
 * Borrowed until obx_relay_stop (of relay->group). */
obx_relay_t *relay_group_bucket(void *group, int32_t b);
/* A bucket's lease as the group sees it: free (none, expired, or a stale one of its own), held
 * by a relay that is no longer a live member (it expires soon), or by another live relay. */
typedef enum { RELAY_LEASE_FREE, RELAY_LEASE_ORPHAN, RELAY_LEASE_OTHER } relay_lease_state_t;
/* The plan of one turn (buckets.c's table): with `live` relays (this one the me-th in owner
 * order) and nb buckets, of which held[b] are this relay's and state[b] the others' leases,
 * allowed[b] says which it may hold: the surplus over the share is handed over (the highest
 * held buckets), a shortfall is made up with free buckets from me * nb / live on, then with
 * those of relays no longer live, then with buckets live others hold (standing by). Returns the share, ceil(nb / live). Pure. */
int32_t relay_share_plan(int32_t nb, const bool *held, const relay_lease_state_t *state, int live, int me,
                         bool *allowed);
/* The process's relay gauges: sums over the buckets of its group (the lag: the largest). */
typedef struct {
  int held, inflight, stream_up, held_keys, producers;
  int64_t lag_ms;
} relay_gauges_t;
/* Sums the gauges of every bucket of relay's group into *g (metrics.c). */
void relay_group_gauges(const obx_relay_t *relay, relay_gauges_t *g);

/* relay.c */
/* A bucket's relay, on the group's pool and owner, its thread not yet started (no producer
 * until it leads the bucket). */
obx_relay_t *relay_new(const obx_conf_t *conf, obx_mongo_t *mongo, const char *owner, int32_t bucket);
/* Starts its thread. */
bool relay_run(obx_relay_t *relay, obx_err_t *err);
/* Stops its thread as obx_relay_stop says (hand over: reports, checkpoint, lease released). */
void relay_stop(obx_relay_t *relay);
/* /readyz for one bucket's relay: schema, then (holding the bucket) stream and producer. */
bool relay_ready(obx_relay_t *relay, bool check_producer, obx_err_t *err);
/* relay.c */
/* Ensures the relay's collections and indexes (obx_schema.h); keeps the reason for /readyz. */
bool relay_ensure_schema(obx_relay_t *relay);
void relay_list_push(relay_list_t *list, obx_relay_msg_t *msg);
void relay_list_remove(relay_list_t *list, obx_relay_msg_t *msg);
bool relay_inflight_has(const obx_relay_t *relay, const char *id, bool stream_too);
/* The comparison key of doc's _id, any BSON type: 's' + the string, or the type's letter +
 * its canonical extended JSON; NULL when doc has no _id. Owned (free). For logs use key + 1. */
char *relay_id_key(const bson_t *doc);
void relay_msg_free(obx_relay_msg_t *msg);
/* Sets msg->id, msg->idv and msg->shard_key from doc (once). */
void relay_msg_set_id(obx_relay_msg_t *msg, const bson_t *doc);
/* findAndModify returning the new document (sort and extra options, e.g. a write concern, may
 * be NULL): *value (caller-initialised) receives a copy of it, or stays empty when nothing
 * matched. False with err set on a MongoDB error. */
bool relay_find_and_modify(mongoc_collection_t *collection, const bson_t *query, const bson_t *sort,
                           const bson_t *update, bool upsert, const bson_t *extra, bson_t *value, obx_err_t *err);
/* Produces the outbox document `doc` (status PENDING); takes msg. It is in flight until its
 * delivery report; a record that cannot even be sent (malformed event: terminal; full local
 * queue) goes straight to the reported list as a failed attempt. */
void relay_publish(obx_relay_t *relay, const bson_t *doc, obx_relay_msg_t *msg);
/* Serves delivery reports and writes their outbox updates (force: now, else when batched). */
void relay_serve(obx_relay_t *relay, int timeout_ms, bool force);
int relay_pending(const obx_relay_t *relay);
int64_t relay_backoff_ms(int32_t attempts);

/* keys.c */
/* The partition key of an outbox document (partitionKey, else aggregateId); borrowed; NULL. */
const char *relay_doc_key(const bson_t *doc);
/* Publishes doc now, queues it behind its key's event in flight, or (its key held by another
 * event) leaves it PENDING; takes msg. */
void relay_keys_submit(obx_relay_t *relay, const bson_t *doc, obx_relay_msg_t *msg);
/* msg's delivery report: produces the key's next event, or holds the key (a failure). */
void relay_keys_acked(obx_relay_t *relay, obx_relay_msg_t *msg);
/* Publishes the events of released keys (from the loop). */
void relay_keys_tick(obx_relay_t *relay);
/* Releases the keys whose head was skipped or removed (every sweep interval). */
void relay_keys_check(obx_relay_t *relay);
/* Rebuilds the holds from the outbox (becoming the leader); false on a MongoDB error. */
bool relay_keys_load(obx_relay_t *relay);
/* Adds to a sweeper query: not the events of held keys, except their heads. */
void relay_keys_filter(obx_relay_t *relay, bson_t *query);
/* Forgets every key (stepping down): queued events stay PENDING. */
void relay_keys_reset(obx_relay_t *relay);
/* Whether an event of that id waits in the queue of key pkey (NULL: of any key). */
bool relay_keys_queued_has(const obx_relay_t *relay, const char *pkey, const char *id);
/* Whether doc is in flight, reported or queued (stream_too: also what the stream sent). */
bool relay_doc_inflight(const obx_relay_t *relay, const bson_t *doc, bool stream_too);

/* relay.c: makes a wait of the relay thread in obx_relay_producer_poll return now (any thread). */
void relay_wake(obx_relay_t *relay);

/* stream.c */
/* Starts the change stream's reader thread, on a client of its own from the pool (stream mode;
 * once, from the relay thread). False with err when the thread cannot start. */
bool relay_reader_start(obx_relay_t *relay, obx_err_t *err);
/* Closes the stream and stops the reader (the end of relay_main); a no-op without one. */
void relay_reader_stop(obx_relay_t *relay);
void relay_window_init(relay_window_t *window, size_t cap);
void relay_window_cleanup(relay_window_t *window);
/* Appends a slot (token is taken); returns its sequence number. A done slot on an empty window
 * is the checkpoint at once; a done slot after a done tail replaces it. The window must not be
 * full (relay_window_full). */
uint64_t relay_window_push(obx_relay_t *relay, bson_t *token, int64_t cluster_s, relay_slot_state_t state);
bool relay_window_full(const relay_window_t *window);
/* Marks the slot of seq done and moves the checkpoint over the done prefix. */
void relay_window_done(obx_relay_t *relay, uint64_t seq);
/* Forgets every slot (stepping down, lost history); later reports of them are ignored. */
void relay_window_reset(obx_relay_t *relay);
/* Restarts the stream from the current time (startAfter `start_after` when not NULL; taken)
 * and schedules a full sweep: the rule for every error the stream cannot resume from. */
void relay_stream_restart(obx_relay_t *relay, relay_stream_cause_t cause, bson_t *start_after, const char *detail);
/* Opens the stream after relay->read_token (or from now); false when it failed. */
bool relay_stream_open(obx_relay_t *relay);
/* Closes the stream; waits for a getMore of the reader in progress (at most
 * RELAY_STREAM_AWAIT_MS) and drops what it read ahead. */
void relay_stream_close(obx_relay_t *relay);
/* One step of the stream, never blocking on a getMore: opens it when due, handles what the
 * reader read up to the in-flight bound and lets it read on; true when it handled a change. */
bool relay_stream_step(obx_relay_t *relay);

/* metrics.c */
typedef enum {
  RELAY_COUNT_PUBLISHED,
  RELAY_COUNT_PUBLISH_ERROR,
  RELAY_COUNT_FAILED,
} relay_count_t;

/* Registers the relay's metrics in the process registry (idempotent). */
void relay_metrics_register(void);
void relay_metrics_count(obx_relay_t *relay, relay_count_t which);
/* One change stream restart (the alarm outboxd_relay_stream_restarts_total{cause}). */
void relay_metrics_stream_restart(obx_relay_t *relay, relay_stream_cause_t cause);
/* One commit-to-ack latency, in ms. */
void relay_metrics_observe_ack(obx_relay_t *relay, int64_t ms);
/* Sets the leader, in-flight and lag gauges from the relay's state. */
void relay_metrics_gauges(obx_relay_t *relay);

/* sweeper.c */
/* The newest availableAt the periodic sweep may take now (poll mode: now; stream mode: the
 * checkpoint's cluster time less OUTBOX_POLL_INTERVAL_MS). */
int64_t relay_sweep_bound(const obx_relay_t *relay);
/* Claims one batch (up to OUTBOX_BATCH_SIZE, within the in-flight bound) of PENDING events
 * with availableAt <= bound_ms and publishes them; returns how many it found (a pass goes on
 * while relay->sweep_from_ms is not 0), -1 on a MongoDB error. */
int relay_sweep(obx_relay_t *relay, int64_t bound_ms);
/* Becoming the leader: the claims on PENDING events (of a leader that died, or of this relay's
 * earlier leadership) are released, the lease making this relay the only publisher; their keys
 * are held first (relay_keys_load). False on a MongoDB error. */
bool relay_claims_release(obx_relay_t *relay);
/* Publishes every PENDING event that is due, waiting for each batch's reports (recovery:
 * first start, lost history). False when stopped or on an error. */
bool relay_sweep_all(obx_relay_t *relay);

#endif
