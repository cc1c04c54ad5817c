/* runtime.c — the runtime: devices, executors, the control loop, jobs' books.
 *
 * The loop thread runs libuv. Other threads reach it only through rt->evq and
 * one uv_async_t: sends coalesce, and the callback drains the whole queue.
 * The loop keeps each job's bookkeeping (EOS acknowledgements from terminal
 * actors, abort acknowledgements, the final status) and is the only thread
 * that calls on_done and on_progress; it never runs stage code and never
 * waits on a device.
 *
 * Job life: start -> RUNNING (sources told to generate) -> either every
 * terminal actor acknowledged EOS (SUCCEEDED), or a failure/cancel marks the
 * job dead and every actor is told to abort it (job_close(ok=false)); once
 * every actor acknowledged, on_done fires with the first failure's status.
 *
 * Quarantine and restart: a device found unhealthy (NVML, polled here) or
 * drained by spn_runtime_device_quarantine takes no new work: producers skip
 * its replicas (actor.c pick_link) and its actors fail what still reaches
 * them with SPN_EDEVICE. Every running job that touched it is aborted; once
 * the abort is acknowledged everywhere, a job whose failure is a device
 * error (SPN_EDEVICE, SPN_ECUDA) and which touched a drained device starts
 * again from its first frame as a new attempt (at most SPN__MAX_RESTARTS
 * times, and only while a device is usable), instead of failing. Messages
 * of the old attempt still in flight carry its number and are dropped on
 * arrival, so the new attempt sees each frame once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "debug-internal.h"
#include "runtime-internal.h"
#include "spindle/engine.h"

#define SPN__MAX_RESTARTS 3

/* ---- events ------------------------------------------------------------------- */

spn__event_t *spn__event_new(int32_t type, spn_job_t *job, int32_t status, const char *msg) {
  size_t n = msg ? strlen(msg) + 1 : 1;
  spn__event_t *ev = calloc(1, sizeof *ev + n);
  SPN_ASSERT(ev);
  ev->type = type;
  ev->job = job;
  if (job)
    atomic_fetch_add(&job->refs, 1);
  ev->status = status;
  if (msg)
    memcpy(ev->msg, msg, n);
  return ev;
}

void spn__loop_post(spn_runtime_t *rt, spn__event_t *ev) {
  ev->next = NULL;
  pthread_mutex_lock(&rt->evmu);
  if (rt->ev_tail)
    rt->ev_tail->next = ev;
  else
    rt->ev_head = ev;
  rt->ev_tail = ev;
  pthread_mutex_unlock(&rt->evmu);
  uv_async_send(&rt->async);
}

void spn__job_unref(spn_job_t **jp) {
  if (!jp || !*jp)
    return;
  spn_job_t *job = *jp;
  *jp = NULL;
  if (atomic_fetch_sub(&job->refs, 1) != 1)
    return;
  pthread_mutex_destroy(&job->mu);
  pthread_cond_destroy(&job->cv);
  spn__warns_destroy(&job->warns);
  free(job->stage_done);
  free(job->configs);
  free(job->config_owned);
  free(job);
}

/* Frames done: at the slowest terminal stage (with two sinks, a frame is
 * done once both have it). */
static long long job_done(const spn_job_t *job) {
  const spn_pipeline_t *pipe = job->pipe;
  long long done = -1;
  for (uint32_t i = 0; i < pipe->n_stages; i++)
    if (pipe->stages[i].terminal) {
      long long d = atomic_load(&job->stage_done[i]);
      if (done < 0 || d < done)
        done = d;
    }
  return done < 0 ? 0 : done;
}

static void progress_report(spn_job_t *job, bool force) {
  long long done = job_done(job);
  if (!job->cb.on_progress || (!force && done == job->last_done))
    return;
  job->last_done = done;
  spn_job_progress_t p = {.struct_size = sizeof p,
                          .job_id = job->id,
                          .done = done,
                          .total = atomic_load(&job->total),
                          .elapsed_s = (double)(spn__now_ns() - job->t0_ns) / 1e9};
  job->cb.on_progress(job->cb.data, &p);
}

/* Which replica of a replicated source generates a job: one on a usable
 * device, spread by job id. Chosen here, once per attempt, so that exactly
 * one replica generates even while a device is being quarantined. */
