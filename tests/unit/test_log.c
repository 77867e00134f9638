/* test_log.c - JSON lines, level filter, escaping, redaction, and the library log routing */
#include "obx_test.h"
#include "obx/obx_log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>
#include <microhttpd.h>
#include <mongoc/mongoc.h>

/* Captures the log stream in memory for one test. */
typedef struct {
  FILE *f;
  char *buf;
  size_t len;
} capture_t;

static int capture_setup(void **state) {
  capture_t *cap = calloc(1, sizeof *cap);
  cap->f = open_memstream(&cap->buf, &cap->len);
  obx_log_set_stream(cap->f);
  obx_log_set_level(OBX_LOG_DEBUG);
  obx_log_set_role("test");
  *state = cap;
  return 0;
}

static int capture_teardown(void **state) {
  capture_t *cap = *state;
  obx_log_set_stream(NULL);
  obx_log_set_level(OBX_LOG_INFO);
  fclose(cap->f);
  free(cap->buf);
  free(cap);
  return 0;
}

/* Current captured text (the logger flushes after every line). */
static const char *captured(capture_t *cap) {
  fflush(cap->f);
  return cap->buf ? cap->buf : "";
}

static void capture_reset(capture_t *cap) {
  obx_log_set_stream(NULL);
  fclose(cap->f);
  free(cap->buf);
  cap->buf = NULL;
  cap->f = open_memstream(&cap->buf, &cap->len);
  obx_log_set_stream(cap->f);
}

/* Parses the only line captured as JSON and returns the string value of key (static copy). */
static const char *line_field(capture_t *cap, const char *key) {
  static char out[1024];
  const char *text = captured(cap);
  bson_error_t berr;
  bson_t *doc = bson_new_from_json((const uint8_t *)text, (ssize_t)strlen(text), &berr);
  if (!doc) fail_msg("not a JSON line: %s (%s)", text, berr.message);
  bson_iter_t it;
  out[0] = '\0';
  if (bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_UTF8(&it))
    snprintf(out, sizeof out, "%s", bson_iter_utf8(&it, NULL));
  else
    snprintf(out, sizeof out, "<missing %s>", key);
  bson_destroy(doc);
  return out;
}

static int evaluated;
static int bump(void) { return ++evaluated; }

