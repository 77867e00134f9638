/* io.c - the worker's IO thread: every http-request call of the events in flight, in one multi handle
 *
 * DESIGN: owns a libcurl multi handle and the calls in it; never runs a pipeline node, records
 * or settles an event. A runner whose pipeline run stops at a call (obx_pipeline_run_waiting:
 * an easy handle the egress guard set up) hands the job here (worker_io_submit) and is free for
 * other keys. The IO thread adds the handle to its multi handle and drives every transfer at
 * once (curl_multi_perform, curl_multi_poll; a submit wakes it with curl_multi_wakeup); when one
 * ends it puts the transfer's result on the job and gives the job back to the runners
 * (worker_sched_resume), where the run goes on. The job's key stays running in sched.c
 * meanwhile, so the calls of one key never overlap and its events stay strictly in order, while
 * the calls of up to WORKER_MAX_INFLIGHT events (one call at a time per event) are in flight
 * together. A call ends within its own timeouts (HTTP_CONNECT_TIMEOUT_MS, HTTP_TIMEOUT_MS or a
 * node's shorter timeoutMs); connections and DNS answers are kept in the multi handle and reused
 * by later calls to the same host. The event's claim stays in the claims list while it waits, so
 * its lease is renewed like that of a running event (claims.c). Stop: the runners stop first
 * (worker_sched_destroy waits for the runs held here), then worker_io_stop ends the thread.
 * Health loop "worker/http calls"; gauge outboxd_worker_http_calls_in_flight. */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "worker_int.h"

struct worker_io {
  worker_sched_t *sched;
  CURLM *multi;
  pthread_t thread;
  bool running;
  atomic_bool stop;
  pthread_mutex_t mu;
  job_t *head, *tail; /* submitted, not yet in the multi handle (linked by job->next) */
};

static obx_gauge_t *calls_gauge;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_init(void) {
  calls_gauge = obx_metrics_gauge("outboxd_worker_http_calls_in_flight",
                                  "http-request calls the worker's IO thread drives now", NULL);
}

/* Moves the submitted jobs' handles into the multi handle; returns how many. */
static int take_submitted(worker_io_t *io) {
  pthread_mutex_lock(&io->mu);
  job_t *list = io->head;
  io->head = io->tail = NULL;
  pthread_mutex_unlock(&io->mu);
  int n = 0;
  for (job_t *job = list, *next; job; job = next, n++) {
    next = job->next;
    job->next = NULL;
    CURLMcode mc = curl_multi_add_handle(io->multi, job->call);
    if (mc != CURLM_OK) { /* the call ends at once, failed: the run records it (transient) */
      obx_warn("an http-request call cannot be started: %s", curl_multi_strerror(mc));
      job->call_result = CURLE_FAILED_INIT;
      worker_sched_resume(io->sched, job);
      n--;
    }
  }
  return n;
}

static void *io_main(void *arg) {
  worker_io_t *io = arg;
  pthread_setname_np(pthread_self(), "obx-http-io");
  obx_log_set_role("worker");
  obx_health_register("worker", "http calls");
  int active = 0;
  /* a stopping worker's held runs still end: their calls are driven until none is left */
  while (!atomic_load(&io->stop) || active > 0) {
    active += take_submitted(io);
    int running = 0;
    curl_multi_perform(io->multi, &running);
    int left = 0;
    for (CURLMsg *m; (m = curl_multi_info_read(io->multi, &left));) {
      if (m->msg != CURLMSG_DONE) continue;
      CURL *easy = m->easy_handle;
      CURLcode rc = m->data.result;
      char *priv = NULL;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
      curl_multi_remove_handle(io->multi, easy);
      job_t *job = (job_t *)priv;
      job->call_result = rc;
      active--;
      worker_sched_resume(io->sched, job); /* the job is the runners' again: not touched after this */
    }
    obx_gauge_set(calls_gauge, (double)active);
    if (active) obx_health_stamp("driving http-request calls");
    else obx_health_idle();
    curl_multi_poll(io->multi, NULL, 0, 1000, NULL);
  }
  obx_health_unregister();
  return NULL;
}

worker_io_t *worker_io_start(worker_sched_t *sched, obx_err_t *err) {
  pthread_once(&metrics_once, metrics_init);
  obx_egress_global_init();
  worker_io_t *io = calloc(1, sizeof *io);
  assert(io);
  io->sched = sched;
  pthread_mutex_init(&io->mu, NULL);
  if (!(io->multi = curl_multi_init())) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "curl_multi_init failed");
    worker_io_stop(io);
    return NULL;
  }
  if (pthread_create(&io->thread, NULL, io_main, io) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the worker's IO thread");
    worker_io_stop(io);
    return NULL;
  }
  io->running = true;
  return io;
}

void worker_io_submit(worker_io_t *io, job_t *job) {
  worker_sched_hold(io->sched);
  curl_easy_setopt(job->call, CURLOPT_PRIVATE, (char *)job);
  job->next = NULL;
  pthread_mutex_lock(&io->mu);
  if (io->tail) io->tail->next = job;
  else io->head = job;
  io->tail = job;
  pthread_mutex_unlock(&io->mu);
  curl_multi_wakeup(io->multi);
}

void worker_io_stop(worker_io_t *io) {
  if (!io) return;
  atomic_store(&io->stop, true);
  if (io->running) {
    curl_multi_wakeup(io->multi);
    pthread_join(io->thread, NULL);
  }
  assert(!io->head); /* nothing is submitted once the runners stopped */
  if (io->multi) curl_multi_cleanup(io->multi);
  pthread_mutex_destroy(&io->mu);
  free(io);
}
