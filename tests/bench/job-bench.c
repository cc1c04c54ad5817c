/* job-bench.c — how fast the job gateway accepts and dispatches jobs, beside
 * raw libzmq on the same loopback in the same run, on both queue backends.
 *
 *   job-bench [N_SUBMIT] [N_LATENCY] [N_DISPATCH]
 *
 * Sections 1-3 use the SQLite queue. Section 4 repeats 1-3 with the Redis
 * queue (a redis-server this program starts on a free loopback port with
 * appendonly yes, appendfsync everysec, in a temporary folder), beside raw
 * Redis from the same client library (hiredis) in the same run: pipelined
 * XADD per second, an XADD round trip, and XREADGROUP+XACK of one entry (the
 * peer of a lease). Skipped when redis-server is missing.
 *
 * 1. Durable submissions accepted per second: one DEALER pipelines SUBMITs
 *    (window of 1000 in flight) to a gateway with no workers; a submission
 *    counts when its SUBMITTED reply arrives, i.e. after its group commit.
 *    Peer: the same pipelining against a bare ROUTER that echoes.
 * 1c. (printed after 1) The same with jobs that name files: one input
 *    and an output of their own each, confined and checked against the files
 *    of the jobs queued (on Redis too, in section 4). A refusal stops the
 *    series with the gateway's message and the figure 0.
 * 1b. The same with synchronous=FULL (an fsync per group commit).
 * 2. Submit latency (p50/p99/max), one submission at a time, interleaved
 *    with the peer's round trip of the same bytes (gateway, 5 ms, peer,
 *    5 ms, ...): each series is spaced 10 ms apart and both see the same
 *    moments of the machine. Peer: REQ/REP on the same loopback (SQLite),
 *    an XADD round trip (Redis).
 * 3. Dispatch overhead on an empty pipeline ("noop") with one in-process
 *    worker: submit N, time until the last (FIFO) succeeds, per job.
 * 5. Retention (both queues): 4 x N_DISPATCH ended jobs deleted by the
 *    queue's purge in the gateway's passes of 500, the mean and worst pass
 *    beside the mean group commit of 500 submissions of the same jobs.
 * Not a test: prints figures and ratios, gates nothing.
 */
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>
#include <zmq.h>

#include "jobs-internal.h"
#include "proto-internal.h"
#include "../jobs/sqlite-files.h"

static double now_s(void) { return spn__mono_s(); }

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
  qsort(v, n, sizeof *v, cmp_d);
  size_t i = (size_t)(p * (double)(n - 1) + 0.5);
  return v[i];
}

typedef struct srv {
  spn_server_config_t cfg;
  spn_job_runner_t runner;
  spn_server_t *s;
  pthread_t th;
  char ep[128];
  char db[64];
} srv_t;

static void *srv_main(void *arg) {
  srv_t *v = arg;
  spn_server_run(v->s, NULL);
  return NULL;
}

static int srv_start(srv_t *v, uint32_t workers, int port, bool sync_full, const char *redis_url,
                     const char *prefix, const char *root) {
  spn_server_config_defaults(&v->cfg);
  v->cfg.sync_full = sync_full;
  spn_error_t rerr = SPN_ERROR_INIT;
  if (root && (spn__roots_add(&v->cfg.input_roots, root, &rerr) < 0 ||
               spn__roots_add(&v->cfg.output_roots, root, &rerr) < 0)) {
    fprintf(stderr, "job-bench: %s\n", rerr.msg);
    return -1;
  }
  if (redis_url) {
    v->cfg.queue_backend = strdup("redis");
    v->cfg.queue_url = strdup(redis_url);
    v->cfg.queue_prefix = strdup(prefix);
  }
  snprintf(v->db, sizeof v->db, "/tmp/spn-bench-XXXXXX");
  int fd = mkstemp(v->db);
  close(fd);
  snprintf(v->ep, sizeof v->ep, "tcp://127.0.0.1:%d", port);
  v->cfg.bind = strdup(v->ep);
  v->cfg.db_path = strdup(v->db);
  v->cfg.workers = workers;
  spn_test_runner_config_t rc = {0};
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_test_runner_new(&rc, &v->runner, &err) < 0 ||
      spn_server_new(&v->cfg, &v->runner, &v->s, &err) < 0) {
    fprintf(stderr, "job-bench: %s\n", err.msg);
    return -1;
  }
  pthread_create(&v->th, NULL, srv_main, v);
  return 0;
}

