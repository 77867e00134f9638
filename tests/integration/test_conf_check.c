/* test_conf_check.c - one start-up validation: `outboxctl conf check` and outboxd refuse the same
 * configurations with the same message, naming the key, the value and what is allowed
 *
 * No services are needed: the validation never connects, and outboxd stops before starting
 * anything when it fails. */
#include "obx_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The text after `marker` on the first line containing it, without the newline. */
static bool line_after(const char *path, const char *marker, char *out, size_t outlen) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char line[2048];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    char *p = strstr(line, marker);
    if (!p) continue;
    p += strlen(marker);
    p[strcspn(p, "\r\n")] = '\0';
    snprintf(out, outlen, "%s", p);
    found = true;
  }
  fclose(f);
  return found;
}

static void test_refusals(void **state) {
  char keys_missing[512];
  snprintf(keys_missing, sizeof keys_missing, "api.keys_file=%s/no-such-keys-file", obx_test_tmpdir());
  static const struct {
    const char *name;
    const char *setting;
    const char *want[3]; /* key, value, what is allowed */
  } cases[] = {
    {"lowercase currency", "api.default_currency=usd", {"api.default_currency", "=usd", "ISO 4217"}},
    {"bad CIDR", "egress.allow_networks=10.0.0.0/33", {"egress.allow_networks", "10.0.0.0/33", "CIDRs"}},
    {"missing keys file", NULL, {"api.keys_file", "no-such-keys-file", "a readable file"}},
    {"mongo uri not a uri", "mongo.uri=notauri", {"mongo.uri", "=notauri", "mongodb://"}},
    {"bind with a port", "http.bind=localhost:8080", {"http.bind", "=localhost:8080", "IPv4 or IPv6 address"}},
    {"bind a name", "http.bind=everywhere", {"http.bind", "=everywhere", "IPv4 or IPv6 address"}},
    {"CORS origin without scheme", "api.cors_origins=app.example.com", {"api.cors_origins", "=app.example.com", "scheme://host"}},
    {"CORS origin with path", "api.cors_origins=https://a.example.com/app", {"api.cors_origins", "/app", "no path"}},
    {"unknown kafka key", "kafka.no.such.property=1", {"kafka.no.such.property", "=1", "librdkafka property"}},
    {"bad kafka value", "kafka.acks=several", {"kafka.acks", "=several", "librdkafka property"}},
    {"descending ladder", "RETRY_LADDER=30s,5s", {"RETRY_LADDER=", "30s,5s", "strictly increasing"}},
    {"duplicated ladder", "RETRY_LADDER=5s,5s,1m", {"RETRY_LADDER=", "5s,5s,1m", "strictly increasing"}},
    {"gappy ladder", "RETRY_LADDER=5s,,30s", {"RETRY_LADDER=", "5s,,30s", "increasing durations"}},
    {"trailing comma ladder", "RETRY_LADDER=5s,30s,", {"RETRY_LADDER=", "5s,30s,", "increasing durations"}},
    {"empty KAFKA_BROKERS", "KAFKA_BROKERS=", {"kafka.brokers", "KAFKA_BROKERS) is empty", "a value is required"}},
    {"KAFKA_BROKERS without port", "KAFKA_BROKERS=kafka-0", {"kafka.brokers", "=kafka-0", "host:port"}},
    {"empty MONGO_DB", "MONGO_DB=", {"mongo.db", "MONGO_DB) is empty", "a value is required"}},
    {"MONGO_DB with a dot", "MONGO_DB=a.b", {"mongo.db", "=a.b", "database name"}},
    {"empty KAFKA_TOPIC", "KAFKA_TOPIC=", {"kafka.topic", "KAFKA_TOPIC) is empty", "a value is required"}},
    {"empty WORKER_GROUP", "WORKER_GROUP=", {"worker.group", "WORKER_GROUP) is empty", "a value is required"}},
    {"empty WORKER_QUEUE_PREFIX", "WORKER_QUEUE_PREFIX=", {"worker.queue_prefix", "WORKER_QUEUE_PREFIX) is empty", "a value is required"}},
    {"reserved queue prefix", "WORKER_QUEUE_PREFIX=amq.x", {"worker.queue_prefix", "=amq.x", "amq."}},
    {"bad AMQP url", "AMQP_URL=rabbit:5672", {"amqp.url", "***", "amqp://user:pass@host"}},
    {"heartbeat not whole seconds", "amqp.heartbeat=1500ms", {"amqp.heartbeat", "=1500ms", "whole seconds"}},
    {"missing AMQP CA", "amqp.ca_file=/nonexistent/ca.pem", {"amqp.ca_file", "/nonexistent/ca.pem", "readable PEM"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *setting = (char *)(cases[i].setting ? cases[i].setting : keys_missing);
    char *ctl_args[] = {"conf", "check", "-X", setting, NULL};
    char *d_args[] = {"-X", setting, "-X", "http.port=0", NULL};
    obx_test_proc_t ctl, d;
    int ctl_exit = obx_test_run("outboxctl", ctl_args, 30000, &ctl);
    int d_exit = obx_test_run("outboxd", d_args, 30000, &d);
    char ctl_msg[1024] = "", d_msg[1024] = "";
    line_after(ctl.log_path, "outboxctl: configuration: ", ctl_msg, sizeof ctl_msg);
    line_after(d.log_path, "outboxd: ", d_msg, sizeof d_msg);
    bool named = ctl_msg[0] != '\0';
    for (int w = 0; w < 3; w++) named = named && strstr(ctl_msg, cases[i].want[w]);
    if (ctl_exit != 2 || d_exit != 1 || !named || strcmp(ctl_msg, d_msg) != 0) {
      print_error("%s (-X %s): conf check exit %d \"%s\"; outboxd exit %d \"%s\"; want exits 2 and 1 with the same "
                  "message naming \"%s\", \"%s\", \"%s\"\n",
                  cases[i].name, setting, ctl_exit, ctl_msg, d_exit, d_msg, cases[i].want[0], cases[i].want[1],
                  cases[i].want[2]);
      fail();
    }
    unlink(ctl.log_path);
    unlink(d.log_path);
  }
}

/* The defaults and a production-like configuration pass the check (it refuses only what it must). */
static void test_valid_configurations_pass(void **state) {
  char *sets[][12] = {
    {"conf", "check", NULL},
    {"conf", "check", "-X", "KAFKA_BROKERS=SSL://kafka-0:9093,kafka-1:9093", "-X", "kafka.security.protocol=SASL_SSL",
     "-X", "RETRY_LADDER=1s,10s,1m", "-X", "api.cors_origins=https://app.example.com,http://localhost:3000", NULL},
    {"conf", "check", "-X", "AMQP_URL=amqps://u:p@rabbit.example.com/prod", "-X", "egress.allow_networks=10.0.0.0/8",
     "-X", "http.bind=::", "-X", "amqp.heartbeat=0", NULL},
  };
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
    obx_test_proc_t ctl;
    int rc = obx_test_run("outboxctl", sets[i], 30000, &ctl);
    if (rc != 0) {
      print_error("set %zu: conf check exit %d, want 0; output %s\n", i, rc, ctl.log_path);
      fail();
    }
    unlink(ctl.log_path);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_refusals),
    cmocka_unit_test(test_valid_configurations_pass),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
