/* kernel-emu.h — what a kernel family's source needs to build with the host
 * compiler (cu2host.py prepends it): the thread coordinates, a launch that
 * runs the grid one thread after another, and the rounding intrinsics as
 * plain operations (x86-64 rounds each to nearest, as the intrinsics do;
 * built with -ffp-contract=off so nothing is fused). Test code only.
 *
 * Without SPN_EMU_FAKE_RUNTIME the runtime calls are runtime-emu.h's macros
 * and a launch runs at once. With it (the engine's kernels, linked with
 * cuda-fake.cpp) a launch is handed to its stream: run at once, or recorded
 * when the stream is capturing a CUDA Graph and run at each replay. */
#ifndef SPN_TEST_KERNEL_EMU_H
#define SPN_TEST_KERNEL_EMU_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#ifdef SPN_EMU_FAKE_RUNTIME
/* cuda-fake.cpp: run fn on stream s (now, or at each replay of the graph
 * s is capturing); whether a kernel may dereference p (device or pinned
 * memory), else the launch's error is recorded as a kernel's illegal
 * address would be. */
void spn_emu_stream_do(cudaStream_t s, std::function<void()> fn);
bool spn_emu_kernel_pointer_ok(const void *p, const char *kernel, int arg);
/* cuda-fake.cpp: a launch CUDA refuses (its configuration), or one whose
 * kernel would fault: a line on stderr, and e for the next cudaGetLastError. */
void spn_emu_launch_refused(const char *kernel, const char *why, cudaError_t e);
/* cuda-fake.cpp: one more kernel launch for SPN_EMU_CUDA_STATS. */
void spn_emu_count_launch(void);
#else
#include "runtime-emu.h"
/* Without the fake runtime, a refused launch's error is kept here for the
 * family's own cudaGetLastError (its wrappers return it after a launch). */
inline thread_local cudaError_t spn_emu_launch_error = cudaSuccess;
inline cudaError_t spn_emu_take_launch_error(void) {
  cudaError_t e = spn_emu_launch_error;
  spn_emu_launch_error = cudaSuccess;
  return e;
}
#undef cudaGetLastError
#define cudaGetLastError() spn_emu_take_launch_error()
inline void spn_emu_launch_refused(const char *kernel, const char *why, cudaError_t e) {
  fprintf(stderr, "fake GPU: kernel launch (%s) refused: %s\n", kernel, why);
  spn_emu_launch_error = e;
}
#endif

inline thread_local uint3 spn_emu_block_idx, spn_emu_thread_idx;
inline thread_local dim3 spn_emu_block_dim, spn_emu_grid_dim;
inline thread_local pthread_barrier_t *spn_emu_block_barrier;
#define blockIdx spn_emu_block_idx
#define threadIdx spn_emu_thread_idx
#define blockDim spn_emu_block_dim
#define gridDim spn_emu_grid_dim
/* __shared__ storage is a static: one per kernel, which the threads of the
 * block running (barrier kernels run one block at a time, under a lock)
 * share. */
#undef __shared__
#define __shared__ static
#define __syncthreads() ((void)pthread_barrier_wait(spn_emu_block_barrier))

/* One thread of a block at (b, t). */
template <class F> inline void spn_emu_thread(dim3 grid, dim3 block, uint3 b, uint3 t, const F &body) {
  spn_emu_grid_dim = grid;
  spn_emu_block_dim = block;
  spn_emu_block_idx = b;
  spn_emu_thread_idx = t;
  body();
}

/* The grid, one thread after another; with barrier, each block's threads as
 * host threads that meet at __syncthreads. */
template <class F> inline void spn_emu_grid(dim3 grid, dim3 block, bool barrier, const F &body) {
  static std::mutex block_lock;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        uint3 b = {bx, by, bz};
        if (!barrier) {
          for (unsigned tz = 0; tz < block.z; tz++)
            for (unsigned ty = 0; ty < block.y; ty++)
              for (unsigned tx = 0; tx < block.x; tx++)
                spn_emu_thread(grid, block, b, uint3{tx, ty, tz}, body);
          continue;
        }
        std::lock_guard<std::mutex> hold(block_lock);
        unsigned nt = block.x * block.y * block.z;
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, nt);
        std::vector<std::thread> th;
        for (unsigned tz = 0; tz < block.z; tz++)
          for (unsigned ty = 0; ty < block.y; ty++)
            for (unsigned tx = 0; tx < block.x; tx++)
              th.emplace_back([&, tx, ty, tz] {
                spn_emu_block_barrier = &bar;
                spn_emu_thread(grid, block, b, uint3{tx, ty, tz}, body);
              });
        for (auto &t : th)
          t.join();
        pthread_barrier_destroy(&bar);
      }
}

