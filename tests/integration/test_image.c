/* test_image.c - the container image scripts/image.sh builds, run with podman on the host network
 *
 * The group builds the image once from this build's binaries into a private container store
 * (scripts/image.sh build, OBX_IMAGE_STORE in the test's temp directory; podman and buildah are
 * pointed at it with `scripts/image.sh env`, so the machine's own store is never touched) and
 * removes the store at the end:
 *   test_reproducible   a second build into a fresh store gives the same image id; the image
 *                       stays under MAX_IMAGE_MIB; both build times are printed
 *   test_contents       the user is 10001:10001 (the manifests' runAsUser), the entrypoint is
 *                       outboxd, and the files are the CA bundle of this machine, the user in
 *                       /etc/passwd, no shell and no package manager
 *   test_version        outboxd and outboxctl print in the container what the built binaries
 *                       print; the tag and k8s/base's pinned newTag are that version
 *   test_serves         `outboxd --roles api,relay,worker` in the container against a devmongod,
 *                       the run's RabbitMQ (AMQP_URL) and Kafka broker (OBX_TEST_KAFKA_DIR): runs
 *                       as uid 10001, /healthz and /readyz answer 200, an order posted to its API
 *                       is read back from Kafka with its event id and type, the container's
 *                       worker records it in the inbox (SKIPPED: no pipeline), and SIGTERM to
 *                       `podman run` stops it with status 0 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "obx_test.h"
#include "obx_test_kafka.h"
#include "obx_test_mongo.h"
#include "obx_test_outboxd.h"

#define ORG "org-image"
#define MAX_IMAGE_MIB 80 /* binaries ~1 MiB, their libraries ~58 MiB (libicudata alone 30) */
#define IMAGE_UID "10001"
#define OUT_LEN 8192

static char store[300], ref[128], image_id[128];
static bool built;

/* ---- commands ---------------------------------------------------------------------------- */

/* Runs a printf-formatted shell command; stdout to out (NULL: dropped). Returns its status. */
static int sh(char *out, size_t outlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sh(char *out, size_t outlen, const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  return obx_test_sh(cmd, out, outlen);
}

static void chomp(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == ' ')) s[--n] = '\0';
}

/* scripts/image.sh build into dir (a container store); returns the build time in ms. */
static int64_t image_build(const char *dir) {
  char out[OUT_LEN];
  int64_t t0 = obx_test_now_ms();
  if (sh(out, sizeof out, "OBX_IMAGE_STORE='%s' '%s/scripts/image.sh' build '%s'", dir, OBX_SOURCE_DIR,
         OBX_BUILD_DIR) != 0)
    fail_msg("scripts/image.sh build failed: %s", out);
  int64_t ms = obx_test_now_ms() - t0;
  print_message("%s", out);
  return ms;
}

/* Points podman and buildah (in this process and its children) at store dir, as
 * `scripts/image.sh env` says: "export K=V K=V". */
