/* ops_drain.c - the worker's drain of the parking-lot queue into dead_letters, and the
 * operators' gauges
 *
 * DESIGN: see obx_ops.h. One thread per worker process owns a consumer of P.dlq (its own AMQP
 * connection, heartbeats) and a ladder publisher used only for queue depths. Each message is
 * stored (obx_ops_dl_store, idempotent on its dedupKey) and acked only after the write; while
 * MongoDB refuses the write the thread keeps the message and tries again with backoff (100 ms
 * doubling to 5 s), so an outage loses nothing and redelivers nothing twice into the store.
 * Several worker processes drain the same queue as competing consumers. A message whose headers
 * hold an empty name (put there by another producer) is stored without that header, class
 * malformed (drop_nameless_headers). Every 5 s the thread
 * sets the gauges
 *   outboxd_dead_letters, outboxd_dead_letters_oldest_age_seconds   (state dead or redriving)
 *   outboxd_queue_depth{queue}                                      (P.dlq, P.work, each tier)
 *   outboxd_parked_keys_oldest_age_seconds
 * Never runs a pipeline, never publishes. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_event.h"
#include "obx/obx_amqp.h"
#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "obx/obx_schema.h"
#include "ops/ops_int.h"

#define DRAIN_WAIT_MS 500
#define DRAIN_GAUGE_MS 5000
#define DRAIN_BACKOFF_MIN_MS 100
#define DRAIN_BACKOFF_MAX_MS 5000

struct obx_ops_drain {
  const obx_conf_t *conf;
  obx_mongo_t *mongo;
  obx_ladder_t *ladder;            /* queue depths */
  obx_ladder_consumer_t *consumer; /* P.dlq */
  pthread_t thread;
  atomic_bool stop;
  bool ready; /* dead_letters and its indexes exist (obx_schema.h) */
  char last_error[256]; /* the consumer's last failure, logged when it changes */
};

static struct {
  obx_gauge_t *count, *oldest, *depth, *parked_oldest;
  obx_counter_t *stored;
} metrics;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_register(void) {
  metrics.count = obx_metrics_gauge("outboxd_dead_letters", "Dead letters waiting for an operator (dead or being redriven)", NULL);
  metrics.oldest = obx_metrics_gauge("outboxd_dead_letters_oldest_age_seconds",
                                     "Age of the oldest waiting dead letter's first failure (0: none)", NULL);
  metrics.depth = obx_metrics_gauge("outboxd_queue_depth", "Messages in a RabbitMQ queue of the ladder", "queue");
  metrics.parked_oldest = obx_metrics_gauge("outboxd_parked_keys_oldest_age_seconds",
                                            "Age of the oldest parked key (0: none)", NULL);
  metrics.stored = obx_metrics_counter("outboxd_dead_letters_stored_total",
                                       "Parking-lot messages written to dead_letters", NULL);
}

/* Sleeps up to ms unless stopping; false when stopping. */
static bool nap(obx_ops_drain_t *d, int64_t ms) {
  for (int64_t end = obx_time_mono_ms() + ms; !atomic_load(&d->stop);) {
    int64_t left = end - obx_time_mono_ms();
    if (left <= 0) return true;
    struct timespec ts = {0, (left > 50 ? 50 : left) * 1000000};
    nanosleep(&ts, NULL);
  }
  return false;
}

static void set_depth(obx_ops_drain_t *d, const char *queue) {
  uint32_t n = 0;
  obx_err_t err = OBX_ERR_INIT;
  if (obx_ladder_queue_depth(d->ladder, queue, &n, &err)) obx_gauge_set(metrics.depth, (double)n, queue);
}

/* The store's gauges, once dead_letters and parked_keys have their indexes (before that their
 * queries would scan a collection being indexed: test_devmongo_hotpaths saw it). */
