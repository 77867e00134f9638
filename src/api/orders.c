/* orders.c - POST /orders and GET /orders/:id
 *
 * DESIGN: POST /orders = validate (pure, obx_order_parse) -> Idempotency-Key lookup ->
 * order.pre hook execute (outside the transaction) -> ONE transaction: insert the order,
 * append its OrderConfirmed event to the outbox, commit the hook's effects -> 201. The request
 * never touches Kafka or RabbitMQ: the relay publishes the event after the commit.
 *
 * Conflicts are decided by the unique indexes of api.c, not by reads: {orgId, orderNumber}
 * (409, or a fresh number when we generated it) and {orgId, idempotencyKey} (the concurrent
 * twin of a retried request: answer as the winner did). The order document keeps the request
 * fingerprint (sha256 of the body) and what the 201 said, so a retry with the same key and
 * body gets the same answer and a different body gets 422.
 *
 * Deadline: a request has api.request_timeout from its handler's start for its MongoDB work
 * (reads carry maxTimeMS = the time left, the transaction runs by the deadline): past it the
 * answer is 503 with Retry-After and the transaction is aborted, never committed later.
 *
 * Amounts are decimal strings in JSON ("149.90"), int64 minor units in memory, Decimal128 in
 * the orders collection, and decimal strings again in the event payload (JSON consumers). */
#include "api_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_auth.h"
#include "obx/obx_event.h"
#include "obx/obx_json.h"
#include "obx/obx_log.h"
#include "obx/obx_outbox.h"
#include "obx/obx_trace.h"

#define ORDERS_NUMBER_ATTEMPTS 3
#define ORDERS_MAX_EXTERNAL_CODES 50
#define ORDERS_MAX_STRING 256

/* ---- money ------------------------------------------------------------------------------ */

bool obx_currency_valid(const char *code) {
  bool ok = strlen(code) == 3;
  for (int i = 0; ok && i < 3; i++) ok = code[i] >= 'A' && code[i] <= 'Z';
  return ok;
}

int obx_currency_minor_digits(const char *code) {
  static const char *const zero[] = {"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG",
                                     "RWF", "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF"};
  static const char *const three[] = {"BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"};
  for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++)
    if (strcmp(code, zero[i]) == 0) return 0;
  for (size_t i = 0; i < sizeof three / sizeof three[0]; i++)
    if (strcmp(code, three[i]) == 0) return 3;
  return 2;
}

bool obx_money_parse(const char *s, int digits, int64_t *minor, const char **why) {
  const char *p = s;
  int64_t v = 0;
  int nint = 0, nfrac = 0;
  if (*p == '-') {
    *why = "must not be negative";
    return false;
  }
  for (; isdigit((unsigned char)*p); p++, nint++) {
    if (nint >= 16) break;
    v = v * 10 + (*p - '0');
  }
  if (*p == '.') {
    for (p++; isdigit((unsigned char)*p) && nfrac <= digits; p++, nfrac++) v = v * 10 + (*p - '0');
  }
  if (nint >= 16) {
    *why = "is too large";
    return false;
  }
  if (nint == 0 || *p != '\0' || (p[-1] == '.')) {
    *why = "must be a decimal string such as \"149.90\"";
    return false;
  }
  if (nfrac > digits) {
    *why = digits == 0 ? "must be a whole number in this currency" : "has more decimal places than the currency allows";
    return false;
  }
  for (; nfrac < digits; nfrac++) v *= 10;
  if (v > OBX_ORDER_MAX_MINOR) {
    *why = "is too large";
    return false;
  }
  *minor = v;
  return true;
}

void obx_money_format(int64_t minor, int digits, char *out, size_t outlen) {
  int64_t scale = 1;
  for (int i = 0; i < digits; i++) scale *= 10;
  if (digits == 0) snprintf(out, outlen, "%lld", (long long)minor);
  else snprintf(out, outlen, "%lld.%0*lld", (long long)(minor / scale), digits, (long long)(minor % scale));
}

/* ---- validation ------------------------------------------------------------------------- */

typedef struct {
  bson_t *errors;
  int n;
} field_errors_t;

