/* stage-encode.c — `encode` and `encode_av`, the media sink stages
 * (libspindle-encode.so).
 *
 * A thin wrapper over media-encode.c: per job, the first "frame" fixes the
 * size; every frame is encoded at its envelope pts (H.264: libx264, or
 * NVENC); at the end of the stream the file is finished and renamed into
 * place. A job that fails or is cancelled leaves no file at `path` (the
 * temporary file beside it is removed); a path that can never be written
 * (no container for its name, no temporary file possible beside it) fails
 * the job when it opens, before any frame. Frames: (H,W,3) u8 as
 * `pixel_format` says (rgb24 or bgr24), (3,H,W) f32 in [0,255]
 * (rgbf32p/bgrf32p by the same setting's channel order), or the (N) u8
 * planes of nv12/yuv420p with decode's "image" item (no RGB round trip).
 *
 * Audio: `encode` muxes the audio of the file `audio_path` (re-encoded to
 * AAC). `encode_av` has a second input, `audio`, fed by decode.audio: its
 * first message per job, "audio_format", gives rate and channels (0: no
 * soundtrack) before the encoder opens; pictures that arrive before it are
 * held (by reference), PCM that arrives before the first picture is kept,
 * and both are written once the encoder is open. With `audio_path` set,
 * encode_av muxes that file, as encode does, and ignores its audio input.
 * The file's sound starts at the job's first frame's time (`audio_sync`):
 * frames decoded from 12 s on (decode's start) play with the soundtrack
 * from 12 s, as the input's own audio would; a source whose frames start
 * at 0 hears it from its start.
 * The stream's frame rate is `fps`, or with fps 0 (the default) the
 * frames' own: the first picture waits for the second, and their interval
 * gives the rate (a 30 fps input makes a 30 fps file whose last frame lasts
 * 1/30 s; a nominal 25 made it 1/25 s, and players read 29.95 fps).
 * A segment's audio and video
 * are cut from the same interval by decode, so they stay in sync.
 *
 * GPU (a CUDA build; the kinds are then SPN_NEED_EITHER and their video
 * input takes device memory): placed on a CUDA device, the job's first
 * frame picks the encoder. With `hwaccel` default or cuda and the frame in
 * the GPU's memory (with cuda, a host frame too), the encoder is NVENC
 * (h264_nvenc for libx264/h264_nvenc/auto, hevc_nvenc for libx265/
 * hevc_nvenc) on FFmpeg's CUDA device over the GPU's primary context and
 * the stage's stream: each frame is converted on the GPU straight into the
 * encoder's next NV12 pool frame (spn_media_cuda_to_nv12), the stream is
 * waited for, and NVENC reads the frame there; nothing is downloaded. Where
 * NVENC does not open (no encoder on the GPU, as on H100/H200; no
 * libnvidia-encode; a codec without NVENC) default falls back to the host
 * path below, cuda fails the job; one log line per job says which path and
 * why. cuda on a stage placed on the CPU is refused at create.
 *
 * The host path on a GPU (hwaccel none, or the fallback): a frame that
 * arrives in that GPU's memory is not copied to the host as it is. An rgb24/bgr24
 * frame is converted to yuv420p on the GPU (spn_cuda_rgb_to_yuv420, the
 * twin of spn_image_convert) and only its 4:2:0 planes are downloaded, once,
 * into pinned memory: half the bytes of the RGB frame. Other frames
 * (nv12/yuv420p planes, f32) are downloaded once as they are, one frame
 * ahead: a frame is encoded during the next frame's call (or the flush),
 * after waiting for its own download's mark (gpu_frame, encode_pending),
 * then libx264 gets it as on the CPU. Frames in host
 * memory take the CPU path, except that an encoder opened for the GPU's
 * yuv420p converts later host RGB frames with spn_image_convert too, so one
 * job's frames all go through the same conversion. Placed on the CPU it
 * does exactly what it does in a build without CUDA.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/plugin.h"
#include "media-decode.h"
#include "media-encode.h"
#ifdef SPN_MEDIA_CUDA
#include "media-cuda.h"
#endif


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
  char *hwaccel;
  bool audio_sync;
  bool audio_optional;
  char *colorspace;
} encode_config_t;

/* hwaccel: whether device frames go to NVENC (see the file's header). */
enum { HW_DEFAULT, HW_NONE, HW_CUDA };

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
     .doc = "frame rate written to the stream (0: the frames' own, from their timestamps)", .def_float = 0.0,
     .min = 0.0, .max = 1000.0},
    {.key = "pixel_format", .type = SPN_CONFIG_STRING, .offset = offsetof(encode_config_t, pixel_format),
     .doc = "channel order of incoming frames: rgb24 or bgr24", .def_str = "rgb24"},
    {.key = "audio_bitrate", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(encode_config_t, audio_bitrate),
     .doc = "AAC bit rate in bit/s (0: 64 kbit/s per channel, capped at what AAC fits at the source rate)",
     .def_int = 0, .min = 0, .max = 1000000},
    {.key = "audio_sync", .type = SPN_CONFIG_BOOL, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(encode_config_t, audio_sync),
     .doc = "audio_path's sound starts at the first frame's time (its pts: a job cut at decode's start hears its "
            "soundtrack from there); false: at the file's start",
     .def_int = 1},
    {.key = "audio_optional", .type = SPN_CONFIG_BOOL, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(encode_config_t, audio_optional),
     .doc = "audio_path may be a file without sound (a silent video): the output then has no soundtrack, and "
            "the job's log says so; false: such a file fails the job",
     .def_int = 0},
    {.key = "colorspace", .type = SPN_CONFIG_STRING, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(encode_config_t, colorspace),
     .doc = "YCbCr matrix RGB frames are written in, and recorded in the file: bt601 (alias smpte170m, bt470bg), "
            "bt709, bt2020 or smpte240m; 4:2:0 frames from decode keep (and record) the input file's",
     .def_str = "bt601"},
    {.key = "hwaccel", .type = SPN_CONFIG_STRING, .offset = offsetof(encode_config_t, hwaccel),
     .doc = "video encoding on a GPU: default (NVENC from device frames when the stage is on a CUDA device and "
            "NVENC opens there, else the host path), none (never NVENC from device frames) or cuda (NVENC from "
            "device frames, or the job fails)",
     .def_str = "default"},
    {0},
};

