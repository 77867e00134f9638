/* pipelines_routes.c - the pipelines API, the order.pre hook and the start-up load
 *
 * DESIGN: runs with the api role (started by outboxd before the roles, so the hook is in
 * place before POST /orders is served). Owns a MongoDB pool of its own and the egress policy
 * of order.pre runs.
 *  - Routes, org-scoped by the API key: GET /api/pipelines, POST /api/pipelines,
 *    GET|PUT /api/pipelines/:id, GET /api/pipelines/:id/executions?limit=&before=&after=
 *    (pipelines:read / pipelines:write). Invalid definitions answer 422 naming the node or
 *    edge; a second enabled pipeline of a trigger 409.
 *  - order.pre (obx_api_pre_hook_t): execute looks the org's enabled order.pre pipeline up
 *    through a cache (PIPELINES_CACHE_TTL: saves through this process apply at once, other
 *    processes' within the TTL) and runs it before the order's transaction (HTTP calls
 *    included); commit writes its effects (status entries, emitted events, execution
 *    document) with the order's session; a FAILED run
 *    rejects the order (terminal: 422; transient: 503) and its execution document is recorded
 *    on its own, since no order transaction follows.
 *  - At start a thread creates the pipelines indexes, then applies PIPELINES_DIR, retrying
 *    both while MongoDB is unreachable. Stop is prompt: each attempt pings first (fails at
 *    once while MongoDB is down, instead of blocking in server selection) and the thread
 *    waits between attempts on a condition variable that stop signals. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_api.h"
#include "obx/obx_http.h"
#include "obx/obx_json.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_schema.h"

#define EXECUTIONS_DEFAULT_LIMIT 20
#define LOADER_RETRY_MS 2000

typedef struct {
  obx_mongo_t *mongo;
  const obx_conf_t *conf;       /* borrowed until stop */
  obx_egress_t egress;
  obx_pipeline_cache_t *cache;  /* order.pre lookups */
  char *pipelines_dir;
  pthread_t setup;              /* schema, then PIPELINES_DIR; retries while MongoDB is down */
  bool setup_started, stopping;
  pthread_mutex_t mu;
  pthread_cond_t cond;
} pipelines_api_t;

/* ---- routes ----------------------------------------------------------------------------- */

/* 422 for an invalid definition, with the node, edge or key at fault as the error's field
 * ("nodes.<id>", "edges.<index>", the key's path, else "definition"). */
static void reply_store_err(obx_http_resp_t *resp, const obx_err_t *err) {
  if (err->domain != OBX_ERR_PIPELINE) {
    obx_http_reply_err(resp, err);
    return;
  }
  char name[96], field[112] = "definition";
  int index;
  if (sscanf(err->msg, "key \"%95[^\"]\"", name) == 1)
    snprintf(field, sizeof field, "%s", name);
  else if (sscanf(err->msg, "node \"%95[^\"]\"", name) == 1)
    snprintf(field, sizeof field, "nodes.%s", name);
  else if (sscanf(err->msg, "edge %d ", &index) == 1)
    snprintf(field, sizeof field, "edges.%d", index);
  bson_t *errors = BCON_NEW("0", "{", "field", BCON_UTF8(field), "message", BCON_UTF8(err->msg), "}");
  obx_http_reply_problem(resp, 422, "Invalid pipeline", err->msg, errors);
  bson_destroy(errors);
}

static bson_t *parse_body(obx_http_req_t *req, obx_http_resp_t *resp) {
  size_t len;
  const char *body = obx_http_req_body(req, &len);
  obx_err_t err = OBX_ERR_INIT;
  bson_t *def = bson_new();
  if (obx_json_parse(body, len, def, &err)) return def;
  char detail[320];
  snprintf(detail, sizeof detail, "the body must be one JSON object (a pipeline definition): %s", err.msg);
  obx_http_reply_problem(resp, 400, "Bad request", detail, NULL);
  bson_destroy(def);
  return NULL;
}

static void pipelines_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  pipelines_api_t *api = ctx;
  obx_err_t err = OBX_ERR_INIT;
  bson_t out = BSON_INITIALIZER;
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  bool ok = obx_pipeline_store_list(client, obx_mongo_db_name(api->mongo), obx_http_req_org(req), &out, &err);
  obx_http_reply_result(resp, ok, 200, &out, &err);
  obx_mongo_push(api->mongo, client);
  bson_destroy(&out);
}

static void pipelines_get(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  pipelines_api_t *api = ctx;
  obx_err_t err = OBX_ERR_INIT;
  bson_t out = BSON_INITIALIZER;
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  bool ok = obx_pipeline_store_get(client, obx_mongo_db_name(api->mongo), obx_http_req_org(req),
                                   obx_http_req_param(req, "id"), &out, &err);
  obx_http_reply_result(resp, ok, 200, &out, &err);
  obx_mongo_push(api->mongo, client);
  bson_destroy(&out);
}

