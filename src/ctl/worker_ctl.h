/* worker_ctl.h - helpers shared by the worker's outboxctl commands (dlq, inbox, keys)
 *
 * DESIGN: one option parser for the three commands (the -c/-X configuration options plus
 * --json, --who, --dry-run, --id, --type, --org, --since, --all, --limit, --yes), and one opener that
 * loads the configuration and connects MongoDB and, when needed, RabbitMQ exactly as the
 * worker does (WORKER_GROUP is the inbox consumer, WORKER_QUEUE_PREFIX names the queues). The
 * operations themselves are obx_worker_* (src/worker/ops.c), shared with the HTTP API. */
#ifndef OBX_CTL_WORKER_CTL_H
#define OBX_CTL_WORKER_CTL_H

#include <stdbool.h>

#include "obx/obx_ctl.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"
#include "obx/obx_worker.h"

typedef struct {
  obx_ctl_conf_opts_t conf;
  bool json, dry_run, all, yes;
  const char *who, *id, *type, *org, *since;
  int limit;
  char **pos; /* positional arguments, borrowed from argv */
  int npos;
} worker_ctl_args_t;

/* Parses argv (argv[0] is the subcommand). Returns -1 to go on, else the exit code to return
 * (help printed: 0; bad usage reported: 2). `usage` is printed for --help. Free with
 * worker_ctl_args_cleanup. */
int worker_ctl_parse(worker_ctl_args_t *args, int argc, char **argv, const char *usage);
void worker_ctl_args_cleanup(worker_ctl_args_t *args);

typedef struct {
  obx_conf_t conf;
  obx_mongo_t *mongo;
  obx_ladder_t *ladder; /* NULL unless opened with need_amqp */
  obx_worker_ops_t ops;
} worker_ctl_t;

/* Returns OBX_CTL_OK, or the exit code after reporting the problem. Close in every case. */
int worker_ctl_open(worker_ctl_t *ctl, const worker_ctl_args_t *args, bool need_amqp);
void worker_ctl_close(worker_ctl_t *ctl);

/* Reports err and returns OBX_CTL_FAILED. */
int worker_ctl_fail(const char *what, const obx_err_t *err);

/* The string at a dotted path of doc ("_id.eventId"); dflt when absent or not a string. */
const char *worker_ctl_str(const bson_t *doc, const char *path, const char *dflt);

/* One `list [STATUS] [--limit N] [--json]` command over obx_ops_list (every org): --json prints
 * its answer, otherwise print_header and then print_item for each item. */
typedef struct {
  const char *what; /* "outbox list", in messages */
  obx_ops_store_t store;
  const char *usage; /* printed for --help */
  void (*print_header)(void);
  void (*print_item)(const bson_t *item);
} worker_ctl_list_t;
int worker_ctl_list(const worker_ctl_list_t *list, int argc, char **argv);

#endif
