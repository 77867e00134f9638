/* ops_inbox.c - one inbox entry with its executions, and replays
 *
 * DESIGN: see obx_ops.h. A replay publishes the stored CloudEvent of each selected entry to
 * the work queue with x-replay (confirmed) and the running worker runs it again on its key's
 * lane, so a replay makes a new pipeline_executions record and per-key order is kept. DONE and
 * SKIPPED entries (finished work) are selected only when the caller says so. Every replay has
 * an id (UUIDv7), in its answer and in its audit_log entry. */
#include <stdio.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "ops/ops_int.h"

bool ops_publish_entry(const obx_ops_t *ops, const bson_t *doc, const char *replay_id, obx_err_t *err) {
  if (!ops_need_ladder(ops, err)) return false;
  obx_event_t ev;
  obx_event_init(&ev);
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  bool ok = obx_inbox_entry_event(doc, &ev, err) && obx_envelope_from_event(&msg, &ev, err);
  if (ok) {
    msg.replay_id = replay_id ? strdup(replay_id) : NULL;
    ok = obx_ladder_publish_work(ops->ladder, &msg, err);
  }
  obx_envelope_cleanup(&msg);
  obx_event_cleanup(&ev);
  return ok;
}

/* The entry of event_id when it is org's (NULL: any); NOT_FOUND otherwise. */
static bool entry_get(const obx_ops_t *ops, mongoc_client_t *client, const char *org, const char *event_id, bson_t *doc,
                      obx_err_t *err) {
  bool found = false;
  if (!obx_inbox_get(client, obx_mongo_db_name(ops->mongo), NULL, ops->consumer, event_id, doc, &found, err))
    return false;
  if (found && org) {
    const char *entry_org = obx_mongo_doc_str(doc, "orgId");
    found = entry_org && strcmp(entry_org, org) == 0;
  }
  if (!found) obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no inbox entry for event %s", event_id);
  return found;
}

bool obx_ops_inbox_get(const obx_ops_t *ops, const char *org, const char *event_id, bson_t *out, obx_err_t *err) {
  bson_t doc = BSON_INITIALIZER, execs;
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  bool ok = entry_get(ops, client, org, event_id, &doc, err);
  if (ok) {
    BSON_APPEND_DOCUMENT(out, "entry", &doc);
    bson_t *filter = BCON_NEW("eventId", BCON_UTF8(event_id));
    if (org) BSON_APPEND_UTF8(filter, "orgId", org);
    bson_t *opts = BCON_NEW("sort", "{", "startedAt", BCON_INT32(1), "}", "limit", BCON_INT64(OBX_OPS_MAX_LIMIT));
    mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, "pipeline_executions");
    mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, filter, opts, NULL);
    const bson_t *exec;
    int n = 0;
    BSON_APPEND_ARRAY_BEGIN(out, "executions", &execs);
    while (mongoc_cursor_next(cursor, &exec)) ops_array_doc(&execs, n++, exec);
    bson_append_array_end(out, &execs);
    ok = obx_mongo_cursor_end(cursor, err);
    mongoc_collection_destroy(c);
    bson_destroy(opts);
    bson_destroy(filter);
  }
  obx_mongo_push(ops->mongo, client);
  bson_destroy(&doc);
  return ok;
}

static bool finished_status(const char *status) {
  return status && (strcmp(status, "DONE") == 0 || strcmp(status, "SKIPPED") == 0);
}

/* The selection of a replay filter. */
static bool replay_selection(const obx_ops_t *ops, const obx_ops_replay_filter_t *f, bson_t *filter, obx_err_t *err) {
  BSON_APPEND_UTF8(filter, "_id.consumer", ops->consumer);
  if (f->event_id) BSON_APPEND_UTF8(filter, "_id.eventId", f->event_id);
  if (f->org) BSON_APPEND_UTF8(filter, "orgId", f->org);
  if (f->type) BSON_APPEND_UTF8(filter, "eventType", f->type);
  if (f->key) BSON_APPEND_UTF8(filter, "partitionKey", f->key);
  ops_time_range(filter, "receivedAt", f->since_ms, f->until_ms);
  if (f->status) {
    if (!obx_ops_status_check(OBX_OPS_INBOX, f->status, err)) return false;
    if (finished_status(f->status) && !f->include_finished) {
      obx_err_set(err, OBX_ERR_INPUT, 0, false,
                  "status %s is finished work: replaying it needs the include-finished flag", f->status);
      return false;
    }
    BSON_APPEND_UTF8(filter, "status", f->status);
  } else if (!f->include_finished && !f->event_id) {
    bson_t *nin = BCON_NEW("$nin", "[", BCON_UTF8("DONE"), BCON_UTF8("SKIPPED"), "]");
    BSON_APPEND_DOCUMENT(filter, "status", nin);
    bson_destroy(nin);
  }
  return true;
}

