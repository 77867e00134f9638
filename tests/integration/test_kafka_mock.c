/* test_kafka_mock.c - kafka-mockd serves real clients in other processes, and its faults bite
 *
 * DESIGN: one kafka-mockd (3 brokers) for the whole file, one topic per test so the tests do
 * not see each other's records. Clients are a librdkafka producer/consumer in this process and
 * kcat in child processes. Consumers that reuse a group set session.timeout.ms=6000: the mock
 * only rebalances a group once its previous member's session has expired. */
#include "obx_test_kafka.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SPAWN_TIMEOUT_MS 90000
#define DELIVERY_TIMEOUT_MS 60000
#define CONSUME_TIMEOUT_MS 60000

static obx_test_kafka_t kafka;

static int setup(void **state) {
  return obx_test_kafka_start(&kafka, 3, "orders:4,resume:4,outage:4,faults:1") ? 0 : -1;
}

static int teardown(void **state) {
  obx_test_kafka_stop(&kafka);
  return 0;
}

/* ---- a librdkafka producer in this process ---- */

typedef struct {
  int ok;
  int failed;
  rd_kafka_resp_err_t last_err;
  int client_errors; /* error events (connection refused, all brokers down, ...) */
} deliveries_t;

static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
  deliveries_t *d = opaque;
  d->client_errors++;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
  deliveries_t *d = opaque;
  if (rkm->err) {
    d->failed++;
    d->last_err = rkm->err;
  } else {
    d->ok++;
  }
}

static void conf_set_list(rd_kafka_conf_t *conf, const char *const *kv) {
  char errstr[256];
  for (; kv[0]; kv += 2) {
    if (rd_kafka_conf_set(conf, kv[0], kv[1], errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
      fail_msg("producer config %s=%s: %s", kv[0], kv[1], errstr);
  }
}

/* extra: NULL-terminated key/value pairs on top of the defaults. */
static rd_kafka_t *producer_new(deliveries_t *d, const char *const *extra) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  conf_set_list(conf, (const char *const[]){"bootstrap.servers", kafka.bootstrap, "acks", "all",
                                            "linger.ms", "5", "log_level", "4", NULL});
  conf_set_list(conf, extra);
  rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
  rd_kafka_conf_set_error_cb(conf, on_error);
  rd_kafka_conf_set_opaque(conf, d);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  if (!rk) fail_msg("rd_kafka_new: %s", errstr);
  return rk;
}

static void produce(rd_kafka_t *rk, const char *topic, const char *key, const char *value,
                    const char *trace) {
  rd_kafka_resp_err_t err = rd_kafka_producev(
    rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
    RD_KAFKA_V_VALUE((void *)value, strlen(value)), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
    RD_KAFKA_V_HEADER("trace", trace, -1), RD_KAFKA_V_END);
  if (err) fail_msg("produce to %s: got %s, want NO_ERROR", topic, rd_kafka_err2name(err));
}

/* Serves delivery reports until `want` arrived (ok or failed) or timeout_ms passed. */
static void poll_deliveries(rd_kafka_t *rk, deliveries_t *d, int want, int timeout_ms) {
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  while (d->ok + d->failed < want && obx_test_now_ms() < deadline) rd_kafka_poll(rk, 100);
}

/* ---- kcat in a child process ---- */

/* Runs `sh -c cmd` with the command and its stderr appended to a log in the test tmpdir;
 * returns its exit status, or -1 if it had to be killed at the deadline. */
static int run_shell(const char *cmd, int timeout_ms) {
  char log[512], full[4096];
  snprintf(log, sizeof log, "%s/shell.log", obx_test_tmpdir());
  FILE *f = fopen(log, "a");
  if (f) {
    fprintf(f, "+ %s\n", cmd);
    fclose(f);
  }
  snprintf(full, sizeof full, "%s 2>>%s", cmd, log);
  char *argv[] = {"/bin/sh", "-c", full, NULL};
  obx_test_proc_t proc = {0};
  if (!obx_test_spawn(&proc, argv, NULL)) fail_msg("cannot spawn: %s", cmd);
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  int status;
  for (;;) {
    pid_t r = waitpid(proc.pid, &status, WNOHANG);
    if (r == proc.pid) break;
    if (r < 0 || obx_test_now_ms() >= deadline) {
      obx_test_proc_stop(&proc, SIGKILL, 1000);
      print_error("timed out after %d ms: %s (log %s)\n", timeout_ms, cmd, log);
      return -1;
    }
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    print_error("exit status %d: %s (log %s)\n", status, cmd, log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Reads the lines of path into lines[] (up to max, newline stripped); returns the count. */
static int read_lines(const char *path, char lines[][256], int max) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0;
  while (n < max && fgets(lines[n], 256, f)) {
    lines[n][strcspn(lines[n], "\n")] = 0;
    n++;
  }
  fclose(f);
  return n;
}

static bool has_line(char lines[][256], int n, const char *want) {
  for (int i = 0; i < n; i++)
    if (!strcmp(lines[i], want)) return true;
  return false;
}

static const char *tmp_path(const char *name) {
  static char path[4][512];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, 512, "%s/%s", obx_test_tmpdir(), name);
  return p;
}

/* ---- records read back by obx_test_kafka_consume_all ---- */

typedef struct {
  int n;
  char values[64][64];
} seen_t;

static void on_record(const rd_kafka_message_t *rkm, void *ctx) {
  seen_t *s = ctx;
  if (s->n < 64) snprintf(s->values[s->n++], 64, "%.*s", (int)rkm->len, (const char *)rkm->payload);
}

static int seen_index(const seen_t *s, const char *value) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->values[i], value)) return i;
  return -1;
}

