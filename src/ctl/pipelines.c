/* pipelines.c - `outboxctl pipelines`: pipeline definitions in MongoDB
 *
 *   outboxctl pipelines apply [DIR|FILE] [--dry-run] [-c FILE] [-X key=value ...]
 *       Validates every *.json definition of DIR (default: PIPELINES_DIR, else
 *       config/pipelines) or one FILE and creates or updates it by (orgId, name); one line
 *       per file: create, update, unchanged or invalid (with the node or edge at fault).
 *       --dry-run validates and reports without writing. Exits 1 when a file is invalid.
 *   outboxctl pipelines list [--org ORG] [--json] [-c FILE] [-X key=value ...]
 *       One line per stored pipeline: org, name, trigger, enabled, version, id; --json prints
 *       {"pipelines": [...]} as GET /api/pipelines answers.
 *
 * DESIGN: a thin shell over the pipeline store (src/pipeline/store.c), with a MongoDB client
 * of the configured MONGO_URI / MONGO_DB. */
#include "obx/obx_ctl.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_mongo.h"
#include "obx/obx_pipeline.h"

#define DEFAULT_DIR "config/pipelines"

/* Loads the configuration and opens the pool; the default pipelines directory is copied to
 * *dir when dir is not NULL. OBX_CTL_USAGE (reported) on a bad configuration. */
static int open_store(const obx_ctl_conf_opts_t *opts, obx_mongo_t **mongo, mongoc_client_t **client, char **dir) {
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_ctl_conf_load(opts, &conf);
  if (ok && !(*mongo = obx_mongo_new(&conf, &err))) {
    obx_ctl_errorf("%s", err.msg);
    ok = false;
  }
  if (ok && dir) *dir = strdup(conf.pipelines_dir && *conf.pipelines_dir ? conf.pipelines_dir : DEFAULT_DIR);
  obx_conf_cleanup(&conf);
  if (!ok) return OBX_CTL_USAGE;
  *client = obx_mongo_pop(*mongo);
  return OBX_CTL_OK;
}

static int pipelines_apply(int argc, char **argv) {
  static const struct option longopts[] = {{"dry-run", no_argument, NULL, 'n'}, {"help", no_argument, NULL, 'h'}, {0}};
  obx_ctl_conf_opts_t opts = {0};
  obx_mongo_t *mongo = NULL;
  mongoc_client_t *client = NULL;
  bool dry_run = false;
  int opt, rc = OBX_CTL_USAGE;
  optind = 0;
  while ((opt = getopt_long(argc, argv, OBX_CTL_CONF_OPTSTRING "nh", longopts, NULL)) != -1) {
    if (obx_ctl_conf_option(&opts, opt, optarg)) continue;
    if (opt == 'n') {
      dry_run = true;
      continue;
    }
    if (opt == 'h') {
      printf("usage: outboxctl pipelines apply [DIR|FILE] [--dry-run] [-c FILE] [-X key=value ...]\n\n"
             "Validates the pipeline definitions (*.json) of DIR (default: PIPELINES_DIR, else\n"
             DEFAULT_DIR ") or one FILE and creates or updates each by (orgId, name).\n"
             "--dry-run reports what would change without writing.\n\noptions:\n" OBX_CTL_CONF_USAGE);
      rc = OBX_CTL_OK;
    }
    goto done;
  }
  if (argc - optind > 1) {
    obx_ctl_errorf("pipelines apply: one DIR or FILE at most");
    goto done;
  }
  char *conf_dir = NULL;
  if ((rc = open_store(&opts, &mongo, &client, &conf_dir)) == OBX_CTL_OK) {
    obx_err_t err = OBX_ERR_INIT;
    const char *path = optind < argc ? argv[optind] : conf_dir;
    if (!obx_pipeline_store_apply_path(client, obx_mongo_db_name(mongo), path, dry_run, stdout, &err)) {
      obx_ctl_errorf("pipelines apply: %s", err.msg);
      rc = OBX_CTL_FAILED;
    }
  }
  free(conf_dir);
done:
  if (client) obx_mongo_push(mongo, client);
  obx_mongo_destroy(mongo);
  obx_ctl_conf_opts_cleanup(&opts);
  return rc;
}

