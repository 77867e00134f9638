/* obx_bucket.h - the relay's buckets: which one an outbox event belongs to
 *
 * DESIGN: an outbox event's bucket is murmur2(partitionKey) mod RELAY_BUCKETS, with the murmur2
 * of Kafka's Java clients (org.apache.kafka.common.utils.Utils.murmur2: seed 0x9747b28c, the
 * key's bytes as they are, little-endian words) masked to 31 bits as their partitioner does
 * (Utils.toPositive). So bucket b of B holds exactly the keys Kafka's default partitioner would
 * put in partition b of a topic of B partitions, and any language with a Kafka client can compute
 * it. A key lives in one bucket: the unit of the relay's scale-out (src/relay/buckets.c).
 * Pure functions, thread-safe. */
#ifndef OBX_BUCKET_H
#define OBX_BUCKET_H

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

#endif
