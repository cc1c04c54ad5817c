// levels.cu — an example third-party GPU stage: out = clamp(in * gain / 256 + offset)
// on every byte of a u8 frame, as a CUDA kernel with its CPU twin (same integer
// arithmetic, so both give the same bytes). Built out of tree with nvcc and
// `pkg-config spindle-plugin`: see Makefile and docs/plugins.md.
#include <spindle/plugin-cuda.h>

typedef struct levels_config { int64_t gain, offset; } levels_config_t;

static const spn_config_field_t schema[] = {
    {.key = "gain", .type = SPN_CONFIG_INT, .offset = offsetof(levels_config_t, gain),
     .doc = "multiplier in 1/256 units (256 = 1.0)", .def_int = 256, .min = 0, .max = 4096},
    {.key = "offset", .type = SPN_CONFIG_INT, .offset = offsetof(levels_config_t, offset),
     .doc = "added after the gain", .def_int = 0, .min = -255, .max = 255},
    {}};
static const spn_port_t ins[] = {{"in", "video"}}, outs[] = {{"out", "video"}};

__host__ __device__ static inline uint8_t level(uint8_t v, int g, int o) {
  int x = v * g / 256 + o;
  return (uint8_t)(x < 0 ? 0 : x > 255 ? 255 : x);
}

__global__ static void levels_kernel(const uint8_t *in, uint8_t *out, size_t n, int g, int o) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = level(in[i], g, o);
}

static int32_t levels_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const levels_config_t *c = (const levels_config_t *)config; // gain and offset packed in the state pointer
  *state = (void *)(intptr_t)(c->gain << 16 | (c->offset + 255));
  return SPN_OK;
}

static int32_t levels_check(spn_stage_t *, void *, const spn_msg_t *, const spn_tensor_t *in, spn_tensor_t *,
                            spn_error_t *err) {
  return in->dtype == SPN_DTYPE_U8 ? SPN_OK : spn_error_set(err, SPN_EINVAL, "levels: \"frame\" must be u8");
}

static int32_t levels_cpu(spn_stage_t *, void *state, const spn_msg_t *, const spn_tensor_t *in, spn_tensor_t *out,
                          spn_error_t *) {
  int g = (int)((intptr_t)state >> 16), o = (int)((intptr_t)state & 0xffff) - 255;
  for (size_t i = 0, n = spn_tensor_nbytes(in); i < n; i++)
    ((uint8_t *)out->data)[i] = level(((const uint8_t *)in->data)[i], g, o);
  return SPN_OK;
}

static int32_t levels_cuda(spn_stage_t *, void *state, const spn_msg_t *, const spn_tensor_t *in, spn_tensor_t *out,
                           void *stream, spn_error_t *err) {
  int g = (int)((intptr_t)state >> 16), o = (int)((intptr_t)state & 0xffff) - 255;
  size_t n = spn_tensor_nbytes(in);
  unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
  levels_kernel<<<blocks ? blocks : 1, 256, 0, (cudaStream_t)stream>>>((const uint8_t *)in->data,
                                                                        (uint8_t *)out->data, n, g, o);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? SPN_OK : spn_error_set(err, SPN_EINTERNAL, "levels: %s", cudaGetErrorString(e));
}

static const spn_frame_filter_t filter = {
    .shape = levels_check, .cpu = levels_cpu, .cuda = levels_cuda};

static int32_t levels_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **, size_t n,
                              spn_error_t *err) {
  return spn_frame_filter_process_cuda(stage, state, msgs, n, &filter, err);
}

static const spn_stage_kind_t kind = SPN_STAGE_KIND(.name = "levels", .doc = "gain and offset on u8 frames (CUDA)",
    .schema = schema, .config_size = sizeof(levels_config_t), .inputs = ins, .n_inputs = 1, .n_outputs = 1,
    .outputs = outs, .device_need = SPN_NEED_EITHER, .create = levels_create, .process = levels_process);

static int32_t levels_init(const spn_host_api_t *host, spn_plugin_t *plugin, spn_error_t *err) {
  return host->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(levels, .version = "1.1", .license = "Apache-2.0", .init = levels_init)
