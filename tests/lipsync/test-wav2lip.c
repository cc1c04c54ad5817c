/* test-wav2lip.c — Wav2Lip pre/post-processing (stages/lipsync/wav2lip.c).
 *
 * Small exact cases: crop rectangles (rounding, pads, clamping, boxes
 * outside the frame), face choice, the 6-channel input on crops whose resize
 * is exact (identity and 2× down over 2×2 blocks), hard and feathered pastes
 * against the blend formula evaluated here, and the mel windows against a
 * transcription of Wav2Lip's own chunking loop.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wav2lip.h"

static spn_face_t face_box(float x0, float y0, float x1, float y1) {
  spn_face_t f;
  memset(&f, 0, sizeof f);
  f.x0 = x0, f.y0 = y0, f.x1 = x1, f.y1 = y1, f.score = 1.0f;
  return f;
}

static void assert_rect(const spn_w2l_rect_t *r, int32_t x, int32_t y, int32_t w, int32_t h) {
  assert_int_equal(r->x, x);
  assert_int_equal(r->y, y);
  assert_int_equal(r->w, w);
  assert_int_equal(r->h, h);
}

static void test_crop_rect(void **ctx) {
  (void)ctx;
  spn_w2l_rect_t r;
  /* Default pads (0, 10, 0, 0); 20.5 rounds up, 60.2 down. */
  spn_face_t f = face_box(10.4f, 20.5f, 50.6f, 60.2f);
  assert_true(spn_w2l_crop_rect(&f, 100, 100, NULL, &r));
  assert_rect(&r, 10, 21, 41, 49);
  /* The bottom pad runs past the frame: clamped. */
  f = face_box(0, 80, 30, 95);
  assert_true(spn_w2l_crop_rect(&f, 100, 100, NULL, &r));
  assert_rect(&r, 0, 80, 30, 20);
  /* Top and left pads clamped at 0, right pad clamped at the width. */
  spn_w2l_pads_t p = {5, 0, 8, 30};
  f = face_box(3, 2, 20, 20);
  assert_true(spn_w2l_crop_rect(&f, 40, 100, &p, &r));
  assert_rect(&r, 0, 0, 40, 20);
  /* Outside the frame, inverted, not finite: no crop. */
  f = face_box(120, 10, 150, 40);
  assert_false(spn_w2l_crop_rect(&f, 100, 100, NULL, &r));
  assert_rect(&r, 0, 0, 0, 0);
  f = face_box(50, 50, 40, 40);
  spn_w2l_pads_t zero = {0, 0, 0, 0};
  assert_false(spn_w2l_crop_rect(&f, 100, 100, &zero, &r));
  f = face_box(NAN, 1, 20, 20);
  assert_false(spn_w2l_crop_rect(&f, 100, 100, NULL, &r));
  f = face_box(1, 1, INFINITY, 20);
  assert_false(spn_w2l_crop_rect(&f, 100, 100, NULL, &r));
  f = face_box(-1e30f, -1e30f, 1e30f, 1e30f);
  assert_false(spn_w2l_crop_rect(&f, 100, 100, NULL, &r));
}

static void test_pick_face(void **ctx) {
  (void)ctx;
  spn_face_t f[4] = {face_box(0, 0, 10, 10), face_box(0, 0, 20, 5), face_box(5, 5, 35, 35), face_box(0, 0, 30, 30)};
  assert_int_equal(spn_w2l_pick_face(f, 4), 2);     /* 900 = 900: the first */
  assert_int_equal(spn_w2l_pick_face(f, 2), 0);     /* 100 = 100 */
  assert_int_equal(spn_w2l_pick_face(f, 0), -1);
  spn_face_t bad[2] = {face_box(10, 10, 0, 0), face_box(0, 0, 1, 2)};
  assert_int_equal(spn_w2l_pick_face(bad, 2), 1);
}

static uint8_t pattern(int32_t x, int32_t y, int32_t c) { return (uint8_t)((x * 7 + y * 13 + c * 50) % 256); }

static void fill_pattern(spn_image_t *img) {
  for (int32_t y = 0; y < img->height; y++)
    for (int32_t x = 0; x < img->width; x++)
      for (int32_t c = 0; c < 3; c++)
        img->data[0][y * img->stride[0] + x * 3 + c] = pattern(x, y, c);
}

