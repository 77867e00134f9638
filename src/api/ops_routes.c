/* ops_routes.c - the operators' HTTP API over the ops module
 *
 * DESIGN: thin handlers over obx_ops_* (src/ops/), which outboxctl calls too: parse the query
 * or body, call the operation with the API key's org, map its error (obx_http_reply_err:
 * NOT_FOUND 404, INPUT 400, CONFLICT 409, retriable 503). The HTTP server has already checked
 * the key, its permission and its rate limit. Every mutating route takes "dryRun" in its JSON
 * body. The operator audit_log records is the API key's name (api.keys_file's fourth field,
 * api_keys' name), else "apikey:<first 16 hex digits of its sha256>" with whoFrom "api key hash". Runs with the api role; owns its MongoDB pool and a ladder publisher (RabbitMQ is
 * reached on the first request that needs it; an obx_amqp keeper services the idle connection's
 * heartbeats, so it survives idle periods). The routes (README "Operations: API, outboxctl, runbook"):
 *   GET  /api/status                     status:read       obx_ops_status
 *   GET  /api/outbox?status=&limit=&after=  outbox:read    obx_ops_list
 *   POST /api/outbox/:id/reprocess       outbox:reprocess  obx_ops_outbox_reprocess
 *   POST /api/outbox/:id/skip            outbox:reprocess  obx_ops_outbox_skip
 *   GET  /api/inbox?status=&limit=&after=   inbox:read     obx_ops_list
 *   GET  /api/inbox/:id                  inbox:read        obx_ops_inbox_get
 *   POST /api/inbox/:id/replay           inbox:replay      obx_ops_inbox_replay (202)
 *   POST /api/inbox/replay               inbox:replay      obx_ops_inbox_replay, filtered (202)
 *   GET  /api/dlq?<filters>&limit=&after=   dlq:read       obx_ops_dl_list
 *   GET  /api/dlq/export?<filters>       dlq:export        obx_ops_dl_export (application/x-ndjson)
 *   GET  /api/dlq/:id                    dlq:read          obx_ops_dl_get
 *   POST /api/dlq/redrive                dlq:redrive       obx_ops_dl_redrive
 *   POST /api/dlq/delete                 dlq:delete        obx_ops_dl_delete
 *   GET  /api/keys                       keys:read         obx_ops_keys_list
 *   POST /api/keys/:key/release          keys:release      obx_ops_key_release
 *   GET  /api/audit?action=&target=&since=&until=&limit=&after=  audit:read  obx_ops_audit_list */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_amqp.h"
#include "obx/obx_json.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"

#define OPS_WHO_HASH_DIGITS 16
#define OPS_MAX_IDS 1000
#define OPS_REPLAY_PREVIEW 20

typedef struct {
  obx_mongo_t *mongo;
  obx_ladder_t *ladder;
  obx_amqp_keeper_t *keeper; /* services the ladder's idle connection (heartbeats) */
  char *consumer;
} ops_api_t;

/* One operation called for a request: its context (the operator is the API key's name, else
 * "apikey:<first 16 hex digits of its sha256>", whoFrom saying which), the request's org, and
 * the answer and error the operation fills, sent by call_reply. Initialised in place (ops.who
 * points into it). */
typedef struct {
  obx_ops_t ops;
  const char *org;
  char who[80];
  bson_t out;
  obx_err_t err;
} ops_call_t;

static void call_init(ops_call_t *c, const ops_api_t *api, const obx_http_req_t *req) {
  const char *name = obx_http_req_key_name(req), *hash = obx_http_req_key_hash(req);
  if (name) snprintf(c->who, sizeof c->who, "%s", name);
  else snprintf(c->who, sizeof c->who, "apikey:%.*s", OPS_WHO_HASH_DIGITS, hash ? hash : "unknown");
  c->ops = (obx_ops_t){api->mongo, api->ladder, api->consumer, c->who, name ? "api key name" : "api key hash"};
  c->org = obx_http_req_org(req);
  bson_init(&c->out);
  c->err = (obx_err_t)OBX_ERR_INIT;
}

