/* test_worker_ops.c - outboxctl dlq / inbox / keys against a running worker
 *
 * DESIGN: the worker runs in process (worker_test.h fixture); the operator commands are the
 * real outboxctl binary pointed at the same devmongod, RabbitMQ prefix and consumer group.
 * Each action must leave its audit_log entry with the operator's name. */
#include <errno.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx_test_doc.h"
#include "worker_test.h"

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

static void ctl_ok(wt_fx_t *fx, char *out, size_t outlen, const char *cmd) {
  int rc = wt_ctl(fx, out, outlen, cmd);
  if (rc != 0) fail_msg("outboxctl %s: exit %d, want 0; output:\n%s", cmd, rc, out);
}

static void want_in(const char *out, const char *needle, const char *cmd) {
  if (!strstr(out, needle)) fail_msg("outboxctl %s: output lacks \"%s\":\n%s", cmd, needle, out);
}

static int64_t audit_by(wt_fx_t *fx, const char *action, const char *who) {
  bson_t filter = BSON_INITIALIZER;
  BSON_APPEND_UTF8(&filter, "action", action);
  BSON_APPEND_UTF8(&filter, "who", who);
  int64_t n = wt_count(fx, "audit_log", &filter);
  bson_destroy(&filter);
  return n;
}

/* Every entry of action by the tester has the one audit_log shape
 * {_id, who, when, action, target, orgId, details}, with orgId org (NULL: null). */
static void want_audit_shape(wt_fx_t *fx, const char *action, const char *org) {
  bson_t *filter = BCON_NEW("action", BCON_UTF8(action), "who", BCON_UTF8("wt-tester"), "_id", "{", "$type",
                            BCON_UTF8("string"), "}", "when", "{", "$type", BCON_UTF8("date"), "}", "target", "{",
                            "$type", BCON_UTF8("string"), "}", "details", "{", "$type", BCON_UTF8("object"), "}");
  if (org) BSON_APPEND_UTF8(filter, "orgId", org);
  else BCON_APPEND(filter, "orgId", "{", "$type", BCON_UTF8("null"), "}");
  int64_t shaped = wt_count(fx, "audit_log", filter), all = audit_by(fx, action, "wt-tester");
  bson_destroy(filter);
  if (all == 0 || shaped != all)
    fail_msg("audit_log %s: got %lld of %lld entries with the shape {_id, who, when, action, target, orgId: %s, "
             "details}, want all (and at least one)", action, (long long)shaped, (long long)all, org ? org : "null");
}

/* The worker with its drain: parking-lot messages land in dead_letters. */
static void start_worker_draining(wt_fx_t *fx) {
  wt_conf_set(fx, "worker.dlq_drain", "true");
  wt_start_worker(fx);
}

static int64_t dl_count(wt_fx_t *fx, const char *field, const char *value) {
  bson_t filter = BSON_INITIALIZER;
  if (field) BSON_APPEND_UTF8(&filter, field, value);
  int64_t n = wt_count(fx, "dead_letters", &filter);
  bson_destroy(&filter);
  return n;
}

static void wait_dl_count(wt_fx_t *fx, const char *field, const char *value, int64_t want) {
  int64_t deadline = obx_test_now_ms() + 2 * WT_WAIT_MS;
  while (dl_count(fx, field, value) != want && obx_test_now_ms() < deadline) usleep(20000);
  int64_t got = dl_count(fx, field, value);
  if (got != want) fail_msg("dead_letters %s=%s: got %lld, want %lld", field ? field : "*", value ? value : "*",
                            (long long)got, (long long)want);
}

