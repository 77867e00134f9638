/* inbox.c - `outboxctl inbox`: the worker's inbox and replays
 *
 *   outboxctl inbox list [STATUS] [--limit N] [--json]
 *       The newest inbox entries of WORKER_GROUP, optionally of one status: obx_ops_list, as
 *       GET /api/inbox (--json prints its answer, every org).
 *   outboxctl inbox show EVENT_ID
 *       The inbox entry of an event and its executions with their steps, as JSON.
 *   outboxctl inbox replay EVENT_ID | [--org --status --type --key --since --until]
 *                          [--include-finished] [--dry-run] [--json]
 *       Runs stored events through their pipeline again (a new pipeline_executions record
 *       each); DONE/SKIPPED only with --include-finished; every replay has an id.
 *
 * DESIGN: thin shell over obx_ops_inbox_* (src/ops/ops_inbox.c): replays publish the stored
 * CloudEvent to the work queue with x-replay and the running worker executes it on its key's
 * lane; each is recorded in audit_log. The consumer is WORKER_GROUP. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctl/ops_ctl.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ops.h"

static void print_entry_line(const bson_t *entry) {
  bson_iter_t it;
  char received[32] = "-";
  if (bson_iter_init_find(&it, entry, "receivedAt") && BSON_ITER_HOLDS_DATE_TIME(&it))
    obx_time_format_rfc3339(bson_iter_date_time(&it), received);
  long long attempts = bson_iter_init_find(&it, entry, "attempts") && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
  printf("%-36s  %-20s  %-12s  %-10s  %8lld  %-24s  %s\n", ops_ctl_str(entry, "_id.eventId", "-"),
         ops_ctl_str(entry, "eventType", "-"), ops_ctl_str(entry, "orgId", "-"),
         ops_ctl_str(entry, "status", "-"), attempts, received, ops_ctl_str(entry, "lastError", ""));
}

static void print_entry_header(void) {
  printf("%-36s  %-20s  %-12s  %-10s  %8s  %-24s  %s\n", "EVENT ID", "TYPE", "ORG", "STATUS", "ATTEMPTS", "RECEIVED",
         "LAST ERROR");
}

static bool fetch_list(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err) {
  obx_ops_page_t page = ops_ctl_page(args);
  return obx_ops_list(&ctl->ops, OBX_OPS_INBOX, args->org, args->npos ? args->pos[0] : args->status, &page, out, err);
}

static int inbox_list(int argc, char **argv) {
  static const ops_ctl_read_t cmd = {
    .what = "inbox list", .pos_name = "status", .fetch = fetch_list, .print_header = print_entry_header,
    .print_item = print_entry_line,
    .usage = "usage: outboxctl inbox list [STATUS] [--org ORG] [--limit N] [--after CURSOR] [--json]\n\n"
             "Lists the newest inbox entries, optionally of one status (RECEIVED, PROCESSING, DONE,\n"
             "SKIPPED, RETRYING, DEAD, BLOCKED).\n"};
  return ops_ctl_read(&cmd, argc, argv);
}

static bool fetch_one(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err) {
  return obx_ops_inbox_get(&ctl->ops, NULL, args->pos[0], out, err);
}

static int inbox_show(int argc, char **argv) {
  static const ops_ctl_read_t cmd = {
    .what = "inbox show", .pos_name = "event id", .pos_required = true, .fetch = fetch_one,
    .usage = "usage: outboxctl inbox show EVENT_ID\n\nPrints the inbox entry and its executions (with their steps) as JSON.\n"};
  return ops_ctl_read(&cmd, argc, argv);
}

static void progress_bar(void *ctx, int64_t done, int64_t total) {
  const int width = 40;
  int fill = total > 0 ? (int)(done * width / total) : width;
  printf("\r[%.*s%*s] %lld/%lld", fill, "########################################", width - fill, "", (long long)done,
         (long long)total);
  fflush(stdout);
}

#define REPLAY_PREVIEW 20

static int inbox_replay(int argc, char **argv) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv,
                         "usage: outboxctl inbox replay EVENT_ID [--dry-run] [--json]\n"
                         "       outboxctl inbox replay [--org ORG] [--status S] [--type T] [--key K] [--since TIME]\n"
                         "                              [--until TIME] [--include-finished] [--dry-run] [--json]\n\n"
                         "Runs stored events through their pipeline again (new execution records), oldest first.\n"
                         "DONE and SKIPPED entries are replayed only with --include-finished. A filtered replay\n"
                         "needs at least one of --type, --key, --since, --status. --dry-run lists the first\n"
                         "events and the count. TIME is RFC 3339 or a duration back from now (2h, 7d).\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  bool filtered = args.type || args.key || args.since_ms || args.status;
  if (args.npos > 1 || (args.npos == 1) == filtered) {
    obx_ctl_errorf("inbox replay: give one EVENT_ID, or filters (--type, --key, --since, --status)");
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, (args.dry_run ? 0 : OPS_CTL_AMQP) | OPS_CTL_AUDITED)) == OBX_CTL_OK) {
    obx_ops_replay_filter_t f = {.org = args.org, .status = args.status, .type = args.type, .key = args.key,
                                 .event_id = args.npos ? args.pos[0] : NULL, .since_ms = args.since_ms,
                                 .until_ms = args.until_ms, .include_finished = args.include_finished};
    bool tty = !args.json && !args.dry_run && isatty(STDOUT_FILENO);
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_ops_inbox_replay(&ctl.ops, &f, args.dry_run, REPLAY_PREVIEW, tty ? progress_bar : NULL, NULL, &out, &err);
    bson_iter_t it, ev;
    long long n = bson_iter_init_find(&it, &out, "count") ? (long long)bson_iter_as_int64(&it) : 0;
    if (tty && n) printf("\n");
    if (!ok) {
      rc = ops_ctl_fail(&ctl, "inbox replay", &err);
    } else if (args.json) {
      obx_ctl_print_json(&out);
    } else {
      if (args.dry_run && bson_iter_init_find(&it, &out, "events") && bson_iter_recurse(&it, &ev))
        while (bson_iter_next(&ev)) printf("would replay %s\n", bson_iter_utf8(&ev, NULL));
      if (args.dry_run && n > REPLAY_PREVIEW) printf("... and %lld more\n", n - REPLAY_PREVIEW);
      printf("%lld event%s %s (replay %s); %s\n", n, n == 1 ? "" : "s",
             args.dry_run ? "would be replayed (dry run)" : "sent for replay", ops_ctl_str(&out, "replayId", "-"),
             ctl.target);
    }
    bson_destroy(&out);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}

int obx_ctl_inbox(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[STATUS] [--org ORG] [--limit N] [--after CURSOR] [--json]", "List the newest inbox entries, optionally of one status", inbox_list},
    {"show", "EVENT_ID", "Show the inbox entry of an event as JSON", inbox_show},
    {"replay", "EVENT_ID | [--org --status --type --key --since --until] [--include-finished] [--dry-run]",
     "Run stored events through their pipeline again",
     inbox_replay},
  };
  return obx_ctl_dispatch("the worker's inbox and replays", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
