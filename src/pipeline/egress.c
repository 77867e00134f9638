/* egress.c - the guard around every outgoing HTTP request of http-request nodes
 *
 * DESIGN: closes the SSRF debt of seeds/000. Two checks:
 *  1. the URL (obx_egress_check_url): scheme http or https, no userinfo, host on the
 *     allowlist; with an empty allowlist, any host only when EGRESS_ALLOW_PUBLIC=true, else
 *     only a literal address inside EGRESS_ALLOW_NETWORKS (a tenant with pipelines:write
 *     cannot make outboxd call anywhere by default);
 *  2. the address (obx_egress_check_addr), run from CURLOPT_OPENSOCKETFUNCTION on the
 *     sockaddr curl is about to connect to, i.e. after DNS resolution: a name that resolves
 *     (or re-resolves, DNS rebinding) to a non-public address is refused whatever its form
 *     in the URL (decimal, octal, hex, IPv4-mapped IPv6, "localhost").
 * Redirects are never followed (a 3xx is returned to the node, which fails terminally),
 * proxies are disabled (the connected address must be the target's), the protocols are
 * limited to http/https, and the response is capped both by CURLOPT_MAXFILESIZE (declared
 * length) and in the write callback (chunked or lying peers). One easy handle per call
 * (obx_egress_call_t), which the caller performs: obx_egress_request with curl_easy_perform,
 * the worker's IO thread in its multi handle (src/worker/io.c); the handle never outlives the
 * call. */
#include "pipeline_int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <curl/curl.h>

#include "obx/obx_log.h"
#include "obx/obx_metrics.h"
#include "obx/obx_trace.h"

static void free_list(char **list, int n) {
  for (int i = 0; i < n; i++) bson_free(list[i]);
  bson_free(list);
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
  return s;
}

static bool parse_net(const char *text, obx_egress_net_t *net) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", text);
  char *slash = strchr(buf, '/');
  if (slash) *slash = '\0';
  int max;
  if (inet_pton(AF_INET, buf, net->addr) == 1) {
    net->family = AF_INET;
    max = 32;
  } else if (inet_pton(AF_INET6, buf, net->addr) == 1) {
    net->family = AF_INET6;
    max = 128;
  } else {
    return false;
  }
  net->prefix = max;
  if (slash) {
    char *end;
    long prefix = strtol(slash + 1, &end, 10);
    if (!slash[1] || *end || prefix < 0 || prefix > max) return false;
    net->prefix = (int)prefix;
  }
  return true;
}

bool obx_egress_init(obx_egress_t *egress, const char *hosts, const char *nets, int64_t connect_timeout_ms,
                     int64_t timeout_ms, int64_t max_response_bytes, obx_err_t *err) {
  memset(egress, 0, sizeof *egress);
  egress->connect_timeout_ms = connect_timeout_ms;
  egress->timeout_ms = timeout_ms;
  egress->max_response_bytes = max_response_bytes;
  char *copy = bson_strdup(hosts ? hosts : "");
  char *save = NULL;
  size_t cap = strlen(copy) / 2 + 1;
  egress->hosts = bson_malloc0(cap * sizeof *egress->hosts);
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *host = trim(tok);
    if (!*host) continue;
    for (char *p = host; *p; p++) *p = (char)tolower((unsigned char)*p);
    egress->hosts[egress->nhosts++] = bson_strdup(host);
  }
  bson_free(copy);

  bool ok = true;
  copy = bson_strdup(nets ? nets : "");
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *text = trim(tok);
    if (!*text) continue;
    if (egress->nnets == OBX_EGRESS_MAX_NETS) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "egress.allow_networks: more than %d networks", OBX_EGRESS_MAX_NETS);
      ok = false;
      break;
    }
    if (!parse_net(text, &egress->nets[egress->nnets])) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "egress.allow_networks: \"%s\" is not an address or CIDR network",
                  text);
      ok = false;
      break;
    }
    egress->nnets++;
  }
  bson_free(copy);
  if (!ok) obx_egress_cleanup(egress);
  return ok;
}

bool obx_egress_init_conf(obx_egress_t *egress, const obx_conf_t *conf, obx_err_t *err) {
  if (!obx_egress_init(egress, conf->egress_allowlist, conf->egress_allow_networks, conf->http_connect_timeout,
                       conf->http_timeout, conf->http_max_response_bytes, err))
    return false;
  egress->allow_public = conf->egress_allow_public;
  if (conf->egress_ca_file && *conf->egress_ca_file) egress->ca_file = bson_strdup(conf->egress_ca_file);
  return true;
}

