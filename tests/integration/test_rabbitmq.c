/* test_rabbitmq.c - the private RabbitMQ node does what the retry ladder relies on
 *
 * DESIGN: runs against the node scripts/rabbitmq.sh starts (AMQP_URL, exported by
 * scripts/test.sh). Proves, with rabbitmq-c 0.11, the broker features the worker uses:
 * durable quorum queues, publisher confirms, persistent messages consumed in order with
 * manual acks, and queue TTL + dead-letter exchange routing an expired message onwards (one
 * rung of the retry ladder). Every queue and exchange has a unique name and is deleted.
 * scripts/rabbitmq.sh itself: a node starts on a port that TIME-WAIT connections still name
 * (what a node just stopped leaves behind), at once. */
#include "obx_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

#define CH 1
#define RPC_TIMEOUT_S 30
#define WAIT_TIMEOUT_MS 60000

static amqp_connection_state_t conn;
static char uniq[64];
/* Publisher confirm tags count the publishes on the channel, from 1. */
static uint64_t published, confirmed;

static void check_reply(amqp_rpc_reply_t r, const char *what) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      fail_msg("%s: got library error %s, want success", what, amqp_error_string2(r.library_error));
      break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *c = r.reply.decoded;
        fail_msg("%s: got channel close %d %.*s, want success", what, c->reply_code,
                 (int)c->reply_text.len, (const char *)c->reply_text.bytes);
      }
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        amqp_connection_close_t *c = r.reply.decoded;
        fail_msg("%s: got connection close %d %.*s, want success", what, c->reply_code,
                 (int)c->reply_text.len, (const char *)c->reply_text.bytes);
      }
      fail_msg("%s: got server method 0x%08x, want success", what, r.reply.id);
      break;
    default:
      fail_msg("%s: got no reply, want success", what);
  }
}

static int setup(void **state) {
  const char *url = getenv("AMQP_URL");
  if (!url || !*url) {
    print_error("AMQP_URL is not set: run under scripts/test.sh, or `scripts/rabbitmq.sh start` "
                "and source $OBX_RMQ_DIR/env\n");
    return -1;
  }
  static char buf[512];
  struct amqp_connection_info info;
  snprintf(buf, sizeof buf, "%s", url);
  int rc = amqp_parse_url(buf, &info); /* decodes %2F: info.vhost is "/" */
  if (rc != AMQP_STATUS_OK) {
    print_error("amqp_parse_url(%s): %s\n", url, amqp_error_string2(rc));
    return -1;
  }
  if (strcmp(info.vhost, "/") != 0) {
    print_error("vhost from %s: got '%s', want '/'\n", url, info.vhost);
    return -1;
  }
  conn = amqp_new_connection();
  amqp_socket_t *sock = amqp_tcp_socket_new(conn);
  struct timeval tv = {RPC_TIMEOUT_S, 0};
  if (!sock || amqp_socket_open_noblock(sock, info.host, info.port, &tv) != AMQP_STATUS_OK) {
    print_error("cannot connect to %s:%d\n", info.host, info.port);
    return -1;
  }
  amqp_set_rpc_timeout(conn, &tv);
  amqp_rpc_reply_t r =
    amqp_login(conn, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    print_error("login to %s failed (reply type %d)\n", url, r.reply_type);
    return -1;
  }
  amqp_channel_open(conn, CH);
  if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) return -1;
  amqp_confirm_select(conn, CH);
  if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) return -1;
  snprintf(uniq, sizeof uniq, "%d-%lld", (int)getpid(), (long long)obx_test_now_ms());
  return 0;
}

