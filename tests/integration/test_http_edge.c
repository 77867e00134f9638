/* test_http_edge.c - the HTTP edge against abuse, through the real outboxd binary over raw
 * sockets: request smuggling (two Content-Length headers, equal or not; Content-Length with
 * Transfer-Encoding) gets one 400 and a closed connection, never a second answer; pipelined
 * well-formed requests still get one answer each; a Content-Length that is not a number is
 * refused by libmicrohttpd itself (400, closed, nothing after the headers answered); 1,100 slow connections from one address
 * (127.0.0.1, one byte every 2 s) leave /healthz and POST /orders answering for another
 * client (127.0.0.2), add no thread to the server, and are all closed by the header deadline.
 *
 * One devmongod and one `outboxd --roles api` (http.header_timeout=4s) serve the group. */
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SLOW_CONNS 1100
#define SLOW_ROUNDS 6          /* one byte per connection every 2 s: 12 s of drip */
#define SLOW_INTERVAL_MS 2000
#define HEADER_TIMEOUT "4s"
#define OTHER_CLIENT "127.0.0.2"
#define OTHER_DEADLINE_MS 2000 /* an answer to the other client within this, every time */

static obx_test_mongo_t mongo;
static mongoc_client_t *client;
static obx_test_outboxd_t outboxd;
static char keys_path[300];
static char key_acme[64];

