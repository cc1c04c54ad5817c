/* pattern.h — the synthetic frame pattern shared by the `synth` source and
 * the `check` sink (and the tests), so a sink can prove every byte arrived
 * as produced. A pure function of (job, seq, x, y, channel): two jobs or two
 * frames never look alike, and nothing needs to be stored to verify one. */
#ifndef SPINDLE_STAGES_PATTERN_H
#define SPINDLE_STAGES_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static inline uint8_t spn_synth_pixel(uint64_t job_id, uint64_t seq, int64_t x, int64_t y, int64_t c) {
  uint64_t v = job_id * 131u + seq * 7u + (uint64_t)y * 3u + (uint64_t)x + (uint64_t)c * 85u;
  return (uint8_t)(v ^ (v >> 8));
}

/* Fill an (H,W,C) u8 frame. */
static inline void spn_synth_fill(uint8_t *p, uint64_t job_id, uint64_t seq, int64_t w, int64_t h, int64_t ch) {
  for (int64_t y = 0; y < h; y++)
    for (int64_t x = 0; x < w; x++)
      for (int64_t c = 0; c < ch; c++)
        *p++ = spn_synth_pixel(job_id, seq, x, y, c);
}

/* Index of the first byte that differs from the pattern, or -1. */
static inline int64_t spn_synth_verify(const uint8_t *p, uint64_t job_id, uint64_t seq, int64_t w, int64_t h,
                                       int64_t ch) {
  int64_t i = 0;
  for (int64_t y = 0; y < h; y++)
    for (int64_t x = 0; x < w; x++)
      for (int64_t c = 0; c < ch; c++, i++)
        if (p[i] != spn_synth_pixel(job_id, seq, x, y, c))
          return i;
  return -1;
}

/* Channels of a synth format name, 0 if unknown. */
static inline int64_t spn_synth_channels(const char *format) {
  if (!format)
    return 0;
  const char *names[] = {"rgb24", "gray8", "rgba32"};
  const int64_t ch[] = {3, 1, 4};
  for (size_t i = 0; i < 3; i++) {
    const char *a = names[i], *b = format;
    while (*a && *a == *b)
      a++, b++;
    if (!*a && !*b)
      return ch[i];
  }
  return 0;
}

#endif
