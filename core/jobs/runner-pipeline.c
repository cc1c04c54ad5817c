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
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jobs-internal.h"
#include "observe.h"
#include "spindle/plugin.h"
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
  /* Segments: the media plugin's split/join table, found once at creation
   * in the loaded plugin that exports it (NULL: none loaded; segmented
   * jobs are refused). The handle only pins the library; seg_file is its
   * file as the runtime names it, so that the encoder kinds the table
   * lists are known to be that library's (is_encoder). */
  const spn_segment_api_t *seg;
  void *seg_lib;
  char *seg_file;
  double cancel_grace_s; /* spn__pipeline_runner_set_cancel_grace; 0: wait for ever */
  atomic_bool wedged;    /* a run was abandoned inside a stage's call */
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

/* The `nth` key (0, 1, ...) that the binding `name` sets: an input or a
 * param may set several (spindle/runtime.h); NULL past the last. */
static const char *binding_target(const spn_pipeline_t *p, spn_binding_kind_t kind, const char *name, size_t nth) {
  const char *target = NULL;
  for (size_t i = 0; i < spn_pipeline_binding_count(p, kind); i++)
    if (!strcmp(spn_pipeline_binding_at(p, kind, i, &target), name) && !nth--)
      return target;
  return NULL;
}

/* Whether binding i is the first of its name (the one a list shows). */
static bool binding_first(const spn_pipeline_t *p, spn_binding_kind_t kind, size_t i) {
  const char *name = spn_pipeline_binding_at(p, kind, i, NULL);
  for (size_t k = 0; k < i; k++)
    if (!strcmp(spn_pipeline_binding_at(p, kind, k, NULL), name))
      return false;
  return true;
}

static void binding_names(const spn_pipeline_t *p, spn_binding_kind_t kind, char *buf, size_t size) {
  size_t w = 0;
  buf[0] = '\0';
  size_t n = spn_pipeline_binding_count(p, kind);
  for (size_t i = 0; i < n && w < size; i++)
    if (binding_first(p, kind, i))
      w += (size_t)snprintf(buf + w, size - w, "%s%s", w ? ", " : "", spn_pipeline_binding_at(p, kind, i, NULL));
  if (!n)
    snprintf(buf, size, "none");
}

/* The file a job gives as input or output `name`, or NULL. */
static const char *job_file(const spn_job_spec_t *job, spn_binding_kind_t kind, const char *name) {
  const spn_job_io_t *io = kind == SPN_BINDING_INPUT ? job->inputs : job->outputs;
  size_t n = kind == SPN_BINDING_INPUT ? job->n_inputs : job->n_outputs;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(io[i].name, name))
      return io[i].path;
  return NULL;
}

/* A param may not name a file: the job's files are its inputs and outputs,
 * which the gateway resolves and checks against its roots and against the
 * other jobs' files; a param that set the same key, or any path, would
 * read or write where it liked ("encode.path=/etc/x", or the input's key
 * pointed at a file outside the roots). So a param never sets a key an
 * input or output binds, and a direct "stage.key" param sets numbers and
 * booleans only (the shipped stages' per-job strings are all files; a
 * config binds a string key in [pipeline.params] by name where it means
 * one, and the config load refuses a path key there). */
static int32_t check_param_target(const pr_entry_t *e, const char *key, const char *target, bool direct,
                                  spn_error_t *err) {
  static const char *const what[] = {"input", "output"};
  for (int k = SPN_BINDING_INPUT; k <= SPN_BINDING_OUTPUT; k++) {
    for (size_t b = 0; b < spn_pipeline_binding_count(e->pipe, (spn_binding_kind_t)k); b++) {
      const char *bt = NULL;
      const char *bn = spn_pipeline_binding_at(e->pipe, (spn_binding_kind_t)k, b, &bt);
      if (bt && !strcmp(bt, target))
        return spn_error_set(err, SPN_EINVAL,
                             "pipeline \"%s\": param \"%s\" would set %s, the file of %s \"%s\": give files as the "
                             "job's inputs and outputs, not as params (a job service checks those against its roots)",
                             e->name, key, target, what[k], bn);
    }
  }
  spn_config_type_t type = 0;
  if (direct && spn_pipeline_key_type(e->pipe, target, &type, NULL) == SPN_OK &&
      (type == SPN_CONFIG_STRING || type == SPN_CONFIG_PATH))
    return spn_error_set(err, SPN_EINVAL,
                         "pipeline \"%s\": param \"%s\" sets a %s key: a param named stage.key sets a number or a "
                         "boolean; files are the job's inputs and outputs, and a string the pipeline's config binds "
                         "in [pipeline.params]",
                         e->name, key, type == SPN_CONFIG_PATH ? "path" : "string");
  return SPN_OK;
}

