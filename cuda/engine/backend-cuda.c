/* cuda/engine/backend-cuda.c — the CUDA engine backend (core/engine/backend.h).
 *
 * One instance per GPU ("cuda:N"), opened by the engine on the first model
 * loaded there; every model on that GPU shares it, and a model's weights are
 * uploaded once into that GPU's memory by prepare() (the engine's registry
 * shares the model itself between the stage instances on the GPU).
 *
 *   Conv            cuDNN (legacy convolution API of cuDNN 9), bias + ReLU
 *                   and the residual add fused by
 *                   cudnnConvolutionBiasActivationForward where the fused
 *                   post-ops are [Relu] or [Add, Relu]; otherwise the
 *                   convolution, then bias and post-ops by our kernels
 *   ConvTranspose   cuDNN backward-data, bias and post-ops by our kernels
 *   MatMul, Gemm    cuBLASLt (bias and ReLU epilogues for Gemm)
 *   the rest        our kernels (engine-kernels.cu), each the twin of the
 *                   CPU kernel in core/engine/cpu-kernels.c
 *
 * Activations are fp32 NCHW. Precision "fp32" computes in fp32 (cuDNN FMA
 * math, cuBLASLt 32F); "tf32" lets cuDNN and cuBLASLt use TF32 tensor cores;
 * "fp16" runs Conv, ConvTranspose, MatMul and Gemm on fp16 tensor cores with
 * fp32 accumulation: their constant weights are converted to fp16 once, at
 * prepare; the activation is cast to fp16 at the operator's input and its
 * result back to fp32 (with the bias) at its output, in the run's scratch.
 * Every other operator stays fp32, so values between nodes, boundary copies
 * and outputs are fp32 at every precision (docs/engine.md, "fp16").
 *
 * A run goes on the caller's stream when it gives one (else the backend's
 * own), and host synchronisation happens only in run_end when the outputs
 * were copied to the host. The cuDNN and cuBLASLt handles are used by one
 * run at a time (compute holds the backend's lock). Once per (model, input
 * shapes) prepare_shape() builds, per node, the cuDNN descriptors and
 * algorithm, the cuBLASLt descriptors and heuristic, and the resize tables,
 * and sizes the scratch (cuDNN / cuBLASLt workspace and fp16 casts) that the
 * planner puts in the run's arena: runs allocate nothing on the device and
 * two runs on two streams never share a workspace. Out of device memory is
 * SPN_ENOMEM naming the GPU, for that model or run only.
 *
 * Convolution algorithms: cuDNN times every algorithm of a convolution
 * problem the first time it is met (cudnnFind*), which runs (and loads)
 * each candidate kernel. The choice is kept per problem (layout, type, math,
 * shapes, padding, strides, dilation, groups), so nodes of the same shape
 * in any model on the GPU share one timing, and in a cache file per GPU
 * model and cuDNN version (docs/engine.md, "Algorithm cache") that later
 * processes read at open: a worker that restarts, or a new replica, skips
 * the timing for every problem a process met before.
 */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "../../core/engine/ops-internal.h"
#include "../../core/models/model-path.h"
#include "../../core/runtime/device-internal.h"
#include "cublaslt-api.h"
#include "engine-kernels.cuh"
#ifdef SPN_HAVE_NCCL
#include "../nccl-internal.h"
#endif

/* The legacy convolution API is deprecated in cuDNN 9 but complete and
 * frontend-free; its declarations carry deprecation attributes. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define CU_WS_MAX ((size_t)512 << 20)
#define CU_LT_WS ((size_t)32 << 20)
#define CU_ALIGN(x) (((x) + 255) & ~(size_t)255)

/* A range of nodes run as a CUDA Graph: captured on the second run with the
 * same signature (model, range, input shapes, every device pointer and
 * shape the range reads or writes, its scratch), replayed from the third. */
typedef struct cu_graph {
  const spn_model_t *m;
  int64_t *sig;
  size_t sig_n;
  int state; /* 0: seen once (ran eagerly); 1: captured; -1: not capturable (eager) */
  cudaGraphExec_t exec;
  uint64_t tick;
  struct cu_graph *next;
} cu_graph_t;
#define CU_MAX_GRAPHS 64

typedef struct {
  int dev;
  spn_device_t **devs; /* the GPU as a spindle/device.h device: arena buffers */
  uint32_t n_devs;
  cudaStream_t stream; /* used when the caller gives none */
  cudaStream_t cap_stream; /* graph captures only (graph_capture): known to nothing else */
  cudnnHandle_t dnn;
  cublasLtHandle_t lt;
  spn__lt_api_t lt_api; /* cuBLASLt's entry points (cublaslt-api.h) */
  pthread_mutex_t lock;
  cu_graph_t *graphs; /* under lock, at most CU_MAX_GRAPHS (least recently used dropped) */
  int n_graphs;
  uint64_t graph_tick;
  struct cu_algo *algos; /* convolution problems' chosen algorithms (timed, or read from algo_file), under lock */
  char *algo_file;       /* the algorithm cache file; NULL: none (SPINDLE_CUDNN_CACHE=0, or no place for it) */
  bool heuristic; /* SPINDLE_CUDNN_HEURISTIC=1: cuDNN's heuristic algorithm, no timing at prepare */
  bool nhwc;      /* fp16 models keep fp16 channels-last values (plan_forms); off with SPINDLE_CUDA_NHWC=0 */
} cu_ctx_t;

typedef struct cu_conv {
  int64_t key[SPN_MAXD];
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnActivationDescriptor_t act;
  int algo;
  size_t ws;
  struct cu_conv *next;
} cu_conv_t;

/* A MatMul/Gemm problem as cuBLASLt sees it, built once per (node, shapes). */
typedef struct cu_lt {
  int64_t ka[SPN_MAXD + 1], kb[SPN_MAXD + 1], kc[SPN_MAXD + 1]; /* operand shapes: rank, dims */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulHeuristicResult_t heur;
  size_t ws;
  struct cu_lt *next;
} cu_lt_t;

typedef struct cu_resize {
  int64_t key[SPN_MAXD + 1];
  int64_t ish[3], osh[3];
  int linear;
  bool cubic;   /* 4-tap tables (spn_resize_cubic_tables); ish/osh = 1, H, W */
  int64_t *i01; /* device: i0 then i1, or the cubic indices */
  float *w;     /* device */
  struct cu_resize *next;
} cu_resize_t;

typedef struct {
  int n_c;                     /* n_in: entries of cdata and half */
  void **cdata;                /* device copies of constant inputs (fp32 etc.) */
  void *post_c[SPN_MAX_POST];  /* device copies of constant post-op operands */
  float *bn_scale, *bn_shift;  /* BatchNormalization folded to an affine */
  float *zero_bias;            /* fused conv without a bias */
  bool *half;                  /* cdata[k] holds fp16 (precision fp16 weights) */
  int n_fused;                 /* leading post-ops fused into cuDNN */
  /* fp16 channels-last (plan_forms): a convolution run on NHWC fp16 tensors
   * (its weights stored K,R,S,C), with its input and output channel counts
   * and those rounded up to a multiple of 8 for cuDNN (zero channels); which
   * of the node's values are fp16 channels-last; an element-wise node run
   * on them. A depthwise one (dw: one group per channel, one output channel
   * each) has groups of one channel, the padded ones included. */
  bool nhwc, dw;
  int64_t cin, cout, cin_p, cout_p;
  bool planned;
  bool h_out, h_x; /* output 0, and the data input 0, are fp16 channels-last */
  bool h_node;
  cu_conv_t *convs;
  cu_lt_t *lts;
  cu_resize_t *resizes;
  /* Every device weight above, in the order prepare made them, with its
   * size (not owned here): what replicate() broadcasts. */
  struct cu_weight { void *p; size_t n; } *w;
  int n_w, cap_w;
} cu_node_t;

static int32_t cu_err(spn_error_t *err, const char *dev, cudaError_t ce, const char *what) {
  (void)cudaGetLastError();
  if (ce == cudaErrorMemoryAllocation)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of device memory (%s)", dev, what);
  return spn_error_set(err, SPN_ECUDA, "%s: %s: %s", dev, what, cudaGetErrorString(ce));
}

static int32_t dnn_err(spn_error_t *err, const char *dev, cudnnStatus_t st, const char *what) {
  if (st == CUDNN_STATUS_ALLOC_FAILED)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of device memory (cuDNN %s)", dev, what);
  return spn_error_set(err, SPN_ECUDA, "%s: cuDNN %s: %s", dev, what, cudnnGetErrorString(st));
}

#define CU(call, what)                                                   \
  do {                                                                   \
    cudaError_t ce__ = (call);                                           \
    if (ce__ != cudaSuccess)                                             \
      return cu_err(r->err, b->device, ce__, what);                      \
  } while (0)
#define DNN(call, what)                                                  \
  do {                                                                   \
    cudnnStatus_t st__ = (call);                                         \
    if (st__ != CUDNN_STATUS_SUCCESS)                                    \
      return dnn_err(r->err, b->device, st__, what);                     \
  } while (0)

static cudaStream_t run_stream(spn_backend_t *b, const spn_run_t *r) {
  return r->stream ? (cudaStream_t)r->stream : ((cu_ctx_t *)b->ctx)->stream;
}

static int64_t nelem(const spn_rt_val_t *v) {
  int64_t x = 1;
  for (int i = 0; i < v->ndim; i++)
    x *= v->shape[i];
  return x;
}

/* ---- support ---- */

static bool all_f32_inputs(const spn_model_t *m, const spn_node_t *n, int upto) {
  for (int k = 0; k < n->n_in && k < upto; k++)
    if (n->in[k] >= 0 && m->vals[n->in[k]].dtype != SPN_DTYPE_F32)
      return false;
  return true;
}

static bool const_in(const spn_model_t *m, const spn_node_t *n, int k) {
  return k < n->n_in && n->in[k] >= 0 && m->vals[n->in[k]].kind == SPN_VAL_CONST;
}

static bool sym_pads(const spn_node_t *n) {
  const char *ap = spn_attr_str(n, "auto_pad", "NOTSET");
  if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID"))
    return false;
  const spn_attr_t *p = spn_node_attr(n, "pads");
  if (!p)
    return true;
  for (int64_t i = 0; i < p->n / 2; i++)
    if (p->ints[i] != p->ints[i + p->n / 2])
      return false;
  return true;
}

/* A value computed on the host during shape inference (a shape-class node's
 * output, e.g. ConstantOfShape): host memory, never copied to the device. */
static bool host_value(const spn_model_t *m, int vi) {
  return m->vals[vi].kind != SPN_VAL_CONST && m->vals[vi].shape_class;
}

/* Whether this backend's kernels read input k of op in device memory (the
 * others — shapes, scales, pads, slice bounds, Clip bounds — are read on
 * the host). */
static bool read_on_device(int op, int k) {
  if (k == 0)
    return true;
  switch (op) {
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV: case SPN_OP_PRELU:
  case SPN_OP_CONCAT: case SPN_OP_MATMUL: case SPN_OP_GEMM: case SPN_OP_CONV: case SPN_OP_CONVT:
  case SPN_OP_BN:
    return true;
  default:
    return false;
  }
}

static bool cu_supports(spn_backend_t *b, const spn_model_t *m, const spn_node_t *n, char *why, size_t why_n) {
  (void)b;
  const char *no = NULL;
  int xin = n->n_in > 0 ? n->in[0] : -1;
  int32_t xdt = xin >= 0 ? m->vals[xin].dtype : 0;
  switch (n->op) {
  case SPN_OP_CONV:
  case SPN_OP_CONVT:
    if (!const_in(m, n, 1) || m->vals[n->in[1]].ndim != 4)
      no = "only 2-D convolutions with constant weights";
    else if (!all_f32_inputs(m, n, 3))
      no = "only fp32";
    else if (n->n_in > 2 && n->in[2] >= 0 && !const_in(m, n, 2))
      no = "the bias must be a constant";
    else if (!sym_pads(n))
      no = "asymmetric or automatic padding";
    else if (n->op == SPN_OP_CONVT && spn_node_attr(n, "output_shape"))
      no = "output_shape";
    break;
  case SPN_OP_BN:
    for (int k = 1; k < 5; k++)
      if (!const_in(m, n, k))
        no = "BatchNormalization with non-constant statistics";
    break;
  case SPN_OP_MATMUL: {
    /* cuBLASLt here: B of rank <= 2 (the batch folds into M), or both of one
     * rank with equal, known batch dims; else the CPU (1-D A, broadcast). */
    const spn_value_t *a = &m->vals[n->in[0]], *w = &m->vals[n->in[1]];
    bool ok = a->ndim >= 2 && w->ndim >= 1 && (w->ndim <= 2 || w->ndim == a->ndim);
    /* Batch dims known and equal, or both dynamic alike (the run checks
     * that they are equal and refuses a broadcast). */
    for (int d = 0; ok && w->ndim > 2 && d < a->ndim - 2; d++)
      ok = a->shape[d] == w->shape[d];
    if (!all_f32_inputs(m, n, 2))
      no = "only fp32";
    else if (!ok)
      no = "1-D, unknown-rank or broadcast-batch operands";
    break;
  }
  case SPN_OP_GEMM:
    if (!all_f32_inputs(m, n, 3))
      no = "only fp32";
    break;
  case SPN_OP_RELU: case SPN_OP_LRELU: case SPN_OP_SIGMOID: case SPN_OP_TANH: case SPN_OP_EXP:
  case SPN_OP_CLIP: case SPN_OP_SOFTMAX: case SPN_OP_PRELU: case SPN_OP_D2S: case SPN_OP_GAP:
  case SPN_OP_RESIZE: case SPN_OP_UPSAMPLE:
    if (xdt != SPN_DTYPE_F32)
      no = "only fp32";
    else if (spn_resize_is_cubic(n) && (m->vals[xin].ndim < 3 || m->vals[xin].ndim > 4))
      no = "cubic Resize of other than 1 or 2 spatial dims";
    break;
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV:
    if (!all_f32_inputs(m, n, 2))
      no = "only fp32";
    break;
  case SPN_OP_PAD:
    if (xdt != SPN_DTYPE_F32)
      no = "only fp32";
    break;
  case SPN_OP_MAXPOOL:
  case SPN_OP_AVGPOOL: {
    const spn_attr_t *ks = spn_node_attr(n, "kernel_shape");
    if (!ks || ks->n != 2 || xdt != SPN_DTYPE_F32)
      no = "only 2-D fp32 pooling";
    else if (!sym_pads(n))
      no = "asymmetric or automatic padding";
    else if (n->op == SPN_OP_MAXPOOL && n->n_out > 1 && n->out[1] >= 0)
      no = "MaxPool indices";
    break;
  }
  case SPN_OP_CONCAT: case SPN_OP_SPLIT: case SPN_OP_TRANSPOSE: case SPN_OP_SLICE:
  case SPN_OP_RESHAPE: case SPN_OP_FLATTEN: case SPN_OP_SQUEEZE: case SPN_OP_UNSQUEEZE: case SPN_OP_IDENTITY:
    break;
  default:
    no = "no CUDA kernel";
  }
  if (!no) {
    for (int p = 0; p < n->n_post; p++) {
      if (n->post[p].kind != SPN_POST_ADD && n->post[p].kind != SPN_POST_PRELU)
        continue;
      if (m->vals[n->post[p].val].dtype != SPN_DTYPE_F32)
        no = "non-fp32 fused operand";
      else if (host_value(m, n->post[p].val))
        no = "a fused operand computed on the host (shape arithmetic)";
    }
  }
  for (int k = 0; !no && k < n->n_in; k++) {
    int vi = n->in[k];
    if (vi < 0)
      continue;
    if (host_value(m, vi) && read_on_device(n->op, k))
      no = "a data operand computed on the host (shape arithmetic)";
    /* Bounds, pads, fill values, scales, shapes and slice bounds are read
     * on the host when the node is enqueued: a constant or a shape-class
     * value, never one a node on the device computes. */
    else if (!read_on_device(n->op, k) && m->vals[vi].kind != SPN_VAL_CONST && !host_value(m, vi))
      no = "an operand read on the host (bound, pad, scale or shape) computed by another node";
  }
  if (no)
    snprintf(why, why_n, "%s", no);
  return !no;
}

