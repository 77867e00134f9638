/* test_worker_batch.c - the worker's grouped writes (src/worker/batch.c): fresh Kafka events
 * claimed together in one insertMany, finished runs recorded together in one transaction
 *
 * DESIGN: the shared worker fixture (worker_test.h). Two cases call the inbox's batch writes
 * directly on devmongod and read every entry back: obx_inbox_claim_many maps each insert to its
 * event (a duplicate and an entry libmongoc refuses are left out, the others go in), and
 * obx_inbox_set_status_owned_many writes each outcome under its own compare-and-set (one claim
 * taken over by a peer: that one is not written, the others are). Three cases run the worker
 * and read what the world sees (the ERP's calls, the inbox, the executions) and the counters:
 * a batch of claims in which one event is a duplicate and one is claimed live by a peer (never
 * run while the peer's lease is live, run once after it); a group commit in which one event's
 * claim was taken over while its call ran (nothing of it recorded, the others recorded); and a
 * group commit that fails (one run's set-status finds no order), after which each event is
 * recorded alone and no pipeline runs twice, and one whose commitTransaction MongoDB refuses
 * (failCommand), the same. The last three hold the first group commit (failCommand
 * blockConnection on its inbox update, or a transaction of the test's on its entry) so that the
 * other events' outcomes are written together. The last case holds one event's recording to
 * show that it frees the in-flight slot but not the key. Every wait polls with a deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx_test_fixture.h"
#include "worker_test.h"

#define PEER "peer-host:1:peer"
#define OWNER "this-host:1:owner"

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

static double series(const char *name, const char *batch) {
  char s[160];
  snprintf(s, sizeof s, "%s{batch=\"%s\"}", name, batch);
  double v = wt_metric(s);
  return v < 0 ? 0 : v;
}

static double moves(const char *from, const char *to) {
  char s[160];
  snprintf(s, sizeof s, "outboxd_worker_transitions_total{from=\"%s\",to=\"%s\"}", from, to);
  double v = wt_metric(s);
  return v < 0 ? 0 : v;
}

static const char *const names[] = {"ce_id"};

/* A fresh entry of ev claimed by owner (NULL: none) for lease_ms, with one header (ce_id). */
static obx_inbox_entry_t entry_of(wt_fx_t *fx, const obx_event_t *ev, const char *const *values, const char *owner,
                                  int64_t lease_ms) {
  return (obx_inbox_entry_t){.consumer = fx->group, .event = ev, .header_names = names, .header_values = values,
                             .nheaders = 1, .source_kind = "amqp", .seq = obx_time_now_ms(), .owner = owner,
                             .lease_ms = lease_ms};
}

static void store(wt_fx_t *fx, const obx_inbox_entry_t *entry, obx_inbox_status_t status) {
  bool inserted = false;
  obx_inbox_status_t existing;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_claim(fx->client, obx_mongo_db_name(fx->mongo), NULL, entry, status, &inserted, &existing, &err) ||
      !inserted)
    fail_msg("storing %s: %s", entry->event->id, err.msg[0] ? err.msg : "already there");
}

/* One insertMany for four events: the first and last go in claimed; the second (its entry is
 * there already) and the third (a header name libmongoc refuses: empty) are left out, each for
 * the single claim, which says why. */
