/* store.c - pipeline definitions in the `pipelines` collection, executions paging
 *
 * DESIGN: a stored pipeline is the definition plus _id (UUIDv7), orgId, version, createdAt,
 * updatedAt; those fields are owned by the store (taken from the caller, never from the
 * body). Every save parses the document first (obx_pipeline_parse), so what is stored always
 * runs. Updates replace the document with version + 1, guarded by the version read
 * (a concurrent update is OBX_ERR_CONFLICT). At most one enabled pipeline per
 * (orgId, trigger): checked before each save and enforced by a partial unique index (a
 * concurrent save loses with OBX_ERR_CONFLICT). Executions are read newest first by _id
 * (UUIDv7 ids sort by time), with before/after cursors.
 *
 * The cache of enabled pipelines (obx_pipeline_cache_*) saves the order.pre lookup of each
 * POST /orders. Entries carry the store generation read before their MongoDB query; every
 * write of this process bumps the generation after writing, so an entry filled before a
 * write is stale at once, and one filled from a query that may have missed the write is too.
 * Other processes' writes are seen when the entry expires (ttl). */
#include "pipeline_int.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/obx_event.h"
#include "obx/obx_mongo.h"

/* Bumped after every write of a pipeline by this process: cache entries of older generations are stale. */
static atomic_uint_fast64_t store_generation;

/* A write that lost the race for the (orgId, trigger) unique index: a conflict. */
static void write_failed(obx_err_t *err, const bson_error_t *berr, const bson_t *reply, const bson_t *doc) {
  obx_err_from_bson(err, berr, reply);
  if (!obx_err_is_duplicate_key(err)) return;
  bson_iter_t it;
  const char *trigger = bson_iter_init_find(&it, doc, "trigger") ? bson_iter_utf8(&it, NULL) : "?";
  obx_err_set(err, OBX_ERR_CONFLICT, 0, false,
              "another pipeline is already enabled for trigger %s; disable it first (one enabled pipeline per trigger)",
              trigger);
}

static const char *const store_fields[] = {"_id", "orgId", "version", "createdAt", "updatedAt", NULL};

static bool is_store_field(const char *key) {
  for (const char *const *f = store_fields; *f; f++)
    if (strcmp(*f, key) == 0) return true;
  return false;
}

static mongoc_collection_t *pipelines_coll(mongoc_client_t *client, const char *db) {
  return mongoc_client_get_collection(client, db, "pipelines");
}

/* The stored form of def; validated. */
static bool build_doc(const bson_t *def, const char *id, const char *org_id, int32_t version, int64_t created_at,
                      bson_t *out, obx_err_t *err) {
  bson_iter_t it;
  BSON_APPEND_UTF8(out, "_id", id);
  BSON_APPEND_UTF8(out, "orgId", org_id);
  if (bson_iter_init(&it, def))
    while (bson_iter_next(&it))
      if (!is_store_field(bson_iter_key(&it))) bson_append_iter(out, bson_iter_key(&it), -1, &it);
  if (!bson_has_field(out, "enabled")) BSON_APPEND_BOOL(out, "enabled", true);
  BSON_APPEND_INT32(out, "version", version);
  BSON_APPEND_DATE_TIME(out, "createdAt", created_at);
  BSON_APPEND_DATE_TIME(out, "updatedAt", obx_time_now_ms());
  obx_pipeline_t *pipeline = NULL;
  if (!obx_pipeline_parse(out, &pipeline, err)) return false;
  bool ok = pipeline->trigger != NULL;
  if (!ok) obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "\"trigger\" is required (order.pre, order.post or event.<Type>)");
  obx_pipeline_destroy(pipeline);
  return ok;
}