static void refresh_gauges(obx_ops_drain_t *d) {
  obx_err_t err = OBX_ERR_INIT;
  int64_t count = 0, oldest = 0, now = obx_time_now_ms();
  if (!d->ready && !(d->ready = obx_schema_ensure(d->mongo, d->conf, OBX_SCHEMA_WORKER, &err))) return;
  mongoc_client_t *client = obx_mongo_pop(d->mongo);
  if (obx_ops_dl_stats(d->mongo, client, NULL, &count, &oldest, &err)) {
    obx_gauge_set(metrics.count, (double)count);
    obx_gauge_set(metrics.oldest, oldest ? (double)(now - oldest) / 1000.0 : 0.0);
  }
  bson_t *filter = BCON_NEW("_id.consumer", BCON_UTF8(d->conf->worker_group));
  bson_t *sort = BCON_NEW("since", BCON_INT32(1));
  bson_t key = BSON_INITIALIZER;
  bool found = false;
  mongoc_collection_t *c = obx_mongo_collection(d->mongo, client, "parked_keys");
  if (obx_mongo_find_one(c, filter, sort, NULL, &key, &found, &err)) {
    bson_iter_t it;
    int64_t since = found && bson_iter_init_find(&it, &key, "since") && BSON_ITER_HOLDS_DATE_TIME(&it)
                      ? bson_iter_date_time(&it) : 0;
    obx_gauge_set(metrics.parked_oldest, since ? (double)(now - since) / 1000.0 : 0.0);
  }
  mongoc_collection_destroy(c);
  bson_destroy(&key);
  bson_destroy(sort);
  bson_destroy(filter);
  obx_mongo_push(d->mongo, client);
  if (!obx_ladder_connected(d->ladder)) return; /* the consumer reports the broker's absence */
  set_depth(d, obx_ladder_dlq_queue(d->ladder));
  set_depth(d, obx_ladder_work_queue(d->ladder));
  for (int i = 0; i < obx_ladder_ntiers(d->ladder); i++) set_depth(d, obx_ladder_tier_queue(d->ladder, i));
}

/* A message put in the DLQ by another producer (or an older outboxd) whose AMQP headers hold an
 * empty name: the store cannot keep that header (libmongoc refuses an empty field name), so it is
 * left out and the dead letter is class malformed, its reason naming the header's value and
 * keeping what the message said of itself. The rest is stored as it came. */
static void drop_nameless_headers(obx_envelope_t *msg) {
  char notes[600] = "";
  size_t pos = 0;
  int kept = 0, dropped = 0;
  for (int i = 0; i < msg->nheaders; i++) {
    obx_envelope_header_t *h = &msg->headers[i];
    if (h->name[0]) {
      msg->headers[kept++] = *h;
      continue;
    }
    if (pos < sizeof notes)
      pos += (size_t)(h->value_len <= 64 && bson_utf8_validate(h->value, h->value_len, false)
                        ? snprintf(notes + pos, sizeof notes - pos, "%s\"%s\"", dropped ? ", " : "", h->value)
                        : snprintf(notes + pos, sizeof notes - pos, "%sa value of %zu bytes", dropped ? ", " : "",
                                   h->value_len));
    dropped++;
    free(h->name);
    free(h->value);
  }
  msg->nheaders = kept;
  if (!dropped) return;
  char *reason = bson_strdup_printf("the message's AMQP headers hold %d with an empty name (%s), which the store "
                                    "cannot keep: left out; its class was %s, its reason: %s",
                                    dropped, notes, msg->failure_class ? msg->failure_class : "none",
                                    msg->reason && *msg->reason ? msg->reason : "none");
  free(msg->reason);
  msg->reason = strdup(reason);
  bson_free(reason);
  free(msg->failure_class);
  msg->failure_class = strdup("malformed");
}