static const char *field_str(const bson_t *doc, const char *key) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "-";
}

static int pipelines_list(int argc, char **argv) {
  static const struct option longopts[] = {
    {"org", required_argument, NULL, 'o'}, {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0}};
  obx_ctl_conf_opts_t opts = {0};
  obx_mongo_t *mongo = NULL;
  mongoc_client_t *client = NULL;
  const char *org = NULL;
  bool json = false;
  int opt, rc = OBX_CTL_USAGE;
  optind = 0;
  while ((opt = getopt_long(argc, argv, OBX_CTL_CONF_OPTSTRING "o:jh", longopts, NULL)) != -1) {
    if (obx_ctl_conf_option(&opts, opt, optarg)) continue;
    if (opt == 'o') {
      org = optarg;
      continue;
    }
    if (opt == 'j') {
      json = true;
      continue;
    }
    if (opt == 'h') {
      printf("usage: outboxctl pipelines list [--org ORG] [--json] [-c FILE] [-X key=value ...]\n\n"
             "Lists the stored pipelines (every org unless --org): org, name, trigger, enabled,\n"
             "version, id. --json prints {\"pipelines\": [...]} with the whole definitions.\n\noptions:\n"
             OBX_CTL_CONF_USAGE);
      rc = OBX_CTL_OK;
    }
    goto done;
  }
  if (optind < argc) {
    obx_ctl_errorf("pipelines list: unexpected argument '%s'", argv[optind]);
    goto done;
  }
  if ((rc = open_store(&opts, &mongo, &client, NULL)) != OBX_CTL_OK) goto done;
  obx_err_t err = OBX_ERR_INIT;
  bson_t out = BSON_INITIALIZER;
  if (!obx_pipeline_store_list(client, obx_mongo_db_name(mongo), org, &out, &err)) {
    obx_ctl_errorf("pipelines list: %s", err.msg);
    rc = OBX_CTL_FAILED;
  } else if (json) {
    obx_ctl_print_json(&out);
  } else {
    bson_iter_t it, items;
    printf("%-12s %-28s %-24s %-8s %-7s %s\n", "ORG", "NAME", "TRIGGER", "ENABLED", "VERSION", "ID");
    if (bson_iter_init_find(&it, &out, "pipelines") && bson_iter_recurse(&it, &items)) {
      while (bson_iter_next(&items)) {
        const uint8_t *data;
        uint32_t len;
        bson_t doc;
        bson_iter_document(&items, &len, &data);
        if (!bson_init_static(&doc, data, len)) continue;
        bson_iter_t f;
        bool enabled = bson_iter_init_find(&f, &doc, "enabled") && bson_iter_as_bool(&f);
        int64_t version = bson_iter_init_find(&f, &doc, "version") ? bson_iter_as_int64(&f) : 0;
        printf("%-12s %-28s %-24s %-8s %-7lld %s\n", field_str(&doc, "orgId"), field_str(&doc, "name"),
               field_str(&doc, "trigger"), enabled ? "yes" : "no", (long long)version, field_str(&doc, "_id"));
      }
    }
  }
  bson_destroy(&out);
done:
  if (client) obx_mongo_push(mongo, client);
  obx_mongo_destroy(mongo);
  obx_ctl_conf_opts_cleanup(&opts);
  return rc;
}

static const obx_ctl_sub_t pipelines_subs[] = {
  {"apply", "[DIR|FILE] [--dry-run] [-c FILE] [-X key=value ...]",
   "Validate pipeline definitions and create or update them by (orgId, name)", pipelines_apply},
  {"list", "[--org ORG] [--json] [-c FILE] [-X key=value ...]", "List the stored pipelines", pipelines_list},
};

int obx_ctl_pipelines(int argc, char **argv) {
  return obx_ctl_dispatch("pipeline definitions", pipelines_subs, (int)(sizeof pipelines_subs / sizeof pipelines_subs[0]),
                          argc, argv);
}