/* Answers ok ? status with the answer : the error (obx_http_reply_err); frees the answer. */
static void call_reply(ops_call_t *c, obx_http_resp_t *resp, bool ok, int status) {
  obx_http_reply_result(resp, ok, status, &c->out, &c->err);
  bson_destroy(&c->out);
}

static bool bad_request(obx_http_resp_t *resp, const char *fmt, const char *arg) {
  char detail[256];
  snprintf(detail, sizeof detail, fmt, arg);
  obx_http_reply_problem(resp, 400, "Bad request", detail, NULL);
  return false;
}

/* ?limit=N&after=C: false (400 answered) when limit is not an integer in range. */
static bool query_page(obx_http_req_t *req, obx_http_resp_t *resp, obx_ops_page_t *page) {
  const char *s = obx_http_req_query(req, "limit");
  page->limit = 0;
  page->after = obx_http_req_query(req, "after");
  if (!s) return true;
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > OBX_OPS_MAX_LIMIT) {
    char max[16];
    snprintf(max, sizeof max, "%d", OBX_OPS_MAX_LIMIT);
    return bad_request(resp, "limit must be an integer from 1 to %s", max);
  }
  page->limit = (int)v;
  return true;
}

/* An RFC 3339 time from the query (name) or the body; 0 when absent. */
static bool time_value(obx_http_resp_t *resp, const char *name, const char *s, int64_t *ms) {
  *ms = 0;
  if (!s) return true;
  if (!obx_time_parse_rfc3339(s, ms)) return bad_request(resp, "%s must be an RFC 3339 time", name);
  return true;
}

/* The JSON body as a document (an empty body is {}); NULL after answering 400. */
static bson_t *json_body(obx_http_req_t *req, obx_http_resp_t *resp) {
  size_t len;
  const char *text = obx_http_req_body(req, &len);
  bson_t *body = bson_new();
  obx_err_t err = OBX_ERR_INIT;
  if (!len || obx_json_parse(text, len, body, &err)) return body; /* no body: no options */
  char detail[320];
  snprintf(detail, sizeof detail, "the body must be one JSON object: %s", err.msg);
  obx_http_reply_problem(resp, 400, "Bad request", detail, NULL);
  bson_destroy(body);
  return NULL;
}

static bool body_bool(const bson_t *body, obx_http_resp_t *resp, const char *name, bool *v) {
  bson_iter_t it;
  *v = false;
  if (!bson_iter_init_find(&it, body, name)) return true;
  if (!BSON_ITER_HOLDS_BOOL(&it)) return bad_request(resp, "%s must be a boolean", name);
  *v = bson_iter_bool(&it);
  return true;
}

static bool body_str(const bson_t *body, obx_http_resp_t *resp, const char *name, const char **v) {
  bson_iter_t it;
  *v = NULL;
  if (!bson_iter_init_find(&it, body, name)) return true;
  if (!BSON_ITER_HOLDS_UTF8(&it)) return bad_request(resp, "%s must be a string", name);
  *v = bson_iter_utf8(&it, NULL);
  return true;
}

/* ---- outbox and inbox ------------------------------------------------------------------------ */

static void list_store(obx_http_req_t *req, obx_http_resp_t *resp, const ops_api_t *api, obx_ops_store_t store) {
  obx_ops_page_t page;
  if (!query_page(req, resp, &page)) return;
  ops_call_t c;
  call_init(&c, api, req);
  call_reply(&c, resp, obx_ops_list(&c.ops, store, c.org, obx_http_req_query(req, "status"), &page, &c.out, &c.err), 200);
}

static void outbox_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) { list_store(req, resp, ctx, OBX_OPS_OUTBOX); }
static void inbox_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) { list_store(req, resp, ctx, OBX_OPS_INBOX); }

