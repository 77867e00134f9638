/* conf.c - loading, validating and documenting the configuration table (obx_conf.h)
 *
 * DESIGN: OBX_CONF_KEYS expands twice here: into keys[] (the public description) and into
 * offsets[] (where each value lives in obx_conf_t). Every source goes through one function,
 * set_entry(), which parses into a temporary and only replaces the stored value when the new
 * one is valid, so a failed set leaves the previous value in place. Error messages name the
 * key as the user wrote it (dotted or env name), the value (masked for sensitive keys) and
 * what is allowed. */
#include "obx/obx_conf.h"
#include "obx/obx_log.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KEY_(field, TYPE, name, env, def, min, max, enum_values, flags, desc) \
  {name, env, def, enum_values, desc, OBX_CONF_##TYPE, min, max, flags},
static const obx_conf_key_t keys[] = {OBX_CONF_KEYS(KEY_)};
#undef KEY_

#define OFFSET_(field, ...) offsetof(obx_conf_t, field),
static const size_t offsets[] = {OBX_CONF_KEYS(OFFSET_)};
#undef OFFSET_

#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

static const char *const passthrough_prefixes[] = {"kafka."};

const obx_conf_key_t *obx_conf_keys(int *n) {
  *n = NKEYS;
  return keys;
}

static void *slot(obx_conf_t *conf, int i) { return (char *)conf + offsets[i]; }
static const void *cslot(const obx_conf_t *conf, int i) { return (const char *)conf + offsets[i]; }

static int find_key(const char *name) {
  for (int i = 0; i < NKEYS; i++)
    if (strcmp(keys[i].name, name) == 0 || strcmp(keys[i].env, name) == 0) return i;
  return -1;
}

static bool is_passthrough(const char *name) {
  for (size_t i = 0; i < sizeof passthrough_prefixes / sizeof passthrough_prefixes[0]; i++) {
    size_t n = strlen(passthrough_prefixes[i]);
    if (strncmp(name, passthrough_prefixes[i], n) == 0 && name[n] != '\0') return true;
  }
  return false;
}

/* ---- durations -------------------------------------------------------------------------- */

static const struct {
  const char *suffix;
  int64_t ms;
} duration_units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1}};

bool obx_conf_parse_duration(const char *s, int64_t *ms) {
  if (!s || !isdigit((unsigned char)*s)) return false;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno == ERANGE) return false;
  int64_t mult = 1;
  if (*end != '\0') {
    size_t u;
    for (u = 0; u < sizeof duration_units / sizeof duration_units[0]; u++)
      if (strcmp(end, duration_units[u].suffix) == 0) break;
    if (u == sizeof duration_units / sizeof duration_units[0]) return false;
    mult = duration_units[u].ms;
  }
  if (v > INT64_MAX / mult) return false;
  *ms = (int64_t)v * mult;
  return true;
}

/* The shortest exact text for a duration: 7d, 2m, 1500ms. */
static void format_duration(int64_t ms, char *out, size_t outlen) {
  for (size_t u = 0; u < sizeof duration_units / sizeof duration_units[0]; u++) {
    if (ms != 0 && ms % duration_units[u].ms == 0) {
      snprintf(out, outlen, "%" PRId64 "%s", ms / duration_units[u].ms, duration_units[u].suffix);
      return;
    }
  }
  snprintf(out, outlen, "%" PRId64 "ms", ms);
}

/* ---- values ----------------------------------------------------------------------------- */

static bool enum_has(const char *values, const char *v) {
  size_t n = strlen(v);
  for (const char *p = values; *p;) {
    size_t len = strcspn(p, "|");
    if (len == n && strncmp(p, v, n) == 0) return true;
    p += len;
    if (*p == '|') p++;
  }
  return false;
}

static bool parse_bool(const char *v, bool *out) {
  static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(v, yes[i]) == 0) return *out = true, true;
    if (strcasecmp(v, no[i]) == 0) return *out = false, true;
  }
  return false;
}

/* The value as it may appear in messages and listings. Caller frees. */
static char *shown_value(int flags, const char *value, bool reveal) {
  if (reveal || !(flags & OBX_CONF_SENSITIVE) || value[0] == '\0') return strdup(value);
  if (strstr(value, "://")) return obx_log_redact_uri(value);
  return strdup("***");
}