bool obx_egress_add_connect_to(obx_egress_t *egress, const char *pin, obx_err_t *err) {
  int colons = 0;
  for (const char *p = pin ? pin : ""; *p; p++) colons += *p == ':';
  if (colons < 3) {
    obx_err_set(err, OBX_ERR_CONF, 0, false, "connect-to pin \"%s\": want host:port:address:port", pin ? pin : "");
    return false;
  }
  egress->connect_to =
    bson_realloc(egress->connect_to, (size_t)(egress->nconnect_to + 1) * sizeof *egress->connect_to);
  egress->connect_to[egress->nconnect_to++] = bson_strdup(pin);
  return true;
}

void obx_egress_cleanup(obx_egress_t *egress) {
  if (!egress) return;
  free_list(egress->hosts, egress->nhosts);
  free_list(egress->connect_to, egress->nconnect_to);
  bson_free(egress->ca_file);
  memset(egress, 0, sizeof *egress);
}

/* ---- URL -------------------------------------------------------------------------------- */

static bool net_allows(const obx_egress_t *egress, int family, const uint8_t *addr);

/* host (as curl returns it: IPv6 in brackets) is a literal address inside EGRESS_ALLOW_NETWORKS. */
static bool literal_in_nets(const obx_egress_t *egress, const char *host) {
  char buf[INET6_ADDRSTRLEN + 2];
  uint8_t addr[16];
  size_t len = strlen(host);
  if (len >= sizeof buf) return false;
  if (host[0] == '[' && len > 2 && host[len - 1] == ']') {
    memcpy(buf, host + 1, len - 2);
    buf[len - 2] = '\0';
    return inet_pton(AF_INET6, buf, addr) == 1 && net_allows(egress, AF_INET6, addr);
  }
  return inet_pton(AF_INET, host, addr) == 1 && net_allows(egress, AF_INET, addr);
}

static bool host_allowed(const obx_egress_t *egress, const char *host) {
  if (egress->nhosts == 0) return egress->allow_public || literal_in_nets(egress, host);
  size_t hlen = strlen(host);
  for (int i = 0; i < egress->nhosts; i++) {
    const char *rule = egress->hosts[i];
    if (strncmp(rule, "*.", 2) == 0) {
      size_t slen = strlen(rule + 1); /* ".example.com" */
      if (hlen > slen && strcasecmp(host + hlen - slen, rule + 1) == 0) return true;
    } else if (strcasecmp(host, rule) == 0) {
      return true;
    }
  }
  return false;
}

bool obx_egress_check_url(const obx_egress_t *egress, const char *url, obx_err_t *err) {
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL, *user = NULL, *password = NULL;
  bool ok = false;
  if (!u) {
    obx_err_set(err, OBX_ERR_SYS, 0, true, "out of memory");
    goto done;
  }
  CURLUcode rc = curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME);
  if (rc != CURLUE_OK) {
    obx_err_set(err, OBX_ERR_PIPELINE, (int)rc, false, "egress refused: bad URL \"%s\": %s", url,
                curl_url_strerror(rc));
    goto done;
  }
  curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
  if (!scheme || (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "egress refused: scheme \"%s\" (only http and https)",
                scheme ? scheme : "");
    goto done;
  }
  curl_url_get(u, CURLUPART_USER, &user, 0);
  curl_url_get(u, CURLUPART_PASSWORD, &password, 0);
  if (user || password) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false,
                "egress refused: URLs with userinfo are not allowed (send credentials in a header)");
    goto done;
  }
  if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host || !*host) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "egress refused: URL without a host");
    goto done;
  }
  if (!host_allowed(egress, host)) {
    if (egress->nhosts)
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "egress refused: host \"%s\" is not in EGRESS_ALLOWLIST", host);
    else
      obx_err_set(err, OBX_ERR_PIPELINE, 0, false,
                  "egress refused: host \"%s\": EGRESS_ALLOWLIST is empty and EGRESS_ALLOW_PUBLIC is not true", host);
    goto done;
  }
  ok = true;
done:
  curl_free(password);
  curl_free(user);
  curl_free(host);
  curl_free(scheme);
  curl_url_cleanup(u);
  return ok;
}

/* ---- addresses -------------------------------------------------------------------------- */

typedef struct {
  uint32_t net;
  int prefix;
  const char *what;
} v4_range_t;

