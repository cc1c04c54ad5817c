/* engine-internal.h — the engine's graph representation, shared by the
 * loader, the graph passes, the operators and the CPU backend.
 *
 * A model is a list of values (named tensors) and a topologically sorted
 * list of nodes. Values are inputs, constants (initializers, folded results)
 * or intermediates. Shapes are only known per run (the batch dimension is
 * dynamic and some shapes are computed by the graph itself), so each run
 * infers shapes node by node into a per-run table, computes small "shape
 * class" values (Shape -> Gather -> Concat chains) on the spot, plans one
 * arena by value lifetimes and then executes. */
#ifndef SPN_ENGINE_INTERNAL_H
#define SPN_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "spindle/engine.h"

#define SPN_MAXD SPN_TENSOR_MAX_DIMS

/* Operators: X(enum, "OnnxName", "allowed,attributes") */
#define SPN_OP_MAP(X)                                                                        \
  X(CONV, "Conv", "auto_pad,dilations,group,kernel_shape,pads,strides")                     \
  X(CONVT, "ConvTranspose", "auto_pad,dilations,group,kernel_shape,output_padding,output_shape,pads,strides") \
  X(BN, "BatchNormalization", "epsilon,momentum,training_mode,spatial")                       \
  X(RELU, "Relu", "")                                                                        \
  X(LRELU, "LeakyRelu", "alpha")                                                             \
  X(PRELU, "PRelu", "")                                                                      \
  X(SIGMOID, "Sigmoid", "")                                                                  \
  X(TANH, "Tanh", "")                                                                        \
  X(CLIP, "Clip", "min,max")                                                                 \
  X(SOFTMAX, "Softmax", "axis")                                                              \
  X(ADD, "Add", "")                                                                          \
  X(SUB, "Sub", "")                                                                          \
  X(MUL, "Mul", "")                                                                          \
  X(DIV, "Div", "")                                                                          \
  X(CONCAT, "Concat", "axis")                                                                \
  X(SPLIT, "Split", "axis,split,num_outputs")                                                \
  X(D2S, "DepthToSpace", "blocksize,mode")                                                   \
  X(RESIZE, "Resize", "coordinate_transformation_mode,cubic_coeff_a,exclude_outside,extrapolation_value,mode,nearest_mode") \
  X(UPSAMPLE, "Upsample", "mode,scales")                                                     \
  X(TRANSPOSE, "Transpose", "perm")                                                          \
  X(RESHAPE, "Reshape", "allowzero")                                                         \
  X(FLATTEN, "Flatten", "axis")                                                              \
  X(SQUEEZE, "Squeeze", "axes")                                                              \
  X(UNSQUEEZE, "Unsqueeze", "axes")                                                          \
  X(MAXPOOL, "MaxPool", "auto_pad,ceil_mode,dilations,kernel_shape,pads,storage_order,strides") \
  X(AVGPOOL, "AveragePool", "auto_pad,ceil_mode,count_include_pad,kernel_shape,pads,strides") \
  X(GAP, "GlobalAveragePool", "")                                                            \
  X(PAD, "Pad", "mode,pads,value")                                                           \
  X(SLICE, "Slice", "starts,ends,axes")                                                      \
  X(GATHER, "Gather", "axis")                                                                \
  X(SHAPE, "Shape", "start,end")                                                             \
  X(CONSTANT, "Constant", "value,value_float,value_floats,value_int,value_ints")             \
  X(COS, "ConstantOfShape", "value")                                                         \
  X(CAST, "Cast", "to,saturate")                                                             \
  X(MATMUL, "MatMul", "")                                                                    \
  X(GEMM, "Gemm", "alpha,beta,transA,transB")                                                \
  X(EXP, "Exp", "")                                                                          \
  X(REDUCEMEAN, "ReduceMean", "axes,keepdims,noop_with_empty_axes")                          \
  X(IDENTITY, "Identity", "")                                                               \
  /* internal: made by the engine's rewrites, never read from a file */                    \
  X(INTERLEAVE, "spindle:PhaseInterleave", "blocksize")

/* PhaseInterleave: b*b inputs of one shape (N, C, H, W), the phases of an
 * output (N, C, b*H, b*W): y[n, c, b*h + i, b*w + j] = input #(i*b + j)
 * [n, c, h, w]. Inputs and output each in either layout (NCHW or
 * channels-last, spn_value_t.nhwc). */

