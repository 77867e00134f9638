/* test_kafka_broker.c - outboxd against a real Apache Kafka broker, with Kafka's own Java
 * client and CLI tools as witnesses
 *
 * Every test drives outboxd as a process (`outboxd --roles relay` / `--roles worker`) on a
 * devmongod of its own, with topics and a consumer group of its own on the run's shared broker
 * (scripts/test.sh), or on a private broker when the test freezes or kills it:
 *   test_relay_java_consumer       the relay's records, read by the Java consumer, sit on the
 *                                  partition Kafka's default partitioner gives their key and
 *                                  carry the CloudEvents headers; each event exactly once
 *   test_java_producer_worker      records written by the Java producer are run by the worker
 *                                  (inbox DONE, one ERP call each); Kafka's ConsumerGroupCommand
 *                                  shows the worker's group with committed offsets at the log end
 *   test_commit_after_inbox        while an event's pipeline runs, the group's committed offset
 *                                  never passes it before the inbox holds its outcome
 *   test_group_rebalance           a second worker joins and the first leaves while events run:
 *                                  every event DONE with exactly one execution
 *   test_relay_broker_outage       the relay's idempotent producer across SIGSTOP/SIGCONT and
 *                                  SIGKILL + restart of the broker: every event once, none lost
 *   test_paused_leader_is_fenced   relay.fencing=transactions: a leader frozen (SIGSTOP) past
 *                                  its lease with records in its producer's queue is fenced by
 *                                  the new leader's init_transactions; once thawed it gets none
 *                                  of them into the topic (read_committed Java witness: every
 *                                  event exactly once, the new leader's copy)
 *   test_worker_broker_outage      the worker across SIGSTOP/SIGCONT and SIGKILL + restart of
 *                                  the broker: every event DONE once
 *   test_kafka_sh_lifecycle        scripts/kafka.sh status/stop/start of one broker find its JVM
 *                                  every time, stop is idempotent and leaves another broker
 *                                  running, a restart keeps port and records */
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_event.h"
#include "obx/obx_pipeline.h"
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_httpd.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#define WAIT_MS 60000
#define ORG "org-kb"
#define MAX_EVENTS 128
#define OUT_LEN (256 * 1024)

typedef struct {
  obx_test_broker_t broker; /* the shared one, or a private one (own) */
  obx_test_mongo_t m;
  mongoc_client_t *client;
  obx_test_httpd_t *httpd;
  obx_test_outboxd_t d[2];  /* the outboxd processes of the test */
  char db[64], topic[128], group[128], prefix[64];
  int partitions;
} fx_t;

/* One test at a time: the teardown (which cmocka runs after a failure too) finds it here. */
static fx_t g_fx;

/* ---- fixture --------------------------------------------------------------------------- */

static void fx_setup(fx_t *fx, bool private_broker, const char *name, int partitions) {
  static int seq;
  memset(fx, 0, sizeof *fx);
  if (private_broker) {
    obx_test_require(obx_test_have(access("/usr/bin/java", X_OK) == 0, "java not installed") &&
                       obx_test_broker_start(&fx->broker),
                     "no private Kafka broker (scripts/kafka.sh start failed)");
  } else {
    obx_test_require(obx_test_broker_shared(&fx->broker),
                     "no Kafka broker for this run (OBX_TEST_KAFKA_DIR; scripts/test.sh starts one)");
  }
  if (!obx_test_mongo_start(&fx->m, NULL)) fail_msg("devmongod did not start");
  fx->client = obx_test_mongo_client(&fx->m, NULL, "kafka-broker-test");
  snprintf(fx->db, sizeof fx->db, "kb_%s_%d", name, seq);
  snprintf(fx->prefix, sizeof fx->prefix, "kb.%d.%d", (int)getpid(), seq++);
  fx->partitions = partitions;
  const char *configs[] = {"min.insync.replicas", "1", "retention.ms", "3600000", NULL};
  if (!obx_test_broker_topic(&fx->broker, name, partitions, configs, fx->topic, sizeof fx->topic))
    fail_msg("topic %s not created", name);
  obx_test_broker_group(name, fx->group, sizeof fx->group);
}

static int fx_teardown(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  for (int i = 0; i < 2; i++) {
    if (fx->d[i].proc.pid > 0) kill(fx->d[i].proc.pid, SIGCONT); /* a test that failed while it was frozen */
    obx_test_outboxd_stop(&fx->d[i]);
  }
  if (fx->httpd) obx_test_httpd_stop(fx->httpd);
  if (fx->client) mongoc_client_destroy(fx->client);
  obx_test_mongo_stop(&fx->m);
  obx_test_broker_stop(&fx->broker);
  memset(fx, 0, sizeof *fx);
  return 0;
}

