/* obx_pipeline.h - the pipeline engine: definitions, runs, execution tracking, egress guard
 *
 * DESIGN: a pipeline is a JSON graph (seeds/000, DESIGN.md §5):
 *   { "name", "orgId", "trigger": "order.pre" | "order.post" | "event.<Type>", "enabled",
 *     "version", "nodes": [{ "id", "type", "config", "onError": "abort" | "continue" }],
 *     "edges": [{ "from", "to", "branch" }] }
 * It is validated when parsed (obx_pipeline_parse): every error names the node or the edge.
 *
 * A run has two phases, so that HTTP calls never happen inside a long transaction:
 *  1. obx_pipeline_execute walks the graph from the start node, performs the HTTP calls and
 *     (or obx_pipeline_start / obx_pipeline_resume, the same walk stopping at each call)
 *     collects the database effects (status entries for the order, emitted events) together
 *     with the pipeline_executions document. It touches no database.
 *  2. obx_pipeline_run_commit writes the effects and the execution document with the caller's
 *     mongoc_client_session_t, i.e. inside the caller's transaction (the API's order
 *     transaction for order.pre, the worker's inbox transaction for order.post / event.*).
 *     Without a session it opens its own transaction, so effects and tracking stay atomic.
 * obx_pipeline_run does both for callers that need nothing in between.
 *
 * Branching: a node ends with an outcome: "success" or "failure" (any node), "true" or
 * "false" (condition). An edge with a branch is followed when the branch equals the outcome;
 * an edge without a branch is followed on every outcome but "failure". A failed node with
 * onError "abort" ends the run FAILED; with "continue" the run follows its "failure" edges
 * (or, when it has none, its unbranched edges) and may still succeed. Each node runs at
 * most once per run (graphs are acyclic).
 *
 * Templates: every string inside a node's config may hold {{path}} references into the run
 * context (the context document given by the caller, plus steps.<nodeId>.output.* of the
 * nodes already run). A string that is exactly one template keeps the JSON type of the
 * value; templates embedded in text are interpolated as text. A missing path is a terminal
 * error naming the path and the node.
 *
 * Failure classes: transient (network, timeout, HTTP 5xx/408/429, Mongo transient errors):
 * a later attempt may succeed; terminal (other 4xx, redirects, oversized responses, egress
 * refusals, templates, validation): retrying cannot help.
 *
 * Thread safety: an obx_pipeline_t is immutable after parsing and may be shared by threads;
 * an obx_pipeline_run_t belongs to one thread. */
#ifndef OBX_PIPELINE_H
#define OBX_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <bson/bson.h>
#include <curl/curl.h>
#include <mongoc/mongoc.h>
#include "obx_conf.h"
#include "obx_err.h"
#include "obx_event.h"
#include "obx_http.h"
#include "obx_mongo.h"

/* ---- definitions ------------------------------------------------------------------------ */

typedef struct obx_pipeline obx_pipeline_t;

/* Parses and validates a definition. `trigger` and `orgId` may be absent here (the seed's
 * bare graph parses); obx_pipeline_store_* require them. On success *out is owned by the
 * caller (obx_pipeline_destroy). Errors are OBX_ERR_PIPELINE, terminal, and name the node or
 * edge: unknown type, missing or duplicate start, duplicate id, dangling edge, bad branch,
 * cycle, bad template, bad config. */
bool obx_pipeline_parse(const bson_t *doc, obx_pipeline_t **out, obx_err_t *err);
bool obx_pipeline_parse_json(const char *json, obx_pipeline_t **out, obx_err_t *err);
/* Another holder of the same (immutable) pipeline; returns it. Every holder calls
 * obx_pipeline_destroy; the last one frees. Thread-safe. */
obx_pipeline_t *obx_pipeline_ref(obx_pipeline_t *pipeline);
void obx_pipeline_destroy(obx_pipeline_t *pipeline);

