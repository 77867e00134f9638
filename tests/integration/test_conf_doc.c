/* test_conf_doc.c - the README's configuration table is the built outboxctl's output, and
 * `outboxctl conf check` rejects a bad value naming the key */
#include "obx_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define BEGIN_MARK "<!-- BEGIN outboxctl conf list --format markdown -->\n"
#define END_MARK "<!-- END outboxctl conf list --format markdown -->"

/* Runs a shell command; returns its output (caller frees) and its exit status in *status. */
static char *run(const char *cmd, int *status) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char *buf = NULL;
  size_t cap = 0, len = 0;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) {
    if (len + n + 1 > cap) {
      cap = (len + n + 1) * 2;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
    memcpy(buf + len, chunk, n);
    len += n;
  }
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (!buf) buf = calloc(1, 1);
  else buf[len] = '\0';
  return buf;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *buf = malloc((size_t)n + 1);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void test_readme_table_matches(void **state) {
  char cmd[1024];
  int status;
  snprintf(cmd, sizeof cmd, "%s conf list --format markdown", obx_test_build_path("outboxctl"));
  char *table = run(cmd, &status);
  assert_int_equal(status, 0);
  assert_non_null(strstr(table, "| `outbox.batch_size` | `OUTBOX_BATCH_SIZE` |"));

  char *readme = read_file(OBX_SOURCE_DIR "/README.md");
  assert_non_null(strstr(readme, "\n## Configuration\n"));
  char *begin = strstr(readme, BEGIN_MARK), *end = strstr(readme, END_MARK);
  if (!begin || !end || end < begin) fail_msg("README.md lacks the markers " BEGIN_MARK " ... " END_MARK);
  begin += strlen(BEGIN_MARK);
  *end = '\0';
  if (strcmp(begin, table) != 0)
    fail_msg("README.md's configuration table is stale: replace the text between its markers with the output "
             "of `outboxctl conf list --format markdown`.\n--- README has:\n%s\n--- outboxctl prints:\n%s",
             begin, table);
  free(readme);
  free(table);
}

static void test_check(void **state) {
  static const struct {
    const char *args;
    int status;
    const char *want; /* in the combined output */
  } cases[] = {
    {"conf check -X outbox.batch_size=0", 2, "outbox.batch_size=0: must be between 1 and 10000"},
    {"conf check -X OUTBOX_MAX_ATTEMPTS=many", 2, "OUTBOX_MAX_ATTEMPTS=many: must be an integer"},
    {"conf check -X no.such.key=1", 2, "unknown configuration key 'no.such.key'"},
    {"conf check -c /nonexistent/outboxd.conf", 2, "/nonexistent/outboxd.conf"},
    {"conf check -X outbox.batch_size=7 -X MONGO_URI=mongodb://u:hunter2@h/", 0, "outbox.batch_size = 7\n"},
    {"conf check -X MONGO_URI=mongodb://u:hunter2@h/", 0, "mongo.uri = mongodb://u:***@h/\n"},
    {"conf list", 0, "OUTBOX_BATCH_SIZE"},
    {"conf list --format html", 2, "--format html: must be text or markdown"},
    {"conf bogus", 2, "unknown subcommand 'bogus'"},
    {"conf", 2, "missing subcommand"},
    {"nosuch", 2, "unknown command 'nosuch'"},
    {"--help", 0, "commands:"},
    {"conf --help", 0, "outboxctl conf check"},
    {"conf check --help", 0, "-X key=value"},
    {"conf list --help", 0, "--format markdown"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char cmd[1024];
    int status;
    snprintf(cmd, sizeof cmd, "env -u OUTBOX_BATCH_SIZE -u OUTBOX_MAX_ATTEMPTS %s %s 2>&1",
             obx_test_build_path("outboxctl"), cases[i].args);
    char *out = run(cmd, &status);
    if (status != cases[i].status || !strstr(out, cases[i].want))
      fail_msg("outboxctl %s: got status %d output:\n%s\nwant status %d and '%s'", cases[i].args, status, out,
               cases[i].status, cases[i].want);
    if (strstr(out, "hunter2")) fail_msg("outboxctl %s printed a secret:\n%s", cases[i].args, out);
    free(out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_readme_table_matches),
    cmocka_unit_test(test_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