static void pipelines_save(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  pipelines_api_t *api = ctx;
  bson_t *def = parse_body(req, resp);
  if (!def) return;
  obx_err_t err = OBX_ERR_INIT;
  bson_t saved = BSON_INITIALIZER;
  const char *id = obx_http_req_param(req, "id"), *db = obx_mongo_db_name(api->mongo);
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  bool ok = id ? obx_pipeline_store_update(client, db, obx_http_req_org(req), id, def, &saved, &err)
               : obx_pipeline_store_create(client, db, obx_http_req_org(req), def, &saved, &err);
  obx_mongo_push(api->mongo, client);
  if (ok) {
    bson_iter_t it;
    if (!id && bson_iter_init_find(&it, &saved, "_id")) {
      char *location = bson_strdup_printf("/api/pipelines/%s", bson_iter_utf8(&it, NULL));
      obx_http_resp_header(resp, "Location", location);
      bson_free(location);
    }
    obx_http_reply_bson(resp, id ? 200 : 201, &saved);
  } else {
    reply_store_err(resp, &err);
  }
  bson_destroy(&saved);
  bson_destroy(def);
}

static void pipelines_executions(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  pipelines_api_t *api = ctx;
  const char *org = obx_http_req_org(req), *id = obx_http_req_param(req, "id"), *db = obx_mongo_db_name(api->mongo);
  const char *limit_s = obx_http_req_query(req, "limit");
  int limit = EXECUTIONS_DEFAULT_LIMIT;
  if (limit_s) {
    char *end;
    long v = strtol(limit_s, &end, 10);
    if (!*limit_s || *end || v < 1 || v > 200) {
      obx_http_reply_problem(resp, 400, "Bad request", "limit must be an integer from 1 to 200", NULL);
      return;
    }
    limit = (int)v;
  }
  obx_err_t err = OBX_ERR_INIT;
  bson_t pipeline = BSON_INITIALIZER, page = BSON_INITIALIZER;
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  bool ok = obx_pipeline_store_get(client, db, org, id, &pipeline, &err) &&
            obx_pipeline_store_executions(client, db, org, id, limit, obx_http_req_query(req, "before"),
                                          obx_http_req_query(req, "after"), &page, &err);
  obx_http_reply_result(resp, ok, 200, &page, &err);
  obx_mongo_push(api->mongo, client);
  bson_destroy(&page);
  bson_destroy(&pipeline);
}

/* ---- order.pre -------------------------------------------------------------------------- */

static bool record_failed_run(pipelines_api_t *api, obx_pipeline_run_t *run) {
  obx_err_t err = OBX_ERR_INIT;
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  bool ok = obx_pipeline_run_commit(run, client, obx_mongo_db_name(api->mongo), NULL, &err);
  obx_mongo_push(api->mongo, client);
  if (!ok) obx_warn("order.pre: execution %s not recorded: %s", obx_pipeline_run_execution_id(run), err.msg);
  return ok;
}

static bool pre_execute(void *ctx, const char *org_id, const bson_t *order, void **out, obx_err_t *err) {
  pipelines_api_t *api = ctx;
  obx_pipeline_t *pipeline = NULL;
  bson_iter_t it;
  *out = NULL;
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  bool ok = obx_pipeline_cache_find_enabled(api->cache, client, obx_mongo_db_name(api->mongo), org_id, "order.pre",
                                            &pipeline, err);
  obx_mongo_push(api->mongo, client);
  if (!ok || !pipeline) return ok;

  const char *order_id = bson_iter_init_find(&it, order, "_id") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
  bson_t context = BSON_INITIALIZER;
  obx_pipeline_context_from_order(order, &context);
  obx_pipeline_input_t in = {.context = &context, .org_id = org_id, .trigger = "order.pre",
                             .correlation_id = order_id, .aggregate_type = "Order", .aggregate_id = order_id,
                             .attempt = 1};
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, &in, &api->egress);
  if (obx_pipeline_run_status(run) == OBX_PIPELINE_FAILED) {
    const obx_err_t *rerr = obx_pipeline_run_error(run);
    obx_err_set(err, rerr->retriable ? rerr->domain : OBX_ERR_PIPELINE, rerr->code, rerr->retriable,
                "order.pre pipeline %s (execution %s): %s", obx_pipeline_id(pipeline),
                obx_pipeline_run_execution_id(run), rerr->msg);
    record_failed_run(api, run);
    obx_pipeline_run_destroy(run);
    ok = false;
  } else {
    *out = run;
  }
  bson_destroy(&context);
  obx_pipeline_destroy(pipeline);
  return ok;
}

static bool pre_commit(void *ctx, void *run, mongoc_client_session_t *session, obx_err_t *err) {
  pipelines_api_t *api = ctx;
  return obx_pipeline_run_commit(run, mongoc_client_session_get_client(session), obx_mongo_db_name(api->mongo),
                                 session, err);
}

static void pre_release(void *ctx, void *run) { obx_pipeline_run_destroy(run); }

