/* test-image.c — CPU frame operations against independent references.
 *
 * Two kinds of checks: small cases worked out by hand (exact values), and
 * larger ones against tests/media/image_ref.py, which computes expected
 * outputs with OpenCV (resize, grey) or float64 NumPy written from the
 * formulas in spindle/image.h (YUV, exact-position warp, float conversion,
 * feathered paste). The script runs in a temporary directory at start-up.
 * Usage: test-image PYTHON image_ref.py
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "spindle/image.h"

static char refdir[256];

static void *read_file(const char *name, const char *kind, size_t expect) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.%s.bin", refdir, name, kind);
  FILE *f = fopen(path, "rb");
  if (!f)
    fail_msg("cannot open %s", path);
  void *buf = malloc(expect + 1);
  size_t n = fread(buf, 1, expect + 1, f);
  fclose(f);
  if (n != expect)
    fail_msg("%s: %zu bytes, expected %zu", path, n, expect);
  return buf;
}

/* Packed u8 HWC → image (copy), and image → packed u8 HWC. */
static void load_u8(spn_image_t *img, const uint8_t *hwc, int32_t w, int32_t h, int32_t fmt) {
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_image_alloc(img, w, h, fmt, &err), SPN_OK);
  int nc = fmt == SPN_PIXFMT_GRAY8 ? 1 : 3;
  for (int32_t y = 0; y < h; y++)
    memcpy(img->data[0] + y * img->stride[0], hwc + (size_t)y * w * nc, (size_t)w * nc);
}

/* Float HWC → planar float image. */
static void load_f32(spn_image_t *img, const float *hwc, int32_t w, int32_t h) {
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_image_alloc(img, w, h, SPN_PIXFMT_RGBF32P, &err), SPN_OK);
  for (int c = 0; c < 3; c++)
    for (int32_t y = 0; y < h; y++)
      for (int32_t x = 0; x < w; x++)
        ((float *)(img->data[c] + y * img->stride[c]))[x] = hwc[((size_t)y * w + x) * 3 + c];
}

static int max_diff_u8(const spn_image_t *img, const uint8_t *ref, int nc) {
  int md = 0;
  for (int32_t y = 0; y < img->height; y++)
    for (int32_t x = 0; x < img->width * nc; x++) {
      int d = abs((int)img->data[0][y * img->stride[0] + x] - (int)ref[(size_t)y * img->width * nc + x]);
      if (d > md)
        md = d;
    }
  return md;
}

static int imax(int a, int b) { return a > b ? a : b; }

/* ---- hand-worked cases ---- */

static void bilinear_half_pixel_by_hand(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  uint8_t px[2] = {0, 100};
  spn_image_t src, dst;
  load_u8(&src, px, 2, 1, SPN_PIXFMT_GRAY8);
  assert_int_equal(spn_image_alloc(&dst, 4, 1, SPN_PIXFMT_GRAY8, &err), SPN_OK);
  /* sx = (dx + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 → 0, 25, 75, 100 */
  assert_int_equal(spn_image_resize(&src, &dst, SPN_INTERP_BILINEAR, &err), SPN_OK);
  assert_int_equal(dst.data[0][0], 0);
  assert_int_equal(dst.data[0][1], 25);
  assert_int_equal(dst.data[0][2], 75);
  assert_int_equal(dst.data[0][3], 100);
  spn_image_release(&src);
  spn_image_release(&dst);
}

static void area_by_hand(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  uint8_t px[3] = {0, 30, 60};
  spn_image_t src, dst;
  load_u8(&src, px, 3, 1, SPN_PIXFMT_GRAY8);
  assert_int_equal(spn_image_alloc(&dst, 2, 1, SPN_PIXFMT_GRAY8, &err), SPN_OK);
  /* dst 0 covers [0, 1.5): (0*1 + 30*0.5)/1.5 = 10; dst 1 covers [1.5, 3): 50 */
  assert_int_equal(spn_image_resize(&src, &dst, SPN_INTERP_AREA, &err), SPN_OK);
  assert_int_equal(dst.data[0][0], 10);
  assert_int_equal(dst.data[0][1], 50);
  spn_image_release(&src);
  spn_image_release(&dst);
}

