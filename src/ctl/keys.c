/* keys.c - `outboxctl keys`: business keys parked behind a failing event
 *
 *   outboxctl keys list [--json]
 *       One line per parked key: key, head event, since, blocked events, reason.
 *   outboxctl keys release KEY [--who NAME]
 *       Lets the key's blocked events run in order without waiting for its head (which stays
 *       in the ladder or the DLQ). Recorded in audit_log.
 *
 * DESIGN: a thin shell over obx_inbox_list_parked and obx_worker_key_release; the consumer is
 * WORKER_GROUP. */
#include <stdio.h>

#include "ctl/worker_ctl.h"
#include "obx/obx_inbox.h"

static int keys_list(int argc, char **argv) {
  worker_ctl_args_t args;
  int rc = worker_ctl_parse(&args, argc, argv, "usage: outboxctl keys list [--json]\n\nLists the parked keys.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos) {
    obx_ctl_errorf("keys list: takes no arguments");
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, false)) == OBX_CTL_OK) {
    bson_t out = BSON_INITIALIZER;
    obx_err_t err = OBX_ERR_INIT;
    mongoc_client_t *client = obx_mongo_pop(ctl.mongo);
    bool ok = obx_inbox_list_parked(client, obx_mongo_db_name(ctl.mongo), ctl.ops.consumer, &out, &err);
    obx_mongo_push(ctl.mongo, client);
    if (!ok) {
      rc = worker_ctl_fail("keys list", &err);
    } else if (args.json) {
      obx_ctl_print_json(&out);
    } else {
      printf("%-24s  %-36s  %-24s  %7s  %s\n", "KEY", "HEAD EVENT", "SINCE", "BLOCKED", "REASON");
      bson_iter_t it, keys;
      if (bson_iter_init_find(&it, &out, "keys") && bson_iter_recurse(&it, &keys)) {
        while (bson_iter_next(&keys)) {
          bson_t item;
          const uint8_t *data;
          uint32_t len;
          bson_iter_document(&keys, &len, &data);
          bson_init_static(&item, data, len);
          bson_iter_t f;
          const char *key = bson_iter_init_find(&f, &item, "key") ? bson_iter_utf8(&f, NULL) : "";
          const char *head = bson_iter_init_find(&f, &item, "headEventId") ? bson_iter_utf8(&f, NULL) : "";
          const char *reason = bson_iter_init_find(&f, &item, "reason") ? bson_iter_utf8(&f, NULL) : "";
          int64_t blocked = bson_iter_init_find(&f, &item, "blocked") ? bson_iter_as_int64(&f) : 0;
          char since[32] = "-";
          if (bson_iter_init_find(&f, &item, "since")) obx_time_format_rfc3339(bson_iter_date_time(&f), since);
          printf("%-24s  %-36s  %-24s  %7lld  %s\n", key, head, since, (long long)blocked, reason);
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

static int keys_release(int argc, char **argv) {
  worker_ctl_args_t args;
  int rc = worker_ctl_parse(&args, argc, argv,
                            "usage: outboxctl keys release KEY [--who NAME]\n\n"
                            "Runs the key's blocked events in order without waiting for its head.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos != 1) {
    obx_ctl_errorf("keys release: wants one key");
    goto done_args;
  }
  worker_ctl_t ctl;
  if ((rc = worker_ctl_open(&ctl, &args, true)) == OBX_CTL_OK) {
    char next[OBX_UUID_LEN + 1];
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_worker_key_release(&ctl.ops, args.pos[0], next, &err)) rc = worker_ctl_fail("keys release", &err);
    else if (next[0]) printf("key %s released: its blocked events run from %s on\n", args.pos[0], next);
    else printf("key %s released (nothing was blocked)\n", args.pos[0]);
  }
  worker_ctl_close(&ctl);
done_args:
  worker_ctl_args_cleanup(&args);
  return rc;
}

int obx_ctl_keys(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"list", "[--json]", "List the parked keys and how many events wait behind each", keys_list},
    {"release", "KEY", "Run a parked key's blocked events without waiting for its head", keys_release},
  };
  return obx_ctl_dispatch("business keys parked behind a failing event", subs, (int)(sizeof subs / sizeof subs[0]), argc,
                          argv);
}
