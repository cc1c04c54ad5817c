/* device-cpu.c — the CPU backend: the numeric reference device.
 *
 * Memory is 64-byte aligned host memory for all three buffer types (there is
 * nothing to pin). Streams run work when it is issued, on the calling
 * thread, so stream order is program order and events are complete as soon
 * as they are recorded. "cpu:N" opens N devices that are all this same CPU:
 * each gets its own executor thread in the runtime, which is how the
 * multi-device fan-out and re-ordering logic is exercised without GPUs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device-internal.h"

static int32_t cpu_alloc(spn_buffer_type_t *bt, size_t size, void **base, void **ctx, spn_error_t *err) {
  size_t rounded = (size + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (!p)
    return spn_error_set(err, SPN_ENOMEM, "%s: cannot allocate %zu bytes", bt->device->name, size);
  *base = p;
  *ctx = NULL;
  return SPN_OK;
}

static void cpu_free(spn_buffer_type_t *bt, void *base, void *ctx) {
  (void)bt;
  (void)ctx;
  free(base);
}

static const spn__buffer_type_iface_t cpu_bt_iface = {.alloc = cpu_alloc, .free = cpu_free, .is_host = true};

static void cpu_dev_free(spn_device_t *dev) { free(dev); }

static int32_t cpu_stream_new(spn_device_t *dev, void **native, void **ctx, spn_error_t *err) {
  (void)dev;
  (void)err;
  *native = NULL;
  *ctx = NULL;
  return SPN_OK;
}
static void cpu_stream_free(spn_device_t *dev, void *ctx) {
  (void)dev;
  (void)ctx;
}
static int32_t cpu_stream_sync(spn_device_t *dev, void *ctx, spn_error_t *err) {
  (void)dev;
  (void)ctx;
  (void)err;
  return SPN_OK;
}

static int32_t cpu_copy(spn_device_t *dev, void *stream_ctx, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                        size_t src_off, size_t size, spn_error_t *err) {
  (void)stream_ctx;
  if (!dst->bt->iface->is_host || !src->bt->iface->is_host)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: cannot copy from or to non-host memory", dev->name);
  memmove((char *)dst->data + dst_off, (const char *)src->data + src_off, size);
  return SPN_OK;
}

static int32_t cpu_event_new(spn_device_t *dev, void **ctx, spn_error_t *err) {
  (void)dev;
  (void)err;
  *ctx = NULL;
  return SPN_OK;
}
/* A timed event is the time it was recorded at: the work before it has run
 * by then (streams run work as it is issued). Plain events carry nothing. */
static int32_t cpu_event_new_timed(spn_device_t *dev, void **ctx, spn_error_t *err) {
  uint64_t *t = calloc(1, sizeof *t);
  if (!t)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory creating an event", dev->name);
  *ctx = t;
  return SPN_OK;
}
static void cpu_event_free(spn_device_t *dev, void *ctx) {
  (void)dev;
  free(ctx);
}
static int32_t cpu_event_record(spn_device_t *dev, void *ev, void *s, spn_error_t *err) {
  (void)dev;
  (void)s;
  (void)err;
  if (ev) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *(uint64_t *)ev = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  }
  return SPN_OK;
}
static int32_t cpu_event_elapsed(spn_device_t *dev, void *a, void *b, bool wait, uint64_t *ns, spn_error_t *err) {
  (void)wait;
  if (!a || !b)
    return spn_error_set(err, SPN_EINVAL, "%s: an event that was not made timed", dev->name);
  uint64_t t0 = *(uint64_t *)a, t1 = *(uint64_t *)b;
  *ns = t1 > t0 ? t1 - t0 : 0;
  return SPN_OK;
}
static int32_t cpu_event_sync(spn_device_t *dev, void *ev, spn_error_t *err) {
  (void)dev;
  (void)ev;
  (void)err;
  return SPN_OK;
}
static int32_t cpu_stream_wait(spn_device_t *dev, void *s, void *ev, spn_error_t *err) {
  (void)dev;
  (void)s;
  (void)ev;
  (void)err;
  return SPN_OK;
}

static const spn__device_iface_t cpu_iface = {
    .free = cpu_dev_free,
    .stream_new = cpu_stream_new,
    .stream_free = cpu_stream_free,
    .stream_sync = cpu_stream_sync,
    .copy = cpu_copy,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .event_sync = cpu_event_sync,
    .stream_wait_event = cpu_stream_wait,
    .event_new_timed = cpu_event_new_timed,
    .event_elapsed = cpu_event_elapsed,
};

static int32_t cpu_probe(void) { return 1; }

/* spec: "" (one device) or a count "4" (1..64). */
static int32_t cpu_open(const char *spec, spn_device_t ***devs, uint32_t *n, spn_error_t *err) {
  long count = 1;
  if (spec && *spec) {
    char *end = NULL;
    errno = 0;
    count = strtol(spec, &end, 10);
    if (errno || !end || *end || count < 1 || count > 64)
      return spn_error_set(err, SPN_ECONFIG, "devices \"cpu:%s\": expected a device count from 1 to 64", spec);
  }
  spn_device_t **arr = calloc((size_t)count, sizeof *arr);
  if (!arr)
    return spn_error_set(err, SPN_ENOMEM, "out of memory opening CPU devices");
  for (long i = 0; i < count; i++) {
    spn_device_t *d = calloc(1, sizeof *d);
    if (!d) {
      spn__devices_free(&arr, (uint32_t)count);
      return spn_error_set(err, SPN_ENOMEM, "out of memory opening CPU devices");
    }
    d->iface = &cpu_iface;
    d->kind = SPN_DEVICE_CPU;
    d->index = (int32_t)i;
    snprintf(d->name, sizeof d->name, "cpu:%ld", i);
    for (int k = 0; k < 3; k++)
      d->bt[k] = (spn_buffer_type_t){.iface = &cpu_bt_iface, .device = d, .mem_kind = k};
    arr[i] = d;
  }
  *devs = arr;
  *n = (uint32_t)count;
  return SPN_OK;
}

static const spn__backend_t cpu_backend = {
    .kind_name = "cpu", .kind = SPN_DEVICE_CPU, .probe = cpu_probe, .open = cpu_open};

const spn__backend_t *spn__backend_cpu(void) { return &cpu_backend; }
