/* inbox.c - inbox entries and parked keys in MongoDB
 *
 * DESIGN: see include/obx/obx_inbox.h for the documents. Stateless functions over the caller's
 * client and optional session, so the worker can group them with a pipeline commit in one
 * transaction. Never deletes inbox entries (the TTL index does); parked_keys documents are
 * removed when their key is released. */
#include "obx/obx_inbox.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {"RECEIVED", "PROCESSING", "DONE", "RETRYING", "BLOCKED", "DEAD", "SKIPPED"};

const char *obx_inbox_status_name(obx_inbox_status_t status) {
  assert((unsigned)status < sizeof status_names / sizeof status_names[0]);
  return status_names[status];
}

bool obx_inbox_status_parse(const char *s, obx_inbox_status_t *out) {
  for (size_t i = 0; s && i < sizeof status_names / sizeof status_names[0]; i++)
    if (strcmp(s, status_names[i]) == 0) {
      *out = (obx_inbox_status_t)i;
      return true;
    }
  return false;
}

bool obx_inbox_status_final(obx_inbox_status_t status) {
  return status == OBX_INBOX_DONE || status == OBX_INBOX_SKIPPED || status == OBX_INBOX_DEAD;
}

static mongoc_collection_t *coll(mongoc_client_t *client, const char *db, const char *name) {
  return mongoc_client_get_collection(client, db, name);
}

/* Opts with the session appended (when there is one). */
static bool opts_with_session(bson_t *opts, mongoc_client_session_t *session, obx_err_t *err) {
  bson_init(opts);
  bson_error_t berr;
  if (session && !mongoc_client_session_append(session, opts, &berr)) {
    obx_err_from_bson(err, &berr, NULL);
    bson_destroy(opts);
    return false;
  }
  return true;
}

static void append_id(bson_t *doc, const char *field, const char *consumer, const char *second_name,
                      const char *second) {
  bson_t id;
  BSON_APPEND_DOCUMENT_BEGIN(doc, field, &id);
  BSON_APPEND_UTF8(&id, "consumer", consumer);
  BSON_APPEND_UTF8(&id, second_name, second);
  bson_append_document_end(doc, &id);
}

/* {field: {$in: [...]}} built in doc: in_begin, in_add for each value, in_end. */
typedef struct {
  bson_t *doc, cond, arr;
  uint32_t n;
} in_list_t;

static void in_begin(in_list_t *in, bson_t *doc, const char *field) {
  in->doc = doc;
  in->n = 0;
  BSON_APPEND_DOCUMENT_BEGIN(doc, field, &in->cond);
  BSON_APPEND_ARRAY_BEGIN(&in->cond, "$in", &in->arr);
}

/* Appends the string v, or with a consumer the _id {consumer, <id_field>: v} (append_id). */
static void in_add(in_list_t *in, const char *consumer, const char *id_field, const char *v) {
  char idx[16];
  const char *k;
  bson_uint32_to_string(in->n++, &k, idx, sizeof idx);
  if (consumer) append_id(&in->arr, k, consumer, id_field, v);
  else BSON_APPEND_UTF8(&in->arr, k, v);
}

static void in_end(in_list_t *in) {
  bson_append_array_end(&in->cond, &in->arr);
  bson_append_document_end(in->doc, &in->cond);
}

static bool read_status(const bson_t *doc, obx_inbox_status_t *status) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, "status") && BSON_ITER_HOLDS_UTF8(&it) &&
         obx_inbox_status_parse(bson_iter_utf8(&it, NULL), status);
}

/* updateOne on collection `name` of db (deleteOne when update is NULL), in session's
 * transaction when there is one; *matched (when not NULL) receives the reply's matchedCount,
 * -1 when it has none. */
static bool write_one(mongoc_client_t *client, const char *db, const char *name, mongoc_client_session_t *session,
                      const bson_t *filter, const bson_t *update, bool upsert, int64_t *matched, obx_err_t *err) {
  bool ok = false;
  bson_t opts, reply;
  bson_init(&reply);
  mongoc_collection_t *c = coll(client, db, name);
  if (!opts_with_session(&opts, session, err)) goto done_noopts;
  if (upsert) BSON_APPEND_BOOL(&opts, "upsert", true);
  bson_error_t berr;
  ok = update ? mongoc_collection_update_one(c, filter, update, &opts, &reply, &berr)
              : mongoc_collection_delete_one(c, filter, &opts, &reply, &berr);
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  bson_iter_t it;
  if (ok && matched) *matched = bson_iter_init_find(&it, &reply, "matchedCount") ? bson_iter_as_int64(&it) : -1;
  bson_destroy(&opts);
done_noopts:
  mongoc_collection_destroy(c);
  bson_destroy(&reply);
  return ok;
}

/* A claim's conditional update of one inbox entry (filter and update are destroyed here):
 * *taken says whether it matched, so whether this process now holds the entry. */
static bool write_taken(mongoc_client_t *client, const char *db, bson_t *filter, bson_t *update, bool *taken,
                        obx_err_t *err) {
  int64_t matched = 0;
  bool ok = write_one(client, db, "inbox", NULL, filter, update, false, &matched, err);
  *taken = ok && matched > 0;
  bson_destroy(update);
  bson_destroy(filter);
  return ok;
}

