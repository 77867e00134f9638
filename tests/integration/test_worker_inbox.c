/* test_worker_inbox.c - inbox entries and parked keys against devmongod */
#include <stdlib.h>
#include <string.h>

#include "obx/obx_conf.h"
#include "obx/obx_inbox.h"
#include "obx/obx_schema.h"
#include "obx/obx_mongo.h"
#include "obx_test.h"
#include "obx_test_mongo.h"

typedef struct {
  obx_test_mongo_t m;
  obx_conf_t conf;
  obx_mongo_t *mongo;
  mongoc_client_t *client;
  const char *db;
} fx_t;

static int setup(void **state) {
  fx_t *fx = calloc(1, sizeof *fx);
  if (!obx_test_mongo_start(&fx->m, NULL)) fail_msg("devmongod did not start");
  obx_conf_init(&fx->conf);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_conf_set(&fx->conf, "mongo.uri", fx->m.uri, &err)) fail_msg("%s", err.msg);
  fx->mongo = obx_mongo_new(&fx->conf, &err);
  assert_non_null(fx->mongo);
  fx->client = obx_mongo_pop(fx->mongo);
  fx->db = obx_mongo_db_name(fx->mongo);
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fx_t *fx = *state;
  obx_mongo_push(fx->mongo, fx->client);
  obx_mongo_destroy(fx->mongo);
  obx_conf_cleanup(&fx->conf);
  obx_test_mongo_stop(&fx->m);
  free(fx);
  return 0;
}

static void make_event(obx_event_t *ev, const char *key) {
  obx_event_init(ev);
  ev->event_type = strdup("OrderConfirmed");
  ev->org_id = strdup("org-1");
  ev->aggregate_type = strdup("Order");
  ev->aggregate_id = strdup(key);
  ev->source = strdup("/test");
  BSON_APPEND_UTF8(&ev->payload, "orderNumber", "A-7");
  BSON_APPEND_INT32(&ev->payload, "items", 3);
  assert_true(obx_event_finalize(ev, NULL));
}

/* Claims ev with its CloudEvent headers, as the worker does. */
static void claim(fx_t *fx, const obx_event_t *ev, obx_inbox_status_t status, int64_t seq, bool *inserted,
                  obx_inbox_status_t *existing) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  assert_true(obx_event_to_kafka(ev, NULL, &rec, NULL));
  const char *names[OBX_CE_MAX_HEADERS];
  char *values[OBX_CE_MAX_HEADERS];
  for (int i = 0; i < rec.nheaders; i++) {
    names[i] = rec.headers[i].name;
    values[i] = strndup(rec.headers[i].value, rec.headers[i].len);
  }
  obx_inbox_entry_t entry = {.consumer = "c1", .event = ev, .header_names = names,
                             .header_values = (const char *const *)values, .nheaders = rec.nheaders,
                             .topic = "domain-events", .partition = 2, .offset = seq, .seq = seq};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_inbox_claim(fx->client, fx->db, NULL, &entry, status, inserted, existing, &err))
    fail_msg("claim: %s", err.msg);
  for (int i = 0; i < rec.nheaders; i++) free(values[i]);
  obx_kafka_record_cleanup(&rec);
}

static const char *str_field(const bson_t *doc, const char *path) {
  bson_iter_t it, d;
  if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &d) && BSON_ITER_HOLDS_UTF8(&d))
    return bson_iter_utf8(&d, NULL);
  return NULL;
}

static bool has_field(const bson_t *doc, const char *path) {
  bson_iter_t it, d;
  return bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &d);
}

static void get(fx_t *fx, const char *id, bson_t *doc) {
  bool found = false;
  obx_err_t err = OBX_ERR_INIT;
  bson_init(doc);
  if (!obx_inbox_get(fx->client, fx->db, NULL, "c1", id, doc, &found, &err)) fail_msg("get: %s", err.msg);
  if (!found) fail_msg("inbox entry %s not found", id);
}

