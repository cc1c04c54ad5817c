/* test-cuda-image.c — cuda/kernels/image.cu against the CPU reference
 * (core/image, spindle/image.h) on random images (suite gpu; exits 77
 * without a device).
 *
 * Each case builds a random host image, runs the CPU function on it and the
 * kernel on a device copy whose rows have a different pitch (so stride
 * handling is exercised), copies the result back and compares.
 *
 * Tolerances. The kernels repeat the reference's float operations in the
 * same order with fused multiply-add contraction disabled (explicit-rounding
 * intrinsics) and compute resize taps in double as the CPU does, so results
 * are expected to be identical. We still allow:
 *   - u8 outputs: at most 1 LSB, and at least 99.9% of the values exact. A
 *     value whose float result lies within an ulp of a .5 rounding tie may
 *     round the other way if a single operation is ever evaluated
 *     differently; anything beyond 1 LSB, or many ±1s, is a real bug.
 *   - float outputs: |gpu - cpu| <= 1e-5 * (1 + |cpu|), a few ulps at the
 *     magnitudes used (values within ±300), far below any visible effect and
 *     far above zero-ulp noise, so a wrong tap or channel still fails.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpu-skip.h"
#include "gpu-test.h"
#include "image.cuh"
#ifdef SPN_TEST_FACEDET
#include "facedet.h"
#endif
#include "spindle/image.h"

/* Compare two host images of the same format and size under the tolerances
 * in the header comment. */
static void compare(const spn_image_t *cpu, const spn_image_t *gpu, const char *what) {
  size_t total = 0, off_by_one = 0;
  for (int p = 0; p < cpu->nplanes; p++)
    for (int32_t y = 0; y < plane_rows(cpu, p); y++) {
      const uint8_t *a = cpu->data[p] + y * cpu->stride[p], *b = gpu->data[p] + y * gpu->stride[p];
      size_t rb = row_bytes(cpu, p);
      if (is_float_fmt(cpu->format)) {
        for (size_t i = 0; i < rb / 4; i++) {
          float x = ((const float *)a)[i], g = ((const float *)b)[i];
          if (!(fabsf(x - g) <= 1e-5f * (1.0f + fabsf(x))))
            fail_msg("%s: plane %d row %d elem %zu: cpu %.9g gpu %.9g", what, p, (int)y, i, x, g);
          total++;
        }
      } else {
        for (size_t i = 0; i < rb; i++) {
          int d = abs((int)a[i] - (int)b[i]);
          if (d > 1)
            fail_msg("%s: plane %d row %d byte %zu: cpu %d gpu %d", what, p, (int)y, i, a[i], b[i]);
          off_by_one += d;
          total++;
        }
      }
    }
  if (off_by_one * 1000 > total)
    fail_msg("%s: %zu of %zu values off by one (more than 0.1%%)", what, off_by_one, total);
}

static void resize_matches_cpu(void **state) {
  (void)state;
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24, SPN_PIXFMT_GRAY8, SPN_PIXFMT_RGBF32P,
                          SPN_PIXFMT_BGRF32P, SPN_PIXFMT_GRAYF32};
  /* upscale, downscale, mixed, same size, a 1-pixel source */
  const int32_t sizes[][4] = {{37, 29, 101, 77}, {640, 360, 224, 224}, {200, 50, 61, 120}, {64, 48, 64, 48},
                              {1, 1, 5, 3}};
  uint32_t seed = 1;
  for (int cubic = 0; cubic < 2; cubic++)
  for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      spn_image_t src = host_image(sizes[s][0], sizes[s][1], fmts[f], seed++, -2.0f, 300.0f);
      spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, sizes[s][2], sizes[s][3], fmts[f], &e_));
      CK(spn_image_alloc(&got, sizes[s][2], sizes[s][3], fmts[f], &e_));
      CK(spn_image_resize(&src, &ref, cubic ? SPN_INTERP_CUBIC : SPN_INTERP_BILINEAR, &e_));
      spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
      if (cubic)
        CK(spn_cuda_resize_cubic(&dsrc, &ddst, NULL, &e_));
      else
        CK(spn_cuda_resize_bilinear(&dsrc, &ddst, NULL, &e_));
      from_device(&ddst, &got);
      char what[96];
      snprintf(what, sizeof what, "resize %s %s %dx%d->%dx%d", cubic ? "cubic" : "bilinear",
               spn_pixfmt_name(fmts[f]), (int)sizes[s][0], (int)sizes[s][1], (int)sizes[s][2], (int)sizes[s][3]);
      compare(&ref, &got, what);
      device_free(&dsrc);
      device_free(&ddst);
      spn_image_release(&src);
      spn_image_release(&ref);
      spn_image_release(&got);
    }
}

