/* client.c — libspindle-client: the job protocol from the client side.
 *
 * One DEALER socket per client. Every request carries a fresh "req" number and
 * the reply with the same number is its answer; anything else that arrives
 * meanwhile (events of an earlier watch, late replies after a timeout) is
 * skipped, so a timed-out request never confuses the next one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <zmq.h>

#include "jobs-internal.h"
#include "proto-internal.h"
#include "spindle/client.h"

struct spn_client {
  void *ctx, *sock;
  int32_t timeout_ms;
  int64_t next_req;
  /* the "waiting" of the last status or event received (spn_client_waiting) */
  int64_t waiting_id;
  char waiting[512];
  /* when the gateway last sent anything (monotonic s), and whether a wait
   * for it has timed out since (spn_client_unanswered_ms) */
  double heard;
  bool unanswered;
  char endpoint[256]; /* where it connects, for the errors that say nothing answers */
};

struct spn_client_job {
  cJSON *body;
};

int32_t spn_client_new(const char *endpoint, const spn_client_options_t *opt, spn_client_t **out,
                       spn_error_t *err) {
  spn_client_options_t o = SPN_CLIENT_OPTIONS_INIT;
  if (opt) {
    if (opt->struct_size < sizeof o)
      memcpy(&o, opt, opt->struct_size);
    else
      o = *opt;
  }
  *out = NULL;
  spn_client_t *c = calloc(1, sizeof *c);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "client: out of memory");
  int32_t rc;
  c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 10000;
  c->heard = spn__mono_s();
  c->next_req = 1;
  c->ctx = zmq_ctx_new();
  c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
  if (!c->sock) {
    rc = spn_error_set(err, SPN_EIO, "client: zmq: %s", zmq_strerror(zmq_errno()));
    goto out_fail;
  }
  if ((rc = spn__proto_socket_setup(c->sock, o.max_msg_size, err)) < 0)
    goto out_fail;
  int sndtimeo = c->timeout_ms;
  zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
  if (o.curve_server_key || o.curve_public_key || o.curve_secret_key) {
    if (!o.curve_server_key || !o.curve_public_key || !o.curve_secret_key ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, o.curve_server_key, 40) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, o.curve_public_key, 40) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, o.curve_secret_key, 40) != 0) {
      rc = spn_error_set(err, SPN_EINVAL,
                         "client: CURVE needs the server key, public key and secret key (40-character Z85 each)");
      goto out_fail;
    }
  }
  snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
  if (zmq_connect(c->sock, endpoint) != 0) {
    rc = spn_error_set(err, SPN_EINVAL, "client: connect %s: %s%s", endpoint, zmq_strerror(zmq_errno()),
                       spn__is_queue_url(endpoint) ? " (jobs are submitted to a gateway's tcp:// endpoint, not to its queue)"
                                                   : "");
    goto out_fail;
  }
  *out = c;
  return SPN_OK;
out_fail:
  spn_client_free(&c);
  return rc;
}

void spn_client_free(spn_client_t **cp) {
  spn_client_t *c = *cp;
  if (!c)
    return;
  *cp = NULL;
  if (c->sock)
    zmq_close(c->sock);
  if (c->ctx)
    zmq_ctx_term(c->ctx);
  free(c);
}

static int32_t status_of_code(const char *code) {
  static const struct {
    const char *code;
    int32_t st;
  } map[] = {{"forbidden_path", SPN_EPERM}, {"forbidden", SPN_EPERM}, {"not_found", SPN_ENOENT}, {"invalid", SPN_EINVAL},
             {"unknown_pipeline", SPN_EUNSUPPORTED}, {"unsupported_version", SPN_EUNSUPPORTED},
             {"bad_state", SPN_ESTATE}, {"bad_json", SPN_EPROTO}, {"bad_frame", SPN_EPROTO},
             {"unknown_type", SPN_EPROTO}, {"internal", SPN_EIO}};
  for (size_t i = 0; code && i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(code, map[i].code))
      return map[i].st;
  return SPN_EPROTO;
}

