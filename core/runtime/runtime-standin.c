/* runtime-standin.c — TEMPORARY: a runtime without a loop, executors or
 * devices, so the front end (loader, validation, `spindle plugins`,
 * `spindle validate`) builds and is tested before the runtime branch lands.
 *
 * core/runtime/meson.build compiles this file only while the real runtime
 * (core/runtime/runtime.c) is absent; it goes away with the merge. Plugin
 * loading, listing and validation are the front end's real code; running
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

int32_t spn_runtime_load_plugin(spn_runtime_t *rt, const char *path, spn_error_t *err) {
  return spn__registry_load_file(rt->reg, NULL, path, err);
}

int32_t spn_runtime_load_plugins(spn_runtime_t *rt, spn_error_t *err) {
  return spn__registry_load_search_path(rt->reg, NULL, rt->opts.plugin_paths, rt->opts.n_plugin_paths, NULL, 0,
                                        err);
}

size_t spn_runtime_kind_count(const spn_runtime_t *rt) { return spn__registry_count(rt->reg); }

const spn_stage_kind_t *spn_runtime_kind_at(const spn_runtime_t *rt, size_t i, const char **plugin_file) {
  return spn__registry_at(rt->reg, i, plugin_file);
}

int32_t spn_pipeline_validate(spn_runtime_t *rt, const char *path, const char *const *overrides, size_t n_overrides,
                              spn_error_t *err) {
  spn__pipeline_spec_t *spec = NULL;
  int32_t rc = spn__spec_load(rt->reg, NULL, rt->opts.plugin_paths, rt->opts.n_plugin_paths, path, NULL, 0, overrides,
                              n_overrides, &spec, err);
  spn__spec_free(&spec);
  return rc;
}

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
