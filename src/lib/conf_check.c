/* conf_check.c - the start-up validation of a loaded configuration
 *
 * DESIGN: obx_conf_validate() is the one check outboxd runs after loading its configuration and
 * before starting anything, and the one `outboxctl conf check` runs: what one accepts, the
 * other accepts. obx_conf_set already checked each value's type and range; this checks what a
 * value means: required values present, addresses, URLs, names, files, the ladder's order, and
 * every kafka.* passthrough key against librdkafka. Where a module owns a parser (the API keys
 * file, the egress policy, the AMQP URL, the MongoDB URI, the HTTP bind address and CORS origins,
 * the orders' currency rule, librdkafka's properties) the check calls that parser, so the rules
 * live once. The first problem found stops the check with a
 * message naming the key, its value (secrets masked) and what is allowed. Never connects. */
#include <ctype.h>
#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <mongoc/mongoc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/obx_amqp.h"
#include "obx/obx_api.h"
#include "obx/obx_auth.h"
#include "obx/obx_http.h"
#include "obx/obx_conf.h"
#include "obx/obx_log.h"
#include "obx/obx_pipeline.h"

/* value: the raw value; shown: the same for messages (secrets masked). */
typedef bool (*check_fn)(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err);

static bool bad(obx_err_t *err, const char *key, const char *value, const char *allowed) {
  obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: %s", key, value, allowed);
  return false;
}

/* The same with the parser's own reason first. */
static bool bad_why(obx_err_t *err, const char *key, const char *value, const char *why, const char *allowed) {
  obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: %s; allowed: %s", key, value, why, allowed);
  return false;
}

/* A URL-valued secret is shown with its password masked; a value with no scheme and no userinfo
 * carries no credentials in URL form and is shown as it is, so the operator sees the typo. */
static const char *url_shown(const char *value, const char *shown) {
  return strstr(value, "://") || strpbrk(value, "@:") ? shown : value;
}

static bool check_mongo_uri(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  shown = url_shown(value, shown);
  bson_error_t berr;
  mongoc_uri_t *uri = mongoc_uri_new_with_error(conf->mongo_uri, &berr);
  if (uri) {
    mongoc_uri_destroy(uri);
    return true;
  }
  return bad_why(err, key, shown, berr.message,
                 "a MongoDB connection string mongodb://[user:pass@]host[:port][,host...]/?replicaSet=NAME or mongodb+srv://");
}

static bool check_mongo_db(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  if (strlen(value) > 63 || strpbrk(value, "/\\. \"$"))
    return bad(err, key, shown, "must be a MongoDB database name: at most 63 bytes, none of / \\ . space \" $");
  return true;
}

