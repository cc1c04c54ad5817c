/* cpu-dnnl.c — the CPU backend's oneDNN part: Conv, ConvTranspose and
 * pooling primitives, and sgemm for MatMul/Gemm.
 *
 * A node keeps a small cache of primitives keyed by its input shape (a new
 * batch size or image size makes a new entry), each with its weights
 * reordered once into the layout the primitive prefers. Primitives run with
 * a user-provided scratchpad taken from the calling run, so several threads
 * may execute the same primitive at once. When oneDNN would fall back to its
 * im2col/gemm path for plain NCHW tensors, the primitive is built on blocked
 * layouts instead and the input/output are reordered around it (that pays
 * for anything but tiny channel counts); fused post-ops then run in C after
 * the output reorder. Otherwise post-ops (activation, scale, residual add)
 * are fused into the primitive; a residual add whose output was planned
 * over the addend's bytes (spn_plan_inplace) is a sum post-op, any other a
 * binary one.
 */
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

typedef struct spn_dnnl_entry {
  int ndim;
  int64_t key[SPN_MAXD];
  dnnl_primitive_t prim;
  dnnl_primitive_t src_reorder, dst_reorder; /* blocked path only */
  dnnl_memory_desc_t src_md, dst_md, usr_src_md, usr_dst_md, bin_md;
  size_t scratch, src_tmp, dst_tmp;
  void *weights; /* reordered weights (owned) */
  dnnl_memory_desc_t wei_md;
  bool blocked, fused_posts, nhwc_path;
  int n_fused; /* leading post-ops run inside the primitive; the rest in C */
  int sum_at;  /* the fused Add done as a sum post-op on the output written
                  over its addend (spn_plan_inplace), or -1 */
  struct spn_dnnl_entry *next;
} spn_dnnl_entry_t;

struct spn_dnnl_cache {
  spn_dnnl_entry_t *head;
};

static void entry_free(spn_dnnl_entry_t *e) {
  if (e->prim) dnnl_primitive_destroy(e->prim);
  if (e->src_reorder) dnnl_primitive_destroy(e->src_reorder);
  if (e->dst_reorder) dnnl_primitive_destroy(e->dst_reorder);
  free(e->weights);
  free(e);
}

void spn_dnnl_node_free(spn_node_t *n) {
  struct spn_dnnl_cache *c = n->bctx;
  if (!c)
    return;
  spn_dnnl_entry_t *e = c->head;
  while (e) {
    spn_dnnl_entry_t *nx = e->next;
    entry_free(e);
    e = nx;
  }
  free(c);
  n->bctx = NULL;
}

int32_t spn_dnnl_engine_new(void **eng, spn_error_t *err) {
  dnnl_engine_t e;
  if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success)
    return spn_error_set(err, SPN_EDEVICE, "oneDNN: cannot create the CPU engine");
  *eng = e;
  return SPN_OK;
}

void spn_dnnl_engine_free(void *eng) {
  if (eng)
    dnnl_engine_destroy(eng);
}

int32_t spn_sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M == 0 || N == 0)
    return SPN_OK;
  if (K == 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++)
        C[i * ldc + j] = beta == 0.f ? 0.f : C[i * ldc + j] * beta;
    return SPN_OK;
  }
  return dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success ? SPN_OK : SPN_EINTERNAL;
}

static dnnl_format_tag_t plain_tag(int nd) {
  static const dnnl_format_tag_t t[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde, dnnl_abcdef};
  return nd >= 1 && nd <= 6 ? t[nd] : dnnl_format_tag_undef;
}

static void to_dims(dnnl_dims_t d, const int64_t *s, int n) {
  for (int i = 0; i < n; i++)
    d[i] = s[i];
}

static dnnl_stream_t get_stream(spn_run_t *r) {
  if (!r->brun[SPN_BACKEND_CPU]) {
    dnnl_stream_t s;
    if (dnnl_stream_create(&s, spn_cpu_dnnl_engine(r->m), dnnl_stream_default_flags) != dnnl_success)
      return NULL;
    r->brun[SPN_BACKEND_CPU] = s;
  }
  return r->brun[SPN_BACKEND_CPU];
}

static int32_t reorder_now(dnnl_engine_t eng, dnnl_stream_t st, const dnnl_memory_desc_t *from,
                           void *src, const dnnl_memory_desc_t *to, void *dst) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t p = NULL;
  dnnl_memory_t ms = NULL, md = NULL;
  int32_t rc = SPN_EINTERNAL;
  if (dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, NULL) != dnnl_success)
    goto out;
  if (dnnl_primitive_create(&p, pd) != dnnl_success)
    goto out;
  if (dnnl_memory_create(&ms, from, eng, src) != dnnl_success || dnnl_memory_create(&md, to, eng, dst) != dnnl_success)
    goto out;
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
  if (dnnl_primitive_execute(p, st, 2, args) != dnnl_success || dnnl_stream_wait(st) != dnnl_success)
    goto out;
  rc = SPN_OK;
out:
  if (ms) dnnl_memory_destroy(ms);
  if (md) dnnl_memory_destroy(md);
  if (p) dnnl_primitive_destroy(p);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return rc;
}

