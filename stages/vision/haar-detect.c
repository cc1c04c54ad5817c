/* haar-detect.c — multi-scale Haar-cascade detection, OpenCV-compatible.
 *
 * For each pyramid level (factor 1, f, f^2, ... while the scaled window fits
 * in the image and within max size; levels below min size are skipped) the
 * image is resized down by the factor with a bit-exact bilinear filter,
 * integral images of the pixels and of their squares (and the 45-degree
 * "tilted" integral when the cascade uses tilted features) are built, and the
 * fixed-size window slides over the level with a step of 2 pixels (1 when the
 * factor is >= 2). A window whose variance is too small is skipped; a window
 * rejected by the very first stage makes the scan skip the next position too.
 * These rules, the float/double arithmetic of the feature sums and the
 * candidate rectangle rounding follow OpenCV's detectMultiScale so that the
 * same boxes come out.
 *
 * Integral images are uint32 and wrap: every quantity we read is a difference
 * of corners of a window-sized rectangle, which modular arithmetic gets right
 * for any image size.
 *
 * Feature offsets are computed once per call for one row pitch shared by every
 * level (the pitch of the largest level), so the hot loop is loads, integer
 * adds and float multiplies over a flat, cache-friendly array of stumps.
 *
 * With params->threads > 1 the levels are shared among worker threads (greedy
 * by area); candidates are sorted by (level, y, x) before grouping so the
 * output does not depend on the thread count.
 */
#include "haar-internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define HAAR_MAX_SCALES 4096
#define HAAR_MAX_THREADS 64

/* ---------------------------------------------------------------------------
 * Bit-exact bilinear resize (cv::resize INTER_LINEAR_EXACT for CV_8UC1):
 * source coordinate (d + 0.5) * (src/dst) - 0.5 computed in double, weights
 * rounded to 8 fractional bits, a horizontal pass kept at 8 fractional bits
 * and a vertical pass rounded once at the end. */

typedef struct axis {
  int32_t *ofs;  /* first source sample */
  uint16_t *c1;  /* weight of the second sample, 0..256 */
} axis_t;

static int axis_init(axis_t *a, int32_t src, int32_t dst) {
  a->ofs = malloc((size_t)dst * sizeof *a->ofs);
  a->c1 = malloc((size_t)dst * sizeof *a->c1);
  if (!a->ofs || !a->c1)
    return -1;
  double inv = (double)dst / (double)src;
  double scale = 1.0 / inv;
  for (int32_t d = 0; d < dst; d++) {
    double f = scale * ((double)d + 0.5) - 0.5;
    double fl = floor(f);
    int32_t i = (int32_t)fl;
    if (i < 0) {
      a->ofs[d] = 0;
      a->c1[d] = 0;
    } else if (i >= src - 1) {
      a->ofs[d] = src - 1;
      a->c1[d] = 0;
    } else {
      a->ofs[d] = i;
      a->c1[d] = (uint16_t)lrint((f - fl) * 256.0);
    }
  }
  return 0;
}

static void axis_free(axis_t *a) {
  free(a->ofs);
  free(a->c1);
}

static void hline(const uint8_t *s, const axis_t *ax, int32_t sw, int32_t dw, uint16_t *out) {
  for (int32_t d = 0; d < dw; d++) {
    int32_t o = ax->ofs[d];
    uint32_t c1 = ax->c1[d];
    uint32_t b = o + 1 < sw ? s[o + 1] : s[o];
    out[d] = (uint16_t)(s[o] * (256u - c1) + b * c1);
  }
}

