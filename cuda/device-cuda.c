/* device-cuda.c — the CUDA backend of the device layer (device-internal.h).
 *
 * Devices: "cuda" / "auto" open every device cudaGetDeviceCount reports,
 * "cuda:0,2" the listed ordinals. Each device's name is "cuda:N <product>".
 * Peer access is enabled between every pair of opened devices that supports
 * it, so device-to-device copies go over NVLink/PCIe P2P; other pairs are
 * staged by the driver (cudaMemcpyPeerAsync does either).
 *
 * Threads: every entry point makes its device current with cudaSetDevice
 * (cheap, per thread) for the call and gives the thread its previous device
 * back, so buffers may be allocated, copied and freed from any thread —
 * a GPU's executor that frees another GPU's buffer still launches on its
 * own GPU after. Streams are created on the device's executor thread
 * (executor.c), and creating one is the call that keeps its device: it
 * binds that thread to the device for the stage code it runs.
 *
 * Memory: SPN_MEM_DEVICE comes from the device's default memory pool
 * (cudaMallocAsync on a per-device allocation stream, then a sync on that
 * stream, so the pointer is usable on any stream when alloc returns); the
 * pool keeps freed blocks (release threshold raised to "keep everything")
 * so steady-state allocation does not reach the driver. SPN_MEM_PINNED is
 * cudaMallocHost, SPN_MEM_HOST plain aligned host memory.
 *
 * Freeing device memory is ordered after the work already queued on the
 * device: the last reference to a buffer is often dropped right after the
 * work that reads it was queued (an edge copy's source, a frame a stage's
 * kernels still read), and the pool must not hand that memory to another
 * allocation before that work has run. So dev_free records an event on every
 * stream made here (each has one, reused), makes the device's free stream
 * wait for them all, and frees there (cudaFreeAsync); the pool is told not
 * to reuse a block through an internal dependency on another stream
 * (cudaMemPoolReuseAllowInternalDependencies = 0), so an allocation never
 * waits for that chain either: it takes a block whose free has completed,
 * or new memory. Pinned and host memory are freed at once: drop their last
 * reference only once the work that uses them is complete (synchronise the
 * stream or an event first), as on the CPU.
 *
 * Health: a device found unhealthy (device-cuda-health.c, polled by the
 * runtime's loop) is marked unusable; from then on its allocations, streams,
 * copies and events fail with SPN_EDEVICE naming the device. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"
#include "../core/runtime/device-internal.h"

/* A stream made on the device, with the event dev_free records on it. */
typedef struct cu_stream {
  cudaStream_t s;
  cudaEvent_t fence;
  struct cu_stream *next;
} cu_stream_t;

typedef struct cuda_dev {
  int ordinal;
  cudaStream_t alloc_stream; /* cudaMallocAsync order */
  cudaStream_t free_stream;  /* cudaFreeAsync, after the fences of every stream */
  cudaMemPool_t pool;
  atomic_bool usable;
  pthread_mutex_t mu;        /* streams, and the fences while dev_free records them */
  cu_stream_t *streams;
} cuda_dev_t;

int32_t spn__cuda_error(spn_error_t *err, cudaError_t ce, const char *call, const char *file, int line) {
  (void)cudaGetLastError(); /* non-sticky errors would otherwise resurface in the next check */
  const char *base = strrchr(file, '/');
  return spn_error_set(err, SPN_ECUDA, "%s failed: %s (%s) at %s:%d", call, cudaGetErrorString(ce),
                       cudaGetErrorName(ce), base ? base + 1 : file, line);
}

static cuda_dev_t *cdev(spn_device_t *dev) { return dev->ctx; }

/* Make dev current on this thread; refuse a device marked unusable. */
static int32_t enter(spn_device_t *dev, spn_error_t *err) {
  cuda_dev_t *c = cdev(dev);
  if (!atomic_load_explicit(&c->usable, memory_order_acquire))
    return spn_error_set(err, SPN_EDEVICE, "%s: device marked unusable by the health monitor", dev->name);
  SPN_CUDA_CHECK(cudaSetDevice(c->ordinal), err);
  return SPN_OK;
}


int spn__cuda_device_ordinal(const spn_device_t *dev);

