/* test_ops_api.c - the operators' API (DESIGN.md §7) through the real outboxd binary
 *
 * One devmongod, a topic of its own on the run's Kafka broker (OBX_TEST_KAFKA_DIR), `outboxd --roles api,relay` and, when AMQP_URL is set (scripts/test.sh sets it),
 * RabbitMQ queues under a private prefix (deleted at the end). Two orgs: acme and globex, each
 * with a FAILED outbox event, a DEAD inbox entry, dead letters, a parked key, an order and a pipeline. The
 * table runs every keyed route of DESIGN.md §7 (orders, pipelines, ops) with {no key -> 401, a
 * key with every permission but the route's -> 403, globex's key on acme's data -> 404 for an
 * id / a list without acme's items / a create in globex's own org, acme's key with only the
 * route's permission -> 2xx} and checks what the allowed call did (queue depths, documents,
 * audit_log).
 * DLQ cells and the replay need RabbitMQ; without AMQP_URL they are skipped with a message (failed
 * under OBX_TEST_STRICT=1, obx_test_have).
 * A reprocessed event goes back to the relay: it is published to Kafka and becomes PUBLISHED.
 * outboxctl status with RELAY_BUCKETS > 1 (leases, checkpoints and members of 3 buckets seeded
 * in a database of their own): every bucket's holder and checkpoint age, the members, and a
 * bucket without a holder degraded, in --json and in text. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "obx/obx_auth.h"
#include "obx/obx_event.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ladder.h"
#include "obx/obx_ops.h"

#define CONSUMER "outboxd-worker" /* WORKER_GROUP default: the inbox consumer outboxd reads */

static obx_test_mongo_t mongo;
static obx_test_broker_t broker;
static char topic[128];
static obx_test_outboxd_t outboxd;
static mongoc_client_t *client;
static obx_ladder_t *ladder; /* NULL without AMQP_URL */
static char prefix[64], keys_path[300];
static char key_globex[64], key_acme_all[64], key_reprocess[64], key_acme_dlq[64];
/* acme's and globex's ids: outbox FAILED event, inbox DEAD entry, DLQ message */
static char acme_out[OBX_UUID_LEN + 1], acme_in[OBX_UUID_LEN + 1], acme_dlq[OBX_UUID_LEN + 1];
static char globex_out[OBX_UUID_LEN + 1], globex_in[OBX_UUID_LEN + 1], globex_dlq[OBX_UUID_LEN + 1];
/* a second dead letter of each org, for the delete route; the parked keys of each org */
static char acme_del[OBX_UUID_LEN + 1], globex_del[OBX_UUID_LEN + 1];
static const char acme_key[] = "A-2", globex_key[] = "G-2";
/* acme's and globex's order and pipeline, created through the API once outboxd runs */
static char acme_order[64], acme_pipe[64], globex_order[64], globex_pipe[64];

static const char *const all_perms[] = {"orders:write", "orders:read",  "outbox:read",    "outbox:reprocess",
                                        "inbox:read",   "inbox:replay", "dlq:read",       "dlq:redrive",
                                        "dlq:delete",   "dlq:export",   "pipelines:read", "pipelines:write",
                                        "status:read",  "keys:read",    "keys:release",   "audit:read"};
#define NPERMS ((int)(sizeof all_perms / sizeof all_perms[0]))

static void make_event(obx_event_t *ev, const char *org, const char *key) {
  obx_event_init(ev);
  ev->event_type = strdup("OrderConfirmed");
  ev->org_id = strdup(org);
  ev->aggregate_type = strdup("Order");
  ev->aggregate_id = strdup(key);
  ev->source = strdup("/test/ops");
  BSON_APPEND_UTF8(&ev->payload, "orderNumber", key);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_finalize(ev, &err)) fail_msg("event: %s", err.msg);
}

static mongoc_collection_t *coll(const char *name) { return mongoc_client_get_collection(client, "outboxd", name); }

/* A FAILED outbox event of org; its id into id. */
static void seed_failed(const char *org, const char *key, const char *last_error, char id[OBX_UUID_LEN + 1]) {
  obx_event_t ev;
  make_event(&ev, org, key);
  bson_t doc = BSON_INITIALIZER;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_to_outbox(&ev, &doc, &err)) fail_msg("to_outbox: %s", err.msg);
  bson_t *update = BCON_NEW("$set", "{", "status", BCON_UTF8("FAILED"), "attempts", BCON_INT32(10), "lastError",
                            BCON_UTF8(last_error), "}");
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(ev.id));
  mongoc_collection_t *c = coll("outbox");
  bson_error_t berr;
  if (!mongoc_collection_insert_one(c, &doc, NULL, NULL, &berr) ||
      !mongoc_collection_update_one(c, filter, update, NULL, NULL, &berr))
    fail_msg("seed outbox: %s", berr.message);
  snprintf(id, OBX_UUID_LEN + 1, "%s", ev.id);
  mongoc_collection_destroy(c);
  bson_destroy(filter);
  bson_destroy(update);
  bson_destroy(&doc);
  obx_event_cleanup(&ev);
}

/* A DEAD inbox entry of org, stored with its CloudEvent headers as the worker does. */
static void seed_inbox(const char *org, const char *key, char id[OBX_UUID_LEN + 1]) {
  obx_event_t ev;
  make_event(&ev, org, key);
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_to_kafka(&ev, NULL, &rec, &err)) fail_msg("to_kafka: %s", err.msg);
  const char *names[OBX_CE_MAX_HEADERS], *values[OBX_CE_MAX_HEADERS];
  for (int i = 0; i < rec.nheaders; i++) {
    names[i] = rec.headers[i].name;
    values[i] = rec.headers[i].value;
  }
  obx_inbox_entry_t entry = {.consumer = CONSUMER, .event = &ev, .header_names = names, .header_values = values,
                             .nheaders = rec.nheaders, .topic = "domain-events", .partition = 0, .offset = 1, .seq = 1};
  bool inserted = false;
  obx_inbox_status_t existing;
  if (!obx_inbox_claim(client, "outboxd", NULL, &entry, OBX_INBOX_RECEIVED, &inserted, &existing, &err) ||
      !obx_inbox_set_status(client, "outboxd", NULL, CONSUMER, ev.id, OBX_INBOX_DEAD, 5, "HTTP 400", NULL, &err))
    fail_msg("seed inbox: %s", err.msg);
  snprintf(id, OBX_UUID_LEN + 1, "%s", ev.id);
  obx_kafka_record_cleanup(&rec);
  obx_event_cleanup(&ev);
}

/* A dead letter of org in the store, as the worker's drain writes it (obx_ops_dl_from_msg). */
static void seed_dlq(const char *org, const char *key, char id[OBX_UUID_LEN + 1]) {
  obx_event_t ev;
  make_event(&ev, org, key);
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_envelope_from_event(&msg, &ev, &err)) fail_msg("envelope: %s", err.msg);
  obx_envelope_fail(&msg, "terminal", "HTTP 400 from the ERP", obx_time_now_ms());
  msg.reason = strdup("terminal failure");
  obx_uuid7(id);
  bson_t doc = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&doc, "_id", id);
  obx_ops_dl_from_msg(&msg, &doc);
  mongoc_collection_t *c = coll("dead_letters");
  bson_error_t berr;
  if (!mongoc_collection_insert_one(c, &doc, NULL, NULL, &berr)) fail_msg("seed dead letter: %s", berr.message);
  mongoc_collection_destroy(c);
  bson_destroy(&doc);
  obx_envelope_cleanup(&msg);
  obx_event_cleanup(&ev);
}

/* Parks key behind the inbox entry head (the key is then the org of head's entry). */
static void seed_parked(const char *key, const char *head) {
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_park_key(client, "outboxd", NULL, CONSUMER, key, head, "head DEAD", &err)) fail_msg("park: %s", err.msg);
}

