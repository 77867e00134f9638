/* test_auth.c - API keys: hashing, generation, the keys file, the database set, permission checks */
#include "obx_test.h"
#include "obx_test_doc.h"

#include <stdio.h>
#include <string.h>

#include "obx/obx_auth.h"

static void test_hash_vector(void **state) {
  char hash[OBX_AUTH_HASH_LEN + 1];
  obx_auth_hash("abc", hash);
  assert_string_equal(hash, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void test_generate(void **state) {
  char a[OBX_AUTH_KEY_LEN + 1], b[OBX_AUTH_KEY_LEN + 1];
  assert_true(obx_auth_key_generate(a, NULL));
  assert_true(obx_auth_key_generate(b, NULL));
  assert_int_equal(strlen(a), OBX_AUTH_KEY_LEN);
  assert_memory_equal(a, "obx_", 4);
  assert_int_equal(strspn(a + 4, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"), OBX_AUTH_KEY_LEN - 4);
  assert_string_not_equal(a, b);
}

static void test_load_and_find(void **state) {
  char path[300], key1[OBX_AUTH_KEY_LEN + 1], key2[OBX_AUTH_KEY_LEN + 1], h1[65], h2[65], text[512];
  obx_err_t err = OBX_ERR_INIT;
  snprintf(path, sizeof path, "%s/keys-ok", obx_test_tmpdir());
  obx_auth_key_generate(key1, NULL);
  obx_auth_key_generate(key2, NULL);
  obx_auth_hash(key1, h1);
  obx_auth_hash(key2, h2);
  snprintf(text, sizeof text, "# keys\n\n%s acme orders:write,orders:read ops-alice@acme  # ops team\n  %s globex *\n", h1, h2);
  obx_test_write_file(path, text);
  obx_auth_t *auth = obx_auth_load(path, &err);
  if (!auth) print_error("load: %s\n", err.msg);
  assert_non_null(auth);

  static const struct {
    int key; /* 1, 2, or 0 for a wrong key */
    const char *perm;
    const char *want_org; /* NULL: key not found */
    bool want_allowed;
  } cases[] = {
    {1, "orders:write", "acme", true}, {1, "orders:read", "acme", true}, {1, "outbox:read", "acme", false},
    {2, "dlq:redrive", "globex", true}, {0, "orders:write", NULL, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *key = cases[i].key == 1 ? key1 : cases[i].key == 2 ? key2 : "obx_wrong";
    const obx_auth_key_t *k = obx_auth_find(auth, key);
    const char *org = k ? k->org_id : NULL;
    bool allowed = k && obx_auth_key_allows(k, cases[i].perm);
    if ((org == NULL) != (cases[i].want_org == NULL) || (org && strcmp(org, cases[i].want_org) != 0) ||
        allowed != cases[i].want_allowed) {
      print_error("case %zu: got org %s allowed %d, want org %s allowed %d\n", i, org ? org : "(none)", allowed,
                  cases[i].want_org ? cases[i].want_org : "(none)", cases[i].want_allowed);
      fail();
    }
  }
  assert_null(obx_auth_find(auth, ""));
  assert_null(obx_auth_find(auth, NULL));
  assert_string_equal(obx_auth_find(auth, key1)->name, "ops-alice@acme"); /* the fourth field */
  assert_null(obx_auth_find(auth, key2)->name);                         /* none */
  obx_auth_destroy(auth);
}

static void test_load_rejects(void **state) {
  static const struct {
    const char *text, *want; /* want: a substring of the error */
  } cases[] = {
    {"nothex acme orders:write\n", ":1:"},
    {"# ok\nba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad acme\n", ":2:"},
    {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad ac/me orders:write\n", "org id"},
    {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad acme orders:write,,x\n", "permissions"},
    {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad acme a b c\n", ":1:"},
    {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad acme orders:write ops/alice\n", "key name"},
  };
  char path[300];
  snprintf(path, sizeof path, "%s/keys-bad", obx_test_tmpdir());
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_err_t err = OBX_ERR_INIT;
    obx_test_write_file(path, cases[i].text);
    obx_auth_t *auth = obx_auth_load(path, &err);
    if (auth || !strstr(err.msg, cases[i].want)) {
      print_error("case %zu: got %s [%s], want an error containing %s\n", i, auth ? "success" : "error", err.msg,
                  cases[i].want);
      fail();
    }
  }
  obx_err_t err = OBX_ERR_INIT;
  assert_null(obx_auth_load("/nonexistent/keys", &err));
  assert_int_equal(err.domain, OBX_ERR_CONF);
  obx_auth_t *empty = obx_auth_load("", &err);
  assert_non_null(empty);
  obx_auth_destroy(empty);
}

/* The database set joins the file's keys; a refresh without a key revokes it (its entry, borrowed
 * by a request in flight, stays readable), a changed permission list replaces it, invalid
 * entries are skipped, file keys are never touched. */
static void test_db_keys(void **state) {
  char path[300], kfile[OBX_AUTH_KEY_LEN + 1], kdb[OBX_AUTH_KEY_LEN + 1], kdb2[OBX_AUTH_KEY_LEN + 1];
  char hfile[65], hdb[65], hdb2[65], text[256];
  obx_auth_key_generate(kfile, NULL);
  obx_auth_key_generate(kdb, NULL);
  obx_auth_key_generate(kdb2, NULL);
  obx_auth_hash(kfile, hfile);
  obx_auth_hash(kdb, hdb);
  obx_auth_hash(kdb2, hdb2);
  snprintf(path, sizeof path, "%s/keys-db", obx_test_tmpdir());
  snprintf(text, sizeof text, "%s acme orders:write\n", hfile);
  obx_test_write_file(path, text);
  obx_err_t err = OBX_ERR_INIT;
  obx_auth_t *auth = obx_auth_load(path, &err);
  assert_non_null(auth);
  assert_null(obx_auth_find(auth, kdb));

  const obx_auth_entry_t first[] = {{hdb, "globex", "outbox:read,dlq:read", NULL}, {"not-a-hash", "globex", "*", NULL},
                                    {hdb2, "bad org!", "*", NULL}};
  obx_auth_set_db_keys(auth, first, 3);
  const obx_auth_key_t *k = obx_auth_find(auth, kdb);
  assert_non_null(k);
  assert_string_equal(k->org_id, "globex");
  assert_true(obx_auth_key_allows(k, "dlq:read"));
  assert_false(obx_auth_key_allows(k, "orders:write"));
  assert_null(obx_auth_find(auth, kdb2)); /* invalid org: skipped */
  assert_non_null(obx_auth_find(auth, kfile));
  assert_int_equal(obx_auth_count(auth), 2);

  obx_auth_set_db_keys(auth, first, 1); /* the same set again: the same entry */
  assert_ptr_equal(obx_auth_find(auth, kdb), k);
  assert_int_equal(obx_auth_count(auth), 2);

  const obx_auth_entry_t changed[] = {{hdb, "globex", "outbox:read", NULL}};
  obx_auth_set_db_keys(auth, changed, 1);
  const obx_auth_key_t *k2 = obx_auth_find(auth, kdb);
  assert_non_null(k2);
  assert_ptr_not_equal(k2, k);
  assert_false(obx_auth_key_allows(k2, "dlq:read"));
  assert_true(k->revoked);
  assert_true(obx_auth_key_allows(k, "dlq:read")); /* the revoked entry is still readable */

  /* a name given (api_keys name) is a change too: a new entry carrying it; a bad one is skipped */
  const obx_auth_entry_t named[] = {{hdb, "globex", "outbox:read", "desk-bot"}, {hdb2, "globex", "*", "bad name"}};
  obx_auth_set_db_keys(auth, named, 2);
  const obx_auth_key_t *k3 = obx_auth_find(auth, kdb);
  assert_non_null(k3);
  assert_ptr_not_equal(k3, k2);
  assert_string_equal(k3->name, "desk-bot");
  assert_null(obx_auth_find(auth, kdb2));
  obx_auth_set_db_keys(auth, named, 1); /* the same again: the same entry */
  assert_ptr_equal(obx_auth_find(auth, kdb), k3);

  obx_auth_set_db_keys(auth, NULL, 0);
  assert_null(obx_auth_find(auth, kdb));
  assert_non_null(obx_auth_find(auth, kfile));
  assert_int_equal(obx_auth_count(auth), 4);
  obx_auth_destroy(auth);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_hash_vector),
    cmocka_unit_test(test_generate),
    cmocka_unit_test(test_load_and_find),
    cmocka_unit_test(test_load_rejects),
    cmocka_unit_test(test_db_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