static void field_error(field_errors_t *fe, const char *field, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
static void field_error(field_errors_t *fe, const char *field, const char *fmt, ...) {
  char key[16], msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(key, sizeof key, "%d", fe->n++);
  bson_t doc;
  BSON_APPEND_DOCUMENT_BEGIN(fe->errors, key, &doc);
  BSON_APPEND_UTF8(&doc, "field", field);
  BSON_APPEND_UTF8(&doc, "message", msg);
  bson_append_document_end(fe->errors, &doc);
}

static bool valid_email(const char *s) {
  const char *at = strchr(s, '@');
  size_t len = strlen(s);
  if (len < 3 || len > 254 || !at || at == s || strchr(at + 1, '@') || at - s > 64) return false;
  const char *domain = at + 1, *dot = strrchr(domain, '.');
  if (!dot || dot == domain || dot[1] == '\0' || domain[0] == '.' || domain[0] == '-') return false;
  for (const char *c = s; *c; c++)
    if ((unsigned char)*c <= ' ' || *c == '"' || *c == '(' || *c == ')' || *c == ',' || *c == ';' || *c == '<' ||
        *c == '>' || *c == '[' || *c == ']' || *c == '\\' || (*c == '.' && c[1] == '.'))
      return false;
  return true;
}

static bool valid_token(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n == 0 || n > max) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("-_.", *s)) return false;
  return true;
}

/* A bounded, printable UTF-8 string field; NULL (with an error) otherwise. */
static const char *string_field(bson_iter_t *it, const char *field, size_t max, field_errors_t *fe) {
  if (!BSON_ITER_HOLDS_UTF8(it)) {
    field_error(fe, field, "must be a string");
    return NULL;
  }
  uint32_t len;
  const char *s = bson_iter_utf8(it, &len);
  if (len == 0 || len > max || strlen(s) != len) {
    field_error(fe, field, "must be a non-empty string of at most %zu bytes", max);
    return NULL;
  }
  return s;
}

static bool money_field(bson_iter_t *it, const char *field, int digits, int64_t *minor, field_errors_t *fe) {
  const char *why = NULL;
  char buf[32];
  if (BSON_ITER_HOLDS_INT32(it) || BSON_ITER_HOLDS_INT64(it)) {
    snprintf(buf, sizeof buf, "%lld", (long long)bson_iter_as_int64(it));
    if (obx_money_parse(buf, digits, minor, &why)) return true;
  } else if (BSON_ITER_HOLDS_UTF8(it)) {
    if (obx_money_parse(bson_iter_utf8(it, NULL), digits, minor, &why)) return true;
  } else if (BSON_ITER_HOLDS_DOUBLE(it)) {
    why = "must be a decimal string such as \"149.90\" (JSON fractions are binary floating point)";
  } else {
    why = "must be a decimal string such as \"149.90\"";
  }
  field_error(fe, field, "%s", why);
  return false;
}

static void parse_item(bson_iter_t *it, int i, int digits, obx_order_item_t *item, field_errors_t *fe) {
  char field[64];
  bson_iter_t sub;
  bool seen_sku = false, seen_qty = false, seen_price = false;
  if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &sub)) {
    snprintf(field, sizeof field, "items[%d]", i);
    field_error(fe, field, "must be an object with sku, quantity and unitPrice");
    return;
  }
  while (bson_iter_next(&sub)) {
    const char *key = bson_iter_key(&sub);
    snprintf(field, sizeof field, "items[%d].%s", i, key);
    if (strcmp(key, "sku") == 0) {
      const char *s = string_field(&sub, field, 64, fe);
      seen_sku = true;
      if (s) item->sku = strdup(s);
    } else if (strcmp(key, "name") == 0) {
      const char *s = string_field(&sub, field, ORDERS_MAX_STRING, fe);
      if (s) item->name = strdup(s);
    } else if (strcmp(key, "quantity") == 0) {
      seen_qty = true;
      int64_t q = -1;
      if (BSON_ITER_HOLDS_INT32(&sub) || BSON_ITER_HOLDS_INT64(&sub)) q = bson_iter_as_int64(&sub);
      else if (BSON_ITER_HOLDS_UTF8(&sub)) {
        const char *s = bson_iter_utf8(&sub, NULL), *e = s;
        while (isdigit((unsigned char)*e)) e++;
        if (*s && !*e && e - s <= 7) q = strtoll(s, NULL, 10);
      }
      if (q < 1 || q > OBX_ORDER_MAX_QUANTITY) field_error(fe, field, "must be a whole number from 1 to %d", OBX_ORDER_MAX_QUANTITY);
      else item->quantity = q;
    } else if (strcmp(key, "unitPrice") == 0) {
      seen_price = true;
      money_field(&sub, field, digits, &item->unit_price, fe);
    } else {
      field_error(fe, field, "unknown field (an item has sku, quantity, unitPrice and optionally name)");
    }
  }
  static const char *const required[] = {"sku", "quantity", "unitPrice"};
  bool seen[] = {seen_sku, seen_qty, seen_price};
  for (int r = 0; r < 3; r++) {
    if (seen[r]) continue;
    snprintf(field, sizeof field, "items[%d].%s", i, required[r]);
    field_error(fe, field, "is required");
  }
}