void spn__cuda_device_mark_unusable(spn_device_t *dev) {
  atomic_store_explicit(&cdev(dev)->usable, false, memory_order_release);
}
bool spn__cuda_device_usable(const spn_device_t *dev) {
  return atomic_load_explicit(&((cuda_dev_t *)dev->ctx)->usable, memory_order_acquire);
}
int spn__cuda_device_ordinal(const spn_device_t *dev) { return ((cuda_dev_t *)dev->ctx)->ordinal; }

/* Entry points make their device current (enter) for the call and then
 * give the calling thread its own back: a thread bound to one GPU (its
 * executor, whose stage launches kernels without naming a device) may free
 * or copy another GPU's buffer, and must still launch on its own GPU after.
 * cu_stream_new alone keeps the binding: it is what binds an executor. */
static int caller_device(void) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    d = -1;
  }
  return d;
}

static void restore_device(int d) {
  int now = -1;
  if (d >= 0 && cudaGetDevice(&now) == cudaSuccess && now != d && cudaSetDevice(d) != cudaSuccess)
    (void)cudaGetLastError();
}

/* ---- buffer types ---- */

static int32_t dev_alloc_on(spn_buffer_type_t *bt, size_t size, void **base, void **ctx, spn_error_t *err) {
  int32_t rc = enter(bt->device, err);
  if (rc != SPN_OK)
    return rc;
  cuda_dev_t *c = cdev(bt->device);
  void *p = NULL;
  cudaError_t me = cudaMallocFromPoolAsync(&p, size ? size : 1, c->pool, c->alloc_stream);
  if (me == cudaErrorMemoryAllocation) {
    /* Blocks whose free waits for queued work (dev_free) may be what is
     * missing: wait for those frees, then try once more. */
    (void)cudaGetLastError();
    if (cudaStreamSynchronize(c->free_stream) == cudaSuccess)
      me = cudaMallocFromPoolAsync(&p, size ? size : 1, c->pool, c->alloc_stream);
  }
  if (me == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return spn_error_set(err, SPN_ENOMEM, "%s: out of device memory allocating %zu bytes", bt->device->name, size);
  }
  if (me != cudaSuccess)
    return spn__cuda_error(err, me, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
  cudaError_t ce = cudaStreamSynchronize(c->alloc_stream);
  if (ce != cudaSuccess) {
    (void)cudaFreeAsync(p, c->alloc_stream);
    return spn__cuda_error(err, ce, "cudaStreamSynchronize(alloc_stream)", __FILE__, __LINE__);
  }
  *base = p;
  *ctx = NULL;
  return SPN_OK;
}

static int32_t dev_alloc(spn_buffer_type_t *bt, size_t size, void **base, void **ctx, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = dev_alloc_on(bt, size, base, ctx, err);
  restore_device(prev);
  return rc;
}

static void dev_free_on(spn_buffer_type_t *bt, void *base, void *ctx) {
  (void)ctx;
  cuda_dev_t *c = cdev(bt->device);
  /* Freeing must work on a device marked unusable too (drain). */
  if (cudaSetDevice(c->ordinal) == cudaSuccess) {
    /* After everything queued so far on the device's streams: a fence on
     * each, the free stream waits for them, the block is freed there. */
    pthread_mutex_lock(&c->mu);
    for (cu_stream_t *x = c->streams; x; x = x->next)
      if (cudaEventRecord(x->fence, x->s) == cudaSuccess)
        (void)cudaStreamWaitEvent(c->free_stream, x->fence, 0);
    pthread_mutex_unlock(&c->mu);
    (void)cudaFreeAsync(base, c->free_stream);
  }
  (void)cudaGetLastError();
}

static void dev_free(spn_buffer_type_t *bt, void *base, void *ctx) {
  int prev = caller_device();
  dev_free_on(bt, base, ctx);
  restore_device(prev);
}

static int32_t pinned_alloc_on(spn_buffer_type_t *bt, size_t size, void **base, void **ctx, spn_error_t *err) {
  int32_t rc = enter(bt->device, err);
  if (rc != SPN_OK)
    return rc;
  void *p = NULL;
  SPN_CUDA_CHECK(cudaMallocHost(&p, size ? size : 1), err);
  *base = p;
  *ctx = NULL;
  return SPN_OK;
}

static int32_t pinned_alloc(spn_buffer_type_t *bt, size_t size, void **base, void **ctx, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = pinned_alloc_on(bt, size, base, ctx, err);
  restore_device(prev);
  return rc;
}

static void pinned_free(spn_buffer_type_t *bt, void *base, void *ctx) {
  (void)bt;
  (void)ctx;
  (void)cudaFreeHost(base);
  (void)cudaGetLastError();
}

static int32_t host_alloc(spn_buffer_type_t *bt, size_t size, void **base, void **ctx, spn_error_t *err) {
  size_t rounded = (size + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (!p)
    return spn_error_set(err, SPN_ENOMEM, "%s: cannot allocate %zu bytes of host memory", bt->device->name, size);
  *base = p;
  *ctx = NULL;
  return SPN_OK;
}

static void host_free(spn_buffer_type_t *bt, void *base, void *ctx) {
  (void)bt;
  (void)ctx;
  free(base);
}

static const spn__buffer_type_iface_t bt_device = {.alloc = dev_alloc, .free = dev_free, .is_host = false};
static const spn__buffer_type_iface_t bt_host = {.alloc = host_alloc, .free = host_free, .is_host = true};
static const spn__buffer_type_iface_t bt_pinned = {.alloc = pinned_alloc, .free = pinned_free, .is_host = true};

/* ---- streams, copies, events ---- */

/* A stream's ctx is its cu_stream_t, listed on the device for dev_free. */
static int32_t cu_stream_new(spn_device_t *dev, void **native, void **ctx, spn_error_t *err) {
  int32_t rc = enter(dev, err);
  if (rc != SPN_OK)
    return rc;
  cuda_dev_t *c = cdev(dev);
  cu_stream_t *x = calloc(1, sizeof *x);
  if (!x)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory creating a stream", dev->name);
  cudaError_t ce = cudaStreamCreateWithFlags(&x->s, cudaStreamNonBlocking);
  if (ce == cudaSuccess && (ce = cudaEventCreateWithFlags(&x->fence, cudaEventDisableTiming)) != cudaSuccess)
    (void)cudaStreamDestroy(x->s);
  if (ce != cudaSuccess) {
    free(x);
    return spn__cuda_error(err, ce, "cudaStreamCreateWithFlags/cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  pthread_mutex_lock(&c->mu);
  x->next = c->streams;
  c->streams = x;
  pthread_mutex_unlock(&c->mu);
  *native = x->s;
  *ctx = x;
  return SPN_OK;
}

static void cu_stream_free_on(spn_device_t *dev, void *ctx) {
  cuda_dev_t *c = cdev(dev);
  cu_stream_t *x = ctx;
  pthread_mutex_lock(&c->mu);
  for (cu_stream_t **p = &c->streams; *p; p = &(*p)->next)
    if (*p == x) {
      *p = x->next;
      break;
    }
  pthread_mutex_unlock(&c->mu);
  if (cudaSetDevice(c->ordinal) == cudaSuccess) {
    (void)cudaEventDestroy(x->fence);
    (void)cudaStreamDestroy(x->s);
  }
  (void)cudaGetLastError();
  free(x);
}

static void cu_stream_free(spn_device_t *dev, void *ctx) {
  int prev = caller_device();
  cu_stream_free_on(dev, ctx);
  restore_device(prev);
}

static cudaStream_t native_stream(void *ctx) { return ((cu_stream_t *)ctx)->s; }

static int32_t cu_stream_sync_on(spn_device_t *dev, void *ctx, spn_error_t *err) {
  int32_t rc = enter(dev, err);
  if (rc != SPN_OK)
    return rc;
  SPN_CUDA_CHECK(cudaStreamSynchronize(native_stream(ctx)), err);
  return SPN_OK;
}

static int32_t cu_stream_sync(spn_device_t *dev, void *ctx, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = cu_stream_sync_on(dev, ctx, err);
  restore_device(prev);
  return rc;
}

static int buffer_ordinal(const spn_buffer_t *b) {
  const spn_device_t *d = b->bt->device;
  return (!b->bt->iface->is_host && d->kind == SPN_DEVICE_CUDA) ? ((const cuda_dev_t *)d->ctx)->ordinal : -1;
}

static int32_t cu_copy_on(spn_device_t *dev, void *stream_ctx, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                       size_t src_off, size_t size, spn_error_t *err) {
  int32_t rc = enter(dev, err);
  if (rc != SPN_OK)
    return rc;
  cudaStream_t s = native_stream(stream_ctx);
  void *d = (char *)dst->data + dst_off;
  const void *p = (const char *)src->data + src_off;
  int dord = buffer_ordinal(dst), sord = buffer_ordinal(src);
  if ((!dst->bt->iface->is_host && dord < 0) || (!src->bt->iface->is_host && sord < 0))
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: cannot copy from or to memory of %s", dev->name,
                         dord < 0 && !dst->bt->iface->is_host ? dst->bt->device->name : src->bt->device->name);
  if (dord >= 0 && sord >= 0 && dord != sord)
    SPN_CUDA_CHECK(cudaMemcpyPeerAsync(d, dord, p, sord, size, s), err);
  else
    /* Unified addressing: the runtime infers the direction from the pointers. */
    SPN_CUDA_CHECK(cudaMemcpyAsync(d, p, size, cudaMemcpyDefault, s), err);
  return SPN_OK;
}

static int32_t cu_copy(spn_device_t *dev, void *stream_ctx, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                       size_t src_off, size_t size, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = cu_copy_on(dev, stream_ctx, dst, dst_off, src, src_off, size, err);
  restore_device(prev);
  return rc;
}

static int32_t cu_event_new_on(spn_device_t *dev, unsigned flags, void **ctx, spn_error_t *err) {
  int32_t rc = enter(dev, err);
  if (rc != SPN_OK)
    return rc;
  cudaEvent_t e = NULL;
  SPN_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags), err);
  *ctx = e;
  return SPN_OK;
}

static int32_t cu_event_new_flags(spn_device_t *dev, unsigned flags, void **ctx, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = cu_event_new_on(dev, flags, ctx, err);
  restore_device(prev);
  return rc;
}

static int32_t cu_event_new(spn_device_t *dev, void **ctx, spn_error_t *err) {
  return cu_event_new_flags(dev, cudaEventDisableTiming, ctx, err);
}

/* Timed events: the runtime's stream time per stage (actor.c). */
static int32_t cu_event_new_timed(spn_device_t *dev, void **ctx, spn_error_t *err) {
  return cu_event_new_flags(dev, cudaEventDefault, ctx, err);
}

static int32_t cu_event_elapsed(spn_device_t *dev, void *a, void *b, bool wait, uint64_t *ns, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = enter(dev, err);
  cudaError_t ce = cudaSuccess;
  if (rc == SPN_OK) {
    ce = wait ? cudaEventSynchronize((cudaEvent_t)b) : cudaEventQuery((cudaEvent_t)b);
    if (ce == cudaErrorNotReady) {
      (void)cudaGetLastError();
      rc = SPN_EAGAIN;
    } else if (ce != cudaSuccess) {
      rc = spn__cuda_error(err, ce, wait ? "cudaEventSynchronize(timed)" : "cudaEventQuery(timed)", __FILE__,
                           __LINE__);
    } else {
      float ms = 0;
      if ((ce = cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b)) != cudaSuccess)
        rc = spn__cuda_error(err, ce, "cudaEventElapsedTime", __FILE__, __LINE__);
      else
        *ns = ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
    }
  }
  restore_device(prev);
  return rc;
}

