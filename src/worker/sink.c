/* sink.c - the CloudEvents HTTP sink of the worker (WORKER_SOURCE=http, Knative)
 *
 * DESIGN: the sink has a listener of its own (worker.sink_port on http.bind), never the API's:
 * only POST / (events), POST /dead-letter (Knative's deadLetterSink) and the built-in /healthz,
 * /readyz (a MongoDB ping and the worker's schema in place) and /metrics are served there. Every POST must carry the shared
 * token (worker.sink_token) as `Authorization: Bearer <token>`, or as the password of Basic
 * credentials (what a dispatcher sends for a subscriber URI http://user:<token>@host/); the
 * comparison is of SHA-256 digests with CRYPTO_memcmp, so it takes the same time whatever the
 * guess. No token or a wrong one: 401.
 *
 * POST / accepts binary mode (ce-* headers, the payload as body) and structured mode
 * (application/cloudevents+json). Answers, so that a broker retries exactly what retrying can fix:
 *   400  not a CloudEvent (specversion 1.0, id, source and type are required; nothing else)
 *   200  handled on the event's lane like a Kafka record and durable in the inbox (done,
 *        skipped, duplicate, blocked, retrying or dead), or a valid CloudEvent outboxd cannot
 *        run (no orgid, no subject, a payload that is not a JSON object...): parked in the DLQ
 *        with the decoder's reason ({"status":"dead"}), nothing lost
 *   503  MongoDB or RabbitMQ unavailable, the worker's schema not in place yet, or the worker
 *        stopping (Retry-After: 1)
 * POST /dead-letter parks whatever Knative gave up on in the DLQ (class terminal, the reason
 * from the knativeerrorcode / knativeerrordest / knativeerrordata extensions): 200 once
 * RabbitMQ confirmed, 503 when it did not. Owns the sink's listener and a DLQ publisher; never
 * runs pipelines itself (the lanes do). Reads worker.sink_*, http.bind, http.max_body. */
#include <assert.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "obx/obx_auth.h"
#include "obx/obx_event.h"
#include "obx/obx_log.h"
#include "obx/obx_mongo.h"
#include "worker_int.h"

struct worker_http_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  worker_outcome_t outcome;
};

struct worker_sink {
  obx_worker_t *w;
  obx_http_t *http;
  obx_ladder_t *dlq;
  obx_mongo_t *mongo;
  char token_sha[OBX_AUTH_HASH_LEN + 1];
};

void worker_http_complete(worker_http_wait_t *wait, worker_outcome_t outcome) {
  pthread_mutex_lock(&wait->mu);
  wait->outcome = outcome;
  wait->done = true;
  pthread_cond_signal(&wait->cv);
  pthread_mutex_unlock(&wait->mu);
}

/* ---- authentication ------------------------------------------------------------------------ */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Decodes base64 into out (NUL-terminated); false when it is not base64 or does not fit. */
static bool b64_decode(const char *in, char *out, size_t cap) {
  size_t n = 0;
  unsigned acc = 0;
  int bits = 0;
  for (; *in && *in != '='; in++) {
    const char *p = strchr(b64, *in);
    if (!p || !*in) return false;
    acc = (acc << 6) | (unsigned)(p - b64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      if (n + 1 >= cap) return false;
      out[n++] = (char)((acc >> bits) & 0xff);
    }
  }
  out[n] = '\0';
  return true;
}

/* The token the caller presented (Bearer, or Basic's password), copied to out. */
static bool presented_token(const obx_http_req_t *req, char *out, size_t cap) {
  const char *auth = obx_http_req_header(req, "Authorization");
  if (!auth) return false;
  if (strncasecmp(auth, "Bearer ", 7) == 0) {
    snprintf(out, cap, "%s", auth + 7);
    return true;
  }
  if (strncasecmp(auth, "Basic ", 6) == 0) {
    char pair[512];
    if (!b64_decode(auth + 6, pair, sizeof pair)) return false;
    const char *colon = strchr(pair, ':');
    if (!colon) return false;
    snprintf(out, cap, "%s", colon + 1);
    return true;
  }
  return false;
}

