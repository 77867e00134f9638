/* ops_keys.c - business keys parked behind a failing event: list and release
 *
 * DESIGN: see obx_ops.h. parked_keys documents carry no org: a key belongs to the org of its
 * head event's inbox entry. A release is one transaction (the key moves to its oldest BLOCKED
 * event, or is unparked, and the audit_log entry is written with it); the event is published
 * after the commit: when the publish fails the key stays parked on it, still BLOCKED, and the
 * same release picks it again. The dry run reads the same documents and writes nothing. */
#include <stdio.h>
#include <string.h>

#include "obx/obx_inbox.h"
#include "ops/ops_int.h"

/* The org of an inbox entry into org (empty when unknown). */
static bool entry_org(const obx_ops_t *ops, mongoc_client_t *client, mongoc_client_session_t *session,
                      const char *event_id, char org[128], obx_err_t *err) {
  bson_t doc = BSON_INITIALIZER;
  bool found = false;
  org[0] = '\0';
  bool ok = !event_id || !*event_id ||
            obx_inbox_get(client, obx_mongo_db_name(ops->mongo), session, ops->consumer, event_id, &doc, &found, err);
  const char *o = found ? obx_mongo_doc_str(&doc, "orgId") : NULL;
  if (o) snprintf(org, 128, "%s", o);
  bson_destroy(&doc);
  return ok;
}

bool obx_ops_keys_list(const obx_ops_t *ops, const char *org, bson_t *out, obx_err_t *err) {
  bson_t all = BSON_INITIALIZER, items;
  mongoc_client_t *client = obx_mongo_pop(ops->mongo);
  bool ok = obx_inbox_list_parked(client, obx_mongo_db_name(ops->mongo), ops->consumer, &all, err);
  int n = 0;
  bson_iter_t it, keys;
  BSON_APPEND_ARRAY_BEGIN(out, "items", &items);
  if (ok && bson_iter_init_find(&it, &all, "keys") && bson_iter_recurse(&it, &keys)) {
    while (ok && bson_iter_next(&keys)) {
      const uint8_t *data;
      uint32_t len;
      bson_t key, item = BSON_INITIALIZER;
      bson_iter_document(&keys, &len, &data);
      if (!bson_init_static(&key, data, len)) continue;
      char key_org[128];
      ok = entry_org(ops, client, NULL, obx_mongo_doc_str(&key, "headEventId"), key_org, err);
      if (ok && (!org || strcmp(org, key_org) == 0)) {
        bson_concat(&item, &key);
        if (key_org[0]) BSON_APPEND_UTF8(&item, "orgId", key_org);
        else BSON_APPEND_NULL(&item, "orgId");
        ops_array_doc(&items, n++, &item);
      }
      bson_destroy(&item);
    }
  }
  bson_append_array_end(out, &items);
  BSON_APPEND_INT32(out, "count", n);
  BSON_APPEND_NULL(out, "next");
  obx_mongo_push(ops->mongo, client);
  bson_destroy(&all);
  return ok;
}

typedef struct {
  const obx_ops_t *ops;
  const char *org, *key;
  bool dry_run;
  char next[OBX_UUID_LEN + 1];
  bson_t next_doc; /* the oldest BLOCKED entry, when found */
  bool found;
} release_t;

static bool release_txn(mongoc_client_session_t *session, void *p, obx_err_t *err) {
  release_t *r = p;
  const obx_ops_t *ops = r->ops;
  const char *db = obx_mongo_db_name(ops->mongo);
  mongoc_client_t *client = session ? mongoc_client_session_get_client(session) : obx_mongo_pop(ops->mongo);
  bson_t details = BSON_INITIALIZER;
  bool parked = false, ok = false;
  char head[OBX_UUID_LEN + 1] = "", org[128] = "";
  r->next[0] = '\0';
  bson_reinit(&r->next_doc);
  r->found = false;
  if (!obx_inbox_key_parked(client, db, session, ops->consumer, r->key, &parked, head, err)) goto done;
  if (parked && !entry_org(ops, client, session, head, org, err)) goto done;
  if (!parked || (r->org && strcmp(r->org, org) != 0)) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "key %s is not parked for consumer %s", r->key, ops->consumer);
    goto done;
  }
  if (!obx_inbox_next_blocked(client, db, session, ops->consumer, r->key, &r->next_doc, &r->found, err)) goto done;
  if (r->found) {
    const char *next = obx_mongo_doc_str(&r->next_doc, "_id.eventId");
    snprintf(r->next, sizeof r->next, "%s", next ? next : "");
  }
  if (r->dry_run) {
    ok = true;
    goto done;
  }
  /* The oldest blocked event becomes the head, so the worker releases the rest after it. */
  if (r->found ? !obx_inbox_park_key(client, db, session, ops->consumer, r->key, r->next, "released by an operator", err)
               : !obx_inbox_unpark_key(client, db, session, ops->consumer, r->key, err))
    goto done;
  BSON_APPEND_UTF8(&details, "consumer", ops->consumer);
  BSON_APPEND_UTF8(&details, "previousHead", head);
  BSON_APPEND_UTF8(&details, "nextEvent", r->next);
  ok = obx_ops_audit(ops, session, "keys.release", r->key, org[0] ? org : NULL, &details, err);
done:
  if (!session) obx_mongo_push(ops->mongo, client);
  bson_destroy(&details);
  return ok;
}

bool obx_ops_key_release(const obx_ops_t *ops, const char *org, const char *key, bool dry_run, bson_t *out,
                         obx_err_t *err) {
  release_t r = {.ops = ops, .org = org, .key = key, .dry_run = dry_run};
  bson_init(&r.next_doc);
  bool ok = (dry_run || ops_need_ladder(ops, err)) &&
            (dry_run ? release_txn(NULL, &r, err) : obx_mongo_transaction(ops->mongo, release_txn, &r, err)) &&
            (dry_run || !r.found || ops_publish_entry(ops, &r.next_doc, NULL, err));
  if (ok) {
    BSON_APPEND_UTF8(out, "key", key);
    BSON_APPEND_BOOL(out, "dryRun", dry_run);
    if (r.next[0]) BSON_APPEND_UTF8(out, "nextEvent", r.next);
    else BSON_APPEND_NULL(out, "nextEvent");
  }
  bson_destroy(&r.next_doc);
  return ok;
}
