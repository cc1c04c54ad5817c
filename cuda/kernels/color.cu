/* cuda/kernels/color.cu — GPU twins of spn_image_convert's RGB → 4:2:0 and
 * 4:2:0 ↔ 4:2:0 paths (see color.cuh).
 *
 * One thread per chroma sample: it converts the (up to) four pixels the
 * sample covers, writes their luma, and writes the mean of their chroma.
 * The float arithmetic is core/image/image.c's rgb_to_yuv, operation by
 * operation, with the explicit-rounding intrinsics (__fmul_rn, __fadd_rn,
 * __fsub_rn, __fdiv_rn) so nvcc cannot contract a multiply and an add into
 * one fused operation the CPU does not do; the chroma sum accumulates in the
 * reference's order (rows, then columns). The result is the CPU's, byte for
 * byte, on any input. */
#include <stdint.h>

#include "color.cuh"
#include "kernel-common.cuh"
#include "tonemap.h"

namespace {

using spn_kernels::sat_u8;

/* This family's launch check. */
int32_t launched(const char *op, spn_error_t *err) { return spn_kernels::launched("cuda color", op, err); }

struct plane3 {
  uint8_t *data[3];
  int64_t stride[3];
  int32_t w, h, format;
};

plane3 describe(const spn_image_t *im) {
  plane3 d;
  for (int p = 0; p < 3; p++) {
    d.data[p] = im->data[p];
    d.stride[p] = im->stride[p];
  }
  d.w = im->width;
  d.h = im->height;
  d.format = im->format;
  return d;
}

bool is_rgb_u8(int32_t f) { return f == SPN_PIXFMT_RGB24 || f == SPN_PIXFMT_BGR24; }
bool is_yuv420(int32_t f) { return f == SPN_PIXFMT_NV12 || f == SPN_PIXFMT_YUV420P; }

int32_t check(const spn_image_t *im, const char *op, const char *what, spn_error_t *err) {
  if (!im || im->width <= 0 || im->height <= 0 || !im->data[0])
    return spn_error_set(err, SPN_EINVAL, "cuda color: %s: %s is empty or has no data", op, what);
  if (im->format == SPN_PIXFMT_NV12 && !im->data[1])
    return spn_error_set(err, SPN_EINVAL, "cuda color: %s: %s (nv12) has no chroma plane", op, what);
  if (im->format == SPN_PIXFMT_YUV420P && (!im->data[1] || !im->data[2]))
    return spn_error_set(err, SPN_EINVAL, "cuda color: %s: %s (yuv420p) lacks a chroma plane", op, what);
  return SPN_OK;
}

int32_t check_pair(const spn_image_t *src, spn_image_t *dst, const char *op, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, op, "source", err)) || (rc = check(dst, op, "destination", err)))
    return rc;
  if (src->width != dst->width || src->height != dst->height)
    return spn_error_set(err, SPN_EINVAL, "cuda color: %s: sizes differ (%dx%d vs %dx%d)", op, (int)src->width,
                         (int)src->height, (int)dst->width, (int)dst->height);
  return SPN_OK;
}

/* image.c's rgb_to_yuv: yoff + (to_y . RGB) / 255, 128 + (to_u . RGB) / 255,
 * ... in that order (spn_yuv_coeffs_t; BT.601 limited by default). */
__device__ __forceinline__ float dot3_255(const float *k, float r, float g, float b) {
  return __fdiv_rn(__fadd_rn(__fadd_rn(__fmul_rn(k[0], r), __fmul_rn(k[1], g)), __fmul_rn(k[2], b)), 255.0f);
}

__device__ __forceinline__ void rgb_to_yuv(const spn_yuv_coeffs_t &k, float r, float g, float b, float *y, float *u,
                                           float *v) {
  *y = __fadd_rn(k.yoff, dot3_255(k.to_y, r, g, b));
  *u = __fadd_rn(128.0f, dot3_255(k.to_u, r, g, b));
  *v = __fadd_rn(128.0f, dot3_255(k.to_v, r, g, b));
}

