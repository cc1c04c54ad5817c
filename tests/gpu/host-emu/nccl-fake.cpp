/* nccl-fake.cpp — the NCCL calls of cuda/nccl.c over the fake CUDA runtime's
 * host memory (tests/gpu/host-emu/README), linked instead of libnccl in
 * builds with NCCL. Communicators from ncclCommInitAll know their rank and
 * size; the collectives and point-to-point calls of one group
 * (ncclGroupStart ... ncclGroupEnd, or one call outside a group) are matched
 * at its end: the k-th broadcast of a rank copies the root's k-th broadcast
 * buffer into its own (the sizes must agree, as NCCL requires), a send goes
 * to the receive the peer posted for it (in order). Only ncclInt8/Uint8
 * /Float32/Float16 sizes are known; the buffers must be device memory.
 * SPN_EMU_NCCL_FAIL=1 makes ncclCommInitAll fail (as with an unusable
 * interconnect). Test code only; one group at a time (cuda/nccl.c calls
 * them under a lock). */
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <vector>

#include <nccl.h>

#include "fake-internal.h"

struct ncclComm {
  int rank, size;
};

namespace {

struct op {
  int kind; /* 0 broadcast, 1 send, 2 recv */
  const void *src;
  void *dst;
  size_t bytes;
  int rank, peer; /* peer: the root of a broadcast */
  cudaStream_t s;
};

std::mutex lock;
int depth;
std::vector<op> pending;

size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: return 2;
  case ncclFloat64: case ncclInt64: case ncclUint64: return 8;
  default: return 4;
  }
}

ncclResult_t flush() {
  std::vector<op> ops;
  ops.swap(pending);
  for (size_t i = 0; i < ops.size(); i++) {
    const op &o = ops[i];
    if (o.kind == 0) {
      /* This rank's k-th broadcast matches the root's k-th. */
      size_t k = 0;
      for (size_t j = 0; j < i; j++)
        k += ops[j].kind == 0 && ops[j].rank == o.rank;
      const op *root = nullptr;
      for (const op &r : ops) {
        if (r.kind != 0 || r.rank != o.peer)
          continue;
        if (!k) {
          root = &r;
          break;
        }
        k--;
      }
      if (!root || !root->src || root->bytes != o.bytes)
        return ncclInvalidUsage;
      const void *src = root->src;
      void *dst = o.dst;
      size_t n = o.bytes;
      spn_emu_stream_do(o.s, [=] { memmove(dst, src, n); });
    } else if (o.kind == 2) {
      const op *from = nullptr;
      for (const op &r : ops)
        if (r.kind == 1 && r.rank == o.peer && r.peer == o.rank && r.bytes == o.bytes && !from)
          from = &r;
      if (!from)
        return ncclInvalidUsage;
      void *dst = o.dst;
      const void *src = from->src;
      size_t n = o.bytes;
      spn_emu_stream_do(o.s, [=] { memmove(dst, src, n); });
    }
  }
  return ncclSuccess;
}

ncclResult_t post(op o) {
  if ((o.src && !spn_emu_is_device(o.src, o.bytes)) || (o.dst && !spn_emu_is_device(o.dst, o.bytes))) {
    spn_emu_complain("NCCL: a buffer of %zu bytes is not device memory", o.bytes);
    return ncclInvalidArgument;
  }
  std::lock_guard<std::mutex> g(lock);
  pending.push_back(o);
  return depth ? ncclSuccess : flush();
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "NCCL error (fake)"; }

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devs) {
  (void)devs;
  const char *f = getenv("SPN_EMU_NCCL_FAIL");
  if (f && *f && strcmp(f, "0"))
    return ncclSystemError;
  for (int i = 0; i < n; i++)
    comms[i] = new ncclComm{i, n};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  std::lock_guard<std::mutex> g(lock);
  depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  std::lock_guard<std::mutex> g(lock);
  if (!depth)
    return ncclInvalidUsage;
  return --depth ? ncclSuccess : flush();
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s) {
  return post(op{0, c->rank == root ? send : nullptr, recv, count * type_size(t), c->rank, root, s});
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  return post(op{1, send, nullptr, count * type_size(t), c->rank, peer, s});
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  return post(op{2, nullptr, recv, count * type_size(t), c->rank, peer, s});
}

} // extern "C"
