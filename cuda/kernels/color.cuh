/* cuda/kernels/color.cuh — GPU twins of the colour conversions of
 * spn_image_convert (spindle/image.h) that the media stages need on a GPU:
 * RGB → 4:2:0 for the encoder, and between the two 4:2:0 layouts for
 * decode's nv12/yuv420p outputs. (4:2:0 → RGB is spn_cuda_yuv420_to_rgb in
 * image.cuh.)
 *
 * Same conventions as image.cuh: BT.601 limited range (or the matrix and
 * range a _colour variant is given) with the reference's
 * float arithmetic in the same order (no fused multiply-adds), 4:2:0 chroma
 * = mean of the Cb/Cr of the (up to four) pixels a sample covers, u8 results
 * rounded to nearest (ties away from zero) and saturated. Odd sizes have
 * chroma planes of ceil(w/2) x ceil(h/2). Images are spn_image_t views
 * whose plane pointers are device memory; any row pitch works.
 *
 * Argument errors (empty image, sizes that differ, an unsupported pair of
 * formats, a missing plane) are reported before any launch as SPN_EINVAL /
 * SPN_EUNSUPPORTED naming the operation and the formats; a failed launch as
 * SPN_ECUDA. Each call launches on `stream` and returns without waiting.
 * Ownership: every image is borrowed. Thread: any thread that has made the
 * stream's device current. Tested against core/image by
 * tests/gpu/test-cuda-color.c (and its argument checks, without a GPU, by
 * tests/gpu/test-cuda-color-args.c). */
#ifndef SPINDLE_CUDA_KERNELS_COLOR_CUH
#define SPINDLE_CUDA_KERNELS_COLOR_CUH

#include <cuda_runtime_api.h>

#include "spindle/image.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RGB24/BGR24 → YUV420P or NV12 of the same size (spn_image_convert). */
int32_t spn_cuda_rgb_to_yuv420(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream, spn_error_t *err);
/* The same in the matrix and range *colour gives (NULL: BT.601 limited, as
 * above): the twin of spn_image_convert_colour. An unknown matrix is
 * SPN_EINVAL before any launch. */
int32_t spn_cuda_rgb_to_yuv420_colour(const spn_image_t *src, spn_image_t *dst, const spn_colour_t *colour,
                                      cudaStream_t stream, spn_error_t *err);

/* NV12 ↔ YUV420P (or either to itself) of the same size: the luma plane
 * copied, the chroma samples moved between the interleaved and the planar
 * layout (spn_image_convert; lossless). */
int32_t spn_cuda_yuv420_repack(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream, spn_error_t *err);

/* 4:2:0 above 8 bits as NVDEC gives it (P010 for 10-bit streams, P016 for
 * 12-bit: a luma plane, then interleaved Cb,Cr pairs at half size, 16-bit
 * little-endian samples holding the value in their high bits) → 8-bit NV12
 * or YUV420P of dst's size: each sample rounded to its top 8 bits, ties up,
 * saturated ((v + 128) >> 8). y16/uv16 and their pitches in bytes are the
 * source planes (device memory). The CPU decode rounds deeper samples the
 * same way (stages/media/media-decode.c), so both give the same bytes. */
int32_t spn_cuda_p016_to_yuv420(const void *y16, int64_t y_pitch, const void *uv16, int64_t uv_pitch,
                                spn_image_t *dst, cudaStream_t stream, spn_error_t *err);

/* HDR 4:2:0 as NVDEC gives it → SDR RGB24/BGR24 of the same size: the GPU
 * twin of the CPU path's HDR frames (stages/media/media-tonemap.h; the
 * arithmetic is tonemap.h's, shared with it). `src` is the NV12 view of the
 * picture (device planes, any pitch); with deep = 1 they hold 16-bit
 * P010/P016 samples, read as 8-bit values with a fraction (v / 256: exact
 * for limited range at any depth), else NV12's bytes. Per pixel: its
 * samples (chroma of the sample that covers it, as spn_cuda_yuv420_to_rgb)
 * to R'G'B' in `colour`'s matrix and range (spn_colour_coeffs; NULL:
 * BT.601 limited; HDR video is BT.2020 limited), each rounded to 16 bits
 * (R' · 65535, as the CPU path's RGB48), then spn_tonemap_rgb48's steps
 * for `transfer` (SPN_TRANSFER_PQ or SPN_TRANSFER_HLG; anything else is
 * SPN_EINVAL before any launch). */
int32_t spn_cuda_hdr420_to_rgb(const spn_image_t *src, int32_t deep, const spn_colour_t *colour, int32_t transfer,
                               spn_image_t *dst, cudaStream_t stream, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