/* Wait up to timeout_ms for one message. */
static int32_t recv_one(spn_client_t *c, int32_t timeout_ms, spn_pmsg_t *m, spn_error_t *err) {
  zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLIN, 0};
  int r = zmq_poll(&it, 1, timeout_ms);
  if (r < 0)
    return spn_error_set(err, SPN_EIO, "client: poll: %s", zmq_strerror(zmq_errno()));
  if (r == 0) {
    c->unanswered = true;
    return spn_error_set(err, SPN_ETIMEDOUT, "client: no answer from the gateway at %s within %.1f s (is a "
                         "gateway running there, bound to that address?)", c->endpoint, timeout_ms / 1000.0);
  }
  int32_t rc = spn__proto_recv(c->sock, false, m);
  if (rc == SPN_EAGAIN) {
    c->unanswered = true;
    return spn_error_set(err, SPN_ETIMEDOUT, "client: no answer from the gateway at %s", c->endpoint);
  }
  c->heard = spn__mono_s();
  c->unanswered = false;
  if (rc < 0)
    return spn_error_set(err, rc, "client: receive failed");
  if (m->error)
    return spn_error_set(err, SPN_EPROTO, "client: bad message from the gateway: %s", m->detail);
  return SPN_OK;
}

static int32_t send_req(spn_client_t *c, const char *type, cJSON *body, int64_t *req,
                        spn_error_t *err) {
  *req = c->next_req++;
  cJSON_DeleteItemFromObjectCaseSensitive(body, "req");
  cJSON_AddNumberToObject(body, "req", (double)*req);
  int32_t rc = spn__proto_send(c->sock, NULL, 0, type, body);
  if (rc == SPN_EAGAIN)
    c->unanswered = true;
  if (rc < 0)
    return spn_error_set(err, rc == SPN_EAGAIN ? SPN_ETIMEDOUT : rc, "client: cannot send %s", type);
  return SPN_OK;
}

/* Send and wait for the reply carrying our req; *reply is its body. */
static int32_t call(spn_client_t *c, const char *type, cJSON *body, char rtype[17], cJSON **reply,
                    spn_error_t *err) {
  int64_t req;
  int32_t rc = send_req(c, type, body, &req, err);
  if (rc < 0)
    return rc;
  double deadline = spn__mono_s() + c->timeout_ms / 1000.0;
  for (;;) {
    int32_t left = (int32_t)((deadline - spn__mono_s()) * 1000.0);
    if (left < 0)
      left = 0;
    spn_pmsg_t m;
    rc = recv_one(c, left, &m, err);
    if (rc == SPN_EPROTO)
      continue;
    if (rc < 0)
      return rc;
    if (m.req != req) {
      cJSON_Delete(m.body);
      continue;
    }
    if (!strcmp(m.type, "ERROR")) {
      const char *code = spn__json_str(m.body, "code");
      const char *msg = spn__json_str(m.body, "message");
      rc = spn_error_set(err, status_of_code(code), "%s: %s", code ? code : "error", msg ? msg : "");
      cJSON_Delete(m.body);
      return rc;
    }
    snprintf(rtype, 17, "%s", m.type);
    *reply = m.body;
    return SPN_OK;
  }
}

int32_t spn_client_request(spn_client_t *c, const char *type, const char *json_body,
                           char reply_type[17], char **reply_json, spn_error_t *err) {
  cJSON *b = cJSON_Parse(json_body ? json_body : "{}");
  if (!cJSON_IsObject(b)) {
    cJSON_Delete(b);
    return spn_error_set(err, SPN_EINVAL, "client: request body is not a JSON object");
  }
  cJSON *reply = NULL;
  int32_t rc = call(c, type, b, reply_type, &reply, err);
  cJSON_Delete(b);
  if (rc < 0)
    return rc;
  *reply_json = cJSON_PrintUnformatted(reply);
  cJSON_Delete(reply);
  return *reply_json ? SPN_OK : spn_error_set(err, SPN_ENOMEM, "client: out of memory");
}

spn_client_job_t *spn_client_job_new(const char *pipeline) {
  spn_client_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return NULL;
  j->body = cJSON_CreateObject();
  if (!j->body || !cJSON_AddStringToObject(j->body, "pipeline", pipeline) ||
      !cJSON_AddObjectToObject(j->body, "inputs") || !cJSON_AddObjectToObject(j->body, "outputs") ||
      !cJSON_AddObjectToObject(j->body, "params")) {
    spn_client_job_free(&j);
    return NULL;
  }
  return j;
}

void spn_client_job_free(spn_client_job_t **jp) {
  if (!*jp)
    return;
  cJSON_Delete((*jp)->body);
  free(*jp);
  *jp = NULL;
}

static int32_t set_in(spn_client_job_t *j, const char *obj, const char *k, const char *v) {
  cJSON *o = cJSON_GetObjectItemCaseSensitive(j->body, obj);
  cJSON_DeleteItemFromObjectCaseSensitive(o, k);
  return cJSON_AddStringToObject(o, k, v) ? SPN_OK : SPN_ENOMEM;
}

