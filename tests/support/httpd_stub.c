/* httpd_stub.c - the scripted in-process HTTP server of obx_test_httpd.h */
#include "obx_test_httpd.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <microhttpd.h>

#define HTTPD_MAX_REQUESTS 4096 /* the worker tests drive over a thousand calls */

typedef struct {
  obx_test_httpd_route_t r;  /* strings point into the copies below */
  char *path, *body, *content_type, *location;
} route_t;

struct obx_test_httpd {
  struct MHD_Daemon *daemon;
  int port;
  bool tls;
  char *cert_pem, *key_pem; /* kept for the daemon's lifetime */
  atomic_bool stopping;
  pthread_mutex_t mu;
  route_t *routes; /* grows as routes are added */
  int nroutes, routes_cap;
  obx_test_httpd_request_t requests[HTTPD_MAX_REQUESTS];
  int nrequests;
  int total; /* every request answered, also those past HTTPD_MAX_REQUESTS */
};

/* Per-connection upload buffer. */
typedef struct {
  char *data;
  size_t len;
} upload_t;

/* State of a generated (large or slow) body. */
typedef struct {
  obx_test_httpd_t *httpd;
  char *pattern;
  size_t pattern_len, total, sent, chunk;
  int delay_ms;
} gen_t;

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* Sleeps ms in 10 ms slices; false when the server is stopping. */
static bool nap(obx_test_httpd_t *httpd, int ms) {
  while (ms > 0 && !atomic_load(&httpd->stopping)) {
    int slice = ms < 10 ? ms : 10;
    struct timespec ts = {0, slice * 1000000L};
    nanosleep(&ts, NULL);
    ms -= slice;
  }
  return !atomic_load(&httpd->stopping);
}

static ssize_t gen_read(void *cls, uint64_t pos, char *buf, size_t max) {
  gen_t *g = cls;
  if (g->sent >= g->total) return MHD_CONTENT_READER_END_OF_STREAM;
  if (g->delay_ms && !nap(g->httpd, g->delay_ms)) return MHD_CONTENT_READER_END_WITH_ERROR;
  size_t n = g->total - g->sent;
  if (n > max) n = max;
  if (g->chunk && n > g->chunk) n = g->chunk;
  for (size_t i = 0; i < n; i++) buf[i] = g->pattern[(g->sent + i) % g->pattern_len];
  g->sent += n;
  return (ssize_t)n;
}

