/* keyseq.c - a key's gap in keySeq: an event waits, bounded, for its key's earlier event
 *
 * DESIGN: owns the decision, before an event's run, whether the writer's earlier event of its
 * key (keySeq n - 1, carried as ce_keyseq) has reached its outcome in this consumer's inbox, and
 * the wait when it has not (docs/worker-lifecycle.md, state waiting_gap). A key's queue in one
 * process is already in keySeq order (sched.c); across processes it is not: after the topic's
 * partition count grows, a key's old and new partitions may be read by two replicas, and event
 * n + 1 may come to one while event n is unread, queued or running on the other. So event n + 1
 * runs only once the inbox holds event n DONE, SKIPPED, BLOCKED, RETRYING or DEAD (the last three
 * park the key, whose parked_keys document then orders what follows), one index-bounded lookup
 * (obx_inbox_seq_settled; none when this process settled event n last: the key's steady state,
 * remembered per key hash slot), or when its own inbox entry exists (a redelivery: it was
 * admitted before, its wait is not made twice; one lookup by _id); else the job is deferred in
 * its key's queue (worker_sched_defer): no runner is held, the key's later events stay behind
 * it, other keys run. It is looked at again
 * when an earlier event of its key is queued in this process (sched.c runs that first, and this
 * one after it), else after a backoff (50 ms doubling to 1 s: the predecessor settles in a peer),
 * and runs anyway once WORKER_GAP_WAIT has passed since its wait began, with a warning naming the
 * key, the missing keySeq and the event, counted in outboxd_worker_keyseq_gaps_total{outcome=
 * "timeout"}. A deferred job is queued: a revoked partition or a stop gives it back like any
 * queued job. Only Kafka records wait: events without keySeq, keySeq 1, work-queue copies
 * (retries, released BLOCKED events, replays: their order is the ladder's and the parked key's)
 * and HTTP deliveries (their sender waits on the answer within a timeout of its own, which a
 * wait would spend; it delivers again after it) never do. Never claims, runs or records an
 * event (lifecycle.c does). */
#include <inttypes.h>
#include <pthread.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "obx/obx_log.h"
#include "worker_int.h"

#define GAP_BACKOFF_MIN_MS 50
#define GAP_BACKOFF_MAX_MS 1000

void worker_keyseq_settled(obx_worker_t *w, const job_t *job, worker_outcome_t outcome) {
  if (job->key_seq <= 0 || !(outcome == WORKER_DONE || outcome == WORKER_SKIPPED || outcome == WORKER_BLOCKED ||
                             outcome == WORKER_RETRYING || outcome == WORKER_DEAD))
    return;
  size_t klen;
  const char *key = obx_envelope_partition_key(&job->msg, &klen);
  uint64_t h = worker_key_hash(key, klen);
  pthread_mutex_lock(&w->settled_mu);
  w->settled[h % KEYSEQ_SETTLED_SLOTS].key_hash = h;
  w->settled[h % KEYSEQ_SETTLED_SLOTS].seq = job->key_seq;
  pthread_mutex_unlock(&w->settled_mu);
}

/* Whether this process settled the key's keySeq `seq` last (its slot may have gone to another key). */
static bool settled_here(obx_worker_t *w, const char *key, size_t len, int64_t seq) {
  uint64_t h = worker_key_hash(key, len);
  pthread_mutex_lock(&w->settled_mu);
  bool here = w->settled[h % KEYSEQ_SETTLED_SLOTS].key_hash == h && w->settled[h % KEYSEQ_SETTLED_SLOTS].seq == seq;
  pthread_mutex_unlock(&w->settled_mu);
  return here;
}

bool worker_keyseq_admit(obx_worker_t *w, job_t *job) {
  if (job->key_seq <= 1 || job->source != WORKER_SOURCE_KAFKA || w->gap_wait_ms <= 0) return true;
  size_t klen;
  const char *key = obx_envelope_partition_key(&job->msg, &klen);
  /* a key the inbox cannot store is the decoder's to refuse (lifecycle.c): nothing to wait for */
  if (klen == 0 || strnlen(key, klen) != klen || !bson_utf8_validate(key, klen, false)) return true;
  const char *id = job->msg.message_id ? job->msg.message_id : obx_envelope_header(&job->msg, "ce_id");
  int64_t missing = job->key_seq - 1, now = obx_time_now_ms();
  bool settled = settled_here(w, key, klen, missing), ok = true, known = false;
  obx_err_t err = OBX_ERR_INIT;
  if (!settled) { /* not by this process: the inbox says */
    mongoc_client_t *client = obx_mongo_pop(w->mongo);
    ok = obx_inbox_seq_settled(client, w->db, w->consumer, key, missing, &settled, &err);
    /* its own entry exists: a redelivery, admitted before (its order was decided then) */
    if (ok && !settled && !job->gap_since && id && bson_utf8_validate(id, strlen(id), false)) {
      bson_t doc = BSON_INITIALIZER;
      ok = obx_inbox_get(client, w->db, NULL, w->consumer, id, &doc, &known, &err);
      bson_destroy(&doc);
    }
    obx_mongo_push(w->mongo, client);
  }
  if (known) return true;
  if (!ok) /* MongoDB cannot say now: look again after the backoff, within the same bound */
    obx_log_event(OBX_LOG_DEBUG, id, NULL, "keySeq %" PRId64 " of key %s: cannot look it up: %s", missing, key,
                  err.msg);
  if (settled || (job->gap_since && now - job->gap_since >= w->gap_wait_ms)) {
    if (!job->gap_since) return true;
    if (settled) {
      obx_log_event(OBX_LOG_INFO, id, NULL, "keySeq %" PRId64 " of key %s settled after %" PRId64 " ms: runs now",
                    missing, key, now - job->gap_since);
      worker_count_keyseq_gap("filled");
    } else {
      obx_log_event(OBX_LOG_WARN, id, NULL,
                    "key %s: keySeq %" PRId64 " has not settled in the inbox of %s after %" PRId64
                    " ms (WORKER_GAP_WAIT): event %s (keySeq %" PRId64 ") runs without it",
                    key, missing, w->consumer, now - job->gap_since, id ? id : "(no id)", job->key_seq);
      worker_count_keyseq_gap("timeout");
    }
    worker_state_move(id, WORKER_WAITING_GAP, WORKER_QUEUED);
    job->gap_since = 0;
    return true;
  }
  if (!job->gap_since) {
    obx_log_event(OBX_LOG_INFO, id, NULL,
                  "key %s: keySeq %" PRId64 " has not settled in the inbox yet: keySeq %" PRId64
                  " waits for it (at most %" PRId64 " ms)",
                  key, missing, job->key_seq, w->gap_wait_ms);
    worker_state_move(id, WORKER_QUEUED, WORKER_WAITING_GAP);
    job->gap_since = now;
    job->gap_backoff = GAP_BACKOFF_MIN_MS;
  } else {
    job->gap_backoff = job->gap_backoff * 2 < GAP_BACKOFF_MAX_MS ? job->gap_backoff * 2 : GAP_BACKOFF_MAX_MS;
  }
  int64_t left = job->gap_since + w->gap_wait_ms - now;
  worker_sched_defer(w->sched, job, job->gap_backoff < left ? job->gap_backoff : left);
  return false;
}
