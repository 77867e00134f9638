/* proc.c - child processes, deadline polling and prerequisites (obx_test_have) for tests */
#include "obx_test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int64_t obx_test_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool obx_test_wait_for(bool (*cond)(void *ctx), void *ctx, int timeout_ms, int poll_ms) {
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  for (;;) {
    if (cond(ctx)) return true;
    if (obx_test_now_ms() >= deadline) return cond(ctx);
    struct timespec ts = {poll_ms / 1000, (long)(poll_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

const char *obx_test_tmpdir(void) {
  static char dir[200];
  if (!dir[0]) {
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/obxtest.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) {
      perror("mkdtemp");
      abort();
    }
  }
  return dir;
}

const char *obx_test_unique(void) {
  static char id[32];
  if (!id[0]) {
    uint32_t r;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint32_t)obx_test_now_ms();
    snprintf(id, sizeof id, "%d-%08x", (int)getpid(), r);
  }
  return id;
}

const char *obx_test_build_path(const char *rel) {
  static char path[4][512];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, 512, "%s/%s", OBX_BUILD_DIR, rel);
  return p;
}

bool obx_test_have_at(bool cond, const char *why, const char *file, int line) {
  if (cond) return true;
  const char *strict = getenv("OBX_TEST_STRICT");
  if (strict && strcmp(strict, "1") == 0) {
    print_error("%s (OBX_TEST_STRICT=1: a missing prerequisite fails the test instead of skipping it)\n", why);
    _fail(file, line);
  }
  print_message("skipped: %s\n", why);
  return false;
}

bool obx_test_spawn(obx_test_proc_t *proc, char *const argv[], char *const env_extra[]) {
  static int seq;
  const char *base = strrchr(argv[0], '/');
  snprintf(proc->log_path, sizeof proc->log_path, "%s/%s.%d.%d.log", obx_test_tmpdir(),
           base ? base + 1 : argv[0], (int)getpid(), seq++);
  int fd = open(proc->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return false;
  }
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    for (int i = 0; env_extra && env_extra[i]; i++) putenv(env_extra[i]);
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fd);
  proc->pid = pid;
  return true;
}

bool obx_test_proc_alive(obx_test_proc_t *proc) {
  if (proc->pid <= 0) return false;
  int status;
  pid_t r = waitpid(proc->pid, &status, WNOHANG);
  if (r == proc->pid) {
    proc->pid = 0;
    return false;
  }
  return r == 0;
}

bool obx_test_pid_gone(void *pid) {
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)*(pid_t *)pid);
  FILE *f = fopen(path, "r");
  if (!f) return true;
  bool ok = fgets(stat, sizeof stat, f) != NULL;
  fclose(f);
  const char *end = ok ? strrchr(stat, ')') : NULL; /* "pid (comm) S ..." */
  return !(end && end[1] == ' ' && end[2] != 'Z' && end[2] != 'X');
}

int obx_test_proc_stop(obx_test_proc_t *proc, int sig, int timeout_ms) {
  if (proc->pid <= 0) return -1;
  kill(proc->pid, sig);
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  int status = -1;
  for (;;) {
    pid_t r = waitpid(proc->pid, &status, WNOHANG);
    if (r == proc->pid) break;
    if (r < 0) {
      status = -1;
      break;
    }
    if (obx_test_now_ms() >= deadline) {
      kill(proc->pid, SIGKILL);
      waitpid(proc->pid, &status, 0);
      break;
    }
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  proc->pid = 0;
  return status;
}

typedef struct {
  const char *path;
  const char *needle;
  char *out;
  size_t outlen;
} file_wait_t;

static bool first_line_ready(void *ctx) {
  file_wait_t *w = ctx;
  FILE *f = fopen(w->path, "r");
  if (!f) return false;
  char buf[1024];
  bool ok = fgets(buf, sizeof buf, f) && strchr(buf, '\n');
  fclose(f);
  if (ok) {
    buf[strcspn(buf, "\r\n")] = 0;
    ok = buf[0] != 0;
    if (ok) snprintf(w->out, w->outlen, "%s", buf);
  }
  return ok;
}

bool obx_test_read_first_line(const char *path, char *out, size_t outlen, int timeout_ms) {
  file_wait_t w = {path, NULL, out, outlen};
  return obx_test_wait_for(first_line_ready, &w, timeout_ms, 10);
}

static bool file_has(void *ctx) {
  file_wait_t *w = ctx;
  FILE *f = fopen(w->path, "r");
  if (!f) return false;
  bool found = false;
  char *line = NULL;
  size_t cap = 0;
  while (!found && getline(&line, &cap, f) > 0) found = strstr(line, w->needle) != NULL;
  free(line);
  fclose(f);
  return found;
}

bool obx_test_file_contains(const char *path, const char *needle, int timeout_ms) {
  file_wait_t w = {path, needle, NULL, 0};
  return obx_test_wait_for(file_has, &w, timeout_ms, 20);
}

int obx_test_sh(const char *cmd, char *out, size_t outlen) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t len = 0, n;
  char chunk[4096];
  while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) {
    size_t room = outlen > len + 1 ? outlen - len - 1 : 0;
    if (n > room) n = room;
    if (out && n) memcpy(out + len, chunk, n);
    len += n;
  }
  if (out && outlen) out[len] = '\0';
  int st = pclose(p);
  return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool obx_test_shf(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  if (rc != 0) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
  return rc == 0;
}

int obx_test_run(const char *prog, char *const args[], int timeout_ms, obx_test_proc_t *proc) {
  char *argv[16];
  int argc = 0;
  argv[argc++] = (char *)obx_test_build_path(prog);
  for (int i = 0; args[i] && argc < 15; i++) argv[argc++] = args[i];
  argv[argc] = NULL;
  if (!obx_test_spawn(proc, argv, NULL)) return -1;
  int64_t deadline = obx_test_now_ms() + timeout_ms;
  int status;
  while (obx_test_now_ms() < deadline) {
    if (waitpid(proc->pid, &status, WNOHANG) == proc->pid) {
      proc->pid = 0;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
  obx_test_proc_stop(proc, SIGKILL, 1000);
  return -1;
}
