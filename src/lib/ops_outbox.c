/* ops_outbox.c - operator operations: outbox/inbox listings and counts, outbox reprocess,
 * org-scoped inbox replay and DLQ browse/redrive, system status
 *
 * DESIGN: see obx_ops.h. Shared by src/api/ops_routes.c and src/ctl/{outbox,status}.c. Reads
 * MongoDB through ops->mongo (one client popped per call) and RabbitMQ through ops->ladder;
 * the worker's operations (src/worker/ops.c) do the inbox replays and the DLQ moves, this file
 * only adds the org checks in front of them. Reprocess is the only write made here: one
 * transaction updates the event and appends its audit_log entry. obx_ops_audit is the one
 * writer of audit_log entries, for these operations and the worker's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"

#define OPS_RELAY_LEASE_ID "relay"       /* leases._id of the relay (src/relay/relay_int.h) */
#define OPS_RELAY_CHECKPOINT_ID "outbox" /* relay_checkpoints._id */

static const char *const outbox_statuses[] = {"PENDING", "PUBLISHED", "FAILED"};
#define NOUTBOX_STATUSES ((int)(sizeof outbox_statuses / sizeof outbox_statuses[0]))
#define NINBOX_STATUSES ((int)OBX_INBOX_SKIPPED + 1)

const char *obx_ops_store_name(obx_ops_store_t store) { return store == OBX_OPS_OUTBOX ? "outbox" : "inbox"; }

static int store_nstatuses(obx_ops_store_t store) { return store == OBX_OPS_OUTBOX ? NOUTBOX_STATUSES : NINBOX_STATUSES; }

static const char *store_status(obx_ops_store_t store, int i) {
  return store == OBX_OPS_OUTBOX ? outbox_statuses[i] : obx_inbox_status_name((obx_inbox_status_t)i);
}

bool obx_ops_status_check(obx_ops_store_t store, const char *status, obx_err_t *err) {
  char names[160] = "";
  for (int i = 0; i < store_nstatuses(store); i++) {
    if (strcmp(status, store_status(store, i)) == 0) return true;
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", store_status(store, i));
  }
  obx_err_set(err, OBX_ERR_INPUT, 0, false, "unknown %s status \"%s\" (one of %s)", obx_ops_store_name(store), status,
              names);
  return false;
}

/* The filter selecting a store's documents of org (NULL: all) and status (NULL: any). */
static void store_filter(const obx_ops_t *ops, obx_ops_store_t store, const char *org, const char *status,
                         bson_t *filter) {
  if (store == OBX_OPS_INBOX) BSON_APPEND_UTF8(filter, "_id.consumer", ops->consumer);
  if (org) BSON_APPEND_UTF8(filter, "orgId", org);
  if (status) BSON_APPEND_UTF8(filter, "status", status);
}

bool obx_ops_list(const obx_ops_t *ops, obx_ops_store_t store, const char *org, const char *status, int limit,
                  bson_t *out, obx_err_t *err) {
  if (limit == 0) limit = OBX_OPS_DEFAULT_LIMIT;
  if (limit < 1 || limit > OBX_OPS_MAX_LIMIT) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "limit must be from 1 to %d", OBX_OPS_MAX_LIMIT);
    return false;
  }
  if (status && !obx_ops_status_check(store, status, err)) return false;
  bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, child, items;
  store_filter(ops, store, org, status, &filter);
  BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &child);
  BSON_APPEND_INT32(&child, store == OBX_OPS_OUTBOX ? "occurredAt" : "receivedAt", -1);
  BSON_APPEND_INT32(&child, "_id", -1);
  bson_append_document_end(&opts, &child);
  BSON_APPEND_INT64(&opts, "limit", limit);
  if (store == OBX_OPS_INBOX) {
    BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &child);
    BSON_APPEND_INT32(&child, "payload", 0);
    BSON_APPEND_INT32(&child, "headers", 0);
    bson_append_document_end(&opts, &child);
  }
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, obx_ops_store_name(store));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, &opts, NULL);
  const bson_t *doc;
  int n = 0;
  BSON_APPEND_ARRAY_BEGIN(out, "items", &items);
  while (mongoc_cursor_next(cursor, &doc)) {
    char idx[16];
    const char *key;
    bson_uint32_to_string((uint32_t)n++, &key, idx, sizeof idx);
    BSON_APPEND_DOCUMENT(&items, key, doc);
  }
  bson_append_array_end(out, &items);
  BSON_APPEND_INT32(out, "count", n);
  BSON_APPEND_INT32(out, "limit", limit);
  bson_error_t berr;
  const bson_t *reply = NULL;
  bool ok = !mongoc_cursor_error_document(cursor, &berr, &reply);
  if (!ok) obx_err_from_bson(err, &berr, reply);
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  bson_destroy(&opts);
  bson_destroy(&filter);
  return ok;
}

