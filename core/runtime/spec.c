/* spec.c — pipeline TOML → a validated spn__pipeline_spec_t.
 *
 * Everything that can be known about a pipeline before it runs is checked
 * here, so a mistake in a config is a clear message at load time instead of
 * a stall or a crash mid-job: unknown top-level keys and stage keys, unknown
 * kinds, duplicate names, dangling inputs, unknown ports, ports left
 * unconnected, port type mismatches, cycles, and every value against its
 * schema. Each refusal reads "file:line:col: stage \"name\": reason", with
 * the position of the exact key or value at fault; --set overrides are named
 * by their text instead of a position.
 *
 * The result lists stages in topological order (producers first; among
 * stages that are ready at the same time, file order), which is the order
 * the runtime creates and connects them. The spec owns all its strings and
 * config structs; the kinds are borrowed from the registry, which must
 * outlive it.
 */
#include <stdlib.h>
#include <string.h>

#include "spec-build-internal.h"

#define WHERE_MAX 256

typedef struct stage_build {
  const spn_toml_node_t *table;
  const spn_toml_node_t *inputs; /* the inputs value, or NULL */
  bool *set;                     /* per schema field: given by the config or --set */
  size_t n_fields;
} stage_build_t;

typedef struct build {
  const spn__registry_t *reg;
  const char *file;
  char *base_dir;
  spn__pipeline_spec_t *spec;
  stage_build_t *sb;
  size_t cap_edges;
} build_t;

static void where_key(const build_t *b, spn_toml_pos_t pos, char *buf, size_t size) {
  snprintf(buf, size, "%s:%u:%u", b->file, pos.line, pos.col);
}

static void where_node(const spn_toml_node_t *n, char *buf, size_t size) { spn_toml_node_where(n, buf, size); }

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    return strdup(".");
  if (slash == path)
    return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* "x.toml" → "x" for a pipeline without [pipeline] name. */
static char *stem_of(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  const char *dot = strrchr(base, '.');
  return dot && dot != base ? strndup(base, (size_t)(dot - base)) : strdup(base);
}

static spn__stage_spec_t *find_stage(const spn__pipeline_spec_t *spec, const char *name, size_t *index) {
  for (size_t i = 0; i < spec->n_stages; i++)
    if (spec->stages[i].name && !strcmp(spec->stages[i].name, name)) {
      if (index)
        *index = i;
      return &spec->stages[i];
    }
  return NULL;
}

/* ---- [pipeline] and [plugins] ------------------------------------------ */

/* [pipeline.inputs] / [pipeline.outputs] / [pipeline.params]: name = "stage.key";
 * an input may also be name = { key = "stage.key", default = "other input" }
 * (optional: a job that does not give it gets the other's file). Only the
 * shape is read here; check_bindings() checks the targets once every stage
 * is known. */
static int32_t read_bindings(build_t *b, int32_t kind, const char *table, const spn_toml_node_t *t,
                             spn_error_t *err) {
  char where[WHERE_MAX];
  if (spn_toml_node_type(t) != SPN_TOML_TABLE) {
    where_node(t, where, sizeof where);
    return spn_error_set(err, SPN_ETYPE, "%s: [pipeline.%s] must be a table of name = \"stage.key\"", where, table);
  }
  for (size_t i = 0; i < spn_toml_table_len(t); i++) {
    spn_toml_pos_t kp;
    const char *name = spn_toml_table_key_at(t, i, &kp);
    const spn_toml_node_t *v = spn_toml_table_value_at(t, i), *def = NULL;
    if (kind == SPN_BINDING_INPUT && spn_toml_node_type(v) == SPN_TOML_TABLE) {
      for (size_t k = 0; k < spn_toml_table_len(v); k++) {
        spn_toml_pos_t p;
        const char *key = spn_toml_table_key_at(v, k, &p);
        if (strcmp(key, "key") && strcmp(key, "default")) {
          where_key(b, p, where, sizeof where);
          return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.inputs] %s: unknown key \"%s\" (known: key, default)",
                               where, name, key);
        }
      }
      def = spn_toml_table_get(v, "default", NULL);
      if (def && spn_toml_node_type(def) != SPN_TOML_STRING) {
        where_node(def, where, sizeof where);
        return spn_error_set(err, SPN_ETYPE, "%s: [pipeline.inputs] %s: default must be the name of another input",
                             where, name);
      }
      const spn_toml_node_t *key = spn_toml_table_get(v, "key", NULL);
      if (!key) {
        where_node(v, where, sizeof where);
        return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.inputs] %s: no key = \"stage.key\"", where, name);
      }
      v = key;
    }
    /* An input or a param may set several keys: ["decode.path",
     * "melspec.video"] (one file read by two stages, one value for two).
     * An output is written by one stage. */
    bool many = kind != SPN_BINDING_OUTPUT && spn_toml_node_type(v) == SPN_TOML_ARRAY;
    size_t n_keys = many ? spn_toml_array_len(v) : 1;
    if (many && n_keys == 0) {
      where_node(v, where, sizeof where);
      return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s binds no key: name one \"stage.key\" or more",
                           where, table, name);
    }
    if (!*name || strlen(name) > 128) {
      where_key(b, kp, where, sizeof where);
      return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s]: names are 1-128 bytes", where, table);
    }
    for (size_t k = 0; k < n_keys; k++) {
      const spn_toml_node_t *kv = many ? spn_toml_array_at(v, k) : v;
      if (spn_toml_node_type(kv) != SPN_TOML_STRING || !strchr(spn_toml_string(kv, NULL), '.')) {
        where_node(kv, where, sizeof where);
        return spn_error_set(err, SPN_ETYPE, "%s: [pipeline.%s] %s must be a string \"stage.key\"%s", where, table,
                             name,
                             kind == SPN_BINDING_INPUT    ? " or a list of them (or { key = ..., default = \"input\" })"
                             : kind == SPN_BINDING_PARAM ? " or a list of them"
                                                         : "");
      }
      spn__binding_t *nb = realloc(b->spec->bindings, (b->spec->n_bindings + 1) * sizeof *nb);
      if (!nb)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      b->spec->bindings = nb;
      spn__binding_t *bd = &nb[b->spec->n_bindings];
      *bd = (spn__binding_t){.kind = kind, .name = strdup(name), .target = strdup(spn_toml_string(kv, NULL)),
                             .fallback = def ? strdup(spn_toml_string(def, NULL)) : NULL, .also = k > 0};
      b->spec->n_bindings++;
      if (!bd->name || !bd->target || (def && !bd->fallback))
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      where_node(kv, bd->where, sizeof bd->where);
    }
  }
  return SPN_OK;
}

/* Every binding names an existing stage and one of its per-job keys; inputs
 * and outputs bind string or path keys (they receive file paths). */
