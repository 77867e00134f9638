/* node_http_request.c - calls an external HTTP endpoint under the egress guard
 *
 * DESIGN: config { url, method (POST with a body, GET without), headers { name: value },
 * body (any JSON value, sent as JSON), timeoutMs (shorter than HTTP_TIMEOUT_MS only),
 * idempotencyHeader (default "Idempotency-Key"; false: none) }, all templated. Every call of an
 * event run sends `<idempotencyHeader>: <eventId>:<nodeId>` (`<eventId>:<nodeId>:<replayId>` when
 * an operator's replay asked for the run), the same on every retry, redelivery and redrive of the
 * event, so the endpoint can apply the effect once; a header of that name in `headers` wins.
 * order.pre runs (no event yet) send none. The call goes through the egress guard
 * (obx_egress_call_new, egress.c) and is left waiting (ctx->wait): the run stops until its
 * caller performed the transfer and resumes it (obx_pipeline_resume), which finishes the node
 * (http_finish). Outcome "success" on 2xx with output { status, body } (the
 * body parsed when it is JSON, else text). Failures: 3xx (redirects are not followed) and
 * 4xx other than 408/429 are terminal; 5xx, 408, 429, network and timeouts transient;
 * egress refusals and oversized responses terminal. Each call is a client span (HTTP semconv,
 * child of the step) whose context is sent as `traceparent` (and `tracestate`), replacing any
 * the config names. */
#include "pipeline_int.h"

#include <ctype.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "obx/obx_trace.h"

static const char *const methods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", NULL};

/* The client span of a call to url: url.full without its query (it may hold credentials),
 * server.address and server.port. */
static obx_span_t *client_span(const char *method, const char *url) {
  obx_span_t *span = obx_span_start(method, OBX_SPAN_CLIENT, obx_trace_current());
  obx_span_set_str(span, "http.request.method", method);
  CURLU *u = curl_url();
  char *host = NULL, *port = NULL;
  if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK) {
    curl_url_set(u, CURLUPART_QUERY, NULL, 0);
    curl_url_set(u, CURLUPART_FRAGMENT, NULL, 0);
    char *full = NULL;
    if (curl_url_get(u, CURLUPART_URL, &full, 0) == CURLUE_OK) obx_span_set_str(span, "url.full", full);
    curl_free(full);
    if (curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) obx_span_set_str(span, "server.address", host);
    if (curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK)
      obx_span_set_int(span, "server.port", atoi(port));
  }
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  return span;
}

static bool header_name_valid(const char *s) {
  if (!*s) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s)) return false;
  return true;
}

static bool http_validate(const bson_t *config, obx_err_t *err) {
  if (!obx_node_config_require_str(config, "url", err)) return false;
  const char *url = obx_node_config_str(config, "url");
  if (!strstr(url, "{{")) {
    obx_egress_t any = {.allow_public = true}; /* the URL's form only: hosts are checked when it runs */
    obx_err_t uerr = OBX_ERR_INIT;
    if (!obx_egress_check_url(&any, url, &uerr)) {
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.url: %s", uerr.msg);
      return false;
    }
  }
  bson_iter_t it;
  if (bson_iter_init_find(&it, config, "method")) {
    const char *method = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    const char *const *m = methods;
    while (*m && strcmp(*m, method) != 0) m++;
    if (!*m) {
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.method: \"%s\" (want GET, POST, PUT, PATCH or DELETE)",
                  method);
      return false;
    }
  }
  if (bson_iter_init_find(&it, config, "timeoutMs") &&
      (!BSON_ITER_HOLDS_INT(&it) || bson_iter_as_int64(&it) < 1 || bson_iter_as_int64(&it) > 300000)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.timeoutMs: an integer from 1 to 300000");
    return false;
  }
  if (bson_iter_init_find(&it, config, "idempotencyHeader") &&
      !(BSON_ITER_HOLDS_BOOL(&it) && !bson_iter_bool(&it)) &&
      !(BSON_ITER_HOLDS_UTF8(&it) && header_name_valid(bson_iter_utf8(&it, NULL)))) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.idempotencyHeader: a header name, or false for none");
    return false;
  }
  if (bson_iter_init_find(&it, config, "headers")) {
    bson_iter_t h;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &h)) {
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.headers: must be an object of strings");
      return false;
    }
    while (bson_iter_next(&h)) {
      if (!header_name_valid(bson_iter_key(&h)) || !BSON_ITER_HOLDS_UTF8(&h)) {
        obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.headers.%s: a header name with a string value",
                    bson_iter_key(&h));
        return false;
      }
    }
  }
  return true;
}

