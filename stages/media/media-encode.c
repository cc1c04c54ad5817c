/* media-encode.c — H.264 (libx264 or NVENC) + AAC into MP4/MKV via FFmpeg.
 *
 * Invariants: the target path is touched only by the final rename(); the
 * temporary file lives in the same folder (rename is atomic there) and is
 * unlinked on every failure path and by free() before a successful finish.
 * Video timestamps are rebased to the first frame and kept strictly
 * increasing; audio timestamps count samples, so audio and video stay on
 * one clock. When muxing an audio file, its audio is pulled in step with the
 * video (up to half a second ahead) so the muxer interleaves without
 * buffering the whole video.
 *
 * Device frames (opts.hw_device): the video encoder is an NVENC one opened
 * for AV_PIX_FMT_CUDA frames of a pool of NV12 frames on that CUDA device;
 * the caller fills one pool frame per picture on the device and the
 * encoder reads it there, so no picture passes through host memory here.
 * While such an encoder opens, FFmpeg's lines go to the error (the first
 * error line is the reason NVENC could not open), not to the job's log, so
 * a caller that then falls back to the host path logs one line, not
 * FFmpeg's several.
 */
#include "media-encode.h"
#include "media-decode.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/audio_fifo.h>
#include <libavutil/display.h>
#include <libavutil/hwcontext.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>

#include "spindle/plugin.h" /* SPN_LOG_* levels */

struct spn_encoder {
  char *path, *tmp;
  spn_encode_opts_t o;
  int32_t in_w, in_h, in_fmt, w, h;
  AVFormatContext *oc;
  AVCodecContext *vctx, *actx;
  AVStream *vst, *ast;
  struct SwsContext *sws;
  int sws_from;                  /* the source format sws's colour details were set for */
  SwrContext *swr;
  AVAudioFifo *fifo;
  AVFrame *vframe, *aframe;
  AVPacket *pkt;
  spn_image_t tmpimg;            /* float → u8 staging */
  AVBufferRef *hw_frames;        /* device frames: the NV12 pool on opts.hw_device; NULL: host frames */
  int hw_frame_out;              /* a pool frame was handed out and not yet sent */
  spn_media_log_t open_log;      /* catches FFmpeg's lines while a device-frame encoder opens */
  char open_why[256];            /* the first error line among them */
  spn_decoder_t *audio_src;      /* audio_path */
  int audio_src_done;
  int64_t first_pts_us;          /* first video pts in microseconds, INT64_MIN until set */
  int64_t last_vpts;
  int64_t a_pts;                 /* samples sent to the AAC encoder */
  /* With audio_path: audio is muxed only up to the end of the last video
   * frame (in samples), so a clip cut to a segment, or a soundtrack longer
   * than the video, never runs on past the pictures. INT64_MAX otherwise. */
  int64_t a_limit;
  int32_t a_rate, a_ch;
  int header_written, finished, failed;
};

static int32_t av_fail(spn_encoder_t *e, spn_error_t *err, int averr, const char *what) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(averr, buf, sizeof buf);
  if (buf[0] >= 'A' && buf[0] <= 'Z')
    buf[0] = (char)(buf[0] - 'A' + 'a');
  return spn_error_set(err, spn_media_av_status(averr), "%s: %s: %s", e->path, what, buf);
}

int32_t spn_encoder_has_audio(const spn_encoder_t *e) {
  return e->actx != NULL;
}

const char *spn_encoder_codec_name(const spn_encoder_t *e) {
  return e->vctx ? e->vctx->codec->name : "";
}

const char *spn_encoder_nvenc_for(const char *codec) {
  if (!codec || !*codec || !strcmp(codec, "libx264") || !strcmp(codec, "h264_nvenc") || !strcmp(codec, "auto"))
    return "h264_nvenc";
  if (!strcmp(codec, "libx265") || !strcmp(codec, "hevc_nvenc"))
    return "hevc_nvenc";
  return NULL;
}

static int is_nvenc(const char *name) {
  size_t n = strlen(name);
  return n > 6 && !strcmp(name + n - 6, "_nvenc");
}

/* One preset key for both families, so a config names one and keeps
 * working when the stage falls back from NVENC to libx264 or back: x264's
 * names map to NVENC's p1 (fastest) .. p7 (best) by speed, and p1 .. p7 to
 * the x264 preset of about the same place in its range. Other names go to
 * the encoder as they are (NVENC's own "hq", "ll", ...). */
static const char *preset_for(const char *codec, const char *preset) {
  static const struct { const char *x264, *nvenc; } map[] = {
      {"ultrafast", "p1"}, {"superfast", "p1"}, {"veryfast", "p2"}, {"faster", "p3"}, {"fast", "p3"},
      {"medium", "p4"},    {"slow", "p5"},      {"slower", "p6"},   {"veryslow", "p7"}, {"placebo", "p7"},
  };
  static const char *const back[] = {"ultrafast", "veryfast", "faster", "medium", "slow", "slower", "veryslow"};
  if (is_nvenc(codec)) {
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
      if (!strcmp(preset, map[i].x264))
        return map[i].nvenc;
  } else if (!strcmp(codec, "libx264") && preset[0] == 'p' && preset[1] >= '1' && preset[1] <= '7' && !preset[2]) {
    return back[preset[1] - '1'];
  }
  return preset;
}

