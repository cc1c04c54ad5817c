/* queue-worker.c — a stateless worker that leases straight from a shared
 * queue (`spindle worker --queue redis://...`): no gateway in the path.
 *
 * Invariants:
 * - The worker holds nothing the queue does not: every job it runs is a
 *   lease in the queue, renewed every lease_ms/3. Killed at any moment, its
 *   leases expire (the pending entries go idle) and any other worker's or
 *   gateway's sweep puts the jobs back: nothing is lost. Publication is
 *   exactly once (exec.c): a re-run after a lost lease finds the marker of
 *   an attempt that had already published and does not write again.
 * - Each slot leases under its own owner name ("worker:<name>:<slot>"), so a
 *   lease identifies the one thread running it.
 * - A renew that fails (lease lost, or a cancel was requested) stops the job
 *   on its slot; its report is then stale and the queue ignores it.
 * - Every worker also sweeps (atomic in the queue), so expired leases come
 *   back even when no gateway runs.
 * - SIGTERM drains: no new leases; running jobs get drain_grace_s to finish,
 *   then they are stopped and released (attempt not counted); exit 0.
 * Thread: everything here runs on the caller's thread; jobs run on the slot
 * pool's threads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jobs-internal.h"
#include "observe.h"

typedef struct qrun {
  bool busy;
  int64_t id;
  uint32_t attempt;
  uint64_t done, total;
  double progress_at; /* last progress written to the queue */
  bool no_outputs;    /* no publication marker to remove at the end */
  bool segmented;     /* a segment or a segmented job (spn__job_is_segmented) */
  bool join;          /* a segmented job's join: its warnings are its segments' */
  char pipeline[64];  /* for the metrics */
  double since;       /* spn__mono_s() at the lease */
} qrun_t;

typedef struct qw {
  const spn_worker_config_t *cfg;
  spn_queue_t q;
  spn_slot_pool_t *pool;
  qrun_t *runs;
  char (*owner)[192];
  char *pipelines; /* what it leases (spn__runner_pipelines); NULL: any */
  char instance[17]; /* this process: tells it from another of its name */
  int64_t since;     /* when it started (ms): of two processes of one name, the later one yields */
  int64_t quiet_at;  /* "at" of the record of its name that claim_name saw go quiet (a killed process's) */
  bool clash_said;   /* warned that a later process of its name writes its record */
  char last_error[SPN_ERROR_MSG_MAX];
  double queue_down; /* since when a lease or a sweep fails (monotonic s; 0: they do not) */
  const char *name;  /* its --name (or host:pid:random), for log lines */
  spn__observe_t *obs; /* lifecycle log lines; owned by q's wrapper */
  spn__wobs_t *wobs;   /* metrics and probes (--http) */
  /* A run was abandoned inside a stage's call (spn_exec_result_t.wedged):
   * why; then this worker drains and stops with that error. */
  char wedged[SPN_ERROR_MSG_MAX];
} qw_t;

static void say_error(qw_t *w, const char *msg) {
  /* once per distinct message, not on every poll */
  if (strncmp(w->last_error, msg, sizeof w->last_error - 1) != 0) {
    snprintf(w->last_error, sizeof w->last_error, "%s", msg);
    spn__log_f(spn__observe_logger(w->obs), SPN_LOG_ERROR, NULL, "%s", msg);
  }
}

/* A lease or a sweep failed (the queue does not answer, or refuses). */
static void queue_failed(qw_t *w, const char *msg) {
  if (!w->queue_down)
    w->queue_down = spn__mono_s();
  say_error(w, msg);
}

/* A lease or a sweep went through: after failures, say so once. */
static void queue_answered(qw_t *w) {
  if (!w->queue_down)
    return;
  spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
  lf.worker = w->name;
  spn__log_f(spn__observe_logger(w->obs), SPN_LOG_INFO, &lf, "the job queue answers again (after %.0f s)",
             spn__mono_s() - w->queue_down);
  w->queue_down = 0;
  w->last_error[0] = '\0'; /* the next failure is said again */
}