static uint32_t source_replica(spn_runtime_t *rt, const spn__stage_rt_t *srt, const spn_job_t *job) {
  uint32_t healthy = 0;
  for (uint32_t r = 0; r < srt->n_replicas; r++)
    healthy += !spn__slot_down(rt, srt->replicas[r]->dev_slot);
  if (!healthy)
    return (uint32_t)(job->id % srt->n_replicas); /* it fails the job with SPN_EDEVICE */
  uint32_t k = (uint32_t)(job->id % healthy);
  for (uint32_t r = 0; r < srt->n_replicas; r++)
    if (!spn__slot_down(rt, srt->replicas[r]->dev_slot) && !k--)
      return r;
  return 0;
}

static void post_all_actors(spn_pipeline_t *pipe, int32_t type, spn_job_t *job, bool sources_only) {
  for (uint32_t i = 0; i < pipe->n_actors; i++) {
    spn_stage_t *a = pipe->actors[i];
    if (sources_only && !a->is_source)
      continue;
    spn__cmd_t *c = calloc(1, sizeof *c);
    SPN_ASSERT(c);
    c->type = type;
    c->actor = a;
    if (type == SPN__CMD_START_JOB)
      c->generate = a->replica == source_replica(pipe->rt, a->srt, job);
    c->job = job;
    atomic_fetch_add(&job->refs, 1);
    spn__executor_post(a->ex, c);
  }
}

/* The job is over: report, wake waiters, forget it. Loop thread. */
static void job_finish(spn_runtime_t *rt, spn_job_t *job, int32_t status, const char *msg) {
  spn_pipeline_t *pipe = job->pipe;
  job->finished_loop = true;
  atomic_store(&job->dead, true);
  for (spn_job_t **pp = &rt->running; *pp; pp = &(*pp)->next_running)
    if (*pp == job) {
      *pp = job->next_running;
      break;
    }
  if (!rt->running)
    uv_timer_stop(&rt->timer);
  job->status = status;
  if (msg && msg != job->msg)
    snprintf(job->msg, sizeof job->msg, "%s", msg);
  atomic_store(&job->state, status == SPN_OK ? SPN_JOB_SUCCEEDED
                                             : status == SPN_ECANCELLED ? SPN_JOB_CANCELLED : SPN_JOB_FAILED);
  if (status == SPN_OK)
    progress_report(job, true);
  /* The lifecycle event only: the error itself was logged once, with its
   * stage and device, where it arose (actor.c). */
  const char *what = status == SPN_OK ? "succeeded" : status == SPN_ECANCELLED ? "cancelled" : "failed";
  spn__log_fields_t f = {.job_id = job->id, .event = what, .pipeline = spn_pipeline_name(pipe), .attempt = -1,
                         .duration_ms = (int64_t)((spn__now_ns() - job->t0_ns) / 1000000)};
  spn__log_f(rt->log, status == SPN_OK ? SPN_LOG_DEBUG : SPN_LOG_INFO, &f, "job %s", what);
  /* Per-job configs belong to the spec's kinds: free them while the
   * pipeline certainly lives. */
  for (uint32_t i = 0; i < pipe->n_stages; i++)
    if (job->config_owned[i]) {
      spn__config_free(pipe->stages[i].kind, &job->configs[i]);
      job->config_owned[i] = false;
    }
  pthread_mutex_lock(&pipe->mu);
  for (spn_job_t **pp = &pipe->live; *pp; pp = &(*pp)->next_live)
    if (*pp == job) {
      *pp = job->next_live;
      break;
    }
  pthread_mutex_unlock(&pipe->mu);
  if (job->cb.on_done)
    job->cb.on_done(job->cb.data, job->id, status, job->msg);
  pthread_mutex_lock(&job->mu);
  job->finished = true;
  pthread_cond_broadcast(&job->cv);
  pthread_mutex_unlock(&job->mu);
  /* The pipeline may be freed as soon as n_live drops: touch it last. */
  pthread_mutex_lock(&pipe->mu);
  pipe->n_live--;
  pthread_cond_broadcast(&pipe->cv);
  pthread_mutex_unlock(&pipe->mu);
  spn__job_unref(&job); /* the runtime's reference */
}

static void job_abort(spn_runtime_t *rt, spn_job_t *job, int32_t status, const char *msg) {
  (void)rt;
  if (job->aborting || job->finished_loop)
    return;
  job->aborting = true;
  atomic_store(&job->dead, true);
  job->status = status;
  snprintf(job->msg, sizeof job->msg, "%s", msg);
  job->abort_acks_needed = job->pipe->n_actors;
  job->abort_acks = 0;
  post_all_actors(job->pipe, SPN__CMD_ABORT_JOB, job, false);
}

