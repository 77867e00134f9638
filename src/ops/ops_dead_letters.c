/* ops_dead_letters.c - the dead_letters store: write, list, get, redrive, delete, export
 *
 * DESIGN: see obx_ops.h for the document. Operators read the store, never the RabbitMQ queue:
 * every listing is an index range on MongoDB, and concurrent readers see the same complete set.
 * A dead letter's state machine, owned by this file:
 *
 *   state      event                                   next       action
 *   (none)     the drain stores a parking-lot message  dead       insert (dedupKey unique)
 *   dead       a redrive selects it (snapshot)         redriving  redriveId, redrivingAt set
 *   redriving  publish to the work queue confirmed     redriven   redrivenAt set
 *   redriving  publish failed                          dead       lastRedriveError set; the run stops
 *   redriving  the run died (older than the bound)     dead       a later redrive takes it again
 *   any        delete                                  (gone)     audit entry lists the ids
 *
 * A redrive works on the ids it read first, so a message that fails again (a new document with
 * redriveCount + 1, stored by the drain while the run goes on) is never picked by that run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_log.h"
#include "ops/ops_int.h"

#define DL "dead_letters"

/* x-failure-class of the worker's DLQ messages (obx_worker.h), and "transient" of older ones */
static const char *const dl_classes[] = {"malformed", "terminal", "exhausted", "infra", "transient"};
static const char *const dl_states[] = {"dead", "redriving", "redriven"};

static bool one_of(const char *s, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) return true;
  return false;
}

bool obx_ops_dl_filter_check(const obx_ops_dl_filter_t *f, obx_err_t *err) {
  if (f->failure_class && !one_of(f->failure_class, dl_classes, 5)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false,
                "unknown failure class \"%s\" (one of malformed, terminal, exhausted, infra, transient)", f->failure_class);
    return false;
  }
  if (f->state && !one_of(f->state, dl_states, 3)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "unknown dead-letter state \"%s\" (one of dead, redriving, redriven)",
                f->state);
    return false;
  }
  if (f->since_ms && f->until_ms && f->since_ms > f->until_ms) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "the time range ends before it starts");
    return false;
  }
  return true;
}

/* ---- the document of a message ----------------------------------------------------------------- */

static int header_int(const obx_envelope_t *msg, const char *name) {
  const char *v = obx_envelope_header(msg, name);
  return v ? atoi(v) : 0;
}

