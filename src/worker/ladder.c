/* ladder.c - RabbitMQ retry ladder, work queue consumer and parking-lot DLQ
 *
 * DESIGN: see include/obx/obx_ladder.h for the topology and the message format. rabbitmq-c
 * connections are not thread-safe, so the publisher side (obx_ladder_t) serialises every call
 * with one mutex around one connection (channel 1: confirm mode; channel 2: DLQ browsing,
 * opened per operation), and each consumer owns its connection and is used by one thread.
 * Connection problems never abort: they drop the connection, arm the backoff and return a
 * retriable error; the next call reconnects and redeclares the topology. */
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

#define CH_PUBLISH 1
#define CH_BROWSE 2
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 10000

/* ---- messages ---------------------------------------------------------------------------- */

static char *dup_bytes(const void *p, size_t len) {
  char *s = malloc(len + 1);
  assert(s);
  if (len) memcpy(s, p, len);
  s[len] = '\0';
  return s;
}

static char *dup_str(const char *s) { return s ? dup_bytes(s, strlen(s)) : NULL; }

void obx_envelope_init(obx_envelope_t *msg) { memset(msg, 0, sizeof *msg); }

void obx_envelope_cleanup(obx_envelope_t *msg) {
  if (!msg) return;
  free(msg->message_id);
  free(msg->key);
  free(msg->body);
  for (int i = 0; i < msg->nheaders; i++) {
    free(msg->headers[i].name);
    free(msg->headers[i].value);
  }
  free(msg->last_error);
  free(msg->failure_class);
  free(msg->reason);
  free(msg->history);
  free(msg->source);
  free(msg->replay_id);
  memset(msg, 0, sizeof *msg);
}

static void msg_add_header(obx_envelope_t *msg, const char *name, size_t name_len, const void *value,
                           size_t value_len) {
  if (msg->nheaders >= OBX_ENVELOPE_MAX_HEADERS) {
    msg->dropped_headers++;
    return;
  }
  obx_envelope_header_t *h = &msg->headers[msg->nheaders++];
  h->name = dup_bytes(name, name_len);
  h->value = dup_bytes(value, value_len);
  h->value_len = value_len;
}

void obx_envelope_from_record(obx_envelope_t *msg, const char *message_id, const void *key, size_t key_len,
                                const void *value, size_t value_len, const obx_ce_header_t *headers, int nheaders) {
  msg->message_id = dup_str(message_id);
  if (key) {
    msg->key = dup_bytes(key, key_len);
    msg->key_len = key_len;
  }
  msg->body = dup_bytes(value ? value : "", value ? value_len : 0);
  msg->body_len = value ? value_len : 0;
  for (int i = 0; i < nheaders; i++)
    msg_add_header(msg, headers[i].name, strlen(headers[i].name), headers[i].value ? headers[i].value : "",
                   headers[i].value ? headers[i].len : 0);
}

bool obx_envelope_from_event(obx_envelope_t *msg, const obx_event_t *ev, obx_err_t *err) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  if (!obx_event_to_kafka(ev, "/outboxd", &rec, err)) return false;
  obx_envelope_from_record(msg, ev->id, rec.key, rec.key_len, rec.value, rec.value_len, rec.headers, rec.nheaders);
  obx_kafka_record_cleanup(&rec);
  return true;
}

bool obx_envelope_to_event(const obx_envelope_t *msg, obx_event_t *ev, obx_err_t *err) {
  obx_ce_header_t hdrs[OBX_ENVELOPE_MAX_HEADERS];
  for (int i = 0; i < msg->nheaders; i++) {
    hdrs[i].name = msg->headers[i].name;
    hdrs[i].value = msg->headers[i].value;
    hdrs[i].len = msg->headers[i].value_len;
  }
  return obx_event_from_kafka(ev, msg->key, msg->key_len, msg->body, msg->body_len, hdrs, msg->nheaders, err);
}

const char *obx_envelope_header(const obx_envelope_t *msg, const char *name) {
  for (int i = 0; i < msg->nheaders; i++)
    if (strcmp(msg->headers[i].name, name) == 0) return msg->headers[i].value;
  return NULL;
}