static void test_claim_many_maps_each_insert_to_its_event(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev[4];
  const char *values[4][1];
  obx_inbox_entry_t entries[4];
  for (int i = 0; i < 4; i++) {
    char key[16];
    snprintf(key, sizeof key, "CM-%d", i);
    wt_event(&ev[i], "OrderConfirmed", key, key);
    values[i][0] = ev[i].id;
    entries[i] = entry_of(fx, &ev[i], values[i], OWNER, 30000);
  }
  static const char *const empty_name[] = {""};
  entries[2].header_names = empty_name;
  store(fx, &entries[1], OBX_INBOX_DONE);
  bool inserted[4];
  obx_err_t err = OBX_ERR_INIT;
  const char *db = obx_mongo_db_name(fx->mongo);
  if (!obx_inbox_claim_many(fx->client, db, entries, 4, inserted, &err)) fail_msg("claim_many: %s", err.msg);
  assert_true(inserted[0]);
  assert_false(inserted[1]);
  assert_false(inserted[2]);
  assert_true(inserted[3]);
  char got[64];
  assert_string_equal(wt_inbox_str(fx, ev[0].id, "status", got, sizeof got), "RECEIVED");
  assert_string_equal(wt_inbox_str(fx, ev[0].id, "owner", got, sizeof got), OWNER);
  bson_t doc;
  bson_iter_t it;
  assert_true(wt_inbox(fx, ev[3].id, &doc));
  assert_true(bson_iter_init_find(&it, &doc, "leaseUntil") && BSON_ITER_HOLDS_DATE_TIME(&it));
  assert_true(bson_iter_date_time(&it) > obx_time_now_ms());
  bson_destroy(&doc);
  assert_string_equal(wt_inbox_str(fx, ev[1].id, "status", got, sizeof got), "DONE"); /* untouched */
  assert_string_equal(wt_inbox_str(fx, ev[2].id, "status", got, sizeof got), "(none)");
  /* the single claim says why each was left out */
  bool in = true;
  obx_inbox_status_t existing = OBX_INBOX_RECEIVED;
  assert_true(obx_inbox_claim(fx->client, db, NULL, &entries[1], OBX_INBOX_RECEIVED, &in, &existing, &err));
  assert_false(in);
  assert_int_equal(existing, OBX_INBOX_DONE);
  assert_false(obx_inbox_claim(fx->client, db, NULL, &entries[2], OBX_INBOX_RECEIVED, &in, &existing, &err));
  assert_false(err.retriable);
  for (int i = 0; i < 4; i++) obx_event_cleanup(&ev[i]);
}

typedef struct {
  wt_fx_t *fx;
  obx_inbox_outcome_t *outcomes;
  int n;
  bool *written;
} many_t;

static bool many_txn(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  many_t *m = ctx;
  return obx_inbox_set_status_owned_many(mongoc_client_session_get_client(session), obx_mongo_db_name(m->fx->mongo),
                                         session, m->fx->group, m->outcomes, m->n, m->written, err);
}

/* Three outcomes in one transaction, the second's claim taken over by a peer: the first and the
 * third are written (DONE, their execution ids), the second is not (the peer's entry as it was). */
static void test_owned_many_writes_the_claims_that_hold(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev[3];
  const char *values[3][1];
  obx_inbox_cas_t cas = {.owner = OWNER, .attempts = 0, .lease_ms = 30000};
  obx_inbox_outcome_t outcomes[3];
  char exec_ids[3][16];
  for (int i = 0; i < 3; i++) {
    char key[16];
    snprintf(key, sizeof key, "OM-%d", i);
    wt_event(&ev[i], "OrderConfirmed", key, key);
    values[i][0] = ev[i].id;
    obx_inbox_entry_t entry = entry_of(fx, &ev[i], values[i], i == 1 ? PEER : OWNER, 30000);
    store(fx, &entry, OBX_INBOX_RECEIVED);
    snprintf(exec_ids[i], sizeof exec_ids[i], "exec-%d", i);
    outcomes[i] = (obx_inbox_outcome_t){.event_id = ev[i].id, .cas = &cas, .status = OBX_INBOX_DONE, .attempts = 1,
                                        .execution_id = exec_ids[i]};
  }
  bool written[3];
  many_t m = {.fx = fx, .outcomes = outcomes, .n = 3, .written = written};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_mongo_transaction(fx->mongo, many_txn, &m, &err)) fail_msg("transaction: %s", err.msg);
  assert_true(written[0]);
  assert_false(written[1]);
  assert_true(written[2]);
  char got[64];
  for (int i = 0; i < 3; i += 2) {
    assert_string_equal(wt_inbox_str(fx, ev[i].id, "status", got, sizeof got), "DONE");
    assert_int_equal(wt_inbox_int(fx, ev[i].id, "attempts"), 1);
    assert_string_equal(wt_inbox_str(fx, ev[i].id, "executionIds.0", got, sizeof got), exec_ids[i]);
  }
  assert_string_equal(wt_inbox_str(fx, ev[1].id, "status", got, sizeof got), "RECEIVED");
  assert_string_equal(wt_inbox_str(fx, ev[1].id, "owner", got, sizeof got), PEER);
  assert_int_equal(wt_inbox_int(fx, ev[1].id, "attempts"), 0);
  for (int i = 0; i < 3; i++) obx_event_cleanup(&ev[i]);
}

#define KEYS 12

/* KEYS events of KEYS keys, produced before the worker starts, so that they are claimed in
 * batches: one is already DONE (a duplicate: never run), one is claimed by a live peer for
 * PEER_LEASE_MS (never run while that lease is live; taken over after it and run once), every
 * other one is inserted claimed and runs once. */