typedef bool (*target_action_fn)(const obx_ops_t *ops, const char *org, const char *target, bool dry_run, bson_t *out,
                                 obx_err_t *err);

/* POST .../:param/<verb> with an optional {"dryRun": true}: fn on the one target the path names
 * (outbox reprocess and skip, key release). */
static void target_action(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx, const char *param, target_action_fn fn) {
  bson_t *body = json_body(req, resp);
  bool dry_run;
  if (body && body_bool(body, resp, "dryRun", &dry_run)) {
    ops_call_t c;
    call_init(&c, ctx, req);
    call_reply(&c, resp, fn(&c.ops, c.org, obx_http_req_param(req, param), dry_run, &c.out, &c.err), 200);
  }
  bson_destroy(body);
}

static void outbox_reprocess(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  target_action(req, resp, ctx, "id", obx_ops_outbox_reprocess);
}

static void outbox_skip(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  target_action(req, resp, ctx, "id", obx_ops_outbox_skip);
}

typedef bool (*get_fn)(const obx_ops_t *ops, const char *org, const char *id, bson_t *out, obx_err_t *err);

/* GET .../:id: the one document fn finds (one inbox entry, one dead letter). */
static void get_one(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx, get_fn fn) {
  ops_call_t c;
  call_init(&c, ctx, req);
  call_reply(&c, resp, fn(&c.ops, c.org, obx_http_req_param(req, "id"), &c.out, &c.err), 200);
}

static void inbox_get(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) { get_one(req, resp, ctx, obx_ops_inbox_get); }

/* POST /api/inbox/:id/replay (id) and POST /api/inbox/replay (filters in the body). */
static void inbox_replay(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  bson_t *body = json_body(req, resp);
  obx_ops_replay_filter_t f = {.org = obx_http_req_org(req), .event_id = obx_http_req_param(req, "id")};
  const char *since = NULL, *until = NULL;
  bool dry_run;
  if (body && body_bool(body, resp, "dryRun", &dry_run) && body_bool(body, resp, "includeFinished", &f.include_finished) &&
      body_str(body, resp, "status", &f.status) && body_str(body, resp, "type", &f.type) &&
      body_str(body, resp, "key", &f.key) && body_str(body, resp, "since", &since) &&
      body_str(body, resp, "until", &until) && time_value(resp, "since", since, &f.since_ms) &&
      time_value(resp, "until", until, &f.until_ms)) {
    if (!f.event_id && !f.type && !f.key && !f.status && !f.since_ms) {
      obx_http_reply_problem(resp, 400, "Bad request", "a filtered replay needs one of type, key, status, since", NULL);
    } else {
      ops_call_t c;
      call_init(&c, ctx, req);
      bool ok = obx_ops_inbox_replay(&c.ops, &f, dry_run, OPS_REPLAY_PREVIEW, NULL, NULL, &c.out, &c.err);
      call_reply(&c, resp, ok, dry_run ? 200 : 202);
    }
  }
  bson_destroy(body);
}

/* ---- dead letters ---------------------------------------------------------------------------- */

/* Filters from the query string (GET). */
static bool dl_query_filter(obx_http_req_t *req, obx_http_resp_t *resp, obx_ops_dl_filter_t *f) {
  *f = (obx_ops_dl_filter_t){.org = obx_http_req_org(req), .type = obx_http_req_query(req, "type"),
                             .key = obx_http_req_query(req, "key"), .failure_class = obx_http_req_query(req, "class"),
                             .reason = obx_http_req_query(req, "reason"), .state = obx_http_req_query(req, "state"),
                             .event_id = obx_http_req_query(req, "eventId")};
  return time_value(resp, "since", obx_http_req_query(req, "since"), &f->since_ms) &&
         time_value(resp, "until", obx_http_req_query(req, "until"), &f->until_ms);
}

