/* mongo.c - the MongoDB client pool, transactions, readiness ping and cursor endings
 *
 * DESIGN: a thin layer over mongoc_client_pool_t (see obx_mongo.h). mongoc_init runs once per
 * process (pthread_once); driver logs go through obx_log_route_mongoc. The pool connects
 * lazily, so obx_mongo_new succeeds while MongoDB is down. Transactions are counted in the
 * process-wide metrics registry.
 *
 * Transactions run our own loop rather than mongoc_client_session_with_transaction, whose
 * retries of the body and of an unknown commit result last up to 120 s whatever the caller's
 * deadline (a request abandoned by its client was committed a minute later). The loop takes a
 * deadline: the body runs again after a transient error and the commit is retried after an
 * unknown result only while the deadline is ahead; the commit is never sent once it has
 * passed (the transaction is aborted instead) and carries maxCommitTimeMS = mongo.commit_timeout
 * or the time left, whichever is less. Reads mongo.uri, mongo.db, mongo.commit_timeout,
 * mongo.wtimeout and, for request pools, api.request_timeout. */
#include "obx/obx_mongo.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obx/obx_event.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"

#define OBX_MONGO_SELECTION_TIMEOUT_MS 5000
#define OBX_MONGO_TXN_LIMIT_MS 120000 /* the deadline of transactions off request paths */
/* The readiness probe gives up within this, so /readyz answers within a second whatever
 * MongoDB does (a paused server accepts connections and never answers). */
#define OBX_MONGO_PROBE_TIMEOUT_MS 350 /* a ping and, after a dead connection, one handshake */
#define OBX_MONGO_MAX_TIME_EXPIRED 50

void obx_mongo_preinit(int argc, char **argv, char **envp) {
  (void)argc;
  (void)argv;
  (void)envp;
  /* before libc's own initialisation: no stdio, only system calls */
  char path[32] = "/dev/shm/mongoc-", digits[16];
  int n = 0;
  for (unsigned pid = (unsigned)getpid(); pid || !n; pid /= 10) digits[n++] = (char)('0' + pid % 10);
  size_t len = strlen(path);
  while (n) path[len++] = digits[--n];
  path[len] = '\0';
  unlink(path);
}

struct obx_mongo {
  mongoc_client_pool_t *pool;
  mongoc_client_t *probe;     /* single-threaded client for obx_mongo_ping, under probe_mu */
  pthread_mutex_t probe_mu;
  char *db;
  int64_t commit_timeout_ms, wtimeout_ms; /* mongo.commit_timeout, mongo.wtimeout */
  int64_t request_ms;         /* the request deadline of a request pool; 0: none */
  obx_counter_t *txns, *txn_reruns; /* process-wide, registered in obx_mongo_new */
};

