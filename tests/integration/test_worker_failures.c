/* test_worker_failures.c - every failure of an event is classified and bounded
 *
 * DESIGN: one table of triggers that used to loop forever (each retry running the pipeline
 * again) or wedge a partition: set-status on an order that does not exist, a header that is
 * not UTF-8, a payload with an empty key, a document over MongoDB's 16 MB (from the work
 * queue), a non-retriable
 * MongoDB error on the outcome's commit (failCommand), a 300-byte ce_id, a 10 KB key, a
 * non-UTF-8 id, key and body; and MongoDB unavailable for longer than the infrastructure
 * bounds. For each: the pipeline ran at most once, the event is in the DLQ with its failure
 * class (x-failure-class) and a reason naming the cause, the inbox says DEAD when it holds the
 * event, and an event of another key produced behind it still runs. And kafka.* passthrough
 * cannot turn on auto-commit or auto offset store, cooperative assignment or another group: each
 * is refused naming the key (worker.instance_id, static membership, gives a stable member). */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_event.h"
#include "obx_test_fixture.h"
#include "worker_test.h"

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

typedef struct {
  const char *want_id; /* message id to find; NULL: the one whose ce_id header is want_ce_id */
  const char *want_ce_id;
  size_t want_ce_id_len;
  bool found;
  char id[300];
  char fclass[32];
  char reason[2048];
  size_t key_len;
  int attempt;
} dlq_find_t;

static bool dlq_find(void *ctx, const obx_envelope_t *msg) {
  dlq_find_t *f = ctx;
  const char *ce_id = obx_envelope_header(msg, "ce_id");
  bool match = f->want_id ? msg->message_id && strcmp(msg->message_id, f->want_id) == 0
                          : ce_id && strlen(ce_id) == f->want_ce_id_len && memcmp(ce_id, f->want_ce_id, f->want_ce_id_len) == 0;
  if (!match) return true;
  f->found = true;
  snprintf(f->id, sizeof f->id, "%s", msg->message_id ? msg->message_id : "");
  snprintf(f->fclass, sizeof f->fclass, "%s", msg->failure_class ? msg->failure_class : "");
  snprintf(f->reason, sizeof f->reason, "%s", msg->reason ? msg->reason : "");
  f->key_len = msg->key ? msg->key_len : 0;
  f->attempt = msg->attempt;
  return false;
}

/* Waits for the DLQ message of an event and checks its class and reason. */
static void want_dlq(wt_fx_t *fx, dlq_find_t *f, const char *name, const char *fclass, const char *reason_part) {
  int64_t deadline = obx_test_now_ms() + WT_WAIT_MS;
  for (;;) {
    obx_err_t err = OBX_ERR_INIT;
    f->found = false;
    if (!obx_ladder_dlq_browse(fx->ladder, 0, NULL, dlq_find, f, &err)) print_message("browse: %s\n", err.msg);
    if (f->found) break;
    if (obx_test_now_ms() > deadline) fail_msg("%s: no DLQ message", name);
    usleep(50000);
  }
  if (strcmp(f->fclass, fclass) != 0) fail_msg("%s: x-failure-class got %s, want %s (reason %s)", name, f->fclass, fclass, f->reason);
  if (!strstr(f->reason, reason_part)) fail_msg("%s: reason got '%s', want it to name '%s'", name, f->reason, reason_part);
  print_message("%s: class %s, reason: %s\n", name, f->fclass, f->reason);
}

static void want_dead_entry(wt_fx_t *fx, const char *name, const char *id, const char *reason_part) {
  wt_wait_status(fx, id, "DEAD");
  bson_t doc;
  wt_inbox(fx, id, &doc);
  const char *last = obx_mongo_doc_str(&doc, "lastError");
  if (!last || !strstr(last, reason_part)) fail_msg("%s: inbox lastError got '%s', want it to name '%s'", name, last ? last : "(none)", reason_part);
  bson_destroy(&doc);
}

/* A record with the headers of ev plus `extra` (may be NULL), key and value given. */
static void produce_with(wt_fx_t *fx, rd_kafka_t *producer, const obx_event_t *ev, const obx_ce_header_t *extra,
                         const char *key, size_t key_len, const char *value, size_t value_len) {
  obx_kafka_record_t rec;
  memset(&rec, 0, sizeof rec);
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_event_to_kafka(ev, NULL, &rec, &err)) fail_msg("to_kafka: %s", err.msg);
  obx_ce_header_t h[OBX_CE_MAX_HEADERS + 1];
  int n = 0;
  for (int i = 0; i < rec.nheaders; i++) h[n++] = rec.headers[i];
  if (extra) h[n++] = *extra;
  rd_kafka_t *saved = fx->producer;
  if (producer) fx->producer = producer;
  wt_produce_record(fx, key ? key : rec.key, key ? key_len : rec.key_len, value ? value : rec.value,
                    value ? value_len : rec.value_len, h, n);
  fx->producer = saved;
  obx_kafka_record_cleanup(&rec);
}

