/* ladder_conn.c - the ladder's connections: names, (re)connect with backoff, the topology
 *
 * DESIGN: owns one AMQP connection's life for the publisher (ladder.c) and each consumer
 * (ladder_consumer.c): the queue and exchange names built from the prefix, the open (obx_amqp.h:
 * TCP or TLS, heartbeats, login), the idempotent declare of the topology on every (re)connect
 * (obx_ladder.h), and the drop that arms the backoff (100 ms doubling to 10 s). Never publishes
 * or consumes a message. */
#include <amqp.h>
#include <amqp_framing.h>
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_amqp.h"
#include "obx/obx_log.h"
#include "ladder_int.h"

static char *fmt_name(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fmt_name(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  assert(s);
  return s;
}

void ladder_names_cleanup(names_t *n) {
  obx_amqp_target_cleanup(&n->target);
  free(n->exchange);
  free(n->work);
  free(n->dlq);
  for (int i = 0; i < n->ntiers; i++) free(n->tier_queues ? n->tier_queues[i] : NULL);
  free(n->tier_queues);
  free(n->tiers_ms);
  memset(n, 0, sizeof *n);
}

bool ladder_names_init(names_t *n, const obx_ladder_opts_t *opts, obx_err_t *err) {
  memset(n, 0, sizeof *n);
  if (!obx_amqp_target_init(&n->target, opts->url, &opts->amqp, err)) return false;
  const char *prefix = opts->prefix && opts->prefix[0] ? opts->prefix : "outboxd";
  n->exchange = fmt_name("%s.retry", prefix);
  n->work = fmt_name("%s.work", prefix);
  n->dlq = fmt_name("%s.dlq", prefix);
  n->ntiers = opts->ntiers;
  n->tiers_ms = calloc((size_t)(opts->ntiers ? opts->ntiers : 1), sizeof *n->tiers_ms);
  n->tier_queues = calloc((size_t)(opts->ntiers ? opts->ntiers : 1), sizeof *n->tier_queues);
  assert(n->tiers_ms && n->tier_queues);
  for (int i = 0; i < opts->ntiers; i++) {
    if (opts->tiers_ms[i] <= 0 || opts->tiers_ms[i] > UINT32_MAX) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "RETRY_LADDER tier %d has a bad delay %" PRId64 " ms", i + 1,
                  opts->tiers_ms[i]);
      ladder_names_cleanup(n);
      return false;
    }
    n->tiers_ms[i] = opts->tiers_ms[i];
    n->tier_queues[i] = fmt_name("%s.retry.%" PRId64 "ms", prefix, opts->tiers_ms[i]);
  }
  n->confirm_timeout_ms = opts->confirm_timeout_ms > 0 ? opts->confirm_timeout_ms : 5000;
  return true;
}

bool ladder_rpc_ok(amqp_connection_state_t conn, const char *what, obx_err_t *err) {
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return true;
  obx_err_from_amqp(err, &r, what);
  return false;
}

/* The next connection attempt waits backoff_ms, which doubles up to BACKOFF_MAX_MS. */
static void arm_backoff(conn_t *c) {
  c->next_try_ms = obx_time_mono_ms() + c->backoff_ms;
  c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
}

void ladder_conn_drop(conn_t *c) {
  if (!c->conn) return;
  obx_amqp_close(c->conn);
  c->conn = NULL;
  arm_backoff(c);
}

amqp_table_entry_t ladder_arg_str(const char *key, const char *value) {
  amqp_table_entry_t e;
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_UTF8;
  e.value.value.bytes = amqp_cstring_bytes(value);
  return e;
}

static amqp_table_entry_t arg_i64(const char *key, int64_t value) {
  amqp_table_entry_t e;
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_I64;
  e.value.value.i64 = value;
  return e;
}

/* Declares a durable queue with args. A queue that exists with other arguments (declared by an
 * older outboxd, before x-delivery-limit and the work queue's dead-lettering: RabbitMQ refuses
 * the declare with 406 PRECONDITION_FAILED "inequivalent arg") is used as it is: channel 1 is
 * reopened, the queue's existence checked with a passive declare, and a warning names the
 * argument and how to get the new ones (README "RabbitMQ"). Called before channel 1 is put in
 * confirm mode or consumes, so reopening it loses nothing. */
