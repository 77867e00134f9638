/* producer.c - the relay's idempotent Kafka producer
 *
 * DESIGN: a thin owner of one rd_kafka_t. Configuration: bootstrap servers from the table,
 * then the guarantees DESIGN.md §4 requires (enable.idempotence=true, acks=all,
 * partitioner=murmur2_random: the same partition as Java clients and Knative), no local
 * message timeout (a record waits out a Kafka outage instead of failing), then the `kafka.*`
 * passthrough keys, then the guarantees again (enable.idempotence=true, acks=all), so no
 * passthrough key can weaken them. The idempotent producer keeps order per partition with up to 5
 * requests in flight, so per-key order in Kafka is the order of obx_relay_producer_send calls.
 * Delivery reports are served on the thread that calls obx_relay_producer_poll (the relay
 * thread); `pending` is only touched there and in send, so it needs no lock. Each record gets a
 * producer span (messaging semconv, messaging.system=kafka) from send to its delivery report,
 * a child of the event's ce_traceparent (or a new trace); its context is the record's
 * ce_traceparent, so the consumer continues the trace. */
#include "obx/obx_relay.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_log.h"
#include "obx/obx_trace.h"

struct obx_relay_producer {
  rd_kafka_t *rk;
  obx_relay_ack_fn ack;
  void *ctx;
  int pending;
  bool fatal;
};

/* The rdkafka opaque of a record: the caller's opaque and the record's producer span. */
typedef struct {
  void *opaque;
  obx_span_t *span;
} producer_sent_t;

static void producer_on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
  obx_relay_producer_t *producer = opaque;
  producer_sent_t *sent = msg->_private;
  obx_relay_ack_t ack;
  memset(&ack, 0, sizeof ack);
  ack.opaque = sent->opaque;
  ack.ok = msg->err == RD_KAFKA_RESP_ERR_NO_ERROR;
  ack.partition = msg->partition;
  ack.offset = msg->offset;
  if (!ack.ok) obx_err_from_kafka(&ack.err, msg->err, "delivery");
  producer->pending--;
  char partition[16];
  snprintf(partition, sizeof partition, "%d", (int)msg->partition);
  obx_span_set_str(sent->span, "messaging.destination.partition.id", partition);
  if (ack.ok) obx_span_set_int(sent->span, "messaging.kafka.message.offset", msg->offset);
  else obx_span_set_error(sent->span, ack.err.msg);
  obx_trace_set_current(obx_span_ctx(sent->span));
  producer->ack(&ack, producer->ctx);
  obx_trace_set_current(NULL);
  obx_span_end(sent->span);
  free(sent);
}

static void producer_on_error(rd_kafka_t *rk, int code, const char *reason, void *opaque) {
  obx_relay_producer_t *producer = opaque;
  if (code == RD_KAFKA_RESP_ERR__FATAL) {
    char why[256];
    rd_kafka_fatal_error(rk, why, sizeof why);
    producer->fatal = true;
    obx_error("kafka producer fatal error: %s", why);
    return;
  }
  obx_debug("kafka: %s (%s)", reason, rd_kafka_err2name(code)); /* also in the routed log */
}

static bool producer_conf_set(rd_kafka_conf_t *kconf, const char *name, const char *value, obx_err_t *err) {
  char why[256];
  if (rd_kafka_conf_set(kconf, name, value, why, sizeof why) == RD_KAFKA_CONF_OK) return true;
  obx_err_set(err, OBX_ERR_CONF, 0, false, "kafka.%s=%s: %s", name, value, why);
  return false;
}