static const v4_range_t v4_blocked[] = {
  {0x00000000u, 8, "\"this network\" (0.0.0.0/8)"},
  {0x0a000000u, 8, "private (10.0.0.0/8)"},
  {0x64400000u, 10, "carrier-grade NAT (100.64.0.0/10)"},
  {0x7f000000u, 8, "loopback (127.0.0.0/8)"},
  {0xa9fe0000u, 16, "link-local / cloud metadata (169.254.0.0/16)"},
  {0xac100000u, 12, "private (172.16.0.0/12)"},
  {0xc0000000u, 24, "IETF protocol assignments (192.0.0.0/24)"},
  {0xc0000200u, 24, "documentation TEST-NET-1 (192.0.2.0/24)"},
  {0xc0586300u, 24, "6to4 relay anycast (192.88.99.0/24)"},
  {0xc0a80000u, 16, "private (192.168.0.0/16)"},
  {0xc6120000u, 15, "benchmarking (198.18.0.0/15)"},
  {0xc6336400u, 24, "documentation TEST-NET-2 (198.51.100.0/24)"},
  {0xcb007100u, 24, "documentation TEST-NET-3 (203.0.113.0/24)"},
  {0xe0000000u, 4, "multicast (224.0.0.0/4)"},
  {0xf0000000u, 4, "reserved (240.0.0.0/4)"},
};

static const char *v4_class(uint32_t a) {
  for (size_t i = 0; i < sizeof v4_blocked / sizeof v4_blocked[0]; i++) {
    uint32_t mask = v4_blocked[i].prefix ? 0xffffffffu << (32 - v4_blocked[i].prefix) : 0;
    if ((a & mask) == v4_blocked[i].net) return v4_blocked[i].what;
  }
  return NULL;
}

static bool prefix_match(const uint8_t *a, const uint8_t *net, int prefix) {
  int full = prefix / 8, rest = prefix % 8;
  if (memcmp(a, net, (size_t)full) != 0) return false;
  if (rest == 0) return true;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (a[full] & mask) == (net[full] & mask);
}

/* The class of an IPv6 address, NULL when public. An address that embeds an IPv4 one sets
 * *embedded_v4 (so EGRESS_ALLOW_NETWORKS may allow it by its IPv4 network). IPv4-mapped
 * (::ffff:0:0/96) and IPv4-translated (::ffff:0:0:0/96) addresses are never public: a
 * client has no reason to name an IPv4 host that way, so they are refused whatever they
 * embed; the well-known NAT64 prefix (64:ff9b::/96), IPv4-compatible (::/96) and 6to4
 * (2002::/16) take the class of the IPv4 address they embed. Local-use NAT64
 * (64:ff9b:1::/48, behind which 64:ff9b:1::a9fe:a9fe may be the metadata address) and Teredo
 * (2001::/32) are refused as a whole. */
static const char *v6_class(const uint8_t *a, uint32_t *embedded_v4, bool *has_v4) {
  static const uint8_t zero[16], mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t translated[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0};
  static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b}, nat64_local[6] = {0x00, 0x64, 0xff, 0x9b, 0x00, 0x01};
  static const uint8_t teredo[4] = {0x20, 0x01, 0x00, 0x00};
  *has_v4 = false;
  if (memcmp(a, zero, 15) == 0 && (a[15] == 0 || a[15] == 1))
    return a[15] ? "loopback (::1)" : "unspecified (::)";
  if (memcmp(a, mapped, 12) == 0 || memcmp(a, translated, 12) == 0) {
    *embedded_v4 = (uint32_t)a[12] << 24 | (uint32_t)a[13] << 16 | (uint32_t)a[14] << 8 | a[15];
    *has_v4 = true;
    const char *v4 = v4_class(*embedded_v4);
    if (v4) return v4;
    return a[10] ? "IPv4-mapped (::ffff:0:0/96)" : "IPv4-translated (::ffff:0:0:0/96)";
  }
  if (memcmp(a, nat64_local, 6) == 0) return "local-use NAT64 (64:ff9b:1::/48)";
  if (memcmp(a, teredo, 4) == 0) return "Teredo (2001::/32)";
  if (memcmp(a, zero, 12) == 0 || memcmp(a, nat64, 12) == 0) {
    *embedded_v4 = (uint32_t)a[12] << 24 | (uint32_t)a[13] << 16 | (uint32_t)a[14] << 8 | a[15];
    *has_v4 = true;
    return v4_class(*embedded_v4);
  }
  if (a[0] == 0x20 && a[1] == 0x02) { /* 6to4 2002:AABB:CCDD::/48 */
    *embedded_v4 = (uint32_t)a[2] << 24 | (uint32_t)a[3] << 16 | (uint32_t)a[4] << 8 | a[5];
    *has_v4 = true;
    return v4_class(*embedded_v4);
  }
  if ((a[0] & 0xfe) == 0xfc) return "unique-local (fc00::/7)";
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) return "link-local (fe80::/10)";
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0) return "site-local (fec0::/10)";
  if (a[0] == 0xff) return "multicast (ff00::/8)";
  if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0d && a[3] == 0xb8) return "documentation (2001:db8::/32)";
  if (a[0] == 0x01 && memcmp(a + 1, zero, 7) == 0) return "discard (100::/64)";
  return NULL;
}