/* The inbox document of a fresh entry stored as `status` into doc (initialised here). */
static void entry_doc(const obx_inbox_entry_t *entry, obx_inbox_status_t status, bson_t *doc) {
  const obx_event_t *ev = entry->event;
  bson_t child;
  bson_init(doc);
  append_id(doc, "_id", entry->consumer, "eventId", ev->id);
  BSON_APPEND_UTF8(doc, "eventType", ev->event_type);
  BSON_APPEND_UTF8(doc, "orgId", ev->org_id);
  BSON_APPEND_UTF8(doc, "partitionKey", ev->partition_key ? ev->partition_key : "");
  BSON_APPEND_UTF8(doc, "status", obx_inbox_status_name(status));
  BSON_APPEND_INT32(doc, "attempts", 0);
  BSON_APPEND_DOCUMENT_BEGIN(doc, "headers", &child);
  for (int i = 0; i < entry->nheaders; i++) BSON_APPEND_UTF8(&child, entry->header_names[i], entry->header_values[i]);
  bson_append_document_end(doc, &child);
  BSON_APPEND_DOCUMENT(doc, "payload", &ev->payload);
  BSON_APPEND_DOCUMENT_BEGIN(doc, "source", &child);
  if (entry->topic) {
    BSON_APPEND_UTF8(&child, "topic", entry->topic);
    BSON_APPEND_INT32(&child, "partition", entry->partition);
    BSON_APPEND_INT64(&child, "offset", entry->offset);
  } else {
    BSON_APPEND_UTF8(&child, "kind", entry->source_kind ? entry->source_kind : "unknown");
  }
  bson_append_document_end(doc, &child);
  BSON_APPEND_INT64(doc, "seq", entry->seq);
  if (entry->traceparent) BSON_APPEND_UTF8(doc, "traceparent", entry->traceparent);
  if (entry->owner && status == OBX_INBOX_RECEIVED) { /* a BLOCKED entry is claimed when it is released */
    BSON_APPEND_UTF8(doc, "owner", entry->owner);
    if (entry->member) BSON_APPEND_UTF8(doc, "member", entry->member);
    BSON_APPEND_DATE_TIME(doc, "leaseUntil", obx_time_now_ms() + entry->lease_ms);
  }
  BSON_APPEND_DATE_TIME(doc, "receivedAt", obx_time_now_ms());
  BSON_APPEND_NULL(doc, "lastError");
  BSON_APPEND_ARRAY_BEGIN(doc, "executionIds", &child);
  bson_append_array_end(doc, &child);
}

bool obx_inbox_claim(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                     const obx_inbox_entry_t *entry, obx_inbox_status_t status, bool *inserted,
                     obx_inbox_status_t *existing, obx_err_t *err) {
  const obx_event_t *ev = entry->event;
  bool ok = false;
  *inserted = false;
  bson_t doc, opts, reply;
  bson_init(&reply);
  mongoc_collection_t *c = coll(client, db, "inbox");
  entry_doc(entry, status, &doc);

  if (!opts_with_session(&opts, session, err)) goto done_noopts;
  bson_t filter = BSON_INITIALIZER, found_doc = BSON_INITIALIZER;
  append_id(&filter, "_id", entry->consumer, "eventId", ev->id);
  bool found = false;
  bson_error_t berr;
  /* In a transaction a duplicate key error would abort it: look first there. */
  if (session && !obx_mongo_find_one(c, &filter, NULL, session, &found_doc, &found, err)) goto done_filter;
  if (!found) {
    if (mongoc_collection_insert_one(c, &doc, &opts, &reply, &berr)) {
      *inserted = true;
      ok = true;
      goto done_filter;
    }
    obx_err_from_bson(err, &berr, &reply);
    if (session || !obx_err_is_duplicate_key(err)) goto done_filter;
    obx_err_clear(err);
    if (!obx_mongo_find_one(c, &filter, NULL, session, &found_doc, &found, err)) goto done_filter;
  }
  ok = true;
  if (!found || !read_status(&found_doc, existing)) {
    obx_err_set(err, OBX_ERR_CONFLICT, 0, true, "inbox entry %s vanished or has no status", ev->id);
    ok = false;
  }
done_filter:
  bson_destroy(&found_doc);
  bson_destroy(&filter);
  bson_destroy(&opts);
done_noopts:
  mongoc_collection_destroy(c);
  bson_destroy(&reply);
  bson_destroy(&doc);
  return ok;
}

