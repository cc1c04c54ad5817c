/* spec-internal.h — the contract between the pipeline front end (plugin
 * loader, config validation) and the runtime back end (actors, edges).
 *
 * The front end turns plugins + a pipeline TOML into a validated
 * spn__pipeline_spec_t; the back end instantiates it. Nothing here is
 * installed or visible to plugins. */
#ifndef SPINDLE_SPEC_INTERNAL_H
#define SPINDLE_SPEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/plugin.h"
#include "spindle/runtime.h"
#include "spindle/toml.h"

/* ---- registry of stage kinds (front end owns the implementation) ------- */

typedef struct spn__registry spn__registry_t;

int32_t spn__registry_new(spn__registry_t **out, spn_error_t *err);
/* Runs every plugin's fini, dlcloses, frees. */
void spn__registry_free(spn__registry_t **reg);
/* dlopen a plugin file and apply every refusal rule (see plugin.h). */
int32_t spn__registry_load_file(spn__registry_t *reg, const spn_host_api_t *host, const char *path,
                                spn_error_t *err);
/* Add a kind that is not from a file (tests, built-ins). A duplicate name
 * is refused. The kind must outlive the registry. */
int32_t spn__registry_add_kind(spn__registry_t *reg, const spn_stage_kind_t *kind, const char *origin,
                               spn_error_t *err);
const spn_stage_kind_t *spn__registry_find(const spn__registry_t *reg, const char *name, const char **origin);
size_t spn__registry_count(const spn__registry_t *reg);
const spn_stage_kind_t *spn__registry_at(const spn__registry_t *reg, size_t i, const char **origin);

/* The loader's side of the host API table. The runtime's spn_host_api_t sets
 * .register_kind = spn__plugin_register_kind and .plugin_set_data =
 * spn__plugin_set_data (they act on the spn_plugin_t the loader hands to
 * init). spn__loader_host_api() is a table holding only those two, for
 * loading without a runtime (validation, listing, tests); a NULL `host` in
 * spn__registry_load_file means that table. Thread: the loading thread. */
/* Plugins keep the host table pointer they get in init in a static (stage
 * callbacks receive no other way to reach it), so the table passed to
 * spn__registry_load_file must stay valid as long as any registry in the
 * process has that plugin loaded: a static const table is the safe choice. */
int32_t spn__plugin_register_kind(spn_plugin_t *plugin, const spn_stage_kind_t *kind, spn_error_t *err);
void spn__plugin_set_data(spn_plugin_t *plugin, void *data);
const spn_host_api_t *spn__loader_host_api(void);

/* Whether a plugin of that name (the <name> of libspindle-<name>.so) is
 * loaded. */
bool spn__registry_has_plugin(const spn__registry_t *reg, const char *name);
/* Load every libspindle-*.so of the search path, in this order: `dirs`
 * (CLI --plugin-path), $SPINDLE_PLUGIN_PATH (colon separated), `config_dirs`
 * ([plugins] path of a pipeline config), then the install directory
 * SPN_PLUGINDIR. Within a folder files load in name order. A plugin whose
 * name is already loaded is skipped (an earlier folder shadows a later
 * one). Refusals do not stop the walk: every other plugin still loads, the
 * first refusal is returned in err. A folder that does not exist is
 * skipped. Thread: any (reg is the caller's). */
int32_t spn__registry_load_search_path(spn__registry_t *reg, const spn_host_api_t *host, const char *const *dirs,
                                       size_t n_dirs, const char *const *config_dirs, size_t n_config_dirs,
                                       spn_error_t *err);

/* ---- validated pipeline description ------------------------------------ */

typedef struct spn__edge_spec {
  uint32_t from_stage, from_port; /* indexes into stages[] and kind->outputs[] */
  uint32_t to_stage, to_port;     /* indexes into stages[] and kind->inputs[] */
  /* ABI 1.1: formats (spec-negotiate.c) */
  bool convert;                   /* convert = "auto" on the edge or on the consumer stage */
  spn_port_format_t format;       /* negotiated when the spec was built */
  uint32_t mem_from, mem_to;      /* memory sets of the two ports (SPN_MEMSET_*, never 0) */
  char where[256];                /* "file:line:col" of the input reference */
} spn__edge_spec_t;

/* A stage's `precision` key: the arithmetic of the models it loads when it
 * is placed on a CUDA device (the CPU backend always computes in fp32).
 * AUTO is tf32 on a GPU. */
typedef enum spn__precision {
  SPN__PREC_AUTO = 0,
  SPN__PREC_FP32 = 1,
  SPN__PREC_TF32 = 2,
  SPN__PREC_FP16 = 3,
} spn__precision_t;

/* The engine's name for p on a GPU ("fp32", "tf32", "fp16"). */
const char *spn__precision_name(int32_t p);

typedef struct spn__stage_spec {
  char *name;
  const spn_stage_kind_t *kind;
  void *config;               /* kind->config_size bytes, filled and validated */
  char *device;               /* "auto" | "cpu" | "cuda" | "cuda:1" ... */
  uint32_t instances;         /* instances per device (instances.count) */
  char *instance_devices;     /* instances.devices: "all" or "0,2" or NULL (= the stage's device) */
  uint32_t max_batch;         /* from batching = {...} or the kind's default */
  uint32_t max_delay_ms;
  char *endpoint;             /* NULL = inproc; "ipc://..." / "tcp://..." to place the edge by config */
  uint32_t edge_capacity;     /* messages in flight on each input edge; 0 = runtime default */
  int32_t precision;          /* spn__precision_t: the arithmetic of the stage's models on a GPU */
  char where[256];            /* "file:line:col" of this [[stage]] table, for messages */
  /* ABI 1.1: formats (spec-negotiate.c) */
  bool convert;               /* convert = "auto": its input edges may get a conversion */
  bool inserted;              /* a conversion the runtime inserted (not in the config) */
  spn_port_caps_t *in_caps;   /* n_inputs entries: the kind's caps narrowed by the config */
  spn_port_caps_t *out_caps;  /* n_outputs entries */
} spn__stage_spec_t;

