/* test_worker_lifecycle.c - the moves of docs/worker-lifecycle.md that no other suite drives
 *
 * DESIGN: every move of an event is counted in outboxd_worker_transitions_total{from,to}
 * (src/worker/lifecycle.c, worker_state_move); each case sets up the inbox as the move needs it
 * (an entry claimed by a peer, a stale attempt, an unsent intent, a BLOCKED entry that no longer
 * decodes, MongoDB refusing a release step through a failCommand fail point), delivers the event the way the move starts from (a Kafka record, a work-queue copy,
 * an HTTP CloudEvent), and checks both what the world sees (ERP calls, inbox, queues, the HTTP
 * answer) and the counted move. The moves other suites drive are named, per row, in the doc. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_http.h"
#include "obx_test_fixture.h"
#include "obx_test_outboxd.h"
#include "worker_test.h"

#define PEER "peer-host:1:peer"
#define SINK_TOKEN "sink-token-lifecycle-0123456789"
#define AUTH "Authorization: Bearer " SINK_TOKEN

/* How many times events moved from `from` to `to` in this process so far. */
static double moves(const char *from, const char *to) {
  char series[160];
  snprintf(series, sizeof series, "outboxd_worker_transitions_total{from=\"%s\",to=\"%s\"}", from, to);
  double v = wt_metric(series);
  return v < 0 ? 0 : v;
}

static void wait_moves(const char *from, const char *to, double want) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  while (moves(from, to) < want && obx_test_now_ms() < deadline) usleep(20000);
  if (moves(from, to) < want) fail_msg("moves %s -> %s: got %.0f, want %.0f", from, to, moves(from, to), want);
}

/* Stores ev's inbox entry as `status`, claimed by owner for lease_ms (as the worker would). */
static void store_entry(wt_fx_t *fx, const obx_event_t *ev, obx_inbox_status_t status, const char *owner,
                        int64_t lease_ms) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_to_kafka(ev, NULL, &rec, &err)) fail_msg("to_kafka: %s", err.msg);
  const char *names[OBX_ENVELOPE_MAX_HEADERS];
  char *values[OBX_ENVELOPE_MAX_HEADERS];
  for (int i = 0; i < rec.nheaders; i++) {
    names[i] = rec.headers[i].name;
    values[i] = strndup(rec.headers[i].value, rec.headers[i].len);
  }
  obx_inbox_entry_t entry = {.consumer = fx->group, .event = ev, .header_names = names,
                             .header_values = (const char *const *)values, .nheaders = rec.nheaders,
                             .source_kind = "amqp", .seq = obx_time_now_ms(), .owner = owner, .lease_ms = lease_ms};
  bool inserted = false;
  obx_inbox_status_t existing;
  if (!obx_inbox_claim(fx->client, obx_mongo_db_name(fx->mongo), NULL, &entry, status, &inserted, &existing, &err) ||
      !inserted)
    fail_msg("storing the entry of %s: %s", ev->id, err.msg[0] ? err.msg : "already there");
  for (int i = 0; i < rec.nheaders; i++) free(values[i]);
  obx_kafka_record_cleanup(&rec);
}

/* Publishes a work-queue copy of ev at `attempt` (0: a redrive's). */
static void publish_copy(wt_fx_t *fx, const obx_event_t *ev, int attempt) {
  obx_envelope_t msg;
  obx_envelope_init(&msg);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_envelope_from_event(&msg, ev, &err)) fail_msg("envelope: %s", err.msg);
  msg.attempt = attempt;
  if (!obx_ladder_publish_work(fx->ladder, &msg, &err)) fail_msg("publish: %s", err.msg);
  obx_envelope_cleanup(&msg);
}

