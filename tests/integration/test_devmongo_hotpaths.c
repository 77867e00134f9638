/* test_devmongo_hotpaths.c - every query the product runs on a hot path is answered by an index
 *
 * DESIGN: the integration suites run their devmongods with --plan-log (tests/CMakeLists.txt sets
 * DEVMONGOD_PLAN_LOG_DIR to plan-log/<test> in the build dir for each of them), so every query
 * plan of the product, as the product ran it, is a JSON line. This test runs after them (ctest
 * fixture cleanup) and reads the lines of the product's own programs (devmongod names the
 * process at the other end of each connection: outboxd and outboxctl, not a test binary that
 * uses the library) on the hot-path collections: outbox (claims, lists), inbox (claims, lists,
 * blocked-event lookups), parked_keys, dead_letters, pipeline_executions and audit_log. Each
 * must be answered through an index (IXSCAN or IDHACK) with no in-memory SORT; a read of the
 * whole collection (empty filter, no sort) is exempt, and so is the sort of entries looked up by
 * their _id (as many as the query names). The failure lists each offending query
 * shape once, with the test that ran it. When the suites that drive these paths ran in the same
 * run (test_relay, test_worker, test_ops_api), outbox, inbox, parked_keys and
 * pipeline_executions must each have been queried, so a path that stops being exercised fails
 * too; dead_letters and audit_log are checked whenever the product queries them.
 * A new relay holder's takeover queries (relay_keys_load's PENDING events being retried and
 * claimed by an earlier holder, relay_claims_release's updateMany) must each be answered by
 * its partial index (outbox_pending_retried, outbox_pending_claimed), which holds only what
 * matches, not by an index over the whole PENDING backlog; test_relay must have run them. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bson/bson.h>

#include "obx_test.h"

static const char *const k_hot[] = {"outbox", "inbox", "parked_keys", "dead_letters", "pipeline_executions",
                                    "audit_log"};
#define NHOT (sizeof k_hot / sizeof *k_hot)
static const bool k_required[] = {true, true, true, false, true, false}; /* queried on every run */
static const char *const k_drivers[] = {"test_relay", "test_worker", "test_ops_api"};

/* The shape of a filter: its fields and operators, values replaced by "?". */
static void shape(const bson_t *doc, bson_t *out) {
  bson_iter_t it;
  bson_iter_init(&it, doc);
  while (bson_iter_next(&it)) {
    const char *key = bson_iter_key(&it);
    if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
      bson_t sub, child;
      uint32_t len;
      const uint8_t *data;
      if (BSON_ITER_HOLDS_DOCUMENT(&it)) bson_iter_document(&it, &len, &data);
      else bson_iter_array(&it, &len, &data);
      bson_init_static(&sub, data, len);
      if (BSON_ITER_HOLDS_DOCUMENT(&it)) bson_append_document_begin(out, key, -1, &child);
      else bson_append_array_begin(out, key, -1, &child);
      shape(&sub, &child);
      if (BSON_ITER_HOLDS_DOCUMENT(&it)) bson_append_document_end(out, &child);
      else bson_append_array_end(out, &child);
    } else {
      BSON_APPEND_UTF8(out, key, "?");
    }
  }
}

static const char *str_of(const bson_t *doc, const char *key) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
}

/* The filter or sort of a plan line (a JSON string in it); false when it is not readable as
 * JSON (e.g. it holds {$type: ...}, which reads as extended JSON): then only its text is shown. */
static bool json_field(const bson_t *doc, const char *key, bson_t *out) {
  bson_error_t error;
  const char *json = str_of(doc, key);
  return *json && bson_init_from_json(out, json, -1, &error);
}

static bool has_key(const bson_t *doc, const char *key) {
  bson_iter_t it;
  return bson_iter_init_find(&it, doc, key);
}

/* Whether a filter names its documents by _id (the whole _id, or both parts of the inbox's
 * {consumer, eventId}), at the top level or in an $and clause. */
