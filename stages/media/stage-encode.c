/* stage-encode.c — `encode`, the media sink stage (libspindle-encode.so).
 *
 * A thin wrapper over media-encode.c: per job, the first "frame" fixes the
 * size; every frame is encoded at its envelope pts (H.264: libx264, or
 * NVENC); at the end of the stream the file is finished and renamed into
 * place. Audio is muxed from `audio_path` (e.g. the decoded source itself)
 * re-encoded to AAC. A job that fails or is cancelled leaves no file at
 * `path` (the temporary file beside it is removed). Frames: (H,W,3) u8 as
 * `pixel_format` says (rgb24 or bgr24), or (3,H,W) f32 in [0,255]
 * (rgbf32p/bgrf32p by the same setting's channel order).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/plugin.h"
#include "media-encode.h"

static const spn_host_api_t *host; /* the host table; same for every load */

typedef struct encode_config {
  char *path;
  char *codec;
  int64_t crf;
  char *preset;
  int64_t bitrate;
  char *audio_path;
  bool faststart;
  double fps;
  char *pixel_format;
  int64_t audio_bitrate;
} encode_config_t;

static const spn_config_field_t encode_schema[] = {
    {.key = "path", .type = SPN_CONFIG_STRING, .flags = SPN_CONFIG_PER_JOB | SPN_CONFIG_REQUIRED,
     .offset = offsetof(encode_config_t, path),
     .doc = "output file (.mp4, .mkv, .mov); a relative path is relative to the working directory"},
    {.key = "codec", .type = SPN_CONFIG_STRING, .offset = offsetof(encode_config_t, codec),
     .doc = "video encoder: libx264, h264_nvenc or auto (NVENC when it opens)", .def_str = "libx264"},
    {.key = "crf", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(encode_config_t, crf),
     .doc = "constant quality (x264 crf, NVENC cq)", .def_int = 23, .min = 0, .max = 51},
    {.key = "preset", .type = SPN_CONFIG_STRING, .offset = offsetof(encode_config_t, preset),
     .doc = "encoder preset (ultrafast .. veryslow; NVENC p1 .. p7)", .def_str = "medium"},
    {.key = "bitrate", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(encode_config_t, bitrate),
     .doc = "average bit rate in bit/s (0: constant quality)", .def_int = 0, .min = 0, .max = 1e10},
    {.key = "audio_path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(encode_config_t, audio_path), .doc = "file whose audio is muxed as AAC (empty: none)",
     .def_str = ""},
    {.key = "faststart", .type = SPN_CONFIG_BOOL, .offset = offsetof(encode_config_t, faststart),
     .doc = "MP4/MOV: put the index first", .def_int = 1},
    {.key = "fps", .type = SPN_CONFIG_FLOAT, .offset = offsetof(encode_config_t, fps),
     .doc = "nominal frame rate written to the stream", .def_float = 25.0, .min = 0.001, .max = 1000.0},
    {.key = "pixel_format", .type = SPN_CONFIG_STRING, .offset = offsetof(encode_config_t, pixel_format),
     .doc = "channel order of incoming frames: rgb24 or bgr24", .def_str = "rgb24"},
    {.key = "audio_bitrate", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(encode_config_t, audio_bitrate),
     .doc = "AAC bit rate in bit/s (0: 64 kbit/s per channel, capped at what AAC fits at the source rate)",
     .def_int = 0, .min = 0, .max = 1000000},
    {0},
};

static const spn_port_t encode_inputs[] = {{.name = "video", .type = "video"}};

typedef struct encode_job {
  uint64_t job_id;
  encode_config_t cfg;  /* borrowed strings: valid for the job (host-owned) */
  spn_encoder_t *enc;
  bool failed;
  int64_t frames;
  spn_stage_t *stage;
  spn_media_log_t log; /* FFmpeg's messages about this job's file */
} encode_job_t;

static void ffmpeg_log(void *user, int32_t level, const char *msg) {
  encode_job_t *j = user;
  host->log(j->stage, j->job_id, level, "%s: %s", j->cfg.path, msg);
}

static int32_t encode_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const encode_config_t *c = config;
  *state = NULL;
  if (strcmp(c->pixel_format, "rgb24") != 0 && strcmp(c->pixel_format, "bgr24") != 0)
    return spn_error_set(err, SPN_ECONFIG, "stage \"%s\": pixel_format \"%s\" is not rgb24 or bgr24",
                         host->stage_get_name(stage), c->pixel_format);
  return SPN_OK;
}

static int32_t encode_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                               spn_error_t *err) {
  encode_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "encode: out of memory");
  j->job_id = job->job_id;
  j->cfg = *(const encode_config_t *)job->config;
  j->stage = stage;
  j->log = (spn_media_log_t){.magic = SPN_MEDIA_LOG_MAGIC, .fn = ffmpeg_log, .user = j};
  *job_state = j;
  return SPN_OK;
}

