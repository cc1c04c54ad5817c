/* stage-melspec.c — `melspec`, Wav2Lip mel chunks from a job's audio file.
 *
 * A source. For each job it reads the per-job `path` (a WAV file: see wav.h
 * for the formats; in a build with FFmpeg any file with sound that FFmpeg
 * reads, an MP3, an M4A or a video, as Wav2Lip's inference.py converts
 * them), mixes it to mono, resamples it to 16 kHz, computes
 * Wav2Lip's mel spectrogram (spindle/audio.h) and then emits, one per
 * generate() call, the 80×16 chunk of each video frame at `fps`: chunk i
 * starts at mel column floor(i * 80 / fps); Wav2Lip's loop decides how many
 * there are (windows while they fit, then one last window clamped to the
 * end). Each message carries a tensor item "mel" (1,80,16) f32 and the
 * envelope's total is the chunk count, so `lipsync` knows from the first
 * chunk where the audio ends.
 *
 * The frame rate: chunks pair with video frames by seq, so cut at any rate
 * but the video's they drift from its frames (at 25 for a 30 fps video the
 * lips run a frame further ahead every sixth of a second, and the last
 * sixth of the video gets no chunk). `fps = 0` (the default) takes the rate of the per-job `video`, the
 * file the decode stage reads (configs/lipsync.toml binds the job's video to
 * both), as Wav2Lip takes the video's; a job with neither fails.
 *
 * A cut job (decode's `start`, which configs/lipsync.toml binds to this
 * stage's `start` too): its chunks are those of its frames in the whole
 * video, from the chunk of the first frame at or after start, with their
 * pts on the speech's clock (the encoder muxes the speech from the first
 * frame's time, `encode.audio_sync`). Its spectrogram still goes whole, with
 * the index of its first chunk (SPN_W2L_SPEC_FIRST_ITEM).
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
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "spindle/audio.h"
#include "spindle/plugin.h"
#include "wav.h"
#include "wav2lip.h"
#ifdef SPN_MELSPEC_MEDIA
#include "media-decode.h"
#endif


#define MS_RATE 16000

typedef struct ms_config {
  char *path;
  double fps;
  int64_t spectrogram_max_kb;
  char *video;
  bool follow_references;
  double start;
} ms_config_t;

#ifdef SPN_MELSPEC_MEDIA
#define MS_AUDIO_DOC "the job's speech: a WAV (PCM 8/16/24/32-bit or float), or any file with sound FFmpeg reads"
#else
#define MS_AUDIO_DOC "the job's speech: a WAV file (PCM 8/16/24/32-bit or float)"
#endif

static const spn_config_field_t ms_schema[] = {
    {.key = "path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, path),
     .doc = MS_AUDIO_DOC, .def_str = ""},
    {.key = "fps", .type = SPN_CONFIG_FLOAT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, fps),
     .doc = "frame rate of the video the chunks go with (one chunk per frame); 0: the rate of `video`",
     .def_float = 0.0, .min = 0.0, .max = 1000.0},
    {.key = "video", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, video),
     .doc = "the video the chunks go with (the decode stage's file), whose frame rate fps = 0 takes", .def_str = ""},
    {.key = "start", .type = SPN_CONFIG_FLOAT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(ms_config_t, start),
     .doc = "seconds: the first chunk is that of the video's first frame at or after this time (decode's start, "
            "so that a cut video keeps its sync)",
     .def_float = 0.0, .min = 0.0, .max = 1e7},
    {.key = "follow_references", .type = SPN_CONFIG_BOOL, .offset = offsetof(ms_config_t, follow_references),
     .doc = "read a playlist or list the speech or video file names (as decode's key of that name)", .def_int = 0},
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
  int64_t first;          /* the chunk of the job's first frame (start), of the whole speech's */
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

/* *wav: path is a local regular file that starts as a RIFF/WAVE file,
 * which wav.c reads. Anything else goes to FFmpeg where the build has it
 * (its opener reads URLs and refuses a named pipe, a folder or a device,
 * saying which); without FFmpeg it is refused here, as opening a named pipe
 * nobody writes would block where no cancel reaches. */
