/* worker_bench.c - worker throughput against its baselines, side by side in one run
 *
 *   worker_bench MONGO_URI BOOTSTRAP N CONCURRENCY SLOW_EVENTS SLOW_KEYS BOUND OTHER_BOUND [AMQP_URL]
 *
 * (a) instant pipeline: produces N CloudEvents (binary mode, as the relay writes them, N/50 keys)
 *     to topic bench-instant; the durable floor issues the writes the worker makes for each of
 *     them directly through libmongoc from CONCURRENCY threads (the inbox entry inserted with its
 *     claim, then one transaction: the pipeline_executions document and the inbox update to
 *     DONE; into collections with the worker's indexes); then obx_worker (CONCURRENCY runners, a one-node order.post pipeline) consumes the
 *     same N records. Ratio: worker events/s / floor events/s. Then once more with
 *     WORKER_MAX_INFLIGHT=N, so that the Kafka intake never holds a partition: the difference is
 *     what holding the partitions at the bound costs.
 * (b) a 50 ms endpoint: SLOW_EVENTS events over SLOW_KEYS keys (key i % SLOW_KEYS) to topic
 *     bench-slow, a pipeline start -> http-request to a stub in this process that answers every
 *     call after 50 ms, the worker with CONCURRENCY runners and WORKER_MAX_INFLIGHT=BOUND (the
 *     worker's default). Ratio: worker events/s / (min(keys, BOUND) / 50 ms), the rate at which
 *     the endpoint's latency alone would let the in-flight bound through; then once more with
 *     WORKER_MAX_INFLIGHT=OTHER_BOUND, for context (at 500, min(keys, bound) / 50 ms is 10 000
 *     events/s, above the durable floor: MongoDB's writes bound that ratio, not the worker); then once more with
 *     WORKER_MAX_INFLIGHT=SLOW_EVENTS against the never-paused instant run of (a): near 1 when
 *     the endpoint's latency costs nothing once the intake is not paused. The synchronous
 *     runners' bound (CONCURRENCY / 50 ms) is printed below the table.
 * Every part has its own database. The rate of a worker part runs from its first event consumed
 * to its last event run. Run by scripts/bench/worker.sh, which starts devmongod and kafka-mockd. */
#include <librdkafka/rdkafka.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obx/obx_conf.h"
#include "obx/obx_event.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_schema.h"
#include "obx/obx_worker.h"

#define ENDPOINT_MS 50

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "worker_bench: %s: %s\n", what, why);
  exit(1);
}

