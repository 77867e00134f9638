/* ladder_consumer.c - the ladder's consumers: the work queue (the worker) and the DLQ (its drain)
 *
 * DESIGN: owns a consumer's connection (one thread each, manual ack, prefetch) and the decoding
 * of a delivery into an envelope (the x-* headers, x-death's newest entry for what RabbitMQ
 * itself dead-lettered); the DLQ browsing (ladder_dlq.c) decodes the same way. A delivery's
 * content is read from its frames here (ladder_read_content), not with amqp_consume_message or
 * amqp_read_message: those copy the properties and refuse a header table that holds an empty
 * field name (rabbitmq-c's amqp_table_entry_clone: AMQP_STATUS_INVALID_PARAMETER after the
 * header frame was read), so such a message was never read and came back for ever. A message of
 * a connection since lost is not settled (the broker redelivers it). Never publishes. */
#include <amqp.h>
#include <amqp_framing.h>
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bson/bson.h>

#include "obx/obx_amqp.h"
#include "obx/obx_log.h"
#include "ladder_int.h"

static int64_t field_int(const amqp_field_value_t *v) {
  switch (v->kind) {
  case AMQP_FIELD_KIND_I8: return v->value.i8;
  case AMQP_FIELD_KIND_U8: return v->value.u8;
  case AMQP_FIELD_KIND_I16: return v->value.i16;
  case AMQP_FIELD_KIND_U16: return v->value.u16;
  case AMQP_FIELD_KIND_I32: return v->value.i32;
  case AMQP_FIELD_KIND_U32: return v->value.u32;
  case AMQP_FIELD_KIND_I64: return v->value.i64;
  case AMQP_FIELD_KIND_U64: return (int64_t)v->value.u64;
  default: return 0;
  }
}

static bool field_is_text(const amqp_field_value_t *v) {
  return v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES;
}

static char *field_text(const amqp_field_value_t *v) {
  return field_is_text(v) ? obx_envelope_copy(v->value.bytes.bytes, v->value.bytes.len) : NULL;
}

/* The text field `name` of an AMQP table, NULL when absent or not text. */
static char *table_text(const amqp_table_t *t, const char *name) {
  for (int i = 0; i < t->num_entries; i++)
    if (t->entries[i].key.len == strlen(name) && memcmp(t->entries[i].key.bytes, name, t->entries[i].key.len) == 0)
      return field_text(&t->entries[i].value);
  return NULL;
}

/* A message RabbitMQ itself dead-lettered into the DLQ (a quorum queue's x-delivery-limit
 * reached, or a reject without requeue) carries no failure class of the worker's: x-death's
 * newest entry says why and from which queue, and becomes its class and reason. A retry's
 * "expired" death (tier -> work queue) is the ladder working, not a failure. */
static void msg_death(obx_envelope_t *msg, const amqp_field_value_t *v) {
  if (v->kind != AMQP_FIELD_KIND_ARRAY || v->value.array.num_entries < 1 ||
      v->value.array.entries[0].kind != AMQP_FIELD_KIND_TABLE)
    return;
  const amqp_table_t *newest = &v->value.array.entries[0].value.table;
  char *why = table_text(newest, "reason"), *queue = table_text(newest, "queue");
  bool limit = why && strcmp(why, "delivery_limit") == 0;
  if (limit || (why && strcmp(why, "rejected") == 0)) {
    char text[1024];
    snprintf(text, sizeof text, "RabbitMQ dead-lettered it from %s: %s%s%s", queue ? queue : "a queue",
             limit ? "redelivered past the queue's x-delivery-limit" : "rejected without requeue",
             msg->reason && *msg->reason ? "; before that: " : "", msg->reason ? msg->reason : "");
    free(msg->reason);
    msg->reason = strdup(text);
    free(msg->failure_class);
    msg->failure_class = strdup(limit ? "exhausted" : "terminal");
  }
  free(why);
  free(queue);
}

