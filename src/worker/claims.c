/* claims.c - the inbox claims this process holds, and the keys whose claim it lost
 *
 * DESIGN: owns the list of events this process runs now (their leases are renewed together, a
 * third of WORKER_LEASE apart, by the work-queue thread) and the keys whose claim was taken over
 * while they ran (remembered per assignment generation, LOST_KEYS at most). Never claims, runs or
 * records an event (lifecycle.c does, through obx_inbox.h). */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_health.h"
#include "obx/obx_inbox.h"
#include "obx/obx_log.h"
#include "worker_int.h"

/* ---- claims: the events this process runs, their leases renewed by the work-queue thread ---- */

void worker_claims_add(obx_worker_t *w, const char *id) {
  pthread_mutex_lock(&w->claims_mu);
  if (w->nclaims == w->claims_cap) {
    w->claims_cap = w->claims_cap ? w->claims_cap * 2 : 16;
    w->claims = realloc(w->claims, (size_t)w->claims_cap * sizeof *w->claims);
    assert(w->claims);
  }
  snprintf(w->claims[w->nclaims++], OBX_UUID_LEN + 1, "%s", id);
  pthread_mutex_unlock(&w->claims_mu);
}

void worker_claims_remove(obx_worker_t *w, const char *id) {
  pthread_mutex_lock(&w->claims_mu);
  for (int i = 0; i < w->nclaims; i++)
    if (strcmp(w->claims[i], id) == 0) {
      memcpy(w->claims[i], w->claims[--w->nclaims], sizeof w->claims[i]);
      break;
    }
  pthread_mutex_unlock(&w->claims_mu);
}

/* Extends the leases of every event this process runs (one write; a third of the lease apart). */
void worker_claims_renew(obx_worker_t *w, mongoc_client_t *client) {
  pthread_mutex_lock(&w->claims_mu);
  int n = w->nclaims;
  char(*copy)[OBX_UUID_LEN + 1] = n ? malloc((size_t)n * sizeof *copy) : NULL;
  if (n) memcpy(copy, w->claims, (size_t)n * sizeof *copy);
  pthread_mutex_unlock(&w->claims_mu);
  if (!n) return;
  const char **ids = malloc((size_t)n * sizeof *ids);
  assert(ids);
  for (int i = 0; i < n; i++) ids[i] = copy[i];
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_renew(client, w->db, w->consumer, w->owner, ids, n, w->lease_ms, &err))
    obx_warn("renewing %d claims failed (a peer may take them over after the lease): %s", n, err.msg);
  free(ids);
  free(copy);
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
