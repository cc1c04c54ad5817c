/* cuda-fake.cpp — the CUDA runtime API over host memory, for the programs
 * that run the CUDA engine backend without a GPU (engine-cuda-host,
 * spindle-emu; tests/gpu/host-emu/README). It defines the real API's symbols
 * (declared by the toolkit's cuda_runtime_api.h, so the signatures are
 * checked) and is linked instead of libcudart.
 *
 *  - Devices: SPN_EMU_CUDA_DEVICES of them (default 1), each with
 *    SPN_EMU_CUDA_MEM_MB of memory (default 4096, fractions allowed): an
 *    allocation past that
 *    is cudaErrorMemoryAllocation, as on a full GPU.
 *  - Memory: device and pinned blocks are host blocks kept in a registry;
 *    a copy whose kind says a side is device memory checks that it lies in
 *    one device (or pinned) block, and fails with cudaErrorInvalidValue and
 *    a line on stderr when it does not, so host and device pointers mixed up
 *    by the caller are caught where the real runtime would refuse them. A
 *    kernel launch given a pointer argument outside device and pinned memory
 *    does not run and leaves cudaErrorIllegalAddress as the last error, as
 *    the fault would.
 *  - Device memory is not host memory: each device block is its own
 *    mapping, kept PROT_NONE except while the fake itself works on the
 *    device's behalf (a copy, a memset, a kernel, a cuDNN or cuBLASLt call,
 *    a graph replay), so host code that dereferences a device pointer stops
 *    at once with SIGSEGV, as it would on a GPU. SPN_EMU_CUDA_STRICT=0 keeps
 *    device memory readable instead (pinned memory always is). A guard page
 *    follows each block, which ends less than 256 bytes before it (CUDA's
 *    alignment), so a kernel or library call running past a block's end
 *    faults too.
 *  - Streams: work runs at once, in call order; events, waits and
 *    synchronisations succeed. With SPN_EMU_CUDA_LAZY=1 a stream's work is
 *    queued instead and runs only when something waits for it: a
 *    synchronisation of the stream, its event or the device, a stream that
 *    waits for one of its events running, a copy to pageable memory (which
 *    CUDA completes before returning; one from pageable memory is staged at
 *    the call), cudaFree; a cudaFreeAsync runs its stream's queue at once,
 *    so the block goes as early as the stream's waits allow. Host code that
 *    reads a result it did not wait for sees stale memory, work another
 *    stream did not wait for has not happened, and a free not ordered after
 *    the work using the block unmaps it under that work (a fault).
 *  - CUDA Graphs: a stream capturing records its work (copies, memsets,
 *    kernel launches, host functions, the fake cuDNN and cuBLASLt calls)
 *    instead of running it; the graph replays the records at each launch,
 *    reading the memory then, as a graph does. In capture mode global or
 *    thread-local, the calls CUDA forbids during a capture (cudaMalloc,
 *    synchronous copies and memsets, synchronising the capturing stream or
 *    the device, a copy to or from pageable host memory) fail with
 *    cudaErrorStreamCaptureUnsupported and invalidate the capture, whose end
 *    is then cudaErrorStreamCaptureInvalidated. A stream outside a capture
 *    that waits for an event recorded into it joins it in CUDA (its later
 *    work becomes graph nodes): the fake complains, and the capture's end
 *    is cudaErrorStreamCaptureUnjoined. spn_emu_stream_captures(s) counts
 *    the captures begun on s.
 *  - SPN_EMU_CUDA_TRACE=1 prints each capture's end and each graph launch
 *    on stderr (what a test can grep to see that graphs were replayed).
 *  - Errors: the last error of each thread, returned and cleared by
 *    cudaGetLastError, as in CUDA (none is sticky here).
 *  - SPN_EMU_CUDA_STATS=FILE appends, at the process's exit, one line of
 *    counts of what costs host time on a GPU: device and pinned
 *    allocations and frees, host synchronisations (stream, event, device;
 *    queries apart), blocking copies, asynchronous copies (and how many of
 *    them had a pageable host side, which CUDA stages or completes before
 *    returning), kernel launches, graph launches, event records and
 *    stream waits for an event. Running a pipeline on
 *    N and 2N frames and taking the difference gives the counts per frame
 *    (tests/gpu/host-emu/README, "Counting what a frame costs").
 *
 * Test code only. Thread-safe: one lock over the registry and the graphs;
 * work itself runs on the calling thread. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include <cuda_runtime_api.h>

#include "fake-internal.h"

namespace {

/* SPN_EMU_CUDA_STATS: the counters, and their report at exit. */
enum emu_stat {
  ST_ALLOC, ST_FREE, ST_PINNED_ALLOC, ST_PINNED_FREE, ST_SYNC, ST_QUERY, ST_COPY_BLOCKING, ST_COPY_ASYNC,
  ST_COPY_PAGEABLE, ST_KERNEL, ST_GRAPH, ST_EVENT_RECORD, ST_STREAM_WAIT, ST_N
};
const char *const stat_names[ST_N] = {"device_alloc", "device_free", "pinned_alloc", "pinned_free", "host_sync",
                                      "query", "copy_blocking", "copy_async", "copy_async_pageable",
                                      "kernel_launch", "graph_launch", "event_record", "stream_wait"};
