/* graph.c — graph validation, passes, memory planning and the run loop.
 *
 * At load: check every value is defined (no dangling names), sort nodes
 * topologically (a cycle is an error naming a node on it), fold constants,
 * fold BatchNormalization into the Conv before it, fuse activations and
 * residual adds into Conv/ConvTranspose as post-ops, drop dead nodes, and
 * mark the "shape class" nodes (Shape and everything computed only from
 * shapes and constants), which each run evaluates during shape inference.
 *
 * Per run: bind inputs, infer every shape (computing shape-class values on
 * the way), take the memory plan of these input shapes (built by their
 * first run: one arena per backend planned by value lifetimes in arena.c,
 * views sharing their input's bytes, each backend's scratch after its
 * values) and its arenas, then execute.
 */
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine-internal.h"

/* Folded constants and shape-class values are small in real models; a
 * bigger one is a hostile file trying to make loading allocate. */
#define SPN_HOST_VALUE_MAX (256 << 20)
/* Size given to dynamic non-batch dims when probing shapes at load. */
#define SPN_PROBE_DIM 64

static int32_t topo_sort(spn_model_t *m, spn_error_t *err) {
  int n = m->n_node;
  int *indeg = calloc((size_t)n + 1, sizeof(int));
  int *order = calloc((size_t)n + 1, sizeof(int));
  int *queue = calloc((size_t)n + 1, sizeof(int));
  int32_t rc = SPN_OK;
  if (!indeg || !order || !queue) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    spn_node_t *nd = &m->nodes[i];
    for (int k = 0; k < nd->n_in; k++) {
      int vi = nd->in[k];
      if (vi < 0)
        continue;
      spn_value_t *v = &m->vals[vi];
      if (v->kind == SPN_VAL_INTER && v->producer < 0) {
        rc = spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): input '%s' is not a graph input, an initializer or any node's output", m->path, nd->name, nd->op_name, v->name);
        goto out;
      }
      if (v->producer >= 0)
        indeg[i]++;
    }
  }
  int qh = 0, qt = 0, cnt = 0;
  for (int i = 0; i < n; i++)
    if (!indeg[i])
      queue[qt++] = i;
  while (qh < qt) {
    int i = queue[qh++];
    order[cnt++] = i;
    spn_node_t *nd = &m->nodes[i];
    for (int o = 0; o < nd->n_out; o++) {
      int vi = nd->out[o];
      if (vi < 0)
        continue;
      for (int j = 0; j < n; j++) {
        spn_node_t *c = &m->nodes[j];
        for (int k = 0; k < c->n_in; k++)
          if (c->in[k] == vi && --indeg[j] == 0)
            queue[qt++] = j;
      }
    }
  }
  if (cnt < n) {
    for (int i = 0; i < n; i++)
      if (indeg[i]) {
        rc = spn_error_set(err, SPN_EMODEL, "%s: the graph has a cycle through node '%s' (%s)", m->path, m->nodes[i].name, m->nodes[i].op_name);
        goto out;
      }
  }
  spn_node_t *sorted = calloc((size_t)n + 1, sizeof(spn_node_t));
  if (!sorted) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++)
    sorted[i] = m->nodes[order[i]];
  free(m->nodes);
  m->nodes = sorted;
  m->cap_node = n + 1;
  for (int i = 0; i < n; i++)
    for (int o = 0; o < m->nodes[i].n_out; o++)
      if (m->nodes[i].out[o] >= 0)
        m->vals[m->nodes[i].out[o]].producer = i;
out:
  free(indeg);
  free(order);
  free(queue);
  return rc;
}

static void count_uses(spn_model_t *m) {
  for (int i = 0; i < m->n_val; i++) {
    m->vals[i].n_uses = 0;
    m->vals[i].last_use = -1;
  }
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *n = &m->nodes[i];
    if (n->dead)
      continue;
    for (int k = 0; k < n->n_in + n->n_post; k++) {
      int vi = spn_node_operand(n, k);
      if (vi >= 0) {
        m->vals[vi].n_uses++;
        m->vals[vi].last_use = i;
      }
    }
  }
}

/* A 2-D convolution run by the CPU backend (oneDNN's channels-last path). */
static bool is_conv2d(const spn_model_t *m, const spn_node_t *n) {
  return !n->dead && n->backend == SPN_BACKEND_CPU && (n->op == SPN_OP_CONV || n->op == SPN_OP_CONVT) &&
         m->vals[n->in[1]].ndim == 4;
}

/* A node that reads and writes either layout (the CPU's PhaseInterleave). */
static bool layout_free(const spn_node_t *n) {
  return !n->dead && n->backend == SPN_BACKEND_CPU && n->op == SPN_OP_INTERLEAVE;
}

/* Values produced by a 2-D convolution (or a channel Concat of such values,
 * or a PhaseInterleave) and read only as the data input or residual addend
 * of other 2-D convolutions, or by such a Concat or a PhaseInterleave, stay
 * channels-last: no reorders between them. Concat nodes start optimistic and
 * drop out until nothing changes. */
static bool concat_candidate(const spn_model_t *m, const spn_node_t *n) {
  if (n->dead || n->op != SPN_OP_CONCAT || n->n_out != 1 || n->backend != SPN_BACKEND_CPU)
    return false;
  int64_t ax = spn_attr_int(n, "axis", 0);
  if (ax != 1 && ax != -3)
    return false;
  for (int k = 0; k < n->n_in; k++) {
    int vi = n->in[k];
    if (vi < 0 || m->vals[vi].producer < 0)
      return false;
    const spn_node_t *p = &m->nodes[m->vals[vi].producer];
    if (!is_conv2d(m, p) && !layout_free(p) && !concat_candidate(m, p))
      return false;
  }
  return true;
}

static void mark_nhwc(spn_model_t *m) {
  bool *cc = calloc((size_t)m->n_node + 1, sizeof(bool));
  if (!cc)
    return;
  for (int i = 0; i < m->n_node; i++)
    cc[i] = concat_candidate(m, &m->nodes[i]);
  for (int iter = 0; iter < 64; iter++) {
    bool changed = false;
    for (int vi = 0; vi < m->n_val; vi++) {
      spn_value_t *v = &m->vals[vi];
      bool ok = v->kind == SPN_VAL_INTER && !v->is_output && v->producer >= 0 && v->n_uses >= 1 &&
                (is_conv2d(m, &m->nodes[v->producer]) || cc[v->producer] || layout_free(&m->nodes[v->producer]));
      for (int i = 0; i < m->n_node && ok; i++) {
        const spn_node_t *n = &m->nodes[i];
        if (n->dead)
          continue;
        for (int k = 0; k < n->n_in && ok; k++)
          if (n->in[k] == vi && !((k == 0 && is_conv2d(m, n)) || cc[i] || layout_free(n)))
            ok = false;
        for (int p = 0; p < n->n_post && ok; p++)
          if (n->post[p].kind == SPN_POST_ADD && n->post[p].val == vi && !is_conv2d(m, n))
            ok = false;
      }
      v->nhwc = ok;
    }
    for (int i = 0; i < m->n_node; i++)
      if (cc[i] && !m->vals[m->nodes[i].out[0]].nhwc) {
        cc[i] = false;
        changed = true;
      }
    if (!changed)
      break;
  }
  free(cc);
}

static bool is_const(const spn_model_t *m, int vi) {
  return vi < 0 || m->vals[vi].kind == SPN_VAL_CONST;
}

/* Per-run value table with constants and (for folding) nothing else bound. */
static spn_rt_val_t *rt_new(const spn_model_t *m) {
  spn_rt_val_t *v = calloc((size_t)m->n_val + 1, sizeof *v);
  if (!v)
    return NULL;
  for (int i = 0; i < m->n_val; i++) {
    const spn_value_t *mv = &m->vals[i];
    if (mv->kind == SPN_VAL_CONST) {
      v[i].dtype = mv->dtype;
      v[i].ndim = mv->ndim;
      memcpy(v[i].shape, mv->shape, sizeof v[i].shape);
      v[i].data = mv->data;
      v[i].ext = true;
    }
  }
  return v;
}

/* Bytes of a value; saturates at SPN_VALUE_MAX + 1 so hostile shapes cannot
 * wrap around into a small allocation. */
#define SPN_VALUE_MAX (INT64_C(1) << 38)
static size_t rt_bytes(const spn_rt_val_t *v) {
  uint64_t n = spn_dtype_size(v->dtype);
  for (int i = 0; i < v->ndim; i++) {
    uint64_t d = v->shape[i] < 0 ? 0 : (uint64_t)v->shape[i];
    if (d && n > (uint64_t)SPN_VALUE_MAX / d)
      return (size_t)SPN_VALUE_MAX + 1;
    n *= d;
  }
  return (size_t)n;
}

static void rt_free(const spn_model_t *m, spn_rt_val_t *v) {
  if (!v)
    return;
  for (int i = 0; i < m->n_val; i++)
    if (v[i].host_owned && !v[i].ext)
      free(v[i].data);
  free(v);
}

/* Infer and execute node `n` with every output malloc'd (host_owned). */
static int32_t run_host(spn_run_t *r, const spn_node_t *n) {
  int32_t rc = spn_op_infer(r, n);
  if (rc)
    return rc;
  for (int o = 0; o < n->n_out; o++) {
    if (n->out[o] < 0)
      continue;
    spn_rt_val_t *ov = &r->v[n->out[o]];
    ov->bytes = rt_bytes(ov);
    if (ov->bytes > SPN_HOST_VALUE_MAX)
      return spn_error_set(r->err, SPN_ETOOBIG, "constant or shape value of %zu bytes (limit %d MiB)", ov->bytes, SPN_HOST_VALUE_MAX >> 20);
    ov->data = spn_aligned_alloc(ov->bytes);
    if (!ov->data)
      return spn_error_set(r->err, SPN_ENOMEM, "out of memory");
    ov->host_owned = true;
  }
  return spn_cpu_exec(r, n);
}

/* Evaluate every node whose inputs are all constants once, at load. */
/* Fold every node whose inputs are all constants into constant values.
 * weight_sources: fold only Identity and Constant nodes (checked first),
 * before the other nodes are checked, so that a weight reaching Conv through
 * an Identity of an initializer (as PyTorch exports deduplicated weights) or
 * from a Constant node is an initializer by the time Conv's rules look at it. */
static int32_t fold_constants(spn_model_t *m, bool weight_sources, spn_error_t *err) {
  spn_rt_val_t *rv = rt_new(m);
  if (!rv)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  spn_run_t r = {.m = m, .v = rv, .err = err, .threads = 1};
  int32_t rc = SPN_OK;
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *n = &m->nodes[i];
    bool all = true;
    for (int k = 0; k < n->n_in; k++)
      all = all && is_const(m, n->in[k]);
    if (!all || n->dead)
      continue;
    if (weight_sources) {
      if (n->op != SPN_OP_IDENTITY && n->op != SPN_OP_CONSTANT)
        continue;
      if ((rc = spn_op_check(m, n, err)))
        goto out;
    }
    if ((rc = run_host(&r, n))) {
      spn_error_prefix(err, "%s: folding constant node '%s' (%s)", m->path, n->name, n->op_name);
      goto out;
    }
    for (int o = 0; o < n->n_out; o++) {
      int vi = n->out[o];
      if (vi < 0)
        continue;
      spn_value_t *v = &m->vals[vi];
      v->kind = SPN_VAL_CONST;
      v->dtype = rv[vi].dtype;
      v->ndim = rv[vi].ndim;
      memcpy(v->shape, rv[vi].shape, sizeof v->shape);
      v->data = rv[vi].data;
      v->producer = -1;
      rv[vi].host_owned = false;
      rv[vi].ext = true;
    }
    n->dead = true;
  }