/* The id of the newest dead letter of an event into id. */
static void dl_id_of(wt_fx_t *fx, const char *event_id, char id[64]) {
  bson_t *filter = BCON_NEW("eventId", BCON_UTF8(event_id));
  bson_t *opts = BCON_NEW("sort", "{", "redriveCount", BCON_INT32(-1), "}", "limit", BCON_INT64(1));
  mongoc_collection_t *c = mongoc_client_get_collection(fx->client, obx_mongo_db_name(fx->mongo), "dead_letters");
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, filter, opts, NULL);
  const bson_t *doc;
  if (!mongoc_cursor_next(cur, &doc)) fail_msg("no dead letter of event %s", event_id);
  snprintf(id, 64, "%s", obx_mongo_doc_str(doc, "_id"));
  mongoc_cursor_destroy(cur);
  mongoc_collection_destroy(c);
  bson_destroy(opts);
  bson_destroy(filter);
}

static const char *dl_state(wt_fx_t *fx, const char *id, bson_t *doc) {
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id));
  if (!obx_test_find_one(fx->client, obx_mongo_db_name(fx->mongo), "dead_letters", filter, doc))
    fail_msg("no dead letter %s", id);
  bson_destroy(filter);
  return obx_mongo_doc_str(doc, "state");
}

static void test_dead_letter_store(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  start_worker_draining(fx);
  obx_event_t bad, worse;
  wt_event(&bad, "OrderConfirmed", "K-1", "Q-1");
  wt_event(&worse, "OrderConfirmed", "K-2", "Q-2");
  wt_route(fx, "Q-1", 400);
  wt_route(fx, "Q-2", 400);
  wt_produce(fx, &bad);
  wt_produce(fx, &worse);
  wt_wait_status(fx, bad.id, "DEAD");
  wt_wait_status(fx, worse.id, "DEAD");
  /* drained: the store holds both, the queue none */
  wait_dl_count(fx, "state", "dead", 2);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 0);
  char dl1[64], dl2[64];
  dl_id_of(fx, bad.id, dl1);
  dl_id_of(fx, worse.id, dl2);

  char out[32768], cmd[512];
  ctl_ok(fx, out, sizeof out, "dlq list");
  want_in(out, bad.id, "dlq list");
  want_in(out, dl1, "dlq list");
  want_in(out, "terminal failure", "dlq list");
  if (strstr(out, "{\"ts\"")) fail_msg("dlq list logged: %s", out); /* quiet by default */
  ctl_ok(fx, out, sizeof out, "dlq list --json --class terminal --reason http.400");
  want_in(out, "\"count\" : 0", "dlq list --reason http.400 (literal text, not a pattern)");
  ctl_ok(fx, out, sizeof out, "dlq list --json --class terminal --reason HTTP");
  want_in(out, "\"count\" : 2", "dlq list --reason HTTP");
  want_in(out, "\"next\" : null", "dlq list --json");
  ctl_ok(fx, out, sizeof out, "dlq list --json --type InvoiceIssued");
  want_in(out, "\"count\" : 0", "dlq list --type InvoiceIssued");
  snprintf(cmd, sizeof cmd, "dlq list --json --key K-2 --org %s", WT_ORG);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, worse.id, cmd);
  if (strstr(out, bad.id)) fail_msg("%s lists K-1's %s: %s", cmd, bad.id, out);
  /* paging: one per page, the cursor leads to the other */
  ctl_ok(fx, out, sizeof out, "dlq list --json --limit 1");
  char *next = strstr(out, "\"next\" : \"");
  if (!next) fail_msg("dlq list --limit 1: no next cursor: %s", out);
  char cursor[128];
  sscanf(next + 10, "%127[^\"]", cursor);
  bool first_is_2 = strstr(out, dl2) != NULL;
  snprintf(cmd, sizeof cmd, "dlq list --json --limit 1 --after %s", cursor);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, first_is_2 ? dl1 : dl2, cmd);
  want_in(out, "\"next\" : null", cmd);

  snprintf(cmd, sizeof cmd, "dlq peek %s", dl1);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "HTTP 400", cmd);
  want_in(out, "Q-1", cmd); /* the payload */
  want_in(out, "\"history\" : [", cmd);
  assert_int_equal(wt_ctl(fx, out, sizeof out, "dlq peek 0190f0e0-0000-7000-8000-0000000000ff"), 1);
  assert_int_equal(wt_ctl(fx, out, sizeof out, "dlq redrive"), 2);
  assert_int_equal(wt_ctl(fx, out, sizeof out, "dlq redrive --id 0190f0e0-0000-7000-8000-0000000000ff"), 1);
  want_in(out, "no dead letter 0190f0e0-0000-7000-8000-0000000000ff", "redrive of an unknown id");

  wt_route(fx, "Q-1", 200);
  snprintf(cmd, sizeof cmd, "dlq redrive --id %s --dry-run", dl1);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "1 dead letter would be redriven", cmd);
  bson_t doc = BSON_INITIALIZER;
  assert_string_equal(dl_state(fx, dl1, &doc), "dead");
  bson_destroy(&doc);
  /* --id twice is one id */
  snprintf(cmd, sizeof cmd, "dlq redrive --id %s --id %s", dl1, dl1);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "1 dead letter redriven", cmd);
  wt_wait_status(fx, bad.id, "DONE");
  assert_int_equal(wt_erp_calls(fx, "Q-1"), 2); /* one run per redriven message */
  doc = (bson_t)BSON_INITIALIZER;
  assert_string_equal(dl_state(fx, dl1, &doc), "redriven");
  if (!obx_mongo_doc_str(&doc, "redriveId")) fail_msg("redriven dead letter without its redrive id");
  bson_destroy(&doc);
  /* a second redrive of the same id finds nothing to do */
  snprintf(cmd, sizeof cmd, "dlq redrive --id %s --json", dl1);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "\"count\" : 0", cmd);

  snprintf(cmd, sizeof cmd, "dlq export --id %s", dl2);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, worse.id, cmd);
  ctl_ok(fx, out, sizeof out, "dlq purge --yes --dry-run");
  want_in(out, "2 dead letters would be deleted (dry run)", "purge --dry-run");
  assert_int_equal(dl_count(fx, NULL, NULL), 2);
  assert_int_equal(wt_ctl(fx, out, sizeof out, "dlq purge"), 2); /* needs --yes */
  snprintf(cmd, sizeof cmd, "dlq delete --id %s", dl2);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "1 dead letter deleted", cmd);
  assert_int_equal(dl_count(fx, NULL, NULL), 1);
  ctl_ok(fx, out, sizeof out, "dlq purge --yes --state redriven");
  want_in(out, "1 dead letter deleted", "purge --state redriven");
  assert_int_equal(dl_count(fx, NULL, NULL), 0);
  assert_int_equal(audit_by(fx, "dlq.redrive", "wt-tester"), 1); /* dry runs leave nothing */
  assert_int_equal(audit_by(fx, "dlq.delete", "wt-tester"), 2);
  assert_int_equal(audit_by(fx, "dlq.export", "wt-tester"), 1);
  bson_t *filter = BCON_NEW("action", BCON_UTF8("dlq.delete"), "details.ids", BCON_UTF8(dl2));
  assert_int_equal(wt_count(fx, "audit_log", filter), 1);
  bson_destroy(filter);
  want_audit_shape(fx, "dlq.redrive", NULL);
  want_audit_shape(fx, "dlq.delete", NULL);
  obx_event_cleanup(&bad);
  obx_event_cleanup(&worse);
}

