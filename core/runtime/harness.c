/* harness.c — one stage under test on the real runtime (spindle/harness.h).
 *
 * The harness builds an ordinary pipeline in its own runtime: a feeder per
 * input port of the kind under test ("in<p>", kind harness_feed), the stage
 * itself ("x"), and a collector per output port ("out<q>", kind
 * harness_collect). Feeders and collectors are stage kinds registered
 * directly in the runtime's registry and written against plugin.h like any
 * plugin; they reach the harness through an integer config key holding its
 * address (the registry copies kinds, so nothing else could carry it).
 *
 * Invariants: jobs and their queues are changed by the owner thread only
 * between runs, except what the executors touch while a run is in flight —
 * the feeders' read cursors and the collectors' outputs — which is under
 * h->mu. A message pushed is owned by the harness until a feeder emits it;
 * a collected message is owned by the harness until the next run or free.
 *
 * SDK 1.1 additions: a job set to fail (spn_harness_job_fail) gets no EOS
 * from its feeders; once every message pushed for it was emitted and the
 * stage under test has processed or dropped everything sent to it (no
 * credit in flight on its input links), one feeder fails the job, so the
 * stage sees job_close(ok=false) after its last process call. The stage's
 * progress reports reach the harness through its stage runtime's progress
 * tap (host.c), terminal or not; a message the harness made carries its id
 * in harness_id, which no other message has.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime-internal.h"
#include "spindle/harness.h"

#define HARNESS_MAX_PORTS 16

typedef struct hjob {
  uint64_t id;
  char **sets;              /* "x.key=value" */
  size_t n_sets;
  spn_msg_t **in[HARNESS_MAX_PORTS];
  size_t n_in[HARNESS_MAX_PORTS], cap_in[HARNESS_MAX_PORTS], next_in[HARNESS_MAX_PORTS]; /* next_in: mu */
  spn_msg_t **out[HARNESS_MAX_PORTS];                                                      /* mu */
  size_t n_out[HARNESS_MAX_PORTS], cap_out[HARNESS_MAX_PORTS];                             /* mu */
  bool eos[HARNESS_MAX_PORTS];                                                             /* mu */
  bool ran;
  spn_error_t status;
  int32_t fail_status;          /* spn_harness_job_fail, for the next run; 0 = none */
  char *fail_msg;
  bool fail_sent;               /* mu */
  bool reported;                /* mu: the stage reported progress */
  int64_t prog_done, prog_total; /* mu */
  spn_transfer_stats_t xfer;    /* its copies in the last run (spn_job_transfers at its end) */
} hjob_t;

struct spn_harness {
  spn_runtime_t *rt;
  spn_pipeline_t *pipe;
  uint32_t n_in, n_out;
  pthread_mutex_t mu;
  hjob_t **jobs;
  size_t n_jobs, cap_jobs;
  spn__stage_rt_t *x; /* the stage under test */
  uint64_t next_id;   /* the last spn_harness_msg_id given */
};

typedef struct hport_config {
  int64_t harness; /* the spn_harness_t's address */
  int64_t port;
} hport_config_t;

static const spn_config_field_t hport_schema[] = {
    {.key = "harness", .type = SPN_CONFIG_INT, .offset = offsetof(hport_config_t, harness), .doc = "(internal)"},
    {.key = "port", .type = SPN_CONFIG_INT, .offset = offsetof(hport_config_t, port), .doc = "(internal)"},
    {0}};

typedef struct hport {
  spn_harness_t *h;
  uint32_t port;
} hport_t;

static hjob_t *find_job(const spn_harness_t *h, uint64_t id) {
  for (size_t i = 0; i < h->n_jobs; i++)
    if (h->jobs[i]->id == id)
      return h->jobs[i];
  return NULL;
}

static int32_t hport_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const hport_config_t *c = config;
  hport_t *p = malloc(sizeof *p);
  if (!p)
    return spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
  p->h = (spn_harness_t *)(uintptr_t)c->harness;
  p->port = (uint32_t)c->port;
  *state = p;
  return SPN_OK;
}

