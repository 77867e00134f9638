/* http.c - the HTTP server shared by every role (libmicrohttpd)
 *
 * DESIGN: connections are served by one event thread of ours driving MHD's epoll set (MHD in
 * external-loop mode): accepting, reading headers and bodies and writing answers never block,
 * so an idle or slow connection costs a socket and a little memory, no thread. The event loop
 * waits at most a tick (a quarter of health.stall_timeout, at most 1 s) and stamps its
 * progress each time round as the loop "acceptor :<port>" of role http (obx_health.h), so a
 * stuck event thread shows in /healthz (of the process's other listener: its own /healthz then
 * gets no answer at all); the thread is named "obx-http-<port>". Handlers, which may block on MongoDB, run on a fixed pool
 * of http.workers threads: when a request is complete the event thread suspends its
 * connection (MHD_suspend_connection) and queues it; a worker runs the route (route match
 * 404/405, bearer key check 401/403, the key's token bucket 429, handler) and resumes the
 * connection, whose answer the event thread then sends. The queue holds 16 requests per
 * worker; beyond that a request is answered 503 at once. The built-in probes (/healthz,
 * /readyz, /metrics) have a worker of their own, so they answer while every handler worker
 * waits on a hung MongoDB.
 *
 * Abuse bounds: a request whose framing is ambiguous (more than one Content-Length, a
 * Content-Length together with Transfer-Encoding; RFC 9112 6.3) is answered 400 as soon as its headers are read and the
 * connection is closed, so no byte after its headers is taken as a request (libmicrohttpd
 * 0.9.75 itself takes the first Content-Length, and lets chunked win over Content-Length).
 * Connections are capped in total (http.max_connections) and per client address
 * (http.max_connections_per_client; more are closed at accept). A connection has
 * http.header_timeout to send its request's headers, counted from its accept or from its
 * previous answer; a reaper thread shuts the socket of one that takes longer down (MHD then
 * closes it). No traffic at all for http.idle_timeout closes a connection too. Content-Length
 * above http.max_body is answered 413 before the body is read.
 *
 * Stopping quiesces the listener and waits up to 10 s for requests in flight; requests still
 * queued then are answered 503; the workers are joined before the event thread stops. The
 * route table grows under a write lock and is read under a read lock, so roles may register
 * routes while the server runs.
 *
 * CORS (api.cors_origins): a request whose Origin is allowed gets Access-Control-Allow-Origin
 * (its own origin echoed), Vary: Origin and Access-Control-Expose-Headers on every answer,
 * errors (401, 403, 404, 413, 429, problem+json) included; a preflight (OPTIONS with
 * Access-Control-Request-Method) from it is answered 204 before routing to a handler and
 * before the key check, with the methods of the path. Other origins get no CORS header at all
 * (their preflight is an ordinary OPTIONS: 405). Reads http.*, api.keys_file, api.rate_limit,
 * api.cors_origins. */
#include "obx/obx_http.h"
#include "obx/obx_event.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "obx/obx_auth.h"
#include "obx/obx_health.h"
#include "obx/obx_json.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"

#define HTTP_MAX_SEGMENTS 16
#define HTTP_MAX_HEADERS 8
#define HTTP_PROBLEM_BASE "https://outboxd.dev/problems/"
#define HTTP_DRAIN_MS 10000
#define HTTP_QUEUE_PER_WORKER 16
#define HTTP_CORS_MAX_AGE "600"
#define HTTP_CORS_ALLOW_HEADERS "Authorization, Content-Type, Idempotency-Key, X-Correlation-Id"
#define HTTP_CORS_EXPOSE_HEADERS "Location, Retry-After, Idempotent-Replayed, WWW-Authenticate"

typedef struct {
  char *method, *pattern, *permission;
  char *segs[HTTP_MAX_SEGMENTS];
  int nsegs;
  obx_http_handler_t handler;
  void *ctx;
} http_route_t;

typedef struct {
  char *name;
  obx_http_ready_fn_t fn;
  void *ctx;
} http_check_t;

/* Token bucket of one API key: refills at `rate` per second up to 2 * rate. */
typedef struct {
  double tokens;
  int64_t last_ns;
} http_bucket_t;

/* One open connection, for the header deadline: registered when MHD accepts it, removed
 * when MHD closes it (before its socket is closed), both under obx_http.conns_mu. */
typedef struct http_conn {
  int fd;
  int64_t since_ns;       /* accept or the previous answer; INT64_MAX once shut down */
  bool in_request;        /* headers received, answer not yet sent */
  struct http_conn *prev, *next;
} http_conn_t;

/* A fixed set of threads running queued requests (see DESIGN). */
typedef struct {
  obx_http_t *http;
  pthread_t *threads;
  int nthreads;
  pthread_mutex_t mu;      /* everything below */
  pthread_cond_t cv;
  obx_http_req_t **queue;  /* ring of cap entries */
  int cap, head, n;
  bool stopping;           /* queued requests are answered 503, then the threads exit */
  const char *watch;       /* loop name of its threads for /healthz ("handler"); NULL: not watched */
  atomic_int started;      /* threads that took their number */
} http_pool_t;

struct obx_http {
  struct MHD_Daemon *daemon;
  obx_auth_t *auth;
  char *bind;
  int port;
  size_t max_body;
  pthread_rwlock_t lock; /* routes, checks */
  http_route_t *routes;
  int nroutes, caproutes;
  http_check_t *checks;
  int nchecks;
  atomic_int busy;              /* requests between their first byte and their completion */
  int64_t rate;                 /* api.rate_limit: requests/s per key, 0: unlimited */
  pthread_mutex_t rate_mu;      /* buckets */
  http_bucket_t *buckets;       /* one per API key, by obx_auth_key_t.index; grows with api_keys */
  int nbuckets;
  obx_counter_t *requests;      /* registered once in obx_http_new */
  obx_histogram_t *latency;
  char **cors_origins;          /* api.cors_origins without trailing '/'; NULL-terminated */
  bool cors_any;                /* "*" among them */
  int workers;                  /* http.workers */
  unsigned max_conns, max_conns_per_client, idle_timeout_s;
  int64_t header_timeout_ns;    /* http.header_timeout */
  int64_t stall_ms;             /* health.stall_timeout: /healthz fails beyond it */
  http_pool_t handlers, probes; /* route handlers; the built-in probes */
  pthread_mutex_t conns_mu;     /* conns, reaper_stop */
  pthread_cond_t conns_cv;
  http_conn_t *conns;
  bool reaper_stop, reaper_started;
  pthread_t reaper;
  pthread_t events;             /* the event loop (http_events) */
  bool events_started;
  atomic_bool events_stop;
  int wake_fd;                  /* eventfd: wakes the event loop to stop */
  obx_counter_t *refused;       /* requests or connections refused before any handler */
};