/* Should an aborted attempt start again rather than fail? Loop thread. */
static bool job_should_restart(spn_runtime_t *rt, spn_job_t *job) {
  if (atomic_load(&job->cancelled) || job->restarts >= SPN__MAX_RESTARTS)
    return false;
  /* A serialized edge does not carry the attempt number, so a message of
   * the old attempt could not be told apart: fail, the job service retries. */
  if (job->pipe->wire)
    return false;
  if (job->status != SPN_EDEVICE && job->status != SPN_ECUDA)
    return false;
  if (atomic_load(&rt->n_down) >= rt->n_devices)
    return false; /* nowhere to go: fail, the job service may retry elsewhere */
  uint64_t touched = atomic_load(&job->dev_mask);
  for (uint32_t i = 0; i < rt->n_devices; i++)
    if ((touched & spn__slot_bit((int32_t)i)) && spn__slot_down(rt, (int32_t)i))
      return true;
  return false;
}

/* Every actor dropped the attempt: start the next one. Loop thread. */
static void job_restart(spn_runtime_t *rt, spn_job_t *job) {
  spn_pipeline_t *pipe = job->pipe;
  job->restarts++;
  atomic_fetch_add(&rt->job_restarts, 1);
  unsigned attempt = atomic_fetch_add(&job->attempt, 1) + 1;
  spn__log_fields_t f = {.job_id = job->id, .event = "restarted", .pipeline = spn_pipeline_name(pipe),
                         .attempt = (int32_t)attempt, .duration_ms = -1};
  spn__log_f(rt->log, SPN_LOG_WARN, &f, "job restarted from the start on healthy devices (attempt %u): %s",
             attempt, job->msg);
  for (uint32_t i = 0; i < pipe->n_stages; i++)
    atomic_store(&job->stage_done[i], 0);
  atomic_store(&job->total, -1);
  atomic_store(&job->dev_mask, 0);
  atomic_store(&job->pin, -1);
  job->aborting = false;
  job->acks = job->abort_acks = 0;
  job->status = SPN_OK;
  job->msg[0] = '\0';
  job->last_done = -1;
  atomic_store(&job->dead, false);
  job->acks_needed = pipe->n_terminal;
  post_all_actors(pipe, SPN__CMD_START_JOB, job, true);
}

static void on_health_timer(uv_timer_t *t);

void spn__loop_handle(spn_runtime_t *rt, spn__event_t *ev) {
  spn_job_t *job = ev->job;
  switch (ev->type) {
  case SPN__EV_JOB_START:
    job->t0_ns = spn__now_ns();
    job->next_running = rt->running;
    rt->running = job;
    if (atomic_load(&job->cancelled)) {
      job_abort(rt, job, SPN_ECANCELLED, "job cancelled");
      break;
    }
    atomic_store(&job->state, SPN_JOB_RUNNING);
    job->acks_needed = job->pipe->n_terminal;
    post_all_actors(job->pipe, SPN__CMD_START_JOB, job, true);
    break;
  case SPN__EV_JOB_ACK:
    if (job->aborting || job->finished_loop)
      break;
    if (++job->acks == job->acks_needed)
      job_finish(rt, job, SPN_OK, "");
    break;
  case SPN__EV_JOB_FAIL:
    job_abort(rt, job, ev->status, ev->msg);
    break;
  case SPN__EV_JOB_CANCEL:
    if (!job->aborting && !job->finished_loop) {
      char text[128];
      snprintf(text, sizeof text, "job %llu cancelled", (unsigned long long)job->id);
      job_abort(rt, job, SPN_ECANCELLED, text);
    }
    break;
  case SPN__EV_ABORT_ACK:
    if (job->aborting && !job->finished_loop && ++job->abort_acks == job->abort_acks_needed) {
      if (job_should_restart(rt, job))
        job_restart(rt, job);
      else
        job_finish(rt, job, job->status, job->msg);
    }
    break;
  case SPN__EV_DEVICE_DOWN: {
    /* Abort every attempt that touched the device; each restarts once its
     * abort is acknowledged (job_should_restart). */
    int32_t slot = ev->status;
    char text[SPN_ERROR_MSG_MAX];
    snprintf(text, sizeof text, "%s was quarantined: %s", rt->devices[slot]->name, ev->msg);
    for (spn_job_t *j = rt->running; j; j = j->next_running)
      if (!j->aborting && !j->finished_loop && (atomic_load(&j->dev_mask) & spn__slot_bit(slot)))
        job_abort(rt, j, SPN_EDEVICE, text);
    break;
  }
  case SPN__EV_HEALTH_START:
    uv_timer_start(&rt->health_timer, on_health_timer, (uint64_t)ev->status, (uint64_t)ev->status);
    break;
  case SPN__EV_PROGRESS:
    if (job->cb.on_progress && !job->finished_loop) {
      spn_job_progress_t p = {.struct_size = sizeof p,
                              .job_id = job->id,
                              .done = ev->done,
                              .total = ev->total,
                              .elapsed_s = (double)(spn__now_ns() - job->t0_ns) / 1e9};
      job->cb.on_progress(job->cb.data, &p);
    }
    break;
  }
}

