/* sched.c — the gateway's scheduling: which job runs where.
 *
 * Invariants:
 * - A job is leased from the queue only when a place to run it is free: an
 *   idle local slot first, then a remote worker with credit (round robin).
 * - The runs table mirrors the leases this gateway handed out (id, attempt,
 *   owner). A job is reported complete only with the (id, attempt, owner) of
 *   its live lease; anything else is stale and the queue refuses it.
 * - Leases: local jobs are renewed by the loop's timer (here), remote jobs by
 *   their worker's HEARTBEAT (remote.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "server-internal.h"

/* ---- tables ---- */

spn_run_t *spn__run_find(spn_server_t *s, int64_t id) {
  for (size_t i = 0; i < s->nruns; i++)
    if (s->runs[i].id == id)
      return &s->runs[i];
  return NULL;
}

void spn__run_remove(spn_server_t *s, int64_t id) {
  for (size_t i = 0; i < s->nruns; i++)
    if (s->runs[i].id == id) {
      s->runs[i] = s->runs[--s->nruns];
      return;
    }
}

spn_run_t *spn__run_add(spn_server_t *s) {
  if (s->nruns == s->caprun) {
    size_t cap = s->caprun ? s->caprun * 2 : 16;
    spn_run_t *nv = realloc(s->runs, cap * sizeof *nv);
    if (!nv)
      return NULL;
    s->runs = nv;
    s->caprun = cap;
  }
  spn_run_t *r = &s->runs[s->nruns++];
  memset(r, 0, sizeof *r);
  return r;
}

static void unlink_after_commit(spn_server_t *s, char *path);

/* ---- segments ---- */

static void unlink_cb(void *user, char *path) { unlink_after_commit(user, path); }

/* Segment files that can no longer be used go once this batch commits;
 * the segmented job's watchers hear of a segment's end. */
void spn__segments_settle(spn_server_t *s, int64_t id) {
  if (!s->q.ops->children)
    return;
  int64_t parent = spn__segments_spent(&s->q, id, unlink_cb, s);
  if (parent)
    spn__notify(s, parent);
}

void spn__sched_changed(void *user, int64_t id, spn_queue_state_t st) {
  spn_server_t *s = user;
  spn__segments_settle(s, id);
  if (st == SPN_QSTATE_SUCCEEDED) {
    /* a sweep handed us a succeeded job whose marker nobody removed */
    spn__unpublish(&s->q, id);
    return;
  }
  spn_run_t *r = spn__run_find(s, id);
  if (r) {
    /* The lease is gone (expired or its worker was lost): stop a local run. */
    if (r->slot >= 0)
      spn__slot_pool_cancel(s->pool, (uint32_t)r->slot);
    spn__run_remove(s, id);
  }
  spn__notify(s, id);
}

/* ---- dispatch ---- */

/* The job is recorded succeeded once this batch commits: its publication
 * marker (exec.c) can go then, not before — a re-run before the commit must
 * still find it. */
static void unpublish_after_commit(spn_server_t *s, int64_t id) {
  if (s->q.ops->unpublished) {
    /* A shared queue records each call at once (no batch): remove it now. */
    spn__unpublish(&s->q, id);
    return;
  }
  char *marker = spn__publish_marker_of(&s->q, id);
  if (marker)
    unlink_after_commit(s, marker);
}

/* Ownership: consumes path. */
static void unlink_after_commit(spn_server_t *s, char *path) {
  char *marker = path;
  if (!marker)
    return;
  if (s->nunpublish == s->capunpublish) {
    size_t cap = s->capunpublish ? s->capunpublish * 2 : 16;
    char **nv = realloc(s->unpublish, cap * sizeof *nv);
    if (!nv) {
      free(marker); /* left behind: harmless, the job is done */
      return;
    }
    s->unpublish = nv;
    s->capunpublish = cap;
  }
  s->unpublish[s->nunpublish++] = marker;
}

void spn__sched_committed(spn_server_t *s, bool ok) {
  for (size_t i = 0; i < s->nunpublish; i++) {
    if (ok)
      unlink(s->unpublish[i]);
    free(s->unpublish[i]);
  }
  s->nunpublish = 0;
}

