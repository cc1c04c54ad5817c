/* wav2lip-cuda.c — the GPU twins of spn_w2l_prepare, spn_w2l_paste and
 * spn_w2l_mel_chunk (wav2lip.h), built into the lipsync plugin when the
 * build has CUDA.
 *
 * Each step is the same operation as on the CPU, through the twin kernels of
 * cuda/kernels/image.cuh: crop → 96×96 bilinear u8 → BGR float / 255 for the
 * reference half, its top rows copied and its bottom rows zeroed for the
 * masked half; the network output ×255 rounded to u8 → bilinear to the crop's
 * size → blended over the frame with the feathered mask. A batch's mel chunks
 * are cut from the jobs' spectrograms on the device (cuda/kernels/mel.cuh),
 * each window starting where spn_w2l_mel_start says, as on the CPU.
 * Everything is queued on the caller's stream; nothing waits.
 */
#include <cuda_runtime_api.h>
#include <math.h>

#include "image.cuh"
#include "mel.cuh"
#include "wav2lip.h"

static int32_t cu_ok(cudaError_t ce, const char *what, spn_error_t *err) {
  return spn_cuda_status(ce, "wav2lip", what, err);
}

static bool inside(const spn_image_t *f, const spn_w2l_rect_t *r) {
  return r->w > 0 && r->h > 0 && r->x >= 0 && r->y >= 0 && (int64_t)r->x + r->w <= f->width &&
         (int64_t)r->y + r->h <= f->height;
}

static int32_t check_frame(const spn_image_t *frame, const spn_w2l_rect_t *rect, spn_error_t *err) {
  if (!frame || frame->format != SPN_PIXFMT_RGB24)
    return spn_error_set(err, SPN_EINVAL, "wav2lip: the frame must be rgb24");
  if (!rect || !inside(frame, rect))
    return spn_error_set(err, SPN_EINVAL, "wav2lip: crop %dx%d at (%d,%d) is not inside the %dx%d frame",
                         rect ? rect->w : 0, rect ? rect->h : 0, rect ? rect->x : 0, rect ? rect->y : 0,
                         frame ? frame->width : 0, frame ? frame->height : 0);
  return SPN_OK;
}

int32_t spn_w2l_prepare_cuda(const spn_image_t *frame, const spn_w2l_rect_t *rect, float *face6, uint8_t *small,
                             void *stream, spn_error_t *err) {
  const int32_t S = SPN_W2L_SIZE;
  cudaStream_t s = (cudaStream_t)stream;
  spn_image_t view, sm, planar;
  int32_t rc = check_frame(frame, rect, err);
  if (rc != SPN_OK || (rc = spn_image_crop(frame, rect->x, rect->y, rect->w, rect->h, &view, err)) != SPN_OK ||
      (rc = spn_image_wrap(&sm, small, S, S, SPN_PIXFMT_RGB24, err)) != SPN_OK ||
      (rc = spn_image_wrap(&planar, face6 + 3 * S * S, S, S, SPN_PIXFMT_BGRF32P, err)) != SPN_OK)
    return rc;
  const float scale[3] = {1.0f / 255.0f, 1.0f / 255.0f, 1.0f / 255.0f};
  if ((rc = spn_cuda_resize_bilinear(&view, &sm, s, err)) != SPN_OK ||
      (rc = spn_cuda_to_float(&sm, &planar, NULL, scale, s, err)) != SPN_OK)
    return rc;
  /* The masked target: the three planes' top S/2 rows, then zeros — one 2-D
   * copy and one 2-D set over the planes (pitch: a plane). */
  size_t plane = (size_t)S * S * sizeof(float), top = (size_t)(S / 2) * S * sizeof(float);
  if ((rc = cu_ok(cudaMemcpy2DAsync(face6, plane, face6 + 3 * S * S, plane, top, 3, cudaMemcpyDeviceToDevice, s),
                  "masking the crop", err)) != SPN_OK)
    return rc;
  return cu_ok(cudaMemset2DAsync((char *)face6 + top, plane, 0, plane - top, 3, s), "masking the crop", err);
}