static int32_t open_encoder(encode_job_t *j, int32_t w, int32_t h, int32_t fmt, spn_error_t *err) {
  spn_encode_opts_t o = SPN_ENCODE_OPTS_INIT;
  o.codec = j->cfg.codec;
  o.crf = (int32_t)j->cfg.crf;
  o.preset = j->cfg.preset;
  o.bitrate = j->cfg.bitrate;
  o.faststart = j->cfg.faststart;
  o.log = &j->log;
  o.audio_bitrate = (int32_t)j->cfg.audio_bitrate;
  o.audio_path = j->cfg.audio_path && *j->cfg.audio_path ? j->cfg.audio_path : NULL;
  /* nominal rate as a rational with millisecond-of-a-frame precision */
  o.fps_num = (int32_t)llround(j->cfg.fps * 1000.0);
  o.fps_den = 1000;
  return spn_encoder_new(j->cfg.path, w, h, fmt, &o, &j->enc, err);
}

static int32_t write_msg(spn_stage_t *stage, encode_job_t *j, spn_msg_t *msg, spn_error_t *err) {
  int64_t idx = host->msg_find(msg, "frame");
  spn_item_t it = {.struct_size = sizeof it};
  if (idx < 0 || host->msg_item(msg, (size_t)idx, &it) != SPN_OK)
    return spn_error_set(err, SPN_EINVAL, "%s: message %llu has no \"frame\" item", j->cfg.path,
                         (unsigned long long)host->msg_envelope(msg)->seq);
  const spn_tensor_t *t = &it.tensor;
  int bgr = strcmp(j->cfg.pixel_format, "bgr24") == 0;
  int32_t fmt, w, h;
  if (t->dtype == SPN_DTYPE_U8 && t->ndim == 3 && t->shape[2] == 3) {
    fmt = bgr ? SPN_PIXFMT_BGR24 : SPN_PIXFMT_RGB24;
    h = (int32_t)t->shape[0];
    w = (int32_t)t->shape[1];
  } else if (t->dtype == SPN_DTYPE_F32 && t->ndim == 3 && t->shape[0] == 3) {
    fmt = bgr ? SPN_PIXFMT_BGRF32P : SPN_PIXFMT_RGBF32P;
    h = (int32_t)t->shape[1];
    w = (int32_t)t->shape[2];
  } else {
    return spn_error_set(err, SPN_ETYPE, "%s: frame %llu is not (H,W,3) u8 or (3,H,W) f32", j->cfg.path,
                         (unsigned long long)host->msg_envelope(msg)->seq);
  }
  int32_t rc;
  if (!j->enc && (rc = open_encoder(j, w, h, fmt, err)))
    return rc;
  spn_image_t img;
  if ((rc = spn_image_wrap(&img, host->buffer_data(it.buffer), w, h, fmt, err)))
    return spn_error_prefix(err, "%s", j->cfg.path);
  int64_t pts_us = llround(host->msg_envelope(msg)->pts * 1e6);
  if ((rc = spn_encoder_write_video(j->enc, &img, pts_us, 1, 1000000, err)))
    return rc;
  j->frames++;
  return SPN_OK;
}

static int32_t encode_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                              spn_error_t *err) {
  for (size_t i = 0; i < n; i++) {
    encode_job_t *j = job_states[i];
    if (!msgs[i] || j->failed)
      continue;
    spn_error_t e = SPN_ERROR_INIT;
    int32_t rc = write_msg(stage, j, msgs[i], &e);
    if (rc) {
      j->failed = true;
      host->fail_job(stage, j->job_id, rc, e.msg); /* this job only; the batch goes on */
    }
  }
  return SPN_OK;
}

static int32_t encode_flush(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  encode_job_t *j = job_state;
  if (j->failed)
    return SPN_OK;
  if (!j->enc)
    return spn_error_set(err, SPN_EMEDIA, "%s: no video frames arrived", j->cfg.path);
  return spn_encoder_finish(j->enc, err);
}

static void encode_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  encode_job_t *j = job_state;
  if (!j)
    return;
  spn_encoder_free(j->enc); /* removes the temporary file unless finished */
  free(j);
}

static void encode_destroy(spn_stage_t *stage, void *state) {}

static int32_t encode_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  host = h;
  spn_media_log_install();
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "encode",
      .doc = "writes H.264 video (libx264/NVENC) with AAC audio to MP4/MKV",
      .schema = encode_schema,
      .config_size = sizeof(encode_config_t),
      .inputs = encode_inputs,
      .n_inputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .create = encode_create,
      .job_open = encode_job_open,
      .process = encode_process,
      .flush = encode_flush,
      .job_close = encode_job_close,
      .destroy = encode_destroy,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(encode, .version = "1.0", .license = "Apache-2.0", .init = encode_init)