/* ---- outboxd processes ------------------------------------------------------------------ */

/* outboxd --roles ROLE pointed at the fixture; extra: NULL or NULL-terminated "-X" values. */
static void start_outboxd(fx_t *fx, obx_test_outboxd_t *d, const char *role, const char *const *extra) {
  char kv[16][320];
  char *args[48];
  int n = 0, k = 0;
  args[n++] = "--roles";
  args[n++] = (char *)role;
#define KV(...) (snprintf(kv[k], sizeof kv[k], __VA_ARGS__), args[n++] = "-X", args[n++] = kv[k++])
  KV("mongo.uri=%s", fx->m.uri);
  KV("mongo.db=%s", fx->db);
  KV("kafka.brokers=%s", fx->broker.bootstrap);
  KV("kafka.topic=%s", fx->topic);
  if (strcmp(role, "worker") == 0) {
    KV("amqp.url=%s", getenv("AMQP_URL"));
    KV("worker.queue_prefix=%s", fx->prefix);
    KV("worker.group=%s", fx->group);
    KV("worker.retry_ladder=200ms,500ms");
    KV("egress.allow_networks=127.0.0.0/8");
    /* A member that leaves without a goodbye is noticed quickly. */
    KV("kafka.session.timeout.ms=6000");
    KV("kafka.heartbeat.interval.ms=1000");
  } else {
    KV("relay.lease=2s");
    KV("outbox.poll_interval=300");
  }
#undef KV
  for (int i = 0; extra && extra[i] && n < 46; i++) {
    args[n++] = "-X";
    args[n++] = (char *)extra[i];
  }
  args[n] = NULL;
  if (!obx_test_outboxd_start(d, args)) fail_msg("outboxd --roles %s did not start (log: %s)", role, d->proc.log_path);
}

static void start_worker(fx_t *fx, obx_test_outboxd_t *d) {
  obx_test_require(getenv("AMQP_URL") != NULL, "AMQP_URL not set: the worker needs RabbitMQ");
  start_outboxd(fx, d, "worker", NULL);
}

/* ---- MongoDB side ---------------------------------------------------------------------- */

static int64_t count(fx_t *fx, const char *collection, const char *json) {
  bson_error_t berr;
  bson_t *filter = bson_new_from_json((const uint8_t *)json, -1, &berr);
  if (!filter) fail_msg("filter %s: %s", json, berr.message);
  mongoc_collection_t *c = mongoc_client_get_collection(fx->client, fx->db, collection);
  int64_t n = mongoc_collection_count_documents(c, filter, NULL, NULL, NULL, &berr);
  if (n < 0) print_message("count %s %s: %s\n", collection, json, berr.message);
  mongoc_collection_destroy(c);
  bson_destroy(filter);
  return n;
}

static void wait_count(fx_t *fx, const char *collection, const char *json, int64_t want) {
  int64_t deadline = obx_test_now_ms() + WAIT_MS, got;
  while ((got = count(fx, collection, json)) < want && obx_test_now_ms() < deadline) usleep(100 * 1000);
  if (got != want) fail_msg("%s %s: got %lld, want %lld", collection, json, (long long)got, (long long)want);
}

static void wait_published(fx_t *fx, int64_t want) { wait_count(fx, "outbox", "{\"status\": \"PUBLISHED\"}", want); }

static void wait_done(fx_t *fx, int64_t want) {
  char json[256];
  snprintf(json, sizeof json, "{\"_id.consumer\": \"%s\", \"status\": \"DONE\"}", fx->group);
  wait_count(fx, "inbox", json, want);
}

static const char *inbox_status(fx_t *fx, const char *id, char *out, size_t outlen) {
  char json[512];
  snprintf(json, sizeof json, "{\"_id\": {\"consumer\": \"%s\", \"eventId\": \"%s\"}, \"status\": \"DONE\"}", fx->group, id);
  snprintf(out, outlen, "%s", count(fx, "inbox", json) == 1 ? "DONE" : "not DONE");
  return out;
}

static int64_t executions(fx_t *fx, const char *id) {
  char json[320];
  snprintf(json, sizeof json, "{\"eventId\": \"%s\"}", id);
  return count(fx, "pipeline_executions", json);
}

