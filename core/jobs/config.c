/* config.c — the server configuration: defaults and loading configs/server.toml.
 *
 * Every key is listed in one table with its type; unknown keys and wrong types
 * are refused with "file:line:col". The TOML parser lives in libspindle
 * (spindle/toml.h). Relative root directories are taken relative to the
 * working directory of `spindle serve`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs-internal.h"
#include "spindle/toml.h"


void spn_server_config_defaults(spn_server_config_t *c) {
  memset(c, 0, sizeof *c);
  c->workers = 2;
  c->lease_ms = 3000;
  c->heartbeat_ms = 1000;
  c->max_attempts = 3;
  c->backoff_base_ms = 1000;
  c->backoff_max_ms = 60000;
  c->max_msg_size = 1 << 20;
  c->max_priority = 100;
  c->chunk_bytes = 65536;
  c->ready_fd = -1;
  c->drain_grace_s = 30;
  c->queue_wait_s = 300;
  c->cancel_grace_s = 120;
  c->keep_ended_s = 7 * 86400;
}

void spn_server_config_clear(spn_server_config_t *c) {
  free(c->bind);
  free(c->db_path);
  free(c->queue_backend);
  free(c->queue_url);
  free(c->queue_auth_file);
  free(c->queue_prefix);
  free(c->curve_secret);
  free(c->curve_key_file);
  free(c->http);
  free(c->curve_clients_dir);
  free(c->curve_workers_dir);
  free(c->exec_log);
  for (size_t i = 0; i < c->n_pipelines; i++)
    free(c->pipelines[i]);
  free(c->pipelines);
  for (size_t i = 0; i < c->n_pipeline_defs; i++) {
    free(c->pipeline_defs[i].name);
    free(c->pipeline_defs[i].config);
  }
  free(c->pipeline_defs);
  free(c->devices);
  spn__roots_free(&c->input_roots);
  spn__roots_free(&c->output_roots);
  memset(c, 0, sizeof *c);
}

enum kind { K_STR, K_U32, K_BOOL, K_ROOTS, K_STRS };

typedef struct key_def {
  const char *section, *key;
  enum kind kind;
  size_t off;
  uint32_t min, max;
} key_def_t;

#define OFF(f) offsetof(spn_server_config_t, f)
static const key_def_t keys[] = {
    {"server", "bind", K_STR, OFF(bind), 0, 0},
    {"server", "workers", K_U32, OFF(workers), 0, 256},
    {"server", "max_message_bytes", K_U32, OFF(max_msg_size), 1024, 1u << 30},
    {"server", "pipelines", K_STRS, OFF(pipelines), 0, 0},
    {"server", "http", K_STR, OFF(http), 0, 0},
    {"server", "devices", K_STR, OFF(devices), 0, 0},
    {"queue", "path", K_STR, OFF(db_path), 0, 0},
    {"queue", "backend", K_STR, OFF(queue_backend), 0, 0},
    {"queue", "url", K_STR, OFF(queue_url), 0, 0},
    {"queue", "auth_file", K_STR, OFF(queue_auth_file), 0, 0},
    {"queue", "prefix", K_STR, OFF(queue_prefix), 0, 0},
    {"queue", "wait_s", K_U32, OFF(queue_wait_s), 0, 86400},
    {"server", "drain_grace_s", K_U32, OFF(drain_grace_s), 0, 86400},
    {"server", "cancel_grace_s", K_U32, OFF(cancel_grace_s), 0, 86400},
    {"queue", "sync_full", K_BOOL, OFF(sync_full), 0, 0},
    {"queue", "lease_ms", K_U32, OFF(lease_ms), 100, 3600000},
    {"queue", "heartbeat_ms", K_U32, OFF(heartbeat_ms), 50, 60000},
    {"queue", "max_attempts", K_U32, OFF(max_attempts), 1, 100},
    {"queue", "job_timeout_s", K_U32, OFF(job_timeout_s), 0, 7 * 86400},
    {"queue", "keep_ended_s", K_U32, OFF(keep_ended_s), 0, 3650u * 86400},
    {"queue", "backoff_base_ms", K_U32, OFF(backoff_base_ms), 1, 3600000},
    {"queue", "backoff_max_ms", K_U32, OFF(backoff_max_ms), 1, 86400000},
    {"queue", "max_priority", K_U32, OFF(max_priority), 0, 1000000},
    {"paths", "input_roots", K_ROOTS, OFF(input_roots), 0, 0},
    {"paths", "output_roots", K_ROOTS, OFF(output_roots), 0, 0},
    {"security", "curve_key_file", K_STR, OFF(curve_key_file), 0, 0},
    {"security", "curve_clients_dir", K_STR, OFF(curve_clients_dir), 0, 0},
    {"security", "curve_workers_dir", K_STR, OFF(curve_workers_dir), 0, 0},
    {"test_runner", "chunk_bytes", K_U32, OFF(chunk_bytes), 1, 1u << 30},
    {"test_runner", "chunk_delay_ms", K_U32, OFF(chunk_delay_ms), 0, 60000},
    {"test_runner", "exec_log", K_STR, OFF(exec_log), 0, 0},
};

static int32_t flag_range(const key_def_t *d, const char *flag, uint32_t value, spn_error_t *err) {
  if (d->kind != K_U32 || (value >= d->min && value <= d->max))
    return SPN_OK;
  return spn_error_set(err, SPN_EINVAL, "--%s %u: outside [%u, %u], the range of %s.%s", flag, value, d->min, d->max,
                       d->section, d->key);
}

int32_t spn_server_config_check_flag(const char *section, const char *key, const char *flag, uint32_t value,
                                     spn_error_t *err) {
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (!strcmp(keys[i].section, section) && !strcmp(keys[i].key, key))
      return flag_range(&keys[i], flag, value, err);
  return SPN_OK;
}

int32_t spn_server_config_check_field(const spn_server_config_t *c, const uint32_t *field, const char *flag,
                                      spn_error_t *err) {
  size_t off = (size_t)((const char *)field - (const char *)c);
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (keys[i].kind == K_U32 && keys[i].off == off)
      return flag_range(&keys[i], flag, *field, err);
  return SPN_OK;
}

static int32_t want(const spn_toml_node_t *v, spn_toml_type_t t, const char *sec, const char *key,
                    spn_error_t *err) {
  if (spn_toml_node_type(v) == t)
    return SPN_OK;
  char where[256];
  return spn_error_set(err, SPN_ECONFIG, "%s: %s.%s: expected %s, got %s",
                       spn_toml_node_where(v, where, sizeof where), sec, key, spn_toml_type_name(t),
                       spn_toml_type_name(spn_toml_node_type(v)));
}

static int32_t set_key(spn_server_config_t *c, const key_def_t *d, const spn_toml_node_t *v,
                       spn_error_t *err) {
  char where[256];
  char *base = (char *)c + d->off;
  int32_t rc;
  switch (d->kind) {
  case K_STR: {
    if ((rc = want(v, SPN_TOML_STRING, d->section, d->key, err)) < 0)
      return rc;
    char **dst = (char **)base;
    free(*dst);
    if (!(*dst = strdup(spn_toml_string(v, NULL))))
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    return SPN_OK;
  }
  case K_U32: {
    if ((rc = want(v, SPN_TOML_INTEGER, d->section, d->key, err)) < 0)
      return rc;
    int64_t x = spn_toml_int(v);
    if (x < d->min || x > d->max)
      return spn_error_set(err, SPN_ECONFIG, "%s: %s.%s: %lld is outside [%u, %u]",
                           spn_toml_node_where(v, where, sizeof where), d->section, d->key,
                           (long long)x, d->min, d->max);
    *(uint32_t *)base = (uint32_t)x;
    return SPN_OK;
  }
  case K_BOOL:
    if ((rc = want(v, SPN_TOML_BOOL, d->section, d->key, err)) < 0)
      return rc;
    *(bool *)base = spn_toml_bool(v);
    return SPN_OK;
  case K_ROOTS:
  case K_STRS: {
    if ((rc = want(v, SPN_TOML_ARRAY, d->section, d->key, err)) < 0)
      return rc;
    for (size_t i = 0; i < spn_toml_array_len(v); i++) {
      const spn_toml_node_t *e = spn_toml_array_at(v, i);
      if ((rc = want(e, SPN_TOML_STRING, d->section, d->key, err)) < 0)
        return rc;
      const char *sv = spn_toml_string(e, NULL);
      if (d->kind == K_ROOTS) {
        if ((rc = spn__roots_add((spn_roots_t *)base, sv, err)) < 0)
          return spn_error_prefix(err, "%s: %s.%s", spn_toml_node_where(e, where, sizeof where),
                                  d->section, d->key);
      } else {
        char **nv = realloc(c->pipelines, (c->n_pipelines + 1) * sizeof *nv);
        if (!nv)
          return spn_error_set(err, SPN_ENOMEM, "out of memory");
        c->pipelines = nv;
        if (!(c->pipelines[c->n_pipelines] = strdup(sv)))
          return spn_error_set(err, SPN_ENOMEM, "out of memory");
        c->n_pipelines++;
      }
    }
    return SPN_OK;
  }
  }
  return SPN_EINTERNAL;
}

/* [[pipeline]] name = "...", config = "file.toml": a pipeline to load at
 * start-up. A relative config is relative to the server config's folder. */
