/* cuda/kernels/mel.cu — mel windows gathered into a batch (see mel.cuh).
 *
 * One thread per value of a window: block (x, y) covers values
 * [x * 256, x * 256 + 256) of window y of the launch's table, so the threads
 * of a block write one contiguous run of the batch row. A plain copy: the
 * values come out bit for bit as the CPU's memcpy leaves them. */
#include <stdint.h>

#include "kernel-common.cuh"
#include "mel.cuh"

namespace {

/* The windows of one launch, passed by value in the kernel's parameters. */
struct mel_table {
  spn_cuda_mel_window_t w[SPN_CUDA_MEL_LAUNCH_ROWS];
};
static_assert(sizeof(mel_table) + 64 <= 4096, "a launch's windows must fit CUDA's 4 KB of kernel parameters");

const int32_t k_threads = 256;

__global__ void mel_gather_kernel(float *dst, int32_t bins, int32_t steps, mel_table t) {
  int32_t k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= bins * steps)
    return;
  const spn_cuda_mel_window_t &w = t.w[blockIdx.y];
  int32_t b = k / steps, s = k - b * steps;
  dst[(int64_t)w.row * bins * steps + k] = w.spec[(int64_t)b * w.cols + w.start + s];
}

} // namespace

extern "C" int32_t spn_cuda_mel_gather(float *dst, int32_t n_rows, int32_t bins, int32_t steps,
                                       const spn_cuda_mel_window_t *w, size_t n, cudaStream_t stream,
                                       spn_error_t *err) {
  if (!n)
    return SPN_OK;
  if (!dst || !w || n_rows <= 0 || bins <= 0 || steps <= 0 || bins > INT32_MAX / steps)
    return spn_error_set(err, SPN_EINVAL, "cuda mel: gather: bad batch (%d rows of %dx%d, dst %p, %zu windows)",
                         (int)n_rows, (int)bins, (int)steps, (void *)dst, n);
  /* Every window is checked before the first launch: a bad one queues
   * nothing. */
  for (size_t i = 0; i < n; i++)
    if (!w[i].spec || w[i].row < 0 || w[i].row >= n_rows || w[i].cols < steps || w[i].start < 0 ||
        w[i].start > w[i].cols - steps)
      return spn_error_set(err, SPN_EINVAL,
                           "cuda mel: gather: window %zu (columns %d..%d of %d, row %d of %d) is outside its "
                           "spectrogram or the batch",
                           i, (int)w[i].start, (int)w[i].start + (int)steps - 1, (int)w[i].cols, (int)w[i].row,
                           (int)n_rows);
  int32_t per_row = bins * steps;
  for (size_t off = 0; off < n; off += SPN_CUDA_MEL_LAUNCH_ROWS) {
    size_t m = n - off < SPN_CUDA_MEL_LAUNCH_ROWS ? n - off : SPN_CUDA_MEL_LAUNCH_ROWS;
    mel_table t = {};
    for (size_t i = 0; i < m; i++)
      t.w[i] = w[off + i];
    dim3 grid((unsigned)((per_row + k_threads - 1) / k_threads), (unsigned)m);
    mel_gather_kernel<<<grid, k_threads, 0, stream>>>(dst, bins, steps, t);
    int32_t rc = spn_kernels::launched("cuda mel", "gather", err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}
