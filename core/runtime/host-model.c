/* host-model.c — the host table's model_* entries: a thin adapter from the
 * plugin ABI to the model engine (spindle/engine.h).
 *
 * One engine per runtime, created on the first model load (a runtime whose
 * pipelines use no model never initialises oneDNN). The engine's registry
 * is keyed by (canonical path, device), so every instance placed on one
 * device shares one copy of a model's weights, and instances on different
 * (real or emulated) devices get their own: "models load once per device".
 * Errors name the stage and the model file. */
#include <pthread.h>

#include "runtime-internal.h"
#include "spindle/engine.h"

static const char *stage_name(const spn_stage_t *s) { return s ? s->srt->spec->name : "?"; }

static int32_t runtime_engine(spn_runtime_t *rt, spn_engine_t **out, spn_error_t *err) {
  int32_t rc = SPN_OK;
  pthread_mutex_lock(&rt->engmu);
  if (!rt->engine) {
    spn_engine_opts_t opts = SPN_ENGINE_OPTS_INIT;
    opts.threads = (int32_t)rt->opts.cpu_threads;
    rc = spn_engine_new(&opts, &rt->engine, err);
  }
  *out = rt->engine;
  pthread_mutex_unlock(&rt->engmu);
  return rc;
}

int32_t spn__host_model_load(spn_stage_t *s, const char *path, spn_model_t **out, spn_error_t *err) {
  if (out)
    *out = NULL;
  if (!s || !path || !out)
    return spn_error_set(err, SPN_EINVAL, "model_load: stage, path and out are required");
  spn_engine_t *eng = NULL;
  int32_t rc = runtime_engine(s->pipe->rt, &eng, err);
  if (rc != SPN_OK)
    return spn_error_prefix(err, "stage \"%s\"", stage_name(s));
  const char *device = s->device ? spn_device_name(s->device) : "cpu";
  rc = spn_engine_load(eng, path, device, out, err);
  if (rc != SPN_OK)
    spn_error_prefix(err, "stage \"%s\" on %s", stage_name(s), device);
  return rc;
}

void spn__host_model_release(spn_stage_t *s, spn_model_t **model) {
  (void)s;
  spn_model_release(model);
}

int32_t spn__host_model_io_count(const spn_model_t *model, bool is_output) {
  if (!model)
    return 0;
  return is_output ? spn_model_output_count(model) : spn_model_input_count(model);
}

int32_t spn__host_model_io(const spn_model_t *model, bool is_output, int32_t i, const char **name,
                           spn_tensor_t *desc) {
  if (!model)
    return SPN_EINVAL;
  int32_t dtype = 0, ndim = 0;
  int64_t shape[SPN_TENSOR_MAX_DIMS] = {0};
  const char *n = NULL;
  int32_t rc = is_output ? spn_model_output_info(model, i, &n, &dtype, &ndim, shape)
                         : spn_model_input_info(model, i, &n, &dtype, &ndim, shape);
  if (rc != SPN_OK)
    return rc;
  if (name)
    *name = n;
  if (desc) {
    uint32_t size = desc->struct_size ? desc->struct_size : (uint32_t)sizeof *desc;
    spn_tensor_t t = SPN_TENSOR_INIT;
    t.dtype = dtype;
    t.ndim = ndim;
    for (int32_t d = 0; d < ndim && d < SPN_TENSOR_MAX_DIMS; d++)
      t.shape[d] = shape[d];
    memcpy(desc, &t, size < sizeof t ? size : sizeof t);
    desc->struct_size = size;
  }
  return SPN_OK;
}

int32_t spn__host_model_run(spn_stage_t *s, spn_model_t *model, const spn_tensor_t *in, size_t n_in,
                            spn_tensor_t *out, size_t n_out, spn_error_t *err) {
  if (!model)
    return spn_error_set(err, SPN_EINVAL, "stage \"%s\": model_run without a model", stage_name(s));
  int32_t rc = spn_model_run(model, in, (int32_t)n_in, out, (int32_t)n_out, err);
  if (rc != SPN_OK)
    spn_error_prefix(err, "stage \"%s\"", stage_name(s));
  return rc;
}

void spn__host_model_free_outputs(spn_model_t *model, spn_tensor_t *outputs, size_t n_out) {
  (void)model;
  for (size_t i = 0; outputs && i < n_out; i++)
    if (outputs[i].data)
      spn_model_output_free(&outputs[i]);
}
