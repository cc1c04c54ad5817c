/* runtime-emu.h — the CUDA runtime calls the kernel tests make, done on the
 * host: "device" memory is host memory, copies are memcpy, waits return at
 * once, one device is reported. Force-included (-include) into the
 * cuda-*-host tests and into the kernels built for the host
 * (tests/gpu/host-emu/README), after <cuda_runtime_api.h>, whose types they
 * keep. Test code only. */
#ifndef SPN_TEST_RUNTIME_EMU_H
#define SPN_TEST_RUNTIME_EMU_H

#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

static inline cudaError_t spn_emu_malloc(void **p, size_t n) {
  *p = malloc(n ? n : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t spn_emu_free(void *p) {
  free(p);
  return cudaSuccess;
}
static inline cudaError_t spn_emu_memcpy(void *dst, const void *src, size_t n) {
  memmove(dst, src, n);
  return cudaSuccess;
}
static inline cudaError_t spn_emu_memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t w,
                                           size_t h) {
  if (w > dpitch || w > spitch)
    return cudaErrorInvalidPitchValue;
  for (size_t y = 0; y < h; y++)
    memmove((char *)dst + y * dpitch, (const char *)src + y * spitch, w);
  return cudaSuccess;
}
static inline cudaError_t spn_emu_memset2d(void *p, size_t pitch, int v, size_t w, size_t h) {
  if (w > pitch)
    return cudaErrorInvalidPitchValue;
  for (size_t y = 0; y < h; y++)
    memset((char *)p + y * pitch, v, w);
  return cudaSuccess;
}
static inline cudaError_t spn_emu_ok(void) { return cudaSuccess; }
static inline cudaError_t spn_emu_device_count(int *n) {
  *n = 1;
  return cudaSuccess;
}

#define cudaMalloc(p, n) spn_emu_malloc((void **)(p), (n))
#define cudaFree(p) spn_emu_free(p)
#define cudaMemcpy(d, s, n, k) ((void)(k), spn_emu_memcpy((d), (s), (n)))
#define cudaMemcpyAsync(d, s, n, k, st) ((void)(k), (void)(st), spn_emu_memcpy((d), (s), (n)))
#define cudaMemcpy2D(d, dp, s, sp, w, h, k) ((void)(k), spn_emu_memcpy2d((d), (dp), (s), (sp), (w), (h)))
#define cudaMemcpy2DAsync(d, dp, s, sp, w, h, k, st) \
  ((void)(k), (void)(st), spn_emu_memcpy2d((d), (dp), (s), (sp), (w), (h)))
#define cudaMemset(p, v, n) (memset((p), (v), (n)), cudaSuccess)
#define cudaMemsetAsync(p, v, n, st) ((void)(st), memset((p), (v), (n)), cudaSuccess)
#define cudaMemset2DAsync(p, pitch, v, w, h, st) ((void)(st), spn_emu_memset2d((p), (pitch), (v), (w), (h)))
#define cudaDeviceSynchronize() spn_emu_ok()
#define cudaStreamSynchronize(st) ((void)(st), spn_emu_ok())
#define cudaGetLastError() spn_emu_ok()
#define cudaGetDeviceCount(n) spn_emu_device_count(n)

#endif
