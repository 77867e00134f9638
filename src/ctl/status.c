/* status.c - `outboxctl status`: the whole system at a glance
 *
 *   outboxctl status [--json] [--watch]
 *       Which MongoDB database and RabbitMQ vhost, relay leader and lease, checkpoint age (with
 *       RELAY_BUCKETS > 1: every bucket's holder, lease and checkpoint age, and the relays that
 *       share them with the buckets each holds), lag (age of the oldest due PENDING event),
 *       outbox and inbox counts by status, dead letters, DLQ depth (unknown when RabbitMQ does
 *       not answer), parked keys, and what is degraded.
 *
 * DESIGN: one call to obx_ops_status (src/ops/ops_status.c); this file only prints (--json adds the
 * target, {mongodb: {database, hosts}, rabbitmq: {vhost, host, queuePrefix}}). Exit 0
 * healthy, 3 (OBX_CTL_DEGRADED) when something is degraded, 1 when MongoDB cannot be read. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl/ops_ctl.h"
#include "obx/obx_log.h"
#include "obx/obx_ops.h"

static bool sub_doc(const bson_t *doc, const char *name, bson_t *out) {
  bson_iter_t it;
  const uint8_t *data;
  uint32_t len;
  if (!bson_iter_init_find(&it, doc, name) || !BSON_ITER_HOLDS_DOCUMENT(&it)) return false;
  bson_iter_document(&it, &len, &data);
  return bson_init_static(out, data, len);
}

/* Writes a date field as RFC 3339 into buf ("-" when null). */
static const char *date_field(const bson_t *doc, const char *name, char buf[32]) {
  bson_iter_t it;
  if (bson_iter_init_find(&it, doc, name) && BSON_ITER_HOLDS_DATE_TIME(&it)) obx_time_format_rfc3339(bson_iter_date_time(&it), buf);
  else snprintf(buf, 32, "-");
  return buf;
}

static long long int_field(const bson_t *doc, const char *name, long long dflt) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, name) && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : dflt;
}

static void print_counts(const char *title, const bson_t *status) {
  bson_t counts;
  bson_iter_t it;
  printf("%-12s", title);
  if (sub_doc(status, title, &counts) && bson_iter_init(&it, &counts))
    while (bson_iter_next(&it)) printf(" %s=%lld", bson_iter_key(&it), (long long)bson_iter_as_int64(&it));
  printf("\n");
}

static const char *str_field(const bson_t *doc, const char *name) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, name) && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
}

/* With buckets: one line per bucket (holder, lease, checkpoint age), then one per member. */
static void print_buckets(const bson_t *relay) {
  bson_iter_t it, entries, field, held;
  char a[32];
  printf("%-12s %lld buckets\n", "relay", int_field(relay, "buckets", 0));
  if (bson_iter_init_find(&it, relay, "bucketHolders") && bson_iter_recurse(&it, &entries))
    while (bson_iter_next(&entries)) {
      bson_t entry;
      uint32_t len;
      const uint8_t *data;
      if (!BSON_ITER_HOLDS_DOCUMENT(&entries)) continue;
      bson_iter_document(&entries, &len, &data);
      if (!bson_init_static(&entry, data, len)) continue;
      const char *holder = str_field(&entry, "holder");
      char ckpt[64];
      long long age = int_field(&entry, "checkpointAgeMs", -1);
      if (age >= 0) snprintf(ckpt, sizeof ckpt, "checkpoint %.1f s ago", (double)age / 1000.0);
      else snprintf(ckpt, sizeof ckpt, "no checkpoint");
      if (holder)
        printf("%-12s bucket %-4lld held by %s (epoch %lld, lease until %s), %s\n", "", int_field(&entry, "bucket", 0), holder,
               int_field(&entry, "epoch", 0), date_field(&entry, "leaseExpiresAt", a), ckpt);
      else
        printf("%-12s bucket %-4lld no holder, %s\n", "", int_field(&entry, "bucket", 0), ckpt);
    }
  if (bson_iter_init_find(&it, relay, "members") && bson_iter_recurse(&it, &entries))
    while (bson_iter_next(&entries)) {
      bson_t member;
      uint32_t len;
      const uint8_t *data;
      if (!BSON_ITER_HOLDS_DOCUMENT(&entries)) continue;
      bson_iter_document(&entries, &len, &data);
      if (!bson_init_static(&member, data, len)) continue;
      printf("%-12s member %s holds", "", str_field(&member, "owner") ? str_field(&member, "owner") : "?");
      int n = 0;
      if (bson_iter_init_find(&field, &member, "held") && bson_iter_recurse(&field, &held))
        while (bson_iter_next(&held)) printf(" %lld", (long long)bson_iter_as_int64(&held)), n++;
      printf("%s (heartbeat until %s)\n", n ? "" : " nothing", date_field(&member, "expiresAt", a));
    }
}