static bool duration_in_range(const obx_conf_key_t *k, const char *key, const char *value, int64_t ms,
                              obx_err_t *err) {
  if (k->min == 0 && k->max == 0) return true;
  if (ms >= k->min && ms <= k->max) return true;
  char lo[32], hi[32];
  format_duration(k->min, lo, sizeof lo);
  format_duration(k->max, hi, sizeof hi);
  obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: must be a duration between %s and %s", key, value, lo, hi);
  return false;
}

static bool set_entry(obx_conf_t *conf, int i, const char *key, const char *value, obx_err_t *err) {
  const obx_conf_key_t *k = &keys[i];
  void *p = slot(conf, i);
  bool ok = false;
  char *shown = shown_value(k->flags, value, false);
  switch (k->type) {
  case OBX_CONF_STR: {
    char **s = p;
    free(*s);
    *s = strdup(value);
    ok = true;
    break;
  }
  case OBX_CONF_ENUM: {
    if (!enum_has(k->enum_values, value)) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: must be one of %s", key, shown, k->enum_values);
      break;
    }
    char **s = p;
    free(*s);
    *s = strdup(value);
    ok = true;
    break;
  }
  case OBX_CONF_INT: {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (!value[0] || *end != '\0' || errno == ERANGE) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: must be an integer between %" PRId64 " and %" PRId64, key,
                  shown, k->min, k->max);
      break;
    }
    if ((k->min != 0 || k->max != 0) && (v < k->min || v > k->max)) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: must be between %" PRId64 " and %" PRId64, key, shown, k->min,
                  k->max);
      break;
    }
    *(int64_t *)p = v;
    ok = true;
    break;
  }
  case OBX_CONF_BOOL: {
    bool b;
    if (!parse_bool(value, &b)) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: must be true or false", key, shown);
      break;
    }
    *(bool *)p = b;
    ok = true;
    break;
  }
  case OBX_CONF_DURATION: {
    int64_t ms;
    if (!obx_conf_parse_duration(value, &ms)) {
      obx_err_set(err, OBX_ERR_CONF, 0, false,
                  "%s=%s: not a duration (use 250ms, 5s, 2m, 1h, 7d or a number of milliseconds)", key, shown);
      break;
    }
    if (!duration_in_range(k, key, shown, ms, err)) break;
    *(int64_t *)p = ms;
    ok = true;
    break;
  }
  case OBX_CONF_DURATION_LIST: {
    obx_conf_durations_t list = {0};
    char *copy = strdup(value), *rest = copy;
    ok = true;
    for (char *tok; ok && value[0] && (tok = strsep(&rest, ","));) {
      while (isspace((unsigned char)*tok)) tok++;
      char *e = tok + strlen(tok);
      while (e > tok && isspace((unsigned char)e[-1])) *--e = '\0';
      int64_t ms;
      if (!tok[0]) {
        obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: element %d is empty; must be increasing durations such as "
                    "5s,30s,2m", key, shown, list.n + 1);
        ok = false;
      } else if (list.n == OBX_CONF_MAX_LIST) {
        obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: at most %d durations", key, shown, OBX_CONF_MAX_LIST);
        ok = false;
      } else if (!obx_conf_parse_duration(tok, &ms)) {
        obx_err_set(err, OBX_ERR_CONF, 0, false,
                    "%s=%s: '%s' is not a duration (use 250ms, 5s, 2m, 1h, 7d or a number of milliseconds)", key,
                    shown, tok);
        ok = false;
      } else if (!duration_in_range(k, key, shown, ms, err)) {
        ok = false;
      } else if (list.n > 0 && ms <= list.ms[list.n - 1]) {
        obx_err_set(err, OBX_ERR_CONF, 0, false,
                    "%s=%s: '%s' is not longer than the element before it; must be strictly increasing durations "
                    "such as 5s,30s,2m", key, shown, tok);
        ok = false;
      } else {
        list.ms[list.n++] = ms;
      }
    }
    free(copy);
    if (ok && list.n == 0) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "%s=%s: must list at least one duration", key, shown);
      ok = false;
    }
    if (ok) *(obx_conf_durations_t *)p = list;
    break;
  }
  }
  free(shown);
  return ok;
}