static void srv_stop(srv_t *v) {
  spn_server_stop(v->s);
  pthread_join(v->th, NULL);
  spn_server_free(&v->s);
  spn_test_runner_free(&v->runner);
  spn_server_config_clear(&v->cfg);
  remove_sqlite_files(v->db);
}

static const char submit_body[] = "{\"req\":1,\"pipeline\":\"noop\"}";

static void send4(void *s, const char *type, const char *body) {
  zmq_send(s, "", 0, ZMQ_SNDMORE);
  zmq_send(s, "SPN1", 4, ZMQ_SNDMORE);
  zmq_send(s, type, strlen(type), ZMQ_SNDMORE);
  zmq_send(s, body, strlen(body), 0);
}

/* Receive one whole message; returns its type in t (0 on failure), and an
 * ERROR's message in why when given. */
static int recv_why(void *s, char t[17], int timeout_ms, char *why, size_t why_size) {
  zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&it, 1, timeout_ms) <= 0)
    return -1;
  spn_pmsg_t m;
  if (spn__proto_recv(s, false, &m) != SPN_OK)
    return -1;
  snprintf(t, 17, "%s", m.type);
  if (why) {
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(m.body, "message");
    snprintf(why, why_size, "%s", cJSON_IsString(msg) ? msg->valuestring : "");
  }
  cJSON_Delete(m.body);
  return m.error ? -1 : 0;
}

static int recv_msg(void *s, char t[17], int timeout_ms) { return recv_why(s, t, timeout_ms, NULL, 0); }

static void *dealer(void *ctx, const char *ep) {
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int z = 0, hwm = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &z, sizeof z);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_connect(s, ep);
  return s;
}

/* The body of SUBMIT number k: submit_body; or, with files_dir, a job with
 * one input (files_dir/in.bin, which exists) and an output of its own, which
 * the queue checks against those of every job queued or running. */
static const char *body_of(char *buf, size_t size, const char *files_dir, int k) {
  if (!files_dir)
    return submit_body;
  snprintf(buf, size, "{\"req\":1,\"pipeline\":\"noop\",\"inputs\":{\"in\":\"%s/in.bin\"},"
           "\"outputs\":{\"out\":\"%s/out-%d.bin\"}}", files_dir, files_dir, k);
  return buf;
}

/* Pipelined submissions; returns accepted per second. */
static double pipelined_files(void *ctx, const char *ep, int n, const char *expect, const char *files_dir) {
  void *s = dealer(ctx, ep);
  char t[17], b[512], why[512];
  int k = 0;
  /* warm up the connection */
  send4(s, "SUBMIT", body_of(b, sizeof b, files_dir, k++));
  if (recv_msg(s, t, 5000) < 0) {
    fprintf(stderr, "job-bench: no reply from %s\n", ep);
    zmq_close(s);
    return 0;
  }
  int sent = 0, got = 0, window = 1000;
  /* warm-up: the first thousands of rows grow the fresh database file */
  for (int w = 0; w < 2000; w++)
    send4(s, "SUBMIT", body_of(b, sizeof b, files_dir, k++));
  for (int w = 0; w < 2000; w++)
    if (recv_msg(s, t, 10000) < 0)
      break;
  double t0 = now_s();
  while (got < n) {
    while (sent < n && sent - got < window) {
      send4(s, "SUBMIT", body_of(b, sizeof b, files_dir, k++));
      sent++;
    }
    if (recv_why(s, t, 10000, why, sizeof why) < 0) {
      fprintf(stderr, "job-bench: reply %d of %d missing\n", got, n);
      break;
    }
    if (strcmp(t, expect) != 0) {
      /* a refusal is not a submission: the figure would be a lie */
      fprintf(stderr, "job-bench: %s, not %s: %s\n", t, expect, why);
      zmq_close(s);
      return 0;
    }
    got++;
  }
  double dt = now_s() - t0;
  zmq_close(s);
  return got / dt;
}

static double pipelined(void *ctx, const char *ep, int n, const char *expect) {
  return pipelined_files(ctx, ep, n, expect, NULL);
}

/* A bare ROUTER echoing each message: the peer for pipelined submissions. */
typedef struct echo {
  void *ctx;
  char ep[64];
  volatile int stop;
  int router; /* 1 ROUTER, 0 REP */
} echo_t;