out:
  spn_dnnl_run_end(&r);
  spn_pool_give(m, SPN_BACKEND_CPU, r.scratch, r.scratch_n, r.scratch_h);
  rt_free(m, rv);
  return rc;
}

/* The only consumer of value vi, or -1 (graph outputs count as a use). */
static int sole_consumer(const spn_model_t *m, int vi) {
  if (m->vals[vi].is_output)
    return -1;
  int found = -1;
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead)
      continue;
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] == vi) {
        if (found >= 0 && found != i)
          return -1;
        if (found == i)
          return -1; /* used twice by one node */
        found = i;
      }
    for (int p = 0; p < n->n_post; p++)
      if ((n->post[p].kind == SPN_POST_ADD || n->post[p].kind == SPN_POST_PRELU) && n->post[p].val == vi)
        return -1;
  }
  return found;
}

static int new_const(spn_model_t *m, const char *base, const char *suffix, int ndim,
                     const int64_t *shape, spn_error_t *err) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", base, suffix);
  int vi = spn_model_add_value(m, name, err);
  if (vi < 0)
    return -1;
  spn_value_t *v = &m->vals[vi];
  v->kind = SPN_VAL_CONST;
  v->dtype = SPN_DTYPE_F32;
  v->ndim = ndim;
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++)
    numel *= (v->shape[i] = shape[i]);
  v->data = spn_aligned_alloc((size_t)numel * sizeof(float));
  if (!v->data) {
    spn_error_set(err, SPN_ENOMEM, "out of memory");
    return -1;
  }
  return vi;
}

/* A Conv/ConvTranspose node's weight and bias inputs become nw and nb
 * (a bias input added where it had none). */
static int32_t set_weights(spn_node_t *c, int nw, int nb, spn_error_t *err) {
  if (c->n_in < 3) {
    int *ni = realloc(c->in, 3 * sizeof(int));
    if (!ni)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    c->in = ni;
    c->n_in = 3;
  }
  c->in[1] = nw;
  c->in[2] = nb;
  return SPN_OK;
}

/* Conv -> BatchNormalization with constant parameters becomes one Conv. */
static int32_t fold_batchnorm(spn_model_t *m, spn_error_t *err) {
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *c = &m->nodes[i];
    if (c->dead || (c->op != SPN_OP_CONV && c->op != SPN_OP_CONVT) || c->n_post || c->n_out != 1)
      continue;
    int j = sole_consumer(m, c->out[0]);
    if (j < 0)
      continue;
    spn_node_t *b = &m->nodes[j];
    if (b->op != SPN_OP_BN || b->n_in < 5 || b->in[0] != c->out[0] || b->n_out < 1)
      continue;
    bool ok = is_const(m, c->in[1]) && (c->n_in < 3 || is_const(m, c->in[2]));
    for (int k = 1; k < 5; k++)
      ok = ok && b->in[k] >= 0 && is_const(m, b->in[k]);
    if (!ok)
      continue;
    spn_value_t *w = &m->vals[c->in[1]];
    if (w->dtype != SPN_DTYPE_F32 || w->ndim < 3)
      continue;
    bool tr = c->op == SPN_OP_CONVT;
    int64_t grp = spn_attr_int(c, "group", 1);
    if (grp < 1 || w->shape[0] % grp)
      continue;
    /* Conv weights are [OC, IC/g, k...]; ConvTranspose [IC, OC/g, k...]. */
    int64_t oc = tr ? w->shape[1] * grp : w->shape[0], per = 1;
    for (int d = tr ? 2 : 1; d < w->ndim; d++)
      per *= w->shape[d];
    bool shapes_ok = true;
    for (int k = 1; k < 5; k++) {
      spn_value_t *p = &m->vals[b->in[k]];
      shapes_ok = shapes_ok && p->dtype == SPN_DTYPE_F32 && p->ndim == 1 && p->shape[0] == oc;
    }
    if (c->n_in >= 3 && c->in[2] >= 0) {
      spn_value_t *bb = &m->vals[c->in[2]];
      shapes_ok = shapes_ok && bb->dtype == SPN_DTYPE_F32 && bb->ndim == 1 && bb->shape[0] == oc;
    }
    if (!shapes_ok)
      continue;
    float eps = spn_attr_float(b, "epsilon", 1e-5f);
    int nw = new_const(m, c->name, "/bnfold_w", w->ndim, w->shape, err);
    if (nw < 0)
      return err ? err->code : SPN_ENOMEM;
    int64_t bshape[1] = {oc};
    int nb = new_const(m, c->name, "/bnfold_b", 1, bshape, err);
    if (nb < 0)
      return err ? err->code : SPN_ENOMEM;
    w = &m->vals[c->in[1]]; /* the table may have moved */
    const float *W = w->data;
    const float *B0 = (c->n_in >= 3 && c->in[2] >= 0) ? m->vals[c->in[2]].data : NULL;
    const float *gamma = m->vals[b->in[1]].data, *beta = m->vals[b->in[2]].data;
    const float *mean = m->vals[b->in[3]].data, *var = m->vals[b->in[4]].data;
    float *NW = m->vals[nw].data, *NB = m->vals[nb].data;
    for (int64_t o = 0; o < oc; o++) {
      float s = gamma[o] / sqrtf(var[o] + eps);
      NB[o] = ((B0 ? B0[o] : 0.f) - mean[o]) * s + beta[o];
      if (!tr)
        for (int64_t q = 0; q < per; q++)
          NW[o * per + q] = W[o * per + q] * s;
    }
    if (tr) {
      int64_t ic = w->shape[0], ocg = w->shape[1], icg = ic / grp;
      for (int64_t ii = 0; ii < ic; ii++)
        for (int64_t jj = 0; jj < ocg; jj++) {
          int64_t o = (ii / icg) * ocg + jj;
          float s = gamma[o] / sqrtf(var[o] + eps);
          for (int64_t q = 0; q < per; q++)
            NW[(ii * ocg + jj) * per + q] = W[(ii * ocg + jj) * per + q] * s;
        }
    }
    int32_t rc = set_weights(c, nw, nb, err);
    if (rc)
      return rc;
    m->vals[c->out[0]].producer = -1;
    c->out[0] = b->out[0];
    m->vals[c->out[0]].producer = i;
    b->dead = true;
  }
  return SPN_OK;
}

/* ---- ConvTranspose as sub-pixel convolution (CPU models) ---- */

/* A strided transposed convolution computes each output phase (the pixels
 * whose coordinates are r mod s, per dimension) as a small correlation of
 * the input: output o = s*q + r takes x[q + d_r - m] * w[c_r + s*m] for
 * m = 0, 1, ... while the tap c_r + s*m is inside the kernel, where
 * c_r = (r + pad_begin) mod s and d_r = (r + pad_begin) div s. oneDNN 2.6's
 * jit deconvolution on AVX-512 runs Wav2Lip's stride-2 decoder layers at a
 * fraction of its convolution speed (58% of a batch-8 run on the CPU; ONNX
 * Runtime spends 24% there), so on a CPU model each such layer becomes
 * convolutions, in one of two forms:
 * - phases (where every phase has a tap and needs no negative padding): a
 *   Conv per phase with that phase's taps only, then a PhaseInterleave that
 *   writes the s*s results into the output, channels-last on both sides
 *   when convolutions surround it. The multiply-adds are the layer's own.
 * - window (otherwise, or SPINDLE_SUBPIXEL=window): one Conv with s*s*C_out
 *   output channels (phase-major, the taps a phase does not use zero) over
 *   the common window of offsets, then DepthToSpace (DCR): up to 16/9 of
 *   the multiply-adds for 3x3 stride 2, and the shuffle reads NCHW.
 * Wav2Lip on 2 cores, phases against window: 20 against 24 ms at batch 1,
 * 535 against 650 ms at batch 32 (docs/engine.md, "Performance"). */
typedef struct subpix_dim {
  int64_t s, k, pb, pe, op;
  int64_t lo, win, cpb, cpe; /* window offsets lo..lo+win-1; the Conv's pads */
} subpix_dim_t;

/* The window and pads for one spatial dimension; false where the rewrite
 * does not apply (an output length that is not a multiple of s, or a
 * window the Conv could only reach with negative padding). */
static bool subpix_dim(subpix_dim_t *d) {
  if (d->s < 2 || d->k < 1 || d->pb < 0 || d->pe < 0 || d->op < 0 || (d->k + d->op - d->pb - d->pe) % d->s)
    return false;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t r = 0; r < d->s; r++) {
    int64_t c = (r + d->pb) % d->s, dr = (r + d->pb) / d->s, taps = (d->k - c + d->s - 1) / d->s;
    if (taps <= 0)
      continue;
    if (dr - (taps - 1) < lo)
      lo = dr - (taps - 1);
    if (dr > hi)
      hi = dr;
  }
  if (lo > hi)
    return false;
  d->lo = lo;
  d->win = hi - lo + 1;
  d->cpb = -lo;
  /* output phases per dimension: Q = in + E, E = (k + op - pb - pe)/s - 1;
   * a Conv's output is in + cpb + cpe - win + 1 */
  d->cpe = (d->k + d->op - d->pb - d->pe) / d->s - 1 + d->win - 1 - d->cpb;
  return d->cpb >= 0 && d->cpe >= 0;
}

/* The ConvTranspose weight tap a window position takes for phase r, or -1
 * (a zero). */
static int64_t subpix_tap(const subpix_dim_t *d, int64_t r, int64_t a) {
  int64_t c = (r + d->pb) % d->s, dr = (r + d->pb) / d->s, taps = (d->k - c + d->s - 1) / d->s;
  int64_t mm = dr - (a + d->lo);
  return mm >= 0 && mm < taps ? c + d->s * mm : -1;
}

static int64_t attr_ints_at(const spn_node_t *n, const char *name, int i, int64_t def, int want_n, bool *ok) {
  const spn_attr_t *a = spn_node_attr(n, name);
  if (!a)
    return def;
  if (a->type != SPN_ATTR_IS || a->n != want_n) {
    *ok = false;
    return def;
  }
  return a->ints[i];
}

