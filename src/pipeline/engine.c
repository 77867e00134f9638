/* engine.c - runs a pipeline graph and builds its pipeline_executions document
 *
 * DESIGN: phase 1 of a run (see obx_pipeline.h): breadth-first from the start node, each
 * node at most once, following the edges that match the node's outcome. Each step renders
 * its config against the context and the outputs of earlier steps, runs the node type and is
 * recorded as { nodeId, type, status, startedAt, durationMs, output | error, failureClass }.
 * The walk is resumable: its queue, outputs and steps live in the run, so a node that calls out
 * (ctx->wait) stops it; obx_pipeline_resume finishes that step and walks on. One walk serves
 * both callers: obx_pipeline_execute performs each call in place, the worker's IO thread many
 * at once (src/worker/io.c).
 * Outputs are bounded (OBX_STEP_OUTPUT_MAX bytes of BSON, and storable keys): a larger or
 * unstorable output is replaced by { truncated: true, bytes, preview }. The run never touches
 * the database; effects wait in the run for obx_pipeline_run_commit (commit.c). Metrics:
 * outboxd_pipeline_runs_total{trigger,status}, outboxd_pipeline_run_duration_seconds{trigger},
 * outboxd_pipeline_steps_total{type,status} (and outboxd_pipeline_egress_refused_total{stage}
 * in egress.c). Tracing: a run is a span "pipeline <trigger>" (a child of the thread's current
 * context: the worker's consumer span, the API's request span), each step a child span
 * "step <nodeId>", current while the node runs; the execution document records the run span's
 * traceId and spanId. */
#include "pipeline_int.h"

#include <stdlib.h>
#include <assert.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "obx/obx_event.h"
#include "obx/obx_metrics.h"
#include "obx/obx_trace.h"

#define OBX_STEP_OUTPUT_MAX 4096
#define OBX_STEP_PREVIEW_MAX 1024

struct obx_pipeline_run {
  char id[OBX_UUID_LEN + 1];
  obx_pipeline_status_t status;
  obx_failure_class_t failure_class;
  obx_err_t err;
  bson_t execution;
  bson_t statuses;
  uint32_t nstatuses;
  obx_event_t **events; /* pointers: a bson_t must not move */
  int nevents;
  char *pipeline_id, *org_id, *aggregate_type, *aggregate_id;
  /* the walk, kept while a node waits for its call */
  const obx_pipeline_t *pipeline; /* borrowed until the run ends */
  obx_pipeline_input_t input;     /* the caller's, copied: its strings and context are the run's */
  bson_t context;
  char *trigger, *event_id, *correlation_id, *partition_key, *replay_id;
  obx_node_ctx_t ctx;
  bson_t steps, outputs;
  int *queue;
  bool *queued;
  int head, tail;
  uint32_t nsteps;
  obx_span_t *span; /* "pipeline <trigger>" */
  int64_t started_at, t0;
  bool ended;
  /* the step that waits (ctx.wait set): its node, span and start */
  int step_node;
  obx_span_t *step_span;
  int64_t step_started_at, step_t0;
};

static obx_counter_t *runs_total, *steps_total;
static obx_histogram_t *run_seconds;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_init(void) {
  runs_total = obx_metrics_counter("outboxd_pipeline_runs_total", "Pipeline runs by trigger and final status",
                                   "trigger,status");
  steps_total = obx_metrics_counter("outboxd_pipeline_steps_total", "Pipeline steps run, by node type and status",
                                    "type,status");
  run_seconds = obx_metrics_histogram("outboxd_pipeline_run_duration_seconds",
                                      "Duration of pipeline runs (HTTP calls included)", "trigger", NULL, 0);
}

const char *obx_pipeline_status_name(obx_pipeline_status_t status) {
  switch (status) {
  case OBX_PIPELINE_SUCCEEDED: return "SUCCEEDED";
  case OBX_PIPELINE_FAILED: return "FAILED";
  case OBX_PIPELINE_SKIPPED: return "SKIPPED";
  }
  return "UNKNOWN";
}

