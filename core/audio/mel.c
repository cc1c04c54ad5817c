/* mel.c — Wav2Lip's mel spectrogram on FFTW (see spindle/audio.h).
 *
 * The filterbank and window are built in double precision and stored as
 * float; the STFT runs in single precision (fftwf r2c), magnitudes and mel
 * sums accumulate in double. Each spn_mel_t owns its plan and its aligned
 * buffers, so contexts are independent; only plan creation and destruction
 * touch FFTW's process-wide planner and are serialised (see audio.h).
 */
#include "spindle/audio.h"

#include <fftw3.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* From libfftw3f_threads (FFTW >= 3.3.5); declared in fftw3.h on recent
 * versions, declared here too in case the header is older. */
void fftwf_make_planner_thread_safe(void);

struct spn_mel {
  spn_mel_params_t p;
  int32_t n_bins;        /* n_fft / 2 + 1 */
  float *window;         /* n_fft, the win-long Hann centred, zeros around */
  float *fbank;          /* (n_mels, n_bins) */
  int32_t *band_lo;      /* first non-zero bin of each band */
  int32_t *band_hi;      /* one past the last non-zero bin */
  float *frame;          /* fftwf_malloc'd n_fft */
  fftwf_complex *spec;   /* fftwf_malloc'd n_bins */
  fftwf_plan plan;
  pthread_mutex_t *plan_lock;
};

/* Slaney mel scale (librosa htk=False): linear below 1 kHz, log above. */
static double hz_to_mel(double f) {
  const double f_sp = 200.0 / 3.0, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
  const double logstep = log(6.4) / 27.0;
  if (f >= min_log_hz)
    return min_log_mel + log(f / min_log_hz) / logstep;
  return f / f_sp;
}

static double mel_to_hz(double m) {
  const double f_sp = 200.0 / 3.0, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
  const double logstep = log(6.4) / 27.0;
  if (m >= min_log_mel)
    return min_log_hz * exp(logstep * (m - min_log_mel));
  return f_sp * m;
}

static int build_filterbank(spn_mel_t *mel) {
  const spn_mel_params_t *p = &mel->p;
  int32_t nm = p->n_mels, nb = mel->n_bins;
  double *pts = malloc(sizeof(double) * (size_t)(nm + 2));
  if (!pts)
    return -1;
  double mlo = hz_to_mel(p->fmin), mhi = hz_to_mel(p->fmax);
  for (int32_t i = 0; i < nm + 2; i++)
    pts[i] = mel_to_hz(mlo + (mhi - mlo) * i / (nm + 1));
  for (int32_t m = 0; m < nm; m++) {
    double lo = pts[m], ce = pts[m + 1], hi = pts[m + 2];
    double enorm = 2.0 / (hi - lo);
    mel->band_lo[m] = nb;
    mel->band_hi[m] = 0;
    for (int32_t k = 0; k < nb; k++) {
      double f = (double)k * p->sample_rate / p->n_fft;
      double up = (f - lo) / (ce - lo), down = (hi - f) / (hi - ce);
      double w = up < down ? up : down;
      if (w < 0)
        w = 0;
      mel->fbank[(size_t)m * nb + k] = (float)(w * enorm);
      if (w > 0) {
        if (k < mel->band_lo[m])
          mel->band_lo[m] = k;
        mel->band_hi[m] = k + 1;
      }
    }
    if (mel->band_hi[m] == 0)
      mel->band_lo[m] = 0;
  }
  free(pts);
  return 0;
}

