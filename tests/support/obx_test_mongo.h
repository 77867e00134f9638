/* obx_test_mongo.h - start and stop a private devmongod for a test
 *
 * DESIGN: every test gets its own devmongod on a free port (--port 0 --port-file), so tests
 * never share state and can run in parallel. The server is the built
 * tests/fixtures/devmongo/devmongod; it is stopped (SIGTERM, then SIGKILL) by
 * obx_test_mongo_stop, which is safe on a zeroed or never-started struct. */
#ifndef OBX_TEST_MONGO_H
#define OBX_TEST_MONGO_H

#include <stdbool.h>
#include <mongoc/mongoc.h>

#include "obx_test.h"

typedef struct {
  obx_test_proc_t proc;
  int port;
  char port_file[256];
  char uri[256];         /* mongodb://127.0.0.1:PORT/?replicaSet=rs0 */
  char direct_uri[256];  /* mongodb://127.0.0.1:PORT/?directConnection=true */
} obx_test_mongo_t;

/* Spawns devmongod with --port 0 --port-file --exit-with-parent and extra_args (space-separated, may be NULL,
 * e.g. "--oplog-size 10 --ttl-interval-ms 100"), waits until it listens (up to 20 s) and fills
 * m. The replica-set name in m->uri is rs0 unless extra_args has --set-name NAME. Returns false
 * (server stopped) when it did not come up. */
bool obx_test_mongo_start(obx_test_mongo_t *m, const char *extra_args);

/* A single-threaded client on m->uri (or uri when not NULL) with retryable writes on and an
 * error API v2; appname may be NULL. Owned by the caller (mongoc_client_destroy). Calls
 * mongoc_init once. */
mongoc_client_t *obx_test_mongo_client(const obx_test_mongo_t *m, const char *uri,
                                       const char *appname);

/* Stops the server; returns its wait status (or -1 when it was not running). */
int obx_test_mongo_stop(obx_test_mongo_t *m);

#endif
