/* media-decode.c — FFmpeg demux/decode into spn_image_t frames and float PCM.
 *
 * One decoder = one AVFormatContext and up to two codec contexts (the best
 * video and the best audio stream). spn_decoder_next() drains whichever
 * decoder has output, else reads the next packet; at end of file it flushes
 * both decoders and the resampler, then reports SPN_EOS. Nothing is global:
 * FFmpeg >= 4 needs no registration or locks. Invariants: returned video pts
 * are those of the stream (relative to its start_time) so VFR survives;
 * audio pts are derived from the count of samples produced since the first
 * kept sample, so audio never drifts from its own clock. Both are on one
 * clock: where the file has a video stream (wanted or not), the audio's
 * time 0 is the video's start, so sound that starts after the first
 * picture (a recorder's late audio, a file muxed with an offset) comes
 * after that much silence, and sound before it (an MPEG-TS's AAC priming)
 * is cut, as players line them up. I/O and setup
 * errors end the stream with a message that starts with the path.
 *
 * Damage is never a quiet success. Unless tolerate_errors is set, a packet
 * the decoder refuses (it is told to refuse damage: AV_EF_EXPLODE), or a
 * frame it flags as concealed/corrupt, fails the stream at once, the same
 * way on every run whatever its threads do; and at the end each stream's last sample is compared with
 * the duration its header declared (bounded by the segment): ending more
 * than two frames (of audio 0.1 s, plus an encoder delay the decoder
 * drops) early is "truncated". With
 * tolerate_errors corrupt packets are skipped, as the ffmpeg CLI does, and
 * the info counts them.
 */
#include "media-decode.h"
#include "media-tonemap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/hwcontext.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>

struct spn_decoder {
  char *path;
  spn_decode_opts_t o;
  spn_decode_info_t info;
  spn_media_input_t in;          /* fmt's opener: the one file (follow_references) */
  AVFormatContext *fmt;
  AVCodecContext *vctx, *actx;
  int vidx, aidx;
  int64_t vstart, astart;        /* stream start_time in stream tb */
  int64_t aorigin;               /* the audio's time 0, in its tb: the video stream's start, else astart */
  AVBufferRef *hw;
  AVPacket *pkt;
  AVFrame *frame, *swframe;
  struct SwsContext *sws;
  spn_colour_t sws_colour;      /* the colour sws's details were set for */
  int32_t stored_w, stored_h;   /* the stream's frames upright, as stored (every frame is checked against it) */
  int32_t conv_w, conv_h;       /* host frames after conversion, before the turn: stored, or in square pixels */
  spn_tonemap_t *tm;            /* HDR to RGB: its tone mapper (else NULL) */
  uint16_t *hdr_buf;            /* ... and the 16-bit RGB swscale gives it */
  size_t hdr_cap;
  spn_image_t deep8;            /* SDR 4:2:0 frames' samples in 8 bits: a view of 8-bit frames, else owned */
  SwrContext *swr;
  int eof_sent;
  int vdone, adone;              /* decoder drained or segment end passed */
  int64_t vcount, acount;
  int64_t a_base;                /* first kept audio sample, in 1/rate units */
  int64_t a_out;                 /* samples emitted so far */
  int a_started, swr_flushed;
  int64_t a_next;                /* where the next audio item starts (samples); -1 before the first */
  int a_silence;                 /* silence is owed up to a_held_at, then a_held (may be none) */
  float *a_held;                 /* the first sound, held while the silence before it goes out */
  int64_t a_held_at, a_held_n;
  int end_checked;
  int cut;                       /* a packet ran past the end of the file */
  double cut_at;                 /* its time, seconds on its stream's clock (the audio's from aorigin) */
  double v_end;                  /* end of the last video frame, seconds after the stream start */
};

static int32_t av_fail(spn_decoder_t *d, spn_error_t *err, int32_t code, int averr, const char *what) {
  /* a demuxer whose reference was refused fails in its own words
   * ("invalid data", "operation not permitted"): say what it asked for */
  int32_t refused = spn_media_input_refused(&d->in, d->path, 0, err);
  if (refused != SPN_OK)
    return refused;
  if (code == SPN_EMEDIA)
    code = spn_media_av_status(averr); /* an I/O error is not the media's */
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(averr, buf, sizeof buf);
  /* FFmpeg's messages start with a capital; ours are lower case after the colon */
  if (buf[0] >= 'A' && buf[0] <= 'Z')
    buf[0] = (char)(buf[0] - 'A' + 'a');
  if (what)
    return spn_error_set(err, code, "%s: %s: %s", d->path, what, buf);
  return spn_error_set(err, code, "%s: %s", d->path, buf);
}

static enum AVPixelFormat pick_cuda(AVCodecContext *ctx, const enum AVPixelFormat *fmts) {
  for (const enum AVPixelFormat *p = fmts; *p != AV_PIX_FMT_NONE; p++)
    if (*p == AV_PIX_FMT_CUDA)
      return *p;
  return avcodec_default_get_format(ctx, fmts);
}

static int codec_has_cuda(const AVCodec *codec) {
  for (int i = 0;; i++) {
    const AVCodecHWConfig *c = avcodec_get_hw_config(codec, i);
    if (!c)
      return 0;
    if (c->device_type == AV_HWDEVICE_TYPE_CUDA && (c->methods & AV_CODEC_HW_CONFIG_METHOD_HW_DEVICE_CTX))
      return 1;
  }
}

/* Rotation (clockwise, multiple of 90) that makes the picture upright. */
static int32_t stream_rotation(AVStream *st) {
  const int32_t *m = NULL;
#if LIBAVFORMAT_VERSION_MAJOR >= 61
  const AVPacketSideData *sd = av_packet_side_data_get(st->codecpar->coded_side_data,
                                                       st->codecpar->nb_coded_side_data,
                                                       AV_PKT_DATA_DISPLAYMATRIX);
  if (sd && sd->size >= 36)
    m = (const int32_t *)sd->data;
#else
  size_t size = 0;
  const uint8_t *sd = av_stream_get_side_data(st, AV_PKT_DATA_DISPLAYMATRIX, &size);
  if (sd && size >= 36)
    m = (const int32_t *)sd;
#endif
  if (!m)
    return 0;
  double ccw = av_display_rotation_get(m); /* counter-clockwise degrees */
  if (isnan(ccw))
    return 0;
  int32_t cw = (int32_t)lrint(-ccw / 90.0) * 90;
  return ((cw % 360) + 360) % 360;
}

static int32_t open_codec(spn_decoder_t *d, AVStream *st, AVCodecContext **out, int video,
                          spn_error_t *err) {
  const AVCodec *codec = avcodec_find_decoder(st->codecpar->codec_id);
  if (!codec)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: no decoder for %s stream codec '%s'", d->path,
                         video ? "video" : "audio", avcodec_get_name(st->codecpar->codec_id));
  AVCodecContext *ctx = avcodec_alloc_context3(codec);
  if (!ctx)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", d->path);
  *out = ctx;
  spn_media_log_claim_codec(ctx, d->o.log);
  int r = avcodec_parameters_to_context(ctx, st->codecpar);
  if (r < 0)
    return av_fail(d, err, SPN_EMEDIA, r, "codec parameters");
  ctx->pkt_timebase = st->time_base;
  ctx->thread_count = 0;
  /* Damage fails at the packet (AV_EF_EXPLODE) unless tolerated: under
   * frame threads the decoder's flags on a concealed frame are not reliable
   * (a bit-flipped H.264 clip came out flagged in 1 run of 12 with them
   * alone, in every run with one thread and with this). */
  if (!d->o.tolerate_errors)
    ctx->err_recognition |= AV_EF_EXPLODE;
  if (video && d->o.hwaccel != SPN_HWACCEL_NONE) {
    /* The caller's device (the stage's GPU, context and stream) when given,
     * else FFmpeg's default CUDA device. */
    int has = codec_has_cuda(codec);
    int ok = has && (d->o.hw_device ? (d->hw = av_buffer_ref(d->o.hw_device)) != NULL
                                    : av_hwdevice_ctx_create(&d->hw, AV_HWDEVICE_TYPE_CUDA, NULL, NULL, 0) >= 0);
    if (ok) {
      ctx->hw_device_ctx = av_buffer_ref(d->hw);
      if (!ctx->hw_device_ctx)
        return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", d->path);
      ctx->get_format = pick_cuda;
      d->info.hwaccel_active = 1;
    } else if (d->o.hwaccel == SPN_HWACCEL_CUDA) {
      return spn_error_set(err, SPN_EDEVICE, "%s: CUDA decoding of %s is not available", d->path,
                           codec->name);
    } else {
      d->info.host_frames_why = has ? "FFmpeg could not open a CUDA device" : "the decoder has no CUDA hwaccel";
    }
  } else if (video) {
    d->info.host_frames_why = "hwaccel is none";
  }
  r = avcodec_open2(ctx, codec, NULL);
  if (r < 0) /* with NVDEC: the device's state (sessions, memory), which another attempt may find free */
    return av_fail(d, err, d->info.hwaccel_active ? SPN_EDEVICE : SPN_EMEDIA, r, "opening the decoder");
  return SPN_OK;
}

