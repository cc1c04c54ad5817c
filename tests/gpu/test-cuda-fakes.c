/* test-cuda-fakes.c — the fake CUDA runtime, cuDNN and cuBLASLt of
 * tests/gpu/host-emu (README) on their own, so that engine-cuda-host's
 * verdicts rest on fakes that do what the real libraries document:
 *
 *  - a convolution (groups, stride, padding, dilation) in NCHW fp32 against
 *    a reference written here, and the same problem through NHWC tensor and
 *    KRSC (NHWC) filter descriptors in fp16 against it;
 *  - the fused convolution (alpha1 conv + alpha2 z + bias, ReLU) and the
 *    backward-data convolution against the same reference;
 *  - cuBLASLt: transposes, leading dimensions, strided batches, fp16 inputs
 *    and the bias and ReLU epilogues against a plain product;
 *  - a workspace smaller than the algorithm's, and a host pointer where
 *    device memory belongs, are refused;
 *  - in lazy mode (cuda-fakes-host-lazy), a stream's work waits until
 *    something waits for it, and an event wait runs it as far as the record;
 *  - host code that reads device memory, and a kernel running past its
 *    block's end, stop with SIGSEGV;
 *  - a captured stream records and a graph replays (reading memory at
 *    replay), and cudaMalloc during a thread-local capture invalidates it;
 *  - an engine kernel handed a host pointer does not run and leaves
 *    cudaErrorIllegalAddress; the one kernel with a block barrier (global
 *    average pooling's tree sum) gives the mean.
 * Unit suite; no GPU. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "engine-kernels.cuh"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static void fill(float *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / 8388608.f - 1.f;
  }
}

static void *dev_copy(const void *src, size_t n) {
  void *d = NULL;
  assert_int_equal(cudaMalloc(&d, n), cudaSuccess);
  if (src)
    assert_int_equal(cudaMemcpy(d, src, n, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

static void to_host(void *dst, const void *d, size_t n) {
  assert_int_equal(cudaMemcpy(dst, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* Largest |a - b| over max(1, max |a|). */
static double rel_err(const float *a, const float *b, size_t n) {
  double m = 1, e = 0;
  for (size_t i = 0; i < n; i++) {
    m = fmax(m, fabs(a[i]));
    e = fmax(e, fabs((double)a[i] - b[i]));
  }
  return e / m;
}

/* The convolution problem of these tests: x (N,C,H,W), w (K,C/G,R,S). */
enum { N = 2, C = 4, H = 7, W = 6, K = 6, G = 2, R = 3, S = 2, PH = 1, PW = 1, SH = 2, SW = 1, DH = 2, DW = 1 };
#define OH ((H + 2 * PH - ((R - 1) * DH + 1)) / SH + 1)
#define OW ((W + 2 * PW - ((S - 1) * DW + 1)) / SW + 1)

/* Reference cross-correlation, NCHW / KCRS, in double. */
static void ref_conv(const float *x, const float *w, float *y) {
  int Cg = C / G, Kg = K / G;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double acc = 0;
          for (int c = 0; c < Cg; c++)
            for (int r = 0; r < R; r++)
              for (int s = 0; s < S; s++) {
                int ih = oh * SH - PH + r * DH, iw = ow * SW - PW + s * DW;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                  acc += (double)x[((n * C + (k / Kg) * Cg + c) * H + ih) * W + iw] * w[((k * Cg + c) * R + r) * S + s];
              }
          y[((n * K + k) * OH + oh) * OW + ow] = (float)acc;
        }
}

typedef struct {
  cudnnHandle_t h;
  cudnnTensorDescriptor_t x, y, z, b;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t cv;
  cudnnActivationDescriptor_t act;
  void *ws;
} conv_t;

