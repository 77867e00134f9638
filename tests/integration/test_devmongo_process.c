/* test_devmongo_process.c - devmongod's process lifetime: --exit-with-parent
 *
 * DESIGN: obx_test_mongo_start always passes --exit-with-parent, so a test process that
 * crashes leaves no devmongod behind. The test forks a stand-in for such a test: it starts a
 * devmongod, reports its pid and port through a pipe and exits without stopping it. The
 * server must go away by itself; if it does not, the test kills it (by that pid) and fails. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "obx_test.h"
#include "obx_test_mongo.h"

static void test_exit_with_parent(void **state) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    /* the "crashing test": starts a server and exits without stopping it */
    close(fds[0]);
    obx_test_mongo_t m;
    int report[2] = {0, 0};
    if (obx_test_mongo_start(&m, NULL)) {
      report[0] = (int)m.proc.pid;
      report[1] = m.port;
    }
    ssize_t w = write(fds[1], report, sizeof report);
    _exit(w == (ssize_t)sizeof report ? 0 : 1);
  }
  close(fds[1]);
  int report[2] = {0, 0};
  ssize_t r = read(fds[0], report, sizeof report);
  close(fds[0]);
  int status;
  waitpid(child, &status, 0);
  assert_int_equal(r, (ssize_t)sizeof report);
  pid_t server = (pid_t)report[0];
  if (server <= 0 || report[1] <= 0) fail_msg("the child could not start devmongod");
  if (!obx_test_wait_for(obx_test_pid_gone, &server, 30000, 20)) {
    kill(server, SIGKILL);
    fail_msg("devmongod %d (port %d): still running 30 s after the process that started it exited",
             (int)server, report[1]);
  }
}

/* With the flag the server serves as usual, and SIGTERM still stops it cleanly (status 0). */
static void test_serves_and_stops_cleanly(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, "--verbose"));
  mongoc_client_t *client = obx_test_mongo_client(&m, NULL, NULL);
  bson_t *ping = BCON_NEW("ping", BCON_INT32(1)), reply;
  bson_error_t error;
  bool ok = mongoc_client_command_simple(client, "admin", ping, NULL, &reply, &error);
  if (!ok) print_message("ping: %s\n", error.message);
  bson_destroy(ping);
  bson_destroy(&reply);
  mongoc_client_destroy(client);
  int st = obx_test_mongo_stop(&m);
  assert_true(ok);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_exit_with_parent),
    cmocka_unit_test(test_serves_and_stops_cleanly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
