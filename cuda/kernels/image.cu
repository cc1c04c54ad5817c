/* cuda/kernels/image.cu — GPU twins of core/image/image.c (see image.cuh).
 *
 * Every kernel maps one thread to one destination pixel and repeats the CPU
 * reference's float arithmetic in the same order. Contraction into fused
 * multiply-adds is prevented with the explicit-rounding intrinsics
 * (__fmul_rn, __fadd_rn, __fsub_rn), so each intermediate is rounded exactly
 * as the CPU rounds it; resize taps are computed in double as on the CPU. */
#include <math.h>
#include <stdint.h>

#include "image.cuh"
#include "kernel-common.cuh"
#include "tonemap.h" /* spn_tm_chroma_taps: 4:2:0 chroma siting */

namespace {

using spn_kernels::sat_u8;

/* This family's launch check. */
int32_t launched(const char *op, spn_error_t *err) { return spn_kernels::launched("cuda image", op, err); }

struct img_desc {
  uint8_t *data[4];
  int64_t stride[4];
  int32_t w, h, format, nc;
  bool u8;
};

bool is_u8_packed(int32_t f) { return f == SPN_PIXFMT_RGB24 || f == SPN_PIXFMT_BGR24 || f == SPN_PIXFMT_GRAY8; }
bool is_float_planar(int32_t f) {
  return f == SPN_PIXFMT_RGBF32P || f == SPN_PIXFMT_BGRF32P || f == SPN_PIXFMT_GRAYF32;
}
bool is_rgb_u8(int32_t f) { return f == SPN_PIXFMT_RGB24 || f == SPN_PIXFMT_BGR24; }

img_desc describe(const spn_image_t *im) {
  img_desc d;
  for (int p = 0; p < 4; p++) {
    d.data[p] = im->data[p];
    d.stride[p] = im->stride[p];
  }
  d.w = im->width;
  d.h = im->height;
  d.format = im->format;
  d.nc = (im->format == SPN_PIXFMT_GRAY8 || im->format == SPN_PIXFMT_GRAYF32) ? 1 : 3;
  d.u8 = is_u8_packed(im->format);
  return d;
}

int32_t check(const spn_image_t *im, const char *what, spn_error_t *err) {
  if (!im || im->width <= 0 || im->height <= 0 || !im->data[0])
    return spn_error_set(err, SPN_EINVAL, "cuda image: %s is empty or has no data", what);
  return SPN_OK;
}

/* mean/scale of to_float and from_float; NULL means 0 and 1. */
void norm_params(const float mean[3], const float scale[3], float m[3], float s[3]) {
  for (int c = 0; c < 3; c++) {
    m[c] = mean ? mean[c] : 0.0f;
    s[c] = scale ? scale[c] : 1.0f;
  }
}

__device__ __forceinline__ float get_px(const img_desc &im, int c, int32_t x, int32_t y) {
  if (im.u8)
    return (float)im.data[0][y * im.stride[0] + (int64_t)x * im.nc + c];
  return ((const float *)(im.data[c] + y * im.stride[c]))[x];
}

__device__ __forceinline__ void put_px(const img_desc &im, int c, int32_t x, int32_t y, float v) {
  if (im.u8)
    im.data[0][y * im.stride[0] + (int64_t)x * im.nc + c] = sat_u8(v);
  else
    ((float *)(im.data[c] + y * im.stride[c]))[x] = v;
}

/* lerp as the CPU writes it: a + (b - a) * w, each step rounded. */
__device__ __forceinline__ float lerp_rn(float a, float b, float w) {
  return __fadd_rn(a, __fmul_rn(__fsub_rn(b, a), w));
}

struct tap {
  int32_t i0, i1;
  float w1;
};

__device__ __forceinline__ tap linear_tap(int32_t src_n, int32_t dst_n, int32_t d) {
  double scale = (double)src_n / dst_n;
  double s = __dsub_rn(__dmul_rn(d + 0.5, scale), 0.5);
  double f = floor(s);
  int32_t i = (int32_t)f;
  tap t;
  t.w1 = (float)(s - f);
  t.i0 = i < 0 ? 0 : (i > src_n - 1 ? src_n - 1 : i);
  t.i1 = i + 1 < 0 ? 0 : (i + 1 > src_n - 1 ? src_n - 1 : i + 1);
  return t;
}

__global__ void resize_bilinear_kernel(img_desc src, img_desc dst) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dst.w || y >= dst.h)
    return;
  tap tx = linear_tap(src.w, dst.w, x), ty = linear_tap(src.h, dst.h, y);
  for (int c = 0; c < dst.nc; c++) {
    /* horizontal pass on the two source rows, then the vertical one */
    float r0 = lerp_rn(get_px(src, c, tx.i0, ty.i0), get_px(src, c, tx.i1, ty.i0), tx.w1);
    float r1 = lerp_rn(get_px(src, c, tx.i0, ty.i1), get_px(src, c, tx.i1, ty.i1), tx.w1);
    put_px(dst, c, x, y, lerp_rn(r0, r1, ty.w1));
  }
}

