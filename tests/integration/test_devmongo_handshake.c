/* test_devmongo_handshake.c - devmongod handshake, topology and connection handling via libmongoc
 *
 * DESIGN: each test starts its own devmongod (obx_test_mongo_start) and talks to it only
 * through the MongoDB C driver: replicaSet and directConnection URIs, single and pooled
 * clients, the --set-name/--bind flags, admin commands, and 300 simultaneous connections. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "obx_test.h"
#include "obx_test_mongo.h"

static bool run(mongoc_client_t *client, const char *db, bson_t *cmd, bson_t *reply) {
  bson_error_t error;
  bool ok = mongoc_client_command_simple(client, db, cmd, NULL, reply, &error);
  if (!ok) print_message("command failed: %s (code %u)\n", error.message, error.code);
  bson_destroy(cmd);
  return ok;
}

static void test_replica_set_and_direct(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, NULL));
  const char *uris[] = {m.uri, m.direct_uri};
  for (int i = 0; i < 2; i++) {
    mongoc_client_t *client = obx_test_mongo_client(&m, uris[i], NULL);
    bson_t reply;
    assert_true(run(client, "admin", BCON_NEW("ping", BCON_INT32(1)), &reply));
    bson_destroy(&reply);
    /* the topology really is a replica-set primary: sessions work */
    bson_error_t error;
    mongoc_client_session_t *cs = mongoc_client_start_session(client, NULL, &error);
    if (!cs) print_message("start_session on %s: %s\n", uris[i], error.message);
    assert_non_null(cs);
    mongoc_client_session_destroy(cs);
    mongoc_server_description_t *sd = mongoc_client_select_server(client, true, NULL, &error);
    assert_non_null(sd);
    assert_string_equal(mongoc_server_description_type(sd), "RSPrimary");
    const bson_t *hello = mongoc_server_description_hello_response(sd);
    bson_iter_t it;
    assert_true(bson_iter_init_find(&it, hello, "maxWireVersion"));
    assert_int_equal(bson_iter_int32(&it), 17);
    assert_true(bson_iter_init_find(&it, hello, "logicalSessionTimeoutMinutes"));
    assert_true(bson_iter_init_find(&it, hello, "setName"));
    assert_string_equal(bson_iter_utf8(&it, NULL), "rs0");
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", m.port);
    assert_true(bson_iter_init_find(&it, hello, "me"));
    assert_string_equal(bson_iter_utf8(&it, NULL), want);
    assert_false(bson_iter_init_find(&it, hello, "compression"));
    mongoc_server_description_destroy(sd);
    mongoc_client_destroy(client);
  }
  obx_test_mongo_stop(&m);
}

static void test_admin_commands(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, NULL));
  mongoc_client_t *client = obx_test_mongo_client(&m, NULL, NULL);
  bson_t reply;
  bson_iter_t it;
  assert_true(run(client, "admin", BCON_NEW("buildInfo", BCON_INT32(1)), &reply));
  assert_true(bson_iter_init_find(&it, &reply, "version"));
  assert_string_equal(bson_iter_utf8(&it, NULL), "6.0.0");
  bson_destroy(&reply);
  assert_true(run(client, "admin", BCON_NEW("replSetGetStatus", BCON_INT32(1)), &reply));
  assert_true(bson_iter_init_find(&it, &reply, "set"));
  bson_destroy(&reply);
  assert_true(run(client, "admin", BCON_NEW("endSessions", "[", "]"), &reply));
  bson_destroy(&reply);
  /* an unknown command is CommandNotFound (59) */
  bson_error_t error;
  bson_t *cmd = BCON_NEW("noSuchCommand", BCON_INT32(1));
  assert_false(mongoc_client_command_simple(client, "admin", cmd, NULL, &reply, &error));
  assert_int_equal(error.code, 59);
  bson_destroy(cmd);
  bson_destroy(&reply);
  mongoc_client_destroy(client);
  obx_test_mongo_stop(&m);
}

static void test_set_name_and_bind(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, "--set-name other --bind 0.0.0.0"));
  assert_non_null(strstr(m.uri, "replicaSet=other"));
  mongoc_client_t *client = obx_test_mongo_client(&m, NULL, NULL);
  bson_t reply;
  assert_true(run(client, "admin", BCON_NEW("ping", BCON_INT32(1)), &reply));
  bson_destroy(&reply);
  mongoc_client_destroy(client);
  /* the wrong set name is refused by the driver's topology checks */
  char uri[256];
  snprintf(uri, sizeof uri, "mongodb://127.0.0.1:%d/?replicaSet=rs0&serverSelectionTimeoutMS=1500",
           m.port);
  client = obx_test_mongo_client(&m, uri, NULL);
  bson_error_t error;
  bson_t *cmd = BCON_NEW("ping", BCON_INT32(1));
  assert_false(mongoc_client_command_simple(client, "admin", cmd, NULL, &reply, &error));
  bson_destroy(cmd);
  bson_destroy(&reply);
  mongoc_client_destroy(client);
  obx_test_mongo_stop(&m);
}