std::atomic<long long> stats[ST_N];

struct stats_report {
  ~stats_report() {
    const char *path = getenv("SPN_EMU_CUDA_STATS");
    if (!path || !*path)
      return;
    FILE *f = fopen(path, "a");
    if (!f)
      return;
    fprintf(f, "pid=%ld", (long)getpid());
    for (int i = 0; i < ST_N; i++)
      fprintf(f, " %s=%lld", stat_names[i], stats[i].load());
    fprintf(f, "\n");
    fclose(f);
  }
} report_at_exit;

void count(emu_stat k) { stats[k]++; }

struct emu_block {
  size_t size;
  int dev;      /* -1: pinned host memory */
  char *map;    /* device blocks: the mapping, data pages then a guard page */
  size_t pages; /* bytes of data pages */
};

struct emu_stream {
  int dev;
  std::vector<std::function<void()>> *cap; /* recording a graph */
  bool invalid;                            /* the capture hit a forbidden call */
  bool unjoined; /* another stream joined the capture (a wait on one of its events) and never rejoined */
  int captures = 0; /* captures begun on this stream (spn_emu_stream_captures) */
  cudaStreamCaptureMode mode;
  /* Lazy mode: work queued, not yet run; submitted - done of it. */
  std::deque<std::function<void()>> q;
  uint64_t submitted, done;
  uint64_t serial = 0; /* unique per stream made (0: the legacy stream) */
};

struct emu_event {
  emu_stream *s;   /* the stream of the last record (null: never recorded) */
  uint64_t pos;    /* that stream's work at the record */
  uint64_t serial; /* s's serial: s may be destroyed (and its address reused) since */
  emu_stream *capture = nullptr; /* recorded into this stream's capture (a node of its graph) */
  int capture_no = 0;            /* which of that stream's captures */
  bool timing = true;            /* not made with cudaEventDisableTiming */
  double t_ms = 0;               /* host time of the last record (the work before it has run by then) */
};

struct emu_graph {
  std::vector<std::function<void()>> ops;
};

std::mutex lock;
std::map<uintptr_t, emu_block> blocks;
std::vector<size_t> used; /* bytes per device */
emu_stream legacy = {0, nullptr, false, false, 0, cudaStreamCaptureModeGlobal, {}, 0, 0};
std::set<emu_stream *> streams;     /* every stream made, under lock */
uint64_t stream_serial;             /* the last stream's serial, under lock */
std::set<emu_event *> events;       /* every event made, under lock */
std::recursive_mutex exec_lock;     /* one thread runs queued work at a time */
thread_local int current_dev;
thread_local cudaError_t last_error = cudaSuccess;
thread_local int capturing; /* captures this thread began (thread-local / global mode) */
int device_access;          /* fake operations under way (any thread), under lock */

/* SPN_EMU_CUDA_LAZY=1: a stream's work runs only when something waits for
 * it (README). */
bool lazy() {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("SPN_EMU_CUDA_LAZY");
    on = e && *e && strcmp(e, "0");
  }
  return on;
}

bool strict() {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("SPN_EMU_CUDA_STRICT");
    on = !(e && !strcmp(e, "0"));
  }
  return on;
}

size_t page_round(size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return n ? (n + pg - 1) / pg * pg : pg;
}

/* The protection of every device block follows device_access; under lock. */
void protect_all(int prot);
int global_captures;        /* captures in global mode, any thread */

bool tracing() {
  const char *e = getenv("SPN_EMU_CUDA_TRACE");
  return e && *e && strcmp(e, "0");
}