static void yuv_primaries_by_hand(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  /* 2x2 of one colour: white, black, red */
  const uint8_t cols[3][3] = {{255, 255, 255}, {0, 0, 0}, {255, 0, 0}};
  const uint8_t expect[3][3] = {{235, 128, 128}, {16, 128, 128}, {81, 90, 240}};
  for (int k = 0; k < 3; k++) {
    uint8_t px[12];
    for (int i = 0; i < 4; i++)
      memcpy(px + 3 * i, cols[k], 3);
    spn_image_t src, nv12, i420, back;
    load_u8(&src, px, 2, 2, SPN_PIXFMT_RGB24);
    assert_int_equal(spn_image_alloc(&nv12, 2, 2, SPN_PIXFMT_NV12, &err), SPN_OK);
    assert_int_equal(spn_image_alloc(&i420, 2, 2, SPN_PIXFMT_YUV420P, &err), SPN_OK);
    assert_int_equal(spn_image_alloc(&back, 2, 2, SPN_PIXFMT_BGR24, &err), SPN_OK);
    assert_int_equal(spn_image_convert(&src, &nv12, &err), SPN_OK);
    assert_int_equal(nv12.data[0][0], expect[k][0]);
    assert_int_equal(nv12.data[0][nv12.stride[0] + 1], expect[k][0]);
    assert_int_equal(nv12.data[1][0], expect[k][1]);
    assert_int_equal(nv12.data[1][1], expect[k][2]);
    assert_int_equal(spn_image_convert(&nv12, &i420, &err), SPN_OK);
    assert_int_equal(i420.data[1][0], expect[k][1]);
    assert_int_equal(i420.data[2][0], expect[k][2]);
    assert_int_equal(spn_image_convert(&i420, &back, &err), SPN_OK);
    /* back to BGR: the primaries survive within one step of rounding */
    assert_true(abs((int)back.data[0][2] - cols[k][0]) <= 1);
    assert_true(abs((int)back.data[0][1] - cols[k][1]) <= 1);
    assert_true(abs((int)back.data[0][0] - cols[k][2]) <= 1);
    spn_image_release(&src);
    spn_image_release(&nv12);
    spn_image_release(&i420);
    spn_image_release(&back);
  }
}

/* The other matrices and full range, against the standards' own 100%
 * colour bars (BT.709 limited) and JFIF's full-range BT.601, then a round
 * trip of every matrix and range. */
