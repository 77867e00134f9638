/* test_relay_share.c - the plan by which relays share the buckets (relay_share_plan, buckets.c)
 *
 * DESIGN: one row per line of the table at the top of src/relay/buckets.c: a relay's held
 * buckets, the others' leases and the live relays in, the buckets it may hold out. Buckets are
 * written as strings, one character per bucket: held 'H' / free '.' / a live relay's 'O' / a
 * relay's that is no longer live 'D'; the wanted plan as 'A' (allowed) / '.'. */
#include <stdio.h>
#include <string.h>

#include "../../src/relay/relay_int.h"
#include "obx_test.h"

typedef struct {
  const char *name;
  const char *buckets; /* H held, . free, O a live relay's, D a dead relay's */
  int live, me;
  const char *want;    /* A allowed */
  int share;
} row_t;

static const row_t rows[] = {
  {"alone: every free bucket", "............", 1, 0, "AAAAAAAAAAAA", 12},
  {"first of three: a third, from bucket 0", "............", 3, 0, "AAAA........", 4},
  {"second of three: a third, from bucket 4", "............", 3, 1, "....AAAA....", 4},
  {"third of three: from bucket 8", "............", 3, 2, "........AAAA", 4},
  {"at its share: keeps them, takes nothing (sticky)", "HHHHOOOOOOOO", 3, 0, "AAAA........", 4},
  {"more relays: the surplus (highest held) is handed over", "HHHHOOOOOOOO", 4, 0, "AAA.........", 3},
  {"one died: free buckets first", "HHHHOOOO....", 2, 0, "AAAA....AA..", 6},
  {"from its place: the second relay starts at 6", "OOOOHHHH....", 2, 1, "....AAAAAA..", 6},
  {"not enough free: stands by on others' buckets", "HHHHOOOOOOO.", 2, 0, "AAAAA......A", 6},
  {"joining: stands by on others' until they hand over", "OOOOOOOOOOOO", 4, 3, ".........AAA", 3},
  {"one died, its leases not expired yet: its buckets before live ones", "HHHHOOOODDDD", 2, 0, "AAAA....AA..", 6},
  {"free, then dead, then live", "HHHHO.OODDDD", 2, 0, "AAAA.A..A...", 6},
  {"one bucket, a standby: stands by on it", "O", 2, 1, "A", 1},
  {"one bucket, the holder keeps it", "H", 2, 0, "A", 1},
  {"more relays than buckets: one each at most", "HH..", 8, 0, "A...", 1},
  {"short of its share: the next free one from its place", "...H", 2, 1, "..AA", 2},
};

static void test_share_plan(void **state) {
  (void)state;
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    const row_t *row = &rows[r];
    int32_t nb = (int32_t)strlen(row->buckets);
    bool held[16], allowed[16];
    relay_lease_state_t leases[16];
    for (int32_t b = 0; b < nb; b++) {
      held[b] = row->buckets[b] == 'H';
      leases[b] = row->buckets[b] == 'O' ? RELAY_LEASE_OTHER : row->buckets[b] == 'D' ? RELAY_LEASE_ORPHAN : RELAY_LEASE_FREE;
    }
    int32_t share = relay_share_plan(nb, held, leases, row->live, row->me, allowed);
    char got[17];
    for (int32_t b = 0; b < nb; b++) got[b] = allowed[b] ? 'A' : '.';
    got[nb] = 0;
    if (strcmp(got, row->want) != 0 || share != row->share)
      fail_msg("%s: %s with %d live, me %d: got %s share %d, want %s share %d", row->name, row->buckets, row->live,
               row->me, got, share, row->want, row->share);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_share_plan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
