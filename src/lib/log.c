/* log.c - JSON-lines logger and the routing of the client libraries' logs into it
 *
 * DESIGN: process-wide level (atomic) and stream (guarded by one mutex); the role is per
 * thread. A line is built in a heap buffer owned by the writing thread and written with one
 * fwrite under the mutex, so lines from different threads never interleave. Every text that
 * reaches the line (msg and field values) passes through redact_text(): URI userinfo
 * passwords and `password=...`-style values are masked; fields whose name looks secret are
 * replaced entirely. Lines written while the thread has a current trace context (obx_trace.h)
 * carry its traceId and spanId. librdkafka logs come from its own threads; that is fine here. */
#include "obx/obx_log.h"
#include "obx/obx_event.h"
#include "obx/obx_trace.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>
#include <mongoc/mongoc.h>

static atomic_int g_level = OBX_LOG_INFO;
static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_stream; /* NULL: stdout; guarded by g_mutex */
static _Thread_local const char *t_role;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

bool obx_log_level_parse(const char *s, obx_log_level_t *out) {
  for (int i = 0; s && i <= OBX_LOG_OFF; i++) {
    if (strcmp(s, level_names[i]) == 0) {
      *out = (obx_log_level_t)i;
      return true;
    }
  }
  return false;
}

const char *obx_log_level_name(obx_log_level_t level) {
  return level >= OBX_LOG_DEBUG && level <= OBX_LOG_OFF ? level_names[level] : "unknown";
}

void obx_log_set_level(obx_log_level_t level) { atomic_store(&g_level, (int)level); }

void obx_log_set_stream(FILE *stream) {
  pthread_mutex_lock(&g_mutex);
  g_stream = stream;
  pthread_mutex_unlock(&g_mutex);
}

void obx_log_set_role(const char *role) { t_role = role; }

bool obx_log_enabled(obx_log_level_t level) {
  return level != OBX_LOG_OFF && (int)level >= atomic_load(&g_level);
}

/* ---- a growable string ------------------------------------------------------------------ */

typedef struct {
  char *s;
  size_t len, cap;
} sbuf_t;

static void sb_reserve(sbuf_t *sb, size_t extra) {
  if (sb->len + extra + 1 <= sb->cap) return;
  size_t cap = sb->cap ? sb->cap : 256;
  while (cap < sb->len + extra + 1) cap *= 2;
  char *s = realloc(sb->s, cap);
  if (!s) abort();
  sb->s = s;
  sb->cap = cap;
}

static void sb_addn(sbuf_t *sb, const char *s, size_t n) {
  sb_reserve(sb, n);
  memcpy(sb->s + sb->len, s, n);
  sb->len += n;
  sb->s[sb->len] = '\0';
}

static void sb_add(sbuf_t *sb, const char *s) { sb_addn(sb, s, strlen(s)); }

static void sb_vprintf(sbuf_t *sb, const char *fmt, va_list ap) {
  char small[256];
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap2);
  va_end(ap2);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    sb_addn(sb, small, (size_t)n);
    return;
  }
  sb_reserve(sb, (size_t)n);
  vsnprintf(sb->s + sb->len, (size_t)n + 1, fmt, ap);
  sb->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static size_t utf8_seq_len(const unsigned char *s, size_t avail) {
  size_t n;
  unsigned cp;
  if (s[0] < 0x80) return 1;
  if ((s[0] & 0xe0) == 0xc0) n = 2, cp = s[0] & 0x1f;
  else if ((s[0] & 0xf0) == 0xe0) n = 3, cp = s[0] & 0x0f;
  else if ((s[0] & 0xf8) == 0xf0) n = 4, cp = s[0] & 0x07;
  else return 0;
  if (n > avail) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  static const unsigned min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

/* Appends s as the inside of a JSON string: quotes, backslashes and control characters
 * escaped, invalid UTF-8 replaced by U+FFFD. */
static void sb_json_escape(sbuf_t *sb, const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < len;) {
    unsigned char c = p[i];
    char esc[8];
    switch (c) {
    case '"': sb_add(sb, "\\\""); i++; continue;
    case '\\': sb_add(sb, "\\\\"); i++; continue;
    case '\n': sb_add(sb, "\\n"); i++; continue;
    case '\r': sb_add(sb, "\\r"); i++; continue;
    case '\t': sb_add(sb, "\\t"); i++; continue;
    default: break;
    }
    if (c < 0x20 || c == 0x7f) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      sb_add(sb, esc);
      i++;
      continue;
    }
    size_t n = utf8_seq_len(p + i, len - i);
    if (n == 0) {
      sb_add(sb, "\\ufffd");
      i++;
    } else {
      sb_addn(sb, s + i, n);
      i += n;
    }
  }
}