typedef enum spn_op {
#define SPN__OPE(e, n, a) SPN_OP_##e,
  SPN_OP_MAP(SPN__OPE)
#undef SPN__OPE
  SPN_OP_COUNT
} spn_op_t;

/* Operators a model file may name: those before the first internal one. */
#define SPN_OP_FILE_COUNT SPN_OP_INTERLEAVE

extern const char *const spn_op_names[SPN_OP_COUNT];

/* A parsed node attribute. */
typedef enum { SPN_ATTR_F = 1, SPN_ATTR_I = 2, SPN_ATTR_S = 3, SPN_ATTR_T = 4, SPN_ATTR_FS = 6, SPN_ATTR_IS = 7 } spn_attr_type_t;

typedef struct spn_attr {
  char *name;
  int type;
  float f;
  int64_t i;
  char *s;         /* STRING (NUL-terminated copy) */
  int64_t *ints;   /* INTS */
  float *floats;   /* FLOATS */
  int64_t n;       /* count of ints/floats */
  int tval;        /* TENSOR: index of a constant value holding it */
} spn_attr_t;

typedef enum { SPN_VAL_INTER, SPN_VAL_INPUT, SPN_VAL_CONST } spn_val_kind_t;

typedef struct spn_value {
  char *name;
  int kind;
  int32_t dtype;
  int ndim;               /* for consts and declared inputs/outputs; -1 unknown */
  int64_t shape[SPN_MAXD];/* declared: -1 dynamic */
  void *data;             /* consts: owned, 64-byte aligned */
  int producer;           /* node index, -1 for inputs/consts */
  int last_use;           /* last node index reading it (planning) */
  int n_uses;
  bool is_output;
  bool shape_class;       /* small host value computed during shape inference */
  bool nhwc;              /* kept channels-last between two 2-D convolutions */
  int alias;              /* a view (Reshape, Flatten, Squeeze, Unsqueeze,
                             Identity) sharing this value's memory: -1, or the
                             value whose bytes it uses (never itself an alias) */
} spn_value_t;

/* Fused post-operations on Conv/ConvTranspose/Gemm outputs, in order.
 * SCALE multiplies by the constant a (a Mul by a one-element constant); it
 * is fused only in models whose device is the CPU (graph.c). */
typedef enum { SPN_POST_RELU, SPN_POST_LRELU, SPN_POST_SIGMOID, SPN_POST_TANH, SPN_POST_CLIP, SPN_POST_ADD, SPN_POST_PRELU, SPN_POST_SCALE } spn_post_kind_t;
typedef struct spn_post {
  int kind;
  float a, b;
  int val; /* ADD: value added (same shape as the output); PRELU: slope (a = its size) */
} spn_post_t;
#define SPN_MAX_POST 4

typedef struct spn_node {
  int op;
  char *name;
  char *op_name;
  int n_in, n_out;
  int *in;  /* value index, -1 for an omitted optional input */
  int *out;
  int n_attr;
  spn_attr_t *attrs;
  bool dead;
  bool shape_class;
  int n_post;
  spn_post_t post[SPN_MAX_POST];
  int backend;          /* slot of the backend it runs on (plan.c) */
  void *bctx;           /* that backend's per-node context (node_free) */
  pthread_mutex_t lock; /* guards bctx for backends that build it lazily */
  bool lock_init;
} spn_node_t;

/* The value node n reads as operand k of n_in + n_post: its inputs, then
 * each post-op's operand (ADD's addend, PRELU's slope); -1 for an omitted
 * input or a post-op that reads none. */
static inline int spn_node_operand(const spn_node_t *n, int k) {
  if (k < n->n_in)
    return n->in[k];
  const spn_post_t *p = &n->post[k - n->n_in];
  return p->kind == SPN_POST_ADD || p->kind == SPN_POST_PRELU ? p->val : -1;
}

/* Model precision (spn_model_opts_t.precision). */
typedef enum { SPN_PREC_FP32 = 0, SPN_PREC_TF32 = 1, SPN_PREC_FP16 = 2 } spn_precision_t;

/* A value read by nodes of a backend other than the one holding it: each
 * run copies it into an arena slot of `slot` before node `first` and frees
 * that slot after node `last`. */
typedef struct spn_cross {
  int val, slot, first, last;
} spn_cross_t;

typedef struct spn_engine_shared spn_engine_shared_t;

