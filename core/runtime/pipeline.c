/* pipeline.c — from a validated spec to running actors; the job API.
 *
 * A spn__pipeline_spec_t (built by the front end from TOML, or by a test in
 * C) is instantiated as actors and links:
 *   - each stage gets replicas: `instances` per device, on every device of
 *     `instances.devices` ("all" or "0,2") or on the stage's own device; a
 *     CPU-only kind with device "auto"/"cpu" runs on the CPU pool;
 *   - each edge becomes one link per (producer replica, consumer replica):
 *     a PUSH socket of the producer connected to the consumer's PULL mailbox
 *     (inproc by default, the stage's `endpoint` when it names ipc/tcp);
 *   - re-ordering is switched on where a single consumer replica is fed by a
 *     replicated producer;
 *   - placement ([pipeline] placement, docs/gpu.md): "chain" (the default)
 *     sends a producer's data to the consumer replicas on its own device, and
 *     pins each job to one device where a CPU stage feeds replicated device
 *     stages (actor.c pick_link), so a job runs every device stage on one
 *     device; "fanout" spreads every producer's batches over the replicas
 *     of every device, and the consumer after them re-orders by seq.
 * Instances are created and preloaded on their executors (in parallel)
 * before spn_pipeline_load returns; a failure tears everything down and
 * names the stage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "debug-internal.h"
#include "files-internal.h"
#include "runtime-internal.h"
#include "spec-build-internal.h"
#include "spindle/engine.h"

static spn_device_t *find_device(spn_runtime_t *rt, int32_t kind, long index) {
  for (uint32_t i = 0; i < rt->n_devices; i++)
    if (rt->devices[i]->kind == kind && rt->devices[i]->index == index)
      return rt->devices[i];
  return NULL;
}

static int32_t device_slot(spn_runtime_t *rt, const spn_device_t *d) {
  for (uint32_t i = 0; d && i < rt->n_devices; i++)
    if (rt->devices[i] == d)
      return (int32_t)i;
  return -1;
}

static spn__executor_t *device_executor(spn_runtime_t *rt, spn_device_t *d) {
  for (uint32_t i = 0; i < rt->n_devices; i++)
    if (rt->devices[i] == d)
      return &rt->dev_ex[i];
  return NULL;
}

static int32_t parse_index(const char *s, const char **end, long *out) {
  char *e = NULL;
  long v = strtol(s, &e, 10);
  if (e == s || v < 0)
    return SPN_ECONFIG;
  *out = v;
  *end = e;
  return SPN_OK;
}

/* Where replica r of the stage runs. Fills execs/devs (n_replicas each). */
static int32_t place_stage(spn_pipeline_t *pipe, spn__stage_rt_t *srt, spn__executor_t ***execs,
                           spn_device_t ***devs, spn_error_t *err) {
  spn_runtime_t *rt = pipe->rt;
  const spn__stage_spec_t *ss = srt->spec;
  int32_t need = srt->kind->device_need;
  uint32_t per = ss->instances ? ss->instances : 1;
  spn_device_t *list[256];
  uint32_t n_list = 0;
  bool pool = false;
  const char *idev = ss->instance_devices;
  if (idev && *idev) {
    if (!strcmp(idev, "all")) {
      for (uint32_t i = 0; i < rt->n_devices && n_list < 256; i++)
        list[n_list++] = rt->devices[i];
    } else {
      const char *p = idev;
      while (*p && n_list < 256) {
        long v;
        const char *e;
        if (parse_index(p, &e, &v) != SPN_OK || (*e && *e != ','))
          return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": instances.devices \"%s\": expected \"all\" or "
                               "device indexes like \"0,2\"", ss->where, ss->name, idev);
        if ((uint32_t)v >= rt->n_devices)
          return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": instances.devices names device %ld, the "
                               "runtime has %u (%s)", ss->where, ss->name, v, rt->n_devices, rt->devices_spec);
        list[n_list++] = rt->devices[v];
        p = *e ? e + 1 : e;
      }
    }
  } else {
    const char *d = ss->device && *ss->device ? ss->device : "auto";
    if (!strcmp(d, "auto")) {
      if (need == SPN_NEED_CPU)
        pool = true;
      else if (need == SPN_NEED_CUDA)
        list[n_list++] = find_device(rt, SPN_DEVICE_CUDA, 0);
      else if (rt->n_devices <= 1 && !find_device(rt, SPN_DEVICE_CUDA, 0))
        pool = true; /* a kind that runs either side, on a runtime that is one CPU: the pool, as a CPU kind */
      else
        list[n_list++] = rt->devices[0];
    } else if (!strcmp(d, "cpu")) {
      pool = true;
    } else {
      int32_t kind = !strncmp(d, "cpu:", 4) ? SPN_DEVICE_CPU : !strncmp(d, "cuda", 4) ? SPN_DEVICE_CUDA : -1;
      long idx = 0;
      const char *colon = strchr(d, ':'), *e = NULL;
      if (kind < 0 || (colon && (parse_index(colon + 1, &e, &idx) != SPN_OK || *e)))
        return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": device \"%s\": expected auto, cpu, cpu:N, cuda or "
                             "cuda:N", ss->where, ss->name, d);
      list[n_list++] = find_device(rt, kind, idx);
    }
    if (!pool && !list[0])
      return spn_error_set(err, SPN_EDEVICE, "%s: stage \"%s\": device \"%s\" is not available (runtime devices: %s)",
                           ss->where, ss->name, d, rt->devices_spec);
  }
  if (!pool)
    for (uint32_t i = 0; i < n_list; i++) {
      if (need == SPN_NEED_CUDA && list[i]->kind != SPN_DEVICE_CUDA)
        return spn_error_set(err, SPN_EDEVICE, "%s: stage \"%s\": kind \"%s\" needs a CUDA device, placed on %s",
                             ss->where, ss->name, srt->kind->name, list[i]->name);
      if (need == SPN_NEED_CPU && list[i]->kind != SPN_DEVICE_CPU)
        return spn_error_set(err, SPN_EDEVICE, "%s: stage \"%s\": kind \"%s\" runs on the CPU only, placed on %s",
                             ss->where, ss->name, srt->kind->name, list[i]->name);
    }
  srt->n_replicas = pool ? per : per * n_list;
  *execs = calloc(srt->n_replicas, sizeof **execs);
  *devs = calloc(srt->n_replicas, sizeof **devs);
  if (!*execs || !*devs)
    return spn_error_set(err, SPN_ENOMEM, "out of memory placing stage \"%s\"", ss->name);
  for (uint32_t r = 0; r < srt->n_replicas; r++) {
    if (pool) {
      (*execs)[r] = &rt->pool[atomic_fetch_add(&rt->pool_rr, 1) % rt->n_pool];
      (*devs)[r] = NULL;
    } else {
      spn_device_t *dv = list[r / per];
      (*devs)[r] = dv;
      (*execs)[r] = device_executor(rt, dv);
    }
  }
  return SPN_OK;
}