static dnnl_primitive_t make_reorder(dnnl_engine_t eng, const dnnl_memory_desc_t *from,
                                     const dnnl_memory_desc_t *to) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t p = NULL;
  if (dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, NULL) == dnnl_success)
    dnnl_primitive_create(&p, pd);
  if (pd)
    dnnl_primitive_desc_destroy(pd);
  return p;
}

static bool impl_is_ref(const_dnnl_primitive_desc_t pd) {
  const char *s = NULL;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s);
  return s && strstr(s, "ref");
}

static bool impl_is_gemm(const_dnnl_primitive_desc_t pd) {
  const char *s = NULL;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s);
  return s && (strstr(s, "gemm") || strstr(s, "ref"));
}

/* Create a conv/deconv primitive descriptor on the given layouts, with the
 * node's post-ops fused when `fuse`. */
static dnnl_status_t conv_pd(spn_run_t *r, const spn_node_t *n, bool tr, const dnnl_memory_desc_t *src,
                             const dnnl_memory_desc_t *wei, const dnnl_memory_desc_t *bias,
                             const dnnl_memory_desc_t *dst, const dnnl_memory_desc_t *addmd,
                             const dnnl_dims_t sd, const dnnl_dims_t dd, const dnnl_dims_t pld,
                             const dnnl_dims_t prd, int nfuse, int sum_at, dnnl_primitive_desc_t *pd) {
  dnnl_engine_t eng = spn_cpu_dnnl_engine(r->m);
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_status_t s = dnnl_primitive_attr_create(&attr);
  if (s != dnnl_success)
    return s;
  dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (nfuse > 0) {
    dnnl_post_ops_create(&po);
    for (int p = 0; p < nfuse && s == dnnl_success; p++) {
      const spn_post_t *pp = &n->post[p];
      switch (pp->kind) {
      case SPN_POST_RELU: s = dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_relu, 0.f, 0.f); break;
      case SPN_POST_LRELU: s = dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_relu, pp->a, 0.f); break;
      case SPN_POST_SIGMOID: s = dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_logistic, 0.f, 0.f); break;
      case SPN_POST_TANH: s = dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_tanh, 0.f, 0.f); break;
      case SPN_POST_CLIP: s = dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_clip, pp->a, pp->b); break;
      /* alpha * x + 0: the product rounded once, as the Mul node it replaces */
      case SPN_POST_SCALE: s = dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_linear, pp->a, 0.f); break;
      case SPN_POST_ADD:
        /* sum: the addend is already in dst (written in place over it) */
        s = p == sum_at ? dnnl_post_ops_append_sum(po, 1.f) : dnnl_post_ops_append_binary(po, dnnl_binary_add, addmd);
        break;
      case SPN_POST_PRELU: s = dnnl_post_ops_append_prelu(po, pp->a > 1 ? 2 : 0); break;
      default: s = dnnl_unimplemented; break;
      }
    }
    if (s == dnnl_success)
      s = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  if (s == dnnl_success) {
    if (!tr) {
      dnnl_convolution_desc_t cd;
      s = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, src, wei, bias, dst, sd, dd, pld, prd);
      if (s == dnnl_success)
        s = dnnl_primitive_desc_create(pd, &cd, attr, eng, NULL);
    } else {
      dnnl_deconvolution_desc_t cd;
      s = dnnl_dilated_deconvolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_deconvolution_direct, src, wei, bias, dst, sd, dd, pld, prd);
      if (s == dnnl_success)
        s = dnnl_primitive_desc_create(pd, &cd, attr, eng, NULL);
    }
  }
  if (po)
    dnnl_post_ops_destroy(po);
  dnnl_primitive_attr_destroy(attr);
  return s;
}

bool spn_cpu_dnnl_late_sum(const spn_model_t *m) {
  /* The chain build_conv asks for, [scale, sum], on a small channels-last
   * convolution: oneDNN 2.6 runs it in its AVX-512 kernels, but on AVX2
   * only its reference kernel takes it (a sum there must come first, with
   * scale 1). */
  spn_run_t r = {.m = (spn_model_t *)m};
  spn_node_t n = {.n_post = 2};
  n.post[0] = (spn_post_t){.kind = SPN_POST_SCALE, .a = 0.5f};
  n.post[1] = (spn_post_t){.kind = SPN_POST_ADD};
  dnnl_memory_desc_t x, w, y;
  const dnnl_dims_t xd = {1, 8, 6, 6}, wd = {8, 8, 3, 3}, st = {1, 1}, dl = {0, 0}, pad = {1, 1};
  dnnl_primitive_desc_t pd = NULL;
  bool ok = false;
  if (spn_cpu_dnnl_engine(m) && dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, dnnl_acdb) == dnnl_success &&
      dnnl_memory_desc_init_by_tag(&y, 4, xd, dnnl_f32, dnnl_acdb) == dnnl_success &&
      dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
      conv_pd(&r, &n, false, &x, &w, NULL, &y, &y, st, dl, pad, pad, 2, 1, &pd) == dnnl_success)
    ok = !impl_is_ref(pd);
  if (pd)
    dnnl_primitive_desc_destroy(pd);
  return ok;
}

/* The eltwise algorithm a post-op runs as in oneDNN (Relu and LeakyRelu
 * share one), with its two parameters; -1 for the others. */