/* While a device-frame encoder opens: keep FFmpeg's first error line. */
static void catch_open_line(void *user, int32_t level, const char *msg) {
  spn_encoder_t *e = user;
  if (level >= SPN_LOG_WARN && !e->open_why[0])
    snprintf(e->open_why, sizeof e->open_why, "%s", msg);
}

/* The video encoder `name` names in this FFmpeg, or NULL with why. */
static const AVCodec *video_encoder(const char *name, spn_error_t *err) {
  const AVCodec *codec = avcodec_find_encoder_by_name(name);
  if (!codec)
    spn_error_set(err, SPN_EUNSUPPORTED,
                  "video encoder '%s' is not available in this FFmpeg (`ffmpeg -encoders` lists those it has)", name);
  else if (codec->type != AVMEDIA_TYPE_VIDEO)
    spn_error_set(err, SPN_EUNSUPPORTED, "'%s' is not a video encoder", name);
  return codec && codec->type == AVMEDIA_TYPE_VIDEO ? codec : NULL;
}

static int32_t open_video(spn_encoder_t *e, const char *name, spn_error_t *err) {
  const AVCodec *codec = video_encoder(name, err);
  if (!codec) {
    spn_error_prefix(err, "%s", e->path);
    return SPN_EUNSUPPORTED;
  }
  AVCodecContext *c = avcodec_alloc_context3(codec);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", e->path);
  if (e->hw_frames) {
    e->open_why[0] = '\0';
    e->open_log = (spn_media_log_t){.magic = SPN_MEDIA_LOG_MAGIC, .fn = catch_open_line, .user = e};
    spn_media_log_claim_codec(c, &e->open_log);
  } else {
    spn_media_log_claim_codec(c, e->o.log);
  }
  c->width = e->w;
  c->height = e->h;
  c->pix_fmt = AV_PIX_FMT_YUV420P;
  if (e->hw_frames) {
    /* pictures are the pool's CUDA frames; the encoder reads their NV12
     * planes on the device */
    c->pix_fmt = AV_PIX_FMT_CUDA;
    if (!(c->hw_frames_ctx = av_buffer_ref(e->hw_frames))) {
      avcodec_free_context(&c);
      return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", e->path);
    }
  }
  c->time_base = (AVRational){1, 90000};
  c->framerate = (AVRational){e->o.fps_num, e->o.fps_den};
  c->sample_aspect_ratio = e->o.sar_num > 0 && e->o.sar_den > 0 ? (AVRational){e->o.sar_num, e->o.sar_den}
                                                                  : (AVRational){1, 1};
  /* say which matrix and range the samples are in, so that a player need
   * not guess (most guess BT.709 for HD, which BT.601 samples are not) */
  c->colorspace = (enum AVColorSpace)e->o.colour.matrix;
  c->color_range = e->o.colour.full_range ? AVCOL_RANGE_JPEG : AVCOL_RANGE_MPEG;
  if (e->o.primaries > 0 && e->o.primaries != AVCOL_PRI_UNSPECIFIED && e->o.primaries < AVCOL_PRI_NB)
    c->color_primaries = (enum AVColorPrimaries)e->o.primaries;
  if (e->o.transfer > 0 && e->o.transfer != AVCOL_TRC_UNSPECIFIED && e->o.transfer < AVCOL_TRC_NB)
    c->color_trc = (enum AVColorTransferCharacteristic)e->o.transfer;
  /* and where the chroma samples are: converted from RGB here (or by the
   * caller), in the middle of their 2x2 block, not where a file that says
   * nothing has them (MPEG-2's left) */
  int from_rgb = e->in_fmt != SPN_PIXFMT_NV12 && e->in_fmt != SPN_PIXFMT_YUV420P;
  int32_t loc = from_rgb ? SPN_CHROMA_LOC_CENTER : e->o.chroma_loc;
  if (loc > AVCHROMA_LOC_UNSPECIFIED && loc < AVCHROMA_LOC_NB)
    c->chroma_sample_location = (enum AVChromaLocation)loc;
  c->thread_count = 0;
  if (e->oc->oformat->flags & AVFMT_GLOBALHEADER)
    c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  AVDictionary *d = NULL;
  char num[32];
  if (e->o.preset && *e->o.preset)
    av_dict_set(&d, "preset", preset_for(codec->name, e->o.preset), 0);
  if (is_nvenc(codec->name)) {
    /* NVENC's quality-targeted mode: variable bit rate steered by cq (the
     * QP scale x264's crf uses, 1..51; NVENC reads cq 0 as "not set", so
     * crf 0, x264's lossless, asks for its best, 1), with no bit rate cap;
     * or the average rate asked for. */
    av_dict_set(&d, "rc", "vbr", 0);
    if (e->o.bitrate > 0) {
      c->bit_rate = e->o.bitrate;
    } else {
      c->bit_rate = 0;
      snprintf(num, sizeof num, "%d", e->o.crf > 0 ? (int)e->o.crf : 1);
      av_dict_set(&d, "cq", num, 0);
    }
  } else if (e->o.bitrate > 0) {
    c->bit_rate = e->o.bitrate;
  } else {
    snprintf(num, sizeof num, "%d", (int)e->o.crf);
    av_dict_set(&d, strcmp(codec->name, "libx264") == 0 ? "crf" : "cq", num, 0);
  }
  int r = avcodec_open2(c, codec, &d);
  av_dict_free(&d);
  if (r < 0) {
    avcodec_free_context(&c);
    if (e->hw_frames && e->open_why[0]) {
      char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
      av_strerror(r, buf, sizeof buf);
      if (buf[0] >= 'A' && buf[0] <= 'Z')
        buf[0] = (char)(buf[0] - 'A' + 'a');
      /* NVENC did not open (sessions in use, the GPU's memory): the device's
       * state, not the job's */
      return spn_error_set(err, r == AVERROR(ENOMEM) ? SPN_ENOMEM : SPN_EDEVICE, "%s: %s: %s (%s)", e->path,
                           name, buf, e->open_why);
    }
    return av_fail(e, err, r, name);
  }
  if (e->hw_frames) /* open: from here on FFmpeg's lines go to the job's log */
    spn_media_log_claim_codec(c, e->o.log);
  e->vctx = c;
  return SPN_OK;
}

