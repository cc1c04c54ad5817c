/* test-cuda-color.c — cuda/kernels/color.cu against spn_image_convert
 * (suite gpu; exits 77 without a device).
 *
 * Random RGB24/BGR24 images, even and odd sizes, are converted to YUV420P
 * and NV12 by the CPU reference and by the kernel (on device copies whose
 * rows have a wider pitch than the host's, so strides are exercised); the
 * results must be equal byte for byte: the kernel repeats the reference's
 * float operations in order with explicit rounding (no fused multiply-add),
 * so there is no tie that may round the other way — a single differing byte
 * is a bug. The same for NV12 <-> YUV420P, which moves bytes only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "color.cuh"
#include "gpu-skip.h"
#include "gpu-test.h"
#include "spindle/image.h"

static void expect_equal(const spn_image_t *cpu, const spn_image_t *gpu, const char *what) {
  for (int p = 0; p < cpu->nplanes; p++)
    for (int32_t y = 0; y < plane_rows(cpu, p); y++) {
      const uint8_t *a = cpu->data[p] + y * cpu->stride[p], *b = gpu->data[p] + y * gpu->stride[p];
      for (size_t i = 0; i < row_bytes(cpu, p); i++)
        if (a[i] != b[i])
          fail_msg("%s: plane %d row %d byte %zu: cpu %d gpu %d", what, p, (int)y, i, a[i], b[i]);
    }
}

static const int32_t sizes[][2] = {{64, 48}, {37, 29}, {1, 1}, {320, 320}, {1281, 721}, {2, 3}};

static void rgb_to_yuv420_matches_cpu_exactly(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_RGB24, SPN_PIXFMT_YUV420P}, {SPN_PIXFMT_BGR24, SPN_PIXFMT_YUV420P},
                              {SPN_PIXFMT_RGB24, SPN_PIXFMT_NV12}, {SPN_PIXFMT_BGR24, SPN_PIXFMT_NV12}};
  uint32_t seed = 7;
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      int32_t w = sizes[s][0], h = sizes[s][1];
      spn_image_t src = host_image(w, h, pairs[i][0], seed++, 0, 0), ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, w, h, pairs[i][1], &e_));
      CK(spn_image_alloc(&got, w, h, pairs[i][1], &e_));
      CK(spn_image_convert(&src, &ref, &e_));
      spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
      CK(spn_cuda_rgb_to_yuv420(&dsrc, &ddst, NULL, &e_));
      from_device(&ddst, &got);
      char what[96];
      snprintf(what, sizeof what, "rgb_to_yuv420 %s->%s %dx%d", spn_pixfmt_name(pairs[i][0]),
               spn_pixfmt_name(pairs[i][1]), (int)w, (int)h);
      expect_equal(&ref, &got, what);
      device_free(&dsrc);
      device_free(&ddst);
      spn_image_release(&src);
      spn_image_release(&ref);
      spn_image_release(&got);
    }
}

static void yuv420_repack_matches_cpu_exactly(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_NV12, SPN_PIXFMT_YUV420P}, {SPN_PIXFMT_YUV420P, SPN_PIXFMT_NV12},
                              {SPN_PIXFMT_NV12, SPN_PIXFMT_NV12}, {SPN_PIXFMT_YUV420P, SPN_PIXFMT_YUV420P}};
  uint32_t seed = 70;
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      int32_t w = sizes[s][0], h = sizes[s][1];
      spn_image_t src = host_image(w, h, pairs[i][0], seed++, 0, 0), ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, w, h, pairs[i][1], &e_));
      CK(spn_image_alloc(&got, w, h, pairs[i][1], &e_));
      CK(spn_image_convert(&src, &ref, &e_));
      spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
      CK(spn_cuda_yuv420_repack(&dsrc, &ddst, NULL, &e_));
      from_device(&ddst, &got);
      char what[96];
      snprintf(what, sizeof what, "yuv420_repack %s->%s %dx%d", spn_pixfmt_name(pairs[i][0]),
               spn_pixfmt_name(pairs[i][1]), (int)w, (int)h);
      expect_equal(&ref, &got, what);
      device_free(&dsrc);
      device_free(&ddst);
      spn_image_release(&src);
      spn_image_release(&ref);
      spn_image_release(&got);
    }
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rgb_to_yuv420_matches_cpu_exactly),
      cmocka_unit_test(yuv420_repack_matches_cpu_exactly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
