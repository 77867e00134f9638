/* engine.c - runs a pipeline graph and builds its pipeline_executions document
 *
 * DESIGN: phase 1 of a run (see obx_pipeline.h): breadth-first from the start node, each
 * node at most once, following the edges that match the node's outcome. Each step renders
 * its config against the context and the outputs of earlier steps, runs the node type and is
 * recorded as { nodeId, type, status, startedAt, durationMs, output | error, failureClass }.
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

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

/* Runs node n; appends its step document to steps (key `index`) and its output to outputs.
 * Returns the outcome ("failure" when the node failed; err then set). */
static const char *run_step(obx_node_ctx_t *ctx, int n, bson_t *steps, uint32_t index, bson_t *outputs,
                            obx_err_t *err) {
  const obx_pipeline_node_t *node = &ctx->pipeline->nodes[n];
  ctx->node = node;
  int64_t started_at = obx_time_now_ms(), t0 = mono_ms();
  bson_t rendered = BSON_INITIALIZER, output = BSON_INITIALIZER;
  const char *outcome = NULL;
  obx_err_clear(err);
  char span_name[300];
  snprintf(span_name, sizeof span_name, "step %s", node->id);
  obx_trace_ctx_t outer = {0};
  if (obx_trace_current()) outer = *obx_trace_current();
  obx_span_t *span = obx_span_start(span_name, OBX_SPAN_INTERNAL, &outer);
  obx_span_set_str(span, "outboxd.step.id", node->id);
  obx_span_set_str(span, "outboxd.step.type", node->type->name);
  obx_trace_set_current(obx_span_ctx(span));
  bool ok = obx_template_render_doc(&node->config, ctx->input->context, outputs, &rendered, err) &&
            node->type->run(ctx, &rendered, &output, &outcome, err);
  obx_trace_set_current(&outer);
  if (ok) obx_span_set_str(span, "outboxd.step.outcome", outcome);
  else obx_span_set_error(span, err->msg);
  obx_span_end(span);
  int64_t duration = mono_ms() - t0;
  assert(!ok || outcome); /* a node type that succeeds names its outcome */

  char key[16];
  const char *keyp;
  bson_t step, out_entry;
  bson_uint32_to_string(index, &keyp, key, sizeof key);
  bson_append_document_begin(steps, keyp, -1, &step);
  BSON_APPEND_UTF8(&step, "nodeId", node->id);
  BSON_APPEND_UTF8(&step, "type", node->type->name);
  BSON_APPEND_UTF8(&step, "status", ok ? "SUCCEEDED" : "FAILED");
  BSON_APPEND_DATE_TIME(&step, "startedAt", started_at);
  BSON_APPEND_INT64(&step, "durationMs", duration);
  if (ok) {
    BSON_APPEND_UTF8(&step, "outcome", outcome);
    append_bounded_output(&step, &output);
  } else {
    BSON_APPEND_UTF8(&step, "error", err->msg);
    BSON_APPEND_UTF8(&step, "failureClass", obx_failure_class_name(class_of(err)));
  }
  bson_append_document_end(steps, &step);
  obx_counter_inc(steps_total, node->type->name, ok ? "SUCCEEDED" : "FAILED");

  bson_append_document_begin(outputs, node->id, -1, &out_entry);
  BSON_APPEND_UTF8(&out_entry, "status", ok ? "SUCCEEDED" : "FAILED");
  BSON_APPEND_DOCUMENT(&out_entry, "output", &output);
  if (!ok) BSON_APPEND_UTF8(&out_entry, "error", err->msg);
  bson_append_document_end(outputs, &out_entry);

  bson_destroy(&output);
  bson_destroy(&rendered);
  if (!ok) {
    obx_err_prefix(err, "node \"%s\"", node->id);
    return "failure";
  }
  return outcome;
}

/* Walks the graph; fills steps and the run's status. */
static void walk(obx_pipeline_run_t *run, const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input,
                 const obx_egress_t *egress, bson_t *steps) {
  bson_t outputs = BSON_INITIALIZER;
  int *queue = bson_malloc((size_t)pipeline->nnodes * sizeof *queue);
  bool *queued = bson_malloc0((size_t)pipeline->nnodes * sizeof *queued);
  int head = 0, tail = 0;
  uint32_t nsteps = 0;
  obx_node_ctx_t ctx = {.pipeline = pipeline, .input = input, .egress = egress, .run = run, .steps = &outputs};
  queue[tail++] = pipeline->start;
  queued[pipeline->start] = true;
  run->status = OBX_PIPELINE_SUCCEEDED;
  while (head < tail) {
    int n = queue[head++];
    obx_err_t err = OBX_ERR_INIT;
    const char *outcome = run_step(&ctx, n, steps, nsteps++, &outputs, &err);
    if (strcmp(outcome, "failure") == 0 && !pipeline->nodes[n].on_error_continue) {
      run->status = OBX_PIPELINE_FAILED;
      run->failure_class = class_of(&err);
      run->err = err;
      break;
    }
    const char *follow = branch_to_follow(pipeline, n, outcome);
    for (int e = 0; e < pipeline->nedges; e++) {
      const obx_pipeline_edge_t *edge = &pipeline->edges[e];
      if (edge->from != n || queued[edge->to] || !edge_taken(edge, follow)) continue;
      queued[edge->to] = true;
      queue[tail++] = edge->to;
    }
  }
  bson_free(queued);
  bson_free(queue);
  bson_destroy(&outputs);
}