int n_devices() {
  const char *e = getenv("SPN_EMU_CUDA_DEVICES");
  int n = e && *e ? atoi(e) : 1;
  return n < 0 ? 0 : n;
}

size_t dev_mem() {
  const char *e = getenv("SPN_EMU_CUDA_MEM_MB");
  return (size_t)((e && *e ? atof(e) : 4096.0) * (1 << 20));
}

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess)
    last_error = e;
  return e;
}

emu_stream *stream_of(cudaStream_t s) {
  if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
    return &legacy;
  return (emu_stream *)s;
}

/* A call CUDA forbids while this thread (or, in global mode, any thread)
 * captures: fails, and invalidates the captures this thread began. */
bool capture_forbids(const char *what) {
  std::lock_guard<std::mutex> g(lock);
  if (!capturing && !global_captures)
    return false;
  spn_emu_complain("%s during a stream capture", what);
  return true;
}

std::vector<emu_stream *> live_captures; /* under lock */

void invalidate_captures() {
  std::lock_guard<std::mutex> g(lock);
  for (emu_stream *s : live_captures)
    s->invalid = true;
}

cudaError_t forbidden(const char *what) {
  if (!capture_forbids(what))
    return cudaSuccess;
  invalidate_captures();
  return ret(cudaErrorStreamCaptureUnsupported);
}

/* The block holding [p, p + n), or null; under lock. */
const emu_block *find_block(const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  auto it = blocks.upper_bound(a);
  if (it == blocks.begin())
    return nullptr;
  --it;
  if (a < it->first || a + n > it->first + it->second.size || (n == 0 && a >= it->first + it->second.size))
    return nullptr;
  return &it->second;
}

bool is_device_or_pinned(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(lock);
  return find_block(p, n) != nullptr;
}

cudaError_t dev_alloc(void **p, size_t size, int dev) {
  if (!p)
    return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(lock);
  if (used.empty())
    used.assign((size_t)n_devices() + 1, 0);
  if (dev < 0 || dev >= n_devices())
    return ret(cudaErrorInvalidDevice);
  if (size > dev_mem() - used[dev]) {
    *p = nullptr;
    return ret(cudaErrorMemoryAllocation);
  }
  int prot = !strict() || device_access ? PROT_READ | PROT_WRITE : PROT_NONE;
  /* The block ends as near its last data page's end as CUDA's 256-byte
   * alignment allows, before a guard page that is never accessible. */
  size_t pages = page_round(size), pg = (size_t)sysconf(_SC_PAGESIZE);
  char *map = (char *)mmap(nullptr, pages + pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) {
    *p = nullptr;
    return ret(cudaErrorMemoryAllocation);
  }
  if (prot != PROT_NONE)
    mprotect(map, pages, prot);
  char *q = map + ((pages - size) & ~(size_t)255);
  used[dev] += size;
  blocks[(uintptr_t)q] = emu_block{size, dev, map, pages};
  *p = q;
  return cudaSuccess;
}

cudaError_t block_free(void *p, bool pinned) {
  if (!p)
    return cudaSuccess;
  std::lock_guard<std::mutex> g(lock);
  auto it = blocks.find((uintptr_t)p);
  if (it == blocks.end() || (it->second.dev < 0) != pinned) {
    spn_emu_complain("freeing %p, not the start of a %s block", p, pinned ? "pinned" : "device");
    return ret(cudaErrorInvalidValue);
  }
  emu_block b = it->second;
  blocks.erase(it);
  if (b.dev >= 0) {
    used[b.dev] -= b.size;
    munmap(b.map, b.pages + (size_t)sysconf(_SC_PAGESIZE));
  } else {
    free(p);
  }
  return cudaSuccess;
}

void protect_all(int prot) {
  for (const auto &b : blocks)
    if (b.second.dev >= 0)
      mprotect(b.second.map, b.second.pages, prot);
}

/* Device memory readable and writable for the duration of fn. */
template <class F> void with_device_access(F fn) {
  if (!strict()) {
    fn();
    return;
  }
  {
    std::lock_guard<std::mutex> g(lock);
    if (device_access++ == 0)
      protect_all(PROT_READ | PROT_WRITE);
  }
  fn();
  std::lock_guard<std::mutex> g(lock);
  if (--device_access == 0)
    protect_all(PROT_NONE);
}

/* Lazy mode: run st's queued work up to its upto-th operation. With a
 * serial (an event's record, a stream listed earlier), st may have been
 * destroyed since: then its work has all run (cudaStreamDestroy drains it,
 * under exec_lock, which this holds) and there is nothing to do. */
