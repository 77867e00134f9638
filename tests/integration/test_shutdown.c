/* test_shutdown.c - SIGTERM ends within shutdown.grace whatever is gone
 *
 * Each case starts outboxd with every role against its own devmongod and a topic of its own on
 * a real Kafka broker - the run's (OBX_TEST_KAFKA_DIR), or a private one when the case takes
 * Kafka away - (and the test RabbitMQ, or a closed port), waits until it is ready and the roles
 * run, then takes a service away - devmongod paused with SIGSTOP (a hung MongoDB: connections
 * open, nothing answers), the private broker killed (SIGKILL), RabbitMQ unreachable - and sends
 * SIGTERM. outboxd must exit
 * within its grace plus a small allowance for process exit, whether the roles finished their stop
 * (exit 0, "outboxd stopped") or the grace ran out (exit 3, the stage it was in named in the
 * log). A second signal during the stop exits at once. */
#include "obx_test.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GRACE_MS 3000
#define EXIT_ALLOWANCE_MS 1500 /* from the grace running out to the process being reaped */

typedef enum { GONE_MONGO_PAUSED, GONE_KAFKA, GONE_RABBITMQ, GONE_ALL } gone_t;

typedef struct {
  obx_test_mongo_t mongo;
  obx_test_broker_t kafka; /* private (kafka.own) when the case takes it away */
  char topic[128];
  obx_test_outboxd_t d;
  char log_path[256];
} fixture_t;

