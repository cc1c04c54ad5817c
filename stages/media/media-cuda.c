/* media-cuda.c — NVDEC on the stage's GPU, frame conversions on the GPU and
 * the host<->device copies of decode and encode (see media-cuda.h).
 *
 * Invariants: FFmpeg's CUDA device is always the primary context of the
 * calling thread's current device (the context the CUDA runtime API, and so
 * the rest of Spindle, uses), retained for as long as FFmpeg holds the
 * device; its stream is the caller's, so NVDEC's picture copies and the
 * conversions that read them are ordered on one stream without a host wait.
 * Nothing here is global: the driver entry points are looked up per device.
 */
#include "media-cuda.h"

#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <libavutil/buffer.h>
#include <libavutil/hwcontext.h>
#include <libavutil/hwcontext_cuda.h>

#include "color.cuh"
#include "image.cuh"

#define CU_FAIL(call, what, err)                                                                               \
  do {                                                                                                         \
    cudaError_t ce_ = (call);                                                                                  \
    if (ce_ != cudaSuccess)                                                                                    \
      return spn_error_set(err, SPN_ECUDA, "media cuda: %s: %s: %s (%s) at %s:%d", what, #call,               \
                           cudaGetErrorString(ce_), cudaGetErrorName(ce_), __FILE__, __LINE__);                \
  } while (0)

typedef CUresult (*cu_device_get_fn)(CUdevice *, int);
typedef CUresult (*cu_primary_retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*cu_primary_release_fn)(CUdevice);

/* What the device's free callback needs to release the primary context. */
typedef struct primary_hold {
  cu_primary_release_fn release;
  CUdevice dev;
} primary_hold_t;

static int32_t driver_fn(const char *name, void **fn, spn_error_t *err) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t ce = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
#else
  cudaError_t ce = cudaGetDriverEntryPoint(name, fn, cudaEnableDefault, &q);
#endif
  if (ce != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn)
    return spn_error_set(err, SPN_ECUDA, "media cuda: the CUDA driver has no %s: %s", name,
                         ce != cudaSuccess ? cudaGetErrorString(ce) : "symbol not found");
  return SPN_OK;
}

static void primary_release(AVHWDeviceContext *dc) {
  primary_hold_t *h = dc->user_opaque;
  if (h) {
    h->release(h->dev);
    free(h);
    dc->user_opaque = NULL;
  }
}

int32_t spn_media_cuda_device_new(cudaStream_t stream, void **out, spn_error_t *err) {
  *out = NULL;
  int ordinal = 0;
  CU_FAIL(cudaGetDevice(&ordinal), "opening the GPU for NVDEC/NVENC", err);
  /* Make sure the runtime has made the primary context (a no-op when the
   * stage's executor has used the device, as it always has). */
  CU_FAIL(cudaFree(NULL), "opening the GPU for NVDEC/NVENC", err);
  cu_device_get_fn dev_get = NULL;
  cu_primary_retain_fn retain = NULL;
  cu_primary_release_fn release = NULL;
  int32_t rc;
  if ((rc = driver_fn("cuDeviceGet", (void **)&dev_get, err)) ||
      (rc = driver_fn("cuDevicePrimaryCtxRetain", (void **)&retain, err)) ||
      (rc = driver_fn("cuDevicePrimaryCtxRelease", (void **)&release, err)))
    return rc;
  CUdevice dev = 0;
  CUcontext ctx = NULL;
  CUresult cr = dev_get(&dev, ordinal);
  if (cr != CUDA_SUCCESS)
    return spn_error_set(err, SPN_ECUDA, "media cuda: cuDeviceGet(%d) failed: CUDA driver error %d", ordinal, (int)cr);
  primary_hold_t *hold = calloc(1, sizeof *hold);
  if (!hold)
    return spn_error_set(err, SPN_ENOMEM, "media cuda: out of memory opening the GPU for NVDEC/NVENC");
  if ((cr = retain(&ctx, dev)) != CUDA_SUCCESS) {
    free(hold);
    return spn_error_set(err, SPN_ECUDA, "media cuda: cuDevicePrimaryCtxRetain(cuda:%d) failed: CUDA driver error %d",
                         ordinal, (int)cr);
  }
  hold->release = release;
  hold->dev = dev;
  AVBufferRef *ref = av_hwdevice_ctx_alloc(AV_HWDEVICE_TYPE_CUDA);
  if (!ref) {
    release(dev);
    free(hold);
    return spn_error_set(err, SPN_ENOMEM, "media cuda: out of memory opening the GPU for NVDEC/NVENC");
  }
  AVHWDeviceContext *dc = (AVHWDeviceContext *)ref->data;
  AVCUDADeviceContext *hw = dc->hwctx;
  hw->cuda_ctx = ctx;
  hw->stream = (CUstream)stream;
  dc->user_opaque = hold; /* from here on, freeing ref releases the context */
  dc->free = primary_release;
  int r = av_hwdevice_ctx_init(ref);
  if (r < 0) {
    av_buffer_unref(&ref);
    char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
    av_strerror(r, buf, sizeof buf);
    return spn_error_set(err, SPN_EDEVICE, "media cuda: FFmpeg cannot use cuda:%d for NVDEC/NVENC: %s", ordinal, buf);
  }
  *out = ref;
  return SPN_OK;
}