const char *obx_failure_class_name(obx_failure_class_t fclass) {
  switch (fclass) {
  case OBX_FAILURE_TRANSIENT: return "transient";
  case OBX_FAILURE_TERMINAL: return "terminal";
  case OBX_FAILURE_NONE: break;
  }
  return NULL;
}

static obx_failure_class_t class_of(const obx_err_t *err) {
  return err->retriable ? OBX_FAILURE_TRANSIENT : OBX_FAILURE_TERMINAL;
}

static void append_str_or_null(bson_t *doc, const char *key, const char *value) {
  if (value)
    bson_append_utf8(doc, key, -1, value, -1);
  else
    bson_append_null(doc, key, -1);
}

/* Cuts s to at most max bytes at a UTF-8 character boundary. */
static size_t utf8_cut(const char *s, size_t len, size_t max) {
  if (len <= max) return len;
  size_t cut = max;
  while (cut > 0 && ((unsigned char)s[cut] & 0xc0) == 0x80) cut--;
  return cut;
}

static void append_bounded_output(bson_t *step, const bson_t *output) {
  size_t offset = 0;
  if (output->len <= OBX_STEP_OUTPUT_MAX && bson_validate(output, BSON_VALIDATE_UTF8 | BSON_VALIDATE_DOLLAR_KEYS |
                                                                      BSON_VALIDATE_DOT_KEYS | BSON_VALIDATE_EMPTY_KEYS,
                                                          &offset)) {
    BSON_APPEND_DOCUMENT(step, "output", output);
    return;
  }
  bson_string_t *json = bson_string_new(NULL);
  obx_json_append_doc(json, output, false);
  bson_t sub;
  BSON_APPEND_DOCUMENT_BEGIN(step, "output", &sub);
  BSON_APPEND_BOOL(&sub, "truncated", true);
  BSON_APPEND_INT32(&sub, "bytes", (int32_t)output->len);
  bson_append_utf8(&sub, "preview", -1, json->str, (int)utf8_cut(json->str, json->len, OBX_STEP_PREVIEW_MAX));
  bson_append_document_end(step, &sub);
  bson_string_free(json, true);
}

/* The outcome whose edges are followed: a tolerated failure with no failure edge continues on
 * the unbranched edges (NULL). */
static const char *branch_to_follow(const obx_pipeline_t *pipeline, int n, const char *outcome) {
  if (strcmp(outcome, "failure") != 0) return outcome;
  for (int e = 0; e < pipeline->nedges; e++)
    if (pipeline->edges[e].from == n && pipeline->edges[e].branch && strcmp(pipeline->edges[e].branch, "failure") == 0)
      return outcome;
  return NULL;
}

static bool edge_taken(const obx_pipeline_edge_t *edge, const char *follow) {
  if (edge->branch) return follow && strcmp(edge->branch, follow) == 0;
  return !follow || strcmp(follow, "failure") != 0;
}

/* Ends the step of node n: its span, its step document (key: the step's index) and its entry in
 * the outputs. Returns the outcome ("failure" when the node failed; err then set). */
