/* arena.c — offsets of values in one arena, from their lifetimes.
 *
 * Backend-neutral: the run planner (graph.c) gives every value placed in a
 * backend's arena its size and the steps (node indices) at which it is
 * produced and last read; this places them so that no two values alive at
 * the same step overlap, reusing the bytes of values already dead. Steps are
 * processed in order; at one step the values starting there are placed
 * before those ending there are released, so a node's outputs never share
 * bytes with its own inputs. Placement is first fit over a sorted free list
 * that merges neighbours; the arena grows at its top only when no free
 * block fits (extending a free block that touches the top first).
 */
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

typedef struct {
  size_t off, size;
} arena_block_t;

typedef struct {
  arena_block_t *free;
  int n, cap;
  size_t top;
} arena_t;

static size_t arena_take(arena_t *a, size_t size) {
  for (int i = 0; i < a->n; i++)
    if (a->free[i].size >= size) {
      size_t off = a->free[i].off;
      a->free[i].off += size;
      a->free[i].size -= size;
      if (!a->free[i].size) {
        memmove(&a->free[i], &a->free[i + 1], (size_t)(a->n - i - 1) * sizeof *a->free);
        a->n--;
      }
      return off;
    }
  if (a->n && a->free[a->n - 1].off + a->free[a->n - 1].size == a->top) {
    size_t off = a->free[a->n - 1].off;
    a->top = off + size;
    a->n--;
    return off;
  }
  size_t off = a->top;
  a->top += size;
  return off;
}

static int arena_give(arena_t *a, size_t off, size_t size) {
  int i = 0;
  while (i < a->n && a->free[i].off < off)
    i++;
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 32;
    arena_block_t *nb = realloc(a->free, (size_t)cap * sizeof *nb);
    if (!nb)
      return -1;
    a->free = nb;
    a->cap = cap;
  }
  memmove(&a->free[i + 1], &a->free[i], (size_t)(a->n - i) * sizeof *a->free);
  a->free[i] = (arena_block_t){off, size};
  a->n++;
  if (i + 1 < a->n && a->free[i].off + a->free[i].size == a->free[i + 1].off) {
    a->free[i].size += a->free[i + 1].size;
    memmove(&a->free[i + 1], &a->free[i + 2], (size_t)(a->n - i - 2) * sizeof *a->free);
    a->n--;
  }
  if (i > 0 && a->free[i - 1].off + a->free[i - 1].size == a->free[i].off) {
    a->free[i - 1].size += a->free[i].size;
    memmove(&a->free[i], &a->free[i + 1], (size_t)(a->n - i - 1) * sizeof *a->free);
    a->n--;
  }
  return 0;
}

typedef struct {
  int step, idx;
} arena_ev_t;

static int ev_cmp(const void *pa, const void *pb) {
  const arena_ev_t *a = pa, *b = pb;
  if (a->step != b->step)
    return a->step < b->step ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

int32_t spn_arena_plan(const spn_live_t *v, int n, size_t align, size_t *off, size_t *peak) {
  *peak = 0;
  if (n <= 0)
    return SPN_OK;
  if (!align || (align & (align - 1)))
    return SPN_EINVAL;
  arena_ev_t *starts = malloc((size_t)n * sizeof *starts), *ends = malloc((size_t)n * sizeof *ends);
  size_t *sz = malloc((size_t)n * sizeof *sz);
  arena_t a = {0};
  int32_t rc = SPN_OK;
  if (!starts || !ends || !sz) {
    rc = SPN_ENOMEM;
    goto out;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    off[i] = 0;
    sz[i] = (v[i].size + align - 1) & ~(align - 1);
    if (sz[i] < v[i].size) { /* wrapped */
      rc = SPN_EOVERFLOW;
      goto out;
    }
    if (!sz[i])
      continue;
    starts[k] = (arena_ev_t){v[i].first, i};
    ends[k] = (arena_ev_t){v[i].last < v[i].first ? v[i].first : v[i].last, i};
    k++;
  }
  qsort(starts, (size_t)k, sizeof *starts, ev_cmp);
  qsort(ends, (size_t)k, sizeof *ends, ev_cmp);
  for (int s = 0, e = 0; s < k || e < k;) {
    int step = s < k && (e >= k || starts[s].step <= ends[e].step) ? starts[s].step : ends[e].step;
    for (; s < k && starts[s].step == step; s++)
      off[starts[s].idx] = arena_take(&a, sz[starts[s].idx]);
    for (; e < k && ends[e].step == step; e++)
      if (arena_give(&a, off[ends[e].idx], sz[ends[e].idx])) {
        rc = SPN_ENOMEM;
        goto out;
      }
  }
  *peak = a.top;
out:
  free(a.free);
  free(starts);
  free(ends);
  free(sz);
  return rc;
}
