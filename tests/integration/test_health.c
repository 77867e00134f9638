/* test_health.c - /healthz fails when a loop stops making progress, and only then; the relay's
 * /readyz reflects its stream and producer
 *
 * outboxd runs every role with health.stall_timeout=2s against its own devmongod and kafka-mockd,
 * RabbitMQ on a closed port (the worker's work-queue loop goes round reconnecting) and one HTTP
 * handler. First Kafka goes away too: every loop still goes round (a Kafka poll, an AMQP
 * reconnect, a producer poll each return within their timeouts), so /healthz must stay 200 for
 * three stall bounds. Then devmongod is paused with SIGSTOP: the relay's loop really blocks in a
 * MongoDB call (the driver's socket timeout is minutes), and an API request holds the one HTTP
 * handler in its MongoDB query; /healthz must answer 503 problem+json naming relay/main and
 * http/handler 0 with how long they went without progress. SIGCONT: the calls return and
 * /healthz is 200 again. On a process whose /healthz is 200 while it runs the second step fails.
 *
 * test_stalled_acceptor: every HTTP server's event loop ("acceptor :<port>", which accepts, reads
 * and answers for the whole listener) stamps its progress too. outboxd runs the API and the
 * Knative sink (two listeners); one event thread at a time is stopped with ptrace (PTRACE_SEIZE +
 * PTRACE_INTERRUPT of that one thread: the rest of the process goes on). A stopped sink acceptor
 * is named by the API's /healthz (503) after the stall bound; a stopped API acceptor leaves its
 * own /healthz unanswered (what a kubelet's probe timeout sees) and is named by the sink's; each
 * answers 200 again once the thread runs. On a process whose event loops stamp nothing the
 * first 503 never comes.
 *
 * test_relay_readiness runs relays on the run's real Kafka broker (auto.create.topics.enable is
 * off there): a leader whose topic is missing answers /readyz 503 naming the topic while a
 * standby beside it is ready; once the topic is created the leader is ready; a leader whose
 * brokers cannot be reached answers 503 naming them. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STALL_MS 2000

typedef struct {
  obx_test_mongo_t mongo;
  obx_test_kafka_t kafka;
  obx_test_outboxd_t d;
  char keys_path[256];
  char key[96];
} fixture_t;

static void start_all(fixture_t *fx) {
  memset(fx, 0, sizeof *fx);
  assert_true(obx_test_mongo_start(&fx->mongo, NULL));
  assert_true(obx_test_kafka_start(&fx->kafka, 1, "domain-events:2"));
  snprintf(fx->keys_path, sizeof fx->keys_path, "%s/health-keys", obx_test_tmpdir());
  obx_test_apikey_add(fx->keys_path, "acme", "outbox:read", fx->key);
  char mongo_arg[300], kafka_arg[600], prefix_arg[100], stall_arg[64], keys_arg[300];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", fx->mongo.uri);
  snprintf(kafka_arg, sizeof kafka_arg, "kafka.brokers=%s", fx->kafka.bootstrap);
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=health.%d", (int)getpid());
  snprintf(stall_arg, sizeof stall_arg, "health.stall_timeout=%dms", STALL_MS);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", fx->keys_path);
  char *args[] = {"-X", mongo_arg, "-X", kafka_arg, "-X", "amqp.url=amqp://guest:guest@127.0.0.1:1/", "-X",
                  prefix_arg, "-X", stall_arg, "-X", keys_arg, "-X", "http.workers=1", "-X",
                  "api.request_timeout=8s", "-X", "shutdown.grace=3s", NULL};
  assert_true(obx_test_outboxd_start(&fx->d, args));
  if (!obx_test_file_contains(fx->d.proc.log_path, "outboxd running", 30000) ||
      !obx_test_file_contains(fx->d.proc.log_path, "relay is the leader", 30000))
    fail_msg("outboxd never ran with the relay leading; log %s", fx->d.proc.log_path);
}

static void stop_all(fixture_t *fx) {
  if (fx->mongo.proc.pid) kill(fx->mongo.proc.pid, SIGCONT);
  obx_test_proc_stop(&fx->d.proc, SIGKILL, 1000);
  obx_test_mongo_stop(&fx->mongo);
  obx_test_kafka_stop(&fx->kafka);
}

/* A probe's answer to wait for: GET path answers want with every needle in its body. */
typedef struct {
  int port;
  const char *path;       /* "/healthz", "/readyz" */
  long want;              /* the status that ends the wait */
  const char *needles[3]; /* and what the body must hold (NULL-terminated) */
  char body[2048];        /* the last answer */
  char type[128];
} probe_wait_t;