/* Inserts n PENDING outbox events over nkeys aggregate ids (Order/KB-<k>); ids to ids[first..]. */
static void insert_events(fx_t *fx, int first, int n, int nkeys, char (*ids)[OBX_UUID_LEN + 1]) {
  mongoc_collection_t *outbox = mongoc_client_get_collection(fx->client, fx->db, "outbox");
  for (int i = first; i < first + n; i++) {
    obx_event_t ev;
    obx_event_init(&ev);
    ev.event_type = strdup("OrderConfirmed");
    ev.org_id = strdup(ORG);
    ev.aggregate_type = strdup("Order");
    char agg[32];
    snprintf(agg, sizeof agg, "KB-%d", i % nkeys);
    ev.aggregate_id = strdup(agg);
    BSON_APPEND_INT32(&ev.payload, "seq", i);
    obx_err_t err = OBX_ERR_INIT;
    bson_t doc = BSON_INITIALIZER;
    if (!obx_event_finalize(&ev, &err) || !obx_event_to_outbox(&ev, &doc, &err)) fail_msg("event: %s", err.msg);
    memcpy(ids[i], ev.id, sizeof ids[0]);
    bson_error_t berr;
    if (!mongoc_collection_insert_one(outbox, &doc, NULL, NULL, &berr)) fail_msg("insert: %s", berr.message);
    bson_destroy(&doc);
    obx_event_cleanup(&ev);
  }
  mongoc_collection_destroy(outbox);
}

/* The order.post pipeline: POST /erp/{{orderNumber}} on the scripted ERP, which answers each
 * order number routed with route_erp (delay_ms before the answer). */
static void create_pipeline(fx_t *fx) {
  if (!(fx->httpd = obx_test_httpd_start())) fail_msg("scripted ERP did not start");
  char json[1024];
  obx_test_erp_pipeline_json(json, sizeof json, obx_test_httpd_url(fx->httpd, "/erp"));
  obx_test_pipeline_create(fx->client, fx->db, ORG, json);
}

static void route_erp(fx_t *fx, const char *number, int delay_ms) {
  char path[320];
  snprintf(path, sizeof path, "/erp/%s", number);
  obx_test_httpd_route_t r = {.path = path, .status = 200, .body = "{\"ok\": true}", .delay_ms = delay_ms};
  obx_test_httpd_route(fx->httpd, &r);
}

static int erp_calls(fx_t *fx, const char *number) {
  char path[320];
  snprintf(path, sizeof path, "/erp/%s", number);
  int n = 0, total = obx_test_httpd_nrequests(fx->httpd);
  for (int i = 0; i < total; i++) {
    obx_test_httpd_request_t req;
    if (!obx_test_httpd_request(fx->httpd, i, &req)) continue;
    if (strcmp(req.path, path) == 0) n++;
    obx_test_httpd_request_cleanup(&req);
  }
  return n;
}

/* ---- Java witness ------------------------------------------------------------------------ */

typedef struct {
  int partition, default_partition;
  long long offset;
  char key[64], specversion[16], id[OBX_UUID_LEN + 1], type[64], source[128], subject[96], orgid[32], pkey[64];
} record_t;

/* Splits one tab-separated line in place into at most max fields. */
static int split_tabs(char *line, char **f, int max) {
  int n = 0;
  for (char *save = NULL, *t = strtok_r(line, "\t", &save); t && n < max; t = strtok_r(NULL, "\t", &save)) f[n++] = t;
  return n;
}

/* The Java consumer reads `want` records of the topic from the beginning; returns how many. */
static int java_consume(fx_t *fx, int want, record_t *recs, int max) {
  char *out = malloc(OUT_LEN), wantstr[16];
  snprintf(wantstr, sizeof wantstr, "%d", want);
  const char *args[] = {obx_test_kafka_witness(), "consume", fx->broker.bootstrap, fx->topic, wantstr, "30000", NULL};
  int rc = obx_test_broker_java(&fx->broker, out, OUT_LEN, args);
  int n = 0;
  for (char *save = NULL, *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *f[16];
    if (strncmp(line, "record\t", 7) != 0) continue;
    if (split_tabs(line, f, 16) != 13) fail_msg("witness line with a wrong number of fields");
    if (n >= max) fail_msg("witness read more than %d records", max);
    record_t *r = &recs[n++];
    r->partition = atoi(f[1]);
    r->offset = atoll(f[2]);
    r->default_partition = atoi(f[3]);
    snprintf(r->key, sizeof r->key, "%s", f[4]);
    snprintf(r->specversion, sizeof r->specversion, "%s", f[5]);
    snprintf(r->id, sizeof r->id, "%s", f[6]);
    snprintf(r->type, sizeof r->type, "%s", f[7]);
    snprintf(r->source, sizeof r->source, "%s", f[8]);
    snprintf(r->subject, sizeof r->subject, "%s", f[9]);
    snprintf(r->orgid, sizeof r->orgid, "%s", f[10]);
    snprintf(r->pkey, sizeof r->pkey, "%s", f[11]);
  }
  free(out);
  if (rc != 0 && n >= want) fail_msg("witness consume exited %d", rc);
  return n;
}