static void unlink_now(void *user, char *path) {
  (void)user;
  unlink(path); /* already gone (another worker got there first) is fine */
  free(path);
}

/* A sweep handed us a succeeded job whose marker nobody removed. */
static void swept(void *user, int64_t id, spn_queue_state_t st) {
  qw_t *w = user;
  if (st == SPN_QSTATE_SUCCEEDED)
    spn__unpublish(&w->q, id);
}

/* Record a finished run. Returns false when the queue could not be reached:
 * the caller keeps the report and tries again. */
static bool finish(qw_t *w, uint32_t slot, const spn_exec_result_t *res) {
  qrun_t *r = &w->runs[slot];
  spn_error_t err = SPN_ERROR_INIT;
  int64_t now = spn__now_ms();
  int32_t rc;
  if (r->total)
    w->q.ops->progress(w->q.impl, r->id, r->done, r->total, NULL);
  if (res->status == SPN_OK) {
    rc = w->q.ops->complete(w->q.impl, r->id, r->attempt, w->owner[slot], res->compute_s, res->gpu_s,
                            &res->xfer, res->warnings, now, &err);
    if (rc == SPN_OK && !r->no_outputs) /* else no marker: saves a read */
      spn__unpublish(&w->q, r->id);
  } else {
    spn_queue_state_t st;
    char reason[SPN_ERROR_MSG_MAX + 300];
    spn_fail_how_t how = spn__fail_how(res->status);
    snprintf(reason, sizeof reason, "%s: %s%s", w->owner[slot], res->error,
             how == SPN_FAIL_FINAL ? SPN_FAIL_FINAL_NOTE : "");
    rc = w->q.ops->fail(w->q.impl, r->id, r->attempt, w->owner[slot], reason, how, res->compute_s, res->gpu_s,
                        &res->xfer, now, &st, &err);
  }
  if (rc == SPN_EIO) {
    say_error(w, err.msg);
    return false;
  }
  if (res->wedged && !w->wedged[0]) {
    snprintf(w->wedged, sizeof w->wedged, "%s", res->error);
    spn__log_f(spn__observe_logger(w->obs), SPN_LOG_ERROR, NULL, "stopping: %s", w->wedged);
    spn__wobs_wedged(w->wobs, w->wedged);
  }
  /* No gateway sees this job end: its segment files go here. */
  if (rc == SPN_OK && r->segmented)
    spn__segments_spent(&w->q, r->id, unlink_now, NULL);
  if (rc < 0 && rc != SPN_ESTATE)
    spn__log_f(spn__observe_logger(w->obs), SPN_LOG_ERROR,
               &(spn__log_fields_t){.job_id = (uint64_t)r->id, .attempt = -1, .duration_ms = -1}, "%s", err.msg);
  /* a join by its segments' warnings, as the gateway counts it */
  bool warned = res->warnings[0] != '\0' ||
                (rc == SPN_OK && res->status == SPN_OK && r->join && spn__segments_warned(&w->q, r->id));
  r->busy = false;
  spn__slot_pool_set_idle(w->pool, slot);
  spn__wobs_busy(w->wobs, -1);
  spn__wobs_job_end(w->wobs, r->pipeline, spn__mono_s() - r->since, res->status, warned);
  return true;
}

/* Lease for every idle slot. Returns false when the queue had nothing (or
 * could not be reached): the caller waits before asking again. */
