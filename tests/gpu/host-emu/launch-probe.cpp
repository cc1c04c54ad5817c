/* launch-probe.cpp — one kernel launched through kernel-emu.h's launch, for
 * test-cuda-fakes.c to check which launch configurations the fake GPU
 * refuses (spn_emu_launch_invalid), as a GPU would. Test code only. */
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernel-emu.h"

/* Each thread adds one to *hits (the emulated threads run one after
 * another, so the plain add is exact). */
static void probe_kernel(int64_t *hits) { (*hits)++; }

extern "C" cudaError_t spn_emu_probe_launch(int64_t *hits, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, size_t shmem) {
  spn_emu_launch(dim3(gx, gy, gz), dim3(bx, by, bz), shmem, (cudaStream_t)0, false, "probe_kernel", probe_kernel,
                 hits);
  return cudaGetLastError();
}