/* Another enabled pipeline of the same (orgId, trigger) is a conflict. */
static bool check_unique_enabled(mongoc_collection_t *coll, const bson_t *doc, obx_err_t *err) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, "enabled") || !bson_iter_as_bool(&it)) return true;
  const char *id = NULL, *org = NULL, *trigger = NULL;
  if (bson_iter_init_find(&it, doc, "_id")) id = bson_iter_utf8(&it, NULL);
  if (bson_iter_init_find(&it, doc, "orgId")) org = bson_iter_utf8(&it, NULL);
  if (bson_iter_init_find(&it, doc, "trigger")) trigger = bson_iter_utf8(&it, NULL);
  bson_t *filter = BCON_NEW("orgId", BCON_UTF8(org), "trigger", BCON_UTF8(trigger), "enabled", BCON_BOOL(true), "_id",
                            "{", "$ne", BCON_UTF8(id), "}");
  bson_t *opts = BCON_NEW("limit", BCON_INT64(1), "projection", "{", "name", BCON_INT32(1), "}");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(coll, filter, opts, NULL);
  const bson_t *found;
  bool ok = true;
  if (mongoc_cursor_next(cursor, &found)) {
    const char *other = bson_iter_init_find(&it, found, "_id") ? bson_iter_utf8(&it, NULL) : "?";
    obx_err_set(err, OBX_ERR_CONFLICT, 0, false,
                "pipeline %s is already enabled for trigger %s; disable it first (one enabled pipeline per trigger)",
                other, trigger);
    ok = false;
  }
  ok = obx_mongo_cursor_end(cursor, ok ? err : NULL) && ok;
  bson_destroy(opts);
  bson_destroy(filter);
  return ok;
}

static void copy_out(const bson_t *doc, bson_t *saved) {
  if (!saved) return;
  bson_reinit(saved);
  bson_concat(saved, doc);
}

bool obx_pipeline_store_create(mongoc_client_t *client, const char *db, const char *org_id, const bson_t *def,
                               bson_t *saved, obx_err_t *err) {
  char id[OBX_UUID_LEN + 1];
  bson_t doc = BSON_INITIALIZER;
  bson_error_t berr;
  bson_t reply;
  bool ok = false;
  mongoc_collection_t *coll = pipelines_coll(client, db);
  obx_uuid7(id);
  if (!build_doc(def, id, org_id, 1, obx_time_now_ms(), &doc, err) || !check_unique_enabled(coll, &doc, err))
    goto done;
  bool inserted = mongoc_collection_insert_one(coll, &doc, NULL, &reply, &berr);
  atomic_fetch_add(&store_generation, 1); /* after the write, even a failed one: it may have landed */
  if (!inserted) {
    write_failed(err, &berr, &reply, &doc);
    bson_destroy(&reply);
    goto done;
  }
  bson_destroy(&reply);
  copy_out(&doc, saved);
  ok = true;
done:
  mongoc_collection_destroy(coll);
  bson_destroy(&doc);
  return ok;
}

/* Replaces `old` (a stored document) by def with version + 1. */
static bool replace(mongoc_collection_t *coll, const bson_t *old, const bson_t *def, bson_t *saved, obx_err_t *err) {
  bson_iter_t it;
  const char *id = bson_iter_init_find(&it, old, "_id") ? bson_iter_utf8(&it, NULL) : "";
  const char *org = bson_iter_init_find(&it, old, "orgId") ? bson_iter_utf8(&it, NULL) : "";
  int32_t version = bson_iter_init_find(&it, old, "version") ? (int32_t)bson_iter_as_int64(&it) : 1;
  int64_t created = bson_iter_init_find(&it, old, "createdAt") && BSON_ITER_HOLDS_DATE_TIME(&it)
                      ? bson_iter_date_time(&it)
                      : obx_time_now_ms();
  bson_t doc = BSON_INITIALIZER, reply = BSON_INITIALIZER;
  bson_error_t berr;
  bool ok = false;
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id), "orgId", BCON_UTF8(org), "version", BCON_INT32(version));
  if (!build_doc(def, id, org, version + 1, created, &doc, err) || !check_unique_enabled(coll, &doc, err)) goto done;
  bson_destroy(&reply);
  bool replaced = mongoc_collection_replace_one(coll, filter, &doc, NULL, &reply, &berr);
  atomic_fetch_add(&store_generation, 1); /* after the write, even a failed one: it may have landed */
  if (!replaced) {
    write_failed(err, &berr, &reply, &doc);
    goto done;
  }
  if (bson_iter_init_find(&it, &reply, "matchedCount") && bson_iter_as_int64(&it) == 0) {
    obx_err_set(err, OBX_ERR_CONFLICT, 0, false, "pipeline %s changed concurrently (version %d); read it again", id,
                version);
    goto done;
  }
  copy_out(&doc, saved);
  ok = true;
