/* cuda/engine/engine-kernels.cuh — the CUDA engine backend's own kernels
 * (everything cuDNN and cuBLASLt do not do): fp32 NCHW, and the fp16
 * channels-last helpers at the end.
 *
 * Each is the GPU twin of a CPU kernel in core/engine/cpu-kernels.c, with the
 * same semantics (broadcast strides, pad modes, resize tables computed on the
 * host by the same code). Every function launches on `stream` and returns at
 * once; a launch error comes back as the cudaError_t. Plain C declarations:
 * backend-cuda.c and tests/gpu include this header. */
#ifndef SPINDLE_CUDA_ENGINE_KERNELS_CUH
#define SPINDLE_CUDA_ENGINE_KERNELS_CUH

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPN_CU_MAXD 8

/* Shapes and element strides of an N-d operand, passed by value. */
typedef struct spn_cu_nd {
  int nd;
  int64_t shape[SPN_CU_MAXD]; /* output shape */
  int64_t st[SPN_CU_MAXD];    /* source strides per output dim (0 = broadcast) */
} spn_cu_nd_t;

enum { SPN_CU_RELU, SPN_CU_LRELU, SPN_CU_SIGMOID, SPN_CU_TANH, SPN_CU_CLIP, SPN_CU_EXP };
enum { SPN_CU_ADD, SPN_CU_SUB, SPN_CU_MUL, SPN_CU_DIV, SPN_CU_PRELU };

/* y[i] = f(x[i]) for i < n (x may equal y). a, b: alpha / clip bounds. */
cudaError_t spn_cu_unary(int op, const float *x, float *y, int64_t n, float a, float b, cudaStream_t s);
/* y = a (op) b with broadcasting: ya gives y's shape and a's strides, stb b's. */
cudaError_t spn_cu_binary(int op, const float *a, const float *b, float *y, const spn_cu_nd_t *ya,
                          const spn_cu_nd_t *stb, cudaStream_t s);
/* y[n,c,i] = x[n,c,i] * scale[c] + shift[c] (bias: scale NULL). */
cudaError_t spn_cu_channel_affine(const float *x, float *y, const float *scale, const float *shift, int64_t N,
                                  int64_t C, int64_t HW, cudaStream_t s);
/* y[i] = x[base + sum_d idx_d * st[d]] over y's shape (transpose, slice). */
cudaError_t spn_cu_strided_copy(const void *x, void *y, int es, const spn_cu_nd_t *g, int64_t base, cudaStream_t s);
/* Pad: mode 0 constant (value), 1 reflect, 2 edge; pads_begin per dim. */
cudaError_t spn_cu_pad(const float *x, float *y, const spn_cu_nd_t *g, const int64_t *xshape,
                       const int64_t *pads_begin, int mode, float value, cudaStream_t s);
/* Resize over (planes, D, H, W) with index/weight tables prepared on the
 * host (device pointers): i0/i1/w per axis, concatenated D then H then W. */
cudaError_t spn_cu_resize(const float *x, float *y, int64_t planes, const int64_t *ish, const int64_t *osh,
                          const int64_t *i0, const int64_t *i1, const float *w, int linear, cudaStream_t s);
/* Resize mode cubic over (planes, H, W), sp = {ih, iw, oh, ow}, with the
 * 4-tap tables of spn_resize_cubic_tables on the device (H's, then W's). */
cudaError_t spn_cu_resize_cubic(const float *x, float *y, int64_t planes, const int64_t *sp, const int64_t *idx,
                                const float *w, cudaStream_t s);
cudaError_t spn_cu_softmax(const float *x, float *y, int64_t outer, int64_t len, int64_t inner, cudaStream_t s);
cudaError_t spn_cu_depth_to_space(const float *x, float *y, int64_t N, int64_t C, int64_t H, int64_t W,
                                  int64_t b, int crd, cudaStream_t s);
cudaError_t spn_cu_global_avg_pool(const float *x, float *y, int64_t planes, int64_t sp, cudaStream_t s);
/* fp16 edges of the tensor-core operators (precision "fp16"): y16[i] =
 * half(x[i]) rounded to nearest even; the cast back, with the convolution's
 * leading post-ops fused, is y[n,c,i] = act(float(x16[n,c,i]) + bias[c] +
 * z[n,c,i]) (bias NULL: none; z NULL or a tensor of y's shape; C and HW
 * describe the layout for the bias; act 0 none, 1 ReLU, 2
 * LeakyReLU(slope)); cs > 0: x16 is channels-last (N, HW, cs), of which
 * the first C channels are y's, while y stays NCHW. Halves are passed as raw
 * 16-bit storage. */
cudaError_t spn_cu_f32_to_f16(const float *x, uint16_t *y16, int64_t n, cudaStream_t s);
cudaError_t spn_cu_f16_epilogue(const uint16_t *x16, float *y, const float *bias, const float *z, int64_t N,
                                int64_t C, int64_t HW, int act, float slope, int64_t cs, cudaStream_t s);
/* fp16 channels-last values (precision fp16 with channels-last activations,
 * docs/engine.md): a tensor of logical shape (N, C, H, W) stored as
 * half[N][H][W][C]. A chain applies up to SPN_CU_MAX_HSTEPS element-wise
 * steps in fp32 and rounds once: a unary step (`unary` one of SPN_CU_RELU..
 * SPN_CU_EXP, with a, b as for spn_cu_unary) or, with unary < 0, a binary
 * one (`binary` one of SPN_CU_ADD..SPN_CU_PRELU) whose second operand is h
 * (fp16 channels-last, y's shape) or else the fp32 constant f[0] (a scalar)
 * or f[c] (per_channel). */
#define SPN_CU_MAX_HSTEPS 6
typedef struct spn_cu_hstep {
  int unary, binary;
  float a, b;
  const uint16_t *h;
  const float *f;
  int per_channel;
} spn_cu_hstep_t;
typedef struct spn_cu_hchain {
  int n;
  spn_cu_hstep_t s[SPN_CU_MAX_HSTEPS];
} spn_cu_hchain_t;
/* y16 = chain(float(x16[i]) + bias[i % C]) over n elements with C channels
 * innermost (bias NULL: none; x16 may equal y16). */
cudaError_t spn_cu_h_map(const uint16_t *x16, uint16_t *y16, const float *bias, int64_t n, int64_t C,
                         const spn_cu_hchain_t *ch, cudaStream_t s);
/* y16 (N, HW, Cp) = half(x (N, C, HW)), rounded to nearest even; channels
 * C..Cp-1 of every pixel zero (Cp >= C: a channel count padded for cuDNN). */
cudaError_t spn_cu_nchw_to_nhwc16(const float *x, uint16_t *y16, int64_t N, int64_t C, int64_t HW, int64_t Cp,
                                  cudaStream_t s);
/* Resize of an fp16 channels-last (N, H, W, C) tensor over H and W, with
 * spn_cu_resize's tables (ish/osh: D, H, W with D = 1; the D table's one
 * entry first): nearest copies samples, linear blends them in fp32 and
 * rounds once. */
cudaError_t spn_cu_resize_h(const uint16_t *x16, uint16_t *y16, int64_t N, int64_t C, const int64_t *ish,
                            const int64_t *osh, const int64_t *i0, const int64_t *i1, const float *w, int linear,
                            cudaStream_t s);
/* 2-D pooling over NCHW: max (avg = 0) or average; pads top/left; count
 * includes padding when count_pad. Output size given. */
cudaError_t spn_cu_pool2d(const float *x, float *y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                          int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw, int avg, int count_pad,
                          cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