/* Build the overrides of a job. out_paths (NULL: the final paths) are the
 * paths the outputs are written to. partial: an input or output the job
 * does not give keeps the pipeline's value (spindle run), where a job of
 * the service must give each. Errors name the pipeline and the offending
 * input/output/param (callers add the job). */
static int32_t job_overrides(const pr_entry_t *e, const spn_job_spec_t *job, char *const *out_paths, bool partial,
                             ovs_t *o, spn_error_t *err) {
  static const char *const what[] = {"input", "output", "param"};
  char names[512];
  int32_t rc = SPN_OK;
  for (int k = SPN_BINDING_INPUT; k <= SPN_BINDING_OUTPUT && rc == SPN_OK; k++) {
    const spn_job_io_t *io = k == SPN_BINDING_INPUT ? job->inputs : job->outputs;
    size_t n = k == SPN_BINDING_INPUT ? job->n_inputs : job->n_outputs;
    for (size_t i = 0; i < n && rc == SPN_OK; i++) {
      if (!binding_target(e->pipe, (spn_binding_kind_t)k, io[i].name, 0)) {
        binding_names(e->pipe, (spn_binding_kind_t)k, names, sizeof names);
        return spn_error_set(err, SPN_EINVAL, "pipeline \"%s\" has no %s \"%s\" (its %ss: %s)", e->name,
                             what[k], io[i].name, what[k], names);
      }
      const char *path = k == SPN_BINDING_OUTPUT && out_paths ? out_paths[i] : io[i].path;
      const char *t;
      for (size_t nth = 0; rc == SPN_OK && (t = binding_target(e->pipe, (spn_binding_kind_t)k, io[i].name, nth));
           nth++)
        rc = ovs_add(o, t, path, true, err);
    }
    /* Every bound input and output must be given, but an input with a
     * default, which takes that input's file. */
    size_t nb = spn_pipeline_binding_count(e->pipe, (spn_binding_kind_t)k);
    for (size_t b = 0; b < nb && rc == SPN_OK; b++) {
      const char *bt = NULL;
      const char *bn = spn_pipeline_binding_at(e->pipe, (spn_binding_kind_t)k, b, &bt);
      if (job_file(job, (spn_binding_kind_t)k, bn))
        continue;
      const char *def = spn_pipeline_binding_default(e->pipe, (spn_binding_kind_t)k, b);
      const char *path = def ? job_file(job, (spn_binding_kind_t)k, def) : NULL;
      if (!path && partial)
        continue;
      if (!path)
        return spn_error_set(err, SPN_EINVAL, "pipeline \"%s\" needs %s \"%s\"", e->name, what[k],
                             def ? def : bn);
      rc = ovs_add(o, bt, path, true, err);
    }
  }
  for (size_t i = 0; i < job->n_params && rc == SPN_OK; i++) {
    const char *key = job->params[i].key;
    const char *t = binding_target(e->pipe, SPN_BINDING_PARAM, key, 0);
    bool direct = !t && strchr(key, '.');
    if (direct)
      t = key; /* "stage.key" directly; the runtime checks it is per job */
    if (!t) {
      binding_names(e->pipe, SPN_BINDING_PARAM, names, sizeof names);
      return spn_error_set(err, SPN_EINVAL, "pipeline \"%s\" has no param \"%s\" (its params: %s; or give stage.key)",
                           e->name, key, names);
    }
    for (size_t nth = 1; rc == SPN_OK && t; nth++) {
      if ((rc = check_param_target(e, key, t, direct, err)) != SPN_OK)
        return rc;
      rc = ovs_add(o, t, job->params[i].value, false, err);
      t = direct ? NULL : binding_target(e->pipe, SPN_BINDING_PARAM, key, nth);
    }
  }
  return rc;
}

#define SEG_HAS(api, field) ((api)->struct_size >= offsetof(spn_segment_api_t, field) + sizeof(api)->field)

/* Whether `kind` is one of the media plugin's encoders: named in its
 * segment table's list and registered by that library (not a user
 * plugin's kind that happens to share a name prefix: kind names are
 * unique in a runtime, so the name and the file settle it). */
static bool is_encoder(const pipeline_runner_t *r, const char *kind) {
  if (!r->seg || !kind || !SEG_HAS(r->seg, encoders) || !r->seg->encoders)
    return false;
  bool listed = false;
  for (const char *const *k = r->seg->encoders; *k && !listed; k++)
    listed = !strcmp(*k, kind);
  for (size_t i = 0; listed && i < spn_runtime_kind_count(r->rt); i++) {
    const char *file = NULL;
    const spn_stage_kind_t *k = spn_runtime_kind_at(r->rt, i, &file);
    if (k && k->name && !strcmp(k->name, kind))
      return file && r->seg_file && !strcmp(file, r->seg_file);
  }
  return false;
}

