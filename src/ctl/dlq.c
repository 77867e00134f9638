/* dlq.c - `outboxctl dlq`: the parking-lot DLQ on RabbitMQ
 *
 *   outboxctl dlq list [--type T] [--org ORG] [--limit N] [--json]
 *       One line per parked message: id, type, attempts, failure class, reason, first failure.
 *   outboxctl dlq peek ID
 *       Everything a message carries: CloudEvent headers, payload, attempt history.
 *   outboxctl dlq redrive (--id ID | --type T | --org ORG | --all) [--dry-run] [--who NAME]
 *       Moves the selected messages (every condition given applies; --org: the ce_orgid
 *       header) back to the work queue with their attempts reset, in one pass over the DLQ;
 *       the worker runs them again. --dry-run lists what would move.
 *   outboxctl dlq purge --yes [--who NAME]
 *       Deletes every DLQ message.
 *
 * DESIGN: list and peek browse without removing anything (basic.get without ack, the channel
 * closed at the end). redrive and purge are recorded in audit_log (obx_worker_dlq_*). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/worker_ctl.h"

static void print_msg_line(const obx_ladder_msg_t *msg) {
  char first[32] = "-";
  if (msg->first_failure_ms) obx_time_format_rfc3339(msg->first_failure_ms, first);
  const char *type = obx_ladder_msg_header(msg, "ce_type");
  printf("%-36s  %-20s  %7d  %-9s  %-24s  %s\n", msg->message_id ? msg->message_id : "-", type ? type : "-",
         msg->attempt, msg->failure_class ? msg->failure_class : "-", first, msg->reason ? msg->reason : "-");
}

/* The message as a JSON object on one line. */
static void print_msg_json(const obx_ladder_msg_t *msg) {
  bson_t doc = BSON_INITIALIZER, headers;
  BSON_APPEND_UTF8(&doc, "id", msg->message_id ? msg->message_id : "");
  const char *type = obx_ladder_msg_header(msg, "ce_type");
  if (type) BSON_APPEND_UTF8(&doc, "type", type);
  if (msg->key) bson_append_utf8(&doc, "key", -1, msg->key, (int)msg->key_len);
  BSON_APPEND_INT32(&doc, "attempts", msg->attempt);
  if (msg->failure_class) BSON_APPEND_UTF8(&doc, "failureClass", msg->failure_class);
  if (msg->reason) BSON_APPEND_UTF8(&doc, "reason", msg->reason);
  if (msg->last_error) BSON_APPEND_UTF8(&doc, "lastError", msg->last_error);
  if (msg->first_failure_ms) BSON_APPEND_DATE_TIME(&doc, "firstFailureAt", msg->first_failure_ms);
  if (msg->source) BSON_APPEND_UTF8(&doc, "source", msg->source);
  BSON_APPEND_DOCUMENT_BEGIN(&doc, "headers", &headers);
  for (int i = 0; i < msg->nheaders; i++) BSON_APPEND_UTF8(&headers, msg->headers[i].name, msg->headers[i].value);
  bson_append_document_end(&doc, &headers);
  bson_error_t berr;
  char *wrapped = NULL;
  if (msg->history && asprintf(&wrapped, "{\"h\": %s}", msg->history) > 0) {
    bson_t *parsed = bson_new_from_json((const uint8_t *)wrapped, -1, &berr);
    bson_iter_t it;
    if (parsed && bson_iter_init_find(&it, parsed, "h")) bson_append_iter(&doc, "history", -1, &it);
    bson_destroy(parsed);
    free(wrapped);
  }
  /* The payload as a document when it is JSON (it is, unless the record was malformed). */
  bson_t *payload = bson_new_from_json((const uint8_t *)msg->body, (ssize_t)msg->body_len, &berr);
  if (payload) BSON_APPEND_DOCUMENT(&doc, "payload", payload);
  else bson_append_utf8(&doc, "body", -1, msg->body, (int)msg->body_len);
  bson_destroy(payload);
  obx_ctl_print_json(&doc);
  bson_destroy(&doc);
}

typedef struct {
  bool json;
  int n;
} list_ctx_t;

static bool list_visit(void *p, const obx_ladder_msg_t *msg) {
  list_ctx_t *l = p;
  if (l->json) {
    if (l->n) printf(",");
    print_msg_json(msg);
  } else {
    print_msg_line(msg);
  }
  l->n++;
  return true;
}

typedef struct {
  obx_worker_dlq_filter_t filter;
  list_ctx_t list;
} browse_ctx_t;

static bool browse_match(void *p, const obx_ladder_msg_t *msg) { return obx_worker_dlq_match(&((browse_ctx_t *)p)->filter, msg); }
static bool browse_visit(void *p, const obx_ladder_msg_t *msg) { return list_visit(&((browse_ctx_t *)p)->list, msg); }

