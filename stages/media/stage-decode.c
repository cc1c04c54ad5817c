/* stage-decode.c — `decode`, the media source stage (libspindle-decode.so).
 *
 * A thin wrapper over media-decode.c: per job it opens `path` and, one
 * decoded item per generate() call (so back-pressure works), emits video
 * frames on port 0 ("video": item "frame", (H,W,3) u8 for rgb24/bgr24,
 * (3,H,W) f32 for rgbf32p/bgrf32p, the tight planes as one (N) u8 vector
 * for nv12/yuv420p) and audio on port 1 ("audio": item "pcm", (samples,
 * channels) f32). Each port has its own dense seq from 0; envelopes carry the
 * pts in seconds; the video envelope's `total` is the frame count estimated
 * from the container (-1 when unknown). Every frame carries an "image" meta
 * item (width, height, pixel format: the (N) vector of nv12/yuv420p needs
 * it); every audio message an "audio_format" one (rate, channels), and the
 * audio port's first message of each job is that item alone — channels 0
 * when no audio follows — so a consumer such as encode_av knows the
 * soundtrack's format, or its absence, before the first picture. An unreadable, corrupt or truncated
 * file fails the job with a message naming the file and what is wrong,
 * unless `tolerate_errors` accepts the damage (then a warning says what was
 * lost).
 *
 * GPU (a CUDA build; the kind is then SPN_NEED_EITHER): placed on a CUDA
 * device, the stage decodes with NVDEC on that GPU (FFmpeg's CUDA hwaccel on
 * the GPU's primary context, its copies on the stage's stream, media-cuda.c)
 * and converts each NV12 picture on the GPU into a device buffer of the
 * same shape as the CPU path's, emitted as a device tensor after
 * buffer_set_ready. Where NVDEC cannot be used (hwaccel none, no NVDEC or
 * no CUDA hwaccel for the codec, a stream NVDEC refuses, a rotation, a
 * layout other than NV12) it decodes in software and uploads each frame
 * once, and says why in one log line per job. Audio stays in host memory.
 * Placed on the CPU it does exactly what it does in a build without CUDA.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/plugin.h"
#include "media-decode.h"
#ifdef SPN_MEDIA_CUDA
#include "media-cuda.h"
#endif


typedef struct decode_config {
  char *path;
  char *pixel_format;
  int64_t audio_rate;
  int64_t audio_channels;
  double start;
  double duration;
  char *hwaccel;
  bool audio;
  bool tolerate_errors;
  bool follow_references;
} decode_config_t;

static const spn_config_field_t decode_schema[] = {
    {.key = "path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB | SPN_CONFIG_REQUIRED,
     .offset = offsetof(decode_config_t, path), .doc = "media file to read (anything FFmpeg reads)"},
    {.key = "pixel_format", .type = SPN_CONFIG_STRING, .offset = offsetof(decode_config_t, pixel_format),
     .doc = "frame format: rgb24, bgr24, rgbf32p, bgrf32p, nv12, yuv420p", .def_str = "rgb24"},
    {.key = "audio_rate", .type = SPN_CONFIG_INT, .offset = offsetof(decode_config_t, audio_rate),
     .doc = "audio sample rate to resample to (0: the file's)", .def_int = 0, .min = 0, .max = 768000},
    {.key = "audio_channels", .type = SPN_CONFIG_INT, .offset = offsetof(decode_config_t, audio_channels),
     .doc = "audio channel count to mix to (0: the file's)", .def_int = 0, .min = 0, .max = 16},
    {.key = "start", .type = SPN_CONFIG_FLOAT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(decode_config_t, start),
     .doc = "segment start in seconds", .def_float = 0.0, .min = 0.0, .max = 1e9},
    {.key = "duration", .type = SPN_CONFIG_FLOAT, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(decode_config_t, duration), .doc = "segment length in seconds (0: to the end)",
     .def_float = 0.0, .min = 0.0, .max = 1e9},
    {.key = "hwaccel", .type = SPN_CONFIG_STRING, .offset = offsetof(decode_config_t, hwaccel),
     .doc = "video decoding: default (NVDEC when placed on a CUDA device, else software), none (software), auto "
            "(NVDEC when available) or cuda (NVDEC required)",
     .def_str = "default"},
    {.key = "audio", .type = SPN_CONFIG_BOOL, .offset = offsetof(decode_config_t, audio),
     .doc = "decode and emit the audio track on port `audio`", .def_int = 1},
    {.key = "tolerate_errors", .type = SPN_CONFIG_BOOL, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(decode_config_t, tolerate_errors),
     .doc = "accept damaged input: skip corrupt packets and a truncated end (default: fail the job)",
     .def_int = 0},
    {.key = "follow_references", .type = SPN_CONFIG_BOOL, .offset = offsetof(decode_config_t, follow_references),
     .doc = "let a local file open others: an HLS/DASH playlist's segments, a concat list's files, external "
            "media references (default: the file is read alone; set per pipeline, never per job)",
     .def_int = 0},
    {0},
};

static const spn_port_t decode_outputs[] = {{.name = "video", .type = "video"}, {.name = "audio", .type = "audio"}};

/* ABI 1.1 formats: the one pixel_format the config names; f32 audio at the
 * configured rate and channel count (0: the file's, unknown until run).
 * Memory: video frames in device memory where the stage is placed on a GPU
 * and in host memory elsewhere; caps are per config, not per placement, so a
 * CUDA build declares both and the runtime narrows the set by where the
 * stage runs (a producer off the GPU gives the host memory it declares).
 * Audio is always host memory (0). */