static void on_timer(uv_timer_t *t) {
  spn_runtime_t *rt = t->data;
  for (spn_job_t *j = rt->running; j; j = j->next_running)
    if (!j->finished_loop)
      progress_report(j, false);
}

static void on_async(uv_async_t *h) {
  spn_runtime_t *rt = h->data;
  for (;;) {
    pthread_mutex_lock(&rt->evmu);
    spn__event_t *ev = rt->ev_head;
    rt->ev_head = rt->ev_tail = NULL;
    bool stopping = rt->stopping;
    pthread_mutex_unlock(&rt->evmu);
    if (!ev) {
      if (stopping) {
        uv_close((uv_handle_t *)&rt->async, NULL);
        uv_close((uv_handle_t *)&rt->timer, NULL);
        uv_close((uv_handle_t *)&rt->health_timer, NULL);
      }
      return;
    }
    while (ev) {
      spn__event_t *next = ev->next;
      spn__loop_handle(rt, ev);
      if (ev->type == SPN__EV_JOB_START && rt->running && !uv_is_active((uv_handle_t *)&rt->timer))
        uv_timer_start(&rt->timer, on_timer, 50, 50);
      spn__job_unref(&ev->job);
      free(ev);
      ev = next;
    }
  }
}

/* GPU health: a device NVML reports unhealthy is quarantined. */
static void on_health_timer(uv_timer_t *t) {
  spn_runtime_t *rt = t->data;
  if (!rt->health || !spn__nvml_health_poll(rt->health))
    return;
  for (uint32_t i = 0; i < rt->n_devices; i++) {
    unsigned long long xid = 0;
    spn__nvml_state_t st = spn__nvml_health_state(rt->health, i, &xid);
    if (st == SPN__NVML_HEALTHY || spn__slot_down(rt, (int32_t)rt->health_slot[i]))
      continue;
    char why[96];
    if (st == SPN__NVML_LOST)
      snprintf(why, sizeof why, "NVML: GPU is lost (fell off the bus)");
    else
      snprintf(why, sizeof why, "NVML: fatal XID %llu", xid);
    spn_runtime_device_quarantine(rt, rt->health_slot[i], why);
  }
}

static void *loop_main(void *arg) {
  spn_runtime_t *rt = arg;
  uv_run(&rt->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* ---- runtime ------------------------------------------------------------------------ */

#ifdef SPN_HAVE_CUDA
/* Watch the CUDA devices through NVML, known to it by PCI bus id. Without
 * NVML (no driver) nothing is watched. */
static int32_t health_open_cuda(spn_runtime_t *rt, spn_error_t *err) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < rt->n_devices; i++)
    k += rt->devices[i]->kind == SPN_DEVICE_CUDA;
  if (!k)
    return SPN_OK;
  char (*bus)[32] = calloc(k, sizeof *bus);
  const char **ids = calloc(k, sizeof *ids);
  rt->health_slot = calloc(k, sizeof *rt->health_slot);
  int32_t rc = SPN_OK;
  if (!bus || !ids || !rt->health_slot) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating the GPU health monitor");
    goto out_free;
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < rt->n_devices; i++)
    if (rt->devices[i]->kind == SPN_DEVICE_CUDA) {
      if (spn__cuda_device_pci_bus_id(rt->devices[i], bus[n], sizeof bus[n], NULL) == SPN_OK)
        ids[n] = bus[n];
      rt->health_slot[n++] = i;
    }
  rc = spn__nvml_health_new("libnvidia-ml.so.1", ids, n, &rt->health, err);
  if (rc == SPN_OK && !spn__nvml_health_available(rt->health))
    spn__nvml_health_free(&rt->health);
