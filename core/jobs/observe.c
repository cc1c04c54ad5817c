/* observe.c — the gateway's lifecycle log and Prometheus metrics (observe.h).
 *
 * Invariants:
 * - Loop thread only (the queue's thread): counters need no atomics.
 * - The wrapper changes nothing the queue does: every call goes to the inner
 *   backend with the same arguments, and its result is returned as is; only
 *   successful transitions are logged and counted. It keeps the backend's
 *   name (callers tell SQLite from Redis by it).
 * - NVML is optional: loaded with dlopen at attach ($SPINDLE_NVML_LIBRARY or
 *   libnvidia-ml.so.1); without it the device families are absent.
 */
#include "observe.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "spindle/runtime.h"

static const double dur_bounds[SPN__OBSERVE_DURATION_BUCKETS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800};

/* One histogram series: job duration for a pipeline and outcome. */
typedef struct dur_series {
  char pipeline[64];
  char outcome[16];
  uint64_t bucket[SPN__OBSERVE_DURATION_BUCKETS];
  uint64_t count;
  double sum;
} dur_series_t;

/* A duration histogram family: one series per (pipeline, outcome). */
typedef struct dur_hist {
  dur_series_t *s;
  size_t n;
} dur_hist_t;

/* A running lease: what its end needs to know. */
typedef struct lease {
  int64_t id;
  uint32_t attempt;
  int64_t since_ms;
  char pipeline[64];
  bool segmented;     /* a segmented job's join: its warnings are its segments' */
} lease_t;

/* Jobs of a pipeline that succeeded with warnings. */
typedef struct warned {
  char pipeline[64];
  uint64_t n;
} warned_t;

/* Jobs that succeeded with warnings, by pipeline. */
typedef struct warned_set {
  warned_t *w;
  size_t n;
} warned_set_t;

/* The few NVML entry points used, with the ABI's types. */
typedef struct nvml_util {
  unsigned gpu, memory;
} nvml_util_t;
typedef struct nvml_mem {
  unsigned long long total, free, used;
} nvml_mem_t;
typedef struct nvml {
  void *lib;
  unsigned (*init)(void);
  unsigned (*shutdown)(void);
  unsigned (*count)(unsigned *);
  unsigned (*handle)(unsigned, void **);
  unsigned (*util)(void *, nvml_util_t *);
  unsigned (*mem)(void *, nvml_mem_t *);
  unsigned (*temp)(void *, unsigned, unsigned *);
} nvml_t;

struct spn__observe {
  spn_queue_ops_t ops; /* observed_ops under the inner backend's name */
  spn_queue_t inner;
  spn__logger_t *log;
  char who[32];
  uint64_t events[SPN_QEV_COUNT];
  dur_hist_t dur;
  warned_set_t warned;
  lease_t *leases;
  size_t nleases, caplease;
  nvml_t nvml;
};

/* ---- helpers ---- */

/* The spec's pipeline, and whether it is a segmented job's (its parent,
 * whose run joins the segments). */
static void pipeline_of(const char *spec_json, char *out, size_t cap, bool *segmented) {
  snprintf(out, cap, "%s", "");
  cJSON *j = spec_json ? cJSON_Parse(spec_json) : NULL;
  const cJSON *p = j ? cJSON_GetObjectItemCaseSensitive(j, "pipeline") : NULL;
  if (cJSON_IsString(p))
    snprintf(out, cap, "%s", p->valuestring);
  if (segmented)
    *segmented = cJSON_IsObject(j ? cJSON_GetObjectItemCaseSensitive(j, "segments") : NULL);
  cJSON_Delete(j);
}

static lease_t *lease_find(spn__observe_t *o, int64_t id) {
  for (size_t i = 0; i < o->nleases; i++)
    if (o->leases[i].id == id)
      return &o->leases[i];
  return NULL;
}

static void lease_drop(spn__observe_t *o, int64_t id) {
  lease_t *l = lease_find(o, id);
  if (l)
    *l = o->leases[--o->nleases];
}

static void dur_observe(dur_hist_t *h, const char *pipeline, const char *outcome, double s) {
  dur_series_t *d = NULL;
  for (size_t i = 0; i < h->n && !d; i++)
    if (!strcmp(h->s[i].pipeline, pipeline) && !strcmp(h->s[i].outcome, outcome))
      d = &h->s[i];
  if (!d) {
    dur_series_t *nd = realloc(h->s, (h->n + 1) * sizeof *nd);
    if (!nd)
      return;
    h->s = nd;
    d = &h->s[h->n++];
    memset(d, 0, sizeof *d);
    snprintf(d->pipeline, sizeof d->pipeline, "%s", pipeline);
    snprintf(d->outcome, sizeof d->outcome, "%s", outcome);
  }
  for (int i = 0; i < SPN__OBSERVE_DURATION_BUCKETS; i++)
    if (s <= dur_bounds[i])
      d->bucket[i]++;
  d->count++;
  d->sum += s;
}

