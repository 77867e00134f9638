/* obx_ops.h - operator operations shared by the HTTP API (src/api/ops_routes.c) and outboxctl
 *
 * DESIGN: one implementation per operation, so `outboxctl outbox reprocess` and
 * POST /api/outbox/:id/reprocess do the same thing and leave the same audit_log entry. The
 * context is the worker's operations context (obx_worker_ops_t: MongoDB pool, RabbitMQ ladder,
 * inbox consumer, operator name), so the worker's own operations (DLQ redrive, inbox replay,
 * key release, src/worker/ops.c) are reached through the same value; the functions here add
 * the org scoping the API needs on top of them.
 *
 * Org scoping: every function takes `org`; NULL means every org (outboxctl run by an operator),
 * otherwise documents and messages of other orgs are invisible: listing skips them and an id of
 * another org answers OBX_ERR_NOT_FOUND, exactly as an id that does not exist.
 *
 * Writes made here go to `audit_log` in the same transaction as the change they record:
 *   {_id, who, when, action, target, orgId, details}
 * (action "outbox.reprocess"). obx_ops_audit writes that entry for every operator action, the
 * worker's included. Mongo errors are wrapped with obx_err_from_bson (retriable when
 * transient). Thread-safe as long as the pool and the ladder are (they are). */
#ifndef OBX_OPS_H
#define OBX_OPS_H

#include <stdbool.h>
#include <stdint.h>
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include "obx_conf.h"
#include "obx_err.h"
#include "obx_http.h"
#include "obx_worker.h"

typedef obx_worker_ops_t obx_ops_t;

#define OBX_OPS_DEFAULT_LIMIT 50
#define OBX_OPS_MAX_LIMIT 1000

/* The two event stores an operator lists and counts. */
typedef enum { OBX_OPS_OUTBOX, OBX_OPS_INBOX } obx_ops_store_t;

/* Appends {_id, who: ops->who ("unknown" when empty), when: now, action, target, orgId: org
 * (null when NULL), details (omitted when NULL)} to audit_log. With session the entry is part
 * of that transaction (written on the session's client); without, on a client of ops->mongo. */
bool obx_ops_audit(const obx_ops_t *ops, mongoc_client_session_t *session, const char *action, const char *target,
                   const char *org, const bson_t *details, obx_err_t *err);

/* The collection name of a store ("outbox", "inbox"). */
const char *obx_ops_store_name(obx_ops_store_t store);
/* Checks a status name of a store: PENDING|PUBLISHED|FAILED for the outbox, the inbox statuses
 * of obx_inbox.h for the inbox. OBX_ERR_INPUT naming the accepted values otherwise. */
bool obx_ops_status_check(obx_ops_store_t store, const char *status, obx_err_t *err);

/* Lists documents of a store, newest first (outbox: occurredAt, inbox: receivedAt), at most
 * `limit` (1..OBX_OPS_MAX_LIMIT; 0: OBX_OPS_DEFAULT_LIMIT), filtered by status (NULL: any) and
 * org. The inbox lists the entries of ops->consumer. out (initialised by the caller) receives
 *   {"items": [<document>...], "count": n, "limit": limit}
 * Inbox payloads and headers are left out of listings (`outboxctl inbox show` has them). */
bool obx_ops_list(const obx_ops_t *ops, obx_ops_store_t store, const char *org, const char *status, int limit,
                  bson_t *out, obx_err_t *err);

/* Counts documents of a store by status: out receives {"<STATUS>": n, ...} with every status
 * of the store present (0 when none). */
bool obx_ops_counts(const obx_ops_t *ops, obx_ops_store_t store, const char *org, bson_t *out, obx_err_t *err);

/* Sends a FAILED outbox event back to the relay: status PENDING, attempts 0, availableAt now,
 * lastError null; the previous attempts and lastError are appended to the event's `history`
 * array ({at, action: "reprocess", attempts, lastError, by}). The relay's change stream sees the
 * update and publishes the event again. One transaction with the audit_log entry.
 * OBX_ERR_NOT_FOUND when the id does not exist (in org), OBX_ERR_CONFLICT when the event is not
 * FAILED. out (may be NULL; initialised by the caller) receives the updated document. */
