/* obx_conf.h - the configuration table
 *
 * DESIGN: every key is declared once, in OBX_CONF_KEYS below: struct field, type, dotted name,
 * environment variable, default, range (ints and durations) or allowed values (enums), flags
 * and description. The same table fills obx_conf_t, validates, and prints the documentation
 * (`outboxctl conf list`, README's configuration section).
 *
 * Sources, later wins: defaults -> file (`key = value` lines, dotted names or env names, `#`
 * comments) -> environment -> `-X key=value` overrides. Keys under `kafka.` that are not in the
 * table pass through untouched to librdkafka (obx_conf_t.passthrough); `amqp.*` keys are all in
 * the table (rabbitmq-c has no generic properties).
 * Durations accept `250ms`, `5s`, `2m`, `1h`, `7d`, or a bare number of milliseconds.
 * A bad key or value fails with a message naming the key, the value and what is allowed. */
#ifndef OBX_CONF_H
#define OBX_CONF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "obx_err.h"

typedef enum {
  OBX_CONF_STR,
  OBX_CONF_INT,
  OBX_CONF_BOOL,
  OBX_CONF_DURATION,      /* milliseconds */
  OBX_CONF_ENUM,          /* one of the '|'-separated values in `range` */
  OBX_CONF_DURATION_LIST, /* comma-separated durations, e.g. the retry ladder */
} obx_conf_type_t;

#define OBX_CONF_SENSITIVE 0x1 /* never printed or logged in clear */

#define OBX_CONF_MAX_LIST 16
typedef struct {
  int n;
  int64_t ms[OBX_CONF_MAX_LIST];
} obx_conf_durations_t;

/* X(field, TYPE, name, env, default, min, max, enum_values, flags, description)
 * min/max apply to INT and DURATION (DURATION bounds in ms; DURATION_LIST bounds apply to each
 * element); enum_values to ENUM. */