static void hport_destroy(spn_stage_t *stage, void *state) {
  (void)stage;
  free(state);
}

static int32_t hport_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                              spn_error_t *err) {
  hport_t *p = state;
  pthread_mutex_lock(&p->h->mu);
  hjob_t *j = find_job(p->h, job->job_id);
  pthread_mutex_unlock(&p->h->mu);
  if (!j)
    return spn_error_set(err, SPN_ENOENT, "harness: job %" PRIu64 " was not pushed", job->job_id);
  *job_state = j;
  return SPN_OK;
}

/* Counted messages sent to the stage under test and not yet processed or
 * dropped by it, all jobs together. */
static long long x_in_flight(const spn_harness_t *h) {
  long long n = 0;
  for (uint32_t i = 0; i < h->pipe->n_links; i++)
    if (h->pipe->links[i]->to->srt == h->x)
      n += atomic_load(&h->pipe->links[i]->in_flight);
  return n;
}

/* A job set to fail, out of messages on this port: wait (SPN_EAGAIN: the
 * runtime calls again in a millisecond) until every port fed it all and the
 * stage took everything; then *fail is set once (the caller fails the job
 * outside mu). Never an EOS: the dead job is closed by the runtime, and
 * SPN_EOS from a feeder of a dead job sends nothing. Called under mu. */
static int32_t hfeed_fail(spn_harness_t *h, hjob_t *j, bool *fail) {
  if (j->fail_sent)
    return SPN_EOS;
  for (uint32_t q = 0; q < h->n_in; q++)
    if (j->next_in[q] < j->n_in[q])
      return SPN_EAGAIN;
  if (x_in_flight(h))
    return SPN_EAGAIN;
  j->fail_sent = *fail = true;
  return SPN_EOS;
}

/* Feeder: one queued message per call, then SPN_EOS (or the job's failure). */
static int32_t hfeed_generate(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  hport_t *p = state;
  hjob_t *j = job_state;
  spn_msg_t *m = NULL;
  int32_t rc = SPN_EOS;
  bool fail = false;
  pthread_mutex_lock(&p->h->mu);
  if (j->next_in[p->port] < j->n_in[p->port]) {
    m = j->in[p->port][j->next_in[p->port]];
    j->in[p->port][j->next_in[p->port]++] = NULL;
  } else if (j->fail_status) {
    rc = hfeed_fail(p->h, j, &fail);
  }
  pthread_mutex_unlock(&p->h->mu);
  if (fail) /* fail_status and fail_msg do not change during a run */
    spn_stage_host(stage)->fail_job(stage, j->id, j->fail_status, j->fail_msg);
  if (!m)
    return rc;
  m->env.job_id = j->id;
  return spn_stage_host(stage)->emit(stage, 0, &m, err);
}

/* Collector: keeps every message, in arrival order. */
static int32_t hcollect_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                                spn_error_t *err) {
  hport_t *p = state;
  uint32_t q = p->port;
  pthread_mutex_lock(&p->h->mu);
  for (size_t i = 0; i < n; i++) {
    hjob_t *j = job_states[i];
    if (j->n_out[q] == j->cap_out[q]) {
      size_t cap = j->cap_out[q] ? 2 * j->cap_out[q] : 16;
      spn_msg_t **v = realloc(j->out[q], cap * sizeof *v);
      if (!v) {
        pthread_mutex_unlock(&p->h->mu);
        return spn_error_set(err, SPN_ENOMEM, "harness: out of memory collecting");
      }
      j->out[q] = v;
      j->cap_out[q] = cap;
    }
    j->out[q][j->n_out[q]++] = msgs[i];
    msgs[i] = NULL;
  }
  pthread_mutex_unlock(&p->h->mu);
  return SPN_OK;
}