static int32_t check_bindings(const spn__pipeline_spec_t *spec, spn_error_t *err) {
  static const char *const tables[] = {"inputs", "outputs", "params"};
  for (size_t i = 0; i < spec->n_bindings; i++) {
    const spn__binding_t *bd = &spec->bindings[i];
    const char *table = tables[bd->kind];
    char stage[128], key[128];
    const char *dot = strchr(bd->target, '.');
    size_t sl = (size_t)(dot - bd->target);
    if (sl == 0 || sl >= sizeof stage || !dot[1] || strlen(dot + 1) >= sizeof key)
      return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s: \"%s\" is not \"stage.key\"", bd->where, table,
                           bd->name, bd->target);
    memcpy(stage, bd->target, sl);
    stage[sl] = '\0';
    snprintf(key, sizeof key, "%s", dot + 1);
    const spn__stage_spec_t *s = find_stage(spec, stage, NULL);
    if (!s)
      return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s: pipeline \"%s\" has no stage \"%s\"", bd->where,
                           table, bd->name, spec->name, stage);
    const spn_config_field_t *f = spn__config_field(s->kind, key);
    if (!f) {
      char keys[512];
      spn__config_key_list(s->kind, keys, sizeof keys);
      return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s: stage \"%s\": unknown key \"%s\" for kind \"%s\" (its keys: %s)",
                           bd->where, table, bd->name, stage, key, s->kind->name, keys);
    }
    if (!(f->flags & SPN_CONFIG_PER_JOB))
      return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s: stage \"%s\": key \"%s\" is set per pipeline, not per job",
                           bd->where, table, bd->name, stage, key);
    if (bd->kind != SPN_BINDING_PARAM && f->type != SPN_CONFIG_STRING && f->type != SPN_CONFIG_PATH)
      return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s: stage \"%s\": key \"%s\" is not a string or path",
                           bd->where, table, bd->name, stage, key);
    /* A job's files are its inputs and outputs, which the job service
     * checks against its roots; a param naming a file would bypass that. */
    if (bd->kind == SPN_BINDING_PARAM && f->type == SPN_CONFIG_PATH)
      return spn_error_set(err, SPN_ECONFIG,
                           "%s: [pipeline.params] %s: stage \"%s\": key \"%s\" is a path: bind files in "
                           "[pipeline.inputs] or [pipeline.outputs]",
                           bd->where, bd->name, stage, key);
    if (bd->fallback) {
      const spn__binding_t *other = NULL;
      for (size_t j = 0; j < spec->n_bindings && !other; j++)
        if (spec->bindings[j].kind == SPN_BINDING_INPUT && strcmp(spec->bindings[j].name, bd->name) &&
            !strcmp(spec->bindings[j].name, bd->fallback))
          other = &spec->bindings[j];
      if (!other)
        return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.inputs] %s: default \"%s\" is not another input", bd->where,
                             bd->name, bd->fallback);
      if (other->fallback)
        return spn_error_set(err, SPN_ECONFIG,
                             "%s: [pipeline.inputs] %s: default \"%s\" has a default of its own; name one that a job "
                             "must give",
                             bd->where, bd->name, bd->fallback);
    }
    for (size_t j = 0; j < i; j++) {
      if (!bd->also && spec->bindings[j].kind == bd->kind && !strcmp(spec->bindings[j].name, bd->name))
        return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s is bound twice", bd->where, table, bd->name);
      if (!strcmp(spec->bindings[j].target, bd->target))
        return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline.%s] %s: \"%s\" is bound already, by [pipeline.%s] %s",
                             bd->where, table, bd->name, bd->target, tables[spec->bindings[j].kind],
                             spec->bindings[j].name);
    }
  }
  return SPN_OK;
}

static int32_t read_pipeline_table(build_t *b, const spn_toml_node_t *t, spn_error_t *err) {
  char where[WHERE_MAX];
  if (spn_toml_node_type(t) != SPN_TOML_TABLE) {
    where_node(t, where, sizeof where);
    return spn_error_set(err, SPN_ETYPE, "%s: \"pipeline\" must be a table ([pipeline])", where);
  }
  for (size_t i = 0; i < spn_toml_table_len(t); i++) {
    spn_toml_pos_t kp;
    const char *key = spn_toml_table_key_at(t, i, &kp);
    const spn_toml_node_t *v = spn_toml_table_value_at(t, i);
    if (!strcmp(key, "name")) {
      if (spn_toml_node_type(v) != SPN_TOML_STRING || !*spn_toml_string(v, NULL)) {
        where_node(v, where, sizeof where);
        return spn_error_set(err, SPN_ETYPE, "%s: [pipeline] name must be a non-empty string", where);
      }
      free(b->spec->name);
      if (!(b->spec->name = strdup(spn_toml_string(v, NULL))))
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
    } else if (!strcmp(key, "inputs") || !strcmp(key, "outputs") || !strcmp(key, "params")) {
      int32_t kind = key[0] == 'i' ? SPN_BINDING_INPUT : key[0] == 'o' ? SPN_BINDING_OUTPUT : SPN_BINDING_PARAM;
      int32_t rc = read_bindings(b, kind, key, v, err);
      if (rc != SPN_OK)
        return rc;
    } else if (!strcmp(key, "placement")) {
      /* Multi-device placement (docs/gpu.md): "chain" keeps a job on one
       * device through the replicated stages, "fanout" spreads its batches. */
      const char *pl = spn_toml_node_type(v) == SPN_TOML_STRING ? spn_toml_string(v, NULL) : NULL;
      if (!pl || (strcmp(pl, "chain") && strcmp(pl, "fanout"))) {
        where_node(v, where, sizeof where);
        return spn_error_set(err, SPN_ECONFIG, "%s: [pipeline] placement must be \"chain\" or \"fanout\"", where);
      }
      b->spec->placement = !strcmp(pl, "fanout") ? SPN__PLACE_FANOUT : SPN__PLACE_CHAIN;
    } else {
      where_key(b, kp, where, sizeof where);
      return spn_error_set(err, SPN_ECONFIG,
                           "%s: unknown key \"%s\" in [pipeline] (known: name, placement, inputs, outputs, params)",
                           where, key);
    }
  }
  return SPN_OK;
}

static int32_t add_plugin_path(build_t *b, const spn_toml_node_t *v, spn_error_t *err) {
  char where[WHERE_MAX];
  if (spn_toml_node_type(v) != SPN_TOML_STRING || !*spn_toml_string(v, NULL)) {
    where_node(v, where, sizeof where);
    return spn_error_set(err, SPN_ETYPE, "%s: [plugins] path entries must be non-empty strings", where);
  }
  char **paths = realloc(b->spec->plugin_paths, (b->spec->n_plugin_paths + 1) * sizeof *paths);
  if (!paths)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  b->spec->plugin_paths = paths;
  /* Relative folders are relative to the config file, not the cwd. */
  char *p = spn__path_join(b->base_dir, spn_toml_string(v, NULL));
  if (!p)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  paths[b->spec->n_plugin_paths++] = p;
  return SPN_OK;
}