typedef struct {
  mongoc_client_pool_t *pool;
  int ok;
} pool_job_t;

static void *pool_worker(void *p) {
  pool_job_t *job = p;
  for (int i = 0; i < 20; i++) {
    mongoc_client_t *client = mongoc_client_pool_pop(job->pool);
    bson_t *cmd = BCON_NEW("ping", BCON_INT32(1));
    bson_t reply;
    bson_error_t error;
    if (mongoc_client_command_simple(client, "admin", cmd, NULL, &reply, &error)) job->ok++;
    bson_destroy(&reply);
    bson_destroy(cmd);
    mongoc_client_pool_push(job->pool, client);
  }
  return NULL;
}

static void test_pooled_client(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, NULL));
  mongoc_client_destroy(obx_test_mongo_client(&m, NULL, NULL)); /* mongoc_init */
  mongoc_uri_t *uri = mongoc_uri_new(m.uri);
  mongoc_client_pool_t *pool = mongoc_client_pool_new(uri);
  mongoc_client_pool_set_error_api(pool, MONGOC_ERROR_API_VERSION_2);
  enum { N = 16 };
  pthread_t th[N];
  pool_job_t jobs[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (pool_job_t){pool, 0};
    pthread_create(&th[i], NULL, pool_worker, &jobs[i]);
  }
  int total = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    total += jobs[i].ok;
  }
  assert_int_equal(total, N * 20);
  mongoc_client_pool_destroy(pool);
  mongoc_uri_destroy(uri);
  obx_test_mongo_stop(&m);
}

static void test_300_connections(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, NULL));
  enum { N = 300 };
  static mongoc_client_t *clients[N];
  int ok = 0;
  /* every single-threaded client owns one socket: 300 open connections at once */
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < N; i++) {
      if (!round) clients[i] = obx_test_mongo_client(&m, m.direct_uri, NULL);
      bson_t reply;
      if (run(clients[i], "admin", BCON_NEW("ping", BCON_INT32(1)), &reply)) ok++;
      bson_destroy(&reply);
    }
  }
  assert_int_equal(ok, 2 * N);
  for (int i = 0; i < N; i++) mongoc_client_destroy(clients[i]);
  obx_test_mongo_stop(&m);
}

/* Sends raw bytes on a fresh connection and waits until the server closes it. */
static void send_raw(int port, const uint8_t *bytes, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(write(fd, bytes, len), (ssize_t)len);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  uint8_t buf[256];
  assert_int_equal(read(fd, buf, sizeof buf), 0); /* closed by the server, no reply */
  close(fd);
}

static void test_malformed_messages(void **state) {
  obx_test_mongo_t m;
  assert_true(obx_test_mongo_start(&m, NULL));
  /* header: length, requestID, responseTo, opCode (little endian) */
  const uint8_t bad_length[] = {8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xdd, 7, 0, 0};
  const uint8_t bad_opcode[] = {16, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x39, 0x30, 0, 0};
  const uint8_t bad_section[] = {26, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xdd, 7, 0, 0,
                                 0, 0, 0, 0, 0, 99, 0, 0, 0, 0};
  const uint8_t bad_bson[] = {31, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xdd, 7, 0, 0, 0, 0, 0, 0,
                              0, 10, 0, 0, 0, 0x10, 'a', 0, 1, 0, 0};
  send_raw(m.port, bad_length, sizeof bad_length);
  send_raw(m.port, bad_opcode, sizeof bad_opcode);
  send_raw(m.port, bad_section, sizeof bad_section);
  send_raw(m.port, bad_bson, sizeof bad_bson);
  mongoc_client_t *client = obx_test_mongo_client(&m, NULL, NULL);
  bson_t reply;
  assert_true(run(client, "admin", BCON_NEW("ping", BCON_INT32(1)), &reply));
  bson_destroy(&reply);
  mongoc_client_destroy(client);
  assert_true(obx_test_proc_alive(&m.proc));
  obx_test_mongo_stop(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_replica_set_and_direct),
    cmocka_unit_test(test_admin_commands),
    cmocka_unit_test(test_set_name_and_bind),
    cmocka_unit_test(test_pooled_client),
    cmocka_unit_test(test_300_connections),
    cmocka_unit_test(test_malformed_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