static int32_t hcollect_flush(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err) {
  hport_t *p = state;
  hjob_t *j = job_state;
  pthread_mutex_lock(&p->h->mu);
  j->eos[p->port] = true;
  pthread_mutex_unlock(&p->h->mu);
  return SPN_OK;
}

/* The stage under test's host->progress (host.c): the last report per job. */
static void hprogress_tap(void *data, uint64_t job_id, int64_t done, int64_t total) {
  spn_harness_t *h = data;
  pthread_mutex_lock(&h->mu);
  hjob_t *j = find_job(h, job_id);
  if (j) {
    j->reported = true;
    j->prog_done = done;
    j->prog_total = total;
  }
  pthread_mutex_unlock(&h->mu);
}

static const spn_port_t hany_out[] = {{.name = "out", .type = "any"}};
static const spn_port_t hany_in[] = {{.name = "in", .type = "any"}};

static const spn_stage_kind_t hfeed_kind = SPN_STAGE_KIND(
    .name = "harness_feed", .doc = "the harness's feeder (internal)", .schema = hport_schema,
    .config_size = sizeof(hport_config_t), .outputs = hany_out, .n_outputs = 1, .create = hport_create,
    .job_open = hport_job_open, .generate = hfeed_generate, .destroy = hport_destroy);

/* The collector takes every memory kind and is placed as the stage under
 * test is by default (the runtime's first device), so a GPU stage's device
 * tensors reach the test as the stage emitted them, not copied to the host. */
static const spn_port_caps_t hcollect_caps[] = {
    {.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SPN_MEMSET_DEVICE | SPN_MEMSET_HOST | SPN_MEMSET_PINNED}};

static const spn_stage_kind_t hcollect_kind = SPN_STAGE_KIND(
    .name = "harness_collect", .doc = "the harness's collector (internal)", .schema = hport_schema,
    .config_size = sizeof(hport_config_t), .inputs = hany_in, .n_inputs = 1, .max_batch = 16,
    .device_need = SPN_NEED_EITHER, .input_caps = hcollect_caps,
    .create = hport_create, .job_open = hport_job_open, .process = hcollect_process, .flush = hcollect_flush,
    .destroy = hport_destroy);

/* ---- building the pipeline ------------------------------------------------ */

typedef struct sbuf {
  char *s;
  size_t n, cap;
  bool nomem;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) SPN_PRINTF(2, 3);
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->nomem = true;
      return;
    }
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? b->cap : 256);
    while (cap <= b->n + (size_t)k)
      cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->nomem = true;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

