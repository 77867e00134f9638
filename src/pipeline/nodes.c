/* nodes.c - the table of node types
 *
 * DESIGN: one entry per type; each type is defined in its own node_<type>.c. Adding a node
 * type is that file plus one line here. */
#include "pipeline_int.h"

#include <stdlib.h>
#include <string.h>

extern const obx_node_type_t obx_node_start;
extern const obx_node_type_t obx_node_http_request;
extern const obx_node_type_t obx_node_set_status;
extern const obx_node_type_t obx_node_emit_event;
extern const obx_node_type_t obx_node_condition;
extern const obx_node_type_t obx_node_log;

static const obx_node_type_t *const node_types[] = {
  &obx_node_start, &obx_node_http_request, &obx_node_set_status,
  &obx_node_emit_event, &obx_node_condition, &obx_node_log,
};

const char *const obx_node_outcomes_success[] = {"success", NULL};

const obx_node_type_t *obx_node_type_find(const char *name) {
  for (size_t i = 0; i < sizeof node_types / sizeof node_types[0]; i++)
    if (strcmp(node_types[i]->name, name) == 0) return node_types[i];
  return NULL;
}

const char *obx_node_config_str(const bson_t *config, const char *key) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, config, key) && BSON_ITER_HOLDS_UTF8(&it)) return bson_iter_utf8(&it, NULL);
  return NULL;
}

bool obx_node_config_require_str(const bson_t *config, const char *key, obx_err_t *err) {
  const char *value = obx_node_config_str(config, key);
  if (value && *value) return true;
  obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "config.%s: required (a non-empty string)", key);
  return false;
}

void *obx_pipeline_calloc_aligned(size_t n, size_t size) {
  size_t align = _Alignof(bson_t), bytes = n * size;
  bytes = (bytes + align - 1) / align * align;
  void *p = aligned_alloc(align, bytes ? bytes : align);
  if (!p) abort();
  memset(p, 0, bytes ? bytes : align);
  return p;
}