out_free:
  if (!rt->health) {
    free(rt->health_slot);
    rt->health_slot = NULL;
  }
  free(bus);
  free(ids);
  return rc;
}
#endif

int32_t spn_runtime_new(const spn_runtime_opts_t *opts_in, spn_runtime_t **out, spn_error_t *err) {
  spn_runtime_opts_t opts = SPN_RUNTIME_OPTS_INIT;
  if (opts_in) {
    size_t n = opts_in->struct_size && opts_in->struct_size < sizeof opts ? opts_in->struct_size : sizeof opts;
    memcpy(&opts, opts_in, n);
    opts.struct_size = sizeof opts;
  }
  spn_runtime_t *rt = calloc(1, sizeof *rt);
  if (!rt)
    return spn_error_set(err, SPN_ENOMEM, "out of memory creating a runtime");
  int32_t rc = SPN_OK;
  rt->opts = opts;
  rt->opts.plugin_paths = NULL; /* copied below: the caller owns its array */
  rt->opts.n_plugin_paths = 0;
  if (opts.n_plugin_paths) {
    rt->plugin_paths = calloc(opts.n_plugin_paths, sizeof *rt->plugin_paths);
    if (!rt->plugin_paths) {
      rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating a runtime");
      goto out_rt;
    }
    for (size_t i = 0; i < opts.n_plugin_paths; i++, rt->n_plugin_paths++)
      if (!(rt->plugin_paths[i] = strdup(opts.plugin_paths[i]))) {
        rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating a runtime");
        goto out_rt;
      }
  }
  int32_t dt = opts.device_threads;
  const char *dt_env = getenv("SPINDLE_DEVICE_THREADS");
  if (dt == SPN_DEVICE_THREADS_AUTO && dt_env && *dt_env) {
    if (!strcmp(dt_env, "stage"))
      dt = SPN_DEVICE_THREADS_STAGE;
    else if (!strcmp(dt_env, "device"))
      dt = SPN_DEVICE_THREADS_DEVICE;
    else {
      rc = spn_error_set(err, SPN_ECONFIG, "SPINDLE_DEVICE_THREADS=\"%.100s\": expected \"stage\" (a thread and a "
                         "stream per stage instance on a device) or \"device\" (one per device)", dt_env);
      goto out_rt;
    }
  } else if (dt != SPN_DEVICE_THREADS_AUTO && dt != SPN_DEVICE_THREADS_STAGE && dt != SPN_DEVICE_THREADS_DEVICE) {
    rc = spn_error_set(err, SPN_EINVAL, "runtime options: device_threads %d is not one of spn_device_threads_t", (int)dt);
    goto out_rt;
  }
  rt->stage_threads = dt != SPN_DEVICE_THREADS_DEVICE;
  rt->devices_spec = strdup(opts.devices ? opts.devices : "auto");
  rt->edge_capacity = opts.edge_capacity ? opts.edge_capacity : 256;
  atomic_init(&rt->next_job_id, 1);
  atomic_init(&rt->next_pipe_id, 1);
  pthread_mutex_init(&rt->evmu, NULL);
  pthread_mutex_init(&rt->pmu, NULL);
  pthread_mutex_init(&rt->engmu, NULL);
  if (!rt->devices_spec) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating a runtime");
    goto out_rt;
  }
  rc = spn__logger_new(opts.log_level, opts.log_format, opts.log_fd, &rt->log);
  if (rc != SPN_OK) {
    spn_error_set(err, rc, "cannot create the runtime's logger");
    goto out_rt;
  }
  rt->host = spn__host_api();
#ifdef SPN_HAVE_CUDA
  const spn__backend_t *extra[] = {spn__backend_cuda()};
  rc = spn__devices_open(rt->devices_spec, extra, 1, &rt->devices, &rt->n_devices, err);
#else
  rc = spn__devices_open(rt->devices_spec, NULL, 0, &rt->devices, &rt->n_devices, err);
