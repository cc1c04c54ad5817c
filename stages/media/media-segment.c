/* media-segment.c — what the job service needs from FFmpeg to split one
 * video job into segments and join their outputs (docs/jobs.md, "Segments").
 *
 * The job service links no FFmpeg; the encode plugin carries this file and
 * exports its table (SPN_SEGMENT_API_SYMBOL), which the pipeline runner looks
 * up in the already loaded plugin.
 *
 * keyframes(): the presentation times of the key packets of a file's first
 * video stream, read from the demuxer without decoding, in seconds after
 * the stream's start (the clock the decode stage's `start` and `duration`
 * use), so a segment cut at one of them decodes from a keyframe and drops
 * nothing before it.
 *
 * join(): the segment outputs, in order, into one file without re-encoding
 * the video: every part's video packets are copied with their timestamps
 * shifted so part k starts where part k-1 ended (each part is a closed
 * stream that starts with a keyframe: its own encoder made it). The parts'
 * codec headers must match byte for byte, or the joined stream would not
 * decode; a mismatch is an error naming the part.
 *
 * Audio is carried once for the whole job: the input's soundtrack (or the
 * soundtrack file the job's encoder muxes, cut where the joined video
 * ends as that encoder cuts it: join_cut) is decoded from its start and
 * encoded in one go with the codec, rate, layout and bit rate of the
 * segments' audio, then interleaved with the joined video. The segments' own audio is not used: AAC starts every stream with
 * encoder priming and smears a hard end over its last frame, so audio
 * copied or decoded per segment has a gap or a click at every join (the
 * test measures the loudness around each join against the whole job's).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/audio_fifo.h>
#include <libavutil/channel_layout.h>
#include <libswresample/swresample.h>

#include "media-decode.h"
#include "media-encode.h"
#include "spindle/jobs.h"
#include "spindle/plugin.h"

static int32_t av_err(spn_error_t *err, int averr, const char *path, const char *what) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(averr, buf, sizeof buf);
  return spn_error_set(err, spn_media_av_status(averr), "%s: %s: %s", path, what, buf);
}

/* Open path as one file (media-decode.h, spn_media_input_t: `in` must
 * outlive *fmt; a playlist or list inside it is not followed). */
static int32_t open_input(const char *path, AVFormatContext **fmt, spn_media_input_t *in, spn_error_t *err) {
  *fmt = NULL;
  int32_t checked = spn_media_check_input(path, err);
  if (checked < 0)
    return checked;
  if (!(*fmt = avformat_alloc_context()))
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
  int32_t rc = spn_media_input_guard(in, *fmt, path, NULL, 0, err);
  if (rc != SPN_OK) {
    avformat_free_context(*fmt);
    *fmt = NULL;
    return rc;
  }
  int r = avformat_open_input(fmt, path, NULL, NULL); /* frees *fmt on failure */
  int32_t refused = r < 0 ? spn_media_input_refused(in, path, 1, err) : SPN_OK;
  if (refused != SPN_OK)
    return refused;
  if (r < 0)
    return av_err(err, r, path, "opening");
  if ((r = avformat_find_stream_info(*fmt, NULL)) < 0) {
    avformat_close_input(fmt);
    refused = spn_media_input_refused(in, path, 0, err);
    return refused != SPN_OK ? refused : av_err(err, r, path, "reading stream info");
  }
  return SPN_OK;
}

