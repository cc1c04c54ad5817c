/* host-model.c — the host table's model_* entries: a thin adapter to the
 * model engine (spindle/engine.h, built on the `engine` branch).
 *
 * The engine is not part of this build yet, so every entry refuses with
 * SPN_EUNSUPPORTED "model engine not built"; stages that need a model fail
 * at create/preload with that message, naming the stage. Wiring the engine
 * replaces only this file. */
#include "runtime-internal.h"

int32_t spn__host_model_load(spn_stage_t *s, const char *path, spn_model_t **out, spn_error_t *err) {
  if (out)
    *out = NULL;
  return spn_error_set(err, SPN_EUNSUPPORTED, "stage \"%s\": model \"%s\": model engine not built",
                       s ? s->srt->spec->name : "?", path ? path : "");
}

void spn__host_model_release(spn_stage_t *s, spn_model_t **model) {
  (void)s;
  if (model)
    *model = NULL;
}

int32_t spn__host_model_io_count(const spn_model_t *model, bool is_output) {
  (void)model;
  (void)is_output;
  return 0;
}

int32_t spn__host_model_io(const spn_model_t *model, bool is_output, int32_t i, const char **name, spn_tensor_t *desc) {
  (void)model;
  (void)is_output;
  (void)i;
  (void)name;
  (void)desc;
  return SPN_EUNSUPPORTED;
}

int32_t spn__host_model_run(spn_stage_t *s, spn_model_t *model, const spn_tensor_t *in, size_t n_in,
                            spn_tensor_t *out, size_t n_out, spn_error_t *err) {
  (void)model;
  (void)in;
  (void)n_in;
  (void)out;
  (void)n_out;
  return spn_error_set(err, SPN_EUNSUPPORTED, "stage \"%s\": model engine not built", s ? s->srt->spec->name : "?");
}

void spn__host_model_free_outputs(spn_model_t *model, spn_tensor_t *outputs, size_t n_out) {
  (void)model;
  (void)outputs;
  (void)n_out;
}