static int post_alg(const spn_post_t *p, float *a, float *b) {
  *a = *b = 0.f;
  switch (p->kind) {
  case SPN_POST_RELU: return dnnl_eltwise_relu;
  case SPN_POST_LRELU: *a = p->a; return dnnl_eltwise_relu;
  case SPN_POST_SIGMOID: return dnnl_eltwise_logistic;
  case SPN_POST_TANH: return dnnl_eltwise_tanh;
  case SPN_POST_CLIP: *a = p->a; *b = p->b; return dnnl_eltwise_clip;
  case SPN_POST_SCALE: *a = p->a; return dnnl_eltwise_linear;
  default: return -1;
  }
}

/* How many of the first `want` post-ops may run inside one primitive:
 * oneDNN 2.6 computes a chain with two eltwise post-ops of one algorithm and
 * different parameters wrongly (conv * 0.5 + x then * 0.2 comes out as if
 * both scales were the same, in its brgemm and direct kernels alike), so
 * the chain is cut before the second; the rest runs in C. */
static int fusable_posts(const spn_node_t *n, int want) {
  for (int p = 1; p < want; p++) {
    float a, b;
    int alg = post_alg(&n->post[p], &a, &b);
    for (int q = 0; q < p && alg >= 0; q++) {
      float qa, qb;
      if (post_alg(&n->post[q], &qa, &qb) == alg && (qa != a || qb != b))
        return p;
    }
  }
  return want;
}

/* The fused Add whose addend's bytes the node's output is written over
 * (spn_plan_inplace), or -1. */
static int inplace_post(const spn_model_t *m, const spn_node_t *n) {
  int root = m->vals[n->out[0]].alias;
  if (root < 0)
    return -1;
  for (int p = 0; p < n->n_post; p++)
    if (n->post[p].kind == SPN_POST_ADD) {
      int a = n->post[p].val;
      if ((m->vals[a].alias >= 0 ? m->vals[a].alias : a) == root)
        return p;
    }
  return -1;
}

/* Build a conv/deconv primitive for input x.
 *
 * 2-D convolutions run on NHWC (channels-last) tensors, which oneDNN's
 * brgemm kernels handle fastest; values passed only between convolutions
 * stay NHWC (spn_value_t.nhwc), others are reordered from/to NCHW around the
 * primitive. Other ranks run on plain layouts, or blocked ones when oneDNN
 * would otherwise fall back to im2col+gemm. */