static int first_stream(const AVFormatContext *fmt, enum AVMediaType type) {
  for (unsigned i = 0; i < fmt->nb_streams; i++)
    if (fmt->streams[i]->codecpar->codec_type == type &&
        !(fmt->streams[i]->disposition & AV_DISPOSITION_ATTACHED_PIC))
      return (int)i;
  return -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int32_t seg_keyframes(const char *path, double **times, size_t *n, double *duration, spn_error_t *err) {
  *times = NULL;
  *n = 0;
  *duration = 0;
  AVFormatContext *fmt;
  spn_media_input_t in;
  int32_t rc = open_input(path, &fmt, &in, err);
  if (rc)
    return rc;
  int vi = first_stream(fmt, AVMEDIA_TYPE_VIDEO);
  if (vi < 0) {
    avformat_close_input(&fmt);
    return spn_error_set(err, SPN_EMEDIA, "%s: no video stream to cut into segments", path);
  }
  AVStream *st = fmt->streams[vi];
  double tb = av_q2d(st->time_base);
  int64_t start = st->start_time == AV_NOPTS_VALUE ? 0 : st->start_time;
  AVPacket *pkt = av_packet_alloc();
  size_t cap = 0;
  double end = 0;
  int r;
  if (!pkt) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  while ((r = av_read_frame(fmt, pkt)) >= 0) {
    if (pkt->stream_index == vi && pkt->pts != AV_NOPTS_VALUE) {
      double t = (double)(pkt->pts - start) * tb;
      double e = t + (pkt->duration > 0 ? (double)pkt->duration * tb : 0);
      if (e > end)
        end = e;
      if (pkt->flags & AV_PKT_FLAG_KEY) {
        if (*n == cap) {
          cap = cap ? cap * 2 : 64;
          double *nv = realloc(*times, cap * sizeof *nv);
          if (!nv) {
            av_packet_unref(pkt);
            rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
            goto out;
          }
          *times = nv;
        }
        (*times)[(*n)++] = t < 0 ? 0 : t;
      }
    }
    av_packet_unref(pkt);
  }
  if (r != AVERROR_EOF) {
    rc = av_err(err, r, path, "reading packets");
    goto out;
  }
  if (*n == 0) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: the video stream has no keyframe", path);
    goto out;
  }
  qsort(*times, *n, sizeof **times, cmp_double);
  *duration = end;
out:
  av_packet_free(&pkt);
  avformat_close_input(&fmt);
  if (rc) {
    free(*times);
    *times = NULL;
    *n = 0;
  }
  return rc;
}

/* ---- join ---- */

typedef struct apkts {
  AVPacket **v;
  size_t n, cap;
} apkts_t;

static void apkts_free(apkts_t *a) {
  for (size_t i = 0; i < a->n; i++)
    av_packet_free(&a->v[i]);
  free(a->v);
  memset(a, 0, sizeof *a);
}

typedef struct audio_join {
  AVCodecContext *enc;
  AVAudioFifo *fifo;
  AVFrame *frame;
  int64_t next_pts; /* samples handed to the encoder */
  apkts_t out;      /* encoded packets, in encoder time base (1/rate) */
} audio_join_t;

static int32_t drain_encoder(audio_join_t *aj, const char *out, spn_error_t *err) {
  for (;;) {
    AVPacket *p = av_packet_alloc();
    if (!p)
      return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
    int r = avcodec_receive_packet(aj->enc, p);
    if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) {
      av_packet_free(&p);
      return SPN_OK;
    }
    if (r < 0) {
      av_packet_free(&p);
      return av_err(err, r, out, "encoding audio");
    }
    if (aj->out.n == aj->out.cap) {
      size_t cap = aj->out.cap ? aj->out.cap * 2 : 256;
      AVPacket **nv = realloc(aj->out.v, cap * sizeof *nv);
      if (!nv) {
        av_packet_free(&p);
        return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
      }
      aj->out.v = nv;
      aj->out.cap = cap;
    }
    aj->out.v[aj->out.n++] = p;
  }
}

