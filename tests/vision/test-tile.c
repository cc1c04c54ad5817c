/* test-tile.c — tiled super-resolution equals untiled with enough padding.
 *
 * The "model" is a deterministic local operator written here: `depth` passes
 * of a fixed 3x3 convolution that also mixes the colour channels (zero
 * padding at the block edge, like a conv layer), then nearest-neighbour
 * upsampling by `scale`. Its receptive-field radius is `depth`, so tiling with
 * tile_pad >= depth must reproduce the untiled output (to float rounding), and
 * tile_pad < depth must show seams — which proves the comparison can fail. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tile.h"

typedef struct op {
  int32_t depth, scale, calls, fail_at;
} op_t;

static const float K[3][3] = {{0.05f, 0.1f, 0.05f}, {0.1f, 0.4f, 0.1f}, {0.05f, 0.1f, 0.05f}};

static void conv(const float *in, int32_t c, int32_t h, int32_t w, float *out) {
  for (int32_t k = 0; k < c; k++)
    for (int32_t y = 0; y < h; y++)
      for (int32_t x = 0; x < w; x++) {
        float acc = 0.f;
        for (int dy = -1; dy <= 1; dy++)
          for (int dx = -1; dx <= 1; dx++) {
            int32_t yy = y + dy, xx = x + dx;
            if (yy < 0 || yy >= h || xx < 0 || xx >= w)
              continue;
            /* own channel plus a little of the next one */
            float v = in[((size_t)k * h + yy) * w + xx] + 0.25f * in[((size_t)((k + 1) % c) * h + yy) * w + xx];
            acc += K[dy + 1][dx + 1] * v;
          }
        out[((size_t)k * h + y) * w + x] = acc;
      }
}

static int32_t op_run(void *user, const float *in, int32_t c, int32_t h, int32_t w, float *out, spn_error_t *err) {
  op_t *op = user;
  if (++op->calls == op->fail_at)
    return spn_error_set(err, SPN_EDEVICE, "model failed");
  size_t n = (size_t)c * h * w;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  memcpy(a, in, n * sizeof *a);
  for (int32_t d = 0; d < op->depth; d++) {
    conv(a, c, h, w, b);
    float *t = a;
    a = b;
    b = t;
  }
  int32_t s = op->scale;
  for (int32_t k = 0; k < c; k++)
    for (int32_t y = 0; y < h * s; y++)
      for (int32_t x = 0; x < w * s; x++)
        out[((size_t)k * h * s + y) * w * s + x] = a[((size_t)k * h + y / s) * w + x / s];
  free(a);
  free(b);
  return SPN_OK;
}

static float *random_image(int32_t c, int32_t h, int32_t w, uint32_t seed) {
  float *img = malloc((size_t)c * h * w * sizeof *img);
  for (size_t i = 0; i < (size_t)c * h * w; i++) {
    seed = seed * 1664525u + 1013904223u;
    img[i] = (float)(seed >> 8) / (float)(1u << 24);
  }
  return img;
}

/* Max |tiled - untiled| over the output, skipping `margin` output pixels at
 * the image border (0 = everywhere). */
static double tiled_error(int32_t h, int32_t w, int32_t tile, int32_t pad, int32_t depth, int32_t scale,
                          int32_t margin, int32_t *calls) {
  const int32_t c = 3;
  float *img = random_image(c, h, w, 12345u + (uint32_t)(h * 31 + w));
  size_t on = (size_t)c * h * scale * w * scale;
  float *ref = malloc(on * sizeof *ref), *got = malloc(on * sizeof *got);
  for (size_t i = 0; i < on; i++)
    got[i] = NAN; /* every pixel must be written */
  op_t op = {.depth = depth, .scale = scale};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(op_run(&op, img, c, h, w, ref, &err), SPN_OK);
  op.calls = 0;
  spn_tile_params_t p = {.tile = tile, .tile_pad = pad, .scale = scale, .channels = c, .out_channels = c};
  assert_int_equal(spn_tile_run(img, h, w, &p, op_run, &op, got, &err), SPN_OK);
  *calls = op.calls;
  double worst = 0;
  int32_t H = h * scale, W = w * scale;
  for (int32_t k = 0; k < c; k++)
    for (int32_t y = margin; y < H - margin; y++)
      for (int32_t x = margin; x < W - margin; x++) {
        size_t i = ((size_t)k * H + y) * W + x;
        double d = isnan(got[i]) ? INFINITY : fabs((double)got[i] - ref[i]);
        if (d > worst)
          worst = d;
      }
  free(img);
  free(ref);
  free(got);
  return worst;
}

