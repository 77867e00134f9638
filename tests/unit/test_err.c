/* test_err.c - obx_err_t basics and the classification of every library wrapper */
#include "obx_test.h"
#include "obx/obx_err.h"

#include <stdio.h>
#include <string.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <curl/curl.h>
#include <librdkafka/rdkafka.h>
#include <mongoc/mongoc.h>

#define CHECK_CLASS(err, name, want_domain, want_code, want_retriable)                                   \
  do {                                                                                                 \
    if ((err).domain != (want_domain) || (err).code != (want_code) || (err).retriable != (want_retriable)) \
      fail_msg("%s: got domain=%d code=%d retriable=%d (%s), want domain=%d code=%d retriable=%d", name, \
               (err).domain, (err).code, (err).retriable, (err).msg, (int)(want_domain), (int)(want_code), \
               (int)(want_retriable));                                                                 \
  } while (0)

static void test_set_prefix_clear(void **state) {
  obx_err_t err = OBX_ERR_INIT;
  obx_err_set(&err, OBX_ERR_CONF, 3, false, "bad %s=%d", "x", 5);
  assert_int_equal(err.domain, OBX_ERR_CONF);
  assert_int_equal(err.code, 3);
  assert_string_equal(err.msg, "bad x=5");
  obx_err_prefix(&err, "loading %s", "file");
  assert_string_equal(err.msg, "loading file: bad x=5");
  /* truncation keeps a NUL-terminated message */
  char big[600];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  obx_err_set(&err, OBX_ERR_SYS, 0, true, "%s", big);
  assert_int_equal(strlen(err.msg), sizeof err.msg - 1);
  obx_err_prefix(&err, "ctx");
  assert_int_equal(strlen(err.msg), sizeof err.msg - 1);
  assert_memory_equal(err.msg, "ctx: aaa", 8);
  obx_err_clear(&err);
  assert_int_equal(err.domain, OBX_ERR_NONE);
  assert_string_equal(err.msg, "");
  /* NULL err is allowed everywhere */
  obx_err_set(NULL, OBX_ERR_SYS, 1, false, "x");
  obx_err_prefix(NULL, "x");
  obx_err_clear(NULL);
  obx_err_from_kafka(NULL, 0, NULL);
  obx_err_from_http_status(NULL, 500, NULL);
  assert_string_equal(obx_err_domain_name(OBX_ERR_KAFKA), "kafka");
  assert_string_equal(obx_err_domain_name(OBX_ERR_CONFLICT), "conflict");
  assert_string_equal(obx_err_domain_name(999), "unknown");
}

