/* ladder.c - the RabbitMQ retry ladder's publisher: retry tiers, the work queue, the DLQ
 *
 * DESIGN: see include/obx/obx_ladder.h for the topology and the message format. rabbitmq-c
 * connections are not thread-safe, so the publisher (obx_ladder_t) serialises every call with
 * one mutex around one connection (channel 1: confirm mode; channel 2: DLQ browsing,
 * ladder_dlq.c, opened per operation). Owns the envelope's AMQP form on publish (the x-* headers,
 * what a publish cannot carry) and the confirmed publish. Connection problems never abort: they
 * drop the connection, arm the backoff and return a retriable error; the next call reconnects
 * and redeclares the topology (ladder_conn.c). Never consumes (ladder_consumer.c). */
#include "obx/obx_ladder.h"

#include <amqp.h>
#include <amqp_framing.h>
#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <bson/bson.h>

#include "obx/obx_amqp.h"
#include "obx/obx_log.h"
#include "ladder_int.h"

/* A header value as AMQP carries it: a UTF-8 string when it is one, else a byte array (the
 * bytes unchanged), cut to OBX_LADDER_MAX_VALUE bytes (obx_ladder_carry_notes says so). */
static amqp_table_entry_t hdr_bytes(const char *key, const void *value, size_t len) {
  amqp_table_entry_t e;
  e.key = amqp_cstring_bytes(key);
  if (len > OBX_LADDER_MAX_VALUE) len = OBX_LADDER_MAX_VALUE;
  e.value.kind = bson_utf8_validate(value, len, false) ? AMQP_FIELD_KIND_UTF8 : AMQP_FIELD_KIND_BYTES;
  e.value.value.bytes.bytes = (void *)value;
  e.value.value.bytes.len = len;
  return e;
}

static amqp_table_entry_t hdr_text(const char *key, const char *value) { return hdr_bytes(key, value, strlen(value)); }

/* An empty field name goes out, but rabbitmq-c's own readers refuse it (ladder_read_content
 * reads it) and MongoDB cannot store it, so it is never published. */
static bool name_fits(const char *name) { return name[0] && strlen(name) <= OBX_LADDER_MAX_NAME; }

static bool message_id_fits(const char *id) { return strlen(id) <= 255 && bson_utf8_validate(id, strlen(id), false); }

size_t obx_ladder_carry_notes(const obx_envelope_t *msg, char *buf, size_t cap) {
  size_t pos = 0;
#define NOTE(...)                                                                                                 \
  do {                                                                                                           \
    if (pos < cap) pos += (size_t)snprintf(buf + pos, cap - pos, "%s", pos ? "; " : "");                         \
    if (pos < cap) pos += (size_t)snprintf(buf + pos, cap - pos, __VA_ARGS__);                                   \
  } while (0)
  if (cap) buf[0] = '\0';
  if (msg->message_id && !message_id_fits(msg->message_id))
    NOTE("message id (%zu bytes%s) is not a valid AMQP message-id: left out", strlen(msg->message_id),
         bson_utf8_validate(msg->message_id, strlen(msg->message_id), false) ? "" : ", not UTF-8");
  if (msg->key && !bson_utf8_validate(msg->key, msg->key_len, false)) NOTE("x-key is not UTF-8: carried as bytes");
  if (msg->key && msg->key_len > OBX_LADDER_MAX_VALUE)
    NOTE("x-key cut from %zu to %d bytes", msg->key_len, OBX_LADDER_MAX_VALUE);
  for (int i = 0; i < msg->nheaders; i++) {
    const obx_envelope_header_t *h = &msg->headers[i];
    if (!h->name[0]) {
      if (h->value_len <= 64 && bson_utf8_validate(h->value, h->value_len, false))
        NOTE("a header with an empty name left out (value \"%s\")", h->value);
      else
        NOTE("a header with an empty name left out (a value of %zu bytes)", h->value_len);
      continue;
    }
    if (!name_fits(h->name)) {
      NOTE("a header name of %zu bytes (over %d) left out", strlen(h->name), OBX_LADDER_MAX_NAME);
      continue;
    }
    if (!bson_utf8_validate(h->value, h->value_len, false)) NOTE("header %s is not UTF-8: carried as bytes", h->name);
    if (h->value_len > OBX_LADDER_MAX_VALUE)
      NOTE("header %s cut from %zu to %d bytes", h->name, h->value_len, OBX_LADDER_MAX_VALUE);
  }
  if (msg->body_len > OBX_LADDER_MAX_BODY) NOTE("body cut from %zu to %d bytes", msg->body_len, OBX_LADDER_MAX_BODY);
  if (msg->dropped_headers) NOTE("%d headers past the limit of %d not carried", msg->dropped_headers, OBX_ENVELOPE_MAX_HEADERS);
#undef NOTE
  return pos < cap ? pos : (cap ? cap - 1 : 0);
}