static int32_t open_audio(spn_encoder_t *e, spn_error_t *err) {
  const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_AAC);
  if (!codec)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: no AAC encoder", e->path);
  AVCodecContext *c = avcodec_alloc_context3(codec);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", e->path);
  e->actx = c;
  spn_media_log_claim_codec(c, e->o.log);
  c->sample_fmt = AV_SAMPLE_FMT_FLTP;
  c->sample_rate = e->a_rate;
  av_channel_layout_default(&c->ch_layout, e->a_ch);
  /* AAC-LC carries at most 6144 bits per channel per 1024-sample frame: a
   * rate above that is clamped by the encoder (with a "Too many bits"
   * warning) — 128 kbit/s does not fit 16 kHz mono. Default: 64 kbit/s per
   * channel, within that limit. */
  int64_t max_br = 6144LL * e->a_rate / 1024 * e->a_ch;
  int64_t br = e->o.audio_bitrate > 0 ? e->o.audio_bitrate : 64000LL * e->a_ch;
  c->bit_rate = br < max_br ? br : max_br;
  c->time_base = (AVRational){1, e->a_rate};
  if (e->oc->oformat->flags & AVFMT_GLOBALHEADER)
    c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  int r = avcodec_open2(c, codec, NULL);
  if (r < 0)
    return av_fail(e, err, r, "opening the AAC encoder");
  AVChannelLayout in;
  av_channel_layout_default(&in, e->a_ch);
  r = swr_alloc_set_opts2(&e->swr, &c->ch_layout, AV_SAMPLE_FMT_FLTP, e->a_rate, &in, AV_SAMPLE_FMT_FLT,
                          e->a_rate, 0, NULL);
  av_channel_layout_uninit(&in);
  if (r < 0 || (r = swr_init(e->swr)) < 0)
    return av_fail(e, err, r, "setting up audio conversion");
  int fs = c->frame_size > 0 ? c->frame_size : 1024;
  e->fifo = av_audio_fifo_alloc(AV_SAMPLE_FMT_FLTP, e->a_ch, fs * 4);
  if (!e->fifo)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", e->path);
  return SPN_OK;
}

/* The pool of NV12 device frames a device-frame encoder reads (opts
 * hw_device), of the encoder's even size. */
static int32_t open_hw_frames(spn_encoder_t *e, spn_error_t *err) {
  AVBufferRef *dev = e->o.hw_device;
  if (((AVHWDeviceContext *)dev->data)->type != AV_HWDEVICE_TYPE_CUDA)
    return spn_error_set(err, SPN_EINVAL, "%s: encoding from device frames needs a CUDA device", e->path);
  AVBufferRef *ref = av_hwframe_ctx_alloc(dev);
  if (!ref)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", e->path);
  AVHWFramesContext *fc = (AVHWFramesContext *)ref->data;
  fc->format = AV_PIX_FMT_CUDA;
  fc->sw_format = AV_PIX_FMT_NV12;
  fc->width = e->w;
  fc->height = e->h;
  int r = av_hwframe_ctx_init(ref);
  if (r < 0) {
    av_buffer_unref(&ref);
    return av_fail(e, err, r, "setting up a pool of device frames");
  }
  e->hw_frames = ref;
  return SPN_OK;
}

static int32_t container_error(const char *path, spn_error_t *err) {
  return spn_error_set(err, SPN_EINVAL, "%s: cannot pick a container from this file name (use .mp4 or .mkv)", path);
}

/* The muxer for path's name: one that writes the one file named (not a
 * playlist, manifest or image sequence whose muxer creates files of its own
 * beside it: those files would escape the temporary file and its rename,
 * the cleanup of a failed job and the job service's checks of which jobs
 * write which files) and that holds video. */
static int32_t pick_container(const char *path, const AVOutputFormat **out, spn_error_t *err) {
  const AVOutputFormat *f = av_guess_format(NULL, path, NULL);
  *out = NULL;
  if (!f)
    return container_error(path, err);
  if (f->flags & AVFMT_NOFILE)
    return spn_error_set(err, SPN_EINVAL,
                         "%s: FFmpeg's \"%s\" muxer (%s) writes files of its own beside this one; an output is one "
                         "file (use .mp4 or .mkv)",
                         path, f->name, f->long_name ? f->long_name : f->name);
  if (f->video_codec == AV_CODEC_ID_NONE)
    return spn_error_set(err, SPN_EINVAL, "%s: the \"%s\" container holds no video (use .mp4 or .mkv)", path, f->name);
  *out = f;
  return SPN_OK;
}

/* Whether the container takes the codec (FFmpeg's answer "no" only: an
 * unknown answer is left to the muxer). SPN_EMEDIA: the same on every
 * attempt. */
