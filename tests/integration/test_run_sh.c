/* test_run_sh.c - README's run command, non-interactively
 *
 * Starts `scripts/run.sh --no-build` (the binaries of this build; HTTP_PORT=0; AMQP_URL is used
 * when set, else run.sh starts its own RabbitMQ) with a state directory of its own, waits for
 * its `ready` file, places an order with the printed key, reads the event back from Kafka
 * (the Apache Kafka broker run.sh started, Java being installed) and sees the outbox say
 * PUBLISHED; the sample order.post pipeline's call to erp.exemplo.com (which does not resolve)
 * fails, and the event must be among the dead letters (GET /api/dlq, the dead_letters store)
 * under a minute after the order, through the short ladder run.sh sets and says it set (the
 * figure is printed). Then it sends SIGINT to run.sh, as Ctrl-C would, and checks that run.sh and every
 * process it started (the broker's JVM included) are gone, with the broker's directory.
 * test_run_sh_own_rabbitmq does the same with AMQP_URL removed from run.sh's environment, so
 * run.sh starts a private RabbitMQ node: the order still goes through, and after SIGINT the
 * node's processes and port are gone with its directory. It also sets OBX_RUN_KAFKA=mock, so
 * that run goes through kafka-mockd, the choice run.sh makes without Java.
 * test_run_sh_demo does the same with --demo and checks the stages it printed: integrated at
 * once, recovered through the ladder after two 503s, DEAD then redriven to DONE. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_kafka.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define READY_MS 240000
#define FLOW_MS 60000
#define DEMO_MS 240000
#define QUICK_DLQ_MS 60000 /* README: the quick start's failing event is a dead letter in under a minute */

typedef struct {
  char api_url[128], key_file[256], kafka[256];
  int port;
  char kafka_kind[32], kafka_dir[256]; /* broker or kafka-mockd; the broker's directory */
  pid_t pids[3]; /* outboxd, devmongod, the broker's JVM or kafka-mockd */
} ready_t;

/* Copies the value of `NAME=value` (quotes removed) from the ready file. */
static bool ready_value(const char *path, const char *name, char *out, size_t outlen) {
  FILE *f = fopen(path, "r");
  char line[512];
  size_t n = strlen(name);
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f)) {
    if (strncmp(line, name, n) != 0 || line[n] != '=') continue;
    char *v = line + n + 1;
    v[strcspn(v, "\n")] = '\0';
    if (*v == '\'') {
      v++;
      v[strcspn(v, "'")] = '\0';
    }
    snprintf(out, outlen, "%s", v);
    found = true;
  }
  if (f) fclose(f);
  return found;
}

static void read_ready(const char *path, ready_t *r) {
  char v[64];
  static const char *const pid_names[] = {"OUTBOXD_PID", "DEVMONGOD_PID", "KAFKA_PID"};
  if (!ready_value(path, "API_URL", r->api_url, sizeof r->api_url) ||
      !ready_value(path, "API_KEY_FILE", r->key_file, sizeof r->key_file) ||
      !ready_value(path, "KAFKA_BROKERS", r->kafka, sizeof r->kafka) ||
      !ready_value(path, "KAFKA_KIND", r->kafka_kind, sizeof r->kafka_kind) ||
      !ready_value(path, "KAFKA_DIR", r->kafka_dir, sizeof r->kafka_dir))
    fail_msg("%s lacks API_URL, API_KEY_FILE, KAFKA_BROKERS, KAFKA_KIND or KAFKA_DIR", path);
  const char *colon = strrchr(r->api_url, ':');
  r->port = colon ? atoi(colon + 1) : 0;
  assert_true(r->port > 0);
  for (int i = 0; i < 3; i++) {
    if (!ready_value(path, pid_names[i], v, sizeof v) || atoi(v) <= 0) fail_msg("%s: no %s", path, pid_names[i]);
    r->pids[i] = (pid_t)atoi(v);
  }
}

typedef struct {
  const char *id;
  bool seen;
  char type[64];
} record_ctx_t;

static void on_record(const rd_kafka_message_t *rkm, void *p) {
  record_ctx_t *c = p;
  char id[64];
  if (obx_test_kafka_header(rkm, "ce_id", id, sizeof id) && strcmp(id, c->id) == 0) {
    c->seen = true;
    obx_test_kafka_header(rkm, "ce_type", c->type, sizeof c->type);
  }
}

typedef struct {
  int port;
  const char *key, *id;
} published_ctx_t;