done:
  bson_destroy(filter);
  bson_destroy(&reply);
  bson_destroy(&doc);
  return ok;
}

bool obx_pipeline_store_get(mongoc_client_t *client, const char *db, const char *org_id, const char *id, bson_t *out,
                            obx_err_t *err) {
  mongoc_collection_t *coll = pipelines_coll(client, db);
  bson_t *filter = BCON_NEW("_id", BCON_UTF8(id), "orgId", BCON_UTF8(org_id));
  bool found;
  bool ok = obx_mongo_find_one(coll, filter, NULL, NULL, out, &found, err);
  if (ok && !found) {
    obx_err_set(err, OBX_ERR_NOT_FOUND, 0, false, "pipeline %s not found", id);
    ok = false;
  }
  bson_destroy(filter);
  mongoc_collection_destroy(coll);
  return ok;
}

bool obx_pipeline_store_update(mongoc_client_t *client, const char *db, const char *org_id, const char *id,
                               const bson_t *def, bson_t *saved, obx_err_t *err) {
  bson_t old = BSON_INITIALIZER;
  bool ok = obx_pipeline_store_get(client, db, org_id, id, &old, err);
  if (ok) {
    mongoc_collection_t *coll = pipelines_coll(client, db);
    ok = replace(coll, &old, def, saved, err);
    mongoc_collection_destroy(coll);
  }
  bson_destroy(&old);
  return ok;
}

/* The fields that make two definitions the same pipeline, in a fixed order. */
static void definition_part(const bson_t *doc, bson_t *out) {
  static const char *const keys[] = {"name", "trigger", "enabled", "nodes", "edges", "description", NULL};
  bson_iter_t it;
  for (const char *const *k = keys; *k; k++)
    if (bson_iter_init_find(&it, doc, *k)) bson_append_iter(out, *k, -1, &it);
  if (!bson_has_field(doc, "enabled")) BSON_APPEND_BOOL(out, "enabled", true);
}

bool obx_pipeline_store_apply(mongoc_client_t *client, const char *db, const char *org_id, const bson_t *def,
                              bool dry_run, const char **action, bson_t *saved, obx_err_t *err) {
  bson_iter_t it;
  const char *name = bson_iter_init_find(&it, def, "name") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
  const char *def_org = bson_iter_init_find(&it, def, "orgId") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
  if (!org_id) org_id = def_org;
  *action = NULL;
  if (!name || !*name || !org_id || !*org_id) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "\"name\" and \"orgId\" are required to apply a pipeline file");
    return false;
  }
  mongoc_collection_t *coll = pipelines_coll(client, db);
  bson_t old = BSON_INITIALIZER, check = BSON_INITIALIZER, a = BSON_INITIALIZER, b = BSON_INITIALIZER;
  bson_t *filter = BCON_NEW("orgId", BCON_UTF8(org_id), "name", BCON_UTF8(name));
  bool found, ok = false;
  if (!obx_mongo_find_one(coll, filter, NULL, NULL, &old, &found, err)) goto done;
  /* validate in every mode, dry run included */
  if (!build_doc(def, "dry-run", org_id, 1, 0, &check, err)) goto done;
  if (!found) {
    *action = "create";
    ok = dry_run || obx_pipeline_store_create(client, db, org_id, def, saved, err);
    goto done;
  }
  definition_part(&old, &a);
  definition_part(def, &b);
  if (bson_equal(&a, &b)) {
    *action = "unchanged";
    copy_out(&old, saved);
    ok = true;
    goto done;
  }
  *action = "update";
  ok = dry_run || replace(coll, &old, def, saved, err);
