/* actor.c — one stage replica: mailbox, re-ordering, batching, EOS, emit.
 *
 * Every function here runs on the actor's executor thread, so actor state
 * needs no locks. Shared state is limited to the link counters (atomics) and
 * job flags (atomics).
 *
 * Invariants:
 *   - a link (producer replica -> consumer replica) is FIFO: one PUSH socket
 *     feeding the consumer's PULL mailbox; EOS is the last thing a producer
 *     sends for a job on each of its links;
 *   - a counted message holds one unit of its link's credit from emit until
 *     the consumer has processed or dropped it: in_flight never exceeds the
 *     capacity for 1:1 stages because a producer is only stepped (process or
 *     generate) while it has credit, and a batch is no larger than the credit;
 *   - a job is finished at an actor (flush, job_close(ok=true), EOS forwarded
 *     or acknowledged) only after EOS arrived on every input link and every
 *     message of the job was processed;
 *   - re-ordering happens at a single-replica stage fed by a replicated one:
 *     the union of its links carries every seq of the job exactly once;
 *   - multi-device (docs/gpu.md): no data is sent to a replica on a
 *     quarantined device while a usable one exists, and an actor on such a
 *     device fails with SPN_EDEVICE whatever still reaches it (the runtime
 *     restarts the job); every message carries its job's attempt, and one
 *     of an older attempt is dropped on arrival. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "runtime-internal.h"

/* ThreadSanitizer cannot see the ordering libzmq's pipes give (libzmq is
 * not instrumented): tell it that a frame's send happens before its receive,
 * so a TSan build reports our races and not libzmq's hand-offs. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSAN_RELEASE(p) __tsan_release(p)
#define TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define TSAN_RELEASE(p) ((void)0)
#define TSAN_ACQUIRE(p) ((void)0)
#endif

#define TX_MAX 256 /* handles per ZeroMQ frame */
#define RX_FRAMES 64 /* frames taken from the mailbox per step */

typedef struct frame_hdr {
  uint32_t magic;
  uint32_t link;
  uint32_t count;
  uint32_t reserved;
} frame_hdr_t;
#define FRAME_PTR 0x31504e53u /* "SNP1": handles, same process */
#define FRAME_WIRE 0x31574e53u /* "SNW1": serialized messages */

static const char *aname(const spn_stage_t *a) { return a->srt->spec->name; }

/* Prefix a plugin's error with where the stage is and what failed; a
 * message that opens with its stage's name already (`stage "encode": ...`,
 * as several plugins write) does not name it twice. */
static void stage_error(spn_error_t *err, const spn_stage_t *a, const char *what) {
  char own[SPN_ERROR_MSG_MAX];
  int n = snprintf(own, sizeof own, "stage \"%s\": ", aname(a));
  if (n > 0 && (size_t)n < sizeof own && !strncmp(err->msg, own, (size_t)n))
    memmove(err->msg, err->msg + n, strlen(err->msg + n) + 1);
  spn_error_prefix(err, "%s: stage \"%s\": %s", a->srt->spec->where, aname(a), what);
}

static void log_a(spn_stage_t *a, int32_t level, uint64_t job, const char *fmt, ...) SPN_PRINTF(4, 5);
static void log_a(spn_stage_t *a, int32_t level, uint64_t job, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  spn__logv(a->pipe->rt->log, level, job, aname(a), a->device_name, fmt, ap);
  va_end(ap);
}

/* ---- stream time -------------------------------------------------------------- */

/* An instance on a device (its executor has the stream its work goes on)
 * brackets each process, generate and flush call with two timed events on
 * that stream; the device time between the two, summed, is the stage's
 * stream time (spn_pipeline_stage_stream_time): how long the stream was
 * busy with the stage's work. On a GPU that is what the stage costs the
 * GPU, where its busy time is what it costs the host (launching work, not
 * waiting for it); it also holds the time the stream waited for the host
 * to queue more during the call and for other streams sharing the GPU. The
 * pairs complete after the call returns: each call reads those complete by
 * then without waiting, the oldest is waited for when SPN__ST_PAIRS are
 * out (many calls old: done by then), and every one at a job's end (one
 * wait, st_job_end) and before the instance goes. A device that cannot time
 * (or a failing timed event, once logged) turns it off for the instance. */
static void st_stop(spn_stage_t *a, const spn_error_t *err) {
  /* A quarantined device (SPN_EDEVICE) has said so already. */
  if (!a->st_off && err->code != SPN_EUNSUPPORTED)
    log_a(a, err->code == SPN_EDEVICE ? SPN_LOG_INFO : SPN_LOG_WARN, 0, "stream time is not measured from here on: %s",
          err->msg);
  a->st_off = true;
  a->st_n = 0;
}

/* Read the complete pairs from the oldest on; wait for the first `wait`. */
static void st_read(spn_stage_t *a, uint32_t wait) {
  for (uint32_t i = 0; a->st_n; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    uint64_t ns = 0;
    int32_t rc = spn__event_elapsed(a->st_ev[2 * a->st_head], a->st_ev[2 * a->st_head + 1], i < wait, &ns, &err);
    if (rc == SPN_EAGAIN)
      return;
    if (rc != SPN_OK) {
      st_stop(a, &err);
      return;
    }
    atomic_fetch_add_explicit(&a->srt->stream_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&a->srt->stream_calls, 1, memory_order_relaxed);
    a->st_head = (a->st_head + 1) % SPN__ST_PAIRS;
    a->st_n--;
  }
}

/* Before a call: the pair's slot, its start recorded; -1 when not timed. */
static int st_begin(spn_stage_t *a) {
  if (a->st_off || !a->device || !a->ex->stream)
    return -1;
  if (a->st_n == SPN__ST_PAIRS)
    st_read(a, 1);
  if (a->st_off || a->st_n == SPN__ST_PAIRS)
    return -1;
  uint32_t k = (a->st_head + a->st_n) % SPN__ST_PAIRS;
  spn_error_t err = SPN_ERROR_INIT;
  for (int e = 0; e < 2; e++)
    if (!a->st_ev[2 * k + e] && spn__event_new_timed(a->device, &a->st_ev[2 * k + e], &err) != SPN_OK) {
      st_stop(a, &err);
      return -1;
    }
  if (spn_event_record(a->st_ev[2 * k], a->ex->stream, &err) != SPN_OK) {
    st_stop(a, &err);
    return -1;
  }
  return (int)k;
}

/* After the call: its end recorded, and what is complete read. */
static void st_end(spn_stage_t *a, int k) {
  if (k < 0 || a->st_off)
    return;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_event_record(a->st_ev[2 * k + 1], a->ex->stream, &err) != SPN_OK) {
    st_stop(a, &err);
    return;
  }
  a->st_n++;
  a->st_last = (uint32_t)k;
  a->st_timed = true;
  st_read(a, 0);
}