/* Applies an update (extended JSON) to the inbox entry of id. */
static void update_entry(wt_fx_t *fx, const char *id, const char *update_json) {
  bson_error_t berr;
  bson_t *update = bson_new_from_json((const uint8_t *)update_json, -1, &berr);
  if (!update) fail_msg("update %s: %s", update_json, berr.message);
  bson_t *filter = BCON_NEW("_id.consumer", BCON_UTF8(fx->group), "_id.eventId", BCON_UTF8(id));
  mongoc_collection_t *inbox = mongoc_client_get_collection(fx->client, obx_mongo_db_name(fx->mongo), "inbox");
  if (!mongoc_collection_update_one(inbox, filter, update, NULL, NULL, &berr)) fail_msg("update: %s", berr.message);
  mongoc_collection_destroy(inbox);
  bson_destroy(filter);
  bson_destroy(update);
}

/* The worker started, and an OrderConfirmed event of key = order number num whose ERP call
 * answers 200. */
static void start_with_event(wt_fx_t *fx, obx_event_t *ev, const char *num) {
  wt_start_worker(fx);
  wt_event(ev, "OrderConfirmed", num, num);
  wt_route(fx, num, 200);
}

/* #10: a live peer's claim on a work-queue copy: never run here; the copy goes round the first
 * retry tier until the peer's lease passes, then it is taken over (#9) and runs once, its ERP
 * call on the IO thread (#17a, #17b). */
static void test_live_claim_sends_the_copy_round_a_tier(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev;
  start_with_event(fx, &ev, "LC-1");
  double rounds = moves("decoded", "duplicate"), claims = moves("decoded", "claimed");
  double waits = moves("running", "waiting"), resumes = moves("waiting", "running");
  int64_t lease_end = obx_time_now_ms() + 2500;
  store_entry(fx, &ev, OBX_INBOX_RECEIVED, PEER, 2500);
  publish_copy(fx, &ev, 0);
  wait_moves("decoded", "duplicate", rounds + 1); /* met the live claim: sent round the tier */
  wt_wait_status(fx, ev.id, "DONE");
  int calls = 0;
  int last = wt_calls(fx, "LC-1", &calls);
  if (calls != 1) fail_msg("ERP calls: got %d, want 1", calls);
  obx_test_httpd_request_t req;
  assert_true(obx_test_httpd_request(fx->httpd, last, &req));
  if (req.start_ms < lease_end) fail_msg("the copy ran %lld ms before the peer's lease ended",
                                         (long long)(lease_end - req.start_ms));
  obx_test_httpd_request_cleanup(&req);
  if (moves("decoded", "claimed") < claims + 1) fail_msg("the expired claim was not taken over (decoded -> claimed)");
  if (moves("running", "waiting") < waits + 1 || moves("waiting", "running") < resumes + 1)
    fail_msg("the run's ERP call: running -> waiting %.0f, waiting -> running %.0f, want 1 each",
             moves("running", "waiting") - waits, moves("waiting", "running") - resumes);
  wt_wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
  obx_event_cleanup(&ev);
}

/* #13: a work-queue copy of an attempt the entry no longer records never runs: acked, skipped. */
static void test_stale_tier_copy_never_runs(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev;
  start_with_event(fx, &ev, "ST-1");
  store_entry(fx, &ev, OBX_INBOX_RECEIVED, PEER, 1);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_set_status(fx->client, obx_mongo_db_name(fx->mongo), NULL, fx->group, ev.id, OBX_INBOX_RETRYING, 2,
                            "attempt 2 failed", NULL, &err))
    fail_msg("set status: %s", err.msg);
  double skipped = moves("decoded", "duplicate");
  publish_copy(fx, &ev, 1); /* the copy of attempt 1; the entry is at attempt 2 */
  wait_moves("decoded", "duplicate", skipped + 1);
  wt_wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0); /* acked */
  if (wt_erp_calls(fx, "ST-1") != 0) fail_msg("ERP calls: got %d, want 0", wt_erp_calls(fx, "ST-1"));
  char status[32];
  if (strcmp(wt_inbox_str(fx, ev.id, "status", status, sizeof status), "RETRYING") != 0 ||
      wt_inbox_int(fx, ev.id, "attempts") != 2)
    fail_msg("the entry: got %s at attempt %lld, want RETRYING at attempt 2", status,
             (long long)wt_inbox_int(fx, ev.id, "attempts"));
  obx_event_cleanup(&ev);
}