/* kafka.brokers: host:port entries, optionally with a PROTOCOL:// prefix as librdkafka allows. */
static bool check_brokers(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  static const char allowed[] = "must be a comma-separated list of host:port (port 1..65535), e.g. kafka-0:9092,kafka-1:9092";
  char *copy = strdup(value);
  bool ok = true;
  for (char *p = copy, *tok; ok && (tok = strsep(&p, ","));) {
    while (isspace((unsigned char)*tok)) tok++;
    char *scheme = strstr(tok, "://");
    if (scheme) tok = scheme + 3;
    char *colon = strrchr(tok, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    while (end && isspace((unsigned char)*end)) end++;
    if (!colon || colon == tok || !colon[1] || (end && *end) || port < 1 || port > 65535) ok = false;
  }
  free(copy);
  return ok || bad(err, key, shown, allowed);
}

static bool check_topic(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  bool ok = strlen(value) <= 249 && strcmp(value, ".") != 0 && strcmp(value, "..") != 0;
  for (const char *p = value; ok && *p; p++) ok = isalnum((unsigned char)*p) || strchr("._-", *p);
  return ok || bad(err, key, shown, "must be a Kafka topic name: 1..249 of [a-zA-Z0-9._-], not . or ..");
}

static bool check_amqp_url(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  shown = url_shown(value, shown);
  obx_amqp_settings_t settings;
  obx_amqp_settings_from_conf(&settings, conf);
  obx_amqp_target_t target;
  obx_err_t why = OBX_ERR_INIT;
  if (obx_amqp_target_init(&target, conf->amqp_url, &settings, &why)) {
    obx_amqp_target_cleanup(&target);
    return true;
  }
  return bad_why(err, key, shown, why.msg, "amqp://user:pass@host[:port]/vhost or amqps://... (vhost / is %2F)");
}

static bool check_heartbeat(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  if (conf->amqp_heartbeat % 1000 == 0) return true;
  return bad(err, key, shown, "must be whole seconds (AMQP heartbeats are negotiated in seconds), e.g. 30s; 0 turns them off");
}

static bool check_readable_file(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  if (access(value, R_OK) == 0) return true;
  return bad_why(err, key, shown, strerror(errno), "a readable PEM file, or empty");
}

/* http.bind: the HTTP server's own parser. */
static bool check_bind(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  struct sockaddr_storage addr;
  return obx_http_bind_parse(value, 0, &addr, err);
}

static bool check_keys_file(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  obx_err_t why = OBX_ERR_INIT;
  obx_auth_t *auth = obx_auth_load(value, &why);
  if (auth) {
    obx_auth_destroy(auth);
    return true;
  }
  return bad_why(err, key, shown, why.msg, "a readable file of '<sha256 hex> <orgId> <perm,...>' lines, or empty");
}

/* api.cors_origins: the HTTP server's own parser. */
static bool check_cors(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  char **origins;
  bool any;
  bool ok = obx_http_cors_parse(value, &origins, &any, err);
  obx_http_cors_free(origins);
  return ok;
}

/* api.default_currency: the orders' own rule. */
static bool check_currency(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  return obx_currency_valid(value) || bad(err, key, shown, "must be an ISO 4217 code in capitals, e.g. BRL, USD, EUR");
}

/* egress.allowlist and egress.allow_networks: the worker's own parser. */
static bool check_egress(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  obx_egress_t egress;
  obx_err_t why = OBX_ERR_INIT;
  if (obx_egress_init_conf(&egress, conf, &why)) {
    obx_egress_cleanup(&egress);
    return true;
  }
  return bad_why(err, key, shown, why.msg, "comma-separated CIDRs such as 10.0.0.0/8 or fd00::/8");
}

/* worker.queue_prefix: the start of AMQP queue and exchange names (short strings, no amq.). */
static bool check_queue_prefix(const obx_conf_t *conf, const char *key, const char *value, const char *shown, obx_err_t *err) {
  bool ok = strlen(value) <= 200 && strncmp(value, "amq.", 4) != 0;
  for (const char *p = value; ok && *p; p++) ok = isalnum((unsigned char)*p) || strchr("._-:", *p);
  return ok || bad(err, key, shown, "must be 1..200 of [a-zA-Z0-9._:-], not starting with amq. (RabbitMQ reserves it)");
}

static const struct {
  const char *key;
  check_fn check;
  bool required; /* empty is refused (never falls back to a default) */
} checks[] = {
  {"mongo.uri", check_mongo_uri, true},
  {"mongo.db", check_mongo_db, true},
  {"kafka.brokers", check_brokers, true},
  {"kafka.topic", check_topic, true},
  {"amqp.url", check_amqp_url, true},
  {"amqp.heartbeat", check_heartbeat, false},
  {"amqp.ca_file", check_readable_file, false},
  {"amqp.cert_file", check_readable_file, false},
  {"amqp.key_file", check_readable_file, false},
  {"http.bind", check_bind, true},
  {"api.keys_file", check_keys_file, false},
  {"api.cors_origins", check_cors, false},
  {"api.default_currency", check_currency, true},
  {"egress.allow_networks", check_egress, false},
  {"worker.group", NULL, true},
  {"worker.queue_prefix", check_queue_prefix, true},
};

/* kafka.* passthrough keys: librdkafka's own property table decides (unknown or bad value). */
static bool check_kafka_passthrough(const obx_conf_t *conf, obx_err_t *err) {
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  bool ok = true;
  for (int i = 0; ok && i < conf->npassthrough; i++) {
    const char *key = conf->passthrough[i].key;
    if (strncmp(key, "kafka.", 6) != 0) continue;
    char errstr[256];
    if (rd_kafka_conf_set(kc, key + 6, conf->passthrough[i].value, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
      char *shown = obx_conf_get_string(conf, key, false);
      ok = bad_why(err, key, shown ? shown : "", errstr,
                   "a librdkafka property after kafka. (CONFIGURATION.md), e.g. kafka.security.protocol=SASL_SSL");
      free(shown);
    }
  }
  rd_kafka_conf_destroy(kc);
  return ok;
}

/* The sink is open to anyone who can reach it unless a real token guards it. */
static bool check_sink_token(const obx_conf_t *conf, obx_err_t *err) {
  if (!conf->worker_enabled || strcmp(conf->worker_source, "http") != 0) return true;
  if (conf->worker_sink_token && strlen(conf->worker_sink_token) >= 16) return true;
  obx_err_set(err, OBX_ERR_CONF, 0, false,
              "worker.sink_token (SINK_TOKEN) is %s: WORKER_SOURCE=http needs a token of at least 16 characters "
              "(e.g. openssl rand -hex 32)", conf->worker_sink_token && conf->worker_sink_token[0] ? "too short" : "empty");
  return false;
}

bool obx_conf_validate(const obx_conf_t *conf, obx_err_t *err) {
  for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
    char *raw = obx_conf_get_string(conf, checks[i].key, true);
    char *shown = obx_conf_get_string(conf, checks[i].key, false);
    bool ok = true;
    if (!raw[0]) {
      if (checks[i].required) {
        const obx_conf_key_t *k = NULL;
        int n;
        const obx_conf_key_t *all = obx_conf_keys(&n);
        for (int j = 0; j < n; j++)
          if (strcmp(all[j].name, checks[i].key) == 0) k = &all[j];
        obx_err_set(err, OBX_ERR_CONF, 0, false, "%s (%s) is empty: a value is required (%s; default %s)",
                    checks[i].key, k ? k->env : "", k ? k->description : "", k ? k->def : "");
        ok = false;
      }
    } else if (checks[i].check) {
      ok = checks[i].check(conf, checks[i].key, raw, shown, err);
    }
    free(raw);
    free(shown);
    if (!ok) return false;
  }
  return check_sink_token(conf, err) && check_kafka_passthrough(conf, err);
}