static int32_t build_conv(spn_run_t *r, const spn_node_t *n, bool tr, const spn_rt_val_t *x,
                          const spn_rt_val_t *y, spn_dnnl_entry_t *e) {
  dnnl_engine_t eng = spn_cpu_dnnl_engine(r->m);
  const spn_rt_val_t *w = &r->v[n->in[1]];
  bool has_bias = n->n_in > 2 && n->in[2] >= 0;
  int nd = x->ndim, nsp = nd - 2;
  int64_t g = spn_attr_int(n, "group", 1);
  int64_t st[3], dl[3], pl[3], pr[3], osp[3];
  int32_t rc = spn_conv_geometry(n, x, w, tr, st, dl, pl, pr, osp, r->err);
  if (rc)
    return rc;
  dnnl_dims_t xd, yd, wd, bd, sd, dd, pld, prd;
  to_dims(xd, x->shape, nd);
  to_dims(yd, y->shape, nd);
  for (int i = 0; i < nsp; i++) {
    sd[i] = st[i];
    dd[i] = dl[i] - 1;
    pld[i] = pl[i];
    prd[i] = pr[i];
  }
  int64_t oc = y->shape[1], ic = x->shape[1];
  int wnd;
  dnnl_format_tag_t wtag;
  if (g == 1) {
    wnd = nd;
    wd[0] = oc;
    wd[1] = ic;
    for (int i = 0; i < nsp; i++)
      wd[2 + i] = w->shape[2 + i];
    static const dnnl_format_tag_t conv_t[] = {dnnl_abc, dnnl_abcd, dnnl_abcde};
    static const dnnl_format_tag_t deconv_t[] = {dnnl_bac, dnnl_bacd, dnnl_bacde};
    wtag = tr ? deconv_t[nsp - 1] : conv_t[nsp - 1];
  } else {
    wnd = nd + 1;
    wd[0] = g;
    wd[1] = oc / g;
    wd[2] = ic / g;
    for (int i = 0; i < nsp; i++)
      wd[3 + i] = w->shape[2 + i];
    static const dnnl_format_tag_t conv_t[] = {dnnl_abcd, dnnl_abcde, dnnl_abcdef};
    static const dnnl_format_tag_t deconv_t[] = {dnnl_acbd, dnnl_acbde, dnnl_acbdef};
    wtag = tr ? deconv_t[nsp - 1] : conv_t[nsp - 1];
  }
  bd[0] = oc;
  dnnl_memory_desc_t xmd, ymd, xnhwc, ynhwc, xany, yany, wmd_any, wmd_usr, bmd;
  dnnl_memory_desc_init_by_tag(&xmd, nd, xd, dnnl_f32, plain_tag(nd));
  dnnl_memory_desc_init_by_tag(&ymd, nd, yd, dnnl_f32, plain_tag(nd));
  dnnl_memory_desc_init_by_tag(&xany, nd, xd, dnnl_f32, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&yany, nd, yd, dnnl_f32, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&wmd_any, wnd, wd, dnnl_f32, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&wmd_usr, wnd, wd, dnnl_f32, wtag);
  dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a);
  bool in_nhwc = r->m->vals[n->in[0]].nhwc, out_nhwc = r->m->vals[n->out[0]].nhwc;
  const dnnl_memory_desc_t *bias = has_bias ? &bmd : NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_unimplemented;
  bool fused = false;
  /* oneDNN 2.6 has only its reference kernel for convolutions with a PReLU
   * post-op, so post-ops from the first PReLU on run in C. */
  int nfuse = 0;
  while (nfuse < n->n_post && n->post[nfuse].kind != SPN_POST_PRELU)
    nfuse++;
  nfuse = fusable_posts(n, nfuse);
  /* A scaled residual (RRDBNet's conv * 0.2 + x) whose addend is read
   * again later: a binary add post-op would cost the brgemm kernel, so the
   * Add runs in C on the channels-last output (one pass over data still in
   * cache), and the convolution's sums stay those of the unfused graph. */
  if (nd == 4 && !tr) {
    bool scaled = false;
    for (int p = 0; p < nfuse; p++) {
      if (n->post[p].kind == SPN_POST_SCALE)
        scaled = true;
      else if (n->post[p].kind == SPN_POST_ADD && scaled) {
        nfuse = p;
        break;
      }
    }
  }
  /* Written over the addend of post-op sp (spn_plan_inplace): on the NHWC
   * path that Add is a sum post-op, and fusion stops before any other Add,
   * whose binary post-op would cost the brgemm kernel (the rest runs in C). */
  int sp = inplace_post(r->m, n), sum_at = -1;
  if (nd == 4 && !tr && sp >= 0 && out_nhwc) {
    int nf = 0;
    while (nf < n->n_post && n->post[nf].kind != SPN_POST_PRELU && (n->post[nf].kind != SPN_POST_ADD || nf == sp))
      nf++;
    nf = fusable_posts(n, nf);
    if (sp < nf) {
      nfuse = nf;
      sum_at = sp;
    }
  }
  if (nd == 4) {
    dnnl_memory_desc_init_by_tag(&xnhwc, nd, xd, dnnl_f32, dnnl_acdb);
    dnnl_memory_desc_init_by_tag(&ynhwc, nd, yd, dnnl_f32, dnnl_acdb);
    if (tr) {
      /* oneDNN's deconvolution is faster on its blocked layouts than on
       * NHWC: reorder around it, fuse only the leading eltwise post-ops. */
      int nf = 0;
      while (nf < n->n_post && n->post[nf].kind != SPN_POST_PRELU && n->post[nf].kind != SPN_POST_ADD)
        nf++;
      nf = fusable_posts(n, nf);
      s = conv_pd(r, n, tr, &xany, &wmd_any, bias, &yany, &ynhwc, sd, dd, pld, prd, nf, -1, &pd);
      if (s == dnnl_success && !impl_is_ref(pd)) {
        nfuse = nf;
        fused = true;
        e->nhwc_path = false;
        e->usr_src_md = in_nhwc ? xnhwc : xmd;
        e->usr_dst_md = out_nhwc ? ynhwc : ymd;
        goto have_pd;
      }
      if (pd)
        dnnl_primitive_desc_destroy(pd);
      pd = NULL;
    }
    s = conv_pd(r, n, tr, &xnhwc, &wmd_any, bias, &ynhwc, &ynhwc, sd, dd, pld, prd, nfuse, sum_at, &pd);
    fused = s == dnnl_success;
    if (s == dnnl_success && nfuse && impl_is_ref(pd)) {
      dnnl_primitive_desc_destroy(pd);
      pd = NULL;
      s = dnnl_unimplemented;
    }
    if (s != dnnl_success) {
      /* None of the post-ops is fused now: they run in C (an Add written
       * in place copies its addend first). Leaving `fused` set here made
       * the posts vanish on AVX2, where oneDNN 2.6 offers only its
       * reference kernel for a sum after a scale. */
      fused = false;
      sum_at = -1;
      s = conv_pd(r, n, tr, &xnhwc, &wmd_any, bias, &ynhwc, &ynhwc, sd, dd, pld, prd, 0, -1, &pd);
    }
    e->nhwc_path = s == dnnl_success;
    e->bin_md = ynhwc;
    e->usr_src_md = in_nhwc ? xnhwc : xmd;
    e->usr_dst_md = out_nhwc ? ynhwc : ymd;
  }
  if (s != dnnl_success) {
    if (in_nhwc || out_nhwc)
      return spn_error_set(r->err, SPN_EUNSUPPORTED, "oneDNN refused this %s on NHWC tensors", tr ? "ConvTranspose" : "Conv");
    nfuse = 0; /* posts in C on the plain output keep this path simple */
    sum_at = -1;
    e->usr_src_md = xmd;
    e->usr_dst_md = ymd;
    e->bin_md = ymd;
    s = conv_pd(r, n, tr, &xmd, &wmd_any, bias, &ymd, &ymd, sd, dd, pld, prd, 0, -1, &pd);
    fused = false;
    if (s == dnnl_success && impl_is_gemm(pd) && ic / g >= 8 && oc / g >= 8) {
      dnnl_primitive_desc_t pd2 = NULL;
      if (conv_pd(r, n, tr, &xany, &wmd_any, bias, &yany, &ymd, sd, dd, pld, prd, 0, -1, &pd2) == dnnl_success) {
        dnnl_primitive_desc_destroy(pd);
        pd = pd2;
        fused = false;
      }
    }
    if (s != dnnl_success)
      return spn_error_set(r->err, SPN_EUNSUPPORTED, "oneDNN refused this %s (status %d)", tr ? "ConvTranspose" : "Conv", (int)s);
  }