typedef enum { REQ_READING, REQ_QUEUED, REQ_ANSWERED } http_req_state_t;

struct obx_http_resp {
  int status;
  char *content_type;
  char *body;
  size_t len;
  char *headers[HTTP_MAX_HEADERS][2];
  int nheaders;
};

struct obx_http_req {
  struct MHD_Connection *conn;
  const char *method, *path;
  char *body;
  size_t len, cap;
  bool too_large;
  http_req_state_t state;
  bool close;                            /* answer with Connection: close */
  const char *origin;                    /* the allowed CORS Origin, or NULL */
  obx_http_resp_t resp;                  /* filled by a worker, sent by the event thread */
  int64_t start_ns;
  const char *route;                     /* the matched pattern (metrics label) */
  const char *org;
  const char *key_name, *key_hash;       /* the API key's, borrowed from the key table */
  char *path_copy;                       /* path split at '/', params point into it */
  const char *param_names[HTTP_MAX_SEGMENTS];
  const char *param_values[HTTP_MAX_SEGMENTS];
  int nparams;
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- responses ---------------------------------------------------------------------------- */

void obx_http_reply(obx_http_resp_t *resp, int status, const char *content_type, const char *body, size_t len) {
  free(resp->content_type);
  free(resp->body);
  resp->status = status;
  resp->content_type = strdup(content_type);
  resp->body = malloc(len + 1);
  memcpy(resp->body, body, len);
  resp->body[len] = '\0';
  resp->len = len;
}

void obx_http_reply_bson(obx_http_resp_t *resp, int status, const bson_t *doc) {
  size_t len;
  char *json = obx_json_render(doc, &len, NULL);
  obx_http_reply(resp, status, "application/json", json, len);
  bson_free(json);
}

void obx_http_reply_problem(obx_http_resp_t *resp, int status, const char *title, const char *detail,
                            const bson_t *errors) {
  char type[128] = HTTP_PROBLEM_BASE;
  size_t n = strlen(type);
  for (const char *c = title; *c && n + 1 < sizeof type; c++) {
    if (isalnum((unsigned char)*c)) type[n++] = (char)tolower((unsigned char)*c);
    else if (type[n - 1] != '-') type[n++] = '-';
  }
  while (type[n - 1] == '-') n--;
  type[n] = '\0';
  bson_t doc = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&doc, "type", type);
  BSON_APPEND_UTF8(&doc, "title", title);
  BSON_APPEND_INT32(&doc, "status", status);
  if (detail) BSON_APPEND_UTF8(&doc, "detail", detail);
  if (errors) BSON_APPEND_ARRAY(&doc, "errors", errors);
  size_t len;
  char *json = obx_json_render(&doc, &len, NULL);
  obx_http_reply(resp, status, "application/problem+json", json, len);
  bson_free(json);
  bson_destroy(&doc);
}

void obx_http_reply_err(obx_http_resp_t *resp, const obx_err_t *err) {
  switch (err->domain) {
  case OBX_ERR_NOT_FOUND: obx_http_reply_problem(resp, 404, "Not found", err->msg, NULL); return;
  case OBX_ERR_INPUT: obx_http_reply_problem(resp, 400, "Bad request", err->msg, NULL); return;
  case OBX_ERR_CONFLICT: obx_http_reply_problem(resp, 409, "Conflict", err->msg, NULL); return;
  default: break;
  }
  if (err->retriable) {
    obx_warn("request failed, retriable: %s", err->msg);
    obx_http_resp_header(resp, "Retry-After", "1");
    obx_http_reply_problem(resp, 503, "Service unavailable", err->msg, NULL);
    return;
  }
  obx_error("request failed: %s (%s %d)", err->msg, obx_err_domain_name(err->domain), err->code);
  obx_http_reply_problem(resp, 500, "Internal error", "the request failed; see the server log", NULL);
}

void obx_http_reply_result(obx_http_resp_t *resp, bool ok, int status, const bson_t *doc, const obx_err_t *err) {
  if (ok) obx_http_reply_bson(resp, status, doc);
  else obx_http_reply_err(resp, err);
}

int obx_http_resp_status(const obx_http_resp_t *resp) { return resp->status; }

void obx_http_resp_header(obx_http_resp_t *resp, const char *name, const char *value) {
  assert(resp->nheaders < HTTP_MAX_HEADERS);
  resp->headers[resp->nheaders][0] = strdup(name);
  resp->headers[resp->nheaders][1] = strdup(value);
  resp->nheaders++;
}

static void resp_cleanup(obx_http_resp_t *resp) {
  for (int i = 0; i < resp->nheaders; i++) {
    free(resp->headers[i][0]);
    free(resp->headers[i][1]);
  }
  free(resp->content_type);
  free(resp->body);
}

/* ---- request accessors -------------------------------------------------------------------- */

const char *obx_http_req_org(const obx_http_req_t *req) { return req->org; }
const char *obx_http_req_key_name(const obx_http_req_t *req) { return req->key_name; }
const char *obx_http_req_key_hash(const obx_http_req_t *req) { return req->key_hash; }

const char *obx_http_req_body(const obx_http_req_t *req, size_t *len) {
  if (len) *len = req->len;
  return req->body ? req->body : "";
}

const char *obx_http_req_param(const obx_http_req_t *req, const char *name) {
  for (int i = 0; i < req->nparams; i++)
    if (strcmp(req->param_names[i], name) == 0) return req->param_values[i];
  return NULL;
}