/* ---- prepare ---- */

/* `bytes` of device memory at *out; with src, holding its contents. */
static int32_t upload(spn_backend_t *b, const void *src, size_t bytes, void **out, spn_error_t *err) {
  const char *what = src ? "uploading weights" : "allocating weights";
  cudaError_t ce = cudaMalloc(out, bytes ? bytes : 4);
  if (ce != cudaSuccess) {
    *out = NULL;
    return cu_err(err, b->device, ce, what);
  }
  ce = src ? cudaMemcpy(*out, src, bytes, cudaMemcpyHostToDevice) : cudaSuccess;
  /* From pageable memory cudaMemcpy may return once the bytes are staged,
   * before the DMA lands; the model's runs are on non-blocking streams,
   * which do not wait for the legacy stream that copy is on. Wait for it
   * (load time only). */
  if (ce == cudaSuccess && src)
    ce = cudaStreamSynchronize(cudaStreamLegacy);
  return ce == cudaSuccess ? SPN_OK : cu_err(err, b->device, ce, what);
}

/* A weight of node c: `bytes` of device memory holding src, or, in a model
 * whose weights come from another GPU (m->weights_deferred), left for
 * replicate() to fill. Recorded in c->w so replicate() finds the same
 * weights in the same order in every copy of the model. */
static int32_t weight(spn_backend_t *b, const spn_model_t *m, cu_node_t *c, const void *src, size_t bytes, void **out,
                      spn_error_t *err) {
  if (c->n_w == c->cap_w) {
    int cap = c->cap_w ? 2 * c->cap_w : 8;
    struct cu_weight *w = realloc(c->w, (size_t)cap * sizeof *w);
    if (!w)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    c->w = w;
    c->cap_w = cap;
  }
  int32_t rc = upload(b, m->weights_deferred ? NULL : src, bytes, out, err);
  if (rc != SPN_OK)
    return rc;
  c->w[c->n_w++] = (struct cu_weight){*out, bytes};
  return SPN_OK;
}

static size_t value_bytes(const spn_value_t *v) {
  size_t n = spn_dtype_size(v->dtype);
  for (int d = 0; d < v->ndim; d++)
    n *= (size_t)v->shape[d];
  return n;
}

/* Input k of n is an fp16 tensor-core operand at this model's precision:
 * the weight of a convolution, either matrix of MatMul/Gemm (not Gemm's C). */
static bool half_operand(const spn_model_t *m, const spn_node_t *n, int k) {
  if (m->precision != SPN_PREC_FP16 || k >= n->n_in || n->in[k] < 0 || m->vals[n->in[k]].dtype != SPN_DTYPE_F32)
    return false;
  if (n->op == SPN_OP_CONV || n->op == SPN_OP_CONVT)
    return k == 1;
  if (n->op == SPN_OP_MATMUL || n->op == SPN_OP_GEMM)
    return k == 0 || k == 1;
  return false;
}

/* A convolution this backend runs on fp16 channels-last tensors: fp16 with
 * SPINDLE_CUDA_NHWC=1, 2-D, ungrouped or depthwise (a Conv with as many
 * groups as input channels and one output channel per group: MobileNet's,
 * RetinaFace's); other grouped layers keep the NCHW path and convert at
 * their edges. Sets its channel counts, and pads each to a multiple of 8,
 * what cuDNN's NHWC tensor-core kernels take (a 3- or 6-channel first layer
 * reads zero channels beside its input; a 3-channel last layer writes three
 * it drops; a depthwise layer gets a group of one zero channel for each it
 * adds). */
static bool nhwc_conv(spn_backend_t *b, const spn_model_t *m, const spn_node_t *n, cu_node_t *c) {
  const cu_ctx_t *cx = b->ctx;
  if (!cx->nhwc || m->precision != SPN_PREC_FP16 || (n->op != SPN_OP_CONV && n->op != SPN_OP_CONVT) ||
      !const_in(m, n, 1) || m->vals[n->in[1]].ndim != 4)
    return false;
  /* Conv weights are (C_out, C_in / group, R, S), ConvTranspose's (C_in,
   * C_out / group, R, S). */
  const int64_t *ws = m->vals[n->in[1]].shape;
  int64_t g = spn_attr_int(n, "group", 1);
  bool tr = n->op == SPN_OP_CONVT;
  if (g != 1) {
    if (tr || g < 1 || ws[0] != g || ws[1] != 1)
      return false;
    c->dw = true;
    c->cin = c->cout = g;
    c->cin_p = c->cout_p = (g + 7) / 8 * 8;
    return true;
  }
  c->cin = tr ? ws[0] : ws[1];
  c->cout = tr ? ws[1] : ws[0];
  c->cin_p = (c->cin + 7) / 8 * 8;
  c->cout_p = (c->cout + 7) / 8 * 8;
  return c->cin > 0 && c->cout > 0;
}

/* A channels-last convolution's weights: fp16, (d0, d1, R, S) reordered to
 * (p0, R, S, p1) with the added channels zero (d0, d1 = the weight's first
 * two dims, p0, p1 = them padded; a depthwise layer's d1 = p1 = 1). Caller
 * frees. */
static uint16_t *nhwc_weights(const float *w, const cu_node_t *c, bool tr, int64_t rs, size_t *bytes) {
  int64_t d0 = tr ? c->cin : c->cout, d1 = tr ? c->cout : c->cin;
  int64_t p0 = tr ? c->cin_p : c->cout_p, p1 = tr ? c->cout_p : c->cin_p;
  if (c->dw)
    d1 = p1 = 1;
  size_t cnt = (size_t)(d0 * d1 * rs), pcnt = (size_t)(p0 * p1 * rs);
  uint16_t *h = malloc(cnt * sizeof(uint16_t) + 2);
  uint16_t *out = calloc(pcnt + 1, sizeof(uint16_t)); /* fp16 +0 is all zero bits */
  if (!h || !out) {
    free(h);
    free(out);
    return NULL;
  }
  spn_f32_to_f16_n(w, h, cnt);
  for (int64_t a = 0; a < d0; a++)
    for (int64_t q = 0; q < rs; q++)
      for (int64_t k = 0; k < d1; k++)
        out[(a * rs + q) * p1 + k] = h[(a * d1 + k) * rs + q];
  free(h);
  *bytes = pcnt * sizeof(uint16_t);
  return out;
}

/* A MatMul/Gemm entry's cuBLASLt descriptors and the entry. */
static void lt_entry_free(cu_ctx_t *cx, cu_lt_t *e) {
  if (e->la) cx->lt_api.MatrixLayoutDestroy(e->la);
  if (e->lb) cx->lt_api.MatrixLayoutDestroy(e->lb);
  if (e->lc) cx->lt_api.MatrixLayoutDestroy(e->lc);
  if (e->desc) cx->lt_api.MatmulDescDestroy(e->desc);
  free(e);
}

static void cu_node_free(spn_backend_t *b, spn_node_t *n) {
  (void)b;
  cu_node_t *c = n->bctx;
  if (!c)
    return;
  for (int k = 0; k < c->n_c; k++)
    cudaFree(c->cdata[k]);
  free(c->cdata);
  free(c->half);
  for (int p = 0; p < SPN_MAX_POST; p++)
    cudaFree(c->post_c[p]);
  cudaFree(c->bn_scale);
  cudaFree(c->bn_shift);
  cudaFree(c->zero_bias);
  free(c->w);
  for (cu_conv_t *e = c->convs, *nx; e; e = nx) {
    nx = e->next;
    cudnnDestroyTensorDescriptor(e->x);
    cudnnDestroyTensorDescriptor(e->y);
    cudnnDestroyTensorDescriptor(e->bias);
    cudnnDestroyFilterDescriptor(e->w);
    cudnnDestroyConvolutionDescriptor(e->conv);
    cudnnDestroyActivationDescriptor(e->act);
    free(e);
  }
  for (cu_lt_t *e = c->lts, *nx; e; e = nx) {
    nx = e->next;
    lt_entry_free(b->ctx, e);
  }
  for (cu_resize_t *e = c->resizes, *nx; e; e = nx) {
    nx = e->next;
    cudaFree(e->i01);
    cudaFree(e->w);
    free(e);
  }
  free(c);
  n->bctx = NULL;
}

static int32_t cu_prepare(spn_backend_t *b, spn_model_t *m, spn_node_t *n, spn_error_t *err) {
  cu_ctx_t *cx = b->ctx;
  cudaSetDevice(cx->dev);
  cu_node_t *c = calloc(1, sizeof *c);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  n->bctx = c;
  c->n_c = n->n_in;
  c->cdata = calloc((size_t)n->n_in + 1, sizeof *c->cdata);
  c->half = calloc((size_t)n->n_in + 1, sizeof *c->half);
  if (!c->cdata || !c->half)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  c->nhwc = nhwc_conv(b, m, n, c);
  int32_t rc = SPN_OK;
  for (int k = 0; k < n->n_in && !rc; k++) {
    if (!const_in(m, n, k))
      continue;
    const spn_value_t *v = &m->vals[n->in[k]];
    if (half_operand(m, n, k) && c->nhwc && k == 1) {
      /* A channels-last convolution's weights: fp16, K,R,S,C, padded. */
      size_t bytes = 0;
      uint16_t *w = nhwc_weights(v->data, c, n->op == SPN_OP_CONVT, v->shape[2] * v->shape[3], &bytes);
      if (!w)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      rc = weight(b, m, c, w, bytes, &c->cdata[k], err);
      free(w);
      c->half[k] = true;
    } else if (half_operand(m, n, k)) {
      /* fp16 weights, converted once here (round to nearest even). */
      size_t cnt = value_bytes(v) / sizeof(float);
      uint16_t *h = malloc(cnt ? cnt * sizeof(uint16_t) : 2);
      if (!h)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      spn_f32_to_f16_n(v->data, h, cnt);
      rc = weight(b, m, c, h, cnt * sizeof(uint16_t), &c->cdata[k], err);
      free(h);
      c->half[k] = true;
    } else {
      rc = weight(b, m, c, v->data, value_bytes(v), &c->cdata[k], err);
    }
  }
  for (int p = 0; p < n->n_post && !rc; p++) {
    const spn_post_t *po = &n->post[p];
    if ((po->kind == SPN_POST_ADD || po->kind == SPN_POST_PRELU) && m->vals[po->val].kind == SPN_VAL_CONST)
      rc = weight(b, m, c, m->vals[po->val].data, value_bytes(&m->vals[po->val]), &c->post_c[p], err);
  }
  if (!rc && n->op == SPN_OP_BN) {
    const spn_value_t *g = &m->vals[n->in[1]], *be = &m->vals[n->in[2]], *mu = &m->vals[n->in[3]], *var = &m->vals[n->in[4]];
    int64_t C = g->ndim ? g->shape[0] : 1;
    float eps = spn_attr_float(n, "epsilon", 1e-5f);
    float *sc = malloc((size_t)C * 2 * sizeof(float));
    if (!sc)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    for (int64_t i = 0; i < C; i++) {
      float s = ((const float *)g->data)[i] / sqrtf(((const float *)var->data)[i] + eps);
      sc[i] = s;
      sc[C + i] = ((const float *)be->data)[i] - ((const float *)mu->data)[i] * s;
    }
    rc = weight(b, m, c, sc, (size_t)C * sizeof(float), (void **)&c->bn_scale, err);
    if (!rc)
      rc = weight(b, m, c, sc + C, (size_t)C * sizeof(float), (void **)&c->bn_shift, err);
    free(sc);
  }
  if (!rc && n->op == SPN_OP_CONV && m->precision != SPN_PREC_FP16) {
    /* cuDNN fuses bias + ReLU (+ a residual added before the ReLU); in fp16
     * the bias is added by the cast back to fp32 instead. */
    if (n->n_post >= 1 && n->post[0].kind == SPN_POST_RELU)
      c->n_fused = 1;
    else if (n->n_post >= 2 && n->post[0].kind == SPN_POST_ADD && n->post[1].kind == SPN_POST_RELU &&
             m->vals[n->post[0].val].kind != SPN_VAL_CONST)
      c->n_fused = 2;
    if (c->n_fused && !(n->n_in > 2 && n->in[2] >= 0)) {
      int64_t K = m->vals[n->in[1]].shape[0];
      float *z = calloc((size_t)K, sizeof(float));
      if (!z)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      rc = weight(b, m, c, z, (size_t)K * sizeof(float), (void **)&c->zero_bias, err);
      free(z);
    }
  }
  return rc;
}