/* Borrowed until obx_pipeline_destroy; NULL when absent. */
const char *obx_pipeline_id(const obx_pipeline_t *pipeline);
const char *obx_pipeline_name(const obx_pipeline_t *pipeline);
const char *obx_pipeline_org_id(const obx_pipeline_t *pipeline);
const char *obx_pipeline_trigger(const obx_pipeline_t *pipeline);
int32_t obx_pipeline_version(const obx_pipeline_t *pipeline);
bool obx_pipeline_enabled(const obx_pipeline_t *pipeline);

/* "order.pre", "order.post" or "event.<Type>" (Type: letters, digits, '_', '-', '.'). */
bool obx_pipeline_trigger_valid(const char *trigger);
/* The worker's mapping: OrderConfirmed -> "order.post", any other type T -> "event.T".
 * Writes into out (size outlen); returns out. */
const char *obx_pipeline_trigger_for_event(const char *event_type, char *out, size_t outlen);

/* ---- run context ------------------------------------------------------------------------ */

/* The template context of an event run: { event: {id, type, version, orgId, aggregateType,
 * aggregateId, partitionKey, correlationId, causationId, occurredAt}, payload: {...},
 * order: payload.order when it is a document, else the payload itself }, and the payload's
 * top-level fields (orderNumber, ...) unless they clash with those names. `ctx` must be
 * initialised by the caller. */
void obx_pipeline_context_from_event(const obx_event_t *ev, bson_t *ctx);
/* The context of an order.pre run: { orderNumber, orgId, order: <order document> }. */
void obx_pipeline_context_from_order(const bson_t *order, bson_t *ctx);

/* What the caller knows about the run; all pointers borrowed for the call. */
typedef struct {
  const bson_t *context;      /* template context (see above); required */
  const char *org_id;         /* the org the run belongs to; required */
  const char *trigger;        /* NULL: the pipeline's own trigger */
  const char *event_id;       /* the triggering event; NULL for order.pre */
  const char *correlation_id; /* propagated to emitted events; may be NULL */
  const char *aggregate_type; /* the aggregate the run is about ("Order"); used by set-status */
  const char *aggregate_id;   /* and emit-event (aggregateId) */
  const char *partition_key;  /* key of emitted events; NULL: aggregate_id */
  const char *replay_id;      /* the operator's replay that asked for this run; NULL otherwise */
  int32_t attempt;            /* 1-based; 0 is taken as 1 */
} obx_pipeline_input_t;

/* ---- egress guard ------------------------------------------------------------------------ */

#define OBX_EGRESS_MAX_NETS 16

typedef struct {
  int family;        /* AF_INET or AF_INET6 */
  uint8_t addr[16];  /* network address, 4 or 16 bytes */
  int prefix;        /* prefix length in bits */
} obx_egress_net_t;

/* Policy of http-request nodes. Caller storage: obx_egress_init / obx_egress_cleanup. */
typedef struct {
  char **hosts;               /* allowlist; "*.example.com" matches subdomains */
  int nhosts;
  bool allow_public;          /* empty allowlist: any public host (else only literal addresses of nets) */
  obx_egress_net_t nets[OBX_EGRESS_MAX_NETS]; /* networks allowed although not public */
  int nnets;
  int64_t connect_timeout_ms;
  int64_t timeout_ms;         /* whole transfer */
  int64_t max_response_bytes;
  char **connect_to;          /* optional "host:port:address:port" pins (CURLOPT_CONNECT_TO) */
  int nconnect_to;
  char *ca_file;              /* CA bundle used instead of the system one; NULL: system */
} obx_egress_t;

/* hosts: comma-separated allowlist; nets: comma-separated CIDRs allowed although private or
 * loopback ("127.0.0.0/8,::1/128"). Bad values fail naming the entry. allow_public starts
 * false: with an empty allowlist only URLs whose host is a literal address inside nets pass
 * the URL check (set allow_public to let any host through to the address check). */
bool obx_egress_init(obx_egress_t *egress, const char *hosts, const char *nets, int64_t connect_timeout_ms,
                     int64_t timeout_ms, int64_t max_response_bytes, obx_err_t *err);
/* From EGRESS_ALLOWLIST, EGRESS_ALLOW_NETWORKS, EGRESS_CA_FILE, HTTP_CONNECT_TIMEOUT_MS,
 * HTTP_TIMEOUT_MS, HTTP_MAX_RESPONSE_BYTES. */
