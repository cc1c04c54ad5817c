/* test-backend.c — the engine's backend interface and planner on the CPU.
 *
 * A "mock" device backend, registered only here, runs a few operators with
 * the CPU kernels but in its own memory: its arena buffers are tracked, and
 * it refuses to run a node whose inputs or outputs lie outside them (a
 * missing boundary copy), or whose constant inputs it did not place itself in
 * prepare(). Copies to and from the host are counted. Results must equal the
 * plain CPU run bit for bit (same kernels), so any wrong copy, wrong arena
 * slot or stale value shows. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine-internal.h"
#include "onnx-build.h"

/* spn_model_opts_t grows only into its reserved tail: no_graphs took one
 * reserved int, size and earlier offsets unchanged (LP64). */
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(spn_model_opts_t) == 64, "spn_model_opts_t size changed");
_Static_assert(offsetof(spn_model_opts_t, fallback) == 24, "spn_model_opts_t layout changed");
_Static_assert(offsetof(spn_model_opts_t, no_graphs) == 32, "spn_model_opts_t layout changed");
_Static_assert(offsetof(spn_model_opts_t, n_peers) == 36, "spn_model_opts_t layout changed");
_Static_assert(offsetof(spn_model_opts_t, peers) == 40, "spn_model_opts_t layout changed");
_Static_assert(offsetof(spn_model_opts_t, peer_uploads) == 48, "spn_model_opts_t layout changed");
_Static_assert(offsetof(spn_model_opts_t, reserved) == 52, "spn_model_opts_t layout changed");
_Static_assert(sizeof(spn_model_opts_t) == 64, "spn_model_opts_t size changed");
#endif

/* ---- the mock device backend ---- */

typedef struct {
  uint64_t ops;        /* bit per spn_op_t it supports */
  bool typed;          /* also require every operand's dtype to be known fp32, as the CUDA backend does */
  int n_buf;
  struct { uint8_t *p; size_t n; } buf[64];
  int from_host, to_host; /* copies */
  int syncs;              /* run_end(sync) calls */
  int computed;           /* nodes run */
  _Atomic int prepared;   /* nodes prepared */
  int bad;                /* nodes refused: an operand outside its memory */
  int fences, fence_waits, fence_frees, fences_made;
  void *last_stream;      /* the stream of the last compute */
  bool can_replicate;     /* offer replicate() (peers' weights from one copy) */
  bool replicate_fails;   /* ... which then fails */
  bool owns_consts;       /* offer owns_const(): compute reads only its own copies of constant inputs */
  _Atomic int weights_copied;   /* constant inputs filled by prepare */
  _Atomic int weights_deferred; /* ... left for replicate */
  int replicates, replicated; /* replicate() calls; models filled by them */
  /* Concurrent loads: buffers are tracked under buf_lock; with `hold`, a
   * prepare waits (up to 5 s) until two loads are inside prepare at once,
   * which sets `overlapped`. */
  pthread_mutex_t buf_lock;
  _Atomic bool hold, overlapped;
  _Atomic int in_prepare;
} mock_t;

/* Per-node context: the node's constant inputs, copied into mock memory. */
typedef struct {
  int n;
  void *data[8];
} mock_node_t;

static bool mock_owns(mock_t *mk, const void *p, size_t n) {
  bool yes = false;
  pthread_mutex_lock(&mk->buf_lock);
  for (int i = 0; i < mk->n_buf && !yes; i++)
    yes = (const uint8_t *)p >= mk->buf[i].p && (const uint8_t *)p + n <= mk->buf[i].p + mk->buf[i].n;
  pthread_mutex_unlock(&mk->buf_lock);
  return yes;
}

/* With mk->hold: wait until another load is in prepare too (5 s at most). */
static void mock_meet(mock_t *mk) {
  if (!mk->hold || mk->overlapped)
    return;
  if (atomic_fetch_add(&mk->in_prepare, 1) + 1 >= 2)
    mk->overlapped = true;
  for (int ms = 0; ms < 5000 && !mk->overlapped; ms++)
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  atomic_fetch_sub(&mk->in_prepare, 1);
}

static bool mock_supports(spn_backend_t *b, const spn_model_t *m, const spn_node_t *n, char *why, size_t why_n) {
  mock_t *mk = b->ctx;
  if (mk->typed)
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] >= 0 && m->vals[n->in[k]].dtype != SPN_DTYPE_F32) {
        snprintf(why, why_n, "operand '%s' is not known to be fp32", m->vals[n->in[k]].name);
        return false;
      }
  if (n->op < 64 && (mk->ops >> n->op) & 1)
    return true;
  snprintf(why, why_n, "the mock backend has no %s kernel", n->op_name);
  return false;
}

static int32_t mock_prepare(spn_backend_t *b, spn_model_t *m, spn_node_t *n, spn_error_t *err) {
  mock_t *mk = b->ctx;
  mock_meet(mk);
  mock_node_t *c = calloc(1, sizeof *c);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  for (int k = 0; k < n->n_in && k < 8; k++) {
    int vi = n->in[k];
    if (vi < 0 || m->vals[vi].kind != SPN_VAL_CONST)
      continue;
    const spn_value_t *v = &m->vals[vi];
    size_t bytes = spn_dtype_size(v->dtype);
    for (int d = 0; d < v->ndim; d++)
      bytes *= (size_t)v->shape[d];
    void *h;
    if (b->iface->buf_alloc(b, bytes, &c->data[k], &h, err)) {
      free(c);
      return SPN_ENOMEM;
    }
    if (m->weights_deferred) {
      mk->weights_deferred++; /* left as garbage: replicate() fills it */
    } else {
      memcpy(c->data[k], v->data, bytes);
      mk->weights_copied++;
    }
  }
  n->bctx = c;
  mk->prepared++;
  return SPN_OK;
}

static void mock_node_free(spn_backend_t *b, spn_node_t *n) {
  (void)b;
  free(n->bctx); /* constant copies live in the backend's tracked buffers */
  n->bctx = NULL;
}

static int32_t mock_compute(spn_backend_t *b, spn_run_t *r, int first, int last) {
  mock_t *mk = b->ctx;
  mk->last_stream = r->stream;
  for (int i = first; i < last; i++) {
    const spn_node_t *n = &r->m->nodes[i];
    if (n->dead || n->shape_class || n->backend != b->slot)
      continue;
    const mock_node_t *c = n->bctx;
    void *saved[8] = {0};
    bool ok = true;
    for (int k = 0; k < n->n_in && k < 8; k++) {
      int vi = n->in[k];
      if (vi < 0)
        continue;
      saved[k] = r->v[vi].data;
      if (r->m->vals[vi].kind == SPN_VAL_CONST) {
        ok = ok && c->data[k];
        r->v[vi].data = c->data[k];
      } else {
        ok = ok && mock_owns(mk, r->v[vi].data, r->v[vi].bytes);
      }
    }
    for (int o = 0; o < n->n_out; o++)
      ok = ok && (n->out[o] < 0 || mock_owns(mk, r->v[n->out[o]].data, r->v[n->out[o]].bytes));
    int32_t rc = ok ? spn_cpu_exec(r, n) : spn_error_set(r->err, SPN_EINTERNAL, "mock: node '%s' reads or writes outside mock memory", n->name);
    for (int k = 0; k < n->n_in && k < 8; k++)
      if (n->in[k] >= 0)
        r->v[n->in[k]].data = saved[k];
    if (rc) {
      mk->bad++;
      return rc;
    }
    mk->computed++;
  }
  return SPN_OK;
}

static int32_t mock_run_end(spn_backend_t *b, spn_run_t *r, bool sync) {
  (void)r;
  ((mock_t *)b->ctx)->syncs += sync;
  return SPN_OK;
}

static int32_t mock_alloc(spn_backend_t *b, size_t size, void **data, void **handle, spn_error_t *err) {
  mock_t *mk = b->ctx;
  uint8_t *p = malloc(size ? size : 1);
  if (!p)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  memset(p, 0xA5, size); /* garbage, as device memory would be */
  pthread_mutex_lock(&mk->buf_lock);
  if (mk->n_buf == 64) {
    pthread_mutex_unlock(&mk->buf_lock);
    free(p);
    return spn_error_set(err, SPN_ENOMEM, "mock: out of buffers");
  }
  mk->buf[mk->n_buf].p = p;
  mk->buf[mk->n_buf++].n = size;
  pthread_mutex_unlock(&mk->buf_lock);
  *data = p;
  *handle = p;
  return SPN_OK;
}

static void mock_buf_free(spn_backend_t *b, void *data, void *handle) {
  (void)handle;
  mock_t *mk = b->ctx;
  pthread_mutex_lock(&mk->buf_lock);
  for (int i = 0; i < mk->n_buf; i++)
    if (mk->buf[i].p == data) {
      mk->buf[i] = mk->buf[--mk->n_buf];
      break;
    }
  pthread_mutex_unlock(&mk->buf_lock);
  free(data);
}

static int32_t mock_to_host(spn_backend_t *b, spn_run_t *r, void *dst, const void *src, size_t n) {
  mock_t *mk = b->ctx;
  if (!mock_owns(mk, src, n) || mock_owns(mk, dst, n))
    return spn_error_set(r->err, SPN_EINTERNAL, "mock: to_host from outside mock memory");
  memcpy(dst, src, n);
  mk->to_host++;
  return SPN_OK;
}