static void parse_external_codes(bson_iter_t *it, bson_t *out, field_errors_t *fe) {
  bson_iter_t sub;
  int n = 0;
  if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &sub)) {
    field_error(fe, "externalCodes", "must be an object of string codes, e.g. {\"erp\": \"A-17\"}");
    return;
  }
  while (bson_iter_next(&sub)) {
    char field[96];
    snprintf(field, sizeof field, "externalCodes.%.64s", bson_iter_key(&sub));
    if (++n > ORDERS_MAX_EXTERNAL_CODES) {
      field_error(fe, "externalCodes", "must have at most %d codes", ORDERS_MAX_EXTERNAL_CODES);
      return;
    }
    const char *s = string_field(&sub, field, ORDERS_MAX_STRING, fe);
    if (s && bson_iter_key(&sub)[0] != '$' && !strchr(bson_iter_key(&sub), '.')) BSON_APPEND_UTF8(out, bson_iter_key(&sub), s);
    else if (s) field_error(fe, field, "a code name must not start with '$' or contain '.'");
  }
}

void obx_order_input_cleanup(obx_order_input_t *in) {
  for (int i = 0; i < in->nitems; i++) {
    free(in->items[i].sku);
    free(in->items[i].name);
  }
  free(in->items);
  free(in->customer_email);
  free(in->order_number);
  bson_destroy(&in->external_codes);
  memset(in, 0, sizeof *in);
}

/* The currency decides how amounts parse, so it is read first. */
static void parse_currency(const bson_t *doc, const char *default_currency, obx_order_input_t *in, field_errors_t *fe) {
  bson_iter_t it;
  const char *cur = default_currency;
  if (bson_iter_init_find(&it, doc, "currency")) {
    cur = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
    if (!obx_currency_valid(cur)) {
      field_error(fe, "currency", "must be an ISO 4217 code of 3 capital letters, e.g. \"BRL\"");
      cur = default_currency;
    }
  }
  snprintf(in->currency, sizeof in->currency, "%s", cur);
  in->minor_digits = obx_currency_minor_digits(in->currency);
}

bool obx_order_parse(const char *json, size_t len, const char *default_currency, obx_order_input_t *in,
                     bson_t *errors) {
  field_errors_t fe = {errors, 0};
  bson_t doc;
  bson_iter_t it;
  bool has_amount = false, has_items = false;
  memset(in, 0, sizeof *in);
  bson_init(&in->external_codes);
  obx_err_t jerr = OBX_ERR_INIT;
  if (!obx_json_parse(json, len, &doc, &jerr)) {
    field_error(&fe, "body", "must be one JSON object: %s", jerr.msg);
    bson_destroy(&doc);
    obx_order_input_cleanup(in);
    return false;
  }
  parse_currency(&doc, default_currency, in, &fe);
  bson_iter_init(&it, &doc);
  while (bson_iter_next(&it)) {
    const char *key = bson_iter_key(&it);
    if (strcmp(key, "customerEmail") == 0) {
      const char *s = string_field(&it, key, 254, &fe);
      if (s && valid_email(s)) in->customer_email = strdup(s);
      else if (s) field_error(&fe, key, "must be an email address such as customer@company.com");
    } else if (strcmp(key, "orderNumber") == 0) {
      const char *s = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
      if (valid_token(s, 64)) in->order_number = strdup(s);
      else field_error(&fe, key, "must be 1 to 64 letters, digits, '-', '_' or '.'");
    } else if (strcmp(key, "amount") == 0) {
      has_amount = true;
      if (money_field(&it, key, in->minor_digits, &in->total, &fe) && in->total == 0)
        field_error(&fe, key, "must be greater than zero");
    } else if (strcmp(key, "items") == 0) {
      has_items = true;
      bson_iter_t arr;
      uint32_t n = 0;
      if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr)) {
        field_error(&fe, key, "must be an array of {sku, quantity, unitPrice}");
        continue;
      }
      bson_iter_t count = arr;
      while (bson_iter_next(&count)) n++;
      if (n == 0 || n > OBX_ORDER_MAX_ITEMS) {
        field_error(&fe, key, "must have from 1 to %d items", OBX_ORDER_MAX_ITEMS);
        continue;
      }
      in->items = calloc(n, sizeof *in->items);
      in->nitems = (int)n;
      for (int i = 0; bson_iter_next(&arr); i++) parse_item(&arr, i, in->minor_digits, &in->items[i], &fe);
    } else if (strcmp(key, "externalCodes") == 0) {
      parse_external_codes(&it, &in->external_codes, &fe);
    } else if (strcmp(key, "currency") != 0) {
      field_error(&fe, key, "unknown field");
    }
  }
  if (!bson_iter_init_find(&it, &doc, "customerEmail")) field_error(&fe, "customerEmail", "is required");
  if (has_amount && has_items) field_error(&fe, "amount", "give either items or amount, not both");
  if (!has_amount && !has_items) field_error(&fe, "items", "is required (or a plain decimal `amount`)");
  if (has_items && fe.n == 0) {
    in->total = 0;
    for (int i = 0; i < in->nitems; i++) {
      int64_t line;
      if (__builtin_mul_overflow(in->items[i].quantity, in->items[i].unit_price, &line) ||
          __builtin_add_overflow(in->total, line, &in->total) || in->total > OBX_ORDER_MAX_MINOR) {
        field_error(&fe, "items", "the order total is too large");
        break;
      }
    }
  }
  bson_destroy(&doc);
  if (fe.n) obx_order_input_cleanup(in);
  return fe.n == 0;
}