int32_t spn_mel_new(const spn_mel_params_t *params, pthread_mutex_t *plan_lock, spn_mel_t **out,
                    spn_error_t *err) {
  static const spn_mel_params_t wav2lip = SPN_MEL_PARAMS_WAV2LIP;
  const spn_mel_params_t *p = params ? params : &wav2lip;
  *out = NULL;
  if (p->sample_rate <= 0 || p->n_fft < 4 || p->n_fft > (1 << 20) || p->hop <= 0 || p->win <= 0 ||
      p->win > p->n_fft || p->n_mels <= 0 || p->n_mels > 1024 || !(p->fmin >= 0) ||
      !(p->fmax > p->fmin) || p->fmax > p->sample_rate / 2.0f)
    return spn_error_set(err, SPN_EINVAL,
                         "mel: invalid parameters (rate %d, n_fft %d, hop %d, win %d, mels %d, %g-%g Hz)",
                         (int)p->sample_rate, (int)p->n_fft, (int)p->hop, (int)p->win, (int)p->n_mels,
                         (double)p->fmin, (double)p->fmax);
  spn_mel_t *mel = calloc(1, sizeof *mel);
  if (!mel)
    return spn_error_set(err, SPN_ENOMEM, "mel: out of memory");
  int32_t rc = SPN_OK;
  mel->p = *p;
  mel->n_bins = p->n_fft / 2 + 1;
  mel->plan_lock = plan_lock;
  mel->window = calloc((size_t)p->n_fft, sizeof(float));
  mel->fbank = calloc((size_t)p->n_mels * (size_t)mel->n_bins, sizeof(float));
  mel->band_lo = calloc((size_t)p->n_mels, sizeof(int32_t));
  mel->band_hi = calloc((size_t)p->n_mels, sizeof(int32_t));
  mel->frame = fftwf_malloc(sizeof(float) * (size_t)p->n_fft);
  mel->spec = fftwf_malloc(sizeof(fftwf_complex) * (size_t)mel->n_bins);
  if (!mel->window || !mel->fbank || !mel->band_lo || !mel->band_hi || !mel->frame || !mel->spec ||
      build_filterbank(mel)) {
    rc = spn_error_set(err, SPN_ENOMEM, "mel: out of memory");
    goto out_free;
  }
  /* periodic Hann of length win, centred in the n_fft frame (librosa pads
   * a shorter window with zeros on both sides) */
  int32_t off = (p->n_fft - p->win) / 2;
  for (int32_t n = 0; n < p->win; n++)
    mel->window[off + n] = (float)(0.5 - 0.5 * cos(2.0 * M_PI * n / p->win));

  fftwf_make_planner_thread_safe();
  if (plan_lock)
    pthread_mutex_lock(plan_lock);
  /* FFTW_ESTIMATE: no measuring, deterministic plans, fast creation. */
  mel->plan = fftwf_plan_dft_r2c_1d(p->n_fft, mel->frame, mel->spec, FFTW_ESTIMATE);
  if (plan_lock)
    pthread_mutex_unlock(plan_lock);
  if (!mel->plan) {
    rc = spn_error_set(err, SPN_EINTERNAL, "mel: FFTW could not plan a %d-point transform", (int)p->n_fft);
    goto out_free;
  }
  *out = mel;
  return SPN_OK;
out_free:
  spn_mel_free(&mel);
  return rc;
}

void spn_mel_free(spn_mel_t **melp) {
  spn_mel_t *mel = *melp;
  if (!mel)
    return;
  *melp = NULL;
  if (mel->plan) {
    if (mel->plan_lock)
      pthread_mutex_lock(mel->plan_lock);
    fftwf_destroy_plan(mel->plan);
    if (mel->plan_lock)
      pthread_mutex_unlock(mel->plan_lock);
  }
  fftwf_free(mel->frame);
  fftwf_free(mel->spec);
  free(mel->window);
  free(mel->fbank);
  free(mel->band_lo);
  free(mel->band_hi);
  free(mel);
}

int64_t spn_mel_frames(const spn_mel_t *mel, int64_t n_samples) {
  return n_samples < 0 ? 0 : 1 + n_samples / mel->p.hop;
}

const float *spn_mel_filterbank(const spn_mel_t *mel) {
  return mel->fbank;
}