/* ---- redaction -------------------------------------------------------------------------- */

/* Words that make a field name, or a `word=value` in free text, secret. */
static const char *const secret_words[] = {"password", "passwd", "secret", "token", "authorization",
                                           "apikey", "api_key", "api-key", "credential", "cookie",
                                           "private_key", "key.pem", "oauthbearer.config"};

static bool has_secret_word(const char *key, size_t len) {
  for (size_t w = 0; w < sizeof secret_words / sizeof secret_words[0]; w++) {
    size_t wl = strlen(secret_words[w]);
    for (size_t i = 0; i + wl <= len; i++)
      if (strncasecmp(key + i, secret_words[w], wl) == 0) return true;
  }
  return false;
}

bool obx_log_key_is_secret(const char *key) { return has_secret_word(key, strlen(key)); }

static bool is_ident(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.'; }
static bool ends_value(char c) {
  return c == '\0' || isspace((unsigned char)c) || c == '&' || c == ',' || c == ';' || c == '"' || c == '\'';
}

/* At s (a word start): `<ident containing a secret word> [ ]*[=:][ ]* ["]? value`. Returns the
 * number of bytes up to the start of the value (and the value's length) or 0. A name followed
 * by ':' that holds a '.' is a file name ("api-key.pem: No such file"), not a key: only '='
 * assigns to dotted names (sasl.password=...). */
static size_t secret_assignment(const char *s, size_t *value_len) {
  size_t i = 0;
  while (is_ident(s[i])) i++;
  if (i == 0 || !has_secret_word(s, i)) return 0;
  bool dotted = memchr(s, '.', i) != NULL;
  if (s[i] == '"' || s[i] == '\'') i++; /* "password": "..." in JSON text */
  while (s[i] == ' ') i++;
  if (s[i] != '=' && s[i] != ':') return 0;
  if (s[i] == ':' && (dotted || (s[i + 1] == '/' && s[i + 2] == '/'))) return 0; /* a file name; a URI scheme */
  i++;
  while (s[i] == ' ') i++;
  if (s[i] == '"' || s[i] == '\'') i++;
  if (strncasecmp(s + i, "Bearer ", 7) == 0 || strncasecmp(s + i, "Basic ", 6) == 0) {
    while (s[i] != ' ') i++;
    i++;
  }
  size_t v = 0;
  while (!ends_value(s[i + v])) v++;
  *value_len = v;
  return v ? i : 0;
}

/* Copies text into sb with URI passwords and secret assignments masked: the values, never the
 * words around them. A name that is the last component of a path ("/etc/outboxd/api-key: No
 * such file") is not a key. */
static void redact_text(sbuf_t *sb, const char *text) {
  const char *s = text;
  while (*s) {
    size_t vlen = 0, pre;
    bool word_start = s == text || (!is_ident(s[-1]) && s[-1] != '/' && s[-1] != '\\');
    if (word_start && (pre = secret_assignment(s, &vlen)) != 0) {
      sb_addn(sb, s, pre);
      sb_add(sb, "***");
      s += pre + vlen;
      continue;
    }
    if (strncmp(s, "://", 3) == 0) {
      sb_add(sb, "://");
      s += 3;
      size_t end = strcspn(s, "/?#\"' \t\r\n<>");
      const char *at = NULL;
      for (size_t i = 0; i < end; i++)
        if (s[i] == '@') at = s + i;
      if (at) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (colon) sb_addn(sb, s, (size_t)(colon - s) + 1);
        sb_add(sb, "***@");
        s = at + 1;
      }
      continue;
    }
    sb_addn(sb, s, 1);
    s++;
  }
}

