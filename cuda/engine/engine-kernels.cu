/* cuda/engine/engine-kernels.cu — see engine-kernels.cuh. Grid-stride loops
 * over 64-bit element counts; no kernel allocates or synchronises. */
#include <math.h>

#include <cuda_fp16.h>

#include "engine-kernels.cuh"

#define SPN_CU_THREADS 256

static unsigned grid_for(int64_t n) {
  int64_t b = (n + SPN_CU_THREADS - 1) / SPN_CU_THREADS;
  if (b < 1)
    b = 1;
  return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}

#define GRID_LOOP(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* One element of each operator family; the fp32 kernels and the fp16
 * channels-last chain (k_h_map) share them. */
__device__ __forceinline__ float unary_op(int op, float v, float a, float b) {
  switch (op) {
  case SPN_CU_RELU: return v > 0.f ? v : 0.f;
  case SPN_CU_LRELU: return v > 0.f ? v : v * a;
  case SPN_CU_SIGMOID: return 1.f / (1.f + expf(-v));
  case SPN_CU_TANH: return tanhf(v);
  case SPN_CU_CLIP: return v < a ? a : (v > b ? b : v);
  default: return expf(v);
  }
}

__device__ __forceinline__ float binary_op(int op, float x, float w) {
  switch (op) {
  case SPN_CU_ADD: return x + w;
  case SPN_CU_SUB: return x - w;
  case SPN_CU_MUL: return x * w;
  case SPN_CU_DIV: return x / w;
  default: return x > 0.f ? x : x * w;
  }
}

__global__ void k_unary(int op, const float *x, float *y, int64_t n, float a, float b) {
  GRID_LOOP(i, n) y[i] = unary_op(op, x[i], a, b);
}

extern "C" cudaError_t spn_cu_unary(int op, const float *x, float *y, int64_t n, float a, float b, cudaStream_t s) {
  if (n <= 0)
    return cudaSuccess;
  k_unary<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(op, x, y, n, a, b);
  return cudaGetLastError();
}

__global__ void k_binary(int op, const float *A, const float *B, float *Y, spn_cu_nd_t ga, spn_cu_nd_t gb, int64_t n) {
  GRID_LOOP(i, n) {
    int64_t rem = i, oa = 0, ob = 0;
    for (int d = ga.nd - 1; d >= 0; d--) {
      int64_t c = rem % ga.shape[d];
      rem /= ga.shape[d];
      oa += c * ga.st[d];
      ob += c * gb.st[d];
    }
    Y[i] = binary_op(op, A[oa], B[ob]);
  }
}

extern "C" cudaError_t spn_cu_binary(int op, const float *a, const float *b, float *y, const spn_cu_nd_t *ya,
                                     const spn_cu_nd_t *stb, cudaStream_t s) {
  int64_t n = 1;
  for (int d = 0; d < ya->nd; d++)
    n *= ya->shape[d];
  if (n <= 0)
    return cudaSuccess;
  k_binary<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(op, a, b, y, *ya, *stb, n);
  return cudaGetLastError();
}

__global__ void k_affine(const float *x, float *y, const float *scale, const float *shift, int64_t C, int64_t HW,
                         int64_t n) {
  GRID_LOOP(i, n) {
    int64_t c = (i / HW) % C;
    y[i] = x[i] * (scale ? scale[c] : 1.f) + (shift ? shift[c] : 0.f);
  }
}

extern "C" cudaError_t spn_cu_channel_affine(const float *x, float *y, const float *scale, const float *shift,
                                             int64_t N, int64_t C, int64_t HW, cudaStream_t s) {
  int64_t n = N * C * HW;
  if (n <= 0)
    return cudaSuccess;
  k_affine<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, y, scale, shift, C, HW, n);
  return cudaGetLastError();
}

template <typename T>
__global__ void k_strided(const T *x, T *y, spn_cu_nd_t g, int64_t base, int64_t n) {
  GRID_LOOP(i, n) {
    int64_t rem = i, src = base;
    for (int d = g.nd - 1; d >= 0; d--) {
      src += (rem % g.shape[d]) * g.st[d];
      rem /= g.shape[d];
    }
    y[i] = x[src];
  }
}

