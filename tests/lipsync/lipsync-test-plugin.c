/* lipsync-test-plugin.c — test sources for the lipsync stage.
 *
 * `lt_faces`: per job, `frames` RGB frames of LT_W × LT_H with the pattern
 * of lipsync-test-pattern.h keyed by (seed, seq), each with a "faces" item
 * (one box, or none on every 4th frame) — what facedetect emits.
 * `lt_mel`: per job, `chunks` mel chunks (1,80,16) f32 keyed by (seed, seq),
 * with the envelope's total set to `chunks` — what melspec emits; with
 * `mode = "windows"` the chunks are cut from one spectrogram per job
 * (lt_spec), and with `mode = "spectrogram"` that spectrogram also goes
 * whole with seq 0, as melspec sends it (wav2lip.h, SPN_W2L_SPEC_ITEM).
 * `first` > 0: the job is cut at a start, as melspec's `start` cuts one:
 * its chunks are the spectrogram's from chunk `first` on, and the
 * spectrogram (of first + chunks chunks) goes with that index.
 * Both are sources producing one message per generate() call.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lipsync-test-pattern.h"
#include "spindle/plugin.h"

/* wav2lip.h's names of the items (not included: this plugin links only the
 * plugin API). */
#define LT_SPEC_ITEM "melspec"
#define LT_SPEC_FPS_ITEM "melspec_fps"
#define LT_SPEC_FIRST_ITEM "melspec_first"

static const spn_host_api_t *host;

typedef struct lt_config {
  int64_t count;
  int64_t seed;
  int64_t bad_at; /* lt_mel: the chunk at this seq has a wrong shape (-1: none) */
  int64_t pace_ms; /* lt_faces: wait this long before each frame */
  char *mode;      /* lt_mel: "chunks", "windows" or "spectrogram" */
  int64_t first;   /* lt_mel: the spectrogram's chunk of seq 0 */
} lt_config_t;

static const spn_config_field_t lt_faces_schema[] = {
    {.key = "frames", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(lt_config_t, count),
     .doc = "frames per job", .def_int = 8, .min = 0, .max = 100000},
    {.key = "seed", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(lt_config_t, seed),
     .doc = "pattern seed", .def_int = 1, .min = 0, .max = 1000},
    /* Pacing keeps jobs started one after another in flight together, so a
     * test of cross-job batching does not depend on how fast the machine
     * happens to be. A test source may block its executor; a real one not. */
    {.key = "pace_ms", .type = SPN_CONFIG_INT, .offset = offsetof(lt_config_t, pace_ms),
     .doc = "wait before each frame (ms)", .def_int = 0, .min = 0, .max = 1000},
    {0},
};
static const spn_config_field_t lt_mel_schema[] = {
    {.key = "chunks", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(lt_config_t, count),
     .doc = "mel chunks per job", .def_int = 8, .min = 0, .max = 100000},
    {.key = "seed", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(lt_config_t, seed),
     .doc = "pattern seed", .def_int = 1, .min = 0, .max = 1000},
    {.key = "bad_at", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(lt_config_t, bad_at),
     .doc = "seq of a chunk sent with a wrong shape (1,80,8); -1: none", .def_int = -1, .min = -1, .max = 100000},
    {.key = "mode", .type = SPN_CONFIG_STRING, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(lt_config_t, mode),
     .doc = "chunks: a pattern per chunk; windows: cut from one spectrogram; spectrogram: the same, and the "
            "spectrogram sent whole with seq 0",
     .def_str = "chunks"},
    {.key = "first", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(lt_config_t, first),
     .doc = "windows, spectrogram: the chunks are the spectrogram's from this one on (a job cut at a start)",
     .def_int = 0, .min = 0, .max = 100000},
    {0},
};

enum { LT_CHUNKS, LT_WINDOWS, LT_SPECTROGRAM };