static const char *step_end(obx_pipeline_run_t *run, int n, bool ok, const char *outcome, const bson_t *output,
                            obx_err_t *err) {
  const obx_pipeline_node_t *node = &run->pipeline->nodes[n];
  if (ok) obx_span_set_str(run->step_span, "outboxd.step.outcome", outcome);
  else obx_span_set_error(run->step_span, err->msg);
  obx_span_end(run->step_span);
  run->step_span = NULL;
  int64_t duration = obx_time_mono_ms() - run->step_t0;
  assert(!ok || outcome); /* a node type that succeeds names its outcome */

  char key[16];
  const char *keyp;
  bson_t step, out_entry;
  bson_uint32_to_string(run->nsteps++, &keyp, key, sizeof key);
  bson_append_document_begin(&run->steps, keyp, -1, &step);
  BSON_APPEND_UTF8(&step, "nodeId", node->id);
  BSON_APPEND_UTF8(&step, "type", node->type->name);
  BSON_APPEND_UTF8(&step, "status", ok ? "SUCCEEDED" : "FAILED");
  BSON_APPEND_DATE_TIME(&step, "startedAt", run->step_started_at);
  BSON_APPEND_INT64(&step, "durationMs", duration);
  if (ok) {
    BSON_APPEND_UTF8(&step, "outcome", outcome);
    append_bounded_output(&step, output);
  } else {
    BSON_APPEND_UTF8(&step, "error", err->msg);
    BSON_APPEND_UTF8(&step, "failureClass", obx_failure_class_name(class_of(err)));
  }
  bson_append_document_end(&run->steps, &step);
  obx_counter_inc(steps_total, node->type->name, ok ? "SUCCEEDED" : "FAILED");

  bson_append_document_begin(&run->outputs, node->id, -1, &out_entry);
  BSON_APPEND_UTF8(&out_entry, "status", ok ? "SUCCEEDED" : "FAILED");
  BSON_APPEND_DOCUMENT(&out_entry, "output", output);
  if (!ok) BSON_APPEND_UTF8(&out_entry, "error", err->msg);
  bson_append_document_end(&run->outputs, &out_entry);
  if (!ok) {
    obx_err_prefix(err, "node \"%s\"", node->id);
    return "failure";
  }
  return outcome;
}

/* Starts the step of node n: renders its config against the context and the outputs of earlier
 * steps and runs the node type under the step's span. Returns NULL when the node left a call
 * waiting (run->ctx.wait), else the outcome (step_end). */
static const char *step_begin(obx_pipeline_run_t *run, int n, obx_err_t *err) {
  const obx_pipeline_node_t *node = &run->pipeline->nodes[n];
  run->ctx.node = node;
  run->step_node = n;
  run->step_started_at = obx_time_now_ms();
  run->step_t0 = obx_time_mono_ms();
  bson_t rendered = BSON_INITIALIZER, output = BSON_INITIALIZER;
  const char *outcome = NULL;
  obx_err_clear(err);
  char span_name[300];
  snprintf(span_name, sizeof span_name, "step %s", node->id);
  run->step_span = obx_span_start(span_name, OBX_SPAN_INTERNAL, obx_span_ctx(run->span));
  obx_span_set_str(run->step_span, "outboxd.step.id", node->id);
  obx_span_set_str(run->step_span, "outboxd.step.type", node->type->name);
  obx_trace_set_current(obx_span_ctx(run->step_span));
  bool ok = obx_template_render_doc(&node->config, run->input.context, &run->outputs, &rendered, err) &&
            node->type->run(&run->ctx, &rendered, &output, &outcome, err);
  obx_trace_set_current(obx_span_ctx(run->span));
  bson_destroy(&rendered);
  if (ok && run->ctx.wait) {
    bson_destroy(&output);
    return NULL;
  }
  outcome = step_end(run, n, ok, outcome, &output, err);
  bson_destroy(&output);
  return outcome;
}

/* After node n ended with outcome: queues the nodes its matching edges lead to; false when the
 * failure ends the run (FAILED). */
static bool follow_edges(obx_pipeline_run_t *run, int n, const char *outcome, const obx_err_t *err) {
  const obx_pipeline_t *pipeline = run->pipeline;
  if (strcmp(outcome, "failure") == 0 && !pipeline->nodes[n].on_error_continue) {
    run->status = OBX_PIPELINE_FAILED;
    run->failure_class = class_of(err);
    run->err = *err;
    return false;
  }
  const char *follow = branch_to_follow(pipeline, n, outcome);
  for (int e = 0; e < pipeline->nedges; e++) {
    const obx_pipeline_edge_t *edge = &pipeline->edges[e];
    if (edge->from != n || run->queued[edge->to] || !edge_taken(edge, follow)) continue;
    run->queued[edge->to] = true;
    run->queue[run->tail++] = edge->to;
  }
  return true;
}