static bool lease_some(qw_t *w) {
  for (;;) {
    int32_t slot = spn__slot_pool_idle(w->pool);
    if (slot < 0)
      return true;
    spn_queue_job_t j;
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = w->q.ops->lease(w->q.impl, w->owner[slot], w->pipelines, spn__now_ms(), w->cfg->lease_ms, &j,
                                 &err);
    if (rc == SPN_EAGAIN) { /* nothing to lease: the queue answered */
      queue_answered(w);
      return false;
    }
    if (rc < 0) {
      queue_failed(w, err.msg);
      return false;
    }
    queue_answered(w);
    qrun_t *r = &w->runs[slot];
    bool segmented = spn__job_is_segmented(&j);
    *r = (qrun_t){.busy = true, .id = j.id, .attempt = j.attempts, .segmented = segmented,
                  .join = segmented && !j.parent, .since = spn__mono_s()};
    cJSON *spec = cJSON_Parse(j.spec_json);
    spn_job_spec_t js;
    rc = spec ? spn__job_spec_from_json(spec, j.id, j.attempts, &js, &err)
              : spn_error_set(&err, SPN_EPARSE, "stored spec is not JSON");
    cJSON_Delete(spec);
    spn__queue_job_clear(&j);
    if (rc < 0) {
      spn_exec_result_t res = {.status = rc};
      snprintf(res.error, sizeof res.error, "%s", err.msg);
      finish(w, (uint32_t)slot, &res); /* the slot never ran it */
      continue;
    }
    r->no_outputs = js.n_outputs == 0;
    snprintf(r->pipeline, sizeof r->pipeline, "%s", js.pipeline ? js.pipeline : "");
    spn__slot_pool_assign(w->pool, (uint32_t)slot, &js);
    spn__wobs_busy(w->wobs, 1);
  }
}

static void renew_all(qw_t *w) {
  int64_t now = spn__now_ms();
  for (uint32_t i = 0; i < w->cfg->slots; i++) {
    qrun_t *r = &w->runs[i];
    if (!r->busy)
      continue;
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = w->q.ops->renew(w->q.impl, r->id, r->attempt, w->owner[i], now, w->cfg->lease_ms, &err);
    if (rc == SPN_ESTATE || rc == SPN_ECANCELLED)
      spn__slot_pool_cancel(w->pool, i); /* lease lost or cancel requested: stop it */
    else if (rc < 0)
      say_error(w, err.msg);
    else if (r->total && spn__mono_s() - r->progress_at >= 1.0) {
      r->progress_at = spn__mono_s();
      w->q.ops->progress(w->q.impl, r->id, r->done, r->total, NULL);
    }
  }
}

/* Apply reports; finished ones the queue could not take stay for later. */
static spn_slot_report_t *apply(qw_t *w, spn_slot_report_t *r) {
  spn_slot_report_t *keep = NULL, **tail = &keep;
  while (r) {
    spn_slot_report_t *next = r->next;
    r->next = NULL;
    qrun_t *run = &w->runs[r->slot];
    bool done = true;
    if (r->kind == SPN_SLOT_PROGRESS) {
      if (run->busy && run->id == r->id && run->attempt == r->attempt) {
        run->done = r->done;
        run->total = r->total;
      }
    } else {
      done = finish(w, r->slot, &r->res);
    }
    if (done) {
      free(r);
    } else {
      *tail = r;
      tail = &r->next;
    }
    r = next;
  }
  return keep;
}

static uint32_t running(const qw_t *w) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < w->cfg->slots; i++)
    n += w->runs[i].busy;
  return n;
}

static void ignore_roster(void *user, const char *key, const char *record) {
  (void)user;
  (void)key;
  (void)record;
}

/* A queue that does not answer at start-up (a Redis not there yet, as when
 * a deployment starts every pod at once) is waited for up to queue_wait_s:
 * /readyz says so, one line says why (again when the reason changes), and
 * the worker leases nothing meanwhile. SPN_OK with the queue answering, or
 * stopped (SIGTERM, SIGINT); an error when the wait is over. */