const char *obx_http_req_header(const obx_http_req_t *req, const char *name) {
  return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *obx_http_req_query(const obx_http_req_t *req, const char *name) {
  return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* ---- routes ------------------------------------------------------------------------------- */

/* Splits s (modified) at '/' into segs; false when there are too many. Empty segments
 * (a trailing or doubled '/') are skipped. */
static bool split_path(char *s, char **segs, int *nsegs) {
  char *save = NULL;
  *nsegs = 0;
  for (char *tok = strtok_r(s, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
    if (*nsegs == HTTP_MAX_SEGMENTS) return false;
    segs[(*nsegs)++] = tok;
  }
  return true;
}

void obx_http_route(obx_http_t *http, const char *method, const char *pattern, const char *permission,
                    obx_http_handler_t handler, void *ctx) {
  http_route_t route = {.method = strdup(method), .pattern = strdup(pattern),
                        .permission = permission ? strdup(permission) : NULL, .handler = handler, .ctx = ctx};
  char *copy = strdup(pattern), *segs[HTTP_MAX_SEGMENTS];
  if (!split_path(copy, segs, &route.nsegs)) {
    fprintf(stderr, "%s:%d: route %s has more than %d segments\n", __FILE__, __LINE__, pattern, HTTP_MAX_SEGMENTS);
    abort();
  }
  for (int i = 0; i < route.nsegs; i++) route.segs[i] = strdup(segs[i]);
  free(copy);
  pthread_rwlock_wrlock(&http->lock);
  for (int i = 0; i < http->nroutes; i++)
    assert(!(strcmp(http->routes[i].method, method) == 0 && strcmp(http->routes[i].pattern, pattern) == 0));
  if (http->nroutes == http->caproutes) {
    http->caproutes = http->caproutes ? 2 * http->caproutes : 16;
    http->routes = realloc(http->routes, (size_t)http->caproutes * sizeof *http->routes);
  }
  http->routes[http->nroutes++] = route;
  pthread_rwlock_unlock(&http->lock);
}

void obx_http_add_ready_check(obx_http_t *http, const char *name, obx_http_ready_fn_t fn, void *ctx) {
  pthread_rwlock_wrlock(&http->lock);
  http->checks = realloc(http->checks, (size_t)(http->nchecks + 1) * sizeof *http->checks);
  http->checks[http->nchecks++] = (http_check_t){strdup(name), fn, ctx};
  pthread_rwlock_unlock(&http->lock);
}

static bool route_matches(const http_route_t *route, char **segs, int nsegs) {
  if (route->nsegs != nsegs) return false;
  for (int i = 0; i < nsegs; i++)
    if (route->segs[i][0] != ':' && strcmp(route->segs[i], segs[i]) != 0) return false;
  return true;
}

typedef enum { MATCH_NONE, MATCH_PATH_ONLY, MATCH_OK } http_match_t;

/* Finds the route for req; on MATCH_OK copies it to *out (its strings stay valid: routes are
 * never removed) and fills req's params; on MATCH_PATH_ONLY fills allow ("GET, POST"). */
static http_match_t http_match(obx_http_t *http, obx_http_req_t *req, http_route_t *out, char *allow, size_t allowlen) {
  char *segs[HTTP_MAX_SEGMENTS];
  int nsegs;
  http_match_t match = MATCH_NONE;
  req->path_copy = strdup(req->path);
  if (!split_path(req->path_copy, segs, &nsegs)) return MATCH_NONE;
  allow[0] = '\0';
  pthread_rwlock_rdlock(&http->lock);
  for (int i = 0; i < http->nroutes && match != MATCH_OK; i++) {
    const http_route_t *route = &http->routes[i];
    if (!route_matches(route, segs, nsegs)) continue;
    if (strcmp(route->method, req->method) != 0) {
      match = MATCH_PATH_ONLY;
      if (!strstr(allow, route->method)) {
        size_t n = strlen(allow);
        snprintf(allow + n, allowlen - n, "%s%s", n ? ", " : "", route->method);
      }
      continue;
    }
    match = MATCH_OK;
    *out = *route;
    for (int s = 0; s < nsegs; s++) {
      if (route->segs[s][0] != ':') continue;
      req->param_names[req->nparams] = route->segs[s] + 1;
      req->param_values[req->nparams++] = segs[s];
    }
  }
  pthread_rwlock_unlock(&http->lock);
  return match;
}

/* Takes one token from the key's bucket; 429 with Retry-After when it is empty. */
static bool http_rate_take(obx_http_t *http, const obx_auth_key_t *key, obx_http_resp_t *resp) {
  if (http->rate <= 0) return true;
  int64_t now = now_ns();
  double cap = 2.0 * (double)http->rate;
  pthread_mutex_lock(&http->rate_mu);
  if (key->index >= http->nbuckets) {
    int n = obx_auth_count(http->auth);
    http->buckets = realloc(http->buckets, (size_t)n * sizeof *http->buckets);
    memset(http->buckets + http->nbuckets, 0, (size_t)(n - http->nbuckets) * sizeof *http->buckets);
    http->nbuckets = n;
  }
  http_bucket_t *b = &http->buckets[key->index];
  b->tokens = b->last_ns ? b->tokens + (double)(now - b->last_ns) / 1e9 * (double)http->rate : cap;
  if (b->tokens > cap) b->tokens = cap;
  b->last_ns = now;
  bool ok = b->tokens >= 1.0;
  if (ok) b->tokens -= 1.0;
  double wait_s = ok ? 0 : (1.0 - b->tokens) / (double)http->rate;
  pthread_mutex_unlock(&http->rate_mu);
  if (ok) return true;
  char retry[16], detail[96];
  snprintf(retry, sizeof retry, "%d", (int)wait_s + 1);
  snprintf(detail, sizeof detail, "more than %lld requests per second with this API key", (long long)http->rate);
  obx_http_resp_header(resp, "Retry-After", retry);
  obx_http_reply_problem(resp, 429, "Too many requests", detail, NULL);
  return false;
}

/* 401/403 per DESIGN.md §7, then the key's rate limit; sets req->org and the key's name and
 * hash on success (entries live as long as the table: obx_auth_find). */
static bool http_authorize(obx_http_t *http, obx_http_req_t *req, const char *permission, obx_http_resp_t *resp) {
  const char *authz = obx_http_req_header(req, MHD_HTTP_HEADER_AUTHORIZATION);
  const obx_auth_key_t *key = NULL;
  if (authz && strncasecmp(authz, "Bearer ", 7) == 0) key = obx_auth_find(http->auth, authz + 7);
  if (!key) {
    obx_http_resp_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"outboxd\"");
    obx_http_reply_problem(resp, 401, "Unauthorized",
                           authz ? "the API key is not valid" : "an Authorization: Bearer <API key> header is required", NULL);
    return false;
  }
  if (!obx_auth_key_allows(key, permission)) {
    char detail[160];
    snprintf(detail, sizeof detail, "the API key lacks the permission %s", permission);
    obx_http_reply_problem(resp, 403, "Forbidden", detail, NULL);
    return false;
  }
  if (!http_rate_take(http, key, resp)) return false;
  req->org = key->org_id;
  req->key_name = key->name;
  req->key_hash = key->hash;
  return true;
}

static void http_dispatch(obx_http_t *http, obx_http_req_t *req, obx_http_resp_t *resp) {
  http_route_t route;
  char allow[128];
  switch (http_match(http, req, &route, allow, sizeof allow)) {
  case MATCH_NONE:
    obx_http_reply_problem(resp, 404, "Not found", "no such resource", NULL);
    return;
  case MATCH_PATH_ONLY:
    obx_http_resp_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    obx_http_reply_problem(resp, 405, "Method not allowed", "see the Allow header", NULL);
    return;
  case MATCH_OK:
    req->route = route.pattern;
    break;
  }
  if (route.permission && !http_authorize(http, req, route.permission, resp)) return;
  route.handler(req, resp, route.ctx);
  if (resp->status == 0) {
    obx_error("handler %s %s set no response", route.method, route.pattern);
    obx_http_reply_problem(resp, 500, "Internal error", "the request failed; see the server log", NULL);
  }
}

/* ---- CORS --------------------------------------------------------------------------------- */

bool obx_http_cors_parse(const char *list, char ***origins, bool *any, obx_err_t *err) {
  char *copy = strdup(list), *save = NULL;
  int n = 0;
  bool ok = true;
  *any = false;
  *origins = calloc(1, sizeof **origins);
  for (char *tok = strtok_r(copy, ", \t", &save); tok && ok; tok = strtok_r(NULL, ", \t", &save)) {
    size_t len = strlen(tok);
    while (len > 1 && tok[len - 1] == '/') tok[--len] = '\0';
    const char *host = strstr(tok, "://");
    if (strcmp(tok, "*") == 0) {
      *any = true;
      continue;
    }
    if (!host || !(strncmp(tok, "http://", 7) == 0 || strncmp(tok, "https://", 8) == 0) || !host[3] ||
        strchr(host + 3, '/')) {
      obx_err_set(err, OBX_ERR_CONF, 0, false,
                  "api.cors_origins=%s: must be * or comma-separated origins scheme://host[:port] (http or "
                  "https, no path), e.g. https://app.example.com; '%s' is not one", list, tok);
      ok = false;
      continue;
    }
    *origins = realloc(*origins, (size_t)(n + 2) * sizeof **origins);
    (*origins)[n++] = strdup(tok);
    (*origins)[n] = NULL;
  }
  free(copy);
  return ok;
}

void obx_http_cors_free(char **origins) {
  for (char **o = origins; o && *o; o++) free(*o);
  free(origins);
}

bool obx_http_bind_parse(const char *bind, int port, struct sockaddr_storage *addr, obx_err_t *err) {
  struct sockaddr_in *sa4 = (struct sockaddr_in *)addr;
  struct sockaddr_in6 *sa6 = (struct sockaddr_in6 *)addr;
  memset(addr, 0, sizeof *addr);
  if (inet_pton(AF_INET, bind, &sa4->sin_addr) == 1) {
    sa4->sin_family = AF_INET;
    sa4->sin_port = htons((uint16_t)port);
    return true;
  }
  if (inet_pton(AF_INET6, bind, &sa6->sin6_addr) == 1) {
    sa6->sin6_family = AF_INET6;
    sa6->sin6_port = htons((uint16_t)port);
    return true;
  }
  obx_err_set(err, OBX_ERR_CONF, 0, false,
              "http.bind=%s: must be an IPv4 or IPv6 address to listen on, e.g. 0.0.0.0, 127.0.0.1 or ::", bind);
  return false;
}

/* The request's Origin when CORS allows it, else NULL (no CORS headers). */
static const char *cors_origin(const obx_http_t *http, const obx_http_req_t *req) {
  const char *origin = obx_http_req_header(req, "Origin");
  if (!origin || !*origin) return NULL;
  if (http->cors_any) return origin;
  for (char **o = http->cors_origins; *o; o++)
    if (strcasecmp(*o, origin) == 0) return origin;
  return NULL;
}

/* 204 to a preflight from an allowed origin: the methods the path has (404 when it has none);
 * no key is needed, the actual request is checked as usual. */
static void cors_preflight(obx_http_t *http, obx_http_req_t *req, obx_http_resp_t *resp) {
  http_route_t route;
  char allow[128];
  req->route = "preflight";
  if (http_match(http, req, &route, allow, sizeof allow) == MATCH_NONE) {
    obx_http_reply_problem(resp, 404, "Not found", "no such resource", NULL);
    return;
  }
  resp->status = 204;
  obx_http_resp_header(resp, "Access-Control-Allow-Methods", allow);
  obx_http_resp_header(resp, "Access-Control-Allow-Headers", HTTP_CORS_ALLOW_HEADERS);
  obx_http_resp_header(resp, "Access-Control-Max-Age", HTTP_CORS_MAX_AGE);
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* Requests by route pattern (not the raw path: ids would explode the series), method and
 * status; latency by route; what the edge refused before any handler, by reason. */
static void http_register_metrics(obx_http_t *http) {
  static const double buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  http->requests = obx_metrics_counter("outboxd_http_requests_total", "HTTP requests by route, method and status",
                                       "route,method,status");
  http->latency = obx_metrics_histogram("outboxd_http_request_duration_seconds",
                                        "HTTP request latency from first byte to response, by route", "route", buckets,
                                        (int)(sizeof buckets / sizeof buckets[0]));
  http->refused = obx_metrics_counter("outboxd_http_refused_total",
                                      "HTTP requests or connections refused before a handler ran, by reason "
                                      "(framing: ambiguous Content-Length/Transfer-Encoding; header_timeout: headers "
                                      "not received within http.header_timeout; busy: the handler queue was full)",
                                      "reason");
}

static void http_observe(obx_http_t *http, const obx_http_req_t *req, int status) {
  char code[8];
  const char *route = req->route ? req->route : "unmatched";
  snprintf(code, sizeof code, "%d", status);
  obx_counter_inc(http->requests, route, req->method, code);
  obx_histogram_observe(http->latency, (double)(now_ns() - req->start_ns) / 1e9, route);
}

static void http_metrics(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  size_t len;
  char *text = obx_metrics_render(&len);
  obx_http_reply(resp, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
  free(text);
}

/* ---- built-in routes ---------------------------------------------------------------------- */

/* 200 while every loop of the process makes progress; 503 naming each busy loop whose last
 * stamp is older than health.stall_timeout (obx_health.h), oldest first, in `errors`. */
static void http_healthz(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  static const char body[] = "{\"status\":\"ok\"}";
  obx_http_t *http = ctx;
  obx_health_stall_t stalls[8];
  int n = obx_health_stalls(http->stall_ms, stalls, 8);
  if (!n) {
    obx_http_reply(resp, 200, "application/json", body, sizeof body - 1);
    return;
  }
  bson_t errors = BSON_INITIALIZER;
  char key[16], field[96], message[160], detail[320];
  for (int i = 0; i < n && i < 8; i++) {
    snprintf(key, sizeof key, "%d", i);
    snprintf(field, sizeof field, "%.31s/%.47s", stalls[i].role, stalls[i].loop);
    snprintf(message, sizeof message, "no progress for %.1f s (last step: %.47s)", (double)stalls[i].age_ms / 1000,
             stalls[i].doing);
    bson_t e;
    BSON_APPEND_DOCUMENT_BEGIN(&errors, key, &e);
    BSON_APPEND_UTF8(&e, "field", field);
    BSON_APPEND_UTF8(&e, "message", message);
    BSON_APPEND_INT64(&e, "sinceProgressMs", stalls[i].age_ms);
    bson_append_document_end(&errors, &e);
  }
  snprintf(detail, sizeof detail, "%.31s %.47s loop made no progress for %.1f s (last step: %.47s; health.stall_timeout %lld ms)%s",
           stalls[0].role, stalls[0].loop, (double)stalls[0].age_ms / 1000, stalls[0].doing, (long long)http->stall_ms,
           n > 1 ? "; more in errors" : "");
  obx_warn("healthz: %s", detail);
  obx_http_reply_problem(resp, 503, "Stalled", detail, &errors);
  bson_destroy(&errors);
}

static void http_readyz(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  obx_http_t *http = ctx;
  pthread_rwlock_rdlock(&http->lock);
  int n = http->nchecks;
  http_check_t *checks = malloc((size_t)(n ? n : 1) * sizeof *checks);
  memcpy(checks, http->checks, (size_t)n * sizeof *checks);
  pthread_rwlock_unlock(&http->lock);
  bson_t doc = BSON_INITIALIZER, sub;
  BSON_APPEND_UTF8(&doc, "status", "ready");
  BSON_APPEND_DOCUMENT_BEGIN(&doc, "checks", &sub);
  bool ready = true;
  for (int i = 0; i < n && ready; i++) {
    obx_err_t err = OBX_ERR_INIT;
    ready = checks[i].fn(checks[i].ctx, &err);
    if (ready) {
      BSON_APPEND_UTF8(&sub, checks[i].name, "ok");
    } else {
      char detail[320];
      snprintf(detail, sizeof detail, "%s: %s", checks[i].name, err.msg);
      obx_http_reply_problem(resp, 503, "Not ready", detail, NULL);
    }
  }
  bson_append_document_end(&doc, &sub);
  if (ready) obx_http_reply_bson(resp, 200, &doc);
  bson_destroy(&doc);
  free(checks);
}

/* The built-in routes, public, run on the probe worker (see DESIGN). */
static const struct {
  const char *path;
  obx_http_handler_t handler;
} http_builtins[] = {{"/healthz", http_healthz}, {"/readyz", http_readyz}, {"/metrics", http_metrics}};

static bool http_is_builtin(const char *method, const char *path) {
  if (strcmp(method, "GET") != 0) return false;
  for (size_t i = 0; i < sizeof http_builtins / sizeof http_builtins[0]; i++)
    if (strcmp(path, http_builtins[i].path) == 0) return true;
  return false;
}

/* ---- connections: framing and the header deadline ----------------------------------------- */

typedef struct {
  int content_lengths;
  bool transfer_encoding;
} http_framing_t;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  http_framing_t *f = cls;
  if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) f->content_lengths++;
  else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) f->transfer_encoding = true;
  return MHD_YES;
}

/* NULL when the request's body framing is unambiguous, else why it is not (RFC 9112 6.3).
 * A Content-Length that is not a decimal number never gets here: MHD answers it 400 and
 * closes the connection itself (0.9.75 writes its answer's header block twice, a quirk of
 * the library; nothing after the headers is read). */
static const char *framing_problem(struct MHD_Connection *conn) {
  http_framing_t f = {0};
  MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_header, &f);
  if (f.content_lengths > 1) return "more than one Content-Length header";
  if (f.content_lengths && f.transfer_encoding) return "Content-Length together with Transfer-Encoding";
  return NULL;
}

