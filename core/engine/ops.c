/* ops.c — operator checks, shape inference and the C kernels.
 *
 * spn_op_check validates a node once at load (input counts, constant
 * weights, attribute values); spn_op_infer computes output dtypes and shapes
 * from input shapes (and from the values of constant or shape-class inputs:
 * Reshape's shape, Slice's starts, Resize's sizes); spn_op_exec runs the
 * node. Conv, ConvTranspose and the pools go to oneDNN (cpu-dnnl.c), MatMul
 * and Gemm to its sgemm; everything else is plain C written so the compiler
 * vectorises the inner loops, parallelised with OpenMP over outer loops.
 * Run-time errors (an index out of range, a shape that does not fit) are
 * reported through r->err, never by crashing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

#define IN(k) (&r->v[n->in[k]])
#define OUT(k) (&r->v[n->out[k]])
#define PAR_MIN 32768

static bool has_in(const spn_node_t *n, int k) {
  return k < n->n_in && n->in[k] >= 0;
}

/* Saturating multiply: hostile shapes must not wrap around. */
static int64_t smul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t numel(const spn_rt_val_t *v) {
  int64_t x = 1;
  for (int i = 0; i < v->ndim; i++)
    x = smul(x, v->shape[i]);
  return x;
}

static void set_out(spn_rt_val_t *o, int32_t dtype, int ndim, const int64_t *shape) {
  o->dtype = dtype;
  o->ndim = ndim;
  memset(o->shape, 0, sizeof o->shape);
  if (ndim)
    memcpy(o->shape, shape, (size_t)ndim * sizeof(int64_t));
}

static int32_t fail(spn_run_t *r, int32_t code, const char *fmt, ...) SPN_PRINTF(3, 4);
static int32_t fail(spn_run_t *r, int32_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  spn_error_vset(r->err, code, fmt, ap);
  va_end(ap);
  return code;
}

/* Values of a small integer input (constant or shape class). */
static int32_t read_ints(spn_run_t *r, const spn_node_t *n, int k, int64_t *dst, int max,
                         int *count) {
  const spn_rt_val_t *v = IN(k);
  if (!v->data)
    return fail(r, SPN_EUNSUPPORTED, "input '%s' must be a constant or computed from shapes", r->m->vals[n->in[k]].name);
  int64_t c = numel(v);
  if (c > max)
    return fail(r, SPN_EMODEL, "input '%s' has %lld values (at most %d)", r->m->vals[n->in[k]].name, (long long)c, max);
  for (int64_t i = 0; i < c; i++) {
    if (v->dtype == SPN_DTYPE_I64)
      dst[i] = ((const int64_t *)v->data)[i];
    else if (v->dtype == SPN_DTYPE_I32)
      dst[i] = ((const int32_t *)v->data)[i];
    else
      return fail(r, SPN_ETYPE, "input '%s' must be int64 or int32", r->m->vals[n->in[k]].name);
  }
  *count = (int)c;
  return SPN_OK;
}

static int32_t read_floats(spn_run_t *r, const spn_node_t *n, int k, float *dst, int max,
                           int *count) {
  const spn_rt_val_t *v = IN(k);
  if (!v->data)
    return fail(r, SPN_EUNSUPPORTED, "input '%s' must be a constant or computed from shapes", r->m->vals[n->in[k]].name);
  int64_t c = numel(v);
  if (c > max || v->dtype != SPN_DTYPE_F32)
    return fail(r, SPN_EMODEL, "input '%s' must hold at most %d floats", r->m->vals[n->in[k]].name, max);
  memcpy(dst, v->data, (size_t)c * sizeof(float));
  *count = (int)c;
  return SPN_OK;
}

static int norm_axis(int64_t a, int ndim) {
  if (a < 0)
    a += ndim;
  return a < 0 || a >= ndim ? -1 : (int)a;
}

/* ---- load-time checks ---- */

