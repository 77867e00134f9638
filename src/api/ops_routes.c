/* ops_routes.c - the operators' HTTP API: outbox, inbox, DLQ
 *
 * DESIGN: thin handlers over obx_ops_* (src/lib/ops_outbox.c), which outboxctl calls too:
 * parse the query or body, call the operation with the API key's org, map its error
 * (obx_http_reply_err: NOT_FOUND 404, INPUT 400, CONFLICT 409, retriable 503). The HTTP server
 * has already checked the key, its permission and its rate limit. Runs with the api role; owns
 * its MongoDB pool and a ladder publisher (RabbitMQ is reached on the first DLQ request). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_auth.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"

#define OPS_WHO_HASH_DIGITS 16
#define OPS_MAX_REDRIVE_IDS 1000

typedef struct {
  obx_mongo_t *mongo;
  obx_ladder_t *ladder;
  obx_amqp_keeper_t *keeper; /* services the ladder's idle connection (heartbeats) */
  char *consumer;
} ops_api_t;

/* The request's operations context; who is "apikey:<hash prefix>" written into who_buf. */
static obx_ops_t request_ops(const ops_api_t *api, const obx_http_req_t *req, char *who_buf, size_t who_len) {
  const char *auth = obx_http_req_header(req, "Authorization");
  char hash[OBX_AUTH_HASH_LEN + 1] = "unknown";
  if (auth && strncmp(auth, "Bearer ", 7) == 0) obx_auth_hash(auth + 7, hash);
  snprintf(who_buf, who_len, "apikey:%.*s", OPS_WHO_HASH_DIGITS, hash);
  return (obx_ops_t){api->mongo, api->ladder, api->consumer, who_buf};
}

/* ?limit=N: 0 when absent; false (400 answered) when not an integer in range. */
static bool query_limit(obx_http_req_t *req, obx_http_resp_t *resp, int *limit) {
  const char *s = obx_http_req_query(req, "limit");
  *limit = 0;
  if (!s) return true;
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > OBX_OPS_MAX_LIMIT) {
    char detail[64];
    snprintf(detail, sizeof detail, "limit must be an integer from 1 to %d", OBX_OPS_MAX_LIMIT);
    obx_http_reply_problem(resp, 400, "Bad request", detail, NULL);
    return false;
  }
  *limit = (int)v;
  return true;
}

static void list_store(obx_http_req_t *req, obx_http_resp_t *resp, const ops_api_t *api, obx_ops_store_t store) {
  int limit;
  if (!query_limit(req, resp, &limit)) return;
  char who[32];
  obx_ops_t ops = request_ops(api, req, who, sizeof who);
  obx_err_t err = OBX_ERR_INIT;
  bson_t out = BSON_INITIALIZER;
  bool ok = obx_ops_list(&ops, store, obx_http_req_org(req), obx_http_req_query(req, "status"), limit, &out, &err);
  obx_http_reply_result(resp, ok, 200, &out, &err);
  bson_destroy(&out);
}

static void outbox_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  list_store(req, resp, ctx, OBX_OPS_OUTBOX);
}

static void inbox_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  list_store(req, resp, ctx, OBX_OPS_INBOX);
}

static void outbox_reprocess(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  char who[32];
  obx_ops_t ops = request_ops(ctx, req, who, sizeof who);
  obx_err_t err = OBX_ERR_INIT;
  bson_t out = BSON_INITIALIZER;
  bool ok = obx_ops_outbox_reprocess(&ops, obx_http_req_org(req), obx_http_req_param(req, "id"), &out, &err);
  obx_http_reply_result(resp, ok, 200, &out, &err);
  bson_destroy(&out);
}

static void inbox_replay(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  char who[32];
  obx_ops_t ops = request_ops(ctx, req, who, sizeof who);
  obx_err_t err = OBX_ERR_INIT;
  const char *id = obx_http_req_param(req, "id");
  bson_t out = BSON_INITIALIZER;
  bool ok = obx_ops_inbox_replay(&ops, obx_http_req_org(req), id, &err);
  BSON_APPEND_UTF8(&out, "eventId", id);
  BSON_APPEND_UTF8(&out, "replay", "queued");
  obx_http_reply_result(resp, ok, 202, &out, &err);
  bson_destroy(&out);
}

static void dlq_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  int limit;
  if (!query_limit(req, resp, &limit)) return;
  char who[32];
  obx_ops_t ops = request_ops(ctx, req, who, sizeof who);
  obx_err_t err = OBX_ERR_INIT;
  bson_t out = BSON_INITIALIZER;
  bool ok = obx_ops_dlq_list(&ops, obx_http_req_org(req), limit, &out, &err);
  obx_http_reply_result(resp, ok, 200, &out, &err);
  bson_destroy(&out);
}

