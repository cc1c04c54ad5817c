/* engine.c — the public engine API: the model registry, loading, inspection
 * and running.
 *
 * The registry maps (device, precision, fallback, canonical path) to a
 * loaded model with a reference count, under one mutex per engine. A load
 * reserves its key (and its peers' keys) and reads, parses and prepares
 * outside the mutex: different models load at once, and a second loader of
 * a key being loaded waits for it and shares the result. Weight broadcasts
 * to peers (NCCL) run one at a time (replicate_lock). A model
 * holds a reference on the engine's shared backend state (the backend
 * instances: the CPU one with its oneDNN engine, and one per device opened),
 * so it stays usable after spn_engine_free until its own last release.
 */
#include <errno.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine-internal.h"

/* The CUDA engine backend registers here when built (cuda/engine/). */
#ifdef SPN_HAVE_CUDA_ENGINE
int32_t spn_engine_cuda_factory(spn_backend_factory_t *f);
#endif

static int32_t spn_engine_add_cuda(spn_engine_t *e, spn_error_t *err) {
#ifdef SPN_HAVE_CUDA_ENGINE
  spn_backend_factory_t f;
  if (spn_engine_cuda_factory(&f) == SPN_OK)
    return spn_engine_add_backend(e, &f, err);
#endif
  (void)e, (void)err;
  return SPN_OK;
}

/* A registry key being loaded: a second loader of it waits until it is
 * gone, then takes the model (or, if the load failed, loads it itself). */
typedef struct pending {
  char *key;
  struct pending *next;
} pending_t;

struct spn_engine {
  spn_engine_opts_t opts;
  pthread_mutex_t lock; /* the registry: models and pending */
  pthread_cond_t loaded; /* a pending key was resolved */
  spn_model_t *models;  /* registered models */
  pending_t *pending;   /* keys being loaded, outside the lock */
  /* One weights' broadcast at a time: NCCL communicators over the same GPUs
   * must not run collectives concurrently from different threads. */
  pthread_mutex_t replicate_lock;
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
  for (int i = s->n_backends - 1; i >= 0; i--)
    if (s->backends[i])
      s->backends[i]->iface->free(s->backends[i]);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

int32_t spn_engine_add_backend(spn_engine_t *eng, const spn_backend_factory_t *f, spn_error_t *err) {
  spn_engine_shared_t *s = eng->shared;
  pthread_mutex_lock(&s->lock);
  int32_t rc = SPN_OK;
  if (s->n_factories == (int)(sizeof s->factories / sizeof s->factories[0]))
    rc = spn_error_set(err, SPN_EOVERFLOW, "too many engine backends");
  else
    s->factories[s->n_factories++] = *f;
  pthread_mutex_unlock(&s->lock);
  return rc;
}

/* Device index after "prefix:" (-1 when malformed). */
static int device_index(const char *device, size_t plen) {
  if (device[plen] != ':' || !device[plen + 1])
    return -1;
  char *end;
  long i = strtol(device + plen + 1, &end, 10);
  return !*end && i >= 0 && i < 1024 ? (int)i : -1;
}

int32_t spn_shared_backend(spn_engine_shared_t *s, const char *device, int *slot, spn_error_t *err) {
  if (!device || !strcmp(device, "cpu") || (!strncmp(device, "cpu:", 4) && device_index(device, 3) >= 0)) {
    *slot = SPN_BACKEND_CPU; /* emulated CPU devices share the host's backend */
    return SPN_OK;
  }
  int32_t rc = SPN_OK;
  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < s->n_backends; i++)
    if (!strcmp(s->backends[i]->device, device)) {
      *slot = i;
      goto out;
    }
  const char *colon = strchr(device, ':');
  size_t plen = colon ? (size_t)(colon - device) : strlen(device);
  const spn_backend_factory_t *f = NULL;
  for (int i = 0; i < s->n_factories && !f; i++)
    if (strlen(s->factories[i].prefix) == plen && !strncmp(s->factories[i].prefix, device, plen))
      f = &s->factories[i];
  int idx = device_index(device, plen);
  if (!f || idx < 0) {
    if (!strncmp(device, "cuda:", 5) && idx >= 0)
      rc = spn_error_set(err, SPN_EUNSUPPORTED, "device '%s': the CUDA engine backend is not built", device);
    else
      rc = spn_error_set(err, SPN_EINVAL, "device '%s': expected cpu, cpu:N or cuda:N", device);
    goto out;
  }
  if (s->n_backends == SPN_MAX_BACKENDS) {
    rc = spn_error_set(err, SPN_EOVERFLOW, "device '%s': too many devices in one engine", device);
    goto out;
  }
  spn_backend_t *b = NULL;
  if ((rc = f->open(f, idx, &b, err)))
    goto out;
  snprintf(b->device, sizeof b->device, "%s", device);
  b->device_index = idx;
  b->slot = s->n_backends;
  s->backends[s->n_backends++] = b;
  *slot = b->slot;
out:
  pthread_mutex_unlock(&s->lock);
  return rc;
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
  int32_t rc = spn_backend_cpu_new(&e->shared->backends[SPN_BACKEND_CPU], err);
  if (!rc)
    e->shared->n_backends = 1;
  if (!rc)
    rc = spn_engine_add_cuda(e, err);
  if (rc) {
    shared_unref(e->shared);
    free(e);
    return rc;
  }
  pthread_mutex_init(&e->lock, NULL);
  pthread_cond_init(&e->loaded, NULL);
  pthread_mutex_init(&e->replicate_lock, NULL);
  *out = e;
  return SPN_OK;
}

