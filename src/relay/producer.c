/* producer.c - the relay's Kafka producer: idempotent, and transactional to fence zombies
 *
 * DESIGN: a thin owner of one rd_kafka_t. Configuration: bootstrap servers from the table,
 * then the guarantees DESIGN.md §4 requires (enable.idempotence=true, acks=all,
 * partitioner=murmur2_random: the same partition as Java clients and Knative), no local
 * message timeout (a record waits out a Kafka outage instead of failing), then the `kafka.*`
 * passthrough keys, then the guarantees again (enable.idempotence=true, acks=all and the
 * transactional.id), so no passthrough key can weaken them. The idempotent producer keeps order
 * per partition with up to 5 requests in flight, so per-key order in Kafka is the order of
 * obx_relay_producer_send calls; without a message timeout it also has the gap-less guarantee
 * (enable.gapless.guarantee): a record the broker refuses makes it fatal before a later record
 * of its partition is written (obx_relay_producer_gapless, keys.c's window). Delivery reports
 * are served on the thread that calls obx_relay_producer_poll (the relay thread); everything
 * here is only touched there, so it needs no lock (obx_relay_producer_check excepted: a
 * metadata request; obx_relay_producer_wake: a queue yield, from any thread). Each record gets a
 * producer span (messaging semconv, messaging.system=kafka) from send to its delivery report,
 * a child of the event's ce_traceparent (or a new trace); its context is the record's
 * ce_traceparent, so the consumer continues the trace.
 *
 * Transactional (a transactional.id given: the relay's, obx_relay_transactional_id): the
 * broker fences zombies. obx_relay_producer_fence (a new leader, after it took the lease and
 * before it produces) runs init_transactions: the broker aborts the open transaction of every
 * earlier instance of that transactional.id and bumps its epoch, so an earlier leader that was
 * paused past its lease and resumes can neither append to the topic nor commit: its requests
 * fail with a fencing error (fatal here: the relay replaces the producer and steps down).
 * Records go into a transaction begun at the first send; their delivery reports are held, and
 * reach the caller only once the transaction is committed, which happens as soon as every
 * record of it is acknowledged (or PRODUCER_TXN_MAX_MS after it began: commit flushes). So an
 * ok report means "visible to read_committed consumers", and the relay marks PUBLISHED only
 * what is committed. The transaction's states:
 *
 *   state       event                                   next, action
 *   none        send                                    open, begin_transaction, produce
 *   open        every record acknowledged, or old       commit_transaction: committed -> none,
 *                                                       the held reports delivered ok
 *   open        a record's report failed (a refusal)    doomed, that report delivered at once
 *                                                       (the relay holds its key)
 *   open/doomed commit says abort, or doomed            abort_transaction, then produce the
 *                                                       other records again in a new one
 *                                                       (not an attempt: they were fine)
 *   doomed      send                                    refused (retriable): the abort is due
 *   any         commit/abort timed out (Kafka down)     unchanged, retried on the next poll
 *   any         fencing or another fatal error          fatal: every held report delivered
 *                                                       failed (the relay counts them purged)
 *
 * A transaction costs an AddPartitionsToTxn per partition it touches and an EndTxn, and one
 * begun right after a commit on the same partitions may wait for the broker's commit markers
 * (CONCURRENT_TRANSACTIONS, retried by librdkafka after 20 ms): README "Benchmark: relay"
 * gives the figures. */
#include "obx/obx_relay.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_log.h"
#include "obx/obx_trace.h"

/* A transaction takes records for this long; later ones wait for the next (it commits as soon
 * as every record of it is acknowledged). */
#define PRODUCER_TXN_MAX_MS 10
/* One commit or abort call blocks the polling thread at most this long (then it is resumed). */
#define PRODUCER_TXN_CALL_MS 500
#define PRODUCER_TXN_RETRY_MS 1000

/* One record from send to the report its caller gets. Transactional: the record is kept (to be
 * produced again after an abort) and its report held until the commit. */
typedef struct producer_sent {
  void *opaque;
  obx_span_t *span;
  char *topic;
  void *key, *value;
  size_t key_len, value_len;
  rd_kafka_headers_t *headers;
  bool reported;           /* its delivery report arrived (in `ack`) */
  bool done;               /* the caller had its report */
  obx_relay_ack_t ack;
  struct producer_sent *next;
} producer_sent_t;