/* Publishes msg on CH_PUBLISH and waits for its confirm. c->conn must be open. */
bool ladder_publish_confirmed(conn_t *c, const names_t *n, const char *exchange, const char *routing_key,
                              const obx_envelope_t *msg, const char *redriven_at, obx_err_t *err) {
  amqp_table_entry_t h[OBX_ENVELOPE_MAX_HEADERS + 12];
  int nh = 0;
  char first[32];
  for (int i = 0; i < msg->nheaders; i++)
    if (name_fits(msg->headers[i].name))
      h[nh++] = hdr_bytes(msg->headers[i].name, msg->headers[i].value, msg->headers[i].value_len);
  if (msg->key) h[nh++] = hdr_bytes("x-key", msg->key, msg->key_len);
  h[nh].key = amqp_cstring_bytes("x-attempt");
  h[nh].value.kind = AMQP_FIELD_KIND_I32;
  h[nh++].value.value.i32 = msg->attempt;
  if (msg->first_failure_ms) {
    obx_time_format_rfc3339(msg->first_failure_ms, first);
    h[nh++] = ladder_arg_str("x-first-failure-at", first);
  }
  if (msg->last_error) h[nh++] = hdr_text("x-last-error", msg->last_error);
  if (msg->failure_class) h[nh++] = hdr_text("x-failure-class", msg->failure_class);
  if (msg->reason) h[nh++] = hdr_text("x-reason", msg->reason);
  if (msg->history) h[nh++] = hdr_text("x-history", msg->history);
  if (msg->source) h[nh++] = hdr_text("x-source", msg->source);
  if (redriven_at) h[nh++] = ladder_arg_str("x-redriven-at", redriven_at);
  if (msg->replay_id) h[nh++] = hdr_text("x-replay", msg->replay_id);

  amqp_basic_properties_t props;
  memset(&props, 0, sizeof props);
  props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG |
                 AMQP_BASIC_TIMESTAMP_FLAG;
  const char *ct = obx_envelope_header(msg, "content-type");
  props.content_type = amqp_cstring_bytes(ct && message_id_fits(ct) ? ct : "application/json");
  props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
  props.timestamp = (uint64_t)(obx_time_now_ms() / 1000);
  props.headers.num_entries = nh;
  props.headers.entries = h;
  if (msg->message_id && message_id_fits(msg->message_id)) {
    props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    props.message_id = amqp_cstring_bytes(msg->message_id);
  }
  /* The DLQ keeps what RabbitMQ can hold; tiers and the work queue carry the event whole. */
  bool dlq = strcmp(routing_key, n->dlq) == 0;
  amqp_bytes_t body = {dlq && msg->body_len > OBX_LADDER_MAX_BODY ? OBX_LADDER_MAX_BODY : msg->body_len, msg->body};
  int rc = amqp_basic_publish(c->conn, CH_PUBLISH, amqp_cstring_bytes(exchange), amqp_cstring_bytes(routing_key), 1,
                              0, &props, body);
  if (rc != AMQP_STATUS_OK) {
    obx_err_from_amqp_status(err, rc, "basic.publish");
    ladder_conn_drop(c);
    return false;
  }
  uint64_t seq = ++c->publish_seq;

  /* Await basic.ack/nack for seq; a basic.return (unroutable) precedes the ack. */
  bool returned = false;
  int64_t deadline = obx_time_mono_ms() + n->confirm_timeout_ms;
  for (;;) {
    int64_t left = deadline - obx_time_mono_ms();
    if (left <= 0) {
      obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_TIMEOUT, true, "no publisher confirm from RabbitMQ within %d ms",
                  n->confirm_timeout_ms);
      ladder_conn_drop(c);
      return false;
    }
    struct timeval tv = {left / 1000, (left % 1000) * 1000};
    amqp_frame_t frame;
    rc = amqp_simple_wait_frame_noblock(c->conn, &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT) continue;
    if (rc != AMQP_STATUS_OK) {
      obx_err_from_amqp_status(err, rc, "waiting for the publisher confirm");
      ladder_conn_drop(c);
      return false;
    }
    if (frame.frame_type != AMQP_FRAME_METHOD) continue;
    switch (frame.payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
      const amqp_basic_ack_t *ack = frame.payload.method.decoded;
      if (ack->delivery_tag < seq && !ack->multiple) continue;
      if (returned) {
        obx_err_set(err, OBX_ERR_AMQP, AMQP_NO_ROUTE, true, "RabbitMQ returned the message: no route to %s",
                    routing_key);
        ladder_conn_drop(c); /* redeclare the topology on the next connect */
        return false;
      }
      return true;
    }
    case AMQP_BASIC_NACK_METHOD:
      obx_err_set(err, OBX_ERR_AMQP, AMQP_INTERNAL_ERROR, true, "RabbitMQ nacked the message for %s", routing_key);
      return false;
    case AMQP_BASIC_RETURN_METHOD: {
      returned = true;
      const amqp_basic_properties_t *props;
      amqp_bytes_t body;
      if (!ladder_read_content(c->conn, frame.channel, &props, &body, err)) {
        obx_err_prefix(err, "reading a returned message");
        ladder_conn_drop(c);
        return false;
      }
      amqp_bytes_free(body);
      continue;
    }
    case AMQP_CHANNEL_CLOSE_METHOD: {
      const amqp_channel_close_t *m = frame.payload.method.decoded;
      obx_err_set(err, OBX_ERR_AMQP, m->reply_code, true, "RabbitMQ closed the channel: %.*s", (int)m->reply_text.len,
                  (const char *)m->reply_text.bytes);
      ladder_conn_drop(c);
      return false;
    }
    case AMQP_CONNECTION_CLOSE_METHOD:
      obx_err_set(err, OBX_ERR_AMQP, AMQP_CONNECTION_FORCED, true, "RabbitMQ closed the connection");
      ladder_conn_drop(c);
      return false;
    default:
      continue;
    }
  }
}

