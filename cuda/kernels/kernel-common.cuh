/* cuda/kernels/kernel-common.cuh — what the kernel families (image.cu,
 * color.cu, mel.cu) share: the CPU reference's u8 rounding on the device, and the
 * launch check. Internal to the kernels library (C++ only). */
#ifndef SPINDLE_CUDA_KERNELS_COMMON_CUH
#define SPINDLE_CUDA_KERNELS_COMMON_CUH

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "spindle/status.h"

namespace spn_kernels {

/* core/image/image.c's sat_u8: round to nearest, ties away from zero, then
 * saturate (NaN is 0). */
__device__ __forceinline__ uint8_t sat_u8(float v) {
  if (!(v > 0.0f))
    return 0;
  if (v >= 254.5f)
    return 255;
  return (uint8_t)__fadd_rn(v, 0.5f);
}

/* The last launch's status: SPN_ECUDA naming the family ("cuda image") and
 * the operation when it failed. */
inline int32_t launched(const char *family, const char *op, spn_error_t *err) {
  cudaError_t ce = cudaGetLastError();
  if (ce != cudaSuccess)
    return spn_error_set(err, SPN_ECUDA, "%s: %s launch failed: %s (%s)", family, op, cudaGetErrorString(ce),
                         cudaGetErrorName(ce));
  return SPN_OK;
}

} // namespace spn_kernels

#endif