static bool outbox_published(void *p) {
  published_ctx_t *c = p;
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(c->port, "GET", "/api/outbox?status=PUBLISHED", c->key, NULL, NULL, &resp) &&
            resp.status == 200 && strstr(resp.body, c->id);
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

/* RabbitMQ queues under a prefix of this run, deleted at the end when AMQP_URL is shared. */
static char queue_prefix[64];

static void delete_queues(const int64_t *tiers, int ntiers) {
  if (!getenv("AMQP_URL")) return; /* run.sh's own node is gone with its queues */
  obx_ladder_opts_t lo = {.url = getenv("AMQP_URL"), .prefix = queue_prefix, .tiers_ms = tiers, .ntiers = ntiers};
  obx_err_t err = OBX_ERR_INIT;
  obx_ladder_t *ladder = obx_ladder_new(&lo, &err);
  if (!ladder) fail_msg("ladder: %s", err.msg);
  wt_delete_topology(ladder, queue_prefix);
  obx_ladder_destroy(ladder);
}

/* Starts run.sh with `mode` ("" or "--demo") and a state dir named `name`; waits for ready.
 * kafka: "auto" (a broker, Java being installed) or "mock" (OBX_RUN_KAFKA=mock: kafka-mockd);
 * checks that run.sh said which one it started. */
static void run_start(obx_test_proc_t *run, const char *name, const char *mode, const char *kafka, ready_t *r,
                      char *ready_path, size_t rplen) {
  char dir[300], script[512], build_env[512], prefix_env[100], kafka_env[64];
  snprintf(dir, sizeof dir, "%s/%s", obx_test_tmpdir(), name);
  snprintf(ready_path, rplen, "%s/ready", dir);
  snprintf(script, sizeof script, "%s/scripts/run.sh", OBX_SOURCE_DIR);
  snprintf(build_env, sizeof build_env, "OBX_BUILD_DIR=%s", OBX_BUILD_DIR);
  char *argv[] = {"/bin/bash", script, "--no-build", "--state-dir", dir, *mode ? (char *)mode : NULL, NULL};
  snprintf(queue_prefix, sizeof queue_prefix, "runsh.%d.%s", (int)getpid(), name);
  snprintf(prefix_env, sizeof prefix_env, "WORKER_QUEUE_PREFIX=%s", queue_prefix);
  snprintf(kafka_env, sizeof kafka_env, "OBX_RUN_KAFKA=%s", kafka);
  char *env[] = {build_env, "HTTP_PORT=0", prefix_env, kafka_env, NULL};
  /* run.sh must see SIGINT as a terminal's Ctrl-C delivers it, even when this test was started
   * in the background (where SIGINT is ignored and a shell could not trap it) */
  signal(SIGINT, SIG_DFL);
  assert_true(obx_test_spawn(run, argv, env));
  if (!obx_test_file_contains(ready_path, "RMQ_DIR=", READY_MS)) {
    obx_test_proc_stop(run, SIGTERM, 60000);
    fail_msg("run.sh not ready in %d s; its output: %s", READY_MS / 1000, run->log_path);
  }
  read_ready(ready_path, r);
  bool mock = strcmp(kafka, "mock") == 0;
  const char *said = mock ? "run.sh: kafka-mockd on " : "run.sh: Apache Kafka broker on ";
  if (strcmp(r->kafka_kind, mock ? "kafka-mockd" : "broker") != 0 || !obx_test_file_contains(run->log_path, said, 0))
    fail_msg("run.sh (OBX_RUN_KAFKA=%s) started Kafka kind '%s' or did not say \"%s\": %s", kafka, r->kafka_kind, said,
             run->log_path);
  if (!mock && !obx_test_file_contains(run->log_path, "the first start on a", 0))
    fail_msg("run.sh did not say that the first start fetches the broker: %s", run->log_path);
}

/* Ctrl-C: run.sh exits 130 after stopping everything it started. */
static void run_interrupt(obx_test_proc_t *run, const ready_t *r, const char *ready_path) {
  int status = obx_test_proc_stop(run, SIGINT, 90000);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 130)
    fail_msg("run.sh after SIGINT: status 0x%x, want exit 130; output: %s", status, run->log_path);
  assert_true(obx_test_file_contains(run->log_path, "run.sh: stopped", 1000));
  for (int i = 0; i < 3; i++)
    if (kill(r->pids[i], 0) == 0 || errno != ESRCH) fail_msg("pid %d started by run.sh still runs", (int)r->pids[i]);
  assert_false(obx_test_file_contains(ready_path, "API_URL", 0)); /* removed on stop */
  struct stat st;
  if (r->kafka_dir[0] && stat(r->kafka_dir, &st) == 0) fail_msg("run.sh's Kafka directory %s is left behind", r->kafka_dir);
}

