/* ops.c - operator actions on the worker's state: DLQ redrive/purge, replays, key release
 *
 * DESIGN: shared by outboxctl and the HTTP API, so both do exactly the same thing and both
 * leave the same audit_log entry (obx_ops_audit, the one writer of audit_log; a key release
 * writes it in the transaction that moves the key). Nothing here runs a pipeline: replays and
 * releases publish the stored event to the work queue (confirmed) and the worker runs it on its
 * key's lane. */
#include <stdlib.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "obx/obx_ops.h"
#include "obx/obx_worker.h"

static bool str_eq(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

bool obx_worker_dlq_match(void *filter, const obx_ladder_msg_t *msg) {
  const obx_worker_dlq_filter_t *f = filter;
  if (f->id && !str_eq(msg->message_id, f->id)) return false;
  if (f->type && !str_eq(obx_ladder_msg_header(msg, "ce_type"), f->type)) return false;
  if (f->org && !str_eq(obx_ladder_msg_header(msg, "ce_orgid"), f->org)) return false;
  if (f->nids > 0) {
    int i = 0;
    while (i < f->nids && !str_eq(msg->message_id, f->ids[i])) i++;
    if (i == f->nids) return false;
  }
  return true;
}

typedef struct {
  obx_ladder_visit_fn visit;
  void *ctx;
  bson_t ids;
  int n;
} redrive_ctx_t;

static bool redrive_visit(void *p, const obx_ladder_msg_t *msg) {
  redrive_ctx_t *r = p;
  char idx[16];
  const char *key;
  bson_uint32_to_string((uint32_t)r->n++, &key, idx, sizeof idx);
  BSON_APPEND_UTF8(&r->ids, key, msg->message_id ? msg->message_id : "");
  return r->visit ? r->visit(r->ctx, msg) : true;
}

/* The ladder hands one context to both match and visit. */
typedef struct {
  const obx_worker_dlq_filter_t *filter;
  redrive_ctx_t *r;
} bridge_t;

static bool bridge_match(void *p, const obx_ladder_msg_t *msg) {
  return obx_worker_dlq_match((void *)((bridge_t *)p)->filter, msg);
}

static bool bridge_visit(void *p, const obx_ladder_msg_t *msg) { return redrive_visit(((bridge_t *)p)->r, msg); }

bool obx_worker_dlq_redrive(const obx_worker_ops_t *ops, const obx_worker_dlq_filter_t *filter, bool dry_run,
                            obx_ladder_visit_fn visit, void *ctx, int *moved, obx_err_t *err) {
  redrive_ctx_t r = {.visit = visit, .ctx = ctx};
  bson_init(&r.ids);
  bridge_t b = {filter, &r};
  int n = 0;
  bool ok = obx_ladder_dlq_redrive(ops->ladder, bridge_match, &b, dry_run, bridge_visit, &n, err);
  if (moved) *moved = n;
  bson_t details = BSON_INITIALIZER;
  BSON_APPEND_BOOL(&details, "dryRun", dry_run);
  if (filter->id) BSON_APPEND_UTF8(&details, "id", filter->id);
  if (filter->type) BSON_APPEND_UTF8(&details, "type", filter->type);
  BSON_APPEND_INT32(&details, "moved", n);
  BSON_APPEND_ARRAY(&details, "ids", &r.ids);
  if (!ok) BSON_APPEND_UTF8(&details, "error", err ? err->msg : "failed");
  const char *target = filter->id ? filter->id : filter->nids == 1 ? filter->ids[0] : filter->type ? filter->type : "*";
  obx_err_t aerr = OBX_ERR_INIT;
  bool audited = obx_ops_audit(ops, NULL, "dlq.redrive", target, filter->org, &details, &aerr);
  if (ok && !audited) {
    if (err) *err = aerr;
    obx_err_prefix(err, "audit_log");
    ok = false;
  }
  bson_destroy(&details);
  bson_destroy(&r.ids);
  return ok;
}

bool obx_worker_dlq_purge(const obx_worker_ops_t *ops, uint32_t *purged, obx_err_t *err) {
  uint32_t n = 0;
  if (!obx_ladder_dlq_purge(ops->ladder, &n, err)) return false;
  if (purged) *purged = n;
  bson_t details = BSON_INITIALIZER;
  BSON_APPEND_INT64(&details, "purged", n);
  bool ok = obx_ops_audit(ops, NULL, "dlq.purge", obx_ladder_dlq_queue(ops->ladder), NULL, &details, err);
  bson_destroy(&details);
  return ok;
}

/* Publishes a stored inbox entry to the work queue. */
static bool publish_entry(const obx_worker_ops_t *ops, const bson_t *doc, bool replay, obx_err_t *err) {
  obx_event_t ev;
  obx_event_init(&ev);
  obx_ladder_msg_t msg;
  obx_ladder_msg_init(&msg);
  bool ok = obx_inbox_entry_event(doc, &ev, err) && obx_ladder_msg_from_event(&msg, &ev, err);
  if (ok) {
    msg.replay = replay;
    ok = obx_ladder_publish_work(ops->ladder, &msg, err);
  }
  obx_ladder_msg_cleanup(&msg);
  obx_event_cleanup(&ev);
  return ok;
}

bool obx_worker_replay_event(const obx_worker_ops_t *ops, const char *event_id, obx_err_t *err) {
  bson_t doc = BSON_INITIALIZER, details = BSON_INITIALIZER;
  bool found = false;
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  bool ok = obx_inbox_get(client, obx_mongo_db_name(ops->mongo), NULL, ops->consumer, event_id, &doc, &found, err);
  obx_mongo_push(ops->mongo, client);
  if (ok && !found) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no inbox entry for event %s of consumer %s", event_id,
                ops->consumer);
    ok = false;
  }
  if (ok) ok = publish_entry(ops, &doc, true, err);
  if (ok) {
    const char *status = obx_mongo_doc_str(&doc, "status");
    if (status) BSON_APPEND_UTF8(&details, "previousStatus", status);
    BSON_APPEND_UTF8(&details, "consumer", ops->consumer);
    ok = obx_ops_audit(ops, NULL, "inbox.replay", event_id, obx_mongo_doc_str(&doc, "orgId"), &details, err);
  }
  bson_destroy(&details);
  bson_destroy(&doc);
  return ok;
}

