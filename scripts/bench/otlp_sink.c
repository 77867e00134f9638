/* otlp_sink.c - a bare OTLP/HTTP collector for scripts/bench/trace.sh
 *
 *   otlp_sink PORT_FILE [HANG_MS]
 *
 * Listens on 127.0.0.1 (a free port, written to PORT_FILE), answers every POST with 200 {} (or
 * after HANG_MS: a collector that accepts and stalls) and counts the spans it receives (one
 * "kind": per span in OTLP JSON). On SIGTERM or SIGINT prints "requests=N spans=M" and exits. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_long requests, spans;
static int hang_ms;

static long count_spans(const char *s, size_t n) {
  long c = 0;
  for (const char *p = s; p && (size_t)(p - s) < n; p++) {
    p = memmem(p, n - (size_t)(p - s), "\"kind\":", 7);
    if (!p) break;
    c++;
  }
  return c;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *data, size_t *size, void **state) {
  if (!*state) { /* first call: headers only */
    *state = conn;
    return MHD_YES;
  }
  if (*size) {
    atomic_fetch_add(&spans, count_spans(data, *size));
    *size = 0;
    return MHD_YES;
  }
  atomic_fetch_add(&requests, 1);
  if (hang_ms) usleep((useconds_t)hang_ms * 1000);
  struct MHD_Response *resp = MHD_create_response_from_buffer(2, "{}", MHD_RESPMEM_PERSISTENT);
  MHD_add_response_header(resp, "Content-Type", "application/json");
  enum MHD_Result r = MHD_queue_response(conn, MHD_HTTP_OK, resp);
  MHD_destroy_response(resp);
  return r;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: otlp_sink PORT_FILE [HANG_MS]\n");
    return 2;
  }
  hang_ms = argc > 2 ? atoi(argv[2]) : 0;
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
                                          NULL, answer, NULL, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_END);
  if (!d) {
    fprintf(stderr, "otlp_sink: cannot listen\n");
    return 1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  FILE *f = fopen(argv[1], "w");
  fprintf(f, "%u\n", (unsigned)info->port);
  fclose(f);
  int sig;
  sigwait(&sigs, &sig);
  printf("requests=%ld spans=%ld\n", atomic_load(&requests), atomic_load(&spans));
  fflush(stdout);
  _exit(0); /* a hanging handler may still sleep: do not wait for it */
}
