/* sink.c - the CloudEvents HTTP sink of the worker (WORKER_SOURCE=http, Knative)
 *
 * DESIGN: POST / on the shared HTTP server, public (the broker carries no API key). Binary
 * mode (ce-* HTTP headers, the payload as body) and structured mode
 * (application/cloudevents+json) are turned into the ladder's binary form and handled on the
 * event's lane like a Kafka record. The handler waits for the outcome: 200 once it is durable
 * in the inbox (done, skipped, duplicate, blocked, retrying or dead), 400 for a request that
 * is not a CloudEvent, 503 when MongoDB or RabbitMQ is unavailable or the worker is stopping,
 * so the broker delivers again. /readyz includes a MongoDB ping. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "obx/obx_event.h"
#include "obx/obx_mongo.h"
#include "worker_int.h"

struct worker_http_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  worker_outcome_t outcome;
};

void worker_http_complete(worker_http_wait_t *wait, worker_outcome_t outcome) {
  pthread_mutex_lock(&wait->mu);
  wait->outcome = outcome;
  wait->done = true;
  pthread_cond_signal(&wait->cv);
  pthread_mutex_unlock(&wait->mu);
}

/* The CloudEvents attributes outboxd reads, as HTTP headers (ce-<name>). */
static const char *const ce_attributes[] = {"specversion", "id",    "source",        "type",
                                            "time",        "subject", "partitionkey", "orgid",
                                            "correlationid", "causationid", "eventversion"};

static bool msg_from_request(obx_http_req_t *req, obx_ladder_msg_t *msg, obx_err_t *err) {
  size_t len = 0;
  const char *body = obx_http_req_body(req, &len);
  const char *ct = obx_http_req_header(req, "Content-Type");
  if (ct && strncasecmp(ct, "application/cloudevents+json", 28) == 0) {
    obx_event_t ev;
    obx_event_init(&ev);
    bool ok = obx_event_from_ce_json(&ev, body, len, err) && obx_ladder_msg_from_event(msg, &ev, err);
    obx_event_cleanup(&ev);
    return ok;
  }
  enum { N = sizeof ce_attributes / sizeof ce_attributes[0] };
  obx_ce_header_t hdrs[N + 1];
  char names[N][32];
  int n = 0;
  for (int i = 0; i < N; i++) {
    char http_name[32];
    snprintf(http_name, sizeof http_name, "ce-%s", ce_attributes[i]);
    const char *v = obx_http_req_header(req, http_name);
    if (!v) continue;
    snprintf(names[n], sizeof names[n], "ce_%s", ce_attributes[i]);
    hdrs[n] = (obx_ce_header_t){names[n], v, strlen(v)};
    n++;
  }
  if (ct) hdrs[n++] = (obx_ce_header_t){"content-type", ct, strlen(ct)};
  const char *key = obx_http_req_header(req, "ce-partitionkey");
  obx_ladder_msg_from_record(msg, obx_http_req_header(req, "ce-id"), key, key ? strlen(key) : 0, body, len, hdrs, n);
  /* Validate now: a request that is not a CloudEvent is the sender's problem. */
  obx_event_t ev;
  obx_event_init(&ev);
  bool ok = obx_ladder_msg_to_event(msg, &ev, err);
  obx_event_cleanup(&ev);
  return ok;
}

static bool sink_ready(void *ctx, obx_err_t *err) { return obx_mongo_ping(ctx, err); }

static void sink_handler(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  obx_worker_t *w = ctx;
  obx_ladder_msg_t msg;
  obx_ladder_msg_init(&msg);
  obx_err_t err = OBX_ERR_INIT;
  if (!msg_from_request(req, &msg, &err)) {
    obx_http_reply_problem(resp, 400, "Not a CloudEvent", err.msg, NULL);
    obx_ladder_msg_cleanup(&msg);
    return;
  }
  worker_http_wait_t wait = {.done = false};
  pthread_mutex_init(&wait.mu, NULL);
  pthread_cond_init(&wait.cv, NULL);
  if (!worker_enqueue_http(w, &msg, &wait)) {
    obx_http_resp_header(resp, "Retry-After", "1");
    obx_http_reply_problem(resp, 503, "Worker stopping", "the event was not accepted", NULL);
    goto done;
  }
  pthread_mutex_lock(&wait.mu);
  while (!wait.done) pthread_cond_wait(&wait.cv, &wait.mu);
  pthread_mutex_unlock(&wait.mu);
  static const char *const names[] = {"done", "skipped", "duplicate", "blocked", "retrying", "dead", "malformed", "unavailable"};
  char json[96];
  switch (wait.outcome) {
  case WORKER_MALFORMED:
    obx_http_reply_problem(resp, 400, "Not a CloudEvent", "the event does not decode", NULL);
    break;
  case WORKER_INFRA:
    obx_http_resp_header(resp, "Retry-After", "1");
    obx_http_reply_problem(resp, 503, "Storage unavailable", "the outcome could not be recorded; retry", NULL);
    break;
  default:
    snprintf(json, sizeof json, "{\"status\":\"%s\"}", names[wait.outcome]);
    obx_http_reply(resp, 200, "application/json", json, strlen(json));
  }
done:
  pthread_cond_destroy(&wait.cv);
  pthread_mutex_destroy(&wait.mu);
  obx_ladder_msg_cleanup(&msg);
}

void worker_http_register(obx_worker_t *w, obx_http_t *http, obx_mongo_t *mongo) {
  obx_http_route(http, "POST", "/", NULL, sink_handler, w);
  /* The sink cannot make anything durable without MongoDB: not ready, so no traffic. */
  obx_http_add_ready_check(http, "worker-mongo", sink_ready, mongo);
}