static int32_t make_endpoint(spn_pipeline_t *pipe, spn_stage_t *a, spn_error_t *err) {
  const spn__stage_spec_t *ss = a->srt->spec;
  const char *ep = ss->endpoint;
  if (!ep || !*ep || !strcmp(ep, "inproc")) {
    snprintf(a->endpoint, sizeof a->endpoint, "inproc://spindle-p%llu-a%u", (unsigned long long)pipe->id, a->index);
    return SPN_OK;
  }
  a->serialized_in = true;
  uint32_t n = a->srt->n_replicas;
  if (!strncmp(ep, "ipc://", 6)) {
    if (n == 1)
      snprintf(a->endpoint, sizeof a->endpoint, "%s", ep);
    else
      snprintf(a->endpoint, sizeof a->endpoint, "%s.%u", ep, a->replica);
    return SPN_OK;
  }
  if (!strncmp(ep, "tcp://", 6)) {
    const char *colon = strrchr(ep + 6, ':');
    if (!colon)
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": endpoint \"%s\": expected tcp://host:port or "
                           "tcp://host:*", ss->where, ss->name, ep);
    if (!strcmp(colon, ":*") || n == 1) {
      snprintf(a->endpoint, sizeof a->endpoint, "%s", ep);
      return SPN_OK;
    }
    long port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port + n > 65535)
      return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": endpoint \"%s\": bad port", ss->where, ss->name, ep);
    snprintf(a->endpoint, sizeof a->endpoint, "%.*s:%ld", (int)(colon - ep), ep, port + a->replica);
    return SPN_OK;
  }
  return spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": endpoint \"%s\": expected ipc://... or tcp://...",
                       ss->where, ss->name, ep);
}

static void post_and_wait(spn_pipeline_t *pipe, int32_t type, uint32_t n, int32_t *rc, spn_error_t *err) {
  spn__barrier_t b;
  spn__barrier_init(&b, n);
  for (uint32_t i = 0; i < n; i++) {
    spn__cmd_t *c = calloc(1, sizeof *c);
    SPN_ASSERT(c);
    c->type = type;
    c->actor = pipe->actors[i];
    c->barrier = &b;
    spn__executor_post(pipe->actors[i]->ex, c);
  }
  int32_t st = spn__barrier_wait(&b, err);
  if (rc)
    *rc = st;
  spn__barrier_destroy(&b);
}

static void pipeline_release(spn_pipeline_t *pipe) {
  for (uint32_t i = 0; i < pipe->n_actors; i++) {
    spn_stage_t *a = pipe->actors[i];
    if (!a)
      continue;
    if (a->own_ex) { /* its actor is destroyed (or was never created) */
      spn__executor_stop(a->own_ex);
      free(a->own_ex);
    }
    for (uint32_t p = 0; p < a->n_out; p++) {
      for (uint32_t e = 0; e < a->out[p].n_edges; e++) {
        free(a->out[p].edges[e].links);
        free(a->out[p].edges[e].targets);
      }
      free(a->out[p].edges);
    }
    free(a->out);
    free(a->links_in);
    free(a->reorder);
    free(a);
  }
  for (uint32_t i = 0; i < pipe->n_links; i++) {
    free(pipe->links[i]->tx);
    free(pipe->links[i]->tx_counted);
    free(pipe->links[i]);
  }
  for (uint32_t i = 0; i < pipe->n_stages; i++)
    free(pipe->stages[i].replicas);
  free(pipe->links);
  free(pipe->actors);
  free(pipe->stages);
  if (pipe->owns_spec)
    spn__spec_free(&pipe->spec);
  pthread_mutex_destroy(&pipe->mu);
  pthread_cond_destroy(&pipe->cv);
  spn__warns_destroy(&pipe->warns);
  free(pipe);
}

static int32_t add_link(spn_pipeline_t *pipe, spn_stage_t *from, uint32_t fport, spn_stage_t *to, uint32_t tport,
                        uint32_t capacity, spn__link_t **out) {
  spn__link_t *l = calloc(1, sizeof *l);
  spn__link_t **v = realloc(pipe->links, (pipe->n_links + 1) * sizeof *v);
  if (!l || !v) {
    free(l);
    if (v)
      pipe->links = v;
    return SPN_ENOMEM;
  }
  pipe->links = v;
  l->id = pipe->n_links;
  l->from = from;
  l->to = to;
  l->from_port = fport;
  l->to_port = tport;
  l->capacity = capacity;
  l->serialize = to->serialized_in;
  pipe->wire |= l->serialize;
  atomic_init(&l->in_flight, 0);
  atomic_init(&l->max_in_flight, 0);
  atomic_init(&l->ctl_in_flight, 0);
  atomic_init(&l->want_credit, false);
  pipe->links[pipe->n_links++] = l;
  *out = l;
  return SPN_OK;
}

