/* registry.c — the stage kinds a runtime knows, and who brought each one.
 *
 * Kinds arrive from plugins (through host->register_kind during a plugin's
 * init, see loader.c) or directly (spn__registry_add_kind: tests, built-ins).
 * Before a kind is accepted it is checked as carefully as the plugin
 * descriptor: everything the host later trusts — the struct size, the config
 * schema's offsets and types, the port tables, the callbacks a source or a
 * filter needs — is verified here, once, so the rest of the front end and
 * the runtime never re-check it.
 *
 * Invariants: kind names are unique in a registry; a registered kind is a
 * host-side copy of the plugin's struct (so a smaller struct from an older
 * minor reads as zeros past its end), whose strings and tables stay owned by
 * the plugin until its fini. A registry is owned by one runtime (or test);
 * nothing here is process-wide.
 */
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "registry-internal.h"

/* The first size of spn_stage_kind_t (ABI 1.0). A kind from a 1.x plugin is
 * at least this large. */
#define SPN__KIND_V1_0_SIZE (offsetof(spn_stage_kind_t, reserved) + sizeof(((spn_stage_kind_t *)0)->reserved))

int32_t spn__registry_new(spn__registry_t **out, spn_error_t *err) {
  spn__registry_t *reg = calloc(1, sizeof *reg);
  if (!reg)
    return spn_error_set(err, SPN_ENOMEM, "plugin registry: out of memory");
  *out = reg;
  return SPN_OK;
}

void spn__registry_free(spn__registry_t **regp) {
  if (!regp || !*regp)
    return;
  spn__registry_t *reg = *regp;
  /* Plugins go in reverse load order: a later plugin never depended on an
   * earlier one's kinds, but unloading newest first mirrors loading. */
  for (size_t i = reg->n_plugins; i-- > 0;)
    spn__plugin_unload(reg->plugins[i]);
  free(reg->plugins);
  for (size_t i = 0; i < reg->n_kinds; i++) {
    free(reg->kinds[i].kind);
    free(reg->kinds[i].origin);
  }
  free(reg->kinds);
  free(reg);
  *regp = NULL;
}

const spn_stage_kind_t *spn__registry_find(const spn__registry_t *reg, const char *name, const char **origin) {
  for (size_t i = 0; i < reg->n_kinds; i++)
    if (!strcmp(reg->kinds[i].kind->name, name)) {
      if (origin)
        *origin = reg->kinds[i].origin;
      return reg->kinds[i].kind;
    }
  return NULL;
}

size_t spn__registry_count(const spn__registry_t *reg) { return reg->n_kinds; }

const spn_stage_kind_t *spn__registry_at(const spn__registry_t *reg, size_t i, const char **origin) {
  if (i >= reg->n_kinds)
    return NULL;
  if (origin)
    *origin = reg->kinds[i].origin;
  return reg->kinds[i].kind;
}

bool spn__registry_has_plugin(const spn__registry_t *reg, const char *name) {
  for (size_t i = 0; i < reg->n_plugins; i++)
    if (!strcmp(reg->plugins[i]->name, name))
      return true;
  return false;
}

/* A name a pipeline can write unquoted and that cannot be confused with a
 * "stage.port" reference: letters, digits, '_' and '-', not empty. */
bool spn__is_plain_name(const char *s) {
  if (!s || !*s)
    return false;
  for (; *s; s++) {
    char c = *s;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

static size_t field_size(int32_t type) {
  switch (type) {
  case SPN_CONFIG_STRING:
  case SPN_CONFIG_PATH: return sizeof(char *);
  case SPN_CONFIG_INT: return sizeof(int64_t);
  case SPN_CONFIG_FLOAT: return sizeof(double);
  case SPN_CONFIG_BOOL: return sizeof(bool);
  default: return 0;
  }
}

static size_t field_align(int32_t type) {
  switch (type) {
  case SPN_CONFIG_STRING:
  case SPN_CONFIG_PATH: return alignof(char *);
  case SPN_CONFIG_INT: return alignof(int64_t);
  case SPN_CONFIG_FLOAT: return alignof(double);
  case SPN_CONFIG_BOOL: return alignof(bool);
  default: return 1;
  }
}

/* Keys the host reads itself from every [[stage]] table; a schema may not
 * reuse them (the plugin would never see the value). */
static const char *const common_keys[] = {"name",      "kind",     "inputs",        "device", "instances",
                                          "batching",  "endpoint", "edge_capacity", NULL};

bool spn__is_common_key(const char *key) {
  for (size_t i = 0; common_keys[i]; i++)
    if (!strcmp(common_keys[i], key))
      return true;
  return false;
}

/* Every refusal below says "<origin>: kind "<name>" refused: <what>
 * (rule: <rule>)" so the plugin author finds the broken table at once. */
static int32_t check_ports(const char *origin, const spn_stage_kind_t *k, const spn_port_t *ports, uint32_t n,
                           const char *what, spn_error_t *err) {
  if (n > 0 && !ports)
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: n_%s is %u but %s is NULL (rule: kind ports)",
                         origin, k->name, what, n, what);
  if (n > 64)
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: %u %s, at most 64 (rule: kind ports)", origin,
                         k->name, n, what);
  for (uint32_t i = 0; i < n; i++) {
    if (!spn__is_plain_name(ports[i].name) || !ports[i].type || !*ports[i].type)
      return spn_error_set(err, SPN_EABI,
                           "%s: kind \"%s\" refused: %s[%u] needs a plain name and a type (rule: kind ports)",
                           origin, k->name, what, i);
    for (uint32_t j = 0; j < i; j++)
      if (!strcmp(ports[i].name, ports[j].name))
        return spn_error_set(err, SPN_EABI,
                             "%s: kind \"%s\" refused: two %s named \"%s\" (rule: kind ports)", origin, k->name,
                             what, ports[i].name);
  }
  return SPN_OK;
}