static void test_level_filter(void **state) {
  capture_t *cap = *state;
  obx_log_set_level(OBX_LOG_INFO);
  evaluated = 0;
  obx_debug("not formatted %d", bump());
  assert_int_equal(evaluated, 0);
  assert_string_equal(captured(cap), "");
  obx_log_event(OBX_LOG_DEBUG, "e", "c", "x %d", bump());
  assert_int_equal(evaluated, 0);
  obx_info("formatted %d", bump());
  assert_int_equal(evaluated, 1);
  assert_string_equal(line_field(cap, "msg"), "formatted 1");
  assert_string_equal(line_field(cap, "level"), "info");
  assert_string_equal(line_field(cap, "role"), "test");

  static const struct {
    obx_log_level_t set, probe;
    bool enabled;
  } cases[] = {
    {OBX_LOG_DEBUG, OBX_LOG_DEBUG, true}, {OBX_LOG_INFO, OBX_LOG_DEBUG, false}, {OBX_LOG_WARN, OBX_LOG_INFO, false},
    {OBX_LOG_WARN, OBX_LOG_ERROR, true},  {OBX_LOG_ERROR, OBX_LOG_WARN, false}, {OBX_LOG_OFF, OBX_LOG_ERROR, false},
    {OBX_LOG_DEBUG, OBX_LOG_OFF, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_log_set_level(cases[i].set);
    if (obx_log_enabled(cases[i].probe) != cases[i].enabled)
      fail_msg("level %s probe %s: got %d want %d", obx_log_level_name(cases[i].set),
               obx_log_level_name(cases[i].probe), !cases[i].enabled, cases[i].enabled);
  }
  obx_log_level_t lv;
  assert_true(obx_log_level_parse("warn", &lv));
  assert_int_equal(lv, OBX_LOG_WARN);
  assert_false(obx_log_level_parse("verbose", &lv));
  assert_false(obx_log_level_parse(NULL, &lv));
}

static void test_line_shape_and_escaping(void **state) {
  capture_t *cap = *state;
  obx_log_event(OBX_LOG_WARN, "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee", NULL, "q\"uote b\\ack\nnl\ttab \x01 bad\xff é");
  const char *text = captured(cap);
  assert_int_equal(text[strlen(text) - 1], '\n');
  assert_non_null(strstr(text, "\"msg\":\"q\\\"uote b\\\\ack\\nnl\\ttab \\u0001 bad\\ufffd é\""));
  assert_null(strstr(text, "correlationId")); /* NULL values skipped */
  assert_string_equal(line_field(cap, "eventId"), "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee");
  const char *ts = line_field(cap, "ts");
  assert_int_equal(strlen(ts), 24);
  assert_int_equal(ts[10], 'T');
  assert_int_equal(ts[23], 'Z');
  assert_int_equal(ts[19], '.');
  assert_int_equal(strncmp(text, "{\"ts\":\"", 7), 0);
}

static void test_redaction(void **state) {
  capture_t *cap = *state;
  static const struct {
    const char *key, *value, *want;
  } fields[] = {
    {"password", "hunter2", "***"},
    {"dbPassword", "hunter2", "***"},
    {"apiKey", "k-123", "***"},
    {"Authorization", "Bearer abc", "***"},
    {"accessToken", "t", "***"},
    {"client_secret", "s", "***"},
    {"mongoUri", "mongodb://app:hunter2@db1:27017,db2/?replicaSet=rs0", "mongodb://app:***@db1:27017,db2/?replicaSet=rs0"},
    {"url", "amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"},
    {"endpoint", "https://tok3n@example.com/x", "https://***@example.com/x"},
    {"orderNumber", "A-1", "A-1"},
    {"note", "login with password=hunter2&user=x", "login with password=***&user=x"},
  };
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    capture_reset(cap);
    obx_log_field_t f = {fields[i].key, fields[i].value};
    obx_log_write(OBX_LOG_INFO, &f, 1, "m");
    const char *got = line_field(cap, fields[i].key);
    if (strcmp(got, fields[i].want) != 0) fail_msg("field %s: got %s want %s", fields[i].key, got, fields[i].want);
  }

  static const struct {
    const char *in, *want;
  } texts[] = {
    {"connecting to mongodb://u:p4ss@h:27017/db", "connecting to mongodb://u:***@h:27017/db"},
    {"mongodb://h1,h2/?replicaSet=rs0", "mongodb://h1,h2/?replicaSet=rs0"},
    {"header Authorization: Bearer abc.def", "header Authorization: Bearer ***"},
    {"sasl.password=s3cr3t, next", "sasl.password=***, next"},
    {"{\"password\": \"s3cr3t\"}", "{\"password\": \"***\"}"},
    {"no secrets here: token bucket refill", "no secrets here: token bucket refill"},
    {"https://example.com/path?token=abc&x=1", "https://example.com/path?token=***&x=1"},
    /* values, not words: paths and file names that contain a secret word stay whole */
    {"api.keys_file: cannot open /etc/outboxd/api-key: No such file or directory",
     "api.keys_file: cannot open /etc/outboxd/api-key: No such file or directory"},
    {"open api-key.pem: No such file", "open api-key.pem: No such file"},
    {"read C:\\secrets\\token: denied", "read C:\\secrets\\token: denied"},
    {"password: hunter2", "password: ***"},
    {"api-key: k-123 rejected", "api-key: *** rejected"},
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    capture_reset(cap);
    obx_log_write(OBX_LOG_INFO, NULL, 0, "%s", texts[i].in);
    const char *got = line_field(cap, "msg");
    if (strcmp(got, texts[i].want) != 0) fail_msg("msg %s: got %s want %s", texts[i].in, got, texts[i].want);
    char *uri = obx_log_redact_uri(texts[i].in);
    if (strcmp(uri, texts[i].want) != 0) fail_msg("redact_uri %s: got %s want %s", texts[i].in, uri, texts[i].want);
    free(uri);
  }
}

#define NTHREADS 4
#define NLINES 500

static void *writer(void *arg) {
  obx_log_set_role((const char *)arg);
  for (int i = 0; i < NLINES; i++) obx_info("line %d from a thread with a longer message to make interleaving visible", i);
  return NULL;
}

static void test_threads_whole_lines(void **state) {
  capture_t *cap = *state;
  pthread_t th[NTHREADS];
  static const char *roles[NTHREADS] = {"api", "relay", "worker", "ctl"};
  for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, writer, (void *)roles[i]);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  char *text = strdup(captured(cap));
  int lines = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    bson_error_t berr;
    bson_t *doc = bson_new_from_json((const uint8_t *)line, -1, &berr);
    if (!doc) fail_msg("line %d is not JSON: %s", lines, line);
    bson_destroy(doc);
    lines++;
  }
  free(text);
  assert_int_equal(lines, NTHREADS * NLINES);
}