int32_t spn__pipeline_new_from_spec(spn_runtime_t *rt, spn__pipeline_spec_t *spec, bool take_spec,
                                    spn_pipeline_t **out, spn_error_t *err) {
  int32_t rc = SPN_OK;
  spn_pipeline_t *pipe = calloc(1, sizeof *pipe);
  if (!pipe) {
    if (take_spec)
      spn__spec_free(&spec);
    return spn_error_set(err, SPN_ENOMEM, "out of memory creating a pipeline");
  }
  pipe->rt = rt;
  pipe->spec = spec;
  pipe->owns_spec = take_spec;
  pipe->placement = spec->placement;
  pipe->id = atomic_fetch_add(&rt->next_pipe_id, 1);
  pthread_mutex_init(&pipe->mu, NULL);
  pthread_cond_init(&pipe->cv, NULL);
  spn__warns_init(&pipe->warns);
  const char *pname = spec->name ? spec->name : "pipeline";
  if (!spec->n_stages) {
    rc = spn_error_set(err, SPN_ECONFIG, "%s: pipeline \"%s\" has no stages", spec->file ? spec->file : pname, pname);
    goto out_free;
  }
  pipe->n_stages = (uint32_t)spec->n_stages;
  pipe->stages = calloc(pipe->n_stages, sizeof *pipe->stages);
  if (!pipe->stages)
    goto out_nomem;
  /* Stages and their replicas. */
  uint32_t total = 0;
  for (uint32_t s = 0; s < pipe->n_stages; s++) {
    spn__stage_rt_t *srt = &pipe->stages[s];
    srt->index = s;
    srt->spec = &spec->stages[s];
    srt->kind = spec->stages[s].kind;
    srt->max_batch = srt->spec->max_batch ? srt->spec->max_batch : (srt->kind->max_batch ? srt->kind->max_batch : 1);
    srt->max_delay_ms = srt->spec->max_batch ? srt->spec->max_delay_ms : srt->kind->max_delay_ms;
    srt->terminal = true;
    for (size_t e = 0; e < spec->n_edges; e++)
      if (spec->edges[e].from_stage == s)
        srt->terminal = false;
  }
  for (size_t e = 0; e < spec->n_edges; e++) {
    const spn__edge_spec_t *es = &spec->edges[e];
    if (es->from_stage >= pipe->n_stages || es->to_stage >= pipe->n_stages ||
        es->from_port >= spec->stages[es->from_stage].kind->n_outputs ||
        es->to_port >= spec->stages[es->to_stage].kind->n_inputs) {
      rc = spn_error_set(err, SPN_ECONFIG, "pipeline \"%s\": edge %zu names a stage or port that does not exist", pname,
                         e);
      goto out_free;
    }
  }
  for (uint32_t s = 0; s < pipe->n_stages; s++) {
    spn__stage_rt_t *srt = &pipe->stages[s];
    spn__executor_t **ex = NULL;
    spn_device_t **dv = NULL;
    rc = place_stage(pipe, srt, &ex, &dv, err);
    if (rc == SPN_OK) {
      srt->replicas = calloc(srt->n_replicas, sizeof *srt->replicas);
      spn_stage_t **v = realloc(pipe->actors, (total + srt->n_replicas) * sizeof *v);
      if (v)
        pipe->actors = v;
      if (!srt->replicas || !v)
        rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating stage \"%s\"", srt->spec->name);
    }
    for (uint32_t r = 0; rc == SPN_OK && r < srt->n_replicas; r++) {
      spn_stage_t *a = calloc(1, sizeof *a);
      if (!a) {
        rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating stage \"%s\"", srt->spec->name);
        break;
      }
      a->head.struct_size = sizeof a->head;
      a->head.host = pipe->rt->host; /* the complete table (host.c), whatever init got */
      a->pipe = pipe;
      a->srt = srt;
      a->replica = r;
      a->index = total;
      a->ex = ex[r];
      a->device = dv[r];
      a->dev_slot = device_slot(rt, dv[r]);
      snprintf(a->device_name, sizeof a->device_name, "%.63s", dv[r] ? dv[r]->name : "cpu");
      pipe->actors[total++] = a;
      pipe->n_actors = total;
      srt->replicas[r] = a;
      if (dv[r] && rt->stage_threads) {
        /* Its own thread and stream on the device (spn_device_threads_t). */
        char name[64];
        snprintf(name, sizeof name, "%.30s %.20s#%u", dv[r]->name, srt->spec->name, r);
        a->own_ex = calloc(1, sizeof *a->own_ex);
        if (!a->own_ex) {
          rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating stage \"%s\"", srt->spec->name);
          break;
        }
        if ((rc = spn__executor_start(rt, a->own_ex, a->index, dv[r], name, err)) != SPN_OK) {
          free(a->own_ex);
          a->own_ex = NULL;
          spn_error_prefix(err, "stage \"%s\" on %s", srt->spec->name, dv[r]->name);
          break;
        }
        a->ex = a->own_ex;
      }
      a->is_source = srt->kind->n_inputs == 0;
      a->n_in = srt->kind->n_inputs;
      a->n_out = srt->kind->n_outputs;
      a->out = calloc(a->n_out ? a->n_out : 1, sizeof *a->out);
      a->links_in = calloc(a->n_in ? a->n_in : 1, sizeof *a->links_in);
      a->reorder = calloc(a->n_in ? a->n_in : 1, sizeof *a->reorder);
      if (!a->out || !a->links_in || !a->reorder)
        rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating stage \"%s\"", srt->spec->name);
      else
        rc = make_endpoint(pipe, a, err);
    }
    free(ex);
    free(dv);
    if (rc != SPN_OK)
      goto out_free;
    if (srt->terminal)
      pipe->n_terminal += srt->n_replicas;
  }
  /* Links: every producer replica to every consumer replica of each edge. */
  for (size_t e = 0; e < spec->n_edges; e++) {
    const spn__edge_spec_t *es = &spec->edges[e];
    spn__stage_rt_t *from = &pipe->stages[es->from_stage], *to = &pipe->stages[es->to_stage];
    uint32_t cap = to->spec->edge_capacity ? to->spec->edge_capacity : rt->edge_capacity;
    for (uint32_t p = 0; p < from->n_replicas; p++) {
      spn_stage_t *a = from->replicas[p];
      spn__out_port_t *op = &a->out[es->from_port];
      spn__out_edge_t *v = realloc(op->edges, (op->n_edges + 1) * sizeof *v);
      if (!v)
        goto out_nomem;
      op->edges = v;
      spn__out_edge_t *ed = &op->edges[op->n_edges++];
      memset(ed, 0, sizeof *ed);
      ed->rr = p; /* stagger producers over the consumers */
      ed->links = calloc(to->n_replicas, sizeof *ed->links);
      if (!ed->links)
        goto out_nomem;
      for (uint32_t c = 0; c < to->n_replicas; c++) {
        if (add_link(pipe, a, es->from_port, to->replicas[c], es->to_port, cap, &ed->links[c]) != SPN_OK)
          goto out_nomem;
        /* ABI 1.1: what the consumer port takes (edge-mem.c); specs built
         * without negotiation (tests) take host memory. */
        ed->links[c]->edge = (uint32_t)e;
        ed->links[c]->accept_mem = es->mem_to ? es->mem_to
                                   : to->spec->in_caps ? to->spec->in_caps[es->to_port].mem_kinds
                                                       : SPN_MEMSET_HOST;
        if (!ed->links[c]->accept_mem)
          ed->links[c]->accept_mem = SPN_MEMSET_HOST;
        ed->n_links++;
        to->replicas[c]->links_in[es->to_port]++;
        to->replicas[c]->eos_expected++;
      }
      /* Chain per device: consumer replicas on the producer's device take
       * all its data; without any (or with fan-out), every replica does. */
      ed->targets = calloc(to->n_replicas, sizeof *ed->targets);
      if (!ed->targets)
        goto out_nomem;
      for (uint32_t c = 0; c < to->n_replicas && pipe->placement == SPN__PLACE_CHAIN; c++)
        if (a->device && to->replicas[c]->device == a->device)
          ed->targets[ed->n_targets++] = ed->links[c];
      if (!ed->n_targets)
        for (uint32_t c = 0; c < to->n_replicas; c++)
          ed->targets[ed->n_targets++] = ed->links[c];
      /* Chain placement, consumers on several devices: pin jobs. */
      for (uint32_t c = 1; c < ed->n_targets && pipe->placement == SPN__PLACE_CHAIN; c++)
        if (ed->targets[c]->to->dev_slot >= 0 && ed->targets[c]->to->dev_slot != ed->targets[0]->to->dev_slot)
          ed->pin = true;
    }
    if (to->n_replicas == 1 && from->n_replicas > 1)
      to->replicas[0]->reorder[es->to_port] = true;
  }
  for (uint32_t i = 0; i < pipe->n_actors; i++) {
    spn_stage_t *a = pipe->actors[i];
    for (uint32_t q = 0; q < a->n_in; q++)
      if (!a->links_in[q]) {
        rc = spn_error_set(err, SPN_ECONFIG, "%s: stage \"%s\": input \"%s\" is not connected", a->srt->spec->where,
                           a->srt->spec->name, a->srt->kind->inputs[q].name);
        goto out_free;
      }
  }
  /* Create and preload every instance on its executor, then wire. */
  post_and_wait(pipe, SPN__CMD_CREATE, pipe->n_actors, &rc, err);
  /* Models loaded for instances that did not take them (one failed): gone. */
  pthread_mutex_lock(&rt->engmu);
  if (rt->engine)
    spn_engine_trim(rt->engine);
  pthread_mutex_unlock(&rt->engmu);
  if (rc == SPN_OK)
    post_and_wait(pipe, SPN__CMD_CONNECT, pipe->n_actors, &rc, err);
  if (rc != SPN_OK) {
    post_and_wait(pipe, SPN__CMD_DESTROY, pipe->n_actors, NULL, NULL);
    goto out_free;
  }
  pthread_mutex_lock(&rt->pmu);
  pipe->next = rt->pipes;
  rt->pipes = pipe;
  pthread_mutex_unlock(&rt->pmu);
  spn__log(rt->log, SPN_LOG_DEBUG, 0, NULL, NULL, "pipeline \"%s\": %u stages, %u actors, %u links", pname,
           pipe->n_stages, pipe->n_actors, pipe->n_links);
  *out = pipe;
  return SPN_OK;