static bool authorized(const worker_sink_t *sink, const obx_http_req_t *req, obx_http_resp_t *resp) {
  char token[512] = "";
  char sha[OBX_AUTH_HASH_LEN + 1];
  bool have = presented_token(req, token, sizeof token);
  obx_sha256_hex(token, strlen(token), sha);
  if (have && CRYPTO_memcmp(sha, sink->token_sha, OBX_AUTH_HASH_LEN) == 0) return true;
  obx_http_resp_header(resp, "WWW-Authenticate", "Bearer realm=\"outboxd-sink\"");
  obx_http_reply_problem(resp, 401, "Unauthorized", "the sink token (worker.sink_token) is missing or wrong", NULL);
  return false;
}

/* ---- requests to messages ------------------------------------------------------------------- */

/* The CloudEvents attributes outboxd reads, as HTTP headers (ce-<name>). */
static const char *const ce_attributes[] = {"specversion", "id", "source", "type", "time", "subject",
                                            "partitionkey", "orgid", "correlationid", "causationid",
                                            "eventversion", "traceparent", "tracestate", "keyseq", "knativeerrorcode",
                                            "knativeerrordest", "knativeerrordata"};

static bool is_structured(const obx_http_req_t *req) {
  const char *ct = obx_http_req_header(req, "Content-Type");
  return ct && strncasecmp(ct, "application/cloudevents+json", 28) == 0;
}

/* A string member of a structured event (copied to out), or false. */
static bool json_attr(const bson_t *doc, const char *name, char *out, size_t cap) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, name) || !BSON_ITER_HOLDS_UTF8(&it)) return false;
  snprintf(out, cap, "%s", bson_iter_utf8(&it, NULL));
  return true;
}

/* Fills msg with the request as it came (headers, body), whatever it holds, and checks the
 * four attributes the CloudEvents spec requires. false with err: not a CloudEvent. */
static bool msg_from_request(const obx_http_req_t *req, obx_envelope_t *msg, obx_err_t *err) {
  size_t len = 0;
  const char *body = obx_http_req_body(req, &len);
  const char *ct = obx_http_req_header(req, "Content-Type");
  static const char *const required[] = {"specversion", "id", "source", "type"};
  char attrs[4][256] = {{0}};
  if (is_structured(req)) {
    bson_error_t berr;
    bson_t *doc = bson_new_from_json((const uint8_t *)body, (ssize_t)len, &berr);
    if (!doc) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "structured CloudEvent: invalid JSON: %s", berr.message);
      return false;
    }
    for (int i = 0; i < 4; i++) json_attr(doc, required[i], attrs[i], sizeof attrs[i]);
    bson_destroy(doc);
    obx_ce_header_t h = {"content-type", ct, strlen(ct)};
    obx_envelope_from_record(msg, attrs[1][0] ? attrs[1] : "structured", NULL, 0, body, len, &h, 1);
  } else {
    enum { N = sizeof ce_attributes / sizeof ce_attributes[0] };
    obx_ce_header_t hdrs[N + 1];
    char names[N][32];
    int n = 0;
    for (int i = 0; i < N; i++) {
      char http_name[40];
      snprintf(http_name, sizeof http_name, "ce-%s", ce_attributes[i]);
      const char *v = obx_http_req_header(req, http_name);
      if (!v) continue;
      if (i < 4) snprintf(attrs[i], sizeof attrs[i], "%s", v);
      snprintf(names[n], sizeof names[n], "ce_%s", ce_attributes[i]);
      hdrs[n] = (obx_ce_header_t){names[n], v, strlen(v)};
      n++;
    }
    if (ct) hdrs[n++] = (obx_ce_header_t){"content-type", ct, strlen(ct)};
    const char *key = obx_http_req_header(req, "ce-partitionkey");
    obx_envelope_from_record(msg, attrs[1][0] ? attrs[1] : "binary", key, key ? strlen(key) : 0, body, len, hdrs, n);
  }
  for (int i = 0; i < 4; i++) {
    if (!attrs[i][0]) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false, "not a CloudEvent: %s%s is missing (specversion, id, source and type are required)",
                  is_structured(req) ? "" : "ce-", required[i]);
      return false;
    }
  }
  if (strcmp(attrs[0], "1.0") != 0) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "not a CloudEvent this sink reads: specversion '%s' (want 1.0)", attrs[0]);
    return false;
  }
  return true;
}

