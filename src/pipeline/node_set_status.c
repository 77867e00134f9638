/* node_set_status.c - records a status on the order the run is about
 *
 * DESIGN: config { statusTag, name, phase (default: the run's trigger) }. The entry
 * { statusTag, name, phase, at, pipelineId, executionId } is collected by the run and written
 * by obx_pipeline_run_commit inside the run's transaction: pushed to orders.statusHistory and
 * set as orders.pipelineStatus. Needs a run about an Order (input aggregate). */
#include "pipeline_int.h"

#include <string.h>

static bool set_status_validate(const bson_t *config, obx_err_t *err) {
  return obx_node_config_require_str(config, "statusTag", err) && obx_node_config_require_str(config, "name", err);
}

static bool set_status_run(obx_node_ctx_t *ctx, const bson_t *config, bson_t *output, const char **outcome,
                           obx_err_t *err) {
  const char *tag = obx_node_config_str(config, "statusTag");
  const char *name = obx_node_config_str(config, "name");
  const char *phase = obx_node_config_str(config, "phase");
  const char *agg_type = ctx->input->aggregate_type;
  if (!tag || !name) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.statusTag and config.name must render to strings");
    return false;
  }
  if (!ctx->input->aggregate_id || (agg_type && strcmp(agg_type, "Order") != 0)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "set-status needs a run about an Order (aggregate %s/%s)",
                agg_type ? agg_type : "-", ctx->input->aggregate_id ? ctx->input->aggregate_id : "-");
    return false;
  }
  if (!phase) phase = ctx->input->trigger ? ctx->input->trigger : ctx->pipeline->trigger;
  obx_pipeline_run_add_status(ctx->run, tag, name, phase);
  BSON_APPEND_UTF8(output, "statusTag", tag);
  BSON_APPEND_UTF8(output, "name", name);
  if (phase) BSON_APPEND_UTF8(output, "phase", phase);
  *outcome = "success";
  return true;
}

const obx_node_type_t obx_node_set_status = {"set-status", obx_node_outcomes_success, set_status_validate,
                                             set_status_run};
