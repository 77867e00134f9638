/* test_relay_buckets.c - RELAY_BUCKETS: relays share the outbox's buckets, against devmongod
 * and the run's real Kafka broker
 *
 * DESIGN: one devmongod for the file, the run's shared broker (scripts/kafka.sh, started by
 * scripts/test.sh), a database and topic per test.
 *   - test_writer_writes_the_bucket: obx_outbox_append with 12 buckets writes each event's
 *     `bucket` = murmur2(partitionKey) mod 12 in the writer's transaction.
 *   - test_relays_share_buckets_through_kill_and_join: three `outboxd --roles relay` processes
 *     over 12 buckets (2 s lease) each hold 4; kill -9 of one while events flow: its 4 buckets
 *     are held by the two others within the lease (plus polling slack), and they end with 6
 *     each; it comes back (4 each again), and a fourth joins: every relay ends with 3. Half the
 *     events are written without a bucket (a writer that leaves it out): each ends PUBLISHED
 *     with the bucket of its key. The first 600 are written before any relay starts (published
 *     by the sweepers, which give the bucket-less ones of other buckets their bucket), the rest
 *     while the relays run (their streams). Read back from Kafka: every event at least once,
 *     the first copies of each key in commit order.
 *   - test_producers_only_for_buckets_held: a relay (in this process) over 12 buckets with five
 *     other live members (heartbeats the test writes; they hold nothing) takes its share, 2, and
 *     has 2 Kafka producers (outboxd_relay_producers), not 12; the members gone, it takes all 12
 *     (12 producers); back, it hands 10 over and is left with 2 producers again. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mongoc/mongoc.h>

#include "obx/obx_bucket.h"
#include "obx/obx_conf.h"
#include "obx/obx_event.h"
#include "obx/obx_metrics.h"
#include "obx/obx_mongo.h"
#include "obx/obx_outbox.h"
#include "obx/obx_relay.h"
#include "obx/obx_schema.h"
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_kafka.h"

#define BUCKETS 12
#define LEASE_MS 2000
#define RELAYS 4
#define KEYS 240
#define MAX_EVENTS 8000

static obx_test_mongo_t g_mongo;
static mongoc_client_t *g_client;
static obx_test_broker_t g_broker;
static obx_test_proc_t g_relay[RELAYS]; /* group_teardown stops what a failed test left running */

/* ---- the writer --------------------------------------------------------------------------- */

typedef struct {
  obx_mongo_t *mongo;
  int n;
} append_t;

static void event_init(obx_event_t *ev, const char *key, int seq) {
  obx_event_init(ev);
  ev->event_type = strdup("OrderConfirmed");
  ev->org_id = strdup("org-1");
  ev->aggregate_type = strdup("Order");
  ev->aggregate_id = strdup(key);
  BSON_APPEND_INT32(&ev->payload, "seq", seq);
}

static bool append_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  append_t *a = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  mongoc_collection_t *outbox = obx_mongo_collection(a->mongo, client, "outbox");
  bool ok = true;
  for (int i = 0; ok && i < 10; i++) {
    char key[32];
    snprintf(key, sizeof key, "K-%03d", a->n * 10 + i);
    obx_event_t ev;
    event_init(&ev, key, i);
    ok = obx_outbox_append(session, outbox, &ev, err);
    obx_event_cleanup(&ev);
  }
  mongoc_collection_destroy(outbox);
  return ok;
}

