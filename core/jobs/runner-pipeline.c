/* runner-pipeline.c — the job runner that runs real pipelines on the runtime.
 *
 * At creation it loads every pipeline the server config names ([[pipeline]]
 * name + config) into one runtime, once: spn_pipeline_load creates the stage
 * instances and preloads their models, so by the time the gateway (or a
 * remote worker) reports ready every pipeline can take a job at once. Jobs
 * for other names go to a fallback runner (the built-in test pipelines).
 *
 * A job maps onto per-job overrides of SPN_CONFIG_PER_JOB stage keys through
 * the pipeline config's bindings ([pipeline.inputs], [pipeline.outputs],
 * [pipeline.params]): input NAME gives "<target>=<its path>", output NAME
 * gives "<target>=<the temporary path the job service hands out>" (the
 * service renames it on success), and param NAME gives "<target>=<value>"
 * when NAME is bound, or is itself "stage.key". Every input and output the
 * pipeline binds must be given, and nothing else; the runtime then checks
 * keys, types and ranges (spn_pipeline_check_job) before anything runs.
 *
 * The runtime job id is the queue's job id, so stages that key their output
 * on the job (the synth pattern) produce the same bytes on every attempt and
 * every worker. Progress and the end come from the runtime's callbacks on
 * its loop thread; the runner thread waits on them, forwards progress to the
 * job context (whose coalescing state is the runner thread's) and turns the
 * service's cancel flag into spn_job_cancel.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jobs-internal.h"
#include "observe.h"
#include "spindle/runtime.h"

typedef struct pr_entry {
  char *name;
  spn_pipeline_t *pipe;
  double load_s; /* spn_pipeline_load: stage instances and their models */
} pr_entry_t;

typedef struct pipeline_runner {
  spn_runtime_t *rt;
  pr_entry_t *entries;
  size_t n;
  spn_job_runner_t fallback; /* .run NULL: none */
} pipeline_runner_t;

static const pr_entry_t *pr_find(const pipeline_runner_t *r, const char *name) {
  for (size_t i = 0; i < r->n; i++)
    if (!strcmp(r->entries[i].name, name))
      return &r->entries[i];
  return NULL;
}

static bool pr_has_pipeline(void *data, const char *name) {
  pipeline_runner_t *r = data;
  if (pr_find(r, name))
    return true;
  return r->fallback.has_pipeline && r->fallback.has_pipeline(r->fallback.data, name);
}

/* ---- job → overrides ---- */

typedef struct ovs {
  char **v;
  size_t n;
} ovs_t;

static void ovs_free(ovs_t *o) {
  for (size_t i = 0; i < o->n; i++)
    free(o->v[i]);
  free(o->v);
  memset(o, 0, sizeof *o);
}

/* "target=value"; with quote, value becomes a TOML basic string (paths are
 * strings whatever they look like). */
