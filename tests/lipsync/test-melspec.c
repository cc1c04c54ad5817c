/* test-melspec.c — the melspec stage's output on the stage harness.
 *
 * Runs stages/lipsync/stage-melspec.c (the built plugin, found through
 * SPINDLE_LIPSYNC_STAGE_DIR) on WAV files the test writes and checks what it
 * emits against the computation done here with the same library calls
 * (spn_wav_read, spn_audio_resample, spn_mel_compute):
 *   - the first message of each job carries the whole spectrogram
 *     (SPN_W2L_SPEC_ITEM, (80, frames) f32 in host memory, equal to
 *     spn_mel_compute's) and the fps its chunks are cut at
 *     (SPN_W2L_SPEC_FPS_ITEM); no later message carries either;
 *   - every chunk is spn_w2l_mel_chunk of that spectrogram, there are
 *     spn_w2l_mel_chunks of them and the envelopes' total says so;
 *   - a spectrogram larger than `spectrogram_max_kb` is not attached (the
 *     chunks are the same), and one of exactly that size is;
 *   - fps = 0 (the default) cuts the chunks at the rate of the job's video
 *     (`video`), and a job with neither fails naming both;
 *   - start: the chunks from that of the first frame at or after it;
 *   - with FFmpeg (SPN_HAVE_MEDIA) the speech may be any file with sound:
 *     a FLAC of a WAV gives that WAV's chunks exactly; a file without
 *     sound, or a named pipe, fails the job naming it.
 * The FLAC and the videos are made with the ffmpeg program.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "spindle/audio.h"
#include "spindle/harness.h"
#include "wav.h"
#include "wav2lip.h"

static char g_dir[256];

static void put_le(FILE *f, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    fputc((int)((v >> (8 * i)) & 0xff), f);
}

/* A 16-bit PCM WAV of n samples a channel: a tone whose pitch rises, so
 * every mel column differs from its neighbours. */
static void write_wav(const char *path, uint32_t rate, uint16_t channels, uint32_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint32_t data = n * channels * 2;
  fwrite("RIFF", 1, 4, f), put_le(f, 36 + data, 4), fwrite("WAVEfmt ", 1, 8, f);
  put_le(f, 16, 4), put_le(f, 1, 2), put_le(f, channels, 2), put_le(f, rate, 4);
  put_le(f, rate * channels * 2, 4), put_le(f, channels * 2u, 2), put_le(f, 16, 2);
  fwrite("data", 1, 4, f), put_le(f, data, 4);
  for (uint32_t i = 0; i < n; i++) {
    double t = (double)i / rate;
    for (uint16_t c = 0; c < channels; c++)
      put_le(f, (uint32_t)(uint16_t)(int16_t)lrint(9000.0 * sin(2 * M_PI * (300.0 + 900.0 * t + 50.0 * c) * t)), 2);
  }
  fclose(f);
}

/* What melspec computes for `path`: the (80, *frames) spectrogram. */
static float *reference(const char *path, int64_t *frames) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_wav_t wav;
  float *pcm = NULL;
  int64_t n = 0;
  assert_int_equal(spn_wav_read(path, &wav, &err), SPN_OK);
  assert_int_equal(spn_audio_resample(wav.samples, wav.n, wav.sample_rate, 16000, &pcm, &n, &err), SPN_OK);
  spn_wav_release(&wav);
  spn_mel_params_t p = SPN_MEL_PARAMS_WAV2LIP;
  spn_mel_t *mel = NULL;
  assert_int_equal(spn_mel_new(&p, NULL, &mel, &err), SPN_OK);
  *frames = spn_mel_frames(mel, n);
  float *spec = malloc((size_t)*frames * SPN_W2L_MEL_BINS * sizeof *spec);
  assert_non_null(spec);
  assert_int_equal(spn_mel_compute(mel, pcm, n, spec, &err), SPN_OK);
  spn_mel_free(&mel);
  free(pcm);
  return spec;
}

static spn_harness_t *open_melspec(const char *config) {
  const char *dir = getenv("SPINDLE_LIPSYNC_STAGE_DIR");
  assert_non_null(dir);
  char plugin[512];
  snprintf(plugin, sizeof plugin, "%s/libspindle-melspec.so", dir);
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  o.plugin = plugin;
  o.kind = "melspec";
  o.config = config;
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_new(&o, &h, &err) != SPN_OK)
    fail_msg("harness: %s", err.msg);
  return h;
}

static void job(spn_harness_t *h, uint64_t id, const char *path, double fps) {
  char kv[600];
  spn_error_t err = SPN_ERROR_INIT;
  snprintf(kv, sizeof kv, "path=%s", path);
  assert_int_equal(spn_harness_job_set(h, id, kv, &err), SPN_OK);
  snprintf(kv, sizeof kv, "fps=%g", fps);
  assert_int_equal(spn_harness_job_set(h, id, kv, &err), SPN_OK);
}