/* At a job's end: one wait, for the newest end (a stream runs its work in
 * order: every pair before it is complete then), and every pair read. The
 * wait is made whenever a call was timed since the last job's end, even
 * when everything is complete already, so that what a job costs the host
 * does not depend on how far the device had got (the fake GPU's per-frame
 * budgets count host syncs). */
static void st_job_end(spn_stage_t *a) {
  if (a->st_timed && !a->st_off) {
    spn_error_t err = SPN_ERROR_INIT;
    if (spn_event_synchronize(a->st_ev[2 * a->st_last + 1], &err) != SPN_OK)
      st_stop(a, &err);
  }
  a->st_timed = false;
  st_read(a, 0);
  st_read(a, a->st_n); /* none left but on a device that broke its order */
}

static void st_free(spn_stage_t *a) {
  st_read(a, SPN__ST_PAIRS);
  for (uint32_t i = 0; i < 2 * SPN__ST_PAIRS; i++)
    spn_event_free(&a->st_ev[i]);
}

/* ---- credit -------------------------------------------------------------------- */

/* Never below zero: a forged frame on an ipc/tcp mailbox must not be able
 * to mint credit out of nothing (it can at most return credit early). */
static void dec_floor0(atomic_llong *v) {
  long long cur = atomic_load(v);
  while (cur > 0 && !atomic_compare_exchange_weak(v, &cur, cur - 1))
    ;
}

static void release(spn__link_t *l, bool counted) {
  if (!l)
    return;
  dec_floor0(counted ? &l->in_flight : &l->ctl_in_flight);
  if (atomic_load(&l->want_credit) && atomic_exchange(&l->want_credit, false))
    spn__executor_wake(l->from->ex);
}

static uint32_t out_credit(spn_stage_t *a) {
  long long credit = UINT32_MAX;
  for (uint32_t p = 0; p < a->n_out; p++)
    for (uint32_t e = 0; e < a->out[p].n_edges; e++) {
      spn__out_edge_t *ed = &a->out[p].edges[e];
      long long free_ = 0;
      for (uint32_t i = 0; i < ed->n_targets; i++) {
        long long f = (long long)ed->targets[i]->capacity - atomic_load(&ed->targets[i]->in_flight);
        if (f > 0)
          free_ += f;
      }
      if (free_ < credit)
        credit = free_;
    }
  return (uint32_t)credit;
}

/* Ask to be woken when credit returns, then look again (a release that ran
 * between the first look and the flag would otherwise be missed). */
static uint32_t want_credit(spn_stage_t *a) {
  for (uint32_t p = 0; p < a->n_out; p++)
    for (uint32_t e = 0; e < a->out[p].n_edges; e++)
      for (uint32_t i = 0; i < a->out[p].edges[e].n_links; i++) {
        spn__link_t *l = a->out[p].edges[e].links[i];
        if (atomic_load(&l->in_flight) >= l->capacity)
          atomic_store(&l->want_credit, true);
      }
  return out_credit(a);
}

/* ---- sending ---------------------------------------------------------------------- */

static void link_flush(spn_stage_t *a, spn__link_t *l) {
  if (!l->n_tx)
    return;
  uint32_t n = l->n_tx;
  frame_hdr_t h = {.magic = l->serialize ? FRAME_WIRE : FRAME_PTR, .link = l->id, .count = n};
  int rc;
  if (!l->serialize) {
    size_t len = sizeof h + n * sizeof(spn_msg_t *) + n;
    zmq_msg_t zm;
    rc = zmq_msg_init_size(&zm, len);
    if (rc == 0) {
      uint8_t *p = zmq_msg_data(&zm);
      memcpy(p, &h, sizeof h);
      memcpy(p + sizeof h, l->tx, n * sizeof(spn_msg_t *));
      for (uint32_t i = 0; i < n; i++)
        p[sizeof h + n * sizeof(spn_msg_t *) + i] = l->tx_counted[i];
      TSAN_RELEASE(l->to);
      rc = zmq_msg_send(&zm, l->sock, 0);
      if (rc < 0)
        zmq_msg_close(&zm);
    }
    if (rc >= 0) {
      l->n_tx = 0;
      return;
    }
  } else {
    size_t len = 0;
    rc = 0;
    if (a->ser_cap < sizeof h) {
      uint8_t *b = realloc(a->ser_buf, 4096);
      if (!b)
        rc = -1;
      else {
        a->ser_buf = b;
        a->ser_cap = 4096;
      }
    }
    if (rc == 0) {
      memcpy(a->ser_buf, &h, sizeof h);
      len = sizeof h;
      for (uint32_t i = 0; i < n && rc == 0; i++)
        if (spn__msg_serialize_append(l->tx[i], l->tx_counted[i], &a->ser_buf, &len, &a->ser_cap) != SPN_OK)
          rc = -1;
    }
    if (rc == 0) {
      TSAN_RELEASE(l->to);
      rc = zmq_send(l->sock, a->ser_buf, len, 0);
    }
    if (rc >= 0) {
      /* The bytes travel; the handles stay here. Credit is still held until
       * the consumer releases the deserialized copies. */
      for (uint32_t i = 0; i < n; i++)
        spn__msg_free(&l->tx[i]);
      l->n_tx = 0;
      return;
    }
  }
  log_a(a, SPN_LOG_ERROR, 0, "edge to \"%s\": send failed: %s; %u messages lost, failing their jobs",
        aname(l->to), zmq_strerror(zmq_errno()), n);
  for (uint32_t i = 0; i < n; i++) {
    spn_job_t *job = spn__pipeline_find_job(a->pipe, l->tx[i]->env.job_id);
    if (job) {
      atomic_store(&job->dead, true);
      spn__loop_post(a->pipe->rt, spn__event_new(SPN__EV_JOB_FAIL, job, SPN_EIO, "edge send failed"));
      spn__job_unref(&job);
    }
    spn__msg_free(&l->tx[i]);
    release(l, l->tx_counted[i]);
  }
  l->n_tx = 0;
}

static void flush_all(spn_stage_t *a) {
  for (uint32_t p = 0; p < a->n_out; p++)
    for (uint32_t e = 0; e < a->out[p].n_edges; e++)
      for (uint32_t i = 0; i < a->out[p].edges[e].n_links; i++)
        link_flush(a, a->out[p].edges[e].links[i]);
}

static void link_push(spn_stage_t *a, spn__link_t *l, spn_msg_t *m, bool counted) {
  if (counted) {
    long long v = atomic_fetch_add(&l->in_flight, 1) + 1;
    long long mx = atomic_load(&l->max_in_flight);
    while (v > mx && !atomic_compare_exchange_weak(&l->max_in_flight, &mx, v))
      ;
  } else {
    atomic_fetch_add(&l->ctl_in_flight, 1);
  }
  l->tx[l->n_tx] = m;
  l->tx_counted[l->n_tx] = counted;
  if (++l->n_tx == TX_MAX)
    link_flush(a, l);
}

