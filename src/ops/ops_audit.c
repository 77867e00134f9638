/* ops_audit.c - audit_log: the one writer of its entries, and the operators' query
 *
 * DESIGN: see obx_ops.h. Every operator action of src/ops/ records itself through
 * obx_ops_audit; nothing else writes audit_log. The query reads by {orgId, when} and
 * {action, when} (indexes declared in src/lib/schema.c). */
#include <string.h>

#include "ops/ops_int.h"

bool obx_ops_audit(const obx_ops_t *ops, mongoc_client_session_t *session, const char *action, const char *target,
                   const char *org, const bson_t *details, obx_err_t *err) {
  char id[OBX_UUID_LEN + 1];
  obx_uuid7(id);
  bson_t entry = BSON_INITIALIZER, opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&entry, "_id", id);
  bool known = ops->who && ops->who[0];
  BSON_APPEND_UTF8(&entry, "who", known ? ops->who : "unknown");
  BSON_APPEND_UTF8(&entry, "whoFrom", known && ops->who_from ? ops->who_from : "none");
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

bool obx_ops_audit_list(const obx_ops_t *ops, const obx_ops_audit_filter_t *f, const obx_ops_page_t *page,
                        bson_t *out, obx_err_t *err) {
  bson_t filter = BSON_INITIALIZER;
  if (f->org) BSON_APPEND_UTF8(&filter, "orgId", f->org);
  if (f->action) BSON_APPEND_UTF8(&filter, "action", f->action);
  if (f->target) BSON_APPEND_UTF8(&filter, "target", f->target);
  if (f->who) BSON_APPEND_UTF8(&filter, "who", f->who);
  ops_time_range(&filter, "when", f->since_ms, f->until_ms);
  bool ok = ops_find_page(ops, "audit_log", &filter, "when", "_id", -1, NULL, page, out, err);
  bson_destroy(&filter);
  return ok;
}