bool obx_egress_init_conf(obx_egress_t *egress, const obx_conf_t *conf, obx_err_t *err);
/* Sends requests for host:port to address:port instead (copied), like a DNS answer: the
 * address check still applies to the address connected to. For tests and split-horizon
 * setups. */
bool obx_egress_add_connect_to(obx_egress_t *egress, const char *pin, obx_err_t *err);
void obx_egress_cleanup(obx_egress_t *egress);
/* Scheme (http/https only), userinfo-free authority and host allowlist of a URL. */
bool obx_egress_check_url(const obx_egress_t *egress, const char *url, obx_err_t *err);
/* The address a connection is about to be opened to: refused when it is not public
 * (loopback, RFC 1918, CGNAT, link-local incl. metadata, unique-local, multicast, reserved,
 * 0.0.0.0/8, and the IPv4-mapped/compatible/NAT64/6to4 forms of these) unless one of the
 * allowed networks contains it. */
bool obx_egress_check_addr(const obx_egress_t *egress, const struct sockaddr *addr, obx_err_t *err);

typedef struct {
  long status;          /* HTTP status */
  char *body;           /* NUL-terminated, owned; at most max_response_bytes */
  size_t len;
  char *content_type;   /* owned, NULL when absent */
  char *location;       /* owned: the Location of a 3xx (never followed), NULL when absent */
} obx_http_response_t;

/* One request under the guard: no redirects (a 3xx is returned as is), no proxies, the
 * timeouts and the size cap of `egress`, the address check on the socket actually opened.
 * headers: NULL-terminated "Name: value" strings or NULL. Returns true when a response
 * arrived (any status); false with err on refusal (terminal), oversized response
 * (terminal), network or timeout errors (transient). Free resp with obx_http_response_cleanup. */
bool obx_egress_request(const obx_egress_t *egress, const char *method, const char *url, const char *const *headers,
                        const char *body, size_t body_len, obx_http_response_t *resp, obx_err_t *err);

/* The same request as one call whose transfer the caller drives: obx_egress_call_new checks
 * the URL and sets up an easy handle (every option above; the policy is copied, its lists
 * borrowed until the call is destroyed); the caller performs obx_egress_call_handle
 * (curl_easy_perform, or in a multi handle: removed from it before the finish; CURLOPT_PRIVATE
 * is the caller's) and hands its CURLcode to obx_egress_call_finish, which answers as
 * obx_egress_request does. NULL with err when the URL is refused. */
typedef struct obx_egress_call obx_egress_call_t;
obx_egress_call_t *obx_egress_call_new(const obx_egress_t *egress, const char *method, const char *url,
                                       const char *const *headers, const char *body, size_t body_len,
                                       obx_err_t *err);
CURL *obx_egress_call_handle(const obx_egress_call_t *call);
bool obx_egress_call_finish(obx_egress_call_t *call, CURLcode rc, obx_http_response_t *resp, obx_err_t *err);
void obx_egress_call_destroy(obx_egress_call_t *call);
/* curl_global_init, once per process (before a multi handle is made on another thread). */
void obx_egress_global_init(void);
void obx_http_response_cleanup(obx_http_response_t *resp);

/* ---- runs ------------------------------------------------------------------------------- */

typedef enum { OBX_PIPELINE_SUCCEEDED, OBX_PIPELINE_FAILED, OBX_PIPELINE_SKIPPED } obx_pipeline_status_t;
typedef enum { OBX_FAILURE_NONE, OBX_FAILURE_TRANSIENT, OBX_FAILURE_TERMINAL } obx_failure_class_t;

const char *obx_pipeline_status_name(obx_pipeline_status_t status);   /* "SUCCEEDED" ... */
const char *obx_failure_class_name(obx_failure_class_t fclass);       /* NULL, "transient", "terminal" */

typedef struct obx_pipeline_run obx_pipeline_run_t;

/* Phase 1: runs the graph (HTTP calls included), collects effects and the execution
 * document. A disabled pipeline gives a SKIPPED run. Never fails: failures are in the run.
 * Returns an owned run (obx_pipeline_run_destroy). `egress` borrowed for the call. It is
 * obx_pipeline_start, then each waiting call performed here (curl_easy_perform) and resumed. */
