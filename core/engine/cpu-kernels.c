/* cpu-kernels.c — the CPU backend's C kernels.
 *
 * spn_cpu_exec runs one node on the host. Conv, ConvTranspose and the pools
 * go to oneDNN (cpu-dnnl.c), MatMul and Gemm to its sgemm; everything else is
 * plain C written so the compiler vectorises the inner loops, parallelised
 * with OpenMP over outer loops. Constant folding and shape-class values use
 * these kernels too, whatever the model's device. Run-time errors (an index
 * out of range) are reported through r->err, never by crashing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops-internal.h"

/* ---- broadcasting ---- */

/* Element strides of `a` inside output shape (0 on broadcast dims). */
static void bcast_strides(const spn_rt_val_t *a, int nd, const int64_t *oshape, int64_t *st) {
  int64_t s = 1;
  for (int i = nd - 1; i >= 0; i--) {
    int ia = i - (nd - a->ndim);
    int64_t d = ia >= 0 ? a->shape[ia] : 1;
    st[i] = (d == 1 && oshape[i] != 1) ? 0 : s;
    if (d == 1)
      st[i] = 0;
    s *= d;
  }
}

enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_PRELU };

#define ROW_LOOP(OP, EXPR)                                             \
  do {                                                                 \
    if (sa == 1 && sb == 1)                                            \
      for (int64_t j = 0; j < inner; j++) { float x = pa[j], w = pb[j]; py[j] = EXPR; } \
    else if (sa == 1)                                                  \
      for (int64_t j = 0; j < inner; j++) { float x = pa[j], w = pb[0]; py[j] = EXPR; } \
    else if (sb == 1)                                                  \
      for (int64_t j = 0; j < inner; j++) { float x = pa[0], w = pb[j]; py[j] = EXPR; } \
    else                                                               \
      for (int64_t j = 0; j < inner; j++) { float x = pa[0], w = pb[0]; py[j] = EXPR; } \
  } while (0)

static void binary_f32(int op, const spn_rt_val_t *a, const spn_rt_val_t *b, spn_rt_val_t *y) {
  int nd = y->ndim;
  int64_t sta[SPN_MAXD], stb[SPN_MAXD];
  bcast_strides(a, nd, y->shape, sta);
  bcast_strides(b, nd, y->shape, stb);
  int64_t inner = nd ? y->shape[nd - 1] : 1;
  int64_t outer = inner ? numel(y) / inner : 0;
  int64_t sa = nd ? sta[nd - 1] : 0, sb = nd ? stb[nd - 1] : 0;
  const float *A = a->data, *B = b->data;
  float *Y = y->data;
#pragma omp parallel for schedule(static) if (numel(y) > PAR_MIN)
  for (int64_t o = 0; o < outer; o++) {
    int64_t rem = o, oa = 0, ob = 0;
    for (int d = nd - 2; d >= 0; d--) {
      int64_t c = rem % y->shape[d];
      rem /= y->shape[d];
      oa += c * sta[d];
      ob += c * stb[d];
    }
    const float *pa = A + oa, *pb = B + ob;
    float *py = Y + o * inner;
    switch (op) {
    case BIN_ADD: ROW_LOOP(op, x + w); break;
    case BIN_SUB: ROW_LOOP(op, x - w); break;
    case BIN_MUL: ROW_LOOP(op, x * w); break;
    case BIN_DIV: ROW_LOOP(op, x / w); break;
    default: ROW_LOOP(op, x > 0 ? x : x * w); break;
    }
  }
}

static int32_t binary_i64(spn_run_t *r, int op, const spn_rt_val_t *a, const spn_rt_val_t *b,
                          spn_rt_val_t *y) {
  int nd = y->ndim;
  int64_t sta[SPN_MAXD], stb[SPN_MAXD];
  bcast_strides(a, nd, y->shape, sta);
  bcast_strides(b, nd, y->shape, stb);
  int64_t total = numel(y);
  const int64_t *A = a->data, *B = b->data;
  int64_t *Y = y->data;
  for (int64_t i = 0; i < total; i++) {
    int64_t rem = i, oa = 0, ob = 0;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t c = rem % y->shape[d];
      rem /= y->shape[d];
      oa += c * sta[d];
      ob += c * stb[d];
    }
    int64_t x = A[oa], w = B[ob];
    switch (op) {
    case BIN_ADD: Y[i] = (int64_t)((uint64_t)x + (uint64_t)w); break;
    case BIN_SUB: Y[i] = (int64_t)((uint64_t)x - (uint64_t)w); break;
    case BIN_MUL: Y[i] = (int64_t)((uint64_t)x * (uint64_t)w); break;
    case BIN_DIV:
      if (w == 0 || (x == INT64_MIN && w == -1))
        return spn_op_fail(r, SPN_EINVAL, "integer division by zero");
      Y[i] = x / w;
      break;
    default: return spn_op_fail(r, SPN_ETYPE, "PRelu needs float");
    }
  }
  return SPN_OK;
}

void spn_apply_post(spn_run_t *r, const spn_node_t *n, float *y, int64_t count) {
  spn_spost_t all = {.n = n};
  spn_apply_post_from(r, &all, y, count);
}

