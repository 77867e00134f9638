/* audit.c - `outboxctl audit`: the audit_log of operator actions
 *
 *   outboxctl audit list [--org ORG] [--action A] [--id TARGET]
 *                        [--since TIME] [--until TIME] [--limit N] [--after CURSOR] [--json]
 *       Newest first: when, who, action, target, org.
 *
 * DESIGN: a thin shell over obx_ops_audit_list (src/ops/ops_audit.c), as GET /api/audit. */
#include <stdio.h>

#include "ctl/ops_ctl.h"

static void print_header(void) { printf("%-20s  %-24s  %-20s  %-12s  %s\n", "WHEN", "WHO", "ACTION", "ORG", "TARGET"); }

static void print_item(const bson_t *e) {
  char when[32];
  printf("%-20s  %-24s  %-20s  %-12s  %s\n", ops_ctl_date(e, "when", when), ops_ctl_str(e, "who", "-"),
         ops_ctl_str(e, "action", "-"), ops_ctl_str(e, "orgId", "-"), ops_ctl_str(e, "target", "-"));
}

static int audit_list(int argc, char **argv) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv,
                         "usage: outboxctl audit list [--org ORG] [--action ACTION] [--id TARGET] [--since TIME]\n"
                         "                            [--until TIME] [--limit N] [--after CURSOR] [--json]\n\n"
                         "Lists operator actions, newest first (dlq.redrive, dlq.delete, dlq.export, inbox.replay,\n"
                         "keys.release, outbox.reprocess).\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos || args.nids > 1) {
    obx_ctl_errorf("audit list: takes no arguments and at most one --id");
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, false)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    obx_ops_audit_filter_t f = {.org = args.org, .action = args.action, .target = args.nids ? args.ids[0] : NULL,
                                .since_ms = args.since_ms, .until_ms = args.until_ms};
    obx_ops_page_t page = ops_ctl_page(&args);
    if (!obx_ops_audit_list(&ctl.ops, &f, &page, &out, &err)) rc = ops_ctl_fail(&ctl, "audit list", &err);
    else ops_ctl_print_list(&args, &out, print_header, print_item);
    bson_destroy(&out);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}

int obx_ctl_audit(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[--org ORG] [--action A] [--id TARGET] [--since TIME] [--until TIME] [--json]",
     "List operator actions, newest first", audit_list},
  };
  return obx_ctl_dispatch("the audit log of operator actions", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
