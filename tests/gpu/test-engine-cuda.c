/* test-engine-cuda.c — the CUDA engine backend against the CPU backend (its
 * numeric twin) through the public engine API, on hand-built models.
 * Suite gpu: exits 77 without a CUDA device.
 *
 *  - an element-wise chain with a constant operand, at several batch sizes
 *    (arena re-planning, boundary copies in and out);
 *  - a 3x3 convolution with bias and a fused ReLU (cuDNN's fused path), a
 *    residual Add and a nearest Resize; in the fake-GPU build
 *    (SPN_TEST_INTERNALS) also that the GPU model freed its host copies of
 *    the weights and bias and kept the Resize's scales, read on the host;
 *  - out of device memory: a model whose activations need ~256 GB fails that
 *    run with SPN_ENOMEM naming the GPU, and the same model then runs a small
 *    input correctly;
 *  - precision fp16 (convolution, Gemm with bias and ReLU, MatMul of two
 *    activations) against the fp32 CPU within the bound docs/engine.md
 *    derives;
 *  - spn_model_run_on with device input and output on the caller's stream,
 *    repeated so that runs are captured and replayed as CUDA Graphs, across a
 *    shape change and back, equal to the CPU and to a model loaded with
 *    no_graphs;
 *  - peers (spn_model_opts_t.peers): a model loaded on cuda:0 naming the
 *    other GPUs gets its weights to them by NCCL broadcast (where built; the
 *    fake NCCL made to fail: by their own uploads), their loads take those
 *    copies without reading the file again, and each computes what the CPU
 *    does, at fp32 and fp16. Needs two GPUs (the unit suite runs it on
 *    three fake ones); with one, only that a peer list naming it is harmless.
 *
 * SPN_TEST_FILTER: run only the cases matching this cmocka pattern. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "../engine/onnx-build.h"
#include "gpu-skip.h"
#include "spindle/engine.h"
#ifdef SPN_TEST_INTERNALS
#include "../../core/engine/engine-internal.h"

/* Whether constant `name` of m still has host data (the fake-GPU build
 * links the engine's objects and can look; the GPU build cannot). */
static void check_host_data(const spn_model_t *m, const char *name, bool held) {
  int vi = spn_model_find_value(m, name);
  assert_true(vi >= 0);
  if ((m->vals[vi].data != NULL) != held)
    fail_msg("constant '%s' on %s: host data %s", name, spn_model_device(m), held ? "freed" : "still held");
}
#endif

static spn_engine_t *eng;

static spn_model_t *load_opts(pb_t *pm, const char *device, const char *precision, int no_graphs) {
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.device = device;
  o.precision = precision;
  o.no_graphs = no_graphs;
  o.fallback = "error"; /* every node must run on the GPU */
  spn_model_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_engine_load_memory_opts(eng, pm->p, pm->n, "t.onnx", &o, &m, &err))
    fail_msg("load on %s: %s", device, err.msg);
  return m;
}

static spn_model_t *load(pb_t *pm, const char *device) { return load_opts(pm, device, NULL, 0); }

static void fill(float *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / 8388608.f - 1.f;
  }
}

/* Run both models on one input and compare every output within tol. */
static void compare(spn_model_t *cpu, spn_model_t *gpu, spn_tensor_t *in, int n_out, float tol) {
  spn_tensor_t a[4], b[4];
  spn_error_t err = SPN_ERROR_INIT;
  for (int i = 0; i < n_out; i++)
    a[i] = b[i] = (spn_tensor_t)SPN_TENSOR_INIT;
  if (spn_model_run(cpu, in, 1, a, n_out, &err))
    fail_msg("cpu run: %s", err.msg);
  if (spn_model_run(gpu, in, 1, b, n_out, &err))
    fail_msg("cuda run: %s", err.msg);
  for (int o = 0; o < n_out; o++) {
    assert_int_equal(a[o].ndim, b[o].ndim);
    size_t cnt = 1;
    for (int d = 0; d < a[o].ndim; d++) {
      assert_int_equal(a[o].shape[d], b[o].shape[d]);
      cnt *= (size_t)a[o].shape[d];
    }
    const float *x = a[o].data, *y = b[o].data;
    for (size_t i = 0; i < cnt; i++)
      if (!(fabsf(x[i] - y[i]) <= tol * fmaxf(1.f, fabsf(x[i]))))
        fail_msg("output %d element %zu: cpu %g, cuda %g", o, i, (double)x[i], (double)y[i]);
    spn_model_output_free(&a[o]);
    spn_model_output_free(&b[o]);
  }
}

