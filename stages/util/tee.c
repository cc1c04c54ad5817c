/* tee.c — `tee`, fan-out: every message goes to both output ports.
 *
 * A pipeline output port feeds exactly one input (that keeps credit and
 * ordering per edge simple); `tee` is how one stream reaches two consumers.
 * The copy is by reference: the new message shares the tensor buffers
 * (msg_add_tensor takes a reference) and copies the small metadata items,
 * so a 4K frame is never duplicated. The original goes to the last port. */
#include "spindle/plugin.h"


static const spn_port_t tee_inputs[] = {{.name = "in", .type = "any"}};
static const spn_port_t tee_outputs[] = {{.name = "out0", .type = "any"}, {.name = "out1", .type = "any"}};
#define TEE_PORTS 2u

/* A message with the same envelope and items as `from`, sharing buffers. */
static int32_t tee_copy(spn_stage_t *stage, const spn_msg_t *from, spn_msg_t **out, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_msg_t *m = NULL;
  int32_t rc = host->msg_new_from(stage, from, &m, err);
  size_t n = rc == SPN_OK ? host->msg_item_count(from) : 0;
  for (size_t i = 0; i < n && rc == SPN_OK; i++) {
    spn_item_t it = {.struct_size = sizeof it};
    rc = host->msg_item(from, i, &it);
    if (rc != SPN_OK) {
      spn_error_set(err, rc, "stage \"%s\": cannot read item %zu", host->stage_get_name(stage), i);
      break;
    }
    if (it.kind == SPN_ITEM_TENSOR)
      rc = host->msg_add_tensor(m, it.name, &it.tensor, it.buffer, err);
    else
      rc = host->msg_add_meta(m, it.name, it.meta, it.meta_size, err);
  }
  if (rc != SPN_OK) {
    host->msg_free(&m);
    return rc;
  }
  *out = m;
  return SPN_OK;
}

static int32_t tee_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                           spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  for (size_t i = 0; i < n; i++) {
    for (uint32_t port = 0; port + 1 < TEE_PORTS; port++) {
      spn_msg_t *copy = NULL;
      int32_t rc = tee_copy(stage, msgs[i], &copy, err);
      if (rc == SPN_OK)
        rc = host->emit(stage, port, &copy, err);
      if (rc != SPN_OK)
        return rc;
    }
    int32_t rc = host->emit(stage, TEE_PORTS - 1, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t tee_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "tee",
      .doc = "fan-out: sends every message to out0 and out1 (buffers shared, not copied)",
      .inputs = tee_inputs,
      .n_inputs = 1,
      .outputs = tee_outputs,
      .n_outputs = TEE_PORTS,
      .device_need = SPN_NEED_EITHER,
      .max_batch = 1,
      .process = tee_process,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(tee, .version = "1.0", .license = "Apache-2.0", .init = tee_init)
