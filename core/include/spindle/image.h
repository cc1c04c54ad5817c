/* spindle/image.h — CPU frame operations: the numeric reference for images.
 *
 * The vision stages (face detect, lipsync, super-resolution) and the media
 * stages move frames between these layouts; the CUDA kernels under
 * cuda/kernels/ are checked against the functions here. Built as the PIC
 * static library `spn-image` that stages link into themselves: it uses no
 * libspindle symbol, only the header-inline helpers of spindle/status.h.
 *
 * An spn_image_t is a view: plane pointers, strides in bytes, size and
 * format. It owns memory only when spn_image_alloc() filled it (then
 * spn_image_release() frees it). Functions never allocate for the caller
 * except spn_image_alloc(); destinations are given already allocated with
 * the size they want (that size is the resize target).
 *
 * Conventions, fixed so that a CUDA twin can match them:
 * - Pixel centres are at integer + 0.5 (OpenCV's convention): a destination
 *   pixel dx samples the source at sx = (dx + 0.5) * src_w / dst_w - 0.5.
 * - u8 results are computed in float and rounded to nearest (ties away from
 *   zero), then saturated to [0, 255]. OpenCV computes INTER_LINEAR in 11-bit
 *   fixed point, so results agree with cv2.resize within ±1 (tested).
 * - Colour: BT.601, limited ("TV") range: Y in [16, 235], Cb/Cr in [16, 240].
 *     Y  =  16 + ( 65.481 R + 128.553 G +  24.966 B) / 255
 *     Cb = 128 + (-37.797 R -  74.203 G + 112.000 B) / 255
 *     Cr = 128 + (112.000 R -  93.786 G -  18.214 B) / 255
 *   and the exact inverse of that matrix for YUV → RGB (spn_image_convert;
 *   spn_image_convert_colour takes another matrix or full range, below, in
 *   the same arithmetic). 4:2:0 chroma is the
 *   mean of the Cb/Cr of the (up to) four pixels a chroma sample covers
 *   (centre siting). YUV → RGB upsamples chroma bilinearly at the siting of
 *   MPEG-2, H.264 and HEVC's default ("left": a chroma sample on the even
 *   columns, midway between its two rows): pixel (x, y) takes
 *   (3 (C[y/2][c0] + C[y/2][c1]) + C[y2][c0] + C[y2][c1]) / 8, where
 *   c0 = x/2, c1 = c0 + (x odd), y2 = y/2 - 1 for even y and y/2 + 1 for odd
 *   (edges repeated): the integer sum divided exactly, then the matrix.
 *   Odd sizes have chroma planes of ceil(w/2) × ceil(h/2).
 * - Planar float images (SPN_PIXFMT_RGBF32P / BGRF32P) hold (C,H,W) with one
 *   plane per channel: data[c] + y * stride[c] is row y of channel c.
 *
 * Thread: every function is reentrant; distinct images may be processed from
 * any number of threads.
 */
#ifndef SPINDLE_IMAGE_H
#define SPINDLE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spn_pixfmt {
  SPN_PIXFMT_NONE = 0,
  SPN_PIXFMT_RGB24 = 1,    /* packed u8 R,G,B */
  SPN_PIXFMT_BGR24 = 2,    /* packed u8 B,G,R (OpenCV's order) */
  SPN_PIXFMT_GRAY8 = 3,    /* one u8 plane */
  SPN_PIXFMT_RGBF32P = 4,  /* planar f32 (C,H,W), planes R,G,B */
  SPN_PIXFMT_BGRF32P = 5,  /* planar f32 (C,H,W), planes B,G,R */
  SPN_PIXFMT_NV12 = 6,     /* u8 Y plane + interleaved CbCr plane, 4:2:0 */
  SPN_PIXFMT_YUV420P = 7,  /* u8 Y, Cb, Cr planes, 4:2:0 */
  SPN_PIXFMT_GRAYF32 = 8,  /* one f32 plane (masks, alpha) */
} spn_pixfmt_t;

typedef struct spn_image {
  int32_t width;
  int32_t height;
  int32_t format;          /* spn_pixfmt_t */
  int32_t nplanes;
  uint8_t *data[4];        /* plane pointers */
  int64_t stride[4];       /* bytes from one row to the next, per plane */
  void *owned;             /* set by spn_image_alloc(); NULL for views */
} spn_image_t;

#define SPN_IMAGE_INIT {0, 0, 0, 0, {0}, {0}, NULL}

