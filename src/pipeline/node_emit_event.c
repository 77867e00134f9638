/* node_emit_event.c - emits a new domain event through the outbox
 *
 * DESIGN: config { eventType, payload (object, templated; default {}), eventVersion (1) }.
 * The event is collected by the run and appended to the outbox by obx_pipeline_run_commit in
 * the same transaction as the run's tracking (and, for order.pre, as the order). Envelope:
 * orgId, aggregateType/aggregateId and partitionKey of the run (the order's key), the
 * correlationId propagated (or the triggering event id), causationId = the triggering event,
 * traceparent = the step's span (the relay and the worker continue the same trace). */
#include "pipeline_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_trace.h"

static bool type_name_valid(const char *s) {
  if (!s || !*s) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.') return false;
  return true;
}

static bool emit_validate(const bson_t *config, obx_err_t *err) {
  if (!obx_node_config_require_str(config, "eventType", err)) return false;
  const char *type = obx_node_config_str(config, "eventType");
  if (!strstr(type, "{{") && !type_name_valid(type)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.eventType: \"%s\" (letters, digits, '_', '-', '.')", type);
    return false;
  }
  bson_iter_t it;
  if (bson_iter_init_find(&it, config, "payload") && !BSON_ITER_HOLDS_DOCUMENT(&it) &&
      !(BSON_ITER_HOLDS_UTF8(&it) && strstr(bson_iter_utf8(&it, NULL), "{{"))) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.payload: must be an object (or one {{template}})");
    return false;
  }
  if (bson_iter_init_find(&it, config, "eventVersion") &&
      (!BSON_ITER_HOLDS_INT(&it) || bson_iter_as_int64(&it) < 1 || bson_iter_as_int64(&it) > INT32_MAX)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.eventVersion: must be a positive integer");
    return false;
  }
  return true;
}

static bool emit_run(obx_node_ctx_t *ctx, const bson_t *config, bson_t *output, const char **outcome,
                     obx_err_t *err) {
  const obx_pipeline_input_t *in = ctx->input;
  const char *type = obx_node_config_str(config, "eventType");
  bson_iter_t it;
  bool ok = false;
  obx_event_t ev;
  obx_event_init(&ev);
  if (!type_name_valid(type)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.eventType: must render to an event type name");
    goto done;
  }
  if (bson_iter_init_find(&it, config, "payload")) {
    const uint8_t *data;
    uint32_t len;
    bson_t view;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.payload: rendered to a %s, not an object",
                  BSON_ITER_HOLDS_ARRAY(&it) ? "array" : "scalar");
      goto done;
    }
    bson_iter_document(&it, &len, &data);
    if (bson_init_static(&view, data, len)) {
      bson_destroy(&ev.payload);
      bson_copy_to(&view, &ev.payload);
    }
  }
  if (!in->aggregate_id || !in->org_id) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "emit-event needs the run's org and aggregate (none given)");
    goto done;
  }
  /* obx_event_cleanup frees with free(): the fields come from strdup */
  ev.event_type = strdup(type);
  ev.event_version = bson_iter_init_find(&it, config, "eventVersion") ? (int32_t)bson_iter_as_int64(&it) : 1;
  ev.org_id = strdup(in->org_id);
  ev.aggregate_type = strdup(in->aggregate_type ? in->aggregate_type : "Order");
  ev.aggregate_id = strdup(in->aggregate_id);
  ev.partition_key = strdup(in->partition_key ? in->partition_key : in->aggregate_id);
  const char *correlation_id = in->correlation_id ? in->correlation_id : in->event_id;
  if (correlation_id) ev.correlation_id = strdup(correlation_id);
  if (in->event_id) ev.causation_id = strdup(in->event_id);
  const obx_trace_ctx_t *trace = obx_trace_current(); /* the step's span: the new event continues the trace */
  if (trace) {
    char traceparent[OBX_TRACEPARENT_LEN + 1];
    obx_trace_format(trace, traceparent);
    ev.traceparent = strdup(traceparent);
    if (trace->state[0]) ev.tracestate = strdup(trace->state);
  }
  ev.source = strdup("/outboxd/pipelines");
  if (!obx_event_finalize(&ev, err)) goto done;
  BSON_APPEND_UTF8(output, "eventId", ev.id);
  BSON_APPEND_UTF8(output, "eventType", ev.event_type);
  obx_pipeline_run_add_event(ctx->run, &ev);
  *outcome = "success";
  ok = true;
done:
  obx_event_cleanup(&ev);
  return ok;
}

const obx_node_type_t obx_node_emit_event = {"emit-event", obx_node_outcomes_success, emit_validate, emit_run};
