/* gateway.c — the gateway's client side: requests (SUBMIT, STATUS, WATCH,
 * CANCEL, LIST, HELLO), the outbox that holds replies until the batch they
 * acknowledge is durable, and watchers.
 *
 * Invariants:
 * - Group commit: the writes of one batch (every message received in one
 *   pass, up to SPN_GW_BATCH_MAX) share one queue transaction; replies and
 *   job hand-outs wait in the outbox and are sent only after the commit, so
 *   a client never hears "accepted" for a job that is not durable.
 * - Every request is validated here, before it reaches the queue: a bad
 *   request gets an ERROR naming the field and changes nothing.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <zmq.h>

#include "files-internal.h"
#include "server-internal.h"

/* ---- outbox ---- */

void spn__out_push(spn_server_t *s, const unsigned char *ident, size_t ilen, const char *type,
                     cJSON *body, bool needs_commit) {
  spn_outmsg_t *m = calloc(1, sizeof *m);
  if (!m) {
    cJSON_Delete(body);
    return;
  }
  memcpy(m->ident, ident, ilen);
  m->ident_len = ilen;
  snprintf(m->type, sizeof m->type, "%s", type);
  m->body = body;
  m->needs_commit = needs_commit;
  int64_t req = 0;
  if (spn__json_int(body, "req", &req))
    m->req = req;
  *s->out_tail = m;
  s->out_tail = &m->next;
}

void spn__out_error(spn_server_t *s, const unsigned char *ident, size_t ilen, int64_t req,
                      const char *code, const char *msg) {
  cJSON *b = cJSON_CreateObject();
  if (!b)
    return;
  if (req)
    cJSON_AddNumberToObject(b, "req", (double)req);
  cJSON_AddStringToObject(b, "code", code);
  cJSON_AddStringToObject(b, "message", msg);
  spn__out_push(s, ident, ilen, "ERROR", b, false);
}

static void out_flush(spn_server_t *s, bool committed) {
  spn_outmsg_t *m = s->out;
  s->out = NULL;
  s->out_tail = &s->out;
  while (m) {
    spn_outmsg_t *next = m->next;
    if (committed || !m->needs_commit)
      spn__proto_send(s->router, m->ident, m->ident_len, m->type, m->body);
    else
      spn__proto_send_error(s->router, m->ident, m->ident_len, m->req, "internal",
                            "the job queue could not commit; nothing was stored");
    cJSON_Delete(m->body);
    free(m);
    m = next;
  }
}

static void queue_log_v(spn_server_t *s, int32_t level, bool waiting, const char *fmt, va_list ap) {
  char line[SPN_ERROR_MSG_MAX + 64];
  vsnprintf(line, sizeof line, fmt, ap);
  double mono = spn__mono_s();
  if (!s->queue_failing)
    s->queue_failing = mono;
  /* Waiting for the queue at start-up: the one line that says so stands
   * for the errors of every call. */
  if (!s->queue_answered && !waiting)
    return;
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (const char *c = line; *c; c++)
    h = (h ^ (unsigned char)*c) * 1099511628211ULL;
  size_t oldest = 0;
  for (size_t i = 0; i < sizeof s->qlog / sizeof *s->qlog; i++) {
    if (s->qlog[i].hash == h && s->qlog[i].at && mono - s->qlog[i].at < SPN_QUEUE_LOG_S)
      return;
    if (s->qlog[i].at < s->qlog[oldest].at)
      oldest = i;
  }
  s->qlog[oldest].hash = h;
  s->qlog[oldest].at = mono;
  spn__log_f(spn__observe_logger(s->obs), level, NULL, "%s", line);
}

void spn__queue_log(spn_server_t *s, int32_t level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  queue_log_v(s, level, false, fmt, ap);
  va_end(ap);
}

void spn__queue_log_now(spn_server_t *s, int32_t level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  queue_log_v(s, level, true, fmt, ap);
  va_end(ap);
}

void spn__batch_begin(spn_server_t *s) {
  if (s->in_batch)
    return;
  /* Log lines of the batch are written after its replies (spn__batch_end):
   * a client does not wait for them. */
  spn__log_hold(spn__observe_logger(s->obs));
  spn_error_t err = SPN_ERROR_INIT;
  if (s->q.ops->begin(s->q.impl, &err) < 0)
    spn__queue_log(s, SPN_LOG_ERROR, "%s", err.msg);
  else
    s->in_batch = true;
}

void spn__batch_end(spn_server_t *s) {
  bool ok = true;
  if (s->in_batch) {
    spn_error_t err = SPN_ERROR_INIT;
    s->in_batch = false;
    if (s->q.ops->commit(s->q.impl, &err) < 0) {
      spn__queue_log(s, SPN_LOG_ERROR, "%s", err.msg);
      ok = false;
    }
  }
  spn__sched_committed(s, ok);
  out_flush(s, ok);
  spn__log_release(spn__observe_logger(s->obs));
}

void spn__out_discard(spn_server_t *s) {
  spn_outmsg_t *m = s->out;
  while (m) {
    spn_outmsg_t *n = m->next;
    cJSON_Delete(m->body);
    free(m);
    m = n;
  }
  s->out = NULL;
  s->out_tail = &s->out;
}

static void watcher_add(spn_server_t *s, const spn_queue_job_t *j, const unsigned char *ident,
                        size_t ilen, const char *pipeline, bool waiting) {
  int64_t id = j->id;
  for (size_t i = 0; i < s->nwatchers; i++)
    if (s->watchers[i].id == id && s->watchers[i].ident_len == ilen &&
        !memcmp(s->watchers[i].ident, ident, ilen))
      return;
  if (s->nwatchers == s->capwatch) {
    size_t cap = s->capwatch ? s->capwatch * 2 : 16;
    spn_watcher_t *nv = realloc(s->watchers, cap * sizeof *nv);
    if (!nv)
      return;
    s->watchers = nv;
    s->capwatch = cap;
  }
  spn_watcher_t *w = &s->watchers[s->nwatchers++];
  w->id = id;
  w->state = (int32_t)j->state;
  w->attempts = j->attempts;
  w->done = j->progress_done;
  w->waiting = waiting;
  snprintf(w->pipeline, sizeof w->pipeline, "%s", pipeline && strlen(pipeline) < sizeof w->pipeline ? pipeline : "");
  memcpy(w->ident, ident, ilen);
  w->ident_len = ilen;
}

/* ---- job descriptions ---- */

typedef struct seg_ctx {
  spn_server_t *s;
  cJSON *arr;
  uint64_t done, total;
  spn_job_xfer_t xfer; /* the segments' transfers, added up */
  cJSON *warns;        /* the segments' warnings, "segment N: ..." */
} seg_ctx_t;

/* A stored warnings array (NULL: none) parsed, or NULL when empty. */
static cJSON *warnings_of(const spn_queue_job_t *j) {
  cJSON *w = j->warnings_json ? cJSON_Parse(j->warnings_json) : NULL;
  if (!cJSON_IsArray(w) || !cJSON_GetArraySize(w)) {
    cJSON_Delete(w);
    return NULL;
  }
  return w;
}