static int32_t check_codec_fits(const spn_encoder_t *e, const AVOutputFormat *f, const AVCodecContext *c,
                                const char *what, spn_error_t *err) {
  if (avformat_query_codec(f, c->codec_id, FF_COMPLIANCE_NORMAL) != 0)
    return SPN_OK;
  return spn_error_set(err, SPN_EMEDIA, "%s: the \"%s\" container cannot hold %s %s (%s); use .mp4 or .mkv", e->path,
                       f->name, avcodec_get_name(c->codec_id), what, c->codec ? c->codec->name : "?");
}
/* Bytes of a buffer for tmp_create's name. */
static size_t tmp_size(const char *path) { return strlen(path) + 16; }

/* The temporary file beside `path` (its name into tmp, tmp_size(path)
 * bytes, "" when none was made): its descriptor in *fd. */
static int32_t tmp_create(const char *path, char *tmp, int *fd, spn_error_t *err) {
  snprintf(tmp, tmp_size(path), "%s.XXXXXX", path);
  *fd = mkstemp(tmp);
  if (*fd >= 0)
    return SPN_OK;
  tmp[0] = '\0';
  return spn_error_set(err, SPN_EIO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
}

int32_t spn_encoder_check_container(const char *path, spn_error_t *err) {
  if (!path || !*path)
    return spn_error_set(err, SPN_EINVAL, "no output path");
  const AVOutputFormat *f = NULL;
  return pick_container(path, &f, err);
}

int32_t spn_encoder_check_path(const char *path, spn_error_t *err) {
  int32_t rc = spn_encoder_check_container(path, err);
  if (rc != SPN_OK)
    return rc;
  char *tmp = malloc(tmp_size(path));
  if (!tmp)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
  int fd = -1;
  rc = tmp_create(path, tmp, &fd, err);
  if (rc == SPN_OK) {
    close(fd);
    unlink(tmp);
  }
  free(tmp);
  return rc;
}

int32_t spn_encoder_check_codec(const char *name, spn_error_t *err) {
  if (!name || !strcmp(name, "auto") || video_encoder(name, err))
    return SPN_OK;
  return SPN_EUNSUPPORTED;
}

int32_t spn_encoder_new(const char *path, int32_t width, int32_t height, int32_t pixfmt,
                        const spn_encode_opts_t *opts, spn_encoder_t **out, spn_error_t *err) {
  static const spn_encode_opts_t defaults = SPN_ENCODE_OPTS_INIT;
  *out = NULL;
  if (!path || !*path)
    return spn_error_set(err, SPN_EINVAL, "encode: empty path");
  spn_encoder_t *e = calloc(1, sizeof *e);
  if (!e)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
  int32_t rc = SPN_OK;
  int r;
  e->o = opts ? *opts : defaults;
  if (!e->o.codec || !*e->o.codec)
    e->o.codec = "libx264";
  if (e->o.fps_num <= 0 || e->o.fps_den <= 0) {
    e->o.fps_num = 25;
    e->o.fps_den = 1;
  }
  if (!e->o.colour.matrix)
    e->o.colour = (spn_colour_t)SPN_COLOUR_DEFAULT;
  if (e->o.colour.matrix == 5)
    e->o.colour.matrix = SPN_MATRIX_BT601; /* the same matrix; recorded as SMPTE 170M */
  spn_yuv_coeffs_t k = {0};
  if ((rc = spn_colour_coeffs(&e->o.colour, &k, err))) {
    free(e);
    return spn_error_prefix(err, "%s", path);
  }
  /* in lowest terms (25000/1000 is 25/1; 1000000/33367 stays) */
  av_reduce(&e->o.fps_num, &e->o.fps_den, e->o.fps_num, e->o.fps_den, INT32_MAX);
  e->first_pts_us = INT64_MIN;
  e->last_vpts = INT64_MIN;
  e->a_limit = INT64_MAX;
  e->path = strdup(path);
  e->tmp = malloc(tmp_size(path));
  if (!e->path || !e->tmp) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out_free;
  }
  e->tmp[0] = '\0'; /* no temporary file yet: free() must not unlink what the heap held */
  e->in_w = width;
  e->in_h = height;
  e->in_fmt = pixfmt;
  e->w = width & ~1;
  e->h = height & ~1;
  if (e->w < 2 || e->h < 2 || width > 16384 || height > 16384) {
    rc = spn_error_set(err, SPN_EINVAL, "%s: cannot encode %dx%d frames", path, (int)width, (int)height);
    goto out_free;
  }
  if (e->o.hw_device && pixfmt != SPN_PIXFMT_NV12) {
    rc = spn_error_set(err, SPN_EINVAL, "%s: device frames are nv12, not %s", path, spn_pixfmt_name(pixfmt));
    goto out_free;
  }
  switch (pixfmt) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24: case SPN_PIXFMT_NV12: case SPN_PIXFMT_YUV420P: break;
  case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P:
    if ((rc = spn_image_alloc(&e->tmpimg, width, height,
                              pixfmt == SPN_PIXFMT_RGBF32P ? SPN_PIXFMT_RGB24 : SPN_PIXFMT_BGR24, err)))
      goto out_free;
    break;
  default:
    rc = spn_error_set(err, SPN_EINVAL, "%s: cannot encode frames in pixel format '%s'", path,
                       spn_pixfmt_name(pixfmt));
    goto out_free;
  }
  const AVOutputFormat *ofmt = NULL;
  if ((rc = pick_container(path, &ofmt, err)))
    goto out_free;
  /* temporary file beside the target */
  int fd = -1;
  if ((rc = tmp_create(path, e->tmp, &fd, err)))
    goto out_free;
  /* mkstemp creates 0600; the finished file should read like any other */
  if (fchmod(fd, 0644) != 0) {
    rc = spn_error_set(err, SPN_EIO, "%s: cannot set the temporary file's mode: %s", path, strerror(errno));
    close(fd);
    goto out_free;
  }
  close(fd);
  if ((r = avformat_alloc_output_context2(&e->oc, ofmt, NULL, e->tmp)) < 0) {
    rc = av_fail(e, err, r, "creating the muxer");
    goto out_free;
  }
  spn_media_log_claim_format(e->oc, e->o.log);
  const char *codec = e->o.codec;
  if (e->o.hw_device) {
    if ((rc = open_hw_frames(e, err)))
      goto out_free;
    if (strcmp(codec, "auto") == 0)
      codec = "h264_nvenc";
  } else if (strcmp(codec, "auto") == 0) {
    spn_error_t ignored = SPN_ERROR_INIT;
    if (open_video(e, "h264_nvenc", &ignored) != SPN_OK)
      codec = "libx264";
  }
  if (!e->vctx && (rc = open_video(e, codec, err)))
    goto out_free;
  if ((rc = check_codec_fits(e, ofmt, e->vctx, "video", err)))
    goto out_free;
  e->vst = avformat_new_stream(e->oc, NULL);
  if (!e->vst || avcodec_parameters_from_context(e->vst->codecpar, e->vctx) < 0) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out_free;
  }
  e->vst->time_base = e->vctx->time_base;
  e->vst->avg_frame_rate = e->vctx->framerate;
  e->vst->sample_aspect_ratio = e->vctx->sample_aspect_ratio; /* the container's copy (MP4's pasp box) */
  if (e->o.rotation % 360) {
    /* av_display_rotation_set() takes clockwise degrees (its getter answers
     * counter-clockwise: ffprobe then shows rotation=-90 for 90 here) */
#if LIBAVFORMAT_VERSION_MAJOR >= 61
    AVPacketSideData *sd = av_packet_side_data_new(&e->vst->codecpar->coded_side_data,
                                                   &e->vst->codecpar->nb_coded_side_data,
                                                   AV_PKT_DATA_DISPLAYMATRIX, 36, 0);
    uint8_t *m = sd ? sd->data : NULL;
#else
    uint8_t *m = av_stream_new_side_data(e->vst, AV_PKT_DATA_DISPLAYMATRIX, 36);
#endif
    if (!m) {
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
      goto out_free;
    }
    av_display_rotation_set((int32_t *)m, (double)e->o.rotation);
  }
  if (e->o.audio_path) {
    spn_decode_opts_t dopts = SPN_DECODE_OPTS_INIT;
    dopts.want_video = 0;
    dopts.log = e->o.log;
    dopts.start = e->o.audio_start > 0 ? e->o.audio_start : 0;
    dopts.audio_optional = e->o.audio_optional;
    if ((rc = spn_decoder_new(e->o.audio_path, &dopts, &e->audio_src, err)))
      goto out_free;
    if (!spn_decoder_info(e->audio_src)->has_audio) {
      /* audio_optional, and the file has no sound: no soundtrack */
      spn_decoder_free(e->audio_src);
      e->audio_src = NULL;
    } else {
      e->a_rate = spn_decoder_info(e->audio_src)->audio_rate;
      e->a_ch = spn_decoder_info(e->audio_src)->audio_channels;
    }
  } else if (e->o.audio_rate > 0 && e->o.audio_channels > 0) {
    e->a_rate = e->o.audio_rate;
    e->a_ch = e->o.audio_channels;
  }
  if (e->a_rate > 0) {
    if ((rc = open_audio(e, err)) || (rc = check_codec_fits(e, ofmt, e->actx, "audio", err)))
      goto out_free;
    e->ast = avformat_new_stream(e->oc, NULL);
    if (!e->ast || avcodec_parameters_from_context(e->ast->codecpar, e->actx) < 0) {
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
      goto out_free;
    }
    e->ast->time_base = e->actx->time_base;
  }
  e->vframe = av_frame_alloc();
  e->aframe = av_frame_alloc();
  e->pkt = av_packet_alloc();
  if (!e->vframe || !e->aframe || !e->pkt) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out_free;
  }
  e->vframe->format = AV_PIX_FMT_YUV420P;
  e->vframe->width = e->w;
  e->vframe->height = e->h;
  /* device frames come from the pool, one per picture */
  if (!e->hw_frames && (r = av_frame_get_buffer(e->vframe, 0)) < 0) {
    rc = av_fail(e, err, r, "allocating a frame");
    goto out_free;
  }
  if ((r = avio_open(&e->oc->pb, e->tmp, AVIO_FLAG_WRITE)) < 0) {
    rc = av_fail(e, err, r, "opening the temporary file");
    goto out_free;
  }
  AVDictionary *mopts = NULL;
  if (e->o.faststart && (strcmp(ofmt->name, "mp4") == 0 || strcmp(ofmt->name, "mov") == 0))
    av_dict_set(&mopts, "movflags", "+faststart", 0);
  r = avformat_write_header(e->oc, &mopts);
  av_dict_free(&mopts);
  if (r < 0) {
    /* An I/O error that the file's writes did not meet is the muxer's
     * refusal of the streams (yuv4mpegpipe says EIO for anything but raw
     * video): a media error, the same on every attempt, not one to retry. */
    bool refused = r == AVERROR(EINVAL) || (r == AVERROR(EIO) && !(e->oc->pb && e->oc->pb->error));
    rc = av_fail(e, err, r, "writing the header");
    if (refused)
      rc = SPN_EMEDIA;
    /* a muxer that refuses the streams says only "invalid argument" or
     * "input/output error" (gif, ogg with h264, y4m): name the pairing; the
     * muxer's own line is in the log */
    if (refused && err) {
      char said[SPN_ERROR_MSG_MAX];
      snprintf(said, sizeof said, "%s", err->msg);
      spn_error_set(err, rc, "%s (the \"%s\" container may not take %s video%s; use .mp4 or .mkv)", said, ofmt->name,
                    avcodec_get_name(e->vctx->codec_id), e->actx ? " or AAC audio" : "");
    }
    goto out_free;
  }
  e->header_written = 1;
  *out = e;
  return SPN_OK;
