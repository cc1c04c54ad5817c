/* server.c — the job gateway's life cycle and its libuv loop: one loop
 * thread owns the ZeroMQ ROUTER socket, the durable queue and every
 * scheduling decision; in-process worker threads (slots.c) run jobs. The
 * parts are listed in server-internal.h.
 *
 * Invariants:
 * - Only the loop thread touches the socket, the queue and the tables in
 *   struct spn_server. Worker threads hand results back through the slot
 *   pool's report list and one uv_async_t (sends coalesce; the callback
 *   drains the whole list).
 * - ZMQ_FD is edge-triggered: after every batch of work (which may have sent
 *   on the socket and so consumed the edge) we re-read ZMQ_EVENTS and keep
 *   receiving until it no longer says POLLIN (`pump`).
 * - Group commit (gateway.c): the writes of one pass share one queue
 *   transaction and replies wait for its commit.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <uv.h>
#include <zmq.h>

#include "server-internal.h"

static void wake_loop(void *user) {
  spn_server_t *s = user;
  uv_async_send(&s->async);
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
    for (int k = 0; k < SPN_GW_BATCH_MAX; k++) {
      spn_pmsg_t m;
      int32_t rc = spn__proto_recv(s->router, true, &m);
      if (rc == SPN_EAGAIN)
        break;
      if (rc < 0)
        break;
      spn__gateway_handle(s, &m);
      cJSON_Delete(m.body);
    }
    spn__batch_begin(s);
    spn__sched_dispatch(s);
    spn__batch_end(s);
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
  if (s->stopping) {
    /* Reports stay in the pool: spn_server_free applies them. */
    if (s->handles_open)
      stop_cb(s);
    return;
  }
  spn_slot_report_t *r = s->pool ? spn__slot_pool_take(s->pool) : NULL;
  spn__batch_begin(s);
  spn__sched_reports(s, r);
  spn__sched_dispatch(s);
  spn__batch_end(s);
  pump(s);
}

/* The ready line, once the queue has answered: a supervisor or a script
 * that waits for it can submit at once. */
static void say_ready(spn_server_t *s) {
  if (s->cfg->ready_fd < 0)
    return;
  char ep[256];
  size_t n = sizeof ep;
  if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, ep, &n) != 0)
    snprintf(ep, sizeof ep, "%s", s->cfg->bind);
  dprintf(s->cfg->ready_fd, "spindle serve: ready on %s\n", ep);
}

/* The queue has not answered since start-up (a Redis not there yet): say
 * so once, and again when the reason changes or every SPN_QUEUE_LOG_S; stop
 * after queue_wait_s. Other queue errors are not logged meanwhile: they
 * would all say the same. */
static void queue_wait(spn_server_t *s, double mono, const spn_error_t *err) {
  if (!s->queue_failing)
    s->queue_failing = mono;
  uint32_t wait_s = s->cfg->queue_wait_s;
  if (mono - s->started >= wait_s) {
    s->fatal_rc = spn_error_set(&s->fatal, SPN_EIO, "no answer from the job queue in %u s (--queue-wait): %s",
                                wait_s, err->msg);
    spn_server_stop(s);
    return;
  }
  spn__queue_log_now(s, SPN_LOG_WARN, "waiting for the job queue, up to %u s (--queue-wait): %s", wait_s,
                     err->msg);
}

/* Retention: the jobs that ended more than keep_ended_s ago go, a batch at
 * a time (docs/jobs.md, "Retention"). */
static void purge(spn_server_t *s, double mono, int64_t now) {
  uint32_t removed = 0;
  spn_error_t err = SPN_ERROR_INIT;
  int64_t before = now - (int64_t)s->cfg->keep_ended_s * 1000;
  /* a short retention is kept to closely: a pass every quarter of it */
  double every = s->cfg->keep_ended_s / 4.0;
  every = every < 1 ? 1 : every > SPN_PURGE_EVERY_MS / 1000.0 ? SPN_PURGE_EVERY_MS / 1000.0 : every;
  s->next_purge = mono + every;
  if (s->q.ops->purge(s->q.impl, before, SPN_PURGE_BATCH, &removed, &err) < 0) {
    spn__queue_log(s, SPN_LOG_WARN, "retention: deleting the jobs that ended over %u s ago: %s",
                   s->cfg->keep_ended_s, err.msg);
    return;
  }
  if (removed == SPN_PURGE_BATCH)
    s->next_purge = mono + SPN_PURGE_AGAIN_MS / 1000.0;
  if (removed)
    spn__log_f(spn__observe_logger(s->obs), SPN_LOG_INFO, NULL,
               "retention: deleted %u job%s that ended over %u s ago (queue.keep_ended_s)", removed,
               removed == 1 ? "" : "s", s->cfg->keep_ended_s);
}

