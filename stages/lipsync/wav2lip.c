/* wav2lip.c — Wav2Lip's crop, input packing, output paste and mel windows.
 *
 * Numbers follow the reference inference script, so a real Wav2Lip
 * checkpoint exported with tools/export/export.py sees what it was trained
 * on: the crop is resized in u8 with bilinear interpolation, divided by 255,
 * channels in BGR order, the lower half of the target zeroed; the output is
 * scaled by 255 and resized back in u8. Two deliberate differences: the
 * output is rounded instead of truncated, and it is blended with a feathered
 * mask instead of pasted hard (feather 0 gives Wav2Lip's hard paste).
 *
 * Temporaries are allocated per call (a 96×96 crop, the box-sized resize and
 * its mask); the network run dominates by orders of magnitude.
 */
#include "wav2lip.h"

#include <math.h>
#include <string.h>

static int32_t round_half_up(float v) { return (int32_t)floorf(v + 0.5f); }

bool spn_w2l_crop_rect(const spn_face_t *face, int32_t frame_w, int32_t frame_h, const spn_w2l_pads_t *pads,
                       spn_w2l_rect_t *rect) {
  static const spn_w2l_pads_t def = SPN_W2L_PADS_DEFAULT;
  if (!pads)
    pads = &def;
  memset(rect, 0, sizeof *rect);
  if (!face || frame_w <= 0 || frame_h <= 0)
    return false;
  /* Non-finite or absurd coordinates (a broken detector) give no crop
   * rather than an overflow in the conversion below. */
  const float lim = 1e8f;
  float c[4] = {face->x0, face->y0, face->x1, face->y1};
  for (int i = 0; i < 4; i++)
    if (!isfinite(c[i]) || c[i] < -lim || c[i] > lim)
      return false;
  int64_t x0 = (int64_t)round_half_up(c[0]) - pads->left;
  int64_t y0 = (int64_t)round_half_up(c[1]) - pads->top;
  int64_t x1 = (int64_t)round_half_up(c[2]) + pads->right;
  int64_t y1 = (int64_t)round_half_up(c[3]) + pads->bottom;
  if (x0 < 0)
    x0 = 0;
  if (y0 < 0)
    y0 = 0;
  if (x1 > frame_w)
    x1 = frame_w;
  if (y1 > frame_h)
    y1 = frame_h;
  if (x1 <= x0 || y1 <= y0)
    return false;
  rect->x = (int32_t)x0;
  rect->y = (int32_t)y0;
  rect->w = (int32_t)(x1 - x0);
  rect->h = (int32_t)(y1 - y0);
  return true;
}

int32_t spn_w2l_pick_face(const spn_face_t *faces, size_t n) {
  int32_t best = -1;
  double best_area = -1.0;
  for (size_t i = 0; i < n && i < INT32_MAX; i++) {
    double w = (double)faces[i].x1 - faces[i].x0, h = (double)faces[i].y1 - faces[i].y0;
    double area = (w > 0 && h > 0) ? w * h : 0.0;
    if (!isfinite(area))
      area = 0.0;
    if (area > best_area) {
      best_area = area;
      best = (int32_t)i;
    }
  }
  return best;
}

static bool rect_inside(const spn_image_t *img, const spn_w2l_rect_t *r) {
  return r->w > 0 && r->h > 0 && r->x >= 0 && r->y >= 0 && r->x <= img->width - r->w &&
         r->y <= img->height - r->h;
}

int32_t spn_w2l_prepare(const spn_image_t *frame, const spn_w2l_rect_t *rect, float *face6, spn_error_t *err) {
  if (!frame || frame->format != SPN_PIXFMT_RGB24)
    return spn_error_set(err, SPN_EINVAL, "wav2lip: the frame must be rgb24");
  if (!rect_inside(frame, rect))
    return spn_error_set(err, SPN_EINVAL, "wav2lip: crop %dx%d at (%d,%d) is not inside the %dx%d frame", rect->w,
                         rect->h, rect->x, rect->y, frame->width, frame->height);
  const int32_t S = SPN_W2L_SIZE;
  spn_image_t view = SPN_IMAGE_INIT, small = SPN_IMAGE_INIT, planar = SPN_IMAGE_INIT;
  int32_t rc = spn_image_crop(frame, rect->x, rect->y, rect->w, rect->h, &view, err);
  if (rc != SPN_OK)
    return rc;
  if ((rc = spn_image_alloc(&small, S, S, SPN_PIXFMT_RGB24, err)) != SPN_OK)
    return rc;
  if ((rc = spn_image_resize(&view, &small, SPN_INTERP_BILINEAR, err)) != SPN_OK)
    goto out_small;
  /* The reference half: channels 3..5 of (6,96,96), planes B,G,R. */
  float *ref = face6 + 3 * S * S;
  if ((rc = spn_image_wrap(&planar, ref, S, S, SPN_PIXFMT_BGRF32P, err)) != SPN_OK)
    goto out_small;
  const float scale[3] = {1.0f / 255.0f, 1.0f / 255.0f, 1.0f / 255.0f};
  if ((rc = spn_image_to_float(&small, &planar, NULL, scale, err)) != SPN_OK)
    goto out_small;
  /* The masked target: the same crop with its lower half (rows S/2..S-1)
   * zeroed, so the network must draw the mouth from the audio. */
  for (int32_t c = 0; c < 3; c++) {
    float *dst = face6 + (size_t)c * S * S;
    const float *src = ref + (size_t)c * S * S;
    memcpy(dst, src, (size_t)(S / 2) * S * sizeof *dst);
    memset(dst + (size_t)(S / 2) * S, 0, (size_t)(S - S / 2) * S * sizeof *dst);
  }
out_small:
  spn_image_release(&small);
  return rc;
}