/* The family's # lines and every series' buckets, sum and count. */
static void dur_render(spn__mbuf_t *b, const dur_hist_t *h, const char *family, const char *help) {
  spn__mbuf_family(b, family, "histogram", help);
  for (size_t k = 0; k < h->n; k++) {
    const dur_series_t *d = &h->s[k];
    for (int i = 0; i <= SPN__OBSERVE_DURATION_BUCKETS; i++) {
      spn__mbuf_put(b, "%s_bucket{pipeline=\"", family);
      spn__mbuf_label(b, d->pipeline);
      if (i < SPN__OBSERVE_DURATION_BUCKETS)
        spn__mbuf_put(b, "\",outcome=\"%s\",le=\"%g\"} %llu\n", d->outcome, dur_bounds[i],
                      (unsigned long long)d->bucket[i]);
      else
        spn__mbuf_put(b, "\",outcome=\"%s\",le=\"+Inf\"} %llu\n", d->outcome, (unsigned long long)d->count);
    }
    spn__mbuf_put(b, "%s_sum{pipeline=\"", family);
    spn__mbuf_label(b, d->pipeline);
    spn__mbuf_put(b, "\",outcome=\"%s\"} %.6f\n", d->outcome, d->sum);
    spn__mbuf_put(b, "%s_count{pipeline=\"", family);
    spn__mbuf_label(b, d->pipeline);
    spn__mbuf_put(b, "\",outcome=\"%s\"} %llu\n", d->outcome, (unsigned long long)d->count);
  }
}

/* A job succeeded (`warnings`: the stored JSON array, "" when none): its
 * pipeline's series exists from its first success (at 0, so that a rate
 * starts there), and counts the jobs that had warnings. */
static void warned_add(warned_set_t *ws, const char *pipeline, bool warned) {
  warned_t *w = NULL;
  for (size_t i = 0; i < ws->n && !w; i++)
    if (!strcmp(ws->w[i].pipeline, pipeline))
      w = &ws->w[i];
  if (!w) {
    warned_t *nw = realloc(ws->w, (ws->n + 1) * sizeof *nw);
    if (!nw)
      return;
    ws->w = nw;
    w = &ws->w[ws->n++];
    memset(w, 0, sizeof *w);
    snprintf(w->pipeline, sizeof w->pipeline, "%s", pipeline);
  }
  w->n += warned;
}

static void warned_render(spn__mbuf_t *b, const warned_set_t *ws, const char *family, const char *help) {
  spn__mbuf_family(b, family, "counter", help);
  for (size_t i = 0; i < ws->n; i++) {
    spn__mbuf_put(b, "%s{pipeline=\"", family);
    spn__mbuf_label(b, ws->w[i].pipeline);
    spn__mbuf_put(b, "\"} %llu\n", (unsigned long long)ws->w[i].n);
  }
}

/* A job that succeeded, warned or not; a segmented job's join by its
 * segments' warnings (spn__segments_warned). */
static void warned_count(spn__observe_t *o, int64_t id, const char *warnings) {
  const lease_t *l = lease_find(o, id);
  bool warned = spn__warnings_any(warnings) || (l && l->segmented && spn__segments_warned(&o->inner, id));
  warned_add(&o->warned, l ? l->pipeline : "", warned);
}

/* A job's attempt ended (lease gone): log the event, count it, and for the
 * end of a run observe its duration. */
static void attempt_ended(spn__observe_t *o, int64_t id, uint32_t attempt, spn_queue_state_t st, const char *reason,
                          int64_t now) {
  int ev = st == SPN_QSTATE_SUCCEEDED   ? SPN_QEV_SUCCEEDED
           : st == SPN_QSTATE_DEAD      ? SPN_QEV_DEAD
           : st == SPN_QSTATE_CANCELLED ? SPN_QEV_CANCELLED
                                        : SPN_QEV_FAILED;
  bool retry = st == SPN_QSTATE_QUEUED;
  lease_t *l = lease_find(o, id);
  char pipeline[64] = "";
  if (!l && !attempt) {
    /* Not leased through this wrapper (a sweep failed the expired lease of a
     * worker leasing straight from Redis, or a queued job was cancelled):
     * the job's own record names its attempt and pipeline for the line. */
    spn_queue_job_t j;
    if (o->inner.ops->get(o->inner.impl, id, &j, NULL) == SPN_OK) {
      attempt = j.attempts;
      pipeline_of(j.spec_json, pipeline, sizeof pipeline, NULL);
      spn__queue_job_clear(&j);
    }
  }
  spn__log_fields_t f = SPN__LOG_FIELDS_INIT;
  f.job_id = (uint64_t)id;
  f.event = spn__queue_event_name(ev);
  f.attempt = (int32_t)(attempt ? attempt : l ? l->attempt : 0);
  if (pipeline[0])
    f.pipeline = pipeline;
  if (l) {
    f.pipeline = l->pipeline;
    f.duration_ms = now > l->since_ms ? now - l->since_ms : 0;
    dur_observe(&o->dur, l->pipeline, spn__queue_event_name(ev), (double)f.duration_ms / 1000.0);
  }
  o->events[ev]++;
  int32_t level = ev == SPN_QEV_SUCCEEDED || ev == SPN_QEV_CANCELLED ? SPN_LOG_INFO
                  : retry                                            ? SPN_LOG_WARN
                                                                     : SPN_LOG_ERROR;
  spn__log_f(o->log, level, &f, "job %s%s%s%s", spn__queue_event_name(ev), retry ? " (will retry)" : "",
             reason && *reason ? ": " : "", reason ? reason : "");
  lease_drop(o, id);
}

static void nvml_unload(nvml_t *n);

/* ---- the wrapped queue ---- */

static int32_t w_begin(void *q, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->begin(o->inner.impl, err);
}

static int32_t w_commit(void *q, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->commit(o->inner.impl, err);
}