char *obx_log_redact_uri(const char *uri) {
  sbuf_t sb = {0};
  sb_reserve(&sb, strlen(uri));
  redact_text(&sb, uri);
  return sb.s;
}

/* ---- writing ---------------------------------------------------------------------------- */

static void add_json_field(sbuf_t *line, sbuf_t *tmp, const char *key, const char *value, bool scrub) {
  sb_add(line, ",\"");
  sb_json_escape(line, key, strlen(key));
  sb_add(line, "\":\"");
  tmp->len = 0;
  if (scrub) {
    sb_reserve(tmp, strlen(value));
    tmp->s[0] = '\0';
    redact_text(tmp, value);
  } else {
    sb_add(tmp, value);
  }
  sb_json_escape(line, tmp->s, tmp->len);
  sb_add(line, "\"");
}

static void write_line(obx_log_level_t level, const obx_log_field_t *fields, int nfields, const char *msg) {
  sbuf_t line = {0}, tmp = {0};
  char ts[32];
  obx_time_format_rfc3339(obx_time_now_ms(), ts);
  sb_add(&line, "{\"ts\":\"");
  sb_add(&line, ts);
  sb_add(&line, "\",\"level\":\"");
  sb_add(&line, obx_log_level_name(level));
  sb_add(&line, "\"");
  add_json_field(&line, &tmp, "role", t_role ? t_role : "main", false);
  add_json_field(&line, &tmp, "msg", msg, true);
  const obx_trace_ctx_t *trace = obx_trace_current(); /* the span of the event being handled */
  if (trace) {
    char trace_hex[OBX_TRACE_ID_HEX + 1], span_hex[OBX_SPAN_ID_HEX + 1];
    obx_trace_ids_hex(trace, trace_hex, span_hex);
    add_json_field(&line, &tmp, "traceId", trace_hex, false);
    add_json_field(&line, &tmp, "spanId", span_hex, false);
  }
  for (int i = 0; i < nfields; i++) {
    if (!fields[i].key || !fields[i].value) continue;
    if (obx_log_key_is_secret(fields[i].key))
      add_json_field(&line, &tmp, fields[i].key, "***", false);
    else
      add_json_field(&line, &tmp, fields[i].key, fields[i].value, true);
  }
  sb_add(&line, "}\n");

  pthread_mutex_lock(&g_mutex);
  FILE *out = g_stream ? g_stream : stdout;
  fwrite(line.s, 1, line.len, out);
  fflush(out);
  pthread_mutex_unlock(&g_mutex);
  free(tmp.s);
  free(line.s);
}

void obx_log_write(obx_log_level_t level, const obx_log_field_t *fields, int nfields, const char *fmt, ...) {
  if (!obx_log_enabled(level)) return;
  sbuf_t msg = {0};
  va_list ap;
  va_start(ap, fmt);
  sb_reserve(&msg, 0);
  msg.s[0] = '\0';
  sb_vprintf(&msg, fmt, ap);
  va_end(ap);
  write_line(level, fields, nfields, msg.s);
  free(msg.s);
}

/* ---- mongoc ----------------------------------------------------------------------------- */

static void mongoc_handler(mongoc_log_level_t mlevel, const char *domain, const char *message, void *user_data) {
  obx_log_level_t level;
  switch (mlevel) {
  case MONGOC_LOG_LEVEL_ERROR:
  case MONGOC_LOG_LEVEL_CRITICAL: level = OBX_LOG_ERROR; break;
  case MONGOC_LOG_LEVEL_WARNING: level = OBX_LOG_WARN; break;
  case MONGOC_LOG_LEVEL_MESSAGE:
  case MONGOC_LOG_LEVEL_INFO: level = OBX_LOG_INFO; break;
  default: level = OBX_LOG_DEBUG; break;
  }
  if (!obx_log_enabled(level)) return;
  obx_log_field_t f[2] = {{"lib", "mongoc"}, {"domain", domain}};
  write_line(level, f, 2, message ? message : "");
}