static const spn_port_t encode_inputs[] = {{.name = "video", .type = "video"}};
static const spn_port_t encode_av_inputs[] = {{.name = "video", .type = "video"}, {.name = "audio", .type = "audio"}};

/* ABI 1.1 formats: packed or planar-float frames in the channel order
 * pixel_format names, or 4:2:0 planes (no RGB round trip); f32 audio. */
static const spn_port_caps_t encode_caps[] = {{.struct_size = sizeof(spn_port_caps_t)},
                                              {.struct_size = sizeof(spn_port_caps_t),
                                               .sample_formats = SPN_FMTSET(SPN_SAMPLE_F32)}};

static int32_t encode_port_caps(const void *config, bool is_output, uint32_t port, spn_port_caps_t *caps,
                                spn_error_t *err) {
  const encode_config_t *c = config;
  if (is_output || port != 0)
    return SPN_OK;
  uint32_t yuv = SPN_FMTSET(SPN_PIX_NV12) | SPN_FMTSET(SPN_PIX_YUV420P);
  if (!strcmp(c->pixel_format, "rgb24"))
    caps->pixel_formats = SPN_FMTSET(SPN_PIX_RGB24) | SPN_FMTSET(SPN_PIX_RGBF32P) | yuv;
  else if (!strcmp(c->pixel_format, "bgr24"))
    caps->pixel_formats = SPN_FMTSET(SPN_PIX_BGR24) | SPN_FMTSET(SPN_PIX_BGRF32P) | yuv;
  else
    return spn_error_set(err, SPN_ECONFIG, "pixel_format \"%s\" is not rgb24 or bgr24", c->pixel_format);
#ifdef SPN_MEDIA_CUDA
  /* On a GPU, frames in its memory come as they are (converted and
   * downloaded here); host frames too. On the CPU the runtime copies device
   * frames to the host, as for any host port. */
  caps->mem_kinds = SPN_MEMSET_DEVICE | SPN_MEMSET_HOST;
#endif
  return SPN_OK;
}

/* A frame held until the soundtrack's format (encode_av) and the frames'
 * rate (fps 0: until the second frame) are known. */
typedef struct held_frame {
  spn_buffer_t *buf;
  int32_t w, h, fmt;
  int64_t pts_us;
} held_frame_t;

typedef struct encode_job {
  uint64_t job_id;
  encode_config_t cfg;  /* borrowed strings: valid for the job (host-owned) */
  spn_encoder_t *enc;
  bool failed;
  bool av;              /* kind encode_av: audio comes on input port 1 */
  bool file_audio;      /* audio_path is set: the soundtrack comes from that file */
  int64_t frames;
  int64_t first_pts_us; /* the job's first frame's pts (audio_sync), set before the encoder opens */
  spn_colour_t colour;  /* the file's 4:2:0 samples: colorspace for RGB, decode's for its 4:2:0 frames */
  bool from_rgb;        /* the frames are RGB or float: converted to 4:2:0 here */
  int32_t primaries, transfer; /* decode's (H.273), recorded with its 4:2:0 frames; 0: none */
  int32_t sar_num, sar_den;     /* the pixels' shape, from decode's image item (0: square) */
  int32_t fps_num, fps_den; /* the stream's rate: fps, or (fps 0) the frames' (0 until two frames came) */
  spn_stage_t *stage;
  spn_media_log_t log;  /* FFmpeg's messages about this job's file */
  /* encode_av: the soundtrack's format (known once "audio_format" came),
   * frames that came before it, and audio that came before the encoder. */
  bool a_known;
  int32_t a_rate, a_ch;
  held_frame_t *held;
  size_t n_held, cap_held;
  float *pending;
  size_t n_pending, cap_pending; /* in floats */
#ifdef SPN_MEDIA_CUDA
  /* Placed on a CUDA device. */
  bool on_gpu;
  cudaStream_t stream;
  int32_t hwaccel;       /* HW_* */
  bool nvenc;            /* the encoder is NVENC reading device frames */
  int32_t nv_w, nv_h;    /* NVENC: the frame size it was opened for */
  int32_t enc_fmt;       /* the format the encoder was opened for */
  spn_buffer_t *yuv_dev; /* device yuv420p planes of the GPU conversion */
  spn_buffer_t *pinned;  /* pinned host memory a host frame is converted into */
  /* The host path's downloads, one frame deep (gpu_frame): frame N goes
   * into pin[cur] behind the mark pin_ev[cur] and is encoded during frame
   * N + 1's call (or the flush), when its download has long finished, so
   * the executor, which every stage on this GPU shares, does not wait for
   * the GPU on each frame. At most one frame is pending: in pin[1 - cur]. */
  spn_buffer_t *pin[2];
  void *pin_ev[2];
  int cur;
  bool pend;
  int32_t pend_w, pend_h, pend_fmt;
  int64_t pend_pts;
  spn_buffer_t *dev_in;  /* NVENC: a host frame uploaded (device) */
  spn_buffer_t *scratch; /* NVENC: u8 RGB of an f32 frame (device) */
#endif
} encode_job_t;

static void ffmpeg_log(void *user, int32_t level, const char *msg) {
  encode_job_t *j = user;
  const spn_host_api_t *host = spn_stage_host(j->stage);
  host->log(j->stage, j->job_id, level, "%s: %s", j->cfg.path, msg);
}