static int dlq_browse(int argc, char **argv, bool peek) {
  worker_ctl_args_t args;
  const char *usage = peek ? "usage: outboxctl dlq peek ID\n\nShows one DLQ message as JSON without removing it.\n"
                           : "usage: outboxctl dlq list [--type T] [--org ORG] [--limit N] [--json]\n\n"
                             "Lists the DLQ without removing anything.\n";
  int rc = worker_ctl_parse(&args, argc, argv, usage);
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (peek != (args.npos == 1)) {
    obx_ctl_errorf("dlq %s: %s", argv[0], peek ? "wants one message id" : "takes no arguments");
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, true)) == OBX_CTL_OK) {
    /* peek shows the whole message, which only the JSON form holds. */
    browse_ctx_t b = {.filter = {.id = peek ? args.pos[0] : NULL, .type = args.type, .org = args.org},
                      .list = {.json = args.json || peek}};
    if (!peek && !args.json)
      printf("%-36s  %-20s  %7s  %-9s  %-24s  %s\n", "ID", "TYPE", "ATTEMPT", "CLASS", "FIRST FAILURE", "REASON");
    if (args.json && !peek) printf("[");
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_ladder_dlq_browse(ctl.ladder, peek ? 1 : args.limit, browse_match, browse_visit, &b, &err)) {
      rc = worker_ctl_fail("dlq", &err);
    } else if (peek && b.list.n == 0) {
      obx_ctl_errorf("dlq peek: no message %s in %s", args.pos[0], obx_ladder_dlq_queue(ctl.ladder));
      rc = OBX_CTL_FAILED;
    }
    if (args.json && !peek) printf("]\n");
  }
  worker_ctl_close(&ctl);
done_args:
  worker_ctl_args_cleanup(&args);
  return rc;
}

static int dlq_list(int argc, char **argv) { return dlq_browse(argc, argv, false); }
static int dlq_peek(int argc, char **argv) { return dlq_browse(argc, argv, true); }

static bool redrive_visit(void *p, const obx_ladder_msg_t *msg) {
  const bool *dry_run = p;
  printf("%s %s\n", *dry_run ? "would redrive" : "redrive", msg->message_id ? msg->message_id : "-");
  return true;
}

static int dlq_redrive(int argc, char **argv) {
  worker_ctl_args_t args;
  int rc = worker_ctl_parse(&args, argc, argv,
                            "usage: outboxctl dlq redrive (--id ID | --type T | --org ORG | --all) [--dry-run] [--who NAME]\n\n"
                            "Moves DLQ messages back to the work queue with their attempts reset.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  bool some = args.id || args.type || args.org;
  if (args.npos || some == args.all) {
    obx_ctl_errorf("dlq redrive: choose --id ID, --type T and/or --org ORG, or --all");
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, true)) == OBX_CTL_OK) {
    obx_worker_dlq_filter_t filter = {.id = args.id, .type = args.type, .org = args.org};
    int moved = 0;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_worker_dlq_redrive(&ctl.ops, &filter, args.dry_run, redrive_visit, &args.dry_run, &moved, &err))
      rc = worker_ctl_fail("dlq redrive", &err);
    else
      printf("%d message%s %s\n", moved, moved == 1 ? "" : "s", args.dry_run ? "would be redriven (dry run)" : "redriven");
  }
  worker_ctl_close(&ctl);
done_args:
  worker_ctl_args_cleanup(&args);
  return rc;
}

static int dlq_purge(int argc, char **argv) {
  worker_ctl_args_t args;
  int rc = worker_ctl_parse(&args, argc, argv,
                            "usage: outboxctl dlq purge --yes [--who NAME]\n\nDeletes every DLQ message.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos || !args.yes) {
    obx_ctl_errorf("dlq purge: deletes every DLQ message; confirm with --yes");
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, true)) == OBX_CTL_OK) {
    uint32_t purged = 0;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_worker_dlq_purge(&ctl.ops, &purged, &err)) rc = worker_ctl_fail("dlq purge", &err);
    else printf("%u message%s purged\n", purged, purged == 1 ? "" : "s");
  }
  worker_ctl_close(&ctl);
done_args:
  worker_ctl_args_cleanup(&args);
  return rc;
}

int obx_ctl_dlq(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[--type T] [--limit N] [--json]", "List the parked messages (nothing is removed)", dlq_list},
    {"peek", "ID", "Show one message as JSON: headers, payload, attempt history", dlq_peek},
    {"redrive", "(--id ID | --type T | --all) [--dry-run]", "Move messages back to the work queue", dlq_redrive},
    {"purge", "--yes", "Delete every DLQ message", dlq_purge},
  };
  return obx_ctl_dispatch("the parking-lot DLQ on RabbitMQ", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
