/* test-wav2lip-cuda-geometry.c — spn_w2l_prepare_cuda, spn_w2l_paste_cuda
 * and spn_w2l_mel_gather_cuda (stages/lipsync/wav2lip-cuda.c) against their
 * CPU twins, without a GPU.
 *
 * wav2lip-cuda.c is built here with the kernels it calls (image.cuh)
 * replaced by their CPU references (spindle/image.h) and the 2-D copy and
 * set by fakes on host memory that refuse to reach outside the buffers the
 * test gave: what is checked is the GPU twins' own part — the crop view, the
 * masked half made with cudaMemcpy2DAsync / cudaMemset2DAsync over the three
 * planes, the scratch sizes and the paste rectangle, the mel windows and
 * their launches — which must give the CPU twins' floats and bytes exactly
 * (tests/lipsync/test-wav2lip-gpu.c checks the real kernels on a GPU).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "image.cuh"
#include "mel.cuh"
#include "wav2lip.h"

#define W 160
#define H 120

/* The regions the fakes may touch: [lo, hi) each. */
static struct {
  const unsigned char *lo[8], *hi[8];
  int n, out_of_bounds;
} g;

static void allow(const void *p, size_t n) {
  g.lo[g.n] = p;
  g.hi[g.n++] = (const unsigned char *)p + n;
}
static bool inside(const void *p, size_t n) {
  for (int i = 0; i < g.n; i++)
    if ((const unsigned char *)p >= g.lo[i] && (const unsigned char *)p + n <= g.hi[i])
      return true;
  return false;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k, (void)s;
  if (width > dpitch || width > spitch || !inside(dst, (height - 1) * dpitch + width) ||
      !inside(src, (height - 1) * spitch + width)) {
    g.out_of_bounds++;
    return cudaErrorInvalidValue;
  }
  for (size_t y = 0; y < height; y++)
    memmove((char *)dst + y * dpitch, (const char *)src + y * spitch, width);
  return cudaSuccess;
}
cudaError_t cudaMemset2DAsync(void *dst, size_t pitch, int v, size_t width, size_t height, cudaStream_t s) {
  (void)s;
  if (width > pitch || !inside(dst, (height - 1) * pitch + width)) {
    g.out_of_bounds++;
    return cudaErrorInvalidValue;
  }
  for (size_t y = 0; y < height; y++)
    memset((char *)dst + y * pitch, v, width);
  return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "fake error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }

static bool image_inside(const spn_image_t *im) {
  size_t px = im->format == SPN_PIXFMT_RGB24 ? 3 : sizeof(float);
  for (int32_t p = 0; p < im->nplanes; p++)
    if (!inside(im->data[p], (size_t)(im->height - 1) * (size_t)im->stride[p] + (size_t)im->width * px))
      return false;
  return true;
}
#define CHECK(im)                                                  \
  do {                                                             \
    if (!image_inside(im)) {                                       \
      g.out_of_bounds++;                                           \
      return spn_error_set(err, SPN_EINVAL, "image out of bounds"); \
    }                                                              \
  } while (0)

int32_t spn_cuda_resize_bilinear(const spn_image_t *src, spn_image_t *dst, cudaStream_t s, spn_error_t *err) {
  (void)s;
  CHECK(src);
  CHECK(dst);
  return spn_image_resize(src, dst, SPN_INTERP_BILINEAR, err);
}
int32_t spn_cuda_to_float(const spn_image_t *src, spn_image_t *dst, const float mean[3], const float scale[3],
                          cudaStream_t s, spn_error_t *err) {
  (void)s;
  CHECK(src);
  CHECK(dst);
  return spn_image_to_float(src, dst, mean, scale, err);
}
int32_t spn_cuda_unit_to_u8(const spn_image_t *src, spn_image_t *dst, cudaStream_t s, spn_error_t *err) {
  (void)s;
  CHECK(src);
  CHECK(dst);
  bool sbgr = src->format == SPN_PIXFMT_BGRF32P, dbgr = dst->format == SPN_PIXFMT_BGR24;
  for (int32_t y = 0; y < dst->height; y++)
    for (int32_t x = 0; x < dst->width; x++)
      for (int c = 0; c < 3; c++) {
        float v = ((const float *)(src->data[c] + y * src->stride[c]))[x] * 255.0f;
        v = v > 0.0f ? (v < 255.0f ? v : 255.0f) : 0.0f;
        int colour = sbgr ? 2 - c : c;
        dst->data[0][y * dst->stride[0] + 3 * x + (dbgr ? 2 - colour : colour)] = (uint8_t)(v + 0.5f);
      }
  return SPN_OK;
}
int32_t spn_cuda_feather_mask(spn_image_t *mask, float feather, cudaStream_t s, spn_error_t *err) {
  (void)s;
  CHECK(mask);
  return spn_image_feather_mask(mask, feather, err);
}
int32_t spn_cuda_paste(spn_image_t *dst, const spn_image_t *src, int32_t x, int32_t y, const spn_image_t *mask,
                       cudaStream_t s, spn_error_t *err) {
  (void)s;
  CHECK(dst);
  CHECK(src);
  if (mask)
    CHECK(mask);
  return spn_image_paste(dst, src, x, y, mask, err);
}

static int g_mel_calls, g_mel_most; /* spn_cuda_mel_gather's calls, the most windows in one */
int32_t spn_cuda_mel_gather(float *dst, int32_t n_rows, int32_t bins, int32_t steps, const spn_cuda_mel_window_t *w,
                            size_t n, cudaStream_t s, spn_error_t *err) {
  (void)s;
  g_mel_calls++;
  g_mel_most = (int)n > g_mel_most ? (int)n : g_mel_most;
  for (size_t k = 0; k < n; k++) {
    if (w[k].start < 0 || w[k].start + steps > w[k].cols || w[k].row < 0 || w[k].row >= n_rows ||
        !inside(w[k].spec, (size_t)bins * (size_t)w[k].cols * sizeof(float)) ||
        !inside(dst + (size_t)w[k].row * bins * steps, (size_t)bins * steps * sizeof(float))) {
      g.out_of_bounds++;
      return spn_error_set(err, SPN_EINVAL, "mel window out of bounds");
    }
    for (int32_t b = 0; b < bins; b++)
      memcpy(dst + ((size_t)w[k].row * bins + b) * steps, w[k].spec + (size_t)b * w[k].cols + w[k].start,
             (size_t)steps * sizeof(float));
  }
  return SPN_OK;
}

static uint32_t rng(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}

/* crops inside, the whole frame, a corner, odd sizes, one pixel wide */
static const spn_w2l_rect_t k_rects[] = {{40, 30, 60, 60}, {0, 0, W, H}, {150, 110, 10, 10},
                                         {7, 3, 95, 41},   {159, 0, 1, 120}};

static void prepare_cuda_gives_the_cpu_floats(void **state) {
  (void)state;
  uint32_t seed = 3;
  static uint8_t px[W * H * 3], small[96 * 96 * 3];
  static float want[SPN_W2L_FACE_FLOATS], got[SPN_W2L_FACE_FLOATS];
  for (size_t r = 0; r < sizeof k_rects / sizeof *k_rects; r++) {
    for (size_t i = 0; i < sizeof px; i++)
      px[i] = (uint8_t)rng(&seed);
    spn_image_t frame = SPN_IMAGE_INIT;
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_image_wrap(&frame, px, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
    assert_int_equal(spn_w2l_prepare(&frame, &k_rects[r], want, &err), SPN_OK);
    memset(got, 0x7f, sizeof got); /* NaN-ish garbage: anything not written shows */
    g.n = 0;
    allow(px, sizeof px);
    allow(small, sizeof small);
    allow(got, sizeof got);
    if (spn_w2l_prepare_cuda(&frame, &k_rects[r], got, small, NULL, &err) != SPN_OK)
      fail_msg("prepare_cuda rect %zu: %s", r, err.msg);
    assert_int_equal(g.out_of_bounds, 0);
    assert_memory_equal(got, want, sizeof want);
  }
}

static void paste_cuda_gives_the_cpu_bytes(void **state) {
  (void)state;
  uint32_t seed = 9;
  static uint8_t base[W * H * 3], want[W * H * 3], got[W * H * 3], small[96 * 96 * 3], big[W * H * 3];
  static float out3[SPN_W2L_OUT_FLOATS], mask[W * H];
  const float feathers[] = {0.0f, 4.0f};
  for (size_t r = 0; r < sizeof k_rects / sizeof *k_rects; r++)
    for (size_t f = 0; f < 2; f++) {
      for (size_t i = 0; i < sizeof base; i++)
        base[i] = (uint8_t)rng(&seed);
      for (size_t i = 0; i < SPN_W2L_OUT_FLOATS; i++)
        out3[i] = (float)(rng(&seed) % 1400) / 1000.0f - 0.2f; /* some outside [0, 1] */
      memcpy(want, base, sizeof base);
      memcpy(got, base, sizeof base);
      spn_image_t fw = SPN_IMAGE_INIT, fg = SPN_IMAGE_INIT;
      spn_error_t err = SPN_ERROR_INIT;
      assert_int_equal(spn_image_wrap(&fw, want, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
      assert_int_equal(spn_image_wrap(&fg, got, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
      assert_int_equal(spn_w2l_paste(&fw, &k_rects[r], out3, feathers[f], &err), SPN_OK);
      const spn_w2l_rect_t *rc = &k_rects[r];
      g.n = 0;
      allow(got, sizeof got);
      allow(out3, sizeof out3);
      allow(small, sizeof small);
      allow(big, (size_t)rc->w * rc->h * 3);  /* the scratch sizes wav2lip.h gives */
      allow(mask, (size_t)rc->w * rc->h * sizeof(float));
      if (spn_w2l_paste_cuda(&fg, rc, out3, feathers[f], small, big, mask, NULL, &err) != SPN_OK)
        fail_msg("paste_cuda rect %zu feather %g: %s", r, feathers[f], err.msg);
      assert_int_equal(g.out_of_bounds, 0);
      assert_memory_equal(got, want, sizeof want);
    }
}

static void a_crop_outside_the_frame_is_refused_before_any_work(void **state) {
  (void)state;
  static uint8_t px[W * H * 3], small[96 * 96 * 3];
  static float face[SPN_W2L_FACE_FLOATS];
  spn_image_t frame = SPN_IMAGE_INIT;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_image_wrap(&frame, px, W, H, SPN_PIXFMT_RGB24, &err), SPN_OK);
  const spn_w2l_rect_t bad[] = {{150, 110, 11, 10}, {-1, 0, 10, 10}, {0, 0, 0, 5}};
  g.n = 0; /* any work would be out of bounds */
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_int_equal(spn_w2l_prepare_cuda(&frame, &bad[i], face, small, NULL, &err), SPN_EINVAL);
  assert_int_equal(g.out_of_bounds, 0);
}

/* 200 rows from two spectrograms, the last chunks clamped to the end:
 * spn_w2l_mel_chunk's windows in the rows named, in two launches (128 + 72). */
static void mel_gather_cuda_gives_the_cpu_chunks_in_launches_of_128(void **state) {
  (void)state;
  enum { ROWS = 200, COLS_A = 90, COLS_B = 17 };
  static float a[SPN_W2L_MEL_BINS * COLS_A], b[SPN_W2L_MEL_BINS * COLS_B], got[ROWS * SPN_W2L_MEL_FLOATS],
      want[SPN_W2L_MEL_FLOATS];
  uint32_t seed = 11;
  for (size_t i = 0; i < sizeof a / sizeof *a; i++)
    a[i] = (float)rng(&seed);
  for (size_t i = 0; i < sizeof b / sizeof *b; i++)
    b[i] = (float)rng(&seed);
  spn_w2l_mel_src_t src[ROWS];
  for (int32_t r = 0; r < ROWS; r++)
    src[r] = r % 2 ? (spn_w2l_mel_src_t){.mel = a, .n_frames = COLS_A, .fps = 25.0, .i = r / 2, .row = ROWS - 1 - r}
                   : (spn_w2l_mel_src_t){.mel = b, .n_frames = COLS_B, .fps = 30.0, .i = r / 2, .row = ROWS - 1 - r};
  g.n = 0;
  allow(a, sizeof a);
  allow(b, sizeof b);
  allow(got, sizeof got);
  g_mel_calls = g_mel_most = 0;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_w2l_mel_gather_cuda(got, ROWS, src, ROWS, NULL, &err) != SPN_OK)
    fail_msg("mel_gather_cuda: %s", err.msg);
  assert_int_equal(g.out_of_bounds, 0);
  assert_int_equal(g_mel_calls, 2);
  assert_int_equal(g_mel_most, SPN_CUDA_MEL_LAUNCH_ROWS);
  for (int32_t r = 0; r < ROWS; r++) {
    assert_int_equal(spn_w2l_mel_chunk(src[r].mel, src[r].n_frames, src[r].i, src[r].fps, want, &err), SPN_OK);
    assert_memory_equal(got + (size_t)src[r].row * SPN_W2L_MEL_FLOATS, want, sizeof want);
  }
  /* No chunk for a source: refused before the first launch. */
  src[150].n_frames = 0;
  g_mel_calls = 0;
  assert_int_equal(spn_w2l_mel_gather_cuda(got, ROWS, src, ROWS, NULL, &err), SPN_EINVAL);
  assert_int_equal(g_mel_calls, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(prepare_cuda_gives_the_cpu_floats),
      cmocka_unit_test(paste_cuda_gives_the_cpu_bytes),
      cmocka_unit_test(a_crop_outside_the_frame_is_refused_before_any_work),
      cmocka_unit_test(mel_gather_cuda_gives_the_cpu_chunks_in_launches_of_128),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
