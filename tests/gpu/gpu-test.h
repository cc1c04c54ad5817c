/* gpu-test.h — what the GPU tests of tests/gpu share: status
 * and CUDA-call checks for cmocka, a seeded generator, and host images with
 * their device copies (pitched wider than the host's, so every kernel's
 * stride handling is exercised). Include after <cmocka.h>. */
#ifndef SPN_TEST_GPU_TEST_H
#define SPN_TEST_GPU_TEST_H

#include <stdint.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "spindle/image.h"

#define CK(call)                                                                 \
  do {                                                                           \
    spn_error_t e_ = SPN_ERROR_INIT;                                             \
    int32_t rc_ = (call);                                                        \
    if (rc_ != SPN_OK)                                                           \
      fail_msg("%s: %s", #call, e_.msg);                                         \
  } while (0)
#define CU(call)                                                                 \
  do {                                                                           \
    cudaError_t ce_ = (call);                                                    \
    if (ce_ != cudaSuccess)                                                      \
      fail_msg("%s: %s", #call, cudaGetErrorString(ce_));                        \
  } while (0)

static inline uint32_t rng_next(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}
static inline float rng_unit(uint32_t *s) { return (float)rng_next(s) / 16777216.0f; }

static inline int is_float_fmt(int32_t f) {
  return f == SPN_PIXFMT_RGBF32P || f == SPN_PIXFMT_BGRF32P || f == SPN_PIXFMT_GRAYF32;
}

/* Bytes per row of plane p actually holding pixels. */
static inline size_t row_bytes(const spn_image_t *im, int p) {
  int32_t pw = 0, ph = 0;
  spn_pixfmt_plane_size(im->format, im->width, im->height, p, &pw, &ph);
  switch (im->format) {
  case SPN_PIXFMT_RGB24:
  case SPN_PIXFMT_BGR24: return (size_t)pw * 3;
  case SPN_PIXFMT_NV12: return (size_t)pw * (p == 1 ? 2 : 1);
  default: return (size_t)pw * (is_float_fmt(im->format) ? 4 : 1);
  }
}

static inline int32_t plane_rows(const spn_image_t *im, int p) {
  int32_t pw = 0, ph = 0;
  spn_pixfmt_plane_size(im->format, im->width, im->height, p, &pw, &ph);
  return ph;
}

static inline spn_image_t host_image(int32_t w, int32_t h, int32_t fmt, uint32_t seed, float lo, float hi) {
  spn_image_t im = SPN_IMAGE_INIT;
  CK(spn_image_alloc(&im, w, h, fmt, &e_));
  for (int p = 0; p < im.nplanes; p++)
    for (int32_t y = 0; y < plane_rows(&im, p); y++) {
      uint8_t *row = im.data[p] + y * im.stride[p];
      size_t rb = row_bytes(&im, p);
      if (is_float_fmt(fmt))
        for (size_t i = 0; i < rb / 4; i++)
          ((float *)row)[i] = lo + (hi - lo) * rng_unit(&seed);
      else
        for (size_t i = 0; i < rb; i++)
          row[i] = (uint8_t)rng_next(&seed);
    }
  return im;
}

/* Device copy of a host image with a pitch 96 bytes wider than the host's. */
static inline spn_image_t to_device(const spn_image_t *h) {
  spn_image_t d = *h;
  d.owned = NULL;
  for (int p = 0; p < h->nplanes; p++) {
    d.stride[p] = h->stride[p] + 96;
    void *ptr = NULL;
    CU(cudaMalloc(&ptr, (size_t)d.stride[p] * (size_t)plane_rows(h, p)));
    d.data[p] = ptr;
    CU(cudaMemcpy2D(ptr, (size_t)d.stride[p], h->data[p], (size_t)h->stride[p], row_bytes(h, p),
                    (size_t)plane_rows(h, p), cudaMemcpyHostToDevice));
  }
  return d;
}

static inline void from_device(const spn_image_t *d, spn_image_t *h) {
  CU(cudaDeviceSynchronize());
  for (int p = 0; p < h->nplanes; p++)
    CU(cudaMemcpy2D(h->data[p], (size_t)h->stride[p], d->data[p], (size_t)d->stride[p], row_bytes(h, p),
                    (size_t)plane_rows(h, p), cudaMemcpyDeviceToHost));
}

/* The view decode's items give of a picture NVDEC keeps on the GPU: NV12
 * with the planes y and uv (rows yp and uvp bytes apart; deep pictures
 * hold 16-bit samples in the same planes). */
static inline spn_image_t nvdec_view(void *y, size_t yp, void *uv, size_t uvp, int32_t w, int32_t h) {
  spn_image_t v = SPN_IMAGE_INIT;
  v.width = w;
  v.height = h;
  v.format = SPN_PIXFMT_NV12;
  v.nplanes = 2;
  v.data[0] = (uint8_t *)y;
  v.data[1] = (uint8_t *)uv;
  v.stride[0] = (int64_t)yp;
  v.stride[1] = (int64_t)uvp;
  return v;
}

static inline void device_free(spn_image_t *d) {
  for (int p = 0; p < d->nplanes; p++)
    CU(cudaFree(d->data[p]));
  memset(d, 0, sizeof *d);
}

#endif