static void conv_open(conv_t *c, cudnnTensorFormat_t fmt, cudnnDataType_t dt) {
  assert_int_equal(cudnnCreate(&c->h), CUDNN_STATUS_SUCCESS);
  cudnnCreateTensorDescriptor(&c->x);
  cudnnCreateTensorDescriptor(&c->y);
  cudnnCreateTensorDescriptor(&c->z);
  cudnnCreateTensorDescriptor(&c->b);
  cudnnCreateFilterDescriptor(&c->w);
  cudnnCreateConvolutionDescriptor(&c->cv);
  cudnnCreateActivationDescriptor(&c->act);
  assert_int_equal(cudnnSetTensor4dDescriptor(c->x, fmt, dt, N, C, H, W), CUDNN_STATUS_SUCCESS);
  assert_int_equal(cudnnSetTensor4dDescriptor(c->y, fmt, dt, N, K, OH, OW), CUDNN_STATUS_SUCCESS);
  assert_int_equal(cudnnSetTensor4dDescriptor(c->z, fmt, dt, N, K, OH, OW), CUDNN_STATUS_SUCCESS);
  assert_int_equal(cudnnSetTensor4dDescriptor(c->b, CUDNN_TENSOR_NCHW, dt, 1, K, 1, 1), CUDNN_STATUS_SUCCESS);
  assert_int_equal(cudnnSetFilter4dDescriptor(c->w, dt, fmt, K, C / G, R, S), CUDNN_STATUS_SUCCESS);
  assert_int_equal(cudnnSetConvolution2dDescriptor(c->cv, PH, PW, SH, SW, DH, DW, CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT),
                   CUDNN_STATUS_SUCCESS);
  assert_int_equal(cudnnSetConvolutionGroupCount(c->cv, G), CUDNN_STATUS_SUCCESS);
  /* fp32 arithmetic: the default math type lets cuDNN (and the fake) read
   * FLOAT operands as TF32 (default_math_reads_float_as_tf32). */
  assert_int_equal(cudnnSetConvolutionMathType(c->cv, CUDNN_FMA_MATH), CUDNN_STATUS_SUCCESS);
  cudnnSetActivationDescriptor(c->act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0);
  int n, k, oh, ow;
  assert_int_equal(cudnnGetConvolution2dForwardOutputDim(c->cv, c->x, c->w, &n, &k, &oh, &ow), CUDNN_STATUS_SUCCESS);
  assert_true(n == N && k == K && oh == OH && ow == OW);
  c->ws = dev_copy(NULL, 1 << 16);
}

static cudnnConvolutionFwdAlgo_t conv_algo(conv_t *c, size_t *ws) {
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int got = 0;
  assert_int_equal(cudnnFindConvolutionForwardAlgorithm(c->h, c->x, c->w, c->cv, c->y,
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf),
                   CUDNN_STATUS_SUCCESS);
  for (int i = 0; i < got; i++)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) {
      *ws = perf[i].memory;
      return perf[i].algo;
    }
  fail_msg("no algorithm");
  return 0;
}

static void conv_close(conv_t *c) {
  cudnnDestroyTensorDescriptor(c->x);
  cudnnDestroyTensorDescriptor(c->y);
  cudnnDestroyTensorDescriptor(c->z);
  cudnnDestroyTensorDescriptor(c->b);
  cudnnDestroyFilterDescriptor(c->w);
  cudnnDestroyConvolutionDescriptor(c->cv);
  cudnnDestroyActivationDescriptor(c->act);
  cudnnDestroy(c->h);
  cudaFree(c->ws);
}

/* y = conv(x, w) through c (opened, its math type set): the search's
 * algorithm, the operands copied to the device and the result back. */
static void conv_forward_once(conv_t *c, const void *x, size_t xn, const void *w, size_t wn, void *y, size_t yn) {
  const float one = 1.f, zero = 0.f;
  size_t wsn;
  cudnnConvolutionFwdAlgo_t algo = conv_algo(c, &wsn);
  void *dx = dev_copy(x, xn), *dw = dev_copy(w, wn), *dy = dev_copy(NULL, yn);
  assert_int_equal(cudnnConvolutionForward(c->h, &one, c->x, dx, c->w, dw, c->cv, algo, c->ws, wsn, &zero, c->y, dy),
                   CUDNN_STATUS_SUCCESS);
  to_host(y, dy, yn);
  cudaFree(dx), cudaFree(dw), cudaFree(dy);
}

#define NX (N * C * H * W)
#define NW (K * (C / G) * R * S)
#define NY (N * K * OH * OW)

/* NCHW -> NHWC of an (n, c, h, w) tensor, and KCRS -> KRSC. */
static void nchw_to_nhwc(const float *a, _Float16 *b, int n, int c, int h, int w) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < c; j++)
      for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
          b[((i * h + y) * w + x) * c + j] = (_Float16)a[((i * c + j) * h + y) * w + x];
}

static void nhwc_to_nchw(const _Float16 *b, float *a, int n, int c, int h, int w) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < c; j++)
      for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
          a[((i * c + j) * h + y) * w + x] = (float)b[((i * h + y) * w + x) * c + j];
}

