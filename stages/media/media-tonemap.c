/* media-tonemap.c — HDR to SDR (see media-tonemap.h for the steps). */
#include "media-tonemap.h"

#include <stdlib.h>

#include "tonemap.h"

struct spn_tonemap {
  int32_t transfer;
  float signal[65536];                     /* 16-bit code -> spn_tm_signal */
  uint8_t oetf[SPN_TM_OETF_STEPS + 1];     /* spn_tm_oetf_code at each sample point */
  float ootf[SPN_TM_OOTF_STEPS + 1];       /* spn_tm_ootf_gain at each sample point */
};

int32_t spn_tonemap_new(int32_t transfer, spn_tonemap_t **out, spn_error_t *err) {
  if (transfer != SPN_TRANSFER_PQ && transfer != SPN_TRANSFER_HLG)
    return spn_error_set(err, SPN_EINVAL, "tonemap: transfer %d is neither PQ (16) nor HLG (18)", (int)transfer);
  spn_tonemap_t *t = malloc(sizeof *t);
  if (!t)
    return spn_error_set(err, SPN_ENOMEM, "tonemap: out of memory");
  t->transfer = transfer;
  for (int i = 0; i < 65536; i++)
    t->signal[i] = spn_tm_signal(transfer, (float)i / 65535.0f);
  for (int i = 0; i <= SPN_TM_OETF_STEPS; i++)
    t->oetf[i] = spn_tm_oetf_code(i);
  for (int i = 0; i <= SPN_TM_OOTF_STEPS; i++)
    t->ootf[i] = spn_tm_ootf_gain(i);
  *out = t;
  return SPN_OK;
}

void spn_tonemap_free(spn_tonemap_t *t) { free(t); }

int32_t spn_tonemap_rgb48(const spn_tonemap_t *t, const uint16_t *src, int64_t src_stride, spn_image_t *dst,
                          spn_error_t *err) {
  if (!t || !src || !dst || !dst->data[0] || (dst->format != SPN_PIXFMT_RGB24 && dst->format != SPN_PIXFMT_BGR24))
    return spn_error_set(err, SPN_EINVAL, "tonemap: needs a tone mapper, a source and an rgb24/bgr24 destination");
  int bgr = dst->format == SPN_PIXFMT_BGR24, hlg = t->transfer == SPN_TRANSFER_HLG;
  for (int32_t y = 0; y < dst->height; y++) {
    const uint16_t *s = (const uint16_t *)((const uint8_t *)src + y * src_stride);
    uint8_t *d = dst->data[0] + y * dst->stride[0];
    for (int32_t x = 0; x < dst->width; x++, s += 3, d += 3) {
      float r = t->signal[s[0]], g = t->signal[s[1]], b = t->signal[s[2]], o[3];
      if (hlg) { /* the OOTF: system gamma 1.2 on scene luminance, 1000 cd/m² peak */
        float k = spn_tm_hlg_gain(spn_tm_hlg_luma(r, g, b), t->ootf);
        r *= k;
        g *= k;
        b *= k;
      }
      spn_tm_to_sdr(r, g, b, o);
      d[bgr ? 2 : 0] = spn_tm_sdr(o[0], t->oetf);
      d[1] = spn_tm_sdr(o[1], t->oetf);
      d[bgr ? 0 : 2] = spn_tm_sdr(o[2], t->oetf);
    }
  }
  return SPN_OK;
}