static int32_t mock_from_host(spn_backend_t *b, spn_run_t *r, void *dst, const void *src, size_t n) {
  mock_t *mk = b->ctx;
  if (!mock_owns(mk, dst, n) || mock_owns(mk, src, n))
    return spn_error_set(r->err, SPN_EINTERNAL, "mock: from_host into outside mock memory");
  memcpy(dst, src, n);
  mk->from_host++;
  return SPN_OK;
}

static int32_t mock_fence_record(spn_backend_t *b, spn_run_t *r, void **fence) {
  (void)r;
  mock_t *mk = b->ctx;
  if (!*fence) {
    *fence = malloc(1);
    mk->fences_made++;
  }
  mk->fences++;
  return *fence ? SPN_OK : SPN_ENOMEM;
}

static int32_t mock_fence_wait(spn_backend_t *b, spn_run_t *r, void *fence) {
  (void)r, (void)fence;
  ((mock_t *)b->ctx)->fence_waits++;
  return SPN_OK;
}

static void mock_fence_free(spn_backend_t *b, void *fence) {
  ((mock_t *)b->ctx)->fence_frees++;
  free(fence);
}

static void mock_free(spn_backend_t *b) {
  mock_t *mk = b->ctx;
  while (mk->n_buf)
    mock_buf_free(b, mk->buf[0].p, NULL);
  free(b);
}

/* The peers' constants copied from ms[0]'s, node by node. */
static int32_t mock_replicate(spn_backend_t *const *bs, spn_model_t *const *ms, int n, spn_error_t *err) {
  mock_t *mk = bs[0]->ctx;
  mk->replicates++;
  if (mk->replicate_fails)
    return spn_error_set(err, SPN_ECUDA, "mock: the interconnect is down");
  const spn_model_t *m0 = ms[0];
  for (int i = 1; i < n; i++) {
    assert_int_equal(ms[i]->n_node, m0->n_node);
    assert_true(ms[i]->dev_slot != m0->dev_slot);
    for (int j = 0; j < m0->n_node; j++) {
      const spn_node_t *a = &m0->nodes[j], *b = &ms[i]->nodes[j];
      if (a->dead || a->backend != m0->dev_slot)
        continue;
      assert_int_equal(b->backend, ms[i]->dev_slot);
      const mock_node_t *ca = a->bctx, *cb = b->bctx;
      for (int k = 0; k < a->n_in && k < 8; k++) {
        if (!ca->data[k])
          continue;
        const spn_value_t *v = &m0->vals[a->in[k]];
        size_t bytes = spn_dtype_size(v->dtype);
        for (int d = 0; d < v->ndim; d++)
          bytes *= (size_t)v->shape[d];
        memcpy(cb->data[k], ca->data[k], bytes);
      }
    }
    mk->replicated++;
  }
  return SPN_OK;
}

/* compute swaps every constant input for its copy (mock_compute), so the
 * host data is never read after prepare; post-op operands are not copied. */
static bool mock_owns_const(spn_backend_t *b, const spn_model_t *m, const spn_node_t *n, int k) {
  (void)b, (void)m;
  const mock_node_t *c = n->bctx;
  return c && k < n->n_in && k < 8 && c->data[k];
}

#define MOCK_IFACE                                                                                     \
  .supports = mock_supports, .prepare = mock_prepare, .node_free = mock_node_free, .compute = mock_compute, \
  .run_end = mock_run_end, .buf_alloc = mock_alloc, .buf_free = mock_buf_free, .to_host = mock_to_host,   \
  .from_host = mock_from_host, .fence_record = mock_fence_record, .fence_wait = mock_fence_wait,          \
  .fence_free = mock_fence_free, .free = mock_free
static const spn_backend_iface_t mock_iface = {MOCK_IFACE};
static const spn_backend_iface_t mock_rep_iface = {MOCK_IFACE, .replicate = mock_replicate};
static const spn_backend_iface_t mock_own_iface = {MOCK_IFACE, .owns_const = mock_owns_const};

static int32_t mock_open(const spn_backend_factory_t *f, int index, spn_backend_t **out, spn_error_t *err) {
  (void)index;
  spn_backend_t *b = calloc(1, sizeof *b);
  if (!b)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  const mock_t *mk = f->data;
  b->iface = mk->can_replicate ? &mock_rep_iface : mk->owns_consts ? &mock_own_iface : &mock_iface;
  b->device_kind = SPN_DEVICE_CUDA;
  b->mem_kind = SPN_MEM_DEVICE;
  b->host_memory = false;
  b->ctx = f->data;
  *out = b;
  return SPN_OK;
}

static spn_engine_t *mock_engine(mock_t *mk, uint64_t ops) {
  memset(mk, 0, sizeof *mk);
  pthread_mutex_init(&mk->buf_lock, NULL);
  mk->ops = ops;
  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  o.threads = 1;
  spn_engine_t *e = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_new(&o, &e, &err), SPN_OK);
  spn_backend_factory_t f = {.prefix = "mock", .open = mock_open, .data = mk};
  assert_int_equal(spn_engine_add_backend(e, &f, &err), SPN_OK);
  return e;
}

#define OPBIT(op) (1ull << SPN_OP_##op)

/* ---- models ---- */

/* x (N,4) -> Sigmoid "sig0" -> a; Relu(a) "relu0" -> b (output 2);
 * Mul(b, x) "mul0" -> c; Mul(c, k) "mulk" with constant k (4);
 * Tanh "tanh0" -> y (output 1). */
static pb_t chain_model(void) {
  pb_t g = {0};
  const char *i0[] = {"x"}, *o0[] = {"a"};
  node(&g, "Sigmoid", "sig0", i0, 1, o0, 1, NULL, 0);
  const char *i1[] = {"a"}, *o1[] = {"b"};
  node(&g, "Relu", "relu0", i1, 1, o1, 1, NULL, 0);
  const char *i2[] = {"b", "x"}, *o2[] = {"c"};
  node(&g, "Mul", "mul0", i2, 2, o2, 1, NULL, 0);
  const char *i3[] = {"c", "k"}, *o3[] = {"d"};
  node(&g, "Mul", "mulk", i3, 2, o3, 1, NULL, 0);
  const char *i4[] = {"d"}, *o4[] = {"y"};
  node(&g, "Tanh", "tanh0", i4, 1, o4, 1, NULL, 0);
  pb_str(&g, 2, "g");
  int64_t kd[] = {4};
  const float k[] = {0.5f, -1.5f, 2.f, 3.f};
  initializer(&g, "k", 1, kd, k, 4);
  int64_t d[] = {-1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  value_info(&g, 12, "b", -1, NULL);
  return model(&g, 17);
}

static void run2(spn_model_t *m, int64_t batch, spn_tensor_t out[2]) {
  float *x = malloc((size_t)batch * 4 * sizeof(float));
  assert_non_null(x);
  for (int64_t i = 0; i < batch * 4; i++)
    x[i] = (float)((i * 37) % 17) / 4.f - 2.f;
  spn_tensor_t in = SPN_TENSOR_INIT;
  in.dtype = SPN_DTYPE_F32;
  in.ndim = 2;
  in.shape[0] = batch;
  in.shape[1] = 4;
  in.data = x;
  out[0] = (spn_tensor_t)SPN_TENSOR_INIT;
  out[1] = (spn_tensor_t)SPN_TENSOR_INIT;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_model_run(m, &in, 1, out, 2, &err);
  if (rc)
    fail_msg("run failed: %s", err.msg);
  free(x);
}

/* run2's outputs of two models on one batch are equal; frees both pairs. */
static void outputs_equal(spn_tensor_t a[2], spn_tensor_t b[2], int64_t batch) {
  for (int o = 0; o < 2; o++) {
    assert_memory_equal(a[o].data, b[o].data, (size_t)batch * 4 * sizeof(float));
    spn_model_output_free(&a[o]);
    spn_model_output_free(&b[o]);
  }
}

static spn_model_t *load(spn_engine_t *e, pb_t *pm, const char *device, const char *fallback) {
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.device = device;
  o.fallback = fallback;
  spn_model_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_engine_load_memory_opts(e, pm->p, pm->n, "chain.onnx", &o, &m, &err);
  if (rc)
    fail_msg("load failed: %s", err.msg);
  return m;
}

/* Mixed placement: Relu and both Muls on the mock, Sigmoid and Tanh on the
 * CPU; results equal the CPU-only run exactly; copies happen exactly at the
 * boundaries: x and a into the mock (from_host), d back for Tanh and the
 * output b at the end (to_host). */
static void test_fallback_places_and_copies(void **state) {
  (void)state;
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  spn_model_t *ref = load(e, &pm, "cpu", NULL);
  spn_model_t *m = load(e, &pm, "mock:0", NULL);
  assert_string_equal(spn_model_device(m), "mock:0");
  assert_int_equal(spn_model_fallback_count(m), 2);
  assert_int_equal(spn_model_fallback_count(ref), 0);
  assert_int_equal(mk.prepared, 3);
  int n_mock = 0;
  for (int i = 0; i < m->n_node; i++)
    if (!m->nodes[i].dead) {
      bool dev = m->nodes[i].op == SPN_OP_RELU || m->nodes[i].op == SPN_OP_MUL;
      assert_int_equal(m->nodes[i].backend, dev ? m->dev_slot : SPN_BACKEND_CPU);
      n_mock += dev;
    }
  assert_int_equal(n_mock, 3);
  int64_t batches[] = {3, 1, 7, 3};
  for (int t = 0; t < 4; t++) {
    spn_tensor_t a[2], b[2];
    run2(ref, batches[t], a);
    mk.from_host = mk.to_host = mk.computed = mk.syncs = 0;
    run2(m, batches[t], b);
    assert_int_equal(mk.computed, 3);
    assert_int_equal(mk.from_host, 2);
    assert_int_equal(mk.to_host, 2);
    assert_int_equal(mk.syncs, 2); /* after d comes back for Tanh, and at the end */
    for (int o = 0; o < 2; o++) {
      assert_int_equal(b[o].shape[0], batches[t]);
      assert_int_equal(b[o].device_kind, SPN_DEVICE_CPU);
    }
    outputs_equal(a, b, batches[t]);
  }
  assert_int_equal(mk.bad, 0);
  spn_model_release(&m);
  spn_model_release(&ref);
  spn_engine_free(&e);
  free(pm.p);
}

/* Every node on the device. With `typed`, the mock also judges nodes by
 * their operands' dtypes (as the CUDA backend does): it must see the
 * intermediates' types at placement although the file declares none of them
 * (chain_model gives value_info only for x, y and b). Either way the run
 * equals the CPU's, with one copy in and the two outputs copied out. */
static void check_all_on_device(bool typed) {
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL) | OPBIT(SIGMOID) | OPBIT(TANH));
  mk.typed = typed;
  spn_model_t *ref = load(e, &pm, "cpu", NULL);
  spn_model_t *m = load(e, &pm, "mock:0", "error");
  assert_int_equal(spn_model_fallback_count(m), 0);
  spn_tensor_t a[2], b[2];
  run2(ref, 5, a);
  run2(m, 5, b);
  assert_int_equal(mk.computed, 5);
  assert_int_equal(mk.from_host, 1);
  assert_int_equal(mk.to_host, 2);
  outputs_equal(a, b, 5);
  spn_model_release(&m);
  spn_model_release(&ref);
  spn_engine_free(&e);
  free(pm.p);
}

