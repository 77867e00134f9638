/* outboxctl - operate outboxd
 *
 * SYNOPSIS
 *   outboxctl <command> [<subcommand>] [options]
 *   outboxctl --help | <command> --help | <command> <subcommand> --help
 *
 * DESCRIPTION
 *   The operators' tool: the configuration table (conf) and, as they are added, the outbox,
 *   inbox and replay, DLQ and redrive, parked keys, pipelines and status. Commands that reach
 *   MongoDB or RabbitMQ load the configuration exactly as outboxd does (-c FILE, the
 *   environment, -X key=value).
 *
 * EXIT STATUS
 *   0 success; 1 the operation failed (an unknown id included); 2 bad usage, bad input or bad
 *   configuration; 3 `status` found something degraded.
 *
 * DESIGN: main only dispatches; each command lives in src/ctl/<name>.c and is listed once in
 * OBX_CTL_COMMANDS (include/obx/obx_ctl.h), which also feeds the help below. */
#include "obx/obx_ctl.h"
#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "obx/obx_mongo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *name, *summary;
  int (*run)(int argc, char **argv);
} command_t;

#define OBX_CTL_ENTRY_(name, summary) {#name, summary, obx_ctl_##name},
static const command_t commands[] = {OBX_CTL_COMMANDS(OBX_CTL_ENTRY_)};
#undef OBX_CTL_ENTRY_
#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void usage(FILE *out) {
  fprintf(out, "outboxctl - operate outboxd\n\n"
               "usage: outboxctl <command> [<subcommand>] [options]\n"
               "       outboxctl <command> --help\n\n"
               "commands:\n");
  int width = 0;
  for (int i = 0; i < NCOMMANDS; i++)
    if ((int)strlen(commands[i].name) > width) width = (int)strlen(commands[i].name);
  for (int i = 0; i < NCOMMANDS; i++) fprintf(out, "  %-*s  %s\n", width, commands[i].name, commands[i].summary);
  fprintf(out, "\nexit status: 0 success; 1 the operation failed (an unknown id included); 2 bad usage, input or\n"
               "configuration; 3 status found something degraded. Quiet below warnings unless LOG_LEVEL is set.\n"
               "`outboxctl --version` prints the version.\n");
}

/* quiet driver start, even for --help (see obx_mongo.h) */
OBX_MONGO_PREINIT;

int main(int argc, char **argv) {
  obx_log_set_role("ctl");
  obx_log_set_stream(stderr); /* stdout is for the command's own output */
  /* quiet by default: warnings and errors only, unless LOG_LEVEL asks for more */
  obx_log_level_t level = OBX_LOG_WARN;
  const char *env_level = getenv("LOG_LEVEL");
  if (env_level && !obx_log_level_parse(env_level, &level)) level = OBX_LOG_WARN;
  obx_log_set_level(level);
  if (argc < 2) {
    usage(stderr);
    return OBX_CTL_USAGE;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("outboxctl %s\n", obx_build_version());
    return OBX_CTL_OK;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return OBX_CTL_OK;
  }
  for (int i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, argv[1]) == 0) return commands[i].run(argc - 1, argv + 1);
  obx_ctl_errorf("unknown command '%s'", argv[1]);
  usage(stderr);
  return OBX_CTL_USAGE;
}
