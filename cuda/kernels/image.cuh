/* cuda/kernels/image.cuh — GPU twins of the spindle/image.h frame operations.
 *
 * Each function launches on `stream` and returns at once (no sync); images
 * are spn_image_t views whose plane pointers are device memory (or managed /
 * mapped memory the device can read). Conventions — pixel centres, rounding
 * (nearest, ties away from zero, then saturate), BT.601 limited-range colour,
 * planar (C,H,W) float layout — are those of core/image/image.c, the CPU
 * reference each kernel is tested against in tests/gpu/test-cuda-image.c.
 *
 * Argument errors (format, size) are reported before any launch as SPN_EINVAL
 * / SPN_EUNSUPPORTED naming the operation; launch failures as SPN_ECUDA.
 * Plain C declarations: C callers (stages, tests) include this header too.
 * Built into the PIC static library spn-cuda-kernels, linked by the stages
 * that use it (like spn-image, it needs no libspindle symbol).
 * Ownership: every image is borrowed; nothing is allocated.
 * Thread: any thread that has made the stream's device current. */
#ifndef SPINDLE_CUDA_KERNELS_IMAGE_CUH
#define SPINDLE_CUDA_KERNELS_IMAGE_CUH

#include <cuda_runtime_api.h>

#include "spindle/image.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA runtime call's result as a status: SPN_OK, or SPN_ECUDA with
 * "who: what: CUDA's message (its name)" (who NULL: no prefix). For the
 * stages' own copies and waits around the kernels. */
static inline int32_t spn_cuda_status(cudaError_t ce, const char *who, const char *what, spn_error_t *err) {
  if (ce == cudaSuccess)
    return SPN_OK;
  return spn_error_set(err, SPN_ECUDA, "%s%s%s: %s (%s)", who ? who : "", who ? ": " : "", what,
                       cudaGetErrorString(ce), cudaGetErrorName(ce));
}

/* Bilinear resize (spn_image_resize with SPN_INTERP_BILINEAR): src and dst of
 * the same format, one of RGB24, BGR24, GRAY8, RGBF32P, BGRF32P, GRAYF32;
 * dst's size is the target. */
int32_t spn_cuda_resize_bilinear(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream, spn_error_t *err);
/* Bicubic resize (spn_image_resize with SPN_INTERP_CUBIC), the same formats. */
int32_t spn_cuda_resize_cubic(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream, spn_error_t *err);

/* u8 RGB24/BGR24 (H,W,C) → planar float RGBF32P/BGRF32P (C,H,W) with
 * dst[c] = (src[c'] - mean[c]) * scale[c] (spn_image_to_float): channels are
 * swapped when the orders differ. mean/scale NULL mean 0 and 1. */
int32_t spn_cuda_to_float(const spn_image_t *src, spn_image_t *dst, const float mean[3], const float scale[3],
                          cudaStream_t stream, spn_error_t *err);

/* NV12 or YUV420P → RGB24/BGR24 of the same size (spn_image_convert:
 * chroma interpolated at MPEG-2's siting, the same integers). */
int32_t spn_cuda_yuv420_to_rgb(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream, spn_error_t *err);
/* The same from the matrix and range *colour gives (NULL: BT.601 limited):
 * the twin of spn_image_convert_colour. An unknown matrix is SPN_EINVAL
 * before any launch. */
int32_t spn_cuda_yuv420_to_rgb_colour(const spn_image_t *src, spn_image_t *dst, const spn_colour_t *colour,
                                      cudaStream_t stream, spn_error_t *err);

/* Blend src onto dst at (x, y) with an optional GRAYF32 mask the size of src
 * (spn_image_paste): dst = round(a src + (1 - a) dst), a clamped to [0,1];
 * parts outside dst are skipped; RGB↔BGR pastes swap channels. Formats: both
 * u8 packed or both planar float, same channel count. */
int32_t spn_cuda_paste(spn_image_t *dst, const spn_image_t *src, int32_t x, int32_t y, const spn_image_t *mask,
                       cudaStream_t stream, spn_error_t *err);

