/* outbox.c - append domain events to the outbox inside the caller's transaction
 *
 * DESIGN: one insert_one with the session in its opts; the document comes from
 * obx_event_to_outbox so every writer (API, pipelines, other services) produces the same
 * public schema. Stateless and thread-safe. */
#include "obx/obx_outbox.h"

#include <assert.h>

bool obx_outbox_append(mongoc_client_session_t *session, mongoc_collection_t *outbox,
                       const obx_event_t *event, obx_err_t *err) {
  assert(mongoc_client_session_in_transaction(session));
  bool ok = false;
  obx_event_t ev;
  bson_t doc = BSON_INITIALIZER, opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  bson_error_t berr;
  obx_event_init(&ev);
  obx_event_copy(&ev, event);
  if (!obx_event_finalize(&ev, err) || !obx_event_to_outbox(&ev, &doc, err)) goto done;
  if (!mongoc_client_session_append(session, &opts, &berr)) {
    obx_err_from_bson(err, &berr, NULL);
    goto done;
  }
  bson_destroy(&reply);
  if (!mongoc_collection_insert_one(outbox, &doc, &opts, &reply, &berr)) {
    obx_err_from_bson(err, &berr, &reply);
    obx_err_prefix(err, "outbox insert of event %s", ev.id);
    goto done;
  }
  ok = true;
done:
  bson_destroy(&reply);
  bson_destroy(&opts);
  bson_destroy(&doc);
  obx_event_cleanup(&ev);
  return ok;
}