/* Produces n events of `keys` keys (event i has key i % keys) to topic. */
static void produce(const char *bootstrap, const char *topic, int n, int keys) {
  char errstr[256];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, errstr, sizeof errstr);
  rd_kafka_conf_set(kc, "partitioner", "murmur2_random", errstr, sizeof errstr);
  rd_kafka_conf_set(kc, "linger.ms", "5", errstr, sizeof errstr);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, errstr, sizeof errstr);
  if (!rk) die("producer", errstr);
  for (int i = 0; i < n; i++) {
    obx_event_t ev;
    obx_event_init(&ev);
    char key[32], num[32];
    snprintf(key, sizeof key, "B-%d", i % keys);
    snprintf(num, sizeof num, "N-%d", i);
    ev.event_type = strdup("OrderConfirmed");
    ev.org_id = strdup("bench");
    ev.aggregate_type = strdup("Order");
    ev.aggregate_id = strdup(key);
    ev.source = strdup("/bench");
    BSON_APPEND_UTF8(&ev.payload, "orderNumber", num);
    BSON_APPEND_INT32(&ev.payload, "totalAmount", 4990);
    obx_kafka_record_t rec;
    memset(&rec, 0, sizeof rec);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_event_finalize(&ev, &err) || !obx_event_to_kafka(&ev, NULL, &rec, &err)) die("event", err.msg);
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new((size_t)rec.nheaders);
    for (int h = 0; h < rec.nheaders; h++)
      rd_kafka_header_add(hdrs, rec.headers[h].name, -1, rec.headers[h].value, (ssize_t)rec.headers[h].len);
    rd_kafka_resp_err_t rerr;
    while ((rerr = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(rec.key, rec.key_len),
                                     RD_KAFKA_V_VALUE(rec.value, rec.value_len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                     RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
      rd_kafka_poll(rk, 10);
    if (rerr) die("produce", rd_kafka_err2str(rerr));
    obx_kafka_record_cleanup(&rec);
    obx_event_cleanup(&ev);
  }
  if (rd_kafka_flush(rk, 60000)) die("produce", "flush timed out");
  rd_kafka_destroy(rk);
}

/* ---- the durable floor: the worker's writes of an event, straight through libmongoc -------- */

#define FLOOR_DB "bench_floor"

typedef struct {
  mongoc_client_pool_t *pool;
  mongoc_transaction_opt_t *txn_opts; /* majority, as the worker's outcome transaction */
  atomic_int next;
  int n;
} floor_t;

static bool floor_txn(mongoc_client_session_t *session, void *ctx, bson_t **reply, bson_error_t *error) {
  const char *id = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  (void)reply;
  mongoc_collection_t *execs = mongoc_client_get_collection(client, FLOOR_DB, "pipeline_executions");
  mongoc_collection_t *inbox = mongoc_client_get_collection(client, FLOOR_DB, "inbox");
  bson_t opts = BSON_INITIALIZER;
  mongoc_client_session_append(session, &opts, NULL);
  bson_t *exec = BCON_NEW("_id", BCON_UTF8(id), "pipelineName", "bench", "orgId", "bench", "trigger", "order.post",
                          "eventId", BCON_UTF8(id), "attempt", BCON_INT32(1), "status", "SUCCEEDED", "startedAt",
                          BCON_DATE_TIME(0), "finishedAt", BCON_DATE_TIME(0), "durationMs", BCON_INT64(0), "steps",
                          "[", "{", "nodeId", "start", "type", "start", "status", "SUCCEEDED", "}", "]");
  bson_t *filter = BCON_NEW("_id", "{", "consumer", "bench", "eventId", BCON_UTF8(id), "}", "owner", "bench-floor",
                            "status", "RECEIVED");
  bson_t *update = BCON_NEW("$set", "{", "status", "DONE", "processedAt", BCON_DATE_TIME(0), "}", "$push", "{",
                            "executionIds", BCON_UTF8(id), "}", "$unset", "{", "owner", "", "leaseUntil", "", "}");
  bool ok = mongoc_collection_insert_one(execs, exec, &opts, NULL, error) &&
            mongoc_collection_update_one(inbox, filter, update, &opts, NULL, error);
  bson_destroy(update);
  bson_destroy(filter);
  bson_destroy(exec);
  bson_destroy(&opts);
  mongoc_collection_destroy(inbox);
  mongoc_collection_destroy(execs);
  return ok;
}

static void *floor_main(void *arg) {
  floor_t *f = arg;
  mongoc_client_t *client = mongoc_client_pool_pop(f->pool);
  mongoc_collection_t *inbox = mongoc_client_get_collection(client, FLOOR_DB, "inbox");
  for (int i; (i = atomic_fetch_add(&f->next, 1)) < f->n;) {
    char id[64];
    snprintf(id, sizeof id, "floor-%d", i);
    bson_t *entry = BCON_NEW("_id", "{", "consumer", "bench", "eventId", BCON_UTF8(id), "}", "status", "RECEIVED",
                             "eventType", "OrderConfirmed", "orgId", "bench", "partitionKey", BCON_UTF8(id), "topic",
                             "bench-instant", "partition", BCON_INT32(0), "offset", BCON_INT64(i), "seq", BCON_INT64(i),
                             "attempts", BCON_INT32(0), "owner", "bench-floor", "leaseUntil", BCON_DATE_TIME(0),
                             "receivedAt", BCON_DATE_TIME(0), "payload", "{", "orderNumber", BCON_UTF8(id),
                             "totalAmount", BCON_INT32(4990), "}");
    bson_error_t berr;
    if (!mongoc_collection_insert_one(inbox, entry, NULL, NULL, &berr)) die("floor inbox insert", berr.message);
    bson_destroy(entry);
    mongoc_client_session_t *session = mongoc_client_start_session(client, NULL, &berr);
    if (!session) die("floor session", berr.message);
    if (!mongoc_client_session_with_transaction(session, floor_txn, f->txn_opts, id, NULL, &berr))
      die("floor transaction", berr.message);
    mongoc_client_session_destroy(session);
  }
  mongoc_collection_destroy(inbox);
  mongoc_client_pool_push(f->pool, client);
  return NULL;
}

static void set(obx_conf_t *conf, const char *key, const char *value);

/* Events/s of the floor: n events from `threads` threads, into collections with the worker's
 * indexes (obx_schema_ensure, as the worker's schema guard makes them). */
static double durable_floor(const char *uri, int n, int threads) {
  obx_conf_t conf;
  obx_conf_init(&conf);
  set(&conf, "mongo.uri", uri);
  set(&conf, "mongo.db", FLOOR_DB);
  obx_err_t err = OBX_ERR_INIT;
  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  if (!mongo || !obx_schema_ensure(mongo, &conf, OBX_SCHEMA_WORKER, &err)) die("floor schema", err.msg);
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
  bson_error_t berr;
  mongoc_uri_t *u = mongoc_uri_new_with_error(uri, &berr);
  if (!u) die("floor uri", berr.message);
  floor_t f = {.pool = mongoc_client_pool_new(u), .txn_opts = mongoc_transaction_opts_new(), .n = n};
  mongoc_uri_destroy(u);
  mongoc_write_concern_t *wc = mongoc_write_concern_new();
  mongoc_write_concern_set_w(wc, MONGOC_WRITE_CONCERN_W_MAJORITY);
  mongoc_transaction_opts_set_write_concern(f.txn_opts, wc);
  mongoc_write_concern_destroy(wc);
  mongoc_client_pool_max_size(f.pool, (uint32_t)threads);
  pthread_t tids[threads];
  double start = now_s();
  for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, floor_main, &f);
  for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
  double took = now_s() - start;
  mongoc_client_pool_destroy(f.pool);
  mongoc_transaction_opts_destroy(f.txn_opts);
  return n / took;
}