obx_relay_producer_t *obx_relay_producer_new(const obx_conf_t *conf, obx_relay_ack_fn ack, void *ctx,
                                             obx_err_t *err) {
  /* defaults a kafka.* key may change */
  static const char *const defaults[][2] = {
    {"client.id", "outboxd-relay"},
    {"partitioner", "murmur2_random"},
    /* retry until Kafka takes the record: an outage must not turn into a failed attempt
     * that the sweeper republishes after later events of the same key (kafka.message.timeout.ms
     * bounds it when wanted) */
    {"message.timeout.ms", "0"},
    /* one event per key is in flight, so at a low rate each waits out the linger alone: 1 ms
     * instead of librdkafka's 5 (under load, records batch while requests are in flight) */
    {"linger.ms", "1"},
  };
  /* the guarantees: set after the passthrough, so no kafka.* key can undo them */
  static const char *const forced[][2] = {
    {"enable.idempotence", "true"},
    {"acks", "all"},
  };
  obx_relay_producer_t *producer = calloc(1, sizeof *producer);
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  char why[512];
  if (!producer) abort();
  producer->ack = ack;
  producer->ctx = ctx;

  if (!producer_conf_set(kconf, "bootstrap.servers", conf->kafka_brokers, err)) goto fail;
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
    if (!producer_conf_set(kconf, defaults[i][0], defaults[i][1], err)) goto fail;
  for (int i = 0; i < conf->npassthrough; i++) {
    const char *key = conf->passthrough[i].key;
    if (strncmp(key, "kafka.", 6) != 0) continue;
    for (size_t f = 0; f < sizeof forced / sizeof forced[0]; f++)
      if (strcmp(key + 6, forced[f][0]) == 0 && strcmp(conf->passthrough[i].value, forced[f][1]) != 0)
        obx_warn("%s=%s ignored: the relay always produces with %s=%s", key, conf->passthrough[i].value, forced[f][0],
                 forced[f][1]);
    if (!producer_conf_set(kconf, key + 6, conf->passthrough[i].value, err)) goto fail;
  }
  for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++)
    if (!producer_conf_set(kconf, forced[i][0], forced[i][1], err)) goto fail;
  rd_kafka_conf_set_opaque(kconf, producer);
  rd_kafka_conf_set_dr_msg_cb(kconf, producer_on_delivery);
  rd_kafka_conf_set_error_cb(kconf, producer_on_error);
  obx_log_route_kafka(kconf);

  producer->rk = rd_kafka_new(RD_KAFKA_PRODUCER, kconf, why, sizeof why);
  if (!producer->rk) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, false, "kafka producer: %s", why);
    goto fail;
  }
  return producer; /* rd_kafka_new took kconf */

fail:
  rd_kafka_conf_destroy(kconf);
  free(producer);
  return NULL;
}

void obx_relay_producer_destroy(obx_relay_producer_t *producer) {
  if (!producer) return;
  rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  rd_kafka_flush(producer->rk, 5000);
  rd_kafka_destroy(producer->rk);
  free(producer);
}

/* The producer span of rec: a child of its ce_traceparent, named "publish <topic>". */
static obx_span_t *producer_span(const char *topic, const obx_kafka_record_t *rec) {
  obx_trace_ctx_t parent = {0};
  const char *state = NULL, *id = NULL;
  size_t state_len = 0;
  for (int i = 0; i < rec->nheaders; i++)
    if (strcmp(rec->headers[i].name, "ce_tracestate") == 0) state = rec->headers[i].value, state_len = rec->headers[i].len;
  for (int i = 0; i < rec->nheaders; i++) {
    if (strcmp(rec->headers[i].name, "ce_traceparent") == 0)
      obx_trace_parse(rec->headers[i].value, rec->headers[i].len, state, state_len, &parent);
    if (strcmp(rec->headers[i].name, "ce_id") == 0) id = rec->headers[i].value;
  }
  char name[300];
  snprintf(name, sizeof name, "publish %s", topic);
  obx_span_t *span = obx_span_start(name, OBX_SPAN_PRODUCER, &parent);
  obx_span_set_str(span, "messaging.system", "kafka");
  obx_span_set_str(span, "messaging.operation.type", "publish");
  obx_span_set_str(span, "messaging.operation.name", "publish");
  obx_span_set_str(span, "messaging.destination.name", topic);
  obx_span_set_str(span, "messaging.message.id", id);
  obx_span_set_str(span, "messaging.kafka.message.key", rec->key);
  obx_span_set_str(span, "messaging.client.id", "outboxd-relay");
  return span;
}

