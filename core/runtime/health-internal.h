/* health-internal.h — device health from NVML, and quarantine.
 *
 * NVML (libnvidia-ml.so.1) ships with the driver, not the toolkit: it is
 * opened with dlopen at run time, so libspindle has no link-time dependency
 * on it and this code is built with or without CUDA. A poller watches the
 * devices it is given by PCI bus id ("0000:17:00.0"; CUDA ordinals and NVML
 * indices differ, bus ids do not) for critical XID events and for "GPU is
 * lost". The runtime polls it from its loop and quarantines (drains) a
 * device found unhealthy: see runtime.c and docs/gpu.md. */
#ifndef SPINDLE_HEALTH_INTERNAL_H
#define SPINDLE_HEALTH_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "spindle/status.h"

typedef enum spn__nvml_state {
  SPN__NVML_HEALTHY = 0,
  SPN__NVML_XID_FATAL = 1, /* a critical XID was reported: the device needs a reset */
  SPN__NVML_LOST = 2,      /* NVML says the GPU fell off the bus / is lost */
} spn__nvml_state_t;

/* Is an XID (NVIDIA driver error code) fatal to the device, i.e. does the GPU
 * need a reset before it can run work again? Application-level XIDs (13 graphics
 * exception, 31 MMU fault, 43 channel stopped, 45 preemptive cleanup) are not:
 * they kill a context, not the GPU. Thread: any. */
bool spn__xid_fatal(unsigned long long xid);

typedef struct spn__nvml_health spn__nvml_health_t;

/* Open NVML (dlopen of `nvml_lib`, normally "libnvidia-ml.so.1") and
 * register for critical XID events on the devices with the given PCI bus
 * ids. A NULL id, or one NVML does not know, is never reported. When NVML
 * is absent or fails to initialise, *out is a poller that reports every
 * device healthy and spn__nvml_health_available() is false.
 * Ownership: caller owns *out. Thread: any (then the loop). */
int32_t spn__nvml_health_new(const char *nvml_lib, const char *const *pci_bus_ids, uint32_t n,
                             spn__nvml_health_t **out, spn_error_t *err);
void spn__nvml_health_free(spn__nvml_health_t **h);
bool spn__nvml_health_available(const spn__nvml_health_t *h);
/* Poll without blocking: drain pending XID events and query each device.
 * Returns the number of devices whose state changed to unhealthy in this call.
 * Thread: the loop (one poller, one thread). */
uint32_t spn__nvml_health_poll(spn__nvml_health_t *h);
/* State of device i (index into the ids given), and the last XID seen. */
spn__nvml_state_t spn__nvml_health_state(const spn__nvml_health_t *h, uint32_t i, unsigned long long *last_xid);
/* Test hook: feed an XID as if NVML had reported it for device i. */
void spn__nvml_health_inject_xid(spn__nvml_health_t *h, uint32_t i, unsigned long long xid);

#endif