static int32_t read_plugins_table(build_t *b, const spn_toml_node_t *t, spn_error_t *err) {
  char where[WHERE_MAX];
  if (spn_toml_node_type(t) != SPN_TOML_TABLE) {
    where_node(t, where, sizeof where);
    return spn_error_set(err, SPN_ETYPE, "%s: \"plugins\" must be a table ([plugins])", where);
  }
  for (size_t i = 0; i < spn_toml_table_len(t); i++) {
    spn_toml_pos_t kp;
    const char *key = spn_toml_table_key_at(t, i, &kp);
    const spn_toml_node_t *v = spn_toml_table_value_at(t, i);
    if (strcmp(key, "path")) {
      where_key(b, kp, where, sizeof where);
      return spn_error_set(err, SPN_ECONFIG, "%s: unknown key \"%s\" in [plugins] (known: path)", where, key);
    }
    int32_t rc = SPN_OK;
    if (spn_toml_node_type(v) == SPN_TOML_ARRAY) {
      for (size_t j = 0; j < spn_toml_array_len(v) && rc == SPN_OK; j++)
        rc = add_plugin_path(b, spn_toml_array_at(v, j), err);
    } else {
      rc = add_plugin_path(b, v, err);
    }
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

/* ---- common stage keys (the host's, not the plugin's) ------------------ */

/* One device index or a comma-separated list: "1", "0,2". */
static bool index_list_ok(const char *s) {
  bool digit = false;
  for (; *s; s++) {
    if (*s >= '0' && *s <= '9')
      digit = true;
    else if (*s == ',' && digit)
      digit = false;
    else
      return false;
  }
  return digit;
}

static bool device_spec_ok(const char *s) {
  if (!strcmp(s, "auto") || !strcmp(s, "cpu") || !strcmp(s, "cuda"))
    return true;
  if (!strncmp(s, "cpu:", 4))
    return index_list_ok(s + 4);
  if (!strncmp(s, "cuda:", 5))
    return index_list_ok(s + 5);
  return false;
}

static int32_t get_int_in(const spn_toml_node_t *v, const char *where, const char *stage, const char *key, int64_t lo,
                          int64_t hi, int64_t *out, spn_error_t *err) {
  if (spn_toml_node_type(v) != SPN_TOML_INTEGER)
    return spn_error_set(err, SPN_ETYPE, "%s: stage \"%s\": key \"%s\" must be an integer, got %s", where, stage, key,
                         spn_toml_type_name(spn_toml_node_type(v)));
  int64_t x = spn_toml_int(v);
  if (x < lo || x > hi)
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": key \"%s\" = %lld is out of range [%lld, %lld]", where,
                         stage, key, (long long)x, (long long)lo, (long long)hi);
  *out = x;
  return SPN_OK;
}

static int32_t get_str(const spn_toml_node_t *v, const char *where, const char *stage, const char *key,
                       const char **out, spn_error_t *err) {
  size_t len = 0;
  if (spn_toml_node_type(v) != SPN_TOML_STRING)
    return spn_error_set(err, SPN_ETYPE, "%s: stage \"%s\": key \"%s\" must be a string, got %s", where, stage, key,
                         spn_toml_type_name(spn_toml_node_type(v)));
  const char *s = spn_toml_string(v, &len);
  if (strlen(s) != len || !len)
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": key \"%s\" must be a non-empty string without NUL",
                         where, stage, key);
  *out = s;
  return SPN_OK;
}

static int32_t set_str(char **slot, const char *s, spn_error_t *err) {
  char *c = strdup(s);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  free(*slot);
  *slot = c;
  return SPN_OK;
}

/* A sub-table's keys: the where of each key, by position in the document. */
static void sub_where(const build_t *b, const spn_toml_node_t *t, size_t i, const char *fallback, char *buf,
                      size_t size) {
  spn_toml_pos_t kp;
  spn_toml_table_key_at(t, i, &kp);
  if (b && kp.line)
    where_key(b, kp, buf, size);
  else
    snprintf(buf, size, "%s", fallback);
}

/* device, instances, batching, endpoint, edge_capacity. `where` is the
 * value's place; b is NULL for --set (sub-keys then use `where` too). */
static int32_t read_common(const build_t *b, spn__stage_spec_t *s, const char *key, const spn_toml_node_t *v,
                           const char *where, spn_error_t *err) {
  const char *str = NULL;
  int64_t x = 0;
  int32_t rc;
  char sw[WHERE_MAX];
  if (!strcmp(key, "device")) {
    if ((rc = get_str(v, where, s->name, key, &str, err)) != SPN_OK)
      return rc;
    if (!device_spec_ok(str))
      return spn_error_set(err, SPN_ECONFIG,
                           "%s: stage \"%s\": device \"%s\" is not auto, cpu, cuda, cpu:N or cuda:N[,M...]", where,
                           s->name, str);
    /* A kind that can only run on one side cannot be pinned to the other. */
    bool cpu = !strncmp(str, "cpu", 3), cuda = !strncmp(str, "cuda", 4);
    if ((cpu && s->kind->device_need == SPN_NEED_CUDA) || (cuda && s->kind->device_need == SPN_NEED_CPU))
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": kind \"%s\" runs on %s only, not on \"%s\"", where,
                           s->name, s->kind->name, s->kind->device_need == SPN_NEED_CPU ? "cpu" : "cuda", str);
    return set_str(&s->device, str, err);
  }
  if (!strcmp(key, "endpoint")) {
    if ((rc = get_str(v, where, s->name, key, &str, err)) != SPN_OK)
      return rc;
    if (strncmp(str, "inproc://", 9) && strncmp(str, "ipc://", 6) && strncmp(str, "tcp://", 6))
      return spn_error_set(err, SPN_ECONFIG,
                           "%s: stage \"%s\": endpoint \"%s\" must start with inproc://, ipc:// or tcp://", where,
                           s->name, str);
    return set_str(&s->endpoint, str, err);
  }
  if (!strcmp(key, "edge_capacity")) {
    if ((rc = get_int_in(v, where, s->name, key, 1, 1000000, &x, err)) != SPN_OK)
      return rc;
    s->edge_capacity = (uint32_t)x;
    return SPN_OK;
  }
  if (!strcmp(key, "instances")) {
    /* instances = 2 is short for instances = { count = 2 }. */
    if (spn_toml_node_type(v) == SPN_TOML_INTEGER) {
      if ((rc = get_int_in(v, where, s->name, key, 1, 1024, &x, err)) != SPN_OK)
        return rc;
      s->instances = (uint32_t)x;
      return SPN_OK;
    }
    if (spn_toml_node_type(v) != SPN_TOML_TABLE)
      return spn_error_set(err, SPN_ETYPE,
                           "%s: stage \"%s\": instances must be a table { count = N, devices = \"all\" }, got %s",
                           where, s->name, spn_toml_type_name(spn_toml_node_type(v)));
    for (size_t i = 0; i < spn_toml_table_len(v); i++) {
      const char *k = spn_toml_table_key_at(v, i, NULL);
      const spn_toml_node_t *sv = spn_toml_table_value_at(v, i);
      sub_where(b, v, i, where, sw, sizeof sw);
      if (!strcmp(k, "count")) {
        if ((rc = get_int_in(sv, sw, s->name, "instances.count", 1, 1024, &x, err)) != SPN_OK)
          return rc;
        s->instances = (uint32_t)x;
      } else if (!strcmp(k, "devices")) {
        if ((rc = get_str(sv, sw, s->name, "instances.devices", &str, err)) != SPN_OK)
          return rc;
        if (strcmp(str, "all") && !index_list_ok(str))
          return spn_error_set(err, SPN_ECONFIG,
                               "%s: stage \"%s\": instances.devices \"%s\" must be \"all\" or indexes like \"0,2\"", sw,
                               s->name, str);
        if ((rc = set_str(&s->instance_devices, str, err)) != SPN_OK)
          return rc;
      } else {
        return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": unknown key \"%s\" in instances (known: count, devices)",
                             sw, s->name, k);
      }
    }
    return SPN_OK;
  }
  if (!strcmp(key, "batching")) {
    if (spn_toml_node_type(v) != SPN_TOML_TABLE)
      return spn_error_set(err, SPN_ETYPE,
                           "%s: stage \"%s\": batching must be a table { max_batch = N, max_delay_ms = M }, got %s",
                           where, s->name, spn_toml_type_name(spn_toml_node_type(v)));
    for (size_t i = 0; i < spn_toml_table_len(v); i++) {
      const char *k = spn_toml_table_key_at(v, i, NULL);
      const spn_toml_node_t *sv = spn_toml_table_value_at(v, i);
      sub_where(b, v, i, where, sw, sizeof sw);
      if (!strcmp(k, "max_batch")) {
        if ((rc = get_int_in(sv, sw, s->name, "batching.max_batch", 1, 65536, &x, err)) != SPN_OK)
          return rc;
        s->max_batch = (uint32_t)x;
      } else if (!strcmp(k, "max_delay_ms")) {
        if ((rc = get_int_in(sv, sw, s->name, "batching.max_delay_ms", 0, 60000, &x, err)) != SPN_OK)
          return rc;
        s->max_delay_ms = (uint32_t)x;
      } else {
        return spn_error_set(err, SPN_ECONFIG,
                             "%s: stage \"%s\": unknown key \"%s\" in batching (known: max_batch, max_delay_ms)", sw,
                             s->name, k);
      }
    }
    return SPN_OK;
  }
  return spn_error_set(err, SPN_EINTERNAL, "%s: stage \"%s\": \"%s\" is not a common key", where, s->name, key);
}

