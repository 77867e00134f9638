/* dlq.c - `outboxctl dlq`: the dead letters (the dead_letters store the worker drains the
 * parking-lot queue into)
 *
 *   outboxctl dlq list [FILTERS] [--limit N] [--after CURSOR] [--json]
 *   outboxctl dlq peek ID
 *   outboxctl dlq redrive (--id ID... | --all [FILTERS]) [--dry-run] [--json]
 *   outboxctl dlq delete (--id ID... | --all [FILTERS]) [--dry-run] [--json]
 *   outboxctl dlq purge --yes [FILTERS] [--dry-run] [--json]
 *   outboxctl dlq export [--id ID... | FILTERS]
 * FILTERS: --org ORG --type T --key K --event EVENT_ID --class CLASS --reason TEXT
 *          --state dead|redriving|redriven --since TIME --until TIME
 *
 * DESIGN: thin shell over obx_ops_dl_* (src/ops/ops_dead_letters.c), shared with the HTTP API.
 * Nothing here reads the RabbitMQ queue. redrive, delete, purge and export are recorded in
 * audit_log with the ids they touched; their --dry-run changes nothing and lists the ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/ops_ctl.h"
#include "obx/obx_json.h"

#define DLQ_FILTERS                                                                                     \
  "FILTERS: --org ORG --type T --key K --event EVENT_ID --class transient|terminal|malformed|exhausted|infra\n" \
  "         --reason TEXT --state dead|redriving|redriven --since TIME --until TIME (RFC 3339 or 2h, 7d back)\n"

static obx_ops_dl_filter_t filter_of(const ops_ctl_args_t *a) {
  return (obx_ops_dl_filter_t){.org = a->org, .type = a->type, .key = a->key, .failure_class = a->failure_class,
                               .reason = a->reason, .state = a->state, .event_id = a->event, .since_ms = a->since_ms,
                               .until_ms = a->until_ms, .ids = a->ids, .nids = a->nids, .all = a->all};
}

static void print_header(void) {
  printf("%-36s  %-36s  %-20s  %-10s  %-9s  %-9s  %7s  %-20s  %s\n", "ID", "EVENT", "TYPE", "ORG", "CLASS", "STATE",
         "REDRIVE", "LAST FAILURE", "REASON");
}

static void print_item(const bson_t *dl) {
  char last[32];
  bson_iter_t it;
  long long redrives = bson_iter_init_find(&it, dl, "redriveCount") ? (long long)bson_iter_as_int64(&it) : 0;
  printf("%-36s  %-36s  %-20s  %-10s  %-9s  %-9s  %7lld  %-20s  %s\n", ops_ctl_str(dl, "_id", "-"),
         ops_ctl_str(dl, "eventId", "-"), ops_ctl_str(dl, "type", "-"), ops_ctl_str(dl, "orgId", "-"),
         ops_ctl_str(dl, "failureClass", "-"), ops_ctl_str(dl, "state", "-"), redrives,
         ops_ctl_date(dl, "lastFailureAt", last), ops_ctl_str(dl, "reason", "-"));
}

static bool fetch_list(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err) {
  obx_ops_dl_filter_t f = filter_of(args);
  obx_ops_page_t page = ops_ctl_page(args);
  return obx_ops_dl_list(&ctl->ops, &f, &page, out, err);
}

static int dlq_list(int argc, char **argv) {
  static const ops_ctl_read_t cmd = {.what = "dlq list", .max_ids = OPS_CTL_MAX_IDS, .fetch = fetch_list,
                                     .print_header = print_header, .print_item = print_item,
                                     .usage = "usage: outboxctl dlq list [FILTERS] [--limit N] [--after CURSOR] [--json]\n\n"
                                              "Lists dead letters, newest failure first.\n" DLQ_FILTERS};
  return ops_ctl_read(&cmd, argc, argv);
}

static bool fetch_one(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err) {
  return obx_ops_dl_get(&ctl->ops, NULL, args->pos[0], out, err);
}

static int dlq_peek(int argc, char **argv) {
  static const ops_ctl_read_t cmd = {
    .what = "dlq peek", .pos_name = "dead-letter id", .pos_required = true, .fetch = fetch_one,
    .usage = "usage: outboxctl dlq peek ID\n\nShows one dead letter as JSON: headers, payload, history.\n"};
  return ops_ctl_read(&cmd, argc, argv);
}

/* The answer of redrive/delete/purge: --json as is, else the ids and a count line. */
static void print_action(const ops_ctl_t *ctl, const ops_ctl_args_t *args, const bson_t *out, const char *verb) {
  if (args->json) {
    obx_ctl_print_json(out);
    return;
  }
  bson_iter_t it, ids;
  if (bson_iter_init_find(&it, out, "ids") && bson_iter_recurse(&it, &ids))
    while (bson_iter_next(&ids)) printf("%s%s\n", args->dry_run ? "would: " : "", bson_iter_utf8(&ids, NULL));
  long long n = bson_iter_init_find(&it, out, "count") ? (long long)bson_iter_as_int64(&it) : 0;
  const char *id = obx_mongo_doc_str(out, "redriveId");
  printf("%lld dead letter%s %s%s%s; %s\n", n, n == 1 ? "" : "s", args->dry_run ? "would be " : "", verb,
         args->dry_run ? " (dry run)" : "", ctl->target);
  if (id && !args->dry_run) printf("redrive id %s\n", id);
}