/* ---- tests ---- */

/* The control socket answers ok/error, and a created topic shows up in broker metadata with
 * its partition count, next to the --topic ones, on 3 brokers. */
static void test_control_commands(void **state) {
  static const struct {
    const char *cmd;
    const char *want; /* the whole answer line */
  } cases[] = {
    {"ping", "ok"},
    {"broker down 4", "error broker id '4' not in 1..3 or 'all'"},
    {"no-such-command", "error unknown command or wrong arguments: no-such-command"},
    {"push-errors NoSuchApi 1 NOT_LEADER_FOR_PARTITION", "error unknown API key 'NoSuchApi'"},
    {"push-errors Produce 2 NO_SUCH_ERROR", "error unknown error 'NO_SUCH_ERROR'"},
    {"push-errors Produce 3 1 2", "error 2 errors given for count 3 (give 1 or 3)"},
    {"push-errors Fetch 2 REQUEST_TIMED_OUT 7", "ok"},
    {"clear-errors 1", "ok"},
    {"rtt all 0", "ok"},
    {"topic ctl-made 3", "ok"},
    {"topic ctl-made 3", "error topic ctl-made: TOPIC_ALREADY_EXISTS"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char answer[512];
    if (!obx_test_kafka_cmd_answer(&kafka, answer, sizeof answer, "%s", cases[i].cmd))
      fail_msg("'%s': %s", cases[i].cmd, answer);
    if (strcmp(answer, cases[i].want))
      fail_msg("'%s': got '%s', want '%s'", cases[i].cmd, answer, cases[i].want);
  }

  deliveries_t d = {0};
  rd_kafka_t *rk = producer_new(&d, (const char *const[]){NULL});
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, 30000);
  assert_int_equal(err, RD_KAFKA_RESP_ERR_NO_ERROR);
  assert_int_equal(md->broker_cnt, 3);
  int found = 0;
  for (int i = 0; i < md->topic_cnt; i++) {
    const char *name = md->topics[i].topic;
    int parts = md->topics[i].partition_cnt;
    if (!strcmp(name, "ctl-made")) {
      if (parts != 3) fail_msg("ctl-made partitions: got %d, want 3", parts);
      found++;
    } else if (!strcmp(name, "orders")) {
      if (parts != 4) fail_msg("orders partitions: got %d, want 4", parts);
      found++;
    }
  }
  assert_int_equal(found, 2);
  rd_kafka_metadata_destroy(md);
  rd_kafka_destroy(rk);
}