static void cu_event_free_on(spn_device_t *dev, void *ctx) {
  if (cudaSetDevice(cdev(dev)->ordinal) == cudaSuccess)
    (void)cudaEventDestroy((cudaEvent_t)ctx);
  (void)cudaGetLastError();
}

static void cu_event_free(spn_device_t *dev, void *ctx) {
  int prev = caller_device();
  cu_event_free_on(dev, ctx);
  restore_device(prev);
}

static int32_t cu_event_record_on(spn_device_t *dev, void *ev, void *s, spn_error_t *err) {
  int32_t rc = enter(dev, err);
  if (rc != SPN_OK)
    return rc;
  SPN_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, native_stream(s)), err);
  return SPN_OK;
}

static int32_t cu_event_record(spn_device_t *dev, void *ev, void *s, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = cu_event_record_on(dev, ev, s, err);
  restore_device(prev);
  return rc;
}

static int32_t cu_event_sync_on(spn_device_t *dev, void *ev, spn_error_t *err) {
  int32_t rc = enter(dev, err);
  if (rc != SPN_OK)
    return rc;
  SPN_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev), err);
  return SPN_OK;
}

static int32_t cu_event_sync(spn_device_t *dev, void *ev, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = cu_event_sync_on(dev, ev, err);
  restore_device(prev);
  return rc;
}

