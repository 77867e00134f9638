/* test_relay.c - the relay against devmongod and a real Apache Kafka broker, or kafka-mockd
 * where a test injects Kafka faults
 *
 * DESIGN: one devmongod for the whole file; each test uses its own database and topic, so
 * relays of one test never see another's events. A test's topic is on the run's Kafka broker
 * (scripts/test.sh, OBX_TEST_KAFKA_DIR; ctx_init), except for the tests that inject protocol
 * errors or take every broker down through kafka-mockd's control socket (ctx_init_mock: a
 * failed publish's backoff, a 20 s outage with its memory bound, produce errors that hold a
 * key, a fatal idempotent-producer error), which a real broker cannot be made to answer.
 * Relays run in this process (obx_relay_start) except where a crash is the point: there the
 * real outboxd runs with --roles relay and is killed with SIGKILL. What reaches Kafka is read
 * back with a consumer; "exactly once" is the topic's record count (read to its end, as a
 * read_committed consumer sees it). Three tests run the relay with relay.fencing=transactions:
 * a failed publish (the abort with Kafka down), produce errors that hold a key (a refused record
 * aborts its transaction, the others are produced again) and the kill -9 (the survivor's
 * init_transactions aborts the open transaction of the dead one). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mongoc/mongoc.h>

#include "obx/obx_conf.h"
#include "obx/obx_event.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"
#include "obx/obx_relay.h"
#include "obx_test.h"
#include "obx_test_kafka.h"
#include "obx_test_fixture.h"
#include "../../src/relay/relay_int.h"

static obx_test_mongo_t g_mongo;
static obx_test_broker_t g_broker; /* the run's Kafka broker */
static obx_test_kafka_t g_kafka;   /* kafka-mockd, for the fault-injecting tests */
static mongoc_client_t *g_client;

/* ---- per-test context ------------------------------------------------------------------ */

#define MAX_EVENTS 12000

typedef struct {
  char db[64], topic[64];
  const char *bootstrap;         /* the broker the topic is on */
  obx_conf_t conf;
  mongoc_client_t *client;
  mongoc_collection_t *outbox;
  int n;                         /* events inserted */
  char (*ids)[OBX_UUID_LEN + 1]; /* in insertion (= commit) order */
  int *key_of;                   /* key index of each event */
  size_t pad;                    /* bytes of filler in each event's payload (0: none) */
  bool *skipped;                 /* per event: skipped by an operator, never to reach Kafka */
  bool aborted_visible;          /* kafka-mockd with the transactional producer: see kafka_check */
} ctx_t;

/* A test's database and configuration, its topic on kafka-mockd (mock) or else a topic of 3
 * partitions on the run's broker. */
static void ctx_init_on(ctx_t *ctx, const char *name, const obx_test_mongo_t *mongo, const char *const *settings,
                        bool mock, const char *const *topic_configs) {
  static int serial;
  memset(ctx, 0, sizeof *ctx);
  snprintf(ctx->db, sizeof ctx->db, "relay_%s_%d", name, ++serial);
  if (mock) {
    snprintf(ctx->topic, sizeof ctx->topic, "events-%s-%d", name, serial);
    ctx->bootstrap = g_kafka.bootstrap;
  } else {
    char base_name[64];
    snprintf(base_name, sizeof base_name, "relay-%s", name);
    if (!obx_test_broker_topic(&g_broker, base_name, 3, topic_configs, ctx->topic, sizeof ctx->topic))
      fail_msg("topic %s not created on the run's broker", base_name);
    ctx->bootstrap = g_broker.bootstrap;
  }
  obx_conf_init(&ctx->conf);
  obx_err_t err = OBX_ERR_INIT;
  const char *base[] = {"mongo.uri", mongo->uri, "mongo.db", ctx->db, "kafka.brokers", ctx->bootstrap,
                        "kafka.topic", ctx->topic, "relay.lease", "2s", "outbox.poll_interval", "300",
                        "relay.checkpoint_interval", "100", "log.level", "warn", NULL};
  for (int i = 0; base[i]; i += 2)
    if (!obx_conf_set(&ctx->conf, base[i], base[i + 1], &err)) fail_msg("conf %s: %s", base[i], err.msg);
  for (int i = 0; settings && settings[i]; i += 2)
    if (!obx_conf_set(&ctx->conf, settings[i], settings[i + 1], &err)) fail_msg("conf %s: %s", settings[i], err.msg);
  ctx->client = obx_test_mongo_client(mongo, NULL, "relay-test");
  ctx->outbox = mongoc_client_get_collection(ctx->client, ctx->db, "outbox");
  ctx->ids = calloc(MAX_EVENTS, sizeof *ctx->ids);
  ctx->key_of = calloc(MAX_EVENTS, sizeof *ctx->key_of);
  ctx->skipped = calloc(MAX_EVENTS, sizeof *ctx->skipped);
}

static void ctx_init(ctx_t *ctx, const char *name, const obx_test_mongo_t *mongo, const char *const *settings) {
  ctx_init_on(ctx, name, mongo, settings, false, NULL);
}

/* For a test that injects Kafka faults (kafka-mockd's control socket). */
static void ctx_init_mock(ctx_t *ctx, const char *name, const obx_test_mongo_t *mongo, const char *const *settings) {
  ctx_init_on(ctx, name, mongo, settings, true, NULL);
}

static void ctx_cleanup(ctx_t *ctx) {
  mongoc_collection_destroy(ctx->outbox);
  mongoc_client_destroy(ctx->client);
  obx_conf_cleanup(&ctx->conf);
  free(ctx->ids);
  free(ctx->key_of);
  free(ctx->skipped);
}

/* Inserts n PENDING events spread over nkeys partition keys, in batches. */
static void insert_events(ctx_t *ctx, int n, int nkeys) {
  mongoc_bulk_operation_t *bulk = NULL;
  for (int i = 0; i < n; i++) {
    int k = ctx->n % nkeys;
    obx_event_t ev;
    obx_event_init(&ev);
    ev.event_type = strdup("OrderConfirmed");
    ev.org_id = strdup("org-1");
    ev.aggregate_type = strdup("Order");
    char agg[32];
    snprintf(agg, sizeof agg, "ORD-%04d", k);
    ev.aggregate_id = strdup(agg);
    BSON_APPEND_INT32(&ev.payload, "seq", ctx->n);
    if (ctx->pad) {
      char *pad = malloc(ctx->pad + 1);
      memset(pad, 'x', ctx->pad);
      pad[ctx->pad] = 0;
      BSON_APPEND_UTF8(&ev.payload, "pad", pad);
      free(pad);
    }
    obx_err_t err = OBX_ERR_INIT;
    bson_t doc = BSON_INITIALIZER;
    if (!obx_event_finalize(&ev, &err) || !obx_event_to_outbox(&ev, &doc, &err)) fail_msg("event: %s", err.msg);
    memcpy(ctx->ids[ctx->n], ev.id, sizeof ctx->ids[0]);
    ctx->key_of[ctx->n] = k;
    ctx->n++;
    if (!bulk) bulk = mongoc_collection_create_bulk_operation_with_opts(ctx->outbox, NULL);
    mongoc_bulk_operation_insert(bulk, &doc);
    bson_destroy(&doc);
    obx_event_cleanup(&ev);
    if ((i + 1) % 500 == 0 || i + 1 == n) {
      bson_error_t berr;
      if (!mongoc_bulk_operation_execute(bulk, NULL, &berr)) fail_msg("insert: %s", berr.message);
      mongoc_bulk_operation_destroy(bulk);
      bulk = NULL;
    }
  }
}

static int64_t count_docs(mongoc_collection_t *coll, const char *json) {
  bson_error_t berr;
  bson_t *filter = bson_new_from_json((const uint8_t *)json, -1, &berr);
  assert_non_null(filter);
  int64_t n = mongoc_collection_count_documents(coll, filter, NULL, NULL, NULL, &berr);
  if (n < 0) print_message("count %s: %s\n", json, berr.message);
  bson_destroy(filter);
  return n;
}

typedef struct {
  ctx_t *ctx;
  const char *filter;
  int64_t want;
} count_wait_t;

static bool count_reached(void *arg) {
  count_wait_t *w = arg;
  return count_docs(w->ctx->outbox, w->filter) >= w->want;
}

static void wait_published(ctx_t *ctx, int64_t want, int timeout_ms) {
  count_wait_t w = {ctx, "{\"status\": \"PUBLISHED\"}", want};
  if (!obx_test_wait_for(count_reached, &w, timeout_ms, 100))
    fail_msg("PUBLISHED: got %lld want %lld", (long long)count_docs(ctx->outbox, w.filter), (long long)want);
}

static obx_relay_t *relay_start(ctx_t *ctx) {
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_t *relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay start: %s", err.msg);
  return relay;
}

/* ---- reading Kafka back ---------------------------------------------------------------- */

typedef struct {
  ctx_t *ctx;
  int *seen;          /* per event: times received */
  int *last_of_key;   /* per key: highest event index received first-time so far */
  int records, unknown, order_errors, header_errors;
  int32_t *partition; /* per event: partition of its first copy */
  int64_t *offset;
  int64_t *last_offset; /* per event: offset of its last copy */
  char first_order_error[128];
} kafka_read_t;

static int event_index(const ctx_t *ctx, const char *id) {
  for (int i = 0; i < ctx->n; i++)
    if (strcmp(ctx->ids[i], id) == 0) return i;
  return -1;
}

