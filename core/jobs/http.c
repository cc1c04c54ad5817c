/* http.c — /healthz, /readyz, /metrics for the gateway (on its loop) and for
 * `spindle worker` (on a thread of its own), served by libmicrohttpd.
 *
 * Invariants:
 * - GET (and HEAD) only; any other method gets 405. Each answer is built by
 *   the caller's handler and handed to libmicrohttpd, which owns the protocol
 *   (keep-alive, partial writes, limits, timeouts).
 * - We bind the listening socket ourselves (MHD_OPTION_LISTEN_SOCKET), so a
 *   bad or busy address is refused with the reason ("address already in
 *   use"), not a bare failure.
 * - On a loop (the gateway): libmicrohttpd runs without threads of its own,
 *   in epoll mode; its epoll descriptor is watched by a uv_poll on the loop
 *   and a timer drives its timeouts, so the handler runs on the loop thread
 *   (the queue is read there) and a connection never blocks the loop.
 * - On its own (the worker): libmicrohttpd's internal polling thread calls
 *   the handler; the handler must be thread-safe (the worker's is, under its
 *   mutex).
 * - libmicrohttpd's own messages go to our logger at debug level, never to
 *   stderr, so logs stay one JSON object per line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "observe.h"
#include "server-internal.h"

#define HTTP_CONN_LIMIT 64
#define HTTP_CONN_TIMEOUT_S 10
#define HTTP_TICK_MS 1000

struct spn__http {
  struct MHD_Daemon *d;
  spn__http_handler_t fn;
  void *user;
  spn__logger_t *log;
  /* on a loop only */
  bool on_loop;
  uv_poll_t poll;
  uv_timer_t timer;
  int open_handles;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **req) {
  (void)version;
  (void)upload;
  (void)upload_size;
  (void)req;
  spn__http_t *h = cls;
  spn__http_reply_t r = {.code = 500, .ctype = NULL, .body = NULL};
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    r.code = MHD_HTTP_METHOD_NOT_ALLOWED;
    r.body = strdup("only GET is served\n");
  } else {
    h->fn(h->user, url, &r);
  }
  const char *fallback = "out of memory\n";
  struct MHD_Response *resp =
      r.body ? MHD_create_response_from_buffer(strlen(r.body), r.body, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(strlen(fallback), (void *)fallback, MHD_RESPMEM_PERSISTENT);
  if (!resp) {
    free(r.body);
    return MHD_NO; /* libmicrohttpd closes the connection */
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r.ctype ? r.ctype : "text/plain; charset=utf-8");
  if (r.code == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  enum MHD_Result ok = MHD_queue_response(conn, r.body ? (unsigned)r.code : 500u, resp);
  MHD_destroy_response(resp);
  return ok;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  spn__http_t *h = cls;
  if (!h->log)
    return;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
    line[--n] = '\0';
  spn__log(h->log, SPN_LOG_DEBUG, 0, NULL, NULL, "http: %s", line);
}

/* A listening TCP socket on "HOST:PORT" (IPv4, or [IPv6]:PORT). */
static int32_t listen_on(const char *addr, int *fd_out, bool *v6, spn_error_t *err) {
  char host[128];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
    return spn_error_set(err, SPN_ECONFIG, "http \"%s\": expected HOST:PORT", addr);
  const char *hb = addr, *he = colon;
  *v6 = hb[0] == '[' && he[-1] == ']';
  if (*v6) {
    hb++;
    he--;
  }
  snprintf(host, sizeof host, "%.*s", (int)(he - hb), hb);
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len;
  if (*v6) {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t)port);
    len = sizeof *s6;
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) != 1)
      port = -1;
  } else {
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    s4->sin_family = AF_INET;
    s4->sin_port = htons((uint16_t)port);
    len = sizeof *s4;
    if (inet_pton(AF_INET, host, &s4->sin_addr) != 1)
      port = -1;
  }
  if (colon[1] == '\0' || *end || errno || port < 0 || port > 65535)
    return spn_error_set(err, SPN_ECONFIG, "http \"%s\": expected HOST:PORT with a numeric IPv4 or [IPv6] host",
                         addr);
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return spn_error_set(err, SPN_EIO, "http %s: socket: %s", addr, strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, HTTP_CONN_LIMIT) != 0) {
    int e = errno;
    close(fd);
    return spn_error_set(err, SPN_EIO, "http %s: %s", addr, strerror(e));
  }
  *fd_out = fd;
  return SPN_OK;
}

/* ---- driving libmicrohttpd from a libuv loop ---- */

static void on_tick(uv_timer_t *t);

static void drive(spn__http_t *h) {
  MHD_run(h->d);
  MHD_UNSIGNED_LONG_LONG ms = HTTP_TICK_MS;
  if (MHD_get_timeout(h->d, &ms) != MHD_YES || ms > HTTP_TICK_MS)
    ms = HTTP_TICK_MS;
  uv_timer_start(&h->timer, on_tick, ms, 0);
}

