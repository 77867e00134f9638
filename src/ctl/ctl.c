/* ctl.c - helpers shared by the outboxctl commands (obx_ctl.h)
 *
 * DESIGN: subcommand dispatch and help text from one table per command, and the -c/-X
 * configuration options every service-facing command accepts. No global state. */
#include "obx/obx_ctl.h"
#include "obx/obx_json.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void obx_ctl_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("outboxctl: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

void obx_ctl_print_json(const bson_t *doc) {
  char *json = obx_json_render(doc, NULL, NULL);
  printf("%s\n", json);
  bson_free(json);
}

static void print_subs(FILE *out, const char *cmd, const char *summary, const obx_ctl_sub_t *subs, int nsubs) {
  fprintf(out, "outboxctl %s - %s\n\nusage:\n", cmd, summary);
  for (int i = 0; i < nsubs; i++) fprintf(out, "  outboxctl %s %s %s\n", cmd, subs[i].name, subs[i].args);
  fprintf(out, "\nsubcommands:\n");
  int width = 0;
  for (int i = 0; i < nsubs; i++)
    if ((int)strlen(subs[i].name) > width) width = (int)strlen(subs[i].name);
  for (int i = 0; i < nsubs; i++) fprintf(out, "  %-*s  %s\n", width, subs[i].name, subs[i].summary);
  fprintf(out, "\n`outboxctl %s <subcommand> --help` describes the options of one subcommand.\n", cmd);
}

int obx_ctl_dispatch(const char *summary, const obx_ctl_sub_t *subs, int nsubs, int argc, char **argv) {
  const char *cmd = argv[0];
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0)) {
    print_subs(stdout, cmd, summary, subs, nsubs);
    return OBX_CTL_OK;
  }
  if (argc < 2) {
    obx_ctl_errorf("%s: missing subcommand", cmd);
    print_subs(stderr, cmd, summary, subs, nsubs);
    return OBX_CTL_USAGE;
  }
  for (int i = 0; i < nsubs; i++)
    if (strcmp(subs[i].name, argv[1]) == 0) return subs[i].run(argc - 1, argv + 1);
  obx_ctl_errorf("%s: unknown subcommand '%s'", cmd, argv[1]);
  print_subs(stderr, cmd, summary, subs, nsubs);
  return OBX_CTL_USAGE;
}

bool obx_ctl_conf_option(obx_ctl_conf_opts_t *opts, int opt, char *optarg) {
  if (opt == 'c') {
    opts->file = optarg;
    return true;
  }
  if (opt == 'X') {
    char **o = realloc(opts->overrides, sizeof *o * (size_t)(opts->noverrides + 1));
    if (!o) abort();
    opts->overrides = o;
    o[opts->noverrides++] = optarg;
    return true;
  }
  return false;
}

bool obx_ctl_conf_load(const obx_ctl_conf_opts_t *opts, obx_conf_t *conf) {
  obx_err_t err = OBX_ERR_INIT;
  obx_conf_init(conf);
  if (obx_conf_load(conf, opts->file, NULL, opts->overrides, opts->noverrides, &err)) return true;
  obx_ctl_errorf("configuration: %s", err.msg);
  return false;
}

void obx_ctl_conf_opts_cleanup(obx_ctl_conf_opts_t *opts) {
  free(opts->overrides);
  opts->overrides = NULL;
  opts->noverrides = 0;
}