static int32_t set_conv_attrs(spn_node_t *c, const subpix_dim_t d[2]) {
  spn_node_attrs_free(c);
  c->attrs = calloc(4, sizeof *c->attrs);
  if (!c->attrs)
    return SPN_ENOMEM;
  const char *names[] = {"kernel_shape", "pads", "strides", "dilations"};
  int64_t vals[4][4] = {{d[0].win, d[1].win}, {d[0].cpb, d[1].cpb, d[0].cpe, d[1].cpe}, {1, 1}, {1, 1}};
  for (int a = 0; a < 4; a++) {
    spn_attr_t *at = &c->attrs[c->n_attr++];
    at->type = SPN_ATTR_IS;
    at->n = a == 1 ? 4 : 2;
    at->name = strdup(names[a]);
    at->ints = malloc((size_t)at->n * sizeof(int64_t));
    at->tval = -1;
    if (!at->name || !at->ints)
      return SPN_ENOMEM;
    memcpy(at->ints, vals[a], (size_t)at->n * sizeof(int64_t));
  }
  return SPN_OK;
}

/* Node c (the ConvTranspose itself, or a Conv new_node made) as a Conv over
 * window d with weights nw and bias nb (-1: none). */
static int32_t as_conv(spn_node_t *c, const subpix_dim_t d[2], int nw, int nb, spn_error_t *err) {
  if (c->op != SPN_OP_CONV) {
    free(c->op_name);
    if (!(c->op_name = strdup("Conv")))
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    c->op = SPN_OP_CONV;
  }
  if (set_conv_attrs(c, d))
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  return set_weights(c, nw, nb, err);
}

/* One output phase r of a dimension on its own: its taps only (pd->win),
 * its window and Conv pads; false where the phase has no tap or would need
 * negative padding. */
static bool subpix_phase(const subpix_dim_t *d, int64_t r, subpix_dim_t *pd) {
  int64_t c = (r + d->pb) % d->s, dr = (r + d->pb) / d->s, taps = (d->k - c + d->s - 1) / d->s;
  if (taps <= 0)
    return false;
  *pd = *d;
  pd->lo = dr - (taps - 1);
  pd->win = taps;
  pd->cpb = -pd->lo;
  pd->cpe = (d->k + d->op - d->pb - d->pe) / d->s - 1 + taps - 1 - pd->cpb;
  return pd->cpb >= 0 && pd->cpe >= 0;
}

/* A new node at index `at` (the nodes from there move up one, and the
 * producer indices with them): op, name "<base><suffix>", n_in inputs and
 * one output, all -1; attributes are the caller's. NULL when out of memory
 * (what was made is freed with the model). */
static spn_node_t *new_node(spn_model_t *m, int at, int op, const char *base, const char *suffix, int n_in,
                            int backend, spn_error_t *err) {
  if (m->n_node == m->cap_node) {
    int cap = m->cap_node ? m->cap_node * 2 : 16;
    spn_node_t *nn = realloc(m->nodes, (size_t)cap * sizeof *nn);
    if (!nn) {
      spn_error_set(err, SPN_ENOMEM, "out of memory");
      return NULL;
    }
    m->nodes = nn;
    m->cap_node = cap;
  }
  memmove(&m->nodes[at + 1], &m->nodes[at], (size_t)(m->n_node - at) * sizeof *m->nodes);
  m->n_node++;
  for (int v = 0; v < m->n_val; v++)
    if (m->vals[v].producer >= at)
      m->vals[v].producer++;
  spn_node_t *n = &m->nodes[at];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->backend = backend;
  char name[512];
  snprintf(name, sizeof name, "%s%s", base, suffix);
  n->name = strdup(name);
  n->op_name = strdup(spn_op_names[op]);
  n->in = malloc((size_t)n_in * sizeof(int));
  n->out = malloc(sizeof(int));
  if (!n->name || !n->op_name || !n->in || !n->out) {
    spn_error_set(err, SPN_ENOMEM, "out of memory");
    return NULL;
  }
  n->n_in = n_in;
  n->n_out = 1;
  for (int k = 0; k < n_in; k++)
    n->in[k] = -1;
  n->out[0] = -1;
  if (pthread_mutex_init(&n->lock, NULL)) {
    spn_error_set(err, SPN_EINTERNAL, "mutex init failed");
    return NULL;
  }
  n->lock_init = true;
  return n;
}

/* An integer attribute for a node new_node made (its first n_attr slots). */
static bool add_int_attr(spn_node_t *n, const char *name, int64_t v) {
  spn_attr_t *na = realloc(n->attrs, (size_t)(n->n_attr + 1) * sizeof *na);
  if (!na)
    return false;
  n->attrs = na;
  spn_attr_t *at = &na[n->n_attr];
  memset(at, 0, sizeof *at);
  at->type = SPN_ATTR_I;
  at->i = v;
  at->tval = -1;
  if (!(at->name = strdup(name)))
    return false;
  n->n_attr++;
  return true;
}

/* An intermediate float value named "<base><suffix>" produced by node p. */
static int new_inter(spn_model_t *m, const char *base, const char *suffix, int p, spn_error_t *err) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", base, suffix);
  int vi = spn_model_add_value(m, name, err);
  if (vi >= 0) {
    m->vals[vi].kind = SPN_VAL_INTER;
    m->vals[vi].dtype = SPN_DTYPE_F32;
    m->vals[vi].producer = p;
  }
  return vi;
}

/* The ConvTranspose node i as s*s Convs, one per output phase, each with
 * its own taps only (9/9 of the multiply-adds for 3x3 stride 2) and the
 * layer's bias, and a PhaseInterleave that writes them into the output
 * (channels-last in and out when the neighbours are convolutions): s*s
 * nodes added after node i. */
static int32_t convt_phases(spn_model_t *m, int i, const subpix_dim_t d[2], const subpix_dim_t ph[2][8],
                            spn_error_t *err) {
  const spn_node_t *c = &m->nodes[i];
  const spn_value_t *w = &m->vals[c->in[1]];
  int64_t s = d[0].s, ci = w->shape[0], co = w->shape[1], kh = d[0].k, kw = d[1].k;
  char base[440];
  snprintf(base, sizeof base, "%s", c->name);
  /* every phase adds the layer's own bias ([C_out], as a Conv's) */
  int x = c->in[0], y = c->out[0], wv = c->in[1], nb = c->n_in >= 3 ? c->in[2] : -1;
  int backend = c->backend, n_post = c->n_post;
  spn_post_t post[SPN_MAX_POST];
  memcpy(post, c->post, sizeof post);
  spn_node_t *il = new_node(m, i + 1, SPN_OP_INTERLEAVE, base, "/phase_interleave", (int)(s * s), backend, err);
  if (!il || !add_int_attr(il, "blocksize", s))
    return err && err->code ? err->code : SPN_ENOMEM;
  il->out[0] = y;
  m->vals[y].producer = i + 1;
  for (int64_t r = 0; r < s * s; r++) {
    const subpix_dim_t *py = &ph[0][r / s], *px = &ph[1][r % s];
    int64_t wsh[4] = {co, ci, py->win, px->win};
    char suf[64];
    snprintf(suf, sizeof suf, "/phase%" PRId64 "_w", r);
    int nw = new_const(m, base, suf, 4, wsh, err);
    if (nw < 0)
      return err ? err->code : SPN_ENOMEM;
    const float *W = m->vals[wv].data; /* the value table may have moved */
    float *NW = m->vals[nw].data;
    for (int64_t o = 0; o < co; o++)
      for (int64_t q = 0; q < ci; q++)
        for (int64_t a = 0; a < py->win; a++)
          for (int64_t b = 0; b < px->win; b++)
            NW[((o * ci + q) * py->win + a) * px->win + b] =
                W[((q * co + o) * kh + subpix_tap(py, r / s, a)) * kw + subpix_tap(px, r % s, b)];
    /* phase 0 is node i itself; the others go before the interleave */
    int at = (int)(i + r);
    spn_node_t *pc = &m->nodes[i];
    if (r > 0) {
      snprintf(suf, sizeof suf, "/phase%" PRId64, r);
      if (!(pc = new_node(m, at, SPN_OP_CONV, base, suf, 3, backend, err)))
        return err && err->code ? err->code : SPN_ENOMEM;
      pc->in[0] = x;
      pc->n_post = n_post;
      memcpy(pc->post, post, sizeof post);
    }
    subpix_dim_t pd[2] = {*py, *px};
    int32_t rc = as_conv(pc, pd, nw, nb, err);
    if (rc)
      return rc;
    snprintf(suf, sizeof suf, "/phase%" PRId64 "_out", r);
    int t = new_inter(m, base, suf, at, err);
    if (t < 0)
      return err ? err->code : SPN_ENOMEM;
    m->nodes[at].out[0] = t;
    il = &m->nodes[i + r + 1];
    il->in[r] = t;
  }
  for (int k = 0; k <= s * s; k++) {
    int32_t rc = spn_op_check(m, &m->nodes[i + k], err);
    if (rc)
      return rc;
  }
  return SPN_OK;
}

/* The ConvTranspose node i as one Conv over the common window of every
 * phase's offsets, s*s*C_out output channels (phase-major, the taps a phase
 * does not use zero), then a DepthToSpace (DCR) after it. */
static int32_t convt_window(spn_model_t *m, int i, const subpix_dim_t d[2], spn_error_t *err) {
  spn_node_t *c = &m->nodes[i];
  const spn_value_t *w = &m->vals[c->in[1]];
  int64_t s = d[0].s, ci = w->shape[0], co = w->shape[1], kh = d[0].k, kw = d[1].k;
  int64_t oc = s * s * co, wsh[4] = {oc, ci, d[0].win, d[1].win}, bsh[1] = {oc};
  char base[440];
  snprintf(base, sizeof base, "%s", c->name);
  int nw = new_const(m, base, "/subpixel_w", 4, wsh, err);
  int nb = nw < 0 ? -1 : new_const(m, base, "/subpixel_b", 1, bsh, err);
  int nt = nb < 0 ? -1 : new_inter(m, base, "/subpixel", i, err);
  if (nt < 0)
    return err ? err->code : SPN_ENOMEM;
  c = &m->nodes[i];
  w = &m->vals[c->in[1]]; /* the value table may have moved */
  const float *W = w->data, *B = c->n_in >= 3 && c->in[2] >= 0 ? m->vals[c->in[2]].data : NULL;
  float *NW = m->vals[nw].data, *NB = m->vals[nb].data;
  memset(NW, 0, (size_t)(oc * ci * d[0].win * d[1].win) * sizeof(float));
  for (int64_t ry = 0; ry < s; ry++)
    for (int64_t rx = 0; rx < s; rx++)
      for (int64_t o = 0; o < co; o++) {
        int64_t oo = (ry * s + rx) * co + o;
        NB[oo] = B ? B[o] : 0.f;
        for (int64_t a = 0; a < d[0].win; a++) {
          int64_t ty = subpix_tap(&d[0], ry, a);
          for (int64_t b = 0; ty >= 0 && b < d[1].win; b++) {
            int64_t tx = subpix_tap(&d[1], rx, b);
            if (tx < 0)
              continue;
            for (int64_t q = 0; q < ci; q++)
              NW[((oo * ci + q) * d[0].win + a) * d[1].win + b] = W[((q * co + o) * kh + ty) * kw + tx];
          }
        }
      }
  /* the DepthToSpace right after it (mode DCR, the default) */
  spn_node_t *ds = new_node(m, i + 1, SPN_OP_D2S, base, "/depth_to_space", 1, c->backend, err);
  if (!ds || !add_int_attr(ds, "blocksize", s))
    return err && err->code ? err->code : SPN_ENOMEM;
  c = &m->nodes[i];
  ds->in[0] = nt;
  ds->out[0] = c->out[0];
  m->vals[ds->out[0]].producer = i + 1;
  /* the node itself becomes the Conv */
  int32_t rc = as_conv(c, d, nw, nb, err);
  if (rc)
    return rc;
  c->out[0] = nt;
  if ((rc = spn_op_check(m, c, err)) || (rc = spn_op_check(m, &m->nodes[i + 1], err)))
    return rc;
  return SPN_OK;
}