static bool net_allows(const obx_egress_t *egress, int family, const uint8_t *addr) {
  for (int i = 0; i < egress->nnets; i++)
    if (egress->nets[i].family == family && prefix_match(addr, egress->nets[i].addr, egress->nets[i].prefix))
      return true;
  return false;
}

bool obx_egress_check_addr(const obx_egress_t *egress, const struct sockaddr *addr, obx_err_t *err) {
  char text[INET6_ADDRSTRLEN] = "?";
  const char *what = NULL;
  bool allowed_net = false;
  if (addr->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    uint32_t a = ntohl(in->sin_addr.s_addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    what = v4_class(a);
    allowed_net = net_allows(egress, AF_INET, (const uint8_t *)&in->sin_addr);
  } else if (addr->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
    const uint8_t *a = in6->sin6_addr.s6_addr;
    uint32_t v4 = 0;
    bool has_v4;
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    what = v6_class(a, &v4, &has_v4);
    allowed_net = net_allows(egress, AF_INET6, a);
    if (has_v4 && !allowed_net) {
      uint32_t be = htonl(v4);
      allowed_net = net_allows(egress, AF_INET, (const uint8_t *)&be);
    }
  } else {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false, "egress refused: address family %d", addr->sa_family);
    return false;
  }
  if (what && !allowed_net) {
    obx_err_set(err, OBX_ERR_PIPELINE, 0, false,
                "egress refused: %s is %s (allow it with EGRESS_ALLOW_NETWORKS)", text, what);
    return false;
  }
  return true;
}

/* ---- requests --------------------------------------------------------------------------- */

struct obx_egress_call {
  obx_egress_t egress; /* the caller's policy (its lists borrowed), the node's timeout */
  obx_err_t refusal;
  bool refused;
  bool oversized;
  char *body;          /* the response */
  size_t len, cap;
  char *request_body;  /* CURLOPT_POSTFIELDS is not copied: it lives as long as the handle */
  CURL *curl;
  struct curl_slist *hdrs, *pins;
  char errbuf[CURL_ERROR_SIZE];
  obx_trace_ctx_t trace; /* the context current when the call was made: its curl log lines carry it */
};

static curl_socket_t open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *address) {
  obx_egress_call_t *call = clientp;
  if (purpose != CURLSOCKTYPE_IPCXN) return CURL_SOCKET_BAD;
  if (!obx_egress_check_addr(&call->egress, &address->addr, &call->refusal)) {
    call->refused = true;
    return CURL_SOCKET_BAD;
  }
  return socket(address->family, address->socktype, address->protocol);
}

