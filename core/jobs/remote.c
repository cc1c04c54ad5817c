/* remote.c — the gateway's side of the remote-worker protocol (LEASE,
 * HEARTBEAT, PROGRESS, DONE, FAIL; docs/protocol.md).
 *
 * Invariants:
 * - A worker is known by its name ("remote:<name>" is the lease owner); a
 *   worker that reconnects with a new routing id takes over its old entry and
 *   its runs. A name is one process: another process (another "instance")
 *   is refused the name while its holder lives, here or, on a shared queue,
 *   at another gateway (name_taken).
 * - Credit: the gateway sends a worker at most as many jobs as it granted.
 * - HEARTBEAT renews the leases of the jobs it lists; a job whose lease the
 *   worker lost is cancelled on the worker, so it cannot race the attempt
 *   that runs elsewhere now. Three missed heartbeats and the worker is lost:
 *   its jobs count a failed attempt and retry (spn__remote_reap).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server-internal.h"

static spn_rworker_t *worker_by_ident(spn_server_t *s, const unsigned char *ident, size_t ilen) {
  for (size_t i = 0; i < s->nworkers; i++)
    if (s->workers[i].alive && s->workers[i].ident_len == ilen &&
        !memcmp(s->workers[i].ident, ident, ilen))
      return &s->workers[i];
  return NULL;
}

/* ---- worker side ---- */

/* A worker name is one process. Each worker sends a random "instance"
 * token with its name; a message with a name that another live process
 * holds (another instance) is refused with name_taken, naming the holder
 * and when it was last heard. "holder_seen" (ms, only ever grows while the
 * holder lives) lets the refused worker tell a live holder, heard again and
 * again, from a dead one that goes quiet and is reaped (then the name is
 * free; a worker restarted under its name gets it back that way). */
static void refuse_name(spn_server_t *s, spn_pmsg_t *m, const char *name, const char *where, double heard_s,
                        int64_t seen) {
  char msg[512];
  snprintf(msg, sizeof msg,
           "worker name \"%s\" is taken by another worker process connected %s (heard %.1f s ago); give each "
           "worker its own --name (a restarted worker gets its name back once the old process counts as lost)",
           name, where, heard_s < 0 ? 0 : heard_s);
  cJSON *b = cJSON_CreateObject();
  if (b) {
    if (m->req)
      cJSON_AddNumberToObject(b, "req", (double)m->req);
    cJSON_AddStringToObject(b, "code", "name_taken");
    cJSON_AddStringToObject(b, "message", msg);
    cJSON_AddNumberToObject(b, "holder_seen", (double)seen);
    spn__out_push(s, m->ident, m->ident_len, "ERROR", b, false);
  }
  if (s->refused_ident_len != m->ident_len || memcmp(s->refused_ident, m->ident, m->ident_len)) {
    memcpy(s->refused_ident, m->ident, m->ident_len);
    s->refused_ident_len = m->ident_len;
    spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
    lf.worker = name;
    spn__log_f(spn__observe_logger(s->obs), SPN_LOG_WARN, &lf, "refused a second worker process: %s", msg);
  }
}

static spn_rworker_t *worker_register(spn_server_t *s, spn_pmsg_t *m) {
  const char *name = spn__json_str(m->body, "worker");
  if (!name || !*name || strlen(name) > 128) {
    spn__out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"worker\" must be a name of 1-128 bytes");
    return NULL;
  }
  const cJSON *ij = cJSON_GetObjectItemCaseSensitive(m->body, "instance");
  const char *inst = cJSON_IsString(ij) ? ij->valuestring : NULL;
  if (ij && (!inst || !*inst || strlen(inst) > 64)) {
    spn__out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"instance\" must be a string of 1-64 bytes");
    return NULL;
  }
  spn_rworker_t *w = worker_by_ident(s, m->ident, m->ident_len);
  if (w)
    return w;
  /* A worker that reconnected (new routing id) replaces its old entry;
   * another process of the same name does not. */
  char owner[160];
  snprintf(owner, sizeof owner, "remote:%s", name);
  for (size_t i = 0; i < s->nworkers; i++) /* also one listed as gone: it is back */
    if ((s->workers[i].alive || s->workers[i].gone_at) && !strcmp(s->workers[i].owner, owner)) {
      w = &s->workers[i];
      break;
    }
  double mono = spn__mono_s();
  if (w && w->alive && inst && w->instance[0] && strcmp(w->instance, inst)) {
    refuse_name(s, m, name, "to this gateway", mono - w->last_seen, (int64_t)(w->last_seen * 1000.0));
    return NULL;
  }
  int64_t now = spn__now_ms();
  spn_roster_other_t o; /* new here: is it live at another gateway (a shared queue's roster)? */
  if (!(w && w->alive) && inst && spn__roster_other(&s->q, owner, inst, now, &o) && o.live && o.gateway[0] &&
      strcmp(o.gateway, s->name)) {
    char where[160];
    snprintf(where, sizeof where, "to gateway %s", o.gateway);
    refuse_name(s, m, name, where, (double)(now - o.at) / 1000.0, o.at);
    return NULL;
  }
  if (!w) {
    for (size_t i = 0; i < s->nworkers; i++)
      if (!s->workers[i].alive && !spn__rworker_gone(&s->workers[i], now)) {
        w = &s->workers[i];
        break;
      }
  }
  if (!w) {
    spn_rworker_t *nv = realloc(s->workers, (s->nworkers + 1) * sizeof *nv);
    if (!nv)
      return NULL;
    s->workers = nv;
    w = &s->workers[s->nworkers++];
    w->pipelines = NULL;
  }
  free(w->pipelines);
  memset(w, 0, sizeof *w);
  memcpy(w->ident, m->ident, m->ident_len);
  w->ident_len = m->ident_len;
  snprintf(w->owner, sizeof w->owner, "%s", owner);
  snprintf(w->instance, sizeof w->instance, "%s", inst ? inst : "");
  w->alive = true;
  w->last_seen = mono;
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
  spn__out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"id\" and \"attempt\" must be positive integers");
  return false;
}

