/* obx_test_kafka.h - kafka-mockd for tests, and a consumer that reads a topic back
 *
 * DESIGN: a test that needs Kafka starts its own kafka-mockd (tests/fixtures/kafka-mock) with
 * obx_test_kafka_start, drives faults through its control socket with obx_test_kafka_cmd
 * (commands as documented at the top of kafka_mockd.c) and stops it with obx_test_kafka_stop.
 * obx_test_kafka_consume_all reads records back through a real consumer group, headers
 * included, so tests check what a downstream consumer would see. */
#ifndef OBX_TEST_KAFKA_H
#define OBX_TEST_KAFKA_H

#include <stdbool.h>
#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "obx_test.h"

typedef struct {
  obx_test_proc_t proc;    /* kafka-mockd; its stdout+stderr in proc.log_path */
  char bootstrap[512];     /* "127.0.0.1:port,..." once started */
  char bootstrap_path[256];
  char control_path[256];
} obx_test_kafka_t;

/* Spawns the built kafka-mockd with `brokers` brokers and the topics of topics_spec
 * ("name:partitions,name:partitions"; NULL or "" for none) and a control socket, and waits
 * (up to 30 s) for its bootstrap file. On false the process is stopped and a reason printed.
 * k is caller storage; stop it with obx_test_kafka_stop. */
bool obx_test_kafka_start(obx_test_kafka_t *k, int brokers, const char *topics_spec);

/* Sends one control command (printf-formatted, no newline) and waits up to 10 s for the
 * answer; true only for "ok". Any other answer is printed with the command. */
bool obx_test_kafka_cmd(obx_test_kafka_t *k, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

/* Sends one control command and copies kafka-mockd's answer line ("ok" or "error <reason>")
 * to answer; false (with a description in answer) when no answer came. */
bool obx_test_kafka_cmd_answer(obx_test_kafka_t *k, char *answer, size_t alen, const char *fmt,
                               ...) __attribute__((format(printf, 4, 5)));

/* SIGTERM, then SIGKILL after 10 s. Safe on a zeroed or already stopped k. */
void obx_test_kafka_stop(obx_test_kafka_t *k);

/* Called once per record; rkm (and its headers) is borrowed for the duration of the call. */
typedef void (*obx_test_kafka_record_fn)(const rd_kafka_message_t *rkm, void *ctx);

/* Consumes `topic` as a member of consumer group `group` (NULL: a fresh group of its own),
 * from the group's committed offsets or else from the earliest, until expected_count records
 * were passed to cb or timeout_ms passed. Commits the offsets of exactly the records passed to
 * cb before closing, so the next member of the group resumes after them (session.timeout.ms
 * is 6 s, so a next member joins quickly). Returns the number of records passed to cb, or -1
 * if the consumer could not be created or the commit failed. */
int obx_test_kafka_consume_all(const char *bootstrap, const char *topic, const char *group,
                               int expected_count, int timeout_ms, obx_test_kafka_record_fn cb,
                               void *ctx);

/* Copies the value of the last header called `name` to out (NUL-terminated, truncated to
 * fit); false if there is none. */
bool obx_test_kafka_header(const rd_kafka_message_t *rkm, const char *name, char *out,
                           size_t outlen);

#endif
