/* test-media-gpu.c — decode with NVDEC and encode from device frames
 * (stages/media/media-cuda.c) against the CPU paths, on the sample clip
 * (suite gpu; exits 77 without a device).
 *
 * The device is opened as the runtime opens it (cudaSetDevice, a
 * non-blocking stream, the primary context made active with the default
 * flags), which is the situation in which FFmpeg 5.1 refuses
 * AV_CUDA_USE_PRIMARY_CONTEXT; spn_media_cuda_device_new must work there.
 *
 * Decode. NVDEC's H.264 output is bit-exact, so its NV12 holds the samples
 * the software decoder gives, and the conversions are the cuda/kernels twins
 * of spn_image_convert. Hence, frame by frame, with the same pts:
 *   - yuv420p and nv12 from the GPU equal the CPU decode's yuv420p (and its
 *     nv12 repack) byte for byte;
 *   - rgb24 equals spn_image_convert of the CPU's yuv420p within the
 *     tolerance of tests/gpu/test-cuda-image.c for yuv420_to_rgb (at most 1
 *     LSB, at least 99.9 % of the bytes exact);
 *   - the CPU decode's rgb24 is that twin's, byte for byte (decode converts
 *     8-bit 4:2:0 with spn_image_convert_colour, not swscale), so the GPU's
 *     rgb24 is within the same 1 LSB of what a CPU run decodes.
 *   - rgbf32p is rgb24 as floats: within 1.0 of spn_image_to_float of the
 *     CPU twin's rgb24.
 * If NVDEC cannot be used on this host (no libnvcuvid in the container: it
 * comes with the driver's "video" capability), the decode case is skipped
 * with that reason printed.
 *
 * Encode. The CPU decode's rgb24 frames are encoded twice with libx264 from
 * yuv420p: once converted on the GPU (uploaded, spn_media_cuda_rgb_to_
 * yuv420p_host into pinned memory), once with spn_image_convert on the CPU.
 * The yuv420p planes must be equal for every frame, and so the two files
 * byte for byte (x264 is deterministic for the same input and settings).
 * The encode stage's CPU path converts with swscale instead; the GPU's
 * planes are compared with swscale's: PSNR >= 50 dB (measured on the CPU
 * with both conversions over the sample: 63.65 dB, max difference 4).
 *
 * NVENC from device frames. spn_media_cuda_to_nv12 (what the encode stage
 * runs into NVENC's frame) equals its CPU twins on every format the stage
 * takes, at an even and an odd size (cropped to even, as the encoder
 * crops), into planes pitched wider than their rows: rgb24/bgr24 and
 * nv12/yuv420p byte for byte with spn_image_convert, f32 within 1 LSB
 * (spn_image_from_float's twin may round a .5 the other way). This runs on
 * any GPU. Then, where NVENC opens (not on the H100/H200, which have none:
 * there the case is skipped with FFmpeg's reason, which must name the
 * encoder), the sample's rgb24 frames are uploaded, converted into the
 * encoder's pool frames and encoded with h264_nvenc; the file holds as many
 * H.264 frames as went in and they are within 30 dB PSNR of what went in.
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
#include <unistd.h>
#include <cmocka.h>

#include <libswscale/swscale.h>

#include "gpu-skip.h"
#include "gpu-test.h"
#include "media-cuda.h"
#include "media-decode.h"
#include "media-encode.h"
#include "spindle/image.h"

static char sample[4096];

/* A CPU image in the tight layout (what the stages emit). */
static void *tight_copy(const spn_image_t *im) {
  size_t n = spn_pixfmt_tight_size(im->format, im->width, im->height);
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  spn_image_t t;
  CK(spn_image_wrap(&t, buf, im->width, im->height, im->format, &e_));
  CK(spn_image_copy(im, &t, &e_));
  return buf;
}