/* ---- documents -------------------------------------------------------------------------- */

static void append_decimal(bson_t *doc, const char *key, int64_t minor, int digits) {
  char s[32];
  bson_decimal128_t dec;
  obx_money_format(minor, digits, s, sizeof s);
  bson_decimal128_from_string(s, &dec);
  BSON_APPEND_DECIMAL128(doc, key, &dec);
}

static void append_money_string(bson_t *doc, const char *key, int64_t minor, int digits) {
  char s[32];
  obx_money_format(minor, digits, s, sizeof s);
  BSON_APPEND_UTF8(doc, key, s);
}

/* Items as stored (decimal = true: Decimal128) or as in the event payload (decimal strings). */
static void append_items(bson_t *doc, const obx_order_input_t *in, bool decimal) {
  bson_t arr, item;
  char key[16];
  void (*money)(bson_t *, const char *, int64_t, int) = decimal ? append_decimal : append_money_string;
  BSON_APPEND_ARRAY_BEGIN(doc, "items", &arr);
  for (int i = 0; i < in->nitems; i++) {
    const obx_order_item_t *it = &in->items[i];
    snprintf(key, sizeof key, "%d", i);
    BSON_APPEND_DOCUMENT_BEGIN(&arr, key, &item);
    BSON_APPEND_UTF8(&item, "sku", it->sku);
    if (it->name) BSON_APPEND_UTF8(&item, "name", it->name);
    BSON_APPEND_INT64(&item, "quantity", it->quantity);
    money(&item, "unitPrice", it->unit_price, in->minor_digits);
    money(&item, "lineTotal", it->quantity * it->unit_price, in->minor_digits);
    bson_append_document_end(&arr, &item);
  }
  bson_append_array_end(doc, &arr);
}

/* A generated order number: ORD-YYYYMMDD-XXXXXXXX (8 Crockford base32 characters from the
 * random tail of the order's UUIDv7); the unique index catches the rare collision. */
static void orders_new_number(char out[32]) {
  static const char b32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  char uuid[OBX_UUID_LEN + 1], date[32];
  obx_uuid7(uuid);
  obx_time_format_rfc3339(obx_time_now_ms(), date);
  uint64_t r = strtoull(uuid + 24, NULL, 16); /* last 48 bits, random in UUIDv7 */
  char tail[9];
  for (int i = 0; i < 8; i++, r >>= 5) tail[i] = b32[r & 31];
  tail[8] = '\0';
  snprintf(out, 32, "ORD-%.4s%.2s%.2s-%s", date, date + 5, date + 8, tail);
}

typedef struct {
  obx_api_t *api;
  const char *org;
  obx_order_input_t *in;
  char id[OBX_UUID_LEN + 1];
  char number[72];
  const char *idempotency_key; /* NULL when absent */
  char request_hash[OBX_AUTH_HASH_LEN + 1];
  obx_event_t event;
  bson_t order;
  obx_api_pre_hook_t hook;
  void *run;                   /* the hook's state, NULL when no order.pre pipeline */
  int64_t deadline_ms;         /* api.request_timeout from the handler's start (obx_mongo_deadline) */
} order_req_t;