static void test_writer_writes_the_bucket(void **state) {
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  obx_conf_init(&conf);
  assert_true(obx_conf_set(&conf, "mongo.uri", g_mongo.uri, &err));
  assert_true(obx_conf_set(&conf, "mongo.db", "buckets_writer", &err));
  obx_mongo_t *mongo = obx_mongo_new(&conf, &err);
  if (!obx_schema_ensure(mongo, &conf, OBX_SCHEMA_API, &err)) fail_msg("schema: %s", err.msg);
  obx_outbox_set_buckets(BUCKETS);
  for (int t = 0; t < 5; t++) {
    append_t a = {mongo, t};
    if (!obx_mongo_transaction(mongo, append_txn, &a, &err)) fail_msg("transaction: %s", err.msg);
  }
  obx_outbox_set_buckets(1);
  mongoc_collection_t *outbox = mongoc_client_get_collection(g_client, "buckets_writer", "outbox");
  bson_t filter = BSON_INITIALIZER;
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(outbox, &filter, NULL, NULL);
  const bson_t *doc;
  int n = 0, used[BUCKETS] = {0};
  while (mongoc_cursor_next(cursor, &doc)) {
    bson_iter_t it;
    const char *key = bson_iter_init_find(&it, doc, "partitionKey") ? bson_iter_utf8(&it, NULL) : "?";
    int32_t want = obx_bucket_of(key, strlen(key), BUCKETS);
    if (!bson_iter_init_find(&it, doc, OBX_BUCKET_FIELD) || !BSON_ITER_HOLDS_INT32(&it) || bson_iter_int32(&it) != want)
      fail_msg("event of key %s: bucket got %d want %d", key, BSON_ITER_HOLDS_INT32(&it) ? bson_iter_int32(&it) : -1, want);
    used[want]++;
    n++;
  }
  mongoc_cursor_destroy(cursor);
  if (n != 50) fail_msg("events: got %d want 50", n);
  int spread = 0;
  for (int b = 0; b < BUCKETS; b++) spread += used[b] > 0;
  if (spread < BUCKETS / 2) fail_msg("50 keys fell in only %d of %d buckets", spread, BUCKETS);
  bson_destroy(&filter);
  mongoc_collection_destroy(outbox);
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
}

/* ---- relays sharing the buckets ---------------------------------------------------------- */

typedef struct {
  char db[64], topic[128];
  mongoc_collection_t *outbox, *leases;
  int n;
  char (*ids)[OBX_UUID_LEN + 1]; /* in commit order */
  int *key_of;
} ctx_t;

/* Inserts n events over KEYS keys; the events of odd keys carry no bucket. */
static void insert_events(ctx_t *ctx, int n) {
  mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(ctx->outbox, NULL);
  for (int i = 0; i < n; i++) {
    if (ctx->n >= MAX_EVENTS) fail_msg("too many events");
    int k = ctx->n % KEYS;
    char key[32];
    snprintf(key, sizeof key, "ORD-%04d", k);
    obx_event_t ev;
    event_init(&ev, key, ctx->n);
    obx_err_t err = OBX_ERR_INIT;
    bson_t doc = BSON_INITIALIZER;
    if (!obx_event_finalize(&ev, &err) || !obx_event_to_outbox(&ev, &doc, &err)) fail_msg("event: %s", err.msg);
    if (k % 2 == 0) BSON_APPEND_INT32(&doc, OBX_BUCKET_FIELD, obx_bucket_of(key, strlen(key), BUCKETS));
    memcpy(ctx->ids[ctx->n], ev.id, sizeof ctx->ids[0]);
    ctx->key_of[ctx->n++] = k;
    mongoc_bulk_operation_insert(bulk, &doc);
    bson_destroy(&doc);
    obx_event_cleanup(&ev);
  }
  bson_error_t berr;
  if (!mongoc_bulk_operation_execute(bulk, NULL, &berr)) fail_msg("insert: %s", berr.message);
  mongoc_bulk_operation_destroy(bulk);
}

static int64_t count(mongoc_collection_t *coll, const bson_t *filter) {
  bson_error_t berr;
  int64_t n = mongoc_collection_count_documents(coll, filter, NULL, NULL, NULL, &berr);
  if (n < 0) print_message("count: %s\n", berr.message);
  return n;
}