static int32_t cu_stream_wait_on(spn_device_t *dev, void *s, void *ev, spn_error_t *err) {
  int32_t rc = enter(dev, err);
  if (rc != SPN_OK)
    return rc;
  SPN_CUDA_CHECK(cudaStreamWaitEvent(native_stream(s), (cudaEvent_t)ev, 0), err);
  return SPN_OK;
}

static int32_t cu_stream_wait(spn_device_t *dev, void *s, void *ev, spn_error_t *err) {
  int prev = caller_device();
  int32_t rc = cu_stream_wait_on(dev, s, ev, err);
  restore_device(prev);
  return rc;
}

static void cu_dev_free(spn_device_t *dev) {
  cuda_dev_t *c = cdev(dev);
  if (c) {
    if (cudaSetDevice(c->ordinal) == cudaSuccess) {
      cudaStream_t own[2] = {c->alloc_stream, c->free_stream};
      for (int i = 0; i < 2; i++)
        if (own[i]) {
          (void)cudaStreamSynchronize(own[i]);
          (void)cudaStreamDestroy(own[i]);
        }
    }
    (void)cudaGetLastError();
    pthread_mutex_destroy(&c->mu);
    free(c);
  }
  free(dev);
}

static const spn__device_iface_t cuda_iface = {
    .free = cu_dev_free,
    .stream_new = cu_stream_new,
    .stream_free = cu_stream_free,
    .stream_sync = cu_stream_sync,
    .copy = cu_copy,
    .event_new = cu_event_new,
    .event_free = cu_event_free,
    .event_record = cu_event_record,
    .event_sync = cu_event_sync,
    .stream_wait_event = cu_stream_wait,
    .event_new_timed = cu_event_new_timed,
    .event_elapsed = cu_event_elapsed,
};