static int32_t decode_port_caps(const void *config, bool is_output, uint32_t port, spn_port_caps_t *caps,
                                spn_error_t *err) {
  const decode_config_t *c = config;
  if (!is_output)
    return SPN_OK;
  if (port == 1) {
    caps->sample_formats = SPN_FMTSET(SPN_SAMPLE_F32);
    caps->sample_rate = (uint32_t)c->audio_rate;
    caps->channels = (uint32_t)c->audio_channels;
    return SPN_OK;
  }
  int32_t f = spn_pixfmt_from_name(c->pixel_format);
  if (f == SPN_PIXFMT_NONE || f == SPN_PIXFMT_GRAY8 || f == SPN_PIXFMT_GRAYF32)
    return spn_error_set(err, SPN_ECONFIG, "pixel_format \"%s\" is not rgb24, bgr24, rgbf32p, bgrf32p, nv12 or yuv420p",
                         c->pixel_format);
  caps->pixel_formats = SPN_FMTSET(f);
#ifdef SPN_MEDIA_CUDA
  caps->mem_kinds = SPN_MEMSET_DEVICE | SPN_MEMSET_HOST;
#endif
  return SPN_OK;
}

typedef struct decode_job {
  uint64_t job_id;
  spn_decoder_t *dec;
  uint64_t vseq, aseq;
  int64_t total;
  const char *path;  /* the job's config string (host-owned, valid for the job) */
  bool format_sent;  /* the audio port's "audio_format" message went out */
  spn_stage_t *stage;
  spn_media_log_t log; /* FFmpeg's messages about this job's file */
  int32_t pixfmt;      /* what the frames are emitted as */
#ifdef SPN_MEDIA_CUDA
  /* Placed on a CUDA device: frames are emitted in its memory. */
  bool on_gpu;
  cudaStream_t stream;  /* the instance's */
  void *hwdev;          /* FFmpeg's CUDA device for NVDEC (AVBufferRef *), or NULL */
  const char *open_why; /* why NVDEC is not used, when known at open */
  char open_why_buf[sizeof(((spn_error_t *)0)->msg)];
  spn_buffer_t *scratch; /* device scratch of the conversions and the turn, kept for the job */
  spn_buffer_t *staging; /* software path: the frame in pinned memory, uploaded from there */
  bool staged;           /* an upload from staging may still be queued on the stream */
  bool said_path;       /* the log line saying NVDEC or software + upload went out */
#endif
} decode_job_t;

static void ffmpeg_log(void *user, int32_t level, const char *msg) {
  decode_job_t *j = user;
  const spn_host_api_t *host = spn_stage_host(j->stage);
  host->log(j->stage, j->job_id, level, "%s: %s", j->path, msg);
}