/* A job-side name bound to a per-job stage key: [pipeline.inputs],
 * [pipeline.outputs] and [pipeline.params] of a pipeline config. */
typedef struct spn__binding {
  int32_t kind;               /* spn_binding_kind_t */
  char *name;                 /* the name a job uses ("video") */
  char *target;               /* "stage.key" of an SPN_CONFIG_PER_JOB key */
  char *fallback;             /* inputs: the input whose file it takes when a job gives none; NULL: required */
  bool also;                  /* a second or later key of one name (name = ["a.key", "b.key"]) */
  char where[256];            /* "file:line:col" of the binding's value */
} spn__binding_t;

typedef struct spn__pipeline_spec {
  char *name;
  char *file;                 /* the config's path (or name given for a string) */
  spn__stage_spec_t *stages;  /* topological order: producers before consumers */
  size_t n_stages;
  spn__edge_spec_t *edges;
  size_t n_edges;
  char **plugin_paths;        /* [plugins] path = [...] from the config */
  size_t n_plugin_paths;
  spn__binding_t *bindings;   /* [pipeline.inputs/outputs/params], validated */
  size_t n_bindings;
  int32_t placement;          /* [pipeline] placement: spn__placement_t (0 = chain) */
} spn__pipeline_spec_t;

typedef enum spn__placement {
  SPN__PLACE_CHAIN = 0,  /* a job runs every replicated stage on one device */
  SPN__PLACE_FANOUT = 1, /* batches spread over every device's replica; the consumer re-orders by seq */
} spn__placement_t;

/* Build and validate a spec from a parsed document. overrides are
 * "stage.key=value" (value parsed as a TOML value, bare words as strings).
 * Every refusal says "file:line:col: stage \"name\": reason". */
int32_t spn__spec_from_toml(const spn__registry_t *reg, const spn_toml_doc_t *doc, const char *const *overrides,
                            size_t n_overrides, spn__pipeline_spec_t **out, spn_error_t *err);
void spn__spec_free(spn__pipeline_spec_t **spec);

/* ---- ABI 1.1: format negotiation (spec-negotiate.c) --------------------- */

/* The caps of one port of a kind, narrowed by `config` (the kind's static
 * table, then its port_caps callback). Fields left 0 mean "any"; mem_kinds
 * 0 becomes SPN_MEMSET_HOST. */
int32_t spn__port_caps(const spn_stage_kind_t *k, const void *config, bool is_output, uint32_t port,
                       spn_port_caps_t *out, spn_error_t *err);
/* Pick one format per edge of a wired, ordered spec; refuse edges whose ends
 * share no format unless convert is allowed there, where a stage of kind
 * "convert" (from reg) is inserted. Fills every stage's in_caps/out_caps and
 * every edge's format/mem_from/mem_to. Preference (docs/pipelines.md): the
 * lowest spn_pixel_format_t / spn_sample_format_t both ends allow. */
int32_t spn__spec_negotiate(const spn__registry_t *reg, spn__pipeline_spec_t *spec, spn_error_t *err);
/* "rgb24|yuv420p" for a set of pixel formats ("any" for 0). */
void spn__pixel_set_name(uint32_t set, char *buf, size_t size);
const char *spn__pixel_format_name(int32_t f);
/* The memory kind a consumer accepting `accept` (SPN_MEMSET_* bits) on a
 * device of kind `dev_kind` (-1: the CPU pool) wants a buffer of kind
 * `have` from device `same_device` (false: another device) turned into:
 * -1 when it takes it as it is (no copy), else the spn_mem_kind_t to copy
 * into on the consumer's device. */
int32_t spn__mem_plan(uint32_t accept, int32_t have, bool same_device, bool consumer_on_device);
/* The spn_mem_kind_t an edge's consumer receives, from the memory sets the
 * producer gives (`from`) and the consumer takes (`to`): device memory where
 * both allow it, else pinned, else host (HOST in `to` admits PINNED); with
 * nothing in common, what the consumer takes. */
int32_t spn__mem_pick(uint32_t from, uint32_t to);

/* The whole front end in one call, meant for spn_pipeline_load(_string)
 * and spn_pipeline_validate (so [plugins] path in a config is honoured):
 * parse the config (the file `path`, or `src`/`len`
 * when src is not NULL, `path` then being its name in messages), load the
 * plugins of the search path not loaded yet (plugin_dirs, the environment,
 * the config's [plugins] path resolved against the config's folder, the
 * install directory), then build the spec. Ownership: caller owns *out. */
int32_t spn__spec_load(spn__registry_t *reg, const spn_host_api_t *host, const char *const *plugin_dirs,
                       size_t n_plugin_dirs, const char *path, const char *src, size_t len,
                       const char *const *overrides, size_t n_overrides, spn__pipeline_spec_t **out,
                       spn_error_t *err);

/* A copy of stage `i`'s config with per-job overrides applied
 * ("stage.key=value", only for SPN_CONFIG_PER_JOB keys of that stage;
 * overrides for other stages are ignored here, unknown stages or keys and
 * keys that are not per-job are refused). Free with spn__config_free. */
int32_t spn__spec_job_config(const spn__pipeline_spec_t *spec, uint32_t i, const char *const *overrides,
                             size_t n_overrides, void **out, spn_error_t *err);
void spn__config_free(const spn_stage_kind_t *kind, void **config);

#endif