/* Counts by status on a popped client. */
static bool counts_with(const obx_ops_t *ops, mongoc_client_t *client, obx_ops_store_t store, const char *org,
                        bson_t *out, obx_err_t *err) {
  int64_t n[NINBOX_STATUSES > NOUTBOX_STATUSES ? NINBOX_STATUSES : NOUTBOX_STATUSES] = {0};
  bson_t match = BSON_INITIALIZER;
  store_filter(ops, store, org, NULL, &match);
  bson_t *pipeline = BCON_NEW("pipeline", "[", "{", "$match", BCON_DOCUMENT(&match), "}", "{", "$group", "{", "_id",
                              BCON_UTF8("$status"), "n", "{", "$sum", BCON_INT32(1), "}", "}", "}", "]");
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, obx_ops_store_name(store));
  mongoc_cursor_t *cursor = mongoc_collection_aggregate(c, MONGOC_QUERY_NONE, pipeline, NULL, NULL);
  const bson_t *doc;
  while (mongoc_cursor_next(cursor, &doc)) {
    bson_iter_t id, cnt;
    if (!bson_iter_init_find(&id, doc, "_id") || !BSON_ITER_HOLDS_UTF8(&id) || !bson_iter_init_find(&cnt, doc, "n"))
      continue;
    for (int i = 0; i < store_nstatuses(store); i++)
      if (strcmp(bson_iter_utf8(&id, NULL), store_status(store, i)) == 0) n[i] = bson_iter_as_int64(&cnt);
  }
  bson_error_t berr;
  const bson_t *reply = NULL;
  bool ok = !mongoc_cursor_error_document(cursor, &berr, &reply);
  if (!ok) obx_err_from_bson(err, &berr, reply);
  for (int i = 0; ok && i < store_nstatuses(store); i++) BSON_APPEND_INT64(out, store_status(store, i), n[i]);
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  bson_destroy(pipeline);
  bson_destroy(&match);
  return ok;
}

bool obx_ops_counts(const obx_ops_t *ops, obx_ops_store_t store, const char *org, bson_t *out, obx_err_t *err) {
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  bool ok = counts_with(ops, client, store, org, out, err);
  obx_mongo_push(ops->mongo, client);
  return ok;
}

/* ---- audit_log ---------------------------------------------------------------------------- */

bool obx_ops_audit(const obx_ops_t *ops, mongoc_client_session_t *session, const char *action, const char *target,
                   const char *org, const bson_t *details, obx_err_t *err) {
  char id[OBX_UUID_LEN + 1];
  obx_uuid7(id);
  bson_t entry = BSON_INITIALIZER, opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&entry, "_id", id);
  BSON_APPEND_UTF8(&entry, "who", ops->who && ops->who[0] ? ops->who : "unknown");
  BSON_APPEND_DATE_TIME(&entry, "when", obx_time_now_ms());
  BSON_APPEND_UTF8(&entry, "action", action);
  BSON_APPEND_UTF8(&entry, "target", target ? target : "");
  if (org) BSON_APPEND_UTF8(&entry, "orgId", org);
  else BSON_APPEND_NULL(&entry, "orgId");
  if (details) BSON_APPEND_DOCUMENT(&entry, "details", details);
  mongoc_client_t *client = session ? mongoc_client_session_get_client(session) : obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, "audit_log");
  bson_error_t berr;
  bool ok = (!session || mongoc_client_session_append(session, &opts, &berr)) &&
            mongoc_collection_insert_one(c, &entry, &opts, &reply, &berr);
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  mongoc_collection_destroy(c);
  if (!session) obx_mongo_push(ops->mongo, client);
  bson_destroy(&reply);
  bson_destroy(&opts);
  bson_destroy(&entry);
  return ok;
}

/* ---- reprocess ---------------------------------------------------------------------------- */

typedef struct {
  const obx_ops_t *ops;
  const char *org, *id;
  bson_t *out;
} reprocess_t;