void spn_apply_post_from(spn_run_t *r, const spn_spost_t *sp, float *y, int64_t count) {
  const spn_node_t *n = sp->n;
  int to = sp->to ? sp->to : n->n_post;
  for (int p = sp->from; p < to; p++) {
    const spn_post_t *po = &n->post[p];
    float a = po->a, b = po->b;
    switch (po->kind) {
    case SPN_POST_RELU:
#pragma omp parallel for if (count > PAR_MIN)
      for (int64_t i = 0; i < count; i++) y[i] = y[i] > 0 ? y[i] : 0;
      break;
    case SPN_POST_LRELU:
#pragma omp parallel for if (count > PAR_MIN)
      for (int64_t i = 0; i < count; i++) y[i] = y[i] > 0 ? y[i] : y[i] * a;
      break;
    case SPN_POST_SIGMOID:
#pragma omp parallel for if (count > PAR_MIN)
      for (int64_t i = 0; i < count; i++) y[i] = 1.f / (1.f + expf(-y[i]));
      break;
    case SPN_POST_TANH:
#pragma omp parallel for if (count > PAR_MIN)
      for (int64_t i = 0; i < count; i++) y[i] = tanhf(y[i]);
      break;
    case SPN_POST_CLIP:
#pragma omp parallel for if (count > PAR_MIN)
      for (int64_t i = 0; i < count; i++) y[i] = y[i] < a ? a : (y[i] > b ? b : y[i]);
      break;
    case SPN_POST_SCALE:
#pragma omp parallel for if (count > PAR_MIN)
      for (int64_t i = 0; i < count; i++) y[i] *= a;
      break;
    case SPN_POST_ADD:
    case SPN_POST_PRELU: {
      const spn_rt_val_t *o = &r->v[po->val];
      spn_rt_val_t yv = r->v[n->out[0]];
      yv.data = y;
      binary_f32(po->kind == SPN_POST_ADD ? BIN_ADD : BIN_PRELU, &yv, o, &yv);
      break;
    }
    default: break;
    }
  }
}

/* ---- kernels ---- */

static void softmax(const float *x, float *y, int64_t outer, int64_t len, int64_t inner) {
#pragma omp parallel for if (outer * len * inner > PAR_MIN)
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const float *px = x + o * len * inner + i;
      float *py = y + o * len * inner + i;
      float mx = -INFINITY;
      for (int64_t k = 0; k < len; k++)
        mx = px[k * inner] > mx ? px[k * inner] : mx;
      float s = 0;
      for (int64_t k = 0; k < len; k++)
        s += (py[k * inner] = expf(px[k * inner] - mx));
      float inv = 1.f / s;
      for (int64_t k = 0; k < len; k++)
        py[k * inner] *= inv;
    }
}

static float src_coord(const char *ct, float xo, float scale, int64_t in, int64_t out) {
  if (!strcmp(ct, "align_corners"))
    return out == 1 ? 0.f : xo * (float)(in - 1) / (float)(out - 1);
  if (!strcmp(ct, "asymmetric"))
    return xo / scale;
  if (!strcmp(ct, "pytorch_half_pixel"))
    return out > 1 ? (xo + 0.5f) / scale - 0.5f : 0.f;
  if (!strcmp(ct, "tf_half_pixel_for_nearest"))
    return (xo + 0.5f) / scale;
  return (xo + 0.5f) / scale - 0.5f;
}

static int64_t nearest_idx(const char *nm, float c, int64_t in) {
  int64_t i;
  if (!strcmp(nm, "floor"))
    i = (int64_t)floorf(c);
  else if (!strcmp(nm, "ceil"))
    i = (int64_t)ceilf(c);
  else if (!strcmp(nm, "round_prefer_ceil"))
    i = (int64_t)floorf(c + 0.5f);
  else
    i = (c == floorf(c) + 0.5f) ? (int64_t)floorf(c) : (int64_t)roundf(c);
  return i < 0 ? 0 : (i >= in ? in - 1 : i);
}

/* Cubic convolution weight at distance d (Keys; a = cubic_coeff_a). */
static float cubic_w(float d, float a) {
  d = fabsf(d);
  if (d <= 1.f)
    return ((a + 2.f) * d - (a + 3.f)) * d * d + 1.f;
  if (d < 2.f)
    return ((a * d - 5.f * a) * d + 8.f * a) * d - 4.f * a;
  return 0.f;
}

/* Per output position o of one axis: the 4 source taps (clamped to the
 * edge, as ONNX Runtime does) and their weights; with exclude_outside the
 * taps outside the input get weight 0 and the rest are renormalised. */
static void cubic_taps(const char *ct, float scale, int64_t in, int64_t out, float a, bool excl, int64_t *idx,
                       float *w) {
  for (int64_t o = 0; o < out; o++) {
    float c = src_coord(ct, (float)o, scale, in, out);
    float f = floorf(c), t = c - f;
    float sum = 0.f;
    for (int k = 0; k < 4; k++) {
      int64_t i = (int64_t)f - 1 + k;
      float wk = cubic_w(t + 1.f - (float)k, a);
      if (excl && (i < 0 || i >= in))
        wk = 0.f;
      idx[4 * o + k] = i < 0 ? 0 : (i >= in ? in - 1 : i);
      w[4 * o + k] = wk;
      sum += wk;
    }
    if (excl && sum != 0.f)
      for (int k = 0; k < 4; k++)
        w[4 * o + k] /= sum;
  }
}

bool spn_resize_is_cubic(const spn_node_t *n) {
  return n->op == SPN_OP_RESIZE && !strcmp(spn_attr_str(n, "mode", "nearest"), "cubic");
}

