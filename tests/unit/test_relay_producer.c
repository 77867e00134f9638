/* test_relay_producer.c - the relay producer: Java-compatible partitioning, passthrough keys
 *
 * DESIGN: the reference partition is the Java client's (Utils.murmur2 + toPositive, as
 * obx_bucket_of computes it and test_bucket pins to Kafka's own values); librdkafka's
 * murmur2_random partitioner, driven through obx_relay_producer_*, must pick the same partition
 * for every key and partition count. Kafka is librdkafka's in-process mock cluster. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <string.h>

#include "obx/obx_bucket.h"
#include "obx/obx_relay.h"
#include "obx_test.h"

/* Kafka's default partition of key: its bucket among `partitions` (obx_bucket.h), whose murmur2
 * test_bucket pins to the Java client's values. */
static int32_t ref_partition(const char *key, int partitions) { return obx_bucket_of(key, strlen(key), partitions); }

/* ---- producing to the mock cluster ----------------------------------------------------- */

typedef struct {
  int32_t partition[64];
  int64_t offset[64];
  bool ok[64];
  obx_err_t err[64];
  int acked;
} acks_t;

static void on_ack(const obx_relay_ack_t *ack, void *ctx) {
  acks_t *acks = ctx;
  intptr_t i = (intptr_t)ack->opaque;
  acks->partition[i] = ack->partition;
  acks->offset[i] = ack->offset;
  acks->ok[i] = ack->ok;
  acks->err[i] = ack->err;
  acks->acked++;
}

/* A host producer that never connects and a mock cluster of one broker on it; *host destroyed
 * after the cluster. */
static rd_kafka_mock_cluster_t *mock_cluster(rd_kafka_t **host) {
  char why[256];
  rd_kafka_conf_t *host_conf = rd_kafka_conf_new();
  rd_kafka_conf_set(host_conf, "log_level", "2", why, sizeof why);
  *host = rd_kafka_new(RD_KAFKA_PRODUCER, host_conf, why, sizeof why);
  assert_non_null(*host);
  rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(*host, 1);
  assert_non_null(mc);
  return mc;
}

/* A producer reporting into acks (cleared), or the test fails. */
static obx_relay_producer_t *producer_into(const obx_conf_t *conf, const char *transactional_id, acks_t *acks) {
  obx_err_t err = OBX_ERR_INIT;
  memset(acks, 0, sizeof *acks);
  obx_relay_producer_t *producer = obx_relay_producer_new(conf, transactional_id, on_ack, acks, &err);
  if (!producer) fail_msg("producer_new%s%s: %s", transactional_id ? " " : "", transactional_id ? transactional_id : "",
                          err.msg);
  return producer;
}

/* A record of key and the value {}. */
static obx_kafka_record_t record_of(const char *key) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  rec.key = (char *)key;
  rec.key_len = strlen(key);
  rec.value = "{}";
  rec.value_len = 2;
  return rec;
}

static const char *const keys[] = {
  "21", "foobar", "abc", "a-little-bit-long-string", "ORD-000001", "ORD-000002", "ORD-424242",
  "0193f2a4-7c1e-7b3a-9f00-0a1b2c3d4e5f", "org-1/Order/77", "S\xc3\xa3o Paulo", "x",
  "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
};
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

