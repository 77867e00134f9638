/* obx_inbox.h - the worker's inbox (claims per consumer and event) and the parked keys
 *
 * DESIGN: DESIGN.md §3 and §6. Collection `inbox`, one document per (consumer, event):
 *   { _id: {consumer, eventId}, eventType, orgId, partitionKey, status, attempts,
 *     headers: {<CloudEvent header>: <string>}, payload: {...},      // kept for replay
 *     source: {topic, partition, offset} | {kind: "http"|"amqp"}, seq,
 *     receivedAt, processedAt, lastError, executionIds: [...], owner, member, leaseUntil, retrySent,
 *     retryDueAt, retrySwept, retryReplay }
 * status: RECEIVED -> PROCESSING -> DONE | SKIPPED | RETRYING -> ... | DEAD; BLOCKED while the
 * event waits behind the head of its key. processedAt is set when an entry reaches DONE,
 * SKIPPED or DEAD, and the TTL index on it (INBOX_RETENTION) removes finished entries. `seq`
 * orders the entries of one key: the writer's per-key sequence (outbox keySeq, ce_keyseq) when
 * the event carries one, else the Kafka offset, else the receive time (worker_key_order).
 *
 * Collection `parked_keys`: { _id: {consumer, key}, headEventId, since, reason, admitted,
 * releasedBy, sent } exists while the head event of the key is RETRYING or DEAD; later events of the
 * key are stored BLOCKED (admitted counts them) and released one at a time in seq order: the
 * process that finishes the head moves headEventId to the oldest BLOCKED event (releasedBy: the
 * finished head) and sends it to the work queue, or unparks the key when none is left; an
 * operator release does the same. Storing an event BLOCKED, moving the head and unparking are
 * transactions that all write this document, so across worker processes they are serialised
 * per key: an event is never stored BLOCKED behind a key just unparked, and one head is
 * released once.
 *
 * Every function takes the client and database of the caller and an optional session (NULL:
 * outside a transaction). Mongo errors are wrapped with obx_err_from_bson (retriable when
 * transient). */
#ifndef OBX_INBOX_H
#define OBX_INBOX_H

#include <stdbool.h>
#include <stdint.h>
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include "obx_err.h"
#include "obx_event.h"
#include "obx_mongo.h"

typedef enum {
  OBX_INBOX_RECEIVED,
  OBX_INBOX_PROCESSING,
  OBX_INBOX_DONE,
  OBX_INBOX_RETRYING,
  OBX_INBOX_BLOCKED,
  OBX_INBOX_DEAD,
  OBX_INBOX_SKIPPED,
} obx_inbox_status_t;

const char *obx_inbox_status_name(obx_inbox_status_t status);
bool obx_inbox_status_parse(const char *s, obx_inbox_status_t *out);
/* DONE, SKIPPED and DEAD are final (processedAt set). */
bool obx_inbox_status_final(obx_inbox_status_t status);

/* What the worker knows about a received event. Pointers borrowed for the call. */
typedef struct {
  const char *consumer;
  const obx_event_t *event;
  const char *const *header_names; /* CloudEvent headers as received, kept for replay */
  const char *const *header_values;
  int nheaders;
  const char *topic;               /* Kafka source; NULL for other sources */
  int32_t partition;
  int64_t offset;
  const char *source_kind;         /* when topic is NULL: "http", "amqp", ... */
  int64_t seq;                     /* order among the events of the key */
  const char *traceparent;         /* W3C context of the consumer span that stored it; NULL: none */
  const char *owner;               /* claim: the worker process storing it (NULL: no claim) */
  const char *member;              /* claim: its static group member (WORKER_INSTANCE_ID; NULL: none) */
  int64_t lease_ms;                /* claim: leaseUntil = now + lease_ms */
} obx_inbox_entry_t;

/* Inserts the entry as `status` (RECEIVED or BLOCKED). When the event is already there,
 * *inserted is false and *existing holds its status. With a session the entry is looked up
 * before the insert (a duplicate key error would abort the transaction). */
bool obx_inbox_claim(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                     const obx_inbox_entry_t *entry, obx_inbox_status_t status, bool *inserted,
                     obx_inbox_status_t *existing, obx_err_t *err);

/* Inserts n fresh entries RECEIVED with their claims in one unordered insertMany (a poll's
 * records: one round trip); inserted[i] says whether entries[i] went in. An entry that did not
 * (a duplicate, or one refused by libmongoc or the server) is left for obx_inbox_claim, which
 * says why. False with err when the reply cannot say which went in. */
bool obx_inbox_claim_many(mongoc_client_t *client, const char *db, const obx_inbox_entry_t *entries, int n,
                          bool *inserted, obx_err_t *err);

/* Changes the status of an entry. attempts < 0 leaves it; last_error NULL leaves it;
 * execution_id (may be NULL) is appended to executionIds. Final statuses set processedAt;
 * others unset it. OBX_ERR_NOT_FOUND when the entry does not exist. */