/* The kind of the stage that job output `name` is bound to (NULL: not
 * bound, or the stage is unknown), and in *encoded whether that stage is
 * one of the media plugin's encoders writing it as its "path". */
static const char *output_kind(const pipeline_runner_t *r, const pr_entry_t *e, const char *name, bool *encoded) {
  *encoded = false;
  const char *t = binding_target(e->pipe, SPN_BINDING_OUTPUT, name, 0); /* an output sets one key */
  const char *dot = t ? strchr(t, '.') : NULL;
  for (size_t i = 0; dot && i < spn_pipeline_stage_count(e->pipe); i++) {
    const char *stage = spn_pipeline_stage_time(e->pipe, i, NULL);
    if (stage && strlen(stage) == (size_t)(dot - t) && !strncmp(stage, t, (size_t)(dot - t))) {
      const char *kind = spn_pipeline_stage_kind(e->pipe, i);
      *encoded = !strcmp(dot + 1, "path") && is_encoder(r, kind);
      return kind;
    }
  }
  return NULL;
}

/* An output written by one of the media plugin's encoders ("encode.path"):
 * the plugin can pick a container from its name. Said at SUBMIT, not after
 * the job has decoded its first frames (and not retried as a failure that
 * a retry would meet again). Outputs of other stages (a user plugin's own
 * writer, filesink) are theirs to judge. */
static int32_t check_encoded(const pipeline_runner_t *r, const pr_entry_t *e, const spn_job_io_t *out,
                             spn_error_t *err) {
  if (!r->seg || !SEG_HAS(r->seg, check_output) || !r->seg->check_output)
    return SPN_OK;
  bool encoded;
  output_kind(r, e, out->name, &encoded);
  if (!encoded)
    return SPN_OK;
  int32_t rc = r->seg->check_output(out->path, err);
  if (rc != SPN_OK)
    spn_error_prefix(err, "pipeline \"%s\": output %s", e->name, out->name);
  return rc;
}

int32_t spn__pipeline_job_overrides(const spn_pipeline_t *pipe, const spn_job_spec_t *job, char ***ov, size_t *n,
                                    spn_error_t *err) {
  pr_entry_t e = {.name = (char *)spn_pipeline_name(pipe), .pipe = (spn_pipeline_t *)pipe};
  ovs_t o = {0};
  *ov = NULL;
  *n = 0;
  int32_t rc = job_overrides(&e, job, NULL, true, &o, err);
  if (rc != SPN_OK) {
    ovs_free(&o);
    return rc;
  }
  *ov = o.v;
  *n = o.n;
  return SPN_OK;
}

static int32_t pr_check(void *data, const spn_job_spec_t *job, spn_error_t *err) {
  pipeline_runner_t *r = data;
  const pr_entry_t *e = pr_find(r, job->pipeline);
  if (!e)
    return SPN_OK; /* the fallback's pipelines check at run time */
  ovs_t o = {0};
  int32_t rc = job_overrides(e, job, NULL, false, &o, err);
  if (rc == SPN_OK) {
    spn_job_params_t p = SPN_JOB_PARAMS_INIT;
    p.overrides = (const char *const *)o.v;
    p.n_overrides = o.n;
    if ((rc = spn_pipeline_check_job(e->pipe, &p, err)) != SPN_OK)
      spn_error_prefix(err, "pipeline \"%s\"", e->name);
  }
  ovs_free(&o);
  for (size_t i = 0; rc == SPN_OK && i < job->n_outputs; i++)
    rc = check_encoded(r, e, &job->outputs[i], err);
  return rc;
}

/* ---- segments ---- */

/* The per-job override `target=value` is accepted by the pipeline. */
static bool pipe_accepts(const pr_entry_t *e, const char *target, const char *value) {
  char buf[300];
  snprintf(buf, sizeof buf, "%s=%s", target, value);
  const char *ov[1] = {buf};
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.overrides = ov;
  p.n_overrides = 1;
  return spn_pipeline_check_job(e->pipe, &p, NULL) == SPN_OK;
}

/* The `nth` key a job param sets: its binding's targets, or itself
 * ("stage.key"); NULL past the last. */
static const char *param_target(const pr_entry_t *e, const char *key, size_t nth) {
  if (binding_target(e->pipe, SPN_BINDING_PARAM, key, 0))
    return binding_target(e->pipe, SPN_BINDING_PARAM, key, nth);
  return nth ? NULL : key;
}