/* holder[b]: the index in g_relay of the relay holding bucket b's live lease, -1 when none. */
static void holders(ctx_t *ctx, int holder[BUCKETS]) {
  for (int b = 0; b < BUCKETS; b++) holder[b] = -1;
  bson_t *filter = BCON_NEW("expiresAt", "{", "$gt", BCON_DATE_TIME(obx_time_now_ms()), "}");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(ctx->leases, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it;
  while (mongoc_cursor_next(cursor, &doc)) {
    int b = -1, want_b = -1;
    const char *id = bson_iter_init_find(&it, doc, "_id") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    if (sscanf(id, "relay.%d/%d", &b, &want_b) != 2 || want_b != BUCKETS || b < 0 || b >= BUCKETS) continue;
    const char *owner = bson_iter_init_find(&it, doc, "owner") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    const char *colon = strchr(owner, ':');
    int pid = colon ? atoi(colon + 1) : 0;
    for (int r = 0; r < RELAYS; r++)
      if (g_relay[r].pid > 0 && g_relay[r].pid == pid) holder[b] = r;
  }
  mongoc_cursor_destroy(cursor);
  bson_destroy(filter);
}

typedef struct {
  ctx_t *ctx;
  int want[RELAYS];  /* buckets each relay must hold (-1: any) */
  int holder[BUCKETS];
} share_wait_t;

/* Every bucket held, and each relay holding its wanted number. */
static bool shares_are(void *arg) {
  share_wait_t *w = arg;
  int held[RELAYS] = {0};
  holders(w->ctx, w->holder);
  for (int b = 0; b < BUCKETS; b++) {
    if (w->holder[b] < 0) return false;
    held[w->holder[b]]++;
  }
  for (int r = 0; r < RELAYS; r++)
    if (w->want[r] >= 0 && held[r] != w->want[r]) return false;
  return true;
}

static void wait_shares(ctx_t *ctx, const int want[RELAYS], int timeout_ms, const char *when) {
  share_wait_t w = {.ctx = ctx};
  memcpy(w.want, want, sizeof w.want);
  if (obx_test_wait_for(shares_are, &w, timeout_ms, 20)) return;
  char got[256] = "";
  for (int b = 0; b < BUCKETS; b++) snprintf(got + strlen(got), sizeof got - strlen(got), " %d", w.holder[b]);
  fail_msg("%s: bucket holders (relay index per bucket, -1 none):%s; want per relay %d %d %d %d", when, got, want[0],
           want[1], want[2], want[3]);
}

typedef struct {
  ctx_t *ctx;
  bool victim_held[BUCKETS];
  int victim;
} takeover_t;

/* Every bucket the victim held is held by another live relay. */
static bool taken_over(void *arg) {
  takeover_t *t = arg;
  int holder[BUCKETS];
  holders(t->ctx, holder);
  for (int b = 0; b < BUCKETS; b++)
    if (t->victim_held[b] && (holder[b] < 0 || holder[b] == t->victim)) return false;
  return true;
}

static void relay_spawn(ctx_t *ctx, int r) {
  char uri[300], db[100], brokers[300], topic[200];
  snprintf(uri, sizeof uri, "MONGO_URI=%s", g_mongo.uri);
  snprintf(db, sizeof db, "MONGO_DB=%s", ctx->db);
  snprintf(brokers, sizeof brokers, "KAFKA_BROKERS=%s", g_broker.bootstrap);
  snprintf(topic, sizeof topic, "KAFKA_TOPIC=%s", ctx->topic);
  char *const env[] = {uri, db, brokers, topic, "HTTP_PORT=0", "HTTP_BIND=127.0.0.1", "RELAY_LEASE=2s",
                       "RELAY_BUCKETS=12", "OUTBOX_POLL_INTERVAL_MS=500", "RELAY_CHECKPOINT_INTERVAL=200",
                       "LOG_LEVEL=info", NULL};
  char *const argv[] = {(char *)obx_test_build_path("outboxd"), "--roles", "relay", NULL};
  if (!obx_test_spawn(&g_relay[r], argv, env)) fail_msg("outboxd %d did not start", r);
}

typedef struct {
  ctx_t *ctx;
  int want;
} published_wait_t;

static bool all_published(void *arg) {
  published_wait_t *w = arg;
  bson_t *filter = BCON_NEW("status", "PUBLISHED");
  bool done = count(w->ctx->outbox, filter) >= w->want;
  bson_destroy(filter);
  return done;
}

typedef struct {
  ctx_t *ctx;
  int *seen, *last_of_key;
  int records, unknown, order_errors;
} kafka_read_t;

static int id_cmp(const void *a, const void *b) { return strcmp(a, b); }

static void on_record(const rd_kafka_message_t *rkm, void *arg) {
  kafka_read_t *r = arg;
  char id[64];
  r->records++;
  if (!obx_test_kafka_header(rkm, "ce_id", id, sizeof id)) {
    r->unknown++;
    return;
  }
  int i = -1;
  for (int j = 0; j < r->ctx->n && i < 0; j++) /* UUIDv7 ids: inserted in increasing order */
    if (!id_cmp(r->ctx->ids[j], id)) i = j;
  if (i < 0) {
    r->unknown++;
    return;
  }
  if (r->seen[i]++ == 0) { /* the first copy of each event of a key: in commit order */
    int k = r->ctx->key_of[i];
    if (i < r->last_of_key[k] && r->order_errors++ < 5)
      print_message("key %d: event %d (partition %d offset %lld) after event %d\n", k, i, rkm->partition,
                    (long long)rkm->offset, r->last_of_key[k]);
    r->last_of_key[k] = i;
  }
}

static void test_relays_share_buckets_through_kill_and_join(void **state) {
  ctx_t ctx;
  memset(&ctx, 0, sizeof ctx);
  obx_test_require(obx_test_broker_shared(&g_broker), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)");
  snprintf(ctx.db, sizeof ctx.db, "buckets_share");
  if (!obx_test_broker_topic(&g_broker, "buckets", 6, NULL, ctx.topic, sizeof ctx.topic)) fail_msg("topic not created");
  ctx.outbox = mongoc_client_get_collection(g_client, ctx.db, "outbox");
  ctx.leases = mongoc_client_get_collection(g_client, ctx.db, "leases");
  ctx.ids = calloc(MAX_EVENTS, sizeof *ctx.ids);
  ctx.key_of = calloc(MAX_EVENTS, sizeof *ctx.key_of);

  insert_events(&ctx, 600); /* before any relay: their first sweeps publish them (and give buckets) */
  for (int r = 0; r < 3; r++) relay_spawn(&ctx, r);
  wait_shares(&ctx, (int[RELAYS]){4, 4, 4, -1}, 30000, "three relays");
  /* the first sweeps are over (the kill below hits relays that follow their streams) */
  published_wait_t first = {&ctx, ctx.n};
  if (!obx_test_wait_for(all_published, &first, 60000, 20)) fail_msg("the events written before the relays were not published");
  insert_events(&ctx, 1500);
  published_wait_t some = {&ctx, 500};
  if (!obx_test_wait_for(all_published, &some, 60000, 20)) fail_msg("nothing published");
  insert_events(&ctx, 1500);

  /* kill -9 a relay mid-run */
  takeover_t t = {&ctx, .victim = 0};
  int holder[BUCKETS];
  holders(&ctx, holder);
  for (int b = 0; b < BUCKETS; b++) t.victim_held[b] = holder[b] == t.victim;
  bson_t *published = BCON_NEW("status", "PUBLISHED");
  int64_t published_before = count(ctx.outbox, published);
  bson_destroy(published);
  obx_test_proc_stop(&g_relay[t.victim], SIGKILL, 5000);
  int64_t t0 = obx_test_now_ms();
  if (published_before >= ctx.n) fail_msg("not mid-run: %lld of %d events PUBLISHED when killed", (long long)published_before, ctx.n);
  if (!obx_test_wait_for(taken_over, &t, 30000, 10)) fail_msg("the killed relay's buckets were never taken over");
  int64_t took = obx_test_now_ms() - t0;
  /* within the lease (its last renewal was at most lease/3 before the kill), plus the takers'
   * turn, their lease attempts and a loaded machine's slack */
  if (took > LEASE_MS + 1200) fail_msg("takeover of the killed relay's buckets took %lld ms, lease %d ms", (long long)took, LEASE_MS);
  wait_shares(&ctx, (int[RELAYS]){0, 6, 6, -1}, 20000, "after the kill");
  insert_events(&ctx, 1500);

  /* the killed one comes back (three relays: 4 each), then a fourth joins (3 each) */
  relay_spawn(&ctx, 0);
  wait_shares(&ctx, (int[RELAYS]){4, 4, 4, -1}, 30000, "after the killed relay came back");
  insert_events(&ctx, 1000);
  relay_spawn(&ctx, 3);
  int64_t t1 = obx_test_now_ms();
  wait_shares(&ctx, (int[RELAYS]){3, 3, 3, 3}, 30000, "after a fourth joined");
  int64_t joined = obx_test_now_ms() - t1;
  insert_events(&ctx, 1500);

  published_wait_t all = {&ctx, ctx.n};
  if (!obx_test_wait_for(all_published, &all, 120000, 100)) fail_msg("not every event was published");
  for (int r = 0; r < RELAYS; r++) obx_test_proc_stop(&g_relay[r], SIGTERM, 10000);

  /* the events written without a bucket were given theirs */
  bson_t filter = BSON_INITIALIZER;
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(ctx.outbox, &filter, NULL, NULL);
  const bson_t *doc;
  int wrong = 0;
  while (mongoc_cursor_next(cursor, &doc)) {
    bson_iter_t it;
    const char *key = bson_iter_init_find(&it, doc, "partitionKey") ? bson_iter_utf8(&it, NULL) : "";
    int32_t want = obx_bucket_of(key, strlen(key), BUCKETS);
    wrong += !bson_iter_init_find(&it, doc, OBX_BUCKET_FIELD) || !BSON_ITER_HOLDS_INT32(&it) || bson_iter_int32(&it) != want;
  }
  mongoc_cursor_destroy(cursor);
  if (wrong) fail_msg("%d events without the bucket of their key", wrong);

  kafka_read_t r = {&ctx, calloc((size_t)ctx.n, sizeof(int)), calloc(KEYS, sizeof(int)), 0, 0, 0};
  for (int k = 0; k < KEYS; k++) r.last_of_key[k] = -1;
  int missing = ctx.n;
  int64_t deadline = obx_test_now_ms() + 120000;
  while (missing > 0 && obx_test_now_ms() < deadline) {
    if (obx_test_kafka_consume_all(g_broker.bootstrap, ctx.topic, "buckets-check", missing,
                                   (int)(deadline - obx_test_now_ms()), on_record, &r) < 0)
      fail_msg("consumer failed");
    missing = 0;
    for (int i = 0; i < ctx.n; i++) missing += r.seen[i] == 0;
  }
  if (missing) fail_msg("%d of %d events never reached Kafka (%d records read)", missing, ctx.n, r.records);
  if (r.unknown) fail_msg("%d records of unknown events", r.unknown);
  if (r.order_errors) fail_msg("%d events out of their key's commit order", r.order_errors);
  print_message("12 buckets: 3 relays 4/4/4; kill -9 of one: its buckets taken over in %lld ms (lease %d ms), then 6/6; "
                "restarted: 4/4/4; a fourth joined: 3/3/3/3 in %lld ms; %d events, %d records (duplicates %d), 0 out of key order\n",
                (long long)took, LEASE_MS, (long long)joined, ctx.n, r.records, r.records - ctx.n);
  free(r.seen);
  free(r.last_of_key);
  free(ctx.ids);
  free(ctx.key_of);
  mongoc_collection_destroy(ctx.leases);
  mongoc_collection_destroy(ctx.outbox);
}

/* ---- one producer per bucket held ------------------------------------------------------- */

#define FAKE_MEMBERS 5

/* Heartbeats of FAKE_MEMBERS live relays with 12 buckets that hold none. */
static void fake_members(mongoc_collection_t *members) {
  for (int i = 0; i < FAKE_MEMBERS; i++) {
    char id[32];
    snprintf(id, sizeof id, "fake-member-%d", i);
    bson_t *selector = BCON_NEW("_id", BCON_UTF8(id));
    bson_t *update = BCON_NEW("$set", "{", "buckets", BCON_INT32(BUCKETS), "held", "[", "]", "expiresAt",
                              BCON_DATE_TIME(obx_time_now_ms() + 600000), "}");
    bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
    bson_error_t berr;
    if (!mongoc_collection_update_one(members, selector, update, opts, NULL, &berr)) fail_msg("member: %s", berr.message);
    bson_destroy(opts);
    bson_destroy(update);
    bson_destroy(selector);
  }
}

typedef struct {
  mongoc_collection_t *leases;
  int want;
  char got[160];
} producers_wait_t;

/* The process's gauges say `want` buckets led with `want` producers, and `want` leases are live. */
static bool producers_are(void *arg) {
  producers_wait_t *w = arg;
  char *text = obx_metrics_render(NULL), leader[64], producers[64];
  snprintf(leader, sizeof leader, "\noutboxd_relay_leader %d\n", w->want);
  snprintf(producers, sizeof producers, "\noutboxd_relay_producers %d\n", w->want);
  const char *p = strstr(text, "\noutboxd_relay_producers ");
  const char *l = strstr(text, "\noutboxd_relay_leader ");
  bson_t *filter = BCON_NEW("expiresAt", "{", "$gt", BCON_DATE_TIME(obx_time_now_ms()), "}");
  int64_t live = count(w->leases, filter);
  bson_destroy(filter);
  snprintf(w->got, sizeof w->got, "producers %.3s, leader %.3s, live leases %lld", p ? p + 25 : "?", l ? l + 22 : "?",
           (long long)live);
  bool ok = strstr(text, leader) && strstr(text, producers) && live == w->want;
  free(text);
  return ok;
}

static void wait_producers(mongoc_collection_t *leases, int want, const char *when) {
  producers_wait_t w = {leases, want, ""};
  if (!obx_test_wait_for(producers_are, &w, 30000, 20)) fail_msg("%s: want %d buckets and producers, got %s", when, want, w.got);
}

static void test_producers_only_for_buckets_held(void **state) {
  obx_test_require(obx_test_broker_shared(&g_broker), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)");
  char topic[128];
  if (!obx_test_broker_topic(&g_broker, "producers", 3, NULL, topic, sizeof topic)) fail_msg("topic not created");
  const char *db = "buckets_producers";
  mongoc_collection_t *members = mongoc_client_get_collection(g_client, db, "relay_members");
  mongoc_collection_t *leases = mongoc_client_get_collection(g_client, db, "leases");
  fake_members(members);
  obx_conf_t conf;
  obx_conf_init(&conf);
  obx_err_t err = OBX_ERR_INIT;
  const char *settings[] = {"mongo.uri", g_mongo.uri, "mongo.db", db, "kafka.brokers", g_broker.bootstrap,
                            "kafka.topic", topic, "relay.lease", "2s", "relay.buckets", "12", "log.level", "warn", NULL};
  for (int i = 0; settings[i]; i += 2)
    if (!obx_conf_set(&conf, settings[i], settings[i + 1], &err)) fail_msg("conf %s: %s", settings[i], err.msg);
  void *group = obx_relay_start(&conf, NULL, &err);
  if (!group) fail_msg("relay start: %s", err.msg);

  wait_producers(leases, 2, "one relay among six live members");
  bson_t *fakes = BCON_NEW("_id", "{", "$regex", BCON_UTF8("^fake-member-"), "}");
  bson_error_t berr;
  if (!mongoc_collection_delete_many(members, fakes, NULL, NULL, &berr)) fail_msg("delete members: %s", berr.message);
  bson_destroy(fakes);
  wait_producers(leases, BUCKETS, "the only live member");
  fake_members(members);
  wait_producers(leases, 2, "after handing 10 buckets over");

  obx_relay_stop(group);
  obx_conf_cleanup(&conf);
  mongoc_collection_destroy(leases);
  mongoc_collection_destroy(members);
}

static int group_setup(void **state) { return obx_test_fixture_mongo_setup(&g_mongo, NULL, &g_client); }

static int group_teardown(void **state) {
  for (int r = 0; r < RELAYS; r++) obx_test_proc_stop(&g_relay[r], SIGKILL, 5000);
  return obx_test_fixture_mongo_teardown(&g_mongo, g_client);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_writer_writes_the_bucket),
    cmocka_unit_test(test_relays_share_buckets_through_kill_and_join),
    cmocka_unit_test(test_producers_only_for_buckets_held),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
