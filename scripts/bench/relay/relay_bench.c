/* relay_bench.c - load generator and raw baselines for scripts/bench/relay.sh
 *
 * NAME
 *   relay_bench - preload outbox events, read them back raw, produce them raw, measure latency
 *
 * SYNOPSIS
 *   relay_bench token    URI DB                  prints a resume token (JSON) of `outbox` now
 *   relay_bench checkpoint URI DB TOKEN_JSON [B] makes TOKEN the relay's checkpoint (the relay then
 *                                                resumes right after it); with B > 1 buckets, the
 *                                                checkpoint of each of them
 *   relay_bench preload  URI DB N KEYS [B]       inserts N PENDING events (batches of 1000); with
 *                                                B, each with its bucket among B (as
 *                                                obx_outbox_append writes it)
 *   relay_bench stream   URI DB N TOKEN_JSON     raw libmongoc change-stream reader: reads N
 *                                                changes after TOKEN (fullDocument updateLookup);
 *                                                prints seconds
 *   relay_bench produce  BROKERS TOPIC URI DB N  raw idempotent producer: sends the N outbox
 *                                                payloads (key = partitionKey) and waits for every
 *                                                report; prints seconds
 *   relay_bench wait     URI DB N TIMEOUT_S      waits until no event is PENDING, checks that N are
 *                                                PUBLISHED; prints seconds
 *   relay_bench shares   URI DB RELAYS B TIMEOUT_S  waits until RELAYS relays hold the leases of
 *                                                all B buckets, a fair share each; prints seconds
 *   relay_bench rate     URI DB N TIMEOUT_S      like wait, but times from the first PUBLISHED event
 *                                                (process start and lease left out); prints the
 *                                                events/s published from then on, and the seconds
 *                                                from the lease taken to that first event (the
 *                                                takeover: held keys loaded, claims released)
 *   relay_bench produce-steady BROKERS TOPIC RATE SECONDS KEYS  raw idempotent producer at a steady
 *                                                load (linger.ms=1, as the relay): RATE records/s
 *                                                of ~300 bytes over KEYS keys for SECONDS, after
 *                                                one warm-up record; prints p50 and p99 of
 *                                                produce -> delivery report in ms and the count
 *   relay_bench steady   URI DB RATE SECONDS KEYS after one warm-up event, inserts RATE events/s
 *                                                for SECONDS, waits for them to be PUBLISHED,
 *                                                prints p50 and p99 of publishedAt - occurredAt
 *                                                in ms and the number of events
 *
 * DESIGN: a bench tool, not part of outboxd: it writes the outbox shape of DESIGN.md §3 through
 * obx_event_to_outbox so the relay sees what the API writes. */
#include <librdkafka/rdkafka.h>
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_bucket.h"
#include "obx/obx_event.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "relay_bench: %s: %s\n", what, why);
  exit(1);
}

static void insert_batch(mongoc_collection_t *outbox, int n, int keys, int buckets, int *serial) {
  mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(outbox, NULL);
  for (int i = 0; i < n; i++) {
    obx_event_t ev;
    obx_err_t err = OBX_ERR_INIT;
    char agg[32];
    obx_event_init(&ev);
    ev.event_type = strdup("OrderConfirmed");
    ev.org_id = strdup("org-bench");
    ev.aggregate_type = strdup("Order");
    snprintf(agg, sizeof agg, "ORD-%06d", *serial % keys);
    ev.aggregate_id = strdup(agg);
    BSON_APPEND_INT32(&ev.payload, "seq", *serial);
    BSON_APPEND_UTF8(&ev.payload, "orderNumber", agg);
    BSON_APPEND_DOUBLE(&ev.payload, "totalAmount", 199.90);
    BSON_APPEND_UTF8(&ev.payload, "currency", "BRL");
    (*serial)++;
    bson_t doc = BSON_INITIALIZER;
    if (!obx_event_finalize(&ev, &err) || !obx_event_to_outbox(&ev, &doc, &err)) die("event", err.msg);
    if (buckets > 0) BSON_APPEND_INT32(&doc, OBX_BUCKET_FIELD, obx_bucket_of(agg, strlen(agg), buckets));
    mongoc_bulk_operation_insert(bulk, &doc);
    bson_destroy(&doc);
    obx_event_cleanup(&ev);
  }
  bson_error_t berr;
  if (!mongoc_bulk_operation_execute(bulk, NULL, &berr)) die("insert", berr.message);
  mongoc_bulk_operation_destroy(bulk);
}