/* planar float RGBF32P/BGRF32P → u8 RGB24/BGR24 of the same size with
 * u8 = round(v / scale[c] + mean[c]) saturated (spn_image_from_float). */
int32_t spn_cuda_from_float(const spn_image_t *src, spn_image_t *dst, const float mean[3], const float scale[3],
                            cudaStream_t stream, spn_error_t *err);

/* A network's planar float output in 0..1 (RGBF32P/BGRF32P) → u8
 * RGB24/BGR24: round(clamp(v * 255, 0, 255)), NaN as 0 — what superres and
 * lipsync do on the CPU (multiplying: from_float's division by 1/255 would
 * round a few halves the other way). */
int32_t spn_cuda_unit_to_u8(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream, spn_error_t *err);

/* A GRAYF32 blend mask ramping from 0 at the edges to 1 over `feather`
 * pixels (spn_image_feather_mask). */
int32_t spn_cuda_feather_mask(spn_image_t *mask, float feather, cudaStream_t stream, spn_error_t *err);

/* Rotation by a multiple of 90 degrees clockwise (spn_image_rotate's twin,
 * equal to it byte for byte): src and dst of the same format, one of
 * RGB24, BGR24, GRAY8, RGBF32P, BGRF32P, GRAYF32, NV12, YUV420P; dst is
 * src's size turned (width and height swapped for 90 and 270); 4:2:0 turned
 * by a quarter needs even sizes. 0 copies. */
int32_t spn_cuda_rotate(const spn_image_t *src, spn_image_t *dst, int32_t degrees_cw, cudaStream_t stream,
                        spn_error_t *err);

/* A detector's input: `out` is (3, in_h, in_w) float, the u8 RGB24/BGR24
 * src resized bilinearly into the rectangle (rx, ry, rw, rh) with the face
 * detectors' sampling rules (stages/vision/facedet.c's
 * spn_facedet_preprocess, its CPU twin), the rest padded with what a black
 * pixel becomes; every value (v - mean[c]) * inv_std[c], output channel c
 * reading image channel 2 - c when swap is set. */
int32_t spn_cuda_fit_normalize(const spn_image_t *src, float *out, int32_t in_w, int32_t in_h, int32_t rx,
                               int32_t ry, int32_t rw, int32_t rh, const float mean[3], const float inv_std[3],
                               int32_t swap, cudaStream_t stream, spn_error_t *err);

/* Tiles of a frame for a model that sees same-size blocks (superres on the
 * GPU, stage-superres.c's gpu_upscale): tile i's own rectangle [x0, x1) x
 * [y0, y1) of the source and the corner (bx, by) of the P x Q block the
 * model sees for it. At most SPN_CUDA_TILES tiles a call. */
#define SPN_CUDA_TILES 64
typedef struct spn_cuda_tiles {
  int32_t n;
  int32_t bx[SPN_CUDA_TILES], by[SPN_CUDA_TILES];
  int32_t x0[SPN_CUDA_TILES], y0[SPN_CUDA_TILES], x1[SPN_CUDA_TILES], y1[SPN_CUDA_TILES];
} spn_cuda_tiles_t;

/* Cut: the u8 RGB24/BGR24 src's block of each tile into dst, a batch of
 * (n, 3, P, Q) float RGB planes, each value u8 * scale — what
 * spn_cuda_to_float (mean 0) of the whole frame then a copy of each block
 * gives, in one launch. Every block must lie inside src. */
int32_t spn_cuda_tiles_cut(const spn_image_t *src, const spn_cuda_tiles_t *t, int32_t P, int32_t Q, float scale,
                           float *dst, cudaStream_t stream, spn_error_t *err);

/* Stitch: the model's (n, 3, P s, Q s) float RGB output in 0..1, each
 * tile's own part (its rectangle times s, read at its block's corner times
 * s) into the u8 RGB24/BGR24 dst (s times the source's size) as
 * spn_cuda_unit_to_u8 writes it — the float frame and its conversion
 * without the float frame, in one launch. */
int32_t spn_cuda_tiles_stitch(const float *src, int32_t P, int32_t Q, int32_t s, const spn_cuda_tiles_t *t,
                              spn_image_t *dst, cudaStream_t stream, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