/* Whether outboxd can run the event (its own attributes present and well-formed). A structured
 * event that decodes replaces msg with its binary form, the one the lanes and the ladder carry. */
static bool outboxd_decodes(const obx_http_req_t *req, obx_envelope_t *msg, obx_err_t *err) {
  obx_event_t ev;
  obx_event_init(&ev);
  size_t len = 0;
  const char *body = obx_http_req_body(req, &len);
  bool ok;
  if (is_structured(req)) {
    obx_envelope_t binary;
    obx_envelope_init(&binary);
    ok = obx_event_from_ce_json(&ev, body, len, err) && obx_envelope_from_event(&binary, &ev, err);
    if (ok) {
      obx_envelope_cleanup(msg);
      *msg = binary;
    } else {
      obx_envelope_cleanup(&binary);
    }
  } else {
    ok = obx_envelope_to_event(msg, &ev, err);
  }
  obx_event_cleanup(&ev);
  return ok;
}

/* Parks msg in the DLQ; answers 200 {"status":"dead"} or 503. */
static void park(worker_sink_t *sink, obx_envelope_t *msg, const char *failure_class, const char *reason,
                 obx_http_resp_t *resp) {
  obx_envelope_fail(msg, failure_class, reason, obx_time_now_ms());
  free(msg->reason);
  msg->reason = strdup(reason);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_publish_dlq(sink->dlq, msg, &err)) {
    obx_http_resp_header(resp, "Retry-After", "1");
    obx_http_reply_problem(resp, 503, "DLQ unavailable", err.msg, NULL);
    return;
  }
  obx_warn("sink: event %s parked in the DLQ: %s", msg->message_id, reason);
  static const char json[] = "{\"status\":\"dead\"}";
  obx_http_reply(resp, 200, "application/json", json, sizeof json - 1);
}

/* ---- handlers -------------------------------------------------------------------------------- */

static void sink_handler(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  worker_sink_t *sink = ctx;
  if (!authorized(sink, req, resp)) return;
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  obx_err_t err = OBX_ERR_INIT;
  worker_http_wait_t wait = {.done = false};
  pthread_mutex_init(&wait.mu, NULL);
  pthread_cond_init(&wait.cv, NULL);
  if (!msg_from_request(req, &msg, &err)) {
    obx_http_reply_problem(resp, 400, "Not a CloudEvent", err.msg, NULL);
    goto done;
  }
  if (!outboxd_decodes(req, &msg, &err)) {
    char reason[320];
    snprintf(reason, sizeof reason, "a CloudEvent outboxd cannot run: %s", err.msg);
    park(sink, &msg, "malformed", reason, resp);
    goto done;
  }
  if (!worker_schema_ready(sink->w)) { /* lanes wait for the schema: retry later, never hang */
    obx_http_resp_header(resp, "Retry-After", "1");
    obx_http_reply_problem(resp, 503, "Storage not ready", "the worker's collections are not in place yet", NULL);
    goto done;
  }
  if (!worker_enqueue_http(sink->w, &msg, &wait)) {
    obx_http_resp_header(resp, "Retry-After", "1");
    obx_http_reply_problem(resp, 503, "Worker stopping", "the event was not accepted", NULL);
    goto done;
  }
  pthread_mutex_lock(&wait.mu);
  while (!wait.done) pthread_cond_wait(&wait.cv, &wait.mu);
  pthread_mutex_unlock(&wait.mu);
  char json[96];
  switch (wait.outcome) {
  case WORKER_MALFORMED:
    park(sink, &msg, "malformed", "the event does not decode", resp);
    break;
  case WORKER_INFRA:
    obx_http_resp_header(resp, "Retry-After", "1");
    obx_http_reply_problem(resp, 503, "Storage unavailable", "the outcome could not be recorded; retry", NULL);
    break;
  default:
    /* a run whose claim a peer took over is the peer's to settle: a duplicate for the sender */
    snprintf(json, sizeof json, "{\"status\":\"%s\"}",
             worker_state_name(wait.outcome == WORKER_LOST ? WORKER_DUPLICATE : wait.outcome));
    obx_http_reply(resp, 200, "application/json", json, strlen(json));
  }
done:
  pthread_cond_destroy(&wait.cv);
  pthread_mutex_destroy(&wait.mu);
  obx_envelope_cleanup(&msg);
}