have_pd:
  e->fused_posts = fused;
  e->n_fused = fused ? nfuse : 0;
  e->sum_at = fused ? sum_at : -1;
  rc = SPN_EINTERNAL;
  if (dnnl_primitive_create(&e->prim, pd) != dnnl_success) {
    rc = spn_error_set(r->err, SPN_EINTERNAL, "oneDNN: cannot create the primitive");
    goto out;
  }
  e->wei_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  e->src_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
  e->dst_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
  e->scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
  e->weights = spn_aligned_alloc(dnnl_memory_desc_get_size(&e->wei_md));
  if (!e->weights) {
    rc = spn_error_set(r->err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  dnnl_stream_t stream = get_stream(r);
  if (!stream || reorder_now(eng, stream, &wmd_usr, w->data, &e->wei_md, e->weights)) {
    rc = spn_error_set(r->err, SPN_EINTERNAL, "oneDNN: weight reorder failed");
    goto out;
  }
  e->src_tmp = dnnl_memory_desc_equal(&e->src_md, &e->usr_src_md) ? 0 : dnnl_memory_desc_get_size(&e->src_md);
  e->dst_tmp = dnnl_memory_desc_equal(&e->dst_md, &e->usr_dst_md) ? 0 : dnnl_memory_desc_get_size(&e->dst_md);
  if (e->sum_at >= 0 && e->dst_tmp) { /* the sum must read the addend where the primitive writes */
    rc = spn_error_set(r->err, SPN_EINTERNAL, "oneDNN: in-place Add on a reordered output");
    goto out;
  }
  if ((e->src_tmp && !(e->src_reorder = make_reorder(eng, &e->usr_src_md, &e->src_md))) ||
      (e->dst_tmp && !(e->dst_reorder = make_reorder(eng, &e->dst_md, &e->usr_dst_md)))) {
    rc = spn_error_set(r->err, SPN_EINTERNAL, "oneDNN: activation reorder unavailable");
    goto out;
  }
  rc = SPN_OK;
out:
  dnnl_primitive_desc_destroy(pd);
  return rc;
}

static spn_dnnl_entry_t *find_entry(spn_node_t *n, const spn_rt_val_t *x) {
  struct spn_dnnl_cache *c = n->bctx;
  if (!c)
    return NULL;
  for (spn_dnnl_entry_t *e = c->head; e; e = e->next)
    if (e->ndim == x->ndim && !memcmp(e->key, x->shape, (size_t)x->ndim * sizeof(int64_t)))
      return e;
  return NULL;
}

typedef int32_t (*spn_builder_fn)(spn_run_t *, const spn_node_t *, bool, const spn_rt_val_t *,
                                  const spn_rt_val_t *, spn_dnnl_entry_t *);

/* Look up or build the entry; the lock covers the list and building. */
static int32_t get_entry(spn_run_t *r, const spn_node_t *cn, bool tr, spn_builder_fn build,
                         spn_dnnl_entry_t **out) {
  spn_node_t *n = (spn_node_t *)cn; /* the cache is the node's only mutable part */
  const spn_rt_val_t *x = &r->v[n->in[0]], *y = &r->v[n->out[0]];
  pthread_mutex_lock(&n->lock);
  spn_dnnl_entry_t *e = find_entry(n, x);
  int32_t rc = SPN_OK;
  if (!e) {
    if (!n->bctx && !(n->bctx = calloc(1, sizeof(struct spn_dnnl_cache)))) {
      rc = spn_error_set(r->err, SPN_ENOMEM, "out of memory");
      goto out;
    }
    e = calloc(1, sizeof *e);
    if (!e) {
      rc = spn_error_set(r->err, SPN_ENOMEM, "out of memory");
      goto out;
    }
    e->ndim = x->ndim;
    memcpy(e->key, x->shape, (size_t)x->ndim * sizeof(int64_t));
    if ((rc = build(r, n, tr, x, y, e))) {
      entry_free(e);
      e = NULL;
      goto out;
    }
    struct spn_dnnl_cache *c = n->bctx;
    e->next = c->head;
    c->head = e;
  }
out:
  pthread_mutex_unlock(&n->lock);
  *out = e;
  return rc;
}

/* Post-ops from `from` on, in C, on the output in its stored layout (NHWC
 * when the value is kept channels-last); a residual addend may be stored
 * either way too. */
static int32_t rest_posts(spn_run_t *r, const spn_node_t *n, int from) {
  spn_rt_val_t *y = &r->v[n->out[0]];
  bool nhwc = r->m->vals[n->out[0]].nhwc;
  int64_t cnt = 1;
  for (int d = 0; d < y->ndim; d++)
    cnt *= y->shape[d];
  float *Y = y->data;
  int64_t N = y->shape[0], C = y->ndim > 1 ? y->shape[1] : 1, HW = N * C != 0 ? cnt / (N * C) : 0;
  for (int p = from; p < n->n_post; p++) {
    const spn_post_t *po = &n->post[p];
    bool a_nhwc = po->kind == SPN_POST_ADD && r->m->vals[po->val].nhwc;
    if (nhwc && po->kind == SPN_POST_PRELU) {
      const float *sl = r->v[po->val].data;
      bool per = po->a > 1;
#pragma omp parallel for if (cnt > 32768)
      for (int64_t i = 0; i < N * HW; i++)
        for (int64_t c = 0; c < C; c++) {
          float v = Y[i * C + c];
          Y[i * C + c] = v > 0 ? v : v * sl[per ? c : 0];
        }
    } else if (po->kind == SPN_POST_ADD && nhwc == a_nhwc && nhwc) {
      const float *A = r->v[po->val].data;
#pragma omp parallel for if (cnt > 32768)
      for (int64_t i = 0; i < cnt; i++)
        Y[i] += A[i];
    } else if (po->kind == SPN_POST_ADD && nhwc != a_nhwc) {
      /* one of the two channels-last: the addend has the output's shape */
      const float *A = r->v[po->val].data;
#pragma omp parallel for collapse(2) if (cnt > 32768)
      for (int64_t b = 0; b < N; b++)
        for (int64_t i = 0; i < HW; i++)
          for (int64_t c = 0; c < C; c++) {
            int64_t l = (b * HW + i) * C + c, f = (b * C + c) * HW + i;
            Y[nhwc ? l : f] += A[nhwc ? f : l];
          }
    } else {
      spn_spost_t one = {.n = n, .from = p, .to = p + 1};
      spn_apply_post_from(r, &one, Y, cnt);
    }
  }
  return SPN_OK;
}

static int32_t exec_entry(spn_run_t *r, const spn_node_t *n, spn_dnnl_entry_t *e, bool conv) {
  dnnl_engine_t eng = spn_cpu_dnnl_engine(r->m);
  dnnl_stream_t st = get_stream(r);
  const spn_rt_val_t *x = &r->v[n->in[0]];
  spn_rt_val_t *y = &r->v[n->out[0]];
  if (!st)
    return spn_error_set(r->err, SPN_EINTERNAL, "oneDNN: no stream");
  /* One run-scratch block carved into scratchpad, reorder temporaries and
   * up to two reordered addends. */
  size_t al = 4096;
  size_t s_scr = (e->scratch + al - 1) / al * al, s_src = (e->src_tmp + al - 1) / al * al,
         s_dst = (e->dst_tmp + al - 1) / al * al, s_add = 0;
  for (int p = 0; p < n->n_post && conv; p++)
    if (n->post[p].kind == SPN_POST_ADD && e->nhwc_path && !r->m->vals[n->post[p].val].nhwc)
      s_add += (dnnl_memory_desc_get_size(&e->bin_md) + al - 1) / al * al;
  /* Written over an addend that the primitive does not add as a sum (a
   * path without fused post-ops): that addend is read from a copy. */
  int ip = conv ? inplace_post(r->m, n) : -1;
  if (ip == e->sum_at)
    ip = -1;
  size_t s_save = ip >= 0 ? (y->bytes + al - 1) / al * al : 0;
  spn_rt_val_t *saved = ip >= 0 ? &r->v[n->post[ip].val] : NULL;
  void *saved_data = saved ? saved->data : NULL;
  uint8_t *blk = spn_run_scratch(r, s_scr + s_src + s_dst + s_add + s_save + al);
  void *scratch = e->scratch && blk ? blk : NULL;
  void *src_tmp = e->src_tmp && blk ? blk + s_scr : NULL;
  void *dst_tmp = e->dst_tmp && blk ? blk + s_scr + s_src : NULL;
  uint8_t *add_area = blk ? blk + s_scr + s_src + s_dst : NULL;
  dnnl_memory_t mem[16] = {0};
  int n_add_tmp = 0;
  int nm = 0;
  dnnl_memory_desc_t plain_md;
  {
    dnnl_dims_t yd;
    to_dims(yd, y->shape, y->ndim);
    dnnl_memory_desc_init_by_tag(&plain_md, y->ndim, yd, dnnl_f32, plain_tag(y->ndim));
  }
  int32_t rc = SPN_EINTERNAL;
  if (!blk) {
    rc = spn_error_set(r->err, SPN_ENOMEM, "out of memory for oneDNN buffers");
    goto out;
  }
  if (saved) {
    void *copy = blk + s_scr + s_src + s_dst + s_add;
    memcpy(copy, saved_data, y->bytes);
    saved->data = copy;
  }
  dnnl_memory_t usr_src, usr_dst, src, dst;
#define MK(var, md, ptr)                                                          \
  do {                                                                            \
    if (dnnl_memory_create(&var, md, eng, ptr) != dnnl_success)                   \
      goto out;                                                                   \
    mem[nm++] = var;                                                              \
  } while (0)
  MK(usr_src, &e->usr_src_md, x->data);
  MK(usr_dst, &e->usr_dst_md, y->data);
  src = usr_src;
  dst = usr_dst;
  if (src_tmp) {
    MK(src, &e->src_md, src_tmp);
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, usr_src}, {DNNL_ARG_TO, src}};
    if (dnnl_primitive_execute(e->src_reorder, st, 2, a) != dnnl_success)
      goto out;
  }
  if (dst_tmp)
    MK(dst, &e->dst_md, dst_tmp);
  dnnl_exec_arg_t args[16];
  int na = 0;
  args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, src};
  args[na++] = (dnnl_exec_arg_t){DNNL_ARG_DST, dst};
  if (e->scratch) {
    dnnl_memory_t ms;
    const_dnnl_primitive_desc_t ppd;
    dnnl_primitive_get_primitive_desc(e->prim, &ppd);
    MK(ms, dnnl_primitive_desc_query_md(ppd, dnnl_query_scratchpad_md, 0), scratch);
    args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, ms};
  }
  if (conv) {
    dnnl_memory_t mw;
    MK(mw, &e->wei_md, e->weights);
    args[na++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, mw};
    if (n->n_in > 2 && n->in[2] >= 0) {
      dnnl_memory_desc_t bmd;
      dnnl_dims_t bd = {y->shape[1]};
      dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a);
      dnnl_memory_t mb;
      MK(mb, &bmd, r->v[n->in[2]].data);
      args[na++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mb};
    }
    for (int p = 0; p < e->n_fused; p++) {
        if (n->post[p].kind == SPN_POST_PRELU) {
          dnnl_memory_desc_t pmd;
          dnnl_dims_t pdims = {1, n->post[p].a > 1 ? y->shape[1] : 1, 1, 1};
          dnnl_memory_desc_init_by_tag(&pmd, y->ndim, pdims, dnnl_f32, y->ndim == 4 ? dnnl_acdb : plain_tag(y->ndim));
          dnnl_memory_t mp;
          MK(mp, &pmd, r->v[n->post[p].val].data);
          args[na++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(p) | DNNL_ARG_WEIGHTS, mp};
        } else if (n->post[p].kind == SPN_POST_ADD && p != e->sum_at) {
          dnnl_memory_t madd;
          void *addp = r->v[n->post[p].val].data;
          if (e->nhwc_path && !r->m->vals[n->post[p].val].nhwc) {
            /* A plain NCHW addend: bring it to channels-last first. */
            if (n_add_tmp == 2)
              goto out;
            size_t bytes = dnnl_memory_desc_get_size(&e->bin_md);
            void *tmp = add_area + (size_t)n_add_tmp++ * ((bytes + al - 1) / al * al);
            if (reorder_now(eng, st, &plain_md, addp, &e->bin_md, tmp))
              goto out;
            addp = tmp;
          }
          MK(madd, &e->bin_md, addp);
          args[na++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(p) | DNNL_ARG_SRC_1, madd};
        }
    }
  }
  if (dnnl_primitive_execute(e->prim, st, na, args) != dnnl_success)
    goto out;
  if (dst_tmp) {
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, usr_dst}};
    if (dnnl_primitive_execute(e->dst_reorder, st, 2, a) != dnnl_success)
      goto out;
  }
  if (dnnl_stream_wait(st) != dnnl_success)
    goto out;
  if (conv && e->n_fused < n->n_post && (rc = rest_posts(r, n, e->n_fused)))
    goto out;
  rc = SPN_OK;