int32_t spn_resize_linear_u8(const uint8_t *src, int32_t sw, int32_t sh, int32_t sstride, uint8_t *dst, int32_t dw,
                             int32_t dh, int32_t dstride) {
  if (!src || !dst || sw <= 0 || sh <= 0 || dw <= 0 || dh <= 0 || sstride < sw || dstride < dw)
    return SPN_EINVAL;
  int32_t rc = SPN_OK;
  axis_t ax = {0}, ay = {0};
  uint16_t *rows = NULL;
  if (axis_init(&ax, sw, dw) || axis_init(&ay, sh, dh)) {
    rc = SPN_ENOMEM;
    goto out;
  }
  rows = malloc(2 * (size_t)dw * sizeof *rows);
  if (!rows) {
    rc = SPN_ENOMEM;
    goto out;
  }
  uint16_t *r0 = rows, *r1 = rows + dw;
  int32_t have0 = -1, have1 = -1; /* source rows held in r0, r1 */
  for (int32_t y = 0; y < dh; y++) {
    int32_t sy0 = ay.ofs[y], sy1 = sy0 + 1 < sh ? sy0 + 1 : sy0;
    uint32_t c1 = ay.c1[y], c0 = 256u - c1;
    if (have0 != sy0) {
      if (have1 == sy0) { /* slide down: reuse the lower row */
        uint16_t *t = r0;
        r0 = r1;
        r1 = t;
        have0 = sy0;
        have1 = -1;
      } else {
        hline(src + (size_t)sy0 * sstride, &ax, sw, dw, r0);
        have0 = sy0;
      }
    }
    if (have1 != sy1) {
      hline(src + (size_t)sy1 * sstride, &ax, sw, dw, r1);
      have1 = sy1;
    }
    uint8_t *o = dst + (size_t)y * dstride;
    for (int32_t x = 0; x < dw; x++) {
      uint32_t v = ((uint32_t)r0[x] * c0 + (uint32_t)r1[x] * c1 + 32768u) >> 16;
      o[x] = (uint8_t)(v > 255 ? 255 : v);
    }
  }
out:
  free(rows);
  axis_free(&ax);
  axis_free(&ay);
  return rc;
}

/* ---------------------------------------------------------------------------
 * Integral images. sum/sq have (h+1) rows of pitch S (>= w+1); row 0 and
 * column 0 are zero. */

static void integral_sum_sq(const uint8_t *img, int32_t w, int32_t h, int32_t istride, uint32_t *sum, uint32_t *sq,
                            int32_t S) {
  memset(sum, 0, (size_t)(w + 1) * sizeof *sum);
  memset(sq, 0, (size_t)(w + 1) * sizeof *sq);
  for (int32_t y = 0; y < h; y++) {
    const uint8_t *row = img + (size_t)y * istride;
    const uint32_t *ps = sum + (size_t)y * S, *pq = sq + (size_t)y * S;
    uint32_t *cs = sum + (size_t)(y + 1) * S, *cq = sq + (size_t)(y + 1) * S;
    uint32_t rs = 0, rq = 0;
    cs[0] = 0;
    cq[0] = 0;
    for (int32_t x = 0; x < w; x++) {
      uint32_t v = row[x];
      rs += v;
      rq += v * v;
      cs[x + 1] = ps[x + 1] + rs;
      cq[x + 1] = pq[x + 1] + rq;
    }
  }
}

/* Tilted integral: T(X,Y) = sum of I(x,y) over y < Y, |x - X + 1| <= Y - 1 - y
 * (a cone opening upwards from pixel (X-1, Y-1)), with pixels outside the
 * image counting zero. Recurrence:
 *   T(X,Y) = T(X-1,Y-1) + T(X+1,Y-1) - T(X,Y-2) + I(X-1,Y-1) + I(X-1,Y-2).
 * The cones reach H columns beyond either side, so three rolling rows span
 * X in [-H, W+H]. */
static int integral_tilted(const uint8_t *img, int32_t w, int32_t h, int32_t istride, uint32_t *tilt, int32_t S) {
  int32_t pad = h + 1, ew = w + 1 + 2 * pad;
  uint32_t *buf = calloc(3 * (size_t)ew, sizeof *buf);
  if (!buf)
    return -1;
  uint32_t *rm2 = buf, *rm1 = buf + ew, *cur = buf + 2 * (size_t)ew; /* rows Y-2, Y-1, Y */
  memset(tilt, 0, (size_t)(w + 1) * sizeof *tilt);
  for (int32_t Y = 1; Y <= h; Y++) {
    const uint8_t *r1 = img + (size_t)(Y - 1) * istride;
    const uint8_t *r2 = Y >= 2 ? img + (size_t)(Y - 2) * istride : NULL;
    for (int32_t e = 0; e < ew; e++) {
      int32_t X = e - pad;
      uint32_t v = (e > 0 ? rm1[e - 1] : 0) + (e + 1 < ew ? rm1[e + 1] : 0) - rm2[e];
      int32_t px = X - 1;
      if (px >= 0 && px < w) {
        v += r1[px];
        if (r2)
          v += r2[px];
      }
      cur[e] = v;
    }
    memcpy(tilt + (size_t)Y * S, cur + pad, (size_t)(w + 1) * sizeof *tilt);
    uint32_t *t = rm2;
    rm2 = rm1;
    rm1 = cur;
    cur = t;
  }
  free(buf);
  return 0;
}

