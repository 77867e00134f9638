/* pipeline_int.h - private interface of the pipeline engine
 *
 * DESIGN: the node types are a table (nodes.c); each type lives in src/pipeline/node_<type>.c
 * and exports one obx_node_type_t. Adding a type is that file plus one table entry. A node's
 * run function receives its config with templates already rendered and writes its output
 * into a document; effects on the database go to the run (obx_pipeline_run_t) and are
 * written by obx_pipeline_run_commit. A node that calls out (http-request) leaves its call
 * waiting (obx_node_wait_t) and the run stops there until the caller resumes it. */
#ifndef OBX_PIPELINE_INT_H
#define OBX_PIPELINE_INT_H

#include <stdatomic.h>

#include "obx/obx_pipeline.h"

typedef struct obx_node_type obx_node_type_t;

/* Zeroed heap memory for n objects of a type that holds a bson_t (aligned to 128 bytes, more
 * than malloc guarantees). Free with free(). */
void *obx_pipeline_calloc_aligned(size_t n, size_t size);

typedef struct {
  char *id;
  const obx_node_type_t *type;
  bson_t config;          /* owned copy; {} when absent */
  bool on_error_continue; /* onError: "continue" */
} obx_pipeline_node_t;

typedef struct {
  int from, to;  /* node indexes */
  char *branch;  /* NULL: every outcome but "failure" */
} obx_pipeline_edge_t;

struct obx_pipeline {
  bson_t doc;
  char *id, *name, *org_id, *trigger;
  int32_t version;
  bool enabled;
  obx_pipeline_node_t *nodes;
  int nnodes;
  obx_pipeline_edge_t *edges;
  int nedges;
  int start;
  atomic_int refs; /* holders (obx_pipeline_ref); the last obx_pipeline_destroy frees */
};

/* A call a node left waiting: the engine hands its transfer out (obx_pipeline_run_waiting) and,
 * once it ended, calls finish with its result (obx_pipeline_resume). */
typedef struct obx_node_wait obx_node_wait_t;
struct obx_node_wait {
  CURL *handle;
  /* Ends the node as run would have: fills output and *outcome, or err; frees the wait. */
  bool (*finish)(obx_node_wait_t *wait, CURLcode rc, bson_t *output, const char **outcome, obx_err_t *err);
};

/* What a node sees while it runs. */
typedef struct {
  const obx_pipeline_t *pipeline;
  const obx_pipeline_node_t *node;
  const obx_pipeline_input_t *input;
  const obx_egress_t *egress;
  obx_pipeline_run_t *run;
  const bson_t *steps;  /* outputs of the nodes already run: { <nodeId>: { output: ... } } */
  obx_node_wait_t *wait; /* set by a node that returns true with its call waiting (no outcome yet) */
} obx_node_ctx_t;

struct obx_node_type {
  const char *name;
  /* Outcomes the node can end with besides "failure"; edges may only name these or "failure". */
  const char *const *outcomes;
  /* Checks the config at save time (templates not rendered); err names the field. NULL: any. */
  bool (*validate)(const bson_t *config, obx_err_t *err);
  /* Runs with the rendered config; output is initialised (bson_init) by the caller; *outcome
   * must be set to one of `outcomes` on success (static string). On failure err is set and
   * its `retriable` gives the failure class. A node that calls out sets ctx->wait instead of
   * *outcome and returns true: its wait's finish ends it (the run waits meanwhile). */
  bool (*run)(obx_node_ctx_t *ctx, const bson_t *config, bson_t *output, const char **outcome, obx_err_t *err);
};

extern const char *const obx_node_outcomes_success[];

/* nodes.c */
const obx_node_type_t *obx_node_type_find(const char *name);

/* template.c: syntax check of every string in a document (names the field in err). */
bool obx_template_check_doc(const bson_t *doc, obx_err_t *err);
/* Renders every string value of `in` into `out` (initialised by the caller). */
bool obx_template_render_doc(const bson_t *in, const bson_t *context, const bson_t *steps, bson_t *out,
                             obx_err_t *err);
/* Looks a dotted path up in context (or steps for "steps.<...>"); false when missing. */
bool obx_template_lookup(const bson_t *context, const bson_t *steps, const char *path, bson_iter_t *value);

/* json.c: writes a BSON value / document as plain JSON (Decimal128 as a number, dates as RFC
 * 3339 strings, ObjectIds as hex strings). */
void obx_json_append_value(bson_string_t *out, const bson_iter_t *iter);
void obx_json_append_doc(bson_string_t *out, const bson_t *doc, bool array);
/* A value as text for interpolation: strings raw, everything else as JSON. */
void obx_json_append_text(bson_string_t *out, const bson_iter_t *iter);
/* Numeric view of int32/int64/double/decimal128 values; false for other types. */
bool obx_json_number(const bson_iter_t *iter, double *out);

/* config helpers shared by the node files */
const char *obx_node_config_str(const bson_t *config, const char *key);
/* True when config[key] is a non-empty string; else err names the field. */
bool obx_node_config_require_str(const bson_t *config, const char *key, obx_err_t *err);

/* engine.c: effects of a run */
void obx_pipeline_run_add_status(obx_pipeline_run_t *run, const char *status_tag, const char *name,
                                 const char *phase);
/* Appends a copy of ev (ev stays the caller's). */
void obx_pipeline_run_add_event(obx_pipeline_run_t *run, obx_event_t *ev);
/* The run input's org and aggregate ids (borrowed). */
const char *obx_pipeline_run_org_id(const obx_pipeline_run_t *run);
const char *obx_pipeline_run_aggregate_id(const obx_pipeline_run_t *run);

#endif