static http_conn_t *conn_entry(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info ? info->socket_context : NULL;
}

/* Marks the connection's request as begun (headers in) or ended (answer sent). */
static void conn_set_in_request(obx_http_t *http, struct MHD_Connection *conn, bool in_request) {
  http_conn_t *c = conn_entry(conn);
  if (!c) return;
  pthread_mutex_lock(&http->conns_mu);
  c->in_request = in_request;
  if (!in_request && c->since_ns != INT64_MAX) c->since_ns = now_ns();
  pthread_mutex_unlock(&http->conns_mu);
}

static void http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode code) {
  obx_http_t *http = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    http_conn_t *c = calloc(1, sizeof *c);
    c->fd = info ? info->connect_fd : -1;
    c->since_ns = now_ns();
    pthread_mutex_lock(&http->conns_mu);
    c->next = http->conns;
    if (c->next) c->next->prev = c;
    http->conns = c;
    pthread_mutex_unlock(&http->conns_mu);
    *socket_context = c;
    return;
  }
  http_conn_t *c = *socket_context;
  if (!c) return;
  pthread_mutex_lock(&http->conns_mu);
  if (c->prev) c->prev->next = c->next;
  else http->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  pthread_mutex_unlock(&http->conns_mu);
  free(c);
  *socket_context = NULL;
}