/* /readyz answers 503 naming RabbitMQ: every role runs, the worker waits for the broker. */
static bool ready_but_rabbitmq(void *port) {
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(*(int *)port, "GET", "/readyz", NULL, NULL, NULL, &resp) && resp.status == 503 &&
            strstr(resp.body, "RabbitMQ");
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

static void start_all(fixture_t *fx, bool rabbitmq_reachable, bool private_kafka) {
  memset(fx, 0, sizeof *fx);
  if (private_kafka) assert_true(obx_test_broker_start(&fx->kafka));
  else obx_test_require(obx_test_broker_shared(&fx->kafka), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)");
  assert_true(obx_test_broker_topic(&fx->kafka, "shutdown", 2, NULL, fx->topic, sizeof fx->topic));
  assert_true(obx_test_mongo_start(&fx->mongo, NULL));
  char mongo_arg[300], kafka_arg[600], topic_arg[160], group_arg[160], amqp_arg[600], prefix_arg[100], grace_arg[64];
  /* a group of the case's own: a member the previous case left behind (killed, no goodbye)
   * would hold up this one's rebalance until its session expired */
  char group[128];
  obx_test_broker_group("shutdown", group, sizeof group);
  snprintf(group_arg, sizeof group_arg, "worker.group=%s", group);
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", fx->mongo.uri);
  snprintf(kafka_arg, sizeof kafka_arg, "kafka.brokers=%s", fx->kafka.bootstrap);
  snprintf(topic_arg, sizeof topic_arg, "kafka.topic=%s", fx->topic);
  const char *amqp = rabbitmq_reachable && getenv("AMQP_URL") ? getenv("AMQP_URL") : "amqp://guest:guest@127.0.0.1:1/";
  snprintf(amqp_arg, sizeof amqp_arg, "amqp.url=%s", amqp);
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=shutdown.%d", (int)getpid());
  snprintf(grace_arg, sizeof grace_arg, "shutdown.grace=%dms", GRACE_MS);
  char *args[] = {"-X", mongo_arg, "-X", kafka_arg, "-X", topic_arg, "-X", group_arg, "-X", amqp_arg, "-X", prefix_arg, "-X", grace_arg, NULL};
  assert_true(obx_test_outboxd_start(&fx->d, args));
  snprintf(fx->log_path, sizeof fx->log_path, "%s", fx->d.proc.log_path);
  if (!obx_test_wait_for(rabbitmq_reachable ? obx_test_http_ready : ready_but_rabbitmq, &fx->d.port, 60000, 50))
    fail_msg("outboxd never became ready (without RabbitMQ: ready but for the worker's broker); log %s", fx->log_path);
  assert_true(obx_test_file_contains(fx->log_path, "outboxd running", 30000));
}

static void stop_all(fixture_t *fx) {
  obx_test_proc_stop(&fx->d.proc, SIGKILL, 1000);
  if (fx->mongo.proc.pid) kill(fx->mongo.proc.pid, SIGCONT);
  obx_test_mongo_stop(&fx->mongo);
  obx_test_broker_stop(&fx->kafka);
}

/* SIGTERM, then waits for the exit; returns the wait status and the time taken. */
static int sigterm_and_time(fixture_t *fx, int64_t *took_ms) {
  int64_t t0 = obx_test_now_ms();
  int status = obx_test_proc_stop(&fx->d.proc, SIGTERM, GRACE_MS + 20000);
  *took_ms = obx_test_now_ms() - t0;
  return status;
}

static void run_case(gone_t gone, const char *name) {
  fixture_t fx;
  bool want_rabbit = gone != GONE_RABBITMQ && gone != GONE_ALL;
  if (want_rabbit) obx_test_require(getenv("AMQP_URL") != NULL, "AMQP_URL (scripts/rabbitmq.sh start)");
  bool kafka_gone = gone == GONE_KAFKA || gone == GONE_ALL;
  start_all(&fx, want_rabbit, kafka_gone);
  if (gone == GONE_MONGO_PAUSED || gone == GONE_ALL) assert_int_equal(kill(fx.mongo.proc.pid, SIGSTOP), 0);
  if (kafka_gone) assert_true(obx_test_broker_signal(&fx.kafka, SIGKILL));
  /* an order in flight against the hung MongoDB: the API's request must not hold the stop */
  int64_t took;
  int status = sigterm_and_time(&fx, &took);
  bool exited = WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3);
  bool explained = obx_test_file_contains(fx.log_path, "outboxd stopped", 0) ||
                   obx_test_file_contains(fx.log_path, "shutdown grace", 0);
  printf("# %s: SIGTERM to exit %lld ms (grace %d ms), exit %d\n", name, (long long)took, GRACE_MS,
         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  if (!exited || !explained || took > GRACE_MS + EXIT_ALLOWANCE_MS) {
    print_error("%s: got wait status %d after %lld ms, want exit 0 or 3 within %d ms with the reason logged; log %s\n",
                name, status, (long long)took, GRACE_MS + EXIT_ALLOWANCE_MS, fx.log_path);
    stop_all(&fx);
    fail();
  }
  stop_all(&fx);
}

static void test_mongo_paused(void **state) { run_case(GONE_MONGO_PAUSED, "MongoDB paused"); }
static void test_kafka_gone(void **state) { run_case(GONE_KAFKA, "Kafka gone"); }
static void test_rabbitmq_gone(void **state) { run_case(GONE_RABBITMQ, "RabbitMQ unreachable"); }
static void test_everything_gone(void **state) { run_case(GONE_ALL, "MongoDB paused, Kafka and RabbitMQ gone"); }

/* A second SIGTERM while the first stop waits on the hung MongoDB ends the process at once. */
static void test_second_signal_exits_at_once(void **state) {
  fixture_t fx;
  start_all(&fx, false, false);
  assert_int_equal(kill(fx.mongo.proc.pid, SIGSTOP), 0);
  kill(fx.d.proc.pid, SIGTERM);
  assert_true(obx_test_file_contains(fx.log_path, "stopping", 5000));
  int64_t t0 = obx_test_now_ms();
  kill(fx.d.proc.pid, SIGTERM);
  pid_t pid = fx.d.proc.pid;
  bool gone = obx_test_wait_for(obx_test_pid_gone, &pid, GRACE_MS + EXIT_ALLOWANCE_MS, 10);
  int64_t took = obx_test_now_ms() - t0;
  printf("# second signal to exit: %lld ms\n", (long long)took);
  if (!gone || took > 1000) {
    stop_all(&fx);
    fail_msg("outboxd ran %lld ms after the second SIGTERM (want < 1000 ms); log %s", (long long)took, fx.log_path);
  }
  stop_all(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_mongo_paused),
    cmocka_unit_test(test_kafka_gone),
    cmocka_unit_test(test_rabbitmq_gone),
    cmocka_unit_test(test_everything_gone),
    cmocka_unit_test(test_second_signal_exits_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
