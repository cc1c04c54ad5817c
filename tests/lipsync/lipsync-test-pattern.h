/* lipsync-test-pattern.h — the frames, face boxes and mel chunks the
 * lipsync end-to-end test feeds (tests/lipsync/lipsync-test-plugin.c), shared
 * with the checker (test-lipsync-stage.c) so it can recompute every input
 * pixel. Frame pixel (x, y, c) of frame `seq` of a job with `seed`; the face
 * box is fixed; every 4th frame (seq % 4 == 3) has an empty "faces" item. */
#ifndef LIPSYNC_TEST_PATTERN_H
#define LIPSYNC_TEST_PATTERN_H
#include <stdint.h>

#define LT_W 160
#define LT_H 120
#define LT_BOX_X0 40.0f
#define LT_BOX_Y0 30.0f
#define LT_BOX_X1 100.0f
#define LT_BOX_Y1 80.0f

static inline uint8_t lt_pixel(int64_t seed, uint64_t seq, int32_t x, int32_t y, int32_t c) {
  return (uint8_t)((x * 3 + y * 5 + c * 70 + seed * 37 + (int64_t)seq * 11) % 256);
}

static inline int lt_has_face(uint64_t seq) { return seq % 4 != 3; }

/* Mel value at (bin, step) of chunk `seq`: in [-4, 0], as log-mel features
 * are, with a level that moves from chunk to chunk (so the test network,
 * which sees the chunk's mean, draws a different mouth for each). */
static inline float lt_mel(int64_t seed, uint64_t seq, int32_t bin, int32_t step) {
  return -4.0f + (float)((bin * 7 + step * 3 + seed * 11 + (int64_t)seq * 5) % 21) / 10.0f +
         0.5f * (float)((seed * 3 + (int64_t)seq) % 5);
}

/* lt_mel's "windows" and "spectrogram" modes: the job's chunks are cut, as
 * Wav2Lip cuts them at 25 fps, from one spectrogram of lt_spec_cols(count)
 * columns, the last window clamped to its end by one column. Value at (bin,
 * col), in [-4, 0] with a level that drifts along the columns. */
static inline int64_t lt_spec_cols(int64_t chunks) {
  return chunks < 2 ? 16 : (int64_t)((double)(chunks - 1) * (80.0 / 25.0)) + 15;
}
static inline float lt_spec(int64_t seed, int32_t bin, int64_t col) {
  return -4.0f + (float)((bin * 7 + col * 3 + seed * 11) % 21) / 10.0f + 0.1f * (float)((col / 4 + seed) % 13);
}
/* Where chunk i starts: Wav2Lip's int(i * 80/fps), the last window of the
 * spectrogram beyond it. */
static inline int64_t lt_spec_start(int64_t i, int64_t cols) {
  int64_t s = (int64_t)((double)i * (80.0 / 25.0));
  return s + 16 > cols ? cols - 16 : s;
}
#endif