/* A record with hand-made CloudEvent headers: id, key and body as given (any bytes). */
static void produce_raw(wt_fx_t *fx, const char *id, size_t id_len, const char *key, size_t key_len, const char *body,
                        size_t body_len) {
  obx_ce_header_t h[] = {{"ce_specversion", "1.0", 3}, {"ce_id", id, id_len}, {"ce_type", "OrderConfirmed", 14},
                         {"ce_source", "/test", 5}, {"ce_subject", "Order/1", 7}, {"ce_orgid", WT_ORG, strlen(WT_ORG)}};
  wt_produce_record(fx, key, key_len, body, body_len, h, 6);
}

/* An event of another key behind a bad one still runs. */
static void want_others_flow(wt_fx_t *fx, const char *name, int i) {
  obx_event_t ok;
  char num[32];
  snprintf(num, sizeof num, "OK-%d", i);
  wt_event(&ok, "OrderConfirmed", num, num);
  wt_route(fx, num, 200);
  wt_produce(fx, &ok);
  wt_wait_status(fx, ok.id, "DONE");
  print_message("%s: an event of another key ran behind it\n", name);
  obx_event_cleanup(&ok);
}

static void test_each_trigger_ends_in_the_dlq_once(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  char json[2048];
  snprintf(json, sizeof json,
           "{\"name\": \"audit\", \"trigger\": \"event.OrderAudited\", \"enabled\": true, \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"notify\", \"type\": \"http-request\", \"onError\": \"abort\", \"config\": {"
           "  \"method\": \"POST\", \"url\": \"%s/{{orderNumber}}\", \"body\": {\"n\": \"{{orderNumber}}\"}}},"
           "{\"id\": \"status\", \"type\": \"set-status\", \"config\": {\"statusTag\": \"audited\", \"name\": \"Audited\"}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"notify\"}, {\"from\": \"notify\", \"to\": \"status\"}]}",
           obx_test_httpd_url(fx->httpd, "/erp"));
  wt_create_pipeline_json(fx, json);
  wt_start_worker(fx);
  int other = 0;

  /* set-status on an order that is not there: the run's commit fails NOT_FOUND. */
  {
    obx_event_t ev;
    wt_event(&ev, "OrderAudited", "K-S", "S-1");
    wt_route(fx, "S-1", 200);
    wt_produce(fx, &ev);
    dlq_find_t f = {.want_id = ev.id};
    want_dlq(fx, &f, "set-status on a missing order", "terminal", "order");
    want_dead_entry(fx, "set-status on a missing order", ev.id, "not found");
    want_others_flow(fx, "set-status on a missing order", other++);
    if (wt_erp_calls(fx, "S-1") != 1) fail_msg("set-status case: the pipeline ran %d times, want 1", wt_erp_calls(fx, "S-1"));
    obx_event_cleanup(&ev);
  }
  /* A header value that is not UTF-8. */
  {
    obx_event_t ev;
    wt_event(&ev, "OrderConfirmed", "K-U", "U8-1");
    wt_route(fx, "U8-1", 200);
    obx_ce_header_t bad = {"x-note", "\xff\xfe ok", 5};
    produce_with(fx, NULL, &ev, &bad, NULL, 0, NULL, 0);
    dlq_find_t f = {.want_id = ev.id};
    want_dlq(fx, &f, "non-UTF-8 header", "malformed", "x-note: the value (5 bytes) is not UTF-8");
    if (!strstr(f.reason, "header x-note is not UTF-8: carried as bytes")) fail_msg("reason: %s", f.reason);
    want_others_flow(fx, "non-UTF-8 header", other++);
    assert_int_equal(wt_erp_calls(fx, "U8-1"), 0);
    obx_event_cleanup(&ev);
  }
  /* A payload with an empty key: libmongoc refuses the inbox insert. */
  {
    obx_event_t ev;
    wt_event(&ev, "OrderConfirmed", "K-E", "EK-1");
    BSON_APPEND_INT32(&ev.payload, "", 1);
    wt_route(fx, "EK-1", 200);
    wt_produce(fx, &ev);
    dlq_find_t f = {.want_id = ev.id};
    want_dlq(fx, &f, "empty key", "malformed", "the inbox cannot store the event");
    want_others_flow(fx, "empty key", other++);
    assert_int_equal(wt_erp_calls(fx, "EK-1"), 0);
    obx_event_cleanup(&ev);
  }
  /* A document over 16 MB (through the work queue: the Kafka test broker keeps records smaller). */
  {
    obx_event_t ev;
    wt_event(&ev, "OrderConfirmed", "K-B", "BIG-1");
    size_t n = 17u * 1024 * 1024;
    char *fill = malloc(n + 1);
    memset(fill, 'x', n);
    fill[n] = '\0';
    BSON_APPEND_UTF8(&ev.payload, "fill", fill);
    free(fill);
    wt_route(fx, "BIG-1", 200);
    obx_envelope_t msg;
    obx_envelope_init(&msg);
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_envelope_from_event(&msg, &ev, &err) || !obx_ladder_publish_work(fx->ladder, &msg, &err))
      fail_msg("publish: %s", err.msg);
    obx_envelope_cleanup(&msg);
    dlq_find_t f = {.want_id = ev.id};
    want_dlq(fx, &f, "document over 16 MB", "malformed", "the inbox cannot store the event");
    if (!strstr(f.reason, "body cut from")) fail_msg("reason: %s", f.reason);
    want_others_flow(fx, "document over 16 MB", other++);
    assert_int_equal(wt_erp_calls(fx, "BIG-1"), 0);
    obx_event_cleanup(&ev);
  }
  /* A non-retriable MongoDB error on the outcome's commit: the run is not repeated. Twice: the
   * group commit's (batch.c), then the event's own recording after it. */
  {
    obx_event_t ev;
    wt_event(&ev, "OrderConfirmed", "K-F", "FC-1");
    wt_route(fx, "FC-1", 200);
    obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 2}, \"data\": "
                                    "{\"failCommands\": [\"commitTransaction\"], \"errorCode\": 2}}");
    wt_produce(fx, &ev);
    dlq_find_t f = {.want_id = ev.id};
    want_dlq(fx, &f, "failCommand on commitTransaction", "terminal", "recording the outcome (DONE) failed");
    want_dead_entry(fx, "failCommand on commitTransaction", ev.id, "recording the outcome (DONE) failed");
    obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
    want_others_flow(fx, "failCommand on commitTransaction", other++);
    if (wt_erp_calls(fx, "FC-1") != 1) fail_msg("failCommand case: the pipeline ran %d times, want 1", wt_erp_calls(fx, "FC-1"));
    obx_event_cleanup(&ev);
  }
  /* A 300-byte ce_id: not a valid AMQP message-id either; the DLQ copy gets a generated one. */
  {
    char id[301];
    memset(id, 'a', 300);
    id[300] = '\0';
    const char *body = "{\"orderNumber\": \"L-1\"}";
    produce_raw(fx, id, 300, "K-L", 3, body, strlen(body));
    dlq_find_t f = {.want_ce_id = id, .want_ce_id_len = 300};
    want_dlq(fx, &f, "300-byte ce_id", "malformed", "the record's ce_id is 300 bytes");
    assert_int_equal(strlen(f.id), OBX_UUID_LEN);
    want_others_flow(fx, "300-byte ce_id", other++);
  }
  /* A 10 KB key, carried whole in x-key. */
  {
    size_t n = 10 * 1024;
    char *key = malloc(n);
    memset(key, 'k', n);
    const char *id = "0190f0e0-0000-7000-8000-0000000010cb";
    const char *body = "{\"orderNumber\": \"KK-1\"}";
    produce_raw(fx, id, strlen(id), key, n, body, strlen(body));
    free(key);
    dlq_find_t f = {.want_id = id};
    want_dlq(fx, &f, "10 KB key", "malformed", "key: longer than");
    assert_int_equal(f.key_len, n);
    want_others_flow(fx, "10 KB key", other++);
  }
  /* Id, key and body that are not UTF-8. */
  {
    const char id[] = "\xff\xfe-not-an-id", key[] = "\xc3\x28-key", body[] = "{\"n\": \"\xff\"}";
    produce_raw(fx, id, sizeof id - 1, key, sizeof key - 1, body, sizeof body - 1);
    dlq_find_t f = {.want_ce_id = id, .want_ce_id_len = sizeof id - 1};
    want_dlq(fx, &f, "non-UTF-8 id, key and body", "malformed", "not UTF-8");
    if (!strstr(f.reason, "x-key is not UTF-8: carried as bytes") || !strstr(f.reason, "header ce_id is not UTF-8"))
      fail_msg("reason: %s", f.reason);
    want_others_flow(fx, "non-UTF-8 id, key and body", other++);
  }
  obx_worker_stats_t s;
  obx_worker_stats(fx->worker, &s);
  print_message("dead-lettered %llu, malformed %llu\n", (unsigned long long)s.dlq, (unsigned long long)s.malformed);
  assert_int_equal(s.dlq, 8);
}

