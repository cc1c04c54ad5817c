/* registry-internal.h — the registry's and loader's shared insides (front
 * end only; the runtime uses spec-internal.h). */
#ifndef SPINDLE_REGISTRY_INTERNAL_H
#define SPINDLE_REGISTRY_INTERNAL_H

#include <sys/types.h>

#include "spec-internal.h"

typedef struct spn__kind_entry {
  spn_stage_kind_t *kind; /* host-side copy */
  char *origin;           /* plugin file path, or what add_kind was given */
  spn_plugin_t *plugin;   /* NULL for kinds added directly */
} spn__kind_entry_t;

/* A loaded plugin (the spn_plugin_t handed to init). */
struct spn_plugin {
  spn__registry_t *reg;
  char *path;
  char *name;                    /* <name> of libspindle-<name>.so */
  dev_t dev;                     /* the file, to tell a second load of it from a namesake */
  ino_t ino;
  void *dl;                      /* dlopen handle */
  const spn_plugin_desc_t *desc;
  void *data;                    /* plugin_set_data */
  spn_host_api_t host;           /* the table init got, when the caller's needed our register_kind */
  bool in_init;                  /* register_kind is only allowed during init */
  int32_t refused;               /* first register_kind refusal (plugin refused even if init says OK) */
  char refusal[SPN_ERROR_MSG_MAX];
};

struct spn__registry {
  spn__kind_entry_t *kinds;
  size_t n_kinds, cap_kinds;
  spn_plugin_t **plugins;
  size_t n_plugins, cap_plugins;
};

int32_t spn__registry_check_kind(const spn__registry_t *reg, const spn_stage_kind_t *k, const char *origin,
                                 spn_error_t *err);
int32_t spn__registry_insert(spn__registry_t *reg, const spn_stage_kind_t *k, const char *origin,
                             spn_plugin_t *plugin, spn_error_t *err);
void spn__registry_remove_plugin_kinds(spn__registry_t *reg, spn_plugin_t *plugin);
/* fini + dlclose + free (loader.c). */
void spn__plugin_unload(spn_plugin_t *p);

bool spn__is_plain_name(const char *s);
bool spn__is_common_key(const char *key);

#endif