/* Encode whole frames from the fifo (and the partial last one at flush). */
static int32_t encode_fifo(audio_join_t *aj, bool flush, const char *out, spn_error_t *err) {
  int fs = aj->enc->frame_size > 0 ? aj->enc->frame_size : 1024;
  while (av_audio_fifo_size(aj->fifo) >= fs || (flush && av_audio_fifo_size(aj->fifo) > 0)) {
    int n = FFMIN(fs, av_audio_fifo_size(aj->fifo));
    av_frame_unref(aj->frame);
    aj->frame->nb_samples = n;
    aj->frame->format = aj->enc->sample_fmt;
    aj->frame->sample_rate = aj->enc->sample_rate;
    if (av_channel_layout_copy(&aj->frame->ch_layout, &aj->enc->ch_layout) < 0 ||
        av_frame_get_buffer(aj->frame, 0) < 0)
      return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
    if (av_audio_fifo_read(aj->fifo, (void **)aj->frame->data, n) != n)
      return spn_error_set(err, SPN_EINTERNAL, "%s: audio fifo read short", out);
    aj->frame->pts = aj->next_pts;
    aj->next_pts += n;
    int r = avcodec_send_frame(aj->enc, aj->frame);
    if (r < 0)
      return av_err(err, r, out, "encoding audio");
    int32_t rc = drain_encoder(aj, out, err);
    if (rc)
      return rc;
  }
  if (flush) {
    int r = avcodec_send_frame(aj->enc, NULL);
    if (r < 0 && r != AVERROR_EOF)
      return av_err(err, r, out, "flushing the audio encoder");
    return drain_encoder(aj, out, err);
  }
  return SPN_OK;
}

/* n samples of silence into the fifo, encoded as they go. */
static int32_t silence(audio_join_t *aj, int64_t n, const char *path, spn_error_t *err) {
  uint8_t **buf = NULL;
  int chunk = 4096, ch = aj->enc->ch_layout.nb_channels;
  if (av_samples_alloc_array_and_samples(&buf, NULL, ch, chunk, aj->enc->sample_fmt, 0) < 0)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
  av_samples_set_silence(buf, 0, chunk, ch, aj->enc->sample_fmt);
  int32_t rc = SPN_OK;
  while (rc == SPN_OK && n > 0) {
    int k = n < chunk ? (int)n : chunk;
    if (av_audio_fifo_write(aj->fifo, (void **)buf, k) != k)
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    else
      rc = encode_fifo(aj, false, path, err);
    n -= k;
  }
  av_freep(&buf[0]);
  av_freep(&buf);
  return rc;
}

/* n converted samples from sample `from` on into the fifo. */
static int write_from(audio_join_t *aj, uint8_t **conv, int from, int n) {
  int ch = aj->enc->ch_layout.nb_channels, bps = av_get_bytes_per_sample(aj->enc->sample_fmt);
  int planar = av_sample_fmt_is_planar(aj->enc->sample_fmt), np = planar ? ch : 1;
  uint8_t *p[64];
  if (np > 64)
    return -1;
  for (int i = 0; i < np; i++)
    p[i] = conv[i] + (size_t)from * (size_t)bps * (size_t)(planar ? 1 : ch);
  return av_audio_fifo_write(aj->fifo, (void **)p, n);
}

static int32_t audio_encoder_open(audio_join_t *aj, const AVCodecParameters *par, const char *part,
                                  const AVOutputFormat *ofmt, spn_error_t *err) {
  const AVCodec *c = avcodec_find_encoder(par->codec_id);
  if (!c)
    return spn_error_set(err, SPN_EMEDIA, "%s: no encoder for its audio codec %s", part,
                         avcodec_get_name(par->codec_id));
  if (!(aj->enc = avcodec_alloc_context3(c)) || !(aj->frame = av_frame_alloc()))
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", part);
  aj->enc->sample_rate = par->sample_rate;
  if (av_channel_layout_copy(&aj->enc->ch_layout, &par->ch_layout) < 0)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", part);
  if (aj->enc->ch_layout.order == AV_CHANNEL_ORDER_UNSPEC)
    av_channel_layout_default(&aj->enc->ch_layout, par->ch_layout.nb_channels);
  aj->enc->sample_fmt = AV_SAMPLE_FMT_FLTP;
  const enum AVSampleFormat *fmts = NULL;
#if LIBAVCODEC_VERSION_INT >= AV_VERSION_INT(61, 13, 100)
  avcodec_get_supported_config(NULL, c, AV_CODEC_CONFIG_SAMPLE_FORMAT, 0, (const void **)&fmts, NULL);
#else
  fmts = c->sample_fmts;
#endif
  if (fmts && fmts[0] != AV_SAMPLE_FMT_NONE) {
    bool have = false;
    for (const enum AVSampleFormat *f = fmts; *f != AV_SAMPLE_FMT_NONE; f++)
      have |= *f == AV_SAMPLE_FMT_FLTP;
    if (!have)
      aj->enc->sample_fmt = fmts[0];
  }
  aj->enc->bit_rate = par->bit_rate > 0 ? par->bit_rate : 128000;
  aj->enc->time_base = (AVRational){1, par->sample_rate};
  if (ofmt->flags & AVFMT_GLOBALHEADER)
    aj->enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  int r = avcodec_open2(aj->enc, c, NULL);
  if (r < 0)
    return av_err(err, r, part, "opening the audio encoder");
  if (!(aj->fifo = av_audio_fifo_alloc(aj->enc->sample_fmt, aj->enc->ch_layout.nb_channels, 4096)))
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", part);
  return SPN_OK;
}