static int group_setup(void **state) {
  (void)state;
  if (!obx_test_have(obx_test_broker_shared(&broker), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)") ||
      !obx_test_broker_topic(&broker, "ops-api", 2, NULL, topic, sizeof topic) || !obx_test_mongo_start(&mongo, NULL))
    return -1;
  client = obx_test_mongo_client(&mongo, NULL, "test_ops_api");
  snprintf(keys_path, sizeof keys_path, "%s/ops-api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "globex", "*", key_globex);
  obx_test_apikey_add(keys_path, "acme", "*", key_acme_all);
  obx_test_apikey_add(keys_path, "acme", "outbox:reprocess,outbox:read", key_reprocess);
  obx_test_apikey_add(keys_path, "acme", "dlq:redrive", key_acme_dlq);
  snprintf(prefix, sizeof prefix, "opsapi.%d", (int)getpid());
  if (getenv("AMQP_URL")) {
    static const int64_t tiers[] = {5000, 30000, 120000, 600000}; /* RETRY_LADDER's default */
    obx_ladder_opts_t lo = {.url = getenv("AMQP_URL"), .prefix = prefix, .tiers_ms = tiers, .ntiers = 4};
    obx_err_t err = OBX_ERR_INIT;
    if (!(ladder = obx_ladder_new(&lo, &err)) || !obx_ladder_connect(ladder, &err)) {
      fprintf(stderr, "ladder: %s\n", err.msg);
      return -1;
    }
  }
  seed_failed("acme", "A-1", "broker down", acme_out);
  seed_failed("globex", "G-1", "broker down", globex_out);
  seed_inbox("acme", "A-2", acme_in);
  seed_inbox("globex", "G-2", globex_in);
  seed_dlq("acme", "A-3", acme_dlq);
  seed_dlq("globex", "G-3", globex_dlq);
  seed_dlq("acme", "A-5", acme_del);
  seed_dlq("globex", "G-5", globex_del);
  seed_parked(acme_key, acme_in);
  seed_parked(globex_key, globex_in);
  /* outboxd reads the keys file at start: test_route_table adds its keys, then starts it */
  return 0;
}

static void start_outboxd(void) {
  char mongo_arg[300], keys_arg[340], amqp_arg[600], prefix_arg[100], kafka_arg[600], topic_arg[160];
  snprintf(kafka_arg, sizeof kafka_arg, "kafka.brokers=%s", broker.bootstrap);
  snprintf(topic_arg, sizeof topic_arg, "kafka.topic=%s", topic);
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  snprintf(amqp_arg, sizeof amqp_arg, "amqp.url=%s",
           getenv("AMQP_URL") ? getenv("AMQP_URL") : "amqp://guest:guest@127.0.0.1:1/");
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=%s", prefix);
  /* api_keys is read again every 200 ms: test_db_keys waits for refreshes */
  char *args[] = {"--roles", "api,relay", "-X", kafka_arg, "-X", topic_arg, "-X", mongo_arg, "-X", keys_arg, "-X", amqp_arg,
                   "-X", prefix_arg, "-X", "api.keys_refresh=200ms", NULL};
  if (!obx_test_outboxd_start(&outboxd, args)) fail_msg("outboxd did not start");
  if (!obx_test_wait_for(obx_test_http_ready, &outboxd.port, 60000, 50))
    fail_msg("outboxd never became ready; log: %s", outboxd.proc.log_path);
}

static int group_teardown(void **state) {
  (void)state;
  int status = obx_test_outboxd_stop(&outboxd);
  if (ladder) {
    wt_delete_topology(ladder, prefix);
    obx_ladder_destroy(ladder);
  }
  if (client) mongoc_client_destroy(client);
  obx_test_mongo_stop(&mongo);
  return !outboxd.proc.pid || (WIFEXITED(status) && WEXITSTATUS(status) == 0) ? 0 : -1;
}

/* ---- helpers ----------------------------------------------------------------------------- */

static void request(const char *method, const char *path, const char *key, const char *body, long want,
                    obx_test_http_resp_t *resp) {
  obx_test_http_expect(outboxd.port, method, path, key, body, want, resp);
}

static bool find_one(const char *name, const bson_t *filter, bson_t *out) {
  return obx_test_find_one(client, "outboxd", name, filter, out);
}

static int64_t audit_count(const char *action, const char *target) {
  bson_t *filter = BCON_NEW("action", BCON_UTF8(action), "target", BCON_UTF8(target));
  int64_t n = obx_test_count(client, "outboxd", "audit_log", filter);
  bson_destroy(filter);
  return n;
}

static uint32_t depth(const char *queue) {
  uint32_t n = 0;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_queue_depth(ladder, queue, &n, &err)) fail_msg("depth %s: %s", queue, err.msg);
  return n;
}

/* The work queue holds *want messages (no worker runs here: replays and redrives wait there). */
static bool work_depth_is(void *want) { return depth(obx_ladder_work_queue(ladder)) == *(uint32_t *)want; }

static const char *dl_state(const char *id) {
  static char state[32];
  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id));
  snprintf(state, sizeof state, "%s", find_one("dead_letters", filter, &doc) ? obx_test_doc_str(&doc, "state") : "(gone)");
  bson_destroy(filter);
  bson_destroy(&doc);
  return state;
}

/* ---- the route table --------------------------------------------------------------------- */

#define ORDER_BODY "{\"customerEmail\": \"customer@company.com\", \"amount\": \"149.90\"}"
#define PIPE_BODY(name, trigger)                                                                                       \
  "{\"name\": \"" name "\", \"trigger\": \"" trigger "\", \"nodes\": [{\"id\": \"start\", \"type\": \"start\"}]}"

typedef enum {
  ROUTE_ID,     /* acts on or reads one of acme's ids: another org's key gets 404 */
  ROUTE_LIST,   /* a list scoped to the key's org: another org's key gets 200 without acme's items */
  ROUTE_CREATE, /* creates in the key's org: another org's key creates in its own org */
  ROUTE_SYSTEM, /* the key's org's view of the system: every org's key gets 200 */
} route_kind_t;

typedef struct {
  const char *method;
  const char *path;      /* %s: acme's id of the route (outbox event, inbox entry, DLQ message, order, pipeline) */
  const char *perm;
  const char *body;      /* %s as in path; NULL: no body */
  const char *acme_id;   /* acme's id, which the allowed call must see or act on */
  const char *globex_id; /* globex's id, which acme's key must never see */
  route_kind_t kind;
  long allowed;
  bool needs_amqp;
  const char *coll;      /* ROUTE_CREATE: the collection of what it creates, found by the answer's id_field */
  const char *id_field;
} route_t;

/* A create route's answer names a document of collection r->coll that belongs to org. */
static void check_created(const route_t *r, const obx_test_http_resp_t *resp, const char *org) {
  const char *id = obx_test_doc_str(&resp->json, r->id_field);
  if (!id) fail_msg("%s %s: no %s in %s", r->method, r->path, r->id_field, resp->body);
  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id));
  if (!find_one(r->coll, filter, &doc)) fail_msg("%s %s: %s %s not in %s", r->method, r->path, r->id_field, id, r->coll);
  const char *got = obx_test_doc_str(&doc, "orgId");
  if (!got || strcmp(got, org) != 0) fail_msg("%s %s: created %s of org %s, want %s", r->method, r->path, id, got ? got : "-", org);
  bson_destroy(filter);
  bson_destroy(&doc);
}

static void check_allowed(const route_t *r, const obx_test_http_resp_t *resp) {
  switch (r->kind) {
  case ROUTE_LIST:
    if (!strstr(resp->body, r->acme_id)) fail_msg("%s %s: acme's %s missing from %s", r->method, r->path, r->acme_id, resp->body);
    if (strcmp(r->globex_id, "-") != 0 && strstr(resp->body, r->globex_id)) fail_msg("%s %s: globex's %s listed to acme: %s", r->method, r->path, r->globex_id, resp->body);
    break;
  case ROUTE_CREATE: check_created(r, resp, "acme"); break;
  case ROUTE_ID:
  case ROUTE_SYSTEM: break;
  }
}