/* core/image/image.c's cubic_taps: the weights in double, each step
 * rounded as the CPU rounds it (no fused multiply-add). */
struct ctap {
  int32_t i[4];
  float w[4];
};

__device__ __forceinline__ ctap cubic_tap(int32_t src_n, int32_t dst_n, int32_t d) {
  const double A = -0.75;
  double scale = (double)src_n / dst_n;
  double s = __dsub_rn(__dmul_rn(d + 0.5, scale), 0.5);
  double f = floor(s), x = __dsub_rn(s, f), y = __dsub_rn(1.0, x), x1 = __dadd_rn(x, 1.0);
  double w0 = __dsub_rn(__dmul_rn(__dadd_rn(__dmul_rn(__dsub_rn(__dmul_rn(A, x1), 5.0 * A), x1), 8.0 * A), x1), 4.0 * A);
  double w1 = __dadd_rn(__dmul_rn(__dmul_rn(__dsub_rn(__dmul_rn(A + 2.0, x), A + 3.0), x), x), 1.0);
  double w2 = __dadd_rn(__dmul_rn(__dmul_rn(__dsub_rn(__dmul_rn(A + 2.0, y), A + 3.0), y), y), 1.0);
  double w3 = __dsub_rn(__dsub_rn(__dsub_rn(1.0, w0), w1), w2);
  ctap t;
  int32_t i = (int32_t)f;
  double w[4] = {w0, w1, w2, w3};
  for (int k = 0; k < 4; k++) {
    int32_t j = i - 1 + k;
    t.i[k] = j < 0 ? 0 : (j > src_n - 1 ? src_n - 1 : j);
    t.w[k] = (float)w[k];
  }
  return t;
}

__device__ __forceinline__ float cubic_sum(const float w[4], float a, float b, float c, float d) {
  return __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(w[0], a), __fmul_rn(w[1], b)), __fmul_rn(w[2], c)),
                   __fmul_rn(w[3], d));
}

/* The CPU's two passes per pixel: each of the four source rows the pixel
 * reads summed horizontally, then those four sums vertically. */
__global__ void resize_cubic_kernel(img_desc src, img_desc dst) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dst.w || y >= dst.h)
    return;
  ctap tx = cubic_tap(src.w, dst.w, x), ty = cubic_tap(src.h, dst.h, y);
  for (int c = 0; c < dst.nc; c++) {
    float r[4];
    for (int k = 0; k < 4; k++)
      r[k] = cubic_sum(tx.w, get_px(src, c, tx.i[0], ty.i[k]), get_px(src, c, tx.i[1], ty.i[k]),
                       get_px(src, c, tx.i[2], ty.i[k]), get_px(src, c, tx.i[3], ty.i[k]));
    put_px(dst, c, x, y, cubic_sum(ty.w, r[0], r[1], r[2], r[3]));
  }
}

__global__ void to_float_kernel(img_desc src, img_desc dst, float m0, float m1, float m2, float s0, float s1,
                                float s2) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dst.w || y >= dst.h)
    return;
  const uint8_t *p = src.data[0] + y * src.stride[0] + (int64_t)x * 3;
  bool sbgr = src.format == SPN_PIXFMT_BGR24;
  float rgb[3] = {(float)p[sbgr ? 2 : 0], (float)p[1], (float)p[sbgr ? 0 : 2]};
  float m[3] = {m0, m1, m2}, s[3] = {s0, s1, s2};
  bool dbgr = dst.format == SPN_PIXFMT_BGRF32P;
  for (int c = 0; c < 3; c++)
    ((float *)(dst.data[c] + y * dst.stride[c]))[x] = __fmul_rn(__fsub_rn(rgb[dbgr ? 2 - c : c], m[c]), s[c]);
}

/* core/image/image.c's yuv420_row_to_rgb: chroma upsampled bilinearly at
 * MPEG-2's siting (co-sited with even columns, midway between rows; the
 * taps are tonemap.h's, which the HDR kernel and its CPU twin read too), as
 * an integer sum of four samples divided exactly by 8. */
__global__ void yuv420_to_rgb_kernel(img_desc src, img_desc dst, spn_yuv_coeffs_t k) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dst.w || y >= dst.h)
    return;
  int32_t t[4];
  spn_tm_chroma_taps(x, y, src.w, src.h, t);
  bool nv12 = src.format == SPN_PIXFMT_NV12;
  int64_t step = nv12 ? 2 : 1, ia = t[0] * step, ib = t[1] * step;
  const uint8_t *u0 = src.data[1] + t[2] * src.stride[1], *u1 = src.data[1] + t[3] * src.stride[1];
  const uint8_t *v0 = nv12 ? u0 + 1 : src.data[2] + t[2] * src.stride[2];
  const uint8_t *v1 = nv12 ? u1 + 1 : src.data[2] + t[3] * src.stride[2];
  int32_t su = 3 * (u0[ia] + u0[ib]) + u1[ia] + u1[ib], sv = 3 * (v0[ia] + v0[ib]) + v1[ia] + v1[ib];
  float u = __fmul_rn((float)su, 0.125f), v = __fmul_rn((float)sv, 0.125f);
  float yv = src.data[0][y * src.stride[0] + x];
  float yy = __fmul_rn(k.ys, __fsub_rn(yv, k.yoff)), cb = __fsub_rn(u, 128.0f), cr = __fsub_rn(v, 128.0f);
  float r = __fadd_rn(yy, __fmul_rn(k.rv, cr));
  float g = __fsub_rn(__fsub_rn(yy, __fmul_rn(k.gu, cb)), __fmul_rn(k.gv, cr));
  float b = __fadd_rn(yy, __fmul_rn(k.bu, cb));
  uint8_t *p = dst.data[0] + y * dst.stride[0] + (int64_t)x * 3;
  bool bgr = dst.format == SPN_PIXFMT_BGR24;
  p[bgr ? 2 : 0] = sat_u8(r);
  p[1] = sat_u8(g);
  p[bgr ? 0 : 2] = sat_u8(b);
}

