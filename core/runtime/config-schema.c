/* config-schema.c — filling a stage's config struct from TOML, driven by the
 * kind's schema (an array of spn_config_field_t: data, not code).
 *
 * The plugin never parses anything: it declares keys, types, defaults and
 * ranges, and receives a filled struct. Everything a user can get wrong —
 * an unknown key, a wrong type, a missing required key, a value out of
 * range, a string holding a NUL byte — is refused here with the place it
 * was written and the stage it belongs to.
 *
 * Ownership: STRING and PATH fields hold malloc'd copies owned by whoever
 * owns the struct (a spec, or a per-job copy); spn__config_free releases
 * them. The schema was checked at registration (registry.c), so offsets and
 * types are trusted here.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec-build-internal.h"

const spn_config_field_t *spn__config_field(const spn_stage_kind_t *k, const char *key) {
  for (const spn_config_field_t *f = k->schema; f && f->key; f++)
    if (!strcmp(f->key, key))
      return f;
  return NULL;
}

static char **str_slot(void *cfg, const spn_config_field_t *f) { return (char **)((char *)cfg + f->offset); }

void spn__config_free(const spn_stage_kind_t *kind, void **config) {
  if (!config || !*config)
    return;
  for (const spn_config_field_t *f = kind->schema; f && f->key; f++)
    if (f->type == SPN_CONFIG_STRING || f->type == SPN_CONFIG_PATH)
      free(*str_slot(*config, f));
  free(*config);
  *config = NULL;
}

int32_t spn__config_new(const spn_stage_kind_t *k, void **out, spn_error_t *err) {
  /* One byte at least so a kind without a config still gets a pointer. */
  void *cfg = calloc(1, k->config_size ? k->config_size : 1);
  if (!cfg)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  for (const spn_config_field_t *f = k->schema; f && f->key; f++) {
    void *p = (char *)cfg + f->offset;
    switch (f->type) {
    case SPN_CONFIG_STRING:
    case SPN_CONFIG_PATH:
      if (f->def_str && !(*(char **)p = strdup(f->def_str))) {
        spn__config_free(k, &cfg);
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      }
      break;
    case SPN_CONFIG_INT: *(int64_t *)p = f->def_int; break;
    case SPN_CONFIG_FLOAT: *(double *)p = f->def_float; break;
    case SPN_CONFIG_BOOL: *(bool *)p = f->def_int != 0; break;
    }
  }
  *out = cfg;
  return SPN_OK;
}

int32_t spn__config_copy(const spn_stage_kind_t *k, const void *src, void **out, spn_error_t *err) {
  void *cfg = malloc(k->config_size ? k->config_size : 1);
  if (!cfg)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  memcpy(cfg, src, k->config_size);
  /* Detach the strings first so a failure half-way frees only our copies. */
  for (const spn_config_field_t *f = k->schema; f && f->key; f++)
    if (f->type == SPN_CONFIG_STRING || f->type == SPN_CONFIG_PATH)
      *str_slot(cfg, f) = NULL;
  for (const spn_config_field_t *f = k->schema; f && f->key; f++) {
    if (f->type != SPN_CONFIG_STRING && f->type != SPN_CONFIG_PATH)
      continue;
    const char *s = *str_slot((void *)src, f);
    if (s && !(*str_slot(cfg, f) = strdup(s))) {
      spn__config_free(k, &cfg);
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    }
  }
  *out = cfg;
  return SPN_OK;
}

static const char *type_word(int32_t t) {
  switch (t) {
  case SPN_CONFIG_STRING: return "a string";
  case SPN_CONFIG_PATH: return "a string (a path)";
  case SPN_CONFIG_INT: return "an integer";
  case SPN_CONFIG_FLOAT: return "a number";
  case SPN_CONFIG_BOOL: return "a boolean";
  default: return "?";
  }
}

/* "scheme:..." (RFC 3986: a letter, then letters, digits, + - .; two or
 * more characters): a URL or a protocol such as FFmpeg's "pipe:0", not a
 * file relative to the config. */
static bool has_scheme(const char *path) {
  size_t n = 0;
  if (!isalpha((unsigned char)path[0]))
    return false;
  while (isalnum((unsigned char)path[n]) || path[n] == '+' || path[n] == '-' || path[n] == '.')
    n++;
  return n >= 2 && path[n] == ':';
}

char *spn__path_join(const char *base_dir, const char *path) {
  if (!base_dir || !*base_dir || path[0] == '/' || !strcmp(base_dir, ".") || has_scheme(path))
    return strdup(path);
  size_t n = strlen(base_dir) + strlen(path) + 2;
  char *s = malloc(n);
  if (s)
    snprintf(s, n, "%s/%s", base_dir, path);
  return s;
}

