/* media-tonemap.c — HDR to SDR (see media-tonemap.h for the steps). */
#include "media-tonemap.h"

#include <stdlib.h>
#include <string.h>

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

/* One pixel's tone map, from its 16-bit R'G'B' codes. */
static inline void map_pixel(const spn_tonemap_t *t, const int32_t c[3], uint8_t *d, int bgr) {
  float r = t->signal[c[0]], g = t->signal[c[1]], b = t->signal[c[2]], o[3];
  if (t->transfer == SPN_TRANSFER_HLG) { /* the OOTF: system gamma 1.2 on scene luminance, 1000 cd/m² peak */
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

/* A row of w pixels' 16-bit R'G'B' codes (packed, 3 a pixel) tone-mapped. */
static void map_row(const spn_tonemap_t *t, const uint16_t *s, uint8_t *d, int32_t w, int bgr) {
  for (int32_t x = 0; x < w; x++, s += 3, d += 3) {
    int32_t c[3] = {s[0], s[1], s[2]};
    map_pixel(t, c, d, bgr);
  }
}

static int is_rgb_dst(const spn_image_t *dst) {
  return dst && dst->data[0] && (dst->format == SPN_PIXFMT_RGB24 || dst->format == SPN_PIXFMT_BGR24);
}

int32_t spn_tonemap_rgb48(const spn_tonemap_t *t, const uint16_t *src, int64_t src_stride, spn_image_t *dst,
                          spn_error_t *err) {
  if (!t || !src || !is_rgb_dst(dst))
    return spn_error_set(err, SPN_EINVAL, "tonemap: needs a tone mapper, a source and an rgb24/bgr24 destination");
  int bgr = dst->format == SPN_PIXFMT_BGR24;
  for (int32_t y = 0; y < dst->height; y++)
    map_row(t, (const uint16_t *)((const uint8_t *)src + y * src_stride), dst->data[0] + y * dst->stride[0],
            dst->width, bgr);
  return SPN_OK;
}

/* Samples i0, i0 + step, ... (n of them) of row `row` of plane p, on the
 * 16-bit scale for deep pictures, times `mul`, added to out. */
static void add_samples(const spn_tonemap_yuv_t *s, int p, int32_t row, int32_t n, int32_t mul, int32_t *out) {
  const uint8_t *r = s->plane[p] + row * s->pitch[p];
  int32_t st = p ? s->step : 1;
  if (s->bits == 16)
    for (int32_t i = 0; i < n; i++)
      out[i] += mul * (int32_t)((((const uint16_t *)r)[(int64_t)i * st] >> s->shift) << s->up);
  else
    for (int32_t i = 0; i < n; i++)
      out[i] += mul * r[(int64_t)i * st];
}

int32_t spn_tonemap_yuv420(const spn_tonemap_t *t, const spn_tonemap_yuv_t *src, const spn_colour_t *col,
                           spn_image_t *dst, spn_error_t *err) {
  spn_yuv_coeffs_t k = {0};
  int32_t rc;
  if (!t || !src || !is_rgb_dst(dst) || !src->plane[0] || !src->plane[1] || !src->plane[2])
    return spn_error_set(err, SPN_EINVAL, "tonemap: needs a tone mapper, 4:2:0 planes and an rgb24/bgr24 destination");
  if (src->width != dst->width || src->height != dst->height || (src->bits != 8 && src->bits != 16) ||
      src->step < 1 || src->shift < 0 || src->up < 0 || src->shift + src->up > 16)
    return spn_error_set(err, SPN_EINVAL, "tonemap: a %dx%d picture of %d-bit samples into %dx%d",
                         (int)src->width, (int)src->height, (int)src->bits, (int)dst->width, (int)dst->height);
  if ((rc = spn_colour_coeffs(col, &k, err)))
    return rc;
  int bgr = dst->format == SPN_PIXFMT_BGR24;
  int32_t w = dst->width, cw = (w + 1) / 2;
  /* per row: the luma, and each chroma column's 3 · near row + far row
   * (so a pixel's sum 3 (a + b) + c + d is two of these) */
  int32_t *buf = calloc((size_t)w + 2 * (size_t)cw, sizeof *buf), *ly = buf, *vu = buf + w, *vv = vu + cw;
  uint16_t *codes = malloc((size_t)w * 3 * sizeof *codes); /* the row's R'G'B', then map_row */
  if (!buf || !codes) {
    free(buf);
    free(codes);
    return spn_error_set(err, SPN_ENOMEM, "tonemap: out of memory");
  }
  /* (the kernel's exact scalings: 16-bit samples / 256, chroma sums / 8) */
  float unit = src->bits == 16 ? 1.0f / 256.0f : 1.0f, cunit = unit * 0.125f;
  for (int32_t y = 0; y < dst->height; y++) {
    int32_t tp[4];
    spn_tm_chroma_taps(0, y, w, dst->height, tp);
    memset(buf, 0, ((size_t)w + 2 * (size_t)cw) * sizeof *buf);
    add_samples(src, 0, y, w, 1, ly);
    add_samples(src, 1, tp[2], cw, 3, vu);
    add_samples(src, 1, tp[3], cw, 1, vu);
    add_samples(src, 2, tp[2], cw, 3, vv);
    add_samples(src, 2, tp[3], cw, 1, vv);
    for (int32_t x = 0; x < w; x++) {
      spn_tm_chroma_taps(x, y, w, dst->height, tp);
      int32_t c[3];
      spn_tm_yuv_to_rgb16(&k, (float)ly[x] * unit, (float)(vu[tp[0]] + vu[tp[1]]) * cunit,
                          (float)(vv[tp[0]] + vv[tp[1]]) * cunit, c);
      for (int i = 0; i < 3; i++)
        codes[3 * x + i] = (uint16_t)c[i];
    }
    map_row(t, codes, dst->data[0] + y * dst->stride[0], w, bgr);
  }
  free(buf);
  free(codes);
  return SPN_OK;
}