static void to_float_matches_cpu(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_RGB24, SPN_PIXFMT_RGBF32P}, {SPN_PIXFMT_BGR24, SPN_PIXFMT_RGBF32P},
                              {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGRF32P}, {SPN_PIXFMT_BGR24, SPN_PIXFMT_BGRF32P}};
  const float mean[3] = {123.675f, 116.28f, 103.53f}, scale[3] = {1 / 58.395f, 1 / 57.12f, 1 / 57.375f};
  uint32_t seed = 100;
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
    for (int with_norm = 0; with_norm < 2; with_norm++) {
      spn_image_t src = host_image(97, 61, pairs[i][0], seed++, 0, 0);
      spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, 97, 61, pairs[i][1], &e_));
      CK(spn_image_alloc(&got, 97, 61, pairs[i][1], &e_));
      CK(spn_image_to_float(&src, &ref, with_norm ? mean : NULL, with_norm ? scale : NULL, &e_));
      spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
      CK(spn_cuda_to_float(&dsrc, &ddst, with_norm ? mean : NULL, with_norm ? scale : NULL, NULL, &e_));
      from_device(&ddst, &got);
      char what[96];
      snprintf(what, sizeof what, "to_float %s->%s norm=%d", spn_pixfmt_name(pairs[i][0]),
               spn_pixfmt_name(pairs[i][1]), with_norm);
      compare(&ref, &got, what);
      device_free(&dsrc);
      device_free(&ddst);
      spn_image_release(&src);
      spn_image_release(&ref);
      spn_image_release(&got);
    }
}

static void from_float_matches_cpu(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_RGBF32P, SPN_PIXFMT_RGB24}, {SPN_PIXFMT_RGBF32P, SPN_PIXFMT_BGR24},
                              {SPN_PIXFMT_BGRF32P, SPN_PIXFMT_RGB24}, {SPN_PIXFMT_BGRF32P, SPN_PIXFMT_BGR24}};
  const float mean[3] = {0, 0, 0}, scale[3] = {1 / 255.0f, 1 / 255.0f, 1 / 255.0f};
  uint32_t seed = 300;
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
    for (int unit = 0; unit < 2; unit++) {
      /* unit: superres's 0..1 range (a little outside it, saturating); else raw values */
      spn_image_t src = host_image(83, 47, pairs[i][0], seed++, unit ? -0.1f : -20.0f, unit ? 1.1f : 280.0f);
      spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, 83, 47, pairs[i][1], &e_));
      CK(spn_image_alloc(&got, 83, 47, pairs[i][1], &e_));
      CK(spn_image_from_float(&src, &ref, unit ? mean : NULL, unit ? scale : NULL, &e_));
      spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
      CK(spn_cuda_from_float(&dsrc, &ddst, unit ? mean : NULL, unit ? scale : NULL, NULL, &e_));
      from_device(&ddst, &got);
      char what[96];
      snprintf(what, sizeof what, "from_float %s->%s unit=%d", spn_pixfmt_name(pairs[i][0]),
               spn_pixfmt_name(pairs[i][1]), unit);
      compare(&ref, &got, what);
      device_free(&dsrc);
      device_free(&ddst);
      spn_image_release(&src);
      spn_image_release(&ref);
      spn_image_release(&got);
    }
}

/* The loop superres and lipsync run on the CPU for a network's 0..1
 * output: round(clamp(v * 255, 0, 255)), NaN as 0. */