static int teardown(void **state) {
  if (conn) {
    amqp_channel_close(conn, CH, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
  }
  return 0;
}

/* Declares a durable queue; args: NULL-terminated name/value string pairs, plus an
 * optional integer x-message-ttl (ttl_ms > 0). */
static void queue_declare(const char *name, const char *const *args, int ttl_ms) {
  amqp_table_entry_t e[8];
  int n = 0;
  for (; args && args[0]; args += 2) {
    e[n].key = amqp_cstring_bytes(args[0]);
    e[n].value.kind = AMQP_FIELD_KIND_UTF8;
    e[n].value.value.bytes = amqp_cstring_bytes(args[1]);
    n++;
  }
  if (ttl_ms > 0) {
    e[n].key = amqp_cstring_bytes("x-message-ttl");
    e[n].value.kind = AMQP_FIELD_KIND_I32;
    e[n].value.value.i32 = ttl_ms;
    n++;
  }
  amqp_table_t table = {n, e};
  amqp_queue_declare(conn, CH, amqp_cstring_bytes(name), 0, 1, 0, 0, table);
  check_reply(amqp_get_rpc_reply(conn), name);
}

static void queue_delete(const char *name) {
  amqp_queue_delete(conn, CH, amqp_cstring_bytes(name), 0, 0);
  check_reply(amqp_get_rpc_reply(conn), "queue.delete");
}

/* Publishes a persistent message (mandatory); wait_confirms waits for its ack. */
static void publish(const char *exchange, const char *routing_key, const char *body) {
  amqp_basic_properties_t props = {0};
  props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
  props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
  props.content_type = amqp_cstring_bytes("text/plain");
  int rc = amqp_basic_publish(conn, CH, amqp_cstring_bytes(exchange),
                              amqp_cstring_bytes(routing_key), 1, 0, &props,
                              amqp_cstring_bytes(body));
  if (rc != AMQP_STATUS_OK) fail_msg("publish: got %s, want OK", amqp_error_string2(rc));
  published++;
}

/* Reads frames until every publish so far is acked, in order; fails on nack, basic.return
 * (the message was unroutable), channel close or the deadline. */
static void wait_confirms(void) {
  int64_t deadline = obx_test_now_ms() + WAIT_TIMEOUT_MS;
  while (confirmed < published) {
    if (obx_test_now_ms() >= deadline)
      fail_msg("confirms: got acks up to %llu, want %llu", (unsigned long long)confirmed,
               (unsigned long long)published);
    amqp_frame_t frame;
    struct timeval tv = {1, 0};
    int rc = amqp_simple_wait_frame_noblock(conn, &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT) continue;
    if (rc != AMQP_STATUS_OK) fail_msg("waiting for confirms: %s", amqp_error_string2(rc));
    if (frame.frame_type != AMQP_FRAME_METHOD) continue;
    switch (frame.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD: {
        amqp_basic_ack_t *ack = frame.payload.method.decoded;
        if (ack->delivery_tag != confirmed + 1 && !ack->multiple)
          fail_msg("confirm order: got ack %llu, want %llu", (unsigned long long)ack->delivery_tag,
                   (unsigned long long)(confirmed + 1));
        confirmed = ack->delivery_tag;
        break;
      }
      case AMQP_BASIC_NACK_METHOD:
        fail_msg("confirms: got basic.nack, want basic.ack");
        break;
      case AMQP_BASIC_RETURN_METHOD:
        fail_msg("confirms: message returned as unroutable");
        break;
      case AMQP_CHANNEL_CLOSE_METHOD:
        fail_msg("confirms: channel closed by the broker");
        break;
      default:
        break;
    }
  }
}

/* A durable quorum queue takes N persistent messages with publisher confirms and hands them
 * back in order to a consumer with manual acks; acked messages are gone. */
static void test_quorum_queue_confirms_and_ordered_consume(void **state) {
  enum { N = 50 };
  char queue[128];
  snprintf(queue, sizeof queue, "obx-test-quorum-%s", uniq);
  queue_declare(queue, (const char *const[]){"x-queue-type", "quorum", NULL}, 0);

  for (int i = 0; i < N; i++) {
    char body[32];
    snprintf(body, sizeof body, "msg-%d", i);
    publish("", queue, body);
  }
  wait_confirms();

  amqp_basic_qos(conn, CH, 0, 10, 0);
  check_reply(amqp_get_rpc_reply(conn), "basic.qos");
  amqp_basic_consume_ok_t *ok = amqp_basic_consume(conn, CH, amqp_cstring_bytes(queue),
                                                   amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  check_reply(amqp_get_rpc_reply(conn), "basic.consume");
  amqp_bytes_t ctag = amqp_bytes_malloc_dup(ok->consumer_tag);
  int64_t deadline = obx_test_now_ms() + WAIT_TIMEOUT_MS;
  for (int i = 0; i < N; i++) {
    amqp_envelope_t env;
    struct timeval tv = {1, 0};
    amqp_maybe_release_buffers(conn);
    amqp_rpc_reply_t r = amqp_consume_message(conn, &env, &tv, 0);
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_TIMEOUT && obx_test_now_ms() < deadline) {
      i--;
      continue;
    }
    check_reply(r, "consume");
    char want[32];
    snprintf(want, sizeof want, "msg-%d", i);
    int len = (int)env.message.body.len;
    if (len != (int)strlen(want) || memcmp(env.message.body.bytes, want, (size_t)len))
      fail_msg("message %d: got '%.*s', want '%s'", i, len, (char *)env.message.body.bytes, want);
    assert_int_equal(env.message.properties.delivery_mode, AMQP_DELIVERY_PERSISTENT);
    assert_int_equal(amqp_basic_ack(conn, CH, env.delivery_tag, 0), AMQP_STATUS_OK);
    amqp_destroy_envelope(&env);
  }
  amqp_basic_cancel(conn, CH, ctag);
  check_reply(amqp_get_rpc_reply(conn), "basic.cancel");
  amqp_bytes_free(ctag);

  /* Nothing is left to redeliver: every message was acked. */
  amqp_rpc_reply_t r = amqp_basic_get(conn, CH, amqp_cstring_bytes(queue), 1);
  check_reply(r, "basic.get");
  if (r.reply.id != AMQP_BASIC_GET_EMPTY_METHOD)
    fail_msg("after acking all: got a message, want an empty queue");
  queue_delete(queue);
}

static const amqp_field_value_t *table_get(const amqp_table_t *t, const char *key) {
  for (int i = 0; i < t->num_entries; i++) {
    const amqp_bytes_t k = t->entries[i].key;
    if (k.len == strlen(key) && !memcmp(k.bytes, key, k.len)) return &t->entries[i].value;
  }
  return NULL;
}

static bool bytes_eq(const amqp_field_value_t *v, const char *want) {
  return v && (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES) &&
         v->value.bytes.len == strlen(want) && !memcmp(v->value.bytes.bytes, want, strlen(want));
}

/* One rung of the retry ladder: a message in a wait queue with a queue TTL expires and is
 * dead-lettered through an exchange to the work queue, carrying x-death (reason expired). */
static void test_ttl_dead_letter_routes_expired_message(void **state) {
  enum { TTL_MS = 500 };
  char wait_q[128], work_q[128], dlx[128];
  snprintf(wait_q, sizeof wait_q, "obx-test-wait-%s", uniq);
  snprintf(work_q, sizeof work_q, "obx-test-work-%s", uniq);
  snprintf(dlx, sizeof dlx, "obx-test-dlx-%s", uniq);

  amqp_exchange_declare(conn, CH, amqp_cstring_bytes(dlx), amqp_cstring_bytes("direct"), 0, 1, 0,
                        0, amqp_empty_table);
  check_reply(amqp_get_rpc_reply(conn), "exchange.declare");
  queue_declare(work_q, (const char *const[]){"x-queue-type", "quorum", NULL}, 0);
  amqp_queue_bind(conn, CH, amqp_cstring_bytes(work_q), amqp_cstring_bytes(dlx),
                  amqp_cstring_bytes(work_q), amqp_empty_table);
  check_reply(amqp_get_rpc_reply(conn), "queue.bind");
  queue_declare(wait_q,
                (const char *const[]){"x-queue-type", "quorum", "x-dead-letter-exchange", dlx,
                                      "x-dead-letter-routing-key", work_q, NULL},
                TTL_MS);

  int64_t t0 = obx_test_now_ms();
  publish("", wait_q, "retry-me");
  wait_confirms();

  amqp_rpc_reply_t r;
  int64_t deadline = obx_test_now_ms() + WAIT_TIMEOUT_MS;
  for (;;) {
    r = amqp_basic_get(conn, CH, amqp_cstring_bytes(work_q), 0);
    check_reply(r, "basic.get");
    if (r.reply.id == AMQP_BASIC_GET_OK_METHOD) break;
    if (obx_test_now_ms() >= deadline)
      fail_msg("work queue: got nothing after %d ms, want the expired message", WAIT_TIMEOUT_MS);
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
  int64_t elapsed = obx_test_now_ms() - t0;
  amqp_basic_get_ok_t *get = r.reply.decoded;
  uint64_t dtag = get->delivery_tag;
  amqp_message_t msg;
  check_reply(amqp_read_message(conn, CH, &msg, 0), "read message");
  if (msg.body.len != 8 || memcmp(msg.body.bytes, "retry-me", 8))
    fail_msg("dead-lettered body: got '%.*s', want 'retry-me'", (int)msg.body.len,
             (char *)msg.body.bytes);
  if (elapsed < TTL_MS - 100)
    fail_msg("dead-lettered after %lld ms, want at least the TTL %d ms", (long long)elapsed,
             TTL_MS);

  assert_true(msg.properties._flags & AMQP_BASIC_HEADERS_FLAG);
  const amqp_field_value_t *death = table_get(&msg.properties.headers, "x-death");
  if (!death || death->kind != AMQP_FIELD_KIND_ARRAY || death->value.array.num_entries < 1 ||
      death->value.array.entries[0].kind != AMQP_FIELD_KIND_TABLE)
    fail_msg("x-death: got none, want an array of tables");
  const amqp_table_t *d0 = &death->value.array.entries[0].value.table;
  if (!bytes_eq(table_get(d0, "reason"), "expired"))
    fail_msg("x-death reason: want 'expired'");
  if (!bytes_eq(table_get(d0, "queue"), wait_q)) fail_msg("x-death queue: want '%s'", wait_q);
  amqp_destroy_message(&msg);
  assert_int_equal(amqp_basic_ack(conn, CH, dtag, 0), AMQP_STATUS_OK);

  queue_delete(wait_q);
  queue_delete(work_q);
  amqp_exchange_delete(conn, CH, amqp_cstring_bytes(dlx), 0);
  check_reply(amqp_get_rpc_reply(conn), "exchange.delete");
}

/* A listener on 127.0.0.1:port (SO_REUSEADDR, so it binds over TIME-WAIT); -1 when taken. */
static int listen_on(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Leaves a TIME-WAIT connection whose local port is `port`: the accepting side closes first. */
static void time_wait_on(int lfd, int port) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
  int a = accept(lfd, NULL, NULL);
  assert_true(a >= 0);
  close(a);
  char buf[1];
  assert_int_equal(recv(c, buf, 1, 0), 0); /* the FIN arrived: the accepted side is in FIN-WAIT-2/TIME-WAIT */
  close(c);
}

/* The AMQP port of a node started with OBX_RMQ_PORT=P is P, even while TIME-WAIT sockets of
 * an earlier node hold P: `ss` counts listening and established sockets only. */
static void test_script_restarts_on_its_port_at_once(void **state) {
  char dir[300], cmd[1200], env_path[340], line[256];
  /* under /tmp itself: run as root the node runs as `rabbitmq`, which the test's private
   * temp directory keeps out */
  snprintf(dir, sizeof dir, "/tmp/obx-rmq-restart-%d", (int)getpid());
  int port = 0, lfd = -1;
  srand((unsigned)getpid());
  for (int tries = 0; tries < 50 && lfd < 0; tries++) {
    port = 20000 + rand() % 9000;
    lfd = listen_on(port);
  }
  assert_true(lfd >= 0);
  time_wait_on(lfd, port);
  close(lfd);
  snprintf(cmd, sizeof cmd, "ss -Htan state time-wait '( sport = :%d )' | grep -q .", port);
  assert_int_equal(system(cmd), 0); /* the precondition: a TIME-WAIT names the port */
  int64_t t0 = obx_test_now_ms();
  snprintf(cmd, sizeof cmd, "OBX_RMQ_DIR=%s OBX_RMQ_PORT=%d %s/scripts/rabbitmq.sh start", dir, port, OBX_SOURCE_DIR);
  int rc = system(cmd);
  int64_t took = obx_test_now_ms() - t0;
  snprintf(env_path, sizeof env_path, "%s/env", dir);
  FILE *f = fopen(env_path, "r");
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d/", port);
  bool on_port = false;
  while (f && fgets(line, sizeof line, f)) on_port |= strstr(line, want) != NULL;
  if (f) fclose(f);
  snprintf(cmd, sizeof cmd, "OBX_RMQ_DIR=%s %s/scripts/rabbitmq.sh stop", dir, OBX_SOURCE_DIR);
  int stop_rc = system(cmd);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  if (rc != 0 || !on_port) fail_msg("start on port %d beside a TIME-WAIT: exit %d, env names the port: %s", port, rc,
                                    on_port ? "yes" : "no");
  assert_int_equal(stop_rc, 0);
  print_message("started on port %d beside its TIME-WAIT in %lld ms\n", port, (long long)took);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_quorum_queue_confirms_and_ordered_consume),
    cmocka_unit_test(test_ttl_dead_letter_routes_expired_message),
    cmocka_unit_test(test_script_restarts_on_its_port_at_once),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
