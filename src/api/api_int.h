/* api_int.h - private to the api role (src/api), and to its unit tests
 *
 * DESIGN: the order input is parsed into obx_order_input_t by a pure function (no I/O), so
 * validation and the money arithmetic are unit-tested without a server. Money is held as
 * int64 minor units of the order's currency (cents for BRL/USD): "149.90" -> 14990; totals
 * are exact integer sums, converted to Decimal128 only when the documents are built. */
#ifndef OBX_API_INT_H
#define OBX_API_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <bson/bson.h>

#include "obx/obx_api.h"
#include "obx/obx_mongo.h"

#define OBX_ORDER_MAX_ITEMS 500
#define OBX_ORDER_MAX_QUANTITY 1000000
/* Largest amount (unit price, line or order total) in minor units: 13 integer digits at 2
 * minor digits, far from int64 overflow and within Decimal128's exact range. */
#define OBX_ORDER_MAX_MINOR 999999999999999LL

typedef struct {
  obx_mongo_t *mongo;
  const obx_conf_t *conf;    /* borrowed for the life of the role */
  char *currency;            /* api.default_currency */
  pthread_t indexer;
  pthread_mutex_t mu;        /* indexes_ready, stopping */
  pthread_cond_t cond;
  bool indexes_ready, stopping;
} obx_api_t;

typedef struct {
  char *sku, *name;          /* name may be NULL */
  int64_t quantity;
  int64_t unit_price;        /* minor units */
} obx_order_item_t;

typedef struct {
  char *customer_email;
  char currency[4];
  int minor_digits;          /* of currency: 2 for BRL/USD/EUR, 0 for JPY, 3 for KWD ... */
  char *order_number;        /* NULL: generated */
  bson_t external_codes;     /* {code: string}; empty when absent */
  obx_order_item_t *items;   /* NULL when the body gave a plain `amount` */
  int nitems;
  int64_t total;             /* minor units */
} obx_order_input_t;

/* Parses and validates a POST /orders body. On false, every problem found is appended to
 * `errors` (an array being built by the caller: {"field": "items[1].unitPrice", "message"})
 * and `in` holds nothing to free. On true the caller owns `in` (obx_order_input_cleanup). */
bool obx_order_parse(const char *json, size_t len, const char *default_currency, obx_order_input_t *in,
                     bson_t *errors);
void obx_order_input_cleanup(obx_order_input_t *in);

/* Minor-unit digits of an ISO 4217 code (2 unless listed otherwise). */
int obx_currency_minor_digits(const char *code);
/* "149.90" at 2 digits -> 14990. Accepts [0-9]+(.[0-9]{1,digits})?; false (with a message in
 * why, for the client) on anything else or beyond OBX_ORDER_MAX_MINOR. */
bool obx_money_parse(const char *s, int digits, int64_t *minor, const char **why);
/* 14990 at 2 digits -> "149.90"; out of at least 32 bytes. */
void obx_money_format(int64_t minor, int digits, char *out, size_t outlen);

/* The order.pre hook as set by obx_api_set_pre_hook (all NULL when none). */
obx_api_pre_hook_t obx_api_pre_hook(void);
bool obx_api_indexes_ready(obx_api_t *api);
/* Registers POST /orders and GET /orders/:id. */
void obx_orders_routes(obx_api_t *api, obx_http_t *http);

#endif
