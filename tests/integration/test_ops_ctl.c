/* test_ops_ctl.c - the CLI habits of the operators' tools (issue 12 item 7), against the real
 * outboxctl and `outboxd --roles api`
 *
 * One devmongod, RabbitMQ (AMQP_URL; queues under a private prefix, deleted at the end), six
 * dead letters of org acme stored as the drain stores them, and an API keys file with a named
 * key (fourth field "ops-alice") and a nameless one. Checked:
 *   - who: the API records the key's name (whoFrom "api key name"), a nameless key as
 *     apikey:<first 16 hex of its sha256> ("api key hash"); outboxctl records --who, else
 *     $OUTBOXCTL_WHO, $USER, $LOGNAME, else "unknown", and says on stderr when it is not --who
 *     (never for a dry run or a read);
 *   - exit codes: 0 done, 1 failed or not found, 2 usage (the message names the flag), 3 status
 *     degraded; quiet: a read prints nothing on stderr; mutating commands and status name the
 *     MongoDB database and the RabbitMQ vhost they act on, status --json too (its target);
 *   - connection errors name host:port: MongoDB and RabbitMQ each at a closed port;
 *   - cursor paging: --limit/--after walks every dead letter once;
 *   - status --watch prints again until interrupted. */
#include "obx_test.h"
#include "obx_test_doc.h"
#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

#include <amqp.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "obx/obx_auth.h"
#include "obx/obx_ctl.h"
#include "obx/obx_event.h"
#include "obx/obx_ladder.h"
#include "obx/obx_ops.h"

#define ORG "acme"
#define NDL 6

static obx_test_mongo_t mongo;
static mongoc_client_t *client;
static obx_test_outboxd_t outboxd;
static const char *amqp_url;
static char keys_path[300], key_named[64], key_nameless[64], hash_nameless[OBX_AUTH_HASH_LEN + 1], prefix[64];
static char dl_ids[NDL][OBX_UUID_LEN + 1];

static void seed_dead_letters(void) {
  for (int i = 0; i < NDL; i++) {
    obx_envelope_t msg;
    char ev[64];
    snprintf(ev, sizeof ev, "ev-ctl-%d", i);
    obx_envelope_init(&msg);
    obx_ce_header_t h[] = {{"ce_type", "OrderConfirmed", 14}, {"ce_orgid", ORG, 4}, {"ce_id", ev, strlen(ev)}};
    obx_envelope_from_record(&msg, ev, "key-ctl", 7, "{}", 2, h, 3);
    obx_envelope_fail(&msg, "terminal", "HTTP 400", obx_time_now_ms() - i);
    bson_t doc = BSON_INITIALIZER;
    obx_uuid7(dl_ids[i]);
    BSON_APPEND_UTF8(&doc, "_id", dl_ids[i]);
    obx_ops_dl_from_msg(&msg, &doc);
    mongoc_collection_t *c = mongoc_client_get_collection(client, "outboxd", "dead_letters");
    bson_error_t berr;
    if (!mongoc_collection_insert_one(c, &doc, NULL, NULL, &berr)) fail_msg("insert dead letter: %s", berr.message);
    mongoc_collection_destroy(c);
    bson_destroy(&doc);
    obx_envelope_cleanup(&msg);
  }
}

