/* test_bucket.c - Kafka's murmur2, the bucket of a partition key and a bucket's ids (src/lib/bucket.c)
 *
 * DESIGN: the hash against the values Kafka's Java clients compute (the cases of Kafka's own
 * UtilsTest.testMurmur2 and more from its Utils.murmur2), the bucket against the masking of
 * Java's partitioner (toPositive, then mod), and, for many keys and bucket counts, against
 * librdkafka's public murmur2 partitioner (rd_kafka_msg_partitioner_murmur2), the one the relay
 * produces with: a key's bucket b of B is the partition Kafka gives it in a topic of B. The ids of a
 * bucket's lease and checkpoint against the strings deployments have stored, and their parse back. */
#include <stdio.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "obx/obx_bucket.h"
#include "obx_test.h"

static void test_murmur2_matches_java(void **state) {
  (void)state;
  static const struct {
    const char *key;
    int32_t want; /* org.apache.kafka.common.utils.Utils.murmur2(key.getBytes(UTF_8)) */
  } cases[] = {
    {"21", -973932308},
    {"foobar", -790332482},
    {"a-little-bit-long-string", -985981536},
    {"a-little-bit-longer-string", -1486304829},
    {"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
    {"abc", 479470107},
    {"1", -1993445489},
    {"12", 126087238},
    {"123", -267702483},
    {"1234", -1614185708},
    {"12345", -1188365604},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t got = obx_murmur2(cases[i].key, strlen(cases[i].key));
    if (got != cases[i].want) fail_msg("murmur2(\"%s\"): got %d want %d", cases[i].key, got, cases[i].want);
  }
}

static void test_bucket_is_the_positive_hash_mod_b(void **state) {
  (void)state;
  static const struct {
    const char *key;
    int32_t buckets, want;
  } cases[] = {
    /* toPositive(-973932308) = 1173551340 = 12 * 97795945 */
    {"21", 12, 0},
    {"21", 7, 1173551340 % 7},
    /* toPositive(-790332482) = 1357151166 */
    {"foobar", 12, 1357151166 % 12},
    {"abc", 12, 479470107 % 12},
    {"abc", 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t got = obx_bucket_of(cases[i].key, strlen(cases[i].key), cases[i].buckets);
    if (got != cases[i].want)
      fail_msg("bucket of \"%s\" among %d: got %d want %d", cases[i].key, cases[i].buckets, got, cases[i].want);
  }
}

static void test_bucket_is_kafkas_partition(void **state) {
  (void)state;
  static const int32_t counts[] = {1, 2, 3, 4, 12, 64, 1024};
  char key[64];
  for (int n = 0; n < 2000; n++) {
    /* lengths 0..40 cover every tail of the word loop; aggregate ids and odd bytes alike */
    int len = n % 41;
    for (int i = 0; i < len; i++) key[i] = (char)("ORD-0123456789abcdefXYZ\x80\xff"[(n * 7 + i * 13) % 25]);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      int32_t got = obx_bucket_of(key, (size_t)len, counts[c]);
      int32_t want = rd_kafka_msg_partitioner_murmur2(NULL, key, (size_t)len, counts[c], NULL, NULL);
      if (got != want) fail_msg("key %d (%d bytes) among %d: got %d, librdkafka's partition %d", n, len, counts[c], got, want);
    }
  }
}

static void test_bucket_ids_are_the_stored_ones(void **state) {
  (void)state;
  static const struct {
    const char *base;
    int32_t bucket, buckets;
    const char *want;
  } cases[] = {
    {OBX_BUCKET_LEASE_ID, 0, 1, "relay"},
    {OBX_BUCKET_CHECKPOINT_ID, 0, 1, "outbox"},
    {OBX_BUCKET_LEASE_ID, 0, 0, "relay"},
    {OBX_BUCKET_LEASE_ID, 0, 3, "relay.0/3"},
    {OBX_BUCKET_CHECKPOINT_ID, 2, 3, "outbox.2/3"},
    {OBX_BUCKET_LEASE_ID, 1023, OBX_BUCKET_MAX, "relay.1023/1024"},
    {OBX_BUCKET_CHECKPOINT_ID, 1023, OBX_BUCKET_MAX, "outbox.1023/1024"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char id[OBX_BUCKET_ID_LEN];
    int32_t b = -1, nb = -1;
    obx_bucket_id(id, sizeof id, cases[i].base, cases[i].bucket, cases[i].buckets);
    if (strcmp(id, cases[i].want) != 0)
      fail_msg("id of %s %d/%d: got \"%s\" want \"%s\"", cases[i].base, cases[i].bucket, cases[i].buckets, id, cases[i].want);
    bool multi = cases[i].buckets > 1;
    if (obx_bucket_id_parse(id, cases[i].base, &b, &nb) != multi)
      fail_msg("parse of \"%s\": got %d want %d", id, !multi, multi);
    if (multi && (b != cases[i].bucket || nb != cases[i].buckets))
      fail_msg("parse of \"%s\": got %d/%d want %d/%d", id, b, nb, cases[i].bucket, cases[i].buckets);
  }
}

static void test_bucket_id_parse_refuses_other_ids(void **state) {
  (void)state;
  static const char *const ids[] = {"relay", "relay.", "relay.0", "relay.0/1", "relay.3/3", "relay.-1/3", "relay.0/3x",
                                    "relay.0/3/", "relayx.0/3", "relay0/3", "outbox.0/3", "relay.a/3", ""};
  int32_t b, nb;
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (obx_bucket_id_parse(ids[i], OBX_BUCKET_LEASE_ID, &b, &nb)) fail_msg("\"%s\" parsed as %d/%d, want refused", ids[i], b, nb);
  if (obx_bucket_id_parse(NULL, OBX_BUCKET_LEASE_ID, &b, &nb)) fail_msg("NULL parsed, want refused");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_murmur2_matches_java),
    cmocka_unit_test(test_bucket_is_the_positive_hash_mod_b),
    cmocka_unit_test(test_bucket_is_kafkas_partition),
    cmocka_unit_test(test_bucket_ids_are_the_stored_ones),
    cmocka_unit_test(test_bucket_id_parse_refuses_other_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