/* ---- stages ------------------------------------------------------------- */

static void kind_list(const spn__registry_t *reg, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < spn__registry_count(reg); i++)
    spn__name_list_add(buf, size, &n, spn__registry_at(reg, i, NULL)->name);
  if (!n)
    snprintf(buf, size, "none: no plugin was loaded");
}

/* name and kind of stage i, and its spec with defaults. */
static int32_t read_stage_head(build_t *b, size_t i, spn_error_t *err) {
  const spn_toml_node_t *t = b->sb[i].table;
  spn__stage_spec_t *s = &b->spec->stages[i];
  char where[WHERE_MAX];
  where_node(t, s->where, sizeof s->where);
  const spn_toml_node_t *nv = spn_toml_table_get(t, "name", NULL);
  if (!nv)
    return spn_error_set(err, SPN_ECONFIG, "%s: [[stage]] #%zu has no name", s->where, i + 1);
  where_node(nv, where, sizeof where);
  if (spn_toml_node_type(nv) != SPN_TOML_STRING || !spn__is_plain_name(spn_toml_string(nv, NULL)))
    return spn_error_set(err, SPN_ECONFIG,
                         "%s: [[stage]] #%zu: name must be a string of letters, digits, '_' or '-' (it is used as "
                         "\"stage.port\")",
                         where, i + 1);
  const char *name = spn_toml_string(nv, NULL);
  size_t other;
  if (find_stage(b->spec, name, &other))
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": duplicate stage name (first defined at %s)", where, name,
                         b->spec->stages[other].where);
  if (!(s->name = strdup(name)))
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  const spn_toml_node_t *kv = spn_toml_table_get(t, "kind", NULL);
  if (!kv)
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": no kind (kind = \"...\" names a stage kind)", s->where,
                         name);
  where_node(kv, where, sizeof where);
  if (spn_toml_node_type(kv) != SPN_TOML_STRING)
    return spn_error_set(err, SPN_ETYPE, "%s: stage \"%s\": kind must be a string, got %s", where, name,
                         spn_toml_type_name(spn_toml_node_type(kv)));
  const char *kind = spn_toml_string(kv, NULL);
  s->kind = spn__registry_find(b->reg, kind, NULL);
  if (!s->kind) {
    char known[512];
    kind_list(b->reg, known, sizeof known);
    return spn_error_set(err, SPN_ECONFIG,
                         "%s: stage \"%s\": unknown stage kind \"%s\" (known: %s; is its plugin on the search path?)",
                         where, name, kind, known);
  }
  s->instances = 1;
  s->max_batch = s->kind->max_batch;
  s->max_delay_ms = s->kind->max_delay_ms;
  if (!(s->device = strdup("auto")))
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  size_t nf = 0;
  for (const spn_config_field_t *f = s->kind->schema; f && f->key; f++)
    nf++;
  b->sb[i].n_fields = nf;
  b->sb[i].set = calloc(nf ? nf : 1, sizeof(bool));
  if (!b->sb[i].set)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  return spn__config_new(s->kind, &s->config, err);
}

static int32_t set_field(build_t *b, size_t i, const char *key, const spn_toml_node_t *v, const char *where,
                         const char *base_dir, spn_error_t *err) {
  spn__stage_spec_t *s = &b->spec->stages[i];
  const spn_config_field_t *f = spn__config_field(s->kind, key);
  if (!f) {
    char keys[512];
    spn__config_key_list(s->kind, keys, sizeof keys);
    return spn_error_set(err, SPN_ECONFIG,
                         "%s: stage \"%s\": unknown key \"%s\" for kind \"%s\" (its keys: %s; common keys: name, "
                         "kind, inputs, device, instances, batching, endpoint, edge_capacity)",
                         where, s->name, key, s->kind->name, keys);
  }
  b->sb[i].set[f - s->kind->schema] = true;
  return spn__config_set(s->kind, f, s->config, v, where, s->name, base_dir, err);
}

/* convert = "auto" | "none" (on a stage or an edge). */
const char *spn__precision_name(int32_t p) {
  switch (p) {
  case SPN__PREC_FP32: return "fp32";
  case SPN__PREC_FP16: return "fp16";
  default: return "tf32";
  }
}