void ladder_envelope_from_amqp(obx_envelope_t *msg, const amqp_basic_properties_t *p, amqp_bytes_t body) {
  if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) msg->message_id = obx_envelope_copy(p->message_id.bytes, p->message_id.len);
  msg->body = obx_envelope_copy(body.bytes, body.len);
  msg->body_len = body.len;
  if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG)) return;
  for (int i = 0; i < p->headers.num_entries; i++) {
    const amqp_table_entry_t *e = &p->headers.entries[i];
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)e->key.len, (const char *)e->key.bytes);
    const amqp_field_value_t *v = &e->value;
    if (strcmp(name, "x-attempt") == 0) {
      msg->attempt = (int)field_int(v);
    } else if (strcmp(name, "x-first-failure-at") == 0) {
      char *t = field_text(v);
      if (t && !obx_time_parse_rfc3339(t, &msg->first_failure_ms)) msg->first_failure_ms = 0;
      free(t);
    } else if (strcmp(name, "x-last-error") == 0) {
      msg->last_error = field_text(v);
    } else if (strcmp(name, "x-failure-class") == 0) {
      msg->failure_class = field_text(v);
    } else if (strcmp(name, "x-reason") == 0) {
      msg->reason = field_text(v);
    } else if (strcmp(name, "x-history") == 0) {
      msg->history = field_text(v);
    } else if (strcmp(name, "x-source") == 0) {
      msg->source = field_text(v);
    } else if (strcmp(name, "x-replay") == 0) {
      free(msg->replay_id);
      msg->replay_id = field_text(v);
    } else if (strcmp(name, "x-key") == 0) {
      if (field_is_text(v)) {
        msg->key = obx_envelope_copy(v->value.bytes.bytes, v->value.bytes.len);
        msg->key_len = v->value.bytes.len;
      }
    } else if (strncmp(name, "x-", 2) != 0 && field_is_text(v)) {
      obx_envelope_add_header(msg, name, strlen(name), v->value.bytes.bytes, v->value.bytes.len);
    }
  }
  for (int i = 0; i < p->headers.num_entries; i++) /* after x-failure-class and x-reason, which it overrides */
    if (p->headers.entries[i].key.len == 7 && memcmp(p->headers.entries[i].key.bytes, "x-death", 7) == 0)
      msg_death(msg, &p->headers.entries[i].value);
}

struct obx_ladder_consumer {
  names_t names;
  conn_t c;
  int prefetch;
  bool dlq; /* consumes the parking-lot queue instead of the work queue */
};

static obx_ladder_consumer_t *consumer_new(const obx_ladder_opts_t *opts, int prefetch, bool dlq, obx_err_t *err) {
  obx_ladder_consumer_t *consumer = calloc(1, sizeof *consumer);
  assert(consumer);
  if (!ladder_names_init(&consumer->names, opts, err)) {
    free(consumer);
    return NULL;
  }
  consumer->prefetch = prefetch > 0 ? prefetch : 1;
  consumer->dlq = dlq;
  return consumer;
}

obx_ladder_consumer_t *obx_ladder_consumer_new(const obx_ladder_opts_t *opts, int prefetch, obx_err_t *err) {
  return consumer_new(opts, prefetch, false, err);
}

obx_ladder_consumer_t *obx_ladder_dlq_consumer_new(const obx_ladder_opts_t *opts, int prefetch, obx_err_t *err) {
  return consumer_new(opts, prefetch, true, err);
}

void obx_ladder_consumer_destroy(obx_ladder_consumer_t *consumer) {
  if (!consumer) return;
  ladder_conn_drop(&consumer->c);
  ladder_names_cleanup(&consumer->names);
  free(consumer);
}

static bool consumer_open(obx_ladder_consumer_t *consumer, obx_err_t *err) {
  conn_t *c = &consumer->c;
  if (c->conn) return true;
  if (!ladder_conn_open(c, &consumer->names, consumer->dlq ? "outboxd dlq drain" : "outboxd work consumer", err)) return false;
  amqp_basic_qos(c->conn, CH_PUBLISH, 0, (uint16_t)consumer->prefetch, 0);
  if (!ladder_rpc_ok(c->conn, "basic.qos", err)) goto fail;
  amqp_basic_consume(c->conn, CH_PUBLISH, amqp_cstring_bytes(consumer->dlq ? consumer->names.dlq : consumer->names.work),
                     amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  if (!ladder_rpc_ok(c->conn, "basic.consume", err)) goto fail;
  return true;
fail:
  ladder_conn_drop(c);
  return false;
}

/* A server's close of the channel or the connection in place of a content frame. */
static bool close_frame(const amqp_frame_t *f) {
  return f->frame_type == AMQP_FRAME_METHOD &&
         (f->payload.method.id == AMQP_CHANNEL_CLOSE_METHOD || f->payload.method.id == AMQP_CONNECTION_CLOSE_METHOD);
}

/* The next frame of a message's content on channel: it follows its method at once, so a broker
 * silent for CONTENT_WAIT_MS (or a frame of another channel) is a broken connection. */
#define CONTENT_WAIT_MS 30000
static int content_frame(amqp_connection_state_t conn, amqp_channel_t channel, amqp_frame_t *frame) {
  struct timeval tv = {CONTENT_WAIT_MS / 1000, 0};
  int rc = amqp_simple_wait_frame_noblock(conn, frame, &tv);
  return rc == AMQP_STATUS_OK && frame->channel != channel ? AMQP_STATUS_UNEXPECTED_STATE : rc;
}

bool ladder_read_content(amqp_connection_state_t conn, amqp_channel_t channel, const amqp_basic_properties_t **props,
                         amqp_bytes_t *body, obx_err_t *err) {
  *body = amqp_empty_bytes;
  amqp_frame_t frame;
  int rc = content_frame(conn, channel, &frame);
  if (rc != AMQP_STATUS_OK) {
    obx_err_from_amqp_status(err, rc, "reading a message's header frame");
    return false;
  }
  if (frame.frame_type != AMQP_FRAME_HEADER || frame.payload.properties.class_id != AMQP_BASIC_CLASS) {
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_UNEXPECTED_STATE, true, "%s instead of a message's header frame",
                close_frame(&frame) ? "RabbitMQ closed the channel" : "another frame");
    return false;
  }
  *props = frame.payload.properties.decoded;
  uint64_t size = frame.payload.properties.body_size;
  if (size > SIZE_MAX || (size && !(*body = amqp_bytes_malloc((size_t)size)).bytes)) {
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_NO_MEMORY, false, "a message body of %llu bytes", (unsigned long long)size);
    return false;
  }
  for (size_t got = 0; got < body->len;) {
    rc = content_frame(conn, channel, &frame);
    bool fits = rc == AMQP_STATUS_OK && frame.frame_type == AMQP_FRAME_BODY &&
                frame.payload.body_fragment.len <= body->len - got;
    if (!fits) {
      if (rc != AMQP_STATUS_OK) obx_err_from_amqp_status(err, rc, "reading a message's body");
      else
        obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_BAD_AMQP_DATA, true, "%s in a message's body",
                    close_frame(&frame) ? "RabbitMQ closed the channel" : "a frame that does not fit");
      amqp_bytes_free(*body);
      *body = amqp_empty_bytes;
      return false;
    }
    memcpy((char *)body->bytes + got, frame.payload.body_fragment.bytes, frame.payload.body_fragment.len);
    got += frame.payload.body_fragment.len;
  }
  return true;
}