bool obx_inbox_claim_many(mongoc_client_t *client, const char *db, const obx_inbox_entry_t *entries, int n,
                          bool *inserted, obx_err_t *err) {
  for (int i = 0; i < n; i++) inserted[i] = false;
  if (n == 0) return true;
  bson_t opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  BSON_APPEND_BOOL(&opts, "ordered", false);
  mongoc_collection_t *c = coll(client, db, "inbox");
  mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(c, &opts);
  int *which = malloc((size_t)(n > 0 ? n : 1) * sizeof *which), k = 0; /* the entry of each insert of the bulk */
  assert(which);
  bson_error_t berr;
  for (int i = 0; i < n; i++) {
    bson_t doc;
    entry_doc(&entries[i], OBX_INBOX_RECEIVED, &doc);
    if (mongoc_bulk_operation_insert_with_opts(bulk, &doc, NULL, &berr)) which[k++] = i; /* refused: left out */
    bson_destroy(&doc);
  }
  bool ok = true;
  if (k > 0) {
    bson_destroy(&reply);
    bool all = mongoc_bulk_operation_execute(bulk, &reply, &berr) != 0;
    bool *failed = calloc((size_t)k + 1, sizeof *failed);
    assert(failed);
    int nfailed = 0;
    bson_iter_t it, errs;
    if (!all && bson_iter_init_find(&it, &reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY(&it) &&
        bson_iter_recurse(&it, &errs))
      while (bson_iter_next(&errs)) {
        bson_iter_t e;
        if (BSON_ITER_HOLDS_DOCUMENT(&errs) && bson_iter_recurse(&errs, &e) && bson_iter_find(&e, "index") &&
            BSON_ITER_HOLDS_NUMBER(&e) && bson_iter_as_int64(&e) >= 0 && bson_iter_as_int64(&e) < k &&
            !failed[bson_iter_as_int64(&e)]) {
          failed[bson_iter_as_int64(&e)] = true;
          nfailed++;
        }
      }
    int64_t n_inserted = bson_iter_init_find(&it, &reply, "nInserted") ? bson_iter_as_int64(&it) : -1;
    /* every insert accounted for (inserted, or a write error of its own): the rest went in */
    if (all || (n_inserted >= 0 && n_inserted + nfailed == k && !bson_iter_init_find(&it, &reply, "writeConcernErrors"))) {
      for (int j = 0; j < k; j++) inserted[which[j]] = !failed[j];
    } else {
      obx_err_from_bson(err, &berr, &reply);
      ok = false;
    }
    free(failed);
  }
  free(which);
  bson_destroy(&reply);
  mongoc_bulk_operation_destroy(bulk);
  mongoc_collection_destroy(c);
  bson_destroy(&opts);
  return ok;
}

static void append_status_in(bson_t *doc, const char *field, const obx_inbox_status_t *statuses, int n) {
  in_list_t in;
  in_begin(&in, doc, field);
  for (int i = 0; i < n; i++) in_add(&in, NULL, NULL, obx_inbox_status_name(statuses[i]));
  in_end(&in);
}

/* The claim condition of an owned status write (obx_inbox.h): {owner, $or: [{status: running,
 * attempts}, {status: RETRYING, retrySent: false, attempts + 1}]}. */
static void append_cas(bson_t *filter, const obx_inbox_cas_t *cas) {
  static const obx_inbox_status_t running[] = {OBX_INBOX_RECEIVED, OBX_INBOX_PROCESSING};
  bson_t or, c;
  BSON_APPEND_UTF8(filter, "owner", cas->owner);
  BSON_APPEND_ARRAY_BEGIN(filter, "$or", &or);
  BSON_APPEND_DOCUMENT_BEGIN(&or, "0", &c);
  append_status_in(&c, "status", running, 2);
  BSON_APPEND_INT32(&c, "attempts", cas->attempts);
  bson_append_document_end(&or, &c);
  BSON_APPEND_DOCUMENT_BEGIN(&or, "1", &c);
  BSON_APPEND_UTF8(&c, "status", obx_inbox_status_name(OBX_INBOX_RETRYING));
  BSON_APPEND_BOOL(&c, "retrySent", false);
  BSON_APPEND_INT32(&c, "attempts", cas->attempts + 1);
  bson_append_document_end(&or, &c);
  bson_append_array_end(filter, &or);
}

/* The filter and update (initialised here) of one status write: o->cas NULL, unconditional. */
static void status_write(const char *consumer, const obx_inbox_outcome_t *o, bson_t *filter, bson_t *update) {
  bson_t set, child;
  bson_init(filter);
  bson_init(update);
  append_id(filter, "_id", consumer, "eventId", o->event_id);
  if (o->cas) append_cas(filter, o->cas);
  bool intent = o->cas && o->status == OBX_INBOX_RETRYING;
  bool final = obx_inbox_status_final(o->status);
  BSON_APPEND_DOCUMENT_BEGIN(update, "$set", &set);
  BSON_APPEND_UTF8(&set, "status", obx_inbox_status_name(o->status));
  if (o->attempts >= 0) BSON_APPEND_INT32(&set, "attempts", o->attempts);
  if (o->last_error) BSON_APPEND_UTF8(&set, "lastError", o->last_error);
  if (final) BSON_APPEND_DATE_TIME(&set, "processedAt", obx_time_now_ms());
  if (intent) { /* the tier publish follows; a peer resends it only once this lease is past */
    BSON_APPEND_BOOL(&set, "retrySent", false);
    BSON_APPEND_DATE_TIME(&set, "leaseUntil", obx_time_now_ms() + o->cas->lease_ms);
  }
  bson_append_document_end(update, &set);
  BSON_APPEND_DOCUMENT_BEGIN(update, "$unset", &child);
  BSON_APPEND_UTF8(&child, final ? "leaseUntil" : "processedAt", "");
  if (!intent) BSON_APPEND_UTF8(&child, "retrySent", "");
  bson_append_document_end(update, &child);
  if (o->execution_id) {
    BSON_APPEND_DOCUMENT_BEGIN(update, "$push", &child);
    BSON_APPEND_UTF8(&child, "executionIds", o->execution_id);
    bson_append_document_end(update, &child);
  }
}

static bool set_status(mongoc_client_t *client, const char *db, mongoc_client_session_t *session, const char *consumer,
                       const obx_inbox_outcome_t *o, obx_err_t *err) {
  bson_t filter, update;
  status_write(consumer, o, &filter, &update);
  int64_t matched;
  bool ok = write_one(client, db, "inbox", session, &filter, &update, false, &matched, err);
  if (ok && matched == 0) {
    if (o->cas)
      obx_err_set(err, OBX_ERR_CONFLICT, 0, false,
                  "the claim of event %s of %s is no longer %s's at attempt %d (taken over or moved on)", o->event_id,
                  consumer, o->cas->owner, o->cas->attempts);
    else
      obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no inbox entry for event %s of %s", o->event_id, consumer);
    ok = false;
  }
  bson_destroy(&update);
  bson_destroy(&filter);
  return ok;
}

/* Whether the stored entry doc holds what o wrote (read in the writing transaction). */
static bool outcome_written(const bson_t *doc, const obx_inbox_outcome_t *o) {
  obx_inbox_status_t status;
  const char *owner = obx_mongo_doc_str(doc, "owner");
  if (!read_status(doc, &status) || status != o->status || !owner || strcmp(owner, o->cas->owner) != 0) return false;
  bson_iter_t it, child;
  if (o->attempts >= 0 &&
      (!bson_iter_init_find(&it, doc, "attempts") || !BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) != o->attempts))
    return false;
  if (!o->execution_id) return true;
  if (!bson_iter_init_find(&it, doc, "executionIds") || !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &child))
    return false;
  while (bson_iter_next(&child))
    if (BSON_ITER_HOLDS_UTF8(&child) && strcmp(bson_iter_utf8(&child, NULL), o->execution_id) == 0) return true;
  return false;
}

