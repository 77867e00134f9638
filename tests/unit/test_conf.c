/* test_conf.c - the configuration table: defaults, types, sources, passthrough, redaction, docs */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx/obx_conf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_value(const obx_conf_t *conf, const char *key, const char *want) {
  char *got = obx_conf_get_string(conf, key, true);
  if (!got || strcmp(got, want) != 0) fail_msg("%s: got %s want %s", key, got ? got : "(null)", want);
  free(got);
}

static void test_defaults(void **state) {
  obx_conf_t conf;
  obx_conf_init(&conf);
  assert_string_equal(conf.kafka_topic, "domain-events");
  assert_int_equal(conf.http_port, 8080);
  assert_true(conf.api_enabled);
  assert_int_equal(conf.outbox_poll_interval, 2000);
  assert_int_equal(conf.outbox_max_attempts, 10);
  assert_int_equal(conf.outbox_retention, 7LL * 86400000);
  assert_int_equal(conf.order_post_attempts, 5);
  assert_int_equal(conf.order_post_concurrency, 4);
  assert_int_equal(conf.retry_ladder.n, 4);
  assert_int_equal(conf.retry_ladder.ms[0], 5000);
  assert_int_equal(conf.retry_ladder.ms[3], 600000);
  assert_string_equal(conf.log_level, "info");
  assert_int_equal(conf.npassthrough, 0);
  /* every default in the table is valid and shown back */
  int n;
  const obx_conf_key_t *keys = obx_conf_keys(&n);
  assert_true(n >= 20);
  for (int i = 0; i < n; i++) {
    char *v = obx_conf_get_string(&conf, keys[i].env, true);
    assert_non_null(v);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_conf_set(&conf, keys[i].name, v, &err)) fail_msg("%s: its own text %s does not parse: %s", keys[i].name, v, err.msg);
    free(v);
  }
  obx_conf_cleanup(&conf);
  obx_conf_cleanup(&conf); /* idempotent */
}

