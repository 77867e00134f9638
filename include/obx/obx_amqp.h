/* obx_amqp.h - opening AMQP connections (plain or TLS) with heartbeats
 *
 * DESIGN: the one place that turns an AMQP URL plus the amqp.* settings into a logged-in
 * rabbitmq-c connection. amqp:// opens a TCP socket; amqps:// a TLS socket that verifies the
 * server's certificate chain against amqp.ca_file (empty: the system bundle) and its host name
 * against the URL's host, and presents amqp.cert_file / amqp.key_file when set (mutual TLS).
 * Login is SASL PLAIN with the URL's user and password, negotiating amqp.heartbeat.
 *
 * Heartbeats: rabbitmq-c sends and checks heartbeats only inside its own calls on the
 * connection. A connection that is read continuously (a consumer waiting in
 * amqp_consume_message) is serviced by that wait; any other connection must be serviced at
 * least every heartbeat/2 seconds by its owner, or the broker closes it after two missed beats.
 * obx_amqp_service() is that servicing call; obx_amqp_keeper_t runs a caller's service function
 * on its own thread for owners that have no loop of their own (the API's ops routes).
 *
 * Never declares topology, never publishes or consumes: that belongs to ladder.c. */
#ifndef OBX_AMQP_H
#define OBX_AMQP_H

#include <stdbool.h>
#include "obx_conf.h"
#include "obx_err.h"

struct amqp_connection_state_t_;

/* Connection settings beyond the URL. Zero-initialised: heartbeat 30 s, the system CA bundle,
 * no client certificate, peer and host name verified. Strings are borrowed during obx_amqp_target_init. */
typedef struct {
  int heartbeat_s;          /* 0: 30; negative: heartbeats off */
  const char *ca_file;      /* PEM bundle trusted for amqps://; NULL/"": the system bundle */
  const char *cert_file;    /* PEM client certificate (mutual TLS); NULL/"": none */
  const char *key_file;     /* PEM private key of cert_file */
  bool no_verify_peer;      /* amqp.verify_peer=false: accept any server certificate */
  bool no_verify_hostname;  /* amqp.verify_hostname=false: accept a certificate for another name */
} obx_amqp_settings_t;

/* Fills settings from the amqp.* keys (borrowing conf's strings). */
void obx_amqp_settings_from_conf(obx_amqp_settings_t *settings, const obx_conf_t *conf);

/* A parsed URL plus settings: everything needed to open connections. Caller storage. */
typedef struct {
  char *url;                /* owned copy; `host`, `vhost`... point into it */
  char *host, *vhost, *user, *password;
  int port;
  bool tls;
  int heartbeat_s;          /* negotiated proposal; 0: off */
  char *ca_file, *cert_file, *key_file;
  bool verify_peer, verify_hostname;
} obx_amqp_target_t;

/* Parses url (amqp_parse_url syntax) and copies settings (NULL: defaults). Fails with
 * OBX_ERR_CONF on an empty or malformed URL, or on cert_file without key_file (or the reverse). */
bool obx_amqp_target_init(obx_amqp_target_t *target, const char *url, const obx_amqp_settings_t *settings,
                          obx_err_t *err);
void obx_amqp_target_cleanup(obx_amqp_target_t *target);

/* Opens a socket (TLS for amqps://), logs in (connection_name = name) and returns the
 * connection, or NULL with a retriable error for network, TLS-handshake and broker problems and
 * a non-retriable one for unreadable certificate files. timeout_ms bounds the connect, the
 * handshake and every later RPC on the connection. Owned: close with obx_amqp_close. */
struct amqp_connection_state_t_ *obx_amqp_open(const obx_amqp_target_t *target, const char *name, int timeout_ms,
                                               obx_err_t *err);
/* Sends connection.close (best effort) and frees. NULL is a no-op. */
void obx_amqp_close(struct amqp_connection_state_t_ *conn);
/* Services an idle connection without blocking: sends a heartbeat when due, reads what the
 * broker sent. Returns false when the connection is lost or the broker sent something an idle
 * connection never expects (a close); the caller then drops it. */
bool obx_amqp_service(struct amqp_connection_state_t_ *conn, obx_err_t *err);

/* Calls fn(ctx) every interval_ms on its own thread until stopped (first call after one interval).
 * fn must be safe to call concurrently with the owner's other calls (e.g. take the owner's lock). */
typedef void (*obx_amqp_service_fn)(void *ctx);
typedef struct obx_amqp_keeper obx_amqp_keeper_t;
obx_amqp_keeper_t *obx_amqp_keeper_start(obx_amqp_service_fn fn, void *ctx, int interval_ms);
/* Stops and joins the thread (returns within one call of fn); NULL is a no-op. */
void obx_amqp_keeper_stop(obx_amqp_keeper_t *keeper);
/* The keeper interval for a heartbeat: heartbeat/2 seconds, at least 500 ms; heartbeats off: 0. */
int obx_amqp_keeper_interval_ms(const obx_amqp_settings_t *settings);

#endif