#define PEER_LEASE_MS 4000
static void test_batch_claim_with_a_duplicate_and_a_peers_live_claim(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev[KEYS];
  char nums[KEYS][16];
  const char *values[KEYS][1];
  for (int i = 0; i < KEYS; i++) {
    snprintf(nums[i], sizeof nums[i], "BC-%d", i);
    wt_event(&ev[i], "OrderConfirmed", nums[i], nums[i]);
    values[i][0] = ev[i].id;
    wt_route(fx, nums[i], 200);
  }
  obx_inbox_entry_t dup = entry_of(fx, &ev[0], values[0], PEER, 0);
  store(fx, &dup, OBX_INBOX_DONE);
  obx_inbox_entry_t live = entry_of(fx, &ev[1], values[1], PEER, PEER_LEASE_MS);
  store(fx, &live, OBX_INBOX_RECEIVED);
  int64_t peer_until = obx_time_now_ms() + PEER_LEASE_MS - 50; /* stored just now with that lease */
  for (int i = 0; i < KEYS; i++) wt_produce(fx, &ev[i]);
  double batches = series("outboxd_worker_batches_total", "claims");
  double batched = series("outboxd_worker_batched_events_total", "claims");
  wt_start_worker(fx);
  for (int i = 1; i < KEYS; i++) wt_wait_status(fx, ev[i].id, "DONE");
  for (int i = 1; i < KEYS; i++) {
    if (wt_erp_calls(fx, nums[i]) != 1) fail_msg("%s: %d ERP calls, want 1", nums[i], wt_erp_calls(fx, nums[i]));
    assert_int_equal(wt_executions(fx, ev[i].id), 1);
  }
  assert_int_equal(wt_erp_calls(fx, nums[0]), 0); /* the duplicate */
  assert_int_equal(wt_executions(fx, ev[0].id), 0);
  obx_test_httpd_request_t req; /* the peer's event ran only once its lease had passed */
  assert_true(obx_test_httpd_request(fx->httpd, wt_last_call_index(fx, nums[1]), &req));
  if (req.start_ms < peer_until) fail_msg("the peer's event ran %lld ms before its lease passed", (long long)(peer_until - req.start_ms));
  obx_test_httpd_request_cleanup(&req);
  char got[64];
  assert_string_not_equal(wt_inbox_str(fx, ev[1].id, "owner", got, sizeof got), PEER); /* taken over */
  double nb = series("outboxd_worker_batches_total", "claims") - batches;
  double ne = series("outboxd_worker_batched_events_total", "claims") - batched;
  print_message("claims: %.0f events in %.0f batches\n", ne, nb);
  if (ne != KEYS || nb >= ne) fail_msg("claims batches: %.0f events in %.0f batches, want %d in fewer", ne, nb, KEYS);
  for (int i = 0; i < KEYS; i++) obx_event_cleanup(&ev[i]);
}

/* Waits until the inbox entries of ev[0..n) are all claimed (RECEIVED): their runs are at their
 * calls. */
static void wait_claimed(wt_fx_t *fx, const obx_event_t *ev, int n) {
  for (int i = 0; i < n; i++) wt_wait_status(fx, ev[i].id, "RECEIVED");
}

#define GROUP 8
#define CALL_MS 2500
#define FIRST_MS 1000

/* The next update of the inbox (the recorder's next group commit) waits ms. */
static void hold_next_inbox_update(wt_fx_t *fx, int ms) {
  char fp[512];
  snprintf(fp, sizeof fp,
           "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1}, \"data\": {\"failCommands\": "
           "[\"update\"], \"namespace\": \"%s.inbox\", \"blockConnection\": true, \"blockTimeMS\": %d}}",
           obx_mongo_db_name(fx->mongo), ms);
  obx_test_fail_point(fx->client, fp);
}

/* Holds the recorder: the first group commit's (that of ev[0], whose call ends first, FIRST_MS)
 * waits CALL_MS, so the outcomes of the other GROUP - 1 events, whose calls end together at
 * CALL_MS, queue behind it and are written in one group commit. */
static void hold_first_group_commit(wt_fx_t *fx) { hold_next_inbox_update(fx, CALL_MS); }

static void group_events(wt_fx_t *fx, obx_event_t *ev, char nums[][16], const char *prefix) {
  for (int i = 0; i < GROUP; i++) {
    snprintf(nums[i], 16, "%s-%d", prefix, i);
    wt_event(&ev[i], "OrderConfirmed", nums[i], nums[i]);
    wt_route_delay(fx, nums[i], 200, i == 0 ? FIRST_MS : CALL_MS);
  }
}

