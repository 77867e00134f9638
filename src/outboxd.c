/* outboxd.c - the outboxd daemon
 *
 * NAME
 *   outboxd - transactional outbox daemon for MongoDB services
 *
 * SYNOPSIS
 *   outboxd [--roles api,relay,worker] [-c FILE] [-X key=value]... [--help] [--version]
 *
 * DESCRIPTION
 *   Runs any combination of the roles of DESIGN.md §1 in one process, on one HTTP server:
 *     api     POST /orders and the operators' API; writes orders and outbox events in one
 *             MongoDB transaction
 *     relay   publishes PENDING outbox events to Kafka
 *     worker  consumes domain events, runs pipelines, retries through RabbitMQ
 *   The HTTP server always runs: GET /healthz (every loop makes progress), /readyz (MongoDB
 *   reachable and what each role needs), /metrics.
 *   outboxd starts while MongoDB, Kafka or RabbitMQ are down and catches up when they return.
 *
 * OPTIONS
 *   --roles LIST   comma-separated roles to run; overrides API_ENABLED,
 *                  OUTBOX_RELAY_ENABLED and WORKER_ENABLED
 *   -c FILE        configuration file (`key = value` lines); must exist when given
 *   -X key=value   set one configuration key (dotted or environment name); repeatable
 *   -h, --help     print this help and exit
 *
 * CONFIGURATION
 *   Defaults, then FILE, then the environment, then -X (later wins); `outboxctl conf list`
 *   prints every key. A bad key or value stops the start with a message naming it; the
 *   start-up validation (obx_conf_validate) is the one `outboxctl conf check` runs.
 *
 * SIGNALS
 *   SIGTERM, SIGINT: stop intake (the HTTP server), stop the roles in reverse start order
 *   (each finishes or hands back its in-flight work), exit 0. The whole stop is bounded by
 *   shutdown.grace: when a stop hangs (a paused MongoDB, a broker that does not answer) the
 *   process logs the stage it was in and exits 3 when the grace runs out; a second SIGTERM or
 *   SIGINT during the stop exits 3 at once. Nothing is lost either way: unpublished outbox
 *   events stay PENDING, uncommitted Kafka offsets and unacknowledged RabbitMQ messages are
 *   delivered again, and an abandoned order transaction never commits.
 *
 * EXIT STATUS
 *   0 after a clean stop; 1 on a configuration or start error; 2 on bad usage; 3 when the
 *   stop was cut short (shutdown.grace ran out, or a second signal).
 *
 * DESIGN: main is short: parse, load config, start the HTTP server and the roles from the
 * role table, sigwait, drain. SIGTERM/SIGINT are blocked before any thread starts, so only
 * sigwait sees them; after the first, a watchdog thread waits for a second one or the grace. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/obx_api.h"
#include "obx/obx_auth.h"
#include "obx/obx_conf.h"
#include "obx/obx_err.h"
#include "obx/obx_http.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "obx/obx_trace.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"
#include "obx/obx_outbox.h"
#include "obx/obx_pipeline.h"
#include "obx/obx_relay.h"
#include "obx/obx_worker.h"

#define OUTBOXD_MAX_OVERRIDES 64

typedef struct {
  const char *name;
  const char *stop_stage; /* what the watchdog reports while stop runs */
  size_t enabled_offset; /* bool field of obx_conf_t */
  void *(*start)(const obx_conf_t *conf, obx_http_t *http, obx_err_t *err);
  void (*stop)(void *role);
} outboxd_role_t;

static const outboxd_role_t roles[] = {
  {"api", "stopping the api role", offsetof(obx_conf_t, api_enabled), obx_api_start, obx_api_stop},
  {"relay", "stopping the relay role", offsetof(obx_conf_t, relay_enabled), obx_relay_start, obx_relay_stop},
  {"worker", "stopping the worker role", offsetof(obx_conf_t, worker_enabled), obx_worker_start, obx_worker_stop},
};
#define NROLES ((int)(sizeof roles / sizeof roles[0]))

