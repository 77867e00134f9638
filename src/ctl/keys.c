/* keys.c - `outboxctl keys`: business keys parked behind a failing event
 *
 *   outboxctl keys list [--org ORG] [--json]
 *       One line per parked key: key, org, head event, since, blocked events, reason.
 *   outboxctl keys release KEY [--dry-run] [--json]
 *       Lets the key's blocked events run in order without waiting for its head (which stays
 *       in the ladder or among the dead letters). Recorded in audit_log.
 *
 * DESIGN: a thin shell over obx_ops_keys_list and obx_ops_key_release (src/ops/ops_keys.c),
 * shared with the HTTP API; the consumer is WORKER_GROUP. */
#include <stdio.h>

#include "ctl/ops_ctl.h"

static void print_header(void) {
  printf("%-24s  %-12s  %-36s  %-20s  %7s  %s\n", "KEY", "ORG", "HEAD EVENT", "SINCE", "BLOCKED", "REASON");
}

static void print_item(const bson_t *item) {
  char since[32];
  bson_iter_t it;
  long long blocked = bson_iter_init_find(&it, item, "blocked") ? (long long)bson_iter_as_int64(&it) : 0;
  printf("%-24s  %-12s  %-36s  %-20s  %7lld  %s\n", ops_ctl_str(item, "key", "-"), ops_ctl_str(item, "orgId", "-"),
         ops_ctl_str(item, "headEventId", "-"), ops_ctl_date(item, "since", since), blocked,
         ops_ctl_str(item, "reason", ""));
}

static bool fetch(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err) {
  return obx_ops_keys_list(&ctl->ops, args->org, out, err);
}

static int keys_list(int argc, char **argv) {
  static const ops_ctl_read_t cmd = {.what = "keys list", .fetch = fetch, .print_header = print_header,
                                     .print_item = print_item,
                                     .usage = "usage: outboxctl keys list [--org ORG] [--json]\n\nLists the parked keys.\n"};
  return ops_ctl_read(&cmd, argc, argv);
}

static int keys_release(int argc, char **argv) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv,
                         "usage: outboxctl keys release KEY [--dry-run] [--json]\n\n"
                         "Runs the key's blocked events in order without waiting for its head.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos != 1) {
    obx_ctl_errorf("keys release: wants one key");
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, (args.dry_run ? 0 : OPS_CTL_AMQP) | OPS_CTL_AUDITED)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ops_key_release(&ctl.ops, args.org, args.pos[0], args.dry_run, &out, &err)) {
      rc = ops_ctl_fail(&ctl, "keys release", &err);
    } else if (args.json) {
      obx_ctl_print_json(&out);
    } else {
      const char *next = obx_mongo_doc_str(&out, "nextEvent");
      printf("key %s %s: %s%s; %s\n", args.pos[0], args.dry_run ? "would be released (dry run)" : "released",
             next ? "its blocked events run from " : "nothing was blocked", next ? next : "", ctl.target);
    }
    bson_destroy(&out);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}

int obx_ctl_keys(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[--org ORG] [--json]", "List the parked keys and how many events wait behind each", keys_list},
    {"release", "KEY [--dry-run]", "Run a parked key's blocked events without waiting for its head", keys_release},
  };
  return obx_ctl_dispatch("business keys parked behind a failing event", subs, (int)(sizeof subs / sizeof subs[0]), argc,
                          argv);
}
