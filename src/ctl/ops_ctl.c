/* ops_ctl.c - option parsing and service access for the operators' commands
 *
 * DESIGN: see ops_ctl.h. */
#include "ctl/ops_ctl.h"

#include <amqp.h>

#include "obx/obx_amqp.h"
#include "obx/obx_schema.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  OPT_CLASS = 256, OPT_REASON, OPT_STATUS, OPT_STATE, OPT_UNTIL, OPT_AFTER, OPT_INCLUDE_FINISHED, OPT_WATCH,
  OPT_ACTION, OPT_KEY, OPT_EVENT,
};

/* TIME: RFC 3339, or a duration back from now ("2h", "30m", "7d"). */
static bool parse_time(const char *s, int64_t *ms) {
  if (obx_time_parse_rfc3339(s, ms)) return true;
  int64_t back;
  if (!obx_conf_parse_duration(s, &back)) return false;
  *ms = obx_time_now_ms() - back;
  return true;
}

int ops_ctl_parse(ops_ctl_args_t *a, int argc, char **argv, const char *usage) {
  static const struct option longopts[] = {
    {"json", no_argument, NULL, 'j'},          {"who", required_argument, NULL, 'w'},
    {"dry-run", no_argument, NULL, 'n'},       {"id", required_argument, NULL, 'i'},
    {"type", required_argument, NULL, 't'},    {"since", required_argument, NULL, 's'},
    {"all", no_argument, NULL, 'a'},           {"limit", required_argument, NULL, 'l'},
    {"yes", no_argument, NULL, 'y'},           {"org", required_argument, NULL, 'o'},
    {"key", required_argument, NULL, OPT_KEY}, {"class", required_argument, NULL, OPT_CLASS},
    {"reason", required_argument, NULL, OPT_REASON}, {"status", required_argument, NULL, OPT_STATUS},
    {"state", required_argument, NULL, OPT_STATE},   {"until", required_argument, NULL, OPT_UNTIL},
    {"after", required_argument, NULL, OPT_AFTER},   {"include-finished", no_argument, NULL, OPT_INCLUDE_FINISHED},
    {"watch", no_argument, NULL, OPT_WATCH},         {"action", required_argument, NULL, OPT_ACTION},
    {"event", required_argument, NULL, OPT_EVENT},
    {"help", no_argument, NULL, 'h'},          {0}};
  memset(a, 0, sizeof *a);
  int opt;
  optind = 0;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, ":" OBX_CTL_CONF_OPTSTRING "h", longopts, NULL)) != -1) {
    if (obx_ctl_conf_option(&a->conf, opt, optarg)) continue;
    switch (opt) {
    case 'j': a->json = true; break;
    case 'w': a->who = optarg; break;
    case 'n': a->dry_run = true; break;
    case 'i': {
      bool dup = false;
      for (int i = 0; i < a->nids; i++) dup = dup || strcmp(a->ids[i], optarg) == 0;
      if (dup) break;
      if (a->nids == OPS_CTL_MAX_IDS) {
        obx_ctl_errorf("%s: at most %d --id", argv[0], OPS_CTL_MAX_IDS);
        return OBX_CTL_USAGE;
      }
      a->ids[a->nids++] = optarg;
      break;
    }
    case 't': a->type = optarg; break;
    case 'o': a->org = optarg; break;
    case OPT_KEY: a->key = optarg; break;
    case OPT_CLASS: a->failure_class = optarg; break;
    case OPT_REASON: a->reason = optarg; break;
    case OPT_STATUS: a->status = optarg; break;
    case OPT_STATE: a->state = optarg; break;
    case OPT_AFTER: a->after = optarg; break;
    case OPT_ACTION: a->action = optarg; break;
    case OPT_EVENT: a->event = optarg; break;
    case OPT_INCLUDE_FINISHED: a->include_finished = true; break;
    case OPT_WATCH: a->watch = true; break;
    case 's':
    case OPT_UNTIL:
      if (!parse_time(optarg, opt == 's' ? &a->since_ms : &a->until_ms)) {
        obx_ctl_errorf("%s: %s '%s' is neither RFC 3339 nor a duration such as 2h", argv[0],
                       opt == 's' ? "--since" : "--until", optarg);
        return OBX_CTL_USAGE;
      }
      break;
    case 'a': a->all = true; break;
    case 'y': a->yes = true; break;
    case 'l': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (!*optarg || *end || v < 1 || v > OBX_OPS_MAX_LIMIT) {
        obx_ctl_errorf("%s: --limit wants a number 1..%d, got '%s'", argv[0], OBX_OPS_MAX_LIMIT, optarg);
        return OBX_CTL_USAGE;
      }
      a->limit = (int)v;
      break;
    }
    case 'h':
      printf("%s\noptions:\n" OBX_CTL_CONF_USAGE, usage);
      return OBX_CTL_OK;
    case ':':
      obx_ctl_errorf("%s: option '%s' needs a value", argv[0], argv[optind - 1]);
      return OBX_CTL_USAGE;
    default:
      obx_ctl_errorf("%s: unknown option '%s'", argv[0], argv[optind - 1]);
      return OBX_CTL_USAGE;
    }
  }
  a->pos = argv + optind;
  a->npos = argc - optind;
  return -1;
}

