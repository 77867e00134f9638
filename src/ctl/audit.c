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

static bool fetch(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err) {
  obx_ops_audit_filter_t f = {.org = args->org, .action = args->action, .target = args->nids ? args->ids[0] : NULL,
                              .since_ms = args->since_ms, .until_ms = args->until_ms};
  obx_ops_page_t page = ops_ctl_page(args);
  return obx_ops_audit_list(&ctl->ops, &f, &page, out, err);
}

static int audit_list(int argc, char **argv) {
  static const ops_ctl_read_t cmd = {
    .what = "audit list", .max_ids = 1, .fetch = fetch, .print_header = print_header, .print_item = print_item,
    .usage = "usage: outboxctl audit list [--org ORG] [--action ACTION] [--id TARGET] [--since TIME]\n"
             "                            [--until TIME] [--limit N] [--after CURSOR] [--json]\n\n"
             "Lists operator actions, newest first (dlq.redrive, dlq.delete, dlq.export, inbox.replay,\n"
             "keys.release, outbox.reprocess, outbox.skip).\n"};
  return ops_ctl_read(&cmd, argc, argv);
}

int obx_ctl_audit(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[--org ORG] [--action A] [--id TARGET] [--since TIME] [--until TIME] [--json]",
     "List operator actions, newest first", audit_list},
  };
  return obx_ctl_dispatch("the audit log of operator actions", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
