/* buckets.c - the relay role as a group of buckets: membership, fair shares, the role's handle
 *
 * DESIGN: the outbox is split into RELAY_BUCKETS buckets (B, fixed per deployment); an event's
 * bucket is murmur2(partitionKey) mod B (obx_bucket.h), so a key lives in one bucket and
 * per-key order is the order of one bucket's publisher. The group owns one obx_relay_t per
 * bucket (relay.c: its own thread, lease `leases {_id: "relay.<b>/<B>"}`, checkpoint
 * `relay_checkpoints {_id: "outbox.<b>/<B>"}`, change stream $match-ed on the bucket, producer
 * and sweeper; with B = 1 the ids are "relay" and "outbox", as before buckets) and one thread
 * of its own, which decides which buckets this process may hold (obx_relay_t.allowed); each
 * bucket's relay takes, keeps or hands over its lease accordingly.
 *
 * Membership: every group heartbeats `relay_members {_id: owner, buckets: B, held: [...],
 * expiresAt: now + RELAY_LEASE}` every RELAY_LEASE/3 (majority); a member is live while its
 * expiresAt is ahead and it runs with the same B (a member with another B is ignored and named
 * in a warning: B is fixed per deployment). With N live members the fair share is ceil(B/N).
 * Each turn of the group's thread (every RELAY_LEASE/3, every 250 ms while it holds fewer than
 * its share, and at the expiry of another member or lease it waits for):
 *
 *   holds more than the share        the surplus (its highest buckets) is handed over: the
 *                                    bucket's relay records what is in flight, writes its
 *                                    checkpoint and releases the lease (relay_hand_over)
 *   holds fewer than the share       it may take (share - held) more: free buckets first (no
 *                                    lease, expired, or a stale one of its own), starting at
 *                                    index * B / N of the live members in owner order so that
 *                                    relays pick different ones, then those of relays no longer
 *                                    live (taken the moment their lease expires), then buckets
 *                                    another live relay holds (a standby: it takes them when
 *                                    they expire or are released)
 *   holds its share                  keeps them (sticky: nothing moves while membership holds)
 *
 * So a relay that joins gets its share as the others see it and hand their surplus over, and
 * the buckets of a relay that dies are taken once its lease and heartbeat expire (within
 * RELAY_LEASE of its last renewal). Two relays that pick the same free bucket race on its lease
 * (findAndModify): one wins, the other picks another on its next turn. A MongoDB error leaves the
 * buckets as they are (each bucket's relay steps down by itself when it cannot renew).
 *
 * Documents without a valid bucket (a writer that leaves it out): every bucket's stream sees
 * them ($nin the other buckets), and only the relay of the bucket their key falls in publishes
 * them (relay_doc_mine), writing the bucket with the outcome; the sweeper writes it with its
 * claim, or, for another bucket's event, writes it so that bucket's sweeper finds it. */
#include "relay/relay_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obx/obx_bucket.h"
#include "obx/obx_health.h"
#include "obx/obx_log.h"
#include "obx/obx_schema.h"

#define RELAY_MEMBERS "relay_members"
#define GROUP_SHORT_TICK_MS 250 /* a turn while the group holds fewer than its share */
#define GROUP_MIN_TICK_MS 20
#define GROUP_FORGET_LEASES 10  /* a member expired this many leases ago is deleted */

struct relay_group {
  const obx_conf_t *conf;
  obx_mongo_t *mongo;
  char owner[128];
  int32_t nbuckets;
  obx_relay_t **relays;  /* one per bucket, for the life of the group */
  pthread_t thread;
  bool running;
  atomic_bool stopping;
  bool beat_ok;          /* the last heartbeat was written */
  int64_t next_beat_ms;
  bool warned_other_b;
};

/* ---- the bucket of a document --------------------------------------------------------------- */

int32_t relay_doc_bucket(const obx_relay_t *relay, const bson_t *doc) {
  bson_iter_t it;
  if (relay->nbuckets <= 1) return 0;
  if (bson_iter_init_find(&it, doc, OBX_BUCKET_FIELD) && BSON_ITER_HOLDS_INT32(&it) && bson_iter_int32(&it) >= 0 &&
      bson_iter_int32(&it) < relay->nbuckets)
    return bson_iter_int32(&it);
  const char *key = relay_doc_key(doc);
  return key ? obx_bucket_of(key, strlen(key), relay->nbuckets) : 0;
}