#define NLOOP 300

static bool queues_idle(wt_fx_t *fx) {
  uint32_t work = 0, dlq = 0;
  obx_err_t err = OBX_ERR_INIT;
  return obx_ladder_queue_depth(fx->ladder, obx_ladder_work_queue(fx->ladder), &work, &err) &&
         obx_ladder_queue_depth(fx->ladder, obx_ladder_dlq_queue(fx->ladder), &dlq, &err) && work == 0 && dlq == 0;
}

/* 300 dead letters whose cause is still broken: redrive all runs each exactly once (300 ERP
 * calls, 300 new dead letters with redriveCount 1) and never picks up its own re-failures;
 * redriving one id runs exactly one. */
static void test_redrive_exactly_once(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  fx->attempts = 1;
  start_worker_draining(fx);
  for (int i = 0; i < NLOOP; i++) { /* no ERP route: 404, a terminal failure */
    obx_event_t ev;
    char num[32];
    snprintf(num, sizeof num, "L-%03d", i);
    wt_event(&ev, "OrderConfirmed", num, num);
    wt_produce(fx, &ev);
    obx_event_cleanup(&ev);
  }
  wait_dl_count(fx, "state", "dead", NLOOP);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (!queues_idle(fx) && obx_test_now_ms() < deadline) usleep(20000);
  int calls0 = obx_test_httpd_total(fx->httpd);
  int64_t runs0 = wt_count(fx, "pipeline_executions", &(bson_t)BSON_INITIALIZER);
  assert_int_equal(calls0, NLOOP);

  char out[1 << 16];
  int64_t t0 = obx_test_now_ms();
  ctl_ok(fx, out, sizeof out, "dlq redrive --all");
  int64_t took = obx_test_now_ms() - t0;
  want_in(out, "300 dead letters redriven", "dlq redrive --all");
  wait_dl_count(fx, NULL, NULL, 2 * NLOOP);
  deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (!queues_idle(fx) && obx_test_now_ms() < deadline) usleep(20000);
  bson_t *again = BCON_NEW("redriveCount", BCON_INT32(1), "state", BCON_UTF8("dead"));
  int64_t refailed = wt_count(fx, "dead_letters", again);
  bson_destroy(again);
  int calls = obx_test_httpd_total(fx->httpd);
  int64_t runs = wt_count(fx, "pipeline_executions", &(bson_t)BSON_INITIALIZER);
  printf("redrive --all of %d: %lld ms; ERP calls %d -> %d, executions %lld -> %lld, new dead letters %lld\n", NLOOP,
         (long long)took, calls0, calls, (long long)runs0, (long long)runs, (long long)refailed);
  assert_int_equal(calls - calls0, NLOOP);
  assert_int_equal(runs - runs0, NLOOP);
  assert_int_equal(refailed, NLOOP);
  assert_int_equal(dl_count(fx, "state", "redriven"), NLOOP);
  assert_int_equal(dl_count(fx, NULL, NULL), 2 * NLOOP);

  /* one id: exactly one run, one new dead letter (redriveCount 2) */
  char cmd[256];
  bson_t *one_q = BCON_NEW("redriveCount", BCON_INT32(1), "state", BCON_UTF8("dead"));
  bson_t one = BSON_INITIALIZER;
  if (!obx_test_find_one(fx->client, obx_mongo_db_name(fx->mongo), "dead_letters", one_q, &one))
    fail_msg("no re-failed dead letter");
  snprintf(cmd, sizeof cmd, "dlq redrive --id %s", obx_mongo_doc_str(&one, "_id"));
  bson_destroy(&one);
  bson_destroy(one_q);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "1 dead letter redriven", cmd);
  wait_dl_count(fx, NULL, NULL, 2 * NLOOP + 1);
  deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (!queues_idle(fx) && obx_test_now_ms() < deadline) usleep(20000);
  assert_int_equal(obx_test_httpd_total(fx->httpd) - calls, 1);
  assert_int_equal(dl_count(fx, NULL, NULL), 2 * NLOOP + 1);
  bson_t *twice = BCON_NEW("redriveCount", BCON_INT32(2));
  assert_int_equal(wt_count(fx, "dead_letters", twice), 1);
  bson_destroy(twice);
}