static bool reprocess_txn(mongoc_client_session_t *session, void *p, obx_err_t *err) {
  reprocess_t *r = p;
  const obx_ops_t *ops = r->ops;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  mongoc_collection_t *outbox = obx_mongo_collection(ops->mongo, client, "outbox");
  bson_t filter = BSON_INITIALIZER, doc = BSON_INITIALIZER, opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  bson_t update = BSON_INITIALIZER, set, push, hist, details = BSON_INITIALIZER;
  bson_error_t berr;
  bool found = false, ok = false;
  int64_t now = obx_time_now_ms();
  const char *who = ops->who && *ops->who ? ops->who : "unknown";

  BSON_APPEND_UTF8(&filter, "_id", r->id);
  if (r->org) BSON_APPEND_UTF8(&filter, "orgId", r->org);
  if (!obx_mongo_find_one(outbox, &filter, NULL, session, &doc, &found, err)) goto done;
  if (!found) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no outbox event %s", r->id);
    goto done;
  }
  const char *status = obx_mongo_doc_str(&doc, "status");
  if (!status || strcmp(status, "FAILED") != 0) {
    obx_err_set(err, OBX_ERR_CONFLICT, 0, false, "outbox event %s is %s, only FAILED events are reprocessed", r->id,
                status ? status : "without status");
    goto done;
  }
  bson_iter_t it;
  int64_t attempts = bson_iter_init_find(&it, &doc, "attempts") && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
  const char *last_error = obx_mongo_doc_str(&doc, "lastError");

  BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
  BSON_APPEND_UTF8(&set, "status", "PENDING");
  BSON_APPEND_INT32(&set, "attempts", 0);
  BSON_APPEND_DATE_TIME(&set, "availableAt", now);
  BSON_APPEND_NULL(&set, "lastError");
  bson_append_document_end(&update, &set);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$push", &push);
  BSON_APPEND_DOCUMENT_BEGIN(&push, "history", &hist);
  BSON_APPEND_DATE_TIME(&hist, "at", now);
  BSON_APPEND_UTF8(&hist, "action", "reprocess");
  BSON_APPEND_INT64(&hist, "attempts", attempts);
  if (last_error) BSON_APPEND_UTF8(&hist, "lastError", last_error);
  else BSON_APPEND_NULL(&hist, "lastError");
  BSON_APPEND_UTF8(&hist, "by", who);
  bson_append_document_end(&push, &hist);
  bson_append_document_end(&update, &push);
  BSON_APPEND_UTF8(&filter, "status", "FAILED");
  if (!mongoc_client_session_append(session, &opts, &berr) ||
      !mongoc_collection_update_one(outbox, &filter, &update, &opts, &reply, &berr)) {
    obx_err_from_bson(err, &berr, &reply);
    goto done;
  }

  BSON_APPEND_UTF8(&details, "previousStatus", "FAILED");
  BSON_APPEND_INT64(&details, "attempts", attempts);
  if (last_error) BSON_APPEND_UTF8(&details, "lastError", last_error);
  if (!obx_ops_audit(ops, session, "outbox.reprocess", r->id, obx_mongo_doc_str(&doc, "orgId"), &details, err))
    goto done;
  if (r->out) {
    bson_reinit(r->out);
    bson_t by_id = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&by_id, "_id", r->id);
    ok = obx_mongo_find_one(outbox, &by_id, NULL, session, r->out, &found, err);
    bson_destroy(&by_id);
  } else {
    ok = true;
  }
done:
  bson_destroy(&details);
  bson_destroy(&update);
  bson_destroy(&reply);
  bson_destroy(&opts);
  bson_destroy(&doc);
  bson_destroy(&filter);
  mongoc_collection_destroy(outbox);
  return ok;
}

bool obx_ops_outbox_reprocess(const obx_ops_t *ops, const char *org, const char *id, bson_t *out, obx_err_t *err) {
  reprocess_t r = {ops, org, id, out};
  return obx_mongo_transaction(ops->mongo, reprocess_txn, &r, err);
}

/* ---- inbox replay ------------------------------------------------------------------------- */

bool obx_ops_inbox_replay(const obx_ops_t *ops, const char *org, const char *event_id, obx_err_t *err) {
  bson_t doc = BSON_INITIALIZER;
  bool found = false;
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  bool ok = obx_inbox_get(client, obx_mongo_db_name(ops->mongo), NULL, ops->consumer, event_id, &doc, &found, err);
  obx_mongo_push(ops->mongo, client);
  if (ok && found && org) {
    const char *entry_org = obx_mongo_doc_str(&doc, "orgId");
    found = entry_org && strcmp(entry_org, org) == 0;
  }
  if (ok && !found) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no inbox entry for event %s", event_id);
    ok = false;
  }
  bson_destroy(&doc);
  return ok && obx_worker_replay_event(ops, event_id, err);
}

