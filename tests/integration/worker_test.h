/* worker_test.h - fixture shared by the worker integration tests (test_worker*.c, test_ladder.c)
 *
 * DESIGN: one wt_fx_t per test: its own devmongod, a topic of its own (fx->topic, unique in
 * the run) on a real Apache Kafka broker - the run's shared one (scripts/test.sh,
 * OBX_TEST_KAFKA_DIR), or a private one for a test that freezes or kills it (wt_setup_on) -,
 * a consumer group of its own, a scripted ERP (HTTP server in the test process), RabbitMQ
 * names under a unique prefix (deleted at teardown), a producer that writes CloudEvents
 * exactly as the relay does, and the worker under test (in process, or as an outboxd child
 * for crash tests). None of these suites injects Kafka protocol errors, so none needs
 * kafka-mockd. Every wait polls with a deadline and fails with got/want. Helpers are static
 * inline so each test file takes what it uses. */
#ifndef WORKER_TEST_H
#define WORKER_TEST_H

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "obx/obx_conf.h"
#include "obx/obx_http.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ladder.h"
#include "obx/obx_metrics.h"
#include "obx/obx_mongo.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_worker.h"
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_httpd.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#define WT_WAIT_MS 45000
#define WT_ORG "org-wt"

/* The services every suite of this fixture needs (a private Kafka broker needs Java besides). */
#define WT_NEED_BROKER()                                                                           \
  do {                                                                                             \
    obx_test_require(getenv("AMQP_URL") != NULL, "AMQP_URL not set: this test needs RabbitMQ");    \
    obx_test_require(getenv("OBX_TEST_KAFKA_DIR") != NULL,                                         \
                     "OBX_TEST_KAFKA_DIR not set: this test needs a Kafka broker (scripts/kafka.sh)"); \
  } while (0)

typedef struct {
  obx_test_mongo_t m;
  obx_test_broker_t broker; /* shared, or private (broker.own) */
  char topic[128];
  obx_test_httpd_t *httpd;
  obx_conf_t conf;
  obx_mongo_t *mongo;
  mongoc_client_t *client;
  obx_ladder_t *ladder;
  obx_worker_t *worker;
  rd_kafka_t *producer;
  char prefix[64], group[64];
  int attempts;
} wt_fx_t;

static inline void wt_conf_set(wt_fx_t *fx, const char *key, const char *value) {
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_conf_set(&fx->conf, key, value, &err)) fail_msg("conf %s=%s: %s", key, value, err.msg);
}

/* A plain AMQP connection to AMQP_URL, logged in, channel 1 open; the caller closes it. */
static inline amqp_connection_state_t wt_amqp_open(void) {
  struct amqp_connection_info info;
  char *url = strdup(getenv("AMQP_URL"));
  assert_int_equal(amqp_parse_url(url, &info), AMQP_STATUS_OK);
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t *sock = amqp_tcp_socket_new(conn);
  assert_int_equal(amqp_socket_open(sock, info.host, info.port), AMQP_STATUS_OK);
  amqp_rpc_reply_t r = amqp_login(conn, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password);
  assert_int_equal(r.reply_type, AMQP_RESPONSE_NORMAL);
  amqp_channel_open(conn, 1);
  assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
  free(url);
  return conn;
}

/* Deletes queues (and an exchange, when not NULL) over a plain connection of its own. */
static inline void wt_delete_amqp(const char *const *queues, int nqueues, const char *exchange) {
  amqp_connection_state_t conn = wt_amqp_open();
  for (int i = 0; i < nqueues; i++) {
    amqp_queue_delete(conn, 1, amqp_cstring_bytes(queues[i]), 0, 0);
    assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
  }
  if (exchange) {
    amqp_exchange_delete(conn, 1, amqp_cstring_bytes(exchange), 0);
    assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
  }
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
}

/* Every queue and the exchange of a ladder. */
static inline void wt_delete_topology(obx_ladder_t *ladder, const char *prefix) {
  const char *queues[2 + OBX_CONF_MAX_LIST];
  int n = 0;
  queues[n++] = obx_ladder_work_queue(ladder);
  queues[n++] = obx_ladder_dlq_queue(ladder);
  for (int i = 0; i < obx_ladder_ntiers(ladder); i++) queues[n++] = obx_ladder_tier_queue(ladder, i);
  char ex[96];
  snprintf(ex, sizeof ex, "%s.retry", prefix);
  wt_delete_amqp(queues, n, ex);
}