obx_pipeline_run_t *obx_pipeline_execute(const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input,
                                         const obx_egress_t *egress) {
  pthread_once(&metrics_once, metrics_init);
  obx_pipeline_run_t *run = obx_pipeline_calloc_aligned(1, sizeof *run);
  obx_uuid7(run->id);
  bson_init(&run->execution);
  bson_init(&run->statuses);
  run->pipeline_id = bson_strdup(pipeline->id);
  run->org_id = bson_strdup(input->org_id);
  run->aggregate_type = bson_strdup(input->aggregate_type);
  run->aggregate_id = bson_strdup(input->aggregate_id);
  const char *trigger = input->trigger ? input->trigger : pipeline->trigger;
  int64_t started_at = obx_time_now_ms(), t0 = mono_ms();

  char span_name[200];
  snprintf(span_name, sizeof span_name, "pipeline %s", trigger ? trigger : "none");
  obx_trace_ctx_t outer = {0};
  if (obx_trace_current()) outer = *obx_trace_current();
  obx_span_t *span = obx_span_start(span_name, OBX_SPAN_INTERNAL, &outer);
  obx_span_set_str(span, "outboxd.pipeline.id", pipeline->id);
  obx_span_set_str(span, "outboxd.pipeline.name", pipeline->name);
  obx_span_set_str(span, "outboxd.trigger", trigger);
  obx_span_set_str(span, "outboxd.event.id", input->event_id);
  obx_span_set_str(span, "outboxd.execution.id", run->id);
  obx_span_set_int(span, "outboxd.attempt", input->attempt > 0 ? input->attempt : 1);
  obx_trace_set_current(obx_span_ctx(span));
  bson_t steps = BSON_INITIALIZER;
  if (pipeline->enabled)
    walk(run, pipeline, input, egress, &steps);
  else
    run->status = OBX_PIPELINE_SKIPPED;
  obx_trace_set_current(&outer);
  obx_span_set_str(span, "outboxd.pipeline.status", obx_pipeline_status_name(run->status));
  if (run->status == OBX_PIPELINE_FAILED) obx_span_set_error(span, run->err.msg);
  char trace_hex[OBX_TRACE_ID_HEX + 1], span_hex[OBX_SPAN_ID_HEX + 1];
  obx_trace_ids_hex(obx_span_ctx(span), trace_hex, span_hex);
  obx_span_end(span);

  bson_t *doc = &run->execution;
  BSON_APPEND_UTF8(doc, "_id", run->id);
  append_str_or_null(doc, "pipelineId", pipeline->id);
  BSON_APPEND_INT32(doc, "pipelineVersion", pipeline->version);
  append_str_or_null(doc, "pipelineName", pipeline->name);
  append_str_or_null(doc, "orgId", input->org_id);
  append_str_or_null(doc, "trigger", trigger);
  append_str_or_null(doc, "eventId", input->event_id);
  append_str_or_null(doc, "correlationId", input->correlation_id);
  append_str_or_null(doc, "aggregateId", input->aggregate_id);
  BSON_APPEND_INT32(doc, "attempt", input->attempt > 0 ? input->attempt : 1);
  BSON_APPEND_UTF8(doc, "status", obx_pipeline_status_name(run->status));
  append_str_or_null(doc, "failureClass", obx_failure_class_name(run->failure_class));
  append_str_or_null(doc, "error", run->status == OBX_PIPELINE_FAILED ? run->err.msg : NULL);
  BSON_APPEND_DATE_TIME(doc, "startedAt", started_at);
  int64_t duration = mono_ms() - t0;
  BSON_APPEND_DATE_TIME(doc, "finishedAt", obx_time_now_ms());
  BSON_APPEND_INT64(doc, "durationMs", duration);
  BSON_APPEND_ARRAY(doc, "steps", &steps);
  BSON_APPEND_UTF8(doc, "traceId", trace_hex);
  BSON_APPEND_UTF8(doc, "spanId", span_hex);
  bson_destroy(&steps);
  obx_counter_inc(runs_total, trigger ? trigger : "none", obx_pipeline_status_name(run->status));
  obx_histogram_observe(run_seconds, (double)duration / 1000.0, trigger ? trigger : "none");
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