static bool probe_is(void *arg) {
  probe_wait_t *w = arg;
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(w->port, "GET", w->path, NULL, NULL, NULL, &resp);
  if (ok) {
    snprintf(w->body, sizeof w->body, "%ld %s", resp.status, resp.body ? resp.body : "");
    if (!obx_test_http_header(&resp, "Content-Type", w->type, sizeof w->type)) w->type[0] = '\0';
    ok = resp.status == w->want;
    for (int i = 0; ok && i < 3 && w->needles[i]; i++) ok = strstr(resp.body, w->needles[i]) != NULL;
  }
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

typedef struct {
  int port;
  const char *key;
  long status;
} api_call_t;

static void *api_call(void *arg) {
  api_call_t *c = arg;
  obx_test_http_resp_t resp;
  obx_test_http(c->port, "GET", "/api/outbox", c->key, NULL, NULL, &resp);
  c->status = resp.status;
  obx_test_http_resp_cleanup(&resp);
  return NULL;
}

static bool create_topic(const char *bootstrap, const char *topic) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) return false;
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  if (!rk) return false;
  rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, 2, 1, errstr, sizeof errstr);
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
  rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
  bool ok = false;
  if (ev) {
    size_t n = 0;
    const rd_kafka_topic_result_t **res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    ok = n == 1 && rd_kafka_topic_result_error(res[0]) == RD_KAFKA_RESP_ERR_NO_ERROR;
    if (!ok) fprintf(stderr, "creating %s: %s\n", topic, n ? rd_kafka_topic_result_error_string(res[0]) : "no result");
    rd_kafka_event_destroy(ev);
  }
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(nt);
  rd_kafka_destroy(rk);
  return ok;
}

/* outboxd --roles relay on mongo_uri, brokers and topic. */
static void start_relay(obx_test_outboxd_t *d, const char *mongo_uri, const char *brokers, const char *topic) {
  char mongo_arg[300], kafka_arg[300], topic_arg[200];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo_uri);
  snprintf(kafka_arg, sizeof kafka_arg, "kafka.brokers=%s", brokers);
  snprintf(topic_arg, sizeof topic_arg, "kafka.topic=%s", topic);
  char *args[] = {"--roles", "relay", "-X", mongo_arg, "-X", kafka_arg, "-X", topic_arg, "-X", "relay.lease=3s", NULL};
  assert_true(obx_test_outboxd_start(d, args));
  if (!obx_test_file_contains(d->proc.log_path, "outboxd running", 30000)) fail_msg("relay did not start; log %s", d->proc.log_path);
}

