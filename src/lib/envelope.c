/* envelope.c - the envelope: the record every event travels in (include/obx/obx_envelope.h)
 *
 * DESIGN: owns the envelope's fields and their copies: filled from a Kafka record or an event,
 * decoded into its CloudEvent, its key, a failed attempt added to its history. Never touches a
 * broker: the ladder carries it over AMQP (src/worker/ladder*.c), the worker's sources fill it. */
#include "obx/obx_envelope.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_log.h"

char *obx_envelope_copy(const void *p, size_t len) {
  char *s = malloc(len + 1);
  assert(s);
  if (len) memcpy(s, p, len);
  s[len] = '\0';
  return s;
}

static char *dup_str(const char *s) { return s ? obx_envelope_copy(s, strlen(s)) : NULL; }

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

void obx_envelope_add_header(obx_envelope_t *msg, const char *name, size_t name_len, const void *value,
                             size_t value_len) {
  if (msg->nheaders >= OBX_ENVELOPE_MAX_HEADERS) {
    msg->dropped_headers++;
    return;
  }
  obx_envelope_header_t *h = &msg->headers[msg->nheaders++];
  h->name = obx_envelope_copy(name, name_len);
  h->value = obx_envelope_copy(value, value_len);
  h->value_len = value_len;
}

void obx_envelope_from_record(obx_envelope_t *msg, const char *message_id, const void *key, size_t key_len,
                              const void *value, size_t value_len, const obx_ce_header_t *headers, int nheaders) {
  msg->message_id = dup_str(message_id);
  if (key) {
    msg->key = obx_envelope_copy(key, key_len);
    msg->key_len = key_len;
  }
  msg->body = obx_envelope_copy(value ? value : "", value ? value_len : 0);
  msg->body_len = value ? value_len : 0;
  for (int i = 0; i < nheaders; i++)
    obx_envelope_add_header(msg, headers[i].name, strlen(headers[i].name), headers[i].value ? headers[i].value : "",
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