obx_pipeline_run_t *obx_pipeline_execute(const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input,
                                         const obx_egress_t *egress);
/* Phase 1 in steps, for a caller that performs the calls itself (the worker's IO thread, many
 * at once): obx_pipeline_start runs the graph up to its first http-request call or its end.
 * While obx_pipeline_run_waiting gives a transfer (an easy handle set up by the egress guard:
 * policy, pinned addresses, timeouts, headers with the Idempotency-Key), the run waits for it:
 * the caller performs it (in a multi handle: removed from it again before resuming) and hands
 * its result to obx_pipeline_resume, which finishes that node and runs on to the next call or
 * the end. Steps, spans, outputs and the execution document are those of obx_pipeline_execute
 * (a step's duration includes its wait). input is copied; pipeline and egress are borrowed until
 * the run no longer waits. A run belongs to one thread at a time (it may move between threads
 * while it waits). Destroying a waiting run ends its calls unperformed. */
obx_pipeline_run_t *obx_pipeline_start(const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input,
                                       const obx_egress_t *egress);
/* The transfer the run waits for (CURLOPT_PRIVATE is the caller's), NULL when it does not. */
CURL *obx_pipeline_run_waiting(const obx_pipeline_run_t *run);
void obx_pipeline_resume(obx_pipeline_run_t *run, CURLcode rc);
/* Phase 2: writes the status entries (orders.statusHistory, orders.pipelineStatus), the
 * emitted events (outbox) and the pipeline_executions document. With a session the writes
 * join the session's transaction (the caller commits); without one they run in a
 * transaction of their own. A run may be committed once. */
bool obx_pipeline_run_commit(obx_pipeline_run_t *run, mongoc_client_t *client, const char *db,
                             mongoc_client_session_t *session, obx_err_t *err);
void obx_pipeline_run_destroy(obx_pipeline_run_t *run);

obx_pipeline_status_t obx_pipeline_run_status(const obx_pipeline_run_t *run);
obx_failure_class_t obx_pipeline_run_failure_class(const obx_pipeline_run_t *run);
/* The error of the step that failed the run (domain NONE when the run succeeded). */
const obx_err_t *obx_pipeline_run_error(const obx_pipeline_run_t *run);
const char *obx_pipeline_run_execution_id(const obx_pipeline_run_t *run);
/* The pipeline_executions document; borrowed until obx_pipeline_run_destroy. */
const bson_t *obx_pipeline_run_execution(const obx_pipeline_run_t *run);
/* Events emitted by emit-event nodes, in order; borrowed until destroy. */
int obx_pipeline_run_nevents(const obx_pipeline_run_t *run);
const obx_event_t *obx_pipeline_run_event(const obx_pipeline_run_t *run, int i);
/* Status entries recorded by set-status nodes: an array document; borrowed. */
const bson_t *obx_pipeline_run_statuses(const obx_pipeline_run_t *run);

typedef struct {
  obx_pipeline_status_t status;
  obx_failure_class_t failure_class;
  char execution_id[OBX_UUID_LEN + 1];
  obx_err_t error; /* the failing step's error */
} obx_pipeline_result_t;

/* Both phases. Returns false only when the commit failed (err set, result describes the run
 * that was not recorded); a FAILED run that was recorded returns true. */
bool obx_pipeline_run(const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input, const obx_egress_t *egress,
                      mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                      obx_pipeline_result_t *result, obx_err_t *err);

/* ---- store (collection `pipelines`) ------------------------------------------------------ */

/* Creates a pipeline of org_id from a definition (orgId in the body is ignored, trigger
 * required); validated first. _id is a new UUIDv7, version 1. `saved` (initialised by the
 * caller, may be NULL) receives the stored document. At most one enabled pipeline per
 * (orgId, trigger): another one is OBX_ERR_CONFLICT. */
bool obx_pipeline_store_create(mongoc_client_t *client, const char *db, const char *org_id, const bson_t *def,
                               bson_t *saved, obx_err_t *err);