void spn_engine_free(spn_engine_t **engp) {
  spn_engine_t *eng = *engp;
  if (!eng)
    return;
  *engp = NULL;
  spn_engine_trim(eng); /* models loaded for peers no load took */
  pthread_mutex_lock(&eng->lock);
  for (spn_model_t *m = eng->models; m; m = m->next)
    m->eng = NULL; /* detach: they live on until released */
  pthread_mutex_unlock(&eng->lock);
  pthread_mutex_destroy(&eng->lock);
  pthread_cond_destroy(&eng->loaded);
  pthread_mutex_destroy(&eng->replicate_lock);
  shared_unref(eng->shared);
  free(eng);
}

/* Checked model options, with defaults filled in. */
typedef struct {
  const char *device;
  int precision;
  bool fallback_error;
  bool no_graphs;
  int n_peers;
  const char *const *peers;
  bool peer_uploads; /* peers upload their own weights, no NCCL broadcast */
} model_opts_t;

static const char *const prec_names[] = {"fp32", "tf32", "fp16"};

static int32_t check_opts(spn_engine_t *eng, const spn_model_opts_t *o, model_opts_t *mo, int *slot,
                          spn_error_t *err) {
  *mo = (model_opts_t){.device = "cpu"};
  if (o) {
    if (o->struct_size < offsetof(spn_model_opts_t, n_peers))
      return spn_error_set(err, SPN_EABI, "spn_model_opts_t struct_size %u too small", o->struct_size);
    if (o->struct_size >= offsetof(spn_model_opts_t, reserved) && o->n_peers) {
      if (o->n_peers < 0 || !o->peers)
        return spn_error_set(err, SPN_EINVAL, "%d peers given without a list", o->n_peers);
      mo->n_peers = o->n_peers;
      mo->peers = o->peers;
      mo->peer_uploads = o->peer_uploads != 0;
    }
    if (o->device)
      mo->device = o->device;
    if (o->precision) {
      mo->precision = -1;
      for (int i = 0; i < 3; i++)
        if (!strcmp(o->precision, prec_names[i]))
          mo->precision = i;
      if (mo->precision < 0)
        return spn_error_set(err, SPN_EINVAL, "precision '%s': expected fp32, tf32 or fp16", o->precision);
    }
    if (o->fallback && strcmp(o->fallback, "cpu")) {
      if (strcmp(o->fallback, "error"))
        return spn_error_set(err, SPN_EINVAL, "fallback '%s': expected cpu or error", o->fallback);
      mo->fallback_error = true;
    }
    mo->no_graphs = o->no_graphs != 0;
  }
  /* Read once per load: a switch for debugging, not state. */
  const char *ng = getenv("SPINDLE_NO_CUDA_GRAPHS");
  if (ng && *ng && strcmp(ng, "0"))
    mo->no_graphs = true;
  const char *bc = getenv("SPINDLE_NCCL_BROADCAST");
  if (bc && !strcmp(bc, "0"))
    mo->peer_uploads = true;
  return spn_shared_backend(eng->shared, mo->device, slot, err);
}

static int32_t load_common(spn_engine_t *eng, const uint8_t *buf, size_t len, const char *name,
                           const char *dir, const model_opts_t *mo, int slot, const char *key,
                           bool deferred, spn_model_t **out, spn_error_t *err) {
  const char *device = mo->device;
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
  m->dev_slot = slot;
  m->precision = mo->precision;
  m->fallback_error = mo->fallback_error;
  m->no_graphs = mo->no_graphs;
  snprintf(m->origin, sizeof m->origin, "%s", key ? "read from the file" : "loaded from memory");
  int32_t rc;
  if (!m->path || !m->device || (key && !m->key)) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto fail;
  }
  if ((rc = spn_onnx_parse(m, buf, len, dir, err)))
    goto fail;
  m->weights_deferred = deferred;
  rc = spn_graph_prepare(m, !eng->opts.no_fusion, err);
  m->weights_deferred = false;
  if (rc)
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
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.device = device;
  return spn_engine_load_opts(eng, path, &o, out, err);
}