bool obx_inbox_set_status(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                          const char *consumer, const char *event_id, obx_inbox_status_t status, int attempts,
                          const char *last_error, const char *execution_id, obx_err_t *err);

/* ---- claims ------------------------------------------------------------------------------
 * An entry that runs is claimed: {owner, leaseUntil}. The owner renews the lease while it runs
 * (obx_inbox_renew); a peer that meets a live claim never runs the event; an expired claim (its
 * owner died or stalled past the lease) is taken over. The owner's status writes are
 * compare-and-set on the claim (owner, status RECEIVED or PROCESSING, the attempts it was
 * claimed with: obx_inbox_set_status_owned), so an owner whose claim was taken over, or a copy
 * of another attempt, records nothing. RETRYING is the intent of a retry: written (with
 * retrySent false and a lease of its own) before the tier publish, then obx_inbox_retry_sent;
 * final statuses end the claim. */

/* The claim a status write is conditional on. */
typedef struct {
  const char *owner;
  int attempts;     /* the entry's attempts when it was claimed */
  int64_t lease_ms; /* RETRYING: the intent's lease (a peer resends the tier copy only past it) */
} obx_inbox_cas_t;

/* Takes the claim of an existing entry met in `status` for owner: sets owner, leaseUntil, status
 * PROCESSING and attempts = set_attempts. attempts >= 0: a retry tier's copy, taken only while
 * the entry has exactly that many attempts (a stale copy is never taken), from RETRYING whatever
 * the intent's lease (the copy exists, so it was published); otherwise, and for every other
 * status, only when no other owner holds a live lease (a process of the same static member too:
 * `member` is recorded, never a right to a live claim). *taken says whether it did. */
bool obx_inbox_take(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                    const char *owner, const char *member, int64_t lease_ms, obx_inbox_status_t status, int attempts,
                    int set_attempts, bool *taken, obx_err_t *err);
/* Takes over the tier publish of a RETRYING entry whose intent's owner went away before it
 * recorded the send (retrySent false, lease expired): owner and a new lease; *taken says
 * whether it did. Then publish and obx_inbox_retry_sent. */
bool obx_inbox_take_resend(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                           const char *owner, int64_t lease_ms, int attempts, bool *taken, obx_err_t *err);
/* Records that the tier copy of RETRYING attempt `attempts` was published (retrySent true, the
 * intent's lease ended) and is due back in the work queue at due_ms (retryDueAt: the retry
 * sweep's mark), a copy of operator replay replay_id (retryReplay; NULL: none); a no-op once the
 * entry moved on. */
bool obx_inbox_retry_sent(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                          int attempts, int64_t due_ms, const char *replay_id, obx_err_t *err);
/* ---- the retry sweep (src/worker/retrysweep.c) --------------------------------------------
 * A RETRYING entry whose tier copy was sent (retrySent) but is past retryDueAt has lost its
 * message, or RabbitMQ holds it (a tier that dead-letters before its exchange is back). */

/* Visits, oldest due first, up to limit of consumer's sent retries due before before_ms (visit
 * returns false to stop). Index inbox_consumer_retry_due. */
bool obx_inbox_retry_overdue(mongoc_client_t *client, const char *db, const char *consumer, int64_t before_ms,
                             int limit, bool (*visit)(void *ctx, const bson_t *entry), void *ctx, obx_err_t *err);
/* Takes the sweep of one overdue retry: compare-and-set on (RETRYING, retrySent, attempts, the
 * retryDueAt it was read with), which moves retryDueAt to next_due_ms and counts retrySwept, so
 * of several processes sweeping at once one republishes it. *taken says whether it did. */
bool obx_inbox_retry_sweep_take(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                                int attempts, int64_t due_ms, int64_t next_due_ms, bool *taken, obx_err_t *err);
/* Whether an event of key is RECEIVED or PROCESSING under a live claim of an owner other than
 * owner (a peer runs an event of the key now). */
bool obx_inbox_key_claimed_elsewhere(mongoc_client_t *client, const char *db, const char *consumer, const char *key,
                                     const char *owner, bool *claimed, obx_err_t *err);
/* Extends the leases of owner's claims on the given events (RECEIVED or PROCESSING; event_ids
 * sorted by strcmp) to now + lease_ms (one write); held (NULL: not asked) then says, per event,
 * whether the claim is still owner's (false: taken over, or the event moved on). */
bool obx_inbox_renew(mongoc_client_t *client, const char *db, const char *consumer, const char *owner,
                     const char (*event_ids)[OBX_UUID_LEN + 1], int n, int64_t lease_ms, bool *held, obx_err_t *err);
/* obx_inbox_set_status, only while cas holds (see above): OBX_ERR_CONFLICT (not retriable)
 * otherwise. From RETRYING (a tier publish that failed) to DEAD when status is DEAD and the
 * entry is RETRYING at cas->attempts + 1 of cas->owner. */
bool obx_inbox_set_status_owned(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                                const char *consumer, const char *event_id, const obx_inbox_cas_t *cas,
                                obx_inbox_status_t status, int attempts, const char *last_error,
                                const char *execution_id, obx_err_t *err);