void obx_ops_dl_from_msg(const obx_envelope_t *msg, bson_t *out) {
  bson_t headers;
  const char *type = obx_envelope_header(msg, "ce_type"), *org = obx_envelope_header(msg, "ce_orgid");
  int redrives = header_int(msg, OBX_OPS_REDRIVE_COUNT_HEADER);
  char dedup[512];
  snprintf(dedup, sizeof dedup, "%s/%d/%d/%lld", msg->message_id ? msg->message_id : "", redrives, msg->attempt,
           (long long)msg->first_failure_ms);
  BSON_APPEND_UTF8(out, "dedupKey", dedup);
  BSON_APPEND_UTF8(out, "eventId", msg->message_id ? msg->message_id : "");
  if (type) BSON_APPEND_UTF8(out, "type", type);
  else BSON_APPEND_NULL(out, "type");
  if (org) BSON_APPEND_UTF8(out, "orgId", org);
  else BSON_APPEND_NULL(out, "orgId");
  if (msg->key) bson_append_utf8(out, "key", -1, msg->key, (int)msg->key_len);
  else BSON_APPEND_NULL(out, "key");
  BSON_APPEND_UTF8(out, "failureClass", msg->failure_class ? msg->failure_class : "terminal");
  BSON_APPEND_UTF8(out, "reason", msg->reason ? msg->reason : "");
  BSON_APPEND_UTF8(out, "lastError", msg->last_error ? msg->last_error : "");
  BSON_APPEND_INT32(out, "attempts", msg->attempt);
  /* history is a JSON array: parse it inside a wrapper document to keep it structured */
  int64_t last = 0;
  char *wrapped = msg->history ? bson_strdup_printf("{\"h\": %s}", msg->history) : NULL;
  bson_t *parsed = wrapped ? bson_new_from_json((const uint8_t *)wrapped, -1, NULL) : NULL;
  bson_iter_t it, entries;
  if (parsed && bson_iter_init_find(&it, parsed, "h") && BSON_ITER_HOLDS_ARRAY(&it)) {
    bson_append_iter(out, "history", -1, &it);
    if (bson_iter_recurse(&it, &entries))
      while (bson_iter_next(&entries)) {
        bson_iter_t at;
        int64_t ms;
        if (bson_iter_recurse(&entries, &at) && bson_iter_find(&at, "at") && BSON_ITER_HOLDS_UTF8(&at) &&
            obx_time_parse_rfc3339(bson_iter_utf8(&at, NULL), &ms) && ms > last)
          last = ms;
      }
  } else {
    bson_t empty;
    BSON_APPEND_ARRAY_BEGIN(out, "history", &empty);
    bson_append_array_end(out, &empty);
  }
  bson_destroy(parsed);
  bson_free(wrapped);
  BSON_APPEND_DOCUMENT_BEGIN(out, "headers", &headers);
  for (int i = 0; i < msg->nheaders; i++) {
    const char *name = msg->headers[i].name;
    if (strcmp(name, OBX_OPS_REDRIVE_COUNT_HEADER) == 0 || strcmp(name, OBX_OPS_REDRIVE_ID_HEADER) == 0) continue;
    bson_append_utf8(&headers, name, -1, msg->headers[i].value, (int)msg->headers[i].value_len);
  }
  bson_append_document_end(out, &headers);
  bson_append_utf8(out, "body", -1, msg->body ? msg->body : "", msg->body ? (int)msg->body_len : 0);
  if (msg->source) BSON_APPEND_UTF8(out, "source", msg->source);
  int64_t now = obx_time_now_ms();
  int64_t first = msg->first_failure_ms ? msg->first_failure_ms : last ? last : now;
  BSON_APPEND_DATE_TIME(out, "firstFailureAt", first);
  BSON_APPEND_DATE_TIME(out, "lastFailureAt", last ? last : first);
  BSON_APPEND_INT32(out, "redriveCount", redrives);
  const char *by = obx_envelope_header(msg, OBX_OPS_REDRIVE_ID_HEADER);
  if (by) BSON_APPEND_UTF8(out, "previousRedriveId", by);
  BSON_APPEND_UTF8(out, "state", "dead");
}

bool obx_ops_dl_store(obx_mongo_t *mongo, const obx_envelope_t *msg, bool *stored, obx_err_t *err) {
  char id[OBX_UUID_LEN + 1];
  obx_uuid7(id);
  bson_t doc = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&doc, "_id", id);
  obx_ops_dl_from_msg(msg, &doc);
  BSON_APPEND_DATE_TIME(&doc, "storedAt", obx_time_now_ms());
  mongoc_client_t *client = obx_mongo_pop(mongo);
  mongoc_collection_t *c = obx_mongo_collection(mongo, client, DL);
  bson_error_t berr;
  bool ok = mongoc_collection_insert_one(c, &doc, NULL, &reply, &berr);
  *stored = ok;
  if (!ok && berr.code == 11000) ok = true; /* the same message stored before: its ack was lost */
  else if (!ok) obx_err_from_bson(err, &berr, &reply);
  mongoc_collection_destroy(c);
  obx_mongo_push(mongo, client);
  bson_destroy(&reply);
  bson_destroy(&doc);
  return ok;
}

/* ---- selection ----------------------------------------------------------------------------------- */

/* text as a case-insensitive regular expression matching it literally */
static char *regex_literal(const char *text) {
  size_t n = strlen(text);
  char *re = malloc(2 * n + 1), *p = re;
  for (size_t i = 0; i < n; i++) {
    if (strchr("\\^$.|?*+()[]{}", text[i])) *p++ = '\\';
    *p++ = text[i];
  }
  *p = '\0';
  return re;
}