static int32_t convt_subpixel(spn_model_t *m, spn_error_t *err) {
  /* SPINDLE_SUBPIXEL=window: the one-Conv form everywhere, for comparison */
  const char *mode = getenv("SPINDLE_SUBPIXEL");
  bool window_only = mode && !strcmp(mode, "window");
  int n0 = m->n_node;
  for (int i = 0; i < n0; i++) {
    spn_node_t *c = &m->nodes[i];
    if (c->dead || c->op != SPN_OP_CONVT || c->n_out != 1 || c->n_in < 2 || !is_const(m, c->in[1]) ||
        (c->n_in >= 3 && !is_const(m, c->in[2])) || c->n_in > 3)
      continue;
    bool ok = true;
    for (int p = 0; p < c->n_post; p++) /* activations commute with the pixel shuffle; an addend would not */
      ok = ok && c->post[p].kind != SPN_POST_ADD && c->post[p].kind != SPN_POST_PRELU;
    const spn_value_t *w = &m->vals[c->in[1]];
    if (!ok || w->dtype != SPN_DTYPE_F32 || w->ndim != 4 || spn_attr_int(c, "group", 1) != 1 ||
        strcmp(spn_attr_str(c, "auto_pad", "NOTSET"), "NOTSET") || spn_node_attr(c, "output_shape"))
      continue;
    subpix_dim_t d[2];
    for (int a = 0; a < 2; a++) {
      d[a] = (subpix_dim_t){.s = attr_ints_at(c, "strides", a, 1, 2, &ok), .k = w->shape[2 + a],
                            .pb = attr_ints_at(c, "pads", a, 0, 4, &ok), .pe = attr_ints_at(c, "pads", a + 2, 0, 4, &ok),
                            .op = attr_ints_at(c, "output_padding", a, 0, 2, &ok)};
      ok = ok && attr_ints_at(c, "dilations", a, 1, 2, &ok) == 1 &&
           attr_ints_at(c, "kernel_shape", a, d[a].k, 2, &ok) == d[a].k && subpix_dim(&d[a]);
    }
    if (!ok || d[0].s != d[1].s)
      continue;
    /* Each phase a Conv of its own taps where every phase has taps and
     * non-negative pads; otherwise one Conv over the common window. */
    subpix_dim_t ph[2][8];
    bool phased = d[0].s <= 8 && !window_only;
    for (int a = 0; a < 2 && phased; a++)
      for (int64_t r = 0; r < d[a].s && phased; r++)
        phased = subpix_phase(&d[a], r, &ph[a][r]);
    if (phased) {
      int32_t rc = convt_phases(m, i, d, ph, err);
      if (rc)
        return rc;
      n0 += (int)(d[0].s * d[0].s);
      i += (int)(d[0].s * d[0].s); /* past the interleave */
      continue;
    }
    int32_t rc = convt_window(m, i, d, err);
    if (rc)
      return rc;
    n0++;
    i++; /* past the DepthToSpace */
  }
  return SPN_OK;
}

/* Same rank and dims at both probes: a residual add can be a post-op only
 * when its addend is exactly the conv output's shape (a broadcast addend,
 * e.g. (N,C,1,1), must stay a separate Add). */
static bool same_probed_shape(const spn_rt_val_t *pa, const spn_rt_val_t *pb, int x, int y) {
  if (!pa || !pb)
    return false;
  for (int t = 0; t < 2; t++) {
    const spn_rt_val_t *v = t ? pb : pa;
    if (v[x].ndim != v[y].ndim || v[x].ndim < 0)
      return false;
    for (int d = 0; d < v[x].ndim; d++)
      if (v[x].shape[d] != v[y].shape[d])
        return false;
  }
  return true;
}

/* Activations and residual adds following a Conv/ConvTranspose become
 * post-ops of it. pa/pb are the values' shapes at two probe sizes (NULL
 * when they could not be inferred: then no add is fused). With `scale`, a
 * Mul by a one-element f32 constant does too (SPN_POST_SCALE): residual
 * scaling as RRDBNet's dense blocks end (conv * 0.2 + x), which otherwise
 * stops the chain at the Mul, leaves the Add unfused and sends every block's
 * output through NCHW (the CUDA backend has no such post-op, so only models
 * whose device is the CPU ask for it). */
static void fuse_post_ops(spn_model_t *m, const spn_rt_val_t *pa, const spn_rt_val_t *pb, bool scale) {
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *c = &m->nodes[i];
    if (c->dead || (c->op != SPN_OP_CONV && c->op != SPN_OP_CONVT) || c->n_out != 1)
      continue;
    while (c->n_post < SPN_MAX_POST) {
      int j = sole_consumer(m, c->out[0]);
      if (j < 0)
        break;
      spn_node_t *a = &m->nodes[j];
      if (a->n_out != 1 || a->out[0] < 0)
        break;
      spn_post_t p = {0};
      switch (a->op) {
      case SPN_OP_RELU: p.kind = SPN_POST_RELU; break;
      case SPN_OP_LRELU: p.kind = SPN_POST_LRELU; p.a = spn_attr_float(a, "alpha", 0.01f); break;
      case SPN_OP_SIGMOID: p.kind = SPN_POST_SIGMOID; break;
      case SPN_OP_TANH: p.kind = SPN_POST_TANH; break;
      case SPN_OP_CLIP: {
        p.kind = SPN_POST_CLIP;
        p.a = -INFINITY;
        p.b = INFINITY;
        if (m->opset < 11) {
          p.a = spn_attr_float(a, "min", -INFINITY);
          p.b = spn_attr_float(a, "max", INFINITY);
        } else {
          bool ok = true;
          for (int k = 1; k < a->n_in && k < 3; k++) {
            int vi = a->in[k];
            if (vi < 0)
              continue;
            const spn_value_t *v = &m->vals[vi];
            if (v->kind != SPN_VAL_CONST || v->dtype != SPN_DTYPE_F32 || v->ndim > 1 || (v->ndim == 1 && v->shape[0] != 1)) {
              ok = false;
              break;
            }
            if (k == 1)
              p.a = *(const float *)v->data;
            else
              p.b = *(const float *)v->data;
          }
          if (!ok)
            p.kind = -1;
        }
        break;
      }
      case SPN_OP_PRELU: {
        /* Per-channel ([C,1,1] right-aligned) or single constant slope. */
        const spn_value_t *sl = &m->vals[a->in[1]];
        const spn_value_t *w = &m->vals[c->in[1]];
        int64_t oc = c->op == SPN_OP_CONV ? w->shape[0] : w->shape[1] * spn_attr_int(c, "group", 1);
        int64_t cnt = 1;
        for (int d = 0; d < sl->ndim; d++)
          cnt *= sl->shape[d];
        bool ok = sl->kind == SPN_VAL_CONST && sl->dtype == SPN_DTYPE_F32 && a->in[0] == c->out[0] && w->ndim == 4;
        if (ok && cnt != 1) {
          ok = sl->ndim >= 3 && sl->ndim <= 4 && cnt == oc && sl->shape[sl->ndim - 1] == 1 && sl->shape[sl->ndim - 2] == 1;
        }
        if (!ok) {
          p.kind = -1;
          break;
        }
        p.kind = SPN_POST_PRELU;
        p.val = a->in[1];
        p.a = (float)cnt;
        break;
      }
      case SPN_OP_MUL: {
        p.kind = -1;
        if (!scale || a->n_in != 2)
          break;
        int other = a->in[0] == c->out[0] ? a->in[1] : a->in[0];
        if (other < 0 || other == c->out[0])
          break;
        const spn_value_t *k = &m->vals[other];
        /* one element, of a rank that cannot raise the output's */
        int64_t cnt = 1;
        for (int d = 0; d < k->ndim; d++)
          cnt *= k->shape[d];
        if (k->kind != SPN_VAL_CONST || k->dtype != SPN_DTYPE_F32 || !k->data || cnt != 1 || k->ndim < 0 ||
            k->ndim > m->vals[c->in[1]].ndim)
          break;
        p.kind = SPN_POST_SCALE;
        p.a = *(const float *)k->data;
        break;
      }
      case SPN_OP_ADD: {
        if (a->n_in != 2)
          break;
        int other = a->in[0] == c->out[0] ? a->in[1] : a->in[0];
        if (other < 0 || other == c->out[0] || m->vals[other].kind == SPN_VAL_CONST)
          break;
        if (!same_probed_shape(pa, pb, other, a->out[0]) || !same_probed_shape(pa, pb, c->out[0], a->out[0]))
          break;
        /* The addend must exist when the conv runs. */
        int prod = m->vals[other].producer;
        if (m->vals[other].kind == SPN_VAL_INTER && prod >= i)
          break;
        p.kind = SPN_POST_ADD;
        p.val = other;
        break;
      }
      default: p.kind = -1; break;
      }
      if (a->op == SPN_OP_ADD && p.kind != SPN_POST_ADD)
        break;
      if (p.kind < 0)
        break;
      c->post[c->n_post++] = p;
      m->vals[c->out[0]].producer = -1;
      c->out[0] = a->out[0];
      m->vals[c->out[0]].producer = i;
      a->dead = true;
    }
  }
}

static void remove_dead(spn_model_t *m) {
  bool *live = calloc((size_t)m->n_val + 1, sizeof(bool));
  if (!live)
    return;
  for (int i = 0; i < m->n_outputs; i++)
    live[m->outputs[i]] = true;
  for (int i = m->n_node - 1; i >= 0; i--) {
    spn_node_t *n = &m->nodes[i];
    if (n->dead)
      continue;
    bool any = false;
    for (int o = 0; o < n->n_out; o++)
      any = any || (n->out[o] >= 0 && live[n->out[o]]);
    if (!any) {
      n->dead = true;
      continue;
    }
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] >= 0)
        live[n->in[k]] = true;
    for (int p = 0; p < n->n_post; p++)
      if (n->post[p].kind == SPN_POST_ADD || n->post[p].kind == SPN_POST_PRELU)
        live[n->post[p].val] = true;
  }
  free(live);
}

static void mark_shape_class(spn_model_t *m) {
  for (int i = 0; i < m->n_val; i++)
    m->vals[i].shape_class = false;
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *n = &m->nodes[i];
    n->shape_class = false;
    if (n->dead)
      continue;
    bool sc = n->op == SPN_OP_SHAPE;
    if (!sc && n->n_in > 0 && n->op != SPN_OP_CONV && n->op != SPN_OP_CONVT) {
      sc = true;
      for (int k = 0; k < n->n_in; k++) {
        int vi = n->in[k];
        if (vi >= 0 && !(m->vals[vi].kind == SPN_VAL_CONST || m->vals[vi].shape_class))
          sc = false;
      }
    }
    if (!sc)
      continue;
    n->shape_class = true;
    for (int o = 0; o < n->n_out; o++)
      if (n->out[o] >= 0)
        m->vals[n->out[o]].shape_class = true;
  }
}

