/* sched.c - the worker's scheduling: one queue per business key, a pool of runner threads
 *
 * DESIGN: owns the per-key queues, the ready list and the runner threads; never decodes, stores
 * or settles an event (the run callback, lifecycle.c, does). A job is queued behind the earlier
 * jobs of its key (in the writer's per-key sequence when the jobs carry it, else in arrival
 * order) and a key is run by one thread at a time, so one key's events run strictly in that
 * order while other keys run in parallel; a key whose event hangs holds one runner and
 * its own queue, nothing else. A run that waits for an HTTP call (the run callback returns false,
 * the call goes to the IO thread, io.c) frees its runner but keeps its key running; when the call
 * ends, worker_sched_resume puts the job on the continuation list, which runners serve before
 * fresh keys, and the key is released only when the run finishes. A job that may not run yet
 * (its key's earlier event has not settled: keyseq.c) is deferred: back at the head of its key's
 * queue, which no runner takes before its wake time, or before a job of the key is queued ahead
 * of it (its missing predecessor came to this process); no runner is held meanwhile. Pushing
 * never blocks: the sources read the depth of the key and the number in flight after each push
 * and hold their intake themselves (the Kafka thread holds the partition concerned, see
 * kafka.c). One mutex guards everything here. */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_event.h"
#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "worker_int.h"

#define NBUCKETS 4096

typedef struct keyq {
  char *key;
  size_t len;
  uint64_t hash;
  worker_job_t *head, *tail;
  int n;             /* queued, not started */
  bool running;      /* a runner holds its head, or its run waits for a call */
  bool ready;        /* on the ready list */
  worker_job_t *cont; /* the running job, its call ended: on the continuation list */
  bool recording;    /* its running job's outcome is being written: counted in recording, not inflight */
  int64_t wake_at;   /* deferred (its head may not run yet) until then, monotonic ms; 0: not deferred */
  struct keyq *chain, *next_ready, *next_cont, *next_deferred;
} keyq_t;

struct worker_sched {
  pthread_mutex_t mu;
  pthread_cond_t ready_cv;
  keyq_t *buckets[NBUCKETS];
  keyq_t *ready_head, *ready_tail;
  keyq_t *cont_head, *cont_tail; /* keys whose waiting run can go on */
  keyq_t *deferred;  /* keys whose head may not run yet, soonest wake_at first */
  int inflight;      /* queued + running (waiting runs included; not those being recorded) */
  int recording;     /* running jobs whose outcome is being written (worker_sched_recording) */
  int waiting;       /* runs waiting for a call (handed to the IO thread) */
  bool stop;
  pthread_t *threads;
  int nthreads;
  int nregistered;   /* runners that named themselves (health loops "runner <n>") */
  worker_run_fn run;
  void *ctx;
};

uint64_t worker_key_hash(const char *key, size_t len) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a, 64 bits */
  for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)key[i]) * 1099511628211ull;
  return h;
}

static keyq_t *find(worker_sched_t *s, const char *key, size_t len, bool create) {
  uint64_t h = worker_key_hash(key, len);
  keyq_t **slot = &s->buckets[h % NBUCKETS];
  for (keyq_t *q = *slot; q; q = q->chain)
    if (q->hash == h && q->len == len && memcmp(q->key, key, len) == 0) return q;
  if (!create) return NULL;
  keyq_t *q = calloc(1, sizeof *q);
  assert(q);
  q->key = malloc(len + 1);
  assert(q->key);
  memcpy(q->key, key, len);
  q->key[len] = '\0';
  q->len = len;
  q->hash = h;
  q->chain = *slot;
  *slot = q;
  return q;
}

/* Takes q off the deferred list (its head may run as soon as a runner is free). */
static void undefer(worker_sched_t *s, keyq_t *q) {
  if (!q->wake_at) return;
  keyq_t **link = &s->deferred;
  while (*link != q) link = &(*link)->next_deferred;
  *link = q->next_deferred;
  q->wake_at = 0;
}

static void forget(worker_sched_t *s, keyq_t *q) {
  undefer(s, q);
  keyq_t **slot = &s->buckets[q->hash % NBUCKETS];
  while (*slot != q) slot = &(*slot)->chain;
  *slot = q->chain;
  free(q->key);
  free(q);
}

static void make_ready(worker_sched_t *s, keyq_t *q) {
  if (q->ready || q->running || q->wake_at || !q->head) return;
  q->ready = true;
  q->next_ready = NULL;
  if (s->ready_tail) s->ready_tail->next_ready = q;
  else s->ready_head = q;
  s->ready_tail = q;
  pthread_cond_signal(&s->ready_cv);
}

