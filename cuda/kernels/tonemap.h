/* cuda/kernels/tonemap.h — the arithmetic of HDR → SDR, once, for the CPU
 * tone mapper (stages/media/media-tonemap.c, which caches it in tables) and
 * its GPU twin (spn_cuda_hdr420_to_rgb in color.cu, which computes it per
 * pixel at the CPU tables' sample points, so the two give the same bytes).
 * The steps and their reasons are in stages/media/media-tonemap.h.
 *
 * Plain C (and C++), no library: every function is inline and float, and
 * on the GPU each product and sum that could fuse is rounded on its own
 * (SPN_TM_MUL/ADD/SUB), as the CPU computes them. What can still differ is
 * the last bit of powf/expf on the two sides, which moves an 8-bit result
 * only where a value sits on a rounding tie. Internal to Spindle. */
#ifndef SPINDLE_CUDA_KERNELS_TONEMAP_H
#define SPINDLE_CUDA_KERNELS_TONEMAP_H

#include <math.h>
#include <stdint.h>

#include "spindle/image.h" /* spn_yuv_coeffs_t */

#ifdef __CUDACC__
#define SPN_TM_FN static __host__ __device__ __forceinline__
#else
#define SPN_TM_FN static inline
#endif
#ifdef __CUDA_ARCH__
#define SPN_TM_MUL(a, b) __fmul_rn(a, b)
#define SPN_TM_ADD(a, b) __fadd_rn(a, b)
#define SPN_TM_SUB(a, b) __fsub_rn(a, b)
#else
#define SPN_TM_MUL(a, b) ((a) * (b))
#define SPN_TM_ADD(a, b) ((a) + (b))
#define SPN_TM_SUB(a, b) ((a) - (b))
#endif

/* H.273 transfer characteristics codes (FFmpeg's AVColorTransferCharacteristic). */
enum { SPN_TRANSFER_PQ = 16, SPN_TRANSFER_HLG = 18 };

#define SPN_TM_REF_WHITE 203.0f /* BT.2408's HDR reference white, cd/m² */
#define SPN_TM_PEAK 1000.0f     /* the display HLG's OOTF is for; PQ graded to it */
#define SPN_TM_KNEE 0.75f       /* of reference white: unchanged below */
#define SPN_TM_OETF_STEPS 4096  /* SDR signal sample points, in sqrt(L) */
#define SPN_TM_OOTF_STEPS 16384 /* HLG gain sample points, in sqrt(Ys) (within 0.2 % above Ys = 1e-4) */

/* The signal v (0..1) as light: PQ (SMPTE ST 2084): display light in
 * units of reference white; HLG (ARIB STD-B67): scene light E, 0..1. */
SPN_TM_FN float spn_tm_signal(int32_t transfer, float v) {
  if (!(v > 0.0f))
    return 0.0f;
  if (v > 1.0f)
    v = 1.0f;
  if (transfer == SPN_TRANSFER_PQ) {
    const float m1 = 2610.0f / 16384.0f, m2 = 2523.0f / 4096.0f * 128.0f, c1 = 3424.0f / 4096.0f,
                c2 = 2413.0f / 4096.0f * 32.0f, c3 = 2392.0f / 4096.0f * 32.0f;
    float p = powf(v, 1.0f / m2), num = p - c1;
    if (num < 0.0f)
      num = 0.0f;
    return 10000.0f / SPN_TM_REF_WHITE * powf(num / SPN_TM_SUB(c2, SPN_TM_MUL(c3, p)), 1.0f / m1);
  }
  const float a = 0.17883277f, b = 0.28466892f, c = 0.55991073f; /* b = 1 - 4a, c = 0.5 - a ln(4a) */
  return v <= 0.5f ? v * v / 3.0f : (expf((v - c) / a) + b) / 12.0f;
}

/* HLG's OOTF gain for a 1000 cd/m² display, in units of reference white, at
 * sample point i of SPN_TM_OOTF_STEPS: 1000/203 · Ys^0.2 with Ys = s², s =
 * i / steps. spn_tm_hlg_gain gives it for a scene luminance. */
SPN_TM_FN float spn_tm_ootf_gain(int32_t i) {
  float s = (float)i / SPN_TM_OOTF_STEPS;
  return SPN_TM_PEAK / SPN_TM_REF_WHITE * powf(s * s, 0.2f);
}
/* The gain for scene luminance ys: 0 at or below 0, else the nearest
 * sample point's (`gains`: the CPU's table of spn_tm_ootf_gain; NULL:
 * computed). */
SPN_TM_FN float spn_tm_hlg_gain(float ys, const float *gains) {
  if (!(ys > 0.0f))
    return 0.0f;
  int32_t i = (int32_t)SPN_TM_ADD(SPN_TM_MUL(sqrtf(ys < 1.0f ? ys : 1.0f), (float)SPN_TM_OOTF_STEPS), 0.5f);
  return gains ? gains[i] : spn_tm_ootf_gain(i);
}
/* HLG's scene luminance Ys of scene light (r, g, b) (BT.2100). */
SPN_TM_FN float spn_tm_hlg_luma(float r, float g, float b) {
  return SPN_TM_ADD(SPN_TM_ADD(SPN_TM_MUL(0.2627f, r), SPN_TM_MUL(0.6780f, g)), SPN_TM_MUL(0.0593f, b));
}

/* The SDR signal at sample point i of SPN_TM_OETF_STEPS (BT.1886's inverse,
 * L^(1/2.4), L = s², s = i / steps), 8 bits. */