static void conv_nchw_f32_and_nhwc_f16_match_the_reference(void **state) {
  (void)state;
  static float x[NX], w[NW], ref[NY], y[NY];
  fill(x, NX, 1);
  fill(w, NW, 2);
  ref_conv(x, w, ref);
  const float one = 1.f, zero = 0.f;

  conv_t c;
  conv_open(&c, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT);
  size_t wsn;
  cudnnConvolutionFwdAlgo_t algo = conv_algo(&c, &wsn);
  void *dx = dev_copy(x, sizeof x), *dw = dev_copy(w, sizeof w), *dy = dev_copy(NULL, sizeof y);
  assert_int_equal(cudnnConvolutionForward(c.h, &one, c.x, dx, c.w, dw, c.cv, algo, c.ws, wsn, &zero, c.y, dy),
                   CUDNN_STATUS_SUCCESS);
  to_host(y, dy, sizeof y);
  assert_true(rel_err(ref, y, NY) < 1e-6);
  /* Less workspace than the algorithm asked for is refused. */
  if (wsn)
    assert_int_not_equal(
        cudnnConvolutionForward(c.h, &one, c.x, dx, c.w, dw, c.cv, algo, c.ws, wsn - 1, &zero, c.y, dy),
        CUDNN_STATUS_SUCCESS);
  /* A host pointer where the input belongs is refused. */
  assert_int_not_equal(cudnnConvolutionForward(c.h, &one, c.x, x, c.w, dw, c.cv, algo, c.ws, wsn, &zero, c.y, dy),
                       CUDNN_STATUS_SUCCESS);
  cudaFree(dx), cudaFree(dw), cudaFree(dy);
  conv_close(&c);

  /* NHWC activations, KRSC filter, fp16. */
  static _Float16 x16[NX], w16[NW], y16[NY];
  nchw_to_nhwc(x, x16, N, C, H, W);
  nchw_to_nhwc(w, w16, K, C / G, R, S); /* KCRS -> KRSC is the same permutation */
  conv_open(&c, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF);
  conv_forward_once(&c, x16, sizeof x16, w16, sizeof w16, y16, sizeof y16);
  nhwc_to_nchw(y16, y, N, K, OH, OW);
  double e = rel_err(ref, y, NY);
  assert_true(e < 1e-2);
  assert_true(e > 0); /* fp16 rounding did happen */
  conv_close(&c);
}

/* x rounded to TF32: 10 explicit mantissa bits, to nearest, ties away. */
static float tf32_of(float x) {
  float m = ldexpf(1.f, ilogbf(x) - 10); /* one unit in TF32's last place at x's exponent */
  return x == 0.f ? 0.f : copysignf(floorf(fabsf(x) / m + 0.5f) * m, x);
}

/* With CUDNN_DEFAULT_MATH a FLOAT convolution is computed on TF32 operands,
 * as the tensor cores of an Ampere or later GPU read them: the fake's result
 * is the reference on rounded x and w, and measurably not the fp32 one. */
static void default_math_reads_float_as_tf32(void **state) {
  (void)state;
  static float x[NX], w[NW], xr[NX], wr[NW], ref[NY], ref32[NY], y[NY];
  fill(x, NX, 3);
  fill(w, NW, 4);
  for (size_t i = 0; i < NX; i++)
    xr[i] = tf32_of(x[i]);
  for (size_t i = 0; i < NW; i++)
    wr[i] = tf32_of(w[i]);
  ref_conv(xr, wr, ref);
  ref_conv(x, w, ref32);
  conv_t c;
  conv_open(&c, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT);
  assert_int_equal(cudnnSetConvolutionMathType(c.cv, CUDNN_DEFAULT_MATH), CUDNN_STATUS_SUCCESS);
  conv_forward_once(&c, x, sizeof x, w, sizeof w, y, sizeof y);
  double e = rel_err(ref, y, NY), e32 = rel_err(ref32, y, NY);
  if (!(e < 1e-6 && e32 > 1e-5 && e32 < 1e-2))
    fail_msg("TF32 convolution: %g from the TF32 reference, %g from the fp32 one", e, e32);
  conv_close(&c);
}

static void fused_conv_adds_z_and_bias_then_relu(void **state) {
  (void)state;
  static float x[NX], w[NW], ref[NY], z[NY], y[NY], bias[K];
  fill(x, NX, 3);
  fill(w, NW, 4);
  fill(z, NY, 5);
  fill(bias, K, 6);
  ref_conv(x, w, ref);
  const float a1 = 0.5f, a2 = 2.f;
  for (int i = 0; i < NY; i++) {
    float v = a1 * ref[i] + a2 * z[i] + bias[(i / (OH * OW)) % K];
    ref[i] = v > 0 ? v : 0;
  }
  conv_t c;
  conv_open(&c, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT);
  size_t wsn;
  cudnnConvolutionFwdAlgo_t algo = conv_algo(&c, &wsn);
  void *dx = dev_copy(x, sizeof x), *dw = dev_copy(w, sizeof w), *dz = dev_copy(z, sizeof z),
       *db = dev_copy(bias, sizeof bias);
  /* y is z (in place), as cuDNN allows. */
  assert_int_equal(cudnnConvolutionBiasActivationForward(c.h, &a1, c.x, dx, c.w, dw, c.cv, algo, c.ws, wsn, &a2, c.z,
                                                         dz, c.b, db, c.act, c.y, dz),
                   CUDNN_STATUS_SUCCESS);
  to_host(y, dz, sizeof y);
  assert_true(rel_err(ref, y, NY) < 1e-6);
  /* z of another shape than y is refused. */
  cudnnSetTensor4dDescriptor(c.z, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, K, 1, 1);
  assert_int_not_equal(cudnnConvolutionBiasActivationForward(c.h, &a1, c.x, dx, c.w, dw, c.cv, algo, c.ws, wsn, &a2,
                                                             c.z, dz, c.b, db, c.act, c.y, dz),
                       CUDNN_STATUS_SUCCESS);
  cudaFree(dx), cudaFree(dw), cudaFree(dz), cudaFree(db);
  conv_close(&c);
}