static int32_t parse_options(spn_stage_t *stage, const decode_config_t *c, spn_decode_opts_t *o, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_decode_opts_t d = SPN_DECODE_OPTS_INIT;
  *o = d;
  o->pixfmt = spn_pixfmt_from_name(c->pixel_format);
  if (o->pixfmt == SPN_PIXFMT_NONE || o->pixfmt == SPN_PIXFMT_GRAY8 || o->pixfmt == SPN_PIXFMT_GRAYF32)
    return spn_error_set(err, SPN_ECONFIG,
                         "stage \"%s\": pixel_format \"%s\" is not rgb24, bgr24, rgbf32p, bgrf32p, nv12 or yuv420p",
                         host->stage_get_name(stage), c->pixel_format);
  /* "default": NVDEC when the stage is placed on a CUDA device (job_open
   * makes it auto there), software on the CPU, where it reads as none. */
  if (strcmp(c->hwaccel, "none") == 0 || strcmp(c->hwaccel, "default") == 0)
    o->hwaccel = SPN_HWACCEL_NONE;
  else if (strcmp(c->hwaccel, "auto") == 0)
    o->hwaccel = SPN_HWACCEL_AUTO;
  else if (strcmp(c->hwaccel, "cuda") == 0)
    o->hwaccel = SPN_HWACCEL_CUDA;
  else
    return spn_error_set(err, SPN_ECONFIG, "stage \"%s\": hwaccel \"%s\" is not default, none, auto or cuda",
                         host->stage_get_name(stage), c->hwaccel);
  o->audio_rate = (int32_t)c->audio_rate;
  o->audio_channels = (int32_t)c->audio_channels;
  o->start = c->start;
  o->duration = c->duration;
  o->want_audio = c->audio;
  o->tolerate_errors = c->tolerate_errors;
  o->follow_references = c->follow_references;
  return SPN_OK;
}

static int32_t decode_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  spn_decode_opts_t o;
  *state = NULL;
  return parse_options(stage, config, &o, err); /* refuse bad options before any job */
}

#ifdef SPN_MEDIA_CUDA
/* On a CUDA device: the job's NVDEC device (the instance's GPU, primary
 * context and stream) unless hwaccel says software; frames are asked for on
 * the device. On the CPU: nothing changes. */
static int32_t gpu_job_open(spn_stage_t *stage, const decode_config_t *c, decode_job_t *j, spn_decode_opts_t *o,
                            spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t kind = SPN_DEVICE_CPU, index = 0;
  host->stage_get_device(stage, &kind, &index);
  if (kind != SPN_DEVICE_CUDA)
    return SPN_OK;
  j->on_gpu = true;
  j->stream = (cudaStream_t)host->stage_get_stream(stage);
  o->device_frames = 1;
  o->device_rotate = 1; /* a phone video's turn is done on the GPU, after the upload or from NVDEC */
  if (strcmp(c->hwaccel, "default") == 0)
    o->hwaccel = SPN_HWACCEL_AUTO;
  if (o->hwaccel == SPN_HWACCEL_NONE) {
    j->open_why = "hwaccel is none";
    return SPN_OK;
  }
  spn_error_t e = SPN_ERROR_INIT;
  if (spn_media_cuda_device_new(j->stream, &j->hwdev, &e) != SPN_OK) {
#ifdef SPN_MEDIA_EMU_NVDEC
    /* The fake GPU (tests/gpu/host-emu) has no NVDEC; with SPINDLE_EMU_NVDEC
     * set, software frames come as NVDEC's would, and take its path here. */
    const char *emu = getenv("SPINDLE_EMU_NVDEC");
    if (emu && strcmp(emu, "1") == 0) {
      o->hwaccel = SPN_HWACCEL_NONE;
      o->emu_upload = spn_media_cuda_emu_upload;
      o->emu_free = spn_media_cuda_emu_free;
      return SPN_OK;
    }
#endif
    if (o->hwaccel == SPN_HWACCEL_CUDA)
      return spn_error_set(err, SPN_EDEVICE, "%s: NVDEC is not available (hwaccel = \"cuda\"): %s", c->path, e.msg);
    snprintf(j->open_why_buf, sizeof j->open_why_buf, "%s", e.msg);
    j->open_why = j->open_why_buf;
    /* software, not FFmpeg's own CUDA device: its frames would live in a
     * context other than the runtime's */
    o->hwaccel = SPN_HWACCEL_NONE;
    return SPN_OK;
  }
  o->hw_device = j->hwdev;
  return SPN_OK;
}