/* One thread per source pixel of the part of src that lands inside dst. */
__global__ void paste_kernel(img_desc dst, img_desc src, img_desc mask, bool has_mask, int32_t x0, int32_t y0,
                             int32_t sx0, int32_t sy0, int32_t w, int32_t h, bool swap) {
  int32_t i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y * blockDim.y + threadIdx.y;
  if (i >= w || j >= h)
    return;
  int32_t sx = sx0 + i, sy = sy0 + j, dx = x0 + sx, dy = y0 + sy;
  float a = has_mask ? ((const float *)(mask.data[0] + sy * mask.stride[0]))[sx] : 1.0f;
  a = fminf(fmaxf(a, 0.0f), 1.0f);
  for (int c = 0; c < src.nc; c++) {
    int dc = swap ? 2 - c : c;
    float s = get_px(src, c, sx, sy), d = get_px(dst, dc, dx, dy);
    put_px(dst, dc, dx, dy, __fadd_rn(__fmul_rn(a, s), __fmul_rn(__fsub_rn(1.0f, a), d)));
  }
}

/* v / scale + mean per channel, rounded and saturated (rgb_put on the CPU). */
__global__ void from_float_kernel(img_desc src, img_desc dst, float m0, float m1, float m2, float s0, float s1,
                                  float s2) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dst.w || y >= dst.h)
    return;
  float m[3] = {m0, m1, m2}, s[3] = {s0, s1, s2}, rgb[3];
  bool sbgr = src.format == SPN_PIXFMT_BGRF32P;
  for (int c = 0; c < 3; c++) /* c: the source plane; its colour is 2 - c in BGR order */
    rgb[sbgr ? 2 - c : c] = __fadd_rn(__fdiv_rn(((const float *)(src.data[c] + y * src.stride[c]))[x], s[c]), m[c]);
  uint8_t *p = dst.data[0] + y * dst.stride[0] + (int64_t)x * 3;
  bool dbgr = dst.format == SPN_PIXFMT_BGR24;
  p[dbgr ? 2 : 0] = sat_u8(rgb[0]);
  p[1] = sat_u8(rgb[1]);
  p[dbgr ? 0 : 2] = sat_u8(rgb[2]);
}

/* A network's 0..1 output to u8: round(clamp(v * 255, 0, 255)). */
__global__ void unit_to_u8_kernel(img_desc src, img_desc dst) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dst.w || y >= dst.h)
    return;
  bool sbgr = src.format == SPN_PIXFMT_BGRF32P, dbgr = dst.format == SPN_PIXFMT_BGR24;
  uint8_t *p = dst.data[0] + y * dst.stride[0] + (int64_t)x * 3;
  for (int c = 0; c < 3; c++) { /* source plane c holds colour (sbgr ? 2 - c : c) */
    float v = __fmul_rn(((const float *)(src.data[c] + y * src.stride[c]))[x], 255.0f);
    v = v > 0.0f ? (v < 255.0f ? v : 255.0f) : 0.0f; /* NaN: 0 */
    int colour = sbgr ? 2 - c : c;
    p[dbgr ? 2 - colour : colour] = sat_u8(v);
  }
}

/* One thread per block pixel (x, y) of tile blockIdx.z: its three colours,
 * as to_float_kernel with mean 0 (RGB planes). */
__global__ void tiles_cut_kernel(img_desc src, spn_cuda_tiles_t t, int32_t P, int32_t Q, float scale, float *dst) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y, i = blockIdx.z;
  if (x >= Q || y >= P || i >= t.n)
    return;
  const uint8_t *p = src.data[0] + (int64_t)(t.by[i] + y) * src.stride[0] + (int64_t)(t.bx[i] + x) * 3;
  bool sbgr = src.format == SPN_PIXFMT_BGR24;
  float rgb[3] = {(float)p[sbgr ? 2 : 0], (float)p[1], (float)p[sbgr ? 0 : 2]};
  size_t plane = (size_t)P * Q;
  float *o = dst + (size_t)i * 3 * plane + (size_t)y * Q + x;
  for (int c = 0; c < 3; c++)
    o[c * plane] = __fmul_rn(rgb[c], scale); /* (v - 0) * scale */
}
/* One thread per output pixel of tile blockIdx.z's own part, (X, Y) from
 * its corner: unit_to_u8_kernel's arithmetic on the value the tile's output
 * has there. */
