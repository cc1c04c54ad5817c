/* worker.c — a remote worker: leases jobs from a gateway over ZeroMQ and
 * runs them on its own threads.
 *
 * Flow control is credit-based: the worker grants the gateway one credit per
 * free slot (LEASE {credit}) and one more after each finished job, so the
 * gateway never sends more jobs than it can run. Every heartbeat_ms it sends
 * HEARTBEAT with the (id, attempt) of every job it runs; that renews their
 * leases. A gateway that restarted answers {"known": false} and the worker
 * grants its free slots again. Only the main thread touches the socket.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zmq.h>

#include "jobs-internal.h"
#include "proto-internal.h"

typedef struct wreport {
  struct wreport *next;
  int kind; /* 0 progress, 1 finished */
  uint32_t slot;
  int64_t id;
  uint32_t attempt;
  uint64_t done, total;
  spn_exec_result_t res;
} wreport_t;

typedef struct wslot {
  struct wctx *w;
  pthread_t th;
  spn_job_spec_t spec; /* under mu */
  bool assigned, busy;
  volatile int cancel;
} wslot_t;

typedef struct wctx {
  const spn_worker_config_t *cfg;
  const spn_job_runner_t *runner;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool quit;
  wslot_t *slots;
  wreport_t *reports, **tail;
  char name[128];
} wctx_t;

static void push(wctx_t *w, wreport_t *r) {
  pthread_mutex_lock(&w->mu);
  *w->tail = r;
  w->tail = &r->next;
  pthread_mutex_unlock(&w->mu);
}

typedef struct wprog {
  wctx_t *w;
  wslot_t *sl;
} wprog_t;

static void on_progress(void *user, uint64_t done, uint64_t total) {
  wprog_t *p = user;
  wreport_t *r = calloc(1, sizeof *r);
  if (!r)
    return;
  r->slot = (uint32_t)(p->sl - p->w->slots);
  r->id = p->sl->spec.id;
  r->attempt = p->sl->spec.attempt;
  r->done = done;
  r->total = total;
  push(p->w, r);
}

static void *slot_main(void *arg) {
  wslot_t *sl = arg;
  wctx_t *w = sl->w;
  for (;;) {
    pthread_mutex_lock(&w->mu);
    while (!w->quit && !sl->assigned)
      pthread_cond_wait(&w->cond, &w->mu);
    bool quit = w->quit;
    pthread_mutex_unlock(&w->mu);
    if (quit)
      break;
    wprog_t p = {w, sl};
    wreport_t *r = calloc(1, sizeof *r);
    spn_exec_result_t res;
    spn__job_execute(w->runner, &sl->spec, &sl->cancel, on_progress, &p, &res);
    if (r) {
      r->kind = 1;
      r->slot = (uint32_t)(sl - w->slots);
      r->id = sl->spec.id;
      r->attempt = sl->spec.attempt;
      r->res = res;
    }
    pthread_mutex_lock(&w->mu);
    spn__job_spec_free(&sl->spec);
    sl->assigned = false;
    pthread_mutex_unlock(&w->mu);
    if (r)
      push(w, r);
  }
  return NULL;
}

static void send_body(void *sock, const char *type, cJSON *b) {
  if (b)
    spn__proto_send(sock, NULL, 0, type, b);
  cJSON_Delete(b);
}

static cJSON *body(wctx_t *w) {
  cJSON *b = cJSON_CreateObject();
  if (b)
    cJSON_AddStringToObject(b, "worker", w->name);
  return b;
}

static void grant(wctx_t *w, void *sock, int64_t credit) {
  cJSON *b = body(w);
  if (b)
    cJSON_AddNumberToObject(b, "credit", (double)credit);
  send_body(sock, "LEASE", b);
}

