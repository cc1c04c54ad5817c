/* track.c — IoU track association and per-track moving-average box smoothing.
 *
 * Each live track keeps a ring of its last `window` raw boxes, the frame it
 * was last matched and its id. Per frame: all (track, detection) pairs with
 * IoU >= threshold are matched greedily, highest IoU first (ties: lower track
 * then lower detection index, so results do not depend on sort internals);
 * unmatched detections open tracks; tracks unmatched for more than
 * max_missed frames are dropped. The state only changes after the whole frame
 * validated and all allocations succeeded, so a failed update leaves it as it
 * was.
 */
#include "track.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct track {
  int64_t id;
  int64_t last_frame;
  int32_t count; /* boxes in the ring, <= window */
  int32_t head;  /* next slot to write */
  spn_box_t *ring;
} track_t;

struct spn_box_smoother {
  spn_box_smoother_params_t p;
  track_t *tracks;
  int32_t ntracks, cap;
  int64_t frame;
  int64_t next_id;
};

int32_t spn_box_smoother_new(const spn_box_smoother_params_t *params, spn_box_smoother_t **out, spn_error_t *err) {
  if (!out)
    return spn_error_set(err, SPN_EINVAL, "box smoother: NULL output pointer");
  *out = NULL;
  spn_box_smoother_params_t p = SPN_BOX_SMOOTHER_PARAMS_INIT;
  if (params)
    p = *params;
  if (p.window < 1 || p.window > 1024 || !(p.iou_threshold > 0.f && p.iou_threshold <= 1.f) || p.max_missed < 0)
    return spn_error_set(err, SPN_EINVAL,
                         "box smoother: window %d must be 1..1024, iou_threshold %g in (0, 1], max_missed %d >= 0",
                         p.window, p.iou_threshold, p.max_missed);
  spn_box_smoother_t *s = calloc(1, sizeof *s);
  if (!s)
    return spn_error_set(err, SPN_ENOMEM, "box smoother: out of memory");
  s->p = p;
  s->next_id = 1;
  *out = s;
  return SPN_OK;
}

void spn_box_smoother_free(spn_box_smoother_t *s) {
  if (!s)
    return;
  for (int32_t i = 0; i < s->ntracks; i++)
    free(s->tracks[i].ring);
  free(s->tracks);
  free(s);
}

int32_t spn_box_smoother_tracks(const spn_box_smoother_t *s) {
  return s ? s->ntracks : 0;
}

static float box_iou(const spn_box_t *a, const spn_box_t *b) {
  float iw = fminf(a->x1, b->x1) - fmaxf(a->x0, b->x0);
  float ih = fminf(a->y1, b->y1) - fmaxf(a->y0, b->y0);
  if (iw <= 0.f || ih <= 0.f)
    return 0.f;
  float inter = iw * ih;
  float uni = (a->x1 - a->x0) * (a->y1 - a->y0) + (b->x1 - b->x0) * (b->y1 - b->y0) - inter;
  return uni > 0.f ? inter / uni : 0.f;
}

typedef struct pair {
  float iou;
  int32_t t, d;
} pair_t;

static int pair_cmp(const void *a, const void *b) {
  const pair_t *p = a, *q = b;
  if (p->iou != q->iou)
    return p->iou < q->iou ? 1 : -1;
  if (p->t != q->t)
    return p->t < q->t ? -1 : 1;
  return (p->d > q->d) - (p->d < q->d);
}

static const spn_box_t *last_box(const spn_box_smoother_t *s, const track_t *t) {
  return &t->ring[(t->head + s->p.window - 1) % s->p.window];
}