static void test_mongoc_routing(void **state) {
  capture_t *cap = *state;
  obx_log_route_mongoc();
  mongoc_log(MONGOC_LOG_LEVEL_WARNING, "cluster", "routed %s mongodb://u:pw@h/", "warning");
  assert_string_equal(line_field(cap, "lib"), "mongoc");
  assert_string_equal(line_field(cap, "level"), "warn");
  assert_string_equal(line_field(cap, "domain"), "cluster");
  assert_string_equal(line_field(cap, "msg"), "routed warning mongodb://u:***@h/");
  capture_reset(cap);
  obx_log_set_level(OBX_LOG_ERROR);
  mongoc_log(MONGOC_LOG_LEVEL_INFO, "cluster", "filtered");
  assert_string_equal(captured(cap), "");
  mongoc_log_set_handler(mongoc_log_default_handler, NULL);
}

static bool has_rdkafka_line(void *ctx) { return strstr(captured(ctx), "\"lib\":\"rdkafka\"") != NULL; }

static void test_kafka_routing(void **state) {
  capture_t *cap = *state;
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  assert_int_equal(rd_kafka_conf_set(conf, "bootstrap.servers", "127.0.0.1:1", errstr, sizeof errstr), RD_KAFKA_CONF_OK);
  assert_int_equal(rd_kafka_conf_set(conf, "debug", "broker", errstr, sizeof errstr), RD_KAFKA_CONF_OK);
  obx_log_route_kafka(conf);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  assert_non_null(rk);
  bool seen = obx_test_wait_for(has_rdkafka_line, cap, 30000, 20);
  rd_kafka_destroy(rk);
  if (!seen) fail_msg("no rdkafka line routed; got: %s", captured(cap));
  /* every routed line is one of ours: parse the first */
  const char *text = captured(cap);
  const char *first = strstr(text, "{\"ts\"");
  assert_ptr_equal(first, text);
  assert_non_null(strstr(text, "\"level\":\"debug\""));
  assert_non_null(strstr(text, "\"facility\":"));
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **ptr) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(2, (void *)"ok", MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
  MHD_destroy_response(resp);
  return ret;
}

static size_t discard(char *p, size_t size, size_t n, void *u) { return size * n; }

static void test_curl_routing(void **state) {
  capture_t *cap = *state;
  struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, answer, NULL,
                                          MHD_OPTION_LISTENING_ADDRESS_REUSE, 1, MHD_OPTION_END);
  assert_non_null(d);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/hook", (unsigned)info->port);

  CURL *curl = curl_easy_init();
  struct curl_slist *hdrs = curl_slist_append(NULL, "Authorization: Bearer very-secret-value");
  hdrs = curl_slist_append(hdrs, "X-Trace: visible");
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "{\"body\":\"never-logged\"}");
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard);
  obx_log_curl_attach(curl, NULL);
  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(curl);
  MHD_stop_daemon(d);
  assert_int_equal(rc, CURLE_OK);

  const char *text = captured(cap);
  assert_non_null(strstr(text, "\"lib\":\"curl\""));
  assert_non_null(strstr(text, "\"kind\":\"header_out\""));
  assert_non_null(strstr(text, "\"kind\":\"header_in\""));
  assert_non_null(strstr(text, "Authorization: ***"));
  assert_non_null(strstr(text, "X-Trace: visible"));
  assert_null(strstr(text, "very-secret-value"));
  assert_null(strstr(text, "never-logged"));

  /* not attached when debug is off */
  capture_reset(cap);
  obx_log_set_level(OBX_LOG_INFO);
  curl = curl_easy_init();
  obx_log_curl_attach(curl, NULL);
  curl_easy_setopt(curl, CURLOPT_URL, "http://127.0.0.1:1/");
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
  curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  assert_string_equal(captured(cap), "");
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  mongoc_init();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_level_filter, capture_setup, capture_teardown),
    cmocka_unit_test_setup_teardown(test_line_shape_and_escaping, capture_setup, capture_teardown),
    cmocka_unit_test_setup_teardown(test_redaction, capture_setup, capture_teardown),
    cmocka_unit_test_setup_teardown(test_threads_whole_lines, capture_setup, capture_teardown),
    cmocka_unit_test_setup_teardown(test_mongoc_routing, capture_setup, capture_teardown),
    cmocka_unit_test_setup_teardown(test_kafka_routing, capture_setup, capture_teardown),
    cmocka_unit_test_setup_teardown(test_curl_routing, capture_setup, capture_teardown),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  mongoc_cleanup();
  curl_global_cleanup();
  return rc;
}
