/* kernel-emu.h — what a kernel family's source needs to build with the host
 * compiler (cu2host.py prepends it): the thread coordinates, a launch that
 * runs the grid one thread after another, and the rounding intrinsics as
 * plain operations (x86-64 rounds each to nearest, as the intrinsics do;
 * built with -ffp-contract=off so nothing is fused). Test code only. */
#ifndef SPN_TEST_KERNEL_EMU_H
#define SPN_TEST_KERNEL_EMU_H

#include <math.h>
#include <cuda_runtime_api.h>

#include "runtime-emu.h"

inline thread_local uint3 spn_emu_block_idx, spn_emu_thread_idx;
inline thread_local dim3 spn_emu_block_dim, spn_emu_grid_dim;
#define blockIdx spn_emu_block_idx
#define threadIdx spn_emu_thread_idx
#define blockDim spn_emu_block_dim
#define gridDim spn_emu_grid_dim

/* The launch's shared-memory size and stream (rest) are read and unused. */
template <class F, class... R> inline void spn_emu_launch(dim3 grid, dim3 block, F body, const R &...rest) {
  ((void)rest, ...);
  spn_emu_grid_dim = grid;
  spn_emu_block_dim = block;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++)
        for (unsigned tz = 0; tz < block.z; tz++)
          for (unsigned ty = 0; ty < block.y; ty++)
            for (unsigned tx = 0; tx < block.x; tx++) {
              spn_emu_block_idx = uint3{bx, by, bz};
              spn_emu_thread_idx = uint3{tx, ty, tz};
              body();
            }
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