extern "C" cudaError_t spn_cu_strided_copy(const void *x, void *y, int es, const spn_cu_nd_t *g, int64_t base,
                                           cudaStream_t s) {
  int64_t n = 1;
  for (int d = 0; d < g->nd; d++)
    n *= g->shape[d];
  if (n <= 0)
    return cudaSuccess;
  if (es == 4)
    k_strided<float><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const float *)x, (float *)y, *g, base, n);
  else if (es == 8)
    k_strided<int64_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const int64_t *)x, (int64_t *)y, *g, base, n);
  else if (es == 2)
    k_strided<uint16_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const uint16_t *)x, (uint16_t *)y, *g, base, n);
  else
    k_strided<uint8_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const uint8_t *)x, (uint8_t *)y, *g, base, n);
  return cudaGetLastError();
}

typedef struct {
  int64_t v[SPN_CU_MAXD];
} nd_arr_t;

__global__ void k_pad(const float *x, float *y, spn_cu_nd_t g, nd_arr_t xs, nd_arr_t pb, int mode, float value,
                      int64_t n) {
  GRID_LOOP(i, n) {
    int64_t rem = i, src = 0;
    bool inside = true;
    for (int d = g.nd - 1; d >= 0; d--) {
      int64_t c = rem % g.shape[d] - pb.v[d];
      rem /= g.shape[d];
      int64_t len = xs.v[d];
      if (c < 0 || c >= len) {
        if (mode == 0) {
          inside = false;
          break;
        } else if (mode == 1) {
          if (len == 1) {
            c = 0;
          } else {
            int64_t per = 2 * (len - 1);
            c = ((c % per) + per) % per;
            if (c >= len)
              c = per - c;
          }
        } else {
          c = c < 0 ? 0 : len - 1;
        }
      }
      src += c * g.st[d];
    }
    y[i] = inside ? x[src] : value;
  }
}

extern "C" cudaError_t spn_cu_pad(const float *x, float *y, const spn_cu_nd_t *g, const int64_t *xshape,
                                  const int64_t *pads_begin, int mode, float value, cudaStream_t s) {
  int64_t n = 1;
  nd_arr_t xs, pb;
  for (int d = 0; d < g->nd; d++) {
    n *= g->shape[d];
    xs.v[d] = xshape[d];
    pb.v[d] = pads_begin[d];
  }
  if (n <= 0)
    return cudaSuccess;
  k_pad<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, y, *g, xs, pb, mode, value, n);
  return cudaGetLastError();
}

__global__ void k_resize(const float *X, float *Y, int64_t planes, int64_t id, int64_t ih, int64_t iw, int64_t od,
                         int64_t oh, int64_t ow, const int64_t *i0, const int64_t *i1, const float *w, int linear,
                         int64_t n) {
  const int64_t *i0d = i0, *i0h = i0 + od, *i0w = i0 + od + oh;
  const int64_t *i1d = i1, *i1h = i1 + od, *i1w = i1 + od + oh;
  const float *wd = w, *wh = w + od, *ww = w + od + oh;
  GRID_LOOP(i, n) {
    int64_t x = i % ow, t = i / ow, y = t % oh, z = (t / oh) % od, p = t / (oh * od);
    const float *xp = X + p * id * ih * iw;
    if (!linear) {
      Y[i] = xp[(i0d[z] * ih + i0h[y]) * iw + i0w[x]];
      continue;
    }
    float acc = 0.f;
    for (int a = 0; a < 2; a++) {
      int64_t dd = a ? i1d[z] : i0d[z];
      float fa = a ? wd[z] : 1.f - wd[z];
      for (int b = 0; b < 2; b++) {
        int64_t hh = b ? i1h[y] : i0h[y];
        float fb = b ? wh[y] : 1.f - wh[y];
        float v0 = xp[(dd * ih + hh) * iw + i0w[x]], v1 = xp[(dd * ih + hh) * iw + i1w[x]];
        acc += fa * fb * (v0 * (1.f - ww[x]) + v1 * ww[x]);
      }
    }
    Y[i] = acc;
  }
  (void)planes;
}