int32_t spn_resize_cubic_tables(spn_run_t *r, const spn_node_t *n, int64_t *sp, int64_t **idx_out, float **w_out) {
  const spn_rt_val_t *x = IN(0);
  spn_rt_val_t *y = OUT(0);
  float sc[SPN_MAXD];
  int64_t sz[SPN_MAXD];
  int32_t rc = spn_op_infer_resize(r, n, sc, sz);
  if (rc)
    return rc;
  int nsp = x->ndim - 2;
  if (nsp < 1 || nsp > 2)
    return spn_op_fail(r, SPN_EUNSUPPORTED, "cubic Resize needs 1 or 2 spatial dims, not %d", nsp);
  const char *ct = spn_attr_str(n, "coordinate_transformation_mode", "half_pixel");
  float a = spn_attr_float(n, "cubic_coeff_a", -0.75f);
  bool excl = spn_attr_int(n, "exclude_outside", 0) != 0;
  int64_t ih = nsp == 2 ? x->shape[2] : 1, iw = x->shape[x->ndim - 1];
  int64_t oh = nsp == 2 ? y->shape[2] : 1, ow = y->shape[y->ndim - 1];
  float sh = nsp == 2 ? sc[2] : 1.f, sw = sc[x->ndim - 1];
  int64_t *hi = malloc((size_t)(oh + ow) * 4 * sizeof(int64_t));
  float *hw = malloc((size_t)(oh + ow) * 4 * sizeof(float));
  if (!hi || !hw) {
    free(hi);
    free(hw);
    return spn_op_fail(r, SPN_ENOMEM, "out of memory");
  }
  cubic_taps(ct, sh, ih, oh, a, excl, hi, hw);
  cubic_taps(ct, sw, iw, ow, a, excl, hi + 4 * oh, hw + 4 * oh);
  if (nsp == 1) /* one row: the H axis is the identity */
    for (int64_t k = 0; k < 4; k++) {
      hi[k] = 0;
      hw[k] = k == 1 ? 1.f : 0.f;
    }
  sp[0] = ih, sp[1] = iw, sp[2] = oh, sp[3] = ow;
  *idx_out = hi;
  *w_out = hw;
  return SPN_OK;
}

/* Resize mode "cubic" over the two innermost dims of (N,C,H,W) (or (N,C,W)):
 * each output sums four rows of four taps (spn_resize_cubic_tables). */
static int32_t exec_resize_cubic(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = IN(0);
  spn_rt_val_t *y = OUT(0);
  int64_t sp[4], *hi;
  float *hw;
  int32_t rc = spn_resize_cubic_tables(r, n, sp, &hi, &hw);
  if (rc)
    return rc;
  int64_t ih = sp[0], iw = sp[1], oh = sp[2], ow = sp[3];
  int64_t *wi = hi + 4 * oh;
  float *ww = hw + 4 * oh;
  int64_t planes = x->shape[0] * x->shape[1];
  const float *X = x->data;
  float *Y = y->data;
#pragma omp parallel for collapse(2) if (planes * oh * ow > PAR_MIN)
  for (int64_t p = 0; p < planes; p++)
    for (int64_t o = 0; o < oh; o++) {
      const float *xp = X + p * ih * iw;
      float *row = Y + (p * oh + o) * ow;
      for (int64_t q = 0; q < ow; q++) {
        float acc = 0.f;
        for (int k = 0; k < 4; k++) {
          const float *src = xp + hi[4 * o + k] * iw;
          float rowv = 0.f;
          for (int j = 0; j < 4; j++)
            rowv += ww[4 * q + j] * src[wi[4 * q + j]];
          acc += hw[4 * o + k] * rowv;
        }
        row[q] = acc;
      }
    }
  free(hi);
  free(hw);
  return SPN_OK;
}

int32_t spn_resize_tables(spn_run_t *r, const spn_node_t *n, int64_t *ish, int64_t *osh, int *linear_out,
                          int64_t **i0_out, float **w_out) {
  const spn_rt_val_t *x = IN(0);
  spn_rt_val_t *y = OUT(0);
  float sc[SPN_MAXD];
  int64_t sz[SPN_MAXD];
  int32_t rc = spn_op_infer_resize(r, n, sc, sz);
  if (rc)
    return rc;
  const char *mode = spn_attr_str(n, "mode", "nearest");
  if (!strcmp(mode, "cubic")) /* 4 taps per axis: exec_resize_cubic's own tables */
    return spn_op_fail(r, SPN_EUNSUPPORTED, "cubic Resize has no 2-tap tables");
  bool linear = strcmp(mode, "nearest") != 0;
  const char *ct = n->op == SPN_OP_UPSAMPLE ? "asymmetric" : spn_attr_str(n, "coordinate_transformation_mode", "half_pixel");
  const char *nm = n->op == SPN_OP_UPSAMPLE ? "floor" : spn_attr_str(n, "nearest_mode", "round_prefer_floor");
  int nsp = x->ndim - 2;
  /* Treat 1-D and 3-D as 2-D/3-D with leading size-1 spatial dims: support
   * up to 3 spatial dims via (D, H, W). */
  float scl[3] = {1, 1, 1};
  for (int i = 0; i < 3; i++)
    ish[i] = osh[i] = 1;
  for (int i = 0; i < nsp; i++) {
    ish[3 - nsp + i] = x->shape[2 + i];
    osh[3 - nsp + i] = y->shape[2 + i];
    scl[3 - nsp + i] = sc[2 + i];
  }
  int64_t tot = osh[0] + osh[1] + osh[2];
  int64_t *ib = malloc((size_t)tot * 2 * sizeof(int64_t));
  float *wb = malloc((size_t)tot * sizeof(float));
  if (!ib || !wb) {
    free(ib);
    free(wb);
    return spn_op_fail(r, SPN_ENOMEM, "out of memory");
  }
  int64_t off = 0;
  for (int a = 0; a < 3; a++) {
    int64_t *i0 = ib + off, *i1 = ib + tot + off;
    float *wt = wb + off;
    for (int64_t o = 0; o < osh[a]; o++) {
      float c = src_coord(ct, (float)o, scl[a], ish[a], osh[a]);
      if (!linear) {
        i0[o] = i1[o] = nearest_idx(nm, c, ish[a]);
        wt[o] = 0;
      } else {
        if (c < 0) c = 0;
        if (c > (float)(ish[a] - 1)) c = (float)(ish[a] - 1);
        int64_t f = (int64_t)floorf(c);
        i0[o] = f;
        i1[o] = f + 1 < ish[a] ? f + 1 : ish[a] - 1;
        wt[o] = c - (float)f;
      }
    }
    off += osh[a];
  }
  *linear_out = linear;
  *i0_out = ib;
  *w_out = wb;
  return SPN_OK;
}

