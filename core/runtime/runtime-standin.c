/* runtime-standin.c — TEMPORARY: a runtime without a loop, executors or
 * devices, so the front end (loader, validation, `spindle plugins`,
 * `spindle validate`) builds and is tested before the runtime branch lands.
 *
 * core/runtime/meson.build compiles this file only while the real runtime
 * (core/runtime/runtime.c) is absent; it goes away with the merge. Running
 * pipelines and jobs is refused with SPN_EUNSUPPORTED, never faked.
 */
#include <stdlib.h>

#include "spec-internal.h"

struct spn_runtime {
  spn_runtime_opts_t opts;
  spn__registry_t *reg;
};

int32_t spn_runtime_new(const spn_runtime_opts_t *opts, spn_runtime_t **out, spn_error_t *err) {
  spn_runtime_t *rt = calloc(1, sizeof *rt);
  if (!rt)
    return spn_error_set(err, SPN_ENOMEM, "runtime: out of memory");
  spn_runtime_opts_t def = SPN_RUNTIME_OPTS_INIT;
  rt->opts = opts ? *opts : def;
  int32_t rc = spn__registry_new(&rt->reg, err);
  if (rc != SPN_OK) {
    free(rt);
    return rc;
  }
  *out = rt;
  return SPN_OK;
}

void spn_runtime_free(spn_runtime_t **rt) {
  if (!rt || !*rt)
    return;
  spn__registry_free(&(*rt)->reg);
  free(*rt);
  *rt = NULL;
}

uint32_t spn_runtime_device_count(const spn_runtime_t *rt) { return 0; }
const char *spn_runtime_device_name(const spn_runtime_t *rt, uint32_t i) { return NULL; }

spn__registry_t *spn__runtime_registry(const spn_runtime_t *rt) { return rt->reg; }
const spn_host_api_t *spn__runtime_host_api(const spn_runtime_t *rt) { return spn__loader_host_api(); }
const spn_runtime_opts_t *spn__runtime_opts(const spn_runtime_t *rt) { return &rt->opts; }

#define NOT_YET(err) spn_error_set(err, SPN_EUNSUPPORTED, "running pipelines needs the runtime, not built in")

int32_t spn_pipeline_load(spn_runtime_t *rt, const char *path, const char *const *overrides, size_t n_overrides,
                          spn_pipeline_t **out, spn_error_t *err) {
  return NOT_YET(err);
}
int32_t spn_pipeline_load_string(spn_runtime_t *rt, const char *toml, size_t len, const char *name,
                                 const char *const *overrides, size_t n_overrides, spn_pipeline_t **out,
                                 spn_error_t *err) {
  return NOT_YET(err);
}
void spn_pipeline_free(spn_pipeline_t **pipe) {}
const char *spn_pipeline_name(const spn_pipeline_t *pipe) { return NULL; }
int32_t spn_job_start(spn_pipeline_t *pipe, const spn_job_params_t *params, const spn_job_callbacks_t *cb,
                      spn_job_t **out, spn_error_t *err) {
  return NOT_YET(err);
}
void spn_job_cancel(spn_job_t *job) {}
int32_t spn_job_wait(spn_job_t *job, spn_error_t *err) { return NOT_YET(err); }
uint64_t spn_job_id(const spn_job_t *job) { return 0; }
void spn_job_free(spn_job_t **job) {}