/* Runs outboxctl with the words of cmd and the fixture's configuration on a pseudo-terminal
 * (stdin, stdout and stderr); everything it wrote goes to out. Returns the exit status. */
static int ctl_on_tty(wt_fx_t *fx, char *out, size_t outlen, const char *const *cmd, int ncmd) {
  char bufs[WT_NCONF][320], *args[2 * WT_NCONF + 16], prog[512];
  int n = 0;
  snprintf(prog, sizeof prog, "%s", obx_test_build_path("outboxctl"));
  args[n++] = prog;
  for (int i = 0; i < ncmd; i++) args[n++] = (char *)cmd[i];
  args[n++] = "--who";
  args[n++] = "wt-tester";
  n += wt_conf_args(fx, bufs, args + n);
  args[n] = NULL;
  int master;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  if (pid < 0) fail_msg("forkpty: %s", strerror(errno));
  if (pid == 0) {
    execv(args[0], args);
    _exit(127);
  }
  size_t len = 0;
  for (;;) { /* the pty reports EIO once the child is gone and everything was read */
    ssize_t r = read(master, out + len, outlen - 1 - len);
    if (r > 0 && (len += (size_t)r) < outlen - 1) continue;
    if (r < 0 && errno == EINTR) continue;
    break;
  }
  out[len] = '\0';
  close(master);
  int status;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_inbox_show_and_replay(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  obx_event_t ev[3];
  const char *nums[] = {"R-1", "R-2", "R-3"};
  for (int i = 0; i < 3; i++) {
    wt_event(&ev[i], "OrderConfirmed", nums[i], nums[i]);
    wt_route(fx, nums[i], 200);
    wt_produce(fx, &ev[i]);
  }
  for (int i = 0; i < 3; i++) wt_wait_status(fx, ev[i].id, "DONE");

  char out[16384], cmd[256];
  snprintf(cmd, sizeof cmd, "inbox show %s", ev[0].id);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "\"status\" : \"DONE\"", cmd);
  want_in(out, "\"R-1\"", cmd);
  want_in(out, "\"executions\" : [ {", cmd); /* the entry with its executions and their steps */
  want_in(out, "\"steps\" : [", cmd);
  assert_int_equal(wt_ctl(fx, out, sizeof out, "inbox show 0190f0e0-0000-7000-8000-0000000000ee"), 1);

  /* One event: a second run with its own execution record. */
  snprintf(cmd, sizeof cmd, "inbox replay %s", ev[0].id);
  ctl_ok(fx, out, sizeof out, cmd);
  wt_wait_calls(fx, "R-1", 2);
  /* The first run's call carried <eventId>:<nodeId>; the replay's carries its own replay id, so
   * the ERP tells a deliberate re-run from a redelivered copy of the first. */
  const char *rp = strstr(out, "(replay ");
  assert_non_null(rp);
  char want[3][160];
  snprintf(want[0], sizeof want[0], "%s:notify", ev[0].id);
  snprintf(want[1], sizeof want[1], "%s:notify:%.*s", ev[0].id, (int)strcspn(rp + 8, ")"), rp + 8);
  int seen = 0;
  for (int i = 0; i < obx_test_httpd_nrequests(fx->httpd) && seen < 2; i++) {
    obx_test_httpd_request_t req;
    if (!obx_test_httpd_request(fx->httpd, i, &req)) continue;
    if (strcmp(req.path, "/erp/R-1") == 0) {
      const char *got = obx_test_httpd_request_header(&req, "idempotency-key");
      if (!got || strcmp(got, want[seen]) != 0)
        fail_msg("call %d to R-1: Idempotency-Key got %s, want %s", seen + 1, got ? got : "(none)", want[seen]);
      seen++;
    }
    obx_test_httpd_request_cleanup(&req);
  }
  assert_int_equal(seen, 2);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_executions(fx, ev[0].id) < 2 && obx_test_now_ms() < deadline) usleep(20000);
  assert_int_equal(wt_executions(fx, ev[0].id), 2);
  wt_wait_status(fx, ev[0].id, "DONE");

  /* By type: finished entries need --include-finished; the dry run lists them and sends
   * nothing; the real one re-runs all three. */
  ctl_ok(fx, out, sizeof out, "inbox replay --type OrderConfirmed --since 1h --dry-run");
  want_in(out, "0 events would be replayed", "replay --dry-run without --include-finished");
  assert_int_equal(wt_ctl(fx, out, sizeof out, "inbox replay --status DONE --since 1h"), 2);
  ctl_ok(fx, out, sizeof out, "inbox replay --type OrderConfirmed --since 1h --include-finished --dry-run");
  want_in(out, "3 events would be replayed (dry run)", "replay --dry-run");
  want_in(out, ev[1].id, "replay --dry-run lists the events");
  ctl_ok(fx, out, sizeof out, "inbox replay --type OrderConfirmed --since 1h --include-finished");
  want_in(out, "3 events sent for replay (replay ", "replay --type");
  if (strchr(out, '\r') || strchr(out, '#') || strstr(out, "3/3"))
    fail_msg("replay --type without a terminal drew a progress bar:\n%s", out);
  for (int i = 0; i < 3; i++) wt_wait_calls(fx, nums[i], i == 0 ? 3 : 2);
  /* On a terminal the same command draws its progress bar up to 3/3. */
  const char *words[] = {"inbox", "replay", "--type", "OrderConfirmed", "--since", "1h", "--include-finished"};
  int rc = ctl_on_tty(fx, out, sizeof out, words, 7);
  if (rc != 0) fail_msg("replay --type on a terminal: exit %d, want 0; output:\n%s", rc, out);
  want_in(out, "\r[########################################] 3/3", "replay --type on a terminal");
  want_in(out, "3 events sent for replay", "replay --type on a terminal");
  for (int i = 0; i < 3; i++) wt_wait_calls(fx, nums[i], i == 0 ? 4 : 3);
  /* --key selects one key's entries */
  ctl_ok(fx, out, sizeof out, "inbox replay --key R-2 --include-finished --dry-run --json");
  want_in(out, "\"count\" : 1", "replay --key --json");
  want_in(out, ev[1].id, "replay --key --json");
  ctl_ok(fx, out, sizeof out, "inbox replay --type InvoiceIssued --since 1h --include-finished");
  want_in(out, "0 events", "replay of an unseen type");
  assert_int_equal(audit_by(fx, "inbox.replay", "wt-tester"), 3); /* one per real replay that sent events */
  bson_t *one = BCON_NEW("action", BCON_UTF8("inbox.replay"), "target", BCON_UTF8(ev[0].id), "orgId", BCON_UTF8(WT_ORG));
  assert_int_equal(wt_count(fx, "audit_log", one), 1);
  bson_destroy(one);
  for (int i = 0; i < 3; i++) obx_event_cleanup(&ev[i]);
}