static int32_t ovs_add(ovs_t *o, const char *target, const char *value, bool quote, spn_error_t *err) {
  size_t cap = strlen(target) + strlen(value) * 6 + 8;
  char *s = malloc(cap);
  char **nv = s ? realloc(o->v, (o->n + 1) * sizeof *nv) : NULL;
  if (!nv) {
    free(s);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  o->v = nv;
  size_t w = (size_t)snprintf(s, cap, "%s=", target);
  if (quote) {
    s[w++] = '"';
    for (const unsigned char *c = (const unsigned char *)value; *c; c++) {
      if (*c == '"' || *c == '\\')
        w += (size_t)snprintf(s + w, cap - w, "\\%c", *c);
      else if (*c < 0x20 || *c == 0x7f)
        w += (size_t)snprintf(s + w, cap - w, "\\u%04x", *c);
      else
        s[w++] = (char)*c;
    }
    s[w++] = '"';
    s[w] = '\0';
  } else {
    snprintf(s + w, cap - w, "%s", value);
  }
  o->v[o->n++] = s;
  return SPN_OK;
}

static const char *binding_target(const spn_pipeline_t *p, spn_binding_kind_t kind, const char *name) {
  const char *target = NULL;
  for (size_t i = 0; i < spn_pipeline_binding_count(p, kind); i++)
    if (!strcmp(spn_pipeline_binding_at(p, kind, i, &target), name))
      return target;
  return NULL;
}

static void binding_names(const spn_pipeline_t *p, spn_binding_kind_t kind, char *buf, size_t size) {
  size_t w = 0;
  buf[0] = '\0';
  size_t n = spn_pipeline_binding_count(p, kind);
  for (size_t i = 0; i < n && w < size; i++)
    w += (size_t)snprintf(buf + w, size - w, "%s%s", i ? ", " : "", spn_pipeline_binding_at(p, kind, i, NULL));
  if (!n)
    snprintf(buf, size, "none");
}

/* Build the overrides of a job. out_paths (NULL: the final paths) are the
 * paths the outputs are written to. Errors name the pipeline and the
 * offending input/output/param (callers add the job). */
static int32_t job_overrides(const pr_entry_t *e, const spn_job_spec_t *job, char *const *out_paths, ovs_t *o,
                             spn_error_t *err) {
  static const char *const what[] = {"input", "output", "param"};
  char names[512];
  int32_t rc = SPN_OK;
  for (int k = SPN_BINDING_INPUT; k <= SPN_BINDING_OUTPUT && rc == SPN_OK; k++) {
    const spn_job_io_t *io = k == SPN_BINDING_INPUT ? job->inputs : job->outputs;
    size_t n = k == SPN_BINDING_INPUT ? job->n_inputs : job->n_outputs;
    for (size_t i = 0; i < n && rc == SPN_OK; i++) {
      const char *t = binding_target(e->pipe, (spn_binding_kind_t)k, io[i].name);
      if (!t) {
        binding_names(e->pipe, (spn_binding_kind_t)k, names, sizeof names);
        return spn_error_set(err, SPN_EINVAL, "pipeline \"%s\" has no %s \"%s\" (its %ss: %s)", e->name,
                             what[k], io[i].name, what[k], names);
      }
      const char *path = k == SPN_BINDING_OUTPUT && out_paths ? out_paths[i] : io[i].path;
      rc = ovs_add(o, t, path, true, err);
    }
    /* Every bound input and output must be given. */
    size_t nb = spn_pipeline_binding_count(e->pipe, (spn_binding_kind_t)k);
    for (size_t b = 0; b < nb && rc == SPN_OK; b++) {
      const char *bn = spn_pipeline_binding_at(e->pipe, (spn_binding_kind_t)k, b, NULL);
      bool given = false;
      for (size_t i = 0; i < n; i++)
        given |= !strcmp(io[i].name, bn);
      if (!given)
        return spn_error_set(err, SPN_EINVAL, "pipeline \"%s\" needs %s \"%s\"", e->name, what[k], bn);
    }
  }
  for (size_t i = 0; i < job->n_params && rc == SPN_OK; i++) {
    const char *key = job->params[i].key;
    const char *t = binding_target(e->pipe, SPN_BINDING_PARAM, key);
    if (!t && strchr(key, '.'))
      t = key; /* "stage.key" directly; the runtime checks it is per job */
    if (!t) {
      binding_names(e->pipe, SPN_BINDING_PARAM, names, sizeof names);
      return spn_error_set(err, SPN_EINVAL, "pipeline \"%s\" has no param \"%s\" (its params: %s; or give stage.key)",
                           e->name, key, names);
    }
    rc = ovs_add(o, t, job->params[i].value, false, err);
  }
  return rc;
}

static int32_t pr_check(void *data, const spn_job_spec_t *job, spn_error_t *err) {
  pipeline_runner_t *r = data;
  const pr_entry_t *e = pr_find(r, job->pipeline);
  if (!e)
    return SPN_OK; /* the fallback's pipelines check at run time */
  ovs_t o = {0};
  int32_t rc = job_overrides(e, job, NULL, &o, err);
  if (rc == SPN_OK) {
    spn_job_params_t p = SPN_JOB_PARAMS_INIT;
    p.overrides = (const char *const *)o.v;
    p.n_overrides = o.n;
    if ((rc = spn_pipeline_check_job(e->pipe, &p, err)) != SPN_OK)
      spn_error_prefix(err, "pipeline \"%s\"", e->name);
  }
  ovs_free(&o);
  return rc;
}

/* ---- running a job ---- */

typedef struct run_state {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  atomic_llong p_done, p_total;
} run_state_t;

static void on_progress(void *data, const spn_job_progress_t *p) {
  run_state_t *st = data;
  atomic_store(&st->p_total, p->total);
  atomic_store(&st->p_done, p->done);
}

static void on_done(void *data, uint64_t job_id, int32_t status, const char *msg) {
  (void)job_id, (void)status, (void)msg; /* spn_job_wait returns them */
  run_state_t *st = data;
  pthread_mutex_lock(&st->mu);
  st->done = true;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
}

static void report(run_state_t *st, spn_job_ctx_t *ctx, long long *last) {
  long long d = atomic_load(&st->p_done), t = atomic_load(&st->p_total);
  if (d == *last)
    return;
  *last = d;
  spn_job_ctx_progress(ctx, d < 0 ? 0 : (uint64_t)d, t < 0 ? 0 : (uint64_t)t);
}

static int32_t pr_run(void *data, const spn_job_spec_t *job, spn_job_ctx_t *ctx, spn_error_t *err) {
  pipeline_runner_t *r = data;
  const pr_entry_t *e = pr_find(r, job->pipeline);
  if (!e) {
    if (r->fallback.run)
      return r->fallback.run(r->fallback.data, job, ctx, err);
    return spn_error_set(err, SPN_ENOENT, "job %lld: unknown pipeline \"%s\"", (long long)job->id, job->pipeline);
  }
  ovs_t o = {0};
  char **tmp = calloc(job->n_outputs ? job->n_outputs : 1, sizeof *tmp);
  if (!tmp)
    return spn_error_set(err, SPN_ENOMEM, "job %lld: out of memory", (long long)job->id);
  for (size_t i = 0; i < job->n_outputs; i++)
    tmp[i] = (char *)spn_job_ctx_output_tmp(ctx, i);
  int32_t rc = job_overrides(e, job, tmp, &o, err);
  free(tmp);
  if (rc != SPN_OK) {
    spn_error_prefix(err, "job %lld", (long long)job->id);
    goto out;
  }
  run_state_t st = {.done = false};
  pthread_mutex_init(&st.mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&st.cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&st.p_done, 0);
  atomic_init(&st.p_total, -1);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = (uint64_t)job->id;
  p.overrides = (const char *const *)o.v;
  p.n_overrides = o.n;
  spn_job_callbacks_t cb = {.struct_size = sizeof cb, .data = &st, .on_progress = on_progress, .on_done = on_done};
  spn_job_t *rj = NULL;
  if ((rc = spn_job_start(e->pipe, &p, &cb, &rj, err)) != SPN_OK) {
    spn_error_prefix(err, "job %lld", (long long)job->id);
    goto out_state;
  }
  bool cancel_sent = false;
  long long last = -1;
  pthread_mutex_lock(&st.mu);
  while (!st.done) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&st.cv, &st.mu, &ts);
    pthread_mutex_unlock(&st.mu);
    if (!cancel_sent && spn_job_ctx_cancelled(ctx)) {
      spn_job_cancel(rj);
      cancel_sent = true;
    }
    report(&st, ctx, &last);
    pthread_mutex_lock(&st.mu);
  }
  pthread_mutex_unlock(&st.mu);
  /* After spn_job_wait no callback runs any more: `st` may go. */
  spn_error_t jerr = SPN_ERROR_INIT;
  rc = spn_job_wait(rj, &jerr);
  report(&st, ctx, &last);
  /* Device busy time of the job's stages (docs/gpu.md), as its gpu_s. */
  spn_job_ctx_add_gpu_seconds(ctx, spn_job_device_seconds(rj));
  spn_job_free(&rj);
  if (rc != SPN_OK)
    spn_error_set(err, rc, "job %lld: pipeline \"%s\": %s", (long long)job->id, e->name,
                  jerr.msg[0] ? jerr.msg : spn_strerror(rc));
