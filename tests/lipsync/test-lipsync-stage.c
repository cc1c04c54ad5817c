/* test-lipsync-stage.c — the lipsync stage end to end on the real runtime.
 *
 *   test-lipsync-stage PYTHON MAKE_MODEL_SCRIPT
 *
 * Generates a random-weight Wav2Lip-shaped ONNX model (make-w2l-model.py;
 * exits 77 when the onnx package is missing), then runs the pipeline
 *   lt_faces (frames + "faces") ─┐
 *                                ├─ lipsync ── filesink
 *   lt_mel   (mel chunks)      ──┘
 * with the engine behind the host's model_* table, and checks every output
 * pixel against the inputs the test sources made (lipsync-test-pattern.h):
 * frame counts, pixels outside the face crop untouched, pixels inside it
 * redrawn on frames with a face and a mel chunk, frames without a face or
 * beyond the audio untouched, the mouth depending on the mel chunk, and jobs
 * run together (their faces sharing model batches) giving byte for byte the
 * frames they give alone. A missing model file fails the pipeline's load
 * with a message naming the export script.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lipsync-test-pattern.h"
#include "spindle/runtime.h"
#include "wav2lip.h"

static const char *g_python, *g_script;
static char g_dir[256];
static char g_model[400];
static char g_arch[400]; /* the Wav2Lip architecture at reduced width; "" when it could not be made */

typedef struct job_spec {
  int64_t frames, chunks, vseed, mseed;
  const char *audio; /* melspec pipeline: the WAV file */
  char out[400];
  uint8_t *data;
  size_t size;
} job_spec_t;

static const char *pipeline_toml =
    "[pipeline]\n"
    "name = \"lipsync-test\"\n"
    "[[stage]]\n"
    "name = \"video\"\n"
    "kind = \"lt_faces\"\n"
    "pace_ms = 4\n"
    "[[stage]]\n"
    "name = \"mel\"\n"
    "kind = \"lt_mel\"\n"
    "[[stage]]\n"
    "name = \"lips\"\n"
    "kind = \"lipsync\"\n"
    "inputs = { video = \"video.faces\", mel = \"mel.mel\" }\n"
    "model = \"%s\"\n"
    "batch_size = 5\n"
    "batching = { max_batch = 16, max_delay_ms = 50 }\n"
    "[[stage]]\n"
    "name = \"sink\"\n"
    "kind = \"filesink\"\n"
    "inputs = [\"lips.video\"]\n";

static spn_runtime_t *new_runtime_logged(int log_fd, int32_t level) {
  const char *dirs[3] = {getenv("SPINDLE_UTIL_STAGE_DIR"), getenv("SPINDLE_LIPSYNC_STAGE_DIR"),
                         getenv("SPINDLE_LIPSYNC_TEST_PLUGIN_DIR")};
  for (int i = 0; i < 3; i++)
    assert_non_null(dirs[i]);
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = "cpu";
  o.plugin_paths = dirs;
  o.n_plugin_paths = 3;
  o.cpu_threads = 2;
  o.log_level = level;
  o.log_fd = log_fd;
  o.log_format = SPN_LOG_FORMAT_TEXT;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_OK);
  assert_int_equal(spn_runtime_load_plugins(rt, &err), SPN_OK);
  return rt;
}

static spn_runtime_t *new_runtime(void) { return new_runtime_logged(-1, SPN_LOG_WARN); }

static spn_pipeline_t *load_pipeline_from(spn_runtime_t *rt, const char *tmpl, const char *model, spn_error_t *err) {
  char toml[2048];
  int len = snprintf(toml, sizeof toml, tmpl, model);
  assert_true(len > 0 && (size_t)len < sizeof toml);
  spn_pipeline_t *p = NULL;
  int32_t rc = spn_pipeline_load_string(rt, toml, (size_t)len, "lipsync-test.toml", NULL, 0, &p, err);
  return rc == SPN_OK ? p : NULL;
}

static spn_pipeline_t *load_pipeline(spn_runtime_t *rt, const char *model, spn_error_t *err) {
  return load_pipeline_from(rt, pipeline_toml, model, err);
}

static uint8_t *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *d = malloc(n > 0 ? (size_t)n + 1 : 1);
  size_t got = n > 0 ? fread(d, 1, (size_t)n, f) : 0;
  d[got] = 0; /* the log is searched as a string */
  fclose(f);
  *size = got;
  return d;
}