/* A constant whose every reader keeps its own copy (owns_const) has its
 * host data freed at the end of the load, and the runs still equal the
 * CPU's; one read by a node on the CPU, or on a backend that does not say
 * it owns its copies, keeps it. */
static void test_owned_consts_freed(void **state) {
  (void)state;
  pb_t pm = chain_model();
  struct { uint64_t ops; bool owns; bool freed; } cases[] = {
      {OPBIT(RELU) | OPBIT(MUL), true, true},   /* mulk on the mock, which owns its copy of k */
      {OPBIT(RELU), true, false},               /* mulk on the CPU: reads k's host data */
      {OPBIT(RELU) | OPBIT(MUL), false, false}, /* a backend without owns_const */
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    mock_t mk;
    spn_engine_t *e = mock_engine(&mk, cases[c].ops);
    mk.owns_consts = cases[c].owns;
    spn_model_t *ref = load(e, &pm, "cpu", NULL);
    spn_model_t *m = load(e, &pm, "mock:0", NULL);
    const spn_value_t *k = &m->vals[spn_model_find_value(m, "k")];
    assert_int_equal(k->kind, SPN_VAL_CONST);
    if ((k->data == NULL) != cases[c].freed)
      fail_msg("case %zu: k's host data %s", c, k->data ? "kept" : "freed");
    assert_non_null(ref->vals[spn_model_find_value(ref, "k")].data); /* the CPU model's own copy */
    int64_t batches[] = {3, 1, 5};
    for (int i = 0; i < 3; i++) {
      spn_tensor_t a[2], b[2];
      run2(ref, batches[i], a);
      run2(m, batches[i], b);
      outputs_equal(a, b, batches[i]);
    }
    assert_int_equal(mk.bad, 0);
    spn_model_release(&m);
    spn_model_release(&ref);
    spn_engine_free(&e);
  }
  free(pm.p);
}

static void test_all_on_device(void **state) {
  (void)state;
  check_all_on_device(false);
}

static void test_intermediate_types_known_at_placement(void **state) {
  (void)state;
  check_all_on_device(true);
}

/* fallback = "error" refuses the first node the device cannot run, naming
 * the node, its op and the device; nothing is loaded. */
static void test_fallback_error_refuses(void **state) {
  (void)state;
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.device = "mock:0";
  o.fallback = "error";
  spn_model_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_load_memory_opts(e, pm.p, pm.n, "chain.onnx", &o, &m, &err), SPN_EUNSUPPORTED);
  assert_null(m);
  assert_non_null(strstr(err.msg, "chain.onnx"));
  assert_non_null(strstr(err.msg, "'sig0' (Sigmoid)"));
  assert_non_null(strstr(err.msg, "mock:0"));
  assert_non_null(strstr(err.msg, "no Sigmoid kernel"));
  spn_engine_free(&e);
  free(pm.p);
}

/* Bad options and devices are refused by name. */
static void test_bad_options(void **state) {
  (void)state;
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU));
  spn_error_t err = SPN_ERROR_INIT;
  spn_model_t *m = NULL;
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.precision = "fp8";
  assert_int_equal(spn_engine_load_memory_opts(e, pm.p, pm.n, "chain.onnx", &o, &m, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "fp8"));
  o = (spn_model_opts_t)SPN_MODEL_OPTS_INIT;
  o.fallback = "gpu";
  assert_int_equal(spn_engine_load_memory_opts(e, pm.p, pm.n, "chain.onnx", &o, &m, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "fallback 'gpu'"));
  o = (spn_model_opts_t)SPN_MODEL_OPTS_INIT;
  o.device = "tpu:0";
  assert_int_equal(spn_engine_load_memory_opts(e, pm.p, pm.n, "chain.onnx", &o, &m, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "tpu:0"));
  o.device = "mock:x";
  assert_int_equal(spn_engine_load_memory_opts(e, pm.p, pm.n, "chain.onnx", &o, &m, &err), SPN_EINVAL);
  o.struct_size = 4;
  assert_int_equal(spn_engine_load_memory_opts(e, pm.p, pm.n, "chain.onnx", &o, &m, &err), SPN_EABI);
  assert_null(m);
  /* fp16 on the CPU is accepted (the CPU computes in fp32). */
  o = (spn_model_opts_t)SPN_MODEL_OPTS_INIT;
  o.precision = "fp16";
  assert_int_equal(spn_engine_load_memory_opts(e, pm.p, pm.n, "chain.onnx", &o, &m, &err), SPN_OK);
  spn_model_release(&m);
  spn_engine_free(&e);
  free(pm.p);
}

/* Two devices of one prefix get two backend instances (weights per GPU). */
static void test_one_backend_per_device(void **state) {
  (void)state;
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  spn_model_t *a = load(e, &pm, "mock:0", NULL), *b = load(e, &pm, "mock:1", NULL), *c = load(e, &pm, "mock:0", NULL);
  assert_int_not_equal(a->dev_slot, b->dev_slot);
  assert_int_equal(a->dev_slot, c->dev_slot);
  assert_string_equal(a->shared->backends[b->dev_slot]->device, "mock:1");
  spn_model_release(&a);
  spn_model_release(&b);
  spn_model_release(&c);
  spn_engine_free(&e);
  free(pm.p);
}

/* ---- conversions used by device backends at load ---- */