static bool names_id(const bson_t *filter) {
  if (has_key(filter, "_id") || (has_key(filter, "_id.consumer") && has_key(filter, "_id.eventId"))) return true;
  bson_iter_t it, child;
  if (!bson_iter_init_find(&it, filter, "$and") || !bson_iter_recurse(&it, &child)) return false;
  while (bson_iter_next(&child)) {
    bson_t clause;
    uint32_t len;
    const uint8_t *data;
    if (!BSON_ITER_HOLDS_DOCUMENT(&child)) continue;
    bson_iter_document(&child, &len, &data);
    if (bson_init_static(&clause, data, len) && names_id(&clause)) return true;
  }
  return false;
}

/* The takeover queries: a top-level field and operator of the filter, and the index that must
 * answer them (src/lib/schema.c). */
static const struct {
  const char *field, *op, *plan;
} k_takeover[] = {
  {"attempts", "$gt", "IXSCAN { status: 1, bucket: 1, attempts: 1 }"},
  {"claimedUntil", "$exists", "IXSCAN { status: 1, availableAt: 1, _id: 1, bucket: 1 }"},
};
#define NTAKEOVER (sizeof k_takeover / sizeof *k_takeover)

typedef struct {
  char *lines[256];     /* offending shapes, each once */
  size_t nlines;
  long queries[NHOT];
  long checked;
  long takeover[NTAKEOVER]; /* takeover queries seen, each kind */
} result_t;

static void add_line(result_t *r, const char *line, const char *test) {
  for (size_t i = 0; i < r->nlines; i++)
    if (!strncmp(r->lines[i], line, strlen(line))) return;
  if (r->nlines < 256) {
    size_t n = strlen(line) + strlen(test) + 8;
    r->lines[r->nlines] = malloc(n);
    snprintf(r->lines[r->nlines++], n, "%s (in %s)", line, test);
  }
}

/* Which takeover query filter is (NTAKEOVER: none). */
static size_t takeover_kind(const bson_t *filter) {
  bson_iter_t it, op;
  for (size_t i = 0; i < NTAKEOVER; i++)
    if (bson_iter_init_find(&it, filter, k_takeover[i].field) && BSON_ITER_HOLDS_DOCUMENT(&it) &&
        bson_iter_recurse(&it, &op) && bson_iter_find(&op, k_takeover[i].op))
      return i;
  return NTAKEOVER;
}

static void check_entry(const char *test, const bson_t *e, result_t *r) {
  const char *proc = str_of(e, "process");
  if (strcmp(proc, "outboxd") && strcmp(proc, "outboxctl")) return; /* a test's own client */
  const char *ns = str_of(e, "ns"), *dot = strchr(ns, '.');
  if (!dot) return;
  size_t hot = NHOT;
  for (size_t i = 0; i < NHOT; i++)
    if (!strcmp(dot + 1, k_hot[i])) hot = i;
  if (hot == NHOT) return;
  r->queries[hot]++;
  bson_t filter, sort;
  bool readable = json_field(e, "filter", &filter);
  if (!readable) bson_init(&filter);
  if (!json_field(e, "sort", &sort)) bson_init(&sort);
  if (readable && bson_empty(&filter) && bson_empty(&sort)) { /* the whole collection */
    bson_destroy(&filter);
    bson_destroy(&sort);
    return;
  }
  r->checked++;
  const char *plan = str_of(e, "planSummary");
  bson_iter_t it;
  bool sort_stage = bson_iter_init_find(&it, e, "hasSortStage") && bson_iter_as_bool(&it);
  /* a lookup of given entries by _id (equality or $in: as many as named) may sort them */
  bool by_id = names_id(&filter);
  size_t kind = hot == 0 && readable ? takeover_kind(&filter) : NTAKEOVER;
  if (kind < NTAKEOVER) {
    r->takeover[kind]++;
    if (strcmp(plan, k_takeover[kind].plan) || sort_stage) {
      char line[512];
      snprintf(line, sizeof line, "%s outbox takeover query on %s: %s%s, not %s", str_of(e, "command"),
               k_takeover[kind].field, plan, sort_stage ? " + in-memory SORT" : "", k_takeover[kind].plan);
      add_line(r, line, test);
    }
  }
  if ((!strncmp(plan, "IXSCAN", 6) || !strcmp(plan, "IDHACK")) && (!sort_stage || by_id)) {
    bson_destroy(&filter);
    bson_destroy(&sort);
    return;
  }
  bson_t fs = BSON_INITIALIZER;
  shape(&filter, &fs);
  char *fj = readable ? bson_as_relaxed_extended_json(&fs, NULL) : bson_strdup(str_of(e, "filter"));
  char *sj = bson_as_relaxed_extended_json(&sort, NULL);
  bson_destroy(&filter);
  bson_destroy(&sort);
  char line[2048];
  snprintf(line, sizeof line, "%s %s filter %s sort %s: %s%s", str_of(e, "command"), dot + 1, fj, sj, plan,
           sort_stage ? " + in-memory SORT" : "");
  bson_free(fj);
  bson_free(sj);
  bson_destroy(&fs);
  add_line(r, line, test);
}