/* One status write of a finished run (obx_inbox_set_status_owned's arguments). */
typedef struct {
  const char *event_id;
  const obx_inbox_cas_t *cas;
  obx_inbox_status_t status;
  int attempts;
  const char *last_error;
  const char *execution_id;
} obx_inbox_outcome_t;
/* The status writes of n finished runs in one unordered bulk (a group commit's, in its session's
 * transaction), each compare-and-set on its own claim (cas required); written[i] says whether
 * outcomes[i]'s claim held and it was written. One read back in the session when some did not. */
bool obx_inbox_set_status_owned_many(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                                     const char *consumer, const obx_inbox_outcome_t *outcomes, int n, bool *written,
                                     obx_err_t *err);

/* Reads one entry into out (initialised by the caller); *found false when absent. */
bool obx_inbox_get(mongoc_client_t *client, const char *db, mongoc_client_session_t *session, const char *consumer,
                   const char *event_id, bson_t *out, bool *found, obx_err_t *err);

/* Rebuilds the event an entry holds (its headers, key and payload) as the Kafka decoder
 * would. ev must be initialised. */
bool obx_inbox_entry_event(const bson_t *doc, obx_event_t *ev, obx_err_t *err);

/* ---- parked keys ---------------------------------------------------------------------- */

/* *parked and, when parked, head_event_id (may be NULL) of the key. */
bool obx_inbox_key_parked(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                          const char *consumer, const char *key, bool *parked, char head_event_id[OBX_UUID_LEN + 1],
                          obx_err_t *err);
/* Which of n keys are parked (one read): parked[i] for keys[i]. */
bool obx_inbox_keys_parked(mongoc_client_t *client, const char *db, const char *consumer, const char *const *keys,
                           int n, bool *parked, obx_err_t *err);
/* Parks the key (or moves its head) with head_event_id and reason (releasedBy and sent are
 * cleared). */
bool obx_inbox_park_key(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                        const char *consumer, const char *key, const char *head_event_id, const char *reason,
                        obx_err_t *err);
/* The parked_keys document of the key into out (initialised); *found false when not parked. */
bool obx_inbox_key_get(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                       const char *consumer, const char *key, bson_t *out, bool *found, obx_err_t *err);
/* Moves the head of a parked key from from_event_id (finished) to to_event_id, recording
 * releasedBy = from_event_id and sent = false; only when the head still is from_event_id (*moved says whether
 * it was). The conditional update is the per-key lock of a release step: of two processes that
 * finished the same head, one moves it and the other finds it moved. */
bool obx_inbox_move_head(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                         const char *consumer, const char *key, const char *from_event_id, const char *to_event_id,
                         bool *moved, obx_err_t *err);
/* Records that the head moved by obx_inbox_move_head (still head_event_id) was sent to the work
 * queue (sent: true). Until then the finished head that moved it sends it again when it comes
 * back (its process stopped between the move and the send). */
bool obx_inbox_mark_sent(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                         const char *consumer, const char *key, const char *head_event_id, obx_err_t *err);
/* Holds a parked key for one more BLOCKED event: when the key is parked behind a head other
 * than event_id, bumps its `admitted` count and *held is true; otherwise *held is false and
 * nothing is written. Run in the transaction that stores the event BLOCKED: the write makes
 * that transaction and a concurrent unpark (a transaction that found no BLOCKED entry) conflict
 * on the parked_keys document, so one of them runs again and sees the other. */
bool obx_inbox_hold_key(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                        const char *consumer, const char *key, const char *event_id, bool *held, obx_err_t *err);
bool obx_inbox_unpark_key(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                          const char *consumer, const char *key, obx_err_t *err);
/* The oldest BLOCKED entry of the key (lowest seq) into out (initialised); *found false when
 * none. */
bool obx_inbox_next_blocked(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                            const char *consumer, const char *key, bson_t *out, bool *found, obx_err_t *err);
/* { "keys": [ {key, consumer, headEventId, since, reason, blocked: <count>} ... ] } of a
 * consumer (NULL: all). out initialised by the caller. */
bool obx_inbox_list_parked(mongoc_client_t *client, const char *db, const char *consumer, bson_t *out,
                           obx_err_t *err);
/* Number of parked keys of a consumer (for the metric). */
bool obx_inbox_count_parked(mongoc_client_t *client, const char *db, const char *consumer, int64_t *n,
                            obx_err_t *err);

/* ---- keySeq gaps ---------------------------------------------------------------------------- */
/* Whether the consumer's inbox holds the key's event of writer sequence key_seq (an entry whose
 * seq is key_seq and that carries ce_keyseq, so not an offset-ordered one) at an outcome: DONE,
 * SKIPPED, BLOCKED, RETRYING or DEAD (not RECEIVED/PROCESSING: still running somewhere). One
 * index-bounded lookup (inbox_key_status_seq). */
bool obx_inbox_seq_settled(mongoc_client_t *client, const char *db, const char *consumer, const char *key,
                           int64_t key_seq, bool *settled, obx_err_t *err);

#endif