/* The next job for a runner: a continuation first (its key is running already), then the head of
 * a ready key (not once stopping: queued jobs are left). NULL when there is none. */
static worker_job_t *next_job(worker_sched_t *s) {
  for (int64_t now = obx_time_mono_ms(); s->deferred && s->deferred->wake_at <= now;) { /* their wait is up */
    keyq_t *d = s->deferred;
    undefer(s, d);
    make_ready(s, d);
  }
  keyq_t *q = s->cont_head;
  if (q) {
    s->cont_head = q->next_cont;
    if (!s->cont_head) s->cont_tail = NULL;
    worker_job_t *job = q->cont;
    q->cont = NULL;
    return job;
  }
  if (s->stop || !(q = s->ready_head)) return NULL;
  s->ready_head = q->next_ready;
  if (!s->ready_head) s->ready_tail = NULL;
  q->ready = false;
  worker_job_t *job = q->head;
  q->head = job->next;
  if (!q->head) q->tail = NULL;
  q->n--;
  q->running = true;
  job->sched_key = q;
  return job;
}

static void *runner_main(void *arg) {
  worker_sched_t *s = arg;
  pthread_setname_np(pthread_self(), "obx-runner");
  obx_log_set_role("worker");
  pthread_mutex_lock(&s->mu);
  char name[32];
  snprintf(name, sizeof name, "runner %d", s->nregistered++);
  obx_health_register("worker", name);
  for (;;) {
    obx_health_idle(); /* waiting for a key with work is not being stuck */
    worker_job_t *job;
    /* a stopping scheduler still serves the continuations of the runs waiting for a call */
    while (!(job = next_job(s)) && !(s->stop && s->waiting == 0)) {
      if (s->deferred && !s->stop) { /* until the soonest deferred key may run again */
        struct timespec until = {.tv_sec = s->deferred->wake_at / 1000,
                                 .tv_nsec = (long)(s->deferred->wake_at % 1000) * 1000000};
        pthread_cond_timedwait(&s->ready_cv, &s->mu, &until);
      } else {
        pthread_cond_wait(&s->ready_cv, &s->mu);
      }
    }
    if (!job) break;
    keyq_t *q = job->sched_key;
    pthread_mutex_unlock(&s->mu);
    obx_health_stamp("running an event");
    bool finished = s->run(s->ctx, job); /* a finished job is handed on: not touched after this */
    pthread_mutex_lock(&s->mu);
    if (!finished) continue; /* held (worker_sched_hold): its key stays running until it ends */
    q->running = false;
    if (q->recording) {
      q->recording = false;
      s->recording--;
    } else {
      s->inflight--;
    }
    if (q->head) make_ready(s, q);
    else forget(s, q);
    if (s->stop) pthread_cond_broadcast(&s->ready_cv); /* the last waiting run may have ended */
  }
  pthread_mutex_unlock(&s->mu);
  obx_health_unregister();
  return NULL;
}

