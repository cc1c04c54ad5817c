/* server.c — the job gateway: one libuv loop thread that owns the ZeroMQ
 * ROUTER socket, the durable queue and every scheduling decision, plus
 * in-process worker threads that run jobs.
 *
 * Invariants:
 * - Only the loop thread touches the socket, the queue and the tables below.
 *   Worker threads hand results back through a mutex-protected report list
 *   and one uv_async_t (sends coalesce; the callback drains the whole list).
 * - ZMQ_FD is edge-triggered: after every batch of work (which may have sent
 *   on the socket and so consumed the edge) we re-read ZMQ_EVENTS and keep
 *   receiving until it no longer says POLLIN (`pump`).
 * - Group commit: the writes of one batch (every message received in one pass,
 *   up to BATCH_MAX) share one SQLite transaction; replies and job hand-outs
 *   are held in an outbox and sent only after the commit, so a client never
 *   hears "accepted" for a job that is not durable.
 * - Leases: local jobs are renewed by the loop's timer, remote jobs by their
 *   worker's HEARTBEAT. A job is reported complete only with the (id,
 *   attempt, owner) of its live lease; anything else is stale and ignored.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <uv.h>
#include <zmq.h>

#include "jobs-internal.h"
#include "proto-internal.h"

#define BATCH_MAX 512
#define TICK_MS 100

typedef struct report {
  struct report *next;
  int kind; /* 0 progress, 1 finished */
  uint32_t slot;
  int64_t id;
  uint32_t attempt;
  uint64_t done, total;
  spn_exec_result_t res;
} report_t;

typedef struct slot {
  struct spn_server *s;
  uint32_t idx;
  pthread_t th;
  bool started;
  /* shared with the thread, under s->wmu */
  spn_job_spec_t spec;
  bool assigned;
  volatile int cancel;
  /* loop only */
  bool busy;
  char owner[64];
} slot_t;

typedef struct rworker {
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
  char owner[160]; /* "remote:<name>" */
  int64_t credit;
  double last_seen;
  bool alive;
  bool leased; /* sent LEASE to this gateway instance: its credit is known */
} rworker_t;

typedef struct run {
  int64_t id;
  uint32_t attempt;
  int slot;        /* >= 0 local */
  int64_t worker;  /* index into workers when remote, -1 local */
  char owner[160];
  uint64_t done, total;
} run_t;

typedef struct watcher {
  int64_t id;
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
} watcher_t;

typedef struct outmsg {
  struct outmsg *next;
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
  char type[SPN_PROTO_TYPE_MAX + 1];
  cJSON *body;
  bool needs_commit; /* an acknowledgement of a durable write */
  int64_t req;
} outmsg_t;

struct spn_server {
  const spn_server_config_t *cfg;
  const spn_job_runner_t *runner;
  spn_queue_t q;
  uv_loop_t loop;
  uv_poll_t poll;
  uv_timer_t timer;
  uv_async_t async;
  uv_signal_t sigint, sigterm;
  void *zctx, *router;
  pthread_t zap_th;
  bool zap_started;
  volatile int zap_quit;
  volatile int stopping;

  pthread_mutex_t wmu;
  pthread_cond_t wcond;
  bool wquit;
  slot_t *slots;
  uint32_t nslots;

  pthread_mutex_t rmu;
  report_t *reports, **reports_tail;

  rworker_t *workers;
  size_t nworkers;
  size_t rr;
  run_t *runs;
  size_t nruns, caprun;
  watcher_t *watchers;
  size_t nwatchers, capwatch;

  uv_tcp_t http;
  bool http_open;
  bool in_batch, pumping;
  outmsg_t *out, **out_tail;
  double last_renew, last_sweep;
  int64_t wake_at;
  bool handles_open;
};

/* ---- outbox ---- */

