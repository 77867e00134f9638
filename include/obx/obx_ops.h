/* obx_ops.h - the operators' operations: one module (src/ops/) that outboxctl and the HTTP API
 * both call
 *
 * DESIGN: one implementation per operation, so `outboxctl dlq redrive` and POST /api/dlq/redrive
 * do the same thing and leave the same audit_log entry. src/ops/ has one file per
 * responsibility: ops_outbox.c (outbox listing, counts, reprocess), ops_inbox.c (one entry with
 * its executions, replays), ops_keys.c (parked keys), ops_dead_letters.c (the dead_letters store:
 * list, get, redrive, delete, export), ops_drain.c (the worker's drain of the parking-lot queue
 * into that store, and the operators' gauges), ops_audit.c (audit_log write and query),
 * ops_status.c (the system at a glance). src/api/ops_routes.c and src/ctl/ are thin shells
 * over these functions. Nothing here runs a pipeline: replays, releases and redrives publish the
 * stored event to the work queue (confirmed) and the running worker runs it on its key's lane.
 *
 * Org scoping: every function takes `org`; NULL means every org (outboxctl run by an operator),
 * otherwise documents of other orgs are invisible: listing skips them and an id of another org
 * answers OBX_ERR_NOT_FOUND, exactly as an id that does not exist.
 *
 * Dry runs: every mutating operation takes dry_run; a dry run changes nothing (no document, no
 * message, no audit_log entry) and answers what the real run would touch.
 *
 * audit_log: {_id, who, whoFrom, when, action, target, orgId, details}; every real mutation and every
 * export writes one entry (in the transaction of the change when the change is one).
 *
 * Lists answer {items: [...], count: <items in this page>, next: <cursor> | null}: pass `next`
 * back as `after` for the following page. Times in answers are BSON dates, which the JSON
 * renderers of the CLI and the API print as RFC 3339.
 *
 * Mongo errors are wrapped with obx_err_from_bson (retriable when transient). Thread-safe as
 * long as the pool and the ladder are (they are). */
#ifndef OBX_OPS_H
#define OBX_OPS_H

#include <stdbool.h>
#include <stdint.h>
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include "obx_conf.h"
#include "obx_err.h"
#include "obx_http.h"
#include "obx_ladder.h"
#include "obx_mongo.h"

/* The context of an operation. Pointers borrowed for the call. */
typedef struct {
  obx_mongo_t *mongo;
  obx_ladder_t *ladder; /* RabbitMQ publisher; NULL when RabbitMQ is not configured */
  const char *consumer; /* inbox consumer (WORKER_GROUP) */
  const char *who;      /* operator recorded in audit_log */
  const char *who_from; /* where who came from (audit_log whoFrom): "--who", "$OUTBOXCTL_WHO", "$USER",
                           "$LOGNAME", "api key name", "api key hash" (the key has no name), "none" */
} obx_ops_t;

#define OBX_OPS_DEFAULT_LIMIT 50
#define OBX_OPS_MAX_LIMIT 1000

/* One page of a list: at most limit items (0: OBX_OPS_DEFAULT_LIMIT; 1..OBX_OPS_MAX_LIMIT)
 * after the cursor `after` (NULL: from the start). */
typedef struct {
  int limit;
  const char *after;
} obx_ops_page_t;

/* ---- audit_log (ops_audit.c) ------------------------------------------------------------------ */

/* Appends {_id, who: ops->who, whoFrom: ops->who_from, when: now, action, target, orgId: org (null when NULL), details
 * (omitted when NULL)} to audit_log. With session the entry is part of that transaction. */
bool obx_ops_audit(const obx_ops_t *ops, mongoc_client_session_t *session, const char *action, const char *target,
                   const char *org, const bson_t *details, obx_err_t *err);

typedef struct {
  const char *org, *action, *target, *who;
  int64_t since_ms, until_ms; /* 0: no bound */
} obx_ops_audit_filter_t;
/* audit_log entries, newest first, of org (NULL: all). */
bool obx_ops_audit_list(const obx_ops_t *ops, const obx_ops_audit_filter_t *filter, const obx_ops_page_t *page,
                        bson_t *out, obx_err_t *err);

/* ---- outbox and inbox listings (ops_outbox.c) -------------------------------------------------- */

typedef enum { OBX_OPS_OUTBOX, OBX_OPS_INBOX } obx_ops_store_t;

const char *obx_ops_store_name(obx_ops_store_t store);
/* OBX_ERR_INPUT naming the accepted values when status is not one of the store's. */
bool obx_ops_status_check(obx_ops_store_t store, const char *status, obx_err_t *err);
/* The newest documents of a store (outbox: occurredAt, inbox: receivedAt), filtered by status
 * (NULL: any) and org. Inbox payloads and headers are left out (obx_ops_inbox_get has them). */
bool obx_ops_list(const obx_ops_t *ops, obx_ops_store_t store, const char *org, const char *status,
                  const obx_ops_page_t *page, bson_t *out, obx_err_t *err);