static void seg_cb(void *user, const spn_queue_job_t *c) {
  seg_ctx_t *sc = user;
  cJSON *o = cJSON_CreateObject();
  if (!o)
    return;
  uint64_t done = c->progress_done, total = c->progress_total;
  spn_run_t *r = c->state == SPN_QSTATE_RUNNING ? spn__run_find(sc->s, c->id) : NULL;
  if (r) {
    done = r->done;
    total = r->total;
  }
  sc->done += done;
  sc->total += total;
  spn__xfer_add_to(&sc->xfer, &c->xfer);
  cJSON_AddNumberToObject(o, "index", c->seg_index);
  cJSON_AddNumberToObject(o, "id", (double)c->id);
  cJSON_AddStringToObject(o, "state", spn_queue_state_name(c->state));
  cJSON_AddNumberToObject(o, "attempts", c->attempts);
  cJSON_AddNumberToObject(o, "done", (double)done);
  cJSON_AddNumberToObject(o, "total", (double)total);
  cJSON *spec = cJSON_Parse(c->spec_json);
  const cJSON *info = spec ? cJSON_GetObjectItemCaseSensitive(spec, "segment") : NULL;
  const char *a = spn__json_str(info, "start"), *b = spn__json_str(info, "end");
  if (a && b) {
    cJSON_AddNumberToObject(o, "start", strtod(a, NULL));
    cJSON_AddNumberToObject(o, "end", strtod(b, NULL));
  }
  cJSON_Delete(spec);
  cJSON *w = warnings_of(c);
  if (w) {
    const cJSON *it;
    cJSON_ArrayForEach(it, w) if (cJSON_IsString(it) && sc->warns) {
      char line[SPN_JOB_WARNINGS_MAX + 32];
      snprintf(line, sizeof line, "segment %d: %s", c->seg_index, it->valuestring);
      cJSON_AddItemToArray(sc->warns, cJSON_CreateString(line));
    }
    cJSON_AddItemToObject(o, "warnings", w);
  }
  if (c->lease_owner)
    cJSON_AddStringToObject(o, "worker", c->lease_owner);
  if (c->reason)
    cJSON_AddStringToObject(o, "reason", c->reason);
  /* every attempt's worker: who ran it, so a test (or an operator) sees
   * which segments ran twice and where */
  cJSON *errs = cJSON_Parse(c->errors_json);
  if (errs && cJSON_GetArraySize(errs) > 0)
    cJSON_AddItemToObject(o, "errors", errs);
  else
    cJSON_Delete(errs);
  cJSON_AddItemToArray(sc->arr, o);
}

/* A queued job whose pipeline no worker has been said to run lately (ops.present):
 * true with the reason in why. With scale to zero this is normal for a
 * while; it stays for good when no worker's config has the pipeline. */
static bool no_worker(spn_server_t *s, const char *pipeline, char *why, size_t n) {
  int64_t at = 0, now = spn__now_ms();
  if (!spn__queue_unserved(&s->q, pipeline, now, &at))
    return false;
  char ago[40] = "";
  if (at > 0)
    spn__say_duration((double)(now - at) / 1000.0, ago, sizeof ago);
  snprintf(why, n, "no worker that runs pipeline \"%s\" has been seen%s%s; the job stays queued until one asks for work",
           pipeline, at > 0 ? " for " : "", ago);
  return true;
}

static cJSON *job_json(spn_server_t *s, const spn_queue_job_t *j, bool full) {
  cJSON *o = cJSON_CreateObject();
  if (!o)
    return NULL;
  cJSON_AddNumberToObject(o, "id", (double)j->id);
  cJSON_AddStringToObject(o, "state", spn_queue_state_name(j->state));
  cJSON *spec = cJSON_Parse(j->spec_json);
  const char *p = spec ? spn__json_str(spec, "pipeline") : NULL;
  cJSON_AddStringToObject(o, "pipeline", p ? p : "");
  cJSON_AddNumberToObject(o, "priority", j->priority);
  cJSON_AddNumberToObject(o, "attempts", j->attempts);
  cJSON_AddNumberToObject(o, "max_attempts", j->max_attempts);
  uint64_t done = j->progress_done, total = j->progress_total;
  spn_run_t *r = j->state == SPN_QSTATE_RUNNING ? spn__run_find(s, j->id) : NULL;
  if (r) {
    done = r->done;
    total = r->total;
  }
  if (j->parent) {
    cJSON *sg = cJSON_AddObjectToObject(o, "segment_of");
    if (sg) {
      cJSON_AddNumberToObject(sg, "id", (double)j->parent);
      cJSON_AddNumberToObject(sg, "index", j->seg_index);
    }
  }
  /* A segmented job: its progress is its segments' added up, and each is
   * listed with its state and attempts. */
  cJSON *segs = NULL, *seg_warns = NULL;
  spn_job_xfer_t xfer = j->xfer;
  if (spec && cJSON_GetObjectItemCaseSensitive(spec, "segments") && s->q.ops->children) {
    seg_ctx_t sc = {.s = s, .arr = cJSON_CreateArray(), .warns = cJSON_CreateArray()};
    if (sc.arr && s->q.ops->children(s->q.impl, j->id, seg_cb, &sc, NULL) == SPN_OK) {
      done = sc.done;
      total = sc.total;
      spn__xfer_add_to(&xfer, &sc.xfer); /* the join's and every segment's */
      segs = sc.arr;
      seg_warns = sc.warns;
    } else {
      cJSON_Delete(sc.arr);
      cJSON_Delete(sc.warns);
    }
  }
  cJSON_AddNumberToObject(o, "done", (double)done);
  cJSON_AddNumberToObject(o, "total", (double)total);
  cJSON_AddNumberToObject(o, "compute_s", j->compute_s);
  cJSON_AddNumberToObject(o, "gpu_s", j->gpu_s);
  /* What was copied for it, every attempt; per output frame once the
   * frames are known (host<->device and device<->device: what crosses PCIe). */
  cJSON *xf = spn__xfer_to_json(o, "transfers", &xfer);
  if (xf && done > 0) {
    uint64_t b = xfer.bytes[0] + xfer.bytes[1] + xfer.bytes[2];
    cJSON_AddNumberToObject(xf, "bytes_per_frame", (double)b / (double)done);
  }
  cJSON_AddNumberToObject(o, "created", (double)j->created_ms);
  if (segs) {
    cJSON_AddNumberToObject(o, "segments_pending", j->pending);
    cJSON_AddItemToObject(o, "segments", segs);
  }
  if (j->reason)
    cJSON_AddStringToObject(o, "reason", j->reason);
  /* What the succeeded attempt warned of (a model replaced by a built-in
   * one, damaged input accepted): the job's own, then its segments'. */
  cJSON *warns = warnings_of(j);
  if (seg_warns && cJSON_GetArraySize(seg_warns)) {
    if (!warns)
      warns = cJSON_CreateArray();
    cJSON *it;
    while (warns && (it = cJSON_DetachItemFromArray(seg_warns, 0)))
      cJSON_AddItemToArray(warns, it);
  }
  cJSON_Delete(seg_warns);
  if (warns)
    cJSON_AddItemToObject(o, "warnings", warns);
  if (j->lease_owner)
    cJSON_AddStringToObject(o, "worker", j->lease_owner);
  /* in every status and event of a queued job: a watcher sees it come and go */
  char why[320];
  if (j->state == SPN_QSTATE_QUEUED && p && *p && no_worker(s, p, why, sizeof why))
    cJSON_AddStringToObject(o, "waiting", why);
  if (full) {
    if (j->idem_key)
      cJSON_AddStringToObject(o, "idempotency_key", j->idem_key);
    if (j->deadline_ms)
      cJSON_AddNumberToObject(o, "deadline", (double)j->deadline_ms);
    cJSON *times = cJSON_AddObjectToObject(o, "times");
    for (int i = 0; times && i < SPN_QSTATE_COUNT; i++)
      if (j->t_state_ms[i])
        cJSON_AddNumberToObject(times, spn_queue_state_name((spn_queue_state_t)i), (double)j->t_state_ms[i]);
    cJSON *errs = cJSON_Parse(j->errors_json);
    if (errs)
      cJSON_AddItemToObject(o, "errors", errs);
    if (spec) {
      cJSON_AddItemToObject(o, "spec", spec);
      spec = NULL;
    }
  }
  cJSON_Delete(spec);
  return o;
}