void spn_media_cuda_device_free(void **dev) {
  if (dev && *dev) {
    AVBufferRef *ref = *dev;
    av_buffer_unref(&ref);
    *dev = NULL;
  }
}

/* Scratch pieces start 256-byte aligned (what cudaMalloc gives). */
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* What spn_media_cuda_from_item does to an item, and the scratch pieces
 * (offsets from the scratch's start, 256-byte aligned; -1: not needed) its
 * steps write between them. */
typedef struct {
  int32_t w, h, sw, sh; /* stored size; shown size (square pixels) */
  int32_t u8;           /* the u8 format RGB steps use (pixfmt, or the RGB24/BGR24 of a float one) */
  int rgb, flt, tm, resample, turn;
  int64_t nv12, stored, shown, turned; /* pieces: 8-bit NV12; u8 RGB stored; u8 RGB shown (float); pixfmt turned */
  size_t total;
} item_plan_t;

/* A scratch piece of `bytes` at *at when needed (then *at moves past it,
 * aligned); -1 when not. */
static int64_t piece(size_t *at, int need, size_t bytes) {
  if (!need)
    return -1;
  int64_t off = (int64_t)*at;
  *at += align256(bytes);
  return off;
}

static int32_t plan_item(const spn_media_item_t *it, int32_t pixfmt, item_plan_t *pl, spn_error_t *err) {
  memset(pl, 0, sizeof *pl);
  if (!it || it->image.format != SPN_PIXFMT_NV12 || !it->image.data[0])
    return spn_error_set(err, SPN_EINVAL, "media cuda: frame conversion needs an item with an nv12 device view");
  pl->w = it->image.width;
  pl->h = it->image.height;
  pl->sw = it->show_w > 0 ? it->show_w : pl->w;
  pl->sh = it->show_h > 0 ? it->show_h : pl->h;
  pl->rgb = pixfmt != SPN_PIXFMT_NV12 && pixfmt != SPN_PIXFMT_YUV420P;
  pl->flt = pixfmt == SPN_PIXFMT_RGBF32P || pixfmt == SPN_PIXFMT_BGRF32P;
  pl->u8 = pixfmt == SPN_PIXFMT_RGBF32P ? SPN_PIXFMT_RGB24 : pixfmt == SPN_PIXFMT_BGRF32P ? SPN_PIXFMT_BGR24 : pixfmt;
  /* RGB and float frames of PQ and HLG video; 4:2:0 stays the signal, as on the CPU */
  pl->tm = pl->rgb && (it->tone_map == SPN_TRANSFER_PQ || it->tone_map == SPN_TRANSFER_HLG);
  pl->resample = pl->sw != pl->w || pl->sh != pl->h;
  pl->turn = it->rotation % 360 != 0;
  if (pl->resample && !pl->rgb)
    return spn_error_set(err, SPN_EINVAL, "media cuda: a %dx%d frame is shown at %dx%d, but %s frames are not "
                         "resampled", (int)pl->w, (int)pl->h, (int)pl->sw, (int)pl->sh, spn_pixfmt_name(pixfmt));
  size_t at = 0;
  pl->nv12 = piece(&at, it->deep && !pl->tm, spn_pixfmt_tight_size(SPN_PIXFMT_NV12, pl->w, pl->h));
  pl->stored = piece(&at, pl->rgb && pl->resample, spn_pixfmt_tight_size(pl->u8, pl->w, pl->h));
  pl->shown = piece(&at, pl->flt, spn_pixfmt_tight_size(pl->u8, pl->sw, pl->sh));
  pl->turned = piece(&at, pl->turn, spn_pixfmt_tight_size(pixfmt, pl->sw, pl->sh));
  pl->total = at;
  return SPN_OK;
}

size_t spn_media_cuda_item_scratch_size(const spn_media_item_t *it, int32_t pixfmt) {
  item_plan_t pl;
  spn_error_t err = SPN_ERROR_INIT;
  return plan_item(it, pixfmt, &pl, &err) == SPN_OK ? pl.total : 0;
}

int32_t spn_media_cuda_from_item(const spn_media_item_t *it, int32_t pixfmt, void *dst, void *scratch,
                                 cudaStream_t stream, spn_error_t *err) {
  item_plan_t pl;
  int32_t rc = plan_item(it, pixfmt, &pl, err);
  if (rc)
    return rc;
  if (!dst)
    return spn_error_set(err, SPN_EINVAL, "media cuda: frame conversion needs a destination");
  if (pl.total && !scratch)
    return spn_error_set(err, SPN_EINVAL, "media cuda: converting a %s%s%s frame to %s needs scratch memory",
                         it->deep ? "16-bit 4:2:0" : "nv12", pl.resample ? " resampled" : "",
                         pl.turn ? " turned" : "", spn_pixfmt_name(pixfmt));
  uint8_t *base = scratch;
  void *out = pl.turn ? base + pl.turned : dst; /* the frame in pixfmt at its shown size, before any turn */
  spn_image_t nv12 = it->image, a, b;
  if (pl.nv12 >= 0) { /* 16-bit samples to 8 */
    if ((rc = spn_image_wrap(&nv12, base + pl.nv12, pl.w, pl.h, SPN_PIXFMT_NV12, err)) ||
        (rc = spn_cuda_p016_to_yuv420(it->image.data[0], it->image.stride[0], it->image.data[1],
                                      it->image.stride[1], &nv12, stream, err)))
      return rc;
  }
  if (!pl.rgb) { /* 4:2:0: the samples as they are */
    if ((rc = spn_image_wrap(&a, out, pl.w, pl.h, pixfmt, err)) ||
        (rc = spn_cuda_yuv420_repack(&nv12, &a, stream, err)))
      return rc;
  } else {
    /* RGB at the stored size (into the shown frame when there is no
     * resampling), then resampled to square pixels, then to float */
    void *shown = pl.flt ? base + pl.shown : out, *stored = pl.resample ? base + pl.stored : shown;
    if ((rc = spn_image_wrap(&a, stored, pl.w, pl.h, pl.u8, err)))
      return rc;
    rc = pl.tm ? spn_cuda_hdr420_to_rgb(&it->image, it->deep, &it->colour, it->tone_map, &a, stream, err)
               : spn_cuda_yuv420_to_rgb_colour(&nv12, &a, &it->colour, stream, err);
    if (rc)
      return rc;
    if (pl.resample && ((rc = spn_image_wrap(&b, shown, pl.sw, pl.sh, pl.u8, err)) ||
                        (rc = spn_cuda_resize_cubic(&a, &b, stream, err))))
      return rc;
    if (pl.flt && ((rc = spn_image_wrap(&a, shown, pl.sw, pl.sh, pl.u8, err)) ||
                   (rc = spn_image_wrap(&b, out, pl.sw, pl.sh, pixfmt, err)) ||
                   (rc = spn_cuda_to_float(&a, &b, NULL, NULL, stream, err))))
      return rc;
  }
  if (!pl.turn)
    return SPN_OK;
  return spn_media_cuda_rotate(out, pixfmt, pl.sw, pl.sh, it->rotation, dst, stream, err);
}

void *spn_media_cuda_emu_upload(const void *host, size_t size) {
  void *p = NULL;
  if (cudaMalloc(&p, size) != cudaSuccess)
    return NULL;
  if (cudaMemcpy(p, host, size, cudaMemcpyHostToDevice) != cudaSuccess) {
    (void)cudaFree(p);
    return NULL;
  }
  return p;
}

void spn_media_cuda_emu_free(void *opaque, uint8_t *data) {
  (void)opaque;
  (void)cudaFree(data);
}

int32_t spn_media_cuda_rotate(const void *src, int32_t fmt, int32_t width, int32_t height, int32_t rotation,
                              void *dst, cudaStream_t stream, spn_error_t *err) {
  spn_image_t in, out;
  int32_t rc, deg = ((rotation % 360) + 360) % 360, quarter = deg == 90 || deg == 270;
  if (!src || !dst)
    return spn_error_set(err, SPN_EINVAL, "media cuda: turning a frame needs a source and a destination");
  if ((rc = spn_image_wrap(&in, (void *)src, width, height, fmt, err)) ||
      (rc = spn_image_wrap(&out, dst, quarter ? height : width, quarter ? width : height, fmt, err)))
    return rc;
  return spn_cuda_rotate(&in, &out, deg, stream, err);
}

/* Bytes per element of plane p (as spn_image_wrap lays them out). */
static size_t elem_size(int32_t fmt, int32_t p) {
  switch (fmt) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24: return 3;
  case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P: case SPN_PIXFMT_GRAYF32: return 4;
  case SPN_PIXFMT_NV12: return p == 1 ? 2 : 1;
  default: return 1;
  }
}