const char *obx_envelope_partition_key(const obx_envelope_t *msg, size_t *len) {
  const char *k = obx_envelope_header(msg, "ce_partitionkey");
  if (k) {
    *len = strlen(k);
    return k;
  }
  *len = msg->key ? msg->key_len : 0;
  return msg->key ? msg->key : "";
}

/* Appends s as a JSON string literal (quotes included) to buf, at most `max` input bytes. */
static size_t json_quote(char *buf, size_t cap, size_t pos, const char *s, size_t max) {
#define PUT(c) do { if (pos + 1 < cap) buf[pos] = (c); pos++; } while (0)
  PUT('"');
  for (size_t i = 0; s && s[i] && i < max; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      PUT('\\');
      PUT((char)c);
    } else if (c < 0x20) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\u%04x", c);
      for (int k = 0; esc[k]; k++) PUT(esc[k]);
    } else {
      PUT((char)c);
    }
  }
  PUT('"');
#undef PUT
  if (cap) buf[pos < cap ? pos : cap - 1] = '\0';
  return pos;
}

void obx_envelope_fail(obx_envelope_t *msg, const char *failure_class, const char *error, int64_t now_ms) {
  msg->attempt++;
  if (!msg->first_failure_ms) msg->first_failure_ms = now_ms;
  free(msg->last_error);
  msg->last_error = dup_str(error ? error : "");
  free(msg->failure_class);
  msg->failure_class = dup_str(failure_class);

  char at[32], entry[768];
  obx_time_format_rfc3339(now_ms, at);
  size_t pos = (size_t)snprintf(entry, sizeof entry, "{\"attempt\":%d,\"at\":\"%s\",\"class\":", msg->attempt, at);
  pos = json_quote(entry, sizeof entry, pos, failure_class, 32);
  pos += (size_t)snprintf(entry + pos, sizeof entry - pos, ",\"error\":");
  pos = json_quote(entry, sizeof entry, pos, error, 300);
  snprintf(entry + pos, sizeof entry - pos, "}");

  const char *old = msg->history;
  size_t oldlen = old ? strlen(old) : 0;
  bool empty = oldlen < 3; /* NULL, "" or "[]" */
  size_t n = (empty ? 2 : oldlen + 1) + strlen(entry) + 1;
  char *h = malloc(n);
  assert(h);
  if (empty)
    snprintf(h, n, "[%s]", entry);
  else
    snprintf(h, n, "%.*s,%s]", (int)(oldlen - 1), old, entry);
  free(msg->history);
  msg->history = h;
}

/* ---- connection ------------------------------------------------------------------------- */

typedef struct {
  obx_amqp_target_t target;     /* URL, TLS and heartbeat settings (amqp_conn.c) */
  char *exchange, *work, *dlq;
  char **tier_queues;
  int64_t *tiers_ms;
  int ntiers;
  int confirm_timeout_ms;
} names_t;

typedef struct {
  amqp_connection_state_t conn; /* NULL: disconnected */
  int64_t next_try_ms;          /* monotonic; earliest reconnect */
  int64_t backoff_ms;
  uint64_t epoch;               /* bumped on each successful connect */
  uint64_t publish_seq;         /* delivery tag of the last publish on CH_PUBLISH */
} conn_t;

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

static void names_cleanup(names_t *n) {
  obx_amqp_target_cleanup(&n->target);
  free(n->exchange);
  free(n->work);
  free(n->dlq);
  for (int i = 0; i < n->ntiers; i++) free(n->tier_queues ? n->tier_queues[i] : NULL);
  free(n->tier_queues);
  free(n->tiers_ms);
  memset(n, 0, sizeof *n);
}

static bool names_init(names_t *n, const obx_ladder_opts_t *opts, obx_err_t *err) {
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
      names_cleanup(n);
      return false;
    }
    n->tiers_ms[i] = opts->tiers_ms[i];
    n->tier_queues[i] = fmt_name("%s.retry.%" PRId64 "ms", prefix, opts->tiers_ms[i]);
  }
  n->confirm_timeout_ms = opts->confirm_timeout_ms > 0 ? opts->confirm_timeout_ms : 5000;
  return true;
}