static int32_t ms_peek(const char *path, bool *wav, spn_error_t *err) {
  *wav = false;
  struct stat st;
  int serr = stat(path, &st) != 0 ? errno : 0;
  if (serr || !S_ISREG(st.st_mode)) {
#ifdef SPN_MELSPEC_MEDIA
    return SPN_OK;
#else
    return serr ? spn_error_set(err, serr == ENOENT ? SPN_ENOENT : SPN_EIO, "%s: %s", path, strerror(serr))
                : spn_error_set(err, SPN_EINVAL, "%s: not a regular file; give an audio file", path);
#endif
  }
  FILE *f = fopen(path, "rb");
  if (!f)
    return spn_error_set(err, errno == ENOENT ? SPN_ENOENT : SPN_EIO, "%s: %s", path, strerror(errno));
  unsigned char head[12];
  *wav = fread(head, 1, sizeof head, f) == sizeof head && !memcmp(head, "RIFF", 4) && !memcmp(head + 8, "WAVE", 4);
  fclose(f);
  return SPN_OK;
}

#ifdef SPN_MELSPEC_MEDIA
/* A decoder of path's sound, or (video) of its picture only. */
static int32_t ms_open(const char *path, bool follow, bool video, spn_decoder_t **d, spn_error_t *err) {
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_video = video;
  o.want_audio = !video;
  o.follow_references = follow;
  int32_t rc = spn_decoder_new(path, &o, d, err);
  if (rc != SPN_OK)
    spn_error_prefix(err, video ? "melspec: the video, whose frame rate fps = 0 takes" : "melspec: the speech");
  return rc;
}

/* Any file with sound, through FFmpeg: its first audio stream at its own
 * rate and channels, mixed to mono as wav.c mixes (the mean), so a WAV read
 * either way gives the same samples. */
static int32_t ms_read_media(const char *path, bool follow, spn_wav_t *out, spn_error_t *err) {
  memset(out, 0, sizeof *out);
  spn_decoder_t *d = NULL;
  int32_t rc = ms_open(path, follow, false, &d, err);
  if (rc != SPN_OK)
    return rc;
  const spn_decode_info_t *info = spn_decoder_info(d);
  if (!info->has_audio) {
    spn_decoder_free(d);
    return spn_error_set(err, SPN_EMEDIA, "%s: has no audio stream (the speech is a file with sound: WAV, MP3, M4A, "
                         "or a video with its soundtrack)", path);
  }
  size_t cap = 0;
  spn_media_item_t it;
  while ((rc = spn_decoder_next(d, &it, err)) == SPN_OK) {
    if (it.kind == SPN_MEDIA_AUDIO && it.n_samples > 0 && it.channels > 0) {
      if ((size_t)out->n + (size_t)it.n_samples > cap) {
        size_t nc = cap ? cap : 1 << 16;
        while (nc < (size_t)out->n + (size_t)it.n_samples)
          nc *= 2;
        float *ns = realloc(out->samples, nc * sizeof *ns);
        if (!ns) {
          spn_media_item_release(&it);
          rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory for %zu samples", path, nc);
          break;
        }
        out->samples = ns;
        cap = nc;
      }
      for (int64_t i = 0; i < it.n_samples; i++) {
        float acc = 0;
        for (int32_t c = 0; c < it.channels; c++)
          acc += it.samples[i * it.channels + c];
        out->samples[out->n++] = acc / (float)it.channels;
      }
    }
    spn_media_item_release(&it);
  }
  out->sample_rate = info->audio_rate;
  out->channels = info->audio_channels;
  out->bits = 32;
  spn_decoder_free(d);
  if (rc == SPN_EOS)
    return SPN_OK;
  spn_wav_release(out);
  return rc;
}