static int32_t check_schema(const char *origin, const spn_stage_kind_t *k, spn_error_t *err) {
  if (!k->schema)
    return SPN_OK;
  for (size_t i = 0;; i++) {
    const spn_config_field_t *f = &k->schema[i];
    if (!f->key)
      break;
    if (i >= 1024)
      return spn_error_set(err, SPN_EABI,
                           "%s: kind \"%s\" refused: schema has no NULL-key terminator within 1024 entries "
                           "(rule: kind schema)",
                           origin, k->name);
    size_t sz = field_size(f->type);
    if (!sz)
      return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: key \"%s\" has unknown type %d (rule: kind schema)",
                           origin, k->name, f->key, f->type);
    if (!spn__is_plain_name(f->key) || spn__is_common_key(f->key))
      return spn_error_set(err, SPN_EABI,
                           "%s: kind \"%s\" refused: key \"%s\" is not a plain name or is reserved for the host "
                           "(rule: kind schema)",
                           origin, k->name, f->key);
    /* The host writes sz bytes at offset: it must lie inside config_size
     * and be aligned for the type, or filling it would corrupt memory. */
    if (f->offset > k->config_size || sz > k->config_size - f->offset || f->offset % field_align(f->type))
      return spn_error_set(err, SPN_EABI,
                           "%s: kind \"%s\" refused: key \"%s\" at offset %zu does not fit config_size %zu "
                           "(rule: kind schema)",
                           origin, k->name, f->key, f->offset, k->config_size);
    if (f->flags & ~(uint32_t)(SPN_CONFIG_REQUIRED | SPN_CONFIG_PER_JOB))
      return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: key \"%s\" has unknown flags 0x%x (rule: kind schema)",
                           origin, k->name, f->key, f->flags);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(k->schema[j].key, f->key))
        return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: key \"%s\" appears twice (rule: kind schema)",
                             origin, k->name, f->key);
    /* A default outside its own range would make the unset key invalid. */
    if (f->min < f->max && !(f->flags & SPN_CONFIG_REQUIRED)) {
      double d = f->type == SPN_CONFIG_FLOAT ? f->def_float : (double)f->def_int;
      if ((f->type == SPN_CONFIG_INT || f->type == SPN_CONFIG_FLOAT) && (d < f->min || d > f->max))
        return spn_error_set(err, SPN_EABI,
                             "%s: kind \"%s\" refused: key \"%s\" default %g is outside [%g, %g] (rule: kind schema)",
                             origin, k->name, f->key, d, f->min, f->max);
    }
  }
  return SPN_OK;
}

