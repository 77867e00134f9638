/* definition.c - parsing and validation of pipeline definitions
 *
 * DESIGN: obx_pipeline_parse turns a definition document into an immutable obx_pipeline_t
 * and is the one place definitions are validated (on save, at load, before a run). Every
 * error message names what is wrong: `node "notify": ...`, `edge 2 (notify -> ok): ...`.
 * Checks, in order: no key anywhere starting with "$" or "." (MongoDB could not store or
 * update the definition: refused naming the key's path), top-level fields, nodes (id, unique id, known type, onError, config via
 * the type's validate, templates), exactly one start node, edges (known endpoints, branch
 * allowed for the source node's type, nothing into start), no cycle. Nodes that cannot be
 * reached from start are accepted (they never run). */
#include "pipeline_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_json.h"

static bool fail(obx_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(obx_err_t *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  obx_err_vset(err, OBX_ERR_PIPELINE, 0, false, fmt, ap);
  va_end(ap);
  return false;
}

bool obx_pipeline_trigger_valid(const char *trigger) {
  if (!trigger) return false;
  if (strcmp(trigger, "order.pre") == 0 || strcmp(trigger, "order.post") == 0) return true;
  if (strncmp(trigger, "event.", 6) != 0 || !trigger[6]) return false;
  for (const char *p = trigger + 6; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.') return false;
  return true;
}

const char *obx_pipeline_trigger_for_event(const char *event_type, char *out, size_t outlen) {
  if (strcmp(event_type, "OrderConfirmed") == 0)
    snprintf(out, outlen, "order.post");
  else
    snprintf(out, outlen, "event.%s", event_type);
  return out;
}

/* Optional string field: absent is fine; present must be a string. */
static bool opt_str(const bson_t *doc, const char *key, char **out, obx_err_t *err) {
  bson_iter_t it;
  *out = NULL;
  if (!bson_iter_init_find(&it, doc, key) || BSON_ITER_HOLDS_NULL(&it)) return true;
  if (!BSON_ITER_HOLDS_UTF8(&it)) return fail(err, "\"%s\" must be a string", key);
  *out = bson_strdup(bson_iter_utf8(&it, NULL));
  return true;
}

static int node_index(const obx_pipeline_t *pipeline, const char *id) {
  for (int i = 0; i < pipeline->nnodes; i++)
    if (pipeline->nodes[i].id && strcmp(pipeline->nodes[i].id, id) == 0) return i;
  return -1;
}

static bool parse_node(obx_pipeline_t *pipeline, int i, bson_iter_t *it, obx_err_t *err) {
  obx_pipeline_node_t *node = &pipeline->nodes[i];
  bson_init(&node->config);
  if (!BSON_ITER_HOLDS_DOCUMENT(it)) return fail(err, "node %d: must be an object", i);
  bson_iter_t f;
  if (!bson_iter_recurse(it, &f) || !bson_iter_find(&f, "id") || !BSON_ITER_HOLDS_UTF8(&f) ||
      !*bson_iter_utf8(&f, NULL))
    return fail(err, "node %d: \"id\" must be a non-empty string", i);
  const char *id = bson_iter_utf8(&f, NULL);
  for (const char *p = id; *p; p++) /* ids are path segments of steps.<id>.output... */
    if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-')
      return fail(err, "node \"%s\": id may hold letters, digits, '_' and '-' only", id);
  if (node_index(pipeline, id) >= 0) return fail(err, "node \"%s\": duplicate node id", id);
  node->id = bson_strdup(id);

  bson_iter_recurse(it, &f);
  if (!bson_iter_find(&f, "type") || !BSON_ITER_HOLDS_UTF8(&f))
    return fail(err, "node \"%s\": \"type\" must be a string", id);
  node->type = obx_node_type_find(bson_iter_utf8(&f, NULL));
  if (!node->type) return fail(err, "node \"%s\": unknown type \"%s\"", id, bson_iter_utf8(&f, NULL));

  bson_iter_recurse(it, &f);
  if (bson_iter_find(&f, "onError") && !BSON_ITER_HOLDS_NULL(&f)) {
    const char *on_error = BSON_ITER_HOLDS_UTF8(&f) ? bson_iter_utf8(&f, NULL) : "";
    if (strcmp(on_error, "continue") == 0)
      node->on_error_continue = true;
    else if (strcmp(on_error, "abort") != 0)
      return fail(err, "node \"%s\": onError must be \"abort\" or \"continue\"", id);
  }

  bson_iter_recurse(it, &f);
  if (bson_iter_find(&f, "config") && !BSON_ITER_HOLDS_NULL(&f)) {
    const uint8_t *data;
    uint32_t len;
    bson_t view;
    if (!BSON_ITER_HOLDS_DOCUMENT(&f)) return fail(err, "node \"%s\": \"config\" must be an object", id);
    bson_iter_document(&f, &len, &data);
    if (!bson_init_static(&view, data, len)) return fail(err, "node \"%s\": corrupt config", id);
    bson_destroy(&node->config);
    bson_copy_to(&view, &node->config);
  }
  obx_err_t cerr = OBX_ERR_INIT;
  if (!obx_template_check_doc(&node->config, &cerr) ||
      (node->type->validate && !node->type->validate(&node->config, &cerr)))
    return fail(err, "node \"%s\" (%s): %s", id, node->type->name, cerr.msg);
  return true;
}

static bool outcome_allowed(const obx_node_type_t *type, const char *branch) {
  if (strcmp(branch, "failure") == 0) return true;
  for (const char *const *o = type->outcomes; *o; o++)
    if (strcmp(*o, branch) == 0) return true;
  return false;
}

static bool parse_edge(obx_pipeline_t *pipeline, int i, bson_iter_t *it, obx_err_t *err) {
  obx_pipeline_edge_t *edge = &pipeline->edges[i];
  edge->from = edge->to = -1;
  if (!BSON_ITER_HOLDS_DOCUMENT(it)) return fail(err, "edge %d: must be an object", i);
  bson_t doc;
  const uint8_t *data;
  uint32_t len;
  bson_iter_document(it, &len, &data);
  if (!bson_init_static(&doc, data, len)) return fail(err, "edge %d: corrupt", i);
  char *from = NULL, *to = NULL;
  bool ok = false;
  obx_err_t ferr = OBX_ERR_INIT;
  if (!opt_str(&doc, "from", &from, &ferr) || !opt_str(&doc, "to", &to, &ferr) ||
      !opt_str(&doc, "branch", &edge->branch, &ferr)) {
    fail(err, "edge %d: %s", i, ferr.msg);
    goto done;
  }
  const char *f = from ? from : "?", *t = to ? to : "?";
  if (!from || !to) {
    fail(err, "edge %d (%s -> %s): \"from\" and \"to\" are required", i, f, t);
    goto done;
  }
  edge->from = node_index(pipeline, from);
  edge->to = node_index(pipeline, to);
  if (edge->from < 0) {
    fail(err, "edge %d (%s -> %s): unknown node \"%s\"", i, f, t, from);
    goto done;
  }
  if (edge->to < 0) {
    fail(err, "edge %d (%s -> %s): unknown node \"%s\"", i, f, t, to);
    goto done;
  }
  if (edge->to == pipeline->start) {
    fail(err, "edge %d (%s -> %s): the start node cannot have incoming edges", i, f, t);
    goto done;
  }
  const obx_node_type_t *type = pipeline->nodes[edge->from].type;
  if (edge->branch && !outcome_allowed(type, edge->branch)) {
    bson_string_t *allowed = bson_string_new("");
    for (const char *const *o = type->outcomes; *o; o++) bson_string_append_printf(allowed, "\"%s\", ", *o);
    fail(err, "edge %d (%s -> %s): branch \"%s\" is not an outcome of a %s node (%s\"failure\")", i, f, t,
         edge->branch, type->name, allowed->str);
    bson_string_free(allowed, true);
    goto done;
  }
  ok = true;
done:
  bson_free(from);
  bson_free(to);
  return ok;
}

/* Depth-first search; state 0 new, 1 on the stack, 2 done. */
static int find_cycle(const obx_pipeline_t *pipeline, int n, char *state) {
  state[n] = 1;
  for (int e = 0; e < pipeline->nedges; e++) {
    if (pipeline->edges[e].from != n) continue;
    int to = pipeline->edges[e].to;
    if (state[to] == 1) return e;
    if (state[to] == 0) {
      int found = find_cycle(pipeline, to, state);
      if (found >= 0) return found;
    }
  }
  state[n] = 2;
  return -1;
}

static bool parse_graph(obx_pipeline_t *pipeline, obx_err_t *err) {
  bson_iter_t it, arr;
  if (!bson_iter_init_find(&it, &pipeline->doc, "nodes") || !BSON_ITER_HOLDS_ARRAY(&it))
    return fail(err, "\"nodes\" must be an array");
  uint32_t count = 0;
  bson_iter_recurse(&it, &arr);
  while (bson_iter_next(&arr)) count++;
  if (count == 0) return fail(err, "\"nodes\" is empty: a start node is required");
  pipeline->nodes = obx_pipeline_calloc_aligned(count, sizeof *pipeline->nodes);
  bson_iter_recurse(&it, &arr);
  while (bson_iter_next(&arr)) {
    int i = pipeline->nnodes++;
    if (!parse_node(pipeline, i, &arr, err)) return false;
  }

  pipeline->start = -1;
  for (int i = 0; i < pipeline->nnodes; i++) {
    if (strcmp(pipeline->nodes[i].type->name, "start") != 0) continue;
    if (pipeline->start >= 0)
      return fail(err, "node \"%s\": second start node (\"%s\" is already the start)", pipeline->nodes[i].id,
                  pipeline->nodes[pipeline->start].id);
    pipeline->start = i;
  }
  if (pipeline->start < 0) return fail(err, "no node of type \"start\"");

  if (bson_iter_init_find(&it, &pipeline->doc, "edges") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (!BSON_ITER_HOLDS_ARRAY(&it)) return fail(err, "\"edges\" must be an array");
    count = 0;
    bson_iter_recurse(&it, &arr);
    while (bson_iter_next(&arr)) count++;
    pipeline->edges = bson_malloc0((count ? count : 1) * sizeof *pipeline->edges);
    bson_iter_recurse(&it, &arr);
    while (bson_iter_next(&arr)) {
      int i = pipeline->nedges++;
      if (!parse_edge(pipeline, i, &arr, err)) return false;
    }
  }

  char *state = bson_malloc0((size_t)pipeline->nnodes);
  int cycle = -1;
  for (int i = 0; i < pipeline->nnodes && cycle < 0; i++)
    if (!state[i]) cycle = find_cycle(pipeline, i, state);
  bson_free(state);
  if (cycle >= 0) {
    const obx_pipeline_edge_t *e = &pipeline->edges[cycle];
    return fail(err, "edge %d (%s -> %s): closes a cycle", cycle, pipeline->nodes[e->from].id,
                pipeline->nodes[e->to].id);
  }
  return true;
}

static bool parse_top(obx_pipeline_t *pipeline, obx_err_t *err) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, &pipeline->doc, "_id")) {
    if (!BSON_ITER_HOLDS_UTF8(&it)) return fail(err, "\"_id\" must be a string");
    pipeline->id = bson_strdup(bson_iter_utf8(&it, NULL));
  }
  if (!opt_str(&pipeline->doc, "name", &pipeline->name, err) ||
      !opt_str(&pipeline->doc, "orgId", &pipeline->org_id, err) ||
      !opt_str(&pipeline->doc, "trigger", &pipeline->trigger, err))
    return false;
  if (pipeline->trigger && !obx_pipeline_trigger_valid(pipeline->trigger))
    return fail(err, "trigger \"%s\": must be order.pre, order.post or event.<Type>", pipeline->trigger);
  pipeline->enabled = true;
  if (bson_iter_init_find(&it, &pipeline->doc, "enabled") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (!BSON_ITER_HOLDS_BOOL(&it)) return fail(err, "\"enabled\" must be true or false");
    pipeline->enabled = bson_iter_bool(&it);
  }
  pipeline->version = 1;
  if (bson_iter_init_find(&it, &pipeline->doc, "version") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (!BSON_ITER_HOLDS_INT(&it) || bson_iter_as_int64(&it) < 1 || bson_iter_as_int64(&it) > INT32_MAX)
      return fail(err, "\"version\" must be a positive integer");
    pipeline->version = (int32_t)bson_iter_as_int64(&it);
  }
  return true;
}