/* An envelope of an OrderConfirmed CloudEvent with id and key (msg is initialised here). */
static inline void wt_envelope(obx_envelope_t *msg, const char *id, const char *key) {
  obx_ce_header_t h[] = {
    {"ce_specversion", "1.0", 3}, {"ce_id", id, strlen(id)}, {"ce_type", "OrderConfirmed", 14},
    {"ce_source", "/test", 5},    {"content-type", "application/json", 16},
  };
  obx_envelope_init(msg);
  const char *body = "{\"orderNumber\":\"A-1\"}";
  obx_envelope_from_record(msg, id, key, strlen(key), body, strlen(body), h, 5);
}

/* The next message of consumer within timeout_ms into got (initialised here); false on none. */
static inline bool wt_ladder_next(obx_ladder_consumer_t *consumer, obx_envelope_t *got, int timeout_ms) {
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  obx_envelope_init(got);
  while (obx_test_now_ms() < deadline) {
    bool have = false;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ladder_consumer_next(consumer, got, 200, &have, &err)) print_message("consume: %s\n", err.msg);
    if (have) return true;
  }
  return false;
}

/* Stores a pipeline of WT_ORG from its JSON definition. */
static inline void wt_create_pipeline_json(wt_fx_t *fx, const char *json) {
  obx_test_pipeline_create(fx->client, obx_mongo_db_name(fx->mongo), WT_ORG, json);
}

/* The order.post pipeline: POST /erp/{{orderNumber}} on the scripted ERP. */
static inline void wt_create_pipeline(wt_fx_t *fx) {
  char json[1024];
  obx_test_erp_pipeline_json(json, sizeof json, obx_test_httpd_url(fx->httpd, "/erp"));
  wt_create_pipeline_json(fx, json);
}

static inline void wt_teardown(wt_fx_t *fx) {
  if (!fx) return;
  obx_worker_destroy(fx->worker);
  if (fx->producer) rd_kafka_destroy(fx->producer);
  if (fx->ladder) wt_delete_topology(fx->ladder, fx->prefix);
  obx_ladder_destroy(fx->ladder);
  if (fx->client) obx_mongo_push(fx->mongo, fx->client);
  obx_mongo_destroy(fx->mongo);
  obx_conf_cleanup(&fx->conf);
  if (fx->httpd) obx_test_httpd_stop(fx->httpd);
  obx_test_broker_stop(&fx->broker);
  obx_test_mongo_stop(&fx->m);
  free(fx);
}

/* Services, configuration, pipeline and producer; the worker is started by wt_start_worker.
 * The topic has `partitions` partitions, on a private broker of the test's own when
 * private_broker (obx_test_broker_signal freezes or kills it), else on the run's broker. */