#undef MK
out:
  if (saved)
    saved->data = saved_data;
  if (rc == SPN_EINTERNAL)
    spn_error_set(r->err, rc, "oneDNN execution failed");
  for (int i = 0; i < nm; i++)
    dnnl_memory_destroy(mem[i]);
  return rc;
}

int32_t spn_dnnl_conv(spn_run_t *r, const spn_node_t *n, bool transposed) {
  spn_dnnl_entry_t *e;
  int32_t rc = get_entry(r, n, transposed, build_conv, &e);
  if (rc)
    return rc;
  /* A fused add whose operand had to broadcast is applied in C instead. */
  return exec_entry(r, n, e, true);
}

/* A pooling node's window per spatial dim: kernel, stride, dilation (oneDNN's:
 * minus one), left pad, and right pad as declared (or as auto_pad makes it)
 * and as widened for ceil_mode until oneDNN's floor formula gives y's size. */
static void pool_geometry(const spn_node_t *n, const spn_rt_val_t *x, const spn_rt_val_t *y, dnnl_dims_t kd,
                          dnnl_dims_t sd, dnnl_dims_t dd, dnnl_dims_t pld, dnnl_dims_t prd_decl, dnnl_dims_t prd) {
  int nsp = x->ndim - 2;
  const spn_attr_t *ks = spn_node_attr(n, "kernel_shape"), *as = spn_node_attr(n, "strides"),
                   *ad = spn_node_attr(n, "dilations"), *ap = spn_node_attr(n, "pads");
  const char *autopad = spn_attr_str(n, "auto_pad", "NOTSET");
  for (int i = 0; i < nsp; i++) {
    kd[i] = ks->ints[i];
    sd[i] = as ? as->ints[i] : 1;
    dd[i] = (ad ? ad->ints[i] : 1) - 1;
    pld[i] = ap ? ap->ints[i] : 0;
    prd[i] = ap ? ap->ints[i + nsp] : 0;
    int64_t in = x->shape[2 + i], ek = (kd[i] - 1) * (dd[i] + 1) + 1, out = y->shape[2 + i];
    if (!strcmp(autopad, "VALID"))
      pld[i] = prd[i] = 0;
    if (!strcmp(autopad, "SAME_UPPER") || !strcmp(autopad, "SAME_LOWER")) {
      int64_t tot = (out - 1) * sd[i] + ek - in;
      if (tot < 0) tot = 0;
      pld[i] = !strcmp(autopad, "SAME_UPPER") ? tot / 2 : tot - tot / 2;
      prd[i] = tot - pld[i];
    }
    prd_decl[i] = prd[i];
    /* ceil_mode: widen the right pad until oneDNN's floor formula yields out. */
    while ((in - ek + pld[i] + prd[i]) / sd[i] + 1 < out)
      prd[i]++;
  }
}