static void test_claim_detects_duplicates_with_their_status(void **state) {
  fx_t *fx = *state;
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_schema_ensure(fx->mongo, &fx->conf, OBX_SCHEMA_WORKER, &err)) fail_msg("schema: %s", err.msg);
  if (!obx_schema_ensure(fx->mongo, &fx->conf, OBX_SCHEMA_WORKER, &err)) fail_msg("schema again: %s", err.msg);
  obx_event_t ev;
  make_event(&ev, "K1");
  bool inserted = false;
  obx_inbox_status_t existing;
  claim(fx, &ev, OBX_INBOX_RECEIVED, 10, &inserted, &existing);
  assert_true(inserted);

  struct {
    obx_inbox_status_t set;
    bool processed_at;
  } steps[] = {
    {OBX_INBOX_RECEIVED, false}, {OBX_INBOX_RETRYING, false}, {OBX_INBOX_DONE, true},
    {OBX_INBOX_PROCESSING, false}, {OBX_INBOX_SKIPPED, true}, {OBX_INBOX_DEAD, true},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    if (i > 0 && !obx_inbox_set_status(fx->client, fx->db, NULL, "c1", ev.id, steps[i].set, (int)i, "boom", "exec-1",
                                       &err))
      fail_msg("set %s: %s", obx_inbox_status_name(steps[i].set), err.msg);
    claim(fx, &ev, OBX_INBOX_RECEIVED, 10, &inserted, &existing);
    assert_false(inserted);
    if (existing != steps[i].set)
      fail_msg("step %zu: existing status got %s, want %s", i, obx_inbox_status_name(existing),
               obx_inbox_status_name(steps[i].set));
    bson_t doc;
    get(fx, ev.id, &doc);
    if (has_field(&doc, "processedAt") != steps[i].processed_at)
      fail_msg("step %zu (%s): processedAt present=%d, want %d", i, obx_inbox_status_name(steps[i].set),
               has_field(&doc, "processedAt"), steps[i].processed_at);
    bson_destroy(&doc);
  }
  bson_t doc;
  get(fx, ev.id, &doc);
  assert_string_equal(str_field(&doc, "eventType"), "OrderConfirmed");
  assert_string_equal(str_field(&doc, "orgId"), "org-1");
  assert_string_equal(str_field(&doc, "partitionKey"), "K1");
  assert_string_equal(str_field(&doc, "source.topic"), "domain-events");
  assert_string_equal(str_field(&doc, "lastError"), "boom");
  assert_string_equal(str_field(&doc, "executionIds.0"), "exec-1");
  assert_string_equal(str_field(&doc, "headers.ce_type"), "OrderConfirmed");

  /* The stored entry gives back the event for replay. */
  obx_event_t back;
  obx_event_init(&back);
  if (!obx_inbox_entry_event(&doc, &back, &err)) fail_msg("entry_event: %s", err.msg);
  assert_string_equal(back.id, ev.id);
  assert_string_equal(back.event_type, ev.event_type);
  assert_string_equal(back.partition_key, "K1");
  assert_true(bson_equal(&back.payload, &ev.payload));
  obx_event_cleanup(&back);
  bson_destroy(&doc);

  assert_false(obx_inbox_set_status(fx->client, fx->db, NULL, "c1", "nope", OBX_INBOX_DONE, 1, NULL, NULL, &err));
  assert_int_equal(err.domain, OBX_ERR_NOT_FOUND);
  obx_event_cleanup(&ev);
}