/* Ends the run: its span, its execution document, its metrics. */
static void run_end(obx_pipeline_run_t *run) {
  const obx_pipeline_t *pipeline = run->pipeline;
  const obx_pipeline_input_t *input = &run->input;
  run->ended = true;
  obx_span_set_str(run->span, "outboxd.pipeline.status", obx_pipeline_status_name(run->status));
  if (run->status == OBX_PIPELINE_FAILED) obx_span_set_error(run->span, run->err.msg);
  char trace_hex[OBX_TRACE_ID_HEX + 1], span_hex[OBX_SPAN_ID_HEX + 1];
  obx_trace_ids_hex(obx_span_ctx(run->span), trace_hex, span_hex);
  obx_span_end(run->span);
  run->span = NULL;

  bson_t *doc = &run->execution;
  BSON_APPEND_UTF8(doc, "_id", run->id);
  append_str_or_null(doc, "pipelineId", pipeline->id);
  BSON_APPEND_INT32(doc, "pipelineVersion", pipeline->version);
  append_str_or_null(doc, "pipelineName", pipeline->name);
  append_str_or_null(doc, "orgId", input->org_id);
  append_str_or_null(doc, "trigger", input->trigger);
  append_str_or_null(doc, "eventId", input->event_id);
  append_str_or_null(doc, "correlationId", input->correlation_id);
  append_str_or_null(doc, "aggregateId", input->aggregate_id);
  BSON_APPEND_INT32(doc, "attempt", input->attempt > 0 ? input->attempt : 1);
  BSON_APPEND_UTF8(doc, "status", obx_pipeline_status_name(run->status));
  append_str_or_null(doc, "failureClass", obx_failure_class_name(run->failure_class));
  append_str_or_null(doc, "error", run->status == OBX_PIPELINE_FAILED ? run->err.msg : NULL);
  BSON_APPEND_DATE_TIME(doc, "startedAt", run->started_at);
  int64_t duration = obx_time_mono_ms() - run->t0;
  BSON_APPEND_DATE_TIME(doc, "finishedAt", obx_time_now_ms());
  BSON_APPEND_INT64(doc, "durationMs", duration);
  BSON_APPEND_ARRAY(doc, "steps", &run->steps);
  BSON_APPEND_UTF8(doc, "traceId", trace_hex);
  BSON_APPEND_UTF8(doc, "spanId", span_hex);
  const char *trigger = input->trigger ? input->trigger : "none";
  obx_counter_inc(runs_total, trigger, obx_pipeline_status_name(run->status));
  obx_histogram_observe(run_seconds, (double)duration / 1000.0, trigger);
}

/* Walks the graph breadth-first from the queue's head until a node waits for its call or
 * nothing is left (the run then ends). The run's span is current meanwhile. */
static void advance(obx_pipeline_run_t *run) {
  obx_trace_ctx_t outer = {0};
  if (obx_trace_current()) outer = *obx_trace_current();
  obx_trace_set_current(obx_span_ctx(run->span));
  bool go_on = true;
  while (go_on && run->head < run->tail) {
    int n = run->queue[run->head++];
    obx_err_t err = OBX_ERR_INIT;
    const char *outcome = step_begin(run, n, &err);
    if (!outcome) break; /* waits */
    go_on = follow_edges(run, n, outcome, &err);
  }
  if (!run->ctx.wait) run_end(run);
  obx_trace_set_current(&outer);
}

static char *dup_or_null(const char *s) { return s ? bson_strdup(s) : NULL; }