/* ---- enumeration ---- */

static int32_t device_count(int *n, spn_error_t *err) {
  *n = 0;
  SPN_CUDA_CHECK(cudaGetDeviceCount(n), err);
  return SPN_OK;
}

static int32_t cuda_probe(void) {
  int n = 0;
  if (device_count(&n, NULL) != SPN_OK)
    return 0;
  return n;
}

static int32_t open_one(int ordinal, spn_device_t **out, spn_error_t *err) {
  spn_device_t *d = calloc(1, sizeof *d);
  cuda_dev_t *c = calloc(1, sizeof *c);
  if (!d || !c) {
    free(d);
    free(c);
    return spn_error_set(err, SPN_ENOMEM, "out of memory opening cuda:%d", ordinal);
  }
  c->ordinal = ordinal;
  atomic_init(&c->usable, true);
  pthread_mutex_init(&c->mu, NULL);
  d->iface = &cuda_iface;
  d->kind = SPN_DEVICE_CUDA;
  d->ctx = c;
  d->bt[SPN_MEM_DEVICE] = (spn_buffer_type_t){.iface = &bt_device, .device = d, .mem_kind = SPN_MEM_DEVICE};
  d->bt[SPN_MEM_HOST] = (spn_buffer_type_t){.iface = &bt_host, .device = d, .mem_kind = SPN_MEM_HOST};
  d->bt[SPN_MEM_PINNED] = (spn_buffer_type_t){.iface = &bt_pinned, .device = d, .mem_kind = SPN_MEM_PINNED};
  *out = d; /* cu_dev_free undoes everything below */
  struct cudaDeviceProp prop;
  SPN_CUDA_CHECK(cudaSetDevice(ordinal), err);
  SPN_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal), err);
  snprintf(d->name, sizeof d->name, "cuda:%d %.100s", ordinal, prop.name);
  SPN_CUDA_CHECK(cudaStreamCreateWithFlags(&c->alloc_stream, cudaStreamNonBlocking), err);
  SPN_CUDA_CHECK(cudaStreamCreateWithFlags(&c->free_stream, cudaStreamNonBlocking), err);
  SPN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&c->pool, ordinal), err);
  /* Keep freed blocks in the pool instead of returning them at every sync. */
  uint64_t keep = UINT64_MAX;
  SPN_CUDA_CHECK(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep), err);
  /* A block freed on the free stream is reused once its free has run, never
   * by making the allocation wait for it (dev_free's comment). */
  int no = 0;
  SPN_CUDA_CHECK(cudaMemPoolSetAttribute(c->pool, cudaMemPoolReuseAllowInternalDependencies, &no), err);
  return SPN_OK;
}

