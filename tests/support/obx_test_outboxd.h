/* obx_test_outboxd.h - run the real outboxd binary in a test and talk HTTP to it
 *
 * DESIGN: outboxd is spawned with `-X http.port=0` plus the caller's arguments; its port is
 * read from the "http listening" log line. Requests go through libcurl (one easy handle per
 * request, so threads may call obx_test_http concurrently). API keys for tests are written to
 * a keys file in the test's temp directory. */
#ifndef OBX_TEST_OUTBOXD_H
#define OBX_TEST_OUTBOXD_H

#include <stdbool.h>
#include <stddef.h>
#include <bson/bson.h>

#include "obx_test.h"

typedef struct {
  obx_test_proc_t proc;
  int port;
} obx_test_outboxd_t;

/* Starts outboxd with args (NULL-terminated, e.g. {"--roles", "api", "-X", "mongo.uri=...", NULL})
 * and waits (up to 30 s) for it to listen. False (process stopped) when it did not. */
bool obx_test_outboxd_start(obx_test_outboxd_t *d, char *const args[]);
/* obx_test_outboxd_start with the command that runs outboxd given: cmd (a path, then its
 * arguments, NULL-terminated; e.g. podman run ... IMAGE) instead of the built binary. */
bool obx_test_outboxd_start_cmd(obx_test_outboxd_t *d, char *const cmd[], char *const args[]);
/* `outboxd --roles api` on MongoDB mongo_uri, the keys file keys_path, RabbitMQ amqp_url with
 * queues under prefix; waits (30 s) until /readyz answers 200. False (reported) otherwise. */
bool obx_test_outboxd_start_api(obx_test_outboxd_t *d, const char *mongo_uri, const char *keys_path,
                                const char *amqp_url, const char *prefix);
/* SIGTERM and wait; returns the wait status. Safe on a zeroed struct. */
int obx_test_outboxd_stop(obx_test_outboxd_t *d);

typedef struct {
  long status;          /* 0 when the request could not be made */
  char *body;           /* NUL-terminated, owned */
  char *headers;        /* raw response header block, owned */
  bson_t json;          /* body parsed as JSON (empty when it is not) */
} obx_test_http_resp_t;

/* One request to 127.0.0.1:port. key NULL: no Authorization header. headers: NULL or
 * NULL-terminated "Name: value" strings. body NULL: no body; a body is sent as
 * application/json unless headers hold a Content-Type (e.g. application/cloudevents+json). */
bool obx_test_http(int port, const char *method, const char *path, const char *key, const char *body,
                   const char *const headers[], obx_test_http_resp_t *resp);
void obx_test_http_resp_cleanup(obx_test_http_resp_t *resp);
/* obx_test_http without extra headers that fails the running test unless the request was made
 * and answered want; resp is filled either way (the caller cleans it up). */
void obx_test_http_expect(int port, const char *method, const char *path, const char *key, const char *body,
                          long want, obx_test_http_resp_t *resp);
/* An obx_test_wait_for condition: GET /readyz on 127.0.0.1:*(int *)port answers 200. */
bool obx_test_http_ready(void *port);
/* A top-level string field of resp->json, or NULL. Borrowed from resp. */
const char *obx_test_http_json_str(const obx_test_http_resp_t *resp, const char *field);
/* Value of a response header (case-insensitive name) copied to out; false when absent. */
bool obx_test_http_header(const obx_test_http_resp_t *resp, const char *name, char *out, size_t outlen);

/* Creates a fresh API key for org with the comma-separated perms, appends its line to the keys
 * file at path, and copies the clear key to key_out (at least 64 bytes). */
void obx_test_apikey_add(const char *path, const char *org, const char *perms, char *key_out);

#endif
