/* obx_api.h - the api role: POST /orders, GET /orders/:id
 *
 * DESIGN: the api role owns its MongoDB pool, creates the orders/outbox indexes in the
 * background (retrying while MongoDB is down, so the process starts regardless) and
 * registers its routes on the shared HTTP server. POST /orders writes the order and its
 * OrderConfirmed outbox event in one transaction (DESIGN.md §3, §7; README "Orders API").
 *
 * The order.pre hook: when set (before obx_api_start), every POST /orders runs
 *   execute  before the transaction (it may call out over HTTP; it must not write), then
 *   commit   inside the order's transaction, after the order and its event are inserted,
 *            to write the run's effects and the events it emitted with the same session,
 *   release  once the request is done, whatever happened.
 * A false from execute rejects the order: err INPUT or PIPELINE -> 422, retriable -> 503. */
#ifndef OBX_API_H
#define OBX_API_H

#include <stdbool.h>
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include "obx_conf.h"
#include "obx_err.h"
#include "obx_http.h"

typedef struct {
  /* *run receives the hook's state (NULL when the org has no order.pre pipeline). `order` is
   * the order document about to be inserted; borrowed for the call. */
  bool (*execute)(void *ctx, const char *org_id, const bson_t *order, void **run, obx_err_t *err);
  /* Called only when *run was set; may run several times (transaction retries), so it
   * follows the rules of obx_mongo_txn_fn_t (a retriable MongoDB error retries the order's
   * whole transaction). */
  bool (*commit)(void *ctx, void *run, mongoc_client_session_t *session, obx_err_t *err);
  void (*release)(void *ctx, void *run);
  void *ctx;
} obx_api_pre_hook_t;

/* Process-wide; copied. NULL removes the hook. Set it before the api role starts. */
void obx_api_set_pre_hook(const obx_api_pre_hook_t *hook);

/* Role entry points (see src/outboxd.c): start returns the role's state (owned, give it to
 * stop), NULL with err on failure. */
void *obx_api_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
void obx_api_stop(void *api);

/* The rule for a currency code (ISO 4217 form: three capital letters): an order's `currency`
 * and api.default_currency (checked by obx_conf_validate) follow it. */
bool obx_currency_valid(const char *code);

#endif
