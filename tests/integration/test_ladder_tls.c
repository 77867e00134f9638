/* test_ladder_tls.c - the retry ladder over amqps:// against a RabbitMQ TLS listener
 *
* The node is private (deleted with its queues at the end).
 * The group setup generates a CA, a server certificate for DNS name localhost (no IP SAN) and a
 * client certificate with the openssl CLI, and starts a private RabbitMQ node
 * (scripts/rabbitmq.sh, OBX_RMQ_CONF_EXTRA) whose TLS listener verifies clients
 * (verify_peer, fail_if_no_peer_cert). Then:
 *   - a message published to a retry tier over TLS dead-letters into the work queue and the
 *     work-queue consumer, over TLS too, receives it;
 *   - the settings matter: the system CA bundle (no amqp.ca_file) fails the handshake, a host
 *     name the certificate does not carry (127.0.0.1) fails unless amqp.verify_hostname=false,
 *     no client certificate is refused by the broker; each failure is retriable (a connection
 *     problem), never a crash. */
#include "obx_test.h"
#include "obx/obx_ladder.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256], node_dir[300], ca[300], cert[300], key[300], ccert[300], ckey[300];
static int tls_port;
static bool started;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static bool make_certs(void) {
  snprintf(ca, sizeof ca, "%s/ca.pem", dir);
  snprintf(cert, sizeof cert, "%s/server.pem", dir);
  snprintf(key, sizeof key, "%s/server.key", dir);
  snprintf(ccert, sizeof ccert, "%s/client.pem", dir);
  snprintf(ckey, sizeof ckey, "%s/client.key", dir);
  return obx_test_shf("cd %s && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=outboxd-test-ca "
            "-keyout ca.key -out ca.pem >/dev/null 2>&1", dir) &&
         obx_test_shf("cd %s && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr "
            ">/dev/null 2>&1 && printf 'subjectAltName=DNS:localhost\\n' >server.ext && "
            "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext "
            "-out server.pem >/dev/null 2>&1", dir) &&
         obx_test_shf("cd %s && openssl req -newkey rsa:2048 -nodes -subj /CN=outboxd -keyout client.key -out client.csr "
            ">/dev/null 2>&1 && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
            "-out client.pem >/dev/null 2>&1 && chmod 644 *.pem *.key", dir);
}

static bool tls_port_open(void *unused) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)tls_port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static int group_setup(void **state) {
  if (system("command -v openssl >/dev/null 2>&1") != 0) return 0; /* the test reports it */
  /* the node runs as the rabbitmq user when root: everything under a world-readable dir */
  snprintf(dir, sizeof dir, "/tmp/obx-tls-%d", (int)getpid());
  mkdir(dir, 0755);
  chmod(dir, 0755);
  snprintf(node_dir, sizeof node_dir, "%s/node", dir);
  if (!make_certs()) return -1;
  tls_port = free_port();
  char extra[2048];
  snprintf(extra, sizeof extra,
           "listeners.ssl.default = 127.0.0.1:%d\n"
           "ssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\n"
           "ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true",
           tls_port, ca, cert, key);
  setenv("OBX_RMQ_CONF_EXTRA", extra, 1);
  started = obx_test_shf("OBX_RMQ_DIR=%s %s/scripts/rabbitmq.sh start >%s/start.log 2>&1", node_dir, OBX_SOURCE_DIR, dir);
  unsetenv("OBX_RMQ_CONF_EXTRA");
  if (!started) obx_test_shf("cat %s/start.log >&2", dir);
  /* the TLS listener may open a moment after the AMQP one rabbitmq.sh waited for */
  if (started && !obx_test_wait_for(tls_port_open, NULL, 30000, 50)) {
    fprintf(stderr, "the TLS listener on %d never opened; node logs in %s/log\n", tls_port, node_dir);
    return -1;
  }
  return started ? 0 : -1;
}

static int group_teardown(void **state) {
  if (started) obx_test_shf("OBX_RMQ_DIR=%s %s/scripts/rabbitmq.sh stop >/dev/null 2>&1", node_dir, OBX_SOURCE_DIR);
  if (dir[0]) obx_test_shf("rm -rf %s", dir);
  return 0;
}