/* The registry key: device, precision, fallback, graphs, canonical path. */
static char *model_key(const model_opts_t *mo, const char *real) {
  size_t klen = strlen(real) + strlen(mo->device) + 40;
  char *key = malloc(klen);
  if (key)
    snprintf(key, klen, "%s|%s|%s%s|%s", mo->device, prec_names[mo->precision], mo->fallback_error ? "error" : "cpu",
             mo->no_graphs ? "|nographs" : "", real);
  return key;
}

/* Thread: registry lock held. */
static spn_model_t *find_model(spn_engine_t *eng, const char *key) {
  for (spn_model_t *m = eng->models; m; m = m->next)
    if (!strcmp(m->key, key))
      return m;
  return NULL;
}

static void model_drop(spn_model_t *m) {
  spn_engine_shared_t *s = m->shared;
  spn_model_destroy(m);
  shared_unref(s);
}

static void register_model(spn_engine_t *eng, spn_model_t *m) {
  m->eng = eng;
  m->next = eng->models;
  eng->models = m;
}

/* Thread: registry lock held. */
static bool is_pending(const spn_engine_t *eng, const char *key) {
  for (const pending_t *p = eng->pending; p; p = p->next)
    if (!strcmp(p->key, key))
      return true;
  return false;
}

/* Reserve key (the pending entry takes it); false when out of memory.
 * Thread: registry lock held. */
static bool add_pending(spn_engine_t *eng, char *key) {
  pending_t *p = malloc(sizeof *p);
  if (!p)
    return false;
  p->key = key;
  p->next = eng->pending;
  eng->pending = p;
  return true;
}

/* Release key's reservation (freeing the key). Thread: registry lock held. */
static void drop_pending(spn_engine_t *eng, const char *key) {
  for (pending_t **pp = &eng->pending; *pp; pp = &(*pp)->next)
    if (!strcmp((*pp)->key, key)) {
      pending_t *p = *pp;
      *pp = p->next;
      free(p->key);
      free(p);
      return;
    }
}

/* A peer device reserved by a load (its key pending), and what it got. */
typedef struct {
  const char *device;
  const char *key; /* the pending entry's */
  spn_model_t *m;  /* loaded, unclaimed; NULL if it failed */
} peer_t;

/* Reserve every peer device of mo that has no model and no load under way,
 * once each (not the load's own device). Its backend is opened later,
 * outside the lock (load_peers). Thread: registry lock held. */
static int reserve_peers(spn_engine_t *eng, const model_opts_t *mo, const char *real, peer_t *peers) {
  int n = 0;
  for (int i = 0; i < mo->n_peers && n < SPN_MAX_BACKENDS - 1; i++) {
    if (!mo->peers[i])
      continue;
    model_opts_t po = *mo;
    po.device = mo->peers[i];
    char *key = model_key(&po, real);
    if (!key || find_model(eng, key) || is_pending(eng, key) || !add_pending(eng, key)) {
      free(key);
      continue;
    }
    peers[n++] = (peer_t){.device = po.device, .key = key};
  }
  return n;
}

/* After m was loaded from buf for mo->device: load the model for each
 * reserved peer from the same bytes. Peers of m's backend, when it can
 * replicate (NCCL) and uploads are not asked for, get their weights from
 * m's; the others, and all of them when that fails, convert and upload their
 * own. A peer that fails is left NULL (its own load will say why). Thread:
 * any, registry lock not held (the peers' keys are pending). */
