/* err.c - obx_err_t values and the wrappers for the client libraries' error codes
 *
 * DESIGN: every wrapper keeps the library's own code in err->code and decides `retriable`
 * from small tables below (one per library), so the classification can be read and tested
 * in one place. The message always carries the library's text, never credentials (the
 * libraries do not put them in error strings; URLs passed in are redacted). */
#include "obx/obx_err.h"
#include "obx/obx_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <curl/curl.h>
#include <librdkafka/rdkafka.h>
#include <mongoc/mongoc.h>

void obx_err_vset(obx_err_t *err, int domain, int code, bool retriable, const char *fmt, va_list ap) {
  if (!err) return;
  err->domain = domain;
  err->code = code;
  err->retriable = retriable;
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
}

void obx_err_set(obx_err_t *err, int domain, int code, bool retriable, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  obx_err_vset(err, domain, code, retriable, fmt, ap);
  va_end(ap);
}

void obx_err_prefix(obx_err_t *err, const char *fmt, ...) {
  if (!err) return;
  char buf[2 * sizeof err->msg + 2];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof err->msg, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  size_t len = strlen(buf);
  len += (size_t)snprintf(buf + len, sizeof buf - len, ": %s", err->msg);
  if (len >= sizeof err->msg) len = sizeof err->msg - 1;
  memcpy(err->msg, buf, len);
  err->msg[len] = '\0';
}

void obx_err_clear(obx_err_t *err) {
  if (!err) return;
  memset(err, 0, sizeof *err);
}

const char *obx_err_domain_name(int domain) {
  switch ((obx_err_domain_t)domain) {
  case OBX_ERR_NONE: return "none";
  case OBX_ERR_SYS: return "sys";
  case OBX_ERR_CONF: return "conf";
  case OBX_ERR_INPUT: return "input";
  case OBX_ERR_MONGO: return "mongo";
  case OBX_ERR_KAFKA: return "kafka";
  case OBX_ERR_AMQP: return "amqp";
  case OBX_ERR_CURL: return "curl";
  case OBX_ERR_PIPELINE: return "pipeline";
  case OBX_ERR_NOT_FOUND: return "not_found";
  case OBX_ERR_CONFLICT: return "conflict";
  }
  return "unknown";
}

static bool int_in(int v, const int *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (set[i] == v) return true;
  return false;
}
#define INT_IN(v, set) int_in((v), (set), sizeof(set) / sizeof((set)[0]))

/* ---- MongoDB ---------------------------------------------------------------------------- */

/* Server codes the retryable-writes and transactions specifications call transient:
 * HostUnreachable, HostNotFound, NetworkTimeout, ShutdownInProgress, WriteConflict,
 * PrimarySteppedDown, ExceededTimeLimit, SocketException, NotWritablePrimary,
 * InterruptedAtShutdown, InterruptedDueToReplStateChange, NotPrimaryNoSecondaryOk,
 * NotPrimaryOrSecondary. */
static const int mongo_transient_codes[] = {6, 7, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436};
/* Driver domains whose codes are server error codes. */
static const int mongo_server_domains[] = {MONGOC_ERROR_QUERY,   MONGOC_ERROR_SERVER,     MONGOC_ERROR_WRITE_CONCERN,
                                           MONGOC_ERROR_COMMAND, MONGOC_ERROR_COLLECTION, MONGOC_ERROR_INSERT};
static const char *const mongo_retry_labels[] = {"TransientTransactionError", "RetryableWriteError",
                                                 "ResumableChangeStreamError"};

static bool mongo_retriable(const bson_error_t *berr, const bson_t *reply) {
  if (reply) {
    for (size_t i = 0; i < sizeof mongo_retry_labels / sizeof mongo_retry_labels[0]; i++)
      if (mongoc_error_has_label(reply, mongo_retry_labels[i])) return true;
  }
  if (berr->domain == MONGOC_ERROR_STREAM) return true;
  if (berr->domain == MONGOC_ERROR_SERVER_SELECTION) return true;
  if (INT_IN((int)berr->domain, mongo_server_domains)) return INT_IN((int)berr->code, mongo_transient_codes);
  return false;
}