static void test_keys_list_and_release(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  start_worker_draining(fx);
  /* A terminal head parks its key until an operator releases it. */
  obx_event_t head, later[2];
  wt_event(&head, "OrderConfirmed", "K-R", "S-0");
  wt_route(fx, "S-0", 400);
  wt_produce(fx, &head);
  wt_wait_status(fx, head.id, "DEAD");
  const char *nums[] = {"S-1", "S-2"};
  for (int i = 0; i < 2; i++) {
    wt_event(&later[i], "OrderConfirmed", "K-R", nums[i]);
    wt_route(fx, nums[i], 200);
    wt_produce(fx, &later[i]);
  }
  for (int i = 0; i < 2; i++) wt_wait_status(fx, later[i].id, "BLOCKED");

  char out[16384];
  ctl_ok(fx, out, sizeof out, "keys list");
  want_in(out, "K-R", "keys list");
  want_in(out, head.id, "keys list");
  ctl_ok(fx, out, sizeof out, "keys list --json");
  want_in(out, "\"blocked\" : 2", "keys list --json");
  want_in(out, "\"orgId\" : \"" WT_ORG "\"", "keys list --json");
  assert_int_equal(wt_ctl(fx, out, sizeof out, "keys release NOT-PARKED"), 1);
  ctl_ok(fx, out, sizeof out, "keys release K-R --dry-run");
  want_in(out, "would be released (dry run)", "keys release --dry-run");
  want_in(out, later[0].id, "keys release --dry-run");
  if (!wt_key_parked(fx, "K-R") || audit_by(fx, "keys.release", "wt-tester") != 0)
    fail_msg("keys release --dry-run changed something");

  ctl_ok(fx, out, sizeof out, "keys release K-R");
  want_in(out, later[0].id, "keys release");
  for (int i = 0; i < 2; i++) wt_wait_status(fx, later[i].id, "DONE");
  wt_wait_unparked(fx, "K-R");
  if (wt_last_call_index(fx, "S-1") > wt_last_call_index(fx, "S-2")) fail_msg("S-2 ran before S-1");
  wt_wait_status(fx, head.id, "DEAD"); /* the head stays in the DLQ */
  assert_int_equal(audit_by(fx, "keys.release", "wt-tester"), 1);
  want_audit_shape(fx, "keys.release", WT_ORG);
  obx_event_cleanup(&head);
  for (int i = 0; i < 2; i++) obx_event_cleanup(&later[i]);
}