int32_t spn_harness_new(const spn_harness_opts_t *opts, spn_harness_t **out, spn_error_t *err) {
  if (!opts || !out || !opts->kind)
    return spn_error_set(err, SPN_EINVAL, "harness: NULL options, kind or out");
  *out = NULL;
  spn_harness_t *h = calloc(1, sizeof *h);
  if (!h)
    return spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
  pthread_mutex_init(&h->mu, NULL);
  spn_runtime_opts_t ro = SPN_RUNTIME_OPTS_INIT;
  ro.devices = opts->devices ? opts->devices : "cpu";
  ro.log_level = opts->log_level;
  ro.cpu_threads = 2;
  int32_t rc = spn_runtime_new(&ro, &h->rt, err);
  if (rc != SPN_OK)
    goto out_free;
  rc = opts->plugin ? spn_runtime_load_plugin(h->rt, opts->plugin, err) : spn_runtime_load_plugins(h->rt, err);
  if (rc != SPN_OK && opts->plugin)
    goto out_free;
  const spn_stage_kind_t *k = spn__registry_find(h->rt->reg, opts->kind, NULL);
  if (!k) {
    rc = spn_error_set(err, SPN_ENOENT, "harness: no stage kind \"%s\" (%s)", opts->kind,
                       opts->plugin ? opts->plugin : "plugin search path");
    goto out_free;
  }
  if (k->n_inputs > HARNESS_MAX_PORTS || k->n_outputs > HARNESS_MAX_PORTS) {
    rc = spn_error_set(err, SPN_EUNSUPPORTED, "harness: kind \"%s\" has more than %d ports", opts->kind,
                       HARNESS_MAX_PORTS);
    goto out_free;
  }
  h->n_in = k->n_inputs;
  h->n_out = k->n_outputs;
  if ((rc = spn__registry_add_kind(h->rt->reg, &hfeed_kind, "(harness)", err)) != SPN_OK ||
      (rc = spn__registry_add_kind(h->rt->reg, &hcollect_kind, "(harness)", err)) != SPN_OK)
    goto out_free;

  uint64_t self = (uint64_t)(uintptr_t)h;
  sbuf_t b = {0};
  sb_printf(&b, "[pipeline]\nname = \"harness\"\n");
  for (uint32_t p = 0; p < h->n_in; p++)
    sb_printf(&b, "[[stage]]\nname = \"in%u\"\nkind = \"harness_feed\"\nharness = %" PRIu64 "\nport = %u\n", p,
              self, p);
  sb_printf(&b, "[[stage]]\nname = \"x\"\nkind = \"%s\"\n", opts->kind);
  if (h->n_in) {
    sb_printf(&b, "inputs = {");
    for (uint32_t p = 0; p < h->n_in; p++)
      sb_printf(&b, "%s %s = \"in%u.out\"", p ? "," : "", k->inputs[p].name, p);
    sb_printf(&b, " }\n");
  }
  if (opts->config)
    sb_printf(&b, "%s\n", opts->config);
  for (uint32_t q = 0; q < h->n_out; q++)
    sb_printf(&b, "[[stage]]\nname = \"out%u\"\nkind = \"harness_collect\"\ninputs = [\"x.%s\"]\nharness = %" PRIu64
                  "\nport = %u\n",
              q, k->outputs[q].name, self, q);
  if (b.nomem) {
    free(b.s);
    rc = spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
    goto out_free;
  }
  rc = spn_pipeline_load_string(h->rt, b.s, b.n, "harness", NULL, 0, &h->pipe, err);
  free(b.s);
  if (rc != SPN_OK)
    goto out_free;
  for (uint32_t i = 0; i < h->pipe->n_stages; i++)
    if (!strcmp(h->pipe->stages[i].spec->name, "x"))
      h->x = &h->pipe->stages[i];
  SPN_ASSERT(h->x);
  h->x->progress_tap = hprogress_tap; /* no job runs yet: the executors see it set */
  h->x->progress_tap_data = h;
  *out = h;
  return SPN_OK;

out_free:
  spn_harness_free(&h);
  return rc;
}

static void clear_outputs(hjob_t *j) {
  for (size_t q = 0; q < HARNESS_MAX_PORTS; q++) {
    for (size_t i = 0; i < j->n_out[q]; i++)
      spn__msg_free(&j->out[q][i]);
    j->n_out[q] = 0;
    j->eos[q] = false;
  }
}

static void job_free(hjob_t **jp) {
  hjob_t *j = *jp;
  if (!j)
    return;
  clear_outputs(j);
  for (size_t q = 0; q < HARNESS_MAX_PORTS; q++) {
    for (size_t i = 0; i < j->n_in[q]; i++)
      spn__msg_free(&j->in[q][i]);
    free(j->in[q]);
    free(j->out[q]);
  }
  for (size_t i = 0; i < j->n_sets; i++)
    free(j->sets[i]);
  free(j->sets);
  free(j->fail_msg);
  free(j);
  *jp = NULL;
}

void spn_harness_free(spn_harness_t **hp) {
  if (!hp || !*hp)
    return;
  spn_harness_t *h = *hp;
  /* Messages first: their buffers come from the runtime's devices. */
  for (size_t i = 0; i < h->n_jobs; i++)
    job_free(&h->jobs[i]);
  spn_pipeline_free(&h->pipe);
  spn_runtime_free(&h->rt);
  free(h->jobs);
  pthread_mutex_destroy(&h->mu);
  free(h);
  *hp = NULL;
}