bool obx_worker_replay_type(const obx_worker_ops_t *ops, const char *event_type, int64_t since_ms, bool dry_run,
                            obx_worker_progress_fn progress, void *ctx, int64_t *count, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, child;
  BSON_APPEND_UTF8(&filter, "_id.consumer", ops->consumer);
  BSON_APPEND_UTF8(&filter, "eventType", event_type);
  BSON_APPEND_DOCUMENT_BEGIN(&filter, "receivedAt", &child);
  BSON_APPEND_DATE_TIME(&child, "$gte", since_ms);
  bson_append_document_end(&filter, &child);
  BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &child);
  BSON_APPEND_INT32(&child, "receivedAt", 1);
  BSON_APPEND_INT32(&child, "seq", 1);
  bson_append_document_end(&opts, &child);
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, "inbox");
  bson_error_t berr;
  int64_t total = mongoc_collection_count_documents(c, &filter, NULL, NULL, NULL, &berr);
  int64_t done = 0;
  bool ok = total >= 0;
  if (!ok) obx_err_from_bson(err, &berr, NULL);
  mongoc_cursor_t *cursor = ok ? mongoc_collection_find_with_opts(c, &filter, &opts, NULL) : NULL;
  const bson_t *doc;
  while (ok && mongoc_cursor_next(cursor, &doc)) {
    if (!dry_run && !publish_entry(ops, doc, true, err)) {
      ok = false;
      break;
    }
    done++;
    if (progress) progress(ctx, done, total > done ? total : done);
  }
  const bson_t *reply = NULL;
  if (ok && cursor && mongoc_cursor_error_document(cursor, &berr, &reply)) {
    obx_err_from_bson(err, &berr, reply);
    ok = false;
  }
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  if (count) *count = done;
  bson_t details = BSON_INITIALIZER;
  char since[32];
  obx_time_format_rfc3339(since_ms, since);
  BSON_APPEND_UTF8(&details, "since", since);
  BSON_APPEND_BOOL(&details, "dryRun", dry_run);
  BSON_APPEND_INT64(&details, "events", done);
  if (!ok) BSON_APPEND_UTF8(&details, "error", err ? err->msg : "failed");
  obx_err_t aerr = OBX_ERR_INIT;
  if (!obx_ops_audit(ops, NULL, "inbox.replay_type", event_type, NULL, &details, &aerr) && ok) {
    if (err) *err = aerr;
    ok = false;
  }
  bson_destroy(&details);
  bson_destroy(&opts);
  bson_destroy(&filter);
  return ok;
}