/* ---------------------------------------------------------------------------
 * Evaluation. */

typedef struct opt_feature {
  int32_t ofs[SPN__HAAR_MAX_RECTS][4];
  float w[SPN__HAAR_MAX_RECTS];
} opt_feature_t;

/* A stump with its feature inlined: the hot loop walks this array in order. */
typedef struct opt_stump {
  opt_feature_t f;
  float threshold, left, right;
} opt_stump_t;

typedef struct plan {
  const spn_haar_cascade_t *c;
  int32_t S;          /* row pitch of every integral buffer */
  int32_t tofs;       /* offset of the tilted plane after the sum plane */
  int32_t nofs[4];    /* the normalisation rectangle (1,1,w-2,h-2) */
  double area;
  opt_feature_t *feat; /* per feature (trees) */
  opt_stump_t *stumps; /* per stump (stump cascades) */
} plan_t;

static void set_offsets(opt_feature_t *o, const haar_feature_t *f, int32_t S, int32_t tofs) {
  memset(o, 0, sizeof *o);
  for (int32_t k = 0; k < f->nrects; k++) {
    int32_t x = f->r[k].x, y = f->r[k].y, w = f->r[k].w, h = f->r[k].h;
    o->w[k] = f->r[k].weight;
    if (f->tilted) {
      o->ofs[k][0] = tofs + x + S * y;
      o->ofs[k][1] = tofs + x - h + S * (y + h);
      o->ofs[k][2] = tofs + x + w + S * (y + w);
      o->ofs[k][3] = tofs + x + w - h + S * (y + w + h);
    } else {
      o->ofs[k][0] = x + S * y;
      o->ofs[k][1] = x + w + S * y;
      o->ofs[k][2] = x + S * (y + h);
      o->ofs[k][3] = x + w + S * (y + h);
    }
  }
}

#define RECT_SUM(p, o) ((int32_t)((p)[(o)[0]] - (p)[(o)[1]] - (p)[(o)[2]] + (p)[(o)[3]]))

/* The feature value exactly as OpenCV computes it: float weights times int
 * sums, the third rectangle only when its weight is non-zero, then times the
 * window's variance normalisation factor. */
static inline float feature_value(const opt_feature_t *f, const uint32_t *p, float vnf) {
  float ret = f->w[0] * (float)RECT_SUM(p, f->ofs[0]) + f->w[1] * (float)RECT_SUM(p, f->ofs[1]);
  if (f->w[2] != 0.0f)
    ret += f->w[2] * (float)RECT_SUM(p, f->ofs[2]);
  return ret * vnf;
}

/* Trees: 1 accepted; -k: rejected by stage k (0 for the first stage). */
static int32_t run_trees(const plan_t *pl, const uint32_t *p, float vnf) {
  const spn_haar_cascade_t *c = pl->c;
  for (int32_t si = 0; si < c->nstages; si++) {
    const haar_stage_t *stg = &c->stages[si];
    double sum = 0;
    for (int32_t t = stg->first_tree; t < stg->first_tree + stg->ntrees; t++) {
      const haar_tree_t *tr = &c->trees[t];
      const haar_node_t *nodes = &c->nodes[tr->first_node];
      int32_t idx = 0;
      do {
        const haar_node_t *n = &nodes[idx];
        double val = feature_value(&pl->feat[n->feature], p, vnf);
        idx = val < n->threshold ? n->left : n->right;
      } while (idx > 0);
      sum += c->leaves[tr->first_leaf - idx];
    }
    if (sum < stg->threshold)
      return -si;
  }
  return 1;
}

/* ---------------------------------------------------------------------------
 * Levels and workers. */

typedef struct level {
  float scale;
  int32_t w, h;  /* scaled image size */
  int32_t ystep;
  int32_t worker;
} level_t;