const spn_host_api_t *spn_harness_host(const spn_harness_t *h) { return h->rt->host; }
uint32_t spn_harness_input_count(const spn_harness_t *h) { return h->n_in; }
uint32_t spn_harness_output_count(const spn_harness_t *h) { return h->n_out; }

int32_t spn_harness_msg_new(spn_harness_t *h, uint64_t seq, spn_msg_t **out, spn_error_t *err) {
  spn_envelope_t env = {.struct_size = sizeof env, .seq = seq, .pts = 0, .total = -1};
  int32_t rc = spn__msg_new(&env, out, err);
  if (rc == SPN_OK && h)
    (*out)->harness_id = ++h->next_id;
  return rc;
}

void spn_harness_msg_set_pts(spn_harness_t *h, spn_msg_t *msg, double pts) {
  (void)h;
  SPN_ASSERT(msg);
  msg->env.pts = pts;
}

int32_t spn_harness_add_tensor(spn_harness_t *h, spn_msg_t *msg, const char *name, const spn_tensor_t *t,
                               const void *data, spn_error_t *err) {
  if (!h || !msg || !name || !t || !data)
    return spn_error_set(err, SPN_EINVAL, "harness: add_tensor: NULL argument");
  size_t n = spn_tensor_nbytes(t);
  spn_buffer_t *buf = NULL;
  /* Host memory, as a CPU stage's host->buffer_new gives: a stage whose port
   * takes host memory gets this very buffer (the zero-copy path), not an
   * edge copy of it. */
  int32_t rc = spn_buffer_type_alloc(spn_device_buffer_type(h->rt->host_dev, SPN_MEM_HOST), n, &buf, err);
  if (rc != SPN_OK)
    return rc;
  memcpy(spn_buffer_data(buf), data, n);
  rc = h->rt->host->msg_add_tensor(msg, name, t, buf, err);
  spn_buffer_unref(&buf);
  return rc;
}

static hjob_t *job_get(spn_harness_t *h, uint64_t id, spn_error_t *err) {
  if (id == 0) {
    spn_error_set(err, SPN_EINVAL, "harness: job id 0 is reserved");
    return NULL;
  }
  hjob_t *j = find_job(h, id);
  if (j)
    return j;
  if (h->n_jobs == h->cap_jobs) {
    size_t cap = h->cap_jobs ? 2 * h->cap_jobs : 8;
    hjob_t **v = realloc(h->jobs, cap * sizeof *v);
    if (!v) {
      spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
      return NULL;
    }
    h->jobs = v;
    h->cap_jobs = cap;
  }
  if (!(j = calloc(1, sizeof *j))) {
    spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
    return NULL;
  }
  j->id = id;
  pthread_mutex_lock(&h->mu); /* feeders of a run in flight read the list */
  h->jobs[h->n_jobs++] = j;
  pthread_mutex_unlock(&h->mu);
  return j;
}

int32_t spn_harness_push(spn_harness_t *h, uint64_t job_id, uint32_t port, spn_msg_t **msg, spn_error_t *err) {
  if (!msg || !*msg)
    return spn_error_set(err, SPN_EINVAL, "harness: push: NULL message");
  int32_t rc = SPN_OK;
  hjob_t *j = NULL;
  if (!h)
    rc = spn_error_set(err, SPN_EINVAL, "harness: push: NULL harness");
  else if (port >= h->n_in)
    rc = spn_error_set(err, SPN_EINVAL, "harness: push: port %u, the kind has %u inputs", port, h->n_in);
  else if (!(j = job_get(h, job_id, err)))
    rc = err ? err->code : SPN_ENOMEM;
  if (rc == SPN_OK && j->n_in[port] == j->cap_in[port]) {
    size_t cap = j->cap_in[port] ? 2 * j->cap_in[port] : 16;
    spn_msg_t **v = realloc(j->in[port], cap * sizeof *v);
    if (!v)
      rc = spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
    else
      j->in[port] = v, j->cap_in[port] = cap;
  }
  if (rc != SPN_OK) {
    spn__msg_free(msg);
    return rc;
  }
  (*msg)->env.job_id = job_id;
  j->in[port][j->n_in[port]++] = *msg;
  *msg = NULL;
  return SPN_OK;
}