bool obx_inbox_set_status_owned_many(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                                     const char *consumer, const obx_inbox_outcome_t *outcomes, int n, bool *written,
                                     obx_err_t *err) {
  for (int i = 0; i < n; i++) written[i] = false;
  if (n == 0) return true;
  bson_t opts;
  if (!opts_with_session(&opts, session, err)) return false;
  BSON_APPEND_BOOL(&opts, "ordered", false);
  mongoc_collection_t *c = coll(client, db, "inbox");
  mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(c, &opts);
  bson_error_t berr;
  bool ok = true;
  for (int i = 0; ok && i < n; i++) {
    assert(outcomes[i].cas);
    bson_t filter, update;
    status_write(consumer, &outcomes[i], &filter, &update);
    ok = mongoc_bulk_operation_update_one_with_opts(bulk, &filter, &update, NULL, &berr);
    bson_destroy(&update);
    bson_destroy(&filter);
  }
  bson_t reply = BSON_INITIALIZER;
  if (ok) {
    bson_destroy(&reply);
    ok = mongoc_bulk_operation_execute(bulk, &reply, &berr) != 0;
  }
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  bson_iter_t it;
  int64_t matched = ok && bson_iter_init_find(&it, &reply, "nMatched") ? bson_iter_as_int64(&it) : -1;
  if (ok && matched == n) {
    for (int i = 0; i < n; i++) written[i] = true;
  } else if (ok) { /* some compare-and-set did not hold: which, read back in the same transaction */
    bson_t filter = BSON_INITIALIZER;
    in_list_t in;
    in_begin(&in, &filter, "_id");
    for (int i = 0; i < n; i++) in_add(&in, consumer, "eventId", outcomes[i].event_id);
    in_end(&in);
    bson_t find_opts;
    ok = opts_with_session(&find_opts, session, err);
    mongoc_cursor_t *cursor = ok ? mongoc_collection_find_with_opts(c, &filter, &find_opts, NULL) : NULL;
    const bson_t *doc;
    while (cursor && mongoc_cursor_next(cursor, &doc)) {
      const char *id = obx_mongo_doc_str(doc, "_id.eventId");
      for (int i = 0; id && i < n; i++)
        if (strcmp(outcomes[i].event_id, id) == 0) written[i] = outcome_written(doc, &outcomes[i]);
    }
    ok = obx_mongo_cursor_end(cursor, err) && ok;
    if (cursor) bson_destroy(&find_opts);
    bson_destroy(&filter);
  }
  bson_destroy(&reply);
  mongoc_bulk_operation_destroy(bulk);
  mongoc_collection_destroy(c);
  bson_destroy(&opts);
  return ok;
}

bool obx_inbox_set_status(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                          const char *consumer, const char *event_id, obx_inbox_status_t status, int attempts,
                          const char *last_error, const char *execution_id, obx_err_t *err) {
  obx_inbox_outcome_t o = {.event_id = event_id, .status = status, .attempts = attempts, .last_error = last_error,
                           .execution_id = execution_id};
  return set_status(client, db, session, consumer, &o, err);
}

bool obx_inbox_set_status_owned(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                                const char *consumer, const char *event_id, const obx_inbox_cas_t *cas,
                                obx_inbox_status_t status, int attempts, const char *last_error,
                                const char *execution_id, obx_err_t *err) {
  obx_inbox_outcome_t o = {.event_id = event_id, .cas = cas, .status = status, .attempts = attempts,
                           .last_error = last_error, .execution_id = execution_id};
  return set_status(client, db, session, consumer, &o, err);
}

/* {$or: [no lease, lease in the past, owner's own]} appended to filter. A claim of another
 * process of the same static member (WORKER_INSTANCE_ID) is not its own: that process may still
 * run the event (a restart overlapping its predecessor's drain, two processes started with one
 * id), so it is taken over only once its lease is past, like any other. */
static void append_claimable(bson_t *filter, const char *owner) {
  bson_t or, c, cond;
  BSON_APPEND_ARRAY_BEGIN(filter, "$or", &or);
  BSON_APPEND_DOCUMENT_BEGIN(&or, "0", &c);
  BSON_APPEND_DOCUMENT_BEGIN(&c, "leaseUntil", &cond);
  BSON_APPEND_BOOL(&cond, "$exists", false);
  bson_append_document_end(&c, &cond);
  bson_append_document_end(&or, &c);
  BSON_APPEND_DOCUMENT_BEGIN(&or, "1", &c);
  BSON_APPEND_DOCUMENT_BEGIN(&c, "leaseUntil", &cond);
  BSON_APPEND_DATE_TIME(&cond, "$lt", obx_time_now_ms());
  bson_append_document_end(&c, &cond);
  bson_append_document_end(&or, &c);
  BSON_APPEND_DOCUMENT_BEGIN(&or, "2", &c);
  BSON_APPEND_UTF8(&c, "owner", owner);
  bson_append_document_end(&or, &c);
  bson_append_array_end(filter, &or);
}