static int32_t parse_hwaccel(spn_stage_t *stage, const encode_config_t *c, int32_t *hw, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (strcmp(c->hwaccel, "default") == 0)
    *hw = HW_DEFAULT;
  else if (strcmp(c->hwaccel, "none") == 0)
    *hw = HW_NONE;
  else if (strcmp(c->hwaccel, "cuda") == 0)
    *hw = HW_CUDA;
  else
    return spn_error_set(err, SPN_ECONFIG, "stage \"%s\": hwaccel \"%s\" is not default, none or cuda",
                         host->stage_get_name(stage), c->hwaccel);
  return SPN_OK;
}

/* colorspace: the matrix RGB frames are written in (the stage's value when
 * it is made, a job's own when the job opens). */
static int32_t parse_colorspace(spn_stage_t *stage, const encode_config_t *c, int32_t *matrix, spn_error_t *err) {
  if ((*matrix = spn_matrix_from_name(c->colorspace)))
    return SPN_OK;
  return spn_error_set(err, SPN_ECONFIG, "stage \"%s\": colorspace \"%s\" is not bt601, bt709, bt2020 or smpte240m",
                       spn_stage_host(stage)->stage_get_name(stage), c->colorspace);
}

static int32_t encode_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const encode_config_t *c = config;
  int32_t hw = HW_DEFAULT, matrix, rc;
  *state = NULL;
  if (strcmp(c->pixel_format, "rgb24") != 0 && strcmp(c->pixel_format, "bgr24") != 0)
    return spn_error_set(err, SPN_ECONFIG, "stage \"%s\": pixel_format \"%s\" is not rgb24 or bgr24",
                         host->stage_get_name(stage), c->pixel_format);
  if ((rc = parse_hwaccel(stage, c, &hw, err)))
    return rc;
  if ((rc = parse_colorspace(stage, c, &matrix, err)))
    return rc;
  /* Every job would open the configured codec (on the host path at least):
   * one that FFmpeg does not have fails the load, not each job later. */
  spn_error_t why = SPN_ERROR_INIT;
  if (spn_encoder_check_codec(c->codec, &why))
    return spn_error_set(err, SPN_ECONFIG, "codec: %s", why.msg);
  /* hwaccel = "cuda" asks for NVENC from the GPU's memory: refused before
   * any job where the stage cannot have it at all. */
#ifdef SPN_MEDIA_CUDA
  int32_t kind = SPN_DEVICE_CPU, index = 0;
  host->stage_get_device(stage, &kind, &index);
  if (hw == HW_CUDA && kind != SPN_DEVICE_CUDA)
    return spn_error_set(err, SPN_ECONFIG,
                         "stage \"%s\": hwaccel \"cuda\" (NVENC from device frames) needs the stage on a CUDA "
                         "device; it is placed on the CPU (set device = \"cuda\")",
                         host->stage_get_name(stage));
#else
  if (hw == HW_CUDA)
    return spn_error_set(err, SPN_ECONFIG,
                         "stage \"%s\": hwaccel \"cuda\" (NVENC from device frames) needs a build with CUDA",
                         host->stage_get_name(stage));
#endif
  return SPN_OK;
}

static int32_t job_open(spn_stage_t *stage, const spn_job_info_t *job, void **job_state, bool av,
                        spn_error_t *err) {
  const encode_config_t *c = job->config;
  /* An output that can never be written fails the job now, not once its
   * first frame has been decoded and run through the pipeline. */
  int32_t rc = spn_encoder_check_path(c->path, err);
  if (rc)
    return rc;
  int32_t matrix;
  if ((rc = parse_colorspace(stage, c, &matrix, err)))
    return rc;
  encode_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "encode: out of memory");
  j->job_id = job->job_id;
  j->cfg = *c;
  j->av = av;
  j->colour = (spn_colour_t){matrix, 0}; /* RGB frames; decode's 4:2:0 frames say their own */
  /* kind encode, or audio_path set (it wins, as with encode: configs and
   * command lines written for encode keep working): nothing to wait for,
   * and what the audio input brings is not used */
  j->file_audio = c->audio_path && *c->audio_path;
  j->a_known = !av || j->file_audio;
  if (c->fps > 0) {
    /* a rational with millisecond-of-a-frame precision */
    j->fps_num = (int32_t)llround(c->fps * 1000.0);
    j->fps_den = 1000;
  }
  j->stage = stage;
  j->log = (spn_media_log_t){.magic = SPN_MEDIA_LOG_MAGIC, .fn = ffmpeg_log, .user = j};
#ifdef SPN_MEDIA_CUDA
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t kind = SPN_DEVICE_CPU, index = 0;
  host->stage_get_device(stage, &kind, &index);
  j->on_gpu = kind == SPN_DEVICE_CUDA;
  j->stream = j->on_gpu ? (cudaStream_t)host->stage_get_stream(stage) : NULL;
  rc = parse_hwaccel(stage, c, &j->hwaccel, err);
  if (rc) {
    free(j);
    return rc;
  }
#endif
  *job_state = j;
  return SPN_OK;
}

static int32_t encode_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                               spn_error_t *err) {
  return job_open(stage, job, job_state, false, err);
}

static int32_t encode_av_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                                  spn_error_t *err) {
  return job_open(stage, job, job_state, true, err);
}

/* codec: NULL for the configured one; hw_device: NVENC from device frames
 * (see spn_encode_opts_t). */