/* The Java producer writes n OrderConfirmed records <prefix>-<i> over `keys` keys. */
static void java_produce(fx_t *fx, const char *prefix, int n, int keys) {
  char *out = malloc(OUT_LEN), nstr[16], kstr[16];
  snprintf(nstr, sizeof nstr, "%d", n);
  snprintf(kstr, sizeof kstr, "%d", keys);
  const char *args[] = {obx_test_kafka_witness(), "produce", fx->broker.bootstrap, fx->topic, ORG, "OrderConfirmed",
                        prefix, nstr, kstr, NULL};
  int rc = obx_test_broker_java(&fx->broker, out, OUT_LEN, args);
  char want[32];
  snprintf(want, sizeof want, "count %d\n", n);
  bool ok = rc == 0 && strstr(out, want);
  free(out);
  if (!ok) fail_msg("witness produce of %d records exited %d", n, rc);
}

/* Checks that the records hold each of ids[0..n) exactly once, each on its key's default
 * partition, with the relay's CloudEvents headers. */
static void check_relay_records(const record_t *recs, int got, char (*ids)[OBX_UUID_LEN + 1], int n) {
  for (int i = 0; i < n; i++) {
    int seen = 0;
    char where[256] = "";
    for (int j = 0; j < got; j++)
      if (strcmp(recs[j].id, ids[i]) == 0) {
        seen++;
        size_t w = strlen(where);
        snprintf(where + w, sizeof where - w, " %d@%lld", recs[j].partition, recs[j].offset);
      }
    if (seen != 1) fail_msg("event %d (%s): %d records (partition@offset:%s), want exactly 1", i, ids[i], seen, where);
  }
  if (got != n) fail_msg("Java consumer: got %d records, want %d", got, n);
  for (int j = 0; j < got; j++) {
    const record_t *r = &recs[j];
    if (r->partition != r->default_partition)
      fail_msg("record %s (key %s) on partition %d, Kafka's default partitioner gives %d", r->id, r->key, r->partition,
               r->default_partition);
    char subject[96];
    snprintf(subject, sizeof subject, "Order/%s", r->key);
    if (strcmp(r->specversion, "1.0") || strcmp(r->type, "OrderConfirmed") || strcmp(r->orgid, ORG) ||
        strcmp(r->subject, subject) || strcmp(r->pkey, r->key) || strcmp(r->source, "-") == 0)
      fail_msg("record %s: CloudEvents headers specversion=%s type=%s orgid=%s subject=%s partitionkey=%s source=%s",
               r->id, r->specversion, r->type, r->orgid, r->subject, r->pkey, r->source);
  }
}

/* ---- committed offsets ------------------------------------------------------------------- */

/* The group's committed offset of every partition (-1 when none) into off[]. */
static bool committed(fx_t *fx, int64_t *off) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", fx->broker.bootstrap, errstr, sizeof errstr);
  rd_kafka_conf_set(conf, "group.id", fx->group, errstr, sizeof errstr);
  rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof errstr);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
  if (!rk) fail_msg("consumer: %s", errstr);
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(fx->partitions);
  for (int p = 0; p < fx->partitions; p++) rd_kafka_topic_partition_list_add(l, fx->topic, p);
  bool ok = rd_kafka_committed(rk, l, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR;
  for (int p = 0; ok && p < fx->partitions; p++) off[p] = l->elems[p].err ? -1 : l->elems[p].offset;
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk); /* never subscribed: leaves no member behind */
  return ok;
}

static int64_t committed_total(fx_t *fx) {
  int64_t off[64], sum = 0;
  if (!committed(fx, off)) return -1;
  for (int p = 0; p < fx->partitions; p++) sum += off[p] > 0 ? off[p] : 0;
  return sum;
}