typedef struct {
  producer_sent_t *head, *tail;
} producer_list_t;

struct obx_relay_producer {
  rd_kafka_t *rk;
  rd_kafka_queue_t *main;  /* the queue rd_kafka_poll serves (obx_relay_producer_wake) */
  obx_relay_ack_fn ack;
  void *ctx;
  int pending;             /* records sent whose report the caller has not had */
  bool fatal;
  bool gapless;            /* enable.gapless.guarantee, no message timeout: obx_relay_producer_gapless */
  /* transactional */
  bool transactional;
  bool ready;              /* init_transactions done: this instance is the one of its id */
  bool in_txn;
  bool doomed;             /* the open transaction must be aborted */
  char doom[256];          /* why */
  int64_t txn_began_ms;
  int txn_unacked;         /* records of the transaction without a delivery report */
  int64_t txn_retry_ms;    /* a commit or abort failed retriably: not tried again before */
  producer_list_t txn;     /* the records of the open transaction, in send order */
  producer_list_t deferred; /* sent while it closed: produced in the next one */
};

static void sent_free(producer_sent_t *sent) {
  free(sent->topic);
  free(sent->key);
  free(sent->value);
  if (sent->headers) rd_kafka_headers_destroy(sent->headers);
  free(sent);
}

/* Hands sent's report (sent->ack) to the caller, once. */
static void producer_deliver(obx_relay_producer_t *producer, producer_sent_t *sent) {
  if (sent->done) return;
  sent->done = true;
  obx_relay_ack_t *ack = &sent->ack;
  ack->opaque = sent->opaque;
  producer->pending--;
  char partition[16];
  snprintf(partition, sizeof partition, "%d", (int)ack->partition);
  obx_span_set_str(sent->span, "messaging.destination.partition.id", partition);
  if (ack->ok) obx_span_set_int(sent->span, "messaging.kafka.message.offset", ack->offset);
  else obx_span_set_error(sent->span, ack->err.msg);
  obx_trace_set_current(obx_span_ctx(sent->span));
  producer->ack(ack, producer->ctx);
  obx_trace_set_current(NULL);
  obx_span_end(sent->span);
  sent->span = NULL;
}

static void producer_doom(obx_relay_producer_t *producer, const char *why) {
  if (!producer->doomed) snprintf(producer->doom, sizeof producer->doom, "%s", why);
  producer->doomed = true;
}