__global__ void tiles_stitch_kernel(const float *src, int32_t P, int32_t Q, int32_t s, spn_cuda_tiles_t t,
                                    img_desc dst) {
  int32_t i = blockIdx.z;
  if (i >= t.n)
    return;
  int32_t X = blockIdx.x * blockDim.x + threadIdx.x, Y = blockIdx.y * blockDim.y + threadIdx.y;
  if (X >= (t.x1[i] - t.x0[i]) * s || Y >= (t.y1[i] - t.y0[i]) * s)
    return;
  int64_t oq = (int64_t)Q * s, plane = (int64_t)P * s * oq;
  int64_t ox = (int64_t)(t.x0[i] - t.bx[i]) * s + X, oy = (int64_t)(t.y0[i] - t.by[i]) * s + Y;
  const float *v = src + (int64_t)i * 3 * plane + oy * oq + ox;
  bool dbgr = dst.format == SPN_PIXFMT_BGR24;
  uint8_t *p = dst.data[0] + ((int64_t)t.y0[i] * s + Y) * dst.stride[0] + ((int64_t)t.x0[i] * s + X) * 3;
  for (int c = 0; c < 3; c++) {
    float u = __fmul_rn(v[c * plane], 255.0f);
    u = u > 0.0f ? (u < 255.0f ? u : 255.0f) : 0.0f; /* NaN: 0 */
    p[dbgr ? 2 - c : c] = sat_u8(u);
  }
}
/* Linear ramps from each edge over `feather` pixels, multiplied. */
__global__ void feather_mask_kernel(img_desc mask, float feather) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= mask.w || y >= mask.h)
    return;
  float dy = fminf(__fadd_rn((float)y, 0.5f), __fsub_rn(__fsub_rn((float)mask.h, (float)y), 0.5f));
  float dx = fminf(__fadd_rn((float)x, 0.5f), __fsub_rn(__fsub_rn((float)mask.w, (float)x), 0.5f));
  float ay = feather > 0 ? fminf(fmaxf(__fdiv_rn(dy, feather), 0.0f), 1.0f) : 1.0f;
  float ax = feather > 0 ? fminf(fmaxf(__fdiv_rn(dx, feather), 0.0f), 1.0f) : 1.0f;
  ((float *)(mask.data[0] + y * mask.stride[0]))[x] = __fmul_rn(ax, ay);
}

/* The detector input (face detector preprocessing, stages/vision/facedet.c):
 * inside the rectangle a bilinear sample of the u8 image with its own edge
 * rules, outside it the padding value; then (v - mean) * inv_std. */
struct fit_desc {
  int32_t rx, ry, rw, rh; /* the resized image's rectangle in the input */
  float mean[3], inv_std[3];
  int32_t swap;           /* output channel c reads image channel 2 - c */
};

__global__ void fit_normalize_kernel(img_desc src, float *out, int32_t in_w, int32_t in_h, fit_desc f) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= in_w || y >= in_h)
    return;
  size_t plane = (size_t)in_w * in_h, o = (size_t)y * in_w + x;
  int32_t lx = x - f.rx, ly = y - f.ry;
  if (lx < 0 || ly < 0 || lx >= f.rw || ly >= f.rh) {
    for (int c = 0; c < 3; c++)
      out[c * plane + o] = __fmul_rn(__fsub_rn(0.0f, f.mean[c]), f.inv_std[c]);
    return;
  }
  double sx = (double)src.w / f.rw, sy = (double)src.h / f.rh;
  double fy = __dsub_rn(__dmul_rn(ly + 0.5, sy), 0.5), fx = __dsub_rn(__dmul_rn(lx + 0.5, sx), 0.5);
  fy = fy < 0 ? 0 : fy;
  fx = fx < 0 ? 0 : fx;
  int32_t y0 = (int32_t)fy, x0 = (int32_t)fx;
  y0 = y0 > src.h - 1 ? src.h - 1 : y0;
  x0 = x0 > src.w - 1 ? src.w - 1 : x0;
  int32_t y1 = y0 + 1 < src.h ? y0 + 1 : y0, x1 = x0 + 1 < src.w ? x0 + 1 : x0;
  float wy = y0 == src.h - 1 ? 0.0f : (float)(fy - y0), wx = x0 == src.w - 1 ? 0.0f : (float)(fx - x0);
  const uint8_t *r0 = src.data[0] + y0 * src.stride[0], *r1 = src.data[0] + y1 * src.stride[0];
  for (int c = 0; c < 3; c++) {
    int ic = f.swap ? 2 - c : c;
    float a = r0[3 * x0 + ic], b = r0[3 * x1 + ic], cc = r1[3 * x0 + ic], d = r1[3 * x1 + ic];
    float top = lerp_rn(a, b, wx), bot = lerp_rn(cc, d, wx);
    out[c * plane + o] = __fmul_rn(__fsub_rn(lerp_rn(top, bot, wy), f.mean[c]), f.inv_std[c]);
  }
}