/* Shuts down the sockets of connections that have not sent a request's headers within
 * http.header_timeout; MHD sees the end of the stream and closes them. The fd stays valid
 * while its entry is listed: MHD unlists it (conns_mu) before closing the socket. */
static void *http_reaper(void *arg) {
  obx_http_t *http = arg;
  obx_log_set_role("http");
  int64_t tick_ns = http->header_timeout_ns / 4;
  if (tick_ns < 50000000) tick_ns = 50000000;
  if (tick_ns > 1000000000) tick_ns = 1000000000;
  pthread_mutex_lock(&http->conns_mu);
  while (!http->reaper_stop) {
    int64_t now = now_ns();
    int reaped = 0;
    for (http_conn_t *c = http->conns; c; c = c->next) {
      if (c->in_request || c->fd < 0 || c->since_ns == INT64_MAX || now - c->since_ns < http->header_timeout_ns) continue;
      shutdown(c->fd, SHUT_RDWR);
      c->since_ns = INT64_MAX;
      reaped++;
    }
    if (reaped) {
      obx_counter_add(http->refused, reaped, "header_timeout");
      obx_debug("http: closed %d connections that sent no complete headers within %lld ms", reaped,
                (long long)(http->header_timeout_ns / 1000000));
    }
    struct timespec until = obx_time_deadline(CLOCK_REALTIME, tick_ns / 1000000);
    pthread_cond_timedwait(&http->conns_cv, &http->conns_mu, &until);
  }
  pthread_mutex_unlock(&http->conns_mu);
  return NULL;
}