__device__ __forceinline__ uint8_t *chroma_u(const plane3 &im, int32_t cx, int32_t cy) {
  return im.format == SPN_PIXFMT_NV12 ? im.data[1] + cy * im.stride[1] + (int64_t)cx * 2
                                      : im.data[1] + cy * im.stride[1] + cx;
}
__device__ __forceinline__ uint8_t *chroma_v(const plane3 &im, int32_t cx, int32_t cy) {
  return im.format == SPN_PIXFMT_NV12 ? im.data[1] + cy * im.stride[1] + (int64_t)cx * 2 + 1
                                      : im.data[2] + cy * im.stride[2] + cx;
}

/* (cx, cy): one chroma sample of dst and the pixels it covers. */
__global__ void rgb_to_yuv420_kernel(plane3 src, plane3 dst, spn_yuv_coeffs_t k) {
  int32_t cx = blockIdx.x * blockDim.x + threadIdx.x, cy = blockIdx.y * blockDim.y + threadIdx.y;
  if (cx >= (dst.w + 1) / 2 || cy >= (dst.h + 1) / 2)
    return;
  bool bgr = src.format == SPN_PIXFMT_BGR24;
  float su = 0.0f, sv = 0.0f;
  int n = 0;
  for (int32_t y = 2 * cy; y < 2 * cy + 2 && y < dst.h; y++)
    for (int32_t x = 2 * cx; x < 2 * cx + 2 && x < dst.w; x++) {
      const uint8_t *p = src.data[0] + y * src.stride[0] + (int64_t)x * 3;
      float r = p[bgr ? 2 : 0], g = p[1], b = p[bgr ? 0 : 2], yv, u, v;
      rgb_to_yuv(k, r, g, b, &yv, &u, &v);
      dst.data[0][y * dst.stride[0] + x] = sat_u8(yv);
      su = __fadd_rn(su, u);
      sv = __fadd_rn(sv, v);
      n++;
    }
  *chroma_u(dst, cx, cy) = sat_u8(__fdiv_rn(su, (float)n));
  *chroma_v(dst, cx, cy) = sat_u8(__fdiv_rn(sv, (float)n));
}

__global__ void yuv420_repack_kernel(plane3 src, plane3 dst) {
  int32_t cx = blockIdx.x * blockDim.x + threadIdx.x, cy = blockIdx.y * blockDim.y + threadIdx.y;
  if (cx >= (dst.w + 1) / 2 || cy >= (dst.h + 1) / 2)
    return;
  for (int32_t y = 2 * cy; y < 2 * cy + 2 && y < dst.h; y++)
    for (int32_t x = 2 * cx; x < 2 * cx + 2 && x < dst.w; x++)
      dst.data[0][y * dst.stride[0] + x] = src.data[0][y * src.stride[0] + x];
  *chroma_u(dst, cx, cy) = *chroma_u(src, cx, cy);
  *chroma_v(dst, cx, cy) = *chroma_v(src, cx, cy);
}

/* P010/P016 -> 8 bits: each 16-bit sample (the value in its high bits)
 * rounded to its top 8 bits, ties up, saturated. */
__device__ __forceinline__ uint8_t top8(uint16_t v) { return v >= 0xff80 ? 255 : (uint8_t)((v + 0x80u) >> 8); }

__global__ void p016_to_yuv420_kernel(const uint8_t *y16, int64_t ys, const uint8_t *uv16, int64_t uvs, plane3 dst) {
  int32_t cx = blockIdx.x * blockDim.x + threadIdx.x, cy = blockIdx.y * blockDim.y + threadIdx.y;
  if (cx >= (dst.w + 1) / 2 || cy >= (dst.h + 1) / 2)
    return;
  for (int32_t y = 2 * cy; y < 2 * cy + 2 && y < dst.h; y++)
    for (int32_t x = 2 * cx; x < 2 * cx + 2 && x < dst.w; x++)
      dst.data[0][y * dst.stride[0] + x] = top8(((const uint16_t *)(y16 + y * ys))[x]);
  const uint16_t *c = (const uint16_t *)(uv16 + cy * uvs) + 2 * cx;
  *chroma_u(dst, cx, cy) = top8(c[0]);
  *chroma_v(dst, cx, cy) = top8(c[1]);
}

/* One sample of an HDR picture, raw (8 or 16 bits). */
__device__ __forceinline__ int32_t sample(const uint8_t *row, int32_t i, bool deep) {
  return deep ? ((const uint16_t *)row)[i] : row[i];
}