void ops_ctl_args_cleanup(ops_ctl_args_t *a) { obx_ctl_conf_opts_cleanup(&a->conf); }

/* "host:port,host:port" of the MongoDB URI. */
static void mongo_hosts(const char *uri_string, char *buf, size_t len) {
  mongoc_uri_t *uri = mongoc_uri_new(uri_string);
  buf[0] = '\0';
  for (const mongoc_host_list_t *h = uri ? mongoc_uri_get_hosts(uri) : NULL; h; h = h->next)
    snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? "," : "", h->host_and_port);
  mongoc_uri_destroy(uri);
}

/* host:port and vhost of the AMQP URL. */
static void amqp_where(const char *url, char *host, size_t hlen, char *vhost, size_t vlen) {
  struct amqp_connection_info info;
  char *copy = strdup(url ? url : "");
  snprintf(host, hlen, "?");
  snprintf(vhost, vlen, "?");
  if (amqp_parse_url(copy, &info) == AMQP_STATUS_OK) {
    snprintf(host, hlen, "%s:%d", info.host, info.port);
    snprintf(vhost, vlen, "%s", info.vhost);
  }
  free(copy);
}

/* The operator: --who, else the first of $OUTBOXCTL_WHO, $USER, $LOGNAME that is set, else
 * "unknown"; *from names the source (obx_ops_t.who_from). */
static const char *operator_of(const ops_ctl_args_t *args, const char **from) {
  static const char *const vars[] = {"OUTBOXCTL_WHO", "USER", "LOGNAME"};
  static const char *const froms[] = {"$OUTBOXCTL_WHO", "$USER", "$LOGNAME"};
  *from = "--who";
  if (args->who && *args->who) return args->who;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    *from = froms[i];
    if (v && *v) return v;
  }
  *from = "none";
  return "unknown";
}

int ops_ctl_open(ops_ctl_t *ctl, const ops_ctl_args_t *args, unsigned flags) {
  memset(ctl, 0, sizeof *ctl);
  if (!obx_ctl_conf_load(&args->conf, &ctl->conf)) return OBX_CTL_USAGE;
  obx_err_t err = OBX_ERR_INIT;
  if (!(ctl->mongo = obx_mongo_new(&ctl->conf, &err))) {
    obx_ctl_errorf("%s", err.msg);
    return OBX_CTL_USAGE;
  }
  const char *hosts = ctl->mongo_hosts;
  mongo_hosts(ctl->conf.mongo_uri, ctl->mongo_hosts, sizeof ctl->mongo_hosts);
  amqp_where(ctl->conf.amqp_url, ctl->amqp_host, sizeof ctl->amqp_host, ctl->amqp_vhost, sizeof ctl->amqp_vhost);
  /* the collections the command may write in a transaction exist before it (obx_schema.h) */
  if (!obx_schema_ensure(ctl->mongo, &ctl->conf, OBX_SCHEMA_CTL, &err)) {
    obx_ctl_errorf("%s (MongoDB at %s)", err.msg, hosts);
    return OBX_CTL_FAILED;
  }
  snprintf(ctl->target, sizeof ctl->target, "MongoDB %s at %s", obx_mongo_db_name(ctl->mongo), hosts);
  if (flags & OPS_CTL_AMQP) {
    obx_ladder_opts_t lo = {.url = ctl->conf.amqp_url, .prefix = ctl->conf.worker_queue_prefix,
                            .tiers_ms = ctl->conf.retry_ladder.ms, .ntiers = ctl->conf.retry_ladder.n};
    obx_amqp_settings_from_conf(&lo.amqp, &ctl->conf);
    if (!(ctl->ladder = obx_ladder_new(&lo, &err))) {
      obx_ctl_errorf("%s", err.msg);
      return OBX_CTL_USAGE;
    }
    snprintf(ctl->target + strlen(ctl->target), sizeof ctl->target - strlen(ctl->target),
             ", RabbitMQ vhost %s at %s (queues %s.*)", ctl->amqp_vhost, ctl->amqp_host, ctl->conf.worker_queue_prefix);
  }
  const char *from, *who = operator_of(args, &from);
  if ((flags & OPS_CTL_AUDITED) && !args->dry_run && strcmp(from, "--who") != 0) {
    if (strcmp(from, "none") == 0)
      fprintf(stderr, "outboxctl: recording the operator as \"unknown\" (no --who, $OUTBOXCTL_WHO, $USER or $LOGNAME)\n");
    else
      fprintf(stderr, "outboxctl: recording the operator as \"%s\" (from %s; --who NAME sets it)\n", who, from);
  }
  ctl->ops = (obx_ops_t){ctl->mongo, ctl->ladder, ctl->conf.worker_group, who, from};
  return OBX_CTL_OK;
}