/* A constant input the kernels read from its device copy (read_on_device;
 * in_ptr, h_operand), or a constant post-op operand (post_c): prepare made
 * the copy from the host data and nothing reads that again. The constants
 * read on the host (shapes, scales, pads, Clip bounds) are not owned: they
 * were uploaded too, but compute and prepare_shape read the host copy. */
static bool cu_owns_const(spn_backend_t *b, const spn_model_t *m, const spn_node_t *n, int k) {
  (void)b;
  (void)m;
  const cu_node_t *c = n->bctx;
  if (!c)
    return false;
  if (k < n->n_in)
    return k < c->n_c && c->cdata[k] && read_on_device(n->op, k);
  return k - n->n_in < n->n_post && c->post_c[k - n->n_in];
}

/* ---- helpers on the run path ---- */

static const void *in_ptr(const spn_run_t *r, const spn_node_t *n, int k) {
  const cu_node_t *c = n->bctx;
  if (k < c->n_c && c->cdata[k])
    return c->cdata[k];
  return r->v[n->in[k]].data;
}

static bool in_half(const spn_node_t *n, int k) {
  const cu_node_t *c = n->bctx;
  return k < c->n_c && c->half[k];
}

/* The run's scratch on this backend (workspace and fp16 casts), sized by
 * prepare_shape() for these shapes; need > its size means the shapes were
 * not prepared, which is a bug, reported rather than overrun. */
static int32_t scratch(spn_backend_t *b, spn_run_t *r, size_t need, uint8_t **out) {
  *out = r->bws[b->slot];
  if (need > r->bws_n[b->slot] || (need && !*out))
    return spn_error_set(r->err, SPN_EINTERNAL, "%s: %zu scratch bytes needed, %zu planned for these shapes", b->device, need, r->bws_n[b->slot]);
  return SPN_OK;
}

/* Shape keys: rank, then the dims (SPN_MAXD + 1 entries). */
static bool same_shape(const int64_t *key, const spn_rt_val_t *v) {
  if (key[0] != v->ndim)
    return false;
  for (int d = 0; d < v->ndim; d++)
    if (key[d + 1] != v->shape[d])
      return false;
  return true;
}

static void shape_key(int64_t *key, const spn_rt_val_t *v) {
  memset(key, 0, (SPN_MAXD + 1) * sizeof *key);
  key[0] = v->ndim;
  for (int d = 0; d < v->ndim; d++)
    key[d + 1] = v->shape[d];
}

/* Broadcast strides of `a` within output shape `y` (0 on broadcast dims). */
static void bcast_nd(const spn_rt_val_t *a, const spn_rt_val_t *y, spn_cu_nd_t *g) {
  g->nd = y->ndim;
  int64_t s = 1;
  for (int i = y->ndim - 1; i >= 0; i--) {
    int ia = i - (y->ndim - a->ndim);
    int64_t d = ia >= 0 ? a->shape[ia] : 1;
    g->shape[i] = y->shape[i];
    g->st[i] = d == 1 ? 0 : s;
    s *= d;
  }
}

static int32_t binary(spn_backend_t *b, spn_run_t *r, int op, const spn_rt_val_t *av, const void *ap,
                      const spn_rt_val_t *bv, const void *bp, spn_rt_val_t *y, void *yp) {
  if (y->ndim > SPN_CU_MAXD)
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "more than %d dims", SPN_CU_MAXD);
  spn_cu_nd_t ga, gb;
  bcast_nd(av, y, &ga);
  bcast_nd(bv, y, &gb);
  CU(spn_cu_binary(op, ap, bp, yp, &ga, &gb, run_stream(b, r)), "binary kernel");
  return SPN_OK;
}

/* A fused activation's kernel code (-1: Add or PRelu, a binary step). */
static int post_unary(int kind) {
  switch (kind) {
  case SPN_POST_RELU: return SPN_CU_RELU;
  case SPN_POST_LRELU: return SPN_CU_LRELU;
  case SPN_POST_SIGMOID: return SPN_CU_SIGMOID;
  case SPN_POST_TANH: return SPN_CU_TANH;
  case SPN_POST_CLIP: return SPN_CU_CLIP;
  default: return -1;
  }
}

/* An element-wise node's binary kernel code. */
static int binary_code(int op) {
  switch (op) {
  case SPN_OP_ADD: return SPN_CU_ADD;
  case SPN_OP_SUB: return SPN_CU_SUB;
  case SPN_OP_MUL: return SPN_CU_MUL;
  case SPN_OP_DIV: return SPN_CU_DIV;
  default: return SPN_CU_PRELU;
  }
}

/* Post-ops [from, n_post) on y (NCHW, fp32). */
static int32_t posts(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, int from, spn_rt_val_t *y) {
  const cu_node_t *c = n->bctx;
  cudaStream_t s = run_stream(b, r);
  int64_t cnt = nelem(y);
  for (int p = from; p < n->n_post; p++) {
    const spn_post_t *po = &n->post[p];
    int u = post_unary(po->kind);
    if (u >= 0) { /* a, b: LeakyRelu's slope, Clip's bounds; the others ignore them */
      CU(spn_cu_unary(u, y->data, y->data, cnt, po->a, po->b, s), "post-op");
      continue;
    }
    const spn_rt_val_t *o = &r->v[po->val];
    const void *op = c->post_c[p] ? c->post_c[p] : o->data;
    int32_t rc = binary(b, r, po->kind == SPN_POST_ADD ? SPN_CU_ADD : SPN_CU_PRELU, y, y->data, o, op, y, y->data);
    if (rc)
      return rc;
  }
  return SPN_OK;
}


/* ---- fp16 channels-last steps ---- */

static bool same_dims(const spn_rt_val_t *a, const spn_rt_val_t *y) {
  return a->ndim == y->ndim && !memcmp(a->shape, y->shape, (size_t)y->ndim * sizeof(int64_t));
}

/* Operand vi of a binary step on y: fp16 channels-last of y's shape, or a
 * constant (dev: its device copy) of one element or one per channel. */
static int32_t h_operand(spn_backend_t *b, spn_run_t *r, int vi, const void *dev, const spn_rt_val_t *y,
                         spn_cu_hstep_t *st) {
  const spn_value_t *mv = &r->m->vals[vi];
  if (mv->kind == SPN_VAL_CONST) {
    int64_t cnt = 1;
    for (int d = 0; d < mv->ndim; d++)
      cnt *= mv->shape[d];
    if (cnt != 1 && cnt != y->shape[1])
      return spn_error_set(r->err, SPN_EINTERNAL, "%s: a constant of %lld elements on %lld channels (fp16 channels-last)", b->device, (long long)cnt, (long long)y->shape[1]);
    st->f = dev;
    st->per_channel = cnt > 1;
    return SPN_OK;
  }
  const spn_rt_val_t *v = &r->v[vi];
  if (!same_dims(v, y))
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "%s: fp16 channels-last operands of different shapes (a broadcast); run with SPINDLE_CUDA_NHWC=0", b->device);
  st->h = v->data;
  return SPN_OK;
}

/* Node n's post-ops as one chain on its fp16 channels-last output y. */
static int32_t h_chain_posts(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, const spn_rt_val_t *y,
                             spn_cu_hchain_t *ch) {
  const cu_node_t *c = n->bctx;
  memset(ch, 0, sizeof *ch);
  for (int p = 0; p < n->n_post; p++) {
    const spn_post_t *po = &n->post[p];
    spn_cu_hstep_t *st = &ch->s[ch->n++];
    st->unary = post_unary(po->kind);
    st->a = po->a;
    st->b = po->b;
    if (st->unary < 0) {
      st->binary = po->kind == SPN_POST_ADD ? SPN_CU_ADD : SPN_CU_PRELU;
      int32_t rc = h_operand(b, r, po->val, c->post_c[p], y, st);
      if (rc)
        return rc;
    }
  }
  return SPN_OK;
}

/* Clip's bounds: attributes before opset 11, else optional inputs (constants
 * or shape-class values: host memory). */
static void clip_bounds(const spn_run_t *r, const spn_node_t *n, float *lo, float *hi) {
  *lo = -INFINITY;
  *hi = INFINITY;
  if (r->m->opset < 11) {
    *lo = spn_attr_float(n, "min", *lo);
    *hi = spn_attr_float(n, "max", *hi);
  } else {
    if (n->n_in > 1 && n->in[1] >= 0) *lo = *(const float *)r->v[n->in[1]].data;
    if (n->n_in > 2 && n->in[2] >= 0) *hi = *(const float *)r->v[n->in[2]].data;
  }
}

/* Concat as row copies: the output is `rows` rows of y->shape[ax] units of
 * `unit` bytes, and input k fills its shape[ax] units of every row (NCHW:
 * rows = the dims before the axis, unit = the elements after it times
 * their size; fp16 channels-last along C: rows = the pixels, unit = 2). */
static int32_t concat_rows(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, int ax, size_t rows, size_t unit) {
  spn_rt_val_t *y = &r->v[n->out[0]];
  size_t orow = (size_t)y->shape[ax] * unit, pos = 0;
  for (int k = 0; k < n->n_in; k++) {
    size_t chunk = (size_t)r->v[n->in[k]].shape[ax] * unit;
    if (chunk && rows)
      CU(cudaMemcpy2DAsync((uint8_t *)y->data + pos, orow, in_ptr(r, n, k), chunk, chunk, rows,
                           cudaMemcpyDeviceToDevice, run_stream(b, r)),
         "Concat");
    pos += chunk;
  }
  return SPN_OK;
}

static int32_t get_resize(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, cu_resize_t **out);
static int32_t exec_resize_h(spn_backend_t *b, spn_run_t *r, const spn_node_t *n);

/* An element-wise node on fp16 channels-last values (plan_forms). */
static int32_t exec_h(spn_backend_t *b, spn_run_t *r, const spn_node_t *n) {
  spn_rt_val_t *y = &r->v[n->out[0]];
  cudaStream_t s = run_stream(b, r);
  if (y->ndim != 4)
    return spn_error_set(r->err, SPN_EINTERNAL, "%s: an fp16 channels-last value of rank %d", b->device, y->ndim);
  if (n->op == SPN_OP_CONCAT) /* along C: each input fills its C-slice of every pixel */
    return concat_rows(b, r, n, 1, (size_t)(y->shape[0] * y->shape[2] * y->shape[3]), 2);
  if (n->op == SPN_OP_RESIZE || n->op == SPN_OP_UPSAMPLE)
    return exec_resize_h(b, r, n);
  spn_cu_hchain_t ch;
  memset(&ch, 0, sizeof ch);
  ch.n = 1;
  spn_cu_hstep_t *st = &ch.s[0];
  st->unary = -1;
  int a = 0; /* the operand the chain starts from */
  int32_t rc = SPN_OK;
  switch (n->op) {
  case SPN_OP_RELU: st->unary = SPN_CU_RELU; break;
  case SPN_OP_LRELU: st->unary = SPN_CU_LRELU; st->a = spn_attr_float(n, "alpha", 0.01f); break;
  case SPN_OP_SIGMOID: st->unary = SPN_CU_SIGMOID; break;
  case SPN_OP_TANH: st->unary = SPN_CU_TANH; break;
  case SPN_OP_CLIP: st->unary = SPN_CU_CLIP; clip_bounds(r, n, &st->a, &st->b); break;
  case SPN_OP_PRELU:
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV: {
    st->binary = binary_code(n->op);
    a = const_in(r->m, n, 0) ? 1 : 0; /* a constant first operand: Add and Mul only (plan_forms) */
    rc = h_operand(b, r, n->in[1 - a], in_ptr(r, n, 1 - a), y, st);
    break;
  }
  default:
    return spn_error_set(r->err, SPN_EINTERNAL, "%s: no fp16 channels-last kernel", b->device);
  }
  if (rc)
    return rc;
  if (!same_dims(&r->v[n->in[a]], y))
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "%s: fp16 channels-last operands of different shapes (a broadcast); run with SPINDLE_CUDA_NHWC=0", b->device);
  CU(spn_cu_h_map(r->v[n->in[a]].data, y->data, NULL, nelem(y), y->shape[1], &ch, s), "fp16 channels-last element-wise");
  return SPN_OK;
}

/* ---- convolution ---- */

static cu_conv_t *find_conv(cu_node_t *c, const spn_rt_val_t *x) {
  for (cu_conv_t *e = c->convs; e; e = e->next)
    if (!memcmp(e->key, x->shape, 4 * sizeof(int64_t)))
      return e;
  return NULL;
}

/* Whether an algorithm's math type keeps the model's precision: fp32 takes
 * FMA math only (no TF32 tensor cores), tf32 anything but down-conversion to
 * fp16, fp16 anything. */
static bool math_ok(int prec, cudnnMathType_t mt) {
  if (prec == SPN_PREC_FP32)
    return mt == CUDNN_FMA_MATH;
  if (prec == SPN_PREC_TF32)
    return mt != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  return true;
}

/* ---- convolution algorithm cache ---- */

/* One convolution problem's algorithm: its key (the problem as text,
 * get_conv), the algorithm, the math type it was timed with and its
 * workspace. */
typedef struct cu_algo {
  char *key;
  int algo, math;
  size_t ws;
  struct cu_algo *next;
} cu_algo_t;

#define CU_ALGO_FILE_HEAD "spindle cudnn algorithms 1"

static cu_algo_t *algo_find(cu_ctx_t *cx, const char *key) {
  for (cu_algo_t *a = cx->algos; a; a = a->next)
    if (!strcmp(a->key, key))
      return a;
  return NULL;
}

