/* test_worker_sched.c - a key's queue runs in the writer's per-key sequence (src/worker/sched.c)
 *
 * One runner; the first job of the key holds it until the others are queued, so the order the
 * queue hands them out is the order they run in: by key_seq where the jobs carry one (a later
 * event that arrived first, from another partition, waits for the earlier ones queued after
 * it), equal ones and jobs without one in arrival order. A deferred job (worker_sched_defer: its
 * key's earlier keySeq has not settled, keyseq.c) holds no runner, lets other keys run, runs again
 * when an earlier job of its key is queued (that one first) or when its wait is up, and is dropped
 * like any queued job. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* ---- deferred jobs ---- */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  worker_sched_t *s;
  int64_t ran[16], at[16]; /* tags in run order, and when (monotonic ms) */
  int n, deferred;        /* runs recorded, deferrals made */
  int64_t defer_ms[128];   /* by tag: the first run of the job defers it this long (0: runs) */
} defers_t;

static int64_t mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool run_deferring(void *ctx, worker_job_t *job) {
  defers_t *d = ctx;
  pthread_mutex_lock(&d->mu);
  d->at[d->n] = mono_now();
  d->ran[d->n++] = job->offset;
  int64_t wait = d->defer_ms[job->offset];
  d->defer_ms[job->offset] = 0;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  if (wait > 0) {
    worker_sched_defer(d->s, job, wait);
    pthread_mutex_lock(&d->mu);
    d->deferred++;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return false;
  }
  free(job);
  return true;
}

static void wait_runs(defers_t *d, int n) {
  pthread_mutex_lock(&d->mu);
  while (d->n < n) pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
}

static void wait_deferred(defers_t *d, int n) {
  pthread_mutex_lock(&d->mu);
  while (d->deferred < n) pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
}

static void expect_runs(defers_t *d, const int64_t *want, int n) {
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < n; i++)
    if (d->ran[i] != want[i]) fail_msg("run %d: job %lld, want %lld", i, (long long)d->ran[i], (long long)want[i]);
  pthread_mutex_unlock(&d->mu);
}

static void test_deferred_job_waits_without_a_runner(void **state) {
  (void)state;
  static defers_t d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  obx_err_t err = OBX_ERR_INIT;
  d.s = worker_sched_new(1, run_deferring, &d, &err); /* one runner: a held one would stop all */
  assert_non_null(d.s);
  d.defer_ms[50] = 60000;
  push(d.s, "K", 5, 50); /* deferred for a minute */
  wait_deferred(&d, 1);
  push(d.s, "L", 0, 7); /* another key runs meanwhile */
  wait_runs(&d, 2);
  push(d.s, "K", 6, 60); /* a later one of the key stays behind the deferred one */
  assert_int_equal(worker_sched_key_depth(d.s, "K", 1), 2);
  push(d.s, "K", 4, 40); /* its predecessor came: it runs first, then the deferred one at once */
  wait_runs(&d, 5);
  static const int64_t want[] = {50, 7, 40, 50, 60};
  expect_runs(&d, want, 5);
  if (d.at[4] - d.at[0] > 30000) fail_msg("the deferred job waited its whole wait");

  d.defer_ms[20] = 300;
  int64_t t0 = mono_now();
  push(d.s, "M", 2, 20); /* nothing comes before it: it runs again when its wait is up */
  wait_runs(&d, 7);
  if (d.at[6] - t0 < 300) fail_msg("the deferred job ran again after %lld ms, want >= 300", (long long)(d.at[6] - t0));
  assert_int_equal(d.ran[6], 20);
  worker_sched_destroy(d.s, NULL, NULL);
}

static bool every_job(void *ctx, const worker_job_t *job) {
  (void)ctx;
  (void)job;
  return true;
}

static void count_dropped(void *ctx, worker_job_t *job) {
  (*(int *)ctx)++;
  free(job);
}

static void test_deferred_job_is_dropped_like_a_queued_one(void **state) {
  (void)state;
  static defers_t d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  obx_err_t err = OBX_ERR_INIT;
  d.s = worker_sched_new(1, run_deferring, &d, &err);
  assert_non_null(d.s);
  d.defer_ms[30] = 60000;
  push(d.s, "N", 3, 30);
  wait_deferred(&d, 1);
  int dropped = 0;
  assert_int_equal(worker_sched_drop(d.s, every_job, count_dropped, &dropped), 1);
  assert_int_equal(dropped, 1);
  assert_int_equal(worker_sched_key_depth(d.s, "N", 1), 0);
  assert_int_equal(worker_sched_inflight(d.s), 0);
  push(d.s, "N", 4, 41); /* the key is fresh again: no wait left behind */
  wait_runs(&d, 2);
  assert_int_equal(d.ran[1], 41);
  d.defer_ms[42] = 60000;
  push(d.s, "P", 2, 42);
  wait_deferred(&d, 2);
  int left = 0;
  worker_sched_destroy(d.s, count_dropped, &left); /* a stop hands the deferred job back */
  assert_int_equal(left, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_key_queue_follows_key_seq),
    cmocka_unit_test(test_deferred_job_waits_without_a_runner),
    cmocka_unit_test(test_deferred_job_is_dropped_like_a_queued_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