static void on_timer(uv_timer_t *h) {
  spn_server_t *s = h->data;
  double mono = spn__mono_s();
  int64_t now = spn__now_ms();
  /* (its own transaction: a failed pass rolls back alone) */
  if (s->cfg->keep_ended_s && s->queue_answered && mono >= s->next_purge)
    purge(s, mono, now);
  spn__batch_begin(s);
  if (mono - s->last_renew >= s->cfg->heartbeat_ms / 1000.0) {
    s->last_renew = mono;
    spn__sched_renew_local(s, now);
  }
  /* Remote workers: dead after three missed heartbeats; their jobs retry. */
  spn__remote_reap(s, mono, now);
  /* Which pipelines have a worker, for "waiting" in a queued job's status. */
  if (mono - s->last_presence >= SPN_PRESENCE_MS / 1000.0) {
    s->last_presence = mono;
    spn__sched_presence(s, now);
  }
  if (mono - s->last_sweep >= 0.25) {
    s->last_sweep = mono;
    spn_error_t err = SPN_ERROR_INIT;
    if (s->q.ops->sweep(s->q.impl, now, spn__sched_changed, s, &err) < 0) {
      if (!s->queue_answered)
        queue_wait(s, mono, &err);
      else
        spn__queue_log(s, SPN_LOG_ERROR, "%s", err.msg);
    } else if (!s->queue_answered) {
      s->queue_answered = true;
      if (s->queue_failing)
        spn__log_f(spn__observe_logger(s->obs), SPN_LOG_INFO, NULL, "the job queue answers (after %.0f s)",
                   mono - s->queue_failing);
      s->queue_failing = 0;
      memset(s->qlog, 0, sizeof s->qlog);
      say_ready(s);
    } else if (s->queue_failing) {
      spn__log_f(spn__observe_logger(s->obs), SPN_LOG_INFO, NULL, "the job queue answers again (after %.0f s)",
                 mono - s->queue_failing);
      s->queue_failing = 0;
      memset(s->qlog, 0, sizeof s->qlog); /* the next failure is said again */
    }
  }
  /* Other gateways and workers change a shared queue: tell watchers. */
  if (strcmp(s->q.ops->name, "sqlite") != 0)
    spn__gateway_poll_watchers(s);
  spn__sched_dispatch(s);
  spn__batch_end(s);
  pump(s);
  if (s->draining && !s->stopping) {
    size_t local = 0;
    for (size_t i = 0; i < s->nruns; i++)
      local += s->runs[i].slot >= 0;
    if (local == 0 || mono >= s->drain_until) {
      if (local)
        spn__log_f(spn__observe_logger(s->obs), SPN_LOG_WARN, NULL,
                   "drain: %zu job(s) still running after %u s go back to the queue", local, s->cfg->drain_grace_s);
      spn_server_stop(s);
    }
  }
}

/* SIGTERM drains: no new leases, /readyz answers 503 (the HTTP port stays
 * open), running jobs get drain_grace_s to finish, then the rest go back to
 * the queue and the gateway exits 0 — what a Kubernetes preStop hook and
 * terminationGracePeriodSeconds expect. SIGINT, a second SIGTERM, or
 * drain_grace_s = 0 stop at once (running jobs go back to the queue). */