static void yuv_matrices_by_hand(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  const uint8_t cols[5][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 255}, {0, 0, 0}};
  const struct {
    spn_colour_t c;
    uint8_t yuv[5][3];
  } cases[] = {
      {{SPN_MATRIX_BT709, 0}, {{63, 102, 240}, {173, 42, 26}, {32, 240, 118}, {235, 128, 128}, {16, 128, 128}}},
      {{SPN_MATRIX_BT601, 1}, {{76, 85, 255}, {150, 44, 21}, {29, 255, 107}, {255, 128, 128}, {0, 128, 128}}},
      {{5, 0}, {{81, 90, 240}, {145, 54, 34}, {41, 240, 110}, {235, 128, 128}, {16, 128, 128}}},
  };
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++)
    for (int k = 0; k < 5; k++) {
      uint8_t px[12];
      for (int i = 0; i < 4; i++)
        memcpy(px + 3 * i, cols[k], 3);
      spn_image_t src, i420;
      load_u8(&src, px, 2, 2, SPN_PIXFMT_RGB24);
      assert_int_equal(spn_image_alloc(&i420, 2, 2, SPN_PIXFMT_YUV420P, &err), SPN_OK);
      assert_int_equal(spn_image_convert_colour(&src, &i420, &cases[t].c, &err), SPN_OK);
      if (i420.data[0][0] != cases[t].yuv[k][0] || i420.data[1][0] != cases[t].yuv[k][1] ||
          i420.data[2][0] != cases[t].yuv[k][2])
        fail_msg("%s %s, colour %d: got %d %d %d, want %d %d %d", spn_matrix_name(cases[t].c.matrix),
                 cases[t].c.full_range ? "full" : "limited", k, i420.data[0][0], i420.data[1][0], i420.data[2][0],
                 cases[t].yuv[k][0], cases[t].yuv[k][1], cases[t].yuv[k][2]);
      spn_image_release(&src);
      spn_image_release(&i420);
    }
  /* every matrix and range: RGB -> 4:2:0 -> RGB within one step on flat
   * 2x2 blocks, and a BT.709 picture read back as BT.601 is visibly off
   * (what a file read with the wrong matrix looks like) */
  const int32_t ms[] = {SPN_MATRIX_BT709, SPN_MATRIX_BT601, SPN_MATRIX_SMPTE240M, SPN_MATRIX_BT2020};
  const uint8_t probe[3] = {40, 200, 90};
  for (int mi = 0; mi < 4; mi++)
    for (int full = 0; full < 2; full++) {
      spn_colour_t c = {ms[mi], full};
      uint8_t px[12];
      for (int i = 0; i < 4; i++)
        memcpy(px + 3 * i, probe, 3);
      spn_image_t src, nv12, back;
      load_u8(&src, px, 2, 2, SPN_PIXFMT_RGB24);
      assert_int_equal(spn_image_alloc(&nv12, 2, 2, SPN_PIXFMT_NV12, &err), SPN_OK);
      assert_int_equal(spn_image_alloc(&back, 2, 2, SPN_PIXFMT_RGB24, &err), SPN_OK);
      assert_int_equal(spn_image_convert_colour(&src, &nv12, &c, &err), SPN_OK);
      assert_int_equal(spn_image_convert_colour(&nv12, &back, &c, &err), SPN_OK);
      for (int ch = 0; ch < 3; ch++)
        assert_true(abs((int)back.data[0][ch] - probe[ch]) <= 1);
      if (ms[mi] == SPN_MATRIX_BT709 && !full) {
        assert_int_equal(spn_image_convert(&nv12, &back, &err), SPN_OK); /* read as BT.601 */
        assert_true(abs((int)back.data[0][1] - probe[1]) >= 8);
      }
      spn_image_release(&src);
      spn_image_release(&nv12);
      spn_image_release(&back);
    }
  /* names both ways; an unknown code is refused, naming it */
  assert_int_equal(spn_matrix_from_name("bt709"), SPN_MATRIX_BT709);
  assert_int_equal(spn_matrix_from_name("smpte170m"), SPN_MATRIX_BT601);
  assert_int_equal(spn_matrix_from_name("bt2020nc"), SPN_MATRIX_BT2020);
  assert_int_equal(spn_matrix_from_name("rec709"), 0);
  assert_string_equal(spn_matrix_name(5), "bt601");
  spn_colour_t bad = {3, 0};
  spn_yuv_coeffs_t k = {0};
  assert_int_equal(spn_colour_coeffs(&bad, &k, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "colour matrix 3"));
  spn_image_t a, b;
  assert_int_equal(spn_image_alloc(&a, 2, 2, SPN_PIXFMT_RGB24, &err), SPN_OK);
  assert_int_equal(spn_image_alloc(&b, 2, 2, SPN_PIXFMT_NV12, &err), SPN_OK);
  assert_int_equal(spn_image_convert_colour(&a, &b, &bad, &err), SPN_EINVAL);
  spn_image_release(&a);
  spn_image_release(&b);
}