static void dl_selection(const obx_ops_dl_filter_t *f, bson_t *filter) {
  if (f->org) BSON_APPEND_UTF8(filter, "orgId", f->org);
  if (f->type) BSON_APPEND_UTF8(filter, "type", f->type);
  if (f->key) BSON_APPEND_UTF8(filter, "key", f->key);
  if (f->failure_class) BSON_APPEND_UTF8(filter, "failureClass", f->failure_class);
  if (f->event_id) BSON_APPEND_UTF8(filter, "eventId", f->event_id);
  if (f->state) BSON_APPEND_UTF8(filter, "state", f->state);
  ops_time_range(filter, "lastFailureAt", f->since_ms, f->until_ms);
  if (f->reason) {
    char *re = regex_literal(f->reason);
    bson_t *or = BCON_NEW("$or", "[", "{", "reason", BCON_REGEX(re, "i"), "}", "{", "lastError", BCON_REGEX(re, "i"), "}",
                          "]");
    bson_concat(filter, or);
    bson_destroy(or);
    free(re);
  }
  if (f->nids > 0) {
    bson_t in, arr;
    BSON_APPEND_DOCUMENT_BEGIN(filter, "_id", &in);
    BSON_APPEND_ARRAY_BEGIN(&in, "$in", &arr);
    for (int i = 0; i < f->nids; i++) ops_array_utf8(&arr, i, f->ids[i]);
    bson_append_array_end(&in, &arr);
    bson_append_document_end(filter, &in);
  }
}

/* An action on everything needs `all`; on named ids, no `all`. */
static bool dl_action_check(const obx_ops_dl_filter_t *f, obx_err_t *err) {
  if (!obx_ops_dl_filter_check(f, err)) return false;
  if (f->all == (f->nids > 0)) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "choose the dead-letter ids, or all (with the filters given)");
    return false;
  }
  return true;
}

typedef struct {
  char **v;
  int n, cap;
} ids_t;

static void ids_add(ids_t *ids, const char *id) {
  if (ids->n == ids->cap) {
    ids->cap = ids->cap ? 2 * ids->cap : 64;
    ids->v = realloc(ids->v, (size_t)ids->cap * sizeof *ids->v);
  }
  ids->v[ids->n++] = strdup(id);
}

static bool ids_has(const ids_t *ids, const char *id) {
  for (int i = 0; i < ids->n; i++)
    if (strcmp(ids->v[i], id) == 0) return true;
  return false;
}

static void ids_free(ids_t *ids) {
  for (int i = 0; i < ids->n; i++) free(ids->v[i]);
  free(ids->v);
  memset(ids, 0, sizeof *ids);
}

static void ids_append(bson_t *out, const char *name, const ids_t *ids) {
  bson_t arr;
  BSON_APPEND_ARRAY_BEGIN(out, name, &arr);
  for (int i = 0; i < ids->n; i++) ops_array_utf8(&arr, i, ids->v[i]);
  bson_append_array_end(out, &arr);
}

/* The ids of the documents matching filter (and extra, when not NULL), oldest failure first. */
static bool dl_snapshot(const obx_ops_t *ops, const bson_t *filter, const bson_t *extra, ids_t *ids, obx_err_t *err) {
  bson_t query = BSON_INITIALIZER, arr;
  if (extra) {
    BSON_APPEND_ARRAY_BEGIN(&query, "$and", &arr);
    ops_array_doc(&arr, 0, filter);
    ops_array_doc(&arr, 1, extra);
    bson_append_array_end(&query, &arr);
  } else {
    bson_concat(&query, filter);
  }
  bson_t *opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}", "sort", "{", "lastFailureAt", BCON_INT32(1),
                          "_id", BCON_INT32(1), "}");
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, DL);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &query, opts, NULL);
  const bson_t *doc;
  while (mongoc_cursor_next(cursor, &doc)) {
    const char *id = obx_mongo_doc_str(doc, "_id");
    if (id) ids_add(ids, id);
  }
  bool ok = obx_mongo_cursor_end(cursor, err);
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  bson_destroy(opts);
  bson_destroy(&query);
  return ok;
}

