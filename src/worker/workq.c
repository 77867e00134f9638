/* workq.c - the worker's work-queue source (RabbitMQ P.work: retries, redrives, hand-overs)
 *
 * DESIGN: owns the AMQP consumer of the work queue and its thread (wq_main), which also keeps the
 * worker's periodic chores: the ladder connection's tick, the parked-keys gauge and the retry
 * sweep (retrysweep.c, once the worker's indexes exist, every quarter of WORKER_RETRY_GRACE at
 * most once a second) (the claims'
 * leases are renewed by a thread of their own, claims.c). A message becomes an envelope queued behind its key (jobs.c), and
 * is acked once its outcome is recorded, nacked (requeued) when it could be put nowhere. Never
 * runs or records an event (lifecycle.c does). Reads amqp.url, worker.queue_prefix. */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "obx/obx_health.h"
#include "obx/obx_inbox.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "worker_int.h"

void worker_wq_settle(obx_worker_t *w) {
  pthread_mutex_lock(&w->done_mu);
  job_t *list = w->wq_done;
  w->wq_done = NULL;
  pthread_mutex_unlock(&w->done_mu);
  for (job_t *job = list, *next; job; job = next) {
    next = job->next;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = job->outcome == WORKER_INFRA ? obx_ladder_consumer_nack(w->wq, &job->msg, true, &err)
                                           : obx_ladder_consumer_ack(w->wq, &job->msg, &err);
    if (!ok) obx_warn("settling a work queue message failed (it will be redelivered): %s", err.msg);
    worker_job_free(job);
  }
}

static void *wq_main(void *arg) {
  obx_worker_t *w = arg;
  pthread_setname_np(pthread_self(), "obx-workq");
  obx_log_set_role("worker");
  int64_t last_warn = 0, last_parked = 0, last_tick = 0, last_sweep = 0;
  int64_t sweep_every = w->conf->worker_retry_grace / 4 > 1000 ? w->conf->worker_retry_grace / 4 : 1000;
  obx_health_register("worker", "work queue");
  while (!atomic_load(&w->stop)) {
    obx_health_stamp("settling work queue messages");
    worker_wq_settle(w);
    if (obx_time_now_ms() - last_tick >= 1000) { /* in every mode: heartbeats, reconnects */
      obx_ladder_tick(w->ladder);
      last_tick = obx_time_now_ms();
    }
    if (obx_time_now_ms() - last_parked >= 5000 && worker_schema_ready(w)) { /* its index in place */
      last_parked = obx_time_now_ms();
      mongoc_client_t *client = obx_mongo_pop(w->mongo);
      int64_t n = -1;
      obx_err_t err = OBX_ERR_INIT;
      if (obx_inbox_count_parked(client, w->db, w->consumer, &n, &err)) worker_set_parked(w, n);
      obx_mongo_push(w->mongo, client);
    }
    if (obx_time_now_ms() - last_sweep >= sweep_every && worker_schema_ready(w)) {
      last_sweep = obx_time_now_ms();
      worker_retry_sweep(w);
    }
    job_t *job = calloc(1, sizeof *job);
    assert(job);
    job->source = WORKER_SOURCE_WORK;
    obx_envelope_init(&job->msg);
    bool got = false;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ladder_consumer_next(w->wq, &job->msg, 200, &got, &err)) {
      if (obx_time_now_ms() - last_warn > 10000) {
        obx_warn("work queue: %s", err.msg);
        last_warn = obx_time_now_ms();
      }
      worker_job_free(job);
      worker_nap(w, 200);
      continue;
    }
    if (!got) {
      worker_job_free(job);
      continue;
    }
    worker_count_consumed(w, WORKER_SOURCE_WORK);
    worker_job_push(w, job, NULL, NULL); /* bounded by the prefetch */
  }
  obx_health_unregister();
  worker_wq_settle(w);
  return NULL;
}

bool worker_wq_start(obx_worker_t *w, obx_err_t *err) {
  if (pthread_create(&w->wq_thread, NULL, wq_main, w) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the work queue thread");
    return false;
  }
  w->wq_running = true;
  return true;
}
