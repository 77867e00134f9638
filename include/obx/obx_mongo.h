/* obx_mongo.h - the MongoDB client pool, transactions, readiness ping and cursor endings
 *
 * DESIGN: one obx_mongo_t per role (or per process) wraps a mongoc_client_pool_t built from
 * MONGO_URI (appname "outboxd", driver logs routed into ours, serverSelectionTimeoutMS 5000
 * unless the URI sets it). Creating it never touches the network: a role starts while MongoDB
 * is down and its first operation fails with a retriable error instead. Threads borrow a
 * client with obx_mongo_pop and give it back with obx_mongo_push.
 *
 * A request pool (obx_mongo_new_for_requests, the API's) bounds every operation by the request
 * deadline API_REQUEST_TIMEOUT: serverSelectionTimeoutMS, socketTimeoutMS and connectTimeoutMS
 * at most half of it (a timed-out step is followed by at most one more server selection: the
 * driver's retried read or the transaction's abort), reads with maxTimeMS
 * (obx_mongo_append_max_time), commits with maxCommitTimeMS of at most the time left.
 *
 * Transactions go through obx_mongo_transaction(_by), majority write concern, with a deadline
 * (the request's on a request pool, else 120 s): the whole body runs again after a
 * TransientTransactionError and the commit after UnknownTransactionCommitResult only while
 * the deadline is ahead; once it has passed the transaction is aborted, never committed, and
 * the call fails retriable (503 on a request path). The one outcome left open is a commit
 * sent before the deadline whose answer never came: reported as unknown, which an
 * Idempotency-Key turns into a safe retry. The wrapper counts transactions in
 * /metrics: outboxd_mongo_transactions_total{result="committed"|"conflict"|"failed"} (conflict:
 * the transaction failed on a duplicate key, the expected loser of a race on a unique index) and
 * outboxd_mongo_transaction_retries_total (extra runs of the body). Every read through a cursor
 * ends in obx_mongo_cursor_end (its error, if any, wrapped once). Thread-safe. */
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
/* The same for a request path: every timeout of the pool at most half of request_ms (0: as
 * obx_mongo_new), and transactions whose default deadline is request_ms. */
obx_mongo_t *obx_mongo_new_for_requests(const obx_conf_t *conf, int64_t request_ms, obx_err_t *err);
void obx_mongo_destroy(obx_mongo_t *mongo);
/* The deadline (monotonic ms) of an operation that starts now: now + the request timeout of a
 * request pool, else now + 120 s. */
int64_t obx_mongo_deadline(const obx_mongo_t *mongo);
/* Appends maxTimeMS = the time left before deadline_ms (at least 1) to the opts of a read. */
void obx_mongo_append_max_time(bson_t *opts, int64_t deadline_ms);

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

/* Ends the reading of a cursor, after its mongoc_cursor_next loop: destroys it and returns false
 * when it failed, with err set by obx_err_from_bson from its error and the server's reply (whose
 * error labels make it retriable); err may be NULL (the error is dropped: the caller already
 * holds one). A NULL cursor is no read at all: true. */
bool obx_mongo_cursor_end(mongoc_cursor_t *cursor, obx_err_t *err);

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
 * wtimeout mongo.wtimeout, maxCommitTimeMS mongo.commit_timeout or the time left when less)
 * before deadline_ms (monotonic, see obx_mongo_deadline). On failure err carries fn's own
 * error when fn failed last (e.g. a duplicate key), otherwise the driver's (commit failure,
 * timeout, network), wrapped with obx_err_from_bson, or the deadline's (OBX_ERR_MONGO, code
 * 50, retriable: the transaction was abandoned). */
bool obx_mongo_transaction_by(obx_mongo_t *mongo, int64_t deadline_ms, obx_mongo_txn_fn_t fn, void *ctx,
                              obx_err_t *err);
/* obx_mongo_transaction_by with obx_mongo_deadline(mongo). */
bool obx_mongo_transaction(obx_mongo_t *mongo, obx_mongo_txn_fn_t fn, void *ctx, obx_err_t *err);

/* Appends writeConcern {w: "majority", wtimeout: mongo.wtimeout} to an operation's opts. */
void obx_mongo_append_majority(const obx_mongo_t *mongo, bson_t *opts);

/* Sends {ping: 1} to the deployment through a dedicated single-threaded client that tries
 * each server once with connect, socket and selection timeouts of at most 350 ms, so it
 * answers within a second even when MongoDB accepts connections and never answers (a paused
 * server); false (retriable) with the reason when unreachable. Serialised by a mutex. */
bool obx_mongo_ping(obx_mongo_t *mongo, obx_err_t *err);

#endif