/* Tell every watcher of `id` where it is; terminal states end the watch. */
void spn__notify(spn_server_t *s, int64_t id) {
  bool any = false;
  for (size_t i = 0; i < s->nwatchers; i++)
    if (s->watchers[i].id == id)
      any = true;
  if (!any)
    return;
  spn_queue_job_t j;
  if (s->q.ops->get(s->q.impl, id, &j, NULL) < 0)
    return;
  bool term = spn_queue_state_terminal(j.state);
  for (size_t i = 0; i < s->nwatchers;) {
    if (s->watchers[i].id != id) {
      i++;
      continue;
    }
    cJSON *b = job_json(s, &j, term);
    s->watchers[i].waiting = cJSON_GetObjectItemCaseSensitive(b, "waiting") != NULL;
    if (b)
      spn__out_push(s, s->watchers[i].ident, s->watchers[i].ident_len, "EVENT", b, false);
    s->watchers[i].state = (int32_t)j.state;
    s->watchers[i].attempts = j.attempts;
    s->watchers[i].done = j.progress_done;
    if (term)
      s->watchers[i] = s->watchers[--s->nwatchers];
    else
      i++;
  }
  spn__queue_job_clear(&j);
}

void spn__gateway_poll_watchers(spn_server_t *s) {
  if (!s->nwatchers)
    return;
  int64_t *ids = malloc(s->nwatchers * sizeof *ids);
  size_t n = 0;
  if (!ids)
    return;
  for (size_t i = 0; i < s->nwatchers; i++) {
    bool seen = false;
    for (size_t k = 0; k < n && !seen; k++)
      seen = ids[k] == s->watchers[i].id;
    if (!seen && !spn__run_find(s, s->watchers[i].id)) /* runs here: told as it happens */
      ids[n++] = s->watchers[i].id;
  }
  for (size_t k = 0; k < n; k++) {
    spn_queue_job_t j;
    if (s->q.ops->get(s->q.impl, ids[k], &j, NULL) < 0)
      continue;
    bool changed = false;
    for (size_t i = 0; i < s->nwatchers; i++)
      if (s->watchers[i].id == ids[k] &&
          (s->watchers[i].state != (int32_t)j.state || s->watchers[i].attempts != j.attempts ||
           s->watchers[i].done != j.progress_done))
        changed = true;
    spn__queue_job_clear(&j);
    if (changed)
      spn__notify(s, ids[k]);
  }
  free(ids);
}

void spn__gateway_watch_waiting(spn_server_t *s, int64_t now) {
  if (!s->nwatchers)
    return;
  int64_t *ids = malloc(s->nwatchers * sizeof *ids);
  size_t n = 0;
  for (size_t i = 0; ids && i < s->nwatchers; i++) {
    const spn_watcher_t *w = &s->watchers[i];
    if (w->state != SPN_QSTATE_QUEUED || !w->pipeline[0])
      continue;
    bool unserved = spn__queue_unserved(&s->q, w->pipeline, now, NULL), listed = false;
    for (size_t k = 0; k < n && !listed; k++)
      listed = ids[k] == w->id;
    if (unserved != w->waiting && !listed)
      ids[n++] = w->id;
  }
  /* the job's event, with its "waiting" as it is now (spn__notify reads the job again) */
  for (size_t k = 0; k < n; k++)
    spn__notify(s, ids[k]);
  free(ids);
}

void spn__notify_progress(spn_server_t *s, spn_run_t *r) {
  for (size_t i = 0; i < s->nwatchers; i++) {
    if (s->watchers[i].id != r->id)
      continue;
    cJSON *b = cJSON_CreateObject();
    if (!b)
      return;
    cJSON_AddNumberToObject(b, "id", (double)r->id);
    cJSON_AddStringToObject(b, "state", "running");
    cJSON_AddNumberToObject(b, "attempts", r->attempt);
    cJSON_AddNumberToObject(b, "done", (double)r->done);
    cJSON_AddNumberToObject(b, "total", (double)r->total);
    spn__out_push(s, s->watchers[i].ident, s->watchers[i].ident_len, "EVENT", b, false);
  }
}

/* ---- requests ---- */

/* A JSON object may hold one key twice; a job's names may not (which one
 * counts would be the parser's choice). */
static bool twice(const cJSON *obj, const cJSON *item) {
  for (const cJSON *k = obj->child; k && k != item; k = k->next)
    if (k->string && !strcmp(k->string, item->string))
      return true;
  return false;
}

static int32_t validate_io(spn_server_t *s, const cJSON *body, const char *key, bool input,
                           cJSON *dst, spn_error_t *err) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(body, key);
  cJSON *out = cJSON_AddObjectToObject(dst, key);
  if (!out)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  if (!o)
    return SPN_OK; /* a pipeline may take no files (generators, "noop") */
  if (!cJSON_IsObject(o) || cJSON_GetArraySize(o) > 64)
    return spn_error_set(err, SPN_EINVAL, "SUBMIT: \"%s\" must be an object of at most 64 name: path",
                         key);
  const cJSON *it;
  cJSON_ArrayForEach(it, o) {
    if (!cJSON_IsString(it) || !it->string[0] || strlen(it->string) > 64)
      return spn_error_set(err, SPN_EINVAL, "SUBMIT: %s.%s: expected a name of 1-64 bytes and a string path",
                           key, it->string);
    if (twice(o, it))
      return spn_error_set(err, SPN_EINVAL, "SUBMIT: %s.%s is given twice", key, it->string);
    char *real = NULL;
    int32_t rc = input ? spn__confine_input(&s->cfg->input_roots, it->valuestring, &real, err)
                       : spn__confine_output(&s->cfg->output_roots, it->valuestring, &real, err);
    if (rc < 0)
      return rc;
    cJSON_AddStringToObject(out, it->string, real);
    free(real);
  }
  return SPN_OK;
}

/* The resolved inputs and outputs of a SUBMIT name different files: an output
 * renamed over an input would replace the file a retry reads, and of two
 * outputs on one path the last renamed would silently win. Paths are already
 * resolved (links, ".."); existing files are also compared by inode (hard
 * links). */
static int32_t distinct_files(const cJSON *spec, spn_error_t *err) {
  const cJSON *ins = cJSON_GetObjectItemCaseSensitive(spec, "inputs");
  const cJSON *outs = cJSON_GetObjectItemCaseSensitive(spec, "outputs");
  const cJSON *o, *i;
  cJSON_ArrayForEach(o, outs) {
    cJSON_ArrayForEach(i, ins) {
      if (spn__same_file(o->valuestring, i->valuestring))
        return spn_error_set(err, SPN_EINVAL,
                             "SUBMIT: outputs.%s is the file of inputs.%s (%s): a job never writes over its own "
                             "input; give the output another path",
                             o->string, i->string, i->valuestring);
    }
    for (i = outs->child; i && i != o; i = i->next)
      if (spn__same_file(o->valuestring, i->valuestring))
        return spn_error_set(err, SPN_EINVAL, "SUBMIT: outputs.%s and outputs.%s are one file (%s): give each output "
                             "its own path", i->string, o->string, o->valuestring);
  }
  return SPN_OK;
}