static void test_elementwise_chain(void **state) {
  (void)state;
  pb_t g = {0};
  const char *i0[] = {"x"}, *o0[] = {"a"}, *i1[] = {"a"}, *o1[] = {"b"}, *i2[] = {"b", "x"}, *o2[] = {"c"},
             *i3[] = {"c", "k"}, *o3[] = {"y"};
  node(&g, "Sigmoid", "sig0", i0, 1, o0, 1, NULL, 0);
  node(&g, "Relu", "relu0", i1, 1, o1, 1, NULL, 0);
  node(&g, "Sub", "sub0", i2, 2, o2, 1, NULL, 0);
  node(&g, "Mul", "mulk", i3, 2, o3, 1, NULL, 0);
  pb_str(&g, 2, "g");
  int64_t kd[] = {4};
  const float k[] = {0.5f, -1.5f, 2.f, 3.f};
  initializer(&g, "k", 1, kd, k, 4);
  int64_t d[] = {-1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  value_info(&g, 12, "b", -1, NULL);
  pb_t pm = model(&g, 17);
  spn_model_t *cpu = load(&pm, "cpu"), *gpu = load(&pm, "cuda:0");
  assert_int_equal(spn_model_fallback_count(gpu), 0);
  int64_t batches[] = {1, 7, 300, 3};
  for (int t = 0; t < 4; t++) {
    float *x = malloc((size_t)batches[t] * 4 * sizeof(float));
    fill(x, (size_t)batches[t] * 4, (uint32_t)t + 1);
    spn_tensor_t in = SPN_TENSOR_INIT;
    in.dtype = SPN_DTYPE_F32;
    in.ndim = 2;
    in.shape[0] = batches[t];
    in.shape[1] = 4;
    in.data = x;
    compare(cpu, gpu, &in, 2, 1e-6f);
    free(x);
  }
  spn_model_release(&cpu);
  spn_model_release(&gpu);
  free(pm.p);
}

/* x (N,8,12,10) -> Conv 3x3 (8->8, bias) -> Relu -> Add x -> Resize x2
 * nearest (scales from a constant). */
static void test_conv_relu_add_resize(void **state) {
  (void)state;
  pb_t g = {0};
  const char *ci[] = {"x", "w", "bias"}, *co[] = {"c"}, *ri[] = {"c"}, *ro[] = {"r"}, *ai[] = {"r", "x"},
             *ao[] = {"s"}, *zi[] = {"s", "", "sc"}, *zo[] = {"y"};
  const int64_t ks[] = {3, 3}, pads[] = {1, 1, 1, 1};
  attr_t ca[] = {{.name = "kernel_shape", .type = 7, .n = 2, .ints = ks}, {.name = "pads", .type = 7, .n = 4, .ints = pads}};
  node(&g, "Conv", "conv0", ci, 3, co, 1, ca, 2);
  node(&g, "Relu", "relu0", ri, 1, ro, 1, NULL, 0);
  node(&g, "Add", "add0", ai, 2, ao, 1, NULL, 0);
  attr_t za[] = {{.name = "mode", .type = 3, .s = "nearest"}};
  node(&g, "Resize", "rs0", zi, 3, zo, 1, za, 1);
  pb_str(&g, 2, "g");
  static float w[8 * 8 * 9], bias[8];
  fill(w, 8 * 8 * 9, 7);
  for (int i = 0; i < 8 * 8 * 9; i++)
    w[i] *= 0.2f;
  fill(bias, 8, 9);
  int64_t wd[] = {8, 8, 3, 3}, bd[] = {8}, sd[] = {4};
  const float sc[] = {1.f, 1.f, 2.f, 2.f};
  initializer(&g, "w", 4, wd, w, 8 * 8 * 9);
  initializer(&g, "bias", 1, bd, bias, 8);
  initializer(&g, "sc", 1, sd, sc, 4);
  int64_t d[] = {-1, 8, 12, 10};
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  pb_t pm = model(&g, 17);
  spn_model_t *cpu = load(&pm, "cpu"), *gpu = load(&pm, "cuda:0");
#ifdef SPN_TEST_INTERNALS
  /* The weights the GPU holds are no longer held on the host too; the
   * Resize's scales, which the backend reads on the host, are; the CPU
   * model keeps its own. */
  check_host_data(gpu, "w", false);
  check_host_data(gpu, "bias", false);
  check_host_data(gpu, "sc", true);
  check_host_data(cpu, "w", true);
#endif
  for (int64_t batch = 1; batch <= 5; batch += 4) {
    size_t n = (size_t)batch * 8 * 12 * 10;
    float *x = malloc(n * sizeof(float));
    fill(x, n, (uint32_t)batch);
    spn_tensor_t in = SPN_TENSOR_INIT;
    in.dtype = SPN_DTYPE_F32;
    in.ndim = 4;
    in.shape[0] = batch;
    in.shape[1] = 8;
    in.shape[2] = 12;
    in.shape[3] = 10;
    in.data = x;
    compare(cpu, gpu, &in, 1, 1e-4f);
    /* Profiled (spn_model_profile): the GPU's nodes, each waited for, and
     * the run's outputs bit for bit; runs as graphs before and after. */
    spn_tensor_t a = SPN_TENSOR_INIT, b = SPN_TENSOR_INIT;
    spn_node_time_t t[8];
    int32_t nt = 0;
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_model_run(gpu, &in, 1, &a, 1, &err), SPN_OK);
    if (spn_model_profile(gpu, &in, 1, &b, 1, t, 8, &nt, &err))
      fail_msg("profile: %s", err.msg);
    assert_int_equal(nt, 2); /* the Conv with its Relu and Add, the Resize */
    assert_string_equal(t[0].op, "Conv");
    assert_int_equal(t[0].fused, 2);
    assert_string_equal(t[1].op, "Resize");
    for (int i = 0; i < 2; i++) {
      assert_string_equal(t[i].device, "cuda:0");
      assert_true(t[i].ms >= 0);
    }
    assert_memory_equal(a.data, b.data, n * 4 * sizeof(float));
    spn_model_output_free(&a);
    spn_model_output_free(&b);
    compare(cpu, gpu, &in, 1, 1e-4f);
    free(x);
  }
  spn_model_release(&cpu);
  spn_model_release(&gpu);
  free(pm.p);
}