static uint8_t unit_u8(float v) {
  v *= 255.0f;
  v = v > 0.0f ? (v < 255.0f ? v : 255.0f) : 0.0f;
  return (uint8_t)(v + 0.5f);
}

/* unit_to_u8 against unit_u8, channel orders swapped. */
static void unit_to_u8_matches_cpu(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_RGBF32P, SPN_PIXFMT_RGB24}, {SPN_PIXFMT_BGRF32P, SPN_PIXFMT_RGB24},
                              {SPN_PIXFMT_BGRF32P, SPN_PIXFMT_BGR24}};
  uint32_t seed = 500;
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    spn_image_t src = host_image(96, 96, pairs[i][0], seed++, -0.2f, 1.2f);
    ((float *)src.data[0])[5] = NAN;
    spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
    CK(spn_image_alloc(&ref, 96, 96, pairs[i][1], &e_));
    CK(spn_image_alloc(&got, 96, 96, pairs[i][1], &e_));
    bool sbgr = pairs[i][0] == SPN_PIXFMT_BGRF32P, dbgr = pairs[i][1] == SPN_PIXFMT_BGR24;
    for (int32_t y = 0; y < 96; y++)
      for (int32_t x = 0; x < 96; x++)
        for (int c = 0; c < 3; c++) {
          int colour = sbgr ? 2 - c : c;
          ref.data[0][y * ref.stride[0] + x * 3 + (dbgr ? 2 - colour : colour)] =
              unit_u8(((const float *)(src.data[c] + y * src.stride[c]))[x]);
        }
    spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
    CK(spn_cuda_unit_to_u8(&dsrc, &ddst, NULL, &e_));
    from_device(&ddst, &got);
    char what[96];
    snprintf(what, sizeof what, "unit_to_u8 %s->%s", spn_pixfmt_name(pairs[i][0]), spn_pixfmt_name(pairs[i][1]));
    compare(&ref, &got, what);
    device_free(&dsrc);
    device_free(&ddst);
    spn_image_release(&src);
    spn_image_release(&ref);
    spn_image_release(&got);
  }
}

static void feather_mask_matches_cpu(void **state) {
  (void)state;
  const int32_t sizes[][2] = {{1, 1}, {17, 9}, {128, 96}, {301, 55}};
  const float feathers[] = {0.0f, 1.0f, 8.0f, 40.0f};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (size_t f = 0; f < sizeof feathers / sizeof *feathers; f++) {
      spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, sizes[s][0], sizes[s][1], SPN_PIXFMT_GRAYF32, &e_));
      CK(spn_image_alloc(&got, sizes[s][0], sizes[s][1], SPN_PIXFMT_GRAYF32, &e_));
      CK(spn_image_feather_mask(&ref, feathers[f], &e_));
      spn_image_t dm = to_device(&got);
      CK(spn_cuda_feather_mask(&dm, feathers[f], NULL, &e_));
      from_device(&dm, &got);
      char what[96];
      snprintf(what, sizeof what, "feather_mask %dx%d feather %g", (int)sizes[s][0], (int)sizes[s][1],
               (double)feathers[f]);
      compare(&ref, &got, what);
      device_free(&dm);
      spn_image_release(&ref);
      spn_image_release(&got);
    }
}

#ifdef SPN_TEST_FACEDET
/* spn_cuda_fit_normalize against spn_facedet_preprocess, its CPU twin, for
 * each detector's normalisation and each fit (as is, stretched, letterboxed
 * top-left, down and up). Floats: the 1e-5 tolerance of compare(). */