#endif
  if (rc != SPN_OK)
    goto out_log;
  rt->dev_down = calloc(rt->n_devices ? rt->n_devices : 1, sizeof *rt->dev_down);
  if (!rt->dev_down) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating a runtime");
    goto out_devices;
  }
  for (uint32_t i = 0; i < rt->n_devices; i++)
    atomic_init(&rt->dev_down[i], false);
#ifdef SPN_HAVE_CUDA
  rc = health_open_cuda(rt, err);
  if (rc != SPN_OK)
    goto out_devices;
#endif
  uint32_t nh = 0;
  rc = spn__backend_cpu()->open("", &rt->host_devs, &nh, err);
  if (rc != SPN_OK)
    goto out_devices;
  rt->host_dev = rt->host_devs[0];
  snprintf(rt->host_dev->name, sizeof rt->host_dev->name, "cpu");
  rc = spn__registry_new(&rt->reg, err);
  if (rc != SPN_OK)
    goto out_host;
  rt->zctx = zmq_ctx_new();
  if (!rt->zctx) {
    rc = spn_error_set(err, SPN_EIO, "cannot create a ZeroMQ context: %s", zmq_strerror(zmq_errno()));
    goto out_reg;
  }
  /* Executors: the CPU pool, then one per device. */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  rt->n_pool = opts.cpu_threads ? opts.cpu_threads : (uint32_t)(ncpu > 0 ? ncpu : 1);
  rt->pool = calloc(rt->n_pool, sizeof *rt->pool);
  rt->dev_ex = calloc(rt->n_devices, sizeof *rt->dev_ex);
  if (!rt->pool || !rt->dev_ex) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory creating executors");
    goto out_zmq;
  }
  for (uint32_t i = 0; i < rt->n_pool; i++)
    rt->pool[i].efd = -1;
  for (uint32_t i = 0; i < rt->n_devices; i++)
    rt->dev_ex[i].efd = -1;
  for (uint32_t i = 0; i < rt->n_pool; i++)
    if ((rc = spn__executor_start(rt, &rt->pool[i], i, NULL, NULL, err)) != SPN_OK)
      goto out_ex;
  for (uint32_t i = 0; i < rt->n_devices; i++)
    if ((rc = spn__executor_start(rt, &rt->dev_ex[i], i, rt->devices[i], NULL, err)) != SPN_OK)
      goto out_ex;
  /* The loop. */
  if (uv_loop_init(&rt->loop) != 0) {
    rc = spn_error_set(err, SPN_EIO, "cannot create the control loop");
    goto out_ex;
  }
  uv_async_init(&rt->loop, &rt->async, on_async);
  rt->async.data = rt;
  uv_timer_init(&rt->loop, &rt->timer);
  rt->timer.data = rt;
  uv_timer_init(&rt->loop, &rt->health_timer);
  rt->health_timer.data = rt;
  if (rt->health)
    uv_timer_start(&rt->health_timer, on_health_timer, 1000, 1000);
  if (pthread_create(&rt->loop_thread, NULL, loop_main, rt) != 0) {
    rc = spn_error_set(err, SPN_EINTERNAL, "cannot start the control loop thread");
    uv_close((uv_handle_t *)&rt->async, NULL);
    uv_close((uv_handle_t *)&rt->timer, NULL);
    uv_close((uv_handle_t *)&rt->health_timer, NULL);
    uv_run(&rt->loop, UV_RUN_DEFAULT);
    uv_loop_close(&rt->loop);
    goto out_ex;
  }
  rt->loop_started = true;
  spn__log(rt->log, SPN_LOG_DEBUG, 0, NULL, NULL, "runtime started: %u devices (%s), %u CPU workers", rt->n_devices,
           rt->devices_spec, rt->n_pool);
  *out = rt;
  return SPN_OK;

out_ex:
  for (uint32_t i = 0; i < rt->n_devices; i++)
    spn__executor_stop(&rt->dev_ex[i]);
  for (uint32_t i = 0; i < rt->n_pool; i++)
    spn__executor_stop(&rt->pool[i]);
out_zmq:
  free(rt->pool);
  free(rt->dev_ex);
  zmq_ctx_term(rt->zctx);
out_reg:
  spn__registry_free(&rt->reg);
out_host:
  spn__devices_free(&rt->host_devs, 1);
out_devices:
  spn__nvml_health_free(&rt->health);
  free(rt->health_slot);
  free(rt->dev_down);
  spn__devices_free(&rt->devices, rt->n_devices);
out_log:
  spn__logger_free(&rt->log);
