/* rt-kinds.h — stage kinds and a spec builder for the runtime tests.
 *
 * The kinds are written against spindle/plugin.h exactly as a plugin would
 * be (they reach the host only through the spn_host_api_t table); they are
 * registered in specs built in C, so these tests do not depend on the TOML
 * front end. Everything a kind records goes into a collector the test owns:
 * no global state, so tests may run several pipelines side by side. */
#ifndef RT_KINDS_H
#define RT_KINDS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "debug-internal.h"
#include "spindle/plugin.h"
#include "spindle/runtime.h"

#define RT_MAX_JOBS 8

typedef struct rt_job_rec {
  uint64_t job;
  uint64_t *seqs;
  size_t n, cap;
  long long flushed_at; /* frames seen when flush(job) ran; -1 not yet */
  size_t first_idx, last_idx; /* arrival index (over all jobs) of its first and last frame */
  uint32_t dev_mask;           /* pass: devices (1 << index) that processed its frames */
  int flushes;
} rt_job_rec_t;

typedef struct rt_col {
  pthread_mutex_t mu;
  rt_job_rec_t jobs[RT_MAX_JOBS];
  size_t n_jobs;
  size_t calls, max_batch, mixed_batches;
  size_t arrivals; /* frames seen, all jobs */
  uint64_t first_arrival_ns[RT_MAX_JOBS];
  atomic_int opens, closes_ok, closes_fail;
  atomic_llong processed;
  atomic_int tensor_bad;
  atomic_ullong first_call_ns; /* sink: first process call */
} rt_col_t;

typedef struct rt_cfg {
  const spn_host_api_t *host;
  int64_t count;        /* src: frames per job */
  int64_t gap_us;       /* src: at least this long between frames */
  int32_t delay_us_max; /* pass: random delay in [0, max); sink: fixed delay */
  int64_t fail_seq;     /* pass: fail fail_job at this seq (-1 never) */
  uint64_t fail_job;
  int32_t fail_status;  /* pass: when set, return this status from process instead of fail_job */
  bool with_tensor;     /* src: attach a 64-byte tensor holding the seq */
  int64_t skip_every;   /* pass: replace frames whose seq % skip_every == 1 by SKIP */
  rt_col_t *col;        /* every kind: counts; sink: records */
  int32_t fail_create;  /* create returns this when set */
  int32_t fail_preload; /* preload returns this when set */
  const char *model;    /* preload: load this model through the host */
  bool warn_preload;    /* preload: log a warning naming no job */
  int64_t warn_every;   /* pass: log a warning for the job on frames whose seq % warn_every == 0 (0 never) */
} rt_cfg_t;

static inline uint64_t rt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void rt_col_init(rt_col_t *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  for (int i = 0; i < RT_MAX_JOBS; i++)
    c->jobs[i].flushed_at = -1;
}

static inline void rt_col_free(rt_col_t *c) {
  for (int i = 0; i < RT_MAX_JOBS; i++)
    free(c->jobs[i].seqs);
  pthread_mutex_destroy(&c->mu);
}

/* Record of a job (mu held). */
static inline rt_job_rec_t *rt_col_job(rt_col_t *c, uint64_t job) {
  for (size_t i = 0; i < c->n_jobs; i++)
    if (c->jobs[i].job == job)
      return &c->jobs[i];
  if (c->n_jobs == RT_MAX_JOBS)
    abort();
  c->jobs[c->n_jobs].job = job;
  return &c->jobs[c->n_jobs++];
}