done:
  bson_destroy(filter);
  bson_destroy(&b);
  bson_destroy(&a);
  bson_destroy(&check);
  bson_destroy(&old);
  mongoc_collection_destroy(coll);
  return ok;
}

/* Appends the documents of cursor to out as the array `key` and ends the cursor (obx_mongo_cursor_end). */
static bool collect(mongoc_cursor_t *cursor, const char *key, bson_t *out, obx_err_t *err) {
  const bson_t *doc;
  bson_t arr;
  uint32_t i = 0;
  BSON_APPEND_ARRAY_BEGIN(out, key, &arr);
  while (mongoc_cursor_next(cursor, &doc)) {
    char idx[16];
    const char *idxp;
    bson_uint32_to_string(i++, &idxp, idx, sizeof idx);
    BSON_APPEND_DOCUMENT(&arr, idxp, doc);
  }
  bson_append_array_end(out, &arr);
  return obx_mongo_cursor_end(cursor, err);
}

bool obx_pipeline_store_list(mongoc_client_t *client, const char *db, const char *org_id, bson_t *out,
                             obx_err_t *err) {
  mongoc_collection_t *coll = pipelines_coll(client, db);
  bson_t *filter = org_id ? BCON_NEW("orgId", BCON_UTF8(org_id)) : bson_new();
  bson_t *opts = BCON_NEW("sort", "{", "orgId", BCON_INT32(1), "name", BCON_INT32(1), "}");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(coll, filter, opts, NULL);
  bool ok = collect(cursor, "pipelines", out, err);
  bson_destroy(opts);
  bson_destroy(filter);
  mongoc_collection_destroy(coll);
  return ok;
}

bool obx_pipeline_store_find_enabled(mongoc_client_t *client, const char *db, mongoc_client_session_t *session,
                                     const char *org_id, const char *trigger, obx_pipeline_t **out, obx_err_t *err) {
  mongoc_collection_t *coll = pipelines_coll(client, db);
  bson_t *filter = BCON_NEW("orgId", BCON_UTF8(org_id), "trigger", BCON_UTF8(trigger), "enabled", BCON_BOOL(true));
  bson_t doc = BSON_INITIALIZER;
  bool found = false, ok = false;
  *out = NULL;
  if (!obx_mongo_find_one(coll, filter, NULL, session, &doc, &found, err)) goto done;
  if (found && !obx_pipeline_parse(&doc, out, err)) {
    obx_err_prefix(err, "stored pipeline of %s/%s", org_id, trigger);
    goto done;
  }
  ok = true;
done:
  bson_destroy(&doc);
  bson_destroy(filter);
  mongoc_collection_destroy(coll);
  return ok;
}