/* Round-robin over the edge's targets — the consumer replicas on this
 * producer's device if it has any (chain per device: a job stays on one
 * device through consecutive replicated stages), else all — skipping full
 * ones; when every one is full (a stage emitting more than it was given credit for) the
 * message still goes, to the next in turn: nothing is ever dropped. */
static bool link_usable(const spn_runtime_t *rt, const spn__link_t *l, int32_t pin) {
  int32_t slot = l->to->dev_slot;
  return !spn__slot_down(rt, slot) && (pin < 0 || slot == pin);
}

/* Chain placement: the device the job's attempt runs on, chosen at its first
 * message (the next usable device in turn) and chosen again if that device
 * was quarantined since. */
static int32_t job_pin(spn_stage_t *a, spn__out_edge_t *ed, spn_job_t *job) {
  spn_runtime_t *rt = a->pipe->rt;
  int32_t pin = atomic_load(&job->pin);
  if (pin >= 0 && !spn__slot_down(rt, pin))
    return pin;
  for (uint32_t k = 0; k < ed->n_targets; k++) {
    int32_t slot = ed->targets[(ed->pin_rr + k) % ed->n_targets]->to->dev_slot;
    if (slot >= 0 && !spn__slot_down(rt, slot)) {
      ed->pin_rr += k + 1;
      if (!atomic_compare_exchange_strong(&job->pin, &pin, slot) && pin >= 0 && !spn__slot_down(rt, pin))
        slot = pin; /* another producer replica pinned it first */
      atomic_fetch_or(&job->dev_mask, spn__slot_bit(slot));
      return slot;
    }
  }
  return -1;
}

static spn__link_t *pick_link(spn_stage_t *a, spn__out_edge_t *ed, spn__ajob_t *aj) {
  const spn_runtime_t *rt = a->pipe->rt;
  int32_t pin = ed->pin && aj ? job_pin(a, ed, aj->job) : -1;
  for (uint32_t k = 0; k < ed->n_targets; k++) {
    uint32_t i = (ed->rr + k) % ed->n_targets;
    spn__link_t *l = ed->targets[i];
    if (link_usable(rt, l, pin) && atomic_load(&l->in_flight) < l->capacity) {
      ed->rr = i + 1;
      return l;
    }
  }
  /* All full: the next usable one in turn; none usable: any (its actor
   * fails the job with SPN_EDEVICE, and the runtime restarts it). */
  for (uint32_t k = 0; k < ed->n_targets; k++) {
    spn__link_t *l = ed->targets[(ed->rr + k) % ed->n_targets];
    if (link_usable(rt, l, pin)) {
      ed->rr += k + 1;
      return l;
    }
  }
  return ed->targets[ed->rr++ % ed->n_targets];
}

/* Send on one port: to one replica of every consumer stage (copies for all
 * but the last). Control messages (EOS) go to every replica. */
static void send_port(spn_stage_t *a, uint32_t port, spn_msg_t *m, bool counted, bool all_replicas,
                      spn__ajob_t *aj) {
  spn__out_port_t *op = &a->out[port];
  for (uint32_t e = 0; e < op->n_edges; e++) {
    spn__out_edge_t *ed = &op->edges[e];
    uint32_t n = all_replicas ? ed->n_links : 1;
    for (uint32_t k = 0; k < n; k++) {
      bool last = e + 1 == op->n_edges && k + 1 == n;
      spn_msg_t *s = m;
      if (!last) {
        spn_error_t err = SPN_ERROR_INIT;
        if (spn__msg_clone(m, &s, &err) != SPN_OK) {
          log_a(a, SPN_LOG_ERROR, m->env.job_id, "%s", err.msg);
          continue;
        }
        s->attempt = m->attempt;
      }
      link_push(a, all_replicas ? ed->links[k] : pick_link(a, ed, aj), s, counted);
    }
  }
  if (!op->n_edges)
    spn__msg_free(&m);
}

static void send_control(spn_stage_t *a, spn__ajob_t *aj, uint32_t flags, uint64_t seq, bool all_replicas) {
  uint64_t job_id = aj->id;
  for (uint32_t p = 0; p < a->n_out; p++) {
    if (!a->out[p].n_edges)
      continue;
    spn_envelope_t env = {.struct_size = sizeof env, .flags = flags, .job_id = job_id, .seq = seq, .total = -1};
    spn_msg_t *m;
    if (spn__msg_new(&env, &m, NULL) != SPN_OK) {
      log_a(a, SPN_LOG_ERROR, job_id, "out of memory sending a control message");
      continue;
    }
    m->attempt = aj->attempt;
    send_port(a, p, m, false, all_replicas, aj);
  }
}

/* ---- jobs at this actor ------------------------------------------------------------ */

static void fail_job(spn_stage_t *a, spn__ajob_t *aj, int32_t status, const char *msg) {
  if (aj->failed)
    return;
  aj->failed = true;
  atomic_store(&aj->job->dead, true);
  char text[SPN_ERROR_MSG_MAX];
  snprintf(text, sizeof text, "stage \"%s\" (replica %u on %s): %s", aname(a), a->replica, a->device_name,
           msg && *msg ? msg : spn_strerror(status));
  log_a(a, SPN_LOG_ERROR, aj->id, "%s", text);
  spn__loop_post(a->pipe->rt, spn__event_new(SPN__EV_JOB_FAIL, aj->job, status, text));
}

static spn__ajob_t *ajob_find(spn_stage_t *a, uint64_t id) {
  for (spn__ajob_t *aj = a->jobs; aj; aj = aj->next)
    if (aj->id == id)
      return aj;
  return NULL;
}

static void ajob_open(spn_stage_t *a, spn__ajob_t *aj) {
  const spn_stage_kind_t *k = a->srt->kind;
  if (aj->opened || aj->open_tried)
    return;
  aj->open_tried = true;
  /* The job touched this device: its quarantine restarts the job. */
  if (a->dev_slot >= 0)
    atomic_fetch_or(&aj->job->dev_mask, spn__slot_bit(a->dev_slot));
  if (k->job_open) {
    spn_job_info_t info = {.struct_size = sizeof info,
                           .job_id = aj->id,
                           .config = aj->job->configs[a->srt->index],
                           .priority = aj->job->priority};
    spn_error_t err = SPN_ERROR_INIT;
    atomic_store_explicit(&a->call_since_ns, spn__now_ns(), memory_order_relaxed);
    int32_t rc = k->job_open(a, a->state, &info, &aj->job_state, &err);
    atomic_store_explicit(&a->call_since_ns, 0, memory_order_relaxed);
    if (rc < 0) {
      fail_job(a, aj, rc, err.msg);
      return;
    }
  }
  aj->opened = true;
}