/* Creates through the API what the order and pipeline routes act on; the id into id. */
static void create(const char *path, const char *key, const char *body, const char *id_field, char id[64]) {
  obx_test_http_resp_t resp;
  request("POST", path, key, body, 201, &resp);
  const char *got = obx_test_doc_str(&resp.json, id_field);
  if (!got) fail_msg("POST %s: no %s in %s", path, id_field, resp.body);
  snprintf(id, 64, "%s", got);
  obx_test_http_resp_cleanup(&resp);
}

static void test_route_table(void **state) {
  (void)state;
  const route_t routes[] = {
    {"POST", "/orders", "orders:write", ORDER_BODY, acme_order, globex_order, ROUTE_CREATE, 201, false, "orders", "id"},
    {"GET", "/orders/%s", "orders:read", NULL, acme_order, globex_order, ROUTE_ID, 200, false, NULL, NULL},
    {"GET", "/api/outbox?status=FAILED", "outbox:read", NULL, acme_out, globex_out, ROUTE_LIST, 200, false, NULL, NULL},
    {"POST", "/api/outbox/%s/reprocess", "outbox:reprocess", NULL, acme_out, globex_out, ROUTE_ID, 200, false, NULL, NULL},
    {"GET", "/api/pipelines", "pipelines:read", NULL, acme_pipe, globex_pipe, ROUTE_LIST, 200, false, NULL, NULL},
    {"POST", "/api/pipelines", "pipelines:write", PIPE_BODY("table", "event.OrderCancelled"), acme_pipe, globex_pipe,
     ROUTE_CREATE, 201, false, "pipelines", "_id"},
    {"GET", "/api/pipelines/%s", "pipelines:read", NULL, acme_pipe, globex_pipe, ROUTE_ID, 200, false, NULL, NULL},
    {"PUT", "/api/pipelines/%s", "pipelines:write", PIPE_BODY("shipped-v2", "event.OrderShipped"), acme_pipe,
     globex_pipe, ROUTE_ID, 200, false, NULL, NULL},
    {"GET", "/api/pipelines/%s/executions", "pipelines:read", NULL, acme_pipe, globex_pipe, ROUTE_ID, 200, false, NULL, NULL},
    {"GET", "/api/inbox?status=DEAD", "inbox:read", NULL, acme_in, globex_in, ROUTE_LIST, 200, false, NULL, NULL},
    {"POST", "/api/inbox/%s/replay", "inbox:replay", NULL, acme_in, globex_in, ROUTE_ID, 202, true, NULL, NULL},
    {"GET", "/api/dlq", "dlq:read", NULL, acme_dlq, globex_dlq, ROUTE_LIST, 200, true, NULL, NULL},
    {"POST", "/api/dlq/redrive", "dlq:redrive", "{\"ids\": [\"%s\"]}", acme_dlq, globex_dlq, ROUTE_ID, 200, true, NULL, NULL},
    {"GET", "/api/status", "status:read", NULL, "\"outbox\"", "-", ROUTE_SYSTEM, 200, false, NULL, NULL},
    {"GET", "/api/inbox/%s", "inbox:read", NULL, acme_in, globex_in, ROUTE_ID, 200, false, NULL, NULL},
    {"POST", "/api/inbox/replay", "inbox:replay", "{\"status\": \"DEAD\"}", acme_in, globex_in, ROUTE_LIST, 202, true,
     NULL, NULL},
    {"GET", "/api/dlq/%s", "dlq:read", NULL, acme_dlq, globex_dlq, ROUTE_ID, 200, false, NULL, NULL},
    {"GET", "/api/dlq/export?state=dead", "dlq:export", NULL, acme_del, globex_del, ROUTE_LIST, 200, false, NULL, NULL},
    {"POST", "/api/dlq/delete", "dlq:delete", "{\"ids\": [\"%s\"]}", acme_del, globex_del, ROUTE_ID, 200, false, NULL,
     NULL},
    {"GET", "/api/keys", "keys:read", NULL, acme_key, globex_key, ROUTE_LIST, 200, false, NULL, NULL},
    {"POST", "/api/keys/%s/release", "keys:release", NULL, acme_key, globex_key, ROUTE_ID, 200, true, NULL, NULL},
    /* globex has no reprocess of its own: "-" skips the check that it sees its own */
    {"GET", "/api/audit?action=outbox.reprocess", "audit:read", NULL, acme_out, "-", ROUTE_LIST, 200, false, NULL, NULL},
  };
  enum { NROUTES = sizeof routes / sizeof routes[0] };
  char allowed[NROUTES][64], denied[NROUTES][64];
  for (int i = 0; i < NROUTES; i++) {
    char others[512] = "";
    for (int p = 0; p < NPERMS; p++)
      if (strcmp(all_perms[p], routes[i].perm) != 0)
        snprintf(others + strlen(others), sizeof others - strlen(others), "%s%s", *others ? "," : "", all_perms[p]);
    obx_test_apikey_add(keys_path, "acme", routes[i].perm, allowed[i]);
    obx_test_apikey_add(keys_path, "acme", others, denied[i]);
  }
  start_outboxd();
  create("/orders", key_acme_all, ORDER_BODY, "id", acme_order);
  create("/orders", key_globex, ORDER_BODY, "id", globex_order);
  create("/api/pipelines", key_acme_all, PIPE_BODY("shipped", "event.OrderShipped"), "_id", acme_pipe);
  create("/api/pipelines", key_globex, PIPE_BODY("shipped", "event.OrderShipped"), "_id", globex_pipe);

  for (int i = 0; i < NROUTES; i++) {
    const route_t *r = &routes[i];
    char path[256], body[256];
    snprintf(path, sizeof path, r->path, r->acme_id);
    if (r->body) snprintf(body, sizeof body, r->body, r->acme_id);
    const char *b = r->body ? body : NULL;
    obx_test_http_resp_t resp;

    request(r->method, path, NULL, b, 401, &resp);
    obx_test_http_resp_cleanup(&resp);
    request(r->method, path, denied[i], b, 403, &resp);
    obx_test_http_resp_cleanup(&resp);
    if (r->needs_amqp && !obx_test_have(ladder != NULL, "AMQP_URL not set: the RabbitMQ routes' other-org and allowed cells"))
      continue;
    request(r->method, path, key_globex, b, r->kind == ROUTE_ID ? 404 : r->allowed, &resp);
    if (r->kind == ROUTE_SYSTEM && !strstr(resp.body, r->acme_id))
      fail_msg("%s %s: got %s, want it to hold %s", r->method, path, resp.body, r->acme_id);
    if (r->kind == ROUTE_LIST && strstr(resp.body, r->acme_id))
      fail_msg("%s %s: globex's key sees acme's %s: %s", r->method, path, r->acme_id, resp.body);
    if (r->kind == ROUTE_LIST && strcmp(r->globex_id, "-") != 0 && !strstr(resp.body, r->globex_id))
      fail_msg("%s %s: globex's key misses its own %s: %s", r->method, path, r->globex_id, resp.body);
    if (r->kind == ROUTE_CREATE) check_created(r, &resp, "globex");
    obx_test_http_resp_cleanup(&resp);
    request(r->method, path, allowed[i], b, r->allowed, &resp);
    check_allowed(r, &resp);
    obx_test_http_resp_cleanup(&resp);
  }

  /* what the allowed calls did */
  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(acme_out));
  assert_true(find_one("outbox", filter, &doc));
  assert_string_not_equal(obx_test_doc_str(&doc, "status"), "FAILED"); /* PENDING, or PUBLISHED already */
  bson_destroy(filter);
  bson_reinit(&doc);
  filter = BCON_NEW("_id", BCON_UTF8(globex_out));
  assert_true(find_one("outbox", filter, &doc));
  assert_string_equal(obx_test_doc_str(&doc, "status"), "FAILED"); /* globex's 404 changed nothing */
  bson_destroy(filter);
  bson_destroy(&doc);
  assert_int_equal(audit_count("outbox.reprocess", acme_out), 1);
  assert_int_equal(audit_count("outbox.reprocess", globex_out), 0);
  /* acme's PUT renamed acme's pipeline; globex's 404 left globex's as it was */
  static const struct {
    const char *id, *want;
  } pipes[] = {{acme_pipe, "shipped-v2"}, {globex_pipe, "shipped"}};
  for (size_t i = 0; i < sizeof pipes / sizeof pipes[0]; i++) {
    doc = (bson_t)BSON_INITIALIZER;
    filter = BCON_NEW("_id", BCON_UTF8(pipes[i].id));
    assert_true(find_one("pipelines", filter, &doc));
    const char *name = obx_test_doc_str(&doc, "name");
    if (!name || strcmp(name, pipes[i].want) != 0) fail_msg("pipeline %s: got name %s, want %s", pipes[i].id, name ? name : "-", pipes[i].want);
    bson_destroy(filter);
    bson_destroy(&doc);
  }
  if (obx_test_have(ladder != NULL, "AMQP_URL not set: the queues after replay and redrive")) {
    assert_int_equal(audit_count("inbox.replay", acme_in), 1);
    assert_int_equal(audit_count("inbox.replay", globex_in), 0);
    /* acme's replay (one id, then the filtered one), globex's filtered replay and acme's redrive
     * wait on the work queue; the DLQ queue is not read by any operation */
    uint32_t want = 4;
    if (!obx_test_wait_for(work_depth_is, &want, 30000, 100))
      fail_msg("work queue: got %u, want %u", depth(obx_ladder_work_queue(ladder)), want);
    assert_int_equal(depth(obx_ladder_dlq_queue(ladder)), 0);
    assert_int_equal(audit_count("dlq.redrive", acme_dlq), 1);
    assert_string_equal(dl_state(acme_dlq), "redriven");
    assert_string_equal(dl_state(globex_dlq), "dead");
    assert_int_equal(audit_count("keys.release", acme_key), 1);
    assert_int_equal(audit_count("keys.release", globex_key), 0);
  }
  /* acme's delete removed acme's dead letter only, and said which */
  assert_string_equal(dl_state(acme_del), "(gone)");
  assert_string_equal(dl_state(globex_del), "dead");
  bson_t *del = BCON_NEW("action", BCON_UTF8("dlq.delete"), "orgId", BCON_UTF8("acme"), "details.ids", BCON_UTF8(acme_del));
  assert_int_equal(obx_test_count(client, "outboxd", "audit_log", del), 1);
  bson_destroy(del);
  bson_t *exp = BCON_NEW("action", BCON_UTF8("dlq.export"), "orgId", BCON_UTF8("acme"));
  assert_int_equal(obx_test_count(client, "outboxd", "audit_log", exp), 1);
  bson_destroy(exp);
}

