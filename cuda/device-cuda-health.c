/* device-cuda-health.c — what the NVML health poller needs from CUDA.
 *
 * The poller itself (core/runtime/device-health.c) is CUDA-free: it knows
 * devices by PCI bus id. CUDA ordinals and NVML indices may differ (CUDA
 * orders by speed unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and
 * CUDA_VISIBLE_DEVICES renumbers), bus ids never do, so the runtime asks
 * the CUDA runtime for each device's bus id here. */
#include <stdio.h>

#include "cuda-internal.h"
#include "../core/runtime/device-internal.h"

int spn__cuda_device_ordinal(const spn_device_t *dev);

int32_t spn__cuda_device_pci_bus_id(const spn_device_t *dev, char *buf, size_t size, spn_error_t *err) {
  if (dev->kind != SPN_DEVICE_CUDA || size < 13)
    return spn_error_set(err, SPN_EINVAL, "%s: not a CUDA device", dev->name);
  SPN_CUDA_CHECK(cudaDeviceGetPCIBusId(buf, (int)size, spn__cuda_device_ordinal(dev)), err);
  return SPN_OK;
}