int32_t spn_box_smoother_update(spn_box_smoother_t *s, const spn_box_t *dets, int32_t n, spn_tracked_box_t *out,
                                spn_error_t *err) {
  if (!s || n < 0 || (n > 0 && (!dets || !out)))
    return spn_error_set(err, SPN_EINVAL, "box smoother: bad arguments");
  for (int32_t i = 0; i < n; i++) {
    const spn_box_t *b = &dets[i];
    if (!isfinite(b->x0) || !isfinite(b->y0) || !isfinite(b->x1) || !isfinite(b->y1) || b->x1 < b->x0 ||
        b->y1 < b->y0)
      return spn_error_set(err, SPN_EINVAL, "box smoother: frame %lld detection %d is not a valid box",
                           (long long)s->frame, i);
  }
  int32_t rc = SPN_OK;
  int32_t W = s->p.window;
  int32_t nt = s->ntracks;
  int64_t npairs_max = (int64_t)nt * n;
  pair_t *pairs = npairs_max ? malloc((size_t)npairs_max * sizeof *pairs) : NULL;
  int32_t *det_track = malloc(((size_t)n + 1) * sizeof *det_track);
  uint8_t *t_used = calloc((size_t)nt + 1, 1);
  /* Room for every new track and its ring before touching the state. */
  track_t *grown = NULL;
  spn_box_t **rings = calloc((size_t)n + 1, sizeof *rings);
  if ((npairs_max && !pairs) || !det_track || !t_used || !rings) {
    rc = spn_error_set(err, SPN_ENOMEM, "box smoother: out of memory");
    goto out;
  }
  int32_t np = 0;
  for (int32_t t = 0; t < nt; t++)
    for (int32_t d = 0; d < n; d++) {
      float v = box_iou(last_box(s, &s->tracks[t]), &dets[d]);
      if (v >= s->p.iou_threshold)
        pairs[np++] = (pair_t){v, t, d};
    }
  if (np > 1)
    qsort(pairs, (size_t)np, sizeof *pairs, pair_cmp);
  for (int32_t d = 0; d < n; d++)
    det_track[d] = -1;
  for (int32_t k = 0; k < np; k++)
    if (!t_used[pairs[k].t] && det_track[pairs[k].d] < 0) {
      t_used[pairs[k].t] = 1;
      det_track[pairs[k].d] = pairs[k].t;
    }
  int32_t nnew = 0;
  for (int32_t d = 0; d < n; d++)
    if (det_track[d] < 0) {
      rings[nnew] = malloc((size_t)W * sizeof **rings);
      if (!rings[nnew]) {
        rc = spn_error_set(err, SPN_ENOMEM, "box smoother: out of memory");
        goto out;
      }
      nnew++;
    }
  if (nt + nnew > s->cap) {
    int32_t nc = s->cap ? s->cap : 8;
    while (nc < nt + nnew)
      nc *= 2;
    grown = realloc(s->tracks, (size_t)nc * sizeof *grown);
    if (!grown) {
      rc = spn_error_set(err, SPN_ENOMEM, "box smoother: out of memory");
      goto out;
    }
    s->tracks = grown;
    s->cap = nc;
  }

  /* Commit: nothing below fails. */
  int32_t r = 0;
  for (int32_t d = 0; d < n; d++) {
    track_t *t;
    if (det_track[d] >= 0) {
      t = &s->tracks[det_track[d]];
    } else {
      det_track[d] = s->ntracks;
      t = &s->tracks[s->ntracks++];
      *t = (track_t){.id = s->next_id++, .ring = rings[r]};
      rings[r++] = NULL;
    }
    t->ring[t->head] = dets[d];
    t->head = (t->head + 1) % W;
    if (t->count < W)
      t->count++;
    t->last_frame = s->frame;
    double acc[4] = {0, 0, 0, 0};
    for (int32_t k = 0; k < t->count; k++) {
      const spn_box_t *b = &t->ring[(t->head + W - 1 - k) % W];
      acc[0] += b->x0;
      acc[1] += b->y0;
      acc[2] += b->x1;
      acc[3] += b->y1;
    }
    out[d].box = (spn_box_t){(float)(acc[0] / t->count), (float)(acc[1] / t->count), (float)(acc[2] / t->count),
                             (float)(acc[3] / t->count)};
    out[d].track_id = t->id;
    out[d].history = t->count;
  }
  /* Drop tracks unmatched for more than max_missed frames. */
  int32_t k = 0;
  for (int32_t t = 0; t < s->ntracks; t++) {
    if (s->frame - s->tracks[t].last_frame > s->p.max_missed) {
      free(s->tracks[t].ring);
      continue;
    }
    s->tracks[k++] = s->tracks[t];
  }
  s->ntracks = k;
  s->frame++;

out:
  if (rings)
    for (int32_t i = 0; i <= n; i++)
      free(rings[i]);
  free(rings);
  free(pairs);
  free(det_track);
  free(t_used);
  return rc;
}

int32_t spn_box_smooth_sequence(spn_box_t *boxes, int32_t n, int32_t window) {
  if (n < 0 || window < 1 || (n > 0 && !boxes))
    return SPN_EINVAL;
  for (int32_t i = 0; i < n; i++) {
    int32_t lo, hi;
    if ((int64_t)i + window > n) {
      /* boxes[len(boxes) - T:], Python slice semantics. */
      lo = n - window;
      if (lo < 0)
        lo += n;
      if (lo < 0)
        lo = 0;
      hi = n;
    } else {
      lo = i;
      hi = i + window;
    }
    double acc[4] = {0, 0, 0, 0};
    for (int32_t k = lo; k < hi; k++) {
      acc[0] += boxes[k].x0;
      acc[1] += boxes[k].y0;
      acc[2] += boxes[k].x1;
      acc[3] += boxes[k].y1;
    }
    int32_t cnt = hi - lo;
    if (cnt > 0)
      boxes[i] = (spn_box_t){(float)(acc[0] / cnt), (float)(acc[1] / cnt), (float)(acc[2] / cnt),
                             (float)(acc[3] / cnt)};
  }
  return SPN_OK;
}