/* The memory plan of one (model, input shapes): offsets of every value in
 * its backend's arena, of each boundary copy, and of each backend's scratch
 * (after the values). Built by the first run of those shapes, kept by the
 * model (at most SPN_MAX_PLANS, least recently used dropped), shared by
 * runs (refs). The arena of the last run is kept in `idle` for the next. */
#define SPN_MAX_PLANS 4
typedef struct spn_shape_plan {
  int64_t *key;  /* per input: rank, then dims (SPN_MAXD + 1 entries) */
  size_t *off;   /* per value */
  size_t *xoff;  /* per boundary copy */
  size_t top[SPN_MAX_BACKENDS];
  size_t ws_off[SPN_MAX_BACKENDS], ws_n[SPN_MAX_BACKENDS];
  struct {
    void *p, *h;
    size_t n;
    void *fence; /* device backends: the last run's work on it (fence_record) */
  } idle[SPN_MAX_BACKENDS];
  bool has_idle;
  int refs;      /* under the model's pool_lock; the list holds one */
  uint64_t tick; /* last use */
  struct spn_shape_plan *next;
} spn_shape_plan_t;

struct spn_model {
  spn_engine_t *eng;
  spn_engine_shared_t *shared;
  char *key;      /* "device|canonical path" */
  char *path;     /* for messages */
  char *device;
  int dev_slot;        /* backend slot of the model's device */
  int precision;       /* spn_precision_t */
  bool fallback_error; /* refuse nodes the device cannot run */
  bool no_graphs;      /* device backends run eagerly, never as CUDA Graphs */
  bool unclaimed;      /* loaded for a peer (spn_model_opts_t.peers), no load has taken it yet */
  char origin[256];    /* spn_model_origin */
  /* Loaded for a peer whose device weights come from another GPU's copy of
   * the same model (backend replicate()): prepare allocates them and leaves
   * their contents. Set only during that load. */
  bool weights_deferred;
  int n_fallback;      /* live nodes placed on the CPU although the device is not */
  int n_cross;
  spn_cross_t *cross;
  int refs;       /* guarded by the engine's registry lock */
  int threads;
  int n_val, cap_val;
  spn_value_t *vals;
  int n_node, cap_node;
  spn_node_t *nodes;
  int n_inputs, n_outputs;
  int *inputs, *outputs; /* value indices */
  int64_t opset;
  int64_t params;
  double flops;
  int n_hist;
  const char *hist_op[SPN_OP_COUNT];
  int32_t hist_n[SPN_OP_COUNT];
  int n_live_nodes;
  int64_t (*dyn_in)[SPN_MAXD];
  struct spn_model *next; /* registry list */
  /* Buffers kept between runs (arenas, scratch) so a run does not fault in
   * fresh pages; taken and returned under pool_lock. */
  pthread_mutex_t pool_lock;
  bool pool_lock_init;
  int n_pool;
  struct { void *p; size_t n; void *h; int slot; } pool[8];
  spn_shape_plan_t *plans; /* under pool_lock */
  uint64_t plan_tick;
  int64_t n_plan_builds;   /* plans built (tests: one per new shape) */
};

/* Per-run state of one value. */
typedef struct spn_rt_val {
  int32_t dtype;
  int ndim;
  int64_t shape[SPN_MAXD];
  void *data;
  size_t bytes;
  size_t off;     /* arena offset */
  bool host_owned;/* malloc'd shape-class value or external buffer */
  bool ext;       /* data not to be freed by the run */
} spn_rt_val_t;

typedef struct spn_run {
  spn_model_t *m;
  spn_rt_val_t *v;
  spn_error_t *err;
  int threads;
  void *brun[SPN_MAX_BACKENDS]; /* per-run state of each backend (CPU: oneDNN stream) */
  void *stream;      /* the caller's native stream (device backends), or NULL */
  void *bws[SPN_MAX_BACKENDS]; /* each backend's scratch in its arena (prepare_shape) */
  size_t bws_n[SPN_MAX_BACKENDS];
  void *scratch;     /* per-run transient host buffer for CPU temporaries */
  size_t scratch_n;
  void *scratch_h;
  bool profile;      /* node by node (spn_model_profile): device backends run eagerly */
} spn_run_t;

/* Pooled buffers of backend `slot`: take one of at least `n` bytes (NULL on
 * failure; *h is the backend's handle); give it back with its size and
 * handle. Thread: any. */
