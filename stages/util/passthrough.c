/* passthrough.c — `passthrough`, forwards every message unchanged.
 *
 * The smallest possible filter: it owns no state and moves the message it
 * was given (no copy, no new reference), so it measures the cost of one hop
 * and tests the wiring between two stages without touching the data. */
#include "spindle/plugin.h"


static const spn_port_t pt_inputs[] = {{.name = "in", .type = "any"}};
static const spn_port_t pt_outputs[] = {{.name = "out", .type = "any"}};

static int32_t pt_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                          spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  for (size_t i = 0; i < n; i++) {
    int32_t rc = host->emit(stage, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t pt_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "passthrough",
      .doc = "forwards every message unchanged",
      .inputs = pt_inputs,
      .n_inputs = 1,
      .outputs = pt_outputs,
      .n_outputs = 1,
      .device_need = SPN_NEED_EITHER,
      .max_batch = 1,
      .process = pt_process,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(passthrough, .version = "1.0", .license = "Apache-2.0", .init = pt_init)
