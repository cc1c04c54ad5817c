/* worker.c — a remote worker: leases jobs from a gateway over ZeroMQ and
 * runs them on its own threads.
 *
 * Flow control is credit-based: the worker grants the gateway one credit per
 * free slot (LEASE {credit}) and one more after each finished job, so the
 * gateway never sends more jobs than it can run. Every heartbeat_ms it sends
 * HEARTBEAT with the (id, attempt) of every job it runs; that renews their
 * leases. A gateway that restarted answers {"known": false} and the worker
 * grants its free slots again. Only the main thread touches the socket.
 *
 * SIGTERM (cfg->stop) drains: the worker sends DRAIN (the gateway sends it
 * no more jobs), hands back with RELEASE any job that was already on its way,
 * lets running jobs finish for up to drain_grace_s, then stops the rest and
 * RELEASEs them (back to the queue without costing an attempt).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <zmq.h>

#include "jobs-internal.h"
#include "log-internal.h"
#include "observe.h"
#include "proto-internal.h"
#include "spindle/runtime.h"

typedef struct wslot {
  bool busy;
  int64_t id;
  uint32_t att;
  char pipeline[64]; /* for the metrics */
  double since;      /* spn__mono_s() at the assignment */
} wslot_t;

/* A message the socket could not take yet (no connection to a gateway
 * that accepts it, or its queue full), sent in order once it can. */
typedef struct wout {
  struct wout *next;
  const char *type; /* a string literal */
  cJSON *body;
} wout_t;

typedef struct wctx {
  const spn_worker_config_t *cfg;
  spn_slot_pool_t *pool;
  char name[128];
  char instance[17]; /* this process (docs/protocol.md): tells it from another of the same name */
  spn__logger_t *log; /* JSON lines unless stderr is a terminal */
  spn__wobs_t *obs;   /* metrics and probes (--http) */
  bool draining;
  wslot_t *slot; /* per slot: the job it runs (main thread only) */
  char *pipelines; /* what it runs (spn__runner_pipelines); NULL: any */
  wout_t *out, **out_tail; /* not sent yet, oldest first */
} wctx_t;

/* Send what waits, in order, as far as the socket takes it. */
static void flush_out(wctx_t *w, void *sock) {
  while (w->out && spn__proto_send_nowait(sock, w->out->type, w->out->body) != SPN_EAGAIN) {
    wout_t *o = w->out;
    if (!(w->out = o->next))
      w->out_tail = &w->out;
    cJSON_Delete(o->body);
    free(o);
  }
}

/* Never waits: the loop must go on (signals, silence, jobs) while no
 * gateway takes messages, so what the socket cannot take now waits in
 * w->out. A HEARTBEAT or PROGRESS that cannot go now is dropped: the
 * next one says the same, newer. */
static void send_body(wctx_t *w, void *sock, const char *type, cJSON *b) {
  if (!b)
    return;
  flush_out(w, sock);
  if (!w->out && spn__proto_send_nowait(sock, type, b) != SPN_EAGAIN) {
    cJSON_Delete(b);
    return;
  }
  wout_t *o = strcmp(type, "HEARTBEAT") && strcmp(type, "PROGRESS") ? malloc(sizeof *o) : NULL;
  if (!o) {
    cJSON_Delete(b);
    return;
  }
  *o = (wout_t){.type = type, .body = b};
  *w->out_tail = o;
  w->out_tail = &o->next;
}

static cJSON *body(wctx_t *w) {
  cJSON *b = cJSON_CreateObject();
  if (b) {
    cJSON_AddStringToObject(b, "worker", w->name);
    cJSON_AddStringToObject(b, "instance", w->instance);
  }
  return b;
}

/* LEASE: `credit` more jobs, of the pipelines it names (all of them, every
 * time: a gateway that restarted learns them from the next LEASE). */