int32_t spn_w2l_paste(spn_image_t *frame, const spn_w2l_rect_t *rect, const float *out3, float feather,
                      spn_error_t *err) {
  if (!frame || frame->format != SPN_PIXFMT_RGB24)
    return spn_error_set(err, SPN_EINVAL, "wav2lip: the frame must be rgb24");
  if (!rect_inside(frame, rect))
    return spn_error_set(err, SPN_EINVAL, "wav2lip: crop %dx%d at (%d,%d) is not inside the %dx%d frame", rect->w,
                         rect->h, rect->x, rect->y, frame->width, frame->height);
  if (!isfinite(feather))
    return spn_error_set(err, SPN_EINVAL, "wav2lip: feather width is not finite");
  const int32_t S = SPN_W2L_SIZE;
  spn_image_t planar = SPN_IMAGE_INIT, small = SPN_IMAGE_INIT, big = SPN_IMAGE_INIT, mask = SPN_IMAGE_INIT;
  /* ×255 here, then round: from_float's division by a scale of 1/255
   * (not exact in float) would turn 0.5 into 127.49998 and round it down. */
  int32_t rc = spn_image_alloc(&planar, S, S, SPN_PIXFMT_BGRF32P, err);
  if (rc != SPN_OK)
    return rc;
  for (int32_t c = 0; c < 3; c++)
    for (int32_t y = 0; y < S; y++) {
      float *row = (float *)(void *)(planar.data[c] + y * planar.stride[c]);
      const float *src = out3 + ((size_t)c * S + (size_t)y) * S;
      for (int32_t x = 0; x < S; x++) {
        /* Saturate here too, so a NaN from a broken model is 0, not UB. */
        float v = src[x] * 255.0f;
        row[x] = v > 0.0f ? (v < 255.0f ? v : 255.0f) : 0.0f;
      }
    }
  if ((rc = spn_image_alloc(&small, S, S, SPN_PIXFMT_RGB24, err)) != SPN_OK)
    goto out_planar;
  /* u8 = round(v) saturated, B,G,R planes to R,G,B pixels. */
  if ((rc = spn_image_from_float(&planar, &small, NULL, NULL, err)) != SPN_OK)
    goto out_small;
  if ((rc = spn_image_alloc(&big, rect->w, rect->h, SPN_PIXFMT_RGB24, err)) != SPN_OK)
    goto out_small;
  if ((rc = spn_image_resize(&small, &big, SPN_INTERP_BILINEAR, err)) != SPN_OK)
    goto out_big;
  const spn_image_t *m = NULL;
  if (feather > 0) {
    if ((rc = spn_image_alloc(&mask, rect->w, rect->h, SPN_PIXFMT_GRAYF32, err)) != SPN_OK)
      goto out_big;
    if ((rc = spn_image_feather_mask(&mask, feather, err)) != SPN_OK)
      goto out_mask;
    m = &mask;
  }
  rc = spn_image_paste(frame, &big, rect->x, rect->y, m, err);
out_mask:
  spn_image_release(&mask);
out_big:
  spn_image_release(&big);
out_small:
  spn_image_release(&small);
out_planar:
  spn_image_release(&planar);
  return rc;
}

int64_t spn_w2l_mel_start(int64_t i, double fps, int64_t n_frames) {
  if (n_frames < SPN_W2L_MEL_STEPS || !(fps > 0) || i < 0)
    return -1;
  double s = floor((double)i * (80.0 / fps));
  int64_t last = n_frames - SPN_W2L_MEL_STEPS;
  if (!(s < (double)last))
    return last;
  return (int64_t)s;
}

int64_t spn_w2l_mel_chunks(double fps, int64_t n_frames) {
  if (n_frames < SPN_W2L_MEL_STEPS || !(fps > 0))
    return 0;
  /* Count i with floor(i * 80/fps) + 16 <= n_frames, then the clamped one.
   * Windows start at multiples of 80/fps, so the count is near
   * (n_frames - 16) * fps / 80; step from just below and settle exactly. */
  double step = 80.0 / fps;
  int64_t last = n_frames - SPN_W2L_MEL_STEPS;
  int64_t i = (int64_t)((double)last / step);
  if (i > 0)
    i--;
  while (floor((double)i * step) <= (double)last)
    i++;
  while (i > 0 && floor((double)(i - 1) * step) > (double)last)
    i--;
  return i + 1;
}

int32_t spn_w2l_mel_chunk(const float *mel, int64_t n_frames, int64_t i, double fps, float *chunk,
                          spn_error_t *err) {
  int64_t start = spn_w2l_mel_start(i, fps, n_frames);
  if (start < 0)
    return spn_error_set(err, SPN_EINVAL, "wav2lip: no mel chunk %lld in %lld mel frames at %g fps", (long long)i,
                         (long long)n_frames, fps);
  for (int32_t m = 0; m < SPN_W2L_MEL_BINS; m++)
    memcpy(chunk + (size_t)m * SPN_W2L_MEL_STEPS, mel + (size_t)m * (size_t)n_frames + (size_t)start,
           SPN_W2L_MEL_STEPS * sizeof *chunk);
  return SPN_OK;
}