static void on_signal(uv_signal_t *h, int sig) {
  spn_server_t *s = h->data;
  if (sig == SIGTERM && !s->draining && s->cfg->drain_grace_s > 0) {
    __atomic_store_n(&s->draining, 1, __ATOMIC_RELEASE);
    s->drain_until = spn__mono_s() + s->cfg->drain_grace_s;
    spn__log_f(spn__observe_logger(s->obs), SPN_LOG_INFO, NULL,
               "SIGTERM: draining (no new jobs; up to %u s for running ones)", s->cfg->drain_grace_s);
    on_timer(&s->timer);
    return;
  }
  spn_server_stop(s);
}

/* ---- life cycle ---- */

/* A SQLite queue has one gateway: the rest of a gateway's state (its remote
 * workers, who runs which pipeline, its watchers) lives in its memory, so a
 * second gateway on the same file would split it, and SQLite's locks are
 * not safe on the network filesystems where two hosts could share a file.
 * flock on "<db>-lock", held while the gateway lives: the kernel drops it
 * when the process ends, kill -9 included. The file names the holder. */
static int32_t lock_db(spn_server_t *s, const char *path, spn_error_t *err) {
  char lp[4096];
  if ((size_t)snprintf(lp, sizeof lp, "%s-lock", path) >= sizeof lp)
    return spn_error_set(err, SPN_EINVAL, "job queue %s: path too long", path);
  int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return spn_error_set(err, SPN_EIO, "job queue %s: lock file %s: %s", path, lp, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char who[160] = "";
    ssize_t n = pread(fd, who, sizeof who - 1, 0);
    who[n > 0 ? n : 0] = '\0';
    who[strcspn(who, "\n")] = '\0';
    close(fd);
    if (e == EWOULDBLOCK)
      return spn_error_set(err, SPN_EBUSY,
                           "job queue %s: another gateway (%s) serves it; a SQLite queue has one gateway: stop "
                           "that one first, or share a Redis queue among gateways (--queue redis://...)",
                           path, who[0] ? who : "its name unknown");
    return spn_error_set(err, SPN_EIO, "job queue %s: locking %s: %s", path, lp, strerror(e));
  }
  char line[160];
  int len = snprintf(line, sizeof line, "%s\n", s->name);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
    /* only the name in the message of a second gateway is lost */
  }
  s->lock_fd = fd;
  return SPN_OK;
}

int32_t spn_server_new(const spn_server_config_t *cfg, const spn_job_runner_t *runner,
                       spn_server_t **out, spn_error_t *err) {
  *out = NULL;
  spn_server_t *s = calloc(1, sizeof *s);
  if (!s)
    return spn_error_set(err, SPN_ENOMEM, "server: out of memory");
  s->cfg = cfg;
  s->runner = runner;
  s->out_tail = &s->out;
  s->lock_fd = -1;
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  snprintf(s->name, sizeof s->name, "%s:%d", host[0] ? host : "localhost", (int)getpid());
  int32_t rc;
  /* Ready only when every pipeline the config names can run. */
  for (size_t i = 0; i < cfg->n_pipelines; i++)
    if (!runner->has_pipeline(runner->data, cfg->pipelines[i])) {
      rc = spn_error_set(err, SPN_ECONFIG, "server config: pipeline \"%s\" is not available",
                         cfg->pipelines[i]);
      goto out_free;
    }
  spn_queue_config_t qc = {.backend = cfg->queue_backend, .path = cfg->db_path, .url = cfg->queue_url,
                           .auth_file = cfg->queue_auth_file, .prefix = cfg->queue_prefix,
                           .lease_ms = cfg->lease_ms, .backoff_base_ms = cfg->backoff_base_ms,
                           .backoff_max_ms = cfg->backoff_max_ms, .sync_full = cfg->sync_full,
                           .connect_later = cfg->queue_wait_s > 0};
  if ((!cfg->queue_backend || !strcmp(cfg->queue_backend, "sqlite")) && cfg->db_path &&
      strcmp(cfg->db_path, ":memory:") && (rc = lock_db(s, cfg->db_path, err)) < 0)
    goto out_free;
  if ((rc = spn_queue_open(&qc, &s->q, err)) < 0)
    goto out_free;
  /* Lifecycle log and metrics see every queue transition (observe.c). */
  if ((rc = spn__observe_attach(&s->q, "spindle serve", &s->obs, err)) < 0)
    goto out_queue;
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
    s->zap.zctx = s->zctx;
    s->zap.clients_dir = cfg->curve_clients_dir;
    s->zap.workers_dir = cfg->curve_workers_dir;
    s->zap.log = spn__observe_logger(s->obs);
    if ((rc = spn__zap_start(&s->zap, err)) < 0)
      goto out_ctx;
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
  if (cfg->http && (rc = spn__http_start(s, err)) < 0)
    goto out_loop;
  s->nslots = cfg->workers;
  if (s->nslots) {
    s->slot_owner = calloc(s->nslots, sizeof *s->slot_owner);
    if (!s->slot_owner) {
      rc = spn_error_set(err, SPN_ENOMEM, "server: out of memory");
      goto out_loop;
    }
  }
  for (uint32_t i = 0; i < s->nslots; i++)
    snprintf(s->slot_owner[i], sizeof s->slot_owner[i], "local:%d:%u", (int)getpid(), i);
  if ((rc = spn__slot_pool_new(s->nslots, runner, wake_loop, s, &s->pool, err)) < 0) {
    spn_error_prefix(err, "server");
    goto out_loop;
  }
  /* Its own workers run what its runner runs: with a shared queue, another
   * gateway may have taken jobs of pipelines this one does not have. */
  s->pipelines = spn__runner_pipelines(runner);
  *out = s;
  return SPN_OK;
out_loop:
  *out = s;
  spn_server_free(out);
  return rc;
out_sock:
  zmq_close(s->router);
out_zap:
  spn__zap_stop(&s->zap);
out_ctx:
  zmq_ctx_term(s->zctx);
out_queue:
  spn_queue_free(&s->q);
out_free:
  if (s->lock_fd >= 0)
    close(s->lock_fd);
  free(s);
  return rc;
}

