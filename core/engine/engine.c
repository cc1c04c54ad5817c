/* engine.c — the public engine API: the model registry, loading, inspection
 * and running.
 *
 * The registry maps (device, canonical path) to a loaded model with a
 * reference count, under one mutex per engine. A model holds a reference on
 * the engine's shared backend state (the oneDNN engine), so it stays usable
 * after spn_engine_free until its own last release.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine-internal.h"

struct spn_engine {
  spn_engine_opts_t opts;
  pthread_mutex_t lock;
  spn_model_t *models; /* registered models */
  spn_engine_shared_t *shared;
};

static void shared_unref(spn_engine_shared_t *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  int left = --s->refs;
  pthread_mutex_unlock(&s->lock);
  if (left)
    return;
  spn_dnnl_shared_fini(s);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

int32_t spn_engine_new(const spn_engine_opts_t *opts, spn_engine_t **out, spn_error_t *err) {
  if (!out)
    return spn_error_set(err, SPN_EINVAL, "spn_engine_new: out is NULL");
  *out = NULL;
  spn_engine_t *e = calloc(1, sizeof *e);
  if (!e)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  e->opts = (spn_engine_opts_t)SPN_ENGINE_OPTS_INIT;
  if (opts) {
    if (opts->struct_size < offsetof(spn_engine_opts_t, reserved)) {
      free(e);
      return spn_error_set(err, SPN_EABI, "spn_engine_opts_t struct_size %u too small", opts->struct_size);
    }
    e->opts.threads = opts->threads;
    e->opts.no_fusion = opts->no_fusion;
  }
  if (e->opts.threads < 0 || e->opts.threads > 4096) {
    free(e);
    return spn_error_set(err, SPN_EINVAL, "thread count %d out of range", opts->threads);
  }
  if (e->opts.threads == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    e->opts.threads = n > 0 ? (int32_t)n : 1;
  }
  e->shared = calloc(1, sizeof *e->shared);
  if (!e->shared) {
    free(e);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  pthread_mutex_init(&e->shared->lock, NULL);
  e->shared->refs = 1;
  int32_t rc = spn_dnnl_shared_init(e->shared, err);
  if (rc) {
    shared_unref(e->shared);
    free(e);
    return rc;
  }
  pthread_mutex_init(&e->lock, NULL);
  *out = e;
  return SPN_OK;
}

void spn_engine_free(spn_engine_t *eng) {
  if (!eng)
    return;
  pthread_mutex_lock(&eng->lock);
  for (spn_model_t *m = eng->models; m; m = m->next)
    m->eng = NULL; /* detach: they live on until released */
  pthread_mutex_unlock(&eng->lock);
  pthread_mutex_destroy(&eng->lock);
  shared_unref(eng->shared);
  free(eng);
}

static int32_t parse_device(const char *device, spn_error_t *err) {
  if (!device || !strcmp(device, "cpu"))
    return SPN_OK;
  if (!strncmp(device, "cpu:", 4)) {
    char *end;
    long i = strtol(device + 4, &end, 10);
    if (device[4] && !*end && i >= 0 && i < 1024)
      return SPN_OK;
  }
  if (!strncmp(device, "cuda:", 5))
    return spn_error_set(err, SPN_EUNSUPPORTED, "device '%s': the CUDA engine backend is not built", device);
  return spn_error_set(err, SPN_EINVAL, "device '%s': expected cpu, cpu:N or cuda:N", device);
}

static int32_t load_common(spn_engine_t *eng, const uint8_t *buf, size_t len, const char *name,
                           const char *dir, const char *device, const char *key,
                           spn_model_t **out, spn_error_t *err) {
  spn_model_t *m = calloc(1, sizeof *m);
  if (!m)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  pthread_mutex_lock(&eng->shared->lock);
  eng->shared->refs++;
  pthread_mutex_unlock(&eng->shared->lock);
  m->shared = eng->shared;
  m->path = strdup(name);
  m->device = strdup(device ? device : "cpu");
  m->key = key ? strdup(key) : NULL;
  m->refs = 1;
  m->threads = eng->opts.threads;
  int32_t rc;
  if (!m->path || !m->device || (key && !m->key)) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto fail;
  }
  if ((rc = spn_onnx_parse(m, buf, len, dir, err)))
    goto fail;
  if ((rc = spn_graph_prepare(m, !eng->opts.no_fusion, err)))
    goto fail;
  *out = m;
  return SPN_OK;
fail:
  spn_model_destroy(m);
  shared_unref(eng->shared);
  return rc;
}

int32_t spn_engine_load(spn_engine_t *eng, const char *path, const char *device,
                        spn_model_t **out, spn_error_t *err) {
  if (!eng || !path || !out)
    return spn_error_set(err, SPN_EINVAL, "spn_engine_load: NULL argument");
  *out = NULL;
  int32_t rc = parse_device(device, err);
  if (rc)
    return rc;
  char real[PATH_MAX];
  if (!realpath(path, real))
    return spn_error_set(err, SPN_ENOENT, "%s: %s", path, strerror(errno));
  size_t klen = strlen(real) + strlen(device ? device : "cpu") + 2;
  char *key = malloc(klen);
  if (!key)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  snprintf(key, klen, "%s|%s", device ? device : "cpu", real);
  pthread_mutex_lock(&eng->lock);
  for (spn_model_t *m = eng->models; m; m = m->next)
    if (!strcmp(m->key, key)) {
      m->refs++;
      *out = m;
      pthread_mutex_unlock(&eng->lock);
      free(key);
      return SPN_OK;
    }
  /* Load under the lock: a second loader of the same file waits and then
   * shares instead of reading it twice. */
  uint8_t *buf = NULL;
  FILE *f = fopen(real, "rb");
  struct stat stt;
  if (!f || fstat(fileno(f), &stt) || !S_ISREG(stt.st_mode)) {
    rc = spn_error_set(err, SPN_ENOENT, "%s: cannot read: %s", path, f ? "not a regular file" : strerror(errno));
    goto out;
  }
  if (stt.st_size > (off_t)1 << 31) {
    rc = spn_error_set(err, SPN_ETOOBIG, "%s: %lld bytes, larger than the 2 GiB protobuf limit (use external data)", path, (long long)stt.st_size);
    goto out;
  }
  buf = malloc((size_t)stt.st_size + 1);
  if (!buf) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  if (fread(buf, 1, (size_t)stt.st_size, f) != (size_t)stt.st_size) {
    rc = spn_error_set(err, SPN_EIO, "%s: read failed", path);
    goto out;
  }
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", real);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    dir[1] = 0;
  else if (slash)
    *slash = 0;
  spn_model_t *m;
  if ((rc = load_common(eng, buf, (size_t)stt.st_size, path, dir, device, key, &m, err)))
    goto out;
  m->eng = eng;
  m->next = eng->models;
  eng->models = m;
  *out = m;
out:
  pthread_mutex_unlock(&eng->lock);
  if (f)
    fclose(f);
  free(buf);
  free(key);
  return rc;
}

int32_t spn_engine_load_memory(spn_engine_t *eng, const void *data, size_t len, const char *name,
                               const char *device, spn_model_t **out, spn_error_t *err) {
  if (!eng || (!data && len) || !out)
    return spn_error_set(err, SPN_EINVAL, "spn_engine_load_memory: NULL argument");
  *out = NULL;
  int32_t rc = parse_device(device, err);
  if (rc)
    return rc;
  return load_common(eng, data, len, name ? name : "<memory>", NULL, device, NULL, out, err);
}

void spn_model_release(spn_model_t **pm) {
  if (!pm || !*pm)
    return;
  spn_model_t *m = *pm;
  *pm = NULL;
  spn_engine_t *eng = m->eng;
  if (eng) {
    pthread_mutex_lock(&eng->lock);
    if (--m->refs > 0) {
      pthread_mutex_unlock(&eng->lock);
      return;
    }
    for (spn_model_t **pp = &eng->models; *pp; pp = &(*pp)->next)
      if (*pp == m) {
        *pp = m->next;
        break;
      }
    pthread_mutex_unlock(&eng->lock);
  } else if (m->key && --m->refs > 0) {
    return; /* registry gone: refs are only touched by their holders */
  }
  spn_engine_shared_t *s = m->shared;
  spn_model_destroy(m);
  shared_unref(s);
}

int32_t spn_model_input_count(const spn_model_t *m) { return m ? m->n_inputs : 0; }
int32_t spn_model_output_count(const spn_model_t *m) { return m ? m->n_outputs : 0; }

static int32_t value_info(const spn_model_t *m, int vi, const char **name, int32_t *dtype,
                          int32_t *ndim, int64_t *shape) {
  const spn_value_t *v = &m->vals[vi];
  if (name) *name = v->name;
  if (dtype) *dtype = v->dtype;
  if (ndim) *ndim = v->ndim;
  if (shape)
    for (int d = 0; d < v->ndim && d < SPN_MAXD; d++)
      shape[d] = v->shape[d];
  return SPN_OK;
}

int32_t spn_model_input_info(const spn_model_t *m, int32_t i, const char **name, int32_t *dtype,
                             int32_t *ndim, int64_t *shape) {
  if (!m || i < 0 || i >= m->n_inputs)
    return SPN_EINVAL;
  return value_info(m, m->inputs[i], name, dtype, ndim, shape);
}

int32_t spn_model_output_info(const spn_model_t *m, int32_t i, const char **name, int32_t *dtype,
                              int32_t *ndim, int64_t *shape) {
  if (!m || i < 0 || i >= m->n_outputs)
    return SPN_EINVAL;
  return value_info(m, m->outputs[i], name, dtype, ndim, shape);
}

int32_t spn_model_input_index(const spn_model_t *m, const char *name) {
  for (int i = 0; m && name && i < m->n_inputs; i++)
    if (!strcmp(m->vals[m->inputs[i]].name, name))
      return i;
  return -1;
}

int32_t spn_model_output_index(const spn_model_t *m, const char *name) {
  for (int i = 0; m && name && i < m->n_outputs; i++)
    if (!strcmp(m->vals[m->outputs[i]].name, name))
      return i;
  return -1;
}

int64_t spn_model_param_count(const spn_model_t *m) { return m ? m->params : 0; }
double spn_model_flops(const spn_model_t *m) { return m ? m->flops : 0; }
int32_t spn_model_node_count(const spn_model_t *m) { return m ? m->n_live_nodes : 0; }

int32_t spn_model_op_histogram(const spn_model_t *m, int32_t i, const char **op, int32_t *count) {
  if (!m)
    return 0;
  if (i >= 0 && i < m->n_hist) {
    for (int o = 0; o < SPN_OP_COUNT; o++)
      if (spn_op_names[o] == m->hist_op[i]) {
        if (op) *op = m->hist_op[i];
        if (count) *count = m->hist_n[o];
      }
  }
  return m->n_hist;
}

int32_t spn_model_run(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in,
                      spn_tensor_t *outputs, int32_t n_out, spn_error_t *err) {
  if (!m || (n_in && !inputs) || (n_out && !outputs))
    return spn_error_set(err, SPN_EINVAL, "spn_model_run: NULL argument");
  return spn_graph_run(m, inputs, n_in, outputs, n_out, m->threads, err);
}

void spn_model_output_free(spn_tensor_t *t) {
  if (!t)
    return;
  free(t->data);
  t->data = NULL;
}