static void load_peers(spn_engine_t *eng, spn_model_t *m, const uint8_t *buf, size_t len, const char *path,
                       const char *dir, const model_opts_t *mo, peer_t *peers, int np) {
  spn_backend_t *own = eng->shared->backends[m->dev_slot];
  bool can_rep = own->iface->replicate && m->dev_slot != SPN_BACKEND_CPU && !mo->peer_uploads;
  spn_model_t *rep[SPN_MAX_BACKENDS] = {m};
  spn_backend_t *bk[SPN_MAX_BACKENDS] = {own};
  int which[SPN_MAX_BACKENDS];
  int n = 1, n_up = 0;
  for (int i = 0; i < np; i++) {
    model_opts_t po = *mo;
    po.device = peers[i].device;
    int slot;
    spn_error_t e = SPN_ERROR_INIT;
    if (spn_shared_backend(eng->shared, po.device, &slot, &e) != SPN_OK)
      continue;
    spn_backend_t *pb = eng->shared->backends[slot];
    bool deferred = can_rep && pb->iface == own->iface;
    spn_model_t *pm = NULL;
    if (load_common(eng, buf, len, path, dir, &po, slot, peers[i].key, deferred, &pm, &e) != SPN_OK)
      continue;
    pm->unclaimed = true;
    if (deferred) {
      which[n] = i;
      rep[n] = pm;
      bk[n++] = pb;
    } else {
      snprintf(pm->origin, sizeof pm->origin, "parsed from the file read for %s", m->device);
      peers[i].m = pm;
      n_up++;
    }
  }
  if (n == 1) {
    if (n_up)
      snprintf(m->origin, sizeof m->origin, "read from the file; also parsed for %d peer%s", n_up, n_up > 1 ? "s" : "");
    return;
  }
  spn_error_t e = SPN_ERROR_INIT;
  pthread_mutex_lock(&eng->replicate_lock);
  int32_t rc = own->iface->replicate(bk, rep, n, &e);
  pthread_mutex_unlock(&eng->replicate_lock);
  if (rc == SPN_OK)
    snprintf(m->origin, sizeof m->origin, "read from the file; weights broadcast to %d peer%s", n - 1,
             n > 2 ? "s" : "");
  else
    snprintf(m->origin, sizeof m->origin,
             "read from the file; the weights' broadcast failed, peers uploaded their own: %.140s", e.msg);
  for (int j = 1; j < n; j++) {
    spn_model_t *pm = rep[j];
    if (rc != SPN_OK) {
      /* Their weights were never filled: load them again, uploading. */
      model_opts_t po = *mo;
      po.device = pm->device;
      spn_model_t *again = NULL;
      spn_error_t e2 = SPN_ERROR_INIT;
      int32_t rc2 = load_common(eng, buf, len, path, dir, &po, pm->dev_slot, pm->key, false, &again, &e2);
      model_drop(pm);
      if (rc2 != SPN_OK)
        continue;
      pm = again;
      pm->unclaimed = true;
      snprintf(pm->origin, sizeof pm->origin, "parsed from the file read for %s (the broadcast failed)", m->device);
    } else {
      snprintf(pm->origin, sizeof pm->origin, "weights broadcast from %s", m->device);
    }
    peers[which[j]].m = pm;
  }
}

/* A load frees much of what it allocated (the file's bytes, the weights a
 * pass replaced, a device model's host copies of what it uploaded), in
 * blocks of a few MB that glibc keeps on its heap once its mmap threshold
 * has grown past them: resident, though free. Hand the free pages back to
 * the system, once per file loaded (Wav2Lip on a GPU: ~300 MB). */