out_nomem:
  rc = spn_error_set(err, SPN_ENOMEM, "out of memory building pipeline \"%s\"", pname);
out_free:
  pipeline_release(pipe);
  return rc;
}

void spn_pipeline_free(spn_pipeline_t **pp) {
  if (!pp || !*pp)
    return;
  spn_pipeline_t *pipe = *pp;
  spn_runtime_t *rt = pipe->rt;
  /* Waiting for the pipeline's jobs from on_done or a stage would wait for
   * the very thread that has to finish them. */
  SPN_ASSERT(!spn__runtime_own_thread(rt));
  *pp = NULL;
  pthread_mutex_lock(&rt->pmu);
  for (spn_pipeline_t **q = &rt->pipes; *q; q = &(*q)->next)
    if (*q == pipe) {
      *q = pipe->next;
      break;
    }
  pthread_mutex_unlock(&rt->pmu);
  /* Cancel what still runs and wait for every on_done. */
  pthread_mutex_lock(&pipe->mu);
  for (spn_job_t *j = pipe->live; j; j = j->next_live) {
    atomic_store(&j->cancelled, true);
    spn__loop_post(rt, spn__event_new(SPN__EV_JOB_CANCEL, j, SPN_ECANCELLED, NULL));
  }
  while (pipe->n_live)
    pthread_cond_wait(&pipe->cv, &pipe->mu);
  pthread_mutex_unlock(&pipe->mu);
  /* Messages of aborted jobs may still be on their way: let consumers
   * receive (and drop) them so no handle is left inside a socket. */
  for (int spin = 0; spin < 5000; spin++) {
    bool busy = false;
    for (uint32_t i = 0; i < pipe->n_links && !busy; i++)
      busy = atomic_load(&pipe->links[i]->in_flight) || atomic_load(&pipe->links[i]->ctl_in_flight);
    if (!busy)
      break;
    for (uint32_t i = 0; i < pipe->n_actors; i++)
      spn__executor_wake(pipe->actors[i]->ex);
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  post_and_wait(pipe, SPN__CMD_DESTROY, pipe->n_actors, NULL, NULL);
  pipeline_release(pipe);
}

const char *spn_pipeline_name(const spn_pipeline_t *pipe) { return pipe->spec->name ? pipe->spec->name : ""; }

size_t spn_pipeline_stage_count(const spn_pipeline_t *pipe) { return pipe ? pipe->n_stages : 0; }

const char *spn_pipeline_stage_time(const spn_pipeline_t *pipe, size_t i, uint64_t *busy_ns) {
  if (!pipe || i >= pipe->n_stages)
    return NULL;
  if (busy_ns)
    *busy_ns = atomic_load(&pipe->stages[i].busy_ns);
  return pipe->stages[i].spec->name;
}

const char *spn_pipeline_stage_stream_time(const spn_pipeline_t *pipe, size_t i, uint64_t *stream_ns,
                                           uint64_t *timed_calls) {
  if (!pipe || i >= pipe->n_stages)
    return NULL;
  if (stream_ns)
    *stream_ns = atomic_load(&pipe->stages[i].stream_ns);
  if (timed_calls)
    *timed_calls = atomic_load(&pipe->stages[i].stream_calls);
  return pipe->stages[i].spec->name;
}

const char *spn_pipeline_stage_transfers(const spn_pipeline_t *pipe, size_t i, spn_transfer_stats_t *out) {
  if (!pipe || i >= pipe->n_stages || !out)
    return NULL;
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  spn__xfer_read(&pipe->stages[i].xfer, out);
  return pipe->stages[i].spec->name;
}

/* The memory an edge's consumer receives, for the summary. Ports declare
 * memory sets per config, not per placement (a stage that runs on either
 * side declares both kinds), so the negotiated sets are narrowed here by
 * where the replicas were placed, as edge-mem.c treats the buffers at run
 * time: a producer that declares host memory besides device memory gives
 * device memory only on a GPU (on the CPU pool or a cpu:N device it gives
 * the host memory it declares: no such stage writes cpu:N's emulated device
 * memory), and a consumer in the CPU pool fed by a producer on a device
 * gets host memory where it takes it (spn__mem_plan). A set of device memory
 * alone is kept: that producer gives nothing else. With one CPU device there
 * is no device memory: a consumer that would take it gets host memory. */
int32_t spn__edge_mem_kind(const spn_pipeline_t *pipe, const spn__edge_spec_t *es) {
  if (!es->format.struct_size)
    return SPN_MEM_HOST;
  const uint32_t host = SPN_MEMSET_HOST | SPN_MEMSET_PINNED;
  const spn__stage_rt_t *from = &pipe->stages[es->from_stage], *to = &pipe->stages[es->to_stage];
  bool from_dev = false, from_gpu = false, to_dev = false;
  for (uint32_t r = 0; r < from->n_replicas; r++) {
    const spn_device_t *d = from->replicas[r]->device;
    from_dev |= d != NULL;
    from_gpu |= d && spn_device_kind(d) != SPN_DEVICE_CPU;
  }
  for (uint32_t r = 0; r < to->n_replicas; r++)
    if (to->replicas[r]->device)
      to_dev = true;
  uint32_t gives = es->mem_from ? es->mem_from : SPN_MEMSET_HOST, takes = es->mem_to ? es->mem_to : SPN_MEMSET_HOST;
  if (!from_gpu && (gives & host))
    gives &= ~SPN_MEMSET_DEVICE;
  if (!to_dev && from_dev && (takes & host))
    takes &= ~SPN_MEMSET_DEVICE;
  int32_t kind = spn__mem_pick(gives, takes);
  if (kind == SPN_MEM_DEVICE && pipe->rt->n_devices <= 1 &&
      (!pipe->rt->n_devices || spn_device_kind(pipe->rt->devices[0]) == SPN_DEVICE_CPU))
    kind = SPN_MEM_HOST;
  return kind;
}

size_t spn_pipeline_edge_count(const spn_pipeline_t *pipe) { return pipe ? pipe->spec->n_edges : 0; }

int32_t spn_pipeline_edge_stats(const spn_pipeline_t *pipe, size_t i, spn_edge_stats_t *out) {
  if (!pipe || !out || i >= pipe->spec->n_edges)
    return SPN_EINVAL;
  const spn__edge_spec_t *es = &pipe->spec->edges[i];
  const spn__stage_spec_t *from = &pipe->spec->stages[es->from_stage], *to = &pipe->spec->stages[es->to_stage];
  memset(out, 0, sizeof *out);
  out->from_stage = from->name;
  out->from_port = from->kind->outputs[es->from_port].name;
  out->to_stage = to->name;
  out->to_port = to->kind->inputs[es->to_port].name;
  out->pixel_format = es->format.pixel_format;
  out->format = spn__pixel_format_name(es->format.pixel_format);
  out->mem_kind = spn__edge_mem_kind(pipe, es);
  out->converted = to->inserted;
  for (uint32_t k = 0; k < pipe->n_links; k++) {
    const spn__link_t *l = pipe->links[k];
    if (l->edge != i)
      continue;
    out->messages += atomic_load(&l->stats.messages);
    out->items_passed += atomic_load(&l->stats.items_passed);
    for (int d = 0; d < SPN__COPY_DIRS; d++) {
      out->copies[d] += atomic_load(&l->stats.copies[d]);
      out->bytes[d] += atomic_load(&l->stats.bytes[d]);
      out->ns[d] += atomic_load(&l->stats.ns[d]);
    }
  }
  return SPN_OK;
}

const double spn_stage_latency_bounds_s[SPN_STAGE_LATENCY_BUCKETS - 1] = {
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};

void spn__stage_observe(spn__stage_rt_t *srt, uint64_t ns, uint32_t n) {
  atomic_fetch_add_explicit(&srt->calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&srt->call_ns, ns, memory_order_relaxed);
  size_t k = 0;
  while (k < SPN_STAGE_LATENCY_BUCKETS - 1 && (double)ns > spn_stage_latency_bounds_s[k] * 1e9)
    k++;
  atomic_fetch_add_explicit(&srt->lat_b[k], 1, memory_order_relaxed);
  if (n == 0)
    return;
  atomic_fetch_add_explicit(&srt->batches, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&srt->messages, n, memory_order_relaxed);
  k = 0;
  while (k < SPN_STAGE_BATCH_BUCKETS - 1 && n > (1u << k))
    k++;
  atomic_fetch_add_explicit(&srt->batch_b[k], 1, memory_order_relaxed);
}

const char *spn_pipeline_stage_stats(const spn_pipeline_t *pipe, size_t i, spn_stage_stats_t *out) {
  if (!pipe || i >= pipe->n_stages || !out)
    return NULL;
  spn__stage_rt_t *srt = &pipe->stages[i];
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->calls = atomic_load_explicit(&srt->calls, memory_order_relaxed);
  out->call_ns = atomic_load_explicit(&srt->call_ns, memory_order_relaxed);
  for (size_t k = 0; k < SPN_STAGE_LATENCY_BUCKETS; k++)
    out->latency_bucket[k] = atomic_load_explicit(&srt->lat_b[k], memory_order_relaxed);
  out->processes = srt->kind && srt->kind->process;
  out->batches = atomic_load_explicit(&srt->batches, memory_order_relaxed);
  out->messages = atomic_load_explicit(&srt->messages, memory_order_relaxed);
  for (size_t k = 0; k < SPN_STAGE_BATCH_BUCKETS; k++)
    out->batch_bucket[k] = atomic_load_explicit(&srt->batch_b[k], memory_order_relaxed);
  return srt->spec->name;
}

const char *spn_pipeline_stage_kind(const spn_pipeline_t *pipe, size_t i) {
  return pipe && i < pipe->n_stages && pipe->stages[i].kind ? pipe->stages[i].kind->name : NULL;
}

const char *spn_pipeline_stage_in_call(const spn_pipeline_t *pipe, size_t i, double *seconds) {
  if (seconds)
    *seconds = 0;
  if (!pipe || i >= pipe->n_stages)
    return NULL;
  const spn__stage_rt_t *srt = &pipe->stages[i];
  uint64_t now = spn__now_ns(), longest = 0;
  for (uint32_t r = 0; r < srt->n_replicas; r++) {
    uint64_t since = atomic_load_explicit(&srt->replicas[r]->call_since_ns, memory_order_relaxed);
    if (since && now > since && now - since > longest)
      longest = now - since;
  }
  if (seconds)
    *seconds = (double)longest / 1e9;
  return srt->spec->name;
}

size_t spn_pipeline_binding_count(const spn_pipeline_t *pipe, spn_binding_kind_t kind) {
  size_t n = 0;
  for (size_t i = 0; i < pipe->spec->n_bindings; i++)
    n += pipe->spec->bindings[i].kind == (int32_t)kind;
  return n;
}

const char *spn_pipeline_binding_at(const spn_pipeline_t *pipe, spn_binding_kind_t kind, size_t i,
                                    const char **target) {
  for (size_t k = 0; k < pipe->spec->n_bindings; k++) {
    const spn__binding_t *b = &pipe->spec->bindings[k];
    if (b->kind != (int32_t)kind || i--)
      continue;
    if (target)
      *target = b->target;
    return b->name;
  }
  return NULL;
}

const char *spn_pipeline_binding_default(const spn_pipeline_t *pipe, spn_binding_kind_t kind, size_t i) {
  for (size_t k = 0; k < pipe->spec->n_bindings; k++) {
    const spn__binding_t *b = &pipe->spec->bindings[k];
    if (b->kind != (int32_t)kind || i--)
      continue;
    return b->fallback;
  }
  return NULL;
}

int32_t spn_pipeline_check_job(const spn_pipeline_t *pipe, const spn_job_params_t *params, spn_error_t *err) {
  size_t n_ov = params ? params->n_overrides : 0;
  if (!n_ov)
    return SPN_OK;
  /* Stage 0's copy checks every override (spn__spec_job_config checks them
   * all, whichever stage they are for). */
  void *cfg = NULL;
  int32_t rc = spn__spec_job_config(pipe->spec, 0, params->overrides, n_ov, &cfg, err);
  if (rc == SPN_OK)
    spn__config_free(pipe->spec->stages[0].kind, &cfg);
  return rc;
}

spn_job_t *spn__pipeline_find_job(spn_pipeline_t *pipe, uint64_t id) {
  pthread_mutex_lock(&pipe->mu);
  spn_job_t *j = pipe->live;
  while (j && j->id != id)
    j = j->next_live;
  if (j)
    atomic_fetch_add(&j->refs, 1);
  pthread_mutex_unlock(&pipe->mu);
  return j;
}

/* ---- debug counters (tests) ------------------------------------------------------------ */

int64_t spn__pipeline_max_in_flight(spn_pipeline_t *pipe, uint32_t to_stage, uint32_t *capacity) {
  int64_t mx = 0;
  for (uint32_t i = 0; i < pipe->n_links; i++) {
    spn__link_t *l = pipe->links[i];
    if (l->to->srt->index != to_stage)
      continue;
    int64_t v = atomic_load(&l->max_in_flight);
    if (v > mx)
      mx = v;
    if (capacity)
      *capacity = l->capacity;
  }
  return mx;
}

int64_t spn__pipeline_reordered(spn_pipeline_t *pipe, uint32_t stage) {
  int64_t n = 0;
  for (uint32_t r = 0; stage < pipe->n_stages && r < pipe->stages[stage].n_replicas; r++)
    n += atomic_load(&pipe->stages[stage].replicas[r]->reordered);
  return n;
}

uint32_t spn__pipeline_replicas(spn_pipeline_t *pipe, uint32_t stage) {
  return stage < pipe->n_stages ? pipe->stages[stage].n_replicas : 0;
}

/* ---- TOML entry points -------------------------------------------------------------------- */

/* The front end parses the config, loads the plugins of the search path it
 * needs (runtime plugin paths, $SPINDLE_PLUGIN_PATH, the config's [plugins]
 * path, the install directory) and validates; then the spec is built here. */
static int32_t load_spec(spn_runtime_t *rt, const char *path, const char *src, size_t len,
                         const char *const *overrides, size_t n, spn__pipeline_spec_t **spec, spn_error_t *err) {
  return spn__spec_load(rt->reg, rt->host, (const char *const *)rt->plugin_paths, rt->n_plugin_paths, path, src, len,
                        overrides, n, spec, err);
}

int32_t spn_pipeline_load(spn_runtime_t *rt, const char *path, const char *const *overrides, size_t n_overrides,
                          spn_pipeline_t **out, spn_error_t *err) {
  spn__pipeline_spec_t *spec = NULL;
  int32_t rc = load_spec(rt, path, NULL, 0, overrides, n_overrides, &spec, err);
  if (rc != SPN_OK)
    return rc;
  return spn__pipeline_new_from_spec(rt, spec, true, out, err);
}

int32_t spn_pipeline_load_string(spn_runtime_t *rt, const char *toml, size_t len, const char *name,
                                 const char *const *overrides, size_t n_overrides, spn_pipeline_t **out,
                                 spn_error_t *err) {
  if (!toml)
    return spn_error_set(err, SPN_EINVAL, "spn_pipeline_load_string: NULL text");
  spn__pipeline_spec_t *spec = NULL;
  int32_t rc = load_spec(rt, name ? name : "<string>", toml, len, overrides, n_overrides, &spec, err);
  if (rc != SPN_OK)
    return rc;
  return spn__pipeline_new_from_spec(rt, spec, true, out, err);
}

int32_t spn_pipeline_validate(spn_runtime_t *rt, const char *path, const char *const *overrides, size_t n_overrides,
                              spn_error_t *err) {
  spn__pipeline_spec_t *spec = NULL;
  int32_t rc = load_spec(rt, path, NULL, 0, overrides, n_overrides, &spec, err);
  spn__spec_free(&spec);
  return rc;
}

/* ---- jobs --------------------------------------------------------------------------------- */

/* The field "stage.key" names in this pipeline, and its stage's index:
 * NULL when there is no such stage or key. */
static const spn_config_field_t *stage_key_field(const spn_pipeline_t *pipe, const char *target, uint32_t *stage) {
  const char *dot = strchr(target, '.');
  if (!dot)
    return NULL;
  for (uint32_t i = 0; i < pipe->n_stages; i++) {
    const spn__stage_spec_t *st = &pipe->spec->stages[i];
    if (strlen(st->name) != (size_t)(dot - target) || strncmp(st->name, target, (size_t)(dot - target)))
      continue;
    if (stage)
      *stage = i;
    return spn__config_field(st->kind, dot + 1);
  }
  return NULL;
}

int32_t spn_pipeline_key_type(const spn_pipeline_t *pipe, const char *target, spn_config_type_t *type,
                              uint32_t *flags) {
  const spn_config_field_t *f = pipe && target ? stage_key_field(pipe, target, NULL) : NULL;
  if (!f)
    return SPN_ENOENT;
  if (type)
    *type = f->type;
  if (flags)
    *flags = f->flags;
  return SPN_OK;
}

/* The value of a job's bound key ("stage.key" of [pipeline.inputs] or
 * [pipeline.outputs]) in its config: NULL when unset or empty. */
static const char *bound_path(const spn_pipeline_t *pipe, void *const *configs, const char *target) {
  uint32_t i = 0;
  const spn_config_field_t *f = stage_key_field(pipe, target, &i);
  if (!f || (f->type != SPN_CONFIG_STRING && f->type != SPN_CONFIG_PATH) || !configs[i])
    return NULL;
  const char *v = *(char *const *)((const char *)configs[i] + f->offset);
  return v && *v ? v : NULL;
}

/* A job never writes over its own input, and no two of its outputs are one
 * file: the encoder's rename would put the output in the input's place (a
 * retry would then read the job's own output), or the last output renamed
 * would silently replace the other. Compared by name and, for files that
 * exist, by device and inode (links, "..", another spelling). */
static int32_t check_job_files(const spn_pipeline_t *pipe, void *const *configs, spn_error_t *err) {
  size_t n_out = spn_pipeline_binding_count(pipe, SPN_BINDING_OUTPUT);
  size_t n_in = spn_pipeline_binding_count(pipe, SPN_BINDING_INPUT);
  for (size_t o = 0; o < n_out; o++) {
    const char *ot = NULL;
    const char *oname = spn_pipeline_binding_at(pipe, SPN_BINDING_OUTPUT, o, &ot);
    const char *op = bound_path(pipe, configs, ot);
    if (!op)
      continue;
    for (size_t i = 0; i < n_in; i++) {
      const char *it = NULL;
      const char *iname = spn_pipeline_binding_at(pipe, SPN_BINDING_INPUT, i, &it);
      const char *ip = bound_path(pipe, configs, it);
      if (ip && spn__same_file(op, ip))
        return spn_error_set(err, SPN_EINVAL,
                             "pipeline \"%s\": output \"%s\" (%s = %s) is the file of input \"%s\" (%s = %s): a job "
                             "never writes over its own input; give the output another path",
                             spn_pipeline_name(pipe), oname, ot, op, iname, it, ip);
    }
    for (size_t k = 0; k < o; k++) {
      const char *kt = NULL;
      const char *kname = spn_pipeline_binding_at(pipe, SPN_BINDING_OUTPUT, k, &kt);
      const char *kp = bound_path(pipe, configs, kt);
      if (kp && spn__same_file(op, kp))
        return spn_error_set(err, SPN_EINVAL,
                             "pipeline \"%s\": outputs \"%s\" (%s) and \"%s\" (%s) are one file, %s: give each "
                             "output its own path",
                             spn_pipeline_name(pipe), kname, kt, oname, ot, op);
    }
  }
  return SPN_OK;
}

int32_t spn_job_start(spn_pipeline_t *pipe, const spn_job_params_t *params, const spn_job_callbacks_t *cb,
                      spn_job_t **out, spn_error_t *err) {
  if (!pipe || !out)
    return spn_error_set(err, SPN_EINVAL, "spn_job_start: NULL pipeline or out");
  spn_runtime_t *rt = pipe->rt;
  spn_job_t *job = calloc(1, sizeof *job);
  if (!job)
    return spn_error_set(err, SPN_ENOMEM, "out of memory starting a job");
  job->configs = calloc(pipe->n_stages, sizeof *job->configs);
  job->config_owned = calloc(pipe->n_stages, sizeof *job->config_owned);
  job->stage_done = calloc(pipe->n_stages, sizeof *job->stage_done);
  pthread_mutex_init(&job->mu, NULL);
  pthread_cond_init(&job->cv, NULL);
  spn__warns_init(&job->warns);
  atomic_init(&job->refs, 1);
  atomic_init(&job->state, SPN_JOB_QUEUED);
  atomic_init(&job->total, -1);
  atomic_init(&job->attempt, 1);
  atomic_init(&job->dev_mask, 0);
  atomic_init(&job->pin, -1);
  atomic_init(&job->device_ns, 0);
  job->pipe = pipe;
  if (!job->configs || !job->config_owned || !job->stage_done) {
    spn__job_unref(&job);
    return spn_error_set(err, SPN_ENOMEM, "out of memory starting a job");
  }
  if (cb) {
    size_t n = cb->struct_size && cb->struct_size < sizeof job->cb ? cb->struct_size : sizeof job->cb;
    memcpy(&job->cb, cb, n);
  }
  job->priority = params ? params->priority : 0;
  size_t n_ov = params ? params->n_overrides : 0;
  int32_t rc = SPN_OK;
  for (uint32_t i = 0; i < pipe->n_stages; i++) {
    if (n_ov) {
      rc = spn__spec_job_config(pipe->spec, i, params->overrides, n_ov, &job->configs[i], err);
      if (rc != SPN_OK)
        break;
      job->config_owned[i] = true;
    } else {
      job->configs[i] = pipe->spec->stages[i].config;
    }
  }
  if (rc == SPN_OK)
    rc = check_job_files(pipe, job->configs, err);
  pthread_mutex_lock(&pipe->mu);
  if (rc == SPN_OK) {
    job->id = params && params->job_id ? params->job_id : atomic_fetch_add(&rt->next_job_id, 1);
    for (spn_job_t *j = pipe->live; j; j = j->next_live)
      if (j->id == job->id) {
        rc = spn_error_set(err, SPN_EEXIST, "job id %llu is already running on pipeline \"%s\"",
                           (unsigned long long)job->id, spn_pipeline_name(pipe));
        break;
      }
  }
  if (rc != SPN_OK) {
    pthread_mutex_unlock(&pipe->mu);
    for (uint32_t i = 0; i < pipe->n_stages; i++)
      if (job->config_owned[i])
        spn__config_free(pipe->stages[i].kind, &job->configs[i]);
    spn__job_unref(&job);
    return rc;
  }
  atomic_fetch_add(&job->refs, 1); /* the runtime's, dropped after on_done */
  job->next_live = pipe->live;
  pipe->live = job;
  pipe->n_live++;
  pthread_mutex_unlock(&pipe->mu);
  spn__loop_post(rt, spn__event_new(SPN__EV_JOB_START, job, SPN_OK, NULL));
  *out = job;
  return SPN_OK;
}

void spn_job_cancel(spn_job_t *job) {
  if (!job)
    return;
  pthread_mutex_lock(&job->mu);
  bool finished = job->finished;
  pthread_mutex_unlock(&job->mu);
  if (finished || atomic_exchange(&job->cancelled, true))
    return;
  spn__loop_post(job->pipe->rt, spn__event_new(SPN__EV_JOB_CANCEL, job, SPN_ECANCELLED, NULL));
}

int32_t spn_job_wait(spn_job_t *job, spn_error_t *err) {
  pthread_mutex_lock(&job->mu);
  /* Never on a runtime thread (it would wait for itself), unless the job is
   * already over. */
  SPN_ASSERT(job->finished || !spn__runtime_own_thread(job->pipe->rt));
  while (!job->finished)
    pthread_cond_wait(&job->cv, &job->mu);
  int32_t st = job->status;
  if (err) {
    err->code = st;
    snprintf(err->msg, sizeof err->msg, "%s", job->msg);
  }
  pthread_mutex_unlock(&job->mu);
  return st;
}

uint64_t spn_job_id(const spn_job_t *job) { return job->id; }

double spn_job_device_seconds(const spn_job_t *job) { return job ? (double)atomic_load(&job->device_ns) / 1e9 : 0; }

void spn_job_transfers(const spn_job_t *job, spn_transfer_stats_t *out) {
  if (!out)
    return;
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  if (job)
    spn__xfer_read(&job->xfer, out);
}

uint32_t spn_job_restarts(const spn_job_t *job) {
  /* restarts is the loop's; attempt, its atomic mirror, is safe anywhere. */
  return job ? atomic_load(&job->attempt) - 1 : 0;
}

void spn_job_free(spn_job_t **job) { spn__job_unref(job); }

/* ---- warnings ---- */

uint64_t spn_pipeline_warning_count(const spn_pipeline_t *pipe) {
  return pipe ? spn__warns_count(&((spn_pipeline_t *)pipe)->warns) : 0;
}

int32_t spn_pipeline_warning(const spn_pipeline_t *pipe, size_t i, char *buf, size_t size) {
  return pipe ? spn__warns_get(&((spn_pipeline_t *)pipe)->warns, i, buf, size) : SPN_EINVAL;
}

uint64_t spn_job_warning_count(const spn_job_t *job) {
  return job ? spn__warns_count(&((spn_job_t *)job)->warns) : 0;
}

int32_t spn_job_warning(const spn_job_t *job, size_t i, char *buf, size_t size) {
  return job ? spn__warns_get(&((spn_job_t *)job)->warns, i, buf, size) : SPN_EINVAL;
}

void spn_job_warnings_each(const spn_job_t *job, const char *where, void (*fn)(void *user, const char *line),
                           void *user) {
  if (!job || !fn)
    return;
  spn__warns_t *src[2] = {&job->pipe->warns, &((spn_job_t *)job)->warns};
  char line[SPN__WARN_MAX + 64];
  for (int k = 0; k < 2; k++) {
    uint64_t n = spn__warns_count(src[k]), i = 0;
    for (; i < n && spn__warns_get(src[k], i, line, sizeof line) == SPN_OK; i++)
      fn(user, line);
    if (i < n) {
      snprintf(line, sizeof line, "... %llu more warnings: see %s", (unsigned long long)(n - i),
               where ? where : "the log");
      fn(user, line);
    }
  }
}
