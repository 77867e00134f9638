/* test_relay_sweep.c - the sweeper's bounds in stream mode, against devmongod and the run's Kafka broker
 *
 * DESIGN: one devmongod for the file, the run's shared broker (scripts/kafka.sh, started by
 * scripts/test.sh); each test has its own database and topic. The relay runs in this process.
 *   - test_sweep_leaves_newer_events_to_the_stream: while the change stream cannot read
 *     (getMore and the reopening aggregate fail), the sweeper publishes an event older than the checkpoint's cluster time
 *     and leaves the events committed after the checkpoint PENDING; once the stream reads
 *     again they reach Kafka once each, in their key's order.
 *   - test_first_scan_leaves_new_events_to_the_stream: without a checkpoint the relay opens
 *     the stream and sweeps what was there; events written during that scan are the stream's
 *     and reach Kafka exactly once (the scan took them too before its bound).
 *   - test_dead_leaders_claims_keep_key_order: a leader died with an event claimed; the next
 *     leader publishes it at once and before its key's later event (not when the claim expires).
 *   - test_lease_lapse_in_first_scan_keeps_key_order: a relay in its first full scan (no
 *     checkpoint) stalls past its lease in a claim (devmongod blocks the batch's find 2.6 s):
 *     its next publishes find the lease run out, it steps down with the batch claimed, and it
 *     leads again only from the top of its loop (keys of its own claims held, claims released),
 *     so a key whose earlier events it had claimed and dropped is published in order. Before,
 *     it took its lease again inside the scan and went on with the next batch: the key's later
 *     events first, the claimed ones 30 s later when the claims expired.
 *   - test_writes_carry_the_shard_key: with the profiler on, every outbox update the relay sends
 *     (claims, PUBLISHED marks) and the read-back of its claims filter on partitionKey, the
 *     shard key of a sharded outbox, so mongos would send each to the shards of those keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mongoc/mongoc.h>

#include "obx/obx_conf.h"
#include "obx/obx_event.h"
#include "obx/obx_relay.h"
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_kafka.h"
#include "../../src/relay/relay_int.h"

#define MAX_EVENTS 4096

static obx_test_mongo_t g_mongo;
static mongoc_client_t *g_client;
static obx_test_broker_t g_broker;

typedef struct {
  char db[64], topic[128];
  obx_conf_t conf;
  mongoc_collection_t *outbox;
  int n;
  char ids[MAX_EVENTS][OBX_UUID_LEN + 1];
  char keys[MAX_EVENTS][16];
} ctx_t;

static void ctx_init(ctx_t *ctx, const char *name) {
  static int serial;
  memset(ctx, 0, sizeof *ctx);
  obx_test_require(obx_test_broker_shared(&g_broker),
                   "no Kafka broker for this run (OBX_TEST_KAFKA_DIR; scripts/test.sh starts one)");
  snprintf(ctx->db, sizeof ctx->db, "sweep_%s_%d", name, ++serial);
  if (!obx_test_broker_topic(&g_broker, name, 3, NULL, ctx->topic, sizeof ctx->topic)) fail_msg("topic not created");
  obx_conf_init(&ctx->conf);
  const char *set[] = {"mongo.uri", g_mongo.uri, "mongo.db", ctx->db, "kafka.brokers", g_broker.bootstrap,
                       "kafka.topic", ctx->topic, "relay.lease", "2s", "outbox.poll_interval", "300",
                       "relay.checkpoint_interval", "100", "log.level", "warn", NULL};
  obx_err_t err = OBX_ERR_INIT;
  for (int i = 0; set[i]; i += 2)
    if (!obx_conf_set(&ctx->conf, set[i], set[i + 1], &err)) fail_msg("conf %s: %s", set[i], err.msg);
  ctx->outbox = mongoc_client_get_collection(g_client, ctx->db, "outbox");
}

static void ctx_cleanup(ctx_t *ctx) {
  mongoc_collection_destroy(ctx->outbox);
  obx_conf_cleanup(&ctx->conf);
}

/* Inserts one PENDING event of key `key`; available_ms > 0 backdates its occurredAt and
 * availableAt (a writer whose event is older than the checkpoint). */
