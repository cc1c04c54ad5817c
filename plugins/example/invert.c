/* invert.c — an example third-party stage: 255 - v for every byte v >= threshold.
 * Built out of tree with only spindle/plugin.h: see Makefile and docs/plugins.md. */
#include <spindle/plugin.h>

typedef struct invert_config { int64_t threshold; } invert_config_t;

static const spn_config_field_t schema[] = {
    {.key = "threshold", .type = SPN_CONFIG_INT, .offset = offsetof(invert_config_t, threshold),
     .doc = "only bytes >= threshold are inverted", .def_int = 0, .min = 0, .max = 255},
    {0}};
static const spn_port_t ins[] = {{.name = "in", .type = "video"}}, outs[] = {{.name = "out", .type = "video"}};

static int32_t invert_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  *state = (void *)(intptr_t)((const invert_config_t *)config)->threshold; /* small enough to carry inline */
  return SPN_OK;
}
/* One frame in, one frame out: the helper does the messages and buffers. */
static int32_t invert_frame(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *in,
                            spn_tensor_t *out, spn_error_t *err) {
  if (in->dtype != SPN_DTYPE_U8)
    return spn_error_set(err, SPN_EINVAL, "invert: \"frame\" must be u8");
  const uint8_t *src = in->data;
  uint8_t *dst = out->data;
  for (size_t b = 0, n = spn_tensor_nbytes(in); b < n; b++)
    dst[b] = src[b] >= (intptr_t)state ? (uint8_t)(255 - src[b]) : src[b];
  return SPN_OK;
}
static const spn_frame_filter_t filter = {.cpu = invert_frame};
static int32_t invert_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                              spn_error_t *err) {
  return spn_frame_filter_process(stage, state, msgs, n, &filter, err);
}
static const spn_stage_kind_t kind = SPN_STAGE_KIND(.name = "invert", .doc = "inverts the colours of video frames",
    .schema = schema, .config_size = sizeof(invert_config_t), .inputs = ins, .n_inputs = 1, .outputs = outs,
    .n_outputs = 1, .create = invert_create, .process = invert_process);
static int32_t invert_init(const spn_host_api_t *host, spn_plugin_t *plugin, spn_error_t *err) {
  return host->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(invert, .version = "1.1", .license = "Apache-2.0", .init = invert_init)