static void fit_normalize_matches_facedet(void **state) {
  (void)state;
  const int32_t models[] = {SPN_FACEDET_RETINAFACE, SPN_FACEDET_SCRFD, SPN_FACEDET_YUNET};
  const int32_t cases[][5] = {{200, 150, 200, 150, SPN_FACEDET_FIT_NONE}, {200, 150, 224, 160, SPN_FACEDET_FIT_NONE},
                              {640, 360, 160, 96, SPN_FACEDET_FIT_STRETCH}, {90, 70, 320, 320, SPN_FACEDET_FIT_TOPLEFT},
                              {1280, 720, 640, 640, SPN_FACEDET_FIT_TOPLEFT}};
  uint32_t seed = 400;
  for (size_t m = 0; m < sizeof models / sizeof *models; m++)
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
      int32_t w = cases[c][0], h = cases[c][1], iw = cases[c][2], ih = cases[c][3];
      spn_facedet_geom_t g;
      CK(spn_facedet_fit(w, h, iw, ih, cases[c][4], &g, &e_));
      spn_image_t src = host_image(w, h, SPN_PIXFMT_RGB24, seed++, 0, 0);
      spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, iw, ih, SPN_PIXFMT_RGBF32P, &e_));
      CK(spn_image_alloc(&got, iw, ih, SPN_PIXFMT_RGBF32P, &e_));
      CK(spn_facedet_preprocess(models[m], src.data[0], (int32_t)src.stride[0], 0, &g, (float *)ref.data[0], &e_));
      float mean[3], inv[3];
      int32_t swap = 0;
      assert_int_equal(spn_facedet_norm(models[m], 0, mean, inv, &swap), SPN_OK);
      spn_image_t dsrc = to_device(&src);
      /* the kernel writes a dense (3, ih, iw) block, as spn_image_alloc lays out ref and got */
      float *dense = NULL;
      CU(cudaMalloc((void **)&dense, (size_t)3 * iw * ih * sizeof(float)));
      CK(spn_cuda_fit_normalize(&dsrc, dense, iw, ih, g.pad_x, g.pad_y, g.resized_w, g.resized_h, mean, inv, swap,
                                NULL, &e_));
      CU(cudaMemcpy(got.data[0], dense, (size_t)3 * iw * ih * sizeof(float), cudaMemcpyDeviceToHost));
      CU(cudaFree(dense));
      char what[128];
      snprintf(what, sizeof what, "fit_normalize model %d %dx%d->%dx%d fit %d", (int)models[m], (int)w, (int)h,
               (int)iw, (int)ih, (int)cases[c][4]);
      compare(&ref, &got, what);
      device_free(&dsrc);
      spn_image_release(&src);
      spn_image_release(&ref);
      spn_image_release(&got);
    }
}
#endif

static void yuv420_to_rgb_matches_cpu(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_NV12, SPN_PIXFMT_RGB24}, {SPN_PIXFMT_NV12, SPN_PIXFMT_BGR24},
                              {SPN_PIXFMT_YUV420P, SPN_PIXFMT_RGB24}, {SPN_PIXFMT_YUV420P, SPN_PIXFMT_BGR24}};
  /* (the CPU converts 64-pixel spans, SSE2 4 pixels and 8 chroma columns at
   * a time: widths that end a span, a vector and a column pair anywhere) */
  const int32_t sizes[][2] = {{64, 36}, {33, 17}, {1, 1}, {1280, 720}, {131, 5}, {70, 3}};
  /* BT.601 limited (the default call), then a BT.709, a full-range and a
   * BT.2020 file's samples (the _colour variant, as decode passes them) */
  const spn_colour_t colours[] = {{SPN_MATRIX_BT601, 0}, {SPN_MATRIX_BT709, 0}, {SPN_MATRIX_BT601, 1},
                                  {SPN_MATRIX_BT2020, 0}, {SPN_MATRIX_BT709, 1}};
  uint32_t seed = 200;
  for (size_t c = 0; c < sizeof colours / sizeof *colours; c++)
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
      for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int32_t w = sizes[s][0], h = sizes[s][1];
        const spn_colour_t *col = c ? &colours[c] : NULL;
        spn_image_t src = host_image(w, h, pairs[i][0], seed++, 0, 0);
        spn_image_t ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT;
        CK(spn_image_alloc(&ref, w, h, pairs[i][1], &e_));
        CK(spn_image_alloc(&got, w, h, pairs[i][1], &e_));
        CK(spn_image_convert_colour(&src, &ref, col, &e_));
        spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
        if (col)
          CK(spn_cuda_yuv420_to_rgb_colour(&dsrc, &ddst, col, NULL, &e_));
        else
          CK(spn_cuda_yuv420_to_rgb(&dsrc, &ddst, NULL, &e_));
        from_device(&ddst, &got);
        char what[128];
        snprintf(what, sizeof what, "%s %s %s->%s %dx%d", spn_matrix_name(colours[c].matrix),
                 colours[c].full_range ? "full" : "limited", spn_pixfmt_name(pairs[i][0]), spn_pixfmt_name(pairs[i][1]),
                 (int)w, (int)h);
        compare(&ref, &got, what);
        device_free(&dsrc);
        device_free(&ddst);
        spn_image_release(&src);
        spn_image_release(&ref);
        spn_image_release(&got);
      }
}