static size_t write_body(char *data, size_t size, size_t n, void *userdata) {
  obx_egress_call_t *call = userdata;
  size_t len = size * n;
  if ((int64_t)(call->len + len) > call->egress.max_response_bytes) {
    call->oversized = true;
    return 0;
  }
  if (call->len + len + 1 > call->cap) {
    call->cap = (call->len + len + 1) * 2;
    call->body = bson_realloc(call->body, call->cap);
  }
  memcpy(call->body + call->len, data, len);
  call->len += len;
  call->body[call->len] = '\0';
  return len;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static obx_counter_t *refused_total;
static void curl_init_once(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  refused_total = obx_metrics_counter("outboxd_pipeline_egress_refused_total",
                                      "http-request calls refused by the egress guard", "stage");
}

void obx_egress_global_init(void) { pthread_once(&curl_once, curl_init_once); }

obx_egress_call_t *obx_egress_call_new(const obx_egress_t *egress, const char *method, const char *url,
                                       const char *const *headers, const char *body, size_t body_len,
                                       obx_err_t *err) {
  obx_egress_global_init();
  if (!obx_egress_check_url(egress, url, err)) {
    obx_counter_inc(refused_total, "url");
    return NULL;
  }
  CURL *curl = curl_easy_init();
  if (!curl) {
    obx_err_set(err, OBX_ERR_SYS, 0, true, "curl_easy_init failed");
    return NULL;
  }
  obx_egress_call_t *call = bson_malloc0(sizeof *call);
  call->egress = *egress;
  call->curl = curl;
  bool has_type = false;
  for (const char *const *h = headers; h && *h; h++) {
    if (strncasecmp(*h, "content-type:", 13) == 0) has_type = true;
    call->hdrs = curl_slist_append(call->hdrs, *h);
  }
  if (body && !has_type) call->hdrs = curl_slist_append(call->hdrs, "Content-Type: application/json");
  call->hdrs = curl_slist_append(call->hdrs, "Expect:");
  for (int i = 0; i < egress->nconnect_to; i++) call->pins = curl_slist_append(call->pins, egress->connect_to[i]);

  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_PROXY, "");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)egress->connect_timeout_ms);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)egress->timeout_ms);
  curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)egress->max_response_bytes);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, call);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, call);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, call->errbuf);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, call->hdrs);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "outboxd-pipeline/1");
  if (call->pins) curl_easy_setopt(curl, CURLOPT_CONNECT_TO, call->pins);
  if (egress->ca_file) curl_easy_setopt(curl, CURLOPT_CAINFO, egress->ca_file);
  if (body || strcasecmp(method, "POST") == 0) {
    call->request_body = bson_malloc(body_len + 1);
    if (body_len) memcpy(call->request_body, body, body_len);
    call->request_body[body_len] = '\0';
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, call->request_body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
  }
  /* POSTFIELDS implies POST: any other method (GET with a body included) is named explicitly */
  if (strcasecmp(method, "POST") != 0) curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  if (obx_trace_current()) call->trace = *obx_trace_current();
  obx_log_curl_attach(curl, call->trace.valid ? &call->trace : NULL);
  return call;
}

CURL *obx_egress_call_handle(const obx_egress_call_t *call) { return call->curl; }

bool obx_egress_call_finish(obx_egress_call_t *call, CURLcode rc, obx_http_response_t *resp, obx_err_t *err) {
  memset(resp, 0, sizeof *resp);
  /* a refused address only matters when no other address of the name answered */
  if (rc != CURLE_OK && call->refused) {
    obx_counter_inc(refused_total, "address");
    if (err) *err = call->refusal;
    return false;
  }
  if (call->oversized || rc == CURLE_FILESIZE_EXCEEDED) {
    obx_err_set(err, OBX_ERR_CURL, CURLE_FILESIZE_EXCEEDED, false, "response larger than %lld bytes",
                (long long)call->egress.max_response_bytes);
    return false;
  }
  if (rc != CURLE_OK) {
    obx_err_from_curl(err, rc, call->errbuf);
    return false;
  }
  const char *ctype = NULL, *location = NULL;
  curl_easy_getinfo(call->curl, CURLINFO_RESPONSE_CODE, &resp->status);
  curl_easy_getinfo(call->curl, CURLINFO_CONTENT_TYPE, &ctype);
  curl_easy_getinfo(call->curl, CURLINFO_REDIRECT_URL, &location);
  resp->content_type = ctype ? bson_strdup(ctype) : NULL;
  resp->location = location ? bson_strdup(location) : NULL;
  resp->len = call->len;
  resp->body = call->body ? call->body : bson_strdup("");
  call->body = NULL;
  return true;
}

void obx_egress_call_destroy(obx_egress_call_t *call) {
  if (!call) return;
  curl_easy_cleanup(call->curl);
  curl_slist_free_all(call->pins);
  curl_slist_free_all(call->hdrs);
  bson_free(call->request_body);
  bson_free(call->body);
  bson_free(call);
}

bool obx_egress_request(const obx_egress_t *egress, const char *method, const char *url, const char *const *headers,
                        const char *body, size_t body_len, obx_http_response_t *resp, obx_err_t *err) {
  memset(resp, 0, sizeof *resp);
  obx_egress_call_t *call = obx_egress_call_new(egress, method, url, headers, body, body_len, err);
  if (!call) return false;
  bool ok = obx_egress_call_finish(call, curl_easy_perform(obx_egress_call_handle(call)), resp, err);
  obx_egress_call_destroy(call);
  return ok;
}

void obx_http_response_cleanup(obx_http_response_t *resp) {
  if (!resp) return;
  bson_free(resp->body);
  bson_free(resp->content_type);
  bson_free(resp->location);
  memset(resp, 0, sizeof *resp);
}
