/* media-cuda.h — the GPU side of decode and encode (built only with CUDA).
 *
 * Plain C over the CUDA runtime API, FFmpeg's CUDA hwcontext and the kernels
 * of cuda/kernels (color.cuh, image.cuh); no libspindle symbol. Linked into
 * the decode and encode stages of a CUDA build and into the gpu tests.
 *
 * Device memory is laid out as the stages emit frames (spn_image_wrap's
 * tight layout): (H,W,3) u8 rows for rgb24/bgr24, three (H,W) f32 planes for
 * rgbf32p/bgrf32p, and the planes of nv12/yuv420p back to back. Every call
 * queues its work on `stream` and returns without waiting, except where it
 * says otherwise; the caller synchronises (or records an event) before the
 * host reads a result or memory is released.
 * Thread: the thread whose current device is the stream's (a stage's GPU
 * executor). Every error message names the operation.
 */
#ifndef SPN_MEDIA_CUDA_H
#define SPN_MEDIA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "spindle/image.h"
#include "spindle/status.h"
#include "media-decode.h" /* spn_media_item_t */
#include "tonemap.h"      /* SPN_TRANSFER_PQ, SPN_TRANSFER_HLG */

#ifdef __cplusplus
extern "C" {
#endif

/* An FFmpeg CUDA device (an AVBufferRef * of AV_HWDEVICE_TYPE_CUDA, for
 * spn_decode_opts_t.hw_device) on the calling thread's current CUDA device:
 * its primary context, the one the CUDA runtime API uses, so NVDEC's frames
 * are device pointers the runtime's kernels and copies can use; and with
 * `stream` as its stream, so NVDEC's copy of each decoded picture is queued
 * on the stage's stream, ahead of the kernels that read it.
 *
 * Not av_hwdevice_ctx_create(AV_CUDA_USE_PRIMARY_CONTEXT): FFmpeg 5.1 wants
 * the primary context created with blocking-sync scheduling and refuses one
 * that is already active with other flags ("Primary context already active
 * with incompatible flags"), which the runtime's always is. Here the
 * primary context is retained through the driver API (reached with
 * cudaGetDriverEntryPoint*, so nothing links libcuda) and handed to FFmpeg,
 * and released when the last reference to the device goes.
 * Ownership: caller owns *out (av_buffer_unref, or spn_media_cuda_device_free). */
int32_t spn_media_cuda_device_new(cudaStream_t stream, void **out, spn_error_t *err);
void spn_media_cuda_device_free(void **dev);

/* A picture NVDEC keeps on the GPU, a decode item with hw_frame
 * (media-decode.h) → `dst`, device memory of the frame as the CPU path
 * gives it (its shown size, upright) in `pixfmt`. The item says what that
 * takes, and each step runs on `stream`:
 *   - image: the NV12 device view; with deep, its planes hold 16-bit
 *     P010/P016 samples, which are first rounded to 8 bits
 *     (spn_cuda_p016_to_yuv420);
 *   - colour: the samples' matrix and range: rgb24/bgr24 with
 *     spn_cuda_yuv420_to_rgb_colour, rgbf32p/bgrf32p through that RGB and
 *     spn_cuda_to_float, nv12/yuv420p with spn_cuda_yuv420_repack
 *     (lossless: the bytes the CPU path gives);
 *   - tone_map (SPN_TRANSFER_PQ or _HLG; RGB and float pixfmts): tone-mapped
 *     to SDR instead (spn_cuda_hdr420_to_rgb, on the samples as they are,
 *     16-bit ones too; the CPU path's twin);
 *   - show_w x show_h (RGB and float pixfmts; 0: the image's size): the
 *     RGB frame resampled to that size, square pixels (spn_cuda_resize_cubic,
 *     the twin of the CPU path's spn_image_resize SPN_INTERP_CUBIC);
 *   - rotation (0, 90, 180, 270): then turned clockwise (spn_cuda_rotate).
 * scratch: device memory of spn_media_cuda_item_scratch_size bytes, or NULL
 * when that is 0 (which it is also for an item this cannot convert: the
 * conversion then says why). */
size_t spn_media_cuda_item_scratch_size(const spn_media_item_t *it, int32_t pixfmt);
int32_t spn_media_cuda_from_item(const spn_media_item_t *it, int32_t pixfmt, void *dst, void *scratch,
                                 cudaStream_t stream, spn_error_t *err);

/* NVDEC's hand-over emulated, for tests (spn_decode_opts_t.emu_upload and
 * emu_free): `size` host bytes copied into new device memory (NULL: out of
 * memory, or the copy failed), and that memory freed. Synchronous. */
void *spn_media_cuda_emu_upload(const void *host, size_t size);
void spn_media_cuda_emu_free(void *opaque, uint8_t *data);

/* A tight `fmt` frame of width x height in device memory turned clockwise
 * by `rotation` (a multiple of 90) into `dst`, device memory of the turned
 * frame's tight size (spn_cuda_rotate: the bytes spn_image_rotate gives). */
int32_t spn_media_cuda_rotate(const void *src, int32_t fmt, int32_t width, int32_t height, int32_t rotation,
                              void *dst, cudaStream_t stream, spn_error_t *err);

/* A host image (any row pitch; what the CPU decode path gives) → `dst`,
 * device memory of its tight size: one cudaMemcpy2DAsync per plane. The
 * host rows may be freed once this returns (pageable copies are staged
 * before the call returns; pinned ones must outlive the copy). */
int32_t spn_media_cuda_upload(const spn_image_t *src, void *dst, cudaStream_t stream, spn_error_t *err);

/* Encode from device frames: a tight RGB24/BGR24 frame in device memory →
 * YUV420P in `colour` (spn_cuda_rgb_to_yuv420_colour, the twin of
 * spn_image_convert_colour; NULL: BT.601 limited) in
 * `yuv_dev` (device, width*height + 2*ceil(w/2)*ceil(h/2) bytes), then one
 * copy of those planes into `yuv_host` (pinned host memory of the same
 * size; NULL: no copy, the caller makes it, e.g. a counted host
 * buffer_copy). Returns once both are queued; the caller synchronises the
 * stream before the host reads yuv_host. */
int32_t spn_media_cuda_rgb_to_yuv420p_host(const void *rgb_dev, int32_t fmt, int32_t width, int32_t height,
                                           const spn_colour_t *colour, void *yuv_dev, void *yuv_host,
                                           cudaStream_t stream, spn_error_t *err);

/* NVENC from device frames: a tight frame of width x height in `fmt`
 * (rgb24/bgr24, rgbf32p/bgrf32p in [0, 255], nv12/yuv420p; device memory,
 * the stages' layout) → the encoder's NV12 planes `nv12` (device memory,
 * any pitch, e.g. spn_encoder_device_frame's view; its size may be the
 * frame's cropped to even, as the encoder crops). rgb24/bgr24 with
 * spn_cuda_rgb_to_yuv420_colour in `colour` (the twin of
 * spn_image_convert_colour; NULL: BT.601 limited), f32 through u8
 * RGB in `scratch` with spn_cuda_from_float (spn_image_from_float's twin),
 * 4:2:0 planes with spn_cuda_yuv420_repack (lossless). scratch: device
 * memory of spn_media_cuda_nv12_scratch_size bytes, or NULL when that is
 * 0. Nothing is copied to the host. */
size_t spn_media_cuda_nv12_scratch_size(int32_t fmt, int32_t width, int32_t height);
int32_t spn_media_cuda_to_nv12(const void *src_dev, int32_t fmt, int32_t width, int32_t height,
                               const spn_colour_t *colour, const spn_image_t *nv12, void *scratch,
                               cudaStream_t stream, spn_error_t *err);

/* One device → host copy of `size` bytes on `stream` (frames the encoder
 * takes as they are: nv12/yuv420p planes, f32 frames). */
int32_t spn_media_cuda_download(const void *src_dev, void *dst_host, size_t size, cudaStream_t stream,
                                spn_error_t *err);

/* Wait for `stream`. */
int32_t spn_media_cuda_sync(cudaStream_t stream, const char *what, spn_error_t *err);

/* Mark the point `stream` has reached (*ev: an event made on first use,
 * reused after); wait on the host until the stream has passed a mark (the
 * work queued after it may still run); free the mark. */
int32_t spn_media_cuda_mark(cudaStream_t stream, void **ev, spn_error_t *err);
int32_t spn_media_cuda_wait_mark(void *ev, const char *what, spn_error_t *err);
void spn_media_cuda_mark_free(void **ev);

#ifdef __cplusplus
}
#endif
#endif