static int64_t count(mongoc_collection_t *outbox, const char *status) {
  bson_t *filter = BCON_NEW("status", status);
  bson_error_t berr;
  int64_t n = mongoc_collection_count_documents(outbox, filter, NULL, NULL, NULL, &berr);
  bson_destroy(filter);
  if (n < 0) die("count", berr.message);
  return n;
}

/* Whether a relay holds a lease of this database (a fresh one: the bench's relay). */
static bool lease_taken(mongoc_collection_t *leases) {
  bson_t *filter = BCON_NEW("owner", "{", "$exists", BCON_BOOL(true), "}");
  bson_t *opts = BCON_NEW("limit", BCON_INT64(1));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(leases, filter, opts, NULL);
  const bson_t *doc;
  bson_error_t berr;
  bool taken = mongoc_cursor_next(cursor, &doc);
  if (mongoc_cursor_error(cursor, &berr)) die("find", berr.message);
  mongoc_cursor_destroy(cursor);
  bson_destroy(opts);
  bson_destroy(filter);
  return taken;
}

static bool any_with(mongoc_collection_t *outbox, const char *status) {
  bson_t *filter = BCON_NEW("status", status);
  bson_t *opts = BCON_NEW("limit", BCON_INT64(1), "projection", "{", "_id", BCON_INT32(1), "}");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(outbox, filter, opts, NULL);
  const bson_t *doc;
  bson_error_t berr;
  bool any = mongoc_cursor_next(cursor, &doc);
  if (mongoc_cursor_error(cursor, &berr)) die("find", berr.message);
  mongoc_cursor_destroy(cursor);
  bson_destroy(opts);
  bson_destroy(filter);
  return any;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
  (void)rk;
  if (msg->err) die("delivery", rd_kafka_err2str(msg->err));
  (*(int *)opaque)++;
}

/* produce-steady: each record's opaque is its send time; the report adds its latency. */
typedef struct {
  int64_t *lat;
  int n;
} steady_lat_t;