/* Every id the caller named exists (in org): NOT_FOUND naming the first that does not. */
static bool dl_ids_exist(const obx_ops_t *ops, const obx_ops_dl_filter_t *f, obx_err_t *err) {
  if (f->nids == 0) return true;
  obx_ops_dl_filter_t scope = {.org = f->org, .ids = f->ids, .nids = f->nids};
  bson_t filter = BSON_INITIALIZER;
  dl_selection(&scope, &filter);
  ids_t found = {0};
  bool ok = dl_snapshot(ops, &filter, NULL, &found, err);
  for (int i = 0; ok && i < f->nids; i++)
    if (!ids_has(&found, f->ids[i])) {
      obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no dead letter %s", f->ids[i]);
      ok = false;
    }
  ids_free(&found);
  bson_destroy(&filter);
  return ok;
}

/* ---- reading ----------------------------------------------------------------------------------- */

bool obx_ops_dl_list(const obx_ops_t *ops, const obx_ops_dl_filter_t *f, const obx_ops_page_t *page, bson_t *out,
                     obx_err_t *err) {
  if (!obx_ops_dl_filter_check(f, err)) return false;
  bson_t filter = BSON_INITIALIZER;
  dl_selection(f, &filter);
  bson_t *projection = BCON_NEW("body", BCON_INT32(0), "headers", BCON_INT32(0), "history", BCON_INT32(0));
  bool ok = ops_find_page(ops, DL, &filter, "lastFailureAt", "_id", -1, projection, page, out, err);
  bson_destroy(projection);
  bson_destroy(&filter);
  return ok;
}

bool obx_ops_dl_get(const obx_ops_t *ops, const char *org, const char *id, bson_t *out, obx_err_t *err) {
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id));
  if (org) BSON_APPEND_UTF8(filter, "orgId", org);
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, DL);
  bool found = false;
  bool ok = obx_mongo_find_one(c, filter, NULL, NULL, out, &found, err);
  if (ok && !found) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "no dead letter %s", id);
    ok = false;
  }
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  bson_destroy(filter);
  return ok;
}

bool obx_ops_dl_stats(obx_mongo_t *mongo, mongoc_client_t *client, const char *org, int64_t *count, int64_t *oldest_ms,
                      obx_err_t *err) {
  bson_t *filter = BCON_NEW("state", "{", "$in", "[", BCON_UTF8("dead"), BCON_UTF8("redriving"), "]", "}");
  if (org) BSON_APPEND_UTF8(filter, "orgId", org);
  bson_t *sort = BCON_NEW("firstFailureAt", BCON_INT32(1));
  mongoc_collection_t *c = obx_mongo_collection(mongo, client, DL);
  bson_error_t berr;
  bson_t oldest = BSON_INITIALIZER;
  bool found = false;
  *count = mongoc_collection_count_documents(c, filter, NULL, NULL, NULL, &berr);
  bool ok = *count >= 0;
  if (!ok) obx_err_from_bson(err, &berr, NULL);
  ok = ok && obx_mongo_find_one(c, filter, sort, NULL, &oldest, &found, err);
  bson_iter_t it;
  *oldest_ms = found && bson_iter_init_find(&it, &oldest, "firstFailureAt") && BSON_ITER_HOLDS_DATE_TIME(&it)
                 ? bson_iter_date_time(&it) : 0;
  bson_destroy(&oldest);
  mongoc_collection_destroy(c);
  bson_destroy(sort);
  bson_destroy(filter);
  return ok;
}

/* ---- redrive ----------------------------------------------------------------------------------- */

/* The message a dead letter becomes on the work queue: attempts 0, history kept, the next
 * redrive count and this redrive's id as headers. msg initialised. */