static int32_t open_encoder(encode_job_t *j, int32_t w, int32_t h, int32_t fmt, const char *codec, void *hw_device,
                            spn_error_t *err) {
  spn_encode_opts_t o = SPN_ENCODE_OPTS_INIT;
  o.codec = codec ? codec : j->cfg.codec;
  o.hw_device = hw_device;
  o.crf = (int32_t)j->cfg.crf;
  o.preset = j->cfg.preset;
  o.bitrate = j->cfg.bitrate;
  o.faststart = j->cfg.faststart;
  o.log = &j->log;
  o.audio_bitrate = (int32_t)j->cfg.audio_bitrate;
  o.audio_path = j->cfg.audio_path && *j->cfg.audio_path ? j->cfg.audio_path : NULL;
  o.audio_start = j->cfg.audio_sync && j->first_pts_us > 0 ? (double)j->first_pts_us / 1e6 : 0.0;
  o.audio_optional = j->cfg.audio_optional;
  if (j->av && j->a_ch > 0) {
    o.audio_rate = j->a_rate;
    o.audio_channels = j->a_ch;
  }
  o.fps_num = j->fps_num;
  o.fps_den = j->fps_den;
  o.colour = j->colour;
  o.primaries = j->primaries;
  o.transfer = j->transfer;
  o.sar_num = j->sar_num;
  o.sar_den = j->sar_den;
  /* frames converted from RGB here (on the GPU: the 2x2 mean) */
  o.chroma_loc = j->from_rgb ? SPN_CHROMA_LOC_CENTER : 0;
  int32_t rc = spn_encoder_new(j->cfg.path, w, h, fmt, &o, &j->enc, err);
  if (rc == SPN_OK && o.audio_path && !spn_encoder_has_audio(j->enc))
    spn_stage_host(j->stage)->log(j->stage, j->job_id, SPN_LOG_INFO,
                                  "%s: %s has no sound: the file is written without a soundtrack", j->cfg.path,
                                  o.audio_path);
  if (rc == SPN_OK && j->n_pending) {
    /* audio that came before the first picture */
    rc = spn_encoder_write_audio(j->enc, j->pending, (int64_t)(j->n_pending / (size_t)j->a_ch), err);
    free(j->pending);
    j->pending = NULL;
    j->n_pending = j->cap_pending = 0;
  }
  return rc;
}

/* The frame item as an image: (H,W,3) u8 (rgb24/bgr24 as pixel_format
 * says), (3,H,W) f32, or the (N) u8 planes of nv12/yuv420p with the
 * "image" meta item giving size and layout. */
static int32_t frame_layout(encode_job_t *j, spn_msg_t *msg, const spn_item_t *it, int32_t *fmt, int32_t *w,
                            int32_t *h, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  const spn_tensor_t *t = &it->tensor;
  int bgr = strcmp(j->cfg.pixel_format, "bgr24") == 0;
  unsigned long long seq = (unsigned long long)host->msg_envelope(msg)->seq;
  /* decode's "image" item (or convert's), when the frame has one */
  int64_t mi = host->msg_find(msg, SPN_MEDIA_IMAGE_META);
  spn_item_t m = {.struct_size = sizeof m};
  spn_media_image_meta_t im = {0};
  bool has_im = mi >= 0 && host->msg_item(msg, (size_t)mi, &m) == SPN_OK && m.meta_size == sizeof im;
  if (has_im)
    memcpy(&im, m.meta, sizeof im);
  if (t->dtype == SPN_DTYPE_U8 && t->ndim == 3 && t->shape[2] == 3) {
    *fmt = bgr ? SPN_PIXFMT_BGR24 : SPN_PIXFMT_RGB24;
    *h = (int32_t)t->shape[0];
    *w = (int32_t)t->shape[1];
    j->from_rgb = true;
  } else if (t->dtype == SPN_DTYPE_F32 && t->ndim == 3 && t->shape[0] == 3) {
    *fmt = bgr ? SPN_PIXFMT_BGRF32P : SPN_PIXFMT_RGBF32P;
    *h = (int32_t)t->shape[1];
    *w = (int32_t)t->shape[2];
    j->from_rgb = true;
  } else if (t->dtype == SPN_DTYPE_U8 && t->ndim == 1) {
    if (!has_im)
      return spn_error_set(err, SPN_ETYPE, "%s: frame %llu is a flat vector without an \"image\" item", j->cfg.path,
                           seq);
    if (im.format != SPN_PIXFMT_NV12 && im.format != SPN_PIXFMT_YUV420P)
      return spn_error_set(err, SPN_ETYPE, "%s: frame %llu: a flat frame must be nv12 or yuv420p, not %s",
                           j->cfg.path, seq, spn_pixfmt_name(im.format));
    int64_t cw = (im.width + 1) / 2, ch = (im.height + 1) / 2;
    if (im.width < 2 || im.height < 2 || im.width > 16384 || im.height > 16384 ||
        t->shape[0] != (int64_t)im.width * im.height + 2 * cw * ch)
      return spn_error_set(err, SPN_ETYPE, "%s: frame %llu: %lld bytes do not hold a %dx%d %s picture", j->cfg.path,
                           seq, (long long)t->shape[0], (int)im.width, (int)im.height, spn_pixfmt_name(im.format));
    *fmt = im.format;
    *w = im.width;
    *h = im.height;
    if (!j->enc) {
      /* the samples are decode's: written as they are, recorded as the
       * input file has them (unknown matrices as decode reads them) */
      spn_colour_t c = {im.matrix, im.full_range};
      spn_yuv_coeffs_t k = {0};
      j->colour = spn_colour_coeffs(&c, &k, NULL) == SPN_OK ? c : (spn_colour_t)SPN_COLOUR_DEFAULT;
      j->primaries = im.primaries;
      j->transfer = im.transfer;
    }
  } else {
    return spn_error_set(err, SPN_ETYPE, "%s: frame %llu is not (H,W,3) u8, (3,H,W) f32 or nv12/yuv420p planes",
                         j->cfg.path, seq);
  }
  /* the pixels' shape, where the item describes this very picture (a
   * model's output of another size is square: decode resampled its RGB) */
  if (!j->enc && has_im && im.width == *w && im.height == *h && im.sar_num > 0 && im.sar_den > 0) {
    j->sar_num = im.sar_num;
    j->sar_den = im.sar_den;
  }
  return SPN_OK;
}