/* Every key of doc and of its sub-documents and arrays; the first one starting with '$' or '.'
 * fails as `key "nodes.1.config.$where": ...` (path: the dotted keys and array indexes). */
static bool check_keys(const bson_t *doc, const char *path, obx_err_t *err) {
  bson_iter_t it;
  if (!bson_iter_init(&it, doc)) return fail(err, "the definition is not a valid document");
  while (bson_iter_next(&it)) {
    const char *key = bson_iter_key(&it);
    char sub_path[512];
    snprintf(sub_path, sizeof sub_path, "%s%s%s", path, *path ? "." : "", key);
    if (key[0] == '$' || key[0] == '.')
      return fail(err, "key \"%s\": keys may not start with \"$\" or \".\"", sub_path);
    if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
      const uint8_t *data;
      uint32_t len;
      bson_t sub;
      if (BSON_ITER_HOLDS_DOCUMENT(&it)) bson_iter_document(&it, &len, &data);
      else bson_iter_array(&it, &len, &data);
      if (!bson_init_static(&sub, data, len) || !check_keys(&sub, sub_path, err)) return false;
    }
  }
  return true;
}

bool obx_pipeline_parse(const bson_t *doc, obx_pipeline_t **out, obx_err_t *err) {
  obx_pipeline_t *pipeline = obx_pipeline_calloc_aligned(1, sizeof *pipeline);
  atomic_init(&pipeline->refs, 1);
  bson_copy_to(doc, &pipeline->doc);
  *out = NULL;
  if (!check_keys(&pipeline->doc, "", err) || !parse_top(pipeline, err) || !parse_graph(pipeline, err)) {
    obx_pipeline_destroy(pipeline);
    return false;
  }
  *out = pipeline;
  return true;
}

