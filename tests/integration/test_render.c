/* test_render.c - no operator tool or route crashes or answers an empty body on stored content
 * that is not valid UTF-8 or is very long
 *
 * One devmongod, `outboxd --roles api` (its RabbitMQ names under a private prefix, deleted at
 * the end) and the real outboxctl. Stored: an outbox event and an inbox entry whose id (300
 * bytes), partition key (10 KB), a key inside the payload and a string value hold bytes that
 * are not UTF-8; an order with such a field; a dead letter (in dead_letters, as the drain
 * stores it) with a non-UTF-8 ce_id header, a 10 KB non-UTF-8 key, a non-UTF-8 subject, reason
 * and body; a parked key. Every GET route and every outboxctl --json output over them must exit
 * 0 / answer 200 with one complete JSON value holding the long values whole, U+FFFD where the
 * bytes were invalid, and every date as an RFC 3339 string (never {"$date": ...}). */
#include "obx_test.h"
#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include "obx/obx_ctl.h"
#include "obx/obx_json.h"
#include "obx/obx_ladder.h"
#include "obx/obx_ops.h"
#include "obx/obx_event.h"

#define FFFD "\xef\xbf\xbd"
#define ORG "acme"

static obx_test_mongo_t mongo;
static mongoc_client_t *client;
static obx_test_outboxd_t outboxd;
static obx_ladder_t *ladder;
static char keys_path[300], key_all[64], prefix[64];
static char long_id[320], long_key[10300], dlq_id[260], dl_id[OBX_UUID_LEN + 1];
static const char *amqp_url;
static int64_t now_ms;  /* every stored date */
static char want_now[40]; /* now_ms as the JSON string every output must show */

/* A 300-byte id starting with two invalid bytes, a 10 KB key with one in the middle. */
static void make_values(void) {
  memset(long_id, 'i', 300);
  long_id[0] = (char)0xff;
  long_id[1] = (char)0xfe;
  long_id[300] = '\0';
  memset(long_key, 'k', 10240);
  long_key[5000] = (char)0xc3; /* a 2-byte sequence cut short */
  long_key[10240] = '\0';
  memset(dlq_id, 'd', 200);
  dlq_id[200] = '\0';
  obx_uuid7(dl_id);
  now_ms = obx_time_now_ms();
  char ts[32];
  obx_time_format_rfc3339(now_ms, ts);
  snprintf(want_now, sizeof want_now, "\"%s\"", ts);
}

static void insert_raw(const char *collection, const bson_t *doc) {
  bson_t *opts = BCON_NEW("validate", BCON_BOOL(false)); /* the driver would refuse the bad bytes */
  bson_error_t berr;
  mongoc_collection_t *c = mongoc_client_get_collection(client, "outboxd", collection);
  if (!mongoc_collection_insert_one(c, doc, opts, NULL, &berr)) fail_msg("insert %s: %s", collection, berr.message);
  mongoc_collection_destroy(c);
  bson_destroy(opts);
}