/* The event is a dead letter: GET /api/dlq?eventId= lists it. */
static bool dead_lettered(void *p) {
  published_ctx_t *c = p;
  char path[160];
  snprintf(path, sizeof path, "/api/dlq?eventId=%s", c->id);
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(c->port, "GET", path, c->key, NULL, NULL, &resp) && resp.status == 200 &&
            obx_test_doc_int(&resp.json, "count") == 1;
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

/* An order placed with run.sh's key reaches Kafka and its outbox event becomes PUBLISHED; with
 * dead_ms, the event is also a dead letter within dead_ms of the order (the figure printed). */
static void order_flows(const obx_test_proc_t *run, const ready_t *r, int dead_ms) {
  char key[128] = "";
  assert_true(obx_test_read_first_line(r->key_file, key, sizeof key, 1000));
  assert_true(obx_test_file_contains(run->log_path, "curl -s -X POST http://127.0.0.1:", 1000));

  obx_test_http_resp_t resp;
  int64_t ordered_ms = obx_time_now_ms();
  assert_true(obx_test_http(r->port, "POST", "/orders", key,
                            "{\"customerEmail\": \"customer@company.com\", \"amount\": \"149.90\"}", NULL, &resp));
  if (resp.status != 201) fail_msg("POST /orders: got HTTP %ld %s, want 201", resp.status, resp.body);
  bson_iter_t it, ids;
  char event_id[64] = "";
  if (bson_iter_init_find(&it, &resp.json, "eventIds") && bson_iter_recurse(&it, &ids) && bson_iter_next(&ids) &&
      BSON_ITER_HOLDS_UTF8(&ids))
    snprintf(event_id, sizeof event_id, "%s", bson_iter_utf8(&ids, NULL));
  obx_test_http_resp_cleanup(&resp);
  assert_true(event_id[0]);

  record_ctx_t rec = {.id = event_id};
  obx_test_kafka_consume_all(r->kafka, "domain-events", NULL, 1, FLOW_MS, on_record, &rec);
  if (!rec.seen) fail_msg("event %s not in Kafka topic domain-events at %s", event_id, r->kafka);
  assert_string_equal(rec.type, "OrderConfirmed");
  published_ctx_t pc = {r->port, key, event_id};
  if (!obx_test_wait_for(outbox_published, &pc, FLOW_MS, 100)) fail_msg("outbox event %s never PUBLISHED", event_id);
  if (!dead_ms) return;
  const char *said = "(retry ladder 2s,5s,10s: short for the quick start";
  if (!obx_test_file_contains(run->log_path, said, 0)) fail_msg("run.sh did not say \"%s\": %s", said, run->log_path);
  int64_t left = ordered_ms + dead_ms - obx_time_now_ms();
  if (left < 0 || !obx_test_wait_for(dead_lettered, &pc, (int)left, 100))
    fail_msg("event %s of the sample pipeline not among the dead letters %d s after the order", event_id, dead_ms / 1000);
  printf("quick start: order -> dead letter (GET /api/dlq) in %.1f s (ladder 2s,5s,10s; bound %d s)\n",
         (double)(obx_time_now_ms() - ordered_ms) / 1000.0, dead_ms / 1000);
}

static void test_run_sh(void **state) {
  (void)state;
  char ready_path[400];
  obx_test_proc_t run;
  ready_t r;
  run_start(&run, "run-sh", "", "auto", &r, ready_path, sizeof ready_path);
  order_flows(&run, &r, QUICK_DLQ_MS);
  run_interrupt(&run, &r, ready_path);
  static const int64_t tiers[] = {2000, 5000, 10000}; /* run.sh's quick-start ladder */
  delete_queues(tiers, 3);
}

static void test_run_sh_demo(void **state) {
  (void)state;
  char ready_path[400];
  obx_test_proc_t run;
  ready_t r;
  run_start(&run, "run-sh-demo", "--demo", "auto", &r, ready_path, sizeof ready_path);
  if (!obx_test_file_contains(run.log_path, "demo: done", DEMO_MS)) {
    obx_test_proc_stop(&run, SIGTERM, 60000);
    fail_msg("demo did not finish in %d s; its output: %s", DEMO_MS / 1000, run.log_path);
  }
  static const char *const stages[] = {
    "1/3 an order integrated at once", "worker: inbox DONE, ERP called 1 time(s)",
    "worker: inbox RETRYING, last error: node \"notify\": HTTP 503", "worker: inbox DONE after 3 ERP calls",
    "DLQ: terminal: node \"notify\": HTTP 400", "{\"count\":1,", "worker: inbox DONE after the redrive",
  };
  for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++)
    if (!obx_test_file_contains(run.log_path, stages[i], 0)) fail_msg("demo output lacks \"%s\": %s", stages[i], run.log_path);
  run_interrupt(&run, &r, ready_path);
  static const int64_t tiers[] = {1000, 2000, 4000}; /* the demo's ladder */
  delete_queues(tiers, 3);
}