out_free:
  spn_encoder_free(e);
  return rc;
}

/* Send one frame (NULL = flush) to an encoder and write its packets. */
static int32_t encode(spn_encoder_t *e, AVCodecContext *c, AVStream *st, AVFrame *f, spn_error_t *err) {
  int r = avcodec_send_frame(c, f);
  if (r < 0 && !(r == AVERROR_EOF && !f))
    return av_fail(e, err, r, c == e->vctx ? "encoding video" : "encoding audio");
  for (;;) {
    r = avcodec_receive_packet(c, e->pkt);
    if (r == AVERROR(EAGAIN) || r == AVERROR_EOF)
      return SPN_OK;
    if (r < 0)
      return av_fail(e, err, r, c == e->vctx ? "encoding video" : "encoding audio");
    av_packet_rescale_ts(e->pkt, c->time_base, st->time_base);
    e->pkt->stream_index = st->index;
    r = av_interleaved_write_frame(e->oc, e->pkt);
    if (r < 0)
      return av_fail(e, err, r, "writing");
  }
}

/* Move whole AAC frames from the FIFO to the encoder (all of it when final). */
static int32_t drain_fifo(spn_encoder_t *e, int final, spn_error_t *err) {
  int fs = e->actx->frame_size > 0 ? e->actx->frame_size : 1024;
  while (av_audio_fifo_size(e->fifo) >= fs || (final && av_audio_fifo_size(e->fifo) > 0)) {
    int n = av_audio_fifo_size(e->fifo) < fs ? av_audio_fifo_size(e->fifo) : fs;
    if (e->a_pts + n > e->a_limit) {
      /* Past the video's end: hold it (more video may come) or, at the end,
       * encode only what fits and drop the rest. */
      if (!final)
        break;
      n = (int)(e->a_limit - e->a_pts);
      if (n <= 0) {
        av_audio_fifo_reset(e->fifo);
        break;
      }
    }
    av_frame_unref(e->aframe);
    e->aframe->nb_samples = n;
    e->aframe->format = AV_SAMPLE_FMT_FLTP;
    e->aframe->sample_rate = e->a_rate;
    av_channel_layout_copy(&e->aframe->ch_layout, &e->actx->ch_layout);
    int r = av_frame_get_buffer(e->aframe, 0);
    if (r < 0)
      return av_fail(e, err, r, "allocating audio");
    av_audio_fifo_read(e->fifo, (void **)e->aframe->data, n);
    e->aframe->pts = e->a_pts;
    e->a_pts += n;
    int32_t rc = encode(e, e->actx, e->ast, e->aframe, err);
    if (rc)
      return rc;
  }
  return SPN_OK;
}

