/* test_ladder_restart.c - messages in the retry tiers reach the work queue at their TTL across a
 * RabbitMQ restart, against a private RabbitMQ node of the test's own (scripts/rabbitmq.sh with
 * its own OBX_RMQ_DIR: the shared node of the run is never restarted)
 *
 * test_tiers_drain_after_restart: LADDERS topologies (prefixes of their own) each get a message
 * in their tier; the node is stopped before the TTL and started again on its port; every
 * message must be in its work queue within RESTART_BOUND_MS of max(its TTL, the node being
 * back), polled with a deadline. RabbitMQ 3.10 recovers a vhost's quorum queues before its
 * exchanges (rabbit_vhost:recover): a tier whose leader comes back and expires its message
 * before the exchanges are recovered finds its dead-letter exchange missing (the log says
 * "Cannot forward any dead-letter messages ... does not exist"; a named exchange instead of the
 * default one fails the same way), keeps the message, and tries again only after the node's
 * dead_letter_worker_publisher_confirm_timeout: RabbitMQ's default 180 s fails this test, the 5 s
 * scripts/rabbitmq.sh sets passes it. Many tiers make the race happen on every run (measured:
 * 2 to 5 of 50 tiers per restart); the test prints how many met it. The worker does not rely on
 * the setting (its retry sweep republishes an overdue retry: test_worker_retrysweep); this test
 * pins what the broker itself does with it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "obx/obx_ladder.h"
#include "obx_test.h"

/* Once the node is back and the TTL has passed, every message is in its work queue within this. */
#define RESTART_BOUND_MS 20000
#define LADDERS 50
#define TTL_MS 6000

static char dir[256], node_dir[300], url[512];
static bool started;

/* The first start picks a free port; a restart takes the same one (what the ladders' URL names). */
static bool node_start(void) {
  char port[32] = "";
  const char *at = url[0] ? strrchr(url, ':') : NULL;
  if (at) snprintf(port, sizeof port, "OBX_RMQ_PORT=%d", atoi(at + 1));
  return obx_test_shf("%s OBX_RMQ_DIR=%s %s/scripts/rabbitmq.sh start >>%s/node.log 2>&1", port, node_dir, OBX_SOURCE_DIR, dir);
}

static bool node_stop(void) {
  return obx_test_shf("OBX_RMQ_DIR=%s %s/scripts/rabbitmq.sh stop >>%s/node.log 2>&1", node_dir, OBX_SOURCE_DIR, dir);
}

/* AMQP_URL from the node's env file ("export AMQP_URL=..."). */
static bool read_url(void) {
  char path[400], line[600];
  snprintf(path, sizeof path, "%s/env", node_dir);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool found = false;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "AMQP_URL=");
    if (!p) continue;
    snprintf(url, sizeof url, "%.*s", (int)strcspn(p + 9, "\r\n"), p + 9);
    found = true;
  }
  fclose(f);
  return found;
}

static int group_setup(void **state) {
  (void)state;
  /* the node runs as the rabbitmq user when root: everything under a world-readable dir */
  snprintf(dir, sizeof dir, "/tmp/obx-rmqrestart-%d", (int)getpid());
  mkdir(dir, 0755);
  chmod(dir, 0755);
  snprintf(node_dir, sizeof node_dir, "%s/node", dir);
  started = node_start() && read_url();
  if (!started) obx_test_shf("cat %s/node.log >&2", dir);
  return started ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  if (started) node_stop();
  if (dir[0]) obx_test_shf("rm -rf %s", dir);
  return 0;
}

typedef struct {
  obx_ladder_t *ladders[LADDERS];
  bool arrived[LADDERS];
  int narrived;
} ladders_t;

static bool all_arrived(void *p) {
  ladders_t *l = p;
  for (int i = 0; i < LADDERS; i++) {
    if (l->arrived[i]) continue;
    uint32_t depth = 0;
    obx_err_t err = OBX_ERR_INIT;
    if (obx_ladder_queue_depth(l->ladders[i], obx_ladder_work_queue(l->ladders[i]), &depth, &err) && depth >= 1) {
      l->arrived[i] = true;
      l->narrived++;
    }
  }
  return l->narrived == LADDERS;
}

static void test_tiers_drain_after_restart(void **state) {
  (void)state;
  static const int64_t tiers[] = {TTL_MS};
  ladders_t l = {0};
  obx_err_t err = OBX_ERR_INIT;
  int64_t first = 0;
  for (int i = 0; i < LADDERS; i++) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "restart.%d.%d", (int)getpid(), i);
    obx_ladder_opts_t o = {.url = url, .prefix = prefix, .tiers_ms = tiers, .ntiers = 1, .confirm_timeout_ms = 10000};
    l.ladders[i] = obx_ladder_new(&o, &err);
    if (!l.ladders[i]) fail_msg("obx_ladder_new: %s", err.msg);
    obx_envelope_t msg;
    obx_ce_header_t h[] = {{"ce_id", "restart-1", 9}, {"ce_type", "OrderConfirmed", 14}};
    obx_envelope_init(&msg);
    obx_envelope_from_record(&msg, "restart-1", "k", 1, "{}", 2, h, 2);
    obx_envelope_fail(&msg, "transient", "test", obx_test_now_ms());
    if (!obx_ladder_publish_retry(l.ladders[i], &msg, 0, &err)) fail_msg("publish to tier %d: %s", i, err.msg);
    if (i == 0) first = obx_test_now_ms();
    obx_envelope_cleanup(&msg);
  }
  int64_t published = obx_test_now_ms();

  assert_true(node_stop());
  int64_t stopped = obx_test_now_ms();
  assert_true(node_start());
  int64_t back = obx_test_now_ms();
  int64_t due = published + TTL_MS > back ? published + TTL_MS : back;
  printf("published %d in %lld ms; node stopped after %lld ms, back after %lld ms (TTL %d ms)\n", LADDERS,
         (long long)(published - first), (long long)(stopped - published), (long long)(back - published), TTL_MS);

  int64_t budget = due + RESTART_BOUND_MS - obx_test_now_ms();
  bool arrived = obx_test_wait_for(all_arrived, &l, (int)(budget > 0 ? budget : 1), 200);
  int64_t at = obx_test_now_ms();
  if (!arrived) {
    obx_test_shf("grep -rh 'Cannot forward' %s/log | cut -c1-240 >&2", node_dir);
    fail_msg("%d of %d tier messages were not in their work queue %d ms after they were due", LADDERS - l.narrived,
             LADDERS, RESTART_BOUND_MS);
  }
  printf("all %d in their work queue %lld ms after they were due; tiers that met the race:\n", LADDERS,
         (long long)(at - due));
  fflush(stdout);
  obx_test_shf("grep -rh 'Cannot forward' %s/log | wc -l", node_dir);
  for (int i = 0; i < LADDERS; i++) obx_ladder_destroy(l.ladders[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiers_drain_after_restart)};
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