static bool rpc_ok(amqp_connection_state_t conn, const char *what, obx_err_t *err) {
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return true;
  obx_err_from_amqp(err, &r, what);
  return false;
}

/* The next connection attempt waits backoff_ms, which doubles up to BACKOFF_MAX_MS. */
static void arm_backoff(conn_t *c) {
  c->next_try_ms = mono_ms() + c->backoff_ms;
  c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
}

static void conn_drop(conn_t *c) {
  if (!c->conn) return;
  obx_amqp_close(c->conn);
  c->conn = NULL;
  arm_backoff(c);
}

static amqp_table_entry_t arg_str(const char *key, const char *value) {
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
    if (!rpc_ok(conn, "channel.open", err)) return false;
    amqp_queue_declare(conn, CH_PUBLISH, amqp_cstring_bytes(queue), 1, 1, 0, 0, amqp_empty_table);
    if (!rpc_ok(conn, "queue.declare (passive)", err)) {
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
  if (!rpc_ok(conn, "exchange.declare", err)) return false;
  /* Every queue's delivery limit is explicit (RabbitMQ 4.x would otherwise apply 20 and drop
   * what exceeds it). The work queue's bounds what is given back (lost connections, crash
   * loops, infra give-backs) and parks the message in the DLQ past it; the DLQ's is never
   * reached (it is the end: nothing to dead-letter to). */
  amqp_table_entry_t work[] = {
    arg_str("x-queue-type", "quorum"),
    arg_i64("x-delivery-limit", OBX_LADDER_WORK_DELIVERY_LIMIT),
    arg_str("x-dead-letter-exchange", ""),
    arg_str("x-dead-letter-routing-key", n->dlq),
    arg_str("x-dead-letter-strategy", "at-least-once"),
    arg_str("x-overflow", "reject-publish"),
  };
  if (!declare_queue(conn, n->work, work, (int)(sizeof work / sizeof work[0]), err)) return false;
  amqp_table_entry_t dlq[] = {arg_str("x-queue-type", "quorum"), arg_i64("x-delivery-limit", OBX_LADDER_DLQ_DELIVERY_LIMIT)};
  if (!declare_queue(conn, n->dlq, dlq, (int)(sizeof dlq / sizeof dlq[0]), err)) return false;
  for (int i = 0; i < n->ntiers; i++) {
    amqp_table_entry_t args[] = {
      arg_str("x-queue-type", "quorum"),
      arg_i64("x-delivery-limit", OBX_LADDER_WORK_DELIVERY_LIMIT), /* nothing consumes a tier: never reached */
      arg_i64("x-message-ttl", n->tiers_ms[i]),
      arg_str("x-dead-letter-exchange", ""),
      arg_str("x-dead-letter-routing-key", n->work),
      arg_str("x-dead-letter-strategy", "at-least-once"),
      arg_str("x-overflow", "reject-publish"),
    };
    if (!declare_queue(conn, n->tier_queues[i], args, (int)(sizeof args / sizeof args[0]), err)) return false;
    amqp_queue_bind(conn, CH_PUBLISH, amqp_cstring_bytes(n->tier_queues[i]), amqp_cstring_bytes(n->exchange),
                    amqp_cstring_bytes(n->tier_queues[i]), amqp_empty_table);
    if (!rpc_ok(conn, "queue.bind", err)) return false;
  }
  return true;
}

/* Opens the connection, channel 1, and declares the topology. Respects the backoff. */
static bool conn_open(conn_t *c, const names_t *n, const char *name, obx_err_t *err) {
  if (c->conn) return true;
  int64_t now = mono_ms();
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
  if (!rpc_ok(conn, "channel.open", err)) goto done;
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

/* ---- AMQP message encoding ---------------------------------------------------------------- */

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
  return field_is_text(v) ? dup_bytes(v->value.bytes.bytes, v->value.bytes.len) : NULL;
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

static void msg_from_amqp(obx_envelope_t *msg, const amqp_basic_properties_t *p, amqp_bytes_t body) {
  if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) msg->message_id = dup_bytes(p->message_id.bytes, p->message_id.len);
  msg->body = dup_bytes(body.bytes, body.len);
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
        msg->key = dup_bytes(v->value.bytes.bytes, v->value.bytes.len);
        msg->key_len = v->value.bytes.len;
      }
    } else if (strncmp(name, "x-", 2) != 0 && field_is_text(v)) {
      msg_add_header(msg, name, strlen(name), v->value.bytes.bytes, v->value.bytes.len);
    }
  }
  for (int i = 0; i < p->headers.num_entries; i++) /* after x-failure-class and x-reason, which it overrides */
    if (p->headers.entries[i].key.len == 7 && memcmp(p->headers.entries[i].key.bytes, "x-death", 7) == 0)
      msg_death(msg, &p->headers.entries[i].value);
}

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