bool obx_inbox_take(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                    const char *owner, const char *member, int64_t lease_ms, obx_inbox_status_t status, int attempts,
                    int set_attempts, bool *taken, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, child;
  append_id(&filter, "_id", consumer, "eventId", event_id);
  BSON_APPEND_UTF8(&filter, "status", obx_inbox_status_name(status));
  /* a tier's copy runs only the recorded attempt; RETRYING's lease guards the resend, not the run */
  if (attempts >= 0) BSON_APPEND_INT32(&filter, "attempts", attempts);
  if (attempts < 0 || status != OBX_INBOX_RETRYING) append_claimable(&filter, owner);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &child);
  BSON_APPEND_UTF8(&child, "owner", owner);
  if (member) BSON_APPEND_UTF8(&child, "member", member);
  BSON_APPEND_DATE_TIME(&child, "leaseUntil", obx_time_now_ms() + lease_ms);
  BSON_APPEND_UTF8(&child, "status", obx_inbox_status_name(OBX_INBOX_PROCESSING));
  BSON_APPEND_INT32(&child, "attempts", set_attempts);
  bson_append_document_end(&update, &child);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$unset", &child);
  BSON_APPEND_UTF8(&child, "processedAt", "");
  BSON_APPEND_UTF8(&child, "retrySent", "");
  if (!member) BSON_APPEND_UTF8(&child, "member", "");
  bson_append_document_end(&update, &child);
  return write_taken(client, db, &filter, &update, taken, err);
}

bool obx_inbox_take_resend(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                           const char *owner, int64_t lease_ms, int attempts, bool *taken, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, child, cond;
  append_id(&filter, "_id", consumer, "eventId", event_id);
  BSON_APPEND_UTF8(&filter, "status", obx_inbox_status_name(OBX_INBOX_RETRYING));
  BSON_APPEND_INT32(&filter, "attempts", attempts);
  BSON_APPEND_BOOL(&filter, "retrySent", false);
  BSON_APPEND_DOCUMENT_BEGIN(&filter, "leaseUntil", &cond);
  BSON_APPEND_DATE_TIME(&cond, "$lt", obx_time_now_ms());
  bson_append_document_end(&filter, &cond);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &child);
  BSON_APPEND_UTF8(&child, "owner", owner);
  BSON_APPEND_DATE_TIME(&child, "leaseUntil", obx_time_now_ms() + lease_ms);
  bson_append_document_end(&update, &child);
  return write_taken(client, db, &filter, &update, taken, err);
}

bool obx_inbox_retry_sent(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                          int attempts, int64_t due_ms, const char *replay_id, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, child;
  append_id(&filter, "_id", consumer, "eventId", event_id);
  BSON_APPEND_UTF8(&filter, "status", obx_inbox_status_name(OBX_INBOX_RETRYING));
  BSON_APPEND_INT32(&filter, "attempts", attempts);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &child);
  BSON_APPEND_BOOL(&child, "retrySent", true);
  BSON_APPEND_DATE_TIME(&child, "retryDueAt", due_ms);
  if (replay_id) BSON_APPEND_UTF8(&child, "retryReplay", replay_id);
  bson_append_document_end(&update, &child);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$unset", &child);
  BSON_APPEND_UTF8(&child, "leaseUntil", "");
  if (!replay_id) BSON_APPEND_UTF8(&child, "retryReplay", "");
  bson_append_document_end(&update, &child);
  bool ok = write_one(client, db, "inbox", NULL, &filter, &update, false, NULL, err);
  bson_destroy(&update);
  bson_destroy(&filter);
  return ok;
}

bool obx_inbox_key_claimed_elsewhere(mongoc_client_t *client, const char *db, const char *consumer, const char *key,
                                     const char *owner, bool *claimed, obx_err_t *err) {
  static const obx_inbox_status_t running[] = {OBX_INBOX_RECEIVED, OBX_INBOX_PROCESSING};
  bson_t filter = BSON_INITIALIZER, cond, out = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "_id.consumer", consumer);
  BSON_APPEND_UTF8(&filter, "partitionKey", key);
  append_status_in(&filter, "status", running, 2);
  BSON_APPEND_DOCUMENT_BEGIN(&filter, "owner", &cond);
  BSON_APPEND_UTF8(&cond, "$ne", owner);
  bson_append_document_end(&filter, &cond);
  BSON_APPEND_DOCUMENT_BEGIN(&filter, "leaseUntil", &cond);
  BSON_APPEND_DATE_TIME(&cond, "$gt", obx_time_now_ms());
  bson_append_document_end(&filter, &cond);
  mongoc_collection_t *c = coll(client, db, "inbox");
  bool ok = obx_mongo_find_one(c, &filter, NULL, NULL, &out, claimed, err);
  mongoc_collection_destroy(c);
  bson_destroy(&out);
  bson_destroy(&filter);
  return ok;
}

static int id_cmp(const void *a, const void *b) { return strcmp(a, b); }

bool obx_inbox_renew(mongoc_client_t *client, const char *db, const char *consumer, const char *owner,
                     const char (*event_ids)[OBX_UUID_LEN + 1], int n, int64_t lease_ms, bool *held, obx_err_t *err) {
  if (n == 0) return true;
  bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, child;
  in_list_t in;
  BSON_APPEND_UTF8(&filter, "_id.consumer", consumer);
  in_begin(&in, &filter, "_id.eventId");
  for (int i = 0; i < n; i++) in_add(&in, NULL, NULL, event_ids[i]);
  in_end(&in);
  BSON_APPEND_UTF8(&filter, "owner", owner);
  static const obx_inbox_status_t running[] = {OBX_INBOX_RECEIVED, OBX_INBOX_PROCESSING};
  append_status_in(&filter, "status", running, 2);
  BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &child);
  BSON_APPEND_DATE_TIME(&child, "leaseUntil", obx_time_now_ms() + lease_ms);
  bson_append_document_end(&update, &child);
  mongoc_collection_t *c = coll(client, db, "inbox");
  bson_t reply;
  bson_error_t berr;
  bool ok = mongoc_collection_update_many(c, &filter, &update, NULL, &reply, &berr);
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  bson_destroy(&reply);
  if (ok && held) { /* the claims still owner's: the same filter, read back */
    for (int i = 0; i < n; i++) held[i] = false;
    bson_t *opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}");
    mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, opts, NULL);
    const bson_t *doc;
    while (mongoc_cursor_next(cursor, &doc)) {
      bson_iter_t it, d;
      if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, "_id.eventId", &d) || !BSON_ITER_HOLDS_UTF8(&d))
        continue;
      const char(*found)[OBX_UUID_LEN + 1] = bsearch(bson_iter_utf8(&d, NULL), event_ids, (size_t)n, sizeof *event_ids, id_cmp);
      if (found) held[found - event_ids] = true;
    }
    ok = obx_mongo_cursor_end(cursor, err);
    bson_destroy(opts);
  }
  mongoc_collection_destroy(c);
  bson_destroy(&update);
  bson_destroy(&filter);
  return ok;
}