bool obx_pipeline_store_executions(mongoc_client_t *client, const char *db, const char *org_id,
                                   const char *pipeline_id, int limit, const char *before, const char *after,
                                   bson_t *out, obx_err_t *err) {
  if (limit < 1 || limit > 200) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "limit: %d (want 1 to 200)", limit);
    return false;
  }
  if (before && after) {
    obx_err_set(err, OBX_ERR_INPUT, 0, false, "before and after: give at most one");
    return false;
  }
  bson_t filter = BSON_INITIALIZER, range;
  BSON_APPEND_UTF8(&filter, "orgId", org_id);
  BSON_APPEND_UTF8(&filter, "pipelineId", pipeline_id);
  if (before || after) {
    BSON_APPEND_DOCUMENT_BEGIN(&filter, "_id", &range);
    BSON_APPEND_UTF8(&range, before ? "$lt" : "$gt", before ? before : after);
    bson_append_document_end(&filter, &range);
  }
  /* after= reads the executions just newer than the cursor (oldest first), shown newest first */
  bson_t *opts = BCON_NEW("sort", "{", "_id", BCON_INT32(after ? 1 : -1), "}", "limit", BCON_INT64(limit));
  mongoc_collection_t *coll = mongoc_client_get_collection(client, db, "pipeline_executions");
  mongoc_cursor_t *cursor = mongoc_collection_find_with_opts(coll, &filter, opts, NULL);
  bson_t **page = bson_malloc0((size_t)limit * sizeof *page);
  int n = 0;
  const bson_t *doc;
  while (n < limit && mongoc_cursor_next(cursor, &doc)) page[n++] = bson_copy(doc);
  bool ok = obx_mongo_cursor_end(cursor, err);
  if (ok) {
    bson_t arr;
    bson_iter_t it;
    BSON_APPEND_ARRAY_BEGIN(out, "executions", &arr);
    for (int i = 0; i < n; i++) {
      char idx[16];
      const char *idxp;
      bson_uint32_to_string((uint32_t)i, &idxp, idx, sizeof idx);
      BSON_APPEND_DOCUMENT(&arr, idxp, page[after ? n - 1 - i : i]);
    }
    bson_append_array_end(out, &arr);
    /* cursors: next = the oldest shown (before=), prev = the newest shown (after=) */
    const bson_t *oldest = n ? page[after ? 0 : n - 1] : NULL, *newest = n ? page[after ? n - 1 : 0] : NULL;
    if (oldest && n == limit && bson_iter_init_find(&it, oldest, "_id"))
      bson_append_iter(out, "next", -1, &it);
    else
      BSON_APPEND_NULL(out, "next");
    if (newest && bson_iter_init_find(&it, newest, "_id"))
      bson_append_iter(out, "prev", -1, &it);
    else
      BSON_APPEND_NULL(out, "prev");
  }
  for (int i = 0; i < n; i++) bson_destroy(page[i]);
  bson_free(page);
  mongoc_collection_destroy(coll);
  bson_destroy(opts);
  bson_destroy(&filter);
  return ok;
}

/* ---- cache of enabled pipelines ---------------------------------------------------------- */

typedef struct {
  char *org_id, *trigger;
  obx_pipeline_t *pipeline; /* a reference; NULL: none enabled */
  int64_t expires_ms;       /* monotonic */
  uint_fast64_t generation;
} cache_entry_t;

struct obx_pipeline_cache {
  int64_t ttl_ms;
  pthread_mutex_t mu; /* entries */
  cache_entry_t *entries;
  int n;
};

obx_pipeline_cache_t *obx_pipeline_cache_new(int64_t ttl_ms) {
  obx_pipeline_cache_t *cache = calloc(1, sizeof *cache);
  cache->ttl_ms = ttl_ms;
  pthread_mutex_init(&cache->mu, NULL);
  return cache;
}

static void entry_clear(cache_entry_t *e) {
  free(e->org_id);
  free(e->trigger);
  obx_pipeline_destroy(e->pipeline);
}

void obx_pipeline_cache_destroy(obx_pipeline_cache_t *cache) {
  if (!cache) return;
  for (int i = 0; i < cache->n; i++) entry_clear(&cache->entries[i]);
  free(cache->entries);
  pthread_mutex_destroy(&cache->mu);
  free(cache);
}

/* The entry of (org_id, trigger), or NULL. Under cache->mu. */
static cache_entry_t *cache_find(obx_pipeline_cache_t *cache, const char *org_id, const char *trigger) {
  for (int i = 0; i < cache->n; i++)
    if (strcmp(cache->entries[i].org_id, org_id) == 0 && strcmp(cache->entries[i].trigger, trigger) == 0)
      return &cache->entries[i];
  return NULL;
}