bool obx_relay_producer_send(obx_relay_producer_t *producer, const char *topic,
                             const obx_kafka_record_t *rec, void *opaque, obx_err_t *err) {
  producer_sent_t *sent = malloc(sizeof *sent);
  if (!sent) abort();
  sent->opaque = opaque;
  sent->span = producer_span(topic, rec);
  char traceparent[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(obx_span_ctx(sent->span), traceparent);
  rd_kafka_headers_t *headers = rd_kafka_headers_new((size_t)rec->nheaders + 1);
  for (int i = 0; i < rec->nheaders; i++)
    if (strcmp(rec->headers[i].name, "ce_traceparent") != 0)
      rd_kafka_header_add(headers, rec->headers[i].name, -1, rec->headers[i].value, (ssize_t)rec->headers[i].len);
  rd_kafka_header_add(headers, "ce_traceparent", -1, traceparent, -1);
  rd_kafka_resp_err_t rc = rd_kafka_producev(
    producer->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
    RD_KAFKA_V_KEY(rec->key, rec->key_len), RD_KAFKA_V_VALUE(rec->value, rec->value_len),
    RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_OPAQUE(sent), RD_KAFKA_V_END);
  if (rc != RD_KAFKA_RESP_ERR_NO_ERROR) {
    rd_kafka_headers_destroy(headers); /* producev owns them only on success */
    obx_err_from_kafka(err, rc, "produce");
    obx_span_set_error(sent->span, err->msg);
    obx_span_end(sent->span);
    free(sent);
    return false;
  }
  producer->pending++;
  return true;
}

int obx_relay_producer_poll(obx_relay_producer_t *producer, int timeout_ms) {
  return rd_kafka_poll(producer->rk, timeout_ms);
}

int obx_relay_producer_pending(const obx_relay_producer_t *producer) {
  return producer->pending;
}

bool obx_relay_producer_flush(obx_relay_producer_t *producer, int timeout_ms) {
  rd_kafka_flush(producer->rk, timeout_ms);
  return producer->pending == 0;
}

bool obx_relay_producer_fatal(const obx_relay_producer_t *producer) {
  return producer->fatal;
}

bool obx_relay_producer_check(obx_relay_producer_t *producer, const char *topic, const char *brokers,
                              int timeout_ms, obx_err_t *err) {
  if (producer->fatal) {
    obx_err_set(err, OBX_ERR_KAFKA, RD_KAFKA_RESP_ERR__FATAL, true, "the Kafka producer hit a fatal error (being replaced)");
    return false;
  }
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t rc = rd_kafka_metadata(producer->rk, 1, NULL, &md, timeout_ms);
  if (rc != RD_KAFKA_RESP_ERR_NO_ERROR) {
    obx_err_set(err, OBX_ERR_KAFKA, rc, true, "the Kafka producer cannot reach a broker of %s within %d ms: %s",
                brokers, timeout_ms, rd_kafka_err2str(rc));
    return false;
  }
  bool ok = false;
  int i = 0;
  while (i < md->topic_cnt && strcmp(md->topics[i].topic, topic) != 0) i++;
  if (i == md->topic_cnt) {
    obx_err_set(err, OBX_ERR_KAFKA, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, true,
                "topic '%s' (kafka.topic) does not exist on %s; create it (README: Kafka)", topic, brokers);
  } else if (md->topics[i].err) {
    obx_err_set(err, OBX_ERR_KAFKA, md->topics[i].err, true, "topic '%s': %s", topic, rd_kafka_err2str(md->topics[i].err));
  } else {
    ok = true;
    for (int p = 0; ok && p < md->topics[i].partition_cnt; p++) {
      const struct rd_kafka_metadata_partition *part = &md->topics[i].partitions[p];
      if (part->err || part->leader < 0) {
        obx_err_set(err, OBX_ERR_KAFKA, part->err, true, "topic '%s' partition %d has no leader: %s", topic, (int)part->id,
                    rd_kafka_err2str(part->err));
        ok = false;
      }
    }
  }
  rd_kafka_metadata_destroy(md);
  return ok;
}
