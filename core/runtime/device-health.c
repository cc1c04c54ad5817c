/* device-health.c — the NVML poller behind device quarantine.
 *
 * libnvidia-ml.so.1 ships with the driver, not the toolkit, so it is opened
 * with dlopen: a host without it (or without a GPU) gets a poller that
 * reports every device healthy. With NVML, the poller registers each device
 * for critical-XID events and, on every poll (the runtime's loop calls it
 * from a timer), drains the event set without blocking and asks each device
 * for a cheap property (its minor number), which fails with "GPU is lost"
 * when the GPU fell off the bus. A fatal XID or a lost GPU marks the device
 * unhealthy for good: recovery needs a GPU reset and a new runtime.
 *
 * Nothing here needs CUDA: the runtime maps its devices to bus ids (CUDA
 * devices through cudaDeviceGetPCIBusId; emulated cpu:N devices only
 * through the test hook spn__runtime_watch_health), so the quarantine path
 * is tested in CI against a fake libnvidia-ml.
 *
 * Only the few NVML entry points used are declared here, with the types the
 * NVML ABI defines (opaque handles, unsigned int return codes). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "health-internal.h"

typedef void *nvml_device_t;
typedef void *nvml_event_set_t;
/* nvmlEventData_t (NVML ≥ 11): device, eventType, eventData, gpuInstanceId, computeInstanceId. */
typedef struct {
  nvml_device_t device;
  unsigned long long type;
  unsigned long long data;
  unsigned int gpu_instance;
  unsigned int compute_instance;
} nvml_event_data_t;

enum {
  NVML_OK = 0,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_GPU_IS_LOST = 15,
};
#define NVML_EVENT_XID_CRITICAL 0x0000000000000008ULL

struct spn__nvml_health {
  void *lib;
  unsigned (*shutdown)(void);
  unsigned (*event_wait)(nvml_event_set_t, nvml_event_data_t *, unsigned);
  unsigned (*event_free)(nvml_event_set_t);
  unsigned (*get_minor)(nvml_device_t, unsigned *);
  nvml_event_set_t set;
  uint32_t n;
  nvml_device_t *handles;
  spn__nvml_state_t *state;
  unsigned long long *last_xid;
};

bool spn__xid_fatal(unsigned long long xid) {
  switch (xid) {
  case 48:  /* double-bit ECC error */
  case 61:  /* internal micro-controller breakpoint */
  case 62:  /* internal micro-controller halt */
  case 63:  /* ECC page retirement / row remapping recording event */
  case 64:  /* ECC page retirement / row remapping failure */
  case 74:  /* NVLink error */
  case 79:  /* GPU has fallen off the bus */
  case 92:  /* high single-bit ECC error rate */
  case 94:  /* contained ECC error: affected contexts must restart, device needs reset to reclaim memory */
  case 95:  /* uncontained ECC error */
  case 119: /* GSP RPC timeout */
  case 120: /* GSP error */
  case 140: /* unrecovered ECC error */
    return true;
  default:
    return false;
  }
}

static void mark(spn__nvml_health_t *h, uint32_t i, spn__nvml_state_t s, uint32_t *changed) {
  if (h->state[i] == SPN__NVML_HEALTHY && s != SPN__NVML_HEALTHY)
    (*changed)++;
  if (s > h->state[i])
    h->state[i] = s;
}

