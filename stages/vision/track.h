/* track.h — per-track face box smoothing.
 *
 * Wav2Lip steadies its face crops by averaging each frame's box with those of
 * the following frames (window T = 5). A pipeline sees several faces that come
 * and go, so boxes are first tied to tracks: each frame's detections are
 * matched to the live tracks by IoU (best pairs first, at least
 * iou_threshold), unmatched detections open new tracks, and a track that goes
 * unmatched for more than max_missed frames ends. A detection is reported
 * with its track id and the mean of its track's last (up to) `window` boxes,
 * the current one included — the causal form of Wav2Lip's window, usable on
 * a live stream. spn_box_smooth_sequence() is Wav2Lip's own, offline rule for
 * a whole clip.
 *
 * A smoother holds the state of one video stream; it is not thread-safe.
 */
#ifndef SPN_VISION_TRACK_H
#define SPN_VISION_TRACK_H

#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_box {
  float x0, y0, x1, y1;
} spn_box_t;

typedef struct spn_tracked_box {
  spn_box_t box;     /* smoothed */
  int64_t track_id;  /* >= 1, unique for the smoother's lifetime */
  int32_t history;   /* boxes averaged (1..window) */
} spn_tracked_box_t;

typedef struct spn_box_smoother_params {
  int32_t window;        /* boxes averaged per track, >= 1 (Wav2Lip: 5) */
  float iou_threshold;   /* minimum IoU to continue a track, (0, 1] */
  int32_t max_missed;    /* frames a track may go undetected before it ends, >= 0 */
} spn_box_smoother_params_t;

#define SPN_BOX_SMOOTHER_PARAMS_INIT {.window = 5, .iou_threshold = 0.3f, .max_missed = 2}

typedef struct spn_box_smoother spn_box_smoother_t;

/* Returns SPN_OK, SPN_EINVAL (bad params) or SPN_ENOMEM.
 * Ownership: caller owns *out (spn_box_smoother_free). Thread: any. */
int32_t spn_box_smoother_new(const spn_box_smoother_params_t *params, spn_box_smoother_t **out, spn_error_t *err);

/* NULL is allowed. */
void spn_box_smoother_free(spn_box_smoother_t *s);

/* Feed one frame's detections (n >= 0; boxes with x1 < x0 or y1 < y0 or
 * non-finite values are rejected with SPN_EINVAL and the state is left as it
 * was). out[i] receives detection i's track and smoothed box; out has room
 * for n entries.
 * Ownership: dets and out borrowed. Thread: one at a time per smoother. */
int32_t spn_box_smoother_update(spn_box_smoother_t *s, const spn_box_t *dets, int32_t n, spn_tracked_box_t *out,
                                spn_error_t *err);

/* Number of live tracks (matched recently enough). */
int32_t spn_box_smoother_tracks(const spn_box_smoother_t *s);

/* Wav2Lip's get_smoothened_boxes for one face over a whole clip, in place and
 * in order, exactly as the reference does on float boxes: box i becomes the
 * mean of boxes i .. i+T-1, or, once fewer than T remain, of the slice
 * boxes[n-T:] — which by then holds already smoothed boxes, and which Python
 * reads as boxes[2n-T:] (clamped at 0) when n < T. Returns SPN_OK or
 * SPN_EINVAL. Thread: any. */
int32_t spn_box_smooth_sequence(spn_box_t *boxes, int32_t n, int32_t window);

#ifdef __cplusplus
}
#endif
#endif