obx_pipeline_run_t *obx_pipeline_start(const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input,
                                       const obx_egress_t *egress) {
  pthread_once(&metrics_once, metrics_init);
  obx_pipeline_run_t *run = obx_pipeline_calloc_aligned(1, sizeof *run);
  obx_uuid7(run->id);
  bson_init(&run->execution);
  bson_init(&run->statuses);
  bson_init(&run->steps);
  bson_init(&run->outputs);
  if (input->context) bson_copy_to(input->context, &run->context);
  else bson_init(&run->context);
  run->pipeline = pipeline;
  run->pipeline_id = bson_strdup(pipeline->id);
  run->org_id = bson_strdup(input->org_id);
  run->aggregate_type = bson_strdup(input->aggregate_type);
  run->aggregate_id = bson_strdup(input->aggregate_id);
  run->trigger = dup_or_null(input->trigger ? input->trigger : pipeline->trigger);
  run->event_id = dup_or_null(input->event_id);
  run->correlation_id = dup_or_null(input->correlation_id);
  run->partition_key = dup_or_null(input->partition_key);
  run->replay_id = dup_or_null(input->replay_id);
  run->input = (obx_pipeline_input_t){.context = &run->context, .org_id = run->org_id, .trigger = run->trigger,
                                      .event_id = run->event_id, .correlation_id = run->correlation_id,
                                      .aggregate_type = run->aggregate_type, .aggregate_id = run->aggregate_id,
                                      .partition_key = run->partition_key, .replay_id = run->replay_id,
                                      .attempt = input->attempt};
  run->ctx = (obx_node_ctx_t){.pipeline = pipeline, .input = &run->input, .egress = egress, .run = run,
                              .steps = &run->outputs};
  run->started_at = obx_time_now_ms();
  run->t0 = obx_time_mono_ms();

  char span_name[200];
  snprintf(span_name, sizeof span_name, "pipeline %s", run->trigger ? run->trigger : "none");
  obx_trace_ctx_t parent = {0};
  if (obx_trace_current()) parent = *obx_trace_current();
  run->span = obx_span_start(span_name, OBX_SPAN_INTERNAL, &parent);
  obx_span_set_str(run->span, "outboxd.pipeline.id", pipeline->id);
  obx_span_set_str(run->span, "outboxd.pipeline.name", pipeline->name);
  obx_span_set_str(run->span, "outboxd.trigger", run->trigger);
  obx_span_set_str(run->span, "outboxd.event.id", input->event_id);
  obx_span_set_str(run->span, "outboxd.execution.id", run->id);
  obx_span_set_int(run->span, "outboxd.attempt", input->attempt > 0 ? input->attempt : 1);
  run->status = pipeline->enabled ? OBX_PIPELINE_SUCCEEDED : OBX_PIPELINE_SKIPPED;
  run->queue = bson_malloc((size_t)pipeline->nnodes * sizeof *run->queue);
  run->queued = bson_malloc0((size_t)pipeline->nnodes * sizeof *run->queued);
  if (pipeline->enabled) {
    run->queue[run->tail++] = pipeline->start;
    run->queued[pipeline->start] = true;
  }
  advance(run);
  return run;
}

CURL *obx_pipeline_run_waiting(const obx_pipeline_run_t *run) { return run->ctx.wait ? run->ctx.wait->handle : NULL; }

void obx_pipeline_resume(obx_pipeline_run_t *run, CURLcode rc) {
  obx_node_wait_t *wait = run->ctx.wait;
  assert(wait);
  run->ctx.wait = NULL;
  obx_trace_ctx_t outer = {0};
  if (obx_trace_current()) outer = *obx_trace_current();
  obx_trace_set_current(obx_span_ctx(run->step_span));
  bson_t output = BSON_INITIALIZER;
  const char *outcome = NULL;
  obx_err_t err = OBX_ERR_INIT;
  bool ok = wait->finish(wait, rc, &output, &outcome, &err); /* frees wait */
  obx_trace_set_current(obx_span_ctx(run->span));
  int n = run->step_node;
  outcome = step_end(run, n, ok, outcome, &output, &err);
  bson_destroy(&output);
  if (!follow_edges(run, n, outcome, &err)) run->head = run->tail; /* the failure ends the walk */
  obx_trace_set_current(&outer);
  advance(run);
}

