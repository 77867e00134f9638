/* kafkabroker.c - a real Apache Kafka broker for tests (scripts/kafka.sh), its topics, and the
 * Java programs run on its class path
 *
 * DESIGN: see obx_test_kafka.h. Owns finding the run's broker (OBX_TEST_KAFKA_DIR), starting,
 * signalling and stopping private brokers through scripts/kafka.sh, creating uniquely named
 * topics with librdkafka's admin API, and running Java with output captured. Never starts the
 * shared broker (scripts/test.sh does) and never stops it. */
#include "obx_test_kafka.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BROKER_TOPIC_TIMEOUT_MS 30000
#define BROKER_GONE_TIMEOUT_MS 15000

/* Appends s to buf in single quotes (for sh -c); false when it does not fit. */
static bool shell_append(char *buf, size_t len, const char *s) {
  size_t n = strlen(buf);
  if (n + 3 >= len) return false;
  buf[n++] = ' ';
  buf[n++] = '\'';
  for (; *s; s++) {
    const char *piece = *s == '\'' ? "'\\''" : NULL;
    size_t plen = piece ? 4 : 1;
    if (n + plen + 2 >= len) return false;
    if (piece) memcpy(buf + n, piece, plen);
    else buf[n] = *s;
    n += plen;
  }
  buf[n++] = '\'';
  buf[n] = 0;
  return true;
}

/* Runs a shell command line; stdout into out (may be NULL). Returns the exit status or -1. */
static int run_capture(const char *cmd, char *out, size_t outlen) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = 0;
  char scratch[4096];
  for (;;) {
    char *dst = out && n + 1 < outlen ? out + n : scratch;
    size_t room = out && n + 1 < outlen ? outlen - 1 - n : sizeof scratch;
    size_t r = fread(dst, 1, room, p);
    if (r == 0) break;
    if (dst != scratch) n += r;
  }
  if (out && outlen) out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Reads `export NAME=value` (value possibly in single quotes) from the env file of dir. */
static bool env_value(const char *dir, const char *name, char *out, size_t outlen) {
  char path[512];
  snprintf(path, sizeof path, "%s/env", dir);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char *line = NULL;
  size_t cap = 0;
  size_t nlen = strlen(name);
  bool found = false;
  while (!found && getline(&line, &cap, f) > 0) {
    char *v = line;
    if (strncmp(v, "export ", 7) == 0) v += 7;
    if (strncmp(v, name, nlen) != 0 || v[nlen] != '=') continue;
    v += nlen + 1;
    v[strcspn(v, "\n")] = 0;
    size_t vlen = strlen(v);
    if (vlen >= 2 && v[0] == '\'' && v[vlen - 1] == '\'') {
      v[vlen - 1] = 0;
      v++;
    }
    if (strlen(v) < outlen) {
      memcpy(out, v, strlen(v) + 1);
      found = true;
    }
  }
  free(line);
  fclose(f);
  return found;
}

static bool load_env(obx_test_broker_t *b) {
  if (!env_value(b->dir, "KAFKA_BROKERS", b->bootstrap, sizeof b->bootstrap) ||
      !env_value(b->dir, "OBX_KAFKA_CLASSPATH", b->classpath, sizeof b->classpath)) {
    fprintf(stderr, "kafka broker: no KAFKA_BROKERS/OBX_KAFKA_CLASSPATH in %s/env\n", b->dir);
    return false;
  }
  return true;
}

bool obx_test_broker_shared(obx_test_broker_t *b) {
  memset(b, 0, sizeof *b);
  const char *dir = getenv("OBX_TEST_KAFKA_DIR");
  if (!dir || !*dir) {
    fprintf(stderr, "kafka broker: OBX_TEST_KAFKA_DIR is not set (scripts/test.sh starts one)\n");
    return false;
  }
  snprintf(b->dir, sizeof b->dir, "%s", dir);
  return load_env(b);
}

int obx_test_broker_script(const obx_test_broker_t *b, const char *verb) {
  char cmd[1024];
  /* A private broker ends with this test process, even one that crashes. */
  snprintf(cmd, sizeof cmd, "env OBX_KAFKA_EXIT_WITH=%d OBX_KAFKA_HEAP=256m", (int)getpid());
  char dirvar[300], script[512];
  snprintf(dirvar, sizeof dirvar, "OBX_KAFKA_DIR=%s", b->dir);
  shell_append(cmd, sizeof cmd, dirvar);
  snprintf(script, sizeof script, "%s/scripts/kafka.sh", OBX_SOURCE_DIR);
  shell_append(cmd, sizeof cmd, script);
  shell_append(cmd, sizeof cmd, verb);
  strncat(cmd, " 1>&2", sizeof cmd - strlen(cmd) - 1);
  return run_capture(cmd, NULL, 0);
}

/* scripts/kafka.sh VERB, which must succeed. */
static bool kafka_sh(const obx_test_broker_t *b, const char *verb) {
  int rc = obx_test_broker_script(b, verb);
  if (rc != 0) fprintf(stderr, "kafka broker: scripts/kafka.sh %s (dir %s) exited %d\n", verb, b->dir, rc);
  return rc == 0;
}

bool obx_test_broker_start(obx_test_broker_t *b) {
  static int seq;
  memset(b, 0, sizeof *b);
  snprintf(b->dir, sizeof b->dir, "%s/kafka-broker-%d-%d", obx_test_tmpdir(), (int)getpid(), seq++);
  b->own = true;
  if (!kafka_sh(b, "start") || !load_env(b)) {
    obx_test_broker_stop(b);
    return false;
  }
  return true;
}

