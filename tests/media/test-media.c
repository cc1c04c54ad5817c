/* test-media.c — decode and encode with FFmpeg on clips generated here.
 *
 * Clips are made with the ffmpeg CLI (testsrc2 + sine) in a temporary
 * folder at start-up; the test skips (77) when the CLI is missing. Checks:
 * round trip keeps frame count, size, monotonic pts and A/V duration;
 * segments; rotation metadata; odd sizes; audio-file muxing; bad inputs
 * give errors naming the file; a failed or abandoned encode leaves no file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include <libavutil/buffer.h>
#include <libavutil/hwcontext.h>
#include <libavutil/log.h>

#include "media-decode.h"
#include "media-encode.h"

static char dir[256];

static const char *p(const char *name) {
  static char buf[8][512];
  static int k;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static int sh(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  return system(cmd);
}

typedef struct {
  int64_t frames, audio_samples;
  int32_t w, h, rate, channels;
  double first_pts, last_pts;
  int monotonic;
} scan_t;

static int32_t scan(const char *path, const spn_decode_opts_t *o, scan_t *s, spn_error_t *err) {
  spn_decoder_t *d;
  memset(s, 0, sizeof *s);
  s->monotonic = 1;
  int32_t rc = spn_decoder_new(path, o, &d, err);
  if (rc)
    return rc;
  s->w = spn_decoder_info(d)->width;
  s->h = spn_decoder_info(d)->height;
  double prev = -1e9;
  spn_media_item_t it;
  while ((rc = spn_decoder_next(d, &it, err)) == SPN_OK) {
    if (it.kind == SPN_MEDIA_VIDEO) {
      assert_int_equal(it.image.width, s->w);
      assert_int_equal(it.image.height, s->h);
      assert_int_equal(it.index, s->frames);
      if (s->frames == 0)
        s->first_pts = it.pts_sec;
      if (it.pts_sec <= prev)
        s->monotonic = 0;
      prev = s->last_pts = it.pts_sec;
      s->frames++;
    } else {
      s->audio_samples += it.n_samples;
      s->rate = it.rate;
      s->channels = it.channels;
    }
    spn_media_item_release(&it);
  }
  spn_decoder_free(d);
  return rc == SPN_EOS ? SPN_OK : rc;
}

static void round_trip_keeps_frames_and_sync(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.audio_rate = 16000;
  o.audio_channels = 1;
  spn_decoder_t *d;
  assert_int_equal(spn_decoder_new(p("clip.mp4"), &o, &d, &err), SPN_OK);
  const spn_decode_info_t *in = spn_decoder_info(d);
  assert_int_equal(in->width, 160);
  assert_int_equal(in->height, 120);
  assert_int_equal(in->fps_num / in->fps_den, 25);
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.audio_rate = 16000;
  eo.audio_channels = 1;
  eo.preset = "ultrafast";
  spn_encoder_t *e;
  assert_int_equal(spn_encoder_new(p("rt.mp4"), 160, 120, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  spn_media_item_t it;
  int32_t rc;
  int64_t nv = 0;
  while ((rc = spn_decoder_next(d, &it, &err)) == SPN_OK) {
    if (it.kind == SPN_MEDIA_VIDEO) {
      assert_int_equal(spn_encoder_write_video(e, &it.image, it.pts, it.tb_num, it.tb_den, &err), SPN_OK);
      nv++;
    } else {
      assert_int_equal(spn_encoder_write_audio(e, it.samples, it.n_samples, &err), SPN_OK);
    }
    spn_media_item_release(&it);
  }
  assert_int_equal(rc, SPN_EOS);
  assert_int_equal(nv, 50);
  assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
  spn_encoder_free(e);
  spn_decoder_free(d);

  scan_t s;
  assert_int_equal(scan(p("rt.mp4"), &o, &s, &err), SPN_OK);
  double vdur = s.frames / 25.0, adur = (double)s.audio_samples / s.rate;
  printf("# round trip: %lld frames %dx%d, pts %.3f..%.3f, video %.3f s, audio %.3f s (|diff| %.3f s)\n",
         (long long)s.frames, s.w, s.h, s.first_pts, s.last_pts, vdur, adur, fabs(vdur - adur));
  assert_int_equal(s.frames, 50);
  assert_int_equal(s.w, 160);
  assert_int_equal(s.h, 120);
  assert_true(s.monotonic);
  assert_true(fabs(s.first_pts) < 1e-6);
  assert_true(fabs(s.last_pts - 49 / 25.0) < 1e-3);
  assert_int_equal(s.rate, 16000);
  assert_int_equal(s.channels, 1);
  assert_true(fabs(vdur - adur) <= 1.0 / 25.0);
}

static void formats_segment_and_odd_sizes(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.start = 0.52;
  o.duration = 1.0;
  o.want_audio = 1;
  scan_t s;
  assert_int_equal(scan(p("clip.mp4"), &o, &s, &err), SPN_OK);
  printf("# segment 0.52+1.0: %lld frames, first %.3f, last %.3f, audio %.4f s\n", (long long)s.frames,
         s.first_pts, s.last_pts, (double)s.audio_samples / s.rate);
  assert_int_equal(s.frames, 25);               /* 0.52 .. 1.48 */
  assert_true(fabs(s.first_pts - 0.52) < 1e-6);
  assert_true(fabs(s.last_pts - 1.48) < 1e-6);
  assert_true(fabs((double)s.audio_samples / s.rate - 1.0) < 2.0 / s.rate);
  /* odd size, each pixel format */
  const int32_t fmts[] = {SPN_PIXFMT_RGB24, SPN_PIXFMT_BGR24, SPN_PIXFMT_NV12, SPN_PIXFMT_YUV420P,
                          SPN_PIXFMT_BGRF32P};
  for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
    spn_decode_opts_t oo = SPN_DECODE_OPTS_INIT;
    oo.pixfmt = fmts[i];
    oo.want_audio = 0;
    spn_decoder_t *d;
    assert_int_equal(spn_decoder_new(p("odd.mkv"), &oo, &d, &err), SPN_OK);
    spn_media_item_t it;
    assert_int_equal(spn_decoder_next(d, &it, &err), SPN_OK);
    assert_int_equal(it.image.width, 63);
    assert_int_equal(it.image.height, 35);
    assert_int_equal(it.image.format, fmts[i]);
    /* testsrc2 is not black: the frame carries content */
    if (fmts[i] == SPN_PIXFMT_BGRF32P) {
      float mx = 0;
      for (int y = 0; y < 35; y++)
        for (int x = 0; x < 63; x++)
          mx = fmaxf(mx, ((float *)(it.image.data[1] + y * it.image.stride[1]))[x]);
      assert_true(mx > 100.0f && mx <= 255.0f);
    }
    spn_media_item_release(&it);
    spn_decoder_free(d);
  }
  /* encoding odd frames crops to even */
  spn_decode_opts_t oo = SPN_DECODE_OPTS_INIT;
  oo.want_audio = 0;
  spn_decoder_t *d;
  spn_encoder_t *e;
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.preset = "ultrafast";
  assert_int_equal(spn_decoder_new(p("odd.mkv"), &oo, &d, &err), SPN_OK);
  assert_int_equal(spn_encoder_new(p("odd-out.mkv"), 63, 35, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  spn_media_item_t it;
  int32_t rc;
  while ((rc = spn_decoder_next(d, &it, &err)) == SPN_OK) {
    assert_int_equal(spn_encoder_write_video(e, &it.image, it.pts, it.tb_num, it.tb_den, &err), SPN_OK);
    spn_media_item_release(&it);
  }
  assert_int_equal(rc, SPN_EOS);
  assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
  spn_encoder_free(e);
  spn_decoder_free(d);
  assert_int_equal(scan(p("odd-out.mkv"), &oo, &s, &err), SPN_OK);
  assert_int_equal(s.w, 62);
  assert_int_equal(s.h, 34);
  assert_int_equal(s.frames, 10);
}

static void rotation_metadata_turns_frames(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  spn_decoder_t *d;
  /* write a 64x32 clip whose display matrix says "turn 90 degrees clockwise"
   * (the ffmpeg 5 CLI no longer writes one); ffprobe confirms the matrix */
  spn_encoder_t *e;
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.preset = "ultrafast";
  eo.rotation = 90;
  assert_int_equal(spn_decoder_new(p("rot-src.mkv"), &o, &d, &err), SPN_OK);
  assert_int_equal(spn_encoder_new(p("rot.mp4"), 64, 32, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  spn_media_item_t it0;
  while (spn_decoder_next(d, &it0, &err) == SPN_OK) {
    assert_int_equal(spn_encoder_write_video(e, &it0.image, it0.pts, it0.tb_num, it0.tb_den, &err), SPN_OK);
    spn_media_item_release(&it0);
  }
  assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
  spn_encoder_free(e);
  spn_decoder_free(d);
  assert_int_equal(sh("ffprobe -v error -show_streams '%s' | grep -q 'rotation=-90'", p("rot.mp4")), 0);
  assert_int_equal(spn_decoder_new(p("rot.mp4"), &o, &d, &err), SPN_OK);
  const spn_decode_info_t *in = spn_decoder_info(d);
  printf("# rotation %d, %dx%d\n", in->rotation, in->width, in->height);
  assert_int_equal(in->rotation, 90);
  assert_int_equal(in->width, 32);
  assert_int_equal(in->height, 64);
  spn_media_item_t it;
  assert_int_equal(spn_decoder_next(d, &it, &err), SPN_OK);
  assert_int_equal(it.image.width, 32);
  assert_int_equal(it.image.height, 64);
  spn_media_item_release(&it);
  spn_decoder_free(d);
  o.autorotate = 0;
  assert_int_equal(spn_decoder_new(p("rot.mp4"), &o, &d, &err), SPN_OK);
  assert_int_equal(spn_decoder_info(d)->width, 64);
  spn_decoder_free(d);
}

static void audio_file_is_muxed(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  spn_decoder_t *d;
  spn_encoder_t *e;
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.preset = "ultrafast";
  eo.audio_path = p("speech.wav");
  assert_int_equal(spn_decoder_new(p("clip.mp4"), &o, &d, &err), SPN_OK);
  assert_int_equal(spn_encoder_new(p("muxed.mp4"), 160, 120, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  spn_media_item_t it;
  int32_t rc;
  while ((rc = spn_decoder_next(d, &it, &err)) == SPN_OK) {
    assert_int_equal(spn_encoder_write_video(e, &it.image, it.pts, it.tb_num, it.tb_den, &err), SPN_OK);
    spn_media_item_release(&it);
  }
  assert_int_equal(spn_encoder_write_audio(e, NULL, 0, &err), SPN_ESTATE);
  assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
  spn_encoder_free(e);
  spn_decoder_free(d);
  scan_t s;
  o.want_audio = 1;
  assert_int_equal(scan(p("muxed.mp4"), &o, &s, &err), SPN_OK);
  printf("# muxed audio file: %lld frames, audio %.3f s at %d Hz\n", (long long)s.frames,
         (double)s.audio_samples / s.rate, s.rate);
  assert_int_equal(s.frames, 50);
  assert_int_equal(s.rate, 22050);
  assert_true(fabs((double)s.audio_samples / s.rate - 2.0) <= 1.0 / 25.0);
  /* a soundtrack without sound (a silent video): refused, naming it, unless
   * audio_optional, which writes the video alone */
  eo.audio_path = p("full.mp4");
  e = NULL;
  assert_int_equal(spn_encoder_new(p("silent.mp4"), 160, 120, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_EMEDIA);
  printf("# %s\n", err.msg);
  assert_null(e);
  assert_memory_equal(err.msg, p("full.mp4"), strlen(p("full.mp4")));
  assert_non_null(strstr(err.msg, "no audio stream"));
  eo.audio_optional = 1;
  assert_int_equal(spn_encoder_new(p("silent.mp4"), 160, 120, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  assert_false(spn_encoder_has_audio(e));
  assert_int_equal(spn_decoder_new(p("clip.mp4"), NULL, &d, &err), SPN_OK);
  for (int i = 0; i < 10 && (rc = spn_decoder_next(d, &it, &err)) == SPN_OK; i++) {
    if (it.kind == SPN_MEDIA_VIDEO)
      assert_int_equal(spn_encoder_write_video(e, &it.image, it.pts, it.tb_num, it.tb_den, &err), SPN_OK);
    spn_media_item_release(&it);
  }
  assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
  spn_encoder_free(e);
  spn_decoder_free(d);
  assert_int_equal(scan(p("silent.mp4"), &o, &s, &err), SPN_OK);
  assert_true(s.frames > 0);
  assert_int_equal(s.audio_samples, 0);
  /* the opt does not hide a soundtrack that is not there at all */
  eo.audio_path = p("missing.wav");
  assert_int_equal(spn_encoder_new(p("silent.mp4"), 160, 120, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_ENOENT);
}

/* The audio of `path` on the video's clock (mono, at its rate): n samples
 * from the first; the first item's pts; the total. */
static void clock_audio(const char *path, int want_video, double duration, float *first, size_t n, double *pts0,
                        int64_t *total) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_video = want_video;
  o.duration = duration;
  spn_decoder_t *d;
  assert_int_equal(spn_decoder_new(path, &o, &d, &err), SPN_OK);
  spn_media_item_t it;
  int32_t rc;
  *total = 0;
  *pts0 = -1;
  while ((rc = spn_decoder_next(d, &it, &err)) == SPN_OK) {
    if (it.kind == SPN_MEDIA_AUDIO) {
      assert_int_equal(it.channels, 1);
      if (*pts0 < 0)
        *pts0 = it.pts_sec;
      assert_int_equal(it.pts, *total); /* contiguous from the video's start */
      for (int64_t i = 0; i < it.n_samples && *total + i < (int64_t)n; i++)
        first[*total + i] = it.samples[i];
      *total += it.n_samples;
    }
    spn_media_item_release(&it);
  }
  assert_int_equal(rc, SPN_EOS);
  spn_decoder_free(d);
}

/* Audio and video play on one clock, the video's, as a player lines them
 * up: sound that starts 0.5 s after the first picture comes after 0.5 s of
 * silence; sound that starts 0.3 s before it is cut there; whether or not
 * the video is decoded (an encoder's soundtrack reads the audio alone). The
 * sound is a constant 0.5 (PCM at 16 kHz: no resampling, no priming). */
static void audio_on_the_video_clock(void **state) {
  (void)state;
  static float a[16000];
  double pts0;
  int64_t total;
  for (int want_video = 1; want_video >= 0; want_video--) {
    memset(a, 0, sizeof a);
    clock_audio(p("late.mkv"), want_video, 0, a, 16000, &pts0, &total);
    printf("# late.mkv (video %d): first audio at %.3f s, %lld samples, a[7999] %.3f, a[8000] %.3f\n", want_video,
           pts0, (long long)total, a[7999], a[8000]);
    assert_true(pts0 == 0.0);
    for (int i = 0; i < 8000; i++)
      assert_true(a[i] == 0.0f);
    assert_true(fabsf(a[8000] - 0.5f) < 1e-3 && fabsf(a[15999] - 0.5f) < 1e-3);
    assert_true(llabs(total - 2 * 16000 - 8000) <= 1); /* the 2 s sound ends at 2.5 s */
    clock_audio(p("early.mkv"), want_video, 0, a, 16000, &pts0, &total);
    printf("# early.mkv (video %d): first audio at %.3f s, %lld samples, a[0] %.3f\n", want_video, pts0,
           (long long)total, a[0]);
    assert_true(pts0 == 0.0);
    assert_true(fabsf(a[0] - 0.5f) < 1e-3); /* the sound from 0.3 s of its own, at the first picture */
    /* 2 s less the 0.3 s before the first picture (Matroska's muxer puts it
     * at 0.30 to 0.32 s: its clock counts milliseconds) */
    assert_true(total >= 2 * 16000 - 16000 * 32 / 100 && total <= 2 * 16000 - 4800);
    /* a segment that ends before the sound starts is silent, not soundless */
    memset(a, 0xff, sizeof a);
    clock_audio(p("late.mkv"), want_video, 0.3, a, 16000, &pts0, &total);
    printf("# late.mkv, 0.3 s (video %d): %lld samples\n", want_video, (long long)total);
    assert_int_equal(total, 4800);
    for (int i = 0; i < 4800; i++)
      assert_true(a[i] == 0.0f);
  }
}

static void bad_inputs_name_the_file(void **state) {
  (void)state;
  const struct { const char *file, *expect; int32_t code; } cases[] = {
      {"missing.mp4", "no such file or directory", SPN_ENOENT},
      {"notes.bin", "invalid data found when processing input", SPN_EMEDIA},
      {"truncated.mp4", "invalid data found when processing input", SPN_EMEDIA},
      {"audio-only.m4a", "no video stream", SPN_EMEDIA},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    spn_decoder_t *d = NULL;
    const char *path = p(cases[i].file);
    int32_t rc = spn_decoder_new(path, NULL, &d, &err);
    printf("# %s -> %s\n", cases[i].file, err.msg);
    assert_int_equal(rc, cases[i].code);
    assert_null(d);
    assert_memory_equal(err.msg, path, strlen(path));
    assert_non_null(strstr(err.msg, cases[i].expect));
  }
  /* a named pipe (opening it would block until a writer comes, out of reach
   * of a cancel) and a folder are refused before FFmpeg opens them */
  const char *fifo = p("pipe.mp4");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  const struct { const char *path, *expect; } odd[] = {{fifo, ": a named pipe"}, {dir, ": a folder"}};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    spn_error_t e = SPN_ERROR_INIT;
    spn_decoder_t *d = NULL;
    assert_int_equal(spn_decoder_new(odd[i].path, NULL, &d, &e), SPN_EINVAL);
    printf("# %s\n", e.msg);
    assert_null(d);
    assert_memory_equal(e.msg, odd[i].path, strlen(odd[i].path));
    assert_non_null(strstr(e.msg, odd[i].expect));
  }
  unlink(fifo);
  /* a file whose tail is cut after the header decodes what is there and ends */
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  scan_t s;
  int32_t rc = scan(p("cut.mkv"), &o, &s, &err);
  printf("# cut.mkv: rc %d, %lld frames (%s)\n", rc, (long long)s.frames, err.msg);
  assert_true(rc == SPN_OK || strncmp(err.msg, p("cut.mkv"), strlen(p("cut.mkv"))) == 0);
  assert_true(s.frames > 0 && s.frames < 50);
}

/* A local input is read as the one file it is: a playlist, a concat list
 * (whatever its name) or an image pattern that would read other files is
 * refused, naming its format or the file it asked for, before anything else
 * is opened; follow_references lets them through. (A job's input is checked
 * against the job service's roots by its path: without this, a playlist
 * inside the roots reads files outside them, or URLs.) */
static void inputs_are_read_as_one_file(void **state) {
  (void)state;
  const struct { const char *file, *expect; int follows; } cases[] = {
      {"playlist.m3u8", ": is a file of FFmpeg's \"hls\" format", 50},
      {"remote.m3u8", ": is a file of FFmpeg's \"hls\" format", -1},
      /* a local path with "://" inside is no URL */
      {"x://playlist.m3u8", ": is a file of FFmpeg's \"hls\" format", -1},
      {"list.ffconcat", ": is a file of FFmpeg's \"concat\" format", 50},
      {"disguised.mp4", ": is a file of FFmpeg's \"concat\" format", 50},
      {"seq%d.png", ": refers to another file or URL (", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
    o.want_audio = 0;
    spn_decoder_t *d = NULL;
    const char *path = p(cases[i].file);
    int32_t rc = spn_decoder_new(path, &o, &d, &err);
    printf("# %s -> %s\n", cases[i].file, err.msg);
    assert_int_equal(rc, SPN_EMEDIA);
    assert_null(d);
    assert_memory_equal(err.msg, path, strlen(path));
    assert_non_null(strstr(err.msg, cases[i].expect));
    assert_non_null(strstr(err.msg, "follow_references"));
    if (cases[i].follows < 0)
      continue; /* a URL: nothing to reach here */
    o.follow_references = 1;
    scan_t sc;
    assert_int_equal(scan(path, &o, &sc, &err), SPN_OK);
    assert_int_equal(sc.frames, cases[i].follows);
  }
  /* the pattern's refusal names the file it asked for */
  spn_error_t err = SPN_ERROR_INIT;
  spn_decoder_t *d = NULL;
  assert_int_equal(spn_decoder_new(p("seq%d.png"), NULL, &d, &err), SPN_EMEDIA);
  assert_non_null(strstr(err.msg, p("seq1.png")));
  /* one picture is read (FFmpeg's image demuxer opens the file itself,
   * again, which is the file named) */
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  scan_t sc;
  assert_int_equal(scan(p("still.png"), &o, &sc, &err), SPN_OK);
  assert_int_equal(sc.frames, 1);
  assert_int_equal(sc.w, 64);
}

/* device_frames (a decode stage placed on a GPU) where NVDEC is not used:
 * the frames come in host memory exactly as without it, and the decoder
 * says why, for the stage's one log line (software decode + upload). */
static void device_frames_fall_back_to_host_frames_saying_why(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t plain = SPN_DECODE_OPTS_INIT, dev = SPN_DECODE_OPTS_INIT;
  plain.want_audio = dev.want_audio = 0;
  dev.device_frames = 1; /* hwaccel none */
  spn_decoder_t *a = NULL, *b = NULL;
  assert_int_equal(spn_decoder_new(p("clip.mp4"), &plain, &a, &err), SPN_OK);
  assert_int_equal(spn_decoder_new(p("clip.mp4"), &dev, &b, &err), SPN_OK);
  assert_string_equal(spn_decoder_info(b)->host_frames_why, "hwaccel is none");
  int frames = 0;
  spn_media_item_t x, y;
  while (spn_decoder_next(a, &x, &err) == SPN_OK) {
    assert_int_equal(spn_decoder_next(b, &y, &err), SPN_OK);
    assert_null(y.hw_frame);
    assert_int_equal(x.pts, y.pts);
    for (int32_t r = 0; r < x.image.height; r++)
      assert_memory_equal(x.image.data[0] + r * x.image.stride[0], y.image.data[0] + r * y.image.stride[0],
                          (size_t)x.image.width * 3);
    spn_media_item_release(&x);
    spn_media_item_release(&y);
    frames++;
  }
  assert_int_equal(frames, 50);
  assert_int_equal(spn_decoder_next(b, &y, &err), SPN_EOS);
  spn_decoder_free(a);
  spn_decoder_free(b);
  /* auto without a usable CUDA device: host frames, and a reason */
  dev.hwaccel = SPN_HWACCEL_AUTO;
  assert_int_equal(spn_decoder_new(p("clip.mp4"), &dev, &b, &err), SPN_OK);
  assert_int_equal(spn_decoder_next(b, &y, &err), SPN_OK);
  printf("# device_frames, hwaccel auto: %s\n",
         y.hw_frame ? "NVDEC frame on the device" : spn_decoder_info(b)->host_frames_why);
  if (!y.hw_frame) {
    assert_non_null(spn_decoder_info(b)->host_frames_why);
  } else {
    assert_int_equal(y.image.format, SPN_PIXFMT_NV12);
  }
  spn_media_item_release(&y);
  spn_decoder_free(b);
}

static void hwaccel_falls_back_or_names_the_file(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  o.hwaccel = SPN_HWACCEL_AUTO;
  scan_t s;
  /* auto: CUDA where it works, software otherwise; the frames are the same */
  assert_int_equal(scan(p("clip.mp4"), &o, &s, &err), SPN_OK);
  assert_int_equal(s.frames, 50);
  assert_int_equal(s.w, 160);
  /* cuda: decodes on the device, or fails naming the file and the codec */
  o.hwaccel = SPN_HWACCEL_CUDA;
  spn_decoder_t *d = NULL;
  int32_t rc = spn_decoder_new(p("clip.mp4"), &o, &d, &err);
  printf("# hwaccel=cuda: %s\n", rc ? err.msg : "CUDA decoding active");
  if (rc) {
    assert_int_equal(rc, SPN_EDEVICE);
    assert_non_null(strstr(err.msg, "clip.mp4: CUDA decoding of h264 is not available"));
  } else {
    assert_true(spn_decoder_info(d)->hwaccel_active);
    spn_decoder_free(d);
    assert_int_equal(scan(p("clip.mp4"), &o, &s, &err), SPN_OK);
    assert_int_equal(s.frames, 50);
  }
}

static int dir_has_prefix(const char *prefix) {
  DIR *dd = opendir(dir);
  struct dirent *de;
  int found = 0;
  while ((de = readdir(dd)))
    if (strncmp(de->d_name, prefix, strlen(prefix)) == 0)
      found = 1;
  closedir(dd);
  return found;
}

static void failed_encode_leaves_no_file(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_encoder_t *e;
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.preset = "ultrafast";
  spn_image_t img;
  assert_int_equal(spn_image_alloc(&img, 64, 48, SPN_PIXFMT_RGB24, &err), SPN_OK);
  /* abandoned after a frame */
  assert_int_equal(spn_encoder_new(p("abandoned.mp4"), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  assert_true(dir_has_prefix("abandoned.mp4.")); /* the temporary file exists meanwhile */
  assert_int_equal(spn_encoder_write_video(e, &img, 0, 1, 25, &err), SPN_OK);
  spn_encoder_free(e);
  assert_false(dir_has_prefix("abandoned.mp4"));
  /* finish fails (no frames) */
  assert_int_equal(spn_encoder_new(p("empty.mp4"), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  assert_int_equal(spn_encoder_finish(e, &err), SPN_EMEDIA);
  assert_non_null(strstr(err.msg, "empty.mp4: no video frames"));
  spn_encoder_free(e);
  assert_false(dir_has_prefix("empty.mp4"));
  /* a wrong frame fails the encode; nothing at the target */
  assert_int_equal(spn_encoder_new(p("wrong.mkv"), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  spn_image_t small;
  assert_int_equal(spn_image_alloc(&small, 32, 48, SPN_PIXFMT_RGB24, &err), SPN_OK);
  assert_int_equal(spn_encoder_write_video(e, &small, 0, 1, 25, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "wrong.mkv: frame is 32x48"));
  spn_encoder_free(e);
  assert_false(dir_has_prefix("wrong.mkv"));
  /* unknown container, unknown codec */
  assert_int_equal(spn_encoder_new(p("x.nosuchext"), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "x.nosuchext: cannot pick a container"));
  eo.codec = "no_such_encoder";
  assert_int_equal(spn_encoder_new(p("y.mp4"), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_EUNSUPPORTED);
  assert_false(dir_has_prefix("y.mp4"));
  /* the same path errors before any encoder: spn_encoder_check_path leaves
   * nothing behind either way */
  assert_int_equal(spn_encoder_check_path(p("x.nosuchext"), &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "x.nosuchext: cannot pick a container"));
  assert_int_equal(spn_encoder_check_path(p("no-such-dir/z.mp4"), &err), SPN_EIO);
  assert_non_null(strstr(err.msg, "no-such-dir/z.mp4: cannot create a temporary file beside it: No such file"));
  assert_int_equal(spn_encoder_check_path(p("z.mp4"), &err), SPN_OK);
  assert_false(dir_has_prefix("z.mp4"));
  assert_int_equal(spn_encoder_check_path("", &err), SPN_EINVAL);
  /* the codec the stage checks when it is created */
  assert_int_equal(spn_encoder_check_codec("no_such_encoder", &err), SPN_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "video encoder 'no_such_encoder' is not available in this FFmpeg"));
  assert_int_equal(spn_encoder_check_codec("aac", &err), SPN_EUNSUPPORTED);
  assert_string_equal(err.msg, "'aac' is not a video encoder");
  assert_int_equal(spn_encoder_check_codec("libx264", &err), SPN_OK);
  assert_int_equal(spn_encoder_check_codec("auto", &err), SPN_OK);
  spn_image_release(&img);
  spn_image_release(&small);
}

/* What the encode stage relies on without a GPU: which NVENC encoder a
 * codec maps to, one preset name serving libx264 too (p1 .. p7 map back),
 * and the device-frame calls refused on an encoder opened for host frames
 * (and device frames that are not nv12 refused at open). */
static void device_frame_calls_and_presets(void **state) {
  (void)state;
  assert_string_equal(spn_encoder_nvenc_for("libx264"), "h264_nvenc");
  assert_string_equal(spn_encoder_nvenc_for("auto"), "h264_nvenc");
  assert_string_equal(spn_encoder_nvenc_for("h264_nvenc"), "h264_nvenc");
  assert_string_equal(spn_encoder_nvenc_for("libx265"), "hevc_nvenc");
  assert_string_equal(spn_encoder_nvenc_for("hevc_nvenc"), "hevc_nvenc");
  assert_null(spn_encoder_nvenc_for("mpeg4"));
  spn_error_t err = SPN_ERROR_INIT;
  spn_encoder_t *e = NULL;
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.preset = "p1"; /* NVENC's name: libx264 gets ultrafast */
  spn_image_t img;
  assert_int_equal(spn_image_alloc(&img, 64, 48, SPN_PIXFMT_RGB24, &err), SPN_OK);
  assert_int_equal(spn_encoder_new(p("preset.mp4"), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
  assert_string_equal(spn_encoder_codec_name(e), "libx264");
  spn_image_t nv12;
  assert_int_equal(spn_encoder_device_frame(e, &nv12, &err), SPN_ESTATE);
  assert_non_null(strstr(err.msg, "preset.mp4: the encoder takes host frames"));
  assert_int_equal(spn_encoder_send_device_frame(e, 0, 1, 25, &err), SPN_ESTATE);
  /* those refusals leave the encoder working */
  assert_int_equal(spn_encoder_write_video(e, &img, 0, 1, 25, &err), SPN_OK);
  assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
  spn_encoder_free(e);
  assert_true(dir_has_prefix("preset.mp4"));
  /* device frames are nv12: anything else is refused before the device is used */
  AVBufferRef *dev = av_hwdevice_ctx_alloc(AV_HWDEVICE_TYPE_CUDA);
  if (dev) {
    eo.codec = "h264_nvenc";
    eo.hw_device = dev;
    assert_int_equal(spn_encoder_new(p("dev.mp4"), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_EINVAL);
    assert_non_null(strstr(err.msg, "dev.mp4: device frames are nv12, not rgb24"));
    assert_false(dir_has_prefix("dev.mp4"));
    av_buffer_unref(&dev);
  } else {
    printf("# this FFmpeg has no CUDA hwcontext: the nv12 refusal is not checked\n");
  }
  spn_image_release(&img);
}

/* The first frame's centre pixel, decoded to rgb24. */
static void centre_rgb(const char *path, uint8_t rgb[3], spn_decode_info_t *info, spn_colour_t *yuv_colour) {
  spn_error_t err = SPN_ERROR_INIT;
  for (int pass = 0; pass < 2; pass++) {
    spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
    o.want_audio = 0;
    o.pixfmt = pass ? SPN_PIXFMT_YUV420P : SPN_PIXFMT_RGB24;
    spn_decoder_t *d;
    spn_media_item_t it;
    assert_int_equal(spn_decoder_new(path, &o, &d, &err), SPN_OK);
    assert_int_equal(spn_decoder_next(d, &it, &err), SPN_OK);
    if (pass) {
      *yuv_colour = it.colour;
    } else {
      memcpy(rgb, it.image.data[0] + (it.image.height / 2) * it.image.stride[0] + (it.image.width / 2) * 3, 3);
      *info = *spn_decoder_info(d);
    }
    spn_media_item_release(&it);
    spn_decoder_free(d);
  }
}

/* A file's YCbCr matrix and range are what its samples mean: a BT.709 or a
 * full-range file decodes to the RGB that was written (not to what BT.601
 * limited, swscale's default, makes of it), 4:2:0 frames say what they are
 * in, and the encoder records the matrix and range it wrote, so that
 * FFmpeg (and players) read the colours back. */
static void colour_follows_the_file(void **state) {
  (void)state;
  const uint8_t want[3] = {40, 200, 90}; /* fixtures: this colour, written by FFmpeg */
  const struct {
    const char *file;
    int32_t info_matrix, full, matrix, item_full;
  } cases[] = {{"c709.mkv", 1, 0, SPN_MATRIX_BT709, 0},
               {"cfull.mkv", 6, 1, SPN_MATRIX_BT601, 1}, /* yuv420p tagged full: its samples as they are */
               {"c601.mkv", 0, 0, SPN_MATRIX_BT601, 0},
               /* H.264 full range decodes as yuvj420p: 4:2:0 items are converted to limited */
               {"c709full.mp4", 1, 1, SPN_MATRIX_BT709, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t rgb[3];
    spn_decode_info_t info = {0};
    spn_colour_t yc = {0, 0};
    centre_rgb(p(cases[i].file), rgb, &info, &yc);
    printf("# %s: rgb %d %d %d, file says matrix %d full %d; 4:2:0 items %s %s\n", cases[i].file, rgb[0], rgb[1],
           rgb[2], (int)info.matrix, (int)info.full_range, spn_matrix_name(yc.matrix),
           yc.full_range ? "full" : "limited");
    for (int c = 0; c < 3; c++) /* (within 1: swscale's packed RGB, 2 levels dark, gave 38 198 89 for c709.mkv) */
      assert_true(abs((int)rgb[c] - want[c]) <= 1);
    assert_int_equal(info.matrix, cases[i].info_matrix);
    assert_int_equal(info.full_range, cases[i].full);
    assert_int_equal(yc.matrix, cases[i].matrix);
    assert_int_equal(yc.full_range, cases[i].item_full);
  }

  /* the encoder: RGB written in the matrix asked for (BT.601 by default),
   * recorded in the stream; FFmpeg's own reading gives the colour back */
  spn_error_t err = SPN_ERROR_INIT;
  spn_image_t img;
  assert_int_equal(spn_image_alloc(&img, 64, 48, SPN_PIXFMT_RGB24, &err), SPN_OK);
  for (int y = 0; y < 48; y++)
    for (int x = 0; x < 64; x++)
      memcpy(img.data[0] + y * img.stride[0] + x * 3, want, 3);
  const struct {
    const char *file, *tag, *range;
    spn_colour_t c;
  } outs[] = {{"w601.mp4", "smpte170m", "tv", {0, 0}}, {"w709.mp4", "bt709", "tv", {SPN_MATRIX_BT709, 0}},
              {"w2020.mkv", "bt2020nc", "tv", {SPN_MATRIX_BT2020, 0}}};
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
    spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
    eo.preset = "ultrafast";
    eo.colour = outs[i].c;
    spn_encoder_t *e;
    assert_int_equal(spn_encoder_new(p(outs[i].file), 64, 48, SPN_PIXFMT_RGB24, &eo, &e, &err), SPN_OK);
    for (int f = 0; f < 3; f++)
      assert_int_equal(spn_encoder_write_video(e, &img, f, 1, 25, &err), SPN_OK);
    assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
    spn_encoder_free(e);
    /* (and the chroma where the conversion put it: the middle of each 2x2 block) */
    assert_int_equal(sh("test \"$(ffprobe -v error -select_streams v -show_entries "
                        "stream=color_space,color_range,chroma_location -of csv=p=0 '%s')\" = '%s,%s,center'",
                        p(outs[i].file), outs[i].range, outs[i].tag), 0);
    /* FFmpeg's reading (it follows the tags) of the centre pixel */
    assert_int_equal(sh("ffmpeg -nostdin -v error -y -i '%s' -frames:v 1 -vf crop=2:2:31:23 -pix_fmt rgb24 -f rawvideo "
                        "'%s'", p(outs[i].file), p("px.rgb")), 0);
    FILE *fp = fopen(p("px.rgb"), "rb");
    uint8_t px[3] = {0};
    assert_non_null(fp);
    assert_int_equal(fread(px, 1, 3, fp), 3);
    fclose(fp);
    printf("# %s: FFmpeg reads %d %d %d\n", outs[i].file, px[0], px[1], px[2]);
    for (int c = 0; c < 3; c++)
      assert_true(abs((int)px[c] - want[c]) <= 3);
  }
  /* a matrix without coefficients is refused, naming the file */
  spn_encode_opts_t bad = SPN_ENCODE_OPTS_INIT;
  bad.colour.matrix = 8;
  spn_encoder_t *e = NULL;
  assert_int_equal(spn_encoder_new(p("bad.mp4"), 64, 48, SPN_PIXFMT_RGB24, &bad, &e, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "bad.mp4: image: colour matrix 8"));
  spn_image_release(&img);
}

/* The first frame of a file decoded as `fmt` (the caller releases it),
 * and the decoder's info. */
static void first_frame(const char *path, int32_t fmt, spn_media_item_t *it, spn_decode_info_t *info) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.want_audio = 0;
  o.pixfmt = fmt;
  spn_decoder_t *d;
  assert_int_equal(spn_decoder_new(path, &o, &d, &err), SPN_OK);
  assert_int_equal(spn_decoder_next(d, it, &err), SPN_OK);
  *info = *spn_decoder_info(d);
  spn_decoder_free(d);
}

/* RGB frames of SDR 4:2:0 video are spn-image's conversion of the frame's
 * samples (the GPU path's kernels are its twins, so a CPU and a GPU run
 * decode the same RGB): frame for frame, byte for byte, for the 8-bit
 * sample and for the 10-bit one, whose samples are first rounded to 8 bits
 * as the GPU rounds them (checked against FFmpeg's own 10-bit samples).
 * And limited range reads to the RGB it means: Y 235 is white (255), the
 * 126 that mid grey 128 becomes is 128 again, Y 16 black. (swscale's path
 * to packed RGB, which decode used before, gave 253 and 126.) */
static void rgb_frames_are_spn_image_conversions(void **state) {
  (void)state;
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  const char *clips[] = {"talking-head.mp4", "talking-head-hevc10.mp4"};
  for (size_t c = 0; c < 2; c++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/samples/media/%s", root ? root : ".", clips[c]);
    spn_error_t err = SPN_ERROR_INIT;
    spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
    o.want_audio = 0;
    o.pixfmt = SPN_PIXFMT_YUV420P;
    spn_decoder_t *dy, *dr;
    assert_int_equal(spn_decoder_new(path, &o, &dy, &err), SPN_OK);
    o.pixfmt = SPN_PIXFMT_RGB24;
    assert_int_equal(spn_decoder_new(path, &o, &dr, &err), SPN_OK);
    FILE *raw = NULL;
    if (c == 1) { /* FFmpeg's 10-bit samples of the same frames */
      assert_int_equal(sh("ffmpeg -nostdin -v error -y -i '%s' -f rawvideo -pix_fmt yuv420p10le '%s'", path,
                          p("deep.yuv")), 0);
      assert_non_null(raw = fopen(p("deep.yuv"), "rb"));
    }
    int frames = 0;
    spn_media_item_t y, r;
    while (spn_decoder_next(dy, &y, &err) == SPN_OK) {
      assert_int_equal(spn_decoder_next(dr, &r, &err), SPN_OK);
      int32_t w = y.image.width, h = y.image.height;
      if (raw) {
        for (int pl = 0; pl < 3; pl++) {
          int32_t pw = pl ? (w + 1) / 2 : w, ph = pl ? (h + 1) / 2 : h;
          uint16_t *row = malloc((size_t)pw * 2);
          assert_non_null(row);
          for (int32_t j = 0; j < ph; j++) {
            assert_int_equal(fread(row, 2, (size_t)pw, raw), (size_t)pw);
            for (int32_t i = 0; i < pw; i++) {
              int want = (row[i] * 64 + 128) >> 8;
              want = want > 255 ? 255 : want;
              if (y.image.data[pl][j * y.image.stride[pl] + i] != want)
                fail_msg("%s frame %d plane %d (%d,%d): %d, want %d (10-bit %d rounded)", clips[c], frames, pl, i, j,
                         y.image.data[pl][j * y.image.stride[pl] + i], want, row[i]);
            }
          }
          free(row);
        }
      }
      spn_image_t want = SPN_IMAGE_INIT;
      assert_int_equal(spn_image_alloc(&want, w, h, SPN_PIXFMT_RGB24, &err), SPN_OK);
      assert_int_equal(spn_image_convert_colour(&y.image, &want, &y.colour, &err), SPN_OK);
      for (int32_t j = 0; j < h; j++)
        if (memcmp(want.data[0] + j * want.stride[0], r.image.data[0] + j * r.image.stride[0], (size_t)w * 3))
          fail_msg("%s frame %d row %d: decode's rgb24 is not spn_image_convert_colour's", clips[c], frames, j);
      spn_image_release(&want);
      spn_media_item_release(&y);
      spn_media_item_release(&r);
      frames++;
    }
    printf("# %s: %d frames, rgb24 = spn_image_convert_colour(yuv420p)%s\n", clips[c], frames,
           raw ? ", yuv420p = FFmpeg's 10-bit samples rounded" : "");
    assert_int_equal(frames, 100);
    assert_int_equal(spn_decoder_next(dr, &r, &err), SPN_EOS);
    if (raw)
      fclose(raw);
    spn_decoder_free(dy);
    spn_decoder_free(dr);
  }
  /* levels: white, mid grey and black, limited range, lossless */
  const struct {
    const char *colour;
    int want;
  } greys[] = {{"0xFFFFFF", 255}, {"0x808080", 128}, {"0x000000", 0}};
  for (size_t g = 0; g < 3; g++) {
    assert_int_equal(sh("ffmpeg -nostdin -v error -y -f lavfi -i color=c=%s:s=32x32:d=0.04 -pix_fmt yuv420p "
                        "-c:v ffv1 '%s'", greys[g].colour, p("grey.mkv")), 0);
    spn_media_item_t it;
    spn_decode_info_t info;
    first_frame(p("grey.mkv"), SPN_PIXFMT_RGB24, &it, &info);
    for (int c = 0; c < 3; c++)
      if (it.image.data[0][16 * it.image.stride[0] + 16 * 3 + c] != greys[g].want)
        fail_msg("grey %s decodes to %d, want %d", greys[g].colour, it.image.data[0][16 * it.image.stride[0] + 16 * 3 + c],
                 greys[g].want);
    spn_media_item_release(&it);
  }
}

/* Pixels that are not square (an anamorphic DVD or DV video): RGB frames
 * come in square pixels at the shape the file is shown in (wide pixels
 * widen the picture, tall ones heighten it), close to the square-pixel
 * picture the file was made from (both 4:2:0, decoded alike: what differs
 * is the pixel shape and its resampling, bicubic: 1.48 levels apart on
 * average for the wide file, 0.96 for the tall one; swscale's one pass,
 * which decode used before, gave 2.43 and 1.78); 4:2:0 frames come as
 * stored with the ratio in the info; the encoder records a ratio it is
 * given. */
static void non_square_pixels_are_shown_square(void **state) {
  (void)state;
  spn_media_item_t ref, it;
  spn_decode_info_t info;
  first_frame(p("square.mkv"), SPN_PIXFMT_RGB24, &ref, &info);
  const struct {
    const char *file;
    int32_t w, h, sar_num, sar_den;
  } cases[] = {{"wide-pixels.mkv", 128, 64, 4, 3}, {"tall-pixels.mkv", 128, 64, 3, 4}};
  for (size_t i = 0; i < 2; i++) {
    first_frame(p(cases[i].file), SPN_PIXFMT_RGB24, &it, &info);
    printf("# %s: %d:%d pixels, rgb24 %dx%d\n", cases[i].file, (int)info.sar_num, (int)info.sar_den,
           (int)it.image.width, (int)it.image.height);
    assert_int_equal(info.sar_num, cases[i].sar_num);
    assert_int_equal(info.sar_den, cases[i].sar_den);
    assert_int_equal(it.image.width, cases[i].w);
    assert_int_equal(it.image.height, cases[i].h);
    assert_int_equal(info.width, cases[i].w);
    assert_int_equal(info.height, cases[i].h);
    double sum = 0;
    for (int y = 0; y < 64; y++)
      for (int x = 0; x < 128 * 3; x++)
        sum += abs((int)it.image.data[0][y * it.image.stride[0] + x] -
                   (int)ref.image.data[0][y * ref.image.stride[0] + x]);
    printf("#   mean difference from the square-pixel original: %.2f levels\n", sum / (64.0 * 128 * 3));
    assert_true(sum / (64.0 * 128 * 3) < 2.0);
    spn_media_item_release(&it);
    first_frame(p(cases[i].file), SPN_PIXFMT_YUV420P, &it, &info);
    assert_int_equal(it.image.width, cases[i].sar_num > cases[i].sar_den ? 96 : 128);
    assert_int_equal(it.image.height, cases[i].sar_num > cases[i].sar_den ? 64 : 48);
    assert_int_equal(info.width, it.image.width);
    spn_media_item_release(&it);
  }
  spn_media_item_release(&ref);
  /* the encoder records the ratio; FFmpeg reads it back */
  spn_error_t err = SPN_ERROR_INIT;
  first_frame(p("wide-pixels.mkv"), SPN_PIXFMT_YUV420P, &it, &info);
  spn_encode_opts_t eo = SPN_ENCODE_OPTS_INIT;
  eo.preset = "ultrafast";
  eo.sar_num = 4;
  eo.sar_den = 3;
  spn_encoder_t *e;
  assert_int_equal(spn_encoder_new(p("wide-out.mp4"), 96, 64, SPN_PIXFMT_YUV420P, &eo, &e, &err), SPN_OK);
  assert_int_equal(spn_encoder_write_video(e, &it.image, 0, 1, 25, &err), SPN_OK);
  assert_int_equal(spn_encoder_finish(e, &err), SPN_OK);
  spn_encoder_free(e);
  spn_media_item_release(&it);
  assert_int_equal(sh("test \"$(ffprobe -v error -select_streams v -show_entries stream=sample_aspect_ratio,"
                      "display_aspect_ratio -of csv=p=0 '%s')\" = '4:3,2:1'", p("wide-out.mp4")), 0);
}

/* HDR read as RGB is tone-mapped to SDR BT.709 (media-tonemap.h), checked
 * against the standards' own levels: HDR reference white (HLG's 75%
 * signal, PQ's 203 cd/m², 58%) lands at 241 of 255, black at 0; a BT.2020
 * skin tone keeps its hue and gets the saturation its wider primaries
 * give it (read as SDR it was paler: R - B 63); 4:2:0 frames stay HDR. */
static void hdr_is_tone_mapped(void **state) {
  (void)state;
  const struct {
    const char *file;
    int32_t lo[3], hi[3];
  } cases[] = {{"hlg-grey.mkv", {238, 238, 238}, {244, 244, 244}},
               {"pq-grey.mkv", {238, 238, 238}, {244, 244, 244}},
               {"hlg-black.mkv", {0, 0, 0}, {2, 2, 2}},
               {"hlg-skin.mkv", {0, 0, 0}, {255, 255, 255}}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    spn_media_item_t it;
    spn_decode_info_t info;
    first_frame(p(cases[i].file), SPN_PIXFMT_RGB24, &it, &info);
    const uint8_t *px = it.image.data[0] + 24 * it.image.stride[0] + 32 * 3;
    printf("# %s: tone-mapped %d, rgb %d %d %d\n", cases[i].file, (int)info.tone_mapped, px[0], px[1], px[2]);
    assert_int_equal(info.tone_mapped, 1);
    for (int c = 0; c < 3; c++)
      assert_true(px[c] >= cases[i].lo[c] && px[c] <= cases[i].hi[c]);
    if (strstr(cases[i].file, "skin"))
      assert_true(px[0] > px[1] && px[1] > px[2] && px[0] - px[2] > 63 + 10);
    spn_media_item_release(&it);
    first_frame(p(cases[i].file), SPN_PIXFMT_YUV420P, &it, &info);
    assert_int_equal(info.tone_mapped, 0);
    assert_int_equal(info.transfer, strstr(cases[i].file, "pq") ? 16 : 18);
    spn_media_item_release(&it);
  }
}

static int setup_clips(void) {
  const char *ff = "ffmpeg -nostdin -hide_banner -loglevel error -y";
  int r = 0;
  r |= sh("%s -f lavfi -i testsrc2=size=160x120:rate=25:duration=2 -f lavfi -i sine=frequency=440:sample_rate=44100:duration=2 "
          "-ac 2 -c:v libx264 -preset ultrafast -g 10 -pix_fmt yuv420p -c:a aac '%s'", ff, p("clip.mp4"));
  r |= sh("%s -f lavfi -i testsrc=size=63x35:rate=25:duration=0.4 -c:v ffv1 '%s'", ff, p("odd.mkv"));
  r |= sh("%s -f lavfi -i testsrc2=size=64x32:rate=25:duration=0.4 -c:v ffv1 '%s'", ff, p("rot-src.mkv"));
  r |= sh("%s -f lavfi -i sine=frequency=300:sample_rate=22050:duration=2 -c:a pcm_s16le '%s'", ff, p("speech.wav"));
  r |= sh("%s -f lavfi -i sine=frequency=300:duration=1 -c:a aac '%s'", ff, p("audio-only.m4a"));
  /* sound 0.5 s after the video; silence then sound, the video 0.3 s into it */
  r |= sh("%s -f lavfi -i testsrc2=size=64x48:rate=25:duration=2 -itsoffset 0.5 -f lavfi -i "
          "aevalsrc=0.5:s=16000:d=2 -c:v ffv1 -c:a pcm_s16le '%s'", ff, p("late.mkv"));
  r |= sh("%s -itsoffset 0.3 -f lavfi -i testsrc2=size=64x48:rate=25:duration=2 -f lavfi -i "
          "'aevalsrc=0.5*gte(t\\,0.3):s=16000:d=2' -c:v ffv1 -c:a pcm_s16le '%s'", ff, p("early.mkv"));
  /* a square-pixel picture, and the same stored in pixels 4:3 wide (96x64) and 3:4 tall (128x48);
   * all three 4:2:0, so that they differ by the pixel shape only */
  const char *sq = "-f lavfi -i testsrc2=s=128x64:r=25:d=0.2,gblur=sigma=2 -vf";
  r |= sh("%s %s format=yuv420p -c:v ffv1 '%s'", ff, sq, p("square.mkv"));
  r |= sh("%s %s scale=96:64:flags=area,setsar=4/3,format=yuv420p -c:v ffv1 '%s'", ff, sq, p("wide-pixels.mkv"));
  r |= sh("%s %s scale=128:48:flags=area,setsar=3/4,format=yuv420p -c:v ffv1 '%s'", ff, sq, p("tall-pixels.mkv"));
  /* HDR signals (10-bit BT.2020): HLG 75% grey (reference white), black and a skin tone; PQ 203 cd/m2 */
  const char *hdr = "-vf scale=out_color_matrix=bt2020:out_range=tv,format=yuv420p10le -colorspace bt2020nc "
                    "-color_primaries bt2020 -c:v ffv1";
  const struct { const char *rgb, *trc, *file; } hdrs[] = {{"BFBFBF", "arib-std-b67", "hlg-grey.mkv"},
                                                            {"000000", "arib-std-b67", "hlg-black.mkv"},
                                                            {"99735A", "arib-std-b67", "hlg-skin.mkv"},
                                                            {"949494", "smpte2084", "pq-grey.mkv"}};
  for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++)
    r |= sh("%s -f lavfi -i color=c=0x%s:s=64x48:d=0.08 %s -color_trc %s '%s'", ff, hdrs[i].rgb, hdr, hdrs[i].trc,
            p(hdrs[i].file));
  /* one colour (40, 200, 90) written as BT.709, full-range BT.601, untagged BT.601, full-range BT.709 */
  const char *col = "-f lavfi -i color=c=0x28C85A:s=64x48:d=0.2,format=rgb24 -vf";
  r |= sh("%s %s scale=out_color_matrix=bt709:out_range=tv,format=yuv420p -colorspace bt709 -color_range tv "
          "-c:v ffv1 '%s'", ff, col, p("c709.mkv"));
  r |= sh("%s %s scale=out_color_matrix=bt601:out_range=pc,format=yuv420p -colorspace smpte170m -color_range pc "
          "-c:v ffv1 '%s'", ff, col, p("cfull.mkv"));
  r |= sh("%s %s format=yuv420p -c:v ffv1 '%s'", ff, col, p("c601.mkv"));
  r |= sh("%s %s scale=out_color_matrix=bt709:out_range=pc,format=yuv420p -colorspace bt709 -color_range pc "
          "-c:v libx264 -qp 0 '%s'", ff, col, p("c709full.mp4"));
  r |= sh("%s -f lavfi -i testsrc2=size=160x120:rate=25:duration=2 -c:v libx264 -preset ultrafast '%s'", ff,
          p("full.mp4"));
  /* moov at the end: cutting the file in half loses the index */
  r |= sh("head -c $(( $(stat -c %%s '%s') / 2 )) '%s' > '%s'", p("full.mp4"), p("full.mp4"), p("truncated.mp4"));
  r |= sh("%s -f lavfi -i testsrc2=size=160x120:rate=25:duration=2 -c:v libx264 -preset ultrafast -g 5 '%s'", ff,
          p("full.mkv"));
  r |= sh("head -c $(( $(stat -c %%s '%s') / 2 )) '%s' > '%s'", p("full.mkv"), p("full.mkv"), p("cut.mkv"));
  r |= sh("printf 'these are not the frames you are looking for\\n%%.0s' $(seq 40) > '%s'", p("notes.bin"));
  /* files that name other files: the clip's frames in a folder beside them */
  r |= sh("mkdir -p '%s' && %s -i '%s' -an -c copy -f mpegts '%s'", p("other"), ff, p("clip.mp4"), p("other/part.ts"));
  r |= sh("printf '#EXTM3U\\n#EXT-X-TARGETDURATION:2\\n#EXTINF:2.0,\\n%s\\n#EXT-X-ENDLIST\\n' > '%s'", "other/part.ts",
          p("playlist.m3u8"));
  r |= sh("printf '#EXTM3U\\n#EXT-X-TARGETDURATION:2\\n#EXTINF:2.0,\\n%s\\n#EXT-X-ENDLIST\\n' > '%s'",
          "http://127.0.0.1:9/part.ts", p("remote.m3u8"));
  r |= sh("printf \"ffconcat version 1.0\\nfile 'other/part.ts'\\n\" > '%s'", p("list.ffconcat"));
  r |= sh("mkdir -p '%s' && cp '%s' '%s'", p("x:"), p("playlist.m3u8"), p("x:/playlist.m3u8"));
  r |= sh("cp '%s' '%s'", p("list.ffconcat"), p("disguised.mp4"));
  r |= sh("%s -f lavfi -i testsrc2=size=64x48 -frames:v 1 '%s'", ff, p("still.png"));
  r |= sh("cp '%s' '%s' && cp '%s' '%s'", p("still.png"), p("seq%d.png"), p("still.png"), p("seq1.png"));
  return r;
}

int main(void) {
  if (system("ffmpeg -version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "ffmpeg CLI not found: skipping\n");
    return 77;
  }
  snprintf(dir, sizeof dir, "%s/spn-media-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  av_log_set_level(AV_LOG_ERROR);
  if (setup_clips() != 0) {
    fprintf(stderr, "making test clips failed\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_keeps_frames_and_sync),
      cmocka_unit_test(formats_segment_and_odd_sizes),
      cmocka_unit_test(rotation_metadata_turns_frames),
      cmocka_unit_test(audio_file_is_muxed),
      cmocka_unit_test(audio_on_the_video_clock),
      cmocka_unit_test(colour_follows_the_file),
      cmocka_unit_test(rgb_frames_are_spn_image_conversions),
      cmocka_unit_test(non_square_pixels_are_shown_square),
      cmocka_unit_test(hdr_is_tone_mapped),
      cmocka_unit_test(bad_inputs_name_the_file),
      cmocka_unit_test(inputs_are_read_as_one_file),
      cmocka_unit_test(hwaccel_falls_back_or_names_the_file),
      cmocka_unit_test(device_frames_fall_back_to_host_frames_saying_why),
      cmocka_unit_test(failed_encode_leaves_no_file),
      cmocka_unit_test(device_frame_calls_and_presets),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  sh("rm -rf '%s'", dir);
  return rc;
}
