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
 * The first message of a job (seq 0) also carries the whole spectrogram the
 * chunks are cut from (wav2lip.h, SPN_W2L_SPEC_ITEM: (80, frames) f32, and
 * the fps as SPN_W2L_SPEC_FPS_ITEM), so a lipsync on a GPU uploads the job's
 * audio features once and cuts its windows there instead of uploading each
 * chunk (16 columns a frame where the spectrogram advances by 80/fps: about
 * 5x the bytes at 25 fps). Only up to `spectrogram_max_kb` (at most and by
 * default SPN_W2L_SPEC_MAX_BYTES, 16 MiB: 655 s of audio); a longer job's
 * chunks go alone. The item is the buffer the chunks are copied from, so in
 * a process it costs a reference; on an edge to another process it is one
 * more tensor on the job's first message, a fifth of what its chunks weigh.
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
  int64_t spectrogram_max_kb;
} ms_config_t;

static const spn_config_field_t ms_schema[] = {
    {.key = "path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, path),
     .doc = "the job's audio file (WAV: PCM 8/16/24/32-bit or float)", .def_str = ""},
    {.key = "fps", .type = SPN_CONFIG_FLOAT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, fps),
     .doc = "frame rate of the video the chunks go with (one chunk per frame)", .def_float = 25.0, .min = 1.0,
     .max = 1000.0},
    {.key = "spectrogram_max_kb", .type = SPN_CONFIG_INT, .offset = offsetof(ms_config_t, spectrogram_max_kb),
     .doc = "largest spectrogram sent whole with a job's first chunk, for a GPU lipsync to upload once (KiB; 0: "
            "never; the chunks are sent either way)",
     .def_int = (int64_t)(SPN_W2L_SPEC_MAX_BYTES >> 10), .min = 0, .max = (double)(SPN_W2L_SPEC_MAX_BYTES >> 10)},
    {0},
};

static const spn_port_t ms_outputs[] = {{.name = "mel", .type = "mel"}};

typedef struct ms_state {
  spn_mel_t *mel;
} ms_state_t;

typedef struct ms_job {
  uint64_t job_id;
  double fps;
  spn_buffer_t *spec_buf; /* host memory: the spectrogram, also the first message's item */
  float *spec;            /* (80, frames), in spec_buf */
  int64_t frames;
  int64_t chunks;
  int64_t next;
  bool attach;            /* spec goes whole with seq 0 (within spectrogram_max_kb) */
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

static void ms_job_free(const spn_host_api_t *host, ms_job_t *j) {
  if (!j)
    return;
  host->buffer_unref(&j->spec_buf);
  free(j);
}

static int32_t ms_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                           spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
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
  /* In a buffer (on this CPU instance, host memory), which the first
   * message can carry as it is. */
  size_t spec_bytes = (size_t)j->frames * SPN_W2L_MEL_BINS * sizeof *j->spec;
  if (host->buffer_new(stage, spec_bytes, &j->spec_buf, err) != SPN_OK) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory for %lld mel frames", c->path, (long long)j->frames);
    goto out_pcm;
  }
  j->spec = host->buffer_data(j->spec_buf);
  j->attach = spec_bytes <= (size_t)c->spectrogram_max_kb << 10;
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
  ms_job_free(host, j);
  return rc;
}

/* The job's whole spectrogram and the fps its chunks are cut at, beside the
 * first chunk (wav2lip.h: SPN_W2L_SPEC_ITEM). */
static int32_t ms_add_spectrogram(const spn_host_api_t *host, ms_job_t *j, spn_msg_t *msg, spn_error_t *err) {
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = SPN_W2L_MEL_BINS, t.shape[1] = j->frames;
  int32_t rc = host->msg_add_tensor(msg, SPN_W2L_SPEC_ITEM, &t, j->spec_buf, err);
  if (rc == SPN_OK)
    rc = host->msg_add_meta(msg, SPN_W2L_SPEC_FPS_ITEM, &j->fps, sizeof j->fps, err);
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
  if (rc == SPN_OK && j->next == 0 && j->attach)
    rc = ms_add_spectrogram(host, j, msg, err);
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
  (void)state, (void)ok;
  ms_job_free(spn_stage_host(stage), job_state);
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
      .doc = "Wav2Lip mel chunks (80x16), one per video frame, from the job's WAV file (the first also carries the "
             "whole spectrogram)",
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
