/* media-tonemap.c — HDR to SDR (see media-tonemap.h for the steps). */
#include "media-tonemap.h"

#include <math.h>
#include <stdlib.h>

#define REF_WHITE_NITS 203.0  /* BT.2408's HDR reference white */
#define PEAK_NITS 1000.0      /* the display HLG's OOTF is for; PQ graded to it */
#define KNEE 0.75f            /* of reference white: unchanged below */
#define OETF_STEPS 4096       /* the SDR signal table, indexed by sqrt(L) */
#define OOTF_STEPS 16384      /* HLG's gain table, indexed by sqrt(Ys) (within 0.2% above Ys = 1e-4) */

struct spn_tonemap {
  int32_t transfer;
  /* 16-bit code -> PQ: display light / reference white; HLG: scene light E (0..1) */
  float signal[65536];
  uint8_t oetf[OETF_STEPS + 1]; /* round(255 * (s^2)^(1/2.4)) at s = i / OETF_STEPS */
  float ootf[OOTF_STEPS + 1];   /* HLG: 1000/203 * (s^2)^0.2 at s = i / OOTF_STEPS (s = sqrt(Ys)) */
};

static double pq_eotf(double v) { /* cd/m² */
  const double m1 = 2610.0 / 16384.0, m2 = 2523.0 / 4096.0 * 128.0, c1 = 3424.0 / 4096.0,
               c2 = 2413.0 / 4096.0 * 32.0, c3 = 2392.0 / 4096.0 * 32.0;
  double p = pow(v, 1.0 / m2), num = p - c1;
  if (num < 0.0)
    num = 0.0;
  return 10000.0 * pow(num / (c2 - c3 * p), 1.0 / m1);
}

static double hlg_inverse_oetf(double v) { /* scene light 0..1 */
  const double a = 0.17883277, b = 1.0 - 4.0 * a, c = 0.5 - a * log(4.0 * a);
  return v <= 0.5 ? v * v / 3.0 : (exp((v - c) / a) + b) / 12.0;
}

int32_t spn_tonemap_new(int32_t transfer, spn_tonemap_t **out, spn_error_t *err) {
  if (transfer != SPN_TRANSFER_PQ && transfer != SPN_TRANSFER_HLG)
    return spn_error_set(err, SPN_EINVAL, "tonemap: transfer %d is neither PQ (16) nor HLG (18)", (int)transfer);
  spn_tonemap_t *t = malloc(sizeof *t);
  if (!t)
    return spn_error_set(err, SPN_ENOMEM, "tonemap: out of memory");
  t->transfer = transfer;
  for (int i = 0; i < 65536; i++) {
    double v = i / 65535.0;
    t->signal[i] = (float)(transfer == SPN_TRANSFER_PQ ? pq_eotf(v) / REF_WHITE_NITS : hlg_inverse_oetf(v));
  }
  for (int i = 0; i <= OETF_STEPS; i++) {
    double s = (double)i / OETF_STEPS;
    t->oetf[i] = (uint8_t)lrint(255.0 * pow(s * s, 1.0 / 2.4));
  }
  for (int i = 0; i <= OOTF_STEPS; i++) {
    double s = (double)i / OOTF_STEPS;
    t->ootf[i] = (float)(PEAK_NITS / REF_WHITE_NITS * pow(s * s, 0.2));
  }
  *out = t;
  return SPN_OK;
}

void spn_tonemap_free(spn_tonemap_t *t) { free(t); }

/* The shoulder above the knee: extended Reinhard in t = (m - knee) /
 * (1 - knee), slope 1 at the knee, the peak to 1. */
static inline float shoulder(float m, float tw) {
  if (m <= KNEE)
    return m;
  float t = (m - KNEE) / (1.0f - KNEE);
  float r = KNEE + (1.0f - KNEE) * t * (1.0f + t / (tw * tw)) / (1.0f + t);
  return r < 1.0f ? r : 1.0f;
}

static inline uint8_t sdr(const spn_tonemap_t *t, float l) {
  if (!(l > 0.0f)) /* also NaN */
    return 0;
  if (l >= 1.0f)
    return 255;
  return t->oetf[(int)(sqrtf(l) * OETF_STEPS + 0.5f)];
}

int32_t spn_tonemap_rgb48(const spn_tonemap_t *t, const uint16_t *src, int64_t src_stride, spn_image_t *dst,
                          spn_error_t *err) {
  if (!t || !src || !dst || !dst->data[0] || (dst->format != SPN_PIXFMT_RGB24 && dst->format != SPN_PIXFMT_BGR24))
    return spn_error_set(err, SPN_EINVAL, "tonemap: needs a tone mapper, a source and an rgb24/bgr24 destination");
  const float peak = (float)(PEAK_NITS / REF_WHITE_NITS), tw = (peak - KNEE) / (1.0f - KNEE);
  int bgr = dst->format == SPN_PIXFMT_BGR24;
  for (int32_t y = 0; y < dst->height; y++) {
    const uint16_t *s = (const uint16_t *)((const uint8_t *)src + y * src_stride);
    uint8_t *d = dst->data[0] + y * dst->stride[0];
    for (int32_t x = 0; x < dst->width; x++, s += 3, d += 3) {
      float r = t->signal[s[0]], g = t->signal[s[1]], b = t->signal[s[2]];
      if (t->transfer == SPN_TRANSFER_HLG) {
        /* OOTF: system gamma 1.2 on scene luminance, 1000 cd/m² peak */
        float ys = 0.2627f * r + 0.6780f * g + 0.0593f * b;
        float k = ys > 0.0f ? t->ootf[(int)(sqrtf(ys < 1.0f ? ys : 1.0f) * OOTF_STEPS + 0.5f)] : 0.0f;
        r *= k;
        g *= k;
        b *= k;
      }
      /* BT.2020 -> BT.709 primaries (linear light), out-of-gamut clipped */
      float r7 = 1.660491f * r - 0.587641f * g - 0.072850f * b;
      float g7 = -0.124550f * r + 1.132900f * g - 0.008349f * b;
      float b7 = -0.018151f * r - 0.100579f * g + 1.118730f * b;
      r7 = r7 > 0.0f ? r7 : 0.0f;
      g7 = g7 > 0.0f ? g7 : 0.0f;
      b7 = b7 > 0.0f ? b7 : 0.0f;
      float m = r7 > g7 ? (r7 > b7 ? r7 : b7) : (g7 > b7 ? g7 : b7);
      if (m > KNEE) {
        float sc = shoulder(m, tw) / m;
        r7 *= sc;
        g7 *= sc;
        b7 *= sc;
      }
      d[bgr ? 2 : 0] = sdr(t, r7);
      d[1] = sdr(t, g7);
      d[bgr ? 0 : 2] = sdr(t, b7);
    }
  }
  return SPN_OK;
}