/* Check a job's frames are exactly 0..n-1 in order and flush came after. */
static inline bool rt_col_check_skip(rt_col_t *c, uint64_t job, int64_t total, int64_t skip_every, char *why,
                                     size_t why_size) {
  pthread_mutex_lock(&c->mu);
  rt_job_rec_t *r = rt_col_job(c, job);
  bool ok = true;
  int64_t n = 0;
  for (int64_t q = 0; q < total; q++)
    if (!(skip_every && q % skip_every == 1))
      n++;
  if ((int64_t)r->n != n) {
    snprintf(why, why_size, "job %llu: %zu frames, expected %lld", (unsigned long long)job, r->n, (long long)n);
    ok = false;
  }
  for (size_t i = 0, q = 0; ok && i < r->n; i++, q++) {
    while (skip_every && (int64_t)q % skip_every == 1)
      q++;
    if (r->seqs[i] != q) {
      snprintf(why, why_size, "job %llu: frame %zu has seq %llu, expected %zu", (unsigned long long)job, i,
               (unsigned long long)r->seqs[i], q);
      ok = false;
    }
  }
  if (ok && (r->flushes != 1 || r->flushed_at != n)) {
    snprintf(why, why_size, "job %llu: %d flushes, flush after %lld frames (expected one, after %lld)",
             (unsigned long long)job, r->flushes, r->flushed_at, (long long)n);
    ok = false;
  }
  pthread_mutex_unlock(&c->mu);
  return ok;
}

static inline bool rt_col_check(rt_col_t *c, uint64_t job, int64_t n, char *why, size_t why_size) {
  return rt_col_check_skip(c, job, n, 0, why, why_size);
}

/* ---- kinds --------------------------------------------------------------------- */

typedef struct rt_inst {
  rt_cfg_t cfg;
  unsigned seed;
} rt_inst_t;

typedef struct rt_src_job {
  uint64_t id;
  int64_t next;
  uint64_t last_ns;
} rt_src_job_t;

static int32_t rt_create(spn_stage_t *s, const void *config, void **state, spn_error_t *err) {
  (void)err;
  const rt_cfg_t *cfg = config;
  if (cfg->fail_create)
    return spn_error_set(err, cfg->fail_create, "cannot open the camera");
  rt_inst_t *in = calloc(1, sizeof *in);
  if (!in)
    return SPN_ENOMEM;
  in->cfg = *cfg;
  in->seed = (unsigned)(uintptr_t)s;
  *state = in;
  return SPN_OK;
}

static int32_t rt_preload(spn_stage_t *s, void *state, spn_error_t *err) {
  rt_inst_t *in = state;
  if (in->cfg.model) {
    spn_model_t *m = NULL;
    int32_t rc = in->cfg.host->model_load(s, in->cfg.model, &m, err);
    if (rc != SPN_OK)
      return rc;
    in->cfg.host->model_release(s, &m);
  }
  if (in->cfg.fail_preload)
    return spn_error_set(err, in->cfg.fail_preload, "weights are corrupt");
  if (in->cfg.warn_preload) {
    in->cfg.host->log(s, 0, SPN_LOG_WARN, "model \"%s\" not found; using the built-in one", "w.onnx");
    in->cfg.host->log(s, 0, SPN_LOG_INFO, "preloaded");
  }
  return SPN_OK;
}

static void rt_destroy(spn_stage_t *s, void *state) {
  (void)s;
  free(state);
}

static int32_t rt_job_open(spn_stage_t *s, void *state, const spn_job_info_t *job, void **job_state, spn_error_t *err) {
  (void)s;
  (void)err;
  rt_inst_t *in = state;
  rt_src_job_t *js = calloc(1, sizeof *js);
  if (!js)
    return SPN_ENOMEM;
  js->id = job->job_id;
  *job_state = js;
  if (in->cfg.col)
    atomic_fetch_add(&in->cfg.col->opens, 1);
  return SPN_OK;
}

static void rt_job_close(spn_stage_t *s, void *state, void *job_state, bool ok) {
  (void)s;
  rt_inst_t *in = state;
  if (in->cfg.col)
    atomic_fetch_add(ok ? &in->cfg.col->closes_ok : &in->cfg.col->closes_fail, 1);
  free(job_state);
}

