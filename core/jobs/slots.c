/* slots.c — the pool of job-running threads that the gateway (in-process
 * workers) and `spindle worker` share.
 *
 * Invariants:
 * - One owner thread (the gateway's loop, the worker's main loop) assigns
 *   jobs, reads reports and marks slots idle; `busy` is touched only by it.
 * - A slot thread owns its spec while `assigned` (under mu); it clears
 *   `assigned` and frees the spec *before* pushing its "finished" report, so
 *   the owner may assign the slot again as soon as it reads that report.
 * - Reports (progress, finished) go through one mutex-protected list; the
 *   optional wake callback (the gateway's uv_async_send) is called after each
 *   push; an owner that polls passes NULL.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs-internal.h"

typedef struct pslot {
  struct spn_slot_pool *p;
  uint32_t idx;
  pthread_t th;
  bool started;
  spn_job_spec_t spec; /* under p->mu while assigned */
  bool assigned;
  volatile int cancel;
  bool busy; /* owner thread only */
} pslot_t;

struct spn_slot_pool {
  const spn_job_runner_t *runner;
  spn_slot_wake_cb wake;
  void *wake_user;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool quit;
  pslot_t *slots;
  uint32_t n;
  pthread_mutex_t rmu;
  spn_slot_report_t *reports, **tail;
};

static void push_report(spn_slot_pool_t *p, spn_slot_report_t *r) {
  pthread_mutex_lock(&p->rmu);
  *p->tail = r;
  p->tail = &r->next;
  pthread_mutex_unlock(&p->rmu);
  if (p->wake)
    p->wake(p->wake_user);
}

static void on_progress(void *user, uint64_t done, uint64_t total) {
  pslot_t *sl = user;
  spn_slot_report_t *r = calloc(1, sizeof *r);
  if (!r)
    return;
  r->kind = SPN_SLOT_PROGRESS;
  r->slot = sl->idx;
  r->id = sl->spec.id;
  r->attempt = sl->spec.attempt;
  r->done = done;
  r->total = total;
  push_report(sl->p, r);
}

static void *slot_main(void *arg) {
  pslot_t *sl = arg;
  spn_slot_pool_t *p = sl->p;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->quit && !sl->assigned)
      pthread_cond_wait(&p->cond, &p->mu);
    bool quit = p->quit;
    pthread_mutex_unlock(&p->mu);
    if (quit)
      break;
    spn_slot_report_t *r = calloc(1, sizeof *r);
    spn_exec_result_t res;
    spn__job_execute(p->runner, &sl->spec, &sl->cancel, on_progress, sl, &res);
    if (r) {
      r->kind = SPN_SLOT_FINISHED;
      r->slot = sl->idx;
      r->id = sl->spec.id;
      r->attempt = sl->spec.attempt;
      r->res = res;
    }
    pthread_mutex_lock(&p->mu);
    spn__job_spec_free(&sl->spec);
    sl->assigned = false;
    pthread_mutex_unlock(&p->mu);
    if (r)
      push_report(p, r); /* after the slot is free again: the owner may assign at once */
  }
  return NULL;
}

int32_t spn__slot_pool_new(uint32_t n, const spn_job_runner_t *runner, spn_slot_wake_cb wake,
                           void *user, spn_slot_pool_t **out, spn_error_t *err) {
  *out = NULL;
  spn_slot_pool_t *p = calloc(1, sizeof *p);
  if (!p || (n && !(p->slots = calloc(n, sizeof *p->slots)))) {
    free(p);
    return spn_error_set(err, SPN_ENOMEM, "slot pool: out of memory");
  }
  p->runner = runner;
  p->wake = wake;
  p->wake_user = user;
  p->n = n;
  p->tail = &p->reports;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_mutex_init(&p->rmu, NULL);
  for (uint32_t i = 0; i < n; i++) {
    pslot_t *sl = &p->slots[i];
    sl->p = p;
    sl->idx = i;
    if (pthread_create(&sl->th, NULL, slot_main, sl) != 0) {
      int32_t rc = spn_error_set(err, SPN_EIO, "cannot start worker thread %u", i);
      spn__slot_pool_free(&p);
      return rc;
    }
    sl->started = true;
  }
  *out = p;
  return SPN_OK;
}