obx_pipeline_run_t *obx_pipeline_execute(const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input,
                                         const obx_egress_t *egress) {
  obx_pipeline_run_t *run = obx_pipeline_start(pipeline, input, egress);
  for (CURL *call; (call = obx_pipeline_run_waiting(run));) obx_pipeline_resume(run, curl_easy_perform(call));
  return run;
}

void obx_pipeline_run_add_status(obx_pipeline_run_t *run, const char *status_tag, const char *name,
                                 const char *phase) {
  char key[16];
  const char *keyp;
  bson_t entry;
  bson_uint32_to_string(run->nstatuses++, &keyp, key, sizeof key);
  bson_append_document_begin(&run->statuses, keyp, -1, &entry);
  BSON_APPEND_UTF8(&entry, "statusTag", status_tag);
  BSON_APPEND_UTF8(&entry, "name", name);
  append_str_or_null(&entry, "phase", phase);
  BSON_APPEND_DATE_TIME(&entry, "at", obx_time_now_ms());
  append_str_or_null(&entry, "pipelineId", run->pipeline_id);
  BSON_APPEND_UTF8(&entry, "executionId", run->id);
  bson_append_document_end(&run->statuses, &entry);
}

void obx_pipeline_run_add_event(obx_pipeline_run_t *run, obx_event_t *ev) {
  obx_event_t *copy = obx_pipeline_calloc_aligned(1, sizeof *copy);
  obx_event_init(copy);
  obx_event_copy(copy, ev);
  run->events = bson_realloc(run->events, (size_t)(run->nevents + 1) * sizeof *run->events);
  run->events[run->nevents++] = copy;
}

void obx_pipeline_run_destroy(obx_pipeline_run_t *run) {
  if (!run) return;
  /* a run given up while it waits: its calls end unperformed, so its spans end too */
  while (obx_pipeline_run_waiting(run)) obx_pipeline_resume(run, CURLE_ABORTED_BY_CALLBACK);
  for (int i = 0; i < run->nevents; i++) {
    obx_event_cleanup(run->events[i]);
    free(run->events[i]);
  }
  bson_free(run->events);
  bson_destroy(&run->statuses);
  bson_destroy(&run->execution);
  bson_free(run->pipeline_id);
  bson_free(run->org_id);
  bson_free(run->aggregate_type);
  bson_free(run->aggregate_id);
  bson_free(run->trigger);
  bson_free(run->event_id);
  bson_free(run->correlation_id);
  bson_free(run->partition_key);
  bson_free(run->replay_id);
  bson_free(run->queue);
  bson_free(run->queued);
  bson_destroy(&run->steps);
  bson_destroy(&run->outputs);
  bson_destroy(&run->context);
  free(run);
}

obx_pipeline_status_t obx_pipeline_run_status(const obx_pipeline_run_t *run) { return run->status; }
obx_failure_class_t obx_pipeline_run_failure_class(const obx_pipeline_run_t *run) { return run->failure_class; }
const obx_err_t *obx_pipeline_run_error(const obx_pipeline_run_t *run) { return &run->err; }
const char *obx_pipeline_run_execution_id(const obx_pipeline_run_t *run) { return run->id; }
const bson_t *obx_pipeline_run_execution(const obx_pipeline_run_t *run) { return &run->execution; }
int obx_pipeline_run_nevents(const obx_pipeline_run_t *run) { return run->nevents; }
const obx_event_t *obx_pipeline_run_event(const obx_pipeline_run_t *run, int i) { return run->events[i]; }
const bson_t *obx_pipeline_run_statuses(const obx_pipeline_run_t *run) { return &run->statuses; }
const char *obx_pipeline_run_org_id(const obx_pipeline_run_t *run) { return run->org_id; }
const char *obx_pipeline_run_aggregate_id(const obx_pipeline_run_t *run) { return run->aggregate_id; }