/* The fields the order document and its event payload share, after the id. */
static void append_summary(bson_t *d, const order_req_t *r) {
  BSON_APPEND_UTF8(d, "orgId", r->org);
  BSON_APPEND_UTF8(d, "orderNumber", r->number);
  BSON_APPEND_UTF8(d, "status", "CONFIRMED");
  BSON_APPEND_UTF8(d, "customerEmail", r->in->customer_email);
  BSON_APPEND_UTF8(d, "currency", r->in->currency);
}

static void build_order(order_req_t *r) {
  obx_order_input_t *in = r->in;
  bson_t *d = &r->order, sub;
  bson_reinit(d);
  BSON_APPEND_UTF8(d, "_id", r->id);
  append_summary(d, r);
  if (in->nitems) append_items(d, in, true);
  append_decimal(d, "totalAmount", in->total, in->minor_digits);
  BSON_APPEND_DOCUMENT(d, "externalCodes", &in->external_codes);
  BSON_APPEND_DATE_TIME(d, "createdAt", r->event.occurred_at_ms);
  BSON_APPEND_ARRAY_BEGIN(d, "eventIds", &sub);
  BSON_APPEND_UTF8(&sub, "0", r->event.id);
  bson_append_array_end(d, &sub);
  if (r->idempotency_key) {
    BSON_APPEND_UTF8(d, "idempotencyKey", r->idempotency_key);
    BSON_APPEND_UTF8(d, "requestHash", r->request_hash);
  }
}

/* The fat OrderConfirmed event: what a consumer needs without reading the order back. */
static void build_event(order_req_t *r, const char *correlation_id) {
  obx_order_input_t *in = r->in;
  obx_event_t *ev = &r->event;
  bson_t *p = &ev->payload;
  bson_reinit(p);
  BSON_APPEND_UTF8(p, "orderId", r->id);
  append_summary(p, r);
  append_money_string(p, "totalAmount", in->total, in->minor_digits);
  BSON_APPEND_INT32(p, "itemCount", in->nitems);
  if (in->nitems) append_items(p, in, false);
  BSON_APPEND_DOCUMENT(p, "externalCodes", &in->external_codes);
  free(ev->correlation_id);
  ev->correlation_id = strdup(correlation_id ? correlation_id : r->id);
}

static bool order_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  order_req_t *r = ctx;
  bool ok = false;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  mongoc_collection_t *orders = obx_mongo_collection(r->api->mongo, client, "orders");
  mongoc_collection_t *outbox = obx_mongo_collection(r->api->mongo, client, "outbox");
  bson_t opts = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  bson_error_t berr;
  if (!mongoc_client_session_append(session, &opts, &berr)) {
    obx_err_from_bson(err, &berr, NULL);
    goto done;
  }
  bson_destroy(&reply);
  if (!mongoc_collection_insert_one(orders, &r->order, &opts, &reply, &berr)) {
    obx_err_from_bson(err, &berr, &reply);
    goto done;
  }
  if (!obx_outbox_append(session, outbox, &r->event, err)) goto done;
  /* order.pre: the effects and events of the org's pre pipeline join this transaction. */
  if (r->run && !r->hook.commit(r->hook.ctx, r->run, session, err)) goto done;
  ok = true;
done:
  bson_destroy(&reply);
  bson_destroy(&opts);
  mongoc_collection_destroy(outbox);
  mongoc_collection_destroy(orders);
  return ok;
}

/* ---- responses -------------------------------------------------------------------------- */

/* The 201 body, rebuilt from the stored order so that a replay answers the same. */
static void reply_created(obx_http_resp_t *resp, const bson_t *order, bool replayed) {
  bson_t body = BSON_INITIALIZER;
  bson_iter_t it;
  char location[128];
  static const char *const fields[] = {"orderNumber", "status", "currency", "totalAmount", "eventIds"};
  if (bson_iter_init_find(&it, order, "_id") && BSON_ITER_HOLDS_UTF8(&it)) {
    BSON_APPEND_UTF8(&body, "id", bson_iter_utf8(&it, NULL));
    snprintf(location, sizeof location, "/orders/%s", bson_iter_utf8(&it, NULL));
    obx_http_resp_header(resp, "Location", location);
  }
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    if (!bson_iter_init_find(&it, order, fields[i])) continue;
    if (BSON_ITER_HOLDS_DECIMAL128(&it)) {
      bson_decimal128_t dec;
      char s[BSON_DECIMAL128_STRING];
      bson_iter_decimal128(&it, &dec);
      bson_decimal128_to_string(&dec, s);
      BSON_APPEND_UTF8(&body, fields[i], s);
    } else {
      bson_append_iter(&body, fields[i], -1, &it);
    }
  }
  if (replayed) obx_http_resp_header(resp, "Idempotent-Replayed", "true");
  obx_http_reply_bson(resp, 201, &body);
  bson_destroy(&body);
}