void spn__slot_pool_stop(spn_slot_pool_t *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->quit = true;
  for (uint32_t i = 0; i < p->n; i++)
    __atomic_store_n(&p->slots[i].cancel, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mu);
  for (uint32_t i = 0; i < p->n; i++)
    if (p->slots[i].started) {
      pthread_join(p->slots[i].th, NULL);
      p->slots[i].started = false;
    }
}

void spn__slot_pool_free(spn_slot_pool_t **pp) {
  spn_slot_pool_t *p = *pp;
  if (!p)
    return;
  *pp = NULL;
  spn__slot_pool_stop(p);
  spn__slot_reports_free(p->reports);
  for (uint32_t i = 0; i < p->n; i++)
    if (p->slots[i].assigned)
      spn__job_spec_free(&p->slots[i].spec);
  free(p->slots);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->rmu);
  free(p);
}

uint32_t spn__slot_pool_size(const spn_slot_pool_t *p) { return p ? p->n : 0; }

int32_t spn__slot_pool_idle(const spn_slot_pool_t *p) {
  for (uint32_t i = 0; p && i < p->n; i++)
    if (!p->slots[i].busy)
      return (int32_t)i;
  return -1;
}

uint32_t spn__slot_pool_idle_count(const spn_slot_pool_t *p) {
  uint32_t k = 0;
  for (uint32_t i = 0; p && i < p->n; i++)
    k += !p->slots[i].busy;
  return k;
}

void spn__slot_pool_assign(spn_slot_pool_t *p, uint32_t idx, spn_job_spec_t *spec) {
  pslot_t *sl = &p->slots[idx];
  sl->busy = true;
  pthread_mutex_lock(&p->mu);
  sl->spec = *spec;
  memset(spec, 0, sizeof *spec);
  sl->cancel = 0;
  sl->assigned = true;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mu);
}

void spn__slot_pool_cancel(spn_slot_pool_t *p, uint32_t idx) {
  if (p && idx < p->n)
    __atomic_store_n(&p->slots[idx].cancel, 1, __ATOMIC_RELEASE);
}

void spn__slot_pool_cancel_job(spn_slot_pool_t *p, int64_t id, uint32_t attempt) {
  pthread_mutex_lock(&p->mu);
  for (uint32_t i = 0; i < p->n; i++)
    if (p->slots[i].assigned && p->slots[i].spec.id == id &&
        (attempt == 0 || p->slots[i].spec.attempt == attempt))
      __atomic_store_n(&p->slots[i].cancel, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&p->mu);
}

void spn__slot_pool_set_idle(spn_slot_pool_t *p, uint32_t idx) {
  if (idx < p->n)
    p->slots[idx].busy = false;
}

bool spn__slot_pool_running(spn_slot_pool_t *p, uint32_t idx, int64_t *id, uint32_t *attempt) {
  bool a = false;
  pthread_mutex_lock(&p->mu);
  if (idx < p->n && p->slots[idx].assigned) {
    a = true;
    *id = p->slots[idx].spec.id;
    *attempt = p->slots[idx].spec.attempt;
  }
  pthread_mutex_unlock(&p->mu);
  return a;
}

spn_slot_report_t *spn__slot_pool_take(spn_slot_pool_t *p) {
  pthread_mutex_lock(&p->rmu);
  spn_slot_report_t *r = p->reports;
  p->reports = NULL;
  p->tail = &p->reports;
  pthread_mutex_unlock(&p->rmu);
  return r;
}

void spn__slot_reports_free(spn_slot_report_t *r) {
  while (r) {
    spn_slot_report_t *n = r->next;
    free(r);
    r = n;
  }
}
