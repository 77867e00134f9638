/* jobs.c - a job: one envelope on its way from a source to the runners and back
 *
 * DESIGN: owns the job's life outside a run: queueing it behind its key (sched.c), handing its
 * outcome back to the source that settles it (the Kafka thread's and the work-queue thread's
 * locked lists, the HTTP sink's waiting handler), freeing it. Never runs, records or settles an
 * event itself (lifecycle.c runs it; kafka.c, workq.c and sink.c settle it). */
#include <pthread.h>
#include <stdlib.h>

#include "worker_int.h"

void worker_job_free(job_t *job) {
  if (!job) return;
  obx_envelope_cleanup(&job->msg);
  free(job);
}

int64_t worker_key_order(int64_t key_seq, int64_t offset) {
  return key_seq > 0 ? key_seq : offset >= 0 ? offset : obx_time_now_ms();
}

/* The writer's per-key sequence of the envelope (its ce_keyseq header), 0 when it has none; a
 * header that is not a positive integer is the decoder's to refuse (lifecycle.c). */
static int64_t envelope_key_seq(const obx_envelope_t *msg) {
  const char *v = obx_envelope_header(msg, "ce_keyseq");
  char *end;
  long long seq = v ? strtoll(v, &end, 10) : 0;
  return v && *v && *end == '\0' && seq > 0 ? seq : 0;
}

/* Queues a job behind the earlier ones of its key (never blocks); *key_depth and *inflight
 * (may be NULL) receive the key's depth and the worker's events in flight after the push. */
void worker_job_push(obx_worker_t *w, job_t *job, int *key_depth, int *inflight) {
  size_t klen;
  const char *key = obx_envelope_partition_key(&job->msg, &klen);
  job->key_seq = envelope_key_seq(&job->msg);
  worker_sched_push(w->sched, job, key, klen, key_depth, inflight);
}

worker_state_t worker_job_state(const job_t *job) { return job->gap_since ? WORKER_WAITING_GAP : WORKER_QUEUED; }

void worker_job_complete(obx_worker_t *w, job_t *job) {
  if (job->source == WORKER_SOURCE_HTTP) {
    worker_http_complete(job->wait, job->outcome);
    worker_job_free(job);
    return;
  }
  bool kafka = job->source == WORKER_SOURCE_KAFKA; /* the job is its source's once on the list */
  pthread_mutex_lock(&w->done_mu);
  job_t **list = kafka ? &w->kafka_done : &w->wq_done;
  job->next = *list;
  *list = job;
  pthread_mutex_unlock(&w->done_mu);
  if (kafka) worker_kafka_wake(w);
}