static void feather_mask_by_hand(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t m;
  assert_int_equal(spn_image_alloc(&m, 4, 5, SPN_PIXFMT_GRAYF32, &err), SPN_OK);
  assert_int_equal(spn_image_feather_mask(&m, 2.0f, &err), SPN_OK);
  /* ax = 0.25, 0.75, 0.75, 0.25; ay = 0.25, 0.75, 1, 0.75, 0.25 */
  const float ax[4] = {0.25f, 0.75f, 0.75f, 0.25f}, ay[5] = {0.25f, 0.75f, 1.0f, 0.75f, 0.25f};
  for (int y = 0; y < 5; y++)
    for (int x = 0; x < 4; x++)
      assert_float_equal(((float *)(m.data[0] + y * m.stride[0]))[x], ax[x] * ay[y], 1e-7);
  assert_int_equal(spn_image_feather_mask(&m, 0.0f, &err), SPN_OK);
  assert_float_equal(((float *)m.data[0])[0], 1.0f, 0.0);
  spn_image_release(&m);
}

static void warp_and_rotate_by_hand(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  uint8_t px[6] = {0, 10, 20, 30, 40, 50}; /* 3 wide, 2 high */
  spn_image_t src, dst, rot;
  load_u8(&src, px, 3, 2, SPN_PIXFMT_GRAY8);
  assert_int_equal(spn_image_alloc(&dst, 3, 2, SPN_PIXFMT_GRAY8, &err), SPN_OK);
  /* dst(x, y) = src(x + 0.5, y): 5, 15, then the edge (20 replicated | 10 constant) */
  const double m[6] = {1, 0, 0.5, 0, 1, 0};
  assert_int_equal(spn_image_warp_affine(&src, &dst, m, SPN_WARP_INVERSE_MAP, SPN_BORDER_REPLICATE, NULL, &err),
                   SPN_OK);
  assert_int_equal(dst.data[0][0], 5);
  assert_int_equal(dst.data[0][1], 15);
  assert_int_equal(dst.data[0][2], 20);
  const double bv[4] = {100, 0, 0, 0};
  assert_int_equal(spn_image_warp_affine(&src, &dst, m, SPN_WARP_INVERSE_MAP, SPN_BORDER_CONSTANT, bv, &err),
                   SPN_OK);
  assert_int_equal(dst.data[0][2], 60); /* (20 + 100) / 2 */
  /* the forward matrix (translate by -0.5) gives the same image */
  const double fwd[6] = {1, 0, -0.5, 0, 1, 0};
  assert_int_equal(spn_image_warp_affine(&src, &dst, fwd, 0, SPN_BORDER_CONSTANT, bv, &err), SPN_OK);
  assert_int_equal(dst.data[0][0], 5);
  assert_int_equal(dst.data[0][2], 60);
  /* rotate 90 clockwise: 3x2 → 2x3, first row becomes last column */
  assert_int_equal(spn_image_alloc(&rot, 2, 3, SPN_PIXFMT_GRAY8, &err), SPN_OK);
  assert_int_equal(spn_image_rotate(&src, &rot, 90, &err), SPN_OK);
  const uint8_t expect[6] = {30, 0, 40, 10, 50, 20};
  for (int y = 0; y < 3; y++)
    for (int x = 0; x < 2; x++)
      assert_int_equal(rot.data[0][y * rot.stride[0] + x], expect[y * 2 + x]);
  assert_int_equal(spn_image_rotate(&src, &rot, 45, &err), SPN_EINVAL);
  const double singular[6] = {1, 2, 0, 2, 4, 0};
  assert_int_equal(spn_image_warp_affine(&src, &dst, singular, 0, SPN_BORDER_CONSTANT, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "singular"));
  spn_image_release(&src);
  spn_image_release(&dst);
  spn_image_release(&rot);
}

/* spn_pixfmt_tight_size: the bytes spn_image_wrap's planes span, by hand
 * for an odd 4:2:0 frame, and for every format at even and odd sizes. */
