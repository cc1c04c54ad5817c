/* host-model.c — the host table's model_* entries: a thin adapter from the
 * plugin ABI to the model engine (spindle/engine.h).
 *
 * One engine per runtime, created on the first model load (a runtime whose
 * pipelines use no model never initialises oneDNN). The engine's registry
 * is keyed by (canonical path, device), so every instance placed on one
 * device shares one copy of a model's weights, and instances on different
 * (real or emulated) devices get their own: "models load once per device".
 * Errors name the stage and the model file.
 *
 * On a CUDA device the model is loaded at the stage's `precision` and runs
 * on the instance's stream (spn_model_run_on), so inputs and outputs may be
 * device tensors of that GPU: a GPU stage keeps its frames on the device.
 *
 * The first instance to load names the devices of the stage's other
 * instances as peers: the engine reads the file once, loads the model for
 * each of them too and, on GPUs with NCCL, broadcasts the prepared weights
 * from this GPU instead of each converting and uploading its own; the other
 * instances then take those models. The runtime trims the ones no instance
 * took once the pipeline's instances are created. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "runtime-internal.h"
#include "spindle/engine.h"

#define SPN_HOST_MODEL_MAX_IO 16

static const char *stage_name(const spn_stage_t *s) { return s ? s->srt->spec->name : "?"; }

/* The CUDA ordinal of the instance's device ("cuda:2 NVIDIA ..." is runtime
 * device 1 under --devices cuda:0,2), or -1 when it is not a GPU. */
static int cuda_ordinal(const spn_stage_t *s) {
  int ordinal = -1;
  if (!s->device || spn_device_kind(s->device) != SPN_DEVICE_CUDA ||
      sscanf(spn_device_name(s->device), "cuda:%d", &ordinal) != 1)
    return -1;
  return ordinal;
}

static int32_t runtime_engine(spn_runtime_t *rt, spn_engine_t **out, spn_error_t *err) {
  int32_t rc = SPN_OK;
  pthread_mutex_lock(&rt->engmu);
  if (!rt->engine) {
    spn_engine_opts_t opts = SPN_ENGINE_OPTS_INIT;
    opts.threads = (int32_t)rt->opts.cpu_threads;
    rc = spn_engine_new(&opts, &rt->engine, err);
  }
  *out = rt->engine;
  pthread_mutex_unlock(&rt->engmu);
  return rc;
}

/* The engine's name for an instance's device: "cuda:N" by CUDA ordinal,
 * else the device's own ("cpu:1"), "cpu" for the CPU pool. Returns the
 * ordinal (-1: not a GPU). */
static int engine_device(const spn_stage_t *s, char *name, size_t n) {
  int ordinal = cuda_ordinal(s);
  if (ordinal >= 0)
    snprintf(name, n, "cuda:%d", ordinal);
  else
    snprintf(name, n, "%s", s->device ? spn_device_name(s->device) : "cpu");
  return ordinal;
}

#define SPN_HOST_MODEL_MAX_PEERS 8

/* The devices of the stage's other instances of the same kind as s's, each
 * once: the engine loads the model there too from one read of the file,
 * and on GPUs broadcasts the weights (spn_model_opts_t.peers). */
static int peer_devices(const spn_stage_t *s, char names[][32], const char **peers) {
  int n = 0;
  for (uint32_t r = 0; r < s->srt->n_replicas && n < SPN_HOST_MODEL_MAX_PEERS; r++) {
    const spn_stage_t *o = s->srt->replicas[r];
    if (!o || !o->device || !s->device || o->device == s->device ||
        spn_device_kind(o->device) != spn_device_kind(s->device))
      continue;
    (void)engine_device(o, names[n], sizeof names[n]);
    bool seen = false;
    for (int i = 0; i < n && !seen; i++)
      seen = !strcmp(names[i], names[n]);
    if (!seen) {
      peers[n] = names[n];
      n++;
    }
  }
  return n;
}

int32_t spn__host_model_load(spn_stage_t *s, const char *path, spn_model_t **out, spn_error_t *err) {
  if (out)
    *out = NULL;
  if (!s || !path || !out)
    return spn_error_set(err, SPN_EINVAL, "model_load: stage, path and out are required");
  spn_engine_t *eng = NULL;
  int32_t rc = runtime_engine(s->pipe->rt, &eng, err);
  if (rc != SPN_OK)
    return spn_error_prefix(err, "stage \"%s\"", stage_name(s));
  char device[32];
  int ordinal = engine_device(s, device, sizeof device);
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  if (ordinal >= 0)
    mo.precision = spn__precision_name(s->srt->spec->precision);
  mo.device = device;
  char names[SPN_HOST_MODEL_MAX_PEERS][32];
  const char *peers[SPN_HOST_MODEL_MAX_PEERS];
  mo.n_peers = peer_devices(s, names, peers);
  mo.peers = peers;
  rc = spn_engine_load_opts(eng, path, &mo, out, err);
  if (rc != SPN_OK)
    return spn_error_prefix(err, "stage \"%s\" on %s", stage_name(s), device);
  spn__log(s->pipe->rt->log, ordinal >= 0 ? SPN_LOG_INFO : SPN_LOG_DEBUG, 0, stage_name(s), device,
           "model %s: %s", path, spn_model_origin(*out));
  return SPN_OK;
}

