/* kafka.c - the worker's Kafka source: the consumer group, its offsets and its held partitions
 *
 * DESIGN: owns the consumer (one poll thread, kafka_main), the per-partition offset bookkeeping
 * (offsets.c), the intake (each assigned partition read from its own librdkafka fetch queue, held
 * while its key or the worker is full) and the rebalances. A record becomes an envelope queued
 * behind its key (jobs.c); an offset is committed only when every earlier offset of its partition
 * has its outcome in the inbox (contiguous commits). The poll thread never blocks and never
 * pauses a partition: a held one is not read, and what librdkafka prefetched for it waits in its
 * queue (bounded per partition by queued.max.messages.kbytes / queued.min.messages). Never runs
 * or records an event (lifecycle.c does). Reads kafka.*, worker.group, worker.instance_id. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "worker_int.h"

#define KEY_QUEUE_CAP 64  /* events of one key queued before its partition is held */
#define REVOKE_DRAIN_MS 30000
#define COMMIT_EVERY_MS 50 /* asynchronous commits at most this often */

static void kafka_commit(obx_worker_t *w, const int32_t *parts, const int64_t *next, int n, bool sync) {
  if (n == 0) return;
  rd_kafka_topic_partition_list_t *offsets = rd_kafka_topic_partition_list_new(n);
  for (int i = 0; i < n; i++) rd_kafka_topic_partition_list_add(offsets, w->conf->kafka_topic, parts[i])->offset = next[i];
  rd_kafka_resp_err_t rerr = rd_kafka_commit(w->rk, offsets, sync ? 0 : 1);
  if (rerr) obx_warn("offset commit failed: %s", rd_kafka_err2str(rerr));
  rd_kafka_topic_partition_list_destroy(offsets);
}

/* Takes the runners' completions and commits the contiguous finished offsets: at once when
 * sync, else at most every COMMIT_EVERY_MS (the poll thread turns once per completion while a
 * partition is held; a commit request per turn would cost the broker and this process more than
 * the events). */
static void kafka_commit_done(obx_worker_t *w, bool sync) {
  pthread_mutex_lock(&w->done_mu);
  job_t *list = w->kafka_done;
  w->kafka_done = NULL;
  pthread_mutex_unlock(&w->done_mu);
  for (job_t *job = list, *next; job; job = next) {
    next = job->next;
    if (job->generation == w->generation && job->outcome != WORKER_INFRA)
      worker_offsets_done(&w->offsets, job->partition, job->offset);
    w->kafka_jobs--;
    worker_job_free(job);
  }
  int64_t now = obx_time_now_ms();
  if (!sync && now - w->last_commit_ms < COMMIT_EVERY_MS) return;
  w->last_commit_ms = now;
  int max = w->offsets.n ? w->offsets.n : 1;
  int32_t parts[max];
  int64_t next[max];
  int n = worker_offsets_advance(&w->offsets, parts, next, max);
  kafka_commit(w, parts, next, n, sync);
}

/* ---- intake: held partitions -----------------------------------------------------------------
 * Each assigned partition is read from its own fetch queue (rd_kafka_queue_get_partition,
 * unforwarded before rd_kafka_assign, so no record of it reaches the consumer queue), one
 * record at a time and in turns. After a push that fills the record's key (KEY_QUEUE_CAP) its
 * partition is held; while the worker holds WORKER_MAX_INFLIGHT events, every partition with a
 * record waiting is held. A held partition is simply not read: what librdkafka prefetched for it
 * stays in its queue (fetching stops once the queue holds queued.max.messages.kbytes or
 * queued.min.messages), nothing is dropped or fetched again, and reading goes on the moment the
 * key is half drained and the worker under the bound (the runners' completions wake the thread,
 * worker_kafka_wake; reading a held partition again costs nothing, so each free slot is filled).
 * Never rd_kafka_pause_partitions: a pause drops the prefetched records and the resume fetches
 * them again (about 1 s against kafka-mockd, about fetch.wait.max.ms against a broker). Polls,
 * rebalances and commits go on meanwhile. */