static int group_setup(void **state) {
  if (obx_test_fixture_mongo_setup(&mongo, NULL, &client) != 0) return -1;
  snprintf(keys_path, sizeof keys_path, "%s/api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "acme", "orders:write,orders:read,outbox:read", key_acme);
  char mongo_arg[300], keys_arg[340];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  char *args[] = {"--roles", "api", "-X", mongo_arg, "-X", keys_arg, "-X", "http.header_timeout=" HEADER_TIMEOUT, NULL};
  if (!obx_test_outboxd_start(&outboxd, args)) return -1;
  if (!obx_test_wait_for(obx_test_http_ready, &outboxd.port, 30000, 100)) {
    fprintf(stderr, "outboxd never became ready; log: %s\n", outboxd.proc.log_path);
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  int status = obx_test_outboxd_stop(&outboxd);
  obx_test_fixture_mongo_teardown(&mongo, client);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- raw sockets -------------------------------------------------------------------------- */

/* A TCP connection from src (an address of lo) to 127.0.0.1:port; -1 on failure. */
static int connect_from(const char *src, int port, bool nonblocking) {
  int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -1;
  struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, src, &from.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
      (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends request on a fresh connection from src and reads until the server closes the
 * connection or timeout_ms pass. Returns the bytes read (owned, NUL-terminated); *closed says
 * whether the server closed. */
static char *exchange(const char *src, const char *request, size_t len, int timeout_ms, bool *closed) {
  int fd = connect_from(src, outboxd.port, false);
  assert_true(fd >= 0);
  assert_int_equal(send(fd, request, len, MSG_NOSIGNAL), (ssize_t)len);
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap + 1);
  int64_t until = obx_test_now_ms() + timeout_ms;
  *closed = false;
  for (;;) {
    int left = (int)(until - obx_test_now_ms());
    if (left <= 0) break;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, left) <= 0) continue;
    ssize_t got = recv(fd, buf + n, cap - n, 0);
    if (got <= 0) {
      *closed = true;
      break;
    }
    n += (size_t)got;
    if (n == cap) break;
  }
  buf[n] = '\0';
  close(fd);
  return buf;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* ---- smuggling ---------------------------------------------------------------------------- */

#define SMUGGLED "GET /api/outbox HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"

/* head: the request line and headers up to (not including) the blank line, with %d for the
 * smuggled request's length where a Content-Length wants it. Wants a 400 with Connection:
 * close, no other answer, and the close. */
static void expect_refused(const char *head_fmt, bool ours, const char *what) {
  char smuggled[256], head[512], request[1024];
  snprintf(smuggled, sizeof smuggled, SMUGGLED, key_acme);
  snprintf(head, sizeof head, head_fmt, (int)strlen(smuggled));
  int len = snprintf(request, sizeof request, "%s\r\n\r\n%s", head, smuggled);
  bool closed;
  char *got = exchange("127.0.0.1", request, (size_t)len, 5000, &closed);
  int answers = count_of(got, "HTTP/1.1 "), refusals = count_of(got, "HTTP/1.1 400 ");
  /* ours: one problem+json 400; else libmicrohttpd's own, whose header block 0.9.75 repeats */
  bool want_count = ours ? answers == 1 && strstr(got, "application/problem+json") : answers >= 1;
  if (!want_count || refusals != answers || !closed || !strstr(got, "Connection: close")) {
    print_error("%s: got %d answers, %d of them 400 (closed: %s):\n%s\nwant one 400 with Connection: close, then the "
                "close\n", what, answers, refusals, closed ? "yes" : "no", got);
    free(got);
    fail();
  }
  free(got);
}

static void test_two_content_lengths(void **state) {
  expect_refused("GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: %d", true, "0 then the length");
  expect_refused("GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nContent-Length: 0", true, "the length then 0");
}

static void test_equal_content_lengths(void **state) {
  expect_refused("POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: %1$d\r\nContent-Length: %1$d", true, "twice the same");
}

static void test_bad_content_length(void **state) {
  expect_refused("POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 0, %d", false, "a list");
  expect_refused("POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: +%d", false, "a sign");
}

static void test_content_length_with_transfer_encoding(void **state) {
  expect_refused("POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked", true, "CL then TE");
  expect_refused("POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: %d", true, "TE then CL");
}

/* The check refuses ambiguity only: two well-formed pipelined requests get two answers. */
static void test_pipelined_requests_answered(void **state) {
  static const char request[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                                "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  bool closed;
  char *got = exchange("127.0.0.1", request, sizeof request - 1, 5000, &closed);
  if (count_of(got, "HTTP/1.1 200 ") != 2) {
    print_error("pipelined: got\n%s\nwant two 200 answers\n", got);
    free(got);
    fail();
  }
  free(got);
}

/* ---- slow connections --------------------------------------------------------------------- */

/* The server's thread count (/proc/PID/status). */
static int server_threads(void) {
  char path[64], line[256];
  int n = -1;
  snprintf(path, sizeof path, "/proc/%d/status", (int)outboxd.proc.pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  fclose(f);
  return n;
}

/* One request from OTHER_CLIENT that must be answered `want` within OTHER_DEADLINE_MS. */
static void other_client(const char *method, const char *path, const char *body, const char *want, int round) {
  char request[1024];
  int len = snprintf(request, sizeof request,
                     "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, key_acme, body ? strlen(body) : 0, body ? body : "");
  int64_t t0 = obx_test_now_ms();
  bool closed;
  char *got = exchange(OTHER_CLIENT, request, (size_t)len, OTHER_DEADLINE_MS, &closed);
  int64_t took = obx_test_now_ms() - t0;
  if (strncmp(got, want, strlen(want)) != 0 || took > OTHER_DEADLINE_MS) {
    print_error("round %d: %s %s from %s: got \"%.80s\" after %lld ms, want \"%s\" within %d ms\n", round, method, path,
                OTHER_CLIENT, got, (long long)took, want, OTHER_DEADLINE_MS);
    free(got);
    fail();
  }
  free(got);
}

/* A slow connection is over when the server closed it (end of stream or reset). */
static bool slow_closed(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

typedef struct {
  int *fds;
  int n;
} slow_t;

static bool all_slow_closed(void *arg) {
  slow_t *slow = arg;
  for (int i = 0; i < slow->n; i++)
    if (slow->fds[i] >= 0 && !slow_closed(slow->fds[i])) return false;
  return true;
}

static void test_slow_connections_do_not_starve_others(void **state) {
  int fds[SLOW_CONNS];
  int threads_before = server_threads();
  for (int i = 0; i < SLOW_CONNS; i++) {
    fds[i] = connect_from("127.0.0.1", outboxd.port, true);
    assert_true(fds[i] >= 0);
  }
  int max_threads = threads_before, orders = 0;
  for (int round = 0; round < SLOW_ROUNDS; round++) {
    /* one more byte of "GET /healthz HTTP/1.1\r\n..." on every connection still open */
    static const char drip[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < SLOW_CONNS; i++) send(fds[i], &drip[round % (sizeof drip - 1)], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    int64_t next = obx_test_now_ms() + SLOW_INTERVAL_MS;
    while (obx_test_now_ms() < next) {
      char body[160];
      snprintf(body, sizeof body, "{\"customerEmail\": \"slow@company.com\", \"amount\": \"1.00\", \"orderNumber\": \"SLOW-%d\"}",
               orders++);
      other_client("GET", "/healthz", NULL, "HTTP/1.1 200 ", round);
      other_client("POST", "/orders", body, "HTTP/1.1 201 ", round);
      int t = server_threads();
      if (t > max_threads) max_threads = t;
      poll(NULL, 0, 250); /* pacing of the other client, not a wait for a condition */
    }
  }
  /* an idle connection costs no thread: at most the two the request workers may add lazily */
  if (max_threads > threads_before + 2) {
    print_error("threads: %d before, %d at most with %d slow connections\n", threads_before, max_threads, SLOW_CONNS);
    fail();
  }
  /* every slow connection is refused at accept or closed by the header deadline */
  slow_t slow = {fds, SLOW_CONNS};
  if (!obx_test_wait_for(all_slow_closed, &slow, 10000, 100)) {
    int open = 0;
    for (int i = 0; i < SLOW_CONNS; i++) open += !slow_closed(fds[i]);
    print_error("%d of %d slow connections still open after the header deadline\n", open, SLOW_CONNS);
    fail();
  }
  for (int i = 0; i < SLOW_CONNS; i++) close(fds[i]);
  print_message("%d orders answered 201 from %s while %d connections dripped from 127.0.0.1; threads %d -> %d max\n",
                orders, OTHER_CLIENT, SLOW_CONNS, threads_before, max_threads);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_two_content_lengths),
    cmocka_unit_test(test_equal_content_lengths),
    cmocka_unit_test(test_bad_content_length),
    cmocka_unit_test(test_content_length_with_transfer_encoding),
    cmocka_unit_test(test_pipelined_requests_answered),
    cmocka_unit_test(test_slow_connections_do_not_starve_others),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