/* Decode `path`'s audio into the fifo: every decoded sample (want < 0), or
 * up to `want` samples, cut there (a shorter soundtrack ends where it
 * ends). On the file's video clock, as the decoder puts it (media-decode.c):
 * where the file has a video stream, sound that starts after its start
 * comes after that much silence, and sound before it is cut. */
static int32_t audio_part(audio_join_t *aj, const char *path, int64_t want, spn_error_t *err) {
  AVFormatContext *fmt;
  spn_media_input_t in;
  int32_t rc = open_input(path, &fmt, &in, err);
  if (rc)
    return rc;
  AVCodecContext *dec = NULL;
  SwrContext *swr = NULL;
  AVPacket *pkt = av_packet_alloc();
  AVFrame *fr = av_frame_alloc();
  uint8_t **conv = NULL;
  int conv_cap = 0;
  int64_t got = 0;
  int ai = first_stream(fmt, AVMEDIA_TYPE_AUDIO), vi = first_stream(fmt, AVMEDIA_TYPE_VIDEO);
  bool started = false;
  int64_t skip = 0; /* samples before the video's start, still to cut */
  if (!pkt || !fr) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  if (ai < 0) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: no audio stream, but the segments have one", path);
    goto out;
  }
  const AVCodecParameters *par = fmt->streams[ai]->codecpar;
  const AVCodec *c = avcodec_find_decoder(par->codec_id);
  int r;
  if (!c || !(dec = avcodec_alloc_context3(c)) || avcodec_parameters_to_context(dec, par) < 0) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: cannot decode its audio (%s)", path, avcodec_get_name(par->codec_id));
    goto out;
  }
  dec->pkt_timebase = fmt->streams[ai]->time_base;
  if ((r = avcodec_open2(dec, c, NULL)) < 0) {
    rc = av_err(err, r, path, "opening the audio decoder");
    goto out;
  }
  bool eof = false;
  while (rc == SPN_OK) {
    if (!eof) {
      r = av_read_frame(fmt, pkt);
      if (r == AVERROR_EOF) {
        eof = true;
        r = avcodec_send_packet(dec, NULL);
      } else if (r < 0) {
        rc = av_err(err, r, path, "reading audio");
        break;
      } else if (pkt->stream_index != ai) {
        av_packet_unref(pkt);
        continue;
      } else {
        r = avcodec_send_packet(dec, pkt);
        av_packet_unref(pkt);
      }
      if (r < 0 && r != AVERROR(EAGAIN) && r != AVERROR_EOF) {
        rc = av_err(err, r, path, "decoding audio");
        break;
      }
    }
    for (;;) {
      r = avcodec_receive_frame(dec, fr);
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF)
        break;
      if (r < 0) {
        rc = av_err(err, r, path, "decoding audio");
        break;
      }
      if (!swr) {
        if (swr_alloc_set_opts2(&swr, &aj->enc->ch_layout, aj->enc->sample_fmt, aj->enc->sample_rate,
                                &fr->ch_layout, fr->format, fr->sample_rate, 0, NULL) < 0 ||
            swr_init(swr) < 0) {
          rc = spn_error_set(err, SPN_EMEDIA, "%s: cannot convert its audio", path);
          break;
        }
      }
      if (!started) {
        started = true;
        const AVStream *as = fmt->streams[ai], *vs = vi >= 0 ? fmt->streams[vi] : NULL;
        int64_t ts = fr->best_effort_timestamp != AV_NOPTS_VALUE ? fr->best_effort_timestamp : fr->pts;
        if (vs && vs->start_time != AV_NOPTS_VALUE && ts != AV_NOPTS_VALUE) {
          int64_t lead = llrint((ts * av_q2d(as->time_base) - vs->start_time * av_q2d(vs->time_base)) *
                                aj->enc->sample_rate);
          int64_t pad = want >= 0 && lead > want ? want : lead; /* the silence, within want */
          if (lead < 0)
            skip = -lead;
          else if (pad > 0 && (rc = silence(aj, pad, path, err)))
            break;
          got += pad > 0 ? pad : 0;
        }
      }
      if (fr->nb_samples > conv_cap) {
        if (conv)
          av_freep(&conv[0]);
        av_freep(&conv);
        conv_cap = fr->nb_samples + 256;
        if (av_samples_alloc_array_and_samples(&conv, NULL, aj->enc->ch_layout.nb_channels, conv_cap,
                                               aj->enc->sample_fmt, 0) < 0) {
          conv = NULL;
          rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
          break;
        }
      }
      int n = swr_convert(swr, conv, conv_cap, (const uint8_t **)fr->extended_data, fr->nb_samples);
      av_frame_unref(fr);
      if (n < 0) {
        rc = spn_error_set(err, SPN_EMEDIA, "%s: converting audio failed", path);
        break;
      }
      int from = 0; /* the first sample kept */
      if (skip > 0) {
        from = skip < n ? (int)skip : n;
        skip -= from;
      }
      n -= from;
      if (want >= 0 && got + n > want)
        n = (int)(want - got);
      if (n > 0 && write_from(aj, conv, from, n) != n) {
        rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
        break;
      }
      got += n > 0 ? n : 0;
      if ((rc = encode_fifo(aj, false, path, err)))
        break;
    }
    if (eof && (r == AVERROR_EOF || rc))
      break;
  }
  /* What the resampler still holds. */
  while (rc == SPN_OK && swr && conv) {
    int n = swr_convert(swr, conv, conv_cap, NULL, 0);
    if (n <= 0)
      break;
    if (want >= 0 && got + n > want)
      n = (int)(want - got);
    if (n > 0 && av_audio_fifo_write(aj->fifo, (void **)conv, n) != n)
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    got += n > 0 ? n : 0;
  }