/* What every GPU we build for refuses at a launch (compute capability 5.0
 * and later): an empty grid or block, more than 1024 threads in a block
 * (1024 along x or y, 64 along z), a grid over 2^31 - 1 blocks along x or
 * 65535 along y or z, or over 48 KiB of dynamic shared memory (more needs
 * cudaFuncSetAttribute, which no kernel here asks for). The launch then
 * does nothing and cudaGetLastError says cudaErrorInvalidConfiguration, as
 * on a GPU, where only running on it would otherwise show it. Returns why,
 * or NULL when the launch is valid. */
inline const char *spn_emu_launch_invalid(dim3 grid, dim3 block, size_t shmem) {
  if (!grid.x || !grid.y || !grid.z)
    return "an empty grid";
  if (!block.x || !block.y || !block.z)
    return "an empty block";
  if (block.x > 1024 || block.y > 1024 || block.z > 64 ||
      (unsigned long long)block.x * block.y * block.z > 1024)
    return "over 1024 threads in a block (or over 1024 along x or y, 64 along z)";
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return "a grid over 2^31 - 1 blocks along x or 65535 along y or z";
  if (shmem > 48 * 1024)
    return "over 48 KiB of dynamic shared memory";
  return NULL;
}

/* kernel<<<grid, block, shmem, stream>>>(args): the arguments are copied
 * here (evaluated at the launch, as CUDA does); the shared-memory size is
 * checked (spn_emu_launch_invalid) and otherwise unused. */
#ifdef SPN_EMU_FAKE_RUNTIME
/* Every pointer argument is null or points into device (or pinned) memory:
 * a host pointer handed to a kernel faults on a GPU. */
template <class... A> inline bool spn_emu_pointers_ok(const char *kernel, const A &...args) {
  bool ok = true;
  int i = 0;
  auto one = [&](const auto &a) {
    if constexpr (std::is_pointer_v<std::decay_t<decltype(a)>>)
      if (a && !spn_emu_kernel_pointer_ok((const void *)a, kernel, i))
        ok = false;
    i++;
  };
  (one(args), ...);
  return ok;
}
#endif

/* Every pointer argument T * is aligned to T: a GPU's load or store of a
 * misaligned T faults (cudaErrorMisalignedAddress), where x86-64 reads it
 * anyway. The launch is then refused as that fault would end it. Returns
 * the first misaligned argument's index, or -1. */
template <class... A> inline int spn_emu_misaligned(const A &...args) {
  int i = 0, bad = -1;
  auto one = [&](const auto &a) {
    using P = std::decay_t<decltype(a)>;
    if constexpr (std::is_pointer_v<P> && !std::is_void_v<std::remove_cv_t<std::remove_pointer_t<P>>>)
      if (bad < 0 && ((uintptr_t)a % alignof(std::remove_pointer_t<P>)) != 0)
        bad = i;
    i++;
  };
  (one(args), ...);
  return bad;
}

template <class K, class... A>
inline void spn_emu_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, bool barrier, const char *name,
                           K kernel, A... args) {
  if (const char *why = spn_emu_launch_invalid(grid, block, shmem)) {
    spn_emu_launch_refused(name, why, cudaErrorInvalidConfiguration);
    return;
  }
  if (int bad = spn_emu_misaligned(args...); bad >= 0) {
    char why[96];
    snprintf(why, sizeof why, "argument %d is not aligned to its type (a GPU faults on the access)", bad);
    spn_emu_launch_refused(name, why, cudaErrorMisalignedAddress);
    return;
  }
  auto run = [=] { spn_emu_grid(grid, block, barrier, [&] { kernel(args...); }); };
#ifdef SPN_EMU_FAKE_RUNTIME
  spn_emu_count_launch();
  if (!spn_emu_pointers_ok(name, args...))
    return;
  spn_emu_stream_do(s, run);
#else
  (void)s, (void)name;
  run();
#endif
}

/* atomicAdd in a kernel whose threads run one after another (cu2host.py
 * allows it only there): the plain read-modify-write, as any serial order
 * of the threads would leave it. */
template <class T> inline T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }

#endif