int32_t spn__nvml_health_new(const char *nvml_lib, const char *const *pci_bus_ids, uint32_t n,
                             spn__nvml_health_t **out, spn_error_t *err) {
  spn__nvml_health_t *h = calloc(1, sizeof *h);
  if (!h)
    return spn_error_set(err, SPN_ENOMEM, "out of memory creating the GPU health monitor");
  h->n = n;
  h->handles = calloc(n ? n : 1, sizeof *h->handles);
  h->state = calloc(n ? n : 1, sizeof *h->state);
  h->last_xid = calloc(n ? n : 1, sizeof *h->last_xid);
  if (!h->handles || !h->state || !h->last_xid) {
    spn__nvml_health_free(&h);
    return spn_error_set(err, SPN_ENOMEM, "out of memory creating the GPU health monitor");
  }
  *out = h;
  h->lib = dlopen(nvml_lib, RTLD_NOW | RTLD_LOCAL);
  if (!h->lib)
    return SPN_OK; /* no NVML: health is not monitored */
  unsigned (*init)(void) = (unsigned (*)(void))dlsym(h->lib, "nvmlInit_v2");
  unsigned (*by_pci)(const char *, nvml_device_t *) =
      (unsigned (*)(const char *, nvml_device_t *))dlsym(h->lib, "nvmlDeviceGetHandleByPciBusId_v2");
  unsigned (*set_create)(nvml_event_set_t *) = (unsigned (*)(nvml_event_set_t *))dlsym(h->lib, "nvmlEventSetCreate");
  unsigned (*reg)(nvml_device_t, unsigned long long, nvml_event_set_t) =
      (unsigned (*)(nvml_device_t, unsigned long long, nvml_event_set_t))dlsym(h->lib, "nvmlDeviceRegisterEvents");
  h->shutdown = (unsigned (*)(void))dlsym(h->lib, "nvmlShutdown");
  h->event_wait = (unsigned (*)(nvml_event_set_t, nvml_event_data_t *, unsigned))dlsym(h->lib, "nvmlEventSetWait_v2");
  h->event_free = (unsigned (*)(nvml_event_set_t))dlsym(h->lib, "nvmlEventSetFree");
  h->get_minor = (unsigned (*)(nvml_device_t, unsigned *))dlsym(h->lib, "nvmlDeviceGetMinorNumber");
  if (!init || !by_pci || !set_create || !reg || !h->shutdown || !h->event_wait || !h->event_free || !h->get_minor ||
      init() != NVML_OK) {
    dlclose(h->lib);
    h->lib = NULL;
    return SPN_OK;
  }
  if (set_create(&h->set) != NVML_OK)
    h->set = NULL;
  for (uint32_t i = 0; i < n; i++) {
    if (!pci_bus_ids[i] || by_pci(pci_bus_ids[i], &h->handles[i]) != NVML_OK) {
      h->handles[i] = NULL;
      continue;
    }
    if (h->set)
      (void)reg(h->handles[i], NVML_EVENT_XID_CRITICAL, h->set);
  }
  return SPN_OK;
}

void spn__nvml_health_free(spn__nvml_health_t **hp) {
  if (!hp || !*hp)
    return;
  spn__nvml_health_t *h = *hp;
  if (h->lib) {
    if (h->set)
      h->event_free(h->set);
    h->shutdown();
    dlclose(h->lib);
  }
  free(h->handles);
  free(h->state);
  free(h->last_xid);
  free(h);
  *hp = NULL;
}

bool spn__nvml_health_available(const spn__nvml_health_t *h) { return h->lib != NULL; }

static uint32_t note_xid(spn__nvml_health_t *h, uint32_t i, unsigned long long xid) {
  uint32_t changed = 0;
  h->last_xid[i] = xid;
  if (spn__xid_fatal(xid))
    mark(h, i, SPN__NVML_XID_FATAL, &changed);
  return changed;
}

void spn__nvml_health_inject_xid(spn__nvml_health_t *h, uint32_t i, unsigned long long xid) {
  if (i < h->n)
    (void)note_xid(h, i, xid);
}

uint32_t spn__nvml_health_poll(spn__nvml_health_t *h) {
  uint32_t changed = 0;
  if (!h->lib)
    return 0;
  if (h->set) {
    nvml_event_data_t ev;
    /* timeout 0: return at once when nothing is pending. Bounded so a storm
     * of events cannot hold the loop. */
    for (int k = 0; k < 64; k++) {
      memset(&ev, 0, sizeof ev);
      if (h->event_wait(h->set, &ev, 0) != NVML_OK)
        break;
      if (!(ev.type & NVML_EVENT_XID_CRITICAL))
        continue;
      for (uint32_t i = 0; i < h->n; i++)
        if (h->handles[i] && h->handles[i] == ev.device)
          changed += note_xid(h, i, ev.data);
    }
  }
  for (uint32_t i = 0; i < h->n; i++) {
    unsigned minor = 0;
    if (h->handles[i] && h->get_minor(h->handles[i], &minor) == NVML_ERROR_GPU_IS_LOST)
      mark(h, i, SPN__NVML_LOST, &changed);
  }
  return changed;
}

spn__nvml_state_t spn__nvml_health_state(const spn__nvml_health_t *h, uint32_t i,
                                               unsigned long long *last_xid) {
  if (i >= h->n)
    return SPN__NVML_HEALTHY;
  if (last_xid)
    *last_xid = h->last_xid[i];
  return h->state[i];
}
