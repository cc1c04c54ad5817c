/* test-cuda-color-args.c — the argument checks of cuda/kernels/color.cu,
 * which run before any launch and so need no GPU (suite unit; runs in every
 * CUDA build). A check that is missing would reach the launch: without a GPU
 * that fails as SPN_ECUDA, with one it would read or write out of bounds —
 * so each case expects the specific status and a message naming the
 * operation and what is wrong. The plane pointers are never dereferenced.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "color.cuh"
#include "image.cuh"
#include "tonemap.h"

static uint8_t fake[16]; /* stands in for device memory: never touched */

static spn_image_t view(int32_t w, int32_t h, int32_t fmt) {
  spn_image_t im = SPN_IMAGE_INIT;
  im.width = w;
  im.height = h;
  im.format = fmt;
  im.nplanes = spn_pixfmt_planes(fmt);
  for (int p = 0; p < im.nplanes; p++) {
    im.data[p] = fake;
    im.stride[p] = 4096;
  }
  return im;
}

typedef int32_t (*conv_fn)(const spn_image_t *, spn_image_t *, cudaStream_t, spn_error_t *);

static void expect(conv_fn f, const spn_image_t *src, spn_image_t *dst, int32_t status, const char *op,
                   const char *part) {
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = f(src, dst, NULL, &err);
  if (rc != status || !strstr(err.msg, op) || !strstr(err.msg, part))
    fail_msg("expected status %d with \"%s\" and \"%s\", got %d: %s", (int)status, op, part, (int)rc, err.msg);
}

static void rgb_to_yuv420_refuses_bad_arguments(void **state) {
  (void)state;
  spn_image_t rgb = view(64, 48, SPN_PIXFMT_RGB24), yuv = view(64, 48, SPN_PIXFMT_YUV420P);
  spn_image_t small = view(32, 48, SPN_PIXFMT_YUV420P), gray = view(64, 48, SPN_PIXFMT_GRAY8);
  spn_image_t rgbf = view(64, 48, SPN_PIXFMT_RGBF32P), empty = view(0, 48, SPN_PIXFMT_RGB24);
  spn_image_t nv12 = view(64, 48, SPN_PIXFMT_NV12), no_chroma = view(64, 48, SPN_PIXFMT_YUV420P);
  no_chroma.data[2] = NULL;
  expect(spn_cuda_rgb_to_yuv420, NULL, &yuv, SPN_EINVAL, "rgb_to_yuv420", "source is empty");
  expect(spn_cuda_rgb_to_yuv420, &empty, &yuv, SPN_EINVAL, "rgb_to_yuv420", "source is empty");
  expect(spn_cuda_rgb_to_yuv420, &rgb, &small, SPN_EINVAL, "rgb_to_yuv420", "sizes differ (64x48 vs 32x48)");
  expect(spn_cuda_rgb_to_yuv420, &rgb, &gray, SPN_EUNSUPPORTED, "rgb_to_yuv420", "from rgb24 to gray8");
  expect(spn_cuda_rgb_to_yuv420, &rgbf, &yuv, SPN_EUNSUPPORTED, "rgb_to_yuv420", "from rgbf32p to yuv420p");
  expect(spn_cuda_rgb_to_yuv420, &nv12, &yuv, SPN_EUNSUPPORTED, "rgb_to_yuv420", "from nv12 to yuv420p");
  expect(spn_cuda_rgb_to_yuv420, &rgb, &no_chroma, SPN_EINVAL, "rgb_to_yuv420", "destination (yuv420p) lacks");
}

/* A matrix without coefficients is refused before any launch, in both
 * directions, naming it; the default (NULL) and a known one get past that
 * check to the format check. */
static void colour_variants_refuse_unknown_matrices(void **state) {
  (void)state;
  spn_image_t rgb = view(64, 48, SPN_PIXFMT_RGB24), yuv = view(64, 48, SPN_PIXFMT_YUV420P);
  spn_image_t gray = view(64, 48, SPN_PIXFMT_GRAY8);
  spn_colour_t bad = {8, 0}, ok = {SPN_MATRIX_BT709, 1};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_cuda_rgb_to_yuv420_colour(&rgb, &yuv, &bad, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "rgb_to_yuv420: image: colour matrix 8"));
  spn_error_clear(&err);
  assert_int_equal(spn_cuda_yuv420_to_rgb_colour(&yuv, &rgb, &bad, NULL, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "yuv420_to_rgb: image: colour matrix 8"));
  spn_error_clear(&err);
  assert_int_equal(spn_cuda_rgb_to_yuv420_colour(&rgb, &gray, &ok, NULL, &err), SPN_EUNSUPPORTED);
  spn_error_clear(&err);
  assert_int_equal(spn_cuda_yuv420_to_rgb_colour(&yuv, &gray, NULL, NULL, &err), SPN_EUNSUPPORTED);
}

static void yuv420_repack_refuses_bad_arguments(void **state) {
  (void)state;
  spn_image_t nv12 = view(64, 48, SPN_PIXFMT_NV12), yuv = view(64, 48, SPN_PIXFMT_YUV420P);
  spn_image_t rgb = view(64, 48, SPN_PIXFMT_RGB24), odd = view(63, 48, SPN_PIXFMT_YUV420P);
  spn_image_t no_uv = view(64, 48, SPN_PIXFMT_NV12);
  no_uv.data[1] = NULL;
  expect(spn_cuda_yuv420_repack, &nv12, NULL, SPN_EINVAL, "yuv420_repack", "destination is empty");
  expect(spn_cuda_yuv420_repack, &nv12, &odd, SPN_EINVAL, "yuv420_repack", "sizes differ");
  expect(spn_cuda_yuv420_repack, &rgb, &yuv, SPN_EUNSUPPORTED, "yuv420_repack", "from rgb24 to yuv420p");
  expect(spn_cuda_yuv420_repack, &nv12, &rgb, SPN_EUNSUPPORTED, "yuv420_repack", "from nv12 to rgb24");
  expect(spn_cuda_yuv420_repack, &no_uv, &yuv, SPN_EINVAL, "yuv420_repack", "source (nv12) has no chroma plane");
}

