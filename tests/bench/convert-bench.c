/* convert-bench — decode's 4:2:0 → RGB conversions against swscale, in the
 * same run, on one core.
 *
 *   convert-bench [WIDTH HEIGHT [REPEATS]]      (default 1920 1080 20)
 *
 * SDR: spn_image_convert_colour (what decode runs on 8-bit 4:2:0; the GPU
 * kernel's twin) against sws_scale with the flags decode used before
 * (SWS_BILINEAR | SWS_ACCURATE_RND: swscale's generic path, the one that
 * read limited range 2 levels dark) and with SWS_FULL_CHR_H_INT added (what
 * decode's remaining swscale conversions use). HDR (10-bit HLG, BT.2020):
 * spn_tonemap_yuv420 against sws_scale to RGB48 + spn_tonemap_rgb48 (decode
 * before). The picture is a smooth pattern with edges (gradients and
 * bars), not noise: tone mapping costs depend on the colours. Prints the
 * milliseconds a frame of each and the ratio to Spindle's. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <libswscale/swscale.h>

#include "media-tonemap.h"
#include "spindle/image.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sample (x, y) of plane p (0 luma, 1 Cb, 2 Cr) of the pattern, 0..1. */
static double pattern(int p, int x, int y, int w, int h) {
  double u = (double)x / w, v = (double)y / h;
  if (p == 0)
    return 0.5 + 0.4 * sin(6.0 * u + 3.0 * v) * ((x / 64 + y / 64) % 2 ? 1.0 : 0.6);
  return 0.5 + 0.3 * (p == 1 ? cos(4.0 * u - 2.0 * v) : sin(5.0 * v + u)) * ((x / 96) % 3 ? 1.0 : -1.0);
}

