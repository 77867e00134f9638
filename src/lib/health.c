/* health.c - the registry of loops and their progress stamps (obx_health.h)
 *
 * DESIGN: a doubly linked list under one mutex (registering, unregistering and reading are
 * rare: a thread's start and end, one probe every few seconds); the stamps themselves are
 * atomics the loops write without the lock. Times are CLOCK_MONOTONIC milliseconds, so a
 * wall-clock step never makes a loop look stalled. Never decides anything itself: /healthz
 * (http.c) asks it. */
#include "obx/obx_health.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_event.h"

typedef struct obx_health_loop obx_health_loop_t;
struct obx_health_loop {
  char role[32], loop[48];
  atomic_int_fast64_t stamp_ms;   /* monotonic; INT64_MAX while idle */
  _Atomic(const char *) doing;
  struct obx_health_loop *prev, *next;
};

static pthread_mutex_t health_mu = PTHREAD_MUTEX_INITIALIZER;
static obx_health_loop_t *health_loops;
static __thread obx_health_loop_t *health_self; /* the calling thread's loop */

void obx_health_register(const char *role, const char *loop) {
  obx_health_loop_t *l = calloc(1, sizeof *l);
  if (!l) abort();
  snprintf(l->role, sizeof l->role, "%s", role);
  snprintf(l->loop, sizeof l->loop, "%s", loop);
  atomic_store(&l->stamp_ms, obx_time_mono_ms());
  atomic_store(&l->doing, "starting");
  pthread_mutex_lock(&health_mu);
  l->next = health_loops;
  if (l->next) l->next->prev = l;
  health_loops = l;
  pthread_mutex_unlock(&health_mu);
  health_self = l;
}

void obx_health_stamp(const char *doing) {
  obx_health_loop_t *l = health_self;
  if (!l) return;
  atomic_store(&l->doing, doing);
  atomic_store(&l->stamp_ms, obx_time_mono_ms());
}

void obx_health_idle(void) {
  obx_health_loop_t *l = health_self;
  if (!l) return;
  atomic_store(&l->doing, "waiting for work");
  atomic_store(&l->stamp_ms, INT64_MAX);
}

void obx_health_unregister(void) {
  obx_health_loop_t *l = health_self;
  if (!l) return;
  health_self = NULL;
  pthread_mutex_lock(&health_mu);
  if (l->prev) l->prev->next = l->next;
  else health_loops = l->next;
  if (l->next) l->next->prev = l->prev;
  pthread_mutex_unlock(&health_mu);
  free(l);
}

int obx_health_stalls(int64_t bound_ms, obx_health_stall_t *out, int max) {
  int64_t now = obx_time_mono_ms();
  int n = 0;
  pthread_mutex_lock(&health_mu);
  for (obx_health_loop_t *l = health_loops; l; l = l->next) {
    int64_t stamp = atomic_load(&l->stamp_ms);
    if (stamp == INT64_MAX || now - stamp <= bound_ms) continue;
    obx_health_stall_t s;
    snprintf(s.role, sizeof s.role, "%s", l->role);
    snprintf(s.loop, sizeof s.loop, "%s", l->loop);
    snprintf(s.doing, sizeof s.doing, "%s", atomic_load(&l->doing));
    s.age_ms = now - stamp;
    /* insertion into out, oldest first; what does not fit is only counted */
    int at = n < max ? n : max;
    while (at > 0 && out[at - 1].age_ms < s.age_ms) {
      if (at < max) out[at] = out[at - 1];
      at--;
    }
    if (at < max) out[at] = s;
    n++;
  }
  pthread_mutex_unlock(&health_mu);
  return n;
}