bool obx_test_broker_restart(obx_test_broker_t *b) { return kafka_sh(b, "start") && load_env(b); }

pid_t obx_test_broker_pid(const obx_test_broker_t *b) {
  char path[512], line[32];
  snprintf(path, sizeof path, "%s/broker.pid", b->dir);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  pid_t pid = fgets(line, sizeof line, f) ? (pid_t)atoi(line) : -1;
  fclose(f);
  return pid;
}

bool obx_test_broker_signal(obx_test_broker_t *b, int sig) {
  pid_t pid = obx_test_broker_pid(b);
  if (pid <= 0 || kill(pid, sig) != 0) {
    fprintf(stderr, "kafka broker: signal %d to pid %d (dir %s): %s\n", sig, (int)pid, b->dir,
            pid <= 0 ? "no broker.pid" : strerror(errno));
    return false;
  }
  if (sig == SIGKILL && !obx_test_wait_for(obx_test_pid_gone, &pid, BROKER_GONE_TIMEOUT_MS, 20)) {
    fprintf(stderr, "kafka broker: pid %d still there after SIGKILL\n", (int)pid);
    return false;
  }
  return true;
}

void obx_test_broker_stop(obx_test_broker_t *b) {
  if (!b->own || !b->dir[0]) return;
  pid_t pid = obx_test_broker_pid(b);
  kafka_sh(b, "stop");
  if (pid > 0 && !obx_test_pid_gone(&pid)) fprintf(stderr, "kafka broker: pid %d still runs after stop\n", (int)pid);
  b->own = false;
}

void obx_test_broker_group(const char *base, char *out, size_t outlen) {
  static int seq;
  snprintf(out, outlen, "%s-%s-%d", base, obx_test_unique(), seq++);
}

/* Every partition of topic has a leader in the broker's metadata. */
static bool topic_ready(rd_kafka_t *rk, const char *topic, int partitions) {
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
  const struct rd_kafka_metadata *md = NULL;
  bool ok = false;
  if (rkt && rd_kafka_metadata(rk, 0, rkt, &md, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
      md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topics[0].partition_cnt == partitions) {
    ok = true;
    for (int i = 0; i < partitions; i++)
      if (md->topics[0].partitions[i].leader < 0 || md->topics[0].partitions[i].err) ok = false;
  }
  if (md) rd_kafka_metadata_destroy(md);
  if (rkt) rd_kafka_topic_destroy(rkt);
  return ok;
}

bool obx_test_broker_topic(const obx_test_broker_t *b, const char *base, int partitions,
                           const char *const *configs, char *name, size_t namelen) {
  static int seq;
  char errstr[256];
  bool ok = false;
  snprintf(name, namelen, "%s-%s-%d", base, obx_test_unique(), seq++);
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", b->bootstrap, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
    rd_kafka_conf_destroy(conf);
    fprintf(stderr, "kafka topic %s: %s\n", name, errstr);
    return false;
  }
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    fprintf(stderr, "kafka topic %s: %s\n", name, errstr);
    return false;
  }
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(name, partitions, 1, errstr, sizeof errstr);
  rd_kafka_event_t *ev = NULL;
  if (!nt) {
    fprintf(stderr, "kafka topic %s: %s\n", name, errstr);
    goto done;
  }
  for (int i = 0; configs && configs[i]; i += 2) {
    if (rd_kafka_NewTopic_set_config(nt, configs[i], configs[i + 1])) {
      fprintf(stderr, "kafka topic %s: config %s=%s refused\n", name, configs[i], configs[i + 1]);
      goto done;
    }
  }
  rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
  ev = rd_kafka_queue_poll(q, BROKER_TOPIC_TIMEOUT_MS);
  if (!ev || rd_kafka_event_error(ev)) {
    fprintf(stderr, "kafka topic %s: CreateTopics: %s\n", name, ev ? rd_kafka_event_error_string(ev) : "timed out");
    goto done;
  }
  size_t n = 0;
  const rd_kafka_topic_result_t **res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
  if (n != 1 || rd_kafka_topic_result_error(res[0])) {
    fprintf(stderr, "kafka topic %s: %s\n", name, n == 1 ? rd_kafka_topic_result_error_string(res[0]) : "no result");
    goto done;
  }
  int64_t deadline = obx_test_now_ms() + BROKER_TOPIC_TIMEOUT_MS;
  while (!(ok = topic_ready(rk, name, partitions)) && obx_test_now_ms() < deadline) usleep(50 * 1000);
  if (!ok) fprintf(stderr, "kafka topic %s: partitions without a leader after %d ms\n", name, BROKER_TOPIC_TIMEOUT_MS);

done:
  if (ev) rd_kafka_event_destroy(ev);
  if (nt) rd_kafka_NewTopic_destroy(nt);
  rd_kafka_queue_destroy(q);
  rd_kafka_destroy(rk);
  return ok;
}

const char *obx_test_kafka_witness(void) { return OBX_SOURCE_DIR "/tests/kafka/KafkaWitness.java"; }

int obx_test_broker_java(const obx_test_broker_t *b, char *out, size_t outlen, const char *const *args) {
  size_t len = strlen(b->classpath) + 8192;
  char *cmd = malloc(len);
  /* The same JVM options as scripts/kafka.sh's tools: small heap, serial GC, quick start. */
  snprintf(cmd, len, "java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xmx256m "
                     "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp");
  bool fits = shell_append(cmd, len, b->classpath);
  for (int i = 0; fits && args[i]; i++) fits = shell_append(cmd, len, args[i]);
  int rc = -1;
  if (!fits) fprintf(stderr, "java command line too long\n");
  else rc = run_capture(cmd, out, outlen);
  free(cmd);
  return rc;
}