/* Keep (or replace) key's choice; false when out of memory. */
static bool algo_put(cu_ctx_t *cx, const char *key, int algo, int math, size_t ws) {
  cu_algo_t *a = algo_find(cx, key);
  if (!a) {
    char *k = strdup(key);
    if (!k || !(a = calloc(1, sizeof *a))) {
      free(k);
      return false;
    }
    a->key = k;
    a->next = cx->algos;
    cx->algos = a;
  }
  a->algo = algo;
  a->math = math;
  a->ws = ws;
  return true;
}

/* Append one choice to the cache file: one short line in one write() to a
 * file opened O_APPEND, so processes sharing the file do not interleave
 * lines. A failure only costs the next process a timing. */
static void algo_save(cu_ctx_t *cx, const char *key, int algo, int math, size_t ws) {
  if (!cx->algo_file)
    return;
  int fd = open(cx->algo_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return;
  char line[512];
  struct stat sb;
  int n = 0;
  if (fstat(fd, &sb) == 0 && sb.st_size == 0)
    n = snprintf(line, sizeof line, "%s\n", CU_ALGO_FILE_HEAD);
  n += snprintf(line + n, sizeof line - (size_t)n, "%s %d %d %zu\n", key, algo, math, ws);
  if (n > 0 && (size_t)n < sizeof line) {
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
  }
  close(fd);
}

/* The cache file of this GPU model and cuDNN version, read into cx->algos
 * (lines it cannot read are skipped and counted), in Spindle's cache
 * directory (spn_models_cache_dir). None with SPINDLE_CUDNN_CACHE=0 or
 * without a place to put it. */
static void algos_open(cu_ctx_t *cx, const char *device) {
  const char *off = getenv("SPINDLE_CUDNN_CACHE");
  char dir[4096];
  if ((off && (!strcmp(off, "0") || !strcmp(off, "off"))) || spn_models_cache_dir(dir, sizeof dir))
    return;
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, cx->dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  char name[64];
  size_t k = 0;
  for (const char *c = prop.name; *c && k + 1 < sizeof name; c++)
    name[k++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ? *c : '-';
  name[k] = 0;
  char path[4096 + 160];
  snprintf(path, sizeof path, "%s/cudnn-algos-%s-sm%d%d-cudnn%zu.txt", dir, name, prop.major, prop.minor,
           (size_t)cudnnGetVersion());
  if (spn_models_mkdir_p(dir) || !(cx->algo_file = strdup(path)))
    return;
  FILE *f = fopen(path, "re");
  if (!f)
    return; /* a first process: nothing yet */
  char line[512], key[400];
  int n = 0, bad = 0, algo, math;
  size_t ws;
  bool head = fgets(line, sizeof line, f) && !strncmp(line, CU_ALGO_FILE_HEAD, strlen(CU_ALGO_FILE_HEAD));
  while (head && fgets(line, sizeof line, f)) {
    if (sscanf(line, "%399s %d %d %zu", key, &algo, &math, &ws) == 4 && algo >= 0 && math >= 0 && ws <= CU_WS_MAX &&
        algo_put(cx, key, algo, math, ws))
      n++;
    else
      bad++;
  }
  fclose(f);
  if (!head) { /* another format (or not ours): started again */
    fprintf(stderr, "spindle engine: %s: %s is not an algorithm cache of this version: replaced\n", device, path);
    unlink(path);
  } else if (n || bad) {
    fprintf(stderr, "spindle engine: %s: %d convolution algorithms from %s", device, n, path);
    if (bad)
      fprintf(stderr, " (lines skipped: %d)", bad);
    fprintf(stderr, "\n");
  }
}

static void algos_free(cu_ctx_t *cx) {
  for (cu_algo_t *a = cx->algos, *nx; a; a = nx) {
    nx = a->next;
    free(a->key);
    free(a);
  }
  cx->algos = NULL;
  free(cx->algo_file);
  cx->algo_file = NULL;
}

/* A timed choice: kept for the process, and in the file (a heuristic
 * choice is neither: it is cheap to make again, and not a timing). */
static void algo_keep(cu_ctx_t *cx, const char *key, int algo, int math, size_t ws) {
  if (cx->heuristic || !algo_put(cx, key, algo, math, ws))
    return;
  algo_save(cx, key, algo, math, ws);
}

/* Descriptors and algorithm of node n for input x's shape, built once.
 * The algorithm is the fastest that cuDNN measures on this GPU for this
 * shape (cudnnFind*, as PyTorch's cudnn.benchmark; once per convolution
 * problem, at the first run of a shape that meets it, or never when the
 * cache holds it) within the workspace cap and the model's precision; SPINDLE_CUDNN_HEURISTIC=1 takes cuDNN's heuristic order
 * instead (no timing, for a quicker first run). */
static int32_t get_conv(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, bool tr, cu_conv_t **out) {
  cu_ctx_t *cx = b->ctx;
  cu_node_t *c = n->bctx;
  const spn_rt_val_t *x = &r->v[n->in[0]], *w = &r->v[n->in[1]], *y = &r->v[n->out[0]];
  if (x->ndim != 4 || y->ndim != 4 || w->ndim != 4)
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "only 2-D convolutions on %s", b->device);
  if ((*out = find_conv(c, x)))
    return SPN_OK;
  int64_t st[2], dil[2], pl[2], pr[2], osp[2];
  int32_t rc = spn_conv_geometry(n, x, w, tr, st, dil, pl, pr, osp, r->err);
  if (rc)
    return rc;
  cu_conv_t *e = calloc(1, sizeof *e);
  if (!e)
    return spn_error_set(r->err, SPN_ENOMEM, "out of memory");
  memcpy(e->key, x->shape, 4 * sizeof(int64_t));
  e->key[0] = -1; /* not findable until complete */
  e->next = c->convs;
  c->convs = e; /* freed with the node even when building fails half-way */
  int g = (int)spn_attr_int(n, "group", 1);
  int prec = r->m->precision;
  /* fp16: fp16 tensors, fp32 accumulation (cuDNN's "pseudo half"), tensor
   * cores; tf32: cuDNN's default math (TF32 tensor cores); fp32: FMA only. */
  cudnnDataType_t dt = prec == SPN_PREC_FP16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  cudnnMathType_t mt = prec == SPN_PREC_FP16 ? CUDNN_TENSOR_OP_MATH : prec == SPN_PREC_TF32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  DNN(cudnnCreateTensorDescriptor(&e->x), "descriptor");
  DNN(cudnnCreateTensorDescriptor(&e->y), "descriptor");
  DNN(cudnnCreateTensorDescriptor(&e->bias), "descriptor");
  DNN(cudnnCreateFilterDescriptor(&e->w), "descriptor");
  DNN(cudnnCreateConvolutionDescriptor(&e->conv), "descriptor");
  DNN(cudnnCreateActivationDescriptor(&e->act), "descriptor");
  /* A channels-last convolution: NHWC tensors, K,R,S,C filter (the dims are
   * still given as N, C, H, W and K, C, R, S). */
  cudnnTensorFormat_t fmt = c->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  int64_t xc = x->shape[1], yc = y->shape[1], w0 = w->shape[0], w1 = w->shape[1];
  if (c->nhwc) { /* the padded channel counts; a depthwise layer's groups with them */
    xc = c->cin_p;
    yc = c->cout_p;
    w0 = tr ? c->cin_p : c->cout_p;
    w1 = c->dw ? 1 : tr ? c->cout_p : c->cin_p;
    if (c->dw)
      g = (int)c->cout_p;
  }
  DNN(cudnnSetTensor4dDescriptor(e->x, fmt, dt, (int)x->shape[0], (int)xc, (int)x->shape[2], (int)x->shape[3]), "input descriptor");
  DNN(cudnnSetTensor4dDescriptor(e->y, fmt, dt, (int)y->shape[0], (int)yc, (int)y->shape[2], (int)y->shape[3]), "output descriptor");
  DNN(cudnnSetTensor4dDescriptor(e->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, (int)y->shape[1], 1, 1), "bias descriptor");
  DNN(cudnnSetFilter4dDescriptor(e->w, dt, fmt, (int)w0, (int)w1, (int)w->shape[2], (int)w->shape[3]), "filter descriptor");
  DNN(cudnnSetConvolution2dDescriptor(e->conv, (int)pl[0], (int)pl[1], (int)st[0], (int)st[1], (int)dil[0], (int)dil[1], CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), "convolution descriptor");
  DNN(cudnnSetConvolutionGroupCount(e->conv, g), "group count");
  DNN(cudnnSetConvolutionMathType(e->conv, mt), "math type");
  DNN(cudnnSetActivationDescriptor(e->act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0), "activation");
  /* The problem as cuDNN sees it: a choice made for it before (this
   * process, or one that wrote the cache file) is taken when cuDNN still
   * gives that algorithm a workspace (a cache from another build of the
   * same version may not hold). */
  char key[400];
  snprintf(key, sizeof key,
           "%c%d:%d:%d:x%lldx%lldx%lldx%lld:y%lldx%lldx%lldx%lld:w%lldx%lldx%lldx%lld:p%lld,%lld:s%lld,%lld:d%lld,%lld:g%d",
           tr ? 'B' : 'F', (int)fmt, (int)dt, (int)mt, (long long)x->shape[0], (long long)xc, (long long)x->shape[2],
           (long long)x->shape[3], (long long)y->shape[0], (long long)yc, (long long)y->shape[2],
           (long long)y->shape[3], (long long)w0, (long long)w1, (long long)w->shape[2], (long long)w->shape[3],
           (long long)pl[0], (long long)pl[1], (long long)st[0], (long long)st[1], (long long)dil[0],
           (long long)dil[1], g);
  const cu_algo_t *known = cx->heuristic ? NULL : algo_find(cx, key);
  bool reused = false;
  if (known && math_ok(prec, (cudnnMathType_t)known->math) &&
      cudnnSetConvolutionMathType(e->conv, (cudnnMathType_t)known->math) == CUDNN_STATUS_SUCCESS) {
    size_t ws = 0;
    cudnnStatus_t ks = tr ? cudnnGetConvolutionBackwardDataWorkspaceSize(cx->dnn, e->w, e->x, e->conv, e->y,
                                                                        (cudnnConvolutionBwdDataAlgo_t)known->algo, &ws)
                          : cudnnGetConvolutionForwardWorkspaceSize(cx->dnn, e->x, e->w, e->conv, e->y,
                                                                    (cudnnConvolutionFwdAlgo_t)known->algo, &ws);
    if (ks == CUDNN_STATUS_SUCCESS && ws <= CU_WS_MAX) {
      e->algo = known->algo;
      e->ws = ws;
      reused = true;
    } else {
      DNN(cudnnSetConvolutionMathType(e->conv, mt), "math type"); /* time them after all */
    }
  }
  int got = 0, picked_math = 0;
  if (reused) {
    /* nothing to time */
  } else if (!tr) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    if (cx->heuristic)
      DNN(cudnnGetConvolutionForwardAlgorithm_v7(cx->dnn, e->x, e->w, e->conv, e->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf), "algorithm choice");
    else
      DNN(cudnnFindConvolutionForwardAlgorithm(cx->dnn, e->x, e->w, e->conv, e->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf), "algorithm timing");
    int pick = -1;
    for (int i = 0; i < got && pick < 0; i++)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= CU_WS_MAX && math_ok(prec, perf[i].mathType))
        pick = i;
    if (pick < 0)
      return spn_error_set(r->err, SPN_EUNSUPPORTED, "%s: cuDNN has no forward algorithm for this convolution", b->device);
    e->algo = (int)perf[pick].algo;
    e->ws = perf[pick].memory;
    picked_math = (int)perf[pick].mathType;
    DNN(cudnnSetConvolutionMathType(e->conv, perf[pick].mathType), "math type");
  } else {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    if (cx->heuristic)
      DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(cx->dnn, e->w, e->x, e->conv, e->y, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf), "algorithm choice");
    else
      DNN(cudnnFindConvolutionBackwardDataAlgorithm(cx->dnn, e->w, e->x, e->conv, e->y, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf), "algorithm timing");
    int pick = -1;
    for (int i = 0; i < got && pick < 0; i++)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= CU_WS_MAX && math_ok(prec, perf[i].mathType))
        pick = i;
    if (pick < 0)
      return spn_error_set(r->err, SPN_EUNSUPPORTED, "%s: cuDNN has no algorithm for this transposed convolution", b->device);
    e->algo = (int)perf[pick].algo;
    e->ws = perf[pick].memory;
    picked_math = (int)perf[pick].mathType;
    DNN(cudnnSetConvolutionMathType(e->conv, perf[pick].mathType), "math type");
  }
  if (!reused)
    algo_keep(cx, key, e->algo, picked_math, e->ws);
  e->key[0] = x->shape[0];
  *out = e;
  return SPN_OK;
}

/* Bytes of a convolution's input or output in fp16, with the channels a
 * channels-last convolution pads. */
static size_t half_bytes(const spn_node_t *n, const spn_rt_val_t *v, bool input) {
  const cu_node_t *c = n->bctx;
  int64_t cnt = nelem(v);
  if (c->nhwc && v->ndim == 4 && v->shape[1] > 0)
    cnt = cnt / v->shape[1] * (input ? c->cin_p : c->cout_p);
  return (size_t)cnt * 2;
}

/* Scratch of one convolution: cuDNN's workspace, then in fp16 the input and
 * the output cast to fp16. */
static size_t conv_scratch(const spn_run_t *r, const spn_node_t *n, const cu_conv_t *e) {
  size_t need = CU_ALIGN(e->ws);
  if (r->m->precision == SPN_PREC_FP16)
    need += CU_ALIGN(half_bytes(n, &r->v[n->in[0]], true)) + CU_ALIGN(half_bytes(n, &r->v[n->out[0]], false));
  return need;
}