static void test_out_of_device_memory(void **state) {
  (void)state;
  /* x (1,1,H,W) -> Resize x64 -> Resize x64: 4096^2 more elements. */
  pb_t g = {0};
  const char *i0[] = {"x", "", "sc"}, *o0[] = {"a"}, *i1[] = {"a", "", "sc"}, *o1[] = {"y"};
  attr_t za[] = {{.name = "mode", .type = 3, .s = "nearest"}};
  node(&g, "Resize", "up0", i0, 3, o0, 1, za, 1);
  node(&g, "Resize", "up1", i1, 3, o1, 1, za, 1);
  pb_str(&g, 2, "g");
  int64_t sd[] = {4};
  const float sc[] = {1.f, 1.f, 64.f, 64.f};
  initializer(&g, "sc", 1, sd, sc, 4);
  int64_t d[] = {1, 1, -1, -1};
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  pb_t pm = model(&g, 17);
  spn_model_t *gpu = load(&pm, "cuda:0");
  /* 64x64 input: the second output needs 64*64*4096*4096*4 bytes = 256 GiB. */
  float *x = calloc(64 * 64, sizeof(float));
  spn_tensor_t in = SPN_TENSOR_INIT, out = SPN_TENSOR_INIT;
  in.dtype = SPN_DTYPE_F32;
  in.ndim = 4;
  in.shape[0] = in.shape[1] = 1;
  in.shape[2] = in.shape[3] = 64;
  in.data = x;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_model_run(gpu, &in, 1, &out, 1, &err);
  if (rc != SPN_ENOMEM || !strstr(err.msg, "cuda:0"))
    fail_msg("expected SPN_ENOMEM naming cuda:0, got %d: %s", rc, err.msg);
  assert_null(out.data);
  /* The model and the GPU are still fine: a 1x1 input gives 4096x4096. */
  in.shape[2] = in.shape[3] = 1;
  x[0] = 2.5f;
  rc = spn_model_run(gpu, &in, 1, &out, 1, &err);
  if (rc)
    fail_msg("small run after OOM: %s", err.msg);
  assert_int_equal(out.shape[2], 4096);
  assert_true(((float *)out.data)[4096 * 4096 - 1] == 2.5f);
  spn_model_output_free(&out);
  free(x);
  spn_model_release(&gpu);
  free(pm.p);
}