/* Find or create a job's state here; `open` runs job_open (once) if it has
 * not run yet: on the job's first data message, or at its EOS for a stage
 * with a single replica (so that flush always runs there). NULL when the
 * job is over or failing: its messages are dropped. */
static spn__ajob_t *ajob_get(spn_stage_t *a, uint64_t id, bool open) {
  spn__ajob_t *aj = ajob_find(a, id);
  if (aj) {
    if (open)
      ajob_open(a, aj);
    return aj;
  }
  spn_job_t *job = spn__pipeline_find_job(a->pipe, id);
  if (!job)
    return NULL;
  if (atomic_load(&job->dead)) {
    spn__job_unref(&job);
    return NULL;
  }
  aj = calloc(1, sizeof *aj);
  if (aj && a->n_in) {
    aj->next_seq = calloc(a->n_in, sizeof *aj->next_seq);
    aj->heaps = calloc(a->n_in, sizeof *aj->heaps);
  }
  if (!aj || (a->n_in && (!aj->next_seq || !aj->heaps))) {
    if (aj) {
      free(aj->next_seq);
      free(aj->heaps);
      free(aj);
    }
    log_a(a, SPN_LOG_ERROR, id, "out of memory opening the job");
    atomic_store(&job->dead, true);
    spn__loop_post(a->pipe->rt, spn__event_new(SPN__EV_JOB_FAIL, job, SPN_ENOMEM, "out of memory"));
    spn__job_unref(&job);
    return NULL;
  }
  aj->job = job;
  aj->id = id;
  /* After the dead check: a restart bumps attempt before it clears dead. */
  aj->attempt = atomic_load(&job->attempt);
  aj->next = a->jobs;
  a->jobs = aj;
  if (open)
    ajob_open(a, aj);
  return aj;
}

static void ajob_remove(spn_stage_t *a, spn__ajob_t *aj) {
  for (spn__ajob_t **pp = &a->jobs; *pp; pp = &(*pp)->next)
    if (*pp == aj) {
      *pp = aj->next;
      break;
    }
  if (a->gen_cursor == aj)
    a->gen_cursor = NULL;
  for (uint32_t p = 0; aj->heaps && p < a->n_in; p++) {
    for (size_t i = 0; i < aj->heaps[p].n; i++) {
      spn__msg_free(&aj->heaps[p].v[i].msg);
      release(aj->heaps[p].v[i].link, aj->heaps[p].v[i].counted);
    }
    free(aj->heaps[p].v);
  }
  free(aj->heaps);
  free(aj->next_seq);
  spn__job_unref(&aj->job);
  free(aj);
}

static bool ajob_ok(const spn__ajob_t *aj) { return !aj->failed && !atomic_load(&aj->job->dead); }

/* Every EOS arrived (or the source is done) and nothing of the job is left:
 * flush, close, then tell the consumers (EOS to every replica) or the job's
 * bookkeeping (terminal). */
static void finish_job(spn_stage_t *a, spn__ajob_t *aj) {
  const spn_stage_kind_t *k = a->srt->kind;
  if (ajob_ok(aj) && aj->opened && k->flush && !a->is_source) {
    spn_error_t err = SPN_ERROR_INIT;
    a->cur_job = aj;
    int st = st_begin(a);
    uint64_t t0 = spn__now_ns();
    atomic_store_explicit(&a->call_since_ns, t0, memory_order_relaxed);
    int32_t rc = k->flush(a, a->state, aj->job_state, &err);
    atomic_store_explicit(&a->call_since_ns, 0, memory_order_relaxed);
    uint64_t dt = spn__now_ns() - t0;
    st_end(a, st);
    atomic_fetch_add(&a->srt->busy_ns, dt);
    if (a->dev_slot >= 0)
      atomic_fetch_add_explicit(&aj->job->device_ns, dt, memory_order_relaxed);
    a->cur_job = NULL;
    if (rc < 0)
      fail_job(a, aj, rc, err.msg);
  }
  /* The job's stream time is all read before its end is told. */
  st_job_end(a);
  if (!ajob_ok(aj))
    return; /* ABORT_JOB will close it with ok=false */
  if (aj->opened && k->job_close)
    k->job_close(a, a->state, aj->job_state, true);
  aj->opened = false;
  if (a->srt->terminal)
    spn__loop_post(a->pipe->rt, spn__event_new(SPN__EV_JOB_ACK, aj->job, SPN_OK, NULL));
  else
    send_control(a, aj, SPN_MSG_EOS, 0, true);
  ajob_remove(a, aj);
}

/* ---- receiving ------------------------------------------------------------------------ */

static void ready_push(spn_stage_t *a, spn__rx_t rx) {
  if (a->r_n == a->r_cap) {
    size_t cap = a->r_cap ? a->r_cap * 2 : 64;
    spn__rx_t *v = malloc(cap * sizeof *v);
    SPN_ASSERT(v);
    for (size_t i = 0; i < a->r_n; i++)
      v[i] = a->ready[(a->r_head + i) % a->r_cap];
    free(a->ready);
    a->ready = v;
    a->r_head = 0;
    a->r_cap = cap;
  }
  a->ready[(a->r_head + a->r_n) % a->r_cap] = rx;
  a->r_n++;
  rx.aj->n_ready++;
}

static void count_done(spn_stage_t *a, spn_job_t *job, int64_t total, long long n) {
  if (!a->srt->terminal)
    return;
  if (n)
    atomic_fetch_add(&job->stage_done[a->srt->index], n);
  long long t = atomic_load(&job->total);
  while (total > t && !atomic_compare_exchange_weak(&job->total, &t, total))
    ;
}

/* Whether a sink asked for SKIPs (SPN_KIND_SEES_SKIPS, ABI 1.1; the
 * registry's copy of an older kind has flags 0). */
static bool sees_skips(const spn_stage_t *a) {
  return a->srt->terminal && (a->srt->kind->flags & SPN_KIND_SEES_SKIPS);
}

/* A message in order: SKIPs are forwarded (keeping seqs dense downstream)
 * and never reach process, except in a sink that asked for them; data (and
 * those SKIPs) join the ready FIFO. */
static void in_order(spn_stage_t *a, spn__rx_t rx) {
  if ((rx.msg->env.flags & SPN_MSG_SKIP) && !sees_skips(a)) {
    count_done(a, rx.aj->job, rx.msg->env.total, 1);
    uint64_t seq = rx.msg->env.seq;
    spn__msg_free(&rx.msg);
    release(rx.link, rx.counted);
    send_control(a, rx.aj, SPN_MSG_SKIP, seq, false);
    return;
  }
  ready_push(a, rx);
}

