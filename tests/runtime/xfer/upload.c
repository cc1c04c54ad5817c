/* upload.c — `upload`, a test stage that copies every frame itself with the
 * host's buffer_copy (ABI 1.1), so tests can count what a stage moves.
 *
 * Each message's "frame" tensor is copied into a new buffer of device
 * memory on the instance's device (an upload: host to device; on cpu:N the
 * device memory is emulated) and the message goes on holding that buffer.
 * Per frame it can also copy `back` bytes of the upload into host memory (a
 * download, checked against the input on the CPU) and `untagged` bytes
 * host to host for no job (job id 0: counted for the stage, never for a
 * job). Before its first copy of a message it asks for a range one byte too
 * long and fails the job unless that is refused (SPN_EINVAL) — a refused
 * copy must count nothing, which the tests' exact byte counts then show.
 * Built only for the tests; reaches the host through the stage.
 *
 * `hang`, a second test stage: passes every message on, except that the
 * call given the message of seq `at` (a per-job key; -1: none) never
 * returns — a plugin stuck in a call, for the job service's cancel grace. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spindle/plugin.h"

typedef struct upload_config {
  int64_t back;
  int64_t untagged;
} upload_config_t;

static const spn_config_field_t upload_schema[] = {
    {.key = "back", .type = SPN_CONFIG_INT, .offset = offsetof(upload_config_t, back), .def_int = 0, .min = 0,
     .max = 1 << 30, .doc = "bytes of each upload copied back to host memory"},
    {.key = "untagged", .type = SPN_CONFIG_INT, .offset = offsetof(upload_config_t, untagged), .def_int = 0,
     .min = 0, .max = 1 << 30, .doc = "bytes per frame copied host to host for no job"},
    {0},
};

static const spn_port_t upload_in[] = {{.name = "in", .type = "any"}};
static const spn_port_t upload_out[] = {{.name = "out", .type = "any"}};
static const spn_port_caps_t upload_out_caps[] = {
    {.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SPN_MEMSET_DEVICE}};

static int32_t upload_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  if (!SPN_HOST_HAS(host, buffer_copy))
    return spn_error_set(err, SPN_EUNSUPPORTED, "upload: the host has no buffer_copy");
  upload_config_t *c = malloc(sizeof *c);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "upload: out of memory");
  *c = *(const upload_config_t *)config;
  *state = c;
  return SPN_OK;
}

static void upload_destroy(spn_stage_t *stage, void *state) {
  (void)stage;
  free(state);
}

/* Copy `n` bytes from `src` into a new host buffer for `job` and, on the
 * CPU, check them against `want`. */
static int32_t copy_to_host(spn_stage_t *stage, uint64_t job, spn_buffer_t *src, size_t n, const uint8_t *want,
                            spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_buffer_t *b = NULL;
  int32_t rc = host->buffer_new_kind(stage, n ? n : 1, SPN_MEM_HOST, &b, err);
  if (rc == SPN_OK && (rc = host->buffer_copy(stage, job, b, 0, src, 0, n, err)) == SPN_OK && want &&
      memcmp(host->buffer_data(b), want, n) != 0)
    rc = spn_error_set(err, SPN_EINVAL, "upload: the bytes copied back differ from the input");
  host->buffer_unref(&b);
  return rc;
}