bool obx_inbox_get(mongoc_client_t *client, const char *db, mongoc_client_session_t *session, const char *consumer,
                   const char *event_id, bson_t *out, bool *found, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER;
  append_id(&filter, "_id", consumer, "eventId", event_id);
  mongoc_collection_t *c = coll(client, db, "inbox");
  bool ok = obx_mongo_find_one(c, &filter, NULL, session, out, found, err);
  mongoc_collection_destroy(c);
  bson_destroy(&filter);
  return ok;
}

bool obx_inbox_entry_event(const bson_t *doc, obx_event_t *ev, obx_err_t *err) {
  obx_ce_header_t headers[OBX_CE_MAX_HEADERS]; /* the one header limit (obx_ladder.h) */
  int n = 0;
  bson_iter_t it, child;
  if (bson_iter_init_find(&it, doc, "headers") && BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &child)) {
    while (bson_iter_next(&child) && n < OBX_CE_MAX_HEADERS) {
      if (!BSON_ITER_HOLDS_UTF8(&child)) continue;
      uint32_t len;
      headers[n].name = bson_iter_key(&child);
      headers[n].value = bson_iter_utf8(&child, &len);
      headers[n].len = len;
      n++;
    }
  }
  const char *key = NULL;
  uint32_t key_len = 0;
  if (bson_iter_init_find(&it, doc, "partitionKey") && BSON_ITER_HOLDS_UTF8(&it)) key = bson_iter_utf8(&it, &key_len);
  bson_t payload;
  const uint8_t *data;
  uint32_t dlen;
  if (!bson_iter_init_find(&it, doc, "payload") || !BSON_ITER_HOLDS_DOCUMENT(&it)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "inbox entry has no payload document");
    return false;
  }
  bson_iter_document(&it, &dlen, &data);
  if (!bson_init_static(&payload, data, dlen)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "inbox entry has a corrupt payload");
    return false;
  }
  size_t json_len;
  char *json = bson_as_relaxed_extended_json(&payload, &json_len);
  bool ok = obx_event_from_kafka(ev, key, key_len, json, json_len, headers, n, err);
  bson_free(json);
  return ok;
}

/* ---- parked keys ------------------------------------------------------------------------ */

bool obx_inbox_key_parked(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                          const char *consumer, const char *key, bool *parked, char head_event_id[OBX_UUID_LEN + 1],
                          obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, doc = BSON_INITIALIZER;
  append_id(&filter, "_id", consumer, "key", key);
  mongoc_collection_t *c = coll(client, db, "parked_keys");
  bool ok = obx_mongo_find_one(c, &filter, NULL, session, &doc, parked, err);
  if (ok && *parked && head_event_id) {
    bson_iter_t it;
    head_event_id[0] = '\0';
    if (bson_iter_init_find(&it, &doc, "headEventId") && BSON_ITER_HOLDS_UTF8(&it))
      snprintf(head_event_id, OBX_UUID_LEN + 1, "%s", bson_iter_utf8(&it, NULL));
  }
  mongoc_collection_destroy(c);
  bson_destroy(&doc);
  bson_destroy(&filter);
  return ok;
}

bool obx_inbox_keys_parked(mongoc_client_t *client, const char *db, const char *consumer, const char *const *keys,
                           int n, bool *parked, obx_err_t *err) {
  for (int i = 0; i < n; i++) parked[i] = false;
  if (n == 0) return true;
  bson_t filter = BSON_INITIALIZER;
  in_list_t in;
  in_begin(&in, &filter, "_id");
  for (int i = 0; i < n; i++) in_add(&in, consumer, "key", keys[i]);
  in_end(&in);
  bson_t *opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}");
  mongoc_collection_t *c = coll(client, db, "parked_keys");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, opts, NULL);
  const bson_t *doc;
  while (mongoc_cursor_next(cursor, &doc)) {
    const char *key = obx_mongo_doc_str(doc, "_id.key");
    for (int i = 0; key && i < n; i++)
      if (strcmp(keys[i], key) == 0) parked[i] = true;
  }
  bool ok = obx_mongo_cursor_end(cursor, err);
  mongoc_collection_destroy(c);
  bson_destroy(opts);
  bson_destroy(&filter);
  return ok;
}

/* One write (write_one) to the parked key {consumer, key} of parked_keys; `extra` (NULL: none)
 * is added to its filter. */
static bool key_write(mongoc_client_t *client, const char *db, mongoc_client_session_t *session, const char *consumer,
                      const char *key, const bson_t *extra, const bson_t *update, bool upsert, int64_t *matched,
                      obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER;
  append_id(&filter, "_id", consumer, "key", key);
  if (extra) bson_concat(&filter, extra);
  bool ok = write_one(client, db, "parked_keys", session, &filter, update, upsert, matched, err);
  bson_destroy(&filter);
  return ok;
}

