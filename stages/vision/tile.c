/* tile.c — tile / pad / stitch for super-resolution.
 *
 * Tile (ty, tx) covers input rows [ty*T, min((ty+1)*T, h)) and columns
 * likewise; its padded version reaches tile_pad further on each side, clamped
 * to the image. The callback sees the padded block; the output rows
 * [(y0 - py0) * s, (y0 - py0 + th) * s) and matching columns of its result —
 * the centre that corresponds to the un-padded tile — are copied to output
 * rows [y0 * s, y1 * s). Every output pixel is written exactly once.
 */
#include "tile.h"

#include <stdlib.h>
#include <string.h>

int32_t spn_tile_check(int32_t h, int32_t w, const spn_tile_params_t *params, spn_error_t *err) {
  if (!params)
    return spn_error_set(err, SPN_EINVAL, "tile: NULL argument");
  const spn_tile_params_t p = *params;
  if (h <= 0 || w <= 0 || p.tile < 1 || p.tile_pad < 0 || p.scale < 1 || p.scale > 16 || p.channels < 1 ||
      p.out_channels < 1 || p.channels > 64 || p.out_channels > 64 || (int64_t)h * p.scale > (1 << 20) ||
      (int64_t)w * p.scale > (1 << 20))
    return spn_error_set(err, SPN_EINVAL, "tile: bad image %dx%d or params (tile %d, pad %d, scale %d, channels %d/%d)",
                         h, w, p.tile, p.tile_pad, p.scale, p.channels, p.out_channels);
  return SPN_OK;
}

int32_t spn_tile_count(int32_t h, int32_t w, const spn_tile_params_t *params) {
  int32_t t = params->tile;
  return ((h + t - 1) / t) * ((w + t - 1) / t);
}

void spn_tile_at(int32_t h, int32_t w, const spn_tile_params_t *params, int32_t k, spn_tile_rect_t *out) {
  int32_t t = params->tile, pad = params->tile_pad, cols = (w + t - 1) / t;
  spn_tile_rect_t r;
  r.y0 = (k / cols) * t;
  r.x0 = (k % cols) * t;
  r.y1 = r.y0 + t < h ? r.y0 + t : h;
  r.x1 = r.x0 + t < w ? r.x0 + t : w;
  r.py0 = r.y0 - pad > 0 ? r.y0 - pad : 0;
  r.py1 = r.y1 + pad < h ? r.y1 + pad : h;
  r.px0 = r.x0 - pad > 0 ? r.x0 - pad : 0;
  r.px1 = r.x1 + pad < w ? r.x1 + pad : w;
  *out = r;
}

int32_t spn_tile_run(const float *in, int32_t h, int32_t w, const spn_tile_params_t *params, spn_tile_fn fn,
                     void *user, float *out, spn_error_t *err) {
  if (!in || !out || !fn || !params)
    return spn_error_set(err, SPN_EINVAL, "tile: NULL argument");
  int32_t rc = spn_tile_check(h, w, params, err);
  if (rc != SPN_OK)
    return rc;
  const spn_tile_params_t p = *params;
  int32_t s = p.scale;
  int64_t maxp = (int64_t)(p.tile < h ? p.tile : h) + 2 * (int64_t)p.tile_pad;
  int64_t maxq = (int64_t)(p.tile < w ? p.tile : w) + 2 * (int64_t)p.tile_pad;
  if (maxp > h)
    maxp = h;
  if (maxq > w)
    maxq = w;
  float *tin = malloc((size_t)(p.channels * maxp * maxq) * sizeof *tin);
  float *tout = malloc((size_t)(p.out_channels * maxp * s * maxq * s) * sizeof *tout);
  if (!tin || !tout) {
    rc = spn_error_set(err, SPN_ENOMEM, "tile: out of memory");
    goto out;
  }
  size_t W = (size_t)w * s, HW = (size_t)h * s * W;
  for (int32_t k = 0, n = spn_tile_count(h, w, &p); k < n; k++) {
    spn_tile_rect_t r;
    spn_tile_at(h, w, &p, k, &r);
    int32_t th = r.py1 - r.py0, tw = r.px1 - r.px0;
    for (int32_t c = 0; c < p.channels; c++)
      for (int32_t y = 0; y < th; y++)
        memcpy(tin + ((size_t)c * th + y) * tw, in + ((size_t)c * h + r.py0 + y) * w + r.px0, (size_t)tw * sizeof *tin);
    if ((rc = fn(user, tin, p.channels, th, tw, tout, err)) != SPN_OK) {
      spn_error_prefix(err, "tile at (%d, %d)", r.x0, r.y0);
      goto out;
    }
    size_t ow = (size_t)tw * s, oh = (size_t)th * s;
    size_t oy = (size_t)(r.y0 - r.py0) * s, ox = (size_t)(r.x0 - r.px0) * s;
    size_t cw = (size_t)(r.x1 - r.x0) * s, ch = (size_t)(r.y1 - r.y0) * s;
    for (int32_t c = 0; c < p.out_channels; c++)
      for (size_t y = 0; y < ch; y++)
        memcpy(out + (size_t)c * HW + ((size_t)r.y0 * s + y) * W + (size_t)r.x0 * s,
               tout + ((size_t)c * oh + oy + y) * ow + ox, cw * sizeof *out);
  }
out:
  free(tin);
  free(tout);
  return rc;
}