typedef struct {
  const obx_worker_ops_t *ops;
  const char *key;
  char *next;
  bson_t next_doc; /* the oldest BLOCKED entry, when found */
  bool found;
} release_t;

/* One transaction: the parked key moves to its oldest BLOCKED event (or is unparked) and the
 * audit_log entry is written with it. */
static bool release_txn(mongoc_client_session_t *session, void *p, obx_err_t *err) {
  release_t *r = p;
  const obx_worker_ops_t *ops = r->ops;
  const char *db = obx_mongo_db_name(ops->mongo);
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  bson_t head_doc = BSON_INITIALIZER, details = BSON_INITIALIZER;
  bool parked = false, head_found = false, ok = false;
  char head[OBX_UUID_LEN + 1] = "";
  r->next[0] = '\0';
  bson_reinit(&r->next_doc);
  r->found = false;
  if (!obx_inbox_key_parked(client, db, session, ops->consumer, r->key, &parked, head, err)) goto done;
  if (!parked) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "key %s is not parked for consumer %s", r->key, ops->consumer);
    goto done;
  }
  if (!obx_inbox_next_blocked(client, db, session, ops->consumer, r->key, &r->next_doc, &r->found, err)) goto done;
  const char *org = NULL;
  if (r->found) {
    const char *next = obx_mongo_doc_str(&r->next_doc, "_id.eventId");
    snprintf(r->next, OBX_UUID_LEN + 1, "%s", next ? next : "");
    org = obx_mongo_doc_str(&r->next_doc, "orgId");
    /* The oldest blocked event becomes the head, so the worker releases the rest after it. */
    if (!obx_inbox_park_key(client, db, session, ops->consumer, r->key, r->next, "released by an operator", err))
      goto done;
  } else {
    if (head[0] && !obx_inbox_get(client, db, session, ops->consumer, head, &head_doc, &head_found, err)) goto done;
    if (head_found) org = obx_mongo_doc_str(&head_doc, "orgId");
    if (!obx_inbox_unpark_key(client, db, session, ops->consumer, r->key, err)) goto done;
  }
  BSON_APPEND_UTF8(&details, "consumer", ops->consumer);
  BSON_APPEND_UTF8(&details, "previousHead", head);
  BSON_APPEND_UTF8(&details, "nextEvent", r->next);
  ok = obx_ops_audit(ops, session, "keys.release", r->key, org, &details, err);
done:
  bson_destroy(&details);
  bson_destroy(&head_doc);
  return ok;
}

bool obx_worker_key_release(const obx_worker_ops_t *ops, const char *key, char next[OBX_UUID_LEN + 1],
                            obx_err_t *err) {
  release_t r = {.ops = ops, .key = key, .next = next};
  bson_init(&r.next_doc);
  next[0] = '\0';
  /* Published after the commit: when the publish fails the key stays parked on `next`, still
   * BLOCKED, and the same release picks it again. */
  bool ok = obx_mongo_transaction(ops->mongo, release_txn, &r, err) &&
            (!r.found || publish_entry(ops, &r.next_doc, false, err));
  bson_destroy(&r.next_doc);
  return ok;
}