/* Backward data is the adjoint of the forward convolution: <conv(x), g> =
 * <x, bwd(g)> for every x and g. */
static void backward_data_is_the_adjoint_of_forward(void **state) {
  (void)state;
  static float x[NX], w[NW], y[NY], g[NY], dxh[NX];
  fill(x, NX, 7);
  fill(w, NW, 8);
  fill(g, NY, 9);
  ref_conv(x, w, y);
  for (int fmt = 0; fmt < 2; fmt++) {
    conv_t c;
    conv_open(&c, fmt ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, fmt ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT);
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int got = 0, pick = -1;
    assert_int_equal(cudnnFindConvolutionBackwardDataAlgorithm(c.h, c.w, c.y, c.cv, c.x,
                                                               CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf),
                     CUDNN_STATUS_SUCCESS);
    for (int i = 0; i < got && pick < 0; i++)
      if (perf[i].status == CUDNN_STATUS_SUCCESS)
        pick = i;
    assert_true(pick >= 0);
    const float one = 1.f, zero = 0.f;
    void *dw, *dg, *ddx;
    if (fmt) {
      static _Float16 w16[NW], g16[NY], dx16[NX];
      nchw_to_nhwc(w, w16, K, C / G, R, S);
      nchw_to_nhwc(g, g16, N, K, OH, OW);
      dw = dev_copy(w16, sizeof w16), dg = dev_copy(g16, sizeof g16), ddx = dev_copy(NULL, sizeof dx16);
      assert_int_equal(cudnnConvolutionBackwardData(c.h, &one, c.w, dw, c.y, dg, c.cv, perf[pick].algo, c.ws,
                                                    perf[pick].memory, &zero, c.x, ddx),
                       CUDNN_STATUS_SUCCESS);
      to_host(dx16, ddx, sizeof dx16);
      nhwc_to_nchw(dx16, dxh, N, C, H, W);
    } else {
      dw = dev_copy(w, sizeof w), dg = dev_copy(g, sizeof g), ddx = dev_copy(NULL, sizeof dxh);
      assert_int_equal(cudnnConvolutionBackwardData(c.h, &one, c.w, dw, c.y, dg, c.cv, perf[pick].algo, c.ws,
                                                    perf[pick].memory, &zero, c.x, ddx),
                       CUDNN_STATUS_SUCCESS);
      to_host(dxh, ddx, sizeof dxh);
    }
    double lhs = 0, rhs = 0;
    for (int i = 0; i < NY; i++)
      lhs += (double)y[i] * g[i];
    for (int i = 0; i < NX; i++)
      rhs += (double)x[i] * dxh[i];
    assert_true(fabs(lhs - rhs) <= (fmt ? 2e-2 : 1e-5) * fmax(1, fabs(lhs)));
    cudaFree(dw), cudaFree(dg), cudaFree(ddx);
    conv_close(&c);
  }
}

/* Row-major Y (M x N) = A (M x K) B (K x N) + bias, ReLU, through cuBLASLt's
 * column-major view (Y^T = B^T A^T), batched, fp32 and fp16 inputs. */
