/* ops.c - operator actions on the worker's state: DLQ redrive/purge, replays, key release
 *
 * DESIGN: shared by outboxctl and the HTTP API, so both do exactly the same thing and both
 * leave the same audit_log entry. Nothing here runs a pipeline: replays and releases publish
 * the stored event to the work queue (confirmed) and the worker runs it on its key's lane. */
#include <stdlib.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "obx/obx_worker.h"

bool obx_worker_audit(const obx_worker_ops_t *ops, const char *action, const char *target, const bson_t *details,
                      obx_err_t *err) {
  char id[OBX_UUID_LEN + 1];
  obx_uuid7(id);
  bson_t doc = BSON_INITIALIZER, reply;
  BSON_APPEND_UTF8(&doc, "_id", id);
  BSON_APPEND_UTF8(&doc, "who", ops->who && ops->who[0] ? ops->who : "unknown");
  BSON_APPEND_DATE_TIME(&doc, "when", obx_time_now_ms());
  BSON_APPEND_UTF8(&doc, "action", action);
  BSON_APPEND_UTF8(&doc, "target", target ? target : "");
  if (details) BSON_APPEND_DOCUMENT(&doc, "details", details);
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, "audit_log");
  bson_error_t berr;
  bool ok = mongoc_collection_insert_one(c, &doc, NULL, &reply, &berr);
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  bson_destroy(&reply);
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  bson_destroy(&doc);
  return ok;
}

bool obx_worker_dlq_match(void *filter, const obx_ladder_msg_t *msg) {
  const obx_worker_dlq_filter_t *f = filter;
  if (f->id && (!msg->message_id || strcmp(msg->message_id, f->id) != 0)) return false;
  if (f->type) {
    const char *type = obx_ladder_msg_header(msg, "ce_type");
    if (!type || strcmp(type, f->type) != 0) return false;
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
  obx_err_t aerr = OBX_ERR_INIT;
  bool audited = obx_worker_audit(ops, "dlq.redrive", filter->id ? filter->id : filter->type ? filter->type : "*",
                                  &details, &aerr);
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
  bool ok = obx_worker_audit(ops, "dlq.purge", obx_ladder_dlq_queue(ops->ladder), &details, err);
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
    bson_iter_t it;
    if (bson_iter_init_find(&it, &doc, "status") && BSON_ITER_HOLDS_UTF8(&it))
      BSON_APPEND_UTF8(&details, "previousStatus", bson_iter_utf8(&it, NULL));
    BSON_APPEND_UTF8(&details, "consumer", ops->consumer);
    ok = obx_worker_audit(ops, "inbox.replay", event_id, &details, err);
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
  if (!obx_worker_audit(ops, "inbox.replay_type", event_type, &details, &aerr) && ok) {
    if (err) *err = aerr;
    ok = false;
  }
  bson_destroy(&details);
  bson_destroy(&opts);
  bson_destroy(&filter);
  return ok;
}

bool obx_worker_key_release(const obx_worker_ops_t *ops, const char *key, char next[OBX_UUID_LEN + 1],
                            obx_err_t *err) {
  const char *db = obx_mongo_db_name(ops->mongo);
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  bson_t doc = BSON_INITIALIZER, details = BSON_INITIALIZER;
  bool parked = false, found = false;
  char head[OBX_UUID_LEN + 1] = "";
  next[0] = '\0';
  bool ok = obx_inbox_key_parked(client, db, NULL, ops->consumer, key, &parked, head, err);
  if (ok && !parked) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "key %s is not parked for consumer %s", key, ops->consumer);
    ok = false;
  }
  if (ok) ok = obx_inbox_next_blocked(client, db, NULL, ops->consumer, key, &doc, &found, err);
  if (ok && found) {
    bson_iter_t it, d;
    if (bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "_id.eventId", &d) && BSON_ITER_HOLDS_UTF8(&d))
      snprintf(next, OBX_UUID_LEN + 1, "%s", bson_iter_utf8(&d, NULL));
    /* The oldest blocked event becomes the head, so the worker releases the rest after it. */
    ok = obx_inbox_park_key(client, db, NULL, ops->consumer, key, next, "released by an operator", err) &&
         publish_entry(ops, &doc, false, err);
  } else if (ok) {
    ok = obx_inbox_unpark_key(client, db, NULL, ops->consumer, key, err);
  }
  obx_mongo_push(ops->mongo, client);
  if (ok) {
    BSON_APPEND_UTF8(&details, "consumer", ops->consumer);
    BSON_APPEND_UTF8(&details, "previousHead", head);
    BSON_APPEND_UTF8(&details, "nextEvent", next);
    ok = obx_worker_audit(ops, "keys.release", key, &details, err);
  }
  bson_destroy(&details);
  bson_destroy(&doc);
  return ok;
}