static int32_t w_submit(void *q, const spn_queue_submit_t *s, int64_t now, int64_t *id, bool *existed,
                        spn_error_t *err) {
  spn__observe_t *o = q;
  int32_t rc = o->inner.ops->submit(o->inner.impl, s, now, id, existed, err);
  if (rc >= 0 && !*existed) {
    char pipeline[64];
    pipeline_of(s->spec_json, pipeline, sizeof pipeline, NULL);
    spn__log_fields_t f = SPN__LOG_FIELDS_INIT;
    f.job_id = (uint64_t)*id;
    f.event = spn__queue_event_name(SPN_QEV_SUBMITTED);
    f.pipeline = pipeline;
    spn__log_f(o->log, SPN_LOG_INFO, &f, "job submitted (priority %d)", (int)s->priority);
    o->events[SPN_QEV_SUBMITTED]++;
  }
  return rc;
}

static int32_t w_lease(void *q, const char *owner, const char *pipelines, int64_t now, int64_t lease_ms,
                       spn_queue_job_t *out, spn_error_t *err) {
  spn__observe_t *o = q;
  int32_t rc = o->inner.ops->lease(o->inner.impl, owner, pipelines, now, lease_ms, out, err);
  if (rc < 0)
    return rc;
  lease_t *l = lease_find(o, out->id);
  if (!l && o->nleases == o->caplease) {
    size_t cap = o->caplease ? 2 * o->caplease : 16;
    lease_t *nl = realloc(o->leases, cap * sizeof *nl);
    if (nl) {
      o->leases = nl;
      o->caplease = cap;
    }
  }
  if (!l && o->nleases < o->caplease)
    l = &o->leases[o->nleases++];
  char pipeline[64];
  bool segmented = false;
  pipeline_of(out->spec_json, pipeline, sizeof pipeline, &segmented);
  if (l) {
    l->id = out->id;
    l->attempt = out->attempts;
    l->since_ms = now;
    l->segmented = segmented;
    snprintf(l->pipeline, sizeof l->pipeline, "%s", pipeline);
  }
  spn__log_fields_t f = SPN__LOG_FIELDS_INIT;
  f.job_id = (uint64_t)out->id;
  f.event = spn__queue_event_name(SPN_QEV_LEASED);
  f.pipeline = pipeline;
  f.worker = owner;
  f.attempt = (int32_t)out->attempts;
  if (out->created_ms > 0 && now >= out->created_ms)
    f.duration_ms = now - out->created_ms; /* time since submit */
  spn__log_f(o->log, SPN_LOG_INFO, &f, "job leased");
  o->events[SPN_QEV_LEASED]++;
  return rc;
}

static int32_t w_renew(void *q, int64_t id, uint32_t attempt, const char *owner, int64_t now, int64_t lease_ms,
                       spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->renew(o->inner.impl, id, attempt, owner, now, lease_ms, err);
}

static int32_t w_progress(void *q, int64_t id, uint64_t done, uint64_t total, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->progress(o->inner.impl, id, done, total, err);
}

static int32_t w_complete(void *q, int64_t id, uint32_t attempt, const char *owner, double compute_s, double gpu_s,
                          const spn_job_xfer_t *xfer, const char *warnings, int64_t now, spn_error_t *err) {
  spn__observe_t *o = q;
  int32_t rc = o->inner.ops->complete(o->inner.impl, id, attempt, owner, compute_s, gpu_s, xfer, warnings, now, err);
  if (rc >= 0) {
    warned_count(o, id, warnings);
    attempt_ended(o, id, attempt, SPN_QSTATE_SUCCEEDED, NULL, now);
  }
  return rc;
}

static int32_t w_fail(void *q, int64_t id, uint32_t attempt, const char *owner, const char *reason, spn_fail_how_t how,
                      double compute_s, double gpu_s, const spn_job_xfer_t *xfer, int64_t now,
                      spn_queue_state_t *state, spn_error_t *err) {
  spn__observe_t *o = q;
  int32_t rc = o->inner.ops->fail(o->inner.impl, id, attempt, owner, reason, how, compute_s, gpu_s, xfer, now,
                                  state, err);
  if (rc >= 0)
    attempt_ended(o, id, attempt, *state, reason, now);
  return rc;
}

static int32_t w_cancel(void *q, int64_t id, int64_t now, spn_queue_state_t *state, spn_error_t *err) {
  spn__observe_t *o = q;
  int32_t rc = o->inner.ops->cancel(o->inner.impl, id, now, state, err);
  if (rc >= 0 && *state == SPN_QSTATE_CANCELLED)
    attempt_ended(o, id, 0, SPN_QSTATE_CANCELLED, "cancelled while queued", now);
  return rc;
}

/* Sweeps and lost workers move jobs in bulk; the inner callback tells which. */
typedef struct relay {
  spn__observe_t *o;
  spn_queue_changed_cb cb;
  void *user;
  const char *why;
  int64_t now;
} relay_t;

static void relay_changed(void *user, int64_t id, spn_queue_state_t st) {
  relay_t *r = user;
  /* A succeeded job from a sweep is not a move: it succeeded earlier, where
   * it was counted (a Redis worker completes in Redis, and its count is the
   * queue's), and is handed over only for its publication marker. */
  if (st != SPN_QSTATE_RUNNING && st != SPN_QSTATE_SUCCEEDED)
    attempt_ended(r->o, id, 0, st, r->why, r->now);
  if (r->cb)
    r->cb(r->user, id, st);
}