/* Body {"ids": [...]} | {"all": true}, "dryRun": bool. ids are borrowed from body. */
static bool redrive_parse(const bson_t *body, const char **ids, int *nids, bool *all, bool *dry_run, char *why,
                          size_t whylen) {
  bson_iter_t it, arr;
  *nids = 0;
  *all = *dry_run = false;
  if (bson_iter_init_find(&it, body, "all")) {
    if (!BSON_ITER_HOLDS_BOOL(&it)) return snprintf(why, whylen, "all must be a boolean"), false;
    *all = bson_iter_bool(&it);
  }
  if (bson_iter_init_find(&it, body, "dryRun")) {
    if (!BSON_ITER_HOLDS_BOOL(&it)) return snprintf(why, whylen, "dryRun must be a boolean"), false;
    *dry_run = bson_iter_bool(&it);
  }
  if (bson_iter_init_find(&it, body, "ids")) {
    if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr))
      return snprintf(why, whylen, "ids must be an array of message ids"), false;
    while (bson_iter_next(&arr)) {
      if (!BSON_ITER_HOLDS_UTF8(&arr) || !*bson_iter_utf8(&arr, NULL))
        return snprintf(why, whylen, "ids must be an array of message ids"), false;
      if (*nids == OPS_MAX_REDRIVE_IDS)
        return snprintf(why, whylen, "at most %d ids per request", OPS_MAX_REDRIVE_IDS), false;
      ids[(*nids)++] = bson_iter_utf8(&arr, NULL);
    }
  }
  if (*all == (*nids > 0)) return snprintf(why, whylen, "give either a non-empty \"ids\" array or \"all\": true"), false;
  return true;
}

static void dlq_redrive(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  size_t len;
  const char *text = obx_http_req_body(req, &len);
  bson_t *body = len ? bson_new_from_json((const uint8_t *)text, (ssize_t)len, NULL) : NULL;
  const char **ids = calloc(OPS_MAX_REDRIVE_IDS, sizeof *ids);
  int nids = 0;
  bool all = false, dry_run = false;
  char why[96] = "the body must be a JSON object";
  if (!body || !redrive_parse(body, ids, &nids, &all, &dry_run, why, sizeof why)) {
    obx_http_reply_problem(resp, 400, "Bad request", why, NULL);
  } else {
    char who[32];
    obx_ops_t ops = request_ops(ctx, req, who, sizeof who);
    obx_err_t err = OBX_ERR_INIT;
    bson_t out = BSON_INITIALIZER;
    bool ok = obx_ops_dlq_redrive(&ops, obx_http_req_org(req), ids, nids, all, dry_run, &out, &err);
    obx_http_reply_result(resp, ok, 200, &out, &err);
    bson_destroy(&out);
  }
  free(ids);
  bson_destroy(body);
}

static void ladder_keep(void *ladder) { obx_ladder_tick(ladder); }

void *obx_ops_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  ops_api_t *api = calloc(1, sizeof *api);
  obx_ladder_opts_t lo = {.url = conf->amqp_url, .prefix = conf->worker_queue_prefix,
                          .tiers_ms = conf->retry_ladder.ms, .ntiers = conf->retry_ladder.n};
  obx_amqp_settings_from_conf(&lo.amqp, conf);
  if (!(api->mongo = obx_mongo_new(conf, err)) || !(api->ladder = obx_ladder_new(&lo, err))) {
    obx_ops_api_stop(api);
    return NULL;
  }
  int keep_ms = obx_amqp_keeper_interval_ms(&lo.amqp);
  if (keep_ms) api->keeper = obx_amqp_keeper_start(ladder_keep, api->ladder, keep_ms);
  api->consumer = strdup(conf->worker_group);
  obx_http_route(http, "GET", "/api/outbox", "outbox:read", outbox_list, api);
  obx_http_route(http, "POST", "/api/outbox/:id/reprocess", "outbox:reprocess", outbox_reprocess, api);
  obx_http_route(http, "GET", "/api/inbox", "inbox:read", inbox_list, api);
  obx_http_route(http, "POST", "/api/inbox/:id/replay", "inbox:replay", inbox_replay, api);
  obx_http_route(http, "GET", "/api/dlq", "dlq:read", dlq_list, api);
  obx_http_route(http, "POST", "/api/dlq/redrive", "dlq:redrive", dlq_redrive, api);
  return api;
}

void obx_ops_api_stop(void *state) {
  ops_api_t *api = state;
  if (!api) return;
  obx_amqp_keeper_stop(api->keeper);
  obx_ladder_destroy(api->ladder);
  obx_mongo_destroy(api->mongo);
  free(api->consumer);
  free(api);
}
