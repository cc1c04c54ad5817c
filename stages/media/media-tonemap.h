/* media-tonemap.h — HDR video (PQ or HLG, BT.2020) to SDR RGB, on the CPU.
 *
 * decode uses it for RGB and float frames of an HDR file: the models and
 * the SDR file a pipeline writes get the picture a viewer of the HDR video
 * sees, mapped into SDR, instead of the HDR signal read as if it were SDR
 * (flat and pale). Per pixel, in float:
 *
 * 1. The signal to display light, in units of HDR reference white
 *    (203 cd/m², ITU-R BT.2408):
 *    - PQ (SMPTE ST 2084): the EOTF gives cd/m² directly.
 *    - HLG (ARIB STD-B67, BT.2100): the inverse OETF gives scene light
 *      E (0..1) per channel; the OOTF for a 1000 cd/m² display gives
 *      1000 · Ys^0.2 · E, Ys = 0.2627 R + 0.6780 G + 0.0593 B (so HLG's
 *      reference level, 75% signal, is 203 cd/m²).
 * 2. BT.2020 → BT.709 primaries (the linear 3×3 matrix of BT.2087),
 *    negative components (colours outside BT.709) clipped to 0.
 * 3. Highlights compressed: with m = max(R, G, B), below the knee (0.75 of
 *    reference white) nothing changes; above it an extended Reinhard
 *    shoulder, with slope 1 at the knee, takes the peak (1000 cd/m²,
 *    4.93× reference white) to SDR white; all three channels are scaled by
 *    m'/m, so hue and saturation stay. Reference white lands at 0.875
 *    (241 of 255 after step 4).
 * 4. SDR signal: the BT.1886 display's inverse, v = L^(1/2.4), 8 bits.
 *
 * The result is BT.709-primaries SDR RGB; encode writes it like any RGB.
 * No global state: an spn_tonemap_t holds its tables (256 KiB), one per
 * decoder. Thread: a tone mapper is read-only after spn_tonemap_new, so
 * any number of threads may use it. */
#ifndef SPINDLE_MEDIA_TONEMAP_H
#define SPINDLE_MEDIA_TONEMAP_H

#include <stdint.h>

#include "spindle/image.h"
#include "spindle/status.h"
#include "tonemap.h" /* (cuda/kernels: the arithmetic, shared with the GPU twin) */


typedef struct spn_tonemap spn_tonemap_t;

/* A tone mapper for `transfer` (SPN_TRANSFER_PQ or SPN_TRANSFER_HLG;
 * anything else is SPN_EINVAL). Ownership: caller owns *out. */
int32_t spn_tonemap_new(int32_t transfer, spn_tonemap_t **out, spn_error_t *err);
void spn_tonemap_free(spn_tonemap_t *t);

/* src: packed 16-bit R'G'B' (native endian, full range: 0..65535 is the
 * signal 0..1), width x height of dst, rows src_stride bytes apart. dst:
 * RGB24 or BGR24. */
int32_t spn_tonemap_rgb48(const spn_tonemap_t *t, const uint16_t *src, int64_t src_stride, spn_image_t *dst,
                          spn_error_t *err);

/* A 4:2:0 picture's planes, as spn_tonemap_yuv420 reads them. */
typedef struct spn_tonemap_yuv {
  int32_t width, height;
  const uint8_t *plane[3]; /* Y, Cb, Cr: each plane's first sample (interleaved: Cr is Cb + 1 sample) */
  int64_t pitch[3];        /* bytes from one row to the next */
  int32_t step;            /* chroma: samples from one pixel pair's to the next (1 planar, 2 interleaved) */
  int32_t bits;            /* 8: bytes; 16: native-endian uint16 ... */
  int32_t shift, up;       /* ... whose value is (raw >> shift) << up, at the top of 16 bits (P010: 0, 0;
                            * 10-bit planar: 0, 6) */
} spn_tonemap_yuv_t;

/* The picture's samples to SDR RGB24/BGR24 (dst, of the picture's size),
 * in colour *col (its matrix and range): chroma interpolated as
 * spn-image's 4:2:0 → RGB, R'G'B' rounded to 16 bits, then
 * spn_tonemap_rgb48's steps. What the GPU's spn_cuda_hdr420_to_rgb does
 * (with the same helpers of tonemap.h). */
int32_t spn_tonemap_yuv420(const spn_tonemap_t *t, const spn_tonemap_yuv_t *src, const spn_colour_t *col,
                           spn_image_t *dst, spn_error_t *err);

#endif