static void on_record(const rd_kafka_message_t *rkm, void *arg) {
  kafka_read_t *r = arg;
  char id[64], type[64], pkey[64], spec[16];
  r->records++;
  if (!obx_test_kafka_header(rkm, "ce_id", id, sizeof id)) {
    r->header_errors++;
    return;
  }
  int i = event_index(r->ctx, id);
  if (i < 0) {
    r->unknown++;
    return;
  }
  char want_key[32];
  snprintf(want_key, sizeof want_key, "ORD-%04d", r->ctx->key_of[i]);
  if (!obx_test_kafka_header(rkm, "ce_type", type, sizeof type) || strcmp(type, "OrderConfirmed") ||
      !obx_test_kafka_header(rkm, "ce_partitionkey", pkey, sizeof pkey) || strcmp(pkey, want_key) ||
      !obx_test_kafka_header(rkm, "ce_specversion", spec, sizeof spec) || strcmp(spec, "1.0") ||
      rkm->key_len != strlen(want_key) || memcmp(rkm->key, want_key, rkm->key_len) != 0)
    r->header_errors++;
  if (r->last_offset) r->last_offset[i] = rkm->offset;
  if (r->seen[i]++ == 0) {
    /* first copy of an event: events of one key must arrive in commit order */
    int k = r->ctx->key_of[i];
    if (i < r->last_of_key[k] && r->order_errors++ == 0)
      snprintf(r->first_order_error, sizeof r->first_order_error, "first: event %d of key %d at %d@%lld after event %d",
               i, k, (int)rkm->partition, (long long)rkm->offset, r->last_of_key[k]);
    r->last_of_key[k] = i;
    r->partition[i] = rkm->partition;
    r->offset[i] = rkm->offset;
  }
}

/* Reads the topic until every event arrived at least once (or timeout); checks headers, keys
 * and per-key order; returns the number of records (duplicates included). */
static int kafka_check(ctx_t *ctx, int timeout_ms, bool exactly_once) {
  kafka_read_t r;
  memset(&r, 0, sizeof r);
  r.ctx = ctx;
  r.seen = calloc((size_t)ctx->n, sizeof *r.seen);
  r.last_of_key = calloc(MAX_EVENTS, sizeof *r.last_of_key);
  r.partition = calloc((size_t)ctx->n, sizeof *r.partition);
  r.offset = calloc((size_t)ctx->n, sizeof *r.offset);
  r.last_offset = calloc((size_t)ctx->n, sizeof *r.last_offset);
  for (int k = 0; k < MAX_EVENTS; k++) r.last_of_key[k] = -1;
  /* one consumer group per check; each round resumes after the records already read */
  static int serial;
  char group[128];
  snprintf(group, sizeof group, "check-%s-%d", ctx->topic, ++serial);
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  int missing = 0; /* skipped events never arrive: a read waiting for them would wait out its deadline */
  for (int i = 0; i < ctx->n; i++) missing += !ctx->skipped[i];
  while (missing > 0 && obx_test_now_ms() < deadline) {
    int got = obx_test_kafka_consume_all(ctx->bootstrap, ctx->topic, group, missing,
                                         (int)(deadline - obx_test_now_ms()), on_record, &r);
    if (got < 0) fail_msg("consumer failed");
    missing = 0;
    for (int i = 0; i < ctx->n; i++) missing += r.seen[i] == 0 && !ctx->skipped[i];
  }
  if (missing) fail_msg("%d of %d events never reached Kafka (%d records read)", missing, ctx->n, r.records);
  /* A skipped event never reaches Kafka. kafka-mockd writes no transaction markers (librdkafka's
   * mock answers EndTxn without them), so a record of an aborted transaction stays readable: a
   * refused head may have had a copy in a transaction another record's refusal aborted before
   * its own refusal. There, such a copy must precede every later event of its key (those are
   * produced only once the head is released). */
  for (int i = 0; i < ctx->n; i++) {
    if (!ctx->skipped[i] || !r.seen[i]) continue;
    if (!ctx->aborted_visible) fail_msg("event %d was skipped but reached Kafka", i);
    for (int j = i + 1; j < ctx->n; j++)
      if (ctx->key_of[j] == ctx->key_of[i] && r.seen[j] && r.partition[j] == r.partition[i] && r.offset[j] < r.last_offset[i])
        fail_msg("event %d was skipped but reached Kafka after event %d of its key", i, j);
  }
  /* every record the topic holds (its log end offsets) was read: no copy still to come */
  int64_t in_topic = exactly_once ? obx_test_kafka_topic_records(ctx->bootstrap, ctx->topic) : 0;
  if (exactly_once && in_topic != ctx->n) fail_msg("records in the topic: got %lld want %d (duplicates)", (long long)in_topic, ctx->n);
  if (r.unknown) fail_msg("%d records with unknown ids", r.unknown);
  if (r.header_errors) fail_msg("%d records with wrong key or CloudEvents headers", r.header_errors);
  if (r.order_errors) fail_msg("%d records out of per-key commit order (%s)", r.order_errors, r.first_order_error);
  if (exactly_once && r.records != ctx->n) fail_msg("records: got %d want %d (duplicates)", r.records, ctx->n);

  /* The outbox records the Kafka coordinates of each published event. */
  for (int i = 0; i < ctx->n && exactly_once; i += 97) {
    bson_t *filter = BCON_NEW("_id", BCON_UTF8(ctx->ids[i]));
    mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(ctx->outbox, filter, NULL, NULL);
    const bson_t *doc;
    bson_iter_t it;
    assert_true(mongoc_cursor_next(cursor, &doc));
    assert_true(bson_iter_init_find(&it, doc, "kafka.partition") || bson_iter_init(&it, doc));
    bson_iter_t kit;
    if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, "kafka.partition", &kit) ||
        bson_iter_as_int64(&kit) != r.partition[i])
      fail_msg("event %d: kafka.partition in the outbox differs from the record's %d", i, r.partition[i]);
    if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, "kafka.offset", &kit) ||
        bson_iter_as_int64(&kit) != r.offset[i])
      fail_msg("event %d: kafka.offset in the outbox differs from the record's %lld", i, (long long)r.offset[i]);
    if (!bson_iter_init_find(&it, doc, "publishedAt") || !BSON_ITER_HOLDS_DATE_TIME(&it))
      fail_msg("event %d: no publishedAt", i);
    mongoc_cursor_destroy(cursor);
    bson_destroy(filter);
  }
  free(r.seen);
  free(r.last_of_key);
  free(r.partition);
  free(r.offset);
  free(r.last_offset);
  return r.records;
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_stream_publishes_in_order_and_checkpoints(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "stream", &g_mongo, NULL);
  insert_events(&ctx, 50, 5); /* before the first start: found by the initial scan */
  obx_relay_t *relay = relay_start(&ctx);
  wait_published(&ctx, 50, 30000);
  insert_events(&ctx, 300, 7); /* through the change stream */
  wait_published(&ctx, 350, 30000);
  assert_int_equal(count_docs(ctx.outbox, "{\"status\": \"PENDING\"}"), 0);

  /* checkpoint written, fenced by the leader's epoch */
  ctx_t ckpt = ctx;
  ckpt.outbox = mongoc_client_get_collection(ctx.client, ctx.db, "relay_checkpoints");
  count_wait_t written = {&ckpt, "{\"_id\": \"outbox\", \"resumeToken\": {\"$exists\": true}, \"epoch\": {\"$gte\": 1}}", 1};
  if (!obx_test_wait_for(count_reached, &written, 10000, 50)) fail_msg("no checkpoint written within 10 s");
  mongoc_collection_destroy(ckpt.outbox);

  /* outbox indexes, including the partial TTL on PUBLISHED documents */
  mongoc_cursor_t *cursor = mongoc_collection_find_indexes_with_opts(ctx.outbox, NULL);
  const bson_t *index;
  bool ttl = false, status = false;
  while (mongoc_cursor_next(cursor, &index)) {
    bson_iter_t it;
    if (bson_iter_init_find(&it, index, "expireAfterSeconds") && bson_iter_as_int64(&it) == 7 * 86400 &&
        bson_iter_init(&it, index) && bson_iter_find_descendant(&it, "partialFilterExpression.status", &it))
      ttl = true;
    if (bson_iter_init_find(&it, index, "name") && strcmp(bson_iter_utf8(&it, NULL), "outbox_status_available") == 0)
      status = true;
  }
  mongoc_cursor_destroy(cursor);
  assert_true(ttl);
  assert_true(status);

  /* metrics: the process registry that GET /metrics renders */
  char *text = obx_metrics_render(NULL), want[160];
  snprintf(want, sizeof want, "outboxd_relay_published_total{topic=\"%s\"} 350", ctx.topic);
  if (!strstr(text, want)) fail_msg("/metrics lacks \"%s\"", want);
  static const char *const names[] = {"outboxd_relay_commit_to_ack_seconds_bucket", "outboxd_relay_lag_seconds",
                                      "outboxd_relay_inflight", "outboxd_relay_leader 1", "outboxd_relay_stream_restarts_total", "outboxd_relay_stream_up 1",
                                      "outboxd_relay_publish_errors_total"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strstr(text, names[i])) fail_msg("/metrics lacks %s", names[i]);
  free(text);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, true);

  /* restart: resumes from the checkpoint, publishes only what is new */
  insert_events(&ctx, 40, 3);
  relay = relay_start(&ctx);
  wait_published(&ctx, 390, 30000);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, true);
  ctx_cleanup(&ctx);
}

typedef struct {
  obx_relay_t *relay;
} stream_wait_t;

static bool stream_is_up(void *arg) {
  return ((stream_wait_t *)arg)->relay->counters.stream_up == 1;
}