/* Name of a format ("rgb24", "nv12", ...) and back; unknown → "none" / 0. */
const char *spn_pixfmt_name(int32_t format);
int32_t spn_pixfmt_from_name(const char *name);

/* Number of planes, and the width/height in elements of plane p. */
int32_t spn_pixfmt_planes(int32_t format);
void spn_pixfmt_plane_size(int32_t format, int32_t w, int32_t h, int32_t p,
                           int32_t *pw, int32_t *ph);
/* Bytes of a w x h frame with tight rows and the planes back to back (what
 * spn_image_wrap lays out; 0 for an unknown format). */
size_t spn_pixfmt_tight_size(int32_t format, int32_t w, int32_t h);

/* Allocate a zeroed image with tight rows (each row 32-byte aligned).
 * Ownership: *img owns the buffer until spn_image_release(). Thread: any. */
int32_t spn_image_alloc(spn_image_t *img, int32_t width, int32_t height, int32_t format,
                        spn_error_t *err);
/* Free what spn_image_alloc() allocated and zero *img; views are only zeroed. */
void spn_image_release(spn_image_t *img);

/* Wrap caller memory (tight rows, planes back to back as FFmpeg lays out
 * 4:2:0 and planar float) into a view. Ownership: borrowed. */
int32_t spn_image_wrap(spn_image_t *img, void *data, int32_t width, int32_t height, int32_t format,
                       spn_error_t *err);

/* A view of the rectangle (x, y, w, h) of src; no copy. The rectangle must lie
 * inside src; for 4:2:0 formats x and y must be even. Ownership: borrows src. */
int32_t spn_image_crop(const spn_image_t *src, int32_t x, int32_t y, int32_t w, int32_t h,
                       spn_image_t *view, spn_error_t *err);

/* Copy pixels between images of the same format and size. */
int32_t spn_image_copy(const spn_image_t *src, spn_image_t *dst, spn_error_t *err);

typedef enum spn_interp {
  SPN_INTERP_BILINEAR = 0, /* cv2.INTER_LINEAR */
  SPN_INTERP_AREA = 1,     /* cv2.INTER_AREA when shrinking; bilinear when growing */
  SPN_INTERP_CUBIC = 2,    /* cv2.INTER_CUBIC */
} spn_interp_t;

/* Resize src into dst (dst's width/height are the target). Formats must match
 * and be one of RGB24, BGR24, GRAY8, RGBF32P, BGRF32P, GRAYF32.
 * AREA: each destination pixel is the mean of the source area it covers,
 * partial pixels weighted by the covered fraction (cv2.INTER_AREA); when an
 * axis grows, that axis is interpolated bilinearly instead (OpenCV uses its
 * own upscale weights there).
 * CUBIC: Keys' cubic with A = -0.75 at the bilinear positions, edges
 * replicated, as cv2.INTER_CUBIC: the four weights of a position computed
 * in double, then each pass sums w0 p0 + w1 p1 + w2 p2 + w3 p3 in float in
 * that order (u8 results rounded and saturated: the kernel overshoots).
 * OpenCV computes u8 in fixed point: within ±1 of it (tested). */
int32_t spn_image_resize(const spn_image_t *src, spn_image_t *dst, int32_t interp,
                         spn_error_t *err);

/* Colour conversion between same-size images:
 *   RGB24 <-> BGR24, RGB24/BGR24 -> GRAY8 (BT.601 luma 0.299/0.587/0.114,
 *   full range as cv2.COLOR_RGB2GRAY), RGB24/BGR24 <-> YUV420P/NV12,
 *   YUV420P <-> NV12, and any format to itself (copy). */
int32_t spn_image_convert(const spn_image_t *src, spn_image_t *dst, spn_error_t *err);

/* ---- YCbCr colour: which matrix and range 4:2:0 samples are in ----
 *
 * A video file says (or leaves unsaid) how its Y/Cb/Cr samples relate to
 * R,G,B: the matrix, by its ITU-T H.273 MatrixCoefficients code (the number
 * FFmpeg's AVColorSpace and the H.264/HEVC VUI carry), and the range
 * (limited: Y 16..235, Cb/Cr 16..240; full: 0..255). With Kr, Kb the
 * matrix's luma weights (BT.601 0.299/0.114, BT.709 0.2126/0.0722, BT.2020
 * 0.2627/0.0593, SMPTE 240M 0.212/0.087), Kg = 1 - Kr - Kb and R,G,B in
 * 0..255:
 *     Y  = yoff + (Sy Kr R + Sy Kg G + Sy Kb B) / 255
 *     Cb = 128 + Sc (B - Y') / (2 (1 - Kb)),  Cr = 128 + Sc (R - Y') / (2 (1 - Kr))
 * with yoff 16, Sy 219, Sc 224 for limited range and 0, 255, 255 for full
 * (Y' = the weighted sum / 255); the inverse is exact. BT.601 limited is
 * spn_image_convert's matrix above, with its coefficients as written there
 * (so the two give identical bytes). */
