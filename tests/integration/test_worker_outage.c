/* test_worker_outage.c - the worker starts with RabbitMQ down, catches up, and survives a drop
 *
 * DESIGN: the worker reaches RabbitMQ through a TCP proxy inside the test, which can refuse
 * connections ("down": listener closed, every proxied connection cut) and accept them again
 * ("up", same port). Events that need no retry run while RabbitMQ is down; an event that must
 * go to a retry tier waits on its runner with its retry recorded first (RETRYING, retrySent
 * false; offset not committed), is published once the broker is back (retrySent true) and
 * completes. A Kafka broker outage in the middle of consumption loses nothing
 * either: that test has a real broker of its own, frozen (SIGSTOP) and later killed (SIGKILL)
 * and started again on the same port and data. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "worker_test.h"

#define MAX_PAIRS 32

typedef struct {
  int port;                 /* the proxy's port, stable across down/up */
  int upstream_port;
  atomic_bool up, quit;
  pthread_t thread;
  int lfd;
  int pairs[MAX_PAIRS][2];  /* client fd, upstream fd; -1 when free */
} proxy_t;

static int listen_on(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void close_pair(proxy_t *p, int i) {
  close(p->pairs[i][0]);
  close(p->pairs[i][1]);
  p->pairs[i][0] = p->pairs[i][1] = -1;
}

static void *proxy_main(void *arg) {
  proxy_t *p = arg;
  while (!atomic_load(&p->quit)) {
    bool up = atomic_load(&p->up);
    if (up && p->lfd < 0) p->lfd = listen_on(p->port);
    if (!up && p->lfd >= 0) {
      close(p->lfd);
      p->lfd = -1;
      for (int i = 0; i < MAX_PAIRS; i++)
        if (p->pairs[i][0] >= 0) close_pair(p, i);
    }
    struct pollfd fds[1 + 2 * MAX_PAIRS];
    int map[1 + 2 * MAX_PAIRS], n = 0;
    if (p->lfd >= 0) {
      fds[n] = (struct pollfd){p->lfd, POLLIN, 0};
      map[n++] = -1;
    }
    for (int i = 0; i < MAX_PAIRS; i++)
      for (int s = 0; s < 2 && p->pairs[i][0] >= 0; s++) {
        fds[n] = (struct pollfd){p->pairs[i][s], POLLIN, 0};
        map[n++] = i * 2 + s;
      }
    if (poll(fds, (nfds_t)n, 20) <= 0) continue;
    for (int k = 0; k < n; k++) {
      if (!fds[k].revents) continue;
      if (map[k] < 0) {
        int c = accept(p->lfd, NULL, NULL);
        if (c < 0) continue;
        int u = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->upstream_port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int slot = -1;
        for (int i = 0; i < MAX_PAIRS && slot < 0; i++)
          if (p->pairs[i][0] < 0) slot = i;
        if (slot < 0 || connect(u, (struct sockaddr *)&a, sizeof a) != 0) {
          close(c);
          close(u);
          continue;
        }
        p->pairs[slot][0] = c;
        p->pairs[slot][1] = u;
        continue;
      }
      int i = map[k] / 2, s = map[k] % 2;
      if (p->pairs[i][0] < 0) continue;
      char buf[16384];
      ssize_t r = read(p->pairs[i][s], buf, sizeof buf);
      if (r <= 0 || write(p->pairs[i][1 - s], buf, (size_t)r) != r) close_pair(p, i);
    }
  }
  if (p->lfd >= 0) close(p->lfd);
  for (int i = 0; i < MAX_PAIRS; i++)
    if (p->pairs[i][0] >= 0) close_pair(p, i);
  return NULL;
}

/* Starts the proxy (down) in front of the RabbitMQ of AMQP_URL; writes the proxied URL. */
static void proxy_start(proxy_t *p, char *url, size_t urllen) {
  memset(p, 0, sizeof *p);
  for (int i = 0; i < MAX_PAIRS; i++) p->pairs[i][0] = p->pairs[i][1] = -1;
  struct amqp_connection_info info;
  char *copy = strdup(getenv("AMQP_URL"));
  assert_int_equal(amqp_parse_url(copy, &info), AMQP_STATUS_OK);
  p->upstream_port = info.port;
  int fd = listen_on(0); /* pick a free port, then go down on it */
  struct sockaddr_in a;
  socklen_t alen = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &alen);
  p->port = ntohs(a.sin_port);
  close(fd);
  p->lfd = -1;
  snprintf(url, urllen, "amqp://%s:%s@127.0.0.1:%d/%%2F", info.user, info.password, p->port);
  free(copy);
  pthread_create(&p->thread, NULL, proxy_main, p);
}

