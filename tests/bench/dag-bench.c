/* dag-bench.c — items/s through source -> 3 passthrough stages -> sink,
 * each stage its own actor, beside GStreamer and raw libzmq measured in the
 * same run; then per-hop latency with items spaced 1 ms apart.
 *
 *   dag-bench [items]            (default 1000000)
 *
 * Peers:
 *   - gst-launch-1.0 fakesrc num-buffers=N ! queue ! identity ! queue !
 *     identity ! queue ! fakesink sync=false, run as a subprocess and timed
 *     (wall clock, process start included, as a user would see it);
 *   - raw libzmq: one inproc PUSH/PULL hop between two threads, one 8-byte
 *     message (a pointer) per item: what a naive one-handle-per-message edge
 *     costs.
 * Not a test: it prints figures and ratios and never fails on speed. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "debug-internal.h"
#include "spindle/plugin.h"
#include "spindle/runtime.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct bcfg {
  const spn_host_api_t *host;
  int64_t count;
  int64_t gap_us;
  double *lat; /* sink: end-to-end latency per item, seconds */
  atomic_llong *got;
} bcfg_t;

typedef struct bjob {
  uint64_t id;
  int64_t next;
  double last;
} bjob_t;

static int32_t b_create(spn_stage_t *s, const void *config, void **state, spn_error_t *err) {
  (void)s;
  (void)err;
  *state = (void *)config;
  return SPN_OK;
}

static int32_t b_open(spn_stage_t *s, void *state, const spn_job_info_t *job, void **js, spn_error_t *err) {
  (void)s;
  (void)state;
  (void)err;
  bjob_t *j = calloc(1, sizeof *j);
  if (!j)
    return SPN_ENOMEM;
  j->id = job->job_id;
  *js = j;
  return SPN_OK;
}

static void b_close(spn_stage_t *s, void *state, void *js, bool ok) {
  (void)s;
  (void)state;
  (void)ok;
  free(js);
}

static int32_t b_generate(spn_stage_t *s, void *state, void *js, spn_error_t *err) {
  bcfg_t *c = state;
  bjob_t *j = js;
  if (j->next >= c->count)
    return SPN_EOS;
  double t = now_s();
  if (c->gap_us && j->next && t - j->last < (double)c->gap_us / 1e6)
    return SPN_EAGAIN;
  j->last = t;
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = j->id, .seq = (uint64_t)j->next, .pts = t,
                        .total = c->count};
  spn_msg_t *m = NULL;
  int32_t rc = c->host->msg_new(s, &env, &m, err);
  if (rc != SPN_OK)
    return rc;
  j->next++;
  return c->host->emit(s, 0, &m, err);
}