static void test_failed_publish_backs_off_then_fails_then_reprocess(void **state) {
  const char *settings[] = {"kafka.message.timeout.ms", "400", "outbox.max_attempts", "2", "relay.fencing", "transactions", NULL};
  ctx_t ctx;
  ctx_init_mock(&ctx, "failing", &g_mongo, settings);
  obx_relay_t *relay = relay_start(&ctx);
  /* Kafka goes down once the leader's transactional producer is fenced in (its stream open):
   * a leader cannot start without the transaction coordinator */
  stream_wait_t up = {relay};
  if (!obx_test_wait_for(stream_is_up, &up, 20000, 20)) fail_msg("the leader's change stream did not open");
  assert_true(obx_test_kafka_cmd(&g_kafka, "broker down all"));
  insert_events(&ctx, 3, 3);

  /* first failure: attempts 1, lastError, availableAt in the future, still PENDING */
  count_wait_t once = {&ctx, "{\"status\": \"PENDING\", \"attempts\": 1, \"lastError\": {\"$type\": \"string\"}}", 3};
  if (!obx_test_wait_for(count_reached, &once, 30000, 50))
    fail_msg("after one failed publish: got %lld events with attempts 1", (long long)count_docs(ctx.outbox, once.filter));
  /* availableAt lies after the failed attempt by the backoff: the attempt ended at least
   * kafka.message.timeout.ms (400) after occurredAt, and attempt 1 backs off 1 s */
  bson_t all = BSON_INITIALIZER;
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(ctx.outbox, &all, NULL, NULL);
  const bson_t *doc;
  int checked = 0;
  while (mongoc_cursor_next(cursor, &doc)) {
    bson_iter_t it;
    int64_t occurred = 0, available = 0;
    if (bson_iter_init_find(&it, doc, "occurredAt") && BSON_ITER_HOLDS_DATE_TIME(&it)) occurred = bson_iter_date_time(&it);
    if (bson_iter_init_find(&it, doc, "availableAt") && BSON_ITER_HOLDS_DATE_TIME(&it)) available = bson_iter_date_time(&it);
    if (available - occurred < 400 + 1000)
      fail_msg("availableAt after a failed publish: got occurredAt + %lld ms want >= occurredAt + 1400 ms",
               (long long)(available - occurred));
    checked++;
  }
  mongoc_cursor_destroy(cursor);
  assert_int_equal(checked, 3);
  /* the sweeper retries after the backoff; at OUTBOX_MAX_ATTEMPTS the event is FAILED */
  count_wait_t failed = {&ctx, "{\"status\": \"FAILED\", \"attempts\": 2}", 3};
  if (!obx_test_wait_for(count_reached, &failed, 30000, 100))
    fail_msg("FAILED after 2 attempts: got %lld want 3", (long long)count_docs(ctx.outbox, failed.filter));

  /* Kafka back; an operator reprocesses (FAILED -> PENDING): the stream picks the update up */
  assert_true(obx_test_kafka_cmd(&g_kafka, "broker up all"));
  bson_t *filter = BCON_NEW("status", "FAILED");
  bson_t *update = BCON_NEW("$set", "{", "status", "PENDING", "attempts", BCON_INT32(0), "availableAt",
                            BCON_DATE_TIME(obx_time_now_ms()), "}");
  bson_error_t berr;
  assert_true(mongoc_collection_update_many(ctx.outbox, filter, update, NULL, NULL, &berr));
  wait_published(&ctx, 3, 30000);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 30000, false);
  bson_destroy(update);
  bson_destroy(filter);
  ctx_cleanup(&ctx);
}

static void test_poll_mode_claims_with_two_relays(void **state) {
  const char *settings[] = {"relay.mode", "poll", "outbox.poll_interval", "100", "outbox.batch_size", "50", NULL};
  ctx_t ctx;
  ctx_init(&ctx, "poll", &g_mongo, settings);
  insert_events(&ctx, 1000, 20);
  obx_relay_t *a = relay_start(&ctx), *b = relay_start(&ctx);
  wait_published(&ctx, 1000, 60000);
  assert_int_equal(count_docs(ctx.outbox, "{\"claimedBy\": {\"$exists\": true}}"), 0);
  /* one of them leads; the other takes over when it stops */
  assert_int_equal(a->counters.leader + b->counters.leader, 1);
  obx_relay_t *standby = a->counters.leader ? b : a;
  obx_relay_stop((a->counters.leader ? a : b)->group);
  insert_events(&ctx, 200, 20);
  wait_published(&ctx, 1200, 60000);
  assert_int_equal(standby->counters.leader, 1);
  obx_relay_stop(standby->group);
  /* claims and a single publisher: nothing twice, per-key order kept */
  kafka_check(&ctx, 60000, true);
  ctx_cleanup(&ctx);
}

typedef struct {
  obx_relay_t *relay;
} leader_wait_t;

static bool is_leader(void *arg) {
  return ((leader_wait_t *)arg)->relay->counters.leader == 1;
}

/* Leads with its stream open and its first full sweep done (relay_lead_begin ended). */
static bool has_led(void *arg) {
  return ((obx_relay_t *)arg)->led;
}

static void test_lease_one_leader_and_takeover(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "lease", &g_mongo, NULL);
  obx_relay_t *a = relay_start(&ctx);
  /* events are written once a's stream is open: one written while a first opens it "from now"
   * may be published by both the stream and the initial sweep (sweeper.c), and this test
   * counts every copy */
  assert_true(obx_test_wait_for(has_led, a, 20000, 20));
  obx_relay_t *b = relay_start(&ctx);
  leader_wait_t wb = {b};
  insert_events(&ctx, 200, 10);
  wait_published(&ctx, 200, 30000);
  assert_false(is_leader(&wb)); /* exactly one publishes */

  obx_relay_stop(a->group); /* releases the lease */
  int64_t t0 = obx_test_now_ms();
  assert_true(obx_test_wait_for(is_leader, &wb, 20000, 20));
  int64_t takeover = obx_test_now_ms() - t0;
  if (takeover > 2000 + 500) fail_msg("takeover took %lld ms, lease is 2000 ms", (long long)takeover);
  insert_events(&ctx, 200, 10);
  wait_published(&ctx, 400, 30000);
  obx_relay_stop(b->group);
  /* b resumed from a's checkpoint: nothing twice */
  kafka_check(&ctx, 60000, true);
  ctx_cleanup(&ctx);
}

static void set_doc(ctx_t *ctx, const char *coll_name, const char *id, const bson_t *set) {
  mongoc_collection_t *coll = mongoc_client_get_collection(ctx->client, ctx->db, coll_name);
  bson_t *selector = BCON_NEW("_id", BCON_UTF8(id));
  bson_t update = BSON_INITIALIZER;
  BSON_APPEND_DOCUMENT(&update, "$set", set);
  bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
  bson_error_t berr;
  if (!mongoc_collection_update_one(coll, selector, &update, opts, NULL, &berr)) fail_msg("%s: %s", coll_name, berr.message);
  bson_destroy(opts);
  bson_destroy(&update);
  bson_destroy(selector);
  mongoc_collection_destroy(coll);
}

static bool not_leader(void *arg) {
  return !is_leader(arg);
}

static void test_deposed_leader_is_fenced(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "fence", &g_mongo, NULL);
  obx_relay_t *relay = relay_start(&ctx);
  leader_wait_t w = {relay};
  assert_true(obx_test_wait_for(is_leader, &w, 20000, 50));
  insert_events(&ctx, 20, 4);
  wait_published(&ctx, 20, 30000);

  /* another relay takes the lease with a higher epoch and writes the checkpoint */
  int64_t epoch = relay->epoch + 1;
  bson_t *lease = BCON_NEW("owner", "intruder", "epoch", BCON_INT64(epoch), "expiresAt",
                           BCON_DATE_TIME(obx_time_now_ms() + 60000));
  set_doc(&ctx, "leases", "relay", lease);
  bson_t *ckpt = BCON_NEW("owner", "intruder", "epoch", BCON_INT64(epoch));
  set_doc(&ctx, "relay_checkpoints", "outbox", ckpt);
  if (!obx_test_wait_for(not_leader, &w, 10000, 20)) fail_msg("the deposed relay kept leading");

  /* fenced: it publishes nothing and does not touch the checkpoint */
  insert_events(&ctx, 10, 2);
  count_wait_t any = {&ctx, "{\"status\": \"PUBLISHED\"}", 21};
  if (obx_test_wait_for(count_reached, &any, 2500, 100)) fail_msg("a relay without the lease published");
  ctx_t ckpt_ctx = ctx;
  ckpt_ctx.outbox = mongoc_client_get_collection(ctx.client, ctx.db, "relay_checkpoints");
  assert_int_equal(count_docs(ckpt_ctx.outbox, "{\"_id\": \"outbox\", \"owner\": \"intruder\"}"), 1);

  /* the intruder's lease expires: the relay leads again (epoch + 1) and catches up */
  bson_t *expire = BCON_NEW("expiresAt", BCON_DATE_TIME(0));
  set_doc(&ctx, "leases", "relay", expire);
  wait_published(&ctx, 30, 30000);
  assert_true(relay->epoch > epoch);
  count_wait_t back = {&ckpt_ctx, "{\"_id\": \"outbox\", \"owner\": {\"$ne\": \"intruder\"}}", 1};
  assert_true(obx_test_wait_for(count_reached, &back, 10000, 50));
  mongoc_collection_destroy(ckpt_ctx.outbox);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 30000, false);
  bson_destroy(expire);
  bson_destroy(ckpt);
  bson_destroy(lease);
  ctx_cleanup(&ctx);
}

/* Resident set of this process (the relay runs in it), kB. */
static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

static bool lag_zero(void *arg) {
  return ((obx_relay_t *)arg)->counters.lag_ms == 0;
}