out:
  if (conv)
    av_freep(&conv[0]);
  av_freep(&conv);
  swr_free(&swr);
  avcodec_free_context(&dec);
  av_frame_free(&fr);
  av_packet_free(&pkt);
  avformat_close_input(&fmt);
  return rc;
}

/* ---- the video of the parts, one after the other ---- */

#define SEG_HOLD_MAX 32

typedef struct vjoin {
  AVFormatContext *oc;
  AVStream *ovs, *oas;
  audio_join_t *aj;
  size_t anext;      /* next audio packet to interleave */
  int64_t offset;    /* where the current part starts, in the output video time base */
  int64_t end;       /* where it ends so far */
  int64_t start;     /* the part's own first pts, same time base */
  int64_t last_dts;  /* the last video dts written */
  bool first;        /* no packet of this part written yet */
  AVPacket *held[SEG_HOLD_MAX];
  int nheld;
  const char *out;
} vjoin_t;

/* Write one video packet of the current part (timestamps already in the
 * output time base), and the audio packets due before it. */
static int32_t put_video(vjoin_t *vj, AVPacket *pkt, spn_error_t *err) {
  int64_t shift = vj->offset - vj->start;
  /* Decode order must go on increasing across the join (a part that
   * starts with reordered frames has its first dts before its start). */
  if (vj->first && pkt->dts != AV_NOPTS_VALUE && vj->last_dts != INT64_MIN && pkt->dts + shift <= vj->last_dts) {
    vj->offset += vj->last_dts + 1 - (pkt->dts + shift);
    shift = vj->offset - vj->start;
  }
  vj->first = false;
  if (pkt->pts != AV_NOPTS_VALUE)
    pkt->pts += shift;
  if (pkt->dts != AV_NOPTS_VALUE)
    pkt->dts += shift;
  int64_t pend = (pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts) + (pkt->duration > 0 ? pkt->duration : 0);
  if (pend > vj->end)
    vj->end = pend;
  double vt = (double)(pkt->dts != AV_NOPTS_VALUE ? pkt->dts : pkt->pts) * av_q2d(vj->ovs->time_base);
  int r = 0;
  while (vj->oas && vj->anext < vj->aj->out.n &&
         (double)vj->aj->out.v[vj->anext]->pts * av_q2d(vj->aj->enc->time_base) <= vt) {
    AVPacket *ap = vj->aj->out.v[vj->anext++];
    av_packet_rescale_ts(ap, vj->aj->enc->time_base, vj->oas->time_base);
    ap->stream_index = vj->oas->index;
    if ((r = av_interleaved_write_frame(vj->oc, ap)) < 0)
      return av_err(err, r, vj->out, "writing a packet");
  }
  if (pkt->dts != AV_NOPTS_VALUE)
    vj->last_dts = pkt->dts;
  pkt->stream_index = vj->ovs->index;
  pkt->pos = -1;
  if ((r = av_interleaved_write_frame(vj->oc, pkt)) < 0)
    return av_err(err, r, vj->out, "writing a packet");
  return SPN_OK;
}