void obx_err_from_bson(obx_err_t *err, const struct _bson_error_t *berr, const struct _bson_t *reply) {
  if (!err) return;
  obx_err_set(err, OBX_ERR_MONGO, (int)berr->code, mongo_retriable(berr, reply), "%s (mongoc domain %u, code %u)",
              berr->message[0] ? berr->message : "unknown MongoDB error", berr->domain, berr->code);
}

bool obx_err_is_duplicate_key(const obx_err_t *err) {
  return err && err->domain == OBX_ERR_MONGO && err->code == MONGOC_ERROR_DUPLICATE_KEY;
}

/* ---- Kafka ------------------------------------------------------------------------------ */

/* librdkafka's transport, timeout and leadership errors: the client or the cluster recovers. */
static const int kafka_retriable_codes[] = {
  RD_KAFKA_RESP_ERR__TRANSPORT,
  RD_KAFKA_RESP_ERR__RESOLVE,
  RD_KAFKA_RESP_ERR__MSG_TIMED_OUT,
  RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
  RD_KAFKA_RESP_ERR__TIMED_OUT,
  RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE,
  RD_KAFKA_RESP_ERR__QUEUE_FULL,
  RD_KAFKA_RESP_ERR__ISR_INSUFF,
  RD_KAFKA_RESP_ERR__WAIT_COORD,
  RD_KAFKA_RESP_ERR__IN_PROGRESS,
  RD_KAFKA_RESP_ERR__PREV_IN_PROGRESS,
  RD_KAFKA_RESP_ERR__RETRY,
  RD_KAFKA_RESP_ERR__WAIT_CACHE,
  RD_KAFKA_RESP_ERR__NODE_UPDATE,
  RD_KAFKA_RESP_ERR__PURGE_QUEUE,
  RD_KAFKA_RESP_ERR__PURGE_INFLIGHT,
  RD_KAFKA_RESP_ERR__OUTDATED,
  RD_KAFKA_RESP_ERR__ASSIGNMENT_LOST,
  RD_KAFKA_RESP_ERR__MAX_POLL_EXCEEDED,
  RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
  RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
  RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
  RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
  RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE,
  RD_KAFKA_RESP_ERR_REPLICA_NOT_AVAILABLE,
  RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
  RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
  RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
  RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
  RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
  RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
  RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
  RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS,
  RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR,
  RD_KAFKA_RESP_ERR_FETCH_SESSION_ID_NOT_FOUND,
  RD_KAFKA_RESP_ERR_INVALID_FETCH_SESSION_EPOCH,
  RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH,
  RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH,
  RD_KAFKA_RESP_ERR_OFFSET_NOT_AVAILABLE,
  RD_KAFKA_RESP_ERR_PREFERRED_LEADER_NOT_AVAILABLE,
  RD_KAFKA_RESP_ERR_UNSTABLE_OFFSET_COMMIT,
  RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED,
};

void obx_err_from_kafka(obx_err_t *err, int rd_kafka_resp_err, const char *what) {
  if (!err) return;
  bool retriable = INT_IN(rd_kafka_resp_err, kafka_retriable_codes);
  const char *text = rd_kafka_err2str((rd_kafka_resp_err_t)rd_kafka_resp_err);
  if (what && *what)
    obx_err_set(err, OBX_ERR_KAFKA, rd_kafka_resp_err, retriable, "%s: %s (kafka %s)", what, text,
                rd_kafka_err2name((rd_kafka_resp_err_t)rd_kafka_resp_err));
  else
    obx_err_set(err, OBX_ERR_KAFKA, rd_kafka_resp_err, retriable, "%s (kafka %s)", text,
                rd_kafka_err2name((rd_kafka_resp_err_t)rd_kafka_resp_err));
}

/* ---- HTTP / curl ------------------------------------------------------------------------ */

/* Network-level failures: the peer may answer on a later attempt. */
static const int curl_retriable_codes[] = {
  CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT, CURLE_OPERATION_TIMEDOUT,
  CURLE_SEND_ERROR,            CURLE_RECV_ERROR,           CURLE_GOT_NOTHING,     CURLE_PARTIAL_FILE,
  CURLE_SSL_CONNECT_ERROR,     CURLE_HTTP2,                CURLE_HTTP2_STREAM,    CURLE_AGAIN,
};