/* face6[k][y][x], k in 0..5 */
static float at6(const float *f, int32_t k, int32_t y, int32_t x) {
  return f[((size_t)k * SPN_W2L_SIZE + (size_t)y) * SPN_W2L_SIZE + (size_t)x];
}

static void test_prepare_identity(void **ctx) {
  (void)ctx;
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t img = SPN_IMAGE_INIT;
  assert_int_equal(spn_image_alloc(&img, 120, 110, SPN_PIXFMT_RGB24, &err), SPN_OK);
  fill_pattern(&img);
  float *face6 = malloc(SPN_W2L_FACE_FLOATS * sizeof(float));
  assert_non_null(face6);
  spn_w2l_rect_t r = {10, 5, 96, 96}; /* 96×96: the resize is the identity */
  assert_int_equal(spn_w2l_prepare(&img, &r, face6, &err), SPN_OK);
  for (int32_t y = 0; y < 96; y++)
    for (int32_t x = 0; x < 96; x++)
      for (int32_t k = 0; k < 3; k++) {
        /* plane k is B, G, R: source channel 2 - k */
        float v = (float)pattern(10 + x, 5 + y, 2 - k) / 255.0f;
        assert_float_equal(at6(face6, 3 + k, y, x), v, 1e-6);
        assert_float_equal(at6(face6, k, y, x), y < 48 ? v : 0.0f, 1e-6);
      }
  free(face6);
  spn_image_release(&img);
}

static void test_prepare_downscale(void **ctx) {
  (void)ctx;
  /* 192×192 crop of 2×2 blocks: each output pixel samples the centre of a
   * block (sx = 2 dx + 0.5), so the 2× bilinear shrink is exact. */
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t img = SPN_IMAGE_INIT;
  assert_int_equal(spn_image_alloc(&img, 200, 196, SPN_PIXFMT_RGB24, &err), SPN_OK);
  const int32_t ox = 3, oy = 2;
  for (int32_t y = 0; y < 196; y++)
    for (int32_t x = 0; x < 200; x++)
      for (int32_t c = 0; c < 3; c++) {
        int32_t bx = (x - ox) >> 1, by = (y - oy) >> 1; /* floor for negatives too */
        img.data[0][y * img.stride[0] + x * 3 + c] = pattern(bx, by, c);
      }
  float *face6 = malloc(SPN_W2L_FACE_FLOATS * sizeof(float));
  assert_non_null(face6);
  spn_w2l_rect_t r = {ox, oy, 192, 192};
  assert_int_equal(spn_w2l_prepare(&img, &r, face6, &err), SPN_OK);
  for (int32_t y = 0; y < 96; y++)
    for (int32_t x = 0; x < 96; x++)
      for (int32_t k = 0; k < 3; k++) {
        float v = (float)pattern(x, y, 2 - k) / 255.0f;
        assert_float_equal(at6(face6, 3 + k, y, x), v, 1e-6);
        assert_float_equal(at6(face6, k, y, x), y < 48 ? v : 0.0f, 1e-6);
      }
  /* A crop that is not inside the frame, and a frame that is not RGB. */
  spn_w2l_rect_t out = {150, 10, 96, 96};
  assert_int_equal(spn_w2l_prepare(&img, &out, face6, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "not inside the 200x196 frame"));
  spn_image_t gray = SPN_IMAGE_INIT;
  assert_int_equal(spn_image_alloc(&gray, 100, 100, SPN_PIXFMT_GRAY8, &err), SPN_OK);
  assert_int_equal(spn_w2l_prepare(&gray, &r, face6, &err), SPN_EINVAL);
  spn_image_release(&gray);
  free(face6);
  spn_image_release(&img);
}

static void fill_const(spn_image_t *img, const uint8_t rgb[3]) {
  for (int32_t y = 0; y < img->height; y++)
    for (int32_t x = 0; x < img->width; x++)
      memcpy(img->data[0] + y * img->stride[0] + x * 3, rgb, 3);
}