static void seed_mongo(void) {
  int64_t now = now_ms;
  bson_t doc = BSON_INITIALIZER, payload, headers;
  bson_append_utf8(&doc, "_id", -1, long_id, -1);
  BSON_APPEND_UTF8(&doc, "eventType", "OrderConfirmed");
  BSON_APPEND_INT32(&doc, "eventVersion", 1);
  BSON_APPEND_UTF8(&doc, "orgId", ORG);
  BSON_APPEND_UTF8(&doc, "aggregateType", "Order");
  bson_append_utf8(&doc, "aggregateId", -1, long_key, -1);
  bson_append_utf8(&doc, "partitionKey", -1, long_key, -1);
  BSON_APPEND_DOCUMENT_BEGIN(&doc, "payload", &payload);
  bson_append_utf8(&payload, "note\xff", -1, "caf\xe9", -1); /* Latin-1, not UTF-8 */
  bson_append_document_end(&doc, &payload);
  BSON_APPEND_DATE_TIME(&doc, "occurredAt", now);
  BSON_APPEND_UTF8(&doc, "status", "FAILED");
  BSON_APPEND_INT32(&doc, "attempts", 10);
  BSON_APPEND_DATE_TIME(&doc, "availableAt", now);
  bson_append_utf8(&doc, "lastError", -1, "broker said \xfe", -1);
  insert_raw("outbox", &doc);
  bson_reinit(&doc);

  BSON_APPEND_DOCUMENT_BEGIN(&doc, "_id", &payload);
  BSON_APPEND_UTF8(&payload, "consumer", "outboxd-worker");
  bson_append_utf8(&payload, "eventId", -1, long_id, -1);
  bson_append_document_end(&doc, &payload);
  BSON_APPEND_UTF8(&doc, "orgId", ORG);
  BSON_APPEND_UTF8(&doc, "eventType", "OrderConfirmed");
  BSON_APPEND_UTF8(&doc, "status", "DEAD");
  BSON_APPEND_INT32(&doc, "attempts", 5);
  bson_append_utf8(&doc, "partitionKey", -1, long_key, -1);
  BSON_APPEND_DOCUMENT_BEGIN(&doc, "headers", &headers);
  bson_append_utf8(&headers, "ce_\xffodd", -1, "v\xff", -1);
  bson_append_document_end(&doc, &headers);
  BSON_APPEND_DATE_TIME(&doc, "receivedAt", now);
  bson_append_utf8(&doc, "lastError", -1, "HTTP 400 \xc0", -1);
  insert_raw("inbox", &doc);
  bson_reinit(&doc);

  BSON_APPEND_UTF8(&doc, "_id", "order-render-1");
  BSON_APPEND_UTF8(&doc, "orgId", ORG);
  BSON_APPEND_UTF8(&doc, "orderNumber", "R-1");
  bson_append_utf8(&doc, "customerEmail", -1, "jos\xe9@company.com", -1);
  BSON_APPEND_UTF8(&doc, "status", "CONFIRMED");
  BSON_APPEND_DATE_TIME(&doc, "createdAt", now);
  insert_raw("orders", &doc);
  bson_reinit(&doc);

  BSON_APPEND_DOCUMENT_BEGIN(&doc, "_id", &payload); /* a key parked behind the DEAD entry */
  BSON_APPEND_UTF8(&payload, "consumer", "outboxd-worker");
  BSON_APPEND_UTF8(&payload, "key", "key-render-1");
  bson_append_document_end(&doc, &payload);
  bson_append_utf8(&doc, "headEventId", -1, long_id, -1);
  BSON_APPEND_UTF8(&doc, "reason", "HTTP 400");
  BSON_APPEND_DATE_TIME(&doc, "since", now);
  insert_raw("parked_keys", &doc);
  bson_destroy(&doc);
}

static void seed_dlq(void) {
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  obx_ce_header_t h[] = {{"ce_type", "OrderConfirmed", 14}, {"ce_orgid", ORG, 4}, {"ce_subject", "Order/\xff\xfe", 8},
                         {"ce_id", "ev-\xff\xfe" "-1", 7}};
  obx_envelope_from_record(&msg, dlq_id, long_key, strlen(long_key), "{\"a\": \"\xff\"}", 10, h, 4);
  obx_envelope_fail(&msg, "terminal", "HTTP 400 \xff", now_ms);
  msg.reason = strdup("terminal failure \xfe");
  /* the dead letter as the drain writes it (obx_ops_dl_from_msg), stored with the bad bytes */
  bson_t doc = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&doc, "_id", dl_id);
  obx_ops_dl_from_msg(&msg, &doc);
  insert_raw("dead_letters", &doc);
  bson_destroy(&doc);
  obx_envelope_cleanup(&msg);
}

