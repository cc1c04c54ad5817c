/* fuzz-onnx.c — libFuzzer target over the ONNX loader.
 *
 * Every input is loaded as a model from memory: protobuf parsing, tensor
 * conversion, graph validation, constant folding and shape inference all run
 * on it. Anything but a clean success or a clean error (crash, sanitizer
 * report, leak, hang) is a finding. Built only with -Dfuzz=true and clang. */
#include <stddef.h>
#include <stdint.h>

#include "spindle/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  o.threads = 1;
  spn_engine_t *eng = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_engine_new(&o, &eng, &err))
    return 0;
  spn_model_t *m = NULL;
  if (spn_engine_load_memory(eng, data, size, "fuzz.onnx", "cpu", &m, &err) == SPN_OK) {
    /* Exercise inspection on whatever loaded. */
    for (int i = 0; i < spn_model_output_count(m); i++) {
      const char *name;
      int32_t dt, nd;
      int64_t sh[SPN_TENSOR_MAX_DIMS];
      spn_model_output_info(m, i, &name, &dt, &nd, sh);
    }
    (void)spn_model_flops(m);
    spn_model_release(&m);
  }
  spn_engine_free(&eng);
  return 0;
}