void drain(emu_stream *st, uint64_t upto, uint64_t serial = 0) {
  std::lock_guard<std::recursive_mutex> run(exec_lock);
  for (;;) {
    std::function<void()> op;
    {
      std::lock_guard<std::mutex> g(lock);
      if (serial && (!streams.count(st) || st->serial != serial))
        return;
      if (st->done >= upto || st->q.empty())
        return;
      op = std::move(st->q.front());
      st->q.pop_front();
    }
    with_device_access(op);
    std::lock_guard<std::mutex> g(lock);
    st->done++;
  }
}

void drain_all() {
  std::vector<std::pair<emu_stream *, uint64_t>> all;
  {
    std::lock_guard<std::mutex> g(lock);
    for (emu_stream *st : streams)
      all.emplace_back(st, st->serial);
  }
  for (const auto &it : all) /* each checked again: another thread may destroy it meanwhile */
    drain(it.first, UINT64_MAX, it.second);
  drain(&legacy, UINT64_MAX);
}

/* Whether p is pageable host memory (not device, not pinned). */
bool pageable(const void *p) { return !is_device_or_pinned(p, 0); }

/* Both sides of a copy as its kind describes them. */
cudaError_t check_copy(const void *dst, const void *src, size_t n, cudaMemcpyKind k, bool async) {
  bool dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
  bool sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
  if (dd && !is_device_or_pinned(dst, n)) {
    spn_emu_complain("copy of %zu bytes to %p, not device memory (kind %d)", n, dst, (int)k);
    return ret(cudaErrorInvalidValue);
  }
  if (sd && !is_device_or_pinned(src, n)) {
    spn_emu_complain("copy of %zu bytes from %p, not device memory (kind %d)", n, src, (int)k);
    return ret(cudaErrorInvalidValue);
  }
  if (async && (!is_device_or_pinned(dst, n) || !is_device_or_pinned(src, n))) {
    cudaError_t e = forbidden("a copy to or from pageable host memory");
    if (e)
      return e;
  }
  return cudaSuccess;
}

} // namespace

void spn_emu_complain(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cuda-fake: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

bool spn_emu_is_device(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(lock);
  const emu_block *b = find_block(p, n);
  return b && b->dev >= 0;
}

/* Test hook: graph launches so far (the SPN_EMU_CUDA_STATS counter). */
extern "C" long long spn_emu_graph_launches(void) { return stats[ST_GRAPH].load(); }

/* Test hook: how many captures were begun on s. */
extern "C" int spn_emu_stream_captures(cudaStream_t s) {
  emu_stream *st = stream_of(s);
  std::lock_guard<std::mutex> g(lock);
  return st->captures;
}

bool spn_emu_stream_alive(cudaStream_t s) {
  if (stream_of(s) == &legacy)
    return true;
  std::lock_guard<std::mutex> g(lock);
  return streams.count((emu_stream *)s) != 0;
}

void spn_emu_count_launch(void) { count(ST_KERNEL); }

bool spn_emu_kernel_pointer_ok(const void *p, const char *kernel, int arg) {
  if (is_device_or_pinned(p, 0))
    return true;
  spn_emu_complain("kernel launch (%s): argument %d, %p, is not device memory", kernel, arg, p);
  last_error = cudaErrorIllegalAddress;
  return false;
}

void spn_emu_launch_refused(const char *kernel, const char *why, cudaError_t e) {
  spn_emu_complain("kernel launch (%s) refused: %s", kernel, why);
  last_error = e;
}

void spn_emu_stream_do(cudaStream_t s, std::function<void()> fn) {
  emu_stream *st = stream_of(s);
  {
    std::lock_guard<std::mutex> g(lock);
    if (st->cap) {
      st->cap->push_back(std::move(fn));
      return;
    }
    if (lazy()) {
      st->q.push_back(std::move(fn));
      st->submitted++;
      return;
    }
  }
  with_device_access(fn);
}

extern "C" {

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
  case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
  case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
  case cudaErrorIllegalState: return "cudaErrorIllegalState";
  case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
  case cudaErrorStreamCaptureUnjoined: return "capture sequence contains a fork that was not joined to the primary stream";
  default: return cudaGetErrorName(e);
  }
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = n_devices();
  return *n ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *d) {
  *d = current_dev;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= n_devices())
    return ret(cudaErrorInvalidDevice);
  current_dev = d;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  if (d < 0 || d >= n_devices())
    return ret(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "Fake GPU (host emulation)");
  p->totalGlobalMem = dev_mem();
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 1;
  p->maxThreadsPerBlock = 1024;
  p->warpSize = 32;
  p->unifiedAddressing = 1;
  p->pciBusID = d + 1;
  return cudaSuccess;
}

