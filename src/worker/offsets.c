/* offsets.c - which Kafka offsets may be committed: contiguous completions per partition
 *
 * DESIGN: the Kafka thread hands records to the runners in offset order per partition and records
 * each offset here; runners finish out of order (different keys). An offset is
 * committed only when it and every earlier handed-out offset of its partition has its outcome
 * in the inbox, so a crash never skips an unfinished record. Owned by the Kafka thread. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "worker_int.h"

static worker_partition_offsets_t *find(worker_offsets_t *o, int32_t partition, bool create) {
  for (int i = 0; i < o->n; i++)
    if (o->parts[i].partition == partition) return &o->parts[i];
  if (!create) return NULL;
  o->parts = realloc(o->parts, (size_t)(o->n + 1) * sizeof *o->parts);
  assert(o->parts);
  worker_partition_offsets_t *p = &o->parts[o->n++];
  memset(p, 0, sizeof *p);
  p->partition = partition;
  p->committed = -1;
  return p;
}

void worker_offsets_add(worker_offsets_t *o, int32_t partition, int64_t offset) {
  worker_partition_offsets_t *p = find(o, partition, true);
  if (p->n > 0 && offset <= p->offsets[p->start + p->n - 1]) {
    /* The consumer went back (a seek or an offset reset): what follows is read again, so the
     * earlier bookkeeping no longer decides anything. */
    p->start = p->n = 0;
    p->committed = -1;
  }
  if (p->start > 0 && p->start + p->n == p->cap) { /* reuse the popped prefix */
    memmove(p->offsets, p->offsets + p->start, (size_t)p->n * sizeof *p->offsets);
    memmove(p->done, p->done + p->start, (size_t)p->n * sizeof *p->done);
    p->start = 0;
  }
  if (p->start + p->n == p->cap) {
    p->cap = p->cap ? p->cap * 2 : 64;
    p->offsets = realloc(p->offsets, (size_t)p->cap * sizeof *p->offsets);
    p->done = realloc(p->done, (size_t)p->cap * sizeof *p->done);
    assert(p->offsets && p->done);
  }
  p->offsets[p->start + p->n] = offset;
  p->done[p->start + p->n] = false;
  p->n++;
}

void worker_offsets_done(worker_offsets_t *o, int32_t partition, int64_t offset) {
  worker_partition_offsets_t *p = find(o, partition, false);
  if (!p) return;
  int lo = p->start, hi = p->start + p->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    if (p->offsets[mid] == offset) {
      p->done[mid] = true;
      return;
    }
    if (p->offsets[mid] < offset) lo = mid + 1;
    else hi = mid - 1;
  }
}

int worker_offsets_advance(worker_offsets_t *o, int32_t *partitions, int64_t *next, int max) {
  int k = 0;
  for (int i = 0; i < o->n && k < max; i++) {
    worker_partition_offsets_t *p = &o->parts[i];
    int64_t to = -1;
    while (p->n > 0 && p->done[p->start]) {
      to = p->offsets[p->start] + 1;
      p->start++;
      p->n--;
    }
    if (p->n == 0) p->start = 0;
    if (to > p->committed) {
      p->committed = to;
      partitions[k] = p->partition;
      next[k++] = to;
    }
  }
  return k;
}

int worker_offsets_points(const worker_offsets_t *o, int32_t *partitions, int64_t *next, int max) {
  int k = 0;
  for (int i = 0; i < o->n && k < max; i++)
    if (o->parts[i].committed >= 0) {
      partitions[k] = o->parts[i].partition;
      next[k++] = o->parts[i].committed;
    }
  return k;
}

int64_t worker_offsets_pending_low(const worker_offsets_t *o, int32_t partition) {
  for (int i = 0; i < o->n; i++)
    if (o->parts[i].partition == partition)
      return o->parts[i].n > 0 ? o->parts[i].offsets[o->parts[i].start] : -1;
  return -1;
}

bool worker_offsets_idle(const worker_offsets_t *o) {
  for (int i = 0; i < o->n; i++)
    if (o->parts[i].n > 0) return false;
  return true;
}

void worker_offsets_clear(worker_offsets_t *o) {
  for (int i = 0; i < o->n; i++) {
    free(o->parts[i].offsets);
    free(o->parts[i].done);
  }
  free(o->parts);
  memset(o, 0, sizeof *o);
}