typedef struct {
  const char *id;
  bool seen;
} record_ctx_t;

static void on_record(const rd_kafka_message_t *rkm, void *p) {
  record_ctx_t *c = p;
  char id[64];
  if (obx_test_kafka_header(rkm, "ce_id", id, sizeof id) && strcmp(id, c->id) == 0) c->seen = true;
}

static bool outbox_published(void *id) {
  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id), "status", BCON_UTF8("PUBLISHED"));
  bool found = find_one("outbox", filter, &doc);
  bson_destroy(filter);
  bson_destroy(&doc);
  return found;
}

static bool outbox_settled(void *ctx) {
  (void)ctx;
  bson_t *filter = BCON_NEW("status", "{", "$nin", "[", BCON_UTF8("PUBLISHED"), BCON_UTF8("FAILED"), "]", "}");
  int64_t n = obx_test_count(client, "outboxd", "outbox", filter);
  bson_destroy(filter);
  return n == 0;
}

/* A FAILED event reprocessed through the API: PENDING with attempts reset, due now, its last
 * error kept in history, an audit_log entry; the relay publishes it again; a second reprocess
 * is a conflict. */
static void test_reprocess(void **state) {
  (void)state;
  char id[OBX_UUID_LEN + 1], path[128];
  seed_failed("acme", "A-9", "Local: Message timed out", id);
  snprintf(path, sizeof path, "/api/outbox/%s/reprocess", id);
  int64_t before = obx_time_now_ms();
  obx_test_http_resp_t resp;
  request("POST", path, key_reprocess, NULL, 200, &resp);
  /* the answer is the document as the reprocess left it */
  assert_string_equal(obx_test_http_json_str(&resp, "status"), "PENDING");
  assert_int_equal(obx_test_doc_int(&resp.json, "attempts"), 0);
  assert_string_equal(obx_test_doc_str(&resp.json, "history.0.lastError"), "Local: Message timed out");
  assert_int_equal(obx_test_doc_int(&resp.json, "history.0.attempts"), 10);
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, &resp.json, "lastError") && BSON_ITER_HOLDS_NULL(&it));
  obx_test_http_resp_cleanup(&resp);

  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("action", BCON_UTF8("outbox.reprocess"), "target", BCON_UTF8(id));
  assert_true(find_one("audit_log", filter, &doc));
  assert_string_equal(obx_test_doc_str(&doc, "orgId"), "acme");
  assert_non_null(obx_test_doc_str(&doc, "who"));
  assert_memory_equal(obx_test_doc_str(&doc, "who"), "apikey:", 7);
  assert_string_equal(obx_test_doc_str(&doc, "details.lastError"), "Local: Message timed out");
  assert_true(bson_iter_init_find(&it, &doc, "when") && BSON_ITER_HOLDS_DATE_TIME(&it));
  if (bson_iter_date_time(&it) < before - 1000) fail_msg("audit when %lld, want >= %lld", (long long)bson_iter_date_time(&it), (long long)before);
  bson_destroy(filter);
  bson_destroy(&doc);

  /* picked up by the relay: published to Kafka, PUBLISHED, history kept */
  if (!obx_test_wait_for(outbox_published, id, 60000, 100)) fail_msg("reprocessed event %s never PUBLISHED", id);
  record_ctx_t rec = {.id = id};
  /* once nothing but FAILED events waits, the topic holds every PUBLISHED event: the orders of
   * test_route_table, acme's event it reprocessed, and this one */
  if (!obx_test_wait_for(outbox_settled, NULL, 60000, 100)) fail_msg("outbox events still waiting for the relay");
  bson_t *published = BCON_NEW("status", BCON_UTF8("PUBLISHED"));
  int64_t npublished = obx_test_count(client, "outboxd", "outbox", published);
  bson_destroy(published);
  /* at least npublished records; more when an event went out twice (at-least-once: the stream
   * and the first sweep may both publish one written while the stream opened), so the read goes
   * on, in rounds of one group, until the event is seen or the deadline passes */
  char group[64];
  snprintf(group, sizeof group, "reprocess-check-%d", (int)getpid());
  int64_t deadline = obx_test_now_ms() + 60000;
  for (int want = (int)npublished; !rec.seen && obx_test_now_ms() < deadline; want = 1)
    if (obx_test_kafka_consume_all(broker.bootstrap, topic, group, want, (int)(deadline - obx_test_now_ms()), on_record,
                                   &rec) < 0)
      fail_msg("consumer failed");
  if (!rec.seen) fail_msg("reprocessed event %s not in Kafka", id);
  doc = (bson_t)BSON_INITIALIZER;
  filter = BCON_NEW("_id", BCON_UTF8(id));
  assert_true(find_one("outbox", filter, &doc));
  assert_string_equal(obx_test_doc_str(&doc, "history.0.lastError"), "Local: Message timed out");
  bson_destroy(filter);
  bson_destroy(&doc);

  request("GET", "/api/outbox?status=FAILED&limit=1000", key_reprocess, NULL, 200, &resp);
  assert_null(strstr(resp.body, id));
  obx_test_http_resp_cleanup(&resp);
  request("POST", path, key_reprocess, NULL, 409, &resp);
  assert_non_null(strstr(resp.headers, "application/problem+json"));
  obx_test_http_resp_cleanup(&resp);
  request("POST", "/api/outbox/0190aaaa-0000-7000-8000-000000000000/reprocess", key_reprocess, NULL, 404, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("GET", "/api/outbox?status=LOST", key_reprocess, NULL, 400, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("GET", "/api/outbox?limit=0", key_reprocess, NULL, 400, &resp);
  obx_test_http_resp_cleanup(&resp);
}

/* {"all": true} is scoped to the key's org; dryRun moves nothing; bad bodies are 400. Runs after
 * the table, which moved acme's only DLQ message. */
static void test_dlq_redrive_all(void **state) {
  (void)state;
  obx_test_http_resp_t resp;
  static const char *const bad[] = {"", "[1]", "{}", "{\"all\": false}", "{\"ids\": []}", "{\"ids\": [1]}",
                                    "{\"all\": true, \"ids\": [\"x\"]}", "{\"all\": \"yes\"}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    request("POST", "/api/dlq/redrive", key_acme_dlq, bad[i], 400, &resp);
    obx_test_http_resp_cleanup(&resp);
  }
  /* an id that does not exist, or is another org's, is 404 and moves nothing */
  char body[160];
  request("POST", "/api/dlq/redrive", key_acme_dlq, "{\"ids\": [\"0190aaaa-0000-7000-8000-000000000000\"]}", 404, &resp);
  obx_test_http_resp_cleanup(&resp);
  snprintf(body, sizeof body, "{\"ids\": [\"%s\"]}", globex_dlq);
  request("POST", "/api/dlq/redrive", key_acme_dlq, body, 404, &resp);
  obx_test_http_resp_cleanup(&resp);
  request("GET", "/api/dlq/0190aaaa-0000-7000-8000-000000000000", key_acme_all, NULL, 404, &resp);
  obx_test_http_resp_cleanup(&resp);
  assert_string_equal(dl_state(globex_dlq), "dead");
  if (!obx_test_have(ladder != NULL, "AMQP_URL not set: redrive of all")) return;
  uint32_t work = depth(obx_ladder_work_queue(ladder));
  request("POST", "/api/dlq/redrive", key_globex, "{\"all\": true, \"dryRun\": true}", 200, &resp);
  if (obx_test_doc_int(&resp.json, "count") != 2 || !strstr(resp.body, globex_dlq) || !strstr(resp.body, globex_del) ||
      strstr(resp.body, acme_dlq))
    fail_msg("globex dry run: got %s, want count 2 with %s and %s only", resp.body, globex_dlq, globex_del);
  obx_test_http_resp_cleanup(&resp);
  assert_string_equal(dl_state(globex_dlq), "dead");
  request("POST", "/api/dlq/redrive", key_acme_dlq, "{\"all\": true}", 200, &resp);
  if (obx_test_doc_int(&resp.json, "count") != 0)
    fail_msg("acme all: got %s, want count 0 (acme's was redriven, globex's is not acme's)", resp.body);
  obx_test_http_resp_cleanup(&resp);
  assert_int_equal(depth(obx_ladder_work_queue(ladder)), work);

  /* A filtered redrive touches only the org's dead letters: acme's "all" moves acme's new one
   * alone, globex's stays, one audit entry of acme's org lists exactly that id. */
  char acme_more[OBX_UUID_LEN + 1];
  seed_dlq("acme", "A-4", acme_more);
  request("POST", "/api/dlq/redrive", key_acme_dlq, "{\"all\": true, \"class\": \"terminal\"}", 200, &resp);
  if (obx_test_doc_int(&resp.json, "count") != 1 || !strstr(resp.body, acme_more) || strstr(resp.body, globex_dlq))
    fail_msg("acme all: got %s, want count 1 with %s only", resp.body, acme_more);
  obx_test_http_resp_cleanup(&resp);
  work++;
  if (!obx_test_wait_for(work_depth_is, &work, 30000, 100))
    fail_msg("work queue: got %u, want %u", depth(obx_ladder_work_queue(ladder)), work);
  request("GET", "/api/dlq?state=dead", key_globex, NULL, 200, &resp);
  if (obx_test_doc_int(&resp.json, "count") != 2 || !strstr(resp.body, globex_dlq))
    fail_msg("globex's dead letters after acme's redrive: got %s, want its 2 (%s and %s)", resp.body, globex_dlq,
             globex_del);
  obx_test_http_resp_cleanup(&resp);
  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("action", BCON_UTF8("dlq.redrive"), "orgId", BCON_UTF8("acme"), "details.ids",
                            BCON_UTF8(acme_more));
  if (!find_one("audit_log", filter, &doc)) fail_msg("no dlq.redrive audit entry of acme listing %s", acme_more);
  int64_t moved = obx_test_doc_int(&doc, "details.count");
  const char *id0 = obx_test_doc_str(&doc, "details.ids.0"), *id1 = obx_test_doc_str(&doc, "details.ids.1");
  if (moved != 1 || !id0 || id1)
    fail_msg("audit details: got count %lld, ids.0 %s, ids.1 %s; want count 1 with one id", (long long)moved,
             id0 ? id0 : "-", id1 ? id1 : "-");
  bson_destroy(filter);
  bson_destroy(&doc);
}

/* Every document of the collections an operator action can change, and the work queue depth. */
static char *snapshot(void) {
  static const char *const colls[] = {"outbox", "inbox", "dead_letters", "parked_keys", "audit_log", "pipeline_executions"};
  bson_string_t *text = bson_string_new(NULL);
  for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
    mongoc_collection_t *c = coll(colls[i]);
    bson_t *opts = BCON_NEW("sort", "{", "_id", BCON_INT32(1), "}");
    bson_t empty = BSON_INITIALIZER;
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, &empty, opts, NULL);
    const bson_t *doc;
    bson_string_append_printf(text, "%s:\n", colls[i]);
    while (mongoc_cursor_next(cur, &doc)) {
      char *json = bson_as_relaxed_extended_json(doc, NULL);
      bson_string_append_printf(text, "%s\n", json);
      bson_free(json);
    }
    mongoc_cursor_destroy(cur);
    bson_destroy(opts);
    mongoc_collection_destroy(c);
  }
  if (ladder) bson_string_append_printf(text, "work queue: %u\n", depth(obx_ladder_work_queue(ladder)));
  return bson_string_free(text, false);
}

