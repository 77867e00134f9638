/* api.c - the api role: MongoDB pool, its schema, routes, the order.pre hook
 *
 * DESIGN: obx_api_start never waits for MongoDB: an indexer thread ensures the collections
 * and indexes the api touches (obx_schema_ensure, OBX_SCHEMA_API), retrying every second until
 * it succeeds or the role stops. Until then POST /orders answers 503 (the unique indexes are
 * what turn a duplicate order number into 409) and /readyz reports the "api" check not ready.
 * The pool is a request pool (obx_mongo_new_for_requests): every MongoDB operation of a
 * request ends by api.request_timeout. Reads mongo.*, api.*. */
#include "api_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_log.h"
#include "obx/obx_schema.h"

#define API_INDEX_RETRY_MS 1000

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static obx_api_pre_hook_t pre_hook;

void obx_api_set_pre_hook(const obx_api_pre_hook_t *hook) {
  pthread_mutex_lock(&hook_mu);
  if (hook) pre_hook = *hook;
  else memset(&pre_hook, 0, sizeof pre_hook);
  pthread_mutex_unlock(&hook_mu);
}

obx_api_pre_hook_t obx_api_pre_hook(void) {
  pthread_mutex_lock(&hook_mu);
  obx_api_pre_hook_t hook = pre_hook;
  pthread_mutex_unlock(&hook_mu);
  return hook;
}

bool obx_api_indexes_ready(obx_api_t *api) {
  pthread_mutex_lock(&api->mu);
  bool ready = api->indexes_ready;
  pthread_mutex_unlock(&api->mu);
  return ready;
}

static bool api_ready(void *ctx, obx_err_t *err) {
  if (obx_api_indexes_ready(ctx)) return true;
  obx_err_set(err, OBX_ERR_MONGO, 0, true, "collections and indexes (obx_schema.h) not ensured yet");
  return false;
}

static void *api_indexer(void *arg) {
  obx_api_t *api = arg;
  obx_log_set_role("api");
  for (int attempt = 1;; attempt++) {
    obx_err_t err = OBX_ERR_INIT;
    /* The ping fails fast while MongoDB is down, so a stop is not held up by server selection. */
    bool ok = obx_mongo_ping(api->mongo, &err) &&
              obx_schema_ensure(api->mongo, api->conf, OBX_SCHEMA_API, &err);
    pthread_mutex_lock(&api->mu);
    if (ok) api->indexes_ready = true;
    if (!ok && !api->stopping) {
      if (attempt == 1 || attempt % 30 == 0) obx_warn("api schema (attempt %d): %s", attempt, err.msg);
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_sec += API_INDEX_RETRY_MS / 1000;
      pthread_cond_timedwait(&api->cond, &api->mu, &until);
    }
    bool done = ok || api->stopping;
    pthread_mutex_unlock(&api->mu);
    if (ok) obx_info("api schema ready");
    if (done) return NULL;
  }
}

/* api.default_currency was checked by the start-up validation (obx_conf_validate). */
void *obx_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  obx_mongo_t *mongo = obx_mongo_new_for_requests(conf, conf->api_request_timeout, err);
  if (!mongo) return NULL;
  obx_api_t *api = calloc(1, sizeof *api);
  api->mongo = mongo;
  api->conf = conf;
  api->currency = strdup(conf->order_currency);
  pthread_mutex_init(&api->mu, NULL);
  pthread_cond_init(&api->cond, NULL);
  pthread_create(&api->indexer, NULL, api_indexer, api);
  obx_http_add_ready_check(http, "api", api_ready, api);
  obx_orders_routes(api, http);
  return api;
}

void obx_api_stop(void *role) {
  obx_api_t *api = role;
  if (!api) return;
  pthread_mutex_lock(&api->mu);
  api->stopping = true;
  pthread_cond_signal(&api->cond);
  pthread_mutex_unlock(&api->mu);
  pthread_join(api->indexer, NULL);
  pthread_cond_destroy(&api->cond);
  pthread_mutex_destroy(&api->mu);
  free(api->currency);
  obx_mongo_destroy(api->mongo);
  free(api);
}