/* An empty field name goes out but rabbitmq-c cannot read it back (amqp_consume_message fails
 * with "invalid parameter" and the broker redelivers it for ever), so it is never published. */
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
static bool publish_confirmed(conn_t *c, const names_t *n, const char *exchange, const char *routing_key,
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
    h[nh++] = arg_str("x-first-failure-at", first);
  }
  if (msg->last_error) h[nh++] = hdr_text("x-last-error", msg->last_error);
  if (msg->failure_class) h[nh++] = hdr_text("x-failure-class", msg->failure_class);
  if (msg->reason) h[nh++] = hdr_text("x-reason", msg->reason);
  if (msg->history) h[nh++] = hdr_text("x-history", msg->history);
  if (msg->source) h[nh++] = hdr_text("x-source", msg->source);
  if (redriven_at) h[nh++] = arg_str("x-redriven-at", redriven_at);
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
    conn_drop(c);
    return false;
  }
  uint64_t seq = ++c->publish_seq;

  /* Await basic.ack/nack for seq; a basic.return (unroutable) precedes the ack. */
  bool returned = false;
  int64_t deadline = mono_ms() + n->confirm_timeout_ms;
  for (;;) {
    int64_t left = deadline - mono_ms();
    if (left <= 0) {
      obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_TIMEOUT, true, "no publisher confirm from RabbitMQ within %d ms",
                  n->confirm_timeout_ms);
      conn_drop(c);
      return false;
    }
    struct timeval tv = {left / 1000, (left % 1000) * 1000};
    amqp_frame_t frame;
    rc = amqp_simple_wait_frame_noblock(c->conn, &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT) continue;
    if (rc != AMQP_STATUS_OK) {
      obx_err_from_amqp_status(err, rc, "waiting for the publisher confirm");
      conn_drop(c);
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
        conn_drop(c); /* redeclare the topology on the next connect */
        return false;
      }
      return true;
    }
    case AMQP_BASIC_NACK_METHOD:
      obx_err_set(err, OBX_ERR_AMQP, AMQP_INTERNAL_ERROR, true, "RabbitMQ nacked the message for %s", routing_key);
      return false;
    case AMQP_BASIC_RETURN_METHOD: {
      returned = true;
      amqp_message_t m;
      amqp_rpc_reply_t r = amqp_read_message(c->conn, frame.channel, &m, 0);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        obx_err_from_amqp(err, &r, "reading a returned message");
        conn_drop(c);
        return false;
      }
      amqp_destroy_message(&m);
      continue;
    }
    case AMQP_CHANNEL_CLOSE_METHOD: {
      const amqp_channel_close_t *m = frame.payload.method.decoded;
      obx_err_set(err, OBX_ERR_AMQP, m->reply_code, true, "RabbitMQ closed the channel: %.*s", (int)m->reply_text.len,
                  (const char *)m->reply_text.bytes);
      conn_drop(c);
      return false;
    }
    case AMQP_CONNECTION_CLOSE_METHOD:
      obx_err_set(err, OBX_ERR_AMQP, AMQP_CONNECTION_FORCED, true, "RabbitMQ closed the connection");
      conn_drop(c);
      return false;
    default:
      continue;
    }
  }
}

/* ---- publisher --------------------------------------------------------------------------- */