static int32_t w_sweep(void *q, int64_t now, spn_queue_changed_cb cb, void *user, spn_error_t *err) {
  spn__observe_t *o = q;
  relay_t r = {o, cb, user, "lease expired or deadline passed", now};
  return o->inner.ops->sweep(o->inner.impl, now, relay_changed, &r, err);
}

static int32_t w_release(void *q, int64_t id, uint32_t attempt, const char *owner, const char *note, int64_t now,
                         spn_error_t *err) {
  spn__observe_t *o = q;
  int32_t rc = o->inner.ops->release(o->inner.impl, id, attempt, owner, note, now, err);
  if (rc >= 0) {
    spn__log_fields_t f = SPN__LOG_FIELDS_INIT;
    f.job_id = (uint64_t)id;
    f.event = spn__queue_event_name(SPN_QEV_RELEASED);
    f.attempt = (int32_t)attempt;
    spn__log_f(o->log, SPN_LOG_INFO, &f, "job released: %s", note ? note : "");
    o->events[SPN_QEV_RELEASED]++;
    lease_drop(o, id);
  }
  return rc;
}

static int32_t w_release_owner(void *q, const char *owner, const char *reason, int64_t now, spn_queue_changed_cb cb,
                               void *user, spn_error_t *err) {
  spn__observe_t *o = q;
  relay_t r = {o, cb, user, reason, now};
  return o->inner.ops->release_owner(o->inner.impl, owner, reason, now, relay_changed, &r, err);
}

static int32_t w_get(void *q, int64_t id, spn_queue_job_t *out, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->get(o->inner.impl, id, out, err);
}

static int32_t w_list(void *q, int32_t state, uint32_t limit, spn_queue_list_cb cb, void *user, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->list(o->inner.impl, state, limit, cb, user, err);
}

static int32_t w_children(void *q, int64_t parent, spn_queue_list_cb cb, void *user, spn_error_t *err) {
  spn__observe_t *o = q;
  if (!o->inner.ops->children)
    return spn_error_set(err, SPN_EUNSUPPORTED, "job queue %s: no segments", o->inner.ops->name);
  return o->inner.ops->children(o->inner.impl, parent, cb, user, err);
}

static int32_t w_counts(void *q, int64_t out[SPN_QSTATE_COUNT], spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->counts(o->inner.impl, out, err);
}

static int32_t w_unpublished(void *q, int64_t id, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->unpublished(o->inner.impl, id, err);
}

/* Only in the ops when the inner backend has it (spn__observe_attach). */
static int32_t w_events(void *q, uint64_t out[SPN_QEV_COUNT], spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->events(o->inner.impl, out, err);
}

static int32_t w_present(void *q, const char *pipelines, int64_t now, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->present(o->inner.impl, pipelines, now, err);
}

static int32_t w_seen(void *q, const char *pipeline, int64_t *at, spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->seen(o->inner.impl, pipeline, at, err);
}

static int32_t w_purge(void *q, int64_t before, uint32_t limit, uint32_t *removed, spn_error_t *err) {
  spn__observe_t *o = q;
  *removed = 0;
  int32_t rc = o->inner.ops->purge ? o->inner.ops->purge(o->inner.impl, before, limit, removed, err) : SPN_OK;
  o->events[SPN_QEV_DELETED] += *removed;
  return rc;
}

static int32_t w_roster_put(void *q, size_t n, const char *const *names, const char *const *records,
                            spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->roster_put(o->inner.impl, n, names, records, err);
}

static int32_t w_roster_get(void *q, const char *name, void (*cb)(void *user, const char *name, const char *record), void *user,
                            spn_error_t *err) {
  spn__observe_t *o = q;
  return o->inner.ops->roster_get(o->inner.impl, name, cb, user, err);
}

static void w_free(void *q) {
  spn__observe_t *o = q;
  spn_queue_free(&o->inner);
  nvml_unload(&o->nvml);
  spn__logger_free(&o->log);
  free(o->dur.s);
  free(o->warned.w);
  free(o->leases);
  free(o);
}

static const spn_queue_ops_t observed_ops = {
    .name = NULL, /* the inner backend's: callers compare it */
    .begin = w_begin,
    .commit = w_commit,
    .submit = w_submit,
    .purge = w_purge,
    .lease = w_lease,
    .renew = w_renew,
    .progress = w_progress,
    .complete = w_complete,
    .fail = w_fail,
    .cancel = w_cancel,
    .sweep = w_sweep,
    .release = w_release,
    .release_owner = w_release_owner,
    .unpublished = w_unpublished,
    .get = w_get,
    .list = w_list,
    .children = w_children,
    .counts = w_counts,
    .events = w_events,
    .present = w_present,
    .seen = w_seen,
    .roster_put = w_roster_put,
    .roster_get = w_roster_get,
    .free = w_free,
};

static void nvml_unload(nvml_t *n) {
  if (n->lib) {
    if (n->shutdown)
      n->shutdown();
    dlclose(n->lib);
  }
  memset(n, 0, sizeof *n);
}

static void nvml_load(nvml_t *n) {
  const char *path = getenv("SPINDLE_NVML_LIBRARY");
  n->lib = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib)
    return;
  *(void **)&n->init = dlsym(n->lib, "nvmlInit_v2");
  *(void **)&n->shutdown = dlsym(n->lib, "nvmlShutdown");
  *(void **)&n->count = dlsym(n->lib, "nvmlDeviceGetCount_v2");
  *(void **)&n->handle = dlsym(n->lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&n->util = dlsym(n->lib, "nvmlDeviceGetUtilizationRates");
  *(void **)&n->mem = dlsym(n->lib, "nvmlDeviceGetMemoryInfo");
  *(void **)&n->temp = dlsym(n->lib, "nvmlDeviceGetTemperature");
  if (!n->init || !n->count || !n->handle || n->init() != 0) {
    dlclose(n->lib);
    memset(n, 0, sizeof *n);
  }
}