static float f32_bits(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void test_fp16_conversion(void **state) {
  (void)state;
  /* Every half value survives half -> float -> half (NaN stays NaN). */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = spn_f16_to_f32((uint16_t)h);
    bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    if (nan) {
      assert_true(isnan(f));
      uint16_t back = spn_f32_to_f16(f);
      assert_true(((back >> 10) & 0x1f) == 0x1f && (back & 0x3ff));
    } else {
      assert_int_equal(spn_f32_to_f16(f), h);
    }
  }
  /* Known values: normals, round to nearest even at ties, subnormals,
   * underflow to zero, overflow to inf, signs. */
  assert_int_equal(spn_f32_to_f16(1.f), 0x3c00);
  assert_int_equal(spn_f32_to_f16(-2.f), 0xc000);
  assert_int_equal(spn_f32_to_f16(1.f + 0x1p-11f), 0x3c00);       /* tie -> even */
  assert_int_equal(spn_f32_to_f16(1.f + 3 * 0x1p-11f), 0x3c02);   /* tie -> even */
  assert_int_equal(spn_f32_to_f16(1.f + 0x1p-11f + 0x1p-20f), 0x3c01);
  assert_int_equal(spn_f32_to_f16(0x1p-14f), 0x0400);  /* smallest normal */
  assert_int_equal(spn_f32_to_f16(0x1p-24f), 0x0001);  /* smallest subnormal */
  assert_int_equal(spn_f32_to_f16(0x1p-25f), 0x0000);  /* tie -> even (0) */
  assert_int_equal(spn_f32_to_f16(3 * 0x1p-26f), 0x0001);
  assert_int_equal(spn_f32_to_f16(-0x1p-30f), 0x8000); /* signed zero */
  assert_int_equal(spn_f32_to_f16(0x1.ff8p-15f), 0x03ff); /* 1023 subnormal steps exactly */
  assert_int_equal(spn_f32_to_f16(0x1.ffcp-15f), 0x0400); /* 1023.5: tie, rounds up into the smallest normal */
  assert_int_equal(spn_f32_to_f16(65504.f), 0x7bff);
  assert_int_equal(spn_f32_to_f16(65519.f), 0x7bff);
  assert_int_equal(spn_f32_to_f16(65520.f), 0x7c00);   /* rounds to inf */
  assert_int_equal(spn_f32_to_f16(1e10f), 0x7c00);
  assert_int_equal(spn_f32_to_f16(-INFINITY), 0xfc00);
  assert_true(isnan(spn_f16_to_f32(spn_f32_to_f16(NAN))));
  assert_true(spn_f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(spn_f16_to_f32(0x03ff) == 0x3ffp-24f);
  assert_true(spn_f16_to_f32(0xfbff) == -65504.f);
  assert_true(isinf(spn_f16_to_f32(0x7c00)));
#if defined(__FLT16_MAX__)
  /* Against the compiler's own conversion, over many float bit patterns. */
  uint32_t x = 12345;
  for (int i = 0; i < 2000000; i++) {
    x = x * 1664525u + 1013904223u;
    float f = f32_bits(x);
    if (isnan(f))
      continue;
    _Float16 hf = (_Float16)f;
    uint16_t ref;
    memcpy(&ref, &hf, 2);
    if (spn_f32_to_f16(f) != ref)
      fail_msg("f32 %a (0x%08x): got 0x%04x, the compiler gives 0x%04x", (double)f, x, spn_f32_to_f16(f), ref);
  }
#else
  (void)f32_bits;
#endif
  float v[5] = {0.1f, -3.25f, 1000.f, 0x1p-20f, 0.f}, w[5];
  uint16_t h[5];
  spn_f32_to_f16_n(v, h, 5);
  spn_f16_to_f32_n(h, w, 5);
  for (int i = 0; i < 5; i++)
    assert_true(fabsf(w[i] - v[i]) <= fabsf(v[i]) * 0x1p-11f + 0x1p-25f);
}

static void test_layout_conversion(void **state) {
  (void)state;
  /* N=2, C=3, H*W=4: element (n,c,i) = 100n + 10c + i. */
  float nchw[24], nhwc[24], back[24];
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int i = 0; i < 4; i++)
        nchw[(n * 3 + c) * 4 + i] = (float)(100 * n + 10 * c + i);
  spn_nchw_to_nhwc(nchw, nhwc, sizeof(float), 2, 3, 4);
  for (int n = 0; n < 2; n++)
    for (int i = 0; i < 4; i++)
      for (int c = 0; c < 3; c++)
        assert_true(nhwc[(n * 4 + i) * 3 + c] == (float)(100 * n + 10 * c + i));
  spn_nhwc_to_nchw(nhwc, back, sizeof(float), 2, 3, 4);
  assert_memory_equal(nchw, back, sizeof nchw);
  /* 2-byte elements (fp16 weights). */
  uint16_t a[6] = {1, 2, 3, 4, 5, 6}, b[6];
  spn_nchw_to_nhwc(a, b, 2, 1, 2, 3); /* C=2, HW=3: (1,2,3),(4,5,6) -> 1,4,2,5,3,6 */
  const uint16_t want[6] = {1, 4, 2, 5, 3, 6};
  assert_memory_equal(b, want, sizeof want);
}


/* ---- arena planning (arena.c) ---- */

static bool live_overlap(const spn_live_t *a, const spn_live_t *b) {
  int ae = a->last < a->first ? a->first : a->last, be = b->last < b->first ? b->first : b->last;
  return a->first <= be && b->first <= ae;
}

/* Random lifetimes: no two values alive at one step share a byte, offsets
 * are aligned, the arena is no bigger than the sum of the sizes and no
 * smaller than the bytes alive at the busiest step. */
static void test_arena_plan_random(void **state) {
  (void)state;
  uint64_t seed = 12345;
  for (int round = 0; round < 200; round++) {
    int n = 1 + round % 60;
    spn_live_t v[60];
    size_t off[60], peak = 0, sum = 0;
    for (int i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      int first = (int)((seed >> 33) % 40), len = (int)((seed >> 20) % 12);
      size_t size = (size_t)((seed >> 40) % 5000);
      if (i % 7 == 3)
        size = 0;
      v[i] = (spn_live_t){size, first, first + len - (i % 5 == 0 ? len + 1 : 0)}; /* some last < first */
      sum += (size + 63) & ~(size_t)63;
    }
    assert_int_equal(spn_arena_plan(v, n, 64, off, &peak), SPN_OK);
    assert_true(peak <= sum);
    size_t busiest = 0;
    for (int step = 0; step < 60; step++) {
      size_t alive = 0;
      for (int i = 0; i < n; i++) {
        spn_live_t one = {0, step, step};
        if (live_overlap(&v[i], &one))
          alive += (v[i].size + 63) & ~(size_t)63;
      }
      busiest = alive > busiest ? alive : busiest;
    }
    assert_true(peak >= busiest);
    for (int i = 0; i < n; i++) {
      assert_int_equal(off[i] % 64, 0);
      if (v[i].size)
        assert_true(off[i] + v[i].size <= peak);
      for (int j = i + 1; j < n; j++)
        if (v[i].size && v[j].size && live_overlap(&v[i], &v[j]))
          assert_true(off[i] + v[i].size <= off[j] || off[j] + v[j].size <= off[i]);
    }
  }
}

/* A chain a -> b -> c -> d of equal sizes: a node's output never shares its
 * input's bytes, but c reuses a's and d reuses b's (two buffers in all). */
static void test_arena_plan_reuse(void **state) {
  (void)state;
  spn_live_t v[4] = {{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}, {1000, 3, 3}};
  size_t off[4], peak;
  assert_int_equal(spn_arena_plan(v, 4, 64, off, &peak), SPN_OK);
  assert_int_equal(peak, 2 * 1024);
  assert_int_not_equal(off[0], off[1]);
  assert_int_not_equal(off[1], off[2]);
  assert_int_not_equal(off[2], off[3]);
  assert_int_equal(off[2], off[0]);
  assert_int_equal(off[3], off[1]);
  /* Freed neighbours merge: after a and b die, one value of both sizes fits
   * below the top. */
  spn_live_t w[4] = {{512, 0, 1}, {512, 0, 1}, {64, 0, 3}, {1024, 2, 3}};
  assert_int_equal(spn_arena_plan(w, 4, 64, off, &peak), SPN_OK);
  assert_int_equal(peak, 1024 + 64);
  assert_int_equal(spn_arena_plan(w, 4, 48, off, &peak), SPN_EINVAL);
  assert_int_equal(spn_arena_plan(w, 0, 64, off, &peak), SPN_OK);
  assert_int_equal(peak, 0);
}

/* ---- views ---- */

/* x (N,4) -> Relu "relu0" -> a -> Unsqueeze(axes 1) -> b (N,1,4)
 * -> Squeeze(axes 1) -> c -> Flatten(axis 1) -> d -> Identity -> e
 * -> Sigmoid -> y (output 1); Identity(a) -> z (output 2). Opset 11. */