#define READ_TURN 64 /* records read from one partition before the next one's turn */

static void intake_hold(obx_worker_t *w, intake_part_t *p, intake_hold_t why, const char *key, size_t len, int depth,
                        int inflight) {
  p->hold = why;
  if (why == INTAKE_HELD_KEY) {
    p->key = malloc(len + 1);
    assert(p->key);
    memcpy(p->key, key, len);
    p->key[len] = '\0';
    p->len = len;
    obx_debug("partition %" PRId32 " held: key %.64s holds %d events", p->partition, p->key, depth);
  } else {
    obx_debug("partition %" PRId32 " held: %d events in flight (bound %d)", p->partition, inflight, w->max_inflight);
  }
  w->nheld++;
  worker_set_paused_gauge(w);
}

/* Reads the held partitions again whose key is half drained, once the worker is under the bound. */
static void intake_release(obx_worker_t *w) {
  if (!w->nheld && w->intake_inflight < w->max_inflight) return;
  int inflight = w->intake_inflight = worker_sched_inflight(w->sched);
  if (inflight >= w->max_inflight) return;
  for (int i = 0; i < w->nparts; i++) {
    intake_part_t *p = &w->parts[i];
    if (p->hold == INTAKE_READING) continue;
    if (p->hold == INTAKE_HELD_KEY && worker_sched_key_depth(w->sched, p->key, p->len) > KEY_QUEUE_CAP / 2) continue;
    obx_debug("partition %" PRId32 " read again", p->partition);
    free(p->key);
    p->key = NULL;
    p->hold = INTAKE_READING;
    w->nheld--;
    worker_set_paused_gauge(w);
  }
}

/* Forgets the assigned partitions (a rebalance or the close): their queues' IO events off, the
 * references dropped. What a held partition had prefetched was never read, so never committed;
 * librdkafka drops it when the partition's fetch stops. */
static void intake_parts_clear(obx_worker_t *w) {
  for (int i = 0; i < w->nparts; i++) {
    rd_kafka_queue_io_event_enable(w->parts[i].queue, -1, NULL, 0);
    rd_kafka_queue_destroy(w->parts[i].queue);
    free(w->parts[i].key);
  }
  free(w->parts);
  w->parts = NULL;
  w->nparts = w->nheld = 0;
  worker_set_paused_gauge(w);
}

/* Takes the assigned partitions' fetch queues off the consumer queue; before rd_kafka_assign, so
 * that no record of theirs is ever forwarded there (the order of a partition would then split
 * between two queues). */
static void intake_parts_take(obx_worker_t *w, const rd_kafka_topic_partition_list_t *parts) {
  w->parts = calloc((size_t)(parts->cnt ? parts->cnt : 1), sizeof *w->parts);
  assert(w->parts);
  for (int i = 0; i < parts->cnt; i++) {
    rd_kafka_queue_t *q = rd_kafka_queue_get_partition(w->rk, parts->elems[i].topic, parts->elems[i].partition);
    assert(q); /* a consumer's assigned partition */
    rd_kafka_queue_forward(q, NULL);
    rd_kafka_queue_io_event_enable(q, w->wake[1], "p", 1);
    w->parts[w->nparts++] = (intake_part_t){.partition = parts->elems[i].partition, .queue = q};
  }
}

void worker_kafka_wake(obx_worker_t *w) {
  if (atomic_load(&w->wake_armed) && atomic_exchange(&w->wake_armed, false)) {
    ssize_t r = write(w->wake[1], "c", 1); /* a full pipe already wakes it */
    (void)r;
  }
}

/* Waits up to ms for a record, a consumer-queue event or (when armed) a completion. */
static void intake_wait(obx_worker_t *w, int ms) {
  struct pollfd pfd = {.fd = w->wake[0], .events = POLLIN};
  if (poll(&pfd, 1, ms) > 0) {
    char buf[256];
    while (read(w->wake[0], buf, sizeof buf) > 0) {
    }
  }
  atomic_store(&w->wake_armed, false);
}