static inline wt_fx_t *wt_setup_on(int partitions, const char *mongo_args, bool private_broker) {
  static int seq;
  wt_fx_t *fx = calloc(1, sizeof *fx);
  fx->attempts = 3;
  /* A failed setup gets no teardown: stop what was started before failing. */
  if (!(private_broker ? obx_test_broker_start(&fx->broker) : obx_test_broker_shared(&fx->broker))) {
    free(fx);
    fail_msg("no Kafka broker (%s)", private_broker ? "scripts/kafka.sh start failed" : "OBX_TEST_KAFKA_DIR");
  }
  const char *topic_conf[] = {"min.insync.replicas", "1", NULL};
  if (!obx_test_broker_topic(&fx->broker, "wt", partitions, topic_conf, fx->topic, sizeof fx->topic) ||
      !obx_test_mongo_start(&fx->m, mongo_args)) {
    obx_test_broker_stop(&fx->broker);
    free(fx);
    fail_msg("the topic was not created or devmongod did not start");
  }
  if (!(fx->httpd = obx_test_httpd_start())) {
    obx_test_mongo_stop(&fx->m);
    obx_test_broker_stop(&fx->broker);
    free(fx);
    fail_msg("the scripted ERP did not start");
  }
  snprintf(fx->prefix, sizeof fx->prefix, "wt.%s.%d", obx_test_unique(), seq);
  snprintf(fx->group, sizeof fx->group, "wt-%s-%d", obx_test_unique(), seq++);
  obx_conf_init(&fx->conf);
  wt_conf_set(fx, "mongo.uri", fx->m.uri);
  wt_conf_set(fx, "kafka.brokers", fx->broker.bootstrap);
  wt_conf_set(fx, "kafka.topic", fx->topic);
  wt_conf_set(fx, "amqp.url", getenv("AMQP_URL"));
  wt_conf_set(fx, "worker.queue_prefix", fx->prefix);
  wt_conf_set(fx, "worker.group", fx->group);
  wt_conf_set(fx, "worker.retry_ladder", "200ms,500ms");
  /* the suites test the queues themselves; test_worker_ops turns the store's drain on */
  wt_conf_set(fx, "worker.dlq_drain", "false");
  wt_conf_set(fx, "egress.allow_networks", "127.0.0.0/8");
  obx_err_t err = OBX_ERR_INIT;
  fx->mongo = obx_mongo_new(&fx->conf, &err);
  assert_non_null(fx->mongo);
  fx->client = obx_mongo_pop(fx->mongo);
  wt_create_pipeline(fx);
  obx_ladder_opts_t lo = {.url = getenv("AMQP_URL"), .prefix = fx->prefix, .tiers_ms = fx->conf.retry_ladder.ms,
                          .ntiers = fx->conf.retry_ladder.n};
  fx->ladder = obx_ladder_new(&lo, &err);
  int64_t deadline = obx_test_now_ms() + 30000; /* a broker still booting gets time */
  bool connected = false;
  while (fx->ladder && !(connected = obx_ladder_connect(fx->ladder, &err)) && obx_test_now_ms() < deadline)
    usleep(100 * 1000);
  if (!connected) {
    obx_ladder_destroy(fx->ladder); /* nothing declared: nothing for teardown to delete */
    fx->ladder = NULL;
    wt_teardown(fx);
    fail_msg("ladder: %s", err.msg);
  }
  char errstr[256];
  rd_kafka_conf_t *pc = rd_kafka_conf_new();
  rd_kafka_conf_set(pc, "bootstrap.servers", fx->broker.bootstrap, errstr, sizeof errstr);
  rd_kafka_conf_set(pc, "partitioner", "murmur2_random", errstr, sizeof errstr);
  fx->producer = rd_kafka_new(RD_KAFKA_PRODUCER, pc, errstr, sizeof errstr);
  if (!fx->producer) fail_msg("producer: %s", errstr);
  return fx;
}

static inline wt_fx_t *wt_setup(int partitions, const char *mongo_args) { return wt_setup_on(partitions, mongo_args, false); }

/* Per-test cmocka setup of the suites that need only the fixture: wt_setup(partitions,
 * mongo_args) into *state; nothing when AMQP_URL or OBX_TEST_KAFKA_DIR is unset (the tests then
 * skip, WT_NEED_BROKER). */
static inline int wt_setup_state_on(void **state, int partitions, const char *mongo_args) {
  if (!getenv("AMQP_URL") || !getenv("OBX_TEST_KAFKA_DIR")) return 0;
  wt_fx_t *fx = wt_setup(partitions, mongo_args);
  *state = fx;
  return fx ? 0 : -1;
}

static inline int wt_setup_state_with(void **state, const char *mongo_args) { return wt_setup_state_on(state, 3, mongo_args); }

static inline int wt_setup_state(void **state) { return wt_setup_state_with(state, NULL); }

/* A worker in WORKER_SOURCE=http mode: the fixture (one partition, unused), the shared HTTP
 * server and the sink's own listener (port), token-authenticated with token. */
typedef struct {
  wt_fx_t *fx;
  obx_http_t *http;
  int port;     /* the sink's */
  int api_port; /* the shared server's */
} wt_sink_fx_t;

/* cmocka setup: a wt_sink_fx_t into *state once the sink is ready (MongoDB answers, the schema
 * is in place); nothing when AMQP_URL is unset (the tests then skip, WT_NEED_BROKER). */
