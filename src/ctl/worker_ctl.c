/* worker_ctl.c - option parsing and service access for the dlq, inbox and keys commands
 *
 * DESIGN: see worker_ctl.h. The operator recorded in audit_log is --who, else $USER, else
 * "unknown". */
#include "ctl/worker_ctl.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_schema.h"

int worker_ctl_parse(worker_ctl_args_t *a, int argc, char **argv, const char *usage) {
  static const struct option longopts[] = {
    {"json", no_argument, NULL, 'j'},     {"who", required_argument, NULL, 'w'},  {"dry-run", no_argument, NULL, 'n'},
    {"id", required_argument, NULL, 'i'}, {"type", required_argument, NULL, 't'}, {"since", required_argument, NULL, 's'},
    {"all", no_argument, NULL, 'a'},      {"limit", required_argument, NULL, 'l'}, {"yes", no_argument, NULL, 'y'},
    {"org", required_argument, NULL, 'o'}, {"help", no_argument, NULL, 'h'}, {0}};
  memset(a, 0, sizeof *a);
  int opt;
  optind = 0;
  while ((opt = getopt_long(argc, argv, OBX_CTL_CONF_OPTSTRING "h", longopts, NULL)) != -1) {
    if (obx_ctl_conf_option(&a->conf, opt, optarg)) continue;
    switch (opt) {
    case 'j': a->json = true; break;
    case 'w': a->who = optarg; break;
    case 'n': a->dry_run = true; break;
    case 'i': a->id = optarg; break;
    case 't': a->type = optarg; break;
    case 'o': a->org = optarg; break;
    case 's': a->since = optarg; break;
    case 'a': a->all = true; break;
    case 'y': a->yes = true; break;
    case 'l': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*end || v < 0 || v > 1000000) {
        obx_ctl_errorf("%s: --limit wants a number 0..1000000, got '%s'", argv[0], optarg);
        return OBX_CTL_USAGE;
      }
      a->limit = (int)v;
      break;
    }
    case 'h':
      printf("%s\noptions:\n" OBX_CTL_CONF_USAGE, usage);
      return OBX_CTL_OK;
    default: return OBX_CTL_USAGE;
    }
  }
  a->pos = argv + optind;
  a->npos = argc - optind;
  return -1;
}

void worker_ctl_args_cleanup(worker_ctl_args_t *a) { obx_ctl_conf_opts_cleanup(&a->conf); }

int worker_ctl_open(worker_ctl_t *ctl, const worker_ctl_args_t *args, bool need_amqp) {
  memset(ctl, 0, sizeof *ctl);
  if (!obx_ctl_conf_load(&args->conf, &ctl->conf)) return OBX_CTL_USAGE;
  obx_err_t err = OBX_ERR_INIT;
  if (!(ctl->mongo = obx_mongo_new(&ctl->conf, &err))) {
    obx_ctl_errorf("%s", err.msg);
    return OBX_CTL_USAGE;
  }
  /* the collections the command may write in a transaction exist before it (obx_schema.h) */
  if (!obx_schema_ensure(ctl->mongo, &ctl->conf, OBX_SCHEMA_CTL, &err)) {
    obx_ctl_errorf("%s", err.msg);
    return OBX_CTL_FAILED;
  }
  if (need_amqp) {
    obx_ladder_opts_t lo = {.url = ctl->conf.amqp_url, .prefix = ctl->conf.worker_queue_prefix,
                            .tiers_ms = ctl->conf.retry_ladder.ms, .ntiers = ctl->conf.retry_ladder.n};
    obx_amqp_settings_from_conf(&lo.amqp, &ctl->conf);
    if (!(ctl->ladder = obx_ladder_new(&lo, &err))) {
      obx_ctl_errorf("%s", err.msg);
      return OBX_CTL_USAGE;
    }
  }
  const char *who = args->who ? args->who : getenv("USER");
  ctl->ops = (obx_worker_ops_t){ctl->mongo, ctl->ladder, ctl->conf.worker_group, who && *who ? who : "unknown"};
  return OBX_CTL_OK;
}

void worker_ctl_close(worker_ctl_t *ctl) {
  obx_ladder_destroy(ctl->ladder);
  obx_mongo_destroy(ctl->mongo);
  obx_conf_cleanup(&ctl->conf);
}

int worker_ctl_fail(const char *what, const obx_err_t *err) {
  obx_ctl_errorf("%s: %s", what, err->msg);
  return OBX_CTL_FAILED;
}

const char *worker_ctl_str(const bson_t *doc, const char *path, const char *dflt) {
  const char *s = obx_mongo_doc_str(doc, path);
  return s ? s : dflt;
}

int worker_ctl_list(const worker_ctl_list_t *list, int argc, char **argv) {
  worker_ctl_args_t args;
  int rc = worker_ctl_parse(&args, argc, argv, list->usage);
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos > 1) {
    obx_ctl_errorf("%s: takes at most one status", list->what);
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, false)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ops_list(&ctl.ops, list->store, NULL, args.npos ? args.pos[0] : NULL, args.limit, &out, &err)) {
      rc = worker_ctl_fail(list->what, &err);
      if (err.domain == OBX_ERR_INPUT) rc = OBX_CTL_USAGE;
    } else if (args.json) {
      obx_ctl_print_json(&out);
    } else {
      list->print_header();
      bson_iter_t it, items;
      if (bson_iter_init_find(&it, &out, "items") && bson_iter_recurse(&it, &items)) {
        while (bson_iter_next(&items)) {
          const uint8_t *data;
          uint32_t len;
          bson_t item;
          bson_iter_document(&items, &len, &data);
          if (bson_init_static(&item, data, len)) list->print_item(&item);
        }
      }
    }
    bson_destroy(&out);
  }
  worker_ctl_close(&ctl);
done_args:
  worker_ctl_args_cleanup(&args);
  return rc;
}