static void grant(wctx_t *w, void *sock, int64_t credit) {
  cJSON *b = body(w);
  if (b)
    cJSON_AddNumberToObject(b, "credit", (double)credit);
  cJSON *names = b && w->pipelines ? cJSON_AddArrayToObject(b, "pipelines") : NULL;
  size_t len = 0;
  for (const char *name = NULL; names && spn__pipeline_filter_next(w->pipelines, &name, &len);) {
    char *v = strndup(name, len);
    if (v)
      cJSON_AddItemToArray(names, cJSON_CreateString(v));
    free(v);
  }
  send_body(w, sock, "LEASE", b);
}

static void send_release(wctx_t *w, void *sock, int64_t id, int64_t att) {
  cJSON *b = body(w);
  if (b) {
    cJSON_AddNumberToObject(b, "id", (double)id);
    cJSON_AddNumberToObject(b, "attempt", (double)att);
  }
  send_body(w, sock, "RELEASE", b);
}

static void on_job(wctx_t *w, void *sock, const cJSON *m) {
  int64_t id = 0, att = 0;
  const cJSON *spec = cJSON_GetObjectItemCaseSensitive(m, "spec");
  if (!spn__json_int(m, "id", &id) || !spn__json_int(m, "attempt", &att) || !cJSON_IsObject(spec)) {
    spn__log_f(w->log, SPN_LOG_ERROR, NULL, "malformed JOB from the gateway; ignored");
    return;
  }
  if (w->draining) {
    send_release(w, sock, id, att); /* sent before the gateway saw DRAIN */
    return;
  }
  int32_t sl = spn__slot_pool_idle(w->pool);
  spn_job_spec_t js;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = sl >= 0 ? spn__job_spec_from_json(spec, id, (uint32_t)att, &js, &err)
                  : spn_error_set(&err, SPN_EBUSY, "no free slot (gateway exceeded its credit)");
  if (rc < 0) {
    cJSON *b = body(w);
    if (b) {
      cJSON_AddNumberToObject(b, "id", (double)id);
      cJSON_AddNumberToObject(b, "attempt", (double)att);
      cJSON_AddStringToObject(b, "error", err.msg);
    }
    send_body(w, sock, "FAIL", b);
    if (sl >= 0)
      grant(w, sock, 1);
    return;
  }
  wslot_t *ws = &w->slot[sl];
  *ws = (wslot_t){.busy = true, .id = id, .att = (uint32_t)att, .since = spn__mono_s()};
  snprintf(ws->pipeline, sizeof ws->pipeline, "%s", js.pipeline ? js.pipeline : "");
  spn__slot_pool_assign(w->pool, (uint32_t)sl, &js); /* takes js */
  spn__wobs_busy(w->obs, 1);
}