void spn__remote_msg(spn_server_t *s, spn_pmsg_t *m) {
  spn_rworker_t *w = worker_register(s, m);
  if (!w)
    return;
  w->last_seen = spn__mono_s();
  int64_t now = spn__now_ms();
  spn_error_t err = SPN_ERROR_INIT;
  if (!strcmp(m->type, "LEASE")) {
    int64_t credit = 0;
    if (!spn__json_int(m->body, "credit", &credit) || credit < 0 || credit > 1024) {
      spn__out_error(s, m->ident, m->ident_len, m->req, "invalid", "\"credit\" must be an integer in [0, 1024]");
      return;
    }
    /* "pipelines": the names of what it runs (a worker that sends none runs
     * anything: it gets jobs of every pipeline, as before). */
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(m->body, "pipelines"), *it;
    char *filter = NULL;
    bool ok = !pl || (cJSON_IsArray(pl) && cJSON_GetArraySize(pl) <= 1024);
    const cJSON *names = ok ? pl : NULL;
    cJSON_ArrayForEach(it, names) {
      if (!(ok = cJSON_IsString(it) && strlen(it->valuestring) <= 128 && spn__pipeline_filter_add(&filter, it->valuestring)))
        break;
    }
    if (!ok) {
      free(filter);
      spn__out_error(s, m->ident, m->ident_len, m->req, "invalid",
                     "\"pipelines\" must be an array of at most 1024 names of 1-128 bytes without newlines");
      return;
    }
    bool changed = !w->leased || (pl && (!w->pipelines || strcmp(w->pipelines, filter ? filter : "\n")));
    if (pl) {
      free(w->pipelines);
      w->pipelines = filter ? filter : strdup("\n"); /* [] runs nothing */
    }
    w->credit += credit;
    w->leased = true;
    if (changed) /* a worker came, or runs something else now: its pipelines have one */
      spn__sched_presence(s, now);
  } else if (!strcmp(m->type, "HEARTBEAT")) {
    const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(m->body, "jobs");
    const cJSON *it;
    cJSON_ArrayForEach(it, jobs) {
      int64_t id, att;
      if (!spn__json_int(it, "id", &id) || !spn__json_int(it, "attempt", &att))
        continue;
      int32_t rr = s->q.ops->renew(s->q.impl, id, (uint32_t)att, w->owner, now, s->cfg->lease_ms, &err);
      if (rr == SPN_ESTATE || rr == SPN_ECANCELLED) {
        /* The worker runs a job whose lease it lost (it was presumed dead,
         * or the job was cancelled and ended): tell it to stop, so it does
         * not race the attempt that runs elsewhere now. */
        cJSON *c = cJSON_CreateObject();
        if (c) {
          cJSON_AddNumberToObject(c, "id", (double)id);
          cJSON_AddNumberToObject(c, "attempt", (double)att);
          spn__out_push(s, m->ident, m->ident_len, "CANCEL", c, true);
        }
        if (rr == SPN_ESTATE)
          continue;
      }
      if ((rr == SPN_OK || rr == SPN_ECANCELLED) && !spn__run_find(s, id)) {
        /* A job this gateway instance did not hand out (it restarted): adopt it. */
        spn_run_t *r = spn__run_add(s);
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
      spn__out_push(s, m->ident, m->ident_len, "HEARTBEAT", b, false);
    }
  } else if (!strcmp(m->type, "PROGRESS")) {
    int64_t id, att, done = 0, total = 0;
    if (!lease_args(s, m, &id, &att))
      return;
    spn__json_int(m->body, "done", &done);
    spn__json_int(m->body, "total", &total);
    spn_run_t *r = spn__run_find(s, id);
    if (r && r->attempt == (uint32_t)att && !strcmp(r->owner, w->owner)) {
      spn__sched_progress(s, r, (uint64_t)(done < 0 ? 0 : done), (uint64_t)(total < 0 ? 0 : total));
    }
  } else if (!strcmp(m->type, "DRAIN")) {
    /* The worker is stopping: no more jobs for it; it finishes or RELEASEs
     * what it runs. */
    w->credit = 0;
    w->leased = true;
    if (!w->draining) { /* no longer one that runs its pipelines; the roster says it drains */
      w->draining = true;
      spn__sched_presence(s, now);
    }
  } else if (!strcmp(m->type, "RELEASE")) {
    int64_t id, att;
    if (!lease_args(s, m, &id, &att))
      return;
    /* Back to the queue without costing an attempt (the worker stopped it,
     * it did not fail). A stale release changes nothing. */
    if (s->q.ops->release(s->q.impl, id, (uint32_t)att, w->owner, "worker drained", now, &err) == SPN_OK) {
      spn_run_t *r = spn__run_find(s, id);
      if (r && r->attempt == (uint32_t)att && !strcmp(r->owner, w->owner))
        spn__run_remove(s, id);
      spn__notify(s, id);
    }
  } else { /* DONE or FAIL */
    int64_t id, att;
    if (!lease_args(s, m, &id, &att))
      return;
    spn_exec_result_t res = {.status = SPN_OK};
    /* Malformed transfers or warnings do not cost the job its result: they
     * count as none, with a line. */
    uint32_t bad = spn__exec_report_from_json(m->body, &res, &err);
    spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
    lf.worker = w->owner;
    lf.job_id = (uint64_t)id;
    if (bad & SPN_REPORT_BAD_TRANSFERS)
      spn__log_f(spn__observe_logger(s->obs), SPN_LOG_WARN, &lf, "%s %lld: %s; recorded as no transfers", m->type,
                 (long long)id, err.msg);
    if (bad & SPN_REPORT_BAD_WARNINGS)
      spn__log_f(spn__observe_logger(s->obs), SPN_LOG_WARN, &lf,
                 "%s %lld: \"warnings\" is not an array of strings; recorded as none", m->type, (long long)id);
    if (!strcmp(m->type, "FAIL")) {
      const char *e = spn__json_str(m->body, "error");
      /* final: the worker's attempt met an error no retry can mend (absent
       * from older workers: retried) */
      res.status = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m->body, "cancelled")) ? SPN_ECANCELLED
                   : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m->body, "final"))   ? SPN_EMEDIA
                                                                                        : SPN_EIO;
      snprintf(res.error, sizeof res.error, "%s: %s", w->owner, e ? e : "failed");
    }
    spn__sched_finish(s, id, (uint32_t)att, w->owner, &res);
  }
}