typedef enum spn_matrix {
  SPN_MATRIX_BT709 = 1,     /* HD */
  SPN_MATRIX_BT601 = 6,     /* SD (SMPTE 170M; BT.470BG, code 5, is the same matrix) */
  SPN_MATRIX_SMPTE240M = 7,
  SPN_MATRIX_BT2020 = 9,    /* BT.2020 non-constant luminance */
} spn_matrix_t;

typedef struct spn_colour {
  int32_t matrix;     /* spn_matrix_t (5, BT.470BG, is taken as 6) */
  int32_t full_range; /* 0: limited ("TV"), 1: full ("PC", JPEG) */
} spn_colour_t;

#define SPN_COLOUR_DEFAULT {SPN_MATRIX_BT601, 0} /* spn_image_convert's */

/* The matrix as float coefficients, in the form the CPU and CUDA
 * conversions use (both compute in this order, without fused
 * multiply-adds):
 *   Y  = yoff + (to_y[0] R + to_y[1] G + to_y[2] B) / 255, Cb and Cr the
 *        same with to_u / to_v and 128 for yoff;
 *   R  = ys (Y - yoff) + rv (Cr - 128)
 *   G  = ys (Y - yoff) - gu (Cb - 128) - gv (Cr - 128)
 *   B  = ys (Y - yoff) + bu (Cb - 128) */
typedef struct spn_yuv_coeffs {
  float yoff;
  float to_y[3], to_u[3], to_v[3];
  float ys, rv, gu, gv, bu;
} spn_yuv_coeffs_t;

/* Fill *k for *c (NULL: SPN_COLOUR_DEFAULT). An unknown matrix code is
 * SPN_EINVAL naming it. Inline, so that the CUDA kernels (which do not link
 * spn-image) compute the same floats. */
static inline int32_t spn_colour_coeffs(const spn_colour_t *c, spn_yuv_coeffs_t *k, spn_error_t *err) {
  int32_t m = c ? c->matrix : SPN_MATRIX_BT601, full = c ? c->full_range != 0 : 0;
  double kr, kb;
  switch (m) {
  case SPN_MATRIX_BT709: kr = 0.2126; kb = 0.0722; break;
  case 5: case SPN_MATRIX_BT601: kr = 0.299; kb = 0.114; break;
  case SPN_MATRIX_SMPTE240M: kr = 0.212; kb = 0.087; break;
  case SPN_MATRIX_BT2020: kr = 0.2627; kb = 0.0593; break;
  default: return spn_error_set(err, SPN_EINVAL, "image: colour matrix %d is not one of bt709 (1), bt601 (5, 6), "
                                "smpte240m (7), bt2020 (9)", (int)m);
  }
  double kg = 1.0 - kr - kb, sy = full ? 255.0 : 219.0, sc = full ? 255.0 : 224.0;
  double ub = 2.0 * (1.0 - kb), vr = 2.0 * (1.0 - kr), inv = 255.0 / sc;
  int lit = (m == 5 || m == SPN_MATRIX_BT601) && !full; /* spn_image_convert's, written out above */
  k->yoff = full ? 0.0f : 16.0f;
  k->to_y[0] = lit ? 65.481f : (float)(sy * kr);
  k->to_y[1] = lit ? 128.553f : (float)(sy * kg);
  k->to_y[2] = lit ? 24.966f : (float)(sy * kb);
  k->to_u[0] = lit ? -37.797f : (float)(-sc * kr / ub);
  k->to_u[1] = lit ? -74.203f : (float)(-sc * kg / ub);
  k->to_u[2] = lit ? 112.0f : (float)(sc / 2.0);
  k->to_v[0] = lit ? 112.0f : (float)(sc / 2.0);
  k->to_v[1] = lit ? -93.786f : (float)(-sc * kg / vr);
  k->to_v[2] = lit ? -18.214f : (float)(-sc * kb / vr);
  k->ys = lit ? 1.164384f : (float)(255.0 / sy);
  k->rv = lit ? 1.596027f : (float)(inv * vr);
  k->gu = lit ? 0.391762f : (float)(inv * ub * kb / kg);
  k->gv = lit ? 0.812968f : (float)(inv * vr * kr / kg);
  k->bu = lit ? 2.017232f : (float)(inv * ub);
  return SPN_OK;
}