static void dead_letter_handler(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  worker_sink_t *sink = ctx;
  if (!authorized(sink, req, resp)) return;
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  obx_err_t err = OBX_ERR_INIT;
  bool is_ce = msg_from_request(req, &msg, &err);
  const char *code = obx_http_req_header(req, "ce-knativeerrorcode");
  const char *dest = obx_http_req_header(req, "ce-knativeerrordest");
  char reason[512];
  snprintf(reason, sizeof reason, "Knative gave up delivering it%s%s%s%s%s%s", code ? ": HTTP " : "", code ? code : "",
           dest ? " from " : "", dest ? dest : "", is_ce ? "" : "; ", is_ce ? "" : err.msg);
  park(sink, &msg, "terminal", reason, resp);
  obx_envelope_cleanup(&msg);
}

static bool sink_ready(void *ctx, obx_err_t *err) {
  worker_sink_t *sink = ctx;
  if (!obx_mongo_ping(sink->mongo, err)) return false;
  if (worker_schema_ready(sink->w)) return true;
  obx_err_set(err, OBX_ERR_MONGO, 0, true, "the worker's collections and indexes are not in place yet");
  return false;
}

worker_sink_t *worker_sink_start(obx_worker_t *w, const obx_conf_t *conf, obx_mongo_t *mongo, obx_err_t *err) {
  if (!conf->worker_sink_token || strlen(conf->worker_sink_token) < 16) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "worker.sink_token: at least 16 characters are required with WORKER_SOURCE=http");
    return NULL;
  }
  worker_sink_t *sink = calloc(1, sizeof *sink);
  sink->w = w;
  sink->mongo = mongo;
  obx_sha256_hex(conf->worker_sink_token, strlen(conf->worker_sink_token), sink->token_sha);
  /* the sink's own server: its port, no API keys, no CORS, no per-key rate limit */
  obx_conf_t sc = *conf;
  sc.http_port = conf->worker_sink_port;
  sc.api_keys_file = "";
  sc.api_cors_origins = "";
  sc.api_rate_limit = 0;
  obx_ladder_opts_t lo = {.url = conf->amqp_url, .prefix = conf->worker_queue_prefix,
                          .tiers_ms = conf->retry_ladder.ms, .ntiers = conf->retry_ladder.n};
  obx_amqp_settings_from_conf(&lo.amqp, conf);
  if (!(sink->dlq = obx_ladder_new(&lo, err)) || !(sink->http = obx_http_new(&sc, err))) goto fail;
  obx_http_route(sink->http, "POST", "/", NULL, sink_handler, sink);
  obx_http_route(sink->http, "POST", "/dead-letter", NULL, dead_letter_handler, sink);
  /* the sink cannot make anything durable without MongoDB: not ready, so no traffic */
  obx_http_add_ready_check(sink->http, "mongo", sink_ready, sink);
  if (!obx_http_start(sink->http, err)) goto fail;
  obx_info("CloudEvents sink listening on port %d", obx_http_port(sink->http));
  return sink;
fail:
  worker_sink_stop(sink);
  return NULL;
}

int worker_sink_port(const worker_sink_t *sink) { return sink ? obx_http_port(sink->http) : 0; }

void worker_sink_stop(worker_sink_t *sink) {
  if (!sink) return;
  obx_http_destroy(sink->http);
  obx_ladder_destroy(sink->dlq);
  free(sink);
}

bool worker_enqueue_http(obx_worker_t *w, obx_envelope_t *msg, worker_http_wait_t *wait) {
  job_t *job = calloc(1, sizeof *job);
  assert(job);
  job->source = WORKER_SOURCE_HTTP;
  job->msg = *msg; /* ownership moves to the job */
  obx_envelope_init(msg);
  job->wait = wait;
  if (atomic_load(&w->stop)) {
    *msg = job->msg;
    free(job);
    return false;
  }
  worker_count_consumed(w, WORKER_SOURCE_HTTP);
  worker_job_push(w, job, NULL, NULL); /* bounded by the HTTP server's connections */
  return true;
}