static bool is_kafka_job(void *ctx, const job_t *job) {
  (void)ctx;
  return job->source == WORKER_SOURCE_KAFKA;
}

static void drop_kafka_job(void *ctx, job_t *job) {
  obx_worker_t *w = ctx;
  worker_state_move(job->msg.message_id, worker_job_state(job), WORKER_INFRA); /* the next owner reads it */
  w->kafka_jobs--;
  worker_job_free(job);
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t rerr, rd_kafka_topic_partition_list_t *parts, void *opaque) {
  obx_worker_t *w = opaque;
  if (rerr == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
    /* Events not started are dropped (not committed: the next owner reads them); the running
     * ones may finish and be committed, so the next owner does not run them too. */
    int dropped = w->sched ? worker_sched_drop(w->sched, is_kafka_job, drop_kafka_job, w) : 0;
    int64_t deadline = obx_time_now_ms() + REVOKE_DRAIN_MS;
    for (;;) {
      kafka_commit_done(w, true);
      if (w->kafka_jobs <= 0 || atomic_load(&w->stop) || obx_time_now_ms() > deadline) break;
      struct timespec ts = {0, 20 * 1000000L};
      nanosleep(&ts, NULL);
    }
    worker_offsets_clear(&w->offsets);
    intake_parts_clear(w);
    w->generation++;
    rd_kafka_assign(rk, NULL);
    atomic_fetch_add(&w->stats.revocations, 1);
    obx_info("partitions revoked (%d; %d queued events left to the next owner, %d still running)", parts->cnt,
             dropped, w->kafka_jobs);
  } else if (rerr == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    worker_offsets_clear(&w->offsets);
    intake_parts_clear(w);
    intake_parts_take(w, parts);
    w->generation++;
    rd_kafka_assign(rk, parts);
    atomic_store(&w->assigned, parts->cnt);
    obx_info("partitions assigned (%d)", parts->cnt);
  } else {
    intake_parts_clear(w);
    rd_kafka_assign(rk, NULL);
  }
}

/* librdkafka's statistics report (kafka.statistics.interval.ms; served by the poll thread): the
 * records fetched for the topic's partitions (rxmsgs) and those not read yet (fetchq_cnt). */
static int stats_cb(rd_kafka_t *rk, char *json, size_t len, void *opaque) {
  obx_worker_t *w = opaque;
  bson_error_t error;
  bson_t *doc = bson_new_from_json((const uint8_t *)json, (ssize_t)len, &error);
  if (!doc) {
    obx_debug("kafka statistics not read: %s", error.message);
    return 0;
  }
  int64_t fetched = 0, prefetched = 0;
  bson_iter_t it, topic, parts, part, field; /* topics.<topic>.partitions.<n>: a topic name may have dots */
  if (bson_iter_init_find(&it, doc, "topics") && BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &topic) &&
      bson_iter_find(&topic, w->conf->kafka_topic) && BSON_ITER_HOLDS_DOCUMENT(&topic) &&
      bson_iter_recurse(&topic, &parts) && bson_iter_find(&parts, "partitions") && BSON_ITER_HOLDS_DOCUMENT(&parts) &&
      bson_iter_recurse(&parts, &part)) {
    while (bson_iter_next(&part)) {
      if (strcmp(bson_iter_key(&part), "-1") == 0 || !BSON_ITER_HOLDS_DOCUMENT(&part)) continue; /* the unassigned */
      if (bson_iter_recurse(&part, &field) && bson_iter_find(&field, "rxmsgs")) fetched += bson_iter_as_int64(&field);
      if (bson_iter_recurse(&part, &field) && bson_iter_find(&field, "fetchq_cnt")) prefetched += bson_iter_as_int64(&field);
    }
  }
  bson_destroy(doc);
  worker_set_fetched(w, fetched, prefetched);
  return 0; /* librdkafka frees json */
}