static void wait_committed_total(fx_t *fx, int64_t want) {
  int64_t deadline = obx_test_now_ms() + WAIT_MS, got;
  while ((got = committed_total(fx)) != want && obx_test_now_ms() < deadline) usleep(200 * 1000);
  if (got != want) fail_msg("group %s: committed offsets add up to %lld, want %lld", fx->group, (long long)got, (long long)want);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_relay_java_consumer(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, false, "relay-java", 4);
  static char ids[MAX_EVENTS][OBX_UUID_LEN + 1];
  obx_test_outboxd_t *relay = &fx->d[0];
  /* The first half waits for the relay's start-up scan, the second goes through its change
   * stream. */
  insert_events(fx, 0, 20, 10, ids);
  start_outboxd(fx, relay, "relay", NULL);
  wait_published(fx, 20);
  insert_events(fx, 20, 20, 10, ids);
  wait_published(fx, 40);
  static record_t recs[MAX_EVENTS];
  int got = java_consume(fx, 40, recs, MAX_EVENTS);
  check_relay_records(recs, got, ids, 40);
  int per_partition[4] = {0};
  for (int j = 0; j < got; j++) per_partition[recs[j].partition]++;
  for (int p = 0; p < 4; p++)
    if (per_partition[p] == 0) fail_msg("no record on partition %d: the keys did not spread", p);
  assert_int_equal(obx_test_outboxd_stop(relay), 0);
}

/* Parses ConsumerGroupCommand --describe rows of the topic: sums CURRENT-OFFSET and
 * LOG-END-OFFSET and counts rows with nothing left to read. */
static void describe_group(fx_t *fx, int *rows, long long *current, long long *end, int *zero_lag) {
  char *out = malloc(OUT_LEN);
  const char *args[] = {"org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server",
                        fx->broker.bootstrap, "--describe", "--group", fx->group, NULL};
  int rc = obx_test_broker_java(&fx->broker, out, OUT_LEN, args);
  if (rc != 0) fail_msg("ConsumerGroupCommand exited %d: %s", rc, out);
  *rows = 0, *current = 0, *end = 0, *zero_lag = 0;
  for (char *save = NULL, *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char g[160], t[160], cur[32], e[32], lag[32];
    int p;
    if (sscanf(line, "%159s %159s %d %31s %31s %31s", g, t, &p, cur, e, lag) != 6) continue;
    if (strcmp(g, fx->group) || strcmp(t, fx->topic)) continue;
    (*rows)++;
    *current += atoll(cur);
    *end += atoll(e);
    /* A partition no record went to has no committed offset: "-" for current and lag. */
    if (strcmp(lag, "0") == 0 || (strcmp(cur, "-") == 0 && strcmp(e, "0") == 0)) (*zero_lag)++;
  }
  free(out);
}

static void test_java_producer_worker(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, false, "java-worker", 3);
  create_pipeline(fx);
  char num[64];
  for (int i = 0; i < 12; i++) {
    snprintf(num, sizeof num, "JP%d-%d", (int)getpid(), i);
    route_erp(fx, num, 0);
  }
  obx_test_outboxd_t *worker = &fx->d[0];
  start_worker(fx, worker);
  snprintf(num, sizeof num, "JP%d", (int)getpid());
  java_produce(fx, num, 12, 4);
  wait_done(fx, 12);
  for (int i = 0; i < 12; i++) {
    snprintf(num, sizeof num, "JP%d-%d", (int)getpid(), i);
    if (erp_calls(fx, num) != 1) fail_msg("ERP calls for %s: got %d, want 1", num, erp_calls(fx, num));
    if (executions(fx, num) != 1) fail_msg("executions of %s: got %lld, want 1", num, (long long)executions(fx, num));
  }
  wait_committed_total(fx, 12);
  /* Kafka's own CLI sees the same: one row per partition, at the log end. */
  int rows, zero_lag;
  long long cur, end;
  describe_group(fx, &rows, &cur, &end, &zero_lag);
  if (rows != 3 || cur != 12 || end != 12 || zero_lag != 3)
    fail_msg("ConsumerGroupCommand --describe --group %s: %d rows, current %lld, log end %lld, %d at lag 0; want 3, "
             "12, 12, 3", fx->group, rows, cur, end, zero_lag);
  char *out = malloc(OUT_LEN);
  const char *targs[] = {"org.apache.kafka.tools.TopicCommand", "--bootstrap-server", fx->broker.bootstrap,
                         "--describe", "--topic", fx->topic, NULL};
  int rc = obx_test_broker_java(&fx->broker, out, OUT_LEN, targs);
  bool described = rc == 0 && strstr(out, "PartitionCount: 3") && strstr(out, "min.insync.replicas=1");
  free(out);
  if (!described) fail_msg("TopicCommand --describe --topic %s exited %d or lacks PartitionCount: 3", fx->topic, rc);
  assert_int_equal(obx_test_outboxd_stop(worker), 0);
}