static void heap_push(spn__heap_t *h, spn__rx_t rx) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 16;
    spn__rx_t *v = realloc(h->v, cap * sizeof *v);
    SPN_ASSERT(v);
    h->v = v;
    h->cap = cap;
  }
  size_t i = h->n++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (h->v[parent].msg->env.seq <= rx.msg->env.seq)
      break;
    h->v[i] = h->v[parent];
    i = parent;
  }
  h->v[i] = rx;
}

static spn__rx_t heap_pop(spn__heap_t *h) {
  spn__rx_t top = h->v[0], last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n)
      break;
    if (c + 1 < h->n && h->v[c + 1].msg->env.seq < h->v[c].msg->env.seq)
      c++;
    if (last.msg->env.seq <= h->v[c].msg->env.seq)
      break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n)
    h->v[i] = last;
  return top;
}

static void drain_heap(spn_stage_t *a, spn__ajob_t *aj, uint32_t port, bool force) {
  spn__heap_t *h = &aj->heaps[port];
  while (h->n && (force || h->v[0].msg->env.seq <= aj->next_seq[port])) {
    spn__rx_t rx = heap_pop(h);
    if (rx.msg->env.seq != aj->next_seq[port])
      log_a(a, SPN_LOG_WARN, aj->id, "input %u: seq %llu arrived where %llu was expected (a stage dropped a "
            "frame without SKIP, or sent one twice)", port, (unsigned long long)rx.msg->env.seq,
            (unsigned long long)aj->next_seq[port]);
    aj->next_seq[port] = rx.msg->env.seq + 1;
    in_order(a, rx);
  }
}

static void deliver(spn_stage_t *a, spn__link_t *l, spn_msg_t *m, bool counted, uint64_t now) {
  /* A replica of a replicated stage that gets no data of a job never opens
   * it: EOS just passes through. */
  bool is_eos = (m->env.flags & SPN_MSG_EOS) != 0;
  if (m->attempt && !ajob_find(a, m->env.job_id)) {
    /* Of an attempt that was restarted: never let it open the new one. */
    spn_job_t *job = spn__pipeline_find_job(a->pipe, m->env.job_id);
    bool stale = job && atomic_load(&job->attempt) != m->attempt;
    spn__job_unref(&job);
    if (stale) {
      spn__msg_free(&m);
      release(l, counted);
      return;
    }
  }
  spn__ajob_t *aj = ajob_get(a, m->env.job_id, !is_eos || a->srt->n_replicas == 1);
  if (!aj || !ajob_ok(aj) || (m->attempt && m->attempt != aj->attempt)) {
    spn__msg_free(&m);
    release(l, counted);
    return;
  }
  if (m->env.flags & SPN_MSG_EOS) {
    spn__msg_free(&m);
    release(l, counted);
    if (++aj->eos_got == a->eos_expected) {
      for (uint32_t p = 0; p < a->n_in; p++)
        if (a->reorder[p])
          drain_heap(a, aj, p, true);
      a->n_finishing++;
    }
    return;
  }
  /* ABI 1.1: copy what the port cannot take as it is (edge-mem.c). */
  spn_error_t perr = SPN_ERROR_INIT;
  if (spn__edge_place(a, l, m, aj->job, &perr) != SPN_OK) {
    fail_job(a, aj, perr.code ? perr.code : SPN_EDEVICE, perr.msg);
    spn__msg_free(&m);
    release(l, counted);
    return;
  }
  spn__rx_t rx = {.msg = m, .link = l, .aj = aj, .counted = counted, .t_ns = now};
  uint32_t port = l->to_port;
  if (a->reorder[port]) {
    if (m->env.seq != aj->next_seq[port])
      atomic_fetch_add_explicit(&a->reordered, 1, memory_order_relaxed);
    heap_push(&aj->heaps[port], rx);
    drain_heap(a, aj, port, false);
  } else {
    in_order(a, rx);
  }
}

static bool actor_recv(spn_stage_t *a, uint64_t now) {
  bool did = false;
  spn_pipeline_t *pipe = a->pipe;
  for (int f = 0; f < RX_FRAMES; f++) {
    zmq_msg_t zm;
    zmq_msg_init(&zm);
    if (zmq_msg_recv(&zm, a->sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&zm);
      break;
    }
    did = true;
    TSAN_ACQUIRE(a);
    const uint8_t *p = zmq_msg_data(&zm);
    size_t len = zmq_msg_size(&zm);
    frame_hdr_t h;
    if (len < sizeof h) {
      log_a(a, SPN_LOG_ERROR, 0, "%s: frame of %zu bytes is shorter than its header; dropped", a->endpoint, len);
      zmq_msg_close(&zm);
      continue;
    }
    memcpy(&h, p, sizeof h);
    spn__link_t *l = h.link < pipe->n_links ? pipe->links[h.link] : NULL;
    if (!l || l->to != a || (h.magic != FRAME_PTR && h.magic != FRAME_WIRE) ||
        (h.magic == FRAME_PTR) == l->serialize) {
      log_a(a, SPN_LOG_ERROR, 0, "%s: frame with bad magic 0x%08x or link %u; dropped", a->endpoint, h.magic,
            h.link);
      zmq_msg_close(&zm);
      continue;
    }
    if (h.magic == FRAME_PTR) {
      if (len != sizeof h + (size_t)h.count * (sizeof(spn_msg_t *) + 1)) {
        log_a(a, SPN_LOG_ERROR, 0, "%s: handle frame of %zu bytes for %u handles; dropped", a->endpoint, len,
              h.count);
        zmq_msg_close(&zm);
        continue;
      }
      for (uint32_t i = 0; i < h.count; i++) {
        spn_msg_t *m;
        memcpy(&m, p + sizeof h + i * sizeof m, sizeof m);
        deliver(a, l, m, p[sizeof h + h.count * sizeof m + i] != 0, now);
      }
    } else {
      size_t pos = sizeof h;
      for (uint32_t i = 0; i < h.count; i++) {
        spn_msg_t *m = NULL;
        bool counted = false;
        spn_error_t err = SPN_ERROR_INIT;
        size_t at = pos;
        uint64_t job_id = 0;
        if (len - pos >= 16)
          memcpy(&job_id, p + pos + 8, sizeof job_id);
        if (spn__msg_deserialize(p, len, &pos, a->device ? a->device : a->pipe->rt->host_dev, &m, &counted, &err) !=
            SPN_OK) {
          /* The rest of the frame cannot be trusted; fail the job the bad
           * message names (if any) and give back the frame's credit. */
          log_a(a, SPN_LOG_ERROR, job_id, "%s: frame message %u at byte %zu: %s", a->endpoint, i, at, err.msg);
          spn_job_t *job = spn__pipeline_find_job(pipe, job_id);
          if (job) {
            char text[SPN_ERROR_MSG_MAX];
            snprintf(text, sizeof text, "stage \"%s\": bad message on %s: %.700s", aname(a), a->endpoint, err.msg);
            atomic_store(&job->dead, true);
            spn__loop_post(pipe->rt, spn__event_new(SPN__EV_JOB_FAIL, job, SPN_EPROTO, text));
            spn__job_unref(&job);
          }
          /* count comes from the frame: bound the give-back by what the
           * link can hold, not by what the bytes claim. */
          for (uint32_t j = i; j < h.count && j - i < l->capacity; j++)
            release(l, true);
          break;
        }
        deliver(a, l, m, counted, now);
      }
    }
    zmq_msg_close(&zm);
  }
  return did;
}