static void reply_field_problem(obx_http_resp_t *resp, int status, const char *title, const char *field,
                                const char *message) {
  bson_t errors = BSON_INITIALIZER;
  field_errors_t fe = {&errors, 0};
  field_error(&fe, field, "%s", message);
  obx_http_reply_problem(resp, status, title, message, &errors);
  bson_destroy(&errors);
}

/* Finds the org's order with this idempotency key; *found false when none. */
static bool find_by_idempotency_key(obx_api_t *api, const char *org, const char *key, int64_t deadline_ms,
                                    bson_t *order, bool *found, obx_err_t *err) {
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  mongoc_collection_t *orders = obx_mongo_collection(api->mongo, client, "orders");
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "orgId", org);
  BSON_APPEND_UTF8(&filter, "idempotencyKey", key);
  bson_t opts = BSON_INITIALIZER;
  obx_mongo_append_max_time(&opts, deadline_ms);
  mongoc_read_prefs_t *prefs = mongoc_read_prefs_new(MONGOC_READ_PRIMARY);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(orders, &filter, &opts, prefs);
  const bson_t *doc;
  *found = mongoc_cursor_next(cursor, &doc);
  if (*found) bson_copy_to(doc, order);
  bool ok = obx_mongo_cursor_end(cursor, err);
  mongoc_read_prefs_destroy(prefs);
  bson_destroy(&opts);
  bson_destroy(&filter);
  mongoc_collection_destroy(orders);
  obx_mongo_push(api->mongo, client);
  return ok;
}

/* Answers a request whose Idempotency-Key is already used: same body -> the first 201,
 * other body -> 422. False when the key is unused (nothing answered). */
static bool reply_if_replay(order_req_t *r, obx_http_resp_t *resp) {
  bson_t stored;
  bool found = false;
  obx_err_t err = OBX_ERR_INIT;
  if (!find_by_idempotency_key(r->api, r->org, r->idempotency_key, r->deadline_ms, &stored, &found, &err)) {
    obx_http_reply_err(resp, &err);
    return true;
  }
  if (!found) return false;
  bson_iter_t it;
  if (bson_iter_init_find(&it, &stored, "requestHash") && BSON_ITER_HOLDS_UTF8(&it) &&
      strcmp(bson_iter_utf8(&it, NULL), r->request_hash) == 0)
    reply_created(resp, &stored, true);
  else
    reply_field_problem(resp, 422, "Idempotency key reused", "Idempotency-Key",
                        "this Idempotency-Key was already used with a different request body");
  bson_destroy(&stored);
  return true;
}

static bool valid_header_token(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n == 0 || n > max) return false;
  for (; *s; s++)
    if (*s < '!' || *s > '~') return false;
  return true;
}

/* Runs the order.pre hook's first phase; false when it answered (rejection or outage). */
static bool run_pre_hook(order_req_t *r, obx_http_resp_t *resp) {
  obx_err_t err = OBX_ERR_INIT;
  r->hook = obx_api_pre_hook();
  if (!r->hook.execute || r->hook.execute(r->hook.ctx, r->org, &r->order, &r->run, &err)) return true;
  if (err.retriable) obx_http_reply_err(resp, &err);
  else obx_http_reply_problem(resp, 422, "Order rejected", err.msg, NULL);
  return false;
}

