/* cudnn-fake.cpp — the part of cuDNN 9's legacy convolution API the CUDA
 * engine backend uses, computed naively on the host (tests/gpu/host-emu/
 * README). It defines the real API's symbols (declared by the toolkit's
 * cudnn.h) and is linked instead of libcudnn.
 *
 * Faithful to cuDNN's documented semantics where the backend could get them
 * wrong:
 *  - a tensor is read and written through its descriptor: dims are always
 *    given as (N,C,H,W) and the format or the strides place them in memory
 *    (NCHW: strides (CHW,HW,W,1); NHWC: (HWC,1,WC,C)); data type FLOAT or
 *    HALF (fp16, accumulated in double here);
 *  - a filter descriptor's dims are (K,C,R,S); format NCHW stores it KCRS,
 *    NHWC stores it KRSC;
 *  - the convolution descriptor's pads, strides, dilations, mode (cross-
 *    correlation or convolution, which flips the filter) and group count;
 *    y's dims must be those cudnnGetConvolution2dForwardOutputDim gives
 *    (CUDNN_STATUS_BAD_PARAM otherwise), for backward data dx's likewise;
 *  - y = alpha * op + beta * y, with y not read when beta is 0; the fused
 *    y = act(alpha1 * conv(x) + alpha2 * z + bias), z with y's dims (it may
 *    be y), bias (1,K,1,1), act RELU or IDENTITY (IDENTITY only with
 *    IMPLICIT_PRECOMP_GEMM, as cuDNN documents);
 *  - the algorithm searches return one unsupported entry, then one that
 *    succeeds with a workspace of 4 KiB and the descriptor's math type; an
 *    operation given less workspace than its algorithm needs fails, and the
 *    workspace is overwritten (NaN bytes) before the result is computed, so a
 *    workspace that overlaps a tensor shows;
 *  - every tensor, filter and workspace pointer must lie in device memory
 *    (cuda-fake.cpp's registry): CUDNN_STATUS_BAD_PARAM and a line on stderr
 *    otherwise;
 *  - work goes on the handle's stream (cudnnSetStream), so a captured graph
 *    replays it with the descriptors as they were at the call; the searches
 *    that time algorithms (cudnnFind*) and every operation fail
 *    (CUDNN_STATUS_EXECUTION_FAILED, a line on stderr) when that stream has
 *    been destroyed since.
 *  - FLOAT operands (x and w; dy and w) are rounded to TF32 first unless
 *    the math type is CUDNN_FMA_MATH, as Ampere and later GPUs' tensor
 *    cores read them (the engine's tf32 precision asks for DEFAULT_MATH).
 * Not modelled: which algorithm real cuDNN picks, its rounding, the
 * data-type configurations it refuses (beyond FLOAT/HALF x, w, y alike).
 * Test code only. */
#include <atomic>
#include <math.h>
#include <string.h>

#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "fake-internal.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

struct cudnnContext {
  cudaStream_t stream;
};
struct cudnnTensorStruct {
  bool set;
  cudnnDataType_t dt;
  int dims[4], strides[4]; /* (N,C,H,W) */
};
struct cudnnFilterStruct {
  bool set;
  cudnnDataType_t dt;
  cudnnTensorFormat_t fmt;
  int dims[4]; /* (K,C,R,S) */
};
struct cudnnConvolutionStruct {
  int pad[2], stride[2], dil[2], groups;
  cudnnConvolutionMode_t mode;
  cudnnDataType_t compute;
  cudnnMathType_t math;
};
struct cudnnActivationStruct {
  cudnnActivationMode_t mode;
  double coef;
};