/* Start every job on one pipeline at once, wait for all, read their files. */
static void run_jobs(spn_pipeline_t *pipe, job_spec_t *specs, int n, const char *tag) {
  spn_job_t *jobs[8] = {0};
  char ov[8][5][480];
  assert_true(n <= 8);
  for (int i = 0; i < n; i++) {
    job_spec_t *s = &specs[i];
    snprintf(s->out, sizeof s->out, "%s/%s-%d.rgb", g_dir, tag, i);
    snprintf(ov[i][0], sizeof ov[i][0], "video.frames=%lld", (long long)s->frames);
    snprintf(ov[i][1], sizeof ov[i][1], "video.seed=%lld", (long long)s->vseed);
    snprintf(ov[i][2], sizeof ov[i][2], "sink.path=%s", s->out);
    if (s->audio) {
      snprintf(ov[i][3], sizeof ov[i][3], "audio.path=%s", s->audio);
    } else {
      snprintf(ov[i][3], sizeof ov[i][3], "mel.chunks=%lld", (long long)s->chunks);
      snprintf(ov[i][4], sizeof ov[i][4], "mel.seed=%lld", (long long)s->mseed);
    }
    const char *ovp[5] = {ov[i][0], ov[i][1], ov[i][2], ov[i][3], ov[i][4]};
    spn_job_params_t params = SPN_JOB_PARAMS_INIT;
    params.overrides = ovp;
    params.n_overrides = s->audio ? 4 : 5;
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = spn_job_start(pipe, &params, NULL, &jobs[i], &err);
    if (rc != SPN_OK)
      fail_msg("job %d: %s", i, err.msg);
  }
  for (int i = 0; i < n; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = spn_job_wait(jobs[i], &err);
    if (rc != SPN_OK)
      fail_msg("job %d (%s): %s", i, tag, err.msg);
    spn_job_free(&jobs[i]);
    free(specs[i].data);
    specs[i].data = read_file(specs[i].out, &specs[i].size);
    assert_non_null(specs[i].data);
  }
}

static const size_t FRAME_BYTES = (size_t)LT_W * LT_H * 3;

/* Check one job's output against its inputs; returns the number of frames
 * whose crop was redrawn. */
static int check_job(const job_spec_t *s) {
  assert_int_equal(s->size, (size_t)s->frames * FRAME_BYTES);
  spn_face_t face;
  memset(&face, 0, sizeof face);
  face.x0 = LT_BOX_X0, face.y0 = LT_BOX_Y0, face.x1 = LT_BOX_X1, face.y1 = LT_BOX_Y1;
  spn_w2l_rect_t r;
  assert_true(spn_w2l_crop_rect(&face, LT_W, LT_H, NULL, &r));
  assert_int_equal(r.h, 60); /* 50 + the default bottom pad of 10 */
  int synced = 0;
  for (int64_t seq = 0; seq < s->frames; seq++) {
    const uint8_t *f = s->data + (size_t)seq * FRAME_BYTES;
    bool expect_sync = lt_has_face((uint64_t)seq) && seq < s->chunks;
    size_t inside = 0, changed_inside = 0;
    for (int32_t y = 0; y < LT_H; y++)
      for (int32_t x = 0; x < LT_W; x++) {
        bool in = x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h;
        for (int32_t c = 0; c < 3; c++) {
          uint8_t want = lt_pixel(s->vseed, (uint64_t)seq, x, y, c);
          uint8_t got = f[((size_t)y * LT_W + (size_t)x) * 3 + (size_t)c];
          if (!in || !expect_sync) {
            if (got != want)
              fail_msg("seq %lld pixel (%d,%d,%d) = %u, want the input's %u (%s)", (long long)seq, x, y, c, got,
                       want, in ? "frame not synced" : "outside the crop");
          } else {
            inside++;
            changed_inside += got != want;
          }
        }
      }
    if (expect_sync) {
      /* The random network's output has nothing to do with the pattern:
       * nearly every pixel of the crop differs. */
      if (changed_inside * 10 < inside * 8)
        fail_msg("seq %lld: only %zu of %zu crop values changed", (long long)seq, changed_inside, inside);
      synced++;
    }
  }
  return synced;
}