extern "C" cudaError_t spn_cu_resize(const float *x, float *y, int64_t planes, const int64_t *ish, const int64_t *osh,
                                     const int64_t *i0, const int64_t *i1, const float *w, int linear, cudaStream_t s) {
  int64_t n = planes * osh[0] * osh[1] * osh[2];
  if (n <= 0)
    return cudaSuccess;
  k_resize<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, y, planes, ish[0], ish[1], ish[2], osh[0], osh[1], osh[2], i0, i1,
                                                  w, linear, n);
  return cudaGetLastError();
}

/* Resize mode cubic over (planes, H, W) with the 4-tap tables of
 * spn_resize_cubic_tables (device pointers: H's 4 * oh entries, then W's):
 * each output sums four rows of four taps, in the CPU kernel's order, each
 * product and sum rounded on its own (no fused multiply-add), so it gives
 * the CPU's result. */
__global__ void k_resize_cubic(const float *X, float *Y, int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                               const int64_t *idx, const float *w, int64_t n) {
  const int64_t *hi = idx, *wi = idx + 4 * oh;
  const float *hw = w, *ww = w + 4 * oh;
  GRID_LOOP(i, n) {
    int64_t q = i % ow, t = i / ow, o = t % oh, p = t / oh;
    const float *xp = X + p * ih * iw;
    float acc = 0.f;
    for (int k = 0; k < 4; k++) {
      const float *src = xp + hi[4 * o + k] * iw;
      float rowv = 0.f;
      for (int j = 0; j < 4; j++)
        rowv = __fadd_rn(rowv, __fmul_rn(ww[4 * q + j], src[wi[4 * q + j]]));
      acc = __fadd_rn(acc, __fmul_rn(hw[4 * o + k], rowv));
    }
    Y[i] = acc;
  }
}

extern "C" cudaError_t spn_cu_resize_cubic(const float *x, float *y, int64_t planes, const int64_t *sp,
                                           const int64_t *idx, const float *w, cudaStream_t s) {
  int64_t n = planes * sp[2] * sp[3];
  if (n <= 0)
    return cudaSuccess;
  k_resize_cubic<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, y, sp[0], sp[1], sp[2], sp[3], idx, w, n);
  return cudaGetLastError();
}

/* Resize of an fp16 channels-last (N, H, W, C) tensor over H and W with the
 * tables k_resize reads (D entries first, one of them here): nearest copies
 * the sample, linear blends in fp32 and rounds once. */
__global__ void k_resize_h(const __half *X, __half *Y, int64_t C, int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                           const int64_t *i0, const int64_t *i1, const float *w, int linear, int64_t n) {
  const int64_t *i0h = i0 + 1, *i0w = i0 + 1 + oh, *i1h = i1 + 1, *i1w = i1 + 1 + oh;
  const float *wh = w + 1, *ww = w + 1 + oh;
  GRID_LOOP(i, n) {
    int64_t c = i % C, t = i / C, x = t % ow, t2 = t / ow, y = t2 % oh, b = t2 / oh;
    const __half *xp = X + b * ih * iw * C + c;
    if (!linear) {
      Y[i] = xp[(i0h[y] * iw + i0w[x]) * C];
      continue;
    }
    float v00 = __half2float(xp[(i0h[y] * iw + i0w[x]) * C]), v01 = __half2float(xp[(i0h[y] * iw + i1w[x]) * C]);
    float v10 = __half2float(xp[(i1h[y] * iw + i0w[x]) * C]), v11 = __half2float(xp[(i1h[y] * iw + i1w[x]) * C]);
    float top = v00 * (1.f - ww[x]) + v01 * ww[x], bot = v10 * (1.f - ww[x]) + v11 * ww[x];
    Y[i] = __float2half_rn(top * (1.f - wh[y]) + bot * wh[y]);
  }
}

extern "C" cudaError_t spn_cu_resize_h(const uint16_t *x16, uint16_t *y16, int64_t N, int64_t C, const int64_t *ish,
                                       const int64_t *osh, const int64_t *i0, const int64_t *i1, const float *w,
                                       int linear, cudaStream_t s) {
  int64_t n = N * C * osh[1] * osh[2];
  if (n <= 0)
    return cudaSuccess;
  if (ish[0] != 1 || osh[0] != 1)
    return cudaErrorInvalidValue;
  k_resize_h<<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const __half *)x16, (__half *)y16, C, ish[1], ish[2], osh[1],
                                                    osh[2], i0, i1, w, linear, n);
  return cudaGetLastError();
}

