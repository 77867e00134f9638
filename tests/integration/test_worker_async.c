/* test_worker_async.c - slow endpoints do not cap the worker: http-request calls run on the IO
 * thread (src/worker/io.c), many keys' calls at once, each key's calls one at a time in order
 *
 * DESIGN: the shared worker fixture (worker_test.h: devmongod, the run's Kafka broker, RabbitMQ,
 * the scripted ERP) with 4 runner threads. KEYS keys each get PER_KEY events whose pipeline
 * calls POST /slow on the scripted ERP, which answers every call after CALL_MS. The assertions
 * read the ERP's own record of each call (start and end, the X-Key and X-Seq headers), never the
 * test's clock: calls of different keys overlap far beyond the runner count (a synchronous
 * runner pool can never have more than 4 at once), while the calls of one key never overlap
 * and come in the key's order; every event ends DONE with one execution. */
#include <stdlib.h>
#include <string.h>

#include "worker_test.h"

#define KEYS 200
#define PER_KEY 2
#define CALL_MS 300
#define RUNNERS "4"

static int setup(void **state) { return wt_setup_state(state); }

static int teardown(void **state) {
  wt_teardown(*state);
  return 0;
}

typedef struct {
  int64_t start, end;
  int key, seq;
} call_t;

static int by_start(const void *a, const void *b) {
  const call_t *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

static void test_slow_calls_overlap_across_keys(void **state) {
  WT_NEED_BROKER();
  wt_fx_t *fx = *state;
  char json[1024];
  snprintf(json, sizeof json,
           "{\"name\": \"slow\", \"trigger\": \"event.SlowCall\", \"enabled\": true, \"nodes\": ["
           "{\"id\": \"start\", \"type\": \"start\"},"
           "{\"id\": \"call\", \"type\": \"http-request\", \"config\": {\"url\": \"%s\","
           " \"headers\": {\"X-Key\": \"{{event.partitionKey}}\", \"X-Seq\": \"{{orderNumber}}\"},"
           " \"body\": {\"n\": \"{{orderNumber}}\"}}}],"
           "\"edges\": [{\"from\": \"start\", \"to\": \"call\"}]}",
           obx_test_httpd_url(fx->httpd, "/slow"));
  wt_create_pipeline_json(fx, json);
  obx_test_httpd_route_t route = {.path = "/slow", .status = 200, .body = "{\"ok\": true}", .delay_ms = CALL_MS};
  obx_test_httpd_route(fx->httpd, &route);
  wt_conf_set(fx, "worker.concurrency", RUNNERS);
  int before = obx_test_httpd_nrequests(fx->httpd);

  static char ids[KEYS * PER_KEY][OBX_UUID_LEN + 1];
  for (int s = 0; s < PER_KEY; s++)
    for (int k = 0; k < KEYS; k++) {
      char key[32], num[32];
      snprintf(key, sizeof key, "K%03d", k);
      snprintf(num, sizeof num, "%d", s);
      obx_event_t ev;
      wt_event(&ev, "SlowCall", key, num);
      snprintf(ids[s * KEYS + k], sizeof ids[0], "%s", ev.id);
      wt_produce(fx, &ev);
      obx_event_cleanup(&ev);
    }
  wt_start_worker(fx);
  for (int i = 0; i < KEYS * PER_KEY; i++) wt_wait_status(fx, ids[i], "DONE");

  int n = obx_test_httpd_nrequests(fx->httpd) - before;
  assert_int_equal(n, KEYS * PER_KEY); /* one call per event */
  call_t *calls = calloc((size_t)n, sizeof *calls);
  for (int i = 0; i < n; i++) {
    obx_test_httpd_request_t req;
    assert_true(obx_test_httpd_request(fx->httpd, before + i, &req));
    const char *key = obx_test_httpd_request_header(&req, "x-key"), *seq = obx_test_httpd_request_header(&req, "x-seq");
    assert_non_null(key);
    assert_non_null(seq);
    calls[i] = (call_t){.start = req.start_ms, .end = req.end_ms, .key = atoi(key + 1), .seq = atoi(seq)};
    assert_true(calls[i].end >= calls[i].start + CALL_MS - 20);
    obx_test_httpd_request_cleanup(&req);
  }
  qsort(calls, (size_t)n, sizeof *calls, by_start);

  /* each key: its calls in its order, the next one started only after the previous one ended */
  int last_seq[KEYS];
  int64_t last_end[KEYS];
  for (int k = 0; k < KEYS; k++) last_seq[k] = -1, last_end[k] = 0;
  for (int i = 0; i < n; i++) {
    int k = calls[i].key;
    if (calls[i].seq != last_seq[k] + 1) fail_msg("key K%03d: call of event %d after event %d", k, calls[i].seq, last_seq[k]);
    if (calls[i].start < last_end[k])
      fail_msg("key K%03d: call %d started %lld ms before the previous one ended", k, calls[i].seq,
               (long long)(last_end[k] - calls[i].start));
    last_seq[k] = calls[i].seq;
    last_end[k] = calls[i].end;
  }

  /* across keys: the most calls the ERP had open at once, and the calls' span */
  int most = 0;
  for (int i = 0; i < n; i++) {
    int open = 0;
    for (int j = 0; j <= i; j++) open += calls[j].end > calls[i].start;
    if (open > most) most = open;
  }
  int64_t first = calls[0].start, last = 0;
  for (int i = 0; i < n; i++) last = calls[i].end > last ? calls[i].end : last;
  print_message("%d calls of %d ms: at most %d at once (%s runners); first start to last end %lld ms (one at a "
                "time: %d ms)\n",
                n, CALL_MS, most, RUNNERS, (long long)(last - first), n * CALL_MS);
  if (most < 10 * atoi(RUNNERS)) fail_msg("at most %d calls at once, want at least %d", most, 10 * atoi(RUNNERS));
  assert_true(last - first < (int64_t)n * CALL_MS / atoi(RUNNERS)); /* beats the runners' own bound */
  for (int i = 0; i < KEYS * PER_KEY; i += 37) assert_int_equal(wt_executions(fx, ids[i]), 1);
  free(calls);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_slow_calls_overlap_across_keys, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
