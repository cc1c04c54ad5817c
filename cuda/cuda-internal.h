/* cuda-internal.h — private declarations of the CUDA backend (cuda/).
 *
 * SPN_CUDA_CHECK wraps every CUDA runtime call: on failure it records the
 * call's text, the runtime's own message and name, and the file:line into
 * an spn_error_t and returns SPN_ECUDA from the enclosing function. The
 * backend's spn__backend_t is handed to spn__devices_open by
 * spn_runtime_new when libspindle is built with SPN_HAVE_CUDA.
 *
 * Health (device-cuda-health.c): NVML is loaded at run time with dlopen, so
 * libspindle has no link-time dependency on the driver; a poller reads
 * critical XID events and "GPU is lost" per device and marks the device
 * unusable (spn__cuda_device_usable). */
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

/* ---- health ---- */

typedef enum spn__cuda_health_state {
  SPN__CUDA_HEALTHY = 0,
  SPN__CUDA_XID_FATAL = 1, /* a critical XID was reported: the device needs a reset */
  SPN__CUDA_LOST = 2,      /* NVML says the GPU fell off the bus / is lost */
} spn__cuda_health_state_t;

/* Is an XID (NVIDIA driver error code) fatal to the device, i.e. does the GPU
 * need a reset before it can run work again? Application-level XIDs (13 graphics
 * exception, 31 MMU fault, 43 channel stopped, 45 preemptive cleanup) are not:
 * they kill a context, not the GPU. Thread: any. */
bool spn__cuda_xid_fatal(unsigned long long xid);

typedef struct spn__cuda_health spn__cuda_health_t;

/* Open NVML (dlopen of `nvml_lib`, normally "libnvidia-ml.so.1") and
 * register for critical XID events on the devices with the given PCI bus
 * ids ("0000:17:00.0", as cudaDeviceGetPCIBusId writes them; CUDA ordinals
 * and NVML indices differ, bus ids do not). A NULL id, or one NVML does not
 * know, is never reported. When NVML is absent or fails to initialise, *out
 * is a poller that reports every device healthy and
 * spn__cuda_health_available() is false.
 * Ownership: caller owns *out. Thread: any (then the loop). */
int32_t spn__cuda_health_new(const char *nvml_lib, const char *const *pci_bus_ids, uint32_t n,
                             spn__cuda_health_t **out, spn_error_t *err);
void spn__cuda_health_free(spn__cuda_health_t **h);
bool spn__cuda_health_available(const spn__cuda_health_t *h);
/* Poll without blocking: drain pending XID events and query each device.
 * Returns the number of devices whose state changed to unhealthy in this call.
 * Thread: the loop (one poller, one thread). */
uint32_t spn__cuda_health_poll(spn__cuda_health_t *h);
/* State of device i (index into the ids given), and the last XID seen. */
spn__cuda_health_state_t spn__cuda_health_state(const spn__cuda_health_t *h, uint32_t i,
                                               unsigned long long *last_xid);
/* Test hook: feed an XID as if NVML had reported it for device i. */
void spn__cuda_health_inject_xid(spn__cuda_health_t *h, uint32_t i, unsigned long long xid);

#endif