static void paste_matches_cpu(void **state) {
  (void)state;
  const int32_t pairs[][2] = {{SPN_PIXFMT_RGB24, SPN_PIXFMT_RGB24}, {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24},
                              {SPN_PIXFMT_GRAY8, SPN_PIXFMT_GRAY8}, {SPN_PIXFMT_RGBF32P, SPN_PIXFMT_BGRF32P},
                              {SPN_PIXFMT_GRAYF32, SPN_PIXFMT_GRAYF32}};
  /* inside, hanging off the top-left, hanging off the bottom-right, fully outside */
  const int32_t at[][2] = {{10, 7}, {-9, -5}, {70, 40}, {500, 500}};
  uint32_t seed = 300;
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
    for (size_t k = 0; k < sizeof at / sizeof *at; k++)
      for (int use_mask = 0; use_mask < 2; use_mask++) {
        spn_image_t src = host_image(41, 23, pairs[i][0], seed++, -1.0f, 1.0f);
        spn_image_t ref = host_image(96, 54, pairs[i][1], seed++, -1.0f, 1.0f);
        spn_image_t got = SPN_IMAGE_INIT;
        CK(spn_image_alloc(&got, 96, 54, pairs[i][1], &e_));
        CK(spn_image_copy(&ref, &got, &e_));
        /* feathered mask with noise pushing some values outside [0,1] (clamped) */
        spn_image_t mask = SPN_IMAGE_INIT;
        CK(spn_image_alloc(&mask, 41, 23, SPN_PIXFMT_GRAYF32, &e_));
        CK(spn_image_feather_mask(&mask, 6.0f, &e_));
        for (int32_t y = 0; y < 23; y++)
          for (int32_t x = 0; x < 41; x++)
            ((float *)(mask.data[0] + y * mask.stride[0]))[x] += 0.3f * (rng_unit(&seed) - 0.5f);
        spn_image_t dsrc = to_device(&src), ddst = to_device(&got), dmask = to_device(&mask);
        CK(spn_image_paste(&ref, &src, at[k][0], at[k][1], use_mask ? &mask : NULL, &e_));
        CK(spn_cuda_paste(&ddst, &dsrc, at[k][0], at[k][1], use_mask ? &dmask : NULL, NULL, &e_));
        from_device(&ddst, &got);
        char what[96];
        snprintf(what, sizeof what, "paste %s onto %s at %d,%d mask=%d", spn_pixfmt_name(pairs[i][0]),
                 spn_pixfmt_name(pairs[i][1]), (int)at[k][0], (int)at[k][1], use_mask);
        compare(&ref, &got, what);
        device_free(&dsrc);
        device_free(&ddst);
        device_free(&dmask);
        spn_image_release(&src);
        spn_image_release(&ref);
        spn_image_release(&got);
        spn_image_release(&mask);
      }
}

/* Rotation moves bytes: byte for byte equal to spn_image_rotate for every
 * format and quarter, at sizes whose width and height differ (a swapped
 * axis shows), odd ones for the formats that allow them, into destination
 * rows pitched wider than the source's. The destination starts as garbage,
 * so an element the kernel misses shows too. */