static void on_job(wctx_t *w, void *sock, const cJSON *m) {
  int64_t id = 0, att = 0;
  const cJSON *spec = cJSON_GetObjectItemCaseSensitive(m, "spec");
  if (!spn__json_int(m, "id", &id) || !spn__json_int(m, "attempt", &att) || !cJSON_IsObject(spec)) {
    fprintf(stderr, "spindle worker: malformed JOB from the gateway; ignored\n");
    return;
  }
  wslot_t *sl = NULL;
  for (uint32_t i = 0; i < w->cfg->slots; i++)
    if (!w->slots[i].busy) {
      sl = &w->slots[i];
      break;
    }
  spn_job_spec_t js;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = sl ? spn__job_spec_from_json(spec, id, (uint32_t)att, &js, &err)
                  : spn_error_set(&err, SPN_EBUSY, "no free slot (gateway exceeded its credit)");
  if (rc < 0) {
    cJSON *b = body(w);
    if (b) {
      cJSON_AddNumberToObject(b, "id", (double)id);
      cJSON_AddNumberToObject(b, "attempt", (double)att);
      cJSON_AddStringToObject(b, "error", err.msg);
    }
    send_body(sock, "FAIL", b);
    if (sl)
      grant(w, sock, 1);
    return;
  }
  sl->busy = true;
  pthread_mutex_lock(&w->mu);
  sl->spec = js;
  sl->cancel = 0;
  sl->assigned = true;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->mu);
}

