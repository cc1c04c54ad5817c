/* test-wav2lip-gpu.c — spn_w2l_prepare_cuda and spn_w2l_paste_cuda
 * (stages/lipsync/wav2lip-cuda.c) against their CPU twins in wav2lip.c, on
 * random frames and crops (suite gpu; exits 77 without a device).
 *
 * The kernels repeat the CPU's arithmetic (cuda/kernels/image.cu), so the
 * prepared batch must match within 1e-6 and the pasted frame within one
 * level on at most 0.1% of the bytes (a value within an ulp of a rounding
 * half), and not at all outside the crop.
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

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(prepare_matches_cpu),
      cmocka_unit_test(paste_matches_cpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