static cudaStream_t open_like_the_runtime(void) {
  cudaStream_t s = NULL;
  CU(cudaSetDevice(0));
  CU(cudaFree(NULL)); /* primary context active, default flags */
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

static spn_decoder_t *open_cpu(int32_t fmt) {
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  o.pixfmt = fmt;
  spn_decoder_t *d = NULL;
  CK(spn_decoder_new(sample, &o, &d, &e_));
  return d;
}

/* Device scratch for spn_media_cuda_from_item of `it` in `fmt`: allocated
 * for the first item, which every later one must fit. */
static void item_scratch(const spn_media_item_t *it, int32_t fmt, void **scratch, size_t *sn) {
  if (!*scratch && (*sn = spn_media_cuda_item_scratch_size(it, fmt)))
    CU(cudaMalloc(scratch, *sn));
  assert_true(spn_media_cuda_item_scratch_size(it, fmt) <= *sn);
}

static void gpu_decode_matches_cpu(void **state) {
  (void)state;
  cudaStream_t s = open_like_the_runtime();
  void *hw = NULL;
  CK(spn_media_cuda_device_new(s, &hw, &e_));
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  o.hwaccel = SPN_HWACCEL_CUDA;
  o.hw_device = hw;
  o.device_frames = 1;
  spn_decoder_t *g = NULL, *cy = open_cpu(SPN_PIXFMT_YUV420P), *cr = open_cpu(SPN_PIXFMT_RGB24);
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_decoder_new(sample, &o, &g, &err) != SPN_OK) {
    printf("# SKIP NVDEC is not usable here: %s\n", err.msg);
    spn_decoder_free(cy);
    spn_decoder_free(cr);
    spn_media_cuda_device_free(&hw);
    skip();
  }
  const int32_t w = spn_decoder_info(g)->width, h = spn_decoder_info(g)->height;
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_YUV420P, SPN_PIXFMT_NV12, SPN_PIXFMT_RGBF32P};
  void *dev = NULL, *scratch = NULL;
  size_t sn = 0;
  CU(cudaMalloc(&dev, spn_pixfmt_tight_size(SPN_PIXFMT_RGBF32P, w, h)));
  uint8_t *got = malloc(spn_pixfmt_tight_size(SPN_PIXFMT_RGBF32P, w, h));
  assert_non_null(got);
  size_t frames = 0, off_by_one = 0, total = 0;
  bool no_nvdec = false;
  for (;;) {
    spn_media_item_t gi, yi, ri;
    spn_error_t e1 = SPN_ERROR_INIT, e2 = SPN_ERROR_INIT, e3 = SPN_ERROR_INIT;
    int32_t rg = spn_decoder_next(g, &gi, &e1), ry = spn_decoder_next(cy, &yi, &e2), rr = spn_decoder_next(cr, &ri, &e3);
    if (rg == SPN_EDEVICE && frames == 0 && strstr(e1.msg, "fell back to software")) {
      printf("# SKIP NVDEC is not usable here: %s\n", e1.msg);
      no_nvdec = true;
      if (ry == SPN_OK)
        spn_media_item_release(&yi);
      if (rr == SPN_OK)
        spn_media_item_release(&ri);
      break;
    }
    if (rg != SPN_OK || ry != SPN_OK || rr != SPN_OK) {
      if (rg != ry || rg != rr || rg != SPN_EOS)
        fail_msg("frame %zu: gpu %d (%s), cpu yuv420p %d (%s), cpu rgb24 %d (%s)", frames, (int)rg, e1.msg, (int)ry,
                 e2.msg, (int)rr, e3.msg);
      break;
    }
    if (!gi.hw_frame)
      fail_msg("frame %zu came in host memory: %s", frames, spn_decoder_info(g)->host_frames_why);
    assert_int_equal(gi.image.format, SPN_PIXFMT_NV12);
    assert_int_equal(gi.pts, yi.pts);
    assert_int_equal(gi.pts, ri.pts);
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
      size_t n = spn_pixfmt_tight_size(fmts[f], w, h);
      item_scratch(&gi, SPN_PIXFMT_RGBF32P, &scratch, &sn); /* (the most any format takes) */
      CK(spn_media_cuda_from_item(&gi, fmts[f], dev, scratch, s, &e_));
      CU(cudaMemcpyAsync(got, dev, n, cudaMemcpyDeviceToHost, s));
      CU(cudaStreamSynchronize(s));
      spn_image_t ref = SPN_IMAGE_INIT;
      CK(spn_image_alloc(&ref, w, h, fmts[f] == SPN_PIXFMT_RGBF32P ? SPN_PIXFMT_RGB24 : fmts[f], &e_));
      CK(spn_image_convert(&yi.image, &ref, &e_));
      if (fmts[f] == SPN_PIXFMT_RGBF32P) {
        spn_image_t fl = SPN_IMAGE_INIT;
        CK(spn_image_alloc(&fl, w, h, SPN_PIXFMT_RGBF32P, &e_));
        CK(spn_image_to_float(&ref, &fl, NULL, NULL, &e_));
        float *rf = tight_copy(&fl);
        for (size_t i = 0; i < n / 4; i++)
          if (fabsf(rf[i] - ((const float *)got)[i]) > 1.0f)
            fail_msg("frame %zu rgbf32p value %zu: cpu %g gpu %g", frames, i, rf[i], ((const float *)got)[i]);
        free(rf);
        spn_image_release(&fl);
      } else {
        uint8_t *rb = tight_copy(&ref);
        for (size_t i = 0; i < n; i++) {
          int d = abs((int)rb[i] - (int)got[i]);
          if (fmts[f] != SPN_PIXFMT_RGB24 && d)
            fail_msg("frame %zu %s byte %zu: cpu %d gpu %d (NVDEC is bit-exact for H.264)", frames,
                     spn_pixfmt_name(fmts[f]), i, rb[i], got[i]);
          if (d > 1)
            fail_msg("frame %zu rgb24 byte %zu: cpu twin %d gpu %d", frames, i, rb[i], got[i]);
          if (fmts[f] == SPN_PIXFMT_RGB24) {
            off_by_one += (size_t)d;
            total++;
          }
        }
        free(rb);
      }
      if (fmts[f] == SPN_PIXFMT_RGB24) {
        uint8_t *cpu = tight_copy(&ri.image), *twin = tight_copy(&ref);
        for (size_t i = 0; i < n; i++)
          if (cpu[i] != twin[i])
            fail_msg("frame %zu rgb24 byte %zu: the CPU decode %d, spn_image_convert %d", frames, i, cpu[i], twin[i]);
        free(cpu);
        free(twin);
      }
      spn_image_release(&ref);
    }
    spn_media_item_release(&gi);
    spn_media_item_release(&yi);
    spn_media_item_release(&ri);
    frames++;
  }
  spn_decoder_free(g);
  spn_decoder_free(cy);
  spn_decoder_free(cr);
  CU(cudaFree(dev));
  CU(cudaFree(scratch));
  free(got);
  spn_media_cuda_device_free(&hw);
  CU(cudaStreamDestroy(s));
  if (no_nvdec)
    skip();
  assert_true(frames >= 100);
  printf("# %zu frames; rgb24 vs the CPU decode (the twin): %zu of %zu bytes off by one\n", frames, off_by_one,
         total);
  if (off_by_one * 1000 > total)
    fail_msg("rgb24: %zu of %zu bytes off by one (more than 0.1%%)", off_by_one, total);
}