int main(int argc, char **argv) {
  int w = argc > 2 ? atoi(argv[1]) : 1920, h = argc > 2 ? atoi(argv[2]) : 1080, n = argc > 3 ? atoi(argv[3]) : 20;
  if (w < 16 || h < 16 || w % 2 || h % 2 || n < 1) {
    fprintf(stderr, "usage: convert-bench [WIDTH HEIGHT [REPEATS]] (even sizes of 16 or more)\n");
    return 2;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t yuv = SPN_IMAGE_INIT, rgb = SPN_IMAGE_INIT;
  if (spn_image_alloc(&yuv, w, h, SPN_PIXFMT_YUV420P, &err) || spn_image_alloc(&rgb, w, h, SPN_PIXFMT_RGB24, &err)) {
    fprintf(stderr, "convert-bench: %s\n", err.msg);
    return 1;
  }
  uint16_t *deep[3];
  for (int p = 0; p < 3; p++) {
    int pw = p ? w / 2 : w, ph = p ? h / 2 : h;
    deep[p] = malloc((size_t)pw * (size_t)ph * 2);
    if (!deep[p])
      return 1;
    for (int y = 0; y < ph; y++)
      for (int x = 0; x < pw; x++) {
        double s = pattern(p, p ? 2 * x : x, p ? 2 * y : y, w, h);
        /* limited range: luma 16..235, chroma 16..240 (8 bits; 10 bits × 4) */
        double v = p ? 16.0 + 224.0 * s : 16.0 + 219.0 * s;
        yuv.data[p][y * yuv.stride[p] + x] = (uint8_t)lround(v);
        deep[p][(size_t)y * (size_t)pw + (size_t)x] = (uint16_t)lround(v * 4.0);
      }
  }
  printf("# %dx%d, %d repeats, one thread\n", w, h, n);

  /* SDR */
  double t = now();
  for (int i = 0; i < n; i++)
    spn_image_convert_colour(&yuv, &rgb, NULL, &err);
  double ours = (now() - t) / n * 1e3;
  printf("spn_image_convert_colour yuv420p->rgb24: %7.2f ms\n", ours);
  const char *names[2] = {"bilinear|accurate_rnd (decode before)", "bilinear|accurate_rnd|full_chr_h_int"};
  for (int k = 0; k < 2; k++) {
    struct SwsContext *s = sws_getContext(w, h, AV_PIX_FMT_YUV420P, w, h, AV_PIX_FMT_RGB24,
                                          SWS_BILINEAR | SWS_ACCURATE_RND | (k ? SWS_FULL_CHR_H_INT : 0), NULL, NULL,
                                          NULL);
    const int *m = sws_getCoefficients(SWS_CS_ITU601);
    sws_setColorspaceDetails(s, m, 0, m, 1, 0, 1 << 16, 1 << 16);
    const uint8_t *src[3] = {yuv.data[0], yuv.data[1], yuv.data[2]};
    int ls[3] = {(int)yuv.stride[0], (int)yuv.stride[1], (int)yuv.stride[2]};
    uint8_t *dst[1] = {rgb.data[0]};
    int dl[1] = {(int)rgb.stride[0]};
    t = now();
    for (int i = 0; i < n; i++)
      sws_scale(s, src, ls, 0, h, dst, dl);
    double them = (now() - t) / n * 1e3;
    printf("swscale %-38s %7.2f ms  (spindle/swscale %.2f)\n", names[k], them, ours / them);
    sws_freeContext(s);
  }

  /* HDR: 10-bit planar HLG, BT.2020 */
  spn_tonemap_t *tm = NULL;
  if (spn_tonemap_new(SPN_TRANSFER_HLG, &tm, &err)) {
    fprintf(stderr, "convert-bench: %s\n", err.msg);
    return 1;
  }
  spn_colour_t bt2020 = {SPN_MATRIX_BT2020, 0};
  spn_tonemap_yuv_t pic = {.width = w, .height = h, .plane = {(uint8_t *)deep[0], (uint8_t *)deep[1], (uint8_t *)deep[2]},
                           .pitch = {(int64_t)w * 2, (int64_t)w, (int64_t)w}, .step = 1, .bits = 16, .up = 6};
  int hdr_n = n < 5 ? n : 5;
  t = now();
  for (int i = 0; i < hdr_n; i++)
    spn_tonemap_yuv420(tm, &pic, &bt2020, &rgb, &err);
  ours = (now() - t) / hdr_n * 1e3;
  printf("spn_tonemap_yuv420 10-bit HLG->rgb24:    %7.2f ms\n", ours);
  uint16_t *rgb48 = malloc((size_t)w * (size_t)h * 6);
  struct SwsContext *s = sws_getContext(w, h, AV_PIX_FMT_YUV420P10LE, w, h, AV_PIX_FMT_RGB48, SWS_BILINEAR | SWS_ACCURATE_RND,
                                        NULL, NULL, NULL);
  if (!rgb48 || !s)
    return 1;
  const int *m = sws_getCoefficients(SWS_CS_BT2020);
  sws_setColorspaceDetails(s, m, 0, m, 1, 0, 1 << 16, 1 << 16);
  const uint8_t *src[3] = {(uint8_t *)deep[0], (uint8_t *)deep[1], (uint8_t *)deep[2]};
  int ls[3] = {w * 2, w, w};
  uint8_t *dst[1] = {(uint8_t *)rgb48};
  int dl[1] = {w * 6};
  t = now();
  for (int i = 0; i < hdr_n; i++) {
    sws_scale(s, src, ls, 0, h, dst, dl);
    spn_tonemap_rgb48(tm, rgb48, (int64_t)w * 6, &rgb, &err);
  }
  double them = (now() - t) / hdr_n * 1e3;
  printf("swscale rgb48 + spn_tonemap_rgb48 (decode before): %7.2f ms  (spindle/that %.2f)\n", them, ours / them);
  sws_freeContext(s);
  spn_tonemap_free(tm);
  free(rgb48);
  for (int p = 0; p < 3; p++)
    free(deep[p]);
  spn_image_release(&yuv);
  spn_image_release(&rgb);
  return 0;
}
