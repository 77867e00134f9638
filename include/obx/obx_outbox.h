/* obx_outbox.h - append domain events to the outbox inside the caller's transaction
 *
 * DESIGN: the public C API for MongoDB services that want outboxd's guarantee: write the
 * business change and its events in the same transaction, and the relay publishes the events
 * to Kafka after the commit (never before, never lost). The outbox document is the public
 * schema described in README ("Outbox document schema (public interface)"), built by
 * obx_event_to_outbox: services in other languages insert the same shape themselves.
 *
 *   bool my_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
 *     ... insert or update the business documents with session ...
 *     return obx_outbox_append(session, outbox, &event, err);
 *   }
 *   obx_mongo_transaction(mongo, my_txn, ctx, &err);   (or mongoc_client_session_with_transaction)
 */
#ifndef OBX_OUTBOX_H
#define OBX_OUTBOX_H

#include <stdbool.h>
#include <mongoc/mongoc.h>
#include "obx_err.h"
#include "obx_event.h"

/* The per-key sequence field of an outbox document: 1, 2, 3... per partitionKey in commit
 * order (int64), written by obx_outbox_append from the `outbox_keys` counter. */
#define OBX_OUTBOX_KEY_SEQ "keySeq"

/* RELAY_BUCKETS (relay.buckets) of the deployment, 1 until set: the `bucket` field of every
 * document obx_outbox_append writes is murmur2(partitionKey) mod it (obx_bucket.h). outboxd sets
 * it from its configuration at start; a service that links libobx calls it once, before its first
 * append, with the value its relays run with. Thread-safe. */
void obx_outbox_set_buckets(int32_t buckets);

/* Inserts event as a PENDING outbox document into `outbox` (the `outbox` collection of the
 * relay's database) within session's transaction. event must be finalized
 * (obx_event_finalize: id, occurredAt, partitionKey, version set) or finalizable: a copy is
 * finalized, event itself is not changed. The document carries keySeq, the key's next
 * sequence number (the `outbox_keys` counter, in the same transaction: appends to one key from
 * concurrent transactions conflict and are retried), and its bucket (obx_outbox_set_buckets). session must be in a transaction (asserted): outside
 * one the append would not be atomic with the business write. Errors: OBX_ERR_INPUT for an
 * incomplete event; MongoDB errors wrapped with obx_err_from_bson (retriable ones mean the
 * transaction should be retried; a duplicate id is obx_err_is_duplicate_key). */
bool obx_outbox_append(mongoc_client_session_t *session, mongoc_collection_t *outbox,
                       const obx_event_t *event, obx_err_t *err);

#endif