/* A phone video (rotation metadata) and a 10-bit HEVC one through NVDEC
 * with the turn left to the GPU (device_rotate), as the decode stage runs
 * them: every frame stays on the device (deep for the 10-bit one: P010)
 * and spn_media_cuda_from_item makes the upright yuv420p the CPU decode
 * gives. The turn moves bytes: equal to the CPU's for the H.264 clip.
 * 10-bit: the GPU rounds each sample to 8 bits, swscale (the CPU path)
 * dithers, so samples differ by at most 1 level (measured on the CPU with
 * both roundings over this clip: 24 % of the samples differ, none by more
 * than 1); the bound is 1 level, with at least half the samples equal. */
static void gpu_decode_turned_and_deep_frames(void **state) {
  (void)state;
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  const char *clips[] = {"talking-head-rot90.mp4", "talking-head-hevc10.mp4"};
  cudaStream_t s = open_like_the_runtime();
  void *hw = NULL;
  CK(spn_media_cuda_device_new(s, &hw, &e_));
  for (int c = 0; c < 2; c++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/samples/media/%s", root ? root : ".", clips[c]);
    spn_decode_opts_t o = SPN_DECODE_OPTS_INIT, co = SPN_DECODE_OPTS_INIT;
    o.want_audio = co.want_audio = 0;
    o.hwaccel = SPN_HWACCEL_CUDA;
    o.hw_device = hw;
    o.device_frames = 1;
    o.device_rotate = 1;
    co.pixfmt = SPN_PIXFMT_YUV420P;
    spn_decoder_t *g = NULL, *cd = NULL;
    spn_error_t err = SPN_ERROR_INIT;
    CK(spn_decoder_new(path, &co, &cd, &e_));
    if (spn_decoder_new(path, &o, &g, &err) != SPN_OK) {
      printf("# SKIP %s: NVDEC is not usable here: %s\n", clips[c], err.msg);
      spn_decoder_free(cd);
      continue;
    }
    const spn_decode_info_t *in = spn_decoder_info(g);
    assert_int_equal(in->rotation, c == 0 ? 270 : 0);
    int32_t w = in->width, h = in->height; /* upright */
    size_t n = spn_pixfmt_tight_size(SPN_PIXFMT_YUV420P, w, h), frames = 0, diff = 0, total = 0;
    void *dev = NULL, *scratch = NULL;
    uint8_t *got = malloc(n);
    assert_non_null(got);
    CU(cudaMalloc(&dev, n));
    size_t sn = 0;
    spn_media_item_t gi, ci;
    bool skipped = false;
    for (;;) {
      spn_error_t e1 = SPN_ERROR_INIT, e2 = SPN_ERROR_INIT;
      int32_t rg = spn_decoder_next(g, &gi, &e1), rc = spn_decoder_next(cd, &ci, &e2);
      if (rg == SPN_EDEVICE && frames == 0 && strstr(e1.msg, "fell back to software")) {
        printf("# SKIP %s: NVDEC does not decode it here: %s\n", clips[c], e1.msg);
        if (rc == SPN_OK)
          spn_media_item_release(&ci);
        skipped = true;
        break;
      }
      if (rg != SPN_OK || rc != SPN_OK) {
        if (rg != rc || rg != SPN_EOS)
          fail_msg("%s frame %zu: gpu %d (%s), cpu %d (%s)", clips[c], frames, (int)rg, e1.msg, (int)rc, e2.msg);
        break;
      }
      if (!gi.hw_frame)
        fail_msg("%s frame %zu came in host memory: %s", clips[c], frames, in->host_frames_why);
      assert_int_equal(gi.deep, c == 1);
      assert_int_equal(gi.rotation, c == 0 ? 270 : 0);
      assert_int_equal(gi.pts, ci.pts);
      item_scratch(&gi, SPN_PIXFMT_YUV420P, &scratch, &sn);
      CK(spn_media_cuda_from_item(&gi, SPN_PIXFMT_YUV420P, dev, scratch, s, &e_));
      CU(cudaMemcpyAsync(got, dev, n, cudaMemcpyDeviceToHost, s));
      CU(cudaStreamSynchronize(s));
      uint8_t *want = tight_copy(&ci.image);
      for (size_t i = 0; i < n; i++) {
        int d = abs((int)want[i] - (int)got[i]);
        if (d > (c == 1 ? 1 : 0))
          fail_msg("%s frame %zu byte %zu: cpu %d gpu %d", clips[c], frames, i, want[i], got[i]);
        diff += d != 0;
        total++;
      }
      free(want);
      spn_media_item_release(&gi);
      spn_media_item_release(&ci);
      frames++;
    }
    spn_decoder_free(g);
    spn_decoder_free(cd);
    CU(cudaFree(dev));
    CU(cudaFree(scratch));
    free(got);
    if (skipped)
      continue;
    printf("# %s: %zu frames %dx%d upright; %zu of %zu samples differ from the CPU decode's\n", clips[c], frames,
           (int)w, (int)h, diff, total);
    assert_true(frames >= 100);
    if (diff * 2 > total)
      fail_msg("%s: %zu of %zu samples differ by 1 (more than half)", clips[c], diff, total);
  }
  spn_media_cuda_device_free(&hw);
  CU(cudaStreamDestroy(s));
}