/* ---- the event loop ----------------------------------------------------------------------- */

static void http_events_wake(obx_http_t *http) {
  uint64_t one = 1;
  if (write(http->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN) obx_warn("http: cannot wake the event loop: %s", strerror(errno));
}

/* Runs MHD's epoll set until obx_http_stop: waits for network activity, a resumed connection
 * (MHD's inter-thread channel is in that set), MHD's next connection timeout, the stop or a
 * tick, whichever comes first, then lets MHD accept, read, call back and write. */
static void *http_events(void *arg) {
  obx_http_t *http = arg;
  char name[48];
  obx_log_set_role("http");
  snprintf(name, sizeof name, "acceptor :%d", http->port);
  obx_health_register("http", name);
  int64_t tick = http->stall_ms / 4 < 1000 ? http->stall_ms / 4 : 1000;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(http->daemon, MHD_DAEMON_INFO_EPOLL_FD);
  struct pollfd fds[2] = {{.fd = info ? info->epoll_fd : -1, .events = POLLIN}, {.fd = http->wake_fd, .events = POLLIN}};
  while (!atomic_load(&http->events_stop)) {
    obx_health_stamp("waiting for connections");
    MHD_UNSIGNED_LONG_LONG next;
    int wait_ms = (int)tick;
    if (MHD_get_timeout(http->daemon, &next) == MHD_YES && next < (MHD_UNSIGNED_LONG_LONG)wait_ms) wait_ms = (int)next;
    uint64_t wakes;
    if (poll(fds, 2, wait_ms) > 0 && (fds[1].revents & POLLIN)) (void)!read(http->wake_fd, &wakes, sizeof wakes);
    obx_health_stamp("serving connections");
    MHD_run(http->daemon);
  }
  obx_health_unregister();
  return NULL;
}

/* ---- workers ------------------------------------------------------------------------------ */

/* Runs a dequeued request (or answers 503 when the server is stopping) and hands it back to
 * the event thread. */
static void pool_run(http_pool_t *pool, obx_http_req_t *req, bool stopping) {
  if (stopping) {
    obx_http_resp_header(&req->resp, "Retry-After", "1");
    obx_http_reply_problem(&req->resp, 503, "Service unavailable", "the server is stopping", NULL);
  } else {
    http_dispatch(pool->http, req, &req->resp);
  }
  req->state = REQ_ANSWERED;
  MHD_resume_connection(req->conn);
  http_events_wake(pool->http); /* MHD's external loop learns of a resume only when it runs */
}

static void *pool_thread(void *arg) {
  http_pool_t *pool = arg;
  obx_log_set_role("http");
  if (pool->watch) {
    char name[32];
    snprintf(name, sizeof name, "%s %d", pool->watch, atomic_fetch_add(&pool->started, 1));
    obx_health_register("http", name);
  }
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    obx_health_idle();
    while (!pool->n && !pool->stopping) pthread_cond_wait(&pool->cv, &pool->mu);
    if (!pool->n) break;
    obx_http_req_t *req = pool->queue[pool->head];
    pool->head = (pool->head + 1) % pool->cap;
    pool->n--;
    bool stopping = pool->stopping;
    pthread_mutex_unlock(&pool->mu);
    obx_health_stamp("a request");
    pool_run(pool, req, stopping);
    pthread_mutex_lock(&pool->mu);
  }
  pthread_mutex_unlock(&pool->mu);
  obx_health_unregister();
  return NULL;
}

/* watch: the loop name of its threads for /healthz (NULL: not watched). */
static void pool_start(http_pool_t *pool, obx_http_t *http, int nthreads, const char *watch) {
  pool->http = http;
  pool->watch = watch;
  pool->nthreads = nthreads;
  pool->cap = nthreads * HTTP_QUEUE_PER_WORKER;
  pool->queue = calloc((size_t)pool->cap, sizeof *pool->queue);
  pool->threads = calloc((size_t)nthreads, sizeof *pool->threads);
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->cv, NULL);
  for (int i = 0; i < nthreads; i++) pthread_create(&pool->threads[i], NULL, pool_thread, pool);
}

/* Suspends req's connection and queues req; false (nothing done) when the queue is full.
 * Called on the event thread, inside the access callback. The suspension happens under the
 * pool lock, so no worker can resume the connection before it is suspended. */
