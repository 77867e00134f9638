/* kafka.c - the worker's Kafka source: the consumer group, its offsets and its paused partitions
 *
 * DESIGN: owns the consumer (one poll thread, kafka_main), the per-partition offset bookkeeping
 * (offsets.c), the pauses and the rebalances. A record becomes an envelope queued behind its key
 * (jobs.c); an offset is committed only when every earlier offset of its partition has its
 * outcome in the inbox (contiguous commits). The poll thread never blocks: a full key or bound
 * pauses the record's partition. Never runs or records an event (lifecycle.c does). Reads
 * kafka.*, worker.group, worker.instance_id. */
#include <assert.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "worker_int.h"

#define KEY_QUEUE_CAP 64  /* events of one key held before its partition is paused */
#define REVOKE_DRAIN_MS 30000

static void kafka_commit(obx_worker_t *w, const int32_t *parts, const int64_t *next, int n, bool sync) {
  if (n == 0) return;
  rd_kafka_topic_partition_list_t *offsets = rd_kafka_topic_partition_list_new(n);
  for (int i = 0; i < n; i++) rd_kafka_topic_partition_list_add(offsets, w->conf->kafka_topic, parts[i])->offset = next[i];
  rd_kafka_resp_err_t rerr = rd_kafka_commit(w->rk, offsets, sync ? 0 : 1);
  if (rerr) obx_warn("offset commit failed: %s", rd_kafka_err2str(rerr));
  rd_kafka_topic_partition_list_destroy(offsets);
}

/* Takes the runners' completions and commits the contiguous finished offsets. */
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
  int max = w->offsets.n ? w->offsets.n : 1;
  int32_t parts[max];
  int64_t next[max];
  int n = worker_offsets_advance(&w->offsets, parts, next, max);
  kafka_commit(w, parts, next, n, sync);
}

/* ---- intake: paused partitions -------------------------------------------------------------
 * The Kafka thread never blocks on a full key or a full worker: after a push that fills the
 * key's queue (KEY_QUEUE_CAP) or the bound (WORKER_MAX_INFLIGHT) it pauses that record's
 * partition (rd_kafka_pause_partitions: what was fetched for it is dropped and fetched again
 * from the next offset on resume), and resumes it once the key is half drained and the worker
 * is under three quarters of the bound. Polls, rebalances and commits go on meanwhile. */

static void partition_toggle(obx_worker_t *w, int32_t partition, bool pause) {
  rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(list, w->conf->kafka_topic, partition);
  rd_kafka_resp_err_t rerr = pause ? rd_kafka_pause_partitions(w->rk, list) : rd_kafka_resume_partitions(w->rk, list);
  if (rerr) obx_warn("%s partition %" PRId32 ": %s", pause ? "pausing" : "resuming", partition, rd_kafka_err2str(rerr));
  rd_kafka_topic_partition_list_destroy(list);
}

static void kafka_pause(obx_worker_t *w, int32_t partition, const char *key, size_t len, int depth, int inflight) {
  for (int i = 0; i < w->npaused; i++)
    if (w->paused[i].partition == partition) return;
  partition_toggle(w, partition, true);
  w->paused = realloc(w->paused, (size_t)(w->npaused + 1) * sizeof *w->paused);
  assert(w->paused);
  paused_t *p = &w->paused[w->npaused++];
  p->partition = partition;
  p->key = malloc(len + 1);
  assert(p->key);
  memcpy(p->key, key, len);
  p->key[len] = '\0';
  p->len = len;
  obx_info("partition %" PRId32 " paused: key %.64s holds %d events, %d in flight (bound %d)", partition, p->key,
           depth, inflight, w->max_inflight);
  worker_set_paused_gauge(w);
}

