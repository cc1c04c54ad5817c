/* check.c — `check`, a sink that verifies what reaches it.
 *
 * For every job it counts frames and enforces the stream rules of
 * check-logic.h (dense, strictly increasing seqs from 0; one end of stream,
 * after the last frame; the expected count). With verify_pattern it also
 * compares every byte of each frame with the `synth` pattern, which proves
 * that nothing on the way mixed jobs, reordered or corrupted frames. A
 * violation fails that job only, with a message that names the job and the
 * seq (the host adds the stage); other jobs go on. */
#include <stdlib.h>

#include "spindle/plugin.h"
#include "check-logic.h"
#include "pattern.h"


typedef struct check_config {
  int64_t expect_frames;
  bool verify_pattern;
} check_config_t;

static const spn_config_field_t check_schema[] = {
    {.key = "expect_frames", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB,
     .offset = offsetof(check_config_t, expect_frames),
     .doc = "frames each job must deliver (-1: only check the envelope's total)", .def_int = -1, .min = -1,
     .max = 1e12},
    {.key = "verify_pattern", .type = SPN_CONFIG_BOOL, .offset = offsetof(check_config_t, verify_pattern),
     .doc = "compare every frame with the synth pattern", .def_int = 0},
    {0},
};

static const spn_port_t check_inputs[] = {{.name = "in", .type = "any"}};

typedef struct check_job {
  uint64_t job_id;
  int64_t expect;
  bool verify;
  bool failed;
  spn_check_stream_t s;
} check_job_t;

static int32_t check_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                              spn_error_t *err) {
  const check_config_t *c = job->config;
  check_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "check: out of memory");
  j->job_id = job->job_id;
  j->expect = c->expect_frames;
  j->verify = c->verify_pattern;
  j->s = (spn_check_stream_t)SPN_CHECK_STREAM_INIT;
  *job_state = j;
  return SPN_OK;
}

static void check_fail(spn_stage_t *stage, check_job_t *j, const char *why) {
  const spn_host_api_t *host = spn_stage_host(stage);
  char msg[512];
  /* The host prefixes the stage's name; the job and what broke are ours. */
  snprintf(msg, sizeof msg, "job %llu: %s", (unsigned long long)j->job_id, why);
  j->failed = true;
  host->fail_job(stage, j->job_id, SPN_EPROTO, msg);
}

static void check_end(spn_stage_t *stage, check_job_t *j) {
  const spn_host_api_t *host = spn_stage_host(stage);
  char why[256];
  if (j->failed)
    return;
  if (!spn_check_eos(&j->s, j->expect, why, sizeof why))
    check_fail(stage, j, why);
  else
    host->log(stage, j->job_id, SPN_LOG_DEBUG, "%lld frames checked", (long long)j->s.frames);
}

static bool check_frame(spn_stage_t *stage, check_job_t *j, const spn_msg_t *m, uint64_t seq, char *why,
                        size_t size) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int64_t idx = host->msg_find(m, "frame");
  if (idx < 0) {
    snprintf(why, size, "seq %llu has no \"frame\" item", (unsigned long long)seq);
    return false;
  }
  spn_item_t it = {.struct_size = sizeof it};
  if (host->msg_item(m, (size_t)idx, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR ||
      it.tensor.dtype != SPN_DTYPE_U8 || it.tensor.ndim != 3 || !it.buffer ||
      host->buffer_size(it.buffer) < spn_tensor_nbytes(&it.tensor)) {
    snprintf(why, size, "seq %llu: \"frame\" is not an (H,W,C) u8 tensor", (unsigned long long)seq);
    return false;
  }
  const uint8_t *p = host->buffer_data(it.buffer);
  int64_t bad = spn_synth_verify(p, j->job_id, seq, it.tensor.shape[1], it.tensor.shape[0], it.tensor.shape[2]);
  if (bad >= 0) {
    snprintf(why, size, "seq %llu: frame byte %lld differs from the synth pattern", (unsigned long long)seq,
             (long long)bad);
    return false;
  }
  return true;
}

static int32_t check_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                             spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  for (size_t i = 0; i < n; i++) {
    check_job_t *j = job_states[i];
    if (j->failed)
      continue;
    const spn_envelope_t *env = host->msg_envelope(msgs[i]);
    char why[256];
    if (env->flags & SPN_MSG_EOS) {
      check_end(stage, j);
      continue;
    }
    bool skip = env->flags & SPN_MSG_SKIP;
    if (!spn_check_message(&j->s, env->seq, skip, env->total, why, sizeof why) ||
        (j->verify && !skip && !check_frame(stage, j, msgs[i], env->seq, why, sizeof why))) {
      check_fail(stage, j, why);
      continue;
    }
    host->progress(stage, j->job_id, j->s.frames, j->expect >= 0 ? j->expect : j->s.total);
  }
  return SPN_OK;
}

static int32_t check_flush(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  check_job_t *j = job_state;
  /* The end may already have come as an EOS message: one end, not two. */
  if (!j->s.eos)
    check_end(stage, j);
  return SPN_OK;
}

static void check_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) { free(job_state); }

static int32_t check_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "check",
      .doc = "sink that verifies seq order, end of stream, frame count and (optionally) the synth pattern",
      .schema = check_schema,
      .config_size = sizeof(check_config_t),
      .inputs = check_inputs,
      .n_inputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .job_open = check_job_open,
      .process = check_process,
      .flush = check_flush,
      .job_close = check_job_close,
      .flags = SPN_KIND_SEES_SKIPS, /* a dropped frame is not a gap */
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(check, .version = "1.0", .license = "Apache-2.0", .init = check_init)
