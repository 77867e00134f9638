/* node_start.c - the entry node of every pipeline
 *
 * DESIGN: exactly one per pipeline (checked in definition.c); does nothing, ends "success". */
#include "pipeline_int.h"

static bool start_run(obx_node_ctx_t *ctx, const bson_t *config, bson_t *output, const char **outcome,
                      obx_err_t *err) {
  *outcome = "success";
  return true;
}

const obx_node_type_t obx_node_start = {"start", obx_node_outcomes_success, NULL, start_run};