/* The conv test's model: x (N,8,12,10) -> Conv 3x3 (bias) -> Relu -> Add x
 * -> Resize x2 nearest. */
static pb_t conv_model(void) {
  pb_t g = {0};
  const char *ci[] = {"x", "w", "bias"}, *co[] = {"c"}, *ri[] = {"c"}, *ro[] = {"r"}, *ai[] = {"r", "x"},
             *ao[] = {"s"}, *zi[] = {"s", "", "sc"}, *zo[] = {"y"};
  const int64_t ks[] = {3, 3}, pads[] = {1, 1, 1, 1};
  attr_t ca[] = {{.name = "kernel_shape", .type = 7, .n = 2, .ints = ks}, {.name = "pads", .type = 7, .n = 4, .ints = pads}};
  node(&g, "Conv", "conv0", ci, 3, co, 1, ca, 2);
  node(&g, "Relu", "relu0", ri, 1, ro, 1, NULL, 0);
  node(&g, "Add", "add0", ai, 2, ao, 1, NULL, 0);
  attr_t za[] = {{.name = "mode", .type = 3, .s = "nearest"}};
  node(&g, "Resize", "rs0", zi, 3, zo, 1, za, 1);
  pb_str(&g, 2, "g");
  static float w[8 * 8 * 9], bias[8];
  fill(w, 8 * 8 * 9, 7);
  for (int i = 0; i < 8 * 8 * 9; i++)
    w[i] *= 0.2f;
  fill(bias, 8, 9);
  int64_t wd[] = {8, 8, 3, 3}, bd[] = {8}, sd[] = {4};
  const float sc[] = {1.f, 1.f, 2.f, 2.f};
  initializer(&g, "w", 4, wd, w, 8 * 8 * 9);
  initializer(&g, "bias", 1, bd, bias, 8);
  initializer(&g, "sc", 1, sd, sc, 4);
  int64_t d[] = {-1, 8, 12, 10};
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  return model(&g, 17);
}

static spn_tensor_t image(float *x, int64_t batch) {
  spn_tensor_t in = SPN_TENSOR_INIT;
  in.dtype = SPN_DTYPE_F32;
  in.ndim = 4;
  in.shape[0] = batch;
  in.shape[1] = 8;
  in.shape[2] = 12;
  in.shape[3] = 10;
  in.data = x;
  return in;
}

/* fp16: every product's operands are rounded to fp16 (relative error
 * <= 2^-11 each) and summed in fp32. The 72-term dot products here have
 * sum |w x| <= 72 * 0.2 = 14.4, so the error is <= 14.4 * 2 * 2^-11 = 0.014
 * in the worst case (signs aligned) and about 0.002 for random signs, plus
 * one fp16 rounding of the result (2^-11 of |y|); the test allows 0.02 of
 * max(1, |y|). A wrong layout or a missed cast is off
 * by O(1). */
