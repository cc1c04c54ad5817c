/* stage-melspec.c — `melspec`, Wav2Lip mel chunks from a job's audio file.
 *
 * A source. For each job it reads the per-job `path` (a WAV file: see wav.h
 * for the formats), mixes it to mono, resamples it to 16 kHz, computes
 * Wav2Lip's mel spectrogram (spindle/audio.h) and then emits, one per
 * generate() call, the 80×16 chunk of each video frame at `fps`: chunk i
 * starts at mel column floor(i * 80 / fps); Wav2Lip's loop decides how many
 * there are (windows while they fit, then one last window clamped to the
 * end). Each message carries a tensor item "mel" (1,80,16) f32 and the
 * envelope's total is the chunk count, so `lipsync` knows from the first
 * chunk where the audio ends.
 *
 * The whole file is decoded in job_open (a WAV of an hour is about 115 MB as
 * 16 kHz floats plus 92 MB of spectrogram): simple and exact, at the price of
 * holding one job's audio features in memory. One spn_mel_t (FFTW plan and
 * buffers) per instance; an instance's callbacks never run concurrently.
 */
#include <stdlib.h>
#include <string.h>

#include "spindle/audio.h"
#include "spindle/plugin.h"
#include "wav.h"
#include "wav2lip.h"


#define MS_RATE 16000

typedef struct ms_config {
  char *path;
  double fps;
} ms_config_t;

static const spn_config_field_t ms_schema[] = {
    {.key = "path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, path),
     .doc = "the job's audio file (WAV: PCM 8/16/24/32-bit or float)", .def_str = ""},
    {.key = "fps", .type = SPN_CONFIG_FLOAT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, fps),
     .doc = "frame rate of the video the chunks go with (one chunk per frame)", .def_float = 25.0, .min = 1.0,
     .max = 1000.0},
    {0},
};

static const spn_port_t ms_outputs[] = {{.name = "mel", .type = "mel"}};

typedef struct ms_state {
  spn_mel_t *mel;
} ms_state_t;

typedef struct ms_job {
  uint64_t job_id;
  double fps;
  float *spec;      /* (80, frames) */
  int64_t frames;
  int64_t chunks;
  int64_t next;
} ms_job_t;

static int32_t ms_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  (void)config;
  ms_state_t *st = calloc(1, sizeof *st);
  if (!st)
    return spn_error_set(err, SPN_ENOMEM, "melspec: out of memory");
  spn_mel_params_t p = SPN_MEL_PARAMS_WAV2LIP;
  int32_t rc = spn_mel_new(&p, NULL, &st->mel, err);
  if (rc != SPN_OK) {
    free(st);
    return spn_error_prefix(err, "stage \"%s\"", host->stage_get_name(stage));
  }
  *state = st;
  return SPN_OK;
}

static void ms_job_free(ms_job_t *j) {
  if (!j)
    return;
  free(j->spec);
  free(j);
}

static int32_t ms_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                           spn_error_t *err) {
  (void)stage;
  ms_state_t *st = state;
  const ms_config_t *c = job->config;
  if (!c->path || !*c->path)
    return spn_error_set(err, SPN_ECONFIG, "melspec: no audio file: set the per-job key `path`");
  ms_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "melspec: out of memory");
  j->job_id = job->job_id;
  j->fps = c->fps;
  spn_wav_t wav;
  float *pcm = NULL;
  int64_t n = 0;
  int32_t rc = spn_wav_read(c->path, &wav, err);
  if (rc != SPN_OK)
    goto out_job;
  rc = spn_audio_resample(wav.samples, wav.n, wav.sample_rate, MS_RATE, &pcm, &n, err);
  spn_wav_release(&wav);
  if (rc != SPN_OK) {
    spn_error_prefix(err, "%s", c->path);
    goto out_job;
  }
  /* The STFT pads by reflection over n_fft/2 = 400 samples and Wav2Lip
   * needs one 16-column window: 0.2 s of audio at least. */
  j->frames = n > 400 ? spn_mel_frames(st->mel, n) : 0;
  if (j->frames < SPN_W2L_MEL_STEPS) {
    rc = spn_error_set(err, SPN_EMEDIA,
                       "%s: %lld samples at 16 kHz (%.3f s) is too short: Wav2Lip needs at least %d mel frames "
                       "(about 0.2 s)",
                       c->path, (long long)n, (double)n / MS_RATE, SPN_W2L_MEL_STEPS);
    goto out_pcm;
  }
  j->spec = malloc((size_t)j->frames * SPN_W2L_MEL_BINS * sizeof *j->spec);
  if (!j->spec) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory for %lld mel frames", c->path, (long long)j->frames);
    goto out_pcm;
  }
  if ((rc = spn_mel_compute(st->mel, pcm, n, j->spec, err)) != SPN_OK) {
    spn_error_prefix(err, "%s", c->path);
    goto out_pcm;
  }
  free(pcm);
  j->chunks = spn_w2l_mel_chunks(j->fps, j->frames);
  *job_state = j;
  return SPN_OK;
out_pcm:
  free(pcm);
out_job:
  ms_job_free(j);
  return rc;
}

static int32_t ms_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  (void)state;
  ms_job_t *j = job_state;
  if (j->next >= j->chunks)
    return SPN_EOS;
  if (host->job_cancelled(stage, j->job_id))
    return SPN_ECANCELLED;
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 3;
  t.shape[0] = 1, t.shape[1] = SPN_W2L_MEL_BINS, t.shape[2] = SPN_W2L_MEL_STEPS;
  spn_buffer_t *buf = NULL;
  int32_t rc = host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err);
  if (rc != SPN_OK)
    return rc;
  rc = spn_w2l_mel_chunk(j->spec, j->frames, j->next, j->fps, host->buffer_data(buf), err);
  spn_envelope_t env = {.struct_size = sizeof env, .flags = SPN_MSG_KEY, .job_id = j->job_id, .stream = 1,
                        .seq = (uint64_t)j->next, .pts = (double)j->next / j->fps, .total = j->chunks};
  spn_msg_t *msg = NULL;
  if (rc == SPN_OK)
    rc = host->msg_new(stage, &env, &msg, err);
  if (rc == SPN_OK)
    rc = host->msg_add_tensor(msg, "mel", &t, buf, err);
  host->buffer_unref(&buf);
  if (rc != SPN_OK) {
    host->msg_free(&msg);
    return rc;
  }
  if ((rc = host->emit(stage, 0, &msg, err)) != SPN_OK)
    return rc;
  j->next++;
  host->progress(stage, j->job_id, j->next, j->chunks);
  return j->next >= j->chunks ? SPN_EOS : SPN_OK;
}

static void ms_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  (void)stage, (void)state, (void)ok;
  ms_job_free(job_state);
}

static void ms_destroy(spn_stage_t *stage, void *state) {
  (void)stage;
  ms_state_t *st = state;
  if (!st)
    return;
  spn_mel_free(&st->mel);
  free(st);
}

static int32_t ms_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "melspec",
      .doc = "Wav2Lip mel chunks (80x16), one per video frame, from the job's WAV file",
      .schema = ms_schema,
      .config_size = sizeof(ms_config_t),
      .outputs = ms_outputs,
      .n_outputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .create = ms_create,
      .job_open = ms_job_open,
      .generate = ms_generate,
      .job_close = ms_job_close,
      .destroy = ms_destroy,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(melspec, .version = "1.0", .license = "Apache-2.0", .init = ms_init)
