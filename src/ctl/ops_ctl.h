/* ops_ctl.h - helpers shared by the operators' outboxctl commands (dlq, inbox, keys, outbox,
 * status, audit)
 *
 * DESIGN: one option parser for these commands (the -c/-X configuration options plus the
 * selection, paging and safety options below), and one opener that loads the configuration
 * and connects MongoDB and, when needed, RabbitMQ exactly as the worker does (WORKER_GROUP is
 * the inbox consumer, WORKER_QUEUE_PREFIX names the queues). The operations themselves are
 * obx_ops_* (src/ops/), shared with the HTTP API. Errors are reported with the service's
 * host:port when the service could not be reached. */
#ifndef OBX_CTL_OPS_CTL_H
#define OBX_CTL_OPS_CTL_H

#include <stdbool.h>

#include "obx/obx_ctl.h"
#include "obx/obx_ladder.h"
#include "obx/obx_mongo.h"
#include "obx/obx_ops.h"

#define OPS_CTL_MAX_IDS 1000

typedef struct {
  obx_ctl_conf_opts_t conf;
  bool json, dry_run, all, yes, include_finished, watch;
  const char *who, *type, *org, *key, *failure_class, *reason, *status, *state, *action, *after, *event;
  int64_t since_ms, until_ms;
  const char *ids[OPS_CTL_MAX_IDS]; /* --id, repeatable; duplicates dropped */
  int nids;
  int limit;
  char **pos; /* positional arguments, borrowed from argv */
  int npos;
} ops_ctl_args_t;

/* Parses argv (argv[0] is the subcommand). Returns -1 to go on, else the exit code to return
 * (help printed: 0; bad usage reported, naming the flag: 2). `usage` is printed for --help.
 * TIME values (--since, --until) are RFC 3339 or a duration back from now (2h, 7d). Free with
 * ops_ctl_args_cleanup. */
int ops_ctl_parse(ops_ctl_args_t *args, int argc, char **argv, const char *usage);
void ops_ctl_args_cleanup(ops_ctl_args_t *args);

typedef struct {
  obx_conf_t conf;
  obx_mongo_t *mongo;
  obx_ladder_t *ladder; /* NULL unless opened with need_amqp */
  obx_ops_t ops;
  char target[512];     /* "MongoDB <db> at <hosts>[, RabbitMQ vhost <v> at <host:port>]" */
  char mongo_hosts[256];  /* the target's parts: "host:port,..." of MONGO_URI */
  char amqp_host[256];    /* host:port of AMQP_URL */
  char amqp_vhost[128];   /* its vhost */
} ops_ctl_t;

/* What a command needs opened beside MongoDB (flags of ops_ctl_open). */
enum {
  OPS_CTL_AMQP = 1,    /* RabbitMQ (the ladder) */
  OPS_CTL_AUDITED = 2, /* it records the operator in audit_log: a fallback of who is said on stderr */
};

/* Returns OBX_CTL_OK, or the exit code after reporting the problem. Close in every case. The
 * operator is --who, else $OUTBOXCTL_WHO, else $USER, else $LOGNAME, else "unknown"; with
 * OPS_CTL_AUDITED (and no --dry-run) anything but --who is said on stderr. */
int ops_ctl_open(ops_ctl_t *ctl, const ops_ctl_args_t *args, unsigned flags);
void ops_ctl_close(ops_ctl_t *ctl);

/* Appends the target as {mongodb: {database, hosts}, rabbitmq: {vhost, host, queuePrefix} | null}
 * (what --json prints beside a command's answer, as its text form prints ctl->target). */
void ops_ctl_append_target(const ops_ctl_t *ctl, bson_t *out);

/* Reports err (with the service's host:port when it is a connection problem) and returns the
 * exit code: OBX_CTL_USAGE for bad input, OBX_CTL_FAILED otherwise (not found included). */
int ops_ctl_fail(const ops_ctl_t *ctl, const char *what, const obx_err_t *err);

/* The string at a dotted path of doc ("_id.eventId"); dflt when absent or not a string. */
const char *ops_ctl_str(const bson_t *doc, const char *path, const char *dflt);
/* A date field as RFC 3339 into buf ("-" when absent). */
const char *ops_ctl_date(const bson_t *doc, const char *path, char buf[32]);

/* The page of args (--limit, --after). */
obx_ops_page_t ops_ctl_page(const ops_ctl_args_t *args);

/* One reading command (`dlq list`, `audit list`, `keys list`, `outbox list [STATUS]`, `dlq peek
 * ID`, `inbox show ID`): parse, check the arguments, open MongoDB, fetch the answer, print it
 * (a list answer {items, count, next}: --json whole, else print_header, print_item per item and
 * "next page: --after <cursor>" when there is one; one document: as JSON), close. */
typedef struct {
  const char *what;     /* "dlq list", in messages */
  const char *usage;    /* printed for --help */
  const char *pos_name; /* its one positional argument ("status", "dead-letter id"); NULL: none */
  bool pos_required;    /* the argument must be given (show) rather than may (list) */
  int max_ids;          /* how many --id it takes: 0, 1 or OPS_CTL_MAX_IDS */
  bool (*fetch)(const ops_ctl_t *ctl, const ops_ctl_args_t *args, bson_t *out, obx_err_t *err);
  void (*print_header)(void); /* NULL: the answer is one document, printed as JSON */
  void (*print_item)(const bson_t *item);
} ops_ctl_read_t;
int ops_ctl_read(const ops_ctl_read_t *cmd, int argc, char **argv);

#endif