static void test_commit_after_inbox(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, false, "commit-inbox", 1);
  create_pipeline(fx);
  char prefix[32], slow[64], id[160];
  snprintf(prefix, sizeof prefix, "CI%d", (int)getpid());
  for (int i = 0; i < 3; i++) {
    snprintf(id, sizeof id, "%s-%d", prefix, i);
    route_erp(fx, id, i == 1 ? 3000 : 0); /* the second event's ERP call takes 3 s */
  }
  snprintf(slow, sizeof slow, "%s-1", prefix);
  obx_test_outboxd_t *worker = &fx->d[0];
  start_worker(fx, worker);
  java_produce(fx, prefix, 3, 1); /* offsets 0, 1, 2 of partition 0, one key */
  /* Until the slow event's outcome is in the inbox, the committed offset stays at or below
   * its offset (1): read the offset first, then the inbox, so a commit past it must have
   * been preceded by the outcome. */
  bool seen_in_flight = false;
  int64_t deadline = obx_test_now_ms() + WAIT_MS, off[1] = {-1};
  char status[16] = "";
  for (;;) {
    if (!committed(fx, off)) fail_msg("committed offsets of %s not read", fx->group);
    inbox_status(fx, slow, status, sizeof status);
    if (off[0] > 1 && strcmp(status, "DONE") != 0)
      fail_msg("committed offset %lld passed event %s (offset 1) while its inbox entry is %s", (long long)off[0], slow,
               status);
    if (erp_calls(fx, slow) == 1 && strcmp(status, "DONE") != 0) seen_in_flight = true;
    if (off[0] == 3) break;
    if (obx_test_now_ms() > deadline) fail_msg("committed offset %lld, want 3", (long long)off[0]);
    usleep(50 * 1000);
  }
  if (!seen_in_flight) fail_msg("the slow ERP call of %s was never seen in flight", slow);
  wait_done(fx, 3);
  assert_int_equal(obx_test_outboxd_stop(worker), 0);
}

/* DONE inbox entries of the fixture's group among <prefix>-0 .. <prefix>-(n-1). */
static int done_of(fx_t *fx, const char *prefix, int n) {
  int done = 0;
  char id[160], status[16];
  for (int i = 0; i < n; i++) {
    snprintf(id, sizeof id, "%s-%d", prefix, i);
    if (strcmp(inbox_status(fx, id, status, sizeof status), "DONE") == 0) done++;
  }
  return done;
}

static void test_group_rebalance(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, false, "rebalance", 4);
  create_pipeline(fx);
  char prefix[3][32], num[160];
  for (int b = 0; b < 3; b++) {
    snprintf(prefix[b], sizeof prefix[b], "RB%d_%d", (int)getpid(), b);
    for (int i = 0; i < 16; i++) {
      snprintf(num, sizeof num, "%s-%d", prefix[b], i);
      route_erp(fx, num, b < 2 ? 800 : 0); /* batches 0 and 1 still run while the group changes */
    }
  }
  obx_test_outboxd_t *a = &fx->d[0], *b = &fx->d[1];
  start_worker(fx, a);
  java_produce(fx, prefix[0], 16, 8);
  start_worker(fx, b); /* joins: the partitions are shared out again while batch 0 runs */
  int done = done_of(fx, prefix[0], 16);
  if (done == 16) fail_msg("batch 0 finished before the second worker joined: no rebalance under load");
  java_produce(fx, prefix[1], 16, 8);
  int64_t deadline = obx_test_now_ms() + WAIT_MS;
  while (done_of(fx, prefix[1], 16) == 0 && obx_test_now_ms() < deadline) usleep(50 * 1000);
  done = done_of(fx, prefix[1], 16);
  if (done == 0 || done == 16) fail_msg("batch 1: %d of 16 DONE when the first worker leaves, want some but not all", done);
  assert_int_equal(obx_test_outboxd_stop(a), 0); /* leaves while batch 1 runs: b takes every partition */
  java_produce(fx, prefix[2], 16, 8);
  wait_done(fx, 48);
  for (int bt = 0; bt < 3; bt++)
    for (int i = 0; i < 16; i++) {
      snprintf(num, sizeof num, "%s-%d", prefix[bt], i);
      if (executions(fx, num) != 1) fail_msg("executions of %s: got %lld, want 1", num, (long long)executions(fx, num));
    }
  wait_committed_total(fx, 48);
  assert_int_equal(obx_test_outboxd_stop(b), 0);
}

/* Waits for `ms` and fails if the outbox's PUBLISHED count moves off `want` meanwhile: the
 * broker is frozen, so nothing can be acknowledged. */
static void hold_published(fx_t *fx, int64_t want, int ms) {
  int64_t until = obx_test_now_ms() + ms, got;
  while (obx_test_now_ms() < until) {
    if ((got = count(fx, "outbox", "{\"status\": \"PUBLISHED\"}")) != want)
      fail_msg("PUBLISHED while the broker is stopped: got %lld, want %lld", (long long)got, (long long)want);
    usleep(200 * 1000);
  }
}