/* One plane of a rotation by a quarter turn (or a half): thread (x, y) is
 * destination element (x, y) of a dw x dh plane, read from the source
 * element that lands there; es bytes per element (1: gray, luma or a
 * yuv420p chroma plane; 2: nv12's Cb,Cr pairs; 3: rgb24/bgr24 pixels; 4: a
 * float plane). Writes are coalesced, reads strided (through the cache). */
__global__ void rotate_plane_kernel(const uint8_t *src, int64_t ss, uint8_t *dst, int64_t ds, int32_t dw, int32_t dh,
                                    int32_t es, int32_t deg) {
  int32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= dw || y >= dh)
    return;
  /* the inverse of spn_image_rotate's (x, y) -> (nx, ny) */
  int32_t sx, sy;
  if (deg == 90) { /* nx = ph - 1 - y, ny = x */
    sx = y;
    sy = dw - 1 - x;
  } else if (deg == 180) {
    sx = dw - 1 - x;
    sy = dh - 1 - y;
  } else { /* 270: nx = y, ny = pw - 1 - x */
    sx = dh - 1 - y;
    sy = x;
  }
  const uint8_t *s = src + sy * ss + (int64_t)sx * es;
  uint8_t *d = dst + y * ds + (int64_t)x * es;
  for (int32_t i = 0; i < es; i++)
    d[i] = s[i];
}

/* Bytes per element of plane p (spn_image_alloc's layout). */
int32_t plane_elem(int32_t f, int32_t p) {
  switch (f) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24: return 3;
  case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P: case SPN_PIXFMT_GRAYF32: return 4;
  case SPN_PIXFMT_NV12: return p == 1 ? 2 : 1;
  default: return 1;
  }
}

int32_t plane_count(int32_t f) {
  switch (f) {
  case SPN_PIXFMT_NV12: return 2;
  case SPN_PIXFMT_YUV420P: case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P: return 3;
  default: return 1;
  }
}

dim3 grid_for(int32_t w, int32_t h, dim3 block) {
  return dim3((unsigned)((w + (int32_t)block.x - 1) / (int32_t)block.x),
              (unsigned)((h + (int32_t)block.y - 1) / (int32_t)block.y));
}

const dim3 k_block(32, 8);

/* A resize's arguments (the formats spn_image_resize takes). */
int32_t check_resize(const spn_image_t *src, const spn_image_t *dst, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "resize source", err)) || (rc = check(dst, "resize destination", err)))
    return rc;
  if (src->format != dst->format || !(is_u8_packed(src->format) || is_float_planar(src->format)))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: resize from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  return SPN_OK;
}

} // namespace

extern "C" int32_t spn_cuda_resize_bilinear(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream,
                                            spn_error_t *err) {
  int32_t rc = check_resize(src, dst, err);
  if (rc)
    return rc;
  resize_bilinear_kernel<<<grid_for(dst->width, dst->height, k_block), k_block, 0, stream>>>(describe(src),
                                                                                             describe(dst));
  return launched("resize_bilinear", err);
}

extern "C" int32_t spn_cuda_resize_cubic(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream,
                                         spn_error_t *err) {
  int32_t rc = check_resize(src, dst, err);
  if (rc)
    return rc;
  resize_cubic_kernel<<<grid_for(dst->width, dst->height, k_block), k_block, 0, stream>>>(describe(src), describe(dst));
  return launched("resize_cubic", err);
}

extern "C" int32_t spn_cuda_to_float(const spn_image_t *src, spn_image_t *dst, const float mean[3],
                                     const float scale[3], cudaStream_t stream, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "to_float source", err)) || (rc = check(dst, "to_float destination", err)))
    return rc;
  if (src->width != dst->width || src->height != dst->height)
    return spn_error_set(err, SPN_EINVAL, "cuda image: to_float: sizes differ (%dx%d vs %dx%d)", (int)src->width,
                         (int)src->height, (int)dst->width, (int)dst->height);
  if (!is_rgb_u8(src->format) || (dst->format != SPN_PIXFMT_RGBF32P && dst->format != SPN_PIXFMT_BGRF32P))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: to_float from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  float m[3], s[3];
  norm_params(mean, scale, m, s);
  to_float_kernel<<<grid_for(dst->width, dst->height, k_block), k_block, 0, stream>>>(
      describe(src), describe(dst), m[0], m[1], m[2], s[0], s[1], s[2]);
  return launched("to_float", err);
}

extern "C" int32_t spn_cuda_yuv420_to_rgb(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream,
                                          spn_error_t *err) {
  return spn_cuda_yuv420_to_rgb_colour(src, dst, NULL, stream, err);
}