int32_t spn__observe_attach(spn_queue_t *q, const char *who, spn__observe_t **out, spn_error_t *err) {
  spn__observe_t *o = calloc(1, sizeof *o);
  if (!o)
    return spn_error_set(err, SPN_ENOMEM, "server: out of memory");
  if (spn__logger_new(SPN_LOG_INFO, SPN_LOG_FORMAT_AUTO, -1, &o->log) != SPN_OK) {
    free(o);
    return spn_error_set(err, SPN_ENOMEM, "server: out of memory");
  }
  snprintf(o->who, sizeof o->who, "%s", who ? who : "spindle");
  nvml_load(&o->nvml);
  o->inner = *q;
  o->ops = observed_ops;
  o->ops.name = q->ops->name;
  if (!q->ops->children)
    o->ops.children = NULL; /* the gateway refuses segmented jobs then */
  if (!q->ops->events)
    o->ops.events = NULL;
  if (!q->ops->unpublished)
    o->ops.unpublished = NULL; /* callers remove markers after commit then */
  if (!q->ops->roster_put || !q->ops->roster_get) {
    o->ops.roster_put = NULL;
    o->ops.roster_get = NULL;
  }
  q->ops = &o->ops;
  q->impl = o;
  *out = o;
  return SPN_OK;
}

spn__logger_t *spn__observe_logger(spn__observe_t *o) { return o ? o->log : NULL; }

/* ---- rendering ---- */

void spn__mbuf_put(spn__mbuf_t *b, const char *fmt, ...) {
  if (b->oom)
    return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = true;
      return;
    }
    if ((size_t)k < b->cap - b->n) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap + (size_t)k + 1) * 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

/* A label value with \, " and newline escaped (the text format's rule). */
void spn__mbuf_label(spn__mbuf_t *b, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      spn__mbuf_put(b, "\\%c", *v);
    else if (*v == '\n')
      spn__mbuf_put(b, "\\n");
    else
      spn__mbuf_put(b, "%c", *v);
  }
}

void spn__mbuf_family(spn__mbuf_t *b, const char *name, const char *type, const char *help) {
  spn__mbuf_put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Queue depth: queued jobs grouped by (pipeline, priority). */
typedef struct depth {
  char pipeline[129];
  int32_t priority;
  uint64_t n;
} depth_t;
typedef struct depth_acc {
  depth_t *d;
  size_t n;
  bool oom;
} depth_acc_t;

static void depth_add(void *user, const spn_queue_job_t *j) {
  depth_acc_t *a = user;
  char pipeline[129];
  pipeline_of(j->spec_json, pipeline, sizeof pipeline, NULL);
  for (size_t i = 0; i < a->n; i++)
    if (a->d[i].priority == j->priority && !strcmp(a->d[i].pipeline, pipeline)) {
      a->d[i].n++;
      return;
    }
  depth_t *nd = realloc(a->d, (a->n + 1) * sizeof *nd);
  if (!nd) {
    a->oom = true;
    return;
  }
  a->d = nd;
  memset(&a->d[a->n], 0, sizeof a->d[a->n]);
  snprintf(a->d[a->n].pipeline, sizeof a->d[a->n].pipeline, "%s", pipeline);
  a->d[a->n].priority = j->priority;
  a->d[a->n].n = 1;
  a->n++;
}

static void render_nvml(nvml_t *n, spn__mbuf_t *b) {
  unsigned count = 0;
  if (!n->lib || n->count(&count) != 0 || count == 0)
    return;
  if (count > 64)
    count = 64;
  void *h[64] = {0};
  for (unsigned i = 0; i < count; i++)
    if (n->handle(i, &h[i]) != 0)
      h[i] = NULL;
  if (n->util) {
    spn__mbuf_family(b, "spindle_device_utilization_ratio", "gauge", "GPU busy fraction over NVML's last sample period (0..1).");
    for (unsigned i = 0; i < count; i++) {
      nvml_util_t u;
      if (h[i] && n->util(h[i], &u) == 0)
        spn__mbuf_put(b, "spindle_device_utilization_ratio{device=\"cuda:%u\"} %.2f\n", i, u.gpu / 100.0);
    }
  }
  if (n->mem) {
    nvml_mem_t m[64];
    bool ok[64] = {false};
    for (unsigned i = 0; i < count; i++)
      ok[i] = h[i] && n->mem(h[i], &m[i]) == 0;
    spn__mbuf_family(b, "spindle_device_memory_used_bytes", "gauge", "GPU memory in use (all processes), from NVML.");
    for (unsigned i = 0; i < count; i++)
      if (ok[i])
        spn__mbuf_put(b, "spindle_device_memory_used_bytes{device=\"cuda:%u\"} %llu\n", i, m[i].used);
    spn__mbuf_family(b, "spindle_device_memory_total_bytes", "gauge", "GPU memory size, from NVML.");
    for (unsigned i = 0; i < count; i++)
      if (ok[i])
        spn__mbuf_put(b, "spindle_device_memory_total_bytes{device=\"cuda:%u\"} %llu\n", i, m[i].total);
  }
  if (n->temp) {
    spn__mbuf_family(b, "spindle_device_temperature_celsius", "gauge", "GPU core temperature, from NVML.");
    for (unsigned i = 0; i < count; i++) {
      unsigned t;
      if (h[i] && n->temp(h[i], 0 /* NVML_TEMPERATURE_GPU */, &t) == 0)
        spn__mbuf_put(b, "spindle_device_temperature_celsius{device=\"cuda:%u\"} %u\n", i, t);
    }
  }
}

/* The runner's families and the usable device count. */
static void render_runner(spn__mbuf_t *b, const spn_job_runner_t *runner, bool gateway) {
  int64_t usable = spn__runner_usable_devices(runner);
  if (usable >= 0) {
    spn__mbuf_family(b, "spindle_devices_usable", "gauge",
                     "Devices of this process's runtime that can take work (a GPU found lost is not).");
    spn__mbuf_put(b, "spindle_devices_usable %lld\n", (long long)usable);
  }
  (void)gateway;
  spn__runner_metrics(runner, b);
}

/* The queue's workers by kind and state: on a shared queue from its roster
 * (roster.c), whichever gateway they lease through; else this gateway's. A
 * gateway's own slots count once, as one worker of kind local. */
typedef struct {
  int64_t now;
  uint64_t n[3][3]; /* kind (local, remote, queue) x state (live, draining, gone) */
} roster_count_t;

static void roster_count(void *user, const char *name, const char *record) {
  roster_count_t *c = user;
  (void)name;
  cJSON *r = cJSON_Parse(record);
  int st = spn__roster_state(r, c->now); /* SPN_ROSTER_LIVE, _DRAINING, _GONE: the columns of n */
  const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "kind"));
  int k = !kind ? -1 : !strcmp(kind, "local") ? 0 : !strcmp(kind, "remote") ? 1 : !strcmp(kind, "queue") ? 2 : -1;
  if (k >= 0 && st != SPN_ROSTER_DUE)
    c->n[k][st]++;
  cJSON_Delete(r);
}