/* #14: an intent recorded (RETRYING, retrySent false) whose owner stopped before the tier
 * publish: the next delivery (here the Kafka record again) publishes the tier copy of that
 * attempt, which then runs the event once. */
static void test_unsent_intent_is_sent_by_the_next_delivery(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  obx_event_t ev;
  start_with_event(fx, &ev, "UI-1");
  store_entry(fx, &ev, OBX_INBOX_RECEIVED, "gone-host:1:gone", 10000);
  obx_inbox_cas_t cas = {.owner = "gone-host:1:gone", .attempts = 0, .lease_ms = 1};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_set_status_owned(fx->client, obx_mongo_db_name(fx->mongo), NULL, fx->group, ev.id, &cas,
                                  OBX_INBOX_RETRYING, 1, "attempt 1 failed", NULL, &err))
    fail_msg("intent: %s", err.msg);
  bson_t doc;
  bson_iter_t it;
  assert_true(wt_inbox(fx, ev.id, &doc) && bson_iter_init_find(&it, &doc, "retrySent") && BSON_ITER_HOLDS_BOOL(&it) &&
              !bson_iter_bool(&it));
  bson_destroy(&doc);
  double resent = moves("decoded", "duplicate");
  wt_produce(fx, &ev); /* the record again: its offset was never committed */
  wait_moves("decoded", "duplicate", resent + 1); /* the record published the copy, itself skipped */
  wt_wait_status(fx, ev.id, "DONE");
  if (wt_erp_calls(fx, "UI-1") != 1) fail_msg("ERP calls: got %d, want 1", wt_erp_calls(fx, "UI-1"));
  if (wt_inbox_int(fx, ev.id, "attempts") != 2)
    fail_msg("attempts: got %lld, want 2 (the tier copy of recorded attempt 1 ran as attempt 2)",
             (long long)wt_inbox_int(fx, ev.id, "attempts"));
  obx_event_cleanup(&ev);
}

/* #27: the next BLOCKED entry of a released key no longer decodes: its raw form goes to the DLQ
 * (class malformed) and the entry says DEAD; the release goes on past it and unparks the key. */
static void test_undecodable_blocked_entry_is_dead_lettered(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_start_worker(fx);
  obx_event_t head, next;
  wt_event(&head, "OrderConfirmed", "UB", "UB-0");
  wt_event(&next, "OrderConfirmed", "UB", "UB-1");
  wt_route(fx, "UB-0", 400); /* terminal: DEAD, key parked behind it */
  wt_produce(fx, &head);
  wt_wait_status(fx, head.id, "DEAD");
  assert_true(wt_key_parked(fx, head.partition_key));
  store_entry(fx, &next, OBX_INBOX_BLOCKED, NULL, 0);
  update_entry(fx, next.id, "{\"$unset\": {\"headers.ce_type\": \"\"}}"); /* an older release stored it, say */

  double released = moves("releasing", "done");
  wt_route(fx, "UB-0", 200);
  publish_copy(fx, &head, 0); /* a redrive of the head */
  wt_wait_status(fx, head.id, "DONE");
  wt_wait_status(fx, next.id, "DEAD");
  wt_wait_unparked(fx, head.partition_key);
  wait_moves("releasing", "done", released + 1);
  if (wt_erp_calls(fx, "UB-1") != 0) fail_msg("the undecodable entry ran: %d ERP calls", wt_erp_calls(fx, "UB-1"));
  char reason[256];
  if (!strstr(wt_inbox_str(fx, next.id, "lastError", reason, sizeof reason), "does not decode"))
    fail_msg("lastError: got %s, want it to say the entry does not decode", reason);
  wt_dlq_seen_t seen = {0};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_dlq_browse(fx->ladder, 0, NULL, wt_dlq_collect, &seen, &err)) fail_msg("browse: %s", err.msg);
  int found = -1;
  for (int i = 0; i < seen.n; i++)
    if (strcmp(seen.id[i], next.id) == 0) found = i;
  if (found < 0) fail_msg("the undecodable entry is not in the DLQ (%d messages there)", seen.n);
  if (!strstr(seen.reason[found], "does not decode")) fail_msg("DLQ reason: %s", seen.reason[found]);
  obx_event_cleanup(&head);
  obx_event_cleanup(&next);
}