int32_t spn_harness_job_set(spn_harness_t *h, uint64_t job_id, const char *key_value, spn_error_t *err) {
  if (!h)
    return spn_error_set(err, SPN_EINVAL, "harness: job_set: NULL harness");
  hjob_t *j = job_get(h, job_id, err);
  if (!j)
    return err ? err->code : SPN_ENOMEM;
  if (!key_value)
    return SPN_OK;
  char **v = realloc(j->sets, (j->n_sets + 1) * sizeof *v);
  if (!v)
    return spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
  j->sets = v;
  size_t n = strlen(key_value) + 3;
  if (!(v[j->n_sets] = malloc(n)))
    return spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
  snprintf(v[j->n_sets++], n, "x.%s", key_value);
  return SPN_OK;
}

int32_t spn_harness_run(spn_harness_t *h, spn_error_t *err) {
  if (!h)
    return spn_error_set(err, SPN_EINVAL, "harness: run: NULL harness");
  spn_job_t **jobs = calloc(h->n_jobs ? h->n_jobs : 1, sizeof *jobs);
  if (!jobs)
    return spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
  int32_t rc = SPN_OK;
  for (size_t i = 0; i < h->n_jobs; i++) {
    hjob_t *j = h->jobs[i];
    clear_outputs(j);
    j->ran = false;
    spn_error_clear(&j->status);
    j->fail_sent = j->reported = false; /* no run in flight: no lock needed */
    j->prog_done = j->prog_total = 0;
    memset(&j->xfer, 0, sizeof j->xfer);
  }
  size_t started = 0;
  for (; started < h->n_jobs; started++) {
    hjob_t *j = h->jobs[started];
    spn_job_params_t params = SPN_JOB_PARAMS_INIT;
    params.job_id = j->id;
    params.overrides = (const char *const *)j->sets;
    params.n_overrides = j->n_sets;
    spn_job_callbacks_t cb = {.struct_size = sizeof cb};
    if ((rc = spn_job_start(h->pipe, &params, &cb, &jobs[started], err)) != SPN_OK) {
      spn_error_prefix(err, "harness: job %" PRIu64, j->id);
      break;
    }
  }
  for (size_t i = 0; i < started; i++) {
    hjob_t *j = h->jobs[i];
    j->status.code = spn_job_wait(jobs[i], &j->status);
    spn_job_transfers(jobs[i], &j->xfer);
    j->ran = true;
    spn_job_free(&jobs[i]);
  }
  free(jobs);
  /* A message a job did not consume stays queued for no one: drop it. */
  for (size_t i = 0; i < h->n_jobs; i++) {
    hjob_t *j = h->jobs[i];
    for (size_t p = 0; p < HARNESS_MAX_PORTS; p++) {
      for (size_t k = 0; k < j->n_in[p]; k++)
        spn__msg_free(&j->in[p][k]);
      j->n_in[p] = j->next_in[p] = 0;
    }
    j->fail_status = 0; /* like the pushed messages: for one run */
    free(j->fail_msg);
    j->fail_msg = NULL;
  }
  return rc;
}

int32_t spn_harness_job_status(const spn_harness_t *h, uint64_t job_id, spn_error_t *err) {
  const hjob_t *j = h ? find_job(h, job_id) : NULL;
  if (!j || !j->ran)
    return spn_error_set(err, SPN_ENOENT, "harness: job %" PRIu64 " did not run", job_id);
  if (err)
    *err = j->status;
  return j->status.code;
}