/* precision = "auto" | "fp32" | "tf32" | "fp16" (ABI 1.1 host key; a
 * kind's own "precision" key keeps precedence, as with convert). */
static int32_t read_precision(const spn_toml_node_t *v, const char *where, const char *stage, int32_t *out,
                              spn_error_t *err) {
  static const char *const names[] = {"auto", "fp32", "tf32", "fp16"};
  const char *str = NULL;
  int32_t rc = get_str(v, where, stage, "precision", &str, err);
  if (rc != SPN_OK)
    return rc;
  for (int32_t i = 0; i < 4; i++)
    if (!strcmp(str, names[i])) {
      *out = i;
      return SPN_OK;
    }
  return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": precision \"%s\" is not auto, fp32, tf32 or fp16", where,
                       stage, str);
}

static int32_t read_convert(const spn_toml_node_t *v, const char *where, const char *stage, bool *out,
                            spn_error_t *err) {
  const char *str = NULL;
  int32_t rc = get_str(v, where, stage, "convert", &str, err);
  if (rc != SPN_OK)
    return rc;
  if (strcmp(str, "auto") && strcmp(str, "none"))
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": convert \"%s\" is not \"auto\" or \"none\"", where,
                         stage, str);
  *out = !strcmp(str, "auto");
  return SPN_OK;
}

static int32_t read_stage_body(build_t *b, size_t i, spn_error_t *err) {
  const spn_toml_node_t *t = b->sb[i].table;
  spn__stage_spec_t *s = &b->spec->stages[i];
  for (size_t k = 0; k < spn_toml_table_len(t); k++) {
    spn_toml_pos_t kp;
    const char *key = spn_toml_table_key_at(t, k, &kp);
    const spn_toml_node_t *v = spn_toml_table_value_at(t, k);
    char where[WHERE_MAX];
    int32_t rc = SPN_OK;
    if (!strcmp(key, "name") || !strcmp(key, "kind"))
      continue;
    if (!strcmp(key, "inputs")) {
      b->sb[i].inputs = v;
      continue;
    }
    if (!strcmp(key, "convert") && !spn__config_field(s->kind, key)) {
      /* ABI 1.1; a kind's own "convert" key (ABI 1.0) keeps precedence. */
      where_node(v, where, sizeof where);
      if ((rc = read_convert(v, where, s->name, &s->convert, err)) != SPN_OK)
        return rc;
      continue;
    }
    if (!strcmp(key, "precision") && !spn__config_field(s->kind, key)) {
      where_node(v, where, sizeof where);
      if ((rc = read_precision(v, where, s->name, &s->precision, err)) != SPN_OK)
        return rc;
      continue;
    }
    if (spn__is_common_key(key)) {
      where_node(v, where, sizeof where);
      rc = read_common(b, s, key, v, where, err);
    } else {
      where_key(b, kp, where, sizeof where);
      /* The key's position for unknown keys, the value's for bad values. */
      if (spn__config_field(s->kind, key))
        where_node(v, where, sizeof where);
      rc = set_field(b, i, key, v, where, b->base_dir, err);
    }
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t apply_override(build_t *b, const char *text, spn_error_t *err) {
  char stage[128], key[128];
  const char *value;
  int32_t rc = spn__override_split(text, stage, sizeof stage, key, sizeof key, &value, err);
  if (rc != SPN_OK)
    return rc;
  char where[WHERE_MAX];
  snprintf(where, sizeof where, "--set \"%.200s\"", text);
  size_t i;
  if (!find_stage(b->spec, stage, &i))
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": no such stage in %s", where, stage, b->file);
  if (!strcmp(key, "name") || !strcmp(key, "kind") || !strcmp(key, "inputs"))
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": \"%s\" cannot be overridden; edit the config", where,
                         stage, key);
  spn_toml_doc_t *vdoc = NULL;
  const spn_toml_node_t *v = NULL;
  if ((rc = spn__override_value(value, &vdoc, &v, err)) != SPN_OK)
    return rc;
  if (!strcmp(key, "precision") && !spn__config_field(b->spec->stages[i].kind, key))
    rc = read_precision(v, where, stage, &b->spec->stages[i].precision, err);
  else if (spn__is_common_key(key))
    rc = read_common(NULL, &b->spec->stages[i], key, v, where, err);
  else
    rc = set_field(b, i, key, v, where, NULL, err); /* --set paths are as typed: relative to the cwd */
  spn_toml_doc_free(&vdoc);
  return rc;
}

static int32_t check_required(build_t *b, size_t i, spn_error_t *err) {
  spn__stage_spec_t *s = &b->spec->stages[i];
  for (size_t k = 0; k < b->sb[i].n_fields; k++) {
    const spn_config_field_t *f = &s->kind->schema[k];
    if ((f->flags & SPN_CONFIG_REQUIRED) && !b->sb[i].set[k])
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": missing required key \"%s\" (%s)", s->where, s->name,
                           f->key, f->doc ? f->doc : "no description");
  }
  return SPN_OK;
}

/* ---- wiring ------------------------------------------------------------- */

static int32_t add_edge(build_t *b, spn__edge_spec_t e, spn_error_t *err) {
  spn__pipeline_spec_t *spec = b->spec;
  if (spec->n_edges == b->cap_edges) {
    size_t cap = b->cap_edges ? b->cap_edges * 2 : 8;
    spn__edge_spec_t *v = realloc(spec->edges, cap * sizeof *v);
    if (!v)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    spec->edges = v;
    b->cap_edges = cap;
  }
  spec->edges[spec->n_edges++] = e;
  return SPN_OK;
}

static void port_list(const spn_port_t *p, uint32_t n, char *buf, size_t size) {
  size_t w = 0;
  buf[0] = '\0';
  for (uint32_t i = 0; i < n; i++)
    spn__name_list_add(buf, size, &w, p[i].name);
  if (!n)
    snprintf(buf, size, "none");
}

/* Connect input port `to_port` of stage `to` to the reference `ref_node`
 * ("stage" or "stage.port"). */