static bool pool_submit(http_pool_t *pool, obx_http_req_t *req) {
  pthread_mutex_lock(&pool->mu);
  bool ok = pool->n < pool->cap && !pool->stopping;
  if (ok) {
    req->state = REQ_QUEUED;
    MHD_suspend_connection(req->conn);
    pool->queue[(pool->head + pool->n) % pool->cap] = req;
    pool->n++;
    pthread_cond_signal(&pool->cv);
  }
  pthread_mutex_unlock(&pool->mu);
  return ok;
}

/* Answers what is still queued with 503 and joins the threads. Safe on a pool never started. */
static void pool_stop(http_pool_t *pool) {
  if (!pool->threads) return;
  pthread_mutex_lock(&pool->mu);
  pool->stopping = true;
  pthread_cond_broadcast(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->nthreads; i++) pthread_join(pool->threads[i], NULL);
  pthread_cond_destroy(&pool->cv);
  pthread_mutex_destroy(&pool->mu);
  free(pool->threads);
  free(pool->queue);
  memset(pool, 0, sizeof *pool);
}

/* ---- MHD callbacks ------------------------------------------------------------------------ */

static enum MHD_Result http_queue(struct MHD_Connection *conn, obx_http_req_t *req) {
  obx_http_resp_t *resp = &req->resp;
  struct MHD_Response *mresp =
    MHD_create_response_from_buffer(resp->len, resp->body ? resp->body : "", MHD_RESPMEM_MUST_COPY);
  if (resp->content_type) MHD_add_response_header(mresp, MHD_HTTP_HEADER_CONTENT_TYPE, resp->content_type);
  for (int i = 0; i < resp->nheaders; i++) MHD_add_response_header(mresp, resp->headers[i][0], resp->headers[i][1]);
  if (req->origin) {
    MHD_add_response_header(mresp, "Access-Control-Allow-Origin", req->origin);
    MHD_add_response_header(mresp, "Access-Control-Expose-Headers", HTTP_CORS_EXPOSE_HEADERS);
    MHD_add_response_header(mresp, MHD_HTTP_HEADER_VARY, "Origin");
  }
  if (req->close) MHD_add_response_header(mresp, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)resp->status, mresp);
  MHD_destroy_response(mresp);
  return ret;
}

/* Sends req's answer (event thread). */
static enum MHD_Result http_answer(obx_http_t *http, obx_http_req_t *req) {
  req->state = REQ_ANSWERED;
  obx_debug("%s %s -> %d", req->method, req->path, req->resp.status);
  http_observe(http, req, req->resp.status);
  enum MHD_Result ret = http_queue(req->conn, req);
  resp_cleanup(&req->resp);
  memset(&req->resp, 0, sizeof req->resp);
  return ret;
}

static enum MHD_Result http_on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                       const char *version, const char *upload_data, size_t *upload_data_size,
                                       void **con_cls) {
  obx_http_t *http = cls;
  obx_http_req_t *req = *con_cls;
  if (!req) {
    req = calloc(1, sizeof *req);
    req->conn = conn;
    req->method = method;
    req->path = url;
    req->start_ns = now_ns();
    *con_cls = req;
    atomic_fetch_add(&http->busy, 1);
    conn_set_in_request(http, conn, true);
    req->origin = cors_origin(http, req);
    const char *problem = framing_problem(conn);
    if (problem) { /* answered before any body byte is read; the connection closes after it */
      obx_counter_inc(http->refused, "framing");
      req->close = true;
      obx_http_reply_problem(&req->resp, 400, "Bad request", problem, NULL);
      return http_answer(http, req);
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl || strtoull(cl, NULL, 10) <= http->max_body) return MHD_YES;
    req->too_large = true; /* answer now, before reading the body */
  } else if (*upload_data_size) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (req->too_large || req->state != REQ_READING) return MHD_YES;
    if (req->len + n > http->max_body) {
      req->too_large = true;
      return MHD_YES;
    }
    if (req->len + n + 1 > req->cap) {
      req->cap = (req->len + n + 1) * 2;
      if (req->cap > http->max_body + 1) req->cap = http->max_body + 1;
      req->body = realloc(req->body, req->cap);
    }
    memcpy(req->body + req->len, upload_data, n);
    req->len += n;
    req->body[req->len] = '\0';
    return MHD_YES;
  }
  switch (req->state) {
  case REQ_QUEUED: return MHD_YES; /* not resumed yet */
  case REQ_ANSWERED:
    if (req->resp.status) return http_answer(http, req); /* back from a worker */
    return MHD_YES;
  case REQ_READING: break;
  }
  if (req->origin && strcmp(method, "OPTIONS") == 0 && obx_http_req_header(req, "Access-Control-Request-Method")) {
    cors_preflight(http, req, &req->resp);
    return http_answer(http, req);
  }
  if (req->too_large) {
    char detail[96];
    snprintf(detail, sizeof detail, "the body exceeds %zu bytes", http->max_body);
    obx_http_reply_problem(&req->resp, 413, "Payload too large", detail, NULL);
    return http_answer(http, req);
  }
  if (pool_submit(http_is_builtin(method, url) ? &http->probes : &http->handlers, req)) return MHD_YES;
  obx_counter_inc(http->refused, "busy");
  obx_http_resp_header(&req->resp, "Retry-After", "1");
  obx_http_reply_problem(&req->resp, 503, "Service unavailable", "every request worker is busy; retry", NULL);
  return http_answer(http, req);
}

static void http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
  obx_http_t *http = cls;
  obx_http_req_t *req = *con_cls;
  if (!req) return;
  conn_set_in_request(http, conn, false);
  atomic_fetch_sub(&http->busy, 1);
  resp_cleanup(&req->resp);
  free(req->path_copy);
  free(req->body);
  free(req);
  *con_cls = NULL;
}

/* What a client does to its own connection (closing it, a malformed request, the header
 * deadline) is debug: an abusive client must not be able to flood the log. */
static void http_on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[256];
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = '\0';
  if (strcasestr(msg, "connection") || strcasestr(msg, "socket")) obx_debug("libmicrohttpd: %s", msg);
  else obx_warn("libmicrohttpd: %s", msg);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

