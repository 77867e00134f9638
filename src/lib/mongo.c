/* mongo.c - the MongoDB client pool, transactions and readiness ping
 *
 * DESIGN: a thin layer over mongoc_client_pool_t (see obx_mongo.h). mongoc_init runs once per
 * process (pthread_once); driver logs go through obx_log_route_mongoc. The pool connects
 * lazily, so obx_mongo_new succeeds while MongoDB is down. Transactions are counted in the
 * process-wide metrics registry. Reads mongo.uri and mongo.db. */
#include "obx/obx_mongo.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_log.h"
#include "obx/obx_metrics.h"

#define OBX_MONGO_SELECTION_TIMEOUT_MS 5000

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
#define OBX_MONGO_PROBE_CONNECT_TIMEOUT_MS 2000

struct obx_mongo {
  mongoc_client_pool_t *pool;
  mongoc_client_t *probe;     /* single-threaded client for obx_mongo_ping, under probe_mu */
  pthread_mutex_t probe_mu;
  char *db;
  int64_t commit_timeout_ms, wtimeout_ms; /* mongo.commit_timeout, mongo.wtimeout */
  obx_counter_t *txns, *txn_reruns; /* process-wide, registered in obx_mongo_new */
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void mongo_global_init(void) {
  mongoc_init();
  obx_log_route_mongoc();
}

obx_mongo_t *obx_mongo_new(const obx_conf_t *conf, obx_err_t *err) {
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
  mongo = calloc(1, sizeof *mongo);
  mongo->pool = mongoc_client_pool_new(uri);
  if (!mongo->pool) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "mongo.uri: the driver refused the connection string");
    free(mongo);
    mongo = NULL;
    goto done;
  }
  mongoc_client_pool_set_error_api(mongo->pool, MONGOC_ERROR_API_VERSION_2);
  /* The probe tries each server once (single-threaded clients do) so /readyz answers within
   * the connect timeout instead of waiting for server selection. */
  if (!mongoc_uri_has_option(uri, MONGOC_URI_CONNECTTIMEOUTMS))
    mongoc_uri_set_option_as_int32(uri, MONGOC_URI_CONNECTTIMEOUTMS, OBX_MONGO_PROBE_CONNECT_TIMEOUT_MS);
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
  const bson_t *doc, *reply = NULL;
  *found = false;
  if (ok && mongoc_cursor_next(cursor, &doc)) {
    bson_concat(out, doc);
    *found = true;
  }
  if (cursor && mongoc_cursor_error_document(cursor, &berr, &reply)) ok = false;
  if (!ok) obx_err_from_bson(err, &berr, reply);
  mongoc_cursor_destroy(cursor);
  bson_destroy(&opts);
  return ok;
}

const char *obx_mongo_doc_str(const bson_t *doc, const char *path) {
  bson_iter_t it, v;
  if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, path, &v) || !BSON_ITER_HOLDS_UTF8(&v)) return NULL;
  return bson_iter_utf8(&v, NULL);
}

typedef struct {
  obx_mongo_txn_fn_t fn;
  void *ctx;
  int runs;
  bool fn_failed;  /* the last run of fn returned false */
  obx_err_t err;   /* fn's error from that run */
} mongo_txn_t;

/* Adapts fn to the driver's callback: our error travels in txn->err; the driver gets its
 * message and, for a retriable MongoDB error, a reply labelled TransientTransactionError so
 * that it runs the callback again. */
static bool mongo_txn_cb(mongoc_client_session_t *session, void *vtxn, bson_t **reply, bson_error_t *error) {
  mongo_txn_t *txn = vtxn;
  txn->runs++;
  obx_err_clear(&txn->err);
  txn->fn_failed = !txn->fn(session, txn->ctx, &txn->err);
  if (!txn->fn_failed) return true;
  bson_set_error(error, MONGOC_ERROR_TRANSACTION, (uint32_t)txn->err.code, "%s", txn->err.msg);
  if (txn->err.domain == OBX_ERR_MONGO && txn->err.retriable) {
    bson_t labels;
    *reply = bson_new();
    BSON_APPEND_ARRAY_BEGIN(*reply, "errorLabels", &labels);
    BSON_APPEND_UTF8(&labels, "0", "TransientTransactionError");
    bson_append_array_end(*reply, &labels);
  }
  return false;
}

bool obx_mongo_transaction(obx_mongo_t *mongo, obx_mongo_txn_fn_t fn, void *ctx, obx_err_t *err) {
  mongo_txn_t txn = {.fn = fn, .ctx = ctx};
  obx_err_t failure = OBX_ERR_INIT; /* classified for the metric even when err is NULL */
  bson_error_t berr;
  bson_t reply;
  bool ok = false;
  mongoc_client_t *client = obx_mongo_pop(mongo);
  mongoc_write_concern_t *wc = mongoc_write_concern_new();
  mongoc_write_concern_set_w(wc, MONGOC_WRITE_CONCERN_W_MAJORITY);
  mongoc_write_concern_set_wtimeout_int64(wc, mongo->wtimeout_ms);
  mongoc_transaction_opt_t *topts = mongoc_transaction_opts_new();
  mongoc_transaction_opts_set_write_concern(topts, wc);
  mongoc_transaction_opts_set_max_commit_time_ms(topts, mongo->commit_timeout_ms);
  mongoc_client_session_t *session = mongoc_client_start_session(client, NULL, &berr);
  if (!session) {
    obx_err_from_bson(&failure, &berr, NULL);
    bson_init(&reply);
    goto done;
  }
  ok = mongoc_client_session_with_transaction(session, mongo_txn_cb, topts, &txn, &reply, &berr);
  if (!ok) {
    if (txn.fn_failed) {
      failure = txn.err;
    } else {
      obx_err_from_bson(&failure, &berr, &reply);
    }
    obx_err_prefix(&failure, "transaction");
  }
done:
  obx_counter_inc(mongo->txns, ok ? "committed" : obx_err_is_duplicate_key(&failure) ? "conflict" : "failed");
  if (!ok && err) *err = failure;
  if (txn.runs > 1) obx_counter_add(mongo->txn_reruns, txn.runs - 1);
  bson_destroy(&reply);
  mongoc_client_session_destroy(session);
  mongoc_transaction_opts_destroy(topts);
  mongoc_write_concern_destroy(wc);
  obx_mongo_push(mongo, client);
  return ok;
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