int32_t spn_media_av_status(int averr) {
  if (averr == AVERROR(ENOMEM))
    return SPN_ENOMEM;
  if (averr == AVERROR(ENOENT))
    return SPN_ENOENT;
  /* errno values, save those FFmpeg uses for data and parameters */
  if (averr < 0 && averr > -4096 && averr != AVERROR(EINVAL) && averr != AVERROR(ENOSYS) &&
      averr != AVERROR(EDOM) && averr != AVERROR(ERANGE) && averr != AVERROR(EILSEQ))
    return SPN_EIO;
  return SPN_EMEDIA;
}

/* "scheme://..." with a scheme of letters, digits, + - . after a letter
 * (not a local path that has "://" further on, such as "/in/a://b.mp4") */
static int is_url(const char *path) {
  size_t n = 0;
  if (!((path[0] >= 'a' && path[0] <= 'z') || (path[0] >= 'A' && path[0] <= 'Z')))
    return 0;
  while ((path[n] >= 'a' && path[n] <= 'z') || (path[n] >= 'A' && path[n] <= 'Z') ||
         (path[n] >= '0' && path[n] <= '9') || path[n] == '+' || path[n] == '-' || path[n] == '.')
    n++;
  return path[n] == ':' && path[n + 1] == '/' && path[n + 2] == '/' && strncmp(path, "file:", 5) != 0;
}

/* The demuxers that read other files or URLs on a file's behalf: playlists
 * and manifests (hls, dash, imf), lists (concat), session descriptions
 * (sdp, rtsp, rtp, sap) and scripts (avisynth, vapoursynth). A nested
 * context (concat's) does not go through its parent's io_open, but it
 * does inherit the parent's format and protocol whitelists, so these are
 * kept out by the format whitelist, before any of them opens anything. */
static const char *const referencing_demuxers[] = {"concat", "hls",  "dash",      "imf",        "sdp",
                                                   "rtsp",   "rtp",  "sap",       "avisynth",   "vapoursynth",
                                                   NULL};

static int referencing(const char *name) {
  for (const char *const *r = referencing_demuxers; *r; r++)
    if (!strcmp(*r, name))
      return 1;
  return 0;
}

/* "a,b,c": every demuxer this FFmpeg has but the referencing ones. */
static char *demuxer_whitelist(void) {
  size_t size = 1, len = 0;
  void *it = NULL;
  const AVInputFormat *f;
  while ((f = av_demuxer_iterate(&it)))
    size += strlen(f->name) + 1;
  char *list = av_malloc(size);
  if (!list)
    return NULL;
  list[0] = '\0';
  it = NULL;
  while ((f = av_demuxer_iterate(&it))) {
    if (referencing(f->name))
      continue;
    len += (size_t)snprintf(list + len, size - len, "%s%s", len ? "," : "", f->name);
  }
  return list;
}

/* FFmpeg opens every file of a context through its io_open, the input's
 * own first (and again, for demuxers that reopen it, such as image2). */
static int guarded_io_open(AVFormatContext *s, AVIOContext **pb, const char *url, int flags, AVDictionary **options) {
  spn_media_input_t *in = s->opaque;
  if (!in || in->log.magic != SPN_MEDIA_LOG_MAGIC || !in->io_open)
    return AVERROR(EPERM); /* a nested context that copied our io_open: refuse */
  if (url && !strcmp(url, in->url))
    return in->io_open(s, pb, url, flags, options);
  if (!in->refused[0])
    snprintf(in->refused, sizeof in->refused, "%s", url ? url : "(none)");
  return AVERROR(EPERM);
}

/* FFmpeg's line for a demuxer kept out ("Format not on whitelist" and
 * the whole list, some 3 KB) is dropped: the job's error names the
 * format. Everything else goes on to the owner's log. */
static void guarded_log(void *user, int32_t level, const char *msg) {
  const spn_media_input_t *in = user;
  if (in->whitelisted && strstr(msg, "Format not on whitelist"))
    return;
  if (in->owner.fn)
    in->owner.fn(in->owner.user, level, msg);
}

int32_t spn_media_input_guard(spn_media_input_t *in, AVFormatContext *fmt, const char *path,
                              const spn_media_log_t *log, int follow_references, spn_error_t *err) {
  memset(in, 0, sizeof *in);
  in->log = (spn_media_log_t){.magic = SPN_MEDIA_LOG_MAGIC, .fn = guarded_log, .user = in};
  if (log)
    in->owner = *log;
  in->url = path;
  spn_media_log_claim_format(fmt, &in->log);
  /* a URL, or a protocol named on purpose ("pipe:0"): FFmpeg's to read */
  const char *proto = avio_find_protocol_name(path);
  if (follow_references || (proto && strcmp(proto, "file") != 0))
    return SPN_OK;
  in->io_open = fmt->io_open;
  fmt->io_open = guarded_io_open;
  /* freed with the context */
  if (!(fmt->format_whitelist = demuxer_whitelist()) || !(fmt->protocol_whitelist = av_strdup("file")))
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
  in->whitelisted = 1;
  return SPN_OK;
}

/* The demuxer FFmpeg would pick for path, from its name and first bytes:
 * to name a refused one. NULL when none or unreadable. */
static const AVInputFormat *probe_demuxer(const char *path) {
  const char *file = strncmp(path, "file:", 5) ? path : path + 5;
  FILE *f = fopen(file, "rb");
  if (!f)
    return NULL;
  unsigned char buf[4096 + AVPROBE_PADDING_SIZE] = {0};
  size_t n = fread(buf, 1, 4096, f);
  fclose(f);
  AVProbeData pd = {.filename = file, .buf = buf, .buf_size = (int)n};
  return av_probe_input_format(&pd, 1);
}

int32_t spn_media_input_refused(const spn_media_input_t *in, const char *path, int at_open, spn_error_t *err) {
  if (in->refused[0])
    return spn_error_set(err, SPN_EMEDIA,
                         "%s: refers to another file or URL (%s), which is not opened: an input is read as the one "
                         "file it names (decode's follow_references = true follows playlists, lists and external "
                         "references)",
                         path, in->refused);
  const AVInputFormat *f = at_open && in->whitelisted ? probe_demuxer(path) : NULL;
  if (f && referencing(f->name))
    return spn_error_set(err, SPN_EMEDIA,
                         "%s: is a file of FFmpeg's \"%s\" format (%s), which opens other files or URLs: an input "
                         "is read as the one file it names (decode's follow_references = true follows them)",
                         path, f->name, f->long_name ? f->long_name : f->name);
  return SPN_OK;
}

int32_t spn_media_check_input(const char *path, spn_error_t *err) {
  if (is_url(path))
    return SPN_OK;
  const char *file = strncmp(path, "file:", 5) ? path : path + 5;
  struct stat st;
  if (stat(file, &st) != 0 || S_ISREG(st.st_mode))
    return SPN_OK;
  const char *what = S_ISDIR(st.st_mode)    ? "a folder"
                     : S_ISFIFO(st.st_mode) ? "a named pipe (nothing could stop a read that waits for its writer)"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  return spn_error_set(err, SPN_EINVAL, "%s: %s; give a media file", path, what);
}

