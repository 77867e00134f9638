/* uuid.c - UUIDv7 event ids (RFC 9562 §5.7, monotonic with the §6.2 method 1 counter)
 *
 * DESIGN: 48-bit Unix ms timestamp, version 7, a 12-bit counter in rand_a, variant 10, 62
 * random bits from getrandom(). The counter is reseeded with a random value below 2^11 on
 * each new millisecond and incremented within the same one; when it overflows, or when the
 * clock goes backwards, the timestamp is advanced past the last one used, so ids generated
 * by this process are strictly increasing (as strings too). One mutex guards the state. */
#include "obx/obx_event.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

static pthread_mutex_t g_uuid_mutex = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_last_ms = -1;
static unsigned g_counter;

static void random_bytes(void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom((char *)buf + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      perror("getrandom");
      abort();
    }
    got += (size_t)r;
  }
}

void obx_uuid7(char out[OBX_UUID_LEN + 1]) {
  uint8_t b[16];
  random_bytes(b, sizeof b);
  int64_t now = obx_time_now_ms();

  pthread_mutex_lock(&g_uuid_mutex);
  if (now > g_last_ms) {
    g_last_ms = now;
    g_counter = ((unsigned)b[6] << 8 | b[7]) & 0x7ff;
  } else if (++g_counter > 0xfff) {
    g_last_ms++;
    g_counter = ((unsigned)b[6] << 8 | b[7]) & 0x7ff;
  }
  int64_t ms = g_last_ms;
  unsigned counter = g_counter;
  pthread_mutex_unlock(&g_uuid_mutex);

  for (int i = 0; i < 6; i++) b[i] = (uint8_t)(ms >> (8 * (5 - i)));
  b[6] = (uint8_t)(0x70 | (counter >> 8));
  b[7] = (uint8_t)(counter & 0xff);
  b[8] = (uint8_t)(0x80 | (b[8] & 0x3f));
  snprintf(out, OBX_UUID_LEN + 1, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

bool obx_uuid_valid(const char *s) {
  if (!s) return false;
  for (int i = 0; i < OBX_UUID_LEN; i++) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (s[i] != '-') return false;
    } else if (!isxdigit((unsigned char)s[i])) {
      return false;
    }
  }
  return s[OBX_UUID_LEN] == '\0';
}
