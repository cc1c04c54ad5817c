/* test-media-frames.c — spn_media_cuda_from_item (stages/media/media-
 * cuda.c), what the decode stage runs on each picture NVDEC keeps on the
 * GPU, against its CPU twin composed step by step (suite gpu; exits 77
 * without a device; also built on the fake GPU of tests/gpu/host-emu, so it
 * runs in every CUDA build's unit suite).
 *
 * Random pictures in NVDEC's layouts — NV12, and P010/P016 (16-bit samples
 * in the same two planes) — with plane pitches wider than their rows (as
 * NVDEC's are), are converted to every format decode emits, at each
 * rotation, and compared with the CPU path written out:
 *   - 16-bit samples rounded to 8 bits ((v + 128) >> 8, saturated);
 *   - the 4:2:0 picture converted with spn_image_convert (rgb24/bgr24 from
 *     4:2:0: the twin of spn_cuda_yuv420_to_rgb; nv12/yuv420p: a repack),
 *     floats through spn_image_to_float of that rgb24/bgr24;
 *   - turned with spn_image_rotate.
 * nv12/yuv420p must be equal byte for byte (only bytes move); rgb24/bgr24
 * within 1 LSB with at least 99.9 % of the bytes exact, floats within 1.0
 * (test-cuda-image.c's tolerance for yuv420_to_rgb: a value within an ulp
 * of a rounding tie may round the other way). The scratch handed to
 * from_item is exactly spn_media_cuda_item_scratch_size bytes and the
 * destination starts as garbage, so a step that wrote out of its piece or
 * skipped a pixel shows.
 *
 * Pictures shown at another size (non-square pixels: 4:3 and 3:4) are
 * resampled after the conversion, bicubic, twin spn_image_resize; a 4:2:0
 * format refuses that.
 * HDR (PQ and HLG) pictures to RGB and float are tone-mapped instead; their
 * twin is the CPU decode's spn_tonemap_yuv420 (stages/media: chroma
 * interpolated as spn-image's, the samples to 16-bit R'G'B', the tone map),
 * then the same float and turn steps; same tolerance. 4:2:0 outputs of HDR pictures
 * are the signal as it is (the SDR path's bytes).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpu-skip.h"
#include "gpu-test.h"
#include "media-cuda.h"
#include "media-tonemap.h"
#include "spindle/image.h"

static uint8_t top8(uint16_t v) {
  unsigned r = ((unsigned)v + 128u) >> 8;
  return (uint8_t)(r > 255 ? 255 : r);
}

/* Random samples into `cols` x `rows` of one plane as NVDEC would hand it
 * over (pitch bytes a row; deep: 16-bit samples) and the same samples at
 * 8 bits into plane p of the CPU twin's nv12. */
static void fill_plane(uint8_t *dev_layout, size_t pitch, spn_image_t *nv12, int p, int32_t cols, int32_t rows,
                       int deep, uint32_t *seed) {
  for (int32_t y = 0; y < rows; y++)
    for (int32_t x = 0; x < cols; x++) {
      uint32_t v = rng_next(seed);
      if (deep)
        ((uint16_t *)(dev_layout + y * pitch))[x] = (uint16_t)v;
      else
        dev_layout[y * pitch + x] = (uint8_t)v;
      nv12->data[p][y * nv12->stride[p] + x] = deep ? top8((uint16_t)v) : (uint8_t)v;
    }
}

static int32_t mid_format(int32_t fmt) {
  return fmt == SPN_PIXFMT_RGBF32P ? SPN_PIXFMT_RGB24 : fmt == SPN_PIXFMT_BGRF32P ? SPN_PIXFMT_BGR24 : fmt;
}

/* The twin's last steps: mid (rgb24/bgr24 for a float fmt, else fmt;
 * consumed) -> resized to sw x sh (bicubic) -> fmt -> turned, as a tight
 * buffer. */