static int group_setup(void **state) {
  (void)state;
  amqp_url = getenv("AMQP_URL");
  if (!amqp_url || !*amqp_url) {
    fprintf(stderr, "test_ops_ctl needs RabbitMQ: AMQP_URL is not set (scripts/test.sh starts it)\n");
    return getenv("OBX_TEST_STRICT") ? -1 : 0;
  }
  snprintf(prefix, sizeof prefix, "obx-ctl-%d", (int)getpid());
  if (obx_test_fixture_mongo_setup(&mongo, NULL, &client) != 0) return -1;
  snprintf(keys_path, sizeof keys_path, "%s/api-keys", obx_test_tmpdir());
  char hash[OBX_AUTH_HASH_LEN + 1], line[200];
  if (!obx_auth_key_generate(key_named, NULL)) return -1;
  obx_auth_hash(key_named, hash);
  snprintf(line, sizeof line, "%s %s * ops-alice\n", hash, ORG);
  obx_test_write_file(keys_path, line);
  obx_test_apikey_add(keys_path, ORG, "*", key_nameless);
  obx_auth_hash(key_nameless, hash_nameless);
  if (!obx_test_outboxd_start_api(&outboxd, mongo.uri, keys_path, amqp_url, prefix)) return -1;
  seed_dead_letters();
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  int status = obx_test_outboxd_stop(&outboxd);
  if (amqp_url && *amqp_url) { /* the queues outboxd and outboxctl declared under prefix */
    obx_err_t err = OBX_ERR_INIT;
    obx_ladder_opts_t lo = {.url = amqp_url, .prefix = prefix};
    obx_ladder_t *ladder = obx_ladder_new(&lo, &err);
    if (ladder) wt_delete_topology(ladder, prefix);
    obx_ladder_destroy(ladder);
  }
  obx_test_fixture_mongo_teardown(&mongo, client);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- running outboxctl -------------------------------------------------------------------- */

typedef struct {
  int rc; /* exit code, -1 when killed */
  char *out, *err;
} ctl_run_t;

static void ctl_run_cleanup(ctl_run_t *r) {
  free(r->out);
  free(r->err);
}

static char *slurp(const char *path) {
  char *text = obx_test_read_file(path);
  return text ? text : calloc(1, 1);
}

/* Runs outboxctl with args (NULL-terminated: the command words, then options) and this test's
 * configuration, given right after the command words so that a -X of args wins (the later
 * one), in an environment of exactly env (NULL-terminated "NAME=value"). */
static void ctl_env(const char *const env[], const char *const args[], ctl_run_t *r) {
  char out_path[320], err_path[320], mongo_arg[300], amqp_arg[300], prefix_arg[100];
  snprintf(out_path, sizeof out_path, "%s/ctl.out", obx_test_tmpdir());
  snprintf(err_path, sizeof err_path, "%s/ctl.err", obx_test_tmpdir());
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(amqp_arg, sizeof amqp_arg, "amqp.url=%s", amqp_url);
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=%s", prefix);
  const char *conf[] = {"-X", mongo_arg, "-X", amqp_arg, "-X", prefix_arg};
  const char *argv[40];
  int n = 0, a = 0;
  argv[n++] = obx_test_build_path("outboxctl");
  for (; args[a] && a < 2 && args[a][0] != '-'; a++) argv[n++] = args[a];
  for (size_t i = 0; i < sizeof conf / sizeof conf[0]; i++) argv[n++] = conf[i];
  for (; args[a]; a++) argv[n++] = args[a];
  argv[n] = NULL;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(out_path, "w", stdout) || !freopen(err_path, "w", stderr)) _exit(126);
    execve(argv[0], (char *const *)argv, (char *const *)env);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r->out = slurp(out_path);
  r->err = slurp(err_path);
}

static const char *const env_user[] = {"USER=dave", "LOGNAME=dave", NULL};

static void ctl(const char *const args[], ctl_run_t *r) { ctl_env(env_user, args, r); }

/* The audit_log entry of action on target: who and whoFrom copied out; false when none. */
static bool audit_who(const char *action, const char *target, char who[128], char from[64]) {
  bson_t *filter = BCON_NEW("action", BCON_UTF8(action), "target", BCON_UTF8(target));
  mongoc_collection_t *c = mongoc_client_get_collection(client, "outboxd", "audit_log");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(c, filter, NULL, NULL);
  const bson_t *doc;
  bool found = mongoc_cursor_next(cursor, &doc);
  if (found) {
    snprintf(who, 128, "%s", obx_test_doc_str(doc, "who") ? obx_test_doc_str(doc, "who") : "(none)");
    snprintf(from, 64, "%s", obx_test_doc_str(doc, "whoFrom") ? obx_test_doc_str(doc, "whoFrom") : "(none)");
  }
  mongoc_cursor_destroy(cursor);
  mongoc_collection_destroy(c);
  bson_destroy(filter);
  return found;
}