struct obx_ladder {
  pthread_mutex_t mu;
  names_t names;
  conn_t c;
  int64_t last_warn_ms; /* tick's reconnect warnings: at most one per 30 s */
};

obx_ladder_t *obx_ladder_new(const obx_ladder_opts_t *opts, obx_err_t *err) {
  obx_ladder_t *ladder = calloc(1, sizeof *ladder);
  assert(ladder);
  if (!names_init(&ladder->names, opts, err)) {
    free(ladder);
    return NULL;
  }
  pthread_mutex_init(&ladder->mu, NULL);
  return ladder;
}

void obx_ladder_destroy(obx_ladder_t *ladder) {
  if (!ladder) return;
  conn_drop(&ladder->c);
  names_cleanup(&ladder->names);
  pthread_mutex_destroy(&ladder->mu);
  free(ladder);
}

/* Opens the connection and puts channel 1 in confirm mode. Caller holds mu. */
static bool ladder_open(obx_ladder_t *ladder, obx_err_t *err) {
  if (ladder->c.conn) return true;
  if (!conn_open(&ladder->c, &ladder->names, "outboxd ladder", err)) return false;
  amqp_confirm_select(ladder->c.conn, CH_PUBLISH);
  if (!rpc_ok(ladder->c.conn, "confirm.select", err)) {
    conn_drop(&ladder->c);
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
    if (mono_ms() >= ladder->c.next_try_ms && !ladder_open(ladder, &err) &&
        mono_ms() - ladder->last_warn_ms >= 30000) {
      ladder->last_warn_ms = mono_ms();
      obx_warn("RabbitMQ unavailable (%s); retrying in the background", err.msg);
    }
  } else {
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_amqp_service(ladder->c.conn, &err)) {
      obx_warn("RabbitMQ publisher connection lost (%s); reconnecting", err.msg);
      conn_drop(&ladder->c);
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

static bool ladder_publish(obx_ladder_t *ladder, const char *exchange, const char *routing_key,
                           const obx_envelope_t *msg, obx_err_t *err) {
  pthread_mutex_lock(&ladder->mu);
  bool ok = ladder_open(ladder, err) &&
            publish_confirmed(&ladder->c, &ladder->names, exchange, routing_key, msg, NULL, err);
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
    ok = rpc_ok(ladder->c.conn, "queue.declare (passive)", err);
    if (ok) *messages = r->message_count;
    else conn_drop(&ladder->c);
  }
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}

/* Visits DLQ messages through basic.get on CH_BROWSE. For each message `act` decides:
 * 1 acks it (removes it), 0 leaves it, 2 stops the walk, -1 stops with an error. Unacked
 * messages return to the queue when the channel closes. Caller holds mu. */
typedef int (*browse_act_fn)(obx_ladder_t *ladder, void *ctx, const obx_envelope_t *msg, obx_err_t *err);

static bool dlq_walk(obx_ladder_t *ladder, browse_act_fn act, void *ctx, obx_err_t *err) {
  if (!ladder_open(ladder, err)) return false;
  amqp_connection_state_t conn = ladder->c.conn;
  amqp_channel_open(conn, CH_BROWSE);
  if (!rpc_ok(conn, "channel.open", err)) {
    conn_drop(&ladder->c);
    return false;
  }
  bool ok = true;
  for (;;) {
    amqp_maybe_release_buffers(conn);
    amqp_rpc_reply_t r = amqp_basic_get(conn, CH_BROWSE, amqp_cstring_bytes(ladder->names.dlq), 0);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      obx_err_from_amqp(err, &r, "basic.get");
      ok = false;
      break;
    }
    if (r.reply.id != AMQP_BASIC_GET_OK_METHOD) break; /* get-empty: walked everything */
    const amqp_basic_get_ok_t *got = r.reply.decoded;
    uint64_t tag = got->delivery_tag;
    bool redelivered = got->redelivered;
    amqp_message_t m;
    r = amqp_read_message(conn, CH_BROWSE, &m, 0);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      obx_err_from_amqp(err, &r, "reading a DLQ message");
      ok = false;
      break;
    }
    obx_envelope_t msg;
    obx_envelope_init(&msg);
    msg_from_amqp(&msg, &m.properties, m.body);
    amqp_destroy_message(&m);
    msg.delivery_tag = tag;
    msg.redelivered = redelivered;
    int verdict = act(ladder, ctx, &msg, err);
    obx_envelope_cleanup(&msg);
    if (verdict < 0) {
      ok = false;
      break;
    }
    if (verdict == 2) break; /* stop */
    if (verdict == 1 && amqp_basic_ack(conn, CH_BROWSE, tag, 0) != AMQP_STATUS_OK) {
      obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_SOCKET_ERROR, true, "basic.ack on the DLQ failed");
      ok = false;
      break;
    }
  }
  if (!ladder->c.conn) return false; /* the act dropped the connection: unacked return on their own */
  amqp_channel_close(conn, CH_BROWSE, AMQP_REPLY_SUCCESS);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    if (ok) obx_err_from_amqp(err, &r, "channel.close");
    conn_drop(&ladder->c);
    return false;
  }
  return ok;
}