static void proxy_stop(proxy_t *p) {
  atomic_store(&p->quit, true);
  pthread_join(p->thread, NULL);
}

typedef struct {
  wt_fx_t *fx;
  proxy_t proxy;
} outage_fx_t;

static int setup_on(void **state, bool private_broker) {
  if (!getenv("AMQP_URL") || !getenv("OBX_TEST_KAFKA_DIR")) return 0;
  outage_fx_t *o = calloc(1, sizeof *o);
  o->fx = wt_setup_on(1, NULL, private_broker);
  char url[256];
  proxy_start(&o->proxy, url, sizeof url);
  wt_conf_set(o->fx, "amqp.url", url);
  *state = o;
  return 0;
}

static int setup(void **state) { return setup_on(state, false); }
static int setup_private_broker(void **state) { return setup_on(state, true); }

static int teardown(void **state) {
  outage_fx_t *o = *state;
  if (!o) return 0;
  obx_worker_destroy(o->fx->worker);
  o->fx->worker = NULL;
  proxy_stop(&o->proxy);
  wt_teardown(o->fx);
  free(o);
  return 0;
}

/* retrySent of an inbox entry: 1 true, 0 false, -1 absent. */
static int retry_sent(wt_fx_t *fx, const char *id) {
  bson_t doc;
  bson_iter_t it;
  int v = -1;
  if (wt_inbox(fx, id, &doc) && bson_iter_init_find(&it, &doc, "retrySent") && BSON_ITER_HOLDS_BOOL(&it))
    v = bson_iter_bool(&it) ? 1 : 0;
  bson_destroy(&doc);
  return v;
}

static void test_starts_with_rabbitmq_down_and_catches_up(void **state) {
  WT_NEED_BROKER();
  outage_fx_t *o = *state;
  wt_fx_t *fx = o->fx;
  fx->attempts = 4;
  wt_start_worker(fx); /* RabbitMQ unreachable */

  obx_event_t ok, failing, later;
  wt_event(&ok, "OrderConfirmed", "K-A", "U-1");
  wt_event(&failing, "OrderConfirmed", "K-B", "U-2");
  wt_event(&later, "OrderConfirmed", "K-C", "U-3");
  wt_route(fx, "U-1", 200);
  wt_route(fx, "U-2", 503);
  wt_route(fx, "U-3", 200);
  wt_produce(fx, &ok);
  wt_produce(fx, &failing);
  wt_wait_status(fx, ok.id, "DONE"); /* success needs no RabbitMQ */
  wt_wait_calls(fx, "U-2", 1);
  /* The failed event cannot reach its retry tier: its retry is recorded first (intent), not sent. */
  wt_wait_status(fx, failing.id, "RETRYING");
  usleep(1500 * 1000);
  if (retry_sent(fx, failing.id) != 0) fail_msg("retrySent with RabbitMQ down: got %d, want 0 (false)", retry_sent(fx, failing.id));
  assert_int_equal(wt_erp_calls(fx, "U-2"), 1);

  atomic_store(&o->proxy.up, true);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (retry_sent(fx, failing.id) == 0 && obx_test_now_ms() < deadline) usleep(20000);
  wt_route(fx, "U-2", 200);
  wt_wait_status(fx, failing.id, "DONE");

  /* A drop of every connection: the next publish reconnects and redeclares. */
  atomic_store(&o->proxy.up, false);
  usleep(300 * 1000);
  wt_route(fx, "U-3", 503);
  wt_produce(fx, &later);
  wt_wait_calls(fx, "U-3", 1);
  atomic_store(&o->proxy.up, true);
  wt_wait_status(fx, later.id, "RETRYING");
  wt_route(fx, "U-3", 200);
  wt_wait_status(fx, later.id, "DONE");
  if (wt_executions(fx, later.id) < 2) fail_msg("the retried event has %lld executions, want >= 2",
                                                (long long)wt_executions(fx, later.id));
  obx_event_cleanup(&ok);
  obx_event_cleanup(&failing);
  obx_event_cleanup(&later);
}