/* ---- DLQ ---------------------------------------------------------------------------------- */

const char *obx_ops_dlq_msg_org(const obx_ladder_msg_t *msg) { return obx_ladder_msg_header(msg, "ce_orgid"); }

void obx_ops_dlq_msg_to_bson(const obx_ladder_msg_t *msg, bson_t *out) {
  bson_t headers;
  const char *type = obx_ladder_msg_header(msg, "ce_type"), *org = obx_ops_dlq_msg_org(msg);
  BSON_APPEND_UTF8(out, "id", msg->message_id ? msg->message_id : "");
  if (type) BSON_APPEND_UTF8(out, "type", type);
  if (msg->key) bson_append_utf8(out, "key", -1, msg->key, (int)msg->key_len);
  if (org) BSON_APPEND_UTF8(out, "orgId", org);
  BSON_APPEND_INT32(out, "attempts", msg->attempt);
  if (msg->failure_class) BSON_APPEND_UTF8(out, "failureClass", msg->failure_class);
  if (msg->reason) BSON_APPEND_UTF8(out, "reason", msg->reason);
  if (msg->last_error) BSON_APPEND_UTF8(out, "lastError", msg->last_error);
  if (msg->first_failure_ms) BSON_APPEND_DATE_TIME(out, "firstFailureAt", msg->first_failure_ms);
  if (msg->source) BSON_APPEND_UTF8(out, "source", msg->source);
  BSON_APPEND_DOCUMENT_BEGIN(out, "headers", &headers);
  for (int i = 0; i < msg->nheaders; i++) BSON_APPEND_UTF8(&headers, msg->headers[i].name, msg->headers[i].value);
  bson_append_document_end(out, &headers);
  /* history is a JSON array: parse it inside a wrapper document to keep it structured */
  char *wrapped = msg->history ? bson_strdup_printf("{\"h\": %s}", msg->history) : NULL;
  bson_t *parsed = wrapped ? bson_new_from_json((const uint8_t *)wrapped, -1, NULL) : NULL;
  bson_iter_t it;
  if (parsed && bson_iter_init_find(&it, parsed, "h") && BSON_ITER_HOLDS_ARRAY(&it))
    bson_append_iter(out, "history", -1, &it);
  bson_destroy(parsed);
  bson_free(wrapped);
  bson_append_utf8(out, "body", -1, msg->body ? msg->body : "", msg->body ? (int)msg->body_len : 0);
}

/* One DLQ pass: the filter first, so the ladder's shared context works for
 * obx_worker_dlq_match as well as for the visits. */
typedef struct {
  obx_worker_dlq_filter_t filter;
  bson_t *items; /* list */
  int n;
  char **ids;    /* ids seen (redrive) */
  int nids, cap;
} dlq_scan_t;

static bool dlq_list_visit(void *p, const obx_ladder_msg_t *msg) {
  dlq_scan_t *s = p;
  char idx[16];
  const char *key;
  bson_t item;
  bson_uint32_to_string((uint32_t)s->n++, &key, idx, sizeof idx);
  BSON_APPEND_DOCUMENT_BEGIN(s->items, key, &item);
  obx_ops_dlq_msg_to_bson(msg, &item);
  bson_append_document_end(s->items, &item);
  return true;
}

static bool dlq_ids_visit(void *p, const obx_ladder_msg_t *msg) {
  dlq_scan_t *s = p;
  if (!msg->message_id) return true;
  if (s->nids == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 16;
    s->ids = realloc(s->ids, (size_t)s->cap * sizeof *s->ids);
  }
  s->ids[s->nids++] = strdup(msg->message_id);
  return true;
}

static void dlq_ids_clear(dlq_scan_t *s) {
  for (int i = 0; i < s->nids; i++) free(s->ids[i]);
  s->nids = 0;
}

static bool dlq_need_ladder(const obx_ops_t *ops, obx_err_t *err) {
  if (ops->ladder) return true;
  obx_err_set(err, OBX_ERR_AMQP, 0, true, "RabbitMQ is not configured");
  return false;
}