static int32_t push_audio(spn_encoder_t *e, const float *samples, int64_t n, spn_error_t *err) {
  while (n > 0) {
    int chunk = n > 65536 ? 65536 : (int)n;
    uint8_t *tmp[AV_NUM_DATA_POINTERS] = {0};
    int r = av_samples_alloc(tmp, NULL, e->a_ch, chunk, AV_SAMPLE_FMT_FLTP, 0);
    if (r < 0)
      return av_fail(e, err, r, "allocating audio");
    const uint8_t *in[1] = {(const uint8_t *)samples};
    int got = swr_convert(e->swr, tmp, chunk, in, chunk);
    if (got > 0 && av_audio_fifo_write(e->fifo, (void **)tmp, got) < got)
      got = AVERROR(ENOMEM);
    av_freep(&tmp[0]);
    if (got < 0)
      return av_fail(e, err, got, "converting audio");
    samples += (size_t)chunk * e->a_ch;
    n -= chunk;
    int32_t rc = drain_fifo(e, 0, err);
    if (rc)
      return rc;
  }
  return SPN_OK;
}

/* Pull audio from audio_path until it is `until` seconds ahead (or all). */
static int32_t pull_audio_file(spn_encoder_t *e, double until, spn_error_t *err) {
  while (e->audio_src && !e->audio_src_done &&
         (until < 0 || (double)(e->a_pts + av_audio_fifo_size(e->fifo)) / e->a_rate < until)) {
    spn_media_item_t it;
    int32_t rc = spn_decoder_next(e->audio_src, &it, err);
    if (rc == SPN_EOS) {
      e->audio_src_done = 1;
      break;
    }
    if (rc)
      return rc;
    rc = push_audio(e, it.samples, it.n_samples, err);
    spn_media_item_release(&it);
    if (rc)
      return rc;
  }
  return SPN_OK;
}

static int32_t send_video(spn_encoder_t *e, int64_t pts, int32_t tb_num, int32_t tb_den, spn_error_t *err);

