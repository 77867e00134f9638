/* orders_direct.c - the POST /orders transaction issued directly through libmongoc
 *
 * usage: orders_direct MONGO_URI SECONDS THREADS
 *
 * The baseline of scripts/bench/orders.sh: THREADS threads each run, for SECONDS, the same
 * transaction the api role runs per order (insert the order document, insert its
 * OrderConfirmed outbox document; majority write concern; mongoc_client_session_with_transaction)
 * with no HTTP, no validation, no auth. Prints one line:
 *   orders_per_s=<n> p50_ms=<x> p99_ms=<y> failed=<n>
 *
 * DESIGN: libmongoc only (a client pool, one session per transaction, as the api role does);
 * the documents have the shape of the api's (order with Decimal128 totals, fat event). */
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SAMPLES 500000

typedef struct {
  mongoc_client_pool_t *pool;
  double deadline;
  double *lat_ms;
  long n, failed;
  unsigned seed;
} worker_t;

typedef struct {
  const bson_t *order, *event;
} txn_docs_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool txn_cb(mongoc_client_session_t *session, void *ctx, bson_t **reply, bson_error_t *error) {
  txn_docs_t *docs = ctx;
  mongoc_client_t *client = mongoc_client_session_get_client(session);
  mongoc_collection_t *orders = mongoc_client_get_collection(client, "outboxd", "orders");
  mongoc_collection_t *outbox = mongoc_client_get_collection(client, "outboxd", "outbox");
  bson_t opts = BSON_INITIALIZER, r;
  bool ok = mongoc_client_session_append(session, &opts, error) &&
            mongoc_collection_insert_one(orders, docs->order, &opts, &r, error);
  if (ok) {
    bson_destroy(&r);
    ok = mongoc_collection_insert_one(outbox, docs->event, &opts, &r, error);
  }
  if (!ok) *reply = bson_copy(&r);
  bson_destroy(&r);
  bson_destroy(&opts);
  mongoc_collection_destroy(outbox);
  mongoc_collection_destroy(orders);
  return ok;
}

static void make_docs(worker_t *w, long i, bson_t *order, bson_t *event) {
  char id[64], eid[64], number[64];
  bson_decimal128_t total;
  bson_t payload, ids;
  int64_t now = (int64_t)time(NULL) * 1000;
  snprintf(id, sizeof id, "order-%u-%ld", w->seed, i);
  snprintf(eid, sizeof eid, "event-%u-%ld", w->seed, i);
  snprintf(number, sizeof number, "BENCH-%u-%ld", w->seed, i);
  bson_decimal128_from_string("149.90", &total);
  BSON_APPEND_UTF8(order, "_id", id);
  BSON_APPEND_UTF8(order, "orgId", "bench");
  BSON_APPEND_UTF8(order, "orderNumber", number);
  BSON_APPEND_UTF8(order, "status", "CONFIRMED");
  BSON_APPEND_UTF8(order, "customerEmail", "customer@company.com");
  BSON_APPEND_UTF8(order, "currency", "BRL");
  BSON_APPEND_DECIMAL128(order, "totalAmount", &total);
  BSON_APPEND_DATE_TIME(order, "createdAt", now);
  BSON_APPEND_ARRAY_BEGIN(order, "eventIds", &ids);
  BSON_APPEND_UTF8(&ids, "0", eid);
  bson_append_array_end(order, &ids);
  BSON_APPEND_UTF8(event, "_id", eid);
  BSON_APPEND_UTF8(event, "eventType", "OrderConfirmed");
  BSON_APPEND_INT32(event, "eventVersion", 1);
  BSON_APPEND_UTF8(event, "orgId", "bench");
  BSON_APPEND_UTF8(event, "aggregateType", "Order");
  BSON_APPEND_UTF8(event, "aggregateId", id);
  BSON_APPEND_UTF8(event, "partitionKey", id);
  BSON_APPEND_UTF8(event, "correlationId", id);
  BSON_APPEND_NULL(event, "causationId");
  BSON_APPEND_DOCUMENT_BEGIN(event, "payload", &payload);
  BSON_APPEND_UTF8(&payload, "orderId", id);
  BSON_APPEND_UTF8(&payload, "orderNumber", number);
  BSON_APPEND_UTF8(&payload, "customerEmail", "customer@company.com");
  BSON_APPEND_UTF8(&payload, "currency", "BRL");
  BSON_APPEND_UTF8(&payload, "totalAmount", "149.90");
  bson_append_document_end(event, &payload);
  BSON_APPEND_DATE_TIME(event, "occurredAt", now);
  BSON_APPEND_UTF8(event, "status", "PENDING");
  BSON_APPEND_INT32(event, "attempts", 0);
  BSON_APPEND_DATE_TIME(event, "availableAt", now);
  BSON_APPEND_NULL(event, "lastError");
}