/* #28 and #16: MongoDB refuses the release step of a finished work-queue event (its outcome is
 * recorded): the message is given back, comes back as a finished duplicate and, MongoDB back,
 * takes the step; the pipeline ran once. */
static void test_release_step_given_back_then_taken(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.infra_attempts", "2");
  obx_event_t ev;
  start_with_event(fx, &ev, "RG-1");
  wt_route_delay(fx, "RG-1", 200, 1000);
  double given_back = moves("releasing", "given_back"), taken = moves("releasing", "duplicate");
  publish_copy(fx, &ev, 0); /* a redrive: the inbox has no entry yet */
  wt_wait_calls(fx, "RG-1", 1);
  /* while the call runs: every read of parked_keys fails (the outcome's transaction reads none) */
  char fp[256];
  snprintf(fp, sizeof fp,
           "{\"configureFailPoint\": \"failCommand\", \"mode\": \"alwaysOn\", \"data\": {\"failCommands\": "
           "[\"find\"], \"namespace\": \"%s.parked_keys\", \"errorCode\": 91}}",
           obx_mongo_db_name(fx->mongo));
  obx_test_fail_point(fx->client, fp);
  wait_moves("releasing", "given_back", given_back + 1);
  wt_wait_status(fx, ev.id, "DONE"); /* recorded before the step */
  obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  wait_moves("releasing", "duplicate", taken + 1); /* the copy came back finished and took the step */
  wt_wait_depth(fx, obx_ladder_work_queue(fx->ladder), 0);
  if (wt_erp_calls(fx, "RG-1") != 1) fail_msg("ERP calls: got %d, want 1", wt_erp_calls(fx, "RG-1"));
  obx_event_cleanup(&ev);
}

/* #2 and the stop: the running event finishes, the queued ones are given back (offsets not
 * committed) and run once each after a restart. */
static void test_stop_gives_queued_events_back(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  enum { N = 3 };
  obx_event_t ev[N];
  char num[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(num[i], sizeof num[i], "SB-%d", i);
    wt_event(&ev[i], "OrderConfirmed", "SB", num[i]);
    wt_route_delay(fx, num[i], 200, i == 0 ? 1500 : 0);
    wt_produce(fx, &ev[i]);
  }
  double given_back = moves("queued", "given_back");
  wt_start_worker(fx);
  wt_wait_calls(fx, num[0], 1); /* the first runs; the others wait behind it */
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  obx_worker_stats_t st;
  for (obx_worker_stats(fx->worker, &st); st.in_flight < N && obx_test_now_ms() < deadline;
       obx_worker_stats(fx->worker, &st))
    usleep(10000);
  if (st.in_flight < N) fail_msg("events in flight: got %lld, want %d", (long long)st.in_flight, N);
  obx_worker_destroy(fx->worker);
  fx->worker = NULL;
  if (moves("queued", "given_back") < given_back + N - 1)
    fail_msg("queued -> given_back: got %.0f, want %d", moves("queued", "given_back") - given_back, N - 1);
  wt_wait_status(fx, ev[0].id, "DONE"); /* the running one finished before the stop */
  for (int i = 1; i < N; i++) {
    bson_t doc;
    if (wt_inbox(fx, ev[i].id, &doc)) fail_msg("the queued %s has an inbox entry before the restart", num[i]);
    bson_destroy(&doc);
  }
  wt_start_worker(fx);
  for (int i = 0; i < N; i++) {
    wt_wait_status(fx, ev[i].id, "DONE");
    if (wt_erp_calls(fx, num[i]) != 1) fail_msg("ERP calls of %s: got %d, want 1", num[i], wt_erp_calls(fx, num[i]));
    obx_event_cleanup(&ev[i]);
  }
}

