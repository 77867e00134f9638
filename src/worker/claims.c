/* claims.c - the inbox claims this process holds, their lease renewal, and the keys whose claim
 * it lost
 *
 * DESIGN: owns the registry of the events this process runs now, whatever they wait on (a
 * runner, a pipeline's call, a recording), and the one thread that renews their leases
 * together, a third of WORKER_LEASE apart, on a MongoDB client of its own: no source loop, no
 * runner and no exhausted client pool can starve it, and it runs until the last run has ended
 * (it stops after the runners at shutdown). Each renewal learns which claims are no longer this
 * process's (taken over, moved on); such a claim, or one whose lease passed without a renewal
 * (MongoDB unreachable), is lost: its run stops before its next step and records nothing
 * (worker_claim_lost). Also the keys whose claim was taken over while they ran (remembered per
 * assignment generation, LOST_KEYS at most). Never claims, runs or records an event
 * (lifecycle.c does, through obx_inbox.h). */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_health.h"
#include "obx/obx_inbox.h"
#include "obx/obx_log.h"
#include "worker_int.h"

/* ---- the registry ------------------------------------------------------------------------------ */

void worker_claims_add(obx_worker_t *w, const char *id) {
  pthread_mutex_lock(&w->claims_mu);
  if (w->nclaims == w->claims_cap) {
    w->claims_cap = w->claims_cap ? w->claims_cap * 2 : 16;
    w->claims = realloc(w->claims, (size_t)w->claims_cap * sizeof *w->claims);
    assert(w->claims);
  }
  worker_claim_t *c = &w->claims[w->nclaims++];
  snprintf(c->id, sizeof c->id, "%s", id);
  c->until = obx_time_now_ms() + w->lease_ms; /* the claim was just written with this lease */
  c->lost = false;
  pthread_mutex_unlock(&w->claims_mu);
}

void worker_claims_remove(obx_worker_t *w, const char *id) {
  pthread_mutex_lock(&w->claims_mu);
  for (int i = 0; i < w->nclaims; i++)
    if (strcmp(w->claims[i].id, id) == 0) {
      w->claims[i] = w->claims[--w->nclaims];
      break;
    }
  pthread_mutex_unlock(&w->claims_mu);
}

bool worker_claim_lost(obx_worker_t *w, const char *id) {
  bool lost = false;
  int64_t now = obx_time_now_ms();
  pthread_mutex_lock(&w->claims_mu);
  for (int i = 0; i < w->nclaims; i++)
    if (strcmp(w->claims[i].id, id) == 0) {
      lost = w->claims[i].lost || now >= w->claims[i].until;
      break;
    }
  pthread_mutex_unlock(&w->claims_mu);
  return lost;
}

/* ---- the renewer ------------------------------------------------------------------------------- */

static int id_cmp(const void *a, const void *b) { return strcmp(a, b); }

/* One renewal of every registered claim (one write, one read back). The ids are copied, sorted,
 * into one array; a claim registered meanwhile is not in it and keeps its lease, one removed
 * meanwhile is not looked up. */
static void renew_all(obx_worker_t *w, mongoc_client_t *client) {
  pthread_mutex_lock(&w->claims_mu);
  int n = w->nclaims;
  if (n <= 0) {
    pthread_mutex_unlock(&w->claims_mu);
    return;
  }
  char(*ids)[OBX_UUID_LEN + 1] = malloc((size_t)n * sizeof *ids);
  assert(ids);
  for (int i = 0; i < n; i++) memcpy(ids[i], w->claims[i].id, sizeof ids[i]);
  pthread_mutex_unlock(&w->claims_mu);
  qsort(ids, (size_t)n, sizeof *ids, id_cmp);
  bool *held = malloc((size_t)n * sizeof *held);
  assert(held);
  obx_err_t err = OBX_ERR_INIT;
  int64_t at = obx_time_now_ms();
  if (!obx_inbox_renew(client, w->db, w->consumer, w->owner, (const char(*)[OBX_UUID_LEN + 1])ids, n, w->lease_ms, held,
                       &err)) {
    obx_warn("renewing %d claims failed (each is lost once its lease passes): %s", n, err.msg);
  } else {
    pthread_mutex_lock(&w->claims_mu);
    for (int j = 0; j < w->nclaims; j++) {
      worker_claim_t *c = &w->claims[j];
      const char(*found)[OBX_UUID_LEN + 1] = bsearch(c->id, ids, (size_t)n, sizeof *ids, id_cmp);
      if (!found) continue;
      bool still = held[found - ids];
      if (still && !c->lost) c->until = at + w->lease_ms;
      /* registered before this read; a run that has just recorded its outcome reads as lost too
       * and is removed at once (the run says so only when it stops: worker_claim_lost) */
      if (!still && at >= c->until - w->lease_ms) c->lost = true;
    }
    pthread_mutex_unlock(&w->claims_mu);
  }
  free(held);
  free(ids);
}