typedef struct cand {
  int32_t level, y, x;
} cand_t;

typedef struct worker {
  const plan_t *pl;
  const level_t *levels;
  int32_t nlevels, id;
  const uint8_t *img;
  int32_t iw, ih, istride;
  int32_t max_w, max_h; /* largest level this worker handles */
  cand_t *cands;
  int32_t ncands, cap;
  int32_t rc;
} worker_t;

static int push_cand(worker_t *wk, int32_t level, int32_t y, int32_t x) {
  if (wk->ncands == wk->cap) {
    int32_t nc = wk->cap ? wk->cap * 2 : 256;
    cand_t *q = realloc(wk->cands, (size_t)nc * sizeof *q);
    if (!q)
      return -1;
    wk->cands = q;
    wk->cap = nc;
  }
  wk->cands[wk->ncands++] = (cand_t){level, y, x};
  return 0;
}

/* Row scan for stump cascades, stage-major: the windows of a row are
 * evaluated a stage at a time, the stage's stumps in the outer loop and the
 * surviving windows in the inner one, so each stump's offsets and weights
 * are loaded once per row instead of once per window. Each window still sums
 * its stumps in cascade order in a double, so every result is the one the
 * window-by-window evaluation (OpenCV's order) gives. The first stage is
 * evaluated for every window with enough variance; the walk that follows
 * applies the skip rule (a window the first stage rejects makes the scan skip
 * the next one) exactly as the window-by-window scan does, discarding the
 * results it skips. */
typedef struct row_scratch {
  float *vnf;
  int32_t *idx;  /* window indices (k: x = k * step) */
  double *tmp;
} row_scratch_t;

static int32_t scan_row_stumps(const plan_t *pl, const uint32_t *prow, const uint32_t *qrow, int32_t ww, int32_t step,
                               row_scratch_t *rs, worker_t *wk, int32_t li, int32_t y) {
  const spn_haar_cascade_t *c = pl->c;
  const int32_t *n = pl->nofs;
  int32_t K = (ww + step - 1) / step, nv = 0;
  /* Variance normalisation; windows without enough variance drop out here. */
  for (int32_t k = 0; k < K; k++) {
    const uint32_t *p = prow + (size_t)k * step, *q = qrow + (size_t)k * step;
    int32_t vs = (int32_t)(p[n[0]] - p[n[1]] - p[n[2]] + p[n[3]]);
    uint32_t vq = q[n[0]] - q[n[1]] - q[n[2]] + q[n[3]];
    double nf = pl->area * (double)vq - (double)vs * (double)vs;
    rs->vnf[k] = 0.f;
    if (nf <= 0.0)
      continue;
    float vnf = (float)(1.0 / sqrt(nf));
    if (!(pl->area * (double)vnf < 1e-1))
      continue;
    rs->vnf[k] = vnf;
    rs->idx[nv++] = k;
  }
  const opt_stump_t *st = pl->stumps;
  for (int32_t si = 0; si < c->nstages && nv > 0; si++) {
    const haar_stage_t *stg = &c->stages[si];
    for (int32_t j = 0; j < nv; j++)
      rs->tmp[j] = 0.0;
    for (int32_t i = 0; i < stg->ntrees; i++) {
      const opt_stump_t *sp = &st[i];
      for (int32_t j = 0; j < nv; j++) {
        int32_t k = rs->idx[j];
        float v = feature_value(&sp->f, prow + (size_t)k * step, rs->vnf[k]);
        rs->tmp[j] += v < sp->threshold ? sp->left : sp->right;
      }
    }
    st += stg->ntrees;
    int32_t m = 0;
    if (si == 0) {
      /* The walk: rejected by the first stage -> the next window is skipped. */
      int32_t skip_until = -1;
      for (int32_t j = 0; j < nv; j++) {
        int32_t k = rs->idx[j];
        if (k <= skip_until)
          continue;
        if (rs->tmp[j] < stg->threshold)
          skip_until = k + 1;
        else
          rs->idx[m++] = k;
      }
    } else {
      for (int32_t j = 0; j < nv; j++)
        if (!(rs->tmp[j] < stg->threshold))
          rs->idx[m++] = rs->idx[j];
    }
    nv = m;
  }
  for (int32_t j = 0; j < nv; j++)
    if (push_cand(wk, li, y, rs->idx[j] * step))
      return SPN_ENOMEM;
  return SPN_OK;
}

