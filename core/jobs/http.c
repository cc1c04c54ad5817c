/* http.c — /healthz, /readyz, /metrics for the gateway (on its loop) and for
 * `spindle worker` (on a thread of its own).
 *
 * Invariants:
 * - A deliberately tiny HTTP/1.0 responder: one GET per connection, request
 *   head at most 2 KiB, answer and close. Enough for Kubernetes probes and a
 *   Prometheus scrape; nothing else is served.
 * - A connection never blocks its loop (libuv reads and writes).
 * - The gateway answers on its loop thread (the queue is read there);
 *   /readyz answers 503 once it is draining or stopping, or when it runs jobs
 *   in-process and no device is usable.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe.h"
#include "server-internal.h"

/* What a listener answers with; the listener's data. */
typedef struct http_ctx {
  spn__http_handler_t fn;
  void *user;
} http_ctx_t;

typedef struct http_conn {
  uv_tcp_t h;
  uv_write_t w;
  http_ctx_t *ctx;
  char in[2048];
  size_t n;
  char *out;
  bool answered;
} http_conn_t;

static void http_closed(uv_handle_t *h) {
  http_conn_t *c = h->data;
  free(c->out);
  free(c);
}

static void http_written(uv_write_t *w, int status) {
  (void)status;
  http_conn_t *c = w->data;
  if (!uv_is_closing((uv_handle_t *)&c->h))
    uv_close((uv_handle_t *)&c->h, http_closed);
}

static void http_alloc(uv_handle_t *h, size_t sug, uv_buf_t *b) {
  (void)sug;
  http_conn_t *c = h->data;
  b->base = c->in + c->n;
  b->len = sizeof c->in - 1 - c->n;
}

static const char *reason_of(int code) {
  switch (code) {
  case 200:
    return "OK";
  case 400:
    return "Bad Request";
  case 404:
    return "Not Found";
  case 503:
    return "Service Unavailable";
  default:
    return "Error";
  }
}

static void http_answer(http_conn_t *c) {
  char path[64] = "";
  spn__http_reply_t r = {.code = 500, .ctype = NULL, .body = NULL};
  if (sscanf(c->in, "GET %63s", path) != 1) {
    r.code = 400;
    r.body = strdup("bad request\n");
  } else {
    c->ctx->fn(c->ctx->user, path, &r);
  }
  const char *text = r.body ? r.body : "out of memory\n";
  const char *ctype = r.ctype ? r.ctype : "text/plain; charset=utf-8";
  size_t cap = strlen(text) + 256;
  c->out = malloc(cap);
  if (!c->out) {
    free(r.body);
    uv_close((uv_handle_t *)&c->h, http_closed);
    return;
  }
  int n = snprintf(c->out, cap,
                   "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                   r.code, reason_of(r.code), ctype, strlen(text), text);
  free(r.body);
  uv_buf_t b = uv_buf_init(c->out, (unsigned)n);
  c->w.data = c;
  c->answered = true;
  uv_read_stop((uv_stream_t *)&c->h);
  if (uv_write(&c->w, (uv_stream_t *)&c->h, &b, 1, http_written) != 0)
    uv_close((uv_handle_t *)&c->h, http_closed);
}

static void http_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  (void)b;
  http_conn_t *c = st->data;
  if (c->answered)
    return;
  if (nread < 0) {
    uv_close((uv_handle_t *)&c->h, http_closed);
    return;
  }
  c->n += (size_t)nread;
  c->in[c->n] = '\0';
  if (strstr(c->in, "\r\n\r\n") || strstr(c->in, "\n\n") || c->n >= sizeof c->in - 1)
    http_answer(c);
}

static void http_accept(uv_stream_t *srv, int status) {
  if (status < 0)
    return;
  http_conn_t *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->ctx = srv->data;
  uv_tcp_init(srv->loop, &c->h);
  c->h.data = c;
  if (uv_accept(srv, (uv_stream_t *)&c->h) != 0 ||
      uv_read_start((uv_stream_t *)&c->h, http_alloc, http_read) != 0)
    uv_close((uv_handle_t *)&c->h, http_closed);
}

/* Bind tcp (initialised on loop) to "HOST:PORT"; tcp->data = ctx. */
static int32_t http_listen(uv_loop_t *loop, uv_tcp_t *tcp, const char *addr, http_ctx_t *ctx, spn_error_t *err) {
  char host[128];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
    return spn_error_set(err, SPN_ECONFIG, "http \"%s\": expected HOST:PORT", addr);
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  char *end;
  long port = strtol(colon + 1, &end, 10);
  struct sockaddr_in sa;
  if (*end || port < 0 || port > 65535 || uv_ip4_addr(host, (int)port, &sa) != 0)
    return spn_error_set(err, SPN_ECONFIG, "http \"%s\": expected IPv4-HOST:PORT", addr);
  tcp->data = ctx;
  int r = uv_tcp_bind(tcp, (const struct sockaddr *)&sa, 0);
  if (r == 0)
    r = uv_listen((uv_stream_t *)tcp, 64, http_accept);
  if (r != 0)
    return spn_error_set(err, SPN_EIO, "http %s: %s", addr, uv_strerror(r));
  (void)loop;
  return SPN_OK;
}

