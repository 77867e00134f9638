/* io.c - the worker's IO thread: every http-request call of the events in flight, in one multi handle
 *
 * DESIGN: owns a libcurl multi handle and the calls in it; never runs a pipeline node, records
 * or settles an event. A runner whose pipeline run stops at a call (obx_pipeline_run_waiting:
 * an easy handle the egress guard set up) hands the job here (worker_io_submit) and is free for
 * other keys. The IO thread adds the handle to its multi handle and drives every transfer at
 * once through libcurl's socket interface: the sockets libcurl asks for are in an epoll set
 * (CURLMOPT_SOCKETFUNCTION), libcurl's timeout is the wait's (CURLMOPT_TIMERFUNCTION), and only
 * the sockets that are ready are handed to curl_multi_socket_action, so a turn costs what is
 * ready, not every call in flight (a submit wakes the wait through an eventfd); when one ends
 * it puts the transfer's result on the job and gives the job back to the runners
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
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "worker_int.h"

#define IO_EVENTS 256   /* epoll events taken per wait */
#define IO_IDLE_MS 1000 /* longest wait with nothing due (the health stamp's turn) */

struct worker_io {
  worker_sched_t *sched;
  CURLM *multi;
  int epfd, wakefd;
  int64_t due_ms; /* libcurl's next timeout (CURLMOPT_TIMERFUNCTION), monotonic ms; -1: none */
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

/* CURLMOPT_SOCKETFUNCTION: the socket s joins, changes in or leaves the epoll set. */
static int io_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp) {
  (void)easy;
  worker_io_t *io = userp;
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(io->epfd, EPOLL_CTL_DEL, s, NULL); /* libcurl may have closed it already: ignored */
    curl_multi_assign(io->multi, s, NULL);
    return 0;
  }
  struct epoll_event ev = {.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u),
                           .data.fd = s};
  if (epoll_ctl(io->epfd, socketp ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, &ev) != 0 && errno == EEXIST)
    epoll_ctl(io->epfd, EPOLL_CTL_MOD, s, &ev);
  curl_multi_assign(io->multi, s, io); /* known from now on: the next change is a MOD */
  return 0;
}

/* CURLMOPT_TIMERFUNCTION: libcurl's next timeout, in timeout_ms from now (-1: none). */
static int io_timer(CURLM *multi, long timeout_ms, void *userp) {
  (void)multi;
  ((worker_io_t *)userp)->due_ms = timeout_ms < 0 ? -1 : obx_time_mono_ms() + timeout_ms;
  return 0;
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
    CURLMcode mc = curl_multi_add_handle(io->multi, job->call); /* sets a 0 ms timeout: started below */
    if (mc != CURLM_OK) { /* the call ends at once, failed: the run records it (transient) */
      obx_warn("an http-request call cannot be started: %s", curl_multi_strerror(mc));
      job->call_result = CURLE_FAILED_INIT;
      worker_sched_resume(io->sched, job);
      n--;
    }
  }
  return n;
}

/* Gives the ended calls' jobs back to the runners; returns how many ended. */
static int take_ended(worker_io_t *io) {
  int n = 0, left = 0;
  for (CURLMsg *m; (m = curl_multi_info_read(io->multi, &left));) {
    if (m->msg != CURLMSG_DONE) continue;
    CURL *easy = m->easy_handle;
    CURLcode rc = m->data.result;
    char *priv = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
    curl_multi_remove_handle(io->multi, easy);
    job_t *job = (job_t *)priv;
    job->call_result = rc;
    n++;
    worker_sched_resume(io->sched, job); /* the job is the runners' again: not touched after this */
  }
  return n;
}

static void *io_main(void *arg) {
  worker_io_t *io = arg;
  pthread_setname_np(pthread_self(), "obx-http-io");
  obx_log_set_role("worker");
  obx_health_register("worker", "http calls");
  int active = 0, running = 0;
  struct epoll_event evs[IO_EVENTS];
  /* a stopping worker's held runs still end: their calls are driven until none is left */
  while (!atomic_load(&io->stop) || active > 0) {
    active += take_submitted(io);
    /* libcurl's timeout, when due (a new handle's is at once): however busy the sockets are */
    while (io->due_ms >= 0 && io->due_ms <= obx_time_mono_ms()) {
      io->due_ms = -1;
      curl_multi_socket_action(io->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    active -= take_ended(io);
    obx_gauge_set(calls_gauge, (double)active);
    if (active) obx_health_stamp("driving http-request calls");
    else obx_health_idle();
    int64_t wait = io->due_ms < 0 ? IO_IDLE_MS : io->due_ms - obx_time_mono_ms();
    int n = epoll_wait(io->epfd, evs, IO_EVENTS, wait < 0 ? 0 : wait > IO_IDLE_MS ? IO_IDLE_MS : (int)wait);
    for (int i = 0; i < n; i++) {
      if (evs[i].data.fd == io->wakefd) {
        uint64_t v;
        ssize_t r = read(io->wakefd, &v, sizeof v); /* the submits are taken at the top */
        (void)r;
        continue;
      }
      int flags = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) | (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                  (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(io->multi, evs[i].data.fd, flags, &running);
    }
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
  io->epfd = io->wakefd = -1;
  io->due_ms = -1;
  pthread_mutex_init(&io->mu, NULL);
  struct epoll_event wake = {.events = EPOLLIN};
  if ((io->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 || (io->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
      (wake.data.fd = io->wakefd, epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->wakefd, &wake)) != 0) {
    obx_err_set(err, OBX_ERR_SYS, errno, false, "cannot set up the worker's IO thread: %s", strerror(errno));
    worker_io_stop(io);
    return NULL;
  }
  if (!(io->multi = curl_multi_init())) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "curl_multi_init failed");
    worker_io_stop(io);
    return NULL;
  }
  curl_multi_setopt(io->multi, CURLMOPT_SOCKETFUNCTION, io_socket);
  curl_multi_setopt(io->multi, CURLMOPT_SOCKETDATA, io);
  curl_multi_setopt(io->multi, CURLMOPT_TIMERFUNCTION, io_timer);
  curl_multi_setopt(io->multi, CURLMOPT_TIMERDATA, io);
  if (pthread_create(&io->thread, NULL, io_main, io) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the worker's IO thread");
    worker_io_stop(io);
    return NULL;
  }
  io->running = true;
  return io;
}

static void io_wake(worker_io_t *io) {
  uint64_t one = 1;
  ssize_t r = write(io->wakefd, &one, sizeof one); /* a counter at its limit still wakes the wait */
  (void)r;
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
  io_wake(io);
}

void worker_io_stop(worker_io_t *io) {
  if (!io) return;
  atomic_store(&io->stop, true);
  if (io->running) {
    io_wake(io);
    pthread_join(io->thread, NULL);
  }
  assert(!io->head); /* nothing is submitted once the runners stopped */
  if (io->multi) curl_multi_cleanup(io->multi);
  if (io->wakefd >= 0) close(io->wakefd);
  if (io->epfd >= 0) close(io->epfd);
  pthread_mutex_destroy(&io->mu);
  free(io);
}