static void test_types(void **state) {
  static const struct {
    const char *key, *value;
    const char *want; /* shown value when ok, substring of the error otherwise */
    bool ok;
  } cases[] = {
    {"OUTBOX_BATCH_SIZE", "100", "100", true},
    {"OUTBOX_BATCH_SIZE", "0", "OUTBOX_BATCH_SIZE=0: must be between 1 and 10000", false},
    {"outbox.batch_size", "10001", "outbox.batch_size=10001: must be between 1 and 10000", false},
    {"OUTBOX_BATCH_SIZE", "12x", "OUTBOX_BATCH_SIZE=12x: must be an integer between 1 and 10000", false},
    {"OUTBOX_BATCH_SIZE", "", "OUTBOX_BATCH_SIZE=: must be an integer", false},
    {"HTTP_PORT", "0", "0", true},
    {"HTTP_PORT", "65536", "HTTP_PORT=65536: must be between 0 and 65535", false},
    {"API_ENABLED", "false", "false", true},
    {"API_ENABLED", "YES", "true", true},
    {"API_ENABLED", "0", "false", true},
    {"API_ENABLED", "maybe", "API_ENABLED=maybe: must be true or false", false},
    {"OUTBOX_POLL_INTERVAL_MS", "250ms", "250ms", true},
    {"OUTBOX_POLL_INTERVAL_MS", "500", "500ms", true},
    {"OUTBOX_POLL_INTERVAL_MS", "5s", "5s", true},
    {"OUTBOX_POLL_INTERVAL_MS", "2m", "2m", true},
    {"OUTBOX_POLL_INTERVAL_MS", "1h", "1h", true},
    {"OUTBOX_POLL_INTERVAL_MS", "5", "OUTBOX_POLL_INTERVAL_MS=5: must be a duration between 10ms and 1h", false},
    {"OUTBOX_POLL_INTERVAL_MS", "2h", "must be a duration between 10ms and 1h", false},
    {"OUTBOX_POLL_INTERVAL_MS", "5 s", "OUTBOX_POLL_INTERVAL_MS=5 s: not a duration", false},
    {"OUTBOX_POLL_INTERVAL_MS", "-5s", "not a duration", false},
    {"OUTBOX_POLL_INTERVAL_MS", "5w", "not a duration", false},
    {"outbox.retention", "30d", "30d", true},
    {"RELAY_MODE", "poll", "poll", true},
    {"RELAY_MODE", "push", "RELAY_MODE=push: must be one of stream|poll", false},
    {"LOG_LEVEL", "debug", "debug", true},
    {"LOG_LEVEL", "trace", "LOG_LEVEL=trace: must be one of debug|info|warn|error", false},
    {"RETRY_LADDER", "1s, 10s,1m", "1s,10s,1m", true},
    {"RETRY_LADDER", "1s,,1m", "RETRY_LADDER=1s,,1m: element 2 is empty", false},
    {"RETRY_LADDER", "1m,1s", "'1s' is not longer than the element before it", false},
    {"RETRY_LADDER", "1s,1s", "must be strictly increasing", false},
    {"RETRY_LADDER", "1s,x", "RETRY_LADDER=1s,x: 'x' is not a duration", false},
    {"RETRY_LADDER", "1s,2d", "RETRY_LADDER=1s,2d: must be a duration between 10ms and 1d", false},
    {"RETRY_LADDER", "", "must list at least one duration", false},
    {"RETRY_LADDER", "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s,12s,13s,14s,15s,16s,17s", "at most 16 durations", false},
    {"KAFKA_TOPIC", "orders", "orders", true},
    {"no.such_key", "1", "unknown configuration key 'no.such_key'", false},
    {"OUTBOX_BATCH", "1", "unknown configuration key 'OUTBOX_BATCH'", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_conf_t conf;
    obx_conf_init(&conf);
    obx_err_t err = OBX_ERR_INIT;
    char *before = obx_conf_get_string(&conf, cases[i].key, true);
    bool ok = obx_conf_set(&conf, cases[i].key, cases[i].value, &err);
    if (ok != cases[i].ok) fail_msg("%s=%s: got ok=%d (%s) want ok=%d", cases[i].key, cases[i].value, ok, err.msg, cases[i].ok);
    if (ok) {
      check_value(&conf, cases[i].key, cases[i].want);
    } else {
      if (!strstr(err.msg, cases[i].want)) fail_msg("%s=%s: got error '%s' want '%s'", cases[i].key, cases[i].value, err.msg, cases[i].want);
      assert_int_equal(err.domain, OBX_ERR_CONF);
      if (before) check_value(&conf, cases[i].key, before); /* a failed set keeps the old value */
    }
    free(before);
    obx_conf_cleanup(&conf);
  }
}

static void test_parse_duration(void **state) {
  static const struct {
    const char *in;
    bool ok;
    int64_t ms;
  } cases[] = {{"0", true, 0},           {"250ms", true, 250},        {"5s", true, 5000}, {"2m", true, 120000},
               {"1h", true, 3600000},    {"7d", true, 604800000},     {"1500", true, 1500}, {"", false, 0},
               {"s", false, 0},          {"1.5s", false, 0},          {"5S", false, 0},   {NULL, false, 0},
               {"9999999999999999999d", false, 0}, {"999999999999999d", false, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t ms = -1;
    bool ok = obx_conf_parse_duration(cases[i].in, &ms);
    if (ok != cases[i].ok || (ok && ms != cases[i].ms))
      fail_msg("%s: got ok=%d ms=%lld want ok=%d ms=%lld", cases[i].in ? cases[i].in : "(null)", ok, (long long)ms,
               cases[i].ok, (long long)cases[i].ms);
  }
}

static char *write_file(const char *name, const char *text) {
  char *path;
  if (asprintf(&path, "%s/%s", obx_test_tmpdir(), name) < 0) abort();
  obx_test_write_file(path, text);
  return path;
}

static void test_precedence(void **state) {
  char *file = write_file("prec.conf", "# comment\n\n  outbox.batch_size = 10\nKAFKA_TOPIC=\"from-file\"\n"
                                       "mongo.db = filedb\nkafka.linger.ms = 7\n");
  char *env[] = {"OUTBOX_BATCH_SIZE=20", "MONGO_DB=envdb", "UNRELATED=1", NULL};
  char *empty_env[] = {NULL};
  char *overrides[] = {"outbox.batch_size=30", "kafka.linger.ms=9", "kafka.acks=all"};
  const struct {
    const char *name;
    bool use_file, use_env;
    int nover;
    const char *batch, *topic, *db, *linger;
  } cases[] = {
    {"defaults", false, false, 0, "50", "domain-events", "outboxd", NULL},
    {"file", true, false, 0, "10", "from-file", "filedb", "7"},
    {"file<env", true, true, 0, "20", "from-file", "envdb", "7"},
    {"file<env<override", true, true, 3, "30", "from-file", "envdb", "9"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_conf_t conf;
    obx_conf_init(&conf);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_conf_load(&conf, cases[i].use_file ? file : NULL, cases[i].use_env ? env : empty_env, overrides,
                       cases[i].nover, &err))
      fail_msg("%s: load failed: %s", cases[i].name, err.msg);
    check_value(&conf, "outbox.batch_size", cases[i].batch);
    check_value(&conf, "kafka.topic", cases[i].topic);
    check_value(&conf, "MONGO_DB", cases[i].db);
    char *linger = obx_conf_get_string(&conf, "kafka.linger.ms", true);
    if (cases[i].linger == NULL ? linger != NULL : (!linger || strcmp(linger, cases[i].linger) != 0))
      fail_msg("%s: kafka.linger.ms got %s want %s", cases[i].name, linger ? linger : "(null)",
               cases[i].linger ? cases[i].linger : "(null)");
    free(linger);
    obx_conf_cleanup(&conf);
  }
  /* passthrough pairs are kept once, in order, with the last value */
  obx_conf_t conf;
  obx_conf_init(&conf);
  assert_true(obx_conf_set(&conf, "kafka.stale", "x", NULL)); /* load resets to the defaults */
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_conf_load(&conf, file, empty_env, overrides, 3, &err));
  assert_int_equal(conf.npassthrough, 2);
  assert_string_equal(conf.passthrough[0].key, "kafka.linger.ms");
  assert_string_equal(conf.passthrough[0].value, "9");
  assert_string_equal(conf.passthrough[1].key, "kafka.acks");
  obx_conf_cleanup(&conf);
  free(file);
}

static void test_load_errors(void **state) {
  char *unknown = write_file("unknown.conf", "mongo.db = x\n\nrelay.turbo = on\n");
  char *noeq = write_file("noeq.conf", "mongo.db x\n");
  char *badval = write_file("badval.conf", "OUTBOX_MAX_ATTEMPTS=0\n");
  char *env_bad[] = {"ORDER_POST_CONCURRENCY=1000", NULL};
  char *env_ok[] = {NULL};
  char *over_unknown[] = {"worker.turbo=1"};
  char *over_noeq[] = {"worker.attempts"};
  char *over_prefix_only[] = {"kafka.=1"};
  const struct {
    const char *name;
    const char *file;
    char *const *env;
    char *const *over;
    int nover;
    const char *want;
  } cases[] = {
    {"unknown key in file", NULL, env_ok, NULL, 0, "unknown.conf:3: unknown configuration key 'relay.turbo'"},
    {"line without =", NULL, env_ok, NULL, 0, "noeq.conf:1: expected `key = value`"},
    {"bad value in file", NULL, env_ok, NULL, 0, "badval.conf:1: OUTBOX_MAX_ATTEMPTS=0: must be between 1 and 1000"},
    {"bad env", NULL, env_bad, NULL, 0, "ORDER_POST_CONCURRENCY=1000: must be between 1 and 256"},
    {"unknown override", NULL, env_ok, over_unknown, 1, "unknown configuration key 'worker.turbo'"},
    {"override without =", NULL, env_ok, over_noeq, 1, "-X worker.attempts: expected key=value"},
    {"bare prefix", NULL, env_ok, over_prefix_only, 1, "unknown configuration key 'kafka.'"},
    {"missing file", "/nonexistent/outboxd.conf", env_ok, NULL, 0, "/nonexistent/outboxd.conf: No such file"},
  };
  const char *files[] = {unknown, noeq, badval};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_conf_t conf;
    obx_conf_init(&conf);
    obx_err_t err = OBX_ERR_INIT;
    const char *file = cases[i].file ? cases[i].file : (i < 3 ? files[i] : NULL);
    bool ok = obx_conf_load(&conf, file, cases[i].env, cases[i].over, cases[i].nover, &err);
    if (ok || !strstr(err.msg, cases[i].want))
      fail_msg("%s: got ok=%d '%s' want error containing '%s'", cases[i].name, ok, err.msg, cases[i].want);
    obx_conf_cleanup(&conf);
  }
  obx_conf_t conf;
  obx_conf_init(&conf);
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_conf_load_file(&conf, "/nonexistent/optional.conf", false, &err));
  obx_conf_cleanup(&conf);
  free(unknown);
  free(noeq);
  free(badval);
}