/* The name of the idempotency header of a call, NULL when the node has none. */
static const char *idempotency_header(const bson_t *config) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, config, "idempotencyHeader")) return "Idempotency-Key";
  return BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
}

/* Appends the response body to output: parsed when it is JSON, else as (UTF-8) text. */
static void append_body(bson_t *output, const obx_http_response_t *resp) {
  if (resp->len == 0) return;
  if (resp->content_type && strstr(resp->content_type, "json")) {
    bson_string_t *wrapped = bson_string_new("{\"v\":");
    bson_string_append(wrapped, resp->body);
    bson_string_append(wrapped, "}");
    bson_t *doc = bson_new_from_json((const uint8_t *)wrapped->str, wrapped->len, NULL);
    bson_string_free(wrapped, true);
    bson_iter_t it;
    bool appended = doc && bson_iter_init_find(&it, doc, "v") && bson_append_iter(output, "body", -1, &it);
    bson_destroy(doc);
    if (appended) return;
  }
  if (strlen(resp->body) == resp->len && bson_utf8_validate(resp->body, resp->len, false))
    bson_append_utf8(output, "body", -1, resp->body, (int)resp->len);
  else
    BSON_APPEND_UTF8(output, "body", "<binary response>");
}

/* A call on its way: the egress call, its client span and its URL (for the error messages). */
typedef struct {
  obx_node_wait_t base;
  obx_egress_call_t *call;
  obx_span_t *span;
  char *url;
} http_wait_t;

/* Ends the client span of a call (its status, or the error) and frees what the call held. */
static void call_end(obx_span_t *span, bool ok, const obx_http_response_t *resp, const obx_err_t *err) {
  if (span && !ok) {
    char type[32];
    if (resp->status) snprintf(type, sizeof type, "%ld", resp->status);
    obx_span_set_str(span, "error.type", resp->status ? type : "network");
    obx_span_set_error(span, err->msg);
  }
  obx_span_end(span);
}

static bool http_finish(obx_node_wait_t *base, CURLcode rc, bson_t *output, const char **outcome, obx_err_t *err) {
  http_wait_t *wait = (http_wait_t *)base;
  obx_http_response_t resp = {0};
  bool ok = false;
  if (!obx_egress_call_finish(wait->call, rc, &resp, err)) goto done;
  obx_span_set_int(wait->span, "http.response.status_code", resp.status);
  if (resp.status >= 300 && resp.status < 400) {
    obx_err_set(err, OBX_ERR_CURL, (int)resp.status, false, "HTTP %ld redirect%s%s refused: redirects are not followed",
                resp.status, resp.location ? " to " : "", resp.location ? resp.location : "");
    goto done;
  }
  if (resp.status < 200 || resp.status >= 300) {
    obx_err_from_http_status(err, resp.status, wait->url);
    goto done;
  }
  BSON_APPEND_INT32(output, "status", (int32_t)resp.status);
  append_body(output, &resp);
  *outcome = "success";
  ok = true;
done:
  call_end(wait->span, ok, &resp, err);
  obx_http_response_cleanup(&resp);
  obx_egress_call_destroy(wait->call);
  bson_free(wait->url);
  bson_free(wait);
  return ok;
}

/* Builds the request (headers, Idempotency-Key, traceparent, body, the node's timeout) and leaves
 * its call waiting (ctx->wait); fails at once when the config or the egress guard refuses it. */