int32_t spn_decoder_new(const char *path, const spn_decode_opts_t *opts, spn_decoder_t **out,
                        spn_error_t *err) {
  static const spn_decode_opts_t defaults = SPN_DECODE_OPTS_INIT;
  *out = NULL;
  if (!path || !*path)
    return spn_error_set(err, SPN_EINVAL, "decode: empty path");
  int32_t checked = spn_media_check_input(path, err);
  if (checked < 0)
    return checked;
  spn_decoder_t *d = calloc(1, sizeof *d);
  if (!d || !(d->path = strdup(path))) {
    free(d);
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
  }
  int32_t rc = SPN_OK;
  d->o = opts ? *opts : defaults;
  d->vidx = d->aidx = -1;
  switch (d->o.pixfmt) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24: case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P:
  case SPN_PIXFMT_NV12: case SPN_PIXFMT_YUV420P: break;
  default:
    rc = spn_error_set(err, SPN_EINVAL, "%s: decode to pixel format '%s' is not supported", path,
                       spn_pixfmt_name(d->o.pixfmt));
    goto out_free;
  }
  if (d->o.start < 0 || !isfinite(d->o.start) || !isfinite(d->o.duration) || d->o.audio_rate < 0 ||
      d->o.audio_rate > 768000 || d->o.audio_channels < 0 || d->o.audio_channels > 16) {
    rc = spn_error_set(err, SPN_EINVAL, "%s: invalid decode options (start %g, duration %g, audio %d Hz x %d)",
                       path, d->o.start, d->o.duration, (int)d->o.audio_rate, (int)d->o.audio_channels);
    goto out_free;
  }
  if (!(d->fmt = avformat_alloc_context())) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out_free;
  }
  if ((rc = spn_media_input_guard(&d->in, d->fmt, d->path, d->o.log, d->o.follow_references, err)) != SPN_OK)
    goto out_free;
  int r = avformat_open_input(&d->fmt, path, NULL, NULL); /* frees d->fmt on failure */
  if (r < 0) {
    /* a demuxer kept out by the guard: name its format */
    if ((rc = spn_media_input_refused(&d->in, d->path, 1, err)) == SPN_OK)
      rc = av_fail(d, err, r == AVERROR(ENOENT) ? SPN_ENOENT : SPN_EMEDIA, r, NULL);
    goto out_free;
  }
  if ((r = avformat_find_stream_info(d->fmt, NULL)) < 0) {
    rc = av_fail(d, err, SPN_EMEDIA, r, NULL);
    goto out_free;
  }
  d->vidx = av_find_best_stream(d->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
  d->aidx = av_find_best_stream(d->fmt, AVMEDIA_TYPE_AUDIO, -1, d->vidx >= 0 ? d->vidx : -1, NULL, 0);
  if (d->vidx >= 0 && d->fmt->streams[d->vidx]->disposition & AV_DISPOSITION_ATTACHED_PIC)
    d->vidx = -1;
  if (d->o.want_video && d->vidx < 0) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: no video stream", path);
    goto out_free;
  }
  int file_vidx = d->vidx; /* the audio's clock, even where only the audio is read */
  if (!d->o.want_video)
    d->vidx = -1;
  if (!d->o.want_audio)
    d->aidx = -1;
  if (d->vidx < 0 && d->aidx < 0 && !(d->o.audio_optional && !d->o.want_video)) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: no audio stream", path);
    goto out_free;
  }
  if (d->vidx >= 0) {
    AVStream *st = d->fmt->streams[d->vidx];
    if ((rc = open_codec(d, st, &d->vctx, 1, err)))
      goto out_free;
    if (st->codecpar->width <= 0 || st->codecpar->height <= 0) {
      rc = spn_error_set(err, SPN_EMEDIA, "%s: video stream has no size", path);
      goto out_free;
    }
    d->vstart = st->start_time == AV_NOPTS_VALUE ? 0 : st->start_time;
    d->info.has_video = 1;
    d->info.rotation = d->o.autorotate ? stream_rotation(st) : 0;
    int quarter = d->info.rotation == 90 || d->info.rotation == 270;
    int32_t w = st->codecpar->width, h = st->codecpar->height;
    d->stored_w = quarter ? h : w;
    d->stored_h = quarter ? w : h;
    AVRational sar = av_guess_sample_aspect_ratio(d->fmt, st, NULL);
    if (sar.num <= 0 || sar.den <= 0 || !av_reduce(&sar.num, &sar.den, sar.num, sar.den, 1 << 16))
      sar = (AVRational){1, 1};
    d->info.sar_num = sar.num;
    d->info.sar_den = sar.den;
    d->conv_w = w;
    d->conv_h = h;
    /* RGB and float frames are for models and viewers: square pixels, SDR */
    int rgb_out = d->o.pixfmt != SPN_PIXFMT_NV12 && d->o.pixfmt != SPN_PIXFMT_YUV420P;
    if (sar.num != sar.den && rgb_out) {
      /* to square pixels, never dropping any: wider pixels widen the
       * picture, taller ones heighten it (even sizes, as 4:2:0 needs) */
      if (sar.num > sar.den)
        d->conv_w = 2 * (int32_t)llround(w * (double)sar.num / sar.den / 2.0);
      else
        d->conv_h = 2 * (int32_t)llround(h * (double)sar.den / sar.num / 2.0);
      if (d->conv_w > 16384 || d->conv_h > 16384) {
        rc = spn_error_set(err, SPN_EMEDIA, "%s: %dx%d video with %d:%d pixels is %dx%d in square pixels, more than "
                           "16384", path, (int)w, (int)h, sar.num, sar.den, (int)d->conv_w, (int)d->conv_h);
        goto out_free;
      }
    }
    d->info.width = quarter ? d->conv_h : d->conv_w;
    d->info.height = quarter ? d->conv_w : d->conv_h;
    /* HDR to RGB is tone-mapped to SDR (media-tonemap.h); 4:2:0 frames
     * stay the HDR signal, and keep its tags through encode */
    int tr = st->codecpar->color_trc;
    if ((tr == SPN_TRANSFER_PQ || tr == SPN_TRANSFER_HLG) && rgb_out) {
      if ((rc = spn_tonemap_new(tr, &d->tm, err)))
        goto out_free;
      d->info.tone_mapped = 1;
    }
    AVRational fr = av_guess_frame_rate(d->fmt, st, NULL);
    d->info.fps_num = fr.num > 0 ? fr.num : 25;
    d->info.fps_den = fr.num > 0 ? fr.den : 1;
    d->info.video_codec = d->vctx->codec->name;
    const AVCodecParameters *cp = st->codecpar;
    d->info.matrix = cp->color_space == AVCOL_SPC_UNSPECIFIED ? 0 : (int32_t)cp->color_space;
    d->info.full_range = cp->color_range == AVCOL_RANGE_JPEG;
    d->info.primaries = (int32_t)cp->color_primaries;
    d->info.transfer = (int32_t)cp->color_trc;
  }
  if (d->aidx >= 0) {
    AVStream *st = d->fmt->streams[d->aidx];
    if ((rc = open_codec(d, st, &d->actx, 0, err)))
      goto out_free;
    d->astart = st->start_time == AV_NOPTS_VALUE ? 0 : st->start_time;
    d->aorigin = d->astart;
    const AVStream *vst = file_vidx >= 0 ? d->fmt->streams[file_vidx] : NULL;
    if (vst && vst->start_time != AV_NOPTS_VALUE)
      d->aorigin = av_rescale_q(vst->start_time, vst->time_base, st->time_base);
    d->info.has_audio = 1;
    d->info.audio_rate = d->o.audio_rate ? d->o.audio_rate : d->actx->sample_rate;
    d->info.audio_channels = d->o.audio_channels ? d->o.audio_channels : d->actx->ch_layout.nb_channels;
    if (d->info.audio_rate <= 0 || d->info.audio_channels <= 0) {
      rc = spn_error_set(err, SPN_EMEDIA, "%s: audio stream has no rate or channel count", path);
      goto out_free;
    }
    d->info.audio_codec = d->actx->codec->name;
  }
  if (d->fmt->duration != AV_NOPTS_VALUE && d->fmt->duration > 0)
    d->info.duration = d->fmt->duration / (double)AV_TIME_BASE;
  d->pkt = av_packet_alloc();
  d->frame = av_frame_alloc();
  d->swframe = av_frame_alloc();
  if (!d->pkt || !d->frame || !d->swframe) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out_free;
  }
  if (d->o.start > 0) {
    int64_t ts = (int64_t)(d->o.start * AV_TIME_BASE);
    if (d->fmt->start_time != AV_NOPTS_VALUE)
      ts += d->fmt->start_time;
    r = av_seek_frame(d->fmt, -1, ts, AVSEEK_FLAG_BACKWARD);
    if (r < 0) {
      rc = av_fail(d, err, SPN_EMEDIA, r, "seeking");
      goto out_free;
    }
  }
  d->vdone = d->vidx < 0;
  d->adone = d->aidx < 0;
  d->a_next = -1;
  *out = d;
  return SPN_OK;
out_free:
  /* whatever failed, a reference the guard refused is the reason (image2
   * with a pattern fails later for want of a frame size) */
  if (rc != SPN_ENOMEM && d->in.refused[0])
    rc = spn_media_input_refused(&d->in, d->path, 0, err);
  spn_decoder_free(d);
  return rc;
}