static void test_kafka_down_20s_backpressure(void **state) {
  const char *settings[] = {"relay.max_inflight", "50", NULL};
  ctx_t ctx;
  ctx_init_mock(&ctx, "down", &g_mongo, settings);
  /* the mock keeps about 5 MB per partition: 16 partitions hold the 20 MB below */
  char topic_cmd[128];
  snprintf(topic_cmd, sizeof topic_cmd, "topic %s 16", ctx.topic);
  assert_true(obx_test_kafka_cmd(&g_kafka, topic_cmd));
  obx_relay_t *relay = relay_start(&ctx);
  leader_wait_t w = {relay};
  assert_true(obx_test_wait_for(is_leader, &w, 20000, 50));
  insert_events(&ctx, 20, 4);
  wait_published(&ctx, 20, 30000);

  assert_true(obx_test_kafka_cmd(&g_kafka, "broker down all"));
  /* 5000 events of 4 KB (20 MB) while Kafka is down: a reader that did not stop at the in-flight
   * bound would hold them (change events, produced records) and grow past the 16 MB allowance */
  long rss_base = rss_kb();
  uint64_t read_base = relay->window.end; /* changes read so far (one slot each; racy: a gauge) */
  ctx.pad = 4096;
  insert_events(&ctx, 5000, 100);
  int64_t start = obx_test_now_ms(), until = start + 20000;
  int max_inflight = 0;
  uint64_t max_window = 0;
  int64_t lag_early = -1;
  while (obx_test_now_ms() < until) {
    if (lag_early < 0 && obx_test_now_ms() - start >= 3000) lag_early = relay->counters.lag_ms;
    int inflight = relay->counters.inflight;
    uint64_t window = relay->window.end - relay->window.first; /* read racily: a gauge */
    if (inflight > max_inflight) max_inflight = inflight;
    if (window > max_window) max_window = window;
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
  long rss_late = rss_kb();
  print_message("Kafka down 20 s: RSS %ld -> %ld kB, %llu changes read, in flight <= %d, lag %lld -> %lld ms\n",
                rss_base, rss_late, (unsigned long long)(relay->window.end - read_base), max_inflight,
                (long long)lag_early, (long long)relay->counters.lag_ms);
  if (rss_late - rss_base > 16 * 1024)
    fail_msg("memory grew while Kafka was down: %ld kB -> %ld kB (20 MB of events queued)", rss_base, rss_late);
  uint64_t read = relay->window.end - read_base;
  if (read > 50 + 4) fail_msg("changes read while Kafka was down: got %llu want <= 54 (in-flight bound)", (unsigned long long)read);
  int64_t published = count_docs(ctx.outbox, "{\"status\": \"PUBLISHED\"}");
  /* the checkpoint is stuck behind the unacknowledged events: lag (now - the checkpoint's
   * cluster time) grows with the outage */
  int64_t lag_late = relay->counters.lag_ms;
  if (lag_late < 10000) fail_msg("lag after 20 s down: got %lld ms want >= 10000", (long long)lag_late);
  if (lag_late - lag_early < 12000)
    fail_msg("lag did not grow while Kafka was down: %lld ms at 3 s, %lld ms at 20 s", (long long)lag_early, (long long)lag_late);
  if (max_inflight > 50) fail_msg("in flight while Kafka was down: got %d want <= 50", max_inflight);
  if (max_window > 50 * 4 + 8) fail_msg("window while Kafka was down: got %llu slots", (unsigned long long)max_window);
  if (published != 20) fail_msg("published while Kafka was down: got %lld want 20", (long long)published);

  assert_true(obx_test_kafka_cmd(&g_kafka, "broker up all"));
  wait_published(&ctx, 5020, 90000);
  /* caught up and idle: lag returns to 0 (postBatchResumeToken checkpoints) */
  assert_true(obx_test_wait_for(lag_zero, relay, 20000, 50));
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, false);
  ctx_cleanup(&ctx);
}

static int64_t fail_point(const char *json) { return obx_test_fail_point(g_client, json); }

static void test_getmore_faults(void **state) {
  static const char *const faults[] = {
    "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 2},"
    " \"data\": {\"appName\": \"outboxd\", \"failCommands\": [\"getMore\"], \"closeConnection\": true}}",
    "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 2},"
    " \"data\": {\"appName\": \"outboxd\", \"failCommands\": [\"getMore\"], \"errorCode\": 10107}}",
    "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1},"
    " \"data\": {\"appName\": \"outboxd\", \"failCommands\": [\"getMore\"], \"errorCode\": 2}}",
  };
  ctx_t ctx;
  ctx_init(&ctx, "getmore", &g_mongo, NULL);
  obx_relay_t *relay = relay_start(&ctx);
  leader_wait_t w = {relay};
  assert_true(obx_test_wait_for(is_leader, &w, 20000, 50));
  int total = 0;
  for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
    insert_events(&ctx, 20, 4);
    total += 20;
    wait_published(&ctx, total, 30000);
    fail_point(faults[f]);
    insert_events(&ctx, 100, 4);
    total += 100;
    wait_published(&ctx, total, 30000);
    int64_t fired = fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
    if (fired < 1) fail_msg("fault %zu: the relay's getMore never hit it (fired %lld times)", f, (long long)fired);
  }
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, false);
  ctx_cleanup(&ctx);
}

static void test_history_lost_recovers_everything(void **state) {
  obx_test_mongo_t small;
  memset(&small, 0, sizeof small);
  if (!obx_test_mongo_start(&small, "--oplog-size 64")) fail_msg("devmongod with a small oplog did not start");
  ctx_t ctx;
  ctx_init(&ctx, "lost", &small, NULL);
  obx_relay_t *relay = relay_start(&ctx);
  insert_events(&ctx, 10, 2);
  wait_published(&ctx, 10, 30000);
  obx_relay_stop(relay->group);
  insert_events(&ctx, 300, 5); /* the checkpoint falls out of the 64-entry oplog */
  relay = relay_start(&ctx);
  wait_published(&ctx, 310, 60000);
  if (relay->counters.recoveries[RELAY_STREAM_HISTORY_LOST] < 1)
    fail_msg("history lost: got %d want >= 1", (int)relay->counters.recoveries[RELAY_STREAM_HISTORY_LOST]);
  insert_events(&ctx, 20, 5); /* the fresh stream follows new events */
  wait_published(&ctx, 330, 30000);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, false);
  ctx_cleanup(&ctx);
  obx_test_mongo_stop(&small);
}

typedef struct {
  obx_relay_t *relay;
  relay_stream_cause_t cause;
  uint64_t before;
} restart_wait_t;

static bool restarted_and_up(void *arg) {
  restart_wait_t *w = arg;
  return w->relay->counters.recoveries[w->cause] > w->before && w->relay->counters.stream_up == 1;
}

/* Every change stream error the relay cannot resume from is named, counted, and recovered by a
 * restart from now plus a full sweep: 280 and 286 raised on the getMore, 260 from a checkpoint
 * whose token the server refuses, and an invalidate from dropping the outbox. The events
 * written around each fault all reach Kafka in per-key order. */
static void test_stream_errors_restart_from_now(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "restart", &g_mongo, NULL);
  obx_relay_t *relay = relay_start(&ctx);
  leader_wait_t lw = {relay};
  assert_true(obx_test_wait_for(is_leader, &lw, 20000, 50));
  static const struct {
    int code;
    relay_stream_cause_t cause;
  } getmore[] = {{280, RELAY_STREAM_FATAL}, {286, RELAY_STREAM_HISTORY_LOST}};
  int total = 0;
  for (size_t f = 0; f < sizeof getmore / sizeof getmore[0]; f++) {
    insert_events(&ctx, 20, 4);
    total += 20;
    wait_published(&ctx, total, 30000);
    restart_wait_t rw = {relay, getmore[f].cause, relay->counters.recoveries[getmore[f].cause]};
    char fp[300];
    snprintf(fp, sizeof fp, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1},"
             " \"data\": {\"appName\": \"outboxd\", \"failCommands\": [\"getMore\"], \"errorCode\": %d}}", getmore[f].code);
    fail_point(fp);
    insert_events(&ctx, 100, 4);
    total += 100;
    if (!obx_test_wait_for(restarted_and_up, &rw, 30000, 20))
      fail_msg("error %d: restarts %s got %llu want > %llu, stream_up %d", getmore[f].code,
               relay_stream_cause_names[getmore[f].cause], (unsigned long long)relay->counters.recoveries[getmore[f].cause],
               (unsigned long long)rw.before, (int)relay->counters.stream_up);
    wait_published(&ctx, total, 30000);
    fail_point("{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  }
  char *text = obx_metrics_render(NULL);
  if (!strstr(text, "outboxd_relay_stream_restarts_total{cause=\"fatal_error\"}") ||
      !strstr(text, "outboxd_relay_stream_restarts_total{cause=\"history_lost\"}"))
    fail_msg("/metrics lacks the restarts by cause");
  free(text);

  /* 260: the checkpoint's token is refused at the next start */
  obx_relay_stop(relay->group);
  mongoc_collection_t *ckpts = mongoc_client_get_collection(ctx.client, ctx.db, "relay_checkpoints");
  bson_t *sel = BCON_NEW("_id", "outbox");
  bson_t *bogus = BCON_NEW("$set", "{", "resumeToken", "{", "_data", "not-a-token", "}", "}");
  bson_error_t berr;
  if (!mongoc_collection_update_one(ckpts, sel, bogus, NULL, NULL, &berr)) fail_msg("checkpoint: %s", berr.message);
  bson_destroy(bogus);
  bson_destroy(sel);
  mongoc_collection_destroy(ckpts);
  insert_events(&ctx, 50, 4);
  total += 50;
  relay = relay_start(&ctx);
  restart_wait_t rw = {relay, RELAY_STREAM_INVALID_TOKEN, 0};
  if (!obx_test_wait_for(restarted_and_up, &rw, 30000, 20)) fail_msg("260: no invalid_resume_token restart");
  wait_published(&ctx, total, 30000);
  insert_events(&ctx, 30, 4); /* the fresh stream follows new events */
  total += 30;
  wait_published(&ctx, total, 30000);
  kafka_check(&ctx, 60000, false);

  /* invalidate: the outbox is dropped; the relay creates it again and follows it */
  rw = (restart_wait_t){relay, RELAY_STREAM_INVALIDATED, relay->counters.recoveries[RELAY_STREAM_INVALIDATED]};
  if (!mongoc_collection_drop(ctx.outbox, &berr)) fail_msg("drop: %s", berr.message);
  if (!obx_test_wait_for(restarted_and_up, &rw, 30000, 20)) fail_msg("invalidate: no restart");
  insert_events(&ctx, 40, 4); /* the outbox holds only these now; Kafka has them all */
  wait_published(&ctx, 40, 30000);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, false);
  ctx_cleanup(&ctx);
}