/* The refusal of a SUBMIT whose file clashes with that of a job still queued
 * or running (the queue's submit finds it, in the write that would store
 * the job): an output that is another job's would be written twice, the
 * last to finish winning without a word; an output that is another job's
 * input would replace what that job reads (its retry would read this job's
 * file); an input that is another job's output would be read before or
 * while that job writes it (a stale file from an earlier render, or a
 * half-replaced one). */
static int32_t clash_error(const cJSON *spec, const spn_queue_clash_t *c, spn_error_t *err) {
  const char *list = c->kind == SPN_CLASH_INPUT ? "inputs" : "outputs";
  const char *field = "?";
  const cJSON *f;
  cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(spec, list)) {
    if (cJSON_IsString(f) && !strcmp(f->valuestring, c->path)) {
      field = f->string;
      break;
    }
  }
  long long id = (long long)c->job;
  const char *state = spn_queue_state_name(c->state);
  switch (c->kind) {
  case SPN_CLASH_OUTPUT:
    if (c->stopping)
      return spn_error_set(err, SPN_EINVAL,
                           "SUBMIT: outputs.%s (%s) is the output of job %lld, which is being cancelled but still "
                           "runs: two jobs would write one file; submit again once it has stopped (spindle watch "
                           "%lld), or give this job another path",
                           field, c->path, id, id);
    return spn_error_set(err, SPN_EINVAL,
                         "SUBMIT: outputs.%s (%s) is the output of job %lld, which is %s: two jobs would write one "
                         "file and the last to finish would win; give this job another path, or cancel job %lld "
                         "first",
                         field, c->path, id, state, id);
  case SPN_CLASH_READ:
    return spn_error_set(err, SPN_EINVAL,
                         "SUBMIT: outputs.%s (%s) is an input of job %lld, which is %s: this job would replace the "
                         "file job %lld reads; give this job another path, or submit it once job %lld has ended",
                         field, c->path, id, state, id, id);
  default:
    return spn_error_set(err, SPN_EINVAL,
                         "SUBMIT: inputs.%s (%s) is the output of job %lld, which is %s: this job would read the "
                         "file before or while job %lld writes it; submit it once job %lld has ended",
                         field, c->path, id, c->stopping ? "being cancelled" : state, id, id);
  }
}

static const char *code_for(int32_t rc) {
  switch (rc) {
  case SPN_EPERM: return "forbidden_path";
  case SPN_ENOENT: return "not_found";
  case SPN_EUNSUPPORTED: return "unknown_pipeline";
  case SPN_ESTATE: return "bad_state";
  case SPN_EIO: case SPN_ENOMEM: case SPN_EINTERNAL: return "internal";
  default: return "invalid";
  }
}


/* ---- segments (docs/jobs.md, "Segments") ---- */

/* "segments" / "segment_seconds" of a SUBMIT: both absent is fine (*n and
 * *sec stay 0); anything else is checked here, naming the field. */
static int32_t segment_request(spn_server_t *s, const cJSON *b, bool has_deadline, uint32_t *n, double *sec,
                               spn_error_t *err) {
  const cJSON *sn = cJSON_GetObjectItemCaseSensitive(b, "segments");
  const cJSON *ss = cJSON_GetObjectItemCaseSensitive(b, "segment_seconds");
  if (!sn && !ss)
    return SPN_OK;
  const char *field = sn ? "segments" : "segment_seconds";
  if (sn && ss)
    return spn_error_set(err, SPN_EINVAL, "SUBMIT: give \"segments\" or \"segment_seconds\", not both");
  if (sn && (!cJSON_IsNumber(sn) || sn->valuedouble != floor(sn->valuedouble) || sn->valuedouble < 1 ||
             sn->valuedouble > SPN_SEGMENTS_MAX))
    return spn_error_set(err, SPN_EINVAL, "SUBMIT: \"segments\" must be an integer in [1, %d]",
                         SPN_SEGMENTS_MAX);
  if (ss && (!cJSON_IsNumber(ss) || !(ss->valuedouble > 0) || ss->valuedouble > 1e7))
    return spn_error_set(err, SPN_EINVAL, "SUBMIT: \"segment_seconds\" must be a number of seconds > 0");
  if (has_deadline)
    return spn_error_set(err, SPN_EINVAL, "SUBMIT: \"%s\" cannot be combined with \"deadline\"", field);
  if (!s->q.ops->children)
    return spn_error_set(err, SPN_EUNSUPPORTED, "SUBMIT: \"%s\": the %s job queue cannot split jobs",
                         field, s->q.ops->name);
  if (!s->runner->segment_plan)
    return spn_error_set(err, SPN_EUNSUPPORTED, "SUBMIT: \"%s\": this gateway's runner cannot split jobs", field);
  if (sn)
    *n = (uint32_t)sn->valuedouble;
  else
    *sec = ss->valuedouble;
  return SPN_OK;
}

static int32_t segment_plan(spn_server_t *s, const cJSON *spec, uint32_t n, double sec, spn_segment_plan_t *plan,
                            spn_error_t *err) {
  spn_job_spec_t js;
  int32_t rc = spn__job_spec_from_json(spec, 0, 1, &js, err);
  if (rc < 0)
    return rc;
  rc = s->runner->segment_plan(s->runner->data, &js, n, sec, plan, err);
  spn__job_spec_free(&js);
  if (rc < 0) {
    spn_error_prefix(err, "SUBMIT");
    return rc == SPN_ENOMEM || rc == SPN_EUNSUPPORTED ? rc : SPN_EINVAL;
  }
  return SPN_OK;
}

/* The parent's spec gets the plan: the output the segments join into and
 * the cut times, as decimal strings so a segment's decode and the join put
 * each cut on the same audio sample. */
static int32_t segment_annotate(cJSON *spec, const spn_segment_plan_t *plan, spn_error_t *err) {
  cJSON *sg = cJSON_AddObjectToObject(spec, "segments");
  cJSON *bounds = sg ? cJSON_AddArrayToObject(sg, "bounds") : NULL;
  if (!bounds || !cJSON_AddStringToObject(sg, "output", plan->output) ||
      !cJSON_AddStringToObject(sg, "input", plan->input) ||
      !cJSON_AddStringToObject(sg, "audio", plan->audio[0] ? plan->audio : plan->input) ||
      !cJSON_AddBoolToObject(sg, "audio_cut", plan->audio_cut) ||
      !cJSON_AddStringToObject(sg, "start_key", plan->start_key) ||
      !cJSON_AddStringToObject(sg, "duration_key", plan->duration_key))
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  char tb[64];
  for (uint32_t k = 0; k <= plan->count; k++) {
    snprintf(tb, sizeof tb, "%.9f", plan->bounds[k]);
    cJSON_AddItemToArray(bounds, cJSON_CreateString(tb));
  }
  return SPN_OK;
}

/* The parent is in the queue (id) waiting for its segments: add them in
 * the same transaction. Segment k is the job with output plan->output
 * redirected to its segment file and the cut's start and duration as
 * params (the last runs to the end of the input). */