static bool http_run(obx_node_ctx_t *ctx, const bson_t *config, bson_t *output, const char **outcome,
                     obx_err_t *err) {
  (void)output;
  (void)outcome;
  const char *url = obx_node_config_str(config, "url");
  const char *method = obx_node_config_str(config, "method");
  bson_iter_t it, body_it;
  bool has_body = bson_iter_init_find(&body_it, config, "body");
  char **headers = NULL;
  int nheaders = 0;
  bson_string_t *body = NULL;
  obx_http_response_t none = {0};
  obx_span_t *span = NULL;
  obx_egress_call_t *call = NULL;
  if (!url) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.url: must render to a string");
    goto done;
  }
  if (!ctx->egress) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "no egress policy configured for http-request");
    goto done;
  }
  if (!method) method = has_body ? "POST" : "GET";
  if (bson_iter_init_find(&it, config, "headers") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    bson_iter_t h;
    bson_iter_recurse(&it, &h);
    uint32_t count = 0;
    while (bson_iter_next(&h)) count++;
    headers = bson_malloc0((count + 4) * sizeof *headers);
    bson_iter_recurse(&it, &h);
    while (bson_iter_next(&h)) {
      if (strcasecmp(bson_iter_key(&h), "traceparent") == 0 || strcasecmp(bson_iter_key(&h), "tracestate") == 0)
        continue; /* the call's own context is sent */
      const char *value = BSON_ITER_HOLDS_UTF8(&h) ? bson_iter_utf8(&h, NULL) : NULL;
      if (!value || strpbrk(value, "\r\n")) {
        obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.headers.%s: must render to one line of text",
                    bson_iter_key(&h));
        goto done;
      }
      headers[nheaders++] = bson_strdup_printf("%s: %s", bson_iter_key(&h), value);
    }
  }
  if (!headers) headers = bson_malloc0(4 * sizeof *headers);
  const char *ikey = idempotency_header(config);
  bool named = false;
  for (int i = 0; ikey && i < nheaders; i++)
    named = named || (strncasecmp(headers[i], ikey, strlen(ikey)) == 0 && headers[i][strlen(ikey)] == ':');
  if (ikey && !named && ctx->input->event_id) {
    const char *replay = ctx->input->replay_id;
    headers[nheaders++] = bson_strdup_printf("%s: %s:%s%s%s", ikey, ctx->input->event_id, ctx->node->id,
                                             replay ? ":" : "", replay ? replay : "");
  }
  span = client_span(method, url);
  char traceparent[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(obx_span_ctx(span), traceparent);
  headers[nheaders++] = bson_strdup_printf("traceparent: %s", traceparent);
  if (obx_span_ctx(span)->state[0]) headers[nheaders++] = bson_strdup_printf("tracestate: %s", obx_span_ctx(span)->state);
  if (has_body) {
    body = bson_string_new(NULL);
    obx_json_append_value(body, &body_it);
  }
  /* the node may only shorten the policy's total timeout */
  obx_egress_t egress = *ctx->egress;
  if (bson_iter_init_find(&it, config, "timeoutMs") && BSON_ITER_HOLDS_INT(&it) &&
      bson_iter_as_int64(&it) < egress.timeout_ms)
    egress.timeout_ms = bson_iter_as_int64(&it);
  call = obx_egress_call_new(&egress, method, url, (const char *const *)headers, body ? body->str : NULL,
                             body ? body->len : 0, err);
done:
  if (body) bson_string_free(body, true);
  for (int i = 0; i < nheaders; i++) bson_free(headers[i]);
  bson_free(headers);
  if (!call) {
    call_end(span, false, &none, err);
    return false;
  }
  http_wait_t *wait = bson_malloc0(sizeof *wait);
  wait->base = (obx_node_wait_t){.handle = obx_egress_call_handle(call), .finish = http_finish};
  wait->call = call;
  wait->span = span;
  wait->url = bson_strdup(url);
  ctx->wait = &wait->base;
  return true;
}

const obx_node_type_t obx_node_http_request = {"http-request", obx_node_outcomes_success, http_validate, http_run};