bool obx_ladder_consumer_next(obx_ladder_consumer_t *consumer, obx_envelope_t *msg, int timeout_ms, bool *got,
                              obx_err_t *err) {
  *got = false;
  if (!consumer_open(consumer, err)) return false;
  conn_t *c = &consumer->c;
  amqp_maybe_release_buffers(c->conn);
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  amqp_frame_t frame;
  int rc = amqp_simple_wait_frame_noblock(c->conn, &frame, &tv);
  if (rc == AMQP_STATUS_TIMEOUT) return true;
  if (rc != AMQP_STATUS_OK) {
    obx_err_from_amqp_status(err, rc, consumer->dlq ? "consuming the DLQ" : "consuming the work queue");
    ladder_conn_drop(c);
    return false;
  }
  if (frame.frame_type != AMQP_FRAME_METHOD) return true;
  if (frame.payload.method.id != AMQP_BASIC_DELIVER_METHOD) {
    /* A cancel or a close means the subscription is gone; anything else is not for it. */
    if (frame.payload.method.id != AMQP_BASIC_CANCEL_METHOD && !close_frame(&frame)) return true;
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_UNEXPECTED_STATE, true, "the %s subscription was cancelled or closed by RabbitMQ",
                consumer->dlq ? "DLQ" : "work queue");
    ladder_conn_drop(c);
    return false;
  }
  const amqp_basic_deliver_t *deliver = frame.payload.method.decoded;
  msg->delivery_tag = deliver->delivery_tag;
  msg->redelivered = deliver->redelivered;
  msg->epoch_ = c->epoch;
  const amqp_basic_properties_t *props = NULL;
  amqp_bytes_t body;
  if (!ladder_read_content(c->conn, frame.channel, &props, &body, err)) {
    obx_err_prefix(err, "consuming %s", consumer->dlq ? "the DLQ" : "the work queue");
    ladder_conn_drop(c);
    return false;
  }
  ladder_envelope_from_amqp(msg, props, body);
  amqp_bytes_free(body);
  *got = true;
  return true;
}

static bool consumer_settle(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, bool ack, bool requeue,
                            obx_err_t *err) {
  conn_t *c = &consumer->c;
  if (!c->conn || msg->epoch_ != c->epoch) return true; /* the broker redelivers it */
  int rc = ack ? amqp_basic_ack(c->conn, CH_PUBLISH, msg->delivery_tag, 0)
               : amqp_basic_nack(c->conn, CH_PUBLISH, msg->delivery_tag, 0, requeue);
  if (rc == AMQP_STATUS_OK) return true;
  obx_err_from_amqp_status(err, rc, ack ? "basic.ack" : "basic.nack");
  ladder_conn_drop(c);
  return false;
}

bool obx_ladder_consumer_ack(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, obx_err_t *err) {
  return consumer_settle(consumer, msg, true, false, err);
}

bool obx_ladder_consumer_nack(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, bool requeue,
                              obx_err_t *err) {
  return consumer_settle(consumer, msg, false, requeue, err);
}