/* Output planes B = 1, G = 0.5, R = 0 → u8 RGB (0, 128, 255): 127.5 rounds up. */
static float *const_output(void) {
  float *o = malloc(SPN_W2L_OUT_FLOATS * sizeof(float));
  const size_t P = SPN_W2L_SIZE * SPN_W2L_SIZE;
  for (size_t i = 0; i < P; i++) {
    o[i] = 1.0f;
    o[P + i] = 0.5f;
    o[2 * P + i] = 0.0f;
  }
  return o;
}

static void test_paste_hard(void **ctx) {
  (void)ctx;
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t img = SPN_IMAGE_INIT;
  assert_int_equal(spn_image_alloc(&img, 40, 30, SPN_PIXFMT_RGB24, &err), SPN_OK);
  const uint8_t bg[3] = {11, 21, 31};
  fill_const(&img, bg);
  float *o = const_output();
  spn_w2l_rect_t r = {5, 4, 12, 10};
  assert_int_equal(spn_w2l_paste(&img, &r, o, 0.0f, &err), SPN_OK);
  for (int32_t y = 0; y < 30; y++)
    for (int32_t x = 0; x < 40; x++) {
      const uint8_t *p = img.data[0] + y * img.stride[0] + x * 3;
      bool in = x >= 5 && x < 17 && y >= 4 && y < 14;
      assert_int_equal(p[0], in ? 0 : 11);
      assert_int_equal(p[1], in ? 128 : 21);
      assert_int_equal(p[2], in ? 255 : 31);
    }
  /* Out-of-range outputs saturate. */
  const size_t P = SPN_W2L_SIZE * SPN_W2L_SIZE;
  for (size_t i = 0; i < P; i++)
    o[i] = 7.0f, o[P + i] = -3.0f, o[2 * P + i] = 0.2f; /* B, G, R */
  assert_int_equal(spn_w2l_paste(&img, &r, o, 0.0f, &err), SPN_OK);
  const uint8_t *p = img.data[0] + 6 * img.stride[0] + 9 * 3;
  assert_int_equal(p[0], 51); /* 0.2 * 255 */
  assert_int_equal(p[1], 0);
  assert_int_equal(p[2], 255);
  /* Errors: a crop outside the frame, a non-finite feather. */
  spn_w2l_rect_t bad = {35, 4, 12, 10};
  assert_int_equal(spn_w2l_paste(&img, &bad, o, 0.0f, &err), SPN_EINVAL);
  assert_int_equal(spn_w2l_paste(&img, &r, o, NAN, &err), SPN_EINVAL);
  free(o);
  spn_image_release(&img);
}

static double clamp01(double v) { return v < 0 ? 0 : v > 1 ? 1 : v; }

static void test_paste_feathered(void **ctx) {
  (void)ctx;
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t img = SPN_IMAGE_INIT;
  assert_int_equal(spn_image_alloc(&img, 40, 30, SPN_PIXFMT_RGB24, &err), SPN_OK);
  const uint8_t bg[3] = {11, 21, 31};
  fill_const(&img, bg);
  float *o = const_output();
  const int32_t rx = 5, ry = 4, rw = 12, rh = 10;
  spn_w2l_rect_t r = {rx, ry, rw, rh};
  const double F = 3.0;
  assert_int_equal(spn_w2l_paste(&img, &r, o, (float)F, &err), SPN_OK);
  const double src[3] = {0, 128, 255};
  int changed_partly = 0;
  for (int32_t y = 0; y < 30; y++)
    for (int32_t x = 0; x < 40; x++) {
      const uint8_t *p = img.data[0] + y * img.stride[0] + x * 3;
      bool in = x >= rx && x < rx + rw && y >= ry && y < ry + rh;
      double a = 0;
      if (in) {
        double lx = x - rx, ly = y - ry;
        double ax = clamp01(fmin(lx + 0.5, rw - lx - 0.5) / F), ay = clamp01(fmin(ly + 0.5, rh - ly - 0.5) / F);
        a = ax * ay;
      }
      for (int c = 0; c < 3; c++) {
        double want = a * src[c] + (1 - a) * bg[c];
        assert_true(fabs(p[c] - want) <= 0.5 + 1e-4);
      }
      if (in && a > 0.01 && a < 0.99 && p[1] != 21 && p[1] != 128)
        changed_partly++;
    }
  /* The edge is really soft: the centre is the output, the rim a blend. */
  const uint8_t *c = img.data[0] + (ry + 5) * img.stride[0] + (rx + 6) * 3;
  assert_int_equal(c[0], 0);
  assert_int_equal(c[1], 128);
  assert_int_equal(c[2], 255);
  assert_true(changed_partly >= 2 * (rw + rh));
  free(o);
  spn_image_release(&img);
}