static int32_t pr_segment_plan(void *data, const spn_job_spec_t *job, uint32_t segments, double seconds,
                               spn_segment_plan_t *plan, spn_error_t *err) {
  pipeline_runner_t *r = data;
  memset(plan, 0, sizeof *plan);
  const char *field = segments ? "segments" : "segment_seconds";
  const pr_entry_t *e = pr_find(r, job->pipeline);
  if (!e)
    return spn_error_set(err, SPN_EINVAL, "\"%s\": pipeline \"%s\" cannot be split (not a media pipeline)", field,
                         job->pipeline);
  if (!r->seg)
    return spn_error_set(err, SPN_EUNSUPPORTED, "\"%s\": no media plugin with segment support is loaded", field);
  if (job->n_outputs != 1)
    return spn_error_set(err, SPN_EINVAL, "\"%s\": a segmented job has exactly one output to join, this one has %zu",
                         field, job->n_outputs);
  bool encoded;
  const char *okind = output_kind(r, e, job->outputs[0].name, &encoded);
  if (!encoded)
    return spn_error_set(err, SPN_EINVAL,
                         "\"%s\": output \"%s\" is written by a stage of kind \"%s\", not by a media encoder's "
                         "path: its parts could not be joined",
                         field, job->outputs[0].name, okind ? okind : "(none)");
  /* The input to cut: the first whose stage takes a per-job start and
   * duration beside its path (the decode stage). */
  const spn_job_io_t *in = NULL;
  char stage[128] = "";
  for (size_t i = 0; i < job->n_inputs && !in; i++) {
    const char *it; /* each key the input sets (melspec.video beside decode.path) */
    for (size_t nth = 0; !in && (it = binding_target(e->pipe, SPN_BINDING_INPUT, job->inputs[i].name, nth)); nth++) {
      const char *dot = strrchr(it, '.');
      if (!dot || strcmp(dot, ".path") || (size_t)(dot - it) >= sizeof stage)
        continue;
      snprintf(stage, sizeof stage, "%.*s", (int)(dot - it), it);
      snprintf(plan->start_key, sizeof plan->start_key, "%s.start", stage);
      snprintf(plan->duration_key, sizeof plan->duration_key, "%s.duration", stage);
      if (pipe_accepts(e, plan->start_key, "1.0") && pipe_accepts(e, plan->duration_key, "1.0"))
        in = &job->inputs[i];
    }
  }
  /* The joined file's audio. The join does not use the segments' audio
   * (media-segment.c says why): it encodes one soundtrack once for the
   * whole file. That is the cut input's own (its audio through the
   * pipeline: transcode), or the file the encoder muxes (its audio_path:
   * enhance's soundtrack, lipsync's speech; given by the job or by
   * default), cut where the video ends as the encoder cuts it. Each
   * segment's encoder plays that file from the segment's first frame
   * (encode.audio_sync), so a segment is right on its own too. */
  const char *audio = NULL;
  for (size_t b = 0; b < spn_pipeline_binding_count(e->pipe, SPN_BINDING_INPUT) && !audio; b++) {
    const char *t = NULL;
    const char *bn = spn_pipeline_binding_at(e->pipe, SPN_BINDING_INPUT, b, &t);
    const char *def = spn_pipeline_binding_default(e->pipe, SPN_BINDING_INPUT, b);
    const char *dot = t ? strrchr(t, '.') : NULL;
    if (!dot || strcmp(dot, ".audio_path"))
      continue;
    if (job_file(job, SPN_BINDING_INPUT, bn))
      audio = bn;
    else if (def && job_file(job, SPN_BINDING_INPUT, def))
      audio = def;
  }
  if (!in)
    return spn_error_set(err, SPN_EINVAL,
                         "\"%s\": pipeline \"%s\" has no input to cut (a decode stage's path with a per-job start "
                         "and duration)",
                         field, e->name);
  for (size_t i = 0; i < job->n_params; i++) {
    const char *t;
    for (size_t nth = 0; (t = param_target(e, job->params[i].key, nth)); nth++)
      if (!strcmp(t, plan->start_key) || !strcmp(t, plan->duration_key))
        return spn_error_set(err, SPN_EINVAL, "\"%s\" cannot be combined with param \"%s\" (each segment sets %s)",
                             field, job->params[i].key, t);
  }
  /* A segment sets its cut through the param that binds the cut stage's
   * start (and duration) where the config has one, so that every key it
   * sets follows (lipsync's start is decode's and melspec's: the speech is
   * cut with the video); else the stage's keys themselves. */
  const char *keys[2] = {plan->start_key, plan->duration_key};
  char named[2][sizeof plan->start_key] = {"", ""};
  for (size_t b = 0; b < spn_pipeline_binding_count(e->pipe, SPN_BINDING_PARAM); b++) {
    const char *t = NULL;
    const char *bn = spn_pipeline_binding_at(e->pipe, SPN_BINDING_PARAM, b, &t);
    for (int k = 0; k < 2; k++)
      if (!named[k][0] && t && !strcmp(t, keys[k]) && strlen(bn) < sizeof named[k])
        snprintf(named[k], sizeof named[k], "%s", bn);
  }
  for (int k = 0; k < 2; k++)
    if (named[k][0])
      snprintf(k ? plan->duration_key : plan->start_key, sizeof plan->start_key, "%s", named[k]);
  snprintf(plan->output, sizeof plan->output, "%s", job->outputs[0].name);
  snprintf(plan->input, sizeof plan->input, "%s", in->name);
  snprintf(plan->audio, sizeof plan->audio, "%s", audio ? audio : in->name);
  plan->audio_cut = audio != NULL;
  double *kf = NULL, dur = 0;
  size_t m = 0;
  int32_t rc = r->seg->keyframes(in->path, &kf, &m, &dur, err);
  if (rc) {
    spn_error_prefix(err, "\"%s\": input \"%s\"", field, in->name);
    return rc;
  }
  uint32_t n = segments;
  if (!n) {
    double want = dur / seconds;
    n = want < 1.5 ? 1 : (uint32_t)fmin(llround(want), 100000);
    if (n > m)
      n = (uint32_t)m;
  }
  if (n > m) {
    rc = spn_error_set(err, SPN_EINVAL,
                       "\"segments\" = %u: input \"%s\" (%s) has %zu keyframes, so at most %zu segments", n,
                       in->name, in->path, m, m);
    goto out;
  }
  if (!(plan->bounds = calloc((size_t)n + 1, sizeof *plan->bounds))) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  /* Boundary i goes to the keyframe nearest i * duration / n, leaving at
   * least one keyframe for each boundary after it. */
  size_t prev = 0;
  for (uint32_t i = 1; i < n; i++) {
    double target = dur * i / n;
    size_t lo = prev + 1, hi = m - (n - i), best = lo;
    for (size_t k = lo; k <= hi; k++)
      if (fabs(kf[k] - target) < fabs(kf[best] - target))
        best = k;
    plan->bounds[i] = kf[best];
    prev = best;
  }
  plan->bounds[0] = 0;
  plan->bounds[n] = dur;
  plan->count = n;
out:
  free(kf);
  if (rc)
    spn_segment_plan_free(plan);
  return rc;
}