static bool roster_render(spn__observe_t *o, const spn__observe_workers_t *w, spn__mbuf_t *b, spn_error_t *err) {
  roster_count_t c = {.now = spn__now_ms()};
  if (o->inner.ops->roster_get && o->inner.ops->roster_get(o->inner.impl, NULL, roster_count, &c, err) < 0)
    return false;
  if (!o->inner.ops->roster_get) { /* this gateway's workers are the queue's */
    c.n[0][w->draining ? 1 : 0] = w->local > 0;
    c.n[1][0] = w->remote - w->remote_draining;
    c.n[1][1] = w->remote_draining;
    c.n[1][2] = w->remote_gone;
  }
  static const char *const kinds[] = {"local", "remote", "queue"}, *const states[] = {"live", "draining", "gone"};
  spn__mbuf_family(b, "spindle_queue_workers", "gauge",
                   "Workers of the queue by kind (a gateway's own slots, remote, stateless) and state; "
                   "gone: stopped without draining (kept 10 min).");
  for (int k = 0; k < 3; k++)
    for (int st = 0; st < 3; st++)
      spn__mbuf_put(b, "spindle_queue_workers{kind=\"%s\",state=\"%s\"} %llu\n", kinds[k], states[st],
                    (unsigned long long)c.n[k][st]);
  return true;
}

