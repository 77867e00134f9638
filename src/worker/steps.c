/* steps.c - the bounded steps of an event: retries with backoff, publishes to the ladder
 *
 * DESIGN: owns how one step of an event (a claim, a lookup, a recording, a publish, a release)
 * is retried: a retriable error again after a backoff (INFRA_BACKOFF_MIN_MS doubling to
 * INFRA_BACKOFF_MAX_MS), at most WORKER_INFRA_ATTEMPTS tries within WORKER_INFRA_TIMEOUT, a
 * non-retriable one never; "retry forever" is never an answer. Never decides what a failed step
 * means for the event (lifecycle.c and parking.c do). Reads nothing itself: the worker's bounds. */
#include <inttypes.h>
#include <stdatomic.h>
#include <time.h>

#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "worker_int.h"

/* Sleeps up to ms unless the worker stops; returns false when stopping. */
bool worker_nap(obx_worker_t *w, int64_t ms) {
  int64_t end = obx_time_now_ms() + ms;
  while (!atomic_load(&w->stop)) {
    int64_t left = end - obx_time_now_ms();
    if (left <= 0) return true;
    struct timespec ts = {0, (left > 50 ? 50 : left) * 1000000L};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* Naps *backoff_ms, then doubles it up to INFRA_BACKOFF_MAX_MS; false when stopping. */
bool worker_nap_backoff(obx_worker_t *w, int64_t *backoff_ms) {
  if (!worker_nap(w, *backoff_ms)) return false;
  *backoff_ms = *backoff_ms * 2 > INFRA_BACKOFF_MAX_MS ? INFRA_BACKOFF_MAX_MS : *backoff_ms * 2;
  return true;
}

/* Runs one step of an event until it succeeds, fails for good, spends its bounds or the worker
 * stops. tries caps the tries below the configured bound (1: no retry, the HTTP sink's caller
 * retries itself). A step after the pipeline ran (`finish`) is not abandoned by a stop before its
 * bounds: its retries only ever repeat the recording, never the run. */
step_result_t worker_retry_step(obx_worker_t *w, const char *what, const char *event_id, step_fn fn, void *ctx,
                                int tries, bool finish, obx_err_t *err) {
  int64_t backoff = INFRA_BACKOFF_MIN_MS, since = obx_time_now_ms();
  int max = tries > 0 && tries < w->infra_attempts ? tries : w->infra_attempts;
  for (int n = 1;; n++) {
    obx_health_stamp(what); /* a runner retrying a step goes round */
    obx_err_clear(err);
    if (fn(ctx, err)) return STEP_OK;
    if (!err->retriable) {
      obx_log_event(OBX_LOG_WARN, event_id, NULL, "%s failed (not retriable): %s", what, err->msg);
      return STEP_FAILED;
    }
    /* A stopping worker gives a finishing step three tries more at most: shutdown is bounded. */
    if (n >= max || obx_time_now_ms() - since >= w->infra_timeout_ms || (finish && atomic_load(&w->stop) && n >= 3)) {
      obx_log_event(OBX_LOG_WARN, event_id, NULL, "%s failed %d times in %" PRId64 " ms, giving up: %s", what, n,
                    obx_time_now_ms() - since, err->msg);
      return STEP_EXHAUSTED;
    }
    obx_log_event(OBX_LOG_WARN, event_id, NULL, "%s failed (try %d of %d), retrying: %s", what, n, max, err->msg);
    if (finish && atomic_load(&w->stop)) {
      struct timespec ts = {0, backoff * 1000000L};
      nanosleep(&ts, NULL);
      backoff = backoff * 2 > INFRA_BACKOFF_MAX_MS ? INFRA_BACKOFF_MAX_MS : backoff * 2;
    } else if (!worker_nap_backoff(w, &backoff)) {
      if (!finish) return STEP_STOPPED;
    }
  }
}

typedef struct {
  obx_worker_t *w;
  const obx_envelope_t *msg;
  int tier; /* retry tier, PUBLISH_DLQ or PUBLISH_WORK */
} publish_t;

static bool publish_step(void *ctx, obx_err_t *err) {
  publish_t *p = ctx;
  return p->tier >= 0 ? obx_ladder_publish_retry(p->w->ladder, p->msg, p->tier, err)
         : p->tier == PUBLISH_DLQ ? obx_ladder_publish_dlq(p->w->ladder, p->msg, err)
                                  : obx_ladder_publish_work(p->w->ladder, p->msg, err);
}

step_result_t worker_publish(obx_worker_t *w, const obx_envelope_t *msg, int tier, obx_err_t *err) {
  publish_t p = {.w = w, .msg = msg, .tier = tier};
  const char *what = tier >= 0 ? "publish to the retry tier" : tier == PUBLISH_DLQ ? "publish to the DLQ"
                                                                                   : "publish to the work queue";
  return worker_retry_step(w, what, msg->message_id, publish_step, &p, 0, true, err);
}
