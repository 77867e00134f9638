/* obx_test_fixture.h - devmongod fixtures shared by the integration suites
 *
 * DESIGN: a group that runs against one devmongod and one client calls the setup/teardown
 * pair instead of repeating the start/connect/stop sequence; those do not assert (group setups
 * report failure by returning -1, as cmocka expects). Fail points are configured through one
 * helper, which fails the running test when the server refuses; pipelines are stored from
 * their JSON through another, which fails the test on a definition the store refuses. */
#ifndef OBX_TEST_FIXTURE_H
#define OBX_TEST_FIXTURE_H

#include <mongoc/mongoc.h>

#include "obx_test_mongo.h"

/* Starts devmongod into m (extra_args as for obx_test_mongo_start, may be NULL) and opens
 * *client on m->uri (owned by the caller, released by obx_test_fixture_mongo_teardown).
 * Returns 0, or -1 with nothing left running and *client NULL. */
int obx_test_fixture_mongo_setup(obx_test_mongo_t *m, const char *extra_args, mongoc_client_t **client);
/* Destroys client (may be NULL) and stops m (safe when never started). Returns 0. */
int obx_test_fixture_mongo_teardown(obx_test_mongo_t *m, mongoc_client_t *client);

/* Runs configureFailPoint (json as written, e.g. {"configureFailPoint": "failCommand", ...})
 * on admin; returns the reply's count: how often the previous configuration of that fail
 * point fired (-1 when the reply has none). */
int64_t obx_test_fail_point(mongoc_client_t *client, const char *json);

/* Stores the pipeline of org defined by json in db (obx_pipeline_store_create). */
void obx_test_pipeline_create(mongoc_client_t *client, const char *db, const char *org, const char *json);
/* The definition of the order.post pipeline the worker suites run: POST
 * <erp_url>/{{orderNumber}} with the body {n: orderNumber}, aborting on an error; into out. */
void obx_test_erp_pipeline_json(char *out, size_t len, const char *erp_url);

#endif