static void store_use(const char *dir) {
  char out[OUT_LEN], *save = NULL;
  if (sh(out, sizeof out, "OBX_IMAGE_STORE='%s' '%s/scripts/image.sh' env", dir, OBX_SOURCE_DIR) != 0)
    fail_msg("scripts/image.sh env failed");
  chomp(out);
  if (strncmp(out, "export ", 7) != 0) fail_msg("scripts/image.sh env: got '%s', want export K=V...", out);
  for (char *kv = strtok_r(out + 7, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(kv, '=');
    if (!eq) fail_msg("scripts/image.sh env: '%s' is no K=V", kv);
    *eq = '\0';
    setenv(kv, eq + 1, 1);
  }
}

/* podman image inspect --format FORMAT of the image into out (trailing newline removed). */
static void inspect(const char *format, char *out, size_t outlen) {
  if (sh(out, outlen, "podman image inspect --format '%s' '%s'", format, ref) != 0)
    fail_msg("podman image inspect %s failed", ref);
  chomp(out);
}

/* The image of this build, built once for the group. */
static void image_need(void) {
  obx_test_require(obx_test_have(geteuid() == 0, "podman and buildah run as root here (not root)") &&
                     obx_test_have(access("/usr/bin/podman", X_OK) == 0 && access("/usr/bin/buildah", X_OK) == 0,
                                   "podman or buildah not installed (scripts/install-deps.sh)"),
                   "cannot build the image");
  if (built) return;
  snprintf(store, sizeof store, "%s/image-store", obx_test_tmpdir());
  int64_t ms = image_build(store);
  print_message("image build into an empty vfs store: %lld ms\n", (long long)ms);
  store_use(store);
  char out[OUT_LEN];
  if (sh(out, sizeof out, "OBX_IMAGE_STORE='%s' '%s/scripts/image.sh' ref '%s'", store, OBX_SOURCE_DIR,
         OBX_BUILD_DIR) != 0)
    fail_msg("scripts/image.sh ref failed");
  chomp(out);
  if (strlen(out) >= sizeof ref) fail_msg("scripts/image.sh ref: %zu bytes, more than an image reference", strlen(out));
  memcpy(ref, out, strlen(out) + 1);
  inspect("{{.Id}}", image_id, sizeof image_id);
  built = true;
}

static int group_teardown(void **state) {
  (void)state;
  if (store[0]) sh(NULL, 0, "rm -rf '%s'", store);
  return 0;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_reproducible(void **state) {
  image_need();
  char again[320], out[OUT_LEN];
  snprintf(again, sizeof again, "%s/image-store-again", obx_test_tmpdir());
  int64_t ms = image_build(again);
  print_message("image build again into an empty vfs store: %lld ms\n", (long long)ms);
  store_use(again);
  inspect("{{.Id}}", out, sizeof out);
  store_use(store);
  sh(NULL, 0, "rm -rf '%s'", again);
  if (strcmp(out, image_id) != 0) fail_msg("the same binaries built again: image id %s, want %s", out, image_id);

  inspect("{{.Size}}", out, sizeof out);
  long long mib = atoll(out) / (1024 * 1024);
  print_message("image %s: %lld MiB uncompressed\n", ref, mib);
  if (mib <= 0 || mib >= MAX_IMAGE_MIB) fail_msg("image size %lld MiB, want 1..%d", mib, MAX_IMAGE_MIB - 1);
}

/* The contents of one file of the image (podman image mount) into out; false when absent. */
static bool image_file(const char *root, const char *path, char *out, size_t outlen) {
  char full[1024];
  snprintf(full, sizeof full, "%s%s", root, path);
  FILE *f = fopen(full, "r");
  if (!f) return false;
  size_t n = fread(out, 1, outlen - 1, f);
  out[n] = '\0';
  fclose(f);
  return true;
}

static bool image_has(const char *root, const char *path) {
  char full[1024];
  struct stat st;
  snprintf(full, sizeof full, "%s%s", root, path);
  return lstat(full, &st) == 0;
}

static void test_contents(void **state) {
  image_need();
  char out[OUT_LEN], root[1024];
  inspect("{{.Config.User}}", out, sizeof out);
  if (strcmp(out, IMAGE_UID ":" IMAGE_UID) != 0) fail_msg("image user '%s', want %s:%s", out, IMAGE_UID, IMAGE_UID);
  inspect("{{json .Config.Entrypoint}}", out, sizeof out);
  if (strcmp(out, "[\"/usr/local/bin/outboxd\"]") != 0) fail_msg("entrypoint %s, want outboxd", out);

  if (sh(root, sizeof root, "podman image mount '%s'", ref) != 0) fail_msg("podman image mount failed");
  chomp(root);
  static char bundle[1 << 20], host[1 << 20];
  bool have_bundle = image_file(root, "/etc/ssl/certs/ca-certificates.crt", bundle, sizeof bundle);
  bool have_passwd = image_file(root, "/etc/passwd", out, sizeof out);
  bool shell = image_has(root, "/bin/sh"), dpkg = image_has(root, "/usr/bin/dpkg"),
       apt = image_has(root, "/usr/bin/apt-get");
  sh(NULL, 0, "podman image unmount '%s' >/dev/null", ref);

  FILE *f = fopen("/etc/ssl/certs/ca-certificates.crt", "r");
  assert_non_null(f);
  host[fread(host, 1, sizeof host - 1, f)] = '\0';
  fclose(f);
  if (!have_bundle || strcmp(bundle, host) != 0) fail_msg("the image's CA bundle is missing or not this machine's");
  if (!have_passwd || !strstr(out, "\noutboxd:x:" IMAGE_UID ":" IMAGE_UID ":"))
    fail_msg("the image's /etc/passwd has no user outboxd %s:%s: %s", IMAGE_UID, IMAGE_UID, have_passwd ? out : "(none)");
  if (shell || dpkg || apt) fail_msg("the image has a shell (%d), dpkg (%d) or apt-get (%d)", shell, dpkg, apt);
}

static void test_version(void **state) {
  image_need();
  char host[256], inside[256], version[64], kust[OUT_LEN];
  for (int i = 0; i < 2; i++) {
    const char *prog = i == 0 ? "outboxd" : "outboxctl";
    if (sh(host, sizeof host, "'%s' --version", obx_test_build_path(prog)) != 0) fail_msg("%s --version failed", prog);
    if (sh(inside, sizeof inside, "podman run --rm --network host --entrypoint /usr/local/bin/%s '%s' --version", prog,
           ref) != 0)
      fail_msg("%s --version in the container failed: %s", prog, inside);
    if (strcmp(host, inside) != 0) fail_msg("%s --version in the container: '%s', want '%s'", prog, inside, host);
  }
  /* "outboxctl 0.1.0 (commit ...)": the tag and the manifests' pinned tag are the version. */
  if (sscanf(host, "outboxctl %63s", version) != 1) fail_msg("no version in '%s'", host);
  const char *tag = strrchr(ref, ':');
  if (!tag || strcmp(tag + 1, version) != 0) fail_msg("image %s, want the tag %s", ref, version);
  if (sh(kust, sizeof kust, "sed -n 's/^ *newTag: *\\([^ #]*\\).*/\\1/p' '%s/k8s/base/kustomization.yaml'",
         OBX_SOURCE_DIR) != 0)
    fail_msg("cannot read k8s/base/kustomization.yaml");
  chomp(kust);
  if (strcmp(kust, version) != 0) fail_msg("k8s/base/kustomization.yaml newTag '%s', want %s", kust, version);
}

typedef struct {
  const char *event_id;
  int matched, others;
  char type[64], orgid[64];
} record_ctx_t;

static void on_record(const rd_kafka_message_t *rkm, void *ctx) {
  record_ctx_t *r = ctx;
  char id[64];
  if (!obx_test_kafka_header(rkm, "ce_id", id, sizeof id) || strcmp(id, r->event_id) != 0) {
    r->others++;
    return;
  }
  r->matched++;
  obx_test_kafka_header(rkm, "ce_type", r->type, sizeof r->type);
  obx_test_kafka_header(rkm, "ce_orgid", r->orgid, sizeof r->orgid);
}

typedef struct {
  mongoc_client_t *client;
  const char *group, *event_id;
} inbox_ctx_t;

/* An obx_test_wait_for condition: the worker's inbox entry of the event is SKIPPED. */
static bool inbox_skipped(void *ctx) {
  inbox_ctx_t *c = ctx;
  bson_t *filter = BCON_NEW("_id", "{", "consumer", BCON_UTF8(c->group), "eventId", BCON_UTF8(c->event_id), "}",
                            "status", BCON_UTF8("SKIPPED"));
  mongoc_collection_t *inbox = mongoc_client_get_collection(c->client, "outboxd", "inbox");
  int64_t n = mongoc_collection_count_documents(inbox, filter, NULL, NULL, NULL, NULL);
  mongoc_collection_destroy(inbox);
  bson_destroy(filter);
  return n == 1;
}

static obx_test_mongo_t mongo;
static obx_test_outboxd_t container;
static char container_name[64];

static int serves_teardown(void **state) {
  (void)state;
  obx_test_outboxd_stop(&container);
  if (container_name[0]) sh(NULL, 0, "podman rm -f '%s' >/dev/null 2>&1", container_name);
  obx_test_mongo_stop(&mongo);
  return 0;
}

static void test_serves(void **state) {
  image_need();
  obx_test_broker_t broker;
  obx_test_require(obx_test_broker_shared(&broker), "no Kafka broker for this run (OBX_TEST_KAFKA_DIR)");
  const char *amqp = getenv("AMQP_URL");
  obx_test_require(amqp != NULL, "AMQP_URL not set: the worker needs RabbitMQ");
  if (!obx_test_mongo_start(&mongo, NULL)) fail_msg("devmongod did not start");
  char topic[128], group[128], keys[320], key[64];
  if (!obx_test_broker_topic(&broker, "image", 1, NULL, topic, sizeof topic)) fail_msg("topic not created");
  obx_test_broker_group("image", group, sizeof group);
  snprintf(keys, sizeof keys, "%s/image-api-keys", obx_test_tmpdir());
  obx_test_apikey_add(keys, ORG, "orders:write,orders:read", key);
  chmod(keys, 0644); /* read by the container's user 10001 through the bind mount */

  char volume[400], kv[8][320];
  snprintf(container_name, sizeof container_name, "obx-image-%d", (int)getpid());
  snprintf(volume, sizeof volume, "%s:/etc/outboxd/api-keys:ro", keys);
  char *cmd[] = {"/usr/bin/podman", "run", "--rm", "--name", container_name, "--network", "host",
                 "-v", volume, ref, NULL};
  int k = 0;
#define KV(...) (snprintf(kv[k], sizeof kv[k], __VA_ARGS__), kv[k++])
  char *args[] = {"--roles", "api,relay,worker",
                  "-X", KV("mongo.uri=%s", mongo.uri),
                  "-X", KV("kafka.brokers=%s", broker.bootstrap),
                  "-X", KV("kafka.topic=%s", topic),
                  "-X", KV("amqp.url=%s", amqp),
                  "-X", KV("worker.group=%s", group),
                  "-X", KV("worker.queue_prefix=image.%d", (int)getpid()),
                  "-X", "api.keys_file=/etc/outboxd/api-keys",
                  "-X", "relay.lease=2s",
                  NULL};
#undef KV
  if (!obx_test_outboxd_start_cmd(&container, cmd, args))
    fail_msg("outboxd did not listen in the container (log: %s)", container.proc.log_path);

  /* Not root: the container's process, seen from here (no user namespace), runs as 10001. */
  char pid[32], status[OUT_LEN];
  if (sh(pid, sizeof pid, "podman inspect --format '{{.State.Pid}}' '%s'", container_name) != 0)
    fail_msg("podman inspect %s failed", container_name);
  chomp(pid);
  if (sh(status, sizeof status, "sed -n 's/^Uid:[[:space:]]*//p' /proc/%s/status", pid) != 0 ||
      strncmp(status, IMAGE_UID "\t", strlen(IMAGE_UID) + 1) != 0)
    fail_msg("the container's outboxd (pid %s) runs as uid '%s', want %s", pid, status, IMAGE_UID);

  obx_test_http_resp_t resp;
  obx_test_http_expect(container.port, "GET", "/healthz", NULL, NULL, 200, &resp);
  obx_test_http_resp_cleanup(&resp);
  if (!obx_test_wait_for(obx_test_http_ready, &container.port, 60000, 100)) {
    obx_test_http(container.port, "GET", "/readyz", NULL, NULL, NULL, &resp);
    fail_msg("/readyz never 200: %ld %s", resp.status, resp.body);
  }

  obx_test_http_expect(container.port, "POST", "/orders", key,
                       "{\"customerEmail\": \"image@company.com\", \"amount\": \"12.50\", \"orderNumber\": \"IMG-1\"}",
                       201, &resp);
  bson_iter_t it, child;
  char event_id[64] = "";
  if (bson_iter_init_find(&it, &resp.json, "eventIds") && BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &child) &&
      bson_iter_next(&child) && BSON_ITER_HOLDS_UTF8(&child))
    snprintf(event_id, sizeof event_id, "%s", bson_iter_utf8(&child, NULL));
  obx_test_http_resp_cleanup(&resp);
  if (!event_id[0]) fail_msg("POST /orders answered no eventIds");

  record_ctx_t r = {.event_id = event_id};
  char consumer[160];
  obx_test_broker_group("image-check", consumer, sizeof consumer);
  obx_test_kafka_consume_all(broker.bootstrap, topic, consumer, 1, 60000, on_record, &r);
  if (r.matched != 1 || r.others != 0)
    fail_msg("records of event %s on %s: %d (and %d others), want 1", event_id, topic, r.matched, r.others);
  if (strcmp(r.type, "OrderConfirmed") != 0 || strcmp(r.orgid, ORG) != 0)
    fail_msg("record ce_type '%s' ce_orgid '%s', want OrderConfirmed %s", r.type, r.orgid, ORG);

  /* The container's worker read it too: no pipeline for OrderConfirmed, so its inbox entry is
   * SKIPPED. */
  inbox_ctx_t inbox = {.client = obx_test_mongo_client(&mongo, NULL, "image-test"), .group = group, .event_id = event_id};
  bool skipped = obx_test_wait_for(inbox_skipped, &inbox, 60000, 100);
  mongoc_client_destroy(inbox.client);
  if (!skipped) fail_msg("inbox entry of %s for %s never SKIPPED", event_id, group);

  int st = obx_test_outboxd_stop(&container);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("podman run after SIGTERM: wait status %d, want exit 0 (log: %s)", st, container.proc.log_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_reproducible),
    cmocka_unit_test(test_contents),
    cmocka_unit_test(test_version),
    cmocka_unit_test_teardown(test_serves, serves_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, group_teardown);
}