SPN_TM_FN uint8_t spn_tm_oetf_code(int32_t i) {
  float s = (float)i / SPN_TM_OETF_STEPS;
  return (uint8_t)SPN_TM_ADD(SPN_TM_MUL(255.0f, powf(s * s, 1.0f / 2.4f)), 0.5f);
}
/* The 8-bit SDR signal of light l: 0 at or below 0 (and for NaN), 255 at or
 * above 1, else the sample point's code (`codes`: the CPU's table of
 * spn_tm_oetf_code; NULL: computed). */
SPN_TM_FN uint8_t spn_tm_sdr(float l, const uint8_t *codes) {
  if (!(l > 0.0f))
    return 0;
  if (l >= 1.0f)
    return 255;
  int32_t i = (int32_t)SPN_TM_ADD(SPN_TM_MUL(sqrtf(l), (float)SPN_TM_OETF_STEPS), 0.5f);
  return codes ? codes[i] : spn_tm_oetf_code(i);
}

/* Display light in BT.2020 (units of reference white) → SDR light in
 * BT.709, 0..1: the primaries converted (BT.2087's linear matrix), colours
 * outside BT.709 clipped to 0, and the highlights compressed on m = max(R,
 * G, B): unchanged below the knee, above it an extended Reinhard shoulder
 * (slope 1 at the knee) that takes the peak to 1, all three channels
 * scaled by m'/m. */
SPN_TM_FN void spn_tm_to_sdr(float r, float g, float b, float *out) {
  float r7 = SPN_TM_SUB(SPN_TM_SUB(SPN_TM_MUL(1.660491f, r), SPN_TM_MUL(0.587641f, g)), SPN_TM_MUL(0.072850f, b));
  float g7 = SPN_TM_SUB(SPN_TM_ADD(SPN_TM_MUL(-0.124550f, r), SPN_TM_MUL(1.132900f, g)), SPN_TM_MUL(0.008349f, b));
  float b7 = SPN_TM_ADD(SPN_TM_SUB(SPN_TM_MUL(-0.018151f, r), SPN_TM_MUL(0.100579f, g)), SPN_TM_MUL(1.118730f, b));
  r7 = r7 > 0.0f ? r7 : 0.0f;
  g7 = g7 > 0.0f ? g7 : 0.0f;
  b7 = b7 > 0.0f ? b7 : 0.0f;
  float m = r7 > g7 ? (r7 > b7 ? r7 : b7) : (g7 > b7 ? g7 : b7);
  if (m > SPN_TM_KNEE) {
    const float peak = SPN_TM_PEAK / SPN_TM_REF_WHITE, tw = (peak - SPN_TM_KNEE) / (1.0f - SPN_TM_KNEE);
    float t = (m - SPN_TM_KNEE) / (1.0f - SPN_TM_KNEE);
    float sh =
        SPN_TM_ADD(SPN_TM_KNEE, SPN_TM_MUL(SPN_TM_MUL(1.0f - SPN_TM_KNEE, t), 1.0f + t / (tw * tw)) / (1.0f + t));
    float sc = (sh < 1.0f ? sh : 1.0f) / m;
    r7 *= sc;
    g7 *= sc;
    b7 *= sc;
  }
  out[0] = r7;
  out[1] = g7;
  out[2] = b7;
}

/* The picture's R'G'B' before the tone map, from its 4:2:0 samples, the
 * same on both sides. Chroma is interpolated as spn-image's 4:2:0 → RGB
 * (spindle/image.h): pixel (x, y) of a w x h picture reads chroma columns
 * t[0], t[1] of rows t[2] (weight 3) and t[3] (weight 1); their sum
 * 3 (a + b) + c + d, exact as an integer, is 8 times the sample. */
SPN_TM_FN void spn_tm_chroma_taps(int32_t x, int32_t y, int32_t w, int32_t h, int32_t t[4]) {
  int32_t cw = (w + 1) / 2, ch = (h + 1) / 2, cy = y / 2, c0 = x / 2;
  t[0] = c0;
  t[1] = (x & 1) && c0 + 1 < cw ? c0 + 1 : c0;
  t[2] = cy;
  t[3] = (y & 1) ? (cy + 1 < ch ? cy + 1 : cy) : (cy > 0 ? cy - 1 : 0);
}

/* R' (0..255) to the 16-bit code an RGB48 picture holds: R' · 257,
 * rounded, saturated. */
SPN_TM_FN int32_t spn_tm_code16(float v) {
  float c = SPN_TM_MUL(v, 257.0f);
  if (!(c > 0.0f))
    return 0;
  if (c >= 65534.5f)
    return 65535;
  return (int32_t)SPN_TM_ADD(c, 0.5f);
}

/* Y, Cb, Cr on the 8-bit scale (16-bit samples divided by 256, chroma sums
 * by 8 more: exact) to 16-bit R'G'B' codes, with the file's matrix. */
SPN_TM_FN void spn_tm_yuv_to_rgb16(const spn_yuv_coeffs_t *k, float y, float cb, float cr, int32_t out[3]) {
  float yy = SPN_TM_MUL(k->ys, SPN_TM_SUB(y, k->yoff));
  cb = SPN_TM_SUB(cb, 128.0f);
  cr = SPN_TM_SUB(cr, 128.0f);
  out[0] = spn_tm_code16(SPN_TM_ADD(yy, SPN_TM_MUL(k->rv, cr)));
  out[1] = spn_tm_code16(SPN_TM_SUB(SPN_TM_SUB(yy, SPN_TM_MUL(k->gu, cb)), SPN_TM_MUL(k->gv, cr)));
  out[2] = spn_tm_code16(SPN_TM_ADD(yy, SPN_TM_MUL(k->bu, cb)));
}

#endif
