/* frontend-stub.c — TEMPORARY weak stand-ins for the front end and TOML.
 *
 * The registry and spec builder (branch `frontend`) are written in
 * parallel. Until they land, these weak definitions let the runtime link and
 * its tests run against specs built in C. Each is weak, so the real (strong)
 * definitions replace them at link time without a conflict; delete this
 * file once the frontend branch is merged. Nothing here is used by a build
 * that has the front end. */
#include <stdlib.h>
#include <string.h>

#include "spec-internal.h"

#define WEAK __attribute__((weak))

struct spn__registry {
  const spn_stage_kind_t **kinds;
  char **origins;
  size_t n;
};

WEAK int32_t spn__registry_new(spn__registry_t **out, spn_error_t *err) {
  *out = calloc(1, sizeof **out);
  return *out ? SPN_OK : spn_error_set(err, SPN_ENOMEM, "out of memory creating the registry");
}

WEAK void spn__registry_free(spn__registry_t **reg) {
  if (!reg || !*reg)
    return;
  for (size_t i = 0; i < (*reg)->n; i++)
    free((*reg)->origins[i]);
  free((*reg)->origins);
  free((*reg)->kinds);
  free(*reg);
  *reg = NULL;
}

WEAK int32_t spn__registry_load_file(spn__registry_t *reg, const spn_host_api_t *host, const char *path,
                                     spn_error_t *err) {
  (void)reg;
  (void)host;
  return spn_error_set(err, SPN_EUNSUPPORTED, "%s: plugin loader not built", path);
}

WEAK int32_t spn__registry_add_kind(spn__registry_t *reg, const spn_stage_kind_t *kind, const char *origin,
                                    spn_error_t *err) {
  for (size_t i = 0; i < reg->n; i++)
    if (!strcmp(reg->kinds[i]->name, kind->name))
      return spn_error_set(err, SPN_EEXIST, "stage kind \"%s\" is already registered", kind->name);
  const spn_stage_kind_t **k = realloc(reg->kinds, (reg->n + 1) * sizeof *k);
  if (k)
    reg->kinds = k;
  char **o = realloc(reg->origins, (reg->n + 1) * sizeof *o);
  if (o)
    reg->origins = o;
  char *dup = strdup(origin ? origin : "");
  if (!k || !o || !dup) {
    free(dup);
    return spn_error_set(err, SPN_ENOMEM, "out of memory registering \"%s\"", kind->name);
  }
  reg->kinds[reg->n] = kind;
  reg->origins[reg->n++] = dup;
  return SPN_OK;
}

WEAK const spn_stage_kind_t *spn__registry_find(const spn__registry_t *reg, const char *name, const char **origin) {
  for (size_t i = 0; i < reg->n; i++)
    if (!strcmp(reg->kinds[i]->name, name)) {
      if (origin)
        *origin = reg->origins[i];
      return reg->kinds[i];
    }
  return NULL;
}

WEAK size_t spn__registry_count(const spn__registry_t *reg) { return reg->n; }

WEAK const spn_stage_kind_t *spn__registry_at(const spn__registry_t *reg, size_t i, const char **origin) {
  if (i >= reg->n)
    return NULL;
  if (origin)
    *origin = reg->origins[i];
  return reg->kinds[i];
}

WEAK int32_t spn__spec_from_toml(const spn__registry_t *reg, const spn_toml_doc_t *doc, const char *const *overrides,
                                 size_t n_overrides, spn__pipeline_spec_t **out, spn_error_t *err) {
  (void)reg;
  (void)doc;
  (void)overrides;
  (void)n_overrides;
  *out = NULL;
  return spn_error_set(err, SPN_EUNSUPPORTED, "pipeline front end not built");
}

WEAK void spn__spec_free(spn__pipeline_spec_t **spec) {
  if (spec)
    *spec = NULL; /* this stub never creates one */
}

WEAK int32_t spn__spec_job_config(const spn__pipeline_spec_t *spec, uint32_t i, const char *const *overrides,
                                  size_t n_overrides, void **out, spn_error_t *err) {
  (void)spec;
  (void)i;
  (void)overrides;
  (void)n_overrides;
  *out = NULL;
  return spn_error_set(err, SPN_EUNSUPPORTED, "per-job overrides need the pipeline front end, not built");
}

WEAK void spn__config_free(const spn_stage_kind_t *kind, void **config) {
  (void)kind;
  if (config) {
    free(*config);
    *config = NULL;
  }
}

WEAK int32_t spn__plugin_register_kind(spn_plugin_t *plugin, const spn_stage_kind_t *kind, spn_error_t *err) {
  (void)plugin;
  (void)kind;
  return spn_error_set(err, SPN_ESTATE, "register_kind: plugin loader not built");
}

WEAK void spn__plugin_set_data(spn_plugin_t *plugin, void *data) {
  (void)plugin;
  (void)data;
}

WEAK int32_t spn__registry_load_search_path(spn__registry_t *reg, const spn_host_api_t *host, const char *const *dirs,
                                            size_t n_dirs, const char *const *config_dirs, size_t n_config_dirs,
                                            spn_error_t *err) {
  (void)reg;
  (void)host;
  (void)dirs;
  (void)n_dirs;
  (void)config_dirs;
  (void)n_config_dirs;
  return spn_error_set(err, SPN_EUNSUPPORTED, "plugin loader not built");
}

WEAK int32_t spn__spec_load(spn__registry_t *reg, const spn_host_api_t *host, const char *const *plugin_dirs,
                            size_t n_plugin_dirs, const char *path, const char *src, size_t len,
                            const char *const *overrides, size_t n_overrides, spn__pipeline_spec_t **out,
                            spn_error_t *err) {
  (void)reg;
  (void)host;
  (void)plugin_dirs;
  (void)n_plugin_dirs;
  (void)src;
  (void)len;
  (void)overrides;
  (void)n_overrides;
  *out = NULL;
  return spn_error_set(err, SPN_EUNSUPPORTED, "%s: pipeline front end not built", path ? path : "<string>");
}