static bool declare_queue(amqp_connection_state_t conn, const char *queue, amqp_table_entry_t *args, int nargs,
                          obx_err_t *err) {
  amqp_table_t table = {nargs, args};
  amqp_queue_declare(conn, CH_PUBLISH, amqp_cstring_bytes(queue), 0, 1, 0, 0, table);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return true;
  const amqp_channel_close_t *close = r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
                                          r.reply.id == AMQP_CHANNEL_CLOSE_METHOD ? r.reply.decoded : NULL;
  if (close && close->reply_code == AMQP_PRECONDITION_FAILED) {
    char why[256];
    snprintf(why, sizeof why, "%.*s", (int)close->reply_text.len, (const char *)close->reply_text.bytes);
    amqp_channel_close_ok_t ok = {0};
    amqp_send_method(conn, CH_PUBLISH, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
    amqp_channel_open(conn, CH_PUBLISH);
    if (!ladder_rpc_ok(conn, "channel.open", err)) return false;
    amqp_queue_declare(conn, CH_PUBLISH, amqp_cstring_bytes(queue), 1, 1, 0, 0, amqp_empty_table);
    if (!ladder_rpc_ok(conn, "queue.declare (passive)", err)) {
      obx_err_prefix(err, "declaring %s", queue);
      return false;
    }
    obx_warn("RabbitMQ queue %s exists with other arguments (%s); using it as it is. Its delivery limit is "
             "RabbitMQ's (4.x: 20, then dropped): set a delivery-limit policy, or delete the queue once it is "
             "empty so it is declared again (README: RabbitMQ)", queue, why);
    return true;
  }
  obx_err_from_amqp(err, &r, "queue.declare");
  obx_err_prefix(err, "declaring %s", queue);
  return false;
}

static bool declare_topology(amqp_connection_state_t conn, const names_t *n, obx_err_t *err) {
  amqp_exchange_declare(conn, CH_PUBLISH, amqp_cstring_bytes(n->exchange), amqp_cstring_bytes("direct"), 0, 1, 0, 0,
                        amqp_empty_table);
  if (!ladder_rpc_ok(conn, "exchange.declare", err)) return false;
  /* Every queue's delivery limit is explicit (RabbitMQ 4.x would otherwise apply 20 and drop
   * what exceeds it). The work queue's bounds what is given back (lost connections, crash
   * loops, infra give-backs) and parks the message in the DLQ past it; the DLQ's is never
   * reached (it is the end: nothing to dead-letter to). */
  amqp_table_entry_t work[] = {
    ladder_arg_str("x-queue-type", "quorum"),
    arg_i64("x-delivery-limit", OBX_LADDER_WORK_DELIVERY_LIMIT),
    ladder_arg_str("x-dead-letter-exchange", ""),
    ladder_arg_str("x-dead-letter-routing-key", n->dlq),
    ladder_arg_str("x-dead-letter-strategy", "at-least-once"),
    ladder_arg_str("x-overflow", "reject-publish"),
  };
  if (!declare_queue(conn, n->work, work, (int)(sizeof work / sizeof work[0]), err)) return false;
  amqp_table_entry_t dlq[] = {ladder_arg_str("x-queue-type", "quorum"), arg_i64("x-delivery-limit", OBX_LADDER_DLQ_DELIVERY_LIMIT)};
  if (!declare_queue(conn, n->dlq, dlq, (int)(sizeof dlq / sizeof dlq[0]), err)) return false;
  for (int i = 0; i < n->ntiers; i++) {
    amqp_table_entry_t args[] = {
      ladder_arg_str("x-queue-type", "quorum"),
      arg_i64("x-delivery-limit", OBX_LADDER_WORK_DELIVERY_LIMIT), /* nothing consumes a tier: never reached */
      arg_i64("x-message-ttl", n->tiers_ms[i]),
      ladder_arg_str("x-dead-letter-exchange", ""),
      ladder_arg_str("x-dead-letter-routing-key", n->work),
      ladder_arg_str("x-dead-letter-strategy", "at-least-once"),
      ladder_arg_str("x-overflow", "reject-publish"),
    };
    if (!declare_queue(conn, n->tier_queues[i], args, (int)(sizeof args / sizeof args[0]), err)) return false;
    amqp_queue_bind(conn, CH_PUBLISH, amqp_cstring_bytes(n->tier_queues[i]), amqp_cstring_bytes(n->exchange),
                    amqp_cstring_bytes(n->tier_queues[i]), amqp_empty_table);
    if (!ladder_rpc_ok(conn, "queue.bind", err)) return false;
  }
  return true;
}

/* Opens the connection, channel 1, and declares the topology. Respects the backoff. */
bool ladder_conn_open(conn_t *c, const names_t *n, const char *name, obx_err_t *err) {
  if (c->conn) return true;
  int64_t now = obx_time_mono_ms();
  if (now < c->next_try_ms) {
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_SOCKET_ERROR, true, "RabbitMQ unavailable, next attempt in %" PRId64 " ms",
                c->next_try_ms - now);
    return false;
  }
  if (!c->backoff_ms) c->backoff_ms = BACKOFF_MIN_MS;
  bool ok = false;
  amqp_connection_state_t conn = obx_amqp_open(&n->target, name, n->confirm_timeout_ms, err);
  if (!conn) goto done;
  amqp_channel_open(conn, CH_PUBLISH);
  if (!ladder_rpc_ok(conn, "channel.open", err)) goto done;
  if (!declare_topology(conn, n, err)) goto done;
  ok = true;
done:
  if (!ok) {
    if (conn) amqp_destroy_connection(conn);
    arm_backoff(c);
    return false;
  }
  c->conn = conn;
  c->backoff_ms = BACKOFF_MIN_MS;
  c->epoch++;
  c->publish_seq = 0;
  obx_info("connected to RabbitMQ %s:%d%s (%s)", n->target.host, n->target.port, n->target.tls ? " over TLS" : "", name);
  return true;
}