int32_t spn_worker_run(const spn_worker_config_t *cfg, const spn_job_runner_t *runner,
                       spn_error_t *err) {
  wctx_t w = {.cfg = cfg, .runner = runner};
  w.tail = &w.reports;
  int32_t rc = SPN_OK;
  if (cfg->slots == 0 || cfg->slots > 1024)
    return spn_error_set(err, SPN_EINVAL, "worker: slots must be 1-1024");
  if (cfg->name)
    snprintf(w.name, sizeof w.name, "%s", cfg->name);
  else {
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(w.name, sizeof w.name, "%s:%d:%lx", host, (int)getpid(), (unsigned long)ts.tv_nsec);
  }
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cond, NULL);
  w.slots = calloc(cfg->slots, sizeof *w.slots);
  void *ctx = zmq_ctx_new();
  void *sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
  if (!w.slots || !sock) {
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
    rc = spn_error_set(err, SPN_EINVAL, "worker: connect %s: %s", cfg->connect, zmq_strerror(zmq_errno()));
    goto out;
  }
  for (uint32_t i = 0; i < cfg->slots; i++) {
    w.slots[i].w = &w;
    if (pthread_create(&w.slots[i].th, NULL, slot_main, &w.slots[i]) != 0) {
      rc = spn_error_set(err, SPN_EIO, "worker: cannot start thread %u", i);
      pthread_mutex_lock(&w.mu);
      w.quit = true;
      pthread_cond_broadcast(&w.cond);
      pthread_mutex_unlock(&w.mu);
      for (uint32_t k = 0; k < i; k++)
        pthread_join(w.slots[k].th, NULL);
      goto out;
    }
  }
  fprintf(stderr, "spindle worker %s: connected to %s with %u slots\n", w.name, cfg->connect, cfg->slots);
  grant(&w, sock, cfg->slots);
  double hb = (cfg->heartbeat_ms ? cfg->heartbeat_ms : 1000) / 1000.0, last_hb = spn__mono_s();
  char last_error[256] = "";
  while (!(cfg->stop && *cfg->stop)) {
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    zmq_poll(&it, 1, 10);
    for (;;) {
      spn_pmsg_t m;
      if (spn__proto_recv(sock, false, &m) != SPN_OK)
        break;
      if (m.error)
        fprintf(stderr, "spindle worker: bad message from the gateway: %s\n", m.detail);
      else if (!strcmp(m.type, "JOB"))
        on_job(&w, sock, m.body);
      else if (!strcmp(m.type, "CANCEL")) {
        int64_t id = 0, att = 0;
        spn__json_int(m.body, "id", &id);
        spn__json_int(m.body, "attempt", &att);
        pthread_mutex_lock(&w.mu);
        for (uint32_t i = 0; i < cfg->slots; i++)
          if (w.slots[i].assigned && w.slots[i].spec.id == id &&
              (att == 0 || w.slots[i].spec.attempt == (uint32_t)att))
            __atomic_store_n(&w.slots[i].cancel, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&w.mu);
      } else if (!strcmp(m.type, "HEARTBEAT")) {
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m.body, "known"))) {
          int64_t free_slots = 0;
          for (uint32_t i = 0; i < cfg->slots; i++)
            free_slots += !w.slots[i].busy;
          grant(&w, sock, free_slots);
        }
      } else if (!strcmp(m.type, "ERROR")) {
        const char *msg = spn__json_str(m.body, "message");
        /* say it once, not on every heartbeat */
        if (strncmp(last_error, msg ? msg : "?", sizeof last_error - 1) != 0) {
          snprintf(last_error, sizeof last_error, "%s", msg ? msg : "?");
          fprintf(stderr, "spindle worker: gateway error: %s\n", last_error);
        }
      }
      cJSON_Delete(m.body);
    }
    pthread_mutex_lock(&w.mu);
    wreport_t *r = w.reports;
    w.reports = NULL;
    w.tail = &w.reports;
    pthread_mutex_unlock(&w.mu);
    while (r) {
      wreport_t *next = r->next;
      cJSON *b = body(&w);
      if (b) {
        cJSON_AddNumberToObject(b, "id", (double)r->id);
        cJSON_AddNumberToObject(b, "attempt", r->attempt);
      }
      if (r->kind == 0) {
        if (b) {
          cJSON_AddNumberToObject(b, "done", (double)r->done);
          cJSON_AddNumberToObject(b, "total", (double)r->total);
        }
        send_body(sock, "PROGRESS", b);
      } else {
        if (b) {
          cJSON_AddNumberToObject(b, "compute_s", r->res.compute_s);
          cJSON_AddNumberToObject(b, "gpu_s", r->res.gpu_s);
          if (r->res.status != SPN_OK) {
            cJSON_AddStringToObject(b, "error", r->res.error);
            cJSON_AddBoolToObject(b, "cancelled", r->res.status == SPN_ECANCELLED);
          }
        }
        send_body(sock, r->res.status == SPN_OK ? "DONE" : "FAIL", b);
        /* The thread cleared `assigned` before reporting: the slot is free. */
        w.slots[r->slot].busy = false;
        grant(&w, sock, 1);
      }
      free(r);
      r = next;
    }
    double now = spn__mono_s();
    if (now - last_hb >= hb) {
      last_hb = now;
      cJSON *b = body(&w);
      cJSON *arr = b ? cJSON_AddArrayToObject(b, "jobs") : NULL;
      for (uint32_t i = 0; arr && i < cfg->slots; i++) {
        pthread_mutex_lock(&w.mu);
        if (w.slots[i].assigned) {
          cJSON *j = cJSON_CreateObject();
          if (j) {
            cJSON_AddNumberToObject(j, "id", (double)w.slots[i].spec.id);
            cJSON_AddNumberToObject(j, "attempt", w.slots[i].spec.attempt);
            cJSON_AddItemToArray(arr, j);
          }
        }
        pthread_mutex_unlock(&w.mu);
      }
      send_body(sock, "HEARTBEAT", b);
    }
  }
  pthread_mutex_lock(&w.mu);
  w.quit = true;
  for (uint32_t i = 0; i < cfg->slots; i++)
    w.slots[i].cancel = 1;
  pthread_cond_broadcast(&w.cond);
  pthread_mutex_unlock(&w.mu);
  for (uint32_t i = 0; i < cfg->slots; i++)
    pthread_join(w.slots[i].th, NULL);
  while (w.reports) {
    wreport_t *n = w.reports->next;
    free(w.reports);
    w.reports = n;
  }
out:
  if (sock)
    zmq_close(sock);
  if (ctx)
    zmq_ctx_term(ctx);
  free(w.slots);
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cond);
  return rc;
}