out_state:
  pthread_cond_destroy(&st.cv);
  pthread_mutex_destroy(&st.mu);
out:
  ovs_free(&o);
  return rc;
}

int32_t spn_pipeline_runner_new(spn_runtime_t *rt, const spn_pipeline_def_t *defs, size_t n,
                                const spn_job_runner_t *fallback, spn_job_runner_t *out, spn_error_t *err) {
  pipeline_runner_t *r = calloc(1, sizeof *r);
  if (!r || !(r->entries = calloc(n ? n : 1, sizeof *r->entries))) {
    free(r);
    return spn_error_set(err, SPN_ENOMEM, "pipeline runner: out of memory");
  }
  if (fallback)
    r->fallback = *fallback;
  r->rt = rt;
  int32_t rc = SPN_OK;
  for (size_t i = 0; i < n; i++) {
    pr_entry_t *e = &r->entries[i];
    double t0 = spn__mono_s();
    rc = spn_pipeline_load(rt, defs[i].config, NULL, 0, &e->pipe, err);
    e->load_s = spn__mono_s() - t0;
    if (rc != SPN_OK) {
      spn_error_prefix(err, "%s: pipeline \"%s\"", defs[i].where, defs[i].name ? defs[i].name : defs[i].config);
      break;
    }
    const char *name = defs[i].name ? defs[i].name : spn_pipeline_name(e->pipe);
    if (pr_find(r, name) || (r->fallback.has_pipeline && r->fallback.has_pipeline(r->fallback.data, name))) {
      rc = spn_error_set(err, SPN_ECONFIG, "%s: pipeline \"%s\" is defined twice", defs[i].where, name);
      spn_pipeline_free(&e->pipe);
      break;
    }
    if (!(e->name = strdup(name))) {
      rc = spn_error_set(err, SPN_ENOMEM, "pipeline runner: out of memory");
      spn_pipeline_free(&e->pipe);
      break;
    }
    r->n++;
  }
  *out = (spn_job_runner_t){.data = r, .run = pr_run, .has_pipeline = pr_has_pipeline, .check = pr_check};
  if (rc != SPN_OK)
    spn_pipeline_runner_free(out);
  return rc;
}