/* Every outbox document gets an answer: _ids of other BSON types (ObjectId, int, document:
 * what a third-party writer may insert) are FAILED with the reason, once, not re-claimed
 * forever; an outbox update refused for one document (a DBA's unique index on kafka.offset,
 * which offsets of different partitions break) makes that one FAILED with the reason while the
 * rest of its bulk is written and publishing goes on. */
static void test_every_document_gets_an_answer(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "answer", &g_mongo, NULL); /* 3 partitions: offsets repeat across them */
  obx_relay_t *relay = relay_start(&ctx);
  leader_wait_t lw = {relay};
  assert_true(obx_test_wait_for(is_leader, &lw, 20000, 50));

  /* three documents with non-string _ids, through the stream */
  for (int i = 0; i < 3; i++) {
    obx_event_t ev;
    obx_event_init(&ev);
    ev.event_type = strdup("OrderConfirmed");
    ev.org_id = strdup("org-1");
    ev.aggregate_type = strdup("Order");
    char agg[16];
    snprintf(agg, sizeof agg, "ORD-X%d", i); /* a malformed event holds its key too: one key each */
    ev.aggregate_id = strdup(agg);
    obx_err_t err = OBX_ERR_INIT;
    bson_t doc = BSON_INITIALIZER, other = BSON_INITIALIZER;
    if (!obx_event_finalize(&ev, &err) || !obx_event_to_outbox(&ev, &doc, &err)) fail_msg("event: %s", err.msg);
    bson_oid_t oid;
    bson_oid_init(&oid, NULL);
    if (i == 0) BSON_APPEND_OID(&other, "_id", &oid);
    else if (i == 1) BSON_APPEND_INT64(&other, "_id", 4242);
    else {
      bson_t sub;
      BSON_APPEND_DOCUMENT_BEGIN(&other, "_id", &sub);
      BSON_APPEND_UTF8(&sub, "writer", "legacy");
      bson_append_document_end(&other, &sub);
    }
    bson_copy_to_excluding_noinit(&doc, &other, "_id", NULL);
    bson_error_t berr;
    if (!mongoc_collection_insert_one(ctx.outbox, &other, NULL, NULL, &berr)) fail_msg("insert: %s", berr.message);
    bson_destroy(&other);
    bson_destroy(&doc);
    obx_event_cleanup(&ev);
  }
  count_wait_t odd = {&ctx, "{\"status\": \"FAILED\", \"attempts\": 1, \"lastError\": {\"$regex\": \"_id\"}}", 3};
  if (!obx_test_wait_for(count_reached, &odd, 20000, 50))
    fail_msg("non-string _ids: got %lld FAILED with the reason want 3", (long long)count_docs(ctx.outbox, odd.filter));

  /* a unique index the relay's updates break: only the refused documents fail */
  bson_t *create = BCON_NEW("createIndexes", "outbox", "indexes", "[", "{", "key", "{", "kafka.offset", BCON_INT32(1), "}",
                         "name", "dba_offset", "unique", BCON_BOOL(true), "partialFilterExpression", "{", "kafka.offset",
                         "{", "$exists", BCON_BOOL(true), "}", "}", "}", "]");
  mongoc_database_t *db = mongoc_client_get_database(ctx.client, ctx.db);
  bson_error_t berr;
  if (!mongoc_database_write_command_with_opts(db, create, NULL, NULL, &berr)) fail_msg("index: %s", berr.message);
  mongoc_database_destroy(db);
  bson_destroy(create);
  insert_events(&ctx, 30, 10);
  count_wait_t answered = {&ctx, "{\"status\": {\"$in\": [\"PUBLISHED\", \"FAILED\"]}}", 33};
  if (!obx_test_wait_for(count_reached, &answered, 30000, 50))
    fail_msg("answered: got %lld want 33", (long long)count_docs(ctx.outbox, answered.filter));
  int64_t refused = count_docs(ctx.outbox, "{\"status\": \"FAILED\", \"lastError\": {\"$regex\": \"outbox update was refused\"}}");
  int64_t published = count_docs(ctx.outbox, "{\"status\": \"PUBLISHED\"}");
  if (refused < 1 || published < 1 || refused + published != 30)
    fail_msg("after refused updates: got %lld refused + %lld published want 30 with both > 0", (long long)refused,
             (long long)published);
  obx_relay_stop(relay->group);
  ctx_cleanup(&ctx);
}

/* ---- per-key order under produce errors (issue 19) ------------------------------------------ */

typedef struct {
  ctx_t *ctx;
  obx_relay_t *relay;
} settled_t;

/* Nothing in flight, at least one FAILED head, and every PENDING event belongs to a key with a
 * FAILED event (held behind it). */
static bool settled_behind_failed(void *arg) {
  settled_t *s = arg;
  if (s->relay->counters.inflight != 0 || s->relay->counters.held_keys < 1) return false;
  bson_t *filter = BCON_NEW("status", "FAILED");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(s->ctx->outbox, filter, NULL, NULL);
  const bson_t *doc;
  bson_t *pending = BCON_NEW("status", "PENDING");
  bson_t nin, arr;
  BSON_APPEND_DOCUMENT_BEGIN(pending, "partitionKey", &nin);
  BSON_APPEND_ARRAY_BEGIN(&nin, "$nin", &arr);
  int n = 0;
  char idx[16];
  while (mongoc_cursor_next(cursor, &doc)) {
    bson_iter_t it;
    snprintf(idx, sizeof idx, "%d", n++);
    if (bson_iter_init_find(&it, doc, "partitionKey")) BSON_APPEND_UTF8(&arr, idx, bson_iter_utf8(&it, NULL));
  }
  bson_append_array_end(&nin, &arr);
  bson_append_document_end(pending, &nin);
  bson_error_t berr;
  int64_t loose = n ? mongoc_collection_count_documents(s->ctx->outbox, pending, NULL, NULL, NULL, &berr) : -1;
  mongoc_cursor_destroy(cursor);
  bson_destroy(pending);
  bson_destroy(filter);
  return n > 0 && loose == 0;
}

typedef struct {
  count_wait_t done;
  settled_t *settled;
} done_or_settled_t;

static bool done_or_settled(void *arg) {
  done_or_settled_t *d = arg;
  return count_reached(&d->done) || settled_behind_failed(d->settled);
}

/* The FAILED events: their index in ctx (in *idx, up to max); checks that each names `reason`
 * and that no later event of its key is PUBLISHED. Returns how many. */
static int failed_heads(ctx_t *ctx, const char *reason, int *idx, int max) {
  bson_t *filter = BCON_NEW("status", "FAILED");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(ctx->outbox, filter, NULL, NULL);
  const bson_t *doc;
  int n = 0;
  while (mongoc_cursor_next(cursor, &doc) && n < max) {
    bson_iter_t it;
    const char *id = bson_iter_init_find(&it, doc, "_id") ? bson_iter_utf8(&it, NULL) : "";
    const char *why = bson_iter_init_find(&it, doc, "lastError") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    if (!strstr(why, reason)) fail_msg("FAILED %s: lastError \"%s\" does not name %s", id, why, reason);
    idx[n++] = event_index(ctx, id);
  }
  mongoc_cursor_destroy(cursor);
  bson_destroy(filter);
  for (int f = 0; f < n; f++)
    for (int j = idx[f] + 1; j < ctx->n; j++) {
      if (ctx->key_of[j] != ctx->key_of[idx[f]]) continue;
      char q[160];
      snprintf(q, sizeof q, "{\"_id\": \"%s\", \"status\": \"PUBLISHED\"}", ctx->ids[j]);
      if (count_docs(ctx->outbox, q) != 0) fail_msg("event %d published while %d of its key is FAILED", j, idx[f]);
    }
  return n;
}

/* An event Kafka refuses for good (MSG_SIZE_TOO_LARGE, INVALID_RECORD,
 * TOPIC_AUTHORIZATION_FAILED pushed by kafka-mockd, and a payload over the size limit) is
 * FAILED at once with the broker's reason; the later events of its key wait (PENDING, not
 * published) until an operator reprocesses or skips it, then follow in order; other keys go on.
 * The consumer sees zero per-key inversions; skipped events never arrive. */