static void *worker_run(void *arg) {
  worker_t *wk = arg;
  const plan_t *pl = wk->pl;
  const spn_haar_cascade_t *c = pl->c;
  int32_t S = pl->S;
  size_t plane = (size_t)(wk->max_h + 1) * S;
  uint8_t *lvl = malloc((size_t)wk->max_w * wk->max_h);
  uint32_t *sum = malloc(plane * (c->has_tilted ? 2 : 1) * sizeof *sum);
  uint32_t *sq = malloc(plane * sizeof *sq);
  row_scratch_t rs = {malloc(((size_t)wk->max_w + 1) * sizeof(float)), malloc(((size_t)wk->max_w + 1) * sizeof(int32_t)),
                      malloc(((size_t)wk->max_w + 1) * sizeof(double))};
  wk->rc = SPN_OK;
  if (!lvl || !sum || !sq || !rs.vnf || !rs.idx || !rs.tmp) {
    wk->rc = SPN_ENOMEM;
    goto out;
  }
  for (int32_t li = 0; li < wk->nlevels; li++) {
    const level_t *L = &wk->levels[li];
    if (L->worker != wk->id)
      continue;
    if (spn_resize_linear_u8(wk->img, wk->iw, wk->ih, wk->istride, lvl, L->w, L->h, L->w) != SPN_OK) {
      wk->rc = SPN_ENOMEM;
      goto out;
    }
    integral_sum_sq(lvl, L->w, L->h, L->w, sum, sq, S);
    /* The tilted plane sits pl->tofs entries after the sum plane. */
    if (c->has_tilted && integral_tilted(lvl, L->w, L->h, L->w, sum + pl->tofs, S)) {
      wk->rc = SPN_ENOMEM;
      goto out;
    }
    /* OpenCV's window test (pt.x + win_w >= w + 1 rejects) bounds x and y. */
    int32_t ww = L->w + 1 - c->win_w, wh = L->h + 1 - c->win_h;
    int32_t step = L->ystep;
    const int32_t *n = pl->nofs;
    for (int32_t y = 0; y < wh; y += step) {
      const uint32_t *prow = sum + (size_t)y * S, *qrow = sq + (size_t)y * S;
      if (pl->stumps) {
        if (scan_row_stumps(pl, prow, qrow, ww, step, &rs, wk, li, y) != SPN_OK) {
          wk->rc = SPN_ENOMEM;
          goto out;
        }
        continue;
      }
      for (int32_t x = 0; x < ww; x += step) {
        const uint32_t *p = prow + x, *q = qrow + x;
        int32_t vs = (int32_t)(p[n[0]] - p[n[1]] - p[n[2]] + p[n[3]]);
        uint32_t vq = q[n[0]] - q[n[1]] - q[n[2]] + q[n[3]];
        double nf = pl->area * (double)vq - (double)vs * (double)vs;
        if (nf <= 0.0)
          continue;
        float vnf = (float)(1.0 / sqrt(nf));
        if (!(pl->area * (double)vnf < 1e-1))
          continue;
        int32_t r = run_trees(pl, p, vnf);
        if (r > 0 && push_cand(wk, li, y, x)) {
          wk->rc = SPN_ENOMEM;
          goto out;
        }
        if (r == 0)
          x += step;
      }
    }
  }
out:
  free(rs.vnf);
  free(rs.idx);
  free(rs.tmp);
  free(lvl);
  free(sum);
  free(sq);
  return NULL;
}

static int cand_cmp(const void *a, const void *b) {
  const cand_t *p = a, *q = b;
  if (p->level != q->level)
    return p->level < q->level ? -1 : 1;
  if (p->y != q->y)
    return p->y < q->y ? -1 : 1;
  return (p->x > q->x) - (p->x < q->x);
}

