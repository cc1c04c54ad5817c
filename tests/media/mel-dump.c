/* mel-dump.c — compute the Wav2Lip mel spectrogram of raw float32 samples.
 * Used by test-mel.py, which compares the output with its own NumPy
 * reference. Usage: mel-dump IN.f32 OUT.f32  (OUT: (80, frames) float32) */
#include <stdio.h>
#include <stdlib.h>

#include "spindle/audio.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s IN.f32 OUT.f32\n", argv[0]);
    return 2;
  }
  int rc = 1;
  float *x = NULL, *out = NULL;
  spn_mel_t *mel = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f);
  fseek(f, 0, SEEK_SET);
  int64_t n = bytes / (long)sizeof(float);
  x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!x || fread(x, sizeof(float), (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "%s: short read\n", argv[1]);
    goto out;
  }
  if (spn_mel_new(NULL, NULL, &mel, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    goto out;
  }
  int64_t frames = spn_mel_frames(mel, n);
  out = malloc(sizeof(float) * 80 * (size_t)frames);
  if (!out || spn_mel_compute(mel, x, n, out, &err)) {
    fprintf(stderr, "%s: %s\n", argv[1], err.msg);
    goto out;
  }
  FILE *o = fopen(argv[2], "wb");
  if (!o || fwrite(out, sizeof(float), 80 * (size_t)frames, o) != 80 * (size_t)frames) {
    perror(argv[2]);
    if (o)
      fclose(o);
    goto out;
  }
  fclose(o);
  rc = 0;
out:
  fclose(f);
  spn_mel_free(&mel);
  free(x);
  free(out);
  return rc;
}