static int32_t wait_for_queue(qw_t *w, const char *name, spn_error_t *err) {
  double start = spn__mono_s();
  char said[SPN_ERROR_MSG_MAX] = "";
  spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
  lf.worker = name;
  for (;;) {
    spn_error_t e = SPN_ERROR_INIT;
    if (w->q.ops->roster_get(w->q.impl, name, ignore_roster, NULL, &e) == SPN_OK) {
      if (said[0])
        spn__log_f(spn__observe_logger(w->obs), SPN_LOG_INFO, &lf, "the job queue answers (after %.0f s)",
                   spn__mono_s() - start);
      spn__wobs_queue_wait(w->wobs, false);
      return SPN_OK;
    }
    double waited = spn__mono_s() - start;
    if (waited >= w->cfg->queue_wait_s)
      return spn_error_set(err, SPN_EIO, "worker: no answer from the job queue in %u s (--queue-wait): %s",
                           w->cfg->queue_wait_s, e.msg);
    if (strcmp(said, e.msg) != 0) {
      snprintf(said, sizeof said, "%s", e.msg);
      spn__wobs_queue_wait(w->wobs, true);
      spn__log_f(spn__observe_logger(w->obs), SPN_LOG_WARN, &lf, "waiting for the job queue, up to %u s "
                 "(--queue-wait): %s", w->cfg->queue_wait_s, e.msg);
    }
    for (int i = 0; i < 4; i++) {
      if ((w->cfg->stop && *w->cfg->stop) || (w->cfg->stop_now && *w->cfg->stop_now))
        return SPN_OK;
      struct timespec ts = {0, 50L * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
}

/* At the start: is the name ours? A live record of another process names
 * either a process that runs (it renews the record every SPN_PRESENCE_MS)
 * or one killed lately (it never will). Wait one renewal to tell which. */
static int32_t claim_name(qw_t *w, const char *name, spn_error_t *err) {
  char key[160];
  snprintf(key, sizeof key, "worker:%s", name);
  spn_roster_other_t n;
  if (!spn__roster_other(&w->q, key, w->instance, spn__now_ms(), &n) || !n.live)
    return SPN_OK;
  spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
  lf.worker = name;
  spn__log_f(spn__observe_logger(w->obs), SPN_LOG_INFO, &lf,
             "another process of this name was heard %.1f s ago; waiting up to %.1f s to see whether it still runs",
             (double)(spn__now_ms() - n.at) / 1000.0, SPN_PRESENCE_MS / 1000.0 + 1.5);
  int64_t first = n.at;
  for (double end = spn__mono_s() + SPN_PRESENCE_MS / 1000.0 + 1.5; spn__mono_s() < end;) {
    if ((w->cfg->stop && *w->cfg->stop) || (w->cfg->stop_now && *w->cfg->stop_now))
      return SPN_OK;
    struct timespec ts = {0, 250L * 1000000L};
    nanosleep(&ts, NULL);
    if (spn__roster_other(&w->q, key, w->instance, spn__now_ms(), &n) && n.at > first)
      return spn_error_set(err, SPN_EEXIST,
                           "worker: the name \"%s\" is taken by another worker process on the queue (heard %.1f s "
                           "ago); give each worker its own --name",
                           name, (double)(spn__now_ms() - n.at) / 1000.0);
  }
  w->quiet_at = first;
  return SPN_OK; /* it went quiet: it was killed, and the name is ours */
}

/* Its record in the queue's roster ("worker:NAME"), for spindle workers on
 * any gateway; removed (draining false and gone true) when it stops.
 * Before it writes, it reads: a record of another process written since
 * its last write (not the quiet one claim_name took the name from) means
 * two run under one name (they started together, so neither saw the other
 * at the start); the later one yields: false. */
static bool roster(qw_t *w, const char *name, bool draining, bool gone) {
  if (!w->q.ops->roster_put)
    return true;
  char key[160];
  snprintf(key, sizeof key, "worker:%s", name);
  spn_roster_other_t n;
  if (!gone && spn__roster_other(&w->q, key, w->instance, spn__now_ms(), &n) && n.live && n.at != w->quiet_at) {
    if (n.since < w->since || (n.since == w->since && strcmp(n.instance, w->instance) < 0))
      return false;
    if (!w->clash_said) {
      w->clash_said = true;
      spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
      lf.worker = name;
      spn__log_f(spn__observe_logger(w->obs), SPN_LOG_WARN, &lf,
                 "another worker process, started later, uses this name; it stops (give each worker its own --name)");
    }
  }
  spn_roster_entry_t e = {.kind = "queue", .slots = w->cfg->slots, .running = running(w), .draining = draining,
                          .pipelines = w->pipelines, .instance = w->instance, .since = w->since};
  char *rec = gone ? NULL : spn__roster_record(&e, spn__now_ms());
  const char *k = key, *r = rec;
  spn_error_t err = SPN_ERROR_INIT;
  if (!gone && !rec)
    say_error(w, "roster of workers: out of memory");
  else if (w->q.ops->roster_put(w->q.impl, 1, &k, &r, &err) < 0)
    say_error(w, err.msg);
  cJSON_free(rec);
  return true;
}

int32_t spn_queue_worker_run(const spn_worker_config_t *cfg, const spn_job_runner_t *runner,
                             spn_error_t *err) {
  if (cfg->slots == 0 || cfg->slots > 1024)
    return spn_error_set(err, SPN_EINVAL, "worker: slots must be 1-1024");
  if (cfg->lease_ms < 100)
    return spn_error_set(err, SPN_EINVAL, "worker: lease_ms must be at least 100");
  qw_t w = {.cfg = cfg};
  char name[128];
  spn__worker_identity(cfg->name, name, w.instance);
  w.name = name;
  int32_t rc = spn_queue_open(cfg->queue, &w.q, err);
  if (rc < 0)
    return spn_error_prefix(err, "worker");
  if ((rc = spn__observe_attach(&w.q, "spindle worker", &w.obs, err)) < 0) {
    spn_queue_free(&w.q);
    return rc;
  }
  w.runs = calloc(cfg->slots, sizeof *w.runs);
  w.owner = calloc(cfg->slots, sizeof *w.owner);
  if (!w.runs || !w.owner) {
    rc = spn_error_set(err, SPN_ENOMEM, "worker: out of memory");
    goto out;
  }
  for (uint32_t i = 0; i < cfg->slots; i++)
    snprintf(w.owner[i], sizeof w.owner[i], "worker:%s:%u", name, i);
  if ((rc = spn__slot_pool_new(cfg->slots, runner, NULL, NULL, &w.pool, err)) < 0) {
    spn_error_prefix(err, "worker");
    goto out;
  }
  if ((rc = spn__wobs_new(runner, cfg->slots, cfg->http, &w.wobs, err)) < 0) {
    spn_error_prefix(err, "worker");
    goto out;
  }
  spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
  lf.worker = name;
  /* Only jobs of the pipelines it runs: in a farm whose workers load
   * different pipelines, a job waits for a worker that has its pipeline
   * instead of failing its attempts on the others. */
  w.pipelines = spn__runner_pipelines(runner);
  w.since = spn__now_ms();
  if ((rc = wait_for_queue(&w, name, err)) < 0 || (rc = claim_name(&w, name, err)) < 0)
    goto out;
  char pipes[512];
  spn__pipeline_filter_describe(w.pipelines, pipes, sizeof pipes);
  spn__log_f(spn__observe_logger(w.obs), SPN_LOG_INFO, &lf, "worker leasing from %s queue %s with %u slots, "
             "pipelines: %s", w.q.ops->name, cfg->queue->url ? cfg->queue->url : "", cfg->slots, pipes);
  double renew_every = cfg->lease_ms / 3000.0, sweep_every = cfg->lease_ms / 2000.0;
  double last_renew = spn__mono_s(), last_sweep = 0, last_presence = 0, drain_until = 0;
  bool draining = false, said_draining = false, clash = false;
  uint32_t wait_ms = 1;  /* between lease attempts: doubles up to 50 while the queue is empty */
  double next_lease = 0;
  spn_slot_report_t *pending = NULL;
  for (;;) {
    double mono = spn__mono_s();
    if (cfg->stop_now && *cfg->stop_now)
      break;
    if (((cfg->stop && *cfg->stop) || w.wedged[0]) && !draining) {
      draining = true;
      spn__wobs_draining(w.wobs);
      drain_until = mono + cfg->drain_grace_s;
      spn__log_f(spn__observe_logger(w.obs), SPN_LOG_INFO, &lf, "worker draining (%u running; up to %u s)",
                 running(&w), cfg->drain_grace_s);
    }
    if (draining && (running(&w) == 0 || mono >= drain_until))
      break;
    /* reports first: a finished slot can lease again at once */
    spn_slot_report_t *r = spn__slot_pool_take(w.pool);
    if (pending) {
      spn_slot_report_t **t = &pending;
      while (*t)
        t = &(*t)->next;
      *t = r;
      r = pending;
    }
    bool busy_before = running(&w) > 0;
    pending = apply(&w, r);
    if (!draining && mono >= next_lease) {
      if (lease_some(&w)) {
        wait_ms = 1;
      } else {
        wait_ms = wait_ms < 50 ? wait_ms * 2 : 50;
        next_lease = mono + wait_ms / 1000.0;
      }
    }
    if (mono - last_renew >= renew_every) {
      last_renew = mono;
      renew_all(&w);
    }
    /* that its pipelines have a worker, busy or not (a queued job's
     * status says when none has) */
    if (mono - last_presence >= SPN_PRESENCE_MS / 1000.0 || (draining && !said_draining)) {
      last_presence = mono;
      spn_error_t e = SPN_ERROR_INIT;
      if (!draining && w.q.ops->present(w.q.impl, w.pipelines, spn__now_ms(), &e) < 0)
        say_error(&w, e.msg);
      if (!roster(&w, name, draining, false)) {
        clash = true; /* another process, started first, has the name: stop, as for SIGTERM without grace */
        break;
      }
      said_draining = draining;
    }
    if (mono - last_sweep >= sweep_every) {
      last_sweep = mono;
      spn_error_t e = SPN_ERROR_INIT;
      if (w.q.ops->sweep(w.q.impl, spn__now_ms(), swept, &w, &e) < 0)
        queue_failed(&w, e.msg);
      else
        queue_answered(&w);
    }
    /* Reports are picked up every millisecond while jobs run; the queue is
     * asked for work at most every wait_ms while it is empty. */
    bool active = busy_before || running(&w) > 0;
    struct timespec ts = {0, (active ? 1L : (long)wait_ms) * 1000000L};
    nanosleep(&ts, NULL);
  }
  /* Stop what still runs; record what finished; release the rest without
   * counting an attempt (we stopped it; it did not fail). */
  spn__slot_pool_stop(w.pool);
  spn_slot_report_t *r = spn__slot_pool_take(w.pool);
  if (pending) {
    spn_slot_report_t **t = &pending;
    while (*t)
      t = &(*t)->next;
    *t = r;
    r = pending;
  }
  while (r) {
    spn_slot_report_t *next = r->next;
    if (r->kind == SPN_SLOT_FINISHED && r->res.status == SPN_OK && w.runs[r->slot].busy)
      finish(&w, r->slot, &r->res);
    free(r);
    r = next;
  }
  int64_t now = spn__now_ms();
  uint32_t released = 0;
  for (uint32_t i = 0; i < cfg->slots; i++)
    if (w.runs[i].busy) {
      if (w.q.ops->release(w.q.impl, w.runs[i].id, w.runs[i].attempt, w.owner[i], "worker stopped", now,
                           NULL) == SPN_OK)
        released++;
      w.runs[i].busy = false;
    }
  if (released)
    spn__log_f(spn__observe_logger(w.obs), SPN_LOG_INFO, &lf, "worker stopped: %u job(s) back to the queue", released);
  if (w.wedged[0]) {
    rc = spn_error_set(err, SPN_ESTATE, "worker stopped: %s", w.wedged);
    roster(&w, name, false, true);
  } else if (clash) /* the record is the other process's */
    rc = spn_error_set(err, SPN_EEXIST,
                       "worker: the name \"%s\" is taken by another worker process on the queue, started before "
                       "this one; give each worker its own --name",
                       name);
  else
    roster(&w, name, false, true);
out:
  spn__slot_pool_free(&w.pool);
  spn__wobs_free(&w.wobs);
  free(w.runs);
  free(w.owner);
  free(w.pipelines);
  spn_queue_free(&w.q);
  return rc;
}