int32_t spn_worker_run(const spn_worker_config_t *cfg, const spn_job_runner_t *runner,
                       spn_error_t *err) {
  wctx_t w = {.cfg = cfg};
  w.out_tail = &w.out;
  int32_t rc = SPN_OK;
  if (cfg->slots == 0 || cfg->slots > 1024)
    return spn_error_set(err, SPN_EINVAL, "worker: slots must be 1-1024");
  if (spn__logger_new(SPN_LOG_INFO, SPN_LOG_FORMAT_AUTO, -1, &w.log) != SPN_OK)
    return spn_error_set(err, SPN_ENOMEM, "worker: out of memory");
  spn__worker_identity(cfg->name, w.name, w.instance);
  void *ctx = zmq_ctx_new();
  void *sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
  w.slot = calloc(cfg->slots, sizeof *w.slot);
  if (!sock || !w.slot) {
    rc = spn_error_set(err, SPN_ENOMEM, "worker: cannot create its socket");
    goto out;
  }
  if ((rc = spn__proto_socket_setup(sock, cfg->max_msg_size, err)) < 0)
    goto out;
  if (cfg->curve_server) {
    if (!cfg->curve_public || !cfg->curve_secret ||
        zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, cfg->curve_server, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, cfg->curve_public, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, cfg->curve_secret, 40) != 0) {
      rc = spn_error_set(err, SPN_EINVAL, "worker: CURVE keys must be 40-character Z85 strings");
      goto out;
    }
  }
  if (zmq_connect(sock, cfg->connect) != 0) {
    rc = spn_error_set(err, SPN_EINVAL, "worker: connect %s: %s%s", cfg->connect, zmq_strerror(zmq_errno()),
                       spn__is_queue_url(cfg->connect)
                           ? " (a Redis queue: spindle worker --queue; --connect takes a gateway's tcp:// endpoint)"
                           : "");
    goto out;
  }
  if ((rc = spn__slot_pool_new(cfg->slots, runner, NULL, NULL, &w.pool, err)) < 0) {
    spn_error_prefix(err, "worker");
    goto out;
  }
  if ((rc = spn__wobs_new(runner, cfg->slots, cfg->http, &w.obs, err)) < 0) {
    spn_error_prefix(err, "worker");
    goto out;
  }
  spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
  lf.worker = w.name;
  spn__wobs_gateway(w.obs, false); /* not ready before the gateway answers */
  w.pipelines = spn__runner_pipelines(runner);
  char pipes[512];
  spn__pipeline_filter_describe(w.pipelines, pipes, sizeof pipes);
  spn__log_f(w.log, SPN_LOG_INFO, &lf, "worker connecting to %s with %u slots, pipelines: %s", cfg->connect,
             cfg->slots, pipes);
  grant(&w, sock, cfg->slots);
  double hb = (cfg->heartbeat_ms ? cfg->heartbeat_ms : 1000) / 1000.0, last_hb = spn__mono_s();
  /* Whether the gateway answers. ZeroMQ connects in the background and
   * says nothing of a wrong endpoint, a gateway that is down, or a CURVE
   * handshake it refused: the gateway answers every heartbeat, so
   * silence for `silent` seconds is said (once per silence), and so is the
   * answer that ends it. */
  double silent = hb * 5 < 5 ? 5 : hb * 5, heard = last_hb;
  bool answered = false, said_silent = false;
  char last_error[256] = "";
  double drain_until = 0;
  /* The gateway refuses our name (name_taken: another process holds it).
   * A dead holder goes quiet and is reaped, and the name is ours at our
   * next heartbeat; a holder heard again and again lives: we stop, with
   * the gateway's error. */
  bool refused = false;
  /* A run was abandoned inside a stage's call (spn_exec_result_t.wedged):
   * why; then this worker drains and stops with that error. */
  char wedged[SPN_ERROR_MSG_MAX] = "";
  int64_t holder_seen = 0;
  unsigned holder_heard = 0;
  for (;;) {
    if (cfg->stop_now && *cfg->stop_now)
      break;
    if (cfg->stop && *cfg->stop && !w.draining) {
      if (cfg->drain_grace_s == 0)
        break;
      w.draining = true;
      spn__wobs_draining(w.obs);
      drain_until = spn__mono_s() + cfg->drain_grace_s;
      send_body(&w, sock, "DRAIN", body(&w));
      spn__log_f(w.log, SPN_LOG_INFO, &lf, "draining (up to %u s)", cfg->drain_grace_s);
    }
    if (w.draining) {
      bool any = false;
      for (uint32_t i = 0; i < cfg->slots; i++)
        any |= w.slot[i].busy;
      if (!any || spn__mono_s() >= drain_until)
        break;
    }
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    zmq_poll(&it, 1, 10);
    flush_out(&w, sock);
    for (;;) {
      spn_pmsg_t m;
      if (spn__proto_recv(sock, false, &m) != SPN_OK)
        break;
      double at = spn__mono_s();
      if (!answered || said_silent) {
        if (answered)
          spn__log_f(w.log, SPN_LOG_INFO, &lf, "the gateway at %s answers again (after %.0f s)", cfg->connect,
                     at - heard);
        else if (said_silent)
          spn__log_f(w.log, SPN_LOG_INFO, &lf, "connected: the gateway at %s answers after %.0f s", cfg->connect,
                     at - heard);
        else
          spn__log_f(w.log, SPN_LOG_INFO, &lf, "connected: the gateway at %s answers", cfg->connect);
        answered = true;
        said_silent = false;
        spn__wobs_gateway(w.obs, true);
      }
      heard = at;
      if (m.error)
        spn__log_f(w.log, SPN_LOG_ERROR, &lf, "bad message from the gateway: %s", m.detail);
      else if (!strcmp(m.type, "JOB"))
        on_job(&w, sock, m.body);
      else if (!strcmp(m.type, "CANCEL")) {
        int64_t id = 0, att = 0;
        spn__json_int(m.body, "id", &id);
        spn__json_int(m.body, "attempt", &att);
        if (id > 0 && att >= 0)
          spn__slot_pool_cancel_job(w.pool, id, (uint32_t)att);
      } else if (!strcmp(m.type, "HEARTBEAT")) {
        if (refused) {
          refused = false;
          spn__log_f(w.log, SPN_LOG_INFO, &lf, "the gateway took the name \"%s\" now", w.name);
        }
        if (!w.draining && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m.body, "known"))) {
          grant(&w, sock, spn__slot_pool_idle_count(w.pool));
        }
      } else if (!strcmp(m.type, "ERROR")) {
        const char *msg = spn__json_str(m.body, "message"), *code = spn__json_str(m.body, "code");
        int64_t seen = 0;
        if (code && !strcmp(code, "name_taken") && spn__json_int(m.body, "holder_seen", &seen)) {
          if (!refused) { /* the first refusal: count from here */
            refused = true;
            holder_heard = 0;
            holder_seen = seen;
          } else if (seen > holder_seen) {
            holder_heard++;
            holder_seen = seen;
          }
          /* Three times heard since we were first refused: no dead process
           * is (a killed holder's record is renewed at most once more on a
           * shared queue before its gateway reaps it). */
          if (holder_heard >= SPN_NAME_TAKEN_HEARD) {
            rc = spn_error_set(err, SPN_EEXIST, "worker: %s refuses the name: %s", cfg->connect, msg ? msg : "?");
            cJSON_Delete(m.body);
            goto stop;
          }
        }
        /* say it once, not on every heartbeat */
        if (strncmp(last_error, msg ? msg : "?", sizeof last_error - 1) != 0) {
          snprintf(last_error, sizeof last_error, "%s", msg ? msg : "?");
          spn__log_f(w.log, SPN_LOG_ERROR, &lf, "gateway error: %s", last_error);
        }
      }
      cJSON_Delete(m.body);
    }
    spn_slot_report_t *r = spn__slot_pool_take(w.pool);
    while (r) {
      spn_slot_report_t *next = r->next;
      cJSON *b = body(&w);
      if (b) {
        cJSON_AddNumberToObject(b, "id", (double)r->id);
        cJSON_AddNumberToObject(b, "attempt", r->attempt);
      }
      if (r->kind == SPN_SLOT_PROGRESS) {
        if (b) {
          cJSON_AddNumberToObject(b, "done", (double)r->done);
          cJSON_AddNumberToObject(b, "total", (double)r->total);
        }
        send_body(&w, sock, "PROGRESS", b);
      } else {
        if (b) {
          spn__exec_report_to_json(b, &r->res);
          if (r->res.status != SPN_OK) {
            cJSON_AddStringToObject(b, "error", r->res.error);
            cJSON_AddBoolToObject(b, "cancelled", r->res.status == SPN_ECANCELLED);
            if (spn__fail_how(r->res.status) == SPN_FAIL_FINAL)
              cJSON_AddBoolToObject(b, "final", true);
          }
        }
        send_body(&w, sock, r->res.status == SPN_OK ? "DONE" : "FAIL", b);
        if (r->res.wedged && !wedged[0]) {
          snprintf(wedged, sizeof wedged, "%s", r->res.error);
          spn__log_f(w.log, SPN_LOG_ERROR, &lf, "stopping: %s", wedged);
          spn__wobs_wedged(w.obs, wedged);
          if (!w.draining) {
            w.draining = true;
            spn__wobs_draining(w.obs);
            drain_until = spn__mono_s() + cfg->drain_grace_s;
            send_body(&w, sock, "DRAIN", body(&w));
          }
        }
        /* The thread cleared `assigned` before reporting: the slot is free. */
        spn__slot_pool_set_idle(w.pool, r->slot);
        wslot_t *ws = &w.slot[r->slot];
        ws->busy = false;
        spn__wobs_busy(w.obs, -1);
        spn__wobs_job_end(w.obs, ws->pipeline, spn__mono_s() - ws->since, r->res.status,
                          r->res.warnings[0] != '\0');
        if (!w.draining)
          grant(&w, sock, 1);
      }
      free(r);
      r = next;
    }
    double now = spn__mono_s();
    if (!said_silent && now - heard >= silent) {
      said_silent = true;
      spn__wobs_gateway(w.obs, false);
      spn__log_f(w.log, SPN_LOG_WARN, &lf,
                 "no answer from the gateway at %s for %.0f s: is a gateway running there, and, with CURVE, is "
                 "--server-key-file its public key and this worker's key in its curve_workers_dir? (still trying)",
                 cfg->connect, now - heard);
    }
    if (now - last_hb >= hb) {
      last_hb = now;
      cJSON *b = body(&w);
      cJSON *arr = b ? cJSON_AddArrayToObject(b, "jobs") : NULL;
      for (uint32_t i = 0; arr && i < cfg->slots; i++) {
        int64_t id;
        uint32_t att;
        if (spn__slot_pool_running(w.pool, i, &id, &att)) {
          cJSON *j = cJSON_CreateObject();
          if (j) {
            cJSON_AddNumberToObject(j, "id", (double)id);
            cJSON_AddNumberToObject(j, "attempt", att);
            cJSON_AddItemToArray(arr, j);
          }
        }
      }
      send_body(&w, sock, "HEARTBEAT", b);
    }
  }
