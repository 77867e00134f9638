/* obx_http.h - the HTTP server shared by every role (libmicrohttpd)
 *
 * DESIGN: one obx_http_t per process listens on HTTP_BIND:HTTP_PORT. One event thread
 * serves every connection; handlers run on a pool of HTTP_WORKERS threads, so they may block
 * on MongoDB (bounded by their own deadlines) without holding other connections. Requests
 * with ambiguous framing (two Content-Length headers, Content-Length with Transfer-Encoding)
 * answer 400 and close; connections are bounded in total, per client address, in the time
 * to send headers and in idle time (see http.c). Roles add routes at any time (the table is
 * read-locked per request). A route is a method, a path pattern whose `:name` segments
 * capture one segment each ("/orders/:id"), a required permission (NULL: public, no key
 * needed) and a handler.
 *
 * Before a handler runs the server has: read the whole body (more than HTTP_MAX_BODY bytes:
 * 413), matched the route (unknown path: 404; known path, other method: 405 with Allow) and,
 * for routes with a permission, checked the bearer API key (none or unknown: 401; key without
 * the permission: 403) and its rate limit (API_RATE_LIMIT requests/s, bursts of twice that:
 * 429 with Retry-After). Handlers read the caller's org with obx_http_req_org and must scope
 * every query to it. Errors are RFC 7807 application/problem+json:
 *   {"type": "about:blank" | "https://outboxd.dev/problems/<slug>", "title", "status", "detail",
 *    "errors": [{"field", "message"}]}
 * Built in: GET /healthz (200 while every watched loop makes progress, 503 naming the loops
 * stalled beyond health.stall_timeout: obx_health.h; the handler threads are watched loops),
 * GET /readyz (runs the readiness checks; 503 with the failing check's reason), GET /metrics
 * (Prometheus text).
 *
 * CORS (API_CORS_ORIGINS, empty: off): for an allowed Origin every response, errors included,
 * carries Access-Control-Allow-Origin (that origin), Vary: Origin and
 * Access-Control-Expose-Headers; its preflight (OPTIONS with Access-Control-Request-Method)
 * is answered 204 without a key, with Access-Control-Allow-Methods (the path's methods),
 * -Allow-Headers (Authorization, Content-Type, Idempotency-Key, X-Correlation-Id) and -Max-Age.
 * Other origins get no CORS headers. */
#ifndef OBX_HTTP_H
#define OBX_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <bson/bson.h>
#include "obx_conf.h"
#include "obx_err.h"

typedef struct obx_http obx_http_t;
typedef struct obx_http_req obx_http_req_t;   /* borrowed by the handler for one call */
typedef struct obx_http_resp obx_http_resp_t; /* filled by the handler */

/* Runs on a worker thread. Must set a response (a handler that sets none answers 500). */
typedef void (*obx_http_handler_t)(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx);
/* A readiness check: false with err set (its msg is shown by /readyz) when not ready. */
typedef bool (*obx_http_ready_fn_t)(void *ctx, obx_err_t *err);

/* Creates the server from http.bind, http.port, http.max_body, api.rate_limit, api.cors_origins,
 * health.stall_timeout and api.keys_file (the API keys are loaded here; a bad keys file or origin fails). Does not listen
 * yet. Returns owned. */
obx_http_t *obx_http_new(const obx_conf_t *conf, obx_err_t *err);
/* The parsers of http.bind and api.cors_origins: the one copy of their rules, which obx_http_new
 * and obx_http_start use and the start-up validation (obx_conf_validate) calls. A refusal sets
 * err naming the key, the value and what is allowed. */
/* http.bind: an IPv4 or IPv6 literal; *addr (caller storage) receives it with port. */
bool obx_http_bind_parse(const char *bind, int port, struct sockaddr_storage *addr, obx_err_t *err);
/* api.cors_origins: empty (off), "*" (any origin: *any) or comma-separated scheme://host[:port]
 * origins (http or https, no path; trailing '/' dropped). *origins receives them, NULL-terminated
 * and owned (obx_http_cors_free), also on failure. */
bool obx_http_cors_parse(const char *list, char ***origins, bool *any, obx_err_t *err);
void obx_http_cors_free(char **origins);
/* Starts listening (port 0 picks a free one, see obx_http_port). */
bool obx_http_start(obx_http_t *http, obx_err_t *err);
/* Stops accepting, waits for running handlers, closes the socket. Idempotent. */
void obx_http_stop(obx_http_t *http);
/* Stops if needed and frees; NULL is a no-op. Roles must be stopped first. */
void obx_http_destroy(obx_http_t *http);
/* The bound port after obx_http_start. */
int obx_http_port(const obx_http_t *http);
/* The API keys table (borrowed for the life of http), e.g. to watch api_keys. */
struct obx_auth *obx_http_auth(obx_http_t *http);

/* Adds a route; pattern and permission are copied, ctx is borrowed until obx_http_destroy.
 * A duplicate method+pattern is a bug (asserts). */
void obx_http_route(obx_http_t *http, const char *method, const char *pattern,
                    const char *permission, obx_http_handler_t handler, void *ctx);
/* Adds a /readyz check (name is copied, ctx borrowed). Checks run in order; the first failure
 * answers 503. */
void obx_http_add_ready_check(obx_http_t *http, const char *name, obx_http_ready_fn_t fn, void *ctx);

/* Request accessors; strings are borrowed for the handler call. */
const char *obx_http_req_body(const obx_http_req_t *req, size_t *len); /* NUL-terminated */
const char *obx_http_req_param(const obx_http_req_t *req, const char *name); /* ":name" of the pattern */
const char *obx_http_req_header(const obx_http_req_t *req, const char *name);
const char *obx_http_req_query(const obx_http_req_t *req, const char *name);
/* The API key's org (NULL on public routes). */
const char *obx_http_req_org(const obx_http_req_t *req);
/* The API key's name (NULL when it has none, and on public routes) and its SHA-256 hex (NULL on
 * public routes). */
const char *obx_http_req_key_name(const obx_http_req_t *req);
const char *obx_http_req_key_hash(const obx_http_req_t *req);

/* Responses. The body is copied. A later call replaces an earlier one. */
void obx_http_reply(obx_http_resp_t *resp, int status, const char *content_type, const char *body, size_t len);
/* Relaxed extended JSON of doc (Decimal128 as {"$numberDecimal": "..."}), application/json. */
void obx_http_reply_bson(obx_http_resp_t *resp, int status, const bson_t *doc);
/* application/problem+json; detail may be NULL; errors may be NULL or an array of
 * {field, message} documents. `type` is derived from title ("Validation failed" ->
 * ".../problems/validation-failed"). */
void obx_http_reply_problem(obx_http_resp_t *resp, int status, const char *title,
                            const char *detail, const bson_t *errors);
/* Problem reply for an obx_err_t: NOT_FOUND 404, INPUT 400, CONFLICT 409, retriable 503,
 * anything else 500 (detail = err->msg, except for 500s whose detail is generic and logged). */
void obx_http_reply_err(obx_http_resp_t *resp, const obx_err_t *err);
/* The answer of an operation: doc with status when ok, else obx_http_reply_err(err). */
void obx_http_reply_result(obx_http_resp_t *resp, bool ok, int status, const bson_t *doc, const obx_err_t *err);
/* Adds a response header (copied). */
void obx_http_resp_header(obx_http_resp_t *resp, const char *name, const char *value);
/* The status the handler replied with so far (0: none yet). */
int obx_http_resp_status(const obx_http_resp_t *resp);

#endif