/* Give the held packets decode times counted back from next_dts (the
 * first packet that had one), or their pts when none came. */
static int32_t put_held(vjoin_t *vj, int64_t next_dts, spn_error_t *err) {
  int32_t rc = SPN_OK;
  for (int i = 0; i < vj->nheld; i++) {
    AVPacket *h = vj->held[i];
    int64_t step = h->duration > 0 ? h->duration : 1;
    int64_t d = next_dts != AV_NOPTS_VALUE ? next_dts - (int64_t)(vj->nheld - i) * step : h->pts;
    h->dts = h->pts != AV_NOPTS_VALUE && d > h->pts ? h->pts : d;
    if (rc == SPN_OK)
      rc = put_video(vj, h, err);
    av_packet_free(&vj->held[i]);
  }
  vj->nheld = 0;
  return rc;
}

/* cut: the soundtrack stops where the joined video ends (bounds[n]). */
static int32_t seg_join_audio(const char *const *parts, const double *bounds, size_t n, const char *audio_src,
                              bool cut, const char *out, spn_error_t *err) {
  if (n == 0)
    return spn_error_set(err, SPN_EINVAL, "%s: nothing to join", out);
  AVFormatContext *oc = NULL, *ic = NULL;
  spn_media_input_t in; /* ic's opener, one part after another */
  audio_join_t aj = {0};
  AVPacket *pkt = av_packet_alloc();
  AVStream *ovs = NULL, *oas = NULL;
  uint8_t *extra = NULL;
  int extra_size = 0;
  int32_t rc = SPN_OK;
  int r;
  if (!pkt)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
  if ((r = avformat_alloc_output_context2(&oc, NULL, NULL, out)) < 0) {
    rc = av_err(err, r, out, "creating the muxer");
    goto out;
  }
  /* Part 0 fixes the streams. */
  if ((rc = open_input(parts[0], &ic, &in, err)))
    goto out;
  int vi = first_stream(ic, AVMEDIA_TYPE_VIDEO), ai = first_stream(ic, AVMEDIA_TYPE_AUDIO);
  if (vi < 0) {
    rc = spn_error_set(err, SPN_EMEDIA, "%s: segment 0 has no video stream", parts[0]);
    goto out;
  }
  AVCodecParameters *vpar = ic->streams[vi]->codecpar;
  if (!(ovs = avformat_new_stream(oc, NULL)) || avcodec_parameters_copy(ovs->codecpar, vpar) < 0) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
    goto out;
  }
  ovs->codecpar->codec_tag = 0;
  ovs->time_base = ic->streams[vi]->time_base;
  ovs->avg_frame_rate = ic->streams[vi]->avg_frame_rate;
  av_dict_copy(&ovs->metadata, ic->streams[vi]->metadata, 0);
  if (vpar->extradata_size > 0) {
    if (!(extra = av_memdup(vpar->extradata, (size_t)vpar->extradata_size))) {
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
      goto out;
    }
    extra_size = vpar->extradata_size;
  }
  if (ai >= 0) {
    if ((rc = audio_encoder_open(&aj, ic->streams[ai]->codecpar, parts[0], oc->oformat, err)))
      goto out;
    if (!(oas = avformat_new_stream(oc, NULL)) || avcodec_parameters_from_context(oas->codecpar, aj.enc) < 0) {
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
      goto out;
    }
    oas->time_base = aj.enc->time_base;
    /* The input's soundtrack, whole, encoded once (the file header says
     * why); from the first cut to the end of its audio, as the job would
     * have had it unsegmented. */
    if (!audio_src) {
      rc = spn_error_set(err, SPN_EMEDIA, "%s: the segments have audio but the job names no input to take it from",
                         parts[0]);
      goto out;
    }
    int64_t skip = llrint(bounds[0] * aj.enc->sample_rate);
    if (skip > 0) {
      rc = spn_error_set(err, SPN_EINVAL, "%s: a segmented job starts at 0 s, not %.3f s", out, bounds[0]);
      goto out;
    }
    rc = audio_part(&aj, audio_src, cut ? llrint((bounds[n] - bounds[0]) * aj.enc->sample_rate) : -1, err);
    if (rc == SPN_OK)
      rc = encode_fifo(&aj, true, out, err);
    if (rc)
      goto out;
  }
  avformat_close_input(&ic);
  if (!(oc->oformat->flags & AVFMT_NOFILE) && (r = avio_open(&oc->pb, out, AVIO_FLAG_WRITE)) < 0) {
    rc = av_err(err, r, out, "opening for writing");
    goto out;
  }
  if ((r = avformat_write_header(oc, NULL)) < 0) {
    rc = av_err(err, r, out, "writing the header");
    goto out;
  }
  /* Video, part after part, with the audio packets interleaved by time. */
  vjoin_t vj = {.oc = oc, .ovs = ovs, .oas = oas, .aj = &aj, .last_dts = INT64_MIN, .out = out};
  for (size_t k = 0; k < n && rc == SPN_OK; k++) {
    if ((rc = open_input(parts[k], &ic, &in, err)))
      break;
    int pvi = first_stream(ic, AVMEDIA_TYPE_VIDEO);
    if (pvi < 0) {
      rc = spn_error_set(err, SPN_EMEDIA, "%s: segment %zu has no video stream", parts[k], k);
      break;
    }
    const AVCodecParameters *p = ic->streams[pvi]->codecpar;
    if (p->codec_id != ovs->codecpar->codec_id || p->width != ovs->codecpar->width ||
        p->height != ovs->codecpar->height || p->extradata_size != extra_size ||
        (extra_size && memcmp(p->extradata, extra, (size_t)extra_size) != 0)) {
      rc = spn_error_set(err, SPN_EMEDIA,
                         "%s: segment %zu was encoded differently from segment 0 (%s %dx%d; its codec headers "
                         "must match to join without re-encoding)",
                         parts[k], k, avcodec_get_name(p->codec_id), p->width, p->height);
      break;
    }
    AVRational itb = ic->streams[pvi]->time_base;
    int64_t start = ic->streams[pvi]->start_time;
    bool have_start = start != AV_NOPTS_VALUE;
    /* Part k starts where its segment started in the input (its cut
     * time), which is also where the previous part's last frame ends; the
     * measured end of the previous part is the fallback when the cut
     * times are not increasing. */
    if (bounds[k] > 0 && (k == 0 || bounds[k] > bounds[k - 1])) {
      int64_t at = llrint(bounds[k] / av_q2d(ovs->time_base));
      if (at >= vj.offset || k == 0)
        vj.offset = at;
    }
    vj.end = vj.offset;
    vj.first = true;
    while ((r = av_read_frame(ic, pkt)) >= 0) {
      if (pkt->stream_index != pvi) {
        av_packet_unref(pkt);
        continue;
      }
      if (!have_start) {
        start = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
        have_start = true;
      }
      av_packet_rescale_ts(pkt, itb, ovs->time_base);
      /* Matroska stores no decode time for the first reordered frames:
       * hold them until a packet brings one, then count back from it. */
      if (pkt->dts == AV_NOPTS_VALUE && vj.nheld < SEG_HOLD_MAX) {
        if (!(vj.held[vj.nheld] = av_packet_clone(pkt))) {
          rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", out);
          break;
        }
        vj.nheld++;
        av_packet_unref(pkt);
        continue;
      }
      vj.start = av_rescale_q(start, itb, ovs->time_base);
      if ((rc = put_held(&vj, pkt->dts, err)) || (rc = put_video(&vj, pkt, err)))
        break;
    }
    vj.start = av_rescale_q(start, itb, ovs->time_base);
    if (rc == SPN_OK && r == AVERROR_EOF)
      rc = put_held(&vj, AV_NOPTS_VALUE, err);
    for (int i = 0; i < vj.nheld; i++)
      av_packet_free(&vj.held[i]);
    vj.nheld = 0;
    if (rc == SPN_OK && r != AVERROR_EOF)
      rc = av_err(err, r, parts[k], "reading packets");
    avformat_close_input(&ic);
    vj.offset = vj.end;
  }
  while (rc == SPN_OK && oas && vj.anext < aj.out.n) {
    AVPacket *ap = aj.out.v[vj.anext++];
    av_packet_rescale_ts(ap, aj.enc->time_base, oas->time_base);
    ap->stream_index = oas->index;
    if ((r = av_interleaved_write_frame(oc, ap)) < 0)
      rc = av_err(err, r, out, "writing a packet");
  }
  if (rc == SPN_OK && (r = av_write_trailer(oc)) < 0)
    rc = av_err(err, r, out, "writing the trailer");