static void test_parked_key_releases_blocked_in_seq_order(void **state) {
  fx_t *fx = *state;
  obx_err_t err = OBX_ERR_INIT;
  obx_event_t head, later[3];
  make_event(&head, "K2");
  bool parked = true, inserted;
  obx_inbox_status_t existing;
  char head_id[OBX_UUID_LEN + 1];
  assert_true(obx_inbox_key_parked(fx->client, fx->db, NULL, "c1", "K2", &parked, head_id, &err));
  assert_false(parked);
  claim(fx, &head, OBX_INBOX_RECEIVED, 1, &inserted, &existing);
  if (!obx_inbox_park_key(fx->client, fx->db, NULL, "c1", "K2", head.id, "RETRYING", &err)) fail_msg("%s", err.msg);
  assert_true(obx_inbox_key_parked(fx->client, fx->db, NULL, "c1", "K2", &parked, head_id, &err));
  assert_true(parked);
  assert_string_equal(head_id, head.id);
  /* Stored out of order on purpose: release order is seq order. */
  const int64_t seqs[] = {30, 10, 20};
  for (int i = 0; i < 3; i++) {
    make_event(&later[i], "K2");
    claim(fx, &later[i], OBX_INBOX_BLOCKED, seqs[i], &inserted, &existing);
    assert_true(inserted);
  }
  /* Another key is not affected. */
  assert_true(obx_inbox_key_parked(fx->client, fx->db, NULL, "c1", "K3", &parked, NULL, &err));
  assert_false(parked);

  bson_t list = BSON_INITIALIZER;
  if (!obx_inbox_list_parked(fx->client, fx->db, "c1", &list, &err)) fail_msg("list: %s", err.msg);
  assert_string_equal(str_field(&list, "keys.0.key"), "K2");
  assert_string_equal(str_field(&list, "keys.0.headEventId"), head.id);
  bson_iter_t it, d;
  assert_true(bson_iter_init(&it, &list) && bson_iter_find_descendant(&it, "keys.0.blocked", &d));
  assert_int_equal(bson_iter_as_int64(&d), 3);
  bson_destroy(&list);
  int64_t n = 0;
  assert_true(obx_inbox_count_parked(fx->client, fx->db, "c1", &n, &err));
  assert_int_equal(n, 1);

  const int want_order[] = {1, 2, 0};
  for (int i = 0; i < 3; i++) {
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    if (!obx_inbox_next_blocked(fx->client, fx->db, NULL, "c1", "K2", &doc, &found, &err)) fail_msg("%s", err.msg);
    assert_true(found);
    const char *id = str_field(&doc, "_id.eventId");
    if (strcmp(id, later[want_order[i]].id) != 0)
      fail_msg("release %d: got %s, want %s (seq %lld)", i, id, later[want_order[i]].id, (long long)seqs[want_order[i]]);
    assert_true(obx_inbox_set_status(fx->client, fx->db, NULL, "c1", id, OBX_INBOX_DONE, 1, NULL, NULL, &err));
    bson_destroy(&doc);
  }
  bson_t doc = BSON_INITIALIZER;
  bool found = true;
  assert_true(obx_inbox_next_blocked(fx->client, fx->db, NULL, "c1", "K2", &doc, &found, &err));
  assert_false(found);
  bson_destroy(&doc);
  assert_true(obx_inbox_unpark_key(fx->client, fx->db, NULL, "c1", "K2", &err));
  assert_true(obx_inbox_key_parked(fx->client, fx->db, NULL, "c1", "K2", &parked, NULL, &err));
  assert_false(parked);
  obx_event_cleanup(&head);
  for (int i = 0; i < 3; i++) obx_event_cleanup(&later[i]);
}

typedef struct {
  fx_t *fx;
  const char *id;
} txn_ctx_t;

static bool mark_dead_and_park(mongoc_client_session_t *session, void *ctx, obx_err_t *err) {
  txn_ctx_t *t = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  return obx_inbox_set_status(client, t->fx->db, session, "c1", t->id, OBX_INBOX_DEAD, 5, "HTTP 400", "exec-9", err) &&
         obx_inbox_park_key(client, t->fx->db, session, "c1", "K4", t->id, "DEAD", err);
}

static void test_status_and_park_in_one_transaction(void **state) {
  fx_t *fx = *state;
  obx_event_t ev;
  make_event(&ev, "K4");
  bool inserted;
  obx_inbox_status_t existing;
  claim(fx, &ev, OBX_INBOX_RECEIVED, 1, &inserted, &existing);
  txn_ctx_t t = {fx, ev.id};
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_mongo_transaction(fx->mongo, mark_dead_and_park, &t, &err)) fail_msg("transaction: %s", err.msg);
  bson_t doc;
  get(fx, ev.id, &doc);
  assert_string_equal(str_field(&doc, "status"), "DEAD");
  bson_destroy(&doc);
  bool parked = false;
  assert_true(obx_inbox_key_parked(fx->client, fx->db, NULL, "c1", "K4", &parked, NULL, &err));
  assert_true(parked);
  obx_event_cleanup(&ev);
}

/* The per-key lock across worker processes: a head moves only from the head it is (once), the
 * send is recorded, a new park clears both; holding a key for a BLOCKED store and unparking it
 * are transactions that conflict on the parked_keys document whichever starts first. */