/* librdkafka here produces keyed records with a header; kcat in another process reads every
 * one of them back, key, value and header intact. */
static void test_librdkafka_produce_kcat_consume(void **state) {
  enum { N = 20 };
  deliveries_t d = {0};
  rd_kafka_t *rk = producer_new(&d, (const char *const[]){NULL});
  for (int i = 0; i < N; i++) {
    char key[32], value[32];
    snprintf(key, sizeof key, "key-%d", i);
    snprintf(value, sizeof value, "value-%d", i);
    produce(rk, "orders", key, value, "t1");
  }
  poll_deliveries(rk, &d, N, DELIVERY_TIMEOUT_MS);
  if (d.ok != N) fail_msg("delivered: got %d ok %d failed, want %d ok", d.ok, d.failed, N);
  rd_kafka_destroy(rk);

  const char *out = tmp_path("orders.out");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "kcat -b %s -C -t orders -o beginning -e -q -f '%%k|%%s|%%h\\n' >%s",
           kafka.bootstrap, out);
  assert_int_equal(run_shell(cmd, SPAWN_TIMEOUT_MS), 0);
  static char lines[64][256];
  int n = read_lines(out, lines, 64);
  if (n != N) fail_msg("kcat read: got %d lines, want %d (%s)", n, N, out);
  for (int i = 0; i < N; i++) {
    char want[128];
    snprintf(want, sizeof want, "key-%d|value-%d|trace=t1", i, i);
    if (!has_line(lines, n, want)) fail_msg("kcat output lacks '%s' (%s)", want, out);
  }
}

/* kcat produces from a file in another process; a consumer group member here reads and
 * commits; kcat as a second member of the same group resumes after the commit and commits in
 * turn; a third member here sees only what came after. */
static void test_kcat_produce_group_resume(void **state) {
  const char *in = tmp_path("resume.in");
  char cmd[2048];
  FILE *f = fopen(in, "w");
  assert_non_null(f);
  for (int i = 0; i < 10; i++) fprintf(f, "k%d:r%d\n", i, i);
  fclose(f);
  snprintf(cmd, sizeof cmd, "kcat -b %s -P -t resume -K : -l %s", kafka.bootstrap, in);
  assert_int_equal(run_shell(cmd, SPAWN_TIMEOUT_MS), 0);

  seen_t first = {0};
  int got = obx_test_kafka_consume_all(kafka.bootstrap, "resume", "g-resume", 10,
                                       CONSUME_TIMEOUT_MS, on_record, &first);
  if (got != 10) fail_msg("first member: got %d records, want 10", got);
  for (int i = 0; i < 10; i++) {
    char want[16];
    snprintf(want, sizeof want, "r%d", i);
    if (seen_index(&first, want) < 0) fail_msg("first member lacks %s", want);
  }

  f = fopen(in, "w");
  assert_non_null(f);
  for (int i = 10; i < 15; i++) fprintf(f, "k%d:r%d\n", i, i);
  fclose(f);
  assert_int_equal(run_shell(cmd, SPAWN_TIMEOUT_MS), 0);

  const char *out = tmp_path("resume.out");
  snprintf(cmd, sizeof cmd,
           "kcat -b %s -G g-resume -X session.timeout.ms=6000 -X auto.offset.reset=earliest "
           "-e -q -f '%%s\\n' resume >%s",
           kafka.bootstrap, out);
  assert_int_equal(run_shell(cmd, SPAWN_TIMEOUT_MS), 0);
  static char lines[64][256];
  int n = read_lines(out, lines, 64);
  if (n != 5) fail_msg("kcat group member: got %d records, want the 5 new ones (%s)", n, out);
  for (int i = 10; i < 15; i++) {
    char want[16];
    snprintf(want, sizeof want, "r%d", i);
    if (!has_line(lines, n, want)) fail_msg("kcat group member lacks %s (%s)", want, out);
  }

  deliveries_t d = {0};
  rd_kafka_t *rk = producer_new(&d, (const char *const[]){NULL});
  for (int i = 15; i < 18; i++) {
    char key[16], value[16];
    snprintf(key, sizeof key, "k%d", i);
    snprintf(value, sizeof value, "r%d", i);
    produce(rk, "resume", key, value, "t2");
  }
  poll_deliveries(rk, &d, 3, DELIVERY_TIMEOUT_MS);
  assert_int_equal(d.ok, 3);
  rd_kafka_destroy(rk);

  seen_t third = {0};
  got = obx_test_kafka_consume_all(kafka.bootstrap, "resume", "g-resume", 3, CONSUME_TIMEOUT_MS,
                                   on_record, &third);
  if (got != 3) fail_msg("third member: got %d records, want 3", got);
  for (int i = 0; i < third.n; i++) {
    int seq = atoi(third.values[i] + 1);
    if (seq < 15) fail_msg("third member got %s, already committed by kcat", third.values[i]);
  }
}