static void test_partition_matches_java(void **state) {
  static const int partition_counts[] = {1, 3, 7, 12, 64};
  rd_kafka_t *host;
  rd_kafka_mock_cluster_t *mc = mock_cluster(&host);

  obx_conf_t conf;
  memset(&conf, 0, sizeof conf);
  conf.kafka_brokers = (char *)rd_kafka_mock_cluster_bootstraps(mc);
  obx_conf_pair_t pass[] = {{"kafka.linger.ms", "1"}, {"amqp.heartbeat", "10"}};
  conf.passthrough = pass;
  conf.npassthrough = 2;

  for (size_t t = 0; t < sizeof partition_counts / sizeof partition_counts[0]; t++) {
    int n = partition_counts[t];
    char topic[32];
    snprintf(topic, sizeof topic, "murmur-%d", n);
    assert_int_equal(rd_kafka_mock_topic_create(mc, topic, n, 1), RD_KAFKA_RESP_ERR_NO_ERROR);

    acks_t acks;
    obx_err_t err = OBX_ERR_INIT;
    obx_relay_producer_t *producer = producer_into(&conf, NULL, &acks);
    for (int i = 0; i < NKEYS; i++) {
      obx_kafka_record_t rec = record_of(keys[i]);
      if (!obx_relay_producer_send(producer, topic, &rec, (void *)(intptr_t)i, &err))
        fail_msg("send %s: %s", keys[i], err.msg);
    }
    assert_int_equal(obx_relay_producer_pending(producer), NKEYS);
    if (!obx_relay_producer_flush(producer, 30000))
      fail_msg("flush: %d reports missing", obx_relay_producer_pending(producer));
    assert_int_equal(acks.acked, NKEYS);
    for (int i = 0; i < NKEYS; i++) {
      if (!acks.ok[i]) fail_msg("key %s to %s: not acknowledged", keys[i], topic);
      int32_t want = ref_partition(keys[i], n);
      if (acks.partition[i] != want)
        fail_msg("key %s with %d partitions: got partition %d want %d", keys[i], n, acks.partition[i], want);
    }
    obx_relay_producer_destroy(producer);
  }
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(host);
}