static int32_t exec_conv(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, bool tr) {
  cu_ctx_t *cx = b->ctx;
  cu_node_t *c = n->bctx;
  spn_rt_val_t *x = &r->v[n->in[0]], *y = &r->v[n->out[0]];
  cu_conv_t *e;
  int32_t rc = get_conv(b, r, n, tr, &e);
  if (rc)
    return rc;
  uint8_t *ws;
  if ((rc = scratch(b, r, conv_scratch(r, n, e), &ws)))
    return rc;
  cudaStream_t s = run_stream(b, r);
  DNN(cudnnSetStream(cx->dnn, s), "stream");
  const void *w = in_ptr(r, n, 1);
  const float *bias = n->n_in > 2 && n->in[2] >= 0 ? in_ptr(r, n, 2) : NULL;
  const float one = 1.f, zero = 0.f;
  const void *xin = x->data;
  void *yout = y->data;
  bool h = r->m->precision == SPN_PREC_FP16;
  if (h) {
    /* fp16 operands: the input cast into the scratch unless it is an fp16
     * channels-last value already; the output into the scratch unless it
     * stays one. */
    uint16_t *x16 = (uint16_t *)(ws + CU_ALIGN(e->ws));
    yout = (uint8_t *)x16 + CU_ALIGN(half_bytes(n, x, true));
    if (c->nhwc && c->h_x)
      x16 = x->data;
    else if (c->nhwc)
      CU(spn_cu_nchw_to_nhwc16(x->data, x16, x->shape[0], x->shape[1], x->shape[2] * x->shape[3], c->cin_p, s), "fp16 channels-last cast");
    else
      CU(spn_cu_f32_to_f16(x->data, x16, nelem(x), s), "fp16 cast");
    xin = x16;
    if (c->h_out)
      yout = y->data;
  }
  int from = 0;
  if (tr) {
    DNN(cudnnConvolutionBackwardData(cx->dnn, &one, e->w, w, e->x, xin, e->conv, (cudnnConvolutionBwdDataAlgo_t)e->algo, ws, e->ws, &zero, e->y, yout), "transposed convolution");
  } else if (c->n_fused) {
    const void *z = y->data;
    float a2 = 0.f;
    if (c->n_fused == 2) {
      z = r->v[n->post[0].val].data;
      a2 = 1.f;
    } else {
      /* z = y with alpha2 = 0: clear y so stale arena bytes (NaN * 0)
       * cannot leak in, whether or not cuDNN reads z then. */
      CU(cudaMemsetAsync(y->data, 0, y->bytes, s), "clearing the output");
    }
    DNN(cudnnConvolutionBiasActivationForward(cx->dnn, &one, e->x, x->data, e->w, w, e->conv, (cudnnConvolutionFwdAlgo_t)e->algo, ws, e->ws, &a2, e->y, z, e->bias, bias ? (const void *)bias : c->zero_bias, e->act, e->y, y->data), "fused convolution");
    from = c->n_fused;
    bias = NULL;
  } else {
    DNN(cudnnConvolutionForward(cx->dnn, &one, e->x, xin, e->w, w, e->conv, (cudnnConvolutionFwdAlgo_t)e->algo, ws, e->ws, &zero, e->y, yout), "convolution");
  }
  if (h && c->h_out) { /* stays fp16 channels-last: bias and every post-op in one pass, in place */
    spn_cu_hchain_t ch;
    if ((rc = h_chain_posts(b, r, n, y, &ch)))
      return rc;
    CU(spn_cu_h_map(y->data, y->data, bias, nelem(y), y->shape[1], &ch, s), "fp16 channels-last epilogue");
    return SPN_OK;
  }
  if (h) { /* back to fp32 in one pass with the bias and the leading post-ops */
    const float *z = NULL;
    int act = 0;
    float slope = 0.f;
    if (from < n->n_post && n->post[from].kind == SPN_POST_ADD && !c->post_c[from]) {
      const spn_rt_val_t *o = &r->v[n->post[from].val];
      if (same_dims(o, y)) {
        z = o->data;
        from++;
      }
    }
    if (from < n->n_post && (n->post[from].kind == SPN_POST_RELU || n->post[from].kind == SPN_POST_LRELU)) {
      act = n->post[from].kind == SPN_POST_RELU ? 1 : 2;
      slope = n->post[from].a;
      from++;
    }
    CU(spn_cu_f16_epilogue(yout, y->data, bias, z, y->shape[0], y->shape[1], y->shape[2] * y->shape[3], act, slope,
                           c->nhwc ? c->cout_p : 0, s),
       "fp32 cast");
    bias = NULL;
  }
  if (bias)
    CU(spn_cu_channel_affine(y->data, y->data, NULL, bias, y->shape[0], y->shape[1], y->shape[2] * y->shape[3], s), "bias");
  return posts(b, r, n, from, y);
}

/* ---- MatMul / Gemm (cuBLASLt, row-major through the transposed problem) ---- */

/* Row-major Y (M x N, batch of them) = alpha op(A) op(B) (+ bias, ReLU). */
typedef struct {
  bool ta, tb, relu, c_bcast;
  int64_t M, N, K, batch, sa, sb, sc;
  float alpha, beta;
  const void *bias;
  int from; /* first post-op not fused */
} cu_gemm_t;

static int32_t gemm_problem(spn_backend_t *b, const spn_run_t *r, const spn_node_t *n, cu_gemm_t *g) {
  const spn_rt_val_t *a = &r->v[n->in[0]], *w = &r->v[n->in[1]];
  *g = (cu_gemm_t){.alpha = 1.f, .batch = 1};
  if (n->op == SPN_OP_MATMUL) {
    if (a->ndim < 2 || w->ndim < 1 || w->ndim > a->ndim)
      return spn_error_set(r->err, SPN_EUNSUPPORTED, "MatMul of these ranks on %s", b->device);
    g->M = a->shape[a->ndim - 2];
    g->K = a->shape[a->ndim - 1];
    g->N = w->ndim == 1 ? 1 : w->shape[w->ndim - 1];
    int64_t mk = g->M * g->K, batch = nelem(a) / (mk > 0 ? mk : 1);
    if (w->ndim <= 2) { /* fold the batch into M */
      g->M *= batch;
    } else if (g->K * g->N > 0 && nelem(w) / (g->K * g->N) == batch) {
      g->batch = batch;
      g->sa = g->M * g->K;
      g->sb = g->K * g->N;
      g->sc = g->M * g->N;
    } else {
      return spn_error_set(r->err, SPN_EUNSUPPORTED, "MatMul with broadcast batch dims on %s", b->device);
    }
    return SPN_OK;
  }
  g->ta = spn_attr_int(n, "transA", 0);
  g->tb = spn_attr_int(n, "transB", 0);
  g->alpha = spn_attr_float(n, "alpha", 1.f);
  float beta = spn_attr_float(n, "beta", 1.f);
  g->M = g->ta ? a->shape[1] : a->shape[0];
  g->K = g->ta ? a->shape[0] : a->shape[1];
  g->N = g->tb ? w->shape[0] : w->shape[1];
  if (n->n_in > 2 && n->in[2] >= 0 && beta != 0.f) {
    const spn_rt_val_t *cv = &r->v[n->in[2]];
    /* The epilogue's bias pointer is fixed in the cached descriptor: only a
     * constant (uploaded at prepare) can be it. */
    if (cv->ndim == 1 && cv->shape[0] == g->N && beta == 1.f && const_in(r->m, n, 2)) {
      g->bias = in_ptr(r, n, 2);
      g->relu = n->n_post > 0 && n->post[0].kind == SPN_POST_RELU;
      g->from = g->relu;
    } else { /* Y = broadcast C, then Y = alpha A B + beta Y */
      g->c_bcast = true;
      g->beta = beta;
    }
  }
  return SPN_OK;
}

static cublasStatus_t lt_build(cu_ctx_t *cx, int prec, const cu_gemm_t *g, cu_lt_t *e) {
  bool h = prec == SPN_PREC_FP16;
  cudaDataType_t ab = h ? CUDA_R_16F : CUDA_R_32F;
  /* fp16: fp16 A and B, fp32 accumulation and fp32 C/D. */
  cublasComputeType_t ct = prec == SPN_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  /* Column-major: C^T (N x M) = op(B)^T-side x op(A)^T-side. */
  cublasOperation_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  int64_t M = g->M, N = g->N, K = g->K;
  cublasStatus_t st = cx->lt_api.MatmulDescCreate(&e->desc, ct, CUDA_R_32F);
  if (!st) st = cx->lt_api.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  if (!st) st = cx->lt_api.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  if (!st && g->bias) {
    cublasLtEpilogue_t epi = g->relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    /* The bias has D's type (fp32) by default, at every precision. */
    st = cx->lt_api.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (!st) st = cx->lt_api.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
  }
  /* "A" of the column-major call is B: stored K x N row-major (N x K col-major, ld N) or, transposed, N x K row-major. */
  if (!st) st = cx->lt_api.MatrixLayoutCreate(&e->la, ab, g->tb ? (uint64_t)K : (uint64_t)N, g->tb ? (uint64_t)N : (uint64_t)K, g->tb ? K : N);
  if (!st) st = cx->lt_api.MatrixLayoutCreate(&e->lb, ab, g->ta ? (uint64_t)M : (uint64_t)K, g->ta ? (uint64_t)K : (uint64_t)M, g->ta ? M : K);
  if (!st) st = cx->lt_api.MatrixLayoutCreate(&e->lc, CUDA_R_32F, (uint64_t)N, (uint64_t)M, N);
  if (!st && g->batch > 1) {
    int32_t bc = (int32_t)g->batch;
    st = cx->lt_api.MatrixLayoutSetAttribute(e->la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    if (!st) st = cx->lt_api.MatrixLayoutSetAttribute(e->la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g->sb, sizeof g->sb);
    if (!st) st = cx->lt_api.MatrixLayoutSetAttribute(e->lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    if (!st) st = cx->lt_api.MatrixLayoutSetAttribute(e->lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g->sa, sizeof g->sa);
    if (!st) st = cx->lt_api.MatrixLayoutSetAttribute(e->lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    if (!st) st = cx->lt_api.MatrixLayoutSetAttribute(e->lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g->sc, sizeof g->sc);
  }
  cublasLtMatmulPreference_t pref = NULL;
  if (!st) st = cx->lt_api.MatmulPreferenceCreate(&pref);
  uint64_t wsn = CU_LT_WS;
  if (!st) st = cx->lt_api.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsn, sizeof wsn);
  int nres = 0;
  if (!st) st = cx->lt_api.MatmulAlgoGetHeuristic(cx->lt, e->desc, e->la, e->lb, e->lc, e->lc, pref, 1, &e->heur, &nres);
  if (!st && nres == 0)
    st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (pref)
    cx->lt_api.MatmulPreferenceDestroy(pref);
  e->ws = st ? 0 : e->heur.workspaceSize;
  return st;
}

static int32_t lt_status(spn_backend_t *b, spn_run_t *r, cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_ALLOC_FAILED)
    return spn_error_set(r->err, SPN_ENOMEM, "%s: out of device memory (cuBLASLt %s)", b->device, what);
  return spn_error_set(r->err, SPN_ECUDA, "%s: cuBLASLt %s failed (status %d)", b->device, what, (int)st);
}

/* cuBLASLt descriptors and heuristic of node n for its operand shapes,
 * built once. */
static int32_t get_lt(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, cu_gemm_t *g, cu_lt_t **out) {
  cu_node_t *c = n->bctx;
  const spn_rt_val_t *a = &r->v[n->in[0]], *w = &r->v[n->in[1]];
  const spn_rt_val_t *cv = n->n_in > 2 && n->in[2] >= 0 ? &r->v[n->in[2]] : NULL;
  int32_t rc = gemm_problem(b, r, n, g);
  if (rc)
    return rc;
  int64_t kc[SPN_MAXD + 1] = {0};
  if (cv)
    shape_key(kc, cv);
  for (cu_lt_t *e = c->lts; e; e = e->next)
    if (same_shape(e->ka, a) && same_shape(e->kb, w) && !memcmp(e->kc, kc, sizeof kc)) {
      *out = e;
      return SPN_OK;
    }
  cu_lt_t *e = calloc(1, sizeof *e);
  if (!e)
    return spn_error_set(r->err, SPN_ENOMEM, "out of memory");
  cublasStatus_t st = lt_build(b->ctx, r->m->precision, g, e);
  if (st) {
    lt_entry_free(b->ctx, e);
    return lt_status(b, r, st, "matmul setup");
  }
  shape_key(e->ka, a);
  shape_key(e->kb, w);
  memcpy(e->kc, kc, sizeof kc);
  e->next = c->lts;
  c->lts = e;
  *out = e;
  return SPN_OK;
}

/* Scratch of one MatMul/Gemm: cuBLASLt's workspace, then in fp16 the
 * operands that are not fp16 weights, cast. */
static size_t lt_scratch(const spn_run_t *r, const spn_node_t *n, const cu_lt_t *e) {
  size_t need = CU_ALIGN(e->ws);
  for (int k = 0; k < 2 && r->m->precision == SPN_PREC_FP16; k++)
    if (!in_half(n, k))
      need += CU_ALIGN((size_t)nelem(&r->v[n->in[k]]) * 2);
  return need;
}

static int32_t exec_lt(spn_backend_t *b, spn_run_t *r, const spn_node_t *n) {
  cu_ctx_t *cx = b->ctx;
  spn_rt_val_t *y = &r->v[n->out[0]];
  cu_gemm_t g;
  cu_lt_t *e;
  int32_t rc = get_lt(b, r, n, &g, &e);
  if (rc)
    return rc;
  uint8_t *ws;
  if ((rc = scratch(b, r, lt_scratch(r, n, e), &ws)))
    return rc;
  cudaStream_t s = run_stream(b, r);
  const void *op[2] = {in_ptr(r, n, 0), in_ptr(r, n, 1)};
  uint8_t *p = ws + CU_ALIGN(e->ws);
  for (int k = 0; k < 2 && r->m->precision == SPN_PREC_FP16; k++)
    if (!in_half(n, k)) {
      int64_t cnt = nelem(&r->v[n->in[k]]);
      CU(spn_cu_f32_to_f16(op[k], (uint16_t *)p, cnt, s), "fp16 cast");
      op[k] = p;
      p += CU_ALIGN((size_t)cnt * 2);
    }
  if (g.c_bcast) {
    spn_cu_nd_t cg;
    bcast_nd(&r->v[n->in[2]], y, &cg);
    CU(spn_cu_strided_copy(in_ptr(r, n, 2), y->data, 4, &cg, 0, s), "Gemm C");
  }
  cublasStatus_t st = cx->lt_api.Matmul(cx->lt, e->desc, &g.alpha, op[1], e->la, op[0], e->lb, &g.beta, y->data, e->lc, y->data, e->lc, &e->heur.algo, ws, e->ws, s);
  if (st)
    return lt_status(b, r, st, "matmul");
  return posts(b, r, n, g.from, y);
}

/* ---- the rest ---- */

static int32_t get_resize(spn_backend_t *b, spn_run_t *r, const spn_node_t *n, cu_resize_t **out) {
  cu_node_t *c = n->bctx;
  const spn_rt_val_t *x = &r->v[n->in[0]];
  if (x->ndim < 3 || x->ndim > 5)
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "Resize of a %d-D tensor on %s", x->ndim, b->device);
  for (cu_resize_t *it = c->resizes; it; it = it->next)
    if (same_shape(it->key, x)) {
      *out = it;
      return SPN_OK;
    }
  int64_t *ib;
  float *wb;
  int64_t ish[3], osh[3];
  int lin = 0;
  bool cubic = spn_resize_is_cubic(n);
  int32_t rc;
  if (cubic) {
    int64_t sp[4];
    rc = spn_resize_cubic_tables(r, n, sp, &ib, &wb);
    ish[0] = osh[0] = 1, ish[1] = sp[0], ish[2] = sp[1], osh[1] = sp[2], osh[2] = sp[3];
  } else {
    rc = spn_resize_tables(r, n, ish, osh, &lin, &ib, &wb);
  }
  if (rc)
    return rc;
  cu_resize_t *e = calloc(1, sizeof *e);
  if (!e) {
    free(ib);
    free(wb);
    return spn_error_set(r->err, SPN_ENOMEM, "out of memory");
  }
  memcpy(e->ish, ish, sizeof ish);
  memcpy(e->osh, osh, sizeof osh);
  e->linear = lin;
  e->cubic = cubic;
  /* Two index tables and one of weights over D, H and W; or a cubic's 4
   * indices and 4 weights per output coordinate of H and W. */
  int64_t tot = cubic ? 4 * (osh[1] + osh[2]) : osh[0] + osh[1] + osh[2];
  rc = upload(b, ib, (size_t)tot * (cubic ? 1 : 2) * sizeof(int64_t), (void **)&e->i01, r->err);
  if (!rc)
    rc = upload(b, wb, (size_t)tot * sizeof(float), (void **)&e->w, r->err);
  free(ib);
  free(wb);
  if (!rc)
    shape_key(e->key, x); /* findable only when complete */
  e->next = c->resizes;
  c->resizes = e;
  *out = e;
  return rc;
}