/* With every broker down, produced records stay queued (no delivery report at all); once the
 * brokers are back, every one of them is delivered and can be read back. */
static void test_all_brokers_down_then_up(void **state) {
  enum { N = 5 };
  deliveries_t d = {0};
  /* log_level 2: the connection failures below are expected; on_error counts them. */
  rd_kafka_t *rk = producer_new(&d, (const char *const[]){"reconnect.backoff.max.ms", "1000",
                                                          "message.timeout.ms", "120000",
                                                          "log_level", "2", NULL});
  produce(rk, "outage", "warm", "before", "t3");
  poll_deliveries(rk, &d, 1, DELIVERY_TIMEOUT_MS);
  assert_int_equal(d.ok, 1);

  assert_true(obx_test_kafka_cmd(&kafka, "broker down all"));
  for (int i = 0; i < N; i++) {
    char value[16];
    snprintf(value, sizeof value, "queued-%d", i);
    produce(rk, "outage", "k", value, "t3");
  }
  /* A fixed window on purpose: this asserts that nothing happens while the brokers are down. */
  poll_deliveries(rk, &d, 1 + N, 3000);
  if (d.ok + d.failed != 1)
    fail_msg("while down: got %d ok %d failed (%s), want none", d.ok - 1, d.failed,
             rd_kafka_err2name(d.last_err));
  assert_int_equal(rd_kafka_outq_len(rk) >= N, 1);
  if (d.client_errors == 0) fail_msg("while down: got no client error event, want some");

  assert_true(obx_test_kafka_cmd(&kafka, "broker up all"));
  poll_deliveries(rk, &d, 1 + N, DELIVERY_TIMEOUT_MS);
  if (d.ok != 1 + N || d.failed)
    fail_msg("after up: got %d ok %d failed, want %d ok", d.ok, d.failed, 1 + N);
  rd_kafka_destroy(rk);

  seen_t seen = {0};
  int got = obx_test_kafka_consume_all(kafka.bootstrap, "outage", NULL, 1 + N, CONSUME_TIMEOUT_MS,
                                       on_record, &seen);
  if (got != 1 + N) fail_msg("read back: got %d, want %d", got, 1 + N);
  for (int i = 0; i < N; i++) {
    char want[16];
    snprintf(want, sizeof want, "queued-%d", i);
    if (seen_index(&seen, want) < 0) fail_msg("read back lacks %s", want);
  }
}

/* Errors pushed by name and by number reach the producer: a retriable one is retried away, a
 * terminal one fails the record with exactly that error. */
