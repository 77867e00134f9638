/* test_run_sh_ctrl_c.c - Ctrl-C in a terminal stops run.sh's outboxd first and everything in < 5 s
 *
 * A terminal's Ctrl-C sends SIGINT to every process of the foreground process group. The test
 * starts `scripts/run.sh --no-build` as the leader of a process group of its own (as a shell
 * with job control starts a foreground job), waits for its `ready` file, then sends SIGINT to
 * the whole group. Wanted: run.sh and every process it started are gone within 5 s; outboxd
 * stopped cleanly ("outboxd stopped", not cut by its grace: its services still answered while it
 * stopped); run.sh never had to SIGKILL anything. Kafka is whichever run.sh picks (KAFKA_PID: the
 * Apache Kafka broker where Java is installed, else kafka-mockd). */
#include "obx_test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define READY_MS 240000
#define STOP_MS 5000

static bool ready_pid(const char *path, const char *name, pid_t *pid) {
  FILE *f = fopen(path, "r");
  char line[512];
  size_t n = strlen(name);
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f))
    if (strncmp(line, name, n) == 0 && line[n] == '=') found = (*pid = (pid_t)atoi(line + n + 1)) > 0;
  if (f) fclose(f);
  return found;
}

static bool file_exists(void *path) { return access(path, F_OK) == 0; }

typedef struct {
  pid_t pids[4];
  int n;
} pids_t;

static bool all_gone(void *p) {
  pids_t *ps = p;
  for (int i = 0; i < ps->n; i++)
    if (!obx_test_pid_gone(&ps->pids[i])) return false;
  return true;
}

static void test_ctrl_c_stops_outboxd_first_and_everything_fast(void **state) {
  obx_test_require(getenv("AMQP_URL") != NULL, "AMQP_URL (scripts/rabbitmq.sh start)");
  char dir[512], ready[600], log_path[600], outboxd_log[600];
  snprintf(dir, sizeof dir, "%s/run-ctrl-c", obx_test_tmpdir());
  snprintf(ready, sizeof ready, "%s/ready", dir);
  snprintf(log_path, sizeof log_path, "%s/run.sh.out", obx_test_tmpdir());
  snprintf(outboxd_log, sizeof outboxd_log, "%s/outboxd.log", dir);
  char script[512];
  snprintf(script, sizeof script, "%s/scripts/run.sh", OBX_SOURCE_DIR);
  pid_t run = fork();
  assert_true(run >= 0);
  if (run == 0) {
    setpgid(0, 0); /* the foreground job's process group */
    signal(SIGINT, SIG_DFL);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    int nul = open("/dev/null", O_RDONLY);
    dup2(nul, 0);
    setenv("OBX_BUILD_DIR", OBX_BUILD_DIR, 1);
    setenv("HTTP_PORT", "0", 1);
    unsetenv("MONGO_URI");
    unsetenv("KAFKA_BROKERS");
    char prefix[64];
    snprintf(prefix, sizeof prefix, "runctrlc.%d", (int)getppid());
    setenv("WORKER_QUEUE_PREFIX", prefix, 1);
    execl("/bin/bash", "bash", script, "--no-build", "--state-dir", dir, (char *)NULL);
    _exit(127);
  }
  setpgid(run, run);
  if (!obx_test_wait_for(file_exists, ready, READY_MS, 100)) {
    kill(-run, SIGKILL);
    waitpid(run, NULL, 0);
    fail_msg("run.sh never wrote %s; output %s", ready, log_path);
  }
  pids_t ps = {.n = 0};
  ps.pids[ps.n++] = run;
  static const char *const names[] = {"OUTBOXD_PID", "DEVMONGOD_PID", "KAFKA_PID"};
  for (int i = 0; i < 3; i++)
    if (!ready_pid(ready, names[i], &ps.pids[ps.n++])) fail_msg("%s: no %s", ready, names[i]);

  int64_t t0 = obx_test_now_ms();
  assert_int_equal(kill(-run, SIGINT), 0); /* Ctrl-C */
  int status = 0;
  pid_t got = 0;
  while (got == 0 && obx_test_now_ms() - t0 < STOP_MS + 20000) {
    got = waitpid(run, &status, WNOHANG);
    if (got == 0) {
      struct timespec ts = {0, 20 * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  bool gone = obx_test_wait_for(all_gone, &ps, STOP_MS, 20);
  int64_t took = obx_test_now_ms() - t0;
  printf("# Ctrl-C to everything stopped: %lld ms\n", (long long)took);
  if (got != run) {
    kill(-run, SIGKILL);
    waitpid(run, NULL, 0);
  }
  for (int i = 1; i < ps.n; i++) kill(ps.pids[i], SIGKILL);
  if (!gone || took > STOP_MS) fail_msg("Ctrl-C: %lld ms until run.sh and its processes were gone (want < %d ms); output %s",
                                        (long long)took, STOP_MS, log_path);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 130)
    fail_msg("run.sh after Ctrl-C: wait status 0x%x, want exit 130; output %s", status, log_path);
  if (!obx_test_file_contains(outboxd_log, "outboxd stopped", 0) ||
      obx_test_file_contains(outboxd_log, "shutdown grace", 0))
    fail_msg("outboxd did not stop cleanly before its services; log %s", outboxd_log);
  if (obx_test_file_contains(log_path, "SIGKILL", 0)) fail_msg("run.sh had to SIGKILL something; output %s", log_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_ctrl_c_stops_outboxd_first_and_everything_fast),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