static void tight_sizes_are_the_wrapped_layout(void **state) {
  (void)state;
  assert_int_equal(spn_pixfmt_tight_size(SPN_PIXFMT_NV12, 5, 3), 5 * 3 + 3 * 2 * 2);
  assert_int_equal(spn_pixfmt_tight_size(SPN_PIXFMT_RGBF32P, 5, 3), 5 * 3 * 3 * 4);
  assert_int_equal(spn_pixfmt_tight_size(0, 5, 3), 0);
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24, SPN_PIXFMT_GRAY8, SPN_PIXFMT_RGBF32P,
                          SPN_PIXFMT_BGRF32P, SPN_PIXFMT_GRAYF32, SPN_PIXFMT_NV12, SPN_PIXFMT_YUV420P};
  const int32_t sizes[][2] = {{64, 48}, {37, 21}, {1, 1}};
  static uint8_t buf[64 * 48 * 12];
  for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
    for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
      spn_image_t v;
      spn_error_t err = SPN_ERROR_INIT;
      assert_int_equal(spn_image_wrap(&v, buf, sizes[z][0], sizes[z][1], fmts[f], &err), SPN_OK);
      int32_t pw, ph, last = v.nplanes - 1;
      spn_pixfmt_plane_size(fmts[f], v.width, v.height, last, &pw, &ph);
      size_t end = (size_t)(v.data[last] - buf) + (size_t)v.stride[last] * (size_t)ph;
      assert_int_equal(spn_pixfmt_tight_size(fmts[f], sizes[z][0], sizes[z][1]), end);
    }
}

static void crop_views_and_rejections(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t img, view, nv;
  assert_int_equal(spn_image_alloc(&img, 8, 6, SPN_PIXFMT_RGB24, &err), SPN_OK);
  img.data[0][2 * img.stride[0] + 3 * 3 + 1] = 77;
  assert_int_equal(spn_image_crop(&img, 3, 2, 4, 3, &view, &err), SPN_OK);
  assert_int_equal(view.data[0][1], 77);
  assert_null(view.owned);
  assert_int_equal(spn_image_crop(&img, 5, 2, 4, 3, &view, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "outside the 8x6 image"));
  assert_int_equal(spn_image_alloc(&nv, 8, 6, SPN_PIXFMT_NV12, &err), SPN_OK);
  assert_int_equal(spn_image_crop(&nv, 1, 2, 4, 2, &view, &err), SPN_EINVAL);
  assert_int_equal(spn_image_crop(&nv, 2, 2, 4, 2, &view, &err), SPN_OK);
  assert_ptr_equal(view.data[1], nv.data[1] + nv.stride[1] + 2);
  /* mismatched formats are refused with the names */
  assert_int_equal(spn_image_resize(&img, &nv, SPN_INTERP_BILINEAR, &err), SPN_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "rgb24"));
  assert_int_equal(spn_image_alloc(&view, 0, 5, SPN_PIXFMT_RGB24, &err), SPN_EINVAL);
  assert_int_equal(spn_pixfmt_from_name("bgrf32p"), SPN_PIXFMT_BGRF32P);
  assert_string_equal(spn_pixfmt_name(SPN_PIXFMT_NV12), "nv12");
  spn_image_release(&img);
  spn_image_release(&nv);
}

/* ---- against the Python reference ---- */

static void resize_u8_matches_opencv(void **state) {
  (void)state;
  const struct { const char *name; int h, w, dh, dw, interp; } cases[] = {
      {"resize_lin_down", 29, 37, 11, 16, SPN_INTERP_BILINEAR},
      {"resize_lin_up", 7, 13, 23, 40, SPN_INTERP_BILINEAR},
      {"resize_area_int", 48, 64, 12, 16, SPN_INTERP_AREA},
      {"resize_area_frac", 37, 50, 13, 17, SPN_INTERP_AREA},
      /* (a 4:3-pixel frame widened to square pixels, as decode does, and a shrink) */
      {"resize_cub_up", 24, 31, 24, 41, SPN_INTERP_CUBIC},
      {"resize_cub_down", 29, 37, 17, 20, SPN_INTERP_CUBIC},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    uint8_t *in = read_file(cases[i].name, "in", (size_t)cases[i].h * cases[i].w * 3);
    uint8_t *ref = read_file(cases[i].name, "ref", (size_t)cases[i].dh * cases[i].dw * 3);
    spn_image_t src, dst;
    load_u8(&src, in, cases[i].w, cases[i].h, SPN_PIXFMT_RGB24);
    assert_int_equal(spn_image_alloc(&dst, cases[i].dw, cases[i].dh, SPN_PIXFMT_RGB24, &err), SPN_OK);
    assert_int_equal(spn_image_resize(&src, &dst, cases[i].interp, &err), SPN_OK);
    int md = max_diff_u8(&dst, ref, 3);
    printf("# %s: max |diff| vs OpenCV = %d\n", cases[i].name, md);
    assert_true(md <= 1);
    spn_image_release(&src);
    spn_image_release(&dst);
    free(in);
    free(ref);
  }
}