int32_t spn_haar_detect(const spn_haar_cascade_t *c, const uint8_t *gray, int32_t width, int32_t height,
                        int32_t stride, const spn_haar_params_t *params, spn_rect_t **rects, int32_t *n,
                        spn_error_t *err) {
  if (!c || !rects || !n)
    return spn_error_set(err, SPN_EINVAL, "haar: NULL cascade or output pointer");
  *rects = NULL;
  *n = 0;
  spn_haar_params_t P = SPN_HAAR_PARAMS_INIT;
  if (params)
    P = *params;
  if (!gray || width <= 0 || height <= 0 || stride < width || width > 65536 || height > 65536)
    return spn_error_set(err, SPN_EINVAL, "haar: bad image %dx%d stride %d", width, height, stride);
  if (!(P.scale_factor > 1.0 && P.scale_factor <= 100.0))
    return spn_error_set(err, SPN_EINVAL, "haar: scale_factor %g must be in (1, 100]", P.scale_factor);
  if (P.min_neighbors < 0 || P.min_w < 0 || P.min_h < 0 || P.max_w < 0 || P.max_h < 0)
    return spn_error_set(err, SPN_EINVAL, "haar: negative min_neighbors or size limit");
  int32_t threads = P.threads < 1 ? 1 : (P.threads > HAAR_MAX_THREADS ? HAAR_MAX_THREADS : P.threads);
  const int32_t nworkers_alloc = threads;
  int32_t max_w = P.max_w, max_h = P.max_h;
  if (max_w == 0 || max_h == 0) {
    max_w = width;
    max_h = height;
  }
  if (width < c->win_w || height < c->win_h)
    return SPN_OK;

  int32_t rc = SPN_OK;
  level_t *levels = malloc(HAAR_MAX_SCALES * sizeof *levels);
  plan_t pl = {.c = c};
  worker_t *wks = calloc((size_t)threads, sizeof *wks);
  pthread_t *tids = calloc((size_t)threads, sizeof *tids);
  cand_t *all = NULL;
  spn_rect_t *out = NULL;
  if (!levels || !wks || !tids) {
    rc = spn_error_set(err, SPN_ENOMEM, "haar: out of memory");
    goto out_free;
  }

  /* The pyramid, as OpenCV builds it: double factor, float scale. */
  int32_t nlevels = 0;
  for (double factor = 1.0;; factor *= P.scale_factor) {
    int32_t ww = (int32_t)lrint(c->win_w * factor), wh = (int32_t)lrint(c->win_h * factor);
    if (ww > max_w || wh > max_h || ww > width || wh > height)
      break;
    if (ww < P.min_w || wh < P.min_h)
      continue;
    if (nlevels == HAAR_MAX_SCALES) {
      rc = spn_error_set(err, SPN_EINVAL, "haar: more than %d pyramid levels (scale_factor %g too small)",
                         HAAR_MAX_SCALES, P.scale_factor);
      goto out_free;
    }
    level_t *L = &levels[nlevels++];
    L->scale = (float)factor;
    L->w = (int32_t)lrintf((float)width / L->scale);
    L->h = (int32_t)lrintf((float)height / L->scale);
    L->ystep = L->scale >= 2.0f ? 1 : 2;
  }
  if (nlevels == 0)
    goto out_free;

  /* One pitch for every level: offsets are computed once. */
  int32_t maxlw = 0, maxlh = 0;
  for (int32_t i = 0; i < nlevels; i++) {
    if (levels[i].w > maxlw)
      maxlw = levels[i].w;
    if (levels[i].h > maxlh)
      maxlh = levels[i].h;
  }
  pl.S = maxlw + 1;
  pl.tofs = (maxlh + 1) * pl.S; /* only used when the cascade has tilted features */
  int32_t nw = c->win_w - 2, nh = c->win_h - 2;
  pl.nofs[0] = 1 + pl.S * 1;
  pl.nofs[1] = 1 + nw + pl.S * 1;
  pl.nofs[2] = 1 + pl.S * (1 + nh);
  pl.nofs[3] = 1 + nw + pl.S * (1 + nh);
  pl.area = (double)nw * nh;
  if (c->stumps) {
    pl.stumps = malloc((size_t)c->ntrees * sizeof *pl.stumps);
    if (!pl.stumps) {
      rc = spn_error_set(err, SPN_ENOMEM, "haar: out of memory");
      goto out_free;
    }
    for (int32_t i = 0; i < c->ntrees; i++) {
      set_offsets(&pl.stumps[i].f, &c->features[c->stumps[i].feature], pl.S, pl.tofs);
      pl.stumps[i].threshold = c->stumps[i].threshold;
      pl.stumps[i].left = c->stumps[i].left;
      pl.stumps[i].right = c->stumps[i].right;
    }
  } else {
    pl.feat = malloc((size_t)c->nfeatures * sizeof *pl.feat);
    if (!pl.feat) {
      rc = spn_error_set(err, SPN_ENOMEM, "haar: out of memory");
      goto out_free;
    }
    for (int32_t i = 0; i < c->nfeatures; i++)
      set_offsets(&pl.feat[i], &c->features[i], pl.S, pl.tofs);
  }

  /* Share the levels among workers, largest first, to the least loaded. */
  if (threads > nlevels)
    threads = nlevels;
  double load[HAAR_MAX_THREADS] = {0};
  for (int32_t i = 0; i < nlevels; i++) {
    int32_t best = 0;
    for (int32_t t = 1; t < threads; t++)
      if (load[t] < load[best])
        best = t;
    levels[i].worker = best;
    load[best] += (double)levels[i].w * levels[i].h / ((double)levels[i].ystep * levels[i].ystep);
  }
  for (int32_t t = 0; t < threads; t++) {
    worker_t *wk = &wks[t];
    wk->pl = &pl;
    wk->levels = levels;
    wk->nlevels = nlevels;
    wk->id = t;
    wk->img = gray;
    wk->iw = width;
    wk->ih = height;
    wk->istride = stride;
    for (int32_t i = 0; i < nlevels; i++)
      if (levels[i].worker == t) {
        if (levels[i].w > wk->max_w)
          wk->max_w = levels[i].w;
        if (levels[i].h > wk->max_h)
          wk->max_h = levels[i].h;
      }
  }
  int32_t started = 0;
  for (int32_t t = 1; t < threads; t++) {
    if (pthread_create(&tids[t], NULL, worker_run, &wks[t]) != 0) {
      wks[t].rc = SPN_ENOMEM;
      break;
    }
    started = t;
  }
  worker_run(&wks[0]);
  for (int32_t t = 1; t <= started; t++)
    pthread_join(tids[t], NULL);
  /* A worker that could not start leaves its levels unscanned: fail. */
  int32_t total = 0;
  for (int32_t t = 0; t < threads; t++) {
    if (wks[t].rc != SPN_OK) {
      rc = spn_error_set(err, wks[t].rc, "haar: worker %d failed (out of memory or no thread)", t);
      goto out_free;
    }
    total += wks[t].ncands;
  }
  if (total == 0)
    goto out_free;
  all = malloc((size_t)total * sizeof *all);
  out = malloc((size_t)total * sizeof *out);
  if (!all || !out) {
    rc = spn_error_set(err, SPN_ENOMEM, "haar: out of memory");
    goto out_free;
  }
  int32_t k = 0;
  for (int32_t t = 0; t < threads; t++) {
    if (wks[t].ncands > 0)
      memcpy(all + k, wks[t].cands, (size_t)wks[t].ncands * sizeof *all);
    k += wks[t].ncands;
  }
  qsort(all, (size_t)total, sizeof *all, cand_cmp);
  for (int32_t i = 0; i < total; i++) {
    const level_t *L = &levels[all[i].level];
    float sc = L->scale;
    out[i].x = (int32_t)lrintf((float)all[i].x * sc);
    out[i].y = (int32_t)lrintf((float)all[i].y * sc);
    out[i].w = (int32_t)lrintf((float)c->win_w * sc);
    out[i].h = (int32_t)lrintf((float)c->win_h * sc);
  }
  int32_t count = total;
  if (P.min_neighbors > 0 && spn_haar_group_rectangles(out, &count, P.min_neighbors, 0.2) != SPN_OK) {
    rc = spn_error_set(err, SPN_ENOMEM, "haar: out of memory");
    goto out_free;
  }
  if (count > 0) {
    *rects = out;
    *n = count;
    out = NULL;
  }

out_free:
  free(out);
  free(all);
  if (wks)
    for (int32_t t = 0; t < nworkers_alloc; t++)
      free(wks[t].cands);
  free(wks);
  free(tids);
  free(pl.stumps);
  free(pl.feat);
  free(levels);
  return rc;
}