static void test_end_to_end(void **ctx) {
  (void)ctx;
  /* Debug logs to a file: the stage says how many jobs share each run. */
  char logpath[400];
  snprintf(logpath, sizeof logpath, "%s/log.jsonl", g_dir);
  FILE *logf = fopen(logpath, "w+");
  assert_non_null(logf);
  spn_runtime_t *rt = new_runtime_logged(fileno(logf), SPN_LOG_DEBUG);
  spn_error_t err = SPN_ERROR_INIT;
  spn_pipeline_t *pipe = load_pipeline(rt, g_model, &err);
  if (!pipe)
    fail_msg("load: %s", err.msg);

  /* Alone: audio as long as the video, shorter, longer, and none. */
  job_spec_t solo[4] = {{.frames = 12, .chunks = 12, .vseed = 1, .mseed = 1},
                        {.frames = 10, .chunks = 6, .vseed = 2, .mseed = 2},
                        {.frames = 5, .chunks = 9, .vseed = 3, .mseed = 3},
                        {.frames = 4, .chunks = 0, .vseed = 4, .mseed = 4}};
  for (int i = 0; i < 4; i++)
    run_jobs(pipe, &solo[i], 1, i == 0 ? "solo0" : i == 1 ? "solo1" : i == 2 ? "solo2" : "solo3");
  assert_int_equal(check_job(&solo[0]), 9);  /* 12 frames, every 4th without a face */
  assert_int_equal(check_job(&solo[1]), 5);  /* seqs 0,1,2,4,5 have a face and a chunk */
  assert_int_equal(check_job(&solo[2]), 4);  /* 5 frames out of 9 chunks */
  assert_int_equal(check_job(&solo[3]), 0);  /* no audio: passes through */

  /* Together: the four jobs share the stage and its batches. */
  job_spec_t both[4];
  for (int i = 0; i < 4; i++) {
    both[i] = solo[i];
    both[i].data = NULL;
  }
  run_jobs(pipe, both, 4, "both");
  for (int i = 0; i < 4; i++) {
    assert_int_equal(both[i].size, solo[i].size);
    size_t ndiff = 0, first = 0;
    int maxd = 0;
    for (size_t k = 0; k < solo[i].size; k++)
      if (both[i].data[k] != solo[i].data[k]) {
        int d = abs((int)both[i].data[k] - (int)solo[i].data[k]);
        if (!ndiff++)
          first = k;
        maxd = d > maxd ? d : maxd;
      }
    if (ndiff)
      fail_msg("job %d: %zu bytes differ when run beside the others (first at frame %zu, max difference %d)", i,
               ndiff, first / FRAME_BYTES, maxd);
  }

  /* Somewhere in that run faces of several jobs shared one model run. */
  fflush(logf);
  size_t loglen = 0;
  char *log = (char *)read_file(logpath, &loglen);
  assert_non_null(log);
  int shared = 0, most = 0;
  for (char *p = log; (p = strstr(p, "wav2lip run: ")) != NULL; p++) {
    unsigned faces = 0, njobs = 0;
    if (sscanf(p, "wav2lip run: %u faces from %u jobs", &faces, &njobs) == 2) {
      assert_true(faces >= 1 && faces <= 5); /* batch_size */
      shared += njobs > 1;
      most = (int)njobs > most ? (int)njobs : most;
    }
  }
  free(log);
  printf("model runs shared by several jobs: %d (at most %d jobs in one)\n", shared, most);
  assert_true(shared >= 1);

  /* The mouth follows the audio: job 0's frames with other mel chunks. */
  job_spec_t other = {.frames = 12, .chunks = 12, .vseed = 1, .mseed = 5};
  run_jobs(pipe, &other, 1, "othermel");
  assert_int_equal(check_job(&other), 9);
  size_t differ = 0;
  for (size_t i = 0; i < other.size; i++)
    differ += other.data[i] != solo[0].data[i];
  printf("bytes that differ with other mel chunks: %zu of %zu\n", differ, other.size);
  assert_true(differ > 9 * 1000);

  for (int i = 0; i < 4; i++) {
    free(solo[i].data);
    free(both[i].data);
    unlink(solo[i].out);
    unlink(both[i].out);
  }
  free(other.data);
  unlink(other.out);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  fclose(logf);
  unlink(logpath);
}

/* The real Wav2Lip architecture (random weights, reduced width) as the
 * export script lays it out: the stage binds its inputs and runs it. */
static void test_wav2lip_arch(void **ctx) {
  (void)ctx;
  if (!g_arch[0])
    skip();
  spn_runtime_t *rt = new_runtime();
  spn_error_t err = SPN_ERROR_INIT;
  spn_pipeline_t *pipe = load_pipeline(rt, g_arch, &err);
  if (!pipe)
    fail_msg("load: %s", err.msg);
  job_spec_t a[2] = {{.frames = 7, .chunks = 7, .vseed = 8, .mseed = 8},
                     {.frames = 6, .chunks = 3, .vseed = 9, .mseed = 9}};
  run_jobs(pipe, a, 2, "arch");
  assert_int_equal(check_job(&a[0]), 6);
  assert_int_equal(check_job(&a[1]), 3);
  for (int i = 0; i < 2; i++) {
    free(a[i].data);
    unlink(a[i].out);
  }
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
}

