/* kafkamock.c - kafka-mockd for tests, a consumer that reads a topic back, and a topic's record count
 *
 * DESIGN: see obx_test_kafka.h. Each control command uses its own connection to the control
 * socket: one line out, one line back, with a receive timeout, so a wedged kafka-mockd fails
 * the test instead of hanging it. */
#include "obx_test_kafka.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define KAFKA_START_TIMEOUT_MS 30000
#define KAFKA_CMD_TIMEOUT_S 10

bool obx_test_kafka_start(obx_test_kafka_t *k, int brokers, const char *topics_spec) {
  static int seq;
  char brokers_arg[16];
  char spec[1024];
  char *argv[64];
  int argc = 0;

  memset(k, 0, sizeof *k);
  snprintf(k->bootstrap_path, sizeof k->bootstrap_path, "%s/kafka-%d-%d.bootstrap",
           obx_test_tmpdir(), (int)getpid(), seq);
  snprintf(k->control_path, sizeof k->control_path, "%s/kafka-%d-%d.sock", obx_test_tmpdir(),
           (int)getpid(), seq);
  seq++;
  unlink(k->bootstrap_path);
  snprintf(brokers_arg, sizeof brokers_arg, "%d", brokers);
  snprintf(spec, sizeof spec, "%s", topics_spec ? topics_spec : "");

  argv[argc++] = (char *)obx_test_build_path("tests/fixtures/kafka-mock/kafka-mockd");
  argv[argc++] = "--brokers";
  argv[argc++] = brokers_arg;
  char *save = NULL;
  for (char *t = strtok_r(spec, ",", &save); t && argc < 56; t = strtok_r(NULL, ",", &save)) {
    argv[argc++] = "--topic";
    argv[argc++] = t;
  }
  argv[argc++] = "--bootstrap-file";
  argv[argc++] = k->bootstrap_path;
  argv[argc++] = "--control";
  argv[argc++] = k->control_path;
  argv[argc++] = "--exit-with-parent"; /* a crashed test leaves no cluster behind */
  argv[argc] = NULL;

  if (!obx_test_spawn(&k->proc, argv, NULL)) {
    fprintf(stderr, "obx_test_kafka_start: cannot spawn %s\n", argv[0]);
    return false;
  }
  if (!obx_test_read_first_line(k->bootstrap_path, k->bootstrap, sizeof k->bootstrap,
                                KAFKA_START_TIMEOUT_MS)) {
    fprintf(stderr, "obx_test_kafka_start: no bootstrap file %s after %d ms (log: %s)\n",
            k->bootstrap_path, KAFKA_START_TIMEOUT_MS, k->proc.log_path);
    obx_test_kafka_stop(k);
    return false;
  }
  return true;
}

/* Reads one answer line into buf; false on timeout, EOF or overflow. */
static bool read_line(int fd, char *buf, size_t len) {
  size_t n = 0;
  while (n + 1 < len) {
    ssize_t r = recv(fd, buf + n, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (buf[n] == '\n') {
      buf[n] = 0;
      return true;
    }
    n++;
  }
  buf[n] = 0;
  return false;
}

/* Sends line (newline-terminated, n bytes) and reads the answer line into answer; false with
 * a description in answer when there is none. */
static bool control_exchange(const obx_test_kafka_t *k, const char *line, int n, char *answer,
                             size_t alen) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t plen = strlen(k->control_path);
  if (plen >= sizeof sa.sun_path) {
    snprintf(answer, alen, "control path too long: %s", k->control_path);
    return false;
  }
  memcpy(sa.sun_path, k->control_path, plen + 1);
  struct timeval tv = {KAFKA_CMD_TIMEOUT_S, 0};
  bool ok = false;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
      connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      send(fd, line, (size_t)n, MSG_NOSIGNAL) != n) {
    snprintf(answer, alen, "control socket %s: %s", k->control_path, strerror(errno));
    goto done;
  }
  ok = read_line(fd, answer, alen);
  if (!ok) snprintf(answer, alen, "no answer within %d s", KAFKA_CMD_TIMEOUT_S);

done:
  if (fd >= 0) close(fd);
  return ok;
}

static bool vcmd_answer(obx_test_kafka_t *k, char *answer, size_t alen, const char *fmt,
                        va_list ap) {
  char line[1024];
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  if (n < 0 || n >= (int)sizeof line - 1) {
    snprintf(answer, alen, "command too long");
    return false;
  }
  line[n++] = '\n';
  return control_exchange(k, line, n, answer, alen);
}

bool obx_test_kafka_cmd_answer(obx_test_kafka_t *k, char *answer, size_t alen, const char *fmt,
                               ...) {
  va_list ap;
  va_start(ap, fmt);
  bool ok = vcmd_answer(k, answer, alen, fmt, ap);
  va_end(ap);
  return ok;
}

bool obx_test_kafka_cmd(obx_test_kafka_t *k, const char *fmt, ...) {
  char answer[1024];
  va_list ap;
  va_start(ap, fmt);
  bool ok = vcmd_answer(k, answer, sizeof answer, fmt, ap) && !strcmp(answer, "ok");
  va_end(ap);
  if (!ok) {
    char line[1024];
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kafka-mockd command '%s': got '%s', want 'ok'\n", line, answer);
  }
  return ok;
}

void obx_test_kafka_stop(obx_test_kafka_t *k) {
  if (k->proc.pid > 0) obx_test_proc_stop(&k->proc, SIGTERM, 10000);
}

