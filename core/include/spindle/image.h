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
 *   and the exact inverse of that matrix for YUV → RGB. 4:2:0 chroma is the
 *   mean of the Cb/Cr of the (up to) four pixels a chroma sample covers
 *   (centre siting); YUV → RGB repeats each chroma sample over its 2×2 block.
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
} spn_interp_t;

/* Resize src into dst (dst's width/height are the target). Formats must match
 * and be one of RGB24, BGR24, GRAY8, RGBF32P, BGRF32P, GRAYF32.
 * AREA: each destination pixel is the mean of the source area it covers,
 * partial pixels weighted by the covered fraction (cv2.INTER_AREA); when an
 * axis grows, that axis is interpolated bilinearly instead (OpenCV uses its
 * own upscale weights there). */
int32_t spn_image_resize(const spn_image_t *src, spn_image_t *dst, int32_t interp,
                         spn_error_t *err);

/* Colour conversion between same-size images:
 *   RGB24 <-> BGR24, RGB24/BGR24 -> GRAY8 (BT.601 luma 0.299/0.587/0.114,
 *   full range as cv2.COLOR_RGB2GRAY), RGB24/BGR24 <-> YUV420P/NV12,
 *   YUV420P <-> NV12, and any format to itself (copy). */
int32_t spn_image_convert(const spn_image_t *src, spn_image_t *dst, spn_error_t *err);

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
