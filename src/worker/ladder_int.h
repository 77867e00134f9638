/* ladder_int.h - private interface between the ladder's files
 *
 * DESIGN: ladder.c the publisher (obx_ladder_t: retry tiers, work queue, DLQ publishes, the
 * envelope's AMQP form on publish); ladder_conn.c a connection's names, open, topology and
 * backoff; ladder_consumer.c the consumers and the decoding of a delivery; ladder_dlq.c the
 * operator's DLQ walk. The envelope itself is src/lib/envelope.c's. */
#ifndef OBX_LADDER_INT_H
#define OBX_LADDER_INT_H

#include <amqp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "obx/obx_amqp.h"
#include "obx/obx_ladder.h"

#define CH_PUBLISH 1
#define CH_BROWSE 2
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 10000

typedef struct {
  obx_amqp_target_t target;     /* URL, TLS and heartbeat settings (amqp_conn.c) */
  char *exchange, *work, *dlq;
  char **tier_queues;
  int64_t *tiers_ms;
  int ntiers;
  int confirm_timeout_ms;
} names_t;

typedef struct {
  amqp_connection_state_t conn; /* NULL: disconnected */
  int64_t next_try_ms;          /* monotonic; earliest reconnect */
  int64_t backoff_ms;
  uint64_t epoch;               /* bumped on each successful connect */
  uint64_t publish_seq;         /* delivery tag of the last publish on CH_PUBLISH */
} conn_t;

struct obx_ladder {
  pthread_mutex_t mu;
  names_t names;
  conn_t c;
  int64_t last_warn_ms; /* tick's reconnect warnings: at most one per 30 s */
};

/* ---- connections (ladder_conn.c) ------------------------------------------------------------ */
bool ladder_names_init(names_t *n, const obx_ladder_opts_t *opts, obx_err_t *err);
void ladder_names_cleanup(names_t *n);
/* True when the last RPC on conn succeeded; else err from its reply. */
bool ladder_rpc_ok(amqp_connection_state_t conn, const char *what, obx_err_t *err);
/* Closes c's connection (if open) and arms the reconnect backoff. */
void ladder_conn_drop(conn_t *c);
/* Opens c (respecting the backoff), logs in as `name` and declares the topology of n. */
bool ladder_conn_open(conn_t *c, const names_t *n, const char *name, obx_err_t *err);
amqp_table_entry_t ladder_arg_str(const char *key, const char *value);

/* ---- the publisher (ladder.c) --------------------------------------------------------------- */
/* Opens the publisher's connection in confirm mode when it is not open. Call with ladder->mu held. */
bool ladder_open(obx_ladder_t *ladder, obx_err_t *err);
/* Publishes msg on CH_PUBLISH and waits for its confirm. c->conn must be open. */
bool ladder_publish_confirmed(conn_t *c, const names_t *n, const char *exchange, const char *routing_key,
                              const obx_envelope_t *msg, const char *redriven_at, obx_err_t *err);

/* ---- decoding a delivery (ladder_consumer.c) ------------------------------------------------ */
/* Fills msg (after init) from an AMQP delivery's properties and body. */
void ladder_envelope_from_amqp(obx_envelope_t *msg, const amqp_basic_properties_t *p, amqp_bytes_t body);
/* Reads the content that follows a basic.deliver, basic.get-ok or basic.return on channel: its
 * properties as decoded from the header frame (*props, valid until the channel's buffers are
 * released; a header with an empty name is kept, which amqp_read_message refuses) and its body
 * (*body, amqp_bytes_free it). False with err when the frames are not a message's. */
bool ladder_read_content(amqp_connection_state_t conn, amqp_channel_t channel, const amqp_basic_properties_t **props,
                         amqp_bytes_t *body, obx_err_t *err);

#endif