static inline int wt_sink_setup(void **state, const char *token) {
  if (!getenv("AMQP_URL")) return 0;
  wt_sink_fx_t *s = calloc(1, sizeof *s);
  s->fx = wt_setup(1, NULL);
  wt_conf_set(s->fx, "worker.source", "http");
  wt_conf_set(s->fx, "http.port", "0");
  wt_conf_set(s->fx, "http.bind", "127.0.0.1");
  wt_conf_set(s->fx, "worker.sink_port", "0");
  wt_conf_set(s->fx, "worker.sink_token", token);
  obx_err_t err = OBX_ERR_INIT;
  s->http = obx_http_new(&s->fx->conf, &err);
  if (!s->http) fail_msg("http: %s", err.msg);
  s->fx->worker = obx_worker_new(&s->fx->conf, s->http, &err);
  if (!s->fx->worker) fail_msg("worker: %s", err.msg);
  if (!obx_http_start(s->http, &err)) fail_msg("http start: %s", err.msg);
  s->api_port = obx_http_port(s->http);
  s->port = obx_worker_sink_port(s->fx->worker);
  assert_true(s->port > 0 && s->port != s->api_port);
  /* a broker routes to the sink once it is ready (MongoDB answers, the schema is in place) */
  if (!obx_test_wait_for(obx_test_http_ready, &s->port, 30000, 20)) fail_msg("the sink never became ready");
  *state = s;
  return 0;
}

static inline int wt_sink_teardown(void **state) {
  wt_sink_fx_t *s = *state;
  if (!s) return 0;
  obx_http_stop(s->http);
  obx_worker_destroy(s->fx->worker);
  s->fx->worker = NULL;
  obx_http_destroy(s->http);
  wt_teardown(s->fx);
  free(s);
  return 0;
}

static inline void wt_start_worker(wt_fx_t *fx) {
  char n[16];
  snprintf(n, sizeof n, "%d", fx->attempts);
  wt_conf_set(fx, "worker.attempts", n);
  obx_err_t err = OBX_ERR_INIT;
  fx->worker = obx_worker_new(&fx->conf, NULL, &err);
  if (!fx->worker) fail_msg("worker: %s", err.msg);
}


static inline void wt_event(obx_event_t *ev, const char *type, const char *key, const char *order_number) {
  obx_event_init(ev);
  ev->event_type = strdup(type);
  ev->org_id = strdup(WT_ORG);
  ev->aggregate_type = strdup("Order");
  ev->aggregate_id = strdup(key);
  ev->source = strdup("/test/orders");
  BSON_APPEND_UTF8(&ev->payload, "orderNumber", order_number);
  BSON_APPEND_INT32(&ev->payload, "totalAmount", 1250);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_finalize(ev, &err)) fail_msg("event: %s", err.msg);
}

/* Produces a record to partition (RD_KAFKA_PARTITION_UA: the key's) and waits for its delivery. */
static inline void wt_produce_record_to(wt_fx_t *fx, int32_t partition, const char *key, size_t key_len,
                                        const char *value, size_t len, const obx_ce_header_t *h, int nh) {
  rd_kafka_headers_t *hdrs = rd_kafka_headers_new((size_t)nh);
  for (int i = 0; i < nh; i++) rd_kafka_header_add(hdrs, h[i].name, -1, h[i].value, (ssize_t)h[i].len);
  rd_kafka_resp_err_t rerr =
    rd_kafka_producev(fx->producer, RD_KAFKA_V_TOPIC(fx->topic), RD_KAFKA_V_PARTITION(partition),
                      RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE((void *)value, len),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END);
  if (rerr) {
    rd_kafka_headers_destroy(hdrs);
    fail_msg("produce: %s", rd_kafka_err2str(rerr));
  }
  if (rd_kafka_flush(fx->producer, 20000) != RD_KAFKA_RESP_ERR_NO_ERROR) fail_msg("produce: flush timed out");
}

static inline void wt_produce_record(wt_fx_t *fx, const char *key, size_t key_len, const char *value, size_t len,
                                     const obx_ce_header_t *h, int nh) {
  wt_produce_record_to(fx, RD_KAFKA_PARTITION_UA, key, key_len, value, len, h, nh);
}

