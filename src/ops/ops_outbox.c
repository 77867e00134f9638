/* ops_outbox.c - the outbox and inbox listings and counts, and outbox reprocess and skip
 *
 * DESIGN: see obx_ops.h. Reads MongoDB through ops->mongo (one client popped per call).
 * Reprocess is one transaction that updates the event and appends its audit_log entry; its
 * dry run reads the event and checks the same conditions without writing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "ops/ops_int.h"

static const char *const outbox_statuses[] = {"PENDING", "PUBLISHED", "FAILED", "SKIPPED"};
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

bool obx_ops_list(const obx_ops_t *ops, obx_ops_store_t store, const char *org, const char *status,
                  const obx_ops_page_t *page, bson_t *out, obx_err_t *err) {
  if (status && !obx_ops_status_check(store, status, err)) return false;
  bson_t filter = BSON_INITIALIZER, projection = BSON_INITIALIZER;
  store_filter(ops, store, org, status, &filter);
  if (store == OBX_OPS_INBOX) {
    BSON_APPEND_INT32(&projection, "payload", 0);
    BSON_APPEND_INT32(&projection, "headers", 0);
  }
  bool ok = store == OBX_OPS_OUTBOX
              ? ops_find_page(ops, "outbox", &filter, "occurredAt", "_id", -1, NULL, page, out, err)
              : ops_find_page(ops, "inbox", &filter, "receivedAt", "_id.eventId", -1, &projection, page, out, err);
  bson_destroy(&projection);
  bson_destroy(&filter);
  return ok;
}

bool ops_counts_with(const obx_ops_t *ops, mongoc_client_t *client, obx_ops_store_t store, const char *org,
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
  bool ok = obx_mongo_cursor_end(cursor, err);
  for (int i = 0; ok && i < store_nstatuses(store); i++) BSON_APPEND_INT64(out, store_status(store, i), n[i]);
  mongoc_collection_destroy(c);
  bson_destroy(pipeline);
  bson_destroy(&match);
  return ok;
}

bool obx_ops_counts(const obx_ops_t *ops, obx_ops_store_t store, const char *org, bson_t *out, obx_err_t *err) {
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  bool ok = ops_counts_with(ops, client, store, org, out, err);
  obx_mongo_push(ops->mongo, client);
  return ok;
}

/* ---- reprocess ---------------------------------------------------------------------------- */

typedef struct {
  const obx_ops_t *ops;
  const char *org, *id;
  bool dry_run;
  bson_t *out;
  bool skip;   /* FAILED -> SKIPPED (the relay releases its key) instead of -> PENDING */
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
    obx_err_set(err, OBX_ERR_CONFLICT, 0, false, "outbox event %s is %s, only FAILED events are %s", r->id,
                status ? status : "without status", r->skip ? "skipped" : "reprocessed");
    goto done;
  }
  bson_iter_t it;
  int64_t attempts = bson_iter_init_find(&it, &doc, "attempts") && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
  const char *last_error = obx_mongo_doc_str(&doc, "lastError");
  if (r->dry_run) {
    if (r->out) {
      bson_reinit(r->out);
      bson_concat(r->out, &doc);
    }
    ok = true;
    goto done;
  }

  BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
  if (r->skip) {
    BSON_APPEND_UTF8(&set, "status", "SKIPPED");
  } else {
    BSON_APPEND_UTF8(&set, "status", "PENDING");
    BSON_APPEND_INT32(&set, "attempts", 0);
    BSON_APPEND_DATE_TIME(&set, "availableAt", now);
    BSON_APPEND_NULL(&set, "lastError");
  }
  bson_append_document_end(&update, &set);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$push", &push);
  BSON_APPEND_DOCUMENT_BEGIN(&push, "history", &hist);
  BSON_APPEND_DATE_TIME(&hist, "at", now);
  BSON_APPEND_UTF8(&hist, "action", r->skip ? "skip" : "reprocess");
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
  if (!obx_ops_audit(ops, session, r->skip ? "outbox.skip" : "outbox.reprocess", r->id, obx_mongo_doc_str(&doc, "orgId"), &details, err))
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

bool obx_ops_outbox_reprocess(const obx_ops_t *ops, const char *org, const char *id, bool dry_run, bson_t *out,
                              obx_err_t *err) {
  reprocess_t r = {ops, org, id, dry_run, out, false};
  return obx_mongo_transaction(ops->mongo, reprocess_txn, &r, err);
}

bool obx_ops_outbox_skip(const obx_ops_t *ops, const char *org, const char *id, bool dry_run, bson_t *out,
                         obx_err_t *err) {
  reprocess_t r = {ops, org, id, dry_run, out, true};
  return obx_mongo_transaction(ops->mongo, reprocess_txn, &r, err);
}