worker_sched_t *worker_sched_new(int nthreads, worker_run_fn run, void *ctx, obx_err_t *err) {
  worker_sched_t *s = calloc(1, sizeof *s);
  assert(s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t cattr; /* the deferred keys' wake times are monotonic */
  pthread_condattr_init(&cattr);
  pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
  pthread_cond_init(&s->ready_cv, &cattr);
  pthread_condattr_destroy(&cattr);
  s->run = run;
  s->ctx = ctx;
  s->threads = calloc((size_t)nthreads, sizeof *s->threads);
  assert(s->threads);
  for (int i = 0; i < nthreads; i++) {
    if (pthread_create(&s->threads[i], NULL, runner_main, s) != 0) {
      obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start runner thread %d", i);
      worker_sched_destroy(s, NULL, NULL);
      return NULL;
    }
    s->nthreads++;
  }
  return s;
}

void worker_sched_destroy(worker_sched_t *s, void (*left)(void *ctx, worker_job_t *job), void *ctx) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_broadcast(&s->ready_cv);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < s->nthreads; i++) pthread_join(s->threads[i], NULL);
  for (int b = 0; b < NBUCKETS; b++)
    for (keyq_t *q = s->buckets[b], *nq; q; q = nq) {
      nq = q->chain;
      for (worker_job_t *job = q->head, *next; job; job = next) {
        next = job->next;
        if (left) left(ctx, job);
      }
      free(q->key);
      free(q);
    }
  free(s->threads);
  pthread_cond_destroy(&s->ready_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

void worker_sched_hold(worker_sched_t *s) {
  pthread_mutex_lock(&s->mu);
  s->waiting++;
  pthread_mutex_unlock(&s->mu);
}

void worker_sched_resume(worker_sched_t *s, worker_job_t *job) {
  pthread_mutex_lock(&s->mu);
  keyq_t *q = job->sched_key;
  assert(q->running && !q->cont);
  q->cont = job;
  q->next_cont = NULL;
  if (s->cont_tail) s->cont_tail->next_cont = q;
  else s->cont_head = q;
  s->cont_tail = q;
  s->waiting--;
  pthread_cond_signal(&s->ready_cv);
  pthread_mutex_unlock(&s->mu);
}

void worker_sched_defer(worker_sched_t *s, worker_job_t *job, int64_t wait_ms) {
  pthread_mutex_lock(&s->mu);
  keyq_t *q = job->sched_key;
  assert(q->running && !q->wake_at);
  job->next = q->head;
  q->head = job;
  if (!q->tail) q->tail = job;
  q->n++;
  q->running = false;
  q->wake_at = obx_time_mono_ms() + (wait_ms > 0 ? wait_ms : 0);
  keyq_t **link = &s->deferred; /* soonest first */
  while (*link && (*link)->wake_at <= q->wake_at) link = &(*link)->next_deferred;
  q->next_deferred = *link;
  *link = q;
  pthread_cond_broadcast(&s->ready_cv); /* the runners' timed wait may have to end sooner */
  pthread_mutex_unlock(&s->mu);
}

void worker_sched_push(worker_sched_t *s, worker_job_t *job, const char *key, size_t len, int *key_depth,
                       int *inflight) {
  pthread_mutex_lock(&s->mu);
  keyq_t *q = find(s, key, len, true);
  worker_job_t **link = &q->head; /* before the first queued job of a higher key_seq, else last */
  while (*link && !(job->key_seq > 0 && (*link)->key_seq > job->key_seq)) link = &(*link)->next;
  job->next = *link;
  *link = job;
  if (!job->next) q->tail = job;
  q->n++;
  s->inflight++;
  if (q->head == job) undefer(s, q); /* an earlier event of the deferred head's key: it runs first */
  make_ready(s, q);
  if (key_depth) *key_depth = q->n + (q->running ? 1 : 0);
  if (inflight) *inflight = s->inflight;
  pthread_mutex_unlock(&s->mu);
}

int worker_sched_key_depth(worker_sched_t *s, const char *key, size_t len) {
  pthread_mutex_lock(&s->mu);
  keyq_t *q = find(s, key, len, false);
  int n = q ? q->n + (q->running ? 1 : 0) : 0;
  pthread_mutex_unlock(&s->mu);
  return n;
}

bool worker_sched_recording(worker_sched_t *s, worker_job_t *job, int cap) {
  pthread_mutex_lock(&s->mu);
  keyq_t *q = job->sched_key;
  assert(q->running && !q->recording);
  bool moved = s->recording < cap;
  if (moved) {
    q->recording = true;
    s->recording++;
    s->inflight--;
  }
  pthread_mutex_unlock(&s->mu);
  return moved;
}

int worker_sched_inflight(worker_sched_t *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->inflight;
  pthread_mutex_unlock(&s->mu);
  return n;
}

int worker_sched_drop(worker_sched_t *s, bool (*which)(void *ctx, const worker_job_t *job),
                      void (*dropped)(void *ctx, worker_job_t *job), void *ctx) {
  int n = 0;
  pthread_mutex_lock(&s->mu);
  for (int b = 0; b < NBUCKETS; b++)
    for (keyq_t *q = s->buckets[b], *nq; q; q = nq) {
      nq = q->chain;
      worker_job_t **link = &q->head, *head = q->head;
      q->tail = NULL;
      while (*link) {
        worker_job_t *job = *link;
        if (which(ctx, job)) {
          *link = job->next;
          q->n--;
          s->inflight--;
          dropped(ctx, job);
          n++;
        } else {
          q->tail = job;
          link = &job->next;
        }
      }
      if (q->head != head && q->head) { /* a new head: not deferred by what was dropped */
        undefer(s, q);
        make_ready(s, q);
      }
      if (!q->head && !q->running) {
        if (q->ready) { /* unlink from the ready list */
          keyq_t **r = &s->ready_head, *prev = NULL;
          while (*r != q) {
            prev = *r;
            r = &(*r)->next_ready;
          }
          *r = q->next_ready;
          if (s->ready_tail == q) s->ready_tail = prev;
        }
        forget(s, q);
      }
    }
  pthread_mutex_unlock(&s->mu);
  return n;
}
