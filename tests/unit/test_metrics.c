/* test_metrics.c - Prometheus registry: exposition text, concurrency, misuse */
#include "obx_test.h"
#include "obx/obx_metrics.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void assert_contains(const char *text, const char *want) {
  if (!strstr(text, want)) fail_msg("exposition lacks:\n%s\n--- got:\n%s", want, text);
}

static void test_counter_gauge_render(void **state) {
  obx_counter_t *plain = obx_metrics_counter("t_plain_total", "A counter without labels", NULL);
  obx_counter_t *pub = obx_metrics_counter("t_published_total", "Events published\nper topic \\ result", "topic,result");
  obx_gauge_t *depth = obx_metrics_gauge("t_queue_depth", "Depth", "queue");
  assert_ptr_equal(obx_metrics_counter("t_published_total", "ignored", "topic, result"), pub);

  char *text = obx_metrics_render(NULL);
  assert_contains(text, "# HELP t_plain_total A counter without labels\n# TYPE t_plain_total counter\nt_plain_total 0\n");
  /* labelled metric without series: only its HELP/TYPE lines */
  assert_contains(text, "# TYPE t_published_total counter\n# HELP t_queue_depth");
  free(text);

  obx_counter_inc(plain);
  obx_counter_add(plain, 2.5);
  obx_counter_inc(pub, "domain-events", "ok");
  obx_counter_inc(pub, "domain-events", "ok");
  obx_counter_inc(pub, "odd\"topic\\x\ny", "error");
  obx_gauge_set(depth, 7, "work");
  obx_gauge_add(depth, -2, "work");
  obx_gauge_set(depth, 0.25, "dlq");
  assert_true(obx_metrics_value(pub, "domain-events", "ok") == 2);
  assert_true(obx_metrics_value(pub, "domain-events", "nope") == 0);
  assert_true(obx_metrics_value(depth, "work") == 5);

  size_t len;
  text = obx_metrics_render(&len);
  assert_int_equal(len, strlen(text));
  assert_contains(text, "t_plain_total 3.5\n");
  assert_contains(text, "# HELP t_published_total Events published\\nper topic \\\\ result\n"
                        "# TYPE t_published_total counter\n"
                        "t_published_total{topic=\"domain-events\",result=\"ok\"} 2\n"
                        "t_published_total{topic=\"odd\\\"topic\\\\x\\ny\",result=\"error\"} 1\n");
  assert_contains(text, "# TYPE t_queue_depth gauge\nt_queue_depth{queue=\"work\"} 5\nt_queue_depth{queue=\"dlq\"} 0.25\n");
  free(text);
}

static void test_histogram_render(void **state) {
  static const double bounds[] = {0.1, 0.5, 2};
  obx_histogram_t *h = obx_metrics_histogram("t_step_seconds", "Step duration", "node", bounds, 3);
  obx_histogram_t *d = obx_metrics_histogram("t_default_seconds", "Default buckets", NULL, NULL, 0);
  obx_histogram_observe(h, 0.05, "http");
  obx_histogram_observe(h, 0.1, "http"); /* on the bound: le is inclusive */
  obx_histogram_observe(h, 1, "http");
  obx_histogram_observe(h, 30, "http");
  obx_histogram_observe(d, 0.003);
  assert_true(obx_metrics_value(h, "http") == 4);
  char *text = obx_metrics_render(NULL);
  assert_contains(text, "# HELP t_step_seconds Step duration\n# TYPE t_step_seconds histogram\n"
                        "t_step_seconds_bucket{node=\"http\",le=\"0.1\"} 2\n"
                        "t_step_seconds_bucket{node=\"http\",le=\"0.5\"} 2\n"
                        "t_step_seconds_bucket{node=\"http\",le=\"2\"} 3\n"
                        "t_step_seconds_bucket{node=\"http\",le=\"+Inf\"} 4\n"
                        "t_step_seconds_sum{node=\"http\"} 31.15\n"
                        "t_step_seconds_count{node=\"http\"} 4\n");
  assert_contains(text, "t_default_seconds_bucket{le=\"0.005\"} 1\n");
  assert_contains(text, "t_default_seconds_bucket{le=\"10\"} 1\nt_default_seconds_bucket{le=\"+Inf\"} 1\n"
                        "t_default_seconds_sum 0.003\nt_default_seconds_count 1\n");
  free(text);
}