int32_t spn__config_set(const spn_stage_kind_t *k, const spn_config_field_t *f, void *cfg, const spn_toml_node_t *v,
                        const char *where, const char *stage, const char *base_dir, spn_error_t *err) {
  spn_toml_type_t t = spn_toml_node_type(v);
  void *p = (char *)cfg + f->offset;
  bool type_ok = false;
  switch (f->type) {
  case SPN_CONFIG_STRING:
  case SPN_CONFIG_PATH: type_ok = t == SPN_TOML_STRING; break;
  case SPN_CONFIG_INT: type_ok = t == SPN_TOML_INTEGER; break;
  case SPN_CONFIG_FLOAT: type_ok = t == SPN_TOML_FLOAT || t == SPN_TOML_INTEGER; break;
  case SPN_CONFIG_BOOL: type_ok = t == SPN_TOML_BOOL; break;
  }
  if (!type_ok)
    return spn_error_set(err, SPN_ETYPE, "%s: stage \"%s\": key \"%s\" must be %s, got %s", where, stage, f->key,
                         type_word(f->type), spn_toml_type_name(t));
  /* Range, when the schema gives one (min < max). NaN is never in range. */
  double num = 0;
  if (f->type == SPN_CONFIG_INT)
    num = (double)spn_toml_int(v);
  else if (f->type == SPN_CONFIG_FLOAT)
    num = t == SPN_TOML_INTEGER ? (double)spn_toml_int(v) : spn_toml_float(v);
  if ((f->type == SPN_CONFIG_INT || f->type == SPN_CONFIG_FLOAT) && f->min < f->max &&
      !(num >= f->min && num <= f->max))
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": key \"%s\" = %.17g is out of range [%.15g, %.15g]",
                         where, stage, f->key, num, f->min, f->max);
  if (f->type == SPN_CONFIG_FLOAT && !isfinite(num))
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": key \"%s\" must be a finite number", where, stage,
                         f->key);
  switch (f->type) {
  case SPN_CONFIG_STRING:
  case SPN_CONFIG_PATH: {
    size_t len = 0;
    const char *s = spn_toml_string(v, &len);
    /* The plugin gets a C string: an embedded NUL would cut it silently. */
    if (strlen(s) != len)
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": key \"%s\" holds a NUL character", where, stage,
                           f->key);
    char *copy = f->type == SPN_CONFIG_PATH && *s ? spn__path_join(base_dir, s) : strdup(s);
    if (!copy)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    free(*(char **)p);
    *(char **)p = copy;
    break;
  }
  case SPN_CONFIG_INT: *(int64_t *)p = spn_toml_int(v); break;
  case SPN_CONFIG_FLOAT: *(double *)p = num; break;
  case SPN_CONFIG_BOOL: *(bool *)p = spn_toml_bool(v); break;
  }
  (void)k;
  return SPN_OK;
}

void spn__name_list_add(char *buf, size_t size, size_t *n, const char *name) {
  if (*n + 1 >= size)
    return;
  int w = snprintf(buf + *n, size - *n, "%s%s", *n ? ", " : "", name);
  if (w > 0)
    *n = *n + (size_t)w < size ? *n + (size_t)w : size - 1;
}

void spn__config_key_list(const spn_stage_kind_t *k, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (const spn_config_field_t *f = k->schema; f && f->key; f++)
    spn__name_list_add(buf, size, &n, f->key);
  if (!n)
    snprintf(buf, size, "none");
}

/* ---- values given on a command line ("stage.key=value") ---------------- */

int32_t spn__override_split(const char *text, char *stage, size_t ssize, char *key, size_t ksize, const char **value,
                            spn_error_t *err) {
  const char *eq = strchr(text, '=');
  const char *dot = strchr(text, '.');
  if (!eq || !dot || dot > eq || dot == text || dot + 1 == eq)
    return spn_error_set(err, SPN_ECONFIG, "--set \"%s\": expected stage.key=value", text);
  size_t sl = (size_t)(dot - text), kl = (size_t)(eq - dot - 1);
  if (sl >= ssize || kl >= ksize)
    return spn_error_set(err, SPN_ECONFIG, "--set \"%s\": stage or key name too long", text);
  memcpy(stage, text, sl);
  stage[sl] = '\0';
  memcpy(key, dot + 1, kl);
  key[kl] = '\0';
  /* Trim spaces around the key and value: "a.b = 1" reads as meant. */
  while (kl && key[kl - 1] == ' ')
    key[--kl] = '\0';
  *value = eq + 1;
  while (**value == ' ')
    (*value)++;
  return SPN_OK;
}

/* Parse `value` as one TOML value; anything that is not exactly one valid
 * value (a bare word like cpu or cuda:1, or text with a newline) becomes a
 * string holding the text as written. */
int32_t spn__override_value(const char *value, spn_toml_doc_t **doc, const spn_toml_node_t **node,
                            spn_error_t *err) {
  if (!value)
    return spn_error_set(err, SPN_EINVAL, "--set: missing value");
  size_t vl = strlen(value);
  size_t cap = vl * 6 + 16;
  char *src = malloc(cap);
  if (!src)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  int n = snprintf(src, cap, "v = %s\n", value);
  spn_toml_doc_t *d = NULL;
  if (!strchr(value, '\n') && spn_toml_parse(src, (size_t)n, "--set", &d, NULL) == SPN_OK &&
      spn_toml_table_len(spn_toml_doc_root(d)) == 1) {
    free(src);
    *doc = d;
    *node = spn_toml_table_get(spn_toml_doc_root(d), "v", NULL);
    return SPN_OK;
  }
  spn_toml_doc_free(&d);
  /* A basic string with every special byte escaped. */
  size_t w = 0;
  w += (size_t)snprintf(src, cap, "v = \"");
  for (const unsigned char *c = (const unsigned char *)value; *c; c++) {
    if (*c == '"' || *c == '\\')
      w += (size_t)snprintf(src + w, cap - w, "\\%c", *c);
    else if (*c < 0x20 || *c == 0x7f)
      w += (size_t)snprintf(src + w, cap - w, "\\u%04x", *c);
    else
      src[w++] = (char)*c;
  }
  w += (size_t)snprintf(src + w, cap - w, "\"\n");
  spn_error_t e = SPN_ERROR_INIT;
  int32_t rc = spn_toml_parse(src, w, "--set", &d, &e);
  free(src);
  if (rc != SPN_OK)
    return spn_error_set(err, rc, "--set value \"%s\": %s", value, e.msg);
  *doc = d;
  *node = spn_toml_table_get(spn_toml_doc_root(d), "v", NULL);
  return SPN_OK;
}