void spn_decoder_free(spn_decoder_t *d) {
  if (!d)
    return;
  sws_freeContext(d->sws);
  spn_tonemap_free(d->tm);
  free(d->hdr_buf);
  spn_image_release(&d->deep8);
  swr_free(&d->swr);
  free(d->a_held);
  av_frame_free(&d->frame);
  av_frame_free(&d->swframe);
  av_packet_free(&d->pkt);
  avcodec_free_context(&d->vctx);
  avcodec_free_context(&d->actx);
  av_buffer_unref(&d->hw);
  avformat_close_input(&d->fmt);
  free(d->path);
  free(d);
}

const spn_decode_info_t *spn_decoder_info(const spn_decoder_t *d) {
  return &d->info;
}

void spn_media_item_release(spn_media_item_t *item) {
  if (!item)
    return;
  if (item->hw_frame) {
    AVFrame *f = item->hw_frame;
    av_frame_free(&f); /* the image only viewed it */
  } else {
    spn_image_release(&item->image);
  }
  free(item->samples);
  memset(item, 0, sizeof *item);
}

static enum AVPixelFormat av_format_for(int32_t f) {
  switch (f) {
  case SPN_PIXFMT_BGR24: case SPN_PIXFMT_BGRF32P: return AV_PIX_FMT_BGR24;
  case SPN_PIXFMT_NV12: return AV_PIX_FMT_NV12;
  case SPN_PIXFMT_YUV420P: return AV_PIX_FMT_YUV420P;
  default: return AV_PIX_FMT_RGB24;
  }
}

/* Where a frame's 4:2:0 samples are, for the conversions the GPU path
 * makes (media-cuda.c), done here with the CPU twins of its kernels: 8 to
 * 16 bits, planar or interleaved (NV12, P010), little-endian. 0 for any
 * other layout (4:2:2, 4:4:4, NV21, RGB...): swscale converts those. */
static int planes420(const AVFrame *f, spn_tonemap_yuv_t *v) {
  const AVPixFmtDescriptor *pd = av_pix_fmt_desc_get((enum AVPixelFormat)f->format);
  if (!pd || pd->nb_components != 3 || pd->log2_chroma_w != 1 || pd->log2_chroma_h != 1 ||
      (pd->flags & (AV_PIX_FMT_FLAG_BE | AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_HWACCEL)))
    return 0;
  int depth = pd->comp[0].depth, bytes = depth > 8 ? 2 : 1;
  int semi = pd->comp[1].plane == 1 && pd->comp[2].plane == 1;
  int planar = pd->comp[0].plane == 0 && pd->comp[1].plane == 1 && pd->comp[2].plane == 2;
  if (depth < 8 || depth > 16 || (!semi && !planar) || pd->comp[0].step != bytes || pd->comp[1].offset != 0 ||
      (semi && pd->comp[2].offset != bytes) || pd->comp[1].step != (semi ? 2 : 1) * bytes ||
      pd->comp[1].shift != pd->comp[0].shift || pd->comp[2].shift != pd->comp[0].shift)
    return 0;
  memset(v, 0, sizeof *v);
  v->width = f->width;
  v->height = f->height;
  v->plane[0] = f->data[0];
  v->plane[1] = f->data[1];
  v->plane[2] = semi ? f->data[1] + bytes : f->data[2];
  for (int p = 0; p < 3; p++)
    v->pitch[p] = f->linesize[semi && p == 2 ? 1 : p];
  v->step = semi ? 2 : 1;
  v->bits = 8 * bytes;
  v->shift = bytes == 2 ? pd->comp[0].shift : 0;
  v->up = bytes == 2 ? 16 - depth : 0;
  return 1;
}

/* An SDR 4:2:0 frame's samples in 8 bits (*v): a view of 8-bit frames;
 * deeper ones rounded to 8 bits into an image *v owns, as
 * spn_cuda_p016_to_yuv420 rounds NVDEC's P010/P016 (the top 8 of the 16
 * bits, rounded, 255 at most). 0 (and *rc untouched) where planes420 is. */
static int sdr420_view(const AVFrame *f, spn_image_t *v, int32_t *rc, spn_error_t *err) {
  spn_tonemap_yuv_t pl;
  if (!planes420(f, &pl))
    return 0;
  int32_t fmt = pl.step == 2 ? SPN_PIXFMT_NV12 : SPN_PIXFMT_YUV420P;
  if (pl.bits == 8) {
    spn_image_release(v);
    v->width = f->width;
    v->height = f->height;
    v->format = fmt;
    v->nplanes = pl.step == 2 ? 2 : 3;
    for (int p = 0; p < v->nplanes; p++) {
      v->data[p] = f->data[p];
      v->stride[p] = f->linesize[p];
    }
    return 1;
  }
  if (!v->owned || v->width != f->width || v->height != f->height || v->format != fmt) {
    spn_image_release(v);
    if ((*rc = spn_image_alloc(v, f->width, f->height, fmt, err)))
      return 1;
  }
  for (int p = 0; p < v->nplanes; p++) {
    int32_t rows = p ? (f->height + 1) / 2 : f->height;
    int32_t n = p ? pl.step * ((f->width + 1) / 2) : f->width;
    for (int32_t y = 0; y < rows; y++) {
      const uint16_t *in = (const uint16_t *)(f->data[p] + (ptrdiff_t)y * f->linesize[p]);
      uint8_t *out = v->data[p] + y * v->stride[p];
      for (int32_t x = 0; x < n; x++) {
        uint32_t s16 = (uint32_t)(in[x] >> pl.shift) << pl.up;
        out[x] = s16 >= 0xff80u ? 255 : (uint8_t)((s16 + 0x80u) >> 8);
      }
    }
  }
  return 1;
}

int32_t spn_decode_hdr(const spn_decode_info_t *info, char *buf, size_t n) {
  if (info->transfer != SPN_TRANSFER_PQ && info->transfer != SPN_TRANSFER_HLG)
    return 0;
  const char *pri = av_color_primaries_name((enum AVColorPrimaries)info->primaries);
  snprintf(buf, n, "%s transfer, %s primaries", info->transfer == SPN_TRANSFER_PQ ? "PQ" : "HLG",
           pri ? pri : "unknown");
  return 1;
}

/* The matrix and range a frame's 4:2:0 samples are in: its own tags, else
 * the stream's, else BT.601 (what FFmpeg assumes, and what programs that
 * write untagged files from RGB used); full range when tagged so or in a
 * JPEG ("yuvj") layout. A matrix this code has no coefficients for (FCC,
 * YCgCo, ICtCp, ...) is read as BT.601 too. */
static spn_colour_t frame_colour(const spn_decoder_t *d, const AVFrame *f) {
  int m = f->colorspace != AVCOL_SPC_UNSPECIFIED ? (int)f->colorspace : d->info.matrix;
  if (m == AVCOL_SPC_BT2020_CL)
    m = SPN_MATRIX_BT2020;
  if (m != SPN_MATRIX_BT709 && m != SPN_MATRIX_SMPTE240M && m != SPN_MATRIX_BT2020)
    m = SPN_MATRIX_BT601;
  enum AVPixelFormat pf = (enum AVPixelFormat)(f->format == AV_PIX_FMT_CUDA && f->hw_frames_ctx
                                                   ? ((const AVHWFramesContext *)f->hw_frames_ctx->data)->sw_format
                                                   : f->format);
  int full = f->color_range == AVCOL_RANGE_JPEG ||
             (f->color_range == AVCOL_RANGE_UNSPECIFIED && d->info.full_range) || pf == AV_PIX_FMT_YUVJ420P ||
             pf == AV_PIX_FMT_YUVJ422P || pf == AV_PIX_FMT_YUVJ444P || pf == AV_PIX_FMT_YUVJ440P;
  return (spn_colour_t){m, full};
}

/* Pts, index, the turn left to the caller, and the video end of a frame
 * item (every path). */
static void video_item_times(spn_decoder_t *d, const AVFrame *f, spn_media_item_t *item) {
  AVStream *st = d->fmt->streams[d->vidx];
  item->rotation = d->o.device_rotate ? d->info.rotation : 0;
  item->colour = frame_colour(d, f);
  int64_t ts = f->best_effort_timestamp;
  if (ts == AV_NOPTS_VALUE)
    ts = f->pts;
  item->kind = SPN_MEDIA_VIDEO;
  item->index = d->vcount++;
  item->pts = ts == AV_NOPTS_VALUE ? 0 : ts - d->vstart;
  item->tb_num = st->time_base.num;
  item->tb_den = st->time_base.den;
  item->pts_sec = item->pts * av_q2d(st->time_base);
  double fdur = (double)d->info.fps_den / d->info.fps_num;
  if (item->pts_sec + fdur > d->v_end)
    d->v_end = item->pts_sec + fdur;
}