static int32_t segment_submit(spn_server_t *s, const cJSON *spec, int64_t id, const spn_queue_submit_t *psub,
                              spn_error_t *err) {
  const cJSON *sg = cJSON_GetObjectItemCaseSensitive(spec, "segments");
  const cJSON *bounds = cJSON_GetObjectItemCaseSensitive(sg, "bounds");
  const char *output = spn__json_str(sg, "output");
  const char *final = spn__json_str(cJSON_GetObjectItemCaseSensitive(spec, "outputs"), output ? output : "");
  int n = cJSON_GetArraySize(bounds) - 1;
  if (!final || n < 1)
    return spn_error_set(err, SPN_EINTERNAL, "segments: the plan lost its output");
  spn_job_spec_t js;
  int32_t rc = spn__job_spec_from_json(spec, id, 1, &js, err);
  if (rc < 0)
    return rc;
  for (int k = 0; rc == SPN_OK && k < n; k++) {
    cJSON *child = cJSON_Duplicate(spec, 1);
    char *jsn = NULL;
    if (child) {
      cJSON_DeleteItemFromObjectCaseSensitive(child, "segments");
      cJSON *co = cJSON_GetObjectItemCaseSensitive(child, "outputs");
      cJSON *cp = cJSON_GetObjectItemCaseSensitive(child, "params");
      if (!cp)
        cp = cJSON_AddObjectToObject(child, "params");
      const char *lo_s = cJSON_GetArrayItem(bounds, k)->valuestring;
      const char *hi_s = cJSON_GetArrayItem(bounds, k + 1)->valuestring;
      char tb[64];
      cJSON_ReplaceItemInObjectCaseSensitive(co, output, cJSON_CreateString(js.segment_files[k]));
      cJSON_AddStringToObject(cp, spn__json_str(sg, "start_key"), lo_s);
      if (k + 1 < n) {
        snprintf(tb, sizeof tb, "%.9f", strtod(hi_s, NULL) - strtod(lo_s, NULL));
        cJSON_AddStringToObject(cp, spn__json_str(sg, "duration_key"), tb);
      }
      cJSON *info = cJSON_AddObjectToObject(child, "segment");
      cJSON_AddNumberToObject(info, "of", (double)id);
      cJSON_AddNumberToObject(info, "index", k);
      cJSON_AddStringToObject(info, "start", lo_s);
      cJSON_AddStringToObject(info, "end", hi_s);
      jsn = cJSON_PrintUnformatted(child);
    }
    if (!jsn) {
      rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    } else {
      spn_queue_submit_t sub = {.spec_json = jsn, .priority = psub->priority, .max_attempts = psub->max_attempts,
                                .parent = id, .seg_index = k};
      int64_t cid = 0;
      bool ex = false;
      rc = s->q.ops->submit(s->q.impl, &sub, spn__now_ms(), &cid, &ex, err);
    }
    free(jsn);
    cJSON_Delete(child);
  }
  spn__job_spec_free(&js);
  return rc;
}

/* A checked SUBMIT on its way into the queue (segmented ones go through the
 * thread pool for their plan first). */
typedef struct submit {
  uv_work_t work;
  spn_server_t *s;
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
  int64_t req;
  cJSON *spec;
  char *key;
  int64_t prio, deadline, max_att;
  uint32_t nseg;
  double seg_s;
  spn_segment_plan_t plan;
  int32_t plan_rc;
  spn_error_t plan_err;
} submit_t;

static void submit_free(submit_t *sub) {
  cJSON_Delete(sub->spec);
  free(sub->key);
  spn_segment_plan_free(&sub->plan);
}

/* Stores the job (and its segments) in the current batch and queues the
 * reply; on a pool thread's error (*plan_err) replies with that instead. */
