/* fake-gpu-host.h — what the tests share that run a stage's GPU code path
 * without a GPU (test-frame-filter-cuda, test-lipsync-gpu-batch,
 * test-superres-gpu-body): buffers in host memory kept in a registry, so a
 * fake can tell whether a pointer lies inside a live buffer; "queued work"
 * (touch) marks the buffers it reads or writes until the next stream
 * synchronisation, and a buffer whose last reference goes while marked is
 * counted in fake.early_frees (on a GPU the pool would hand its memory to
 * another allocation while that work still ran) — unless the host reports
 * memory kinds (fake.kinds) and it is device memory, whose free the device
 * layer orders after the queued work (fake.ordered_frees); the CUDA runtime
 * calls those paths make (defined here: the tests link no libcudart), one
 * stream's worth: a wait for an event waits for all queued work; and the
 * host table entries every such test fills the same way.
 *
 * Include after <cmocka.h> and what declares spn_buffer_t and the CUDA
 * runtime API; clear `fake` (fake_reset) in each test's setup. Test code
 * only: the registry is this file's state. */
#ifndef SPN_TEST_FAKE_GPU_HOST_H
#define SPN_TEST_FAKE_GPU_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#define FAKE_MAX_BUFS 64

struct spn_buffer {
  int refs;
  bool device;  /* device memory, as the fake host reports it */
  bool touched; /* read or written by queued work since the last sync */
  size_t size;
  unsigned char *data;
};

#define FAKE_MAX_READS 16

static struct {
  spn_buffer_t *all[FAKE_MAX_BUFS]; /* live buffers; NULL where one was freed */
  int n_all;
  int syncs;                /* cudaStreamSynchronize */
  int event_syncs;          /* cudaEventSynchronize (here a wait for all queued work) */
  int queries;              /* cudaStreamQuery */
  int early_frees;          /* buffers released while queued work touched them */
  int ordered_frees;        /* device buffers released so (kinds: the device layer orders their free) */
  cudaError_t sync_result;  /* what the next cudaStreamSynchronize returns */
  cudaError_t query_result; /* what cudaStreamQuery returns when not cudaSuccess (an error the GPU reported) */
  /* kinds: the host reports where a buffer lives (buffer_mem_kind and
   * buffer_device, h_buffer_mem_kind / h_buffer_device in the table), as a
   * 1.2 host does: then a device buffer released while queued work touches
   * it is an ordered free, not an early one, as on a GPU (device-cuda.c). */
  bool kinds;
  /* Host memory that queued copies read, until the next wait: a queued read
   * of bytes that an earlier queued read still covers means the host
   * rewrote them in between (staging_rewrites). */
  struct {
    const unsigned char *p;
    size_t n;
  } reads[FAKE_MAX_READS];
  int n_reads;
  int staging_rewrites;
} fake;

static inline void fake_reset(void) { memset(&fake, 0, sizeof fake); }

/* A live buffer of n bytes, every byte `fill`. */
static inline spn_buffer_t *fake_buffer(size_t n, int fill, bool device) {
  spn_buffer_t *b = calloc(1, sizeof *b);
  assert_non_null(b);
  b->refs = 1;
  b->device = device;
  b->size = n;
  b->data = malloc(n ? n : 1);
  assert_non_null(b->data);
  memset(b->data, fill, n);
  assert_true(fake.n_all < FAKE_MAX_BUFS);
  fake.all[fake.n_all++] = b;
  return b;
}

/* The live buffer [p, p + n) lies in, or NULL. */
static inline spn_buffer_t *fake_buffer_at(const void *p, size_t n) {
  for (int i = 0; i < fake.n_all; i++)
    if (fake.all[i] && (const unsigned char *)p >= fake.all[i]->data &&
        (const unsigned char *)p + n <= fake.all[i]->data + fake.all[i]->size)
      return fake.all[i];
  return NULL;
}

/* Queued work reads or writes the buffer p points into. */
static inline void touch(const void *p) {
  spn_buffer_t *b = fake_buffer_at(p, 1);
  assert_non_null(b); /* queued work only on live buffers */
  b->touched = true;
}

