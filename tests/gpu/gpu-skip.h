/* gpu-skip.h — GPU tests exit 77 (meson's "skipped") when no CUDA device is
 * present: cudaGetDeviceCount fails (no driver) or reports zero. */
#ifndef SPN_TEST_GPU_SKIP_H
#define SPN_TEST_GPU_SKIP_H

#include <stdio.h>
#include <cuda_runtime_api.h>

static inline int spn_test_gpu_count(void) {
  int n = 0;
  cudaError_t ce = cudaGetDeviceCount(&n);
  if (ce != cudaSuccess) {
    fprintf(stderr, "no CUDA device: %s\n", cudaGetErrorString(ce));
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0)
    fprintf(stderr, "no CUDA device: 0 devices\n");
  return n;
}

#define SPN_TEST_REQUIRE_GPU()                                                   \
  do {                                                                           \
    if (spn_test_gpu_count() <= 0)                                               \
      return 77;                                                                 \
  } while (0)

#endif