static void opts_for(obx_ladder_opts_t *o, char *url, size_t urllen, const char *host, const char *prefix,
                     const int64_t *tiers) {
  snprintf(url, urllen, "amqps://guest:guest@%s:%d/%%2F", host, tls_port);
  *o = (obx_ladder_opts_t){.url = url, .prefix = prefix, .tiers_ms = tiers, .ntiers = 1, .confirm_timeout_ms = 5000};
  o->amqp.ca_file = ca;
  o->amqp.cert_file = ccert;
  o->amqp.key_file = ckey;
}

static void test_ladder_over_tls(void **state) {
  obx_test_require(started, "openssl CLI and a RabbitMQ TLS listener");
  static const int64_t tiers[] = {200};
  char url[256], prefix[64];
  snprintf(prefix, sizeof prefix, "tls.%d", (int)getpid());
  obx_ladder_opts_t o;
  opts_for(&o, url, sizeof url, "localhost", prefix, tiers);
  obx_err_t err = OBX_ERR_INIT;
  obx_ladder_t *ladder = obx_ladder_new(&o, &err);
  assert_non_null(ladder);
  if (!obx_ladder_connect(ladder, &err)) fail_msg("connect over TLS: %s", err.msg);
  obx_ladder_consumer_t *consumer = obx_ladder_consumer_new(&o, 1, &err);
  assert_non_null(consumer);
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  obx_envelope_from_record(&msg, "tls-event-1", "K", 1, "{\"over\":\"tls\"}", 14, NULL, 0);
  obx_envelope_fail(&msg, "transient", "503 from the ERP", 0);
  if (!obx_ladder_publish_retry(ladder, &msg, 0, &err)) fail_msg("publish to the tier over TLS: %s", err.msg);
  obx_envelope_cleanup(&msg);
  bool got = false;
  int64_t deadline = obx_test_now_ms() + 30000;
  obx_envelope_t in;
  obx_envelope_init(&in);
  while (!got && obx_test_now_ms() < deadline)
    if (!obx_ladder_consumer_next(consumer, &in, 500, &got, &err)) fail_msg("consume over TLS: %s", err.msg);
  if (!got) fail_msg("the message never came back from the 200 ms tier over TLS");
  assert_string_equal(in.message_id, "tls-event-1");
  assert_int_equal(in.attempt, 1);
  assert_true(obx_ladder_consumer_ack(consumer, &in, &err));
  obx_envelope_cleanup(&in);
  obx_ladder_consumer_destroy(consumer);
  obx_ladder_destroy(ladder);
}

static void test_tls_settings_are_enforced(void **state) {
  obx_test_require(started, "openssl CLI and a RabbitMQ TLS listener");
  static const int64_t tiers[] = {200};
  static const struct {
    const char *name, *host;
    bool system_ca, no_verify_hostname, no_client_cert;
    bool want_ok;
  } cases[] = {
    {"all set", "localhost", false, false, false, true},
    {"system CA bundle", "localhost", true, false, false, false},
    {"host name not in the certificate", "127.0.0.1", false, false, false, false},
    {"host name check off", "127.0.0.1", false, true, false, true},
    {"no client certificate", "localhost", false, false, true, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char url[256], prefix[64];
    snprintf(prefix, sizeof prefix, "tlsset.%d.%zu", (int)getpid(), i);
    obx_ladder_opts_t o;
    opts_for(&o, url, sizeof url, cases[i].host, prefix, tiers);
    if (cases[i].system_ca) o.amqp.ca_file = NULL;
    o.amqp.no_verify_hostname = cases[i].no_verify_hostname;
    if (cases[i].no_client_cert) o.amqp.cert_file = o.amqp.key_file = NULL;
    obx_err_t err = OBX_ERR_INIT;
    obx_ladder_t *ladder = obx_ladder_new(&o, &err);
    assert_non_null(ladder);
    bool ok = obx_ladder_connect(ladder, &err);
    if (ok != cases[i].want_ok) fail_msg("%s: connect got %d (%s), want %d", cases[i].name, ok, err.msg, cases[i].want_ok);
    if (!ok && !err.retriable) fail_msg("%s: a TLS failure must be retriable: %s", cases[i].name, err.msg);
    printf("# %s: %s\n", cases[i].name, ok ? "connected" : err.msg);
    obx_ladder_destroy(ladder);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_ladder_over_tls),
    cmocka_unit_test(test_tls_settings_are_enforced),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
