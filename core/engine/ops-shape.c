/* ops-shape.c — backend-neutral operator code: load-time checks and shape
 * inference.
 *
 * spn_op_check validates a node once at load (input counts, constant
 * weights, attribute values); spn_op_infer computes output dtypes and shapes
 * from input shapes (and from the values of constant or shape-class inputs:
 * Reshape's shape, Slice's starts, Resize's sizes). Nothing here depends on
 * a backend; the kernels live in the backends (cpu-kernels.c, cpu-dnnl.c and
 * cuda/engine/). Errors are reported through r->err, never by crashing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops-internal.h"

static void set_out(spn_rt_val_t *o, int32_t dtype, int ndim, const int64_t *shape) {
  o->dtype = dtype;
  o->ndim = ndim;
  memset(o->shape, 0, sizeof o->shape);
  if (ndim)
    memcpy(o->shape, shape, (size_t)ndim * sizeof(int64_t));
}

int32_t spn_op_fail(spn_run_t *r, int32_t code, const char *fmt, ...) {
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
    return spn_op_fail(r, SPN_EUNSUPPORTED, "input '%s' must be a constant or computed from shapes", r->m->vals[n->in[k]].name);
  int64_t c = numel(v);
  if (c > max)
    return spn_op_fail(r, SPN_EMODEL, "input '%s' has %lld values (at most %d)", r->m->vals[n->in[k]].name, (long long)c, max);
  for (int64_t i = 0; i < c; i++) {
    if (v->dtype == SPN_DTYPE_I64)
      dst[i] = ((const int64_t *)v->data)[i];
    else if (v->dtype == SPN_DTYPE_I32)
      dst[i] = ((const int32_t *)v->data)[i];
    else
      return spn_op_fail(r, SPN_ETYPE, "input '%s' must be int64 or int32", r->m->vals[n->in[k]].name);
  }
  *count = (int)c;
  return SPN_OK;
}

static int32_t read_floats(spn_run_t *r, const spn_node_t *n, int k, float *dst, int max,
                           int *count) {
  const spn_rt_val_t *v = IN(k);
  if (!v->data)
    return spn_op_fail(r, SPN_EUNSUPPORTED, "input '%s' must be a constant or computed from shapes", r->m->vals[n->in[k]].name);
  int64_t c = numel(v);
  if (c > max || v->dtype != SPN_DTYPE_F32)
    return spn_op_fail(r, SPN_EMODEL, "input '%s' must hold at most %d floats", r->m->vals[n->in[k]].name, max);
  memcpy(dst, v->data, (size_t)c * sizeof(float));
  *count = (int)c;
  return SPN_OK;
}

/* ---- load-time checks ---- */

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
      [SPN_OP_INTERLEAVE] = {1, 64, 1, 1},
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
  case SPN_OP_INTERLEAVE: {
    int64_t b = spn_attr_int(n, "blocksize", 0);
    if (b < 1 || b > 8 || b * b != n->n_in)
      return spn_error_set(err, SPN_EINTERNAL, "%s: node '%s' (%s): needs blocksize^2 inputs", file, n->name, n->op_name);
    break;
  }
  case SPN_OP_D2S: {
    const char *mode = spn_attr_str(n, "mode", "DCR");
    if (spn_attr_int(n, "blocksize", 0) < 1 || (strcmp(mode, "DCR") && strcmp(mode, "CRD")))
      return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (DepthToSpace): needs blocksize >= 1 and mode DCR or CRD", file, n->name);
    break;
  }
  case SPN_OP_RESIZE:
  case SPN_OP_UPSAMPLE: {
    const char *mode = spn_attr_str(n, "mode", "nearest");
    if (strcmp(mode, "nearest") && strcmp(mode, "linear") && strcmp(mode, "bilinear") && (strcmp(mode, "cubic") || n->op != SPN_OP_RESIZE))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): mode '%s' is not supported (nearest, linear, cubic)", file, n->name, n->op_name, mode);
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
    if (spn_attr_int(n, "exclude_outside", 0) && strcmp(mode, "cubic"))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): exclude_outside=1 is only supported with mode cubic", file, n->name, n->op_name);
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
    return spn_op_fail(r, SPN_EMODEL, "strides/dilations/pads do not match %d spatial dims", nsp);
  for (int i = 0; i < nsp; i++) {
    stride[i] = as ? as->ints[i] : 1;
    dil[i] = ad ? ad->ints[i] : 1;
    pl[i] = ap ? ap->ints[i] : 0;
    pr[i] = ap ? ap->ints[i + nsp] : 0;
    if (stride[i] < 1 || dil[i] < 1 || k[i] < 1 || pl[i] < 0 || pr[i] < 0 || stride[i] > 1 << 20 || dil[i] > 1 << 20 || k[i] > 1 << 20 || pl[i] > 1 << 20 || pr[i] > 1 << 20)
      return spn_op_fail(r, SPN_EMODEL, "invalid stride/dilation/kernel/pad on spatial dim %d", i);
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
      return spn_op_fail(r, SPN_EMODEL, "kernel (%lld) larger than padded input (%lld) on spatial dim %d", (long long)ek, (long long)(in + pl[i] + pr[i]), i);
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
      return spn_op_fail(r, SPN_EMODEL, "cannot broadcast dim %d: %lld vs %lld", i, (long long)da, (long long)db);
    shape[i] = da == 1 ? db : da;
  }
  *nd = n;
  return SPN_OK;
}