#define OBX_CONF_KEYS(X)                                                                          \
  X(mongo_uri, STR, "mongo.uri", "MONGO_URI", "mongodb://127.0.0.1:27017/?replicaSet=rs0", 0, 0, NULL, OBX_CONF_SENSITIVE, \
    "MongoDB connection string (replica set or sharded cluster; transactions and change streams are required)") \
  X(mongo_db, STR, "mongo.db", "MONGO_DB", "outboxd", 0, 0, NULL, 0,                              \
    "Database holding orders, outbox, inbox and the other collections")                          \
  X(mongo_commit_timeout, DURATION, "mongo.commit_timeout", "MONGO_COMMIT_TIMEOUT", "10s", 100, 600000, NULL, 0, \
    "maxCommitTimeMS of every transaction commit; a commit that cannot finish within it fails (POST /orders answers 503, nothing half-written)") \
  X(mongo_wtimeout, DURATION, "mongo.wtimeout", "MONGO_WTIMEOUT", "10s", 100, 600000, NULL, 0,    \
    "wtimeout of majority writes (transactions, the relay's lease and checkpoint): a replica set without a majority fails them instead of hanging") \
  X(kafka_brokers, STR, "kafka.brokers", "KAFKA_BROKERS", "127.0.0.1:9092", 0, 0, NULL, 0,        \
    "Kafka bootstrap servers (comma-separated host:port)")                                        \
  X(kafka_topic, STR, "kafka.topic", "KAFKA_TOPIC", "domain-events", 0, 0, NULL, 0,               \
    "Topic the relay publishes domain events to and the worker consumes")                        \
  X(amqp_url, STR, "amqp.url", "AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F", 0, 0, NULL, OBX_CONF_SENSITIVE, \
    "RabbitMQ URL for the retry ladder and the parking-lot DLQ (default vhost is %2F)")          \
  X(amqp_heartbeat, DURATION, "amqp.heartbeat", "AMQP_HEARTBEAT", "30s", 0, 600000, NULL, 0,         \
    "AMQP heartbeat proposed to RabbitMQ (whole seconds; 0: off); idle connections are serviced every half of it") \
  X(amqp_ca_file, STR, "amqp.ca_file", "AMQP_CA_FILE", "", 0, 0, NULL, 0,                         \
    "PEM CA bundle that verifies RabbitMQ's certificate for amqps:// URLs; empty: the system bundle") \
  X(amqp_cert_file, STR, "amqp.cert_file", "AMQP_CERT_FILE", "", 0, 0, NULL, 0,                   \
    "PEM client certificate presented to RabbitMQ (mutual TLS); needs amqp.key_file")            \
  X(amqp_key_file, STR, "amqp.key_file", "AMQP_KEY_FILE", "", 0, 0, NULL, OBX_CONF_SENSITIVE,     \
    "PEM private key of amqp.cert_file")                                                          \
  X(amqp_verify_peer, BOOL, "amqp.verify_peer", "AMQP_VERIFY_PEER", "true", 0, 0, NULL, 0,        \
    "Verify RabbitMQ's certificate chain (amqps://); false only for tests")                      \
  X(amqp_verify_hostname, BOOL, "amqp.verify_hostname", "AMQP_VERIFY_HOSTNAME", "true", 0, 0, NULL, 0, \
    "Verify that RabbitMQ's certificate names the URL's host (amqps://)")                         \
  X(http_port, INT, "http.port", "HTTP_PORT", "8080", 0, 65535, NULL, 0,                          \
    "Port of the HTTP API, /healthz, /readyz and /metrics; 0 picks a free port") \
  X(http_bind, STR, "http.bind", "HTTP_BIND", "0.0.0.0", 0, 0, NULL, 0,                           \
    "Address the HTTP server listens on")                                                         \
  X(http_max_body, INT, "http.max_body", "HTTP_MAX_BODY", "1048576", 1024, 67108864, NULL, 0,      \
    "Largest request body accepted, in bytes; larger ones get 413")                              \
  X(http_workers, INT, "http.workers", "HTTP_WORKERS", "16", 1, 1024, NULL, 0,                    \
    "Threads running request handlers (the connections themselves are served by one event thread)") \
  X(http_max_connections, INT, "http.max_connections", "HTTP_MAX_CONNECTIONS", "1024", 4, 100000, NULL, 0, \
    "Open HTTP connections at most; more are closed at accept")                                  \
  X(http_max_connections_per_client, INT, "http.max_connections_per_client", "HTTP_MAX_CONNECTIONS_PER_CLIENT", "64", 1, 100000, NULL, 0, \
    "Open HTTP connections at most from one client address; more are closed at accept")        \
  X(http_header_timeout, DURATION, "http.header_timeout", "HTTP_HEADER_TIMEOUT", "10s", 100, 600000, NULL, 0, \
    "Time a connection has to send a request's headers (from its accept or its previous response); then it is closed") \
  X(http_idle_timeout, DURATION, "http.idle_timeout", "HTTP_IDLE_TIMEOUT", "60s", 1000, 3600000, NULL, 0, \
    "A connection with no traffic for this long is closed (whole seconds)")                     \
  X(api_keys_file, STR, "api.keys_file", "API_KEYS_FILE", "", 0, 0, NULL, 0,                      \
    "API keys file: lines '<sha256 hex of key> <orgId> <perm,...> [<name>]' (outboxctl apikey new); empty: no keys") \
  X(api_keys_refresh, DURATION, "api.keys_refresh", "API_KEYS_REFRESH", "30s", 100, 86400000, NULL, 0, \
    "How often the api_keys collection is read again (its keys join API_KEYS_FILE's; disabled or removed ones stop working)") \
  X(api_rate_limit, INT, "api.rate_limit", "API_RATE_LIMIT", "0", 0, 1000000, NULL, 0,             \
    "Requests per second allowed per API key (bursts of twice that; more get 429); 0: unlimited") \
  X(api_request_timeout, DURATION, "api.request_timeout", "API_REQUEST_TIMEOUT", "5s", 100, 120000, NULL, 0, \
    "Deadline of one API request's MongoDB work (server selection, socket, maxTimeMS, commit); past it: 503, transaction aborted") \
  X(api_cors_origins, STR, "api.cors_origins", "API_CORS_ORIGINS", "", 0, 0, NULL, 0,             \
    "Browser origins allowed by CORS (comma-separated, e.g. https://app.example.com; * allows any); empty: CORS off") \
  X(order_currency, STR, "api.default_currency", "ORDER_DEFAULT_CURRENCY", "BRL", 0, 0, NULL, 0,   \
    "ISO 4217 currency of orders that do not name one")                                          \
  X(api_enabled, BOOL, "api.enabled", "API_ENABLED", "true", 0, 0, NULL, 0,                       \
    "Run the api role in this process")                                                           \
  X(relay_enabled, BOOL, "relay.enabled", "OUTBOX_RELAY_ENABLED", "true", 0, 0, NULL, 0,          \
    "Run the relay role in this process")                                                         \
  X(worker_enabled, BOOL, "worker.enabled", "WORKER_ENABLED", "true", 0, 0, NULL, 0,              \
    "Run the worker role in this process")                                                        \
  X(relay_mode, ENUM, "relay.mode", "RELAY_MODE", "stream", 0, 0, "stream|poll", 0,               \
    "stream: change stream plus sweeper; poll: the sweeper alone with leased claims")            \
  X(relay_lease, DURATION, "relay.lease", "RELAY_LEASE", "10s", 1000, 600000, NULL, 0,             \
    "Lease of the publishing relay (one leader in either mode); a standby takes over within it")   \
  X(relay_buckets, INT, "relay.buckets", "RELAY_BUCKETS", "1", 1, 1024, NULL, 0,                 \
    "Buckets of the outbox (murmur2(partitionKey) mod B): relays share them through per-bucket leases; " \
    "fixed per deployment, the same for every writer and relay")                                 \
  X(relay_max_inflight, INT, "relay.max_inflight", "RELAY_MAX_INFLIGHT", "1000", 1, 100000, NULL, 0, \
    "Events produced and not yet acknowledged by Kafka; the stream is not read beyond it")      \
  X(relay_key_window, INT, "relay.key_window", "RELAY_KEY_WINDOW", "1", 1, 64, NULL, 0,            \
    "Events of one partition key in flight at once while the producer has the gap-less guarantee " \
    "(idempotent, no kafka.message.timeout.ms); else 1")                                         \
  X(relay_fencing, ENUM, "relay.fencing", "RELAY_FENCING", "lease", 0, 0, "lease|transactions", 0, \
    "lease: a deposed leader stops at its next lease check; transactions: Kafka fences it (README: zombie fencing)") \
  X(relay_transactional_id, STR, "relay.transactional_id", "RELAY_TRANSACTIONAL_ID", "", 0, 0, NULL, 0, \
    "Kafka transactional.id prefix with relay.fencing=transactions (+ \"-<bucket>\"); empty: outboxd-<mongo.db>-<kafka.topic>") \
  X(relay_checkpoint_interval, DURATION, "relay.checkpoint_interval", "RELAY_CHECKPOINT_INTERVAL", "1s", 10, 600000, NULL, 0, \
    "How often the relay writes its resume-token checkpoint (and PUBLISHED marks at the latest)") \
  X(outbox_poll_interval, DURATION, "outbox.poll_interval", "OUTBOX_POLL_INTERVAL_MS", "2000", 10, 3600000, NULL, 0, \
    "Interval of the sweeper that publishes PENDING events the stream missed")                   \
  X(outbox_batch_size, INT, "outbox.batch_size", "OUTBOX_BATCH_SIZE", "50", 1, 10000, NULL, 0,    \
    "Events claimed per sweep")                                                                   \
  X(outbox_max_attempts, INT, "outbox.max_attempts", "OUTBOX_MAX_ATTEMPTS", "10", 1, 1000, NULL, 0, \
    "Publish attempts before an outbox event becomes FAILED")                                    \
  X(outbox_retention, DURATION, "outbox.retention", "OUTBOX_RETENTION", "7d", 1000, 31536000000LL, NULL, 0, \
    "How long PUBLISHED outbox documents are kept for audit (partial TTL index)")                \
  X(inbox_retention, DURATION, "inbox.retention", "INBOX_RETENTION", "7d", 1000, 31536000000LL, NULL, 0, \
    "How long finished inbox entries are kept (TTL on processedAt)")                             \
  X(order_post_attempts, INT, "worker.attempts", "ORDER_POST_ATTEMPTS", "5", 1, 100, NULL, 0,     \
    "Pipeline attempts per event before it is parked in the DLQ")                                \
  X(order_post_concurrency, INT, "worker.concurrency", "ORDER_POST_CONCURRENCY", "4", 1, 256, NULL, 0, \
    "Runner threads of one worker: events of different keys in parallel (an event waiting for an http-request call holds none)") \
  X(worker_max_inflight, INT, "worker.max_inflight", "WORKER_MAX_INFLIGHT", "200", 1, 1000000, NULL, 0, \
    "Events one worker holds at most (queued, running or waiting for an http-request call; all keys); past it the Kafka partitions are held (not read). Events whose outcome is being written count apart, up to as many again") \
  X(worker_lease, DURATION, "worker.lease", "WORKER_LEASE", "10s", 1000, 3600000, NULL, 0, \
    "Lease of an inbox claim; renewed every third of it while the event runs, taken over by a peer once expired") \
  X(worker_gap_wait, DURATION, "worker.gap_wait", "WORKER_GAP_WAIT", "30s", 0, 3600000, NULL, 0, \
    "Longest wait of a Kafka record for its key's earlier keySeq to settle in the inbox (a key read from two partitions after the topic grew); then it runs with a warning; 0: no wait") \
  X(worker_infra_attempts, INT, "worker.infra_attempts", "WORKER_INFRA_ATTEMPTS", "30", 1, 1000, NULL, 0, \
    "Tries of one step of an event while MongoDB or RabbitMQ is unavailable, before it is dead-lettered (class infra)") \
  X(worker_infra_timeout, DURATION, "worker.infra_timeout", "WORKER_INFRA_TIMEOUT", "5m", 100, 86400000, NULL, 0, \
    "Longest time one step of an event is retried while MongoDB or RabbitMQ is unavailable") \
  X(retry_ladder, DURATION_LIST, "worker.retry_ladder", "RETRY_LADDER", "5s,30s,2m,10m", 10, 86400000, NULL, 0, \
    "Delays of the RabbitMQ retry tiers (one TTL queue per tier)")                               \
  X(worker_retry_grace, DURATION, "worker.retry_grace", "WORKER_RETRY_GRACE", "30s", 100, 86400000, NULL, 0, \
    "How long past its tier's delay a retry may stay missing from the work queue before the worker republishes it there (README: retry sweep)") \
  X(worker_source, ENUM, "worker.source", "WORKER_SOURCE", "kafka", 0, 0, "kafka|http", 0,         \
    "kafka: consumer group on KAFKA_TOPIC; http: CloudEvents HTTP sink (Knative)")               \
  X(worker_sink_port, INT, "worker.sink_port", "SINK_PORT", "8081", 0, 65535, NULL, 0,             \
    "Port of the CloudEvents sink (WORKER_SOURCE=http), a listener of its own on http.bind; 0 picks a free port") \
  X(worker_sink_token, STR, "worker.sink_token", "SINK_TOKEN", "", 0, 0, NULL, OBX_CONF_SENSITIVE, \
    "Shared token every sink request must carry (Authorization: Bearer, or Basic's password); required, 16+ characters, with WORKER_SOURCE=http") \
  X(worker_group, STR, "worker.group", "WORKER_GROUP", "outboxd-worker", 0, 0, NULL, 0,          \
    "Kafka consumer group of the worker; also the inbox consumer name")                           \
  X(worker_instance_id, STR, "worker.instance_id", "WORKER_INSTANCE_ID", "", 0, 0, NULL, 0,        \
    "Kafka static membership (group.instance.id), e.g. the pod name: a restarted worker gets its partitions back without a rebalance") \
  X(worker_queue_prefix, STR, "worker.queue_prefix", "WORKER_QUEUE_PREFIX", "outboxd", 0, 0, NULL, 0, \
    "Prefix of the RabbitMQ names: <prefix>.retry exchange, <prefix>.retry.<delay> tiers, <prefix>.work, <prefix>.dlq") \
  X(worker_dlq_drain, BOOL, "worker.dlq_drain", "WORKER_DLQ_DRAIN", "true", 0, 0, NULL, 0,         \
    "Move the parking-lot queue's messages into the dead_letters collection, where operators read and redrive them") \
  X(egress_allowlist, STR, "egress.allowlist", "EGRESS_ALLOWLIST", "", 0, 0, NULL, 0,             \
    "Hosts http-request nodes may call (comma-separated, *.example.com for subdomains); empty: none unless egress.allow_public") \
  X(egress_allow_public, BOOL, "egress.allow_public", "EGRESS_ALLOW_PUBLIC", "false", 0, 0, NULL, 0, \
    "With an empty egress.allowlist, let http-request nodes call any public host (non-public addresses stay refused)") \
  X(egress_allow_networks, STR, "egress.allow_networks", "EGRESS_ALLOW_NETWORKS", "", 0, 0, NULL, 0, \
    "Non-public networks http-request nodes may reach anyway (CIDRs, e.g. 127.0.0.0/8 for local tests)") \
  X(http_connect_timeout, DURATION, "egress.connect_timeout", "HTTP_CONNECT_TIMEOUT_MS", "2000", 10, 60000, NULL, 0, \
    "Connect timeout of http-request nodes")                                                      \
  X(http_timeout, DURATION, "egress.timeout", "HTTP_TIMEOUT_MS", "5000", 10, 300000, NULL, 0,     \
    "Total time limit of one http-request call (connect, send, receive)")                        \
  X(http_max_response_bytes, INT, "egress.max_response_bytes", "HTTP_MAX_RESPONSE_BYTES", "1048576", 1, 67108864, NULL, 0, \
    "Largest response body an http-request node accepts")                                        \
  X(egress_ca_file, STR, "egress.ca_file", "EGRESS_CA_FILE", "", 0, 0, NULL, 0,                   \
    "CA bundle http-request nodes trust instead of the system one; empty: the system bundle")   \
  X(pipelines_dir, STR, "pipelines.dir", "PIPELINES_DIR", "", 0, 0, NULL, 0,                      \
    "Directory of pipeline definitions (*.json) applied at start; empty: none")                  \
  X(pipeline_cache_ttl, DURATION, "pipelines.cache_ttl", "PIPELINES_CACHE_TTL", "1s", 0, 60000, NULL, 0, \
    "How long the api caches an org's order.pre pipeline (or its absence); this process's own saves apply at once, other processes' within the TTL; 0: no cache") \
  X(shutdown_grace, DURATION, "shutdown.grace", "SHUTDOWN_GRACE", "20s", 1000, 3600000, NULL, 0,     \
    "Longest SIGTERM-to-exit: roles still stopping then are abandoned (exit 3; their work is redelivered); keep it below the pod's terminationGracePeriodSeconds minus preStop") \
  X(health_stall_timeout, DURATION, "health.stall_timeout", "HEALTH_STALL_TIMEOUT", "10m", 500, 86400000, NULL, 0, \
    "GET /healthz answers 503 once a busy loop (relay, worker Kafka poll / work queue / runners, HTTP handlers and event loops) made no progress for this long; above every bounded blocking call (MongoDB's 5-minute socket timeout, egress.timeout)") \
  X(log_level, ENUM, "log.level", "LOG_LEVEL", "info", 0, 0, "debug|info|warn|error", 0,           \
    "Lowest level written to the log")