/* ---- start-up: schema, then PIPELINES_DIR ---------------------------------------------- */

/* Waits LOADER_RETRY_MS or until stop; true when stopping. */
static bool setup_wait(pipelines_api_t *api) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += LOADER_RETRY_MS / 1000;
  pthread_mutex_lock(&api->mu);
  while (!api->stopping && pthread_cond_timedwait(&api->cond, &api->mu, &deadline) == 0) {
  }
  bool stop = api->stopping;
  pthread_mutex_unlock(&api->mu);
  return stop;
}

/* Applies PIPELINES_DIR once; false with err (retriable: try again) on failure. */
static bool apply_dir(pipelines_api_t *api, obx_err_t *err) {
  char *report = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&report, &len);
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  bool ok = obx_pipeline_store_apply_path(client, obx_mongo_db_name(api->mongo), api->pipelines_dir, false, out, err);
  obx_mongo_push(api->mongo, client);
  fclose(out);
  if (ok) obx_info("pipelines applied from %s:\n%s", api->pipelines_dir, report);
  else if (!err->retriable) obx_error("pipelines from %s:\n%s", api->pipelines_dir, report);
  free(report);
  return ok;
}

static bool ensure_schema(pipelines_api_t *api, obx_err_t *err) {
  return obx_schema_ensure(api->mongo, api->conf, OBX_SCHEMA_API, err);
}

/* Runs step until it succeeds or fails for good (logged); false when a stop came first.
 * Each attempt pings first: the ping fails at once while MongoDB is down, where the step's
 * pooled client would wait out server selection (5 s) and hold a stop up that long. Between
 * attempts the thread waits on the condition variable that stop signals. */
static bool setup_retry(pipelines_api_t *api, const char *what, bool (*step)(pipelines_api_t *, obx_err_t *)) {
  for (int attempt = 1;; attempt++) {
    obx_err_t err = OBX_ERR_INIT;
    if (obx_mongo_ping(api->mongo, &err) && step(api, &err)) return true;
    if (!err.retriable) {
      obx_error("%s: %s", what, err.msg);
      return true;
    }
    if (attempt == 1 || attempt % 30 == 0) obx_warn("%s (attempt %d): %s; retrying", what, attempt, err.msg);
    if (setup_wait(api)) return false;
  }
}

static void *setup_main(void *arg) {
  pipelines_api_t *api = arg;
  obx_log_set_role("api");
  if (setup_retry(api, "pipelines schema", ensure_schema) && api->pipelines_dir)
    setup_retry(api, "pipelines from PIPELINES_DIR", apply_dir);
  return NULL;
}

/* ---- start / stop ----------------------------------------------------------------------- */

void *obx_pipeline_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  pipelines_api_t *api = calloc(1, sizeof *api);
  pthread_mutex_init(&api->mu, NULL);
  pthread_cond_init(&api->cond, NULL);
  api->conf = conf;
  api->cache = obx_pipeline_cache_new(conf->pipeline_cache_ttl);
  if (conf->pipelines_dir && *conf->pipelines_dir) api->pipelines_dir = strdup(conf->pipelines_dir);
  if (!obx_egress_init_conf(&api->egress, conf, err) || !(api->mongo = obx_mongo_new_for_requests(conf, conf->api_request_timeout, err))) goto fail;
  if (pthread_create(&api->setup, NULL, setup_main, api) != 0) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "pipelines: cannot start the setup thread");
    goto fail;
  }
  api->setup_started = true;
  /* routes and hook last: once registered, api must live until the server stops */
  obx_http_route(http, "GET", "/api/pipelines", "pipelines:read", pipelines_list, api);
  obx_http_route(http, "POST", "/api/pipelines", "pipelines:write", pipelines_save, api);
  obx_http_route(http, "GET", "/api/pipelines/:id", "pipelines:read", pipelines_get, api);
  obx_http_route(http, "PUT", "/api/pipelines/:id", "pipelines:write", pipelines_save, api);
  obx_http_route(http, "GET", "/api/pipelines/:id/executions", "pipelines:read", pipelines_executions, api);
  obx_api_pre_hook_t hook = {pre_execute, pre_commit, pre_release, api};
  obx_api_set_pre_hook(&hook);
  return api;
fail:
  obx_pipeline_api_stop(api);
  return NULL;
}

void obx_pipeline_api_stop(void *state) {
  pipelines_api_t *api = state;
  if (!api) return;
  obx_api_set_pre_hook(NULL);
  pthread_mutex_lock(&api->mu);
  api->stopping = true;
  pthread_cond_broadcast(&api->cond);
  pthread_mutex_unlock(&api->mu);
  if (api->setup_started) pthread_join(api->setup, NULL);
  obx_mongo_destroy(api->mongo);
  obx_pipeline_cache_destroy(api->cache);
  obx_egress_cleanup(&api->egress);
  free(api->pipelines_dir);
  pthread_cond_destroy(&api->cond);
  pthread_mutex_destroy(&api->mu);
  free(api);
}