#ifdef SPN_MEDIA_CUDA
/* A per-job buffer of at least `size` bytes of `mem_kind`, kept for the
 * next frames. Regrowing frees the old one at once: device memory's free
 * waits for the work queued on it (the device layer); a pinned buffer is
 * regrown only once its last download has been waited for (gpu_frame's two
 * slots take turns, and a frame waits for the other slot's download). */
static int32_t job_buffer(encode_job_t *j, spn_buffer_t **b, size_t size, int32_t mem_kind, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  if (*b && host->buffer_size(*b) >= size)
    return SPN_OK;
  host->buffer_unref(b);
  return host->buffer_new_kind(j->stage, size, mem_kind, b, err);
}

/* The job's first frame on a GPU picks the encoder: NVENC reading the
 * GPU's memory where the frame is there (or hwaccel is cuda) and NVENC
 * opens, else the host path; one log line per job says which and why. */
static int32_t gpu_open(encode_job_t *j, bool dev, int32_t w, int32_t h, int32_t fmt, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  bool rgb = fmt == SPN_PIXFMT_RGB24 || fmt == SPN_PIXFMT_BGR24;
  spn_error_t why = SPN_ERROR_INIT;
  const char *reason;
  int32_t rc, level = SPN_LOG_INFO;
  if (j->hwaccel == HW_NONE) {
    reason = "hwaccel is none";
  } else if (!dev && j->hwaccel == HW_DEFAULT) {
    reason = "the frames arrive in host memory";
  } else {
    const char *nv = spn_encoder_nvenc_for(j->cfg.codec);
    void *hwdev = NULL;
    if (!nv) {
      spn_error_set(&why, SPN_EUNSUPPORTED, "codec \"%s\" has no NVENC encoder", j->cfg.codec);
    } else if (spn_media_cuda_device_new(j->stream, &hwdev, &why) == SPN_OK) {
      rc = open_encoder(j, w, h, SPN_PIXFMT_NV12, nv, hwdev, &why);
      spn_media_cuda_device_free(&hwdev); /* the encoder keeps its own reference */
      if (rc == SPN_OK) {
        j->nvenc = true;
        j->enc_fmt = SPN_PIXFMT_NV12;
        j->nv_w = w;
        j->nv_h = h;
        host->log(j->stage, j->job_id, SPN_LOG_INFO, "%s: encoding video with %s from device frames; frames stay on "
                  "the GPU", j->cfg.path, spn_encoder_codec_name(j->enc));
        return SPN_OK;
      }
      if (j->enc) { /* NVENC opened; what failed after it (the held audio) is no reason to fall back */
        *err = why;
        return rc;
      }
    }
    /* the encoder's messages start with the path: the line names it once */
    reason = why.msg;
    size_t pl = strlen(j->cfg.path);
    if (strncmp(reason, j->cfg.path, pl) == 0 && reason[pl] == ':' && reason[pl + 1] == ' ')
      reason += pl + 2;
    if (j->hwaccel == HW_CUDA)
      return spn_error_set(err, why.code ? why.code : SPN_EDEVICE,
                           "%s: NVENC cannot encode from device frames (hwaccel = \"cuda\"): %s", j->cfg.path, reason);
    level = SPN_LOG_WARN;
  }
  /* codec auto would try NVENC again, on host frames: after NVENC failed
   * here that only adds FFmpeg's error lines, so it is libx264 at once */
  const char *codec = level == SPN_LOG_WARN && strcmp(j->cfg.codec, "auto") == 0 ? "libx264" : NULL;
  j->enc_fmt = rgb && dev ? SPN_PIXFMT_YUV420P : fmt;
  if ((rc = open_encoder(j, w, h, j->enc_fmt, codec, NULL, err)))
    return rc;
  host->log(j->stage, j->job_id, level, "%s: encoding video with %s on the host%s (%s)", j->cfg.path,
            spn_encoder_codec_name(j->enc), dev ? ", one download per frame" : "", reason);
  return SPN_OK;
}

/* NVENC: the frame converted on the GPU into the encoder's next NV12 device
 * frame and sent; nothing is downloaded. A host frame (rare: the encoder
 * was opened for device frames) is uploaded once first. */
static int32_t nvenc_frame(encode_job_t *j, spn_buffer_t *buf, bool dev, int32_t w, int32_t h, int32_t fmt,
                           int64_t pts_us, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  int32_t rc;
  const void *src = host->buffer_data(buf);
  if (w != j->nv_w || h != j->nv_h)
    return spn_error_set(err, SPN_EINVAL, "%s: frame is %dx%d, the encoder was opened for %dx%d", j->cfg.path, (int)w,
                         (int)h, (int)j->nv_w, (int)j->nv_h);
  if (!dev) {
    size_t n = spn_pixfmt_tight_size(fmt, w, h);
    if ((rc = job_buffer(j, &j->dev_in, n, SPN_MEM_DEVICE, err)))
      return rc;
    if (SPN_HOST_HAS(host, buffer_copy)) {
      rc = host->buffer_copy(j->stage, j->job_id, j->dev_in, 0, buf, 0, n, err);
    } else {
      spn_image_t im;
      if ((rc = spn_image_wrap(&im, host->buffer_data(buf), w, h, fmt, err)) == SPN_OK)
        rc = spn_media_cuda_upload(&im, host->buffer_data(j->dev_in), j->stream, err);
    }
    if (rc)
      return rc;
    src = host->buffer_data(j->dev_in);
  }
  size_t sn = spn_media_cuda_nv12_scratch_size(fmt, w, h);
  if (sn && (rc = job_buffer(j, &j->scratch, sn, SPN_MEM_DEVICE, err)))
    return rc;
  spn_image_t planes;
  if ((rc = spn_encoder_device_frame(j->enc, &planes, err)) ||
      (rc = spn_media_cuda_to_nv12(src, fmt, w, h, &j->colour, &planes, sn ? host->buffer_data(j->scratch) : NULL,
                                   j->stream, err)))
    return rc;
  /* Wait for the conversion before the encoder reads the frame: the input
   * buffer and our scratch are released or reused after this call, and
   * FFmpeg orders NVENC after the stream's work only when it was built with
   * CUDA stream support. A wait on the GPU, not a copy. */
  if ((rc = spn_media_cuda_sync(j->stream, "converting a frame for NVENC", err)))
    return rc;
  return spn_encoder_send_device_frame(j->enc, pts_us, 1, 1000000, err);
}