static int32_t rt_src_generate(spn_stage_t *s, void *state, void *job_state, spn_error_t *err) {
  rt_inst_t *in = state;
  rt_src_job_t *js = job_state;
  const spn_host_api_t *h = in->cfg.host;
  if (js->next >= in->cfg.count)
    return SPN_EOS;
  if (in->cfg.gap_us) {
    uint64_t now = rt_now_ns();
    if (js->next && now - js->last_ns < (uint64_t)in->cfg.gap_us * 1000)
      return SPN_EAGAIN;
    js->last_ns = now;
  }
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = js->id, .seq = (uint64_t)js->next,
                        .pts = (double)js->next / 25.0, .total = in->cfg.count};
  spn_msg_t *m = NULL;
  int32_t rc = h->msg_new(s, &env, &m, err);
  if (rc != SPN_OK)
    return rc;
  uint64_t n = (uint64_t)js->next;
  if (in->cfg.with_tensor) {
    spn_buffer_t *b = NULL;
    if ((rc = h->buffer_new(s, 64, &b, err)) != SPN_OK) {
      h->msg_free(&m);
      return rc;
    }
    uint64_t *d = h->buffer_data(b);
    for (int i = 0; i < 8; i++)
      d[i] = n * 8 + (uint64_t)i;
    spn_tensor_t t = {.struct_size = sizeof t, .dtype = SPN_DTYPE_I64, .ndim = 1, .shape = {8}};
    rc = h->msg_add_tensor(m, "frame", &t, b, err);
    h->buffer_unref(&b);
    if (rc != SPN_OK) {
      h->msg_free(&m);
      return rc;
    }
  }
  if ((rc = h->msg_add_meta(m, "n", &n, sizeof n, err)) != SPN_OK) {
    h->msg_free(&m);
    return rc;
  }
  js->next++;
  return h->emit(s, 0, &m, err);
}

static void rt_check_msg(rt_inst_t *in, spn_msg_t *m) {
  const spn_host_api_t *h = in->cfg.host;
  const spn_envelope_t *env = h->msg_envelope(m);
  int64_t i = h->msg_find(m, "n");
  spn_item_t it = {.struct_size = sizeof it};
  bool ok = i >= 0 && h->msg_item(m, (size_t)i, &it) == SPN_OK && it.meta_size == 8 &&
            *(const uint64_t *)it.meta == env->seq;
  int64_t ti = h->msg_find(m, "frame");
  if (ti >= 0) {
    ok = ok && h->msg_item(m, (size_t)ti, &it) == SPN_OK && it.kind == SPN_ITEM_TENSOR &&
         it.tensor.shape[0] == 8 && ((const uint64_t *)it.tensor.data)[7] == env->seq * 8 + 7;
  }
  if (!ok && in->cfg.col)
    atomic_fetch_add(&in->cfg.col->tensor_bad, 1);
}