/* Clips the CPU decode path changes beyond converting, decoded as rgb24 on
 * the GPU — NVDEC's picture through spn_media_cuda_from_item (the decode
 * stage's path) — against the CPU decode:
 *   - HDR: an HLG clip (10-bit HEVC, BT.2020) is tone-mapped to SDR. Both
 *     paths run the same arithmetic (the CPU's spn_tonemap_yuv420 and the
 *     kernel share tonemap.h's helpers: chroma interpolated alike, R'G'B'
 *     rounded to 16 bits, the tone map at the CPU tables' sample points), so
 *     only the last bit of powf/expf may differ on a real GPU: at most 2
 *     levels, PSNR >= 50 dB (on the fake GPU the frames are equal). The clip
 *     is the SDR sample tagged HLG, so its colours read as BT.2020 are
 *     saturated and many fall outside BT.709: the gamut clip turns any small
 *     difference of chroma into a large one (when the CPU read chroma with
 *     swscale's interpolation and the GPU repeated each sample, up to 134
 *     levels, 39.08 dB).
 *   - Non-square pixels: a 320x320 clip of 4:3 pixels is shown at 426x320.
 *     Both paths convert at the stored size, then resample bicubically
 *     (spn_image_resize SPN_INTERP_CUBIC and its twin spn_cuda_resize_cubic):
 *     within 1 level, PSNR >= 50 dB (equal on the fake GPU; 42.07 dB when
 *     the CPU resampled in swscale's conversion and the GPU bilinearly).
 *     Drawn without resampling, the frames would not even have the CPU's
 *     size.
 * Where NVDEC cannot be used (no libnvcuvid; the fake GPU), decode emulates
 * its hand-over (emu_upload: the software decoder's pictures in NVDEC's
 * layouts, on the device; H.264 and HEVC decoding is bit-exact, so these
 * are NVDEC's samples), and the conversions still run on the GPU. */
/* A decoder of `path` whose RGB frames stay on the device: NVDEC's when
 * *nvdec (and it opens), else NVDEC's hand-over emulated (*nvdec false). */
static spn_decoder_t *open_device_frames(const char *path, void *hw, bool *nvdec) {
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  o.pixfmt = SPN_PIXFMT_RGB24;
  o.device_frames = 1;
  spn_decoder_t *g = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (*nvdec) {
    o.hwaccel = SPN_HWACCEL_CUDA;
    o.hw_device = hw;
    if (spn_decoder_new(path, &o, &g, &err) == SPN_OK)
      return g;
    printf("# %s: NVDEC is not usable here (%s): its hand-over emulated\n", path, err.msg);
  }
  *nvdec = false;
  o.hwaccel = SPN_HWACCEL_NONE;
  o.hw_device = NULL;
  o.emu_upload = spn_media_cuda_emu_upload;
  o.emu_free = spn_media_cuda_emu_free;
  CK(spn_decoder_new(path, &o, &g, &e_));
  return g;
}