/* ---------------------------------------------------------------------------
 * groupRectangles. */

static int similar(const spn_rect_t *a, const spn_rect_t *b, double eps) {
  double delta = eps * ((a->w < b->w ? a->w : b->w) + (a->h < b->h ? a->h : b->h)) * 0.5;
  return fabs((double)a->x - b->x) <= delta && fabs((double)a->y - b->y) <= delta &&
         fabs((double)(a->x + a->w) - (b->x + b->w)) <= delta &&
         fabs((double)(a->y + a->h) - (b->y + b->h)) <= delta;
}

static int32_t find_root(int32_t *parent, int32_t i) {
  int32_t r = i;
  while (parent[r] >= 0)
    r = parent[r];
  while (parent[i] >= 0) { /* path compression */
    int32_t nx = parent[i];
    parent[i] = r;
    i = nx;
  }
  return r;
}

int32_t spn_haar_group_rectangles(spn_rect_t *rects, int32_t *n, int32_t group_threshold, double eps) {
  int32_t N = *n;
  if (group_threshold <= 0 || N <= 0)
    return SPN_OK;
  int32_t rc = SPN_OK;
  int32_t *parent = malloc((size_t)N * sizeof *parent);
  int32_t *label = malloc((size_t)N * sizeof *label);
  int64_t *acc = calloc((size_t)N * 4, sizeof *acc);
  int32_t *cnt = calloc((size_t)N, sizeof *cnt);
  spn_rect_t *avg = malloc((size_t)N * sizeof *avg);
  if (!parent || !label || !acc || !cnt || !avg) {
    rc = SPN_ENOMEM;
    goto out;
  }
  for (int32_t i = 0; i < N; i++)
    parent[i] = -1;
  for (int32_t i = 0; i < N; i++)
    for (int32_t j = i + 1; j < N; j++)
      if (similar(&rects[i], &rects[j], eps)) {
        int32_t a = find_root(parent, i), b = find_root(parent, j);
        if (a != b)
          parent[b] = a;
      }
  /* Classes numbered by first appearance, as cv::partition does. */
  int32_t nclasses = 0;
  for (int32_t i = 0; i < N; i++)
    label[i] = -1;
  for (int32_t i = 0; i < N; i++) {
    int32_t r = find_root(parent, i);
    if (label[r] < 0)
      label[r] = nclasses++;
    int32_t cl = label[r];
    acc[4 * cl + 0] += rects[i].x;
    acc[4 * cl + 1] += rects[i].y;
    acc[4 * cl + 2] += rects[i].w;
    acc[4 * cl + 3] += rects[i].h;
    cnt[cl]++;
  }
  for (int32_t cl = 0; cl < nclasses; cl++) {
    float s = 1.f / (float)cnt[cl];
    avg[cl].x = (int32_t)lrintf((float)acc[4 * cl + 0] * s);
    avg[cl].y = (int32_t)lrintf((float)acc[4 * cl + 1] * s);
    avg[cl].w = (int32_t)lrintf((float)acc[4 * cl + 2] * s);
    avg[cl].h = (int32_t)lrintf((float)acc[4 * cl + 3] * s);
  }
  int32_t k = 0;
  for (int32_t i = 0; i < nclasses; i++) {
    spn_rect_t r1 = avg[i];
    int32_t n1 = cnt[i];
    if (n1 <= group_threshold)
      continue;
    /* Drop a cluster lying inside a bigger, better supported one. */
    int32_t j;
    for (j = 0; j < nclasses; j++) {
      int32_t n2 = cnt[j];
      if (j == i || n2 <= group_threshold)
        continue;
      spn_rect_t r2 = avg[j];
      int32_t dx = (int32_t)lrint(r2.w * eps), dy = (int32_t)lrint(r2.h * eps);
      if (r1.x >= r2.x - dx && r1.y >= r2.y - dy && r1.x + r1.w <= r2.x + r2.w + dx &&
          r1.y + r1.h <= r2.y + r2.h + dy && (n2 > (n1 > 3 ? n1 : 3) || n1 < 3))
        break;
    }
    if (j == nclasses)
      rects[k++] = r1;
  }
  *n = k;
out:
  free(parent);
  free(label);
  free(acc);
  free(cnt);
  free(avg);
  return rc;
}