static void read_log(const char *test, const char *path, result_t *r) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    bson_error_t error;
    bson_t *e = bson_new_from_json((const uint8_t *)line, -1, &error);
    if (!e) fail_msg("%s: unreadable plan line: %s", path, error.message);
    check_entry(test, e, r);
    bson_destroy(e);
  }
  free(line);
  fclose(f);
}

static void test_hot_paths_use_indexes(void **state) {
  char root[1024];
  snprintf(root, sizeof root, "%s/plan-log", OBX_BUILD_DIR);
  DIR *d = opendir(root);
  if (!d) fail_msg("%s is missing: run this test through ctest with the integration suites", root);
  result_t r = {0};
  bool ran[sizeof k_drivers / sizeof *k_drivers] = {false};
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    for (size_t i = 0; i < sizeof k_drivers / sizeof *k_drivers; i++)
      if (!strcmp(de->d_name, k_drivers[i])) ran[i] = true;
    char sub[1400];
    snprintf(sub, sizeof sub, "%s/%s", root, de->d_name);
    DIR *sd = opendir(sub);
    struct dirent *fe;
    while (sd && (fe = readdir(sd))) {
      if (!strstr(fe->d_name, ".jsonl")) continue;
      char path[1800];
      snprintf(path, sizeof path, "%s/%s", sub, fe->d_name);
      read_log(de->d_name, path, &r);
    }
    if (sd) closedir(sd);
  }
  closedir(d);
  bool all_drivers = true;
  for (size_t i = 0; i < sizeof k_drivers / sizeof *k_drivers; i++) all_drivers = all_drivers && ran[i];
  print_message("product queries on hot-path collections (%ld with a filter or sort checked):\n", r.checked);
  for (size_t i = 0; i < NHOT; i++) print_message("  %-20s %ld\n", k_hot[i], r.queries[i]);
  for (size_t i = 0; i < r.nlines; i++) print_message("NOT INDEXED: %s\n", r.lines[i]);
  size_t unexercised = 0;
  for (size_t i = 0; all_drivers && i < NHOT; i++)
    if (!r.queries[i] && k_required[i]) {
      print_message("NOT EXERCISED: no product query on %s\n", k_hot[i]);
      unexercised++;
    }
  for (size_t i = 0; ran[0] && i < NTAKEOVER; i++) {
    print_message("  takeover on %-12s %ld\n", k_takeover[i].field, r.takeover[i]);
    if (!r.takeover[i]) {
      print_message("NOT EXERCISED: no takeover query on %s\n", k_takeover[i].field);
      unexercised++;
    }
  }
  if (!all_drivers) print_message("(coverage not checked: test_relay, test_worker and test_ops_api did not all run)\n");
  size_t bad = r.nlines;
  for (size_t i = 0; i < r.nlines; i++) free(r.lines[i]);
  if (bad || unexercised)
    fail_msg("%zu hot-path query shape(s) without an index, with an in-memory sort or (a takeover) not by its "
             "partial index, %zu hot-path collection(s) or takeover queries never exercised", bad, unexercised);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_hot_paths_use_indexes)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