/* DONE inbox entries, at least `want` of them within WT_WAIT_MS. */
static void wait_done_at_least(wt_fx_t *fx, int64_t want) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_inbox_count(fx, "DONE") < want && obx_test_now_ms() < deadline) usleep(5000);
  if (wt_inbox_count(fx, "DONE") < want)
    fail_msg("DONE: got %lld, want >= %lld", (long long)wt_inbox_count(fx, "DONE"), (long long)want);
}

/* The Kafka broker freezes (SIGSTOP for 2 s) and later dies (SIGKILL, started again on the
 * same port and data) while the worker consumes one key's events, 300 ms each: every event
 * ends DONE with exactly one execution, and the key's events ran in offset order. */
static void test_kafka_outage_loses_nothing(void **state) {
  WT_NEED_BROKER();
  outage_fx_t *o = *state;
  wt_fx_t *fx = o->fx;
  atomic_store(&o->proxy.up, true);
  enum { N = 24 };
  obx_event_t ev[N];
  char num[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(num[i], sizeof num[i], "KO-%d", i);
    wt_event(&ev[i], "OrderConfirmed", "KO", num[i]);
    wt_route_delay(fx, num[i], 200, 300);
    wt_produce(fx, &ev[i]);
  }
  wt_start_worker(fx);
  wait_done_at_least(fx, 3);
  assert_true(obx_test_broker_signal(&fx->broker, SIGSTOP));
  int64_t thaw = obx_test_now_ms() + 2000; /* the outage itself: a frozen broker for 2 s */
  while (obx_test_now_ms() < thaw) usleep(20 * 1000);
  assert_true(obx_test_broker_signal(&fx->broker, SIGCONT));
  int64_t done = wt_inbox_count(fx, "DONE");
  if (done >= N) fail_msg("every event was DONE before the broker was killed: no consumption to interrupt");
  wait_done_at_least(fx, done + 2);
  int64_t killed_at = wt_inbox_count(fx, "DONE");
  assert_true(obx_test_broker_signal(&fx->broker, SIGKILL));
  assert_true(obx_test_broker_restart(&fx->broker));
  print_message("Kafka outage: frozen at %lld of %d DONE, killed at %lld\n", (long long)done, N, (long long)killed_at);
  if (killed_at >= N) fail_msg("every event was DONE before the broker was killed: no consumption to interrupt");
  for (int i = 0; i < N; i++) wt_wait_status(fx, ev[i].id, "DONE");
  for (int i = 0; i < N; i++) {
    int64_t runs = wt_executions(fx, ev[i].id);
    if (runs != 1) fail_msg("event %d: %lld executions, want 1", i, (long long)runs);
    if (i > 0 && wt_last_call_index(fx, num[i]) < wt_last_call_index(fx, num[i - 1]))
      fail_msg("event %d of key KO ran before event %d", i, i - 1);
  }
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_starts_with_rabbitmq_down_and_catches_up, setup, teardown),
    cmocka_unit_test_setup_teardown(test_kafka_outage_loses_nothing, setup_private_broker, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