static void test_fp16_conv(void **state) {
  (void)state;
  pb_t pm = conv_model();
  spn_model_t *cpu = load(&pm, "cpu"), *gpu = load_opts(&pm, "cuda:0", "fp16", 0);
  for (int64_t batch = 1; batch <= 9; batch += 4) {
    size_t n = (size_t)batch * 8 * 12 * 10;
    float *x = malloc(n * sizeof(float));
    fill(x, n, (uint32_t)batch + 40);
    spn_tensor_t in = image(x, batch);
    for (int rep = 0; rep < 3; rep++) /* eager, captured, replayed */
      compare(cpu, gpu, &in, 1, 2e-2f);
    free(x);
  }
  spn_model_release(&cpu);
  spn_model_release(&gpu);
  free(pm.p);
}

/* x (N,4,16) -> Flatten (N,64) -> Gemm (64 -> 8, transB, bias) -> Relu -> y1; x -> Transpose(0,2,1) -> xt
 * (N,16,4); MatMul(x, xt) -> y2 (N,4,4): both operands activations. */
static void test_fp16_matmul(void **state) {
  (void)state;
  pb_t g = {0};
  const char *fi[] = {"x"}, *fo[] = {"f"}, *gi[] = {"f", "w", "bias"}, *go[] = {"gm"}, *ri[] = {"gm"},
             *ro[] = {"y1"}, *ti[] = {"x"}, *to[] = {"xt"}, *mi[] = {"x", "xt"}, *mo[] = {"y2"};
  attr_t fa = {.name = "axis", .type = 2, .i = 1}, ga = {.name = "transB", .type = 2, .i = 1};
  const int64_t perm[] = {0, 2, 1};
  attr_t ta = {.name = "perm", .type = 7, .n = 3, .ints = perm};
  node(&g, "Flatten", "flat", fi, 1, fo, 1, &fa, 1);
  node(&g, "Gemm", "gemm0", gi, 3, go, 1, &ga, 1);
  node(&g, "Relu", "relu0", ri, 1, ro, 1, NULL, 0);
  node(&g, "Transpose", "tr0", ti, 1, to, 1, &ta, 1);
  node(&g, "MatMul", "mm0", mi, 2, mo, 1, NULL, 0);
  pb_str(&g, 2, "g");
  static float w[8 * 64], bias[8];
  fill(w, 8 * 64, 3);
  for (int i = 0; i < 8 * 64; i++)
    w[i] *= 0.1f;
  fill(bias, 8, 5);
  int64_t wd[] = {8, 64}, bd[] = {8};
  initializer(&g, "w", 2, wd, w, 8 * 64);
  initializer(&g, "bias", 1, bd, bias, 8);
  int64_t d[] = {-1, 4, 16};
  value_info(&g, 11, "x", 3, d);
  value_info(&g, 12, "y1", -1, NULL);
  value_info(&g, 12, "y2", -1, NULL);
  pb_t pm = model(&g, 17);
  spn_model_t *cpu = load(&pm, "cpu"), *gpu = load_opts(&pm, "cuda:0", "fp16", 0);
  assert_int_equal(spn_model_fallback_count(gpu), 0);
  for (int64_t batch = 1; batch <= 33; batch += 32) {
    size_t n = (size_t)batch * 64;
    float *x = malloc(n * sizeof(float));
    fill(x, n, (uint32_t)batch);
    spn_tensor_t in = SPN_TENSOR_INIT;
    in.dtype = SPN_DTYPE_F32;
    in.ndim = 3;
    in.shape[0] = batch;
    in.shape[1] = 4;
    in.shape[2] = 16;
    in.data = x;
    /* Gemm: sum |w x| <= 64 * 0.1, MatMul: <= 16; bound 2 * 2^-11 of
     * that: 0.006 and 0.016. */
    compare(cpu, gpu, &in, 2, 2e-2f);
    free(x);
  }
  spn_model_release(&cpu);
  spn_model_release(&gpu);
  free(pm.p);
}