/* FLOPs per sample for the compute-heavy ops, from shapes at batch 1. */
static void count_flops(spn_model_t *m, const spn_rt_val_t *v) {
  double f = 0;
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->n_out < 1 || n->out[0] < 0)
      continue;
    const spn_rt_val_t *y = &v[n->out[0]];
    double ny = 1;
    for (int d = 0; d < y->ndim; d++)
      ny *= (double)y->shape[d];
    if (n->op == SPN_OP_CONV && n->n_in >= 2) {
      const spn_rt_val_t *w = &v[n->in[1]];
      double k = 1;
      for (int d = 1; d < w->ndim; d++)
        k *= (double)w->shape[d];
      f += 2.0 * ny * k;
    } else if (n->op == SPN_OP_CONVT && n->n_in >= 2) {
      const spn_rt_val_t *x = &v[n->in[0]], *w = &v[n->in[1]];
      double nx = 1, k = 1;
      for (int d = 0; d < x->ndim; d++)
        nx *= (double)x->shape[d];
      for (int d = 1; d < w->ndim; d++)
        k *= (double)w->shape[d];
      f += 2.0 * nx * k;
    } else if ((n->op == SPN_OP_MATMUL || n->op == SPN_OP_GEMM) && n->n_in >= 2) {
      const spn_rt_val_t *a = &v[n->in[0]];
      int64_t kd = a->ndim ? a->shape[a->ndim - 1] : 1;
      if (n->op == SPN_OP_GEMM && spn_attr_int(n, "transA", 0) && a->ndim == 2)
        kd = a->shape[0];
      f += 2.0 * ny * (double)kd;
    }
  }
  m->flops = f;
}

/* Shape inference with a dynamic batch (dim 0) set to `dyn` and other
 * dynamic dims to `dyn_other`; fills rv. */
static int32_t infer_all(spn_model_t *m, spn_rt_val_t *rv, int64_t dyn, int64_t dyn_other,
                         spn_error_t *err) {
  spn_run_t r = {.m = m, .v = rv, .err = err, .threads = 1};
  for (int i = 0; i < m->n_inputs; i++) {
    const spn_value_t *iv = &m->vals[m->inputs[i]];
    spn_rt_val_t *x = &rv[m->inputs[i]];
    x->dtype = iv->dtype;
    x->ndim = iv->ndim;
    for (int d = 0; d < iv->ndim; d++)
      x->shape[d] = iv->shape[d] >= 0 ? iv->shape[d] : (d == 0 ? dyn : dyn_other);
  }
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead)
      continue;
    int32_t rc = n->shape_class ? run_host(&r, n) : spn_op_infer(&r, n);
    if (rc)
      return rc;
  }
  return SPN_OK;
}

/* Shapes of every value at two probe sizes: batch 1 and 2, dynamic spatial
 * dims at 64 and 96 (FLOPs are reported at batch 1 and 64); a model that
 * needs other sizes is probed at 1 and 2. On success *pa and *pb are the
 * caller's (rt_free). */
static int32_t probe_shapes(spn_model_t *m, spn_rt_val_t **pa, spn_rt_val_t **pb, spn_error_t *err) {
  static const int64_t dims[2][2] = {{SPN_PROBE_DIM, SPN_PROBE_DIM + 32}, {1, 2}};
  int32_t rc = SPN_OK;
  for (int t = 0; t < 2; t++) {
    spn_rt_val_t *a = rt_new(m), *b = rt_new(m);
    if (!a || !b) {
      rt_free(m, a);
      rt_free(m, b);
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    }
    if (t)
      spn_error_clear(err);
    rc = infer_all(m, a, 1, dims[t][0], err);
    if (!rc)
      rc = infer_all(m, b, 2, dims[t][1], err);
    if (!rc) {
      *pa = a;
      *pb = b;
      return SPN_OK;
    }
    rt_free(m, a);
    rt_free(m, b);
  }
  return rc;
}

/* Dtypes (and, where the file did not declare it, rank and static shape) of
 * the intermediate values, from the batch 1 and 2 probes, so that a device
 * backend's supports() can judge a node by its operands' types: a file
 * without value_info for intermediates leaves them unknown otherwise. Dims
 * that move with the probe are dynamic (-1). A model whose shapes cannot be
 * probed keeps the unknowns (its device nodes then fall back or refuse). */
static void static_types(spn_model_t *m) {
  spn_rt_val_t *a = NULL, *b = NULL;
  spn_error_t perr = SPN_ERROR_INIT;
  if (probe_shapes(m, &a, &b, &perr) != SPN_OK)
    return;
  for (int vi = 0; vi < m->n_val; vi++) {
    spn_value_t *v = &m->vals[vi];
    if (v->kind != SPN_VAL_INTER || a[vi].dtype == SPN_DTYPE_INVALID)
      continue;
    if (v->dtype == SPN_DTYPE_INVALID)
      v->dtype = a[vi].dtype;
    if (v->ndim < 0 && a[vi].ndim == b[vi].ndim) {
      v->ndim = a[vi].ndim;
      for (int d = 0; d < a[vi].ndim; d++)
        v->shape[d] = a[vi].shape[d] == b[vi].shape[d] ? a[vi].shape[d] : -1;
    }
  }
  rt_free(m, a);
  rt_free(m, b);
}

/* Whether a live node's tensor attribute holds value vi. */
static bool attr_tensor_read(const spn_model_t *m, int vi) {
  for (int i = 0; i < m->n_node; i++)
    for (int a = 0; !m->nodes[i].dead && a < m->nodes[i].n_attr; a++)
      if (m->nodes[i].attrs[a].type == SPN_ATTR_T && m->nodes[i].attrs[a].tval == vi)
        return true;
  return false;
}

/* Frees the host data of the constants nobody reads after the load, nor a
 * graph output nor a tensor attribute's source:
 * - those no live node reads any more (as input or post-op operand, as
 *   count_uses counted them after the last pass): the weights a pass
 *   replaced (a Conv's before BatchNormalization or a scale was folded in,
 *   a ConvTranspose's before it became convolutions) and what folding used
 *   up (Wav2Lip on the CPU, 145 MB of weights: 495 MB resident after load
 *   with them, 318 MB without);
 * - in a model on a device, those every reader keeps its own copy of
 *   (backend owns_const): the weights prepare uploaded, which were held
 *   twice, on the GPU and here.
 * The values keep name, type and shape. */
static void drop_unread_consts(spn_model_t *m) {
  /* owned[v]: every live node reading v keeps its own copy of it (its
   * backend's owns_const; a node on the CPU or a shape-class node never
   * does). Out of memory: only the unread constants go. */
  spn_backend_t *const *bk = m->shared ? m->shared->backends : NULL;
  bool *owned = malloc((size_t)m->n_val * sizeof *owned + 1);
  for (int v = 0; owned && v < m->n_val; v++)
    owned[v] = true;
  for (int i = 0; owned && i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    spn_backend_t *b = bk && !n->shape_class ? bk[n->backend] : NULL;
    for (int k = 0; !n->dead && k < n->n_in + n->n_post; k++) {
      int vi = spn_node_operand(n, k);
      if (vi >= 0 && !(b && b->iface->owns_const && b->iface->owns_const(b, m, n, k)))
        owned[vi] = false;
    }
  }
  for (int v = 0; v < m->n_val; v++) {
    spn_value_t *c = &m->vals[v];
    if (c->kind != SPN_VAL_CONST || !c->data || c->is_output || attr_tensor_read(m, v))
      continue;
    if (c->n_uses > 0 && !(owned && owned[v]))
      continue;
    free(c->data);
    c->data = NULL;
  }
  free(owned);
}

int32_t spn_graph_prepare(spn_model_t *m, bool fuse, spn_error_t *err) {
  int32_t rc;
  if (pthread_mutex_init(&m->pool_lock, NULL))
    return spn_error_set(err, SPN_EINTERNAL, "mutex init failed");
  m->pool_lock_init = true;
  for (int i = 0; i < m->n_node; i++) {
    if (pthread_mutex_init(&m->nodes[i].lock, NULL))
      return spn_error_set(err, SPN_EINTERNAL, "mutex init failed");
    m->nodes[i].lock_init = true;
    if (m->hist_n[m->nodes[i].op]++ == 0)
      m->hist_op[m->n_hist++] = spn_op_names[m->nodes[i].op];
  }
  if ((rc = topo_sort(m, err)))
    return rc;
  if ((rc = fold_constants(m, true, err)))
    return rc;
  for (int i = 0; i < m->n_node; i++)
    if (!m->nodes[i].dead && (rc = spn_op_check(m, &m->nodes[i], err)))
      return rc;
  if ((rc = fold_constants(m, false, err)))
    return rc;
  remove_dead(m);
  if (fuse) {
    if ((rc = fold_batchnorm(m, err)))
      return rc;
    /* Probe shapes of the unfused graph so fusion can check them; a model
     * whose shapes cannot be probed still runs, unfused adds and all. */
    spn_rt_val_t *pa = NULL, *pb = NULL;
    spn_error_t perr = SPN_ERROR_INIT;
    mark_shape_class(m);
    if (probe_shapes(m, &pa, &pb, &perr) != SPN_OK)
      pa = pb = NULL;
    /* on the CPU: a Mul by a scalar too (SPINDLE_NO_SCALE_FUSION=1: not) */
    const char *nsf = getenv("SPINDLE_NO_SCALE_FUSION");
    fuse_post_ops(m, pa, pb, m->dev_slot == SPN_BACKEND_CPU && !(nsf && *nsf && strcmp(nsf, "0")));
    rt_free(m, pa);
    rt_free(m, pb);
    /* on the CPU: strided ConvTranspose as convolutions (SPINDLE_NO_SUBPIXEL=1: not) */
    const char *ns = getenv("SPINDLE_NO_SUBPIXEL");
    if (m->dev_slot == SPN_BACKEND_CPU && !(ns && *ns && strcmp(ns, "0")) && (rc = convt_subpixel(m, err)))
      return rc;
  }
  remove_dead(m);
  mark_shape_class(m);
  count_uses(m);
  if (m->dev_slot != SPN_BACKEND_CPU)
    static_types(m);
  if ((rc = spn_plan_place(m, err)))
    return rc;
  if (fuse)
    mark_nhwc(m);
  spn_plan_views(m);
  /* SPINDLE_NO_INPLACE_ADD=1: every fused Add reads its own buffer */
  const char *nia = getenv("SPINDLE_NO_INPLACE_ADD");
  if (fuse && !(nia && *nia && strcmp(nia, "0")))
    spn_plan_inplace(m);
  m->n_live_nodes = 0;
  for (int i = 0; i < m->n_node; i++)
    m->n_live_nodes += !m->nodes[i].dead;
  /* Static shapes for inspection: infer at batch 1 and 2; dims that move
   * with the batch are dynamic (-1). */
  spn_rt_val_t *a = NULL, *b = NULL;
  rc = probe_shapes(m, &a, &b, err);
  if (rc) {
    spn_error_prefix(err, "%s: shape inference", m->path);
  } else {
    count_flops(m, a);
    for (int i = 0; i < m->n_outputs; i++) {
      spn_value_t *o = &m->vals[m->outputs[i]];
      if (o->kind == SPN_VAL_CONST)
        continue;
      const spn_rt_val_t *x = &a[m->outputs[i]], *y = &b[m->outputs[i]];
      o->dtype = x->dtype;
      o->ndim = x->ndim;
      for (int d = 0; d < x->ndim; d++)
        o->shape[d] = x->shape[d] == y->shape[d] ? x->shape[d] : -1;
    }
  }
  rt_free(m, a);
  rt_free(m, b);
  if (rc == SPN_OK)
    drop_unread_consts(m);
  return rc;
}

