/* conf.c - `outboxctl conf`: the configuration table's documentation and a dry-run load
 *
 *   outboxctl conf list [--format text|markdown]
 *       Every key with its environment name, type, default, allowed values and description.
 *       The markdown form is the README's configuration section.
 *   outboxctl conf check [-c FILE] [-X key=value ...]
 *       Loads defaults, FILE, the environment and -X exactly as outboxd does, runs outboxd's
 *       start-up validation (obx_conf_validate) and prints the effective values, secrets
 *       masked. Exits 2 naming the bad key, its value and what is allowed.
 *
 * DESIGN: a thin shell over obx_conf (src/lib/conf.c); nothing here knows about keys. */
#include "obx/obx_ctl.h"

#include <getopt.h>
#include <string.h>

static int conf_list(int argc, char **argv) {
  static const struct option longopts[] = {{"format", required_argument, NULL, 'f'}, {"help", no_argument, NULL, 'h'}, {0}};
  const char *format = "text";
  int opt;
  optind = 0;
  while ((opt = getopt_long(argc, argv, "f:h", longopts, NULL)) != -1) {
    switch (opt) {
    case 'f': format = optarg; break;
    case 'h':
      printf("usage: outboxctl conf list [--format text|markdown]\n\n"
             "Prints every configuration key: dotted name, environment variable, type, default,\n"
             "allowed values and description. --format markdown prints the README table.\n");
      return OBX_CTL_OK;
    default: return OBX_CTL_USAGE;
    }
  }
  if (optind < argc) {
    obx_ctl_errorf("conf list: unexpected argument '%s'", argv[optind]);
    return OBX_CTL_USAGE;
  }
  if (strcmp(format, "text") != 0 && strcmp(format, "markdown") != 0) {
    obx_ctl_errorf("conf list: --format %s: must be text or markdown", format);
    return OBX_CTL_USAGE;
  }
  obx_conf_print_doc(stdout, format);
  return OBX_CTL_OK;
}

static int conf_check(int argc, char **argv) {
  static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {0}};
  obx_ctl_conf_opts_t opts = {0};
  obx_conf_t conf;
  int opt, rc = OBX_CTL_USAGE;
  optind = 0;
  while ((opt = getopt_long(argc, argv, OBX_CTL_CONF_OPTSTRING "h", longopts, NULL)) != -1) {
    if (obx_ctl_conf_option(&opts, opt, optarg)) continue;
    if (opt == 'h') {
      printf("usage: outboxctl conf check [-c FILE] [-X key=value ...]\n\n"
             "Loads the configuration as outboxd would (defaults, FILE, environment, -X; later wins),\n"
             "runs outboxd's start-up validation and prints the effective values with secrets masked.\n"
             "Exits 2 naming the bad key, its value and what is allowed.\n\n"
             "options:\n" OBX_CTL_CONF_USAGE);
      rc = OBX_CTL_OK;
    }
    goto done;
  }
  if (optind < argc) {
    obx_ctl_errorf("conf check: unexpected argument '%s'", argv[optind]);
    goto done;
  }
  if (obx_ctl_conf_load(&opts, &conf)) {
    obx_err_t err = OBX_ERR_INIT;
    if (obx_conf_validate(&conf, &err)) {
      obx_conf_print_values(&conf, stdout);
      rc = OBX_CTL_OK;
    } else {
      obx_ctl_errorf("configuration: %s", err.msg);
    }
  }
  obx_conf_cleanup(&conf);
done:
  obx_ctl_conf_opts_cleanup(&opts);
  return rc;
}

static const obx_ctl_sub_t conf_subs[] = {
  {"list", "[--format text|markdown]", "Document every configuration key", conf_list},
  {"check", "[-c FILE] [-X key=value ...]", "Load a configuration as outboxd would and print it, secrets masked",
   conf_check},
};

int obx_ctl_conf(int argc, char **argv) {
  return obx_ctl_dispatch("the configuration table", conf_subs, (int)(sizeof conf_subs / sizeof conf_subs[0]), argc,
                          argv);
}