static int outboxctl(const char *args, char *out, size_t outlen);

/* Every mutating route and command with its dry run: it answers 200 / exit 0, names what it
 * would touch, and changes nothing (no document, no audit entry, no message). */
static void test_dry_runs(void **state) {
  (void)state;
  char path[256], body[256], cmd[256], out[16384];
  static const struct {
    const char *method, *path, *body, *perm_key, *want;
  } routes[] = {
    {"POST", "/api/outbox/%s/reprocess", "{\"dryRun\": true}", "out", "out"},
    {"POST", "/api/inbox/%s/replay", "{\"dryRun\": true}", "in", "in"},
    {"POST", "/api/inbox/replay", "{\"status\": \"DEAD\", \"dryRun\": true}", NULL, "in"},
    {"POST", "/api/dlq/redrive", "{\"all\": true, \"dryRun\": true}", NULL, "dlq"},
    {"POST", "/api/dlq/delete", "{\"all\": true, \"dryRun\": true}", NULL, "dlq"},
    {"POST", "/api/keys/%s/release", "{\"dryRun\": true}", "key", "key"},
  };
  static const struct {
    const char *fmt, *arg, *want;
  } cmds[] = {
    {"outbox reprocess %s --dry-run", "out", "out"},
    {"inbox replay %s --dry-run", "in", "in"},
    {"inbox replay --status DEAD --dry-run%s", "", "in"},
    {"dlq redrive --all --dry-run%s", "", "dlq"},
    {"dlq delete --all --dry-run%s", "", "dlq"},
    {"dlq purge --yes --dry-run%s", "", "dlq"},
    {"keys release %s --dry-run", "key", "key"},
  };
#define GLOBEX_ID(k) (strcmp(k, "out") == 0 ? globex_out : strcmp(k, "in") == 0 ? globex_in : strcmp(k, "dlq") == 0 ? globex_dlq : strcmp(k, "key") == 0 ? globex_key : "")
  char *before = snapshot();
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    snprintf(path, sizeof path, routes[i].path, routes[i].perm_key ? GLOBEX_ID(routes[i].perm_key) : "");
    snprintf(body, sizeof body, "%s", routes[i].body);
    obx_test_http_resp_t resp;
    request(routes[i].method, path, key_globex, body, 200, &resp);
    if (!strstr(resp.body, GLOBEX_ID(routes[i].want)))
      fail_msg("%s %s dry run: got %s, want it to name %s", routes[i].method, path, resp.body, GLOBEX_ID(routes[i].want));
    obx_test_http_resp_cleanup(&resp);
    char *after = snapshot();
    if (strcmp(before, after) != 0) fail_msg("%s %s with dryRun changed the data:\nbefore:\n%s\nafter:\n%s", routes[i].method, path, before, after);
    free(after);
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    snprintf(cmd, sizeof cmd, cmds[i].fmt, *cmds[i].arg ? GLOBEX_ID(cmds[i].arg) : "");
    int rc = outboxctl(cmd, out, sizeof out);
    if (rc != 0 || !strstr(out, GLOBEX_ID(cmds[i].want)))
      fail_msg("outboxctl %s: exit %d, want 0 naming %s: %s", cmd, rc, GLOBEX_ID(cmds[i].want), out);
    char *after = snapshot();
    if (strcmp(before, after) != 0) fail_msg("outboxctl %s changed the data:\nbefore:\n%s\nafter:\n%s", cmd, before, after);
    free(after);
  }