/* ---- buffer pool ---- */

void *spn_pool_take(spn_model_t *m, int slot, size_t n, size_t *got, void **h) {
  void *p = NULL;
  if (m->pool_lock_init) {
    pthread_mutex_lock(&m->pool_lock);
    int best = -1;
    for (int i = 0; i < m->n_pool; i++)
      if (m->pool[i].slot == slot && m->pool[i].n >= n && (best < 0 || m->pool[i].n < m->pool[best].n))
        best = i;
    if (best >= 0) {
      p = m->pool[best].p;
      *got = m->pool[best].n;
      *h = m->pool[best].h;
      m->pool[best] = m->pool[--m->n_pool];
    }
    pthread_mutex_unlock(&m->pool_lock);
  }
  if (!p) {
    spn_backend_t *b = m->shared->backends[slot];
    spn_error_t e = SPN_ERROR_INIT;
    if (b->iface->buf_alloc(b, n ? n : 1, &p, h, &e) != SPN_OK)
      return NULL;
    *got = n;
  }
  return p;
}

void spn_pool_give(spn_model_t *m, int slot, void *p, size_t n, void *h) {
  if (!p)
    return;
  if (m->pool_lock_init) {
    pthread_mutex_lock(&m->pool_lock);
    if (m->n_pool < (int)(sizeof m->pool / sizeof m->pool[0])) {
      m->pool[m->n_pool].p = p;
      m->pool[m->n_pool].h = h;
      m->pool[m->n_pool].slot = slot;
      m->pool[m->n_pool++].n = n;
      p = NULL;
    } else {
      /* Full: keep the larger buffer. */
      int small = 0;
      for (int i = 1; i < m->n_pool; i++)
        if (m->pool[i].n < m->pool[small].n)
          small = i;
      if (m->pool[small].n < n) {
        void *old = m->pool[small].p, *oh = m->pool[small].h;
        int os = m->pool[small].slot;
        m->pool[small].p = p;
        m->pool[small].n = n;
        m->pool[small].h = h;
        m->pool[small].slot = slot;
        p = old;
        h = oh;
        slot = os;
      }
    }
    pthread_mutex_unlock(&m->pool_lock);
  }
  if (p) {
    spn_backend_t *b = m->shared->backends[slot];
    b->iface->buf_free(b, p, h);
  }
}

void *spn_run_scratch(spn_run_t *r, size_t n) {
  if (n <= r->scratch_n)
    return r->scratch;
  spn_pool_give(r->m, SPN_BACKEND_CPU, r->scratch, r->scratch_n, r->scratch_h);
  r->scratch = spn_pool_take(r->m, SPN_BACKEND_CPU, n, &r->scratch_n, &r->scratch_h);
  if (!r->scratch)
    r->scratch_n = 0;
  return r->scratch;
}

/* ---- memory plans, one per (model, input shapes) ---- */

/* Backend slot whose memory holds value vi during a run: the producer's
 * backend for intermediates; the host (CPU) for inputs, constants and
 * shape-class values. */
static int home_slot(const spn_model_t *m, int vi) {
  const spn_value_t *v = &m->vals[vi];
  if (v->kind != SPN_VAL_INTER || v->producer < 0 || m->nodes[v->producer].shape_class)
    return SPN_BACKEND_CPU;
  return m->nodes[v->producer].backend;
}

static void plan_free_one(spn_model_t *m, spn_shape_plan_t *p) {
  if (!p)
    return;
  for (int b = 0; b < SPN_MAX_BACKENDS; b++) {
    spn_backend_t *bk = m->shared->backends[b];
    if (p->idle[b].fence)
      bk->iface->fence_free(bk, p->idle[b].fence); /* waits for the last run */
    if (p->idle[b].p)
      bk->iface->buf_free(bk, p->idle[b].p, p->idle[b].h);
  }
  free(p->key);
  free(p->off);
  free(p->xoff);
  free(p);
}

void spn_plans_free(spn_model_t *m) {
  for (spn_shape_plan_t *p = m->plans, *nx; p; p = nx) {
    nx = p->next;
    plan_free_one(m, p);
  }
  m->plans = NULL;
}

static void plan_unref(spn_model_t *m, spn_shape_plan_t *p) {
  pthread_mutex_lock(&m->pool_lock);
  bool last = --p->refs == 0;
  pthread_mutex_unlock(&m->pool_lock);
  if (last)
    plan_free_one(m, p);
}

static bool plan_matches(const spn_model_t *m, const spn_shape_plan_t *p, const int64_t *key) {
  return !memcmp(p->key, key, (size_t)m->n_inputs * (SPN_MAXD + 1) * sizeof *key);
}

/* Build the plan of this run's shapes (r->v holds them; inputs, outputs on
 * host-memory backends and shape-class values are bound). */
static int32_t plan_build(spn_run_t *r, const int64_t *key, spn_shape_plan_t **out) {
  spn_model_t *m = r->m;
  spn_backend_t *const *bk = m->shared->backends;
  const spn_rt_val_t *rv = r->v;
  int nv = m->n_val, nx = m->n_cross;
  spn_shape_plan_t *p = calloc(1, sizeof *p);
  int *end = malloc(((size_t)nv + 1) * sizeof *end);
  spn_live_t *live = malloc(((size_t)nv + nx + 1) * sizeof *live);
  int *slot_of = malloc(((size_t)nv + nx + 1) * sizeof *slot_of);
  size_t *offs = malloc(((size_t)nv + nx + 1) * sizeof *offs);
  int32_t rc = SPN_OK;
  if (!p || !end || !live || !slot_of || !offs || !(p->key = malloc((size_t)m->n_inputs * (SPN_MAXD + 1) * sizeof *key + 1)) ||
      !(p->off = calloc((size_t)nv + 1, sizeof *p->off)) || !(p->xoff = calloc((size_t)nx + 1, sizeof *p->xoff))) {
    rc = spn_error_set(r->err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  memcpy(p->key, key, (size_t)m->n_inputs * (SPN_MAXD + 1) * sizeof *key);
  /* Last step each value's memory is needed: its last reader, the end of
   * the run for graph outputs, the producer for a value nobody reads; a
   * value shared by views lives until the last of them is done. */
  for (int vi = 0; vi < nv; vi++) {
    const spn_value_t *v = &m->vals[vi];
    end[vi] = v->is_output ? m->n_node : v->last_use >= 0 ? v->last_use : v->producer;
  }
  for (int vi = 0; vi < nv; vi++)
    if (m->vals[vi].alias >= 0 && end[vi] > end[m->vals[vi].alias])
      end[m->vals[vi].alias] = end[vi];
  /* The values of each backend's arena: node outputs not bound elsewhere
   * and not views, and the boundary copies into that backend. */
  int nl = 0;
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class)
      continue;
    for (int o = 0; o < n->n_out; o++) {
      int vi = n->out[o];
      if (vi < 0 || rv[vi].ext || rv[vi].host_owned || m->vals[vi].alias >= 0)
        continue;
      live[nl] = (spn_live_t){rv[vi].bytes, i, end[vi]};
      slot_of[nl++] = n->backend;
    }
  }
  for (int c = 0; c < nx; c++) {
    live[nl + c] = (spn_live_t){rv[m->cross[c].val].bytes, m->cross[c].first, m->cross[c].last};
    slot_of[nl + c] = m->cross[c].slot;
  }
  for (int b = 0; b < m->shared->n_backends && !rc; b++) {
    /* Plan backend b over its own values only. */
    int cnt = 0;
    for (int k = 0; k < nl + nx; k++)
      if (slot_of[k] == b)
        cnt++;
    if (!cnt && !bk[b]->iface->prepare_shape)
      continue;
    spn_live_t *lb = malloc(((size_t)cnt + 1) * sizeof *lb);
    size_t *ob = malloc(((size_t)cnt + 1) * sizeof *ob);
    if (!lb || !ob) {
      free(lb);
      free(ob);
      rc = spn_error_set(r->err, SPN_ENOMEM, "out of memory");
      break;
    }
    for (int k = 0, j = 0; k < nl + nx; k++)
      if (slot_of[k] == b)
        lb[j++] = live[k];
    int32_t arc = spn_arena_plan(lb, cnt, 64, ob, &p->top[b]);
    for (int k = 0, j = 0; k < nl + nx && !arc; k++)
      if (slot_of[k] == b)
        offs[k] = ob[j++];
    free(lb);
    free(ob);
    if (arc) {
      rc = spn_error_set(r->err, arc, "%s: planning the %s arena: %s", m->path, bk[b]->device, spn_strerror(arc));
      break;
    }
    bool has_nodes = false;
    for (int i = 0; i < m->n_node && !has_nodes; i++)
      has_nodes = !m->nodes[i].dead && !m->nodes[i].shape_class && m->nodes[i].backend == b;
    size_t ws = 0;
    if (has_nodes && bk[b]->iface->prepare_shape && (rc = bk[b]->iface->prepare_shape(bk[b], r, &ws)))
      break;
    p->ws_off[b] = (p->top[b] + 255) & ~(size_t)255;
    p->ws_n[b] = ws;
    if (ws)
      p->top[b] = p->ws_off[b] + ws;
  }
  if (rc)
    goto out;
  nl = 0;
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class)
      continue;
    for (int o = 0; o < n->n_out; o++) {
      int vi = n->out[o];
      if (vi < 0 || rv[vi].ext || rv[vi].host_owned || m->vals[vi].alias >= 0)
        continue;
      p->off[vi] = offs[nl++];
    }
  }
  for (int c = 0; c < nx; c++)
    p->xoff[c] = offs[nl + c];
out:
  free(end);
  free(live);
  free(slot_of);
  free(offs);
  if (rc) {
    if (p) {
      free(p->key);
      free(p->off);
      free(p->xoff);
      free(p);
    }
    return rc;
  }
  *out = p;
  return SPN_OK;
}

/* The plan of this run's input shapes, built on first use; a reference
 * for the run (plan_unref). */
