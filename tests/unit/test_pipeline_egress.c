/* test_pipeline_egress.c - the egress guard of http-request nodes
 *
 * Tables of URLs and addresses, allowed or refused, and every SSRF bypass form run through
 * the real request path (curl): refusals happen before a socket is opened, so no server is
 * needed. */
#include "obx_test.h"
#include "obx/obx_metrics.h"
#include "obx/obx_pipeline.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

static void test_url_table(void **state) {
  static const struct {
    bool allow_public; /* EGRESS_ALLOW_PUBLIC */
    const char *allowlist;
    const char *url;
    const char *want; /* NULL: allowed; else substring of the refusal */
  } cases[] = {
    {true, "", "http://example.com/orders", NULL},
    {true, "", "https://example.com:8443/x?y=1", NULL},
    {true, "", "HTTPS://EXAMPLE.COM/", NULL},
    {true, "", "file:///etc/passwd", "scheme \"file\" (only http and https)"},
    {true, "", "gopher://127.0.0.1:70/_x", "scheme \"gopher\""},
    {true, "", "ftp://example.com/a", "scheme \"ftp\""},
    {true, "", "dict://127.0.0.1:11211/stat", "scheme \"dict\""},
    {true, "", "ldap://example.com/", "scheme \"ldap\""},
    {true, "", "example.com/orders", "bad URL"},
    {true, "", "http://user@example.com/", "userinfo"},
    {true, "", "http://allowed.example@127.0.0.1/", "userinfo"},
    {true, "", "http://user:secret@example.com/", "userinfo"},
    {false, "api.example.com, *.partner.io", "https://api.example.com/v1", NULL},
    {false, "api.example.com, *.partner.io", "https://API.Example.com/v1", NULL},
    {false, "api.example.com, *.partner.io", "https://eu.partner.io/", NULL},
    {false, "api.example.com, *.partner.io", "https://partner.io/", "host \"partner.io\" is not in EGRESS_ALLOWLIST"},
    {false, "api.example.com, *.partner.io", "https://api.example.com.evil.net/", "is not in EGRESS_ALLOWLIST"},
    {false, "api.example.com, *.partner.io", "https://evilpartner.io/", "is not in EGRESS_ALLOWLIST"},
    {false, "api.example.com, *.partner.io", "http://127.0.0.1/", "host \"127.0.0.1\" is not in EGRESS_ALLOWLIST"},
    {false, "api.example.com", "http://api.example.com@evil.net/", "userinfo"},
    /* an empty allowlist without EGRESS_ALLOW_PUBLIC: no host, except literal addresses of
     * EGRESS_ALLOW_NETWORKS (127.0.0.0/8, ::1/128 here) */
    {false, "", "https://example.com/", "host \"example.com\": EGRESS_ALLOWLIST is empty and EGRESS_ALLOW_PUBLIC is not true"},
    {false, "", "http://8.8.8.8/", "EGRESS_ALLOW_PUBLIC is not true"},
    {false, "", "http://127.0.0.1:8080/erp", NULL},
    {false, "", "http://[::1]:8080/erp", NULL},
    {false, "", "http://[::2]:8080/erp", "EGRESS_ALLOW_PUBLIC is not true"},
    {false, "", "http://10.0.0.1/", "EGRESS_ALLOW_PUBLIC is not true"},
    {false, "", "http://2130706433/", NULL}, /* curl reads the host as 127.0.0.1, inside the networks */
    {false, "", "http://localhost:8080/", "EGRESS_ALLOW_PUBLIC is not true"},
    {true, "api.example.com", "https://other.example.com/", "is not in EGRESS_ALLOWLIST"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_egress_t egress;
    obx_err_t err = OBX_ERR_INIT;
    assert_true(obx_egress_init(&egress, cases[i].allowlist, "127.0.0.0/8,::1/128", 1000, 1000, 1024, &err));
    egress.allow_public = cases[i].allow_public;
    bool ok = obx_egress_check_url(&egress, cases[i].url, &err);
    if (!cases[i].want && !ok) fail_msg("case %zu %s: got refused (%s), want allowed", i, cases[i].url, err.msg);
    if (cases[i].want && ok) fail_msg("case %zu %s: got allowed, want refused (%s)", i, cases[i].url, cases[i].want);
    if (cases[i].want && !strstr(err.msg, cases[i].want))
      fail_msg("case %zu %s:\n got  %s\n want %s", i, cases[i].url, err.msg, cases[i].want);
    if (!ok) assert_false(err.retriable);
    obx_egress_cleanup(&egress);
  }
}

static bool sockaddr_of(const char *text, struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof *ss);
  struct sockaddr_in *in = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    return true;
  }
  if (inet_pton(AF_INET6, text, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    return true;
  }
  return false;
}