static void dl_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  obx_ops_page_t page;
  obx_ops_dl_filter_t f;
  if (!query_page(req, resp, &page) || !dl_query_filter(req, resp, &f)) return;
  ops_call_t c;
  call_init(&c, ctx, req);
  call_reply(&c, resp, obx_ops_dl_list(&c.ops, &f, &page, &c.out, &c.err), 200);
}

static void dl_get(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) { get_one(req, resp, ctx, obx_ops_dl_get); }

static bool emit_ndjson(void *ctx, const bson_t *doc) {
  char *json = obx_json_render(doc, NULL, NULL);
  bson_string_append((bson_string_t *)ctx, json);
  bson_string_append_c((bson_string_t *)ctx, '\n');
  bson_free(json);
  return true;
}

static void dl_export(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  obx_ops_dl_filter_t f;
  if (!dl_query_filter(req, resp, &f)) return;
  ops_call_t c;
  call_init(&c, ctx, req);
  bson_string_t *text = bson_string_new(NULL);
  int64_t n = 0;
  if (obx_ops_dl_export(&c.ops, &f, emit_ndjson, text, &n, &c.err)) obx_http_reply(resp, 200, "application/x-ndjson", text->str, text->len);
  else obx_http_reply_err(resp, &c.err);
  bson_string_free(text, true);
  bson_destroy(&c.out);
}

/* Body {"ids": [...]} | {"all": true, <filters>}, "dryRun": bool. ids are borrowed from body. */
static bool dl_body_filter(obx_http_req_t *req, obx_http_resp_t *resp, const bson_t *body, const char **ids,
                           obx_ops_dl_filter_t *f, bool *dry_run) {
  *f = (obx_ops_dl_filter_t){.org = obx_http_req_org(req), .ids = ids};
  const char *since = NULL, *until = NULL;
  if (!body_bool(body, resp, "all", &f->all) || !body_bool(body, resp, "dryRun", dry_run) ||
      !body_str(body, resp, "type", &f->type) || !body_str(body, resp, "key", &f->key) ||
      !body_str(body, resp, "class", &f->failure_class) || !body_str(body, resp, "reason", &f->reason) ||
      !body_str(body, resp, "state", &f->state) || !body_str(body, resp, "eventId", &f->event_id) ||
      !body_str(body, resp, "since", &since) ||
      !body_str(body, resp, "until", &until) || !time_value(resp, "since", since, &f->since_ms) ||
      !time_value(resp, "until", until, &f->until_ms))
    return false;
  bson_iter_t it, arr;
  if (bson_iter_init_find(&it, body, "ids")) {
    if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr))
      return bad_request(resp, "%s must be an array of dead-letter ids", "ids");
    while (bson_iter_next(&arr)) {
      if (!BSON_ITER_HOLDS_UTF8(&arr) || !*bson_iter_utf8(&arr, NULL))
        return bad_request(resp, "%s must be an array of dead-letter ids", "ids");
      if (f->nids == OPS_MAX_IDS) return bad_request(resp, "at most %s ids per request", "1000");
      ids[f->nids++] = bson_iter_utf8(&arr, NULL);
    }
  }
  if (f->all == (f->nids > 0)) return bad_request(resp, "give either a non-empty \"ids\" array or \"all\": true%s", "");
  return true;
}

typedef bool (*dl_action_fn)(const obx_ops_t *, const obx_ops_dl_filter_t *, bool, bson_t *, obx_err_t *);

static void dl_action(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx, dl_action_fn fn) {
  bson_t *body = json_body(req, resp);
  const char **ids = calloc(OPS_MAX_IDS, sizeof *ids);
  obx_ops_dl_filter_t f;
  bool dry_run = false;
  if (body && dl_body_filter(req, resp, body, ids, &f, &dry_run)) {
    ops_call_t c;
    call_init(&c, ctx, req);
    call_reply(&c, resp, fn(&c.ops, &f, dry_run, &c.out, &c.err), 200);
  }
  free(ids);
  bson_destroy(body);
}