static int32_t exec_resize(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = IN(0);
  spn_rt_val_t *y = OUT(0);
  if (spn_resize_is_cubic(n))
    return exec_resize_cubic(r, n);
  int64_t ish[3], osh[3], *ib;
  float *wb;
  int lin;
  int32_t rc = spn_resize_tables(r, n, ish, osh, &lin, &ib, &wb);
  if (rc)
    return rc;
  bool linear = lin;
  int64_t planes = x->shape[0] * x->shape[1];
  int64_t tot = osh[0] + osh[1] + osh[2];
  int64_t *i0[3], *i1[3];
  float *wt[3];
  int64_t off = 0;
  for (int a = 0; a < 3; a++) {
    i0[a] = ib + off;
    i1[a] = ib + tot + off;
    wt[a] = wb + off;
    off += osh[a];
  }
  const float *X = x->data;
  float *Y = y->data;
  int64_t ipl = ish[0] * ish[1] * ish[2], opl = osh[0] * osh[1] * osh[2];
#pragma omp parallel for collapse(2) if (planes * opl > PAR_MIN)
  for (int64_t p = 0; p < planes; p++)
    for (int64_t od = 0; od < osh[0]; od++) {
      const float *xp = X + p * ipl;
      float *yp = Y + p * opl + od * osh[1] * osh[2];
      for (int64_t oh = 0; oh < osh[1]; oh++) {
        float *row = yp + oh * osh[2];
        if (!linear) {
          const float *src = xp + (i0[0][od] * ish[1] + i0[1][oh]) * ish[2];
          for (int64_t ow = 0; ow < osh[2]; ow++)
            row[ow] = src[i0[2][ow]];
          continue;
        }
        float wd = wt[0][od], wh = wt[1][oh];
        for (int64_t ow = 0; ow < osh[2]; ow++) {
          float ww = wt[2][ow], acc = 0;
          for (int a = 0; a < 2; a++) {
            int64_t dd = a ? i1[0][od] : i0[0][od];
            float fa = a ? wd : 1 - wd;
            if (fa == 0) continue;
            for (int b = 0; b < 2; b++) {
              int64_t hh = b ? i1[1][oh] : i0[1][oh];
              float fb = b ? wh : 1 - wh;
              if (fb == 0) continue;
              const float *s = xp + (dd * ish[1] + hh) * ish[2];
              acc += fa * fb * ((1 - ww) * s[i0[2][ow]] + ww * s[i1[2][ow]]);
            }
          }
          row[ow] = acc;
        }
      }
    }
  free(ib);
  free(wb);
  return SPN_OK;
}

/* Generic strided copy: y[i] = x[src offset of i] for element size es. */
static void strided_copy(const uint8_t *X, uint8_t *Y, size_t es, int nd, const int64_t *oshape,
                         const int64_t *ist, int64_t base) {
  int64_t inner = nd ? oshape[nd - 1] : 1;
  int64_t total = 1;
  for (int d = 0; d < nd; d++)
    total *= oshape[d];
  int64_t outer = inner ? total / inner : 0;
  int64_t is = nd ? ist[nd - 1] : 0;
#pragma omp parallel for if (total > PAR_MIN)
  for (int64_t o = 0; o < outer; o++) {
    int64_t rem = o, src = base;
    for (int d = nd - 2; d >= 0; d--) {
      src += (rem % oshape[d]) * ist[d];
      rem /= oshape[d];
    }
    uint8_t *dst = Y + (size_t)(o * inner) * es;
    if (is == 1) {
      memcpy(dst, X + (size_t)src * es, (size_t)inner * es);
    } else if (es == 4) {
      const float *s = (const float *)(X) + src;
      float *dd = (float *)dst;
      for (int64_t j = 0; j < inner; j++)
        dd[j] = s[j * is];
    } else {
      for (int64_t j = 0; j < inner; j++)
        memcpy(dst + (size_t)j * es, X + (size_t)(src + j * is) * es, es);
    }
  }
}

static void contiguous_strides(const spn_rt_val_t *x, int64_t *st) {
  int64_t s = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    st[d] = s;
    s *= x->shape[d];
  }
}

