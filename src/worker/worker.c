/* worker.c - the worker role: Kafka / work queue / HTTP sink -> inbox -> pipeline -> ladder
 *
 * DESIGN: see include/obx/obx_worker.h; the event's lifecycle is lifecycle.c's, its table
 * docs/worker-lifecycle.md. This file only wires the role: it creates the worker's shared pieces
 * (MongoDB pool, ladder, pipeline cache, schema guard, DLQ drain), starts the scheduler's runners
 * (sched.c), the work-queue thread (workq.c) and one intake source (kafka.c or the HTTP sink,
 * sink.c), answers /readyz, and stops them in order. Every source turns its input into an
 * envelope (obx_envelope.h), so the retry tiers, the DLQ and the inbox see one shape; the runners
 * run it through lifecycle.c. Reads mongo.*, kafka.*, amqp.url, worker.*, inbox.retention,
 * egress.*, pipelines.cache_ttl (the same enabled-pipeline cache as the api's order.pre
 * lookup). */
#include <assert.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_schema.h"
#include "worker_int.h"

/* /readyz "worker": the consumer group is joined (Kafka source) and RabbitMQ is connected. */
static bool worker_ready(void *ctx, obx_err_t *err) {
  obx_worker_t *w = ctx;
  if (strcmp(w->conf->worker_source, "kafka") == 0 && atomic_load(&w->assigned) < 0) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, true, "no partition assignment yet from consumer group %s", w->consumer);
    return false;
  }
  if (!obx_ladder_connected(w->ladder)) {
    obx_err_set(err, OBX_ERR_AMQP, 0, true, "not connected to RabbitMQ (%s)", obx_ladder_work_queue(w->ladder));
    return false;
  }
  return true;
}

/* ---- role start/stop ------------------------------------------------------------------- */

obx_worker_t *obx_worker_new(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  obx_worker_t *w = calloc(1, sizeof *w);
  assert(w);
  w->conf = conf;
  w->consumer = conf->worker_group;
  w->max_attempts = (int)conf->order_post_attempts;
  w->infra_attempts = (int)conf->worker_infra_attempts;
  w->infra_timeout_ms = conf->worker_infra_timeout;
  w->lease_ms = conf->worker_lease;
  w->gap_wait_ms = conf->worker_gap_wait;
  char host[64] = "worker", uuid[OBX_UUID_LEN + 1];
  gethostname(host, sizeof host - 1);
  obx_uuid7(uuid);
  snprintf(w->owner, sizeof w->owner, "%s:%d:%s", host, (int)getpid(), uuid);
  w->member = conf->worker_instance_id[0] ? conf->worker_instance_id : NULL;
  pthread_mutex_init(&w->claims_mu, NULL);
  pthread_mutex_init(&w->settled_mu, NULL);
  pthread_mutex_init(&w->renew_mu, NULL);
  pthread_cond_init(&w->renew_cv, NULL);
  w->nrunners = (int)conf->order_post_concurrency;
  w->max_inflight = (int)conf->worker_max_inflight;
  worker_metrics_init();
  atomic_store(&w->stats.lag, -1);
  atomic_store(&w->stats.parked_keys, -1);
  pthread_mutex_init(&w->done_mu, NULL);
  bool http_mode = strcmp(conf->worker_source, "http") == 0;
  if (http_mode && !http) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "WORKER_SOURCE=http needs the HTTP server");
    goto fail;
  }
  if (!(w->mongo = obx_mongo_new(conf, err))) goto fail;
  w->db = obx_mongo_db_name(w->mongo);
  w->pipelines = obx_pipeline_cache_new(conf->pipeline_cache_ttl);
  if (!obx_egress_init_conf(&w->egress, conf, err)) goto fail;
  w->egress_ok = true;
  w->ladder_opts = (obx_ladder_opts_t){.url = conf->amqp_url, .prefix = conf->worker_queue_prefix,
                                       .tiers_ms = conf->retry_ladder.ms, .ntiers = conf->retry_ladder.n};
  obx_amqp_settings_from_conf(&w->ladder_opts.amqp, conf);
  if (!(w->ladder = obx_ladder_new(&w->ladder_opts, err))) goto fail;
  obx_err_t soft = OBX_ERR_INIT;
  if (!obx_ladder_connect(w->ladder, &soft)) obx_warn("RabbitMQ not reachable yet (%s); will retry", soft.msg);
  w->schema = obx_schema_guard_start(w->mongo, conf, OBX_SCHEMA_WORKER, http, "worker-schema");
  if (!(w->wq = obx_ladder_consumer_new(&w->ladder_opts, 2 * w->nrunners, err))) goto fail;
  if (conf->worker_dlq_drain && !(w->drain = obx_ops_drain_start(conf, err))) goto fail;

  if (!worker_claims_start(w, err)) goto fail;
  if (!(w->sched = worker_sched_new(w->nrunners, worker_run_job, w, err))) goto fail;
  if (!(w->io = worker_io_start(w->sched, err))) goto fail;
  if (!(w->claimer = worker_batcher_start(w, "claims", worker_claim_batch, CLAIM_BATCH_MAX, err)) ||
      !(w->recorder = worker_batcher_start(w, "recordings", worker_record_batch, RECORD_BATCH_MAX, err)))
    goto fail;
  if (!worker_wq_start(w, err)) goto fail;
  atomic_store(&w->assigned, -1);
  if (http) obx_http_add_ready_check(http, "worker", worker_ready, w);
  if (http_mode) {
    if (!(w->sink = worker_sink_start(w, conf, w->mongo, err))) goto fail;
  } else if (!worker_kafka_start(w, err)) {
    goto fail;
  }
  obx_info("worker started: %s source, %d runners, %d events in flight at most, %d attempts, %d retry tiers, "
           "consumer %s", http_mode ? "http" : "kafka", w->nrunners, w->max_inflight, w->max_attempts,
           conf->retry_ladder.n, w->consumer);
  return w;