static void gpu_decode_clips_like_cpu(void **state) {
  (void)state;
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  const struct {
    const char *file;
    double bound;
    int max_diff;
  } clips[] = {{"talking-head-hlg.mp4", 50.0, 2}, {"talking-head-wide.mp4", 50.0, 1}};
  cudaStream_t s = open_like_the_runtime();
  void *hw = NULL;
  spn_error_t herr = SPN_ERROR_INIT;
  if (spn_media_cuda_device_new(s, &hw, &herr) != SPN_OK)
    printf("# NVDEC is not usable here (%s): its hand-over emulated\n", herr.msg);
  for (size_t c = 0; c < sizeof clips / sizeof *clips; c++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/samples/media/%s", root ? root : ".", clips[c].file);
    spn_decode_opts_t co = SPN_DECODE_OPTS_INIT;
    co.want_audio = 0;
    co.pixfmt = SPN_PIXFMT_RGB24;
    spn_decoder_t *cd = NULL;
    CK(spn_decoder_new(path, &co, &cd, &e_));
    const spn_decode_info_t *ci = spn_decoder_info(cd);
    bool hdr = c == 0, nvdec = hw != NULL;
    assert_int_equal(ci->tone_mapped, hdr);
    assert_int_equal(ci->transfer, hdr ? SPN_TRANSFER_HLG : 2);
    assert_int_equal(ci->sar_num * 3, hdr ? ci->sar_den * 3 : ci->sar_den * 4);
    int32_t w = ci->width, h = ci->height; /* shown: what both paths emit */
    assert_int_equal(w, hdr ? 320 : 426);
    spn_decoder_t *g = open_device_frames(path, hw, &nvdec);
    size_t n = spn_pixfmt_tight_size(SPN_PIXFMT_RGB24, w, h), sn = 0;
    uint8_t *got = malloc(n);
    void *dev = NULL, *scratch = NULL;
    assert_non_null(got);
    CU(cudaMalloc(&dev, n));
    double se = 0;
    int maxd = 0;
    size_t frames = 0;
    for (;;) {
      spn_media_item_t ri, gi;
      spn_error_t e1 = SPN_ERROR_INIT;
      int32_t rg = spn_decoder_next(g, &gi, &e1);
      if (rg == SPN_EDEVICE && frames == 0 && nvdec && strstr(e1.msg, "fell back to software")) {
        printf("# %s: NVDEC does not decode it here (%s): its hand-over emulated\n", clips[c].file, e1.msg);
        spn_decoder_free(g);
        nvdec = false;
        g = open_device_frames(path, hw, &nvdec);
        continue;
      }
      if (rg == SPN_EOS) { /* ... where the CPU decode ends too */
        spn_error_t e2 = SPN_ERROR_INIT;
        assert_int_equal(spn_decoder_next(cd, &ri, &e2), SPN_EOS);
        break;
      }
      if (rg != SPN_OK)
        fail_msg("%s: frame %zu on the device: %s", clips[c].file, frames, e1.msg);
      if (!gi.hw_frame)
        fail_msg("%s frame %zu came in host memory: %s", clips[c].file, frames, spn_decoder_info(g)->host_frames_why);
      assert_int_equal(gi.tone_map, hdr ? SPN_TRANSFER_HLG : 0);
      assert_int_equal(gi.deep, hdr);
      assert_int_equal(gi.show_w, w);
      assert_int_equal(gi.show_h, h);
      item_scratch(&gi, SPN_PIXFMT_RGB24, &scratch, &sn);
      CK(spn_media_cuda_from_item(&gi, SPN_PIXFMT_RGB24, dev, scratch, s, &e_));
      CU(cudaMemcpyAsync(got, dev, n, cudaMemcpyDeviceToHost, s));
      CU(cudaStreamSynchronize(s));
      spn_media_item_release(&gi);
      CK(spn_decoder_next(cd, &ri, &e_));
      assert_int_equal(ri.image.width, w);
      uint8_t *want = tight_copy(&ri.image);
      for (size_t i = 0; i < n; i++) {
        int d = abs((int)want[i] - (int)got[i]);
        se += (double)d * d;
        maxd = d > maxd ? d : maxd;
      }
      free(want);
      spn_media_item_release(&ri);
      frames++;
    }
    double psnr = 10.0 * log10(255.0 * 255.0 / (se / ((double)n * (double)frames)));
    printf("# %s: shown %dx%d, %zu frames on the GPU (%s): vs the CPU decode PSNR %.2f dB, max difference %d\n",
           clips[c].file, (int)w, (int)h, frames, nvdec ? "NVDEC" : "NVDEC's hand-over emulated", psnr, maxd);
    spn_decoder_free(cd);
    spn_decoder_free(g);
    CU(cudaFree(dev));
    if (scratch)
      CU(cudaFree(scratch));
    free(got);
    assert_int_equal(frames, 100);
    if (psnr < clips[c].bound || maxd > clips[c].max_diff)
      fail_msg("%s: rgb24 on the GPU vs the CPU decode's: PSNR %.2f dB (want >= %.0f), max difference %d (want <= %d)",
               clips[c].file, psnr, clips[c].bound, maxd, clips[c].max_diff);
  }
  spn_media_cuda_device_free(&hw);
  CU(cudaStreamDestroy(s));
}

/* The decoder's next item; false at the end of the stream, a failed test on
 * an error (`what` names the input). */
static bool next_item(spn_decoder_t *d, spn_media_item_t *it, const char *what) {
  spn_error_t e = SPN_ERROR_INIT;
  int32_t rc = spn_decoder_next(d, it, &e);
  if (rc == SPN_EOS)
    return false;
  if (rc)
    fail_msg("decoding %s: %s", what, e.msg);
  return true;
}

static void read_file(const char *path, uint8_t **data, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f)
    fail_msg("%s: cannot open", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc((size_t)n + 1);
  assert_non_null(*data);
  *size = fread(*data, 1, (size_t)n, f);
  fclose(f);
}