static void out_push(spn_server_t *s, const unsigned char *ident, size_t ilen, const char *type,
                     cJSON *body, bool needs_commit) {
  outmsg_t *m = calloc(1, sizeof *m);
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

static void out_error(spn_server_t *s, const unsigned char *ident, size_t ilen, int64_t req,
                      const char *code, const char *msg) {
  cJSON *b = cJSON_CreateObject();
  if (!b)
    return;
  if (req)
    cJSON_AddNumberToObject(b, "req", (double)req);
  cJSON_AddStringToObject(b, "code", code);
  cJSON_AddStringToObject(b, "message", msg);
  out_push(s, ident, ilen, "ERROR", b, false);
}

static void out_flush(spn_server_t *s, bool committed) {
  outmsg_t *m = s->out;
  s->out = NULL;
  s->out_tail = &s->out;
  while (m) {
    outmsg_t *next = m->next;
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

static void batch_begin(spn_server_t *s) {
  if (s->in_batch)
    return;
  spn_error_t err = SPN_ERROR_INIT;
  if (s->q.ops->begin(s->q.impl, &err) < 0)
    fprintf(stderr, "spindle serve: %s\n", err.msg);
  else
    s->in_batch = true;
}

static void batch_end(spn_server_t *s) {
  bool ok = true;
  if (s->in_batch) {
    spn_error_t err = SPN_ERROR_INIT;
    s->in_batch = false;
    if (s->q.ops->commit(s->q.impl, &err) < 0) {
      fprintf(stderr, "spindle serve: %s\n", err.msg);
      ok = false;
    }
  }
  out_flush(s, ok);
}

/* ---- tables ---- */

static run_t *run_find(spn_server_t *s, int64_t id) {
  for (size_t i = 0; i < s->nruns; i++)
    if (s->runs[i].id == id)
      return &s->runs[i];
  return NULL;
}

static void run_remove(spn_server_t *s, int64_t id) {
  for (size_t i = 0; i < s->nruns; i++)
    if (s->runs[i].id == id) {
      s->runs[i] = s->runs[--s->nruns];
      return;
    }
}

static run_t *run_add(spn_server_t *s) {
  if (s->nruns == s->caprun) {
    size_t cap = s->caprun ? s->caprun * 2 : 16;
    run_t *nv = realloc(s->runs, cap * sizeof *nv);
    if (!nv)
      return NULL;
    s->runs = nv;
    s->caprun = cap;
  }
  run_t *r = &s->runs[s->nruns++];
  memset(r, 0, sizeof *r);
  return r;
}

static rworker_t *worker_by_ident(spn_server_t *s, const unsigned char *ident, size_t ilen) {
  for (size_t i = 0; i < s->nworkers; i++)
    if (s->workers[i].alive && s->workers[i].ident_len == ilen &&
        !memcmp(s->workers[i].ident, ident, ilen))
      return &s->workers[i];
  return NULL;
}

static void watcher_add(spn_server_t *s, int64_t id, const unsigned char *ident, size_t ilen) {
  for (size_t i = 0; i < s->nwatchers; i++)
    if (s->watchers[i].id == id && s->watchers[i].ident_len == ilen &&
        !memcmp(s->watchers[i].ident, ident, ilen))
      return;
  if (s->nwatchers == s->capwatch) {
    size_t cap = s->capwatch ? s->capwatch * 2 : 16;
    watcher_t *nv = realloc(s->watchers, cap * sizeof *nv);
    if (!nv)
      return;
    s->watchers = nv;
    s->capwatch = cap;
  }
  watcher_t *w = &s->watchers[s->nwatchers++];
  w->id = id;
  memcpy(w->ident, ident, ilen);
  w->ident_len = ilen;
}

/* ---- job descriptions ---- */

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
  run_t *r = j->state == SPN_QSTATE_RUNNING ? run_find(s, j->id) : NULL;
  if (r) {
    done = r->done;
    total = r->total;
  }
  cJSON_AddNumberToObject(o, "done", (double)done);
  cJSON_AddNumberToObject(o, "total", (double)total);
  cJSON_AddNumberToObject(o, "compute_s", j->compute_s);
  cJSON_AddNumberToObject(o, "gpu_s", j->gpu_s);
  cJSON_AddNumberToObject(o, "created", (double)j->created_ms);
  if (j->reason)
    cJSON_AddStringToObject(o, "reason", j->reason);
  if (j->lease_owner)
    cJSON_AddStringToObject(o, "worker", j->lease_owner);
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
static void notify(spn_server_t *s, int64_t id) {
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
    if (b)
      out_push(s, s->watchers[i].ident, s->watchers[i].ident_len, "EVENT", b, false);
    if (term)
      s->watchers[i] = s->watchers[--s->nwatchers];
    else
      i++;
  }
  spn__queue_job_clear(&j);
}

static void notify_progress(spn_server_t *s, run_t *r) {
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
    out_push(s, s->watchers[i].ident, s->watchers[i].ident_len, "EVENT", b, false);
  }
}

static void changed_cb(void *user, int64_t id, spn_queue_state_t st) {
  spn_server_t *s = user;
  (void)st;
  run_t *r = run_find(s, id);
  if (r) {
    /* The lease is gone (expired or its worker was lost): stop a local run. */
    if (r->slot >= 0)
      __atomic_store_n(&s->slots[r->slot].cancel, 1, __ATOMIC_RELEASE);
    run_remove(s, id);
  }
  notify(s, id);
}

/* ---- dispatch ---- */

static void finish_run(spn_server_t *s, int64_t id, uint32_t attempt, const char *owner,
                       const spn_exec_result_t *res) {
  spn_error_t err = SPN_ERROR_INIT;
  int64_t now = spn__now_ms();
  int32_t rc;
  run_t *live = run_find(s, id);
  if (live && live->attempt == attempt && !strcmp(live->owner, owner) && live->total)
    s->q.ops->progress(s->q.impl, id, live->done, live->total, NULL);
  if (res->status == SPN_OK) {
    rc = s->q.ops->complete(s->q.impl, id, attempt, owner, res->compute_s, res->gpu_s, now, &err);
  } else {
    spn_queue_state_t st;
    rc = s->q.ops->fail(s->q.impl, id, attempt, owner, res->error, res->status == SPN_ECANCELLED,
                        res->compute_s, res->gpu_s, now, &st, &err);
  }
  if (rc < 0 && rc != SPN_ESTATE)
    fprintf(stderr, "spindle serve: job %lld: %s\n", (long long)id, err.msg);
  run_t *r = run_find(s, id);
  if (r && r->attempt == attempt && !strcmp(r->owner, owner))
    run_remove(s, id);
  notify(s, id);
}

static bool assign_local(spn_server_t *s, slot_t *sl, spn_queue_job_t *j) {
  cJSON *spec = cJSON_Parse(j->spec_json);
  spn_job_spec_t js;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spec ? spn__job_spec_from_json(spec, j->id, j->attempts, &js, &err)
                    : spn_error_set(&err, SPN_EPARSE, "stored spec is not JSON");
  cJSON_Delete(spec);
  if (rc < 0) {
    spn_exec_result_t res = {.status = rc};
    snprintf(res.error, sizeof res.error, "%s", err.msg);
    finish_run(s, j->id, j->attempts, sl->owner, &res);
    return false;
  }
  run_t *r = run_add(s);
  if (!r) {
    spn__job_spec_free(&js);
    return false;
  }
  r->id = j->id;
  r->attempt = j->attempts;
  r->slot = (int)sl->idx;
  r->worker = -1;
  snprintf(r->owner, sizeof r->owner, "%s", sl->owner);
  sl->busy = true;
  pthread_mutex_lock(&s->wmu);
  sl->spec = js;
  sl->cancel = 0;
  sl->assigned = true;
  pthread_cond_broadcast(&s->wcond);
  pthread_mutex_unlock(&s->wmu);
  return true;
}

static void assign_remote(spn_server_t *s, size_t wi, spn_queue_job_t *j) {
  rworker_t *w = &s->workers[wi];
  cJSON *b = cJSON_CreateObject();
  cJSON *spec = cJSON_Parse(j->spec_json);
  run_t *r = run_add(s);
  if (!b || !spec || !r) {
    cJSON_Delete(b);
    cJSON_Delete(spec);
    if (r)
      s->nruns--;
    return; /* the lease expires and the job runs again */
  }
  r->id = j->id;
  r->attempt = j->attempts;
  r->slot = -1;
  r->worker = (int64_t)wi;
  snprintf(r->owner, sizeof r->owner, "%s", w->owner);
  cJSON_AddNumberToObject(b, "id", (double)j->id);
  cJSON_AddNumberToObject(b, "attempt", j->attempts);
  cJSON_AddNumberToObject(b, "lease_ms", s->cfg->lease_ms);
  cJSON_AddItemToObject(b, "spec", spec);
  w->credit--;
  out_push(s, w->ident, w->ident_len, "JOB", b, true);
}

static void dispatch(spn_server_t *s) {
  if (s->stopping)
    return;
  for (;;) {
    slot_t *sl = NULL;
    for (uint32_t i = 0; i < s->nslots; i++)
      if (!s->slots[i].busy) {
        sl = &s->slots[i];
        break;
      }
    size_t wi = SIZE_MAX;
    if (!sl) {
      for (size_t k = 0; k < s->nworkers; k++) {
        size_t i = (s->rr + k) % s->nworkers;
        if (s->workers[i].alive && s->workers[i].credit > 0) {
          wi = i;
          s->rr = i + 1;
          break;
        }
      }
      if (wi == SIZE_MAX)
        return;
    }
    const char *owner = sl ? sl->owner : s->workers[wi].owner;
    spn_queue_job_t j;
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = s->q.ops->lease(s->q.impl, owner, spn__now_ms(), s->cfg->lease_ms, &j, &err);
    if (rc == SPN_EAGAIN)
      return;
    if (rc < 0) {
      fprintf(stderr, "spindle serve: %s\n", err.msg);
      return;
    }
    if (sl)
      assign_local(s, sl, &j);
    else
      assign_remote(s, wi, &j);
    notify(s, j.id);
    spn__queue_job_clear(&j);
  }
}

/* ---- requests ---- */

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

static void on_submit(spn_server_t *s, spn_pmsg_t *m) {
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = SPN_OK;
  cJSON *spec = cJSON_CreateObject();
  char *spec_js = NULL;
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
    rc = spn_error_set(&err, SPN_EUNSUPPORTED, "SUBMIT: unknown pipeline \"%s\"", pipeline);
    goto out;
  }
  cJSON_AddStringToObject(spec, "pipeline", pipeline);
  if ((rc = validate_io(s, b, "inputs", true, spec, &err)) < 0 ||
      (rc = validate_io(s, b, "outputs", false, spec, &err)) < 0)
    goto out;
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(b, "params");
  if (params) {
    if (!cJSON_IsObject(params) || cJSON_GetArraySize(params) > 256) {
      rc = spn_error_set(&err, SPN_EINVAL, "SUBMIT: \"params\" must be an object of at most 256 keys");
      goto out;
    }
    const cJSON *it;
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
  spec_js = cJSON_PrintUnformatted(spec);
  if (!spec_js) {
    rc = spn_error_set(&err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  spn_queue_submit_t sub = {.spec_json = spec_js, .priority = (int32_t)prio, .idem_key = key,
                            .deadline_ms = deadline, .max_attempts = (uint32_t)max_att};
  int64_t id = 0;
  bool existed = false;
  batch_begin(s);
  rc = s->q.ops->submit(s->q.impl, &sub, spn__now_ms(), &id, &existed, &err);
  if (rc < 0)
    goto out;
  cJSON *r = cJSON_CreateObject();
  if (r) {
    if (m->req)
      cJSON_AddNumberToObject(r, "req", (double)m->req);
    cJSON_AddNumberToObject(r, "id", (double)id);
    cJSON_AddBoolToObject(r, "existed", existed);
    out_push(s, m->ident, m->ident_len, "SUBMITTED", r, true);
  }
out:
  if (rc < 0)
    out_error(s, m->ident, m->ident_len, m->req, code_for(rc), err.msg);
  free(spec_js);
  cJSON_Delete(spec);
}

static bool need_id(spn_server_t *s, spn_pmsg_t *m, int64_t *id) {
  if (spn__json_int(m->body, "id", id) && *id > 0)
    return true;
  out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"id\" must be a positive integer job id");
  return false;
}

static void with_req(cJSON *b, int64_t req) {
  if (b && req)
    cJSON_AddNumberToObject(b, "req", (double)req);
}

static void on_status(spn_server_t *s, spn_pmsg_t *m, bool watch) {
  int64_t id;
  if (!need_id(s, m, &id))
    return;
  spn_queue_job_t j;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = s->q.ops->get(s->q.impl, id, &j, &err);
  if (rc < 0) {
    out_error(s, m->ident, m->ident_len, m->req, code_for(rc), err.msg);
    return;
  }
  cJSON *b = job_json(s, &j, true);
  with_req(b, m->req);
  if (b)
    out_push(s, m->ident, m->ident_len, watch ? "EVENT" : "STATUS", b, false);
  if (watch && !spn_queue_state_terminal(j.state))
    watcher_add(s, id, m->ident, m->ident_len);
  spn__queue_job_clear(&j);
}

static void send_cancel_to_worker(spn_server_t *s, run_t *r) {
  if (r->slot >= 0) {
    __atomic_store_n(&s->slots[r->slot].cancel, 1, __ATOMIC_RELEASE);
  } else if (r->worker >= 0 && (size_t)r->worker < s->nworkers) {
    rworker_t *w = &s->workers[r->worker];
    cJSON *b = cJSON_CreateObject();
    if (!b)
      return;
    cJSON_AddNumberToObject(b, "id", (double)r->id);
    cJSON_AddNumberToObject(b, "attempt", r->attempt);
    out_push(s, w->ident, w->ident_len, "CANCEL", b, true);
  }
}

static void on_cancel(spn_server_t *s, spn_pmsg_t *m) {
  int64_t id;
  if (!need_id(s, m, &id))
    return;
  spn_error_t err = SPN_ERROR_INIT;
  spn_queue_state_t st = SPN_QSTATE_QUEUED;
  batch_begin(s);
  int32_t rc = s->q.ops->cancel(s->q.impl, id, spn__now_ms(), &st, &err);
  if (rc < 0) {
    out_error(s, m->ident, m->ident_len, m->req, code_for(rc), err.msg);
    return;
  }
  if (st == SPN_QSTATE_RUNNING) {
    run_t *r = run_find(s, id);
    if (r)
      send_cancel_to_worker(s, r);
  }
  cJSON *b = cJSON_CreateObject();
  with_req(b, m->req);
  if (b) {
    cJSON_AddNumberToObject(b, "id", (double)id);
    cJSON_AddStringToObject(b, "state", st == SPN_QSTATE_RUNNING ? "cancelling" : spn_queue_state_name(st));
    out_push(s, m->ident, m->ident_len, "CANCELLED", b, true);
  }
  if (st != SPN_QSTATE_RUNNING)
    notify(s, id);
}

typedef struct list_ctx {
  spn_server_t *s;
  cJSON *arr;
} list_ctx_t;

static void list_cb(void *user, const spn_queue_job_t *j) {
  list_ctx_t *lc = user;
  cJSON *o = job_json(lc->s, j, false);
  if (o)
    cJSON_AddItemToArray(lc->arr, o);
}

static void on_list(spn_server_t *s, spn_pmsg_t *m) {
  int32_t state = -1;
  const char *st = spn__json_str(m->body, "state");
  if (cJSON_GetObjectItemCaseSensitive(m->body, "state") && (!st || (state = spn_queue_state_parse(st)) < 0)) {
    out_error(s, m->ident, m->ident_len, m->req, "invalid",
              "\"state\" must be one of queued, running, succeeded, failed, cancelled, dead");
    return;
  }
  int64_t limit = 100;
  if (cJSON_GetObjectItemCaseSensitive(m->body, "limit") &&
      (!spn__json_int(m->body, "limit", &limit) || limit < 1 || limit > 1000)) {
    out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"limit\" must be an integer in [1, 1000]");
    return;
  }
  cJSON *b = cJSON_CreateObject();
  cJSON *arr = b ? cJSON_AddArrayToObject(b, "jobs") : NULL;
  if (!arr) {
    cJSON_Delete(b);
    return;
  }
  with_req(b, m->req);
  list_ctx_t lc = {s, arr};
  spn_error_t err = SPN_ERROR_INIT;
  if (s->q.ops->list(s->q.impl, state, (uint32_t)limit, list_cb, &lc, &err) < 0) {
    cJSON_Delete(b);
    out_error(s, m->ident, m->ident_len, m->req, "internal", err.msg);
    return;
  }
  out_push(s, m->ident, m->ident_len, "JOBS", b, false);
}

static void on_hello(spn_server_t *s, spn_pmsg_t *m) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(m->body, "versions");
  bool ok = false;
  const cJSON *it;
  if (cJSON_IsArray(v))
    cJSON_ArrayForEach(it, v) if (cJSON_IsNumber(it) && it->valuedouble == SPN_PROTO_VERSION) ok = true;
  if (!ok) {
    out_error(s, m->ident, m->ident_len, m->req, "unsupported_version",
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
  out_push(s, m->ident, m->ident_len, "HELLO", b, false);
}

/* ---- worker side ---- */

static rworker_t *worker_register(spn_server_t *s, spn_pmsg_t *m) {
  const char *name = spn__json_str(m->body, "worker");
  if (!name || !*name || strlen(name) > 128) {
    out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"worker\" must be a name of 1-128 bytes");
    return NULL;
  }
  rworker_t *w = worker_by_ident(s, m->ident, m->ident_len);
  if (w)
    return w;
  /* A worker that reconnected (new routing id) replaces its old entry. */
  char owner[160];
  snprintf(owner, sizeof owner, "remote:%s", name);
  for (size_t i = 0; i < s->nworkers; i++)
    if (s->workers[i].alive && !strcmp(s->workers[i].owner, owner)) {
      w = &s->workers[i];
      break;
    }
  if (!w) {
    for (size_t i = 0; i < s->nworkers; i++)
      if (!s->workers[i].alive) {
        w = &s->workers[i];
        break;
      }
  }
  if (!w) {
    rworker_t *nv = realloc(s->workers, (s->nworkers + 1) * sizeof *nv);
    if (!nv)
      return NULL;
    s->workers = nv;
    w = &s->workers[s->nworkers++];
  }
  memset(w, 0, sizeof *w);
  memcpy(w->ident, m->ident, m->ident_len);
  w->ident_len = m->ident_len;
  snprintf(w->owner, sizeof w->owner, "%s", owner);
  w->alive = true;
  w->last_seen = spn__mono_s();
  /* Runs of this worker keep their index. */
  size_t wi = (size_t)(w - s->workers);
  for (size_t i = 0; i < s->nruns; i++)
    if (!strcmp(s->runs[i].owner, owner))
      s->runs[i].worker = (int64_t)wi;
  return w;
}

static bool lease_args(spn_server_t *s, spn_pmsg_t *m, int64_t *id, int64_t *att) {
  if (spn__json_int(m->body, "id", id) && spn__json_int(m->body, "attempt", att) && *id > 0 &&
      *att > 0)
    return true;
  out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"id\" and \"attempt\" must be positive integers");
  return false;
}