bool relay_doc_mine(const obx_relay_t *relay, const bson_t *doc) {
  return relay->nbuckets <= 1 || relay_doc_bucket(relay, doc) == relay->bucket;
}

void relay_bucket_filter(const obx_relay_t *relay, bson_t *query, const char *field) {
  if (relay->nbuckets <= 1) return;
  bson_t cond, others;
  char idx[16];
  int n = 0;
  BSON_APPEND_DOCUMENT_BEGIN(query, field, &cond);
  BSON_APPEND_ARRAY_BEGIN(&cond, "$nin", &others);
  for (int32_t b = 0; b < relay->nbuckets; b++) {
    if (b == relay->bucket) continue;
    snprintf(idx, sizeof idx, "%d", n++);
    BSON_APPEND_INT32(&others, idx, b);
  }
  bson_append_array_end(&cond, &others);
  bson_append_document_end(query, &cond);
}

obx_relay_t *relay_group_bucket(void *handle, int32_t b) {
  relay_group_t *group = handle;
  return group && b >= 0 && b < group->nbuckets ? group->relays[b] : NULL;
}

void relay_group_gauges(const obx_relay_t *relay, relay_gauges_t *g) {
  const relay_group_t *group = relay->group;
  memset(g, 0, sizeof *g);
  for (int32_t b = 0; group && b < group->nbuckets; b++) {
    const relay_counters_t *c = &group->relays[b]->counters;
    g->held += atomic_load(&c->leader);
    g->inflight += atomic_load(&c->inflight);
    g->stream_up += atomic_load(&c->stream_up);
    g->held_keys += atomic_load(&c->held_keys);
    g->producers += atomic_load(&c->producer);
    int64_t lag = atomic_load(&c->lag_ms);
    if (lag > g->lag_ms) g->lag_ms = lag;
  }
}

/* ---- membership ----------------------------------------------------------------------------- */

/* Writes this group's heartbeat (and the buckets it holds, for operators). */
static bool group_beat(relay_group_t *group, mongoc_collection_t *members, int64_t now) {
  bson_t *selector = BCON_NEW("_id", BCON_UTF8(group->owner));
  bson_t *update = bson_new(), set, held;
  char idx[16];
  int n = 0;
  BSON_APPEND_DOCUMENT_BEGIN(update, "$set", &set);
  BSON_APPEND_INT32(&set, "buckets", group->nbuckets);
  BSON_APPEND_DATE_TIME(&set, "expiresAt", now + group->conf->relay_lease);
  BSON_APPEND_DATE_TIME(&set, "updatedAt", now);
  BSON_APPEND_ARRAY_BEGIN(&set, "held", &held);
  for (int32_t b = 0; b < group->nbuckets; b++)
    if (atomic_load(&group->relays[b]->counters.leader)) {
      snprintf(idx, sizeof idx, "%d", n++);
      BSON_APPEND_INT32(&held, idx, b);
    }
  bson_append_array_end(&set, &held);
  bson_append_document_end(update, &set);
  bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
  obx_mongo_append_majority(group->mongo, opts); /* a heartbeat a rollback could undo miscounts the share */
  bson_error_t berr;
  bool ok = mongoc_collection_update_one(members, selector, update, opts, NULL, &berr);
  if (!ok) obx_warn("relay membership heartbeat: %s", berr.message);
  bson_destroy(opts);
  bson_destroy(update);
  bson_destroy(selector);
  if (ok) {
    bson_t *old = BCON_NEW("expiresAt", "{", "$lt", BCON_DATE_TIME(now - GROUP_FORGET_LEASES * group->conf->relay_lease), "}");
    mongoc_collection_delete_many(members, old, NULL, NULL, NULL);
    bson_destroy(old);
  }
  return ok;
}

typedef struct {
  char **owners;   /* live members with our B, sorted */
  int n;
  int64_t next_expiry_ms; /* the soonest expiry of another live member (INT64_MAX: none) */
} group_members_t;

static int owner_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void members_cleanup(group_members_t *m) {
  for (int i = 0; i < m->n; i++) free(m->owners[i]);
  free(m->owners);
  memset(m, 0, sizeof *m);
}