int32_t spn_client_job_input(spn_client_job_t *j, const char *name, const char *path) {
  return set_in(j, "inputs", name, path);
}
int32_t spn_client_job_output(spn_client_job_t *j, const char *name, const char *path) {
  return set_in(j, "outputs", name, path);
}
int32_t spn_client_job_param(spn_client_job_t *j, const char *key, const char *value) {
  return set_in(j, "params", key, value);
}

static void set_num(spn_client_job_t *j, const char *k, double v) {
  cJSON_DeleteItemFromObjectCaseSensitive(j->body, k);
  cJSON_AddNumberToObject(j->body, k, v);
}

void spn_client_job_priority(spn_client_job_t *j, int32_t p) { set_num(j, "priority", p); }
void spn_client_job_max_attempts(spn_client_job_t *j, uint32_t n) { set_num(j, "max_attempts", n); }
void spn_client_job_deadline(spn_client_job_t *j, double s) { set_num(j, "deadline", s); }
void spn_client_job_timeout(spn_client_job_t *j, double s) { set_num(j, "timeout", s); }
void spn_client_job_segments(spn_client_job_t *j, double n) { set_num(j, "segments", n); }
void spn_client_job_segment_seconds(spn_client_job_t *j, double s) { set_num(j, "segment_seconds", s); }
int32_t spn_client_job_idempotency_key(spn_client_job_t *j, const char *key) {
  cJSON_DeleteItemFromObjectCaseSensitive(j->body, "idempotency_key");
  return cJSON_AddStringToObject(j->body, "idempotency_key", key) ? SPN_OK : SPN_ENOMEM;
}

int32_t spn_client_submit(spn_client_t *c, const spn_client_job_t *job, int64_t *id, bool *existed,
                          spn_error_t *err) {
  char t[17];
  cJSON *r = NULL;
  int32_t rc = call(c, "SUBMIT", job->body, t, &r, err);
  if (rc < 0)
    return rc;
  if (!spn__json_int(r, "id", id)) {
    cJSON_Delete(r);
    return spn_error_set(err, SPN_EPROTO, "client: SUBMITTED reply without an id");
  }
  if (existed)
    *existed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "existed"));
  cJSON_Delete(r);
  return SPN_OK;
}

static void fill_status(spn_client_t *c, const cJSON *o, spn_client_status_t *st) {
  memset(st, 0, sizeof *st);
  int64_t v;
  if (spn__json_int(o, "id", &v))
    st->id = v;
  int32_t s = spn_queue_state_parse(spn__json_str(o, "state"));
  st->state = s < 0 ? SPN_QSTATE_QUEUED : (spn_queue_state_t)s;
  if (spn__json_int(o, "attempts", &v))
    st->attempts = (uint32_t)v;
  if (spn__json_int(o, "max_attempts", &v))
    st->max_attempts = (uint32_t)v;
  if (spn__json_int(o, "done", &v))
    st->done = (uint64_t)v;
  if (spn__json_int(o, "total", &v))
    st->total = (uint64_t)v;
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "compute_s");
  st->compute_s = cJSON_IsNumber(x) ? x->valuedouble : 0;
  x = cJSON_GetObjectItemCaseSensitive(o, "gpu_s");
  st->gpu_s = cJSON_IsNumber(x) ? x->valuedouble : 0;
  const char *p = spn__json_str(o, "pipeline");
  snprintf(st->pipeline, sizeof st->pipeline, "%s", p ? p : "");
  p = spn__json_str(o, "reason");
  snprintf(st->reason, sizeof st->reason, "%s", p ? p : "");
  if (c) {
    p = spn__json_str(o, "waiting");
    c->waiting_id = st->id;
    snprintf(c->waiting, sizeof c->waiting, "%s", p ? p : "");
  }
}

bool spn_client_waiting(const spn_client_t *c, int64_t id, char *out, size_t n) {
  bool w = c && c->waiting_id == id && c->waiting[0];
  if (out && n)
    snprintf(out, n, "%s", w ? c->waiting : "");
  return w;
}

/* A request whose body is just {"id": id} (STATUS, WATCH, CANCEL).
 * The reply type is not needed by any of them: call() already turned an
 * error reply into a status.
 * Ownership: *reply is the caller's (cJSON_Delete). */
static int32_t call_id(spn_client_t *c, const char *type, int64_t id, cJSON **reply, spn_error_t *err) {
  cJSON *b = cJSON_CreateObject();
  if (!b)
    return spn_error_set(err, SPN_ENOMEM, "client: out of memory");
  cJSON_AddNumberToObject(b, "id", (double)id);
  char t[17];
  int32_t rc = call(c, type, b, t, reply, err);
  cJSON_Delete(b);
  return rc;
}