out_rt:
  for (size_t i = 0; i < rt->n_plugin_paths; i++)
    free(rt->plugin_paths[i]);
  free(rt->plugin_paths);
  pthread_mutex_destroy(&rt->evmu);
  pthread_mutex_destroy(&rt->pmu);
  pthread_mutex_destroy(&rt->engmu);
  free(rt->devices_spec);
  free(rt);
  return rc;
}

void spn_runtime_free(spn_runtime_t **rtp) {
  if (!rtp || !*rtp)
    return;
  spn_runtime_t *rt = *rtp;
  /* From a callback it would wait for its own thread. */
  SPN_ASSERT(!spn__runtime_own_thread(rt));
  *rtp = NULL;
  for (;;) {
    pthread_mutex_lock(&rt->pmu);
    spn_pipeline_t *p = rt->pipes;
    pthread_mutex_unlock(&rt->pmu);
    if (!p)
      break;
    spn_pipeline_free(&p);
  }
  pthread_mutex_lock(&rt->evmu);
  rt->stopping = true;
  pthread_mutex_unlock(&rt->evmu);
  uv_async_send(&rt->async);
  pthread_join(rt->loop_thread, NULL);
  uv_loop_close(&rt->loop);
  for (uint32_t i = 0; i < rt->n_devices; i++)
    spn__executor_stop(&rt->dev_ex[i]);
  for (uint32_t i = 0; i < rt->n_pool; i++)
    spn__executor_stop(&rt->pool[i]);
  free(rt->pool);
  free(rt->dev_ex);
  zmq_ctx_term(rt->zctx);
  /* After every pipeline: stages released their models in destroy. */
  spn_engine_free(&rt->engine);
  spn__registry_free(&rt->reg);
  spn__devices_free(&rt->host_devs, 1);
  spn__nvml_health_free(&rt->health);
  free(rt->health_slot);
  free(rt->dev_down);
  spn__devices_free(&rt->devices, rt->n_devices);
  spn__logger_free(&rt->log);
  pthread_mutex_destroy(&rt->evmu);
  pthread_mutex_destroy(&rt->pmu);
  pthread_mutex_destroy(&rt->engmu);
  for (size_t i = 0; i < rt->n_plugin_paths; i++)
    free(rt->plugin_paths[i]);
  free(rt->plugin_paths);
  free(rt->devices_spec);
  free(rt);
}

bool spn__runtime_own_thread(const spn_runtime_t *rt) {
  pthread_t self = pthread_self();
  if (rt->loop_started && pthread_equal(self, rt->loop_thread))
    return true;
  for (uint32_t i = 0; i < rt->n_pool; i++)
    if (pthread_equal(self, rt->pool[i].thread))
      return true;
  for (uint32_t i = 0; i < rt->n_devices; i++)
    if (pthread_equal(self, rt->dev_ex[i].thread))
      return true;
  bool own = false;
  pthread_mutex_lock((pthread_mutex_t *)&rt->pmu);
  for (const spn_pipeline_t *p = rt->pipes; p && !own; p = p->next)
    for (uint32_t i = 0; i < p->n_actors && !own; i++)
      own = p->actors[i]->own_ex && pthread_equal(self, p->actors[i]->own_ex->thread);
  pthread_mutex_unlock((pthread_mutex_t *)&rt->pmu);
  return own;
}

spn_device_t *spn__runtime_device(spn_runtime_t *rt, uint32_t i) { return i < rt->n_devices ? rt->devices[i] : NULL; }

uint32_t spn_runtime_device_count(const spn_runtime_t *rt) { return rt->n_devices; }

const char *spn_runtime_device_name(const spn_runtime_t *rt, uint32_t i) {
  return i < rt->n_devices ? rt->devices[i]->name : NULL;
}

int32_t spn_runtime_load_plugin(spn_runtime_t *rt, const char *path, spn_error_t *err) {
  return spn__registry_load_file(rt->reg, rt->host, path, err);
}

size_t spn_runtime_kind_count(const spn_runtime_t *rt) { return spn__registry_count(rt->reg); }

const spn_stage_kind_t *spn_runtime_kind_at(const spn_runtime_t *rt, size_t i, const char **plugin_file) {
  return spn__registry_at(rt->reg, i, plugin_file);
}