/* Records behind over the assigned partitions: from the first one not finished (or the
 * position, when all read ones are) to the high watermark. */
static void kafka_update_lag(obx_worker_t *w) {
  rd_kafka_topic_partition_list_t *parts = NULL;
  if (rd_kafka_assignment(w->rk, &parts) || !parts) return;
  rd_kafka_position(w->rk, parts);
  int64_t lag = 0;
  for (int i = 0; i < parts->cnt; i++) {
    int64_t lo, hi;
    if (rd_kafka_get_watermark_offsets(w->rk, parts->elems[i].topic, parts->elems[i].partition, &lo, &hi)) continue;
    int64_t pos = worker_offsets_pending_low(&w->offsets, parts->elems[i].partition);
    if (pos < 0) pos = parts->elems[i].offset >= 0 ? parts->elems[i].offset : lo;
    if (hi > pos) lag += hi - pos;
  }
  worker_set_lag(w, lag);
  rd_kafka_topic_partition_list_destroy(parts);
}

/* Queues a record behind its key and holds its partition (p, NULL: none) when the key or the
 * worker is full after the push. */
static void kafka_dispatch(obx_worker_t *w, const rd_kafka_message_t *rkm, intake_part_t *p) {
  job_t *job = calloc(1, sizeof *job);
  assert(job);
  job->source = WORKER_SOURCE_KAFKA;
  job->partition = rkm->partition;
  job->offset = rkm->offset;
  job->generation = w->generation;
  obx_ce_header_t hdrs[OBX_ENVELOPE_MAX_HEADERS];
  int n = 0, dropped = 0;
  rd_kafka_headers_t *kh = NULL;
  if (rd_kafka_message_headers(rkm, &kh) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char *name;
    const void *val;
    size_t size;
    for (size_t i = 0; !rd_kafka_header_get_all(kh, i, &name, &val, &size); i++)
      if (n < OBX_ENVELOPE_MAX_HEADERS) hdrs[n++] = (obx_ce_header_t){name, val, size};
      else dropped++; /* counted: such a record is dead-lettered as malformed, never cut silently */
  }
  obx_envelope_init(&job->msg);
  obx_envelope_from_record(&job->msg, NULL, rkm->key, rkm->key_len, rkm->payload, rkm->len, hdrs, n);
  job->msg.dropped_headers = dropped;
  char src[256];
  snprintf(src, sizeof src, "%s/%" PRId32 "/%" PRId64, w->conf->kafka_topic, rkm->partition, rkm->offset);
  job->msg.source = strdup(src);
  worker_count_consumed(w, WORKER_SOURCE_KAFKA);
  worker_offsets_add(&w->offsets, rkm->partition, rkm->offset);
  w->kafka_jobs++;
  int depth = 0, inflight = 0;
  size_t klen;
  const char *key = obx_envelope_partition_key(&job->msg, &klen);
  char keycopy[OBX_EVENT_MAX_ATTR_LEN + 1];
  if (klen > OBX_EVENT_MAX_ATTR_LEN) klen = OBX_EVENT_MAX_ATTR_LEN;
  memcpy(keycopy, key, klen); /* the job belongs to the runners after the push */
  worker_job_push(w, job, &depth, &inflight);
  w->intake_inflight = inflight;
  if (p && depth >= KEY_QUEUE_CAP) intake_hold(w, p, INTAKE_HELD_KEY, keycopy, klen, depth, inflight);
  else if (p && inflight >= w->max_inflight) intake_hold(w, p, INTAKE_HELD_BOUND, NULL, 0, depth, inflight);
}

static void kafka_record(obx_worker_t *w, rd_kafka_message_t *rkm, intake_part_t *p) {
  obx_health_stamp("queueing a record behind its key");
  if (!rkm->err) kafka_dispatch(w, rkm, p);
  else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) obx_warn("kafka consumer: %s", rd_kafka_message_errstr(rkm));
  rd_kafka_message_destroy(rkm);
}