int32_t spn_media_cuda_upload(const spn_image_t *src, void *dst, cudaStream_t stream, spn_error_t *err) {
  spn_image_t out;
  int32_t rc;
  if (!src || !dst)
    return spn_error_set(err, SPN_EINVAL, "media cuda: upload needs a source and a destination");
  if ((rc = spn_image_wrap(&out, dst, src->width, src->height, src->format, err)))
    return rc;
  for (int32_t p = 0; p < out.nplanes; p++) {
    int32_t pw = 0, ph = 0;
    spn_pixfmt_plane_size(src->format, src->width, src->height, p, &pw, &ph);
    CU_FAIL(cudaMemcpy2DAsync(out.data[p], (size_t)out.stride[p], src->data[p], (size_t)src->stride[p],
                              (size_t)pw * elem_size(src->format, p), (size_t)ph, cudaMemcpyHostToDevice, stream),
            "uploading a decoded frame", err);
  }
  return SPN_OK;
}

int32_t spn_media_cuda_rgb_to_yuv420p_host(const void *rgb_dev, int32_t fmt, int32_t width, int32_t height,
                                           const spn_colour_t *colour, void *yuv_dev, void *yuv_host,
                                           cudaStream_t stream, spn_error_t *err) {
  spn_image_t rgb, yuv;
  int32_t rc;
  if (!rgb_dev || !yuv_dev)
    return spn_error_set(err, SPN_EINVAL, "media cuda: rgb to yuv420p needs a source and a scratch");
  if ((rc = spn_image_wrap(&rgb, (void *)rgb_dev, width, height, fmt, err)) ||
      (rc = spn_image_wrap(&yuv, yuv_dev, width, height, SPN_PIXFMT_YUV420P, err)) ||
      (rc = spn_cuda_rgb_to_yuv420_colour(&rgb, &yuv, colour, stream, err)))
    return rc;
  if (!yuv_host) /* the caller downloads it (a counted copy) */
    return SPN_OK;
  size_t n = (size_t)width * (size_t)height + 2 * (size_t)((width + 1) / 2) * (size_t)((height + 1) / 2);
  CU_FAIL(cudaMemcpyAsync(yuv_host, yuv_dev, n, cudaMemcpyDeviceToHost, stream), "downloading a yuv420p frame", err);
  return SPN_OK;
}

