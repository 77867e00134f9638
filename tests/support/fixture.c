/* fixture.c - group fixtures of obx_test_fixture.h */
#include "obx_test_fixture.h"

#include <stdio.h>

#include "obx/obx_pipeline.h"
#include "obx_test.h"
#include "obx_test_doc.h"

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

int64_t obx_test_fail_point(mongoc_client_t *client, const char *json) {
  bson_error_t berr;
  bson_t reply;
  bson_iter_t it;
  bson_t *cmd = obx_test_bson(json);
  if (!mongoc_client_command_simple(client, "admin", cmd, NULL, &reply, &berr)) {
    bson_destroy(cmd);
    fail_msg("configureFailPoint %s: %s", json, berr.message);
  }
  int64_t fired = bson_iter_init_find(&it, &reply, "count") ? bson_iter_as_int64(&it) : -1;
  bson_destroy(&reply);
  bson_destroy(cmd);
  return fired;
}

void obx_test_pipeline_create(mongoc_client_t *client, const char *db, const char *org, const char *json) {
  bson_error_t berr;
  bson_t *def = bson_new_from_json((const uint8_t *)json, -1, &berr);
  if (!def) fail_msg("pipeline json: %s", berr.message);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_pipeline_store_create(client, db, org, def, NULL, &err)) fail_msg("pipeline: %s", err.msg);
  bson_destroy(def);
}

void obx_test_erp_pipeline_json(char *out, size_t len, const char *erp_url) {
  snprintf(out, len,
           "{\"name\": \"post\", \"trigger\": \"order.post\", \"enabled\": true, \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"notify\", \"type\": \"http-request\", \"onError\": \"abort\", \"config\": {"
           "  \"method\": \"POST\", \"url\": \"%s/{{orderNumber}}\", \"body\": {\"n\": \"{{orderNumber}}\"}}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"notify\"}]}",
           erp_url);
}