static void kafka_resume_drained(obx_worker_t *w) {
  int inflight = worker_sched_inflight(w->sched);
  for (int i = 0; i < w->npaused;) {
    paused_t *p = &w->paused[i];
    if (inflight > w->max_inflight * 3 / 4 || worker_sched_key_depth(w->sched, p->key, p->len) > KEY_QUEUE_CAP / 2) {
      i++;
      continue;
    }
    partition_toggle(w, p->partition, false);
    obx_info("partition %" PRId32 " resumed", p->partition);
    free(p->key);
    w->paused[i] = w->paused[--w->npaused];
    worker_set_paused_gauge(w);
  }
}

/* Forgets the pauses (a rebalance: what is assigned next starts unpaused). */
static void kafka_pauses_clear(obx_worker_t *w) {
  for (int i = 0; i < w->npaused; i++) free(w->paused[i].key);
  w->npaused = 0;
  worker_set_paused_gauge(w);
}

static bool is_kafka_job(void *ctx, const job_t *job) {
  (void)ctx;
  return job->source == WORKER_SOURCE_KAFKA;
}

static void drop_kafka_job(void *ctx, job_t *job) {
  obx_worker_t *w = ctx;
  worker_state_move(job->msg.message_id, WORKER_QUEUED, WORKER_INFRA); /* the next owner reads it */
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
    kafka_pauses_clear(w);
    w->generation++;
    rd_kafka_assign(rk, NULL);
    atomic_fetch_add(&w->stats.revocations, 1);
    obx_info("partitions revoked (%d; %d queued events left to the next owner, %d still running)", parts->cnt,
             dropped, w->kafka_jobs);
  } else if (rerr == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    worker_offsets_clear(&w->offsets);
    kafka_pauses_clear(w);
    w->generation++;
    rd_kafka_assign(rk, parts);
    rd_kafka_resume_partitions(rk, parts);
    atomic_store(&w->assigned, parts->cnt);
    obx_info("partitions assigned (%d)", parts->cnt);
  } else {
    rd_kafka_assign(rk, NULL);
  }
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

static void kafka_dispatch(obx_worker_t *w, const rd_kafka_message_t *rkm) {
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
  if (depth >= KEY_QUEUE_CAP || inflight >= w->max_inflight)
    kafka_pause(w, rkm->partition, keycopy, klen, depth, inflight);
}

static void *kafka_main(void *arg) {
  obx_worker_t *w = arg;
  pthread_setname_np(pthread_self(), "obx-kafka");
  obx_log_set_role("worker");
  int64_t last_lag = 0, last_recommit = obx_time_now_ms();
  obx_health_register("worker", "kafka poll");
  while (!atomic_load(&w->stop)) {
    obx_health_stamp("polling Kafka");
    rd_kafka_message_t *rkm = rd_kafka_consumer_poll(w->rk, 100);
    if (rkm) {
      obx_health_stamp("queueing a record behind its key");
      if (!rkm->err) kafka_dispatch(w, rkm);
      else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        obx_warn("kafka consumer: %s", rd_kafka_message_errstr(rkm));
      rd_kafka_message_destroy(rkm);
    }
    kafka_commit_done(w, false);
    if (w->npaused) kafka_resume_drained(w);
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
  rd_kafka_conf_set_opaque(kc, w);
  obx_log_route_kafka(kc);
  w->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, errstr, sizeof errstr);
  if (!w->rk) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, false, "kafka consumer: %s", errstr);
    rd_kafka_conf_destroy(kc); /* rd_kafka_new takes the conf only on success */
    return false;
  }
  rd_kafka_poll_set_consumer(w->rk);
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

/* After the threads stopped: commits what finished, closes the consumer, forgets the offsets
 * and the pauses. */
void worker_kafka_close(obx_worker_t *w) {
  if (w->rk) {
    kafka_commit_done(w, true);
    rd_kafka_consumer_close(w->rk);
    rd_kafka_destroy(w->rk);
  }
  worker_offsets_clear(&w->offsets);
  kafka_pauses_clear(w);
  free(w->paused);
}