void *spn_pool_take(spn_model_t *m, int slot, size_t n, size_t *got, void **h);
void spn_pool_give(spn_model_t *m, int slot, void *p, size_t n, void *h);
/* A run's transient backend buffer of at least n bytes (valid until the next
 * call in the same run). */
void *spn_run_scratch(spn_run_t *r, size_t n);

/* Shared backend state of an engine: the backend instances (slot 0 the CPU)
 * and the factories that open device backends, refcounted so models outlive
 * their engine object if released late. */
struct spn_engine_shared {
  spn_backend_t *backends[SPN_MAX_BACKENDS];
  int n_backends;
  spn_backend_factory_t factories[4];
  int n_factories;
  int refs;
  pthread_mutex_t lock;
};

/* The backend instance of `device` ("cpu", "cpu:N", "prefix:N"), opened on
 * first use; its slot in *slot. Thread: any (takes s->lock). */
int32_t spn_shared_backend(spn_engine_shared_t *s, const char *device, int *slot, spn_error_t *err);
/* Register a factory for device prefix f->prefix (the CUDA backend; tests
 * add their own). Thread: before loading models on that prefix. */
int32_t spn_engine_add_backend(spn_engine_t *eng, const spn_backend_factory_t *f, spn_error_t *err);

/* loader.c */
int32_t spn_onnx_parse(spn_model_t *m, const uint8_t *buf, size_t len, const char *dir,
                       spn_error_t *err);
int spn_model_add_value(spn_model_t *m, const char *name, spn_error_t *err);
int spn_model_find_value(const spn_model_t *m, const char *name);
const spn_attr_t *spn_node_attr(const spn_node_t *n, const char *name);
int64_t spn_attr_int(const spn_node_t *n, const char *name, int64_t def);
float spn_attr_float(const spn_node_t *n, const char *name, float def);
const char *spn_attr_str(const spn_node_t *n, const char *name, const char *def);
void spn_model_destroy(spn_model_t *m);
/* Free a node's attributes (their strings and arrays too); none left. */
void spn_node_attrs_free(spn_node_t *n);
void *spn_aligned_alloc(size_t bytes);

/* graph.c */
int32_t spn_graph_prepare(spn_model_t *m, bool fuse, spn_error_t *err);
/* Run (see spn_model_run_on for host and device tensors and the stream);
 * shapes_only: infer and fill the outputs' dtype, ndim and shape only. */
/* prof (NULL: a normal run): run node by node, waiting for each, and
 * record each node's time (spn_model_profile). */
typedef struct spn_profile {
  spn_node_time_t *t;
  int max, n;
} spn_profile_t;
int32_t spn_graph_run(spn_model_t *m, const spn_tensor_t *in, int n_in, spn_tensor_t *out,
                      int n_out, int threads, void *stream, bool shapes_only, spn_profile_t *prof,
                      spn_error_t *err);

/* plan.c: place live nodes on backends, prepare them, find boundary values. */
int32_t spn_plan_place(spn_model_t *m, spn_error_t *err);
/* plan.c: make Reshape/Flatten/Squeeze/Unsqueeze/Identity views of their
 * input (vals[].alias) where the memory can be shared: the input is an
 * intermediate on the view's own backend, the output is not a graph output.
 * The view then runs as nothing. Call after placement. */
void spn_plan_views(spn_model_t *m);
/* plan.c: in a model whose device is the CPU, a 2-D Conv with a fused
 * residual Add writes its channels-last output over its channels-last
 * addend (vals[out].alias) when nothing reads the addend's bytes after it:
 * oneDNN then adds it as a sum
 * post-op, which keeps its brgemm kernels (a binary add post-op makes
 * oneDNN 2.6 fall back to its slower direct kernel), with no copy. Call
 * after spn_plan_views. */
void spn_plan_inplace(spn_model_t *m);
/* graph.c: free the model's cached shape plans and their arenas. */
void spn_plans_free(spn_model_t *m);

/* arena.c: offsets of values with lifetimes [first, last] (node steps,
 * inclusive) in one arena: at a step, values starting there are placed
 * before values ending there are released, so live values never overlap.
 * Offsets are multiples of align (a power of two); zero-size values get
 * offset 0 and no bytes. *peak: the arena's size. SPN_ENOMEM, SPN_EINVAL
 * (align) or SPN_EOVERFLOW, without a message. */