static int32_t connect(build_t *b, uint32_t to, uint32_t to_port, const spn_toml_node_t *ref_node, spn_error_t *err) {
  spn__pipeline_spec_t *spec = b->spec;
  spn__stage_spec_t *s = &spec->stages[to];
  char where[WHERE_MAX], ports[256];
  bool convert = s->convert;
  where_node(ref_node, where, sizeof where);
  if (spn_toml_node_type(ref_node) == SPN_TOML_TABLE) {
    /* ABI 1.1: { from = "stage.port", convert = "auto" } */
    const spn_toml_node_t *edge = ref_node;
    ref_node = NULL;
    for (size_t k = 0; k < spn_toml_table_len(edge); k++) {
      spn_toml_pos_t kp;
      const char *key = spn_toml_table_key_at(edge, k, &kp);
      const spn_toml_node_t *v = spn_toml_table_value_at(edge, k);
      int32_t rc;
      if (!strcmp(key, "from")) {
        ref_node = v;
      } else if (!strcmp(key, "convert")) {
        char cw[WHERE_MAX];
        where_node(v, cw, sizeof cw);
        if ((rc = read_convert(v, cw, s->name, &convert, err)) != SPN_OK)
          return rc;
      } else {
        where_key(b, kp, where, sizeof where);
        return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": unknown key \"%s\" in an input (known: from, convert)",
                             where, s->name, key);
      }
    }
    if (!ref_node)
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": an input table needs from = \"stage.port\"", where,
                           s->name);
    where_node(ref_node, where, sizeof where);
  }
  if (spn_toml_node_type(ref_node) != SPN_TOML_STRING)
    return spn_error_set(err, SPN_ETYPE,
                         "%s: stage \"%s\": an input is a string \"stage\" or \"stage.port\" (or a table { from = "
                         "\"stage.port\", convert = \"auto\" }), got %s",
                         where, s->name, spn_toml_type_name(spn_toml_node_type(ref_node)));
  const char *ref = spn_toml_string(ref_node, NULL);
  const char *dot = strchr(ref, '.');
  size_t nl = dot ? (size_t)(dot - ref) : strlen(ref);
  size_t from = spec->n_stages;
  for (size_t i = 0; i < spec->n_stages; i++)
    if (strlen(spec->stages[i].name) == nl && !memcmp(spec->stages[i].name, ref, nl))
      from = i;
  if (from == spec->n_stages)
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": input \"%s\" names no stage \"%.*s\"", where, s->name,
                         ref, (int)nl, ref);
  const char *from_name = spec->stages[from].name;
  const spn_stage_kind_t *fk = spec->stages[from].kind;
  uint32_t from_port = 0;
  if (!fk->n_outputs)
    return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": input \"%s\": stage \"%s\" (kind \"%s\") has no outputs",
                         where, s->name, ref, from_name, fk->name);
  if (dot) {
    for (from_port = 0; from_port < fk->n_outputs; from_port++)
      if (!strcmp(fk->outputs[from_port].name, dot + 1))
        break;
    if (from_port == fk->n_outputs) {
      port_list(fk->outputs, fk->n_outputs, ports, sizeof ports);
      return spn_error_set(err, SPN_ECONFIG,
                           "%s: stage \"%s\": input \"%s\": stage \"%s\" (kind \"%s\") has no output port \"%s\" "
                           "(outputs: %s)",
                           where, s->name, ref, from_name, fk->name, dot + 1, ports);
    }
  }
  const spn_port_t *op = &fk->outputs[from_port], *ip = &s->kind->inputs[to_port];
  if (strcmp(op->type, ip->type) && strcmp(op->type, "any") && strcmp(ip->type, "any"))
    return spn_error_set(err, SPN_ECONFIG,
                         "%s: stage \"%s\": input port \"%s\" takes %s, but \"%s.%s\" gives %s (port type mismatch)",
                         where, s->name, ip->name, ip->type, from_name, op->name, op->type);
  spn__edge_spec_t e = {.from_stage = (uint32_t)from, .from_port = from_port, .to_stage = to, .to_port = to_port,
                        .convert = convert};
  snprintf(e.where, sizeof e.where, "%s", where);
  return add_edge(b, e, err);
}

static int32_t wire_stage(build_t *b, uint32_t i, spn_error_t *err) {
  spn__stage_spec_t *s = &b->spec->stages[i];
  const spn_stage_kind_t *k = s->kind;
  const spn_toml_node_t *in = b->sb[i].inputs;
  char where[WHERE_MAX], ports[256];
  int32_t rc;
  size_t first_edge = b->spec->n_edges;
  port_list(k->inputs, k->n_inputs, ports, sizeof ports);
  if (in && spn_toml_node_type(in) == SPN_TOML_ARRAY) {
    /* Positional: inputs[j] feeds the kind's j-th input port. */
    size_t n = spn_toml_array_len(in);
    if (n > k->n_inputs) {
      where_node(spn_toml_array_at(in, k->n_inputs), where, sizeof where);
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": kind \"%s\" has %u input port(s) (%s), inputs lists %zu",
                           where, s->name, k->name, k->n_inputs, ports, n);
    }
    for (size_t j = 0; j < n; j++)
      if ((rc = connect(b, i, (uint32_t)j, spn_toml_array_at(in, j), err)) != SPN_OK)
        return rc;
  } else if (in && spn_toml_node_type(in) == SPN_TOML_TABLE) {
    /* By name: inputs = { video = "decode.video" }. */
    for (size_t j = 0; j < spn_toml_table_len(in); j++) {
      spn_toml_pos_t kp;
      const char *port = spn_toml_table_key_at(in, j, &kp);
      uint32_t p = 0;
      while (p < k->n_inputs && strcmp(k->inputs[p].name, port))
        p++;
      if (p == k->n_inputs) {
        where_key(b, kp, where, sizeof where);
        return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": kind \"%s\" has no input port \"%s\" (inputs: %s)",
                             where, s->name, k->name, port, ports);
      }
      if ((rc = connect(b, i, p, spn_toml_table_value_at(in, j), err)) != SPN_OK)
        return rc;
    }
  } else if (in) {
    where_node(in, where, sizeof where);
    return spn_error_set(err, SPN_ETYPE,
                         "%s: stage \"%s\": inputs must be an array [\"stage.port\", ...] or a table { port = "
                         "\"stage.port\" }, got %s",
                         where, s->name, spn_toml_type_name(spn_toml_node_type(in)));
  }
  /* Every input port must be fed: a stage waiting on an edge nobody writes
   * would hold every job forever. */
  for (uint32_t p = 0; p < k->n_inputs; p++) {
    bool fed = false;
    for (size_t e = first_edge; e < b->spec->n_edges; e++)
      fed = fed || b->spec->edges[e].to_port == p;
    if (!fed) {
      if (in)
        where_node(in, where, sizeof where);
      else
        snprintf(where, sizeof where, "%s", s->where);
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": input port \"%s\" of kind \"%s\" is not connected%s",
                           where, s->name, k->inputs[p].name, k->name,
                           in ? "" : " (add inputs = [\"stage.port\"])");
    }
  }
  return SPN_OK;
}

/* Kahn's algorithm; ties broken by file order so the result is stable. On a
 * cycle, walk predecessors among the unplaced stages until one repeats and
 * name the loop. */