int32_t spn_runtime_load_plugins(spn_runtime_t *rt, spn_error_t *err) {
  return spn__registry_load_search_path(rt->reg, rt->host, (const char *const *)rt->plugin_paths, rt->n_plugin_paths,
                                        NULL, 0, err);
}

/* ---- quarantine ------------------------------------------------------------------------ */

int32_t spn_runtime_device_quarantine(spn_runtime_t *rt, uint32_t i, const char *why) {
  if (!rt || i >= rt->n_devices)
    return SPN_EINVAL;
  if (atomic_exchange(&rt->dev_down[i], true))
    return SPN_OK;
  atomic_fetch_add(&rt->n_down, 1);
  atomic_fetch_add(&rt->quarantines, 1);
  spn_device_t *dev = rt->devices[i];
#ifdef SPN_HAVE_CUDA
  if (dev->kind == SPN_DEVICE_CUDA)
    spn__cuda_device_mark_unusable(dev);
#endif
  uint32_t usable = rt->n_devices - atomic_load(&rt->n_down);
  spn__log_fields_t f = {.event = "device_quarantined", .device = dev->name, .attempt = -1, .duration_ms = -1};
  spn__log_f(rt->log, SPN_LOG_ERROR, &f, "%s quarantined: %s; its work moves to the %u usable device%s", dev->name,
             why && *why ? why : "drained", usable, usable == 1 ? "" : "s");
  spn__event_t *ev = spn__event_new(SPN__EV_DEVICE_DOWN, NULL, (int32_t)i, why && *why ? why : "drained");
  spn__loop_post(rt, ev);
  return SPN_OK;
}

bool spn_runtime_device_usable(const spn_runtime_t *rt, uint32_t i) {
  if (!rt || i >= rt->n_devices || spn__slot_down(rt, (int32_t)i))
    return false;
#ifdef SPN_HAVE_CUDA
  if (rt->devices[i]->kind == SPN_DEVICE_CUDA && !spn__cuda_device_usable(rt->devices[i]))
    return false;
#endif
  return true;
}

uint32_t spn_runtime_usable_device_count(const spn_runtime_t *rt) {
  uint32_t n = 0;
  for (uint32_t i = 0; rt && i < rt->n_devices; i++)
    n += spn_runtime_device_usable(rt, i);
  return n;
}

uint64_t spn_runtime_quarantine_count(const spn_runtime_t *rt) { return rt ? atomic_load(&rt->quarantines) : 0; }
uint64_t spn_runtime_log_count(const spn_runtime_t *rt, int32_t level) {
  return rt ? spn__logger_count(rt->log, level) : 0;
}

uint64_t spn_runtime_job_restart_count(const spn_runtime_t *rt) { return rt ? atomic_load(&rt->job_restarts) : 0; }

uint64_t spn_runtime_device_bytes_copied(const spn_runtime_t *rt, uint32_t i, int32_t dir) {
  if (!rt || dir < 0 || dir > 3 || i > rt->n_devices)
    return 0;
  spn_device_t *d = i < rt->n_devices ? rt->devices[i] : rt->host_dev;
  return d ? atomic_load(&d->copied[dir]) : 0;
}

int32_t spn__runtime_watch_health(spn_runtime_t *rt, const char *nvml_lib, const char *const *bus_ids,
                                  uint32_t interval_ms, spn_error_t *err) {
  if (rt->health)
    return spn_error_set(err, SPN_EEXIST, "the runtime already watches its devices' health");
  rt->health_slot = calloc(rt->n_devices ? rt->n_devices : 1, sizeof *rt->health_slot);
  if (!rt->health_slot)
    return spn_error_set(err, SPN_ENOMEM, "out of memory watching device health");
  for (uint32_t i = 0; i < rt->n_devices; i++)
    rt->health_slot[i] = i;
  int32_t rc = spn__nvml_health_new(nvml_lib, bus_ids, rt->n_devices, &rt->health, err);
  if (rc == SPN_OK && !spn__nvml_health_available(rt->health)) {
    spn__nvml_health_free(&rt->health);
    rc = spn_error_set(err, SPN_ENOENT, "%s: not an NVML library", nvml_lib);
  }
  if (rc != SPN_OK) {
    free(rt->health_slot);
    rt->health_slot = NULL;
    return rc;
  }
  spn__loop_post(rt, spn__event_new(SPN__EV_HEALTH_START, NULL, (int32_t)(interval_ms ? interval_ms : 1000), NULL));
  return SPN_OK;
}