/* Software decoding on a GPU whose frames go to a stage in the CPU pool:
 * the runtime would copy each uploaded frame straight back down
 * (stage_port_format says the edge is host memory), so the frames stay in
 * host memory, as on the CPU, and nothing crosses PCIe. NVDEC's frames
 * are still converted on the GPU and copied down once by the runtime. */
static void gpu_software_to_host(spn_stage_t *stage, decode_job_t *j, spn_decode_opts_t *o) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_port_format_t pf = {.struct_size = sizeof pf};
  spn_error_t e = SPN_ERROR_INIT;
  if (!j->on_gpu || o->hwaccel != SPN_HWACCEL_NONE || o->emu_upload || !SPN_HOST_HAS(host, stage_port_format) ||
      host->stage_port_format(stage, true, 0, &pf, &e) != SPN_OK ||
      (pf.mem_kind != SPN_MEM_HOST && pf.mem_kind != SPN_MEM_PINNED))
    return;
  j->on_gpu = false;
  o->device_frames = 0;
  o->device_rotate = 0;
  host->log(stage, j->job_id, SPN_LOG_INFO,
            "%s: decoding video in software into host memory, as the stage it feeds runs on the CPU (%s)", j->path,
            j->open_why ? j->open_why : "no NVDEC");
}

/* The one line per job that says how its frames reach the GPU. */
static void gpu_say_path(spn_stage_t *stage, decode_job_t *j, const spn_media_item_t *it) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (j->said_path)
    return;
  j->said_path = true;
  char turn[48] = "";
  bool resampled = it->show_w != it->image.width || it->show_h != it->image.height;
  if (it->rotation)
    snprintf(turn, sizeof turn, "; turned %d degrees clockwise on the GPU", (int)it->rotation);
  if (it->hw_frame) {
    host->log(stage, j->job_id, SPN_LOG_INFO, "%s: decoding video with NVDEC; frames stay on the GPU%s%s%s", j->path,
              it->tone_map ? "; HDR tone-mapped on the GPU"
              : it->deep   ? "; samples above 8 bits rounded to 8 on the GPU" : "",
              resampled ? "; resampled to square pixels on the GPU" : "", turn);
    return;
  }
  const char *why = j->open_why ? j->open_why : spn_decoder_info(j->dec)->host_frames_why;
  bool asked = j->open_why && strcmp(j->open_why, "hwaccel is none") == 0;
  host->log(stage, j->job_id, asked ? SPN_LOG_INFO : SPN_LOG_WARN,
            "%s: decoding video in software and uploading each frame to the GPU (%s)%s", j->path,
            why ? why : "NVDEC gave no frame on the device", turn);
}

/* The job's device scratch, at least `need` bytes (kept while big enough;
 * a smaller one is replaced once queued work that may read it is done). */
static int32_t gpu_scratch(spn_stage_t *stage, decode_job_t *j, size_t need, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t rc;
  if (!need || (j->scratch && host->buffer_size(j->scratch) >= need))
    return SPN_OK;
  if (j->scratch) {
    /* the old one may still be read by queued work */
    if ((rc = spn_media_cuda_sync(j->stream, "replacing the conversion scratch", err)))
      return rc;
    host->buffer_unref(&j->scratch);
  }
  return host->buffer_new(stage, need, &j->scratch, err);
}

/* The software path's upload of a frame of n tight bytes into the first
 * bytes of `to`: the frame packed into pinned memory, then one counted copy
 * (buffer_copy), so the stage's and the job's transfers show what crossed
 * PCIe. The staging buffer is reused frame after frame; the previous upload
 * from it is waited for first (long done by then: a frame takes longer to
 * decode in software than to upload). */