extern "C" int32_t spn_cuda_yuv420_to_rgb_colour(const spn_image_t *src, spn_image_t *dst, const spn_colour_t *colour,
                                                 cudaStream_t stream, spn_error_t *err) {
  int32_t rc;
  spn_yuv_coeffs_t k = {};
  if ((rc = check(src, "yuv420_to_rgb source", err)) || (rc = check(dst, "yuv420_to_rgb destination", err)))
    return rc;
  if ((rc = spn_colour_coeffs(colour, &k, err)))
    return spn_error_prefix(err, "cuda image: yuv420_to_rgb");
  if (src->width != dst->width || src->height != dst->height)
    return spn_error_set(err, SPN_EINVAL, "cuda image: yuv420_to_rgb: sizes differ (%dx%d vs %dx%d)",
                         (int)src->width, (int)src->height, (int)dst->width, (int)dst->height);
  if ((src->format != SPN_PIXFMT_NV12 && src->format != SPN_PIXFMT_YUV420P) || !is_rgb_u8(dst->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: conversion from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  if (!src->data[1] || (src->format == SPN_PIXFMT_YUV420P && !src->data[2]))
    return spn_error_set(err, SPN_EINVAL, "cuda image: %s source lacks its chroma planes",
                         spn_pixfmt_name(src->format));
  yuv420_to_rgb_kernel<<<grid_for(dst->width, dst->height, k_block), k_block, 0, stream>>>(describe(src),
                                                                                           describe(dst), k);
  return launched("yuv420_to_rgb", err);
}

extern "C" int32_t spn_cuda_paste(spn_image_t *dst, const spn_image_t *src, int32_t x, int32_t y,
                                  const spn_image_t *mask, cudaStream_t stream, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "paste source", err)) || (rc = check(dst, "paste destination", err)))
    return rc;
  img_desc s = describe(src), d = describe(dst), m = {};
  bool ok = (s.u8 && d.u8) || (is_float_planar(src->format) && is_float_planar(dst->format));
  if (!ok || s.nc != d.nc)
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: paste of %s onto %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  if (mask) {
    if ((rc = check(mask, "paste mask", err)))
      return rc;
    if (mask->format != SPN_PIXFMT_GRAYF32 || mask->width != src->width || mask->height != src->height)
      return spn_error_set(err, SPN_EINVAL, "cuda image: paste mask must be grayf32 %dx%d", (int)src->width,
                           (int)src->height);
    m = describe(mask);
  }
  bool swap = (src->format == SPN_PIXFMT_RGB24 && dst->format == SPN_PIXFMT_BGR24) ||
              (src->format == SPN_PIXFMT_BGR24 && dst->format == SPN_PIXFMT_RGB24) ||
              (src->format == SPN_PIXFMT_RGBF32P && dst->format == SPN_PIXFMT_BGRF32P) ||
              (src->format == SPN_PIXFMT_BGRF32P && dst->format == SPN_PIXFMT_RGBF32P);
  /* The source rectangle that lands inside dst (64-bit: x + width may overflow). */
  int64_t sx0 = x < 0 ? -(int64_t)x : 0, sy0 = y < 0 ? -(int64_t)y : 0;
  int64_t sx1 = (int64_t)dst->width - x, sy1 = (int64_t)dst->height - y;
  if (sx1 > src->width)
    sx1 = src->width;
  if (sy1 > src->height)
    sy1 = src->height;
  if (sx1 <= sx0 || sy1 <= sy0)
    return SPN_OK; /* nothing overlaps */
  int32_t w = (int32_t)(sx1 - sx0), h = (int32_t)(sy1 - sy0);
  paste_kernel<<<grid_for(w, h, k_block), k_block, 0, stream>>>(d, s, m, mask != NULL, x, y, (int32_t)sx0,
                                                                (int32_t)sy0, w, h, swap);
  return launched("paste", err);
}

extern "C" int32_t spn_cuda_from_float(const spn_image_t *src, spn_image_t *dst, const float mean[3],
                                       const float scale[3], cudaStream_t stream, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "from_float source", err)) || (rc = check(dst, "from_float destination", err)))
    return rc;
  if (src->width != dst->width || src->height != dst->height)
    return spn_error_set(err, SPN_EINVAL, "cuda image: from_float: sizes differ (%dx%d vs %dx%d)", (int)src->width,
                         (int)src->height, (int)dst->width, (int)dst->height);
  if (!is_rgb_u8(dst->format) || (src->format != SPN_PIXFMT_RGBF32P && src->format != SPN_PIXFMT_BGRF32P))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: from_float from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  float m[3], s[3];
  norm_params(mean, scale, m, s);
  if (s[0] == 0.0f || s[1] == 0.0f || s[2] == 0.0f)
    return spn_error_set(err, SPN_EINVAL, "cuda image: from_float with a zero scale");
  from_float_kernel<<<grid_for(dst->width, dst->height, k_block), k_block, 0, stream>>>(
      describe(src), describe(dst), m[0], m[1], m[2], s[0], s[1], s[2]);
  return launched("from_float", err);
}