static void submit_finish(submit_t *sub, const spn_error_t *plan_err) {
  spn_server_t *s = sub->s;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = SPN_OK;
  char *spec_js = NULL;
  if (plan_err) {
    rc = sub->plan_rc;
    err = *plan_err;
    goto out;
  }
  if (sub->plan.count && (rc = segment_annotate(sub->spec, &sub->plan, &err)) < 0)
    goto out;
  spec_js = cJSON_PrintUnformatted(sub->spec);
  if (!spec_js) {
    rc = spn_error_set(&err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  /* The files are checked against the jobs queued or running by the
   * queue, in the write that stores this one; a repeat of a request whose
   * idempotency key names a job is that job, unchecked (it was when it
   * came first). */
  spn_queue_clash_t clash;
  spn_queue_submit_t qs = {.spec_json = spec_js, .priority = (int32_t)sub->prio, .idem_key = sub->key,
                           .deadline_ms = sub->deadline, .max_attempts = (uint32_t)sub->max_att,
                           .pending = sub->plan.count, .clash = &clash};
  int64_t id = 0;
  bool existed = false;
  spn__batch_begin(s);
  rc = s->q.ops->submit(s->q.impl, &qs, spn__now_ms(), &id, &existed, &err);
  if (rc == SPN_EBUSY)
    rc = clash_error(sub->spec, &clash, &err);
  if (rc == SPN_OK && sub->plan.count && !existed)
    rc = segment_submit(s, sub->spec, id, &qs, &err);
  if (rc < 0)
    goto out;
  cJSON *r = cJSON_CreateObject();
  if (r) {
    if (sub->req)
      cJSON_AddNumberToObject(r, "req", (double)sub->req);
    cJSON_AddNumberToObject(r, "id", (double)id);
    cJSON_AddBoolToObject(r, "existed", existed);
    spn__out_push(s, sub->ident, sub->ident_len, "SUBMITTED", r, true);
  }
out:
  if (rc < 0)
    spn__out_error(s, sub->ident, sub->ident_len, sub->req, code_for(rc), err.msg);
  free(spec_js);
  submit_free(sub);
}

/* Thread: a pool thread. Reads only the runner (whose segment_plan may be
 * called from any thread) and its own submit_t. */
static void plan_work(uv_work_t *w) {
  submit_t *sub = w->data;
  spn_error_t err = SPN_ERROR_INIT;
  sub->plan_rc = segment_plan(sub->s, sub->spec, sub->nseg, sub->seg_s, &sub->plan, &err);
  sub->plan_err = err;
}

/* Thread: the loop's. Runs its own batch: the reply goes out after its
 * commit, like every other. */
static void plan_done(uv_work_t *w, int status) {
  submit_t *sub = w->data;
  spn_server_t *s = sub->s;
  s->nplanning--;
  if (status == UV_ECANCELED) {
    sub->plan_rc = spn_error_set(&sub->plan_err, SPN_EIO, "SUBMIT: the gateway stopped before planning the segments; "
                                                         "nothing was stored");
  }
  spn__batch_begin(s);
  submit_finish(sub, sub->plan_rc < 0 ? &sub->plan_err : NULL);
  spn__batch_end(s);
  free(sub);
}

static void on_submit(spn_server_t *s, spn_pmsg_t *m) {
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = SPN_OK;
  cJSON *spec = cJSON_CreateObject();
  const cJSON *b = m->body;
  const char *pipeline = spn__json_str(b, "pipeline");
  int64_t prio = 0, deadline = 0, max_att = s->cfg->max_attempts;
  const char *key = NULL;
  if (!spec) {
    rc = spn_error_set(&err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  if (!pipeline || !*pipeline || strlen(pipeline) > 128) {
    rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"pipeline\" must be a string of 1-128 bytes");
    goto out;
  }
  if (!s->runner->has_pipeline(s->runner->data, pipeline)) {
    /* with what it does run: a typo is then plain to see */
    char names[512];
    spn__pipeline_filter_describe(s->pipelines, names, sizeof names);
    rc = spn_error_set(&err, SPN_EUNSUPPORTED, "SUBMIT: unknown pipeline \"%s\" (this gateway takes: %s)", pipeline,
                       s->pipelines ? names : "see its config");
    goto out;
  }
  cJSON_AddStringToObject(spec, "pipeline", pipeline);
  if ((rc = validate_io(s, b, "inputs", true, spec, &err)) < 0 ||
      (rc = validate_io(s, b, "outputs", false, spec, &err)) < 0 || (rc = distinct_files(spec, &err)) < 0)
    goto out;
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(b, "params");
  if (params) {
    if (!cJSON_IsObject(params) || cJSON_GetArraySize(params) > 256) {
      rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"params\" must be an object of at most 256 keys");
      goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, params) if (twice(params, it)) {
      rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: params.%s is given twice", it->string);
      goto out;
    }
    cJSON_ArrayForEach(it, params) if (!cJSON_IsString(it) && !cJSON_IsNumber(it) && !cJSON_IsBool(it)) {
      rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: params.%s must be a string, number or boolean",
                         it->string);
      goto out;
    }
    cJSON_AddItemToObject(spec, "params", cJSON_Duplicate(params, 1));
  }
  if (cJSON_GetObjectItemCaseSensitive(b, "priority") &&
      (!spn__json_int(b, "priority", &prio) || prio > (int64_t)s->cfg->max_priority ||
       prio < -(int64_t)s->cfg->max_priority)) {
    rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"priority\" must be an integer in [-%u, %u]",
                       s->cfg->max_priority, s->cfg->max_priority);
    goto out;
  }
  if (cJSON_GetObjectItemCaseSensitive(b, "max_attempts") &&
      (!spn__json_int(b, "max_attempts", &max_att) || max_att < 1 || max_att > 100)) {
    rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"max_attempts\" must be an integer in [1, 100]");
    goto out;
  }
  const cJSON *dl = cJSON_GetObjectItemCaseSensitive(b, "deadline");
  if (dl) {
    if (!cJSON_IsNumber(dl) || dl->valuedouble <= 0 || dl->valuedouble > 365.0 * 86400) {
      rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"deadline\" must be seconds from now in (0, 1 year]");
      goto out;
    }
    deadline = spn__now_ms() + (int64_t)(dl->valuedouble * 1000.0);
  }
  /* How long one attempt may run: the job's own, else the server's. */
  const cJSON *to = cJSON_GetObjectItemCaseSensitive(b, "timeout");
  double timeout_s = s->cfg->job_timeout_s;
  if (to) {
    if (!cJSON_IsNumber(to) || !(to->valuedouble > 0) || to->valuedouble > SPN_JOB_TIMEOUT_MAX_S) {
      rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"timeout\" must be seconds in (0, %d] (7 days)",
                         SPN_JOB_TIMEOUT_MAX_S);
      goto out;
    }
    timeout_s = to->valuedouble;
  }
  if (timeout_s > 0)
    cJSON_AddNumberToObject(spec, "timeout", timeout_s);
  if (cJSON_GetObjectItemCaseSensitive(b, "idempotency_key")) {
    key = spn__json_str(b, "idempotency_key");
    if (!key || !*key || strlen(key) > 256) {
      rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"idempotency_key\" must be a string of 1-256 bytes");
      goto out;
    }
  }
  /* A runner that can check a job (the pipeline runner: its inputs,
   * outputs and params against the pipeline's per-job keys) refuses a job
   * that could never run now, rather than after max_attempts retries. */
  if (s->runner->check) {
    spn_job_spec_t js;
    if ((rc = spn__job_spec_from_json(spec, 0, 1, &js, &err)) < 0)
      goto out;
    rc = s->runner->check(s->runner->data, &js, &err);
    spn__job_spec_free(&js);
    if (rc < 0) {
      spn_error_prefix(&err, "SUBMIT");
      if (rc != SPN_ENOMEM)
        rc = SPN_EINVAL;
      goto out;
    }
  }
  uint32_t nseg = 0;
  double seg_s = 0;
  if ((rc = segment_request(s, b, deadline != 0, &nseg, &seg_s, &err)) < 0)
    goto out;
  submit_t sub = {.s = s, .ident_len = m->ident_len, .req = m->req, .spec = spec, .prio = prio,
                  .deadline = deadline, .max_att = max_att, .nseg = nseg, .seg_s = seg_s};
  memcpy(sub.ident, m->ident, m->ident_len);
  if (key && !(sub.key = strdup(key))) {
    rc = spn_error_set(&err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  spec = NULL; /* sub owns it */
  if (nseg || seg_s > 0) {
    /* Planning reads the input's packets: on the loop's thread pool, so
     * this loop keeps serving everyone else meanwhile. */
    submit_t *p = malloc(sizeof *p);
    if (p) {
      *p = sub;
      p->work.data = p;
      if (uv_queue_work(&s->loop, &p->work, plan_work, plan_done) == 0) {
        s->nplanning++;
        goto out;
      }
      free(p);
    }
    rc = spn_error_set(&err, SPN_ENOMEM, "out of memory");
    submit_free(&sub);
    goto out;
  }
  submit_finish(&sub, NULL);
out:
  if (rc < 0)
    spn__out_error(s, m->ident, m->ident_len, m->req, code_for(rc), err.msg);
  cJSON_Delete(spec);
}

static bool need_id(spn_server_t *s, spn_pmsg_t *m, int64_t *id) {
  if (spn__json_int(m->body, "id", id) && *id > 0)
    return true;
  spn__out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"id\" must be a positive integer job id");
  return false;
}

static void with_req(cJSON *b, int64_t req) {
  if (b && req)
    cJSON_AddNumberToObject(b, "req", (double)req);
}

/* A job the queue does not have may have ended and been deleted by
 * retention: say so, so that an old id is not taken for a typo. */
static void gone_hint(const spn_server_t *s, int32_t rc, spn_error_t *err) {
  size_t n = strlen(err->msg);
  if (rc == SPN_ENOENT && s->cfg->keep_ended_s && n < sizeof err->msg)
    snprintf(err->msg + n, sizeof err->msg - n, " (or no longer: an ended job is deleted %u s after it ended, "
             "queue.keep_ended_s)", s->cfg->keep_ended_s);
}

static void on_status(spn_server_t *s, spn_pmsg_t *m, bool watch) {
  int64_t id;
  if (!need_id(s, m, &id))
    return;
  spn_queue_job_t j;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = s->q.ops->get(s->q.impl, id, &j, &err);
  if (rc < 0) {
    gone_hint(s, rc, &err);
    spn__out_error(s, m->ident, m->ident_len, m->req, code_for(rc), err.msg);
    return;
  }
  cJSON *b = job_json(s, &j, true);
  with_req(b, m->req);
  /* what the watcher is told, kept before the body goes to the outbox */
  if (watch && !spn_queue_state_terminal(j.state))
    watcher_add(s, &j, m->ident, m->ident_len, spn__json_str(b, "pipeline"),
                cJSON_GetObjectItemCaseSensitive(b, "waiting") != NULL);
  if (b)
    spn__out_push(s, m->ident, m->ident_len, watch ? "EVENT" : "STATUS", b, false);
  spn__queue_job_clear(&j);
}


