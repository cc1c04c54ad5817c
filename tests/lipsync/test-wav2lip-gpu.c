/* test-wav2lip-gpu.c — spn_w2l_prepare_cuda, spn_w2l_paste_cuda and
 * spn_w2l_mel_gather_cuda (stages/lipsync/wav2lip-cuda.c) against their CPU
 * twins in wav2lip.c, on random frames and crops and on several jobs'
 * spectrograms (suite gpu; exits 77 without a device).
 *
 * The kernels repeat the CPU's arithmetic (cuda/kernels/image.cu), so the
 * prepared batch must match within 1e-6 and the pasted frame within one
 * level on at most 0.1% of the bytes (a value within an ulp of a rounding
 * half), and not at all outside the crop. The mel chunks are copies: equal
 * bit for bit.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpu-skip.h"
#include "mel.cuh"
#include "wav2lip.h"

#define W 160
#define H 120

static uint32_t rng(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}

static void *dev_copy(const void *src, size_t n) {
  void *d = NULL;
  assert_int_equal(cudaMalloc(&d, n), cudaSuccess);
  if (src)
    assert_int_equal(cudaMemcpy(d, src, n, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

static const spn_w2l_rect_t k_rects[] = {{40, 30, 60, 60}, {0, 0, 160, 120}, {150, 110, 10, 10}, {7, 3, 95, 41}};

static void prepare_matches_cpu(void **state) {
  (void)state;
  uint32_t seed = 1;
  uint8_t *px = malloc((size_t)W * H * 3);
  float *want = malloc(SPN_W2L_FACE_FLOATS * sizeof(float)), *got = malloc(SPN_W2L_FACE_FLOATS * sizeof(float));
  assert_non_null(px);
  assert_non_null(want);
  assert_non_null(got);
  for (size_t r = 0; r < sizeof k_rects / sizeof *k_rects; r++) {
    for (size_t i = 0; i < (size_t)W * H * 3; i++)
      px[i] = (uint8_t)rng(&seed);
    spn_image_t frame = SPN_IMAGE_INIT, dframe = SPN_IMAGE_INIT;
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_image_wrap(&frame, px, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
    assert_int_equal(spn_w2l_prepare(&frame, &k_rects[r], want, &err), SPN_OK);
    void *dpx = dev_copy(px, (size_t)W * H * 3), *dsmall = dev_copy(NULL, 96 * 96 * 3);
    float *dface = dev_copy(NULL, SPN_W2L_FACE_FLOATS * sizeof(float));
    assert_int_equal(spn_image_wrap(&dframe, dpx, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
    if (spn_w2l_prepare_cuda(&dframe, &k_rects[r], dface, dsmall, NULL, &err) != SPN_OK)
      fail_msg("prepare_cuda: %s", err.msg);
    assert_int_equal(cudaMemcpy(got, dface, SPN_W2L_FACE_FLOATS * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < SPN_W2L_FACE_FLOATS; i++)
      if (fabsf(got[i] - want[i]) > 1e-6f)
        fail_msg("rect %zu: face6[%zu] gpu %g cpu %g", r, i, (double)got[i], (double)want[i]);
    cudaFree(dpx);
    cudaFree(dsmall);
    cudaFree(dface);
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t frame = SPN_IMAGE_INIT;
  spn_w2l_rect_t out = {150, 110, 20, 20};
  assert_int_equal(spn_image_wrap(&frame, px, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
  assert_int_equal(spn_w2l_prepare_cuda(&frame, &out, got, NULL, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "not inside"));
  free(px);
  free(want);
  free(got);
}

static void paste_matches_cpu(void **state) {
  (void)state;
  uint32_t seed = 7;
  size_t nb = (size_t)W * H * 3;
  uint8_t *px = malloc(nb), *want = malloc(nb), *got = malloc(nb);
  float *out3 = malloc(SPN_W2L_OUT_FLOATS * sizeof(float));
  assert_non_null(px);
  assert_non_null(want);
  assert_non_null(got);
  assert_non_null(out3);
  const float feathers[] = {0.0f, 4.0f};
  for (size_t r = 0; r < sizeof k_rects / sizeof *k_rects; r++)
    for (size_t f = 0; f < 2; f++) {
      for (size_t i = 0; i < nb; i++)
        px[i] = (uint8_t)rng(&seed);
      for (size_t i = 0; i < SPN_W2L_OUT_FLOATS; i++)
        out3[i] = (float)rng(&seed) / 16777216.0f * 1.2f - 0.1f; /* a little outside 0..1: saturated */
      memcpy(want, px, nb);
      spn_image_t frame = SPN_IMAGE_INIT, dframe = SPN_IMAGE_INIT;
      spn_error_t err = SPN_ERROR_INIT;
      assert_int_equal(spn_image_wrap(&frame, want, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
      assert_int_equal(spn_w2l_paste(&frame, &k_rects[r], out3, feathers[f], &err), SPN_OK);
      size_t crop = (size_t)k_rects[r].w * k_rects[r].h;
      void *dpx = dev_copy(px, nb), *dsmall = dev_copy(NULL, 96 * 96 * 3), *dbig = dev_copy(NULL, crop * 3);
      float *dout = dev_copy(out3, SPN_W2L_OUT_FLOATS * sizeof(float)), *dmask = dev_copy(NULL, crop * sizeof(float));
      assert_int_equal(spn_image_wrap(&dframe, dpx, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
      if (spn_w2l_paste_cuda(&dframe, &k_rects[r], dout, feathers[f], dsmall, dbig, dmask, NULL, &err) != SPN_OK)
        fail_msg("paste_cuda: %s", err.msg);
      assert_int_equal(cudaMemcpy(got, dpx, nb, cudaMemcpyDeviceToHost), cudaSuccess);
      size_t off = 0;
      for (size_t i = 0; i < nb; i++) {
        int d = abs((int)got[i] - (int)want[i]);
        size_t p = i / 3;
        int x = (int)(p % W), y = (int)(p / W);
        bool in = x >= k_rects[r].x && x < k_rects[r].x + k_rects[r].w && y >= k_rects[r].y &&
                  y < k_rects[r].y + k_rects[r].h;
        if (d > 1 || (d && !in))
          fail_msg("rect %zu feather %g: byte %zu (%d,%d) gpu %d cpu %d", r, (double)feathers[f], i, x, y, got[i],
                   want[i]);
        off += (size_t)d;
      }
      if (off * 1000 > crop * 3)
        fail_msg("rect %zu feather %g: %zu values off by one", r, (double)feathers[f], off);
      cudaFree(dpx);
      cudaFree(dsmall);
      cudaFree(dbig);
      cudaFree(dout);
      cudaFree(dmask);
    }
  free(px);
  free(want);
  free(got);
  free(out3);
}

/* Three jobs' spectrograms: a single window's worth, one second, five
 * seconds; each value says where it is (job, bin, column), so a window one
 * column off shows. */
#define MEL_JOBS 3
static const int64_t k_mel_cols[MEL_JOBS] = {16, 81, 401};
static const double k_mel_fps[MEL_JOBS] = {25.0, 30.0, 29.97};

static float *mel_spec(int job, int64_t cols) {
  float *m = malloc((size_t)SPN_W2L_MEL_BINS * (size_t)cols * sizeof *m);
  assert_non_null(m);
  for (int32_t b = 0; b < SPN_W2L_MEL_BINS; b++)
    for (int64_t c = 0; c < cols; c++)
      m[(size_t)b * (size_t)cols + (size_t)c] = -(float)job - (float)b / 100.0f - (float)c / 1e5f;
  return m;
}

#define SENTINEL 12345.0f

static void mel_gather_gives_the_cpu_chunks(void **state) {
  (void)state;
  float *spec[MEL_JOBS], *dspec[MEL_JOBS];
  for (int j = 0; j < MEL_JOBS; j++) {
    spec[j] = mel_spec(j, k_mel_cols[j]);
    dspec[j] = dev_copy(spec[j], (size_t)SPN_W2L_MEL_BINS * (size_t)k_mel_cols[j] * sizeof(float));
  }
  /* 300 rows (three launches): rows cycle through the jobs and, per job,
   * through its chunks in steps of 5 from the first (start 0) to two past
   * its last (clamped to the end: spn_w2l_mel_start clamps any later frame
   * there too); every 7th row is named by no source (a chunk uploaded
   * instead) and must keep what it held. */
  enum { ROWS = 300 };
  spn_w2l_mel_src_t src[ROWS];
  size_t n = 0;
  int64_t next[MEL_JOBS] = {0};
  int clamped[MEL_JOBS] = {0};
  for (int32_t r = 0; r < ROWS; r++) {
    if (r % 7 == 3)
      continue;
    int j = r % MEL_JOBS;
    int64_t chunks = spn_w2l_mel_chunks(k_mel_fps[j], k_mel_cols[j]);
    int64_t i = next[j]++ * 5 % (chunks + 2);
    clamped[j] += i > 0 && spn_w2l_mel_start(i, k_mel_fps[j], k_mel_cols[j]) == k_mel_cols[j] - SPN_W2L_MEL_STEPS;
    src[n++] = (spn_w2l_mel_src_t){.mel = dspec[j], .n_frames = k_mel_cols[j], .fps = k_mel_fps[j], .i = i, .row = r};
  }
  for (int j = 0; j < MEL_JOBS; j++)
    assert_true(clamped[j] > 0);
  size_t nb = (size_t)ROWS * SPN_W2L_MEL_FLOATS * sizeof(float);
  float *got = malloc(nb), *want = malloc(SPN_W2L_MEL_FLOATS * sizeof(float));
  assert_non_null(got);
  assert_non_null(want);
  for (size_t k = 0; k < (size_t)ROWS * SPN_W2L_MEL_FLOATS; k++)
    got[k] = SENTINEL;
  float *dbatch = dev_copy(got, nb);
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_w2l_mel_gather_cuda(dbatch, ROWS, src, n, NULL, &err) != SPN_OK)
    fail_msg("mel_gather_cuda: %s", err.msg);
  assert_int_equal(cudaMemcpy(got, dbatch, nb, cudaMemcpyDeviceToHost), cudaSuccess);
  size_t k = 0;
  for (int32_t r = 0; r < ROWS; r++) {
    const float *row = got + (size_t)r * SPN_W2L_MEL_FLOATS;
    if (k < n && src[k].row == r) {
      int j = r % MEL_JOBS;
      assert_int_equal(spn_w2l_mel_chunk(spec[j], k_mel_cols[j], src[k].i, k_mel_fps[j], want, &err), SPN_OK);
      if (memcmp(row, want, SPN_W2L_MEL_FLOATS * sizeof(float)))
        fail_msg("row %d (job %d, chunk %lld): not spn_w2l_mel_chunk's", (int)r, j, (long long)src[k].i);
      k++;
    } else {
      for (size_t v = 0; v < SPN_W2L_MEL_FLOATS; v++)
        if (row[v] != SENTINEL)
          fail_msg("row %d, named by no source, was written", (int)r);
    }
  }
  /* A source without such a chunk, or outside the batch, is refused before
   * anything is queued: the first rows keep the chunks written above. */
  spn_w2l_mel_src_t bad[2] = {src[0], src[1]};
  bad[1].row = ROWS;
  assert_int_equal(spn_w2l_mel_gather_cuda(dbatch, ROWS, bad, 2, NULL, &err), SPN_EINVAL);
  bad[1] = src[1];
  bad[0].i = -1;
  assert_int_equal(spn_w2l_mel_gather_cuda(dbatch, ROWS, bad, 2, NULL, &err), SPN_EINVAL);
  bad[0] = src[0];
  bad[0].n_frames = SPN_W2L_MEL_STEPS - 1;
  assert_int_equal(spn_w2l_mel_gather_cuda(dbatch, ROWS, bad, 2, NULL, &err), SPN_EINVAL);
  float *again = malloc(nb);
  assert_non_null(again);
  assert_int_equal(cudaMemcpy(again, dbatch, nb, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_memory_equal(again, got, nb);
  free(again);
  cudaFree(dbatch);
  free(got);
  free(want);
  for (int j = 0; j < MEL_JOBS; j++) {
    cudaFree(dspec[j]);
    free(spec[j]);
  }
}

/* The kernel family's own entry point splits any number of windows into
 * launches of SPN_CUDA_MEL_LAUNCH_ROWS (the twin above hands it at most
 * that many at a time): 200 windows of other sizes, in reverse row order. */
static void mel_gather_kernel_splits_its_launches(void **state) {
  (void)state;
  enum { N = 200, BINS = 3, STEPS = 5, COLS = 40 };
  assert_true(N > SPN_CUDA_MEL_LAUNCH_ROWS);
  float spec[BINS * COLS];
  for (int i = 0; i < BINS * COLS; i++)
    spec[i] = (float)i;
  float *dspec = dev_copy(spec, sizeof spec);
  spn_cuda_mel_window_t w[N];
  for (int i = 0; i < N; i++)
    w[i] = (spn_cuda_mel_window_t){.spec = dspec, .cols = COLS, .start = i % (COLS - STEPS + 1), .row = N - 1 - i};
  float *got = malloc(N * BINS * STEPS * sizeof(float));
  assert_non_null(got);
  float *dbatch = dev_copy(NULL, N * BINS * STEPS * sizeof(float));
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_cuda_mel_gather(dbatch, N, BINS, STEPS, w, N, NULL, &err) != SPN_OK)
    fail_msg("spn_cuda_mel_gather: %s", err.msg);
  assert_int_equal(cudaMemcpy(got, dbatch, N * BINS * STEPS * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < N; i++)
    for (int b = 0; b < BINS; b++)
      for (int s = 0; s < STEPS; s++)
        if (got[(N - 1 - i) * BINS * STEPS + b * STEPS + s] != spec[b * COLS + w[i].start + s])
          fail_msg("window %d (row %d): bin %d step %d", i, N - 1 - i, b, s);
  /* A window past its spectrogram's end is refused. */
  w[N - 1].start = COLS - STEPS + 1;
  assert_int_equal(spn_cuda_mel_gather(dbatch, N, BINS, STEPS, w, N, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "window 199"));
  cudaFree(dbatch);
  cudaFree(dspec);
  free(got);
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(prepare_matches_cpu),
      cmocka_unit_test(paste_matches_cpu),
      cmocka_unit_test(mel_gather_gives_the_cpu_chunks),
      cmocka_unit_test(mel_gather_kernel_splits_its_launches),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