bool obx_test_kafka_header(const rd_kafka_message_t *rkm, const char *name, char *out,
                           size_t outlen) {
  rd_kafka_headers_t *hdrs = NULL;
  const void *val;
  size_t size;
  if (rd_kafka_message_headers(rkm, &hdrs) || !hdrs ||
      rd_kafka_header_get_last(hdrs, name, &val, &size))
    return false;
  if (outlen == 0) return true;
  size_t n = size < outlen - 1 ? size : outlen - 1;
  if (n) memcpy(out, val, n);
  out[n] = 0;
  return true;
}

static bool conf_set_all(rd_kafka_conf_t *conf, const char *const *kv) {
  char errstr[256];
  for (; kv[0]; kv += 2) {
    if (rd_kafka_conf_set(conf, kv[0], kv[1], errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
      fprintf(stderr, "consumer config %s=%s: %s\n", kv[0], kv[1], errstr);
      return false;
    }
  }
  return true;
}

int64_t obx_test_kafka_topic_records(const char *bootstrap, const char *topic) {
  char errstr[256];
  const char *const kv[] = {
    "bootstrap.servers", bootstrap, "group.id", "obx-test-count", "enable.auto.commit", "false",
    "enable.partition.eof", "true", "isolation.level", "read_committed", "log_level", "4", NULL,
  };
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  if (!conf_set_all(conf, kv)) {
    rd_kafka_conf_destroy(conf);
    return -1;
  }
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    fprintf(stderr, "topic records: %s\n", errstr);
    return -1;
  }
  int64_t total = -1;
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, 10000);
  if (err || md->topic_cnt != 1 || md->topics[0].err) {
    fprintf(stderr, "topic records: metadata of %s: %s\n", topic,
            rd_kafka_err2str(err ? err : md->topic_cnt == 1 ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
  } else {
    /* every partition from its start to its end (the last stable offset: committed data only) */
    int n = md->topics[0].partition_cnt, ended = 0;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++)
      rd_kafka_topic_partition_list_add(parts, topic, md->topics[0].partitions[i].id)->offset = RD_KAFKA_OFFSET_BEGINNING;
    if ((err = rd_kafka_assign(rk, parts))) fprintf(stderr, "topic records: assign %s: %s\n", topic, rd_kafka_err2str(err));
    int64_t deadline = obx_test_now_ms() + 10000, count = 0;
    while (!err && ended < n && obx_test_now_ms() < deadline) {
      rd_kafka_message_t *rkm = rd_kafka_consumer_poll(rk, 100);
      if (!rkm) continue;
      if (rkm->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) ended++;
      else if (!rkm->err) count++;
      rd_kafka_message_destroy(rkm);
    }
    if (ended == n) total = count;
    else fprintf(stderr, "topic records: %s not read to its end within 10 s\n", topic);
    rd_kafka_topic_partition_list_destroy(parts);
  }
  if (md) rd_kafka_metadata_destroy(md);
  rd_kafka_topic_destroy(rkt);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return total;
}

int obx_test_kafka_consume_all(const char *bootstrap, const char *topic, const char *group,
                               int expected_count, int timeout_ms, obx_test_kafka_record_fn cb,
                               void *ctx) {
  static int seq;
  char own_group[64], errstr[256];
  int count = -1;
  rd_kafka_t *rk = NULL;
  rd_kafka_topic_partition_list_t *topics = NULL;

  if (!group) {
    snprintf(own_group, sizeof own_group, "obx-test-%d-%d", (int)getpid(), seq++);
    group = own_group;
  }
  /* Offsets are stored when a record is handed out and committed once, at the end: the
   * commit covers exactly the records passed to cb. */
  const char *const kv[] = {
    "bootstrap.servers", bootstrap, "group.id", group,
    "auto.offset.reset", "earliest", "enable.auto.commit", "false",
    "enable.auto.offset.store", "true", "log_level", "4",
    /* The mock rebalances a group only once the previous member's session expired: keep it
     * short so members of one group can follow each other within a test. */
    "session.timeout.ms", "6000", "heartbeat.interval.ms", "1000",
    NULL,
  };
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  if (!conf_set_all(conf, kv)) {
    rd_kafka_conf_destroy(conf);
    goto done;
  }
  rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr); /* owns conf */
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    fprintf(stderr, "consumer: %s\n", errstr);
    goto done;
  }
  rd_kafka_poll_set_consumer(rk);
  topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, topic, RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t err = rd_kafka_subscribe(rk, topics);
  if (err) {
    fprintf(stderr, "consumer subscribe %s: %s\n", topic, rd_kafka_err2str(err));
    goto done;
  }

  count = 0;
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  while (count < expected_count && obx_test_now_ms() < deadline) {
    rd_kafka_message_t *rkm = rd_kafka_consumer_poll(rk, 100);
    if (!rkm) continue;
    if (rkm->err) {
      if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        fprintf(stderr, "consumer: %s\n", rd_kafka_message_errstr(rkm));
    } else {
      cb(rkm, ctx);
      count++;
    }
    rd_kafka_message_destroy(rkm);
  }
  if (count > 0) {
    err = rd_kafka_commit(rk, NULL, 0);
    if (err) {
      fprintf(stderr, "consumer commit (group %s): %s\n", group, rd_kafka_err2str(err));
      count = -1;
    }
  }

done:
  if (topics) rd_kafka_topic_partition_list_destroy(topics);
  if (rk) {
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
  }
  return count;
}