/* Stores an answer read at `generation`; takes a reference to pipeline. Under cache->mu. */
static void cache_put(obx_pipeline_cache_t *cache, const char *org_id, const char *trigger, obx_pipeline_t *pipeline,
                      uint_fast64_t generation, int64_t now) {
  cache_entry_t *e = cache_find(cache, org_id, trigger);
  if (e) {
    if (e->generation > generation) return; /* a fresher answer is already there */
    obx_pipeline_destroy(e->pipeline);
  } else {
    if (!cache->entries) cache->entries = calloc(OBX_PIPELINE_CACHE_MAX, sizeof *cache->entries);
    if (cache->n == OBX_PIPELINE_CACHE_MAX) {
      int victim = 0;
      for (int i = 1; i < cache->n; i++)
        if (cache->entries[i].expires_ms < cache->entries[victim].expires_ms) victim = i;
      entry_clear(&cache->entries[victim]);
      cache->entries[victim] = cache->entries[--cache->n];
    }
    e = &cache->entries[cache->n++];
    e->org_id = strdup(org_id);
    e->trigger = strdup(trigger);
  }
  e->pipeline = pipeline ? obx_pipeline_ref(pipeline) : NULL;
  e->expires_ms = now + cache->ttl_ms;
  e->generation = generation;
}

bool obx_pipeline_cache_find_enabled(obx_pipeline_cache_t *cache, mongoc_client_t *client, const char *db,
                                     const char *org_id, const char *trigger, obx_pipeline_t **out, obx_err_t *err) {
  if (cache->ttl_ms <= 0) return obx_pipeline_store_find_enabled(client, db, NULL, org_id, trigger, out, err);
  uint_fast64_t generation = atomic_load(&store_generation); /* before the query: see the DESIGN note */
  int64_t now = obx_time_mono_ms();
  pthread_mutex_lock(&cache->mu);
  cache_entry_t *e = cache_find(cache, org_id, trigger);
  bool hit = e && e->generation == generation && now < e->expires_ms;
  if (hit) *out = e->pipeline ? obx_pipeline_ref(e->pipeline) : NULL;
  pthread_mutex_unlock(&cache->mu);
  if (hit) return true;
  if (!obx_pipeline_store_find_enabled(client, db, NULL, org_id, trigger, out, err)) return false;
  pthread_mutex_lock(&cache->mu);
  cache_put(cache, org_id, trigger, *out, generation, now);
  pthread_mutex_unlock(&cache->mu);
  return true;
}

/* ---- files ------------------------------------------------------------------------------ */

static bool apply_file(mongoc_client_t *client, const char *db, const char *path, bool dry_run, FILE *report,
                       obx_err_t *err) {
  bson_error_t berr = {0};
  bson_t def = BSON_INITIALIZER;
  const char *action = NULL;
  bool ok = false;
  bson_json_reader_t *reader = bson_json_reader_new_from_file(path, &berr);
  if (!reader || bson_json_reader_read(reader, &def, &berr) != 1)
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "not a JSON object: %s", berr.message[0] ? berr.message : "empty file");
  else
    ok = obx_pipeline_store_apply(client, db, NULL, &def, dry_run, &action, NULL, err);
  if (reader) bson_json_reader_destroy(reader);
  if (!ok) obx_err_prefix(err, "%s", path);
  if (report) {
    if (ok)
      fprintf(report, "%-9s %s%s\n", action, path, dry_run ? " (dry run)" : "");
    else
      fprintf(report, "%-9s %s\n", "invalid", err ? err->msg : path);
  }
  bson_destroy(&def);
  return ok;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

bool obx_pipeline_store_apply_path(mongoc_client_t *client, const char *db, const char *path, bool dry_run,
                                   FILE *report, obx_err_t *err) {
  DIR *dir = opendir(path);
  if (!dir) return apply_file(client, db, path, dry_run, report, err);
  char **names = NULL;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(dir))) {
    size_t len = strlen(de->d_name);
    if (len > 5 && strcmp(de->d_name + len - 5, ".json") == 0) {
      names = bson_realloc(names, (size_t)(n + 1) * sizeof *names);
      names[n++] = bson_strdup_printf("%s/%s", path, de->d_name);
    }
  }
  closedir(dir);
  if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_names);
  bool ok = true;
  for (int i = 0; i < n; i++) {
    obx_err_t ferr = OBX_ERR_INIT;
    if (!apply_file(client, db, names[i], dry_run, report, &ferr) && ok) {
      ok = false;
      if (err) *err = ferr;
    }
    bson_free(names[i]);
  }
  bson_free(names);
  return ok;
}