/* "bt709", "bt601", "smpte240m", "bt2020"; "unknown" for anything else. */
const char *spn_matrix_name(int32_t matrix);
/* The matrix a name gives: the names above, "smpte170m" and "bt470bg"
 * (BT.601) and "bt2020nc" (FFmpeg's names); 0 for anything else. */
int32_t spn_matrix_from_name(const char *name);

/* spn_image_convert with the 4:2:0 side in colour *c (NULL: the default):
 * RGB24/BGR24 <-> YUV420P/NV12 use that matrix and range; every other
 * pair converts as spn_image_convert does. */
int32_t spn_image_convert_colour(const spn_image_t *src, spn_image_t *dst, const spn_colour_t *c,
                                 spn_error_t *err);

/* u8 RGB24/BGR24 (H,W,C) → planar float RGBF32P/BGRF32P (C,H,W):
 *   dst[c][y][x] = (src channel c of pixel (x, y) - mean[c]) * scale[c]
 * where c indexes the destination's channel order (R,G,B or B,G,R); the
 * source is reordered as needed. mean/scale NULL mean 0 and 1. */
int32_t spn_image_to_float(const spn_image_t *src, spn_image_t *dst, const float mean[3],
                           const float scale[3], spn_error_t *err);
/* The inverse: u8 = round(v / scale[c] + mean[c]) saturated, channel order
 * converted as needed. */
int32_t spn_image_from_float(const spn_image_t *src, spn_image_t *dst, const float mean[3],
                             const float scale[3], spn_error_t *err);

typedef enum spn_border {
  SPN_BORDER_CONSTANT = 0, /* taps outside the image read `border_value` */
  SPN_BORDER_REPLICATE = 1 /* taps outside are clamped to the nearest edge */
} spn_border_t;

#define SPN_WARP_INVERSE_MAP 1u

/* Affine warp with bilinear sampling (cv2.warpAffine, INTER_LINEAR).
 * m is the 2×3 row-major matrix [a b c; d e f]. By default it maps source to
 * destination coordinates and is inverted here; with SPN_WARP_INVERSE_MAP it
 * maps destination to source: dst(x, y) = src(a x + b y + c, d x + e y + f).
 * Each of the four bilinear taps that falls outside src takes the border
 * value (CONSTANT) or the nearest edge pixel (REPLICATE). Positions are exact
 * (OpenCV quantises them to 1/32 pixel, so it differs on sharp edges).
 * Formats: RGB24, BGR24, GRAY8, RGBF32P, BGRF32P, GRAYF32; border_value[c]
 * is per channel in the image's own order (NULL = zeros). */
int32_t spn_image_warp_affine(const spn_image_t *src, spn_image_t *dst, const double m[6],
                              uint32_t flags, int32_t border, const double border_value[4],
                              spn_error_t *err);

/* Invert a 2×3 affine matrix. Returns SPN_EINVAL if it is singular. */
int32_t spn_affine_invert(const double m[6], double inv[6], spn_error_t *err);

/* Fill a GRAYF32 mask with a feathered rectangle: alpha(x, y) = ax * ay with
 *   ax = clamp(min(x + 0.5, w - x - 0.5) / feather, 0, 1)   (same for y),
 * i.e. 1 inside, falling linearly to 0 over `feather` pixels at each edge.
 * feather <= 0 gives a hard mask of ones. */
int32_t spn_image_feather_mask(spn_image_t *mask, float feather, spn_error_t *err);

/* Blend src onto dst with its top-left corner at (x, y):
 *   dst = round(alpha * src + (1 - alpha) * dst)
 * alpha from `mask` (GRAYF32, same size as src, values clamped to [0,1]) or 1
 * when mask is NULL. Parts outside dst are skipped. Formats: src and dst both
 * RGB24, BGR24, GRAY8 (u8; rounded) or both RGBF32P/BGRF32P/GRAYF32 (float,
 * not rounded), same channel count. */
int32_t spn_image_paste(spn_image_t *dst, const spn_image_t *src, int32_t x, int32_t y,
                        const spn_image_t *mask, spn_error_t *err);

/* Rotate clockwise by 0, 90, 180 or 270 degrees into dst (whose size must be
 * the rotated size). Any format; 4:2:0 sizes must be even for 90/270. */
int32_t spn_image_rotate(const spn_image_t *src, spn_image_t *dst, int32_t degrees_cw,
                         spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