static int32_t exec_pad(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = IN(0);
  spn_rt_val_t *y = OUT(0);
  int64_t pads[2 * SPN_MAXD];
  float val;
  int32_t rc = spn_op_pad_params(r, n, pads, &val);
  if (rc)
    return rc;
  int m = spn_op_pad_mode(n);
  int nd = x->ndim;
  size_t es = spn_dtype_size(x->dtype);
  int64_t ist[SPN_MAXD];
  contiguous_strides(x, ist);
  int64_t total = numel(y);
  const uint8_t *X = x->data;
  uint8_t *Y = y->data;
#pragma omp parallel for if (total > PAR_MIN)
  for (int64_t i = 0; i < total; i++) {
    int64_t rem = i, src = 0;
    bool inside = true;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t c = rem % y->shape[d] - pads[d];
      rem /= y->shape[d];
      int64_t len = x->shape[d];
      if (c < 0 || c >= len) {
        if (m == 0) {
          inside = false;
          break;
        } else if (m == 1) {
          if (len == 1) c = 0;
          else {
            int64_t per = 2 * (len - 1);
            c = ((c % per) + per) % per;
            if (c >= len) c = per - c;
          }
        } else {
          c = c < 0 ? 0 : len - 1;
        }
      }
      src += c * ist[d];
    }
    if (inside)
      memcpy(Y + (size_t)i * es, X + (size_t)src * es, es);
    else if (x->dtype == SPN_DTYPE_F32)
      ((float *)Y)[i] = val;
    else if (x->dtype == SPN_DTYPE_I64)
      ((int64_t *)Y)[i] = (int64_t)val;
    else
      memset(Y + (size_t)i * es, 0, es);
  }
  return SPN_OK;
}

static int64_t load_index(const void *p, int32_t dt, int64_t i) {
  return dt == SPN_DTYPE_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

static double load_as_double(const void *p, int32_t dt, int64_t i) {
  switch (dt) {
  case SPN_DTYPE_F32: return ((const float *)p)[i];
  case SPN_DTYPE_I64: return (double)((const int64_t *)p)[i];
  case SPN_DTYPE_I32: return ((const int32_t *)p)[i];
  case SPN_DTYPE_I8: return ((const int8_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}

static void store_double(void *p, int32_t dt, int64_t i, double v) {
  if (dt != SPN_DTYPE_F32) {
    if (v != v) v = 0;
    if (v > 9.2e18) v = 9.2e18;
    if (v < -9.2e18) v = -9.2e18;
  }
  switch (dt) {
  case SPN_DTYPE_F32: ((float *)p)[i] = (float)v; break;
  case SPN_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)v; break;
  case SPN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)(int64_t)v; break;
  case SPN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)(int64_t)v; break;
  case SPN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  default: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
  }
}

static int32_t exec_matmul(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *a = IN(0), *b = IN(1);
  spn_rt_val_t *y = OUT(0);
  spn_rt_val_t A = *a, B = *b;
  if (A.ndim == 1) { A.ndim = 2; A.shape[1] = A.shape[0]; A.shape[0] = 1; }
  if (B.ndim == 1) { B.ndim = 2; B.shape[1] = 1; }
  int64_t M = A.shape[A.ndim - 2], K = A.shape[A.ndim - 1], N = B.shape[B.ndim - 1];
  /* Batch dims, broadcast. */
  int bn = (A.ndim > B.ndim ? A.ndim : B.ndim) - 2;
  int64_t bsh[SPN_MAXD], sa[SPN_MAXD], sb[SPN_MAXD];
  int64_t batch = 1, accA = M * K, accB = K * N;
  for (int d = bn - 1; d >= 0; d--) {
    int ia = d - (bn - (A.ndim - 2)), ib = d - (bn - (B.ndim - 2));
    int64_t da = ia >= 0 ? A.shape[ia] : 1, db = ib >= 0 ? B.shape[ib] : 1;
    bsh[d] = da > db ? da : db;
    sa[d] = da == 1 ? 0 : accA;
    sb[d] = db == 1 ? 0 : accB;
    accA *= da;
    accB *= db;
    batch *= bsh[d];
  }
  const float *PA = a->data, *PB = b->data;
  float *PY = y->data;
  bool b_shared = true;
  for (int d = 0; d < bn; d++)
    b_shared = b_shared && sb[d] == 0;
  if (b_shared) /* one tall GEMM: every batch row block uses the same B */
    return spn_sgemm('N', 'N', M * batch, N, K, 1.f, PA, K, PB, N, 0.f, PY, N) ? spn_op_fail(r, SPN_EINTERNAL, "sgemm failed") : SPN_OK;
  for (int64_t i = 0; i < batch; i++) {
    int64_t rem = i, oa = 0, ob = 0;
    for (int d = bn - 1; d >= 0; d--) {
      int64_t c = rem % bsh[d];
      rem /= bsh[d];
      oa += c * sa[d];
      ob += c * sb[d];
    }
    if (spn_sgemm('N', 'N', M, N, K, 1.f, PA + oa, K, PB + ob, N, 0.f, PY + i * M * N, N))
      return spn_op_fail(r, SPN_EINTERNAL, "sgemm failed");
  }
  return SPN_OK;
}

static int32_t exec_gemm(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *a = IN(0), *b = IN(1);
  spn_rt_val_t *y = OUT(0);
  bool ta = spn_attr_int(n, "transA", 0), tb = spn_attr_int(n, "transB", 0);
  float alpha = spn_attr_float(n, "alpha", 1.f), beta = spn_attr_float(n, "beta", 1.f);
  int64_t M = y->shape[0], N = y->shape[1], K = ta ? a->shape[0] : a->shape[1];
  float bt = 0.f;
  if (has_in(n, 2) && beta != 0.f) {
    spn_rt_val_t zero = *y;
    float *Y = y->data;
    memset(Y, 0, (size_t)(M * N) * sizeof(float));
    binary_f32(BIN_ADD, &zero, IN(2), y);
    if (beta != 1.f)
      for (int64_t i = 0; i < M * N; i++)
        Y[i] *= beta;
    bt = 1.f;
  }
  if (spn_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, a->data, a->shape[1], b->data, b->shape[1], bt, y->data, N))
    return spn_op_fail(r, SPN_EINTERNAL, "sgemm failed");
  return SPN_OK;
}