static void lt_matmul_matches_a_plain_product(void **state) {
  (void)state;
  enum { B = 3, M = 5, KK = 7, NN = 4 };
  static float a[B * M * KK], bm[B * KK * NN], bias[NN], ref[B * M * NN], y[B * M * NN];
  fill(a, sizeof a / 4, 10);
  fill(bm, sizeof bm / 4, 11);
  fill(bias, NN, 12);
  const float alpha = 1.5f, beta = 0.f;
  for (int q = 0; q < B; q++)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < NN; j++) {
        double acc = 0;
        for (int l = 0; l < KK; l++)
          acc += (double)a[(q * M + i) * KK + l] * bm[(q * KK + l) * NN + j];
        double v = alpha * acc + bias[j];
        ref[(q * M + i) * NN + j] = (float)(v > 0 ? v : 0);
      }
  for (int half = 0; half < 2; half++) {
    cudaDataType_t t = half ? CUDA_R_16F : CUDA_R_32F;
    void *da, *db;
    if (half) {
      static _Float16 a16[sizeof a / 4], b16[sizeof bm / 4];
      for (size_t i = 0; i < sizeof a / 4; i++)
        a16[i] = (_Float16)a[i];
      for (size_t i = 0; i < sizeof bm / 4; i++)
        b16[i] = (_Float16)bm[i];
      da = dev_copy(a16, sizeof a16), db = dev_copy(b16, sizeof b16);
    } else {
      da = dev_copy(a, sizeof a), db = dev_copy(bm, sizeof bm);
    }
    void *dbias = dev_copy(bias, sizeof bias), *dy = dev_copy(NULL, sizeof y), *ws = dev_copy(NULL, 1 << 16);
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    assert_int_equal(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    assert_int_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias),
                     CUBLAS_STATUS_SUCCESS);
    /* A wrongly sized attribute is refused. */
    int16_t small = 0;
    assert_int_not_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &small, sizeof small),
                         CUBLAS_STATUS_SUCCESS);
    /* "A" is B^T: N x K column-major, ld N; "B" is A^T: K x M, ld K. */
    cublasLtMatrixLayoutCreate(&la, t, NN, KK, NN);
    cublasLtMatrixLayoutCreate(&lb, t, KK, M, KK);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, NN, M, NN);
    int32_t bc = B;
    int64_t sa = KK * NN, sb = M * KK, sc = M * NN;
    cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa);
    cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb);
    cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t max_ws = 1 << 16;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws);
    cublasLtMatmulHeuristicResult_t heur;
    int got = 0;
    assert_int_equal(cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 1, &heur, &got),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(got, 1);
    assert_int_equal(cublasLtMatmul(h, d, &alpha, db, la, da, lb, &beta, dy, lc, dy, lc, &heur.algo, ws,
                                    heur.workspaceSize, NULL),
                     CUBLAS_STATUS_SUCCESS);
    to_host(y, dy, sizeof y);
    assert_true(rel_err(ref, y, sizeof y / 4) < (half ? 1e-2 : 1e-6));
    if (heur.workspaceSize)
      assert_int_not_equal(cublasLtMatmul(h, d, &alpha, db, la, da, lb, &beta, dy, lc, dy, lc, &heur.algo, ws,
                                          heur.workspaceSize - 1, NULL),
                           CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
    cublasLtDestroy(h);
    cudaFree(da), cudaFree(db), cudaFree(dbias), cudaFree(dy), cudaFree(ws);
  }
}

/* Gemm's transposes: Y = A^T B^T with A stored K x M and B stored N x K
 * (row-major), i.e. column-major "A" = B (K x N, ld K) with TRANSA and "B" =
 * A (M x K, ld M) with TRANSB. */
static void lt_transposes_read_the_stored_matrices(void **state) {
  (void)state;
  enum { M = 3, KK = 4, NN = 5 };
  float at[KK * M], bt[NN * KK], ref[M * NN], y[M * NN];
  fill(at, KK * M, 13);
  fill(bt, NN * KK, 14);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < NN; j++) {
      double acc = 0;
      for (int l = 0; l < KK; l++)
        acc += (double)at[l * M + i] * bt[j * KK + l];
      ref[i * NN + j] = (float)acc;
    }
  void *da = dev_copy(at, sizeof at), *db = dev_copy(bt, sizeof bt), *dy = dev_copy(NULL, sizeof y);
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t d;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtCreate(&h);
  cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t tr = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr);
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tr, sizeof tr);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, KK, NN, KK);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, M, KK, M);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, NN, M, NN);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t heur;
  int got = 0;
  assert_int_equal(cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 1, &heur, &got), CUBLAS_STATUS_SUCCESS);
  const float one = 1.f, zero = 0.f;
  assert_int_equal(cublasLtMatmul(h, d, &one, db, la, da, lb, &zero, dy, lc, dy, lc, &heur.algo, NULL, 0, NULL),
                   CUBLAS_STATUS_SUCCESS);
  to_host(y, dy, sizeof y);
  assert_true(rel_err(ref, y, M * NN) < 1e-6);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(d);
  cublasLtDestroy(h);
  cudaFree(da), cudaFree(db), cudaFree(dy);
}