static void test_bson(void **state) {
  static const struct {
    const char *name;
    uint32_t domain, code;
    const char *reply_json; /* NULL: no reply */
    bool retriable;
  } cases[] = {
    {"stream socket", MONGOC_ERROR_STREAM, MONGOC_ERROR_STREAM_SOCKET, NULL, true},
    {"stream connect", MONGOC_ERROR_STREAM, MONGOC_ERROR_STREAM_CONNECT, NULL, true},
    {"server selection", MONGOC_ERROR_SERVER_SELECTION, MONGOC_ERROR_SERVER_SELECTION_FAILURE, NULL, true},
    {"not primary", MONGOC_ERROR_SERVER, 10107, NULL, true},
    {"stepped down", MONGOC_ERROR_QUERY, 189, NULL, true},
    {"shutdown", MONGOC_ERROR_SERVER, 91, NULL, true},
    {"host unreachable", MONGOC_ERROR_SERVER, 6, NULL, true},
    {"network timeout", MONGOC_ERROR_SERVER, 89, NULL, true},
    {"interrupted repl", MONGOC_ERROR_SERVER, 11602, NULL, true},
    {"write conflict", MONGOC_ERROR_SERVER, 112, NULL, true},
    {"wc not primary", MONGOC_ERROR_WRITE_CONCERN, 10107, NULL, true},
    {"duplicate key", MONGOC_ERROR_SERVER, 11000, NULL, false},
    {"dup key even with reply", MONGOC_ERROR_COLLECTION, 11000, "{\"ok\":0,\"code\":11000}", false},
    {"no such txn alone", MONGOC_ERROR_SERVER, 251, NULL, false},
    {"no such txn labeled", MONGOC_ERROR_SERVER, 251, "{\"errorLabels\":[\"TransientTransactionError\"]}", true},
    {"retryable write label", MONGOC_ERROR_SERVER, 2, "{\"errorLabels\":[\"RetryableWriteError\"]}", true},
    {"resumable cs label", MONGOC_ERROR_SERVER, 280, "{\"errorLabels\":[\"ResumableChangeStreamError\"]}", true},
    {"other label", MONGOC_ERROR_SERVER, 2, "{\"errorLabels\":[\"Whatever\"]}", false},
    {"bad value", MONGOC_ERROR_SERVER, 2, NULL, false},
    {"client code 6 is not HostUnreachable", MONGOC_ERROR_CLIENT, 6, NULL, false},
    {"bson invalid", MONGOC_ERROR_BSON, MONGOC_ERROR_BSON_INVALID, NULL, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bson_error_t berr;
    bson_set_error(&berr, cases[i].domain, cases[i].code, "boom %zu", i);
    bson_t *reply = cases[i].reply_json ? bson_new_from_json((const uint8_t *)cases[i].reply_json, -1, NULL) : NULL;
    obx_err_t err = OBX_ERR_INIT;
    obx_err_from_bson(&err, &berr, reply);
    CHECK_CLASS(err, cases[i].name, OBX_ERR_MONGO, (int)cases[i].code, cases[i].retriable);
    assert_non_null(strstr(err.msg, "boom"));
    assert_int_equal(obx_err_is_duplicate_key(&err), cases[i].code == 11000);
    bson_destroy(reply);
  }
}

static void test_kafka(void **state) {
  static const struct {
    int code;
    bool retriable;
  } cases[] = {
    {RD_KAFKA_RESP_ERR__TRANSPORT, true},
    {RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, true},
    {RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, true},
    {RD_KAFKA_RESP_ERR__TIMED_OUT, true},
    {RD_KAFKA_RESP_ERR__QUEUE_FULL, true},
    {RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, true},
    {RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, true},
    {RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND, true},
    {RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, true},
    {RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, true},
    {RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION, true},
    {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, false},
    {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, false},
    {RD_KAFKA_RESP_ERR__INVALID_ARG, false},
    {RD_KAFKA_RESP_ERR__FATAL, false},
    {RD_KAFKA_RESP_ERR_INVALID_MSG, false},
    {RD_KAFKA_RESP_ERR_PRODUCER_FENCED, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_err_t err = OBX_ERR_INIT;
    obx_err_from_kafka(&err, cases[i].code, "produce");
    CHECK_CLASS(err, rd_kafka_err2name(cases[i].code), OBX_ERR_KAFKA, cases[i].code, cases[i].retriable);
    assert_non_null(strstr(err.msg, "produce: "));
    assert_non_null(strstr(err.msg, rd_kafka_err2str(cases[i].code)));
  }
}

static void test_curl(void **state) {
  static const struct {
    int code;
    bool retriable;
  } cases[] = {
    {CURLE_OPERATION_TIMEDOUT, true}, {CURLE_COULDNT_CONNECT, true},    {CURLE_COULDNT_RESOLVE_HOST, true},
    {CURLE_SEND_ERROR, true},         {CURLE_RECV_ERROR, true},         {CURLE_GOT_NOTHING, true},
    {CURLE_URL_MALFORMAT, false},     {CURLE_UNSUPPORTED_PROTOCOL, false}, {CURLE_TOO_MANY_REDIRECTS, false},
    {CURLE_FILESIZE_EXCEEDED, false}, {CURLE_PEER_FAILED_VERIFICATION, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_err_t err = OBX_ERR_INIT;
    obx_err_from_curl(&err, cases[i].code, "detail");
    CHECK_CLASS(err, curl_easy_strerror(cases[i].code), OBX_ERR_CURL, cases[i].code, cases[i].retriable);
    assert_non_null(strstr(err.msg, "detail"));
  }
}

static void test_http_status(void **state) {
  static const struct {
    long status;
    bool retriable;
  } cases[] = {{500, true}, {502, true}, {503, true}, {504, true}, {429, true}, {408, true},
               {400, false}, {401, false}, {403, false}, {404, false}, {409, false}, {422, false}, {301, false}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_err_t err = OBX_ERR_INIT;
    char name[32];
    snprintf(name, sizeof name, "HTTP %ld", cases[i].status);
    obx_err_from_http_status(&err, cases[i].status, "https://user:hunter2@example.com/hook");
    CHECK_CLASS(err, name, OBX_ERR_CURL, (int)cases[i].status, cases[i].retriable);
    assert_null(strstr(err.msg, "hunter2"));
    assert_non_null(strstr(err.msg, "example.com/hook"));
  }
}

static void test_amqp_status(void **state) {
  static const struct {
    int status;
    bool retriable;
  } cases[] = {
    {AMQP_STATUS_CONNECTION_CLOSED, true}, {AMQP_STATUS_SOCKET_ERROR, true},  {AMQP_STATUS_TIMEOUT, true},
    {AMQP_STATUS_HEARTBEAT_TIMEOUT, true}, {AMQP_STATUS_TCP_ERROR, true},     {AMQP_STATUS_SOCKET_CLOSED, true},
    {AMQP_STATUS_HOSTNAME_RESOLUTION_FAILED, true}, {AMQP_STATUS_BAD_URL, false}, {AMQP_STATUS_INVALID_PARAMETER, false},
    {AMQP_STATUS_SSL_PEER_VERIFY_FAILED, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_err_t err = OBX_ERR_INIT;
    obx_err_from_amqp_status(&err, cases[i].status, "publish");
    CHECK_CLASS(err, amqp_error_string2(cases[i].status), OBX_ERR_AMQP, cases[i].status, cases[i].retriable);
    assert_non_null(strstr(err.msg, "publish: "));
  }
}

static void test_amqp_reply(void **state) {
  static const struct {
    const char *name;
    amqp_response_type_enum type;
    amqp_method_number_t method;
    uint16_t reply_code;
    int library_error;
    int want_code;
    bool retriable;
  } cases[] = {
    {"library socket", AMQP_RESPONSE_LIBRARY_EXCEPTION, 0, 0, AMQP_STATUS_SOCKET_ERROR, AMQP_STATUS_SOCKET_ERROR, true},
    {"library bad url", AMQP_RESPONSE_LIBRARY_EXCEPTION, 0, 0, AMQP_STATUS_BAD_URL, AMQP_STATUS_BAD_URL, false},
    {"eof", AMQP_RESPONSE_NONE, 0, 0, 0, AMQP_STATUS_CONNECTION_CLOSED, true},
    {"conn forced", AMQP_RESPONSE_SERVER_EXCEPTION, AMQP_CONNECTION_CLOSE_METHOD, AMQP_CONNECTION_FORCED, 0, 320, true},
    {"conn internal", AMQP_RESPONSE_SERVER_EXCEPTION, AMQP_CONNECTION_CLOSE_METHOD, AMQP_INTERNAL_ERROR, 0, 541, true},
    {"chan precondition", AMQP_RESPONSE_SERVER_EXCEPTION, AMQP_CHANNEL_CLOSE_METHOD, AMQP_PRECONDITION_FAILED, 0, 406, false},
    {"chan not found", AMQP_RESPONSE_SERVER_EXCEPTION, AMQP_CHANNEL_CLOSE_METHOD, AMQP_NOT_FOUND, 0, 404, false},
    {"chan access refused", AMQP_RESPONSE_SERVER_EXCEPTION, AMQP_CHANNEL_CLOSE_METHOD, AMQP_ACCESS_REFUSED, 0, 403, false},
    {"chan resource locked", AMQP_RESPONSE_SERVER_EXCEPTION, AMQP_CHANNEL_CLOSE_METHOD, AMQP_RESOURCE_LOCKED, 0, 405, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    amqp_connection_close_t cclose = {0};
    amqp_channel_close_t chclose = {0};
    amqp_rpc_reply_t reply = {0};
    reply.reply_type = cases[i].type;
    reply.library_error = cases[i].library_error;
    reply.reply.id = cases[i].method;
    if (cases[i].method == AMQP_CONNECTION_CLOSE_METHOD) {
      cclose.reply_code = cases[i].reply_code;
      cclose.reply_text = amqp_cstring_bytes("CLOSED_BY_TEST");
      reply.reply.decoded = &cclose;
    } else if (cases[i].method == AMQP_CHANNEL_CLOSE_METHOD) {
      chclose.reply_code = cases[i].reply_code;
      chclose.reply_text = amqp_cstring_bytes("CLOSED_BY_TEST");
      reply.reply.decoded = &chclose;
    }
    obx_err_t err = OBX_ERR_INIT;
    obx_err_from_amqp(&err, &reply, "declare");
    CHECK_CLASS(err, cases[i].name, OBX_ERR_AMQP, cases[i].want_code, cases[i].retriable);
    if (cases[i].method) assert_non_null(strstr(err.msg, "CLOSED_BY_TEST"));
  }
  amqp_rpc_reply_t ok = {0};
  ok.reply_type = AMQP_RESPONSE_NORMAL;
  obx_err_t err;
  obx_err_set(&err, OBX_ERR_SYS, 1, true, "stale");
  obx_err_from_amqp(&err, &ok, "x");
  assert_int_equal(err.domain, OBX_ERR_NONE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_set_prefix_clear), cmocka_unit_test(test_bson),       cmocka_unit_test(test_kafka),
    cmocka_unit_test(test_curl),             cmocka_unit_test(test_http_status), cmocka_unit_test(test_amqp_status),
    cmocka_unit_test(test_amqp_reply),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