/* Why a frame cannot stay on the device for the caller (the host path
 * takes it), or NULL: a rotation the caller does not apply. (Every frame
 * has the stream's size, drain sees to that; RGB frames of non-square
 * pixels are resampled on the GPU.) */
static const char *device_refusal(const spn_decoder_t *d) {
  return d->info.rotation && !d->o.device_rotate ? "the video has a rotation to apply (done on the CPU)" : NULL;
}

/* The item of a frame kept on the device: it views ref's planes (NV12, or
 * 16-bit samples in the same planes with deep) and owns ref. */
static void device_item(spn_decoder_t *d, AVFrame *ref, int deep, spn_media_item_t *item) {
  memset(item, 0, sizeof *item);
  item->hw_frame = ref;
  item->deep = deep;
  item->tone_map = d->tm ? d->info.transfer : 0; /* HDR to RGB: tone-mapped on the GPU */
  item->show_w = d->conv_w;                      /* and resampled there to square pixels */
  item->show_h = d->conv_h;
  item->image.width = ref->width;
  item->image.height = ref->height;
  item->image.format = SPN_PIXFMT_NV12;
  item->image.nplanes = 2;
  for (int p = 0; p < 2; p++) {
    item->image.data[p] = ref->data[p];
    item->image.stride[p] = ref->linesize[p];
  }
  d->info.host_frames_why = NULL;
  video_item_times(d, ref, item);
}

/* device_frames: keep an NVDEC frame on the GPU when the caller can take it
 * as it is (4:2:0: NV12, or P010/P016 above 8 bits; device_refusal): the
 * item views the frame's device planes and holds a reference to it.
 * Returns 0 when the frame must take the host path (host_frames_why says
 * why). */
static int32_t device_video_item(spn_decoder_t *d, AVFrame *f, spn_media_item_t *item, int *kept,
                                 spn_error_t *err) {
  *kept = 0;
  const AVHWFramesContext *fc = f->hw_frames_ctx ? (const AVHWFramesContext *)f->hw_frames_ctx->data : NULL;
  const char *why = device_refusal(d);
  if (why) {
    d->info.host_frames_why = why;
    return SPN_OK;
  }
  int deep = fc && (fc->sw_format == AV_PIX_FMT_P010 || fc->sw_format == AV_PIX_FMT_P016);
  if (!fc || (fc->sw_format != AV_PIX_FMT_NV12 && !deep)) {
    d->info.host_frames_why = "NVDEC gives this stream in a layout other than 4:2:0 (NV12, P010 or P016)";
    return SPN_OK;
  }
  AVFrame *ref = av_frame_clone(f);
  if (!ref)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", d->path);
  device_item(d, ref, deep, item);
  *kept = 1;
  return SPN_OK;
}

/* emu_upload: a software frame handed over as NVDEC would give it — its
 * samples repacked into NV12, or P010/P016 for 10 and 12 bits, in the fake
 * GPU's memory — or, as NVDEC gives 4:4:4 and 4:2:2 in other layouts, left
 * to the host path. */
static int32_t emulated_nvdec_item(spn_decoder_t *d, AVFrame *f, spn_media_item_t *item, int *kept,
                                   spn_error_t *err) {
  *kept = 0;
  int shift = f->format == AV_PIX_FMT_YUV420P10LE ? 6 : f->format == AV_PIX_FMT_YUV420P12LE ? 4 : -1;
  int eight = f->format == AV_PIX_FMT_YUV420P || f->format == AV_PIX_FMT_YUVJ420P;
  const char *why = device_refusal(d);
  if (!why && !eight && shift < 0)
    why = "NVDEC gives this stream in a layout other than 4:2:0 (NV12, P010 or P016)";
  if (why) {
    d->info.host_frames_why = why;
    return SPN_OK;
  }
  int32_t cw = (f->width + 1) / 2, ch = (f->height + 1) / 2;
  int pitch = ((eight ? 1 : 2) * 2 * cw + 255) & ~255; /* pitched, as NVDEC's planes are */
  size_t size = (size_t)pitch * (size_t)(f->height + ch);
  uint8_t *host = av_mallocz(size), *py = host, *pc = host + (size_t)pitch * (size_t)f->height;
  if (!host)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", d->path);
  for (int32_t y = 0; y < f->height; y++)
    for (int32_t x = 0; x < f->width; x++) {
      const uint8_t *s = f->data[0] + (ptrdiff_t)y * f->linesize[0];
      if (eight)
        py[(size_t)y * (size_t)pitch + (size_t)x] = s[x];
      else
        ((uint16_t *)(py + (size_t)y * (size_t)pitch))[x] = (uint16_t)(((const uint16_t *)s)[x] << shift);
    }
  for (int32_t y = 0; y < ch; y++)
    for (int32_t x = 0; x < cw; x++)
      for (int c = 0; c < 2; c++) {
        const uint8_t *s = f->data[1 + c] + (ptrdiff_t)y * f->linesize[1 + c];
        if (eight)
          pc[(size_t)y * (size_t)pitch + 2 * (size_t)x + (size_t)c] = s[x];
        else
          ((uint16_t *)(pc + (size_t)y * (size_t)pitch))[2 * x + c] = (uint16_t)(((const uint16_t *)s)[x] << shift);
      }
  uint8_t *mem = d->o.emu_upload(host, size);
  av_free(host);
  AVFrame *ref = mem ? av_frame_alloc() : NULL;
  if (ref && !(ref->buf[0] = av_buffer_create(mem, size, d->o.emu_free, NULL, 0)))
    av_frame_free(&ref);
  int r = ref ? av_frame_copy_props(ref, f) : AVERROR(ENOMEM);
  if (r < 0) {
    if (!ref && mem)
      d->o.emu_free(NULL, mem);
    av_frame_free(&ref);
    return av_fail(d, err, SPN_ENOMEM, r, "emulating NVDEC's frame");
  }
  ref->format = eight ? AV_PIX_FMT_NV12 : shift == 6 ? AV_PIX_FMT_P010 : AV_PIX_FMT_P016;
  ref->width = f->width;
  ref->height = f->height;
  ref->data[0] = mem;
  ref->data[1] = mem + (size_t)pitch * (size_t)f->height;
  ref->linesize[0] = ref->linesize[1] = pitch;
  device_item(d, ref, !eight, item);
  *kept = 1;
  return SPN_OK;
}