int32_t spn_op_check(const spn_model_t *m, const spn_node_t *n, spn_error_t *err) {
  static const struct { int8_t min_in, max_in, min_out, max_out; } ar[SPN_OP_COUNT] = {
      [SPN_OP_CONV] = {2, 3, 1, 1}, [SPN_OP_CONVT] = {2, 3, 1, 1}, [SPN_OP_BN] = {5, 5, 1, 3},
      [SPN_OP_RELU] = {1, 1, 1, 1}, [SPN_OP_LRELU] = {1, 1, 1, 1}, [SPN_OP_PRELU] = {2, 2, 1, 1},
      [SPN_OP_SIGMOID] = {1, 1, 1, 1}, [SPN_OP_TANH] = {1, 1, 1, 1}, [SPN_OP_CLIP] = {1, 3, 1, 1},
      [SPN_OP_SOFTMAX] = {1, 1, 1, 1}, [SPN_OP_ADD] = {2, 2, 1, 1}, [SPN_OP_SUB] = {2, 2, 1, 1},
      [SPN_OP_MUL] = {2, 2, 1, 1}, [SPN_OP_DIV] = {2, 2, 1, 1}, [SPN_OP_CONCAT] = {1, 64, 1, 1},
      [SPN_OP_SPLIT] = {1, 2, 1, 64}, [SPN_OP_D2S] = {1, 1, 1, 1}, [SPN_OP_RESIZE] = {1, 4, 1, 1},
      [SPN_OP_UPSAMPLE] = {1, 2, 1, 1}, [SPN_OP_TRANSPOSE] = {1, 1, 1, 1},
      [SPN_OP_RESHAPE] = {2, 2, 1, 1}, [SPN_OP_FLATTEN] = {1, 1, 1, 1},
      [SPN_OP_SQUEEZE] = {1, 2, 1, 1}, [SPN_OP_UNSQUEEZE] = {1, 2, 1, 1},
      [SPN_OP_MAXPOOL] = {1, 1, 1, 1}, [SPN_OP_AVGPOOL] = {1, 1, 1, 1}, [SPN_OP_GAP] = {1, 1, 1, 1},
      [SPN_OP_PAD] = {1, 4, 1, 1}, [SPN_OP_SLICE] = {1, 5, 1, 1}, [SPN_OP_GATHER] = {2, 2, 1, 1},
      [SPN_OP_SHAPE] = {1, 1, 1, 1}, [SPN_OP_CONSTANT] = {0, 0, 1, 1}, [SPN_OP_COS] = {1, 1, 1, 1},
      [SPN_OP_CAST] = {1, 1, 1, 1}, [SPN_OP_MATMUL] = {2, 2, 1, 1}, [SPN_OP_GEMM] = {2, 3, 1, 1},
      [SPN_OP_EXP] = {1, 1, 1, 1}, [SPN_OP_REDUCEMEAN] = {1, 2, 1, 1}, [SPN_OP_IDENTITY] = {1, 1, 1, 1},
  };
  const char *file = m->path;
  if (n->n_in < ar[n->op].min_in || n->n_in > ar[n->op].max_in || n->n_out < ar[n->op].min_out || n->n_out > ar[n->op].max_out)
    return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): %d inputs and %d outputs (expected %d-%d and %d-%d)", file, n->name, n->op_name, n->n_in, n->n_out, ar[n->op].min_in, ar[n->op].max_in, ar[n->op].min_out, ar[n->op].max_out);
  for (int k = 0; k < ar[n->op].min_in; k++)
    if (n->in[k] < 0 && !(n->op == SPN_OP_RESIZE && k > 0))
      return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): required input #%d is empty", file, n->name, n->op_name, k);
  if (n->out[0] < 0)
    return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): output #0 is empty", file, n->name, n->op_name);
  switch (n->op) {
  case SPN_OP_CONV:
  case SPN_OP_CONVT: {
    const spn_value_t *w = &m->vals[n->in[1]];
    if (w->kind != SPN_VAL_CONST || w->dtype != SPN_DTYPE_F32 || w->ndim < 3 || w->ndim > 5)
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): weights '%s' must be a float initializer with 3 to 5 dims", file, n->name, n->op_name, w->name);
    if (has_in(n, 2)) {
      const spn_value_t *b = &m->vals[n->in[2]];
      if (b->kind != SPN_VAL_CONST || b->dtype != SPN_DTYPE_F32 || b->ndim != 1)
        return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): bias '%s' must be a 1-D float initializer", file, n->name, n->op_name, b->name);
    }
    if (spn_attr_int(n, "group", 1) < 1)
      return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): group must be >= 1", file, n->name, n->op_name);
    if (n->op == SPN_OP_CONVT && spn_node_attr(n, "output_shape"))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (ConvTranspose): attribute 'output_shape' is not supported (use pads/output_padding)", file, n->name);
    const char *ap = spn_attr_str(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID") && (n->op == SPN_OP_CONVT || (strcmp(ap, "SAME_UPPER") && strcmp(ap, "SAME_LOWER"))))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): auto_pad '%s' is not supported", file, n->name, n->op_name, ap);
    break;
  }
  case SPN_OP_MAXPOOL:
  case SPN_OP_AVGPOOL: {
    const spn_attr_t *k = spn_node_attr(n, "kernel_shape");
    if (!k || k->n < 1 || k->n > 3)
      return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): kernel_shape must have 1 to 3 values", file, n->name, n->op_name);
    if (n->n_out > 1)
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): the Indices output is not supported", file, n->name, n->op_name);
    if (spn_attr_int(n, "storage_order", 0))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): storage_order=1 is not supported", file, n->name, n->op_name);
    const char *ap = spn_attr_str(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID") && strcmp(ap, "SAME_UPPER") && strcmp(ap, "SAME_LOWER"))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): auto_pad '%s' is not supported", file, n->name, n->op_name, ap);
    break;
  }
  case SPN_OP_BN:
    if (spn_attr_int(n, "training_mode", 0) || n->n_out > 1)
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (BatchNormalization): training mode is not supported", file, n->name);
    break;
  case SPN_OP_D2S: {
    const char *mode = spn_attr_str(n, "mode", "DCR");
    if (spn_attr_int(n, "blocksize", 0) < 1 || (strcmp(mode, "DCR") && strcmp(mode, "CRD")))
      return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (DepthToSpace): needs blocksize >= 1 and mode DCR or CRD", file, n->name);
    break;
  }
  case SPN_OP_RESIZE:
  case SPN_OP_UPSAMPLE: {
    const char *mode = spn_attr_str(n, "mode", "nearest");
    if (strcmp(mode, "nearest") && strcmp(mode, "linear") && strcmp(mode, "bilinear"))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): mode '%s' is not supported (nearest, linear)", file, n->name, n->op_name, mode);
    const char *ct = spn_attr_str(n, "coordinate_transformation_mode", "half_pixel");
    static const char *const cts[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nearest"};
    bool ok = false;
    for (size_t i = 0; i < 5; i++)
      ok = ok || !strcmp(ct, cts[i]);
    if (!ok)
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): coordinate_transformation_mode '%s' is not supported", file, n->name, n->op_name, ct);
    const char *nm = spn_attr_str(n, "nearest_mode", "round_prefer_floor");
    if (strcmp(nm, "round_prefer_floor") && strcmp(nm, "round_prefer_ceil") && strcmp(nm, "floor") && strcmp(nm, "ceil"))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): nearest_mode '%s' is not supported", file, n->name, n->op_name, nm);
    if (spn_attr_int(n, "exclude_outside", 0))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): exclude_outside=1 is not supported", file, n->name, n->op_name);
    break;
  }
  case SPN_OP_PAD: {
    const char *mode = spn_attr_str(n, "mode", "constant");
    if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge"))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (Pad): mode '%s' is not supported", file, n->name, mode);
    break;
  }
  case SPN_OP_CAST: {
    int64_t to = spn_attr_int(n, "to", 0);
    if (to != 1 && to != 2 && to != 3 && to != 6 && to != 7 && to != 9)
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (Cast): target type %lld is not supported", file, n->name, (long long)to);
    break;
  }
  case SPN_OP_CONSTANT: {
    const spn_attr_t *v = spn_node_attr(n, "value");
    if (!v && !spn_node_attr(n, "value_float") && !spn_node_attr(n, "value_floats") && !spn_node_attr(n, "value_int") && !spn_node_attr(n, "value_ints"))
      return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (Constant): no value attribute", file, n->name);
    break;
  }
  default: break;
  }
  return SPN_OK;
}

/* ---- geometry ---- */

static int32_t window_geometry(spn_run_t *r, const spn_node_t *n, const spn_rt_val_t *x, int nsp,
                               const int64_t *k, bool ceil_mode, int64_t *stride, int64_t *dil,
                               int64_t *pl, int64_t *pr, int64_t *out_sp) {
  const spn_attr_t *as = spn_node_attr(n, "strides"), *ad = spn_node_attr(n, "dilations"),
                   *ap = spn_node_attr(n, "pads");
  const char *autopad = spn_attr_str(n, "auto_pad", "NOTSET");
  if ((as && as->n != nsp) || (ad && ad->n != nsp) || (ap && ap->n != 2 * nsp))
    return fail(r, SPN_EMODEL, "strides/dilations/pads do not match %d spatial dims", nsp);
  for (int i = 0; i < nsp; i++) {
    stride[i] = as ? as->ints[i] : 1;
    dil[i] = ad ? ad->ints[i] : 1;
    pl[i] = ap ? ap->ints[i] : 0;
    pr[i] = ap ? ap->ints[i + nsp] : 0;
    if (stride[i] < 1 || dil[i] < 1 || k[i] < 1 || pl[i] < 0 || pr[i] < 0 || stride[i] > 1 << 20 || dil[i] > 1 << 20 || k[i] > 1 << 20 || pl[i] > 1 << 20 || pr[i] > 1 << 20)
      return fail(r, SPN_EMODEL, "invalid stride/dilation/kernel/pad on spatial dim %d", i);
    int64_t in = x->shape[2 + i], ek = (k[i] - 1) * dil[i] + 1;
    if (!strcmp(autopad, "SAME_UPPER") || !strcmp(autopad, "SAME_LOWER")) {
      int64_t o = (in + stride[i] - 1) / stride[i];
      int64_t tot = (o - 1) * stride[i] + ek - in;
      if (tot < 0)
        tot = 0;
      if (!strcmp(autopad, "SAME_UPPER")) {
        pl[i] = tot / 2;
        pr[i] = tot - tot / 2;
      } else {
        pr[i] = tot / 2;
        pl[i] = tot - tot / 2;
      }
      out_sp[i] = o;
      continue;
    }
    if (!strcmp(autopad, "VALID"))
      pl[i] = pr[i] = 0;
    int64_t span = in + pl[i] + pr[i] - ek;
    if (span < 0)
      return fail(r, SPN_EMODEL, "kernel (%lld) larger than padded input (%lld) on spatial dim %d", (long long)ek, (long long)(in + pl[i] + pr[i]), i);
    out_sp[i] = (ceil_mode ? (span + stride[i] - 1) / stride[i] : span / stride[i]) + 1;
    if (ceil_mode && (out_sp[i] - 1) * stride[i] >= in + pl[i])
      out_sp[i]--; /* the last window must start inside the input or left pad */
  }
  return SPN_OK;
}