static int32_t exec_resize(spn_backend_t *b, spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = &r->v[n->in[0]];
  spn_rt_val_t *y = &r->v[n->out[0]];
  cu_resize_t *e;
  int32_t rc = get_resize(b, r, n, &e);
  if (rc)
    return rc;
  if (e->cubic) {
    int64_t sp[4] = {e->ish[1], e->ish[2], e->osh[1], e->osh[2]};
    CU(spn_cu_resize_cubic(x->data, y->data, x->shape[0] * x->shape[1], sp, e->i01, e->w, run_stream(b, r)), "cubic resize kernel");
    return SPN_OK;
  }
  int64_t tot = e->osh[0] + e->osh[1] + e->osh[2];
  CU(spn_cu_resize(x->data, y->data, x->shape[0] * x->shape[1], e->ish, e->osh, e->i01, e->i01 + tot, e->w, e->linear, run_stream(b, r)), "resize kernel");
  return SPN_OK;
}

/* Resize of an fp16 channels-last value (plan_forms): over H and W only. */
static int32_t exec_resize_h(spn_backend_t *b, spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = &r->v[n->in[0]];
  spn_rt_val_t *y = &r->v[n->out[0]];
  if (x->ndim != 4 || y->ndim != 4 || x->shape[0] != y->shape[0] || x->shape[1] != y->shape[1])
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "%s: an fp16 channels-last Resize of other than H and W; run with SPINDLE_CUDA_NHWC=0", b->device);
  cu_resize_t *e;
  int32_t rc = get_resize(b, r, n, &e);
  if (rc)
    return rc;
  int64_t tot = e->osh[0] + e->osh[1] + e->osh[2];
  CU(spn_cu_resize_h(x->data, y->data, x->shape[0], x->shape[1], e->ish, e->osh, e->i01, e->i01 + tot, e->w, e->linear, run_stream(b, r)), "fp16 channels-last resize");
  return SPN_OK;
}

static int32_t exec_pool(spn_backend_t *b, spn_run_t *r, const spn_node_t *n) {
  const spn_rt_val_t *x = &r->v[n->in[0]];
  spn_rt_val_t *y = &r->v[n->out[0]];
  if (x->ndim != 4)
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "only 2-D pooling on %s", b->device);
  const spn_attr_t *ks = spn_node_attr(n, "kernel_shape"), *st = spn_node_attr(n, "strides"), *pd = spn_node_attr(n, "pads"), *dl = spn_node_attr(n, "dilations");
  int kh = (int)ks->ints[0], kw = (int)ks->ints[1];
  int sh = st ? (int)st->ints[0] : 1, sw = st ? (int)st->ints[1] : 1;
  int ph = pd ? (int)pd->ints[0] : 0, pw = pd ? (int)pd->ints[1] : 0;
  int dh = dl ? (int)dl->ints[0] : 1, dw = dl ? (int)dl->ints[1] : 1;
  bool avg = n->op == SPN_OP_AVGPOOL;
  int cp = avg ? (int)spn_attr_int(n, "count_include_pad", 0) : 0;
  CU(spn_cu_pool2d(x->data, y->data, x->shape[0] * x->shape[1], x->shape[2], x->shape[3], y->shape[2], y->shape[3], kh, kw, sh, sw, ph, pw, dh, dw, avg, cp, run_stream(b, r)), "pooling kernel");
  return SPN_OK;
}

static void contiguous(const spn_rt_val_t *x, int64_t *st) {
  int64_t s = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    st[d] = s;
    s *= x->shape[d];
  }
}

static int32_t exec_node(spn_backend_t *b, spn_run_t *r, const spn_node_t *n) {
  cu_node_t *c = n->bctx;
  spn_rt_val_t *x = n->n_in > 0 && n->in[0] >= 0 ? &r->v[n->in[0]] : NULL;
  spn_rt_val_t *y = &r->v[n->out[0]];
  int64_t cnt = nelem(y);
  cudaStream_t s = run_stream(b, r);
  int64_t produced = 0;
  for (int o = 0; o < n->n_out; o++)
    if (n->out[o] >= 0)
      produced += nelem(&r->v[n->out[o]]);
  if (!produced)
    return SPN_OK;
  if (c->h_node)
    return exec_h(b, r, n);
  const void *X = x ? in_ptr(r, n, 0) : NULL;
  switch (n->op) {
  case SPN_OP_CONV: return exec_conv(b, r, n, false);
  case SPN_OP_CONVT: return exec_conv(b, r, n, true);
  case SPN_OP_MATMUL:
  case SPN_OP_GEMM: return exec_lt(b, r, n);
  case SPN_OP_RELU: CU(spn_cu_unary(SPN_CU_RELU, X, y->data, cnt, 0, 0, s), "Relu"); return SPN_OK;
  case SPN_OP_LRELU: CU(spn_cu_unary(SPN_CU_LRELU, X, y->data, cnt, spn_attr_float(n, "alpha", 0.01f), 0, s), "LeakyRelu"); return SPN_OK;
  case SPN_OP_SIGMOID: CU(spn_cu_unary(SPN_CU_SIGMOID, X, y->data, cnt, 0, 0, s), "Sigmoid"); return SPN_OK;
  case SPN_OP_TANH: CU(spn_cu_unary(SPN_CU_TANH, X, y->data, cnt, 0, 0, s), "Tanh"); return SPN_OK;
  case SPN_OP_EXP: CU(spn_cu_unary(SPN_CU_EXP, X, y->data, cnt, 0, 0, s), "Exp"); return SPN_OK;
  case SPN_OP_CLIP: {
    float lo, hi;
    clip_bounds(r, n, &lo, &hi);
    CU(spn_cu_unary(SPN_CU_CLIP, X, y->data, cnt, lo, hi, s), "Clip");
    return SPN_OK;
  }
  case SPN_OP_BN:
    CU(spn_cu_channel_affine(X, y->data, c->bn_scale, c->bn_shift, x->shape[0], x->shape[1], cnt / (x->shape[0] * x->shape[1]), s), "BatchNormalization");
    return SPN_OK;
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV: case SPN_OP_PRELU: {
    return binary(b, r, binary_code(n->op), x, X, &r->v[n->in[1]], in_ptr(r, n, 1), y, y->data);
  }
  case SPN_OP_SOFTMAX: {
    int64_t def = r->m->opset >= 13 ? -1 : 1;
    int64_t ax = spn_attr_int(n, "axis", def);
    if (ax < 0) ax += x->ndim;
    int64_t outer = 1, len = 1, inner = 1;
    for (int d = 0; d < x->ndim; d++) {
      if (d < ax) outer *= x->shape[d];
      else if (d == ax || r->m->opset < 13) len *= x->shape[d];
      else inner *= x->shape[d];
    }
    CU(spn_cu_softmax(X, y->data, outer, len, inner, s), "Softmax");
    return SPN_OK;
  }
  case SPN_OP_CONCAT: {
    int64_t ax = spn_attr_int(n, "axis", 0);
    if (ax < 0) ax += y->ndim;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ax; d++) outer *= y->shape[d];
    for (int d = (int)ax + 1; d < y->ndim; d++) inner *= y->shape[d];
    return concat_rows(b, r, n, (int)ax, (size_t)outer, (size_t)inner * spn_dtype_size(y->dtype));
  }
  case SPN_OP_SPLIT: {
    int64_t ax = spn_attr_int(n, "axis", 0);
    if (ax < 0) ax += x->ndim;
    size_t es = spn_dtype_size(x->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ax; d++) outer *= x->shape[d];
    for (int d = (int)ax + 1; d < x->ndim; d++) inner *= x->shape[d];
    size_t irow = (size_t)(x->shape[ax] * inner) * es, pos = 0;
    for (int k = 0; k < n->n_out; k++) {
      if (n->out[k] < 0)
        continue;
      spn_rt_val_t *v = &r->v[n->out[k]];
      size_t chunk = (size_t)(v->shape[ax] * inner) * es;
      if (chunk && outer)
        CU(cudaMemcpy2DAsync(v->data, chunk, (const uint8_t *)X + pos, irow, chunk, (size_t)outer, cudaMemcpyDeviceToDevice, s), "Split");
      pos += chunk;
    }
    return SPN_OK;
  }
  case SPN_OP_D2S: {
    int64_t bs = spn_attr_int(n, "blocksize", 1);
    int crd = !strcmp(spn_attr_str(n, "mode", "DCR"), "CRD");
    CU(spn_cu_depth_to_space(X, y->data, y->shape[0], y->shape[1], x->shape[2], x->shape[3], bs, crd, s), "DepthToSpace");
    return SPN_OK;
  }
  case SPN_OP_RESIZE:
  case SPN_OP_UPSAMPLE: return exec_resize(b, r, n);
  case SPN_OP_TRANSPOSE: {
    const spn_attr_t *p = spn_node_attr(n, "perm");
    int64_t ist[SPN_MAXD];
    contiguous(x, ist);
    spn_cu_nd_t g = {.nd = y->ndim};
    for (int d = 0; d < y->ndim; d++) {
      g.shape[d] = y->shape[d];
      g.st[d] = ist[p ? p->ints[d] : x->ndim - 1 - d];
    }
    CU(spn_cu_strided_copy(X, y->data, (int)spn_dtype_size(x->dtype), &g, 0, s), "Transpose");
    return SPN_OK;
  }
  case SPN_OP_SLICE: {
    int64_t st[SPN_MAXD], sp[SPN_MAXD], count[SPN_MAXD], ist[SPN_MAXD];
    int32_t rc = spn_op_slice_params(r, n, st, sp, count);
    if (rc)
      return rc;
    contiguous(x, ist);
    int64_t base = 0;
    spn_cu_nd_t g = {.nd = y->ndim};
    for (int d = 0; d < x->ndim; d++) {
      base += st[d] * ist[d];
      g.shape[d] = y->shape[d];
      g.st[d] = ist[d] * sp[d];
    }
    CU(spn_cu_strided_copy(X, y->data, (int)spn_dtype_size(x->dtype), &g, base, s), "Slice");
    return SPN_OK;
  }
  case SPN_OP_PAD: {
    int64_t pads[2 * SPN_MAXD];
    float val;
    int32_t rc = spn_op_pad_params(r, n, pads, &val);
    if (rc)
      return rc;
    int md = spn_op_pad_mode(n);
    int64_t ist[SPN_MAXD];
    contiguous(x, ist);
    spn_cu_nd_t g = {.nd = y->ndim};
    for (int d = 0; d < y->ndim; d++) {
      g.shape[d] = y->shape[d];
      g.st[d] = ist[d];
    }
    CU(spn_cu_pad(X, y->data, &g, x->shape, pads, md, val, s), "Pad");
    return SPN_OK;
  }
  case SPN_OP_GAP: {
    int64_t planes = x->shape[0] * x->shape[1];
    CU(spn_cu_global_avg_pool(X, y->data, planes, nelem(x) / (planes ? planes : 1), s), "GlobalAveragePool");
    return SPN_OK;
  }
  case SPN_OP_MAXPOOL:
  case SPN_OP_AVGPOOL: return exec_pool(b, r, n);
  case SPN_OP_RESHAPE: case SPN_OP_FLATTEN: case SPN_OP_SQUEEZE: case SPN_OP_UNSQUEEZE: case SPN_OP_IDENTITY:
    if (y->data != X)
      CU(cudaMemcpyAsync(y->data, X, (size_t)cnt * spn_dtype_size(y->dtype), cudaMemcpyDeviceToDevice, s), "copy");
    return SPN_OK;
  default:
    return spn_error_set(r->err, SPN_EUNSUPPORTED, "no CUDA kernel");
  }
}

/* ---- fp16 channels-last values ---- */

/* A constant operand the fp16 channels-last chain reads as f[0] (one
 * element) or f[c] (shape (C, 1, 1) or (1, C, 1, 1) against an NCHW
 * value). */
