/* inbox.c - `outboxctl inbox`: the worker's inbox and replays
 *
 *   outboxctl inbox list [STATUS] [--limit N] [--json]
 *       The newest inbox entries of WORKER_GROUP, optionally of one status: obx_ops_list, as
 *       GET /api/inbox (--json prints its answer, every org).
 *   outboxctl inbox show EVENT_ID
 *       The inbox entry of an event (status, attempts, last error, executions, payload) as
 *       JSON.
 *   outboxctl inbox replay EVENT_ID [--who NAME]
 *       Runs a stored event through its pipeline again (a new pipeline_executions record),
 *       whatever its status.
 *   outboxctl inbox replay --type T --since TIME [--dry-run] [--who NAME]
 *       The same for every stored event of type T received since TIME (RFC 3339, or a
 *       duration back from now such as 2h), oldest first. A progress bar is drawn when stdout
 *       is a terminal.
 *
 * DESIGN: replays publish the stored CloudEvent to the work queue with x-replay and the
 * running worker executes it on its key's lane (obx_worker_replay_*); each is recorded in
 * audit_log. The consumer is WORKER_GROUP. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctl/worker_ctl.h"
#include "obx/obx_inbox.h"
#include "obx/obx_ops.h"

static void print_entry_line(const bson_t *entry) {
  bson_iter_t it;
  char received[32] = "-";
  if (bson_iter_init_find(&it, entry, "receivedAt") && BSON_ITER_HOLDS_DATE_TIME(&it))
    obx_time_format_rfc3339(bson_iter_date_time(&it), received);
  long long attempts = bson_iter_init_find(&it, entry, "attempts") && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
  printf("%-36s  %-20s  %-12s  %-10s  %8lld  %-24s  %s\n", worker_ctl_str(entry, "_id.eventId", "-"),
         worker_ctl_str(entry, "eventType", "-"), worker_ctl_str(entry, "orgId", "-"),
         worker_ctl_str(entry, "status", "-"), attempts, received, worker_ctl_str(entry, "lastError", ""));
}

static void print_entry_header(void) {
  printf("%-36s  %-20s  %-12s  %-10s  %8s  %-24s  %s\n", "EVENT ID", "TYPE", "ORG", "STATUS", "ATTEMPTS", "RECEIVED",
         "LAST ERROR");
}

static int inbox_list(int argc, char **argv) {
  static const worker_ctl_list_t list = {
    "inbox list", OBX_OPS_INBOX,
    "usage: outboxctl inbox list [STATUS] [--limit N] [--json]\n\n"
    "Lists the newest inbox entries, optionally of one status (RECEIVED, PROCESSING, DONE,\n"
    "SKIPPED, RETRYING, DEAD, BLOCKED).\n",
    print_entry_header, print_entry_line};
  return worker_ctl_list(&list, argc, argv);
}

static int inbox_show(int argc, char **argv) {
  worker_ctl_args_t args;
  int rc = worker_ctl_parse(&args, argc, argv, "usage: outboxctl inbox show EVENT_ID\n\nPrints the inbox entry as JSON.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos != 1) {
    obx_ctl_errorf("inbox show: wants one event id");
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, false)) == OBX_CTL_OK) {
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    obx_err_t err = OBX_ERR_INIT;
    mongoc_client_t *client = obx_mongo_pop(ctl.mongo);
    bool ok = obx_inbox_get(client, obx_mongo_db_name(ctl.mongo), NULL, ctl.ops.consumer, args.pos[0], &doc, &found, &err);
    obx_mongo_push(ctl.mongo, client);
    if (!ok) {
      rc = worker_ctl_fail("inbox show", &err);
    } else if (!found) {
      obx_ctl_errorf("inbox show: no entry for event %s of consumer %s", args.pos[0], ctl.ops.consumer);
      rc = OBX_CTL_FAILED;
    } else {
      obx_ctl_print_json(&doc);
    }
    bson_destroy(&doc);
  }
  worker_ctl_close(&ctl);
done_args:
  worker_ctl_args_cleanup(&args);
  return rc;
}

/* TIME: RFC 3339, or a duration back from now ("2h", "30m", "7d"). */
static bool parse_since(const char *s, int64_t *ms) {
  if (obx_time_parse_rfc3339(s, ms)) return true;
  int64_t back;
  if (!obx_conf_parse_duration(s, &back)) return false;
  *ms = obx_time_now_ms() - back;
  return true;
}

static void progress_bar(void *ctx, int64_t done, int64_t total) {
  const int width = 40;
  int fill = total > 0 ? (int)(done * width / total) : width;
  printf("\r[%.*s%*s] %lld/%lld", fill, "########################################", width - fill, "", (long long)done,
         (long long)total);
  fflush(stdout);
}

static int inbox_replay(int argc, char **argv) {
  worker_ctl_args_t args;
  int rc = worker_ctl_parse(&args, argc, argv,
                            "usage: outboxctl inbox replay EVENT_ID\n"
                            "       outboxctl inbox replay --type T --since TIME [--dry-run]\n\n"
                            "Runs stored events through their pipeline again (new execution records).\n"
                            "TIME is RFC 3339 or a duration back from now (2h, 7d).\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  bool by_type = args.type || args.since;
  int64_t since = 0;
  if (by_type ? (args.npos || !args.type || !args.since) : (args.npos != 1 || args.dry_run)) {
    obx_ctl_errorf("inbox replay: give one EVENT_ID, or --type T --since TIME [--dry-run]");
    goto done_args;
  }
  if (by_type && !parse_since(args.since, &since)) {
    obx_ctl_errorf("inbox replay: --since '%s' is neither RFC 3339 nor a duration", args.since);
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, true)) == OBX_CTL_OK) {
    obx_err_t err = OBX_ERR_INIT;
    if (!by_type) {
      if (!obx_worker_replay_event(&ctl.ops, args.pos[0], &err)) rc = worker_ctl_fail("inbox replay", &err);
      else printf("event %s sent for replay\n", args.pos[0]);
    } else {
      int64_t n = 0;
      bool tty = isatty(STDOUT_FILENO);
      bool ok = obx_worker_replay_type(&ctl.ops, args.type, since, args.dry_run, tty ? progress_bar : NULL, NULL, &n, &err);
      if (tty && n) printf("\n");
      if (!ok) rc = worker_ctl_fail("inbox replay", &err);
      else printf("%lld event%s of type %s %s\n", (long long)n, n == 1 ? "" : "s", args.type,
                  args.dry_run ? "would be replayed (dry run)" : "sent for replay");
    }
  }
  worker_ctl_close(&ctl);
done_args:
  worker_ctl_args_cleanup(&args);
  return rc;
}

int obx_ctl_inbox(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[STATUS] [--limit N] [--json]", "List the newest inbox entries, optionally of one status", inbox_list},
    {"show", "EVENT_ID", "Show the inbox entry of an event as JSON", inbox_show},
    {"replay", "EVENT_ID | --type T --since TIME [--dry-run]", "Run stored events through their pipeline again",
     inbox_replay},
  };
  return obx_ctl_dispatch("the worker's inbox and replays", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