static void stop_child(void *user, const spn_queue_job_t *c) {
  spn_server_t *s = user;
  spn_run_t *r = c->state == SPN_QSTATE_RUNNING ? spn__run_find(s, c->id) : NULL;
  if (r)
    spn__sched_cancel_run(s, r);
}

/* A cancelled segmented job: stop its running segments wherever they run
 * (the queue already cancelled the queued ones). */
static void segments_stop(spn_server_t *s, int64_t id) {
  if (s->q.ops->children)
    s->q.ops->children(s->q.impl, id, stop_child, s, NULL);
}

static void on_cancel(spn_server_t *s, spn_pmsg_t *m) {
  int64_t id;
  if (!need_id(s, m, &id))
    return;
  spn_error_t err = SPN_ERROR_INIT;
  spn_queue_state_t st = SPN_QSTATE_QUEUED;
  spn__batch_begin(s);
  int32_t rc = s->q.ops->cancel(s->q.impl, id, spn__now_ms(), &st, &err);
  if (rc < 0) {
    gone_hint(s, rc, &err);
    spn__out_error(s, m->ident, m->ident_len, m->req, code_for(rc), err.msg);
    return;
  }
  if (st == SPN_QSTATE_RUNNING) {
    spn_run_t *r = spn__run_find(s, id);
    if (r)
      spn__sched_cancel_run(s, r);
  }
  cJSON *b = cJSON_CreateObject();
  with_req(b, m->req);
  if (b) {
    cJSON_AddNumberToObject(b, "id", (double)id);
    cJSON_AddStringToObject(b, "state", st == SPN_QSTATE_RUNNING ? "cancelling" : spn_queue_state_name(st));
    spn__out_push(s, m->ident, m->ident_len, "CANCELLED", b, true);
  }
  if (st != SPN_QSTATE_RUNNING) {
    segments_stop(s, id);
    spn__segments_settle(s, id);
    spn__notify(s, id);
  }
}

typedef struct list_ctx {
  spn_server_t *s;
  cJSON *arr;
  cJSON *waiting; /* pipeline -> its "waiting" line, or false: asked once per pipeline */
} list_ctx_t;

static void list_cb(void *user, const spn_queue_job_t *j) {
  list_ctx_t *lc = user;
  cJSON *o = job_json(lc->s, j, false);
  if (!o)
    return;
  cJSON_AddItemToArray(lc->arr, o);
  const char *p = spn__json_str(o, "pipeline");
  if (j->state != SPN_QSTATE_QUEUED || !p || !*p || !lc->waiting)
    return;
  const cJSON *w = cJSON_GetObjectItemCaseSensitive(lc->waiting, p);
  if (!w) {
    char why[320];
    w = no_worker(lc->s, p, why, sizeof why) ? cJSON_AddStringToObject(lc->waiting, p, why)
                                              : cJSON_AddFalseToObject(lc->waiting, p);
  }
  if (cJSON_IsString(w))
    cJSON_AddStringToObject(o, "waiting", w->valuestring);
}

static void on_list(spn_server_t *s, spn_pmsg_t *m) {
  int32_t state = -1;
  const char *st = spn__json_str(m->body, "state");
  if (cJSON_GetObjectItemCaseSensitive(m->body, "state") && (!st || (state = spn_queue_state_parse(st)) < 0)) {
    spn__out_error(s, m->ident, m->ident_len, m->req, "invalid",
              "\"state\" must be one of queued, running, succeeded, failed, cancelled, dead");
    return;
  }
  int64_t limit = 100;
  if (cJSON_GetObjectItemCaseSensitive(m->body, "limit") &&
      (!spn__json_int(m->body, "limit", &limit) || limit < 1 || limit > 1000)) {
    spn__out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"limit\" must be an integer in [1, 1000]");
    return;
  }
  cJSON *b = cJSON_CreateObject();
  cJSON *arr = b ? cJSON_AddArrayToObject(b, "jobs") : NULL;
  if (!arr) {
    cJSON_Delete(b);
    return;
  }
  with_req(b, m->req);
  list_ctx_t lc = {s, arr, cJSON_CreateObject()};
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = s->q.ops->list(s->q.impl, state, (uint32_t)limit, list_cb, &lc, &err);
  cJSON_Delete(lc.waiting);
  if (rc < 0) {
    cJSON_Delete(b);
    spn__out_error(s, m->ident, m->ident_len, m->req, "internal", err.msg);
    return;
  }
  spn__out_push(s, m->ident, m->ident_len, "JOBS", b, false);
}

static void on_hello(spn_server_t *s, spn_pmsg_t *m) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(m->body, "versions");
  bool ok = false;
  const cJSON *it;
  if (cJSON_IsArray(v))
    cJSON_ArrayForEach(it, v) if (cJSON_IsNumber(it) && it->valuedouble == SPN_PROTO_VERSION) ok = true;
  if (!ok) {
    spn__out_error(s, m->ident, m->ident_len, m->req, "unsupported_version",
              "\"versions\" must list 1, the only version this gateway speaks");
    return;
  }
  cJSON *b = cJSON_CreateObject();
  with_req(b, m->req);
  if (!b)
    return;
  cJSON_AddNumberToObject(b, "version", SPN_PROTO_VERSION);
  cJSON_AddNumberToObject(b, "max_msg_size", s->cfg->max_msg_size);
  cJSON_AddNumberToObject(b, "heartbeat_ms", s->cfg->heartbeat_ms);
  cJSON *pl = cJSON_AddArrayToObject(b, "pipelines");
  for (size_t i = 0; pl && i < s->cfg->n_pipelines; i++)
    cJSON_AddItemToArray(pl, cJSON_CreateString(s->cfg->pipelines[i]));
  spn__out_push(s, m->ident, m->ident_len, "HELLO", b, false);
}

/* {"name", "worker_seen_ms_ago": ms or null (never)} of one pipeline. */
static void pipeline_seen(spn_server_t *s, cJSON *arr, const char *name, size_t len, int64_t now) {
  char one[129];
  snprintf(one, sizeof one, "%.*s", (int)(len < 128 ? len : 128), name);
  int64_t at = 0;
  s->q.ops->seen(s->q.impl, one, &at, NULL);
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "name", one);
  cJSON_AddItemToObject(p, "worker_seen_ms_ago", at ? cJSON_CreateNumber((double)(now - at)) : cJSON_CreateNull());
  cJSON_AddItemToArray(arr, p);
}

/* A WORKERS row: e's fields, then its name, and when last heard from
 * (last_heard_s < 0: not given) and whether it is gone. */
static cJSON *worker_row(const spn_roster_entry_t *e, const char *name, double last_heard_s, bool gone) {
  cJSON *w = spn__roster_json(e);
  if (!w)
    return NULL;
  cJSON_AddStringToObject(w, "name", name);
  if (last_heard_s >= 0)
    cJSON_AddNumberToObject(w, "last_heard_ms", (double)(int64_t)(last_heard_s * 1000.0));
  cJSON_AddBoolToObject(w, "gone", gone);
  return w;
}

/* This gateway's remote workers as WORKERS rows: the live ones, or those it
 * lost lately (spn__rworker_gone) with their slots when lost. */
static void remote_rows(spn_server_t *s, cJSON *ws, bool gone, int64_t now, double mono) {
  for (size_t i = 0; i < s->nworkers; i++) {
    const spn_rworker_t *rw = &s->workers[i];
    if (gone ? !spn__rworker_gone(rw, now) : !rw->alive)
      continue;
    spn_roster_entry_t e = spn__sched_remote_entry(s, i);
    if (gone) {
      e.slots = rw->gone_slots;
      e.running = 0;
    }
    cJSON_AddItemToArray(ws, worker_row(&e, rw->owner, mono - rw->last_seen, gone));
  }
}