static bool chan_const(const spn_value_t *v) {
  if (v->kind != SPN_VAL_CONST || v->dtype != SPN_DTYPE_F32)
    return false;
  int64_t cnt = 1;
  for (int d = 0; d < v->ndim; d++)
    cnt *= v->shape[d];
  if (cnt == 1)
    return true;
  if (v->ndim == 3)
    return v->shape[1] == 1 && v->shape[2] == 1;
  return v->ndim == 4 && v->shape[0] == 1 && v->shape[2] == 1 && v->shape[3] == 1;
}

static bool live_here(const spn_backend_t *b, const spn_node_t *n) {
  return !n->dead && !n->shape_class && n->backend == b->slot;
}

/* An element-wise node that can run on fp16 channels-last values: its
 * data operands are such values (decided by plan_forms) or per-channel
 * constants, at least one is not a constant, and a constant first operand
 * only where the operation commutes. */
static bool h_elementwise(const spn_backend_t *b, const spn_model_t *m, const spn_node_t *n) {
  if (!live_here(b, n) || n->n_out != 1 || n->out[0] < 0 || n->n_in < 1 || n->in[0] < 0)
    return false;
  const spn_value_t *a = &m->vals[n->in[0]];
  switch (n->op) {
  case SPN_OP_RELU: case SPN_OP_LRELU: case SPN_OP_SIGMOID: case SPN_OP_TANH: case SPN_OP_CLIP:
    return a->kind != SPN_VAL_CONST;
  case SPN_OP_PRELU:
    return a->kind != SPN_VAL_CONST && n->n_in == 2 && chan_const(&m->vals[n->in[1]]);
  case SPN_OP_ADD: case SPN_OP_SUB: case SPN_OP_MUL: case SPN_OP_DIV: {
    if (n->n_in != 2 || n->in[1] < 0)
      return false;
    const spn_value_t *w = &m->vals[n->in[1]];
    if (a->kind == SPN_VAL_CONST)
      return (n->op == SPN_OP_ADD || n->op == SPN_OP_MUL) && chan_const(a) && w->kind != SPN_VAL_CONST;
    return w->kind != SPN_VAL_CONST || chan_const(w);
  }
  case SPN_OP_RESIZE: case SPN_OP_UPSAMPLE: /* over H and W; its other inputs are read on the host */
    return a->kind != SPN_VAL_CONST && a->ndim == 4 && !spn_resize_is_cubic(n);
  case SPN_OP_CONCAT: {
    int64_t ax = spn_attr_int(n, "axis", 0);
    if (ax != 1 && ax != -3)
      return false;
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] < 0 || m->vals[n->in[k]].kind == SPN_VAL_CONST)
        return false;
    return true;
  }
  default:
    return false;
  }
}

/* The fused post-ops the chain of a channels-last convolution can apply:
 * activations, and Add/PRelu of a per-channel constant or (Add only) of
 * another fp16 channels-last value. */
static bool h_posts_ok(const spn_model_t *m, const spn_node_t *n) {
  for (int p = 0; p < n->n_post; p++) {
    const spn_post_t *po = &n->post[p];
    if (po->kind == SPN_POST_PRELU && !chan_const(&m->vals[po->val]))
      return false;
    if (po->kind == SPN_POST_ADD && m->vals[po->val].kind == SPN_VAL_CONST && !chan_const(&m->vals[po->val]))
      return false;
  }
  return true;
}

/* Once per model, before its first run: which values stay fp16
 * channels-last. A value does when a channels-last convolution (with post-
 * ops the chain applies) or an element-wise node of such values produces
 * it, it is not a model output, and every reader is on this backend and
 * takes it as such: a channels-last convolution's data input, the residual
 * Add of a channels-last convolution whose output stays fp16, or an
 * element-wise node whose output stays fp16. Everything starts optimistic
 * and drops out until nothing changes (as the CPU backend's mark_nhwc);
 * every other value is fp32 NCHW, and the convolutions convert at their
 * edges. Called under the backend's lock. */
static void plan_forms(spn_backend_t *b, const spn_model_t *m) {
  /* Every fp16 value traces back to a channels-last convolution: none
   * without them. */
  bool on = ((cu_ctx_t *)b->ctx)->nhwc && m->precision == SPN_PREC_FP16;
  bool *hv = on ? calloc((size_t)m->n_val + 1, sizeof(bool)) : NULL;
  bool *el = on ? calloc((size_t)m->n_node + 1, sizeof(bool)) : NULL;
  if (hv && el) {
    for (int i = 0; i < m->n_node; i++) {
      const spn_node_t *n = &m->nodes[i];
      const cu_node_t *c = n->bctx;
      el[i] = h_elementwise(b, m, n);
      bool conv = live_here(b, n) && c && c->nhwc && c->cout_p == c->cout && h_posts_ok(m, n);
      if ((el[i] || conv) && n->out[0] >= 0 && !m->vals[n->out[0]].is_output)
        hv[n->out[0]] = true;
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (int i = 0; i < m->n_node; i++) {
        const spn_node_t *n = &m->nodes[i];
        if (n->dead)
          continue;
        const cu_node_t *c = live_here(b, n) ? n->bctx : NULL;
        bool conv = c && c->nhwc;
        bool yh = n->n_out > 0 && n->out[0] >= 0 && hv[n->out[0]];
        /* A node computing fp16 needs all its data operands in fp16. */
        bool need = yh && (el[i] || conv);
        for (int k = 0; k < n->n_in; k++) {
          int vi = n->in[k];
          if (vi < 0 || m->vals[vi].kind == SPN_VAL_CONST ||
              ((n->op == SPN_OP_CLIP || n->op == SPN_OP_RESIZE || n->op == SPN_OP_UPSAMPLE) && k > 0))
            continue; /* constants, Clip's bounds, Resize's roi/scales/sizes (read on the host) */
          bool takes = n->shape_class ? n->op == SPN_OP_SHAPE : conv ? k == 0 && c->cin_p == c->cin : el[i] && yh;
          if (hv[vi] && !takes) {
            hv[vi] = false;
            changed = true;
          }
          if (need && !conv && !hv[vi]) {
            hv[n->out[0]] = false;
            need = yh = false;
            changed = true;
          }
        }
        for (int p = 0; p < n->n_post; p++) {
          int vi = n->post[p].val;
          if (n->post[p].kind != SPN_POST_ADD && n->post[p].kind != SPN_POST_PRELU)
            continue;
          if (m->vals[vi].kind == SPN_VAL_CONST)
            continue;
          if (hv[vi] && !(conv && yh && n->post[p].kind == SPN_POST_ADD)) {
            hv[vi] = false;
            changed = true;
          }
          if (yh && conv && !hv[vi]) {
            hv[n->out[0]] = false;
            yh = false;
            changed = true;
          }
        }
        for (int o = 1; o < n->n_out; o++)
          if (n->out[o] >= 0 && hv[n->out[o]]) {
            hv[n->out[o]] = false;
            changed = true;
          }
      }
    }
  }
  int convs = 0, nhwc = 0, kept = 0;
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    cu_node_t *c = live_here(b, n) ? n->bctx : NULL;
    if (!c)
      continue;
    c->planned = true;
    convs += n->op == SPN_OP_CONV || n->op == SPN_OP_CONVT;
    nhwc += c->nhwc;
    kept += hv && el && n->n_out > 0 && n->out[0] >= 0 && hv[n->out[0]];
    if (!hv || !el)
      continue; /* out of memory: everything fp32 NCHW, which is always right */
    c->h_out = n->n_out > 0 && n->out[0] >= 0 && hv[n->out[0]];
    c->h_x = n->n_in > 0 && n->in[0] >= 0 && hv[n->in[0]];
    c->h_node = el[i] && c->h_out;
  }
  /* What the opt-in did, once per model (as the load's CPU-fallback line). */
  if (on && convs)
    fprintf(stderr, "spindle engine: %s on %s: fp16 channels-last: %d of %d convolutions, %d values kept fp16%s\n",
            m->path, b->device, nhwc, convs, kept, hv && el ? "" : " (out of host memory: none)");
  free(hv);
  free(el);
}

/* Once per (model, input shapes): everything shape-dependent each node
 * placed here needs, and the largest scratch any of them uses. */
static int32_t cu_prepare_shape(spn_backend_t *b, spn_run_t *r, size_t *scratch_n) {
  cu_ctx_t *cx = b->ctx;
  const spn_model_t *m = r->m;
  size_t need = 0;
  int32_t rc = SPN_OK;
  pthread_mutex_lock(&cx->lock);
  cudaSetDevice(cx->dev);
  /* cuDNN times its algorithms on the handle's stream, which the last run
   * left on its caller's stream: that stream may be gone by now. */
  cudnnStatus_t ds = cudnnSetStream(cx->dnn, cx->stream);
  if (ds != CUDNN_STATUS_SUCCESS) {
    pthread_mutex_unlock(&cx->lock);
    return dnn_err(r->err, b->device, ds, "stream");
  }
  for (int i = 0; i < m->n_node; i++)
    if (live_here(b, &m->nodes[i]) && m->nodes[i].bctx) {
      if (!((cu_node_t *)m->nodes[i].bctx)->planned)
        plan_forms(b, m);
      break;
    }
  for (int i = 0; i < m->n_node && !rc; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class || n->backend != b->slot)
      continue;
    int64_t produced = 0;
    for (int o = 0; o < n->n_out; o++)
      if (n->out[o] >= 0)
        produced += nelem(&r->v[n->out[o]]);
    if (!produced)
      continue;
    size_t k = 0;
    if (n->op == SPN_OP_CONV || n->op == SPN_OP_CONVT) {
      cu_conv_t *e;
      if (!(rc = get_conv(b, r, n, n->op == SPN_OP_CONVT, &e)))
        k = conv_scratch(r, n, e);
    } else if (n->op == SPN_OP_MATMUL || n->op == SPN_OP_GEMM) {
      cu_gemm_t g;
      cu_lt_t *e;
      if (!(rc = get_lt(b, r, n, &g, &e)))
        k = lt_scratch(r, n, e);
    } else if (n->op == SPN_OP_RESIZE || n->op == SPN_OP_UPSAMPLE) {
      cu_resize_t *e;
      rc = get_resize(b, r, n, &e);
    }
    if (rc)
      spn_error_prefix(r->err, "%s: node '%s' (%s) on %s", m->path, n->name, n->op_name, b->device);
    need = k > need ? k : need;
  }
  pthread_mutex_unlock(&cx->lock);
  *scratch_n = need;
  return rc;
}

static int32_t run_range(spn_backend_t *b, spn_run_t *r, int first, int last) {
  const spn_model_t *m = r->m;
  int32_t rc = SPN_OK;
  for (int i = first; i < last && !rc; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class || n->backend != b->slot)
      continue;
    if ((rc = exec_node(b, r, n)))
      spn_error_prefix(r->err, "%s: node '%s' (%s) on %s", m->path, n->name, n->op_name, b->device);
  }
  return rc;
}

/* ---- CUDA Graphs ---- */

typedef struct {
  int64_t *v;
  size_t n, cap;
  bool oom;
} cu_sig_t;

static void sig_push(cu_sig_t *s, int64_t x) {
  if (s->oom)
    return;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    int64_t *nv = realloc(s->v, cap * sizeof *nv);
    if (!nv) {
      s->oom = true;
      return;
    }
    s->v = nv;
    s->cap = cap;
  }
  s->v[s->n++] = x;
}

/* A value as the range sees it: its shape, and where it is when that is
 * device memory (host values, i.e. constants and shape-class values, are
 * read at enqueue time and follow from the shapes). */
static void sig_value(cu_sig_t *s, const spn_run_t *r, int vi) {
  const spn_rt_val_t *v = &r->v[vi];
  const spn_value_t *mv = &r->m->vals[vi];
  bool host = mv->kind == SPN_VAL_CONST || v->host_owned;
  sig_push(s, vi);
  sig_push(s, host ? 0 : (int64_t)(intptr_t)v->data);
  sig_push(s, v->ndim);
  for (int d = 0; d < v->ndim; d++)
    sig_push(s, v->shape[d]);
}

static void sig_build(cu_sig_t *s, spn_backend_t *b, const spn_run_t *r, int first, int last) {
  const spn_model_t *m = r->m;
  sig_push(s, first);
  sig_push(s, last);
  sig_push(s, (int64_t)(intptr_t)r->bws[b->slot]);
  sig_push(s, (int64_t)r->bws_n[b->slot]);
  for (int i = 0; i < m->n_inputs; i++)
    sig_value(s, r, m->inputs[i]);
  for (int i = first; i < last; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class || n->backend != b->slot)
      continue;
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] >= 0)
        sig_value(s, r, n->in[k]);
    for (int p = 0; p < n->n_post; p++)
      if (n->post[p].kind == SPN_POST_ADD || n->post[p].kind == SPN_POST_PRELU)
        sig_value(s, r, n->post[p].val);
    for (int o = 0; o < n->n_out; o++)
      if (n->out[o] >= 0)
        sig_value(s, r, n->out[o]);
  }
}

static void graph_free(cu_graph_t *g) {
  if (g->exec)
    (void)cudaGraphExecDestroy(g->exec); /* a launch in flight completes first */
  free(g->sig);
  free(g);
}

/* The entry for this signature (taking s->v), made in state 0 when new
 * (*fresh: this run is its first, which runs eagerly as the warm-up). */
static cu_graph_t *graph_entry(cu_ctx_t *cx, const spn_model_t *m, cu_sig_t *s, bool *fresh) {
  *fresh = false;
  for (cu_graph_t *g = cx->graphs; g; g = g->next)
    if (g->m == m && g->sig_n == s->n && !memcmp(g->sig, s->v, s->n * sizeof *s->v)) {
      g->tick = ++cx->graph_tick;
      return g;
    }
  *fresh = true;
  cu_graph_t *g = calloc(1, sizeof *g);
  if (!g)
    return NULL;
  g->m = m;
  g->sig = s->v;
  g->sig_n = s->n;
  s->v = NULL;
  g->tick = ++cx->graph_tick;
  g->next = cx->graphs;
  cx->graphs = g;
  if (++cx->n_graphs > CU_MAX_GRAPHS) {
    cu_graph_t **lru = NULL;
    for (cu_graph_t **it = &cx->graphs; *it; it = &(*it)->next)
      if (*it != g && (!lru || (*it)->tick < (*lru)->tick))
        lru = it;
    if (lru) {
      cu_graph_t *old = *lru;
      *lru = old->next;
      graph_free(old);
      cx->n_graphs--;
    }
  }
  return g;
}