extern "C" int32_t spn_cuda_feather_mask(spn_image_t *mask, float feather, cudaStream_t stream, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(mask, "mask", err)))
    return rc;
  if (mask->format != SPN_PIXFMT_GRAYF32)
    return spn_error_set(err, SPN_EINVAL, "cuda image: a mask must be grayf32, not %s", spn_pixfmt_name(mask->format));
  feather_mask_kernel<<<grid_for(mask->width, mask->height, k_block), k_block, 0, stream>>>(describe(mask), feather);
  return launched("feather_mask", err);
}

extern "C" int32_t spn_cuda_fit_normalize(const spn_image_t *src, float *out, int32_t in_w, int32_t in_h,
                                          int32_t rx, int32_t ry, int32_t rw, int32_t rh, const float mean[3],
                                          const float inv_std[3], int32_t swap, cudaStream_t stream,
                                          spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "fit_normalize source", err)))
    return rc;
  if (!is_rgb_u8(src->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: fit_normalize from %s is not supported",
                         spn_pixfmt_name(src->format));
  if (!out || in_w <= 0 || in_h <= 0 || rw <= 0 || rh <= 0 || rx < 0 || ry < 0 || rx + rw > in_w || ry + rh > in_h)
    return spn_error_set(err, SPN_EINVAL, "cuda image: fit_normalize: rectangle %dx%d+%d+%d outside the %dx%d input",
                         (int)rw, (int)rh, (int)rx, (int)ry, (int)in_w, (int)in_h);
  fit_desc f;
  f.rx = rx;
  f.ry = ry;
  f.rw = rw;
  f.rh = rh;
  norm_params(mean, inv_std, f.mean, f.inv_std);
  f.swap = swap;
  fit_normalize_kernel<<<grid_for(in_w, in_h, k_block), k_block, 0, stream>>>(describe(src), out, in_w, in_h, f);
  return launched("fit_normalize", err);
}

extern "C" int32_t spn_cuda_unit_to_u8(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream,
                                       spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "unit_to_u8 source", err)) || (rc = check(dst, "unit_to_u8 destination", err)))
    return rc;
  if (src->width != dst->width || src->height != dst->height)
    return spn_error_set(err, SPN_EINVAL, "cuda image: unit_to_u8: sizes differ (%dx%d vs %dx%d)", (int)src->width,
                         (int)src->height, (int)dst->width, (int)dst->height);
  if (!is_rgb_u8(dst->format) || (src->format != SPN_PIXFMT_RGBF32P && src->format != SPN_PIXFMT_BGRF32P))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: unit_to_u8 from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  unit_to_u8_kernel<<<grid_for(dst->width, dst->height, k_block), k_block, 0, stream>>>(describe(src), describe(dst));
  return launched("unit_to_u8", err);
}

extern "C" int32_t spn_cuda_rotate(const spn_image_t *src, spn_image_t *dst, int32_t degrees_cw, cudaStream_t stream,
                                   spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "rotate source", err)) || (rc = check(dst, "rotate destination", err)))
    return rc;
  int32_t deg = ((degrees_cw % 360) + 360) % 360;
  if (deg % 90)
    return spn_error_set(err, SPN_EINVAL, "cuda image: rotation by %d degrees (only multiples of 90)", (int)degrees_cw);
  if (src->format != dst->format)
    return spn_error_set(err, SPN_EINVAL, "cuda image: rotate between %s and %s", spn_pixfmt_name(src->format),
                         spn_pixfmt_name(dst->format));
  switch (src->format) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24: case SPN_PIXFMT_GRAY8: case SPN_PIXFMT_RGBF32P:
  case SPN_PIXFMT_BGRF32P: case SPN_PIXFMT_GRAYF32: case SPN_PIXFMT_NV12: case SPN_PIXFMT_YUV420P:
    break;
  default:
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: rotate of %s is not supported",
                         spn_pixfmt_name(src->format));
  }
  bool quarter = deg == 90 || deg == 270;
  int32_t ew = quarter ? src->height : src->width, eh = quarter ? src->width : src->height;
  if (dst->width != ew || dst->height != eh)
    return spn_error_set(err, SPN_EINVAL, "cuda image: rotate by %d needs a %dx%d destination (got %dx%d)", (int)deg,
                         (int)ew, (int)eh, (int)dst->width, (int)dst->height);
  bool yuv = src->format == SPN_PIXFMT_NV12 || src->format == SPN_PIXFMT_YUV420P;
  if (quarter && yuv && ((src->width | src->height) & 1))
    return spn_error_set(err, SPN_EINVAL, "cuda image: rotating 4:2:0 by %d needs even sizes (got %dx%d)", (int)deg,
                         (int)src->width, (int)src->height);
  int32_t np = plane_count(src->format);
  for (int32_t p = 0; p < np; p++)
    if (!src->data[p] || !dst->data[p])
      return spn_error_set(err, SPN_EINVAL, "cuda image: rotate: %s plane %d has no data",
                           spn_pixfmt_name(src->format), (int)p);
  for (int32_t p = 0; p < np; p++) {
    int32_t pw = 0, ph = 0, dw = 0, dh = 0;
    spn_pixfmt_plane_size(src->format, src->width, src->height, p, &pw, &ph);
    spn_pixfmt_plane_size(dst->format, dst->width, dst->height, p, &dw, &dh);
    int32_t es = plane_elem(src->format, p);
    if (deg == 0) { /* a copy */
      cudaError_t ce = cudaMemcpy2DAsync(dst->data[p], (size_t)dst->stride[p], src->data[p], (size_t)src->stride[p],
                                         (size_t)pw * (size_t)es, (size_t)ph, cudaMemcpyDeviceToDevice, stream);
      if (ce != cudaSuccess)
        return spn_error_set(err, SPN_ECUDA, "cuda image: rotate by 0: copying plane %d: %s (%s)", (int)p,
                             cudaGetErrorString(ce), cudaGetErrorName(ce));
      continue;
    }
    rotate_plane_kernel<<<grid_for(dw, dh, k_block), k_block, 0, stream>>>(src->data[p], src->stride[p], dst->data[p],
                                                                          dst->stride[p], dw, dh, es, deg);
    if ((rc = launched("rotate", err)))
      return rc;
  }
  return SPN_OK;
}

