/* obx_err.h - error values shared by every module
 *
 * DESIGN: an obx_err_t lives on the caller's stack; fallible functions return bool and take
 * `obx_err_t *err` as their last argument (NULL allowed: the error is then dropped). Errors
 * from the client libraries are wrapped at the boundary: the original code is kept in `code`
 * and our classification is added in `retriable` (true: the retry ladder or a later attempt
 * may succeed; false: terminal, goes to FAILED/DLQ at once). Bugs are not errors: they
 * assert and abort. */
#ifndef OBX_ERR_H
#define OBX_ERR_H

#include <stdbool.h>
#include <stdarg.h>

typedef enum {
  OBX_ERR_NONE = 0,
  OBX_ERR_SYS,      /* errno values */
  OBX_ERR_CONF,     /* configuration: bad key, value, range */
  OBX_ERR_INPUT,    /* bad input from a user or a peer: validation, malformed events */
  OBX_ERR_MONGO,    /* bson_error_t: code = server or driver code, see mongo_domain */
  OBX_ERR_KAFKA,    /* rd_kafka_resp_err_t */
  OBX_ERR_AMQP,     /* amqp_status_enum or AMQP reply code (channel/connection close) */
  OBX_ERR_CURL,     /* CURLcode, or an HTTP status >= 400 with code = status */
  OBX_ERR_PIPELINE, /* pipeline definition or template errors */
  OBX_ERR_NOT_FOUND,
  OBX_ERR_CONFLICT, /* duplicates, idempotency mismatches, state conflicts */
} obx_err_domain_t;

typedef struct {
  int domain;      /* obx_err_domain_t */
  int code;        /* the original library/server code, 0 when none */
  bool retriable;  /* transient: retry later; false: terminal */
  char msg[256];
} obx_err_t;

#define OBX_ERR_INIT {0, 0, false, {0}}

/* Sets every field; msg is printf-formatted and truncated to fit. err may be NULL. */
void obx_err_set(obx_err_t *err, int domain, int code, bool retriable, const char *fmt, ...)
  __attribute__((format(printf, 5, 6)));
void obx_err_vset(obx_err_t *err, int domain, int code, bool retriable, const char *fmt, va_list ap);
/* Prepends "context: " to err->msg (for adding where an error happened). */
void obx_err_prefix(obx_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void obx_err_clear(obx_err_t *err);
const char *obx_err_domain_name(int domain);

/* Wrappers at the library boundaries. Each keeps the original code and decides `retriable`.
 * The bson/mongoc wrapper takes the optional server reply to read errorLabels
 * (TransientTransactionError, RetryableWriteError, ResumableChangeStreamError). */
struct _bson_error_t;
struct _bson_t;
void obx_err_from_bson(obx_err_t *err, const struct _bson_error_t *berr, const struct _bson_t *reply);
/* True for a MongoDB duplicate key error (code 11000) wrapped by obx_err_from_bson. */
bool obx_err_is_duplicate_key(const obx_err_t *err);
void obx_err_from_kafka(obx_err_t *err, int rd_kafka_resp_err, const char *what);
void obx_err_from_curl(obx_err_t *err, int curlcode, const char *errbuf);
void obx_err_from_http_status(obx_err_t *err, long status, const char *url);
/* amqp_rpc_reply_t is passed by pointer to keep this header free of amqp.h */
struct amqp_rpc_reply_t_;
void obx_err_from_amqp(obx_err_t *err, const struct amqp_rpc_reply_t_ *reply, const char *what);
void obx_err_from_amqp_status(obx_err_t *err, int amqp_status, const char *what);

#endif
