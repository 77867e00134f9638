/* worker_bench.c - worker throughput next to a raw librdkafka consumer on the same records
 *
 *   worker_bench MONGO_URI BOOTSTRAP N CONCURRENCY [AMQP_URL]
 *
 * Produces N CloudEvents (binary mode, as the relay writes them, N/50 keys) to domain-events,
 * stores a one-node order.post pipeline (start), then
 *   1. raw: a plain librdkafka consumer (own group, manual commit off) reads the N records and
 *      does nothing else;
 *   2. worker: obx_worker (inbox claim, pipeline run, outcome transaction, contiguous offset
 *      commits) consumes the same N records with CONCURRENCY lanes.
 * Prints both rates and worker/raw. Run by scripts/bench/worker.sh, which starts the services. */
#include <librdkafka/rdkafka.h>
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
#include "obx/obx_worker.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "worker_bench: %s: %s\n", what, why);
  exit(1);
}

static void produce(const char *bootstrap, int n) {
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
    snprintf(key, sizeof key, "B-%d", i % (n / 50 > 0 ? n / 50 : 1));
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
    while ((rerr = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("domain-events"), RD_KAFKA_V_KEY(rec.key, rec.key_len),
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

/* Seconds for a plain consumer to read n records (from the first record received). */
static double raw_consume(const char *bootstrap, int n) {
  char errstr[256];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, errstr, sizeof errstr);
  rd_kafka_conf_set(kc, "group.id", "bench-raw", errstr, sizeof errstr);
  rd_kafka_conf_set(kc, "auto.offset.reset", "earliest", errstr, sizeof errstr);
  rd_kafka_conf_set(kc, "enable.auto.commit", "false", errstr, sizeof errstr);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, errstr, sizeof errstr);
  if (!rk) die("consumer", errstr);
  rd_kafka_poll_set_consumer(rk);
  rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, "domain-events", RD_KAFKA_PARTITION_UA);
  rd_kafka_subscribe(rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  int got = 0;
  double start = 0, deadline = now_s() + 120;
  while (got < n && now_s() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (!m) continue;
    if (!m->err) {
      if (!got) start = now_s();
      got++;
    }
    rd_kafka_message_destroy(m);
  }
  double took = now_s() - start;
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  if (got < n) die("raw consumer", "did not read every record within 120 s");
  return took;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: worker_bench MONGO_URI BOOTSTRAP N CONCURRENCY [AMQP_URL]\n");
    return 2;
  }
  const char *uri = argv[1], *bootstrap = argv[2];
  int n = atoi(argv[3]);
  obx_log_set_level(OBX_LOG_WARN);
  obx_log_set_stream(stderr);
  obx_conf_t conf;
  obx_conf_init(&conf);
  obx_err_t err = OBX_ERR_INIT;
  const char *settings[][2] = {{"mongo.uri", uri},          {"kafka.brokers", bootstrap},
                               {"worker.concurrency", argv[4]}, {"worker.group", "bench-worker"},
                               {"worker.queue_prefix", "bench"}, {"amqp.url", argc > 5 ? argv[5] : "amqp://127.0.0.1:1/"}};
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
    if (!obx_conf_set(&conf, settings[i][0], settings[i][1], &err)) die(settings[i][0], err.msg);

  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  if (!mongo) die("mongo", err.msg);
  mongoc_client_t *client = obx_mongo_pop(mongo);
  const char *def_json = "{\"name\": \"bench\", \"trigger\": \"order.post\", \"enabled\": true,"
                         " \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}], \"edges\": []}";
  bson_error_t berr;
  bson_t *def = bson_new_from_json((const uint8_t *)def_json, -1, &berr);
  if (!def || !obx_pipeline_store_create(client, obx_mongo_db_name(mongo), "bench", def, NULL, &err))
    die("pipeline", def ? err.msg : berr.message);
  bson_destroy(def);
  obx_mongo_push(mongo, client);

  produce(bootstrap, n);
  double raw = raw_consume(bootstrap, n);

  obx_worker_t *worker = obx_worker_new(&conf, NULL, &err);
  if (!worker) die("worker", err.msg);
  obx_worker_stats_t s;
  double start = 0, deadline = now_s() + 600;
  do {
    usleep(5000);
    obx_worker_stats(worker, &s);
    if (!start && s.consumed) start = now_s();
  } while (s.runs_succeeded + s.duplicates < (uint64_t)n && now_s() < deadline);
  double took = now_s() - start;
  obx_worker_destroy(worker);
  if (s.runs_succeeded + s.duplicates < (uint64_t)n) die("worker", "did not finish within 600 s");

  printf("records                 %d (keys %d, partitions of domain-events)\n", n, n / 50 > 0 ? n / 50 : 1);
  printf("raw librdkafka consumer %10.0f records/s  (%.3f s)\n", n / raw, raw);
  printf("worker, %s lanes        %10.0f events/s   (%.3f s; inbox + one-node pipeline + outcome transaction)\n",
         argv[4], n / took, took);
  printf("worker / raw            %10.4f\n", (n / took) / (n / raw));
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
  return 0;
}