static void *echo_main(void *arg) {
  echo_t *e = arg;
  void *s = zmq_socket(e->ctx, e->router ? ZMQ_ROUTER : ZMQ_REP);
  int z = 0, to = 100, hwm = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &z, sizeof z);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_bind(s, e->ep);
  while (!e->stop) {
    zmq_msg_t f[8];
    int n = 0, more = 1;
    while (more && n < 8) {
      zmq_msg_init(&f[n]);
      if (zmq_msg_recv(&f[n], s, 0) < 0) {
        zmq_msg_close(&f[n]);
        break;
      }
      more = zmq_msg_more(&f[n]);
      n++;
    }
    if (more) {
      for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
      continue;
    }
    if (e->router && n == 5) {
      /* reply like the gateway: [id]["" ]["SPN1"]["SUBMITTED"][body] */
      zmq_msg_send(&f[0], s, ZMQ_SNDMORE);
      zmq_msg_send(&f[1], s, ZMQ_SNDMORE);
      zmq_msg_send(&f[2], s, ZMQ_SNDMORE);
      zmq_send(s, "SUBMITTED", 9, ZMQ_SNDMORE);
      zmq_send(s, "{\"req\":1,\"id\":1,\"existed\":false}", 33, 0);
      zmq_msg_close(&f[3]);
      zmq_msg_close(&f[4]);
    } else {
      for (int i = 0; i < n; i++)
        zmq_msg_send(&f[i], s, i + 1 < n ? ZMQ_SNDMORE : 0);
    }
  }
  zmq_close(s);
  return NULL;
}

/* ---- raw Redis (hiredis): the peer of the Redis queue ---- */

typedef struct redis_srv {
  pid_t pid;
  char dir[64];
  char url[64];
  int port;
} redis_srv_t;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

static int redis_start(redis_srv_t *r) {
  snprintf(r->dir, sizeof r->dir, "/tmp/spn-bench-redis-XXXXXX");
  r->port = free_port();
  if (!mkdtemp(r->dir) || r->port < 0)
    return -1;
  char port[16];
  snprintf(port, sizeof port, "%d", r->port);
  fflush(stdout); /* the child must not print our buffer again */
  r->pid = fork();
  if (r->pid == 0) {
    freopen("/dev/null", "w", stdout);
    execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir", r->dir,
           "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", (char *)NULL);
    _exit(127);
  }
  snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
  for (int i = 0; i < 100; i++) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (c && !c->err) {
      redisReply *rep = redisCommand(c, "PING");
      bool ok = rep && rep->type == REDIS_REPLY_STATUS;
      freeReplyObject(rep);
      redisFree(c);
      if (ok)
        return 0;
    } else if (c) {
      redisFree(c);
    }
    int st;
    if (waitpid(r->pid, &st, WNOHANG) == r->pid)
      return -1;
    usleep(50000);
  }
  return -1;
}

static void redis_stop(redis_srv_t *r) {
  if (r->pid > 0) {
    kill(r->pid, SIGTERM);
    waitpid(r->pid, NULL, 0);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "job-bench: could not remove %s\n", r->dir);
}

typedef struct raw_redis {
  double xadd_rate, rg50;
} raw_redis_t;

/* XADD of the same body a SUBMIT carries, pipelined (window 1000); then
 * XREADGROUP COUNT 1 + XACK round trips (what a lease is at least). The XADD
 * round trip is measured beside the gateway's submissions (latency()). */
static int raw_redis(const redis_srv_t *r, int n, int n_lat, raw_redis_t *out) {
  struct timeval tv = {5, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
  if (!c || c->err)
    return -1;
  redisReply *rep = redisCommand(c, "XGROUP CREATE raw:s g $ MKSTREAM");
  freeReplyObject(rep);
  for (int i = 0; i < 2000; i++)
    redisAppendCommand(c, "XADD raw:s * spec %s", submit_body);
  for (int i = 0; i < 2000; i++) {
    if (redisGetReply(c, (void **)&rep) != REDIS_OK)
      return -1;
    freeReplyObject(rep);
  }
  int sent = 0, got = 0;
  double t0 = now_s();
  while (got < n) {
    while (sent < n && sent - got < 1000) {
      redisAppendCommand(c, "XADD raw:s * spec %s", submit_body);
      sent++;
    }
    if (redisGetReply(c, (void **)&rep) != REDIS_OK)
      return -1;
    freeReplyObject(rep);
    got++;
  }
  out->xadd_rate = n / (now_s() - t0);
  double *rg = calloc((size_t)n_lat, sizeof *rg);
  for (int i = 0; i < n_lat; i++) {
    double t1 = now_s();
    rep = redisCommand(c, "XREADGROUP GROUP g c COUNT 1 STREAMS raw:s >");
    const char *sid = NULL;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 1)
      sid = rep->element[0]->element[1]->element[0]->element[0]->str;
    redisReply *ack = sid ? redisCommand(c, "XACK raw:s g %s", sid) : NULL;
    rg[i] = (now_s() - t1) * 1e3;
    freeReplyObject(ack);
    freeReplyObject(rep);
  }
  out->rg50 = pct(rg, (size_t)n_lat, 0.5);
  free(rg);
  redisFree(c);
  return 0;
}