/* ---- batching and processing ----------------------------------------------------------- */

static bool ensure_batch(spn_stage_t *a, uint32_t n) {
  if (n <= a->b_cap)
    return true;
  spn_msg_t **m = realloc(a->b_msgs, n * sizeof *m);
  if (m)
    a->b_msgs = m;
  void **s = realloc(a->b_states, n * sizeof *s);
  if (s)
    a->b_states = s;
  spn__rx_t *r = realloc(a->b_rx, n * sizeof *r);
  if (r)
    a->b_rx = r;
  if (!m || !s || !r)
    return false;
  a->b_cap = n;
  return true;
}

static bool actor_batch(spn_stage_t *a, uint64_t now, uint64_t *deadline) {
  if (!a->r_n)
    return false;
  uint32_t credit = out_credit(a);
  if (!credit && !(credit = want_credit(a)))
    return false;
  uint32_t maxb = a->srt->max_batch ? a->srt->max_batch : 1;
  uint64_t due_at = a->ready[a->r_head].t_ns + (uint64_t)a->srt->max_delay_ms * 1000000ull;
  /* A job's EOS does not make its last frames due: they may still share a
   * batch with other jobs' frames, and wait at most max_delay like any. */
  bool due = a->r_n >= maxb || !a->srt->max_delay_ms || now >= due_at;
  if (!due) {
    if (due_at < *deadline)
      *deadline = due_at;
    return false;
  }
  uint32_t n = maxb;
  if (n > a->r_n)
    n = (uint32_t)a->r_n;
  if (n > credit)
    n = credit;
  if (!ensure_batch(a, n))
    n = a->b_cap ? a->b_cap : 0;
  if (!n)
    return false;
  uint32_t cnt = 0;
  for (uint32_t i = 0; i < n; i++) {
    spn__rx_t rx = a->ready[a->r_head];
    a->r_head = (a->r_head + 1) % a->r_cap;
    a->r_n--;
    rx.aj->n_ready--;
    if (!ajob_ok(rx.aj)) {
      spn__msg_free(&rx.msg);
      release(rx.link, rx.counted);
      continue;
    }
    a->b_rx[cnt] = rx;
    a->b_msgs[cnt] = rx.msg;
    a->b_states[cnt] = rx.aj->job_state;
    cnt++;
  }
  if (cnt) {
    /* Progress counts what terminal actors were given on their first input
     * (a sink's side inputs, such as encode_av's audio, are not frames);
     * read the envelope before process may forward or free the message. */
    for (uint32_t i = 0; i < cnt; i++)
      if (a->srt->terminal && a->b_rx[i].link->to_port == 0)
        count_done(a, a->b_rx[i].aj->job, a->b_msgs[i]->env.total, 0);
    const spn_stage_kind_t *k = a->srt->kind;
    int32_t rc = SPN_OK;
    spn_error_t err = SPN_ERROR_INIT;
    if (spn__slot_down(a->pipe->rt, a->dev_slot)) {
      rc = spn_error_set(&err, SPN_EDEVICE, "%s is quarantined", a->device_name);
    } else if (k->process) {
      int st = st_begin(a);
      uint64_t t0 = spn__now_ns();
      atomic_store_explicit(&a->call_since_ns, t0, memory_order_relaxed);
      rc = k->process(a, a->state, a->b_msgs, a->b_states, cnt, &err);
      atomic_store_explicit(&a->call_since_ns, 0, memory_order_relaxed);
      uint64_t dt = spn__now_ns() - t0;
      st_end(a, st);
      atomic_fetch_add(&a->srt->busy_ns, dt);
      spn__stage_observe(a->srt, dt, cnt);
      /* Device time, split evenly among the batch's frames' jobs. */
      for (uint32_t i = 0; a->dev_slot >= 0 && i < cnt; i++)
        atomic_fetch_add_explicit(&a->b_rx[i].aj->job->device_ns, dt / cnt + (i == 0 ? dt % cnt : 0),
                                  memory_order_relaxed);
    }
    if (rc < 0)
      for (uint32_t i = 0; i < cnt; i++)
        fail_job(a, a->b_rx[i].aj, rc, err.msg);
    for (uint32_t i = 0; i < cnt; i++) {
      if (a->srt->terminal && a->b_rx[i].link->to_port == 0)
        atomic_fetch_add(&a->b_rx[i].aj->job->stage_done[a->srt->index], 1);
      spn__msg_free(&a->b_msgs[i]);
      release(a->b_rx[i].link, a->b_rx[i].counted);
    }
  }
  return true;
}

static bool actor_finish_ready(spn_stage_t *a) {
  if (!a->n_finishing)
    return false;
  bool did = false;
  for (spn__ajob_t *aj = a->jobs, *next; aj; aj = next) {
    next = aj->next;
    if (aj->eos_got == a->eos_expected && !aj->n_ready && !aj->finish_done) {
      aj->finish_done = true;
      a->n_finishing--;
      finish_job(a, aj);
      did = true;
    }
  }
  return did;
}

/* The job a source generates next: the highest priority first, round-robin
 * among jobs of equal priority. */
static spn__ajob_t *next_generating(spn_stage_t *a) {
  bool any = false;
  int32_t best = 0;
  for (spn__ajob_t *aj = a->jobs; aj; aj = aj->next)
    if (aj->generating && (!any || aj->job->priority > best)) {
      best = aj->job->priority;
      any = true;
    }
  if (!any)
    return NULL;
  spn__ajob_t *start = a->gen_cursor && a->gen_cursor->next ? a->gen_cursor->next : a->jobs;
  spn__ajob_t *aj = start;
  do {
    if (aj->generating && aj->job->priority == best)
      return aj;
    aj = aj->next ? aj->next : a->jobs;
  } while (aj != start);
  return NULL;
}