static void test_head_moves_once_and_hold_conflicts_with_unpark(void **state) {
  fx_t *fx = *state;
  obx_err_t err = OBX_ERR_INIT;
  obx_event_t head, next;
  make_event(&head, "K5");
  make_event(&next, "K5");
  if (!obx_inbox_park_key(fx->client, fx->db, NULL, "c1", "K5", head.id, "RETRYING", &err)) fail_msg("%s", err.msg);
  bool moved = false, held = false, found = false;
  assert_true(obx_inbox_move_head(fx->client, fx->db, NULL, "c1", "K5", head.id, next.id, &moved, &err));
  assert_true(moved);
  /* A second process that finished the same head finds it moved. */
  assert_true(obx_inbox_move_head(fx->client, fx->db, NULL, "c1", "K5", head.id, "other", &moved, &err));
  assert_false(moved);
  bson_t doc = BSON_INITIALIZER;
  assert_true(obx_inbox_key_get(fx->client, fx->db, NULL, "c1", "K5", &doc, &found, &err) && found);
  assert_string_equal(str_field(&doc, "headEventId"), next.id);
  assert_string_equal(str_field(&doc, "releasedBy"), head.id);
  bson_iter_t it;
  assert_true(bson_iter_init_find(&it, &doc, "sent") && !bson_iter_bool(&it));
  assert_true(obx_inbox_mark_sent(fx->client, fx->db, NULL, "c1", "K5", next.id, &err));
  bson_reinit(&doc);
  assert_true(obx_inbox_key_get(fx->client, fx->db, NULL, "c1", "K5", &doc, &found, &err) && found);
  assert_true(bson_iter_init_find(&it, &doc, "sent") && bson_iter_bool(&it));
  if (!obx_inbox_park_key(fx->client, fx->db, NULL, "c1", "K5", next.id, "RETRYING", &err)) fail_msg("%s", err.msg);
  bson_reinit(&doc);
  assert_true(obx_inbox_key_get(fx->client, fx->db, NULL, "c1", "K5", &doc, &found, &err) && found);
  assert_false(has_field(&doc, "releasedBy") || has_field(&doc, "sent"));
  bson_destroy(&doc);
  /* Holding: only behind another head, only while parked. */
  assert_true(obx_inbox_hold_key(fx->client, fx->db, NULL, "c1", "K5", next.id, &held, &err));
  assert_false(held);
  assert_true(obx_inbox_hold_key(fx->client, fx->db, NULL, "c1", "K5", head.id, &held, &err));
  assert_true(held);

  /* Interleaved: each order, the second writer of the parked_keys document conflicts. */
  for (int hold_first = 0; hold_first < 2; hold_first++) {
    mongoc_client_t *other = obx_mongo_pop(fx->mongo);
    bson_error_t berr;
    mongoc_client_session_t *s_hold = mongoc_client_start_session(fx->client, NULL, &berr);
    mongoc_client_session_t *s_unpark = mongoc_client_start_session(other, NULL, &berr);
    assert_non_null(s_hold);
    assert_non_null(s_unpark);
    assert_true(mongoc_client_session_start_transaction(s_hold, NULL, &berr));
    assert_true(mongoc_client_session_start_transaction(s_unpark, NULL, &berr));
    bool first_ok, second_ok;
    obx_err_t first = OBX_ERR_INIT, second = OBX_ERR_INIT;
    if (hold_first) {
      first_ok = obx_inbox_hold_key(fx->client, fx->db, s_hold, "c1", "K5", head.id, &held, &first);
      second_ok = obx_inbox_unpark_key(other, fx->db, s_unpark, "c1", "K5", &second);
    } else {
      first_ok = obx_inbox_unpark_key(other, fx->db, s_unpark, "c1", "K5", &first);
      second_ok = obx_inbox_hold_key(fx->client, fx->db, s_hold, "c1", "K5", head.id, &held, &second);
    }
    if (!first_ok) fail_msg("%s first: %s", hold_first ? "hold" : "unpark", first.msg);
    if (second_ok) fail_msg("%s after an uncommitted %s: got success, want a write conflict",
                            hold_first ? "unpark" : "hold", hold_first ? "hold" : "unpark");
    if (!second.retriable) fail_msg("conflict: got a final error (%s), want a retriable one", second.msg);
    mongoc_client_session_abort_transaction(s_hold, NULL);
    mongoc_client_session_abort_transaction(s_unpark, NULL);
    mongoc_client_session_destroy(s_hold);
    mongoc_client_session_destroy(s_unpark);
    obx_mongo_push(fx->mongo, other);
  }
  bool parked = false;
  assert_true(obx_inbox_key_parked(fx->client, fx->db, NULL, "c1", "K5", &parked, NULL, &err));
  assert_true(parked); /* both aborted */
  obx_event_cleanup(&head);
  obx_event_cleanup(&next);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_head_moves_once_and_hold_conflicts_with_unpark, setup, teardown),
    cmocka_unit_test_setup_teardown(test_claim_detects_duplicates_with_their_status, setup, teardown),
    cmocka_unit_test_setup_teardown(test_parked_key_releases_blocked_in_seq_order, setup, teardown),
    cmocka_unit_test_setup_teardown(test_status_and_park_in_one_transaction, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