static int group_setup(void **state) {
  amqp_url = getenv("AMQP_URL");
  if (!amqp_url || !*amqp_url) {
    fprintf(stderr, "test_render needs RabbitMQ: AMQP_URL is not set (scripts/test.sh starts it)\n");
    return getenv("OBX_TEST_STRICT") ? -1 : 0;
  }
  make_values();
  snprintf(prefix, sizeof prefix, "obx-render-%d", (int)getpid());
  if (obx_test_fixture_mongo_setup(&mongo, NULL, &client) != 0) return -1;
  snprintf(keys_path, sizeof keys_path, "%s/api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys_path, ORG, "*", key_all);
  obx_err_t err = OBX_ERR_INIT;
  obx_ladder_opts_t lo = {.url = amqp_url, .prefix = prefix};
  if (!(ladder = obx_ladder_new(&lo, &err)) || !obx_ladder_connect(ladder, &err)) {
    fprintf(stderr, "ladder: %s\n", err.msg);
    return -1;
  }
  if (!obx_test_outboxd_start_api(&outboxd, mongo.uri, keys_path, amqp_url, prefix)) return -1;
  return 0;
}

static int group_teardown(void **state) {
  int status = obx_test_outboxd_stop(&outboxd);
  if (ladder) {
    const char *queues[] = {obx_ladder_dlq_queue(ladder), obx_ladder_work_queue(ladder)};
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *sock = amqp_tcp_socket_new(conn);
    struct amqp_connection_info ci;
    char *url = strdup(amqp_url);
    if (amqp_parse_url(url, &ci) == AMQP_STATUS_OK && amqp_socket_open(sock, ci.host, ci.port) == AMQP_STATUS_OK &&
        amqp_login(conn, ci.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, ci.user, ci.password).reply_type ==
          AMQP_RESPONSE_NORMAL) {
      amqp_channel_open(conn, 1);
      for (size_t i = 0; i < sizeof queues / sizeof queues[0]; i++) amqp_queue_delete(conn, 1, amqp_cstring_bytes(queues[i]), 0, 0);
    }
    amqp_destroy_connection(conn);
    free(url);
    obx_ladder_destroy(ladder);
  }
  obx_test_fixture_mongo_teardown(&mongo, client);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- checks ------------------------------------------------------------------------------- */

/* text must be one complete JSON value (an object, or an array wrapped for the parser) that
 * holds every needle and no {"$date": ...}. */
static void expect_json(const char *what, const char *text, const char *const needles[]) {
  size_t len = strlen(text);
  while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
  if (!len) fail_msg("%s: empty output", what);
  const char *date = strstr(text, "$date");
  if (date) fail_msg("%s: got {\"$date\": ...} (%.80s), want RFC 3339 strings: %.300s...", what, date, text);
  char *wrapped = malloc(len + 16);
  int n = snprintf(wrapped, len + 16, "{\"v\": %.*s}", (int)len, text);
  bson_t doc;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_json_parse(wrapped, (size_t)n, &doc, &err))
    fail_msg("%s: not one complete JSON value (%s): %.300s...", what, err.msg, text);
  for (int i = 0; needles[i]; i++)
    if (!strstr(text, needles[i])) fail_msg("%s: lacks \"%.60s...\" (%zu bytes): %.300s...", what, needles[i], strlen(needles[i]), text);
  bson_destroy(&doc);
  free(wrapped);
}

static void expect_route(const char *path, const char *const needles[]) {
  obx_test_http_resp_t resp;
  assert_true(obx_test_http(outboxd.port, "GET", path, key_all, NULL, NULL, &resp));
  if (resp.status != 200) fail_msg("GET %s: got %ld %s, want 200", path, resp.status, resp.body);
  expect_json(path, resp.body, needles);
  obx_test_http_resp_cleanup(&resp);
}

/* Runs outboxctl with args (NULL-terminated) and the test's configuration; wants exit want. */
static char *ctl_exit(int want, const char *const args[]) {
  char out_path[320], mongo_arg[300], amqp_arg[300], prefix_arg[100];
  snprintf(out_path, sizeof out_path, "%s/outboxctl.out", obx_test_tmpdir());
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(amqp_arg, sizeof amqp_arg, "amqp.url=%s", amqp_url);
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=%s", prefix);
  const char *argv[32];
  int n = 0;
  argv[n++] = obx_test_build_path("outboxctl");
  for (int i = 0; args[i]; i++) argv[n++] = args[i];
  const char *conf[] = {"-X", mongo_arg, "-X", amqp_arg, "-X", prefix_arg};
  for (size_t i = 0; i < sizeof conf / sizeof conf[0]; i++) argv[n++] = conf[i];
  argv[n] = NULL;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(out_path, "w", stdout)) _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  FILE *f = fopen(out_path, "r");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  char *text = calloc(1, (size_t)size + 1);
  if (fread(text, 1, (size_t)size, f) != (size_t)size) fail_msg("reading %s", out_path);
  fclose(f);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != want)
    fail_msg("outboxctl %s %s: %s %d, want exit %d; output: %.300s", args[0], args[1],
             WIFSIGNALED(status) ? "killed by signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
             want, text);
  return text;
}

static char *ctl(const char *const args[]) { return ctl_exit(0, args); }

/* The JSON forms of the stored values: the long id with its two invalid bytes replaced, etc. */
static char want_id[340], want_key[10400], want_dlq_id[280];

static void make_wants(void) {
  snprintf(want_id, sizeof want_id, FFFD FFFD "%s", long_id + 2);
  memcpy(want_key, long_key, 5000);
  memcpy(want_key + 5000, FFFD, 3);
  memcpy(want_key + 5003, long_key + 5001, 10240 - 5001 + 1);
  snprintf(want_dlq_id, sizeof want_dlq_id, "%s", dlq_id);
}