static void test_address_table(void **state) {
  static const struct {
    const char *nets; /* EGRESS_ALLOW_NETWORKS */
    const char *addr;
    const char *want; /* NULL: allowed; else substring of the refusal */
  } cases[] = {
    {"", "8.8.8.8", NULL},
    {"", "93.184.216.34", NULL},
    {"", "127.0.0.1", "127.0.0.1 is loopback"},
    {"", "127.255.255.254", "loopback"},
    {"", "0.0.0.0", "\"this network\""},
    {"", "0.1.2.3", "\"this network\""},
    {"", "10.0.0.1", "private (10.0.0.0/8)"},
    {"", "172.16.0.1", "private (172.16.0.0/12)"},
    {"", "172.31.255.255", "private (172.16.0.0/12)"},
    {"", "172.32.0.1", NULL},
    {"", "192.168.1.1", "private (192.168.0.0/16)"},
    {"", "169.254.169.254", "link-local / cloud metadata"},
    {"", "100.64.0.1", "carrier-grade NAT"},
    {"", "100.127.255.255", "carrier-grade NAT"},
    {"", "100.128.0.1", NULL},
    {"", "224.0.0.1", "multicast"},
    {"", "255.255.255.255", "reserved"},
    {"", "198.18.0.1", "benchmarking"},
    {"", "::1", "loopback (::1)"},
    {"", "::", "unspecified"},
    {"", "fc00::1", "unique-local"},
    {"", "fd12:3456::1", "unique-local"},
    {"", "fe80::1", "link-local (fe80::/10)"},
    {"", "ff02::1", "multicast"},
    {"", "::ffff:127.0.0.1", "loopback (127.0.0.0/8)"},
    {"", "::ffff:169.254.169.254", "cloud metadata"},
    {"", "::ffff:10.1.1.1", "private"},
    {"", "::ffff:8.8.8.8", "IPv4-mapped (::ffff:0:0/96)"},
    {"", "::ffff:0:0", "\"this network\""},
    {"", "::ffff:0:808:808", "IPv4-translated (::ffff:0:0:0/96)"},
    {"", "::ffff:0:7f00:1", "loopback (127.0.0.0/8)"},
    {"", "192.0.2.1", "TEST-NET-1 (192.0.2.0/24)"},
    {"", "192.0.3.1", NULL},
    {"", "198.51.100.200", "TEST-NET-2 (198.51.100.0/24)"},
    {"", "198.51.101.1", NULL},
    {"", "203.0.113.9", "TEST-NET-3 (203.0.113.0/24)"},
    {"", "203.0.114.1", NULL},
    {"", "192.88.99.1", "6to4 relay anycast (192.88.99.0/24)"},
    {"", "192.88.98.1", NULL},
    {"", "64:ff9b:1::a9fe:a9fe", "local-use NAT64 (64:ff9b:1::/48)"},
    {"", "64:ff9b:1:ffff::1", "local-use NAT64"},
    {"", "64:ff9b:2::808:808", NULL},
    {"", "2001::1", "Teredo (2001::/32)"},
    {"", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"},
    {"", "2001:200::1", NULL},
    {"", "::127.0.0.1", "loopback"},
    {"", "64:ff9b::7f00:1", "loopback"},
    {"", "64:ff9b::808:808", NULL},
    {"", "2002:7f00:1::", "loopback"},
    {"", "2002:a9fe:a9fe::1", "cloud metadata"},
    {"", "2001:4860:4860::8888", NULL},
    {"127.0.0.0/8", "127.0.0.1", NULL},
    {"127.0.0.0/8", "::ffff:127.0.0.1", NULL},
    {"127.0.0.0/8", "10.0.0.1", "private"},
    {"127.0.0.1", "127.0.0.2", "loopback"},
    {"::1/128", "::1", NULL},
    {"10.1.0.0/16", "10.1.200.3", NULL},
    {"10.1.0.0/16", "10.2.0.3", "private"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    obx_egress_t egress;
    obx_err_t err = OBX_ERR_INIT;
    if (!obx_egress_init(&egress, "", cases[i].nets, 1000, 1000, 1024, &err)) fail_msg("nets %s: %s", cases[i].nets, err.msg);
    struct sockaddr_storage ss;
    assert_true(sockaddr_of(cases[i].addr, &ss));
    bool ok = obx_egress_check_addr(&egress, (struct sockaddr *)&ss, &err);
    if (!cases[i].want && !ok) fail_msg("case %zu %s (nets %s): got refused (%s), want allowed", i, cases[i].addr, cases[i].nets, err.msg);
    if (cases[i].want && ok) fail_msg("case %zu %s (nets %s): got allowed, want refused", i, cases[i].addr, cases[i].nets);
    if (cases[i].want && !strstr(err.msg, cases[i].want))
      fail_msg("case %zu %s:\n got  %s\n want %s", i, cases[i].addr, err.msg, cases[i].want);
    obx_egress_cleanup(&egress);
  }
}

static void test_bad_networks(void **state) {
  static const char *const bad[] = {"127.0.0.0/33", "10.0.0.0/", "nonsense", "::1/129", "1.2.3.4/x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    obx_egress_t egress;
    obx_err_t err = OBX_ERR_INIT;
    if (obx_egress_init(&egress, "", bad[i], 1000, 1000, 1024, &err)) fail_msg("%s: got accepted, want an error", bad[i]);
    assert_non_null(strstr(err.msg, bad[i]));
    assert_int_equal(err.domain, OBX_ERR_CONF);
  }
}

/* Every form of "this machine" an attacker could write, through the real request path. */
static void test_bypass_attempts(void **state) {
  static const char *const urls[] = {
    "http://127.0.0.1:9/",
    "http://2130706433:9/",          /* decimal */
    "http://0x7f.1:9/",              /* hex + short form */
    "http://0x7f000001:9/",          /* hex */
    "http://0177.0.0.1:9/",          /* octal */
    "http://017700000001:9/",        /* octal, one number */
    "http://127.1:9/",               /* short form */
    "http://0:9/",                   /* 0.0.0.0 */
    "http://[::1]:9/",
    "http://[::ffff:127.0.0.1]:9/",  /* IPv4-mapped IPv6 */
    "http://[::ffff:7f00:1]:9/",
    "http://[0:0:0:0:0:ffff:127.0.0.1]:9/",
    "http://localhost:9/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00::1]:9/",
    "http://10.0.0.1:9/",
    "http://allowed@127.0.0.1:9/",   /* userinfo */
    "file:///etc/passwd",
    "gopher://127.0.0.1:9/_x",
    "ftp://127.0.0.1:9/",
  };
  obx_egress_t egress;
  assert_true(obx_egress_init(&egress, "", "", 2000, 5000, 1024, NULL));
  for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
    obx_http_response_t resp;
    obx_err_t err = OBX_ERR_INIT;
    bool ok = obx_egress_request(&egress, "GET", urls[i], NULL, NULL, 0, &resp, &err);
    if (ok) fail_msg("%s: got a response (status %ld), want a refusal", urls[i], resp.status);
    if (!strstr(err.msg, "egress refused")) fail_msg("%s: got \"%s\", want an egress refusal", urls[i], err.msg);
    if (err.retriable) fail_msg("%s: refusal classified transient, want terminal", urls[i]);
    obx_http_response_cleanup(&resp);
  }
  obx_egress_cleanup(&egress);
  obx_counter_t *refused = obx_metrics_counter("outboxd_pipeline_egress_refused_total",
                                               "http-request calls refused by the egress guard", "stage");
  double total = obx_metrics_value(refused, "url") + obx_metrics_value(refused, "address");
  if ((size_t)total != sizeof urls / sizeof urls[0])
    fail_msg("outboxd_pipeline_egress_refused_total: got %.0f, want %zu", total, sizeof urls / sizeof urls[0]);
}

/* An allowlisted name that resolves to a private address (DNS rebinding) is refused: the
 * check runs on the address actually connected to, not on the name. */
static void test_dns_rebinding(void **state) {
  obx_egress_t egress;
  obx_err_t err = OBX_ERR_INIT;
  obx_http_response_t resp;
  assert_true(obx_egress_init(&egress, "erp.example.com", "", 2000, 5000, 1024, NULL));
  assert_true(obx_egress_add_connect_to(&egress, "erp.example.com:80:169.254.169.254:80", NULL));
  assert_true(obx_egress_check_url(&egress, "http://erp.example.com/orders", NULL));
  assert_false(obx_egress_request(&egress, "POST", "http://erp.example.com/orders", NULL, "{}", 2, &resp, &err));
  if (!strstr(err.msg, "egress refused: 169.254.169.254 is link-local / cloud metadata"))
    fail_msg("got \"%s\", want the metadata address refused", err.msg);
  assert_false(err.retriable);
  obx_egress_cleanup(&egress);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_url_table),
    cmocka_unit_test(test_address_table),
    cmocka_unit_test(test_bad_networks),
    cmocka_unit_test(test_bypass_attempts),
    cmocka_unit_test(test_dns_rebinding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
