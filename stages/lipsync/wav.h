/* wav.h — a small WAV reader and resampler for the melspec stage.
 *
 * Reads RIFF/WAVE files: PCM 8 (unsigned), 16, 24 and 32-bit integer,
 * IEEE float 32 and 64-bit, plain or WAVE_FORMAT_EXTENSIBLE, any channel
 * count, and returns mono float samples (the mean of the channels) scaled to
 * [-1, 1) as soundfile/librosa do (integers divided by 2^(bits-1)). A data
 * chunk that claims more bytes than the file holds (streamed WAVs write
 * 0xFFFFFFFF) is read up to the end of the file. Every refusal names the
 * file and the byte offset of the offending field.
 *
 * spn_audio_resample() converts the rate with a Kaiser-windowed sinc
 * (cut-off at the lower Nyquist frequency, 32 zero crossings a side), what
 * the mel features need from 44.1/48 kHz sources: Wav2Lip loads its audio at
 * 16 kHz. Thread: every function is reentrant.
 */
#ifndef SPN_LIPSYNC_WAV_H
#define SPN_LIPSYNC_WAV_H

#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

typedef struct spn_wav {
  int32_t sample_rate;
  int32_t channels;   /* of the file; samples are mono */
  int32_t bits;       /* per sample, of the file */
  int64_t n;          /* mono samples */
  float *samples;     /* owned; spn_wav_release frees it */
} spn_wav_t;

/* Parse a WAV held in memory; `name` is used in messages. Ownership: *out
 * owns its samples (spn_wav_release). Thread: any. */
int32_t spn_wav_parse(const uint8_t *data, size_t len, const char *name, spn_wav_t *out, spn_error_t *err);
/* Read and parse a file. */
int32_t spn_wav_read(const char *path, spn_wav_t *out, spn_error_t *err);
void spn_wav_release(spn_wav_t *w);

/* Resample n samples from in_rate to out_rate into a new array *out of
 * *n_out = floor(n * out_rate / in_rate) samples (a copy when the rates are
 * equal). Ownership: caller frees *out. Thread: any. */
int32_t spn_audio_resample(const float *in, int64_t n, int32_t in_rate, int32_t out_rate, float **out,
                           int64_t *n_out, spn_error_t *err);

#endif