/* Produces ev as the relay would (with its ce_keyseq when ev->key_seq is set) to partition
 * (RD_KAFKA_PARTITION_UA: its key's). */
static inline void wt_produce_to(wt_fx_t *fx, const obx_event_t *ev, int32_t partition) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_to_kafka(ev, NULL, &rec, &err)) fail_msg("to_kafka: %s", err.msg);
  wt_produce_record_to(fx, partition, rec.key, rec.key_len, rec.value, rec.value_len, rec.headers, rec.nheaders);
  obx_kafka_record_cleanup(&rec);
}

static inline void wt_produce(wt_fx_t *fx, const obx_event_t *ev) { wt_produce_to(fx, ev, RD_KAFKA_PARTITION_UA); }

/* A record whose value is not JSON, with otherwise plausible headers. */
static inline void wt_produce_raw(wt_fx_t *fx, const char *key, const char *value, const char *id) {
  obx_ce_header_t h[] = {{"ce_specversion", "1.0", 3}, {"ce_id", id, strlen(id)}, {"ce_type", "OrderConfirmed", 14},
                         {"ce_source", "/test", 5}, {"ce_orgid", WT_ORG, strlen(WT_ORG)}};
  wt_produce_record(fx, key, strlen(key), value, strlen(value), h, 5);
}

static inline void wt_route_delay(wt_fx_t *fx, const char *num, int status, int delay_ms) {
  char path[512];
  snprintf(path, sizeof path, "/erp/%s", num);
  obx_test_httpd_route_t r = {.path = path, .status = status, .body = "{\"ok\": true}", .delay_ms = delay_ms};
  obx_test_httpd_route(fx->httpd, &r);
}

static inline void wt_route(wt_fx_t *fx, const char *num, int status) { wt_route_delay(fx, num, status, 0); }

/* Index of the last captured request to /erp/<num>, -1 when none; *count receives how many. */
static inline int wt_calls(wt_fx_t *fx, const char *num, int *count) {
  char path[512];
  snprintf(path, sizeof path, "/erp/%s", num);
  int last = -1, n = 0, total = obx_test_httpd_nrequests(fx->httpd);
  for (int i = 0; i < total; i++) {
    obx_test_httpd_request_t req;
    if (!obx_test_httpd_request(fx->httpd, i, &req)) continue;
    if (strcmp(req.path, path) == 0) {
      last = i;
      n++;
    }
    obx_test_httpd_request_cleanup(&req);
  }
  if (count) *count = n;
  return last;
}

static inline int wt_erp_calls(wt_fx_t *fx, const char *num) {
  int n;
  wt_calls(fx, num, &n);
  return n;
}

static inline int wt_last_call_index(wt_fx_t *fx, const char *num) { return wt_calls(fx, num, NULL); }

static inline void wt_wait_calls(wt_fx_t *fx, const char *num, int want) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_erp_calls(fx, num) < want && obx_test_now_ms() < deadline) usleep(10000);
  int got = wt_erp_calls(fx, num);
  if (got < want) fail_msg("ERP calls to %s: got %d, want %d", num, got, want);
}

/* The inbox entry of an event (consumer = the group); empty when absent. */
static inline bool wt_inbox(wt_fx_t *fx, const char *id, bson_t *doc) {
  bool found = false;
  obx_err_t err = OBX_ERR_INIT;
  bson_init(doc);
  if (!obx_inbox_get(fx->client, obx_mongo_db_name(fx->mongo), NULL, fx->group, id, doc, &found, &err))
    print_message("inbox read: %s\n", err.msg);
  return found;
}

static inline void wt_wait_status(wt_fx_t *fx, const char *id, const char *want) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  char got[32] = "(none)";
  for (;;) {
    bson_t doc;
    bson_iter_t it;
    if (wt_inbox(fx, id, &doc) && bson_iter_init_find(&it, &doc, "status") && BSON_ITER_HOLDS_UTF8(&it))
      snprintf(got, sizeof got, "%s", bson_iter_utf8(&it, NULL));
    bson_destroy(&doc);
    if (strcmp(got, want) == 0) return;
    if (obx_test_now_ms() > deadline) fail_msg("inbox status of %s: got %s, want %s", id, got, want);
    usleep(20000);
  }
}