int32_t spn_w2l_paste_cuda(spn_image_t *frame, const spn_w2l_rect_t *rect, const float *out3, float feather,
                           uint8_t *small, uint8_t *big, float *mask, void *stream, spn_error_t *err) {
  const int32_t S = SPN_W2L_SIZE;
  cudaStream_t s = (cudaStream_t)stream;
  spn_image_t planar, sm, bg, mk;
  int32_t rc = check_frame(frame, rect, err);
  if (rc != SPN_OK)
    return rc;
  if (!isfinite(feather))
    return spn_error_set(err, SPN_EINVAL, "wav2lip: feather width is not finite");
  if ((rc = spn_image_wrap(&planar, (void *)out3, S, S, SPN_PIXFMT_BGRF32P, err)) != SPN_OK ||
      (rc = spn_image_wrap(&sm, small, S, S, SPN_PIXFMT_RGB24, err)) != SPN_OK ||
      (rc = spn_image_wrap(&bg, big, rect->w, rect->h, SPN_PIXFMT_RGB24, err)) != SPN_OK ||
      (rc = spn_image_wrap(&mk, mask, rect->w, rect->h, SPN_PIXFMT_GRAYF32, err)) != SPN_OK)
    return rc;
  if ((rc = spn_cuda_unit_to_u8(&planar, &sm, s, err)) != SPN_OK ||
      (rc = spn_cuda_resize_bilinear(&sm, &bg, s, err)) != SPN_OK)
    return rc;
  if (feather > 0 && (rc = spn_cuda_feather_mask(&mk, feather, s, err)) != SPN_OK)
    return rc;
  return spn_cuda_paste(frame, &bg, rect->x, rect->y, feather > 0 ? &mk : NULL, s, err);
}

int32_t spn_w2l_mel_gather_cuda(float *batch, int32_t n_rows, const spn_w2l_mel_src_t *src, size_t n, void *stream,
                                spn_error_t *err) {
  /* Every source is checked before the first launch (one per
   * SPN_CUDA_MEL_LAUNCH_ROWS rows), so a bad one queues nothing. */
  for (size_t k = 0; k < n; k++) {
    int64_t start = spn_w2l_mel_start(src[k].i, src[k].fps, src[k].n_frames);
    if (start < 0 || !src[k].mel || src[k].n_frames > INT32_MAX || src[k].row < 0 || src[k].row >= n_rows)
      return spn_error_set(err, SPN_EINVAL,
                           "wav2lip: mel gather: source %zu (chunk %lld of %lld mel frames at %g fps, row %d of "
                           "%d) has no chunk or row",
                           k, (long long)src[k].i, (long long)src[k].n_frames, src[k].fps, (int)src[k].row,
                           (int)n_rows);
  }
  spn_cuda_mel_window_t w[SPN_CUDA_MEL_LAUNCH_ROWS];
  for (size_t off = 0; off < n; off += SPN_CUDA_MEL_LAUNCH_ROWS) {
    size_t m = n - off < SPN_CUDA_MEL_LAUNCH_ROWS ? n - off : SPN_CUDA_MEL_LAUNCH_ROWS;
    for (size_t k = 0; k < m; k++) {
      const spn_w2l_mel_src_t *s = &src[off + k];
      w[k] = (spn_cuda_mel_window_t){.spec = s->mel,
                                     .cols = (int32_t)s->n_frames,
                                     .start = (int32_t)spn_w2l_mel_start(s->i, s->fps, s->n_frames),
                                     .row = s->row};
    }
    int32_t rc = spn_cuda_mel_gather(batch, n_rows, SPN_W2L_MEL_BINS, SPN_W2L_MEL_STEPS, w, m, (cudaStream_t)stream,
                                     err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}