void spn__remote_reap(spn_server_t *s, double mono, int64_t now) {
  double dead_after = 3.0 * s->cfg->heartbeat_ms / 1000.0;
  for (size_t i = 0; i < s->nworkers; i++) {
    spn_rworker_t *w = &s->workers[i];
    if (!w->alive || mono - w->last_seen <= dead_after)
      continue;
    spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
    lf.worker = w->owner;
    spn__log_f(spn__observe_logger(s->obs), SPN_LOG_WARN, &lf, "worker missed 3 heartbeats; re-queueing its jobs");
    w->alive = false;
    if (w->draining) { /* it stopped as asked; a worker lost otherwise stays listed, as gone */
      spn__sched_roster_remove(s, w->owner);
    } else {
      w->gone_at = now;
      w->gone_slots = spn__sched_remote_entry(s, i).slots; /* before its runs go, below */
    }
    spn_error_t err = SPN_ERROR_INIT;
    char reason[200];
    snprintf(reason, sizeof reason, "worker %s lost (3 heartbeats missed)", w->owner);
    if (s->q.ops->release_owner(s->q.impl, w->owner, reason, now, spn__sched_changed, s, &err) < 0)
      spn__log_f(spn__observe_logger(s->obs), SPN_LOG_ERROR, NULL, "%s", err.msg);
    for (size_t k = 0; k < s->nruns;)
      if (s->runs[k].worker == (int64_t)i)
        s->runs[k] = s->runs[--s->nruns];
      else
        k++;
  }
}