static void dl_redrive(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) { dl_action(req, resp, ctx, obx_ops_dl_redrive); }
static void dl_delete(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) { dl_action(req, resp, ctx, obx_ops_dl_delete); }

/* ---- keys, status, audit --------------------------------------------------------------------- */

static void keys_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  ops_call_t c;
  call_init(&c, ctx, req);
  call_reply(&c, resp, obx_ops_keys_list(&c.ops, c.org, &c.out, &c.err), 200);
}

static void key_release(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  target_action(req, resp, ctx, "key", obx_ops_key_release);
}

static void status_get(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  ops_call_t c;
  call_init(&c, ctx, req);
  call_reply(&c, resp, obx_ops_status(&c.ops, c.org, &c.out, &c.err), 200);
}

static void audit_list(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  obx_ops_page_t page;
  obx_ops_audit_filter_t f = {.org = obx_http_req_org(req), .action = obx_http_req_query(req, "action"),
                              .target = obx_http_req_query(req, "target")};
  if (!query_page(req, resp, &page) || !time_value(resp, "since", obx_http_req_query(req, "since"), &f.since_ms) ||
      !time_value(resp, "until", obx_http_req_query(req, "until"), &f.until_ms))
    return;
  ops_call_t c;
  call_init(&c, ctx, req);
  call_reply(&c, resp, obx_ops_audit_list(&c.ops, &f, &page, &c.out, &c.err), 200);
}

static void ladder_keep(void *ladder) { obx_ladder_tick(ladder); }

void *obx_ops_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  ops_api_t *api = calloc(1, sizeof *api);
  obx_ladder_opts_t lo = {.url = conf->amqp_url, .prefix = conf->worker_queue_prefix,
                          .tiers_ms = conf->retry_ladder.ms, .ntiers = conf->retry_ladder.n};
  obx_amqp_settings_from_conf(&lo.amqp, conf);
  if (!(api->mongo = obx_mongo_new_for_requests(conf, conf->api_request_timeout, err)) || !(api->ladder = obx_ladder_new(&lo, err))) {
    obx_ops_api_stop(api);
    return NULL;
  }
  int keep_ms = obx_amqp_keeper_interval_ms(&lo.amqp);
  if (keep_ms) api->keeper = obx_amqp_keeper_start(ladder_keep, api->ladder, keep_ms);
  api->consumer = strdup(conf->worker_group);
  obx_http_route(http, "GET", "/api/status", "status:read", status_get, api);
  obx_http_route(http, "GET", "/api/outbox", "outbox:read", outbox_list, api);
  obx_http_route(http, "POST", "/api/outbox/:id/reprocess", "outbox:reprocess", outbox_reprocess, api);
  obx_http_route(http, "POST", "/api/outbox/:id/skip", "outbox:reprocess", outbox_skip, api);
  obx_http_route(http, "GET", "/api/inbox", "inbox:read", inbox_list, api);
  obx_http_route(http, "POST", "/api/inbox/replay", "inbox:replay", inbox_replay, api);
  obx_http_route(http, "GET", "/api/inbox/:id", "inbox:read", inbox_get, api);
  obx_http_route(http, "POST", "/api/inbox/:id/replay", "inbox:replay", inbox_replay, api);
  obx_http_route(http, "GET", "/api/dlq", "dlq:read", dl_list, api);
  obx_http_route(http, "GET", "/api/dlq/export", "dlq:export", dl_export, api);
  obx_http_route(http, "GET", "/api/dlq/:id", "dlq:read", dl_get, api);
  obx_http_route(http, "POST", "/api/dlq/redrive", "dlq:redrive", dl_redrive, api);
  obx_http_route(http, "POST", "/api/dlq/delete", "dlq:delete", dl_delete, api);
  obx_http_route(http, "GET", "/api/keys", "keys:read", keys_list, api);
  obx_http_route(http, "POST", "/api/keys/:key/release", "keys:release", key_release, api);
  obx_http_route(http, "GET", "/api/audit", "audit:read", audit_list, api);
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