/* One thread per pixel: spn_tonemap_yuv420's steps (stages/media), with
 * the same helpers (tonemap.h). */
__global__ void hdr420_to_rgb_kernel(plane3 src, bool deep, spn_yuv_coeffs_t k, int32_t transfer, plane3 dst) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dst.w || y >= dst.h)
    return;
  int32_t t[4];
  spn_tm_chroma_taps(x, y, dst.w, dst.h, t);
  const uint8_t *c0 = src.data[1] + t[2] * src.stride[1], *c1 = src.data[1] + t[3] * src.stride[1];
  int32_t su = 3 * (sample(c0, 2 * t[0], deep) + sample(c0, 2 * t[1], deep)) + sample(c1, 2 * t[0], deep) +
               sample(c1, 2 * t[1], deep);
  int32_t sv = 3 * (sample(c0, 2 * t[0] + 1, deep) + sample(c0, 2 * t[1] + 1, deep)) +
               sample(c1, 2 * t[0] + 1, deep) + sample(c1, 2 * t[1] + 1, deep);
  float unit = deep ? 1.0f / 256.0f : 1.0f; /* (exact scalings) */
  int32_t code[3];
  spn_tm_yuv_to_rgb16(&k, __fmul_rn((float)sample(src.data[0] + y * src.stride[0], x, deep), unit),
                      __fmul_rn((float)su, __fmul_rn(unit, 0.125f)), __fmul_rn((float)sv, __fmul_rn(unit, 0.125f)),
                      code);
  float rgb[3];
  for (int c = 0; c < 3; c++)
    rgb[c] = spn_tm_signal(transfer, (float)code[c] / 65535.0f);
  if (transfer == SPN_TRANSFER_HLG) {
    float g = spn_tm_hlg_gain(spn_tm_hlg_luma(rgb[0], rgb[1], rgb[2]), NULL);
    for (int c = 0; c < 3; c++)
      rgb[c] = __fmul_rn(rgb[c], g);
  }
  float o[3];
  spn_tm_to_sdr(rgb[0], rgb[1], rgb[2], o);
  uint8_t *p = dst.data[0] + y * dst.stride[0] + (int64_t)x * 3;
  bool bgr = dst.format == SPN_PIXFMT_BGR24;
  p[bgr ? 2 : 0] = spn_tm_sdr(o[0], NULL);
  p[1] = spn_tm_sdr(o[1], NULL);
  p[bgr ? 0 : 2] = spn_tm_sdr(o[2], NULL);
}

const dim3 k_block(32, 8);

dim3 chroma_grid(int32_t w, int32_t h) {
  int32_t cw = (w + 1) / 2, ch = (h + 1) / 2;
  return dim3((unsigned)((cw + (int32_t)k_block.x - 1) / (int32_t)k_block.x),
              (unsigned)((ch + (int32_t)k_block.y - 1) / (int32_t)k_block.y));
}

} // namespace

extern "C" int32_t spn_cuda_rgb_to_yuv420(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream,
                                          spn_error_t *err) {
  return spn_cuda_rgb_to_yuv420_colour(src, dst, NULL, stream, err);
}