/* Sets a timeout option of uri to at most max_ms (a smaller value in the URI stays). */
static void uri_cap(mongoc_uri_t *uri, const char *option, int64_t max_ms, int32_t fallback_ms) {
  int32_t have = mongoc_uri_get_option_as_int32(uri, option, fallback_ms);
  if (have <= 0 || have > max_ms) have = (int32_t)max_ms;
  mongoc_uri_set_option_as_int32(uri, option, have);
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void mongo_global_init(void) {
  mongoc_init();
  obx_log_route_mongoc();
}

obx_mongo_t *obx_mongo_new(const obx_conf_t *conf, obx_err_t *err) { return obx_mongo_new_for_requests(conf, 0, err); }

obx_mongo_t *obx_mongo_new_for_requests(const obx_conf_t *conf, int64_t request_ms, obx_err_t *err) {
  pthread_once(&init_once, mongo_global_init);
  obx_mongo_t *mongo = NULL;
  bson_error_t berr;
  mongoc_uri_t *uri = mongoc_uri_new_with_error(conf->mongo_uri, &berr);
  if (!uri) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "mongo.uri: %s", berr.message);
    goto done;
  }
  if (!mongoc_uri_has_option(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS))
    mongoc_uri_set_option_as_int32(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, OBX_MONGO_SELECTION_TIMEOUT_MS);
  if (!mongoc_uri_has_option(uri, MONGOC_URI_APPNAME)) mongoc_uri_set_appname(uri, "outboxd");
  if (request_ms > 0) {
    /* Half the deadline per step: a socket timeout is followed by one more server selection
     * (the driver's retried read, or the abort of the transaction), and both fit. */
    int64_t step_ms = request_ms / 2 > 50 ? request_ms / 2 : 50;
    uri_cap(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, step_ms, OBX_MONGO_SELECTION_TIMEOUT_MS);
    uri_cap(uri, MONGOC_URI_SOCKETTIMEOUTMS, step_ms, 0);
    uri_cap(uri, MONGOC_URI_CONNECTTIMEOUTMS, step_ms, 10000);
  }
  mongo = calloc(1, sizeof *mongo);
  mongo->request_ms = request_ms;
  mongo->pool = mongoc_client_pool_new(uri);
  if (!mongo->pool) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "mongo.uri: the driver refused the connection string");
    free(mongo);
    mongo = NULL;
    goto done;
  }
  mongoc_client_pool_set_error_api(mongo->pool, MONGOC_ERROR_API_VERSION_2);
  /* The probe tries each server once (single-threaded clients do) and gives up on a silent
   * connection within OBX_MONGO_PROBE_TIMEOUT_MS (connect, handshake and the ping itself). */
  uri_cap(uri, MONGOC_URI_CONNECTTIMEOUTMS, OBX_MONGO_PROBE_TIMEOUT_MS, 10000);
  uri_cap(uri, MONGOC_URI_SOCKETTIMEOUTMS, OBX_MONGO_PROBE_TIMEOUT_MS, 0);
  uri_cap(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, OBX_MONGO_PROBE_TIMEOUT_MS, OBX_MONGO_SELECTION_TIMEOUT_MS);
  mongo->probe = mongoc_client_new_from_uri(uri);
  mongoc_client_set_error_api(mongo->probe, MONGOC_ERROR_API_VERSION_2);
  pthread_mutex_init(&mongo->probe_mu, NULL);
  mongo->db = strdup(conf->mongo_db);
  mongo->commit_timeout_ms = conf->mongo_commit_timeout;
  mongo->wtimeout_ms = conf->mongo_wtimeout;
  mongo->txns = obx_metrics_counter("outboxd_mongo_transactions_total",
                                    "MongoDB transactions by outcome (committed; conflict: a duplicate key, the expected "
                                    "loss of a race on a unique index; failed: any other error)",
                                    "result");
  mongo->txn_reruns = obx_metrics_counter("outboxd_mongo_transaction_retries_total",
                                          "Transaction bodies run again after a transient error", NULL);
done:
  mongoc_uri_destroy(uri);
  return mongo;
}

void obx_mongo_destroy(obx_mongo_t *mongo) {
  if (!mongo) return;
  mongoc_client_destroy(mongo->probe);
  pthread_mutex_destroy(&mongo->probe_mu);
  mongoc_client_pool_destroy(mongo->pool);
  free(mongo->db);
  free(mongo);
}

mongoc_client_t *obx_mongo_pop(obx_mongo_t *mongo) { return mongoc_client_pool_pop(mongo->pool); }

void obx_mongo_push(obx_mongo_t *mongo, mongoc_client_t *client) {
  if (client) mongoc_client_pool_push(mongo->pool, client);
}

const char *obx_mongo_db_name(const obx_mongo_t *mongo) { return mongo->db; }

mongoc_collection_t *obx_mongo_collection(obx_mongo_t *mongo, mongoc_client_t *client, const char *name) {
  return mongoc_client_get_collection(client, mongo->db, name);
}