static void test_redaction(void **state) {
  obx_conf_t conf;
  obx_conf_init(&conf);
  obx_err_t err = OBX_ERR_INIT;
  assert_true(obx_conf_set(&conf, "MONGO_URI", "mongodb://app:hunter2@db1,db2/?replicaSet=rs0", &err));
  assert_true(obx_conf_set(&conf, "amqp.url", "amqp://ops:s3cret@rabbit:5672/%2F", &err));
  assert_true(obx_conf_set(&conf, "kafka.sasl.password", "kpass", &err));
  assert_true(obx_conf_set(&conf, "kafka.sasl.username", "kuser", &err));
  assert_true(obx_conf_set(&conf, "kafka.ssl.key.pem", "-----BEGIN PRIVATE KEY-----", &err));
  assert_true(obx_conf_set(&conf, "amqp.key_file", "/run/secrets/amqp-key.pem", &err));
  static const struct {
    const char *key, *hidden, *revealed;
  } cases[] = {
    {"mongo.uri", "mongodb://app:***@db1,db2/?replicaSet=rs0", "mongodb://app:hunter2@db1,db2/?replicaSet=rs0"},
    {"AMQP_URL", "amqp://ops:***@rabbit:5672/%2F", "amqp://ops:s3cret@rabbit:5672/%2F"},
    {"kafka.sasl.password", "***", "kpass"},
    {"kafka.sasl.username", "kuser", "kuser"},
    {"kafka.ssl.key.pem", "***", "-----BEGIN PRIVATE KEY-----"},
    {"amqp.key_file", "***", "/run/secrets/amqp-key.pem"},
    {"mongo.db", "outboxd", "outboxd"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *hidden = obx_conf_get_string(&conf, cases[i].key, false);
    char *revealed = obx_conf_get_string(&conf, cases[i].key, true);
    if (strcmp(hidden, cases[i].hidden) != 0) fail_msg("%s hidden: got %s want %s", cases[i].key, hidden, cases[i].hidden);
    if (strcmp(revealed, cases[i].revealed) != 0)
      fail_msg("%s revealed: got %s want %s", cases[i].key, revealed, cases[i].revealed);
    free(hidden);
    free(revealed);
  }
  assert_null(obx_conf_get_string(&conf, "kafka.not.set", true));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  obx_conf_print_values(&conf, f);
  fclose(f);
  assert_null(strstr(buf, "hunter2"));
  assert_null(strstr(buf, "s3cret"));
  assert_null(strstr(buf, "kpass"));
  assert_non_null(strstr(buf, "mongo.uri = mongodb://app:***@db1,db2/?replicaSet=rs0\n"));
  assert_non_null(strstr(buf, "kafka.sasl.password = ***\n"));
  assert_non_null(strstr(buf, "outbox.batch_size = 50\n"));
  free(buf);
  obx_conf_cleanup(&conf);
}

static void test_doc(void **state) {
  static const char *const formats[] = {"text", "markdown"};
  int n;
  const obx_conf_key_t *keys = obx_conf_keys(&n);
  for (size_t fi = 0; fi < 2; fi++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    obx_conf_print_doc(f, formats[fi]);
    fclose(f);
    for (int i = 0; i < n; i++) {
      /* markdown escapes | < > * in descriptions; the text form shows them as declared */
      bool plain = fi == 0 || !strpbrk(keys[i].description, "|<>*");
      if (!strstr(buf, keys[i].name) || !strstr(buf, keys[i].env) || (plain && !strstr(buf, keys[i].description)))
        fail_msg("%s doc lacks %s / %s", formats[fi], keys[i].name, keys[i].env);
    }
    assert_null(strstr(buf, "guest:guest")); /* sensitive defaults are masked too */
    if (fi == 1) {
      assert_non_null(strstr(buf, "| Key | Environment | Type | Default | Allowed | Description |\n"));
      assert_non_null(strstr(buf, "| `outbox.batch_size` | `OUTBOX_BATCH_SIZE` | int | `50` | 1..10000 |"));
      assert_non_null(strstr(buf, "| `relay.mode` | `RELAY_MODE` | enum | `stream` | stream, poll |"));
      assert_non_null(strstr(buf, "| `outbox.poll_interval` | `OUTBOX_POLL_INTERVAL_MS` | duration | `2s` | 10ms..1h |"));
      assert_non_null(strstr(buf, "| `worker.retry_ladder` | `RETRY_LADDER` | durations | `5s,30s,2m,10m` | each 10ms..1d |"));
      /* one table row per key */
      int rows = 0;
      for (const char *p = buf; (p = strstr(p, "\n| `")); p++) rows++;
      assert_int_equal(rows, n);
    } else {
      assert_non_null(strstr(buf, "KEY"));
      assert_non_null(strstr(buf, "outbox.poll_interval"));
    }
    free(buf);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_defaults),   cmocka_unit_test(test_types),     cmocka_unit_test(test_parse_duration),
    cmocka_unit_test(test_precedence), cmocka_unit_test(test_load_errors), cmocka_unit_test(test_redaction),
    cmocka_unit_test(test_doc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
