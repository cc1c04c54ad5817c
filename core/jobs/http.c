/* http.c — the gateway's HTTP endpoint: /healthz, /readyz, /metrics.
 *
 * Invariants:
 * - Served on the loop thread; a connection never blocks the loop (libuv
 *   reads and writes), and is closed after one answer.
 * - /readyz answers 503 once the gateway is draining or stopping.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server-internal.h"

/* ---- HTTP: /healthz, /readyz, /metrics ---- */

/* A deliberately tiny HTTP/1.0 responder on the loop thread: one GET per
 * connection, request head at most 2 KiB, answer and close. Enough for
 * Kubernetes probes and a Prometheus scrape; nothing else is served. */
typedef struct http_conn {
  uv_tcp_t h;
  uv_write_t w;
  spn_server_t *s;
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

static void http_answer(http_conn_t *c) {
  spn_server_t *s = c->s;
  char path[64] = "";
  int code = 404;
  char body[2048];
  const char *ctype = "text/plain; charset=utf-8";
  char *metrics = NULL;
  snprintf(body, sizeof body, "not found\n");
  if (sscanf(c->in, "GET %63s", path) != 1) {
    code = 400;
    snprintf(body, sizeof body, "bad request\n");
  } else if (!strcmp(path, "/healthz")) {
    code = 200;
    snprintf(body, sizeof body, "ok\n");
  } else if (!strcmp(path, "/readyz")) {
    /* Ready: the pipelines named in the config were checked at start-up
     * and the loop is serving (not shutting down). */
    bool ready = !s->stopping && !s->draining;
    code = ready ? 200 : 503;
    snprintf(body, sizeof body, "%s\n", ready ? "ready" : "stopping");
  } else if (!strcmp(path, "/metrics")) {
    size_t alive = 0;
    for (size_t i = 0; i < s->nworkers; i++)
      alive += s->workers[i].alive;
    spn__observe_workers_t w = {.local = s->nslots, .remote = alive};
    spn_error_t err = SPN_ERROR_INIT;
    metrics = spn__observe_render(s->obs, &w, &err);
    if (!metrics) {
      code = 500;
      snprintf(body, sizeof body, "metrics unavailable: %s\n", err.msg);
    } else {
      code = 200;
      ctype = "text/plain; version=0.0.4";
    }
  }
  const char *text = metrics ? metrics : body;
  size_t cap = strlen(text) + 256;
  c->out = malloc(cap);
  if (!c->out) {
    free(metrics);
    uv_close((uv_handle_t *)&c->h, http_closed);
    return;
  }
  int n = snprintf(c->out, cap,
                   "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                   code, code == 200 ? "OK" : code == 404 ? "Not Found" : code == 503 ? "Service Unavailable" : "Error",
                   ctype, strlen(text), text);
  free(metrics);
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
  spn_server_t *s = srv->data;
  if (status < 0)
    return;
  http_conn_t *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->s = s;
  uv_tcp_init(&s->loop, &c->h);
  c->h.data = c;
  if (uv_accept(srv, (uv_stream_t *)&c->h) != 0 ||
      uv_read_start((uv_stream_t *)&c->h, http_alloc, http_read) != 0)
    uv_close((uv_handle_t *)&c->h, http_closed);
}

int32_t spn__http_start(spn_server_t *s, spn_error_t *err) {
  char host[128];
  const char *colon = strrchr(s->cfg->http, ':');
  if (!colon || colon == s->cfg->http || (size_t)(colon - s->cfg->http) >= sizeof host)
    return spn_error_set(err, SPN_ECONFIG, "server config: http \"%s\": expected HOST:PORT", s->cfg->http);
  snprintf(host, sizeof host, "%.*s", (int)(colon - s->cfg->http), s->cfg->http);
  char *end;
  long port = strtol(colon + 1, &end, 10);
  struct sockaddr_in addr;
  if (*end || port < 0 || port > 65535 || uv_ip4_addr(host, (int)port, &addr) != 0)
    return spn_error_set(err, SPN_ECONFIG, "server config: http \"%s\": expected IPv4-HOST:PORT", s->cfg->http);
  uv_tcp_init(&s->loop, &s->http);
  s->http.data = s;
  s->http_open = true;
  int r = uv_tcp_bind(&s->http, (const struct sockaddr *)&addr, 0);
  if (r == 0)
    r = uv_listen((uv_stream_t *)&s->http, 64, http_accept);
  if (r != 0)
    return spn_error_set(err, SPN_EIO, "server: http %s: %s", s->cfg->http, uv_strerror(r));
  return SPN_OK;
}

static void on_listener_closed(uv_handle_t *h) { (void)h; }

static void close_conn(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h) && h->type == UV_TCP)
    uv_close(h, http_closed);
}

void spn__http_stop(spn_server_t *s) {
  if (s->http_open) {
    uv_close((uv_handle_t *)&s->http, on_listener_closed);
    s->http_open = false;
  }
  /* Whatever TCP handles are left are HTTP connections: close them so
   * uv_run returns. */
  uv_walk(&s->loop, close_conn, s);
}
