/* obx_metrics.h - process-wide Prometheus metrics registry
 *
 * DESIGN: one registry per process, filled by the modules that own the numbers and read by
 * GET /metrics. A metric is registered once by name (registering the same name again with the
 * same type and label names returns the same metric, so modules may register lazily from any
 * thread); it lives until the process exits. Each metric has up to 3 label names; a series is
 * created the first time a combination of label values is used. Every update takes the
 * metric's own mutex, so updates from different threads never lose increments. Misuse (bad
 * name, more than 3 labels, a name re-registered with another type or labels) is a bug and
 * aborts with file:line.
 *
 *   static obx_counter_t *published;
 *   published = obx_metrics_counter("outboxd_relay_published_total", "Events acknowledged by Kafka", "topic");
 *   obx_counter_inc(published, "domain-events");
 *
 * Label values are passed as trailing `const char *` arguments, exactly as many as the metric
 * has label names (none for an unlabelled metric). Values are copied. */
#ifndef OBX_METRICS_H
#define OBX_METRICS_H

#include <stddef.h>
#include <stdio.h>

#define OBX_METRICS_MAX_LABELS 3

typedef struct obx_metric obx_counter_t;
typedef struct obx_metric obx_gauge_t;
typedef struct obx_metric obx_histogram_t;

/* `labels`: comma-separated label names ("topic,result"), or NULL / "" for none. The returned
 * pointer is borrowed from the registry and valid for the life of the process. */
obx_counter_t *obx_metrics_counter(const char *name, const char *help, const char *labels);
obx_gauge_t *obx_metrics_gauge(const char *name, const char *help, const char *labels);
/* `buckets`: ascending upper bounds (the +Inf bucket is implicit); NULL uses the Prometheus
 * defaults (.005 .01 .025 .05 .1 .25 .5 1 2.5 5 10, for seconds). Copied. */
obx_histogram_t *obx_metrics_histogram(const char *name, const char *help, const char *labels, const double *buckets,
                                       int nbuckets);

/* Counters only go up: a negative delta is a bug. */
void obx_counter_inc(obx_counter_t *counter, ...);
void obx_counter_add(obx_counter_t *counter, double delta, ...);
void obx_gauge_set(obx_gauge_t *gauge, double value, ...);
void obx_gauge_add(obx_gauge_t *gauge, double delta, ...);
void obx_histogram_observe(obx_histogram_t *histogram, double value, ...);

/* Current value of one series (0 when it does not exist yet); for histograms, the count. */
double obx_metrics_value(const struct obx_metric *metric, ...);

/* The version (OBX_VERSION) and commit (OBX_REVISION) this program was built from, as
 * "0.1.0 (commit abc123...)"; and the gauge outboxd_build_info{version, revision} = 1. */
const char *obx_build_version(void);
void obx_build_info_register(void);

/* Writes every metric in the Prometheus text exposition format 0.0.4 (HELP and TYPE lines,
 * escaped label values, histograms as _bucket{le=...} cumulative counts, _sum and _count). */
void obx_metrics_write(FILE *out);
/* The same text in a new buffer (caller frees); *len receives its length (may be NULL). */
char *obx_metrics_render(size_t *len);

#endif