out:
  avformat_close_input(&ic);
  if (oc) {
    if (oc->pb && !(oc->oformat->flags & AVFMT_NOFILE))
      avio_closep(&oc->pb);
    avformat_free_context(oc);
  }
  av_free(extra);
  apkts_free(&aj.out);
  av_audio_fifo_free(aj.fifo);
  av_frame_free(&aj.frame);
  avcodec_free_context(&aj.enc);
  av_packet_free(&pkt);
  return rc;
}

/* stage-encode.c's kinds: both write the per-job "path". */
static const char *const encoder_kinds[] = {"encode", "encode_av", NULL};

static int32_t seg_join(const char *const *parts, const double *bounds, size_t n, const char *audio_src,
                        const char *out, spn_error_t *err) {
  return seg_join_audio(parts, bounds, n, audio_src, false, out, err);
}

static int32_t seg_join_cut(const char *const *parts, const double *bounds, size_t n, const char *audio_src,
                            const char *out, spn_error_t *err) {
  return seg_join_audio(parts, bounds, n, audio_src, true, out, err);
}

static const spn_segment_api_t segment_api = {
    .struct_size = sizeof(spn_segment_api_t),
    .keyframes = seg_keyframes,
    .join = seg_join,
    .join_cut = seg_join_cut,
    .check_output = spn_encoder_check_container,
    .encoders = encoder_kinds,
};

SPN_PLUGIN_EXPORT const spn_segment_api_t *spindle_segment_api(void) { return &segment_api; }