bool obx_mongo_find_one(mongoc_collection_t *collection, const bson_t *filter, const bson_t *sort,
                        mongoc_client_session_t *session, bson_t *out, bool *found, obx_err_t *err) {
  bson_t opts = BSON_INITIALIZER;
  bson_error_t berr;
  BSON_APPEND_INT64(&opts, "limit", 1);
  if (sort) BSON_APPEND_DOCUMENT(&opts, "sort", sort);
  bool ok = !session || mongoc_client_session_append(session, &opts, &berr);
  mongoc_cursor_t *cursor = ok ? mongoc_collection_find_with_opts(collection, filter, &opts, NULL) : NULL;
  const bson_t *doc;
  *found = false;
  if (ok && mongoc_cursor_next(cursor, &doc)) {
    bson_concat(out, doc);
    *found = true;
  }
  if (!ok) obx_err_from_bson(err, &berr, NULL);
  ok = obx_mongo_cursor_end(cursor, err) && ok;
  bson_destroy(&opts);
  return ok;
}

bool obx_mongo_cursor_end(mongoc_cursor_t *cursor, obx_err_t *err) {
  if (!cursor) return true;
  bson_error_t berr;
  const bson_t *reply = NULL;
  bool ok = !mongoc_cursor_error_document(cursor, &berr, &reply);
  if (!ok) obx_err_from_bson(err, &berr, reply); /* reply is the cursor's: read before it goes */
  mongoc_cursor_destroy(cursor);
  return ok;
}

const char *obx_mongo_doc_str(const bson_t *doc, const char *path) {
  bson_iter_t it, v;
  if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, path, &v) || !BSON_ITER_HOLDS_UTF8(&v)) return NULL;
  return bson_iter_utf8(&v, NULL);
}

int64_t obx_mongo_deadline(const obx_mongo_t *mongo) {
  return obx_time_mono_ms() + (mongo->request_ms ? mongo->request_ms : OBX_MONGO_TXN_LIMIT_MS);
}

void obx_mongo_append_max_time(bson_t *opts, int64_t deadline_ms) {
  int64_t left = deadline_ms - obx_time_mono_ms();
  BSON_APPEND_INT64(opts, "maxTimeMS", left > 1 ? left : 1);
}

/* The deadline passed: the transaction is abandoned, never committed (retriable: 503). */
static void txn_past_deadline(obx_err_t *err, const obx_mongo_t *mongo, const char *when) {
  obx_err_set(err, OBX_ERR_MONGO, OBX_MONGO_MAX_TIME_EXPIRED, true,
              "abandoned %s: past its deadline (%lld ms)%s", when,
              (long long)(mongo->request_ms ? mongo->request_ms : OBX_MONGO_TXN_LIMIT_MS),
              mongo->request_ms ? ", api.request_timeout" : "");
}