static void *renew_main(void *arg) {
  obx_worker_t *w = arg;
  pthread_setname_np(pthread_self(), "obx-leases");
  obx_log_set_role("worker");
  obx_health_register("worker", "lease renewal");
  mongoc_client_t *client = obx_mongo_pop(w->mongo); /* its own for its whole life */
  pthread_mutex_lock(&w->renew_mu);
  while (!w->renew_stop) {
    pthread_mutex_unlock(&w->renew_mu);
    obx_health_stamp("renewing the claims' leases");
    renew_all(w, client);
    obx_health_idle();
    struct timespec until = obx_time_deadline(CLOCK_REALTIME, w->lease_ms / 3);
    pthread_mutex_lock(&w->renew_mu);
    if (!w->renew_stop) pthread_cond_timedwait(&w->renew_cv, &w->renew_mu, &until);
  }
  pthread_mutex_unlock(&w->renew_mu);
  obx_mongo_push(w->mongo, client);
  obx_health_unregister();
  return NULL;
}

bool worker_claims_start(obx_worker_t *w, obx_err_t *err) {
  if (pthread_create(&w->renew_thread, NULL, renew_main, w) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot start the lease renewal thread");
    return false;
  }
  w->renew_running = true;
  return true;
}

void worker_claims_stop(obx_worker_t *w) {
  if (!w->renew_running) return;
  pthread_mutex_lock(&w->renew_mu);
  w->renew_stop = true;
  pthread_cond_signal(&w->renew_cv);
  pthread_mutex_unlock(&w->renew_mu);
  pthread_join(w->renew_thread, NULL);
  w->renew_running = false;
}

/* ---- keys whose claim was lost: after a pause (SIGSTOP, a stall past the lease) the Kafka
 * thread learns that its partitions moved only at its next poll, while the runner of a key would
 * go on with the key's next queued record. A key whose claim was taken over is remembered with
 * its assignment generation; its next records of that generation wait while a peer holds a live
 * claim on an event of the key (bounded by two leases), so none runs before the peer's earlier
 * event of the key is settled. */

/* Whether (key, generation) is remembered; with add, remembers it (the oldest goes). */
bool worker_lost_key(obx_worker_t *w, const char *key, size_t len, uint64_t generation, bool add) {
  bool found = false;
  pthread_mutex_lock(&w->claims_mu);
  for (int i = 0; i < LOST_KEYS && !found; i++)
    found = w->lost[i].key && w->lost[i].generation == generation && w->lost[i].len == len &&
            memcmp(w->lost[i].key, key, len) == 0;
  if (add && !found) {
    int i = w->nlost++ % LOST_KEYS;
    free(w->lost[i].key);
    w->lost[i].key = malloc(len + 1);
    assert(w->lost[i].key);
    memcpy(w->lost[i].key, key, len);
    w->lost[i].key[len] = '\0';
    w->lost[i].len = len;
    w->lost[i].generation = generation;
  }
  pthread_mutex_unlock(&w->claims_mu);
  return found;
}

void worker_wait_key_elsewhere(obx_worker_t *w, const char *key) {
  mongoc_client_t *client = obx_mongo_pop(w->mongo);
  int64_t deadline = obx_time_now_ms() + 2 * w->lease_ms, backoff = INFRA_BACKOFF_MIN_MS;
  bool claimed = true, logged = false;
  obx_err_t err = OBX_ERR_INIT;
  while (obx_time_now_ms() < deadline &&
         obx_inbox_key_claimed_elsewhere(client, w->db, w->consumer, key, w->owner, &claimed, &err) && claimed) {
    if (!logged) obx_info("key %.64s: a peer runs an event of it after this process lost a claim: waiting", key);
    logged = true;
    obx_health_stamp("waiting for a peer's event of the key");
    if (!worker_nap_backoff(w, &backoff)) break;
  }
  obx_mongo_push(w->mongo, client);
}