static pb_t view_model(void) {
  pb_t g = {0};
  int64_t ax[] = {1};
  attr_t axes = {.name = "axes", .type = 7, .n = 1, .ints = ax}, fl = {.name = "axis", .type = 2, .i = 1};
  const char *i0[] = {"x"}, *o0[] = {"a"};
  node(&g, "Relu", "relu0", i0, 1, o0, 1, NULL, 0);
  const char *i1[] = {"a"}, *o1[] = {"b"};
  node(&g, "Unsqueeze", "unsq", i1, 1, o1, 1, &axes, 1);
  const char *i2[] = {"b"}, *o2[] = {"c"};
  node(&g, "Squeeze", "sq", i2, 1, o2, 1, &axes, 1);
  const char *i3[] = {"c"}, *o3[] = {"d"};
  node(&g, "Flatten", "flat", i3, 1, o3, 1, &fl, 1);
  const char *i4[] = {"d"}, *o4[] = {"e"};
  node(&g, "Identity", "ident", i4, 1, o4, 1, NULL, 0);
  const char *i5[] = {"e"}, *o5[] = {"y"};
  node(&g, "Sigmoid", "sig0", i5, 1, o5, 1, NULL, 0);
  const char *i6[] = {"a"}, *o6[] = {"z"};
  node(&g, "Identity", "identout", i6, 1, o6, 1, NULL, 0);
  pb_str(&g, 2, "g");
  int64_t d[] = {-1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  value_info(&g, 12, "z", -1, NULL);
  return model(&g, 11);
}

static int value_named(const spn_model_t *m, const char *name) {
  int vi = spn_model_find_value(m, name);
  assert_true(vi >= 0);
  return vi;
}

static void check_view_outputs(spn_model_t *m, int64_t batch) {
  spn_tensor_t out[2];
  run2(m, batch, out);
  for (int64_t i = 0; i < batch * 4; i++) {
    float x = (float)((i * 37) % 17) / 4.f - 2.f, a = x > 0.f ? x : 0.f;
    assert_float_equal(((float *)out[0].data)[i], 1.f / (1.f + expf(-a)), 1e-6);
    assert_float_equal(((float *)out[1].data)[i], a, 0);
  }
  assert_int_equal(out[0].ndim, 2);
  assert_int_equal(out[0].shape[1], 4);
  spn_model_output_free(&out[0]);
  spn_model_output_free(&out[1]);
}

/* Reshape-class nodes share their input's bytes: the CPU arena holds one
 * value (a; y and z are the caller's buffers), results are right, and a
 * view that is a graph output is a real copy. */
static void test_views_cpu(void **state) {
  (void)state;
  pb_t pm = view_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, 0);
  spn_model_t *m = load(e, &pm, "cpu", NULL);
  int a = value_named(m, "a");
  assert_int_equal(m->vals[a].alias, -1);
  assert_int_equal(m->vals[value_named(m, "b")].alias, a);
  assert_int_equal(m->vals[value_named(m, "c")].alias, a);
  assert_int_equal(m->vals[value_named(m, "d")].alias, a);
  assert_int_equal(m->vals[value_named(m, "e")].alias, a);
  assert_int_equal(m->vals[value_named(m, "z")].alias, -1);
  int64_t batches[] = {5, 1, 5, 33};
  for (int t = 0; t < 4; t++) {
    check_view_outputs(m, batches[t]);
    const spn_shape_plan_t *p = m->plans; /* key: rank 2, batch, 4 */
    while (p && p->key[1] != batches[t])
      p = p->next;
    assert_non_null(p);
    assert_int_equal(p->top[SPN_BACKEND_CPU], ((size_t)batches[t] * 16 + 63) & ~(size_t)63);
  }
  assert_int_equal(m->n_plan_builds, 3); /* 5, 1, 33 */
  spn_model_release(&m);
  spn_engine_free(&e);
  free(pm.p);
}

/* On a device backend: Relu and the views on the mock (views of a there),
 * Sigmoid on the CPU reading the last view through one boundary copy, the
 * output view z a device value copied out. */
static void test_views_device(void **state) {
  (void)state;
  pb_t pm = view_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(UNSQUEEZE) | OPBIT(SQUEEZE) | OPBIT(FLATTEN) | OPBIT(IDENTITY));
  spn_model_t *m = load(e, &pm, "mock:0", NULL);
  assert_int_equal(spn_model_fallback_count(m), 1);
  int a = value_named(m, "a");
  assert_int_equal(m->vals[value_named(m, "e")].alias, a);
  for (int64_t batch = 1; batch <= 9; batch += 4) {
    mk.from_host = mk.to_host = 0;
    check_view_outputs(m, batch);
    assert_int_equal(mk.from_host, 1); /* x */
    assert_int_equal(mk.to_host, 2);   /* e for Sigmoid, z at the end */
  }
  assert_int_equal(mk.bad, 0);
  spn_model_release(&m);
  spn_engine_free(&e);
  free(pm.p);
}

/* Plans are built once per input shape and at most SPN_MAX_PLANS are kept;
 * results do not depend on which plan or arena a run got. */
static void test_plan_cache(void **state) {
  (void)state;
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  spn_model_t *ref = load(e, &pm, "cpu", NULL);
  spn_model_t *m = load(e, &pm, "mock:0", NULL);
  int64_t batches[] = {2, 2, 3, 2, 4, 5, 6, 7, 2, 3};
  for (int t = 0; t < 10; t++) {
    spn_tensor_t a[2], b[2];
    run2(ref, batches[t], a);
    run2(m, batches[t], b);
    outputs_equal(a, b, batches[t]);
    int listed = 0;
    for (const spn_shape_plan_t *p = m->plans; p; p = p->next)
      listed++;
    assert_true(listed <= SPN_MAX_PLANS);
  }
  /* 2, 3, 4, 5, 6, 7, then 2 and 3 again after being dropped. */
  assert_int_equal(m->n_plan_builds, 8);
  assert_int_equal(mk.bad, 0);
  spn_model_release(&m);
  spn_model_release(&ref);
  spn_engine_free(&e);
  free(pm.p);
}


/* ---- device-resident inputs and outputs ---- */

static void *mock_mem(spn_model_t *m, size_t n) {
  spn_backend_t *b = m->shared->backends[m->dev_slot];
  void *p = NULL, *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(b->iface->buf_alloc(b, n, &p, &h, &err), SPN_OK);
  return p;
}

static void mock_mem_free(spn_model_t *m, void *p) {
  spn_backend_t *b = m->shared->backends[m->dev_slot];
  b->iface->buf_free(b, p, p);
}

static spn_tensor_t tensor2(void *data, int64_t batch, bool dev) {
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = batch;
  t.shape[1] = 4;
  t.data = data;
  t.device_kind = dev ? SPN_DEVICE_CUDA : SPN_DEVICE_CPU;
  return t;
}

/* Inputs and outputs in the device's memory are used in place on the
 * caller's stream, and a run with only device outputs does not wait: no
 * copy, no sync, one fence on its arena, which the next run waits for. */
static void test_device_io_in_place(void **state) {
  (void)state;
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL) | OPBIT(SIGMOID) | OPBIT(TANH));
  spn_model_t *ref = load(e, &pm, "cpu", NULL);
  spn_model_t *m = load(e, &pm, "mock:0", NULL);
  const int64_t batch = 6;
  size_t bytes = (size_t)batch * 4 * sizeof(float);
  float *x = mock_mem(m, bytes), *y = mock_mem(m, bytes), *bo = mock_mem(m, bytes);
  for (int64_t i = 0; i < batch * 4; i++)
    x[i] = (float)((i * 37) % 17) / 4.f - 2.f;
  spn_tensor_t want[2];
  run2(ref, batch, want);
  spn_tensor_t in = tensor2(x, batch, true);
  spn_tensor_t shapes[2] = {SPN_TENSOR_INIT, SPN_TENSOR_INIT};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_model_output_shapes(m, &in, 1, shapes, 2, &err), SPN_OK);
  assert_int_equal(shapes[0].ndim, 2);
  assert_int_equal(shapes[0].shape[0], batch);
  assert_int_equal(shapes[1].shape[1], 4);
  assert_null(shapes[0].data);
  void *stream = (void *)(uintptr_t)0x5151;
  for (int round = 0; round < 3; round++) {
    spn_tensor_t out[2] = {tensor2(y, batch, true), tensor2(bo, batch, true)};
    mk.from_host = mk.to_host = mk.syncs = mk.fences = mk.fence_waits = 0;
    int32_t rc = spn_model_run_on(m, &in, 1, out, 2, stream, &err);
    if (rc)
      fail_msg("run_on: %s", err.msg);
    assert_int_equal(mk.from_host, 0);
    assert_int_equal(mk.to_host, 0);
    assert_int_equal(mk.syncs, 0);
    assert_int_equal(mk.fences, 1);
    assert_int_equal(mk.fence_waits, round ? 1 : 0);
    assert_ptr_equal(mk.last_stream, stream);
    assert_ptr_equal(out[0].data, y);
    assert_int_equal(out[0].device_kind, SPN_DEVICE_CUDA);
    assert_memory_equal(y, want[0].data, bytes);
    assert_memory_equal(bo, want[1].data, bytes);
    memset(y, 0, bytes);
  }
  /* A host output makes the run wait again. */
  spn_tensor_t mixed[2] = {tensor2(y, batch, true), tensor2(NULL, batch, false)};
  mk.syncs = 0;
  assert_int_equal(spn_model_run_on(m, &in, 1, mixed, 2, stream, &err), SPN_OK);
  assert_true(mk.syncs >= 1);
  assert_memory_equal(mixed[1].data, want[1].data, bytes);
  assert_memory_equal(y, want[0].data, bytes);
  spn_model_output_free(&mixed[1]);
  /* Misuse: a device output without a buffer, another device's memory. */
  spn_tensor_t nobuf[2] = {tensor2(NULL, batch, true), tensor2(bo, batch, true)};
  assert_int_equal(spn_model_run_on(m, &in, 1, nobuf, 2, stream, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "caller's buffer"));
  spn_tensor_t other = in;
  other.device_index = 1;
  spn_tensor_t out2[2] = {tensor2(y, batch, true), tensor2(bo, batch, true)};
  assert_int_equal(spn_model_run_on(m, &other, 1, out2, 2, stream, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "'x'"));
  assert_int_equal(spn_model_run_on(ref, &in, 1, out2, 2, NULL, &err), SPN_EINVAL); /* a CPU model */
  assert_int_equal(mk.bad, 0);
  mock_mem_free(m, x);
  mock_mem_free(m, y);
  mock_mem_free(m, bo);
  int made = mk.fences_made;
  spn_model_release(&m);
  assert_int_equal(mk.fence_frees, made); /* waited for before the arena went */
  spn_model_release(&ref);
  for (int o = 0; o < 2; o++)
    spn_model_output_free(&want[o]);
  spn_engine_free(&e);
  free(pm.p);
}