static void insert_event(ctx_t *ctx, const char *key, int64_t available_ms) {
  if (ctx->n >= MAX_EVENTS) fail_msg("too many events");
  obx_event_t ev;
  obx_event_init(&ev);
  ev.event_type = strdup("OrderConfirmed");
  ev.org_id = strdup("org-1");
  ev.aggregate_type = strdup("Order");
  ev.aggregate_id = strdup(key);
  BSON_APPEND_INT32(&ev.payload, "seq", ctx->n);
  obx_err_t err = OBX_ERR_INIT;
  bson_t doc = BSON_INITIALIZER;
  if (!obx_event_finalize(&ev, &err)) fail_msg("event: %s", err.msg);
  if (available_ms > 0) ev.occurred_at_ms = available_ms;
  if (!obx_event_to_outbox(&ev, &doc, &err)) fail_msg("event: %s", err.msg); /* availableAt = occurredAt */
  bson_error_t berr;
  if (!mongoc_collection_insert_one(ctx->outbox, &doc, NULL, NULL, &berr)) fail_msg("insert: %s", berr.message);
  memcpy(ctx->ids[ctx->n], ev.id, sizeof ctx->ids[0]);
  snprintf(ctx->keys[ctx->n], sizeof ctx->keys[0], "%s", key);
  ctx->n++;
  bson_destroy(&doc);
  obx_event_cleanup(&ev);
}

static const char *status_of(ctx_t *ctx, int i, char *out, size_t len) {
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(ctx->ids[i]));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(ctx->outbox, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it;
  snprintf(out, len, "(missing)");
  if (mongoc_cursor_next(cursor, &doc) && bson_iter_init_find(&it, doc, "status") && BSON_ITER_HOLDS_UTF8(&it))
    snprintf(out, len, "%s", bson_iter_utf8(&it, NULL));
  mongoc_cursor_destroy(cursor);
  bson_destroy(filter);
  return out;
}

typedef struct {
  ctx_t *ctx;
  int from, to; /* events [from, to) */
} range_t;

static bool range_published(void *arg) {
  range_t *r = arg;
  char st[32];
  for (int i = r->from; i < r->to; i++)
    if (strcmp(status_of(r->ctx, i, st, sizeof st), "PUBLISHED") != 0) return false;
  return true;
}

static void wait_published(ctx_t *ctx, int from, int to, int timeout_ms) {
  range_t r = {ctx, from, to};
  if (!obx_test_wait_for(range_published, &r, timeout_ms, 50)) {
    char st[32];
    for (int i = from; i < to; i++)
      if (strcmp(status_of(ctx, i, st, sizeof st), "PUBLISHED") != 0) fail_msg("event %d is %s, not PUBLISHED", i, st);
  }
}

static bool leads_with_stream(void *arg) {
  obx_relay_t *relay = arg;
  return relay->counters.leader && relay->counters.stream_up;
}

static bool stream_down(void *arg) {
  obx_relay_t *relay = arg;
  return !relay->counters.stream_up;
}

/* ---- reading the topic back ------------------------------------------------------------ */

typedef struct {
  ctx_t *ctx;
  int seen[MAX_EVENTS];
  int last_of_key[MAX_EVENTS]; /* by the index of the key's first event */
  int records, order_errors, unknown;
} read_t;

static void on_record(const rd_kafka_message_t *rkm, void *arg) {
  read_t *r = arg;
  char id[64];
  r->records++;
  int i = -1;
  if (obx_test_kafka_header(rkm, "ce_id", id, sizeof id))
    for (int j = 0; j < r->ctx->n && i < 0; j++)
      if (strcmp(r->ctx->ids[j], id) == 0) i = j;
  if (i < 0) {
    r->unknown++;
    return;
  }
  if (r->seen[i]++) return;
  int k = 0;
  while (strcmp(r->ctx->keys[k], r->ctx->keys[i]) != 0) k++;
  if (i < r->last_of_key[k]) r->order_errors++; /* a key's first copies in commit order */
  r->last_of_key[k] = i;
}