static int32_t gpu_upload_counted(spn_stage_t *stage, decode_job_t *j, const spn_media_item_t *it, spn_buffer_t *to,
                                  size_t n, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t rc;
  if (j->staged) {
    if ((rc = spn_media_cuda_sync(j->stream, "reusing the upload's staging buffer", err)))
      return rc;
    j->staged = false;
  }
  if (!j->staging || host->buffer_size(j->staging) < n) {
    host->buffer_unref(&j->staging);
    if ((rc = host->buffer_new_kind(stage, n, SPN_MEM_PINNED, &j->staging, err)))
      return rc;
  }
  spn_image_t tight;
  if ((rc = spn_image_wrap(&tight, host->buffer_data(j->staging), it->image.width, it->image.height,
                           it->image.format, err)) ||
      (rc = spn_image_copy(&it->image, &tight, err)))
    return rc;
  if ((rc = host->buffer_copy(stage, j->job_id, to, 0, j->staging, 0, n, err)))
    return rc;
  j->staged = true;
  return SPN_OK;
}

/* The software path: the CPU's frame uploaded once (counted where the host
 * has buffer_copy). A frame still to be turned (it->rotation) is uploaded
 * as it is into the scratch and turned from there into buf on the GPU. */
static int32_t gpu_upload(spn_stage_t *stage, decode_job_t *j, const spn_media_item_t *it, spn_buffer_t *buf,
                          spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  size_t n = host->buffer_size(buf); /* the same bytes turned or not */
  int32_t rc;
  spn_buffer_t *to = buf;
  if (it->rotation) {
    if ((rc = gpu_scratch(stage, j, n, err)))
      return rc;
    to = j->scratch;
  }
  if (!SPN_HOST_HAS(host, buffer_copy))
    rc = spn_media_cuda_upload(&it->image, host->buffer_data(to), j->stream, err);
  else
    rc = gpu_upload_counted(stage, j, it, to, n, err);
  if (rc || !it->rotation)
    return rc;
  return spn_media_cuda_rotate(host->buffer_data(j->scratch), it->image.format, it->image.width, it->image.height,
                               it->rotation, host->buffer_data(buf), j->stream, err);
}

/* A video frame into device memory: NVDEC's picture (NV12, or P010/P016
 * rounded to 8 bits) converted and turned upright on the GPU, or the CPU
 * path's frame uploaded once (and turned on the GPU). buf: tight, upright
 * (the CPU path's layout). */
static int32_t gpu_fill_frame(spn_stage_t *stage, decode_job_t *j, spn_media_item_t *it, spn_buffer_t *buf,
                              spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int32_t rc;
  if (it->hw_frame) {
    gpu_say_path(stage, j, it);
    size_t need = spn_media_cuda_item_scratch_size(it, j->pixfmt);
    if ((rc = gpu_scratch(stage, j, need, err)))
      return rc;
    rc = spn_media_cuda_from_item(it, j->pixfmt, host->buffer_data(buf), need ? host->buffer_data(j->scratch) : NULL,
                                  j->stream, err);
  } else {
    gpu_say_path(stage, j, it);
    rc = gpu_upload(stage, j, it, buf, err);
  }
  if (rc == SPN_OK)
    rc = host->buffer_set_ready(stage, buf, err);
  return rc; /* decode_generate names the file and frame */
}
#endif

static int32_t decode_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                               spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const decode_config_t *c = job->config;
  spn_decode_opts_t o;
  int32_t rc = parse_options(stage, c, &o, err);
  if (rc)
    return rc;
  decode_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "decode: out of memory");
  j->job_id = job->job_id;
  j->path = c->path;
  j->stage = stage;
  j->log = (spn_media_log_t){.magic = SPN_MEDIA_LOG_MAGIC, .fn = ffmpeg_log, .user = j};
  j->pixfmt = o.pixfmt;
  o.log = &j->log;
#ifdef SPN_MEDIA_CUDA
  if ((rc = gpu_job_open(stage, c, j, &o, err))) {
    free(j);
    return rc;
  }
  gpu_software_to_host(stage, j, &o);