/* ---- shape inference ---- */

int32_t spn_op_infer_resize(spn_run_t *r, const spn_node_t *n, float *scales, int64_t *sizes) {
  const spn_rt_val_t *x = IN(0);
  int nd = x->ndim, cnt = 0;
  bool have_sizes = false;
  if (n->op == SPN_OP_UPSAMPLE) {
    if (!has_in(n, 1))
      return spn_op_fail(r, SPN_EMODEL, "Upsample needs scales");
    int32_t rc = read_floats(r, n, 1, scales, SPN_MAXD, &cnt);
    if (rc)
      return rc;
  } else if (has_in(n, 3) && numel(IN(3)) > 0) {
    int64_t tmp[SPN_MAXD];
    int32_t rc = read_ints(r, n, 3, tmp, SPN_MAXD, &cnt);
    if (rc)
      return rc;
    if (cnt != nd)
      return spn_op_fail(r, SPN_EMODEL, "sizes has %d values for %d dims", cnt, nd);
    for (int i = 0; i < nd; i++) {
      if (tmp[i] < 1 || tmp[i] > (INT64_C(1) << 31))
        return spn_op_fail(r, SPN_EMODEL, "invalid size %lld", (long long)tmp[i]);
      sizes[i] = tmp[i];
      scales[i] = (float)tmp[i] / (float)x->shape[i];
    }
    have_sizes = true;
  } else if (has_in(n, 2)) {
    int32_t rc = read_floats(r, n, 2, scales, SPN_MAXD, &cnt);
    if (rc)
      return rc;
  } else {
    return spn_op_fail(r, SPN_EMODEL, "Resize needs scales or sizes");
  }
  if (!have_sizes) {
    if (cnt != nd)
      return spn_op_fail(r, SPN_EMODEL, "scales has %d values for %d dims", cnt, nd);
    for (int i = 0; i < nd; i++) {
      double s = (double)x->shape[i] * scales[i];
      if (!(scales[i] > 0) || s > (double)(INT64_C(1) << 31))
        return spn_op_fail(r, SPN_EMODEL, "invalid scale %g", scales[i]);
      sizes[i] = (int64_t)floor(s + 1e-6 * 0);
      sizes[i] = (int64_t)floorf((float)x->shape[i] * scales[i]);
      if (sizes[i] < 1)
        return spn_op_fail(r, SPN_EMODEL, "scale %g gives an empty output", scales[i]);
    }
  }
  if (nd < 3 || sizes[0] != x->shape[0] || sizes[1] != x->shape[1] || nd > 5)
    return spn_op_fail(r, SPN_EUNSUPPORTED, "only spatial resizing of NC... tensors is supported");
  return SPN_OK;
}