static void test_pushed_errors_reach_producer(void **state) {
  deliveries_t d = {0};
  rd_kafka_t *rk = producer_new(&d, (const char *const[]){"retry.backoff.ms", "50", NULL});
  produce(rk, "faults", "k", "warm", "t4");
  poll_deliveries(rk, &d, 1, DELIVERY_TIMEOUT_MS);
  assert_int_equal(d.ok, 1);

  assert_true(obx_test_kafka_cmd(&kafka, "push-errors Produce 2 NOT_LEADER_FOR_PARTITION"));
  produce(rk, "faults", "k", "retried", "t4");
  poll_deliveries(rk, &d, 2, DELIVERY_TIMEOUT_MS);
  if (d.ok != 2) fail_msg("retriable: got %d ok %d failed (%s), want 2 ok", d.ok, d.failed,
                          rd_kafka_err2name(d.last_err));

  assert_true(obx_test_kafka_cmd(&kafka, "push-errors 0 1 %d",
                                 RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED));
  produce(rk, "faults", "k", "refused", "t4");
  poll_deliveries(rk, &d, 3, DELIVERY_TIMEOUT_MS);
  if (d.failed != 1 || d.last_err != RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
    fail_msg("terminal: got %d failed (%s), want 1 TOPIC_AUTHORIZATION_FAILED", d.failed,
             rd_kafka_err2name(d.last_err));
  rd_kafka_destroy(rk);
}

/* Without --control, commands come on stdin, answers go to stdout after the BOOTSTRAP line,
 * and the end of stdin is a clean exit. */
static void test_stdin_commands_and_eof_exit(void **state) {
  const char *out = tmp_path("stdin.out");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "printf 'ping\\nbroker down 1\\nbroker up 1\\nbogus\\n' | %s >%s",
           obx_test_build_path("tests/fixtures/kafka-mock/kafka-mockd"), out);
  assert_int_equal(run_shell(cmd, SPAWN_TIMEOUT_MS), 0);
  static char lines[8][256];
  int n = read_lines(out, lines, 8);
  const char *want[] = {"BOOTSTRAP 127.0.0.1:", "ok", "ok", "ok",
                        "error unknown command or wrong arguments: bogus"};
  if (n != 5) fail_msg("stdout: got %d lines, want 5 (%s)", n, out);
  for (int i = 0; i < 5; i++) {
    if (strncmp(lines[i], want[i], strlen(want[i])))
      fail_msg("stdout line %d: got '%s', want '%s...'", i + 1, lines[i], want[i]);
  }
}

/* --exit-with-parent: once the process that started kafka-mockd is gone, kafka-mockd goes too
 * (what keeps a crashed test from leaving clusters behind). */
static void test_exit_with_parent(void **state) {
  const char *boot = tmp_path("orphan.bootstrap"), *pidf = tmp_path("orphan.pid");
  char cmd[2048];
  unlink(boot);
  snprintf(cmd, sizeof cmd,
           "%s --exit-with-parent --bootstrap-file %s --control %s </dev/null >/dev/null & "
           "echo $! >%s; i=0; while [ ! -s %s ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); "
           "done; test -s %s",
           obx_test_build_path("tests/fixtures/kafka-mock/kafka-mockd"), boot,
           tmp_path("orphan.sock"), pidf, boot, boot);
  assert_int_equal(run_shell(cmd, SPAWN_TIMEOUT_MS), 0);
  char line[32];
  assert_true(obx_test_read_first_line(pidf, line, sizeof line, 1000));
  pid_t pid = (pid_t)atoi(line);
  assert_true(pid > 0);
  if (!obx_test_wait_for(obx_test_pid_gone, &pid, 30000, 20))
    fail_msg("kafka-mockd %d: still running 30 s after its parent exited", (int)pid);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_control_commands),
    cmocka_unit_test(test_librdkafka_produce_kcat_consume),
    cmocka_unit_test(test_kcat_produce_group_resume),
    cmocka_unit_test(test_all_brokers_down_then_up),
    cmocka_unit_test(test_pushed_errors_reach_producer),
    cmocka_unit_test(test_stdin_commands_and_eof_exit),
    cmocka_unit_test(test_exit_with_parent),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
