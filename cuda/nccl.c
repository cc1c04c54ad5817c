/* nccl.c — NCCL communicators over CUDA devices (nccl-internal.h).
 *
 * Invariants: rank i is devs[i]; every NCCL call for rank i runs with rank
 * i's device current and on rank i's own stream; a multi-rank operation is
 * issued inside one ncclGroupStart/End from this single thread (NCCL's rule
 * for driving several ranks from one thread), then every stream involved is
 * synchronised before returning, so callers see plain blocking calls and
 * may free or reuse the buffers at once. SPN_NCCL_CHECK records the call,
 * NCCL's message and the place, like SPN_CUDA_CHECK. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "cuda-internal.h"
#include "nccl-internal.h"
#include "../core/runtime/device-internal.h"

int spn__cuda_device_ordinal(const spn_device_t *dev);

static int32_t nccl_error(spn_error_t *err, ncclResult_t r, const char *call, const char *file, int line) {
  const char *base = strrchr(file, '/');
  return spn_error_set(err, SPN_ECUDA, "%s failed: %s (NCCL %d) at %s:%d", call, ncclGetErrorString(r), (int)r,
                       base ? base + 1 : file, line);
}

#define SPN_NCCL_CHECK(call, err)                                                                             \
  do {                                                                                                        \
    ncclResult_t spn__nr = (call);                                                                            \
    if (spn__nr != ncclSuccess)                                                                               \
      return nccl_error((err), spn__nr, #call, __FILE__, __LINE__);                                           \
  } while (0)

struct spn__nccl {
  uint32_t n;
  int *ordinals;
  ncclComm_t *comms;
  cudaStream_t *streams;
};

int32_t spn__nccl_version(void) {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

uint32_t spn__nccl_size(const spn__nccl_t *c) { return c ? c->n : 0; }

void spn__nccl_free(spn__nccl_t **cp) {
  if (!cp || !*cp)
    return;
  spn__nccl_t *c = *cp;
  for (uint32_t i = 0; i < c->n; i++) {
    if (c->streams && c->streams[i]) {
      (void)cudaSetDevice(c->ordinals[i]);
      (void)cudaStreamDestroy(c->streams[i]);
    }
    if (c->comms && c->comms[i])
      (void)ncclCommDestroy(c->comms[i]);
  }
  (void)cudaGetLastError();
  free(c->ordinals);
  free(c->comms);
  free(c->streams);
  free(c);
  *cp = NULL;
}

int32_t spn__nccl_new(spn_device_t *const *devs, uint32_t n, spn__nccl_t **out, spn_error_t *err) {
  *out = NULL;
  if (!n)
    return spn_error_set(err, SPN_EINVAL, "NCCL: a communicator needs at least one device");
  for (uint32_t i = 0; i < n; i++) {
    if (devs[i]->kind != SPN_DEVICE_CUDA)
      return spn_error_set(err, SPN_EINVAL, "NCCL: %s is not a CUDA device", devs[i]->name);
    for (uint32_t j = 0; j < i; j++)
      if (devs[j] == devs[i])
        return spn_error_set(err, SPN_EINVAL, "NCCL: %s is listed twice", devs[i]->name);
  }
  spn__nccl_t *c = calloc(1, sizeof *c);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "NCCL: out of memory");
  c->ordinals = calloc(n, sizeof *c->ordinals);
  c->comms = calloc(n, sizeof *c->comms);
  c->streams = calloc(n, sizeof *c->streams);
  if (!c->ordinals || !c->comms || !c->streams) {
    spn__nccl_free(&c);
    return spn_error_set(err, SPN_ENOMEM, "NCCL: out of memory");
  }
  for (uint32_t i = 0; i < n; i++)
    c->ordinals[i] = spn__cuda_device_ordinal(devs[i]);
  ncclResult_t r = ncclCommInitAll(c->comms, (int)n, c->ordinals);
  if (r != ncclSuccess) {
    memset(c->comms, 0, n * sizeof *c->comms);
    spn__nccl_free(&c);
    return nccl_error(err, r, "ncclCommInitAll", __FILE__, __LINE__);
  }
  c->n = n;
  for (uint32_t i = 0; i < n; i++) {
    cudaError_t ce = cudaSetDevice(c->ordinals[i]);
    if (ce == cudaSuccess)
      ce = cudaStreamCreateWithFlags(&c->streams[i], cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
      spn__nccl_free(&c);
      return spn__cuda_error(err, ce, "cudaStreamCreateWithFlags(nccl rank stream)", __FILE__, __LINE__);
    }
  }
  *out = c;
  return SPN_OK;
}

static int32_t sync_ranks(spn__nccl_t *c, uint32_t a, uint32_t b, spn_error_t *err) {
  for (uint32_t i = 0; i < c->n; i++) {
    if (a != UINT32_MAX && i != a && i != b)
      continue;
    SPN_CUDA_CHECK(cudaSetDevice(c->ordinals[i]), err);
    SPN_CUDA_CHECK(cudaStreamSynchronize(c->streams[i]), err);
  }
  return SPN_OK;
}

static int32_t check_buffer(const spn__nccl_t *c, spn_buffer_t *b, uint32_t rank, size_t size, spn_error_t *err) {
  spn_device_t *d = spn_buffer_device(b);
  if (rank >= c->n)
    return spn_error_set(err, SPN_EINVAL, "NCCL: rank %u, the communicator has %u", rank, c->n);
  if (spn_buffer_is_host(b) || d->kind != SPN_DEVICE_CUDA || spn__cuda_device_ordinal(d) != c->ordinals[rank])
    return spn_error_set(err, SPN_EINVAL, "NCCL: the buffer for rank %u is not device memory of cuda:%d", rank,
                         c->ordinals[rank]);
  if (spn_buffer_size(b) < size)
    return spn_error_set(err, SPN_EOVERFLOW, "NCCL: %zu bytes do not fit the %zu-byte buffer of rank %u", size,
                         spn_buffer_size(b), rank);
  return SPN_OK;
}

int32_t spn__nccl_broadcast(spn__nccl_t *c, spn_buffer_t *const *bufs, uint32_t root, size_t size,
                            spn_error_t *err) {
  int32_t rc = SPN_OK;
  void **ptrs = calloc(c->n, sizeof *ptrs);
  if (!ptrs)
    return spn_error_set(err, SPN_ENOMEM, "NCCL: out of memory");
  for (uint32_t i = 0; i < c->n && !(rc = check_buffer(c, bufs[i], i, size, err)); i++)
    ptrs[i] = spn_buffer_data(bufs[i]);
  if (rc == SPN_OK)
    rc = spn__nccl_broadcast_many(c, root, 1, ptrs, &size, err);
  free(ptrs);
  return rc;
}

int32_t spn__nccl_broadcast_many(spn__nccl_t *c, uint32_t root, size_t n_items, void *const *ptrs,
                                 const size_t *sizes, spn_error_t *err) {
  if (root >= c->n)
    return spn_error_set(err, SPN_EINVAL, "NCCL: broadcast root %u, the communicator has %u ranks", root, c->n);
  enum { GROUP = 64 };
  for (size_t g = 0; g < n_items; g += GROUP) {
    size_t end = n_items - g > GROUP ? g + GROUP : n_items;
    SPN_NCCL_CHECK(ncclGroupStart(), err);
    for (size_t i = g; i < end; i++)
      for (uint32_t r = 0; r < c->n; r++) {
        cudaError_t ce = cudaSetDevice(c->ordinals[r]);
        const void *src = ptrs[i * c->n + root];
        ncclResult_t nr = ce == cudaSuccess ? ncclBroadcast(src, ptrs[i * c->n + r], sizes[i], ncclUint8, (int)root,
                                                            c->comms[r], c->streams[r])
                                            : ncclSuccess;
        if (ce != cudaSuccess || nr != ncclSuccess) {
          (void)ncclGroupEnd();
          return ce != cudaSuccess ? spn__cuda_error(err, ce, "cudaSetDevice", __FILE__, __LINE__)
                                   : nccl_error(err, nr, "ncclBroadcast", __FILE__, __LINE__);
        }
      }
    SPN_NCCL_CHECK(ncclGroupEnd(), err);
  }
  return sync_ranks(c, UINT32_MAX, UINT32_MAX, err);
}

int32_t spn__nccl_sendrecv(spn__nccl_t *c, spn_buffer_t *src, uint32_t from, spn_buffer_t *dst, uint32_t to,
                           size_t size, spn_error_t *err) {
  int32_t rc;
  if ((rc = check_buffer(c, src, from, size, err)) != SPN_OK || (rc = check_buffer(c, dst, to, size, err)) != SPN_OK)
    return rc;
  SPN_NCCL_CHECK(ncclGroupStart(), err);
  cudaError_t ce = cudaSetDevice(c->ordinals[from]);
  ncclResult_t r = ce == cudaSuccess ? ncclSend(spn_buffer_data(src), size, ncclUint8, (int)to, c->comms[from],
                                                c->streams[from])
                                     : ncclSuccess;
  if (ce == cudaSuccess && r == ncclSuccess) {
    ce = cudaSetDevice(c->ordinals[to]);
    if (ce == cudaSuccess)
      r = ncclRecv(spn_buffer_data(dst), size, ncclUint8, (int)from, c->comms[to], c->streams[to]);
  }
  if (ce != cudaSuccess || r != ncclSuccess) {
    (void)ncclGroupEnd();
    return ce != cudaSuccess ? spn__cuda_error(err, ce, "cudaSetDevice", __FILE__, __LINE__)
                             : nccl_error(err, r, "ncclSend/ncclRecv", __FILE__, __LINE__);
  }
  SPN_NCCL_CHECK(ncclGroupEnd(), err);
  return sync_ranks(c, from, to, err);
}