static void test_produce_errors_hold_the_key(void **state) {
  /* a topic error (authorization) is cached until the next metadata refresh */
  /* transactional: a refused record aborts its transaction, the others are produced again */
  const char *settings[] = {"kafka.message.max.bytes", "100000", "kafka.topic.metadata.refresh.interval.ms", "1000",
                            "relay.fencing", "transactions", NULL};
  ctx_t ctx;
  ctx_init_mock(&ctx, "hold", &g_mongo, settings);
  ctx.aborted_visible = true;
  assert_true(obx_test_kafka_cmd(&g_kafka, "topic %s 3", ctx.topic));
  obx_relay_t *relay = relay_start(&ctx);
  leader_wait_t lw = {relay};
  assert_true(obx_test_wait_for(is_leader, &lw, 20000, 50));
  obx_err_t err = OBX_ERR_INIT;
  obx_mongo_t *mongo = obx_mongo_new(&ctx.conf, &err);
  obx_ops_t ops = {.mongo = mongo, .who = "test"};
  insert_events(&ctx, 20, 4);
  wait_published(&ctx, 20, 30000);

  static const char *const errors[] = {"MSG_SIZE_TOO_LARGE", "INVALID_RECORD", "TOPIC_AUTHORIZATION_FAILED", NULL};
  int published = 20;
  for (int e = 0; e < 4; e++) {
    int first = ctx.n;
    if (errors[e]) {
      assert_true(obx_test_kafka_cmd(&g_kafka, "push-errors Produce 1 %s", errors[e]));
      insert_events(&ctx, 40, 4);
    } else {
      ctx.pad = 150000; /* over kafka.message.max.bytes */
      insert_events(&ctx, 1, 1);
      ctx.pad = 0;
      insert_events(&ctx, 9, 1); /* the same key, ORD-0000 */
    }
    settled_t s = {&ctx, relay};
    if (!obx_test_wait_for(settled_behind_failed, &s, 30000, 50))
      fail_msg("%s: never settled with held keys (held %d, in flight %d)", errors[e] ? errors[e] : "big payload",
               (int)relay->counters.held_keys, (int)relay->counters.inflight);
    int heads[64];
    int n = failed_heads(&ctx, errors[e] ? errors[e] : "MSG_SIZE_TOO_LARGE", heads, 64);
    char *text = obx_metrics_render(NULL);
    if (!strstr(text, "outboxd_relay_held_keys ") || strstr(text, "outboxd_relay_held_keys 0\n"))
      fail_msg("/metrics: outboxd_relay_held_keys is not > 0");
    free(text);
    /* skip the first head (and the big payload), reprocess the others */
    for (int f = 0; f < n; f++) {
      bool skip = f == 0;
      bson_t out = BSON_INITIALIZER;
      bool ok = skip ? obx_ops_outbox_skip(&ops, NULL, ctx.ids[heads[f]], false, &out, &err)
                     : obx_ops_outbox_reprocess(&ops, NULL, ctx.ids[heads[f]], false, &out, &err);
      if (!ok) fail_msg("%s %d: %s", skip ? "skip" : "reprocess", heads[f], err.msg);
      bson_destroy(&out);
      ctx.skipped[heads[f]] = skip;
    }
    published += ctx.n - first - 1;
    /* a head refused again (the topic error still cached) is FAILED again: reprocess it again */
    int64_t deadline = obx_test_now_ms() + 60000;
    done_or_settled_t ds = {{&ctx, "{\"status\": \"PUBLISHED\"}", published}, &s};
    while (obx_test_now_ms() < deadline && obx_test_wait_for(done_or_settled, &ds, 30000, 50) && !count_reached(&ds.done)) {
      int again[64];
      int m = failed_heads(&ctx, "", again, 64);
      for (int f = 0; f < m; f++) {
        bson_t out = BSON_INITIALIZER;
        if (!obx_ops_outbox_reprocess(&ops, NULL, ctx.ids[again[f]], false, &out, &err)) fail_msg("reprocess: %s", err.msg);
        bson_destroy(&out);
      }
    }
    wait_published(&ctx, published, 1000);
    count_wait_t audited = {&ctx, "{\"action\": \"outbox.skip\"}", e + 1};
    ctx_t audit = ctx;
    audit.outbox = mongoc_client_get_collection(ctx.client, ctx.db, "audit_log");
    audited.ctx = &audit;
    if (!obx_test_wait_for(count_reached, &audited, 5000, 50)) fail_msg("no audit_log entry per skip");
    mongoc_collection_destroy(audit.outbox);
  }
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, false);
  obx_mongo_destroy(mongo);
  ctx_cleanup(&ctx);
}

static bool has_leader(void *arg) {
  ctx_t *ctx = arg;
  mongoc_collection_t *leases = mongoc_client_get_collection(ctx->client, ctx->db, "leases");
  bson_t *filter = BCON_NEW("_id", "relay", "expiresAt", "{", "$gt", BCON_DATE_TIME(obx_time_now_ms()), "}");
  char *json = bson_as_relaxed_extended_json(filter, NULL);
  int64_t n = count_docs(leases, json);
  bson_free(json);
  bson_destroy(filter);
  mongoc_collection_destroy(leases);
  return n == 1;
}

static void outboxd_spawn(ctx_t *ctx, obx_test_proc_t *proc) {
  char uri[300], db[100], brokers[600], topic[100];
  snprintf(uri, sizeof uri, "MONGO_URI=%s", g_mongo.uri);
  snprintf(db, sizeof db, "MONGO_DB=%s", ctx->db);
  snprintf(brokers, sizeof brokers, "KAFKA_BROKERS=%s", ctx->bootstrap);
  snprintf(topic, sizeof topic, "KAFKA_TOPIC=%s", ctx->topic);
  char *const env[] = {uri, db, brokers, topic, "HTTP_PORT=0", "HTTP_BIND=127.0.0.1", "RELAY_LEASE=2s",
                       "OUTBOX_POLL_INTERVAL_MS=500", "LOG_LEVEL=info", "RELAY_FENCING=transactions", NULL};
  char *const argv[] = {(char *)obx_test_build_path("outboxd"), "--roles", "relay", NULL};
  if (!obx_test_spawn(proc, argv, env)) fail_msg("outboxd did not start");
}

/* The owner of the live lease, "" when none. */
static void lease_owner(ctx_t *ctx, char *out, size_t outlen) {
  mongoc_collection_t *leases = mongoc_client_get_collection(ctx->client, ctx->db, "leases");
  bson_t *filter = BCON_NEW("_id", "relay", "expiresAt", "{", "$gt", BCON_DATE_TIME(obx_time_now_ms()), "}");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(leases, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it;
  out[0] = 0;
  if (mongoc_cursor_next(cursor, &doc) && bson_iter_init_find(&it, doc, "owner") && BSON_ITER_HOLDS_UTF8(&it))
    snprintf(out, outlen, "%s", bson_iter_utf8(&it, NULL));
  mongoc_cursor_destroy(cursor);
  bson_destroy(filter);
  mongoc_collection_destroy(leases);
}

typedef struct {
  ctx_t *ctx;
  const char *old_owner;
} takeover_t;

static bool taken_over(void *arg) {
  takeover_t *t = arg;
  char owner[128];
  lease_owner(t->ctx, owner, sizeof owner);
  return owner[0] && strcmp(owner, t->old_owner) != 0;
}

/* outboxd processes of the kill test; group_teardown stops what a failed test left running */
static obx_test_proc_t g_outboxd[2];

static void test_kill_9_mid_run_loses_nothing(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "kill", &g_mongo, NULL);
  outboxd_spawn(&ctx, &g_outboxd[0]);
  if (!obx_test_wait_for(has_leader, &ctx, 30000, 50)) fail_msg("outboxd never took the lease (log: %s)", g_outboxd[0].log_path);
  outboxd_spawn(&ctx, &g_outboxd[1]); /* the standby */
  insert_events(&ctx, 3000, 200);
  count_wait_t some = {&ctx, "{\"status\": \"PUBLISHED\"}", 1500};
  assert_true(obx_test_wait_for(count_reached, &some, 60000, 10));
  char owner[128];
  lease_owner(&ctx, owner, sizeof owner);
  const char *colon = strchr(owner, ':');
  int pid = colon ? atoi(colon + 1) : 0;
  int victim = pid == g_outboxd[0].pid ? 0 : pid == g_outboxd[1].pid ? 1 : -1;
  if (victim < 0) fail_msg("lease owner \"%s\" is neither outboxd", owner);
  insert_events(&ctx, 2000, 200);

  /* kill -9 the leader mid-run: events in flight, checkpoint behind */
  int64_t published_before = count_docs(ctx.outbox, "{\"status\": \"PUBLISHED\"}");
  obx_test_proc_stop(&g_outboxd[victim], SIGKILL, 5000);
  if (published_before >= ctx.n)
    fail_msg("not mid-run: %lld of %d events PUBLISHED when killed", (long long)published_before, ctx.n);
  int64_t t0 = obx_test_now_ms();
  takeover_t t = {&ctx, owner};
  if (!obx_test_wait_for(taken_over, &t, 30000, 20)) fail_msg("the standby never took over");
  int64_t took = obx_test_now_ms() - t0;
  /* within the lease (2 s) plus the standby's polling (lease/10) and a loaded machine's slack */
  if (took > 3200) fail_msg("takeover took %lld ms, lease is 2000 ms", (long long)took);

  insert_events(&ctx, 5000, 200);
  wait_published(&ctx, 10000, 120000);
  obx_test_proc_stop(&g_outboxd[1 - victim], SIGTERM, 10000);
  int records = kafka_check(&ctx, 120000, false);
  print_message("kill -9 with %lld of %d PUBLISHED: standby took over in %lld ms; %d records for %d events\n",
                (long long)published_before, 5000, (long long)took, records, ctx.n);
  ctx_cleanup(&ctx);
}

/* Sends this process's log lines to a file of the test's own (its path into path); the test
 * reads what the relay logged from there. */
static FILE *log_to_file(const ctx_t *ctx, char *path, size_t pathlen) {
  snprintf(path, pathlen, "%s/relay-%s.log", obx_test_tmpdir(), ctx->db);
  FILE *log = fopen(path, "w");
  assert_non_null(log);
  setvbuf(log, NULL, _IOLBF, 0);
  obx_log_set_stream(log);
  return log;
}

static void log_close(FILE *log) {
  obx_log_set_stream(NULL);
  fclose(log);
}

/* A relay that leads and has published 20 events of 4 keys. */
static obx_relay_t *relay_start_leading(ctx_t *ctx) {
  obx_relay_t *relay = relay_start(ctx);
  leader_wait_t w = {relay};
  assert_true(obx_test_wait_for(is_leader, &w, 20000, 50));
  insert_events(ctx, 20, 4);
  wait_published(ctx, 20, 30000);
  return relay;
}

/* Another owner writes the checkpoint with a higher epoch while the relay keeps renewing its
 * lease: the relay's next checkpoint write (an upsert fenced by its epoch) collides on _id, the
 * relay steps down and logs it, and the intruder's checkpoint stays as written. */