/* {"<STATUS>": n, ...} with every status of the store. */
bool obx_ops_counts(const obx_ops_t *ops, obx_ops_store_t store, const char *org, bson_t *out, obx_err_t *err);
/* FAILED -> PENDING (attempts 0, available now, history appended), with its audit entry in one
 * transaction. NOT_FOUND, CONFLICT when not FAILED. out (may be NULL) receives the document as it
 * is (dry run) or as the reprocess left it. */
bool obx_ops_outbox_reprocess(const obx_ops_t *ops, const char *org, const char *id, bool dry_run, bson_t *out,
                              obx_err_t *err);

/* Skips a FAILED event for good (FAILED -> SKIPPED, history entry "skip", audit_log
 * "outbox.skip"): the relay releases its key, whose later events were held behind it. Same
 * dry run, errors and out as obx_ops_outbox_reprocess. */
bool obx_ops_outbox_skip(const obx_ops_t *ops, const char *org, const char *id, bool dry_run, bson_t *out,
                         obx_err_t *err);

/* ---- inbox and replays (ops_inbox.c) ------------------------------------------------------------ */

/* One inbox entry with its executions: out receives {entry: {...}, executions: [{_id, status,
 * steps: [...], ...}]}. NOT_FOUND when absent (in org). */
bool obx_ops_inbox_get(const obx_ops_t *ops, const char *org, const char *event_id, bson_t *out, obx_err_t *err);

typedef struct {
  const char *org, *status, *type, *key, *event_id;
  int64_t since_ms, until_ms;  /* receivedAt bounds; 0: none */
  bool include_finished;       /* DONE and SKIPPED entries are selected only with this */
} obx_ops_replay_filter_t;
typedef void (*obx_ops_progress_fn)(void *ctx, int64_t done, int64_t total);
/* Publishes every selected inbox entry (oldest first) to the work queue as a replay. out
 * receives {replayId, dryRun, count, events: [<first `preview` event ids>]}; the real run writes
 * one audit_log entry "inbox.replay" (target: the replay id) listing the ids. A filter with
 * event_id selects that entry whatever its status and fails NOT_FOUND when it is absent; a
 * filter with a DONE/SKIPPED status and no include_finished is OBX_ERR_INPUT. */
bool obx_ops_inbox_replay(const obx_ops_t *ops, const obx_ops_replay_filter_t *filter, bool dry_run, int preview,
                          obx_ops_progress_fn progress, void *ctx, bson_t *out, obx_err_t *err);

/* ---- parked keys (ops_keys.c) -------------------------------------------------------------------- */

/* {items: [{key, headEventId, since, reason, blocked, orgId}], count, next: null}: the parked keys
 * whose head event belongs to org (NULL: all). */
bool obx_ops_keys_list(const obx_ops_t *ops, const char *org, bson_t *out, obx_err_t *err);
/* Releases a parked key (its oldest BLOCKED event becomes the head and is sent to the work
 * queue; nothing blocked: unparked). out receives {key, dryRun, nextEvent: id | null}.
 * NOT_FOUND when the key is not parked (for org). */
bool obx_ops_key_release(const obx_ops_t *ops, const char *org, const char *key, bool dry_run, bson_t *out,
                         obx_err_t *err);

/* ---- dead letters (ops_dead_letters.c) --------------------------------------------------------- */

/* Collection dead_letters, one document per message the parking-lot queue held:
 *   {_id: "<UUIDv7>", dedupKey: "<messageId>/<redriveCount>/<attempt>/<firstFailureMs>",
 *    eventId, type, orgId, key, failureClass, reason, lastError, attempts, history: [...],
 *    headers: {...}, body: "<payload>", source, firstFailureAt, lastFailureAt, storedAt,
 *    redriveCount, state: "dead" | "redriving" | "redriven", redriveId, redrivenAt}
 * dedupKey is unique: storing the same message twice (a redelivery after a lost ack) is one
 * document. state moves dead -> redriving -> redriven, or back to dead when the publish fails;
 * a redriving document older than OBX_OPS_REDRIVE_STALE_MS (its run died) is dead again for
 * the next redrive. A redriven message that fails again arrives as a new document with
 * redriveCount + 1 (the header OBX_OPS_REDRIVE_COUNT_HEADER travels with it). The collection
 * and its indexes are declared in src/lib/schema.c. */
#define OBX_OPS_REDRIVE_COUNT_HEADER "outboxd-redrive-count"
#define OBX_OPS_REDRIVE_ID_HEADER "outboxd-redrive-id"
#define OBX_OPS_REDRIVE_STALE_MS (10 * 60 * 1000)

/* The document of a parking-lot message (without _id and storedAt). out initialised. */
void obx_ops_dl_from_msg(const obx_envelope_t *msg, bson_t *out);
/* Stores a parking-lot message; *stored false when it was already there (same dedupKey). */
bool obx_ops_dl_store(obx_mongo_t *mongo, const obx_envelope_t *msg, bool *stored, obx_err_t *err);