static void set_passthrough(obx_conf_t *conf, const char *key, const char *value) {
  for (int i = 0; i < conf->npassthrough; i++) {
    if (strcmp(conf->passthrough[i].key, key) == 0) {
      free(conf->passthrough[i].value);
      conf->passthrough[i].value = strdup(value);
      return;
    }
  }
  obx_conf_pair_t *p = realloc(conf->passthrough, sizeof *p * (size_t)(conf->npassthrough + 1));
  if (!p) abort();
  conf->passthrough = p;
  p[conf->npassthrough].key = strdup(key);
  p[conf->npassthrough].value = strdup(value);
  conf->npassthrough++;
}

void obx_conf_init(obx_conf_t *conf) {
  memset(conf, 0, sizeof *conf);
  for (int i = 0; i < NKEYS; i++) {
    obx_err_t err = OBX_ERR_INIT;
    bool ok = set_entry(conf, i, keys[i].name, keys[i].def, &err);
    assert(ok && "a default in OBX_CONF_KEYS is invalid");
    (void)ok;
  }
}

void obx_conf_cleanup(obx_conf_t *conf) {
  if (!conf) return;
  for (int i = 0; i < NKEYS; i++) {
    if (keys[i].type == OBX_CONF_STR || keys[i].type == OBX_CONF_ENUM) {
      char **s = slot(conf, i);
      free(*s);
      *s = NULL;
    }
  }
  for (int i = 0; i < conf->npassthrough; i++) {
    free(conf->passthrough[i].key);
    free(conf->passthrough[i].value);
  }
  free(conf->passthrough);
  conf->passthrough = NULL;
  conf->npassthrough = 0;
}

bool obx_conf_set(obx_conf_t *conf, const char *key, const char *value, obx_err_t *err) {
  int i = find_key(key);
  if (i >= 0) return set_entry(conf, i, key, value, err);
  if (is_passthrough(key)) {
    set_passthrough(conf, key, value);
    return true;
  }
  obx_err_set(err, OBX_ERR_CONF, 0, false,
              "unknown configuration key '%s' (see `outboxctl conf list`; other kafka.* keys pass through to librdkafka)", key);
  return false;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

bool obx_conf_load_file(obx_conf_t *conf, const char *path, bool required, obx_err_t *err) {
  FILE *f = fopen(path, "r");
  if (!f) {
    if (!required && errno == ENOENT) return true;
    obx_err_set(err, OBX_ERR_CONF, errno, false, "%s: %s", path, strerror(errno));
    return false;
  }
  bool ok = true;
  char *line = NULL;
  size_t cap = 0;
  int lineno = 0;
  while (ok && getline(&line, &cap, f) >= 0) {
    lineno++;
    char *s = trim(line);
    if (*s == '\0' || *s == '#') continue;
    char *eq = strchr(s, '=');
    if (!eq) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "%s:%d: expected `key = value`", path, lineno);
      ok = false;
      break;
    }
    *eq = '\0';
    char *key = trim(s), *value = trim(eq + 1);
    size_t vl = strlen(value);
    if (vl >= 2 && (value[0] == '"' || value[0] == '\'') && value[vl - 1] == value[0]) {
      value[vl - 1] = '\0';
      value++;
    }
    if (!obx_conf_set(conf, key, value, err)) {
      obx_err_prefix(err, "%s:%d", path, lineno);
      ok = false;
    }
  }
  free(line);
  fclose(f);
  return ok;
}

static const char *env_lookup(char *const *envp, const char *name) {
  if (!envp) return getenv(name);
  size_t n = strlen(name);
  for (; *envp; envp++)
    if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=') return *envp + n + 1;
  return NULL;
}

bool obx_conf_load_env(obx_conf_t *conf, char *const *envp, obx_err_t *err) {
  for (int i = 0; i < NKEYS; i++) {
    const char *v = env_lookup(envp, keys[i].env);
    if (v && !set_entry(conf, i, keys[i].env, v, err)) return false;
  }
  return true;
}