void spn__sched_finish(spn_server_t *s, int64_t id, uint32_t attempt, const char *owner,
                       const spn_exec_result_t *res) {
  spn_error_t err = SPN_ERROR_INIT;
  int64_t now = spn__now_ms();
  int32_t rc;
  spn_run_t *live = spn__run_find(s, id);
  bool no_outputs = live && live->attempt == attempt && live->no_outputs;
  if (live && live->attempt == attempt && !strcmp(live->owner, owner) && live->total)
    s->q.ops->progress(s->q.impl, id, live->done, live->total, NULL);
  if (res->status == SPN_OK) {
    rc = s->q.ops->complete(s->q.impl, id, attempt, owner, res->compute_s, res->gpu_s, &res->xfer,
                            res->warnings, now, &err);
  } else {
    spn_queue_state_t st;
    spn_fail_how_t how = spn__fail_how(res->status);
    char reason[SPN_ERROR_MSG_MAX + 100];
    snprintf(reason, sizeof reason, "%s%s", res->error, how == SPN_FAIL_FINAL ? SPN_FAIL_FINAL_NOTE : "");
    rc = s->q.ops->fail(s->q.impl, id, attempt, owner, reason, how, res->compute_s, res->gpu_s, &res->xfer, now,
                        &st, &err);
  }
  if (rc < 0 && rc != SPN_ESTATE)
    spn__log_f(spn__observe_logger(s->obs), SPN_LOG_ERROR, &(spn__log_fields_t){.job_id = (uint64_t)id, .attempt = -1, .duration_ms = -1}, "%s", err.msg);
  if (rc == SPN_OK && res->status == SPN_OK && !no_outputs) /* else no marker: saves a read */
    unpublish_after_commit(s, id);
  spn_run_t *r = spn__run_find(s, id);
  /* Not this gateway's run (a report after a restart): look it up. */
  bool segmented = r ? r->segmented : true;
  if (r && r->attempt == attempt && !strcmp(r->owner, owner))
    spn__run_remove(s, id);
  if (rc == SPN_OK && segmented)
    spn__segments_settle(s, id);
  spn__notify(s, id);
}

static bool assign_local(spn_server_t *s, uint32_t slot, spn_queue_job_t *j) {
  cJSON *spec = cJSON_Parse(j->spec_json);
  spn_job_spec_t js;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spec ? spn__job_spec_from_json(spec, j->id, j->attempts, &js, &err)
                    : spn_error_set(&err, SPN_EPARSE, "stored spec is not JSON");
  cJSON_Delete(spec);
  if (rc < 0) {
    spn_exec_result_t res = {.status = rc};
    snprintf(res.error, sizeof res.error, "%s", err.msg);
    spn__sched_finish(s, j->id, j->attempts, s->slot_owner[slot], &res);
    return false;
  }
  spn_run_t *r = spn__run_add(s);
  if (!r) {
    spn__job_spec_free(&js);
    return false;
  }
  r->id = j->id;
  r->attempt = j->attempts;
  r->segmented = spn__job_is_segmented(j);
  r->slot = (int)slot;
  r->worker = -1;
  r->no_outputs = js.n_outputs == 0;
  snprintf(r->owner, sizeof r->owner, "%s", s->slot_owner[slot]);
  spn__slot_pool_assign(s->pool, slot, &js);
  return true;
}

static void assign_remote(spn_server_t *s, size_t wi, spn_queue_job_t *j) {
  spn_rworker_t *w = &s->workers[wi];
  cJSON *b = cJSON_CreateObject();
  cJSON *spec = cJSON_Parse(j->spec_json);
  spn_run_t *r = spn__run_add(s);
  if (!b || !spec || !r) {
    cJSON_Delete(b);
    cJSON_Delete(spec);
    if (r)
      s->nruns--;
    return; /* the lease expires and the job runs again */
  }
  r->id = j->id;
  r->attempt = j->attempts;
  r->segmented = spn__job_is_segmented(j);
  r->slot = -1;
  r->worker = (int64_t)wi;
  const cJSON *outs = cJSON_GetObjectItemCaseSensitive(spec, "outputs");
  r->no_outputs = !cJSON_IsObject(outs) || !outs->child;
  snprintf(r->owner, sizeof r->owner, "%s", w->owner);
  cJSON_AddNumberToObject(b, "id", (double)j->id);
  cJSON_AddNumberToObject(b, "attempt", j->attempts);
  cJSON_AddNumberToObject(b, "lease_ms", s->cfg->lease_ms);
  cJSON_AddItemToObject(b, "spec", spec);
  w->credit--;
  spn__out_push(s, w->ident, w->ident_len, "JOB", b, true);
}