typedef struct {
  spn_server_t *s;
  cJSON *rows;
  int64_t now;
} roster_ctx_t;

/* One roster record of another process: another gateway's own slots, a
 * remote worker of another gateway, or a stateless worker. */
static void roster_row(void *user, const char *name, const char *record) {
  roster_ctx_t *c = user;
  spn_server_t *s = c->s;
  char own[160];
  snprintf(own, sizeof own, "gateway:%s", s->name);
  if (!strcmp(name, own))
    return;
  for (size_t i = 0; i < s->nworkers; i++)
    if (s->workers[i].alive && !strcmp(s->workers[i].owner, name))
      return; /* listed above, from what this gateway knows now */
  cJSON *r = cJSON_Parse(record);
  int st = spn__roster_state(r, c->now);
  if (st == SPN_ROSTER_DUE || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, "kind"))) {
    cJSON_Delete(r); /* unreadable, or due for removal */
    return;
  }
  int64_t at = spn__roster_at(r);
  cJSON_DeleteItemFromObjectCaseSensitive(r, "at");
  const char *gw = spn__json_str(r, "gateway");
  /* another gateway's slots are named after it */
  cJSON_AddStringToObject(r, "name", !strncmp(name, "gateway:", 8) && gw ? gw : name);
  cJSON_AddNumberToObject(r, "last_heard_ms", (double)(c->now > at ? c->now - at : 0));
  cJSON_AddBoolToObject(r, "gone", st == SPN_ROSTER_GONE);
  cJSON_AddItemToArray(c->rows, r);
}

/* Live rows by name, then gone ones. */
static int roster_order(const void *a, const void *b) {
  const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
  int gx = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "gone"));
  int gy = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(y, "gone"));
  if (gx != gy)
    return gx - gy;
  const char *nx = spn__json_str(x, "name"), *ny = spn__json_str(y, "name");
  return strcmp(nx ? nx : "", ny ? ny : "");
}

/* The roster's rows (other processes' workers) into ws, in order: the hash
 * has none. */
static int32_t roster_rows(spn_server_t *s, cJSON *ws, int64_t now, spn_error_t *err) {
  roster_ctx_t c = {s, cJSON_CreateArray(), now};
  int32_t rc = c.rows ? s->q.ops->roster_get(s->q.impl, NULL, roster_row, &c, err)
                      : spn_error_set(err, SPN_ENOMEM, "out of memory");
  if (rc < 0) {
    cJSON_Delete(c.rows);
    return rc;
  }
  size_t n = (size_t)cJSON_GetArraySize(c.rows), k = 0;
  cJSON **rows = n ? calloc(n, sizeof *rows) : NULL;
  for (cJSON *it = c.rows->child; rows && it; it = it->next)
    rows[k++] = it;
  if (rows)
    qsort(rows, n, sizeof *rows, roster_order);
  for (size_t i = 0; i < n && rows; i++)
    cJSON_AddItemToArray(ws, cJSON_DetachItemViaPointer(c.rows, rows[i]));
  free(rows);
  while (c.rows->child) /* out of memory for the order: unsorted rather than none */
    cJSON_AddItemToArray(ws, cJSON_DetachItemViaPointer(c.rows, c.rows->child));
  cJSON_Delete(c.rows);
  return SPN_OK;
}

/* WORKERS: what runs the jobs. This gateway's own slots and remote workers,
 * each with what it runs and how busy it is; on a shared queue, every other
 * worker in its roster (other gateways' slots and remote workers, stateless
 * workers), a worker that stopped without draining as gone; and, for each
 * pipeline the gateway has, when a worker that runs it was last there
 * (every gateway's and, on Redis, every stateless worker's, from the
 * queue's presence record): null never. */
static void on_workers(spn_server_t *s, spn_pmsg_t *m) {
  cJSON *b = cJSON_CreateObject();
  cJSON *ws = b ? cJSON_AddArrayToObject(b, "workers") : NULL;
  cJSON *ps = b ? cJSON_AddArrayToObject(b, "pipelines") : NULL;
  if (!ws || !ps) {
    cJSON_Delete(b);
    spn__out_error(s, m->ident, m->ident_len, m->req, "internal", "out of memory");
    return;
  }
  with_req(b, m->req);
  cJSON_AddStringToObject(b, "gateway", s->name);
  double mono = spn__mono_s();
  int64_t now = spn__now_ms();
  if (s->nslots) {
    spn_roster_entry_t e = spn__sched_local_entry(s);
    cJSON_AddItemToArray(ws, worker_row(&e, "(this gateway)", -1, false));
  }
  remote_rows(s, ws, false, now, mono);
  if (!s->q.ops->roster_get) {
    remote_rows(s, ws, true, now, mono); /* those lost lately (on Redis, their records) */
  } else {
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = roster_rows(s, ws, now, &err);
    if (rc < 0) {
      cJSON_Delete(b);
      spn__out_error(s, m->ident, m->ident_len, m->req, code_for(rc), err.msg);
      return;
    }
  }
  size_t len = 0;
  for (const char *name = NULL; s->pipelines && spn__pipeline_filter_next(s->pipelines, &name, &len);)
    pipeline_seen(s, ps, name, len, now);
  for (size_t i = 0; !s->pipelines && i < s->cfg->n_pipelines; i++)
    pipeline_seen(s, ps, s->cfg->pipelines[i], strlen(s->cfg->pipelines[i]), now);
  spn__out_push(s, m->ident, m->ident_len, "WORKERS", b, false);
}

void spn__gateway_handle(spn_server_t *s, spn_pmsg_t *m) {
  if (m->error) {
    spn__out_error(s, m->ident, m->ident_len, m->req, m->error, m->detail);
    return;
  }
  const char *t = m->type;
  if (!strcmp(t, "SUBMIT"))
    on_submit(s, m);
  else if (!strcmp(t, "STATUS"))
    on_status(s, m, false);
  else if (!strcmp(t, "WATCH"))
    on_status(s, m, true);
  else if (!strcmp(t, "CANCEL"))
    on_cancel(s, m);
  else if (!strcmp(t, "LIST"))
    on_list(s, m);
  else if (!strcmp(t, "HELLO"))
    on_hello(s, m);
  else if (!strcmp(t, "WORKERS"))
    on_workers(s, m);
  else if (!strcmp(t, "LEASE") || !strcmp(t, "HEARTBEAT") || !strcmp(t, "PROGRESS") ||
           !strcmp(t, "DRAIN") || !strcmp(t, "RELEASE") ||
           !strcmp(t, "DONE") || !strcmp(t, "FAIL")) {
    /* With a workers key directory, only connections authenticated with a
     * worker key may lease or report jobs: a client key cannot mark a job
     * done or take jobs. */
    if (s->cfg->curve_secret && s->cfg->curve_workers_dir && strcmp(m->user_id, "worker") != 0) {
      spn__out_error(s, m->ident, m->ident_len, m->req, "forbidden",
                "worker messages need a worker key (curve_workers_dir)");
      return;
    }
    spn__batch_begin(s);
    spn__remote_msg(s, m);
  } else {
    char msg[96];
    snprintf(msg, sizeof msg, "unknown message type \"%s\"", t);
    spn__out_error(s, m->ident, m->ident_len, m->req, "unknown_type", msg);
  }
}
