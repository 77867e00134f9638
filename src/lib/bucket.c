/* bucket.c - Kafka's murmur2, the bucket of a partition key and a bucket's document ids (obx_bucket.h)
 *
 * DESIGN: murmur2 as Kafka's Java clients compute it (MurmurHash2 by Austin Appleby, 32-bit, with
 * Kafka's seed), in unsigned arithmetic so that overflow is defined; the words are read byte by
 * byte in little-endian order, as Java does, whatever the host's byte order. The one formatter
 * and parser of the ids of a bucket's lease and checkpoint. Owns nothing, never touches MongoDB. */
#include "obx/obx_bucket.h"

#include <stdio.h>
#include <string.h>

#define MURMUR2_SEED 0x9747b28cu
#define MURMUR2_M 0x5bd1e995u
#define MURMUR2_R 24

int32_t obx_murmur2(const void *data, size_t len) {
  const uint8_t *p = data;
  uint32_t h = MURMUR2_SEED ^ (uint32_t)len;
  size_t words = len / 4;
  for (size_t i = 0; i < words; i++, p += 4) {
    uint32_t k = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    k *= MURMUR2_M;
    k ^= k >> MURMUR2_R;
    k *= MURMUR2_M;
    h *= MURMUR2_M;
    h ^= k;
  }
  switch (len % 4) {
  case 3: h ^= (uint32_t)p[2] << 16; /* fall through */
  case 2: h ^= (uint32_t)p[1] << 8;  /* fall through */
  case 1:
    h ^= (uint32_t)p[0];
    h *= MURMUR2_M;
  }
  h ^= h >> 13;
  h *= MURMUR2_M;
  h ^= h >> 15;
  return (int32_t)h;
}

int32_t obx_bucket_of(const char *key, size_t len, int32_t buckets) {
  uint32_t positive = (uint32_t)obx_murmur2(key, len) & 0x7fffffffu;
  return buckets > 1 ? (int32_t)(positive % (uint32_t)buckets) : 0;
}

void obx_bucket_id(char *out, size_t len, const char *base, int32_t bucket, int32_t buckets) {
  if (buckets > 1) snprintf(out, len, "%s.%d/%d", base, (int)bucket, (int)buckets);
  else snprintf(out, len, "%s", base);
}

bool obx_bucket_id_parse(const char *id, const char *base, int32_t *bucket, int32_t *buckets) {
  size_t len = strlen(base);
  int b, nb;
  char tail;
  if (!id || strncmp(id, base, len) != 0 || id[len] != '.' || sscanf(id + len + 1, "%d/%d%c", &b, &nb, &tail) != 2 ||
      nb <= 1 || b < 0 || b >= nb)
    return false;
  *bucket = b;
  *buckets = nb;
  return true;
}