/* The waiting_gap moves (keyseq.c): an event of keySeq 2 whose keySeq 1 has not settled waits
 * (queued -> waiting_gap) holding no runner; keySeq 1 comes to the same process and runs first,
 * then keySeq 2 at once (waiting_gap -> queued, outboxd_worker_keyseq_gaps_total{outcome="filled"}),
 * long before WORKER_GAP_WAIT. keySeq 3 follows keySeq 2, which this process settled, without a
 * wait and without asking the inbox (its entry is set back to RECEIVED first: a lookup would
 * wait). keySeq 5 of the key (4 missing) waits, the worker stops, and the waiting event is given
 * back (waiting_gap -> given_back): no inbox entry, read again later. */
static void test_keyseq_gap_waits_then_runs_or_is_given_back(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.gap_wait", "60s");
  enum { N = 4 };
  obx_event_t ev[N];
  static const int seqs[N] = {2, 1, 3, 5};
  char num[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(num[i], sizeof num[i], "KG-%d", seqs[i]);
    wt_event(&ev[i], "OrderConfirmed", "KG", num[i]);
    ev[i].key_seq = seqs[i];
    wt_route(fx, num[i], 200);
  }
  double waits = moves("queued", "waiting_gap"), filled_moves = moves("waiting_gap", "queued");
  double given_back = moves("waiting_gap", "given_back");
  double filled = wt_metric("outboxd_worker_keyseq_gaps_total{outcome=\"filled\"}");
  wt_start_worker(fx);
  int64_t t0 = obx_test_now_ms();
  wt_produce(fx, &ev[0]);
  wait_moves("queued", "waiting_gap", waits + 1); /* keySeq 1 is not in the inbox */
  if (wt_erp_calls(fx, num[0]) != 0) fail_msg("keySeq 2 ran before keySeq 1 arrived");
  wt_produce(fx, &ev[1]);
  wt_wait_status(fx, ev[0].id, "DONE");
  wt_wait_status(fx, ev[1].id, "DONE");
  int64_t took = obx_test_now_ms() - t0;
  if (wt_last_call_index(fx, num[1]) > wt_last_call_index(fx, num[0]))
    fail_msg("keySeq 2 (request %d) ran before keySeq 1 (request %d)", wt_last_call_index(fx, num[0]),
             wt_last_call_index(fx, num[1]));
  if (took > 30000) fail_msg("keySeq 2 ran %lld ms after it came: it waited for the bound, not for keySeq 1", (long long)took);
  if (moves("waiting_gap", "queued") < filled_moves + 1) fail_msg("no move waiting_gap -> queued");
  double now_filled = wt_metric("outboxd_worker_keyseq_gaps_total{outcome=\"filled\"}");
  if (now_filled < (filled < 0 ? 0 : filled) + 1) fail_msg("keyseq_gaps_total{filled}: got %.0f, want %.0f", now_filled, (filled < 0 ? 0 : filled) + 1);

  update_entry(fx, ev[0].id, "{\"$set\": {\"status\": \"RECEIVED\"}}");
  wt_produce(fx, &ev[2]);
  wt_wait_status(fx, ev[2].id, "DONE");
  if (moves("queued", "waiting_gap") != waits + 1) fail_msg("keySeq 3 waited though this process settled keySeq 2");

  wt_produce(fx, &ev[3]); /* keySeq 4 never comes */
  wait_moves("queued", "waiting_gap", waits + 2);
  obx_worker_destroy(fx->worker);
  fx->worker = NULL;
  if (moves("waiting_gap", "given_back") < given_back + 1)
    fail_msg("waiting_gap -> given_back: got %.0f, want 1", moves("waiting_gap", "given_back") - given_back);
  bson_t doc;
  if (wt_inbox(fx, ev[3].id, &doc)) fail_msg("the waiting keySeq 5 has an inbox entry");
  bson_destroy(&doc);
  if (wt_erp_calls(fx, num[3]) != 0) fail_msg("keySeq 5 ran");
  for (int i = 0; i < N; i++) obx_event_cleanup(&ev[i]);
}

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

