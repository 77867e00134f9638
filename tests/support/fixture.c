/* fixture.c - group fixtures of obx_test_fixture.h */
#include "obx_test_fixture.h"

int obx_test_fixture_mongo_setup(obx_test_mongo_t *m, const char *extra_args, mongoc_client_t **client) {
  *client = NULL;
  if (!obx_test_mongo_start(m, extra_args)) return -1;
  *client = obx_test_mongo_client(m, NULL, NULL);
  if (*client) return 0;
  obx_test_mongo_stop(m);
  return -1;
}

int obx_test_fixture_mongo_teardown(obx_test_mongo_t *m, mongoc_client_t *client) {
  mongoc_client_destroy(client);
  obx_test_mongo_stop(m);
  return 0;
}