/* One thread per (outer, inner) row; rows are short in the models served. */
__global__ void k_softmax(const float *x, float *y, int64_t outer, int64_t len, int64_t inner) {
  GRID_LOOP(r, outer * inner) {
    int64_t o = r / inner, in = r % inner;
    const float *px = x + o * len * inner + in;
    float *py = y + o * len * inner + in;
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++)
      mx = fmaxf(mx, px[j * inner]);
    float sum = 0.f;
    for (int64_t j = 0; j < len; j++) {
      float e = expf(px[j * inner] - mx);
      py[j * inner] = e;
      sum += e;
    }
    for (int64_t j = 0; j < len; j++)
      py[j * inner] /= sum;
  }
}

extern "C" cudaError_t spn_cu_softmax(const float *x, float *y, int64_t outer, int64_t len, int64_t inner,
                                      cudaStream_t s) {
  if (outer * inner <= 0)
    return cudaSuccess;
  k_softmax<<<grid_for(outer * inner), SPN_CU_THREADS, 0, s>>>(x, y, outer, len, inner);
  return cudaGetLastError();
}

__global__ void k_d2s(const float *X, float *Y, int64_t C, int64_t H, int64_t W, int64_t b, int crd, int64_t n) {
  GRID_LOOP(i, n) {
    int64_t OW = W * b, OH = H * b;
    int64_t ox = i % OW, t = i / OW, oy = t % OH, c = (t / OH) % C, nn = t / (OH * C);
    int64_t h = oy / b, bi = oy % b, w = ox / b, bj = ox % b;
    int64_t ic = crd ? c * b * b + bi * b + bj : (bi * b + bj) * C + c;
    Y[i] = X[((nn * C * b * b + ic) * H + h) * W + w];
  }
}

extern "C" cudaError_t spn_cu_depth_to_space(const float *x, float *y, int64_t N, int64_t C, int64_t H, int64_t W,
                                             int64_t b, int crd, cudaStream_t s) {
  int64_t n = N * C * H * b * W * b;
  if (n <= 0)
    return cudaSuccess;
  k_d2s<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, y, C, H, W, b, crd, n);
  return cudaGetLastError();
}

/* One block per plane, a shared-memory tree sum in double like the CPU. */
__global__ void k_gap(const float *x, float *y, int64_t sp) {
  __shared__ double part[SPN_CU_THREADS];
  const float *px = x + blockIdx.x * sp;
  double acc = 0;
  for (int64_t i = threadIdx.x; i < sp; i += blockDim.x)
    acc += px[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int k = SPN_CU_THREADS / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k)
      part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    y[blockIdx.x] = (float)(part[0] / (double)sp);
}

extern "C" cudaError_t spn_cu_global_avg_pool(const float *x, float *y, int64_t planes, int64_t sp, cudaStream_t s) {
  if (planes <= 0 || sp <= 0)
    return cudaSuccess;
  for (int64_t p0 = 0; p0 < planes; p0 += 65535) {
    int64_t cnt = planes - p0 < 65535 ? planes - p0 : 65535;
    k_gap<<<(unsigned)cnt, SPN_CU_THREADS, 0, s>>>(x + p0 * sp, y + p0, sp);
  }
  return cudaGetLastError();
}