/* A malformed mel chunk fails its job with the input and seq named; a job
 * running beside it and the next job are not affected. */
static void test_bad_chunk(void **ctx) {
  (void)ctx;
  spn_runtime_t *rt = new_runtime();
  spn_error_t err = SPN_ERROR_INIT;
  spn_pipeline_t *pipe = load_pipeline(rt, g_model, &err);
  if (!pipe)
    fail_msg("load: %s", err.msg);
  char out[460];
  snprintf(out, sizeof out, "sink.path=%s/badchunk.rgb", g_dir);
  const char *ovp[4] = {"video.frames=8", "mel.chunks=8", "mel.bad_at=2", out};
  spn_job_params_t params = SPN_JOB_PARAMS_INIT;
  params.overrides = ovp;
  params.n_overrides = 4;
  spn_job_t *job = NULL;
  assert_int_equal(spn_job_start(pipe, &params, NULL, &job, &err), SPN_OK);
  job_spec_t good = {.frames = 8, .chunks = 8, .vseed = 6, .mseed = 6};
  run_jobs(pipe, &good, 1, "beside-bad");
  assert_int_equal(spn_job_wait(job, &err), SPN_EINVAL);
  if (!strstr(err.msg, "input \"mel\" seq 2") || !strstr(err.msg, "(80,16)"))
    fail_msg("bad chunk message: \"%s\"", err.msg);
  spn_job_free(&job);
  assert_int_equal(access(out + strlen("sink.path="), F_OK), -1); /* the failed job's file is removed */
  assert_int_equal(check_job(&good), 6);
  free(good.data);
  good.data = NULL;
  unlink(good.out);
  good.vseed = 7;
  run_jobs(pipe, &good, 1, "after-bad");
  assert_int_equal(check_job(&good), 6);
  free(good.data);
  unlink(good.out);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
}

static void test_missing_model(void **ctx) {
  (void)ctx;
  spn_runtime_t *rt = new_runtime();
  spn_error_t err = SPN_ERROR_INIT;
  char missing[400];
  snprintf(missing, sizeof missing, "%s/no-such-wav2lip.onnx", g_dir);
  spn_pipeline_t *pipe = load_pipeline(rt, missing, &err);
  assert_null(pipe);
  assert_non_null(strstr(err.msg, "no-such-wav2lip.onnx"));
  assert_non_null(strstr(err.msg, "tools/export/export.py wav2lip"));
  assert_non_null(strstr(err.msg, "lips"));

  /* A file that is there but is not a Wav2Lip model: refused at preload. */
  char bogus[400];
  snprintf(bogus, sizeof bogus, "%s/bogus.onnx", g_dir);
  FILE *f = fopen(bogus, "wb");
  assert_non_null(f);
  fputs("not a model", f);
  fclose(f);
  pipe = load_pipeline(rt, bogus, &err);
  assert_null(pipe);
  assert_non_null(strstr(err.msg, "bogus.onnx"));
  unlink(bogus);
  spn_runtime_free(&rt);
}

#ifdef SPN_HAVE_MELSPEC
#include <math.h>

static const char *melspec_toml =
    "[pipeline]\n"
    "name = \"melspec-test\"\n"
    "[[stage]]\n"
    "name = \"video\"\n"
    "kind = \"lt_faces\"\n"
    "[[stage]]\n"
    "name = \"audio\"\n"
    "kind = \"melspec\"\n"
    "fps = 25.0\n"
    "[[stage]]\n"
    "name = \"lips\"\n"
    "kind = \"lipsync\"\n"
    "inputs = { video = \"video.faces\", mel = \"audio.mel\" }\n"
    "model = \"%s\"\n"
    "[[stage]]\n"
    "name = \"sink\"\n"
    "kind = \"filesink\"\n"
    "inputs = [\"lips.video\"]\n";

static void put_le(FILE *f, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    fputc((int)((v >> (8 * i)) & 0xff), f);
}

/* A 16-bit PCM WAV of `seconds` of a 440 Hz tone. */
static void write_wav(const char *path, uint32_t rate, uint16_t channels, double seconds) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint32_t n = (uint32_t)(rate * seconds);
  uint32_t data = n * channels * 2;
  fwrite("RIFF", 1, 4, f), put_le(f, 36 + data, 4), fwrite("WAVEfmt ", 1, 8, f);
  put_le(f, 16, 4), put_le(f, 1, 2), put_le(f, channels, 2), put_le(f, rate, 4);
  put_le(f, rate * channels * 2, 4), put_le(f, channels * 2u, 2), put_le(f, 16, 2);
  fwrite("data", 1, 4, f), put_le(f, data, 4);
  for (uint32_t i = 0; i < n; i++)
    for (uint16_t c = 0; c < channels; c++)
      put_le(f, (uint32_t)(uint16_t)(int16_t)lrint(9000.0 * sin(2 * M_PI * 440.0 * i / rate)), 2);
  fclose(f);
}