#define OBX_CONF_CTYPE_STR char *
#define OBX_CONF_CTYPE_INT int64_t
#define OBX_CONF_CTYPE_BOOL bool
#define OBX_CONF_CTYPE_DURATION int64_t
#define OBX_CONF_CTYPE_ENUM char *
#define OBX_CONF_CTYPE_DURATION_LIST obx_conf_durations_t

typedef struct {
  char *key;   /* full dotted key, e.g. "kafka.linger.ms" */
  char *value;
} obx_conf_pair_t;

typedef struct {
#define OBX_CONF_FIELD_(field, TYPE, ...) OBX_CONF_CTYPE_##TYPE field;
  OBX_CONF_KEYS(OBX_CONF_FIELD_)
#undef OBX_CONF_FIELD_
  obx_conf_pair_t *passthrough; /* kafka.* keys not in the table */
  int npassthrough;
} obx_conf_t;

/* Static description of one key, as declared in OBX_CONF_KEYS. */
typedef struct {
  const char *name, *env, *def, *enum_values, *description;
  obx_conf_type_t type;
  int64_t min, max;
  int flags;
} obx_conf_key_t;

/* The table; *n receives its length. */
const obx_conf_key_t *obx_conf_keys(int *n);

/* Fills conf with the defaults. conf is caller storage; free with obx_conf_cleanup. */
void obx_conf_init(obx_conf_t *conf);
void obx_conf_cleanup(obx_conf_t *conf);
/* Sets one key by dotted name or env name from a string, validating it. */
bool obx_conf_set(obx_conf_t *conf, const char *key, const char *value, obx_err_t *err);
/* Reads `key = value` lines; a missing file is an error only when required. */
bool obx_conf_load_file(obx_conf_t *conf, const char *path, bool required, obx_err_t *err);
/* Applies every table key whose env variable is set (envp NULL: the process environment). */
bool obx_conf_load_env(obx_conf_t *conf, char *const *envp, obx_err_t *err);
/* The whole order: defaults -> file (if path) -> env -> overrides ("key=value" strings).
 * conf must be initialised (obx_conf_init); it is reset to the defaults first. Clean it up
 * whatever the result. */
bool obx_conf_load(obx_conf_t *conf, const char *file, char *const *envp,
                   char *const *overrides, int noverrides, obx_err_t *err);
/* The start-up validation (src/lib/conf_check.c): what the values mean beyond their type and
 * range (required values, addresses, URLs, names, readable files, the ladder's order, kafka.*
 * keys librdkafka knows). outboxd runs it before starting anything; `outboxctl conf check` runs
 * the same. The message names the key, the value (secrets masked) and what is allowed. */
bool obx_conf_validate(const obx_conf_t *conf, obx_err_t *err);
/* Current value of a key as text (sensitive values redacted unless reveal); caller frees. */
char *obx_conf_get_string(const obx_conf_t *conf, const char *key, bool reveal);
/* Documentation: format "text" (aligned table) or "markdown" (README table). */
void obx_conf_print_doc(FILE *out, const char *format);
/* Effective values, one `name = value` per line, secrets redacted. */
void obx_conf_print_values(const obx_conf_t *conf, FILE *out);
/* Parse helpers shared with other modules. */
bool obx_conf_parse_duration(const char *s, int64_t *ms);

#endif
