/* test_cors.c - API_CORS_ORIGINS through the real outboxd binary: preflight of allowed and
 * other origins, CORS headers on successes and on every kind of error (401, 403, 400, 404,
 * 429), none for other origins, and `*`.
 *
 * No MongoDB is needed (every case is answered before a handler touches it), so outboxd runs
 * `--roles api` against a URI nothing listens on. */
#include "obx_test.h"
#include "obx_test_outboxd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define APP "https://app.example.com"
#define LOCAL "http://localhost:3000"
#define EVIL "https://evil.example.com"
#define NO_MONGO "mongo.uri=mongodb://127.0.0.1:1/?replicaSet=rs0"

static obx_test_outboxd_t outboxd;
static char keys_path[300];
static char key_writer[64], key_reader[64];

/* Starts outboxd with this api.cors_origins value and api.rate_limit=1 (bursts of 2), and
 * waits until its roles have registered their routes. */
static bool start(obx_test_outboxd_t *d, const char *origins) {
  char cors_arg[200], keys_arg[340];
  snprintf(cors_arg, sizeof cors_arg, "api.cors_origins=%s", origins);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  char *args[] = {"--roles", "api", "-X", NO_MONGO, "-X", keys_arg, "-X", cors_arg, "-X", "api.rate_limit=1", NULL};
  if (!obx_test_outboxd_start(d, args)) return false;
  if (obx_test_file_contains(d->proc.log_path, "outboxd running", 30000)) return true;
  fprintf(stderr, "outboxd did not finish starting; log: %s\n", d->proc.log_path);
  obx_test_outboxd_stop(d);
  return false;
}