static int32_t add_pipeline_defs(spn_server_config_t *c, const char *path, const spn_toml_node_t *arr,
                                 spn_error_t *err) {
  char where[256];
  int32_t rc;
  if (spn_toml_node_type(arr) != SPN_TOML_ARRAY)
    return spn_error_set(err, SPN_ECONFIG, "%s: \"pipeline\" must be an array of tables ([[pipeline]])",
                         spn_toml_node_where(arr, where, sizeof where));
  const char *slash = strrchr(path, '/');
  int dirlen = slash ? (int)(slash - path + 1) : 0;
  for (size_t i = 0; i < spn_toml_array_len(arr); i++) {
    const spn_toml_node_t *t = spn_toml_array_at(arr, i);
    if ((rc = want(t, SPN_TOML_TABLE, "pipeline", "", err)) < 0)
      return rc;
    spn_pipeline_def_t *nd = realloc(c->pipeline_defs, (c->n_pipeline_defs + 1) * sizeof *nd);
    if (!nd)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    c->pipeline_defs = nd;
    spn_pipeline_def_t *d = &nd[c->n_pipeline_defs++];
    memset(d, 0, sizeof *d);
    spn_toml_node_where(t, d->where, sizeof d->where);
    for (size_t j = 0; j < spn_toml_table_len(t); j++) {
      spn_toml_pos_t kp;
      const char *key = spn_toml_table_key_at(t, j, &kp);
      const spn_toml_node_t *v = spn_toml_table_value_at(t, j);
      if (strcmp(key, "name") && strcmp(key, "config"))
        return spn_error_set(err, SPN_ECONFIG, "%s:%u:%u: unknown key \"%s\" in [[pipeline]] (known: name, config)",
                             path, kp.line, kp.col, key);
      if ((rc = want(v, SPN_TOML_STRING, "pipeline", key, err)) < 0)
        return rc;
      const char *sv = spn_toml_string(v, NULL);
      if (!*sv || strlen(sv) > 4096)
        return spn_error_set(err, SPN_ECONFIG, "%s: pipeline.%s must be a non-empty string",
                             spn_toml_node_where(v, where, sizeof where), key);
      char *copy;
      if (!strcmp(key, "name")) {
        if (strlen(sv) > 128)
          return spn_error_set(err, SPN_ECONFIG, "%s: pipeline.name is longer than 128 bytes",
                               spn_toml_node_where(v, where, sizeof where));
        copy = strdup(sv);
      } else {
        size_t n = strlen(sv) + (size_t)dirlen + 1;
        if ((copy = malloc(n)))
          snprintf(copy, n, "%.*s%s", sv[0] == '/' ? 0 : dirlen, path, sv);
      }
      if (!copy)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      char **dst = !strcmp(key, "name") ? &d->name : &d->config;
      free(*dst);
      *dst = copy;
    }
    if (!d->name || !d->config)
      return spn_error_set(err, SPN_ECONFIG, "%s: [[pipeline]] needs name = \"...\" and config = \"file.toml\"",
                           d->where);
  }
  return SPN_OK;
}