static int32_t upload_one(spn_stage_t *stage, const upload_config_t *c, spn_msg_t **msgp, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  uint64_t job = host->msg_envelope(*msgp)->job_id;
  int64_t idx = host->msg_find(*msgp, "frame");
  spn_item_t it;
  memset(&it, 0, sizeof it);
  it.struct_size = sizeof it;
  if (idx < 0 || host->msg_item(*msgp, (size_t)idx, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR)
    return host->emit(stage, 0, msgp, err);
  int32_t dev_kind = 0, dev_index = 0;
  host->stage_get_device(stage, &dev_kind, &dev_index);
  size_t nb = spn_tensor_nbytes(&it.tensor);
  bool host_in = host->buffer_mem_kind(it.buffer) != SPN_MEM_DEVICE;
  const uint8_t *in = dev_kind == SPN_DEVICE_CPU && host_in ? host->buffer_data(it.buffer) : NULL;
  spn_buffer_t *dev = NULL, *scratch = NULL;
  spn_msg_t *out = NULL;
  spn_error_t probe = SPN_ERROR_INIT;
  int32_t rc = host->buffer_new_kind(stage, nb, SPN_MEM_DEVICE, &dev, err);
  if (rc == SPN_OK && host->buffer_copy(stage, job, dev, 0, it.buffer, 0, nb + 1, &probe) != SPN_EINVAL)
    rc = spn_error_set(err, SPN_EINVAL, "upload: a copy of %zu bytes into %zu was not refused", nb + 1, nb);
  if (rc == SPN_OK)
    rc = host->buffer_copy(stage, job, dev, 0, it.buffer, 0, nb, err);
  if (rc == SPN_OK && c->back)
    rc = copy_to_host(stage, job, dev, (size_t)c->back < nb ? (size_t)c->back : nb, in, err);
  if (rc == SPN_OK && c->untagged && (rc = host->buffer_new_kind(stage, (size_t)c->untagged, SPN_MEM_HOST,
                                                                 &scratch, err)) == SPN_OK)
    rc = host->buffer_copy(stage, 0, scratch, 0, it.buffer, 0,
                           (size_t)c->untagged < nb ? (size_t)c->untagged : nb, err);
  host->buffer_unref(&scratch);
  if (rc == SPN_OK && (rc = host->buffer_set_ready(stage, dev, err)) == SPN_OK &&
      (rc = host->msg_clone(stage, *msgp, &out, err)) == SPN_OK)
    rc = host->msg_replace_tensor(out, (size_t)idx, &it.tensor, dev, err);
  host->buffer_unref(&dev);
  if (rc != SPN_OK) { /* this frame's job fails; the batch goes on */
    host->fail_job(stage, job, rc, err && err->msg[0] ? err->msg : "upload failed");
    host->msg_free(&out);
    host->msg_free(msgp);
    return SPN_OK;
  }
  host->msg_free(msgp);
  return host->emit(stage, 0, &out, err);
}

static int32_t upload_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                              spn_error_t *err) {
  (void)job_states;
  for (size_t i = 0; i < n; i++) {
    int32_t rc = upload_one(stage, state, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

typedef struct hang_config {
  int64_t at;
} hang_config_t;

static const spn_config_field_t hang_schema[] = {
    {.key = "at", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(hang_config_t, at),
     .def_int = -1, .min = -1, .max = 1 << 30, .doc = "the seq whose call never returns (-1: none)"},
    {0},
};

static int32_t hang_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *info, void **job_state,
                             spn_error_t *err) {
  (void)stage, (void)state, (void)err;
  *job_state = (void *)(intptr_t)((const hang_config_t *)info->config)->at;
  return SPN_OK;
}

static int32_t hang_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                            spn_error_t *err) {
  (void)state;
  const spn_host_api_t *host = spn_stage_host(stage);
  for (size_t i = 0; i < n; i++) {
    int64_t at = (int64_t)(intptr_t)job_states[i];
    if (at >= 0 && host->msg_envelope(msgs[i])->seq == (uint64_t)at)
      for (;;)
        sleep(3600); /* stuck for good: only the process's exit ends it */
    int32_t rc = host->emit(stage, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t upload_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = SPN_STAGE_KIND(
      .name = "upload", .doc = "copies each frame into device memory with buffer_copy (a test stage)",
      .schema = upload_schema, .config_size = sizeof(upload_config_t), .inputs = upload_in, .n_inputs = 1,
      .outputs = upload_out, .n_outputs = 1, .device_need = SPN_NEED_EITHER, .max_batch = 4,
      .process = upload_process, .create = upload_create, .destroy = upload_destroy, .output_caps = upload_out_caps);
  static const spn_stage_kind_t hang = SPN_STAGE_KIND(
      .name = "hang", .doc = "passes messages on; the call of seq `at` never returns (a test stage)",
      .schema = hang_schema, .config_size = sizeof(hang_config_t), .inputs = upload_in, .n_inputs = 1,
      .outputs = upload_out, .n_outputs = 1, .device_need = SPN_NEED_EITHER, .max_batch = 1,
      .job_open = hang_job_open, .process = hang_process);
  int32_t rc = h->register_kind(plugin, &kind, err);
  return rc == SPN_OK ? h->register_kind(plugin, &hang, err) : rc;
}

SPN_PLUGIN_DEFINE(xfertest, .version = "1.0", .license = "Apache-2.0", .init = upload_init)