/* A frame's failure names the file and the frame, unless the message
 * already starts with the file (the encoder's own do). Returns rc. */
static int32_t frame_failed(encode_job_t *j, int32_t rc, spn_error_t *err) {
  if (err && strncmp(err->msg, j->cfg.path, strlen(j->cfg.path)) != 0)
    spn_error_prefix(err, "%s: frame %lld", j->cfg.path, (long long)j->frames);
  return rc;
}

/* Encode the frame whose download gpu_frame left pending (in the slot
 * before cur), once its mark has passed. */
static int32_t encode_pending(encode_job_t *j, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  if (!j->pend)
    return SPN_OK;
  j->pend = false;
  int s = 1 - j->cur;
  spn_image_t img;
  int32_t rc = spn_media_cuda_wait_mark(j->pin_ev[s], "downloading a frame for the encoder", err);
  if (rc == SPN_OK)
    rc = spn_image_wrap(&img, host->buffer_data(j->pin[s]), j->pend_w, j->pend_h, j->pend_fmt, err);
  if (rc == SPN_OK)
    rc = spn_encoder_write_video(j->enc, &img, j->pend_pts, 1, 1000000, err);
  if (rc != SPN_OK)
    return frame_failed(j, rc, err);
  j->frames++;
  return SPN_OK;
}

/* Host path on a GPU: the frame into pinned host memory in the format the
 * encoder takes, with one download (see the file's header). A host frame
 * is converted at once and *img views the result; a device frame's
 * conversion and download are queued into pin[cur] and left pending
 * (*deferred), after the previous pending frame is encoded. */
static int32_t gpu_frame(encode_job_t *j, spn_buffer_t *buf, bool dev, int32_t w, int32_t h, int32_t fmt,
                         int64_t pts_us, spn_image_t *img, bool *deferred, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  int32_t rc;
  bool rgb = fmt == SPN_PIXFMT_RGB24 || fmt == SPN_PIXFMT_BGR24;
  bool to_yuv = rgb && j->enc_fmt == SPN_PIXFMT_YUV420P;
  *deferred = false;
  if (!dev && !to_yuv) /* a host frame the encoder takes as it is: the CPU path */
    return spn_image_wrap(img, host->buffer_data(buf), w, h, fmt, err);
  size_t n = spn_pixfmt_tight_size(to_yuv ? SPN_PIXFMT_YUV420P : fmt, w, h);
  int s = j->cur;
  if ((rc = job_buffer(j, dev ? &j->pin[s] : &j->pinned, n, SPN_MEM_PINNED, err)))
    return rc;
  void *out = host->buffer_data(dev ? j->pin[s] : j->pinned);
  if (!dev) {
    /* host RGB for an encoder the GPU path opened: the same conversion (CPU twin) */
    spn_image_t src, yuv;
    if ((rc = spn_image_wrap(&src, host->buffer_data(buf), w, h, fmt, err)) ||
        (rc = spn_image_wrap(&yuv, out, w, h, SPN_PIXFMT_YUV420P, err)) ||
        (rc = spn_image_convert_colour(&src, &yuv, &j->colour, err)))
      return rc;
    return spn_image_wrap(img, out, w, h, SPN_PIXFMT_YUV420P, err);
  }
  /* The one download, counted for the stage and the job where the host
   * can (what crossed PCIe). */
  bool counted = SPN_HOST_HAS(host, buffer_copy);
  if (to_yuv) {
    if ((rc = job_buffer(j, &j->yuv_dev, n, SPN_MEM_DEVICE, err)) ||
        (rc = spn_media_cuda_rgb_to_yuv420p_host(host->buffer_data(buf), fmt, w, h, &j->colour,
                                                 host->buffer_data(j->yuv_dev), counted ? NULL : out, j->stream,
                                                 err)) ||
        (counted && (rc = host->buffer_copy(j->stage, j->job_id, j->pin[s], 0, j->yuv_dev, 0, n, err))))
      return rc;
  } else if ((rc = counted ? host->buffer_copy(j->stage, j->job_id, j->pin[s], 0, buf, 0, n, err)
                           : spn_media_cuda_download(host->buffer_data(buf), out, n, j->stream, err))) {
    return rc;
  }
  if ((rc = spn_media_cuda_mark(j->stream, &j->pin_ev[s], err)) || (rc = encode_pending(j, err)))
    return rc;
  j->pend = true;
  j->pend_w = w, j->pend_h = h, j->pend_fmt = to_yuv ? SPN_PIXFMT_YUV420P : fmt;
  j->pend_pts = pts_us;
  j->cur = 1 - s;
  *deferred = true;
  return SPN_OK;
}
#endif