static void producer_on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
  obx_relay_producer_t *producer = opaque;
  producer_sent_t *sent = msg->_private;
  obx_relay_ack_t *ack = &sent->ack;
  memset(ack, 0, sizeof *ack);
  ack->ok = msg->err == RD_KAFKA_RESP_ERR_NO_ERROR;
  ack->partition = msg->partition;
  ack->offset = msg->offset;
  if (!ack->ok) obx_err_from_kafka(&ack->err, msg->err, "delivery");
  if (!producer->transactional) {
    producer_deliver(producer, sent);
    sent_free(sent);
    return;
  }
  sent->reported = true;
  producer->txn_unacked--;
  bool purged = msg->err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || msg->err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT;
  if (ack->ok || purged) return; /* held until the transaction ends */
  if (rd_kafka_fatal_error(rk, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR) producer->fatal = true; /* fenced */
  /* refused: the transaction cannot commit; the caller hears of this record now (it holds the
   * record's key), the others are produced again after the abort */
  producer_doom(producer, ack->err.msg);
  producer_deliver(producer, sent);
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

void obx_relay_transactional_id(const obx_conf_t *conf, int bucket, char *out, size_t len) {
  if (conf->relay_transactional_id && *conf->relay_transactional_id)
    snprintf(out, len, "%s-%d", conf->relay_transactional_id, bucket);
  else
    snprintf(out, len, "outboxd-%s-%s-%d", conf->mongo_db, conf->kafka_topic, bucket);
}

obx_relay_producer_t *obx_relay_producer_new(const obx_conf_t *conf, const char *transactional_id,
                                             obx_relay_ack_fn ack, void *ctx, obx_err_t *err) {
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
  producer->transactional = transactional_id != NULL;

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
    if (strcmp(key + 6, "transactional.id") == 0)
      obx_warn("%s ignored: the relay's transactional.id is relay.transactional_id-<bucket>", key);
    if (!producer_conf_set(kconf, key + 6, conf->passthrough[i].value, err)) goto fail;
  }
  for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++)
    if (!producer_conf_set(kconf, forced[i][0], forced[i][1], err)) goto fail;
  if (transactional_id && !producer_conf_set(kconf, "transactional.id", transactional_id, err)) goto fail;
  /* idempotent: a record the broker refuses stops the producer (a fatal error) instead of letting
   * the later records of its partition be written after the gap; that is what lets keys.c have
   * several events of a key in flight. A message timeout is outside that guarantee (a timed-out
   * record leaves a gap), so a kafka.message.timeout.ms other than 0 keeps one per key. */
  char timeout[32];
  size_t timeout_len = sizeof timeout;
  producer->gapless = !transactional_id &&
                      rd_kafka_conf_get(kconf, "message.timeout.ms", timeout, &timeout_len) == RD_KAFKA_CONF_OK &&
                      strcmp(timeout, "0") == 0;
  if (producer->gapless && !producer_conf_set(kconf, "enable.gapless.guarantee", "true", err)) goto fail;
  for (int i = 0; producer->gapless && i < conf->npassthrough; i++)
    if (strcmp(conf->passthrough[i].key, "kafka.enable.gapless.guarantee") == 0 && strcmp(conf->passthrough[i].value, "true") != 0)
      obx_warn("%s=%s ignored: without a message timeout the relay produces with the gap-less guarantee",
               conf->passthrough[i].key, conf->passthrough[i].value);
  rd_kafka_conf_set_opaque(kconf, producer);
  rd_kafka_conf_set_dr_msg_cb(kconf, producer_on_delivery);
  rd_kafka_conf_set_error_cb(kconf, producer_on_error);
  obx_log_route_kafka(kconf);

  producer->rk = rd_kafka_new(RD_KAFKA_PRODUCER, kconf, why, sizeof why);
  if (!producer->rk) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, false, "kafka producer: %s", why);
    goto fail;
  }
  producer->main = rd_kafka_queue_get_main(producer->rk);
  return producer; /* rd_kafka_new took kconf */

fail:
  rd_kafka_conf_destroy(kconf);
  free(producer);
  return NULL;
}

/* Sets err from a transactional call's error; a fatal one makes the producer fatal. */
static void producer_txn_error(obx_relay_producer_t *producer, rd_kafka_error_t *e, const char *what, obx_err_t *err) {
  obx_err_from_kafka(err, rd_kafka_error_code(e), what);
  snprintf(err->msg, sizeof err->msg, "%s: %s (kafka %s)", what, rd_kafka_error_string(e), rd_kafka_error_name(e));
  err->retriable = rd_kafka_error_is_retriable(e);
  if (rd_kafka_error_is_fatal(e) && !producer->fatal) {
    producer->fatal = true;
    obx_error("kafka producer fatal error: %s", err->msg);
  }
  rd_kafka_error_destroy(e);
}

bool obx_relay_producer_fence(obx_relay_producer_t *producer, int timeout_ms, obx_err_t *err) {
  if (!producer->transactional || producer->ready) return true;
  rd_kafka_error_t *e = rd_kafka_init_transactions(producer->rk, timeout_ms);
  if (e) {
    producer_txn_error(producer, e, "init_transactions", err);
    return false;
  }
  producer->ready = true;
  return true;
}

