/* node_log.c - writes a templated message to the daemon's log
 *
 * DESIGN: config { message, level: debug|info|warn|error (info) }. The line carries the
 * event id, correlation id, pipeline and node ids; the output records the message. */
#include "pipeline_int.h"

#include <string.h>

#include "obx/obx_log.h"

static bool log_validate(const bson_t *config, obx_err_t *err) {
  if (!obx_node_config_require_str(config, "message", err)) return false;
  const char *level = obx_node_config_str(config, "level");
  obx_log_level_t parsed;
  if (level && (!obx_log_level_parse(level, &parsed) || parsed == OBX_LOG_OFF)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.level: \"%s\" (want debug, info, warn or error)", level);
    return false;
  }
  return true;
}

static bool log_run(obx_node_ctx_t *ctx, const bson_t *config, bson_t *output, const char **outcome,
                    obx_err_t *err) {
  const char *message = obx_node_config_str(config, "message");
  const char *level_name = obx_node_config_str(config, "level");
  obx_log_level_t level = OBX_LOG_INFO;
  if (level_name) obx_log_level_parse(level_name, &level);
  if (!message) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.message: must render to a string");
    return false;
  }
  if (obx_log_enabled(level)) {
    obx_log_field_t fields[] = {
      {"eventId", ctx->input->event_id},
      {"correlationId", ctx->input->correlation_id},
      {"pipelineId", ctx->pipeline->id},
      {"nodeId", ctx->node->id},
    };
    obx_log_write(level, fields, 4, "%s", message);
  }
  BSON_APPEND_UTF8(output, "message", message);
  *outcome = "success";
  return true;
}

const obx_node_type_t obx_node_log = {"log", obx_node_outcomes_success, log_validate, log_run};