/* Lease one job for `owner` (pipelines: what it runs, NULL any): 1 leased
 * into *j, 0 none for it, -1 the queue failed (logged). */
static int lease_for(spn_server_t *s, const char *owner, const char *pipelines, spn_queue_job_t *j) {
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = s->q.ops->lease(s->q.impl, owner, pipelines, spn__now_ms(), s->cfg->lease_ms, j, &err);
  if (rc == SPN_EAGAIN)
    return 0;
  if (rc < 0) {
    spn__queue_log(s, SPN_LOG_ERROR, "%s", err.msg);
    return -1;
  }
  return 1;
}

/* Hand queued jobs to idle local slots, else to remote workers with
 * credit, round robin; each takes only jobs of the pipelines it runs (the
 * gateway's runner's for its own slots), so a job no free worker runs stays
 * queued, in its place, and does not hold back the jobs behind it. */
static void dispatch(spn_server_t *s) {
  if (s->stopping || s->draining)
    return;
  for (;;) {
    spn_queue_job_t j;
    int32_t sl = s->wedged[0] ? -1 : spn__slot_pool_idle(s->pool);
    int got = sl >= 0 ? lease_for(s, s->slot_owner[sl], s->pipelines, &j) : 0;
    if (got < 0 || (sl >= 0 && !got && !s->pipelines))
      return; /* the queue failed, or has no job for anyone */
    if (got) {
      assign_local(s, (uint32_t)sl, &j);
    } else {
      size_t wi = SIZE_MAX;
      for (size_t k = 0; k < s->nworkers && wi == SIZE_MAX; k++) {
        size_t i = (s->rr + k) % s->nworkers;
        spn_rworker_t *w = &s->workers[i];
        if (!w->alive || w->credit <= 0)
          continue;
        int took = lease_for(s, w->owner, w->pipelines, &j);
        if (took < 0 || (!took && !w->pipelines))
          return; /* the queue failed, or has no job for anyone */
        if (took) {
          wi = i;
          s->rr = i + 1;
        }
      }
      if (wi == SIZE_MAX)
        return;
      assign_remote(s, wi, &j);
    }
    spn__notify(s, j.id);
    spn__queue_job_clear(&j);
  }
}

void spn__sched_dispatch(spn_server_t *s) {
  dispatch(s);
  /* After the jobs went out: a job that a worker which just came took is
   * running, and its watchers need no line that it waits for a free one. */
  if (s->waiting_check) {
    s->waiting_check = false;
    spn__gateway_watch_waiting(s, spn__now_ms());
  }
}

void spn__sched_cancel_run(spn_server_t *s, spn_run_t *r) {
  if (r->slot >= 0) {
    spn__slot_pool_cancel(s->pool, (uint32_t)r->slot);
  } else if (r->worker >= 0 && (size_t)r->worker < s->nworkers) {
    spn_rworker_t *w = &s->workers[r->worker];
    cJSON *b = cJSON_CreateObject();
    if (!b)
      return;
    cJSON_AddNumberToObject(b, "id", (double)r->id);
    cJSON_AddNumberToObject(b, "attempt", r->attempt);
    spn__out_push(s, w->ident, w->ident_len, "CANCEL", b, true);
  }
}

void spn__sched_renew_local(spn_server_t *s, int64_t now) {
  for (size_t i = 0; i < s->nruns; i++) {
    spn_run_t *r = &s->runs[i];
    if (r->slot < 0)
      continue;
    spn_error_t err = SPN_ERROR_INIT;
    /* Lease lost, or a cancel came through another gateway: stop the job.
     * The queue unreachable (SPN_EIO): keep running; should the lease expire
     * meanwhile the job runs again, and publishes only once (exec.c). */
    int32_t rc = s->q.ops->renew(s->q.impl, r->id, r->attempt, r->owner, now, s->cfg->lease_ms, &err);
    if (rc == SPN_ESTATE || rc == SPN_ECANCELLED)
      spn__slot_pool_cancel(s->pool, (uint32_t)r->slot);
  }
}

