/* apikey.c - `outboxctl apikey`: API keys for the HTTP API
 *
 *   outboxctl apikey new --org ORG --perm p1,p2 [--name NAME] [--store file|db] [-c FILE] [-X key=value]
 *       Prints a fresh random key (shown once: only its SHA-256 is stored) and the line to
 *       append to API_KEYS_FILE; with --store db inserts {_id: sha256, orgId, permissions,
 *       name, createdAt} into the api_keys collection instead (read by outboxd every
 *       API_KEYS_REFRESH). NAME is who the key's operator actions are recorded as.
 *   outboxctl apikey hash KEY
 *       Prints the SHA-256 of an existing key (to find or revoke its line).
 *
 * DESIGN: a thin shell over obx_auth (src/api/auth.c), which owns the key format and the file
 * format. Only --store db touches the network (MongoDB). */
#include "obx/obx_ctl.h"

#include <getopt.h>
#include <string.h>

#include "obx/obx_auth.h"
#include "obx/obx_mongo.h"
#include "obx/obx_event.h"

/* Inserts the key's hash into api_keys; prints why on failure. */
static bool apikey_store_db(const obx_ctl_conf_opts_t *opts, const char *hash, const char *org, const char *perms,
                            const char *name) {
  obx_conf_t conf;
  obx_err_t err = OBX_ERR_INIT;
  obx_mongo_t *mongo = NULL;
  bool ok = obx_ctl_conf_load(opts, &conf);
  if (!ok) goto done;
  if (!(mongo = obx_mongo_new(&conf, &err))) {
    ok = false;
    obx_ctl_errorf("apikey new: %s", err.msg);
    goto done;
  }
  bson_t doc = BSON_INITIALIZER, arr;
  BSON_APPEND_UTF8(&doc, "_id", hash);
  BSON_APPEND_UTF8(&doc, "orgId", org);
  BSON_APPEND_ARRAY_BEGIN(&doc, "permissions", &arr);
  char *copy = strdup(perms), *save = NULL, idx[16];
  int i = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    const char *key;
    bson_uint32_to_string((uint32_t)i++, &key, idx, sizeof idx);
    bson_append_utf8(&arr, key, -1, tok, -1);
  }
  free(copy);
  bson_append_array_end(&doc, &arr);
  if (name) BSON_APPEND_UTF8(&doc, "name", name);
  BSON_APPEND_DATE_TIME(&doc, "createdAt", obx_time_now_ms());
  mongoc_client_t *client = obx_mongo_pop(mongo);
  mongoc_collection_t *coll = obx_mongo_collection(mongo, client, "api_keys");
  bson_error_t berr;
  ok = mongoc_collection_insert_one(coll, &doc, NULL, NULL, &berr);
  if (!ok) obx_ctl_errorf("apikey new: insert into api_keys: %s", berr.message);
  mongoc_collection_destroy(coll);
  obx_mongo_push(mongo, client);
  bson_destroy(&doc);
done:
  obx_mongo_destroy(mongo);
  obx_conf_cleanup(&conf);
  return ok;
}

static int apikey_new(int argc, char **argv) {
  static const struct option longopts[] = {{"org", required_argument, NULL, 'o'},
                                           {"perm", required_argument, NULL, 'p'},
                                           {"store", required_argument, NULL, 's'},
                                           {"name", required_argument, NULL, 'n'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
  const char *org = NULL, *perms = NULL, *store = "file", *name = NULL;
  obx_ctl_conf_opts_t opts = {0};
  int opt, rc = OBX_CTL_USAGE;
  optind = 0;
  while ((opt = getopt_long(argc, argv, "o:p:s:n:h" OBX_CTL_CONF_OPTSTRING, longopts, NULL)) != -1) {
    if (obx_ctl_conf_option(&opts, opt, optarg)) continue;
    switch (opt) {
    case 'o': org = optarg; break;
    case 'p': perms = optarg; break;
    case 's': store = optarg; break;
    case 'n': name = optarg; break;
    case 'h':
      printf("usage: outboxctl apikey new --org ORG --perm p1,p2 [--name NAME] [--store file|db] [-c FILE] [-X key=value]\n\n"
             "Prints a new API key for ORG with the given permissions (e.g. orders:write,orders:read,\n"
             "outbox:read; `*` grants all). The key is shown once: only its SHA-256 is kept.\n"
             "  --name NAME    who the key's operator actions are recorded as in audit_log (letters,\n"
             "                 digits, '-', '_', '.', '@'); without it, apikey:<first 16 hex of its sha256>\n"
             "  --store file   print the line to append to API_KEYS_FILE (default)\n"
             "  --store db     insert it into the api_keys collection (outboxd reads it every\n"
             "                 API_KEYS_REFRESH)\n" OBX_CTL_CONF_USAGE);
      rc = OBX_CTL_OK;
      goto done;
    default: goto done;
    }
  }
  if (!org || !perms || optind < argc || (strcmp(store, "file") != 0 && strcmp(store, "db") != 0)) {
    obx_ctl_errorf("apikey new: --org and --perm are required, --store is file or db (and nothing else)");
    goto done;
  }
  obx_err_t err = OBX_ERR_INIT;
  char key[OBX_AUTH_KEY_LEN + 1], hash[OBX_AUTH_HASH_LEN + 1];
  if (!obx_auth_validate_entry(org, perms, &err) || (name && !obx_auth_validate_name(name, &err))) {
    obx_ctl_errorf("apikey new: %s", err.msg);
    goto done;
  }
  rc = OBX_CTL_FAILED;
  if (!obx_auth_key_generate(key, &err)) {
    obx_ctl_errorf("apikey new: %s", err.msg);
    goto done;
  }
  obx_auth_hash(key, hash);
  if (strcmp(store, "db") == 0) {
    if (!apikey_store_db(&opts, hash, org, perms, name)) goto done;
    printf("key:    %s\nstored: api_keys %s %s %s%s%s\n", key, hash, org, perms, name ? " " : "", name ? name : "");
  } else {
    printf("key:  %s\nline: %s %s %s%s%s\n", key, hash, org, perms, name ? " " : "", name ? name : "");
  }
  rc = OBX_CTL_OK;
done:
  obx_ctl_conf_opts_cleanup(&opts);
  return rc;
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
    {"new", "--org ORG --perm p1,p2 [--name NAME] [--store file|db]", "Create a key; print it and its API_KEYS_FILE line, or store it in api_keys", apikey_new},
    {"hash", "KEY", "Print the SHA-256 of a key, as stored in API_KEYS_FILE", apikey_hash},
  };
  return obx_ctl_dispatch("API keys of the HTTP API", subs, (int)(sizeof subs / sizeof subs[0]), argc, argv);
}