static void resize_f32_matches_opencv(void **state) {
  (void)state;
  const struct { const char *name; int h, w, dh, dw, interp; } cases[] = {
      {"resize_lin_f32", 29, 37, 20, 50, SPN_INTERP_BILINEAR},
      {"resize_area_f32", 37, 50, 13, 17, SPN_INTERP_AREA},
      {"resize_cub_f32", 29, 37, 20, 50, SPN_INTERP_CUBIC},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    float *in = read_file(cases[i].name, "in", sizeof(float) * cases[i].h * cases[i].w * 3);
    float *ref = read_file(cases[i].name, "ref", sizeof(float) * cases[i].dh * cases[i].dw * 3);
    spn_image_t src, dst;
    load_f32(&src, in, cases[i].w, cases[i].h);
    assert_int_equal(spn_image_alloc(&dst, cases[i].dw, cases[i].dh, SPN_PIXFMT_RGBF32P, &err), SPN_OK);
    assert_int_equal(spn_image_resize(&src, &dst, cases[i].interp, &err), SPN_OK);
    double md = 0;
    for (int c = 0; c < 3; c++)
      for (int y = 0; y < cases[i].dh; y++)
        for (int x = 0; x < cases[i].dw; x++) {
          double d = fabs(((float *)(dst.data[c] + y * dst.stride[c]))[x] - ref[((size_t)y * cases[i].dw + x) * 3 + c]);
          md = d > md ? d : md;
        }
    printf("# %s: max |diff| vs OpenCV = %.3g\n", cases[i].name, md);
    assert_true(md <= 1e-5);
    spn_image_release(&src);
    spn_image_release(&dst);
    free(in);
    free(ref);
  }
}