static int32_t write_frame(encode_job_t *j, spn_buffer_t *buf, int32_t w, int32_t h, int32_t fmt, int64_t pts_us,
                           spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  int32_t rc;
  if (!j->enc)
    j->first_pts_us = pts_us;
#ifdef SPN_MEDIA_CUDA
  if (j->on_gpu) {
    int32_t kind = SPN_DEVICE_CPU, index = 0;
    host->buffer_device(buf, &kind, &index);
    bool dev = kind == SPN_DEVICE_CUDA && host->buffer_mem_kind(buf) == SPN_MEM_DEVICE;
    spn_image_t gimg;
    bool deferred = false;
    if (!j->enc)
      rc = gpu_open(j, dev, w, h, fmt, err);
    else
      rc = SPN_OK;
    /* A host frame is encoded at once: after the pending device frame. */
    if (rc == SPN_OK && !dev)
      rc = encode_pending(j, err);
    if (rc == SPN_OK)
      rc = j->nvenc ? nvenc_frame(j, buf, dev, w, h, fmt, pts_us, err)
                    : gpu_frame(j, buf, dev, w, h, fmt, pts_us, &gimg, &deferred, err);
    if (rc)
      return frame_failed(j, rc, err);
    if (deferred)
      return SPN_OK; /* counted when encoded (encode_pending) */
    if (!j->nvenc && (rc = spn_encoder_write_video(j->enc, &gimg, pts_us, 1, 1000000, err)))
      return rc;
    j->frames++;
    return SPN_OK;
  }
#endif
  if (!j->enc && (rc = open_encoder(j, w, h, fmt, NULL, NULL, err)))
    return rc;
  spn_image_t img;
  if ((rc = spn_image_wrap(&img, host->buffer_data(buf), w, h, fmt, err)))
    return spn_error_prefix(err, "%s", j->cfg.path);
  if ((rc = spn_encoder_write_video(j->enc, &img, pts_us, 1, 1000000, err)))
    return rc;
  j->frames++;
  return SPN_OK;
}

/* fps 0: the stream's rate from the interval between the first two frames
 * (microseconds), snapped to the common rate it rounds (30000/1001 is not
 * 29.97), else 1e6/interval (the encoder reduces it); 25 when there is no
 * interval to go by (one frame, or timestamps that do not increase). */
static void rate_from_frames(encode_job_t *j, int64_t interval_us) {
  static const int32_t common[][2] = {{24000, 1001}, {24, 1},  {25, 1},  {30000, 1001}, {30, 1},
                                      {48, 1},       {50, 1},  {60000, 1001}, {60, 1}, {72, 1},
                                      {90, 1},       {100, 1}, {120000, 1001}, {120, 1}, {144, 1},
                                      {240, 1}};
  j->fps_num = 25;
  j->fps_den = 1;
  if (interval_us <= 0 || interval_us > 60 * 1000000LL)
    return;
  double fps = 1e6 / (double)interval_us;
  for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) {
    double c = (double)common[i][0] / common[i][1];
    if (fabs(fps - c) <= c * 2e-4) {
      j->fps_num = common[i][0];
      j->fps_den = common[i][1];
      return;
    }
  }
  j->fps_num = 1000000;
  j->fps_den = (int32_t)interval_us;
}

static int32_t write_held(encode_job_t *j, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  int32_t rc = SPN_OK;
  for (size_t i = 0; i < j->n_held; i++) {
    held_frame_t *f = &j->held[i];
    if (rc == SPN_OK)
      rc = write_frame(j, f->buf, f->w, f->h, f->fmt, f->pts_us, err);
    host->buffer_unref(&f->buf);
  }
  j->n_held = 0;
  return rc;
}

static int32_t take_audio(encode_job_t *j, spn_msg_t *msg, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(j->stage);
  if (j->file_audio)
    return SPN_OK;
  int64_t ai = host->msg_find(msg, SPN_MEDIA_AUDIO_META);
  spn_item_t m = {.struct_size = sizeof m};
  if (ai >= 0 && host->msg_item(msg, (size_t)ai, &m) == SPN_OK && m.meta_size == sizeof(spn_media_audio_meta_t) &&
      !j->a_known) {
    spn_media_audio_meta_t am;
    memcpy(&am, m.meta, sizeof am);
    if (am.channels < 0 || am.channels > 16 || (am.channels > 0 && (am.rate <= 0 || am.rate > 768000)))
      return spn_error_set(err, SPN_EINVAL, "%s: audio format %d Hz x %d is not usable", j->cfg.path, (int)am.rate,
                           (int)am.channels);
    j->a_rate = am.rate;
    j->a_ch = am.channels;
    j->a_known = true;
  }
  int64_t pi = host->msg_find(msg, "pcm");
  if (pi < 0)
    return SPN_OK;
  spn_item_t it = {.struct_size = sizeof it};
  if (host->msg_item(msg, (size_t)pi, &it) != SPN_OK)
    return SPN_OK;
  const spn_tensor_t *t = &it.tensor;
  if (!j->av || !j->a_known || j->a_ch <= 0)
    return spn_error_set(err, SPN_EINVAL, "%s: audio arrived before its \"audio_format\" (connect decode.audio)",
                         j->cfg.path);
  if (t->dtype != SPN_DTYPE_F32 || t->ndim != 2 || t->shape[1] != j->a_ch)
    return spn_error_set(err, SPN_ETYPE, "%s: audio message %llu is not (samples, %d) f32", j->cfg.path,
                         (unsigned long long)host->msg_envelope(msg)->seq, (int)j->a_ch);
  const float *pcm = host->buffer_data(it.buffer);
  if (j->enc)
    return spn_encoder_write_audio(j->enc, pcm, t->shape[0], err);
  /* before the first picture: keep it (decode sends audio in demux order,
   * so this is at most the decoder's delay) */
  size_t n = (size_t)t->shape[0] * (size_t)j->a_ch;
  if (j->n_pending + n > j->cap_pending) {
    size_t cap = (j->n_pending + n) * 2;
    float *np = realloc(j->pending, cap * sizeof *np);
    if (!np)
      return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", j->cfg.path);
    j->pending = np;
    j->cap_pending = cap;
  }
  memcpy(j->pending + j->n_pending, pcm, n * sizeof *pcm);
  j->n_pending += n;
  return SPN_OK;
}

