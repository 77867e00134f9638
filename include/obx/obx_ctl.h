/* obx_ctl.h - outboxctl commands
 *
 * DESIGN: every top-level command of outboxctl is one file src/ctl/<name>.c that defines
 *   int obx_ctl_<name>(int argc, char **argv);      argv[0] is the command name
 * plus one line in OBX_CTL_COMMANDS below; src/outboxctl.c builds its dispatch table and its
 * help from that list. A command with subcommands ("conf list", "dlq redrive") describes
 * them in an obx_ctl_sub_t table and hands over to obx_ctl_dispatch, which also answers
 * --help and rejects unknown subcommands. Commands that reach the services load the
 * configuration exactly as outboxd does, through the -c/-X helpers below.
 *
 * Exit codes, for every command: 0 success, 1 the operation failed (an unknown id included),
 * 2 bad usage, bad input or bad configuration, 3 `status` found something degraded. Output for
 * people goes to stdout, diagnostics to stderr; nothing else is logged below warnings. */
#ifndef OBX_CTL_H
#define OBX_CTL_H

#include <stdbool.h>
#include <stdio.h>
#include <bson/bson.h>

#include "obx/obx_conf.h"

#define OBX_CTL_OK 0
#define OBX_CTL_FAILED 1
#define OBX_CTL_USAGE 2
#define OBX_CTL_DEGRADED 3

/* X(name, summary) - one line per command, in the order shown by `outboxctl --help`. */
#define OBX_CTL_COMMANDS(X)                                                          \
  X(conf, "List the configuration keys; check a configuration as outboxd would load it")      \
  X(apikey, "Create API keys for the HTTP API (printed once, stored hashed)")                  \
  X(pipelines, "Apply pipeline definitions (validated; create/update by name) and list them")   \
  X(dlq, "Dead letters: list/filter, peek, redrive (once each), delete, purge, export")         \
  X(inbox, "The worker's inbox: list, show an entry with its executions, replay (filtered)")   \
  X(keys, "Business keys parked behind a failing event: list, release")                         \
  X(outbox, "The relay's outbox: list by status, counts, reprocess a FAILED event")             \
  X(status, "Relay leader and lag, counts, dead letters, DLQ depth, parked keys; --watch")        \
  X(audit, "The audit log of operator actions")

#define OBX_CTL_DECLARE_(name, summary) int obx_ctl_##name(int argc, char **argv);
OBX_CTL_COMMANDS(OBX_CTL_DECLARE_)
#undef OBX_CTL_DECLARE_

typedef struct {
  const char *name;    /* "list" */
  const char *args;    /* synopsis after the name, e.g. "[--format text|markdown]" */
  const char *summary; /* one line */
  int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
} obx_ctl_sub_t;

/* Runs the subcommand named by argv[1] of command argv[0]; `outboxctl <cmd> --help` (or -h)
 * prints the subcommands to stdout and returns 0; a missing or unknown subcommand prints
 * them to stderr and returns OBX_CTL_USAGE. */
int obx_ctl_dispatch(const char *summary, const obx_ctl_sub_t *subs, int nsubs, int argc, char **argv);

/* Prints "outboxctl: <message>\n" to stderr. */
void obx_ctl_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints doc to stdout as relaxed extended JSON on one line (the --json output). */
void obx_ctl_print_json(const bson_t *doc);

/* The -c FILE and -X key=value options, shared by every command that loads the
 * configuration. Use OBX_CTL_CONF_OPTSTRING in getopt and pass each option to
 * obx_ctl_conf_option; the strings are borrowed from argv. */
#define OBX_CTL_CONF_OPTSTRING "c:X:"
#define OBX_CTL_CONF_USAGE                                                            \
  "  -c FILE        configuration file (`key = value` lines), as for outboxd\n"       \
  "  -X key=value   set one key (dotted or environment name); repeatable\n"
typedef struct {
  const char *file;
  char **overrides; /* owned array of borrowed strings */
  int noverrides;
} obx_ctl_conf_opts_t;

/* true when opt was -c or -X (and was recorded). */
bool obx_ctl_conf_option(obx_ctl_conf_opts_t *opts, int opt, char *optarg);
/* Loads defaults -> file -> environment -> -X into conf (initialised by this call; clean it
 * up whatever the result). On failure prints the reason naming the key and returns false. */
bool obx_ctl_conf_load(const obx_ctl_conf_opts_t *opts, obx_conf_t *conf);
void obx_ctl_conf_opts_cleanup(obx_ctl_conf_opts_t *opts);

#endif