bool obx_ops_outbox_reprocess(const obx_ops_t *ops, const char *org, const char *id, bson_t *out, obx_err_t *err);

/* Replays one stored inbox event (obx_worker_replay_event) after checking that it belongs to
 * org. OBX_ERR_NOT_FOUND when the inbox has no such entry (in org). */
bool obx_ops_inbox_replay(const obx_ops_t *ops, const char *org, const char *event_id, obx_err_t *err);

/* The DLQ message as a document: {id, type, key, orgId, attempts, failureClass, reason,
 * lastError, firstFailureAt, source, headers, history, body}. out initialised by the caller. */
void obx_ops_dlq_msg_to_bson(const obx_ladder_msg_t *msg, bson_t *out);
/* The org of a DLQ message (its ce_orgid header), or NULL. */
const char *obx_ops_dlq_msg_org(const obx_ladder_msg_t *msg);

/* Browses up to `limit` DLQ messages of org (0: OBX_OPS_DEFAULT_LIMIT) without removing them;
 * out (initialised) receives {"items": [...], "count": n}. Needs ops->ladder. */
bool obx_ops_dlq_list(const obx_ops_t *ops, const char *org, int limit, bson_t *out, obx_err_t *err);

/* Redrives DLQ messages of org: the ids given (nids > 0), or all of them (all true). Each id
 * must be a message of org in the DLQ (OBX_ERR_NOT_FOUND otherwise, nothing moved): ids are
 * checked with one browse pass. The move is one obx_worker_dlq_redrive pass with the org (and
 * ids) in its filter, recorded as one audit_log entry. out (initialised) receives
 * {"dryRun": b, "moved": n, "ids": [<ids moved, or that would be>]}. */
bool obx_ops_dlq_redrive(const obx_ops_t *ops, const char *org, const char *const *ids, int nids, bool all,
                         bool dry_run, bson_t *out, obx_err_t *err);

/* The whole system at a glance, for `outboxctl status`:
 *   {relay: {leader, epoch, leaseExpiresAt, leaseValid, checkpointAt, checkpointAgeMs,
 *            pending, oldestPendingAt, lagMs},
 *    outbox: {<STATUS>: n}, inbox: {<STATUS>: n}, dlq: {depth} | {depth: null, error},
 *    parkedKeys: n}
 * lagMs is the age of the oldest PENDING event that is due (0 when none). DLQ depth needs
 * ops->ladder; without it, or when RabbitMQ does not answer, depth is null with the reason.
 * Fails only when MongoDB fails. */
bool obx_ops_status(const obx_ops_t *ops, bson_t *out, obx_err_t *err);

/* ---- HTTP (src/api/ops_routes.c) -------------------------------------------------------------
 * Registers the operators' routes of DESIGN.md §7 on http, scoped to the API key's org:
 *   GET  /api/outbox?status=&limit=      outbox:read       obx_ops_list
 *   POST /api/outbox/:id/reprocess       outbox:reprocess  obx_ops_outbox_reprocess
 *   GET  /api/inbox?status=&limit=       inbox:read        obx_ops_list
 *   POST /api/inbox/:id/replay           inbox:replay      obx_ops_inbox_replay (202)
 *   GET  /api/dlq?limit=                 dlq:read          obx_ops_dlq_list
 *   POST /api/dlq/redrive                dlq:redrive       obx_ops_dlq_redrive; body
 *        {"ids": [...]} or {"all": true}, optional "dryRun": true
 * The operator recorded in audit_log is "apikey:<first 16 hex digits of the key's sha256>" (the
 * start of its line in API_KEYS_FILE). Owns a MongoDB pool and a RabbitMQ ladder publisher
 * (connected on first use, so it starts with RabbitMQ down). Returns owned state, NULL with
 * err on a bad configuration; conf and http are borrowed until obx_ops_api_stop. */
void *obx_ops_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
/* Frees; the HTTP server must be stopped first. NULL is a no-op. */
void obx_ops_api_stop(void *ops_api);

#endif
