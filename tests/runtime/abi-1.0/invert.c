/* invert.c — an example third-party Spindle stage: inverts video frames
 * (255 - v for every byte v >= threshold). Built out of tree with only
 * spindle/plugin.h: see Makefile and docs/plugins.md. */
#include <spindle/plugin.h>

static const spn_host_api_t *host; /* stage callbacks reach the host through it */

typedef struct invert_config { int64_t threshold; } invert_config_t;

static const spn_config_field_t schema[] = {
    {.key = "threshold", .type = SPN_CONFIG_INT, .offset = offsetof(invert_config_t, threshold),
     .doc = "only bytes >= threshold are inverted", .def_int = 0, .min = 0, .max = 255},
    {0}};
static const spn_port_t in[] = {{.name = "in", .type = "video"}};
static const spn_port_t out[] = {{.name = "out", .type = "video"}};

static int32_t invert_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  *state = (void *)(intptr_t)((const invert_config_t *)config)->threshold; /* small enough to carry inline */
  return SPN_OK;
}

static int32_t invert_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                              spn_error_t *err) {
  for (size_t i = 0; i < n; i++) {
    spn_item_t it = {.struct_size = sizeof it};
    int64_t idx = host->msg_find(msgs[i], "frame");
    if (idx < 0 || host->msg_item(msgs[i], (size_t)idx, &it) != SPN_OK || it.tensor.dtype != SPN_DTYPE_U8) {
      host->fail_job(stage, host->msg_envelope(msgs[i])->job_id, SPN_EINVAL, "invert: no u8 \"frame\" item");
      continue;
    }
    size_t size = spn_tensor_nbytes(&it.tensor);
    spn_buffer_t *buf = NULL; /* a new buffer: the input may be shared with other stages */
    spn_msg_t *m = NULL;
    int32_t rc = host->buffer_new(stage, size, &buf, err);
    if (rc != SPN_OK)
      return rc;
    const uint8_t *src = host->buffer_data(it.buffer);
    uint8_t *dst = host->buffer_data(buf);
    for (size_t b = 0; b < size; b++)
      dst[b] = src[b] >= (intptr_t)state ? (uint8_t)(255 - src[b]) : src[b];
    if ((rc = host->msg_new_from(stage, msgs[i], &m, err)) == SPN_OK &&
        (rc = host->msg_add_tensor(m, "frame", &it.tensor, buf, err)) == SPN_OK)
      rc = host->emit(stage, 0, &m, err); /* consumes m */
    host->buffer_unref(&buf);
    host->msg_free(&m);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t invert_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t), .name = "invert", .doc = "inverts the colours of video frames",
      .schema = schema, .config_size = sizeof(invert_config_t), .inputs = in, .n_inputs = 1, .outputs = out,
      .n_outputs = 1, .device_need = SPN_NEED_CPU, .max_batch = 1, .create = invert_create,
      .process = invert_process};
  host = h;
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(invert, .version = "1.0", .license = "Apache-2.0", .init = invert_init)