static int32_t plan_get(spn_run_t *r, spn_shape_plan_t **out) {
  spn_model_t *m = r->m;
  int64_t *key = calloc((size_t)m->n_inputs * (SPN_MAXD + 1) + 1, sizeof *key);
  if (!key)
    return spn_error_set(r->err, SPN_ENOMEM, "out of memory");
  for (int i = 0; i < m->n_inputs; i++) {
    const spn_rt_val_t *x = &r->v[m->inputs[i]];
    key[i * (SPN_MAXD + 1)] = x->ndim;
    memcpy(&key[i * (SPN_MAXD + 1) + 1], x->shape, (size_t)x->ndim * sizeof *key);
  }
  spn_shape_plan_t *p = NULL;
  pthread_mutex_lock(&m->pool_lock);
  for (p = m->plans; p && !plan_matches(m, p, key); p = p->next)
    ;
  if (p) {
    p->refs++;
    p->tick = ++m->plan_tick;
  }
  pthread_mutex_unlock(&m->pool_lock);
  if (p) {
    free(key);
    *out = p;
    return SPN_OK;
  }
  /* Built outside the lock (backends' prepare_shape is idempotent); a run
   * of the same shapes that finished first wins. */
  spn_shape_plan_t *np = NULL;
  int32_t rc = plan_build(r, key, &np);
  if (rc) {
    free(key);
    return rc;
  }
  spn_shape_plan_t *drop = NULL;
  pthread_mutex_lock(&m->pool_lock);
  for (p = m->plans; p && !plan_matches(m, p, key); p = p->next)
    ;
  if (p) {
    drop = np;
  } else {
    p = np;
    p->refs = 1; /* the list's */
    p->next = m->plans;
    m->plans = p;
    m->n_plan_builds++;
    /* Keep at most SPN_MAX_PLANS: drop the least recently used other one
     * (freed by its last run if one still holds it). */
    int count = 0;
    spn_shape_plan_t **lru = NULL;
    for (spn_shape_plan_t **it = &m->plans; *it; it = &(*it)->next) {
      count++;
      if (*it != p && (!lru || (*it)->tick < (*lru)->tick))
        lru = it;
    }
    if (count > SPN_MAX_PLANS && lru) {
      spn_shape_plan_t *old = *lru;
      *lru = old->next;
      if (--old->refs == 0)
        drop = old;
    }
  }
  p->refs++;
  p->tick = ++m->plan_tick;
  pthread_mutex_unlock(&m->pool_lock);
  plan_free_one(m, drop);
  free(key);
  *out = p;
  return SPN_OK;
}

/* The arenas of a run of plan p: the plan's idle set when free, else
 * buffers from the model's pool. */
static int32_t arenas_take(spn_run_t *r, spn_shape_plan_t *p, uint8_t **arena, size_t *arena_n, void **arena_h,
                           void **fence) {
  spn_model_t *m = r->m;
  pthread_mutex_lock(&m->pool_lock);
  if (p->has_idle) {
    for (int b = 0; b < SPN_MAX_BACKENDS; b++) {
      arena[b] = p->idle[b].p;
      arena_h[b] = p->idle[b].h;
      arena_n[b] = p->idle[b].n;
      fence[b] = p->idle[b].fence;
      p->idle[b].p = p->idle[b].h = p->idle[b].fence = NULL;
      p->idle[b].n = 0;
    }
    p->has_idle = false;
  }
  pthread_mutex_unlock(&m->pool_lock);
  /* The previous run on this arena may still be at work on another stream
   * (a run returning without synchronising): this run's stream waits. */
  for (int b = 0; b < m->shared->n_backends; b++) {
    spn_backend_t *bk = m->shared->backends[b];
    int32_t rc;
    if (fence[b] && (rc = bk->iface->fence_wait(bk, r, fence[b])))
      return rc;
  }
  for (int b = 0; b < m->shared->n_backends; b++) {
    if (!p->top[b] || arena[b])
      continue;
    arena[b] = spn_pool_take(m, b, p->top[b], &arena_n[b], &arena_h[b]);
    if (!arena[b])
      return spn_error_set(r->err, SPN_ENOMEM, "%s: out of memory for a %zu-byte arena on %s", m->path, p->top[b], m->shared->backends[b]->device);
  }
  return SPN_OK;
}

/* Back to the plan (or the pool). async: the run did not synchronise, so
 * each device arena gets a fence after the run's work; an arena going to
 * the pool is waited for first. */
static void arenas_give(spn_run_t *r, spn_shape_plan_t *p, uint8_t **arena, size_t *arena_n, void **arena_h,
                        void **fence, bool async) {
  spn_model_t *m = r->m;
  for (int b = 0; b < m->shared->n_backends; b++) {
    spn_backend_t *bk = m->shared->backends[b];
    if (async && arena[b] && bk->iface->fence_record && bk->iface->fence_record(bk, r, &fence[b]) != SPN_OK)
      bk->iface->run_end(bk, r, true); /* no fence: wait now */
  }
  pthread_mutex_lock(&m->pool_lock);
  bool keep = !p->has_idle && p->refs > 1; /* still listed (a dropped plan has only the runs' refs) */
  bool listed = false;
  for (spn_shape_plan_t *it = m->plans; it && !listed; it = it->next)
    listed = it == p;
  if (keep && listed) {
    for (int b = 0; b < SPN_MAX_BACKENDS; b++) {
      p->idle[b].p = arena[b];
      p->idle[b].h = arena_h[b];
      p->idle[b].n = arena_n[b];
      p->idle[b].fence = fence[b];
      arena[b] = NULL;
      fence[b] = NULL;
    }
    p->has_idle = true;
  }
  pthread_mutex_unlock(&m->pool_lock);
  for (int b = 0; b < m->shared->n_backends; b++) {
    spn_backend_t *bk = m->shared->backends[b];
    if (fence[b])
      bk->iface->fence_free(bk, fence[b]);
    spn_pool_give(m, b, arena[b], arena_n[b], arena_h[b]);
  }
}

/* Copy value c->val from its home into the consuming backend's slot. */
static int32_t cross_copy(spn_run_t *r, const spn_cross_t *c, void *dst) {
  spn_model_t *m = r->m;
  spn_backend_t *from = m->shared->backends[home_slot(m, c->val)], *to = m->shared->backends[c->slot];
  const spn_rt_val_t *v = &r->v[c->val];
  if (!v->bytes)
    return SPN_OK;
  if (from->host_memory && !to->host_memory)
    return to->iface->from_host(to, r, dst, v->data, v->bytes);
  if (!from->host_memory && to->host_memory) {
    /* The host reads it next: wait for the copy (and the work before it). */
    int32_t rc = from->iface->to_host(from, r, dst, v->data, v->bytes);
    return rc ? rc : from->iface->run_end(from, r, true);
  }
  return spn_error_set(r->err, SPN_EUNSUPPORTED, "%s: value '%s': no copy from %s to %s", m->path, m->vals[c->val].name, from->device, to->device);
}

/* Whether a tensor's memory is the device backend b's (not the host's). */
static bool on_device(const spn_tensor_t *t) { return t->device_kind != SPN_DEVICE_CPU; }

static bool device_matches(const spn_backend_t *b, const spn_tensor_t *t) {
  return !b->host_memory && t->device_kind == b->device_kind && t->device_index == b->device_index;
}

/* Whether the host reads value vi's bytes during a run: a node on a
 * host-memory backend, or a shape-class node other than Shape, reads it. */
static bool host_reads(const spn_model_t *m, int vi) {
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || (n->shape_class && n->op == SPN_OP_SHAPE))
      continue;
    if (!n->shape_class && !m->shared->backends[n->backend]->host_memory)
      continue;
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] == vi)
        return true;
    for (int p = 0; p < n->n_post; p++)
      if ((n->post[p].kind == SPN_POST_ADD || n->post[p].kind == SPN_POST_PRELU) && n->post[p].val == vi)
        return true;
  }
  return false;
}