bool obx_ops_dlq_list(const obx_ops_t *ops, const char *org, int limit, bson_t *out, obx_err_t *err) {
  if (!dlq_need_ladder(ops, err)) return false;
  if (limit < 0 || limit > OBX_OPS_MAX_LIMIT) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "limit must be from 1 to %d", OBX_OPS_MAX_LIMIT);
    return false;
  }
  bson_t items;
  BSON_APPEND_ARRAY_BEGIN(out, "items", &items);
  dlq_scan_t s = {.filter = {.org = org}, .items = &items};
  bool ok = obx_ladder_dlq_browse(ops->ladder, limit ? limit : OBX_OPS_DEFAULT_LIMIT, obx_worker_dlq_match,
                                  dlq_list_visit, &s, err);
  bson_append_array_end(out, &items);
  BSON_APPEND_INT32(out, "count", s.n);
  return ok;
}

static bool ids_has(const dlq_scan_t *s, const char *id) {
  for (int i = 0; i < s->nids; i++)
    if (strcmp(s->ids[i], id) == 0) return true;
  return false;
}

static void append_ids(bson_t *out, const char *const *ids, int n) {
  bson_t arr;
  BSON_APPEND_ARRAY_BEGIN(out, "ids", &arr);
  for (int i = 0; i < n; i++) {
    char idx[16];
    const char *key;
    bson_uint32_to_string((uint32_t)i, &key, idx, sizeof idx);
    BSON_APPEND_UTF8(&arr, key, ids[i]);
  }
  bson_append_array_end(out, &arr);
}

bool obx_ops_dlq_redrive(const obx_ops_t *ops, const char *org, const char *const *ids, int nids, bool all,
                         bool dry_run, bson_t *out, obx_err_t *err) {
  if (!dlq_need_ladder(ops, err)) return false;
  if (all == (nids > 0)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "choose the message ids or all");
    return false;
  }
  dlq_scan_t s = {.filter = {.org = org, .ids = all ? NULL : ids, .nids = all ? 0 : nids}};
  int moved = 0;
  bool ok = true;
  if (!all) { /* every id asked for must be the org's and in the DLQ before anything moves */
    ok = obx_ladder_dlq_browse(ops->ladder, 0, obx_worker_dlq_match, dlq_ids_visit, &s, err);
    for (int i = 0; ok && i < nids; i++) {
      if (!ids_has(&s, ids[i])) {
        obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no DLQ message %s", ids[i]);
        ok = false;
      }
    }
    dlq_ids_clear(&s);
  }
  ok = ok && obx_worker_dlq_redrive(ops, &s.filter, dry_run, dlq_ids_visit, &s, &moved, err);
  if (ok) {
    BSON_APPEND_BOOL(out, "dryRun", dry_run);
    BSON_APPEND_INT32(out, "moved", moved);
    append_ids(out, (const char *const *)s.ids, s.nids);
  }
  dlq_ids_clear(&s);
  free(s.ids);
  return ok;
}

/* ---- status ------------------------------------------------------------------------------- */

static void append_age(bson_t *out, const char *at_field, const char *age_field, const bson_t *doc, const char *src,
                       int64_t now) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, doc, src) && BSON_ITER_HOLDS_DATE_TIME(&it)) {
    int64_t at = bson_iter_date_time(&it);
    BSON_APPEND_DATE_TIME(out, at_field, at);
    if (age_field) BSON_APPEND_INT64(out, age_field, now > at ? now - at : 0);
  } else {
    BSON_APPEND_NULL(out, at_field);
    if (age_field) BSON_APPEND_NULL(out, age_field);
  }
}

