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
 * test_relay_readiness runs relays on the run's real Kafka broker (auto.create.topics.enable is
 * off there): a leader whose topic is missing answers /readyz 503 naming the topic while a
 * standby beside it is ready; once the topic is created the leader is ready; a leader whose
 * brokers cannot be reached answers 503 naming them. */
#include "obx_test.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#include <pthread.h>
#include <signal.h>
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

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_liveness_follows_progress),
    cmocka_unit_test(test_relay_readiness),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