size_t spn_harness_output_len(const spn_harness_t *h, uint64_t job_id, uint32_t port) {
  const hjob_t *j = h ? find_job(h, job_id) : NULL;
  return j && port < HARNESS_MAX_PORTS ? j->n_out[port] : 0;
}

const spn_msg_t *spn_harness_output(const spn_harness_t *h, uint64_t job_id, uint32_t port, size_t i) {
  const hjob_t *j = h ? find_job(h, job_id) : NULL;
  return j && port < HARNESS_MAX_PORTS && i < j->n_out[port] ? j->out[port][i] : NULL;
}

bool spn_harness_output_eos(const spn_harness_t *h, uint64_t job_id, uint32_t port) {
  const hjob_t *j = h ? find_job(h, job_id) : NULL;
  return j && port < HARNESS_MAX_PORTS && j->eos[port];
}

/* ---- SDK 1.1 ---------------------------------------------------------------- */

void spn_harness_msg_set_total(spn_harness_t *h, spn_msg_t *msg, int64_t total) {
  (void)h;
  SPN_ASSERT(msg);
  msg->env.total = total < 0 ? -1 : total;
}

void spn_harness_msg_set_skip(spn_harness_t *h, spn_msg_t *msg) {
  (void)h;
  SPN_ASSERT(msg);
  msg->env.flags |= SPN_MSG_SKIP;
}

uint64_t spn_harness_msg_id(const spn_harness_t *h, const spn_msg_t *msg) {
  (void)h;
  return msg ? msg->harness_id : 0;
}

int32_t spn_harness_buffer_refs(const spn_harness_t *h, const spn_buffer_t *buf) {
  (void)h;
  return buf ? atomic_load(&buf->refs) : 0;
}

int32_t spn_harness_job_fail(spn_harness_t *h, uint64_t job_id, int32_t status, const char *msg, spn_error_t *err) {
  if (!h)
    return spn_error_set(err, SPN_EINVAL, "harness: job_fail: NULL harness");
  if (status >= 0)
    return spn_error_set(err, SPN_EINVAL, "harness: job_fail: status %d is not an error", (int)status);
  if (!h->n_in)
    return spn_error_set(err, SPN_EUNSUPPORTED, "harness: job_fail: kind has no input (its feeders fail the job)");
  hjob_t *j = job_get(h, job_id, err);
  if (!j)
    return err ? err->code : SPN_ENOMEM;
  char *copy = strdup(msg ? msg : spn_strerror(status));
  if (!copy)
    return spn_error_set(err, SPN_ENOMEM, "harness: out of memory");
  free(j->fail_msg);
  j->fail_msg = copy;
  j->fail_status = status;
  return SPN_OK;
}

bool spn_harness_job_progress(const spn_harness_t *h, uint64_t job_id, int64_t *done, int64_t *total) {
  const hjob_t *j = h ? find_job(h, job_id) : NULL;
  if (!j || !j->reported)
    return false;
  if (done)
    *done = j->prog_done;
  if (total)
    *total = j->prog_total;
  return true;
}

int32_t spn_harness_job_transfers(const spn_harness_t *h, uint64_t job_id, spn_transfer_stats_t *out,
                                  spn_error_t *err) {
  const hjob_t *j = h ? find_job(h, job_id) : NULL;
  if (!out)
    return spn_error_set(err, SPN_EINVAL, "harness: job_transfers: NULL out");
  if (!j || !j->ran)
    return spn_error_set(err, SPN_ENOENT, "harness: job %" PRIu64 " did not run", job_id);
  *out = j->xfer;
  return SPN_OK;
}

int32_t spn_harness_stage_transfers(const spn_harness_t *h, spn_transfer_stats_t *out, spn_error_t *err) {
  if (!h || !out)
    return spn_error_set(err, SPN_EINVAL, "harness: stage_transfers: NULL harness or out");
  return spn_pipeline_stage_transfers(h->pipe, h->x->index, out) ? SPN_OK
                                                                  : spn_error_set(err, SPN_EINVAL, "harness: no stage");
}