static int32_t pr_join(pipeline_runner_t *r, const spn_job_spec_t *job, spn_job_ctx_t *ctx, spn_error_t *err) {
  if (!r->seg)
    return spn_error_set(err, SPN_EUNSUPPORTED, "job %lld: no media plugin with segment support is loaded",
                         (long long)job->id);
  if (job->n_outputs != 1)
    return spn_error_set(err, SPN_EINVAL, "job %lld: a segmented job has one output", (long long)job->id);
  /* No progress of its own: a segmented job's progress is its segments'. */
  int32_t rc;
  if (job->segment_audio_cut && SEG_HAS(r->seg, join_cut) && r->seg->join_cut)
    rc = r->seg->join_cut((const char *const *)job->segment_files, job->segment_bounds, job->n_segments,
                          job->segment_source, spn_job_ctx_output_tmp(ctx, 0), err);
  else if (job->segment_audio_cut)
    rc = spn_error_set(err, SPN_EUNSUPPORTED,
                       "the media plugin cannot cut a soundtrack where the joined video ends (an older plugin)");
  else
    rc = r->seg->join((const char *const *)job->segment_files, job->segment_bounds, job->n_segments,
                      job->segment_source, spn_job_ctx_output_tmp(ctx, 0), err);
  if (rc) {
    spn_error_prefix(err, "job %lld: joining %zu segments", (long long)job->id, job->n_segments);
    return rc;
  }
  return SPN_OK;
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

static void ctx_warn(void *ctx, const char *line) { spn_job_ctx_warn(ctx, line); }

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

/* A run asked to stop has not ended within the grace: some stage is stuck
 * inside a call (a plugin in an endless loop, a read that never returns, a
 * GPU kernel that never finishes). Nothing can take the call back, so the
 * run is left where it is: its job fails now (its owner may retry it
 * elsewhere), and the runner is wedged — every later run of that pipeline
 * would queue behind the stuck call, and the runtime can no longer be
 * freed. The stage named is the one whose current call is oldest. */
static void abandon(pipeline_runner_t *r, const pr_entry_t *e, double grace, spn_job_ctx_t *ctx) {
  const char *stuck = NULL;
  double longest = 0;
  for (size_t i = 0; i < spn_pipeline_stage_count(e->pipe); i++) {
    double sec = 0;
    const char *name = spn_pipeline_stage_in_call(e->pipe, i, &sec);
    if (name && sec > longest) {
      longest = sec;
      stuck = name;
    }
  }
  char what[192];
  if (stuck)
    snprintf(what, sizeof what, "stage \"%s\" is inside one call for %.0f s", stuck, longest);
  else
    snprintf(what, sizeof what, "no stage is inside a call: the runtime did not end the job");
  snprintf(ctx->wedged_why, sizeof ctx->wedged_why,
           "pipeline \"%s\" did not stop within %g s of the stop (%s): the attempt is abandoned, and this "
           "process takes no more jobs (restart it)",
           e->name, grace, what);
  ctx->wedged = true;
  atomic_store(&r->wedged, true);
}

static int32_t pr_run(void *data, const spn_job_spec_t *job, spn_job_ctx_t *ctx, spn_error_t *err) {
  pipeline_runner_t *r = data;
  if (job->n_segments)
    return pr_join(r, job, ctx, err);
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
  int32_t rc = job_overrides(e, job, tmp, false, &o, err);
  free(tmp);
  if (rc != SPN_OK) {
    spn_error_prefix(err, "job %lld", (long long)job->id);
    goto out;
  }
  /* On the heap: a run abandoned inside a stage's call (below) leaves it
   * behind, since the runtime may still call on_done into it. */
  run_state_t *st = calloc(1, sizeof *st);
  if (!st) {
    rc = spn_error_set(err, SPN_ENOMEM, "job %lld: out of memory", (long long)job->id);
    goto out;
  }
  pthread_mutex_init(&st->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&st->cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&st->p_done, 0);
  atomic_init(&st->p_total, -1);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = (uint64_t)job->id;
  p.overrides = (const char *const *)o.v;
  p.n_overrides = o.n;
  spn_job_callbacks_t cb = {.struct_size = sizeof cb, .data = st, .on_progress = on_progress, .on_done = on_done};
  spn_job_t *rj = NULL;
  if ((rc = spn_job_start(e->pipe, &p, &cb, &rj, err)) != SPN_OK) {
    spn_error_prefix(err, "job %lld", (long long)job->id);
    goto out_state;
  }
  bool cancel_sent = false;
  double cancel_at = 0;
  long long last = -1;
  pthread_mutex_lock(&st->mu);
  while (!st->done) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&st->cv, &st->mu, &ts);
    bool done = st->done;
    pthread_mutex_unlock(&st->mu);
    if (!cancel_sent && spn_job_ctx_cancelled(ctx)) {
      spn_job_cancel(rj);
      cancel_sent = true;
      cancel_at = spn__mono_s();
    }
    report(st, ctx, &last);
    /* Once a run was abandoned, the others that are stopped get 2 s: they
     * most likely wait behind the same stuck call. */
    double grace = atomic_load(&r->wedged) && r->cancel_grace_s > 2 ? 2 : r->cancel_grace_s;
    if (!done && cancel_sent && grace > 0 && spn__mono_s() - cancel_at >= grace) {
      abandon(r, e, grace, ctx);
      rc = SPN_ECANCELLED; /* exec.c: timed out, or cancelled; the why is ctx->wedged_why */
      goto out; /* st and rj stay: the runtime still holds them */
    }
    pthread_mutex_lock(&st->mu);
  }
  pthread_mutex_unlock(&st->mu);
  /* After spn_job_wait no callback runs any more: `st` may go. */
  spn_error_t jerr = SPN_ERROR_INIT;
  rc = spn_job_wait(rj, &jerr);
  report(st, ctx, &last);
  /* Device busy time of the job's stages (docs/gpu.md), as its gpu_s. */
  spn_job_ctx_add_gpu_seconds(ctx, spn_job_device_seconds(rj));
  /* What was copied for it (edges and stages' own copies), as its transfers. */
  spn_transfer_stats_t x = SPN_TRANSFER_STATS_INIT;
  spn_job_transfers(rj, &x);
  spn_job_ctx_add_transfers(ctx, x.bytes, x.ns);
  /* Its warnings, for its status: the pipeline's own first (a model
   * replaced by a built-in one at load holds for every job), then the
   * job's (damaged input accepted, a codec replaced, ...). */
  spn_job_warnings_each(rj, "the worker's log", ctx_warn, ctx);
  spn_job_free(&rj);
  if (rc != SPN_OK)
    spn_error_set(err, rc, "job %lld: pipeline \"%s\": %s", (long long)job->id, e->name,
                  jerr.msg[0] ? jerr.msg : spn_strerror(rc));
