/* obx_test_kafka.h - how tests get a Kafka cluster: kafka-mockd or a real Apache Kafka broker,
 * and a consumer that reads a topic back
 *
 * DESIGN: a test that injects protocol faults starts its own kafka-mockd
 * (tests/fixtures/kafka-mock) with obx_test_kafka_start, drives faults through its control
 * socket with obx_test_kafka_cmd (commands as documented at the top of kafka_mockd.c) and stops
 * it with obx_test_kafka_stop. A test that needs real Kafka behaviour (log, group coordinator,
 * rebalances, idempotent producer state) uses a real broker run by scripts/kafka.sh
 * (obx_test_broker_*): the run's shared broker (scripts/test.sh starts it and exports its
 * directory as OBX_TEST_KAFKA_DIR), on which every test creates topics of its own
 * (obx_test_broker_topic: unique names) and uses groups of its own, or a private broker for a
 * test that stops, freezes or kills it (obx_test_broker_start). Kafka's own Java tools and the
 * Java witness (tests/kafka/KafkaWitness.java) run with obx_test_broker_java.
 * obx_test_kafka_consume_all reads records back through a real consumer group, headers
 * included, so tests check what a downstream consumer would see; obx_test_kafka_topic_records
 * counts what a topic holds, so "no duplicate" needs no wait for records that do not come. */
#ifndef OBX_TEST_KAFKA_H
#define OBX_TEST_KAFKA_H

#include <stdbool.h>
#include <stddef.h>

#include <sys/types.h>

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

/* The data records `topic` holds as a read_committed consumer sees them (aborted records and
 * the control records of transactions left out): every partition read from its start to its
 * end. -1 when the topic's metadata could not be read, or it was not read to the end, within
 * 10 s. */
int64_t obx_test_kafka_topic_records(const char *bootstrap, const char *topic);

/* Copies the value of the last header called `name` to out (NUL-terminated, truncated to
 * fit); false if there is none. */
bool obx_test_kafka_header(const rd_kafka_message_t *rkm, const char *name, char *out,
                           size_t outlen);

/* ---- a real Apache Kafka broker (scripts/kafka.sh) -------------------------------------- */

typedef struct {
  char dir[256];          /* its OBX_KAFKA_DIR */
  char bootstrap[128];    /* "127.0.0.1:port" */
  char classpath[16384];  /* broker, tools and Java client jars (OBX_KAFKA_CLASSPATH) */
  bool own;               /* started by this test: obx_test_broker_stop stops it */
} obx_test_broker_t;

/* The broker of this test run: the one in $OBX_TEST_KAFKA_DIR (its env file). False (with a
 * reason printed) when the variable is unset or the broker does not run; use with
 * obx_test_require. */
bool obx_test_broker_shared(obx_test_broker_t *b);

/* A private broker (a fresh directory under obx_test_tmpdir, a smaller heap) for a test that
 * signals or restarts it; up to 120 s. Needs Java and Maven (scripts/kafka.sh). */
bool obx_test_broker_start(obx_test_broker_t *b);

/* Starts the broker of b->dir again (after obx_test_broker_signal(b, SIGKILL) or a stop): the
 * same ports and data; waits until it answers. */
bool obx_test_broker_restart(obx_test_broker_t *b);

/* Sends sig (SIGSTOP, SIGCONT, SIGKILL) to the broker's JVM; false when it does not run.
 * After SIGKILL it returns once the process is gone. */
bool obx_test_broker_signal(obx_test_broker_t *b, int sig);

/* Runs `scripts/kafka.sh VERB` (start, stop, status) for b->dir, its output on stderr; returns
 * its exit status (-1 when it did not run). */
int obx_test_broker_script(const obx_test_broker_t *b, const char *verb);

/* The broker's JVM as scripts/kafka.sh recorded it ($OBX_KAFKA_DIR/broker.pid); -1 when none. */
pid_t obx_test_broker_pid(const obx_test_broker_t *b);

/* Stops a broker started by obx_test_broker_start (scripts/kafka.sh stop); the shared one is
 * left alone. Safe on a zeroed b. */
void obx_test_broker_stop(obx_test_broker_t *b);

/* Creates a topic named "<base>-<pid>-<n>" (unique in the test run) with `partitions`
 * partitions and topic configs (NULL or NULL-terminated "key", "value" pairs), waits until
 * every partition has a leader and copies the name to name. False with a reason printed. */
bool obx_test_broker_topic(const obx_test_broker_t *b, const char *base, int partitions,
                           const char *const *configs, char *name, size_t namelen);

/* A group id "<base>-<pid>-<n>", unique in the test run. */
void obx_test_broker_group(const char *base, char *out, size_t outlen);

/* Runs `java` on the broker's class path with args (NULL-terminated: a main class such as
 * org.apache.kafka.tools.TopicCommand, or a source file such as the witness's, then its
 * arguments); stdout goes to out (NUL-terminated, truncated to fit), stderr to the test's
 * output. Returns the exit status, -1 when it did not run. */
int obx_test_broker_java(const obx_test_broker_t *b, char *out, size_t outlen,
                         const char *const *args);

/* The path of the Java witness source (tests/kafka/KafkaWitness.java). */
const char *obx_test_kafka_witness(void);

#endif