/* ---- the 50 ms endpoint --------------------------------------------------------------------- */

static atomic_int endpoint_calls;

static enum MHD_Result endpoint(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)cls, (void)url, (void)method, (void)version, (void)upload;
  if (!*con_cls) { /* the headers: the body follows */
    *con_cls = conn;
    return MHD_YES;
  }
  if (*upload_size) {
    *upload_size = 0;
    return MHD_YES;
  }
  usleep(ENDPOINT_MS * 1000);
  atomic_fetch_add(&endpoint_calls, 1);
  static const char body[] = "{\"ok\": true}";
  struct MHD_Response *r = MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
  MHD_add_response_header(r, "Content-Type", "application/json");
  enum MHD_Result ret = MHD_queue_response(conn, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- the worker ------------------------------------------------------------------------------ */

static void set(obx_conf_t *conf, const char *key, const char *value) {
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_conf_set(conf, key, value, &err)) die(key, err.msg);
}

/* Events/s of the worker over n events of topic into db, running pipeline_json. */
static double worker_rate(const char *uri, const char *bootstrap, const char *amqp, const char *concurrency,
                          const char *bound, const char *topic, const char *db, const char *pipeline_json, int n) {
  obx_conf_t conf;
  obx_conf_init(&conf);
  const char *settings[][2] = {{"mongo.uri", uri},           {"mongo.db", db},
                               {"kafka.brokers", bootstrap}, {"kafka.topic", topic},
                               {"worker.concurrency", concurrency}, {"worker.max_inflight", bound},
                               {"worker.group", db},         {"worker.queue_prefix", db},
                               {"amqp.url", amqp},           {"egress.allow_networks", "127.0.0.0/8"}};
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) set(&conf, settings[i][0], settings[i][1]);
  obx_err_t err = OBX_ERR_INIT;
  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  if (!mongo) die("mongo", err.msg);
  mongoc_client_t *client = obx_mongo_pop(mongo);
  bson_error_t berr;
  bson_t *def = bson_new_from_json((const uint8_t *)pipeline_json, -1, &berr);
  if (!def || !obx_pipeline_store_create(client, obx_mongo_db_name(mongo), "bench", def, NULL, &err))
    die("pipeline", def ? err.msg : berr.message);
  bson_destroy(def);
  obx_mongo_push(mongo, client);

  obx_worker_t *worker = obx_worker_new(&conf, NULL, &err);
  if (!worker) die("worker", err.msg);
  obx_worker_stats_t s;
  double start = 0, deadline = now_s() + 300;
  do {
    usleep(2000);
    obx_worker_stats(worker, &s);
    if (!start && s.consumed) start = now_s();
  } while (s.runs_succeeded + s.duplicates < (uint64_t)n && now_s() < deadline);
  double took = now_s() - start;
  obx_worker_destroy(worker);
  if (s.runs_succeeded + s.duplicates < (uint64_t)n) {
    fprintf(stderr, "worker_bench: %s: %llu consumed, %llu succeeded, %llu failed, %llu duplicates of %d\n", db,
            (unsigned long long)s.consumed, (unsigned long long)s.runs_succeeded, (unsigned long long)s.runs_failed,
            (unsigned long long)s.duplicates, n);
    die("worker", "did not finish within 300 s");
  }
  if (s.runs_failed) die("worker", "pipeline runs failed");
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
  return n / took;
}

