/* outboxd.c - run the real outboxd binary in a test and talk HTTP to it (obx_test_outboxd.h) */
#include "obx_test_outboxd.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "obx/obx_auth.h"

typedef struct {
  obx_test_outboxd_t *d;
} port_ctx_t;

/* Reads the port from the "http listening" log line. */
static bool port_known(void *ctx) {
  obx_test_outboxd_t *d = ((port_ctx_t *)ctx)->d;
  FILE *f = fopen(d->proc.log_path, "r");
  char line[4096];
  if (!f) return false;
  while (fgets(line, sizeof line, f)) {
    const char *p;
    char *end;
    /* The whole number and its closing quote: a line still being written must not count. */
    if (strstr(line, "\"http listening\"") && (p = strstr(line, "\"port\":\""))) {
      long port = strtol(p + 8, &end, 10);
      if (end > p + 8 && *end == '"' && port > 0) d->port = (int)port;
    }
  }
  fclose(f);
  return d->port > 0 || !obx_test_proc_alive(&d->proc);
}

bool obx_test_outboxd_start(obx_test_outboxd_t *d, char *const args[]) {
  char *const cmd[] = {(char *)obx_test_build_path("outboxd"), NULL};
  return obx_test_outboxd_start_cmd(d, cmd, args);
}

bool obx_test_outboxd_start_cmd(obx_test_outboxd_t *d, char *const cmd[], char *const args[]) {
  char *argv[96];
  int argc = 0;
  memset(d, 0, sizeof *d);
  for (int i = 0; cmd[i] && argc < 40; i++) argv[argc++] = cmd[i];
  for (int i = 0; args[i] && argc < 92; i++) argv[argc++] = args[i];
  argv[argc++] = "-X";
  argv[argc++] = "http.port=0";
  argv[argc] = NULL;
  if (!obx_test_spawn(&d->proc, argv, NULL)) return false;
  port_ctx_t ctx = {d};
  obx_test_wait_for(port_known, &ctx, 30000, 20);
  if (d->port <= 0) {
    fprintf(stderr, "outboxd did not listen; log: %s\n", d->proc.log_path);
    obx_test_outboxd_stop(d);
    return false;
  }
  return true;
}

bool obx_test_outboxd_start_api(obx_test_outboxd_t *d, const char *mongo_uri, const char *keys_path,
                                const char *amqp_url, const char *prefix) {
  char mongo_arg[300], keys_arg[340], amqp_arg[300], prefix_arg[100];
  snprintf(mongo_arg, sizeof mongo_arg, "mongo.uri=%s", mongo_uri);
  snprintf(keys_arg, sizeof keys_arg, "api.keys_file=%s", keys_path);
  snprintf(amqp_arg, sizeof amqp_arg, "amqp.url=%s", amqp_url);
  snprintf(prefix_arg, sizeof prefix_arg, "worker.queue_prefix=%s", prefix);
  char *args[] = {"--roles", "api", "-X", mongo_arg, "-X", keys_arg, "-X", amqp_arg, "-X", prefix_arg, NULL};
  if (!obx_test_outboxd_start(d, args)) return false;
  if (obx_test_wait_for(obx_test_http_ready, &d->port, 30000, 100)) return true;
  fprintf(stderr, "outboxd --roles api not ready in 30 s; log: %s\n", d->proc.log_path);
  return false;
}

int obx_test_outboxd_stop(obx_test_outboxd_t *d) { return obx_test_proc_stop(&d->proc, SIGTERM, 20000); }

typedef struct {
  char *data;
  size_t len;
} buf_t;

static size_t buf_write(char *ptr, size_t size, size_t n, void *ud) {
  buf_t *b = ud;
  b->data = realloc(b->data, b->len + size * n + 1);
  memcpy(b->data + b->len, ptr, size * n);
  b->len += size * n;
  b->data[b->len] = '\0';
  return size * n;
}

bool obx_test_http(int port, const char *method, const char *path, const char *key, const char *body,
                   const char *const headers[], obx_test_http_resp_t *resp) {
  static bool inited;
  if (!inited) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    inited = true;
  }
  char url[512], auth[256];
  buf_t b = {0}, h = {0};
  struct curl_slist *list = NULL;
  memset(resp, 0, sizeof *resp);
  bson_init(&resp->json);
  CURL *curl = curl_easy_init();
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 60000L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, buf_write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, buf_write);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &h);
  bool content_type = false;
  for (int i = 0; headers && headers[i]; i++) content_type |= strncasecmp(headers[i], "Content-Type:", 13) == 0;
  if (body) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    if (!content_type) list = curl_slist_append(list, "Content-Type: application/json");
  }
  list = curl_slist_append(list, "Expect:");
  if (key) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    list = curl_slist_append(list, auth);
  }
  for (int i = 0; headers && headers[i]; i++) list = curl_slist_append(list, headers[i]);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  CURLcode rc = curl_easy_perform(curl);
  if (rc == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp->status);
  curl_slist_free_all(list);
  curl_easy_cleanup(curl);
  resp->body = b.data ? b.data : strdup("");
  resp->headers = h.data ? h.data : strdup("");
  bson_error_t berr;
  if (resp->body[0] == '{' && !bson_init_from_json(&resp->json, resp->body, -1, &berr)) bson_init(&resp->json);
  return rc == CURLE_OK;
}

void obx_test_http_expect(int port, const char *method, const char *path, const char *key, const char *body,
                          long want, obx_test_http_resp_t *resp) {
  if (!obx_test_http(port, method, path, key, body, NULL, resp)) fail_msg("%s %s: no answer", method, path);
  if (resp->status != want) fail_msg("%s %s: got HTTP %ld %s, want %ld", method, path, resp->status, resp->body, want);
}

bool obx_test_http_ready(void *port) {
  obx_test_http_resp_t resp;
  bool ok = obx_test_http(*(int *)port, "GET", "/readyz", NULL, NULL, NULL, &resp) && resp.status == 200;
  obx_test_http_resp_cleanup(&resp);
  return ok;
}

void obx_test_http_resp_cleanup(obx_test_http_resp_t *resp) {
  free(resp->body);
  free(resp->headers);
  bson_destroy(&resp->json);
  memset(resp, 0, sizeof *resp);
}

const char *obx_test_http_json_str(const obx_test_http_resp_t *resp, const char *field) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, &resp->json, field) && BSON_ITER_HOLDS_UTF8(&it)) return bson_iter_utf8(&it, NULL);
  return NULL;
}

bool obx_test_http_header(const obx_test_http_resp_t *resp, const char *name, char *out, size_t outlen) {
  size_t n = strlen(name);
  for (const char *line = resp->headers; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
      const char *v = line + n + 1;
      while (*v == ' ') v++;
      size_t len = strcspn(v, "\r\n");
      snprintf(out, outlen, "%.*s", (int)len, v);
      return true;
    }
  }
  return false;
}

void obx_test_apikey_add(const char *path, const char *org, const char *perms, char *key_out) {
  char key[OBX_AUTH_KEY_LEN + 1], hash[OBX_AUTH_HASH_LEN + 1];
  if (!obx_auth_key_generate(key, NULL)) abort();
  obx_auth_hash(key, hash);
  FILE *f = fopen(path, "a");
  if (!f) abort();
  fprintf(f, "%s %s %s\n", hash, org, perms);
  fclose(f);
  strcpy(key_out, key);
}