static void print_text(const bson_t *status) {
  bson_t relay, dlq;
  bson_iter_t it;
  char a[32], b[32];
  if (sub_doc(status, "relay", &relay)) {
    const char *leader = str_field(&relay, "leader");
    bool buckets = bson_iter_init_find(&it, &relay, "bucketHolders");
    if (buckets)
      print_buckets(&relay);
    else if (leader)
      printf("%-12s leader %s (epoch %lld, lease until %s)\n", "relay", leader, int_field(&relay, "epoch", 0),
             date_field(&relay, "leaseExpiresAt", a));
    else
      printf("%-12s no leader (last lease expired %s)\n", "relay", date_field(&relay, "leaseExpiresAt", a));
    long long age = int_field(&relay, "checkpointAgeMs", -1);
    if (age >= 0)
      printf("%-12s %scheckpoint %s (%.1f s ago)\n", "", buckets ? "oldest " : "", date_field(&relay, "checkpointAt", a),
             (double)age / 1000.0);
    else printf("%-12s no checkpoint%s\n", "", buckets ? " (a bucket has none yet)" : "");
    printf("%-12s lag %.1f s (%lld pending, oldest due %s)\n", "", (double)int_field(&relay, "lagMs", 0) / 1000.0,
           int_field(&relay, "pending", 0), date_field(&relay, "oldestPendingAt", b));
    printf("%-12s %lld held keys (later events wait behind a FAILED one: outbox reprocess or skip)\n", "",
           int_field(&relay, "heldKeys", 0));
  }
  print_counts("outbox", status);
  print_counts("inbox", status);
  if (sub_doc(status, "dlq", &dlq)) {
    long long depth = int_field(&dlq, "depth", -1);
    if (depth >= 0) printf("%-12s depth %lld\n", "dlq", depth);
    else
      printf("%-12s depth unknown (%s)\n", "dlq",
             bson_iter_init_find(&it, &dlq, "error") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "");
  }
  printf("%-12s %lld\n", "parked keys", int_field(status, "parkedKeys", 0));
}

static bool print_status(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bool *degraded, obx_err_t *err) {
  bson_t out = BSON_INITIALIZER;
  bool ok = obx_ops_status(&ctl->ops, args->org, &out, err);
  bson_iter_t it, reasons;
  *degraded = ok && bson_iter_init_find(&it, &out, "degraded") && bson_iter_recurse(&it, &reasons) &&
              bson_iter_next(&reasons);
  if (ok && args->json) {
    ops_ctl_append_target(ctl, &out);
    obx_ctl_print_json(&out);
  } else if (ok) {
    char now[32];
    obx_time_format_rfc3339(obx_time_now_ms(), now);
    printf("%-12s %s at %s\n", "target", ctl->target, now);
    print_text(&out);
    bson_t dead;
    if (sub_doc(&out, "deadLetters", &dead)) {
      char oldest[32];
      printf("%-12s %lld waiting (oldest first failure %s)\n", "dead letters", int_field(&dead, "count", 0),
             date_field(&dead, "oldestAt", oldest));
    }
    printf("%-12s", "degraded");
    if (bson_iter_init_find(&it, &out, "degraded") && bson_iter_recurse(&it, &reasons)) {
      int n = 0;
      while (bson_iter_next(&reasons)) printf("%s %s", n++ ? "," : "", bson_iter_utf8(&reasons, NULL));
      if (!n) printf(" no");
    }
    printf("\n");
  }
  fflush(stdout);
  bson_destroy(&out);
  return ok;
}

#define STATUS_WATCH_MS 2000

int obx_ctl_status(int argc, char **argv) {
  ops_ctl_args_t args;
  int rc = ops_ctl_parse(&args, argc, argv,
                         "usage: outboxctl status [--json] [--watch]\n\n"
                         "Relay leader, checkpoint age and lag; outbox and inbox counts; dead letters; DLQ depth;\n"
                         "parked keys; what is degraded. Exit 0 when nothing is degraded, 3 when something is,\n"
                         "1 when MongoDB cannot be read. --watch prints it again every 2 s until interrupted.\n");
  if (rc >= 0) goto done_args;
  rc = OBX_CTL_USAGE;
  if (args.npos) {
    obx_ctl_errorf("status: takes no arguments");
    goto done_args;
  }
  ops_ctl_t ctl;
  if ((rc = ops_ctl_open(&ctl, &args, OPS_CTL_AMQP)) == OBX_CTL_OK) {
    for (;;) {
      obx_err_t err = OBX_ERR_INIT;
      bool degraded = false;
      if (!print_status(&ctl, &args, &degraded, &err)) rc = ops_ctl_fail(&ctl, "status", &err);
      else rc = degraded ? OBX_CTL_DEGRADED : OBX_CTL_OK;
      if (!args.watch) break;
      if (!args.json) printf("\n");
      struct timespec ts = {STATUS_WATCH_MS / 1000, (STATUS_WATCH_MS % 1000) * 1000000L};
      nanosleep(&ts, NULL); /* the refresh period of --watch, not a wait for a condition */
    }
  }
  ops_ctl_close(&ctl);
done_args:
  ops_ctl_args_cleanup(&args);
  return rc;
}