static void on_listener_closed(uv_handle_t *h) {
  free(h->data);
  h->data = NULL;
}

/* Every TCP handle of the loop but the listener is a connection. */
static void close_conn(uv_handle_t *h, void *listener) {
  if (h != listener && !uv_is_closing(h) && h->type == UV_TCP)
    uv_close(h, http_closed);
}

/* ---- the gateway ---- */

static void gw_answer(void *user, const char *path, spn__http_reply_t *out) {
  spn_server_t *s = user;
  char body[SPN_ERROR_MSG_MAX + 64];
  if (!strcmp(path, "/healthz")) {
    out->code = 200;
    out->body = strdup("ok\n");
  } else if (!strcmp(path, "/readyz")) {
    /* Ready: the pipelines named in the config were loaded at start-up, the
     * loop is serving (not draining or stopping), and when jobs run here a
     * device is usable. */
    char why[128] = "";
    bool devices = s->nslots == 0 || spn__observe_devices_ready(s->runner, why, sizeof why);
    bool ready = !s->stopping && !s->draining && devices;
    out->code = ready ? 200 : 503;
    snprintf(body, sizeof body, "%s\n", ready ? "ready" : !devices ? why : "stopping");
    out->body = strdup(body);
  } else if (!strcmp(path, "/metrics")) {
    size_t alive = 0;
    for (size_t i = 0; i < s->nworkers; i++)
      alive += s->workers[i].alive;
    spn__observe_workers_t w = {.local = s->nslots, .remote = alive};
    spn_error_t err = SPN_ERROR_INIT;
    out->body = spn__observe_render(s->obs, &w, s->runner, &err);
    if (out->body) {
      out->code = 200;
      out->ctype = "text/plain; version=0.0.4";
    } else {
      out->code = 500;
      snprintf(body, sizeof body, "metrics unavailable: %s\n", err.msg);
      out->body = strdup(body);
    }
  } else {
    out->code = 404;
    out->body = strdup("not found\n");
  }
}

int32_t spn__http_start(spn_server_t *s, spn_error_t *err) {
  http_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return spn_error_set(err, SPN_ENOMEM, "server: out of memory");
  ctx->fn = gw_answer;
  ctx->user = s;
  uv_tcp_init(&s->loop, &s->http);
  s->http_open = true;
  int32_t rc = http_listen(&s->loop, &s->http, s->cfg->http, ctx, err);
  if (rc < 0)
    spn_error_prefix(err, "%s", rc == SPN_ECONFIG ? "server config" : "server");
  return rc;
}

void spn__http_stop(spn_server_t *s) {
  if (s->http_open) {
    uv_close((uv_handle_t *)&s->http, on_listener_closed);
    s->http_open = false;
  }
  /* Whatever TCP handles are left are HTTP connections: close them so
   * uv_run returns. */
  uv_walk(&s->loop, close_conn, &s->http);
}

/* ---- on a thread of its own (spindle worker) ---- */

struct spn__http_thread {
  uv_loop_t loop;
  uv_tcp_t tcp;
  uv_async_t stop;
  pthread_t th;
};

static void on_stop(uv_async_t *a) {
  spn__http_thread_t *t = a->data;
  uv_close((uv_handle_t *)&t->tcp, on_listener_closed);
  uv_walk(&t->loop, close_conn, &t->tcp);
  uv_close((uv_handle_t *)&t->stop, NULL);
}

static void *http_thread_main(void *arg) {
  spn__http_thread_t *t = arg;
  uv_run(&t->loop, UV_RUN_DEFAULT);
  return NULL;
}

int32_t spn__http_thread_start(const char *addr, spn__http_handler_t fn, void *user, spn__http_thread_t **out,
                               spn_error_t *err) {
  *out = NULL;
  spn__http_thread_t *t = calloc(1, sizeof *t);
  http_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!t || !ctx || uv_loop_init(&t->loop) != 0) {
    free(t);
    free(ctx);
    return spn_error_set(err, SPN_ENOMEM, "http: out of memory");
  }
  ctx->fn = fn;
  ctx->user = user;
  uv_tcp_init(&t->loop, &t->tcp);
  uv_async_init(&t->loop, &t->stop, on_stop);
  t->stop.data = t;
  int32_t rc = http_listen(&t->loop, &t->tcp, addr, ctx, err);
  if (rc == SPN_OK && pthread_create(&t->th, NULL, http_thread_main, t) != 0)
    rc = spn_error_set(err, SPN_EIO, "http %s: cannot start its thread", addr);
  if (rc < 0) {
    /* never ran: close the handles on this thread */
    uv_close((uv_handle_t *)&t->tcp, on_listener_closed);
    uv_close((uv_handle_t *)&t->stop, NULL);
    uv_run(&t->loop, UV_RUN_DEFAULT);
    uv_loop_close(&t->loop);
    free(t);
    return rc;
  }
  *out = t;
  return SPN_OK;
}

void spn__http_thread_stop(spn__http_thread_t **pt) {
  spn__http_thread_t *t = *pt;
  if (!t)
    return;
  uv_async_send(&t->stop);
  pthread_join(t->th, NULL);
  uv_loop_close(&t->loop);
  free(t);
  *pt = NULL;
}