int32_t spn_conv_geometry(const spn_node_t *n, const spn_rt_val_t *x, const spn_rt_val_t *w,
                          bool transposed, int64_t *stride, int64_t *dil, int64_t *pl,
                          int64_t *pr, int64_t *out_sp, spn_error_t *err) {
  spn_run_t rr = {.err = err};
  int nsp = x->ndim - 2;
  int64_t k[3];
  const spn_attr_t *ks = spn_node_attr(n, "kernel_shape");
  for (int i = 0; i < nsp; i++) {
    k[i] = w->shape[2 + i];
    if (ks && (ks->n != nsp || ks->ints[i] != k[i]))
      return spn_error_set(err, SPN_EMODEL, "kernel_shape does not match the weights");
  }
  if (!transposed)
    return window_geometry(&rr, n, x, nsp, k, false, stride, dil, pl, pr, out_sp);
  const spn_attr_t *as = spn_node_attr(n, "strides"), *ad = spn_node_attr(n, "dilations"),
                   *ap = spn_node_attr(n, "pads"), *op = spn_node_attr(n, "output_padding");
  if ((as && as->n != nsp) || (ad && ad->n != nsp) || (ap && ap->n != 2 * nsp) || (op && op->n != nsp))
    return spn_error_set(err, SPN_EMODEL, "strides/dilations/pads/output_padding do not match %d spatial dims", nsp);
  bool valid = !strcmp(spn_attr_str(n, "auto_pad", "NOTSET"), "VALID");
  for (int i = 0; i < nsp; i++) {
    stride[i] = as ? as->ints[i] : 1;
    dil[i] = ad ? ad->ints[i] : 1;
    pl[i] = ap && !valid ? ap->ints[i] : 0;
    pr[i] = ap && !valid ? ap->ints[i + nsp] : 0;
    int64_t opad = op ? op->ints[i] : 0;
    if (stride[i] < 1 || dil[i] < 1 || pl[i] < 0 || pr[i] < 0 || opad < 0 || opad >= stride[i] + dil[i] || stride[i] > 1 << 20 || dil[i] > 1 << 20 || pl[i] > 1 << 20 || pr[i] > 1 << 20)
      return spn_error_set(err, SPN_EMODEL, "invalid stride/dilation/pad/output_padding on spatial dim %d", i);
    out_sp[i] = stride[i] * (x->shape[2 + i] - 1) + opad + (k[i] - 1) * dil[i] + 1 - pl[i] - pr[i];
    if (out_sp[i] < 1)
      return spn_error_set(err, SPN_EMODEL, "output size %lld < 1 on spatial dim %d", (long long)out_sp[i], i);
    pr[i] -= opad; /* as the backend sees it: output padding extends the right edge */
  }
  return SPN_OK;
}

/* ---- broadcasting ---- */

static int32_t bcast_shape(spn_run_t *r, const spn_rt_val_t *a, const spn_rt_val_t *b, int *nd,
                           int64_t *shape) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < n; i++) {
    int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return fail(r, SPN_EMODEL, "cannot broadcast dim %d: %lld vs %lld", i, (long long)da, (long long)db);
    shape[i] = da == 1 ? db : da;
  }
  *nd = n;
  return SPN_OK;
}

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
        return fail(r, SPN_EINVAL, "integer division by zero");
      Y[i] = x / w;
      break;
    default: return fail(r, SPN_ETYPE, "PRelu needs float");
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

/* ---- shape inference ---- */

static int32_t infer_resize(spn_run_t *r, const spn_node_t *n, float *scales, int64_t *sizes) {
  const spn_rt_val_t *x = IN(0);
  int nd = x->ndim, cnt = 0;
  bool have_sizes = false;
  if (n->op == SPN_OP_UPSAMPLE) {
    if (!has_in(n, 1))
      return fail(r, SPN_EMODEL, "Upsample needs scales");
    int32_t rc = read_floats(r, n, 1, scales, SPN_MAXD, &cnt);
    if (rc)
      return rc;
  } else if (has_in(n, 3) && numel(IN(3)) > 0) {
    int64_t tmp[SPN_MAXD];
    int32_t rc = read_ints(r, n, 3, tmp, SPN_MAXD, &cnt);
    if (rc)
      return rc;
    if (cnt != nd)
      return fail(r, SPN_EMODEL, "sizes has %d values for %d dims", cnt, nd);
    for (int i = 0; i < nd; i++) {
      if (tmp[i] < 1 || tmp[i] > (INT64_C(1) << 31))
        return fail(r, SPN_EMODEL, "invalid size %lld", (long long)tmp[i]);
      sizes[i] = tmp[i];
      scales[i] = (float)tmp[i] / (float)x->shape[i];
    }
    have_sizes = true;
  } else if (has_in(n, 2)) {
    int32_t rc = read_floats(r, n, 2, scales, SPN_MAXD, &cnt);
    if (rc)
      return rc;
  } else {
    return fail(r, SPN_EMODEL, "Resize needs scales or sizes");
  }
  if (!have_sizes) {
    if (cnt != nd)
      return fail(r, SPN_EMODEL, "scales has %d values for %d dims", cnt, nd);
    for (int i = 0; i < nd; i++) {
      double s = (double)x->shape[i] * scales[i];
      if (!(scales[i] > 0) || s > (double)(INT64_C(1) << 31))
        return fail(r, SPN_EMODEL, "invalid scale %g", scales[i]);
      sizes[i] = (int64_t)floor(s + 1e-6 * 0);
      sizes[i] = (int64_t)floorf((float)x->shape[i] * scales[i]);
      if (sizes[i] < 1)
        return fail(r, SPN_EMODEL, "scale %g gives an empty output", scales[i]);
    }
  }
  if (nd < 3 || sizes[0] != x->shape[0] || sizes[1] != x->shape[1] || nd > 5)
    return fail(r, SPN_EUNSUPPORTED, "only spatial resizing of NC... tensors is supported");
  return SPN_OK;
}

