/* amqp_conn.c - opening AMQP connections (TCP or TLS), heartbeats and their servicing
 *
 * DESIGN: see include/obx/obx_amqp.h. Owns the URL parsing, the socket choice (amqp_tcp_socket
 * or amqp_ssl_socket with the CA, client certificate and verification settings), the login with
 * the negotiated heartbeat, and the keeper thread that services idle connections. Never declares
 * topology, publishes or consumes (ladder.c does). Reads amqp.* config keys. */
#include "obx/obx_amqp.h"
#include "obx/obx_event.h"

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_HEARTBEAT_S 30
#define FRAME_MAX 131072
/* Debian's system bundle (ca-certificates); the image ships it at the same path. */
#define SYSTEM_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"

static char *dup_or_null(const char *s) {
  if (!s || !s[0]) return NULL;
  char *d = strdup(s);
  assert(d);
  return d;
}

void obx_amqp_settings_from_conf(obx_amqp_settings_t *settings, const obx_conf_t *conf) {
  memset(settings, 0, sizeof *settings);
  int64_t hb = conf->amqp_heartbeat / 1000;
  settings->heartbeat_s = hb <= 0 ? -1 : (int)hb;
  settings->ca_file = conf->amqp_ca_file;
  settings->cert_file = conf->amqp_cert_file;
  settings->key_file = conf->amqp_key_file;
  settings->no_verify_peer = !conf->amqp_verify_peer;
  settings->no_verify_hostname = !conf->amqp_verify_hostname;
}

bool obx_amqp_target_init(obx_amqp_target_t *target, const char *url, const obx_amqp_settings_t *settings,
                          obx_err_t *err) {
  memset(target, 0, sizeof *target);
  obx_amqp_settings_t defaults;
  memset(&defaults, 0, sizeof defaults);
  if (!settings) settings = &defaults;
  if (!url || !url[0]) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "AMQP_URL is empty");
    return false;
  }
  bool has_cert = settings->cert_file && settings->cert_file[0];
  bool has_key = settings->key_file && settings->key_file[0];
  if (has_cert != has_key) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "amqp.cert_file and amqp.key_file go together (one is set, not both)");
    return false;
  }
  target->url = strdup(url);
  assert(target->url);
  struct amqp_connection_info info;
  amqp_default_connection_info(&info);
  int rc = amqp_parse_url(target->url, &info);
  if (rc != AMQP_STATUS_OK) {
    obx_err_set(err, OBX_ERR_CONF, rc, false, "AMQP_URL is not a valid amqp:// or amqps:// URL");
    obx_amqp_target_cleanup(target);
    return false;
  }
  target->host = info.host;
  target->vhost = info.vhost;
  target->user = info.user;
  target->password = info.password;
  target->port = info.port;
  target->tls = info.ssl != 0;
  target->heartbeat_s = settings->heartbeat_s < 0 ? 0 : settings->heartbeat_s ? settings->heartbeat_s : DEFAULT_HEARTBEAT_S;
  target->ca_file = dup_or_null(settings->ca_file);
  target->cert_file = dup_or_null(settings->cert_file);
  target->key_file = dup_or_null(settings->key_file);
  target->verify_peer = !settings->no_verify_peer;
  target->verify_hostname = !settings->no_verify_hostname;
  return true;
}

void obx_amqp_target_cleanup(obx_amqp_target_t *target) {
  if (!target) return;
  free(target->url);
  free(target->ca_file);
  free(target->cert_file);
  free(target->key_file);
  memset(target, 0, sizeof *target);
}

/* Configures a TLS socket; false (non-retriable) when a file cannot be loaded. */
static bool tls_configure(amqp_socket_t *sock, const obx_amqp_target_t *t, obx_err_t *err) {
  amqp_ssl_socket_set_verify_peer(sock, t->verify_peer);
  amqp_ssl_socket_set_verify_hostname(sock, t->verify_hostname);
  const char *ca = t->ca_file ? t->ca_file : SYSTEM_CA_BUNDLE;
  if (t->verify_peer || t->ca_file) {
    int rc = amqp_ssl_socket_set_cacert(sock, ca);
    if (rc != AMQP_STATUS_OK) {
      obx_err_set(err, OBX_ERR_CONF, rc, false, "amqp.ca_file: cannot load the CA bundle %s (%s)", ca,
                  amqp_error_string2(rc));
      return false;
    }
  }
  if (t->cert_file) {
    int rc = amqp_ssl_socket_set_key(sock, t->cert_file, t->key_file);
    if (rc != AMQP_STATUS_OK) {
      obx_err_set(err, OBX_ERR_CONF, rc, false,
                  "amqp.cert_file/amqp.key_file: cannot load the client certificate %s with key %s (%s)", t->cert_file,
                  t->key_file, amqp_error_string2(rc));
      return false;
    }
  }
  return true;
}