/* The driver API (libcuda) is not faked: no driver entry point is found,
 * so whatever needs one (FFmpeg's NVDEC/NVENC through media-cuda.c) takes
 * the path a GPU without that driver function would. */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *status) {
  (void)symbol, (void)version, (void)flags;
  *fn = NULL;
  if (status)
    *status = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int d) {
  if (d < 0 || d >= n_devices())
    return ret(cudaErrorInvalidDevice);
  snprintf(buf, (size_t)len, "0000:%02x:00.0", d + 1);
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int peer) {
  *can = d != peer && d < n_devices() && peer < n_devices();
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  (void)flags;
  return peer < n_devices() ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceSynchronize(void) {
  count(ST_SYNC);
  cudaError_t e = forbidden("cudaDeviceSynchronize");
  if (!e && lazy())
    drain_all();
  return e;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
  std::lock_guard<std::mutex> g(lock);
  *total = dev_mem();
  *free_b = used.empty() ? *total : *total - used[current_dev];
  return cudaSuccess;
}

/* One pool per device: the handle is the device's number plus one. */
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int d) {
  if (d < 0 || d >= n_devices())
    return ret(cudaErrorInvalidDevice);
  *pool = (cudaMemPool_t)(uintptr_t)(d + 1);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  (void)pool, (void)attr, (void)value;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size) {
  count(ST_ALLOC);
  cudaError_t e = forbidden("cudaMalloc");
  return e ? e : dev_alloc(p, size, current_dev);
}

cudaError_t cudaFree(void *p) {
  if (p)
    count(ST_FREE);
  cudaError_t e = forbidden("cudaFree");
  if (!e && lazy() && p)
    drain_all(); /* cudaFree synchronises the device */
  return e ? e : block_free(p, false);
}

/* Stream-ordered allocation happens at the call (the stream's earlier work
 * has run already); a free likewise. */
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  count(ST_ALLOC);
  return dev_alloc(p, size, stream_of(s)->dev);
}

cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s) {
  (void)s;
  count(ST_ALLOC);
  return dev_alloc(p, size, (int)(uintptr_t)pool - 1);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  if (p)
    count(ST_FREE);
  if (!lazy() || !p)
    return block_free(p, false);
  {
    std::lock_guard<std::mutex> g(lock);
    if (!find_block(p, 0)) {
      spn_emu_complain("freeing %p, not a device block", p);
      return ret(cudaErrorInvalidValue);
    }
  }
  /* The free runs as early as the stream's order lets it (its earlier work
   * and the events it waits for first): a missing wait frees the block under
   * work still queued elsewhere, which then faults. */
  spn_emu_stream_do(s, [p] { (void)block_free(p, false); });
  emu_stream *st = stream_of(s);
  if (!st->cap)
    drain(st, UINT64_MAX);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size) {
  count(ST_PINNED_ALLOC);
  cudaError_t e = forbidden("cudaMallocHost");
  if (e)
    return e;
  void *q = aligned_alloc(256, (size + 255) & ~(size_t)255 ? (size + 255) & ~(size_t)255 : 256);
  if (!q)
    return ret(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(lock);
  blocks[(uintptr_t)q] = emu_block{size, -1, nullptr, 0};
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  if (p)
    count(ST_PINNED_FREE);
  if (lazy() && p)
    drain_all(); /* synchronises the device */
  return block_free(p, true);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  memset(a, 0, sizeof *a);
  std::lock_guard<std::mutex> g(lock);
  const emu_block *b = find_block(p, 0);
  if (!b) {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    a->hostPointer = (void *)p;
    return cudaSuccess;
  }
  a->type = b->dev >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  a->device = b->dev >= 0 ? b->dev : 0;
  a->devicePointer = (void *)p;
  a->hostPointer = b->dev >= 0 ? nullptr : (void *)p;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
  count(ST_COPY_BLOCKING);
  cudaError_t e = forbidden("cudaMemcpy");
  if (!e && lazy())
    drain(&legacy, UINT64_MAX); /* after the legacy stream's work */
  if (!e)
    e = check_copy(dst, src, n, k, false);
  if (!e && n)
    with_device_access([=] { memmove(dst, src, n); });
  return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
  count(ST_COPY_ASYNC);
  if (k != cudaMemcpyDeviceToDevice && (pageable(src) || pageable(dst)))
    count(ST_COPY_PAGEABLE);
  emu_stream *st = stream_of(s);
  cudaError_t e = check_copy(dst, src, n, k, st->cap != nullptr);
  if (e || !n)
    return e;
  if (lazy() && !st->cap && pageable(src)) {
    /* From pageable memory CUDA stages the source before returning. */
    std::vector<char> staged((const char *)src, (const char *)src + n);
    spn_emu_stream_do(s, [=] { memmove(dst, staged.data(), n); });
  } else if (lazy() && !st->cap && pageable(dst)) {
    /* To pageable memory the call returns once the copy is done. */
    spn_emu_stream_do(s, [=] { memmove(dst, src, n); });
    drain(st, UINT64_MAX);
  } else {
    spn_emu_stream_do(s, [=] { memmove(dst, src, n); });
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t n, cudaStream_t s) {
  if (!spn_emu_is_device(dst, n) || !spn_emu_is_device(src, n)) {
    spn_emu_complain("peer copy of %zu bytes between %p (cuda:%d) and %p (cuda:%d): not device memory", n, dst, dd,
                     src, sd);
    return ret(cudaErrorInvalidValue);
  }
  if (n)
    spn_emu_stream_do(s, [=] { memmove(dst, src, n); });
  return cudaSuccess;
}

static cudaError_t copy2d(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k,
                          cudaStream_t s, bool async) {
  if (w > dp || w > sp)
    return ret(cudaErrorInvalidPitchValue);
  if (!h || !w)
    return cudaSuccess;
  size_t dn = (h - 1) * dp + w, sn = (h - 1) * sp + w;
  bool dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
  bool sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
  if ((dd && !is_device_or_pinned(dst, dn)) || (sd && !is_device_or_pinned(src, sn))) {
    spn_emu_complain("2-D copy (%zu x %zu) from %p to %p: a side is not device memory (kind %d)", w, h, src, dst,
                     (int)k);
    return ret(cudaErrorInvalidValue);
  }
  if (async && stream_of(s)->cap && (!is_device_or_pinned(dst, dn) || !is_device_or_pinned(src, sn))) {
    cudaError_t e = forbidden("a 2-D copy to or from pageable host memory");
    if (e)
      return e;
  }
  emu_stream *st = stream_of(s);
  if (lazy() && !st->cap && pageable(src)) { /* staged at the call */
    std::vector<char> staged((const char *)src, (const char *)src + sn);
    spn_emu_stream_do(s, [=] {
      for (size_t y = 0; y < h; y++)
        memmove((char *)dst + y * dp, staged.data() + y * sp, w);
    });
    return cudaSuccess;
  }
  spn_emu_stream_do(s, [=] {
    for (size_t y = 0; y < h; y++)
      memmove((char *)dst + y * dp, (const char *)src + y * sp, w);
  });
  if (lazy() && !st->cap && (pageable(dst) || !async)) /* done when the call returns */
    drain(st, UINT64_MAX);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2D(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k) {
  count(ST_COPY_BLOCKING);
  cudaError_t e = forbidden("cudaMemcpy2D");
  return e ? e : copy2d(dst, dp, src, sp, w, h, k, nullptr, false);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k,
                              cudaStream_t s) {
  count(ST_COPY_ASYNC);
  if (k != cudaMemcpyDeviceToDevice && (pageable(src) || pageable(dst)))
    count(ST_COPY_PAGEABLE);
  return copy2d(dst, dp, src, sp, w, h, k, s, true);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  if (n && !is_device_or_pinned(p, n)) {
    spn_emu_complain("memset of %zu bytes at %p, not device memory", n, p);
    return ret(cudaErrorInvalidValue);
  }
  if (n)
    spn_emu_stream_do(s, [=] { memset(p, v, n); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n) {
  cudaError_t e = forbidden("cudaMemset");
  if (!e)
    e = cudaMemsetAsync(p, v, n, nullptr);
  if (!e && lazy())
    drain(&legacy, UINT64_MAX);
  return e;
}

cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int v, size_t w, size_t h, cudaStream_t s) {
  if (w > pitch)
    return ret(cudaErrorInvalidPitchValue);
  if (!w || !h)
    return cudaSuccess;
  if (!is_device_or_pinned(p, (h - 1) * pitch + w)) {
    spn_emu_complain("2-D memset at %p, not device memory", p);
    return ret(cudaErrorInvalidValue);
  }
  spn_emu_stream_do(s, [=] {
    for (size_t y = 0; y < h; y++)
      memset((char *)p + y * pitch, v, w);
  });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  (void)flags;
  emu_stream *st = new emu_stream{current_dev, nullptr, false, false, 0, cudaStreamCaptureModeGlobal, {}, 0, 0};
  std::lock_guard<std::mutex> g(lock);
  st->serial = ++stream_serial;
  streams.insert(st);
  *s = (cudaStream_t)st;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  emu_stream *st = stream_of(s);
  if (st == &legacy)
    return ret(cudaErrorInvalidResourceHandle);
  if (st->cap) {
    spn_emu_complain("destroying a capturing stream");
    return ret(cudaErrorIllegalState);
  }
  /* Its queued work still runs; exec_lock held until it is gone, so that no
   * other thread's drain (an event's, drain_all's) finds it half destroyed. */
  std::lock_guard<std::recursive_mutex> run(exec_lock);
  drain(st, UINT64_MAX);
  {
    std::lock_guard<std::mutex> g(lock);
    streams.erase(st);
    for (emu_event *ev : events) /* their work is done */
      if (ev->s == st)
        ev->s = nullptr;
  }
  delete st;
  return cudaSuccess;
}

/* A synchronisation or query of a stream that is capturing: refused, as
 * CUDA refuses it, and the capture invalidated; cudaSuccess otherwise. */
static cudaError_t refuse_if_capturing(emu_stream *st, const char *what) {
  if (!st->cap)
    return cudaSuccess;
  spn_emu_complain("%s a capturing stream", what);
  invalidate_captures();
  return ret(cudaErrorStreamCaptureUnsupported);
}

static cudaError_t stream_sync(cudaStream_t s) {
  if (cudaError_t e = refuse_if_capturing(stream_of(s), "synchronising"))
    return e;
  drain(stream_of(s), UINT64_MAX);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  count(ST_SYNC);
  return stream_sync(s);
}

/* As an event query: in lazy mode a stream with work still queued is not
 * ready, and the query runs none of it (a caller that polls instead of
 * waiting must not see the fake finish the work for it); otherwise its work
 * has run at the call. */
cudaError_t cudaStreamQuery(cudaStream_t s) {
  count(ST_QUERY);
  emu_stream *st = stream_of(s);
  if (cudaError_t e = refuse_if_capturing(st, "querying"))
    return e;
  if (lazy()) {
    std::lock_guard<std::mutex> g(lock);
    if (!st->q.empty())
      return cudaErrorNotReady;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  count(ST_STREAM_WAIT);
  if (!e)
    return ret(cudaErrorInvalidResourceHandle);
  emu_event ev;
  emu_stream *ws = stream_of(s);
  {
    std::lock_guard<std::mutex> g(lock);
    ev = *(emu_event *)e; /* the record current at the call */
    /* An event recorded into a capture, waited for by a stream outside it:
     * CUDA makes that stream join the capture (its later work becomes graph
     * nodes, not run), and the capture's end fails unjoined unless it waits
     * its way back. No code here means to fork a capture: say so. */
    if (ev.capture && ev.capture != ws && ev.capture->cap && ev.capture->captures == ev.capture_no) {
      ev.capture->unjoined = true;
      spn_emu_complain("a stream waits for an event recorded during another stream's capture: it joins that "
                       "capture, whose end then fails (cudaErrorStreamCaptureUnjoined)");
      return cudaSuccess;
    }
  }
  if (lazy() && ev.s && ev.s != ws)
    spn_emu_stream_do(s, [ev] { drain(ev.s, ev.pos, ev.serial); });
  return cudaSuccess;
}

/* Events carry nothing but the time of their last record: all work has run
 * when they are recorded (lazy mode: that time is when it was queued). */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  emu_event *ev = new emu_event{nullptr, 0, 0};
  ev->timing = !(flags & cudaEventDisableTiming);
  std::lock_guard<std::mutex> g(lock);
  events.insert(ev);
  *e = (cudaEvent_t)ev;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> g(lock);
  events.erase((emu_event *)e);
  delete (emu_event *)e;
  return cudaSuccess;
}

/* A record during a capture is a graph node that waits for nothing here. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  count(ST_EVENT_RECORD);
  if (!e)
    return ret(cudaErrorInvalidResourceHandle);
  emu_stream *st = stream_of(s);
  std::lock_guard<std::mutex> g(lock);
  if (!st->cap) {
    emu_event *ev = (emu_event *)e;
    bool timing = ev->timing;
    *ev = emu_event{st, st->submitted, st->serial};
    ev->timing = timing;
    ev->t_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  } else {
    ((emu_event *)e)->capture = st;
    ((emu_event *)e)->capture_no = st->captures;
  }
  return cudaSuccess;
}

static cudaError_t event_sync(cudaEvent_t e) {
  if (!e)
    return ret(cudaErrorInvalidResourceHandle);
  emu_event ev;
  {
    std::lock_guard<std::mutex> g(lock);
    ev = *(emu_event *)e;
  }
  if (lazy() && ev.s)
    drain(ev.s, ev.pos, ev.serial);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  count(ST_SYNC);
  return event_sync(e);
}

/* Lazy mode: not ready while the work before the record is queued (as on a
 * GPU still running it); nothing runs for a query. Otherwise complete. */
cudaError_t cudaEventQuery(cudaEvent_t e) {
  count(ST_QUERY);
  if (!e)
    return ret(cudaErrorInvalidResourceHandle);
  if (lazy()) {
    std::lock_guard<std::mutex> g(lock);
    const emu_event *ev = (const emu_event *)e;
    if (ev->s && streams.count(ev->s) && ev->s->serial == ev->serial && ev->s->done < ev->pos)
      return cudaErrorNotReady;
  }
  return cudaSuccess;
}

/* As CUDA: both events recorded, neither made without timing. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b)
    return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(lock);
  const emu_event *x = (const emu_event *)a, *y = (const emu_event *)b;
  if (!x->timing || !y->timing || !x->s || !y->s)
    return ret(cudaErrorInvalidResourceHandle);
  *ms = (float)(y->t_ms - x->t_ms);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
  spn_emu_stream_do(s, [=] { fn(data); });
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  emu_stream *st = stream_of(s);
  if (st == &legacy)
    return ret(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> g(lock);
  if (st->cap)
    return ret(cudaErrorIllegalState);
  st->cap = new std::vector<std::function<void()>>;
  st->invalid = false;
  st->unjoined = false;
  st->captures++;
  st->mode = mode;
  live_captures.push_back(st);
  if (mode == cudaStreamCaptureModeGlobal)
    global_captures++;
  else if (mode == cudaStreamCaptureModeThreadLocal)
    capturing++;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  emu_stream *st = stream_of(s);
  std::lock_guard<std::mutex> g(lock);
  *graph = nullptr;
  if (!st->cap)
    return ret(cudaErrorIllegalState);
  std::vector<std::function<void()>> *ops = st->cap;
  st->cap = nullptr;
  for (size_t i = 0; i < live_captures.size(); i++)
    if (live_captures[i] == st)
      live_captures.erase(live_captures.begin() + (long)i);
  if (st->mode == cudaStreamCaptureModeGlobal)
    global_captures--;
  else if (st->mode == cudaStreamCaptureModeThreadLocal)
    capturing--;
  if (st->invalid || st->unjoined) {
    delete ops;
    if (tracing())
      fprintf(stderr, "cuda-fake: capture %s\n", st->invalid ? "invalidated" : "unjoined");
    return ret(st->invalid ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureUnjoined);
  }
  if (tracing())
    fprintf(stderr, "cuda-fake: captured a graph of %zu operations\n", ops->size());
  emu_graph *gr = new emu_graph{std::move(*ops)};
  delete ops;
  *graph = (cudaGraph_t)gr;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
  *status = stream_of(s)->cap ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  if (!graph)
    return ret(cudaErrorInvalidValue);
  *exec = (cudaGraphExec_t) new emu_graph(*(emu_graph *)graph);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete (emu_graph *)graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete (emu_graph *)exec;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec)
    return ret(cudaErrorInvalidValue);
  const emu_graph *g = (const emu_graph *)exec;
  count(ST_GRAPH);
  if (tracing())
    fprintf(stderr, "cuda-fake: launching a graph of %zu operations\n", g->ops.size());
  spn_emu_stream_do(s, [g] {
    for (const auto &op : g->ops)
      op();
  });
  return cudaSuccess;
}

} // extern "C"