#endif
  if ((rc = spn_decoder_new(c->path, &o, &j->dec, err))) {
#ifdef SPN_MEDIA_CUDA
    spn_media_cuda_device_free(&j->hwdev);
#endif
    free(j);
    return rc;
  }
  const spn_decode_info_t *in = spn_decoder_info(j->dec);
  double len = c->duration > 0 ? c->duration : in->duration - c->start;
  j->total = len > 0 ? (int64_t)llround(len * in->fps_num / in->fps_den) : -1;
#ifdef SPN_MEDIA_CUDA
  if (in->hwaccel_active && !j->on_gpu) /* on a GPU, the first frame says how it came */
#else
  if (in->hwaccel_active)
#endif
    host->log(stage, job->job_id, SPN_LOG_INFO, "%s: decoding video on CUDA", c->path);
  /* HDR through RGB is tone-mapped to SDR: one line says so (4:2:0 frames
   * keep the file's tags: transcode's output is still HDR) */
  char hdr[96];
  if (in->tone_mapped && spn_decode_hdr(in, hdr, sizeof hdr))
    host->log(stage, job->job_id, SPN_LOG_INFO,
              "%s: HDR video (%s) tone-mapped to SDR BT.709 (reference white 203 cd/m2, peak 1000 cd/m2)", c->path,
              hdr);
  *job_state = j;
  return SPN_OK;
}

static int32_t emit_item(spn_stage_t *stage, decode_job_t *j, spn_media_item_t *it, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_tensor_t t = SPN_TENSOR_INIT;
  const spn_image_t *im = &it->image;
  int video = it->kind == SPN_MEDIA_VIDEO;
  /* An NVDEC frame (hw_frame) is NV12 on the device until gpu_fill_frame
   * converts it: the tensor and its "image" item have the job's format. */
  int32_t fmt = it->hw_frame ? j->pixfmt : im->format;
  /* A frame still to be turned (on the GPU) is emitted upright, and one
   * still to be resampled to square pixels at that size. */
  bool quarter = it->rotation == 90 || it->rotation == 270;
  int32_t bw = it->hw_frame && it->show_w > 0 ? it->show_w : im->width;
  int32_t bh = it->hw_frame && it->show_h > 0 ? it->show_h : im->height;
  int32_t ow = quarter ? bh : bw, oh = quarter ? bw : bh;
  if (video) {
    if (fmt == SPN_PIXFMT_RGB24 || fmt == SPN_PIXFMT_BGR24) {
      t.dtype = SPN_DTYPE_U8;
      t.ndim = 3;
      t.shape[0] = oh;
      t.shape[1] = ow;
      t.shape[2] = 3;
    } else if (fmt == SPN_PIXFMT_RGBF32P || fmt == SPN_PIXFMT_BGRF32P) {
      t.dtype = SPN_DTYPE_F32;
      t.ndim = 3;
      t.shape[0] = 3;
      t.shape[1] = oh;
      t.shape[2] = ow;
    } else {
      t.dtype = SPN_DTYPE_U8;
      t.ndim = 1;
      t.shape[0] = (int64_t)ow * oh + 2 * (int64_t)((ow + 1) / 2) * ((oh + 1) / 2);
    }
  } else {
    t.dtype = SPN_DTYPE_F32;
    t.ndim = 2;
    t.shape[0] = it->n_samples;
    t.shape[1] = it->channels;
  }
  spn_buffer_t *buf = NULL;
  int32_t rc;
#ifdef SPN_MEDIA_CUDA
  if (j->on_gpu) {
    /* frames in the GPU's memory, audio in host memory */
    rc = video ? host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err)
               : host->buffer_new_kind(stage, spn_tensor_nbytes(&t), SPN_MEM_HOST, &buf, err);
    if (rc == SPN_OK && video && (rc = gpu_fill_frame(stage, j, it, buf, err)))
      host->buffer_unref(&buf);
    if (rc)
      return rc;
  } else if (j->stream) {
    /* placed on a GPU, frames in host memory (gpu_software_to_host) */
    if ((rc = host->buffer_new_kind(stage, spn_tensor_nbytes(&t), SPN_MEM_HOST, &buf, err)))
      return rc;
  } else