/* The frame rate of the video the chunks go with. */
static int32_t ms_video_fps(const char *path, bool follow, double *fps, spn_error_t *err) {
  spn_decoder_t *d = NULL;
  int32_t rc = ms_open(path, follow, true, &d, err);
  if (rc != SPN_OK)
    return rc;
  const spn_decode_info_t *info = spn_decoder_info(d);
  *fps = info->has_video && info->fps_den > 0 ? (double)info->fps_num / info->fps_den : 0;
  spn_decoder_free(d);
  if (!(*fps >= 1.0 && *fps <= 1000.0))
    return spn_error_set(err, SPN_EMEDIA,
                         "%s: %s: melspec's fps = 0 takes the video's frame rate; set fps to the rate of the "
                         "video the chunks go with",
                         path, *fps > 0 ? "a frame rate outside 1-1000 fps" : "has no video stream with a frame rate");
  return SPN_OK;
}
#endif

/* The job's speech as mono samples: a WAV by wav.c, anything else through
 * FFmpeg where the build has it. */
static int32_t ms_read_audio(const ms_config_t *c, spn_wav_t *wav, spn_error_t *err) {
  bool is_wav = false;
  int32_t rc = ms_peek(c->path, &is_wav, err);
  if (rc != SPN_OK)
    return rc;
#ifdef SPN_MELSPEC_MEDIA
  if (!is_wav)
    return ms_read_media(c->path, c->follow_references, wav, err);
#endif
  return spn_wav_read(c->path, wav, err);
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
  int32_t rc = SPN_OK;
  if (j->fps == 0) {
    if (!c->video || !*c->video) {
      rc = spn_error_set(err, SPN_ECONFIG,
                         "melspec: fps = 0 takes the frame rate of the job's video, and this job names none: bind "
                         "the video to melspec.video beside decode.path (video = [\"decode.path\", "
                         "\"melspec.video\"]), or set fps");
      goto out_job;
    }
#ifdef SPN_MELSPEC_MEDIA
    if ((rc = ms_video_fps(c->video, c->follow_references, &j->fps, err)) != SPN_OK)
      goto out_job;
    host->log(stage, job->job_id, SPN_LOG_DEBUG, "mel chunks at %.3f fps, the rate of %s", j->fps, c->video);
#else
    rc = spn_error_set(err, SPN_EUNSUPPORTED,
                       "melspec: fps = 0 reads the frame rate of %s, and this build reads no video (no FFmpeg): "
                       "set fps",
                       c->video);
    goto out_job;
#endif
  }
  rc = ms_read_audio(c, &wav, err);
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
  /* A cut job (decode's start): its first frame is the first at or after
   * start, frame ceil(start * fps) of the video; the chunks are the whole
   * speech's from that one, as Wav2Lip would cut them for the whole video. */
  j->first = c->start > 0 ? (int64_t)ceil(c->start * j->fps - 1e-3) : 0;
  if (j->first >= j->chunks) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: the speech (%.3f s) ends before the job's start (%.3f s)", c->path,
                       (double)n / MS_RATE, c->start);
    ms_job_free(host, j);
    return rc;
  }
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
  if (rc == SPN_OK && j->first > 0) /* a cut job: where its chunks start in the spectrogram */
    rc = host->msg_add_meta(msg, SPN_W2L_SPEC_FIRST_ITEM, &j->first, sizeof j->first, err);
  return rc;
}

static int32_t ms_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  (void)state;
  ms_job_t *j = job_state;
  if (j->first + j->next >= j->chunks)
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
  rc = spn_w2l_mel_chunk(j->spec, j->frames, j->first + j->next, j->fps, host->buffer_data(buf), err);
  /* pts: the chunk's time in the speech, which is the time of its frame in
   * the video (lipsync compares them) */
  spn_envelope_t env = {.struct_size = sizeof env, .flags = SPN_MSG_KEY, .job_id = j->job_id, .stream = 1,
                        .seq = (uint64_t)j->next, .pts = (double)(j->first + j->next) / j->fps,
                        .total = j->chunks - j->first};
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
  host->progress(stage, j->job_id, j->next, j->chunks - j->first);
  return j->first + j->next >= j->chunks ? SPN_EOS : SPN_OK;
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
      .doc = "Wav2Lip mel chunks (80x16), one per video frame, from the job's speech (the first also carries the "
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