typedef bool (*dl_action_fn)(const obx_ops_t *, const obx_ops_dl_filter_t *, bool, bson_t *, obx_err_t *);

static int dlq_act(int argc, char **argv, const char *usage, bool purge, bool need_amqp, dl_action_fn fn,
                   const char *verb) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv, usage);
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (purge) {
    if (args.npos || args.nids || args.all || (!args.yes && !args.dry_run)) {
      obx_ctl_errorf("dlq purge: deletes every dead letter the filters select; confirm with --yes (or --dry-run)");
      goto done_args;
    }
    args.all = true;
  } else if (args.npos || (args.nids > 0) == args.all) {
    obx_ctl_errorf("%s: choose --id ID (repeatable) or --all with filters", argv[0]);
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, (need_amqp ? OPS_CTL_AMQP : 0) | OPS_CTL_AUDITED)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    obx_ops_dl_filter_t f = filter_of(&args);
    char what[32];
    snprintf(what, sizeof what, "dlq %s", argv[0]);
    if (!fn(&ctl.ops, &f, args.dry_run, &out, &err)) rc = ops_ctl_fail(&ctl, what, &err);
    else print_action(&ctl, &args, &out, verb);
    bson_destroy(&out);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}

static int dlq_redrive(int argc, char **argv) {
  return dlq_act(argc, argv,
                 "usage: outboxctl dlq redrive (--id ID... | --all [FILTERS]) [--dry-run] [--json]\n\n"
                 "Sends dead letters back to the work queue (attempts reset), each exactly once.\n" DLQ_FILTERS,
                 false, true, obx_ops_dl_redrive, "redriven");
}

static int dlq_delete(int argc, char **argv) {
  return dlq_act(argc, argv,
                 "usage: outboxctl dlq delete (--id ID... | --all [FILTERS]) [--dry-run] [--json]\n\n"
                 "Deletes dead letters (recorded in audit_log with their ids).\n" DLQ_FILTERS,
                 false, false, obx_ops_dl_delete, "deleted");
}

static int dlq_purge(int argc, char **argv) {
  return dlq_act(argc, argv,
                 "usage: outboxctl dlq purge --yes [FILTERS] [--dry-run] [--json]\n\n"
                 "Deletes every dead letter the filters select (all of them without filters).\n" DLQ_FILTERS,
                 true, false, obx_ops_dl_delete, "deleted");
}

static bool emit_line(void *ctx, const bson_t *doc) {
  (void)ctx;
  char *json = obx_json_render(doc, NULL, NULL);
  bool ok = printf("%s\n", json) > 0;
  bson_free(json);
  return ok;
}

static int dlq_export(int argc, char **argv) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv,
                         "usage: outboxctl dlq export [--id ID... | FILTERS]\n\n"
                         "Writes the selected dead letters, whole, one JSON document per line (recorded in audit_log).\n"
                         DLQ_FILTERS);
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos) {
    obx_ctl_errorf("dlq export: takes no arguments (filters are options)");
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, OPS_CTL_AUDITED)) == OBX_CTL_OK) {
    obx_err_t err = OBX_ERR_INIT;
    obx_ops_dl_filter_t f = filter_of(&args);
    int64_t n = 0;
    if (!obx_ops_dl_export(&ctl.ops, &f, emit_line, NULL, &n, &err)) rc = ops_ctl_fail(&ctl, "dlq export", &err);
    else fprintf(stderr, "outboxctl: exported %lld dead letter%s from %s\n", (long long)n, n == 1 ? "" : "s", ctl.target);
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}

int obx_ctl_dlq(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[FILTERS] [--limit N] [--after CURSOR] [--json]", "List dead letters, newest failure first", dlq_list},
    {"peek", "ID", "Show one dead letter as JSON: headers, payload, attempt history", dlq_peek},
    {"redrive", "(--id ID... | --all [FILTERS]) [--dry-run]", "Send dead letters back to the work queue, once each",
     dlq_redrive},
    {"delete", "(--id ID... | --all [FILTERS]) [--dry-run]", "Delete dead letters", dlq_delete},
    {"purge", "--yes [FILTERS] [--dry-run]", "Delete every dead letter the filters select", dlq_purge},
    {"export", "[--id ID... | FILTERS]", "Write dead letters as JSON lines", dlq_export},
  };
  return obx_ctl_dispatch("dead letters (the dead_letters store)", subs, (int)(sizeof subs / sizeof subs[0]), argc,
                          argv);
}