/* Capture the range into g; false (g not capturable, nothing enqueued)
 * when any step of it fails. The capture runs on the backend's own capture
 * stream, not the run's: a run's stream is a stage's, which the device
 * layer lists, and any thread that frees device memory records a fence on
 * every listed stream and makes the free stream wait for it (dev_free in
 * cuda/device-cuda.c). A fence recorded into a capture and waited for from
 * outside it pulls the free stream, and the free, into the capture: the
 * capture then ends unjoined (not capturable) and the free never happens.
 * Nothing runs during a capture, so where it is recorded changes nothing
 * else; the graph is launched on the run's stream. */
static bool graph_capture(spn_backend_t *b, spn_run_t *r, int first, int last, cu_graph_t *g) {
  cu_ctx_t *cx = b->ctx;
  cudaStream_t st = cx->cap_stream;
  if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  spn_error_t cap_err = SPN_ERROR_INIT, *saved = r->err;
  void *run_st = r->stream;
  r->err = &cap_err;
  r->stream = st; /* what run_range enqueues goes into the capture */
  int32_t rc = run_range(b, r, first, last);
  r->stream = run_st;
  r->err = saved;
  cudaGraph_t graph = NULL;
  cudaError_t ce = cudaStreamEndCapture(st, &graph);
  if (!rc && ce == cudaSuccess && graph)
    ce = cudaGraphInstantiate(&g->exec, graph, 0);
  if (graph)
    (void)cudaGraphDestroy(graph);
  if (rc || ce != cudaSuccess || !g->exec) {
    (void)cudaGetLastError();
    if (g->exec)
      (void)cudaGraphExecDestroy(g->exec);
    g->exec = NULL;
    return false;
  }
  return true;
}

static int32_t cu_compute(spn_backend_t *b, spn_run_t *r, int first, int last) {
  cu_ctx_t *cx = b->ctx;
  pthread_mutex_lock(&cx->lock);
  cudaSetDevice(cx->dev);
  int32_t rc = SPN_OK;
  cu_graph_t *g = NULL;
  bool fresh = false;
  if (!r->m->no_graphs && !r->profile) {
    cu_sig_t s = {0};
    sig_build(&s, b, r, first, last);
    if (!s.oom)
      g = graph_entry(cx, r->m, &s, &fresh);
    free(s.v);
  }
  if (g && g->state == 0 && !fresh) /* the second run of this signature: capture it */
    g->state = graph_capture(b, r, first, last, g) ? 1 : -1;
  if (g && g->state == 1) {
    cudaError_t ce = cudaGraphLaunch(g->exec, run_stream(b, r));
    if (ce != cudaSuccess)
      rc = cu_err(r->err, b->device, ce, "launching the run's CUDA Graph");
  } else {
    rc = run_range(b, r, first, last);
    if (g && g->state == 0 && rc)
      g->state = -1;
  }
  pthread_mutex_unlock(&cx->lock);
  return rc;
}

static void cu_model_release(spn_backend_t *b, const spn_model_t *m) {
  cu_ctx_t *cx = b->ctx;
  pthread_mutex_lock(&cx->lock);
  cudaSetDevice(cx->dev);
  for (cu_graph_t **it = &cx->graphs; *it;) {
    if ((*it)->m == m) {
      cu_graph_t *old = *it;
      *it = old->next;
      graph_free(old);
      cx->n_graphs--;
    } else {
      it = &(*it)->next;
    }
  }
  pthread_mutex_unlock(&cx->lock);
}

static int32_t cu_run_end(spn_backend_t *b, spn_run_t *r, bool sync) {
  cu_ctx_t *cx = b->ctx;
  if (!sync)
    return SPN_OK;
  cudaSetDevice(cx->dev);
  CU(cudaStreamSynchronize(run_stream(b, r)), "end of run");
  return SPN_OK;
}

/* Arenas come from the device layer's buffer type (stream-ordered pool
 * allocations; a GPU the health monitor marked unusable refuses them). */
static int32_t cu_buf_alloc(spn_backend_t *b, size_t size, void **data, void **handle, spn_error_t *err) {
  spn_buffer_t *buf = NULL;
  int32_t rc = spn_buffer_type_alloc(b->buffer_type, size ? size : 256, &buf, err);
  if (rc) {
    *data = NULL;
    return spn_error_prefix(err, "%s: arena of %zu bytes", b->device, size);
  }
  *data = spn_buffer_data(buf);
  *handle = buf;
  return SPN_OK;
}

static void cu_buf_free(spn_backend_t *b, void *data, void *handle) {
  (void)b, (void)data;
  spn_buffer_t *buf = handle;
  spn_buffer_unref(&buf);
}

static int32_t cu_to_host(spn_backend_t *b, spn_run_t *r, void *dst, const void *src, size_t n) {
  CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, run_stream(b, r)), "copy to the host");
  return SPN_OK;
}

static int32_t cu_from_host(spn_backend_t *b, spn_run_t *r, void *dst, const void *src, size_t n) {
  CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, run_stream(b, r)), "copy from the host");
  return SPN_OK;
}

/* Fences are CUDA events (no timing) recorded on the run's stream. */
static int32_t cu_fence_record(spn_backend_t *b, spn_run_t *r, void **fence) {
  cu_ctx_t *cx = b->ctx;
  cudaSetDevice(cx->dev);
  if (!*fence) {
    cudaEvent_t ev;
    CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "creating a fence");
    *fence = ev;
  }
  CU(cudaEventRecord((cudaEvent_t)*fence, run_stream(b, r)), "recording a fence");
  return SPN_OK;
}

static int32_t cu_fence_wait(spn_backend_t *b, spn_run_t *r, void *fence) {
  cu_ctx_t *cx = b->ctx;
  cudaSetDevice(cx->dev);
  CU(cudaStreamWaitEvent(run_stream(b, r), (cudaEvent_t)fence, 0), "waiting for a fence");
  return SPN_OK;
}

static void cu_fence_free(spn_backend_t *b, void *fence) {
  cu_ctx_t *cx = b->ctx;
  cudaSetDevice(cx->dev);
  (void)cudaEventSynchronize((cudaEvent_t)fence);
  (void)cudaEventDestroy((cudaEvent_t)fence);
  (void)cudaGetLastError();
}

static void cu_free(spn_backend_t *b) {
  cu_ctx_t *cx = b->ctx;
  if (cx) {
    cudaSetDevice(cx->dev);
    for (cu_graph_t *g = cx->graphs, *nx; g; g = nx) {
      nx = g->next;
      graph_free(g);
    }
    if (cx->lt) cx->lt_api.Destroy(cx->lt);
    spn__lt_api_close(&cx->lt_api);
    if (cx->dnn) cudnnDestroy(cx->dnn);
    algos_free(cx);
    if (cx->stream) cudaStreamDestroy(cx->stream);
    if (cx->cap_stream) cudaStreamDestroy(cx->cap_stream);
    if (cx->devs) spn__devices_free(&cx->devs, cx->n_devs);
    pthread_mutex_destroy(&cx->lock);
    free(cx);
  }
  free(b);
}

#ifdef SPN_HAVE_NCCL
/* Node j of m when it runs here, prepared: its context, else NULL. */
static const cu_node_t *gpu_node(const spn_model_t *m, int j) {
  const spn_node_t *n = &m->nodes[j];
  return !n->dead && n->backend == m->dev_slot ? n->bctx : NULL;
}

/* replicate(): ms[0]'s device weights broadcast to ms[1..n) with NCCL over
 * one communicator of the n GPUs, made for the call. The copies must hold
 * the same weights in the same order (they were parsed and prepared alike);
 * a difference is refused before anything moves. */
static int32_t cu_replicate(spn_backend_t *const *bs, spn_model_t *const *ms, int n, spn_error_t *err) {
  const spn_model_t *m0 = ms[0];
  size_t items = 0;
  for (int i = 1; i < n; i++)
    if (ms[i]->n_node != m0->n_node)
      return spn_error_set(err, SPN_EINTERNAL, "%s: its graphs on %s and %s differ", m0->path, m0->device,
                           ms[i]->device);
  for (int j = 0; j < m0->n_node; j++) {
    const cu_node_t *c0 = gpu_node(m0, j);
    for (int i = 1; i < n; i++) {
      const cu_node_t *ci = gpu_node(ms[i], j);
      bool same = !c0 == !ci && (!c0 || ci->n_w == c0->n_w);
      for (int w = 0; same && c0 && w < c0->n_w; w++)
        same = ci->w[w].n == c0->w[w].n;
      if (!same)
        return spn_error_set(err, SPN_EINTERNAL, "%s: node \"%s\" holds different weights on %s and %s", m0->path,
                             m0->nodes[j].name ? m0->nodes[j].name : "?", m0->device, ms[i]->device);
    }
    if (c0)
      items += (size_t)c0->n_w;
  }
  void **ptrs = calloc(items * (size_t)n + 1, sizeof *ptrs);
  size_t *sizes = calloc(items + 1, sizeof *sizes);
  if (!ptrs || !sizes) {
    free(ptrs);
    free(sizes);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  size_t k = 0;
  for (int j = 0; j < m0->n_node; j++) {
    const cu_node_t *c0 = gpu_node(m0, j);
    for (int w = 0; c0 && w < c0->n_w; w++, k++) {
      sizes[k] = c0->w[w].n;
      for (int i = 0; i < n; i++)
        ptrs[k * (size_t)n + (size_t)i] = gpu_node(ms[i], j)->w[w].p;
    }
  }
  spn_device_t *devs[SPN_MAX_BACKENDS];
  for (int i = 0; i < n; i++)
    devs[i] = ((cu_ctx_t *)bs[i]->ctx)->devs[0];
  spn__nccl_t *comm = NULL;
  int32_t rc = spn__nccl_new(devs, (uint32_t)n, &comm, err);
  if (rc == SPN_OK)
    rc = spn__nccl_broadcast_many(comm, 0, items, ptrs, sizes, err);
  spn__nccl_free(&comm);
  free(ptrs);
  free(sizes);
  return rc;
}
#endif

static const spn_backend_iface_t cu_iface = {
    .supports = cu_supports,
    .prepare = cu_prepare,
    .prepare_shape = cu_prepare_shape,
    .owns_const = cu_owns_const,
    .node_free = cu_node_free,
    .compute = cu_compute,
    .run_end = cu_run_end,
    .buf_alloc = cu_buf_alloc,
    .buf_free = cu_buf_free,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .fence_record = cu_fence_record,
    .fence_wait = cu_fence_wait,
    .fence_free = cu_fence_free,
    .model_release = cu_model_release,
#ifdef SPN_HAVE_NCCL
    .replicate = cu_replicate,
#endif
    .free = cu_free,
};

static int32_t cu_open(const spn_backend_factory_t *f, int index, spn_backend_t **out, spn_error_t *err) {
  (void)f;
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || index >= count) {
    (void)cudaGetLastError();
    return spn_error_set(err, SPN_EDEVICE, "cuda:%d: no such CUDA device (%d present%s%s)", index, ce == cudaSuccess ? count : 0, ce == cudaSuccess ? "" : ": ", ce == cudaSuccess ? "" : cudaGetErrorString(ce));
  }
  spn_backend_t *b = calloc(1, sizeof *b);
  cu_ctx_t *cx = calloc(1, sizeof *cx);
  if (!b || !cx) {
    free(b);
    free(cx);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  pthread_mutex_init(&cx->lock, NULL);
  cx->dev = index;
  const char *heur = getenv("SPINDLE_CUDNN_HEURISTIC");
  cx->heuristic = heur && *heur && strcmp(heur, "0");
  const char *nhwc = getenv("SPINDLE_CUDA_NHWC");
  cx->nhwc = !nhwc || strcmp(nhwc, "0") != 0; /* the default since an H200 measured it faster on every model */
  b->iface = &cu_iface;
  b->ctx = cx;
  snprintf(b->device, sizeof b->device, "cuda:%d", index);
  b->device_kind = SPN_DEVICE_CUDA;
  b->mem_kind = SPN_MEM_DEVICE;
  b->host_memory = false;
  char spec[32];
  snprintf(spec, sizeof spec, "cuda:%d", index);
  const spn__backend_t *extra[] = {spn__backend_cuda()};
  int32_t rc = spn__devices_open(spec, extra, 1, &cx->devs, &cx->n_devs, err);
  if (!rc && cx->n_devs != 1)
    rc = spn_error_set(err, SPN_EDEVICE, "%s: the device layer opened %u devices", spec, cx->n_devs);
  if (!rc) {
    b->buffer_type = spn_device_buffer_type(cx->devs[0], SPN_MEM_DEVICE);
    if ((ce = cudaSetDevice(index)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&cx->cap_stream, cudaStreamNonBlocking)) != cudaSuccess)
      rc = cu_err(err, b->device, ce, "opening the device");
  }
  cudnnStatus_t ds;
  if (!rc && (ds = cudnnCreate(&cx->dnn)) != CUDNN_STATUS_SUCCESS)
    rc = dnn_err(err, b->device, ds, "handle");
  if (!rc && !cx->heuristic)
    algos_open(cx, b->device);
  if (!rc)
    rc = spn__lt_api_open(&cx->lt_api, b->device, err);
  if (!rc && cx->lt_api.Create(&cx->lt) != CUBLAS_STATUS_SUCCESS)
    rc = spn_error_set(err, SPN_ECUDA, "%s: cannot create the cuBLASLt handle", b->device);
  if (rc) {
    cu_free(b);
    return rc;
  }
  *out = b;
  return SPN_OK;
}

int32_t spn_engine_cuda_factory(spn_backend_factory_t *f) {
  *f = (spn_backend_factory_t){.prefix = "cuda", .open = cu_open};
  return SPN_OK;
}