static void on_worker_msg(spn_server_t *s, spn_pmsg_t *m) {
  rworker_t *w = worker_register(s, m);
  if (!w)
    return;
  w->last_seen = spn__mono_s();
  int64_t now = spn__now_ms();
  spn_error_t err = SPN_ERROR_INIT;
  if (!strcmp(m->type, "LEASE")) {
    int64_t credit = 0;
    if (!spn__json_int(m->body, "credit", &credit) || credit < 0 || credit > 1024) {
      out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"credit\" must be an integer in [0, 1024]");
      return;
    }
    w->credit += credit;
    w->leased = true;
  } else if (!strcmp(m->type, "HEARTBEAT")) {
    const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(m->body, "jobs");
    const cJSON *it;
    cJSON_ArrayForEach(it, jobs) {
      int64_t id, att;
      if (!spn__json_int(it, "id", &id) || !spn__json_int(it, "attempt", &att))
        continue;
      int32_t rr = s->q.ops->renew(s->q.impl, id, (uint32_t)att, w->owner, now, s->cfg->lease_ms, &err);
      if (rr == SPN_ESTATE) {
        /* The worker runs a job whose lease it lost (it was presumed dead,
         * or the job was cancelled and ended): tell it to stop, so it does
         * not race the attempt that runs elsewhere now. */
        cJSON *c = cJSON_CreateObject();
        if (c) {
          cJSON_AddNumberToObject(c, "id", (double)id);
          cJSON_AddNumberToObject(c, "attempt", (double)att);
          out_push(s, m->ident, m->ident_len, "CANCEL", c, true);
        }
        continue;
      }
      if (rr == SPN_OK && !run_find(s, id)) {
        /* A job this gateway instance did not hand out (it restarted): adopt it. */
        run_t *r = run_add(s);
        if (r) {
          r->id = id;
          r->attempt = (uint32_t)att;
          r->slot = -1;
          r->worker = (int64_t)(w - s->workers);
          snprintf(r->owner, sizeof r->owner, "%s", w->owner);
        }
      }
    }
    cJSON *b = cJSON_CreateObject();
    if (b) {
      /* "known": false tells a worker we have no record of its credit (we
       * restarted); it answers with LEASE for its free slots. */
      cJSON_AddBoolToObject(b, "known", w->leased);
      out_push(s, m->ident, m->ident_len, "HEARTBEAT", b, false);
    }
  } else if (!strcmp(m->type, "PROGRESS")) {
    int64_t id, att, done = 0, total = 0;
    if (!lease_args(s, m, &id, &att))
      return;
    spn__json_int(m->body, "done", &done);
    spn__json_int(m->body, "total", &total);
    run_t *r = run_find(s, id);
    if (r && r->attempt == (uint32_t)att && !strcmp(r->owner, w->owner)) {
      r->done = (uint64_t)(done < 0 ? 0 : done);
      r->total = (uint64_t)(total < 0 ? 0 : total);
      notify_progress(s, r);
    }
  } else { /* DONE or FAIL */
    int64_t id, att;
    if (!lease_args(s, m, &id, &att))
      return;
    spn_exec_result_t res = {.status = SPN_OK};
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(m->body, "compute_s");
    const cJSON *gs = cJSON_GetObjectItemCaseSensitive(m->body, "gpu_s");
    res.compute_s = cJSON_IsNumber(cs) ? cs->valuedouble : 0;
    res.gpu_s = cJSON_IsNumber(gs) ? gs->valuedouble : 0;
    if (!strcmp(m->type, "FAIL")) {
      const char *e = spn__json_str(m->body, "error");
      res.status = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m->body, "cancelled")) ? SPN_ECANCELLED
                                                                                        : SPN_EIO;
      snprintf(res.error, sizeof res.error, "%s: %s", w->owner, e ? e : "failed");
    }
    finish_run(s, id, (uint32_t)att, w->owner, &res);
  }
}

