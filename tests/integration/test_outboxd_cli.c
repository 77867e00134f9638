/* test_outboxd_cli.c - outboxd's command line: --help, bad usage, bad configuration, --roles
 *
 * No services are needed: every case either exits at once or runs `--roles api` against a
 * MongoDB URI that nothing listens on (the api role starts regardless). */
#include "obx_test.h"
#include "obx_test_outboxd.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

static void test_exits(void **state) {
  static const struct {
    const char *name;
    char *args[8];
    int want_exit;
    const char *want_output;
  } cases[] = {
    {"help", {"--help", NULL}, 0, "usage: outboxd"},
    {"unknown option", {"--bogus", NULL}, 2, "bad argument '--bogus'"},
    {"unknown role", {"--roles", "api,cook", NULL}, 1, "unknown role 'cook'"},
    {"bad key", {"-X", "http.port=70000", NULL}, 1, "http.port"},
    {"unknown key", {"-X", "no.such.key=1", NULL}, 1, "no.such.key"},
    {"bad cors origin", {"-X", "api.cors_origins=app.example.com", NULL}, 1,
     "api.cors_origins=app.example.com: must be * or"},
    {"missing file", {"-c", "/nonexistent/outboxd.conf", NULL}, 1, "/nonexistent/outboxd.conf"},
    {"bad currency", {"--roles", "api", "-X", "api.default_currency=reais", "-X", "http.port=0", NULL}, 1,
     "api.default_currency"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_test_proc_t proc;
    int got = obx_test_run("outboxd", cases[i].args, 30000, &proc);
    bool said = obx_test_file_contains(proc.log_path, cases[i].want_output, 1000);
    if (got != cases[i].want_exit || !said) {
      print_error("%s: got exit %d (output %s \"%s\"), want exit %d; log %s\n", cases[i].name, got,
                  said ? "has" : "lacks", cases[i].want_output, cases[i].want_exit, proc.log_path);
      fail();
    }
  }
}

/* --roles api runs only the api role, serves /healthz with MongoDB down, and exits 0 on SIGTERM
 * within STOP_DEADLINE_MS: the start-up threads (orders and pipelines indexes) are retrying
 * against the unreachable MongoDB at that moment and must not hold the stop up. */
#define STOP_DEADLINE_MS 2000
static void test_roles_api_and_sigterm(void **state) {
  obx_test_outboxd_t d;
  char *args[] = {"--roles", "api", "-X", "mongo.uri=mongodb://127.0.0.1:1/?replicaSet=rs0", NULL};
  assert_true(obx_test_outboxd_start(&d, args));
  obx_test_http_resp_t resp;
  assert_true(obx_test_http(d.port, "GET", "/healthz", NULL, NULL, NULL, &resp));
  assert_int_equal(resp.status, 200);
  obx_test_http_resp_cleanup(&resp);
  assert_true(obx_test_file_contains(d.proc.log_path, "role api started", 5000));
  char log_path[sizeof d.proc.log_path];
  snprintf(log_path, sizeof log_path, "%s", d.proc.log_path);
  int64_t signalled = obx_test_now_ms();
  int status = obx_test_proc_stop(&d.proc, SIGTERM, STOP_DEADLINE_MS); /* SIGKILL after the deadline */
  int64_t took = obx_test_now_ms() - signalled;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || took > STOP_DEADLINE_MS) {
    print_error("SIGTERM with MongoDB unreachable: got wait status %d after %lld ms, want exit 0 within %d ms; log %s\n",
                status, (long long)took, STOP_DEADLINE_MS, log_path);
    fail();
  }
  assert_false(obx_test_file_contains(log_path, "role relay started", 0));
  assert_false(obx_test_file_contains(log_path, "role worker started", 0));
  assert_true(obx_test_file_contains(log_path, "outboxd stopped", 1000));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_exits),
    cmocka_unit_test(test_roles_api_and_sigterm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