/* ---- HTTP source ----------------------------------------------------------------------------- */

static int setup_sink(void **state) { return wt_sink_setup(state, SINK_TOKEN); }

typedef struct {
  int port;
  const obx_event_t *ev;
  const char *num;
  const char *extra; /* one more header line, or NULL */
  long status;
  char body[256];
} post_t;

/* POSTs ev in binary mode to the sink; the answer into p. */
static void *post_event(void *arg) {
  post_t *p = arg;
  char id[80], key[96], body[96];
  snprintf(id, sizeof id, "ce-id: %s", p->ev->id);
  snprintf(key, sizeof key, "ce-partitionkey: %s", p->ev->partition_key);
  snprintf(body, sizeof body, "{\"orderNumber\": \"%s\"}", p->num);
  const char *headers[] = {"ce-specversion: 1.0", id, "ce-type: OrderConfirmed", "ce-source: /test/orders",
                           "ce-subject: Order/LC", key, "ce-orgid: " WT_ORG, "Content-Type: application/json",
                           AUTH, p->extra, NULL};
  obx_test_http_resp_t resp;
  obx_test_http(p->port, "POST", "/", NULL, body, headers, &resp);
  p->status = resp.status;
  snprintf(p->body, sizeof p->body, "%s", resp.body ? resp.body : "");
  obx_test_http_resp_cleanup(&resp);
  return NULL;
}

/* #12: a live peer's claim on an HTTP delivery: never run here, 503 (the sender delivers again). */
static void test_http_live_claim_is_503(void **state) {
  WT_NEED_BROKER();
  wt_sink_fx_t *s = *state;
  wt_fx_t *fx = s->fx;
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "HL-1", "HL-1");
  wt_route(fx, "HL-1", 200);
  store_entry(fx, &ev, OBX_INBOX_RECEIVED, PEER, 60000);
  double backs = moves("decoded", "given_back");
  post_t p = {.port = s->port, .ev = &ev, .num = "HL-1"};
  post_event(&p);
  if (p.status != 503) fail_msg("with a peer's live claim: got %ld (%s), want 503", p.status, p.body);
  if (wt_erp_calls(fx, "HL-1") != 0) fail_msg("ERP calls: got %d, want 0", wt_erp_calls(fx, "HL-1"));
  if (moves("decoded", "given_back") < backs + 1) fail_msg("decoded -> given_back was not counted");
  char owner[160];
  if (strcmp(wt_inbox_str(fx, ev.id, "owner", owner, sizeof owner), PEER) != 0) fail_msg("owner: got %s", owner);
  obx_event_cleanup(&ev);
}

/* #25 over HTTP: the claim is taken over while the pipeline runs; the outcome is not recorded
 * and the sender is told the event is handled (200 duplicate: the peer settles it). */
