/* cuda/kernels/mel.cuh — windows of mel spectrograms gathered into a batch.
 *
 * A lipsync batch's mel input is (B,1,bins,steps): each row is `steps`
 * consecutive columns of one job's (bins, cols) spectrogram. When each job's
 * whole spectrogram already sits in device memory, spn_cuda_mel_gather
 * builds the batch there: every listed window is copied into its row, the
 * rows not listed are left as they are (the caller fills them otherwise).
 * The list travels by value in the kernel's parameters (one launch per
 * SPN_CUDA_MEL_LAUNCH_ROWS windows, a table well inside CUDA's 4 KB of
 * parameter space), so building a batch uploads nothing.
 *
 * The caller chooses each window's start: Wav2Lip's is spn_w2l_mel_start
 * (stages/lipsync/wav2lip.h, which clamps the last window to the end of the
 * audio), and the CPU reference of a row is spn_w2l_mel_chunk; the lipsync
 * stage's twin spn_w2l_mel_gather_cuda is checked against it by
 * tests/lipsync/test-wav2lip-gpu.c (on a GPU, and on the host as
 * wav2lip-gpu-host).
 *
 * Argument errors (sizes, a window outside its spectrogram or a row outside
 * the batch) are reported before any launch as SPN_EINVAL; a failed launch as
 * SPN_ECUDA. Launches on `stream` and returns without waiting. Plain C
 * declarations. Ownership: everything borrowed. Thread: any thread that has
 * made the stream's device current. */
#ifndef SPINDLE_CUDA_KERNELS_MEL_CUH
#define SPINDLE_CUDA_KERNELS_MEL_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Windows per launch: 128 entries of 24 bytes are 3 KB of parameters. */
#define SPN_CUDA_MEL_LAUNCH_ROWS 128

/* One window: columns [start, start + steps) of every bin of `spec`, into
 * batch row `row`. */
typedef struct spn_cuda_mel_window {
  const float *spec; /* (bins, cols) row-major, device memory */
  int32_t cols;      /* the spectrogram's columns (its row pitch in floats) */
  int32_t start;     /* first column: 0 <= start <= cols - steps */
  int32_t row;       /* 0 <= row < n_rows */
} spn_cuda_mel_window_t;

/* Copy the n windows w[0..n) into dst, (n_rows, bins, steps) f32 in device
 * memory (a (B,1,bins,steps) batch has the same layout). Any n: the windows
 * go in launches of SPN_CUDA_MEL_LAUNCH_ROWS. */
int32_t spn_cuda_mel_gather(float *dst, int32_t n_rows, int32_t bins, int32_t steps, const spn_cuda_mel_window_t *w,
                            size_t n, cudaStream_t stream, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