/* Whether every live buffer was freed. */
static inline bool fake_none_live(void) {
  for (int i = 0; i < fake.n_all; i++)
    if (fake.all[i])
      return false;
  return true;
}

/* A queued copy reads host memory [p, p + n). */
static inline void fake_host_read(const void *p, size_t n) {
  const unsigned char *c = p;
  for (int i = 0; i < fake.n_reads; i++)
    if (c < fake.reads[i].p + fake.reads[i].n && fake.reads[i].p < c + n)
      fake.staging_rewrites++;
  assert_true(fake.n_reads < FAKE_MAX_READS);
  fake.reads[fake.n_reads].p = c;
  fake.reads[fake.n_reads++].n = n;
}

/* The queued work is done (one stream: any wait waits for all of it). */
static inline void fake_done(void) {
  for (int i = 0; i < fake.n_all; i++)
    if (fake.all[i])
      fake.all[i]->touched = false;
  fake.n_reads = 0;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  fake.syncs++;
  fake_done();
  return fake.sync_result;
}
/* Not ready while queued work touches a live buffer; query_result once set. */
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  (void)stream;
  fake.queries++;
  if (fake.query_result != cudaSuccess)
    return fake.query_result;
  for (int i = 0; i < fake.n_all; i++)
    if (fake.all[i] && fake.all[i]->touched)
      return cudaErrorNotReady;
  return fake.n_reads ? cudaErrorNotReady : cudaSuccess;
}
static int fake_event;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
  (void)flags;
  *ev = (cudaEvent_t)(void *)&fake_event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream) {
  (void)stream;
  assert_ptr_equal(ev, &fake_event);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  assert_ptr_equal(ev, &fake_event);
  fake.event_syncs++;
  fake_done();
  return fake.sync_result;
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  assert_ptr_equal(ev, &fake_event);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind, (void)stream;
  touch(dst);
  touch(src);
  memcpy(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "fake error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }

static inline spn_buffer_t *h_buffer_ref(spn_buffer_t *b) {
  b->refs++;
  return b;
}
static inline void h_buffer_unref(spn_buffer_t **bp) {
  spn_buffer_t *b = *bp;
  *bp = NULL;
  if (!b || --b->refs > 0)
    return;
  if (b->touched && fake.kinds && b->device)
    fake.ordered_frees++;
  else if (b->touched)
    fake.early_frees++;
  for (int i = 0; i < fake.n_all; i++)
    if (fake.all[i] == b)
      fake.all[i] = NULL;
  free(b->data);
  free(b);
}
/* (kinds) Device buffers are cuda:0's memory, the others pinned. */
static inline int32_t h_buffer_mem_kind(const spn_buffer_t *b) { return b->device ? SPN_MEM_DEVICE : SPN_MEM_PINNED; }
static inline void h_buffer_device(const spn_buffer_t *b, int32_t *kind, int32_t *index) {
  *kind = b->device ? SPN_DEVICE_CUDA : SPN_DEVICE_CPU;
  *index = 0;
}
static inline void *h_buffer_data(spn_buffer_t *b) { return b->data; }
static inline size_t h_buffer_size(const spn_buffer_t *b) { return b->size; }
static inline int32_t h_buffer_set_ready(spn_stage_t *s, spn_buffer_t *b, spn_error_t *err) {
  (void)s, (void)b, (void)err;
  return SPN_OK;
}
/* The stage is placed on cuda:0; its stream is the default one. */
static inline void h_stage_get_device(spn_stage_t *s, int32_t *kind, int32_t *index) {
  (void)s;
  *kind = SPN_DEVICE_CUDA;
  *index = 0;
}
static inline void *h_stage_get_stream(spn_stage_t *s) {
  (void)s;
  return NULL;
}
static inline void h_log(spn_stage_t *s, uint64_t job, int32_t level, const char *fmt, ...) {
  (void)s, (void)job, (void)level, (void)fmt;
}
#endif