#endif
  if ((rc = host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err)))
    return rc;
  uint8_t *dst = host->buffer_data(buf);
#ifdef SPN_MEDIA_CUDA
  if (j->on_gpu && video) {
    /* filled on the GPU above */
  } else
#endif
  if (video) {
    /* copy plane rows tightly (the image rows are padded) */
    for (int32_t p = 0; p < im->nplanes; p++) {
      int32_t pw, ph;
      spn_pixfmt_plane_size(im->format, im->width, im->height, p, &pw, &ph);
      size_t row = (size_t)pw * (im->format == SPN_PIXFMT_RGB24 || im->format == SPN_PIXFMT_BGR24 ? 3
                                 : im->format == SPN_PIXFMT_NV12 && p == 1                       ? 2
                                 : im->format == SPN_PIXFMT_RGBF32P || im->format == SPN_PIXFMT_BGRF32P ? 4
                                                                                                     : 1);
      for (int32_t y = 0; y < ph; y++, dst += row)
        memcpy(dst, im->data[p] + y * im->stride[p], row);
    }
  } else {
    memcpy(dst, it->samples, spn_tensor_nbytes(&t));
  }
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = j->job_id, .stream = video ? 0 : 1,
                        .seq = video ? j->vseq : j->aseq, .pts = it->pts_sec, .total = video ? j->total : -1};
  if (video)
    env.flags = SPN_MSG_KEY;
  spn_msg_t *msg = NULL;
  rc = host->msg_new(stage, &env, &msg, err);
  if (rc == SPN_OK)
    rc = host->msg_add_tensor(msg, video ? "frame" : "pcm", &t, buf, err);
  if (rc == SPN_OK && video) {
    /* size and layout: the (N) vector of nv12/yuv420p needs them; the
     * colour: what those samples are in, and what encode records */
    const spn_decode_info_t *in = spn_decoder_info(j->dec);
    bool square = fmt != SPN_PIXFMT_NV12 && fmt != SPN_PIXFMT_YUV420P; /* RGB was resampled to square pixels */
    bool sdr = in->tone_mapped;                                         /* ... and HDR tone-mapped to BT.709 */
    spn_colour_t col = sdr ? (spn_colour_t){SPN_MATRIX_BT709, 0} : it->colour; /* (a device frame's is the source's) */
    /* the stored pixels' shape, turned with the frame: 4:3 pixels turned a
     * quarter are 3:4 */
    bool turned = in->rotation == 90 || in->rotation == 270;
    spn_media_image_meta_t im_meta = {.width = ow, .height = oh, .format = fmt, .matrix = col.matrix,
                                      .full_range = col.full_range, .primaries = sdr ? 1 : in->primaries,
                                      .transfer = sdr ? 1 : in->transfer,
                                      .sar_num = square ? 1 : turned ? in->sar_den : in->sar_num,
                                      .sar_den = square ? 1 : turned ? in->sar_num : in->sar_den};
    rc = host->msg_add_meta(msg, SPN_MEDIA_IMAGE_META, &im_meta, sizeof im_meta, err);
  } else if (rc == SPN_OK) {
    spn_media_audio_meta_t am = {.rate = it->rate, .channels = it->channels};
    rc = host->msg_add_meta(msg, SPN_MEDIA_AUDIO_META, &am, sizeof am, err);
  }
  host->buffer_unref(&buf);
  if (rc) {
    host->msg_free(&msg);
    return rc;
  }
  if ((rc = host->emit(stage, video ? 0 : 1, &msg, err)))
    return rc;
  if (video) {
    j->vseq++;
    host->progress(stage, j->job_id, (int64_t)j->vseq, j->total);
  } else {
    j->aseq++;
  }
  return SPN_OK;
}

/* The audio port's first message of a job: the format (channels 0: no
 * audio will follow), so a consumer knows before the first picture. */