/* Reads the topic: every event at least once, each key's in order; *records gets the total. */
static void read_topic(ctx_t *ctx, read_t *r) {
  char group[128];
  memset(r, 0, sizeof *r);
  r->ctx = ctx;
  for (int k = 0; k < MAX_EVENTS; k++) r->last_of_key[k] = -1;
  obx_test_broker_group("sweep-check", group, sizeof group);
  int64_t deadline = obx_test_now_ms() + 20000;
  int missing = ctx->n;
  while (missing > 0 && obx_test_now_ms() < deadline) {
    if (obx_test_kafka_consume_all(g_broker.bootstrap, ctx->topic, group, missing, (int)(deadline - obx_test_now_ms()),
                                   on_record, r) < 0)
      fail_msg("consumer failed");
    missing = 0;
    for (int i = 0; i < ctx->n; i++) missing += r->seen[i] == 0;
  }
  if (missing) fail_msg("%d of %d events never reached Kafka", missing, ctx->n);
  /* anything more in the topic is a duplicate */
  if (obx_test_kafka_consume_all(g_broker.bootstrap, ctx->topic, group, 1, 2000, on_record, r) < 0)
    fail_msg("consumer failed");
  if (r->unknown) fail_msg("%d records of unknown events", r->unknown);
  if (r->order_errors) fail_msg("%d records out of their key's order", r->order_errors);
}

/* ---- tests ------------------------------------------------------------------------------ */

typedef struct {
  ctx_t *ctx;
  int64_t until_ms;
} grace_wait_t;

static bool grace_passed_or_taken(void *arg) {
  grace_wait_t *w = arg;
  char st[32];
  return obx_test_now_ms() >= w->until_ms || strcmp(status_of(w->ctx, 1, st, sizeof st), "PENDING") != 0;
}