static int32_t write_msg(spn_stage_t *stage, encode_job_t *j, spn_msg_t *msg, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t rc = take_audio(j, msg, err);
  if (rc)
    return rc;
  if (j->a_known && j->fps_num && j->n_held && (rc = write_held(j, err)))
    return rc;
  int64_t idx = host->msg_find(msg, "frame");
  spn_item_t it = {.struct_size = sizeof it};
  if (idx < 0 || host->msg_item(msg, (size_t)idx, &it) != SPN_OK) {
    if (j->av && (host->msg_find(msg, "pcm") >= 0 || host->msg_find(msg, SPN_MEDIA_AUDIO_META) >= 0))
      return SPN_OK; /* an audio message */
    return spn_error_set(err, SPN_EINVAL, "%s: message %llu has no \"frame\" item", j->cfg.path,
                         (unsigned long long)host->msg_envelope(msg)->seq);
  }
  int32_t fmt = 0, w = 0, h = 0;
  if ((rc = frame_layout(j, msg, &it, &fmt, &w, &h, err)))
    return rc;
  int64_t pts_us = llround(host->msg_envelope(msg)->pts * 1e6);
  if (!j->fps_num && j->n_held)
    rate_from_frames(j, pts_us - j->held[j->n_held - 1].pts_us);
  if (!j->a_known || !j->fps_num) {
    /* encode_av before the soundtrack's format, or the first picture before
     * the frames' rate is known (fps 0): hold the picture */
    if (j->n_held == j->cap_held) {
      size_t cap = j->cap_held ? j->cap_held * 2 : 8;
      held_frame_t *nh = realloc(j->held, cap * sizeof *nh);
      if (!nh)
        return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", j->cfg.path);
      j->held = nh;
      j->cap_held = cap;
    }
    j->held[j->n_held++] = (held_frame_t){.buf = host->buffer_ref(it.buffer), .w = w, .h = h, .fmt = fmt,
                                          .pts_us = pts_us};
    return SPN_OK;
  }
  if (j->n_held && (rc = write_held(j, err)))
    return rc;
  return write_frame(j, it.buffer, w, h, fmt, pts_us, err);
}

static int32_t encode_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                              spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
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
  int32_t rc;
  if (j->n_held) {
    j->a_known = true; /* the audio input ended without a format: no soundtrack */
    if (!j->fps_num)
      rate_from_frames(j, 0); /* one frame */
    if ((rc = write_held(j, err)))
      return rc;
  }
  if (!j->enc)
    return spn_error_set(err, SPN_EMEDIA, "%s: no video frames arrived", j->cfg.path);
#ifdef SPN_MEDIA_CUDA
  if ((rc = encode_pending(j, err)))
    return rc;
#endif
  return spn_encoder_finish(j->enc, err);
}

static void encode_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  const spn_host_api_t *host = spn_stage_host(stage);
  encode_job_t *j = job_state;
  if (!j)
    return;
  spn_encoder_free(j->enc); /* removes the temporary file unless finished */
  for (size_t i = 0; i < j->n_held; i++)
    host->buffer_unref(&j->held[i].buf);
#ifdef SPN_MEDIA_CUDA
  if (j->on_gpu && (j->yuv_dev || j->pinned || j->pin[0] || j->pin[1] || j->dev_in || j->scratch)) {
    /* a frame that failed half-way may have left work queued on them */
    spn_error_t e = SPN_ERROR_INIT;
    if (spn_media_cuda_sync(j->stream, "closing the job", &e) != SPN_OK)
      host->log(stage, j->job_id, SPN_LOG_WARN, "%s: %s", j->cfg.path, e.msg);
  }
  host->buffer_unref(&j->yuv_dev);
  host->buffer_unref(&j->pinned);
  for (int s = 0; s < 2; s++) {
    host->buffer_unref(&j->pin[s]);
    spn_media_cuda_mark_free(&j->pin_ev[s]);
  }
  host->buffer_unref(&j->dev_in);
  host->buffer_unref(&j->scratch);
#endif
  free(j->held);
  free(j->pending);
  free(j);
}

static void encode_destroy(spn_stage_t *stage, void *state) {}

#ifdef SPN_MEDIA_CUDA
#define SPN_MEDIA_DEVICE_NEED SPN_NEED_EITHER /* device frames encoded from a GPU, as before on the CPU */
#else
#define SPN_MEDIA_DEVICE_NEED SPN_NEED_CPU
#endif

static int32_t encode_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  spn_media_log_install();
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "encode",
      .doc = "writes H.264 video (libx264/NVENC) with AAC audio to MP4/MKV",
      .schema = encode_schema,
      .config_size = sizeof(encode_config_t),
      .inputs = encode_inputs,
      .n_inputs = 1,
      .device_need = SPN_MEDIA_DEVICE_NEED,
      .max_batch = 1,
      .create = encode_create,
      .job_open = encode_job_open,
      .process = encode_process,
      .flush = encode_flush,
      .job_close = encode_job_close,
      .destroy = encode_destroy,
      .input_caps = encode_caps,
      .port_caps = encode_port_caps,
  };
  static const spn_stage_kind_t kind_av = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "encode_av",
      .doc = "writes H.264 video with the AAC soundtrack of its audio input (decode.audio) to MP4/MKV",
      .schema = encode_schema,
      .config_size = sizeof(encode_config_t),
      .inputs = encode_av_inputs,
      .n_inputs = 2,
      .device_need = SPN_MEDIA_DEVICE_NEED,
      .max_batch = 1,
      .create = encode_create,
      .job_open = encode_av_job_open,
      .process = encode_process,
      .flush = encode_flush,
      .job_close = encode_job_close,
      .destroy = encode_destroy,
      .input_caps = encode_caps,
      .port_caps = encode_port_caps,
  };
  int32_t rc = h->register_kind(plugin, &kind, err);
  return rc ? rc : h->register_kind(plugin, &kind_av, err);
}

SPN_PLUGIN_DEFINE(encode, .version = "1.0", .license = "Apache-2.0", .init = encode_init)