static void gen_free(void *cls) {
  gen_t *g = cls;
  free(g->pattern);
  free(g);
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  bson_t *headers = cls;
  char name[128];
  size_t i = 0;
  for (; key[i] && i < sizeof name - 1; i++) name[i] = (char)tolower((unsigned char)key[i]);
  name[i] = '\0';
  bson_append_utf8(headers, name, -1, value ? value : "", -1);
  return MHD_YES;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Records the request; returns its index (-1 past the recorded ones). */
static int record(obx_test_httpd_t *httpd, struct MHD_Connection *connection, const char *method, const char *url,
                  upload_t *up) {
  int idx = -1;
  pthread_mutex_lock(&httpd->mu);
  httpd->total++;
  if (httpd->nrequests < HTTPD_MAX_REQUESTS) {
    idx = httpd->nrequests;
    obx_test_httpd_request_t *req = &httpd->requests[httpd->nrequests++];
    req->start_ms = wall_ms();
    req->end_ms = 0;
    snprintf(req->method, sizeof req->method, "%s", method);
    snprintf(req->path, sizeof req->path, "%s", url);
    bson_init(&req->headers);
    MHD_get_connection_values(connection, MHD_HEADER_KIND, collect_header, &req->headers);
    req->body = malloc(up->len + 1);
    if (up->len) memcpy(req->body, up->data, up->len);
    req->body[up->len] = '\0';
    req->body_len = up->len;
  }
  pthread_mutex_unlock(&httpd->mu);
  return idx;
}

static void record_end(obx_test_httpd_t *httpd, int idx) {
  if (idx < 0) return;
  pthread_mutex_lock(&httpd->mu);
  httpd->requests[idx].end_ms = wall_ms();
  pthread_mutex_unlock(&httpd->mu);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
  obx_test_httpd_t *httpd = cls;
  upload_t *up = *con_cls;
  if (!up) {
    *con_cls = calloc(1, sizeof *up);
    return MHD_YES;
  }
  if (*upload_data_size) {
    up->data = realloc(up->data, up->len + *upload_data_size + 1);
    memcpy(up->data + up->len, upload_data, *upload_data_size);
    up->len += *upload_data_size;
    *upload_data_size = 0;
    return MHD_YES;
  }
  int idx = record(httpd, connection, method, url, up);

  obx_test_httpd_route_t r = {.status = 404, .body = "{\"error\":\"no route\"}"};
  char *copy_body = NULL, *copy_type = NULL, *copy_location = NULL;
  pthread_mutex_lock(&httpd->mu);
  for (int i = 0; i < httpd->nroutes; i++) {
    if (strcmp(httpd->routes[i].path, url) == 0) {
      r = httpd->routes[i].r;
      break;
    }
  }
  copy_body = dup_or_null(r.body);
  copy_type = dup_or_null(r.content_type);
  copy_location = dup_or_null(r.location);
  pthread_mutex_unlock(&httpd->mu);

  struct MHD_Response *resp = NULL;
  enum MHD_Result ret = MHD_NO;
  if (r.delay_ms && !nap(httpd, r.delay_ms)) goto done;
  record_end(httpd, idx);
  const char *body = copy_body ? copy_body : "";
  if (r.body_bytes || r.chunk_delay_ms || r.chunked) {
    gen_t *g = calloc(1, sizeof *g);
    g->httpd = httpd;
    g->pattern = strdup(*body ? body : "x");
    g->pattern_len = strlen(g->pattern);
    g->total = r.body_bytes ? r.body_bytes : strlen(body);
    g->chunk = r.chunk_bytes ? r.chunk_bytes : (r.chunk_delay_ms ? 16 : 0);
    g->delay_ms = r.chunk_delay_ms;
    resp = MHD_create_response_from_callback(r.chunked ? MHD_SIZE_UNKNOWN : g->total, 4096, gen_read, g, gen_free);
  } else {
    resp = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  }
  if (!resp) goto done;
  MHD_add_response_header(resp, "Content-Type", copy_type ? copy_type : "application/json");
  if (copy_location) MHD_add_response_header(resp, "Location", copy_location);
  ret = MHD_queue_response(connection, (unsigned)(r.status ? r.status : 200), resp);
  MHD_destroy_response(resp);
done:
  free(copy_location);
  free(copy_type);
  free(copy_body);
  return ret;
}

static void completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  upload_t *up = *con_cls;
  if (!up) return;
  free(up->data);
  free(up);
  *con_cls = NULL;
}

static obx_test_httpd_t *start(const char *cert_pem, const char *key_pem) {
  /* holds bson_t members: aligned as bson_t requires (malloc's alignment is smaller) */
  size_t bytes = (sizeof(obx_test_httpd_t) + _Alignof(obx_test_httpd_t) - 1) / _Alignof(obx_test_httpd_t) *
                 _Alignof(obx_test_httpd_t);
  obx_test_httpd_t *httpd = aligned_alloc(_Alignof(obx_test_httpd_t), bytes);
  memset(httpd, 0, bytes);
  pthread_mutex_init(&httpd->mu, NULL);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION;
  if (cert_pem) {
    httpd->tls = true;
    httpd->cert_pem = strdup(cert_pem);
    httpd->key_pem = strdup(key_pem);
    httpd->daemon = MHD_start_daemon(flags | MHD_USE_TLS, 0, NULL, NULL, handle, httpd, MHD_OPTION_SOCK_ADDR,
                                     (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, httpd,
                                     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_HTTPS_MEM_CERT,
                                     httpd->cert_pem, MHD_OPTION_HTTPS_MEM_KEY, httpd->key_pem, MHD_OPTION_END);
  } else {
    httpd->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle, httpd, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                     MHD_OPTION_NOTIFY_COMPLETED, completed, httpd, MHD_OPTION_CONNECTION_TIMEOUT,
                                     (unsigned)30, MHD_OPTION_END);
  }
  if (!httpd->daemon) {
    pthread_mutex_destroy(&httpd->mu);
    free(httpd->cert_pem);
    free(httpd->key_pem);
    free(httpd);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(httpd->daemon, MHD_DAEMON_INFO_BIND_PORT);
  httpd->port = info ? info->port : 0;
  return httpd;
}

obx_test_httpd_t *obx_test_httpd_start(void) { return start(NULL, NULL); }

obx_test_httpd_t *obx_test_httpd_start_tls(const char *cert_pem, const char *key_pem) {
  if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) return NULL;
  return start(cert_pem, key_pem);
}