static int32_t order_stages(build_t *b, spn_error_t *err) {
  spn__pipeline_spec_t *spec = b->spec;
  size_t n = spec->n_stages;
  size_t *indeg = calloc(n, sizeof *indeg), *order = calloc(n, sizeof *order), *newidx = calloc(n, sizeof *newidx);
  bool *placed = calloc(n, sizeof *placed);
  spn__stage_spec_t *sorted = calloc(n, sizeof *sorted);
  int32_t rc = SPN_OK;
  if (!indeg || !order || !newidx || !placed || !sorted) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t e = 0; e < spec->n_edges; e++)
    indeg[spec->edges[e].to_stage]++;
  size_t done = 0;
  while (done < n) {
    size_t pick = n;
    for (size_t i = 0; i < n && pick == n; i++)
      if (!placed[i] && indeg[i] == 0)
        pick = i;
    if (pick == n)
      break;
    placed[pick] = true;
    newidx[pick] = done;
    order[done++] = pick;
    for (size_t e = 0; e < spec->n_edges; e++)
      if (spec->edges[e].from_stage == pick)
        indeg[spec->edges[e].to_stage]--;
  }
  if (done < n) {
    /* Every unplaced stage has an unplaced producer: follow them back. */
    size_t cur = 0;
    while (placed[cur])
      cur++;
    size_t *seen = indeg; /* reuse: step at which a stage was visited + 1 */
    memset(seen, 0, n * sizeof *seen);
    size_t step = 0;
    while (!seen[cur]) {
      seen[cur] = ++step;
      for (size_t e = 0; e < spec->n_edges; e++)
        if (spec->edges[e].to_stage == cur && !placed[spec->edges[e].from_stage]) {
          cur = spec->edges[e].from_stage;
          break;
        }
    }
    /* cur is on the loop; walking the same predecessors from it again
     * goes round it once. Print it in data-flow order (producer first). */
    char path[512];
    size_t w = 0, at = cur;
    size_t len = step - seen[cur] + 1;
    size_t *loop = order; /* reuse */
    for (size_t k = 0; k < len; k++) {
      loop[len - 1 - k] = at;
      for (size_t e = 0; e < spec->n_edges; e++)
        if (spec->edges[e].to_stage == at && !placed[spec->edges[e].from_stage]) {
          at = spec->edges[e].from_stage;
          break;
        }
    }
    path[0] = '\0';
    for (size_t k = 0; k <= len && w + 1 < sizeof path; k++) {
      int c = snprintf(path + w, sizeof path - w, "%s%s", k ? " -> " : "", spec->stages[loop[k % len]].name);
      if (c < 0)
        break;
      w += (size_t)c;
    }
    const spn__stage_spec_t *s = &spec->stages[loop[0]];
    char where[WHERE_MAX];
    if (b->sb[loop[0]].inputs)
      where_node(b->sb[loop[0]].inputs, where, sizeof where);
    else
      snprintf(where, sizeof where, "%s", s->where);
    rc = spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": cycle in the pipeline: %s", where, s->name, path);
    goto out;
  }
  for (size_t k = 0; k < n; k++)
    sorted[k] = spec->stages[order[k]];
  for (size_t e = 0; e < spec->n_edges; e++) {
    spec->edges[e].from_stage = (uint32_t)newidx[spec->edges[e].from_stage];
    spec->edges[e].to_stage = (uint32_t)newidx[spec->edges[e].to_stage];
  }
  free(spec->stages);
  spec->stages = sorted;
  sorted = NULL;
out:
  free(indeg);
  free(order);
  free(newidx);
  free(placed);
  free(sorted);
  return rc;
}

/* ---- the whole spec ----------------------------------------------------- */

void spn__spec_free(spn__pipeline_spec_t **specp) {
  if (!specp || !*specp)
    return;
  spn__pipeline_spec_t *spec = *specp;
  for (size_t i = 0; i < spec->n_stages; i++) {
    spn__stage_spec_t *s = &spec->stages[i];
    if (s->kind)
      spn__config_free(s->kind, &s->config);
    free(s->name);
    free(s->device);
    free(s->instance_devices);
    free(s->endpoint);
    free(s->in_caps);
    free(s->out_caps);
  }
  free(spec->stages);
  free(spec->edges);
  for (size_t i = 0; i < spec->n_plugin_paths; i++)
    free(spec->plugin_paths[i]);
  free(spec->plugin_paths);
  for (size_t i = 0; i < spec->n_bindings; i++) {
    free(spec->bindings[i].name);
    free(spec->bindings[i].target);
    free(spec->bindings[i].fallback);
  }
  free(spec->bindings);
  free(spec->name);
  free(spec->file);
  free(spec);
  *specp = NULL;
}

static int32_t read_top(build_t *b, const spn_toml_node_t *root, const spn_toml_node_t **stages, spn_error_t *err) {
  char where[WHERE_MAX];
  int32_t rc = SPN_OK;
  *stages = NULL;
  for (size_t i = 0; i < spn_toml_table_len(root) && rc == SPN_OK; i++) {
    spn_toml_pos_t kp;
    const char *key = spn_toml_table_key_at(root, i, &kp);
    const spn_toml_node_t *v = spn_toml_table_value_at(root, i);
    if (!strcmp(key, "pipeline")) {
      rc = read_pipeline_table(b, v, err);
    } else if (!strcmp(key, "plugins")) {
      rc = read_plugins_table(b, v, err);
    } else if (!strcmp(key, "stage")) {
      if (spn_toml_node_type(v) != SPN_TOML_ARRAY) {
        where_node(v, where, sizeof where);
        return spn_error_set(err, SPN_ETYPE, "%s: \"stage\" must be an array of tables ([[stage]])", where);
      }
      *stages = v;
    } else {
      where_key(b, kp, where, sizeof where);
      return spn_error_set(err, SPN_ECONFIG,
                           "%s: unknown top-level key \"%s\" (a pipeline has [pipeline], [[stage]] and [plugins])",
                           where, key);
    }
  }
  return rc;
}

int32_t spn__spec_from_toml(const spn__registry_t *reg, const spn_toml_doc_t *doc, const char *const *overrides,
                            size_t n_overrides, spn__pipeline_spec_t **out, spn_error_t *err) {
  build_t b = {.reg = reg, .file = spn_toml_doc_name(doc)};
  int32_t rc = SPN_OK;
  const spn_toml_node_t *root = spn_toml_doc_root(doc), *stages = NULL;
  b.spec = calloc(1, sizeof *b.spec);
  b.base_dir = dir_of(b.file);
  if (!b.spec || !b.base_dir || !(b.spec->file = strdup(b.file))) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  if ((rc = read_top(&b, root, &stages, err)) != SPN_OK)
    goto out;
  if (!b.spec->name && !(b.spec->name = stem_of(b.file))) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  size_t n = stages ? spn_toml_array_len(stages) : 0;
  if (n == 0) {
    rc = spn_error_set(err, SPN_ECONFIG, "%s:1:1: pipeline \"%s\" has no [[stage]] tables", b.file, b.spec->name);
    goto out;
  }
  if (n > 4096) {
    rc = spn_error_set(err, SPN_ECONFIG, "%s: %zu stages, at most 4096", b.file, n);
    goto out;
  }
  b.spec->stages = calloc(n, sizeof *b.spec->stages);
  b.sb = calloc(n, sizeof *b.sb);
  if (!b.spec->stages || !b.sb) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    b.sb[i].table = spn_toml_array_at(stages, i);
    if (spn_toml_node_type(b.sb[i].table) != SPN_TOML_TABLE) {
      char where[WHERE_MAX];
      where_node(b.sb[i].table, where, sizeof where);
      rc = spn_error_set(err, SPN_ETYPE, "%s: stage #%zu must be a table ([[stage]])", where, i + 1);
      goto out;
    }
  }
  /* Heads first (n_stages grows as names are read, so duplicates are found
   * and every name exists before any input refers to it). */
  for (size_t i = 0; i < n; i++) {
    b.spec->n_stages = i + 1;
    if ((rc = read_stage_head(&b, i, err)) != SPN_OK)
      goto out;
  }
  for (size_t i = 0; i < n; i++)
    if ((rc = read_stage_body(&b, i, err)) != SPN_OK)
      goto out;
  if ((rc = check_bindings(b.spec, err)) != SPN_OK)
    goto out;
  for (size_t i = 0; i < n_overrides; i++)
    if ((rc = apply_override(&b, overrides[i], err)) != SPN_OK)
      goto out;
  for (size_t i = 0; i < n; i++)
    if ((rc = check_required(&b, i, err)) != SPN_OK)
      goto out;
  for (size_t i = 0; i < n; i++)
    if ((rc = wire_stage(&b, (uint32_t)i, err)) != SPN_OK)
      goto out;
  if ((rc = order_stages(&b, err)) != SPN_OK)
    goto out;
  if ((rc = spn__spec_negotiate(reg, b.spec, err)) != SPN_OK)
    goto out;
  *out = b.spec;
  b.spec = NULL;