stop:
  /* Stop what still runs; report what finished; hand the rest back. */
  spn__slot_pool_stop(w.pool);
  for (spn_slot_report_t *r = spn__slot_pool_take(w.pool), *next; r; r = next) {
    next = r->next;
    if (r->kind == SPN_SLOT_FINISHED && r->res.status == SPN_OK && w.slot[r->slot].busy) {
      cJSON *b = body(&w);
      if (b) {
        cJSON_AddNumberToObject(b, "id", (double)r->id);
        cJSON_AddNumberToObject(b, "attempt", r->attempt);
        spn__exec_report_to_json(b, &r->res);
      }
      send_body(&w, sock, "DONE", b);
      w.slot[r->slot].busy = false;
    }
    free(r);
  }
  for (uint32_t i = 0; i < cfg->slots; i++)
    if (w.slot[i].busy)
      send_release(&w, sock, w.slot[i].id, w.slot[i].att);
  /* Let DONE and RELEASE reach the gateway: 2 s for what waits here to
   * go to the socket, and as long for the socket to deliver it. What is
   * still here then is lost: those jobs come back when their leases
   * expire. */
  for (double end = spn__mono_s() + 2; w.out && spn__mono_s() < end;) {
    flush_out(&w, sock);
    struct timespec ts = {0, 10L * 1000000L};
    if (w.out)
      nanosleep(&ts, NULL);
  }
  int linger = 2000;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
  if (wedged[0] && rc == SPN_OK)
    rc = spn_error_set(err, SPN_ESTATE, "worker stopped: %s", wedged);
out:
  while (w.out) {
    wout_t *o = w.out;
    w.out = o->next;
    cJSON_Delete(o->body);
    free(o);
  }
  if (sock)
    zmq_close(sock);
  if (ctx)
    zmq_ctx_term(ctx);
  spn__slot_pool_free(&w.pool);
  spn__wobs_free(&w.obs);
  free(w.slot);
  free(w.pipelines);
  spn__logger_free(&w.log);
  return rc;
}