static int32_t send_audio_format(spn_stage_t *stage, decode_job_t *j, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const spn_decode_info_t *in = spn_decoder_info(j->dec);
  spn_media_audio_meta_t am = {.rate = in->has_audio ? in->audio_rate : 0,
                               .channels = in->has_audio ? in->audio_channels : 0};
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = j->job_id, .stream = 1, .seq = j->aseq, .pts = 0,
                        .total = -1};
  spn_msg_t *msg = NULL;
  int32_t rc = host->msg_new(stage, &env, &msg, err);
  if (rc == SPN_OK)
    rc = host->msg_add_meta(msg, SPN_MEDIA_AUDIO_META, &am, sizeof am, err);
  if (rc == SPN_OK)
    rc = host->emit(stage, 1, &msg, err);
  host->msg_free(&msg);
  if (rc == SPN_OK) {
    j->aseq++;
    j->format_sent = true;
  }
  return rc;
}

static int32_t decode_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  decode_job_t *j = job_state;
  if (host->job_cancelled(stage, j->job_id))
    return SPN_ECANCELLED;
  if (!j->format_sent)
    return send_audio_format(stage, j, err);
  spn_media_item_t it;
  int32_t rc = spn_decoder_next(j->dec, &it, err);
  if (rc == SPN_EOS) {
    /* tolerate_errors accepted damage: say so, never silently */
    const spn_decode_info_t *in = spn_decoder_info(j->dec);
    if (in->corrupt_packets || in->truncated)
      host->log(stage, j->job_id, SPN_LOG_WARN, "%s: damaged input accepted (tolerate_errors): %lld corrupt "
                "packets/frames skipped%s; video ends at %.2f s of %.2f s",
                j->path, (long long)in->corrupt_packets, in->truncated ? ", truncated" : "", in->video_end,
                in->video_expected);
  }
  if (rc != SPN_OK)
    return rc; /* SPN_EOS or an error naming the file */
  bool video = it.kind == SPN_MEDIA_VIDEO;
  uint64_t seq = video ? j->vseq : j->aseq;
  rc = emit_item(stage, j, &it, err);
  spn_media_item_release(&it);
  /* A frame that could not be handed on (out of host or device memory for
   * it, a failed upload): name the file and the frame, as a decode error does. */
  if (rc != SPN_OK && rc != SPN_ECANCELLED)
    spn_error_prefix(err, "%s: %s %llu", j->path, video ? "frame" : "audio block", (unsigned long long)seq);
  return rc;
}

static void decode_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  decode_job_t *j = job_state;
  if (!j)
    return;
#ifdef SPN_MEDIA_CUDA
  if (j->on_gpu) {
    /* Queued conversions may still read NVDEC's surfaces and the scratch:
     * let the stream pass them before either is released. */
    spn_error_t e = SPN_ERROR_INIT;
    if (spn_media_cuda_sync(j->stream, "closing the job", &e) != SPN_OK)
      spn_stage_host(stage)->log(stage, j->job_id, SPN_LOG_WARN, "%s: %s", j->path, e.msg);
    spn_stage_host(stage)->buffer_unref(&j->scratch);
    spn_stage_host(stage)->buffer_unref(&j->staging);
  }
#endif
  spn_decoder_free(j->dec);
#ifdef SPN_MEDIA_CUDA
  spn_media_cuda_device_free(&j->hwdev);
#endif
  free(j);
}

static void decode_destroy(spn_stage_t *stage, void *state) {}

static int32_t decode_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  spn_media_log_install();
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "decode",
      .doc = "reads a media file with FFmpeg: video frames and audio",
      .schema = decode_schema,
      .config_size = sizeof(decode_config_t),
      .outputs = decode_outputs,
      .n_outputs = 2,
#ifdef SPN_MEDIA_CUDA
      .device_need = SPN_NEED_EITHER, /* NVDEC and device frames on a GPU, as before on the CPU */
#else
      .device_need = SPN_NEED_CPU,
#endif
      .max_batch = 1,
      .create = decode_create,
      .job_open = decode_job_open,
      .generate = decode_generate,
      .job_close = decode_job_close,
      .destroy = decode_destroy,
      .port_caps = decode_port_caps,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(decode, .version = "1.0", .license = "Apache-2.0", .init = decode_init)
