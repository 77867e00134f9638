/* obx_test_httpd.h - a scripted HTTP server inside the test process (libmicrohttpd)
 *
 * DESIGN: listens on 127.0.0.1 on a free port, one thread per connection. Each path answers
 * as scripted by obx_test_httpd_route: status, body, headers, a delay before the answer, a
 * slow body (chunks with pauses), a large body with or without Content-Length. Every request
 * is captured (method, path, headers, body) for the test to inspect. Unknown paths answer
 * 404. Delays sleep in short slices and end at once when the server stops. */
#ifndef OBX_TEST_HTTPD_H
#define OBX_TEST_HTTPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <bson/bson.h>

typedef struct obx_test_httpd obx_test_httpd_t;

typedef struct {
  const char *path;         /* exact match */
  int status;               /* 0: 200 */
  const char *body;         /* NULL: empty */
  const char *content_type; /* NULL: application/json */
  const char *location;     /* Location header (for 3xx) */
  int delay_ms;             /* wait before answering */
  size_t body_bytes;        /* >0: the body is `body` (or "x") repeated to this many bytes */
  bool chunked;             /* no Content-Length (chunked transfer) */
  int chunk_delay_ms;       /* >0: a slow body, chunk_bytes at a time with this pause */
  size_t chunk_bytes;       /* 0: 16 */
} obx_test_httpd_route_t;

typedef struct {
  char method[16];
  char path[256];
  bson_t headers;  /* lower-case name -> value */
  char *body;      /* NUL-terminated */
  size_t body_len;
  int64_t start_ms; /* wall clock: when the request was read, and when its answer was queued */
  int64_t end_ms;   /* (0 while it is still being answered) */
} obx_test_httpd_request_t;

/* NULL when the server cannot start. */
obx_test_httpd_t *obx_test_httpd_start(void);
/* The same over HTTPS with a PEM certificate and key (copied); NULL when libmicrohttpd has no
 * TLS support or the server cannot start. */
obx_test_httpd_t *obx_test_httpd_start_tls(const char *cert_pem, const char *key_pem);
void obx_test_httpd_stop(obx_test_httpd_t *httpd);
int obx_test_httpd_port(const obx_test_httpd_t *httpd);
/* "http[s]://127.0.0.1:<port><path>" in a thread-local rotating buffer (valid for 8 calls). */
const char *obx_test_httpd_url(const obx_test_httpd_t *httpd, const char *path);
/* Adds or replaces the script of route->path (copied). */
void obx_test_httpd_route(obx_test_httpd_t *httpd, const obx_test_httpd_route_t *route);
/* Requests received so far (on every path). */
int obx_test_httpd_nrequests(obx_test_httpd_t *httpd);
/* Every request answered so far, also those past the recorded ones. */
int obx_test_httpd_total(obx_test_httpd_t *httpd);
/* Copy of request i (0-based); false when there is none. Free with ..._request_cleanup. */
bool obx_test_httpd_request(obx_test_httpd_t *httpd, int i, obx_test_httpd_request_t *out);
void obx_test_httpd_request_cleanup(obx_test_httpd_request_t *req);
/* A header of a captured request (name lower-case), NULL when absent. */
const char *obx_test_httpd_request_header(const obx_test_httpd_request_t *req, const char *name);

#endif