bool obx_conf_load(obx_conf_t *conf, const char *file, char *const *envp, char *const *overrides, int noverrides,
                   obx_err_t *err) {
  obx_conf_cleanup(conf);
  obx_conf_init(conf);
  if (file && !obx_conf_load_file(conf, file, true, err)) return false;
  if (!obx_conf_load_env(conf, envp, err)) return false;
  for (int i = 0; i < noverrides; i++) {
    char *copy = strdup(overrides[i]);
    char *eq = strchr(copy, '=');
    bool ok;
    if (!eq) {
      obx_err_set(err, OBX_ERR_CONF, 0, false, "-X %s: expected key=value", copy);
      ok = false;
    } else {
      *eq = '\0';
      ok = obx_conf_set(conf, copy, eq + 1, err);
    }
    free(copy);
    if (!ok) return false;
  }
  return true;
}

/* ---- printing --------------------------------------------------------------------------- */

/* The stored value of key i as text, unmasked. Caller frees. */
static char *value_text(const obx_conf_t *conf, int i) {
  const void *p = cslot(conf, i);
  char buf[OBX_CONF_MAX_LIST * 24];
  switch (keys[i].type) {
  case OBX_CONF_STR:
  case OBX_CONF_ENUM: return strdup(*(char *const *)p ? *(char *const *)p : "");
  case OBX_CONF_INT: snprintf(buf, sizeof buf, "%" PRId64, *(const int64_t *)p); break;
  case OBX_CONF_BOOL: snprintf(buf, sizeof buf, "%s", *(const bool *)p ? "true" : "false"); break;
  case OBX_CONF_DURATION: format_duration(*(const int64_t *)p, buf, sizeof buf); break;
  case OBX_CONF_DURATION_LIST: {
    const obx_conf_durations_t *list = p;
    size_t len = 0;
    buf[0] = '\0';
    for (int j = 0; j < list->n; j++) {
      char one[24];
      format_duration(list->ms[j], one, sizeof one);
      len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", j ? "," : "", one);
    }
    break;
  }
  }
  return strdup(buf);
}

char *obx_conf_get_string(const obx_conf_t *conf, const char *key, bool reveal) {
  int i = find_key(key);
  if (i >= 0) {
    char *raw = value_text(conf, i);
    char *shown = shown_value(keys[i].flags, raw, reveal);
    free(raw);
    return shown;
  }
  for (int j = 0; j < conf->npassthrough; j++) {
    if (strcmp(conf->passthrough[j].key, key) == 0)
      return shown_value(obx_log_key_is_secret(key) ? OBX_CONF_SENSITIVE : 0, conf->passthrough[j].value, reveal);
  }
  return NULL;
}

void obx_conf_print_values(const obx_conf_t *conf, FILE *out) {
  for (int i = 0; i < NKEYS; i++) {
    char *v = obx_conf_get_string(conf, keys[i].name, false);
    fprintf(out, "%s = %s\n", keys[i].name, v);
    free(v);
  }
  for (int j = 0; j < conf->npassthrough; j++) {
    char *v = obx_conf_get_string(conf, conf->passthrough[j].key, false);
    fprintf(out, "%s = %s\n", conf->passthrough[j].key, v);
    free(v);
  }
}

static const char *type_name(obx_conf_type_t t) {
  switch (t) {
  case OBX_CONF_STR: return "string";
  case OBX_CONF_INT: return "int";
  case OBX_CONF_BOOL: return "bool";
  case OBX_CONF_DURATION: return "duration";
  case OBX_CONF_ENUM: return "enum";
  case OBX_CONF_DURATION_LIST: return "durations";
  }
  return "?";
}

/* What a key accepts, e.g. "1..10000", "10ms..1h", "stream, poll", "true, false". */
static void allowed_text(const obx_conf_key_t *k, char *out, size_t outlen) {
  char lo[32], hi[32];
  out[0] = '\0';
  switch (k->type) {
  case OBX_CONF_STR: break;
  case OBX_CONF_BOOL: snprintf(out, outlen, "true, false"); break;
  case OBX_CONF_INT:
    if (k->min || k->max) snprintf(out, outlen, "%" PRId64 "..%" PRId64, k->min, k->max);
    break;
  case OBX_CONF_DURATION:
  case OBX_CONF_DURATION_LIST:
    if (k->min || k->max) {
      format_duration(k->min, lo, sizeof lo);
      format_duration(k->max, hi, sizeof hi);
      snprintf(out, outlen, "%s%s..%s", k->type == OBX_CONF_DURATION_LIST ? "each " : "", lo, hi);
    }
    break;
  case OBX_CONF_ENUM: {
    size_t len = 0;
    for (const char *p = k->enum_values; *p && len < outlen;) {
      size_t n = strcspn(p, "|");
      len += (size_t)snprintf(out + len, outlen - len, "%s%.*s", len ? ", " : "", (int)n, p);
      p += n;
      if (*p == '|') p++;
    }
    break;
  }
  }
}

