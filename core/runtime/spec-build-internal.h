/* spec-build-internal.h — helpers shared by config-schema.c and spec.c
 * (front end only). */
#ifndef SPINDLE_SPEC_BUILD_INTERNAL_H
#define SPINDLE_SPEC_BUILD_INTERNAL_H

#include "registry-internal.h"

/* A config struct with every default set. Ownership: caller (spn__config_free). */
int32_t spn__config_new(const spn_stage_kind_t *k, void **out, spn_error_t *err);
/* A deep copy (strings duplicated). */
int32_t spn__config_copy(const spn_stage_kind_t *k, const void *src, void **out, spn_error_t *err);
const spn_config_field_t *spn__config_field(const spn_stage_kind_t *k, const char *key);
/* Check `v` against the field's type and range and store it. `where`
 * starts the message ("file:line:col" or "--set \"a.b=c\""). PATH values
 * that are relative are joined to base_dir (NULL: kept as written). */
int32_t spn__config_set(const spn_stage_kind_t *k, const spn_config_field_t *f, void *cfg, const spn_toml_node_t *v,
                        const char *where, const char *stage, const char *base_dir, spn_error_t *err);
/* "a, b, c" of the schema's keys ("none" when it has none). */
void spn__config_key_list(const spn_stage_kind_t *k, char *buf, size_t size);
/* Append ", name" (or "name" first) to a list in buf; *n is its length.
 * Stops quietly when buf is full. */
void spn__name_list_add(char *buf, size_t size, size_t *n, const char *name);
/* base_dir + "/" + path unless path is absolute or base_dir is "." / empty. */
char *spn__path_join(const char *base_dir, const char *path);

/* "stage.key=value" → stage, key and a pointer to the value text. */
int32_t spn__override_split(const char *text, char *stage, size_t ssize, char *key, size_t ksize, const char **value,
                            spn_error_t *err);
/* The value as a TOML node (bare words become strings). Ownership: caller
 * owns *doc; *node is borrowed from it. */
int32_t spn__override_value(const char *value, spn_toml_doc_t **doc, const spn_toml_node_t **node, spn_error_t *err);

#endif