static void test_checkpoint_fenced_while_lease_held(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "ckfence", &g_mongo, NULL);
  char log_path[512];
  FILE *log = log_to_file(&ctx, log_path, sizeof log_path);
  obx_relay_t *relay = relay_start_leading(&ctx);
  ctx_t ckpt_ctx = ctx;
  ckpt_ctx.outbox = mongoc_client_get_collection(ctx.client, ctx.db, "relay_checkpoints");
  char filter[300];
  snprintf(filter, sizeof filter, "{\"_id\": \"outbox\", \"owner\": \"%s\", \"resumeToken\": {\"$exists\": true}}", relay->owner);
  count_wait_t own = {&ckpt_ctx, filter, 1};
  if (!obx_test_wait_for(count_reached, &own, 10000, 50)) fail_msg("the relay wrote no checkpoint within 10 s");

  int64_t epoch = relay->epoch, intruder_epoch = epoch + 1000;
  bson_t *ckpt = BCON_NEW("owner", "intruder", "epoch", BCON_INT64(intruder_epoch));
  set_doc(&ctx, "relay_checkpoints", "outbox", ckpt);
  insert_events(&ctx, 10, 2); /* the relay's checkpoint moves: its next write is fenced */
  if (!obx_test_file_contains(log_path, "relay steps down: a newer epoch wrote the checkpoint", 20000))
    fail_msg("no step-down logged after the fenced checkpoint write (log: %s)", log_path);
  /* it stepped down although nobody took the lease: it acquires its own lease again (epoch + 1) */
  char owner[128];
  lease_owner(&ctx, owner, sizeof owner);
  if (strcmp(owner, relay->owner) != 0) fail_msg("lease owner: got \"%s\" want \"%s\"", owner, relay->owner);
  obx_relay_stop(relay->group); /* its shutdown checkpoint write is fenced too */
  log_close(log);
  snprintf(filter, sizeof filter, "{\"_id\": \"outbox\", \"owner\": \"intruder\", \"epoch\": %lld}", (long long)intruder_epoch);
  if (count_docs(ckpt_ctx.outbox, filter) != 1) {
    char *dump = NULL;
    bson_t all = BSON_INITIALIZER;
    mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(ckpt_ctx.outbox, &all, NULL, NULL);
    const bson_t *doc;
    if (mongoc_cursor_next(cursor, &doc)) dump = bson_as_relaxed_extended_json(doc, NULL);
    fail_msg("the intruder's checkpoint was overwritten: got %s want owner intruder, epoch %lld", dump ? dump : "none",
             (long long)intruder_epoch);
  }
  mongoc_collection_destroy(ckpt_ctx.outbox);
  bson_destroy(ckpt);
  ctx_cleanup(&ctx);
}

/* A fatal error of the idempotent producer (here an out-of-order sequence answered by the
 * broker) leaves it unable to send: the relay replaces it and publishes everything, in order. */
static void test_fatal_producer_is_replaced(void **state) {
  ctx_t ctx;
  ctx_init_mock(&ctx, "fatal", &g_mongo, NULL);
  char log_path[512];
  FILE *log = log_to_file(&ctx, log_path, sizeof log_path);
  obx_relay_t *relay = relay_start_leading(&ctx);
  if (!obx_test_kafka_cmd(&g_kafka, "push-errors Produce 3 OUT_OF_ORDER_SEQUENCE_NUMBER"))
    fail_msg("kafka-mockd refused push-errors");
  insert_events(&ctx, 30, 4);
  if (!obx_test_file_contains(log_path, "Kafka producer replaced after a fatal error", 30000))
    fail_msg("the producer was not replaced (log: %s)", log_path);
  wait_published(&ctx, 50, 30000);
  obx_relay_stop(relay->group);
  log_close(log);
  kafka_check(&ctx, 60000, false);
  ctx_cleanup(&ctx);
}

/* Several events of a key in flight (the idempotent producer's gap-less guarantee) and the
 * broker refuses one of them (a record over the topic's max.message.bytes, on the real broker:
 * kafka-mockd does not check an idempotent producer's sequences, so it would write the later
 * records): none of the later events of its key is written to Kafka. The producer turns fatal,
 * is replaced, the refused event is FAILED with the broker's reason (once: the stream read
 * again by the next leadership does not publish it from its insert) and holds its key, its
 * later events stay PENDING and are not in the topic; skipping it publishes them, in order. */
static void test_refused_event_in_a_key_window(void **state) {
  const char *settings[] = {"kafka.batch.size", "16384", "relay.key_window", "16", NULL};
  const char *topic[] = {"max.message.bytes", "40000", NULL};
  ctx_t ctx;
  ctx_init_on(&ctx, "window", &g_mongo, settings, false, topic);
  obx_relay_t *relay = relay_start_leading(&ctx);
  if (!obx_relay_producer_gapless(relay->producer)) fail_msg("the idempotent producer has no gap-less guarantee");
  obx_err_t err = OBX_ERR_INIT;
  obx_mongo_t *mongo = obx_mongo_new(&ctx.conf, &err);
  obx_ops_t ops = {.mongo = mongo, .who = "test"};
  insert_events(&ctx, 3, 1); /* ORD-0000, one bulk each: read and produced back to back */
  int big = ctx.n;
  ctx.pad = 100000; /* under the producer's message.max.bytes, over the topic's max.message.bytes */
  insert_events(&ctx, 1, 1);
  ctx.pad = 0;
  insert_events(&ctx, 30, 1);
  insert_events(&ctx, 20, 4);
  settled_t s = {&ctx, relay};
  if (!obx_test_wait_for(settled_behind_failed, &s, 30000, 50))
    fail_msg("never settled with a held key (held %d, in flight %d)", (int)relay->counters.held_keys,
             (int)relay->counters.inflight);
  int heads[64];
  int n = failed_heads(&ctx, "MSG_SIZE_TOO_LARGE", heads, 64); /* and none later of its key PUBLISHED */
  bool big_failed = false;
  for (int f = 0; f < n; f++) big_failed |= heads[f] == big;
  if (!big_failed) fail_msg("the refused event %d is not FAILED (%d FAILED)", big, n);
  /* what the topic holds now: no event of ORD-0000 after the refused one */
  kafka_read_t r;
  memset(&r, 0, sizeof r);
  r.ctx = &ctx;
  r.seen = calloc((size_t)ctx.n, sizeof *r.seen);
  r.last_of_key = calloc(MAX_EVENTS, sizeof *r.last_of_key);
  r.partition = calloc((size_t)ctx.n, sizeof *r.partition);
  r.offset = calloc((size_t)ctx.n, sizeof *r.offset);
  int64_t in_topic = obx_test_kafka_topic_records(ctx.bootstrap, ctx.topic);
  if (obx_test_kafka_consume_all(ctx.bootstrap, ctx.topic, NULL, (int)in_topic, 30000, on_record, &r) < in_topic)
    fail_msg("read %d of the %lld records of the topic", r.records, (long long)in_topic);
  for (int i = big; i < big + 31; i++)
    if (r.seen[i]) fail_msg("event %d of the held key reached Kafka while %d is refused", i, big);
  free(r.seen);
  free(r.last_of_key);
  free(r.partition);
  free(r.offset);
  for (int f = 0; f < n; f++) {
    bson_t out = BSON_INITIALIZER;
    if (!obx_ops_outbox_skip(&ops, NULL, ctx.ids[heads[f]], false, &out, &err)) fail_msg("skip %d: %s", heads[f], err.msg);
    bson_destroy(&out);
    ctx.skipped[heads[f]] = true;
  }
  wait_published(&ctx, ctx.n - n, 30000);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, false);
  obx_mongo_destroy(mongo);
  ctx_cleanup(&ctx);
}

/* ---- the sweeper's claims with several relays -------------------------------------------- */

/* A relay context that only sweeps: its own MongoDB client and producer, no thread, no lease. */
typedef struct {
  obx_relay_t relay;
  mongoc_client_t *client;
  pthread_barrier_t *start;
  int errors;
} sweeper_t;

static void ignore_ack(const obx_relay_ack_t *ack, void *ctx) {
  (void)ack;
  (void)ctx;
}

static void sweeper_init(sweeper_t *s, ctx_t *ctx, const char *owner) {
  memset(s, 0, sizeof *s);
  s->relay.conf = &ctx->conf;
  snprintf(s->relay.owner, sizeof s->relay.owner, "%s", owner);
  s->client = obx_test_mongo_client(&g_mongo, NULL, owner);
  s->relay.outbox = mongoc_client_get_collection(s->client, ctx->db, "outbox");
  /* connected before the race starts: a handshake on a loaded machine can outlast the other
   * sweeper's whole pass */
  bson_t *ping = BCON_NEW("ping", BCON_INT32(1));
  bson_error_t berr;
  if (!mongoc_client_command_simple(s->client, "admin", ping, NULL, NULL, &berr)) fail_msg("ping: %s", berr.message);
  bson_destroy(ping);
  obx_err_t err = OBX_ERR_INIT;
  s->relay.producer = obx_relay_producer_new(&ctx->conf, NULL, ignore_ack, NULL, &err);
  s->relay.lease_until_ms = INT64_MAX; /* no lease: publishing is never held back by one */
  if (!s->relay.producer) fail_msg("producer: %s", err.msg);
}

/* Whether the sweeper claimed (and so holds a message for) event id. */
static bool sweeper_has(const sweeper_t *s, const char *id) {
  char key[OBX_UUID_LEN + 2];
  snprintf(key, sizeof key, "s%s", id); /* relay_id_key of a string _id */
  return relay_inflight_has(&s->relay, key, true) || relay_keys_queued_has(&s->relay, NULL, key);
}

static int sweeper_held(const sweeper_t *s) {
  return relay_pending(&s->relay);
}

static void sweeper_cleanup(sweeper_t *s) {
  obx_relay_producer_destroy(s->relay.producer);
  relay_list_t *lists[] = {&s->relay.inflight_sweep, &s->relay.inflight_stream, &s->relay.reported};
  for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
    while (lists[i]->head) {
      obx_relay_msg_t *msg = lists[i]->head;
      relay_list_remove(lists[i], msg);
      free(msg);
    }
  mongoc_collection_destroy(s->relay.outbox);
  mongoc_client_destroy(s->client);
}

static void *sweeper_main(void *arg) {
  sweeper_t *s = arg;
  pthread_barrier_wait(s->start);
  for (;;) {
    int claimed = relay_sweep(&s->relay, obx_time_now_ms());
    if (claimed < 0) s->errors++;
    if (claimed <= 0) break;
  }
  return NULL;
}

typedef struct {
  sweeper_t *sweeper;
  int before;
} claim_wait_t;