/* Produces sent (its copies; the headers are copied again, producev takes them). */
static rd_kafka_resp_err_t producer_produce(obx_relay_producer_t *producer, producer_sent_t *sent) {
  rd_kafka_headers_t *headers = rd_kafka_headers_copy(sent->headers);
  rd_kafka_resp_err_t rc = rd_kafka_producev(
    producer->rk, RD_KAFKA_V_TOPIC(sent->topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
    RD_KAFKA_V_KEY(sent->key, sent->key_len), RD_KAFKA_V_VALUE(sent->value, sent->value_len),
    RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_OPAQUE(sent), RD_KAFKA_V_END);
  if (rc != RD_KAFKA_RESP_ERR_NO_ERROR) rd_kafka_headers_destroy(headers); /* producev owns them only on success */
  return rc;
}

static void list_append(producer_list_t *list, producer_sent_t *sent) {
  sent->next = NULL;
  if (list->tail) list->tail->next = sent;
  else list->head = sent;
  list->tail = sent;
}

static producer_sent_t *list_take(producer_list_t *list) {
  producer_sent_t *head = list->head;
  list->head = list->tail = NULL;
  return head;
}

/* Delivers every report of `sent` (a list) the caller has not had: ok as acknowledged when
 * committed, else failed with (code, why); frees them. */
static void producer_deliver_all(obx_relay_producer_t *producer, producer_sent_t *sent, bool committed, int code,
                                 const char *why) {
  while (sent) {
    producer_sent_t *next = sent->next;
    if (!committed || !sent->ack.ok) {
      memset(&sent->ack, 0, sizeof sent->ack);
      obx_err_set(&sent->ack.err, OBX_ERR_KAFKA, code, true, "%s", why);
    }
    producer_deliver(producer, sent);
    sent_free(sent);
    sent = next;
  }
}

/* Begins a transaction and produces into it the records of `list` the caller has not heard of
 * (after an abort, or deferred while the previous one closed). */
static void producer_txn_start(obx_relay_producer_t *producer, producer_sent_t *list) {
  rd_kafka_error_t *e = NULL;
  producer_sent_t *keep = NULL;
  while (list) { /* drop what was already reported */
    producer_sent_t *next = list->next;
    if (list->done) sent_free(list);
    else list_append(&producer->txn, list), keep = producer->txn.head;
    list = next;
  }
  if (!keep) return;
  if ((e = rd_kafka_begin_transaction(producer->rk))) {
    obx_err_t err = OBX_ERR_INIT;
    producer_txn_error(producer, e, "begin_transaction", &err);
    producer_deliver_all(producer, list_take(&producer->txn), false, err.code, err.msg);
    return;
  }
  producer->in_txn = true;
  producer->txn_began_ms = obx_time_now_ms();
  for (producer_sent_t *sent = producer->txn.head; sent; sent = sent->next) {
    sent->reported = false;
    rd_kafka_resp_err_t rc = producer_produce(producer, sent);
    if (rc == RD_KAFKA_RESP_ERR_NO_ERROR) {
      producer->txn_unacked++;
      continue;
    }
    sent->reported = true; /* never produced: a failed report, and this transaction aborts too */
    memset(&sent->ack, 0, sizeof sent->ack);
    obx_err_from_kafka(&sent->ack.err, rc, "produce");
    producer_doom(producer, sent->ack.err.msg);
    producer_deliver(producer, sent);
  }
}

/* The open transaction is over (committed or aborted): the next one starts with what waited. */
static void producer_txn_over(obx_relay_producer_t *producer) {
  producer->in_txn = producer->doomed = false;
  producer->txn_unacked = 0;
  producer_txn_start(producer, list_take(&producer->deferred));
}

/* Ends the open transaction when it is due (force: now, flushing what is in flight): commit
 * once every record is acknowledged, or abort and produce the others again. A commit or abort
 * that fails retriably (Kafka unreachable) is tried again PRODUCER_TXN_RETRY_MS later. */
static void producer_txn_tick(obx_relay_producer_t *producer, bool force) {
  if (!producer->in_txn || producer->fatal) return;
  if (!force && obx_time_now_ms() < producer->txn_retry_ms) return;
  rd_kafka_error_t *e;
  obx_err_t err = OBX_ERR_INIT;
  if (!producer->doomed) {
    if (!force && producer->txn_unacked > 0) return;
    if (!(e = rd_kafka_commit_transaction(producer->rk, PRODUCER_TXN_CALL_MS))) {
      /* the next transaction starts before the reports go out: the caller sends from them */
      producer_sent_t *committed = list_take(&producer->txn);
      producer_txn_over(producer);
      producer_deliver_all(producer, committed, true, 0, NULL);
      return;
    }
    bool abort_it = rd_kafka_error_txn_requires_abort(e);
    producer_txn_error(producer, e, "commit_transaction", &err);
    if (producer->fatal) {
      producer_deliver_all(producer, list_take(&producer->txn), false, err.code, err.msg);
      return;
    }
    if (!abort_it) {
      obx_warn("kafka: %s (retrying)", err.msg);
      producer->txn_retry_ms = obx_time_now_ms() + PRODUCER_TXN_RETRY_MS;
      return;
    }
    producer_doom(producer, err.msg);
  }
  if ((e = rd_kafka_abort_transaction(producer->rk, PRODUCER_TXN_CALL_MS))) {
    producer_txn_error(producer, e, "abort_transaction", &err);
    if (producer->fatal) {
      producer_deliver_all(producer, list_take(&producer->txn), false, err.code, err.msg);
      return;
    }
    obx_warn("kafka: %s (retrying)", err.msg);
    producer->txn_retry_ms = obx_time_now_ms() + PRODUCER_TXN_RETRY_MS;
    return;
  }
  rd_kafka_flush(producer->rk, PRODUCER_TXN_CALL_MS); /* the purged reports of the aborted records */
  obx_warn("kafka transaction aborted (%s): its other records are produced again", producer->doom);
  producer_sent_t *again = list_take(&producer->txn);
  producer->in_txn = producer->doomed = false;
  producer->txn_unacked = 0;
  producer_txn_start(producer, again);
  if (!producer->in_txn) producer_txn_over(producer); /* nothing to produce again */
  else if (producer->deferred.head) {
    /* the deferred records follow in the same transaction */
    producer_sent_t *more = list_take(&producer->deferred);
    for (producer_sent_t *sent = more, *next; sent; sent = next) {
      next = sent->next;
      list_append(&producer->txn, sent);
      if (producer_produce(producer, sent) == RD_KAFKA_RESP_ERR_NO_ERROR) producer->txn_unacked++;
      else producer_doom(producer, "a deferred record was refused by produce"), sent->reported = true;
    }
  }
}

void obx_relay_producer_destroy(obx_relay_producer_t *producer) {
  if (!producer) return;
  rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  rd_kafka_flush(producer->rk, 5000);
  if (producer->in_txn && !producer->fatal) {
    /* the next leader's init_transactions would abort it anyway; without one, the coordinator
     * does after transaction.timeout.ms */
    rd_kafka_error_t *e = rd_kafka_abort_transaction(producer->rk, PRODUCER_TXN_CALL_MS);
    if (e) rd_kafka_error_destroy(e);
  }
  const char *why = "purged: the producer is destroyed";
  producer_deliver_all(producer, list_take(&producer->txn), false, RD_KAFKA_RESP_ERR__PURGE_QUEUE, why);
  producer_deliver_all(producer, list_take(&producer->deferred), false, RD_KAFKA_RESP_ERR__PURGE_QUEUE, why);
  rd_kafka_queue_destroy(producer->main);
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

static void *memdup(const void *p, size_t len) {
  void *copy = malloc(len ? len : 1);
  if (!copy) abort();
  if (len) memcpy(copy, p, len);
  return copy;
}

bool obx_relay_producer_send(obx_relay_producer_t *producer, const char *topic,
                             const obx_kafka_record_t *rec, void *opaque, obx_err_t *err) {
  if (producer->transactional && !producer->ready) {
    obx_err_set(err, OBX_ERR_KAFKA, RD_KAFKA_RESP_ERR__STATE, true, "the transactional producer is not fenced in yet");
    return false;
  }
  if (producer->transactional && producer->doomed) {
    obx_err_set(err, OBX_ERR_KAFKA, RD_KAFKA_RESP_ERR__STATE, true, "the Kafka transaction is being aborted: %s",
                producer->doom);
    return false;
  }
  producer_sent_t *sent = calloc(1, sizeof *sent);
  if (!sent) abort();
  sent->opaque = opaque;
  sent->span = producer_span(topic, rec);
  sent->topic = strdup(topic);
  sent->key = memdup(rec->key, rec->key_len);
  sent->key_len = rec->key_len;
  sent->value = memdup(rec->value, rec->value_len);
  sent->value_len = rec->value_len;
  char traceparent[OBX_TRACEPARENT_LEN + 1];
  obx_trace_format(obx_span_ctx(sent->span), traceparent);
  sent->headers = rd_kafka_headers_new((size_t)rec->nheaders + 1);
  for (int i = 0; i < rec->nheaders; i++)
    if (strcmp(rec->headers[i].name, "ce_traceparent") != 0)
      rd_kafka_header_add(sent->headers, rec->headers[i].name, -1, rec->headers[i].value, (ssize_t)rec->headers[i].len);
  rd_kafka_header_add(sent->headers, "ce_traceparent", -1, traceparent, -1);
  if (producer->transactional && producer->in_txn && obx_time_now_ms() - producer->txn_began_ms >= PRODUCER_TXN_MAX_MS) {
    list_append(&producer->deferred, sent); /* the open transaction is closing */
    producer->pending++;
    return true;
  }
  if (producer->transactional && !producer->in_txn) {
    rd_kafka_error_t *e = rd_kafka_begin_transaction(producer->rk);
    if (e) {
      producer_txn_error(producer, e, "begin_transaction", err);
      obx_span_set_error(sent->span, err->msg);
      obx_span_end(sent->span);
      sent_free(sent);
      return false;
    }
    producer->in_txn = true;
    producer->txn_began_ms = obx_time_now_ms();
  }
  rd_kafka_resp_err_t rc = producer_produce(producer, sent);
  if (rc != RD_KAFKA_RESP_ERR_NO_ERROR) {
    obx_err_from_kafka(err, rc, "produce");
    obx_span_set_error(sent->span, err->msg);
    obx_span_end(sent->span);
    sent_free(sent);
    if (rc == RD_KAFKA_RESP_ERR__FATAL) producer->fatal = true;
    return false;
  }
  producer->pending++;
  if (producer->transactional) {
    list_append(&producer->txn, sent);
    producer->txn_unacked++;
  }
  return true;
}

int obx_relay_producer_poll(obx_relay_producer_t *producer, int timeout_ms) {
  int served = rd_kafka_poll(producer->rk, timeout_ms);
  producer_txn_tick(producer, false);
  return served;
}

void obx_relay_producer_wake(obx_relay_producer_t *producer) {
  rd_kafka_queue_yield(producer->main); /* a poll that is not waiting now returns at once next time */
}

int obx_relay_producer_pending(const obx_relay_producer_t *producer) {
  return producer ? producer->pending : 0;
}

bool obx_relay_producer_flush(obx_relay_producer_t *producer, int timeout_ms) {
  if (!producer) return true;
  int64_t until = obx_time_now_ms() + timeout_ms;
  do {
    rd_kafka_flush(producer->rk, (int)(until - obx_time_now_ms() > 0 ? until - obx_time_now_ms() : 0));
    producer_txn_tick(producer, true);
  } while (producer->pending > 0 && !producer->fatal && obx_time_now_ms() < until);
  return producer->pending == 0;
}

bool obx_relay_producer_fatal(const obx_relay_producer_t *producer) {
  return producer && producer->fatal;
}

bool obx_relay_producer_gapless(const obx_relay_producer_t *producer) {
  return producer && producer->gapless;
}

bool obx_relay_producer_refused(const obx_relay_producer_t *producer, const obx_relay_ack_t *ack) {
  /* what the broker answers about the record or its topic: with the gap-less guarantee it is
   * also the cause of the fatal error (its report comes after the error), every other failure
   * of a fatal producer (purged, out of order, fenced) is its state, not the record's */
  static const rd_kafka_resp_err_t record_errors[] = {
    RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, RD_KAFKA_RESP_ERR_INVALID_RECORD, RD_KAFKA_RESP_ERR_INVALID_MSG,
    RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
    RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION, RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP,
    RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT, RD_KAFKA_RESP_ERR_POLICY_VIOLATION,
    RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS,
  };
  int code = ack->err.code;
  if (ack->ok || code == RD_KAFKA_RESP_ERR__PURGE_QUEUE || code == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT) return false;
  if (!obx_relay_producer_fatal(producer)) return true;
  for (size_t i = 0; i < sizeof record_errors / sizeof record_errors[0]; i++)
    if (code == (int)record_errors[i]) return true;
  return false;
}

bool obx_relay_producer_check(obx_relay_producer_t *producer, const char *topic, const char *brokers,
                              int timeout_ms, obx_err_t *err) {
  if (!producer) {
    obx_err_set(err, OBX_ERR_KAFKA, 0, true, "the Kafka producer is not created yet (it is when the bucket is taken)");
    return false;
  }
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