static bool *role_enabled(obx_conf_t *conf, const outboxd_role_t *role) {
  return (bool *)((char *)conf + role->enabled_offset);
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: outboxd [--roles api,relay,worker] [-c FILE] [-X key=value]... [--help] [--version]\n"
          "  --roles LIST   roles to run (overrides API_ENABLED, OUTBOX_RELAY_ENABLED, WORKER_ENABLED)\n"
          "  -c FILE        configuration file\n"
          "  -X key=value   set a configuration key (repeatable); see `outboxctl conf list`\n");
}

/* Applies --roles: every role is disabled except those listed. Names the bad one. */
static bool apply_roles(obx_conf_t *conf, const char *list, obx_err_t *err) {
  bool want[NROLES] = {0};
  char *copy = strdup(list), *save = NULL;
  bool ok = true;
  for (char *tok = strtok_r(copy, ",", &save); tok && ok; tok = strtok_r(NULL, ",", &save)) {
    int i = 0;
    while (i < NROLES && strcmp(roles[i].name, tok) != 0) i++;
    if (i == NROLES) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "--roles: unknown role '%s'", tok);
      ok = false;
    } else {
      want[i] = true;
    }
  }
  free(copy);
  if (ok)
    for (int i = 0; i < NROLES; i++) *role_enabled(conf, &roles[i]) = want[i];
  return ok;
}

static bool mongo_ready(void *mongo, obx_err_t *err) { return obx_mongo_ping(mongo, err); }

#define EXIT_STOP_CUT 3

/* What the stop is doing now, for the watchdog's message (a string literal or a role name). */
static _Atomic(const char *) stop_stage = "stopping the HTTP server";

typedef struct {
  sigset_t sigs;
  int64_t grace_ms;
} watchdog_t;

/* Ends the process when the stop outlasts the grace or a second signal arrives. Runs detached;
 * a stop that finishes first returns from main and takes it along. */
static void *stop_watchdog(void *arg) {
  const watchdog_t *w = arg;
  struct timespec now, until;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t end_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + w->grace_ms;
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t left = end_ms - ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    if (left <= 0) {
      obx_error("shutdown grace of %lld ms ran out while %s; exiting now (in-flight work is delivered again)",
                (long long)w->grace_ms, atomic_load(&stop_stage));
      break;
    }
    until.tv_sec = left / 1000;
    until.tv_nsec = (left % 1000) * 1000000L;
    int sig = sigtimedwait(&w->sigs, NULL, &until);
    if (sig > 0) {
      obx_error("signal %d during the stop (while %s): exiting now (in-flight work is delivered again)", sig,
                atomic_load(&stop_stage));
      break;
    }
    if (errno != EAGAIN && errno != EINTR) break;
  }
  fflush(stdout);
  _exit(EXIT_STOP_CUT);
  return NULL;
}

/* Until every role has started (and registered its own readiness checks), /readyz says no. */
static atomic_bool roles_started;
static bool roles_ready(void *ctx, obx_err_t *err) {
  if (atomic_load(&roles_started)) return true;
  obx_err_set(err, OBX_ERR_SYS, 0, true, "roles still starting");
  return false;
}

/* quiet driver start, even for --help (see obx_mongo.h) */
OBX_MONGO_PREINIT;