size_t spn_media_cuda_nv12_scratch_size(int32_t fmt, int32_t width, int32_t height) {
  if (fmt == SPN_PIXFMT_RGBF32P || fmt == SPN_PIXFMT_BGRF32P)
    return (size_t)(width & ~1) * (size_t)(height & ~1) * 3;
  return 0;
}

int32_t spn_media_cuda_to_nv12(const void *src_dev, int32_t fmt, int32_t width, int32_t height,
                               const spn_colour_t *colour, const spn_image_t *nv12, void *scratch,
                               cudaStream_t stream, spn_error_t *err) {
  spn_image_t src, mid;
  int32_t rc;
  if (!src_dev || !nv12 || nv12->format != SPN_PIXFMT_NV12)
    return spn_error_set(err, SPN_EINVAL,
                         "media cuda: conversion to the encoder's nv12 needs a source and nv12 planes");
  if (nv12->width > width || nv12->height > height)
    return spn_error_set(err, SPN_EINVAL, "media cuda: a %dx%d frame cannot fill %dx%d encoder planes", (int)width,
                         (int)height, (int)nv12->width, (int)nv12->height);
  /* The source as the stages lay it out, then seen at the encoder's size:
   * same pointers and pitches, fewer columns/rows (the crop to even sizes;
   * every chroma sample inside it covers the same pixels as before). */
  if ((rc = spn_image_wrap(&src, (void *)src_dev, width, height, fmt, err)))
    return rc;
  src.width = nv12->width;
  src.height = nv12->height;
  spn_image_t dst = *nv12;
  switch (fmt) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24:
    return spn_cuda_rgb_to_yuv420_colour(&src, &dst, colour, stream, err);
  case SPN_PIXFMT_NV12: case SPN_PIXFMT_YUV420P:
    return spn_cuda_yuv420_repack(&src, &dst, stream, err);
  case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P:
    /* as the CPU path: to u8 first (spn_image_from_float's twin), then 4:2:0 */
    if (!scratch)
      return spn_error_set(err, SPN_EINVAL, "media cuda: conversion of %s to nv12 needs scratch memory",
                           spn_pixfmt_name(fmt));
    if ((rc = spn_image_wrap(&mid, scratch, nv12->width, nv12->height,
                             fmt == SPN_PIXFMT_RGBF32P ? SPN_PIXFMT_RGB24 : SPN_PIXFMT_BGR24, err)) ||
        (rc = spn_cuda_from_float(&src, &mid, NULL, NULL, stream, err)))
      return rc;
    return spn_cuda_rgb_to_yuv420_colour(&mid, &dst, colour, stream, err);
  default:
    return spn_error_set(err, SPN_EUNSUPPORTED, "media cuda: encoding %s frames from the GPU is not supported",
                         spn_pixfmt_name(fmt));
  }
}