static void dl_to_msg(const bson_t *doc, const char *redrive_id, obx_envelope_t *msg) {
  obx_ce_header_t hdrs[OBX_ENVELOPE_MAX_HEADERS];
  char *values[2];
  int n = 0;
  bson_iter_t it, h;
  if (bson_iter_init_find(&it, doc, "headers") && bson_iter_recurse(&it, &h))
    while (bson_iter_next(&h) && n < OBX_ENVELOPE_MAX_HEADERS - 2) {
      if (!BSON_ITER_HOLDS_UTF8(&h)) continue;
      uint32_t len;
      hdrs[n].name = bson_iter_key(&h);
      hdrs[n].value = bson_iter_utf8(&h, &len);
      hdrs[n++].len = len;
    }
  bson_iter_t rc;
  int redrives = bson_iter_init_find(&rc, doc, "redriveCount") ? (int)bson_iter_as_int64(&rc) : 0;
  values[0] = bson_strdup_printf("%d", redrives + 1);
  values[1] = bson_strdup(redrive_id);
  hdrs[n++] = (obx_ce_header_t){OBX_OPS_REDRIVE_COUNT_HEADER, values[0], strlen(values[0])};
  hdrs[n++] = (obx_ce_header_t){OBX_OPS_REDRIVE_ID_HEADER, values[1], strlen(values[1])};
  const char *key = obx_mongo_doc_str(doc, "key"), *body = obx_mongo_doc_str(doc, "body");
  obx_envelope_from_record(msg, obx_mongo_doc_str(doc, "eventId"), key, key ? strlen(key) : 0, body,
                             body ? strlen(body) : 0, hdrs, n);
  msg->attempt = 0;
  if (bson_iter_init_find(&it, doc, "firstFailureAt") && BSON_ITER_HOLDS_DATE_TIME(&it))
    msg->first_failure_ms = bson_iter_date_time(&it);
  const char *s;
  if ((s = obx_mongo_doc_str(doc, "lastError"))) msg->last_error = strdup(s);
  if ((s = obx_mongo_doc_str(doc, "failureClass"))) msg->failure_class = strdup(s);
  if ((s = obx_mongo_doc_str(doc, "source"))) msg->source = strdup(s);
  if (bson_iter_init_find(&it, doc, "history") && BSON_ITER_HOLDS_ARRAY(&it)) {
    const uint8_t *data;
    uint32_t len;
    bson_t arr;
    bson_iter_array(&it, &len, &data);
    if (bson_init_static(&arr, data, len)) {
      char *json = bson_array_as_json(&arr, NULL);
      msg->history = json ? strdup(json) : NULL;
      bson_free(json);
    }
  }
  bson_free(values[0]);
  bson_free(values[1]);
}

/* Moves one dead letter from `from` (a state filter) to `set`; the document after the move
 * into doc when doc is not NULL; *moved false when it was not in `from`. */
static bool dl_move(const obx_ops_t *ops, const char *id, const bson_t *from, const bson_t *set, bson_t *doc,
                    bool *moved, obx_err_t *err) {
  bson_t query = BSON_INITIALIZER, update = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&query, "_id", id);
  bson_concat(&query, from);
  BSON_APPEND_DOCUMENT(&update, "$set", set);
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, DL);
  mongoc_find_and_modify_opts_t *fam = mongoc_find_and_modify_opts_new();
  mongoc_find_and_modify_opts_set_update(fam, &update);
  mongoc_find_and_modify_opts_set_flags(fam, MONGOC_FIND_AND_MODIFY_RETURN_NEW);
  bson_error_t berr;
  bool ok = mongoc_collection_find_and_modify_with_opts(c, &query, fam, &reply, &berr);
  bson_iter_t it;
  *moved = false;
  if (!ok) {
    obx_err_from_bson(err, &berr, &reply);
  } else if (bson_iter_init_find(&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
    *moved = true;
    if (doc) {
      const uint8_t *data;
      uint32_t len;
      bson_t value;
      bson_iter_document(&it, &len, &data);
      if (bson_init_static(&value, data, len)) bson_concat(doc, &value);
    }
  }
  mongoc_find_and_modify_opts_destroy(fam);
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  bson_destroy(&reply);
  bson_destroy(&update);
  bson_destroy(&query);
  return ok;
}

/* {state: dead} or a redriving run that died. */
static bson_t *redrivable(void) {
  return BCON_NEW("$or", "[", "{", "state", BCON_UTF8("dead"), "}", "{", "state", BCON_UTF8("redriving"),
                  "redrivingAt", "{", "$lt", BCON_DATE_TIME(obx_time_now_ms() - OBX_OPS_REDRIVE_STALE_MS), "}", "}",
                  "]");
}

/* One dead letter through redriving -> redriven (or back to dead). *taken false when another run
 * had it. */