out_state:
  pthread_cond_destroy(&st->cv);
  pthread_mutex_destroy(&st->mu);
  free(st);
out:
  ovs_free(&o);
  return rc;
}

/* The split/join table of the loaded plugin that exports one (the media
 * plugin), if any: looked for in every loaded plugin's library, not by
 * kind name. RTLD_NOLOAD: only a library the runtime already loaded and
 * checked is used. A table must have keyframes and join; check_output and
 * encoders are newer (SEG_HAS). */
static int32_t seg_lookup(pipeline_runner_t *r, spn_runtime_t *rt, spn_error_t *err) {
  for (size_t i = 0; i < spn_runtime_kind_count(rt) && !r->seg; i++) {
    const char *file = NULL;
    const spn_stage_kind_t *k = spn_runtime_kind_at(rt, i, &file);
    if (!k || !file)
      continue;
    void *lib = dlopen(file, RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
      continue;
    spn_segment_api_fn fn;
    *(void **)&fn = dlsym(lib, SPN_SEGMENT_API_SYMBOL);
    const spn_segment_api_t *api = fn ? fn() : NULL;
    if (api && SEG_HAS(api, join) && api->keyframes && api->join) {
      if (!(r->seg_file = strdup(file))) {
        dlclose(lib);
        return spn_error_set(err, SPN_ENOMEM, "pipeline runner: out of memory");
      }
      r->seg = api;
      r->seg_lib = lib;
    } else {
      dlclose(lib);
    }
  }
  return SPN_OK;
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
  if (rc == SPN_OK)
    rc = seg_lookup(r, rt, err);
  *out = (spn_job_runner_t){.data = r, .run = pr_run, .has_pipeline = pr_has_pipeline, .check = pr_check,
                            .segment_plan = pr_segment_plan};
  if (rc != SPN_OK)
    spn_pipeline_runner_free(out);
  return rc;
}

void spn__pipeline_runner_set_cancel_grace(spn_job_runner_t *runner, double seconds) {
  if (runner && runner->run == pr_run && runner->data)
    ((pipeline_runner_t *)runner->data)->cancel_grace_s = seconds > 0 ? seconds : 0;
}

bool spn__pipeline_runner_wedged(const spn_job_runner_t *runner) {
  return runner && runner->run == pr_run && runner->data && atomic_load(&((pipeline_runner_t *)runner->data)->wedged);
}

/* ---- what operators see (observe.h) ---- */

static const pipeline_runner_t *as_pipeline_runner(const spn_job_runner_t *runner) {
  return runner && runner->run == pr_run ? runner->data : NULL;
}

bool spn__pipeline_runner_names(const spn_job_runner_t *runner, char **filter) {
  const pipeline_runner_t *r = as_pipeline_runner(runner);
  if (!r)
    return false;
  for (size_t i = 0; i < r->n; i++)
    if (!spn__pipeline_filter_add(filter, r->entries[i].name))
      return false;
  return !r->fallback.run || spn__runner_pipelines_add(&r->fallback, filter);
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

static const char *const copy_dir_names[4] = {"host_to_device", "device_to_host", "device_to_device",
                                              "host_to_host"};

/* Bytes copied on each edge by direction (spn_pipeline_edge_stats): what
 * moved between memories. The runtime counts per edge, not per device; the
 * edge's stages say where (their placement is in the pipeline config). */
static void edge_metrics(const pipeline_runner_t *r, spn__mbuf_t *b) {
  spn__mbuf_family(b, "spindle_edge_bytes_copied_total", "counter",
                   "Bytes of tensor items copied on each pipeline edge, by direction.");
  for (size_t i = 0; i < r->n; i++)
    for (size_t k = 0; k < spn_pipeline_edge_count(r->entries[i].pipe); k++) {
      spn_edge_stats_t st;
      if (spn_pipeline_edge_stats(r->entries[i].pipe, k, &st) != SPN_OK)
        continue;
      for (int d = 0; d < 4; d++) {
        spn__mbuf_put(b, "spindle_edge_bytes_copied_total{pipeline=\"");
        spn__mbuf_label(b, r->entries[i].name);
        spn__mbuf_put(b, "\",from=\"");
        spn__mbuf_label(b, st.from_stage ? st.from_stage : "");
        spn__mbuf_put(b, "\",to=\"");
        spn__mbuf_label(b, st.to_stage ? st.to_stage : "");
        spn__mbuf_put(b, "\",direction=\"%s\"} %llu\n", copy_dir_names[d], (unsigned long long)st.bytes[d]);
      }
    }
}

/* What each stage copied itself (host->buffer_copy: a GPU stage's own
 * uploads and downloads), by direction: bytes, and the host time spent
 * issuing them. Its input edges' copies are the edge family's. */
static void stage_copy_metrics(const pipeline_runner_t *r, spn__mbuf_t *b) {
  static const struct {
    const char *name, *help;
    bool seconds; /* else bytes */
  } fam[] = {
      {"spindle_stage_bytes_copied_total",
       "Bytes each stage copied itself (its own uploads, downloads and peer copies), by direction.", false},
      {"spindle_stage_copy_seconds_total",
       "Host time each stage spent issuing the copies it made itself, by direction.", true},
  };
  for (size_t f = 0; f < sizeof fam / sizeof *fam; f++) { /* a family's samples together, as the format wants */
    spn__mbuf_family(b, fam[f].name, "counter", fam[f].help);
    for (size_t i = 0; i < r->n; i++)
      for (size_t k = 0; k < spn_pipeline_stage_count(r->entries[i].pipe); k++) {
        spn_transfer_stats_t st;
        const char *stage = spn_pipeline_stage_transfers(r->entries[i].pipe, k, &st);
        for (int d = 0; stage && d < 4; d++) {
          stage_label(b, fam[f].name, r->entries[i].name, stage);
          if (fam[f].seconds)
            spn__mbuf_put(b, ",direction=\"%s\"} %.9f\n", copy_dir_names[d], (double)st.ns[d] / 1e9);
          else
            spn__mbuf_put(b, ",direction=\"%s\"} %llu\n", copy_dir_names[d], (unsigned long long)st.bytes[d]);
        }
      }
  }
}

/* Stream time (spn_pipeline_stage_stream_time) of every stage: 0 for those
 * on the CPU pool, which use no device stream. */
static void stage_stream_metrics(const pipeline_runner_t *r, spn__mbuf_t *b) {
  spn__mbuf_family(b, "spindle_stage_stream_seconds_total", "counter",
                   "Device time each stage's stream spent on the work its calls queued (0 on the CPU pool).");
  for (size_t i = 0; i < r->n; i++)
    for (size_t k = 0; k < spn_pipeline_stage_count(r->entries[i].pipe); k++) {
      uint64_t ns = 0;
      const char *stage = spn_pipeline_stage_stream_time(r->entries[i].pipe, k, &ns, NULL);
      if (!stage)
        continue;
      stage_label(b, "spindle_stage_stream_seconds_total", r->entries[i].name, stage);
      spn__mbuf_put(b, "} %.9f\n", (double)ns / 1e9);
    }
}

/* The same bytes by the device whose streams copied them (the runtime's
 * devices, and "host" for copies between host memories of stages placed on
 * no device). */
static void device_copy_metrics(const pipeline_runner_t *r, spn__mbuf_t *b) {
  spn__mbuf_family(b, "spindle_device_bytes_copied_total", "counter",
                   "Bytes of tensor items copied on pipeline edges, by the device that copied them and direction.");
  uint32_t n = spn_runtime_device_count(r->rt);
  for (uint32_t i = 0; i <= n; i++) {
    const char *name = i < n ? spn_runtime_device_name(r->rt, i) : "host";
    char dev[64];
    /* "cuda:0 NVIDIA H100 ..." -> "cuda:0" */
    snprintf(dev, sizeof dev, "%s", name ? name : "?");
    dev[strcspn(dev, " ")] = 0;
    for (int d = 0; d < 4; d++) {
      spn__mbuf_put(b, "spindle_device_bytes_copied_total{device=\"");
      spn__mbuf_label(b, dev);
      spn__mbuf_put(b, "\",direction=\"%s\"} %llu\n", copy_dir_names[d],
                    (unsigned long long)spn_runtime_device_bytes_copied(r->rt, i, d));
    }
  }
}

void spn__runner_metrics(const spn_job_runner_t *runner, spn__mbuf_t *b) {
  const pipeline_runner_t *r = as_pipeline_runner(runner);
  if (r && r->rt) {
    device_copy_metrics(r, b);
    spn__mbuf_family(b, "spindle_device_quarantines_total", "counter",
                     "Devices this process's runtime took out of service (lost GPU, fatal XID, repeated faults).");
    spn__mbuf_put(b, "spindle_device_quarantines_total %llu\n",
                  (unsigned long long)spn_runtime_quarantine_count(r->rt));
    spn__mbuf_family(b, "spindle_log_messages_total", "counter",
                     "Log records at warn and error level since start, the runtime's and its stages' "
                     "(a model replaced by a built-in one is a warning), whatever the log level.");
    spn__mbuf_put(b, "spindle_log_messages_total{level=\"warn\"} %llu\n",
                  (unsigned long long)spn_runtime_log_count(r->rt, SPN_LOG_WARN));
    spn__mbuf_put(b, "spindle_log_messages_total{level=\"error\"} %llu\n",
                  (unsigned long long)spn_runtime_log_count(r->rt, SPN_LOG_ERROR));
  }
  if (!r || !r->n)
    return;
  edge_metrics(r, b);
  stage_copy_metrics(r, b);
  stage_stream_metrics(r, b);
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
  /* Wedged: a stage's thread is inside a call for good, and freeing its
   * pipeline would wait for it; everything is left to the process's exit. */
  if (r && atomic_load(&r->wedged)) {
    memset(runner, 0, sizeof *runner);
    return;
  }
  if (r) {
    for (size_t i = 0; i < r->n; i++) {
      spn_pipeline_free(&r->entries[i].pipe);
      free(r->entries[i].name);
    }
    free(r->entries);
    if (r->seg_lib)
      dlclose(r->seg_lib);
    free(r->seg_file);
    free(r);
  }
  memset(runner, 0, sizeof *runner);
}
