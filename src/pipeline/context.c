/* context.c - the template contexts of event runs and order.pre runs
 *
 * DESIGN: the seed's templates ({{orderNumber}}, {{order.totalAmount}}) read an OrderConfirmed
 * fat event; this file gives every caller the same context shape (obx_pipeline.h). */
#include "pipeline_int.h"

#include <string.h>

static const char *const reserved[] = {"event", "payload", "order", "steps", NULL};

static bool is_reserved(const char *key) {
  for (const char *const *r = reserved; *r; r++)
    if (strcmp(*r, key) == 0) return true;
  return false;
}

static void opt_utf8(bson_t *doc, const char *key, const char *value) {
  if (value) BSON_APPEND_UTF8(doc, key, value);
}

void obx_pipeline_context_from_event(const obx_event_t *ev, bson_t *ctx) {
  bson_t event;
  bson_iter_t it;
  BSON_APPEND_DOCUMENT_BEGIN(ctx, "event", &event);
  BSON_APPEND_UTF8(&event, "id", ev->id);
  opt_utf8(&event, "type", ev->event_type);
  BSON_APPEND_INT32(&event, "version", ev->event_version);
  opt_utf8(&event, "orgId", ev->org_id);
  opt_utf8(&event, "aggregateType", ev->aggregate_type);
  opt_utf8(&event, "aggregateId", ev->aggregate_id);
  opt_utf8(&event, "partitionKey", ev->partition_key);
  opt_utf8(&event, "correlationId", ev->correlation_id);
  opt_utf8(&event, "causationId", ev->causation_id);
  BSON_APPEND_DATE_TIME(&event, "occurredAt", ev->occurred_at_ms);
  bson_append_document_end(ctx, &event);
  BSON_APPEND_DOCUMENT(ctx, "payload", &ev->payload);
  if (bson_iter_init_find(&it, &ev->payload, "order") && BSON_ITER_HOLDS_DOCUMENT(&it))
    bson_append_iter(ctx, "order", -1, &it);
  else
    BSON_APPEND_DOCUMENT(ctx, "order", &ev->payload);
  if (bson_iter_init(&it, &ev->payload))
    while (bson_iter_next(&it))
      if (!is_reserved(bson_iter_key(&it))) bson_append_iter(ctx, bson_iter_key(&it), -1, &it);
}

void obx_pipeline_context_from_order(const bson_t *order, bson_t *ctx) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, order, "orderNumber")) bson_append_iter(ctx, "orderNumber", -1, &it);
  if (bson_iter_init_find(&it, order, "orgId")) bson_append_iter(ctx, "orgId", -1, &it);
  BSON_APPEND_DOCUMENT(ctx, "order", order);
}
