/* obx_mongo.h - the MongoDB client pool, transactions and readiness ping
 *
 * DESIGN: one obx_mongo_t per role (or per process) wraps a mongoc_client_pool_t built from
 * MONGO_URI (appname "outboxd", driver logs routed into ours, serverSelectionTimeoutMS 5000
 * unless the URI sets it). Creating it never touches the network: a role starts while MongoDB
 * is down and its first operation fails with a retriable error instead. Threads borrow a
 * client with obx_mongo_pop and give it back with obx_mongo_push.
 *
 * Transactions go through obx_mongo_transaction, a wrapper over
 * mongoc_client_session_with_transaction with majority write concern: the driver retries the
 * whole callback on TransientTransactionError and the commit on
 * UnknownTransactionCommitResult (for up to 120 s); the wrapper counts transactions in
 * /metrics: outboxd_mongo_transactions_total{result="committed"|"conflict"|"failed"} (conflict:
 * the transaction failed on a duplicate key, the expected loser of a race on a unique index) and
 * outboxd_mongo_transaction_retries_total (extra runs of the body). Thread-safe. */
#ifndef OBX_MONGO_H
#define OBX_MONGO_H

#include <stdbool.h>
#include <stdint.h>
#include <mongoc/mongoc.h>
#include "obx_conf.h"
#include "obx_err.h"

typedef struct obx_mongo obx_mongo_t;

/* Builds the pool from conf->mongo_uri / conf->mongo_db (copied). Fails only on a malformed
 * URI (OBX_ERR_CONF). Returns owned; free with obx_mongo_destroy (NULL is a no-op) after every
 * popped client was pushed back. */
/* libmongoc initialises itself before main (its automatic init) and warns "Falling back to
 * malloc for counters" on stderr when the shared-memory segment /dev/shm/mongoc-<pid> is left
 * over by a killed process of the same pid, even for --help. OBX_MONGO_PREINIT, written once
 * at file scope in a program's main file, runs obx_mongo_preinit from the executable's
 * .preinit_array, before any library initialiser: it removes /dev/shm/mongoc-<own pid>, which
 * no live process can own, so the driver creates its segment afresh, quietly. */
void obx_mongo_preinit(int argc, char **argv, char **envp);
#define OBX_MONGO_PREINIT                                                                         \
  __attribute__((section(".preinit_array"), used)) static void (*const obx_mongo_preinit_entry)( \
    int, char **, char **) = obx_mongo_preinit

obx_mongo_t *obx_mongo_new(const obx_conf_t *conf, obx_err_t *err);
void obx_mongo_destroy(obx_mongo_t *mongo);

/* Borrows a client (blocks while all are in use); give it back with obx_mongo_push. A client
 * is used by one thread at a time. */
mongoc_client_t *obx_mongo_pop(obx_mongo_t *mongo);
void obx_mongo_push(obx_mongo_t *mongo, mongoc_client_t *client);

/* The database name (MONGO_DB); borrowed for the life of mongo. */
const char *obx_mongo_db_name(const obx_mongo_t *mongo);
/* A collection of MONGO_DB on `client`; owned by the caller (mongoc_collection_destroy),
 * valid while the client is popped. */
mongoc_collection_t *obx_mongo_collection(obx_mongo_t *mongo, mongoc_client_t *client, const char *name);

/* Reads the first document of `collection` matching filter (in sort order when sort is not
 * NULL; in session's transaction when session is not NULL) and appends it to out (initialised
 * by the caller); *found false when none matches. MongoDB errors are wrapped with
 * obx_err_from_bson. */
bool obx_mongo_find_one(mongoc_collection_t *collection, const bson_t *filter, const bson_t *sort,
                        mongoc_client_session_t *session, bson_t *out, bool *found, obx_err_t *err);

/* The string at a dotted path of doc ("_id.eventId"); NULL when absent or not a string.
 * Borrowed from doc. */
const char *obx_mongo_doc_str(const bson_t *doc, const char *path);

/* The body of a transaction. It runs the transaction's operations with `session` (pass it in
 * the operation opts with mongoc_client_session_append) and returns true to commit. On
 * failure it sets err, wrapping MongoDB errors with obx_err_from_bson: a retriable MongoDB
 * error (inside a transaction that is the TransientTransactionError case: write conflicts,
 * network errors, elections) makes the driver run fn again from the start; any other error
 * aborts. fn may run several times: it must not keep side effects outside the transaction
 * between runs. */
typedef bool (*obx_mongo_txn_fn_t)(mongoc_client_session_t *session, void *ctx, obx_err_t *err);

/* Runs fn in a transaction on a client popped from the pool (majority write concern with
 * wtimeout mongo.wtimeout, maxCommitTimeMS mongo.commit_timeout).
 * On failure err carries fn's own error when fn failed last (e.g. a duplicate key), otherwise
 * the driver's (commit failure, timeout, network), wrapped with obx_err_from_bson. */
bool obx_mongo_transaction(obx_mongo_t *mongo, obx_mongo_txn_fn_t fn, void *ctx, obx_err_t *err);

/* Appends writeConcern {w: "majority", wtimeout: mongo.wtimeout} to an operation's opts. */
void obx_mongo_append_majority(const obx_mongo_t *mongo, bson_t *opts);

/* Sends {ping: 1} to the deployment through a dedicated single-threaded client that tries
 * each server once (connectTimeoutMS 2000 unless the URI sets it), so it answers within
 * seconds; false (retriable) with the reason when unreachable. Serialised by a mutex. */
bool obx_mongo_ping(obx_mongo_t *mongo, obx_err_t *err);

#endif