bool obx_inbox_park_key(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                        const char *consumer, const char *key, const char *head_event_id, const char *reason,
                        obx_err_t *err) {
  bson_t *update = BCON_NEW("$set", "{", "headEventId", BCON_UTF8(head_event_id), "reason", BCON_UTF8(reason ? reason : ""),
                            "}", "$setOnInsert", "{", "since", BCON_DATE_TIME(obx_time_now_ms()), "}", "$unset", "{",
                            "releasedBy", BCON_UTF8(""), "sent", BCON_UTF8(""), "}");
  bool ok = key_write(client, db, session, consumer, key, NULL, update, true, NULL, err);
  bson_destroy(update);
  return ok;
}

bool obx_inbox_key_get(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                       const char *consumer, const char *key, bson_t *out, bool *found, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER;
  append_id(&filter, "_id", consumer, "key", key);
  mongoc_collection_t *c = coll(client, db, "parked_keys");
  bool ok = obx_mongo_find_one(c, &filter, NULL, session, out, found, err);
  mongoc_collection_destroy(c);
  bson_destroy(&filter);
  return ok;
}

bool obx_inbox_move_head(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                         const char *consumer, const char *key, const char *from_event_id, const char *to_event_id,
                         bool *moved, obx_err_t *err) {
  char reason[64 + OBX_UUID_LEN];
  snprintf(reason, sizeof reason, "released after %s", from_event_id);
  bson_t *head = BCON_NEW("headEventId", BCON_UTF8(from_event_id));
  bson_t *update = BCON_NEW("$set", "{", "headEventId", BCON_UTF8(to_event_id), "releasedBy", BCON_UTF8(from_event_id),
                            "sent", BCON_BOOL(false), "reason", BCON_UTF8(reason), "}");
  int64_t matched;
  bool ok = key_write(client, db, session, consumer, key, head, update, false, &matched, err);
  *moved = ok && matched > 0;
  bson_destroy(update);
  bson_destroy(head);
  return ok;
}

bool obx_inbox_mark_sent(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                         const char *consumer, const char *key, const char *head_event_id, obx_err_t *err) {
  bson_t *head = BCON_NEW("headEventId", BCON_UTF8(head_event_id));
  bson_t *update = BCON_NEW("$set", "{", "sent", BCON_BOOL(true), "}");
  bool ok = key_write(client, db, session, consumer, key, head, update, false, NULL, err);
  bson_destroy(update);
  bson_destroy(head);
  return ok;
}

bool obx_inbox_hold_key(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                        const char *consumer, const char *key, const char *event_id, bool *held, obx_err_t *err) {
  bson_t *other_head = BCON_NEW("headEventId", "{", "$ne", BCON_UTF8(event_id), "}");
  bson_t *update = BCON_NEW("$inc", "{", "admitted", BCON_INT64(1), "}");
  int64_t matched;
  bool ok = key_write(client, db, session, consumer, key, other_head, update, false, &matched, err);
  *held = ok && matched > 0;
  bson_destroy(update);
  bson_destroy(other_head);
  return ok;
}

bool obx_inbox_unpark_key(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                          const char *consumer, const char *key, obx_err_t *err) {
  return key_write(client, db, session, consumer, key, NULL, NULL, false, NULL, err);
}

bool obx_inbox_next_blocked(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                            const char *consumer, const char *key, bson_t *out, bool *found, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, sort = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "_id.consumer", consumer);
  BSON_APPEND_UTF8(&filter, "partitionKey", key);
  BSON_APPEND_UTF8(&filter, "status", obx_inbox_status_name(OBX_INBOX_BLOCKED));
  BSON_APPEND_INT32(&sort, "seq", 1);
  mongoc_collection_t *c = coll(client, db, "inbox");
  bool ok = obx_mongo_find_one(c, &filter, &sort, session, out, found, err);
  mongoc_collection_destroy(c);
  bson_destroy(&sort);
  bson_destroy(&filter);
  return ok;
}

static bool count_blocked(mongoc_client_t *client, const char *db, const char *consumer, const char *key,
                          int64_t *n, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "_id.consumer", consumer);
  BSON_APPEND_UTF8(&filter, "partitionKey", key);
  BSON_APPEND_UTF8(&filter, "status", obx_inbox_status_name(OBX_INBOX_BLOCKED));
  mongoc_collection_t *c = coll(client, db, "inbox");
  bson_error_t berr;
  *n = mongoc_collection_count_documents(c, &filter, NULL, NULL, NULL, &berr);
  if (*n < 0) obx_err_from_bson(err, &berr, NULL);
  mongoc_collection_destroy(c);
  bson_destroy(&filter);
  return *n >= 0;
}

bool obx_inbox_list_parked(mongoc_client_t *client, const char *db, const char *consumer, bson_t *out,
                           obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort, arr;
  if (consumer) BSON_APPEND_UTF8(&filter, "_id.consumer", consumer);
  BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
  BSON_APPEND_INT32(&sort, "since", 1);
  bson_append_document_end(&opts, &sort);
  mongoc_collection_t *c = coll(client, db, "parked_keys");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, &opts, NULL);
  const bson_t *doc;
  bool ok = true;
  int i = 0;
  BSON_APPEND_ARRAY_BEGIN(out, "keys", &arr);
  while (ok && mongoc_cursor_next(cursor, &doc)) {
    bson_iter_t it, d;
    const char *cons = "", *key = "", *head = "", *reason = "";
    int64_t since = 0;
    if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "_id.consumer", &d) && BSON_ITER_HOLDS_UTF8(&d))
      cons = bson_iter_utf8(&d, NULL);
    if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "_id.key", &d) && BSON_ITER_HOLDS_UTF8(&d))
      key = bson_iter_utf8(&d, NULL);
    if (bson_iter_init_find(&it, doc, "headEventId") && BSON_ITER_HOLDS_UTF8(&it)) head = bson_iter_utf8(&it, NULL);
    if (bson_iter_init_find(&it, doc, "reason") && BSON_ITER_HOLDS_UTF8(&it)) reason = bson_iter_utf8(&it, NULL);
    if (bson_iter_init_find(&it, doc, "since") && BSON_ITER_HOLDS_DATE_TIME(&it)) since = bson_iter_date_time(&it);
    int64_t blocked = 0;
    ok = count_blocked(client, db, cons, key, &blocked, err);
    char idx[16];
    const char *ks;
    bson_uint32_to_string((uint32_t)i++, &ks, idx, sizeof idx);
    bson_t item;
    BSON_APPEND_DOCUMENT_BEGIN(&arr, ks, &item);
    BSON_APPEND_UTF8(&item, "key", key);
    BSON_APPEND_UTF8(&item, "consumer", cons);
    BSON_APPEND_UTF8(&item, "headEventId", head);
    BSON_APPEND_DATE_TIME(&item, "since", since);
    BSON_APPEND_UTF8(&item, "reason", reason);
    BSON_APPEND_INT64(&item, "blocked", blocked);
    bson_append_document_end(&arr, &item);
  }
  bson_append_array_end(out, &arr);
  ok = obx_mongo_cursor_end(cursor, ok ? err : NULL) && ok; /* a failed count keeps its own error */
  mongoc_collection_destroy(c);
  bson_destroy(&opts);
  bson_destroy(&filter);
  return ok;
}

