/* obx_test.h - helpers shared by the test suites
 *
 * DESIGN: child processes (the dev servers, outboxd itself) are started with obx_test_spawn and
 * always stopped by obx_test_proc_stop; waiting is done by polling a condition with a deadline,
 * never by sleeping a fixed time. */
#ifndef OBX_TEST_H
#define OBX_TEST_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <cmocka.h>

typedef struct {
  pid_t pid;
  char log_path[256];  /* stdout+stderr of the child */
} obx_test_proc_t;

/* Monotonic milliseconds. */
int64_t obx_test_now_ms(void);

/* Polls cond(ctx) every poll_ms until it returns true or timeout_ms passes; returns its last
 * answer. */
bool obx_test_wait_for(bool (*cond)(void *ctx), void *ctx, int timeout_ms, int poll_ms);

/* Starts argv[0] (a path) with argv; stdout and stderr go to a temp file named in
 * proc->log_path. Returns false if fork/exec fails. env_extra: NULL or "K=V" strings
 * terminated by NULL, added to the environment. */
bool obx_test_spawn(obx_test_proc_t *proc, char *const argv[], char *const env_extra[]);
/* Sends sig (SIGTERM for a clean stop, SIGKILL for a crash) and waits up to timeout_ms for
 * exit, then SIGKILLs. Returns the wait status (or -1). Safe on a zeroed proc. */
int obx_test_proc_stop(obx_test_proc_t *proc, int sig, int timeout_ms);
bool obx_test_proc_alive(obx_test_proc_t *proc);
/* Runs build-tree program prog (obx_test_build_path) with args (NULL-terminated, at most 14)
 * until it exits by itself, up to timeout_ms (then SIGKILL); its output stays in
 * proc->log_path. Returns the exit code, -1 when it did not exit by itself or was killed. */
int obx_test_run(const char *prog, char *const args[], int timeout_ms, obx_test_proc_t *proc);
/* An obx_test_wait_for condition: process *(pid_t *)pid no longer runs. It need not be our
 * child (read from /proc); a zombie waiting to be reaped counts as gone. */
bool obx_test_pid_gone(void *pid);

/* Runs cmd with /bin/sh; its stdout goes to out (NUL-terminated, truncated to fit; out may be
 * NULL to drop it), its stderr to the test's. Returns the exit status, -1 when it did not exit. */
int obx_test_sh(const char *cmd, char *out, size_t outlen);
/* Runs the printf-formatted command with /bin/sh, stdout and stderr to the test's; true when it
 * exited 0, else false with the command and its status on stderr. */
bool obx_test_shf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Waits until `path` exists and has a first non-empty line; copies it to out. */
bool obx_test_read_first_line(const char *path, char *out, size_t outlen, int timeout_ms);
/* Waits until the file contains `needle`. */
bool obx_test_file_contains(const char *path, const char *needle, int timeout_ms);

/* A private temp directory for this test run (created once, under $TMPDIR). */
const char *obx_test_tmpdir(void);

/* This test process's token for the names it leaves on the run's shared broker and node
 * (topics, consumer groups, queue prefixes): its pid and 32 random bits, since a long run
 * reuses pids (pid_max is 32768 on these machines) and a topic outlives its process. */
const char *obx_test_unique(void);

/* Builds a path to a program in the build tree, e.g. obx_test_build_path("tests/fixtures/devmongo/devmongod"). */
const char *obx_test_build_path(const char *rel);

/* A prerequisite of (part of) a test that the environment may lack: a service (AMQP_URL) or a
 * tool (the openssl CLI). Returns cond. When cond is false: under OBX_TEST_STRICT=1 (set by
 * scripts/test.sh, where every prerequisite is installed and started) the current test fails
 * with `why`; otherwise `why` is printed as a skip notice and false is returned, so the caller
 * leaves out what needs it. Call from a test body (the failure leaves the test and names the
 * caller's file and line). */
#define obx_test_have(cond, why) obx_test_have_at((cond), (why), __FILE__, __LINE__)
bool obx_test_have_at(bool cond, const char *why, const char *file, int line);
/* The whole test needs cond: skipped (or, under OBX_TEST_STRICT=1, failed) without it. */
#define obx_test_require(cond, why)          \
  do {                                       \
    if (!obx_test_have((cond), (why))) skip(); \
  } while (0)

#endif