/* Add name (len bytes) to the filter unless it is there already; only
 * names this gateway has, so a worker cannot fill the queue with others. */
static bool presence_add(spn_server_t *s, char **filter, const char *name, size_t len) {
  char one[132];
  if (len + 2 >= sizeof one)
    return true;
  one[0] = '\n';
  memcpy(one + 1, name, len);
  one[len + 1] = '\n';
  one[len + 2] = '\0';
  if (*filter && strstr(*filter, one))
    return true;
  one[len + 1] = '\0';
  return !s->runner->has_pipeline(s->runner->data, one + 1) || spn__pipeline_filter_add(filter, one + 1);
}

void spn__sched_presence(spn_server_t *s, int64_t now) {
  bool any = false;
  char *filter = NULL;
  bool ok = true;
  if (s->nslots && !s->draining && !s->wedged[0]) { /* wedged slots take no more jobs */
    size_t len = 0;
    any = !s->pipelines;
    for (const char *name = NULL; ok && spn__pipeline_filter_next(s->pipelines, &name, &len);)
      ok = presence_add(s, &filter, name, len);
  }
  for (size_t i = 0; ok && i < s->nworkers; i++) {
    const spn_rworker_t *w = &s->workers[i];
    if (!w->alive || !w->leased || w->draining) /* a draining worker takes no more jobs */
      continue;
    any |= !w->pipelines;
    size_t len = 0;
    for (const char *name = NULL; ok && spn__pipeline_filter_next(w->pipelines, &name, &len);)
      ok = presence_add(s, &filter, name, len);
  }
  spn_error_t err = SPN_ERROR_INIT;
  if (ok && any)
    ok = s->q.ops->present(s->q.impl, NULL, now, &err) == SPN_OK;
  if (ok && filter)
    ok = s->q.ops->present(s->q.impl, filter, now, &err) == SPN_OK;
  if (!ok)
    spn__queue_log(s, SPN_LOG_WARN, "workers' pipelines: %s", err.msg[0] ? err.msg : "out of memory");
  free(filter);
  spn__sched_roster(s, now);
  s->waiting_check = true; /* its watchers told after the next dispatch (spn__sched_dispatch) */
}

spn_roster_entry_t spn__sched_local_entry(const spn_server_t *s) {
  spn_roster_entry_t e = {.kind = "local", .gateway = s->name, .slots = s->nslots,
                          .draining = s->draining != 0 || s->wedged[0], .pipelines = s->pipelines};
  for (size_t i = 0; i < s->nruns; i++)
    e.running += s->runs[i].slot >= 0;
  return e;
}

spn_roster_entry_t spn__sched_remote_entry(const spn_server_t *s, size_t i) {
  const spn_rworker_t *w = &s->workers[i];
  spn_roster_entry_t e = {.kind = "remote", .gateway = s->name, .draining = w->draining,
                          .pipelines = w->leased ? w->pipelines : "\n", .instance = w->instance};
  for (size_t k = 0; k < s->nruns; k++)
    e.running += s->runs[k].worker == (int64_t)i && s->runs[k].slot < 0;
  e.slots = e.running + (w->credit > 0 ? w->credit : 0); /* running, and the credit it granted */
  return e;
}