/* spec: "" (every device) or a comma-separated list of ordinals "0,1". */
static int32_t cuda_open(const char *spec, spn_device_t ***devs, uint32_t *n, spn_error_t *err) {
  int count = 0;
  spn_error_t cerr = {0};
  if (device_count(&count, &cerr) != SPN_OK)
    return spn_error_set(err, SPN_EDEVICE, "devices \"cuda%s%s\": no CUDA device available: %s", *spec ? ":" : "",
                         spec, cerr.msg);
  if (count <= 0)
    return spn_error_set(err, SPN_EDEVICE, "devices \"cuda%s%s\": no CUDA device available (0 devices found)",
                         *spec ? ":" : "", spec);
  int ords[64];
  uint32_t k = 0;
  if (!*spec) {
    for (int i = 0; i < count && i < 64; i++)
      ords[k++] = i;
  } else {
    const char *p = spec;
    while (*p) {
      char *end = NULL;
      errno = 0;
      long v = strtol(p, &end, 10);
      if (errno || end == p || (*end && *end != ',') || v < 0 || k >= 64)
        return spn_error_set(err, SPN_ECONFIG, "devices \"cuda:%s\": expected a comma-separated list of device "
                             "ordinals at offset %zu", spec, (size_t)(p - spec));
      if (v >= count)
        return spn_error_set(err, SPN_EDEVICE, "devices \"cuda:%s\": device %ld does not exist (%d CUDA device%s)",
                             spec, v, count, count == 1 ? "" : "s");
      for (uint32_t j = 0; j < k; j++)
        if (ords[j] == (int)v)
          return spn_error_set(err, SPN_ECONFIG, "devices \"cuda:%s\": device %ld listed twice", spec, v);
      ords[k++] = (int)v;
      p = *end ? end + 1 : end;
      if (*end == ',' && !*p)
        return spn_error_set(err, SPN_ECONFIG, "devices \"cuda:%s\": trailing comma", spec);
    }
  }
  spn_device_t **arr = calloc(k, sizeof *arr);
  if (!arr)
    return spn_error_set(err, SPN_ENOMEM, "out of memory opening CUDA devices");
  int32_t rc = SPN_OK;
  for (uint32_t i = 0; i < k; i++) {
    if ((rc = open_one(ords[i], &arr[i], err)) != SPN_OK) {
      spn__devices_free(&arr, k);
      return rc;
    }
    arr[i]->index = (int32_t)i;
  }
  /* Peer access between every capable pair (best effort: failure only means
   * copies are staged through the host). */
  for (uint32_t i = 0; i < k; i++)
    for (uint32_t j = 0; j < k; j++) {
      int can = 0;
      if (i == j || cudaDeviceCanAccessPeer(&can, ords[i], ords[j]) != cudaSuccess || !can)
        continue;
      if (cudaSetDevice(ords[i]) == cudaSuccess)
        (void)cudaDeviceEnablePeerAccess(ords[j], 0);
    }
  (void)cudaGetLastError(); /* cudaErrorPeerAccessAlreadyEnabled is fine */
  *devs = arr;
  *n = k;
  return SPN_OK;
}

static const spn__backend_t cuda_backend = {
    .kind_name = "cuda", .kind = SPN_DEVICE_CUDA, .probe = cuda_probe, .open = cuda_open};

const spn__backend_t *spn__backend_cuda(void) { return &cuda_backend; }