static void test_sweep_leaves_newer_events_to_the_stream(void **state) {
  (void)state;
  ctx_t *ctx = calloc(1, sizeof *ctx);
  ctx_init(ctx, "bound");
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_t *relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay: %s", err.msg);
  assert_true(obx_test_wait_for(leads_with_stream, relay, 20000, 20));
  insert_event(ctx, "K-0", 0);
  wait_published(ctx, 0, 1, 10000); /* by the stream; the checkpoint passes it */

  /* the stream cannot read from here on (every getMore and every reopen of the relay fails: a
   * reopen's first batch would read events 1 and 2; it reopens every second and restarts from
   * now only after 10 failures in a row) */
  obx_test_fail_point(g_client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"alwaysOn\", \"data\": "
                                "{\"appName\": \"outboxd\", \"failCommands\": [\"getMore\", \"aggregate\"], "
                                "\"errorCode\": 2}}");
  if (!obx_test_wait_for(stream_down, relay, 5000, 5)) fail_msg("the stream kept reading through the fail point");
  int64_t t0 = obx_test_now_ms();
  insert_event(ctx, "K-1", 0); /* 1, 2: one key, after the checkpoint */
  insert_event(ctx, "K-1", 0);
  /* the sweeper's grace (300 ms) passes twice, unless event 1 is taken before */
  grace_wait_t gw = {ctx, t0 + 2 * 300 + 100};
  obx_test_wait_for(grace_passed_or_taken, &gw, 5000, 50);
  /* 3: older than the checkpoint (its writer's clock an hour behind): the sweeper's */
  insert_event(ctx, "K-2", obx_test_now_ms() - 3600 * 1000);
  wait_published(ctx, 3, 4, 5000);
  char st1[32], st2[32];
  status_of(ctx, 1, st1, sizeof st1);
  status_of(ctx, 2, st2, sizeof st2);
  int64_t fired = obx_test_fail_point(g_client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  if (strcmp(st1, "PENDING") || strcmp(st2, "PENDING"))
    fail_msg("the sweeper took events committed after the checkpoint: %s, %s", st1, st2);
  if (fired < 1) fail_msg("the stream never tried to read while the fail point was on");
  if (relay->counters.recoveries[RELAY_STREAM_REOPEN_FAILED]) fail_msg("the stream restarted from now meanwhile");

  wait_published(ctx, 1, 3, 15000); /* by the stream, once it reads again */
  read_t *r = calloc(1, sizeof *r);
  read_topic(ctx, r);
  if (r->seen[1] != 1 || r->seen[2] != 1)
    fail_msg("events after the checkpoint reached Kafka %d and %d times, want once each", r->seen[1], r->seen[2]);
  free(r);
  obx_relay_stop(relay->group);
  ctx_cleanup(ctx);
  free(ctx);
}

typedef struct {
  ctx_t *ctx;
  int want;
} count_t;

static bool some_published(void *arg) {
  count_t *c = arg;
  bson_t *filter = BCON_NEW("status", "PUBLISHED");
  int64_t n = mongoc_collection_count_documents(c->ctx->outbox, filter, NULL, NULL, NULL, NULL);
  bson_destroy(filter);
  return n >= c->want;
}

static void test_first_scan_leaves_new_events_to_the_stream(void **state) {
  (void)state;
  ctx_t *ctx = calloc(1, sizeof *ctx);
  ctx_init(ctx, "firstscan");
  const char *small[] = {"outbox.batch_size", "20", "relay.max_inflight", "40", NULL};
  obx_err_t err = OBX_ERR_INIT;
  for (int i = 0; small[i]; i += 2)
    if (!obx_conf_set(&ctx->conf, small[i], small[i + 1], &err)) fail_msg("conf: %s", err.msg);
  char key[16];
  for (int i = 0; i < 2000; i++) {
    snprintf(key, sizeof key, "K-%d", i % 50);
    insert_event(ctx, key, 0);
  }
  obx_relay_t *relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay: %s", err.msg);
  count_t c = {ctx, 1};
  assert_true(obx_test_wait_for(some_published, &c, 20000, 5)); /* the scan has begun: the stream is open */
  int during = 0;
  for (c.want = 2000; !some_published(&c) && ctx->n < MAX_EVENTS; during++) {
    snprintf(key, sizeof key, "K-%d", during % 50);
    insert_event(ctx, key, 0);
  }
  if (during < 10) fail_msg("only %d events were written during the scan (make it longer)", during);
  wait_published(ctx, 0, ctx->n, 30000);
  read_t *r = calloc(1, sizeof *r);
  read_topic(ctx, r);
  if (r->records != ctx->n)
    fail_msg("%d records for %d events (%d written during the first scan): duplicates", r->records, ctx->n, during);
  free(r);
  obx_relay_stop(relay->group);
  ctx_cleanup(ctx);
  free(ctx);
}

/* A leader that died with claims: the next leader publishes the claimed event at once and
 * before the later events of its key, not when the claim expires (the chaos relay-kill
 * scenario saw its key's later events first). */
static void test_dead_leaders_claims_keep_key_order(void **state) {
  (void)state;
  ctx_t *ctx = calloc(1, sizeof *ctx);
  ctx_init(ctx, "deadclaim");
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_t *relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay: %s", err.msg);
  assert_true(obx_test_wait_for(leads_with_stream, relay, 20000, 20));
  insert_event(ctx, "K-0", 0);
  wait_published(ctx, 0, 1, 10000); /* a checkpoint: the next leader resumes the stream */
  obx_relay_stop(relay->group);
  /* 1: older than the checkpoint, claimed for a minute by a leader that is gone */
  insert_event(ctx, "K-1", obx_test_now_ms() - 3600 * 1000);
  bson_t *sel = BCON_NEW("_id", BCON_UTF8(ctx->ids[1]));
  bson_t *claim = BCON_NEW("$set", "{", "claimedBy", "dead-relay:1", "claimedUntil",
                           BCON_DATE_TIME(obx_test_now_ms() + 60000), "}");
  bson_error_t berr;
  if (!mongoc_collection_update_one(ctx->outbox, sel, claim, NULL, NULL, &berr)) fail_msg("claim: %s", berr.message);
  bson_destroy(claim);
  bson_destroy(sel);
  relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay: %s", err.msg);
  assert_true(obx_test_wait_for(leads_with_stream, relay, 20000, 20));
  insert_event(ctx, "K-1", 0); /* 2: the stream's, after 1 in its key */
  int64_t t0 = obx_test_now_ms();
  wait_published(ctx, 1, 3, 15000); /* well before the claim's minute */
  printf("the dead leader's claimed event and its key's next one published %lld ms after the write\n",
         (long long)(obx_test_now_ms() - t0));
  read_t *r = calloc(1, sizeof *r);
  read_topic(ctx, r); /* fails on a record out of its key's order */
  free(r);
  obx_relay_stop(relay->group);
  ctx_cleanup(ctx);
  free(ctx);
}

static void test_lease_lapse_in_first_scan_keeps_key_order(void **state) {
  (void)state;
  ctx_t *ctx = calloc(1, sizeof *ctx);
  ctx_init(ctx, "lapse");
  const char *small[] = {"outbox.batch_size", "20", "relay.max_inflight", "40", NULL};
  obx_err_t err = OBX_ERR_INIT;
  for (int i = 0; small[i]; i += 2)
    if (!obx_conf_set(&ctx->conf, small[i], small[i + 1], &err)) fail_msg("conf: %s", err.msg);
  char key[16], fp[512];
  for (int i = 0; i < 90; i++) { /* 30 consecutive events per key: a key spans two batches of 20 */
    snprintf(key, sizeof key, "K-%d", i / 30);
    insert_event(ctx, key, 0);
  }
  /* the leader's outbox finds: relay_keys_load's three, then the first batch's, blocked past the lease */
  snprintf(fp, sizeof fp,
           "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"skip\": 3, \"times\": 1}, \"data\": {\"appName\": "
           "\"outboxd\", \"failCommands\": [\"find\"], \"namespace\": \"%s.outbox\", \"blockConnection\": true, "
           "\"blockTimeMS\": 2600}}", ctx->db);
  obx_test_fail_point(g_client, fp);
  obx_relay_t *relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay: %s", err.msg);
  wait_published(ctx, 0, ctx->n, 20000); /* before: the claimed ones only after their claims' 30 s */
  int64_t fired = obx_test_fail_point(g_client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  if (fired != 1) fail_msg("the claim's find was blocked %lld times, want 1", (long long)fired);
  read_t *r = calloc(1, sizeof *r);
  read_topic(ctx, r); /* fails on a record out of its key's order */
  printf("stalled past the lease in the first scan: %d records for %d events, in key order\n", r->records, ctx->n);
  free(r);
  obx_relay_stop(relay->group);
  ctx_cleanup(ctx);
  free(ctx);
}

/* A stream open that takes a while (the reader's client connecting, a loaded server): events of
 * one key written while the aggregate is on its way are the full sweep's, published before the
 * key's later events that the stream carries. The sweep's bound was taken before the aggregate
 * was sent: those events were neither the sweep's nor the stream's, and a later sweep published
 * them after the key's later ones. */
static void test_slow_stream_open_keeps_key_order(void **state) {
  (void)state;
  ctx_t *ctx = calloc(1, sizeof *ctx);
  ctx_init(ctx, "slowopen");
  char fp[512];
  snprintf(fp, sizeof fp,
           "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"appName\": "
           "\"outboxd\", \"failCommands\": [\"aggregate\"], \"namespace\": \"%s.outbox\", \"blockConnection\": true, "
           "\"blockTimeMS\": 1500}}", ctx->db);
  obx_test_fail_point(g_client, fp);
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_t *relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay: %s", err.msg);
  /* one key's events every 20 ms until the stream is open: some before the aggregate is sent,
   * some while it is held */
  int64_t deadline = obx_test_now_ms() + 20000;
  while (!atomic_load(&relay->counters.stream_up) && obx_test_now_ms() < deadline && ctx->n < MAX_EVENTS - 5) {
    insert_event(ctx, "K-open", 0);
    usleep(20000); /* a writer's pace, not a wait for a condition */
  }
  if (!atomic_load(&relay->counters.stream_up)) fail_msg("the stream never opened");
  int during = ctx->n;
  for (int i = 0; i < 5; i++) insert_event(ctx, "K-open", 0); /* the stream's */
  int64_t fired = obx_test_fail_point(g_client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  if (fired != 1) fail_msg("the stream's aggregate was held %lld times, want 1", (long long)fired);
  if (during < 40) fail_msg("only %d events were written before the stream opened (want the open held 1.5 s)", during);
  wait_published(ctx, 0, ctx->n, 30000);
  read_t *r = calloc(1, sizeof *r);
  read_topic(ctx, r); /* fails on a record out of its key's order */
  printf("stream open held 1.5 s: %d events written meanwhile, %d records for %d events, in key order\n", during,
         r->records, ctx->n);
  free(r);
  obx_relay_stop(relay->group);
  ctx_cleanup(ctx);
  free(ctx);
}

/* How many of the relay's profiled operations `op` on outbox (with `must` in the filter, NULL:
 * any) there are, and how many of them lack partitionKey in their filter. Not counted: the
 * release of an earlier leadership's claims when the lease is taken (relay_claims_release,
 * filter {status, claimedUntil: {$exists}}), once per leadership and meant for every shard. */
static void profiled(ctx_t *ctx, const char *op, const char *must, int *n, int *without) {
  mongoc_collection_t *prof = mongoc_client_get_collection(g_client, ctx->db, "system.profile");
  char ns[128];
  snprintf(ns, sizeof ns, "%s.outbox", ctx->db);
  bson_t *filter = BCON_NEW("op", BCON_UTF8(op), "ns", BCON_UTF8(ns), "appName", "outboxd");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(prof, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it, f;
  *n = *without = 0;
  while (mongoc_cursor_next(cursor, &doc)) {
    if (!bson_iter_init_find(&it, doc, "filter") || !bson_iter_recurse(&it, &f)) continue;
    bson_iter_t probe = f;
    if (must && !bson_iter_find(&probe, must)) continue;
    probe = f;
    if (strcmp(op, "update") == 0 && bson_iter_find(&probe, "claimedUntil") && BSON_ITER_HOLDS_DOCUMENT(&probe)) {
      bson_iter_t ex;
      if (bson_iter_recurse(&probe, &ex) && bson_iter_find(&ex, "$exists")) continue;
    }
    (*n)++;
    probe = f;
    if (!bson_iter_find(&probe, "partitionKey")) (*without)++;
  }
  mongoc_cursor_destroy(cursor);
  bson_destroy(filter);
  mongoc_collection_destroy(prof);
}

static void test_writes_carry_the_shard_key(void **state) {
  (void)state;
  ctx_t *ctx = calloc(1, sizeof *ctx);
  ctx_init(ctx, "shardkey");
  bson_t *profile = BCON_NEW("profile", BCON_INT32(2));
  bson_error_t berr;
  if (!mongoc_client_command_simple(g_client, ctx->db, profile, NULL, NULL, &berr)) fail_msg("profile: %s", berr.message);
  bson_destroy(profile);
  char key[16];
  for (int i = 0; i < 30; i++) { /* 0-29 for the first full sweep */
    snprintf(key, sizeof key, "K-%d", i % 7);
    insert_event(ctx, key, 0);
  }
  obx_err_t err = OBX_ERR_INIT;
  obx_relay_t *relay = relay_group_bucket(obx_relay_start(&ctx->conf, NULL, &err), 0);
  if (!relay) fail_msg("relay: %s", err.msg);
  wait_published(ctx, 0, 30, 15000);
  for (int i = 0; i < 30; i++) { /* 30-59 through the stream */
    snprintf(key, sizeof key, "K-%d", i % 7);
    insert_event(ctx, key, 0);
  }
  wait_published(ctx, 30, 60, 15000);
  obx_relay_stop(relay->group);
  int n, without;
  profiled(ctx, "update", NULL, &n, &without);
  if (n < 2 || without) fail_msg("%d of the relay's %d outbox updates do not filter on partitionKey", without, n);
  profiled(ctx, "query", "claimedBy", &n, &without);
  if (n < 1 || without) fail_msg("%d of the relay's %d claim read-backs do not filter on partitionKey", without, n);
  ctx_cleanup(ctx);
  free(ctx);
}

static int group_setup(void **state) {
  (void)state;
  return obx_test_fixture_mongo_setup(&g_mongo, NULL, &g_client);
}

static int group_teardown(void **state) {
  (void)state;
  return obx_test_fixture_mongo_teardown(&g_mongo, g_client);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_sweep_leaves_newer_events_to_the_stream),
    cmocka_unit_test(test_first_scan_leaves_new_events_to_the_stream),
    cmocka_unit_test(test_dead_leaders_claims_keep_key_order),
    cmocka_unit_test(test_lease_lapse_in_first_scan_keeps_key_order),
    cmocka_unit_test(test_slow_stream_open_keeps_key_order),
    cmocka_unit_test(test_writes_carry_the_shard_key),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