static void gpu_encode_matches_cpu_twin(void **state) {
  (void)state;
  cudaStream_t s = open_like_the_runtime();
  char dir[] = "/tmp/spn-media-gpu-XXXXXX", pa[4200], pb[4200];
  assert_non_null(mkdtemp(dir));
  snprintf(pa, sizeof pa, "%s/gpu.mp4", dir);
  snprintf(pb, sizeof pb, "%s/cpu.mp4", dir);
  spn_decoder_t *d = open_cpu(SPN_PIXFMT_RGB24);
  const int32_t w = spn_decoder_info(d)->width, h = spn_decoder_info(d)->height;
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.preset = "ultrafast";
  spn_encoder_t *ea = NULL, *eb = NULL;
  CK(spn_encoder_new(pa, w, h, SPN_PIXFMT_YUV420P, &eo, &ea, &e_));
  CK(spn_encoder_new(pb, w, h, SPN_PIXFMT_YUV420P, &eo, &eb, &e_));
  size_t n420 = spn_pixfmt_tight_size(SPN_PIXFMT_YUV420P, w, h);
  void *rgb_dev = NULL, *yuv_dev = NULL, *pinned = NULL;
  CU(cudaMalloc(&rgb_dev, spn_pixfmt_tight_size(SPN_PIXFMT_RGB24, w, h)));
  CU(cudaMalloc(&yuv_dev, n420));
  CU(cudaMallocHost(&pinned, n420));
  uint8_t *cpu = malloc(n420), *sws_out = malloc(n420);
  assert_true(cpu && sws_out);
  struct SwsContext *sws = NULL;
  double se = 0;
  size_t n_cmp = 0, frames = 0;
  spn_media_item_t it;
  while (next_item(d, &it, "the sample")) {
    uint8_t *rgb = tight_copy(&it.image);
    CU(cudaMemcpyAsync(rgb_dev, rgb, spn_pixfmt_tight_size(SPN_PIXFMT_RGB24, w, h), cudaMemcpyHostToDevice, s));
    CK(spn_media_cuda_rgb_to_yuv420p_host(rgb_dev, SPN_PIXFMT_RGB24, w, h, NULL, yuv_dev, pinned, s, &e_));
    CK(spn_media_cuda_sync(s, "test", &e_));
    spn_image_t yuv_gpu, yuv_cpu, yuv_sws;
    CK(spn_image_wrap(&yuv_gpu, pinned, w, h, SPN_PIXFMT_YUV420P, &e_));
    CK(spn_image_wrap(&yuv_cpu, cpu, w, h, SPN_PIXFMT_YUV420P, &e_));
    CK(spn_image_wrap(&yuv_sws, sws_out, w, h, SPN_PIXFMT_YUV420P, &e_));
    CK(spn_image_convert(&it.image, &yuv_cpu, &e_));
    if (memcmp(pinned, cpu, n420) != 0)
      fail_msg("frame %zu: the GPU's yuv420p differs from spn_image_convert's", frames);
    /* the encode stage's CPU path: swscale, as media-encode.c calls it */
    sws = sws_getCachedContext(sws, w, h, AV_PIX_FMT_RGB24, w, h, AV_PIX_FMT_YUV420P,
                               SWS_BILINEAR | SWS_ACCURATE_RND, NULL, NULL, NULL);
    assert_non_null(sws);
    const uint8_t *sp[4] = {it.image.data[0], NULL, NULL, NULL};
    int sl[4] = {(int)it.image.stride[0], 0, 0, 0};
    uint8_t *dp[4] = {yuv_sws.data[0], yuv_sws.data[1], yuv_sws.data[2], NULL};
    int dl[4] = {(int)yuv_sws.stride[0], (int)yuv_sws.stride[1], (int)yuv_sws.stride[2], 0};
    sws_scale(sws, sp, sl, 0, h, dp, dl);
    for (size_t i = 0; i < n420; i++) {
      double df = (double)sws_out[i] - (double)((const uint8_t *)pinned)[i];
      se += df * df;
    }
    n_cmp += n420;
    CK(spn_encoder_write_video(ea, &yuv_gpu, it.pts, it.tb_num, it.tb_den, &e_));
    CK(spn_encoder_write_video(eb, &yuv_cpu, it.pts, it.tb_num, it.tb_den, &e_));
    free(rgb);
    spn_media_item_release(&it);
    frames++;
  }
  CK(spn_encoder_finish(ea, &e_));
  CK(spn_encoder_finish(eb, &e_));
  spn_encoder_free(ea);
  spn_encoder_free(eb);
  spn_decoder_free(d);
  sws_freeContext(sws);
  CU(cudaFree(rgb_dev));
  CU(cudaFree(yuv_dev));
  CU(cudaFreeHost(pinned));
  CU(cudaStreamDestroy(s));
  free(cpu);
  free(sws_out);
  uint8_t *fa, *fb;
  size_t na, nb;
  read_file(pa, &fa, &na);
  read_file(pb, &fb, &nb);
  double psnr = 10.0 * log10(255.0 * 255.0 / (se / (double)n_cmp));
  printf("# %zu frames; files %zu and %zu bytes; GPU yuv420p vs swscale's: PSNR %.2f dB\n", frames, na, nb, psnr);
  assert_true(frames >= 100);
  if (na != nb || memcmp(fa, fb, na) != 0)
    fail_msg("%s and %s differ although every frame's yuv420p was equal", pa, pb);
  if (psnr < 50.0)
    fail_msg("GPU yuv420p vs swscale's: PSNR %.2f dB < 50 dB", psnr);
  free(fa);
  free(fb);
  unlink(pa);
  unlink(pb);
  rmdir(dir);
}

/* Pitched NV12 planes in device memory (one allocation, chroma after luma). */
static spn_image_t device_nv12(int32_t w, int32_t h, uint8_t **base) {
  size_t pitch = (size_t)w + 96;
  CU(cudaMalloc((void **)base, pitch * (size_t)(h + (h + 1) / 2)));
  spn_image_t im = {.width = w, .height = h, .format = SPN_PIXFMT_NV12, .nplanes = 2};
  im.data[0] = *base;
  im.data[1] = *base + pitch * (size_t)h;
  im.stride[0] = im.stride[1] = (int64_t)pitch;
  return im;
}

