/* cuda/kernels/detect.cu — candidate selection of the face detectors'
 * outputs on the GPU (see detect.cuh).
 *
 * One thread per anchor over the three levels (strides 8, 16, 32): a thread
 * whose score passes the threshold decodes its box and landmarks with the
 * CPU decoder's arithmetic and appends one row to the list with an atomic
 * counter. The comparisons are the references' (RetinaFace and YuNet keep
 * score > threshold, SCRFD score >= threshold; NaN never passes). */
#include <stdint.h>
#include <string.h>

#include "detect.cuh"
#include "kernel-common.cuh"

namespace {

int32_t launched(const char *op, spn_error_t *err) { return spn_kernels::launched("cuda detect", op, err); }

const int32_t k_strides[3] = {8, 16, 32};

/* The anchors of the three levels: level k holds anchors base[k] ..
 * base[k+1]-1, `per_cell` to a cell, cells row by row `fw[k]` wide. */
struct levels {
  int64_t base[4];
  int32_t fw[3];
  int32_t per_cell;
};

struct args {
  spn_cuda_facedet_t d;
  levels lv;
  int64_t per_image[SPN_CUDA_FACEDET_MAX_OUTPUTS]; /* floats of one image in each output */
  float thr;
};

/* The arithmetic, rounded as the CPU rounds: on the device with the
 * explicit-rounding intrinsics (no fused multiply-add); on the host (the
 * same code run by spn_cuda_facedet_candidates_host) the plain operators,
 * which x86-64 rounds the same way. */
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float divf(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double dadd(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double dmul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double ddiv(double a, double b) { return __ddiv_rn(a, b); }
#else
inline float mul(float a, float b) { return a * b; }
inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
inline float divf(float a, float b) { return a / b; }
inline double dadd(double a, double b) { return a + b; }
inline double dmul(double a, double b) { return a * b; }
inline double ddiv(double a, double b) { return a / b; }
#endif

__host__ __device__ __forceinline__ float clamp01(float v) { return v < 0.f ? 0.f : (v > 1.f ? 1.f : v); }

/* facedet.c's to_image: input pixels → image pixels. */
__host__ __device__ void to_image(const spn_cuda_facedet_t &d, spn_cuda_facecand_t &f) {
  float px = (float)d.pad_x, py = (float)d.pad_y;
  f.x0 = divf(sub(f.x0, px), d.scale_x);
  f.x1 = divf(sub(f.x1, px), d.scale_x);
  f.y0 = divf(sub(f.y0, py), d.scale_y);
  f.y1 = divf(sub(f.y1, py), d.scale_y);
  if (f.has_landmarks)
    for (int k = 0; k < 5; k++) {
      f.landmarks[2 * k] = divf(sub(f.landmarks[2 * k], px), d.scale_x);
      f.landmarks[2 * k + 1] = divf(sub(f.landmarks[2 * k + 1], py), d.scale_y);
    }
}

/* Anchor gidx of the batch (image gidx / anchors, then the anchor): decode it
 * into *f when its score passes; false when it does not. */
__host__ __device__ bool decode_anchor(const args &a, int64_t gidx, spn_cuda_facecand_t &f) {
  const levels &lv = a.lv;
  int32_t image = (int32_t)(gidx / lv.base[3]);
  int64_t idx = gidx - (int64_t)image * lv.base[3];
  int k = idx < lv.base[1] ? 0 : (idx < lv.base[2] ? 1 : 2);
  int64_t local = idx - lv.base[k];
  int32_t m = (int32_t)(local % lv.per_cell);
  int64_t cell = local / lv.per_cell;
  int32_t row = (int32_t)(cell / lv.fw[k]), col = (int32_t)(cell % lv.fw[k]);
  const int32_t step = 8 << k; /* k_strides[k] */
  const float fs = (float)step;
  spn_cuda_facedet_t d = a.d;
  for (int32_t o = 0; o < d.n_outputs; o++) /* this image's part of each output */
    d.outputs[o] += a.per_image[o] * image;
  f.image = image;
  f.anchor = (int32_t)idx;
  switch (d.model) {
  case SPN_CUDA_FACEDET_RETINAFACE: {
    const int32_t min_sizes[3][2] = {{16, 32}, {64, 128}, {256, 512}};
    float score = d.outputs[1][2 * idx + 1];
    if (!(score > a.thr))
      return false;
    float pw = (float)ddiv((double)min_sizes[k][m], (double)d.in_w);
    float ph = (float)ddiv((double)min_sizes[k][m], (double)d.in_h);
    float pcx = (float)ddiv(dmul(dadd((double)col, 0.5), (double)step), (double)d.in_w);
    float pcy = (float)ddiv(dmul(dadd((double)row, 0.5), (double)step), (double)d.in_h);
    const float *l = d.outputs[0] + 4 * idx, *q = d.outputs[2] + 10 * idx;
    float W = (float)d.in_w, H = (float)d.in_h;
    float cx = add(pcx, mul(mul(l[0], 0.1f), pw)), cy = add(pcy, mul(mul(l[1], 0.1f), ph));
    float bw = mul(pw, expf(mul(l[2], 0.2f))), bh = mul(ph, expf(mul(l[3], 0.2f)));
    float x0 = sub(cx, divf(bw, 2.f)), y0 = sub(cy, divf(bh, 2.f));
    f.score = score;
    f.has_landmarks = 1;
    f.x0 = mul(x0, W);
    f.y0 = mul(y0, H);
    f.x1 = mul(add(bw, x0), W);
    f.y1 = mul(add(bh, y0), H);
    for (int t = 0; t < 5; t++) {
      f.landmarks[2 * t] = mul(add(pcx, mul(mul(q[2 * t], 0.1f), pw)), W);
      f.landmarks[2 * t + 1] = mul(add(pcy, mul(mul(q[2 * t + 1], 0.1f), ph)), H);
    }
    to_image(d, f);
    break;
  }
  case SPN_CUDA_FACEDET_SCRFD: {
    float score = d.outputs[k][local];
    if (!(score >= a.thr))
      return false;
    const float *bb = d.outputs[3 + k] + 4 * local;
    const float *kp = d.n_outputs == 9 ? d.outputs[6 + k] + 10 * local : nullptr;
    float cx = mul((float)col, fs), cy = mul((float)row, fs);
    f.score = score;
    f.has_landmarks = kp != nullptr;
    f.x0 = sub(cx, mul(bb[0], fs));
    f.y0 = sub(cy, mul(bb[1], fs));
    f.x1 = add(cx, mul(bb[2], fs));
    f.y1 = add(cy, mul(bb[3], fs));
    for (int t = 0; t < 5; t++) {
      f.landmarks[2 * t] = kp ? add(cx, mul(kp[2 * t], fs)) : 0.f;
      f.landmarks[2 * t + 1] = kp ? add(cy, mul(kp[2 * t + 1], fs)) : 0.f;
    }
    to_image(d, f);
    break;
  }
  default: { /* YuNet: stays in input pixels (NMS runs there; spn_facedet_select maps it) */
    float score = sqrtf(mul(clamp01(d.outputs[k][local]), clamp01(d.outputs[3 + k][local])));
    if (!(score > a.thr))
      return false;
    const float *bb = d.outputs[6 + k] + 4 * local, *kp = d.outputs[9 + k] + 10 * local;
    float cx = mul(add((float)col, bb[0]), fs), cy = mul(add((float)row, bb[1]), fs);
    float w = mul(expf(bb[2]), fs), h = mul(expf(bb[3]), fs);
    f.score = score;
    f.has_landmarks = 1;
    f.x0 = sub(cx, divf(w, 2.f));
    f.y0 = sub(cy, divf(h, 2.f));
    f.x1 = add(f.x0, w);
    f.y1 = add(f.y0, h);
    for (int t = 0; t < 5; t++) {
      f.landmarks[2 * t] = mul(add(kp[2 * t], (float)col), fs);
      f.landmarks[2 * t + 1] = mul(add(kp[2 * t + 1], (float)row), fs);
    }
    break;
  }
  }
  return true;
}

__global__ void candidates_kernel(args a, uint8_t *list, int32_t cap) {
  int64_t gidx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  spn_cuda_facecand_t f;
  if (gidx >= a.lv.base[3] * a.d.batch || !decode_anchor(a, gidx, f))
    return;
  int32_t slot = atomicAdd((int32_t *)list, 1);
  if (slot < cap)
    ((spn_cuda_facecand_t *)(list + SPN_CUDA_FACECAND_HEADER))[slot] = f;
}

/* Check the arguments and lay out the levels and the per-image strides. */
int32_t setup(const spn_cuda_facedet_t *det, const void *list, int32_t cap, args *out, spn_error_t *err) {
  if (!det || !list || cap < 0)
    return spn_error_set(err, SPN_EINVAL, "cuda detect: NULL argument or negative capacity");
  if (det->in_w <= 0 || det->in_h <= 0 || det->in_w > 8192 || det->in_h > 8192 || !(det->scale_x > 0) ||
      !(det->scale_y > 0))
    return spn_error_set(err, SPN_EINVAL, "cuda detect: bad geometry (input %dx%d)", (int)det->in_w, (int)det->in_h);
  int32_t want = det->model == SPN_CUDA_FACEDET_RETINAFACE ? 3 : det->model == SPN_CUDA_FACEDET_YUNET ? 12 : 0;
  bool count_ok = det->model == SPN_CUDA_FACEDET_SCRFD ? (det->n_outputs == 6 || det->n_outputs == 9)
                                                       : (want && det->n_outputs == want);
  if (!count_ok)
    return spn_error_set(err, SPN_EINVAL, "cuda detect: model %d with %d outputs is not a supported layout",
                         (int)det->model, (int)det->n_outputs);
  for (int32_t i = 0; i < det->n_outputs; i++)
    if (!det->outputs[i])
      return spn_error_set(err, SPN_EINVAL, "cuda detect: output %d is NULL", (int)i);
  if (det->batch < 0 || det->batch > 65536)
    return spn_error_set(err, SPN_EINVAL, "cuda detect: batch %d", (int)det->batch);
  args &a = *out;
  a.d = *det;
  if (a.d.batch == 0)
    a.d.batch = 1;
  a.thr = det->score_threshold;
  a.lv.per_cell = det->model == SPN_CUDA_FACEDET_YUNET ? 1 : 2;
  a.lv.base[0] = 0;
  for (int k = 0; k < 3; k++) {
    int32_t s = k_strides[k];
    /* RetinaFace's feature maps round up (padded convolutions); SCRFD and
     * YuNet take whole cells, as their decoders do. */
    int32_t fh = det->model == SPN_CUDA_FACEDET_RETINAFACE ? (det->in_h + s - 1) / s : det->in_h / s;
    int32_t fw = det->model == SPN_CUDA_FACEDET_RETINAFACE ? (det->in_w + s - 1) / s : det->in_w / s;
    a.lv.fw[k] = fw > 0 ? fw : 1; /* (a level without cells has no anchors: never divided by) */
    a.lv.base[k + 1] = a.lv.base[k] + (int64_t)fh * fw * a.lv.per_cell;
  }
  /* Floats per image: RetinaFace's three outputs span every level (4, 2,
   * 10 per anchor); SCRFD and YuNet have one output per level and kind. */
  static const int32_t retina_cols[3] = {4, 2, 10}, scrfd_cols[3] = {1, 4, 10}, yunet_cols[4] = {1, 1, 4, 10};
  for (int32_t o = 0; o < det->n_outputs; o++) {
    int32_t k = o % 3;
    int64_t anchors = a.lv.base[k + 1] - a.lv.base[k];
    a.per_image[o] = det->model == SPN_CUDA_FACEDET_RETINAFACE ? a.lv.base[3] * retina_cols[o]
                     : det->model == SPN_CUDA_FACEDET_SCRFD    ? anchors * scrfd_cols[o / 3]
                                                               : anchors * yunet_cols[o / 3];
  }
  return SPN_OK;
}

} // namespace

extern "C" int32_t spn_cuda_facedet_candidates(const spn_cuda_facedet_t *det, void *list, int32_t cap,
                                               cudaStream_t stream, spn_error_t *err) {
  args a;
  int32_t rc = setup(det, list, cap, &a, err);
  if (rc != SPN_OK)
    return rc;
  cudaError_t ce = cudaMemsetAsync(list, 0, sizeof(int32_t), stream);
  if (ce != cudaSuccess)
    return spn_error_set(err, SPN_ECUDA, "cuda detect: clearing the count: %s (%s)", cudaGetErrorString(ce),
                         cudaGetErrorName(ce));
  int64_t n = a.lv.base[3] * a.d.batch;
  if (n == 0)
    return SPN_OK;
  const int threads = 256;
  candidates_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(a, (uint8_t *)list, cap);
  return launched("facedet candidates", err);
}

extern "C" int32_t spn_cuda_facedet_candidates_host(const spn_cuda_facedet_t *det, void *list, int32_t cap,
                                                    spn_error_t *err) {
  args a;
  int32_t rc = setup(det, list, cap, &a, err);
  if (rc != SPN_OK)
    return rc;
  int32_t count = 0;
  spn_cuda_facecand_t *rows = (spn_cuda_facecand_t *)((uint8_t *)list + SPN_CUDA_FACECAND_HEADER);
  /* From the last anchor down: the kernel's rows come in no set order, nor
   * do these (a caller that relied on the order would fail here too). */
  for (int64_t g = a.lv.base[3] * a.d.batch - 1; g >= 0; g--) {
    spn_cuda_facecand_t f;
    if (!decode_anchor(a, g, f))
      continue;
    if (count < cap)
      rows[count] = f;
    count++;
  }
  memcpy(list, &count, sizeof count);
  return SPN_OK;
}