typedef struct spn_live {
  size_t size;
  int first, last;
} spn_live_t;
int32_t spn_arena_plan(const spn_live_t *v, int n, size_t align, size_t *off, size_t *peak);

/* ops-shape.c: backend-neutral checks and shape inference. */
int32_t spn_op_infer(spn_run_t *r, const spn_node_t *n);
int32_t spn_op_check(const spn_model_t *m, const spn_node_t *n, spn_error_t *err);

/* cpu-kernels.c: run one node on the host (CPU backend, constant folding,
 * shape-class values). */
int32_t spn_cpu_exec(spn_run_t *r, const spn_node_t *n);
/* Resize/Upsample index and weight tables over (D, H, W) (1-D and 2-D
 * resizes have leading size-1 axes): *i0 holds the first source index of
 * every output coordinate, D then H then W (tot = osh[0]+osh[1]+osh[2]
 * entries), followed by the second (linear) index; *w the weight of the
 * second. Shared by the CPU kernel and device backends. Caller frees both. */
int32_t spn_resize_tables(spn_run_t *r, const spn_node_t *n, int64_t *ish, int64_t *osh, int *linear,
                          int64_t **i0, float **w);
/* Resize mode "cubic" over the one or two innermost (spatial) dims: sp =
 * {ih, iw, oh, ow} (a 1-D resize has ih = oh = 1 and an identity H table),
 * and per output coordinate, H then W, its 4 source indices (clamped to
 * the edge) in *idx and their weights in *w (exclude_outside applied):
 * 4 * (oh + ow) entries each. The CPU kernel's tables, shared with device
 * backends, which sum the taps in its order. Caller frees both. */
int32_t spn_resize_cubic_tables(spn_run_t *r, const spn_node_t *n, int64_t *sp, int64_t **idx, float **w);
/* Whether n is a Resize of mode "cubic" (spn_resize_cubic_tables' kind;
 * the loader refuses cubic for Upsample). */
bool spn_resize_is_cubic(const spn_node_t *n);

/* cpu-dnnl.c (the CPU backend's oneDNN part) */
int32_t spn_dnnl_engine_new(void **eng, spn_error_t *err);
void spn_dnnl_engine_free(void *eng);
int32_t spn_dnnl_conv(spn_run_t *r, const spn_node_t *n, bool transposed);
int32_t spn_dnnl_pool(spn_run_t *r, const spn_node_t *n);
void spn_dnnl_node_free(spn_node_t *n);
void spn_dnnl_run_end(spn_run_t *r);
/* convert.c: weight conversions for device backends. fp16 is IEEE binary16,
 * round to nearest even, subnormals kept, overflow to inf, NaN kept NaN.
 * Layout: N images of C channels of HW pixels, element size es. */
uint16_t spn_f32_to_f16(float f);
float spn_f16_to_f32(uint16_t h);
void spn_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
void spn_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void spn_nchw_to_nhwc(const void *src, void *dst, size_t es, int64_t N, int64_t C, int64_t HW);
void spn_nhwc_to_nchw(const void *src, void *dst, size_t es, int64_t N, int64_t C, int64_t HW);
/* backend-cpu.c: the oneDNN engine of the model's CPU backend. */
void *spn_cpu_dnnl_engine(const spn_model_t *m);
/* Whether this CPU's oneDNN runs a convolution whose sum post-op (an Add
 * written in place over its addend) follows other post-ops, in a kernel
 * other than the reference one (AVX-512: yes; AVX2 in oneDNN 2.6: no). */
bool spn_cpu_dnnl_late_sum(const spn_model_t *m);
int32_t spn_sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* Helpers shared by ops and backend. */
int32_t spn_conv_geometry(const spn_node_t *n, const spn_rt_val_t *x, const spn_rt_val_t *w,
                          bool transposed, int64_t *stride, int64_t *dil, int64_t *pl,
                          int64_t *pr, int64_t *out_sp, spn_error_t *err);
void spn_apply_post(spn_run_t *r, const spn_node_t *n, float *y, int64_t count);
/* Post-ops [from, to) of node n (to == 0: all remaining) on plain-layout y. */
typedef struct spn_spost { const spn_node_t *n; int from, to; } spn_spost_t;
void spn_apply_post_from(spn_run_t *r, const spn_spost_t *sp, float *y, int64_t count);

#endif