char *spn__observe_render(spn__observe_t *o, const spn__observe_workers_t *w, const spn_job_runner_t *runner,
                          spn_error_t *err) {
  int64_t cnt[SPN_QSTATE_COUNT];
  if (o->inner.ops->counts(o->inner.impl, cnt, err) < 0)
    return NULL;
  depth_acc_t acc = {0};
  if (o->inner.ops->list(o->inner.impl, SPN_QSTATE_QUEUED, SPN__OBSERVE_DEPTH_MAX, depth_add, &acc, err) < 0) {
    free(acc.d);
    return NULL;
  }
  spn__mbuf_t b = {0};
  spn__mbuf_family(&b, "spindle_jobs", "gauge", "Jobs in the queue by state.");
  for (int i = 0; i < SPN_QSTATE_COUNT; i++)
    spn__mbuf_put(&b, "spindle_jobs{state=\"%s\"} %lld\n", spn_queue_state_name((spn_queue_state_t)i), (long long)cnt[i]);
  spn__mbuf_family(&b, "spindle_queue_depth", "gauge", "Queued jobs by pipeline and priority (the autoscaling signal).");
  for (size_t i = 0; i < acc.n; i++) {
    spn__mbuf_put(&b, "spindle_queue_depth{pipeline=\"");
    spn__mbuf_label(&b, acc.d[i].pipeline);
    spn__mbuf_put(&b, "\",priority=\"%d\"} %llu\n", (int)acc.d[i].priority, (unsigned long long)acc.d[i].n);
  }
  /* The same jobs, of the pipelines that no worker has run for
   * SPN_PRESENCE_STALE_MS (their status's "waiting"): alert on it staying. */
  spn__mbuf_family(&b, "spindle_queue_unserved", "gauge",
                   "Queued jobs of pipelines that no worker has run lately, by pipeline (a worker's config lacks it, or none has started).");
  int64_t now = spn__now_ms();
  for (size_t i = 0; i < acc.n; i++) {
    bool first = true; /* one sample per pipeline, at its first (pipeline, priority) */
    for (size_t k = 0; k < i && first; k++)
      first = strcmp(acc.d[k].pipeline, acc.d[i].pipeline) != 0;
    uint64_t n = 0;
    for (size_t k = i; first && k < acc.n; k++)
      n += strcmp(acc.d[k].pipeline, acc.d[i].pipeline) ? 0 : acc.d[k].n;
    if (!first || !spn__queue_unserved(&o->inner, acc.d[i].pipeline, now, NULL))
      continue;
    spn__mbuf_put(&b, "spindle_queue_unserved{pipeline=\"");
    spn__mbuf_label(&b, acc.d[i].pipeline);
    spn__mbuf_put(&b, "\"} %llu\n", (unsigned long long)n);
  }
  free(acc.d);
  spn__mbuf_family(&b, "spindle_job_events_total", "counter", "Job lifecycle transitions since the gateway started, by event.");
  for (int i = 0; i < SPN_QEV_COUNT; i++)
    spn__mbuf_put(&b, "spindle_job_events_total{event=\"%s\"} %llu\n", spn__queue_event_name(i),
                  (unsigned long long)o->events[i]);
  /* The queue's count: a shared queue's own (every gateway of it serves the
   * same), else this gateway's, which made every move. */
  uint64_t qev[SPN_QEV_COUNT];
  if (o->inner.ops->events) {
    if (o->inner.ops->events(o->inner.impl, qev, err) < 0) {
      free(b.p);
      return NULL;
    }
  } else {
    memcpy(qev, o->events, sizeof qev);
  }
  spn__mbuf_family(&b, "spindle_queue_events_total", "counter",
                   "Job lifecycle transitions in the queue, whichever gateway or worker made them, by event.");
  for (int i = 0; i < SPN_QEV_COUNT; i++)
    spn__mbuf_put(&b, "spindle_queue_events_total{event=\"%s\"} %llu\n", spn__queue_event_name(i),
                  (unsigned long long)qev[i]);
  warned_render(&b, &o->warned, "spindle_jobs_warned_total",
                "Jobs that succeeded with warnings (damaged input accepted, a codec or model replaced), by pipeline.");
  dur_render(&b, &o->dur, "spindle_job_duration_seconds",
             "Time from lease to the end of an attempt, by pipeline and outcome.");
  spn__mbuf_family(&b, "spindle_workers", "gauge", "Workers by kind: in-process slots, and remote workers sending heartbeats.");
  spn__mbuf_put(&b, "spindle_workers{kind=\"local\"} %u\nspindle_workers{kind=\"remote\"} %zu\n", w->local, w->remote);
  if (!roster_render(o, w, &b, err)) {
    free(b.p);
    return NULL;
  }
  render_nvml(&o->nvml, &b);
  render_runner(&b, runner, true);
  if (b.oom || !b.p) {
    free(b.p);
    spn_error_set(err, SPN_ENOMEM, "metrics: out of memory");
    return NULL;
  }
  return b.p;
}

/* ---- readiness ---- */

bool spn__observe_devices_ready(const spn_job_runner_t *runner, char *why, size_t cap) {
  /* Today: the runtime's usable device count (GPUs the health monitor has
   * not marked unusable). A runner without a runtime needs no device. */
  int64_t usable = spn__runner_usable_devices(runner);
  if (usable == 0) {
    snprintf(why, cap, "no usable device");
    return false;
  }
  return true;
}

/* ---- the worker's metrics and probes ---- */

enum { WO_SUCCEEDED, WO_FAILED, WO_CANCELLED, WO_COUNT };
static const char *const wo_names[WO_COUNT] = {"succeeded", "failed", "cancelled"};

struct spn__wobs {
  pthread_mutex_t mu;
  const spn_job_runner_t *runner;
  uint32_t slots;
  int64_t busy;
  bool draining;
  int gateway; /* -1 none (stateless), 0 not answering, 1 answering */
  bool queue_wait; /* a stateless worker's queue has not answered since start-up */
  char wedged[SPN_ERROR_MSG_MAX]; /* spn__wobs_wedged: why; "" when not */
  uint64_t jobs[WO_COUNT];
  warned_set_t warned; /* succeeded with warnings, by pipeline */
  dur_hist_t dur;       /* lease to end of each job this worker ran */
  nvml_t nvml; /* under mu: NVML calls from the HTTP thread only */
  spn__http_t *http;
};