static int32_t make_video_item(spn_decoder_t *d, AVFrame *f, spn_media_item_t *item, spn_error_t *err) {
  int32_t rc;
  if (d->info.hwaccel_active && f->format != AV_PIX_FMT_CUDA) {
    /* FFmpeg's get_format fell back to software: NVDEC refused the stream
     * (a profile, bit depth or size it does not do, or no NVDEC at all). */
    if (d->o.hwaccel == SPN_HWACCEL_CUDA)
      return spn_error_set(err, SPN_EDEVICE, "%s: NVDEC cannot decode this %s stream (FFmpeg fell back to software "
                           "decoding; hwaccel = \"cuda\" requires NVDEC)", d->path, d->info.video_codec);
    d->info.host_frames_why = "NVDEC refused the stream: FFmpeg decodes it in software";
  }
  if (f->format == AV_PIX_FMT_CUDA && d->o.device_frames) {
    int kept = 0;
    if ((rc = device_video_item(d, f, item, &kept, err)) || kept)
      return rc;
  }
  if (d->o.emu_upload && d->o.emu_free && d->o.device_frames && f->format != AV_PIX_FMT_CUDA) {
    int kept = 0;
    if ((rc = emulated_nvdec_item(d, f, item, &kept, err)) || kept)
      return rc;
  }
  if (f->format == AV_PIX_FMT_CUDA) {
    av_frame_unref(d->swframe);
    int r = av_hwframe_transfer_data(d->swframe, f, 0);
    if (r < 0)
      return av_fail(d, err, SPN_EDEVICE, r, "copying a CUDA frame");
    av_frame_copy_props(d->swframe, f);
    f = d->swframe;
  }
  int32_t out_fmt = d->o.pixfmt;
  int32_t mid_fmt = (out_fmt == SPN_PIXFMT_RGBF32P) ? SPN_PIXFMT_RGB24
                    : (out_fmt == SPN_PIXFMT_BGRF32P) ? SPN_PIXFMT_BGR24 : out_fmt;
  spn_image_t conv = SPN_IMAGE_INIT, rot = SPN_IMAGE_INIT;
  int converted = 0, resample = d->conv_w != f->width || d->conv_h != f->height;
  if ((rc = spn_image_alloc(&conv, d->conv_w, d->conv_h, mid_fmt, err)))
    return spn_error_prefix(err, "%s", d->path);
  uint8_t *dst[4] = {conv.data[0], conv.data[1], conv.data[2], NULL};
  int lines[4] = {(int)conv.stride[0], (int)conv.stride[1], (int)conv.stride[2], 0};
  int samples = mid_fmt == SPN_PIXFMT_YUV420P || mid_fmt == SPN_PIXFMT_NV12;
  spn_tonemap_yuv_t hdr;
  spn_colour_t c = frame_colour(d, f); /* the samples' matrix and range */
  if (f->format == av_format_for(out_fmt) && !resample) {
    /* the decoder's own layout (yuv420p, nv12): a plane copy, no swscale */
    av_image_copy(dst, lines, (const uint8_t **)f->data, f->linesize, (enum AVPixelFormat)f->format, f->width,
                  f->height);
  } else if (d->tm ? planes420(f, &hdr)
                   : !(samples && (resample || c.full_range)) && sdr420_view(f, &d->deep8, &rc, err)) {
    /* 4:2:0 as the GPU path converts it (media-cuda.c's
     * spn_media_cuda_from_item), with the CPU twins of its kernels, so that
     * a CPU and a GPU run decode the same frames: SDR to RGB (deeper samples
     * first rounded to 8 bits) or deeper 4:2:0 to 8 bits; HDR tone-mapped
     * to RGB; RGB of non-square pixels at the stored size, then bicubic to
     * square pixels. (Full-range or resampled 4:2:0 out stays with swscale,
     * which makes it limited and resamples its planes.) */
    spn_image_t stored = SPN_IMAGE_INIT, *to = resample ? &stored : &conv;
    if (!rc && resample)
      rc = spn_image_alloc(&stored, f->width, f->height, mid_fmt, err);
    if (!rc)
      rc = d->tm ? spn_tonemap_yuv420(d->tm, &hdr, &c, to, err) : spn_image_convert_colour(&d->deep8, to, &c, err);
    if (!rc && resample)
      rc = spn_image_resize(&stored, &conv, SPN_INTERP_CUBIC, err);
    spn_image_release(&stored);
    if (rc) {
      spn_image_release(&conv);
      return spn_error_prefix(err, "%s", d->path);
    }
    converted = 1;
  } else {
    struct SwsContext *prev = d->sws;
    /* (and to square pixels, in the same pass, when the file's are not;
     * HDR of another layout: to 16-bit RGB for the tone mapper, which then
     * writes conv) */
    enum AVPixelFormat to = d->tm ? AV_PIX_FMT_RGB48 : av_format_for(out_fmt);
    /* SWS_FULL_CHR_H_INT: without it, swscale's generic path to packed RGB
     * (the one SWS_ACCURATE_RND selects) reads limited range about 2 levels
     * dark (FFmpeg 5.1: Y 235 gives 253, not 255) */
    int rgb_out = to != AV_PIX_FMT_YUV420P && to != AV_PIX_FMT_NV12;
    d->sws = sws_getCachedContext(d->sws, f->width, f->height, (enum AVPixelFormat)f->format, d->conv_w,
                                  d->conv_h, to,
                                  (resample ? SWS_BICUBIC : SWS_BILINEAR) | SWS_ACCURATE_RND |
                                      (rgb_out ? SWS_FULL_CHR_H_INT : 0),
                                  NULL, NULL, NULL);
    if (!d->sws) {
      spn_image_release(&conv);
      return spn_error_set(err, SPN_EMEDIA, "%s: cannot convert %s frames to %s", d->path,
                           av_get_pix_fmt_name((enum AVPixelFormat)f->format), spn_pixfmt_name(mid_fmt));
    }
    /* read the samples in the file's matrix and range (swscale's default is
     * BT.601 limited whatever the file says); to RGB: full range, to 4:2:0:
     * the same matrix, limited range */
    if (d->sws != prev || c.matrix != d->sws_colour.matrix || c.full_range != d->sws_colour.full_range) {
      int to_rgb = mid_fmt == SPN_PIXFMT_RGB24 || mid_fmt == SPN_PIXFMT_BGR24;
      const int *m = sws_getCoefficients(c.matrix);
      sws_setColorspaceDetails(d->sws, m, c.full_range, m, to_rgb, 0, 1 << 16, 1 << 16);
      d->sws_colour = c;
    }
    converted = 1;
    size_t row = (size_t)d->conv_w * 6, need = row * (size_t)d->conv_h;
    if (d->tm && need > d->hdr_cap) {
      uint16_t *nb = realloc(d->hdr_buf, need);
      if (!nb) {
        spn_image_release(&conv);
        return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", d->path);
      }
      d->hdr_buf = nb;
      d->hdr_cap = need;
    }
    uint8_t *hd[4] = {(uint8_t *)d->hdr_buf, NULL, NULL, NULL};
    int hl[4] = {(int)row, 0, 0, 0};
    sws_scale(d->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, d->tm ? hd : dst,
              d->tm ? hl : lines);
    if (d->tm && (rc = spn_tonemap_rgb48(d->tm, d->hdr_buf, (int64_t)row, &conv, err))) {
      spn_image_release(&conv);
      return spn_error_prefix(err, "%s", d->path);
    }
  }
  spn_image_t *cur = &conv;
  if (d->info.rotation && !d->o.device_rotate) {
    int q = d->info.rotation != 180;
    if ((rc = spn_image_alloc(&rot, q ? conv.height : conv.width, q ? conv.width : conv.height, mid_fmt, err)) ||
        (rc = spn_image_rotate(&conv, &rot, d->info.rotation, err))) {
      spn_image_release(&conv);
      spn_image_release(&rot);
      return spn_error_prefix(err, "%s", d->path);
    }
    spn_image_release(&conv);
    cur = &rot;
  }
  memset(item, 0, sizeof *item);
  if (out_fmt != mid_fmt) {
    if ((rc = spn_image_alloc(&item->image, cur->width, cur->height, out_fmt, err)) ||
        (rc = spn_image_to_float(cur, &item->image, NULL, NULL, err))) {
      spn_image_release(cur);
      spn_image_release(&item->image);
      return spn_error_prefix(err, "%s", d->path);
    }
    spn_image_release(cur);
  } else {
    item->image = *cur;
  }
  video_item_times(d, f, item);
  if (converted)
    item->colour.full_range = 0; /* swscale wrote limited-range 4:2:0, or RGB: back to 4:2:0 is that too */
  if (d->tm)
    item->colour = (spn_colour_t){SPN_MATRIX_BT709, 0}; /* SDR BT.709 now */
  return SPN_OK;
}

/* The silence before a sound that starts after the video (a second per
 * item), then that first sound, held by make_audio_item (SPN_EAGAIN when
 * there is none: the sound starts after the segment). */
static int32_t audio_silence(spn_decoder_t *d, spn_media_item_t *item, spn_error_t *err) {
  int rate = d->info.audio_rate, ch = d->info.audio_channels;
  memset(item, 0, sizeof *item);
  item->kind = SPN_MEDIA_AUDIO;
  item->channels = ch;
  item->rate = rate;
  item->tb_num = 1;
  item->tb_den = rate;
  item->pts = d->a_next;
  item->pts_sec = (double)d->a_next / rate;
  if (d->a_next >= d->a_held_at) {
    d->a_silence = 0;
    if (!d->a_held)
      return SPN_EAGAIN;
    item->samples = d->a_held;
    item->n_samples = d->a_held_n;
    d->a_held = NULL;
    d->a_next = d->a_held_at + d->a_held_n;
  } else {
    int64_t n = d->a_held_at - d->a_next < rate ? d->a_held_at - d->a_next : rate;
    if (!(item->samples = calloc((size_t)n * (size_t)ch, sizeof(float))))
      return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", d->path);
    item->n_samples = n;
    d->a_next += n;
  }
  item->index = d->acount++;
  return SPN_OK;
}

/* Resample one decoded frame (or flush with f == NULL) and emit the part
 * inside the segment. Returns SPN_OK with item filled, SPN_EAGAIN when
 * nothing is to be emitted. */
