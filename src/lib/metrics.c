/* metrics.c - process-wide Prometheus registry (obx_metrics.h)
 *
 * DESIGN: a global list of metrics guarded by g_registry (taken to register and to render);
 * each metric guards its own series list with its mutex, so updates on different metrics
 * never contend. Series are found by comparing label values linearly: metrics here have a
 * handful of series (topics, results, node types), not user-controlled cardinality. Metrics
 * and series are never freed; they live as long as the process. */
#include "obx/obx_metrics.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } kind_t;

static const char *const kind_names[] = {"counter", "gauge", "histogram"};

typedef struct series {
  char *values[OBX_METRICS_MAX_LABELS];
  double value;          /* counter, gauge */
  double sum;            /* histogram */
  uint64_t count;        /* histogram: observations */
  uint64_t *buckets;     /* histogram: observations per bucket (not cumulative), nbuckets entries */
  struct series *next;
} series_t;

struct obx_metric {
  kind_t kind;
  char *name, *help;
  int nlabels;
  char *labels[OBX_METRICS_MAX_LABELS];
  double *bounds; /* histogram upper bounds, ascending, without +Inf */
  int nbounds;
  pthread_mutex_t mutex;
  series_t *series, **series_tail;
  struct obx_metric *next;
};

static pthread_mutex_t g_registry = PTHREAD_MUTEX_INITIALIZER;
static struct obx_metric *g_metrics, **g_metrics_tail = &g_metrics;

static const double default_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

#define BUG(...) bug(__FILE__, __LINE__, __VA_ARGS__)
static void bug(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
static void bug(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: metrics misuse: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

static bool valid_name(const char *s, bool colon_ok) {
  if (!s || !*s || isdigit((unsigned char)*s)) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_' && !(colon_ok && *s == ':')) return false;
  return true;
}

/* Splits "a,b" into label names; aborts on misuse. */
static int parse_labels(const char *metric, const char *labels, char *out[OBX_METRICS_MAX_LABELS]) {
  int n = 0;
  if (!labels || !*labels) return 0;
  char *copy = strdup(labels), *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    if (n == OBX_METRICS_MAX_LABELS) BUG("%s: more than %d labels in '%s'", metric, OBX_METRICS_MAX_LABELS, labels);
    if (!valid_name(tok, false) || strncmp(tok, "__", 2) == 0) BUG("%s: bad label name '%s'", metric, tok);
    out[n++] = strdup(tok);
  }
  free(copy);
  return n;
}

static struct obx_metric *registry_get(kind_t kind, const char *name, const char *help, const char *labels,
                                       const double *bounds, int nbounds) {
  char *names[OBX_METRICS_MAX_LABELS] = {0};
  if (!valid_name(name, true)) BUG("bad metric name '%s'", name ? name : "(null)");
  int n = parse_labels(name, labels, names);
  if (!bounds) {
    bounds = default_buckets;
    nbounds = (int)(sizeof default_buckets / sizeof default_buckets[0]);
  }
  if (kind == KIND_HISTOGRAM) {
    for (int i = 0; i < n; i++)
      if (strcmp(names[i], "le") == 0) BUG("%s: 'le' is reserved in histograms", name);
    for (int i = 0; i < nbounds; i++)
      if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) BUG("%s: buckets must be finite and ascending", name);
  }

  pthread_mutex_lock(&g_registry);
  struct obx_metric *m;
  for (m = g_metrics; m; m = m->next) {
    if (strcmp(m->name, name) != 0) continue;
    bool same = m->kind == kind && m->nlabels == n;
    for (int i = 0; same && i < n; i++) same = strcmp(m->labels[i], names[i]) == 0;
    if (!same) BUG("%s re-registered as a %s with labels '%s'", name, kind_names[kind], labels ? labels : "");
    break;
  }
  if (m) {
    for (int i = 0; i < n; i++) free(names[i]);
  } else {
    m = calloc(1, sizeof *m);
    if (!m) abort();
    m->kind = kind;
    m->name = strdup(name);
    m->help = strdup(help ? help : "");
    m->nlabels = n;
    memcpy(m->labels, names, sizeof names);
    if (kind == KIND_HISTOGRAM) {
      m->nbounds = nbounds;
      m->bounds = malloc(sizeof *m->bounds * (size_t)(nbounds ? nbounds : 1));
      if (!m->bounds) abort();
      memcpy(m->bounds, bounds, sizeof *m->bounds * (size_t)nbounds);
    }
    pthread_mutex_init(&m->mutex, NULL);
    m->series_tail = &m->series;
    *g_metrics_tail = m;
    g_metrics_tail = &m->next;
  }
  pthread_mutex_unlock(&g_registry);
  return m;
}