static int32_t slice_params(spn_run_t *r, const spn_node_t *n, int64_t *start, int64_t *step,
                            int64_t *count) {
  const spn_rt_val_t *x = IN(0);
  int nd = x->ndim;
  int64_t st[SPN_MAXD], en[SPN_MAXD], ax[SPN_MAXD], sp[SPN_MAXD];
  int ns = 0, ne = 0, na = 0, nsp = 0;
  int32_t rc;
  if (r->m->opset < 10) {
    const spn_attr_t *a = spn_node_attr(n, "starts"), *b = spn_node_attr(n, "ends"), *c = spn_node_attr(n, "axes");
    if (!a || !b || a->n > SPN_MAXD || b->n != a->n || (c && c->n != a->n))
      return fail(r, SPN_EMODEL, "Slice needs starts/ends");
    ns = ne = (int)a->n;
    memcpy(st, a->ints, (size_t)ns * 8);
    memcpy(en, b->ints, (size_t)ne * 8);
    if (c) {
      na = (int)c->n;
      memcpy(ax, c->ints, (size_t)na * 8);
    }
  } else {
    if (!has_in(n, 1) || !has_in(n, 2))
      return fail(r, SPN_EMODEL, "Slice needs starts and ends inputs");
    if ((rc = read_ints(r, n, 1, st, SPN_MAXD, &ns)) || (rc = read_ints(r, n, 2, en, SPN_MAXD, &ne)))
      return rc;
    if (has_in(n, 3) && (rc = read_ints(r, n, 3, ax, SPN_MAXD, &na)))
      return rc;
    if (has_in(n, 4) && (rc = read_ints(r, n, 4, sp, SPN_MAXD, &nsp)))
      return rc;
  }
  if (ne != ns || (na && na != ns) || (nsp && nsp != ns))
    return fail(r, SPN_EMODEL, "Slice starts/ends/axes/steps lengths differ");
  for (int d = 0; d < nd; d++) {
    start[d] = 0;
    step[d] = 1;
    count[d] = x->shape[d];
  }
  bool seen[SPN_MAXD] = {0};
  for (int i = 0; i < ns; i++) {
    int a = na ? norm_axis(ax[i], nd) : i;
    if (a < 0 || seen[a])
      return fail(r, SPN_EMODEL, "Slice axis out of range or repeated");
    seen[a] = true;
    int64_t dim = x->shape[a], s = st[i], e = en[i], k = nsp ? sp[i] : 1;
    if (k == 0 || k == INT64_MIN)
      return fail(r, SPN_EMODEL, "Slice step %lld", (long long)k);
    if (s < 0) s += dim;
    if (e < 0 && e > INT64_MIN / 2) e += dim;
    if (k > 0) {
      s = s < 0 ? 0 : (s > dim ? dim : s);
      e = e < 0 ? 0 : (e > dim ? dim : e);
      count[a] = e > s ? (e - s - 1) / k + 1 : 0;
    } else {
      s = s < 0 ? -1 : (s > dim - 1 ? dim - 1 : s);
      e = e < -1 ? -1 : (e > dim - 1 ? dim - 1 : e);
      count[a] = s > e ? (s - e - 1) / (-k) + 1 : 0;
    }
    start[a] = s;
    step[a] = k;
  }
  return SPN_OK;
}

static int32_t pad_params(spn_run_t *r, const spn_node_t *n, int64_t *pads, float *value) {
  int nd = IN(0)->ndim, cnt = 0;
  *value = 0;
  if (r->m->opset < 11) {
    const spn_attr_t *p = spn_node_attr(n, "pads");
    if (!p || p->n != 2 * nd)
      return fail(r, SPN_EMODEL, "Pad needs %d pads", 2 * nd);
    memcpy(pads, p->ints, (size_t)(2 * nd) * 8);
    *value = spn_attr_float(n, "value", 0.f);
    return SPN_OK;
  }
  if (!has_in(n, 1))
    return fail(r, SPN_EMODEL, "Pad needs the pads input");
  int32_t rc = read_ints(r, n, 1, pads, 2 * SPN_MAXD, &cnt);
  if (rc)
    return rc;
  if (cnt != 2 * nd)
    return fail(r, SPN_EMODEL, "Pad has %d pads for %d dims", cnt, nd);
  if (has_in(n, 2) && IN(2)->data && numel(IN(2)) == 1) {
    if (IN(2)->dtype == SPN_DTYPE_F32)
      *value = *(const float *)IN(2)->data;
    else if (IN(2)->dtype == SPN_DTYPE_I64)
      *value = (float)*(const int64_t *)IN(2)->data;
  }
  if (has_in(n, 3))
    return fail(r, SPN_EUNSUPPORTED, "Pad axes input is not supported");
  return SPN_OK;
}

static int32_t axes_of(spn_run_t *r, const spn_node_t *n, int64_t *axes, int *na) {
  *na = 0;
  const spn_attr_t *a = spn_node_attr(n, "axes");
  if (a) {
    if (a->n > SPN_MAXD)
      return fail(r, SPN_EMODEL, "too many axes");
    memcpy(axes, a->ints, (size_t)a->n * 8);
    *na = (int)a->n;
    return SPN_OK;
  }
  if (has_in(n, 1))
    return read_ints(r, n, 1, axes, SPN_MAXD, na);
  return SPN_OK;
}

static int32_t dtype_from_onnx(int64_t t) {
  switch (t) {
  case 1: return SPN_DTYPE_F32;
  case 2: return SPN_DTYPE_U8;
  case 3: return SPN_DTYPE_I8;
  case 6: return SPN_DTYPE_I32;
  case 7: return SPN_DTYPE_I64;
  case 9: return SPN_DTYPE_BOOL;
  default: return SPN_DTYPE_INVALID;
  }
}

static bool is_unary_float(int op) {
  return op == SPN_OP_RELU || op == SPN_OP_LRELU || op == SPN_OP_SIGMOID || op == SPN_OP_TANH ||
         op == SPN_OP_CLIP || op == SPN_OP_EXP || op == SPN_OP_SOFTMAX || op == SPN_OP_BN;
}

static int32_t op_infer(spn_run_t *r, const spn_node_t *n);

/* Shape inference plus a bound on every produced shape, so later arithmetic
 * on shapes stays far from overflow. */