static int32_t make_audio_item(spn_decoder_t *d, AVFrame *f, spn_media_item_t *item, spn_error_t *err) {
  AVStream *st = d->fmt->streams[d->aidx];
  int rate = d->info.audio_rate, ch = d->info.audio_channels;
  if (!d->swr) {
    if (!f)
      return SPN_EAGAIN;
    AVChannelLayout out_layout;
    av_channel_layout_default(&out_layout, ch);
    int r = swr_alloc_set_opts2(&d->swr, &out_layout, AV_SAMPLE_FMT_FLT, rate, &f->ch_layout,
                                (enum AVSampleFormat)f->format, f->sample_rate, 0, NULL);
    av_channel_layout_uninit(&out_layout);
    if (r < 0 || (r = swr_init(d->swr)) < 0)
      return av_fail(d, err, SPN_EMEDIA, r, "setting up the audio resampler");
  }
  if (!d->a_started) {
    if (!f)
      return SPN_EAGAIN;
    int64_t ts = f->best_effort_timestamp != AV_NOPTS_VALUE ? f->best_effort_timestamp : f->pts;
    double t = ts == AV_NOPTS_VALUE ? 0.0 : (ts - d->aorigin) * av_q2d(st->time_base);
    d->a_base = llrint(t * rate);
    d->a_started = 1;
  }
  int cap = swr_get_out_samples(d->swr, f ? f->nb_samples : 0);
  if (cap <= 0)
    return SPN_EAGAIN;
  float *buf = malloc(sizeof(float) * (size_t)cap * (size_t)ch);
  if (!buf)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", d->path);
  uint8_t *outp[1] = {(uint8_t *)buf};
  int n = swr_convert(d->swr, outp, cap, f ? (const uint8_t **)f->extended_data : NULL, f ? f->nb_samples : 0);
  if (n < 0) {
    free(buf);
    return av_fail(d, err, SPN_EMEDIA, n, "resampling audio");
  }
  /* segment trimming in samples */
  int64_t first = d->a_base + d->a_out, last = first + n;
  d->a_out += n;
  int64_t lo = llrint(d->o.start * rate);
  int64_t hi = d->o.duration > 0 ? llrint((d->o.start + d->o.duration) * rate) : INT64_MAX;
  /* The stream's declared duration ends the audio: MP4 marks AAC's end
   * padding that way, and decoders return the padding otherwise. */
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
    int64_t end = llrint((double)(d->astart - d->aorigin + st->duration) * av_q2d(st->time_base) * rate);
    if (end < hi)
      hi = end;
  }
  int64_t s = first > lo ? first : lo, e = last < hi ? last : hi;
  if (first >= hi)
    d->adone = 1;
  int opening = d->a_next < 0;
  if (opening)
    d->a_next = lo > 0 ? lo : 0;
  if (e <= s) {
    free(buf);
    if (opening && first >= hi && d->o.duration > 0 && hi > d->a_next) {
      /* the sound starts after the segment's end: the segment is silent */
      d->a_silence = 1;
      d->a_held_at = hi;
      return audio_silence(d, item, err);
    }
    return SPN_EAGAIN;
  }
  if (s > first)
    memmove(buf, buf + (s - first) * ch, sizeof(float) * (size_t)(e - s) * (size_t)ch);
  if (s > d->a_next) {
    /* the sound starts after the video: hold it, silence first */
    d->a_silence = 1;
    d->a_held = buf;
    d->a_held_at = s;
    d->a_held_n = e - s;
    return audio_silence(d, item, err);
  }
  d->a_next = e;
  memset(item, 0, sizeof *item);
  item->kind = SPN_MEDIA_AUDIO;
  item->index = d->acount++;
  item->samples = buf;
  item->n_samples = e - s;
  item->channels = ch;
  item->rate = rate;
  item->pts = s;
  item->tb_num = 1;
  item->tb_den = rate;
  item->pts_sec = (double)s / rate;
  return SPN_OK;
}

/* Where a stream should end, in seconds on its clock (the video's from its
 * start; the audio's from aorigin): its declared duration, or the
 * container's when the stream declares none and is the only one; bounded
 * by the segment. < 0: unknown. */
static double expected_end(const spn_decoder_t *d, int idx) {
  const AVStream *st = d->fmt->streams[idx];
  double end = -1;
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0)
    end = (double)(st->duration + (idx == d->aidx ? d->astart - d->aorigin : 0)) * av_q2d(st->time_base);
  else if (d->fmt->nb_streams == 1 && d->info.duration > 0)
    end = d->info.duration;
  if (end >= 0 && d->o.duration > 0 && d->o.start + d->o.duration < end)
    end = d->o.start + d->o.duration;
  return end;
}

/* A decoder refused data. When the demuxer had just handed over a packet
 * cut short by the end of the file, that is what the user needs to hear. */
static int32_t decode_failed(spn_decoder_t *d, spn_error_t *err, int averr, int video) {
  if (d->cut) {
    double want = expected_end(d, video ? d->vidx : d->aidx);
    if (want > 0)
      return spn_error_set(err, SPN_EMEDIA, "%s: truncated: %s ends at %.2f s of %.2f s", d->path,
                           video ? "video" : "audio", d->cut_at, want);
    return spn_error_set(err, SPN_EMEDIA, "%s: truncated: %s ends at %.2f s", d->path, video ? "video" : "audio",
                         d->cut_at);
  }
  return av_fail(d, err, SPN_EMEDIA, averr, video ? "decoding video" : "decoding audio");
}

static int frame_is_corrupt(const AVFrame *f) {
#ifdef AV_FRAME_FLAG_CORRUPT
  if (f->flags & AV_FRAME_FLAG_CORRUPT)
    return 1;
#endif
  return f->decode_error_flags != 0;
}

/* Try to take one item out of the decoders. SPN_EAGAIN: need more input. */
static int32_t drain(spn_decoder_t *d, spn_media_item_t *item, spn_error_t *err) {
  int32_t rc;
  while (!d->vdone) {
    int r = avcodec_receive_frame(d->vctx, d->frame);
    if (r == AVERROR(EAGAIN))
      break;
    if (r == AVERROR_EOF) {
      d->vdone = 1;
      break;
    }
    AVStream *st = d->fmt->streams[d->vidx];
    if (r < 0) {
      if (r == AVERROR_INVALIDDATA && d->o.tolerate_errors) {
        d->info.corrupt_packets++;
        continue;
      }
      return decode_failed(d, err, r, 1);
    }
    int64_t ts = d->frame->best_effort_timestamp;
    double t = ts == AV_NOPTS_VALUE ? 0 : (ts - d->vstart) * av_q2d(st->time_base);
    if (frame_is_corrupt(d->frame)) {
      d->info.corrupt_packets++;
      if (!d->o.tolerate_errors) {
        av_frame_unref(d->frame);
        return spn_error_set(err, SPN_EMEDIA, "%s: corrupt video frame at %.2f s (set tolerate_errors to accept it)",
                             d->path, t);
      }
    }
    /* Every frame has the stream's size: encode, the vision stages and the
     * job's frame buffers are sized from it at open. A damaged or spliced
     * stream can change size mid-way (a new SPS); that is damage like any
     * other: it fails the job, or with tolerate_errors the frame is skipped. */
    int quarter = d->info.rotation == 90 || d->info.rotation == 270;
    int fw = quarter ? d->frame->height : d->frame->width, fh = quarter ? d->frame->width : d->frame->height;
    if (fw != d->stored_w || fh != d->stored_h) {
      d->info.corrupt_packets++;
      av_frame_unref(d->frame);
      if (d->o.tolerate_errors)
        continue;
      return spn_error_set(err, SPN_EMEDIA,
                           "%s: video frame at %.2f s is %dx%d, the stream is %dx%d (set tolerate_errors to skip "
                           "such frames)",
                           d->path, t, fw, fh, (int)d->stored_w, (int)d->stored_h);
    }
    /* Only a segment drops leading frames: without one, a frame whose
     * time is below 0 (a damaged edit list or composition table) is still
     * a frame of the file and is kept. */
    if (d->o.start > 0 && t < d->o.start - 1e-6) {
      av_frame_unref(d->frame);
      continue;
    }
    if (d->o.duration > 0 && t >= d->o.start + d->o.duration - 1e-6) {
      av_frame_unref(d->frame);
      d->vdone = 1;
      break;
    }
    rc = make_video_item(d, d->frame, item, err);
    av_frame_unref(d->frame);
    return rc;
  }
  if (d->a_silence && (rc = audio_silence(d, item, err)) != SPN_EAGAIN)
    return rc;
  while (!d->adone) {
    int r = avcodec_receive_frame(d->actx, d->frame);
    if (r == AVERROR(EAGAIN))
      break;
    if (r == AVERROR_EOF) {
      if (!d->swr_flushed) {
        d->swr_flushed = 1;
        rc = make_audio_item(d, NULL, item, err);
        if (rc != SPN_EAGAIN)
          return rc;
      }
      d->adone = 1;
      break;
    }
    if (r < 0) {
      if (r == AVERROR_INVALIDDATA && d->o.tolerate_errors) {
        d->info.corrupt_packets++;
        continue;
      }
      return decode_failed(d, err, r, 0);
    }
    if (frame_is_corrupt(d->frame)) {
      d->info.corrupt_packets++;
      if (!d->o.tolerate_errors) {
        AVStream *st = d->fmt->streams[d->aidx];
        double t = d->frame->pts == AV_NOPTS_VALUE ? 0 : (d->frame->pts - d->aorigin) * av_q2d(st->time_base);
        av_frame_unref(d->frame);
        return spn_error_set(err, SPN_EMEDIA, "%s: corrupt audio frame at %.2f s (set tolerate_errors to accept it)",
                             d->path, t);
      }
    }
    rc = make_audio_item(d, d->frame, item, err);
    av_frame_unref(d->frame);
    if (rc != SPN_EAGAIN)
      return rc;
  }
  return SPN_EAGAIN;
}

