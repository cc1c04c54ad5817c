/* wav2lip.h — Wav2Lip's pre- and post-processing on CPU frames.
 *
 * The lipsync stage runs a Wav2Lip network on 96×96 face crops. This module
 * is the plain-C part around the network, testable without a model:
 *
 *   crop rect   the face box, grown by the pads (Wav2Lip's --pads: top,
 *               bottom, left, right; default 0 10 0 0), rounded to whole
 *               pixels and clamped to the frame;
 *   prepare     crop → 96×96 (bilinear, u8) → the network's face input
 *               (6,96,96) float in [0,1], BGR channel order (the exported
 *               network was trained on OpenCV images): channels 0..2 the crop
 *               with rows 48..95 zeroed (the masked target), channels 3..5
 *               the whole crop (the reference);
 *   paste       the network's output (3,96,96) BGR in [0,1] → ×255 rounded
 *               to u8 → resized to the crop's size → blended into the frame
 *               over the crop rectangle with a feathered mask (alpha falls
 *               linearly to 0 over `feather` pixels at the crop's edges;
 *               Wav2Lip pastes hard, which leaves a visible seam).
 *
 * Frames are RGB24 (H,W,3) views (spindle/image.h). Built into the lipsync
 * plugin and its tests as part of the static library spn-lipsync.
 * Thread: every function is reentrant.
 */
#ifndef SPN_LIPSYNC_WAV2LIP_H
#define SPN_LIPSYNC_WAV2LIP_H

#include <stdbool.h>
#include <stdint.h>

#include "spindle/image.h"
#include "spindle/plugin.h"

#define SPN_W2L_SIZE 96     /* face crop side */
#define SPN_W2L_MEL_BINS 80 /* mel chunk (1,80,16) */
#define SPN_W2L_MEL_STEPS 16
#define SPN_W2L_FACE_FLOATS (6 * SPN_W2L_SIZE * SPN_W2L_SIZE)
#define SPN_W2L_OUT_FLOATS (3 * SPN_W2L_SIZE * SPN_W2L_SIZE)
#define SPN_W2L_MEL_FLOATS (SPN_W2L_MEL_BINS * SPN_W2L_MEL_STEPS)

/* Wav2Lip's --pads order. */
typedef struct spn_w2l_pads {
  int32_t top, bottom, left, right;
} spn_w2l_pads_t;

#define SPN_W2L_PADS_DEFAULT {0, 10, 0, 0}

/* A crop rectangle in frame pixels. */
typedef struct spn_w2l_rect {
  int32_t x, y, w, h;
} spn_w2l_rect_t;

/* The crop of `face` in a frame_w × frame_h frame: box corners rounded to
 * the nearest pixel (halves up), grown by the pads, clamped to the frame:
 *   x = max(0, round(x0) - left),  x_end = min(frame_w, round(x1) + right)
 *   y = max(0, round(y0) - top),   y_end = min(frame_h, round(y1) + bottom)
 * Returns false (and a zero rect) when nothing of it is left inside the
 * frame or a coordinate is not finite. Thread: any. */
bool spn_w2l_crop_rect(const spn_face_t *face, int32_t frame_w, int32_t frame_h, const spn_w2l_pads_t *pads,
                       spn_w2l_rect_t *rect);

/* The face to lip-sync among n: the largest box by area (the first of
 * equals); -1 when n is 0. Wav2Lip syncs one face per frame. */
int32_t spn_w2l_pick_face(const spn_face_t *faces, size_t n);

/* Fill `face6` (SPN_W2L_FACE_FLOATS floats, (6,96,96)) from the crop `rect`
 * of `frame` (RGB24; rect inside it). Ownership: borrowed. Thread: any. */
int32_t spn_w2l_prepare(const spn_image_t *frame, const spn_w2l_rect_t *rect, float *face6, spn_error_t *err);

/* Blend the network output `out3` (SPN_W2L_OUT_FLOATS floats, (3,96,96),
 * BGR in [0,1]; values outside are saturated) into `frame` (RGB24) over
 * `rect` with a mask feathered over `feather` pixels (<= 0: hard paste).
 * Ownership: borrowed. Thread: any. */
int32_t spn_w2l_paste(spn_image_t *frame, const spn_w2l_rect_t *rect, const float *out3, float feather,
                      spn_error_t *err);

#ifdef SPN_LIPSYNC_CUDA
/* GPU twins (wav2lip-cuda.c, built with CUDA): the same steps on device
 * memory, queued on `stream` (a cudaStream_t), nothing waited for. frame is
 * an RGB24 view of device memory; face6/out3 device floats as above.
 * Scratch (device memory, the caller's): `small` 96*96*3 bytes; for paste
 * `big` rect->w*rect->h*3 bytes and `mask` rect->w*rect->h floats, reused
 * from call to call in stream order. Errors as the CPU functions', plus
 * SPN_ECUDA for a launch or copy that failed. Thread: the stream's device
 * current. */