static void *run(void *arg) {
  worker_t *w = arg;
  mongoc_write_concern_t *wc = mongoc_write_concern_new();
  mongoc_write_concern_set_w(wc, MONGOC_WRITE_CONCERN_W_MAJORITY);
  mongoc_transaction_opt_t *topts = mongoc_transaction_opts_new();
  mongoc_transaction_opts_set_write_concern(topts, wc);
  for (long i = 0; now_s() < w->deadline && w->n < MAX_SAMPLES; i++) {
    bson_t order = BSON_INITIALIZER, event = BSON_INITIALIZER, reply;
    bson_error_t error;
    make_docs(w, i, &order, &event);
    txn_docs_t docs = {&order, &event};
    double t0 = now_s();
    mongoc_client_t *client = mongoc_client_pool_pop(w->pool);
    mongoc_client_session_t *session = mongoc_client_start_session(client, NULL, &error);
    bool ok = session && mongoc_client_session_with_transaction(session, txn_cb, topts, &docs, &reply, &error);
    if (session) bson_destroy(&reply);
    mongoc_client_session_destroy(session);
    mongoc_client_pool_push(w->pool, client);
    if (ok) w->lat_ms[w->n++] = (now_s() - t0) * 1000;
    else if (w->failed++ == 0) fprintf(stderr, "orders_direct: %s\n", error.message);
    bson_destroy(&event);
    bson_destroy(&order);
  }
  mongoc_transaction_opts_destroy(topts);
  mongoc_write_concern_destroy(wc);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: orders_direct MONGO_URI SECONDS THREADS\n");
    return 2;
  }
  double seconds = atof(argv[2]);
  int nthreads = atoi(argv[3]);
  if (seconds <= 0 || nthreads <= 0) {
    fprintf(stderr, "orders_direct: SECONDS and THREADS must be positive\n");
    return 2;
  }
  mongoc_init();
  bson_error_t error;
  mongoc_uri_t *uri = mongoc_uri_new_with_error(argv[1], &error);
  if (!uri) {
    fprintf(stderr, "orders_direct: %s\n", error.message);
    return 2;
  }
  mongoc_client_pool_t *pool = mongoc_client_pool_new(uri);
  mongoc_client_pool_set_error_api(pool, MONGOC_ERROR_API_VERSION_2);
  worker_t *workers = calloc((size_t)nthreads, sizeof *workers);
  pthread_t *threads = calloc((size_t)nthreads, sizeof *threads);
  double start = now_s();
  for (int i = 0; i < nthreads; i++) {
    workers[i] = (worker_t){pool, start + seconds, malloc(sizeof(double) * MAX_SAMPLES), 0, 0,
                            (unsigned)(time(NULL) ^ (i * 7919u))};
    pthread_create(&threads[i], NULL, run, &workers[i]);
  }
  long total = 0, failed = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(threads[i], NULL);
    total += workers[i].n;
    failed += workers[i].failed;
  }
  double elapsed = now_s() - start;
  double *all = malloc(sizeof(double) * (size_t)(total ? total : 1));
  long k = 0;
  for (int i = 0; i < nthreads; i++) {
    memcpy(all + k, workers[i].lat_ms, sizeof(double) * (size_t)workers[i].n);
    k += workers[i].n;
    free(workers[i].lat_ms);
  }
  qsort(all, (size_t)total, sizeof *all, cmp_double);
  printf("orders_per_s=%.1f p50_ms=%.2f p99_ms=%.2f failed=%ld\n", total / elapsed,
         total ? all[total / 2] : 0.0, total ? all[(long)(total * 0.99)] : 0.0, failed);
  free(all);
  free(threads);
  free(workers);
  mongoc_client_pool_destroy(pool);
  mongoc_uri_destroy(uri);
  mongoc_cleanup();
  return failed && !total ? 1 : 0;
}