#undef GLOBEX_ID
  free(before);
}

/* outboxctl runs the same operation: same transition, same audit entry, with the operator. */
static void test_outboxctl_reprocess(void **state) {
  (void)state;
  char id[OBX_UUID_LEN + 1], cmd[1024], line[512];
  seed_failed("acme", "A-10", "Broker: Not enough in-sync replicas", id);
  snprintf(cmd, sizeof cmd, "%s outbox reprocess %s --who alice -X 'mongo.uri=%s' 2>&1",
           obx_test_build_path("outboxctl"), id, mongo.uri);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[2048] = "";
  while (fgets(line, sizeof line, p)) snprintf(out + strlen(out), sizeof out - strlen(out), "%s", line);
  int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("%s: status %d: %s", cmd, status, out);
  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("action", BCON_UTF8("outbox.reprocess"), "target", BCON_UTF8(id));
  assert_true(find_one("audit_log", filter, &doc));
  assert_string_equal(obx_test_doc_str(&doc, "who"), "alice");
  assert_string_equal(obx_test_doc_str(&doc, "orgId"), "acme");
  bson_destroy(filter);
  bson_destroy(&doc);

  snprintf(cmd, sizeof cmd, "%s outbox list FAILED --json -X 'mongo.uri=%s' 2>&1", obx_test_build_path("outboxctl"),
           mongo.uri);
  p = popen(cmd, "r");
  assert_non_null(p);
  out[0] = '\0';
  while (fgets(line, sizeof line, p)) snprintf(out + strlen(out), sizeof out - strlen(out), "%s", line);
  pclose(p);
  if (strstr(out, id) || !strstr(out, globex_out)) fail_msg("outbox list FAILED: got %s, want %s gone and %s listed", out, id, globex_out);
}

/* Runs outboxctl with args and the test's MongoDB, RabbitMQ and queue prefix; stdout into out. */
static int outboxctl(const char *args, char *out, size_t outlen) {
  char cmd[2048], line[1024];
  snprintf(cmd, sizeof cmd, "%s %s -X 'mongo.uri=%s' -X 'worker.queue_prefix=%s' -X 'amqp.url=%s'",
           obx_test_build_path("outboxctl"), args, mongo.uri, prefix,
           getenv("AMQP_URL") ? getenv("AMQP_URL") : "amqp://guest:guest@127.0.0.1:1/");
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  out[0] = '\0';
  while (fgets(line, sizeof line, p)) snprintf(out + strlen(out), outlen - strlen(out), "%s", line);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* outboxctl status --json: the relay of this outboxd leads, counts match the seeded data. */
static bool status_has_checkpoint(void *out) {
  return outboxctl("status --json", out, 8192) != 1 && strstr(out, "\"checkpointAgeMs\" : ") &&
         !strstr(out, "\"checkpointAgeMs\" : null");
}

static void test_outboxctl_status(void **state) {
  (void)state;
  char out[8192];
  /* the relay writes its checkpoint every RELAY_CHECKPOINT_INTERVAL once it has published */
  obx_test_wait_for(status_has_checkpoint, out, 30000, 200);
  int rc = outboxctl("status --json", out, sizeof out);
  if (rc != 3) fail_msg("outboxctl status with dead letters waiting: exit %d, want 3 (degraded): %s", rc, out);
  if (!strstr(out, "dead letters waiting")) fail_msg("status --json: degraded does not name the dead letters: %s", out);
  bson_error_t berr;
  bson_t *doc = bson_new_from_json((const uint8_t *)out, -1, &berr);
  if (!doc) fail_msg("outboxctl status --json: not JSON (%s): %s", berr.message, out);
  if (!obx_test_doc_str(doc, "relay.leader")) fail_msg("no relay leader: %s", out);
  if (obx_test_doc_int(doc, "relay.checkpointAgeMs") < 0) fail_msg("no checkpoint age: %s", out);
  assert_int_equal(obx_test_doc_int(doc, "relay.pending") >= 0, 1);
  assert_true(obx_test_doc_int(doc, "outbox.FAILED") >= 1); /* globex's */
  assert_true(obx_test_doc_int(doc, "outbox.PUBLISHED") >= 1);
  /* no worker runs here: acme's replay waits on the work queue */
  assert_int_equal(obx_test_doc_int(doc, "inbox.DEAD"), 2);
  assert_int_equal(obx_test_doc_int(doc, "parkedKeys"), ladder ? 1 : 2); /* acme's released by the table */
  assert_true(obx_test_doc_int(doc, "deadLetters.count") >= 1); /* globex's */
  if (ladder) assert_int_equal(obx_test_doc_int(doc, "dlq.depth"), 0);
  else if (!obx_test_doc_str(doc, "dlq.error"))
    fail_msg("dlq depth without RabbitMQ should be unknown with a reason: %s", out);
  bson_destroy(doc);

  rc = outboxctl("status", out, sizeof out);
  if (rc != 3 || !strstr(out, "leader ") || !strstr(out, "FAILED=") || !strstr(out, "parked keys") ||
      !strstr(out, "MongoDB outboxd at ") || !strstr(out, "RabbitMQ vhost / at "))
    fail_msg("outboxctl status: exit %d, want 3 with the target, leader, counts and parked keys: %s", rc, out);
}

/* Seeds `db` with what relays over 3 buckets leave: member relay-a holds buckets 0 and 2 (their
 * leases live, checkpoints 1.5 s and 4 s old), bucket 1's lease expired (relay-b died) with no
 * checkpoint. */
static void seed_buckets(const char *db) {
  int64_t now = obx_time_now_ms();
  mongoc_collection_t *members = mongoc_client_get_collection(client, db, "relay_members");
  mongoc_collection_t *leases = mongoc_client_get_collection(client, db, "leases");
  mongoc_collection_t *ckpts = mongoc_client_get_collection(client, db, "relay_checkpoints");
  bson_t *docs[] = {
    BCON_NEW("_id", "relay-a:1:1", "buckets", BCON_INT32(3), "held", "[", BCON_INT32(0), BCON_INT32(2), "]", "expiresAt",
             BCON_DATE_TIME(now + 60000)),
    BCON_NEW("_id", "relay.0/3", "owner", "relay-a:1:1", "epoch", BCON_INT64(4), "bucket", BCON_INT32(0), "buckets",
             BCON_INT32(3), "expiresAt", BCON_DATE_TIME(now + 60000)),
    BCON_NEW("_id", "relay.1/3", "owner", "relay-b:2:1", "epoch", BCON_INT64(1), "bucket", BCON_INT32(1), "buckets",
             BCON_INT32(3), "expiresAt", BCON_DATE_TIME(now - 10000)),
    BCON_NEW("_id", "relay.2/3", "owner", "relay-a:1:1", "epoch", BCON_INT64(2), "bucket", BCON_INT32(2), "buckets",
             BCON_INT32(3), "expiresAt", BCON_DATE_TIME(now + 60000)),
    BCON_NEW("_id", "outbox.0/3", "updatedAt", BCON_DATE_TIME(now - 1500), "epoch", BCON_INT64(4)),
    BCON_NEW("_id", "outbox.2/3", "updatedAt", BCON_DATE_TIME(now - 4000), "epoch", BCON_INT64(2)),
  };
  mongoc_collection_t *into[] = {members, leases, leases, leases, ckpts, ckpts};
  for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
    bson_error_t berr;
    if (!mongoc_collection_insert_one(into[i], docs[i], NULL, NULL, &berr)) fail_msg("seed: %s", berr.message);
    bson_destroy(docs[i]);
  }
  mongoc_collection_destroy(ckpts);
  mongoc_collection_destroy(leases);
  mongoc_collection_destroy(members);
}

