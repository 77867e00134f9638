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

static void test_dlq_list_peek_redrive_purge(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  obx_event_t bad, worse;
  wt_event(&bad, "OrderConfirmed", "K-1", "Q-1");
  wt_event(&worse, "OrderConfirmed", "K-2", "Q-2");
  wt_route(fx, "Q-1", 400);
  wt_route(fx, "Q-2", 400);
  wt_produce(fx, &bad);
  wt_produce(fx, &worse);
  wt_wait_status(fx, bad.id, "DEAD");
  wt_wait_status(fx, worse.id, "DEAD");
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 2);

  char out[16384], cmd[256];
  ctl_ok(fx, out, sizeof out, "dlq list");
  want_in(out, bad.id, "dlq list");
  want_in(out, "terminal failure", "dlq list");
  ctl_ok(fx, out, sizeof out, "dlq list --json");
  want_in(out, "\"id\" : \"", "dlq list --json");
  snprintf(cmd, sizeof cmd, "dlq peek %s", bad.id);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "HTTP 400", cmd);
  want_in(out, "\"Q-1\"", cmd); /* the payload */
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 2); /* browsing removed nothing */
  assert_int_equal(wt_ctl(fx, out, sizeof out, "dlq peek 0190f0e0-0000-7000-8000-0000000000ff"), 1);
  assert_int_equal(wt_ctl(fx, out, sizeof out, "dlq redrive"), 2);

  wt_route(fx, "Q-1", 200);
  snprintf(cmd, sizeof cmd, "dlq redrive --id %s --dry-run", bad.id);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "1 message would be redriven", cmd);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 2);
  snprintf(cmd, sizeof cmd, "dlq redrive --id %s", bad.id);
  ctl_ok(fx, out, sizeof out, cmd);
  want_in(out, "1 message redriven", cmd);
  wt_wait_status(fx, bad.id, "DONE");
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 1);

  assert_int_equal(wt_ctl(fx, out, sizeof out, "dlq purge"), 2); /* needs --yes */
  ctl_ok(fx, out, sizeof out, "dlq purge --yes");
  want_in(out, "1 message purged", "dlq purge");
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 0);
  assert_int_equal(audit_by(fx, "dlq.redrive", "wt-tester"), 2); /* dry run included */
  assert_int_equal(audit_by(fx, "dlq.purge", "wt-tester"), 1);
  want_audit_shape(fx, "dlq.redrive", NULL);
  want_audit_shape(fx, "dlq.purge", NULL);
  obx_event_cleanup(&bad);
  obx_event_cleanup(&worse);
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
  assert_int_equal(wt_ctl(fx, out, sizeof out, "inbox show 0190f0e0-0000-7000-8000-0000000000ee"), 1);

  /* One event: a second run with its own execution record. */
  snprintf(cmd, sizeof cmd, "inbox replay %s", ev[0].id);
  ctl_ok(fx, out, sizeof out, cmd);
  wt_wait_calls(fx, "R-1", 2);
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (wt_executions(fx, ev[0].id) < 2 && obx_test_now_ms() < deadline) usleep(20000);
  assert_int_equal(wt_executions(fx, ev[0].id), 2);
  wt_wait_status(fx, ev[0].id, "DONE");

  /* By type: the dry run counts and sends nothing; the real one re-runs all three. */
  ctl_ok(fx, out, sizeof out, "inbox replay --type OrderConfirmed --since 1h --dry-run");
  want_in(out, "3 events of type OrderConfirmed would be replayed", "replay --dry-run");
  ctl_ok(fx, out, sizeof out, "inbox replay --type OrderConfirmed --since 1h");
  want_in(out, "3 events of type OrderConfirmed sent for replay", "replay --type");
  if (strchr(out, '\r') || strchr(out, '#') || strstr(out, "3/3"))
    fail_msg("replay --type without a terminal drew a progress bar:\n%s", out);
  for (int i = 0; i < 3; i++) wt_wait_calls(fx, nums[i], i == 0 ? 3 : 2);
  /* On a terminal the same command draws its progress bar up to 3/3. */
  const char *words[] = {"inbox", "replay", "--type", "OrderConfirmed", "--since", "1h"};
  int rc = ctl_on_tty(fx, out, sizeof out, words, 6);
  if (rc != 0) fail_msg("replay --type on a terminal: exit %d, want 0; output:\n%s", rc, out);
  want_in(out, "\r[########################################] 3/3", "replay --type on a terminal");
  want_in(out, "3 events of type OrderConfirmed sent for replay", "replay --type on a terminal");
  for (int i = 0; i < 3; i++) wt_wait_calls(fx, nums[i], i == 0 ? 4 : 3);
  ctl_ok(fx, out, sizeof out, "inbox replay --type InvoiceIssued --since 1h");
  want_in(out, "0 events", "replay of an unseen type");
  assert_int_equal(audit_by(fx, "inbox.replay", "wt-tester"), 1);
  assert_int_equal(audit_by(fx, "inbox.replay_type", "wt-tester"), 4); /* one per command */
  want_audit_shape(fx, "inbox.replay", WT_ORG);
  want_audit_shape(fx, "inbox.replay_type", NULL);
  for (int i = 0; i < 3; i++) obx_event_cleanup(&ev[i]);
}

static void test_keys_list_and_release(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
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
  assert_int_equal(wt_ctl(fx, out, sizeof out, "keys release NOT-PARKED"), 1);

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

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_dlq_list_peek_redrive_purge, setup, teardown),
    cmocka_unit_test_setup_teardown(test_inbox_show_and_replay, setup, teardown),
    cmocka_unit_test_setup_teardown(test_keys_list_and_release, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