bool obx_ops_inbox_replay(const obx_ops_t *ops, const obx_ops_replay_filter_t *f, bool dry_run, int preview,
                          obx_ops_progress_fn progress, void *ctx, bson_t *out, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, events, ids, details = BSON_INITIALIZER;
  if (!replay_selection(ops, f, &filter, err)) {
    bson_destroy(&filter);
    return false;
  }
  if (!dry_run && !ops_need_ladder(ops, err)) {
    bson_destroy(&filter);
    return false;
  }
  char replay_id[OBX_UUID_LEN + 1];
  obx_uuid7(replay_id);
  bson_t *opts = BCON_NEW("sort", "{", "receivedAt", BCON_INT32(1), "seq", BCON_INT32(1), "}");
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, "inbox");
  bson_error_t berr;
  int64_t total = mongoc_collection_count_documents(c, &filter, NULL, NULL, NULL, &berr);
  int64_t done = 0;
  char entry_org[128] = ""; /* one event's replay is recorded under its org */
  bool ok = total >= 0;
  if (!ok) obx_err_from_bson(err, &berr, NULL);
  if (ok && f->event_id && total == 0) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no inbox entry for event %s", f->event_id);
    ok = false;
  }
  BSON_APPEND_ARRAY_BEGIN(out, "events", &events);
  BSON_APPEND_ARRAY_BEGIN(&details, "ids", &ids);
  mongoc_cursor_t *cursor = ok ? mongoc_collection_find_with_opts(c, &filter, opts, NULL) : NULL;
  const bson_t *doc;
  while (ok && mongoc_cursor_next(cursor, &doc)) {
    if (!dry_run && !ops_publish_entry(ops, doc, replay_id, err)) {
      ok = false;
      break;
    }
    const char *id = obx_mongo_doc_str(doc, "_id.eventId"), *doc_org = obx_mongo_doc_str(doc, "orgId");
    if (f->event_id && doc_org) snprintf(entry_org, sizeof entry_org, "%s", doc_org);
    if (done < preview) ops_array_utf8(&events, (int)done, id ? id : "");
    ops_array_utf8(&ids, (int)done, id ? id : "");
    done++;
    if (progress) progress(ctx, done, total > done ? total : done);
  }
  ok = obx_mongo_cursor_end(cursor, ok ? err : NULL) && ok; /* a failed publish keeps its own error */
  bson_append_array_end(out, &events);
  bson_append_array_end(&details, &ids);
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  BSON_APPEND_UTF8(out, "replayId", replay_id);
  BSON_APPEND_BOOL(out, "dryRun", dry_run);
  BSON_APPEND_INT64(out, "count", done);
  /* A real run records what it published, also when it stopped on an error half way. */
  if (!dry_run && done > 0) {
    BSON_APPEND_UTF8(&details, "consumer", ops->consumer);
    BSON_APPEND_INT64(&details, "count", done);
    if (f->type) BSON_APPEND_UTF8(&details, "type", f->type);
    if (f->status) BSON_APPEND_UTF8(&details, "status", f->status);
    if (f->key) BSON_APPEND_UTF8(&details, "key", f->key);
    BSON_APPEND_BOOL(&details, "includeFinished", f->include_finished);
    if (!ok) BSON_APPEND_UTF8(&details, "error", err->msg);
    obx_err_t aerr = OBX_ERR_INIT;
    if (!obx_ops_audit(ops, NULL, "inbox.replay", f->event_id ? f->event_id : replay_id,
                        f->org ? f->org : entry_org[0] ? entry_org : NULL, &details, &aerr) &&
        ok) {
      *err = aerr;
      ok = false;
    }
  }
  bson_destroy(&details);
  bson_destroy(opts);
  bson_destroy(&filter);
  return ok;
}