static void gray_and_yuv_match_reference(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  uint8_t *in = read_file("gray", "in", 21 * 17 * 3);
  uint8_t *ref = read_file("gray", "ref", 21 * 17);
  spn_image_t src, g;
  load_u8(&src, in, 17, 21, SPN_PIXFMT_RGB24);
  assert_int_equal(spn_image_alloc(&g, 17, 21, SPN_PIXFMT_GRAY8, &err), SPN_OK);
  assert_int_equal(spn_image_convert(&src, &g, &err), SPN_OK);
  assert_true(max_diff_u8(&g, ref, 1) <= 1);
  spn_image_release(&src);
  spn_image_release(&g);
  free(in);
  free(ref);

  /* odd size 15x9: chroma 8x5, edge chroma averages the pixels that exist */
  const int w = 15, h = 9, cw = 8, ch = 5;
  in = read_file("yuv", "in", (size_t)w * h * 3);
  ref = read_file("yuv", "ref", (size_t)w * h + 2 * (size_t)cw * ch);
  uint8_t *back_ref = read_file("yuv_back", "ref", (size_t)w * h * 3);
  spn_image_t yuv, nv, back;
  load_u8(&src, in, w, h, SPN_PIXFMT_RGB24);
  assert_int_equal(spn_image_alloc(&yuv, w, h, SPN_PIXFMT_YUV420P, &err), SPN_OK);
  assert_int_equal(spn_image_alloc(&nv, w, h, SPN_PIXFMT_NV12, &err), SPN_OK);
  assert_int_equal(spn_image_alloc(&back, w, h, SPN_PIXFMT_RGB24, &err), SPN_OK);
  assert_int_equal(spn_image_convert(&src, &yuv, &err), SPN_OK);
  assert_int_equal(spn_image_convert(&src, &nv, &err), SPN_OK);
  int md = 0;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      md = imax(md, abs(yuv.data[0][y * yuv.stride[0] + x] - ref[y * w + x]));
      assert_int_equal(nv.data[0][y * nv.stride[0] + x], yuv.data[0][y * yuv.stride[0] + x]);
    }
  for (int y = 0; y < ch; y++)
    for (int x = 0; x < cw; x++) {
      int u = yuv.data[1][y * yuv.stride[1] + x], v = yuv.data[2][y * yuv.stride[2] + x];
      md = imax(md, abs(u - ref[w * h + y * cw + x]));
      md = imax(md, abs(v - ref[w * h + cw * ch + y * cw + x]));
      assert_int_equal(nv.data[1][y * nv.stride[1] + 2 * x], u);
      assert_int_equal(nv.data[1][y * nv.stride[1] + 2 * x + 1], v);
    }
  printf("# rgb->yuv420p: max |diff| vs float64 reference = %d\n", md);
  assert_true(md <= 1);
  /* back from the reference's own YUV (so only the inverse is under test) */
  for (int y = 0; y < h; y++)
    memcpy(yuv.data[0] + y * yuv.stride[0], ref + y * w, (size_t)w);
  for (int y = 0; y < ch; y++) {
    memcpy(yuv.data[1] + y * yuv.stride[1], ref + w * h + y * cw, (size_t)cw);
    memcpy(yuv.data[2] + y * yuv.stride[2], ref + w * h + cw * ch + y * cw, (size_t)cw);
  }
  assert_int_equal(spn_image_convert(&yuv, &back, &err), SPN_OK);
  md = max_diff_u8(&back, back_ref, 3);
  printf("# yuv420p->rgb: max |diff| vs float64 reference = %d\n", md);
  assert_true(md <= 1);
  spn_image_release(&src);
  spn_image_release(&yuv);
  spn_image_release(&nv);
  spn_image_release(&back);
  free(in);
  free(ref);
  free(back_ref);
}

static void to_float_matches_reference(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  const int w = 11, h = 6;
  uint8_t *in = read_file("to_float", "in", (size_t)w * h * 3);
  float *ref = read_file("to_float", "ref", sizeof(float) * w * h * 3);
  spn_image_t src, f, back;
  load_u8(&src, in, w, h, SPN_PIXFMT_RGB24);
  assert_int_equal(spn_image_alloc(&f, w, h, SPN_PIXFMT_BGRF32P, &err), SPN_OK);
  const float mean[3] = {104.0f, 117.0f, 123.0f}, scale[3] = {1 / 57.0f, 1 / 57.5f, 1 / 58.0f};
  assert_int_equal(spn_image_to_float(&src, &f, mean, scale, &err), SPN_OK);
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        assert_float_equal(((float *)(f.data[c] + y * f.stride[c]))[x], ref[(c * h + y) * w + x], 1e-5);
  /* and back to RGB24 restores the input exactly */
  assert_int_equal(spn_image_alloc(&back, w, h, SPN_PIXFMT_RGB24, &err), SPN_OK);
  assert_int_equal(spn_image_from_float(&f, &back, mean, scale, &err), SPN_OK);
  assert_int_equal(max_diff_u8(&back, in, 3), 0);
  spn_image_release(&src);
  spn_image_release(&f);
  spn_image_release(&back);
  free(in);
  free(ref);
}