typedef struct lt_job {
  uint64_t job_id;
  uint64_t seq;
  int64_t count, seed, bad_at, pace_ms, first;
  int mode;
} lt_job_t;

static int32_t lt_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  (void)stage, (void)config, (void)err;
  *state = NULL;
  return SPN_OK;
}

static int32_t lt_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                           spn_error_t *err) {
  (void)stage, (void)state;
  lt_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  const lt_config_t *c = job->config;
  j->job_id = job->job_id;
  j->count = c->count;
  j->seed = c->seed;
  j->bad_at = c->bad_at; /* lt_faces' schema has no such key: its struct field stays 0 */
  j->pace_ms = c->pace_ms; /* likewise 0 for lt_mel */
  j->first = c->first;     /* and 0 for lt_faces */
  j->mode = LT_CHUNKS;     /* and NULL for lt_faces */
  if (c->mode && !strcmp(c->mode, "windows"))
    j->mode = LT_WINDOWS;
  else if (c->mode && !strcmp(c->mode, "spectrogram"))
    j->mode = LT_SPECTROGRAM;
  else if (c->mode && strcmp(c->mode, "chunks")) {
    free(j);
    return spn_error_set(err, SPN_ECONFIG, "lt_mel: mode \"%s\": chunks, windows or spectrogram", c->mode);
  }
  *job_state = j;
  return SPN_OK;
}

/* The job's spectrogram and its fps as two more items of msg. */
static int32_t lt_add_spectrogram(spn_stage_t *stage, lt_job_t *j, spn_msg_t *msg, spn_error_t *err) {
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = 80, t.shape[1] = lt_spec_cols(j->first + j->count);
  spn_buffer_t *buf = NULL;
  int32_t rc = host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err);
  if (rc != SPN_OK)
    return rc;
  float *m = host->buffer_data(buf);
  for (int32_t b = 0; b < 80; b++)
    for (int64_t c = 0; c < t.shape[1]; c++)
      m[b * t.shape[1] + c] = lt_spec(j->seed, b, c);
  rc = host->msg_add_tensor(msg, LT_SPEC_ITEM, &t, buf, err);
  host->buffer_unref(&buf);
  const double fps = 25.0;
  if (rc == SPN_OK)
    rc = host->msg_add_meta(msg, LT_SPEC_FPS_ITEM, &fps, sizeof fps, err);
  if (rc == SPN_OK && j->first > 0)
    rc = host->msg_add_meta(msg, LT_SPEC_FIRST_ITEM, &j->first, sizeof j->first, err);
  return rc;
}

static int32_t lt_send(spn_stage_t *stage, lt_job_t *j, const char *name, const spn_tensor_t *t, spn_buffer_t *buf,
                       const spn_face_t *faces, size_t n_faces, spn_error_t *err) {
  spn_envelope_t env = {.struct_size = sizeof env, .flags = SPN_MSG_KEY, .job_id = j->job_id, .seq = j->seq,
                        .pts = (double)j->seq / 25.0, .total = j->count};
  spn_msg_t *msg = NULL;
  int32_t rc = host->msg_new(stage, &env, &msg, err);
  if (rc == SPN_OK)
    rc = host->msg_add_tensor(msg, name, t, buf, err);
  if (rc == SPN_OK && faces)
    rc = host->msg_add_meta(msg, "faces", faces, n_faces * sizeof *faces, err);
  if (rc == SPN_OK && j->mode == LT_SPECTROGRAM && j->seq == 0)
    rc = lt_add_spectrogram(stage, j, msg, err);
  if (rc == SPN_OK)
    rc = host->emit(stage, 0, &msg, err);
  else
    host->msg_free(&msg);
  if (rc != SPN_OK)
    return rc;
  j->seq++;
  return (int64_t)j->seq >= j->count ? SPN_EOS : SPN_OK;
}