/* One round trip of the peer: milliseconds, or -1 on failure. */
typedef double (*peer_rt_fn)(void *arg);

/* REQ/REP round trip of the SUBMIT frames against the echoing REP. */
static double peer_reqrep(void *req) {
  char buf[256];
  double t0 = now_s();
  zmq_send(req, "SPN1", 4, ZMQ_SNDMORE);
  zmq_send(req, "SUBMIT", 6, ZMQ_SNDMORE);
  zmq_send(req, submit_body, strlen(submit_body), 0);
  int more = 1;
  while (more) {
    if (zmq_recv(req, buf, sizeof buf, 0) < 0)
      return -1;
    size_t ms = sizeof more;
    zmq_getsockopt(req, ZMQ_RCVMORE, &more, &ms);
  }
  return (now_s() - t0) * 1e3;
}

/* XADD round trip of the same body (hiredis, blocking). */
static double peer_xadd(void *c) {
  double t0 = now_s();
  redisReply *rep = redisCommand(c, "XADD raw:l * spec %s", submit_body);
  double ms = (now_s() - t0) * 1e3;
  bool ok = rep && rep->type == REDIS_REPLY_STRING;
  freeReplyObject(rep);
  return ok ? ms : -1;
}

typedef struct lat {
  double p50, p99, max, peer50, peer99, peermax;
} lat_t;

/* Submit latency through a gateway beside the peer's round trip,
 * interleaved (gateway, 5 ms, peer, 5 ms, ...): each series is spaced 10 ms
 * apart and both see the same machine at the same moments. */
static void latency(void *ctx, const char *ep, int n_lat, peer_rt_fn peer, void *peer_arg, lat_t *out) {
  char t[17];
  void *s = dealer(ctx, ep);
  send4(s, "SUBMIT", submit_body);
  recv_msg(s, t, 5000);
  peer(peer_arg); /* connects */
  double *lat = calloc((size_t)n_lat, sizeof *lat), *pl = calloc((size_t)n_lat, sizeof *pl);
  int n = 0;
  for (; n < n_lat; n++) {
    double t0 = now_s();
    send4(s, "SUBMIT", submit_body);
    if (recv_msg(s, t, 5000) < 0)
      break;
    lat[n] = (now_s() - t0) * 1e3;
    usleep(5000);
    if ((pl[n] = peer(peer_arg)) < 0)
      break;
    usleep(5000);
  }
  zmq_close(s);
  if (n < n_lat)
    fprintf(stderr, "job-bench: latency stopped after %d of %d\n", n, n_lat);
  if (n == 0)
    n = 1;
  out->p50 = pct(lat, (size_t)n, 0.5);
  out->p99 = pct(lat, (size_t)n, 0.99);
  out->max = lat[n - 1];
  out->peer50 = pct(pl, (size_t)n, 0.5);
  out->peer99 = pct(pl, (size_t)n, 0.99);
  out->peermax = pl[n - 1];
  free(lat);
  free(pl);
}

/* Submit n noop jobs to a gateway with one worker; seconds until the last
 * succeeded (and seconds for the submissions alone). */