/* Check job `id`'s messages against the reference spectrogram of `path`;
 * `attached`: whether its first message must carry it. */
static void check_job(spn_harness_t *h, uint64_t id, const char *path, double fps, bool attached) {
  const spn_host_api_t *host = spn_harness_host(h);
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_harness_job_status(h, id, &err) != SPN_OK)
    fail_msg("job %llu: %s", (unsigned long long)id, err.msg);
  int64_t frames = 0;
  float *spec = reference(path, &frames);
  int64_t chunks = spn_w2l_mel_chunks(fps, frames);
  size_t n = spn_harness_output_len(h, id, 0);
  assert_int_equal((int64_t)n, chunks);
  float want[SPN_W2L_MEL_FLOATS];
  for (size_t i = 0; i < n; i++) {
    const spn_msg_t *m = spn_harness_output(h, id, 0, i);
    const spn_envelope_t *env = host->msg_envelope(m);
    assert_int_equal(env->seq, i);
    assert_int_equal(env->total, chunks);
    spn_item_t it = {.struct_size = sizeof it};
    int64_t k = host->msg_find(m, "mel");
    assert_true(k >= 0);
    assert_int_equal(host->msg_item(m, (size_t)k, &it), SPN_OK);
    assert_int_equal(spn_w2l_mel_chunk(spec, frames, (int64_t)i, fps, want, &err), SPN_OK);
    assert_memory_equal(host->buffer_data(it.buffer), want, sizeof want);
    int64_t s = host->msg_find(m, SPN_W2L_SPEC_ITEM), f = host->msg_find(m, SPN_W2L_SPEC_FPS_ITEM);
    if (i > 0 || !attached) {
      if (s >= 0 || f >= 0)
        fail_msg("job %llu message %zu carries the spectrogram", (unsigned long long)id, i);
      continue;
    }
    assert_true(s >= 0 && f >= 0);
    assert_int_equal(host->msg_item(m, (size_t)s, &it), SPN_OK);
    assert_int_equal(it.kind, SPN_ITEM_TENSOR);
    assert_int_equal(it.tensor.dtype, SPN_DTYPE_F32);
    assert_int_equal(it.tensor.device_kind, SPN_DEVICE_CPU);
    assert_int_equal(it.tensor.ndim, 2);
    assert_int_equal(it.tensor.shape[0], SPN_W2L_MEL_BINS);
    assert_int_equal(it.tensor.shape[1], frames);
    assert_memory_equal(it.tensor.data, spec, (size_t)frames * SPN_W2L_MEL_BINS * sizeof *spec);
    assert_int_equal(host->msg_item(m, (size_t)f, &it), SPN_OK);
    assert_int_equal(it.kind, SPN_ITEM_META);
    assert_int_equal(it.meta_size, sizeof(double));
    double got_fps;
    memcpy(&got_fps, it.meta, sizeof got_fps);
    assert_true(got_fps == fps);
  }
  free(spec);
}

static void the_first_message_of_each_job_carries_its_spectrogram(void **state) {
  (void)state;
  char a[400], b[400];
  snprintf(a, sizeof a, "%s/a16k.wav", g_dir);
  snprintf(b, sizeof b, "%s/b48k.wav", g_dir);
  write_wav(a, 16000, 1, 16000);
  write_wav(b, 48000, 2, 33600);
  spn_harness_t *h = open_melspec("fps = 25.0");
  job(h, 1, a, 25.0);
  job(h, 2, b, 29.97);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_harness_run(h, &err), SPN_OK);
  check_job(h, 1, a, 25.0, true);
  check_job(h, 2, b, 29.97, true);
  spn_harness_free(&h);
  unlink(a);
  unlink(b);
}

static void a_spectrogram_over_spectrogram_max_kb_is_not_attached(void **state) {
  (void)state;
  char a[400];
  snprintf(a, sizeof a, "%s/a16k.wav", g_dir);
  write_wav(a, 16000, 1, 15800);
  /* 15800 samples at 16 kHz: 80 columns of 80 floats, 25600 bytes: 25 KiB
   * exactly. */
  int64_t frames = 0;
  free(reference(a, &frames));
  assert_int_equal(frames, 80);
  const char *configs[] = {"spectrogram_max_kb = 24", "spectrogram_max_kb = 0", "spectrogram_max_kb = 25"};
  for (int c = 0; c < 3; c++) {
    spn_harness_t *h = open_melspec(configs[c]);
    job(h, 1, a, 25.0);
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_harness_run(h, &err), SPN_OK);
    check_job(h, 1, a, 25.0, c == 2);
    spn_harness_free(&h);
  }
  /* The bound is lipsync's: no more can be asked for. */
  spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
  char plugin[512], config[64];
  snprintf(plugin, sizeof plugin, "%s/libspindle-melspec.so", getenv("SPINDLE_LIPSYNC_STAGE_DIR"));
  snprintf(config, sizeof config, "spectrogram_max_kb = %zu", (SPN_W2L_SPEC_MAX_BYTES >> 10) + 1);
  o.plugin = plugin;
  o.kind = "melspec";
  o.config = config;
  spn_harness_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_not_equal(spn_harness_new(&o, &h, &err), SPN_OK);
  assert_non_null(strstr(err.msg, "spectrogram_max_kb"));
  unlink(a);
}