static bool actor_generate(spn_stage_t *a, uint64_t now, uint64_t *deadline) {
  if (!a->is_source || !a->jobs)
    return false;
  if (a->retry_ns > now) {
    if (a->retry_ns < *deadline)
      *deadline = a->retry_ns;
    return false;
  }
  bool did = false;
  const spn_stage_kind_t *k = a->srt->kind;
  for (int i = 0; i < 64; i++) {
    spn__ajob_t *aj = next_generating(a);
    if (!aj)
      break;
    a->gen_cursor = aj;
    if (!ajob_ok(aj) || atomic_load(&aj->job->cancelled)) {
      aj->generating = false; /* ABORT_JOB closes it */
      continue;
    }
    if (!out_credit(a) && !want_credit(a))
      break;
    spn_error_t err = SPN_ERROR_INIT;
    if (spn__slot_down(a->pipe->rt, a->dev_slot)) {
      aj->generating = false;
      char text[160];
      snprintf(text, sizeof text, "%s is quarantined", a->device_name);
      fail_job(a, aj, SPN_EDEVICE, text);
      did = true;
      continue;
    }
    a->cur_job = aj;
    int st = k->generate ? st_begin(a) : -1;
    uint64_t t0 = spn__now_ns();
    atomic_store_explicit(&a->call_since_ns, t0, memory_order_relaxed);
    int32_t rc = k->generate ? k->generate(a, a->state, aj->job_state, &err) : SPN_EOS;
    atomic_store_explicit(&a->call_since_ns, 0, memory_order_relaxed);
    uint64_t dt = spn__now_ns() - t0;
    st_end(a, st);
    atomic_fetch_add(&a->srt->busy_ns, dt);
    if (k->generate)
      spn__stage_observe(a->srt, dt, 0);
    if (a->dev_slot >= 0)
      atomic_fetch_add_explicit(&aj->job->device_ns, dt, memory_order_relaxed);
    a->cur_job = NULL;
    did = true;
    if (rc == SPN_EOS) {
      aj->generating = false;
      aj->finish_done = true;
      finish_job(a, aj);
    } else if (rc == SPN_EAGAIN) {
      a->retry_ns = now + 1000000ull;
      if (a->retry_ns < *deadline)
        *deadline = a->retry_ns;
      break;
    } else if (rc < 0) {
      aj->generating = false;
      fail_job(a, aj, rc, err.msg);
    }
  }
  return did;
}

bool spn__actor_step(spn_stage_t *a, uint64_t now, uint64_t *deadline) {
  bool did = false;
  if (a->sock)
    did |= actor_recv(a, now);
  /* Process as long as there is work and credit, but yield to the other
   * actors of this executor after a while. */
  for (int i = 0; i < 16 && actor_batch(a, now, deadline); i++)
    did = true;
  did |= actor_finish_ready(a);
  did |= actor_generate(a, now, deadline);
  flush_all(a);
  return did;
}

/* ---- commands ------------------------------------------------------------------------------ */

/* A replicated source spreads jobs over its replicas: one of them (chosen
 * by the loop: by job id, among those on usable devices) generates the job; the others only send its EOS, so that consumers,
 * which count EOS from every producer replica, see the job end. They never
 * open it. */
void spn__actor_start_job(spn_stage_t *a, spn_job_t *job, bool mine) {
  spn__ajob_t *aj = ajob_get(a, job->id, mine);
  if (!aj || !ajob_ok(aj))
    return;
  if (mine) {
    aj->generating = true;
  } else {
    aj->finish_done = true;
    finish_job(a, aj);
  }
}

void spn__actor_abort_job(spn_stage_t *a, spn_job_t *job) {
  spn__ajob_t *aj = ajob_find(a, job->id);
  if (aj) {
    /* Drop its queued messages, keep everyone else's in order. */
    size_t keep = 0;
    for (size_t i = 0; i < a->r_n; i++) {
      spn__rx_t rx = a->ready[(a->r_head + i) % a->r_cap];
      if (rx.aj == aj) {
        spn__msg_free(&rx.msg);
        release(rx.link, rx.counted);
      } else {
        a->ready[(a->r_head + keep++) % a->r_cap] = rx;
      }
    }
    a->r_n = keep;
    if (aj->eos_got == a->eos_expected && !aj->finish_done && !a->is_source)
      a->n_finishing--;
    if (aj->opened && a->srt->kind->job_close)
      a->srt->kind->job_close(a, a->state, aj->job_state, false);
    ajob_remove(a, aj);
  }
  spn__loop_post(a->pipe->rt, spn__event_new(SPN__EV_ABORT_ACK, job, SPN_OK, NULL));
}

static int set_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

int32_t spn__actor_create(spn_stage_t *a, spn_error_t *err) {
  spn_runtime_t *rt = a->pipe->rt;
  const spn_stage_kind_t *k = a->srt->kind;
  if (k->n_inputs > 0) {
    a->sock = zmq_socket(rt->zctx, ZMQ_PULL);
    if (!a->sock)
      return spn_error_set(err, SPN_EIO, "%s: stage \"%s\": cannot create its mailbox: %s", a->srt->spec->where,
                           aname(a), zmq_strerror(zmq_errno()));
    set_int(a->sock, ZMQ_LINGER, 0);
    set_int(a->sock, ZMQ_RCVHWM, 0); /* credit bounds the edge */
    if (zmq_bind(a->sock, a->endpoint) != 0)
      return spn_error_set(err, SPN_EIO, "%s: stage \"%s\": cannot listen on \"%s\": %s", a->srt->spec->where,
                           aname(a), a->endpoint, zmq_strerror(zmq_errno()));
    size_t n = sizeof a->endpoint;
    if (a->serialized_in)
      zmq_getsockopt(a->sock, ZMQ_LAST_ENDPOINT, a->endpoint, &n);
  }
  if (k->create) {
    int32_t rc = k->create(a, a->srt->spec->config, &a->state, err);
    if (rc < 0) {
      stage_error(err, a, "create");
      return rc;
    }
  }
  a->created = true;
  if (k->preload) {
    int32_t rc = k->preload(a, a->state, err);
    if (rc < 0) {
      char what[96];
      snprintf(what, sizeof what, "preload on %s", a->device_name);
      stage_error(err, a, what);
      return rc;
    }
  }
  return SPN_OK;
}

int32_t spn__actor_connect(spn_stage_t *a, spn_error_t *err) {
  spn_runtime_t *rt = a->pipe->rt;
  for (uint32_t p = 0; p < a->n_out; p++)
    for (uint32_t e = 0; e < a->out[p].n_edges; e++)
      for (uint32_t i = 0; i < a->out[p].edges[e].n_links; i++) {
        spn__link_t *l = a->out[p].edges[e].links[i];
        l->tx = malloc(TX_MAX * sizeof *l->tx);
        l->tx_counted = malloc(TX_MAX * sizeof *l->tx_counted);
        l->sock = zmq_socket(rt->zctx, ZMQ_PUSH);
        if (!l->tx || !l->tx_counted || !l->sock)
          return spn_error_set(err, SPN_ENOMEM, "stage \"%s\": cannot create an edge to \"%s\"", aname(a),
                               aname(l->to));
        set_int(l->sock, ZMQ_LINGER, 0);
        /* Credit bounds counted messages; the HWM (in frames) is a backstop
         * that can only be reached if credit accounting were wrong. */
        set_int(l->sock, ZMQ_SNDHWM, (int)l->capacity + 1024);
        if (zmq_connect(l->sock, l->to->endpoint) != 0)
          return spn_error_set(err, SPN_EIO, "stage \"%s\": cannot connect to \"%s\" at %s: %s", aname(a),
                               aname(l->to), l->to->endpoint, zmq_strerror(zmq_errno()));
      }
  return SPN_OK;
}