static void on_dr_lat(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
  (void)rk;
  if (msg->err) die("delivery", rd_kafka_err2str(msg->err));
  steady_lat_t *l = opaque;
  double sent = *(double *)msg->_private;
  free(msg->_private);
  l->lat[l->n++] = (int64_t)((now_s() - sent) * 1000.0);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: see the top of relay_bench.c\n");
    return 2;
  }
  mongoc_init();
  const char *cmd = argv[1];
  if (strcmp(cmd, "produce-steady") == 0 && argc >= 7) { /* no MongoDB */
    int rate = atoi(argv[4]), secs = atoi(argv[5]), keys = atoi(argv[6]), total = rate / 10 * secs * 10;
    char why[256];
    rd_kafka_conf_t *kconf = rd_kafka_conf_new();
    const char *props[][2] = {{"bootstrap.servers", argv[2]}, {"enable.idempotence", "true"}, {"acks", "all"},
                              {"partitioner", "murmur2_random"}, {"linger.ms", "1"}};
    for (size_t i = 0; i < 5; i++)
      if (rd_kafka_conf_set(kconf, props[i][0], props[i][1], why, sizeof why) != RD_KAFKA_CONF_OK) die(props[i][0], why);
    steady_lat_t l = {calloc((size_t)total + 1, sizeof(int64_t)), 0};
    rd_kafka_conf_set_dr_msg_cb(kconf, on_dr_lat);
    rd_kafka_conf_set_opaque(kconf, &l);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kconf, why, sizeof why);
    if (!rk) die("producer", why);
    char value[300];
    memset(value, 'x', sizeof value);
    double t0 = 0;
    for (int i = 0; i <= total; i++) { /* record 0: the warm-up, left out */
      char key[32];
      snprintf(key, sizeof key, "ORD-%06d", i % keys);
      double *sent = malloc(sizeof *sent);
      *sent = now_s();
      if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(argv[3]), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE(value, sizeof value),
                            RD_KAFKA_V_OPAQUE(sent), RD_KAFKA_V_END) != RD_KAFKA_RESP_ERR_NO_ERROR)
        die("produce", "refused");
      if (i == 0) {
        while (l.n < 1) rd_kafka_poll(rk, 10);
        l.n = 0;
        continue;
      }
      /* rate/10 records per 100 ms, as `steady` inserts them */
      if (i == 1) t0 = now_s();
      if (i % (rate / 10) == 0) {
        double next = t0 + (double)(i / (rate / 10)) * 0.1;
        while (now_s() < next) rd_kafka_poll(rk, 1);
      }
      rd_kafka_poll(rk, 0);
    }
    while (l.n < total) rd_kafka_poll(rk, 10);
    qsort(l.lat, (size_t)l.n, sizeof *l.lat, cmp_i64);
    printf("%lld %lld %d\n", (long long)l.lat[l.n / 2], (long long)l.lat[(l.n * 99) / 100], l.n);
    free(l.lat);
    rd_kafka_destroy(rk);
    return 0;
  }
  bool produce = strcmp(cmd, "produce") == 0;
  const char *uri = argv[produce ? 4 : 2], *db = argv[produce ? 5 : 3];
  mongoc_client_t *client = mongoc_client_new(uri);
  if (!client) die("uri", uri);
  mongoc_collection_t *outbox = mongoc_client_get_collection(client, db, "outbox");

  if (strcmp(cmd, "token") == 0) {
    mongoc_change_stream_t *cs = mongoc_collection_watch(outbox, &(bson_t)BSON_INITIALIZER, NULL);
    const bson_t *doc;
    bson_error_t berr;
    mongoc_change_stream_next(cs, &doc);
    if (mongoc_change_stream_error_document(cs, &berr, NULL)) die("watch", berr.message);
    const bson_t *tok = mongoc_change_stream_get_resume_token(cs);
    if (!tok) die("watch", "no resume token");
    char *json = bson_as_relaxed_extended_json(tok, NULL);
    printf("%s\n", json);
    bson_free(json);
    mongoc_change_stream_destroy(cs);
  } else if (strcmp(cmd, "checkpoint") == 0 && argc >= 5) {
    bson_error_t berr;
    bson_t *tok = bson_new_from_json((const uint8_t *)argv[4], -1, &berr);
    if (!tok) die("token", berr.message);
    mongoc_collection_t *ckpt = mongoc_client_get_collection(client, db, "relay_checkpoints");
    int buckets = argc >= 6 ? atoi(argv[5]) : 1;
    for (int b = 0; b < (buckets > 1 ? buckets : 1); b++) {
      char id[48] = "outbox"; /* relay_checkpoints._id of bucket b (src/relay/relay_int.h) */
      if (buckets > 1) snprintf(id, sizeof id, "outbox.%d/%d", b, buckets);
      bson_t *selector = BCON_NEW("_id", BCON_UTF8(id));
      bson_t *update = BCON_NEW("$set", "{", "resumeToken", BCON_DOCUMENT(tok), "epoch", BCON_INT64(0), "}");
      bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
      if (!mongoc_collection_update_one(ckpt, selector, update, opts, NULL, &berr)) die("checkpoint", berr.message);
      bson_destroy(opts);
      bson_destroy(update);
      bson_destroy(selector);
    }
    mongoc_collection_destroy(ckpt);
    bson_destroy(tok);
  } else if (strcmp(cmd, "preload") == 0 && argc >= 6) {
    int n = atoi(argv[4]), keys = atoi(argv[5]), buckets = argc >= 7 ? atoi(argv[6]) : 0, serial = 0;
    for (int done = 0; done < n; done += 1000)
      insert_batch(outbox, n - done < 1000 ? n - done : 1000, keys, buckets, &serial);
  } else if (strcmp(cmd, "stream") == 0 && argc >= 6) {
    int n = atoi(argv[4]), got = 0;
    bson_error_t berr;
    bson_t *tok = bson_new_from_json((const uint8_t *)argv[5], -1, &berr);
    if (!tok) die("token", berr.message);
    bson_t *opts = BCON_NEW("fullDocument", "updateLookup", "resumeAfter", BCON_DOCUMENT(tok), "maxAwaitTimeMS", BCON_INT64(100),
                            "batchSize", BCON_INT32(1000));
    double t0 = now_s();
    mongoc_change_stream_t *cs = mongoc_collection_watch(outbox, &(bson_t)BSON_INITIALIZER, opts);
    const bson_t *doc;
    while (got < n) {
      if (mongoc_change_stream_next(cs, &doc)) got++;
      else if (mongoc_change_stream_error_document(cs, &berr, NULL)) die("stream", berr.message);
    }
    printf("%.3f\n", now_s() - t0);
    mongoc_change_stream_destroy(cs);
    bson_destroy(opts);
    bson_destroy(tok);
  } else if (produce && argc >= 7) {
    int n = atoi(argv[6]), acked = 0, sent = 0;
    char why[256];
    rd_kafka_conf_t *kconf = rd_kafka_conf_new();
    const char *props[][2] = {{"bootstrap.servers", argv[2]}, {"enable.idempotence", "true"}, {"acks", "all"},
                              {"partitioner", "murmur2_random"}};
    for (size_t i = 0; i < 4; i++)
      if (rd_kafka_conf_set(kconf, props[i][0], props[i][1], why, sizeof why) != RD_KAFKA_CONF_OK) die(props[i][0], why);
    rd_kafka_conf_set_dr_msg_cb(kconf, on_dr);
    rd_kafka_conf_set_opaque(kconf, &acked);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kconf, why, sizeof why);
    if (!rk) die("producer", why);
    /* the records are built before the clock starts: only producing is measured */
    char **keys = calloc((size_t)n, sizeof *keys), **values = calloc((size_t)n, sizeof *values);
    mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(outbox, &(bson_t)BSON_INITIALIZER, NULL, NULL);
    const bson_t *doc;
    int loaded = 0;
    while (loaded < n && mongoc_cursor_next(cursor, &doc)) {
      bson_iter_t it;
      if (bson_iter_init_find(&it, doc, "partitionKey")) keys[loaded] = strdup(bson_iter_utf8(&it, NULL));
      if (bson_iter_init_find(&it, doc, "payload") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
        uint32_t len;
        const uint8_t *data;
        bson_t payload;
        bson_iter_document(&it, &len, &data);
        bson_init_static(&payload, data, len);
        values[loaded] = bson_as_relaxed_extended_json(&payload, NULL);
      }
      loaded++;
    }
    mongoc_cursor_destroy(cursor);
    /* warm-up: one record acknowledged first, so the connection and the producer id are not
     * in the figure (as the relay's are not: its timing starts at its first PUBLISHED event) */
    if (loaded > 0) {
      if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(argv[3]), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_KEY(keys[0], strlen(keys[0])), RD_KAFKA_V_VALUE(values[0], strlen(values[0])),
                            RD_KAFKA_V_END) != RD_KAFKA_RESP_ERR_NO_ERROR)
        die("produce", "warm-up record refused");
      while (acked < 1) rd_kafka_poll(rk, 10);
      acked = 0;
    }
    double t0 = now_s();
    for (sent = 0; sent < loaded; sent++) {
      while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(argv[3]), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                               RD_KAFKA_V_KEY(keys[sent], strlen(keys[sent])),
                               RD_KAFKA_V_VALUE(values[sent], strlen(values[sent])), RD_KAFKA_V_END) ==
             RD_KAFKA_RESP_ERR__QUEUE_FULL)
        rd_kafka_poll(rk, 10);
      rd_kafka_poll(rk, 0);
    }
    while (acked < loaded) rd_kafka_poll(rk, 10);
    printf("%.6f\n", now_s() - t0);
    for (int i = 0; i < loaded; i++) {
      free(keys[i]);
      bson_free(values[i]);
    }
    free(keys);
    free(values);
    rd_kafka_destroy(rk);
  } else if (strcmp(cmd, "wait") == 0 && argc >= 6) {
    int64_t n = atoll(argv[4]);
    double t0 = now_s(), limit = atof(argv[5]);
    /* one indexed look for a PENDING event per round: counting a million would be work for the
     * server that the relay competes with */
    while (any_with(outbox, "PENDING")) {
      if (now_s() - t0 > limit) die("wait", "timed out");
      struct timespec ts = {0, 50 * 1000000L};
      nanosleep(&ts, NULL);
    }
    double t = now_s() - t0;
    if (count(outbox, "PUBLISHED") < n) die("wait", "no event left PENDING, but fewer than N are PUBLISHED");
    printf("%.3f\n", t);
  } else if (strcmp(cmd, "shares") == 0 && argc >= 7) {
    /* every bucket's lease live, held by RELAYS owners, none holding more than its fair share */
    int relays = atoi(argv[4]), buckets = atoi(argv[5]), share = (buckets + relays - 1) / relays;
    double start = now_s(), limit = atof(argv[6]);
    mongoc_collection_t *leases = mongoc_client_get_collection(client, db, "leases");
    for (;;) {
      if (now_s() - start > limit) die("shares", "the relays did not share the buckets in time");
      char owners[64][128];
      int held[64] = {0}, nowners = 0, live = 0;
      bson_t *filter = BCON_NEW("expiresAt", "{", "$gt", BCON_DATE_TIME((int64_t)time(NULL) * 1000), "}");
      mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(leases, filter, NULL, NULL);
      const bson_t *doc;
      bson_iter_t it;
      while (mongoc_cursor_next(cursor, &doc)) {
        if (!bson_iter_init_find(&it, doc, "owner") || !BSON_ITER_HOLDS_UTF8(&it)) continue;
        const char *owner = bson_iter_utf8(&it, NULL);
        int o = 0;
        while (o < nowners && strcmp(owners[o], owner)) o++;
        if (o == nowners && nowners < 64) snprintf(owners[nowners++], sizeof owners[0], "%s", owner);
        if (o < 64) held[o]++;
        live++;
      }
      mongoc_cursor_destroy(cursor);
      bson_destroy(filter);
      bool fair = live == (buckets > 1 ? buckets : 1) && nowners == (relays < buckets ? relays : buckets);
      for (int o = 0; o < nowners; o++) fair = fair && held[o] <= share;
      if (fair) break;
      struct timespec ts = {0, 50 * 1000000L};
      nanosleep(&ts, NULL);
    }
    printf("%.3f\n", now_s() - start);
    mongoc_collection_destroy(leases);
  } else if (strcmp(cmd, "rate") == 0 && argc >= 6) {
    int64_t n = atoll(argv[4]);
    double limit = atof(argv[5]), start = now_s(), t0 = 0, t_lease = 0;
    mongoc_collection_t *leases = mongoc_client_get_collection(client, db, "leases");
    /* indexed looks only while timing (a count is an aggregate over the collection) */
    while (t0 == 0 || any_with(outbox, "PENDING")) {
      if (now_s() - start > limit) die("rate", "timed out");
      if (t_lease == 0 && lease_taken(leases)) t_lease = now_s();
      if (t0 == 0 && any_with(outbox, "PUBLISHED")) t0 = now_s();
      struct timespec ts = {0, (t0 == 0 ? 5 : 50) * 1000000L};
      nanosleep(&ts, NULL);
    }
    double t = now_s() - t0;
    if (count(outbox, "PUBLISHED") < n) die("rate", "no event left PENDING, but fewer than N are PUBLISHED");
    if (t_lease == 0 || t_lease > t0) t_lease = t0; /* taken between two looks */
    printf("%.1f %.3f\n", (double)n / t, t0 - t_lease);
    mongoc_collection_destroy(leases);
  } else if (strcmp(cmd, "steady") == 0 && argc >= 7) {
    int rate = atoi(argv[4]), secs = atoi(argv[5]), keys = atoi(argv[6]), serial = 0;
    int64_t before = count(outbox, "PUBLISHED") + count(outbox, "PENDING");
    /* warm-up: one event (seq 0) through the relay first, so the producer's connection and
     * idempotence set-up are not in the figures */
    insert_batch(outbox, 1, keys, 0, &serial);
    while (count(outbox, "PUBLISHED") < before + 1) {
      struct timespec ts = {0, 20 * 1000000L};
      nanosleep(&ts, NULL);
    }
    double t0 = now_s();
    for (int tick = 0; tick < secs * 10; tick++) { /* rate/10 events every 100 ms, one per insert */
      for (int i = 0; i < rate / 10; i++) insert_batch(outbox, 1, keys, 0, &serial);
      double next = t0 + (tick + 1) * 0.1, wait = next - now_s();
      if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
      }
    }
    while (count(outbox, "PUBLISHED") < before + serial) {
      struct timespec ts = {0, 50 * 1000000L};
      nanosleep(&ts, NULL);
    }
    bson_t *filter = BCON_NEW("orgId", "org-bench", "status", "PUBLISHED", "payload.seq", "{", "$gte", BCON_INT32(1), "}");
    mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(outbox, filter, NULL, NULL);
    int64_t *lat = calloc((size_t)(before + serial + 1), sizeof *lat);
    int nlat = 0;
    const bson_t *doc;
    while (mongoc_cursor_next(cursor, &doc)) {
      bson_iter_t a, b;
      if (bson_iter_init_find(&a, doc, "occurredAt") && bson_iter_init_find(&b, doc, "publishedAt"))
        lat[nlat++] = bson_iter_date_time(&b) - bson_iter_date_time(&a);
    }
    qsort(lat, (size_t)nlat, sizeof *lat, cmp_i64);
    printf("%lld %lld %d\n", (long long)lat[nlat / 2], (long long)lat[(nlat * 99) / 100], nlat);
    free(lat);
    mongoc_cursor_destroy(cursor);
    bson_destroy(filter);
  } else {
    fprintf(stderr, "relay_bench: bad command or arguments\n");
    return 2;
  }
  mongoc_collection_destroy(outbox);
  mongoc_client_destroy(client);
  mongoc_cleanup();
  return 0;
}