static void test_relay_readiness(void **state) {
  obx_test_broker_t broker;
  obx_test_require(obx_test_broker_shared(&broker), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)");
  obx_test_mongo_t mongo;
  memset(&mongo, 0, sizeof mongo);
  assert_true(obx_test_mongo_start(&mongo, NULL));
  char topic[64], needle[128];
  snprintf(topic, sizeof topic, "readyz-missing-%d", (int)getpid());
  snprintf(needle, sizeof needle, "topic '%s'", topic);

  obx_test_outboxd_t leader = {0}, standby = {0}, lost = {0};
  start_relay(&leader, mongo.uri, broker.bootstrap, topic);
  if (!obx_test_file_contains(leader.proc.log_path, "relay is the leader", 30000)) fail_msg("no leader; log %s", leader.proc.log_path);
  probe_wait_t missing = {.port = leader.port, .path = "/readyz", .want = 503, .needles = {needle}};
  if (!obx_test_wait_for(probe_is, &missing, 15000, 100))
    fail_msg("the leader without its topic did not answer 503 naming it: %s", missing.body);
  printf("leader, topic missing: %s\n", missing.body);

  start_relay(&standby, mongo.uri, broker.bootstrap, topic);
  probe_wait_t standby_ready = {.port = standby.port, .path = "/readyz", .want = 200};
  if (!obx_test_wait_for(probe_is, &standby_ready, 15000, 100)) fail_msg("the standby is not ready: %s", standby_ready.body);
  assert_false(obx_test_file_contains(standby.proc.log_path, "relay is the leader", 0));

  assert_true(create_topic(broker.bootstrap, topic));
  probe_wait_t ready = {.port = leader.port, .path = "/readyz", .want = 200};
  if (!obx_test_wait_for(probe_is, &ready, 20000, 100)) fail_msg("the leader with its topic is not ready: %s", ready.body);
  obx_test_outboxd_stop(&standby);
  obx_test_outboxd_stop(&leader); /* releases the lease */

  start_relay(&lost, mongo.uri, "127.0.0.1:1", topic);
  if (!obx_test_file_contains(lost.proc.log_path, "relay is the leader", 30000)) fail_msg("no leader; log %s", lost.proc.log_path);
  probe_wait_t unreachable = {.port = lost.port, .path = "/readyz", .want = 503,
                              .needles = {"cannot reach a broker of 127.0.0.1:1"}};
  if (!obx_test_wait_for(probe_is, &unreachable, 15000, 100))
    fail_msg("the leader without brokers did not answer 503 naming them: %s", unreachable.body);
  printf("leader, brokers unreachable: %s\n", unreachable.body);
  obx_test_outboxd_stop(&lost);
  obx_test_mongo_stop(&mongo);
}

static void test_liveness_follows_progress(void **state) {
  fixture_t fx;
  start_all(&fx);
  probe_wait_t ok = {.port = fx.d.port, .path = "/healthz", .want = 200};
  if (!obx_test_wait_for(probe_is, &ok, 10000, 100)) fail_msg("/healthz never 200 at the start: %s", ok.body);

  /* Kafka gone (RabbitMQ never there): every loop waits on a broker in bounded calls. */
  obx_test_kafka_stop(&fx.kafka);
  int64_t until = obx_test_now_ms() + 3 * STALL_MS;
  while (obx_test_now_ms() < until) {
    if (!probe_is(&ok)) fail_msg("/healthz failed while loops only waited on brokers: %s (log %s)", ok.body, fx.d.proc.log_path);
    usleep(200 * 1000); /* the probe's period, not a condition */
  }

  /* MongoDB hung: the relay's loop and the one HTTP handler block in their calls. */
  api_call_t call = {.port = fx.d.port, .key = fx.key};
  assert_int_equal(kill(fx.mongo.proc.pid, SIGSTOP), 0);
  int64_t paused = obx_test_now_ms();
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, api_call, &call), 0);
  probe_wait_t stalled = {.port = fx.d.port, .path = "/healthz", .want = 503,
                          .needles = {"relay/main", "http/handler 0", "Stalled"}};
  if (!obx_test_wait_for(probe_is, &stalled, 15000, 100))
    fail_msg("/healthz did not name the stalled relay and HTTP handler: %s (log %s)", stalled.body, fx.d.proc.log_path);
  int64_t detected = obx_test_now_ms() - paused;
  printf("stall detected %lld ms after MongoDB paused (bound %d ms): %s\n", (long long)detected, STALL_MS, stalled.body);
  assert_non_null(strstr(stalled.type, "application/problem+json"));
  assert_non_null(strstr(stalled.body, "no progress for"));
  assert_non_null(strstr(stalled.body, "sinceProgressMs"));
  assert_true(detected >= STALL_MS);

  /* MongoDB back: the calls return, the loops go round, /healthz is 200 again. */
  assert_int_equal(kill(fx.mongo.proc.pid, SIGCONT), 0);
  int64_t resumed = obx_test_now_ms();
  if (!obx_test_wait_for(probe_is, &ok, 30000, 100))
    fail_msg("/healthz stayed failed after MongoDB came back: %s (log %s)", ok.body, fx.d.proc.log_path);
  printf("healthy again %lld ms after MongoDB resumed\n", (long long)(obx_test_now_ms() - resumed));
  pthread_join(t, NULL);
  assert_true(call.status != 0);
  stop_all(&fx);
}

