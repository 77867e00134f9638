/* time.c - wall-clock milliseconds, wait deadlines and RFC 3339 text (declared in obx_event.h)
 *
 * DESIGN: all timestamps in outboxd are int64 milliseconds since the Unix epoch, UTC.
 * Formatting always writes UTC with exactly three fraction digits and "Z"; parsing accepts
 * any RFC 3339 date-time (fraction of any length, "Z" or a numeric offset). */
#include "obx/obx_event.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int64_t obx_time_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t obx_time_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct timespec obx_time_deadline(clockid_t clock, int64_t ms) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  int64_t ns = ts.tv_nsec + ms % 1000 * 1000000;
  ts.tv_sec += (time_t)(ms / 1000 + ns / 1000000000);
  ts.tv_nsec = (long)(ns % 1000000000);
  return ts;
}

void obx_time_format_rfc3339(int64_t ms, char out[32]) {
  int64_t secs = ms / 1000, frac = ms % 1000;
  if (frac < 0) {
    frac += 1000;
    secs -= 1;
  }
  time_t t = (time_t)secs;
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[96];
  int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                   tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)frac);
  if (n < 0 || n > 31) n = 31; /* only for years beyond 9999 */
  memcpy(out, buf, (size_t)n);
  out[n] = '\0';
}

/* Reads exactly n digits. */
static bool digits(const char **p, int n, int *out) {
  int v = 0;
  for (int i = 0; i < n; i++) {
    if (!isdigit((unsigned char)(*p)[i])) return false;
    v = v * 10 + ((*p)[i] - '0');
  }
  *p += n;
  *out = v;
  return true;
}

static bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

bool obx_time_parse_rfc3339(const char *s, int64_t *ms) {
  static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  int Y, M, D, h, m, sec, oh = 0, om = 0, sign = 0;
  const char *p = s;
  if (!s) return false;
  if (!digits(&p, 4, &Y) || *p++ != '-' || !digits(&p, 2, &M) || *p++ != '-' || !digits(&p, 2, &D)) return false;
  if (*p != 'T' && *p != 't' && *p != ' ') return false;
  p++;
  if (!digits(&p, 2, &h) || *p++ != ':' || !digits(&p, 2, &m) || *p++ != ':' || !digits(&p, 2, &sec)) return false;
  if (M < 1 || M > 12 || D < 1 || D > mdays[M - 1] + (M == 2 && leap(Y)) || h > 23 || m > 59 || sec > 60)
    return false;
  int frac_ms = 0;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p)) return false;
    for (int i = 0; isdigit((unsigned char)*p); i++, p++)
      if (i < 3) frac_ms += (*p - '0') * (i == 0 ? 100 : i == 1 ? 10 : 1);
  }
  if (*p == 'Z' || *p == 'z') {
    p++;
  } else if (*p == '+' || *p == '-') {
    sign = *p == '+' ? 1 : -1;
    p++;
    if (!digits(&p, 2, &oh) || *p++ != ':' || !digits(&p, 2, &om) || oh > 23 || om > 59) return false;
  } else {
    return false;
  }
  if (*p != '\0') return false;
  struct tm tm = {0};
  tm.tm_year = Y - 1900;
  tm.tm_mon = M - 1;
  tm.tm_mday = D;
  tm.tm_hour = h;
  tm.tm_min = m;
  tm.tm_sec = sec > 59 ? 59 : sec; /* a leap second is read as :59 */
  int64_t secs = (int64_t)timegm(&tm) - (int64_t)sign * (oh * 3600 + om * 60);
  *ms = secs * 1000 + frac_ms;
  return true;
}