/* A Kafka record with a header whose name is empty (Kafka allows it; the inbox cannot store it)
 * is dead-lettered by the worker (malformed); the drain stores it, the reason naming the header
 * left out and its value, and the dead letters queued after it are stored too. The drain once
 * stalled on it: rabbitmq-c cannot consume a message whose AMQP headers hold an empty name, so
 * the drain reconnected twice a second and nothing after it reached dead_letters. */
static void test_dead_letter_with_empty_header_name(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  start_worker_draining(fx);
  const char *id = "0190f0e0-0000-7000-8000-00000000e0e0";
  obx_ce_header_t h[] = {{"ce_specversion", "1.0", 3},  {"ce_id", id, strlen(id)},
                         {"ce_type", "OrderConfirmed", 14}, {"ce_source", "/test", 5},
                         {"ce_subject", "Order/K-E", 9},   {"ce_time", "2026-01-01T00:00:00Z", 20},
                         {"ce_orgid", WT_ORG, strlen(WT_ORG)}, {"ce_partitionkey", "K-E", 3},
                         {"", "nameless", 8},              {"x.dotted", "d", 1},
                         {"$dollar", "s", 1}};
  const char *body = "{\"orderNumber\":\"Q-E\"}";
  wt_produce_record(fx, "K-E", 3, body, strlen(body), h, (int)(sizeof h / sizeof h[0]));
  obx_event_t after;
  wt_event(&after, "OrderConfirmed", "K-F", "Q-F");
  wt_route(fx, "Q-F", 400);
  wt_produce(fx, &after);
  wt_wait_status(fx, after.id, "DEAD");
  wait_dl_count(fx, "eventId", after.id, 1);
  wait_dl_count(fx, "eventId", id, 1);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 0);
  bson_t *filter = BCON_NEW("eventId", BCON_UTF8(id));
  bson_t doc = BSON_INITIALIZER;
  if (!obx_test_find_one(fx->client, obx_mongo_db_name(fx->mongo), "dead_letters", filter, &doc))
    fail_msg("no dead letter of %s", id);
  char *json = bson_as_canonical_extended_json(&doc, NULL);
  print_message("%s\n", json);
  assert_string_equal(obx_mongo_doc_str(&doc, "failureClass"), "malformed");
  const char *reason = obx_mongo_doc_str(&doc, "reason");
  if (!reason || !strstr(reason, "a header with an empty name left out (value \"nameless\")"))
    fail_msg("reason \"%s\" does not name the header with an empty name and its value", reason);
  if (!strstr(json, "\"x.dotted\" : \"d\"") || !strstr(json, "\"$dollar\" : \"s\""))
    fail_msg("the headers named with a dot or a dollar are not kept: %s", json);
  bson_free(json);
  bson_destroy(&doc);
  bson_destroy(filter);
  obx_event_cleanup(&after);
}