static void test_relay_broker_outage(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, true, "relay-outage", 3);
  static char ids[MAX_EVENTS][OBX_UUID_LEN + 1];
  obx_test_outboxd_t *relay = &fx->d[0];
  insert_events(fx, 0, 20, 6, ids); /* published by the start-up scan */
  /* Produce requests sent to the frozen broker (3 s) time out after 1 s and are sent again:
   * once thawed the broker may read a batch twice, and its idempotent-producer state must keep
   * one copy (the check below: every event exactly once). */
  const char *const settings[] = {"kafka.request.timeout.ms=1000", NULL};
  start_outboxd(fx, relay, "relay", settings);
  wait_published(fx, 20);

  assert_true(obx_test_broker_signal(&fx->broker, SIGSTOP));
  insert_events(fx, 20, 20, 6, ids);
  hold_published(fx, 20, 3000);
  assert_true(obx_test_broker_signal(&fx->broker, SIGCONT));
  wait_published(fx, 40);

  assert_true(obx_test_broker_signal(&fx->broker, SIGKILL));
  insert_events(fx, 40, 20, 6, ids);
  assert_true(obx_test_broker_restart(&fx->broker));
  wait_published(fx, 60);
  assert_true(obx_test_proc_alive(&relay->proc));

  static record_t recs[MAX_EVENTS];
  int got = java_consume(fx, 60, recs, MAX_EVENTS);
  check_relay_records(recs, got, ids, 60);
  assert_int_equal(obx_test_outboxd_stop(relay), 0);
}

/* outboxd_relay_inflight of the relay listening on port (-1 when /metrics did not answer). */
static int relay_inflight(int port) {
  obx_test_http_resp_t resp;
  int n = -1;
  if (obx_test_http(port, "GET", "/metrics", NULL, NULL, NULL, &resp) && resp.status == 200 && resp.body) {
    const char *line = strstr(resp.body, "\noutboxd_relay_inflight ");
    if (line) n = atoi(line + strlen("\noutboxd_relay_inflight "));
  }
  obx_test_http_resp_cleanup(&resp);
  return n;
}

static void test_paused_leader_is_fenced(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, false, "relay-zombie", 3);
  static char ids[MAX_EVENTS][OBX_UUID_LEN + 1];
  obx_test_outboxd_t *old = &fx->d[0], *fresh = &fx->d[1];
  /* the old leader's records wait 3 s in its producer (linger): the SIGSTOP freezes them there */
  const char *const old_settings[] = {"relay.fencing=transactions", "kafka.linger.ms=3000", NULL};
  const char *const new_settings[] = {"relay.fencing=transactions", NULL};
  insert_events(fx, 0, 5, 5, ids); /* published by the old leader's start-up scan */
  start_outboxd(fx, old, "relay", old_settings);
  wait_published(fx, 5);
  insert_events(fx, 5, 10, 5, ids);
  int64_t deadline = obx_test_now_ms() + WAIT_MS;
  while (relay_inflight(old->port) < 5 && obx_test_now_ms() < deadline) usleep(20 * 1000);
  if (relay_inflight(old->port) < 5) fail_msg("the old leader never had the new events in flight");
  assert_int_equal(kill(old->proc.pid, SIGSTOP), 0);
  /* the new leader takes the lease once the old one's expired (relay.lease 2 s), fences the old
   * producer and publishes the events itself */
  start_outboxd(fx, fresh, "relay", new_settings);
  wait_published(fx, 15);
  assert_int_equal(kill(old->proc.pid, SIGCONT), 0);
  /* thawed, its producer sends the frozen records and learns it is fenced */
  if (!obx_test_file_contains(old->proc.log_path, "fatal error", WAIT_MS))
    fail_msg("the thawed leader's producer was not fenced (log: %s)", old->proc.log_path);
  static record_t recs[MAX_EVENTS];
  int got = java_consume(fx, 15, recs, MAX_EVENTS);
  check_relay_records(recs, got, ids, 15);
  assert_int_equal(obx_test_outboxd_stop(fresh), 0);
  assert_int_equal(obx_test_outboxd_stop(old), 0);
}