/* One turn over the partitions not held, from the first-th on (each turn starts at the next one):
 * up to READ_TURN records of each. Returns the records read. */
static int intake_read(obx_worker_t *w, unsigned first) {
  int got = 0;
  for (int n = 0; n < w->nparts; n++) {
    intake_part_t *p = &w->parts[(first + (unsigned)n) % (unsigned)w->nparts];
    for (int k = 0; k < READ_TURN && p->hold == INTAKE_READING; k++) {
      if (w->intake_inflight >= w->max_inflight) {
        if (rd_kafka_queue_length(p->queue) > 0) intake_hold(w, p, INTAKE_HELD_BOUND, NULL, 0, 0, w->intake_inflight);
        break;
      }
      rd_kafka_message_t *rkm = rd_kafka_consume_queue(p->queue, 0);
      if (!rkm) break;
      got++;
      kafka_record(w, rkm, p);
    }
  }
  return got;
}

/* Serves the consumer queue: the rebalance callback, consumer errors, logs. No partition's record
 * is forwarded there (intake_parts_take); one that were would be queued, never held. */
static int serve_consumer_queue(obx_worker_t *w) {
  int n = 0;
  rd_kafka_message_t *rkm;
  while (!atomic_load(&w->stop) && (rkm = rd_kafka_consumer_poll(w->rk, 0))) {
    n++;
    kafka_record(w, rkm, NULL);
  }
  return n;
}

static void *kafka_main(void *arg) {
  obx_worker_t *w = arg;
  pthread_setname_np(pthread_self(), "obx-kafka");
  obx_log_set_role("worker");
  int64_t last_lag = 0, last_recommit = obx_time_now_ms();
  obx_health_register("worker", "kafka poll");
  unsigned turn = 0;
  while (!atomic_load(&w->stop)) {
    obx_health_stamp("polling Kafka");
    /* armed before the completions are looked at: one that comes after still wakes the wait */
    if (w->nheld || w->intake_inflight >= w->max_inflight) atomic_store(&w->wake_armed, true);
    int got = intake_read(w, turn++);
    got += serve_consumer_queue(w); /* rd_kafka_consumer_poll: also what keeps max.poll.interval.ms met */
    kafka_commit_done(w, false);
    int held = w->nheld;
    intake_release(w);
    if (!got && w->nheld == held) intake_wait(w, 100);
    int64_t now = obx_time_now_ms();
    if (now - last_lag >= 2000) {
      kafka_update_lag(w);
      last_lag = now;
    }
    if (now - last_recommit >= 5000) {
      /* Asynchronous commits can fail unseen (broker away): repeat the current points. */
      int max = w->offsets.n ? w->offsets.n : 1;
      int32_t parts[max];
      int64_t next[max];
      kafka_commit(w, parts, next, worker_offsets_points(&w->offsets, parts, next, max), false);
      last_recommit = now;
    }
  }
  obx_health_unregister();
  return NULL;
}

/* The consumer's guarantees are not configurable: offsets are committed by the worker, only after
 * an event's outcome is in the inbox, and partitions are assigned eagerly by rebalance_cb. */
static bool kafka_passthrough_allowed(const char *name, const char *value, obx_err_t *err) {
  if ((strcmp(name, "enable.auto.commit") == 0 || strcmp(name, "enable.auto.offset.store") == 0) &&
      strcmp(value, "false") != 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false,
                "kafka.%s=%s is refused: the worker commits an offset only once its event's outcome is in the inbox",
                name, value);
    return false;
  }
  if (strcmp(name, "partition.assignment.strategy") == 0 && strstr(value, "cooperative")) {
    obx_err_set(err, OBX_ERR_CONF, 0, false,
                "kafka.partition.assignment.strategy=%s is refused: the worker rebalances eagerly "
                "(range or roundrobin); use worker.instance_id (static membership) to avoid rebalances on restart",
                value);
    return false;
  }
  if (strcmp(name, "group.id") == 0 || strcmp(name, "group.instance.id") == 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "kafka.%s is refused: set %s (it also names the inbox consumer)", name,
                strcmp(name, "group.id") == 0 ? "worker.group" : "worker.instance_id");
    return false;
  }
  return true;
}