/* Run `cmd` (an ffmpeg command line) through the shell. */
static void shell(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  if (system(cmd) != 0)
    fail_msg("failed: %s", cmd);
}

/* One job of `kv` settings (NULL-terminated) on a melspec of `config`;
 * returns its status, its error in *err. */
static int32_t run_one(const char *config, const char *const *kv, spn_harness_t **out, spn_error_t *err) {
  spn_harness_t *h = open_melspec(config);
  for (size_t i = 0; kv[i]; i++)
    assert_int_equal(spn_harness_job_set(h, 1, kv[i], err), SPN_OK);
  assert_int_equal(spn_harness_run(h, err), SPN_OK);
  int32_t rc = spn_harness_job_status(h, 1, err);
  *out = h;
  return rc;
}

static void fps_0_takes_the_rate_of_the_video(void **state) {
  (void)state;
  char a[400], v30[400], k[500], kv[500];
  snprintf(a, sizeof a, "%s/a16k.wav", g_dir);
  snprintf(v30, sizeof v30, "%s/v30.mp4", g_dir);
  write_wav(a, 16000, 1, 16000);
  snprintf(k, sizeof k, "path=%s", a);
  spn_error_t err = SPN_ERROR_INIT;
  spn_harness_t *h = NULL;
  /* neither fps nor a video: the job fails, naming both */
  const char *none[] = {k, NULL};
  assert_int_equal(run_one("", none, &h, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "fps = 0 takes the frame rate of the job's video"));
  assert_non_null(strstr(err.msg, "melspec.video"));
  assert_int_equal(spn_harness_output_len(h, 1, 0), 0);
  spn_harness_free(&h);
#ifdef SPN_HAVE_MEDIA
  shell("ffmpeg -v error -y -f lavfi -i testsrc=size=64x64:rate=30 -t 0.5 -c:v libx264 -pix_fmt yuv420p %s", v30);
  snprintf(kv, sizeof kv, "video=%s", v30);
  const char *with_video[] = {k, kv, NULL};
  assert_int_equal(run_one("", with_video, &h, &err), SPN_OK);
  check_job(h, 1, a, 30.0, true); /* 30 chunks a second: the video's rate, in the spectrogram's fps item too */
  spn_harness_free(&h);
  /* a set fps wins over the video */
  const char *both[] = {k, kv, "fps=25", NULL};
  assert_int_equal(run_one("", both, &h, &err), SPN_OK);
  check_job(h, 1, a, 25.0, true);
  spn_harness_free(&h);
  /* a video without a picture has no rate to give */
  snprintf(kv, sizeof kv, "video=%s", a);
  const char *sound_only[] = {k, kv, NULL};
  assert_int_equal(run_one("", sound_only, &h, &err), SPN_EMEDIA);
  assert_non_null(strstr(err.msg, "melspec: the video, whose frame rate fps = 0 takes"));
  assert_non_null(strstr(err.msg, "no video stream"));
  spn_harness_free(&h);
  unlink(v30);
#else
  (void)v30, (void)kv;
#endif
  unlink(a);
}

/* A cut job (start): the chunks of its frames in the whole video, from
 * that of the first frame at or after start, at their times in the speech;
 * the whole spectrogram on the first message with the index of its first
 * chunk (a GPU lipsync cuts the windows from it). */
