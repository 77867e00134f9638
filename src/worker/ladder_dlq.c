/* ladder_dlq.c - browsing the parking-lot DLQ: list/peek, redrive, purge
 *
 * DESIGN: owns the operator's walk over P.dlq on the publisher's connection (channel 2, opened
 * per operation, basic.get without ack, closed at the end so everything not acked goes back);
 * a redrive publishes a message to P.work with the attempts reset, waits for the confirm, and
 * only then acks its DLQ copy. Never consumes the DLQ for good (the drain's consumer does). */
#include <amqp.h>
#include <amqp_framing.h>
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_amqp.h"
#include "obx/obx_log.h"
#include "ladder_int.h"

/* Visits DLQ messages through basic.get on CH_BROWSE. For each message `act` decides:
 * 1 acks it (removes it), 0 leaves it, 2 stops the walk, -1 stops with an error. Unacked
 * messages return to the queue when the channel closes. Caller holds mu. */
typedef int (*browse_act_fn)(obx_ladder_t *ladder, void *ctx, const obx_envelope_t *msg, obx_err_t *err);

static bool dlq_walk(obx_ladder_t *ladder, browse_act_fn act, void *ctx, obx_err_t *err) {
  if (!ladder_open(ladder, err)) return false;
  amqp_connection_state_t conn = ladder->c.conn;
  amqp_channel_open(conn, CH_BROWSE);
  if (!ladder_rpc_ok(conn, "channel.open", err)) {
    ladder_conn_drop(&ladder->c);
    return false;
  }
  bool ok = true;
  for (;;) {
    amqp_maybe_release_buffers(conn);
    amqp_rpc_reply_t r = amqp_basic_get(conn, CH_BROWSE, amqp_cstring_bytes(ladder->names.dlq), 0);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      obx_err_from_amqp(err, &r, "basic.get");
      ok = false;
      break;
    }
    if (r.reply.id != AMQP_BASIC_GET_OK_METHOD) break; /* get-empty: walked everything */
    const amqp_basic_get_ok_t *got = r.reply.decoded;
    uint64_t tag = got->delivery_tag;
    bool redelivered = got->redelivered;
    const amqp_basic_properties_t *props = NULL;
    amqp_bytes_t body;
    if (!ladder_read_content(conn, CH_BROWSE, &props, &body, err)) {
      obx_err_prefix(err, "reading a DLQ message");
      ladder_conn_drop(&ladder->c);
      return false;
    }
    obx_envelope_t msg;
    obx_envelope_init(&msg);
    ladder_envelope_from_amqp(&msg, props, body);
    amqp_bytes_free(body);
    msg.delivery_tag = tag;
    msg.redelivered = redelivered;
    int verdict = act(ladder, ctx, &msg, err);
    obx_envelope_cleanup(&msg);
    if (verdict < 0) {
      ok = false;
      break;
    }
    if (verdict == 2) break; /* stop */
    if (verdict == 1 && amqp_basic_ack(conn, CH_BROWSE, tag, 0) != AMQP_STATUS_OK) {
      obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_SOCKET_ERROR, true, "basic.ack on the DLQ failed");
      ok = false;
      break;
    }
  }
  if (!ladder->c.conn) return false; /* the act dropped the connection: unacked return on their own */
  amqp_channel_close(conn, CH_BROWSE, AMQP_REPLY_SUCCESS);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    if (ok) obx_err_from_amqp(err, &r, "channel.close");
    ladder_conn_drop(&ladder->c);
    return false;
  }
  return ok;
}

typedef struct {
  int limit, seen;
  obx_ladder_match_fn match;
  obx_ladder_visit_fn visit;
  void *ctx;
  bool dry_run;
  int moved;
} walk_t;

static int browse_act(obx_ladder_t *ladder, void *ctx, const obx_envelope_t *msg, obx_err_t *err) {
  walk_t *w = ctx;
  if (w->match && !w->match(w->ctx, msg)) return 0;
  w->seen++;
  if (w->visit && !w->visit(w->ctx, msg)) return 2;
  return w->limit > 0 && w->seen >= w->limit ? 2 : 0;
}

bool obx_ladder_dlq_browse(obx_ladder_t *ladder, int limit, obx_ladder_match_fn match, obx_ladder_visit_fn visit,
                           void *ctx, obx_err_t *err) {
  walk_t w = {.limit = limit, .match = match, .visit = visit, .ctx = ctx};
  pthread_mutex_lock(&ladder->mu);
  bool ok = dlq_walk(ladder, browse_act, &w, err);
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}

static int redrive_act(obx_ladder_t *ladder, void *ctx, const obx_envelope_t *msg, obx_err_t *err) {
  walk_t *w = ctx;
  if (w->match && !w->match(w->ctx, msg)) return 0;
  if (w->visit && !w->visit(w->ctx, msg)) return 2;
  if (w->dry_run) {
    w->moved++;
    return 0;
  }
  obx_envelope_t out = *msg; /* shallow: only attempt and reason change, nothing is freed */
  out.attempt = 0;
  out.reason = NULL;
  char now[32];
  obx_time_format_rfc3339(obx_time_now_ms(), now);
  if (!ladder_publish_confirmed(&ladder->c, &ladder->names, "", ladder->names.work, &out, now, err)) return -1;
  w->moved++;
  return 1;
}

bool obx_ladder_dlq_redrive(obx_ladder_t *ladder, obx_ladder_match_fn match, void *ctx, bool dry_run,
                            obx_ladder_visit_fn visit, int *moved, obx_err_t *err) {
  walk_t w = {.match = match, .visit = visit, .ctx = ctx, .dry_run = dry_run};
  pthread_mutex_lock(&ladder->mu);
  bool ok = dlq_walk(ladder, redrive_act, &w, err);
  pthread_mutex_unlock(&ladder->mu);
  if (moved) *moved = w.moved;
  return ok;
}

bool obx_ladder_dlq_purge(obx_ladder_t *ladder, uint32_t *purged, obx_err_t *err) {
  pthread_mutex_lock(&ladder->mu);
  bool ok = ladder_open(ladder, err);
  if (ok) {
    amqp_queue_purge_ok_t *r = amqp_queue_purge(ladder->c.conn, CH_PUBLISH, amqp_cstring_bytes(ladder->names.dlq));
    ok = ladder_rpc_ok(ladder->c.conn, "queue.purge", err);
    if (ok && purged) *purged = r->message_count;
    if (!ok) ladder_conn_drop(&ladder->c);
  }
  pthread_mutex_unlock(&ladder->mu);
  return ok;
}