/* MongoDB unavailable longer than the bounds (WORKER_INFRA_ATTEMPTS=3): the claim is not
 * retried forever; the event goes to the DLQ with class infra and runs after a redrive. */
static void test_infra_retries_are_bounded(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  wt_conf_set(fx, "worker.infra_attempts", "3");
  wt_conf_set(fx, "worker.infra_timeout", "10s");
  wt_start_worker(fx);
  obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": {\"times\": 1000}, \"data\": "
                                  "{\"failCommands\": [\"find\", \"insert\"], \"errorCode\": 91}}");
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "K-I", "INF-1");
  wt_route(fx, "INF-1", 200);
  wt_produce(fx, &ev);
  dlq_find_t f = {.want_id = ev.id};
  want_dlq(fx, &f, "MongoDB unavailable", "infra", "the inbox cannot store the event");
  obx_test_fail_point(fx->client, "{\"configureFailPoint\": \"failCommand\", \"mode\": \"off\"}");
  assert_int_equal(wt_erp_calls(fx, "INF-1"), 0);
  int moved = 0; /* the fixture runs no drain: the message is still on the queue, alone */
  obx_err_t err = OBX_ERR_INIT;
  if (!obx_ladder_dlq_redrive(fx->ladder, NULL, NULL, false, NULL, &moved, &err)) fail_msg("redrive: %s", err.msg);
  assert_int_equal(moved, 1);
  wt_wait_status(fx, ev.id, "DONE");
  assert_int_equal(wt_erp_calls(fx, "INF-1"), 1);
  obx_event_cleanup(&ev);
}