static void wobs_answer(void *user, const char *path, spn__http_reply_t *out) {
  spn__wobs_t *o = user;
  if (!strcmp(path, "/healthz") || !strcmp(path, "/readyz")) {
    char body[SPN_ERROR_MSG_MAX + 16] = "";
    pthread_mutex_lock(&o->mu);
    if (o->wedged[0])
      snprintf(body, sizeof body, "wedged: %s\n", o->wedged);
    pthread_mutex_unlock(&o->mu);
    if (body[0]) {
      out->code = 503;
      out->body = strdup(body);
      return;
    }
  }
  if (!strcmp(path, "/healthz")) {
    out->code = 200;
    out->body = strdup("ok\n");
    return;
  }
  if (!strcmp(path, "/readyz")) {
    char why[128] = "";
    pthread_mutex_lock(&o->mu);
    bool draining = o->draining, gateway_down = o->gateway == 0, queue_wait = o->queue_wait;
    pthread_mutex_unlock(&o->mu);
    bool ready = !draining && spn__observe_devices_ready(o->runner, why, sizeof why);
    if (ready && (gateway_down || queue_wait)) {
      ready = false;
      snprintf(why, sizeof why, "%s", gateway_down ? "no answer from the gateway" : "waiting for the job queue");
    }
    out->code = ready ? 200 : 503;
    char body[160];
    snprintf(body, sizeof body, "%s\n", ready ? "ready" : draining ? "stopping" : why);
    out->body = strdup(body);
    return;
  }
  if (strcmp(path, "/metrics") != 0) {
    out->code = 404;
    out->body = strdup("not found\n");
    return;
  }
  spn__mbuf_t b = {0};
  pthread_mutex_lock(&o->mu);
  spn__mbuf_family(&b, "spindle_worker_jobs_total", "counter", "Jobs this worker finished, by outcome.");
  for (int i = 0; i < WO_COUNT; i++)
    spn__mbuf_put(&b, "spindle_worker_jobs_total{outcome=\"%s\"} %llu\n", wo_names[i],
                  (unsigned long long)o->jobs[i]);
  warned_render(&b, &o->warned, "spindle_worker_jobs_warned_total",
                "Jobs this worker finished that succeeded with warnings, by pipeline.");
  dur_render(&b, &o->dur, "spindle_worker_job_duration_seconds",
             "Time from lease to the end of each job this worker ran, by pipeline and outcome.");
  spn__mbuf_family(&b, "spindle_worker_slots", "gauge", "Job slots of this worker, busy or idle.");
  int64_t busy = o->busy < 0 ? 0 : o->busy > o->slots ? o->slots : o->busy;
  spn__mbuf_put(&b, "spindle_worker_slots{state=\"busy\"} %lld\nspindle_worker_slots{state=\"idle\"} %lld\n",
                (long long)busy, (long long)o->slots - busy);
  if (o->gateway >= 0) {
    spn__mbuf_family(&b, "spindle_worker_gateway_up", "gauge",
                     "1 while this worker's gateway answers its heartbeats, 0 before it first did and after 5 "
                     "heartbeats (at least 5 s) without an answer.");
    spn__mbuf_put(&b, "spindle_worker_gateway_up %d\n", o->gateway);
  }
  render_nvml(&o->nvml, &b);
  pthread_mutex_unlock(&o->mu);
  render_runner(&b, o->runner, false);
  if (b.oom || !b.p) {
    free(b.p);
    out->code = 500;
    out->body = strdup("metrics: out of memory\n");
    return;
  }
  out->code = 200;
  out->ctype = "text/plain; version=0.0.4";
  out->body = b.p;
}

int32_t spn__wobs_new(const spn_job_runner_t *runner, uint32_t slots, const char *http, spn__wobs_t **out,
                      spn_error_t *err) {
  *out = NULL;
  spn__wobs_t *o = calloc(1, sizeof *o);
  if (!o)
    return spn_error_set(err, SPN_ENOMEM, "worker: out of memory");
  pthread_mutex_init(&o->mu, NULL);
  o->runner = runner;
  o->slots = slots;
  o->gateway = -1;
  nvml_load(&o->nvml);
  if (http) {
    int32_t rc = spn__http_open(http, wobs_answer, o, NULL, NULL, &o->http, err);
    if (rc < 0) {
      spn__wobs_free(&o);
      return rc;
    }
  }
  *out = o;
  return SPN_OK;
}

void spn__wobs_job_end(spn__wobs_t *o, const char *pipeline, double seconds, int32_t status, bool warned) {
  if (!o)
    return;
  int outcome = status == SPN_OK ? WO_SUCCEEDED : status == SPN_ECANCELLED ? WO_CANCELLED : WO_FAILED;
  pthread_mutex_lock(&o->mu);
  o->jobs[outcome]++;
  if (status == SPN_OK)
    warned_add(&o->warned, pipeline ? pipeline : "", warned);
  dur_observe(&o->dur, pipeline ? pipeline : "", wo_names[outcome], seconds < 0 ? 0 : seconds);
  pthread_mutex_unlock(&o->mu);
}

void spn__wobs_busy(spn__wobs_t *o, int delta) {
  if (!o)
    return;
  pthread_mutex_lock(&o->mu);
  o->busy += delta;
  pthread_mutex_unlock(&o->mu);
}

void spn__wobs_wedged(spn__wobs_t *o, const char *why) {
  if (!o)
    return;
  pthread_mutex_lock(&o->mu);
  snprintf(o->wedged, sizeof o->wedged, "%s", why && *why ? why : "a run did not stop");
  pthread_mutex_unlock(&o->mu);
}

void spn__wobs_draining(spn__wobs_t *o) {
  if (!o)
    return;
  pthread_mutex_lock(&o->mu);
  o->draining = true;
  pthread_mutex_unlock(&o->mu);
}

void spn__wobs_gateway(spn__wobs_t *o, bool up) {
  if (!o)
    return;
  pthread_mutex_lock(&o->mu);
  o->gateway = up ? 1 : 0;
  pthread_mutex_unlock(&o->mu);
}

void spn__wobs_queue_wait(spn__wobs_t *o, bool waiting) {
  if (!o)
    return;
  pthread_mutex_lock(&o->mu);
  o->queue_wait = waiting;
  pthread_mutex_unlock(&o->mu);
}

void spn__wobs_free(spn__wobs_t **po) {
  spn__wobs_t *o = *po;
  if (!o)
    return;
  spn__http_close(&o->http);
  nvml_unload(&o->nvml);
  pthread_mutex_destroy(&o->mu);
  free(o->dur.s);
  free(o->warned.w);
  free(o);
  *po = NULL;
}