static inline int64_t wt_inbox_int(wt_fx_t *fx, const char *id, const char *field) {
  bson_t doc;
  bson_iter_t it;
  int64_t v = -1;
  if (wt_inbox(fx, id, &doc) && bson_iter_init_find(&it, &doc, field) && BSON_ITER_HOLDS_NUMBER(&it))
    v = bson_iter_as_int64(&it);
  bson_destroy(&doc);
  return v;
}

/* A string field of an event's inbox entry into out; "(none)" when the entry or field is absent. */
static inline const char *wt_inbox_str(wt_fx_t *fx, const char *id, const char *field, char *out, size_t len) {
  bson_t doc;
  bool found = wt_inbox(fx, id, &doc);
  const char *v = found ? obx_mongo_doc_str(&doc, field) : NULL;
  snprintf(out, len, "%s", v ? v : "(none)");
  bson_destroy(&doc);
  return out;
}

static inline int64_t wt_count(wt_fx_t *fx, const char *collection, const bson_t *filter) {
  mongoc_collection_t *c = mongoc_client_get_collection(fx->client, obx_mongo_db_name(fx->mongo), collection);
  bson_error_t berr;
  int64_t n = mongoc_collection_count_documents(c, filter, NULL, NULL, NULL, &berr);
  if (n < 0) fail_msg("count %s: %s", collection, berr.message);
  mongoc_collection_destroy(c);
  return n;
}

static inline int64_t wt_executions(wt_fx_t *fx, const char *id) {
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "eventId", id);
  int64_t n = wt_count(fx, "pipeline_executions", &filter);
  bson_destroy(&filter);
  return n;
}

static inline int64_t wt_audit_count(wt_fx_t *fx, const char *action, const char *target) {
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "action", action);
  BSON_APPEND_UTF8(&filter, "target", target);
  int64_t n = wt_count(fx, "audit_log", &filter);
  bson_destroy(&filter);
  return n;
}

static inline bool wt_key_parked(wt_fx_t *fx, const char *key) {
  bool parked = false;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_key_parked(fx->client, obx_mongo_db_name(fx->mongo), NULL, fx->group, key, &parked, NULL, &err))
    fail_msg("parked: %s", err.msg);
  return parked;
}

/* A key is unparked right after its head's outcome is written: wait for it. */
static inline void wt_wait_unparked(wt_fx_t *fx, const char *key) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_key_parked(fx, key))
    if (obx_test_now_ms() > deadline) fail_msg("key %s: got parked, want released", key);
    else usleep(20000);
}

static inline void wt_wait_depth(wt_fx_t *fx, const char *queue, uint32_t want) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  uint32_t got = UINT32_MAX;
  for (;;) {
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ladder_queue_depth(fx->ladder, queue, &got, &err)) print_message("depth: %s\n", err.msg);
    if (got == want) return;
    if (obx_test_now_ms() > deadline) fail_msg("depth of %s: got %u, want %u", queue, got, want);
    usleep(50000);
  }
}

/* Value of one series (name with its labels, as printed) in this process's /metrics text
 * (obx_metrics_render, the body GET /metrics serves); -1 when the series is absent. */
static inline double wt_metric(const char *series) {
  char *text = obx_metrics_render(NULL);
  double v = -1;
  size_t n = strlen(series);
  for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, series, n) == 0 && line[n] == ' ') {
      v = strtod(line + n + 1, NULL);
      break;
    }
  free(text);
  return v;
}

/* "-X key=value" pairs that point a child process (outboxd, outboxctl) at this fixture.
 * Fills args (at least 2 * WT_NCONF entries) with pointers into bufs; returns the count. */
#define WT_NCONF 9
static inline int wt_conf_args(wt_fx_t *fx, char bufs[WT_NCONF][320], char **args) {
  const char *keys[WT_NCONF] = {"mongo.uri", "kafka.brokers", "kafka.topic", "amqp.url", "worker.queue_prefix",
                                "worker.group", "worker.retry_ladder", "egress.allow_networks", "worker.attempts"};
  int n = 0;
  for (int i = 0; i < WT_NCONF; i++) {
    char *v = obx_conf_get_string(&fx->conf, keys[i], true);
    snprintf(bufs[i], 320, "%s=%s", keys[i], v);
    free(v);
    args[n++] = "-X";
    args[n++] = bufs[i];
  }
  return n;
}