bool obx_pipeline_parse_json(const char *json, obx_pipeline_t **out, obx_err_t *err) {
  obx_err_t jerr = OBX_ERR_INIT;
  bson_t doc;
  *out = NULL;
  bool ok = obx_json_parse(json, strlen(json), &doc, &jerr) ? obx_pipeline_parse(&doc, out, err)
                                                            : fail(err, "not a JSON object: %s", jerr.msg);
  bson_destroy(&doc);
  return ok;
}

obx_pipeline_t *obx_pipeline_ref(obx_pipeline_t *pipeline) {
  atomic_fetch_add(&pipeline->refs, 1);
  return pipeline;
}

void obx_pipeline_destroy(obx_pipeline_t *pipeline) {
  if (!pipeline || atomic_fetch_sub(&pipeline->refs, 1) > 1) return;
  for (int i = 0; i < pipeline->nedges; i++) bson_free(pipeline->edges[i].branch);
  bson_free(pipeline->edges);
  for (int i = 0; i < pipeline->nnodes; i++) {
    bson_free(pipeline->nodes[i].id);
    bson_destroy(&pipeline->nodes[i].config);
  }
  free(pipeline->nodes);
  bson_free(pipeline->id);
  bson_free(pipeline->name);
  bson_free(pipeline->org_id);
  bson_free(pipeline->trigger);
  bson_destroy(&pipeline->doc);
  free(pipeline);
}

const char *obx_pipeline_id(const obx_pipeline_t *pipeline) { return pipeline->id; }
const char *obx_pipeline_name(const obx_pipeline_t *pipeline) { return pipeline->name; }
const char *obx_pipeline_org_id(const obx_pipeline_t *pipeline) { return pipeline->org_id; }
const char *obx_pipeline_trigger(const obx_pipeline_t *pipeline) { return pipeline->trigger; }
int32_t obx_pipeline_version(const obx_pipeline_t *pipeline) { return pipeline->version; }
bool obx_pipeline_enabled(const obx_pipeline_t *pipeline) { return pipeline->enabled; }