typedef struct {
  int limit, seen;
  obx_ladder_match_fn match;
  obx_ladder_visit_fn visit;
  void *ctx;
  bool dry_run;
  int moved;
} walk_t;

static int browse_act(obx_ladder_t *ladder, void *ctx, const obx_envelope_t *msg, obx_err_t *err) {
  walk_t *w = ctx;
  if (w->match && !w->match(w->ctx, msg)) return 0;
  w->seen++;
  if (w->visit && !w->visit(w->ctx, msg)) return 2;
  return w->limit > 0 && w->seen >= w->limit ? 2 : 0;
}

bool obx_ladder_dlq_browse(obx_ladder_t *ladder, int limit, obx_ladder_match_fn match, obx_ladder_visit_fn visit,
                           void *ctx, obx_err_t *err) {
  walk_t w = {.limit = limit, .match = match, .visit = visit, .ctx = ctx};
  pthread_mutex_lock(&ladder->mu);
  bool ok = dlq_walk(ladder, browse_act, &w, err);
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}

static int redrive_act(obx_ladder_t *ladder, void *ctx, const obx_envelope_t *msg, obx_err_t *err) {
  walk_t *w = ctx;
  if (w->match && !w->match(w->ctx, msg)) return 0;
  if (w->visit && !w->visit(w->ctx, msg)) return 2;
  if (w->dry_run) {
    w->moved++;
    return 0;
  }
  obx_envelope_t out = *msg; /* shallow: only attempt and reason change, nothing is freed */
  out.attempt = 0;
  out.reason = NULL;
  char now[32];
  obx_time_format_rfc3339(obx_time_now_ms(), now);
  if (!publish_confirmed(&ladder->c, &ladder->names, "", ladder->names.work, &out, now, err)) return -1;
  w->moved++;
  return 1;
}

bool obx_ladder_dlq_redrive(obx_ladder_t *ladder, obx_ladder_match_fn match, void *ctx, bool dry_run,
                            obx_ladder_visit_fn visit, int *moved, obx_err_t *err) {
  walk_t w = {.match = match, .visit = visit, .ctx = ctx, .dry_run = dry_run};
  pthread_mutex_lock(&ladder->mu);
  bool ok = dlq_walk(ladder, redrive_act, &w, err);
  pthread_mutex_unlock(&ladder->mu);
  if (moved) *moved = w.moved;
  return ok;
}

bool obx_ladder_dlq_purge(obx_ladder_t *ladder, uint32_t *purged, obx_err_t *err) {
  pthread_mutex_lock(&ladder->mu);
  bool ok = ladder_open(ladder, err);
  if (ok) {
    amqp_queue_purge_ok_t *r = amqp_queue_purge(ladder->c.conn, CH_PUBLISH, amqp_cstring_bytes(ladder->names.dlq));
    ok = rpc_ok(ladder->c.conn, "queue.purge", err);
    if (ok && purged) *purged = r->message_count;
    if (!ok) conn_drop(&ladder->c);
  }
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}

/* ---- consumer --------------------------------------------------------------------------- */