amqp_connection_state_t obx_amqp_open(const obx_amqp_target_t *target, const char *name, int timeout_ms,
                                      obx_err_t *err) {
  bool ok = false;
  amqp_connection_state_t conn = amqp_new_connection();
  assert(conn);
  amqp_socket_t *sock = target->tls ? amqp_ssl_socket_new(conn) : amqp_tcp_socket_new(conn);
  if (!sock) {
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_NO_MEMORY, false, "cannot create the AMQP socket");
    goto done;
  }
  if (target->tls && !tls_configure(sock, target, err)) goto done;
  if (timeout_ms <= 0) timeout_ms = 5000;
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  int rc = amqp_socket_open_noblock(sock, target->host, target->port, &tv);
  char where[320]; /* every connection error names the broker it tried */
  snprintf(where, sizeof where, "connecting to RabbitMQ at %s:%d%s", target->host, target->port,
           target->tls ? " over TLS" : "");
  if (rc != AMQP_STATUS_OK) {
    obx_err_from_amqp_status(err, rc, where);
    /* a refused certificate is a connection problem like any other: the broker's certificate
     * or the mounted CA may change, and nothing about the message is wrong */
    if (err) err->retriable = true;
    goto done;
  }
  amqp_set_handshake_timeout(conn, &tv);
  amqp_set_rpc_timeout(conn, &tv);
  amqp_table_entry_t props[1];
  props[0].key = amqp_cstring_bytes("connection_name");
  props[0].value.kind = AMQP_FIELD_KIND_UTF8;
  props[0].value.value.bytes = amqp_cstring_bytes(name ? name : "outboxd");
  amqp_table_t ptable = {1, props};
  amqp_rpc_reply_t r = amqp_login_with_properties(conn, target->vhost, 0, FRAME_MAX, target->heartbeat_s, &ptable,
                                                  AMQP_SASL_METHOD_PLAIN, target->user, target->password);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    snprintf(where, sizeof where, "RabbitMQ login at %s:%d (vhost %s)", target->host, target->port, target->vhost);
    obx_err_from_amqp(err, &r, where);
    goto done;
  }
  ok = true;
done:
  if (!ok) {
    amqp_destroy_connection(conn);
    return NULL;
  }
  return conn;
}

void obx_amqp_close(amqp_connection_state_t conn) {
  if (!conn) return;
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
}

bool obx_amqp_service(amqp_connection_state_t conn, obx_err_t *err) {
  struct timeval zero = {0, 0};
  amqp_frame_t frame;
  int rc = amqp_simple_wait_frame_noblock(conn, &frame, &zero);
  if (rc == AMQP_STATUS_TIMEOUT) return true; /* nothing to read; a due heartbeat was sent */
  if (rc == AMQP_STATUS_OK)
    obx_err_set(err, OBX_ERR_AMQP, AMQP_STATUS_UNEXPECTED_STATE, true,
                "RabbitMQ sent an unexpected frame on an idle connection (a close)");
  else
    obx_err_from_amqp_status(err, rc, "servicing the RabbitMQ connection");
  return false;
}

/* ---- keeper ------------------------------------------------------------------------------- */

struct obx_amqp_keeper {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;
  int interval_ms;
  obx_amqp_service_fn fn;
  void *ctx;
};

static void *keeper_main(void *arg) {
  obx_amqp_keeper_t *k = arg;
  pthread_mutex_lock(&k->mu);
  while (!k->stop) {
    struct timespec until = obx_time_deadline(CLOCK_MONOTONIC, k->interval_ms);
    int rc = 0;
    while (!k->stop && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&k->cv, &k->mu, &until);
    if (k->stop) break;
    pthread_mutex_unlock(&k->mu);
    k->fn(k->ctx);
    pthread_mutex_lock(&k->mu);
  }
  pthread_mutex_unlock(&k->mu);
  return NULL;
}

obx_amqp_keeper_t *obx_amqp_keeper_start(obx_amqp_service_fn fn, void *ctx, int interval_ms) {
  obx_amqp_keeper_t *k = calloc(1, sizeof *k);
  assert(k && fn && interval_ms > 0);
  k->fn = fn;
  k->ctx = ctx;
  k->interval_ms = interval_ms;
  pthread_mutex_init(&k->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&k->cv, &ca);
  pthread_condattr_destroy(&ca);
  int rc = pthread_create(&k->thread, NULL, keeper_main, k);
  assert(rc == 0);
  (void)rc;
  return k;
}

void obx_amqp_keeper_stop(obx_amqp_keeper_t *keeper) {
  if (!keeper) return;
  pthread_mutex_lock(&keeper->mu);
  keeper->stop = true;
  pthread_cond_signal(&keeper->cv);
  pthread_mutex_unlock(&keeper->mu);
  pthread_join(keeper->thread, NULL);
  pthread_cond_destroy(&keeper->cv);
  pthread_mutex_destroy(&keeper->mu);
  free(keeper);
}

int obx_amqp_keeper_interval_ms(const obx_amqp_settings_t *settings) {
  int hb = settings && settings->heartbeat_s ? settings->heartbeat_s : DEFAULT_HEARTBEAT_S;
  if (hb < 0) return 0;
  int ms = hb * 500;
  return ms < 500 ? 500 : ms;
}