static void gpu_to_nv12_matches_cpu_twins(void **state) {
  (void)state;
  cudaStream_t s = open_like_the_runtime();
  const int32_t sizes[][2] = {{64, 48}, {65, 47}};
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24, SPN_PIXFMT_RGBF32P,
                          SPN_PIXFMT_BGRF32P, SPN_PIXFMT_YUV420P, SPN_PIXFMT_NV12};
  uint32_t seed = 1400;
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
    for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++) {
      const int32_t w = sizes[si][0], h = sizes[si][1], ew = w & ~1, eh = h & ~1, fmt = fmts[fi];
      const bool fl = fmt == SPN_PIXFMT_RGBF32P || fmt == SPN_PIXFMT_BGRF32P;
      /* floats a little outside [0, 255]: the u8 step saturates */
      spn_image_t src = host_image(w, h, fmt, seed++, -10.0f, 265.0f);
      uint8_t *t = tight_copy(&src);
      void *dsrc = NULL, *scratch = NULL;
      CU(cudaMalloc(&dsrc, spn_pixfmt_tight_size(fmt, w, h)));
      /* on s: a synchronous copy from pageable memory may return before its DMA
       * lands, and s (non-blocking) does not wait for the legacy stream */
      CU(cudaMemcpyAsync(dsrc, t, spn_pixfmt_tight_size(fmt, w, h), cudaMemcpyHostToDevice, s));
      size_t sn = spn_media_cuda_nv12_scratch_size(fmt, w, h);
      assert_true(fl ? sn >= (size_t)ew * (size_t)eh * 3 : sn == 0);
      if (sn)
        CU(cudaMalloc(&scratch, sn));
      uint8_t *base = NULL;
      spn_image_t planes = device_nv12(ew, eh, &base);
      CK(spn_media_cuda_to_nv12(dsrc, fmt, w, h, NULL, &planes, scratch, s, &e_));
      CU(cudaStreamSynchronize(s));
      /* the CPU twin on the same crop: a view of the top-left ew x eh */
      spn_image_t view = src, ref = SPN_IMAGE_INIT, got = SPN_IMAGE_INIT, mid = SPN_IMAGE_INIT;
      view.owned = NULL;
      view.width = ew;
      view.height = eh;
      CK(spn_image_alloc(&ref, ew, eh, SPN_PIXFMT_NV12, &e_));
      CK(spn_image_alloc(&got, ew, eh, SPN_PIXFMT_NV12, &e_));
      if (fl) {
        CK(spn_image_alloc(&mid, ew, eh, fmt == SPN_PIXFMT_RGBF32P ? SPN_PIXFMT_RGB24 : SPN_PIXFMT_BGR24, &e_));
        CK(spn_image_from_float(&view, &mid, NULL, NULL, &e_));
        CK(spn_image_convert(&mid, &ref, &e_));
      } else {
        CK(spn_image_convert(&view, &ref, &e_));
      }
      from_device(&planes, &got);
      size_t total = 0, off = 0;
      for (int p = 0; p < 2; p++)
        for (int32_t y = 0; y < plane_rows(&ref, p); y++)
          for (size_t i = 0; i < row_bytes(&ref, p); i++) {
            int a = ref.data[p][y * ref.stride[p] + (int64_t)i], b = got.data[p][y * got.stride[p] + (int64_t)i];
            int d = abs(a - b);
            if (d > (fl ? 1 : 0))
              fail_msg("%dx%d %s -> nv12 plane %d row %d byte %zu: cpu %d gpu %d", (int)w, (int)h,
                       spn_pixfmt_name(fmt), p, (int)y, i, a, b);
            off += (size_t)d;
            total++;
          }
      if (off * 1000 > total)
        fail_msg("%dx%d %s -> nv12: %zu of %zu bytes off by one", (int)w, (int)h, spn_pixfmt_name(fmt), off, total);
      spn_image_release(&src);
      spn_image_release(&ref);
      spn_image_release(&got);
      spn_image_release(&mid);
      free(t);
      CU(cudaFree(dsrc));
      CU(cudaFree(scratch));
      CU(cudaFree(base));
    }
  /* a frame larger than the planes is fine (cropped); smaller is refused */
  uint8_t *base = NULL;
  spn_image_t planes = device_nv12(64, 48, &base);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_media_cuda_to_nv12(base, SPN_PIXFMT_RGB24, 62, 48, NULL, &planes, NULL, s, &err), SPN_EINVAL);
  CU(cudaFree(base));
  CU(cudaStreamDestroy(s));
}

/* PSNR of two equal-sized byte arrays (inf as 999). */
static double psnr_u8(const uint8_t *a, const uint8_t *b, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    se += d * d;
  }
  return se == 0 ? 999.0 : 10.0 * log10(255.0 * 255.0 * (double)n / se);
}