int32_t spn_op_slice_params(spn_run_t *r, const spn_node_t *n, int64_t *start, int64_t *step,
                            int64_t *count) {
  const spn_rt_val_t *x = IN(0);
  int nd = x->ndim;
  int64_t st[SPN_MAXD], en[SPN_MAXD], ax[SPN_MAXD], sp[SPN_MAXD];
  int ns = 0, ne = 0, na = 0, nsp = 0;
  int32_t rc;
  if (r->m->opset < 10) {
    const spn_attr_t *a = spn_node_attr(n, "starts"), *b = spn_node_attr(n, "ends"), *c = spn_node_attr(n, "axes");
    if (!a || !b || a->n > SPN_MAXD || b->n != a->n || (c && c->n != a->n))
      return spn_op_fail(r, SPN_EMODEL, "Slice needs starts/ends");
    ns = ne = (int)a->n;
    memcpy(st, a->ints, (size_t)ns * 8);
    memcpy(en, b->ints, (size_t)ne * 8);
    if (c) {
      na = (int)c->n;
      memcpy(ax, c->ints, (size_t)na * 8);
    }
  } else {
    if (!has_in(n, 1) || !has_in(n, 2))
      return spn_op_fail(r, SPN_EMODEL, "Slice needs starts and ends inputs");
    if ((rc = read_ints(r, n, 1, st, SPN_MAXD, &ns)) || (rc = read_ints(r, n, 2, en, SPN_MAXD, &ne)))
      return rc;
    if (has_in(n, 3) && (rc = read_ints(r, n, 3, ax, SPN_MAXD, &na)))
      return rc;
    if (has_in(n, 4) && (rc = read_ints(r, n, 4, sp, SPN_MAXD, &nsp)))
      return rc;
  }
  if (ne != ns || (na && na != ns) || (nsp && nsp != ns))
    return spn_op_fail(r, SPN_EMODEL, "Slice starts/ends/axes/steps lengths differ");
  for (int d = 0; d < nd; d++) {
    start[d] = 0;
    step[d] = 1;
    count[d] = x->shape[d];
  }
  bool seen[SPN_MAXD] = {0};
  for (int i = 0; i < ns; i++) {
    int a = na ? norm_axis(ax[i], nd) : i;
    if (a < 0 || seen[a])
      return spn_op_fail(r, SPN_EMODEL, "Slice axis out of range or repeated");
    seen[a] = true;
    int64_t dim = x->shape[a], s = st[i], e = en[i], k = nsp ? sp[i] : 1;
    if (k == 0 || k == INT64_MIN)
      return spn_op_fail(r, SPN_EMODEL, "Slice step %lld", (long long)k);
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

spn_pad_mode_t spn_op_pad_mode(const spn_node_t *n) {
  const char *mode = spn_attr_str(n, "mode", "constant");
  return !strcmp(mode, "constant") ? SPN_PAD_CONSTANT : (!strcmp(mode, "reflect") ? SPN_PAD_REFLECT : SPN_PAD_EDGE);
}

int32_t spn_op_pad_params(spn_run_t *r, const spn_node_t *n, int64_t *pads, float *value) {
  int nd = IN(0)->ndim, cnt = 0;
  *value = 0;
  if (r->m->opset < 11) {
    const spn_attr_t *p = spn_node_attr(n, "pads");
    if (!p || p->n != 2 * nd)
      return spn_op_fail(r, SPN_EMODEL, "Pad needs %d pads", 2 * nd);
    memcpy(pads, p->ints, (size_t)(2 * nd) * 8);
    *value = spn_attr_float(n, "value", 0.f);
    return SPN_OK;
  }
  if (!has_in(n, 1))
    return spn_op_fail(r, SPN_EMODEL, "Pad needs the pads input");
  int32_t rc = read_ints(r, n, 1, pads, 2 * SPN_MAXD, &cnt);
  if (rc)
    return rc;
  if (cnt != 2 * nd)
    return spn_op_fail(r, SPN_EMODEL, "Pad has %d pads for %d dims", cnt, nd);
  if (has_in(n, 2) && IN(2)->data && numel(IN(2)) == 1) {
    if (IN(2)->dtype == SPN_DTYPE_F32)
      *value = *(const float *)IN(2)->data;
    else if (IN(2)->dtype == SPN_DTYPE_I64)
      *value = (float)*(const int64_t *)IN(2)->data;
  }
  if (has_in(n, 3))
    return spn_op_fail(r, SPN_EUNSUPPORTED, "Pad axes input is not supported");
  return SPN_OK;
}

int32_t spn_op_axes_of(spn_run_t *r, const spn_node_t *n, int64_t *axes, int *na) {
  *na = 0;
  const spn_attr_t *a = spn_node_attr(n, "axes");
  if (a) {
    if (a->n > SPN_MAXD)
      return spn_op_fail(r, SPN_EMODEL, "too many axes");
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
      return spn_op_fail(r, SPN_EMODEL, "output rank %d", y->ndim);
    for (int d = 0; d < y->ndim; d++)
      if (y->shape[d] < 0 || y->shape[d] > (INT64_C(1) << 40))
        return spn_op_fail(r, SPN_ETOOBIG, "output dimension %d is %lld", d, (long long)y->shape[d]);
    if (numel(y) > (INT64_C(1) << 40))
      return spn_op_fail(r, SPN_ETOOBIG, "output has too many elements");
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
    return spn_op_fail(r, SPN_EINTERNAL, "input has no type");
  if (is_unary_float(n->op) || n->op == SPN_OP_PRELU || n->op == SPN_OP_CONV || n->op == SPN_OP_CONVT ||
      n->op == SPN_OP_MAXPOOL || n->op == SPN_OP_AVGPOOL || n->op == SPN_OP_GAP || n->op == SPN_OP_D2S ||
      n->op == SPN_OP_RESIZE || n->op == SPN_OP_UPSAMPLE || n->op == SPN_OP_MATMUL ||
      n->op == SPN_OP_GEMM || n->op == SPN_OP_REDUCEMEAN) {
    if (x->dtype != SPN_DTYPE_F32)
      return spn_op_fail(r, SPN_ETYPE, "input '%s' must be float", r->m->vals[n->in[0]].name);
  }
  switch (n->op) {
  case SPN_OP_CONV:
  case SPN_OP_CONVT: {
    const spn_rt_val_t *w = IN(1);
    int64_t g = spn_attr_int(n, "group", 1);
    if (x->ndim != w->ndim)
      return spn_op_fail(r, SPN_EMODEL, "input has %d dims, weights %d", x->ndim, w->ndim);
    int64_t st[3], dl[3], pl[3], pr[3], osp[3];
    if ((rc = spn_conv_geometry(n, x, w, n->op == SPN_OP_CONVT, st, dl, pl, pr, osp, r->err)))
      return rc;
    int64_t oc;
    if (n->op == SPN_OP_CONV) {
      if (x->shape[1] != w->shape[1] * g || w->shape[0] % g)
        return spn_op_fail(r, SPN_EMODEL, "input channels %lld do not match weights %lld x group %lld", (long long)x->shape[1], (long long)w->shape[1], (long long)g);
      oc = w->shape[0];
    } else {
      if (x->shape[1] != w->shape[0] || w->shape[0] % g)
        return spn_op_fail(r, SPN_EMODEL, "input channels %lld do not match weights %lld", (long long)x->shape[1], (long long)w->shape[0]);
      oc = w->shape[1] * g;
    }
    if (has_in(n, 2) && IN(2)->shape[0] != oc)
      return spn_op_fail(r, SPN_EMODEL, "bias has %lld values for %lld channels", (long long)IN(2)->shape[0], (long long)oc);
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
          return spn_op_fail(r, SPN_EMODEL, "fused Add operand does not fit the output");
      }
    set_out(y, SPN_DTYPE_F32, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_BN:
    for (int k = 1; k < 5; k++)
      if (IN(k)->dtype != SPN_DTYPE_F32 || numel(IN(k)) != (x->ndim > 1 ? x->shape[1] : 1))
        return spn_op_fail(r, SPN_EMODEL, "BatchNormalization parameter #%d has the wrong size", k);
    if (x->ndim < 2)
      return spn_op_fail(r, SPN_EMODEL, "BatchNormalization needs N,C,...");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  case SPN_OP_RELU: case SPN_OP_LRELU: case SPN_OP_SIGMOID: case SPN_OP_TANH: case SPN_OP_EXP:
  case SPN_OP_IDENTITY:
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  case SPN_OP_CLIP:
    for (int k = 1; k < n->n_in; k++)
      if (has_in(n, k) && (IN(k)->dtype != SPN_DTYPE_F32 || numel(IN(k)) != 1))
        return spn_op_fail(r, SPN_EMODEL, "Clip min/max must be float scalars");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  case SPN_OP_SOFTMAX: {
    int64_t def = r->m->opset >= 13 ? -1 : 1;
    if (norm_axis(spn_attr_int(n, "axis", def), x->ndim) < 0)
      return spn_op_fail(r, SPN_EMODEL, "Softmax axis out of range");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  }
  case SPN_OP_PRELU: {
    if ((rc = bcast_shape(r, x, IN(1), &nd, shape)))
      return rc;
    if (nd != x->ndim || memcmp(shape, x->shape, (size_t)nd * 8) || IN(1)->dtype != SPN_DTYPE_F32)
      return spn_op_fail(r, SPN_EMODEL, "PRelu slope does not broadcast to the input");
    set_out(y, x->dtype, x->ndim, x->shape);
    return SPN_OK;
  }
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV: {
    const spn_rt_val_t *b = IN(1);
    if (x->dtype != b->dtype || (x->dtype != SPN_DTYPE_F32 && x->dtype != SPN_DTYPE_I64))
      return spn_op_fail(r, SPN_ETYPE, "operands must both be float or both int64");
    if ((rc = bcast_shape(r, x, b, &nd, shape)))
      return rc;
    set_out(y, x->dtype, nd, shape);
    return SPN_OK;
  }
  case SPN_OP_CONCAT: {
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    if (ax < 0)
      return spn_op_fail(r, SPN_EMODEL, "Concat axis out of range");
    memcpy(shape, x->shape, sizeof shape);
    shape[ax] = 0;
    for (int k = 0; k < n->n_in; k++) {
      if (!has_in(n, k))
        return spn_op_fail(r, SPN_EMODEL, "empty Concat input");
      const spn_rt_val_t *v = IN(k);
      if (v->ndim != x->ndim || v->dtype != x->dtype)
        return spn_op_fail(r, SPN_EMODEL, "Concat input #%d rank/type differs", k);
      for (int d = 0; d < x->ndim; d++)
        if (d != ax && v->shape[d] != x->shape[d])
          return spn_op_fail(r, SPN_EMODEL, "Concat input #%d dim %d is %lld, expected %lld", k, d, (long long)v->shape[d], (long long)x->shape[d]);
      shape[ax] += v->shape[ax];
    }
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_SPLIT: {
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    if (ax < 0)
      return spn_op_fail(r, SPN_EMODEL, "Split axis out of range");
    int64_t parts[64];
    int np = 0;
    const spn_attr_t *sa = spn_node_attr(n, "split");
    if (has_in(n, 1)) {
      if ((rc = read_ints(r, n, 1, parts, 64, &np)))
        return rc;
    } else if (sa) {
      if (sa->n > 64)
        return spn_op_fail(r, SPN_EMODEL, "too many splits");
      np = (int)sa->n;
      memcpy(parts, sa->ints, (size_t)np * 8);
    } else {
      np = n->n_out;
      if (x->shape[ax] % np)
        return spn_op_fail(r, SPN_EMODEL, "dim %lld does not split into %d equal parts", (long long)x->shape[ax], np);
      for (int i = 0; i < np; i++)
        parts[i] = x->shape[ax] / np;
    }
    int64_t sum = 0;
    for (int i = 0; i < np; i++) {
      if (parts[i] < 0 || parts[i] > x->shape[ax])
        return spn_op_fail(r, SPN_EMODEL, "split size %lld out of range", (long long)parts[i]);
      sum += parts[i];
    }
    if (np != n->n_out || sum != x->shape[ax])
      return spn_op_fail(r, SPN_EMODEL, "split sizes do not match the dim (%lld) or the outputs (%d)", (long long)x->shape[ax], n->n_out);
    for (int o = 0; o < n->n_out; o++) {
      if (n->out[o] < 0)
        continue;
      memcpy(shape, x->shape, sizeof shape);
      shape[ax] = parts[o];
      set_out(OUT(o), x->dtype, x->ndim, shape);
    }
    return SPN_OK;
  }
  case SPN_OP_INTERLEAVE: {
    int64_t b = spn_attr_int(n, "blocksize", 1);
    for (int k = 0; k < n->n_in; k++) {
      const spn_rt_val_t *v = IN(k);
      if (v->dtype != SPN_DTYPE_F32 || v->ndim != 4 || memcmp(v->shape, x->shape, 4 * sizeof(int64_t)))
        return spn_op_fail(r, SPN_EINTERNAL, "PhaseInterleave needs float NCHW inputs of one shape");
    }
    int64_t s[4] = {x->shape[0], x->shape[1], x->shape[2] * b, x->shape[3] * b};
    set_out(y, x->dtype, 4, s);
    return SPN_OK;
  }
  case SPN_OP_D2S: {
    int64_t b = spn_attr_int(n, "blocksize", 1);
    if (x->ndim != 4 || b > 4096 || x->shape[1] % (b * b))
      return spn_op_fail(r, SPN_EMODEL, "DepthToSpace needs NCHW with C divisible by blocksize^2");
    int64_t s[4] = {x->shape[0], x->shape[1] / (b * b), x->shape[2] * b, x->shape[3] * b};
    set_out(y, x->dtype, 4, s);
    return SPN_OK;
  }
  case SPN_OP_RESIZE:
  case SPN_OP_UPSAMPLE: {
    float sc[SPN_MAXD];
    if ((rc = spn_op_infer_resize(r, n, sc, shape)))
      return rc;
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_TRANSPOSE: {
    const spn_attr_t *p = spn_node_attr(n, "perm");
    bool seen[SPN_MAXD] = {0};
    if (p && p->n != x->ndim)
      return spn_op_fail(r, SPN_EMODEL, "perm has %lld values for %d dims", (long long)p->n, x->ndim);
    for (int d = 0; d < x->ndim; d++) {
      int64_t s = p ? p->ints[d] : x->ndim - 1 - d;
      if (s < 0 || s >= x->ndim || seen[s])
        return spn_op_fail(r, SPN_EMODEL, "invalid perm");
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
          return spn_op_fail(r, SPN_EMODEL, "Reshape 0 at dim %d beyond the input rank", i);
        want[i] = x->shape[i];
      }
      if (want[i] == -1) {
        if (neg >= 0)
          return spn_op_fail(r, SPN_EMODEL, "Reshape with two -1");
        neg = i;
        continue;
      }
      if (want[i] < 0 || want[i] > (INT64_C(1) << 34))
        return spn_op_fail(r, SPN_EMODEL, "Reshape dim %lld", (long long)want[i]);
      prod = smul(prod, want[i]);
      if (prod > (INT64_C(1) << 40))
        return spn_op_fail(r, SPN_EMODEL, "Reshape too large");
    }
    if (neg >= 0) {
      if (prod == 0 || total % prod)
        return spn_op_fail(r, SPN_EMODEL, "cannot infer -1 reshaping %lld elements", (long long)total);
      want[neg] = total / prod;
      prod *= want[neg];
    }
    if (prod != total)
      return spn_op_fail(r, SPN_EMODEL, "Reshape to %lld elements from %lld", (long long)prod, (long long)total);
    set_out(y, x->dtype, cnt, want);
    return SPN_OK;
  }
  case SPN_OP_FLATTEN: {
    int64_t a = spn_attr_int(n, "axis", 1);
    if (a < 0)
      a += x->ndim;
    if (a < 0 || a > x->ndim)
      return spn_op_fail(r, SPN_EMODEL, "Flatten axis out of range");
    int64_t s[2] = {1, 1};
    for (int d = 0; d < x->ndim; d++)
      s[d < a ? 0 : 1] = smul(s[d < a ? 0 : 1], x->shape[d]);
    set_out(y, x->dtype, 2, s);
    return SPN_OK;
  }
  case SPN_OP_SQUEEZE: {
    int64_t axes[SPN_MAXD];
    int na;
    if ((rc = spn_op_axes_of(r, n, axes, &na)))
      return rc;
    bool drop[SPN_MAXD] = {0};
    for (int i = 0; i < na; i++) {
      int a = norm_axis(axes[i], x->ndim);
      if (a < 0 || x->shape[a] != 1)
        return spn_op_fail(r, SPN_EMODEL, "Squeeze axis %lld is not a dim of size 1", (long long)axes[i]);
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
    if ((rc = spn_op_axes_of(r, n, axes, &na)))
      return rc;
    int on = x->ndim + na;
    if (on > SPN_MAXD || na == 0)
      return spn_op_fail(r, SPN_EMODEL, "Unsqueeze needs axes and at most %d dims", SPN_MAXD);
    bool ins[SPN_MAXD] = {0};
    for (int i = 0; i < na; i++) {
      int a = norm_axis(axes[i], on);
      if (a < 0 || ins[a])
        return spn_op_fail(r, SPN_EMODEL, "Unsqueeze axis %lld invalid", (long long)axes[i]);
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
      return spn_op_fail(r, SPN_EMODEL, "kernel_shape has %lld values for %d spatial dims", (long long)k->n, nsp);
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
      return spn_op_fail(r, SPN_EMODEL, "GlobalAveragePool needs N,C,spatial");
    memcpy(shape, x->shape, sizeof shape);
    for (int d = 2; d < x->ndim; d++)
      shape[d] = 1;
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  case SPN_OP_PAD: {
    int64_t pads[2 * SPN_MAXD];
    float v;
    if ((rc = spn_op_pad_params(r, n, pads, &v)))
      return rc;
    for (int d = 0; d < x->ndim; d++) {
      if (pads[d] > (1 << 24) || pads[d + x->ndim] > (1 << 24) || pads[d] < -(1 << 30) || pads[d + x->ndim] < -(1 << 30))
        return spn_op_fail(r, SPN_EMODEL, "pad out of range");
      shape[d] = x->shape[d] + pads[d] + pads[d + x->ndim];
      if (shape[d] < 0)
        return spn_op_fail(r, SPN_EMODEL, "negative padded size");
      if (spn_op_pad_mode(n) != SPN_PAD_CONSTANT && (pads[d] < 0 || pads[d + x->ndim] < 0 || ((pads[d] || pads[d + x->ndim]) && x->shape[d] == 0)))
        return spn_op_fail(r, SPN_EUNSUPPORTED, "negative pads only in constant mode");
      if (spn_op_pad_mode(n) == SPN_PAD_REFLECT && (pads[d] >= x->shape[d] || pads[d + x->ndim] >= x->shape[d]))
        return spn_op_fail(r, SPN_EMODEL, "reflect pad larger than the dim");
    }
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_SLICE: {
    int64_t st[SPN_MAXD], sp[SPN_MAXD];
    if ((rc = spn_op_slice_params(r, n, st, sp, shape)))
      return rc;
    set_out(y, x->dtype, x->ndim, shape);
    return SPN_OK;
  }
  case SPN_OP_GATHER: {
    const spn_rt_val_t *ix = IN(1);
    int ax = norm_axis(spn_attr_int(n, "axis", 0), x->ndim);
    if (ax < 0 || x->ndim + ix->ndim - 1 > SPN_MAXD)
      return spn_op_fail(r, SPN_EMODEL, "Gather axis out of range");
    if (ix->dtype != SPN_DTYPE_I64 && ix->dtype != SPN_DTYPE_I32)
      return spn_op_fail(r, SPN_ETYPE, "Gather indices must be int64 or int32");
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
        return spn_op_fail(r, SPN_EMODEL, "ConstantOfShape dim %lld", (long long)shape[i]);
      tot = smul(tot, shape[i]);
      if (tot > (INT64_C(1) << 32))
        return spn_op_fail(r, SPN_ETOOBIG, "ConstantOfShape too large");
    }
    const spn_attr_t *a = spn_node_attr(n, "value");
    int32_t dt = a ? r->v[a->tval].dtype : SPN_DTYPE_F32;
    if (a && numel(&r->v[a->tval]) != 1)
      return spn_op_fail(r, SPN_EMODEL, "ConstantOfShape value must have one element");
    set_out(y, dt, cnt, shape);
    return SPN_OK;
  }
  case SPN_OP_CAST:
    set_out(y, dtype_from_onnx(spn_attr_int(n, "to", 1)), x->ndim, x->shape);
    if (x->dtype == SPN_DTYPE_INVALID || y->dtype == SPN_DTYPE_INVALID)
      return spn_op_fail(r, SPN_EUNSUPPORTED, "Cast types");
    return SPN_OK;
  case SPN_OP_MATMUL: {
    const spn_rt_val_t *b = IN(1);
    if (b->dtype != SPN_DTYPE_F32 || x->ndim < 1 || b->ndim < 1)
      return spn_op_fail(r, SPN_ETYPE, "MatMul needs float tensors with rank >= 1");
    spn_rt_val_t A = *x, B = *b;
    if (A.ndim == 1) { A.ndim = 2; A.shape[1] = A.shape[0]; A.shape[0] = 1; }
    if (B.ndim == 1) { B.ndim = 2; B.shape[1] = 1; }
    if (A.shape[A.ndim - 1] != B.shape[B.ndim - 2])
      return spn_op_fail(r, SPN_EMODEL, "MatMul inner dims %lld vs %lld", (long long)A.shape[A.ndim - 1], (long long)B.shape[B.ndim - 2]);
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
      return spn_op_fail(r, SPN_EMODEL, "Gemm needs 2-D float A and B");
    bool ta = spn_attr_int(n, "transA", 0), tb = spn_attr_int(n, "transB", 0);
    int64_t M = ta ? x->shape[1] : x->shape[0], K = ta ? x->shape[0] : x->shape[1];
    int64_t K2 = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    if (K != K2)
      return spn_op_fail(r, SPN_EMODEL, "Gemm inner dims %lld vs %lld", (long long)K, (long long)K2);
    shape[0] = M;
    shape[1] = N;
    if (has_in(n, 2)) {
      spn_rt_val_t yy = {.ndim = 2, .shape = {M, N}};
      int bnd;
      int64_t bs[SPN_MAXD];
      if (IN(2)->dtype != SPN_DTYPE_F32 || (rc = bcast_shape(r, &yy, IN(2), &bnd, bs)) || bnd != 2 || bs[0] != M || bs[1] != N)
        return rc ? rc : spn_op_fail(r, SPN_EMODEL, "Gemm C does not broadcast to (M, N)");
    }
    set_out(y, SPN_DTYPE_F32, 2, shape);
    return SPN_OK;
  }
  case SPN_OP_REDUCEMEAN: {
    int64_t axes[SPN_MAXD];
    int na;
    if ((rc = spn_op_axes_of(r, n, axes, &na)))
      return rc;
    bool red[SPN_MAXD] = {0};
    for (int i = 0; i < na; i++) {
      int a = norm_axis(axes[i], x->ndim);
      if (a < 0)
        return spn_op_fail(r, SPN_EMODEL, "ReduceMean axis out of range");
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
    return spn_op_fail(r, SPN_EUNSUPPORTED, "no shape function");
  }
}

