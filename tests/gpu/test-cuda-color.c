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

/* BT.601 limited (NULL: spn_image_convert's), and the other matrices and
 * full range a file or encode's colorspace may ask for. */
static const spn_colour_t colours[] = {{SPN_MATRIX_BT601, 0}, {SPN_MATRIX_BT709, 0}, {SPN_MATRIX_BT601, 1},
                                       {SPN_MATRIX_BT2020, 0}, {SPN_MATRIX_BT709, 1}, {SPN_MATRIX_SMPTE240M, 0}};

static void rgb_to_yuv420_matches_cpu_exactly(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_RGB24, SPN_PIXFMT_YUV420P}, {SPN_PIXFMT_BGR24, SPN_PIXFMT_YUV420P},
                              {SPN_PIXFMT_RGB24, SPN_PIXFMT_NV12}, {SPN_PIXFMT_BGR24, SPN_PIXFMT_NV12}};
  uint32_t seed = 7;
  for (size_t c = 0; c < sizeof colours / sizeof *colours; c++)
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
      for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int32_t w = sizes[s][0], h = sizes[s][1];
        const spn_colour_t *col = c ? &colours[c] : NULL;
        spn_image_t src = host_image(w, h, pairs[i][0], seed++, 0, 0), ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
        CK(spn_image_alloc(&ref, w, h, pairs[i][1], &e_));
        CK(spn_image_alloc(&got, w, h, pairs[i][1], &e_));
        CK(spn_image_convert_colour(&src, &ref, col, &e_));
        spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
        if (col)
          CK(spn_cuda_rgb_to_yuv420_colour(&dsrc, &ddst, col, NULL, &e_));
        else
          CK(spn_cuda_rgb_to_yuv420(&dsrc, &ddst, NULL, &e_));
        from_device(&ddst, &got);
        char what[128];
        snprintf(what, sizeof what, "rgb_to_yuv420 %s %s %s->%s %dx%d", spn_matrix_name(colours[c].matrix),
                 colours[c].full_range ? "full" : "limited", spn_pixfmt_name(pairs[i][0]),
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

/* 16-bit 4:2:0 (P010/P016, what NVDEC gives for 10- and 12-bit streams)
 * to 8 bits: each sample's top 8 bits rounded, ties up, saturated — the
 * reference below is that rule written out on the host. Random samples
 * (P010's, whose low 6 bits are 0, and any 16-bit value, which reaches the
 * ties and the saturation), even and odd sizes, source rows pitched wider
 * than their samples, into nv12 and yuv420p. */
static uint8_t top8_ref(uint16_t v) {
  unsigned r = ((unsigned)v + 128u) / 256u;
  return (uint8_t)(r > 255 ? 255 : r);
}

static void p016_to_yuv420_matches_reference(void **state) {
  (void)state;
  const int32_t outs[] = {SPN_PIXFMT_NV12, SPN_PIXFMT_YUV420P};
  uint32_t seed = 5150;
  for (int any = 0; any < 2; any++)
    for (size_t o = 0; o < 2; o++)
      for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int32_t w = sizes[s][0], h = sizes[s][1], cw = (w + 1) / 2, ch = (h + 1) / 2;
        size_t yp = (size_t)w * 2 + 64, cp = (size_t)cw * 4 + 32;
        uint16_t *y16 = calloc((size_t)h * yp, 1), *c16 = calloc((size_t)ch * cp, 1);
        assert_non_null(y16);
        assert_non_null(c16);
        for (int32_t y = 0; y < h; y++)
          for (int32_t x = 0; x < w; x++)
            y16[y * (yp / 2) + x] = (uint16_t)(any ? rng_next(&seed) : rng_next(&seed) << 6);
        for (int32_t y = 0; y < ch; y++)
          for (int32_t x = 0; x < 2 * cw; x++)
            c16[y * (cp / 2) + x] = (uint16_t)(any ? rng_next(&seed) : rng_next(&seed) << 6);
        if (any && w > 2) { /* the edges of the rule: a tie, the largest values */
          y16[0] = 0x1280;
          y16[1] = 0xff7f;
          y16[2] = 0xffff;
        }
        void *dy = NULL, *dc = NULL;
        CU(cudaMalloc(&dy, (size_t)h * yp));
        CU(cudaMalloc(&dc, (size_t)ch * cp));
        CU(cudaMemcpy(dy, y16, (size_t)h * yp, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dc, c16, (size_t)ch * cp, cudaMemcpyHostToDevice));
        spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
        CK(spn_image_alloc(&ref, w, h, outs[o], &e_));
        CK(spn_image_alloc(&got, w, h, outs[o], &e_));
        for (int32_t y = 0; y < h; y++)
          for (int32_t x = 0; x < w; x++)
            ref.data[0][y * ref.stride[0] + x] = top8_ref(y16[y * (yp / 2) + x]);
        for (int32_t y = 0; y < ch; y++)
          for (int32_t x = 0; x < cw; x++) {
            uint8_t u = top8_ref(c16[y * (cp / 2) + 2 * x]), v = top8_ref(c16[y * (cp / 2) + 2 * x + 1]);
            if (outs[o] == SPN_PIXFMT_NV12) {
              ref.data[1][y * ref.stride[1] + 2 * x] = u;
              ref.data[1][y * ref.stride[1] + 2 * x + 1] = v;
            } else {
              ref.data[1][y * ref.stride[1] + x] = u;
              ref.data[2][y * ref.stride[2] + x] = v;
            }
          }
        if (any && w > 2) {
          assert_int_equal(ref.data[0][0], 0x13);
          assert_int_equal(ref.data[0][1], 0xff);
          assert_int_equal(ref.data[0][2], 0xff);
        }
        spn_image_t ddst = to_device(&got);
        CK(spn_cuda_p016_to_yuv420(dy, (int64_t)yp, dc, (int64_t)cp, &ddst, NULL, &e_));
        from_device(&ddst, &got);
        char what[96];
        snprintf(what, sizeof what, "p016_to_yuv420 %s %dx%d%s", spn_pixfmt_name(outs[o]), (int)w, (int)h,
                 any ? " (any 16-bit values)" : " (p010)");
        expect_equal(&ref, &got, what);
        device_free(&ddst);
        CU(cudaFree(dy));
        CU(cudaFree(dc));
        free(y16);
        free(c16);
        spn_image_release(&ref);
        spn_image_release(&got);
      }
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rgb_to_yuv420_matches_cpu_exactly),
      cmocka_unit_test(yuv420_repack_matches_cpu_exactly),
      cmocka_unit_test(p016_to_yuv420_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