/* The private node run.sh started: its name (OBX_RMQ_NODE of its env file) and AMQP port. */
typedef struct {
  char node[128];
  int port;
} rmq_node_t;

static void read_rmq_node(const char *ready_path, rmq_node_t *n) {
  char dir[300], env_path[400], url[256];
  if (!ready_value(ready_path, "RMQ_DIR", dir, sizeof dir) || !*dir)
    fail_msg("%s: no RMQ_DIR, yet AMQP_URL was not set for run.sh", ready_path);
  snprintf(env_path, sizeof env_path, "%s/env", dir);
  char *env = obx_test_read_file(env_path);
  const char *node = env ? strstr(env, "OBX_RMQ_NODE=") : NULL;
  if (!node) fail_msg("%s: no OBX_RMQ_NODE", env_path);
  node += strlen("OBX_RMQ_NODE=");
  snprintf(n->node, sizeof n->node, "%.*s", (int)strcspn(node, "\n'\""), node);
  free(env);
  if (!ready_value(ready_path, "AMQP_URL", url, sizeof url)) fail_msg("%s: no AMQP_URL", ready_path);
  const char *host = strstr(url, "@127.0.0.1:");
  n->port = host ? atoi(host + strlen("@127.0.0.1:")) : 0;
  if (n->port <= 0 || !n->node[0]) fail_msg("private node: got node '%s' port %d from %s", n->node, n->port, url);
}

/* Some process's command line names the node. */
static bool node_runs(const char *node) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  bool found = false;
  while (d && !found && (e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[8192];
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < len; i++)
      if (!buf[i]) buf[i] = ' ';
    buf[len] = '\0';
    found = strstr(buf, node) != NULL;
  }
  if (d) closedir(d);
  return found;
}

static bool port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool open = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  if (fd >= 0) close(fd);
  return open;
}

static bool node_gone(void *p) {
  const rmq_node_t *n = p;
  return !node_runs(n->node) && !port_open(n->port);
}

/* run.sh without AMQP_URL starts and stops a RabbitMQ node of its own. */
static void test_run_sh_own_rabbitmq(void **state) {
  (void)state;
  char ready_path[400], *shared = getenv("AMQP_URL") ? strdup(getenv("AMQP_URL")) : NULL;
  obx_test_proc_t run;
  ready_t r;
  rmq_node_t node;
  unsetenv("AMQP_URL"); /* run.sh inherits this environment */
  run_start(&run, "run-sh-rmq", "", "mock", &r, ready_path, sizeof ready_path);
  if (shared) setenv("AMQP_URL", shared, 1);
  free(shared);
  read_rmq_node(ready_path, &node);
  if (!node_runs(node.node) || !port_open(node.port))
    fail_msg("run.sh's RabbitMQ node %s on port %d does not run", node.node, node.port);
  order_flows(&run, &r, 0);
  char dir[300];
  assert_true(ready_value(ready_path, "RMQ_DIR", dir, sizeof dir));
  run_interrupt(&run, &r, ready_path);
  if (!obx_test_wait_for(node_gone, &node, 60000, 200))
    fail_msg("after SIGINT run.sh's RabbitMQ node %s still runs or port %d still answers", node.node, node.port);
  struct stat st;
  if (stat(dir, &st) == 0) fail_msg("run.sh's RabbitMQ directory %s is left behind", dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_run_sh), cmocka_unit_test(test_run_sh_own_rabbitmq),
                                     cmocka_unit_test(test_run_sh_demo)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