static void *twin_finish(spn_image_t *mid, int32_t fmt, int32_t rot, int32_t sw, int32_t sh) {
  if (sw != mid->width || sh != mid->height) {
    spn_image_t big = SPN_IMAGE_INIT;
    CK(spn_image_alloc(&big, sw, sh, mid->format, &e_));
    CK(spn_image_resize(mid, &big, SPN_INTERP_CUBIC, &e_));
    spn_image_release(mid);
    *mid = big;
  }
  int32_t w = mid->width, h = mid->height;
  bool flt = fmt == SPN_PIXFMT_RGBF32P || fmt == SPN_PIXFMT_BGRF32P;
  spn_image_t conv = SPN_IMAGE_INIT, out = SPN_IMAGE_INIT;
  if (flt) {
    CK(spn_image_alloc(&conv, w, h, fmt, &e_));
    CK(spn_image_to_float(mid, &conv, NULL, NULL, &e_));
    spn_image_release(mid);
  } else {
    conv = *mid;
  }
  bool q = rot == 90 || rot == 270;
  void *buf = malloc(spn_pixfmt_tight_size(fmt, w, h));
  assert_non_null(buf);
  CK(spn_image_wrap(&out, buf, q ? h : w, q ? w : h, fmt, &e_));
  CK(spn_image_rotate(&conv, &out, rot, &e_));
  spn_image_release(&conv);
  return buf;
}

/* The CPU twin: nv12 (8-bit, host) -> fmt at sw x sh -> turned, as a
 * tight buffer. */
static void *cpu_twin(const spn_image_t *nv12, int32_t fmt, int32_t rot, int32_t sw, int32_t sh) {
  spn_image_t mid = SPN_IMAGE_INIT;
  CK(spn_image_alloc(&mid, nv12->width, nv12->height, mid_format(fmt), &e_));
  CK(spn_image_convert(nv12, &mid, &e_));
  return twin_finish(&mid, fmt, rot, sw, sh);
}

/* The HDR twin: the picture's samples (host copies of NVDEC's planes,
 * NV12 or P016) tone-mapped by the CPU path's spn_tonemap_yuv420, then
 * -> sw x sh -> fmt -> turned. */
static void *hdr_twin(const uint8_t *py, size_t yp, const uint8_t *pc, size_t cp, int deep, int32_t w, int32_t h,
                      const spn_colour_t *col, int32_t transfer, int32_t fmt, int32_t rot, int32_t sw, int32_t sh) {
  spn_tonemap_yuv_t pic = {.width = w, .height = h, .plane = {py, pc, pc + (deep ? 2 : 1)},
                           .pitch = {(int64_t)yp, (int64_t)cp, (int64_t)cp}, .step = 2, .bits = deep ? 16 : 8};
  spn_tonemap_t *tm = NULL;
  spn_image_t mid = SPN_IMAGE_INIT;
  CK(spn_tonemap_new(transfer, &tm, &e_));
  CK(spn_image_alloc(&mid, w, h, mid_format(fmt), &e_));
  CK(spn_tonemap_yuv420(tm, &pic, col, &mid, &e_));
  spn_tonemap_free(tm);
  return twin_finish(&mid, fmt, rot, sw, sh);
}

static void compare(const void *cpu, const void *gpu, int32_t fmt, size_t n, const char *what) {
  if (fmt == SPN_PIXFMT_NV12 || fmt == SPN_PIXFMT_YUV420P) {
    for (size_t i = 0; i < n; i++)
      if (((const uint8_t *)cpu)[i] != ((const uint8_t *)gpu)[i])
        fail_msg("%s: byte %zu: cpu %d gpu %d", what, i, ((const uint8_t *)cpu)[i], ((const uint8_t *)gpu)[i]);
    return;
  }
  if (fmt == SPN_PIXFMT_RGBF32P || fmt == SPN_PIXFMT_BGRF32P) {
    for (size_t i = 0; i < n / 4; i++) {
      float a = ((const float *)cpu)[i], b = ((const float *)gpu)[i];
      if (!(fabsf(a - b) <= 1.0f))
        fail_msg("%s: value %zu: cpu %g gpu %g", what, i, a, b);
    }
    return;
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    int d = abs((int)((const uint8_t *)cpu)[i] - (int)((const uint8_t *)gpu)[i]);
    if (d > 1)
      fail_msg("%s: byte %zu: cpu %d gpu %d", what, i, ((const uint8_t *)cpu)[i], ((const uint8_t *)gpu)[i]);
    off += (size_t)d;
  }
  if (off * 1000 > n)
    fail_msg("%s: %zu of %zu bytes off by one", what, off, n);
}