int main(int argc, char **argv) {
  const char *file = NULL, *role_list = NULL;
  char *overrides[OUTBOXD_MAX_OVERRIDES];
  int noverrides = 0, status = 1, nstarted = 0;
  void *handles[NROLES] = {0};
  void *pipelines = NULL;
  void *ops_api = NULL;
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  obx_http_t *http = NULL;
  obx_mongo_t *mongo = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("outboxd %s\n", obx_build_version());
      return 0;
    } else if (strcmp(a, "--roles") == 0 && i + 1 < argc) {
      role_list = argv[++i];
    } else if (strncmp(a, "--roles=", 8) == 0) {
      role_list = a + 8;
    } else if (strcmp(a, "-c") == 0 && i + 1 < argc) {
      file = argv[++i];
    } else if (strcmp(a, "-X") == 0 && i + 1 < argc && noverrides < OUTBOXD_MAX_OVERRIDES) {
      overrides[noverrides++] = argv[++i];
    } else {
      fprintf(stderr, "outboxd: bad argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }

  obx_conf_init(&conf);
  if (!obx_conf_load(&conf, file, NULL, overrides, noverrides, &err) ||
      (role_list && !apply_roles(&conf, role_list, &err)) || !obx_conf_validate(&conf, &err)) {
    fprintf(stderr, "outboxd: %s\n", err.msg);
    goto done;
  }
  obx_log_level_t level;
  if (obx_log_level_parse(conf.log_level, &level)) obx_log_set_level(level);
  obx_outbox_set_buckets(conf.relay_buckets); /* every event this process writes carries its bucket */
  obx_log_set_role("main");
  obx_build_info_register();
  /* OTEL_* variables: sampler and OTLP exporter, before any role starts spans */
  if (!obx_trace_start_from_env(&err)) {
    fprintf(stderr, "outboxd: %s\n", err.msg);
    goto done;
  }

  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (!(mongo = obx_mongo_new(&conf, &err)) || !(http = obx_http_new(&conf, &err))) goto fail;
  obx_http_add_ready_check(http, "mongo", mongo_ready, mongo);
  obx_http_add_ready_check(http, "roles", roles_ready, NULL);
  /* API keys of the api_keys collection join the file's (the refresher reads through mongo) */
  if (conf.api_enabled && !obx_auth_watch_db(obx_http_auth(http), mongo, conf.api_keys_refresh, &err)) goto fail;
  if (!obx_http_start(http, &err)) goto fail;
  /* pipelines API and the order.pre hook: in place before the api role serves POST /orders */
  if (conf.api_enabled && !(pipelines = obx_pipeline_api_start(&conf, http, &err))) goto fail;
  /* the operators' routes (/api/outbox, /api/inbox, /api/dlq) */
  if (conf.api_enabled && !(ops_api = obx_ops_api_start(&conf, http, &err))) goto fail;
  for (; nstarted < NROLES; nstarted++) {
    const outboxd_role_t *role = &roles[nstarted];
    if (!*role_enabled(&conf, role)) continue;
    if (!(handles[nstarted] = role->start(&conf, http, &err))) {
      obx_err_prefix(&err, "role %s", role->name);
      goto fail;
    }
    obx_info("role %s started", role->name);
  }
  atomic_store(&roles_started, true);
  obx_info("outboxd running");
  int sig = 0;
  sigwait(&sigs, &sig);
  obx_info("signal %d: stopping (grace %lld ms)", sig, (long long)conf.shutdown_grace);
  static watchdog_t watchdog;
  watchdog.sigs = sigs;
  watchdog.grace_ms = conf.shutdown_grace;
  pthread_t wt;
  if (pthread_create(&wt, NULL, stop_watchdog, &watchdog) == 0) pthread_detach(wt);
  status = 0;
  goto stop;
fail:
  obx_error("outboxd: %s", err.msg);
stop:
  obx_http_stop(http);
  while (nstarted-- > 0) {
    if (!handles[nstarted]) continue;
    atomic_store(&stop_stage, roles[nstarted].stop_stage);
    roles[nstarted].stop(handles[nstarted]);
  }
  atomic_store(&stop_stage, "stopping the operators' API");
  obx_ops_api_stop(ops_api);
  atomic_store(&stop_stage, "stopping the pipelines API");
  obx_pipeline_api_stop(pipelines);
  atomic_store(&stop_stage, "closing MongoDB");
  obx_http_destroy(http);
  obx_mongo_destroy(mongo);
  obx_trace_stop(); /* the last spans, bounded by the export timeout */
  if (status == 0) obx_info("outboxd stopped");
done:
  obx_conf_cleanup(&conf);
  return status;
}