int32_t spn_server_run(spn_server_t *s, spn_error_t *err) {
  s->last_presence = s->started = spn__mono_s();
  spn__sched_presence(s, spn__now_ms()); /* its own slots, before the first request */
  uv_poll_start(&s->poll, UV_READABLE, on_poll);
  uv_timer_start(&s->timer, on_timer, SPN_GW_TICK_MS, SPN_GW_TICK_MS);
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  /* Jobs left running by a previous instance come back when their leases
   * expire (sweep); queued ones are dispatched now. The ready line follows
   * the first sweep the queue answers. */
  on_timer(&s->timer);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  if (s->fatal_rc < 0) {
    if (err)
      *err = s->fatal;
    return s->fatal_rc;
  }
  spn__sched_roster_remove(s, NULL); /* it stopped: its slots leave the roster */
  return SPN_OK;
}

static void on_close(uv_handle_t *h) { (void)h; }

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
  spn__http_stop(s);
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
  spn__slot_pool_stop(s->pool);
  /* Jobs that finished while we stopped are recorded (a succeeded job must
   * not go back to the queue: it would publish again). */
  if (s->pool) {
    spn_slot_report_t *r = spn__slot_pool_take(s->pool), *keep = NULL, **tail = &keep;
    while (r) {
      spn_slot_report_t *next = r->next;
      r->next = NULL;
      if (r->kind == SPN_SLOT_FINISHED && r->res.status == SPN_OK) {
        *tail = r;
        tail = &r->next;
      } else {
        free(r); /* stopped by us, not failed: released below */
      }
      r = next;
    }
    spn__batch_begin(s);
    spn__sched_reports(s, keep);
    spn__batch_end(s);
  }
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
  spn__slot_pool_free(&s->pool);
  spn__out_discard(s);
  zmq_close(s->router);
  spn__zap_stop(&s->zap);
  zmq_ctx_term(s->zctx);
  spn_queue_free(&s->q);
  free(s->slot_owner);
  free(s->pipelines);
  for (size_t i = 0; i < s->nworkers; i++)
    free(s->workers[i].pipelines);
  free(s->workers);
  free(s->runs);
  free(s->watchers);
  spn__sched_committed(s, false);
  free(s->unpublish);
  if (s->lock_fd >= 0)
    close(s->lock_fd); /* the lock goes with it */
  free(s);
}