obx_ladder_t *obx_ladder_new(const obx_ladder_opts_t *opts, obx_err_t *err) {
  obx_ladder_t *ladder = calloc(1, sizeof *ladder);
  assert(ladder);
  if (!ladder_names_init(&ladder->names, opts, err)) {
    free(ladder);
    return NULL;
  }
  pthread_mutex_init(&ladder->mu, NULL);
  return ladder;
}

void obx_ladder_destroy(obx_ladder_t *ladder) {
  if (!ladder) return;
  ladder_conn_drop(&ladder->c);
  ladder_names_cleanup(&ladder->names);
  pthread_mutex_destroy(&ladder->mu);
  free(ladder);
}

/* Opens the connection and puts channel 1 in confirm mode. Caller holds mu. */
bool ladder_open(obx_ladder_t *ladder, obx_err_t *err) {
  if (ladder->c.conn) return true;
  if (!ladder_conn_open(&ladder->c, &ladder->names, "outboxd ladder", err)) return false;
  amqp_confirm_select(ladder->c.conn, CH_PUBLISH);
  if (!ladder_rpc_ok(ladder->c.conn, "confirm.select", err)) {
    ladder_conn_drop(&ladder->c);
    return false;
  }
  return true;
}

bool obx_ladder_connect(obx_ladder_t *ladder, obx_err_t *err) {
  pthread_mutex_lock(&ladder->mu);
  bool ok = ladder_open(ladder, err);
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}