obx_counter_t *obx_metrics_counter(const char *name, const char *help, const char *labels) {
  return registry_get(KIND_COUNTER, name, help, labels, NULL, 0);
}

obx_gauge_t *obx_metrics_gauge(const char *name, const char *help, const char *labels) {
  return registry_get(KIND_GAUGE, name, help, labels, NULL, 0);
}

obx_histogram_t *obx_metrics_histogram(const char *name, const char *help, const char *labels, const double *buckets,
                                       int nbuckets) {
  return registry_get(KIND_HISTOGRAM, name, help, labels, buckets, nbuckets);
}

/* Reads the metric's label values from ap. */
static void read_values(const struct obx_metric *m, va_list ap, const char *values[OBX_METRICS_MAX_LABELS]) {
  for (int i = 0; i < m->nlabels; i++) {
    values[i] = va_arg(ap, const char *);
    if (!values[i]) BUG("%s: NULL value for label %s", m->name, m->labels[i]);
  }
}

/* The series for values; created when create is set. Call with m->mutex held. */
static series_t *find_series(struct obx_metric *m, const char *const *values, bool create) {
  for (series_t *s = m->series; s; s = s->next) {
    int i = 0;
    while (i < m->nlabels && strcmp(s->values[i], values[i]) == 0) i++;
    if (i == m->nlabels) return s;
  }
  if (!create) return NULL;
  series_t *s = calloc(1, sizeof *s);
  if (!s) abort();
  for (int i = 0; i < m->nlabels; i++) s->values[i] = strdup(values[i]);
  if (m->kind == KIND_HISTOGRAM) {
    s->buckets = calloc((size_t)m->nbounds + 1, sizeof *s->buckets);
    if (!s->buckets) abort();
  }
  *m->series_tail = s;
  m->series_tail = &s->next;
  return s;
}

typedef enum { OP_ADD, OP_SET, OP_OBSERVE } op_t;

static void update(struct obx_metric *m, kind_t kind, op_t op, double v, va_list ap) {
  if (!m || m->kind != kind) BUG("%s used as a %s", m ? m->name : "(null)", kind_names[kind]);
  if (kind == KIND_COUNTER && !(v >= 0)) BUG("%s: counters only go up (delta %g)", m->name, v);
  const char *values[OBX_METRICS_MAX_LABELS];
  read_values(m, ap, values);
  pthread_mutex_lock(&m->mutex);
  series_t *s = find_series(m, values, true);
  switch (op) {
  case OP_ADD: s->value += v; break;
  case OP_SET: s->value = v; break;
  case OP_OBSERVE: {
    int b = 0;
    while (b < m->nbounds && v > m->bounds[b]) b++;
    s->buckets[b]++;
    s->count++;
    s->sum += v;
    break;
  }
  }
  pthread_mutex_unlock(&m->mutex);
}

void obx_counter_inc(obx_counter_t *counter, ...) {
  va_list ap;
  va_start(ap, counter);
  update(counter, KIND_COUNTER, OP_ADD, 1, ap);
  va_end(ap);
}

void obx_counter_add(obx_counter_t *counter, double delta, ...) {
  va_list ap;
  va_start(ap, delta);
  update(counter, KIND_COUNTER, OP_ADD, delta, ap);
  va_end(ap);
}

void obx_gauge_set(obx_gauge_t *gauge, double value, ...) {
  va_list ap;
  va_start(ap, value);
  update(gauge, KIND_GAUGE, OP_SET, value, ap);
  va_end(ap);
}

void obx_gauge_add(obx_gauge_t *gauge, double delta, ...) {
  va_list ap;
  va_start(ap, delta);
  update(gauge, KIND_GAUGE, OP_ADD, delta, ap);
  va_end(ap);
}

void obx_histogram_observe(obx_histogram_t *histogram, double value, ...) {
  va_list ap;
  va_start(ap, value);
  update(histogram, KIND_HISTOGRAM, OP_OBSERVE, value, ap);
  va_end(ap);
}

