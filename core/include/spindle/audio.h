/* spindle/audio.h — audio features: the Wav2Lip mel spectrogram.
 *
 * Built as the PIC static library `spn-audio` (FFTW single precision) that
 * the lipsync stage links into itself; it uses no libspindle symbol.
 *
 * The spectrogram is Wav2Lip's (its audio.py with hparams.py defaults),
 * written out so that no Python is needed to reproduce it:
 *   1. x: mono float samples at 16 kHz (nominally in [-1, 1]).
 *   2. pre-emphasis: y[0] = x[0], y[n] = x[n] - 0.97 x[n-1].
 *   3. centred STFT: y padded by n_fft/2 = 400 samples on each side by
 *      reflection (y[-k] = y[k], no edge repeat), frames of n_fft = 800
 *      samples every hop = 200 samples, so frames = 1 + len(x) / 200
 *      (integer division); window: periodic Hann of 800,
 *      w[n] = 0.5 - 0.5 cos(2 pi n / 800); |rfft| → 401 bins.
 *   4. mel: 80 triangular filters, Slaney mel scale (linear below 1 kHz,
 *      f_mel = 3 f / 200; logarithmic above, 27 / ln 6.4 mel per e-fold) on
 *      82 points evenly spaced in mel between 55 and 7600 Hz; each filter
 *      scaled by 2 / (f[i+2] - f[i]) (Slaney area normalisation). Equal to
 *      librosa.filters.mel(sr=16000, n_fft=800, n_mels=80, fmin=55,
 *      fmax=7600, htk=False, norm='slaney').
 *   5. level: S = 20 log10(max(1e-5, M)) - 20, then
 *      out = clip(8 (S + 100) / 100 - 4, -4, 4)
 *      which is the same as clip(1.6 log10(max(1e-5, M)) + 2.4, -4, 4).
 * The result is (n_mels, frames), mel-major (row m holds band m over time),
 * as Wav2Lip's melspectrogram() returns it.
 *
 * Video frame i of a clip at `fps` gets the 80×16 chunk starting at column
 * floor(i * 80 / fps) (80 mel frames per second at hop 200 and 16 kHz); a
 * chunk that would run past the end is taken from the last 16 columns.
 *
 * FFTW and threads: executing a plan is thread-safe, creating one is not
 * (FFTW's planner has process-wide state, shared by every library in the
 * process that uses FFTW, not only by this one). spn_mel_new() therefore
 * (a) asks FFTW to serialise its own planner (fftwf_make_planner_thread_safe,
 * which protects planner calls made anywhere in the process, including by
 * code we do not control), and (b) also holds the caller's `plan_lock`
 * while planning when one is given, for hosts that prefer one explicit lock
 * around all FFTW planning. Plans live in the spn_mel_t, never in globals,
 * so two pipelines never share one; a spn_mel_t is used by one thread at a
 * time.
 */
#ifndef SPINDLE_AUDIO_H
#define SPINDLE_AUDIO_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_mel_params {
  int32_t sample_rate;  /* 16000 */
  int32_t n_fft;        /* 800 */
  int32_t hop;          /* 200 */
  int32_t win;          /* 800 (<= n_fft; centred in the frame) */
  int32_t n_mels;       /* 80 */
  float fmin;           /* 55 */
  float fmax;           /* 7600 */
  float preemphasis;    /* 0.97; 0 disables */
} spn_mel_params_t;

/* Wav2Lip's parameters. */
#define SPN_MEL_PARAMS_WAV2LIP {16000, 800, 200, 800, 80, 55.0f, 7600.0f, 0.97f}

typedef struct spn_mel spn_mel_t;

/* Create a mel context (filterbank, window, FFTW plan and buffers).
 * params NULL = Wav2Lip's. plan_lock: optional mutex held while FFTW plans
 * (see above). Ownership: caller owns *out (spn_mel_free). Thread: any. */
int32_t spn_mel_new(const spn_mel_params_t *params, pthread_mutex_t *plan_lock, spn_mel_t **out,
                    spn_error_t *err);
/* Free the context and set *mel to NULL (a NULL *mel is ignored).
 * Ownership: consumes *mel. Thread: any, once no spn_mel_compute on it runs. */
void spn_mel_free(spn_mel_t **mel);

/* Number of STFT frames for n samples: 1 + n / hop. */
int64_t spn_mel_frames(const spn_mel_t *mel, int64_t n_samples);

/* The filterbank, (n_mels, n_fft/2 + 1) row-major. Ownership: borrowed,
 * valid until spn_mel_free. */
const float *spn_mel_filterbank(const spn_mel_t *mel);

/* Compute the normalised mel spectrogram of n_samples (>= 2 for the
 * reflection padding; n_samples > n_fft/2 as librosa requires) into out,
 * which holds n_mels * spn_mel_frames() floats, (n_mels, frames) row-major.
 * Thread: the thread that uses this mel context. */
int32_t spn_mel_compute(spn_mel_t *mel, const float *samples, int64_t n_samples, float *out,
                        spn_error_t *err);

/* Copy the (n_mels, 16) chunk for video frame `frame_index` at fps
 * (fps_num / fps_den) out of a (n_mels, frames) spectrogram into chunk
 * (n_mels * 16 floats, row-major). Needs frames >= 16. */
#define SPN_MEL_CHUNK 16
int32_t spn_mel_chunk(const float *mel, int32_t n_mels, int64_t frames, int64_t frame_index,
                      int32_t fps_num, int32_t fps_den, float *chunk, spn_error_t *err);

/* First column of that chunk (before clamping): floor(i * 80 * den / num). */
int64_t spn_mel_chunk_start(int64_t frame_index, int32_t fps_num, int32_t fps_den);

#ifdef __cplusplus
}
#endif
#endif