/* ---- what operators see (observe.h) ---- */

static const pipeline_runner_t *as_pipeline_runner(const spn_job_runner_t *runner) {
  return runner && runner->run == pr_run ? runner->data : NULL;
}

int64_t spn__runner_usable_devices(const spn_job_runner_t *runner) {
  const pipeline_runner_t *r = as_pipeline_runner(runner);
  return r && r->rt ? (int64_t)spn_runtime_usable_device_count(r->rt) : -1;
}

static void stage_label(spn__mbuf_t *b, const char *fam, const char *pipeline, const char *stage) {
  spn__mbuf_put(b, "%s{pipeline=\"", fam);
  spn__mbuf_label(b, pipeline);
  spn__mbuf_put(b, "\",stage=\"");
  spn__mbuf_label(b, stage);
  spn__mbuf_put(b, "\"");
}

void spn__runner_metrics(const spn_job_runner_t *runner, spn__mbuf_t *b) {
  const pipeline_runner_t *r = as_pipeline_runner(runner);
  if (!r || !r->n)
    return;
  spn__mbuf_family(b, "spindle_pipeline_load_seconds", "gauge",
                   "Time loading each pipeline at start-up: stage instances and their models.");
  for (size_t i = 0; i < r->n; i++) {
    spn__mbuf_put(b, "spindle_pipeline_load_seconds{pipeline=\"");
    spn__mbuf_label(b, r->entries[i].name);
    spn__mbuf_put(b, "\"} %.6f\n", r->entries[i].load_s);
  }
  spn__mbuf_family(b, "spindle_stage_latency_seconds", "histogram",
                   "Wall time of each process/generate call of a stage, by pipeline and stage.");
  for (size_t i = 0; i < r->n; i++)
    for (size_t k = 0; k < spn_pipeline_stage_count(r->entries[i].pipe); k++) {
      spn_stage_stats_t st;
      const char *stage = spn_pipeline_stage_stats(r->entries[i].pipe, k, &st);
      if (!stage)
        continue;
      uint64_t cum = 0;
      for (size_t j = 0; j < SPN_STAGE_LATENCY_BUCKETS; j++) {
        cum += st.latency_bucket[j];
        stage_label(b, "spindle_stage_latency_seconds_bucket", r->entries[i].name, stage);
        if (j + 1 < SPN_STAGE_LATENCY_BUCKETS)
          spn__mbuf_put(b, ",le=\"%g\"} %llu\n", spn_stage_latency_bounds_s[j], (unsigned long long)cum);
        else
          spn__mbuf_put(b, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
      }
      stage_label(b, "spindle_stage_latency_seconds_sum", r->entries[i].name, stage);
      spn__mbuf_put(b, "} %.9f\n", (double)st.call_ns / 1e9);
      stage_label(b, "spindle_stage_latency_seconds_count", r->entries[i].name, stage);
      spn__mbuf_put(b, "} %llu\n", (unsigned long long)st.calls);
    }
  spn__mbuf_family(b, "spindle_stage_batch_size", "histogram",
                   "Messages handed to each process call of a stage (its batch), by pipeline and stage.");
  for (size_t i = 0; i < r->n; i++)
    for (size_t k = 0; k < spn_pipeline_stage_count(r->entries[i].pipe); k++) {
      spn_stage_stats_t st;
      const char *stage = spn_pipeline_stage_stats(r->entries[i].pipe, k, &st);
      if (!stage || !st.processes)
        continue; /* a source is never handed a batch */
      uint64_t cum = 0;
      for (size_t j = 0; j < SPN_STAGE_BATCH_BUCKETS; j++) {
        cum += st.batch_bucket[j];
        stage_label(b, "spindle_stage_batch_size_bucket", r->entries[i].name, stage);
        if (j + 1 < SPN_STAGE_BATCH_BUCKETS)
          spn__mbuf_put(b, ",le=\"%u\"} %llu\n", 1u << j, (unsigned long long)cum);
        else
          spn__mbuf_put(b, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
      }
      stage_label(b, "spindle_stage_batch_size_sum", r->entries[i].name, stage);
      spn__mbuf_put(b, "} %llu\n", (unsigned long long)st.messages);
      stage_label(b, "spindle_stage_batch_size_count", r->entries[i].name, stage);
      spn__mbuf_put(b, "} %llu\n", (unsigned long long)st.batches);
    }
}

void spn_pipeline_runner_free(spn_job_runner_t *runner) {
  pipeline_runner_t *r = runner->data;
  if (r) {
    for (size_t i = 0; i < r->n; i++) {
      spn_pipeline_free(&r->entries[i].pipe);
      free(r->entries[i].name);
    }
    free(r->entries);
    free(r);
  }
  memset(runner, 0, sizeof *runner);
}