/* At the end of the stream: did every decoded stream reach its declared
 * end? (Rule: more than two frames, or 0.1 s of audio, short is a truncated
 * file; a segment that starts after the end is refused as such.) */
static int32_t check_end(spn_decoder_t *d, spn_error_t *err) {
  d->end_checked = 1;
  if (d->vidx >= 0) {
    double want = expected_end(d, d->vidx);
    double tol = 2.0 * d->info.fps_den / d->info.fps_num + 1e-3;
    d->info.video_end = d->v_end;
    d->info.video_expected = want;
    if (want >= 0 && d->o.start > 0 && d->o.start >= want - 1e-6)
      return spn_error_set(err, SPN_EMEDIA, "%s: segment starts at %.2f s, after the end of the video (%.2f s)",
                           d->path, d->o.start, want);
    /* No declared duration: a frame count in the index (MP4's) is the
     * next best statement of what the file holds. */
    const AVStream *vst = d->fmt->streams[d->vidx];
    if (want < 0 && d->o.start <= 0 && d->o.duration <= 0 && vst->nb_frames > 0 && d->vcount < vst->nb_frames) {
      d->info.truncated = 1;
      if (!d->o.tolerate_errors)
        return spn_error_set(err, SPN_EMEDIA, "%s: truncated: %lld of the %lld video frames its index lists",
                             d->path, (long long)d->vcount, (long long)vst->nb_frames);
    }
    if (want >= 0 && d->v_end < want - tol) {
      d->info.truncated = 1;
      if (!d->o.tolerate_errors)
        return spn_error_set(err, SPN_EMEDIA, "%s: truncated: video ends at %.2f s of %.2f s%s", d->path,
                             d->v_end, want, d->info.corrupt_packets ? " (corrupt data skipped)" : "");
    }
  }
  if (d->aidx >= 0 && d->a_started) {
    double want = expected_end(d, d->aidx);
    double got = (double)(d->a_base + d->a_out) / d->info.audio_rate;
    /* 0.1 s, and the samples the decoder dropped at the start: an MP3's
     * declared length counts the encoder's delay (its start_time: 1105
     * samples, 0.07 s at 16 kHz) and padding, which are not sound. */
    double skip = d->astart * av_q2d(d->fmt->streams[d->aidx]->time_base);
    double tol = 0.1 + (skip > 0 && skip < 0.5 ? skip : 0);
    if (want >= 0 && got < want - tol) {
      d->info.truncated = 1;
      if (!d->o.tolerate_errors)
        return spn_error_set(err, SPN_EMEDIA, "%s: truncated: audio ends at %.2f s of %.2f s", d->path, got, want);
    }
  } else if (d->aidx >= 0 && d->vidx < 0) {
    double want = expected_end(d, d->aidx);
    if (want > d->o.start + 0.1) {
      d->info.truncated = 1;
      if (!d->o.tolerate_errors)
        return spn_error_set(err, SPN_EMEDIA, "%s: truncated: no audio decoded of %.2f s", d->path, want);
    }
  }
  return SPN_EOS;
}

static int32_t next_item(spn_decoder_t *d, spn_media_item_t *item, spn_error_t *err);

int32_t spn_decoder_next(spn_decoder_t *d, spn_media_item_t *item, spn_error_t *err) {
  int32_t rc = next_item(d, item, err);
  if (rc == SPN_EOS && !d->end_checked)
    rc = check_end(d, err);
  return rc;
}

static int32_t next_item(spn_decoder_t *d, spn_media_item_t *item, spn_error_t *err) {
  memset(item, 0, sizeof *item);
  for (;;) {
    int32_t rc = drain(d, item, err);
    if (rc != SPN_EAGAIN)
      return rc;
    if (d->vdone && d->adone)
      return SPN_EOS;
    if (d->eof_sent)
      return SPN_EOS; /* decoders said EAGAIN after a flush: nothing more */
    int r = av_read_frame(d->fmt, d->pkt);
    if (r == AVERROR_EOF || (r < 0 && avio_feof(d->fmt->pb))) {
      if (d->vctx && !d->vdone)
        avcodec_send_packet(d->vctx, NULL);
      if (d->actx && !d->adone)
        avcodec_send_packet(d->actx, NULL);
      d->eof_sent = 1;
      /* the drained decoders now return AVERROR_EOF; run drain until they do */
      for (;;) {
        rc = drain(d, item, err);
        if (rc != SPN_EAGAIN)
          return rc;
        if ((d->vdone || !d->vctx) && (d->adone || !d->actx))
          return SPN_EOS;
        /* EAGAIN after a flush means the decoder is spent */
        if (!d->vdone && d->vctx)
          d->vdone = 1;
        if (!d->adone && d->actx && d->swr_flushed)
          d->adone = 1;
        if (!d->adone && d->actx && !d->swr_flushed) {
          d->swr_flushed = 1;
          rc = make_audio_item(d, NULL, item, err);
          d->adone = 1;
          if (rc != SPN_EAGAIN)
            return rc;
        }
      }
    }
    if (r < 0)
      return av_fail(d, err, SPN_EIO, r, "reading");
    AVCodecContext *ctx = NULL;
    if (d->pkt->stream_index == d->vidx && !d->vdone)
      ctx = d->vctx;
    else if (d->pkt->stream_index == d->aidx && !d->adone)
      ctx = d->actx;
    if (ctx && (d->pkt->flags & AV_PKT_FLAG_CORRUPT) && d->pkt->pos >= 0 && !d->cut) {
      /* "partial file": the packet runs past the file's end */
      int64_t size = avio_size(d->fmt->pb);
      if (size > 0 && d->pkt->pos + d->pkt->size >= size) {
        AVStream *st = d->fmt->streams[d->pkt->stream_index];
        int64_t pts = d->pkt->pts != AV_NOPTS_VALUE ? d->pkt->pts : d->pkt->dts;
        d->cut = 1;
        d->cut_at = pts == AV_NOPTS_VALUE ? 0
                    : (pts - (ctx == d->vctx ? d->vstart : d->aorigin)) * av_q2d(st->time_base);
      }
    }
    if (ctx) {
      r = avcodec_send_packet(ctx, d->pkt);
      if (r == AVERROR_INVALIDDATA && d->o.tolerate_errors) {
        d->info.corrupt_packets++; /* corrupt packet: skip it, as the ffmpeg CLI does */
      } else if (r == AVERROR_INVALIDDATA && d->cut) {
        av_packet_unref(d->pkt);
        return decode_failed(d, err, r, ctx == d->vctx);
      } else if (r == AVERROR_INVALIDDATA) {
        AVStream *st = d->fmt->streams[d->pkt->stream_index];
        int64_t pts = d->pkt->pts != AV_NOPTS_VALUE ? d->pkt->pts : d->pkt->dts;
        double t = pts == AV_NOPTS_VALUE ? 0
                   : (pts - (ctx == d->vctx ? d->vstart : d->aorigin)) * av_q2d(st->time_base);
        av_packet_unref(d->pkt);
        return spn_error_set(err, SPN_EMEDIA, "%s: corrupt %s packet at %.2f s (set tolerate_errors to skip it)",
                             d->path, ctx == d->vctx ? "video" : "audio", t);
      } else if (r < 0 && r != AVERROR(EAGAIN)) {
        av_packet_unref(d->pkt);
        return av_fail(d, err, SPN_EMEDIA, r, ctx == d->vctx ? "decoding video" : "decoding audio");
      }
    }
    av_packet_unref(d->pkt);
    if (d->vdone && d->adone)
      return SPN_EOS;
  }
}