static void test_worker_broker_outage(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, true, "worker-outage", 2);
  create_pipeline(fx);
  char prefix[3][32], num[160];
  for (int b = 0; b < 3; b++) {
    snprintf(prefix[b], sizeof prefix[b], "WO%d_%d", (int)getpid(), b);
    for (int i = 0; i < 8; i++) {
      snprintf(num, sizeof num, "%s-%d", prefix[b], i);
      route_erp(fx, num, 0);
    }
  }
  obx_test_outboxd_t *worker = &fx->d[0];
  start_worker(fx, worker);
  java_produce(fx, prefix[0], 8, 4);
  wait_done(fx, 8);

  assert_true(obx_test_broker_signal(&fx->broker, SIGSTOP));
  assert_true(obx_test_broker_signal(&fx->broker, SIGCONT));
  java_produce(fx, prefix[1], 8, 4);
  wait_done(fx, 16);

  assert_true(obx_test_broker_signal(&fx->broker, SIGKILL));
  assert_true(obx_test_broker_restart(&fx->broker));
  java_produce(fx, prefix[2], 8, 4);
  wait_done(fx, 24);
  assert_true(obx_test_proc_alive(&worker->proc));
  for (int b = 0; b < 3; b++)
    for (int i = 0; i < 8; i++) {
      snprintf(num, sizeof num, "%s-%d", prefix[b], i);
      if (executions(fx, num) != 1) fail_msg("executions of %s: got %lld, want 1", num, (long long)executions(fx, num));
    }
  wait_committed_total(fx, 24);
  assert_int_equal(obx_test_outboxd_stop(worker), 0);
}

/* Some process listens on 127.0.0.1:port. */
static bool port_listens(const char *bootstrap) {
  const char *colon = strrchr(bootstrap, ':');
  char cmd[128];
  snprintf(cmd, sizeof cmd, "ss -Hltn 'sport = :%d' | grep -q .", colon ? atoi(colon + 1) : 0);
  return system(cmd) == 0;
}

static void test_kafka_sh_lifecycle(void **state) {
  (void)state;
  fx_t *fx = &g_fx;
  fx_setup(fx, true, "lifecycle", 1);
  obx_test_broker_t other;
  if (!obx_test_broker_start(&other)) fail_msg("a second private broker did not start");
  pid_t pid = obx_test_broker_pid(&fx->broker), other_pid = obx_test_broker_pid(&other);
  /* The JVM is found on every look, not on most (its command line is long). */
  for (int i = 0; i < 10; i++)
    if (obx_test_broker_script(&fx->broker, "status") != 0) {
      obx_test_broker_stop(&other);
      fail_msg("kafka.sh status, look %d: not running, yet pid %d runs", i, (int)pid);
    }
  java_produce(fx, "LC", 3, 3);
  char bootstrap[sizeof fx->broker.bootstrap];
  memcpy(bootstrap, fx->broker.bootstrap, sizeof bootstrap);
  int stop_rc = obx_test_broker_script(&fx->broker, "stop");
  bool gone = obx_test_pid_gone(&pid), listens = port_listens(bootstrap);
  int status_rc = obx_test_broker_script(&fx->broker, "status");
  int again_rc = obx_test_broker_script(&fx->broker, "stop");
  bool other_runs = !obx_test_pid_gone(&other_pid) && obx_test_broker_script(&other, "status") == 0;
  obx_test_broker_stop(&other);
  if (stop_rc != 0 || !gone || listens) fail_msg("kafka.sh stop: exit %d, JVM gone %d, port open %d", stop_rc, gone, listens);
  if (status_rc != 3) fail_msg("kafka.sh status after stop: exit %d, want 3", status_rc);
  if (again_rc != 0) fail_msg("kafka.sh stop a second time: exit %d, want 0", again_rc);
  if (!other_runs) fail_msg("stopping one broker stopped the other");
  assert_true(obx_test_broker_restart(&fx->broker));
  assert_string_equal(fx->broker.bootstrap, bootstrap);
  static record_t recs[8];
  int got = java_consume(fx, 3, recs, 8);
  if (got != 3) fail_msg("after a stop and start the topic holds %d records, want 3", got);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_teardown(test_relay_java_consumer, fx_teardown),
    cmocka_unit_test_teardown(test_java_producer_worker, fx_teardown),
    cmocka_unit_test_teardown(test_commit_after_inbox, fx_teardown),
    cmocka_unit_test_teardown(test_group_rebalance, fx_teardown),
    cmocka_unit_test_teardown(test_relay_broker_outage, fx_teardown),
    cmocka_unit_test_teardown(test_paused_leader_is_fenced, fx_teardown),
    cmocka_unit_test_teardown(test_worker_broker_outage, fx_teardown),
    cmocka_unit_test_teardown(test_kafka_sh_lifecycle, fx_teardown),
  };
  if (getenv("OBX_TEST_FILTER")) cmocka_set_test_filter(getenv("OBX_TEST_FILTER")); /* e.g. "test_relay_*" */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