static int32_t b_pass(spn_stage_t *s, void *state, spn_msg_t **msgs, void **js, size_t n, spn_error_t *err) {
  (void)js;
  bcfg_t *c = state;
  for (size_t i = 0; i < n; i++) {
    int32_t rc = c->host->emit(s, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t b_sink(spn_stage_t *s, void *state, spn_msg_t **msgs, void **js, size_t n, spn_error_t *err) {
  (void)s;
  (void)js;
  (void)err;
  bcfg_t *c = state;
  if (c->lat) {
    double t = now_s();
    for (size_t i = 0; i < n; i++) {
      const spn_envelope_t *e = c->host->msg_envelope(msgs[i]);
      if ((int64_t)e->seq < c->count)
        c->lat[e->seq] = t - e->pts;
    }
  }
  atomic_fetch_add(c->got, (long long)n);
  return SPN_OK;
}

static const spn_port_t port[] = {{"out", "any"}};
static const spn_stage_kind_t k_src = {.struct_size = sizeof(spn_stage_kind_t), .name = "bsrc", .n_outputs = 1,
                                       .outputs = port, .device_need = SPN_NEED_CPU, .max_batch = 1,
                                       .create = b_create, .job_open = b_open, .generate = b_generate,
                                       .job_close = b_close};
static const spn_stage_kind_t k_pass = {.struct_size = sizeof(spn_stage_kind_t), .name = "bpass", .inputs = port,
                                        .n_inputs = 1, .n_outputs = 1, .outputs = port,
                                        .device_need = SPN_NEED_CPU, .max_batch = 1, .create = b_create,
                                        .job_open = b_open, .process = b_pass, .job_close = b_close};
static const spn_stage_kind_t k_sink = {.struct_size = sizeof(spn_stage_kind_t), .name = "bsink", .inputs = port,
                                        .n_inputs = 1, .device_need = SPN_NEED_CPU, .max_batch = 1,
                                        .create = b_create, .job_open = b_open, .process = b_sink,
                                        .job_close = b_close};

/* Runs source -> n_pass passthrough -> sink once; returns seconds from job
 * start to on_done. */
static double run_chain(int n_pass, int64_t count, int64_t gap_us, uint32_t max_batch, double *lat) {
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = "cpu";
  o.log_level = SPN_LOG_WARN;
  o.edge_capacity = 1024;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&o, &rt, &err) != SPN_OK) {
    fprintf(stderr, "runtime: %s\n", err.msg);
    exit(1);
  }
  atomic_llong got = 0;
  bcfg_t cfg = {.host = spn__runtime_host_api(rt), .count = count, .gap_us = gap_us, .lat = lat, .got = &got};
  static const char *names[] = {"src", "p1", "p2", "p3", "sink"};
  int n = n_pass + 2;
  spn__stage_spec_t st[5];
  spn__edge_spec_t ed[4];
  memset(st, 0, sizeof st);
  for (int i = 0; i < n; i++) {
    st[i].name = (char *)(i == n - 1 ? "sink" : names[i]);
    st[i].kind = i == 0 ? &k_src : i == n - 1 ? &k_sink : &k_pass;
    st[i].config = &cfg;
    st[i].device = (char *)"cpu";
    st[i].instances = 1;
    st[i].max_batch = i ? max_batch : 1;
    snprintf(st[i].where, sizeof st[i].where, "dag-bench:%d", i);
    if (i < n - 1)
      ed[i] = (spn__edge_spec_t){.from_stage = (uint32_t)i, .to_stage = (uint32_t)i + 1};
  }
  spn__pipeline_spec_t spec = {.name = (char *)"dag-bench", .file = (char *)"dag-bench", .stages = st,
                               .n_stages = (size_t)n, .edges = ed, .n_edges = (size_t)n - 1};
  spn_pipeline_t *pipe = NULL;
  if (spn__pipeline_new_from_spec(rt, &spec, false, &pipe, &err) != SPN_OK) {
    fprintf(stderr, "pipeline: %s\n", err.msg);
    exit(1);
  }
  spn_job_callbacks_t cb = {.struct_size = sizeof cb};
  spn_job_t *job = NULL;
  double t0 = now_s();
  if (spn_job_start(pipe, NULL, &cb, &job, &err) != SPN_OK) {
    fprintf(stderr, "job: %s\n", err.msg);
    exit(1);
  }
  int32_t rc = spn_job_wait(job, &err);
  double dt = now_s() - t0;
  if (rc != SPN_OK || atomic_load(&got) != count) {
    fprintf(stderr, "job failed: %s (%lld of %lld items)\n", err.msg, (long long)atomic_load(&got), (long long)count);
    exit(1);
  }
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  return dt;
}

/* Wall time of the GStreamer pipeline, or a negative value if unavailable. */
static double run_gst(int64_t count) {
  char nb[64];
  snprintf(nb, sizeof nb, "num-buffers=%lld", (long long)count);
  double t0 = now_s();
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execlp("gst-launch-1.0", "gst-launch-1.0", "-q", "fakesrc", nb, "!", "queue", "!", "identity", "!", "queue", "!",
           "identity", "!", "queue", "!", "fakesink", "sync=false", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  double dt = now_s() - t0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return -1;
  return dt;
}

typedef struct zarg {
  void *ctx;
  int64_t count;
} zarg_t;

static void *zmq_reader(void *p) {
  zarg_t *a = p;
  void *s = zmq_socket(a->ctx, ZMQ_PULL);
  zmq_connect(s, "inproc://bench");
  void *ptr;
  for (int64_t i = 0; i < a->count; i++)
    zmq_recv(s, &ptr, sizeof ptr, 0);
  zmq_close(s);
  return NULL;
}

static double run_zmq(int64_t count) {
  void *ctx = zmq_ctx_new();
  void *s = zmq_socket(ctx, ZMQ_PUSH);
  int hwm = 1000;
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_bind(s, "inproc://bench");
  zarg_t a = {ctx, count};
  pthread_t th;
  double t0 = now_s();
  pthread_create(&th, NULL, zmq_reader, &a);
  for (int64_t i = 0; i < count; i++) {
    void *ptr = &a;
    zmq_send(s, &ptr, sizeof ptr, 0);
  }
  pthread_join(th, NULL);
  double dt = now_s() - t0;
  zmq_close(s);
  zmq_ctx_term(ctx);
  return dt;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 1000000;
  if (n <= 0)
    n = 1000000;
  printf("dag-bench: %lld items, source -> 3 passthrough -> sink (5 actors, 4 hops), %ld CPUs\n", (long long)n,
         sysconf(_SC_NPROCESSORS_ONLN));
  run_chain(3, n / 10 > 1000 ? n / 10 : 1000, 0, 64, NULL); /* warm-up */
  double best = 1e9;
  for (int i = 0; i < 3; i++) {
    double t = run_chain(3, n, 0, 64, NULL);
    if (t < best)
      best = t;
  }
  double sp = (double)n / best;
  double t1 = run_chain(3, n, 0, 1, NULL);
  double sp1 = (double)n / t1;
  double gbest = 1e9;
  for (int i = 0; i < 3; i++) {
    double g = run_gst(n);
    if (g > 0 && g < gbest)
      gbest = g;
  }
  double zt = run_zmq(n);
  double zr = (double)n / zt;
  printf("spindle (max_batch 64)  %12.0f items/s   (best of 3, %.3f s)\n", sp, best);
  printf("spindle (max_batch 1)   %12.0f items/s   (%.3f s)\n", sp1, t1);
  if (gbest < 1e9) {
    double gr = (double)n / gbest;
    printf("gstreamer               %12.0f items/s   (best of 3, %.3f s, gst-launch-1.0 fakesrc ! 3x queue ! "
           "2x identity ! fakesink)\n", gr, gbest);
    printf("ratio spindle/gstreamer %12.2fx          (max_batch 1: %.2fx)\n", sp / gr, sp1 / gr);
  } else {
    printf("gstreamer               not available (gst-launch-1.0 missing or failed): no ratio\n");
  }
  printf("raw libzmq inproc hop   %12.0f msg/s     (one pointer per message)\n", zr);
  printf("ratio spindle/zmq-hop   %12.2fx          (spindle moves every item over 4 hops)\n", sp / zr);

  /* Latency: 1000 items spaced 1 ms apart (no batching delay), over one hop
   * (source -> sink) and over the four hops of the chain. */
  int64_t m = 1000;
  double *lat = calloc((size_t)m, sizeof *lat);
  for (int hops = 1; hops <= 4; hops += 3) {
    run_chain(hops - 1, m, 1000, 64, lat);
    qsort(lat, (size_t)m, sizeof *lat, cmp_d);
    double p50 = lat[m / 2], p99 = lat[m * 99 / 100];
    printf("latency, items 1 ms apart, %d hop%s: p50 %.1f us p99 %.1f us (per hop p50 %.1f us)\n", hops,
           hops > 1 ? "s" : " ", p50 * 1e6, p99 * 1e6, p50 * 1e6 / hops);
  }
  free(lat);
  return 0;
}