/* The group commits since (batches, batched): want GROUP events in two (ev[0]'s, then the rest
 * together; three when the machine stalled a call past the first one's hold). */
static void want_grouped(double batches, double batched) {
  double nb = series("outboxd_worker_batches_total", "recordings") - batches;
  double ne = series("outboxd_worker_batched_events_total", "recordings") - batched;
  print_message("recordings: %.0f events in %.0f group commits\n", ne, nb);
  if (ne != GROUP || nb < 2 || nb > 3) fail_msg("group commits: %.0f events in %.0f, want %d in 2", ne, nb, GROUP);
}

/* GROUP events of GROUP keys, the outcomes of GROUP - 1 of them written in one group commit
 * (hold_first_group_commit). One event's claim is taken over by a peer while its call runs
 * (the lease is 60 s: no renewal between, so only the compare-and-set of the group commit sees
 * it): nothing of that event is recorded (no execution, the peer's entry as it left it, the
 * recording -> lost move), every other one is DONE with one execution. */
static void test_group_commit_records_the_others_when_one_claim_is_lost(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.lease", "60s");
  obx_event_t ev[GROUP];
  char nums[GROUP][16];
  group_events(fx, ev, nums, "GC");
  double lost = moves("recording", "lost"), lost_running = moves("running", "lost");
  double batches = series("outboxd_worker_batches_total", "recordings");
  double batched = series("outboxd_worker_batched_events_total", "recordings");
  wt_start_worker(fx);
  for (int i = 0; i < GROUP; i++) wt_produce(fx, &ev[i]);
  wait_claimed(fx, ev, GROUP);
  char update[256];
  snprintf(update, sizeof update,
           "{\"$set\": {\"owner\": \"" PEER "\", \"status\": \"PROCESSING\", \"leaseUntil\": {\"$date\": %lld}}}",
           (long long)(obx_time_now_ms() + 60000));
  bson_error_t berr;
  bson_t *u = bson_new_from_json((const uint8_t *)update, -1, &berr);
  bson_t *filter = BCON_NEW("_id.consumer", BCON_UTF8(fx->group), "_id.eventId", BCON_UTF8(ev[3].id));
  mongoc_collection_t *inbox = mongoc_client_get_collection(fx->client, obx_mongo_db_name(fx->mongo), "inbox");
  if (!mongoc_collection_update_one(inbox, filter, u, NULL, NULL, &berr)) fail_msg("take over: %s", berr.message);
  mongoc_collection_destroy(inbox);
  bson_destroy(filter);
  bson_destroy(u);
  hold_first_group_commit(fx);
  for (int i = 0; i < GROUP; i++)
    if (i != 3) wt_wait_status(fx, ev[i].id, "DONE");
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (moves("recording", "lost") < lost + 1 && obx_test_now_ms() < deadline) usleep(20000);
  assert_int_equal(moves("recording", "lost") - lost, 1);
  assert_int_equal(moves("running", "lost") - lost_running, 0); /* the group commit's compare-and-set saw it */
  assert_int_equal(obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}"), 1);
  char got[64];
  assert_string_equal(wt_inbox_str(fx, ev[3].id, "owner", got, sizeof got), PEER);
  assert_string_equal(wt_inbox_str(fx, ev[3].id, "status", got, sizeof got), "PROCESSING");
  assert_int_equal(wt_executions(fx, ev[3].id), 0);
  for (int i = 0; i < GROUP; i++) {
    assert_int_equal(wt_erp_calls(fx, nums[i]), 1);
    if (i != 3) assert_int_equal(wt_executions(fx, ev[i].id), 1);
  }
  want_grouped(batches, batched);
  for (int i = 0; i < GROUP; i++) obx_event_cleanup(&ev[i]);
}

/* A group commit that fails (one of its runs sets the status of an order that does not exist:
 * the transaction ends NOT_FOUND) is not the end of its events: each is recorded alone, the
 * others DONE with one execution, that one DEAD with the cause (terminal), and no pipeline ran
 * twice (one ERP call per event). */