/* ---- a stalled acceptor ------------------------------------------------------------------- */

/* The thread of pid whose name is name (/proc/PID/task/TID/comm), 0 when none. */
static pid_t thread_named(pid_t pid, const char *name) {
  char path[320], comm[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  pid_t found = 0;
  for (struct dirent *e; dir && !found && (e = readdir(dir));) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/%d/task/%s/comm", (int)pid, e->d_name);
    FILE *f = fopen(path, "r");
    if (f && fgets(comm, sizeof comm, f) && strncmp(comm, name, strlen(name)) == 0 && comm[strlen(name)] == '\n')
      found = (pid_t)atoi(e->d_name);
    if (f) fclose(f);
  }
  if (dir) closedir(dir);
  return found;
}

/* Stops thread tid of a child process (the others keep running); thread_resume lets it go on. */
static void thread_stop(pid_t tid) {
  if (ptrace(PTRACE_SEIZE, tid, NULL, NULL) != 0 || ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) != 0)
    fail_msg("cannot stop thread %d with ptrace: %s", (int)tid, strerror(errno));
  int status;
  if (waitpid(tid, &status, __WALL) != tid) fail_msg("thread %d did not stop: %s", (int)tid, strerror(errno));
}

static void thread_resume(pid_t tid) {
  if (ptrace(PTRACE_DETACH, tid, NULL, NULL) != 0) fail_msg("cannot resume thread %d: %s", (int)tid, strerror(errno));
}

/* True when GET /healthz on port gets no answer within ms (the listener's event loop is stuck). */
static bool unanswered(int port, int ms) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  static const char req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  bool sent = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && send(fd, req, sizeof req - 1, 0) == (ssize_t)(sizeof req - 1);
  struct pollfd p = {.fd = fd, .events = POLLIN};
  bool quiet = sent && poll(&p, 1, ms) == 0;
  close(fd);
  return quiet;
}

/* The number right after needle in the log; 0 when none. With a non-zero `not`, the first such
 * number that is not `not`. */
static int logged_port(const char *log_path, const char *needle, int not) {
  char *text = obx_test_read_file(log_path);
  int port = 0;
  for (const char *p = text; p && (p = strstr(p, needle)) && !port; p += strlen(needle))
    if (atoi(p + strlen(needle)) != not) port = atoi(p + strlen(needle));
  free(text);
  return port;
}