typedef struct {
  const char *org, *type, *key, *failure_class, *reason, *event_id, *state;
  int64_t since_ms, until_ms;  /* lastFailureAt bounds; 0: none */
  const char *const *ids;      /* dead-letter ids; every one must exist (in org) */
  int nids;
  bool all;                    /* the filter alone, no ids: required to act on everything */
} obx_ops_dl_filter_t;
/* OBX_ERR_INPUT naming the value when failure_class or state is not one of the known ones. */
bool obx_ops_dl_filter_check(const obx_ops_dl_filter_t *filter, obx_err_t *err);
/* Newest failure first. */
bool obx_ops_dl_list(const obx_ops_t *ops, const obx_ops_dl_filter_t *filter, const obx_ops_page_t *page, bson_t *out,
                     obx_err_t *err);
bool obx_ops_dl_get(const obx_ops_t *ops, const char *org, const char *id, bson_t *out, obx_err_t *err);
/* Redrives the selected dead letters that are dead: the ids are read first (the snapshot), then
 * each is marked redriving, published to the work queue (confirmed, attempts 0, history kept,
 * redrive count + 1) and marked redriven with the redrive id. out receives {redriveId, dryRun,
 * count, ids: [...], skipped: n} (skipped: selected but already redriven or being redriven by
 * another run). One audit_log entry "dlq.redrive" (target: the redrive id) lists the ids. */
bool obx_ops_dl_redrive(const obx_ops_t *ops, const obx_ops_dl_filter_t *filter, bool dry_run, bson_t *out,
                        obx_err_t *err);
/* Deletes the selected dead letters: out receives {dryRun, count, ids}; one audit entry
 * "dlq.delete" lists the ids. */
bool obx_ops_dl_delete(const obx_ops_t *ops, const obx_ops_dl_filter_t *filter, bool dry_run, bson_t *out,
                       obx_err_t *err);
/* Hands every selected dead letter (whole document) to emit, oldest first, then records one
 * audit entry "dlq.export" listing the ids. *count receives how many. */
typedef bool (*obx_ops_emit_fn)(void *ctx, const bson_t *doc);
bool obx_ops_dl_export(const obx_ops_t *ops, const obx_ops_dl_filter_t *filter, obx_ops_emit_fn emit, void *ctx,
                       int64_t *count, obx_err_t *err);
/* The dead letters in state dead of org (NULL: all) and the first failure time of the oldest
 * (0 when none). */
bool obx_ops_dl_stats(obx_mongo_t *mongo, mongoc_client_t *client, const char *org, int64_t *count, int64_t *oldest_ms,
                      obx_err_t *err);

/* ---- the drain (ops_drain.c), started by the worker role ----------------------------------------- */

typedef struct obx_ops_drain obx_ops_drain_t;
/* Starts the thread that consumes the parking-lot queue into dead_letters (acking each message
 * only once its document is written) and refreshes the operators' gauges every 5 s. NULL (not
 * an error) when WORKER_DLQ_DRAIN is off. Starts with RabbitMQ or MongoDB down. */
obx_ops_drain_t *obx_ops_drain_start(const obx_conf_t *conf, obx_err_t *err);
void obx_ops_drain_stop(obx_ops_drain_t *drain);

/* ---- status (ops_status.c) ------------------------------------------------------------------------ */

/* {relay: {...}, outbox: {...}, inbox: {...}, deadLetters: {count, oldestAt},
 *  dlq: {depth} | {depth: null, error}, parkedKeys: n, degraded: [<reasons>]}
 * The counts are org's (NULL: every org); the relay and the queue are the system's. degraded
 * lists what an operator must look at (no relay leader, or with RELAY_BUCKETS > 1 buckets
 * without a holder; lag over a minute, dead letters, parked keys, RabbitMQ unreachable).
 * relay: {buckets, leader, epoch, leaseExpiresAt (one bucket) | bucketHolders: [{bucket,
 * holder, epoch, leaseExpiresAt, checkpointAt, checkpointAgeMs}] (several), checkpointAt,
 * checkpointAgeMs (several: the oldest bucket's), members: [{owner, buckets, held, expiresAt}],
 * pending, heldKeys, oldestPendingAt, lagMs}. Fails only when MongoDB fails. */
bool obx_ops_status(const obx_ops_t *ops, const char *org, bson_t *out, obx_err_t *err);

/* ---- HTTP (src/api/ops_routes.c) ----------------------------------------------------------------
 * Registers the operators' routes (README "Operations: API, outboxctl, runbook"), scoped to the API key's org. The
 * operator recorded in audit_log is "apikey:<first 16 hex digits of the key's sha256>". Owns a
 * MongoDB pool and a ladder publisher (connected on first use, kept alive by heartbeats).
 * Returns owned state; conf and http are borrowed until obx_ops_api_stop. */
void *obx_ops_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
void obx_ops_api_stop(void *ops_api);

#endif