void spn__sched_roster(spn_server_t *s, int64_t now) {
  if (!s->q.ops->roster_put)
    return;
  size_t cap = 1 + s->nworkers, n = 0;
  char **names = calloc(cap, sizeof *names), **records = calloc(cap, sizeof *records);
  bool ok = names && records;
  if (ok && s->nslots) {
    spn_roster_entry_t e = spn__sched_local_entry(s);
    size_t len = strlen(s->name) + 9;
    ok = (names[n] = malloc(len)) && (records[n] = spn__roster_record(&e, now));
    if (names[n])
      snprintf(names[n], len, "gateway:%s", s->name);
    n++;
  }
  for (size_t i = 0; ok && i < s->nworkers; i++) {
    const spn_rworker_t *w = &s->workers[i];
    if (!w->alive || !w->leased) /* what it runs is not known before its LEASE */
      continue;
    spn_roster_entry_t e = spn__sched_remote_entry(s, i);
    ok = (names[n] = strdup(w->owner)) && (records[n] = spn__roster_record(&e, now));
    n++;
  }
  spn_error_t err = SPN_ERROR_INIT;
  if (ok && n)
    ok = s->q.ops->roster_put(s->q.impl, n, (const char *const *)names, (const char *const *)records, &err) ==
         SPN_OK;
  double mono = spn__mono_s();
  if (ok && mono - s->last_roster_prune >= SPN_ROSTER_PRUNE_MS / 1000.0) {
    s->last_roster_prune = mono;
    size_t removed = 0;
    ok = spn__roster_prune(&s->q, now, &removed, &err) == SPN_OK;
    if (removed)
      spn__log_f(spn__observe_logger(s->obs), SPN_LOG_INFO, NULL,
                 "roster: removed %zu worker record%s not renewed for %d min", removed, removed == 1 ? "" : "s",
                 SPN_ROSTER_KEEP_MS / 60000);
  }
  if (!ok)
    spn__queue_log(s, SPN_LOG_WARN, "roster of workers: %s", err.msg[0] ? err.msg : "out of memory");
  for (size_t i = 0; i < n; i++) {
    free(names[i]);
    cJSON_free(records[i]);
  }
  free(names);
  free(records);
}

void spn__sched_roster_remove(spn_server_t *s, const char *owner) {
  if (!s->q.ops->roster_put)
    return;
  char own[160];
  snprintf(own, sizeof own, "gateway:%s", s->name);
  /* A gateway that stops takes along its draining workers: they would
   * have left at their next reap. The others reconnect to a gateway that
   * records them again, or are listed as gone. */
  const char **names = calloc(1 + s->nworkers, sizeof *names), **none = calloc(1 + s->nworkers, sizeof *none);
  size_t n = 0;
  if (names && none && owner)
    names[n++] = owner;
  if (names && none && !owner && s->nslots)
    names[n++] = own;
  for (size_t i = 0; names && none && !owner && i < s->nworkers; i++)
    if (s->workers[i].alive && s->workers[i].draining)
      names[n++] = s->workers[i].owner;
  spn_error_t err = SPN_ERROR_INIT;
  if (!names || !none)
    spn_error_set(&err, SPN_ENOMEM, "out of memory");
  if (!names || !none || (n && s->q.ops->roster_put(s->q.impl, n, names, none, &err) < 0))
    spn__queue_log(s, SPN_LOG_WARN, "roster of workers: %s", err.msg);
  free(names);
  free(none);
}

void spn__sched_progress(spn_server_t *s, spn_run_t *r, uint64_t done, uint64_t total) {
  r->done = done;
  r->total = total;
  spn__notify_progress(s, r);
  double mono = spn__mono_s();
  if (done < total && mono - r->progress_at >= 1.0) {
    r->progress_at = mono;
    s->q.ops->progress(s->q.impl, r->id, done, total, NULL);
  }
}

void spn__sched_reports(spn_server_t *s, spn_slot_report_t *r) {
  while (r) {
    spn_slot_report_t *next = r->next;
    spn_run_t *run = spn__run_find(s, r->id);
    bool live = run && run->attempt == r->attempt && run->slot == (int)r->slot;
    if (r->kind == SPN_SLOT_PROGRESS) {
      if (live)
        spn__sched_progress(s, run, r->done, r->total);
    } else {
      spn__slot_pool_set_idle(s->pool, r->slot);
      spn__sched_finish(s, r->id, r->attempt, s->slot_owner[r->slot], &r->res);
      if (r->res.wedged && !s->wedged[0]) {
        snprintf(s->wedged, sizeof s->wedged, "%s", r->res.error);
        spn__log_f(spn__observe_logger(s->obs), SPN_LOG_ERROR, NULL,
                   "the in-process workers take no more jobs (/healthz answers 503; remote workers go on): %s",
                   s->wedged);
      }
    }
    free(r);
    r = next;
  }
}