static void rotate_matches_cpu_exactly(void **state) {
  (void)state;
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24, SPN_PIXFMT_GRAY8, SPN_PIXFMT_RGBF32P,
                          SPN_PIXFMT_GRAYF32, SPN_PIXFMT_NV12, SPN_PIXFMT_YUV420P};
  const int32_t sizes[][2] = {{64, 36}, {37, 21}, {1, 5}, {320, 322}, {2, 6}};
  const int32_t degs[] = {0, 90, 180, 270, -90, 450};
  uint32_t seed = 900;
  int checked = 0;
  for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
      for (size_t d = 0; d < sizeof degs / sizeof *degs; d++) {
        int32_t w = sizes[s][0], h = sizes[s][1], deg = ((degs[d] % 360) + 360) % 360;
        bool yuv = fmts[f] == SPN_PIXFMT_NV12 || fmts[f] == SPN_PIXFMT_YUV420P;
        bool quarter = deg == 90 || deg == 270;
        if (yuv && ((w | h) & 1))
          continue; /* refused on both sides (bad_arguments) */
        int32_t rw = quarter ? h : w, rh = quarter ? w : h;
        spn_image_t src = host_image(w, h, fmts[f], seed++, -3.0f, 300.0f), ref = SPN_IMAGE_INIT;
        spn_image_t got = host_image(rw, rh, fmts[f], seed++, -3.0f, 300.0f);
        CK(spn_image_alloc(&ref, rw, rh, fmts[f], &e_));
        CK(spn_image_rotate(&src, &ref, degs[d], &e_));
        spn_image_t dsrc = to_device(&src), ddst = to_device(&got);
        CK(spn_cuda_rotate(&dsrc, &ddst, degs[d], NULL, &e_));
        from_device(&ddst, &got);
        for (int p = 0; p < ref.nplanes; p++)
          for (int32_t y = 0; y < plane_rows(&ref, p); y++)
            if (memcmp(ref.data[p] + y * ref.stride[p], got.data[p] + y * got.stride[p], row_bytes(&ref, p)))
              fail_msg("rotate %s %dx%d by %d: plane %d row %d differs from spn_image_rotate",
                       spn_pixfmt_name(fmts[f]), (int)w, (int)h, (int)degs[d], p, (int)y);
        checked++;
        device_free(&dsrc);
        device_free(&ddst);
        spn_image_release(&src);
        spn_image_release(&ref);
        spn_image_release(&got);
      }
  assert_true(checked >= 150);
}

/* Superres's tiles (image.cuh): three tiles of a 97x61 frame, blocks of
 * 24x32, x2. The cut equals to_float (mean 0, scale 1/255) of the whole
 * frame then each block copied out, value for value; the stitch writes
 * unit_to_u8 of each tile's part of the model output at its place, byte
 * for byte, and leaves every other byte of the destination as it was. Both
 * channel orders of the frame; a NaN in the output is 0. */
static const spn_cuda_tiles_t k_tiles = {
    .n = 3, .bx = {0, 18, 65}, .by = {0, 0, 37}, .x0 = {0, 20, 80}, .y0 = {0, 0, 40}, .x1 = {20, 50, 97},
    .y1 = {16, 20, 61}};