static void handle(spn_server_t *s, spn_pmsg_t *m) {
  if (m->error) {
    out_error(s, m->ident, m->ident_len, m->req, m->error, m->detail);
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
  else if (!strcmp(t, "LEASE") || !strcmp(t, "HEARTBEAT") || !strcmp(t, "PROGRESS") ||
           !strcmp(t, "DONE") || !strcmp(t, "FAIL")) {
    /* With a workers key directory, only connections authenticated with a
     * worker key may lease or report jobs: a client key cannot mark a job
     * done or take jobs. */
    if (s->cfg->curve_secret && s->cfg->curve_workers_dir && strcmp(m->user_id, "worker") != 0) {
      out_error(s, m->ident, m->ident_len, m->req, "forbidden",
                "worker messages need a worker key (curve_workers_dir)");
      return;
    }
    batch_begin(s);
    on_worker_msg(s, m);
  } else {
    char msg[96];
    snprintf(msg, sizeof msg, "unknown message type \"%s\"", t);
    out_error(s, m->ident, m->ident_len, m->req, "unknown_type", msg);
  }
}

/* ---- loop callbacks ---- */

static void stop_cb(spn_server_t *s);

static void pump(spn_server_t *s) {
  if (s->pumping)
    return;
  s->pumping = true;
  for (;;) {
    int ev = 0;
    size_t sz = sizeof ev;
    if (zmq_getsockopt(s->router, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
      break;
    for (int k = 0; k < BATCH_MAX; k++) {
      spn_pmsg_t m;
      int32_t rc = spn__proto_recv(s->router, true, &m);
      if (rc == SPN_EAGAIN)
        break;
      if (rc < 0)
        break;
      handle(s, &m);
      cJSON_Delete(m.body);
    }
    batch_begin(s);
    dispatch(s);
    batch_end(s);
  }
  s->pumping = false;
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  pump(h->data);
}

static void on_async(uv_async_t *h) {
  spn_server_t *s = h->data;
  pthread_mutex_lock(&s->rmu);
  report_t *r = s->reports;
  s->reports = NULL;
  s->reports_tail = &s->reports;
  pthread_mutex_unlock(&s->rmu);
  if (s->stopping) {
    while (r) {
      report_t *next = r->next;
      free(r);
      r = next;
    }
    if (s->handles_open)
      stop_cb(s);
    return;
  }
  batch_begin(s);
  while (r) {
    report_t *next = r->next;
    slot_t *sl = &s->slots[r->slot];
    run_t *run = run_find(s, r->id);
    bool live = run && run->attempt == r->attempt && run->slot == (int)r->slot;
    if (r->kind == 0) {
      if (live) {
        run->done = r->done;
        run->total = r->total;
        notify_progress(s, run);
      }
    } else {
      sl->busy = false;
      if (!s->stopping)
        finish_run(s, r->id, r->attempt, sl->owner, &r->res);
    }
    free(r);
    r = next;
  }
  dispatch(s);
  batch_end(s);
  pump(s);
}

static void renew_local(spn_server_t *s, int64_t now) {
  for (size_t i = 0; i < s->nruns; i++) {
    run_t *r = &s->runs[i];
    if (r->slot < 0)
      continue;
    spn_error_t err = SPN_ERROR_INIT;
    if (s->q.ops->renew(s->q.impl, r->id, r->attempt, r->owner, now, s->cfg->lease_ms, &err) < 0)
      __atomic_store_n(&s->slots[r->slot].cancel, 1, __ATOMIC_RELEASE);
  }
}

static void on_timer(uv_timer_t *h) {
  spn_server_t *s = h->data;
  double mono = spn__mono_s();
  int64_t now = spn__now_ms();
  batch_begin(s);
  if (mono - s->last_renew >= s->cfg->heartbeat_ms / 1000.0) {
    s->last_renew = mono;
    renew_local(s, now);
  }
  /* Remote workers: dead after three missed heartbeats; their jobs retry. */
  double dead_after = 3.0 * s->cfg->heartbeat_ms / 1000.0;
  for (size_t i = 0; i < s->nworkers; i++) {
    rworker_t *w = &s->workers[i];
    if (!w->alive || mono - w->last_seen <= dead_after)
      continue;
    fprintf(stderr, "spindle serve: worker %s missed 3 heartbeats; re-queueing its jobs\n", w->owner);
    w->alive = false;
    spn_error_t err = SPN_ERROR_INIT;
    char reason[200];
    snprintf(reason, sizeof reason, "worker %s lost (3 heartbeats missed)", w->owner);
    if (s->q.ops->release_owner(s->q.impl, w->owner, reason, now, changed_cb, s, &err) < 0)
      fprintf(stderr, "spindle serve: %s\n", err.msg);
    for (size_t k = 0; k < s->nruns;)
      if (s->runs[k].worker == (int64_t)i)
        s->runs[k] = s->runs[--s->nruns];
      else
        k++;
  }
  if (mono - s->last_sweep >= 0.25) {
    s->last_sweep = mono;
    spn_error_t err = SPN_ERROR_INIT;
    if (s->q.ops->sweep(s->q.impl, now, changed_cb, s, &err) < 0)
      fprintf(stderr, "spindle serve: %s\n", err.msg);
  }
  dispatch(s);
  batch_end(s);
  pump(s);
}

static void on_signal(uv_signal_t *h, int sig) {
  (void)sig;
  spn_server_stop(h->data);
}

/* ---- worker threads ---- */

typedef struct prog_ctx {
  spn_server_t *s;
  slot_t *sl;
} prog_ctx_t;

static void push_report(spn_server_t *s, report_t *r) {
  pthread_mutex_lock(&s->rmu);
  *s->reports_tail = r;
  s->reports_tail = &r->next;
  pthread_mutex_unlock(&s->rmu);
  uv_async_send(&s->async);
}

static void slot_progress(void *user, uint64_t done, uint64_t total) {
  prog_ctx_t *pc = user;
  report_t *r = calloc(1, sizeof *r);
  if (!r)
    return;
  r->kind = 0;
  r->slot = pc->sl->idx;
  r->id = pc->sl->spec.id;
  r->attempt = pc->sl->spec.attempt;
  r->done = done;
  r->total = total;
  push_report(pc->s, r);
}

static void *slot_main(void *arg) {
  slot_t *sl = arg;
  spn_server_t *s = sl->s;
  for (;;) {
    pthread_mutex_lock(&s->wmu);
    while (!s->wquit && !sl->assigned)
      pthread_cond_wait(&s->wcond, &s->wmu);
    if (s->wquit) {
      pthread_mutex_unlock(&s->wmu);
      break;
    }
    pthread_mutex_unlock(&s->wmu);
    report_t *r = calloc(1, sizeof *r);
    prog_ctx_t pc = {s, sl};
    spn_exec_result_t res;
    spn__job_execute(s->runner, &sl->spec, &sl->cancel, slot_progress, &pc, &res);
    if (r) {
      r->kind = 1;
      r->slot = sl->idx;
      r->id = sl->spec.id;
      r->attempt = sl->spec.attempt;
      r->res = res;
    }
    pthread_mutex_lock(&s->wmu);
    spn__job_spec_free(&sl->spec);
    sl->assigned = false;
    pthread_mutex_unlock(&s->wmu);
    if (r)
      push_report(s, r); /* after the slot is free again: the loop may assign at once */
  }
  return NULL;
}

/* ---- CURVE allow-list (ZAP) ---- */

static bool key_allowed(const char *dir, const unsigned char *key32) {
  char z85[41];
  if (!zmq_z85_encode(z85, key32, 32))
    return false;
  bool ok = false;
  DIR *d = opendir(dir);
  if (!d)
    return false;
  struct dirent *ent;
  while (!ok && (ent = readdir(d))) {
    if (ent->d_name[0] == '.')
      continue;
    char path[4096], buf[128];
    snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* A key file holds the 40-character Z85 public key, maybe after
     * comment lines starting with '#'. */
    char *line = buf, *save = NULL;
    for (char *tok = strtok_r(line, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
      while (*tok == ' ' || *tok == '\t')
        tok++;
      if (*tok == '#')
        continue;
      if (strlen(tok) >= 40 && !memcmp(tok, z85, 40))
        ok = true;
      break;
    }
  }
  closedir(d);
  return ok;
}

static void *zap_main(void *arg) {
  spn_server_t *s = arg;
  void *rep = zmq_socket(s->zctx, ZMQ_REP);
  int linger = 0;
  zmq_setsockopt(rep, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_bind(rep, "inproc://zeromq.zap.01") != 0) {
    fprintf(stderr, "spindle serve: ZAP handler: %s\n", zmq_strerror(zmq_errno()));
    zmq_close(rep);
    return NULL;
  }
  while (!__atomic_load_n(&s->zap_quit, __ATOMIC_ACQUIRE)) {
    zmq_pollitem_t it = {rep, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 100) <= 0)
      continue;
    zmq_msg_t f[8];
    int n = 0, more = 1;
    while (more) {
      zmq_msg_t tmp;
      zmq_msg_init(&tmp);
      if (zmq_msg_recv(&tmp, rep, 0) < 0) {
        zmq_msg_close(&tmp);
        break;
      }
      more = zmq_msg_more(&tmp);
      if (n < 8)
        f[n++] = tmp;
      else
        zmq_msg_close(&tmp);
    }
    /* ZAP request: version, request id, domain, address, identity,
     * mechanism, credentials... Allow only CURVE with a listed key. The
     * reply's user id is the key's role: "worker" when the key is in
     * curve_workers_dir, else "client"; the gateway accepts worker messages
     * only from "worker" connections when that directory is configured. */
    const char *role = NULL;
    if (n >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
        zmq_msg_size(&f[6]) == 32) {
      if (s->cfg->curve_workers_dir && key_allowed(s->cfg->curve_workers_dir, zmq_msg_data(&f[6])))
        role = "worker";
      else if (key_allowed(s->cfg->curve_clients_dir, zmq_msg_data(&f[6])))
        role = "client";
    }
    const char *reqid = n >= 2 ? zmq_msg_data(&f[1]) : "";
    size_t reqid_len = n >= 2 ? zmq_msg_size(&f[1]) : 0;
    zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(rep, reqid, reqid_len, ZMQ_SNDMORE);
    zmq_send(rep, role ? "200" : "400", 3, ZMQ_SNDMORE);
    zmq_send(rep, role ? "OK" : "client key not allowed", role ? 2 : 22, ZMQ_SNDMORE);
    zmq_send(rep, role ? role : "", role ? strlen(role) : 0, ZMQ_SNDMORE);
    zmq_send(rep, "", 0, 0);
    if (!role)
      fprintf(stderr, "spindle serve: refused a CURVE client: key not in %s\n", s->cfg->curve_clients_dir);
    for (int i = 0; i < n; i++)
      zmq_msg_close(&f[i]);
  }
  zmq_close(rep);
  return NULL;
}

/* ---- HTTP: /healthz, /readyz, /metrics ---- */

/* A deliberately tiny HTTP/1.0 responder on the loop thread: one GET per
 * connection, request head at most 2 KiB, answer and close. Enough for
 * Kubernetes probes and a Prometheus scrape; nothing else is served. */
typedef struct http_conn {
  uv_tcp_t h;
  uv_write_t w;
  spn_server_t *s;
  char in[2048];
  size_t n;
  char *out;
  bool answered;
} http_conn_t;

static void http_closed(uv_handle_t *h) {
  http_conn_t *c = h->data;
  free(c->out);
  free(c);
}

static void http_written(uv_write_t *w, int status) {
  (void)status;
  http_conn_t *c = w->data;
  if (!uv_is_closing((uv_handle_t *)&c->h))
    uv_close((uv_handle_t *)&c->h, http_closed);
}

static void http_alloc(uv_handle_t *h, size_t sug, uv_buf_t *b) {
  (void)sug;
  http_conn_t *c = h->data;
  b->base = c->in + c->n;
  b->len = sizeof c->in - 1 - c->n;
}

static void http_answer(http_conn_t *c) {
  spn_server_t *s = c->s;
  char path[64] = "";
  int code = 404;
  char body[2048];
  const char *ctype = "text/plain; charset=utf-8";
  snprintf(body, sizeof body, "not found\n");
  if (sscanf(c->in, "GET %63s", path) != 1) {
    code = 400;
    snprintf(body, sizeof body, "bad request\n");
  } else if (!strcmp(path, "/healthz")) {
    code = 200;
    snprintf(body, sizeof body, "ok\n");
  } else if (!strcmp(path, "/readyz")) {
    /* Ready: the pipelines named in the config were checked at start-up
     * and the loop is serving (not shutting down). */
    bool ready = !s->stopping;
    code = ready ? 200 : 503;
    snprintf(body, sizeof body, "%s\n", ready ? "ready" : "stopping");
  } else if (!strcmp(path, "/metrics")) {
    int64_t cnt[SPN_QSTATE_COUNT];
    if (s->q.ops->counts(s->q.impl, cnt, NULL) < 0) {
      code = 500;
      snprintf(body, sizeof body, "queue unavailable\n");
    } else {
      code = 200;
      ctype = "text/plain; version=0.0.4";
      size_t o = (size_t)snprintf(body, sizeof body, "# HELP spindle_jobs Jobs in the queue by state.\n"
                                                     "# TYPE spindle_jobs gauge\n");
      for (int i = 0; i < SPN_QSTATE_COUNT && o < sizeof body; i++)
        o += (size_t)snprintf(body + o, sizeof body - o, "spindle_jobs{state=\"%s\"} %lld\n",
                              spn_queue_state_name((spn_queue_state_t)i), (long long)cnt[i]);
      size_t alive = 0;
      for (size_t i = 0; i < s->nworkers; i++)
        alive += s->workers[i].alive;
      if (o < sizeof body)
        snprintf(body + o, sizeof body - o,
                 "# HELP spindle_workers Workers by kind.\n# TYPE spindle_workers gauge\n"
                 "spindle_workers{kind=\"local\"} %u\nspindle_workers{kind=\"remote\"} %zu\n",
                 s->nslots, alive);
    }
  }
  size_t cap = strlen(body) + 256;
  c->out = malloc(cap);
  if (!c->out) {
    uv_close((uv_handle_t *)&c->h, http_closed);
    return;
  }
  int n = snprintf(c->out, cap,
                   "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                   code, code == 200 ? "OK" : code == 404 ? "Not Found" : code == 503 ? "Service Unavailable" : "Error",
                   ctype, strlen(body), body);
  uv_buf_t b = uv_buf_init(c->out, (unsigned)n);
  c->w.data = c;
  c->answered = true;
  uv_read_stop((uv_stream_t *)&c->h);
  if (uv_write(&c->w, (uv_stream_t *)&c->h, &b, 1, http_written) != 0)
    uv_close((uv_handle_t *)&c->h, http_closed);
}

static void http_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  (void)b;
  http_conn_t *c = st->data;
  if (c->answered)
    return;
  if (nread < 0) {
    uv_close((uv_handle_t *)&c->h, http_closed);
    return;
  }
  c->n += (size_t)nread;
  c->in[c->n] = '\0';
  if (strstr(c->in, "\r\n\r\n") || strstr(c->in, "\n\n") || c->n >= sizeof c->in - 1)
    http_answer(c);
}

static void http_accept(uv_stream_t *srv, int status) {
  spn_server_t *s = srv->data;
  if (status < 0)
    return;
  http_conn_t *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->s = s;
  uv_tcp_init(&s->loop, &c->h);
  c->h.data = c;
  if (uv_accept(srv, (uv_stream_t *)&c->h) != 0 ||
      uv_read_start((uv_stream_t *)&c->h, http_alloc, http_read) != 0)
    uv_close((uv_handle_t *)&c->h, http_closed);
}

static int32_t http_start(spn_server_t *s, spn_error_t *err) {
  char host[128];
  const char *colon = strrchr(s->cfg->http, ':');
  if (!colon || colon == s->cfg->http || (size_t)(colon - s->cfg->http) >= sizeof host)
    return spn_error_set(err, SPN_ECONFIG, "server config: http \"%s\": expected HOST:PORT", s->cfg->http);
  snprintf(host, sizeof host, "%.*s", (int)(colon - s->cfg->http), s->cfg->http);
  char *end;
  long port = strtol(colon + 1, &end, 10);
  struct sockaddr_in addr;
  if (*end || port < 0 || port > 65535 || uv_ip4_addr(host, (int)port, &addr) != 0)
    return spn_error_set(err, SPN_ECONFIG, "server config: http \"%s\": expected IPv4-HOST:PORT", s->cfg->http);
  uv_tcp_init(&s->loop, &s->http);
  s->http.data = s;
  s->http_open = true;
  int r = uv_tcp_bind(&s->http, (const struct sockaddr *)&addr, 0);
  if (r == 0)
    r = uv_listen((uv_stream_t *)&s->http, 64, http_accept);
  if (r != 0)
    return spn_error_set(err, SPN_EIO, "server: http %s: %s", s->cfg->http, uv_strerror(r));
  return SPN_OK;
}

/* ---- life cycle ---- */

int32_t spn_server_new(const spn_server_config_t *cfg, const spn_job_runner_t *runner,
                       spn_server_t **out, spn_error_t *err) {
  *out = NULL;
  spn_server_t *s = calloc(1, sizeof *s);
  if (!s)
    return spn_error_set(err, SPN_ENOMEM, "server: out of memory");
  s->cfg = cfg;
  s->runner = runner;
  s->out_tail = &s->out;
  s->reports_tail = &s->reports;
  pthread_mutex_init(&s->wmu, NULL);
  pthread_cond_init(&s->wcond, NULL);
  pthread_mutex_init(&s->rmu, NULL);
  int32_t rc;
  /* Ready only when every pipeline the config names can run. */
  for (size_t i = 0; i < cfg->n_pipelines; i++)
    if (!runner->has_pipeline(runner->data, cfg->pipelines[i])) {
      rc = spn_error_set(err, SPN_ECONFIG, "server config: pipeline \"%s\" is not available",
                         cfg->pipelines[i]);
      goto out_free;
    }
  spn_queue_config_t qc = {.path = cfg->db_path, .backoff_base_ms = cfg->backoff_base_ms,
                           .backoff_max_ms = cfg->backoff_max_ms, .sync_full = cfg->sync_full};
  if ((rc = spn_queue_sqlite_open(&qc, &s->q, err)) < 0)
    goto out_free;
  s->zctx = zmq_ctx_new();
  if (!s->zctx) {
    rc = spn_error_set(err, SPN_EIO, "zmq: %s", zmq_strerror(zmq_errno()));
    goto out_queue;
  }
  if (cfg->curve_secret) {
    if (!cfg->curve_clients_dir) {
      rc = spn_error_set(err, SPN_ECONFIG, "server config: curve_secret_key needs curve_clients_dir");
      goto out_ctx;
    }
    if (pthread_create(&s->zap_th, NULL, zap_main, s) != 0) {
      rc = spn_error_set(err, SPN_EIO, "server: cannot start the ZAP thread");
      goto out_ctx;
    }
    s->zap_started = true;
    usleep(20000); /* the handler binds before any CURVE handshake can start */
  }
  s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
  if (!s->router || (rc = spn__proto_socket_setup(s->router, cfg->max_msg_size, err)) < 0) {
    rc = spn_error_set(err, SPN_EIO, "zmq ROUTER: %s", zmq_strerror(zmq_errno()));
    goto out_zap;
  }
  int hwm = 100000;
  zmq_setsockopt(s->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (cfg->curve_secret) {
    int one = 1;
    if (strlen(cfg->curve_secret) != 40 ||
        zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, cfg->curve_secret, 40) != 0 ||
        zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "spindle", 7) != 0) {
      rc = spn_error_set(err, SPN_ECONFIG, "server config: curve_secret_key: not a 40-character Z85 key (%s)",
                         zmq_strerror(zmq_errno()));
      goto out_sock;
    }
  }
  if (zmq_bind(s->router, cfg->bind) != 0) {
    rc = spn_error_set(err, SPN_EIO, "server: bind %s: %s", cfg->bind, zmq_strerror(zmq_errno()));
    goto out_sock;
  }
  if (uv_loop_init(&s->loop) != 0) {
    rc = spn_error_set(err, SPN_EIO, "server: uv_loop_init failed");
    goto out_sock;
  }
  int fd;
  size_t fsz = sizeof fd;
  zmq_getsockopt(s->router, ZMQ_FD, &fd, &fsz);
  uv_poll_init(&s->loop, &s->poll, fd);
  uv_timer_init(&s->loop, &s->timer);
  uv_async_init(&s->loop, &s->async, on_async);
  uv_signal_init(&s->loop, &s->sigint);
  uv_signal_init(&s->loop, &s->sigterm);
  s->poll.data = s->timer.data = s->async.data = s->sigint.data = s->sigterm.data = s;
  s->handles_open = true;
  if (cfg->http && (rc = http_start(s, err)) < 0)
    goto out_loop;
  s->nslots = cfg->workers;
  if (s->nslots) {
    s->slots = calloc(s->nslots, sizeof *s->slots);
    if (!s->slots) {
      rc = spn_error_set(err, SPN_ENOMEM, "server: out of memory");
      goto out_loop;
    }
  }
  for (uint32_t i = 0; i < s->nslots; i++) {
    slot_t *sl = &s->slots[i];
    sl->s = s;
    sl->idx = i;
    snprintf(sl->owner, sizeof sl->owner, "local:%d:%u", (int)getpid(), i);
    if (pthread_create(&sl->th, NULL, slot_main, sl) != 0) {
      rc = spn_error_set(err, SPN_EIO, "server: cannot start worker thread %u", i);
      goto out_loop;
    }
    sl->started = true;
  }
  *out = s;
  return SPN_OK;
out_loop:
  *out = s;
  spn_server_free(out);
  return rc;
out_sock:
  zmq_close(s->router);
out_zap:
  if (s->zap_started) {
    __atomic_store_n(&s->zap_quit, 1, __ATOMIC_RELEASE);
    pthread_join(s->zap_th, NULL);
  }
out_ctx:
  zmq_ctx_term(s->zctx);
out_queue:
  spn_queue_free(&s->q);
out_free:
  free(s);
  return rc;
}

int32_t spn_server_run(spn_server_t *s, spn_error_t *err) {
  uv_poll_start(&s->poll, UV_READABLE, on_poll);
  uv_timer_start(&s->timer, on_timer, TICK_MS, TICK_MS);
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  if (s->cfg->ready_fd >= 0) {
    char ep[256];
    size_t n = sizeof ep;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, ep, &n) != 0)
      snprintf(ep, sizeof ep, "%s", s->cfg->bind);
    dprintf(s->cfg->ready_fd, "spindle serve: ready on %s\n", ep);
  }
  /* Jobs left running by a previous instance come back when their leases
   * expire (sweep); queued ones are dispatched now. */
  on_timer(&s->timer);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  (void)err;
  return SPN_OK;
}