int main(int argc, char **argv) {
  if (argc < 9) {
    fprintf(stderr,
            "usage: worker_bench MONGO_URI BOOTSTRAP N CONCURRENCY SLOW_EVENTS SLOW_KEYS BOUND OTHER_BOUND [AMQP_URL]\n");
    return 2;
  }
  const char *uri = argv[1], *bootstrap = argv[2], *concurrency = argv[4], *bound = argv[7], *other_bound = argv[8];
  const char *amqp = argc > 9 ? argv[9] : "amqp://127.0.0.1:1/";
  int n = atoi(argv[3]), threads = atoi(concurrency), slow_n = atoi(argv[5]), slow_keys = atoi(argv[6]);
  int inflight = atoi(bound);
  obx_log_set_level(OBX_LOG_WARN);
  obx_log_set_stream(stderr);
  /* every call in flight holds a socket at each end, both in this process */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }

  /* (a) */
  int keys = n / 50 > 0 ? n / 50 : 1;
  produce(bootstrap, "bench-instant", n, keys);
  double floor_rate = durable_floor(uri, n, threads);
  double instant = worker_rate(uri, bootstrap, amqp, concurrency, bound, "bench-instant", "bench_a",
                               "{\"name\": \"bench\", \"trigger\": \"order.post\", \"enabled\": true,"
                               " \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}], \"edges\": []}",
                               n);

  /* (a) again with a bound past the records: the intake never holds a partition (what holding costs) */
  char all[32];
  snprintf(all, sizeof all, "%d", n);
  double unpaused = worker_rate(uri, bootstrap, amqp, concurrency, all, "bench-instant", "bench_a2",
                                "{\"name\": \"bench\", \"trigger\": \"order.post\", \"enabled\": true,"
                                " \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}], \"edges\": []}",
                                n);

  /* (b) */
  struct MHD_Daemon *httpd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0,
                                              NULL, NULL, endpoint, NULL, MHD_OPTION_CONNECTION_LIMIT, 4000U,
                                              MHD_OPTION_END);
  if (!httpd) die("endpoint", "MHD_start_daemon failed");
  int port = MHD_get_daemon_info(httpd, MHD_DAEMON_INFO_BIND_PORT)->port;
  char json[1024];
  snprintf(json, sizeof json,
           "{\"name\": \"bench\", \"trigger\": \"order.post\", \"enabled\": true, \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"erp\", \"type\": \"http-request\", \"config\": {\"url\": \"http://127.0.0.1:%d/erp\","
           " \"body\": {\"n\": \"{{orderNumber}}\"}}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"erp\"}]}",
           port);
  produce(bootstrap, "bench-slow", slow_n, slow_keys);
  double slow = worker_rate(uri, bootstrap, amqp, concurrency, bound, "bench-slow", "bench_b", json, slow_n);
  double slow_other = worker_rate(uri, bootstrap, amqp, concurrency, other_bound, "bench-slow", "bench_b3", json, slow_n);
  char all_slow[32];
  snprintf(all_slow, sizeof all_slow, "%d", slow_n);
  double slow_unpaused = worker_rate(uri, bootstrap, amqp, concurrency, all_slow, "bench-slow", "bench_b2", json, slow_n);
  MHD_stop_daemon(httpd);
  if (atomic_load(&endpoint_calls) < slow_n) die("endpoint", "fewer calls than events");
  double ideal = (slow_keys < inflight ? slow_keys : inflight) * 1000.0 / ENDPOINT_MS;
  int other = atoi(other_bound);
  double ideal_other = (slow_keys < other ? slow_keys : other) * 1000.0 / ENDPOINT_MS;
  double sync_bound = threads * 1000.0 / ENDPOINT_MS;

  printf("| case | worker events/s | baseline | baseline events/s | worker / baseline | target |\n");
  printf("| --- | --- | --- | --- | --- | --- |\n");
  printf("| (a) instant pipeline, %d events, %d keys, WORKER_MAX_INFLIGHT %d | %.0f | durable floor: inbox insert + transaction "
         "(execution, inbox DONE) via libmongoc, %d threads | %.0f | %.2f | >= 0.8 |\n",
         n, keys, inflight, instant, threads, floor_rate, instant / floor_rate);
  printf("| (a) the same, WORKER_MAX_INFLIGHT %d (the intake never held) | %.0f | durable floor | %.0f | %.2f | "
         "(context) |\n",
         n, unpaused, floor_rate, unpaused / floor_rate);
  printf("| (b) %d ms endpoint, %d events, %d keys, WORKER_MAX_INFLIGHT %d | %.0f | min(keys, bound) / %d ms | "
         "%.0f | %.2f | >= 0.8 |\n",
         ENDPOINT_MS, slow_n, slow_keys, inflight, slow, ENDPOINT_MS, ideal, slow / ideal);
  printf("| (b) the same, WORKER_MAX_INFLIGHT %d (min(keys, bound) / %d ms against the durable floor's %.0f) | %.0f | "
         "min(keys, bound) / %d ms | %.0f | %.2f | (context) |\n",
         other, ENDPOINT_MS, floor_rate, slow_other, ENDPOINT_MS, ideal_other, slow_other / ideal_other);
  printf("| (b) the same, WORKER_MAX_INFLIGHT %d (the intake never paused) | %.0f | (a) never paused: the same "
         "worker with no call | %.0f | %.2f | (context) |\n",
         slow_n, slow_unpaused, unpaused, slow_unpaused / unpaused);
  printf("\nsynchronous runners' bound (%d runners / %d ms): %.0f events/s; (b) against it: %.1fx\n", threads,
         ENDPOINT_MS, sync_bound, slow / sync_bound);
  return 0;
}
