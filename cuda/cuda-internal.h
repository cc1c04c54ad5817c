/* cuda-internal.h — private declarations of the CUDA backend (cuda/).
 *
 * SPN_CUDA_CHECK wraps every CUDA runtime call: on failure it records the
 * call's text, the runtime's own message and name, and the file:line into
 * an spn_error_t and returns SPN_ECUDA from the enclosing function. The
 * backend's spn__backend_t is handed to spn__devices_open by
 * spn_runtime_new when libspindle is built with SPN_HAVE_CUDA.
 *
 * Health: the NVML poller is in the core (core/runtime/device-health.c,
 * built without CUDA too); device-cuda-health.c gives it the bus ids of the
 * CUDA devices, and a quarantined device is marked unusable
 * (spn__cuda_device_usable). */
#ifndef SPINDLE_CUDA_INTERNAL_H
#define SPINDLE_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "spindle/status.h"

/* Evaluate `call` (a cudaError_t expression); on failure fill *err and
 * return SPN_ECUDA from the enclosing function. `err` may be NULL. */
#define SPN_CUDA_CHECK(call, err)                                                                             \
  do {                                                                                                        \
    cudaError_t spn__ce = (call);                                                                             \
    if (spn__ce != cudaSuccess)                                                                               \
      return spn__cuda_error((err), spn__ce, #call, __FILE__, __LINE__);                                      \
  } while (0)

/* Record a failed call (and clear the runtime's last error); returns SPN_ECUDA. */
int32_t spn__cuda_error(spn_error_t *err, cudaError_t ce, const char *call, const char *file, int line);

#endif