int32_t spn_op_infer(spn_run_t *r, const spn_node_t *n) {
  int32_t rc = op_infer(r, n);
  if (rc)
    return rc;
  for (int o = 0; o < n->n_out; o++) {
    if (n->out[o] < 0)
      continue;
    const spn_rt_val_t *y = OUT(o);
    if (y->ndim < 0 || y->ndim > SPN_MAXD)
      return fail(r, SPN_EMODEL, "output rank %d", y->ndim);
    for (int d = 0; d < y->ndim; d++)
      if (y->shape[d] < 0 || y->shape[d] > (INT64_C(1) << 40))
        return fail(r, SPN_ETOOBIG, "output dimension %d is %lld", d, (long long)y->shape[d]);
    if (numel(y) > (INT64_C(1) << 40))
      return fail(r, SPN_ETOOBIG, "output has too many elements");
  }
  return SPN_OK;
}

static int32_t op_infer(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = n->n_in > 0 && n->in[0] >= 0 ? IN(0) : NULL;
  spn_rt_val_t *y = OUT(0);
  int64_t shape[SPN_MAXD];
  int nd = 0;
  int32_t rc = SPN_OK;
  if (x && x->dtype == SPN_DTYPE_INVALID)
    return fail(r, SPN_EINTERNAL, "input has no type");
  if (is_unary_float(n->op) || n->op == SPN_OP_PRELU || n->op == SPN_OP_CONV || n->op == SPN_OP_CONVT ||
      n->op == SPN_OP_MAXPOOL || n->op == SPN_OP_AVGPOOL || n->op == SPN_OP_GAP || n->op == SPN_OP_D2S ||
      n->op == SPN_OP_RESIZE || n->op == SPN_OP_UPSAMPLE || n->op == SPN_OP_MATMUL ||
      n->op == SPN_OP_GEMM || n->op == SPN_OP_REDUCEMEAN) {
    if (x->dtype != SPN_DTYPE_F32)
      return fail(r, SPN_ETYPE, "input '%s' must be float", r->m->vals[n->in[0]].name);
  }
  switch (n->op) {
  case SPN_OP_CONV:
  case SPN_OP_CONVT: {
    const spn_rt_val_t *w = IN(1);
    int64_t g = spn_attr_int(n, "group", 1);
    if (x->ndim != w->ndim)
      return fail(r, SPN_EMODEL, "input has %d dims, weights %d", x->ndim, w->ndim);
    int64_t st[3], dl[3], pl[3], pr[3], osp[3];
    if ((rc = spn_conv_geometry(n, x, w, n->op == SPN_OP_CONVT, st, dl, pl, pr, osp, r->err)))
      return rc;
    int64_t oc;
    if (n->op == SPN_OP_CONV) {
      if (x->shape[1] != w->shape[1] * g || w->shape[0] % g)
        return fail(r, SPN_EMODEL, "input channels %lld do not match weights %lld x group %lld", (long long)x->shape[1], (long long)w->shape[1], (long long)g);
      oc = w->shape[0];
    } else {
      if (x->shape[1] != w->shape[0] || w->shape[0] % g)
        return fail(r, SPN_EMODEL, "input channels %lld do not match weights %lld", (long long)x->shape[1], (long long)w->shape[0]);
      oc = w->shape[1] * g;
    }
    if (has_in(n, 2) && IN(2)->shape[0] != oc)
      return fail(r, SPN_EMODEL, "bias has %lld values for %lld channels", (long long)IN(2)->shape[0], (long long)oc);
    shape[0] = x->shape[0];
    shape[1] = oc;
    for (int i = 0; i < x->ndim - 2; i++)
      shape[2 + i] = osp[i];
    for (int p = 0; p < n->n_post; p++)
      if (n->post[p].kind == SPN_POST_ADD) {
        const spn_rt_val_t *o = &r->v[n->post[p].val];
        int bnd;
        int64_t bs[SPN_MAXD];
        spn_rt_val_t tmp = {.ndim = x->ndim};
        memcpy(tmp.shape, shape, sizeof shape);
        if ((rc = bcast_shape(r, &tmp, o, &bnd, bs)))
          return rc;
        if (bnd != x->ndim || memcmp(bs, shape, (size_t)bnd * 8))
          return fail(r, SPN_EMODEL, "fused Add operand does not fit the output");
      }
    set_out(y, SPN_DTYPE_F32, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_BN:
    for (int k = 1; k < 5; k++)
      if (IN(k)->dtype != SPN_DTYPE_F32 || numel(IN(k)) != (x->ndim > 1 ? x->shape[1] : 1))
        return fail(r, SPN_EMODEL, "BatchNormalization parameter #%d has the wrong size", k);
    if (x->ndim < 2)
      return fail(r, SPN_EMODEL, "BatchNormalization needs N,C,...");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  case SPN_OP_RELU: case SPN_OP_LRELU: case SPN_OP_SIGMOID: case SPN_OP_TANH: case SPN_OP_EXP:
  case SPN_OP_IDENTITY:
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  case SPN_OP_CLIP:
    for (int k = 1; k < n->n_in; k++)
      if (has_in(n, k) && (IN(k)->dtype != SPN_DTYPE_F32 || numel(IN(k)) != 1))
        return fail(r, SPN_EMODEL, "Clip min/max must be float scalars");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  case SPN_OP_SOFTMAX: {
    int64_t def = r->m->opset >= 13 ? -1 : 1;
    if (norm_axis(spn_attr_int(n, "axis", def), x->ndim) < 0)
      return fail(r, SPN_EMODEL, "Softmax axis out of range");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  }
  case SPN_OP_PRELU: {
    if ((rc = bcast_shape(r, x, IN(1), &nd, shape)))
      return rc;
    if (nd != x->ndim || memcmp(shape, x->shape, (size_t)nd * 8) || IN(1)->dtype != SPN_DTYPE_F32)
      return fail(r, SPN_EMODEL, "PRelu slope does not broadcast to the input");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  }
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV: {
    const spn_rt_val_t *b = IN(1);
    if (x->dtype != b->dtype || (x->dtype != SPN_DTYPE_F32 && x->dtype != SPN_DTYPE_I64))
      return fail(r, SPN_ETYPE, "operands must both be float or both int64");
    if ((rc = bcast_shape(r, x, b, &nd, shape)))
      return rc;
    set_out(y, x->dtype, nd, shape);
    return SPN_OK;
  }
  case SPN_OP_CONCAT: {
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    if (ax < 0)
      return fail(r, SPN_EMODEL, "Concat axis out of range");
    memcpy(shape, x->shape, sizeof shape);
    shape[ax] = 0;
    for (int k = 0; k < n->n_in; k++) {
      if (!has_in(n, k))
        return fail(r, SPN_EMODEL, "empty Concat input");
      const spn_rt_val_t *v = IN(k);
      if (v->ndim != x->ndim || v->dtype != x->dtype)
        return fail(r, SPN_EMODEL, "Concat input #%d rank/type differs", k);
      for (int d = 0; d < x->ndim; d++)
        if (d != ax && v->shape[d] != x->shape[d])
          return fail(r, SPN_EMODEL, "Concat input #%d dim %d is %lld, expected %lld", k, d, (long long)v->shape[d], (long long)x->shape[d]);
      shape[ax] += v->shape[ax];
    }
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_SPLIT: {
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    if (ax < 0)
      return fail(r, SPN_EMODEL, "Split axis out of range");
    int64_t parts[64];
    int np = 0;
    const spn_attr_t *sa = spn_node_attr(n, "split");
    if (has_in(n, 1)) {
      if ((rc = read_ints(r, n, 1, parts, 64, &np)))
        return rc;
    } else if (sa) {
      if (sa->n > 64)
        return fail(r, SPN_EMODEL, "too many splits");
      np = (int)sa->n;
      memcpy(parts, sa->ints, (size_t)np * 8);
    } else {
      np = n->n_out;
      if (x->shape[ax] % np)
        return fail(r, SPN_EMODEL, "dim %lld does not split into %d equal parts", (long long)x->shape[ax], np);
      for (int i = 0; i < np; i++)
        parts[i] = x->shape[ax] / np;
    }
    int64_t sum = 0;
    for (int i = 0; i < np; i++) {
      if (parts[i] < 0 || parts[i] > x->shape[ax])
        return fail(r, SPN_EMODEL, "split size %lld out of range", (long long)parts[i]);
      sum += parts[i];
    }
    if (np != n->n_out || sum != x->shape[ax])
      return fail(r, SPN_EMODEL, "split sizes do not match the dim (%lld) or the outputs (%d)", (long long)x->shape[ax], n->n_out);
    for (int o = 0; o < n->n_out; o++) {
      if (n->out[o] < 0)
        continue;
      memcpy(shape, x->shape, sizeof shape);
      shape[ax] = parts[o];
      set_out(OUT(o), x->dtype, x->ndim, shape);
    }
    return SPN_OK;
  }
  case SPN_OP_D2S: {
    int64_t b = spn_attr_int(n, "blocksize", 1);
    if (x->ndim != 4 || b > 4096 || x->shape[1] % (b * b))
      return fail(r, SPN_EMODEL, "DepthToSpace needs NCHW with C divisible by blocksize^2");
    int64_t s[4] = {x->shape[0], x->shape[1] / (b * b), x->shape[2] * b, x->shape[3] * b};
    set_out(y, x->dtype, 4, s);
    return SPN_OK;
  }
  case SPN_OP_RESIZE:
  case SPN_OP_UPSAMPLE: {
    float sc[SPN_MAXD];
    if ((rc = infer_resize(r, n, sc, shape)))
      return rc;
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_TRANSPOSE: {
    const spn_attr_t *p = spn_node_attr(n, "perm");
    bool seen[SPN_MAXD] = {0};
    if (p && p->n != x->ndim)
      return fail(r, SPN_EMODEL, "perm has %lld values for %d dims", (long long)p->n, x->ndim);
    for (int d = 0; d < x->ndim; d++) {
      int64_t s = p ? p->ints[d] : x->ndim - 1 - d;
      if (s < 0 || s >= x->ndim || seen[s])
        return fail(r, SPN_EMODEL, "invalid perm");
      seen[s] = true;
      shape[d] = x->shape[s];
    }
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_RESHAPE: {
    int64_t want[SPN_MAXD];
    int cnt;
    if ((rc = read_ints(r, n, 1, want, SPN_MAXD, &cnt)))
      return rc;
    bool allowzero = spn_attr_int(n, "allowzero", 0);
    int neg = -1;
    int64_t prod = 1, total = numel(x);
    for (int i = 0; i < cnt; i++) {
      if (want[i] == 0 && !allowzero) {
        if (i >= x->ndim)
          return fail(r, SPN_EMODEL, "Reshape 0 at dim %d beyond the input rank", i);
        want[i] = x->shape[i];
      }
      if (want[i] == -1) {
        if (neg >= 0)
          return fail(r, SPN_EMODEL, "Reshape with two -1");
        neg = i;
        continue;
      }
      if (want[i] < 0 || want[i] > (INT64_C(1) << 34))
        return fail(r, SPN_EMODEL, "Reshape dim %lld", (long long)want[i]);
      prod = smul(prod, want[i]);
      if (prod > (INT64_C(1) << 40))
        return fail(r, SPN_EMODEL, "Reshape too large");
    }
    if (neg >= 0) {
      if (prod == 0 || total % prod)
        return fail(r, SPN_EMODEL, "cannot infer -1 reshaping %lld elements", (long long)total);
      want[neg] = total / prod;
      prod *= want[neg];
    }
    if (prod != total)
      return fail(r, SPN_EMODEL, "Reshape to %lld elements from %lld", (long long)prod, (long long)total);
    set_out(y, x->dtype, cnt, want);
    return SPN_OK;
  }
  case SPN_OP_FLATTEN: {
    int64_t a = spn_attr_int(n, "axis", 1);
    if (a < 0)
      a += x->ndim;
    if (a < 0 || a > x->ndim)
      return fail(r, SPN_EMODEL, "Flatten axis out of range");
    int64_t s[2] = {1, 1};
    for (int d = 0; d < x->ndim; d++)
      s[d < a ? 0 : 1] = smul(s[d < a ? 0 : 1], x->shape[d]);
    set_out(y, x->dtype, 2, s);
    return SPN_OK;
  }
  case SPN_OP_SQUEEZE: {
    int64_t axes[SPN_MAXD];
    int na;
    if ((rc = axes_of(r, n, axes, &na)))
      return rc;
    bool drop[SPN_MAXD] = {0};
    for (int i = 0; i < na; i++) {
      int a = norm_axis(axes[i], x->ndim);
      if (a < 0 || x->shape[a] != 1)
        return fail(r, SPN_EMODEL, "Squeeze axis %lld is not a dim of size 1", (long long)axes[i]);
      drop[a] = true;
    }
    for (int d = 0; d < x->ndim; d++)
      if (!(na ? drop[d] : x->shape[d] == 1))
        shape[nd++] = x->shape[d];
    set_out(y, x->dtype, nd, shape);
    return SPN_OK;
  }
  case SPN_OP_UNSQUEEZE: {
    int64_t axes[SPN_MAXD];
    int na;
    if ((rc = axes_of(r, n, axes, &na)))
      return rc;
    int on = x->ndim + na;
    if (on > SPN_MAXD || na == 0)
      return fail(r, SPN_EMODEL, "Unsqueeze needs axes and at most %d dims", SPN_MAXD);
    bool ins[SPN_MAXD] = {0};
    for (int i = 0; i < na; i++) {
      int a = norm_axis(axes[i], on);
      if (a < 0 || ins[a])
        return fail(r, SPN_EMODEL, "Unsqueeze axis %lld invalid", (long long)axes[i]);
      ins[a] = true;
    }
    for (int d = 0, s = 0; d < on; d++)
      shape[d] = ins[d] ? 1 : x->shape[s++];
    set_out(y, x->dtype, on, shape);
    return SPN_OK;
  }
  case SPN_OP_MAXPOOL:
  case SPN_OP_AVGPOOL: {
    const spn_attr_t *k = spn_node_attr(n, "kernel_shape");
    int nsp = x->ndim - 2;
    if (k->n != nsp)
      return fail(r, SPN_EMODEL, "kernel_shape has %lld values for %d spatial dims", (long long)k->n, nsp);
    int64_t st[3], dl[3], pl[3], pr[3], osp[3];
    if ((rc = window_geometry(r, n, x, nsp, k->ints, spn_attr_int(n, "ceil_mode", 0), st, dl, pl, pr, osp)))
      return rc;
    memcpy(shape, x->shape, sizeof shape);
    for (int i = 0; i < nsp; i++)
      shape[2 + i] = osp[i];
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_GAP:
    if (x->ndim < 3)
      return fail(r, SPN_EMODEL, "GlobalAveragePool needs N,C,spatial");
    memcpy(shape, x->shape, sizeof shape);
    for (int d = 2; d < x->ndim; d++)
      shape[d] = 1;
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  case SPN_OP_PAD: {
    int64_t pads[2 * SPN_MAXD];
    float v;
    if ((rc = pad_params(r, n, pads, &v)))
      return rc;
    for (int d = 0; d < x->ndim; d++) {
      if (pads[d] > (1 << 24) || pads[d + x->ndim] > (1 << 24) || pads[d] < -(1 << 30) || pads[d + x->ndim] < -(1 << 30))
        return fail(r, SPN_EMODEL, "pad out of range");
      shape[d] = x->shape[d] + pads[d] + pads[d + x->ndim];
      if (shape[d] < 0)
        return fail(r, SPN_EMODEL, "negative padded size");
      if (strcmp(spn_attr_str(n, "mode", "constant"), "constant") && (pads[d] < 0 || pads[d + x->ndim] < 0 || ((pads[d] || pads[d + x->ndim]) && x->shape[d] == 0)))
        return fail(r, SPN_EUNSUPPORTED, "negative pads only in constant mode");
      if (!strcmp(spn_attr_str(n, "mode", "constant"), "reflect") && (pads[d] >= x->shape[d] || pads[d + x->ndim] >= x->shape[d]))
        return fail(r, SPN_EMODEL, "reflect pad larger than the dim");
    }
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_SLICE: {
    int64_t st[SPN_MAXD], sp[SPN_MAXD];
    if ((rc = slice_params(r, n, st, sp, shape)))
      return rc;
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_GATHER: {
    const spn_rt_val_t *ix = IN(1);
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    if (ax < 0 || x->ndim + ix->ndim - 1 > SPN_MAXD)
      return fail(r, SPN_EMODEL, "Gather axis out of range");
    if (ix->dtype != SPN_DTYPE_I64 && ix->dtype != SPN_DTYPE_I32)
      return fail(r, SPN_ETYPE, "Gather indices must be int64 or int32");
    for (int d = 0; d < ax; d++)
      shape[nd++] = x->shape[d];
    for (int d = 0; d < ix->ndim; d++)
      shape[nd++] = ix->shape[d];
    for (int d = ax + 1; d < x->ndim; d++)
      shape[nd++] = x->shape[d];
    set_out(y, x->dtype, nd, shape);
    return SPN_OK;
  }
  case SPN_OP_SHAPE: {
    int64_t s = spn_attr_int(n, "start", 0), e = spn_attr_int(n, "end", x->ndim);
    if (s < 0) s += x->ndim;
    if (e < 0) e += x->ndim;
    s = s < 0 ? 0 : (s > x->ndim ? x->ndim : s);
    e = e < 0 ? 0 : (e > x->ndim ? x->ndim : e);
    shape[0] = e > s ? e - s : 0;
    set_out(y, SPN_DTYPE_I64, 1, shape);
    return SPN_OK;
  }
  case SPN_OP_CONSTANT: {
    const spn_attr_t *a;
    if ((a = spn_node_attr(n, "value"))) {
      const spn_rt_val_t *t = &r->v[a->tval];
      set_out(y, t->dtype, t->ndim, t->shape);
    } else if ((a = spn_node_attr(n, "value_float"))) {
      set_out(y, SPN_DTYPE_F32, 0, shape);
    } else if ((a = spn_node_attr(n, "value_int"))) {
      set_out(y, SPN_DTYPE_I64, 0, shape);
    } else if ((a = spn_node_attr(n, "value_floats"))) {
      shape[0] = a->n;
      set_out(y, SPN_DTYPE_F32, 1, shape);
    } else {
      a = spn_node_attr(n, "value_ints");
      shape[0] = a->n;
      set_out(y, SPN_DTYPE_I64, 1, shape);
    }
    return SPN_OK;
  }
  case SPN_OP_COS: {
    int cnt;
    if ((rc = read_ints(r, n, 0, shape, SPN_MAXD, &cnt)))
      return rc;
    int64_t tot = 1;
    for (int i = 0; i < cnt; i++) {
      if (shape[i] < 0 || shape[i] > (INT64_C(1) << 31))
        return fail(r, SPN_EMODEL, "ConstantOfShape dim %lld", (long long)shape[i]);
      tot = smul(tot, shape[i]);
      if (tot > (INT64_C(1) << 32))
        return fail(r, SPN_ETOOBIG, "ConstantOfShape too large");
    }
    const spn_attr_t *a = spn_node_attr(n, "value");
    int32_t dt = a ? r->v[a->tval].dtype : SPN_DTYPE_F32;
    if (a && numel(&r->v[a->tval]) != 1)
      return fail(r, SPN_EMODEL, "ConstantOfShape value must have one element");
    set_out(y, dt, cnt, shape);
    return SPN_OK;
  }
  case SPN_OP_CAST:
    set_out(y, dtype_from_onnx(spn_attr_int(n, "to", 1)), x->ndim, x->shape);
    if (x->dtype == SPN_DTYPE_INVALID || y->dtype == SPN_DTYPE_INVALID)
      return fail(r, SPN_EUNSUPPORTED, "Cast types");
    return SPN_OK;
  case SPN_OP_MATMUL: {
    const spn_rt_val_t *b = IN(1);
    if (b->dtype != SPN_DTYPE_F32 || x->ndim < 1 || b->ndim < 1)
      return fail(r, SPN_ETYPE, "MatMul needs float tensors with rank >= 1");
    spn_rt_val_t A = *x, B = *b;
    if (A.ndim == 1) { A.ndim = 2; A.shape[1] = A.shape[0]; A.shape[0] = 1; }
    if (B.ndim == 1) { B.ndim = 2; B.shape[1] = 1; }
    if (A.shape[A.ndim - 1] != B.shape[B.ndim - 2])
      return fail(r, SPN_EMODEL, "MatMul inner dims %lld vs %lld", (long long)A.shape[A.ndim - 1], (long long)B.shape[B.ndim - 2]);
    spn_rt_val_t ab = {.ndim = A.ndim - 2}, bb = {.ndim = B.ndim - 2};
    memcpy(ab.shape, A.shape, (size_t)ab.ndim * 8);
    memcpy(bb.shape, B.shape, (size_t)bb.ndim * 8);
    if ((rc = bcast_shape(r, &ab, &bb, &nd, shape)))
      return rc;
    if (x->ndim > 1)
      shape[nd++] = A.shape[A.ndim - 2];
    if (b->ndim > 1)
      shape[nd++] = B.shape[B.ndim - 1];
    set_out(y, SPN_DTYPE_F32, nd, shape);
    return SPN_OK;
  }
  case SPN_OP_GEMM: {
    const spn_rt_val_t *b = IN(1);
    if (x->ndim != 2 || b->ndim != 2 || b->dtype != SPN_DTYPE_F32)
      return fail(r, SPN_EMODEL, "Gemm needs 2-D float A and B");
    bool ta = spn_attr_int(n, "transA", 0), tb = spn_attr_int(n, "transB", 0);
    int64_t M = ta ? x->shape[1] : x->shape[0], K = ta ? x->shape[0] : x->shape[1];
    int64_t K2 = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    if (K != K2)
      return fail(r, SPN_EMODEL, "Gemm inner dims %lld vs %lld", (long long)K, (long long)K2);
    shape[0] = M;
    shape[1] = N;
    if (has_in(n, 2)) {
      spn_rt_val_t yy = {.ndim = 2, .shape = {M, N}};
      int bnd;
      int64_t bs[SPN_MAXD];
      if (IN(2)->dtype != SPN_DTYPE_F32 || (rc = bcast_shape(r, &yy, IN(2), &bnd, bs)) || bnd != 2 || bs[0] != M || bs[1] != N)
        return rc ? rc : fail(r, SPN_EMODEL, "Gemm C does not broadcast to (M, N)");
    }
    set_out(y, SPN_DTYPE_F32, 2, shape);
    return SPN_OK;
  }
  case SPN_OP_REDUCEMEAN: {
    int64_t axes[SPN_MAXD];
    int na;
    if ((rc = axes_of(r, n, axes, &na)))
      return rc;
    bool red[SPN_MAXD] = {0};
    for (int i = 0; i < na; i++) {
      int a = norm_axis(axes[i], x->ndim);
      if (a < 0)
        return fail(r, SPN_EMODEL, "ReduceMean axis out of range");
      red[a] = true;
    }
    bool keep = spn_attr_int(n, "keepdims", 1);
    for (int d = 0; d < x->ndim; d++) {
      bool rd = na ? red[d] : true;
      if (rd && keep)
        shape[nd++] = 1;
      else if (!rd)
        shape[nd++] = x->shape[d];
    }
    set_out(y, x->dtype, nd, shape);
    return SPN_OK;
  }
  default:
    return fail(r, SPN_EUNSUPPORTED, "no shape function");
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

static int32_t exec_resize(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = IN(0);
  spn_rt_val_t *y = OUT(0);
  float sc[SPN_MAXD];
  int64_t sz[SPN_MAXD];
  int32_t rc = infer_resize(r, n, sc, sz);
  if (rc)
    return rc;
  const char *mode = spn_attr_str(n, "mode", "nearest");
  bool linear = strcmp(mode, "nearest") != 0;
  const char *ct = n->op == SPN_OP_UPSAMPLE ? "asymmetric" : spn_attr_str(n, "coordinate_transformation_mode", "half_pixel");
  const char *nm = n->op == SPN_OP_UPSAMPLE ? "floor" : spn_attr_str(n, "nearest_mode", "round_prefer_floor");
  int nsp = x->ndim - 2;
  /* Treat 1-D and 3-D as 2-D/3-D with leading size-1 spatial dims: support
   * up to 3 spatial dims via (D, H, W). */
  int64_t ish[3] = {1, 1, 1}, osh[3] = {1, 1, 1};
  float scl[3] = {1, 1, 1};
  for (int i = 0; i < nsp; i++) {
    ish[3 - nsp + i] = x->shape[2 + i];
    osh[3 - nsp + i] = y->shape[2 + i];
    scl[3 - nsp + i] = sc[2 + i];
  }
  int64_t planes = x->shape[0] * x->shape[1];
  int64_t *i0[3], *i1[3];
  float *wt[3];
  int64_t tot = osh[0] + osh[1] + osh[2];
  int64_t *ib = malloc((size_t)tot * 2 * sizeof(int64_t));
  float *wb = malloc((size_t)tot * sizeof(float));
  if (!ib || !wb) {
    free(ib);
    free(wb);
    return fail(r, SPN_ENOMEM, "out of memory");
  }
  int64_t off = 0;
  for (int a = 0; a < 3; a++) {
    i0[a] = ib + 2 * off;
    i1[a] = i0[a] + osh[a];
    wt[a] = wb + off;
    for (int64_t o = 0; o < osh[a]; o++) {
      float c = src_coord(ct, (float)o, scl[a], ish[a], osh[a]);
      if (!linear) {
        i0[a][o] = i1[a][o] = nearest_idx(nm, c, ish[a]);
        wt[a][o] = 0;
      } else {
        if (c < 0) c = 0;
        if (c > (float)(ish[a] - 1)) c = (float)(ish[a] - 1);
        int64_t f = (int64_t)floorf(c);
        i0[a][o] = f;
        i1[a][o] = f + 1 < ish[a] ? f + 1 : ish[a] - 1;
        wt[a][o] = c - (float)f;
      }
    }
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
  int32_t rc = pad_params(r, n, pads, &val);
  if (rc)
    return rc;
  const char *mode = spn_attr_str(n, "mode", "constant");
  int m = !strcmp(mode, "constant") ? 0 : (!strcmp(mode, "reflect") ? 1 : 2);
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
    return spn_sgemm('N', 'N', M * batch, N, K, 1.f, PA, K, PB, N, 0.f, PY, N) ? fail(r, SPN_EINTERNAL, "sgemm failed") : SPN_OK;
  for (int64_t i = 0; i < batch; i++) {
    int64_t rem = i, oa = 0, ob = 0;
    for (int d = bn - 1; d >= 0; d--) {
      int64_t c = rem % bsh[d];
      rem /= bsh[d];
      oa += c * sa[d];
      ob += c * sb[d];
    }
    if (spn_sgemm('N', 'N', M, N, K, 1.f, PA + oa, K, PB + ob, N, 0.f, PY + i * M * N, N))
      return fail(r, SPN_EINTERNAL, "sgemm failed");
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
    return fail(r, SPN_EINTERNAL, "sgemm failed");
  return SPN_OK;
}

int32_t spn_op_exec(spn_run_t *r, const spn_node_t *n) {
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
    int32_t rc = slice_params(r, n, st, sp, count);
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
        return fail(r, SPN_EINVAL, "Gather index %lld out of range [-%lld, %lld)", (long long)k, (long long)dim, (long long)dim);
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
    int32_t rc = axes_of(r, n, axes, &na);
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
      return fail(r, SPN_ENOMEM, "out of memory");
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
    return fail(r, SPN_EUNSUPPORTED, "no kernel");
  }
}
