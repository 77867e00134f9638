/* test_orders.c - POST /orders input: validation table, exact money arithmetic */
#include "obx_test.h"

#include <stdio.h>
#include <string.h>

#include "../../src/api/api_int.h"

/* ---- money ---------------------------------------------------------------------------- */

static void test_money_parse(void **state) {
  static const struct {
    const char *in;
    int digits;
    bool ok;
    int64_t want;
  } cases[] = {
    {"149.90", 2, true, 14990},
    {"149.9", 2, true, 14990},
    {"149", 2, true, 14900},
    {"0.01", 2, true, 1},
    {"0", 2, true, 0},
    {"007.50", 2, true, 750},
    {"1234567890123.45", 2, true, 123456789012345},
    {"9999999999999.99", 2, true, 999999999999999},
    {"10000000000000.00", 2, false, 0},
    {"99999999999999999999", 2, false, 0},
    {"1.234", 2, false, 0},
    {"1.234", 3, true, 1234},
    {"1.5", 0, false, 0},
    {"15", 0, true, 15},
    {"-1.00", 2, false, 0},
    {"+1.00", 2, false, 0},
    {"1.", 2, false, 0},
    {".5", 2, false, 0},
    {"", 2, false, 0},
    {"1e3", 2, false, 0},
    {"1,50", 2, false, 0},
    {" 1.50", 2, false, 0},
    {"1.50 ", 2, false, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t got = -1;
    const char *why = NULL;
    bool ok = obx_money_parse(cases[i].in, cases[i].digits, &got, &why);
    if (ok != cases[i].ok || (ok && got != cases[i].want)) {
      print_error("obx_money_parse(\"%s\", %d): got ok=%d %lld (%s), want ok=%d %lld\n", cases[i].in,
                  cases[i].digits, ok, (long long)got, why ? why : "", cases[i].ok, (long long)cases[i].want);
      fail();
    }
    if (!ok) assert_non_null(why);
  }
}

static void test_money_format(void **state) {
  static const struct {
    int64_t minor;
    int digits;
    const char *want;
  } cases[] = {
    {14990, 2, "149.90"}, {1, 2, "0.01"}, {0, 2, "0.00"}, {15, 0, "15"}, {1234, 3, "1.234"},
    {999999999999999, 2, "9999999999999.99"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char got[32];
    obx_money_format(cases[i].minor, cases[i].digits, got, sizeof got);
    if (strcmp(got, cases[i].want) != 0) {
      print_error("obx_money_format(%lld, %d): got %s, want %s\n", (long long)cases[i].minor, cases[i].digits,
                  got, cases[i].want);
      fail();
    }
  }
}

static void test_currency_digits(void **state) {
  assert_int_equal(obx_currency_minor_digits("BRL"), 2);
  assert_int_equal(obx_currency_minor_digits("USD"), 2);
  assert_int_equal(obx_currency_minor_digits("JPY"), 0);
  assert_int_equal(obx_currency_minor_digits("KWD"), 3);
}

/* ---- parse: accepted bodies ------------------------------------------------------------- */

static void test_parse_seed_payload(void **state) {
  /* seeds/001 as is */
  const char *body = "{\"customerEmail\": \"customer@company.com\", \"amount\": \"149.90\"}";
  obx_order_input_t in;
  bson_t errors = BSON_INITIALIZER;
  assert_true(obx_order_parse(body, strlen(body), "BRL", &in, &errors));
  assert_string_equal(in.customer_email, "customer@company.com");
  assert_string_equal(in.currency, "BRL");
  assert_int_equal(in.total, 14990);
  assert_int_equal(in.nitems, 0);
  assert_null(in.order_number);
  obx_order_input_cleanup(&in);
  bson_destroy(&errors);
}

static void test_parse_items_total_exact(void **state) {
  /* 0.1 + 0.2 style sums that doubles get wrong: 3 x 0.10 + 1 x 0.20 + 7 x 19.99 = 140.43 */
  const char *body =
    "{\"customerEmail\": \"a@b.co\", \"currency\": \"USD\", \"orderNumber\": \"PO-7\","
    " \"externalCodes\": {\"erp\": \"E-1\", \"crm\": \"C-9\"},"
    " \"items\": [{\"sku\": \"A\", \"quantity\": 3, \"unitPrice\": \"0.10\"},"
    "             {\"sku\": \"B\", \"quantity\": \"1\", \"unitPrice\": \"0.2\", \"name\": \"Bolt\"},"
    "             {\"sku\": \"C\", \"quantity\": 7, \"unitPrice\": \"19.99\"}]}";
  obx_order_input_t in;
  bson_t errors = BSON_INITIALIZER;
  assert_true(obx_order_parse(body, strlen(body), "BRL", &in, &errors));
  assert_string_equal(in.currency, "USD");
  assert_string_equal(in.order_number, "PO-7");
  assert_int_equal(in.nitems, 3);
  assert_int_equal(in.items[1].unit_price, 20);
  assert_string_equal(in.items[1].name, "Bolt");
  assert_int_equal(in.total, 14043);
  assert_int_equal(bson_count_keys(&in.external_codes), 2);
  char s[32];
  obx_money_format(in.total, in.minor_digits, s, sizeof s);
  assert_string_equal(s, "140.43");
  obx_order_input_cleanup(&in);
  bson_destroy(&errors);
}

/* ---- parse: the validation table -------------------------------------------------------- */

typedef struct {
  const char *name;
  const char *body;
  const char *fields; /* the fields named in errors, in order, joined by ' ' */
} bad_case_t;

static const bad_case_t bad_cases[] = {
  {"empty body", "", "body"},
  {"not json", "{customerEmail", "body"},
  {"two objects", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1.00\"}{\"amount\": \"9.99\"}", "body"},
  {"trailing data", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1.00\"} x", "body"},
  {"an array", "[{\"customerEmail\": \"a@b.co\", \"amount\": \"1.00\"}]", "body"},
  {"no email, no items", "{}", "customerEmail items"},
  {"bad email", "{\"customerEmail\": \"nobody\", \"amount\": \"1.00\"}", "customerEmail"},
  {"email not a string", "{\"customerEmail\": 5, \"amount\": \"1.00\"}", "customerEmail"},
  {"amount as float", "{\"customerEmail\": \"a@b.co\", \"amount\": 149.9}", "amount"},
  {"amount zero", "{\"customerEmail\": \"a@b.co\", \"amount\": \"0.00\"}", "amount"},
  {"amount negative", "{\"customerEmail\": \"a@b.co\", \"amount\": \"-3\"}", "amount"},
  {"amount too precise", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1.001\"}", "amount"},
  {"amount and items",
   "{\"customerEmail\": \"a@b.co\", \"amount\": \"1\", \"items\": [{\"sku\": \"A\", \"quantity\": 1, \"unitPrice\": \"1\"}]}",
   "amount"},
  {"items empty", "{\"customerEmail\": \"a@b.co\", \"items\": []}", "items"},
  {"items not array", "{\"customerEmail\": \"a@b.co\", \"items\": {}}", "items"},
  {"item fields",
   "{\"customerEmail\": \"a@b.co\", \"items\": [{\"sku\": \"\", \"quantity\": 0, \"unitPrice\": \"x\", \"colour\": \"red\"}]}",
   "items[0].sku items[0].quantity items[0].unitPrice items[0].colour"},
  {"item missing fields", "{\"customerEmail\": \"a@b.co\", \"items\": [{\"sku\": \"A\"}]}",
   "items[0].quantity items[0].unitPrice"},
  {"second item bad",
   "{\"customerEmail\": \"a@b.co\", \"items\": [{\"sku\": \"A\", \"quantity\": 1, \"unitPrice\": \"1\"}, 7]}",
   "items[1]"},
  {"bad currency", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1\", \"currency\": \"real\"}", "currency"},
  {"yen has no cents", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1.50\", \"currency\": \"JPY\"}", "amount"},
  {"bad order number", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1\", \"orderNumber\": \"a b\"}", "orderNumber"},
  {"external code not string", "{\"customerEmail\": \"a@b.co\", \"amount\": \"1\", \"externalCodes\": {\"erp\": 1}}",
   "externalCodes.erp"},
  {"unknown field", "{\"customerEmail\": \"a@b.co\", \"ammount\": \"1\"}", "ammount items"},
  {"total overflow",
   "{\"customerEmail\": \"a@b.co\", \"items\": [{\"sku\": \"A\", \"quantity\": 1000000, \"unitPrice\": \"9999999999999.99\"}]}",
   "items"},
};

static void test_parse_rejects(void **state) {
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const bad_case_t *c = &bad_cases[i];
    obx_order_input_t in;
    bson_t errors = BSON_INITIALIZER;
    bool ok = obx_order_parse(c->body, strlen(c->body), "BRL", &in, &errors);
    char got[256] = "";
    bson_iter_t it, sub;
    bson_iter_init(&it, &errors);
    while (bson_iter_next(&it)) {
      bson_iter_recurse(&it, &sub);
      if (bson_iter_find(&sub, "field")) {
        size_t n = strlen(got);
        snprintf(got + n, sizeof got - n, "%s%s", n ? " " : "", bson_iter_utf8(&sub, NULL));
      }
    }
    if (ok || strcmp(got, c->fields) != 0) {
      print_error("%s: got ok=%d fields [%s], want ok=0 fields [%s]\n", c->name, ok, got, c->fields);
      fail();
    }
    bson_destroy(&errors);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_money_parse),        cmocka_unit_test(test_money_format),
    cmocka_unit_test(test_currency_digits),    cmocka_unit_test(test_parse_seed_payload),
    cmocka_unit_test(test_parse_items_total_exact), cmocka_unit_test(test_parse_rejects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