static double dispatch(void *ctx, const char *ep, int n_disp, double *t_sub_out) {
  void *s = dealer(ctx, ep);
  double t0 = now_s();
  int got = 0, sent = 0;
  int64_t last_id = 0;
  while (got < n_disp) {
    while (sent < n_disp && sent - got < 1000) {
      send4(s, "SUBMIT", submit_body);
      sent++;
    }
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 10000) <= 0)
      break;
    spn_pmsg_t m;
    if (spn__proto_recv(s, false, &m) != SPN_OK)
      break;
    int64_t id;
    if (m.body && spn__json_int(m.body, "id", &id) && id > last_id)
      last_id = id;
    cJSON_Delete(m.body);
    got++;
  }
  *t_sub_out = now_s() - t0;
  char body[96];
  snprintf(body, sizeof body, "{\"req\":2,\"id\":%lld}", (long long)last_id);
  send4(s, "WATCH", body);
  for (;;) {
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 30000) <= 0)
      break;
    spn_pmsg_t m;
    if (spn__proto_recv(s, false, &m) != SPN_OK)
      break;
    const char *st = m.body ? spn__json_str(m.body, "state") : NULL;
    bool fin = st && !strcmp(st, "succeeded");
    cJSON_Delete(m.body);
    if (fin)
      break;
  }
  double t_all = now_s() - t0;
  zmq_close(s);
  return t_all;
}

/* ---- 5. retention ---- */

/* n ended jobs with one input and one output each, submitted in batches of
 * RET_BATCH (the time of those group commits is the peer), leased and
 * completed; then deleted by the queue's purge in passes of RET_BATCH (the
 * gateway's passes). Prints the mean and worst pass beside the mean batch of
 * submissions. */
#define RET_BATCH 500
static int retention_run(spn_queue_t *q, const char *name, int n) {
  spn_error_t err = SPN_ERROR_INIT;
  char spec[256];
  double t_sub = 0;
  int batches = 0;
  for (int b = 0; b < n; b += RET_BATCH, batches++) {
    double t0 = now_s();
    if (q->ops->begin(q->impl, &err) < 0)
      goto fail;
    for (int i = b; i < b + RET_BATCH && i < n; i++) {
      snprintf(spec, sizeof spec, "{\"pipeline\":\"p\",\"inputs\":{\"in\":\"/d/in.bin\"},"
               "\"outputs\":{\"out\":\"/d/out-%d.bin\"}}", i);
      spn_queue_submit_t s = {.spec_json = spec, .max_attempts = 1};
      int64_t id;
      bool ex;
      if (q->ops->submit(q->impl, &s, 1000, &id, &ex, &err) < 0)
        goto fail;
    }
    if (q->ops->commit(q->impl, &err) < 0)
      goto fail;
    t_sub += now_s() - t0;
  }
  for (int i = 0; i < n; i++) {
    spn_queue_job_t j;
    if (q->ops->lease(q->impl, "w", NULL, 2000, 600000, &j, &err) < 0)
      goto fail;
    int32_t rc = q->ops->complete(q->impl, j.id, j.attempts, "w", 0, 0, NULL, NULL, 3000, &err);
    if (rc == SPN_OK && q->ops->unpublished)
      rc = q->ops->unpublished(q->impl, j.id, &err);
    spn__queue_job_clear(&j);
    if (rc < 0)
      goto fail;
  }
  double sum = 0, worst = 0;
  uint32_t got, total = 0;
  int passes = 0;
  do {
    double t0 = now_s();
    if (q->ops->purge(q->impl, 1000000, RET_BATCH, &got, &err) < 0)
      goto fail;
    double dt = now_s() - t0;
    sum += dt;
    worst = dt > worst ? dt : worst;
    total += got;
    passes++;
  } while (got == RET_BATCH);
  printf("%s: retention: %u ended jobs (an input and an output each) deleted in %d passes of <= %d: mean %.1f ms, "
         "worst %.1f ms a pass   peer, submitting them in batches of %d: mean %.1f ms a batch   ratio %.2f\n",
         name, total, passes, RET_BATCH, sum / passes * 1e3, worst * 1e3, RET_BATCH, t_sub / batches * 1e3,
         (sum / passes) / (t_sub / batches));
  return 0;
fail:
  fprintf(stderr, "job-bench: retention (%s): %s\n", name, err.msg);
  return -1;
}

/* Section 5 on the queue qc opens (closed after). */
static int retention(const spn_queue_config_t *qc, const char *name, int n) {
  spn_queue_t q;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_queue_open(qc, &q, &err) < 0) {
    fprintf(stderr, "job-bench: retention (%s): %s\n", name, err.msg);
    return -1;
  }
  int rc = retention_run(&q, name, n);
  spn_queue_free(&q);
  return rc;
}