bool worker_kafka_start(obx_worker_t *w, obx_err_t *err) {
  char errstr[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  struct {
    const char *k, *v;
  } props[] = {
    {"bootstrap.servers", w->conf->kafka_brokers}, {"group.id", w->conf->worker_group},
    {"enable.auto.commit", "false"},                {"enable.auto.offset.store", "false"},
    {"auto.offset.reset", "earliest"},              {"client.id", "outboxd-worker"},
    /* each partition prefetches into its own queue (intake_parts_take): these bound it, per
     * partition; kafka.* passthrough may change them */
    {"queued.max.messages.kbytes", "16384"},        {"queued.min.messages", "20000"},
  };
  for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)
    if (rd_kafka_conf_set(kc, props[i].k, props[i].v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) goto conf_fail;
  if (w->conf->worker_instance_id[0] &&
      rd_kafka_conf_set(kc, "group.instance.id", w->conf->worker_instance_id, errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
    goto conf_fail;
  for (int i = 0; i < w->conf->npassthrough; i++) {
    const char *key = w->conf->passthrough[i].key;
    if (strncmp(key, "kafka.", 6) != 0) continue;
    if (!kafka_passthrough_allowed(key + 6, w->conf->passthrough[i].value, err)) {
      rd_kafka_conf_destroy(kc);
      return false;
    }
    if (rd_kafka_conf_set(kc, key + 6, w->conf->passthrough[i].value, errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
      goto conf_fail;
  }
  rd_kafka_conf_set_rebalance_cb(kc, rebalance_cb);
  rd_kafka_conf_set_stats_cb(kc, stats_cb);
  atomic_store(&w->stats.fetched_records, -1);
  atomic_store(&w->stats.prefetched_records, -1);
  rd_kafka_conf_set_opaque(kc, w);
  obx_log_route_kafka(kc);
  w->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, errstr, sizeof errstr);
  if (!w->rk) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, false, "kafka consumer: %s", errstr);
    rd_kafka_conf_destroy(kc); /* rd_kafka_new takes the conf only on success */
    return false;
  }
  if (pipe2(w->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    obx_err_set(err, OBX_ERR_SYS, errno, false, "kafka consumer: pipe: %s", strerror(errno));
    rd_kafka_destroy(w->rk);
    w->rk = NULL;
    return false;
  }
  rd_kafka_poll_set_consumer(w->rk);
  w->consumer_q = rd_kafka_queue_get_consumer(w->rk);
  rd_kafka_queue_io_event_enable(w->consumer_q, w->wake[1], "q", 1);
  rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, w->conf->kafka_topic, RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t rerr = rd_kafka_subscribe(w->rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  if (rerr) {
    obx_err_from_kafka(err, rerr, "subscribe");
    return false;
  }
  if (pthread_create(&w->kafka_thread, NULL, kafka_main, w) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the Kafka thread");
    return false;
  }
  w->kafka_running = true;
  return true;
conf_fail:
  obx_err_set(err, OBX_ERR_CONF, 0, false, "kafka consumer config: %s", errstr);
  rd_kafka_conf_destroy(kc);
  return false;
}

/* After the threads stopped: commits what finished, drops the queues, closes the consumer,
 * forgets the offsets. */
void worker_kafka_close(obx_worker_t *w) {
  if (w->rk) {
    kafka_commit_done(w, true);
    rd_kafka_queue_io_event_enable(w->consumer_q, -1, NULL, 0);
    rd_kafka_queue_destroy(w->consumer_q); /* before the close (rdkafka.h) */
    intake_parts_clear(w);
    rd_kafka_consumer_close(w->rk);
    rd_kafka_destroy(w->rk);
    close(w->wake[0]);
    close(w->wake[1]);
  }
  worker_offsets_clear(&w->offsets);
}