static void test_tiled_matches_untiled(void **state) {
  (void)state;
  int32_t calls;
  /* 97x61 with 32-pixel tiles: 4x2 tiles including ragged border tiles. */
  double e = tiled_error(61, 97, 32, 2, 2, 2, 0, &calls);
  print_message("x2, tile 32, pad 2, radius 2: max error %.3g over %d tiles\n", e, calls);
  assert_int_equal(calls, 8);
  assert_true(e <= 1e-4);
  e = tiled_error(50, 70, 16, 3, 3, 4, 0, &calls);
  print_message("x4, tile 16, pad 3, radius 3: max error %.3g over %d tiles\n", e, calls);
  assert_int_equal(calls, 4 * 5);
  assert_true(e <= 1e-4);
  /* Tile larger than the image: one call, identical. */
  e = tiled_error(20, 30, 64, 10, 1, 2, 0, &calls);
  assert_int_equal(calls, 1);
  assert_true(e == 0.0);
}

static void test_too_little_padding_shows_seams(void **state) {
  (void)state;
  int32_t calls;
  double e = tiled_error(61, 97, 32, 1, 3, 2, 8, &calls);
  print_message("pad 1 < radius 3: max error %.3g away from the border\n", e);
  assert_true(e > 1e-3);
}

static void test_callback_error_stops(void **state) {
  (void)state;
  float *img = random_image(3, 40, 40, 7);
  float *out = malloc((size_t)3 * 80 * 80 * sizeof *out);
  op_t op = {.depth = 1, .scale = 2, .fail_at = 3};
  spn_error_t err = SPN_ERROR_INIT;
  spn_tile_params_t p = {.tile = 16, .tile_pad = 2, .scale = 2, .channels = 3, .out_channels = 3};
  assert_int_equal(spn_tile_run(img, 40, 40, &p, op_run, &op, out, &err), SPN_EDEVICE);
  assert_int_equal(op.calls, 3);
  assert_non_null(strstr(err.msg, "tile at (32, 0)"));
  assert_non_null(strstr(err.msg, "model failed"));
  op.calls = 0;
  op.fail_at = 0;
  p.scale = 0;
  assert_int_equal(spn_tile_run(img, 40, 40, &p, op_run, &op, out, &err), SPN_EINVAL);
  p.scale = 2;
  p.tile = 0;
  assert_int_equal(spn_tile_run(img, 40, 40, &p, op_run, &op, out, &err), SPN_EINVAL);
  assert_int_equal(op.calls, 0);
  free(img);
  free(out);
}

/* The geometry a device twin uses (spn_tile_at): the tiles cover every
 * pixel exactly once, each block holds its tile plus tile_pad of context
 * where the image has it, and the count matches the grid. */
static void test_tile_geometry_covers_once(void **state) {
  (void)state;
  const int32_t dims[][4] = {{1, 1, 8, 0}, {37, 53, 16, 5}, {64, 64, 32, 10}, {720, 1280, 256, 20}, {5, 300, 7, 100}};
  for (size_t d = 0; d < sizeof dims / sizeof *dims; d++) {
    int32_t h = dims[d][0], w = dims[d][1];
    spn_tile_params_t p = {.tile = dims[d][2], .tile_pad = dims[d][3], .scale = 2, .channels = 3, .out_channels = 3};
    assert_int_equal(spn_tile_check(h, w, &p, NULL), SPN_OK);
    int32_t n = spn_tile_count(h, w, &p);
    assert_int_equal(n, ((h + p.tile - 1) / p.tile) * ((w + p.tile - 1) / p.tile));
    unsigned char *seen = calloc((size_t)h * w, 1);
    assert_non_null(seen);
    for (int32_t k = 0; k < n; k++) {
      spn_tile_rect_t r;
      spn_tile_at(h, w, &p, k, &r);
      assert_true(r.x0 < r.x1 && r.y0 < r.y1 && r.x1 <= w && r.y1 <= h);
      assert_int_equal(r.px0, r.x0 - p.tile_pad > 0 ? r.x0 - p.tile_pad : 0);
      assert_int_equal(r.py1, r.y1 + p.tile_pad < h ? r.y1 + p.tile_pad : h);
      assert_true(r.px0 <= r.x0 && r.px1 >= r.x1 && r.py0 <= r.y0 && r.px1 <= w && r.py1 <= h);
      for (int32_t y = r.y0; y < r.y1; y++)
        for (int32_t x = r.x0; x < r.x1; x++)
          seen[(size_t)y * w + x]++;
    }
    for (size_t i = 0; i < (size_t)h * w; i++)
      assert_int_equal(seen[i], 1);
    free(seen);
  }
  spn_tile_params_t bad = {.tile = 0, .tile_pad = 1, .scale = 2, .channels = 3, .out_channels = 3};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_tile_check(10, 10, &bad, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "tile 0"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiled_matches_untiled),
      cmocka_unit_test(test_too_little_padding_shows_seams),
      cmocka_unit_test(test_callback_error_stops),
      cmocka_unit_test(test_tile_geometry_covers_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