void spn__host_model_release(spn_stage_t *s, spn_model_t **model) {
  (void)s;
  spn_model_release(model);
}

int32_t spn__host_model_io_count(const spn_model_t *model, bool is_output) {
  if (!model)
    return 0;
  return is_output ? spn_model_output_count(model) : spn_model_input_count(model);
}

int32_t spn__host_model_io(const spn_model_t *model, bool is_output, int32_t i, const char **name,
                           spn_tensor_t *desc) {
  if (!model)
    return SPN_EINVAL;
  int32_t dtype = 0, ndim = 0;
  int64_t shape[SPN_TENSOR_MAX_DIMS] = {0};
  const char *n = NULL;
  int32_t rc = is_output ? spn_model_output_info(model, i, &n, &dtype, &ndim, shape)
                         : spn_model_input_info(model, i, &n, &dtype, &ndim, shape);
  if (rc != SPN_OK)
    return rc;
  if (name)
    *name = n;
  if (desc) {
    uint32_t size = desc->struct_size ? desc->struct_size : (uint32_t)sizeof *desc;
    spn_tensor_t t = SPN_TENSOR_INIT;
    t.dtype = dtype;
    t.ndim = ndim;
    for (int32_t d = 0; d < ndim && d < SPN_TENSOR_MAX_DIMS; d++)
      t.shape[d] = shape[d];
    memcpy(desc, &t, size < sizeof t ? size : sizeof t);
    desc->struct_size = size;
  }
  return SPN_OK;
}

/* A model run on a GPU uploads its host inputs and downloads its host
 * outputs itself: count those bytes as the stage's copies (as buffer_copy
 * would), and the job's when the instance holds exactly one job — with
 * several, the runtime cannot tell whose batch it was and counts the stage
 * only. Their time is inside the run's and is not split out (0 ns). */
static void count_host_tensors(spn_stage_t *s, const spn_tensor_t *in, size_t n_in, const spn_tensor_t *out,
                               size_t n_out) {
  spn_job_t *job = s->jobs && !s->jobs->next ? s->jobs->job : NULL;
  for (size_t i = 0; i < n_in + n_out; i++) {
    const spn_tensor_t *t = i < n_in ? &in[i] : &out[i - n_in];
    if (t->device_kind == SPN_DEVICE_CUDA || !t->data)
      continue;
    int d = i < n_in ? SPN__COPY_H2D : SPN__COPY_D2H;
    spn__xfer_add(&s->srt->xfer, d, spn_tensor_nbytes(t), 0);
    if (job)
      spn__xfer_add(&job->xfer, d, spn_tensor_nbytes(t), 0);
  }
}

int32_t spn__host_model_run(spn_stage_t *s, spn_model_t *model, const spn_tensor_t *in, size_t n_in,
                            spn_tensor_t *out, size_t n_out, spn_error_t *err) {
  if (!model)
    return spn_error_set(err, SPN_EINVAL, "stage \"%s\": model_run without a model", stage_name(s));
  int ordinal = s ? cuda_ordinal(s) : -1;
  int32_t rc;
  if (ordinal < 0) {
    rc = spn_model_run(model, in, (int32_t)n_in, out, (int32_t)n_out, err);
  } else if (n_in > SPN_HOST_MODEL_MAX_IO || n_out > SPN_HOST_MODEL_MAX_IO) {
    rc = spn_error_set(err, SPN_EINVAL, "model_run: at most %d inputs and outputs on a GPU", SPN_HOST_MODEL_MAX_IO);
  } else {
    /* Device tensors name the runtime's device index (buffer_device); the
     * engine wants the CUDA ordinal. Outputs the engine filled travel back
     * with the caller's index. */
    spn_tensor_t ti[SPN_HOST_MODEL_MAX_IO], to[SPN_HOST_MODEL_MAX_IO];
    for (size_t i = 0; i < n_in; i++) {
      ti[i] = in[i];
      if (ti[i].device_kind == SPN_DEVICE_CUDA)
        ti[i].device_index = ordinal;
    }
    for (size_t i = 0; i < n_out; i++) {
      to[i] = out[i];
      if (to[i].device_kind == SPN_DEVICE_CUDA)
        to[i].device_index = ordinal;
    }
    rc = spn_model_run_on(model, ti, (int32_t)n_in, to, (int32_t)n_out,
                          s->ex && s->ex->stream ? spn_stream_native(s->ex->stream) : NULL, err);
    for (size_t i = 0; i < n_out; i++) {
      int32_t idx = out[i].device_index;
      out[i] = to[i];
      if (out[i].device_kind == SPN_DEVICE_CUDA)
        out[i].device_index = idx;
    }
    if (rc == SPN_OK)
      count_host_tensors(s, in, n_in, out, n_out);
  }
  if (rc != SPN_OK)
    spn_error_prefix(err, "stage \"%s\"", stage_name(s));
  return rc;
}

void spn__host_model_free_outputs(spn_model_t *model, spn_tensor_t *outputs, size_t n_out) {
  (void)model;
  for (size_t i = 0; outputs && i < n_out; i++)
    if (outputs[i].data)
      spn_model_output_free(&outputs[i]);
}