/* Device input and output on the caller's stream, five runs per shape
 * (warm-up, capture, replays), a shape change and back: equal to the CPU,
 * and to the same model loaded with no_graphs. */
static void test_device_io_graphs(void **state) {
  (void)state;
  pb_t pm = conv_model();
  spn_model_t *cpu = load(&pm, "cpu"), *gpu = load(&pm, "cuda:0"), *eager = load_opts(&pm, "cuda:0", NULL, 1);
  cudaStream_t st;
  assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  int64_t batches[] = {2, 5, 2};
  for (int t = 0; t < 3; t++) {
    int64_t batch = batches[t];
    size_t n = (size_t)batch * 8 * 12 * 10, no = n * 4;
    float *x = malloc(n * sizeof(float)), *y = malloc(no * sizeof(float)), *ye = malloc(no * sizeof(float));
    fill(x, n, (uint32_t)batch + 100);
    spn_tensor_t hin = image(x, batch), want = SPN_TENSOR_INIT;
    spn_error_t err = SPN_ERROR_INIT;
    if (spn_model_run(cpu, &hin, 1, &want, 1, &err))
      fail_msg("cpu: %s", err.msg);
    void *dx = NULL, *dy = NULL;
    assert_int_equal(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc(&dy, no * sizeof(float)), cudaSuccess);
    /* on st: a synchronous copy from pageable memory may return before its
     * DMA lands, and st (non-blocking) does not wait for the legacy stream */
    assert_int_equal(cudaMemcpyAsync(dx, x, n * sizeof(float), cudaMemcpyHostToDevice, st), cudaSuccess);
    spn_tensor_t din = image(dx, batch);
    din.device_kind = SPN_DEVICE_CUDA;
    spn_tensor_t dout = SPN_TENSOR_INIT;
    assert_int_equal(spn_model_output_shapes(gpu, &din, 1, &dout, 1, &err), SPN_OK);
    assert_int_equal(dout.shape[2], 24);
    dout.data = dy;
    dout.device_kind = SPN_DEVICE_CUDA;
    for (int run = 0; run < 5; run++) {
      assert_int_equal(cudaMemsetAsync(dy, 0xff, no * sizeof(float), st), cudaSuccess); /* NaNs */
      if (spn_model_run_on(gpu, &din, 1, &dout, 1, st, &err))
        fail_msg("run_on: %s", err.msg);
      assert_int_equal(cudaMemcpyAsync(y, dy, no * sizeof(float), cudaMemcpyDeviceToHost, st), cudaSuccess);
      assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
      for (size_t i = 0; i < no; i++) {
        float a = ((float *)want.data)[i];
        if (!(fabsf(a - y[i]) <= 1e-4f * fmaxf(1.f, fabsf(a))))
          fail_msg("batch %lld run %d element %zu: cpu %g, cuda %g", (long long)batch, run, i, (double)a, (double)y[i]);
      }
    }
    if (spn_model_run_on(eager, &din, 1, &dout, 1, st, &err))
      fail_msg("run_on (no graphs): %s", err.msg);
    assert_int_equal(cudaMemcpyAsync(ye, dy, no * sizeof(float), cudaMemcpyDeviceToHost, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    /* Each loaded model times cuDNN's algorithms itself (cudnnFind), so the
     * two may sum in another order: equal to within fp32 rounding of a
     * 72-term dot product, not bit for bit (seen on an H200: 16 ulps). */
    for (size_t i = 0; i < no; i++)
      if (!(fabsf(ye[i] - y[i]) <= 1e-5f * fmaxf(1.f, fabsf(y[i]))))
        fail_msg("graph replay %g vs eager %g at %zu", (double)y[i], (double)ye[i], i);
    cudaFree(dx);
    cudaFree(dy);
    spn_model_output_free(&want);
    free(x);
    free(y);
    free(ye);
  }
  cudaStreamDestroy(st);
  spn_model_release(&eager);
  spn_model_release(&cpu);
  spn_model_release(&gpu);
  free(pm.p);
}

static spn_model_t *load_peers(const char *path, const char *device, const char *precision, const char *const *peers,
                               int n_peers) {
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.device = device;
  o.precision = precision;
  o.fallback = "error";
  o.peers = peers;
  o.n_peers = n_peers;
  spn_model_t *m = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_engine_load_opts(eng, path, &o, &m, &err))
    fail_msg("load on %s: %s", device, err.msg);
  return m;
}

static void test_peers(void **state) {
  (void)state;
  int n_gpu = spn_test_gpu_count();
  if (n_gpu > 8)
    n_gpu = 8;
  pb_t pm = conv_model();
  char path[64];
  spn_model_t *cpu = load(&pm, "cpu");
  char names[8][16];
  const char *peers[8];
  for (int i = 0; i < 8; i++) {
    snprintf(names[i], sizeof names[i], "cuda:%d", i);
    peers[i] = names[i];
  }
  const char *ff = getenv("SPN_EMU_NCCL_FAIL");
  bool fails = ff && *ff && strcmp(ff, "0");
  const char *precs[] = {"fp32", "fp16"};
  for (int p = 0; p < 2; p++) {
    /* cuda:0 names every GPU, itself included (ignored). */
    model_file(&pm, path, sizeof path);
    spn_model_t *ms[8] = {load_peers(path, "cuda:0", precs[p], peers, n_gpu)};
    const char *origin = spn_model_origin(ms[0]);
    char want[128];
    if (n_gpu < 2) {
      assert_string_equal(origin, "read from the file");
    } else if (fails) {
      assert_non_null(strstr(origin, "read from the file; the weights' broadcast failed"));
    } else {
#ifdef SPN_TEST_NCCL
      snprintf(want, sizeof want, "read from the file; weights broadcast to %d peer%s", n_gpu - 1, n_gpu > 2 ? "s" : "");
#else
      snprintf(want, sizeof want, "read from the file; also parsed for %d peer%s", n_gpu - 1, n_gpu > 2 ? "s" : "");
#endif
      assert_string_equal(origin, want);
    }
    if (n_gpu > 1) {
      /* From here a load that reads the file fails. */
      FILE *f = fopen(path, "wb");
      assert_non_null(f);
      fputs("spoiled", f);
      assert_int_equal(fclose(f), 0);
    }
    for (int i = 1; i < n_gpu; i++) {
      ms[i] = load_peers(path, names[i], precs[p], NULL, 0);
#ifdef SPN_TEST_NCCL
      const char *peer_origin = fails ? "parsed from the file read for cuda:0 (the broadcast failed)"
                                      : "weights broadcast from cuda:0";
#else
      const char *peer_origin = "parsed from the file read for cuda:0";
#endif
      assert_string_equal(spn_model_origin(ms[i]), peer_origin);
    }
    for (int i = 0; i < n_gpu; i++) {
      size_t n = (size_t)3 * 8 * 12 * 10;
      float *x = malloc(n * sizeof(float));
      fill(x, n, 77);
      spn_tensor_t in = image(x, 3);
      compare(cpu, ms[i], &in, 1, p ? 2e-2f : 1e-4f);
      free(x);
      spn_model_release(&ms[i]);
    }
    assert_int_equal(spn_engine_trim(eng), 0);
    unlink(path);
  }
  spn_model_release(&cpu);
  free(pm.p);
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  o.threads = 2;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_engine_new(&o, &eng, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_elementwise_chain),
      cmocka_unit_test(test_conv_relu_add_resize),
      cmocka_unit_test(test_out_of_device_memory),
      cmocka_unit_test(test_fp16_conv),
      cmocka_unit_test(test_fp16_matmul),
      cmocka_unit_test(test_device_io_graphs),
      cmocka_unit_test(test_peers),
  };
  const char *filter = getenv("SPN_TEST_FILTER");
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  spn_engine_free(&eng);
  return rc;
}