#define THREADS 4
#define PER_THREAD 50000

static void *hammer(void *arg) {
  /* registration races with the other threads too */
  obx_counter_t *c = obx_metrics_counter("t_race_total", "Race", "who");
  obx_histogram_t *h = obx_metrics_histogram("t_race_seconds", "Race", NULL, NULL, 0);
  obx_gauge_t *g = obx_metrics_gauge("t_race_gauge", "Race", NULL);
  for (int i = 0; i < PER_THREAD; i++) {
    obx_counter_inc(c, "all");
    obx_counter_inc(c, (const char *)arg);
    obx_histogram_observe(h, 0.2);
    obx_gauge_add(g, 1);
  }
  return NULL;
}

static void test_threads(void **state) {
  pthread_t th[THREADS];
  static const char *names[THREADS] = {"a", "b", "c", "d"};
  for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, hammer, (void *)names[i]);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  obx_counter_t *c = obx_metrics_counter("t_race_total", "Race", "who");
  double all = obx_metrics_value(c, "all");
  if (all != THREADS * PER_THREAD) fail_msg("all: got %.0f want %d", all, THREADS * PER_THREAD);
  for (int i = 0; i < THREADS; i++) assert_true(obx_metrics_value(c, names[i]) == PER_THREAD);
  assert_true(obx_metrics_value(obx_metrics_gauge("t_race_gauge", "Race", NULL)) == THREADS * PER_THREAD);
  char *text = obx_metrics_render(NULL);
  char want[128];
  snprintf(want, sizeof want, "t_race_seconds_count %d\n", THREADS * PER_THREAD);
  assert_contains(text, want);
  snprintf(want, sizeof want, "t_race_seconds_bucket{le=\"0.1\"} 0\nt_race_seconds_bucket{le=\"0.25\"} %d\n", THREADS * PER_THREAD);
  assert_contains(text, want);
  free(text);
}

/* Each misuse must abort the process (bugs are not errors). Run in a child. */
static void misuse(int which) {
  static const double bad_bounds[] = {1, 0.5};
  switch (which) {
  case 0: obx_metrics_counter("1starts_with_digit", "x", NULL); break;
  case 1: obx_metrics_counter("t_four", "x", "a,b,c,d"); break;
  case 2: obx_metrics_counter("t_kind", "x", NULL); obx_metrics_gauge("t_kind", "x", NULL); break;
  case 3: obx_metrics_counter("t_lbl", "x", "a"); obx_metrics_counter("t_lbl", "x", "b"); break;
  case 4: obx_metrics_histogram("t_le", "x", "le", NULL, 0); break;
  case 5: obx_metrics_histogram("t_bounds", "x", NULL, bad_bounds, 2); break;
  case 6: obx_counter_add(obx_metrics_counter("t_neg", "x", NULL), -1); break;
  case 7: obx_metrics_counter("t_badlabel", "x", "bad-label"); break;
  case 8: obx_gauge_set(obx_metrics_counter("t_wrongop", "x", NULL), 1); break;
  }
}

static void test_misuse_aborts(void **state) {
  for (int which = 0; which <= 8; which++) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, STDERR_FILENO);
      misuse(which);
      _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT) fail_msg("misuse %d: got status %#x, want SIGABRT", which, status);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_counter_gauge_render),
    cmocka_unit_test(test_histogram_render),
    cmocka_unit_test(test_threads),
    cmocka_unit_test(test_misuse_aborts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
