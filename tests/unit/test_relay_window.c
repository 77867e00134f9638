/* test_relay_window.c - the relay's checkpoint window and publish backoff
 *
 * DESIGN: drives the window of src/relay/stream.c the way the stream and the delivery reports
 * do (push a slot per change, mark slots done in any order) and checks after every step that
 * the checkpoint sits exactly at the end of the done prefix: never past an event whose outcome
 * is not recorded. Tokens are {n: <change number>}. */
#include <stdio.h>
#include <string.h>

#include "../../src/relay/relay_int.h"
#include "obx_test.h"

static bson_t *token(int n) {
  return BCON_NEW("n", BCON_INT32(n));
}

static int ckpt_of(const obx_relay_t *relay) {
  bson_iter_t it;
  if (!relay->ckpt_token || !bson_iter_init_find(&it, relay->ckpt_token, "n")) return -1;
  return bson_iter_int32(&it);
}

/* One step: 'I' pushes an in-flight change, 'D' a done one (skipped change or empty batch),
 * 'A' acks the in-flight change pushed as number `arg`. want = checkpoint after the step. */
typedef struct {
  char op;
  int arg;
  int want;
} step_t;

typedef struct {
  const char *name;
  step_t steps[16];
} script_t;

static const script_t scripts[] = {
  {"in order", {{'I', 0, -1}, {'I', 1, -1}, {'A', 0, 0}, {'A', 1, 1}, {0, 0, 0}}},
  {"acks out of order wait for the oldest",
   {{'I', 0, -1}, {'I', 1, -1}, {'I', 2, -1}, {'A', 2, -1}, {'A', 1, -1}, {'A', 0, 2}, {0, 0, 0}}},
  {"done slots on an empty window checkpoint at once", {{'D', 0, 0}, {'D', 1, 1}, {'I', 2, 1}, {'A', 2, 2}, {0, 0, 0}}},
  {"a skipped change behind an unacked one waits",
   {{'I', 0, -1}, {'D', 1, -1}, {'D', 2, -1}, {'I', 3, -1}, {'A', 0, 2}, {'A', 3, 3}, {0, 0, 0}}},
  {"an empty-batch token after in-flight events",
   {{'I', 0, -1}, {'I', 1, -1}, {'D', 2, -1}, {'A', 1, -1}, {'A', 0, 2}, {0, 0, 0}}},
};

static void test_checkpoint_never_passes_an_unrecorded_event(void **state) {
  obx_conf_t conf;
  memset(&conf, 0, sizeof conf);
  for (size_t s = 0; s < sizeof scripts / sizeof scripts[0]; s++) {
    obx_relay_t relay;
    memset(&relay, 0, sizeof relay);
    relay.conf = &conf;
    relay_window_init(&relay.window, 8);
    uint64_t seq_of[16] = {0};
    for (int i = 0; scripts[s].steps[i].op; i++) {
      const step_t *st = &scripts[s].steps[i];
      if (st->op == 'I') seq_of[st->arg] = relay_window_push(&relay, token(st->arg), st->arg, SLOT_INFLIGHT);
      else if (st->op == 'D') relay_window_push(&relay, token(st->arg), st->arg, SLOT_DONE);
      else relay_window_done(&relay, seq_of[st->arg]);
      int got = ckpt_of(&relay);
      if (got != st->want)
        fail_msg("%s, step %d (%c %d): checkpoint got %d want %d", scripts[s].name, i, st->op, st->arg, got, st->want);
      if (got >= 0 && relay.ckpt_cluster_s != got)
        fail_msg("%s, step %d: checkpoint cluster time got %lld want %d", scripts[s].name, i,
                 (long long)relay.ckpt_cluster_s, got);
    }
    relay_window_cleanup(&relay.window);
    bson_destroy(relay.ckpt_token);
  }
}

static void test_window_bound_and_reset(void **state) {
  obx_conf_t conf;
  memset(&conf, 0, sizeof conf);
  obx_relay_t relay;
  memset(&relay, 0, sizeof relay);
  relay.conf = &conf;
  relay_window_init(&relay.window, 4);
  int pushed = 0;
  while (!relay_window_full(&relay.window)) relay_window_push(&relay, token(pushed), pushed, SLOT_INFLIGHT), pushed++;
  assert_int_equal(pushed, 3); /* one slot stays free for the collapse of done slots */
  relay_window_reset(&relay);
  assert_false(relay_window_full(&relay.window));
  relay_window_done(&relay, 1); /* a report from before the reset is ignored */
  assert_int_equal(ckpt_of(&relay), -1);
  relay_window_cleanup(&relay.window);
}

static void test_backoff_doubles_to_a_cap(void **state) {
  static const struct { int32_t attempts; int64_t want; } cases[] = {
    {1, 1000}, {2, 2000}, {3, 4000}, {5, 16000}, {10, 512000}, {11, 600000}, {40, 600000},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t got = relay_backoff_ms(cases[i].attempts);
    if (got != cases[i].want) fail_msg("backoff(%d): got %lld want %lld", cases[i].attempts, (long long)got, (long long)cases[i].want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_checkpoint_never_passes_an_unrecorded_event),
    cmocka_unit_test(test_window_bound_and_reset),
    cmocka_unit_test(test_backoff_doubles_to_a_cap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
