/* device-internal.h — the backend vtable behind spindle/device.h.
 *
 * A backend (CPU here, CUDA in cuda/) fills a spn__backend_t: it enumerates
 * its devices from a spec ("cpu:4", "cuda:0,1") and gives each device an
 * interface for buffer types, streams and events. The core never calls a
 * backend API directly: spn__devices_open consults the `extra` backends it
 * is given (before the CPU one), so a CUDA backend built in cuda/ is wired
 * by handing its spn__backend_t to spn__devices_open in spn_runtime_new. */
#ifndef SPINDLE_DEVICE_INTERNAL_H
#define SPINDLE_DEVICE_INTERNAL_H

#include <stdatomic.h>

#include "spindle/device.h"

typedef struct spn__buffer_type_iface {
  /* Allocate size bytes: *base is the data pointer, *ctx backend state. */
  int32_t (*alloc)(spn_buffer_type_t *bt, size_t size, void **base, void **ctx, spn_error_t *err);
  void (*free)(spn_buffer_type_t *bt, void *base, void *ctx);
  bool is_host;
} spn__buffer_type_iface_t;

struct spn_buffer_type {
  const spn__buffer_type_iface_t *iface;
  spn_device_t *device;
  int32_t mem_kind;
  void *ctx;
};

struct spn_buffer {
  atomic_int refs;
  spn_buffer_type_t *bt;
  void *data;
  size_t size;
  void *ctx;
  spn_event_t *ready; /* NULL: complete (see spn_buffer_set_ready) */
};

typedef struct spn__device_iface {
  void (*free)(spn_device_t *dev);
  int32_t (*stream_new)(spn_device_t *dev, void **native, void **ctx, spn_error_t *err);
  void (*stream_free)(spn_device_t *dev, void *ctx);
  int32_t (*stream_sync)(spn_device_t *dev, void *ctx, spn_error_t *err);
  /* Copy between buffers; either may be on the host. */
  int32_t (*copy)(spn_device_t *dev, void *stream_ctx, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                  size_t src_off, size_t size, spn_error_t *err);
  int32_t (*event_new)(spn_device_t *dev, void **ctx, spn_error_t *err);
  void (*event_free)(spn_device_t *dev, void *ctx);
  int32_t (*event_record)(spn_device_t *dev, void *ev_ctx, void *stream_ctx, spn_error_t *err);
  int32_t (*event_sync)(spn_device_t *dev, void *ev_ctx, spn_error_t *err);
  int32_t (*stream_wait_event)(spn_device_t *dev, void *stream_ctx, void *ev_ctx, spn_error_t *err);
  /* Timing (spn__event_new_timed, spn__event_elapsed): an event that can be
   * timed (freed and recorded as any other), and the device time from
   * `start` to `end` once both are complete: SPN_OK with *ns, SPN_EAGAIN
   * while `end` is not reached and !wait. NULL: the device cannot time. */
  int32_t (*event_new_timed)(spn_device_t *dev, void **ctx, spn_error_t *err);
  int32_t (*event_elapsed)(spn_device_t *dev, void *start_ctx, void *end_ctx, bool wait, uint64_t *ns,
                           spn_error_t *err);
} spn__device_iface_t;

struct spn_device {
  const spn__device_iface_t *iface;
  int32_t kind;  /* spn_device_kind_t */
  int32_t index; /* within the kind */
  char name[128];
  spn_buffer_type_t bt[3]; /* indexed by spn_mem_kind_t */
  void *ctx;
  /* Bytes of edge copies (core/runtime/edge-mem.c) this device's streams
   * ran, by spn_copy_dir_t: for metrics. */
  _Atomic uint64_t copied[4];
};

struct spn_stream {
  spn_device_t *dev;
  void *native;
  void *ctx;
};

struct spn_event {
  spn_device_t *dev;
  void *ctx;
};

/* Stream time (the runtime's per-stage stream time, actor.c): a timed
 * event, recorded with spn_event_record and freed with spn_event_free;
 * SPN_EUNSUPPORTED where the device cannot time. */
int32_t spn__event_new_timed(spn_device_t *dev, spn_event_t **out, spn_error_t *err);
/* Device time between two timed events of one device recorded in that
 * order: SPN_OK with *ns; SPN_EAGAIN when `end` is not complete and !wait
 * (wait: block until it is). */
int32_t spn__event_elapsed(spn_event_t *start, spn_event_t *end, bool wait, uint64_t *ns, spn_error_t *err);

/* A backend: opens the devices a spec names. `spec` is the part after the
 * kind ("4" of "cpu:4", "0,1" of "cuda:0,1", "" for all). */
typedef struct spn__backend {
  const char *kind_name; /* "cpu", "cuda" */
  int32_t kind;
  /* Number of devices present (CPU: 1). */
  int32_t (*probe)(void);
  int32_t (*open)(const char *spec, spn_device_t ***devs, uint32_t *n, spn_error_t *err);
} spn__backend_t;

const spn__backend_t *spn__backend_cpu(void);

/* Open the devices `spec` names ("auto", "cpu", "cpu:4", "cuda", "cuda:0,1").
 * `extra` backends (may be NULL) are consulted before the CPU one.
 * Ownership: caller owns the array and devices (spn__devices_free). */
int32_t spn__devices_open(const char *spec, const spn__backend_t *const *extra, size_t n_extra,
                          spn_device_t ***devs, uint32_t *n, spn_error_t *err);
void spn__devices_free(spn_device_t ***devs, uint32_t n);

/* Defined only when libspindle is built with CUDA (SPN_HAVE_CUDA; cuda/). */
const spn__backend_t *spn__backend_cuda(void);
/* The PCI bus id of a CUDA device ("0000:17:00.0"), what the NVML health
 * poller knows it by; SPN_EDEVICE when the driver cannot say. */
int32_t spn__cuda_device_pci_bus_id(const spn_device_t *dev, char *buf, size_t size, spn_error_t *err);
/* A drained (quarantined) CUDA device: its allocations, streams, copies and
 * events then fail with SPN_EDEVICE. */
void spn__cuda_device_mark_unusable(spn_device_t *dev);
bool spn__cuda_device_usable(const spn_device_t *dev);

#endif
