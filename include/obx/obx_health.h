/* obx_health.h - liveness: every loop of every role stamps its progress; /healthz reads the stamps
 *
 * DESIGN: one process-wide registry of loops, like the metrics registry. A loop registers when
 * its thread starts (a role and a loop name, copied), stamps a monotonic time each time it goes
 * round (one atomic store; `doing` names the step it is about to take, a string literal), marks
 * itself idle while it waits for work that is not there (a runner with no key to run, an HTTP
 * handler with nothing queued: waiting for work is not being stuck) and unregisters when it ends.
 * A loop that waits on a broker in a bounded call (a Kafka poll, an AMQP read with a timeout)
 * stamps each time the call returns, so only a loop that stops going round gets old.
 * obx_health_stalls lists the busy loops whose last stamp is older than a bound; GET /healthz
 * (obx_http.h) answers 503 naming them when there is any. Thread-safe. */
#ifndef OBX_HEALTH_H
#define OBX_HEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  char role[32];   /* "relay", "worker", "http" */
  char loop[48];   /* "main", "kafka poll", "runner 2", "handler 5", "acceptor :8080" */
  char doing[48];  /* the step it was taking when it stamped last */
  int64_t age_ms;  /* since its last stamp */
} obx_health_stall_t;

/* The calling thread becomes a watched loop (busy, stamped now); role and loop are copied.
 * One loop per thread; it lasts until obx_health_unregister on the same thread. */
void obx_health_register(const char *role, const char *loop);
/* The calling thread's loop goes round: busy, stamped now, about to do `doing` (a string
 * literal). A no-op on a thread that registered no loop, so shared code may stamp freely. */
void obx_health_stamp(const char *doing);
/* The calling thread's loop waits for work that is not there: never stalled until its next stamp. */
void obx_health_idle(void);
/* The calling thread's loop ends (a no-op without one). */
void obx_health_unregister(void);
/* Fills up to max stalls (busy loops stamped more than bound_ms ago), oldest first; returns how
 * many loops are stalled (may exceed max). */
int obx_health_stalls(int64_t bound_ms, obx_health_stall_t *out, int max);

#endif