int32_t spn_cpu_exec(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = n->n_in > 0 && n->in[0] >= 0 ? IN(0) : NULL;
  spn_rt_val_t *y = OUT(0);
  int64_t cnt = numel(y);
  /* Nothing to produce: return before any loop whose trip count comes from
   * the other (possibly huge) dims of an empty tensor. */
  int64_t produced = 0;
  for (int o = 0; o < n->n_out; o++)
    if (n->out[o] >= 0)
      produced += numel(OUT(o));
  if (produced == 0)
    return SPN_OK;
  const float *X = x ? x->data : NULL;
  float *Y = y->data;
  switch (n->op) {
  case SPN_OP_CONV: return spn_dnnl_conv(r, n, false);
  case SPN_OP_CONVT: return spn_dnnl_conv(r, n, true);
  case SPN_OP_MAXPOOL:
  case SPN_OP_AVGPOOL: return spn_dnnl_pool(r, n);
  case SPN_OP_MATMUL: return exec_matmul(r, n);
  case SPN_OP_GEMM: return exec_gemm(r, n);
  case SPN_OP_RELU:
#pragma omp parallel for if (cnt > PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) Y[i] = X[i] > 0 ? X[i] : 0;
    return SPN_OK;
  case SPN_OP_LRELU: {
    float a = spn_attr_float(n, "alpha", 0.01f);
#pragma omp parallel for if (cnt > PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) Y[i] = X[i] > 0 ? X[i] : X[i] * a;
    return SPN_OK;
  }
  case SPN_OP_SIGMOID:
#pragma omp parallel for if (cnt > PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) Y[i] = 1.f / (1.f + expf(-X[i]));
    return SPN_OK;
  case SPN_OP_TANH:
#pragma omp parallel for if (cnt > PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) Y[i] = tanhf(X[i]);
    return SPN_OK;
  case SPN_OP_EXP:
#pragma omp parallel for if (cnt > PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) Y[i] = expf(X[i]);
    return SPN_OK;
  case SPN_OP_CLIP: {
    float lo = -INFINITY, hi = INFINITY;
    if (r->m->opset < 11) {
      lo = spn_attr_float(n, "min", lo);
      hi = spn_attr_float(n, "max", hi);
    } else {
      if (has_in(n, 1)) lo = *(const float *)IN(1)->data;
      if (has_in(n, 2)) hi = *(const float *)IN(2)->data;
    }
#pragma omp parallel for if (cnt > PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) Y[i] = X[i] < lo ? lo : (X[i] > hi ? hi : X[i]);
    return SPN_OK;
  }
  case SPN_OP_IDENTITY:
    if (y->data != x->data) /* not a view (spn_plan_views) */
      memcpy(y->data, x->data, (size_t)cnt * spn_dtype_size(x->dtype));
    return SPN_OK;
  case SPN_OP_BN: {
    const float *g = IN(1)->data, *b = IN(2)->data, *mu = IN(3)->data, *var = IN(4)->data;
    float eps = spn_attr_float(n, "epsilon", 1e-5f);
    int64_t C = x->shape[1], inner = cnt / (x->shape[0] * C);
#pragma omp parallel for collapse(2) if (cnt > PAR_MIN)
    for (int64_t b0 = 0; b0 < x->shape[0]; b0++)
      for (int64_t c = 0; c < C; c++) {
        float s = g[c] / sqrtf(var[c] + eps), t = b[c] - mu[c] * s;
        const float *px = X + (b0 * C + c) * inner;
        float *py = Y + (b0 * C + c) * inner;
        for (int64_t i = 0; i < inner; i++)
          py[i] = px[i] * s + t;
      }
    return SPN_OK;
  }
  case SPN_OP_SOFTMAX: {
    int64_t def = r->m->opset >= 13 ? -1 : 1;
    int ax = norm_axis(spn_attr_int(n, "axis", def), x->ndim);
    int64_t outer = 1, len = 1, inner = 1;
    for (int d = 0; d < x->ndim; d++) {
      if (d < ax) outer *= x->shape[d];
      else if (d == ax || r->m->opset < 13) len *= x->shape[d];
      else inner *= x->shape[d];
    }
    softmax(X, Y, outer, len, inner);
    return SPN_OK;
  }
  case SPN_OP_PRELU: binary_f32(BIN_PRELU, x, IN(1), y); return SPN_OK;
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV: {
    int op = n->op == SPN_OP_ADD ? BIN_ADD : n->op == SPN_OP_SUB ? BIN_SUB : n->op == SPN_OP_MUL ? BIN_MUL : BIN_DIV;
    if (x->dtype == SPN_DTYPE_I64)
      return binary_i64(r, op, x, IN(1), y);
    binary_f32(op, x, IN(1), y);
    return SPN_OK;
  }
  case SPN_OP_CONCAT: {
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    size_t es = spn_dtype_size(x->dtype);
    if (r->m->vals[n->out[0]].nhwc) {
      /* Channel concat into a channels-last output; inputs either layout. */
      int64_t N = y->shape[0], C = y->shape[1], HW = y->shape[2] * y->shape[3];
      float *Yp = y->data;
      int64_t c0 = 0;
      for (int k = 0; k < n->n_in; k++) {
        const spn_rt_val_t *v = IN(k);
        const float *V = v->data;
        int64_t ck = v->shape[1];
        bool vn = r->m->vals[n->in[k]].nhwc;
#pragma omp parallel for collapse(2) if (N * HW * ck > PAR_MIN)
        for (int64_t b = 0; b < N; b++)
          for (int64_t i = 0; i < HW; i++) {
            float *dst = Yp + (b * HW + i) * C + c0;
            if (vn)
              memcpy(dst, V + (b * HW + i) * ck, (size_t)ck * sizeof(float));
            else
              for (int64_t c = 0; c < ck; c++)
                dst[c] = V[(b * ck + c) * HW + i];
          }
        c0 += ck;
      }
      return SPN_OK;
    }
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ax; d++) outer *= y->shape[d];
    for (int d = ax + 1; d < y->ndim; d++) inner *= y->shape[d];
    size_t orow = (size_t)(y->shape[ax] * inner) * es;
    size_t pos = 0;
    for (int k = 0; k < n->n_in; k++) {
      const spn_rt_val_t *v = IN(k);
      size_t chunk = (size_t)(v->shape[ax] * inner) * es;
      const uint8_t *src = v->data;
      uint8_t *dst = (uint8_t *)y->data + pos;
#pragma omp parallel for if ((int64_t)(outer * chunk) > PAR_MIN * 4)
      for (int64_t o = 0; o < outer; o++)
        memcpy(dst + (size_t)o * orow, src + (size_t)o * chunk, chunk);
      pos += chunk;
    }
    return SPN_OK;
  }
  case SPN_OP_SPLIT: {
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    size_t es = spn_dtype_size(x->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ax; d++) outer *= x->shape[d];
    for (int d = ax + 1; d < x->ndim; d++) inner *= x->shape[d];
    size_t irow = (size_t)(x->shape[ax] * inner) * es, pos = 0;
    for (int k = 0; k < n->n_out; k++) {
      if (n->out[k] < 0)
        continue; /* only possible for unused outputs that were never named */
      spn_rt_val_t *v = OUT(k);
      size_t chunk = (size_t)(v->shape[ax] * inner) * es;
      for (int64_t o = 0; o < outer; o++)
        memcpy((uint8_t *)v->data + (size_t)o * chunk, (const uint8_t *)x->data + (size_t)o * irow + pos, chunk);
      pos += chunk;
    }
    return SPN_OK;
  }
  case SPN_OP_INTERLEAVE: {
    /* One pass over the output, row by row: pixel (b*h + i, b*w + j) from
     * input #(i*b + j); channels-last on both sides copies C floats at a
     * time. */
    int64_t b = spn_attr_int(n, "blocksize", 1);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3], OW = W * b;
    bool yn = r->m->vals[n->out[0]].nhwc;
    const float *V[64];
    bool vn[64];
    for (int k = 0; k < n->n_in; k++) {
      V[k] = IN(k)->data;
      vn[k] = r->m->vals[n->in[k]].nhwc;
    }
#pragma omp parallel for collapse(2) if (cnt > PAR_MIN)
    for (int64_t nn = 0; nn < N; nn++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < b; i++) {
          int64_t oy = h * b + i;
          for (int64_t j = 0; j < b; j++) {
            const float *S = V[i * b + j];
            if (yn && vn[i * b + j]) {
              for (int64_t w = 0; w < W; w++)
                memcpy(Y + ((nn * H * b + oy) * OW + w * b + j) * C, S + ((nn * H + h) * W + w) * C,
                       (size_t)C * sizeof(float));
              continue;
            }
            for (int64_t c = 0; c < C; c++)
              for (int64_t w = 0; w < W; w++) {
                int64_t si = vn[i * b + j] ? ((nn * H + h) * W + w) * C + c : ((nn * C + c) * H + h) * W + w;
                int64_t di = yn ? ((nn * H * b + oy) * OW + w * b + j) * C + c
                                : ((nn * C + c) * H * b + oy) * OW + w * b + j;
                Y[di] = S[si];
              }
          }
        }
    return SPN_OK;
  }
  case SPN_OP_D2S: {
    int64_t b = spn_attr_int(n, "blocksize", 1);
    bool crd = !strcmp(spn_attr_str(n, "mode", "DCR"), "CRD");
    int64_t N = y->shape[0], C = y->shape[1], H = x->shape[2], W = x->shape[3];
    size_t es = spn_dtype_size(x->dtype);
    const uint8_t *S = x->data;
    uint8_t *D = y->data;
#pragma omp parallel for collapse(3) if (cnt > PAR_MIN)
    for (int64_t nn = 0; nn < N; nn++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t h = 0; h < H; h++)
          for (int64_t i = 0; i < b; i++)
            for (int64_t j = 0; j < b; j++) {
              int64_t ic = crd ? c * b * b + i * b + j : (i * b + j) * C + c;
              const uint8_t *src = S + (size_t)(((nn * C * b * b + ic) * H + h) * W) * es;
              uint8_t *dst = D + (size_t)((((nn * C + c) * H * b) + h * b + i) * W * b + j) * es;
              if (es == 4)
                for (int64_t w = 0; w < W; w++)
                  ((float *)dst)[w * b] = ((const float *)src)[w];
              else
                for (int64_t w = 0; w < W; w++)
                  memcpy(dst + (size_t)(w * b) * es, src + (size_t)w * es, es);
            }
    return SPN_OK;
  }
  case SPN_OP_RESIZE:
  case SPN_OP_UPSAMPLE: return exec_resize(r, n);
  case SPN_OP_TRANSPOSE: {
    const spn_attr_t *p = spn_node_attr(n, "perm");
    int64_t ist[SPN_MAXD], pst[SPN_MAXD];
    contiguous_strides(x, ist);
    for (int d = 0; d < x->ndim; d++)
      pst[d] = ist[p ? p->ints[d] : x->ndim - 1 - d];
    strided_copy(x->data, y->data, spn_dtype_size(x->dtype), y->ndim, y->shape, pst, 0);
    return SPN_OK;
  }
  case SPN_OP_RESHAPE: case SPN_OP_FLATTEN: case SPN_OP_SQUEEZE: case SPN_OP_UNSQUEEZE:
    if (y->data != x->data)
      memcpy(y->data, x->data, (size_t)cnt * spn_dtype_size(x->dtype));
    return SPN_OK;
  case SPN_OP_GAP: {
    int64_t planes = x->shape[0] * x->shape[1], sp = numel(x) / (planes ? planes : 1);
#pragma omp parallel for if (planes * sp > PAR_MIN)
    for (int64_t p = 0; p < planes; p++) {
      double s = 0;
      for (int64_t i = 0; i < sp; i++)
        s += X[p * sp + i];
      Y[p] = (float)(s / (double)sp);
    }
    return SPN_OK;
  }
  case SPN_OP_PAD: return exec_pad(r, n);
  case SPN_OP_SLICE: {
    int64_t st[SPN_MAXD], sp[SPN_MAXD], count[SPN_MAXD], ist[SPN_MAXD];
    int32_t rc = spn_op_slice_params(r, n, st, sp, count);
    if (rc)
      return rc;
    contiguous_strides(x, ist);
    int64_t base = 0;
    for (int d = 0; d < x->ndim; d++) {
      base += st[d] * ist[d];
      ist[d] *= sp[d];
    }
    if (cnt)
      strided_copy(x->data, y->data, spn_dtype_size(x->dtype), y->ndim, y->shape, ist, base);
    return SPN_OK;
  }
  case SPN_OP_GATHER: {
    const spn_rt_val_t *ix = IN(1);
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    size_t es = spn_dtype_size(x->dtype);
    int64_t outer = 1, inner = 1, ni = numel(ix), dim = x->shape[ax];
    for (int d = 0; d < ax; d++) outer *= x->shape[d];
    for (int d = ax + 1; d < x->ndim; d++) inner *= x->shape[d];
    for (int64_t i = 0; i < ni; i++) {
      int64_t k = load_index(ix->data, ix->dtype, i);
      if (k < -dim || k >= dim)
        return spn_op_fail(r, SPN_EINVAL, "Gather index %lld out of range [-%lld, %lld)", (long long)k, (long long)dim, (long long)dim);
    }
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < ni; i++) {
        int64_t k = load_index(ix->data, ix->dtype, i);
        if (k < 0) k += dim;
        memcpy((uint8_t *)y->data + (size_t)((o * ni + i) * inner) * es,
               (const uint8_t *)x->data + (size_t)((o * dim + k) * inner) * es, (size_t)inner * es);
      }
    return SPN_OK;
  }
  case SPN_OP_SHAPE: {
    int64_t s = spn_attr_int(n, "start", 0);
    if (s < 0) s += x->ndim;
    if (s < 0) s = 0;
    for (int64_t i = 0; i < cnt; i++)
      ((int64_t *)y->data)[i] = x->shape[s + i];
    return SPN_OK;
  }
  case SPN_OP_CONSTANT: {
    const spn_attr_t *a;
    if ((a = spn_node_attr(n, "value")))
      memcpy(y->data, r->v[a->tval].data, (size_t)cnt * spn_dtype_size(y->dtype));
    else if ((a = spn_node_attr(n, "value_float")))
      *(float *)y->data = a->f;
    else if ((a = spn_node_attr(n, "value_int")))
      *(int64_t *)y->data = a->i;
    else if ((a = spn_node_attr(n, "value_floats")))
      memcpy(y->data, a->floats, (size_t)a->n * sizeof(float));
    else if ((a = spn_node_attr(n, "value_ints")))
      memcpy(y->data, a->ints, (size_t)a->n * sizeof(int64_t));
    return SPN_OK;
  }
  case SPN_OP_COS: {
    const spn_attr_t *a = spn_node_attr(n, "value");
    size_t es = spn_dtype_size(y->dtype);
    uint8_t zero[8] = {0};
    const void *v = a ? r->v[a->tval].data : zero;
    for (int64_t i = 0; i < cnt; i++)
      memcpy((uint8_t *)y->data + (size_t)i * es, v, es);
    return SPN_OK;
  }
  case SPN_OP_CAST:
    for (int64_t i = 0; i < cnt; i++)
      store_double(y->data, y->dtype, i, load_as_double(x->data, x->dtype, i));
    return SPN_OK;
  case SPN_OP_REDUCEMEAN: {
    int64_t axes[SPN_MAXD];
    int na;
    int32_t rc = spn_op_axes_of(r, n, axes, &na);
    if (rc)
      return rc;
    bool red[SPN_MAXD] = {0};
    for (int i = 0; i < na; i++)
      red[norm_axis(axes[i], x->ndim)] = true;
    int64_t ost[SPN_MAXD], s = 1, total = numel(x), rcount = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
      bool rd = na ? red[d] : true;
      ost[d] = rd ? 0 : s;
      if (!rd) s *= x->shape[d];
      else rcount *= x->shape[d];
    }
    double *acc = calloc((size_t)cnt + 1, sizeof(double));
    if (!acc)
      return spn_op_fail(r, SPN_ENOMEM, "out of memory");
    for (int64_t i = 0; i < total; i++) {
      int64_t rem = i, o = 0;
      for (int d = x->ndim - 1; d >= 0; d--) {
        o += (rem % x->shape[d]) * ost[d];
        rem /= x->shape[d];
      }
      acc[o] += X[i];
    }
    for (int64_t i = 0; i < cnt; i++)
      Y[i] = (float)(acc[i] / (double)(rcount ? rcount : 1));
    free(acc);
    return SPN_OK;
  }
  default:
    return spn_op_fail(r, SPN_EUNSUPPORTED, "no kernel");
  }
}