namespace {

/* The convolutions' loops run on the fake's own host buffers (what they read
 * of device memory lies in ranges checked as device memory first, with guard
 * pages behind them): left out of the sanitizers' instrumentation, which
 * keeps them from vectorising and made them most of an ASan run's time. */
#define SPN_FAKE_HOT __attribute__((no_sanitize("address", "undefined")))

const size_t kWorkspace = 4096;

size_t esize(cudnnDataType_t dt) { return dt == CUDNN_DATA_HALF ? 2 : 4; }

bool dt_ok(cudnnDataType_t dt) { return dt == CUDNN_DATA_FLOAT || dt == CUDNN_DATA_HALF; }

/* Every half's value, by its bits: the same conversion as a cast, made
 * once (without F16C the cast is a libgcc call per element, which made the
 * convolutions' inner loop several times slower). */
SPN_FAKE_HOT const float *half_values() {
  static const float *table = [] {
    float *t = new float[65536];
    for (uint32_t b = 0; b < 65536; b++) {
      uint16_t bits = (uint16_t)b;
      _Float16 h;
      memcpy(&h, &bits, sizeof h);
      t[b] = (float)h;
    }
    return t;
  }();
  return table;
}

SPN_FAKE_HOT double load(const void *p, cudnnDataType_t dt, int64_t i) {
  if (dt == CUDNN_DATA_HALF)
    return (double)half_values()[((const uint16_t *)p)[i]];
  return (double)((const float *)p)[i];
}

void store(void *p, cudnnDataType_t dt, int64_t i, double v) {
  if (dt == CUDNN_DATA_HALF)
    ((_Float16 *)p)[i] = (_Float16)(float)v;
  else
    ((float *)p)[i] = (float)v;
}

SPN_FAKE_HOT int64_t t_off(const cudnnTensorStruct &t, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * t.strides[0] + c * t.strides[1] + h * t.strides[2] + w * t.strides[3];
}

/* Bytes from the tensor's start to past its last element. */
size_t t_extent(const cudnnTensorStruct &t) {
  int64_t last = 0;
  for (int d = 0; d < 4; d++)
    last += (int64_t)(t.dims[d] - 1) * t.strides[d];
  return (size_t)(last + 1) * esize(t.dt);
}

SPN_FAKE_HOT int64_t f_off(const cudnnFilterStruct &f, int64_t k, int64_t c, int64_t r, int64_t s) {
  const int *d = f.dims;
  if (f.fmt == CUDNN_TENSOR_NHWC) /* KRSC */
    return ((k * d[2] + r) * d[3] + s) * d[1] + c;
  return ((k * d[1] + c) * d[2] + r) * d[3] + s; /* KCRS */
}

size_t f_bytes(const cudnnFilterStruct &f) {
  return (size_t)f.dims[0] * f.dims[1] * f.dims[2] * f.dims[3] * esize(f.dt);
}

bool on_device(const void *p, size_t n, const char *what) {
  if (spn_emu_is_device(p, n))
    return true;
  spn_emu_complain("cuDNN: %s at %p (%zu bytes) is not device memory", what, p, n);
  return false;
}

cudnnStatus_t set_packed(cudnnTensorStruct *t, cudnnTensorFormat_t fmt, cudnnDataType_t dt, const int *d) {
  if (!t || !dt_ok(dt) || d[0] <= 0 || d[1] <= 0 || d[2] <= 0 || d[3] <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  t->dt = dt;
  memcpy(t->dims, d, sizeof t->dims);
  if (fmt == CUDNN_TENSOR_NCHW) {
    t->strides[3] = 1, t->strides[2] = d[3], t->strides[1] = d[2] * d[3], t->strides[0] = d[1] * d[2] * d[3];
  } else if (fmt == CUDNN_TENSOR_NHWC) {
    t->strides[1] = 1, t->strides[3] = d[1], t->strides[2] = d[3] * d[1], t->strides[0] = d[2] * d[3] * d[1];
  } else {
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  t->set = true;
  return CUDNN_STATUS_SUCCESS;
}

/* The output dims of a forward convolution of x by w. */
void out_dims(const cudnnConvolutionStruct &cv, const cudnnTensorStruct &x, const cudnnFilterStruct &w, int *o) {
  o[0] = x.dims[0];
  o[1] = w.dims[0];
  for (int i = 0; i < 2; i++)
    o[2 + i] = (x.dims[2 + i] + 2 * cv.pad[i] - ((w.dims[2 + i] - 1) * cv.dil[i] + 1)) / cv.stride[i] + 1;
}

/* The forward problem (x, w, y) is consistent: w's C times the groups is x's
 * C, K divides by the groups, y has the output dims; FLOAT/HALF alike. */
bool geometry_ok(const cudnnConvolutionStruct &cv, const cudnnTensorStruct &x, const cudnnFilterStruct &w,
                 const cudnnTensorStruct &y) {
  if (!x.set || !w.set || !y.set || x.dt != w.dt || x.dt != y.dt)
    return false;
  if (cv.groups < 1 || w.dims[1] * cv.groups != x.dims[1] || w.dims[0] % cv.groups)
    return false;
  int o[4];
  out_dims(cv, x, w, o);
  return !memcmp(o, y.dims, sizeof o);
}

/* A float rounded to TF32 (10 explicit mantissa bits, to nearest, ties
 * away from zero, as cvt.rna.tf32.f32 does): what the tensor cores read of
 * FLOAT operands when the math type lets cuDNN use them (CUDNN_DEFAULT_MATH
 * and the TENSOR_OP types on an Ampere or later GPU). Inf and NaN pass. */
SPN_FAKE_HOT float to_tf32(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) {
    u += 0x1000u;
    u &= 0xffffe000u;
  }
  memcpy(&v, &u, sizeof v);
  return v;
}

/* FLOAT operands go through the tensor cores as TF32 (FMA_MATH keeps fp32). */
SPN_FAKE_HOT bool tf32_math(const cudnnConvolutionStruct &cv, cudnnDataType_t dt) {
  return dt == CUDNN_DATA_FLOAT && cv.math != CUDNN_FMA_MATH;
}

/* One operand element as a double, read as the convolution's math reads it
 * (TF32 when tf32). */
SPN_FAKE_HOT double operand(const void *p, cudnnDataType_t dt, int64_t i, bool tf32) {
  double v = load(p, dt, i);
  return tf32 ? (double)to_tf32((float)v) : v;
}

/* For each tap s of a row of S taps: the outputs [lo[s], hi[s]) of a row of
 * OW whose input column (ow * stride - pad + s * dil) lies inside [0, Wx). */
SPN_FAKE_HOT void tap_ranges(const cudnnConvolutionStruct &cv, int S, int Wx, int OW, int *lo, int *hi) {
  const int st = cv.stride[1];
  for (int s = 0; s < S; s++) {
    int off = s * cv.dil[1] - cv.pad[1];
    int a = off >= 0 ? 0 : (-off + st - 1) / st;
    int b = Wx - 1 - off < 0 ? 0 : (Wx - 1 - off) / st + 1;
    lo[s] = a, hi[s] = b < OW ? b : OW;
  }
}

/* A whole forward convolution, a row of outputs at a time: for output
 * (n, k, oh, ow) it adds x * w over the group's c, r, s in the same order
 * as a direct sum per element would (so the same sums), but the R input rows of every channel are
 * read once per (n, oh) into floats, the filter once per call (flipped for
 * CUDNN_CONVOLUTION), and the innermost loop runs over ow with the tap
 * fixed, which the compiler vectorises: the pipelines' whole models run
 * many times faster on the fakes than element by element. emit(n, k, oh,
 * acc) receives the row's sums (acc[ow], ow < y's W). */
template <class Emit>
SPN_FAKE_HOT void conv_forward_rows(const cudnnConvolutionStruct &cv, const cudnnTensorStruct &xd, const void *x,
                       const cudnnFilterStruct &wd, const void *w, const cudnnTensorStruct &yd, Emit emit) {
  const int Ct = xd.dims[1], H = xd.dims[2], Wx = xd.dims[3];
  const int K = wd.dims[0], Cg = wd.dims[1], R = wd.dims[2], S = wd.dims[3], Kg = K / cv.groups;
  const int OH = yd.dims[2], OW = yd.dims[3];
  const bool flip = cv.mode == CUDNN_CONVOLUTION, tf32 = tf32_math(cv, xd.dt);
  std::vector<double> wf((size_t)K * Cg * R * S);
  for (int k = 0; k < K; k++)
    for (int c = 0; c < Cg; c++)
      for (int r = 0; r < R; r++)
        for (int s2 = 0; s2 < S; s2++)
          wf[(((size_t)k * Cg + c) * R + r) * S + s2] =
              operand(w, wd.dt, f_off(wd, k, c, flip ? R - 1 - r : r, flip ? S - 1 - s2 : s2), tf32);
  std::vector<double> wt, acck;
  if (Kg >= OW) {
    wt.resize(wf.size());
    for (int k = 0; k < K; k++)
      for (size_t j = 0; j < (size_t)Cg * R * S; j++)
        wt[((size_t)(k / Kg) * Cg * R * S + j) * Kg + k % Kg] = wf[(size_t)k * Cg * R * S + j];
    acck.resize((size_t)OW * K);
  }
  std::vector<float> rows((size_t)Ct * R * Wx);
  std::vector<char> row_ok(R);
  std::vector<double> acc(OW);
  /* raw pointers: vector's operator[] is not inlined into an uninstrumented function */
  double *wfp = wf.data(), *wtp = wt.data(), *accp = acc.data(), *acckp = acck.data();
  float *rowsp = rows.data();
  char *row_okp = row_ok.data();
  /* For tap s, the outputs whose input column lies inside x: [lo[s], hi[s]). */
  std::vector<int> lov(S), hiv(S);
  int *lo = lov.data(), *hi = hiv.data();
  tap_ranges(cv, S, Wx, OW, lo, hi);
  for (int n = 0; n < yd.dims[0]; n++)
    for (int oh = 0; oh < OH; oh++) {
      for (int r = 0; r < R; r++) {
        int ih = oh * cv.stride[0] - cv.pad[0] + r * cv.dil[0];
        row_okp[r] = ih >= 0 && ih < H;
        if (!row_okp[r])
          continue;
        for (int c = 0; c < Ct; c++) {
          float *dst = &rowsp[((size_t)c * R + r) * Wx];
          for (int iw = 0; iw < Wx; iw++)
            dst[iw] = (float)operand(x, xd.dt, t_off(xd, n, c, ih, iw), tf32);
        }
      }
      if (Kg >= OW) {
        /* Many output channels over a short row (the deep layers): the
         * outputs' channels innermost instead, against the filter
         * transposed to (g, c, r, s, k), each output's terms still in the
         * order c, r, s. */
        memset(acckp, 0, (size_t)OW * K * sizeof *acckp);
        for (int g = 0; g < cv.groups; g++)
          for (int ow = 0; ow < OW; ow++) {
            double *a = &acckp[(size_t)ow * K + (size_t)g * Kg];
            for (int c = 0; c < Cg; c++)
              for (int r = 0; r < R; r++) {
                if (!row_okp[r])
                  continue;
                const float *row = &rowsp[((size_t)(g * Cg + c) * R + r) * Wx];
                for (int s2 = 0; s2 < S; s2++) {
                  if (ow < lo[s2] || ow >= hi[s2])
                    continue;
                  const double pv = row[ow * cv.stride[1] + s2 * cv.dil[1] - cv.pad[1]];
                  const double *wk = &wtp[((((size_t)g * Cg + c) * R + r) * S + s2) * Kg];
                  for (int kk = 0; kk < Kg; kk++)
                    a[kk] += pv * wk[kk];
                }
              }
          }
        for (int k = 0; k < K; k++) {
          for (int ow = 0; ow < OW; ow++)
            accp[ow] = acckp[(size_t)ow * K + k];
          emit(n, k, oh, accp);
        }
        continue;
      }
      for (int k = 0; k < K; k++) {
        int g = k / Kg;
        memset(accp, 0, (size_t)OW * sizeof *accp);
        for (int c = 0; c < Cg; c++)
          for (int r = 0; r < R; r++) {
            if (!row_okp[r])
              continue;
            const float *row = &rowsp[((size_t)(g * Cg + c) * R + r) * Wx];
            const double *wr = &wfp[(((size_t)k * Cg + c) * R + r) * S];
            for (int s2 = 0; s2 < S; s2++) {
              const double wv = wr[s2];
              const int off = s2 * cv.dil[1] - cv.pad[1], st = cv.stride[1];
              double *a = accp;
              if (st == 1) {
                const float *xr = row + off;
                for (int ow = lo[s2]; ow < hi[s2]; ow++)
                  a[ow] += (double)xr[ow] * wv;
              } else {
                for (int ow = lo[s2]; ow < hi[s2]; ow++)
                  a[ow] += (double)row[ow * st + off] * wv;
              }
            }
          }
        emit(n, k, oh, accp);
      }
    }
}

/* Backward data into acc (dx's dims, zeroed, NCHW, double). */
SPN_FAKE_HOT void conv_backward_rows(const cudnnConvolutionStruct &C, const cudnnTensorStruct &DY, const void *dy,
                                     const cudnnFilterStruct &W, const void *w, const cudnnTensorStruct &DX,
                                     double *acc) {
  const int *xd = DX.dims, *fd = W.dims;
  int Cg = fd[1], R = fd[2], S = fd[3], Kg = fd[0] / C.groups;
  /* dx[n, g*Cg + c, ih, iw] += dy[n, k, oh, ow] * w[k, c, r, s] where the
   * forward convolution read x at (ih, iw) for output (oh, ow), tap (r, s).
   * A row of dy at a time, the taps s from last to first and ow innermost
   * (vectorised): each dx element still gets its terms in the order
   * k, oh, ow, as one loop over dy's elements would add them. */
  const int OW = DY.dims[3], st = C.stride[1];
  const bool tf32 = tf32_math(C, DY.dt);
  std::vector<double> dyrowv(OW);
  std::vector<int> lov(S), hiv(S);
  double *dyrow = dyrowv.data(); /* raw pointers, as in conv_forward_rows */
  int *lo = lov.data(), *hi = hiv.data();
  tap_ranges(C, S, xd[3], OW, lo, hi);
  for (int n = 0; n < DY.dims[0]; n++)
    for (int k = 0; k < DY.dims[1]; k++) {
      int g = k / Kg;
      for (int oh = 0; oh < DY.dims[2]; oh++) {
        for (int ow = 0; ow < OW; ow++)
          dyrow[ow] = operand(dy, DY.dt, t_off(DY, n, k, oh, ow), tf32);
        for (int c = 0; c < Cg; c++)
          for (int r = 0; r < R; r++) {
            int ih = oh * C.stride[0] - C.pad[0] + r * C.dil[0];
            if (ih < 0 || ih >= xd[2])
              continue;
            double *dxrow = &acc[(((size_t)n * xd[1] + g * Cg + c) * xd[2] + ih) * xd[3]];
            int fr = C.mode == CUDNN_CONVOLUTION ? R - 1 - r : r;
            for (int s = S - 1; s >= 0; s--) {
              int fs = C.mode == CUDNN_CONVOLUTION ? S - 1 - s : s, off = s * C.dil[1] - C.pad[1];
              double wv = operand(w, W.dt, f_off(W, k, c, fr, fs), tf32);
              for (int ow = lo[s]; ow < hi[s]; ow++)
                dxrow[ow * st + off] += dyrow[ow] * wv;
            }
          }
      }
    }
}

bool workspace_ok(void *ws, size_t n, const char *op) {
  if (n < kWorkspace) {
    spn_emu_complain("cuDNN %s: %zu workspace bytes given, the algorithm needs %zu", op, n, kWorkspace);
    return false;
  }
  return on_device(ws, kWorkspace, "the workspace");
}

float scalar(const void *p) { return *(const float *)p; }

} // namespace

extern "C" {

const char *cudnnGetErrorString(cudnnStatus_t st) {
  switch (st) {
  case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
  case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
  case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
  case CUDNN_STATUS_ALLOC_FAILED: return "CUDNN_STATUS_ALLOC_FAILED";
  case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  default: return "CUDNN_STATUS (fake: other)";
  }
}

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
  *h = new cudnnContext{nullptr};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  delete h;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t h, cudaStream_t *s) {
  *s = h->stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *t) {
  *t = new cudnnTensorStruct{};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t t) {
  delete t;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t t, cudnnTensorFormat_t fmt, cudnnDataType_t dt, int n,
                                         int c, int h, int w) {
  int d[4] = {n, c, h, w};
  return set_packed(t, fmt, dt, d);
}

cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t t, cudnnDataType_t dt, int n, int c, int h, int w,
                                           int ns, int cs, int hs, int ws) {
  if (!t || !dt_ok(dt) || n <= 0 || c <= 0 || h <= 0 || w <= 0 || ns <= 0 || cs <= 0 || hs <= 0 || ws <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  *t = cudnnTensorStruct{true, dt, {n, c, h, w}, {ns, cs, hs, ws}};
  return CUDNN_STATUS_SUCCESS;
}

/* Four dims only: the backend's tensors are 2-D images. */
cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t t, cudnnDataType_t dt, int nd, const int *dims,
                                         const int *strides) {
  if (nd != 4)
    return CUDNN_STATUS_NOT_SUPPORTED;
  return cudnnSetTensor4dDescriptorEx(t, dt, dims[0], dims[1], dims[2], dims[3], strides[0], strides[1], strides[2],
                                      strides[3]);
}

cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t t, cudnnTensorFormat_t fmt, cudnnDataType_t dt,
                                           int nd, const int *dims) {
  if (nd != 4)
    return CUDNN_STATUS_NOT_SUPPORTED;
  return set_packed(t, fmt, dt, dims);
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *f) {
  *f = new cudnnFilterStruct{};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t f) {
  delete f;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t f, cudnnDataType_t dt, cudnnTensorFormat_t fmt, int k,
                                         int c, int h, int w) {
  if (!f || !dt_ok(dt) || k <= 0 || c <= 0 || h <= 0 || w <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  if (fmt != CUDNN_TENSOR_NCHW && fmt != CUDNN_TENSOR_NHWC)
    return CUDNN_STATUS_NOT_SUPPORTED;
  *f = cudnnFilterStruct{true, dt, fmt, {k, c, h, w}};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t f, cudnnDataType_t dt, cudnnTensorFormat_t fmt, int nd,
                                         const int *dims) {
  if (nd != 4)
    return CUDNN_STATUS_NOT_SUPPORTED;
  return cudnnSetFilter4dDescriptor(f, dt, fmt, dims[0], dims[1], dims[2], dims[3]);
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *c) {
  *c = new cudnnConvolutionStruct{{0, 0}, {1, 1}, {1, 1}, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT,
                                  CUDNN_DEFAULT_MATH};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t c) {
  delete c;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t c, int ph, int pw, int u, int v, int dh,
                                              int dw, cudnnConvolutionMode_t mode, cudnnDataType_t compute) {
  if (ph < 0 || pw < 0 || u <= 0 || v <= 0 || dh <= 0 || dw <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  if (compute != CUDNN_DATA_FLOAT && compute != CUDNN_DATA_HALF)
    return CUDNN_STATUS_NOT_SUPPORTED;
  c->pad[0] = ph, c->pad[1] = pw, c->stride[0] = u, c->stride[1] = v, c->dil[0] = dh, c->dil[1] = dw;
  c->mode = mode;
  c->compute = compute;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t c, int g) {
  if (g < 1)
    return CUDNN_STATUS_BAD_PARAM;
  c->groups = g;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t c, cudnnMathType_t mt) {
  c->math = mt;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t c,
                                                    const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                                                    int *n, int *k, int *h, int *wo) {
  int o[4];
  out_dims(*c, *x, *w, o);
  *n = o[0], *k = o[1], *h = o[2], *wo = o[3];
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *a) {
  *a = new cudnnActivationStruct{CUDNN_ACTIVATION_IDENTITY, 0};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t a) {
  delete a;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t a, cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t nan, double coef) {
  (void)nan;
  a->mode = mode;
  a->coef = coef;
  return CUDNN_STATUS_SUCCESS;
}

/* Algorithm searches: an unsupported entry, then the one that works. */
static cudnnStatus_t fwd_algos(const cudnnConvolutionStruct *c, const cudnnTensorStruct *x,
                               const cudnnFilterStruct *w, const cudnnTensorStruct *y, int req, int *got,
                               cudnnConvolutionFwdAlgoPerf_t *perf) {
  if (!geometry_ok(*c, *x, *w, *y))
    return CUDNN_STATUS_BAD_PARAM;
  *got = 0;
  if (req >= 1)
    perf[(*got)++] = cudnnConvolutionFwdAlgoPerf_t{CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_STATUS_NOT_SUPPORTED, -1.f,
                                                   0, CUDNN_NON_DETERMINISTIC, c->math, {0, 0, 0}};
  if (req >= 2)
    perf[(*got)++] = cudnnConvolutionFwdAlgoPerf_t{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                                   CUDNN_STATUS_SUCCESS, 0.1f, kWorkspace, CUDNN_DETERMINISTIC,
                                                   c->math, {0, 0, 0}};
  return CUDNN_STATUS_SUCCESS;
}

/* The searches that time algorithms run them on the handle's stream. */
static bool handle_stream_ok(cudnnHandle_t h, const char *what) {
  if (spn_emu_stream_alive(h->stream))
    return true;
  spn_emu_complain("cuDNN %s on the handle's stream %p, which was destroyed (cudnnSetStream named it)", what,
                   (void *)h->stream);
  return false;
}

/* Test hook: the algorithm timings asked for so far (forward and
 * backward-data searches). */
static std::atomic<long long> finds;
extern "C" long long spn_emu_cudnn_finds(void) { return finds.load(); }

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                   const cudnnFilterDescriptor_t w,
                                                   const cudnnConvolutionDescriptor_t c,
                                                   const cudnnTensorDescriptor_t y, const int req, int *got,
                                                   cudnnConvolutionFwdAlgoPerf_t *perf) {
  finds++;
  if (!handle_stream_ok(h, "cudnnFindConvolutionForwardAlgorithm"))
    return CUDNN_STATUS_EXECUTION_FAILED;
  return fwd_algos(c, x, w, y, req, got, perf);
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t c,
                                                     const cudnnTensorDescriptor_t y, const int req, int *got,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf) {
  (void)h;
  return fwd_algos(c, x, w, y, req, got, perf);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t c,
                                                      const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *n) {
  (void)h;
  if (!geometry_ok(*c, *x, *w, *y))
    return CUDNN_STATUS_BAD_PARAM;
  *n = algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ? kWorkspace : 0;
  return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
}

/* The backward-data problem: dy is the forward output of dx by w. */
static bool bwd_geometry_ok(const cudnnConvolutionStruct &c, const cudnnFilterStruct &w, const cudnnTensorStruct &dy,
                            const cudnnTensorStruct &dx) {
  return geometry_ok(c, dx, w, dy);
}

static cudnnStatus_t bwd_algos(const cudnnConvolutionStruct *c, const cudnnFilterStruct *w,
                               const cudnnTensorStruct *dy, const cudnnTensorStruct *dx, int req, int *got,
                               cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  if (!bwd_geometry_ok(*c, *w, *dy, *dx))
    return CUDNN_STATUS_BAD_PARAM;
  *got = 0;
  if (req >= 1)
    perf[(*got)++] = cudnnConvolutionBwdDataAlgoPerf_t{CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
                                                       CUDNN_STATUS_NOT_SUPPORTED, -1.f, 0, CUDNN_NON_DETERMINISTIC,
                                                       c->math, {0, 0, 0}};
  if (req >= 2)
    perf[(*got)++] = cudnnConvolutionBwdDataAlgoPerf_t{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_STATUS_SUCCESS, 0.1f,
                                                       kWorkspace, CUDNN_DETERMINISTIC, c->math, {0, 0, 0}};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                        const cudnnTensorDescriptor_t dy,
                                                        const cudnnConvolutionDescriptor_t c,
                                                        const cudnnTensorDescriptor_t dx, const int req, int *got,
                                                        cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  finds++;
  if (!handle_stream_ok(h, "cudnnFindConvolutionBackwardDataAlgorithm"))
    return CUDNN_STATUS_EXECUTION_FAILED;
  return bwd_algos(c, w, dy, dx, req, got, perf);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t c,
                                                          const cudnnTensorDescriptor_t dx, const int req, int *got,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  (void)h;
  return bwd_algos(c, w, dy, dx, req, got, perf);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t c,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *n) {
  (void)h;
  if (!bwd_geometry_ok(*c, *w, *dy, *dx))
    return CUDNN_STATUS_BAD_PARAM;
  *n = kWorkspace;
  return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t xd,
                                      const void *x, const cudnnFilterDescriptor_t wd, const void *w,
                                      const cudnnConvolutionDescriptor_t cd, cudnnConvolutionFwdAlgo_t algo, void *ws,
                                      size_t wsn, const void *beta, const cudnnTensorDescriptor_t yd, void *y) {
  if (!geometry_ok(*cd, *xd, *wd, *yd) || algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
    return CUDNN_STATUS_BAD_PARAM;
  if (!handle_stream_ok(h, "cudnnConvolutionForward") || !workspace_ok(ws, wsn, "forward") || !on_device(x, t_extent(*xd), "x") || !on_device(w, f_bytes(*wd), "w") ||
      !on_device(y, t_extent(*yd), "y"))
    return CUDNN_STATUS_BAD_PARAM;
  float a = scalar(alpha), b = scalar(beta);
  cudnnTensorStruct X = *xd, Y = *yd;
  cudnnFilterStruct W = *wd;
  cudnnConvolutionStruct C = *cd;
  spn_emu_stream_do(h->stream, [=] {
    memset(ws, 0xff, kWorkspace);
    conv_forward_rows(C, X, x, W, w, Y, [&](int n, int k, int oh, const double *acc) {
      for (int ow = 0; ow < Y.dims[3]; ow++) {
        int64_t o = t_off(Y, n, k, oh, ow);
        double v = a * acc[ow];
        if (b != 0.f)
          v += b * load(y, Y.dt, o);
        store(y, Y.dt, o, v);
      }
    });
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t h, const void *alpha1, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnFilterDescriptor_t wd, const void *w, const cudnnConvolutionDescriptor_t cd,
    cudnnConvolutionFwdAlgo_t algo, void *ws, size_t wsn, const void *alpha2, const cudnnTensorDescriptor_t zd,
    const void *z, const cudnnTensorDescriptor_t bd, const void *bias, const cudnnActivationDescriptor_t ad,
    const cudnnTensorDescriptor_t yd, void *y) {
  if (!geometry_ok(*cd, *xd, *wd, *yd) || algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
    return CUDNN_STATUS_BAD_PARAM;
  if (ad->mode != CUDNN_ACTIVATION_RELU && ad->mode != CUDNN_ACTIVATION_IDENTITY)
    return CUDNN_STATUS_NOT_SUPPORTED;
  if (!zd->set || memcmp(zd->dims, yd->dims, sizeof yd->dims) || !bd->set || bd->dims[0] != 1 ||
      bd->dims[1] != yd->dims[1] || bd->dims[2] != 1 || bd->dims[3] != 1) {
    spn_emu_complain("cuDNN fused convolution: z must have y's dims and bias (1,K,1,1)");
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (!handle_stream_ok(h, "cudnnConvolutionBiasActivationForward") || !workspace_ok(ws, wsn, "fused forward") || !on_device(x, t_extent(*xd), "x") ||
      !on_device(w, f_bytes(*wd), "w") || !on_device(y, t_extent(*yd), "y") || !on_device(z, t_extent(*zd), "z") ||
      !on_device(bias, t_extent(*bd), "bias"))
    return CUDNN_STATUS_BAD_PARAM;
  float a1 = scalar(alpha1), a2 = scalar(alpha2);
  bool relu = ad->mode == CUDNN_ACTIVATION_RELU;
  cudnnTensorStruct X = *xd, Y = *yd, Z = *zd, B = *bd;
  cudnnFilterStruct W = *wd;
  cudnnConvolutionStruct C = *cd;
  spn_emu_stream_do(h->stream, [=] {
    memset(ws, 0xff, kWorkspace);
    conv_forward_rows(C, X, x, W, w, Y, [&](int n, int k, int oh, const double *acc) {
      double bk = load(bias, B.dt, t_off(B, 0, k, 0, 0));
      for (int ow = 0; ow < Y.dims[3]; ow++) {
        double v = a1 * acc[ow];
        if (a2 != 0.f)
          v += a2 * load(z, Z.dt, t_off(Z, n, k, oh, ow));
        v += bk;
        if (relu && v < 0)
          v = 0;
        store(y, Y.dt, t_off(Y, n, k, oh, ow), v);
      }
    });
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, const cudnnFilterDescriptor_t wd,
                                           const void *w, const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const cudnnConvolutionDescriptor_t cd, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t wsn, const void *beta, const cudnnTensorDescriptor_t dxd,
                                           void *dx) {
  if (!bwd_geometry_ok(*cd, *wd, *dyd, *dxd) || algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_1)
    return CUDNN_STATUS_BAD_PARAM;
  if (!handle_stream_ok(h, "cudnnConvolutionBackwardData") || !workspace_ok(ws, wsn, "backward data") || !on_device(dy, t_extent(*dyd), "dy") ||
      !on_device(w, f_bytes(*wd), "w") || !on_device(dx, t_extent(*dxd), "dx"))
    return CUDNN_STATUS_BAD_PARAM;
  float a = scalar(alpha), b = scalar(beta);
  cudnnTensorStruct DY = *dyd, DX = *dxd;
  cudnnFilterStruct W = *wd;
  cudnnConvolutionStruct C = *cd;
  spn_emu_stream_do(h->stream, [=] {
    memset(ws, 0xff, kWorkspace);
    const int *xd = DX.dims;
    std::vector<double> acc((size_t)xd[0] * xd[1] * xd[2] * xd[3], 0.0);
    conv_backward_rows(C, DY, dy, W, w, DX, acc.data());
    for (int n = 0; n < xd[0]; n++)
      for (int c = 0; c < xd[1]; c++)
        for (int ih = 0; ih < xd[2]; ih++)
          for (int iw = 0; iw < xd[3]; iw++) {
            int64_t o = t_off(DX, n, c, ih, iw);
            double v = a * acc[(((size_t)n * xd[1] + c) * xd[2] + ih) * xd[3] + iw];
            if (b != 0.f)
              v += b * load(dx, DX.dt, o);
            store(dx, DX.dt, o, v);
          }
  });
  return CUDNN_STATUS_SUCCESS;
}

} // extern "C"