/* Sample t of the pre-emphasised signal extended by reflection:
 * index -k maps to k and n-1+k maps to n-1-k (numpy 'reflect'). */
static inline float padded(const float *x, int64_t n, int64_t t, float pre) {
  if (t < 0)
    t = -t;
  if (t >= n)
    t = 2 * (n - 1) - t;
  float v = x[t];
  return t > 0 ? v - pre * x[t - 1] : v;
}

int32_t spn_mel_compute(spn_mel_t *mel, const float *samples, int64_t n_samples, float *out,
                        spn_error_t *err) {
  const spn_mel_params_t *p = &mel->p;
  int32_t half = p->n_fft / 2;
  if (n_samples <= half)
    return spn_error_set(err, SPN_EINVAL,
                         "mel: %lld samples is too short (reflection padding needs more than %d)",
                         (long long)n_samples, (int)half);
  int64_t frames = spn_mel_frames(mel, n_samples);
  int32_t nb = mel->n_bins;
  double *mag = malloc(sizeof(double) * (size_t)nb);
  if (!mag)
    return spn_error_set(err, SPN_ENOMEM, "mel: out of memory");
  for (int64_t f = 0; f < frames; f++) {
    int64_t t0 = f * p->hop - half;
    for (int32_t n = 0; n < p->n_fft; n++)
      mel->frame[n] = padded(samples, n_samples, t0 + n, p->preemphasis) * mel->window[n];
    fftwf_execute(mel->plan);
    for (int32_t k = 0; k < nb; k++) {
      double re = mel->spec[k][0], im = mel->spec[k][1];
      mag[k] = sqrt(re * re + im * im);
    }
    for (int32_t m = 0; m < p->n_mels; m++) {
      const float *w = mel->fbank + (size_t)m * nb;
      double s = 0.0;
      for (int32_t k = mel->band_lo[m]; k < mel->band_hi[m]; k++)
        s += (double)w[k] * mag[k];
      /* 20 log10(max(1e-5, M)) - 20, normalised to [-4, 4] */
      double db = 20.0 * log10(s > 1e-5 ? s : 1e-5) - 20.0;
      double v = 8.0 * (db + 100.0) / 100.0 - 4.0;
      v = v < -4.0 ? -4.0 : (v > 4.0 ? 4.0 : v);
      out[(size_t)m * frames + f] = (float)v;
    }
  }
  free(mag);
  return SPN_OK;
}

int64_t spn_mel_chunk_start(int64_t frame_index, int32_t fps_num, int32_t fps_den) {
  /* exact integer arithmetic: floor(i * 80 / (num / den)) */
  return (frame_index * 80 * (int64_t)fps_den) / fps_num;
}

int32_t spn_mel_chunk(const float *mel, int32_t n_mels, int64_t frames, int64_t frame_index,
                      int32_t fps_num, int32_t fps_den, float *chunk, spn_error_t *err) {
  if (fps_num <= 0 || fps_den <= 0)
    return spn_error_set(err, SPN_EINVAL, "mel: invalid frame rate %d/%d", (int)fps_num, (int)fps_den);
  if (frames < SPN_MEL_CHUNK)
    return spn_error_set(err, SPN_EINVAL, "mel: %lld mel frames is fewer than one chunk of %d",
                         (long long)frames, SPN_MEL_CHUNK);
  if (frame_index < 0)
    return spn_error_set(err, SPN_EINVAL, "mel: negative frame index %lld", (long long)frame_index);
  int64_t start = spn_mel_chunk_start(frame_index, fps_num, fps_den);
  if (start + SPN_MEL_CHUNK > frames)
    start = frames - SPN_MEL_CHUNK;
  for (int32_t m = 0; m < n_mels; m++)
    memcpy(chunk + (size_t)m * SPN_MEL_CHUNK, mel + (size_t)m * frames + start, sizeof(float) * SPN_MEL_CHUNK);
  return SPN_OK;
}