double obx_metrics_value(const struct obx_metric *metric, ...) {
  struct obx_metric *m = (struct obx_metric *)metric;
  const char *values[OBX_METRICS_MAX_LABELS];
  va_list ap;
  va_start(ap, metric);
  read_values(m, ap, values);
  va_end(ap);
  pthread_mutex_lock(&m->mutex);
  series_t *s = find_series(m, values, false);
  double v = !s ? 0 : m->kind == KIND_HISTOGRAM ? (double)s->count : s->value;
  pthread_mutex_unlock(&m->mutex);
  return v;
}

/* ---- exposition ------------------------------------------------------------------------- */

/* The shortest %g text that reads back as exactly v (0.1, not 0.10000000000000001). */
static const char *shortest(double v, char *buf, size_t len) {
  for (int digits = 6; digits < 17; digits++) {
    snprintf(buf, len, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) return buf;
  }
  snprintf(buf, len, "%.17g", v);
  return buf;
}

static void write_number(FILE *out, double v) {
  char buf[40];
  if (isnan(v))
    fputs("NaN", out);
  else if (isinf(v))
    fputs(v > 0 ? "+Inf" : "-Inf", out);
  else if (v == floor(v) && fabs(v) < 9007199254740992.0)
    fprintf(out, "%.0f", v);
  else
    fputs(shortest(v, buf, sizeof buf), out);
}

/* Label values escape \, " and newline; HELP text escapes \ and newline. */
static void write_escaped(FILE *out, const char *s, bool quote) {
  for (; *s; s++) {
    if (*s == '\\') fputs("\\\\", out);
    else if (*s == '\n') fputs("\\n", out);
    else if (quote && *s == '"') fputs("\\\"", out);
    else fputc(*s, out);
  }
}

/* {a="x",b="y"[,le="..."]} or nothing when there are no labels at all. */
static void write_labels(FILE *out, const struct obx_metric *m, const series_t *s, const char *le) {
  if (m->nlabels == 0 && !le) return;
  fputc('{', out);
  for (int i = 0; i < m->nlabels; i++) {
    fprintf(out, "%s%s=\"", i ? "," : "", m->labels[i]);
    write_escaped(out, s->values[i], true);
    fputc('"', out);
  }
  if (le) fprintf(out, "%sle=\"%s\"", m->nlabels ? "," : "", le);
  fputc('}', out);
}

static void write_metric(FILE *out, struct obx_metric *m) {
  fprintf(out, "# HELP %s ", m->name);
  write_escaped(out, m->help, false);
  fprintf(out, "\n# TYPE %s %s\n", m->name, kind_names[m->kind]);
  pthread_mutex_lock(&m->mutex);
  if (m->nlabels == 0 && !m->series) find_series(m, NULL, true); /* an unlabelled metric always shows */
  for (series_t *s = m->series; s; s = s->next) {
    if (m->kind != KIND_HISTOGRAM) {
      fputs(m->name, out);
      write_labels(out, m, s, NULL);
      fputc(' ', out);
      write_number(out, s->value);
      fputc('\n', out);
      continue;
    }
    uint64_t cumulative = 0;
    for (int b = 0; b <= m->nbounds; b++) {
      char le[40];
      if (b < m->nbounds)
        shortest(m->bounds[b], le, sizeof le);
      else
        snprintf(le, sizeof le, "+Inf");
      cumulative += s->buckets[b];
      fprintf(out, "%s_bucket", m->name);
      write_labels(out, m, s, le);
      fprintf(out, " %llu\n", (unsigned long long)cumulative);
    }
    fprintf(out, "%s_sum", m->name);
    write_labels(out, m, s, NULL);
    fputc(' ', out);
    write_number(out, s->sum);
    fprintf(out, "\n%s_count", m->name);
    write_labels(out, m, s, NULL);
    fprintf(out, " %llu\n", (unsigned long long)s->count);
  }
  pthread_mutex_unlock(&m->mutex);
}

void obx_metrics_write(FILE *out) {
  pthread_mutex_lock(&g_registry);
  for (struct obx_metric *m = g_metrics; m; m = m->next) write_metric(out, m);
  pthread_mutex_unlock(&g_registry);
}

char *obx_metrics_render(size_t *len) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) abort();
  obx_metrics_write(f);
  fclose(f);
  if (len) *len = n;
  return buf;
}

const char *obx_build_version(void) { return OBX_VERSION " (commit " OBX_REVISION ")"; }

void obx_build_info_register(void) {
  obx_gauge_set(obx_metrics_gauge("outboxd_build_info", "The version and commit this process was built from (always 1)",
                                  "version,revision"),
                1.0, OBX_VERSION, OBX_REVISION);
}