void obx_log_route_mongoc(void) { mongoc_log_set_handler(mongoc_handler, NULL); }

/* ---- librdkafka ------------------------------------------------------------------------- */

static void kafka_handler(const rd_kafka_t *rk, int syslog_level, const char *fac, const char *buf) {
  obx_log_level_t level = syslog_level <= 3 ? OBX_LOG_ERROR
                          : syslog_level == 4 ? OBX_LOG_WARN
                          : syslog_level <= 6 ? OBX_LOG_INFO
                                              : OBX_LOG_DEBUG;
  if (!obx_log_enabled(level)) return;
  obx_log_field_t f[3] = {{"lib", "rdkafka"}, {"facility", fac}, {"client", rk ? rd_kafka_name(rk) : NULL}};
  write_line(level, f, 3, buf ? buf : "");
}

void obx_log_route_kafka(void *rd_kafka_conf) { rd_kafka_conf_set_log_cb(rd_kafka_conf, kafka_handler); }

/* ---- curl ------------------------------------------------------------------------------- */

/* Header names whose values are credentials. */
static const char *const curl_secret_headers[] = {"authorization:", "proxy-authorization:", "cookie:",
                                                  "set-cookie:", "x-api-key:"};

static void curl_add_line(sbuf_t *sb, const char *line, size_t len) {
  for (size_t i = 0; i < sizeof curl_secret_headers / sizeof curl_secret_headers[0]; i++) {
    size_t hl = strlen(curl_secret_headers[i]);
    if (len >= hl && strncasecmp(line, curl_secret_headers[i], hl) == 0) {
      sb_addn(sb, line, hl);
      sb_add(sb, " ***");
      return;
    }
  }
  sb_addn(sb, line, len);
}

static int curl_handler(CURL *handle, curl_infotype type, char *data, size_t size, void *userp) {
  const char *kind;
  switch (type) {
  case CURLINFO_TEXT: kind = "text"; break;
  case CURLINFO_HEADER_IN: kind = "header_in"; break;
  case CURLINFO_HEADER_OUT: kind = "header_out"; break;
  default: return 0; /* bodies and TLS records are never logged */
  }
  if (!obx_log_enabled(OBX_LOG_DEBUG)) return 0;
  sbuf_t sb = {0};
  sb_reserve(&sb, size);
  sb.s[0] = '\0';
  size_t i = 0;
  while (i < size) {
    size_t j = i;
    while (j < size && data[j] != '\n' && data[j] != '\r') j++;
    if (j > i) {
      if (sb.len) sb_add(&sb, "\n");
      curl_add_line(&sb, data + i, j - i);
    }
    i = j + 1;
  }
  if (sb.len) {
    obx_log_field_t f[2] = {{"lib", "curl"}, {"kind", kind}};
    /* the call's own context: the thread that performs it may be another (the worker's IO thread) */
    obx_trace_ctx_t outer = {0};
    if (userp && obx_trace_current()) outer = *obx_trace_current();
    if (userp) obx_trace_set_current(userp);
    write_line(OBX_LOG_DEBUG, f, 2, sb.s);
    if (userp) obx_trace_set_current(&outer);
  }
  free(sb.s);
  return 0;
}

void obx_log_curl_attach(void *curl_easy, const obx_trace_ctx_t *trace) {
  if (!obx_log_enabled(OBX_LOG_DEBUG)) return;
  curl_easy_setopt((CURL *)curl_easy, CURLOPT_DEBUGFUNCTION, curl_handler);
  if (trace) curl_easy_setopt((CURL *)curl_easy, CURLOPT_DEBUGDATA, (void *)trace);
  curl_easy_setopt((CURL *)curl_easy, CURLOPT_VERBOSE, 1L);
}