int32_t spn_client_status(spn_client_t *c, int64_t id, spn_client_status_t *st, spn_error_t *err) {
  cJSON *r = NULL;
  int32_t rc = call_id(c, "STATUS", id, &r, err);
  if (rc < 0)
    return rc;
  fill_status(c, r, st);
  cJSON_Delete(r);
  return SPN_OK;
}

int32_t spn_client_watch(spn_client_t *c, int64_t id, spn_client_event_cb cb, void *user,
                         spn_client_status_t *final, spn_error_t *err) {
  cJSON *r = NULL;
  int32_t rc = call_id(c, "WATCH", id, &r, err);
  if (rc < 0)
    return rc;
  spn_client_status_t st;
  fill_status(c, r, &st);
  cJSON_Delete(r);
  for (;;) {
    if (cb && cb(user, &st))
      break;
    if (spn_queue_state_terminal(st.state))
      break;
    spn_pmsg_t m;
    rc = recv_one(c, c->timeout_ms, &m, err);
    if (rc == SPN_ETIMEDOUT) {
      /* Quiet for a while (long job, or the gateway restarted and forgot
       * our watch): ask directly, and watch again. No answer to that
       * either: the gateway is gone for now; cb hears it (the same status
       * again, spn_client_unanswered_ms > 0) and decides how long to wait. */
      spn_client_status_t s2;
      cJSON *rr = NULL;
      rc = call_id(c, "WATCH", id, &rr, err);
      if (rc == SPN_ETIMEDOUT) {
        /* Without a callback nobody can say stop: give up after 60 silent
         * timeouts (10 min at the default 10 s). */
        int64_t silent = spn_client_unanswered_ms(c);
        if (!cb && silent >= 60LL * c->timeout_ms) {
          if (final)
            *final = st;
          return spn_error_set(err, SPN_ETIMEDOUT,
                               "client: job %lld: no answer from the gateway for %lld s; the job was %s when it "
                               "last answered and stays in its queue (watch it again to follow it)",
                               (long long)id, (long long)(silent / 1000), spn_queue_state_name(st.state));
        }
        continue;
      }
      if (rc < 0)
        return rc;
      fill_status(c, rr, &s2);
      cJSON_Delete(rr);
      st = s2;
      continue;
    }
    if (rc == SPN_EPROTO)
      continue;
    if (rc < 0)
      return rc;
    int64_t eid = 0;
    if (!strcmp(m.type, "EVENT") && spn__json_int(m.body, "id", &eid) && eid == id)
      fill_status(c, m.body, &st);
    cJSON_Delete(m.body);
  }
  if (final)
    *final = st;
  return SPN_OK;
}

int64_t spn_client_unanswered_ms(const spn_client_t *c) {
  return c->unanswered ? (int64_t)((spn__mono_s() - c->heard) * 1000.0) : 0;
}

int32_t spn_client_cancel(spn_client_t *c, int64_t id, spn_queue_state_t *state, spn_error_t *err) {
  cJSON *r = NULL;
  int32_t rc = call_id(c, "CANCEL", id, &r, err);
  if (rc < 0)
    return rc;
  if (state) {
    const char *s = spn__json_str(r, "state");
    int32_t v = spn_queue_state_parse(s);
    *state = v >= 0 ? (spn_queue_state_t)v : SPN_QSTATE_RUNNING;
  }
  cJSON_Delete(r);
  return SPN_OK;
}

int32_t spn_client_list(spn_client_t *c, int32_t state, uint32_t limit, spn_client_event_cb cb,
                        void *user, spn_error_t *err) {
  cJSON *b = cJSON_CreateObject();
  if (!b)
    return spn_error_set(err, SPN_ENOMEM, "client: out of memory");
  if (state >= 0)
    cJSON_AddStringToObject(b, "state", spn_queue_state_name((spn_queue_state_t)state));
  cJSON_AddNumberToObject(b, "limit", limit ? limit : 100);
  char t[17];
  cJSON *r = NULL;
  int32_t rc = call(c, "LIST", b, t, &r, err);
  cJSON_Delete(b);
  if (rc < 0)
    return rc;
  const cJSON *it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(r, "jobs")) {
    spn_client_status_t st;
    fill_status(NULL, it, &st);
    if (cb && cb(user, &st))
      break;
  }
  cJSON_Delete(r);
  return SPN_OK;
}
