/* rawwriter.c — a user's plugin for the job tests: kind "encode_raw", a
 * sink that writes one line per frame ("seq N, B bytes") to the per-job
 * `path`. Its kind name starts like the media plugin's encoders, but the
 * file is not media: the job service must leave its output names alone
 * (no container check at submit, no segment join), because a stage's kind
 * name says nothing about which plugin it belongs to.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/plugin.h"

typedef struct rawwriter_config {
  char *path;
} rawwriter_config_t;

static const spn_config_field_t rawwriter_schema[] = {
    {.key = "path", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(rawwriter_config_t, path),
     .doc = "text file each job's frame list is written to", .def_str = ""},
    {0},
};

static const spn_port_t rawwriter_inputs[] = {{.name = "in", .type = "any"}};

static int32_t rawwriter_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                                  spn_error_t *err) {
  const rawwriter_config_t *c = job->config;
  if (!c->path || !*c->path)
    return spn_error_set(err, SPN_EINVAL, "encode_raw: no path");
  FILE *f = fopen(c->path, "w");
  if (!f)
    return spn_error_set(err, SPN_EIO, "encode_raw: %s: %s", c->path, strerror(errno));
  *job_state = f;
  return SPN_OK;
}

static int32_t rawwriter_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                                 spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  for (size_t i = 0; i < n; i++) {
    const spn_envelope_t *env = host->msg_envelope(msgs[i]);
    if (env->flags & (SPN_MSG_EOS | SPN_MSG_SKIP))
      continue;
    int64_t idx = host->msg_find(msgs[i], "frame");
    spn_item_t it = {.struct_size = sizeof it};
    size_t bytes = 0;
    if (idx >= 0 && host->msg_item(msgs[i], (size_t)idx, &it) == SPN_OK && it.kind == SPN_ITEM_TENSOR)
      bytes = spn_tensor_nbytes(&it.tensor);
    if (fprintf(job_states[i], "seq %llu, %zu bytes\n", (unsigned long long)env->seq, bytes) < 0)
      return spn_error_set(err, SPN_EIO, "encode_raw: write: %s", strerror(errno));
  }
  return SPN_OK;
}

static void rawwriter_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  if (job_state)
    fclose(job_state);
}

static int32_t rawwriter_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "encode_raw",
      .doc = "writes one line per frame (seq, bytes) to the per-job path",
      .schema = rawwriter_schema,
      .config_size = sizeof(rawwriter_config_t),
      .inputs = rawwriter_inputs,
      .n_inputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .job_open = rawwriter_job_open,
      .process = rawwriter_process,
      .job_close = rawwriter_job_close,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(rawwriter, .version = "1.0", .license = "Apache-2.0", .init = rawwriter_init)