static void route_free(route_t *route) {
  free(route->path);
  free(route->body);
  free(route->content_type);
  free(route->location);
}

void obx_test_httpd_stop(obx_test_httpd_t *httpd) {
  if (!httpd) return;
  atomic_store(&httpd->stopping, true);
  MHD_stop_daemon(httpd->daemon);
  for (int i = 0; i < httpd->nroutes; i++) route_free(&httpd->routes[i]);
  free(httpd->routes);
  for (int i = 0; i < httpd->nrequests; i++) {
    bson_destroy(&httpd->requests[i].headers);
    free(httpd->requests[i].body);
  }
  pthread_mutex_destroy(&httpd->mu);
  free(httpd->cert_pem);
  free(httpd->key_pem);
  free(httpd);
}

int obx_test_httpd_port(const obx_test_httpd_t *httpd) { return httpd->port; }

const char *obx_test_httpd_url(const obx_test_httpd_t *httpd, const char *path) {
  static _Thread_local char bufs[8][320];
  static _Thread_local int next;
  char *buf = bufs[next++ % 8];
  snprintf(buf, sizeof bufs[0], "%s://127.0.0.1:%d%s", httpd->tls ? "https" : "http", httpd->port, path);
  return buf;
}

void obx_test_httpd_route(obx_test_httpd_t *httpd, const obx_test_httpd_route_t *route) {
  pthread_mutex_lock(&httpd->mu);
  int i = 0;
  while (i < httpd->nroutes && strcmp(httpd->routes[i].path, route->path) != 0) i++;
  if (i == httpd->nroutes) {
    if (httpd->nroutes == httpd->routes_cap) {
      httpd->routes_cap = httpd->routes_cap ? 2 * httpd->routes_cap : 32;
      httpd->routes = realloc(httpd->routes, (size_t)httpd->routes_cap * sizeof *httpd->routes);
      if (!httpd->routes) abort();
    }
    httpd->nroutes++;
  } else {
    route_free(&httpd->routes[i]);
  }
  route_t *slot = &httpd->routes[i];
  slot->r = *route;
  slot->r.path = slot->path = strdup(route->path);
  slot->r.body = slot->body = dup_or_null(route->body);
  slot->r.content_type = slot->content_type = dup_or_null(route->content_type);
  slot->r.location = slot->location = dup_or_null(route->location);
  pthread_mutex_unlock(&httpd->mu);
}

int obx_test_httpd_total(obx_test_httpd_t *httpd) {
  pthread_mutex_lock(&httpd->mu);
  int n = httpd->total;
  pthread_mutex_unlock(&httpd->mu);
  return n;
}

int obx_test_httpd_nrequests(obx_test_httpd_t *httpd) {
  pthread_mutex_lock(&httpd->mu);
  int n = httpd->nrequests;
  pthread_mutex_unlock(&httpd->mu);
  return n;
}

bool obx_test_httpd_request(obx_test_httpd_t *httpd, int i, obx_test_httpd_request_t *out) {
  bool ok = false;
  pthread_mutex_lock(&httpd->mu);
  if (i >= 0 && i < httpd->nrequests) {
    const obx_test_httpd_request_t *req = &httpd->requests[i];
    memcpy(out->method, req->method, sizeof out->method);
    memcpy(out->path, req->path, sizeof out->path);
    bson_copy_to(&req->headers, &out->headers);
    out->body = malloc(req->body_len + 1);
    memcpy(out->body, req->body, req->body_len + 1);
    out->body_len = req->body_len;
    out->start_ms = req->start_ms;
    out->end_ms = req->end_ms;
    ok = true;
  }
  pthread_mutex_unlock(&httpd->mu);
  return ok;
}

void obx_test_httpd_request_cleanup(obx_test_httpd_request_t *req) {
  bson_destroy(&req->headers);
  free(req->body);
  req->body = NULL;
}

const char *obx_test_httpd_request_header(const obx_test_httpd_request_t *req, const char *name) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, &req->headers, name) && BSON_ITER_HOLDS_UTF8(&it)) return bson_iter_utf8(&it, NULL);
  return NULL;
}