int32_t spn_w2l_prepare_cuda(const spn_image_t *frame, const spn_w2l_rect_t *rect, float *face6, uint8_t *small,
                             void *stream, spn_error_t *err);
int32_t spn_w2l_paste_cuda(spn_image_t *frame, const spn_w2l_rect_t *rect, const float *out3, float feather,
                           uint8_t *small, uint8_t *big, float *mask, void *stream, spn_error_t *err);

/* One batch row for spn_w2l_mel_gather_cuda: the chunk of video frame i at
 * fps, as spn_w2l_mel_chunk cuts it, out of a job's whole spectrogram held
 * in device memory. */
typedef struct spn_w2l_mel_src {
  const float *mel; /* (80, n_frames) row-major, device memory */
  int64_t n_frames;
  double fps;
  int64_t i;   /* the video frame (its envelope's seq) */
  int32_t row; /* the batch row it fills */
} spn_w2l_mel_src_t;

/* The twin of spn_w2l_mel_chunk for a batch: fills row src[k].row of
 * `batch` ((n_rows,1,80,16) device floats) with chunk src[k].i of its
 * spectrogram, for k < n, by gather kernels (cuda/kernels/mel.cuh) whose
 * window table travels in their parameters: nothing is uploaded. Rows no
 * source names are left as they are. SPN_EINVAL, with nothing queued, when
 * a source has no such chunk (spn_w2l_mel_start is -1) or names a row
 * outside the batch; SPN_ECUDA for a failed launch. Thread: the stream's
 * device current. */
int32_t spn_w2l_mel_gather_cuda(float *batch, int32_t n_rows, const spn_w2l_mel_src_t *src, size_t n, void *stream,
                                spn_error_t *err);
#endif

/* The audio window of video frame i at `fps` in a mel spectrogram of
 * n_frames columns (80 per second, Wav2Lip's hop of 200 samples at 16 kHz):
 * start = floor(i * 80 / fps), clamped to n_frames - 16 (the last window of
 * the audio). Returns -1 when the spectrogram has fewer than 16 columns. */
int64_t spn_w2l_mel_start(int64_t i, double fps, int64_t n_frames);
/* How many chunks Wav2Lip cuts from n_frames columns: windows start at
 * floor(i*80/fps) while start + 16 <= n_frames, plus one final window
 * clamped to the end (Wav2Lip's loop appends mel[:, -16:] and stops).
 * 0 when n_frames < 16. */
int64_t spn_w2l_mel_chunks(double fps, int64_t n_frames);

/* Copy the 80×16 chunk of video frame i (start from spn_w2l_mel_start) out
 * of an (80, n_frames) row-major spectrogram into chunk (80*16 floats,
 * row-major). SPN_EINVAL when n_frames < 16 or i < 0. Thread: any. */
int32_t spn_w2l_mel_chunk(const float *mel, int64_t n_frames, int64_t i, double fps, float *chunk,
                          spn_error_t *err);

/* A job's whole spectrogram beside its chunks. melspec adds to the first
 * message of a job's mel stream (seq 0), next to its "mel" chunk, a tensor
 * item SPN_W2L_SPEC_ITEM, (80, n_frames) f32 in host memory, and a meta item
 * SPN_W2L_SPEC_FPS_ITEM, the fps its chunks were cut at (one double): chunk
 * i is spn_w2l_mel_chunk(spec, n_frames, first + i, fps), and the stream's
 * total is spn_w2l_mel_chunks(fps, n_frames) - first, where `first` is the
 * meta item SPN_W2L_SPEC_FIRST_ITEM (one int64; absent: 0): the chunk of
 * the job's first frame in the whole speech, for a job cut at a start
 * (melspec's `start`, a segment). lipsync on a GPU uploads it once per
 * job and cuts every chunk there; the chunks are still sent and remain what
 * the port promises (the CPU ignores the spectrogram). Only spectrograms of
 * at most SPN_W2L_SPEC_MAX_BYTES are attached, or taken: 16 MiB is 52428
 * columns, 655 s of audio (25.6 KB a second); beyond it, or without the
 * items, lipsync uploads each chunk with its batch. */
#define SPN_W2L_SPEC_ITEM "melspec"
#define SPN_W2L_SPEC_FPS_ITEM "melspec_fps"
#define SPN_W2L_SPEC_FIRST_ITEM "melspec_first"
#define SPN_W2L_SPEC_MAX_BYTES ((size_t)16 << 20)

#endif