static void test_stalled_acceptor(void **state) {
  (void)state;
  obx_test_mongo_t mongo;
  memset(&mongo, 0, sizeof mongo);
  assert_true(obx_test_mongo_start(&mongo, NULL));
  char mongo_arg[300], prefix_arg[100], stall_arg[64];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=health-sink.%d", (int)getpid());
  snprintf(stall_arg, sizeof stall_arg, "health.stall_timeout=%dms", STALL_MS);
  char *args[] = {"--roles", "api,worker", "-X", mongo_arg, "-X", "amqp.url=amqp://guest:guest@127.0.0.1:1/", "-X",
                  prefix_arg, "-X", stall_arg, "-X", "worker.source=http", "-X", "worker.sink_port=0", "-X",
                  "worker.sink_token=health-sink-token-0123456789", "-X", "shutdown.grace=3s", NULL};
  obx_test_outboxd_t d = {0};
  assert_true(obx_test_outboxd_start(&d, args));
  if (!obx_test_file_contains(d.proc.log_path, "CloudEvents sink listening on port ", 30000))
    fail_msg("the sink did not listen; log %s", d.proc.log_path);
  int sink = logged_port(d.proc.log_path, "CloudEvents sink listening on port ", 0);
  int api = logged_port(d.proc.log_path, "\"http listening\",\"bind\":\"0.0.0.0\",\"port\":\"", sink);
  if (!api || !sink) fail_msg("no API and sink ports in the log %s", d.proc.log_path);
  char api_thread[32], sink_thread[32], api_loop[48], sink_loop[48];
  snprintf(api_thread, sizeof api_thread, "obx-http-%d", api);
  snprintf(sink_thread, sizeof sink_thread, "obx-http-%d", sink);
  snprintf(api_loop, sizeof api_loop, "http/acceptor :%d", api);
  snprintf(sink_loop, sizeof sink_loop, "http/acceptor :%d", sink);
  pid_t api_tid = thread_named(d.proc.pid, api_thread), sink_tid = thread_named(d.proc.pid, sink_thread);
  if (!api_tid || !sink_tid)
    fail_msg("threads %s (%d) and %s (%d) in outboxd %d: want both", api_thread, (int)api_tid, sink_thread, (int)sink_tid,
             (int)d.proc.pid);
  probe_wait_t api_ok = {.port = api, .path = "/healthz", .want = 200}, sink_ok = {.port = sink, .path = "/healthz", .want = 200};
  if (!obx_test_wait_for(probe_is, &api_ok, 10000, 100) || !obx_test_wait_for(probe_is, &sink_ok, 10000, 100))
    fail_msg("/healthz not 200 at the start: %s / %s", api_ok.body, sink_ok.body);

  /* the sink's event thread stops: the API's /healthz names it */
  thread_stop(sink_tid);
  int64_t stopped = obx_test_now_ms();
  probe_wait_t sink_named = {.port = api, .path = "/healthz", .want = 503, .needles = {sink_loop, "sinceProgressMs"}};
  bool named = obx_test_wait_for(probe_is, &sink_named, 15000, 100);
  int64_t detected = obx_test_now_ms() - stopped;
  thread_resume(sink_tid);
  if (!named) fail_msg("the API's /healthz did not name the stopped %s: %s (log %s)", sink_loop, sink_named.body, d.proc.log_path);
  printf("stopped sink acceptor named after %lld ms (bound %d ms): %s\n", (long long)detected, STALL_MS, sink_named.body);
  assert_true(detected >= STALL_MS);
  assert_null(strstr(sink_named.body, api_loop));
  if (!obx_test_wait_for(probe_is, &api_ok, 10000, 100) || !obx_test_wait_for(probe_is, &sink_ok, 10000, 100))
    fail_msg("/healthz not 200 after the sink's acceptor went on: %s / %s", api_ok.body, sink_ok.body);

  /* the API's event thread stops: its own /healthz goes unanswered, the sink's names it */
  thread_stop(api_tid);
  stopped = obx_test_now_ms();
  probe_wait_t api_named = {.port = sink, .path = "/healthz", .want = 503, .needles = {api_loop, "sinceProgressMs"}};
  named = obx_test_wait_for(probe_is, &api_named, 15000, 100);
  detected = obx_test_now_ms() - stopped;
  bool quiet = unanswered(api, 1000);
  thread_resume(api_tid);
  if (!named) fail_msg("the sink's /healthz did not name the stopped %s: %s (log %s)", api_loop, api_named.body, d.proc.log_path);
  if (!quiet) fail_msg("the API's /healthz answered while its event thread was stopped");
  printf("stopped API acceptor named after %lld ms by the sink's /healthz; its own /healthz unanswered\n", (long long)detected);
  assert_true(detected >= STALL_MS);
  if (!obx_test_wait_for(probe_is, &api_ok, 10000, 100) || !obx_test_wait_for(probe_is, &sink_ok, 10000, 100))
    fail_msg("/healthz not 200 after the API's acceptor went on: %s / %s", api_ok.body, sink_ok.body);
  int status = obx_test_outboxd_stop(&d);
  obx_test_mongo_stop(&mongo);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_liveness_follows_progress),
    cmocka_unit_test(test_relay_readiness),
    cmocka_unit_test(test_stalled_acceptor),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