int32_t spn_media_cuda_download(const void *src_dev, void *dst_host, size_t size, cudaStream_t stream,
                                spn_error_t *err) {
  CU_FAIL(cudaMemcpyAsync(dst_host, src_dev, size, cudaMemcpyDeviceToHost, stream), "downloading a frame", err);
  return SPN_OK;
}

int32_t spn_media_cuda_sync(cudaStream_t stream, const char *what, spn_error_t *err) {
  cudaError_t ce = cudaStreamSynchronize(stream);
  if (ce != cudaSuccess)
    return spn_error_set(err, SPN_ECUDA, "media cuda: %s: cudaStreamSynchronize: %s (%s)", what,
                         cudaGetErrorString(ce), cudaGetErrorName(ce));
  return SPN_OK;
}

int32_t spn_media_cuda_mark(cudaStream_t stream, void **ev, spn_error_t *err) {
  if (!*ev) {
    cudaEvent_t e = NULL;
    CU_FAIL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "marking a point of the stream", err);
    *ev = e;
  }
  CU_FAIL(cudaEventRecord((cudaEvent_t)*ev, stream), "marking a point of the stream", err);
  return SPN_OK;
}

int32_t spn_media_cuda_wait_mark(void *ev, const char *what, spn_error_t *err) {
  cudaError_t ce = cudaEventSynchronize((cudaEvent_t)ev);
  if (ce != cudaSuccess)
    return spn_error_set(err, SPN_ECUDA, "media cuda: %s: cudaEventSynchronize: %s (%s)", what,
                         cudaGetErrorString(ce), cudaGetErrorName(ce));
  return SPN_OK;
}

void spn_media_cuda_mark_free(void **ev) {
  if (*ev)
    (void)cudaEventDestroy((cudaEvent_t)*ev);
  *ev = NULL;
}