static void start_cuts_the_chunks_where_the_video_starts(void **state) {
  (void)state;
  char a[400], k[500];
  snprintf(a, sizeof a, "%s/a16k.wav", g_dir);
  write_wav(a, 16000, 1, 16000);
  snprintf(k, sizeof k, "path=%s", a);
  int64_t frames = 0;
  float *spec = reference(a, &frames);
  int64_t total = spn_w2l_mel_chunks(25.0, frames);
  spn_error_t err = SPN_ERROR_INIT;
  spn_harness_t *h = NULL;
  const char *kv[] = {k, "fps=25", "start=0.3", NULL}; /* frame 8 (0.32 s) is the first at or after 0.3 s */
  assert_int_equal(run_one("", kv, &h, &err), SPN_OK);
  const spn_host_api_t *host = spn_harness_host(h);
  size_t n = spn_harness_output_len(h, 1, 0);
  assert_int_equal((int64_t)n, total - 8);
  float want[SPN_W2L_MEL_FLOATS];
  for (size_t i = 0; i < n; i++) {
    const spn_msg_t *m = spn_harness_output(h, 1, 0, i);
    const spn_envelope_t *env = host->msg_envelope(m);
    assert_int_equal(env->seq, i);
    assert_int_equal(env->total, total - 8);
    assert_true(fabs(env->pts - (double)(8 + i) / 25.0) < 1e-9);
    spn_item_t it = {.struct_size = sizeof it};
    assert_int_equal(host->msg_item(m, (size_t)host->msg_find(m, "mel"), &it), SPN_OK);
    assert_int_equal(spn_w2l_mel_chunk(spec, frames, 8 + (int64_t)i, 25.0, want, &err), SPN_OK);
    assert_memory_equal(host->buffer_data(it.buffer), want, sizeof want);
    int64_t si = host->msg_find(m, SPN_W2L_SPEC_ITEM), fi = host->msg_find(m, SPN_W2L_SPEC_FIRST_ITEM);
    if (i > 0) {
      assert_true(si < 0 && fi < 0);
      continue;
    }
    assert_true(si >= 0 && fi >= 0);
    assert_int_equal(host->msg_item(m, (size_t)si, &it), SPN_OK);
    assert_int_equal(it.tensor.shape[1], frames);
    assert_memory_equal(it.tensor.data, spec, (size_t)frames * SPN_W2L_MEL_BINS * sizeof *spec);
    assert_int_equal(host->msg_item(m, (size_t)fi, &it), SPN_OK);
    assert_int_equal(it.meta_size, sizeof(int64_t));
    int64_t first;
    memcpy(&first, it.meta, sizeof first);
    assert_int_equal(first, 8);
  }
  spn_harness_free(&h);
  /* a start past the speech's end */
  const char *late[] = {k, "fps=25", "start=5", NULL};
  assert_int_equal(run_one("", late, &h, &err), SPN_EMEDIA);
  assert_non_null(strstr(err.msg, "ends before the job's start"));
  spn_harness_free(&h);
  free(spec);
  unlink(a);
}

#ifdef SPN_HAVE_MEDIA
static void the_speech_is_any_file_with_sound(void **state) {
  (void)state;
  char a[400], flac[400], v30[400], fifo[400], k[500];
  snprintf(a, sizeof a, "%s/a48k.wav", g_dir);
  snprintf(flac, sizeof flac, "%s/a48k.flac", g_dir);
  snprintf(v30, sizeof v30, "%s/silent.mp4", g_dir);
  snprintf(fifo, sizeof fifo, "%s/speech.fifo", g_dir);
  write_wav(a, 48000, 1, 38400);
  shell("ffmpeg -v error -y -i %s -c:a flac %s", a, flac);
  spn_error_t err = SPN_ERROR_INIT;
  spn_harness_t *h = NULL;
  /* lossless: the WAV's samples, so exactly its chunks (check_job's
   * reference reads the WAV) */
  snprintf(k, sizeof k, "path=%s", flac);
  const char *kv[] = {k, "fps=25", NULL};
  assert_int_equal(run_one("", kv, &h, &err), SPN_OK);
  check_job(h, 1, a, 25.0, true);
  spn_harness_free(&h);
  /* no sound */
  shell("ffmpeg -v error -y -f lavfi -i testsrc=size=64x64:rate=30 -t 0.5 -c:v libx264 -pix_fmt yuv420p %s", v30);
  snprintf(k, sizeof k, "path=%s", v30);
  assert_int_equal(run_one("", kv, &h, &err), SPN_EMEDIA);
  assert_non_null(strstr(err.msg, v30));
  assert_non_null(strstr(err.msg, "melspec: the speech"));
  assert_non_null(strstr(err.msg, "no audio stream"));
  spn_harness_free(&h);
  /* a named pipe that nobody writes: refused, not waited on */
  assert_int_equal(mkfifo(fifo, 0600), 0);
  snprintf(k, sizeof k, "path=%s", fifo);
  assert_int_equal(run_one("", kv, &h, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "named pipe"));
  spn_harness_free(&h);
  unlink(fifo);
  unlink(v30);
  unlink(flac);
  unlink(a);
}
#endif

int main(void) {
  snprintf(g_dir, sizeof g_dir, "%s/spn-melspec-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(the_first_message_of_each_job_carries_its_spectrogram),
      cmocka_unit_test(a_spectrogram_over_spectrogram_max_kb_is_not_attached),
      cmocka_unit_test(fps_0_takes_the_rate_of_the_video),
      cmocka_unit_test(start_cuts_the_chunks_where_the_video_starts),
#ifdef SPN_HAVE_MEDIA
      cmocka_unit_test(the_speech_is_any_file_with_sound),
#endif
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  rmdir(g_dir);
  return rc;
}