static void on_close(uv_handle_t *h) { (void)h; }

static void close_conn(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h) && h->type == UV_TCP)
    uv_close(h, http_closed);
}

static void stop_cb(spn_server_t *s) {
  uv_poll_stop(&s->poll);
  uv_timer_stop(&s->timer);
  uv_signal_stop(&s->sigint);
  uv_signal_stop(&s->sigterm);
  uv_close((uv_handle_t *)&s->poll, on_close);
  uv_close((uv_handle_t *)&s->timer, on_close);
  /* The async handle stays open (unreferenced, so uv_run returns) until the
   * worker threads are joined: they may still signal it. */
  uv_unref((uv_handle_t *)&s->async);
  uv_close((uv_handle_t *)&s->sigint, on_close);
  uv_close((uv_handle_t *)&s->sigterm, on_close);
  if (s->http_open) {
    uv_close((uv_handle_t *)&s->http, on_close);
    s->http_open = false;
  }
  /* Whatever is left are HTTP connections: close them so uv_run returns. */
  uv_walk(&s->loop, close_conn, s);
  s->handles_open = false;
}

void spn_server_stop(spn_server_t *s) {
  /* From any thread: flag and wake the loop; the async callback closes the
   * handles so uv_run returns. */
  __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
  uv_async_send(&s->async);
}