static bool status_relay(const obx_ops_t *ops, mongoc_client_t *client, bson_t *relay, obx_err_t *err) {
  int64_t now = obx_time_now_ms();
  bson_t lease = BSON_INITIALIZER, ckpt = BSON_INITIALIZER, oldest = BSON_INITIALIZER;
  bson_t *lease_q = BCON_NEW("_id", BCON_UTF8(OPS_RELAY_LEASE_ID));
  bson_t *ckpt_q = BCON_NEW("_id", BCON_UTF8(OPS_RELAY_CHECKPOINT_ID));
  bson_t *due_q = BCON_NEW("status", BCON_UTF8("PENDING"), "availableAt", "{", "$lte", BCON_DATE_TIME(now), "}");
  bson_t *pending_q = BCON_NEW("status", BCON_UTF8("PENDING"));
  bson_t *sort = BCON_NEW("occurredAt", BCON_INT32(1));
  mongoc_collection_t *leases = obx_mongo_collection(ops->mongo, client, "leases");
  mongoc_collection_t *ckpts = obx_mongo_collection(ops->mongo, client, "relay_checkpoints");
  mongoc_collection_t *outbox = obx_mongo_collection(ops->mongo, client, "outbox");
  bool has_lease = false, has_ckpt = false, has_oldest = false;
  bson_error_t berr;
  bool ok = obx_mongo_find_one(leases, lease_q, NULL, NULL, &lease, &has_lease, err) &&
            obx_mongo_find_one(ckpts, ckpt_q, NULL, NULL, &ckpt, &has_ckpt, err) &&
            obx_mongo_find_one(outbox, due_q, sort, NULL, &oldest, &has_oldest, err);
  int64_t pending = ok ? mongoc_collection_count_documents(outbox, pending_q, NULL, NULL, NULL, &berr) : 0;
  if (ok && pending < 0) {
    obx_err_from_bson(err, &berr, NULL);
    ok = false;
  }
  if (ok) {
    const char *owner = has_lease ? obx_mongo_doc_str(&lease, "owner") : NULL;
    bson_iter_t it;
    int64_t expires = bson_iter_init_find(&it, &lease, "expiresAt") && BSON_ITER_HOLDS_DATE_TIME(&it)
                        ? bson_iter_date_time(&it) : 0;
    if (owner && expires > now) BSON_APPEND_UTF8(relay, "leader", owner);
    else BSON_APPEND_NULL(relay, "leader");
    if (bson_iter_init_find(&it, &lease, "epoch") && BSON_ITER_HOLDS_NUMBER(&it))
      BSON_APPEND_INT64(relay, "epoch", bson_iter_as_int64(&it));
    append_age(relay, "leaseExpiresAt", NULL, &lease, "expiresAt", now);
    append_age(relay, "checkpointAt", "checkpointAgeMs", &ckpt, "updatedAt", now);
    BSON_APPEND_INT64(relay, "pending", pending);
    if (has_oldest) {
      append_age(relay, "oldestPendingAt", "lagMs", &oldest, "occurredAt", now);
    } else {
      BSON_APPEND_NULL(relay, "oldestPendingAt");
      BSON_APPEND_INT64(relay, "lagMs", 0);
    }
  }
  mongoc_collection_destroy(outbox);
  mongoc_collection_destroy(ckpts);
  mongoc_collection_destroy(leases);
  bson_destroy(sort);
  bson_destroy(pending_q);
  bson_destroy(due_q);
  bson_destroy(ckpt_q);
  bson_destroy(lease_q);
  bson_destroy(&oldest);
  bson_destroy(&ckpt);
  bson_destroy(&lease);
  return ok;
}

bool obx_ops_status(const obx_ops_t *ops, bson_t *out, obx_err_t *err) {
  bson_t relay, outbox, inbox, dlq;
  int64_t parked = 0;
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  BSON_APPEND_DOCUMENT_BEGIN(out, "relay", &relay);
  bool ok = status_relay(ops, client, &relay, err);
  bson_append_document_end(out, &relay);
  BSON_APPEND_DOCUMENT_BEGIN(out, "outbox", &outbox);
  ok = ok && counts_with(ops, client, OBX_OPS_OUTBOX, NULL, &outbox, err);
  bson_append_document_end(out, &outbox);
  BSON_APPEND_DOCUMENT_BEGIN(out, "inbox", &inbox);
  ok = ok && counts_with(ops, client, OBX_OPS_INBOX, NULL, &inbox, err);
  bson_append_document_end(out, &inbox);
  ok = ok && obx_inbox_count_parked(client, obx_mongo_db_name(ops->mongo), ops->consumer, &parked, err);
  obx_mongo_push(ops->mongo, client);
  if (!ok) return false;
  BSON_APPEND_DOCUMENT_BEGIN(out, "dlq", &dlq);
  uint32_t depth = 0;
  obx_err_t qerr = OBX_ERR_INIT;
  if (dlq_need_ladder(ops, &qerr) && obx_ladder_queue_depth(ops->ladder, obx_ladder_dlq_queue(ops->ladder), &depth, &qerr)) {
    BSON_APPEND_INT64(&dlq, "depth", depth);
  } else {
    BSON_APPEND_NULL(&dlq, "depth");
    BSON_APPEND_UTF8(&dlq, "error", qerr.msg);
  }
  bson_append_document_end(out, &dlq);
  BSON_APPEND_INT64(out, "parkedKeys", parked);
  return true;
}