static void on_tick(uv_timer_t *t) { drive(t->data); }

static void on_ready(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  drive(p->data);
}

static void on_handle_closed(uv_handle_t *hd) {
  spn__http_t *h = hd->data;
  if (--h->open_handles == 0)
    free(h);
}

int32_t spn__http_open(const char *addr, spn__http_handler_t fn, void *user, uv_loop_t *loop, spn__logger_t *log,
                       spn__http_t **out, spn_error_t *err) {
  *out = NULL;
  spn__http_t *h = calloc(1, sizeof *h);
  if (!h)
    return spn_error_set(err, SPN_ENOMEM, "http: out of memory");
  h->fn = fn;
  h->user = user;
  h->log = log;
  h->on_loop = loop != NULL;
  int fd = -1;
  bool v6 = false;
  int32_t rc = listen_on(addr, &fd, &v6, err);
  if (rc < 0) {
    free(h);
    return rc;
  }
  unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0) |
                   (loop ? 0 : MHD_USE_INTERNAL_POLLING_THREAD);
  h->d = MHD_start_daemon(flags, 0, NULL, NULL, answer, h, MHD_OPTION_LISTEN_SOCKET, fd,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT,
                          (unsigned)HTTP_CONN_TIMEOUT_S, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, MHD_OPTION_END);
  if (!h->d) {
    close(fd);
    free(h);
    return spn_error_set(err, SPN_EIO, "http %s: libmicrohttpd could not start", addr);
  }
  if (loop) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
    if (!info || uv_poll_init(loop, &h->poll, info->epoll_fd) != 0) {
      MHD_stop_daemon(h->d);
      free(h);
      return spn_error_set(err, SPN_EIO, "http %s: cannot watch libmicrohttpd's epoll descriptor", addr);
    }
    uv_timer_init(loop, &h->timer);
    h->poll.data = h->timer.data = h;
    h->open_handles = 2;
    uv_poll_start(&h->poll, UV_READABLE, on_ready);
    uv_timer_start(&h->timer, on_tick, HTTP_TICK_MS, 0);
  }
  *out = h;
  return SPN_OK;
}

void spn__http_close(spn__http_t **ph) {
  spn__http_t *h = *ph;
  if (!h)
    return;
  *ph = NULL;
  if (h->on_loop) {
    uv_poll_stop(&h->poll);
    uv_timer_stop(&h->timer);
  }
  MHD_stop_daemon(h->d); /* closes the listening socket and every connection */
  if (h->on_loop) {
    /* freed when both handles are closed (the loop runs on to close them) */
    uv_close((uv_handle_t *)&h->poll, on_handle_closed);
    uv_close((uv_handle_t *)&h->timer, on_handle_closed);
  } else {
    free(h);
  }
}

/* ---- the gateway ---- */

static void gw_answer(void *user, const char *path, spn__http_reply_t *out) {
  spn_server_t *s = user;
  char body[SPN_ERROR_MSG_MAX + 64];
  if (!strcmp(path, "/healthz")) {
    /* Live, unless an in-process run is stuck inside a stage's call: only a
     * restart gets those workers back. */
    out->code = s->wedged[0] ? 503 : 200;
    if (s->wedged[0])
      snprintf(body, sizeof body, "wedged: %s\n", s->wedged);
    out->body = strdup(s->wedged[0] ? body : "ok\n");
  } else if (!strcmp(path, "/readyz")) {
    /* Ready: the pipelines named in the config were loaded at start-up, the
     * queue has answered since (a Redis not there yet is waited for), the
     * loop is serving (not draining or stopping), and when jobs run here a
     * device is usable. A queue that stops answering later does not make it
     * unready: clients get errors that say why, not a gateway gone. */
    char why[128] = "";
    bool devices = s->nslots == 0 || spn__observe_devices_ready(s->runner, why, sizeof why);
    bool ready = !s->stopping && !s->draining && devices && s->queue_answered;
    out->code = ready ? 200 : 503;
    snprintf(body, sizeof body, "%s\n", ready                ? "ready"
                                         : s->stopping || s->draining ? "stopping"
                                         : !devices         ? why
                                                            : "waiting for the job queue");
    out->body = strdup(body);
  } else if (!strcmp(path, "/metrics")) {
    spn__observe_workers_t w = {.local = s->nslots, .draining = s->draining != 0};
    int64_t now = spn__now_ms();
    for (size_t i = 0; i < s->nworkers; i++) {
      w.remote += s->workers[i].alive;
      w.remote_draining += s->workers[i].alive && s->workers[i].draining;
      w.remote_gone += spn__rworker_gone(&s->workers[i], now);
    }
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
  int32_t rc = spn__http_open(s->cfg->http, gw_answer, s, &s->loop, spn__observe_logger(s->obs), &s->http, err);
  if (rc < 0)
    spn_error_prefix(err, "%s", rc == SPN_ECONFIG ? "server config" : "server");
  return rc;
}

void spn__http_stop(spn_server_t *s) { spn__http_close(&s->http); }
