/* test_worker_offsets.c - contiguous offset commits per partition (src/worker/offsets.c) */
#include <stdlib.h>
#include <string.h>

#include "obx_test.h"
#include "../../src/worker/worker_int.h"

typedef struct {
  char op;           /* 'a' add, 'd' done, 'c' advance and compare */
  int32_t partition;
  int64_t offset;    /* add/done: the offset; 'c': the expected commit point (-1 none) */
} step_t;

static int64_t commit_point(worker_offsets_t *o, int32_t partition) {
  int32_t parts[8];
  int64_t next[8];
  int n = worker_offsets_advance(o, parts, next, 8);
  for (int i = 0; i < n; i++)
    if (parts[i] == partition) return next[i];
  return -1;
}

static void run_steps(const char *name, const step_t *steps, size_t nsteps) {
  worker_offsets_t o;
  memset(&o, 0, sizeof o);
  for (size_t i = 0; i < nsteps; i++) {
    const step_t *s = &steps[i];
    if (s->op == 'a') worker_offsets_add(&o, s->partition, s->offset);
    else if (s->op == 'd') worker_offsets_done(&o, s->partition, s->offset);
    else {
      int64_t got = commit_point(&o, s->partition);
      if (got != s->offset)
        fail_msg("%s, step %zu: commit point of partition %d: got %lld, want %lld", name, i, s->partition,
                 (long long)got, (long long)s->offset);
    }
  }
  worker_offsets_clear(&o);
}

static void test_only_contiguous_prefixes_commit(void **state) {
  const step_t steps[] = {
    {'a', 0, 5}, {'a', 0, 6}, {'a', 0, 7}, {'a', 0, 8}, {'a', 1, 100}, {'a', 1, 101},
    {'d', 0, 7}, {'c', 0, -1},  /* 5 and 6 unfinished: nothing */
    {'d', 0, 5}, {'c', 0, 6},   /* 5 done: commit 6 */
    {'c', 0, -1},               /* unchanged: nothing new */
    {'d', 0, 6}, {'c', 0, 8},   /* 6 and 7: commit 8 */
    {'d', 1, 101}, {'c', 1, -1},
    {'d', 1, 100}, {'c', 1, 102},
    {'d', 0, 42}, {'d', 9, 1}, {'c', 0, -1}, /* unknown offsets and partitions are ignored */
    {'d', 0, 8}, {'c', 0, 9},
  };
  run_steps("prefixes", steps, sizeof steps / sizeof steps[0]);
}

static void test_going_back_starts_over(void **state) {
  const step_t steps[] = {
    {'a', 2, 10}, {'a', 2, 11}, {'d', 2, 11},
    {'a', 2, 3},  /* a seek back: 10 and 11 will be read again */
    {'d', 2, 10}, {'c', 2, -1},
    {'d', 2, 3},  {'c', 2, 4},
  };
  run_steps("seek back", steps, sizeof steps / sizeof steps[0]);
}

static void test_points_repeat_the_current_commits(void **state) {
  worker_offsets_t o;
  memset(&o, 0, sizeof o);
  int32_t parts[4];
  int64_t next[4];
  worker_offsets_add(&o, 0, 1);
  worker_offsets_add(&o, 3, 7);
  assert_int_equal(worker_offsets_points(&o, parts, next, 4), 0); /* nothing committed yet */
  worker_offsets_done(&o, 3, 7);
  assert_int_equal(worker_offsets_advance(&o, parts, next, 4), 1);
  assert_int_equal(worker_offsets_advance(&o, parts, next, 4), 0);
  int n = worker_offsets_points(&o, parts, next, 4); /* still there for a repeat */
  assert_int_equal(n, 1);
  assert_int_equal(parts[0], 3);
  assert_int_equal(next[0], 8);
  worker_offsets_clear(&o);
}

/* Many offsets, finished in reverse order within windows: the storage grows and compacts. */
static void test_long_runs_compact(void **state) {
  worker_offsets_t o;
  memset(&o, 0, sizeof o);
  int64_t next_add = 0, committed = -1;
  for (int round = 0; round < 50; round++) {
    for (int i = 0; i < 37; i++) worker_offsets_add(&o, 0, next_add++);
    for (int64_t off = next_add - 1; off >= next_add - 37; off--) worker_offsets_done(&o, 0, off);
    int64_t got = commit_point(&o, 0);
    if (got != next_add) fail_msg("round %d: got %lld, want %lld", round, (long long)got, (long long)next_add);
    committed = got;
    assert_true(worker_offsets_idle(&o));
  }
  assert_int_equal(committed, 50 * 37);
  worker_offsets_add(&o, 0, next_add);
  assert_false(worker_offsets_idle(&o));
  worker_offsets_clear(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_only_contiguous_prefixes_commit),
    cmocka_unit_test(test_going_back_starts_over),
    cmocka_unit_test(test_points_repeat_the_current_commits),
    cmocka_unit_test(test_long_runs_compact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