static void warp_matches_reference(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  const double ang = 17.0 * M_PI / 180.0;
  const double m[6] = {1.1 * cos(ang), -1.1 * sin(ang), 5.3, 1.1 * sin(ang), 1.1 * cos(ang), -3.7};
  uint8_t *in = read_file("warp", "in", 40 * 30 * 3);
  uint8_t *rc = read_file("warp_const", "ref", 36 * 32 * 3);
  uint8_t *rr = read_file("warp_repl", "ref", 36 * 32 * 3);
  uint8_t *smooth = read_file("warp_cv", "in", 40 * 30 * 3);
  uint8_t *rcv = read_file("warp_cv", "ref", 36 * 32 * 3);
  spn_image_t src, dst;
  load_u8(&src, in, 40, 30, SPN_PIXFMT_RGB24);
  assert_int_equal(spn_image_alloc(&dst, 36, 32, SPN_PIXFMT_RGB24, &err), SPN_OK);
  const double bv[4] = {10, 20, 30, 0};
  assert_int_equal(spn_image_warp_affine(&src, &dst, m, 0, SPN_BORDER_CONSTANT, bv, &err), SPN_OK);
  int md = max_diff_u8(&dst, rc, 3);
  printf("# warp constant: max |diff| vs exact reference = %d\n", md);
  assert_true(md <= 1);
  assert_int_equal(spn_image_warp_affine(&src, &dst, m, 0, SPN_BORDER_REPLICATE, NULL, &err), SPN_OK);
  md = max_diff_u8(&dst, rr, 3);
  printf("# warp replicate: max |diff| vs exact reference = %d\n", md);
  assert_true(md <= 1);
  spn_image_release(&src);
  /* OpenCV quantises positions to 1/32 px; on a smooth image that is <= 2 */
  load_u8(&src, smooth, 40, 30, SPN_PIXFMT_RGB24);
  assert_int_equal(spn_image_warp_affine(&src, &dst, m, 0, SPN_BORDER_REPLICATE, NULL, &err), SPN_OK);
  md = max_diff_u8(&dst, rcv, 3);
  printf("# warp replicate: max |diff| vs cv2.warpAffine (smooth image) = %d\n", md);
  assert_true(md <= 2);
  spn_image_release(&src);
  spn_image_release(&dst);
  free(in);
  free(rc);
  free(rr);
  free(smooth);
  free(rcv);
}

static void feathered_paste_matches_reference(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  uint8_t *in = read_file("paste", "in", 20 * 24 * 3 + 10 * 12 * 3);
  uint8_t *ref = read_file("paste", "ref", 20 * 24 * 3);
  spn_image_t dst, src, mask;
  load_u8(&dst, in, 24, 20, SPN_PIXFMT_RGB24);
  load_u8(&src, in + 20 * 24 * 3, 12, 10, SPN_PIXFMT_RGB24);
  assert_int_equal(spn_image_alloc(&mask, 12, 10, SPN_PIXFMT_GRAYF32, &err), SPN_OK);
  assert_int_equal(spn_image_feather_mask(&mask, 3.0f, &err), SPN_OK);
  assert_int_equal(spn_image_paste(&dst, &src, 15, -3, &mask, &err), SPN_OK);
  int md = max_diff_u8(&dst, ref, 3);
  printf("# feathered paste: max |diff| vs reference = %d\n", md);
  assert_true(md <= 1);
  spn_image_release(&dst);
  spn_image_release(&src);
  spn_image_release(&mask);
  free(in);
  free(ref);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PYTHON image_ref.py\n", argv[0]);
    return 2;
  }
  snprintf(refdir, sizeof refdir, "%s/spn-image-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(refdir)) {
    perror("mkdtemp");
    return 1;
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", argv[1], argv[2], refdir);
  if (system(cmd) != 0) {
    fprintf(stderr, "reference script failed: %s\n", cmd);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bilinear_half_pixel_by_hand),
      cmocka_unit_test(area_by_hand),
      cmocka_unit_test(yuv_primaries_by_hand),
      cmocka_unit_test(yuv_matrices_by_hand),
      cmocka_unit_test(feather_mask_by_hand),
      cmocka_unit_test(warp_and_rotate_by_hand),
      cmocka_unit_test(crop_views_and_rejections),
      cmocka_unit_test(tight_sizes_are_the_wrapped_layout),
      cmocka_unit_test(resize_u8_matches_opencv),
      cmocka_unit_test(resize_f32_matches_opencv),
      cmocka_unit_test(gray_and_yuv_match_reference),
      cmocka_unit_test(to_float_matches_reference),
      cmocka_unit_test(warp_matches_reference),
      cmocka_unit_test(feathered_paste_matches_reference),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", refdir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", refdir);
  return rc;
}