static void p016_to_yuv420_refuses_bad_arguments(void **state) {
  (void)state;
  spn_image_t nv12 = view(64, 48, SPN_PIXFMT_NV12), rgb = view(64, 48, SPN_PIXFMT_RGB24);
  spn_image_t empty = view(0, 48, SPN_PIXFMT_NV12), no_uv = view(64, 48, SPN_PIXFMT_NV12);
  no_uv.data[1] = NULL;
  struct {
    const void *y, *uv;
    int64_t yp, uvp;
    spn_image_t *dst;
    int32_t status;
    const char *part;
  } cases[] = {
      {fake, fake, 128, 128, &rgb, SPN_EUNSUPPORTED, "conversion to rgb24"},
      {fake, fake, 128, 128, &empty, SPN_EINVAL, "destination is empty"},
      {fake, fake, 128, 128, &no_uv, SPN_EINVAL, "destination (nv12) has no chroma plane"},
      {NULL, fake, 128, 128, &nv12, SPN_EINVAL, "needs both planes"},
      {fake, NULL, 128, 128, &nv12, SPN_EINVAL, "needs both planes"},
      {fake, fake, 127, 128, &nv12, SPN_EINVAL, "at least 128 and 128 bytes (got 127 and 128)"},
      {fake, fake, 128, 96, &nv12, SPN_EINVAL, "at least 128 and 128 bytes (got 128 and 96)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = spn_cuda_p016_to_yuv420(cases[i].y, cases[i].yp, cases[i].uv, cases[i].uvp, cases[i].dst, NULL, &err);
    if (rc != cases[i].status || !strstr(err.msg, "p016_to_yuv420") || !strstr(err.msg, cases[i].part))
      fail_msg("case %zu: expected status %d with \"%s\", got %d: %s", i, (int)cases[i].status, cases[i].part,
               (int)rc, err.msg);
  }
}

/* The HDR tone map: formats, transfer, pitches (16-bit samples take twice
 * the bytes) and matrix, each refused before any launch. */
static void hdr420_to_rgb_refuses_bad_arguments(void **state) {
  (void)state;
  spn_image_t nv12 = view(64, 48, SPN_PIXFMT_NV12), rgb = view(64, 48, SPN_PIXFMT_RGB24);
  spn_image_t yuv = view(64, 48, SPN_PIXFMT_YUV420P), rgbf = view(64, 48, SPN_PIXFMT_RGBF32P);
  spn_image_t small = view(32, 48, SPN_PIXFMT_RGB24), narrow = view(64, 48, SPN_PIXFMT_NV12);
  narrow.stride[0] = narrow.stride[1] = 100; /* enough for 8-bit samples, not for 16-bit ones */
  spn_colour_t bt2020 = {SPN_MATRIX_BT2020, 0}, bad = {8, 0};
  struct {
    const spn_image_t *src;
    int32_t deep;
    const spn_colour_t *col;
    int32_t transfer;
    spn_image_t *dst;
    int32_t status;
    const char *part;
  } cases[] = {
      {NULL, 1, &bt2020, SPN_TRANSFER_HLG, &rgb, SPN_EINVAL, "source is empty"},
      {&nv12, 1, &bt2020, SPN_TRANSFER_HLG, &small, SPN_EINVAL, "sizes differ (64x48 vs 32x48)"},
      {&yuv, 1, &bt2020, SPN_TRANSFER_HLG, &rgb, SPN_EUNSUPPORTED, "from yuv420p to rgb24"},
      {&nv12, 1, &bt2020, SPN_TRANSFER_PQ, &rgbf, SPN_EUNSUPPORTED, "from nv12 to rgbf32p"},
      {&nv12, 1, &bt2020, 1, &rgb, SPN_EINVAL, "transfer 1 is neither PQ (16) nor HLG (18)"},
      {&nv12, 1, &bad, SPN_TRANSFER_PQ, &rgb, SPN_EINVAL, "colour matrix 8"},
      {&narrow, 1, &bt2020, SPN_TRANSFER_HLG, &rgb, SPN_EINVAL, "at least 128 and 128 bytes (got 100 and 100)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = spn_cuda_hdr420_to_rgb(cases[i].src, cases[i].deep, cases[i].col, cases[i].transfer, cases[i].dst,
                                        NULL, &err);
    if (rc != cases[i].status || !strstr(err.msg, "hdr420_to_rgb") || !strstr(err.msg, cases[i].part))
      fail_msg("case %zu: expected status %d with \"%s\", got %d: %s", i, (int)cases[i].status, cases[i].part,
               (int)rc, err.msg);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hdr420_to_rgb_refuses_bad_arguments),
      cmocka_unit_test(rgb_to_yuv420_refuses_bad_arguments),
      cmocka_unit_test(colour_variants_refuse_unknown_matrices),
      cmocka_unit_test(yuv420_repack_refuses_bad_arguments),
      cmocka_unit_test(p016_to_yuv420_refuses_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