static int32_t lt_faces_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  (void)state;
  lt_job_t *j = job_state;
  if ((int64_t)j->seq >= j->count)
    return SPN_EOS;
  if (j->pace_ms > 0) {
    struct timespec ts = {.tv_sec = j->pace_ms / 1000, .tv_nsec = (long)(j->pace_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8;
  t.ndim = 3;
  t.shape[0] = LT_H, t.shape[1] = LT_W, t.shape[2] = 3;
  spn_buffer_t *buf = NULL;
  int32_t rc = host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err);
  if (rc != SPN_OK)
    return rc;
  uint8_t *p = host->buffer_data(buf);
  for (int32_t y = 0; y < LT_H; y++)
    for (int32_t x = 0; x < LT_W; x++)
      for (int32_t c = 0; c < 3; c++)
        p[(y * LT_W + x) * 3 + c] = lt_pixel(j->seed, j->seq, x, y, c);
  spn_face_t face;
  memset(&face, 0, sizeof face);
  face.x0 = LT_BOX_X0, face.y0 = LT_BOX_Y0, face.x1 = LT_BOX_X1, face.y1 = LT_BOX_Y1, face.score = 0.9f;
  rc = lt_send(stage, j, "frame", &t, buf, &face, lt_has_face(j->seq) ? 1 : 0, err);
  host->buffer_unref(&buf);
  return rc;
}

static int32_t lt_mel_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  (void)state;
  lt_job_t *j = job_state;
  if ((int64_t)j->seq >= j->count)
    return SPN_EOS;
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 3;
  t.shape[0] = 1, t.shape[1] = 80, t.shape[2] = (int64_t)j->seq == j->bad_at ? 8 : 16;
  spn_buffer_t *buf = NULL;
  int32_t rc = host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err);
  if (rc != SPN_OK)
    return rc;
  float *m = host->buffer_data(buf);
  int64_t cols = lt_spec_cols(j->first + j->count), start = lt_spec_start(j->first + (int64_t)j->seq, cols);
  for (int32_t b = 0; b < 80; b++)
    for (int32_t s = 0; s < t.shape[2]; s++)
      m[b * t.shape[2] + s] = j->mode == LT_CHUNKS ? lt_mel(j->seed, j->seq, b, s) : lt_spec(j->seed, b, start + s);
  rc = lt_send(stage, j, "mel", &t, buf, NULL, 0, err);
  host->buffer_unref(&buf);
  return rc;
}

static void lt_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  (void)stage, (void)state, (void)ok;
  free(job_state);
}

static void lt_destroy(spn_stage_t *stage, void *state) { (void)stage, (void)state; }

static const spn_port_t lt_faces_out[] = {{.name = "faces", .type = "faces"}};
static const spn_port_t lt_mel_out[] = {{.name = "mel", .type = "mel"}};

static int32_t lt_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  host = h;
  static const spn_stage_kind_t faces = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "lt_faces",
      .doc = "test source: patterned frames with a face box",
      .schema = lt_faces_schema,
      .config_size = sizeof(lt_config_t),
      .outputs = lt_faces_out,
      .n_outputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .create = lt_create,
      .job_open = lt_job_open,
      .generate = lt_faces_generate,
      .job_close = lt_job_close,
      .destroy = lt_destroy,
  };
  static const spn_stage_kind_t mel = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "lt_mel",
      .doc = "test source: patterned mel chunks",
      .schema = lt_mel_schema,
      .config_size = sizeof(lt_config_t),
      .outputs = lt_mel_out,
      .n_outputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .create = lt_create,
      .job_open = lt_job_open,
      .generate = lt_mel_generate,
      .job_close = lt_job_close,
      .destroy = lt_destroy,
  };
  int32_t rc = h->register_kind(plugin, &faces, err);
  return rc == SPN_OK ? h->register_kind(plugin, &mel, err) : rc;
}

SPN_PLUGIN_DEFINE(lipsynctest, .version = "1.0", .license = "Apache-2.0", .init = lt_init)