void obx_err_from_curl(obx_err_t *err, int curlcode, const char *errbuf) {
  if (!err) return;
  bool retriable = INT_IN(curlcode, curl_retriable_codes);
  const char *text = curl_easy_strerror((CURLcode)curlcode);
  if (errbuf && *errbuf)
    obx_err_set(err, OBX_ERR_CURL, curlcode, retriable, "%s: %s (curl %d)", text, errbuf, curlcode);
  else
    obx_err_set(err, OBX_ERR_CURL, curlcode, retriable, "%s (curl %d)", text, curlcode);
}

void obx_err_from_http_status(obx_err_t *err, long status, const char *url) {
  if (!err) return;
  bool retriable = status >= 500 || status == 429 || status == 408;
  char *safe = url ? obx_log_redact_uri(url) : NULL;
  if (safe)
    obx_err_set(err, OBX_ERR_CURL, (int)status, retriable, "HTTP %ld from %s", status, safe);
  else
    obx_err_set(err, OBX_ERR_CURL, (int)status, retriable, "HTTP %ld", status);
  free(safe);
}

/* ---- AMQP ------------------------------------------------------------------------------- */

/* Library statuses that mean a misconfiguration or a bug, not an outage. */
static const int amqp_terminal_statuses[] = {
  AMQP_STATUS_NO_MEMORY,         AMQP_STATUS_BAD_URL,
  AMQP_STATUS_INVALID_PARAMETER, AMQP_STATUS_TABLE_TOO_BIG,
  AMQP_STATUS_UNSUPPORTED,       AMQP_STATUS_BROKER_UNSUPPORTED_SASL_METHOD,
  AMQP_STATUS_INCOMPATIBLE_AMQP_VERSION, AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED,
  AMQP_STATUS_SSL_PEER_VERIFY_FAILED,
};
/* Channel-close reply codes that a retry cannot fix (declaration mismatch, missing entity,
 * permissions). */
static const int amqp_terminal_channel_codes[] = {AMQP_PRECONDITION_FAILED, AMQP_NOT_FOUND, AMQP_ACCESS_REFUSED};

void obx_err_from_amqp_status(obx_err_t *err, int amqp_status, const char *what) {
  if (!err) return;
  bool retriable = amqp_status != AMQP_STATUS_OK && !INT_IN(amqp_status, amqp_terminal_statuses);
  obx_err_set(err, OBX_ERR_AMQP, amqp_status, retriable, "%s%s%s (amqp status %d)", what ? what : "",
              what ? ": " : "", amqp_error_string2(amqp_status), amqp_status);
}

void obx_err_from_amqp(obx_err_t *err, const struct amqp_rpc_reply_t_ *reply, const char *what) {
  if (!err) return;
  const char *sep = what ? ": " : "";
  what = what ? what : "";
  switch (reply->reply_type) {
  case AMQP_RESPONSE_NORMAL:
    obx_err_clear(err);
    return;
  case AMQP_RESPONSE_NONE:
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_CONNECTION_CLOSED, true, "%s%sunexpected end of stream from the broker",
                what, sep);
    return;
  case AMQP_RESPONSE_LIBRARY_EXCEPTION:
    obx_err_from_amqp_status(err, reply->library_error, what[0] ? what : NULL);
    return;
  case AMQP_RESPONSE_SERVER_EXCEPTION:
    break;
  }
  if (reply->reply.id == AMQP_CONNECTION_CLOSE_METHOD && reply->reply.decoded) {
    const amqp_connection_close_t *m = reply->reply.decoded;
    obx_err_set(err, OBX_ERR_AMQP, m->reply_code, true, "%s%sconnection closed by the broker: %u %.*s", what, sep,
                m->reply_code, (int)m->reply_text.len, (const char *)m->reply_text.bytes);
  } else if (reply->reply.id == AMQP_CHANNEL_CLOSE_METHOD && reply->reply.decoded) {
    const amqp_channel_close_t *m = reply->reply.decoded;
    obx_err_set(err, OBX_ERR_AMQP, m->reply_code, !INT_IN(m->reply_code, amqp_terminal_channel_codes),
                "%s%schannel closed by the broker: %u %.*s", what, sep, m->reply_code, (int)m->reply_text.len,
                (const char *)m->reply_text.bytes);
  } else {
    obx_err_set(err, OBX_ERR_AMQP, (int)reply->reply.id, true, "%s%sunexpected broker method 0x%08x", what, sep,
                (unsigned)reply->reply.id);
  }
}