int32_t spn__registry_check_kind(const spn__registry_t *reg, const spn_stage_kind_t *k, const char *origin,
                                 spn_error_t *err) {
  if (!k)
    return spn_error_set(err, SPN_EINVAL, "%s: register_kind called with NULL (rule: kind struct)", origin);
  /* struct_size first: nothing past it may be read when it is too small. */
  if (k->struct_size < SPN__KIND_V1_0_SIZE)
    return spn_error_set(err, SPN_EABI,
                         "%s: kind refused: struct_size %u is smaller than ABI 1.0's %zu (rule: kind struct_size)",
                         origin, k->struct_size, SPN__KIND_V1_0_SIZE);
  if (k->struct_size > sizeof(spn_stage_kind_t))
    return spn_error_set(err, SPN_EABI,
                         "%s: kind refused: struct_size %u is larger than this host's %zu: built against a newer "
                         "plugin.h (rule: kind struct_size)",
                         origin, k->struct_size, sizeof(spn_stage_kind_t));
  if (!spn__is_plain_name(k->name))
    return spn_error_set(err, SPN_EABI,
                         "%s: kind refused: name must be letters, digits, '_' or '-' (rule: kind name)", origin);
  bool reserved_ok = k->reserved0 == 0 && k->reserved1 == 0;
  for (size_t i = 0; i < sizeof k->reserved / sizeof k->reserved[0]; i++)
    reserved_ok = reserved_ok && k->reserved[i] == NULL;
  if (!reserved_ok)
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: reserved fields are not zero (rule: reserved zero)",
                         origin, k->name);
  const char *other = NULL;
  if (spn__registry_find(reg, k->name, &other))
    return spn_error_set(err, SPN_EEXIST,
                         "%s: kind \"%s\" refused: already registered by %s (rule: duplicate kind)", origin, k->name,
                         other);
  /* 0 is the default (SPN_STAGE_KIND leaves them out): cpu, no batching. */
  if (k->device_need != 0 && k->device_need != SPN_NEED_CPU && k->device_need != SPN_NEED_CUDA && k->device_need != SPN_NEED_EITHER)
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: device_need %d is not cpu, cuda or either "
                         "(rule: kind device_need)", origin, k->name, k->device_need);
  int32_t rc = check_ports(origin, k, k->inputs, k->n_inputs, "inputs", err);
  if (rc == SPN_OK)
    rc = check_ports(origin, k, k->outputs, k->n_outputs, "outputs", err);
  if (rc != SPN_OK)
    return rc;
  /* A source produces with generate(), everything else consumes with
   * process(): without the right one the stage could never move data. */
  if (k->n_inputs == 0 && !k->generate)
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: a source (no inputs) needs generate "
                         "(rule: kind callbacks)", origin, k->name);
  if (k->n_inputs > 0 && !k->process)
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: a stage with inputs needs process "
                         "(rule: kind callbacks)", origin, k->name);
  if (k->schema && k->config_size == 0)
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: a schema needs config_size > 0 (rule: kind schema)",
                         origin, k->name);
  if (k->config_size > (1u << 20))
    return spn_error_set(err, SPN_EABI, "%s: kind \"%s\" refused: config_size %zu is over 1 MiB (rule: kind schema)",
                         origin, k->name, k->config_size);
  return check_schema(origin, k, err);
}

int32_t spn__registry_insert(spn__registry_t *reg, const spn_stage_kind_t *k, const char *origin,
                             spn_plugin_t *plugin, spn_error_t *err) {
  if (reg->n_kinds == reg->cap_kinds) {
    size_t cap = reg->cap_kinds ? reg->cap_kinds * 2 : 16;
    spn__kind_entry_t *kinds = realloc(reg->kinds, cap * sizeof *kinds);
    if (!kinds)
      return spn_error_set(err, SPN_ENOMEM, "%s: out of memory registering a kind", origin);
    reg->kinds = kinds;
    reg->cap_kinds = cap;
  }
  spn_stage_kind_t *copy = calloc(1, sizeof *copy);
  char *org = strdup(origin);
  if (!copy || !org) {
    free(copy);
    free(org);
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory registering a kind", origin);
  }
  memcpy(copy, k, k->struct_size < sizeof *copy ? k->struct_size : sizeof *copy);
  copy->struct_size = sizeof *copy;
  if (copy->device_need == 0)
    copy->device_need = SPN_NEED_CPU;
  if (copy->max_batch == 0)
    copy->max_batch = 1;
  reg->kinds[reg->n_kinds++] = (spn__kind_entry_t){.kind = copy, .origin = org, .plugin = plugin};
  return SPN_OK;
}

int32_t spn__registry_add_kind(spn__registry_t *reg, const spn_stage_kind_t *kind, const char *origin,
                               spn_error_t *err) {
  if (!origin)
    origin = "(built-in)";
  int32_t rc = spn__registry_check_kind(reg, kind, origin, err);
  if (rc != SPN_OK)
    return rc;
  return spn__registry_insert(reg, kind, origin, NULL, err);
}

void spn__registry_remove_plugin_kinds(spn__registry_t *reg, spn_plugin_t *plugin) {
  size_t w = 0;
  for (size_t i = 0; i < reg->n_kinds; i++) {
    if (reg->kinds[i].plugin == plugin) {
      free(reg->kinds[i].kind);
      free(reg->kinds[i].origin);
    } else {
      reg->kinds[w++] = reg->kinds[i];
    }
  }
  reg->n_kinds = w;
}