/* The default as documented: durations in their shortest unit, sensitive defaults masked
 * like values. Caller frees. */
static char *default_text(const obx_conf_key_t *k) {
  int64_t ms;
  if (k->type == OBX_CONF_DURATION && obx_conf_parse_duration(k->def, &ms)) {
    char buf[32];
    format_duration(ms, buf, sizeof buf);
    return strdup(buf);
  }
  return shown_value(k->flags, k->def, false);
}

/* Writes s for a markdown table cell: characters markdown would interpret are escaped; inside
 * a code span (code) only the '|' that would end the cell. */
static void md_cell(FILE *out, const char *s, bool code) {
  for (; *s; s++) {
    if (strchr(code ? "|" : "|<>*", *s)) fputc('\\', out);
    fputc(*s, out);
  }
}

static void print_doc_markdown(FILE *out) {
  fprintf(out, "| Key | Environment | Type | Default | Allowed | Description |\n");
  fprintf(out, "| --- | --- | --- | --- | --- | --- |\n");
  for (int i = 0; i < NKEYS; i++) {
    const obx_conf_key_t *k = &keys[i];
    char allowed[256];
    allowed_text(k, allowed, sizeof allowed);
    char *def = default_text(k);
    fprintf(out, "| `%s` | `%s` | %s | ", k->name, k->env, type_name(k->type));
    if (def[0]) {
      fputc('`', out);
      md_cell(out, def, true);
      fputc('`', out);
    }
    fprintf(out, " | ");
    md_cell(out, allowed, false);
    fprintf(out, " | ");
    md_cell(out, k->description, false);
    if (k->flags & OBX_CONF_SENSITIVE) fprintf(out, " (sensitive: never printed in clear)");
    fprintf(out, " |\n");
    free(def);
  }
  fprintf(out, "\nKeys under `kafka.` that are not listed pass through to librdkafka (`amqp.*` keys are all "
               "listed). Durations accept `250ms`, `5s`, `2m`, `1h`, `7d` or a number of milliseconds.\n");
}

static void print_doc_text(FILE *out) {
  static const char *const head[] = {"KEY", "ENV", "TYPE", "DEFAULT", "ALLOWED"};
  int w[5];
  for (int c = 0; c < 5; c++) w[c] = (int)strlen(head[c]);
  for (int i = 0; i < NKEYS; i++) {
    char allowed[256];
    allowed_text(&keys[i], allowed, sizeof allowed);
    char *def = default_text(&keys[i]);
    const char *cols[5] = {keys[i].name, keys[i].env, type_name(keys[i].type), def, allowed};
    for (int c = 0; c < 5; c++)
      if ((int)strlen(cols[c]) > w[c]) w[c] = (int)strlen(cols[c]);
    free(def);
  }
  fprintf(out, "%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", w[0], head[0], w[1], head[1], w[2], head[2], w[3], head[3], w[4],
          head[4], "DESCRIPTION");
  for (int i = 0; i < NKEYS; i++) {
    char allowed[256];
    allowed_text(&keys[i], allowed, sizeof allowed);
    char *def = default_text(&keys[i]);
    fprintf(out, "%-*s  %-*s  %-*s  %-*s  %-*s  %s%s\n", w[0], keys[i].name, w[1], keys[i].env, w[2],
            type_name(keys[i].type), w[3], def, w[4], allowed, keys[i].description,
            (keys[i].flags & OBX_CONF_SENSITIVE) ? " (sensitive)" : "");
    free(def);
  }
  fprintf(out, "\nkafka.* keys not listed pass through to librdkafka (amqp.* keys are all listed).\n"
               "Durations: 250ms, 5s, 2m, 1h, 7d, or a number of milliseconds.\n");
}

void obx_conf_print_doc(FILE *out, const char *format) {
  if (format && strcmp(format, "markdown") == 0)
    print_doc_markdown(out);
  else
    print_doc_text(out);
}