/* Stores msg until it is written (then acks it) or the drain stops (the broker keeps it). */
static void drain_one(obx_ops_drain_t *d, obx_envelope_t *msg) {
  int64_t backoff = DRAIN_BACKOFF_MIN_MS;
  drop_nameless_headers(msg);
  for (;;) {
    obx_health_stamp("storing a dead letter");
    obx_err_t err = OBX_ERR_INIT;
    bool stored = false;
    if ((d->ready || (d->ready = obx_schema_ensure(d->mongo, d->conf, OBX_SCHEMA_WORKER, &err))) &&
        obx_ops_dl_store(d->mongo, msg, &stored, &err)) {
      if (stored) obx_counter_inc(metrics.stored);
      obx_log_event(OBX_LOG_INFO, msg->message_id, NULL, "dead letter %s (%s)", stored ? "stored" : "already stored",
                    msg->reason ? msg->reason : "no reason");
      if (!obx_ladder_consumer_ack(d->consumer, msg, &err)) obx_warn("DLQ ack failed (redelivered later): %s", err.msg);
      return;
    }
    obx_warn("dead letter %s not stored yet (%s); retrying in %lld ms", msg->message_id ? msg->message_id : "-",
             err.msg, (long long)backoff);
    if (!nap(d, backoff)) return;
    backoff = backoff * 2 > DRAIN_BACKOFF_MAX_MS ? DRAIN_BACKOFF_MAX_MS : backoff * 2;
  }
}

static void *drain_main(void *p) {
  obx_ops_drain_t *d = p;
  pthread_setname_np(pthread_self(), "obx-dlq-drain");
  int64_t next_gauges = 0;
  obx_health_register("worker", "dlq drain"); /* /healthz: the loop goes round (obx_health.h) */
  while (!atomic_load(&d->stop)) {
    obx_health_stamp("receiving dead letters");
    if (obx_time_mono_ms() >= next_gauges) {
      obx_ladder_tick(d->ladder);
      refresh_gauges(d);
      next_gauges = obx_time_mono_ms() + DRAIN_GAUGE_MS;
    }
    obx_envelope_t msg;
    obx_envelope_init(&msg);
    bool got = false;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ladder_consumer_next(d->consumer, &msg, DRAIN_WAIT_MS, &got, &err)) {
      if (strcmp(err.msg, d->last_error) != 0) obx_warn("DLQ drain: %s", err.msg);
      snprintf(d->last_error, sizeof d->last_error, "%s", err.msg);
      obx_envelope_cleanup(&msg);
      nap(d, DRAIN_WAIT_MS); /* the consumer's own backoff bounds the reconnects */
      continue;
    }
    d->last_error[0] = '\0';
    if (got) drain_one(d, &msg);
    obx_envelope_cleanup(&msg);
  }
  obx_health_unregister();
  return NULL;
}

obx_ops_drain_t *obx_ops_drain_start(const obx_conf_t *conf, obx_err_t *err) {
  if (!conf->worker_dlq_drain) return NULL;
  pthread_once(&metrics_once, metrics_register);
  obx_ops_drain_t *d = calloc(1, sizeof *d);
  d->conf = conf;
  obx_ladder_opts_t lo = {.url = conf->amqp_url, .prefix = conf->worker_queue_prefix, .tiers_ms = conf->retry_ladder.ms,
                          .ntiers = conf->retry_ladder.n};
  obx_amqp_settings_from_conf(&lo.amqp, conf);
  if (!(d->mongo = obx_mongo_new(conf, err)) || !(d->ladder = obx_ladder_new(&lo, err)) ||
      !(d->consumer = obx_ladder_dlq_consumer_new(&lo, 16, err))) {
    obx_ops_drain_stop(d);
    return NULL;
  }
  if (pthread_create(&d->thread, NULL, drain_main, d) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the DLQ drain thread");
    d->thread = 0;
    obx_ops_drain_stop(d);
    return NULL;
  }
  return d;
}

void obx_ops_drain_stop(obx_ops_drain_t *d) {
  if (!d) return;
  atomic_store(&d->stop, true);
  if (d->thread) pthread_join(d->thread, NULL);
  obx_ladder_consumer_destroy(d->consumer);
  obx_ladder_destroy(d->ladder);
  obx_mongo_destroy(d->mongo);
  free(d);
}