static bool redrive_one(const obx_ops_t *ops, const char *id, const char *redrive_id, bool *taken, obx_err_t *err) {
  bson_t *from = redrivable();
  bson_t *set = BCON_NEW("state", BCON_UTF8("redriving"), "redriveId", BCON_UTF8(redrive_id), "redrivingAt",
                         BCON_DATE_TIME(obx_time_now_ms()));
  bson_t doc = BSON_INITIALIZER;
  bool ok = dl_move(ops, id, from, set, &doc, taken, err);
  if (ok && *taken) {
    obx_envelope_t msg;
    obx_envelope_init(&msg);
    dl_to_msg(&doc, redrive_id, &msg);
    bool published = obx_ladder_publish_work(ops->ladder, &msg, err);
    obx_envelope_cleanup(&msg);
    bson_t *mine = BCON_NEW("state", BCON_UTF8("redriving"), "redriveId", BCON_UTF8(redrive_id));
    bson_t *next = published ? BCON_NEW("state", BCON_UTF8("redriven"), "redrivenAt", BCON_DATE_TIME(obx_time_now_ms()))
                             : BCON_NEW("state", BCON_UTF8("dead"), "lastRedriveError", BCON_UTF8(err->msg));
    bool moved;
    obx_err_t merr = OBX_ERR_INIT;
    bool marked = dl_move(ops, id, mine, next, NULL, &moved, &merr);
    if (published && !marked) *err = merr; /* published but not marked: it stays redriving, stale later */
    ok = published && marked;
    bson_destroy(next);
    bson_destroy(mine);
  }
  bson_destroy(&doc);
  bson_destroy(set);
  bson_destroy(from);
  return ok;
}

bool obx_ops_dl_redrive(const obx_ops_t *ops, const obx_ops_dl_filter_t *f, bool dry_run, bson_t *out,
                        obx_err_t *err) {
  if (!dl_action_check(f, err) || (!dry_run && !ops_need_ladder(ops, err)) || !dl_ids_exist(ops, f, err))
    return false;
  char redrive_id[OBX_UUID_LEN + 1];
  obx_uuid7(redrive_id);
  bson_t filter = BSON_INITIALIZER;
  dl_selection(f, &filter);
  bson_t *from = redrivable();
  ids_t snap = {0}, moved = {0};
  int skipped = 0;
  bool ok = dl_snapshot(ops, &filter, from, &snap, err);
  for (int i = 0; ok && !dry_run && i < snap.n; i++) {
    bool taken = false;
    ok = redrive_one(ops, snap.v[i], redrive_id, &taken, err);
    if (ok && taken) ids_add(&moved, snap.v[i]);
    else if (ok) skipped++;
  }
  const ids_t *listed = dry_run ? &snap : &moved;
  if (f->nids > 0) skipped += f->nids - snap.n; /* named ids already redriven */
  if (!dry_run && moved.n > 0) {
    bson_t details = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&details, "redriveId", redrive_id);
    BSON_APPEND_INT32(&details, "count", moved.n);
    ids_append(&details, "ids", &moved);
    if (!ok) BSON_APPEND_UTF8(&details, "error", err->msg);
    obx_err_t aerr = OBX_ERR_INIT;
    const char *target = f->nids == 1 ? f->ids[0] : redrive_id;
    if (!obx_ops_audit(ops, NULL, "dlq.redrive", target, f->org, &details, &aerr) && ok) {
      *err = aerr;
      ok = false;
    }
    bson_destroy(&details);
  }
  if (ok) {
    BSON_APPEND_UTF8(out, "redriveId", redrive_id);
    BSON_APPEND_BOOL(out, "dryRun", dry_run);
    BSON_APPEND_INT32(out, "count", listed->n);
    ids_append(out, "ids", listed);
    BSON_APPEND_INT32(out, "skipped", skipped);
  }
  ids_free(&moved);
  ids_free(&snap);
  bson_destroy(from);
  bson_destroy(&filter);
  return ok;
}

/* ---- delete and export ------------------------------------------------------------------------- */

typedef struct {
  const obx_ops_t *ops;
  const obx_ops_dl_filter_t *f;
  const ids_t *ids;
  int64_t deleted;
} delete_t;