fail:
  obx_worker_destroy(w);
  return NULL;
}

/* A job still queued at the stop: HTTP callers get 503; Kafka records are not committed and
 * work-queue messages not acked, so both come back. */
static void job_left(void *ctx, job_t *job) {
  worker_state_move(job->msg.message_id, worker_job_state(job), WORKER_INFRA);
  if (job->source == WORKER_SOURCE_HTTP) {
    job->outcome = WORKER_INFRA;
    worker_job_complete(ctx, job);
  } else {
    worker_job_free(job);
  }
}

void obx_worker_destroy(obx_worker_t *w) {
  if (!w) return;
  atomic_store(&w->stop, true);
  obx_ops_drain_stop(w->drain);
  if (w->kafka_running) pthread_join(w->kafka_thread, NULL);
  if (w->wq_running) pthread_join(w->wq_thread, NULL);
  worker_sched_destroy(w->sched, job_left, w); /* lets each runner finish its current event */
  w->sched = NULL;
  worker_io_stop(w->io); /* after the runners: the calls of their events ended with them */
  w->io = NULL;
  worker_batcher_stop(w->claimer); /* after the runners too: no write of theirs is left */
  worker_batcher_stop(w->recorder);
  w->claimer = w->recorder = NULL;
  worker_claims_stop(w); /* after the runners: their claims stay renewed while they finish */
  worker_kafka_close(w);
  if (w->wq) worker_wq_settle(w);
  /* every sink request waiting on a runner has its answer (503 from job_left): the listener
   * stops without waiting on runners that no longer run; later requests found w->stop and got 503 */
  worker_sink_stop(w->sink);
  w->sink = NULL;
  for (job_t *job = w->kafka_done, *next; job; job = next) {
    next = job->next;
    worker_job_free(job);
  }
  obx_ladder_consumer_destroy(w->wq);
  obx_ladder_destroy(w->ladder);
  if (w->egress_ok) obx_egress_cleanup(&w->egress);
  obx_pipeline_cache_destroy(w->pipelines);
  obx_schema_guard_destroy(w->schema);
  obx_mongo_destroy(w->mongo);
  pthread_mutex_destroy(&w->done_mu);
  pthread_mutex_destroy(&w->claims_mu);
  pthread_mutex_destroy(&w->settled_mu);
  pthread_mutex_destroy(&w->renew_mu);
  pthread_cond_destroy(&w->renew_cv);
  free(w->claims);
  for (int i = 0; i < LOST_KEYS; i++) free(w->lost[i].key);
  free(w);
}

void *obx_worker_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  return obx_worker_new(conf, http, err);
}

void obx_worker_stop(void *worker) { obx_worker_destroy(worker); }

int obx_worker_sink_port(const obx_worker_t *w) { return worker_sink_port(w->sink); }

bool worker_schema_ready(obx_worker_t *w) { return obx_schema_guard_wait(w->schema, 0); }