static int32_t rt_pass_process(spn_stage_t *s, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                               spn_error_t *err) {
  (void)job_states;
  rt_inst_t *in = state;
  const spn_host_api_t *h = in->cfg.host;
  uint64_t job_ids[256];
  if (n > 256)
    abort();
  for (size_t i = 0; i < n; i++)
    job_ids[i] = h->msg_envelope(msgs[i])->job_id;
  for (size_t i = 0; i < n; i++) {
    const spn_envelope_t *env = h->msg_envelope(msgs[i]);
    rt_check_msg(in, msgs[i]);
    if (in->cfg.warn_every && (int64_t)env->seq % in->cfg.warn_every == 0) {
      h->log(s, env->job_id, SPN_LOG_WARN, "frame %llu of job %llu is damaged; accepted",
             (unsigned long long)env->seq, (unsigned long long)env->job_id);
      h->log(s, env->job_id, SPN_LOG_INFO, "frame %llu: info", (unsigned long long)env->seq);
    }
    if (in->cfg.delay_us_max > 0)
      usleep((useconds_t)(rand_r(&in->seed) % (unsigned)in->cfg.delay_us_max));
    if (in->cfg.fail_seq >= 0 && env->job_id == in->cfg.fail_job && (int64_t)env->seq == in->cfg.fail_seq) {
      if (in->cfg.fail_status)
        return spn_error_set(err, in->cfg.fail_status, "frame %llu is corrupt", (unsigned long long)env->seq);
      h->fail_job(s, env->job_id, SPN_EMEDIA, "frame is corrupt");
      continue;
    }
    if (in->cfg.skip_every && (int64_t)env->seq % in->cfg.skip_every == 1) {
      spn_envelope_t skip = *env;
      skip.flags = SPN_MSG_SKIP;
      spn_msg_t *m = NULL;
      int32_t rc = h->msg_new(s, &skip, &m, err);
      if (rc == SPN_OK)
        rc = h->emit(s, 0, &m, err);
      if (rc != SPN_OK)
        return rc;
      continue;
    }
    int32_t rc = h->emit(s, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  if (in->cfg.col) {
    int32_t kind = -1, idx = -1;
    h->stage_get_device(s, &kind, &idx);
    pthread_mutex_lock(&in->cfg.col->mu);
    for (size_t i = 0; i < n; i++)
      rt_col_job(in->cfg.col, job_ids[i])->dev_mask |= 1u << idx;
    pthread_mutex_unlock(&in->cfg.col->mu);
    atomic_fetch_add(&in->cfg.col->processed, (long long)n);
  }
  return SPN_OK;
}

static int32_t rt_sink_process(spn_stage_t *s, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                               spn_error_t *err) {
  (void)s;
  (void)job_states;
  (void)err;
  rt_inst_t *in = state;
  const spn_host_api_t *h = in->cfg.host;
  rt_col_t *c = in->cfg.col;
  if (in->cfg.delay_us_max > 0)
    usleep((useconds_t)in->cfg.delay_us_max);
  unsigned long long zero = 0;
  atomic_compare_exchange_strong(&c->first_call_ns, &zero, rt_now_ns());
  pthread_mutex_lock(&c->mu);
  c->calls++;
  if (n > c->max_batch)
    c->max_batch = n;
  bool mixed = false;
  for (size_t i = 0; i < n; i++) {
    rt_check_msg(in, msgs[i]);
    const spn_envelope_t *env = h->msg_envelope(msgs[i]);
    if (env->job_id != h->msg_envelope(msgs[0])->job_id)
      mixed = true;
    rt_job_rec_t *r = rt_col_job(c, env->job_id);
    if (r->n == r->cap) {
      r->cap = r->cap ? r->cap * 2 : 1024;
      r->seqs = realloc(r->seqs, r->cap * sizeof *r->seqs);
      if (!r->seqs)
        abort();
    }
    if (!r->n)
      r->first_idx = c->arrivals;
    r->last_idx = c->arrivals++;
    r->seqs[r->n++] = env->seq;
  }
  if (mixed)
    c->mixed_batches++;
  pthread_mutex_unlock(&c->mu);
  atomic_fetch_add(&c->processed, (long long)n);
  return SPN_OK;
}

static int32_t rt_sink_flush(spn_stage_t *s, void *state, void *job_state, spn_error_t *err) {
  (void)s;
  (void)err;
  rt_inst_t *in = state;
  rt_src_job_t *js = job_state;
  rt_col_t *c = in->cfg.col;
  pthread_mutex_lock(&c->mu);
  rt_job_rec_t *r = rt_col_job(c, js->id);
  r->flushes++;
  r->flushed_at = (long long)r->n;
  pthread_mutex_unlock(&c->mu);
  return SPN_OK;
}

static const spn_port_t rt_any_port[] = {{"out", "any"}};

static const spn_stage_kind_t rt_kind_src = {
    .struct_size = sizeof(spn_stage_kind_t), .name = "test_src", .config_size = sizeof(rt_cfg_t),
    .n_outputs = 1, .outputs = rt_any_port, .device_need = SPN_NEED_CPU, .max_batch = 1,
    .create = rt_create, .job_open = rt_job_open, .generate = rt_src_generate, .job_close = rt_job_close,
    .destroy = rt_destroy};

static const spn_stage_kind_t rt_kind_pass = {
    .struct_size = sizeof(spn_stage_kind_t), .name = "test_pass", .config_size = sizeof(rt_cfg_t),
    .inputs = rt_any_port, .n_inputs = 1, .n_outputs = 1, .outputs = rt_any_port,
    .device_need = SPN_NEED_EITHER, .max_batch = 1, .create = rt_create, .preload = rt_preload, .job_open = rt_job_open,
    .process = rt_pass_process, .job_close = rt_job_close, .destroy = rt_destroy};

static const spn_stage_kind_t rt_kind_sink = {
    .struct_size = sizeof(spn_stage_kind_t), .name = "test_sink", .config_size = sizeof(rt_cfg_t),
    .inputs = rt_any_port, .n_inputs = 1, .device_need = SPN_NEED_CPU, .max_batch = 1,
    .create = rt_create, .job_open = rt_job_open, .process = rt_sink_process, .flush = rt_sink_flush,
    .job_close = rt_job_close, .destroy = rt_destroy};

/* ---- spec builder -------------------------------------------------------------- */

#define RT_MAX_STAGES 8

typedef struct rt_spec {
  spn__pipeline_spec_t spec;
  spn__stage_spec_t stages[RT_MAX_STAGES];
  spn__edge_spec_t edges[RT_MAX_STAGES];
  rt_cfg_t cfgs[RT_MAX_STAGES];
} rt_spec_t;

static inline void rt_spec_init(rt_spec_t *b, const char *name) {
  memset(b, 0, sizeof *b);
  b->spec.name = (char *)name;
  b->spec.file = (char *)"test";
  b->spec.stages = b->stages;
  b->spec.edges = b->edges;
}

/* Adds a stage; returns its config to fill. */
static inline rt_cfg_t *rt_spec_stage(rt_spec_t *b, const char *name, const spn_stage_kind_t *kind,
                                      const spn_host_api_t *host) {
  size_t i = b->spec.n_stages++;
  spn__stage_spec_t *s = &b->stages[i];
  s->name = (char *)name;
  s->kind = kind;
  s->config = &b->cfgs[i];
  s->device = (char *)"auto";
  s->instances = 1;
  snprintf(s->where, sizeof s->where, "test:%zu:1", i + 1);
  b->cfgs[i].host = host;
  b->cfgs[i].fail_seq = -1;
  return &b->cfgs[i];
}

static inline void rt_spec_edge(rt_spec_t *b, uint32_t from, uint32_t to) {
  b->edges[b->spec.n_edges++] = (spn__edge_spec_t){.from_stage = from, .to_stage = to};
}

/* ---- job callbacks ---------------------------------------------------------------- */

typedef struct rt_done {
  atomic_int calls;
  atomic_int status;
  atomic_llong last_progress;
  atomic_int progress_calls;
  char msg[SPN_ERROR_MSG_MAX];
} rt_done_t;

static void rt_on_done(void *data, uint64_t job_id, int32_t status, const char *msg) {
  (void)job_id;
  rt_done_t *d = data;
  snprintf(d->msg, sizeof d->msg, "%s", msg ? msg : "");
  atomic_store(&d->status, status);
  atomic_fetch_add(&d->calls, 1);
}

static void rt_on_progress(void *data, const spn_job_progress_t *p) {
  rt_done_t *d = data;
  atomic_store(&d->last_progress, p->done);
  atomic_fetch_add(&d->progress_calls, 1);
}

static inline spn_job_callbacks_t rt_callbacks(rt_done_t *d) {
  memset(d, 0, sizeof *d);
  return (spn_job_callbacks_t){.struct_size = sizeof(spn_job_callbacks_t), .data = d,
                               .on_progress = rt_on_progress, .on_done = rt_on_done};
}

static inline spn_runtime_t *rt_new(const char *devices, uint32_t cpu_threads) {
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = devices;
  o.cpu_threads = cpu_threads;
  o.log_level = SPN_LOG_ERROR + 1; /* the tests provoke errors on purpose */
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&o, &rt, &err) != SPN_OK) {
    fprintf(stderr, "spn_runtime_new: %s\n", err.msg);
    abort();
  }
  return rt;
}

#endif