/* With nodes on the CPU: a device input the CPU reads is copied to the
 * host once; a device output produced on the CPU is copied into the
 * caller's device buffer; results still equal the CPU model's. */
static void test_device_io_fallback(void **state) {
  (void)state;
  pb_t pm = chain_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  spn_model_t *ref = load(e, &pm, "cpu", NULL);
  spn_model_t *m = load(e, &pm, "mock:0", NULL);
  const int64_t batch = 3;
  size_t bytes = (size_t)batch * 4 * sizeof(float);
  float *x = mock_mem(m, bytes), *y = mock_mem(m, bytes);
  for (int64_t i = 0; i < batch * 4; i++)
    x[i] = (float)((i * 37) % 17) / 4.f - 2.f;
  spn_tensor_t want[2];
  run2(ref, batch, want);
  spn_tensor_t in = tensor2(x, batch, true);
  spn_tensor_t out[2] = {tensor2(y, batch, true), tensor2(NULL, batch, false)};
  spn_error_t err = SPN_ERROR_INIT;
  mk.from_host = mk.to_host = 0;
  int32_t rc = spn_model_run_on(m, &in, 1, out, 2, NULL, &err);
  if (rc)
    fail_msg("run_on: %s", err.msg);
  assert_memory_equal(y, want[0].data, bytes);
  assert_memory_equal(out[1].data, want[1].data, bytes);
  assert_int_equal(mk.to_host, 1 + 2);   /* x for Sigmoid; d for Tanh and b at the end */
  assert_int_equal(mk.from_host, 2 + 1); /* x and a into the mock; y into its buffer */
  assert_int_equal(mk.bad, 0);
  spn_model_output_free(&out[1]);
  mock_mem_free(m, x);
  mock_mem_free(m, y);
  spn_model_release(&m);
  spn_model_release(&ref);
  for (int o = 0; o < 2; o++)
    spn_model_output_free(&want[o]);
  spn_engine_free(&e);
  free(pm.p);
}

/* ---- peers: one read of the file, the weights from one copy ---- */

/* Overwrite the file: a load that reads it from now on fails. */
static void spoil(const char *path) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs("not a model", f);
  assert_int_equal(fclose(f), 0);
}

static int32_t load_peers(spn_engine_t *e, const char *path, const char *device, const char *const *peers,
                          int n_peers, bool uploads, spn_model_t **m, spn_error_t *err) {
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.device = device;
  o.peers = peers;
  o.n_peers = n_peers;
  o.peer_uploads = uploads;
  return spn_engine_load_opts(e, path, &o, m, err);
}

/* m's outputs equal ref's, bit for bit (same kernels). */
static void same_outputs(spn_model_t *ref, spn_model_t *m) {
  spn_tensor_t a[2], b[2];
  run2(ref, 3, a);
  run2(m, 3, b);
  outputs_equal(a, b, 3);
}

/* One load on mock:0 naming mock:1 and mock:2 (and itself, and mock:1
 * twice) as peers: the file is read once, the peers' constants are left to
 * replicate(), which fills both in one call; the later loads on the peers
 * take those models without touching the file (spoiled in between), and
 * every copy computes what the CPU does. `fails`: replicate() fails, the
 * peers are loaded again with their own uploads, and still compute right. */
static void check_peers(bool fails) {
  pb_t pm = chain_model();
  char path[64];
  model_file(&pm, path, sizeof path);
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  mk.can_replicate = true;
  mk.replicate_fails = fails;
  spn_model_t *ref = load(e, &pm, "cpu", NULL);
  const char *peers[] = {"mock:1", "mock:0", "mock:2", "mock:1"};
  spn_model_t *m0 = NULL, *m1 = NULL, *m2 = NULL, *again = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(load_peers(e, path, "mock:0", peers, 4, false, &m0, &err), SPN_OK);
  assert_int_equal(mk.replicates, 1);
  assert_int_equal(mk.replicated, fails ? 0 : 2);
  /* "mulk"'s constant k: copied on mock:0, deferred on each peer (and
   * copied by the peers' second loads when replicate failed). */
  assert_int_equal(mk.weights_copied, fails ? 3 : 1);
  assert_int_equal(mk.weights_deferred, 2);
  if (fails)
    assert_non_null(strstr(spn_model_origin(m0), "broadcast failed, peers uploaded their own: mock: the interconnect is down"));
  else
    assert_string_equal(spn_model_origin(m0), "read from the file; weights broadcast to 2 peers");
  spoil(path);
  assert_int_equal(load_peers(e, path, "mock:1", NULL, 0, false, &m1, &err), SPN_OK);
  assert_int_equal(load_peers(e, path, "mock:2", peers, 4, false, &m2, &err), SPN_OK);
  assert_ptr_not_equal(m1, m2);
  assert_string_equal(spn_model_device(m1), "mock:1");
  assert_string_equal(spn_model_device(m2), "mock:2");
  assert_string_equal(spn_model_origin(m2), fails ? "parsed from the file read for mock:0 (the broadcast failed)"
                                                  : "weights broadcast from mock:0");
  assert_int_equal(mk.replicates, 1);
  /* A second load on a peer shares the model as any load does. */
  assert_int_equal(load_peers(e, path, "mock:1", NULL, 0, false, &again, &err), SPN_OK);
  assert_ptr_equal(again, m1);
  spn_model_release(&again);
  assert_int_equal(spn_engine_trim(e), 0);
  same_outputs(ref, m0);
  same_outputs(ref, m1);
  same_outputs(ref, m2);
  assert_int_equal(mk.bad, 0);
  /* The file is spoiled: a device that was no peer reads it and fails. */
  assert_int_not_equal(load_peers(e, path, "mock:3", NULL, 0, false, &again, &err), SPN_OK);
  assert_null(again);
  spn_model_release(&m0);
  spn_model_release(&m1);
  spn_model_release(&m2);
  spn_model_release(&ref);
  spn_engine_free(&e);
  unlink(path);
  free(pm.p);
}

static void test_peers_replicated(void **state) {
  (void)state;
  check_peers(false);
}

static void test_peers_replicate_fails(void **state) {
  (void)state;
  check_peers(true);
}

/* peer_uploads, a backend that cannot replicate, and emulated CPU devices:
 * the peers are parsed from the one read and prepare their own weights. */
static void test_peers_upload_their_own(void **state) {
  (void)state;
  pb_t pm = chain_model();
  char path[64];
  model_file(&pm, path, sizeof path);
  for (int mode = 0; mode < 3; mode++) {
    mock_t mk;
    spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
    mk.can_replicate = mode != 1;
    const char *dev = mode == 2 ? "cpu:0" : "mock:0";
    const char *peers[] = {mode == 2 ? "cpu:1" : "mock:1"};
    spn_model_t *ref = load(e, &pm, "cpu", NULL), *m0 = NULL, *m1 = NULL;
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(load_peers(e, path, dev, peers, 1, mode == 0, &m0, &err), SPN_OK);
    assert_string_equal(spn_model_origin(m0), "read from the file; also parsed for 1 peer");
    assert_int_equal(mk.replicates, 0);
    assert_int_equal(mk.weights_deferred, 0);
    assert_int_equal(mk.weights_copied, mode == 2 ? 0 : 2);
    assert_int_equal(load_peers(e, path, peers[0], NULL, 0, false, &m1, &err), SPN_OK);
    char want[64];
    snprintf(want, sizeof want, "parsed from the file read for %s", dev);
    assert_string_equal(spn_model_origin(m1), want);
    same_outputs(ref, m1);
    spn_model_release(&m0);
    spn_model_release(&m1);
    spn_model_release(&ref);
    spn_engine_free(&e);
  }
  unlink(path);
  free(pm.p);
}

/* Models loaded for peers that no load took: spn_engine_trim frees them
 * (a later load on that device reads the file: spoiled here, it fails),
 * and so does spn_engine_free (the sanitizer build sees any leak). A peer
 * that cannot be opened is skipped without failing the load. */
static void test_peers_trim(void **state) {
  (void)state;
  pb_t pm = chain_model();
  char path[64];
  model_file(&pm, path, sizeof path);
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  mk.can_replicate = true;
  const char *peers[] = {"mock:1", "warp:9", "mock:2"};
  spn_model_t *m0 = NULL, *m1 = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(load_peers(e, path, "mock:0", peers, 3, false, &m0, &err), SPN_OK);
  assert_int_equal(mk.replicated, 2);
  spoil(path);
  assert_int_equal(load_peers(e, path, "mock:1", NULL, 0, false, &m1, &err), SPN_OK);
  assert_int_equal(spn_engine_trim(e), 1); /* mock:2's */
  assert_int_equal(spn_engine_trim(e), 0);
  spn_model_t *m2 = NULL;
  assert_int_not_equal(load_peers(e, path, "mock:2", NULL, 0, false, &m2, &err), SPN_OK);
  spn_model_release(&m1);
  /* Peers left unclaimed at spn_engine_free. */
  pb_t pm2 = chain_model();
  char path2[64];
  model_file(&pm2, path2, sizeof path2);
  const char *more[] = {"mock:3", "mock:4"};
  spn_model_t *m3 = NULL;
  assert_int_equal(load_peers(e, path2, "mock:2", more, 2, false, &m3, &err), SPN_OK);
  spn_engine_free(&e);
  /* The models still held outlive the engine. */
  same_outputs(m0, m3);
  spn_model_release(&m0);
  spn_model_release(&m3);
  unlink(path);
  unlink(path2);
  free(pm.p);
  free(pm2.p);
}