__global__ void k_pool(const float *x, float *y, int64_t H, int64_t W, int64_t OH, int64_t OW, int kh, int kw, int sh,
                       int sw, int ph, int pw, int dh, int dw, int avg, int count_pad, int64_t n) {
  GRID_LOOP(i, n) {
    int64_t ox = i % OW, t = i / OW, oy = t % OH, p = t / OH;
    const float *xp = x + p * H * W;
    float best = -INFINITY, sum = 0.f;
    int64_t cnt = 0, cnt_pad = 0;
    for (int a = 0; a < kh; a++) {
      int64_t yy = oy * sh - ph + (int64_t)a * dh;
      for (int b = 0; b < kw; b++) {
        int64_t xx = ox * sw - pw + (int64_t)b * dw;
        bool in_pad = yy < H + ph && xx < W + pw; /* inside the padded frame */
        if (yy < 0 || yy >= H || xx < 0 || xx >= W) {
          cnt_pad += in_pad;
          continue;
        }
        float v = xp[yy * W + xx];
        best = fmaxf(best, v);
        sum += v;
        cnt++;
        cnt_pad++;
      }
    }
    y[i] = avg ? sum / (float)((count_pad ? cnt_pad : cnt) ? (count_pad ? cnt_pad : cnt) : 1) : best;
  }
}

extern "C" cudaError_t spn_cu_pool2d(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                                     int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw, int avg,
                                     int count_pad, cudaStream_t s) {
  int64_t n = NC * OH * OW;
  if (n <= 0)
    return cudaSuccess;
  k_pool<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, y, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, avg, count_pad, n);
  return cudaGetLastError();
}

__global__ void k_f2h(const float *x, __half *y, int64_t n) {
  GRID_LOOP(i, n) y[i] = __float2half_rn(x[i]);
}

extern "C" cudaError_t spn_cu_f32_to_f16(const float *x, uint16_t *y16, int64_t n, cudaStream_t s) {
  if (n <= 0)
    return cudaSuccess;
  k_f2h<<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, (__half *)y16, n);
  return cudaGetLastError();
}

/* The fp16 convolution's epilogue in one pass: float(x16) + bias[c], + z
 * (a residual of y's shape), then ReLU (act 1) or LeakyReLU (act 2, slope).
 * y is NCHW; x16 is NCHW too, or NHWC with cs >= C channels a pixel (cs > 0:
 * the channels-last convolution whose output is not kept in fp16). 32-bit indices where they fit: a
 * 64-bit division per element would make this memory-bound pass bound by
 * arithmetic. */
template <typename I>
__global__ void k_h2f_epi(const __half *x, float *y, const float *bias, const float *z, I C, I HW, I n, int act,
                          float slope, I cs) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I c = (i / HW) % C;
    I src = cs ? (i / (HW * C) * HW + i % HW) * cs + c : i;
    float v = __half2float(x[src]);
    if (bias)
      v += bias[c];
    if (z)
      v += z[i];
    if (act == 1)
      v = v > 0.f ? v : 0.f;
    else if (act == 2)
      v = v > 0.f ? v : v * slope;
    y[i] = v;
  }
}

extern "C" cudaError_t spn_cu_f16_epilogue(const uint16_t *x16, float *y, const float *bias, const float *z,
                                           int64_t N, int64_t C, int64_t HW, int act, float slope, int64_t cs,
                                           cudaStream_t s) {
  int64_t n = N * C * HW;
  if (n <= 0)
    return cudaSuccess;
  if (HW < 1)
    HW = 1;
  if (cs && cs < C)
    return cudaErrorInvalidValue;
  if (n < ((int64_t)1 << 31) && N * cs * HW < ((int64_t)1 << 31))
    k_h2f_epi<uint32_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const __half *)x16, y, bias, z, (uint32_t)C,
                                                              (uint32_t)HW, (uint32_t)n, act, slope, (uint32_t)cs);
  else
    k_h2f_epi<int64_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const __half *)x16, y, bias, z, C, HW, n, act, slope,
                                                             cs);
  return cudaGetLastError();
}

/* ---- fp16 channels-last values ---- */

template <typename I>
__global__ void k_f2h_nhwc(const float *x, __half *y, I C, I Cp, I HW, I n) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I c = i % Cp, p = (i / Cp) % HW, b = i / (Cp * HW);
    y[i] = c < C ? __float2half_rn(x[(b * C + c) * HW + p]) : __float2half_rn(0.f);
  }
}

