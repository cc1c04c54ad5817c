/* synth.c — `synth`, a synthetic video source.
 *
 * Produces `frames` frames of width x height in `format` at `fps` for every
 * job, filled with the pattern of pattern.h keyed by (job, seq), so a sink
 * (`check`) can verify each frame arrived whole, in order and unmixed with
 * other jobs. Every message's envelope carries the job's total so progress
 * is known from the first frame. One frame per generate() call: the host
 * calls again while the edge has credit, which is what back-pressure needs.
 */
#include <stdlib.h>
#include <string.h>

#include "spindle/plugin.h"
#include "pattern.h"

typedef struct synth_config {
  int64_t frames;
  int64_t width;
  int64_t height;
  char *format;
  double fps;
} synth_config_t;

static const spn_config_field_t synth_schema[] = {
    {.key = "frames", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(synth_config_t, frames),
     .doc = "frames to produce per job", .def_int = 30, .min = 0, .max = 1e9},
    {.key = "width", .type = SPN_CONFIG_INT, .offset = offsetof(synth_config_t, width), .doc = "frame width in pixels",
     .def_int = 64, .min = 1, .max = 16384},
    {.key = "height", .type = SPN_CONFIG_INT, .offset = offsetof(synth_config_t, height),
     .doc = "frame height in pixels", .def_int = 48, .min = 1, .max = 16384},
    {.key = "format", .type = SPN_CONFIG_STRING, .offset = offsetof(synth_config_t, format),
     .doc = "pixel format: rgb24, gray8 or rgba32", .def_str = "rgb24"},
    {.key = "fps", .type = SPN_CONFIG_FLOAT, .offset = offsetof(synth_config_t, fps),
     .doc = "frame rate (sets pts = seq / fps)", .def_float = 25.0, .min = 0.001, .max = 1000.0},
    {0},
};

static const spn_port_t synth_outputs[] = {{.name = "video", .type = "video"}};

typedef struct synth_job {
  uint64_t job_id;
  uint64_t seq;
  int64_t frames;
} synth_job_t;

typedef struct synth_state {
  int64_t width, height, channels;
  double fps;
} synth_state_t;

static int32_t synth_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  const synth_config_t *c = config;
  int64_t ch = spn_synth_channels(c->format);
  if (!ch)
    return spn_error_set(err, SPN_ECONFIG, "stage \"%s\": format \"%s\" is not rgb24, gray8 or rgba32",
                         host->stage_get_name(stage), c->format);
  synth_state_t *s = calloc(1, sizeof *s);
  if (!s)
    return spn_error_set(err, SPN_ENOMEM, "synth: out of memory");
  s->width = c->width;
  s->height = c->height;
  s->channels = ch;
  s->fps = c->fps;
  *state = s;
  return SPN_OK;
}

static int32_t synth_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                              spn_error_t *err) {
  synth_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "synth: out of memory");
  j->job_id = job->job_id;
  j->frames = ((const synth_config_t *)job->config)->frames;
  *job_state = j;
  return SPN_OK;
}

static int32_t synth_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  synth_state_t *s = state;
  synth_job_t *j = job_state;
  if ((int64_t)j->seq >= j->frames)
    return SPN_EOS;
  if (host->job_cancelled(stage, j->job_id))
    return SPN_ECANCELLED;
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8;
  t.ndim = 3;
  t.shape[0] = s->height;
  t.shape[1] = s->width;
  t.shape[2] = s->channels;
  spn_buffer_t *buf = NULL;
  int32_t rc = host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err);
  if (rc != SPN_OK)
    return rc;
  spn_synth_fill(host->buffer_data(buf), j->job_id, j->seq, s->width, s->height, s->channels);
  spn_envelope_t env = {.struct_size = sizeof env, .flags = SPN_MSG_KEY, .job_id = j->job_id,
                        .seq = j->seq, .pts = (double)j->seq / s->fps, .total = j->frames};
  spn_msg_t *msg = NULL;
  rc = host->msg_new(stage, &env, &msg, err);
  if (rc == SPN_OK)
    rc = host->msg_add_tensor(msg, "frame", &t, buf, err);
  host->buffer_unref(&buf);
  if (rc != SPN_OK) {
    host->msg_free(&msg);
    return rc;
  }
  rc = host->emit(stage, 0, &msg, err);
  if (rc != SPN_OK)
    return rc;
  j->seq++;
  host->progress(stage, j->job_id, (int64_t)j->seq, j->frames);
  return (int64_t)j->seq >= j->frames ? SPN_EOS : SPN_OK;
}

static void synth_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) { free(job_state); }

static void synth_destroy(spn_stage_t *stage, void *state) { free(state); }

static int32_t synth_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "synth",
      .doc = "synthetic video source: a deterministic pattern per job and frame",
      .schema = synth_schema,
      .config_size = sizeof(synth_config_t),
      .outputs = synth_outputs,
      .n_outputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .create = synth_create,
      .job_open = synth_job_open,
      .generate = synth_generate,
      .job_close = synth_job_close,
      .destroy = synth_destroy,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(synth, .version = "1.0", .license = "Apache-2.0", .init = synth_init)