out:
  if (b.sb) {
    size_t ns = stages ? spn_toml_array_len(stages) : 0;
    for (size_t i = 0; i < ns; i++)
      free(b.sb[i].set);
  }
  free(b.sb);
  free(b.base_dir);
  spn__spec_free(&b.spec);
  return rc;
}

/* ---- per-job configs ------------------------------------------------------ */

int32_t spn__spec_job_config(const spn__pipeline_spec_t *spec, uint32_t i, const char *const *overrides,
                             size_t n_overrides, void **out, spn_error_t *err) {
  if (i >= spec->n_stages)
    return spn_error_set(err, SPN_EINVAL, "job config: stage index %u out of range", i);
  const spn__stage_spec_t *s = &spec->stages[i];
  void *cfg = NULL;
  int32_t rc = spn__config_copy(s->kind, s->config, &cfg, err);
  if (rc != SPN_OK)
    return rc;
  /* Every override is checked, whichever stage it is for, so a bad one is
   * refused however the runtime walks the stages. */
  for (size_t k = 0; k < n_overrides && rc == SPN_OK; k++) {
    char stage[128], key[128], where[WHERE_MAX];
    const char *value;
    if ((rc = spn__override_split(overrides[k], stage, sizeof stage, key, sizeof key, &value, err)) != SPN_OK)
      break;
    snprintf(where, sizeof where, "job override \"%.200s\"", overrides[k]);
    const spn__stage_spec_t *target = find_stage(spec, stage, NULL);
    if (!target) {
      rc = spn_error_set(err, SPN_ECONFIG, "%s: pipeline \"%s\" has no stage \"%s\"", where, spec->name, stage);
      break;
    }
    const spn_config_field_t *f = spn__config_field(target->kind, key);
    if (!f) {
      char keys[512];
      spn__config_key_list(target->kind, keys, sizeof keys);
      rc = spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": unknown key \"%s\" for kind \"%s\" (its keys: %s)", where,
                         stage, key, target->kind->name, keys);
      break;
    }
    if (!(f->flags & SPN_CONFIG_PER_JOB)) {
      rc = spn_error_set(err, SPN_EPERM, "%s: stage \"%s\": key \"%s\" is set per pipeline, not per job", where, stage,
                         key);
      break;
    }
    spn_toml_doc_t *vdoc = NULL;
    const spn_toml_node_t *v = NULL;
    if ((rc = spn__override_value(value, &vdoc, &v, err)) != SPN_OK)
      break;
    if (target == s)
      rc = spn__config_set(s->kind, f, cfg, v, where, stage, NULL, err);
    else {
      /* Type and range check against a scratch copy. */
      void *scratch = NULL;
      rc = spn__config_copy(target->kind, target->config, &scratch, err);
      if (rc == SPN_OK)
        rc = spn__config_set(target->kind, f, scratch, v, where, stage, NULL, err);
      spn__config_free(target->kind, &scratch);
    }
    spn_toml_doc_free(&vdoc);
  }
  if (rc != SPN_OK) {
    spn__config_free(s->kind, &cfg);
    return rc;
  }
  *out = cfg;
  return SPN_OK;
}

/* ---- parse + plugins + spec --------------------------------------------- */

int32_t spn__spec_load(spn__registry_t *reg, const spn_host_api_t *host, const char *const *plugin_dirs,
                       size_t n_plugin_dirs, const char *path, const char *src, size_t len,
                       const char *const *overrides, size_t n_overrides, spn__pipeline_spec_t **out,
                       spn_error_t *err) {
  spn_toml_doc_t *doc = NULL;
  int32_t rc = src ? spn_toml_parse(src, len, path, &doc, err) : spn_toml_parse_file(path, &doc, err);
  if (rc != SPN_OK)
    return rc;
  /* [plugins] path first: kinds must be known before stages are read. The
   * folders are resolved against the config's folder. */
  char **cdirs = NULL;
  size_t n_cdirs = 0;
  const spn_toml_node_t *pl = spn_toml_table_get(spn_toml_doc_root(doc), "plugins", NULL);
  const spn_toml_node_t *pp = pl && spn_toml_node_type(pl) == SPN_TOML_TABLE ? spn_toml_table_get(pl, "path", NULL)
                                                                              : NULL;
  if (pp) {
    char *base = dir_of(path);
    size_t n = spn_toml_node_type(pp) == SPN_TOML_ARRAY ? spn_toml_array_len(pp) : 1;
    cdirs = calloc(n, sizeof *cdirs);
    for (size_t i = 0; cdirs && base && i < n; i++) {
      const spn_toml_node_t *v = spn_toml_node_type(pp) == SPN_TOML_ARRAY ? spn_toml_array_at(pp, i) : pp;
      if (spn_toml_node_type(v) == SPN_TOML_STRING) /* bad entries are reported by the spec */
        cdirs[n_cdirs++] = spn__path_join(base, spn_toml_string(v, NULL));
    }
    free(base);
  }
  /* Refused plugins do not stop the load: a stage whose kind is missing
   * because of one is reported below as an unknown kind. */
  spn__registry_load_search_path(reg, host, plugin_dirs, n_plugin_dirs, (const char *const *)cdirs, n_cdirs, NULL);
  for (size_t i = 0; i < n_cdirs; i++)
    free(cdirs[i]);
  free(cdirs);
  rc = spn__spec_from_toml(reg, doc, overrides, n_overrides, out, err);
  spn_toml_doc_free(&doc);
  return rc;
}
