/* test_amqp.c - the AMQP connection module: URL and settings, TLS file errors, the keeper thread */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "obx/obx_amqp.h"

static void test_settings_from_conf(void **state) {
  obx_conf_t conf;
  obx_conf_init(&conf);
  obx_err_t err = OBX_ERR_INIT;
  static const struct {
    const char *heartbeat, *verify_peer, *verify_host;
    int want_hb;
    bool want_no_peer, want_no_host;
  } cases[] = {
    {"30s", "true", "true", 30, false, false},
    {"0", "false", "true", -1, true, false},
    {"5s", "true", "false", 5, false, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_true(obx_conf_set(&conf, "amqp.heartbeat", cases[i].heartbeat, &err));
    assert_true(obx_conf_set(&conf, "AMQP_VERIFY_PEER", cases[i].verify_peer, &err));
    assert_true(obx_conf_set(&conf, "amqp.verify_hostname", cases[i].verify_host, &err));
    assert_true(obx_conf_set(&conf, "amqp.ca_file", "/etc/ca.pem", &err));
    obx_amqp_settings_t s;
    obx_amqp_settings_from_conf(&s, &conf);
    if (s.heartbeat_s != cases[i].want_hb) fail_msg("case %zu heartbeat: got %d want %d", i, s.heartbeat_s, cases[i].want_hb);
    assert_int_equal(s.no_verify_peer, cases[i].want_no_peer);
    assert_int_equal(s.no_verify_hostname, cases[i].want_no_host);
    assert_string_equal(s.ca_file, "/etc/ca.pem");
  }
  obx_conf_cleanup(&conf);
}

static void test_target_parses_url_and_defaults(void **state) {
  static const struct {
    const char *url;
    const char *host, *vhost, *user;
    int port;
    bool tls;
  } cases[] = {
    {"amqp://guest:guest@127.0.0.1:5672/%2F", "127.0.0.1", "/", "guest", 5672, false},
    {"amqps://u:p@rabbit.example.com/prod", "rabbit.example.com", "prod", "u", 5671, true},
    {"amqps://u:p@rabbit:15671/v", "rabbit", "v", "u", 15671, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_amqp_target_t t;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_amqp_target_init(&t, cases[i].url, NULL, &err)) fail_msg("%s: %s", cases[i].url, err.msg);
    assert_string_equal(t.host, cases[i].host);
    assert_string_equal(t.vhost, cases[i].vhost);
    assert_string_equal(t.user, cases[i].user);
    assert_int_equal(t.port, cases[i].port);
    assert_int_equal(t.tls, cases[i].tls);
    assert_int_equal(t.heartbeat_s, 30);
    assert_true(t.verify_peer);
    assert_true(t.verify_hostname);
    assert_null(t.ca_file);
    obx_amqp_target_cleanup(&t);
  }
}

static void test_target_refuses_bad_input(void **state) {
  obx_amqp_settings_t cert_only = {.cert_file = "/c.pem"};
  obx_amqp_settings_t key_only = {.key_file = "/k.pem"};
  static const char *const want[] = {"AMQP_URL is empty", "not a valid amqp", "go together", "go together"};
  const char *urls[] = {"", "http://x/", "amqps://h/", "amqps://h/"};
  const obx_amqp_settings_t *settings[] = {NULL, NULL, &cert_only, &key_only};
  for (size_t i = 0; i < 4; i++) {
    obx_amqp_target_t t;
    obx_err_t err = OBX_ERR_INIT;
    if (obx_amqp_target_init(&t, urls[i], settings[i], &err)) fail_msg("case %zu: accepted", i);
    assert_int_equal(err.domain, OBX_ERR_CONF);
    assert_false(err.retriable);
    if (!strstr(err.msg, want[i])) fail_msg("case %zu: got '%s' want '%s'", i, err.msg, want[i]);
  }
}

/* A CA file that cannot be read is a configuration error (non-retriable), found before any
 * network traffic; the same for the client certificate. */
static void test_unreadable_tls_files_are_config_errors(void **state) {
  obx_amqp_settings_t bad_ca = {.ca_file = "/nonexistent/ca.pem"};
  obx_amqp_settings_t bad_cert = {.ca_file = "/etc/ssl/certs/ca-certificates.crt", .cert_file = "/nonexistent/c.pem",
                                  .key_file = "/nonexistent/k.pem"};
  const obx_amqp_settings_t *cases[] = {&bad_ca, &bad_cert};
  const char *want[] = {"amqp.ca_file", "amqp.cert_file"};
  for (size_t i = 0; i < 2; i++) {
    obx_amqp_target_t t;
    obx_err_t err = OBX_ERR_INIT;
    assert_true(obx_amqp_target_init(&t, "amqps://u:p@127.0.0.1:1/", cases[i], &err));
    struct amqp_connection_state_t_ *conn = obx_amqp_open(&t, "test", 500, &err);
    assert_null(conn);
    if (!strstr(err.msg, want[i])) fail_msg("case %zu: got '%s' want '%s'", i, err.msg, want[i]);
    assert_false(err.retriable);
    obx_amqp_target_cleanup(&t);
  }
}

static void test_unreachable_is_retriable(void **state) {
  obx_amqp_target_t t;
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_amqp_target_init(&t, "amqp://u:p@127.0.0.1:1/", NULL, &err));
  assert_null(obx_amqp_open(&t, "test", 500, &err));
  assert_int_equal(err.domain, OBX_ERR_AMQP);
  assert_true(err.retriable);
  obx_amqp_target_cleanup(&t);
}

static void count_tick(void *ctx) { atomic_fetch_add((atomic_int *)ctx, 1); }

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The keeper calls its function repeatedly, and stop returns promptly even with a long interval. */
static void test_keeper_ticks_and_stops_promptly(void **state) {
  atomic_int n = 0;
  obx_amqp_keeper_t *k = obx_amqp_keeper_start(count_tick, &n, 20);
  int64_t deadline = now_ms() + 5000;
  while (atomic_load(&n) < 3 && now_ms() < deadline) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  obx_amqp_keeper_stop(k);
  if (atomic_load(&n) < 3) fail_msg("keeper ticked %d times in 5 s, want >= 3", atomic_load(&n));
  atomic_int m = 0;
  k = obx_amqp_keeper_start(count_tick, &m, 600000);
  int64_t t0 = now_ms();
  obx_amqp_keeper_stop(k);
  if (now_ms() - t0 > 1000) fail_msg("stop took %lld ms with a 10 min interval", (long long)(now_ms() - t0));
  assert_int_equal(atomic_load(&m), 0);
  obx_amqp_keeper_stop(NULL);
}

static void test_keeper_interval(void **state) {
  obx_amqp_settings_t s = {0};
  assert_int_equal(obx_amqp_keeper_interval_ms(&s), 15000);
  s.heartbeat_s = 1;
  assert_int_equal(obx_amqp_keeper_interval_ms(&s), 500);
  s.heartbeat_s = 60;
  assert_int_equal(obx_amqp_keeper_interval_ms(&s), 30000);
  s.heartbeat_s = -1;
  assert_int_equal(obx_amqp_keeper_interval_ms(&s), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_settings_from_conf),
    cmocka_unit_test(test_target_parses_url_and_defaults),
    cmocka_unit_test(test_target_refuses_bad_input),
    cmocka_unit_test(test_unreadable_tls_files_are_config_errors),
    cmocka_unit_test(test_unreachable_is_retriable),
    cmocka_unit_test(test_keeper_ticks_and_stops_promptly),
    cmocka_unit_test(test_keeper_interval),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