static bool claims_more(void *arg) {
  claim_wait_t *c = arg;
  relay_sweep(&c->sweeper->relay, obx_time_now_ms());
  return sweeper_held(c->sweeper) > c->before;
}

static void test_sweeper_claims_race_and_dead_claims_expire(void **state) {
  const char *settings[] = {"relay.max_inflight", "100000", "outbox.batch_size", "10", NULL};
  ctx_t ctx;
  ctx_init(&ctx, "claims", &g_mongo, settings);
  relay_metrics_register();
  insert_events(&ctx, 800, 20);

  /* two sweepers race over the same PENDING events */
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, 2);
  sweeper_t a, b;
  sweeper_init(&a, &ctx, "sweeper-a");
  sweeper_init(&b, &ctx, "sweeper-b");
  a.start = b.start = &start;
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, sweeper_main, &a), 0);
  assert_int_equal(pthread_create(&tb, NULL, sweeper_main, &b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  pthread_barrier_destroy(&start);
  if (a.errors || b.errors) fail_msg("claim errors: a %d, b %d", a.errors, b.errors);
  int both = 0, neither = 0;
  for (int i = 0; i < ctx.n; i++) {
    bool in_a = sweeper_has(&a, ctx.ids[i]), in_b = sweeper_has(&b, ctx.ids[i]);
    both += in_a && in_b;
    neither += !in_a && !in_b;
  }
  print_message("claims: sweeper-a %d, sweeper-b %d of %d\n", sweeper_held(&a), sweeper_held(&b), ctx.n);
  if (both) fail_msg("%d events claimed by both sweepers", both);
  if (neither) fail_msg("%d events claimed by neither sweeper", neither);
  if (sweeper_held(&a) == 0 || sweeper_held(&b) == 0)
    fail_msg("no race: sweeper-a claimed %d, sweeper-b %d", sweeper_held(&a), sweeper_held(&b));
  assert_int_equal(count_docs(ctx.outbox, "{\"claimedBy\": \"sweeper-a\"}"), sweeper_held(&a));
  assert_int_equal(count_docs(ctx.outbox, "{\"claimedBy\": \"sweeper-b\"}"), sweeper_held(&b));
  assert_int_equal(relay_sweep(&a.relay, obx_time_now_ms()), 0); /* live claims are skipped */

  /* a claim left by a dead relay is skipped until its claimedUntil, then taken */
  insert_events(&ctx, 2, 1);
  const char *dead_id = ctx.ids[ctx.n - 2], *free_id = ctx.ids[ctx.n - 1];
  int64_t until = obx_time_now_ms() + 2000;
  bson_t *dead = BCON_NEW("claimedBy", "dead-relay", "claimedUntil", BCON_DATE_TIME(until));
  set_doc(&ctx, "outbox", dead_id, dead);
  int held = sweeper_held(&a);
  assert_int_equal(relay_sweep(&a.relay, obx_time_now_ms()), 1);
  if (!sweeper_has(&a, free_id) || sweeper_has(&a, dead_id)) fail_msg("the sweeper took the dead relay's live claim");
  claim_wait_t c = {&a, held + 1};
  if (!obx_test_wait_for(claims_more, &c, 20000, 50)) fail_msg("the expired claim was never taken over");
  int64_t taken = obx_time_now_ms();
  if (taken < until) fail_msg("claim taken %lld ms before it expired", (long long)(until - taken));
  if (!sweeper_has(&a, dead_id)) fail_msg("took something other than the expired claim");
  bson_t *mine = BCON_NEW("_id", BCON_UTF8(dead_id), "claimedBy", "sweeper-a");
  char *json = bson_as_relaxed_extended_json(mine, NULL);
  assert_int_equal(count_docs(ctx.outbox, json), 1);
  bson_free(json);
  bson_destroy(mine);
  bson_destroy(dead);
  sweeper_cleanup(&a);
  sweeper_cleanup(&b);
  ctx_cleanup(&ctx);
}

/* Sets `set` on events [from, to) of ctx. */
static void set_events(ctx_t *ctx, int from, int to, const bson_t *set) {
  bson_t filter = BSON_INITIALIZER, id, in;
  char idx[16];
  BSON_APPEND_DOCUMENT_BEGIN(&filter, "_id", &id);
  BSON_APPEND_ARRAY_BEGIN(&id, "$in", &in);
  for (int i = from; i < to; i++) {
    snprintf(idx, sizeof idx, "%d", i - from);
    BSON_APPEND_UTF8(&in, idx, ctx->ids[i]);
  }
  bson_append_array_end(&id, &in);
  bson_append_document_end(&filter, &id);
  bson_t update = BSON_INITIALIZER;
  BSON_APPEND_DOCUMENT(&update, "$set", set);
  bson_error_t berr;
  if (!mongoc_collection_update_many(ctx->outbox, &filter, &update, NULL, NULL, &berr)) fail_msg("update: %s", berr.message);
  bson_destroy(&update);
  bson_destroy(&filter);
}

/* A leader killed during its first full sweep (no checkpoint yet) leaves claims behind, two
 * for some keys, while it has published the keys' earlier events. The next leader holds those
 * keys behind their oldest claimed event, publishes it first and then the key's other PENDING
 * events in order, before what the stream brings of the key (events written after it leads). */
static void test_takeover_mid_full_sweep_keeps_key_order(void **state) {
  ctx_t ctx;
  ctx_init(&ctx, "midsweep", &g_mongo, NULL);
  insert_events(&ctx, 800, 200);
  bson_t *published = BCON_NEW("status", "PUBLISHED");
  set_events(&ctx, 0, 200, published);
  for (int i = 0; i < 200; i++) ctx.skipped[i] = true;
  bson_t *claimed = BCON_NEW("claimedBy", "vm:1:dead", "claimedUntil", BCON_DATE_TIME(obx_time_now_ms() + 60000));
  set_events(&ctx, 200, 500, claimed);
  obx_relay_t *relay = relay_start(&ctx);
  leader_wait_t w = {relay};
  assert_true(obx_test_wait_for(is_leader, &w, 20000, 5));
  insert_events(&ctx, 400, 200);
  wait_published(&ctx, 1200, 60000);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 60000, false);
  bson_destroy(claimed);
  bson_destroy(published);
  ctx_cleanup(&ctx);
}

/* FAILED -> PENDING (an operator's reprocess) goes out through the change stream: in stream mode
 * the sweeper only takes events due for OUTBOX_POLL_INTERVAL_MS (here an hour). */
static void test_reprocess_published_by_the_stream(void **state) {
  const char *settings[] = {"outbox.poll_interval", "1h", NULL};
  ctx_t ctx;
  ctx_init(&ctx, "restream", &g_mongo, settings);
  insert_events(&ctx, 3, 3);
  bson_t *all = bson_new();
  bson_t *fail = BCON_NEW("$set", "{", "status", "FAILED", "attempts", BCON_INT32(5), "}");
  bson_error_t berr;
  assert_true(mongoc_collection_update_many(ctx.outbox, all, fail, NULL, NULL, &berr));
  obx_relay_t *relay = relay_start(&ctx);
  assert_true(obx_test_wait_for(has_led, relay, 20000, 20)); /* stream open, initial scan done */
  assert_int_equal(count_docs(ctx.outbox, "{\"status\": \"FAILED\"}"), 3);

  bson_t *filter = BCON_NEW("status", "FAILED");
  bson_t *update = BCON_NEW("$set", "{", "status", "PENDING", "attempts", BCON_INT32(0), "availableAt",
                            BCON_DATE_TIME(obx_time_now_ms()), "}");
  assert_true(mongoc_collection_update_many(ctx.outbox, filter, update, NULL, NULL, &berr));
  wait_published(&ctx, 3, 30000);
  obx_relay_stop(relay->group);
  kafka_check(&ctx, 30000, true);
  bson_destroy(update);
  bson_destroy(filter);
  bson_destroy(fail);
  bson_destroy(all);
  ctx_cleanup(&ctx);
}

static int group_setup(void **state) {
  if (!obx_test_have(obx_test_broker_shared(&g_broker), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)")) return -1;
  if (!obx_test_mongo_start(&g_mongo, NULL)) return -1;
  if (!obx_test_kafka_start(&g_kafka, 1, NULL)) return -1;
  g_client = obx_test_mongo_client(&g_mongo, NULL, "relay-test-admin");
  return 0;
}

static int group_teardown(void **state) {
  for (int i = 0; i < 2; i++) obx_test_proc_stop(&g_outboxd[i], SIGKILL, 5000);
  mongoc_client_destroy(g_client);
  obx_test_kafka_stop(&g_kafka);
  obx_test_mongo_stop(&g_mongo);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_stream_publishes_in_order_and_checkpoints),
    cmocka_unit_test(test_failed_publish_backs_off_then_fails_then_reprocess),
    cmocka_unit_test(test_poll_mode_claims_with_two_relays),
    cmocka_unit_test(test_lease_one_leader_and_takeover),
    cmocka_unit_test(test_deposed_leader_is_fenced),
    cmocka_unit_test(test_getmore_faults),
    cmocka_unit_test(test_history_lost_recovers_everything),
    cmocka_unit_test(test_stream_errors_restart_from_now),
    cmocka_unit_test(test_every_document_gets_an_answer),
    cmocka_unit_test(test_produce_errors_hold_the_key),
    cmocka_unit_test(test_kafka_down_20s_backpressure),
    cmocka_unit_test(test_kill_9_mid_run_loses_nothing),
    cmocka_unit_test(test_checkpoint_fenced_while_lease_held),
    cmocka_unit_test(test_fatal_producer_is_replaced),
    cmocka_unit_test(test_refused_event_in_a_key_window),
    cmocka_unit_test(test_sweeper_claims_race_and_dead_claims_expire),
    cmocka_unit_test(test_reprocess_published_by_the_stream),
    cmocka_unit_test(test_takeover_mid_full_sweep_keeps_key_order),
  };
  if (getenv("OBX_TEST_FILTER")) cmocka_set_test_filter(getenv("OBX_TEST_FILTER"));
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