static void a_graph_replays_what_its_capture_recorded(void **state) {
  (void)state;
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int *a = dev_copy(NULL, 16), *b = dev_copy(NULL, 16), v = 1, got = 0;
  assert_int_equal(cudaMemcpy(a, &v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(b, a, sizeof v, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  cudaGraph_t g = NULL;
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  to_host(&got, b, sizeof got);
  assert_int_not_equal(got, 1); /* recorded, not run */
  cudaGraphExec_t ex = NULL;
  assert_int_equal(cudaGraphInstantiate(&ex, g, 0), cudaSuccess);
  cudaGraphDestroy(g);
  v = 7;
  assert_int_equal(cudaMemcpy(a, &v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
  assert_int_equal(cudaGraphLaunch(ex, s), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  to_host(&got, b, sizeof got);
  assert_int_equal(got, 7); /* the replay read a's contents at launch */
  cudaGraphExecDestroy(ex);

  /* A forbidden call during the capture fails it. */
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void *p = NULL;
  assert_int_equal(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  assert_null(g);
  assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  /* So do a synchronisation and a query of the capturing stream. */
  for (int query = 0; query < 2; query++) {
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(query ? cudaStreamQuery(s) : cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
  }
  cudaStreamDestroy(s);
  cudaFree(a), cudaFree(b);
}

int spn_emu_stream_captures(cudaStream_t s); /* cuda-fake.cpp's test hook */

/* An event recorded into a capture and waited for by a stream outside it:
 * in CUDA that stream joins the capture, which then cannot end (unjoined).
 * An event recorded before the capture began is an ordinary wait. */
static void a_wait_on_a_captured_event_joins_the_capture(void **state) {
  (void)state;
  cudaStream_t s, other;
  cudaEvent_t before, during;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&during, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(spn_emu_stream_captures(s), 0);
  assert_int_equal(cudaEventRecord(before, s), cudaSuccess);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(other, before, 0), cudaSuccess);
  cudaGraph_t g = NULL;
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
  assert_non_null(g);
  cudaGraphDestroy(g);
  g = NULL;

  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  assert_int_equal(cudaEventRecord(during, s), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(other, during, 0), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined);
  assert_null(g);
  assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureUnjoined);
  assert_int_equal(spn_emu_stream_captures(s), 2);
  assert_int_equal(spn_emu_stream_captures(other), 0);

  /* That capture is over: the event is an old capture's node, and a new
   * capture on s ends normally. */
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(other, during, 0), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphDestroy(g);
  cudaEventDestroy(before), cudaEventDestroy(during);
  cudaStreamDestroy(s), cudaStreamDestroy(other);
}

static void copies_check_which_side_is_device_memory(void **state) {
  (void)state;
  char host[16] = {0};
  void *d = dev_copy(NULL, 16);
  assert_int_equal(cudaMemcpy(d, host, 16, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpy(host, d, 17, cudaMemcpyDeviceToHost), cudaErrorInvalidValue); /* past the block */
  assert_int_equal(cudaMemcpy(host, d, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  (void)cudaGetLastError();
  cudaFree(d);
}

static void kernels_take_device_pointers_and_barriers_hold(void **state) {
  (void)state;
  enum { P = 3, SP = 1000 };
  static float x[P * SP], y[P];
  fill(x, P * SP, 15);
  float *dx = dev_copy(x, sizeof x), *dy = dev_copy(NULL, sizeof y);
  assert_int_equal(spn_cu_global_avg_pool(dx, dy, P, SP, NULL), cudaSuccess);
  to_host(y, dy, sizeof y);
  for (int p = 0; p < P; p++) {
    double m = 0;
    for (int i = 0; i < SP; i++)
      m += x[p * SP + i];
    assert_true(fabs(m / SP - y[p]) < 1e-6);
  }
  assert_int_equal(spn_cu_unary(SPN_CU_RELU, x, dy, P, 0, 0, NULL), cudaErrorIllegalAddress);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  cudaFree(dx), cudaFree(dy);
}

/* host-emu/launch-probe.cpp: one kernel through the fake's launch, each
 * thread adding one to *hits. */
cudaError_t spn_emu_probe_launch(int64_t *hits, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, size_t shmem);

/* A launch a GPU refuses is refused here too: nothing runs, the call and
 * then cudaGetLastError (once) say cudaErrorInvalidConfiguration. A valid
 * one at each limit runs every thread. A pointer argument misaligned for
 * its type fails as the kernel's fault would. */
static void launches_a_gpu_refuses_are_refused(void **state) {
  (void)state;
  int64_t *d = dev_copy(NULL, sizeof(int64_t)), hits = 0;
  static const struct {
    unsigned g[3], b[3];
    size_t shmem;
    bool ok;
  } cases[] = {
      {{2, 1, 1}, {1024, 1, 1}, 0, true},  {{1, 1, 1}, {32, 32, 1}, 48 * 1024, true},
      {{1, 1, 1}, {1, 16, 64}, 0, true},   {{1, 65535, 1}, {1, 1, 1}, 0, true},
      {{1, 1, 65535}, {1, 1, 1}, 0, true}, {{0, 1, 1}, {32, 1, 1}, 0, false},
      {{1, 1, 1}, {0, 1, 1}, 0, false},    {{1, 1, 1}, {1025, 1, 1}, 0, false},
      {{1, 1, 1}, {64, 32, 1}, 0, false},  {{1, 1, 1}, {1, 1, 65}, 0, false},
      {{1, 65536, 1}, {1, 1, 1}, 0, false}, {{1, 1, 65536}, {1, 1, 1}, 0, false},
      {{1, 1, 1}, {32, 1, 1}, 48 * 1024 + 1, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(cudaMemset(d, 0, sizeof hits), cudaSuccess);
    cudaError_t e = spn_emu_probe_launch(d, cases[i].g[0], cases[i].g[1], cases[i].g[2], cases[i].b[0], cases[i].b[1],
                                         cases[i].b[2], cases[i].shmem);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    to_host(&hits, d, sizeof hits);
    int64_t threads = (int64_t)cases[i].g[0] * cases[i].g[1] * cases[i].g[2] * cases[i].b[0] * cases[i].b[1] *
                      cases[i].b[2];
    if (cases[i].ok) {
      assert_int_equal(e, cudaSuccess);
      assert_int_equal(hits, threads);
    } else {
      assert_int_equal(e, cudaErrorInvalidConfiguration);
      assert_int_equal(hits, 0);
    }
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* read once, then clear */
  }
  /* An int64_t * four bytes into a block: a GPU's 8-byte access faults. */
  assert_int_equal(cudaMemset(d, 0, sizeof hits), cudaSuccess);
  assert_int_equal(spn_emu_probe_launch((int64_t *)((char *)d + 4), 1, 1, 1, 1, 1, 1, 0), cudaErrorMisalignedAddress);
  to_host(&hits, d, sizeof hits);
  assert_int_equal(hits, 0);
  cudaFree(d);
}

/* SPN_EMU_CUDA_STATS=path in a child that makes the calls of `calls` (or
 * none) and exits: the counts its line reports. */
/* A query's answer: done, or (lazy mode, work still queued) not yet. */
static bool answered(cudaError_t e) { return e == cudaSuccess || e == cudaErrorNotReady; }

static void stats_of_child(bool calls, long long v[13]) {
  char path[] = "/tmp/spn-emu-stats-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("SPN_EMU_CUDA_STATS", path, 1);
    int bad = 0;
    if (calls) {
      float host[4] = {1, 2, 3, 4}, *pinned = NULL, *d = NULL, *d2 = NULL;
      cudaStream_t s = NULL;
      cudaEvent_t e = NULL;
      bad = cudaMalloc((void **)&d, sizeof host) || cudaMallocAsync((void **)&d2, sizeof host, NULL) ||
            cudaMallocHost((void **)&pinned, sizeof host) || cudaStreamCreate(&s) || cudaEventCreate(&e) ||
            cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice) ||
            cudaMemcpyAsync(d2, host, sizeof host, cudaMemcpyHostToDevice, s) ||   /* pageable */
            cudaMemcpyAsync(pinned, d2, sizeof host, cudaMemcpyDeviceToHost, s) || /* pinned */
            cudaMemcpyAsync(d, d2, sizeof host, cudaMemcpyDeviceToDevice, s) ||    /* device */
            spn_cu_unary(SPN_CU_RELU, d, d2, 4, 0, 0, s) || cudaEventRecord(e, s) || !answered(cudaStreamQuery(s)) ||
            cudaEventSynchronize(e) || cudaStreamSynchronize(s) || cudaDeviceSynchronize() || cudaFree(d) ||
            cudaFreeAsync(d2, s) || cudaFreeHost(pinned) || cudaEventDestroy(e) || cudaStreamDestroy(s);
    }
    exit(bad ? 3 : 0); /* exit, not _exit: the report is written by a static destructor */
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[512] = "";
  bool got = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  unlink(path);
  assert_true(got);
  int n = sscanf(line,
                 "pid=%*d device_alloc=%lld device_free=%lld pinned_alloc=%lld pinned_free=%lld host_sync=%lld "
                 "query=%lld copy_blocking=%lld copy_async=%lld copy_async_pageable=%lld kernel_launch=%lld "
                 "graph_launch=%lld event_record=%lld stream_wait=%lld",
                 &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12]);
  assert_int_equal(n, 13);
}

/* SPN_EMU_CUDA_STATS counts each call that costs host time on a GPU: a
 * child making known calls reports them over a child making none (both
 * start from this process's counts). */
static void stats_count_what_costs_host_time(void **state) {
  (void)state;
  long long base[13], v[13];
  stats_of_child(false, base);
  stats_of_child(true, v);
  /* device alloc/free, pinned alloc/free, syncs (stream, event, device),
   * queries, blocking copies, async copies (one pageable), kernels, graphs,
   * event records, stream waits */
  static const long long want[13] = {2, 2, 1, 1, 3, 1, 1, 3, 1, 1, 0, 1, 0};
  for (int i = 0; i < 13; i++) {
    if (v[i] - base[i] != want[i])
      print_message("count %d: %lld, expected %lld\n", i, v[i] - base[i], want[i]);
    assert_int_equal(v[i] - base[i], want[i]);
  }
}

/* Whether fn(arg) in a child process dies of SIGSEGV. */
static bool segfaults(void (*fn)(float *), float *arg) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL); /* not cmocka's handler, which would go on with the tests */
    fn(arg);
    _exit(0);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV;
}

static void read_on_host(float *d) {
  volatile float v = *d;
  (void)v;
}

/* ReLU over 1024 floats of a 1-float block: past its end into the guard. */
static void overrun(float *d) {
  (void)spn_cu_unary(SPN_CU_RELU, d, d, 1024, 0, 0, NULL);
  (void)cudaDeviceSynchronize();
}

/* SPN_EMU_CUDA_LAZY=1 (cuda-fakes-host-lazy): s1's work has not run until
 * something waits for it (a query does not); s2 waiting for s1's event runs
 * it up to the record, not past it. */
static void lazy_streams_run_when_waited_for(void **state) {
  (void)state;
  const char *lz = getenv("SPN_EMU_CUDA_LAZY");
  if (!lz || strcmp(lz, "1"))
    skip();
  cudaStream_t s1, s2;
  cudaEvent_t ev;
  assert_int_equal(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  int zero = 0, got = -1;
  int *a = dev_copy(&zero, sizeof zero), *b = dev_copy(&zero, sizeof zero);
  assert_int_equal(cudaMemsetAsync(a, 1, sizeof(int), s1), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, s1), cudaSuccess);
  assert_int_equal(cudaMemsetAsync(a, 2, sizeof(int), s1), cudaSuccess); /* after the record */
  to_host(&got, a, sizeof got);
  assert_int_equal(got, 0); /* nothing waited for s1 */
  /* Queries answer "not ready" and run nothing. */
  assert_int_equal(cudaStreamQuery(s1), cudaErrorNotReady);
  assert_int_equal(cudaEventQuery(ev), cudaErrorNotReady);
  to_host(&got, a, sizeof got);
  assert_int_equal(got, 0);
  assert_int_equal(cudaStreamWaitEvent(s2, ev, 0), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(b, a, sizeof(int), cudaMemcpyDeviceToDevice, s2), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s2), cudaSuccess);
  to_host(&got, b, sizeof got);
  assert_int_equal(got, 0x01010101); /* s1 ran as far as the event */
  assert_int_equal(cudaStreamQuery(s1), cudaErrorNotReady); /* the second memset is still queued */
  assert_int_equal(cudaEventQuery(ev), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
  assert_int_equal(cudaStreamQuery(s1), cudaSuccess);
  to_host(&got, a, sizeof got);
  assert_int_equal(got, 0x02020202);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFree(a), cudaFree(b);
}

static void host_reads_and_overruns_of_device_memory_fault(void **state) {
  (void)state;
  float one = 1.f;
  float *d = dev_copy(&one, sizeof one);
  assert_true(segfaults(read_on_host, d));
  assert_true(segfaults(overrun, d));
  assert_int_equal(spn_cu_unary(SPN_CU_RELU, d, d, 1, 0, 0, NULL), cudaSuccess);
  cudaFree(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(conv_nchw_f32_and_nhwc_f16_match_the_reference),
      cmocka_unit_test(default_math_reads_float_as_tf32),
      cmocka_unit_test(fused_conv_adds_z_and_bias_then_relu),
      cmocka_unit_test(backward_data_is_the_adjoint_of_forward),
      cmocka_unit_test(lt_matmul_matches_a_plain_product),
      cmocka_unit_test(lt_transposes_read_the_stored_matrices),
      cmocka_unit_test(a_graph_replays_what_its_capture_recorded),
      cmocka_unit_test(copies_check_which_side_is_device_memory),
      cmocka_unit_test(kernels_take_device_pointers_and_barriers_hold),
      cmocka_unit_test(launches_a_gpu_refuses_are_refused),
      cmocka_unit_test(host_reads_and_overruns_of_device_memory_fault),
      cmocka_unit_test(lazy_streams_run_when_waited_for),
      cmocka_unit_test(stats_count_what_costs_host_time),
      cmocka_unit_test(a_wait_on_a_captured_event_joins_the_capture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