static void test_http_claim_lost_mid_run(void **state) {
  WT_NEED_BROKER();
  wt_sink_fx_t *s = *state;
  wt_fx_t *fx = s->fx;
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "HM-1", "HM-1");
  wt_route_delay(fx, "HM-1", 200, 1500);
  /* lost at the recording's compare-and-set, or before it when the renewal saw the claim gone */
  double lost = moves("recording", "lost") + moves("running", "lost");
  post_t p = {.port = s->port, .ev = &ev, .num = "HM-1"};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, post_event, &p), 0);
  wt_wait_calls(fx, "HM-1", 1); /* the run is in its call: a peer takes the claim over now */
  char takeover[160];
  snprintf(takeover, sizeof takeover, "{\"$set\": {\"owner\": \"%s\", \"leaseUntil\": {\"$date\": %lld}}}", PEER,
           (long long)(obx_time_now_ms() + 60000));
  update_entry(fx, ev.id, takeover);
  pthread_join(t, NULL);
  if (p.status != 200 || !strstr(p.body, "\"duplicate\""))
    fail_msg("a run whose claim was taken over: got %ld (%s), want 200 {\"status\":\"duplicate\"}", p.status, p.body);
  if (moves("recording", "lost") + moves("running", "lost") < lost + 1) fail_msg("the move to lost was not counted");
  char status[32], owner[160];
  if (strcmp(wt_inbox_str(fx, ev.id, "status", status, sizeof status), "RECEIVED") != 0 ||
      strcmp(wt_inbox_str(fx, ev.id, "owner", owner, sizeof owner), PEER) != 0)
    fail_msg("the entry: got %s claimed by %s, want RECEIVED claimed by the peer (nothing recorded by the lost run)",
             status, owner);
  if (wt_executions(fx, ev.id) != 0) fail_msg("executions recorded by the lost run: %lld", (long long)wt_executions(fx, ev.id));
  obx_event_cleanup(&ev);
}

/* #5: an HTTP event the sink accepts whose headers the worker cannot store (a value that is not
 * UTF-8): malformed, parked in the DLQ by the sink (200 dead), never run. */
static void test_http_undecodable_header_is_parked(void **state) {
  WT_NEED_BROKER();
  wt_sink_fx_t *s = *state;
  wt_fx_t *fx = s->fx;
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "HU-1", "HU-1");
  wt_route(fx, "HU-1", 200);
  double malformed = moves("queued", "malformed");
  post_t p = {.port = s->port, .ev = &ev, .num = "HU-1", .extra = "ce-knativeerrordata: \xff\xfe"};
  post_event(&p);
  if (p.status != 200 || !strstr(p.body, "\"dead\""))
    fail_msg("a header value that is not UTF-8: got %ld (%s), want 200 {\"status\":\"dead\"}", p.status, p.body);
  if (moves("queued", "malformed") < malformed + 1) fail_msg("queued -> malformed was not counted");
  if (wt_erp_calls(fx, "HU-1") != 0) fail_msg("ERP calls: got %d, want 0", wt_erp_calls(fx, "HU-1"));
  bson_t doc;
  if (wt_inbox(fx, ev.id, &doc)) fail_msg("a malformed event has an inbox entry");
  bson_destroy(&doc);
  wt_wait_depth(fx, obx_ladder_dlq_queue(fx->ladder), 1);
  obx_event_cleanup(&ev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_live_claim_sends_the_copy_round_a_tier, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_stale_tier_copy_never_runs, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_unsent_intent_is_sent_by_the_next_delivery, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_undecodable_blocked_entry_is_dead_lettered, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_release_step_given_back_then_taken, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_stop_gives_queued_events_back, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_keyseq_gap_waits_then_runs_or_is_given_back, wt_setup_state, teardown),
    cmocka_unit_test_setup_teardown(test_http_live_claim_is_503, setup_sink, wt_sink_teardown),
    cmocka_unit_test_setup_teardown(test_http_claim_lost_mid_run, setup_sink, wt_sink_teardown),
    cmocka_unit_test_setup_teardown(test_http_undecodable_header_is_parked, setup_sink, wt_sink_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