static void test_routes_render_everything(void **state) {
  if (!amqp_url || !*amqp_url) skip();
  seed_mongo();
  seed_dlq();
  make_wants();
  const char *const outbox[] = {want_id, "broker said " FFFD, want_now, NULL};
  expect_route("/api/outbox", outbox);
  expect_route("/api/outbox?status=FAILED", outbox);
  const char *const inbox[] = {want_id, "HTTP 400 " FFFD, want_now, NULL};
  expect_route("/api/inbox", inbox);
  const char *const dlq[] = {want_dlq_id, want_key, want_now, NULL}; /* lists leave headers out */
  expect_route("/api/dlq", dlq);
  char path[80];
  snprintf(path, sizeof path, "/api/dlq/%s", dl_id);
  const char *const one[] = {want_key, "ev-" FFFD FFFD "-1", "Order/" FFFD FFFD, "terminal failure " FFFD, want_now, NULL};
  expect_route(path, one);
  expect_route("/api/dlq/export", one); /* one document per line: here, one line */
  const char *const order[] = {"jos" FFFD "@company.com", want_now, NULL};
  expect_route("/orders/order-render-1", order);
  const char *const keys[] = {"key-render-1", want_now, NULL};
  expect_route("/api/keys", keys);
  const char *const status[] = {"\"dlq\"", "dead letters waiting", want_now, NULL};
  expect_route("/api/status", status);
  const char *const audit[] = {"dlq.export", "\"when\" : \"", NULL}; /* the export above */
  expect_route("/api/audit", audit);
}

static void test_outboxctl_renders_everything(void **state) {
  if (!amqp_url || !*amqp_url) skip();
  char *out;
  const char *const outbox[] = {want_id, want_now, NULL};
  out = ctl((const char *[]){"outbox", "list", "--json", NULL});
  expect_json("outbox list --json", out, outbox);
  free(out);
  out = ctl((const char *[]){"outbox", "list", "FAILED", "--json", NULL});
  expect_json("outbox list FAILED --json", out, outbox);
  free(out);
  const char *const inbox[] = {want_id, want_now, NULL};
  out = ctl((const char *[]){"inbox", "list", "--json", NULL});
  expect_json("inbox list --json", out, inbox);
  free(out);
  const char *const inbox_show[] = {want_id, want_key, "ce_" FFFD "odd", NULL};
  out = ctl((const char *[]){"inbox", "show", long_id, NULL});
  expect_json("inbox show", out, inbox_show);
  free(out);
  const char *const dlq[] = {want_dlq_id, want_key, "terminal failure " FFFD, want_now, NULL};
  out = ctl((const char *[]){"dlq", "list", "--json", NULL});
  expect_json("dlq list --json", out, dlq);
  free(out);
  const char *const peek[] = {want_key, "ev-" FFFD FFFD "-1", "Order/" FFFD FFFD, "terminal failure " FFFD, NULL};
  out = ctl((const char *[]){"dlq", "peek", dl_id, NULL});
  expect_json("dlq peek", out, peek);
  free(out);
  out = ctl((const char *[]){"dlq", "export", NULL});
  expect_json("dlq export", out, peek);
  free(out);
  const char *const keys[] = {"key-render-1", want_now, NULL};
  out = ctl((const char *[]){"keys", "list", "--json", NULL});
  expect_json("keys list --json", out, keys);
  free(out);
  const char *const audit[] = {"dlq.export", "\"when\" : \"", NULL};
  out = ctl((const char *[]){"audit", "list", "--json", NULL});
  expect_json("audit list --json", out, audit);
  free(out);
  const char *const status[] = {"\"dlq\"", "dead letters waiting", want_now, NULL};
  out = ctl_exit(OBX_CTL_DEGRADED, (const char *[]){"status", "--json", NULL}); /* degraded: exit 3 */
  expect_json("status --json", out, status);
  free(out);
  const char *const counts[] = {"FAILED", NULL};
  out = ctl((const char *[]){"outbox", "counts", "--json", NULL});
  expect_json("outbox counts --json", out, counts);
  free(out);
  /* the table form prints the raw bytes and does not crash either */
  free(ctl((const char *[]){"dlq", "list", NULL}));
  free(ctl((const char *[]){"outbox", "list", NULL}));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_routes_render_everything),
    cmocka_unit_test(test_outboxctl_renders_everything),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