/* Wav2Lip's chunking loop, transcribed: windows of 16 columns at
 * int(i * 80/fps) while they fit, then the last 16 columns, then stop. */
static int64_t ref_chunks(double fps, int64_t n, int64_t *starts, int64_t max) {
  double mult = 80.0 / fps;
  int64_t k = 0;
  for (int64_t i = 0;; i++) {
    int64_t s = (int64_t)(i * mult);
    if (s + 16 > n) {
      if (k < max)
        starts[k] = n - 16;
      return k + 1;
    }
    if (k < max)
      starts[k] = s;
    k++;
  }
}

static void test_mel_windows(void **ctx) {
  (void)ctx;
  assert_int_equal(spn_w2l_mel_chunks(25.0, 100), 28);
  assert_int_equal(spn_w2l_mel_start(26, 25.0, 100), 83);
  assert_int_equal(spn_w2l_mel_start(27, 25.0, 100), 84);
  assert_int_equal(spn_w2l_mel_start(500, 25.0, 100), 84);
  assert_int_equal(spn_w2l_mel_chunks(25.0, 15), 0);
  assert_int_equal(spn_w2l_mel_start(0, 25.0, 15), -1);
  assert_int_equal(spn_w2l_mel_chunks(25.0, 16), 2); /* Wav2Lip repeats the only window */
  static int64_t starts[4096];
  const double fpss[] = {25.0, 30.0, 29.97, 24.0, 60.0, 12.5, 23.976};
  for (size_t f = 0; f < sizeof fpss / sizeof fpss[0]; f++)
    for (int64_t n = 16; n < 1200; n += 7) {
      int64_t want = ref_chunks(fpss[f], n, starts, 4096);
      assert_int_equal(spn_w2l_mel_chunks(fpss[f], n), want);
      for (int64_t i = 0; i < want; i++)
        assert_int_equal(spn_w2l_mel_start(i, fpss[f], n), starts[i]);
    }
}

static void test_mel_chunk(void **ctx) {
  (void)ctx;
  const int64_t T = 50;
  float *mel = malloc(80 * T * sizeof *mel);
  for (int m = 0; m < 80; m++)
    for (int64_t t = 0; t < T; t++)
      mel[m * T + t] = (float)(m * 1000 + t);
  float chunk[80 * 16];
  spn_error_t err = SPN_ERROR_INIT;
  /* 30 fps: frame 4 starts at floor(4 * 80 / 30) = 10; frame 14 at 37, clamped to T - 16 = 34. */
  assert_int_equal(spn_w2l_mel_chunk(mel, T, 4, 30.0, chunk, &err), SPN_OK);
  for (int m = 0; m < 80; m++)
    for (int s = 0; s < 16; s++)
      assert_float_equal(chunk[m * 16 + s], m * 1000 + 10 + s, 0);
  assert_int_equal(spn_w2l_mel_chunk(mel, T, 14, 30.0, chunk, &err), SPN_OK); /* 37 clamps to 34 */
  assert_float_equal(chunk[79 * 16 + 15], 79 * 1000 + 49, 0);
  assert_float_equal(chunk[0], 34, 0);
  assert_int_equal(spn_w2l_mel_chunk(mel, 15, 0, 30.0, chunk, &err), SPN_EINVAL);
  assert_int_equal(spn_w2l_mel_chunk(mel, T, -1, 30.0, chunk, &err), SPN_EINVAL);
  free(mel);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crop_rect),        cmocka_unit_test(test_pick_face),
      cmocka_unit_test(test_prepare_identity), cmocka_unit_test(test_prepare_downscale),
      cmocka_unit_test(test_paste_hard),       cmocka_unit_test(test_paste_feathered),
      cmocka_unit_test(test_mel_windows),      cmocka_unit_test(test_mel_chunk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