int32_t spn_encoder_write_video(spn_encoder_t *e, const spn_image_t *img, int64_t pts, int32_t tb_num,
                                int32_t tb_den, spn_error_t *err) {
  if (e->finished || e->failed)
    return spn_error_set(err, SPN_ESTATE, "%s: encoder already finished or failed", e->path);
  if (e->hw_frames)
    return spn_error_set(err, SPN_ESTATE, "%s: the encoder takes device frames (spn_encoder_device_frame)", e->path);
  if (!img || img->width != e->in_w || img->height != e->in_h || img->format != e->in_fmt)
    return spn_error_set(err, SPN_EINVAL, "%s: frame is %dx%d %s, the encoder was opened for %dx%d %s", e->path,
                         img ? (int)img->width : 0, img ? (int)img->height : 0,
                         spn_pixfmt_name(img ? img->format : 0), (int)e->in_w, (int)e->in_h,
                         spn_pixfmt_name(e->in_fmt));
  if (tb_num <= 0 || tb_den <= 0)
    return spn_error_set(err, SPN_EINVAL, "%s: invalid time base %d/%d", e->path, (int)tb_num, (int)tb_den);
  int32_t rc;
  const spn_image_t *src = img;
  if (img->format == SPN_PIXFMT_RGBF32P || img->format == SPN_PIXFMT_BGRF32P) {
    if ((rc = spn_image_from_float(img, &e->tmpimg, NULL, NULL, err)))
      goto out_fail;
    src = &e->tmpimg;
  }
  enum AVPixelFormat sf = src->format == SPN_PIXFMT_RGB24 ? AV_PIX_FMT_RGB24
                          : src->format == SPN_PIXFMT_BGR24 ? AV_PIX_FMT_BGR24
                          : src->format == SPN_PIXFMT_NV12 ? AV_PIX_FMT_NV12 : AV_PIX_FMT_YUV420P;
  int r = av_frame_make_writable(e->vframe);
  if (r < 0) {
    rc = av_fail(e, err, r, "allocating a frame");
    goto out_fail;
  }
  const uint8_t *sp[4] = {src->data[0], src->data[1], src->data[2], NULL};
  int sl[4] = {(int)src->stride[0], (int)src->stride[1], (int)src->stride[2], 0};
  if (sf == AV_PIX_FMT_YUV420P) {
    /* already the encoder's format: copy the planes (cropped to even) */
    av_image_copy(e->vframe->data, e->vframe->linesize, sp, sl, AV_PIX_FMT_YUV420P, e->w, e->h);
  } else {
    struct SwsContext *prev = e->sws;
    e->sws = sws_getCachedContext(e->sws, e->w, e->h, sf, e->w, e->h, AV_PIX_FMT_YUV420P,
                                  SWS_BILINEAR | SWS_ACCURATE_RND, NULL, NULL, NULL);
    if (!e->sws) {
      rc = spn_error_set(err, SPN_EMEDIA, "%s: cannot convert %s frames", e->path, spn_pixfmt_name(src->format));
      goto out_fail;
    }
    if (e->sws != prev || sf != e->sws_from) {
      /* RGB in: the file's matrix and range; NV12 in: already in them */
      int rgb = sf == AV_PIX_FMT_RGB24 || sf == AV_PIX_FMT_BGR24, full = e->o.colour.full_range;
      const int *m = sws_getCoefficients(e->o.colour.matrix);
      sws_setColorspaceDetails(e->sws, m, rgb ? 1 : full, m, full, 0, 1 << 16, 1 << 16);
      e->sws_from = sf;
    }
    sws_scale(e->sws, sp, sl, 0, e->h, e->vframe->data, e->vframe->linesize);
  }
  if ((rc = send_video(e, pts, tb_num, tb_den, err)))
    goto out_fail;
  return SPN_OK;
out_fail:
  e->failed = 1;
  return rc;
}

/* e->vframe (filled) at pts: timestamps rebased and kept increasing, the
 * audio file's end moved with the video's, the frame encoded and written,
 * and the audio file read on in step. */
static int32_t send_video(spn_encoder_t *e, int64_t pts, int32_t tb_num, int32_t tb_den, spn_error_t *err) {
  int32_t rc;
  int64_t us = av_rescale_q(pts, (AVRational){tb_num, tb_den}, (AVRational){1, 1000000});
  if (e->first_pts_us == INT64_MIN)
    e->first_pts_us = us;
  if (e->audio_src) {
    /* The video now ends one frame after this one. */
    int64_t end_us = us - e->first_pts_us + av_rescale(1000000, e->o.fps_den, e->o.fps_num);
    int64_t lim = av_rescale(end_us, e->a_rate, 1000000);
    if (e->a_limit == INT64_MAX || lim > e->a_limit)
      e->a_limit = lim;
  }
  int64_t vp = av_rescale_q(us - e->first_pts_us, (AVRational){1, 1000000}, e->vctx->time_base);
  if (vp <= e->last_vpts)
    vp = e->last_vpts + 1;
  e->last_vpts = vp;
  e->vframe->pts = vp;
  if ((rc = encode(e, e->vctx, e->vst, e->vframe, err)))
    return rc;
  return pull_audio_file(e, (us - e->first_pts_us) / 1e6 + 0.5, err);
}