/* Reads the live members; false on a MongoDB error. */
static bool group_members(relay_group_t *group, mongoc_collection_t *members, int64_t now, group_members_t *m) {
  memset(m, 0, sizeof *m);
  m->next_expiry_ms = INT64_MAX;
  bson_t *filter = BCON_NEW("expiresAt", "{", "$gt", BCON_DATE_TIME(now), "}");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(members, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it;
  int cap = 0;
  while (mongoc_cursor_next(cursor, &doc)) {
    const char *owner = obx_mongo_doc_str(doc, "_id");
    int32_t b = bson_iter_init_find(&it, doc, "buckets") && BSON_ITER_HOLDS_INT32(&it) ? bson_iter_int32(&it) : 1;
    if (!owner) continue;
    if (b != group->nbuckets) {
      if (!group->warned_other_b)
        obx_warn("relay %s runs with RELAY_BUCKETS=%d, this one with %d: it is not counted (B is fixed per "
                 "deployment; stop every relay to change it)", owner, b, group->nbuckets);
      group->warned_other_b = true;
      continue;
    }
    if (m->n == cap) {
      cap = cap ? cap * 2 : 8;
      m->owners = realloc(m->owners, (size_t)cap * sizeof *m->owners);
      if (!m->owners) abort();
    }
    m->owners[m->n++] = strdup(owner);
    if (strcmp(owner, group->owner) != 0 && bson_iter_init_find(&it, doc, "expiresAt") &&
        BSON_ITER_HOLDS_DATE_TIME(&it) && bson_iter_date_time(&it) < m->next_expiry_ms)
      m->next_expiry_ms = bson_iter_date_time(&it);
  }
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_mongo_cursor_end(cursor, &err);
  if (!ok) obx_warn("relay membership: %s", err.msg);
  bson_destroy(filter);
  if (ok) qsort(m->owners, (size_t)m->n, sizeof *m->owners, owner_cmp);
  else members_cleanup(m);
  return ok;
}

/* ---- the plan ------------------------------------------------------------------------------- */

/* The state of every bucket's lease (free: none, expired, or a stale one of ours; orphan: its
 * owner is not among the live members m) into state[], another relay's expiry into expiry[b];
 * false on a MongoDB error. */
static bool group_leases(relay_group_t *group, mongoc_collection_t *leases, int64_t now, const group_members_t *m,
                         relay_lease_state_t *state, int64_t *expiry) {
  bson_t *filter = bson_new(), id, in;
  char idx[16];
  BSON_APPEND_DOCUMENT_BEGIN(filter, "_id", &id);
  BSON_APPEND_ARRAY_BEGIN(&id, "$in", &in);
  for (int32_t b = 0; b < group->nbuckets; b++) {
    snprintf(idx, sizeof idx, "%d", b);
    BSON_APPEND_UTF8(&in, idx, group->relays[b]->lease_id);
    state[b] = RELAY_LEASE_FREE;
    expiry[b] = 0;
  }
  bson_append_array_end(&id, &in);
  bson_append_document_end(filter, &id);
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(leases, filter, NULL, NULL);
  const bson_t *doc;
  bson_iter_t it;
  while (mongoc_cursor_next(cursor, &doc)) {
    const char *lid = obx_mongo_doc_str(doc, "_id"), *owner = obx_mongo_doc_str(doc, "owner");
    int64_t expires = bson_iter_init_find(&it, doc, "expiresAt") && BSON_ITER_HOLDS_DATE_TIME(&it) ? bson_iter_date_time(&it) : 0;
    if (!lid || expires <= now || (owner && strcmp(owner, group->owner) == 0)) continue;
    for (int32_t b = 0; b < group->nbuckets; b++)
      if (strcmp(lid, group->relays[b]->lease_id) == 0) {
        bool live = owner && bsearch(&owner, m->owners, (size_t)m->n, sizeof *m->owners, owner_cmp);
        state[b] = live ? RELAY_LEASE_OTHER : RELAY_LEASE_ORPHAN;
        expiry[b] = expires;
      }
  }
  obx_err_t err = OBX_ERR_INIT;
  bool ok = obx_mongo_cursor_end(cursor, &err);
  if (!ok) obx_warn("relay leases: %s", err.msg);
  bson_destroy(filter);
  return ok;
}

int32_t relay_share_plan(int32_t nb, const bool *held, const relay_lease_state_t *state, int live, int me,
                         bool *allowed) {
  int32_t share = (nb + live - 1) / live, nheld = 0;
  for (int32_t b = 0; b < nb; b++) nheld += held[b];
  if (nheld > share) {
    int32_t keep = 0; /* the lowest `share` held buckets stay, the others are handed over */
    for (int32_t b = 0; b < nb; b++) allowed[b] = held[b] && keep++ < share;
    return share;
  }
  int32_t want = share - nheld, start = (int32_t)((int64_t)me * nb / live);
  for (int32_t b = 0; b < nb; b++) allowed[b] = held[b];
  /* free buckets first, then those of relays no longer live, then those live others hold */
  for (relay_lease_state_t pass = RELAY_LEASE_FREE; pass <= RELAY_LEASE_OTHER; pass++)
    for (int32_t i = 0; i < nb && want > 0; i++) {
      int32_t b = (start + i) % nb;
      if (allowed[b] || state[b] != pass) continue;
      allowed[b] = true;
      want--;
    }
  return share;
}

/* One turn: which buckets this group may hold. Returns when the next turn is due. */
static int64_t group_plan(relay_group_t *group, mongoc_collection_t *members, mongoc_collection_t *leases) {
  int64_t now = obx_time_now_ms(), lease = group->conf->relay_lease;
  int32_t nb = group->nbuckets;
  if (now >= group->next_beat_ms) {
    group->beat_ok = group_beat(group, members, now);
    group->next_beat_ms = now + lease / 3;
  }
  int64_t next = group->next_beat_ms;
  group_members_t m;
  relay_lease_state_t *state = calloc((size_t)nb, sizeof *state);
  bool *held = calloc((size_t)nb, sizeof *held), *allowed = calloc((size_t)nb, sizeof *allowed);
  int64_t *expiry = calloc((size_t)nb, sizeof *expiry);
  if (!state || !held || !allowed || !expiry) abort();
  if (!group->beat_ok || !group_members(group, members, now, &m)) goto done; /* as they are */
  if (!group_leases(group, leases, now, &m, state, expiry)) {
    members_cleanup(&m);
    goto done;
  }
  int live = m.n, me = 0;
  while (me < m.n && strcmp(m.owners[me], group->owner) != 0) me++;
  if (me == m.n) live++; /* our heartbeat is written but not read back yet */
  int32_t nheld = 0;
  for (int32_t b = 0; b < nb; b++) nheld += held[b] = atomic_load(&group->relays[b]->counters.leader) != 0;
  int32_t share = relay_share_plan(nb, held, state, live, me, allowed);
  for (int32_t b = 0; b < nb; b++) {
    /* standing by on another relay's bucket: its relay tries the lease the moment it expires */
    if (allowed[b] && !held[b] && state[b] != RELAY_LEASE_FREE) atomic_store(&group->relays[b]->take_at_ms, expiry[b] + 1);
    atomic_store(&group->relays[b]->allowed, allowed[b]);
  }
  if (nheld < share && now + GROUP_SHORT_TICK_MS < next) next = now + GROUP_SHORT_TICK_MS;
  if (m.next_expiry_ms < next) next = m.next_expiry_ms + 1; /* the share may grow then */
  members_cleanup(&m);
done:
  free(expiry);
  free(allowed);
  free(held);
  free(state);
  return next > now + GROUP_MIN_TICK_MS ? next : now + GROUP_MIN_TICK_MS;
}

static void group_sleep_until(relay_group_t *group, int64_t until_ms) {
  while (!group->stopping) {
    int64_t left = until_ms - obx_time_now_ms();
    if (left <= 0) return;
    if (left > 50) left = 50;
    struct timespec ts = {0, (long)left * 1000000L};
    nanosleep(&ts, NULL);
  }
}

static void *group_main(void *arg) {
  relay_group_t *group = arg;
  obx_err_t err = OBX_ERR_INIT;
  obx_log_set_role("relay");
  obx_health_register("relay", "buckets");
  mongoc_client_t *client = obx_mongo_pop(group->mongo);
  mongoc_collection_t *members = obx_mongo_collection(group->mongo, client, RELAY_MEMBERS);
  mongoc_collection_t *leases = obx_mongo_collection(group->mongo, client, "leases");
  while (!group->stopping) {
    obx_health_stamp("ensuring the schema");
    if (obx_schema_ensure(group->mongo, group->conf, OBX_SCHEMA_RELAY, &err)) break;
    group_sleep_until(group, obx_time_now_ms() + 1000);
  }
  while (!group->stopping) {
    obx_health_stamp("sharing the buckets");
    int64_t next = group_plan(group, members, leases);
    obx_health_idle();
    group_sleep_until(group, next);
  }
  /* leaving: the others count one relay less at once (the buckets are released by their relays) */
  obx_health_unregister();
  bson_t *selector = BCON_NEW("_id", BCON_UTF8(group->owner));
  mongoc_collection_delete_one(members, selector, NULL, NULL, NULL);
  bson_destroy(selector);
  mongoc_collection_destroy(leases);
  mongoc_collection_destroy(members);
  obx_mongo_push(group->mongo, client);
  return NULL;
}

/* ---- the role ------------------------------------------------------------------------------- */

/* /readyz "relay": every bucket's relay (the producer check once, on the first bucket held). */
static bool group_ready(void *ctx, obx_err_t *err) {
  relay_group_t *group = ctx;
  bool producer_checked = false;
  for (int32_t b = 0; b < group->nbuckets; b++) {
    obx_relay_t *relay = group->relays[b];
    bool check = !producer_checked && atomic_load(&relay->counters.leader);
    if (!relay_ready(relay, check, err)) return false;
    producer_checked = producer_checked || check;
  }
  return true;
}

static void group_destroy(relay_group_t *group) {
  if (!group) return;
  group->stopping = true;
  if (group->running) pthread_join(group->thread, NULL);
  for (int32_t b = 0; group->relays && b < group->nbuckets; b++)
    if (group->relays[b]) group->relays[b]->stopping = true; /* all of them hand over at once */
  for (int32_t b = 0; group->relays && b < group->nbuckets; b++) relay_stop(group->relays[b]);
  free(group->relays);
  obx_mongo_destroy(group->mongo);
  free(group);
}

static void group_probe_ack(const obx_relay_ack_t *ack, void *ctx) {}

void *obx_relay_start(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err) {
  relay_group_t *group = calloc(1, sizeof *group);
  char host[64] = "localhost";
  static atomic_uint serial;
  if (!group) abort();
  group->conf = conf;
  group->nbuckets = (int32_t)conf->relay_buckets;
  gethostname(host, sizeof host - 1);
  snprintf(group->owner, sizeof group->owner, "%s:%d:%u", host, (int)getpid(), ++serial);
  group->relays = calloc((size_t)group->nbuckets, sizeof *group->relays);
  if (!group->relays) abort();
  group->mongo = obx_mongo_new(conf, err);
  if (!group->mongo) goto fail;
  relay_metrics_register();
  /* a bucket's producer is created when the bucket is taken: the Kafka configuration (kafka.*
   * keys) is checked now by one made and destroyed at once, so a bad key fails the start */
  obx_relay_producer_t *probe = obx_relay_producer_new(conf, NULL, group_probe_ack, NULL, err);
  if (!probe) goto fail;
  obx_relay_producer_destroy(probe);
  for (int32_t b = 0; b < group->nbuckets; b++) {
    group->relays[b] = relay_new(conf, group->mongo, group->owner, b);
    group->relays[b]->group = group;
  }
  for (int32_t b = 0; b < group->nbuckets; b++)
    if (!relay_run(group->relays[b], err)) goto fail;
  group->running = pthread_create(&group->thread, NULL, group_main, group) == 0;
  if (!group->running) {
    obx_err_set(err, OBX_ERR_SYS, 0, false, "relay: cannot start the buckets' thread");
    goto fail;
  }
  if (http) obx_http_add_ready_check(http, "relay", group_ready, group);
  obx_info("relay started (mode %s, topic %s, %d bucket%s, owner %s)", conf->relay_mode, conf->kafka_topic,
           group->nbuckets, group->nbuckets > 1 ? "s" : "", group->owner);
  return group;
fail:
  group_destroy(group);
  return NULL;
}

void obx_relay_stop(void *handle) {
  if (!handle) return;
  group_destroy(handle);
  obx_info("relay stopped");
}