static void test_bad_passthrough_key_is_named(void **state) {
  static const struct { const char *key, *value, *want_in_msg; } cases[] = {
    {"kafka.no.such.property", "1", "kafka.no.such.property"},
    {"kafka.linger.ms", "soon", "kafka.linger.ms=soon"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_conf_t conf;
    memset(&conf, 0, sizeof conf);
    conf.kafka_brokers = "127.0.0.1:1";
    obx_conf_pair_t pass = {(char *)cases[i].key, (char *)cases[i].value};
    conf.passthrough = &pass;
    conf.npassthrough = 1;
    obx_err_t err = OBX_ERR_INIT;
    obx_relay_producer_t *producer = obx_relay_producer_new(&conf, NULL, on_ack, NULL, &err);
    if (producer) fail_msg("%s=%s: got a producer, want an error", cases[i].key, cases[i].value);
    assert_int_equal(err.domain, OBX_ERR_CONF);
    if (!strstr(err.msg, cases[i].want_in_msg))
      fail_msg("error message: got \"%s\", want it to contain \"%s\"", err.msg, cases[i].want_in_msg);
  }
}

/* kafka.acks=0 or 1 and kafka.enable.idempotence=false cannot weaken the producer: the
 * guarantees are set after the passthrough. acks=0 would report no offset; with idempotence
 * still on, librdkafka refuses more than 5 requests in flight. A transactional producer keeps its
 * own transactional.id whatever kafka.transactional.id says, and reports a record only once its
 * transaction is committed. */
static void test_passthrough_cannot_override_guarantees(void **state) {
  rd_kafka_t *host;
  rd_kafka_mock_cluster_t *mc = mock_cluster(&host);
  assert_int_equal(rd_kafka_mock_topic_create(mc, "forced", 1, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
  obx_conf_t conf;
  memset(&conf, 0, sizeof conf);
  conf.kafka_brokers = (char *)rd_kafka_mock_cluster_bootstraps(mc);
  obx_conf_pair_t acks0[] = {{"kafka.acks", "0"}, {"kafka.enable.idempotence", "false"}};
  conf.passthrough = acks0;
  conf.npassthrough = 2;
  acks_t acks;
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_producer_t *producer = producer_into(&conf, NULL, &acks);
  obx_kafka_record_t rec = record_of("k");
  for (intptr_t i = 0; i < 2; i++) assert_true(obx_relay_producer_send(producer, "forced", &rec, (void *)i, &err));
  assert_true(obx_relay_producer_flush(producer, 20000));
  assert_int_equal(acks.acked, 2);
  for (int i = 0; i < 2; i++) {
    assert_true(acks.ok[i]);
    if (acks.offset[i] != i) fail_msg("record %d: got offset %lld want %d (acknowledged by the broker)", i,
                                      (long long)acks.offset[i], i);
  }
  obx_relay_producer_destroy(producer);

  /* transactional, with acks=1 and another transactional.id passed through */
  obx_conf_pair_t acks1[] = {{"kafka.acks", "1"}, {"kafka.enable.idempotence", "false"}, {"kafka.transactional.id", "other"}};
  conf.passthrough = acks1;
  conf.npassthrough = 3;
  producer = producer_into(&conf, "obx-unit-txn-0", &acks);
  if (obx_relay_producer_send(producer, "forced", &rec, (void *)0, &err)) fail_msg("sent before it was fenced in");
  if (!obx_relay_producer_fence(producer, 20000, &err)) fail_msg("fence: %s", err.msg);
  for (intptr_t i = 0; i < 2; i++) assert_true(obx_relay_producer_send(producer, "forced", &rec, (void *)i, &err));
  assert_int_equal(acks.acked, 0);
  assert_true(obx_relay_producer_flush(producer, 20000)); /* commits */
  assert_int_equal(acks.acked, 2);
  for (int i = 0; i < 2; i++) if (!acks.ok[i]) fail_msg("transactional record %d: %s", i, acks.err[i].msg);
  obx_relay_producer_destroy(producer);

  obx_conf_pair_t inflight[] = {{"kafka.enable.idempotence", "false"}, {"kafka.max.in.flight", "10"}};
  conf.passthrough = inflight;
  conf.npassthrough = 2;
  producer = obx_relay_producer_new(&conf, NULL, on_ack, &acks, &err);
  if (producer) fail_msg("enable.idempotence=false with 10 in flight: got a producer, want idempotence kept on");
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(host);
}

static void test_undeliverable_record_reports_failure(void **state) {
  /* A broker that never answers: the record times out and comes back as a failed report. */
  obx_conf_t conf;
  memset(&conf, 0, sizeof conf);
  conf.kafka_brokers = "127.0.0.1:1";
  obx_conf_pair_t pass[] = {{"kafka.message.timeout.ms", "300"}};
  conf.passthrough = pass;
  conf.npassthrough = 1;
  acks_t acks;
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_producer_t *producer = producer_into(&conf, NULL, &acks);
  obx_kafka_record_t rec = record_of("k");
  assert_true(obx_relay_producer_send(producer, "t", &rec, (void *)(intptr_t)0, &err));
  assert_true(obx_relay_producer_flush(producer, 20000));
  assert_int_equal(acks.acked, 1);
  assert_false(acks.ok[0]);
  assert_int_equal(acks.err[0].domain, OBX_ERR_KAFKA);
  assert_int_equal(acks.err[0].code, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
  obx_relay_producer_destroy(producer);
}

static void test_record_waits_out_an_outage(void **state) {
  /* A record produced while the broker is down is held (neither acknowledged nor failed) and
   * acknowledged once the broker is back. */
  rd_kafka_t *host;
  rd_kafka_mock_cluster_t *mc = mock_cluster(&host);
  assert_int_equal(rd_kafka_mock_topic_create(mc, "outage", 2, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
  obx_conf_t conf;
  memset(&conf, 0, sizeof conf);
  conf.kafka_brokers = (char *)rd_kafka_mock_cluster_bootstraps(mc);
  acks_t acks;
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_producer_t *producer = producer_into(&conf, NULL, &acks);
  assert_int_equal(rd_kafka_mock_broker_set_down(mc, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
  obx_kafka_record_t rec = record_of("ORD-1");
  assert_true(obx_relay_producer_send(producer, "outage", &rec, (void *)(intptr_t)0, &err));
  int64_t until = obx_test_now_ms() + 1500;
  while (obx_test_now_ms() < until) obx_relay_producer_poll(producer, 100);
  if (acks.acked) fail_msg("while the broker was down: got a report (ok=%d: %s), want none", acks.ok[0], acks.err[0].msg);
  assert_int_equal(rd_kafka_mock_broker_set_up(mc, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
  assert_true(obx_relay_producer_flush(producer, 30000));
  assert_int_equal(acks.acked, 1);
  if (!acks.ok[0]) fail_msg("after the broker came back: got \"%s\", want acknowledged", acks.err[0].msg);
  obx_relay_producer_destroy(producer);
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(host);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_partition_matches_java),
    cmocka_unit_test(test_bad_passthrough_key_is_named),
    cmocka_unit_test(test_passthrough_cannot_override_guarantees),
    cmocka_unit_test(test_undeliverable_record_reports_failure),
    cmocka_unit_test(test_record_waits_out_an_outage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