void spn__actor_destroy(spn_stage_t *a) {
  const spn_stage_kind_t *k = a->srt->kind;
  /* Anything still in the mailbox: free (every producer is idle now). */
  if (a->sock)
    actor_recv(a, spn__now_ns());
  while (a->r_n) {
    spn__rx_t rx = a->ready[a->r_head];
    a->r_head = (a->r_head + 1) % a->r_cap;
    a->r_n--;
    spn__msg_free(&rx.msg);
    release(rx.link, rx.counted);
  }
  while (a->jobs) {
    if (a->jobs->opened && k->job_close)
      k->job_close(a, a->state, a->jobs->job_state, false);
    ajob_remove(a, a->jobs);
  }
  st_free(a);
  if (a->created && k->destroy)
    k->destroy(a, a->state);
  a->created = false;
  spn__edge_place_done(a);
  for (uint32_t p = 0; p < a->n_out; p++)
    for (uint32_t e = 0; e < a->out[p].n_edges; e++)
      for (uint32_t i = 0; i < a->out[p].edges[e].n_links; i++) {
        spn__link_t *l = a->out[p].edges[e].links[i];
        for (uint32_t j = 0; j < l->n_tx; j++)
          spn__msg_free(&l->tx[j]);
        l->n_tx = 0;
        if (l->sock)
          zmq_close(l->sock);
        l->sock = NULL;
      }
  if (a->sock) {
    zmq_close(a->sock);
    /* An ipc mailbox leaves its socket file behind: remove it (not for the
     * abstract namespace, "ipc://@name", which has no file). */
    if (a->serialized_in && !strncmp(a->endpoint, "ipc://", 6) && a->endpoint[6] != '@')
      unlink(a->endpoint + 6);
  }
  a->sock = NULL;
  free(a->ready);
  a->ready = NULL;
  free(a->b_msgs);
  free(a->b_states);
  free(a->b_rx);
  free(a->ser_buf);
  a->b_msgs = NULL;
  a->b_states = NULL;
  a->b_rx = NULL;
  a->ser_buf = NULL;
}

/* ---- host table entries that act on the actor ----------------------------------------------- */

int32_t spn__host_emit(spn_stage_t *a, uint32_t port, spn_msg_t **msgp, spn_error_t *err) {
  if (!msgp || !*msgp)
    return spn_error_set(err, SPN_EINVAL, "stage \"%s\": emit of a NULL message", a ? aname(a) : "?");
  spn_msg_t *m = *msgp;
  *msgp = NULL;
  if (port >= a->n_out) {
    spn__msg_free(&m);
    return spn_error_set(err, SPN_EINVAL, "stage \"%s\": emit on output %u, the kind has %u", aname(a), port,
                         a->n_out);
  }
  spn__ajob_t *aj = a->cur_job && a->cur_job->id == m->env.job_id ? a->cur_job : ajob_find(a, m->env.job_id);
  if (!aj) {
    uint64_t id = m->env.job_id;
    spn__msg_free(&m);
    return spn_error_set(err, SPN_EINVAL, "stage \"%s\": emit for job %llu, which is not open here", aname(a),
                         (unsigned long long)id);
  }
  if (!ajob_ok(aj)) {
    spn__msg_free(&m); /* the job is over: its messages go nowhere */
    return SPN_OK;
  }
  m->env.flags &= ~(uint32_t)SPN_MSG_EOS; /* EOS is the runtime's to send */
  m->attempt = aj->attempt;
  /* A buffer of this device (device or pinned memory) emitted without a
   * readiness event: whatever the stage queued on its stream before emit
   * may still be writing it, and the consumer runs on another stream (its
   * own thread and stream, spn_device_threads_t). buffer_set_ready is the
   * stage's to call; where it did not, mark the buffer ready here, after
   * all the stage queued so far, so a consumer waits for it either way. */
  if (a->ex->stream && a->device)
    for (uint32_t i = 0; i < m->n_items; i++) {
      spn_buffer_t *b = m->items[i].buffer;
      if (m->items[i].kind == SPN_ITEM_TENSOR && b && !b->ready && b->bt->device == a->device &&
          b->bt->mem_kind != SPN_MEM_HOST) {
        spn_error_t e = SPN_ERROR_INIT;
        if (spn_buffer_set_ready(b, a->ex->stream, &e) != SPN_OK) {
          int32_t rc = spn_error_set(err, SPN_EDEVICE, "stage \"%s\": job %llu: marking \"%s\" ready on %s: %.800s",
                                     aname(a), (unsigned long long)m->env.job_id,
                                     m->items[i].name ? m->items[i].name : "", a->device->name, e.msg);
          spn__msg_free(&m);
          return rc;
        }
      }
    }
  send_port(a, port, m, true, false, aj);
  return SPN_OK;
}

void spn__host_fail_job(spn_stage_t *a, uint64_t job_id, int32_t status, const char *msg) {
  spn__ajob_t *aj = ajob_find(a, job_id);
  if (aj) {
    fail_job(a, aj, status < 0 ? status : SPN_EINTERNAL, msg);
    return;
  }
  spn_job_t *job = spn__pipeline_find_job(a->pipe, job_id);
  if (job) {
    atomic_store(&job->dead, true);
    char text[SPN_ERROR_MSG_MAX];
    snprintf(text, sizeof text, "stage \"%s\": %s", aname(a), msg ? msg : spn_strerror(status));
    log_a(a, SPN_LOG_ERROR, job_id, "%s", text);
    spn__loop_post(a->pipe->rt, spn__event_new(SPN__EV_JOB_FAIL, job, status < 0 ? status : SPN_EINTERNAL, text));
    spn__job_unref(&job);
  }
}

bool spn__host_job_cancelled(spn_stage_t *a, uint64_t job_id) {
  spn__ajob_t *aj = ajob_find(a, job_id);
  if (aj)
    return atomic_load(&aj->job->cancelled) || atomic_load(&aj->job->dead);
  spn_job_t *job = spn__pipeline_find_job(a->pipe, job_id);
  if (!job)
    return true;
  bool c = atomic_load(&job->cancelled) || atomic_load(&job->dead);
  spn__job_unref(&job);
  return c;
}