static bool delete_txn(mongoc_client_session_t *session, void *p, obx_err_t *err) {
  delete_t *d = p;
  const obx_ops_t *ops = d->ops;
  obx_ops_dl_filter_t by_id = {.org = d->f->org, .ids = (const char *const *)d->ids->v, .nids = d->ids->n};
  bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, reply = BSON_INITIALIZER, details = BSON_INITIALIZER;
  dl_selection(&by_id, &filter);
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, DL);
  bson_error_t berr;
  bool ok = mongoc_client_session_append(session, &opts, &berr) &&
            mongoc_collection_delete_many(c, &filter, &opts, &reply, &berr);
  bson_iter_t it;
  if (!ok) obx_err_from_bson(err, &berr, &reply);
  else d->deleted = bson_iter_init_find(&it, &reply, "deletedCount") ? bson_iter_as_int64(&it) : 0;
  if (ok) {
    BSON_APPEND_INT64(&details, "count", d->deleted);
    ids_append(&details, "ids", d->ids);
    ok = obx_ops_audit(ops, session, "dlq.delete", d->ids->n == 1 ? d->ids->v[0] : "*", d->f->org, &details, err);
  }
  mongoc_collection_destroy(c);
  bson_destroy(&details);
  bson_destroy(&reply);
  bson_destroy(&opts);
  bson_destroy(&filter);
  return ok;
}

bool obx_ops_dl_delete(const obx_ops_t *ops, const obx_ops_dl_filter_t *f, bool dry_run, bson_t *out,
                       obx_err_t *err) {
  if (!dl_action_check(f, err) || !dl_ids_exist(ops, f, err)) return false;
  bson_t filter = BSON_INITIALIZER;
  dl_selection(f, &filter);
  ids_t snap = {0};
  bool ok = dl_snapshot(ops, &filter, NULL, &snap, err);
  delete_t d = {ops, f, &snap, 0};
  if (ok && !dry_run && snap.n > 0) ok = obx_mongo_transaction(ops->mongo, delete_txn, &d, err);
  if (ok) {
    BSON_APPEND_BOOL(out, "dryRun", dry_run);
    BSON_APPEND_INT32(out, "count", dry_run ? snap.n : (int)d.deleted);
    ids_append(out, "ids", &snap);
  }
  ids_free(&snap);
  bson_destroy(&filter);
  return ok;
}

bool obx_ops_dl_export(const obx_ops_t *ops, const obx_ops_dl_filter_t *f, obx_ops_emit_fn emit, void *ctx,
                       int64_t *count, obx_err_t *err) {
  if (!obx_ops_dl_filter_check(f, err) || !dl_ids_exist(ops, f, err)) return false;
  bson_t filter = BSON_INITIALIZER, details = BSON_INITIALIZER;
  dl_selection(f, &filter);
  bson_t *opts = BCON_NEW("sort", "{", "lastFailureAt", BCON_INT32(1), "_id", BCON_INT32(1), "}");
  ids_t ids = {0};
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  mongoc_collection_t *c = obx_mongo_collection(ops->mongo, client, DL);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, &filter, opts, NULL);
  const bson_t *doc;
  bool ok = true;
  while (ok && mongoc_cursor_next(cursor, &doc)) {
    const char *id = obx_mongo_doc_str(doc, "_id");
    if (id) ids_add(&ids, id);
    if (!emit(ctx, doc)) {
      obx_err_set(err, OBX_ERR_SYS, 0, false, "the export could not be written");
      ok = false;
    }
  }
  ok = obx_mongo_cursor_end(cursor, ok ? err : NULL) && ok; /* a failed export keeps its own error */
  mongoc_collection_destroy(c);
  obx_mongo_push(ops->mongo, client);
  *count = ids.n;
  BSON_APPEND_INT32(&details, "count", ids.n);
  ids_append(&details, "ids", &ids);
  if (!ok) BSON_APPEND_UTF8(&details, "error", err->msg);
  obx_err_t aerr = OBX_ERR_INIT;
  if (!obx_ops_audit(ops, NULL, "dlq.export", ids.n == 1 ? ids.v[0] : "*", f->org, &details, &aerr) && ok) {
    *err = aerr;
    ok = false;
  }
  ids_free(&ids);
  bson_destroy(opts);
  bson_destroy(&details);
  bson_destroy(&filter);
  return ok;
}
