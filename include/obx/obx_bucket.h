/* obx_bucket.h - the relay's buckets: which one an outbox event belongs to
 *
 * DESIGN: an outbox event's bucket is murmur2(partitionKey) mod RELAY_BUCKETS, with the murmur2
 * of Kafka's Java clients (org.apache.kafka.common.utils.Utils.murmur2: seed 0x9747b28c, the
 * key's bytes as they are, little-endian words) masked to 31 bits as their partitioner does
 * (Utils.toPositive). So bucket b of B holds exactly the keys Kafka's default partitioner would
 * put in partition b of a topic of B partitions, and any language with a Kafka client can compute
 * it. A key lives in one bucket: the unit of the relay's scale-out (src/relay/buckets.c).
 *
 * A bucket's documents: its lease (leases._id) and its checkpoint (relay_checkpoints._id). With
 * one bucket they keep the ids of a relay before buckets, "relay" and "outbox"; with B buckets,
 * bucket b's are "relay.<b>/<B>" and "outbox.<b>/<B>". Existing deployments read these ids: they
 * never change. The relay writes them (src/relay/relay.c), `outboxctl status` reads them
 * (src/ops/ops_status.c). Pure functions, thread-safe. */
#ifndef OBX_BUCKET_H
#define OBX_BUCKET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The outbox document's field (int32), written by obx_outbox_append. */
#define OBX_BUCKET_FIELD "bucket"
/* The largest RELAY_BUCKETS (relay.buckets). */
#define OBX_BUCKET_MAX 1024

/* Kafka's murmur2 of len bytes at data: the signed 32-bit value Java's Utils.murmur2 returns. */
int32_t obx_murmur2(const void *data, size_t len);
/* The bucket of a partition key of len bytes among `buckets` (>= 1):
 * (obx_murmur2(key) & 0x7fffffff) % buckets. */
int32_t obx_bucket_of(const char *key, size_t len, int32_t buckets);

/* The bases of a bucket's document ids, and room enough for an id of either. */
#define OBX_BUCKET_LEASE_ID "relay"
#define OBX_BUCKET_CHECKPOINT_ID "outbox"
#define OBX_BUCKET_ID_LEN 48
/* Writes the id of bucket `bucket` of `buckets` with base OBX_BUCKET_LEASE_ID or
 * OBX_BUCKET_CHECKPOINT_ID into out (len bytes, OBX_BUCKET_ID_LEN is enough): the base itself when
 * buckets <= 1, else "<base>.<bucket>/<buckets>". */
void obx_bucket_id(char *out, size_t len, const char *base, int32_t bucket, int32_t buckets);
/* The bucket and B of an id of a bucket among B > 1 ("<base>.<b>/<B>", 0 <= b < B); false for
 * another id (NULL, the single-bucket id, another base, trailing characters). */
bool obx_bucket_id_parse(const char *id, const char *base, int32_t *bucket, int32_t *buckets);

#endif