static void test_failed_group_commit_records_each_alone(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.lease", "60s");
  char json[1024];
  snprintf(json, sizeof json,
           "{\"name\": \"audit\", \"trigger\": \"event.OrderAudited\", \"enabled\": true, \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"notify\", \"type\": \"http-request\", \"config\": {"
           "  \"method\": \"POST\", \"url\": \"%s/{{orderNumber}}\", \"body\": {\"n\": \"{{orderNumber}}\"}}},"
           "{\"id\": \"status\", \"type\": \"set-status\", \"config\": {\"statusTag\": \"audited\", \"name\": \"Audited\"}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"notify\"}, {\"from\": \"notify\", \"to\": \"status\"}]}",
           obx_test_httpd_url(fx->httpd, "/erp"));
  wt_create_pipeline_json(fx, json);
  obx_event_t ev[GROUP];
  char nums[GROUP][16];
  group_events(fx, ev, nums, "FG");
  obx_event_cleanup(&ev[GROUP - 1]); /* the last: set-status on an order that is not there */
  wt_event(&ev[GROUP - 1], "OrderAudited", nums[GROUP - 1], nums[GROUP - 1]);
  double batches = series("outboxd_worker_batches_total", "recordings");
  double batched = series("outboxd_worker_batched_events_total", "recordings");
  wt_start_worker(fx);
  for (int i = 0; i < GROUP; i++) wt_produce(fx, &ev[i]);
  wait_claimed(fx, ev, GROUP);
  hold_first_group_commit(fx);
  for (int i = 0; i < GROUP - 1; i++) wt_wait_status(fx, ev[i].id, "DONE");
  wt_wait_status(fx, ev[GROUP - 1].id, "DEAD");
  assert_int_equal(obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}"), 1);
  char got[512];
  wt_inbox_str(fx, ev[GROUP - 1].id, "lastError", got, sizeof got);
  if (!strstr(got, "recording the outcome (DONE) failed") || !strstr(got, "not found")) fail_msg("lastError: %s", got);
  for (int i = 0; i < GROUP; i++) {
    if (wt_erp_calls(fx, nums[i]) != 1) fail_msg("%s: the pipeline ran %d times, want 1", nums[i], wt_erp_calls(fx, nums[i]));
    if (i < GROUP - 1) assert_int_equal(wt_executions(fx, ev[i].id), 1);
  }
  want_grouped(batches, batched);
  for (int i = 0; i < GROUP; i++) obx_event_cleanup(&ev[i]);
}

/* A group commit whose commitTransaction MongoDB refuses (failCommand, not retriable): each of
 * its events is recorded alone, DONE with one execution, and no pipeline ran twice. The first
 * group commit (ev[0]'s, whose call ends first) is held by a transaction of the test's that
 * wrote ev[0]'s entry first (WriteConflict: it is tried again until that transaction ends), so
 * the other events' outcomes queue behind it; the test lets it go once all of them are waiting
 * to be recorded, and the fail point skips that commit and refuses the next one: the others'. */
static void test_refused_group_commit_records_each_alone(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.lease", "60s");
  obx_event_t ev[GROUP];
  char nums[GROUP][16];
  group_events(fx, ev, nums, "RC");
  double recording = moves("running", "recording");
  double batches = series("outboxd_worker_batches_total", "recordings");
  double batched = series("outboxd_worker_batched_events_total", "recordings");
  wt_start_worker(fx);
  for (int i = 0; i < GROUP; i++) wt_produce(fx, &ev[i]);
  wait_claimed(fx, ev, GROUP);
  bson_error_t berr;
  mongoc_client_session_t *session = mongoc_client_start_session(fx->client, NULL, &berr);
  if (!session || !mongoc_client_session_start_transaction(session, NULL, &berr)) fail_msg("session: %s", berr.message);
  bson_t opts = BSON_INITIALIZER;
  if (!mongoc_client_session_append(session, &opts, &berr)) fail_msg("session: %s", berr.message);
  bson_t *filter = BCON_NEW("_id.consumer", BCON_UTF8(fx->group), "_id.eventId", BCON_UTF8(ev[0].id));
  bson_t *update = BCON_NEW("$set", "{", "heldByTest", BCON_BOOL(true), "}");
  mongoc_collection_t *inbox = mongoc_client_get_collection(fx->client, obx_mongo_db_name(fx->mongo), "inbox");
  if (!mongoc_collection_update_one(inbox, filter, update, &opts, NULL, &berr)) fail_msg("hold: %s", berr.message);
  obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"skip\": 1, \"times\": 1}, "
                                  "\"data\": {\"failCommands\": [\"commitTransaction\"], \"errorCode\": 2}}");
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS; /* every run finished, waiting for its recording */
  while (moves("running", "recording") < recording + GROUP && obx_test_now_ms() < deadline) usleep(20000);
  assert_int_equal(moves("running", "recording") - recording, GROUP);
  if (!mongoc_client_session_abort_transaction(session, &berr)) fail_msg("abort: %s", berr.message);
  mongoc_collection_destroy(inbox);
  bson_destroy(update);
  bson_destroy(filter);
  bson_destroy(&opts);
  mongoc_client_session_destroy(session);
  for (int i = 0; i < GROUP; i++) wt_wait_status(fx, ev[i].id, "DONE");
  assert_int_equal(obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}"), 1);
  for (int i = 0; i < GROUP; i++) {
    if (wt_erp_calls(fx, nums[i]) != 1) fail_msg("%s: the pipeline ran %d times, want 1", nums[i], wt_erp_calls(fx, nums[i]));
    assert_int_equal(wt_executions(fx, ev[i].id), 1);
  }
  want_grouped(batches, batched);
  for (int i = 0; i < GROUP; i++) obx_event_cleanup(&ev[i]);
}