static void test_outboxctl_status_buckets(void **state) {
  (void)state;
  char out[16384];
  seed_buckets("ops_status_buckets");
  int rc = outboxctl("status --json -X mongo.db=ops_status_buckets", out, sizeof out);
  bson_error_t berr;
  bson_t *doc = bson_new_from_json((const uint8_t *)out, -1, &berr);
  if (rc != 3 || !doc) fail_msg("status --json over 3 buckets: exit %d (want 3), %s: %s", rc, doc ? "JSON" : berr.message, out);
  const char *h0 = obx_test_doc_str(doc, "relay.bucketHolders.0.holder");
  const char *h2 = obx_test_doc_str(doc, "relay.bucketHolders.2.holder");
  const char *m0 = obx_test_doc_str(doc, "relay.members.0.owner");
  bson_iter_t it;
  bool h1_null = bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "relay.bucketHolders.1.holder", &it) &&
                 BSON_ITER_HOLDS_NULL(&it);
  bool age1_null = bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "relay.bucketHolders.1.checkpointAgeMs", &it) &&
                   BSON_ITER_HOLDS_NULL(&it);
  if (obx_test_doc_int(doc, "relay.buckets") != 3 || !h0 || strcmp(h0, "relay-a:1:1") || !h2 || strcmp(h2, "relay-a:1:1") ||
      !h1_null || !age1_null || obx_test_doc_int(doc, "relay.bucketHolders.0.epoch") != 4 ||
      obx_test_doc_int(doc, "relay.bucketHolders.0.checkpointAgeMs") < 1500 ||
      obx_test_doc_int(doc, "relay.bucketHolders.2.checkpointAgeMs") < 4000 || !m0 || strcmp(m0, "relay-a:1:1") ||
      obx_test_doc_int(doc, "relay.members.0.held.1") != 2 || !strstr(out, "1 relay bucket without a holder"))
    fail_msg("status --json over 3 buckets: want buckets 3, holders relay-a/null/relay-a (epoch 4; checkpoints >= 1.5 s, "
             "none, >= 4 s), member relay-a holding 0 2, degraded naming the bucket without a holder: %s", out);
  bson_destroy(doc);
  rc = outboxctl("status -X mongo.db=ops_status_buckets", out, sizeof out);
  if (rc != 3 || !strstr(out, "3 buckets") || !strstr(out, "bucket 0    held by relay-a:1:1 (epoch 4") ||
      !strstr(out, "bucket 1    no holder, no checkpoint") || !strstr(out, "member relay-a:1:1 holds 0 2 (") ||
      !strstr(out, "no checkpoint (a bucket has none yet)") || !strstr(out, "1 relay bucket without a holder"))
    fail_msg("status over 3 buckets: exit %d (want 3), want each bucket's holder and checkpoint, the member and the "
             "degraded bucket: %s", rc, out);
}

/* The listing commands print JSON of every org: inbox list over obx_ops_list (as GET
 * /api/inbox), pipelines list --json; a bad status is a usage error. */
static void test_outboxctl_lists(void **state) {
  (void)state;
  char out[16384];
  int rc = outboxctl("inbox list DEAD --json", out, sizeof out);
  bson_error_t berr;
  bson_t *doc = bson_new_from_json((const uint8_t *)out, -1, &berr);
  if (rc != 0 || !doc) fail_msg("inbox list DEAD --json: exit %d, not JSON (%s): %s", rc, doc ? "" : berr.message, out);
  if (obx_test_doc_int(doc, "count") != 2 || !strstr(out, acme_in) || !strstr(out, globex_in))
    fail_msg("inbox list DEAD --json: got %s, want count 2 with %s and %s", out, acme_in, globex_in);
  bson_destroy(doc);
  rc = outboxctl("inbox list DEAD --limit 1", out, sizeof out);
  if (rc != 0 || !strstr(out, "EVENT ID") || (!!strstr(out, acme_in) + !!strstr(out, globex_in)) != 1)
    fail_msg("inbox list DEAD --limit 1: exit %d: got %s, want a header and one of the two entries", rc, out);
  rc = outboxctl("inbox list LOST 2>/dev/null", out, sizeof out);
  if (rc != 2) fail_msg("inbox list LOST: exit %d, want 2", rc);

  rc = outboxctl("pipelines list --json", out, sizeof out);
  doc = bson_new_from_json((const uint8_t *)out, -1, &berr);
  if (rc != 0 || !doc) fail_msg("pipelines list --json: exit %d, not JSON (%s): %s", rc, doc ? "" : berr.message, out);
  if (!strstr(out, acme_pipe) || !strstr(out, globex_pipe) || !obx_test_doc_str(doc, "pipelines.0.trigger"))
    fail_msg("pipelines list --json: got %s, want %s and %s with their definitions", out, acme_pipe, globex_pipe);
  bson_destroy(doc);
}

/* `--help` stays quiet on stderr even when a killed process of the same pid left the driver's
 * shared-memory segment behind (libmongoc initialises itself before main). */
