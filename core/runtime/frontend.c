/* frontend.c — the public runtime.h functions that belong to the front end:
 * loading plugins into a runtime, listing its stage kinds, and validating a
 * pipeline config without instantiating anything.
 *
 * They only reach the runtime through the three accessors of
 * spec-internal.h (its registry, its host API table, its options), so the
 * runtime keeps its structure to itself. Everything that needs a loop,
 * executors or devices (spn_pipeline_load, jobs) is the runtime's.
 */
#include "spec-internal.h"

int32_t spn_runtime_load_plugin(spn_runtime_t *rt, const char *path, spn_error_t *err) {
  if (!rt || !path)
    return spn_error_set(err, SPN_EINVAL, "spn_runtime_load_plugin: NULL argument");
  return spn__registry_load_file(spn__runtime_registry(rt), spn__runtime_host_api(rt), path, err);
}

int32_t spn_runtime_load_plugins(spn_runtime_t *rt, spn_error_t *err) {
  if (!rt)
    return spn_error_set(err, SPN_EINVAL, "spn_runtime_load_plugins: NULL runtime");
  const spn_runtime_opts_t *o = spn__runtime_opts(rt);
  return spn__registry_load_search_path(spn__runtime_registry(rt), spn__runtime_host_api(rt), o->plugin_paths,
                                        o->n_plugin_paths, NULL, 0, err);
}

size_t spn_runtime_kind_count(const spn_runtime_t *rt) { return rt ? spn__registry_count(spn__runtime_registry(rt)) : 0; }

const spn_stage_kind_t *spn_runtime_kind_at(const spn_runtime_t *rt, size_t i, const char **plugin_file) {
  return rt ? spn__registry_at(spn__runtime_registry(rt), i, plugin_file) : NULL;
}
int32_t spn_pipeline_validate(spn_runtime_t *rt, const char *path, const char *const *overrides, size_t n_overrides,
                              spn_error_t *err) {
  if (!rt || !path)
    return spn_error_set(err, SPN_EINVAL, "spn_pipeline_validate: NULL argument");
  const spn_runtime_opts_t *o = spn__runtime_opts(rt);
  spn__pipeline_spec_t *spec = NULL;
  int32_t rc = spn__spec_load(spn__runtime_registry(rt), spn__runtime_host_api(rt), o->plugin_paths,
                              o->n_plugin_paths, path, NULL, 0, overrides, n_overrides, &spec, err);
  spn__spec_free(&spec);
  return rc;
}