/* A message whose AMQP headers hold an empty name, put in the DLQ by another producer (rabbitmq-c
 * publishes it; an older outboxd did), and a worker's dead letter queued behind it: the drain
 * stores both, the first class malformed with a reason naming the header's value and keeping
 * the message's own class and reason, the header left out. The drain once never read it
 * (rabbitmq-c's amqp_consume_message refuses to copy such a header table) and reconnected for
 * ever, and nothing behind it reached dead_letters. */
static void test_foreign_dlq_message_with_empty_header_name(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  amqp_connection_state_t conn = wt_amqp_open();
  amqp_table_entry_t h[3];
  h[0].key = amqp_cstring_bytes("");
  h[0].value.kind = AMQP_FIELD_KIND_UTF8;
  h[0].value.value.bytes = amqp_cstring_bytes("nameless");
  h[1].key = amqp_cstring_bytes("x-failure-class");
  h[1].value.kind = AMQP_FIELD_KIND_UTF8;
  h[1].value.value.bytes = amqp_cstring_bytes("terminal");
  h[2].key = amqp_cstring_bytes("x-reason");
  h[2].value.kind = AMQP_FIELD_KIND_UTF8;
  h[2].value.value.bytes = amqp_cstring_bytes("refused elsewhere");
  amqp_basic_properties_t props = {._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                                             AMQP_BASIC_DELIVERY_MODE_FLAG,
                                   .message_id = amqp_cstring_bytes("foreign-1"),
                                   .delivery_mode = AMQP_DELIVERY_PERSISTENT,
                                   .headers = {.num_entries = 3, .entries = h}};
  const char *body = "{\"orderNumber\":\"Q-G\"}";
  assert_int_equal(amqp_basic_publish(conn, 1, amqp_empty_bytes, amqp_cstring_bytes(obx_ladder_dlq_queue(fx->ladder)),
                                      0, 0, &props, amqp_cstring_bytes(body)),
                   AMQP_STATUS_OK);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 1);
  start_worker_draining(fx);
  obx_event_t after;
  wt_event(&after, "OrderConfirmed", "K-H", "Q-H");
  wt_route(fx, "Q-H", 400);
  wt_produce(fx, &after);
  wt_wait_status(fx, after.id, "DEAD");
  wait_dl_count(fx, "eventId", after.id, 1);
  wait_dl_count(fx, "eventId", "foreign-1", 1);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 0);
  bson_t *filter = BCON_NEW("eventId", BCON_UTF8("foreign-1"));
  bson_t doc = BSON_INITIALIZER;
  if (!obx_test_find_one(fx->client, obx_mongo_db_name(fx->mongo), "dead_letters", filter, &doc))
    fail_msg("no dead letter of foreign-1");
  char *json = bson_as_canonical_extended_json(&doc, NULL);
  print_message("%s\n", json);
  assert_string_equal(obx_mongo_doc_str(&doc, "failureClass"), "malformed");
  const char *reason = obx_mongo_doc_str(&doc, "reason");
  if (!reason || !strstr(reason, "1 with an empty name (\"nameless\")") || !strstr(reason, "its class was terminal") ||
      !strstr(reason, "refused elsewhere"))
    fail_msg("reason \"%s\" does not name the header, the message's class and its reason", reason);
  if (!strstr(json, "Q-G")) fail_msg("the body is not kept: %s", json);
  bson_free(json);
  bson_destroy(&doc);
  bson_destroy(filter);
  obx_event_cleanup(&after);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_dead_letter_store, setup, teardown),
    cmocka_unit_test_setup_teardown(test_dead_letter_with_empty_header_name, setup, teardown),
    cmocka_unit_test_setup_teardown(test_foreign_dlq_message_with_empty_header_name, setup, teardown),
    cmocka_unit_test_setup_teardown(test_redrive_exactly_once, setup, teardown),
    cmocka_unit_test_setup_teardown(test_inbox_show_and_replay, setup, teardown),
    cmocka_unit_test_setup_teardown(test_keys_list_and_release, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
