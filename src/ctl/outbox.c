/* outbox.c - `outboxctl outbox`: the relay's outbox
 *
 *   outboxctl outbox list [STATUS] [--limit N] [--json]
 *       The newest events (all orgs), optionally of one status (PENDING, PUBLISHED, FAILED):
 *       id, type, org, status, attempts, occurredAt, last error.
 *   outboxctl outbox counts [--json]
 *       Events by status.
 *   outboxctl outbox reprocess ID [--dry-run] [--who NAME]
 *       Sends a FAILED event back to PENDING (attempts reset, available now, the last error kept
 *       in the event's history); the relay publishes it again, then the later events of its key
 *       held behind it. Recorded in audit_log.
 *   outboxctl outbox skip ID [--dry-run] [--who NAME]
 *       Gives up on a FAILED event (SKIPPED, never published); the relay publishes the later
 *       events of its key held behind it. Recorded in audit_log.
 *
 * DESIGN: the operations are obx_ops_* (src/ops/ops_outbox.c), the same ones the HTTP API runs;
 * options and service access are ops_ctl.h's. */
#include <stdio.h>
#include <string.h>

#include "ctl/ops_ctl.h"
#include "obx/obx_ops.h"

static void print_event_line(const bson_t *ev) {
  bson_iter_t it;
  char occurred[32] = "-";
  if (bson_iter_init_find(&it, ev, "occurredAt") && BSON_ITER_HOLDS_DATE_TIME(&it))
    obx_time_format_rfc3339(bson_iter_date_time(&it), occurred);
  long long attempts = bson_iter_init_find(&it, ev, "attempts") && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
  printf("%-36s  %-20s  %-12s  %-9s  %8lld  %-24s  %s\n", ops_ctl_str(ev, "_id", "-"),
         ops_ctl_str(ev, "eventType", "-"), ops_ctl_str(ev, "orgId", "-"), ops_ctl_str(ev, "status", "-"),
         attempts, occurred, ops_ctl_str(ev, "lastError", ""));
}

static void print_event_header(void) {
  printf("%-36s  %-20s  %-12s  %-9s  %8s  %-24s  %s\n", "ID", "TYPE", "ORG", "STATUS", "ATTEMPTS", "OCCURRED",
         "LAST ERROR");
}

static bool fetch(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err) {
  obx_ops_page_t page = ops_ctl_page(args);
  return obx_ops_list(&ctl->ops, OBX_OPS_OUTBOX, args->org, args->npos ? args->pos[0] : args->status, &page, out, err);
}

static int outbox_list(int argc, char **argv) {
  static const ops_ctl_read_t cmd = {
    .what = "outbox list", .pos_name = "status", .fetch = fetch, .print_header = print_event_header,
    .print_item = print_event_line,
    .usage = "usage: outboxctl outbox list [STATUS] [--org ORG] [--limit N] [--after CURSOR] [--json]\n\n"
             "Lists the newest outbox events, optionally of one status (PENDING, PUBLISHED, FAILED, SKIPPED).\n"};
  return ops_ctl_read(&cmd, argc, argv);
}

static int outbox_counts(int argc, char **argv) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv, "usage: outboxctl outbox counts [--json]\n\nCounts events by status.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos) {
    obx_ctl_errorf("outbox counts: takes no arguments");
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, 0)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ops_counts(&ctl.ops, OBX_OPS_OUTBOX, args.org, &out, &err)) {
      rc = ops_ctl_fail(&ctl, "outbox counts", &err);
    } else if (args.json) {
      obx_ctl_print_json(&out);
    } else {
      bson_iter_t it;
      if (bson_iter_init(&it, &out))
        while (bson_iter_next(&it)) printf("%-10s %lld\n", bson_iter_key(&it), (long long)bson_iter_as_int64(&it));
    }
    bson_destroy(&out);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}

/* reprocess and skip: one FAILED event moved by fn (what: the command, to: its new status). */
static int outbox_move(int argc, char **argv, const char *usage, const char *what, const char *to,
                       bool (*fn)(const obx_ops_t *, const char *, const char *, bool, bson_t *, obx_err_t *)) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv, usage);
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos != 1) {
    obx_ctl_errorf("%s: wants one event id", what);
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, OPS_CTL_AUDITED)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    if (!fn(&ctl.ops, args.org, args.pos[0], args.dry_run, &out, &err))
      rc = ops_ctl_fail(&ctl, what, &err);
    else if (args.json) obx_ctl_print_json(&out);
    else printf("%s: FAILED -> %s%s; %s\n", args.pos[0], to, args.dry_run ? " (dry run: nothing changed)" : "", ctl.target);
    bson_destroy(&out);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}

static int outbox_reprocess(int argc, char **argv) {
  return outbox_move(argc, argv,
                     "usage: outboxctl outbox reprocess ID [--dry-run] [--who NAME] [--json]\n\n"
                     "Sends a FAILED event back to PENDING; the relay publishes it again (then the later events\n"
                     "of its key, held behind it). To fix an event first, correct its document, then reprocess.\n",
                     "outbox reprocess", "PENDING", obx_ops_outbox_reprocess);
}

static int outbox_skip(int argc, char **argv) {
  return outbox_move(argc, argv,
                     "usage: outboxctl outbox skip ID [--dry-run] [--who NAME] [--json]\n\n"
                     "Gives up on a FAILED event (SKIPPED, never published); the relay publishes the later events\n"
                     "of its key, held behind it.\n",
                     "outbox skip", "SKIPPED", obx_ops_outbox_skip);
}

int obx_ctl_outbox(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[STATUS] [--limit N] [--json]", "List the newest events, optionally of one status", outbox_list},
    {"counts", "[--json]", "Count events by status", outbox_counts},
    {"reprocess", "ID [--dry-run] [--who NAME]", "Send a FAILED event back to PENDING (recorded in audit_log)", outbox_reprocess},
    {"skip", "ID [--dry-run] [--who NAME]", "Give up on a FAILED event, releasing its key (recorded in audit_log)", outbox_skip},
  };
  return obx_ctl_dispatch("the relay's outbox", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