static void give_back_load_memory(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

int32_t spn_engine_load_opts(spn_engine_t *eng, const char *path, const spn_model_opts_t *opts,
                             spn_model_t **out, spn_error_t *err) {
  if (!eng || !path || !out)
    return spn_error_set(err, SPN_EINVAL, "spn_engine_load: NULL argument");
  *out = NULL;
  model_opts_t mo;
  int slot;
  int32_t rc = check_opts(eng, opts, &mo, &slot, err);
  if (rc)
    return rc;
  char real[PATH_MAX];
  if (!realpath(path, real))
    return spn_error_set(err, SPN_ENOENT, "%s: %s", path, strerror(errno));
  char *key = model_key(&mo, real);
  if (!key)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  /* Take the model if it is loaded; wait while another thread loads it;
   * else reserve its key (and its peers'), and load outside the lock, so
   * different models load at once. */
  pthread_mutex_lock(&eng->lock);
  for (;;) {
    spn_model_t *have = find_model(eng, key);
    if (have) {
      /* A model loaded for this device as a peer: take its reference. */
      if (have->unclaimed)
        have->unclaimed = false;
      else
        have->refs++;
      *out = have;
      pthread_mutex_unlock(&eng->lock);
      free(key);
      return SPN_OK;
    }
    if (!is_pending(eng, key))
      break;
    pthread_cond_wait(&eng->loaded, &eng->lock);
  }
  if (!add_pending(eng, key)) {
    pthread_mutex_unlock(&eng->lock);
    free(key);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  peer_t peers[SPN_MAX_BACKENDS];
  int np = mo.n_peers ? reserve_peers(eng, &mo, real, peers) : 0;
  pthread_mutex_unlock(&eng->lock);

  uint8_t *buf = NULL;
  spn_model_t *m = NULL;
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
  if ((rc = load_common(eng, buf, (size_t)stt.st_size, path, dir, &mo, slot, key, false, &m, err)))
    goto out;
  if (np)
    load_peers(eng, m, buf, (size_t)stt.st_size, path, dir, &mo, peers, np);
out:
  if (f)
    fclose(f);
  free(buf);
  if (m)
    give_back_load_memory();
  pthread_mutex_lock(&eng->lock);
  if (m) {
    register_model(eng, m);
    *out = m;
  }
  for (int i = 0; i < np; i++) {
    if (peers[i].m)
      register_model(eng, peers[i].m);
    drop_pending(eng, peers[i].key);
  }
  drop_pending(eng, key);
  pthread_cond_broadcast(&eng->loaded);
  pthread_mutex_unlock(&eng->lock);
  return rc;
}

int32_t spn_engine_trim(spn_engine_t *eng) {
  if (!eng)
    return 0;
  spn_model_t *gone = NULL;
  int32_t n = 0;
  pthread_mutex_lock(&eng->lock);
  for (spn_model_t **pp = &eng->models; *pp;) {
    spn_model_t *m = *pp;
    if (!m->unclaimed) {
      pp = &m->next;
      continue;
    }
    *pp = m->next;
    m->next = gone;
    gone = m;
    n++;
  }
  pthread_mutex_unlock(&eng->lock);
  while (gone) {
    spn_model_t *m = gone;
    gone = m->next;
    model_drop(m);
  }
  return n;
}

int32_t spn_engine_load_memory(spn_engine_t *eng, const void *data, size_t len, const char *name,
                               const char *device, spn_model_t **out, spn_error_t *err) {
  spn_model_opts_t o = SPN_MODEL_OPTS_INIT;
  o.device = device;
  return spn_engine_load_memory_opts(eng, data, len, name, &o, out, err);
}

int32_t spn_engine_load_memory_opts(spn_engine_t *eng, const void *data, size_t len, const char *name,
                                    const spn_model_opts_t *opts, spn_model_t **out, spn_error_t *err) {
  if (!eng || (!data && len) || !out)
    return spn_error_set(err, SPN_EINVAL, "spn_engine_load_memory: NULL argument");
  *out = NULL;
  model_opts_t mo;
  int slot;
  int32_t rc = check_opts(eng, opts, &mo, &slot, err);
  if (rc)
    return rc;
  return load_common(eng, data, len, name ? name : "<memory>", NULL, &mo, slot, NULL, false, out, err);
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
  model_drop(m);
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
  return spn_graph_run(m, inputs, n_in, outputs, n_out, m->threads, NULL, false, NULL, err);
}

int32_t spn_model_run_on(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in, spn_tensor_t *outputs,
                         int32_t n_out, void *stream, spn_error_t *err) {
  if (!m || (n_in && !inputs) || (n_out && !outputs))
    return spn_error_set(err, SPN_EINVAL, "spn_model_run_on: NULL argument");
  return spn_graph_run(m, inputs, n_in, outputs, n_out, m->threads, stream, false, NULL, err);
}

int32_t spn_model_profile(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in, spn_tensor_t *outputs,
                          int32_t n_out, spn_node_time_t *times, int32_t max, int32_t *n_times, spn_error_t *err) {
  if (!m || (n_in && !inputs) || (n_out && !outputs) || !n_times || max < 0 || (max && !times))
    return spn_error_set(err, SPN_EINVAL, "spn_model_profile: NULL argument");
  spn_profile_t prof = {.t = times, .max = max};
  int32_t rc = spn_graph_run(m, inputs, n_in, outputs, n_out, m->threads, NULL, false, &prof, err);
  *n_times = prof.n;
  return rc;
}

int32_t spn_model_output_shapes(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in, spn_tensor_t *outputs,
                                int32_t n_out, spn_error_t *err) {
  if (!m || (n_in && !inputs) || (n_out && !outputs))
    return spn_error_set(err, SPN_EINVAL, "spn_model_output_shapes: NULL argument");
  return spn_graph_run(m, inputs, n_in, outputs, n_out, m->threads, NULL, true, NULL, err);
}

const char *spn_model_device(const spn_model_t *m) { return m ? m->device : NULL; }
int32_t spn_model_fallback_count(const spn_model_t *m) { return m ? m->n_fallback : 0; }
const char *spn_model_origin(const spn_model_t *m) { return m ? m->origin : ""; }

void spn_model_output_free(spn_tensor_t *t) {
  if (!t)
    return;
  free(t->data);
  t->data = NULL;
}