bool obx_inbox_count_parked(mongoc_client_t *client, const char *db, const char *consumer, int64_t *n,
                            obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER;
  if (consumer) BSON_APPEND_UTF8(&filter, "_id.consumer", consumer);
  mongoc_collection_t *c = coll(client, db, "parked_keys");
  bson_error_t berr;
  *n = mongoc_collection_count_documents(c, &filter, NULL, NULL, NULL, &berr);
  if (*n < 0) obx_err_from_bson(err, &berr, NULL);
  mongoc_collection_destroy(c);
  bson_destroy(&filter);
  return *n >= 0;
}

/* ---- the retry sweep (src/worker/retrysweep.c) ---------------------------------------------- */

bool obx_inbox_retry_overdue(mongoc_client_t *client, const char *db, const char *consumer, int64_t before_ms,
                             int limit, bool (*visit)(void *ctx, const bson_t *entry), void *ctx, obx_err_t *err) {
  bson_t *filter = BCON_NEW("_id.consumer", BCON_UTF8(consumer), "status",
                            BCON_UTF8(obx_inbox_status_name(OBX_INBOX_RETRYING)), "retrySent", BCON_BOOL(true),
                            "retryDueAt", "{", "$lt", BCON_DATE_TIME(before_ms), "}");
  bson_t *opts = BCON_NEW("sort", "{", "retryDueAt", BCON_INT32(1), "}", "limit", BCON_INT64(limit));
  mongoc_collection_t *c = coll(client, db, "inbox");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, filter, opts, NULL);
  const bson_t *doc;
  while (mongoc_cursor_next(cursor, &doc) && visit(ctx, doc)) continue;
  bool ok = obx_mongo_cursor_end(cursor, err);
  mongoc_collection_destroy(c);
  bson_destroy(opts);
  bson_destroy(filter);
  return ok;
}

bool obx_inbox_retry_sweep_take(mongoc_client_t *client, const char *db, const char *consumer, const char *event_id,
                                int attempts, int64_t due_ms, int64_t next_due_ms, bool *taken, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER;
  append_id(&filter, "_id", consumer, "eventId", event_id);
  BSON_APPEND_UTF8(&filter, "status", obx_inbox_status_name(OBX_INBOX_RETRYING));
  BSON_APPEND_BOOL(&filter, "retrySent", true);
  BSON_APPEND_INT32(&filter, "attempts", attempts);
  BSON_APPEND_DATE_TIME(&filter, "retryDueAt", due_ms);
  bson_t *update = BCON_NEW("$set", "{", "retryDueAt", BCON_DATE_TIME(next_due_ms), "}", "$inc", "{", "retrySwept",
                            BCON_INT32(1), "}");
  return write_taken(client, db, &filter, update, taken, err);
}

/* ---- keySeq gaps ------------------------------------------------------------------------ */

bool obx_inbox_seq_settled(mongoc_client_t *client, const char *db, const char *consumer, const char *key,
                           int64_t key_seq, bool *settled, obx_err_t *err) {
  static const obx_inbox_status_t outcomes[] = {OBX_INBOX_DONE, OBX_INBOX_SKIPPED, OBX_INBOX_BLOCKED,
                                                OBX_INBOX_RETRYING, OBX_INBOX_DEAD};
  bson_t filter = BSON_INITIALIZER, child;
  BSON_APPEND_UTF8(&filter, "_id.consumer", consumer);
  BSON_APPEND_UTF8(&filter, "partitionKey", key);
  append_status_in(&filter, "status", outcomes, (int)(sizeof outcomes / sizeof outcomes[0]));
  BSON_APPEND_INT64(&filter, "seq", key_seq);
  BSON_APPEND_DOCUMENT_BEGIN(&filter, "headers.ce_keyseq", &child);
  BSON_APPEND_BOOL(&child, "$exists", true);
  bson_append_document_end(&filter, &child);
  bson_t opts = BSON_INITIALIZER; /* its _id only: the entry's payload stays on the server */
  BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &child);
  BSON_APPEND_INT32(&child, "_id", 1);
  bson_append_document_end(&opts, &child);
  BSON_APPEND_INT64(&opts, "limit", 1);
  mongoc_collection_t *c = coll(client, db, "inbox");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, &opts, NULL);
  const bson_t *doc;
  *settled = mongoc_cursor_next(cursor, &doc);
  bool ok = obx_mongo_cursor_end(cursor, err);
  if (!ok) *settled = false;
  mongoc_collection_destroy(c);
  bson_destroy(&opts);
  bson_destroy(&filter);
  return ok;
}