/* The MongoDB transaction's span (db semconv); the event carries its context to the relay. */
static obx_span_t *txn_span(order_req_t *r) {
  const char *db = obx_mongo_db_name(r->api->mongo);
  char name[160];
  snprintf(name, sizeof name, "transaction %s", db);
  obx_span_t *span = obx_span_start(name, OBX_SPAN_CLIENT, obx_trace_current());
  obx_span_set_str(span, "db.system", "mongodb");
  obx_span_set_str(span, "db.namespace", db);
  obx_span_set_str(span, "db.name", db);
  obx_span_set_str(span, "db.operation.name", "transaction");
  obx_span_set_str(span, "db.operation", "transaction");
  obx_span_set_str(span, "db.mongodb.collections", "orders,outbox");
  obx_span_set_str(span, "outboxd.order.id", r->id);
  char tp[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(obx_span_ctx(span), tp);
  r->event.traceparent = strdup(tp);
  if (obx_span_ctx(span)->state[0]) r->event.tracestate = strdup(obx_span_ctx(span)->state);
  return span;
}

static void orders_confirm(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  obx_api_t *api = ctx;
  obx_span_t *txn = NULL;
  size_t len;
  const char *body = obx_http_req_body(req, &len);
  const char *correlation_id = obx_http_req_header(req, "X-Correlation-Id");
  obx_order_input_t in;
  order_req_t r = {.api = api, .org = obx_http_req_org(req), .in = &in, .deadline_ms = obx_mongo_deadline(api->mongo)};
  bson_t errors = BSON_INITIALIZER;
  obx_err_t err = OBX_ERR_INIT;
  bson_init(&r.order);
  obx_event_init(&r.event);

  if (!obx_order_parse(body, len, api->currency, &in, &errors)) {
    obx_http_reply_problem(resp, 400, "Validation failed", "the order has invalid fields; see errors", &errors);
    goto done_noinput;
  }
  r.idempotency_key = obx_http_req_header(req, "Idempotency-Key");
  if (r.idempotency_key && !valid_header_token(r.idempotency_key, 255)) {
    reply_field_problem(resp, 400, "Validation failed", "Idempotency-Key", "must be 1 to 255 visible ASCII characters");
    goto done;
  }
  if (correlation_id && !valid_header_token(correlation_id, 128)) correlation_id = NULL;
  if (!obx_api_indexes_ready(api)) {
    obx_err_set(&err, OBX_ERR_MONGO, 0, true, "the orders collection is not ready (MongoDB unreachable?)");
    obx_http_reply_err(resp, &err);
    goto done;
  }
  if (r.idempotency_key) {
    obx_sha256_hex(body, len, r.request_hash);
    if (reply_if_replay(&r, resp)) goto done;
  }
  obx_uuid7(r.id);
  snprintf(r.number, sizeof r.number, "%s", in.order_number ? in.order_number : "");
  r.event.event_type = strdup("OrderConfirmed");
  r.event.event_version = 1;
  r.event.org_id = strdup(r.org);
  r.event.aggregate_type = strdup("Order");
  r.event.aggregate_id = strdup(r.id);
  r.event.source = strdup("/outboxd/orders");
  txn = txn_span(&r);
  for (int attempt = 1;; attempt++) {
    if (!in.order_number) orders_new_number(r.number);
    build_event(&r, correlation_id);
    if (!obx_event_finalize(&r.event, &err)) {
      obx_http_reply_err(resp, &err);
      goto done;
    }
    build_order(&r);
    if (r.run) { /* a new order number: the pre pipeline sees the order as it will be stored */
      r.hook.release(r.hook.ctx, r.run);
      r.run = NULL;
    }
    if (!run_pre_hook(&r, resp)) goto done;
    if (obx_mongo_transaction_by(api->mongo, r.deadline_ms, order_txn, &r, &err)) break;
    obx_span_set_error(txn, err.msg);
    if (!obx_err_is_duplicate_key(&err)) {
      obx_http_reply_err(resp, &err);
      goto done;
    }
    /* The twin of this request won the race for its idempotency key: answer as it did. */
    if (r.idempotency_key && reply_if_replay(&r, resp)) goto done;
    if (in.order_number || attempt == ORDERS_NUMBER_ATTEMPTS) {
      char msg[160];
      snprintf(msg, sizeof msg, "order number %s already exists", r.number);
      reply_field_problem(resp, 409, "Conflict", "orderNumber", msg);
      goto done;
    }
  }
  obx_span_set_ok(txn);
  obx_span_set_str(txn, "outboxd.event.id", r.event.id);
  obx_log_event(OBX_LOG_INFO, r.event.id, r.event.correlation_id, "order %s (%s) confirmed", r.number, r.id);
  reply_created(resp, &r.order, false);
done:
  obx_order_input_cleanup(&in);
done_noinput:
  bson_destroy(&errors);
  if (r.run) r.hook.release(r.hook.ctx, r.run);
  obx_event_cleanup(&r.event);
  bson_destroy(&r.order);
  obx_span_end(txn);
}

/* POST /orders as a server span (HTTP semconv) continuing the caller's traceparent, current
 * while the order is confirmed so its log lines and the transaction span belong to it. */
static void orders_post(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  const char *tp = obx_http_req_header(req, "traceparent"), *ts = obx_http_req_header(req, "tracestate");
  const char *agent = obx_http_req_header(req, "User-Agent");
  obx_trace_ctx_t incoming;
  obx_trace_parse(tp, tp ? strlen(tp) : 0, ts, ts ? strlen(ts) : 0, &incoming);
  obx_span_t *span = obx_span_start("POST /orders", OBX_SPAN_SERVER, &incoming);
  obx_span_set_str(span, "http.request.method", "POST");
  obx_span_set_str(span, "http.route", "/orders");
  obx_span_set_str(span, "url.path", "/orders");
  obx_span_set_str(span, "url.scheme", "http");
  obx_span_set_str(span, "user_agent.original", agent);
  obx_span_set_str(span, "outboxd.org_id", obx_http_req_org(req));
  obx_trace_set_current(obx_span_ctx(span));
  orders_confirm(req, resp, ctx);
  int status = obx_http_resp_status(resp);
  obx_span_set_int(span, "http.response.status_code", status);
  if (status >= 500) {
    char code[16];
    snprintf(code, sizeof code, "%d", status);
    obx_span_set_str(span, "error.type", code);
    obx_span_set_error(span, NULL);
  }
  obx_trace_set_current(NULL);
  obx_span_end(span);
}

/* ---- GET /orders/:id -------------------------------------------------------------------- */

/* The API view of a stored value: Decimal128 -> decimal string (dates become RFC 3339 strings
 * in obx_json_render, as in every answer). */
static void append_view(bson_t *out, const char *key, const bson_iter_t *it) {
  bson_iter_t sub;
  bson_t child;
  if (BSON_ITER_HOLDS_DECIMAL128(it)) {
    bson_decimal128_t dec;
    char s[BSON_DECIMAL128_STRING];
    bson_iter_decimal128(it, &dec);
    bson_decimal128_to_string(&dec, s);
    BSON_APPEND_UTF8(out, key, s);
  } else if ((BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) && bson_iter_recurse(it, &sub)) {
    bool array = BSON_ITER_HOLDS_ARRAY(it);
    if (array) BSON_APPEND_ARRAY_BEGIN(out, key, &child);
    else BSON_APPEND_DOCUMENT_BEGIN(out, key, &child);
    while (bson_iter_next(&sub)) append_view(&child, bson_iter_key(&sub), &sub);
    if (array) bson_append_array_end(out, &child);
    else bson_append_document_end(out, &child);
  } else {
    bson_append_iter(out, key, -1, it);
  }
}

static void orders_get(obx_http_req_t *req, obx_http_resp_t *resp, void *ctx) {
  obx_api_t *api = ctx;
  const char *id = obx_http_req_param(req, "id");
  mongoc_client_t *client = obx_mongo_pop(api->mongo);
  mongoc_collection_t *orders = obx_mongo_collection(api->mongo, client, "orders");
  bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, proj;
  BSON_APPEND_UTF8(&filter, "_id", id);
  BSON_APPEND_UTF8(&filter, "orgId", obx_http_req_org(req)); /* another org's order is not found */
  BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
  BSON_APPEND_INT32(&proj, "requestHash", 0);
  bson_append_document_end(&opts, &proj);
  obx_mongo_append_max_time(&opts, obx_mongo_deadline(api->mongo));
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(orders, &filter, &opts, NULL);
  const bson_t *doc;
  obx_err_t err = OBX_ERR_INIT;
  bool found = mongoc_cursor_next(cursor, &doc);
  if (found) {
    bson_t view = BSON_INITIALIZER;
    bson_iter_t it;
    bson_iter_init(&it, doc);
    while (bson_iter_next(&it)) append_view(&view, strcmp(bson_iter_key(&it), "_id") ? bson_iter_key(&it) : "id", &it);
    obx_http_reply_bson(resp, 200, &view);
    bson_destroy(&view);
  }
  bool read = obx_mongo_cursor_end(cursor, &err);
  if (!found && !read) obx_http_reply_err(resp, &err);
  else if (!found) obx_http_reply_problem(resp, 404, "Not found", "no such order", NULL);
  bson_destroy(&opts);
  bson_destroy(&filter);
  mongoc_collection_destroy(orders);
  obx_mongo_push(api->mongo, client);
}

void obx_orders_routes(obx_api_t *api, obx_http_t *http) {
  obx_http_route(http, "POST", "/orders", "orders:write", orders_post, api);
  obx_http_route(http, "GET", "/orders/:id", "orders:read", orders_get, api);
}
