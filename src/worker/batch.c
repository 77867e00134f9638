/* batch.c - the worker's grouped writes: a thread that writes what many events hand it in one go
 *
 * DESIGN: owns the two batch threads of the worker, the claimer (fresh Kafka events' inbox
 * claims: one read of their keys' parks, one unordered insertMany) and the recorder (finished
 * runs' outcomes: one transaction for several events, group commit), each with its queue of
 * held jobs. A runner that reaches such a write hands the job here (worker_batcher_submit: the
 * job is held, worker_sched_hold, so its key stays running and no other event of the key
 * starts) and takes other keys; the thread takes every job queued, up to its batch bound,
 * writes them with its batch function (lifecycle.c: worker_claim_batch, worker_record_batch,
 * which put each event's own result on it), and gives each job back to the runners
 * (worker_sched_resume), where its event goes on. It waits for nothing more than what is queued:
 * a batch is what arrived while the previous one was written, so an idle worker writes each
 * event at once and a busy one writes many per round trip. Never decides what a result means
 * for an event (lifecycle.c does) and never settles one. Stop: after the runners
 * (worker_sched_destroy waits for the jobs held here), worker_batcher_stop ends the thread.
 * Health loops "worker/claims batch" and "worker/recordings batch"; counters
 * outboxd_worker_batches_total{batch} and outboxd_worker_batched_events_total{batch} (their
 * ratio is the mean batch size). */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "worker_int.h"

static obx_counter_t *batches, *batched;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_init(void) {
  batches = obx_metrics_counter("outboxd_worker_batches_total", "Grouped writes of the worker (claims, recordings)",
                                "batch");
  batched = obx_metrics_counter("outboxd_worker_batched_events_total", "Events written in the worker's grouped writes",
                                "batch");
}

struct worker_batcher {
  obx_worker_t *w;
  const char *label; /* "claims", "recordings" */
  char name[48];     /* its health loop */
  worker_batch_fn fn;
  int max;
  pthread_t thread;
  bool running, stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  job_t *head, *tail; /* submitted, not yet written (linked by job->next) */
};

static void *batch_main(void *arg) {
  worker_batcher_t *b = arg;
  pthread_setname_np(pthread_self(), "obx-batch");
  obx_log_set_role("worker");
  obx_health_register("worker", b->name);
  job_t **jobs = malloc((size_t)b->max * sizeof *jobs);
  assert(jobs);
  pthread_mutex_lock(&b->mu);
  for (;;) {
    obx_health_idle();
    while (!b->head && !b->stop) pthread_cond_wait(&b->cv, &b->mu);
    if (!b->head) break; /* stopping, and nothing is held here any more */
    int n = 0;
    while (b->head && n < b->max) {
      jobs[n++] = b->head;
      b->head = b->head->next;
    }
    if (!b->head) b->tail = NULL;
    pthread_mutex_unlock(&b->mu);
    obx_health_stamp(b->name);
    b->fn(b->w, jobs, n);
    obx_counter_inc(batches, b->label);
    obx_counter_add(batched, (double)n, b->label);
    for (int i = 0; i < n; i++) worker_sched_resume(b->w->sched, jobs[i]); /* the runners' again */
    pthread_mutex_lock(&b->mu);
  }
  pthread_mutex_unlock(&b->mu);
  free(jobs);
  obx_health_unregister();
  return NULL;
}

worker_batcher_t *worker_batcher_start(obx_worker_t *w, const char *label, worker_batch_fn fn, int max,
                                       obx_err_t *err) {
  pthread_once(&metrics_once, metrics_init);
  worker_batcher_t *b = calloc(1, sizeof *b);
  assert(b && max > 0);
  *b = (worker_batcher_t){.w = w, .label = label, .fn = fn, .max = max};
  snprintf(b->name, sizeof b->name, "%s batch", label);
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  if (pthread_create(&b->thread, NULL, batch_main, b) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the worker's %s thread", b->name);
    worker_batcher_stop(b);
    return NULL;
  }
  b->running = true;
  return b;
}

void worker_batcher_submit(worker_batcher_t *b, job_t *job) {
  worker_sched_hold(b->w->sched);
  job->next = NULL;
  pthread_mutex_lock(&b->mu);
  if (b->tail) b->tail->next = job;
  else b->head = job;
  b->tail = job;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

void worker_batcher_stop(worker_batcher_t *b) {
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  b->stop = true;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
  if (b->running) pthread_join(b->thread, NULL);
  assert(!b->head); /* nothing is submitted once the runners stopped */
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
  free(b);
}