obx_http_t *obx_http_new(const obx_conf_t *conf, obx_err_t *err) {
  obx_auth_t *auth = obx_auth_load(conf->api_keys_file, err);
  if (!auth) return NULL;
  obx_http_t *http = calloc(1, sizeof *http);
  http->auth = auth;
  http->bind = strdup(conf->http_bind);
  http->port = (int)conf->http_port;
  http->max_body = (size_t)conf->http_max_body;
  http->rate = conf->api_rate_limit;
  http->workers = (int)conf->http_workers;
  http->max_conns = (unsigned)conf->http_max_connections;
  http->max_conns_per_client = (unsigned)conf->http_max_connections_per_client;
  http->header_timeout_ns = conf->http_header_timeout * 1000000;
  http->stall_ms = conf->health_stall_timeout;
  http->idle_timeout_s = (unsigned)((conf->http_idle_timeout + 999) / 1000);
  http->nbuckets = obx_auth_count(auth) + 1;
  http->buckets = calloc((size_t)http->nbuckets, sizeof *http->buckets);
  pthread_mutex_init(&http->rate_mu, NULL);
  pthread_rwlock_init(&http->lock, NULL);
  pthread_mutex_init(&http->conns_mu, NULL);
  pthread_cond_init(&http->conns_cv, NULL);
  http_register_metrics(http);
  if (!obx_http_cors_parse(conf->api_cors_origins, &http->cors_origins, &http->cors_any, err)) {
    obx_http_destroy(http);
    return NULL;
  }
  for (size_t i = 0; i < sizeof http_builtins / sizeof http_builtins[0]; i++)
    obx_http_route(http, "GET", http_builtins[i].path, NULL, http_builtins[i].handler, http);
  return http;
}

bool obx_http_start(obx_http_t *http, obx_err_t *err) {
  struct sockaddr_storage addr;
  unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  if (!obx_http_bind_parse(http->bind, http->port, &addr, err)) return false;
  if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  struct sockaddr *sa = (struct sockaddr *)&addr;
  pool_start(&http->handlers, http, http->workers, "handler");
  pool_start(&http->probes, http, 1, NULL); /* a stuck probe worker answers no probe: the probe fails itself */
  http->daemon = MHD_start_daemon(flags, (uint16_t)http->port, NULL, NULL, http_on_request, http,
                                  MHD_OPTION_EXTERNAL_LOGGER, http_on_mhd_log, http,
                                  MHD_OPTION_SOCK_ADDR, sa,
                                  MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, http,
                                  MHD_OPTION_NOTIFY_CONNECTION, http_on_connection, http,
                                  MHD_OPTION_CONNECTION_TIMEOUT, http->idle_timeout_s,
                                  MHD_OPTION_CONNECTION_LIMIT, http->max_conns,
                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT, http->max_conns_per_client,
                                  MHD_OPTION_END);
  if (!http->daemon) {
    pool_stop(&http->probes);
    pool_stop(&http->handlers);
    obx_err_set(err, OBX_ERR_SYS, 0, false, "cannot listen on %s:%d", http->bind, http->port);
    return false;
  }
  http->reaper_stop = false;
  pthread_create(&http->reaper, NULL, http_reaper, http);
  http->reaper_started = true;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(http->daemon, MHD_DAEMON_INFO_BIND_PORT);
  if (info) http->port = info->port;
  atomic_store(&http->events_stop, false);
  http->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pthread_create(&http->events, NULL, http_events, http);
  char thread_name[16];
  snprintf(thread_name, sizeof thread_name, "obx-http-%d", http->port);
  pthread_setname_np(http->events, thread_name); /* before "http listening": ps and /proc show it */
  http->events_started = true;
  char port[16], workers[16];
  snprintf(port, sizeof port, "%d", http->port);
  snprintf(workers, sizeof workers, "%d", http->workers);
  obx_log_field_t fields[] = {{"bind", http->bind}, {"port", port}, {"workers", workers}};
  obx_log_write(OBX_LOG_INFO, fields, 3, "http listening");
  return true;
}

obx_auth_t *obx_http_auth(obx_http_t *http) { return http->auth; }

int obx_http_port(const obx_http_t *http) { return http->port; }

void obx_http_stop(obx_http_t *http) {
  if (!http || !http->daemon) return;
  MHD_socket listener = MHD_quiesce_daemon(http->daemon);
  for (int waited = 0; atomic_load(&http->busy) > 0 && waited < HTTP_DRAIN_MS; waited += 10) usleep(10000);
  if (atomic_load(&http->busy) > 0) obx_warn("http: %d requests still running after %d ms; closing", atomic_load(&http->busy), HTTP_DRAIN_MS);
  /* workers first: each resumes the connection it holds, so none is suspended when MHD stops */
  pool_stop(&http->handlers);
  pool_stop(&http->probes);
  pthread_mutex_lock(&http->conns_mu);
  http->reaper_stop = true;
  pthread_cond_signal(&http->conns_cv);
  pthread_mutex_unlock(&http->conns_mu);
  if (http->reaper_started) pthread_join(http->reaper, NULL);
  http->reaper_started = false;
  if (http->events_started) {
    atomic_store(&http->events_stop, true);
    http_events_wake(http);
    pthread_join(http->events, NULL);
    close(http->wake_fd);
    http->events_started = false;
  }
  MHD_run(http->daemon); /* takes in the connections the workers resumed last: none stays suspended */
  MHD_stop_daemon(http->daemon);
  if (listener != MHD_INVALID_SOCKET) close(listener);
  http->daemon = NULL;
}

void obx_http_destroy(obx_http_t *http) {
  if (!http) return;
  obx_http_stop(http);
  for (int i = 0; i < http->nroutes; i++) {
    http_route_t *route = &http->routes[i];
    for (int s = 0; s < route->nsegs; s++) free(route->segs[s]);
    free(route->method);
    free(route->pattern);
    free(route->permission);
  }
  for (int i = 0; i < http->nchecks; i++) free(http->checks[i].name);
  free(http->checks);
  free(http->routes);
  pthread_rwlock_destroy(&http->lock);
  pthread_mutex_destroy(&http->rate_mu);
  pthread_mutex_destroy(&http->conns_mu);
  pthread_cond_destroy(&http->conns_cv);
  free(http->buckets);
  obx_http_cors_free(http->cors_origins);
  free(http->bind);
  obx_auth_destroy(http->auth);
  free(http);
}