static int32_t build_pool(spn_run_t *r, const spn_node_t *n, bool unused, const spn_rt_val_t *x,
                          const spn_rt_val_t *y, spn_dnnl_entry_t *e) {
  (void)unused;
  dnnl_engine_t eng = spn_cpu_dnnl_engine(r->m);
  int nd = x->ndim;
  dnnl_dims_t xd, yd, kd, sd, dd, pld, prd_decl, prd;
  to_dims(xd, x->shape, nd);
  to_dims(yd, y->shape, nd);
  pool_geometry(n, x, y, kd, sd, dd, pld, prd_decl, prd);
  bool avg = n->op == SPN_OP_AVGPOOL;
  dnnl_alg_kind_t alg = !avg ? dnnl_pooling_max : (spn_attr_int(n, "count_include_pad", 0) ? dnnl_pooling_avg_include_padding : dnnl_pooling_avg_exclude_padding);
  dnnl_memory_desc_t xmd, ymd;
  dnnl_memory_desc_init_by_tag(&xmd, nd, xd, dnnl_f32, plain_tag(nd));
  dnnl_memory_desc_init_by_tag(&ymd, nd, yd, dnnl_f32, plain_tag(nd));
  dnnl_pooling_v2_desc_t pdsc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int32_t rc = SPN_OK;
  dnnl_primitive_attr_create(&attr);
  dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (dnnl_pooling_v2_forward_desc_init(&pdsc, dnnl_forward_inference, alg, &xmd, &ymd, sd, kd, dd, pld, prd) != dnnl_success ||
      dnnl_primitive_desc_create(&pd, &pdsc, attr, eng, NULL) != dnnl_success ||
      dnnl_primitive_create(&e->prim, pd) != dnnl_success) {
    rc = spn_error_set(r->err, SPN_EUNSUPPORTED, "oneDNN refused this pooling");
    goto out;
  }
  e->usr_src_md = e->src_md = xmd;
  e->usr_dst_md = e->dst_md = ymd;
  e->scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
out:
  if (pd) dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_attr_destroy(attr);
  return rc;
}