extern "C" cudaError_t spn_cu_nchw_to_nhwc16(const float *x, uint16_t *y16, int64_t N, int64_t C, int64_t HW,
                                             int64_t Cp, cudaStream_t s) {
  int64_t n = N * Cp * HW;
  if (n <= 0)
    return cudaSuccess;
  if (Cp < C)
    return cudaErrorInvalidValue;
  if (n < ((int64_t)1 << 31))
    k_f2h_nhwc<uint32_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, (__half *)y16, (uint32_t)C, (uint32_t)Cp,
                                                               (uint32_t)HW, (uint32_t)n);
  else
    k_f2h_nhwc<int64_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>(x, (__half *)y16, C, Cp, HW, n);
  return cudaGetLastError();
}

/* One step of a chain on v at channel c; w is the step's fp16 operand at
 * this element when it has one (st.h), read by the caller. */
__device__ __forceinline__ float h_step(const spn_cu_hstep_t &st, float v, float w, uint64_t c) {
  if (st.unary >= 0)
    return unary_op(st.unary, v, st.a, st.b);
  return binary_op(st.binary, v, st.h ? w : st.f[st.per_channel ? c : 0]);
}

template <typename I>
__global__ void k_h_map(const __half *x, __half *y, const float *bias, I C, I n, spn_cu_hchain_t ch) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I c = i % C;
    float v = __half2float(x[i]);
    if (bias)
      v += bias[c];
    /* Unrolled: constant step indices keep the chain in parameter space. */
#pragma unroll
    for (int k = 0; k < SPN_CU_MAX_HSTEPS; k++) {
      if (k >= ch.n)
        break;
      v = h_step(ch.s[k], v, ch.s[k].h ? __half2float(((const __half *)ch.s[k].h)[i]) : 0.f, c);
    }
    y[i] = __float2half_rn(v);
  }
}

/* The same chain eight channels at a time (C a multiple of 8, every fp16
 * pointer 16-byte aligned): one 16-byte load and store per operand and one
 * channel index per eight elements, for a pass that is bound by memory. */
union h8 {
  uint4 u;
  __half h[8];
};

__global__ void k_h_map8(const uint4 *x, uint4 *y, const float *bias, uint32_t C8, uint32_t n8, spn_cu_hchain_t ch) {
  for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n8; j += gridDim.x * blockDim.x) {
    uint32_t c0 = (j % C8) * 8;
    h8 in, out;
    in.u = x[j];
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++)
      v[e] = __half2float(in.h[e]) + (bias ? bias[c0 + e] : 0.f);
#pragma unroll
    for (int k = 0; k < SPN_CU_MAX_HSTEPS; k++) {
      if (k >= ch.n)
        break;
      h8 w;
      w.u = ch.s[k].h ? ((const uint4 *)ch.s[k].h)[j] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int e = 0; e < 8; e++)
        v[e] = h_step(ch.s[k], v[e], __half2float(w.h[e]), c0 + e);
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
      out.h[e] = __float2half_rn(v[e]);
    y[j] = out.u;
  }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" cudaError_t spn_cu_h_map(const uint16_t *x16, uint16_t *y16, const float *bias, int64_t n, int64_t C,
                                    const spn_cu_hchain_t *ch, cudaStream_t s) {
  if (n <= 0)
    return cudaSuccess;
  if (C < 1 || ch->n < 0 || ch->n > SPN_CU_MAX_HSTEPS)
    return cudaErrorInvalidValue;
  bool wide = C % 8 == 0 && n % 8 == 0 && n / 8 < ((int64_t)1 << 31) && aligned16(x16) && aligned16(y16);
  for (int k = 0; k < ch->n && wide; k++)
    wide = !ch->s[k].h || aligned16(ch->s[k].h);
  if (wide)
    k_h_map8<<<grid_for(n / 8), SPN_CU_THREADS, 0, s>>>((const uint4 *)x16, (uint4 *)y16, bias, (uint32_t)(C / 8),
                                                        (uint32_t)(n / 8), *ch);
  else if (n < ((int64_t)1 << 31))
    k_h_map<uint32_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const __half *)x16, (__half *)y16, bias, (uint32_t)C,
                                                            (uint32_t)n, *ch);
  else
    k_h_map<int64_t><<<grid_for(n), SPN_CU_THREADS, 0, s>>>((const __half *)x16, (__half *)y16, bias, C, n, *ch);
  return cudaGetLastError();
}