bool obx_mongo_transaction_by(obx_mongo_t *mongo, int64_t deadline_ms, obx_mongo_txn_fn_t fn, void *ctx,
                              obx_err_t *err) {
  obx_err_t failure = OBX_ERR_INIT; /* classified for the metric even when err is NULL */
  bson_error_t berr;
  bool ok = false;
  int runs = 0;
  mongoc_client_t *client = obx_mongo_pop(mongo);
  mongoc_write_concern_t *wc = mongoc_write_concern_new();
  mongoc_write_concern_set_w(wc, MONGOC_WRITE_CONCERN_W_MAJORITY);
  mongoc_write_concern_set_wtimeout_int64(wc, mongo->wtimeout_ms);
  mongoc_transaction_opt_t *topts = mongoc_transaction_opts_new();
  mongoc_transaction_opts_set_write_concern(topts, wc);
  mongoc_client_session_t *session = mongoc_client_start_session(client, NULL, &berr);
  if (!session) {
    obx_err_from_bson(&failure, &berr, NULL);
    goto done;
  }
  for (bool again = true; again;) {
    again = false;
    if (obx_time_mono_ms() >= deadline_ms) {
      if (runs == 0) txn_past_deadline(&failure, mongo, "before it started");
      break; /* failure holds the last run's error */
    }
    runs++;
    /* maxCommitTimeMS: mongo.commit_timeout, or the time left when that is less */
    int64_t left = deadline_ms - obx_time_mono_ms();
    mongoc_transaction_opts_set_max_commit_time_ms(topts, left < mongo->commit_timeout_ms ? left : mongo->commit_timeout_ms);
    if (!mongoc_client_session_start_transaction(session, topts, &berr)) {
      obx_err_from_bson(&failure, &berr, NULL);
      break;
    }
    obx_err_clear(&failure);
    if (!fn(session, ctx, &failure)) {
      mongoc_client_session_abort_transaction(session, NULL);
      /* a retriable MongoDB error inside a transaction is the TransientTransactionError case */
      again = failure.domain == OBX_ERR_MONGO && failure.retriable;
      continue;
    }
    for (;;) { /* commit */
      if (obx_time_mono_ms() >= deadline_ms) {
        mongoc_client_session_abort_transaction(session, NULL);
        txn_past_deadline(&failure, mongo, "before its commit");
        break;
      }
      bson_t reply;
      ok = mongoc_client_session_commit_transaction(session, &reply, &berr);
      if (!ok) obx_err_from_bson(&failure, &berr, &reply);
      bool unknown = !ok && mongoc_error_has_label(&reply, "UnknownTransactionCommitResult") &&
                     berr.code != OBX_MONGO_MAX_TIME_EXPIRED;
      again = !ok && !unknown && mongoc_error_has_label(&reply, "TransientTransactionError");
      bson_destroy(&reply);
      if (ok || !unknown) break;
      if (obx_time_mono_ms() >= deadline_ms) { /* sent, outcome unknown: an Idempotency-Key makes the retry safe */
        obx_err_set(&failure, OBX_ERR_MONGO, OBX_MONGO_MAX_TIME_EXPIRED, true,
                    "commit outcome unknown at the deadline (retry with the same Idempotency-Key): %s", berr.message);
        break;
      }
    }
  }
done:
  if (!ok) obx_err_prefix(&failure, "transaction");
  obx_counter_inc(mongo->txns, ok ? "committed" : obx_err_is_duplicate_key(&failure) ? "conflict" : "failed");
  if (!ok && err) *err = failure;
  if (runs > 1) obx_counter_add(mongo->txn_reruns, runs - 1);
  mongoc_client_session_destroy(session);
  mongoc_transaction_opts_destroy(topts);
  mongoc_write_concern_destroy(wc);
  obx_mongo_push(mongo, client);
  return ok;
}

bool obx_mongo_transaction(obx_mongo_t *mongo, obx_mongo_txn_fn_t fn, void *ctx, obx_err_t *err) {
  return obx_mongo_transaction_by(mongo, obx_mongo_deadline(mongo), fn, ctx, err);
}

void obx_mongo_append_majority(const obx_mongo_t *mongo, bson_t *opts) {
  bson_t wc;
  BSON_APPEND_DOCUMENT_BEGIN(opts, "writeConcern", &wc);
  BSON_APPEND_UTF8(&wc, "w", "majority");
  BSON_APPEND_INT64(&wc, "wtimeout", mongo->wtimeout_ms);
  bson_append_document_end(opts, &wc);
}

bool obx_mongo_ping(obx_mongo_t *mongo, obx_err_t *err) {
  bson_t cmd = BSON_INITIALIZER, reply;
  bson_error_t berr;
  BSON_APPEND_INT32(&cmd, "ping", 1);
  pthread_mutex_lock(&mongo->probe_mu);
  bool ok = mongoc_client_command_simple(mongo->probe, "admin", &cmd, NULL, &reply, &berr);
  pthread_mutex_unlock(&mongo->probe_mu);
  if (!ok) {
    obx_err_from_bson(err, &berr, &reply);
    if (err) err->retriable = true;
    obx_err_prefix(err, "MongoDB unreachable");
  }
  bson_destroy(&reply);
  bson_destroy(&cmd);
  return ok;
}
