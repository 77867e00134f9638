/* test_worker_sched.c - a key's queue runs in the writer's per-key sequence (src/worker/sched.c)
 *
 * One runner; the first job of the key holds it until the others are queued, so the order the
 * queue hands them out is the order they run in: by key_seq where the jobs carry one (a later
 * event that arrived first, from another partition, waits for the earlier ones queued after
 * it), equal ones and jobs without one in arrival order. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test.h"
#include "../../src/worker/worker_int.h"

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool release;       /* the first job may finish */
  int64_t ran[16];    /* the tags (job offsets) in run order */
  int n;
} runs_t;

static bool run(void *ctx, worker_job_t *job) {
  runs_t *r = ctx;
  pthread_mutex_lock(&r->mu);
  r->ran[r->n++] = job->offset;
  pthread_cond_broadcast(&r->cv);
  while (!r->release) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  free(job);
  return true; /* finished: the key's next job may run */
}

static void push(worker_sched_t *s, const char *key, int64_t key_seq, int64_t tag) {
  worker_job_t *job = calloc(1, sizeof *job);
  job->key_seq = key_seq;
  job->offset = tag;
  worker_sched_push(s, job, key, strlen(key), NULL, NULL);
}

static void test_key_queue_follows_key_seq(void **state) {
  (void)state;
  runs_t r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  obx_err_t err = OBX_ERR_INIT;
  worker_sched_t *s = worker_sched_new(1, run, &r, &err);
  assert_non_null(s);
  push(s, "K", 1, 10); /* runs at once and holds the runner */
  pthread_mutex_lock(&r.mu);
  while (r.n < 1) pthread_cond_wait(&r.cv, &r.mu);
  pthread_mutex_unlock(&r.mu);
  push(s, "K", 4, 40); /* arrived first, written later */
  push(s, "K", 2, 20);
  push(s, "K", 0, 1);  /* no sequence: behind what is queued */
  push(s, "K", 3, 30);
  push(s, "K", 2, 21); /* a second copy of 2: after the first */
  assert_int_equal(worker_sched_key_depth(s, "K", 1), 6);
  pthread_mutex_lock(&r.mu);
  r.release = true;
  pthread_cond_broadcast(&r.cv);
  while (r.n < 6) pthread_cond_wait(&r.cv, &r.mu);
  pthread_mutex_unlock(&r.mu);
  static const int64_t want[] = {10, 20, 21, 30, 40, 1};
  for (int i = 0; i < 6; i++)
    if (r.ran[i] != want[i]) fail_msg("run %d: job %lld, want %lld", i, (long long)r.ran[i], (long long)want[i]);
  worker_sched_destroy(s, NULL, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_key_queue_follows_key_seq),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
