/* nccl-internal.h — NCCL communicators over the runtime's CUDA devices.
 *
 * Built when NCCL is found (meson option `nccl`, auto by default) and CUDA
 * is; SPN_HAVE_NCCL is then defined for libspindle. A communicator spans n
 * CUDA devices of one process (ncclCommInitAll), one rank per device, each
 * rank with its own non-blocking stream, so collectives and point-to-point
 * moves never queue behind a stage's work on the device's main stream.
 *
 * Used for: model weights read from disk once and broadcast to the other
 * GPUs (spn__nccl_broadcast), and batches moved between GPUs for batch
 * fan-out (spn__nccl_sendrecv). docs/gpu.md says where each is wired. */
#ifndef SPINDLE_NCCL_INTERNAL_H
#define SPINDLE_NCCL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "spindle/device.h"

typedef struct spn__nccl spn__nccl_t;

/* NCCL's version as major*10000 + minor*100 + patch (22805), 0 if unknown. */
int32_t spn__nccl_version(void);

/* One rank per device (all CUDA, distinct; n >= 1). Errors name the NCCL
 * call and its message. Ownership: caller owns *out (spn__nccl_free); the
 * devices must outlive it. Thread: any (not concurrently with other NCCL
 * calls on the same devices). */
int32_t spn__nccl_new(spn_device_t *const *devs, uint32_t n, spn__nccl_t **out, spn_error_t *err);
void spn__nccl_free(spn__nccl_t **comm);
uint32_t spn__nccl_size(const spn__nccl_t *comm);

/* Copy `size` bytes of bufs[root] into every bufs[i] (bufs[i] a device
 * buffer of rank i's device, at least `size` bytes), on the ranks' streams,
 * and wait for it. Thread: any, one call at a time per communicator. */
int32_t spn__nccl_broadcast(spn__nccl_t *comm, spn_buffer_t *const *bufs, uint32_t root, size_t size,
                            spn_error_t *err);

/* Broadcast n_items device buffers from rank `root`: item i is sizes[i]
 * bytes at ptrs[i * n + root], copied into ptrs[i * n + r] for every rank r
 * (n ranks; each pointer device memory of its rank's GPU, allocated with
 * cudaMalloc). Issued in NCCL groups of up to 64 items on the ranks'
 * streams, then waited for. Thread: as above. */
int32_t spn__nccl_broadcast_many(spn__nccl_t *comm, uint32_t root, size_t n_items, void *const *ptrs,
                                 const size_t *sizes, spn_error_t *err);

/* Move `size` bytes from src (on rank `from`'s device) to dst (on rank
 * `to`'s), a grouped ncclSend/ncclRecv on the two ranks' streams, and wait
 * for it (from == to is a copy through NCCL). Thread: as above. */
int32_t spn__nccl_sendrecv(spn__nccl_t *comm, spn_buffer_t *src, uint32_t from, spn_buffer_t *dst, uint32_t to,
                           size_t size, spn_error_t *err);

#endif