/* ---- concurrent loads ---- */

typedef struct {
  spn_engine_t *e;
  const char *path, *device;
  const char *const *peers;
  int n_peers;
  spn_model_t *m;
  int32_t rc;
  spn_error_t err;
} loader_t;

static void *loader(void *arg) {
  loader_t *l = arg;
  l->err = (spn_error_t)SPN_ERROR_INIT;
  l->rc = load_peers(l->e, l->path, l->device, l->peers, l->n_peers, false, &l->m, &l->err);
  return NULL;
}

/* Two threads each start one load at once; wait for both. */
static void load_both(loader_t *a, loader_t *b) {
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, loader, a), 0);
  assert_int_equal(pthread_create(&tb, NULL, loader, b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  if (a->rc || b->rc)
    fail_msg("load: %s / %s", a->err.msg, b->err.msg);
}

/* Different models load at the same time: each prepare waits until the
 * other load is inside prepare too (an engine that loaded one model after
 * another would never get there, and the test would see no overlap). */
static void test_loads_run_concurrently(void **state) {
  (void)state;
  pb_t pm = chain_model();
  char p1[64], p2[64];
  model_file(&pm, p1, sizeof p1);
  model_file(&pm, p2, sizeof p2);
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
  mk.hold = true;
  loader_t a = {.e = e, .path = p1, .device = "mock:0"}, b = {.e = e, .path = p2, .device = "mock:0"};
  load_both(&a, &b);
  assert_true(mk.overlapped);
  assert_ptr_not_equal(a.m, b.m);
  assert_int_equal(mk.prepared, 6);
  same_outputs(a.m, b.m);
  spn_model_release(&a.m);
  spn_model_release(&b.m);
  spn_engine_free(&e);
  unlink(p1);
  unlink(p2);
  free(pm.p);
}

/* Loads of one model at once: one load, one shared model. A load naming
 * peers racing the peer's own load: whichever comes first, each device ends
 * with one model, nothing is left unclaimed, and every copy computes right. */
static void test_same_model_loads_share(void **state) {
  (void)state;
  pb_t pm = chain_model();
  char path[64];
  model_file(&pm, path, sizeof path);
  for (int round = 0; round < 20; round++) {
    mock_t mk;
    spn_engine_t *e = mock_engine(&mk, OPBIT(RELU) | OPBIT(MUL));
    mk.can_replicate = round % 2;
    spn_model_t *ref = load(e, &pm, "cpu", NULL);
    loader_t a = {.e = e, .path = path, .device = "mock:0"}, b = a;
    load_both(&a, &b);
    assert_ptr_equal(a.m, b.m);
    assert_int_equal(mk.prepared, 3);
    const char *peers[] = {"mock:1", "mock:2"};
    loader_t c = {.e = e, .path = path, .device = "mock:1", .peers = peers, .n_peers = 2};
    loader_t d = {.e = e, .path = path, .device = "mock:2", .peers = peers, .n_peers = 2};
    load_both(&c, &d);
    assert_ptr_not_equal(c.m, d.m);
    assert_string_equal(spn_model_device(c.m), "mock:1");
    assert_string_equal(spn_model_device(d.m), "mock:2");
    assert_int_equal(mk.prepared, 9); /* mock:1 and mock:2 once each */
    assert_int_equal(spn_engine_trim(e), 0);
    same_outputs(ref, c.m);
    same_outputs(ref, d.m);
    spn_model_release(&a.m);
    spn_model_release(&b.m);
    spn_model_release(&c.m);
    spn_model_release(&d.m);
    spn_model_release(&ref);
    spn_engine_free(&e);
  }
  unlink(path);
  free(pm.p);
}

/* ---- RRDBNet's dense-block ending: conv * 0.2 + x in place ---- */

enum { DC = 4, DF = 8, DH = 5, DW = 6, DO = 3 };
static float dw_[8][DF * 2 * DF * 9], db_[8][DF], dslope[DF];
static const int d_ci[8] = {DC, DF, 2 * DF, DF, DF, DF, DF, DF}, d_co[8] = {DF, DF, DF, DF, DO, DF, DF, DF};

/* h = Conv0(x); a = LeakyRelu(Conv1(h)); o1 = Conv2(Concat(h, a)) * 0.2 + h
 * (h's last use: written over it, a sum post-op); o2 = o1 + 0.2 * Conv3(o1)
 * (the addend is the convolution's own input: not in place); y = Conv4(o2);
 * g = Conv5(o2); o3 = PRelu(Conv6(o2)) + g (in place, but the PRelu runs
 * in C after the primitive, and the Add after it); z = Conv7(o3). */
static pb_t dense_model(void) {
  pb_t g = {0};
  char wn[8], bn[8];
  for (int k = 0; k < 8; k++) {
    for (int i = 0; i < d_co[k] * d_ci[k] * 9; i++)
      dw_[k][i] = (float)((i * 37 + k * 11) % 17 - 8) / (8.f * (float)d_ci[k]);
    for (int i = 0; i < d_co[k]; i++)
      db_[k][i] = (float)((i * 5 + k) % 7 - 3) / 10.f;
    int64_t wd[] = {d_co[k], d_ci[k], 3, 3}, bd[] = {d_co[k]};
    snprintf(wn, sizeof wn, "w%d", k);
    snprintf(bn, sizeof bn, "b%d", k);
    initializer(&g, wn, 4, wd, dw_[k], (size_t)d_co[k] * d_ci[k] * 9);
    initializer(&g, bn, 1, bd, db_[k], (size_t)d_co[k]);
  }
  for (int i = 0; i < DF; i++)
    dslope[i] = (float)i / 16.f;
  int64_t sd[] = {DF, 1, 1};
  initializer(&g, "slope", 3, sd, dslope, DF);
  float k02 = 0.2f;
  initializer(&g, "k", 0, NULL, &k02, 1); /* a rank-0 scalar, as PyTorch exports it */
  int64_t pads[] = {1, 1, 1, 1};
  attr_t pa = {.name = "pads", .type = 7, .n = 4, .ints = pads};
  static const struct { const char *x, *y; } convs[8] = {{"x", "h"}, {"h", "c1"}, {"cat", "c2"}, {"o1", "c3"},
                                                          {"o2", "y"}, {"o2", "g"}, {"o2", "c6"}, {"o3", "z"}};
  static const char *wnames[8] = {"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"},
                    *bnames[8] = {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"},
                    *cnames[8] = {"conv0", "conv1", "conv2", "conv3", "conv4", "conv5", "conv6", "conv7"};
#define CONV(k)                                                                  \
  do {                                                                           \
    const char *ci[] = {convs[k].x, wnames[k], bnames[k]}, *co[] = {convs[k].y}; \
    node(&g, "Conv", cnames[k], ci, 3, co, 1, &pa, 1);                          \
  } while (0)
  CONV(0);
  CONV(1);
  attr_t al = {.name = "alpha", .type = 1, .f = 0.2f};
  const char *i1[] = {"c1"}, *o1_[] = {"a"};
  node(&g, "LeakyRelu", "lrelu1", i1, 1, o1_, 1, &al, 1);
  attr_t ax = {.name = "axis", .type = 2, .i = 1};
  const char *i2[] = {"h", "a"}, *o2_[] = {"cat"};
  node(&g, "Concat", "cat", i2, 2, o2_, 1, &ax, 1);
  CONV(2);
  const char *i3[] = {"c2", "k"}, *o3_[] = {"s2"}, *i4[] = {"s2", "h"}, *o4_[] = {"o1"};
  node(&g, "Mul", "mul2", i3, 2, o3_, 1, NULL, 0);
  node(&g, "Add", "add2", i4, 2, o4_, 1, NULL, 0);
  CONV(3);
  const char *i5[] = {"k", "c3"}, *o5_[] = {"s3"}, *i6[] = {"o1", "s3"}, *o6_[] = {"o2"};
  node(&g, "Mul", "mul3", i5, 2, o5_, 1, NULL, 0);
  node(&g, "Add", "add3", i6, 2, o6_, 1, NULL, 0);
  CONV(4);
  CONV(5);
  CONV(6);
  const char *i7[] = {"c6", "slope"}, *o7_[] = {"p6"}, *i8[] = {"p6", "g"}, *o8_[] = {"o3"};
  node(&g, "PRelu", "prelu6", i7, 2, o7_, 1, NULL, 0);
  node(&g, "Add", "add6", i8, 2, o8_, 1, NULL, 0);
  CONV(7);
#undef CONV
  pb_str(&g, 2, "dense");
  int64_t d[] = {-1, DC, DH, DW};
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  value_info(&g, 12, "z", -1, NULL);
  return model(&g, 13);
}

/* 3x3 convolution, pads 1, NCHW, by its definition. */
static void dense_conv(int k, const float *x, int n, float *y) {
  int ci = d_ci[k], co = d_co[k];
  for (int b = 0; b < n; b++)
    for (int o = 0; o < co; o++)
      for (int i = 0; i < DH; i++)
        for (int j = 0; j < DW; j++) {
          double s = db_[k][o];
          for (int c = 0; c < ci; c++)
            for (int ki = 0; ki < 3; ki++)
              for (int kj = 0; kj < 3; kj++) {
                int yy = i - 1 + ki, xx = j - 1 + kj;
                if (yy >= 0 && yy < DH && xx >= 0 && xx < DW)
                  s += (double)x[((b * ci + c) * DH + yy) * DW + xx] * dw_[k][((o * ci + c) * 3 + ki) * 3 + kj];
              }
          y[((b * co + o) * DH + i) * DW + j] = (float)s;
        }
}

static void dense_ref(const float *x, int n, float *y, float *z) {
  enum { P = DH * DW };
  static float h[2 * DF * P], a[2 * DF * P], cat[2 * 2 * DF * P], o1[2 * DF * P], c[2 * DF * P], o2[2 * DF * P],
      gg[2 * DF * P];
  dense_conv(0, x, n, h);
  dense_conv(1, h, n, a);
  for (int i = 0; i < n * DF * P; i++)
    a[i] = a[i] > 0 ? a[i] : 0.2f * a[i];
  for (int b = 0; b < n; b++) {
    memcpy(cat + b * 2 * DF * P, h + b * DF * P, DF * P * sizeof(float));
    memcpy(cat + (b * 2 + 1) * DF * P, a + b * DF * P, DF * P * sizeof(float));
  }
  dense_conv(2, cat, n, c);
  for (int i = 0; i < n * DF * P; i++)
    o1[i] = c[i] * 0.2f + h[i];
  dense_conv(3, o1, n, c);
  for (int i = 0; i < n * DF * P; i++)
    o2[i] = o1[i] + 0.2f * c[i];
  dense_conv(4, o2, n, y);
  dense_conv(5, o2, n, gg);
  dense_conv(6, o2, n, c);
  for (int i = 0; i < n * DF * P; i++) {
    float v = c[i], s = dslope[(i / P) % DF];
    o1[i] = (v > 0 ? v : v * s) + gg[i]; /* o3 */
  }
  dense_conv(7, o1, n, z);
}

static const spn_node_t *producer_of(const spn_model_t *m, const char *name) {
  int p = m->vals[value_named(m, name)].producer;
  assert_true(p >= 0);
  return &m->nodes[p];
}

/* On the CPU the Muls by 0.2 and the Adds become post-ops of the
 * convolutions (no Mul or Add node runs), the chain stays channels-last, the
 * output is written over the addend whose last use it is (o1 over h where
 * the CPU's oneDNN fuses that sum; o3 over g, whose bytes are copied first
 * since the PRelu before that Add runs in C), never over the convolution's
 * own input (o2), and every output matches the reference at batch 1 and 2
 * (on AVX2 and AVX-512 alike: an earlier build lost conv2's scale and Add
 * on AVX2). On another device the Muls stay
 * nodes and nothing is written in place. */
static void test_residual_scale_fused_in_place(void **state) {
  (void)state;
  pb_t pm = dense_model();
  mock_t mk;
  spn_engine_t *e = mock_engine(&mk, OPBIT(MUL) | OPBIT(ADD));
  spn_model_t *m = load(e, &pm, "cpu", NULL);
  int live = 0;
  for (int i = 0; i < m->n_node; i++)
    if (!m->nodes[i].dead) {
      live++;
      assert_int_not_equal(m->nodes[i].op, SPN_OP_MUL);
      assert_int_not_equal(m->nodes[i].op, SPN_OP_ADD);
    }
  assert_int_equal(live, 9); /* 8 Conv and the Concat (LeakyRelu and PRelu fused) */
  const spn_node_t *n2 = producer_of(m, "o1"), *n3 = producer_of(m, "o2");
  assert_string_equal(n2->name, "conv2");
  assert_int_equal(n2->n_post, 2);
  assert_int_equal(n2->post[0].kind, SPN_POST_SCALE);
  assert_true(n2->post[0].a == 0.2f);
  assert_int_equal(n2->post[1].kind, SPN_POST_ADD);
  assert_int_equal(n2->post[1].val, value_named(m, "h"));
  assert_string_equal(n3->name, "conv3");
  assert_int_equal(n3->n_post, 2);
  assert_int_equal(n3->post[0].kind, SPN_POST_SCALE);
  assert_int_equal(n3->post[1].kind, SPN_POST_ADD);
  assert_true(m->vals[value_named(m, "h")].nhwc && m->vals[value_named(m, "o1")].nhwc &&
              m->vals[value_named(m, "o2")].nhwc);
  assert_true(m->vals[value_named(m, "g")].nhwc && m->vals[value_named(m, "o3")].nhwc);
  assert_int_equal(producer_of(m, "o3")->post[0].kind, SPN_POST_PRELU);
  /* o1 = conv * 0.2 + h goes over h only where oneDNN runs a sum after the
   * scale in a real kernel (AVX-512; on AVX2 oneDNN 2.6 has only its
   * reference kernel for that chain, and the Add reads its own buffer) */
  assert_int_equal(m->vals[value_named(m, "o1")].alias, spn_cpu_dnnl_late_sum(m) ? value_named(m, "h") : -1);
  assert_int_equal(m->vals[value_named(m, "o2")].alias, -1);
  assert_int_equal(m->vals[value_named(m, "o3")].alias, value_named(m, "g"));
  spn_model_t *dev = load(e, &pm, "mock:0", NULL);
  int muls = 0;
  for (int i = 0; i < dev->n_node; i++)
    muls += !dev->nodes[i].dead && dev->nodes[i].op == SPN_OP_MUL;
  assert_int_equal(muls, 2);
  for (int vi = 0; vi < dev->n_val; vi++)
    if (dev->vals[vi].producer >= 0 && dev->nodes[dev->vals[vi].producer].op == SPN_OP_CONV)
      assert_int_equal(dev->vals[vi].alias, -1);
  static float x[2 * DC * DH * DW], yr[2 * DO * DH * DW], zr[2 * DF * DH * DW];
  for (int i = 0; i < 2 * DC * DH * DW; i++)
    x[i] = (float)((i * 13) % 19) / 9.f - 1.f;
  spn_model_t *ms[2] = {m, dev};
  for (int t = 0; t < 2; t++)
    for (int n = 1; n <= 2; n++) {
      dense_ref(x, n, yr, zr);
      spn_tensor_t in = SPN_TENSOR_INIT, out[2] = {SPN_TENSOR_INIT, SPN_TENSOR_INIT};
      in.dtype = SPN_DTYPE_F32;
      in.ndim = 4;
      const int64_t dims[4] = {n, DC, DH, DW};
      memcpy(in.shape, dims, sizeof dims);
      in.data = x;
      spn_error_t err = SPN_ERROR_INIT;
      if (spn_model_run(ms[t], &in, 1, out, 2, &err))
        fail_msg("run: %s", err.msg);
      const float *y = out[0].data, *z = out[1].data;
      for (int i = 0; i < n * DO * DH * DW; i++)
        if (!(fabsf(y[i] - yr[i]) <= 1e-4f * (1.f + fabsf(yr[i]))))
          fail_msg("%s, batch %d: y[%d] %g, reference %g", t ? "mock" : "cpu", n, i, (double)y[i], (double)yr[i]);
      for (int i = 0; i < n * DF * DH * DW; i++)
        if (!(fabsf(z[i] - zr[i]) <= 1e-4f * (1.f + fabsf(zr[i]))))
          fail_msg("%s, batch %d: z[%d] %g, reference %g", t ? "mock" : "cpu", n, i, (double)z[i], (double)zr[i]);
      spn_model_output_free(&out[0]);
      spn_model_output_free(&out[1]);
    }
  assert_int_equal(mk.bad, 0);
  spn_model_release(&dev);
  spn_model_release(&m);
  spn_engine_free(&e);
  free(pm.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fallback_places_and_copies),
      cmocka_unit_test(test_all_on_device),
      cmocka_unit_test(test_owned_consts_freed),
      cmocka_unit_test(test_intermediate_types_known_at_placement),
      cmocka_unit_test(test_fallback_error_refuses),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_one_backend_per_device),
      cmocka_unit_test(test_fp16_conversion),
      cmocka_unit_test(test_layout_conversion),
      cmocka_unit_test(test_arena_plan_random),
      cmocka_unit_test(test_arena_plan_reuse),
      cmocka_unit_test(test_views_cpu),
      cmocka_unit_test(test_views_device),
      cmocka_unit_test(test_residual_scale_fused_in_place),
      cmocka_unit_test(test_plan_cache),
      cmocka_unit_test(test_device_io_in_place),
      cmocka_unit_test(test_device_io_fallback),
      cmocka_unit_test(test_peers_replicated),
      cmocka_unit_test(test_peers_replicate_fails),
      cmocka_unit_test(test_peers_upload_their_own),
      cmocka_unit_test(test_peers_trim),
      cmocka_unit_test(test_loads_run_concurrently),
      cmocka_unit_test(test_same_model_loads_share),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