/* Replaces pipeline `id` of org_id (OBX_ERR_NOT_FOUND when absent or another org's),
 * version incremented. */
bool obx_pipeline_store_update(mongoc_client_t *client, const char *db, const char *org_id, const char *id,
                               const bson_t *def, bson_t *saved, obx_err_t *err);
/* Creates or replaces by (orgId, name) — the form used for the files of config/pipelines. With
 * dry_run nothing is written; *action receives "create", "update" or "unchanged". */
bool obx_pipeline_store_apply(mongoc_client_t *client, const char *db, const char *org_id, const bson_t *def,
                              bool dry_run, const char **action, bson_t *saved, obx_err_t *err);
/* Pipeline `id` of org_id into out (initialised by the caller); OBX_ERR_NOT_FOUND when absent
 * or another org's. */
bool obx_pipeline_store_get(mongoc_client_t *client, const char *db, const char *org_id, const char *id, bson_t *out,
                            obx_err_t *err);
/* { "pipelines": [ ... ] } of org_id (org_id NULL: every org), sorted by name. */
bool obx_pipeline_store_list(mongoc_client_t *client, const char *db, const char *org_id, bson_t *out,
                             obx_err_t *err);
/* The enabled pipeline of (org_id, trigger); *out NULL when there is none. session optional. */
bool obx_pipeline_store_find_enabled(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                                     const char *org_id, const char *trigger, obx_pipeline_t **out, obx_err_t *err);
/* A cache of obx_pipeline_store_find_enabled answers for the api's order.pre lookup: (org_id,
 * trigger) -> the enabled pipeline or "none", kept ttl_ms (PIPELINES_CACHE_TTL). Every save
 * through this process's store (create, update, apply) makes every entry stale at once; saves
 * by other processes (another outboxd, outboxctl) are seen within ttl_ms. Errors are not
 * cached. One cache per database. Thread-safe; at most OBX_PIPELINE_CACHE_MAX entries (when
 * full, the one closest to expiry goes). */
#define OBX_PIPELINE_CACHE_MAX 4096
typedef struct obx_pipeline_cache obx_pipeline_cache_t;
/* ttl_ms 0: no caching (every lookup reads MongoDB). Returns owned. */
obx_pipeline_cache_t *obx_pipeline_cache_new(int64_t ttl_ms);
void obx_pipeline_cache_destroy(obx_pipeline_cache_t *cache);
/* obx_pipeline_store_find_enabled through the cache; *out is owned by the caller
 * (obx_pipeline_destroy), NULL when there is none. */
bool obx_pipeline_cache_find_enabled(obx_pipeline_cache_t *cache, mongoc_client_t *client, const char *db,
                                     const char *org_id, const char *trigger, obx_pipeline_t **out, obx_err_t *err);

/* A page of executions of one pipeline of org_id, newest first: { "executions": [...],
 * "next": <oldest id shown, for before=; null on the last page>, "prev": <newest id shown, for
 * after=> }. before: older than that id; after: newer (exclusive; at most one); limit 1..200
 * (else OBX_ERR_INPUT). */
bool obx_pipeline_store_executions(mongoc_client_t *client, const char *db, const char *org_id,
                                   const char *pipeline_id, int limit, const char *before, const char *after,
                                   bson_t *out, obx_err_t *err);
/* Applies every *.json file of a directory (or one file) with obx_pipeline_store_apply; each
 * file gives its own orgId. Prints one line per file to `report` (may be NULL). */
bool obx_pipeline_store_apply_path(mongoc_client_t *client, const char *db, const char *path, bool dry_run,
                                   FILE *report, obx_err_t *err);

/* ---- with the api role (src/api/pipelines_routes.c) ------------------------------------- */

/* Registers the /api/pipelines routes on http, installs the order.pre hook of POST /orders
 * and, when PIPELINES_DIR is set, applies its files in the background (retrying while
 * MongoDB is unreachable). Start it before the api role; returns owned state (NULL with err
 * on a bad configuration). Stop after the HTTP server stopped serving. */
void *obx_pipeline_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
void obx_pipeline_api_stop(void *state);

#endif