static void expect_audit(const char *action, const char *target, const char *want_who, const char *want_from) {
  char who[128], from[64];
  if (!audit_who(action, target, who, from)) fail_msg("no audit_log entry %s %s", action, target);
  if (strcmp(who, want_who) != 0 || strcmp(from, want_from) != 0)
    fail_msg("%s %s: got who \"%s\" whoFrom \"%s\", want \"%s\" \"%s\"", action, target, who, from, want_who, want_from);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* --limit/--after walks the dead letters newest first, each once; the last page has no next. */
static void test_cursor_paging(void **state) {
  (void)state;
  if (!amqp_url || !*amqp_url) skip();
  char after[200] = "";
  int seen[NDL] = {0}, pages = 0;
  for (;;) {
    ctl_run_t r;
    ctl((const char *[]){"dlq", "list", "--limit", "4", "--json", *after ? "--after" : NULL, after, NULL}, &r);
    bson_error_t berr;
    bson_t *doc = bson_new_from_json((const uint8_t *)r.out, -1, &berr);
    if (r.rc != 0 || !doc) fail_msg("dlq list --limit 4: exit %d, not JSON (%s): %s %s", r.rc, doc ? "" : berr.message, r.out, r.err);
    for (int i = 0; i < NDL; i++) seen[i] += strstr(r.out, dl_ids[i]) != NULL;
    const char *next = obx_test_doc_str(doc, "next");
    snprintf(after, sizeof after, "%s", next ? next : "");
    pages++;
    bson_destroy(doc);
    ctl_run_cleanup(&r);
    if (!*after) break;
    if (pages > NDL) fail_msg("dlq list --limit 4: more than %d pages", NDL);
  }
  assert_int_equal(pages, 2);
  for (int i = 0; i < NDL; i++)
    if (seen[i] != 1) fail_msg("dead letter %d listed %d times over the pages, want once", i, seen[i]);
}

/* Exit codes (README "Exit codes"), quiet reads, usage messages naming the flag, the target. */
static void test_exit_codes(void **state) {
  (void)state;
  if (!amqp_url || !*amqp_url) skip();
  static const struct {
    const char *args[8];
    int want;
    const char *out, *err; /* substrings wanted on stdout / stderr; err "" wants stderr empty */
  } cases[] = {
    {{"dlq", "list", NULL}, 0, "OrderConfirmed", ""},
    {{"dlq", "list", "--json", NULL}, 0, "\"count\" : 6", ""},
    {{"audit", "list", NULL}, 0, "WHEN", ""},
    {{"dlq", "list", "--bogus", NULL}, 2, NULL, "unknown option '--bogus'"},
    {{"dlq", "list", "--limit", "0", NULL}, 2, NULL, "--limit wants a number"},
    {{"dlq", "list", "--since", "yesterday", NULL}, 2, NULL, "--since 'yesterday'"},
    {{"dlq", "list", "extra", NULL}, 2, NULL, "dlq list: takes no arguments"},
    {{"audit", "list", "--id", "a", "--id", "b", NULL}, 2, NULL, "audit list: takes at most one --id"},
    {{"dlq", "peek", NULL}, 2, NULL, "dlq peek: wants one dead-letter id"},
    {{"dlq", "nosuch", NULL}, 2, NULL, "unknown subcommand 'nosuch'"},
    {{"dlq", "peek", "no-such-dead-letter", NULL}, 1, NULL, "no-such-dead-letter"},
    {{"dlq", "redrive", "--id", "no-such-dead-letter", NULL}, 1, NULL, "no-such-dead-letter"},
    {{"dlq", "delete", "--id", "no-such-dead-letter", NULL}, 1, NULL, "no-such-dead-letter"},
    {{"dlq", "delete", "--all", "--dry-run", NULL}, 0, "MongoDB outboxd at 127.0.0.1:", ""},
    {{"status", NULL}, 3, "RabbitMQ vhost ", ""},
    {{"status", "--json", NULL}, 3, "dead letters waiting", ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ctl_run_t r;
    ctl(cases[i].args, &r);
    bool ok = r.rc == cases[i].want && (!cases[i].out || strstr(r.out, cases[i].out)) &&
              (!cases[i].err || (*cases[i].err ? strstr(r.err, cases[i].err) != NULL : !*r.err));
    if (!ok)
      fail_msg("outboxctl %s %s %s: exit %d, want %d; stdout (want \"%s\"): %.400s\nstderr (want \"%s\"): %.400s",
               cases[i].args[0], cases[i].args[1] ? cases[i].args[1] : "", cases[i].args[1] && cases[i].args[2] ? cases[i].args[2] : "",
               r.rc, cases[i].want, cases[i].out ? cases[i].out : "", r.out, cases[i].err ? cases[i].err : "(any)", r.err);
    ctl_run_cleanup(&r);
  }
  /* status --json names the database and the vhost of the text form: AMQP_URL's, decoded */
  char url[300], want_vhost[128] = "?";
  struct amqp_connection_info info;
  snprintf(url, sizeof url, "%s", amqp_url);
  if (amqp_parse_url(url, &info) == AMQP_STATUS_OK) snprintf(want_vhost, sizeof want_vhost, "%s", info.vhost);
  ctl_run_t text, json;
  ctl((const char *[]){"status", NULL}, &text);
  ctl((const char *[]){"status", "--json", NULL}, &json);
  bson_error_t berr;
  bson_t *doc = bson_new_from_json((const uint8_t *)json.out, -1, &berr);
  if (!doc) fail_msg("status --json: not JSON (%s): %.400s", berr.message, json.out);
  const char *db = obx_test_doc_str(doc, "target.mongodb.database");
  const char *vhost = obx_test_doc_str(doc, "target.rabbitmq.vhost");
  const char *host = obx_test_doc_str(doc, "target.rabbitmq.host");
  const char *mhosts = obx_test_doc_str(doc, "target.mongodb.hosts");
  char text_form[400];
  snprintf(text_form, sizeof text_form, "MongoDB %s at %s, RabbitMQ vhost %s at %s ", db ? db : "?", mhosts ? mhosts : "?",
           vhost ? vhost : "?", host ? host : "?");
  if (!db || strcmp(db, "outboxd") != 0 || !vhost || strcmp(vhost, want_vhost) != 0 || !strstr(text.out, text_form))
    fail_msg("status --json: target database %s vhost %s (want outboxd, %s), as text \"%s\" not in the text form: %.400s\n%.600s",
             db ? db : "(none)", vhost ? vhost : "(none)", want_vhost, text_form, text.out, json.out);
  bson_destroy(doc);
  ctl_run_cleanup(&json);
  ctl_run_cleanup(&text);
}

/* A closed port on 127.0.0.1 (bound, then closed: nothing listens there). */
static int closed_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  assert_true(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
  close(fd);
  return ntohs(sa.sin_port);
}

/* MongoDB and RabbitMQ unreachable: exit 1 and the message names the host and port tried. */
static void test_connection_errors_name_host_port(void **state) {
  (void)state;
  if (!amqp_url || !*amqp_url) skip();
  int port = closed_port();
  char uri[200], want[64];
  snprintf(uri, sizeof uri, "mongo.uri=mongodb://127.0.0.1:%d/?serverSelectionTimeoutMS=500", port);
  snprintf(want, sizeof want, "127.0.0.1:%d", port);
  ctl_run_t r;
  ctl((const char *[]){"dlq", "list", "-X", uri, NULL}, &r);
  if (r.rc != 1 || !strstr(r.err, want) || !strstr(r.err, "MongoDB"))
    fail_msg("dlq list against a closed MongoDB port: exit %d, want 1 naming MongoDB at %s: %s", r.rc, want, r.err);
  ctl_run_cleanup(&r);

  snprintf(uri, sizeof uri, "amqp.url=amqp://guest:guest@127.0.0.1:%d/%%2F", port);
  ctl((const char *[]){"dlq", "redrive", "--id", dl_ids[NDL - 1], "--who", "ops", "-X", uri, NULL}, &r);
  if (r.rc != 1 || !strstr(r.err, want) || !strstr(r.err, "RabbitMQ"))
    fail_msg("dlq redrive against a closed RabbitMQ port: exit %d, want 1 naming RabbitMQ at %s: %s", r.rc, want, r.err);
  ctl_run_cleanup(&r);
  /* nothing was marked: the dead letter is still there, dead */
  ctl((const char *[]){"dlq", "peek", dl_ids[NDL - 1], NULL}, &r);
  if (r.rc != 0 || !strstr(r.out, "\"state\" : \"dead\"")) fail_msg("after the failed redrive: %s %s", r.out, r.err);
  ctl_run_cleanup(&r);
}

/* The API records the key's name, or apikey:<hash prefix> for a key without one. */
static void test_who_http(void **state) {
  (void)state;
  if (!amqp_url || !*amqp_url) skip();
  char body[300], want[64];
  const char *keys[] = {key_named, key_nameless};
  for (int i = 0; i < 2; i++) {
    snprintf(body, sizeof body, "{\"ids\": [\"%s\"]}", dl_ids[i]);
    obx_test_http_resp_t resp;
    obx_test_http_expect(outboxd.port, "POST", "/api/dlq/delete", keys[i], body, 200, &resp);
    obx_test_http_resp_cleanup(&resp);
  }
  expect_audit("dlq.delete", dl_ids[0], "ops-alice", "api key name");
  snprintf(want, sizeof want, "apikey:%.16s", hash_nameless);
  expect_audit("dlq.delete", dl_ids[1], want, "api key hash");
  /* the audit route shows it too, dates as RFC 3339 */
  obx_test_http_resp_t resp;
  obx_test_http_expect(outboxd.port, "GET", "/api/audit?action=dlq.delete", key_named, NULL, 200, &resp);
  if (!strstr(resp.body, "\"who\" : \"ops-alice\"") || strstr(resp.body, "$date"))
    fail_msg("GET /api/audit: want who ops-alice and no $date: %s", resp.body);
  obx_test_http_resp_cleanup(&resp);
}

/* outboxctl: --who, else $OUTBOXCTL_WHO, $USER, $LOGNAME, else "unknown"; a fallback is said. */
static void test_who_cli(void **state) {
  (void)state;
  if (!amqp_url || !*amqp_url) skip();
  static const struct {
    const char *env[4];
    const char *who; /* --who, or NULL */
    const char *want_who, *want_from, *note; /* note: wanted on stderr, NULL: stderr empty */
  } cases[] = {
    {{"USER=dave", "LOGNAME=dave", NULL}, "carol", "carol", "--who", NULL},
    {{"OUTBOXCTL_WHO=erin", "USER=dave", NULL}, NULL, "erin", "$OUTBOXCTL_WHO",
     "recording the operator as \"erin\" (from $OUTBOXCTL_WHO; --who NAME sets it)"},
    {{"LOGNAME=bob", NULL}, NULL, "bob", "$LOGNAME", "recording the operator as \"bob\" (from $LOGNAME"},
    {{NULL}, NULL, "unknown", "none", "recording the operator as \"unknown\" (no --who, $OUTBOXCTL_WHO, $USER or $LOGNAME)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *id = dl_ids[2 + i];
    ctl_run_t r;
    /* a dry run records nobody and says nothing */
    ctl_env(cases[i].env, (const char *[]){"dlq", "delete", "--id", id, "--dry-run", NULL}, &r);
    if (r.rc != 0 || *r.err) fail_msg("case %zu: dlq delete --dry-run: exit %d, stderr %s (want 0, nothing)", i, r.rc, r.err);
    ctl_run_cleanup(&r);
    if (cases[i].who) ctl_env(cases[i].env, (const char *[]){"dlq", "delete", "--id", id, "--who", cases[i].who, NULL}, &r);
    else ctl_env(cases[i].env, (const char *[]){"dlq", "delete", "--id", id, NULL}, &r);
    if (r.rc != 0 || (cases[i].note ? !strstr(r.err, cases[i].note) : *r.err != '\0'))
      fail_msg("case %zu: dlq delete: exit %d, stderr \"%s\", want 0 and \"%s\"", i, r.rc, r.err, cases[i].note ? cases[i].note : "");
    ctl_run_cleanup(&r);
    expect_audit("dlq.delete", id, cases[i].want_who, cases[i].want_from);
  }
}

/* status --watch prints the status again every 2 s until interrupted. */
static bool printed_twice(void *path) {
  char *text = obx_test_read_file(path);
  const char *first = text ? strstr(text, "degraded ") : NULL;
  bool twice = first && strstr(first + 1, "degraded ");
  free(text);
  return twice;
}

static void test_status_watch(void **state) {
  (void)state;
  if (!amqp_url || !*amqp_url) skip();
  char mongo_arg[300], amqp_arg[300], prefix_arg[100];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo.uri);
  snprintf(amqp_arg, sizeof amqp_arg, "amqp.url=%s", amqp_url);
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=%s", prefix);
  char *argv[] = {(char *)obx_test_build_path("outboxctl"), "status", "--watch", "-X", mongo_arg, "-X", amqp_arg,
                  "-X", prefix_arg, NULL};
  obx_test_proc_t proc;
  assert_true(obx_test_spawn(&proc, argv, NULL));
  bool twice = obx_test_wait_for(printed_twice, proc.log_path, 30000, 100);
  obx_test_proc_stop(&proc, SIGINT, 10000);
  if (!twice) fail_msg("status --watch did not print twice in 30 s: %s", proc.log_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_cursor_paging),
    cmocka_unit_test(test_exit_codes),
    cmocka_unit_test(test_connection_errors_name_host_port),
    cmocka_unit_test(test_who_http),
    cmocka_unit_test(test_who_cli),
    cmocka_unit_test(test_status_watch),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