static int group_setup(void **state) {
  snprintf(keys_path, sizeof keys_path, "%s/api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, "acme", "orders:write", key_writer);
  obx_test_apikey_add(keys_path, "acme", "orders:read", key_reader);
  /* two entries, the second with a trailing '/' and spaces around the comma */
  return start(&outboxd, APP " , " LOCAL "/") ? 0 : -1;
}

static int group_teardown(void **state) {
  int status = obx_test_outboxd_stop(&outboxd);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* A request with an Origin header (NULL: none) and, when acrm is set, the preflight's
 * Access-Control-Request-Method. */
static void request(int port, const char *method, const char *path, const char *origin, const char *acrm,
                    const char *key, const char *body, obx_test_http_resp_t *resp) {
  char h_origin[160], h_acrm[80];
  const char *headers[4] = {NULL};
  int n = 0;
  if (origin) {
    snprintf(h_origin, sizeof h_origin, "Origin: %s", origin);
    headers[n++] = h_origin;
  }
  if (acrm) {
    snprintf(h_acrm, sizeof h_acrm, "Access-Control-Request-Method: %s", acrm);
    headers[n++] = h_acrm;
  }
  if (body) headers[n++] = "Content-Type: application/json";
  assert_true(obx_test_http(port, method, path, key, body, headers, resp));
}

/* want NULL: the header must be absent; else it must equal want. */
static bool header_is(const obx_test_http_resp_t *resp, const char *name, const char *want, const char *what) {
  char got[256];
  bool present = obx_test_http_header(resp, name, got, sizeof got);
  if (!want && !present) return true;
  if (want && present && strcmp(got, want) == 0) return true;
  print_error("%s: header %s: got %s%s%s, want %s%s%s\n", what, name, present ? "\"" : "", present ? got : "absent",
              present ? "\"" : "", want ? "\"" : "", want ? want : "absent", want ? "\"" : "");
  return false;
}

static void test_table(void **state) {
  static const struct {
    const char *name, *method, *path, *origin, *acrm;
    int key; /* 0 none, 1 orders:write, 2 orders:read */
    const char *body;
    long want_status;
    const char *want_acao;    /* Access-Control-Allow-Origin; NULL: absent */
    const char *want_methods; /* Access-Control-Allow-Methods; NULL: absent */
  } cases[] = {
    {"preflight, allowed origin", "OPTIONS", "/orders", APP, "POST", 0, NULL, 204, APP, "POST"},
    {"preflight, second allowed origin", "OPTIONS", "/api/pipelines/p1", LOCAL, "PUT", 0, NULL, 204, LOCAL, "GET, PUT"},
    {"preflight, other origin", "OPTIONS", "/orders", EVIL, "POST", 0, NULL, 405, NULL, NULL},
    {"preflight, allowed origin, unknown path", "OPTIONS", "/nowhere", APP, "GET", 0, NULL, 404, APP, NULL},
    {"plain OPTIONS, allowed origin", "OPTIONS", "/orders", APP, NULL, 0, NULL, 405, APP, NULL},
    {"success, allowed origin", "GET", "/healthz", APP, NULL, 0, NULL, 200, APP, NULL},
    {"success, no origin", "GET", "/healthz", NULL, NULL, 0, NULL, 200, NULL, NULL},
    {"401, allowed origin", "POST", "/orders", APP, NULL, 0, "{}", 401, APP, NULL},
    {"401, other origin", "POST", "/orders", EVIL, NULL, 0, "{}", 401, NULL, NULL},
    {"403, allowed origin", "POST", "/orders", APP, NULL, 2, "{}", 403, APP, NULL},
    {"404, allowed origin", "GET", "/nowhere", LOCAL, NULL, 0, NULL, 404, LOCAL, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_http_resp_t resp;
    const char *key = cases[i].key == 1 ? key_writer : cases[i].key == 2 ? key_reader : NULL;
    request(outboxd.port, cases[i].method, cases[i].path, cases[i].origin, cases[i].acrm, key, cases[i].body, &resp);
    bool ok = true;
    if (resp.status != cases[i].want_status) {
      print_error("%s: got HTTP %ld %s, want %ld\n", cases[i].name, resp.status, resp.body, cases[i].want_status);
      ok = false;
    }
    bool preflight = cases[i].want_status == 204;
    ok &= header_is(&resp, "Access-Control-Allow-Origin", cases[i].want_acao, cases[i].name);
    ok &= header_is(&resp, "Vary", cases[i].want_acao ? "Origin" : NULL, cases[i].name);
    ok &= header_is(&resp, "Access-Control-Allow-Methods", cases[i].want_methods, cases[i].name);
    ok &= header_is(&resp, "Access-Control-Allow-Headers",
                    preflight ? "Authorization, Content-Type, Idempotency-Key, X-Correlation-Id" : NULL, cases[i].name);
    ok &= header_is(&resp, "Access-Control-Max-Age", preflight ? "600" : NULL, cases[i].name);
    if (cases[i].want_acao && cases[i].want_status == 401)
      ok &= header_is(&resp, "Access-Control-Expose-Headers",
                      "Location, Retry-After, Idempotent-Replayed, WWW-Authenticate", cases[i].name);
    obx_test_http_resp_cleanup(&resp);
    if (!ok) fail();
  }
}

/* A validation error (400) and the rate limit's 429 carry the headers too. API_RATE_LIMIT is 1
 * per second with bursts of 2, so a quick series of requests reaches 429. */
static void test_problem_and_429(void **state) {
  obx_test_http_resp_t resp;
  long last = 0;
  bool saw_400 = false;
  for (int i = 0; i < 50 && last != 429; i++) {
    request(outboxd.port, "POST", "/orders", APP, NULL, key_writer, "{\"amount\": \"1.00\"}", &resp);
    last = resp.status;
    if (last != 400 && last != 429) {
      print_error("request %d: got HTTP %ld %s, want 400 or 429\n", i, last, resp.body);
      fail();
    }
    char ctype[128] = "";
    obx_test_http_header(&resp, "Content-Type", ctype, sizeof ctype);
    if (strcmp(ctype, "application/problem+json") != 0) {
      print_error("request %d (HTTP %ld): got Content-Type \"%s\", want application/problem+json\n", i, last, ctype);
      fail();
    }
    saw_400 |= last == 400;
    bool ok = header_is(&resp, "Access-Control-Allow-Origin", APP, last == 429 ? "429" : "400") &&
              header_is(&resp, "Vary", "Origin", last == 429 ? "429" : "400");
    char retry[16];
    if (ok && last == 429 && !obx_test_http_header(&resp, "Retry-After", retry, sizeof retry)) {
      print_error("429: no Retry-After header\n");
      ok = false;
    }
    obx_test_http_resp_cleanup(&resp);
    if (!ok) fail();
  }
  if (!saw_400 || last != 429) {
    print_error("got %s400 and last status %ld, want 400 then 429\n", saw_400 ? "" : "no ", last);
    fail();
  }
}

/* `*` allows any origin (echoed); without API_CORS_ORIGINS no response has CORS headers. */
static void test_any_and_off(void **state) {
  static const struct {
    const char *origins;
    const char *want_acao;
    long want_preflight;
  } cases[] = {
    {"*", EVIL, 204},
    {"", NULL, 405},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_outboxd_t d;
    obx_test_http_resp_t resp;
    assert_true(start(&d, cases[i].origins));
    request(d.port, "OPTIONS", "/orders", EVIL, "POST", 0, NULL, &resp);
    long preflight = resp.status;
    bool ok = header_is(&resp, "Access-Control-Allow-Origin", cases[i].want_acao, "preflight");
    obx_test_http_resp_cleanup(&resp);
    request(d.port, "POST", "/orders", EVIL, NULL, NULL, "{}", &resp);
    ok &= resp.status == 401 && header_is(&resp, "Access-Control-Allow-Origin", cases[i].want_acao, "401");
    obx_test_http_resp_cleanup(&resp);
    int status = obx_test_outboxd_stop(&d);
    if (!ok || preflight != cases[i].want_preflight || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      print_error("api.cors_origins=\"%s\": preflight got HTTP %ld, want %ld; headers ok: %d; exit status %d\n",
                  cases[i].origins, preflight, cases[i].want_preflight, ok, status);
      fail();
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_table),
    cmocka_unit_test(test_problem_and_429),
    cmocka_unit_test(test_any_and_off),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