bool obx_ladder_connected(obx_ladder_t *ladder) {
  pthread_mutex_lock(&ladder->mu);
  bool ok = ladder->c.conn != NULL;
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}

void obx_ladder_tick(obx_ladder_t *ladder) {
  pthread_mutex_lock(&ladder->mu);
  if (!ladder->c.conn) {
    obx_err_t err = OBX_ERR_INIT;
    if (obx_time_mono_ms() >= ladder->c.next_try_ms && !ladder_open(ladder, &err) &&
        obx_time_mono_ms() - ladder->last_warn_ms >= 30000) {
      ladder->last_warn_ms = obx_time_mono_ms();
      obx_warn("RabbitMQ unavailable (%s); retrying in the background", err.msg);
    }
  } else {
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_amqp_service(ladder->c.conn, &err)) {
      obx_warn("RabbitMQ publisher connection lost (%s); reconnecting", err.msg);
      ladder_conn_drop(&ladder->c);
    }
  }
  pthread_mutex_unlock(&ladder->mu);
}

int obx_ladder_ntiers(const obx_ladder_t *ladder) { return ladder->names.ntiers; }
const char *obx_ladder_work_queue(const obx_ladder_t *ladder) { return ladder->names.work; }
const char *obx_ladder_dlq_queue(const obx_ladder_t *ladder) { return ladder->names.dlq; }
const char *obx_ladder_tier_queue(const obx_ladder_t *ladder, int tier) {
  return tier >= 0 && tier < ladder->names.ntiers ? ladder->names.tier_queues[tier] : NULL;
}

int64_t obx_ladder_tier_ms(const obx_ladder_t *ladder, int tier) {
  if (ladder->names.ntiers == 0) return 0;
  return ladder->names.tiers_ms[tier < 0 ? 0 : tier < ladder->names.ntiers ? tier : ladder->names.ntiers - 1];
}

static bool ladder_publish(obx_ladder_t *ladder, const char *exchange, const char *routing_key,
                           const obx_envelope_t *msg, obx_err_t *err) {
  pthread_mutex_lock(&ladder->mu);
  bool ok = ladder_open(ladder, err) &&
            ladder_publish_confirmed(&ladder->c, &ladder->names, exchange, routing_key, msg, NULL, err);
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}

bool obx_ladder_publish_retry(obx_ladder_t *ladder, const obx_envelope_t *msg, int tier, obx_err_t *err) {
  assert(tier >= 0);
  if (ladder->names.ntiers == 0) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "RETRY_LADDER has no tiers");
    return false;
  }
  if (tier >= ladder->names.ntiers) tier = ladder->names.ntiers - 1;
  const char *q = ladder->names.tier_queues[tier];
  return ladder_publish(ladder, ladder->names.exchange, q, msg, err);
}

bool obx_ladder_publish_dlq(obx_ladder_t *ladder, const obx_envelope_t *msg, obx_err_t *err) {
  return ladder_publish(ladder, "", ladder->names.dlq, msg, err);
}

bool obx_ladder_publish_work(obx_ladder_t *ladder, const obx_envelope_t *msg, obx_err_t *err) {
  return ladder_publish(ladder, "", ladder->names.work, msg, err);
}

bool obx_ladder_queue_depth(obx_ladder_t *ladder, const char *queue, uint32_t *messages, obx_err_t *err) {
  pthread_mutex_lock(&ladder->mu);
  bool ok = ladder_open(ladder, err);
  if (ok) {
    amqp_queue_declare_ok_t *r = amqp_queue_declare(ladder->c.conn, CH_PUBLISH, amqp_cstring_bytes(queue), 1, 0, 0,
                                                    0, amqp_empty_table);
    ok = ladder_rpc_ok(ladder->c.conn, "queue.declare (passive)", err);
    if (ok) *messages = r->message_count;
    else ladder_conn_drop(&ladder->c);
  }
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}