static void nvenc_encodes_device_frames(void **state) {
  (void)state;
  cudaStream_t s = open_like_the_runtime();
  void *hw = NULL;
  CK(spn_media_cuda_device_new(s, &hw, &e_));
  char dir[] = "/tmp/spn-nvenc-XXXXXX", path[4200];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/nvenc.mp4", dir);
  spn_decoder_t *d = open_cpu(SPN_PIXFMT_RGB24);
  const int32_t w = spn_decoder_info(d)->width, h = spn_decoder_info(d)->height;
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.codec = "h264_nvenc";
  eo.hw_device = hw;
  spn_encoder_t *enc = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_encoder_new(path, w, h, SPN_PIXFMT_NV12, &eo, &enc, &err) != SPN_OK) {
    printf("# SKIP NVENC cannot encode from device frames here: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "h264_nvenc"));
    assert_int_equal(access(path, F_OK), -1); /* nothing left at the path */
    spn_decoder_free(d);
    spn_media_cuda_device_free(&hw);
    CU(cudaStreamDestroy(s));
    rmdir(dir);
    skip();
  }
  spn_media_cuda_device_free(&hw); /* the encoder keeps its own reference */
  assert_string_equal(spn_encoder_codec_name(enc), "h264_nvenc");
  const int32_t ew = w & ~1, eh = h & ~1;
  const size_t n420 = spn_pixfmt_tight_size(SPN_PIXFMT_YUV420P, ew, eh);
  uint8_t *refs = NULL; /* what went in, as yuv420p, frame after frame */
  size_t frames = 0;
  void *rgb_dev = NULL;
  CU(cudaMalloc(&rgb_dev, spn_pixfmt_tight_size(SPN_PIXFMT_RGB24, w, h)));
  spn_media_item_t it;
  while (next_item(d, &it, "the sample")) {
    if (frames == 0) { /* host pictures are refused by an encoder opened for device frames */
      spn_error_t e2 = SPN_ERROR_INIT;
      assert_int_equal(spn_encoder_write_video(enc, &it.image, it.pts, it.tb_num, it.tb_den, &e2), SPN_ESTATE);
    }
    uint8_t *rgb = tight_copy(&it.image);
    CU(cudaMemcpyAsync(rgb_dev, rgb, spn_pixfmt_tight_size(SPN_PIXFMT_RGB24, w, h), cudaMemcpyHostToDevice, s));
    spn_image_t planes;
    CK(spn_encoder_device_frame(enc, &planes, &e_));
    assert_int_equal(planes.width, ew);
    assert_int_equal(planes.height, eh);
    CK(spn_media_cuda_to_nv12(rgb_dev, SPN_PIXFMT_RGB24, w, h, NULL, &planes, NULL, s, &e_));
    CU(cudaStreamSynchronize(s));
    CK(spn_encoder_send_device_frame(enc, it.pts, it.tb_num, it.tb_den, &e_));
    uint8_t *grown = realloc(refs, (frames + 1) * n420);
    assert_non_null(grown);
    refs = grown;
    spn_image_t view = it.image, ref;
    view.owned = NULL;
    view.width = ew;
    view.height = eh;
    CK(spn_image_wrap(&ref, refs + frames * n420, ew, eh, SPN_PIXFMT_YUV420P, &e_));
    CK(spn_image_convert(&view, &ref, &e_));
    free(rgb);
    spn_media_item_release(&it);
    frames++;
  }
  CK(spn_encoder_finish(enc, &e_));
  spn_encoder_free(enc);
  spn_decoder_free(d);
  CU(cudaFree(rgb_dev));
  CU(cudaStreamDestroy(s));
  /* read it back on the CPU */
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  o.pixfmt = SPN_PIXFMT_YUV420P;
  spn_decoder_t *back = NULL;
  CK(spn_decoder_new(path, &o, &back, &e_));
  assert_int_equal(spn_decoder_info(back)->width, ew);
  assert_int_equal(spn_decoder_info(back)->height, eh);
  size_t n = 0;
  double worst = 999.0, sum = 0;
  uint8_t *got = malloc(n420);
  assert_non_null(got);
  while (next_item(back, &it, "NVENC's file")) {
    if (n >= frames)
      fail_msg("NVENC's file has more frames than the %zu that went in", frames);
    spn_image_t t;
    CK(spn_image_wrap(&t, got, ew, eh, SPN_PIXFMT_YUV420P, &e_));
    CK(spn_image_copy(&it.image, &t, &e_));
    double p = psnr_u8(got, refs + n * n420, n420);
    worst = p < worst ? p : worst;
    sum += p;
    spn_media_item_release(&it);
    n++;
  }
  spn_decoder_free(back);
  printf("# NVENC: %zu frames in, %zu out; PSNR mean %.2f dB, worst %.2f dB\n", frames, n,
         n ? sum / (double)n : 0.0, worst);
  assert_true(frames >= 100);
  assert_int_equal(n, frames);
  if (sum / (double)n < 30.0)
    fail_msg("NVENC's frames are %.2f dB from what went in (want >= 30)", sum / (double)n);
  free(got);
  free(refs);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  snprintf(sample, sizeof sample, "%s/samples/media/talking-head.mp4", root ? root : ".");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gpu_decode_matches_cpu),
      cmocka_unit_test(gpu_decode_turned_and_deep_frames),
      cmocka_unit_test(gpu_decode_clips_like_cpu),
      cmocka_unit_test(gpu_encode_matches_cpu_twin),
      cmocka_unit_test(gpu_to_nv12_matches_cpu_twins),
      cmocka_unit_test(nvenc_encodes_device_frames),
  };
  const char *filter = getenv("SPN_TEST_FILTER");
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