int32_t spn_server_config_load(spn_server_config_t *c, const char *path, spn_error_t *err) {
  spn_toml_doc_t *doc = NULL;
  int32_t rc = spn_toml_parse_file(path, &doc, err);
  if (rc < 0)
    return rc;
  const spn_toml_node_t *root = spn_toml_doc_root(doc);
  char where[256];
  for (size_t i = 0; i < spn_toml_table_len(root) && rc == SPN_OK; i++) {
    spn_toml_pos_t kp;
    const char *sec = spn_toml_table_key_at(root, i, &kp);
    const spn_toml_node_t *t = spn_toml_table_value_at(root, i);
    if (!strcmp(sec, "pipeline")) {
      rc = add_pipeline_defs(c, path, t, err);
      continue;
    }
    bool known = false;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
      known |= !strcmp(keys[k].section, sec);
    if (!known) {
      rc = spn_error_set(err, SPN_ECONFIG, "%s:%u:%u: unknown section \"%s\"", path, kp.line, kp.col,
                         sec);
      break;
    }
    if ((rc = want(t, SPN_TOML_TABLE, sec, "", err)) < 0)
      break;
    for (size_t j = 0; j < spn_toml_table_len(t) && rc == SPN_OK; j++) {
      spn_toml_pos_t p2;
      const char *key = spn_toml_table_key_at(t, j, &p2);
      const key_def_t *d = NULL;
      for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (!strcmp(keys[k].section, sec) && !strcmp(keys[k].key, key))
          d = &keys[k];
      if (!d) {
        rc = spn_error_set(err, SPN_ECONFIG, "%s:%u:%u: unknown key \"%s.%s\"", path, p2.line, p2.col,
                           sec, key);
        break;
      }
      rc = set_key(c, d, spn_toml_table_value_at(t, j), err);
    }
  }
  (void)where;
  if (rc == SPN_OK && c->backoff_max_ms < c->backoff_base_ms)
    rc = spn_error_set(err, SPN_ECONFIG, "%s: queue.backoff_max_ms is below queue.backoff_base_ms", path);
  spn_toml_doc_free(&doc);
  return rc;
}