int main(int argc, char **argv) {
  int n_submit = argc > 1 ? atoi(argv[1]) : 20000;
  int n_lat = argc > 2 ? atoi(argv[2]) : 1000;
  int n_disp = argc > 3 ? atoi(argv[3]) : 5000;
  int base = 20000 + (int)(getpid() % 20000);
  void *ctx = zmq_ctx_new();
  pthread_t eth;

  /* ---- peers: raw libzmq ---- */
  echo_t er = {.ctx = ctx, .router = 1};
  snprintf(er.ep, sizeof er.ep, "tcp://127.0.0.1:%d", base + 1);
  pthread_create(&eth, NULL, echo_main, &er);
  usleep(50000);
  double peer_rate = pipelined(ctx, er.ep, n_submit, "SUBMITTED");
  er.stop = 1;
  pthread_join(eth, NULL);

  echo_t ep2 = {.ctx = ctx, .router = 0};
  snprintf(ep2.ep, sizeof ep2.ep, "tcp://127.0.0.1:%d", base + 2);
  pthread_create(&eth, NULL, echo_main, &ep2);
  usleep(50000);
  void *req = zmq_socket(ctx, ZMQ_REQ);
  int z = 0;
  zmq_setsockopt(req, ZMQ_LINGER, &z, sizeof z);
  zmq_connect(req, ep2.ep);

  /* a folder with one input, the root of the jobs with files (1c, 4) */
  char files[] = "/tmp/spn-bench-files-XXXXXX", in[64];
  if (!mkdtemp(files))
    return 1;
  snprintf(in, sizeof in, "%s/in.bin", files);
  FILE *inf = fopen(in, "wb");
  if (!inf || fputs("input", inf) < 0 || fclose(inf) != 0)
    return 1;

  /* ---- 1. accepted submissions per second (SQLite) ---- */
  srv_t a;
  if (srv_start(&a, 0, base, false, NULL, NULL, files) < 0)
    return 1;
  double rate = pipelined(ctx, a.ep, n_submit, "SUBMITTED");
  printf("sqlite: durable submissions accepted (WAL, synchronous=NORMAL): %8.0f /s   raw ROUTER echo, same frames: %8.0f /s   ratio %.2f\n",
         rate, peer_rate, peer_rate > 0 ? rate / peer_rate : 0);
  /* 1c. jobs that name files, each checked against the jobs queued */
  double frate_files = pipelined_files(ctx, a.ep, n_submit, "SUBMITTED", files);
  printf("sqlite: the same, each job with an input and an output (checked against the jobs queued): %8.0f /s   "
         "ratio to raw %.2f, to jobs without files %.2f\n",
         frate_files, peer_rate > 0 ? frate_files / peer_rate : 0, rate > 0 ? frate_files / rate : 0);
  srv_t f;
  if (srv_start(&f, 0, base + 4, true, NULL, NULL, NULL) < 0)
    return 1;
  double frate = pipelined(ctx, f.ep, n_submit, "SUBMITTED");
  srv_stop(&f);
  printf("sqlite: durable submissions accepted (synchronous=FULL, fsync per group commit): %8.0f /s   ratio to raw %.2f\n",
         frate, peer_rate > 0 ? frate / peer_rate : 0);

  /* ---- 2. latency with sends spaced 10 ms apart ---- */
  lat_t sl;
  latency(ctx, a.ep, n_lat, peer_reqrep, req, &sl);
  srv_stop(&a);
  zmq_close(req);
  ep2.stop = 1;
  pthread_join(eth, NULL);
  double r50 = sl.peer50;
  printf("sqlite: submit latency (10 ms spacing, n=%d, interleaved with the peer): p50 %.3f ms  p99 %.3f ms  max %.3f ms   "
         "raw REQ/REP: p50 %.3f ms  p99 %.3f ms  max %.3f ms   ratio p50 %.1fx p99 %.1fx\n",
         n_lat, sl.p50, sl.p99, sl.max, sl.peer50, sl.peer99, sl.peermax, sl.p50 / sl.peer50, sl.p99 / sl.peer99);

  /* ---- 3. dispatch overhead, empty pipeline, one worker ---- */
  srv_t d;
  if (srv_start(&d, 1, base + 3, false, NULL, NULL, NULL) < 0)
    return 1;
  double t_sub, t_all = dispatch(ctx, d.ep, n_disp, &t_sub);
  srv_stop(&d);
  printf("sqlite: dispatch, empty pipeline, 1 worker, %d jobs: %.1f us/job end to end (submissions alone %.1f us/job); "
         "%.0f jobs/s   vs raw REQ/REP round trip %.1f us: ratio %.1fx\n",
         n_disp, t_all / n_disp * 1e6, t_sub / n_disp * 1e6, n_disp / t_all, r50 * 1e3,
         (t_all / n_disp * 1e6) / (r50 * 1e3));

  /* ---- 5 (SQLite). retention ---- */
  {
    char rp[] = "/tmp/spn-bench-ret-XXXXXX";
    int rfd = mkstemp(rp);
    close(rfd);
    spn_queue_config_t qc = {.path = rp, .backoff_base_ms = 1000, .backoff_max_ms = 8000, .seed = 1};
    retention(&qc, "sqlite", n_disp * 4);
    remove_sqlite_files(rp);
  }

  /* ---- 4. the same on the Redis queue, beside raw Redis ---- */
  redis_srv_t rs = {0};
  if (redis_start(&rs) < 0) {
    printf("redis: skipped (redis-server did not start; Debian package redis-server)\n");
    redis_stop(&rs);
    unlink(in);
    rmdir(files);
    zmq_ctx_term(ctx);
    return 0;
  }
  raw_redis_t raw = {0};
  if (raw_redis(&rs, n_submit, n_lat, &raw) < 0)
    fprintf(stderr, "job-bench: raw redis failed\n");
  srv_t ra;
  if (srv_start(&ra, 0, base + 5, false, rs.url, "bench1:", files) < 0)
    return 1;
  double rrate = pipelined(ctx, ra.ep, n_submit, "SUBMITTED");
  double rrate_files = pipelined_files(ctx, ra.ep, n_submit, "SUBMITTED", files);
  struct timeval tv = {5, 0};
  redisContext *rc = redisConnectWithTimeout("127.0.0.1", rs.port, tv);
  lat_t rl = {0};
  if (rc && !rc->err)
    latency(ctx, ra.ep, n_lat, peer_xadd, rc, &rl);
  else
    fprintf(stderr, "job-bench: raw redis connection failed\n");
  if (rc)
    redisFree(rc);
  srv_stop(&ra);
  printf("redis (appendonly, fsync everysec): submissions accepted: %8.0f /s   raw XADD pipelined (hiredis): %8.0f /s   ratio %.2f\n",
         rrate, raw.xadd_rate, raw.xadd_rate > 0 ? rrate / raw.xadd_rate : 0);
  printf("redis: the same, each job with an input and an output (checked by the submit script, one round trip each): "
         "%8.0f /s   ratio to raw %.2f, to jobs without files %.2f\n",
         rrate_files, raw.xadd_rate > 0 ? rrate_files / raw.xadd_rate : 0, rrate > 0 ? rrate_files / rrate : 0);
  printf("redis: submit latency (10 ms spacing, n=%d, interleaved with the peer): p50 %.3f ms  p99 %.3f ms  max %.3f ms   "
         "raw XADD round trip: p50 %.3f ms  p99 %.3f ms  max %.3f ms   ratio p50 %.1fx p99 %.1fx\n",
         n_lat, rl.p50, rl.p99, rl.max, rl.peer50, rl.peer99, rl.peermax, rl.p50 / rl.peer50, rl.p99 / rl.peer99);
  srv_t rd;
  if (srv_start(&rd, 1, base + 6, false, rs.url, "bench2:", NULL) < 0)
    return 1;
  t_all = dispatch(ctx, rd.ep, n_disp, &t_sub);
  srv_stop(&rd);
  printf("redis: dispatch, empty pipeline, 1 worker, %d jobs: %.1f us/job end to end (submissions alone %.1f us/job); "
         "%.0f jobs/s   vs raw XREADGROUP+XACK of one entry %.1f us: ratio %.1fx\n",
         n_disp, t_all / n_disp * 1e6, t_sub / n_disp * 1e6, n_disp / t_all, raw.rg50 * 1e3,
         (t_all / n_disp * 1e6) / (raw.rg50 * 1e3));
  spn_queue_config_t rqc = {.backend = "redis", .url = rs.url, .prefix = "bench3:", .lease_ms = 600000,
                            .backoff_base_ms = 1000, .backoff_max_ms = 8000, .seed = 1};
  retention(&rqc, "redis", n_disp * 4);
  redis_stop(&rs);
  unlink(in);
  rmdir(files);
  zmq_ctx_term(ctx);
  return 0;
}
