/* obx_log.h - JSON-lines logger
 *
 * DESIGN: one JSON object per line on the log stream (stdout by default):
 *   {"ts":"2026-11-29T18:00:00.123Z","level":"info","role":"relay","msg":"...",
 *    "eventId":"...","correlationId":"...", <extra fields>}
 * plus "traceId" and "spanId" while the writing thread has a current trace context
 * (obx_trace_set_current: the span of the request or event being handled).
 * The level is checked before anything is formatted (obx_log_enabled). Values of fields whose
 * name looks secret (password, secret, token, authorization, apikey, uri/url credentials) are
 * redacted; URIs have their userinfo replaced by "***". Thread-safe: each line is written with
 * one fwrite under a mutex. The role is per thread (obx_log_set_role). */
#ifndef OBX_LOG_H
#define OBX_LOG_H

#include <stdbool.h>
#include <stdio.h>
#include "obx_trace.h"

typedef enum { OBX_LOG_DEBUG = 0, OBX_LOG_INFO, OBX_LOG_WARN, OBX_LOG_ERROR, OBX_LOG_OFF } obx_log_level_t;

/* Parses "debug|info|warn|error|off"; false on anything else. */
bool obx_log_level_parse(const char *s, obx_log_level_t *out);
const char *obx_log_level_name(obx_log_level_t level);

void obx_log_set_level(obx_log_level_t level);
/* Borrowed stream; NULL restores stdout. */
void obx_log_set_stream(FILE *stream);
/* The role name written in each line by the calling thread ("api", "relay", ...); borrowed
 * static string. */
void obx_log_set_role(const char *role);
bool obx_log_enabled(obx_log_level_t level);

/* Structured fields: a NULL-terminated list of key, value string pairs follows msg's args is
 * awkward in C, so fields are passed as an array. */
typedef struct {
  const char *key;
  const char *value;   /* written as a JSON string; NULL values are skipped */
} obx_log_field_t;

void obx_log_write(obx_log_level_t level, const obx_log_field_t *fields, int nfields,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define OBX_LOG_(lvl, ...) \
  do { if (obx_log_enabled(lvl)) obx_log_write(lvl, NULL, 0, __VA_ARGS__); } while (0)
#define obx_debug(...) OBX_LOG_(OBX_LOG_DEBUG, __VA_ARGS__)
#define obx_info(...)  OBX_LOG_(OBX_LOG_INFO, __VA_ARGS__)
#define obx_warn(...)  OBX_LOG_(OBX_LOG_WARN, __VA_ARGS__)
#define obx_error(...) OBX_LOG_(OBX_LOG_ERROR, __VA_ARGS__)

/* With event context: eventId and correlationId fields (either may be NULL). */
#define obx_log_event(lvl, event_id, correlation_id, ...)                          \
  do {                                                                             \
    if (obx_log_enabled(lvl)) {                                                    \
      obx_log_field_t f_[2] = {{"eventId", (event_id)}, {"correlationId", (correlation_id)}}; \
      obx_log_write(lvl, f_, 2, __VA_ARGS__);                                      \
    }                                                                              \
  } while (0)

/* Returns a copy of `uri` with any userinfo password replaced by "***" (caller frees). The same
 * masking is applied to every message and field value: URI passwords inside free text and
 * `password=...`-style assignments are masked too. */
char *obx_log_redact_uri(const char *uri);
/* True when a field or key name looks secret (password, secret, token, authorization, apikey,
 * credential, cookie, private_key, key.pem, oauthbearer.config; case-insensitive substring).
 * Such values are never shown. */
bool obx_log_key_is_secret(const char *key);

/* Routes the client libraries' logs into ours: mongoc_log_set_handler; and, for an
 * rd_kafka_conf_t (void * to keep rdkafka.h out), rd_kafka_conf_set_log_cb; curl debug output is
 * routed with obx_log_curl_attach(CURL *, trace) which sets CURLOPT_DEBUGFUNCTION at debug level;
 * its lines carry `trace` (borrowed for the handle's life; NULL: the performing thread's
 * current context). */
void obx_log_route_mongoc(void);
void obx_log_route_kafka(void *rd_kafka_conf);
void obx_log_curl_attach(void *curl_easy, const obx_trace_ctx_t *trace);

#endif