static void test_outboxctl_help_quiet(void **state) {
  (void)state;
  char err_path[300];
  snprintf(err_path, sizeof err_path, "%s/help-stderr", obx_test_tmpdir());
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char shm[64];
    snprintf(shm, sizeof shm, "/dev/shm/mongoc-%u", (unsigned)getpid());
    FILE *f = fopen(shm, "w"); /* a stale segment of "our" pid */
    if (f) fclose(f);
    if (!freopen(err_path, "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(127);
    execl(obx_test_build_path("outboxctl"), "outboxctl", "outbox", "list", "--help", (char *)NULL);
    _exit(127);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("outbox list --help: status %d", status);
  char *text = obx_test_read_file(err_path);
  if (text && *text) fail_msg("outbox list --help wrote to stderr: %s", text);
  free(text);
}

typedef struct {
  const char *key;
  long want;
} key_status_t;

static bool key_answers(void *p) {
  key_status_t *ks = p;
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(outboxd.port, "GET", "/api/outbox?status=FAILED", ks->key, NULL, NULL, &resp) &&
            resp.status == ks->want;
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

static void set_disabled(const char *hash, bool disabled) {
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(hash));
  bson_t *update = BCON_NEW("$set", "{", "disabled", BCON_BOOL(disabled), "}");
  mongoc_collection_t *c = coll("api_keys");
  bson_error_t berr;
  if (!mongoc_collection_update_one(c, filter, update, NULL, NULL, &berr)) fail_msg("disable %s: %s", hash, berr.message);
  mongoc_collection_destroy(c);
  bson_destroy(update);
  bson_destroy(filter);
}

/* A key stored by `outboxctl apikey new --store db` (only its hash in api_keys) works once
 * outboxd has read api_keys again; disabled it gets 401 after the next refresh, enabled again
 * it works, removed it gets 401. Its permissions and org apply as for a file key. */
static void test_db_keys(void **state) {
  (void)state;
  char out[2048], key[OBX_AUTH_KEY_LEN + 1] = "", hash[OBX_AUTH_HASH_LEN + 1];
  int rc = outboxctl("apikey new --org acme --perm outbox:read --store db", out, sizeof out);
  if (rc != 0 || sscanf(out, "key: %47s", key) != 1) fail_msg("apikey new --store db: exit %d: %s", rc, out);
  obx_auth_hash(key, hash);

  bson_t doc = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(hash));
  if (!find_one("api_keys", filter, &doc)) fail_msg("api_keys has no document %s after: %s", hash, out);
  char *json = bson_as_relaxed_extended_json(&doc, NULL);
  if (strstr(json, key)) fail_msg("api_keys stores the clear key: %s", json);
  bson_free(json);
  assert_string_equal(obx_test_doc_str(&doc, "orgId"), "acme");
  assert_string_equal(obx_test_doc_str(&doc, "permissions.0"), "outbox:read");
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, &doc, "createdAt") && BSON_ITER_HOLDS_DATE_TIME(&it));
  bson_destroy(&doc);

  key_status_t ks = {key, 200};
  if (!obx_test_wait_for(key_answers, &ks, 30000, 100)) fail_msg("the api_keys key never got 200 on GET /api/outbox");
  obx_test_http_resp_t resp;
  request("GET", "/api/outbox?status=FAILED", key, NULL, 200, &resp);
  if (strstr(resp.body, globex_out)) fail_msg("acme's api_keys key sees globex's %s: %s", globex_out, resp.body);
  obx_test_http_resp_cleanup(&resp);
  request("GET", "/api/inbox", key, NULL, 403, &resp); /* its permissions, not more */
  obx_test_http_resp_cleanup(&resp);

  set_disabled(hash, true);
  ks.want = 401;
  if (!obx_test_wait_for(key_answers, &ks, 30000, 100)) fail_msg("a disabled api_keys key still works");
  set_disabled(hash, false);
  ks.want = 200;
  if (!obx_test_wait_for(key_answers, &ks, 30000, 100)) fail_msg("a re-enabled api_keys key never worked again");
  mongoc_collection_t *c = coll("api_keys");
  bson_error_t berr;
  if (!mongoc_collection_delete_one(c, filter, NULL, NULL, &berr)) fail_msg("delete: %s", berr.message);
  mongoc_collection_destroy(c);
  ks.want = 401;
  if (!obx_test_wait_for(key_answers, &ks, 30000, 100)) fail_msg("a removed api_keys key still works");
  bson_destroy(filter);
  /* the file's keys are untouched by the refreshes */
  request("GET", "/api/outbox?status=FAILED", key_globex, NULL, 200, &resp);
  obx_test_http_resp_cleanup(&resp);
}

/* Inserts a key into api_keys as `apikey new --store db` does; the clear key into key. */
static void insert_db_key(const char *org, const char *perm, char key[OBX_AUTH_KEY_LEN + 1]) {
  char hash[OBX_AUTH_HASH_LEN + 1];
  assert_true(obx_auth_key_generate(key, NULL));
  obx_auth_hash(key, hash);
  bson_t *doc = BCON_NEW("_id", BCON_UTF8(hash), "orgId", BCON_UTF8(org), "permissions", "[", BCON_UTF8(perm), "]",
                         "createdAt", BCON_DATE_TIME(obx_time_now_ms()));
  mongoc_collection_t *c = coll("api_keys");
  bson_error_t berr;
  if (!mongoc_collection_insert_one(c, doc, NULL, NULL, &berr)) fail_msg("insert api_keys: %s", berr.message);
  mongoc_collection_destroy(c);
  bson_destroy(doc);
}

typedef struct {
  int port;
  const char *key;
} rate_ctx_t;

static bool rate_key_works(void *p) {
  rate_ctx_t *c = p;
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(c->port, "GET", "/api/outbox?limit=1", c->key, NULL, NULL, &resp) && resp.status == 200;
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

/* The rate limit applies to keys api_keys adds after start (each gets a bucket of its own): with
 * API_RATE_LIMIT=1 (bursts of 2) a burst of 6 requests of the second database key gets 429 with
 * Retry-After, and the first database key, untouched, still gets 200. */
static void test_db_keys_rate_limit(void **state) {
  (void)state;
  char mongo_arg[300], keys_arg[340], k1[OBX_AUTH_KEY_LEN + 1], k2[OBX_AUTH_KEY_LEN + 1];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  char *args[] = {"--roles", "api", "-X", mongo_arg, "-X", keys_arg, "-X", "api.keys_refresh=200ms",
                  "-X", "api.rate_limit=1", NULL};
  obx_test_outboxd_t limited;
  memset(&limited, 0, sizeof limited);
  if (!obx_test_outboxd_start(&limited, args)) fail_msg("rate-limited outboxd did not start");
  insert_db_key("acme", "outbox:read", k1);
  insert_db_key("acme", "outbox:read", k2);
  rate_ctx_t c1 = {limited.port, k1}, c2 = {limited.port, k2};
  if (!obx_test_wait_for(rate_key_works, &c2, 30000, 300) || !obx_test_wait_for(rate_key_works, &c1, 30000, 300))
    fail_msg("the api_keys keys never worked; log: %s", limited.proc.log_path);
  long got429 = 0;
  char retry[16] = "";
  for (int i = 0; i < 6; i++) {
    obx_test_http_resp_t resp;
    assert_true(obx_test_http(limited.port, "GET", "/api/outbox?limit=1", k2, NULL, NULL, &resp));
    if (resp.status == 429 && !got429) {
      got429 = 1;
      obx_test_http_header(&resp, "Retry-After", retry, sizeof retry);
    }
    obx_test_http_resp_cleanup(&resp);
  }
  if (!got429 || atoi(retry) < 1) fail_msg("6 requests at once with API_RATE_LIMIT=1: got 429 %ld, Retry-After '%s'", got429, retry);
  obx_test_http_resp_t resp;
  obx_test_http_expect(limited.port, "GET", "/api/outbox?limit=1", k1, NULL, 200, &resp); /* a bucket of its own */
  obx_test_http_resp_cleanup(&resp);
  int status = obx_test_outboxd_stop(&limited);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("rate-limited outboxd: status 0x%x", status);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_route_table),
    cmocka_unit_test(test_reprocess),
    cmocka_unit_test(test_dlq_redrive_all),
    cmocka_unit_test(test_dry_runs),
    cmocka_unit_test(test_outboxctl_reprocess),
    cmocka_unit_test(test_outboxctl_status),
    cmocka_unit_test(test_outboxctl_status_buckets),
    cmocka_unit_test(test_db_keys),
    cmocka_unit_test(test_db_keys_rate_limit),
    cmocka_unit_test(test_outboxctl_lists),
    cmocka_unit_test(test_outboxctl_help_quiet),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