static void tiles_cut_and_stitch_match_whole_frame(void **state) {
  (void)state;
  const int32_t W = 97, H = 61, P = 24, Q = 32, S = 2, n = k_tiles.n;
  const size_t plane = (size_t)P * Q, oplane = plane * S * S;
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24};
  uint32_t seed = 900;
  for (size_t f = 0; f < 2; f++) {
    /* cut */
    spn_image_t src = host_image(W, H, fmts[f], seed++, 0, 0), fl = SPN_IMAGE_INIT;
    CK(spn_image_alloc(&fl, W, H, SPN_PIXFMT_RGBF32P, &e_));
    const float unit[3] = {1.0f / 255.0f, 1.0f / 255.0f, 1.0f / 255.0f};
    CK(spn_image_to_float(&src, &fl, NULL, unit, &e_));
    float *want = malloc((size_t)n * 3 * plane * sizeof *want), *got = malloc((size_t)n * 3 * plane * sizeof *got);
    for (int32_t i = 0; i < n; i++)
      for (int c = 0; c < 3; c++)
        for (int32_t y = 0; y < P; y++)
          for (int32_t x = 0; x < Q; x++)
            want[(i * 3 + c) * plane + (size_t)y * Q + x] =
                ((const float *)(fl.data[c] + (k_tiles.by[i] + y) * fl.stride[c]))[k_tiles.bx[i] + x];
    spn_image_t dsrc = to_device(&src);
    void *dcut = NULL;
    CU(cudaMalloc(&dcut, (size_t)n * 3 * plane * sizeof(float)));
    CK(spn_cuda_tiles_cut(&dsrc, &k_tiles, P, Q, 1.0f / 255.0f, dcut, NULL, &e_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(got, dcut, (size_t)n * 3 * plane * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t k = 0; k < (size_t)n * 3 * plane; k++)
      if (got[k] != want[k])
        fail_msg("tiles_cut %s: value %zu (tile %zu, plane %zu): %.9g, want %.9g", spn_pixfmt_name(fmts[f]), k,
                 k / (3 * plane), k / plane % 3, got[k], want[k]);
    /* stitch */
    spn_image_t dst = host_image(W * S, H * S, fmts[f], seed++, 0, 0), ref = SPN_IMAGE_INIT;
    CK(spn_image_alloc(&ref, W * S, H * S, fmts[f], &e_));
    for (int32_t y = 0; y < H * S; y++)
      memcpy(ref.data[0] + y * ref.stride[0], dst.data[0] + y * dst.stride[0], (size_t)W * S * 3);
    float *out = malloc((size_t)n * 3 * oplane * sizeof *out);
    for (size_t k = 0; k < (size_t)n * 3 * oplane; k++)
      out[k] = -0.2f + 1.4f * rng_unit(&seed);
    out[7] = NAN;
    bool bgr = fmts[f] == SPN_PIXFMT_BGR24;
    for (int32_t i = 0; i < n; i++)
      for (int32_t Y = k_tiles.y0[i] * S; Y < k_tiles.y1[i] * S; Y++)
        for (int32_t X = k_tiles.x0[i] * S; X < k_tiles.x1[i] * S; X++)
          for (int c = 0; c < 3; c++)
            ref.data[0][Y * ref.stride[0] + X * 3 + (bgr ? 2 - c : c)] =
                unit_u8(out[(i * 3 + c) * oplane + (size_t)(Y - k_tiles.by[i] * S) * Q * S + (X - k_tiles.bx[i] * S)]);
    spn_image_t ddst = to_device(&dst);
    void *dout = NULL;
    CU(cudaMalloc(&dout, (size_t)n * 3 * oplane * sizeof(float)));
    CU(cudaMemcpy(dout, out, (size_t)n * 3 * oplane * sizeof(float), cudaMemcpyHostToDevice));
    CK(spn_cuda_tiles_stitch(dout, P, Q, S, &k_tiles, &ddst, NULL, &e_));
    from_device(&ddst, &dst);
    for (int32_t y = 0; y < H * S; y++)
      for (int32_t x = 0; x < W * S * 3; x++)
        if (dst.data[0][y * dst.stride[0] + x] != ref.data[0][y * ref.stride[0] + x])
          fail_msg("tiles_stitch %s: row %d byte %d: %d, want %d", spn_pixfmt_name(fmts[f]), (int)y, (int)x,
                   dst.data[0][y * dst.stride[0] + x], ref.data[0][y * ref.stride[0] + x]);
    CU(cudaFree(dcut));
    CU(cudaFree(dout));
    device_free(&dsrc);
    device_free(&ddst);
    free(want);
    free(got);
    free(out);
    spn_image_release(&src);
    spn_image_release(&fl);
    spn_image_release(&dst);
    spn_image_release(&ref);
  }
  /* refused before any launch: a block past the frame, no tiles, a rect
   * outside its block, a format without RGB bytes */
  spn_image_t a = host_image(W, H, SPN_PIXFMT_RGB24, 7, 0, 0), g8 = host_image(W, H, SPN_PIXFMT_GRAY8, 8, 0, 0);
  spn_image_t big = host_image(W * S, H * S, SPN_PIXFMT_RGB24, 9, 0, 0);
  float dummy[4];
  spn_error_t err = SPN_ERROR_INIT;
  spn_cuda_tiles_t t = k_tiles;
  t.bx[2] = 70;
  assert_int_equal(spn_cuda_tiles_cut(&a, &t, P, Q, 1.0f, dummy, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "tile 2"));
  assert_int_equal(spn_cuda_tiles_stitch(dummy, P, Q, S, &t, &big, NULL, &err), SPN_EINVAL);
  t = k_tiles;
  t.n = 0;
  assert_int_equal(spn_cuda_tiles_cut(&a, &t, P, Q, 1.0f, dummy, NULL, &err), SPN_EINVAL);
  t = k_tiles;
  t.x1[0] = 40; /* past its block's 32 columns */
  assert_int_equal(spn_cuda_tiles_stitch(dummy, P, Q, S, &t, &big, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "tile 0"));
  assert_int_equal(spn_cuda_tiles_cut(&g8, &k_tiles, P, Q, 1.0f, dummy, NULL, &err), SPN_EUNSUPPORTED);
  spn_image_release(&a);
  spn_image_release(&g8);
  spn_image_release(&big);
}

static void bad_arguments_are_refused_before_launch(void **state) {
  (void)state;
  spn_image_t a = host_image(8, 8, SPN_PIXFMT_RGB24, 1, 0, 0), b = host_image(8, 8, SPN_PIXFMT_GRAY8, 2, 0, 0);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_cuda_resize_bilinear(&a, &b, NULL, &err), SPN_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "rgb24"));
  assert_int_equal(spn_cuda_to_float(&a, &b, NULL, NULL, NULL, &err), SPN_EUNSUPPORTED);
  assert_int_equal(spn_cuda_yuv420_to_rgb(&a, &b, NULL, &err), SPN_EUNSUPPORTED);
  assert_int_equal(spn_cuda_paste(&b, &a, 0, 0, NULL, NULL, &err), SPN_EUNSUPPORTED);
  assert_int_equal(spn_cuda_from_float(&a, &a, NULL, NULL, NULL, &err), SPN_EUNSUPPORTED);
  assert_int_equal(spn_cuda_feather_mask(&a, 4.0f, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "grayf32"));
  spn_image_t empty = SPN_IMAGE_INIT;
  assert_int_equal(spn_cuda_resize_bilinear(&empty, &a, NULL, &err), SPN_EINVAL);
  /* rotate: the destination's size, formats that differ, a turn that is
   * not a quarter, an odd 4:2:0 turned by a quarter, a format it does not
   * take */
  spn_image_t c = host_image(8, 6, SPN_PIXFMT_RGB24, 3, 0, 0), odd = host_image(6, 5, SPN_PIXFMT_YUV420P, 4, 0, 0);
  spn_image_t oddr = host_image(5, 6, SPN_PIXFMT_YUV420P, 5, 0, 0), gray = host_image(6, 8, SPN_PIXFMT_GRAY8, 6, 0, 0);
  assert_int_equal(spn_cuda_rotate(&c, &c, 90, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "needs a 6x8 destination (got 8x6)"));
  assert_int_equal(spn_cuda_rotate(&c, &gray, 90, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "rotate between rgb24 and gray8"));
  assert_int_equal(spn_cuda_rotate(&c, &c, 45, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "45 degrees"));
  assert_int_equal(spn_cuda_rotate(&odd, &oddr, 270, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "even sizes (got 6x5)"));
  spn_image_release(&c);
  spn_image_release(&odd);
  spn_image_release(&oddr);
  spn_image_release(&gray);
  spn_image_release(&a);
  spn_image_release(&b);
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(resize_matches_cpu),
      cmocka_unit_test(to_float_matches_cpu),
      cmocka_unit_test(yuv420_to_rgb_matches_cpu),
      cmocka_unit_test(paste_matches_cpu),
      cmocka_unit_test(from_float_matches_cpu),
      cmocka_unit_test(feather_mask_matches_cpu),
      cmocka_unit_test(unit_to_u8_matches_cpu),
      cmocka_unit_test(rotate_matches_cpu_exactly),
      cmocka_unit_test(tiles_cut_and_stitch_match_whole_frame),
#ifdef SPN_TEST_FACEDET
      cmocka_unit_test(fit_normalize_matches_facedet),
#endif
      cmocka_unit_test(bad_arguments_are_refused_before_launch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