static void from_item_matches_cpu_twin(void **state) {
  (void)state;
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24, SPN_PIXFMT_RGBF32P, SPN_PIXFMT_BGRF32P,
                          SPN_PIXFMT_NV12, SPN_PIXFMT_YUV420P};
  const int32_t sizes[][2] = {{64, 48}, {38, 22}, {37, 21}};
  const int32_t rots[] = {0, 90, 180, 270};
  const int32_t transfers[] = {0, SPN_TRANSFER_PQ, SPN_TRANSFER_HLG};
  uint32_t seed = 31337;
  int checked = 0;
  cudaStream_t s = NULL;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int deep = 0; deep < 2; deep++)
    for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
      int32_t w = sizes[z][0], h = sizes[z][1], cw = (w + 1) / 2, ch = (h + 1) / 2;
      /* The picture NVDEC would hand over: planes pitched 128 bytes wider
       * than their rows; deep: 16-bit samples, any value (P016). */
      size_t es = deep ? 2 : 1, yp = (size_t)w * es + 128, cp = (size_t)cw * 2 * es + 128;
      uint8_t *hy = calloc((size_t)h, yp), *hc = calloc((size_t)ch, cp);
      assert_non_null(hy);
      assert_non_null(hc);
      spn_image_t nv12 = SPN_IMAGE_INIT; /* its 8-bit samples, what the CPU twin starts from */
      CK(spn_image_alloc(&nv12, w, h, SPN_PIXFMT_NV12, &e_));
      fill_plane(hy, yp, &nv12, 0, w, h, deep, &seed);
      fill_plane(hc, cp, &nv12, 1, 2 * cw, ch, deep, &seed);
      void *dy = NULL, *dc = NULL;
      CU(cudaMalloc(&dy, (size_t)h * yp));
      CU(cudaMalloc(&dc, (size_t)ch * cp));
      /* on s: a synchronous copy from pageable memory may return before its
       * DMA lands, and s (non-blocking) does not wait for the legacy stream */
      CU(cudaMemcpyAsync(dy, hy, (size_t)h * yp, cudaMemcpyHostToDevice, s));
      CU(cudaMemcpyAsync(dc, hc, (size_t)ch * cp, cudaMemcpyHostToDevice, s));
      spn_image_t frame = nvdec_view(dy, yp, dc, cp, w, h);
      /* shown at: the stored size; 4:3 pixels (wider); 3:4 (taller) */
      const int32_t shows[][2] = {{w, h}, {2 * ((w * 4 + 3) / 6), h}, {w, 2 * ((h * 4 + 3) / 6)}};
      const size_t n_fmt = sizeof fmts / sizeof *fmts, n_tr = sizeof transfers / sizeof *transfers;
      /* every transfer (none, PQ, HLG) with every format and shape */
      for (size_t tfs = 0; tfs < n_tr * n_fmt * 3; tfs++)
        for (size_t r = 0; r < sizeof rots / sizeof *rots; r++) {
          int32_t fmt = fmts[tfs / 3 % n_fmt], rot = rots[r], tr = transfers[tfs / 3 / n_fmt];
          int32_t sw = shows[tfs % 3][0], sh = shows[tfs % 3][1];
          bool q = rot == 90 || rot == 270, yuv = fmt == SPN_PIXFMT_NV12 || fmt == SPN_PIXFMT_YUV420P;
          /* HDR video is BT.2020; full range on the odd size, to cover it */
          spn_colour_t col = tr ? (spn_colour_t){SPN_MATRIX_BT2020, w & 1} : (spn_colour_t)SPN_COLOUR_DEFAULT;
          spn_media_item_t it = {.kind = SPN_MEDIA_VIDEO, .image = frame, .deep = deep, .rotation = rot,
                                 .colour = col, .tone_map = tr, .show_w = sw, .show_h = sh};
          char what[160];
          snprintf(what, sizeof what, "%s%s %dx%d shown %dx%d -> %s turned %d", deep ? "p016" : "nv12",
                   tr == SPN_TRANSFER_PQ ? " PQ" : tr == SPN_TRANSFER_HLG ? " HLG" : "", (int)w, (int)h, (int)sw,
                   (int)sh, spn_pixfmt_name(fmt), (int)rot);
          size_t n = spn_pixfmt_tight_size(fmt, sw, sh), sn = spn_media_cuda_item_scratch_size(&it, fmt);
          void *ddst = NULL, *dscr = NULL;
          CU(cudaMalloc(&ddst, n));
          /* on s too: cudaMemset runs on the legacy stream, which s does
           * not wait for (it once landed over rows the conversion had
           * written: an H200 read 0xa5 from row 32 on) */
          CU(cudaMemsetAsync(ddst, 0xa5, n, s));
          if (sn)
            CU(cudaMalloc(&dscr, sn));
          spn_error_t err = SPN_ERROR_INIT;
          int32_t rc = spn_media_cuda_from_item(&it, fmt, ddst, dscr, s, &err);
          if (yuv && (sw != w || sh != h)) { /* decode never asks: 4:2:0 keeps the stored pixels */
            if (rc != SPN_EINVAL || !strstr(err.msg, "are not resampled"))
              fail_msg("%s: expected a refusal, got %d: %s", what, (int)rc, err.msg);
          } else if (q && yuv && ((w | h) & 1)) { /* as the CPU: an odd 4:2:0 picture is not turned by a quarter */
            if (rc != SPN_EINVAL || !strstr(err.msg, "even sizes"))
              fail_msg("%s: expected a refusal naming even sizes, got %d: %s", what, (int)rc, err.msg);
          } else {
            if (rc != SPN_OK)
              fail_msg("%s: %s", what, err.msg);
            CU(cudaStreamSynchronize(s));
            void *got = malloc(n), *want = tr && !yuv ? hdr_twin(hy, yp, hc, cp, deep, w, h, &col, tr, fmt, rot, sw, sh)
                                                      : cpu_twin(&nv12, fmt, rot, sw, sh);
            assert_non_null(got);
            CU(cudaMemcpy(got, ddst, n, cudaMemcpyDeviceToHost));
            compare(want, got, fmt, n, what);
            free(got);
            free(want);
            checked++;
          }
          CU(cudaFree(ddst));
          if (dscr)
            CU(cudaFree(dscr));
        }
      /* a scratch that is needed and missing is refused, not written through */
      spn_error_t err = SPN_ERROR_INIT;
      void *ddst = NULL;
      CU(cudaMalloc(&ddst, spn_pixfmt_tight_size(SPN_PIXFMT_RGB24, w, h)));
      spn_media_item_t turned = {.kind = SPN_MEDIA_VIDEO, .image = frame, .deep = deep, .rotation = 90,
                                 .colour = SPN_COLOUR_DEFAULT};
      assert_true(spn_media_cuda_item_scratch_size(&turned, SPN_PIXFMT_RGB24) > 0);
      assert_int_equal(spn_media_cuda_from_item(&turned, SPN_PIXFMT_RGB24, ddst, NULL, s, &err), SPN_EINVAL);
      assert_non_null(strstr(err.msg, "needs scratch memory"));
      CU(cudaFree(ddst));
      CU(cudaFree(dy));
      CU(cudaFree(dc));
      free(hy);
      free(hc);
      spn_image_release(&nv12);
    }
  CU(cudaStreamDestroy(s));
  /* per transfer and bit depth: square, every format but an odd 4:2:0
   * turned a quarter; resampled, the four RGB and float formats */
  assert_int_equal(checked, 3 * 2 * ((3 * 6 * 4 - 2 * 2) + 2 * 3 * 4 * 4));
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(from_item_matches_cpu_twin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