static double mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int32_t spn_graph_run(spn_model_t *m, const spn_tensor_t *in, int n_in, spn_tensor_t *out,
                      int n_out, int threads, void *stream, bool shapes_only, spn_profile_t *prof,
                      spn_error_t *err) {
  if (n_in != m->n_inputs)
    return spn_error_set(err, SPN_EINVAL, "%s: %d inputs given, the model takes %d", m->path, n_in, m->n_inputs);
  if (n_out != m->n_outputs)
    return spn_error_set(err, SPN_EINVAL, "%s: %d outputs given, the model produces %d", m->path, n_out, m->n_outputs);
  spn_rt_val_t *rv = rt_new(m);
  if (!rv)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  spn_backend_t *const *bk = m->shared->backends;
  spn_backend_t *dev = bk[m->dev_slot];
  int nb = m->shared->n_backends;
  spn_run_t r = {.m = m, .v = rv, .err = err, .threads = threads, .stream = stream, .profile = prof != NULL};
  spn_shape_plan_t *plan = NULL;
  uint8_t *arena[SPN_MAX_BACKENDS] = {0};
  size_t arena_n[SPN_MAX_BACKENDS] = {0};
  void *arena_h[SPN_MAX_BACKENDS] = {0}, *fence[SPN_MAX_BACKENDS] = {0};
  bool used[SPN_MAX_BACKENDS] = {0};
  bool *engine_alloc = calloc((size_t)n_out + 1, sizeof(bool));
  bool *in_place = calloc((size_t)m->n_val + 1, sizeof(bool)); /* device inputs used where they are */
  void **xsave = calloc((size_t)m->n_cross + 1, sizeof(void *));
  void **tmp_out = calloc((size_t)n_out + 1, sizeof(void *)); /* host results for device outputs */
  bool host_out = n_out == 0;
  int32_t rc = SPN_OK;
  used[SPN_BACKEND_CPU] = true;
  if (!engine_alloc || !in_place || !xsave || !tmp_out) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < n_in; i++) {
    const spn_value_t *iv = &m->vals[m->inputs[i]];
    const spn_tensor_t *t = &in[i];
    if (t->dtype != iv->dtype || t->ndim != iv->ndim || !t->data) {
      rc = spn_error_set(err, SPN_EINVAL, "%s: input '%s' (#%d): expected a tensor of dtype %d with %d dims, got dtype %d with %d dims", m->path, iv->name, i, iv->dtype, iv->ndim, t->dtype, t->ndim);
      goto out;
    }
    if (on_device(t) && !device_matches(dev, t)) {
      rc = spn_error_set(err, SPN_EINVAL, "%s: input '%s' (#%d) is in the memory of device kind %d index %d; a model on %s takes host memory or its own device's", m->path, iv->name, i, t->device_kind, t->device_index, m->device);
      goto out;
    }
    for (int d = 0; d < t->ndim; d++)
      if ((iv->shape[d] >= 0 && t->shape[d] != iv->shape[d]) || t->shape[d] < 0 || (iv->shape[d] < 0 && t->shape[d] == 0)) {
        rc = spn_error_set(err, SPN_EINVAL, "%s: input '%s': dimension %d is %lld, the model expects %lld", m->path, iv->name, d, (long long)t->shape[d], (long long)iv->shape[d]);
        goto out;
      }
    spn_rt_val_t *x = &rv[m->inputs[i]];
    x->dtype = t->dtype;
    x->ndim = t->ndim;
    memcpy(x->shape, t->shape, sizeof x->shape);
    x->data = t->data;
    x->ext = true;
    x->bytes = rt_bytes(x);
    if (on_device(t) && !shapes_only) {
      if (!host_reads(m, m->inputs[i]) && !iv->is_output) {
        in_place[m->inputs[i]] = true;
        continue;
      }
      /* Read by the host too: one copy to the host, used like a host input. */
      void *h = spn_aligned_alloc(x->bytes ? x->bytes : 1);
      if (!h) {
        rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
        goto out;
      }
      x->data = h;
      x->ext = false;
      x->host_owned = true;
      if (x->bytes && ((rc = dev->iface->to_host(dev, &r, h, t->data, x->bytes)) || (rc = dev->iface->run_end(dev, &r, true))))
        goto out;
    }
  }
  /* Shapes, and shape-class values on the host. */
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead)
      continue;
    rc = n->shape_class ? run_host(&r, n) : spn_op_infer(&r, n);
    if (rc) {
      spn_error_prefix(err, "%s: node '%s' (%s)", m->path, n->name, n->op_name);
      goto out;
    }
    if (n->shape_class)
      continue;
    used[n->backend] = true;
    for (int o = 0; o < n->n_out; o++) {
      int vi = n->out[o];
      if (vi < 0)
        continue;
      rv[vi].bytes = rt_bytes(&rv[vi]);
      if (rv[vi].bytes > (size_t)SPN_VALUE_MAX) {
        rc = spn_error_set(err, SPN_ETOOBIG, "%s: value '%s' would need more than %lld bytes", m->path, m->vals[vi].name, (long long)SPN_VALUE_MAX);
        goto out;
      }
    }
  }
  /* Outputs: caller buffers (host or device) or engine allocations. */
  for (int i = 0; i < n_out; i++) {
    int vi = m->outputs[i];
    spn_rt_val_t *ov = &rv[vi];
    spn_tensor_t *t = &out[i];
    ov->bytes = rt_bytes(ov);
    if (ov->bytes > (size_t)SPN_VALUE_MAX) {
      rc = spn_error_set(err, SPN_ETOOBIG, "%s: output '%s' too large", m->path, m->vals[vi].name);
      goto out;
    }
    if (shapes_only) {
      t->struct_size = sizeof *t;
      t->dtype = ov->dtype;
      t->ndim = ov->ndim;
      memset(t->shape, 0, sizeof t->shape);
      memcpy(t->shape, ov->shape, (size_t)ov->ndim * sizeof(int64_t));
      continue;
    }
    if (on_device(t) && (!device_matches(dev, t) || !t->data)) {
      rc = spn_error_set(err, SPN_EINVAL, "%s: output '%s' (#%d): %s", m->path, m->vals[vi].name, i, t->data ? "a device output must be in the memory of the model's device" : "a device output needs the caller's buffer (spn_model_output_shapes gives its shape)");
      goto out;
    }
    host_out = host_out || !on_device(t);
    if (t->data) {
      bool same = t->dtype == ov->dtype && t->ndim == ov->ndim;
      for (int d = 0; same && d < ov->ndim; d++)
        same = t->shape[d] == ov->shape[d];
      if (!same) {
        rc = spn_error_set(err, SPN_EINVAL, "%s: output '%s' (#%d): the caller's buffer does not match the produced dtype/shape", m->path, m->vals[vi].name, i);
        goto out;
      }
    }
  }
  if (shapes_only)
    goto out;
  for (int i = 0; i < n_out; i++) {
    int vi = m->outputs[i];
    spn_rt_val_t *ov = &rv[vi];
    spn_tensor_t *t = &out[i];
    if (m->vals[vi].kind == SPN_VAL_CONST || ov->host_owned || (ov->ext && ov->data))
      continue; /* copied at the end */
    if (!bk[home_slot(m, vi)]->host_memory)
      continue; /* produced in device memory: planned there (or the caller's device buffer), copied at the end */
    if (on_device(t)) { /* produced on the host: there first, then copied */
      if (!(tmp_out[i] = spn_aligned_alloc(ov->bytes ? ov->bytes : 1))) {
        rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory for output '%s'", m->path, m->vals[vi].name);
        goto out;
      }
      ov->data = tmp_out[i];
      ov->ext = true;
      continue;
    }
    if (!t->data) {
      t->data = spn_aligned_alloc(ov->bytes);
      if (!t->data) {
        rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory for output '%s'", m->path, m->vals[vi].name);
        goto out;
      }
      engine_alloc[i] = true;
    }
    ov->data = t->data;
    ov->ext = true;
  }
  /* The memory plan of these shapes (built by their first run), and its
   * arenas. */
  if ((rc = plan_get(&r, &plan)) || (rc = arenas_take(&r, plan, arena, arena_n, arena_h, fence)))
    goto out;
  for (int b = 0; b < nb; b++) {
    r.bws[b] = plan->ws_n[b] ? arena[b] + plan->ws_off[b] : NULL;
    r.bws_n[b] = plan->ws_n[b];
  }
  for (int i = 0; i < m->n_val; i++)
    if (!rv[i].ext && !rv[i].host_owned && m->vals[i].kind != SPN_VAL_CONST && m->vals[i].alias < 0 && rv[i].bytes &&
        m->vals[i].producer >= 0 && !m->nodes[m->vals[i].producer].dead)
      rv[i].data = arena[home_slot(m, i)] + plan->off[i];
  /* Device outputs produced on the device: written in the caller's buffer
   * (the plan's slot for them stays unused). */
  for (int i = 0; i < n_out; i++) {
    int vi = m->outputs[i];
    if (on_device(&out[i]) && m->vals[vi].kind == SPN_VAL_INTER && !rv[vi].host_owned && !rv[vi].ext &&
        !bk[home_slot(m, vi)]->host_memory) {
      rv[vi].data = out[i].data;
      rv[vi].ext = true;
    }
  }
  for (int i = 0; i < m->n_val; i++)
    if (m->vals[i].alias >= 0 && m->vals[i].producer >= 0 && !m->nodes[m->vals[i].producer].dead)
      rv[i].data = rv[m->vals[i].alias].data;
  /* Execute: maximal ranges of nodes on one backend; before each, copy the
   * values it reads from another backend's memory, and let its nodes see
   * those copies in place of the originals. */
  for (int i = 0; i < m->n_node;) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class) {
      i++;
      continue;
    }
    int b = n->backend, j = i + 1;
    while (j < m->n_node && (m->nodes[j].dead || m->nodes[j].shape_class || (!prof && m->nodes[j].backend == b)))
      j++;
    double t0 = prof ? mono_ms() : 0;
    for (int c = 0; c < m->n_cross && !rc; c++) {
      const spn_cross_t *x = &m->cross[c];
      if (x->slot != b || x->last < i || x->first >= j || (in_place[x->val] && b == m->dev_slot))
        continue;
      void *dst = arena[b] + plan->xoff[c];
      if (x->first >= i)
        rc = cross_copy(&r, x, dst);
      xsave[c] = rv[x->val].data;
      rv[x->val].data = dst;
    }
    if (!rc)
      rc = bk[b]->iface->compute(bk[b], &r, i, j);
    if (prof && !rc) { /* one live node: wait for its device, then time it */
      if (b != SPN_BACKEND_CPU)
        rc = bk[b]->iface->run_end(bk[b], &r, true);
      if (!rc && prof->n < prof->max)
        prof->t[prof->n] = (spn_node_time_t){.op = n->op_name, .name = n->name, .device = bk[b]->device,
                                             .fused = n->n_post, .index = i, .ms = mono_ms() - t0};
      prof->n++;
    }
    for (int c = 0; c < m->n_cross; c++)
      if (xsave[c]) {
        rv[m->cross[c].val].data = xsave[c];
        xsave[c] = NULL;
      }
    if (rc)
      goto out;
    i = j;
  }
  /* Outputs that are constants, inputs or shape-class values, or that were
   * produced in device memory: copy. */
  for (int i = 0; i < n_out; i++) {
    int vi = m->outputs[i];
    spn_rt_val_t *ov = &rv[vi];
    spn_tensor_t *t = &out[i];
    spn_backend_t *hb = bk[home_slot(m, vi)];
    bool dev_home = !hb->host_memory && !ov->host_owned && m->vals[vi].kind == SPN_VAL_INTER;
    if (ov->data == t->data && t->data)
      goto shape;
    if (on_device(t)) {
      if (dev_home || in_place[vi]) {
        rc = spn_error_set(err, SPN_EUNSUPPORTED, "%s: output '%s' (#%d): no device-to-device copy of this output; ask for it in host memory", m->path, m->vals[vi].name, i);
        goto out;
      }
      if (ov->bytes && (rc = dev->iface->from_host(dev, &r, t->data, ov->data, ov->bytes)))
        goto out;
      goto shape;
    }
    if (!t->data) {
      t->data = spn_aligned_alloc(ov->bytes);
      if (!t->data) {
        rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
        goto out;
      }
      engine_alloc[i] = true;
    }
    if (dev_home) {
      if (ov->bytes && (rc = hb->iface->to_host(hb, &r, t->data, ov->data, ov->bytes)))
        goto out;
    } else if (in_place[vi]) {
      if (ov->bytes && (rc = dev->iface->to_host(dev, &r, t->data, ov->data, ov->bytes)))
        goto out;
    } else if (ov->bytes) {
      memcpy(t->data, ov->data, ov->bytes);
    }
    t->device_kind = SPN_DEVICE_CPU;
    t->device_index = 0;
  shape:
    t->struct_size = sizeof *t;
    t->dtype = ov->dtype;
    t->ndim = ov->ndim;
    memset(t->shape, 0, sizeof t->shape);
    memcpy(t->shape, ov->shape, (size_t)ov->ndim * sizeof(int64_t));
  }
out:
  /* Every backend finishes the run's work (outputs copied to the host are
   * complete) before its buffers go back to the plan or the pool; when every
   * output is in device memory, device backends do not wait: the outputs
   * are ready when the stream's work is, and the arenas carry a fence. */
  for (int b = 0; b < nb; b++)
    if (used[b] || b == m->dev_slot) {
      bool sync = host_out || rc || bk[b]->host_memory || shapes_only;
      int32_t erc = bk[b]->iface->run_end(bk[b], &r, sync);
      if (erc && !rc)
        rc = erc;
    }
  if (rc && engine_alloc)
    for (int i = 0; i < n_out; i++)
      if (engine_alloc[i]) {
        free(out[i].data);
        out[i].data = NULL;
      }
  if (plan) {
    arenas_give(&r, plan, arena, arena_n, arena_h, fence, !host_out && !rc);
    plan_unref(m, plan);
  }
  /* Host results copied into device outputs: the copies are from pageable
   * memory, staged before cudaMemcpyAsync returns, so they can go now. */
  for (int i = 0; tmp_out && i < n_out; i++)
    free(tmp_out[i]);
  free(tmp_out);
  free(engine_alloc);
  free(in_place);
  free(xsave);
  spn_pool_give(m, SPN_BACKEND_CPU, r.scratch, r.scratch_n, r.scratch_h);
  rt_free(m, rv);
  return rc;
}