/* kafka.* passthrough cannot undo the consumer's guarantees; each refusal names the key. */
static void test_passthrough_cannot_undo_guarantees(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  const struct {
    const char *key, *value, *want;
  } cases[] = {
    {"kafka.enable.auto.commit", "true", "kafka.enable.auto.commit=true is refused"},
    {"kafka.enable.auto.offset.store", "true", "kafka.enable.auto.offset.store=true is refused"},
    {"kafka.partition.assignment.strategy", "cooperative-sticky", "cooperative-sticky is refused"},
    {"kafka.group.id", "other", "set worker.group"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_conf_t conf;
    obx_conf_init(&conf);
    obx_err_t err = OBX_ERR_INIT;
    char *v;
    const char *keys[] = {"mongo.uri", "kafka.brokers", "amqp.url", "worker.queue_prefix", "worker.group"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      v = obx_conf_get_string(&fx->conf, keys[k], true);
      assert_true(obx_conf_set(&conf, keys[k], v, &err));
      free(v);
    }
    assert_true(obx_conf_set(&conf, cases[i].key, cases[i].value, &err));
    obx_worker_t *w = obx_worker_new(&conf, NULL, &err);
    if (w) fail_msg("%s=%s: the worker started, want a refusal", cases[i].key, cases[i].value);
    if (!strstr(err.msg, cases[i].want)) fail_msg("%s=%s: got '%s', want '%s'", cases[i].key, cases[i].value, err.msg, cases[i].want);
    print_message("%s=%s: %s\n", cases[i].key, cases[i].value, err.msg);
    obx_conf_cleanup(&conf);
  }
  /* Allowed: the same keys set to what the worker uses anyway, and an eager strategy. */
  wt_conf_set(fx, "kafka.enable.auto.commit", "false");
  wt_conf_set(fx, "kafka.partition.assignment.strategy", "roundrobin");
  wt_conf_set(fx, "worker.instance_id", "wt-pod-0");
  wt_start_worker(fx);
  obx_event_t ev;
  wt_event(&ev, "OrderConfirmed", "K-PT", "PT-1");
  wt_route(fx, "PT-1", 200);
  wt_produce(fx, &ev);
  wt_wait_status(fx, ev.id, "DONE");
  obx_event_cleanup(&ev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_each_trigger_ends_in_the_dlq_once, setup, teardown),
    cmocka_unit_test_setup_teardown(test_infra_retries_are_bounded, setup, teardown),
    cmocka_unit_test_setup_teardown(test_passthrough_cannot_undo_guarantees, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