/* The tiles a call is given: 1..SPN_CUDA_TILES of them, each rectangle
 * inside its block, each block inside a w x h frame. */
static int32_t tiles_check(const spn_cuda_tiles_t *t, int32_t P, int32_t Q, int32_t w, int32_t h, const char *op,
                           spn_error_t *err) {
  if (!t || t->n < 1 || t->n > SPN_CUDA_TILES || P < 1 || Q < 1)
    return spn_error_set(err, SPN_EINVAL, "cuda image: %s: %d tiles of %dx%d (1..%d tiles, blocks not empty)", op,
                         t ? (int)t->n : 0, (int)Q, (int)P, SPN_CUDA_TILES);
  for (int32_t i = 0; i < t->n; i++)
    if (t->bx[i] < 0 || t->by[i] < 0 || t->bx[i] + Q > w || t->by[i] + P > h || t->x0[i] < t->bx[i] ||
        t->y0[i] < t->by[i] || t->x1[i] > t->bx[i] + Q || t->y1[i] > t->by[i] + P || t->x1[i] <= t->x0[i] ||
        t->y1[i] <= t->y0[i])
      return spn_error_set(err, SPN_EINVAL,
                           "cuda image: %s: tile %d ([%d, %d) x [%d, %d), block at (%d, %d)) does not fit a %dx%d "
                           "block inside the %dx%d frame",
                           op, (int)i, (int)t->x0[i], (int)t->x1[i], (int)t->y0[i], (int)t->y1[i], (int)t->bx[i],
                           (int)t->by[i], (int)Q, (int)P, (int)w, (int)h);
  return SPN_OK;
}

extern "C" int32_t spn_cuda_tiles_cut(const spn_image_t *src, const spn_cuda_tiles_t *t, int32_t P, int32_t Q,
                                      float scale, float *dst, cudaStream_t stream, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(src, "tiles_cut source", err)))
    return rc;
  if (!is_rgb_u8(src->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: tiles_cut from %s is not supported",
                         spn_pixfmt_name(src->format));
  if (!dst)
    return spn_error_set(err, SPN_EINVAL, "cuda image: tiles_cut: no destination");
  if ((rc = tiles_check(t, P, Q, src->width, src->height, "tiles_cut", err)))
    return rc;
  dim3 g = grid_for(Q, P, k_block);
  g.z = (unsigned)t->n;
  tiles_cut_kernel<<<g, k_block, 0, stream>>>(describe(src), *t, P, Q, scale, dst);
  return launched("tiles_cut", err);
}

extern "C" int32_t spn_cuda_tiles_stitch(const float *src, int32_t P, int32_t Q, int32_t s, const spn_cuda_tiles_t *t,
                                         spn_image_t *dst, cudaStream_t stream, spn_error_t *err) {
  int32_t rc;
  if ((rc = check(dst, "tiles_stitch destination", err)))
    return rc;
  if (!is_rgb_u8(dst->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "cuda image: tiles_stitch to %s is not supported",
                         spn_pixfmt_name(dst->format));
  if (!src || s < 1 || dst->width % s || dst->height % s)
    return spn_error_set(err, SPN_EINVAL, "cuda image: tiles_stitch: no source, or a %dx%d frame is not %d times one",
                         (int)dst->width, (int)dst->height, (int)s);
  if ((rc = tiles_check(t, P, Q, dst->width / s, dst->height / s, "tiles_stitch", err)))
    return rc;
  int32_t mw = 1, mh = 1;
  for (int32_t i = 0; i < t->n; i++) {
    mw = (t->x1[i] - t->x0[i]) * s > mw ? (t->x1[i] - t->x0[i]) * s : mw;
    mh = (t->y1[i] - t->y0[i]) * s > mh ? (t->y1[i] - t->y0[i]) * s : mh;
  }
  dim3 g = grid_for(mw, mh, k_block);
  g.z = (unsigned)t->n;
  tiles_stitch_kernel<<<g, k_block, 0, stream>>>(src, P, Q, s, *t, describe(dst));
  return launched("tiles_stitch", err);
}
