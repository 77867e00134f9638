/* commit.c - phase 2 of a run: effects and tracking written in one transaction
 *
 * DESIGN: obx_pipeline_run_commit writes, with the caller's session (so inside the caller's
 * transaction): the set-status entries on the order (orders.statusHistory $push, and
 * orders.pipelineStatus = the last entry), the emit-event events (obx_outbox_append) and the
 * pipeline_executions document. The run is not changed, so the commit may be repeated when
 * the caller's transaction is retried. Without a session it runs in a transaction of its own
 * (mongoc_client_session_with_transaction). */
#include "pipeline_int.h"

#include <string.h>

#include "obx/obx_outbox.h"

static bool write_effects(obx_pipeline_run_t *run, mongoc_client_t *client, const char *db,
                          mongoc_client_session_t *session, obx_err_t *err) {
  bson_t opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  bson_error_t berr;
  bool ok = false;
  mongoc_collection_t *orders = mongoc_client_get_collection(client, db, "orders");
  mongoc_collection_t *outbox = mongoc_client_get_collection(client, db, "outbox");
  mongoc_collection_t *executions = mongoc_client_get_collection(client, db, "pipeline_executions");
  if (!mongoc_client_session_append(session, &opts, &berr)) {
    obx_err_from_bson(err, &berr, NULL);
    goto done;
  }
  const bson_t *statuses = obx_pipeline_run_statuses(run);
  if (!bson_empty(statuses)) {
    bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, push, each, set;
    bson_iter_t it;
    BSON_APPEND_UTF8(&filter, "_id", obx_pipeline_run_aggregate_id(run));
    BSON_APPEND_UTF8(&filter, "orgId", obx_pipeline_run_org_id(run));
    BSON_APPEND_DOCUMENT_BEGIN(&update, "$push", &push);
    BSON_APPEND_DOCUMENT_BEGIN(&push, "statusHistory", &each);
    BSON_APPEND_ARRAY(&each, "$each", statuses);
    bson_append_document_end(&push, &each);
    bson_append_document_end(&update, &push);
    bson_iter_t last;
    bson_iter_init(&it, statuses);
    while (bson_iter_next(&it)) last = it;
    BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
    bson_append_iter(&set, "pipelineStatus", -1, &last);
    bson_append_document_end(&update, &set);
    bson_destroy(&reply);
    bool updated = mongoc_collection_update_one(orders, &filter, &update, &opts, &reply, &berr);
    bson_destroy(&update);
    bson_destroy(&filter);
    if (!updated) {
      obx_err_from_bson(err, &berr, &reply);
      goto done;
    }
    if (bson_iter_init_find(&it, &reply, "matchedCount") && bson_iter_as_int64(&it) == 0) {
      obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "set-status: order %s of org %s not found",
                  obx_pipeline_run_aggregate_id(run), obx_pipeline_run_org_id(run));
      goto done;
    }
  }
  for (int i = 0; i < obx_pipeline_run_nevents(run); i++)
    if (!obx_outbox_append(session, outbox, obx_pipeline_run_event(run, i), err)) goto done;
  bson_destroy(&reply);
  bson_init(&reply);
  if (!mongoc_collection_insert_one(executions, obx_pipeline_run_execution(run), &opts, &reply, &berr)) {
    obx_err_from_bson(err, &berr, &reply);
    goto done;
  }
  ok = true;
done:
  mongoc_collection_destroy(executions);
  mongoc_collection_destroy(outbox);
  mongoc_collection_destroy(orders);
  bson_destroy(&reply);
  bson_destroy(&opts);
  return ok;
}

typedef struct {
  obx_pipeline_run_t *run;
  mongoc_client_t *client;
  const char *db;
  obx_err_t err;
} txn_t;

/* mongoc_client_session_with_transaction callback: a retriable error is labelled
 * TransientTransactionError so that the driver runs the callback again. */
static bool txn_cb(mongoc_client_session_t *session, void *ctx, bson_t **reply, bson_error_t *error) {
  txn_t *t = ctx;
  obx_err_clear(&t->err);
  if (write_effects(t->run, t->client, t->db, session, &t->err)) return true;
  bson_set_error(error, MONGOC_ERROR_COMMAND, (uint32_t)t->err.code, "%s", t->err.msg);
  if (t->err.retriable) {
    *reply = BCON_NEW("errorLabels", "[", "TransientTransactionError", "]");
  }
  return false;
}

bool obx_pipeline_run_commit(obx_pipeline_run_t *run, mongoc_client_t *client, const char *db,
                             mongoc_client_session_t *session, obx_err_t *err) {
  if (session) return write_effects(run, client, db, session, err);
  bson_error_t berr;
  bson_t reply;
  txn_t t = {.run = run, .client = client, .db = db};
  mongoc_client_session_t *own = mongoc_client_start_session(client, NULL, &berr);
  if (!own) {
    obx_err_from_bson(err, &berr, NULL);
    return false;
  }
  bool ok = mongoc_client_session_with_transaction(own, txn_cb, NULL, &t, &reply, &berr);
  if (!ok) {
    if (t.err.domain != OBX_ERR_NONE) {
      if (err) *err = t.err;
    } else {
      obx_err_from_bson(err, &berr, &reply);
    }
  }
  bson_destroy(&reply);
  mongoc_client_session_destroy(own);
  return ok;
}

bool obx_pipeline_run(const obx_pipeline_t *pipeline, const obx_pipeline_input_t *input, const obx_egress_t *egress,
                      mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                      obx_pipeline_result_t *result, obx_err_t *err) {
  obx_pipeline_run_t *run = obx_pipeline_execute(pipeline, input, egress);
  memset(result, 0, sizeof *result);
  result->status = obx_pipeline_run_status(run);
  result->failure_class = obx_pipeline_run_failure_class(run);
  memcpy(result->execution_id, obx_pipeline_run_execution_id(run), sizeof result->execution_id);
  result->error = *obx_pipeline_run_error(run);
  bool ok = obx_pipeline_run_commit(run, client, db, session, err);
  obx_pipeline_run_destroy(run);
  return ok;
}