#define HOLD_MS 2500

/* A run whose outcome is being written gives its in-flight slot back, not its key: with
 * WORKER_MAX_INFLIGHT 1 and the recorder's write of A-1's outcome held HOLD_MS (failCommand
 * blockConnection on its inbox update), B's event (another key) is taken in and calls its
 * endpoint while A-1 is not DONE yet (before, A-1 held the only slot until its outcome was
 * written), and A-2 (A-1's key) calls its endpoint only once A-1 is DONE. */
static void test_recording_frees_the_slot_not_the_key(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.max_inflight", "1");
  wt_conf_set(fx, "worker.lease", "60s"); /* no claim renewal (an inbox update) meanwhile */
  obx_event_t a1, a2, b;
  wt_event(&a1, "OrderConfirmed", "K-A", "SLOT-A1");
  wt_event(&a2, "OrderConfirmed", "K-A", "SLOT-A2");
  wt_event(&b, "OrderConfirmed", "K-B", "SLOT-B");
  wt_route(fx, "SLOT-A1", 200);
  wt_route(fx, "SLOT-A2", 200);
  wt_route(fx, "SLOT-B", 200);
  hold_next_inbox_update(fx, HOLD_MS);
  wt_start_worker(fx);
  wt_produce(fx, &a1);
  wt_wait_calls(fx, "SLOT-A1", 1);
  int64_t a1_called = obx_test_now_ms();
  wt_produce(fx, &b);
  wt_produce(fx, &a2);
  wt_wait_calls(fx, "SLOT-B", 1);
  char got[32];
  wt_inbox_str(fx, a1.id, "status", got, sizeof got);
  print_message("B called %lld ms after A-1, A-1 then %s\n", (long long)(obx_test_now_ms() - a1_called), got);
  if (strcmp(got, "DONE") == 0) fail_msg("B ran only once A-1's outcome was written: A-1 held the only slot");
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (strcmp(wt_inbox_str(fx, a1.id, "status", got, sizeof got), "DONE") != 0) {
    if (wt_erp_calls(fx, "SLOT-A2") > 0) fail_msg("A-2 called its endpoint before A-1 was DONE (%s)", got);
    if (obx_test_now_ms() > deadline) fail_msg("A-1: %s, want DONE", got);
    usleep(10000);
  }
  wt_wait_status(fx, a2.id, "DONE");
  wt_wait_status(fx, b.id, "DONE");
  assert_int_equal(wt_erp_calls(fx, "SLOT-A1"), 1);
  assert_int_equal(wt_erp_calls(fx, "SLOT-A2"), 1);
  assert_int_equal(wt_erp_calls(fx, "SLOT-B"), 1);
  assert_int_equal(obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}"), 1);
  obx_event_cleanup(&a1);
  obx_event_cleanup(&a2);
  obx_event_cleanup(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_claim_many_maps_each_insert_to_its_event, setup, teardown),
    cmocka_unit_test_setup_teardown(test_owned_many_writes_the_claims_that_hold, setup, teardown),
    cmocka_unit_test_setup_teardown(test_batch_claim_with_a_duplicate_and_a_peers_live_claim, setup, teardown),
    cmocka_unit_test_setup_teardown(test_group_commit_records_the_others_when_one_claim_is_lost, setup, teardown),
    cmocka_unit_test_setup_teardown(test_failed_group_commit_records_each_alone, setup, teardown),
    cmocka_unit_test_setup_teardown(test_refused_group_commit_records_each_alone, setup, teardown),
    cmocka_unit_test_setup_teardown(test_recording_frees_the_slot_not_the_key, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
