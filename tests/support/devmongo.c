/* devmongo.c - a private devmongod per test (see obx_test_mongo.h) */
#include "obx_test_mongo.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool obx_test_mongo_start(obx_test_mongo_t *m, const char *extra_args) {
  static int seq;
  char *argv[64];
  int argc = 0;
  char args[1024];
  char set_name[64] = "rs0";
  memset(m, 0, sizeof *m);
  snprintf(m->port_file, sizeof m->port_file, "%s/devmongod.%d.%d.port", obx_test_tmpdir(),
           (int)getpid(), seq++);
  unlink(m->port_file);
  argv[argc++] = (char *)obx_test_build_path("tests/fixtures/devmongo/devmongod");
  argv[argc++] = "--port";
  argv[argc++] = "0";
  argv[argc++] = "--port-file";
  argv[argc++] = m->port_file;
  argv[argc++] = "--exit-with-parent"; /* a crashed test leaves no server behind */
  snprintf(args, sizeof args, "%s", extra_args ? extra_args : "");
  for (char *save = NULL, *tok = strtok_r(args, " \t", &save); tok && argc < 62;
       tok = strtok_r(NULL, " \t", &save)) {
    if (argc > 0 && !strcmp(argv[argc - 1], "--set-name")) snprintf(set_name, sizeof set_name, "%s", tok);
    argv[argc++] = tok;
  }
  argv[argc] = NULL;
  if (!obx_test_spawn(&m->proc, argv, NULL)) return false;
  char line[64];
  if (!obx_test_read_first_line(m->port_file, line, sizeof line, 20000) || atoi(line) <= 0) {
    fprintf(stderr, "devmongod did not start; log: %s\n", m->proc.log_path);
    obx_test_mongo_stop(m);
    return false;
  }
  m->port = atoi(line);
  snprintf(m->uri, sizeof m->uri, "mongodb://127.0.0.1:%d/?replicaSet=%s", m->port, set_name);
  snprintf(m->direct_uri, sizeof m->direct_uri, "mongodb://127.0.0.1:%d/?directConnection=true",
           m->port);
  return true;
}

mongoc_client_t *obx_test_mongo_client(const obx_test_mongo_t *m, const char *uri,
                                       const char *appname) {
  static bool inited;
  if (!inited) {
    mongoc_init();
    inited = true;
  }
  mongoc_client_t *client = mongoc_client_new(uri ? uri : m->uri);
  if (!client) return NULL;
  mongoc_client_set_error_api(client, MONGOC_ERROR_API_VERSION_2);
  if (appname) mongoc_client_set_appname(client, appname);
  return client;
}

int obx_test_mongo_stop(obx_test_mongo_t *m) {
  int status = obx_test_proc_stop(&m->proc, SIGTERM, 5000);
  if (m->port_file[0]) unlink(m->port_file);
  return status;
}