extern "C" int32_t spn_cuda_rgb_to_yuv420_colour(const spn_image_t *src, spn_image_t *dst, const spn_colour_t *colour,
                                                 cudaStream_t stream, spn_error_t *err) {
  spn_yuv_coeffs_t k = {};
  int32_t rc = check_pair(src, dst, "rgb_to_yuv420", err);
  if (rc)
    return rc;
  if ((rc = spn_colour_coeffs(colour, &k, err)))
    return spn_error_prefix(err, "cuda color: rgb_to_yuv420");
  if (!is_rgb_u8(src->format) || !is_yuv420(dst->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda color: rgb_to_yuv420: conversion from %s to %s is not "
                         "supported (rgb24/bgr24 to yuv420p/nv12)", spn_pixfmt_name(src->format),
                         spn_pixfmt_name(dst->format));
  rgb_to_yuv420_kernel<<<chroma_grid(dst->width, dst->height), k_block, 0, stream>>>(describe(src), describe(dst),
                                                                                     k);
  return launched("rgb_to_yuv420", err);
}

extern "C" int32_t spn_cuda_yuv420_repack(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream,
                                          spn_error_t *err) {
  int32_t rc = check_pair(src, dst, "yuv420_repack", err);
  if (rc)
    return rc;
  if (!is_yuv420(src->format) || !is_yuv420(dst->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda color: yuv420_repack: conversion from %s to %s is not "
                         "supported (nv12/yuv420p to nv12/yuv420p)", spn_pixfmt_name(src->format),
                         spn_pixfmt_name(dst->format));
  yuv420_repack_kernel<<<chroma_grid(dst->width, dst->height), k_block, 0, stream>>>(describe(src), describe(dst));
  return launched("yuv420_repack", err);
}

extern "C" int32_t spn_cuda_p016_to_yuv420(const void *y16, int64_t y_pitch, const void *uv16, int64_t uv_pitch,
                                           spn_image_t *dst, cudaStream_t stream, spn_error_t *err) {
  int32_t rc = check(dst, "p016_to_yuv420", "destination", err);
  if (rc)
    return rc;
  if (!is_yuv420(dst->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda color: p016_to_yuv420: conversion to %s is not supported "
                         "(nv12/yuv420p)", spn_pixfmt_name(dst->format));
  int64_t row = 2 * (int64_t)dst->width, crow = 4 * (int64_t)((dst->width + 1) / 2);
  if (!y16 || !uv16 || y_pitch < row || uv_pitch < crow)
    return spn_error_set(err, SPN_EINVAL, "cuda color: p016_to_yuv420: a %dx%d source needs both planes and "
                         "pitches of at least %lld and %lld bytes (got %lld and %lld)", (int)dst->width,
                         (int)dst->height, (long long)row, (long long)crow, (long long)y_pitch, (long long)uv_pitch);
  p016_to_yuv420_kernel<<<chroma_grid(dst->width, dst->height), k_block, 0, stream>>>(
      (const uint8_t *)y16, y_pitch, (const uint8_t *)uv16, uv_pitch, describe(dst));
  return launched("p016_to_yuv420", err);
}

extern "C" int32_t spn_cuda_hdr420_to_rgb(const spn_image_t *src, int32_t deep, const spn_colour_t *colour,
                                          int32_t transfer, spn_image_t *dst, cudaStream_t stream, spn_error_t *err) {
  spn_yuv_coeffs_t k = {};
  int32_t rc = check_pair(src, dst, "hdr420_to_rgb", err);
  if (rc)
    return rc;
  if ((rc = spn_colour_coeffs(colour, &k, err)))
    return spn_error_prefix(err, "cuda color: hdr420_to_rgb");
  if (src->format != SPN_PIXFMT_NV12 || !is_rgb_u8(dst->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda color: hdr420_to_rgb: conversion from %s to %s is not "
                         "supported (nv12 or its 16-bit form to rgb24/bgr24)", spn_pixfmt_name(src->format),
                         spn_pixfmt_name(dst->format));
  if (transfer != SPN_TRANSFER_PQ && transfer != SPN_TRANSFER_HLG)
    return spn_error_set(err, SPN_EINVAL, "cuda color: hdr420_to_rgb: transfer %d is neither PQ (16) nor HLG (18)",
                         (int)transfer);
  int64_t es = deep ? 2 : 1, row = es * src->width, crow = es * 2 * (int64_t)((src->width + 1) / 2);
  if (src->stride[0] < row || src->stride[1] < crow)
    return spn_error_set(err, SPN_EINVAL, "cuda color: hdr420_to_rgb: a %dx%d %s source needs pitches of at least "
                         "%lld and %lld bytes (got %lld and %lld)", (int)src->width, (int)src->height,
                         deep ? "16-bit" : "8-bit", (long long)row, (long long)crow, (long long)src->stride[0],
                         (long long)src->stride[1]);
  dim3 grid((unsigned)((dst->width + (int32_t)k_block.x - 1) / (int32_t)k_block.x),
            (unsigned)((dst->height + (int32_t)k_block.y - 1) / (int32_t)k_block.y));
  hdr420_to_rgb_kernel<<<grid, k_block, 0, stream>>>(describe(src), deep != 0, k, transfer, describe(dst));
  return launched("hdr420_to_rgb", err);
}