struct obx_ladder_consumer {
  names_t names;
  conn_t c;
  int prefetch;
  bool dlq; /* consumes the parking-lot queue instead of the work queue */
};

static obx_ladder_consumer_t *consumer_new(const obx_ladder_opts_t *opts, int prefetch, bool dlq, obx_err_t *err) {
  obx_ladder_consumer_t *consumer = calloc(1, sizeof *consumer);
  assert(consumer);
  if (!names_init(&consumer->names, opts, err)) {
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
  conn_drop(&consumer->c);
  names_cleanup(&consumer->names);
  free(consumer);
}

static bool consumer_open(obx_ladder_consumer_t *consumer, obx_err_t *err) {
  conn_t *c = &consumer->c;
  if (c->conn) return true;
  if (!conn_open(c, &consumer->names, consumer->dlq ? "outboxd dlq drain" : "outboxd work consumer", err)) return false;
  amqp_basic_qos(c->conn, CH_PUBLISH, 0, (uint16_t)consumer->prefetch, 0);
  if (!rpc_ok(c->conn, "basic.qos", err)) goto fail;
  amqp_basic_consume(c->conn, CH_PUBLISH, amqp_cstring_bytes(consumer->dlq ? consumer->names.dlq : consumer->names.work),
                     amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  if (!rpc_ok(c->conn, "basic.consume", err)) goto fail;
  return true;
fail:
  conn_drop(c);
  return false;
}

bool obx_ladder_consumer_next(obx_ladder_consumer_t *consumer, obx_envelope_t *msg, int timeout_ms, bool *got,
                              obx_err_t *err) {
  *got = false;
  if (!consumer_open(consumer, err)) return false;
  conn_t *c = &consumer->c;
  amqp_maybe_release_buffers(c->conn);
  amqp_envelope_t env;
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  amqp_rpc_reply_t r = amqp_consume_message(c->conn, &env, &tv, 0);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) {
    msg_from_amqp(msg, &env.message.properties, env.message.body);
    msg->delivery_tag = env.delivery_tag;
    msg->redelivered = env.redelivered;
    msg->epoch_ = c->epoch;
    amqp_destroy_envelope(&env);
    *got = true;
    return true;
  }
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) return true;
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
    /* A method other than basic.deliver: a cancel or a close means the subscription is gone. */
    amqp_frame_t frame;
    struct timeval zero = {0, 0};
    int rc = amqp_simple_wait_frame_noblock(c->conn, &frame, &zero);
    if (rc == AMQP_STATUS_OK && frame.frame_type == AMQP_FRAME_METHOD &&
        frame.payload.method.id != AMQP_BASIC_CANCEL_METHOD && frame.payload.method.id != AMQP_CHANNEL_CLOSE_METHOD &&
        frame.payload.method.id != AMQP_CONNECTION_CLOSE_METHOD)
      return true;
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_UNEXPECTED_STATE, true,
                "the work queue subscription was cancelled or closed by RabbitMQ");
    conn_drop(c);
    return false;
  }
  obx_err_from_amqp(err, &r, "consuming the work queue");
  conn_drop(c);
  return false;
}

static bool consumer_settle(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, bool ack, bool requeue,
                            obx_err_t *err) {
  conn_t *c = &consumer->c;
  if (!c->conn || msg->epoch_ != c->epoch) return true; /* the broker redelivers it */
  int rc = ack ? amqp_basic_ack(c->conn, CH_PUBLISH, msg->delivery_tag, 0)
               : amqp_basic_nack(c->conn, CH_PUBLISH, msg->delivery_tag, 0, requeue);
  if (rc == AMQP_STATUS_OK) return true;
  obx_err_from_amqp_status(err, rc, ack ? "basic.ack" : "basic.nack");
  conn_drop(c);
  return false;
}

bool obx_ladder_consumer_ack(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, obx_err_t *err) {
  return consumer_settle(consumer, msg, true, false, err);
}

bool obx_ladder_consumer_nack(obx_ladder_consumer_t *consumer, const obx_envelope_t *msg, bool requeue,
                              obx_err_t *err) {
  return consumer_settle(consumer, msg, false, requeue, err);
}
