/* apikey.c - `outboxctl apikey`: API keys for the HTTP API
 *
 *   outboxctl apikey new --org ORG --perm p1,p2
 *       Prints a fresh random key (shown once: only its SHA-256 is stored) and the line to
 *       append to API_KEYS_FILE.
 *   outboxctl apikey hash KEY
 *       Prints the SHA-256 of an existing key (to find or revoke its line).
 *
 * DESIGN: a thin shell over obx_auth (src/api/auth.c), which owns the key format and the file
 * format. Nothing here touches the network. */
#include "obx/obx_ctl.h"

#include <getopt.h>
#include <string.h>

#include "obx/obx_auth.h"

static int apikey_new(int argc, char **argv) {
  static const struct option longopts[] = {
    {"org", required_argument, NULL, 'o'}, {"perm", required_argument, NULL, 'p'}, {"help", no_argument, NULL, 'h'}, {0}};
  const char *org = NULL, *perms = NULL;
  int opt;
  optind = 0;
  while ((opt = getopt_long(argc, argv, "o:p:h", longopts, NULL)) != -1) {
    switch (opt) {
    case 'o': org = optarg; break;
    case 'p': perms = optarg; break;
    case 'h':
      printf("usage: outboxctl apikey new --org ORG --perm p1,p2\n\n"
             "Prints a new API key for ORG with the given permissions (e.g. orders:write,orders:read,\n"
             "outbox:read; `*` grants all) and the line to append to API_KEYS_FILE. The key is\n"
             "shown once: the file keeps only its SHA-256.\n");
      return OBX_CTL_OK;
    default: return OBX_CTL_USAGE;
    }
  }
  if (!org || !perms || optind < argc) {
    obx_ctl_errorf("apikey new: --org and --perm are required (and nothing else)");
    return OBX_CTL_USAGE;
  }
  obx_err_t err = OBX_ERR_INIT;
  char key[OBX_AUTH_KEY_LEN + 1], hash[OBX_AUTH_HASH_LEN + 1];
  if (!obx_auth_validate_entry(org, perms, &err)) {
    obx_ctl_errorf("apikey new: %s", err.msg);
    return OBX_CTL_USAGE;
  }
  if (!obx_auth_key_generate(key, &err)) {
    obx_ctl_errorf("apikey new: %s", err.msg);
    return OBX_CTL_FAILED;
  }
  obx_auth_hash(key, hash);
  printf("key:  %s\nline: %s %s %s\n", key, hash, org, perms);
  return OBX_CTL_OK;
}

static int apikey_hash(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    printf("usage: outboxctl apikey hash KEY\n\nPrints the SHA-256 of KEY as stored in API_KEYS_FILE.\n");
    return OBX_CTL_OK;
  }
  if (argc != 2) {
    obx_ctl_errorf("apikey hash: expected exactly one KEY");
    return OBX_CTL_USAGE;
  }
  char hash[OBX_AUTH_HASH_LEN + 1];
  obx_auth_hash(argv[1], hash);
  printf("%s\n", hash);
  return OBX_CTL_OK;
}

int obx_ctl_apikey(int argc, char **argv) {
  static const obx_ctl_sub_t subs[] = {
    {"new", "--org ORG --perm p1,p2", "Create a key; print it and its API_KEYS_FILE line", apikey_new},
    {"hash", "KEY", "Print the SHA-256 of a key, as stored in API_KEYS_FILE", apikey_hash},
  };
  return obx_ctl_dispatch("API keys of the HTTP API", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