int32_t spn_encoder_device_frame(spn_encoder_t *e, spn_image_t *nv12, spn_error_t *err) {
  if (e->finished || e->failed)
    return spn_error_set(err, SPN_ESTATE, "%s: encoder already finished or failed", e->path);
  if (!e->hw_frames)
    return spn_error_set(err, SPN_ESTATE, "%s: the encoder takes host frames (spn_encoder_write_video)", e->path);
  /* The encoder keeps its own reference to a frame it still reads; ours
   * goes back here, so the pool hands out one it is done with. */
  av_frame_unref(e->vframe);
  e->hw_frame_out = 0;
  int r = av_hwframe_get_buffer(e->hw_frames, e->vframe, 0);
  if (r < 0) {
    e->failed = 1;
    return av_fail(e, err, r, "taking a device frame from the pool");
  }
  if (!e->vframe->data[0] || !e->vframe->data[1] || e->vframe->width < e->w || e->vframe->height < e->h) {
    e->failed = 1;
    return spn_error_set(err, SPN_EDEVICE, "%s: the device frame pool gave an unusable frame", e->path);
  }
  *nv12 = (spn_image_t){.width = e->w, .height = e->h, .format = SPN_PIXFMT_NV12, .nplanes = 2};
  nv12->data[0] = e->vframe->data[0];
  nv12->data[1] = e->vframe->data[1];
  nv12->stride[0] = e->vframe->linesize[0];
  nv12->stride[1] = e->vframe->linesize[1];
  e->hw_frame_out = 1;
  return SPN_OK;
}

int32_t spn_encoder_send_device_frame(spn_encoder_t *e, int64_t pts, int32_t tb_num, int32_t tb_den,
                                      spn_error_t *err) {
  if (e->finished || e->failed)
    return spn_error_set(err, SPN_ESTATE, "%s: encoder already finished or failed", e->path);
  if (!e->hw_frames || !e->hw_frame_out)
    return spn_error_set(err, SPN_ESTATE, "%s: no device frame was taken (spn_encoder_device_frame)", e->path);
  if (tb_num <= 0 || tb_den <= 0)
    return spn_error_set(err, SPN_EINVAL, "%s: invalid time base %d/%d", e->path, (int)tb_num, (int)tb_den);
  e->hw_frame_out = 0;
  int32_t rc = send_video(e, pts, tb_num, tb_den, err);
  av_frame_unref(e->vframe); /* the encoder holds what it still needs */
  if (rc)
    e->failed = 1;
  return rc;
}

int32_t spn_encoder_write_audio(spn_encoder_t *e, const float *samples, int64_t n, spn_error_t *err) {
  if (e->finished || e->failed)
    return spn_error_set(err, SPN_ESTATE, "%s: encoder already finished or failed", e->path);
  if (!e->actx || e->audio_src)
    return spn_error_set(err, SPN_ESTATE, "%s: encoder has no audio input (audio_rate 0 or audio_path set)", e->path);
  int32_t rc = push_audio(e, samples, n, err);
  if (rc)
    e->failed = 1;
  return rc;
}

int32_t spn_encoder_finish(spn_encoder_t *e, spn_error_t *err) {
  int32_t rc;
  if (e->finished || e->failed)
    return spn_error_set(err, SPN_ESTATE, "%s: encoder already finished or failed", e->path);
  if (e->last_vpts == INT64_MIN) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: no video frames were written", e->path);
    goto out_fail;
  }
  if ((rc = encode(e, e->vctx, e->vst, NULL, err)))
    goto out_fail;
  if (e->actx) {
    /* From a file: only as far as the video goes (a_limit), not all of it. */
    double until = e->audio_src ? (double)e->a_limit / e->a_rate : -1.0;
    if ((rc = pull_audio_file(e, until, err)) || (rc = drain_fifo(e, 1, err)) ||
        (rc = encode(e, e->actx, e->ast, NULL, err)))
      goto out_fail;
  }
  int r = av_write_trailer(e->oc);
  if (r < 0) {
    rc = av_fail(e, err, r, "writing the trailer");
    goto out_fail;
  }
  r = avio_closep(&e->oc->pb);
  if (r < 0) {
    rc = av_fail(e, err, r, "closing");
    goto out_fail;
  }
  if (rename(e->tmp, e->path) != 0) {
    rc = spn_error_set(err, SPN_EIO, "%s: cannot rename the finished file into place: %s", e->path,
                       strerror(errno));
    goto out_fail;
  }
  e->finished = 1;
  return SPN_OK;
out_fail:
  e->failed = 1;
  if (e->oc && e->oc->pb)
    avio_closep(&e->oc->pb);
  if (e->tmp && e->tmp[0])
    unlink(e->tmp);
  return rc;
}

void spn_encoder_free(spn_encoder_t *e) {
  if (!e)
    return;
  if (e->oc && e->oc->pb)
    avio_closep(&e->oc->pb);
  if (!e->finished && e->tmp && e->tmp[0])
    unlink(e->tmp);
  avformat_free_context(e->oc);
  avcodec_free_context(&e->vctx);
  avcodec_free_context(&e->actx);
  av_buffer_unref(&e->hw_frames); /* our reference: the codec and a frame hold their own */
  sws_freeContext(e->sws);
  swr_free(&e->swr);
  if (e->fifo)
    av_audio_fifo_free(e->fifo);
  av_frame_free(&e->vframe);
  av_frame_free(&e->aframe);
  av_packet_free(&e->pkt);
  spn_image_release(&e->tmpimg);
  spn_decoder_free(e->audio_src);
  free(e->path);
  free(e->tmp);
  free(e);
}
