/* sweeper.c - publishes PENDING events the change stream missed; the whole relay in poll mode
 *
 * DESIGN: an event is claimed with one findAndModify that matches a PENDING event due since
 * `grace` (availableAt <= now - grace) and not claimed by a live claim, and sets
 * {claimedBy: owner, claimedUntil: now + max(relay.lease, 30 s)}: the MongoDB analogue of
 * SELECT ... FOR UPDATE SKIP LOCKED, so several relays never publish the same event at the same
 * time (the floor covers a producer's first round trips: a claim must outlive the publish it
 * protects, or a second relay publishes the event too). Only the leader sweeps; the claims keep
 * a deposed leader that has not noticed yet off the new leader's events. Claims are taken
 * oldest first (availableAt, then the time-ordered _id). The report's outbox update removes the
 * claim; a relay that dies leaves claims that expire.
 *
 * In stream mode the sweeper runs only while the stream is caught up (or down), with a grace of
 * OUTBOX_POLL_INTERVAL_MS so the events the stream is about to publish are left to it. */
#include "relay/relay_int.h"

#include <stdlib.h>
#include <string.h>

#include "obx/obx_health.h"
#include "obx/obx_log.h"

#define RELAY_CLAIM_MIN_MS 30000

/* Claims one due event into *doc (caller-initialised, empty when none). False on an error. */
static bool relay_claim(obx_relay_t *relay, int64_t grace_ms, bson_t *doc) {
  int64_t now = obx_time_now_ms();
  bson_t *query = BCON_NEW("status", "PENDING", "availableAt", "{", "$lte", BCON_DATE_TIME(now - grace_ms), "}",
                           "$or", "[", "{", "claimedUntil", "{", "$exists", BCON_BOOL(false), "}", "}",
                           "{", "claimedUntil", "{", "$lte", BCON_DATE_TIME(now), "}", "}", "]");
  int64_t claim_ms = relay->conf->relay_lease > RELAY_CLAIM_MIN_MS ? relay->conf->relay_lease : RELAY_CLAIM_MIN_MS;
  relay_keys_filter(relay, query); /* a held key's events wait for its head */
  bson_t *update = BCON_NEW("$set", "{", "claimedBy", BCON_UTF8(relay->owner), "claimedUntil",
                            BCON_DATE_TIME(now + claim_ms), "}");
  bson_t *sort = BCON_NEW("availableAt", BCON_INT32(1), "_id", BCON_INT32(1));
  obx_err_t err = OBX_ERR_INIT;
  bool ok = relay_find_and_modify(relay->outbox, query, sort, update, false, NULL, doc, &err);
  if (!ok) obx_warn("sweeper claim: %s", err.msg);
  bson_destroy(sort);
  bson_destroy(update);
  bson_destroy(query);
  return ok;
}

int relay_sweep(obx_relay_t *relay, int64_t grace_ms) {
  int claimed = 0;
  while (claimed < relay->conf->outbox_batch_size && !relay->stopping &&
         relay_pending(relay) < relay->conf->relay_max_inflight) {
    bson_t doc = BSON_INITIALIZER;
    if (!relay_claim(relay, grace_ms, &doc)) {
      bson_destroy(&doc);
      return -1;
    }
    if (bson_empty(&doc)) {
      bson_destroy(&doc);
      break;
    }
    claimed++;
    if (!relay_doc_inflight(relay, &doc, true)) {
      obx_relay_msg_t *msg = calloc(1, sizeof *msg);
      if (!msg) abort();
      msg->from = RELAY_FROM_SWEEP;
      relay_keys_submit(relay, &doc, msg);
    }
    bson_destroy(&doc);
  }
  if (claimed) obx_debug("sweeper claimed %d events", claimed);
  return claimed;
}

bool relay_sweep_all(obx_relay_t *relay) {
  int total = 0;
  for (;;) {
    obx_health_stamp("full sweep: claiming");
    int claimed = relay_sweep(relay, 0);
    if (claimed < 0) return false;
    total += claimed;
    while (relay->inflight_sweep.n > 0 && !relay->stopping && relay->leader) {
      obx_health_stamp("full sweep: awaiting delivery reports");
      relay_serve(relay, 100, false);
    }
    relay_serve(relay, 0, true);
    if (relay->stopping || !relay->leader) return false;
    if (claimed == 0) break;
  }
  obx_info("published %d PENDING events found by a full scan", total);
  return true;
}