/* Runs outboxctl with `cmd` (space-separated words, no quoting) and the fixture's
 * configuration; stdout+stderr go to out. Returns the exit status (-1 when it did not run). */
static inline int wt_ctl(wt_fx_t *fx, char *out, size_t outlen, const char *cmd) {
  char bufs[WT_NCONF][320], *args[2 * WT_NCONF];
  int n = wt_conf_args(fx, bufs, args);
  char line[8192];
  int pos = snprintf(line, sizeof line, "%s %s --who wt-tester", obx_test_build_path("outboxctl"), cmd);
  for (int i = 0; i < n; i++) pos += snprintf(line + pos, sizeof line - (size_t)pos, " '%s'", args[i]);
  snprintf(line + pos, sizeof line - (size_t)pos, " 2>&1");
  FILE *p = popen(line, "r");
  if (!p) return -1;
  size_t len = fread(out, 1, outlen - 1, p);
  out[len] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

typedef struct {
  int n;
  char id[8][64];
  char reason[8][128];
  int attempt[8];
} wt_dlq_seen_t;

static inline bool wt_dlq_collect(void *ctx, const obx_envelope_t *msg) {
  wt_dlq_seen_t *s = ctx;
  if (s->n >= 8) return false;
  snprintf(s->id[s->n], sizeof s->id[0], "%s", msg->message_id ? msg->message_id : "");
  snprintf(s->reason[s->n], sizeof s->reason[0], "%s", msg->reason ? msg->reason : "");
  s->attempt[s->n++] = msg->attempt;
  return true;
}

/* Inbox entries of the fixture's consumer that are in `status`. */
static inline int64_t wt_inbox_count(wt_fx_t *fx, const char *status) {
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "_id.consumer", fx->group);
  BSON_APPEND_UTF8(&filter, "status", status);
  int64_t n = wt_count(fx, "inbox", &filter);
  bson_destroy(&filter);
  return n;
}

/* Starts the real `outboxd --roles worker` with the fixture's configuration and then the
 * "key=value" settings of extra (NULL or NULL-terminated, at most 4; a key set twice takes the
 * later value). A killed member leaves no goodbye: a short Kafka session lets the group move on
 * quickly. */
static inline void wt_start_worker_process_with(wt_fx_t *fx, obx_test_outboxd_t *d, const char *const *extra) {
  char bufs[WT_NCONF][320], *args[2 * WT_NCONF + 16];
  int n = 0;
  args[n++] = "--roles";
  args[n++] = "worker";
  n += wt_conf_args(fx, bufs, args + n);
  args[n++] = "-X";
  args[n++] = "kafka.session.timeout.ms=6000";
  args[n++] = "-X";
  args[n++] = "kafka.heartbeat.interval.ms=1000";
  for (int i = 0; extra && extra[i] && i < 4; i++) {
    args[n++] = "-X";
    args[n++] = (char *)extra[i];
  }
  args[n] = NULL;
  if (!obx_test_outboxd_start(d, args)) fail_msg("outboxd --roles worker did not start");
}

static inline void wt_start_worker_process(wt_fx_t *fx, obx_test_outboxd_t *d) { wt_start_worker_process_with(fx, d, NULL); }

/* Lines of a log file (a worker process's) that contain `what`. */
static inline int wt_log_lines(const char *path, const char *what) {
  FILE *f = fopen(path, "r");
  char buf[4096];
  int n = 0;
  while (f && fgets(buf, sizeof buf, f))
    if (strstr(buf, what)) n++;
  if (f) fclose(f);
  return n;
}

/* Stops the n worker processes of d (a SIGSTOPped one is continued first) and zeroes them: the
 * teardown of suites that run replicas beside the fixture, also after a failed test. */
static inline void wt_stop_worker_processes(obx_test_outboxd_t *d, int n) {
  for (int i = 0; i < n; i++) {
    if (d[i].proc.pid > 0) kill(d[i].proc.pid, SIGCONT);
    obx_test_outboxd_stop(&d[i]);
  }
  memset(d, 0, (size_t)n * sizeof *d);
}

#endif