void spn_server_free(spn_server_t **sp) {
  spn_server_t *s = *sp;
  if (!s)
    return;
  *sp = NULL;
  pthread_mutex_lock(&s->wmu);
  s->wquit = true;
  for (uint32_t i = 0; i < s->nslots; i++)
    __atomic_store_n(&s->slots[i].cancel, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&s->wcond);
  pthread_mutex_unlock(&s->wmu);
  for (uint32_t i = 0; i < s->nslots; i++)
    if (s->slots[i].started)
      pthread_join(s->slots[i].th, NULL);
  /* Jobs our threads were running go back to the queue without costing an
   * attempt: the gateway stopped them, they did not fail. (After a crash the
   * same jobs come back when their leases expire, attempt counted.) */
  int64_t now = spn__now_ms();
  for (size_t i = 0; i < s->nruns; i++)
    if (s->runs[i].slot >= 0)
      s->q.ops->release(s->q.impl, s->runs[i].id, s->runs[i].attempt, s->runs[i].owner,
                        "gateway shut down", now, NULL);
  if (s->handles_open)
    stop_cb(s);
  if (!uv_is_closing((uv_handle_t *)&s->async))
    uv_close((uv_handle_t *)&s->async, on_close);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  uv_loop_close(&s->loop);
  report_t *r = s->reports;
  while (r) {
    report_t *n = r->next;
    free(r);
    r = n;
  }
  outmsg_t *m = s->out;
  while (m) {
    outmsg_t *n = m->next;
    cJSON_Delete(m->body);
    free(m);
    m = n;
  }
  zmq_close(s->router);
  if (s->zap_started) {
    __atomic_store_n(&s->zap_quit, 1, __ATOMIC_RELEASE);
    pthread_join(s->zap_th, NULL);
  }
  zmq_ctx_term(s->zctx);
  spn_queue_free(&s->q);
  free(s->slots);
  free(s->workers);
  free(s->runs);
  free(s->watchers);
  pthread_mutex_destroy(&s->wmu);
  pthread_cond_destroy(&s->wcond);
  pthread_mutex_destroy(&s->rmu);
  free(s);
}