/* oneDNN's average with padding divides by the whole window, counting the
 * right padding ceil_mode adds; ONNX's count_include_pad counts the declared
 * padding only (ONNX Runtime's reference): rescale the outputs whose window
 * reaches past it, by (window size) / (positions inside input and pads). */
static void pool_ceil_divisor(spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = &r->v[n->in[0]];
  spn_rt_val_t *y = &r->v[n->out[0]];
  int nsp = x->ndim - 2;
  dnnl_dims_t kd, sd, dd, pld, prd_decl, prd;
  pool_geometry(n, x, y, kd, sd, dd, pld, prd_decl, prd);
  bool widened = false;
  int64_t window = 1;
  for (int i = 0; i < nsp; i++) {
    widened |= prd[i] != prd_decl[i];
    window *= kd[i];
  }
  if (!widened)
    return;
  int64_t planes = x->shape[0] * x->shape[1], sp = 1;
  for (int i = 0; i < nsp; i++)
    sp *= y->shape[2 + i];
  float *yp = y->data;
  for (int64_t o = 0; o < sp; o++) {
    int64_t rem = o, cnt = 1;
    for (int i = nsp - 1; i >= 0; i--) {
      int64_t oi = rem % y->shape[2 + i], in = 0;
      rem /= y->shape[2 + i];
      for (int64_t a = 0; a < kd[i]; a++)
        in += oi * sd[i] - pld[i] + a * (dd[i] + 1) < x->shape[2 + i] + prd_decl[i];
      cnt *= in;
    }
    if (cnt == window || cnt == 0)
      continue;
    float f = (float)window / (float)cnt;
    for (int64_t p = 0; p < planes; p++)
      yp[p * sp + o] *= f;
  }
}

int32_t spn_dnnl_pool(spn_run_t *r, const spn_node_t *n) {
  spn_dnnl_entry_t *e;
  int32_t rc = get_entry(r, n, false, build_pool, &e);
  if (rc)
    return rc;
  rc = exec_entry(r, n, e, false);
  if (!rc && n->op == SPN_OP_AVGPOOL && spn_attr_int(n, "count_include_pad", 0))
    pool_ceil_divisor(r, n);
  return rc;
}

void spn_dnnl_run_end(spn_run_t *r) {
  if (r->brun[SPN_BACKEND_CPU])
    dnnl_stream_destroy(r->brun[SPN_BACKEND_CPU]);
  r->brun[SPN_BACKEND_CPU] = NULL;
}