static void test_melspec(void **ctx) {
  (void)ctx;
  spn_runtime_t *rt = new_runtime();
  spn_error_t err = SPN_ERROR_INIT;
  spn_pipeline_t *pipe = load_pipeline_from(rt, melspec_toml, g_model, &err);
  if (!pipe)
    fail_msg("load: %s", err.msg);
  char wav16[400], wav48[400], shortwav[400], missing[400];
  snprintf(wav16, sizeof wav16, "%s/a16k.wav", g_dir);
  snprintf(wav48, sizeof wav48, "%s/a48k.wav", g_dir);
  snprintf(shortwav, sizeof shortwav, "%s/short.wav", g_dir);
  snprintf(missing, sizeof missing, "%s/none.wav", g_dir);
  write_wav(wav16, 16000, 1, 1.0);
  write_wav(wav48, 48000, 2, 1.0);
  write_wav(shortwav, 16000, 1, 0.05);
  /* 1 s at 16 kHz: 81 mel frames; at 25 fps Wav2Lip cuts 21 windows that
   * fit (starts 0, 3, 6, ..., 64) and one last window: 22 chunks. Video of
   * 30 frames: frames 22..29 pass through. */
  job_spec_t a[2] = {{.frames = 30, .chunks = 22, .vseed = 1, .audio = wav16},
                     {.frames = 30, .chunks = 22, .vseed = 2, .audio = wav48}};
  run_jobs(pipe, a, 2, "melspec");
  assert_int_equal(check_job(&a[0]), 17);
  assert_int_equal(check_job(&a[1]), 17);
  for (int i = 0; i < 2; i++) {
    free(a[i].data);
    unlink(a[i].out);
  }
  /* A missing file and a too short one fail their job, naming the file. */
  const char *bad[2] = {missing, shortwav};
  const char *want[2] = {"none.wav", "too short"};
  for (int i = 0; i < 2; i++) {
    char o0[64], o1[460], o2[460];
    snprintf(o0, sizeof o0, "video.frames=4");
    snprintf(o1, sizeof o1, "audio.path=%s", bad[i]);
    snprintf(o2, sizeof o2, "sink.path=%s/bad.rgb", g_dir);
    const char *ovp[3] = {o0, o1, o2};
    spn_job_params_t params = SPN_JOB_PARAMS_INIT;
    params.overrides = ovp;
    params.n_overrides = 3;
    spn_job_t *job = NULL;
    assert_int_equal(spn_job_start(pipe, &params, NULL, &job, &err), SPN_OK);
    assert_int_not_equal(spn_job_wait(job, &err), SPN_OK);
    if (!strstr(err.msg, want[i]) || !strstr(err.msg, "audio"))
      fail_msg("job with %s: \"%s\"", bad[i], err.msg);
    spn_job_free(&job);
  }
  unlink(wav16);
  unlink(wav48);
  unlink(shortwav);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
}
#endif

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PYTHON MAKE_MODEL_SCRIPT\n", argv[0]);
    return 2;
  }
  g_python = argv[1];
  g_script = argv[2];
  snprintf(g_dir, sizeof g_dir, "%s/spn-lipsync-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(g_model, sizeof g_model, "%s/w2l-random.onnx", g_dir);
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", g_python, g_script, g_model);
  int st = system(cmd);
  if (st != 0) {
    rmdir(g_dir);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
      printf("skip: the onnx Python package is not installed\n");
      return 77;
    }
    fprintf(stderr, "%s failed (%d)\n", cmd, st);
    return 1;
  }
  snprintf(g_arch, sizeof g_arch, "%s/w2l-arch.onnx", g_dir);
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' --arch wav2lip --width 0.0625", g_python, g_script, g_arch);
  if (system(cmd) != 0) {
    fprintf(stderr, "note: %s failed; the Wav2Lip-architecture case is skipped\n", cmd);
    g_arch[0] = 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_end_to_end),
      cmocka_unit_test(test_wav2lip_arch),
      cmocka_unit_test(test_bad_chunk),
      cmocka_unit_test(test_missing_model),
#ifdef SPN_HAVE_MELSPEC
      cmocka_unit_test(test_melspec),
#endif
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(g_model);
  if (g_arch[0])
    unlink(g_arch);
  rmdir(g_dir);
  return rc;
}