void ops_ctl_append_target(const ops_ctl_t *ctl, bson_t *out) {
  bson_t target, mongo, amqp;
  BSON_APPEND_DOCUMENT_BEGIN(out, "target", &target);
  BSON_APPEND_DOCUMENT_BEGIN(&target, "mongodb", &mongo);
  BSON_APPEND_UTF8(&mongo, "database", obx_mongo_db_name(ctl->mongo));
  BSON_APPEND_UTF8(&mongo, "hosts", ctl->mongo_hosts);
  bson_append_document_end(&target, &mongo);
  if (ctl->ladder) {
    BSON_APPEND_DOCUMENT_BEGIN(&target, "rabbitmq", &amqp);
    BSON_APPEND_UTF8(&amqp, "vhost", ctl->amqp_vhost);
    BSON_APPEND_UTF8(&amqp, "host", ctl->amqp_host);
    BSON_APPEND_UTF8(&amqp, "queuePrefix", ctl->conf.worker_queue_prefix);
    bson_append_document_end(&target, &amqp);
  } else {
    BSON_APPEND_NULL(&target, "rabbitmq");
  }
  bson_append_document_end(out, &target);
}

void ops_ctl_close(ops_ctl_t *ctl) {
  obx_ladder_destroy(ctl->ladder);
  obx_mongo_destroy(ctl->mongo);
  obx_conf_cleanup(&ctl->conf);
}

int ops_ctl_fail(const ops_ctl_t *ctl, const char *what, const obx_err_t *err) {
  char where[512] = "";
  if (err->domain == OBX_ERR_AMQP) snprintf(where, sizeof where, " (RabbitMQ at %s, vhost %s)", ctl->amqp_host, ctl->amqp_vhost);
  else if (err->domain == OBX_ERR_MONGO && err->retriable) snprintf(where, sizeof where, " (MongoDB at %s)", ctl->mongo_hosts);
  obx_ctl_errorf("%s: %s%s", what, err->msg, where);
  return err->domain == OBX_ERR_INPUT ? OBX_CTL_USAGE : OBX_CTL_FAILED;
}

const char *ops_ctl_str(const bson_t *doc, const char *path, const char *dflt) {
  const char *s = obx_mongo_doc_str(doc, path);
  return s ? s : dflt;
}

const char *ops_ctl_date(const bson_t *doc, const char *path, char buf[32]) {
  bson_iter_t it, f;
  if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &f) && BSON_ITER_HOLDS_DATE_TIME(&f))
    obx_time_format_rfc3339(bson_iter_date_time(&f), buf);
  else
    snprintf(buf, 32, "-");
  return buf;
}

obx_ops_page_t ops_ctl_page(const ops_ctl_args_t *args) { return (obx_ops_page_t){args->limit, args->after}; }

static void print_list(const ops_ctl_args_t *args, const bson_t *out, void (*print_header)(void),
                       void (*print_item)(const bson_t *item)) {
  if (args->json) {
    obx_ctl_print_json(out);
    return;
  }
  print_header();
  bson_iter_t it, items;
  if (bson_iter_init_find(&it, out, "items") && bson_iter_recurse(&it, &items)) {
    while (bson_iter_next(&items)) {
      const uint8_t *data;
      uint32_t len;
      bson_t item;
      bson_iter_document(&items, &len, &data);
      if (bson_init_static(&item, data, len)) print_item(&item);
    }
  }
  const char *next = obx_mongo_doc_str(out, "next");
  if (next) printf("next page: --after %s\n", next);
}

/* Whether args fit cmd (reported, naming what is wrong, when not). */
static bool read_args_fit(const ops_ctl_read_t *cmd, const ops_ctl_args_t *args) {
  if (cmd->pos_required && args->npos != 1) obx_ctl_errorf("%s: wants one %s", cmd->what, cmd->pos_name);
  else if (!cmd->pos_name && args->npos) obx_ctl_errorf("%s: takes no arguments (filters are options)", cmd->what);
  else if (args->npos > 1) obx_ctl_errorf("%s: takes at most one %s", cmd->what, cmd->pos_name);
  else if (args->nids > cmd->max_ids) obx_ctl_errorf("%s: takes %s --id", cmd->what, cmd->max_ids ? "at most one" : "no");
  else return true;
  return false;
}

int ops_ctl_read(const ops_ctl_read_t *cmd, int argc, char **argv) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv, cmd->usage);
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (!read_args_fit(cmd, &args)) goto done_args;
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, 0)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    if (!cmd->fetch(&ctl, &args, &out, &err)) rc = ops_ctl_fail(&ctl, cmd->what, &err);
    else if (cmd->print_header) print_list(&args, &out, cmd->print_header, cmd->print_item);
    else obx_ctl_print_json(&out);
    bson_destroy(&out);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}
