/* test-runtime-devices.c — many devices: placements, quarantine, device time.
 *
 * Emulated devices (cpu:4) stand in for GPUs, so this runs in CI:
 *   - batch fan-out with forced re-ordering: the replica on device 0 is slow,
 *     so later frames overtake earlier ones on their way to the sink, which
 *     must still see every seq once, in order;
 *   - chain placement keeps each job on one device, spreading jobs;
 *   - quarantine: the fake libnvidia-ml reports a fatal XID for one emulated
 *     device (mapped to it through spn__runtime_watch_health); its work moves
 *     to the others and the jobs finish complete (a restarted attempt), no
 *     frame is processed there afterwards, a harmless XID changes nothing,
 *     and with every device drained a job fails instead of looping;
 *   - device-seconds: a job's time on devices is summed, CPU stages are not;
 *   - threads on a device: two stages on one device each have their own
 *     thread (a stage that waits does not hold the other), or share the
 *     device's with SPINDLE_DEVICE_THREADS=device; a bad value is refused.
 */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rt-kinds.h"

#define DV_DEVS 4

/* What the work and sink stages record: per device frames processed, and
 * per job the seqs the sink saw in its latest attempt. */
typedef struct dv_col {
  pthread_mutex_t mu;
  atomic_llong per_dev[DV_DEVS];
  uint64_t jobs[RT_MAX_JOBS];
  uint64_t *seqs[RT_MAX_JOBS];
  size_t n[RT_MAX_JOBS], cap[RT_MAX_JOBS];
  uint32_t dev_mask[RT_MAX_JOBS]; /* devices that processed frames of the job's latest attempt */
  int attempts[RT_MAX_JOBS];      /* sink job_open calls */
  int closes_fail[RT_MAX_JOBS];
  size_t n_jobs;
} dv_col_t;

typedef struct dv_cfg {
  const spn_host_api_t *host;
  dv_col_t *col;
  int32_t delay_us[DV_DEVS]; /* work: per frame, by device index */
} dv_cfg_t;

static size_t dv_job(dv_col_t *c, uint64_t job) {
  for (size_t i = 0; i < c->n_jobs; i++)
    if (c->jobs[i] == job)
      return i;
  if (c->n_jobs == RT_MAX_JOBS)
    abort();
  c->jobs[c->n_jobs] = job;
  return c->n_jobs++;
}

static int32_t dv_create(spn_stage_t *s, const void *config, void **state, spn_error_t *err) {
  (void)s;
  (void)err;
  dv_cfg_t *c = malloc(sizeof *c);
  if (!c)
    return SPN_ENOMEM;
  *c = *(const dv_cfg_t *)config;
  *state = c;
  return SPN_OK;
}

static void dv_destroy(spn_stage_t *s, void *state) {
  (void)s;
  free(state);
}

static int32_t dv_work_process(spn_stage_t *s, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                               spn_error_t *err) {
  (void)job_states;
  dv_cfg_t *c = state;
  int32_t kind = -1, idx = -1;
  c->host->stage_get_device(s, &kind, &idx);
  if (idx < 0 || idx >= DV_DEVS)
    abort();
  for (size_t i = 0; i < n; i++) {
    if (c->delay_us[idx])
      usleep((useconds_t)c->delay_us[idx]);
    uint64_t job = c->host->msg_envelope(msgs[i])->job_id;
    pthread_mutex_lock(&c->col->mu);
    c->col->dev_mask[dv_job(c->col, job)] |= 1u << idx;
    pthread_mutex_unlock(&c->col->mu);
    atomic_fetch_add(&c->col->per_dev[idx], 1);
    int32_t rc = c->host->emit(s, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

/* A new attempt of a job starts its record afresh. */
static int32_t dv_sink_open(spn_stage_t *s, void *state, const spn_job_info_t *job, void **job_state,
                            spn_error_t *err) {
  (void)s;
  (void)err;
  (void)job_state;
  dv_cfg_t *c = state;
  pthread_mutex_lock(&c->col->mu);
  size_t j = dv_job(c->col, job->job_id);
  c->col->n[j] = 0;
  c->col->attempts[j]++;
  pthread_mutex_unlock(&c->col->mu);
  return SPN_OK;
}

static void dv_sink_close(spn_stage_t *s, void *state, void *job_state, bool ok) {
  (void)s;
  (void)job_state;
  dv_cfg_t *c = state;
  (void)c;
  (void)ok;
}

static int32_t dv_sink_process(spn_stage_t *s, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                               spn_error_t *err) {
  (void)s;
  (void)job_states;
  (void)err;
  dv_cfg_t *c = state;
  pthread_mutex_lock(&c->col->mu);
  for (size_t i = 0; i < n; i++) {
    const spn_envelope_t *env = c->host->msg_envelope(msgs[i]);
    size_t j = dv_job(c->col, env->job_id);
    if (c->col->n[j] == c->col->cap[j]) {
      c->col->cap[j] = c->col->cap[j] ? c->col->cap[j] * 2 : 1024;
      c->col->seqs[j] = realloc(c->col->seqs[j], c->col->cap[j] * sizeof *c->col->seqs[j]);
      if (!c->col->seqs[j])
        abort();
    }
    c->col->seqs[j][c->col->n[j]++] = env->seq;
  }
  pthread_mutex_unlock(&c->col->mu);
  return SPN_OK;
}

static const spn_port_t dv_port[] = {{"out", "any"}};

static const spn_stage_kind_t dv_kind_work = {
    .struct_size = sizeof(spn_stage_kind_t), .name = "dv_work", .config_size = sizeof(dv_cfg_t),
    .inputs = dv_port, .n_inputs = 1, .n_outputs = 1, .outputs = dv_port, .device_need = SPN_NEED_EITHER,
    .max_batch = 1, .create = dv_create, .process = dv_work_process, .destroy = dv_destroy};

static const spn_stage_kind_t dv_kind_sink = {
    .struct_size = sizeof(spn_stage_kind_t), .name = "dv_sink", .config_size = sizeof(dv_cfg_t),
    .inputs = dv_port, .n_inputs = 1, .device_need = SPN_NEED_CPU, .max_batch = 1, .create = dv_create,
    .job_open = dv_sink_open, .process = dv_sink_process, .job_close = dv_sink_close, .destroy = dv_destroy};

/* src (CPU pool) -> work (instances on every device) -> sink (CPU pool). */
typedef struct dv_world {
  rt_spec_t b;
  dv_cfg_t work_cfg, sink_cfg;
  dv_col_t col;
  spn_pipeline_t *pipe;
} dv_world_t;

static void dv_build_ep(dv_world_t *w, spn_runtime_t *rt, int32_t placement, int64_t frames, int64_t gap_us,
                        const int32_t delay_us[DV_DEVS], const char *sink_endpoint) {
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  memset(&w->col, 0, sizeof w->col);
  pthread_mutex_init(&w->col.mu, NULL);
  rt_spec_init(&w->b, "devices");
  w->b.spec.placement = placement;
  rt_cfg_t *src = rt_spec_stage(&w->b, "src", &rt_kind_src, h);
  src->count = frames;
  src->gap_us = gap_us;
  rt_spec_stage(&w->b, "work", &rt_kind_pass, h); /* kind replaced below */
  w->b.stages[1].kind = &dv_kind_work;
  w->b.stages[1].instance_devices = (char *)"all";
  w->b.stages[1].edge_capacity = 8;
  w->work_cfg = (dv_cfg_t){.host = h, .col = &w->col};
  for (int i = 0; i < DV_DEVS; i++)
    w->work_cfg.delay_us[i] = delay_us ? delay_us[i] : 0;
  w->b.stages[1].config = &w->work_cfg;
  rt_spec_stage(&w->b, "sink", &rt_kind_sink, h);
  w->b.stages[2].kind = &dv_kind_sink;
  w->sink_cfg = (dv_cfg_t){.host = h, .col = &w->col};
  w->b.stages[2].config = &w->sink_cfg;
  w->b.stages[2].endpoint = (char *)sink_endpoint;
  rt_spec_edge(&w->b, 0, 1);
  rt_spec_edge(&w->b, 1, 2);
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__pipeline_new_from_spec(rt, &w->b.spec, false, &w->pipe, &err) != SPN_OK)
    fail_msg("pipeline: %s", err.msg);
  assert_int_equal(spn__pipeline_replicas(w->pipe, 1), DV_DEVS);
}

static void dv_build(dv_world_t *w, spn_runtime_t *rt, int32_t placement, int64_t frames, int64_t gap_us,
                     const int32_t delay_us[DV_DEVS]) {
  dv_build_ep(w, rt, placement, frames, gap_us, delay_us, NULL);
}

static void dv_free(dv_world_t *w) {
  spn_pipeline_free(&w->pipe);
  for (int i = 0; i < RT_MAX_JOBS; i++)
    free(w->col.seqs[i]);
  pthread_mutex_destroy(&w->col.mu);
}

static spn_job_t *dv_start(dv_world_t *w, uint64_t id, rt_done_t *d) {
  spn_job_callbacks_t cb = rt_callbacks(d);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = id;
  spn_job_t *job = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_job_start(w->pipe, &p, &cb, &job, &err) != SPN_OK)
    fail_msg("job %llu: %s", (unsigned long long)id, err.msg);
  return job;
}

/* The sink saw exactly 0..n-1, in order, in the job's latest attempt. */
static void dv_check_seqs(dv_world_t *w, uint64_t job, int64_t n) {
  pthread_mutex_lock(&w->col.mu);
  size_t j = dv_job(&w->col, job);
  size_t got = w->col.n[j];
  int64_t bad = -1;
  for (size_t i = 0; i < got && bad < 0; i++)
    if (w->col.seqs[j][i] != i)
      bad = (int64_t)i;
  uint64_t bad_seq = bad >= 0 ? w->col.seqs[j][bad] : 0;
  pthread_mutex_unlock(&w->col.mu);
  if ((int64_t)got != n)
    fail_msg("job %llu: the sink got %zu frames, expected %lld", (unsigned long long)job, got, (long long)n);
  if (bad >= 0)
    fail_msg("job %llu: frame %lld at the sink has seq %llu", (unsigned long long)job, (long long)bad,
             (unsigned long long)bad_seq);
}

static uint32_t dv_mask(dv_world_t *w, uint64_t job) {
  pthread_mutex_lock(&w->col.mu);
  uint32_t m = w->col.dev_mask[dv_job(&w->col, job)];
  pthread_mutex_unlock(&w->col.mu);
  return m;
}

/* ---- placements ---------------------------------------------------------------------- */

static void test_fanout_reorders_overtaken_frames(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu:4", 2);
  dv_world_t w;
  /* Device 0 is slow: the frames it gets are overtaken by later ones. */
  const int32_t delay[DV_DEVS] = {3000, 0, 0, 0};
  dv_build(&w, rt, SPN__PLACE_FANOUT, 300, 0, delay);
  rt_done_t d;
  spn_job_t *job = dv_start(&w, 7, &d);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_job_wait(job, &err), SPN_OK);
  dv_check_seqs(&w, 7, 300);
  /* One job's frames went to every device... */
  assert_int_equal(dv_mask(&w, 7), 0xf);
  for (int i = 0; i < DV_DEVS; i++)
    assert_true(atomic_load(&w.col.per_dev[i]) > 0);
  /* ...and arrived out of order: the sink put them back. */
  assert_true(spn__pipeline_reordered(w.pipe, 2) > 0);
  assert_int_equal(spn_job_restarts(job), 0);
  spn_job_free(&job);
  dv_free(&w);
  spn_runtime_free(&rt);
}

static void test_chain_keeps_a_job_on_one_device(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu:4", 2);
  dv_world_t w;
  dv_build(&w, rt, SPN__PLACE_CHAIN, 200, 0, NULL);
  rt_done_t d[4];
  spn_job_t *jobs[4];
  for (int i = 0; i < 4; i++)
    jobs[i] = dv_start(&w, 10 + (uint64_t)i, &d[i]);
  uint32_t all = 0;
  for (int i = 0; i < 4; i++) {
    assert_int_equal(spn_job_wait(jobs[i], NULL), SPN_OK);
    dv_check_seqs(&w, 10 + (uint64_t)i, 200);
    uint32_t m = dv_mask(&w, 10 + (uint64_t)i);
    if (__builtin_popcount(m) != 1)
      fail_msg("job %d ran on devices 0x%x, expected one", 10 + i, m);
    all |= m;
    spn_job_free(&jobs[i]);
  }
  /* Jobs are spread: consecutive jobs are pinned to different devices. */
  assert_true(__builtin_popcount(all) >= 2);
  dv_free(&w);
  spn_runtime_free(&rt);
}

/* ---- quarantine ------------------------------------------------------------------------ */

typedef struct fake_nvml {
  void *lib;
  void (*push_xid)(int, unsigned long long);
  void (*set_lost)(int);
} fake_nvml_t;

static const char *const dv_bus_ids[DV_DEVS] = {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"};

/* The runtime watches cpu:i as the fake NVML's GPU at bus 0i+1. */
static void watch(spn_runtime_t *rt, fake_nvml_t *f) {
  const char *path = getenv("SPINDLE_FAKE_NVML");
  assert_non_null(path);
  f->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(f->lib);
  f->push_xid = (void (*)(int, unsigned long long))dlsym(f->lib, "fake_nvml_push_xid");
  f->set_lost = (void (*)(int))dlsym(f->lib, "fake_nvml_set_lost");
  void (*reset)(void) = (void (*)(void))dlsym(f->lib, "fake_nvml_reset");
  assert_true(f->push_xid && f->set_lost && reset);
  reset(); /* the library's state outlives the previous test */
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__runtime_watch_health(rt, path, dv_bus_ids, 5, &err) != SPN_OK)
    fail_msg("watch: %s", err.msg);
  /* A second watcher is refused: the poller is never replaced under the loop. */
  assert_int_equal(spn__runtime_watch_health(rt, path, dv_bus_ids, 5, &err), SPN_EEXIST);
}

static void wait_for(bool (*cond)(void *), void *arg, const char *what) {
  for (int i = 0; i < 2000; i++) {
    if (cond(arg))
      return;
    usleep(5000);
  }
  fail_msg("timed out waiting for %s", what);
}

typedef struct sink_at {
  dv_world_t *w;
  uint64_t job;
  size_t n;
} sink_at_t;

static bool sink_reached(void *arg) {
  sink_at_t *s = arg;
  pthread_mutex_lock(&s->w->col.mu);
  bool ok = s->w->col.n[dv_job(&s->w->col, s->job)] >= s->n;
  pthread_mutex_unlock(&s->w->col.mu);
  return ok;
}

static bool dev1_down(void *arg) { return !spn_runtime_device_usable(arg, 1); }

static void quarantine_moves_work(int32_t placement) {
  spn_runtime_t *rt = rt_new("cpu:4", 2);
  fake_nvml_t f;
  watch(rt, &f);
  dv_world_t w;
  /* Slow enough that the XID lands mid-job: 600 frames, 1 ms apart. */
  dv_build(&w, rt, placement, 600, 1000, NULL);
  rt_done_t d[4];
  spn_job_t *jobs[4];
  for (int i = 0; i < 4; i++)
    jobs[i] = dv_start(&w, 20 + (uint64_t)i, &d[i]);
  for (int i = 0; i < 4; i++) {
    sink_at_t at = {&w, 20 + (uint64_t)i, 50};
    wait_for(sink_reached, &at, "the jobs to be under way");
  }
  /* An application fault (XID 31) on cpu:1's GPU: not a reason to drain it. */
  f.push_xid(2, 31);
  usleep(50000);
  assert_true(spn_runtime_device_usable(rt, 1));
  assert_int_equal(spn_runtime_quarantine_count(rt), 0);
  /* Uncontained ECC error (XID 95): cpu:1 is drained. */
  f.push_xid(2, 95);
  wait_for(dev1_down, rt, "cpu:1 to be quarantined");
  assert_int_equal(spn_runtime_usable_device_count(rt), 3);
  assert_int_equal(spn_runtime_quarantine_count(rt), 1);
  /* A process call under way when it happened may still end there. */
  usleep(50000);
  long long on_dev1 = atomic_load(&w.col.per_dev[1]);
  uint32_t restarted = 0;
  for (int i = 0; i < 4; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    if (spn_job_wait(jobs[i], &err) != SPN_OK)
      fail_msg("job %d: %s", 20 + i, err.msg);
    /* Nothing lost, nothing twice: the final attempt is complete. */
    dv_check_seqs(&w, 20 + (uint64_t)i, 600);
    restarted += spn_job_restarts(jobs[i]);
    spn_job_free(&jobs[i]);
  }
  /* Fan-out spreads every job over every device: all four ran on cpu:1 and
   * restarted; chain pins one job in four there. */
  if (placement == SPN__PLACE_FANOUT)
    assert_int_equal(restarted, 4);
  else
    assert_true(restarted >= 1);
  assert_int_equal(spn_runtime_job_restart_count(rt), restarted);
  /* No frame was processed on the drained device afterwards. */
  assert_int_equal(atomic_load(&w.col.per_dev[1]), on_dev1);

  /* A job started now never goes there. */
  rt_done_t d2;
  spn_job_t *late = dv_start(&w, 30, &d2);
  assert_int_equal(spn_job_wait(late, NULL), SPN_OK);
  dv_check_seqs(&w, 30, 600);
  assert_false(dv_mask(&w, 30) & 2u);
  assert_int_equal(spn_job_restarts(late), 0);
  assert_int_equal(atomic_load(&w.col.per_dev[1]), on_dev1);
  spn_job_free(&late);

  /* cpu:3 falls off the bus; then the operator drains the other two: with
   * nothing usable a job fails with a device error rather than looping. */
  f.set_lost(4);
  for (int i = 0; i < 400 && spn_runtime_device_usable(rt, 3); i++)
    usleep(5000);
  assert_false(spn_runtime_device_usable(rt, 3));
  assert_int_equal(spn_runtime_device_quarantine(rt, 0, "maintenance"), SPN_OK);
  assert_int_equal(spn_runtime_device_quarantine(rt, 2, "maintenance"), SPN_OK);
  assert_int_equal(spn_runtime_device_quarantine(rt, 2, "again"), SPN_OK); /* counted once */
  assert_int_equal(spn_runtime_device_quarantine(rt, 9, "no such"), SPN_EINVAL);
  assert_int_equal(spn_runtime_usable_device_count(rt), 0);
  assert_int_equal(spn_runtime_quarantine_count(rt), 4);
  spn_job_t *none = dv_start(&w, 31, &d2);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_job_wait(none, &err), SPN_EDEVICE);
  assert_non_null(strstr(err.msg, "quarantined"));
  spn_job_free(&none);

  dv_free(&w);
  spn_runtime_free(&rt);
  dlclose(f.lib);
}

static void test_fatal_xid_moves_fanout_work(void **st) {
  (void)st;
  quarantine_moves_work(SPN__PLACE_FANOUT);
}

static void test_fatal_xid_moves_chain_work(void **st) {
  (void)st;
  quarantine_moves_work(SPN__PLACE_CHAIN);
}

/* A serialized edge does not carry the attempt: such a pipeline's job fails
 * with a device error (for the job service to retry) instead of restarting. */
static void test_wire_pipeline_fails_instead_of_restarting(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu:4", 2);
  dv_world_t w;
  char ep[96];
  snprintf(ep, sizeof ep, "ipc://@spindle-test-devices-%d", (int)getpid());
  dv_build_ep(&w, rt, SPN__PLACE_FANOUT, 2000, 1000, NULL, ep);
  rt_done_t d;
  spn_job_t *job = dv_start(&w, 50, &d);
  sink_at_t at = {&w, 50, 20};
  wait_for(sink_reached, &at, "the job to be under way");
  assert_int_equal(spn_runtime_device_quarantine(rt, 1, "test"), SPN_OK);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_job_wait(job, &err), SPN_EDEVICE);
  assert_non_null(strstr(err.msg, "quarantined"));
  assert_int_equal(spn_job_restarts(job), 0);
  assert_int_equal(spn_runtime_job_restart_count(rt), 0);
  spn_job_free(&job);
  dv_free(&w);
  spn_runtime_free(&rt);
}

/* ---- device time ----------------------------------------------------------------------- */

static void test_device_seconds_sum_device_stages(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu:4", 2);
  dv_world_t w;
  const int32_t delay[DV_DEVS] = {2000, 2000, 2000, 2000};
  dv_build(&w, rt, SPN__PLACE_FANOUT, 100, 0, delay);
  rt_done_t d;
  spn_job_t *job = dv_start(&w, 40, &d);
  assert_int_equal(spn_job_wait(job, NULL), SPN_OK);
  /* 100 frames x 2 ms on devices: at least 0.2 s of device time, whatever
   * the parallelism; the CPU-pool source and sink add nothing. */
  double s = spn_job_device_seconds(job);
  if (s < 0.2 || s > 2.0)
    fail_msg("device seconds %.3f, expected about 0.2", s);
  spn_job_free(&job);
  dv_free(&w);
  spn_runtime_free(&rt);

  /* Every stage on the CPU pool: no device time. */
  rt = rt_new("cpu", 2);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_spec_init(&b, "cpu-only");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 50;
  src->col = &col;
  rt_cfg_t *pass = rt_spec_stage(&b, "pass", &rt_kind_pass, h);
  pass->col = &col;
  b.stages[1].device = (char *)"cpu";
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err), SPN_OK);
  spn_job_callbacks_t cb = rt_callbacks(&d);
  assert_int_equal(spn_job_start(pipe, NULL, &cb, &job, &err), SPN_OK);
  assert_int_equal(spn_job_wait(job, NULL), SPN_OK);
  assert_true(spn_job_device_seconds(job) == 0.0);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  rt_col_free(&col);
  spn_runtime_free(&rt);
}

/* ---- threads on a device ----------------------------------------------------------- */

/* Two chains side by side, src -> gate -> sink and src2 -> probe, gate and
 * probe both on cpu:0; src2 sends a frame every 4 ms for 1.2 s. gate,
 * handed its first frame, waits until probe has seen one more frame than
 * when the wait began (or the timeout); which thread each ran on is kept. */
typedef struct th_world {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long probe_seen;
  bool gate_timed_out, gate_waited;
  pthread_t gate_thread, probe_thread;
  int timeout_ms;
} th_world_t;

typedef struct th_cfg {
  const spn_host_api_t *host;
  th_world_t *w;
} th_cfg_t;

static int32_t th_create(spn_stage_t *s, const void *config, void **state, spn_error_t *err) {
  (void)s, (void)err;
  *state = (void *)config; /* the test's, outlives the pipeline */
  return SPN_OK;
}

static int32_t th_gate_process(spn_stage_t *s, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                               spn_error_t *err) {
  (void)job_states;
  th_cfg_t *c = state;
  th_world_t *w = c->w;
  for (size_t i = 0; i < n; i++) {
    uint64_t seq = c->host->msg_envelope(msgs[i])->seq;
    pthread_mutex_lock(&w->mu);
    w->gate_thread = pthread_self();
    if (seq == 0) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_sec += w->timeout_ms / 1000;
      until.tv_nsec += (long)(w->timeout_ms % 1000) * 1000000L;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      w->gate_waited = true;
      long seen = w->probe_seen;
      while (w->probe_seen == seen && !w->gate_timed_out)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT)
          w->gate_timed_out = true;
    }
    pthread_mutex_unlock(&w->mu);
    int32_t rc = c->host->emit(s, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t th_probe_process(spn_stage_t *s, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                                spn_error_t *err) {
  (void)s, (void)msgs, (void)job_states, (void)n, (void)err;
  th_world_t *w = ((th_cfg_t *)state)->w;
  pthread_mutex_lock(&w->mu);
  w->probe_thread = pthread_self();
  w->probe_seen += (long)n;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return SPN_OK;
}

static void th_destroy(spn_stage_t *s, void *state) { (void)s, (void)state; }

static const spn_stage_kind_t th_kind_gate = {
    .struct_size = sizeof(spn_stage_kind_t), .name = "test_gate", .config_size = sizeof(th_cfg_t),
    .inputs = rt_any_port, .n_inputs = 1, .n_outputs = 1, .outputs = rt_any_port,
    .device_need = SPN_NEED_EITHER, .max_batch = 1, .create = th_create, .process = th_gate_process,
    .destroy = th_destroy};
static const spn_stage_kind_t th_kind_probe = {
    .struct_size = sizeof(spn_stage_kind_t), .name = "test_probe", .config_size = sizeof(th_cfg_t),
    .inputs = rt_any_port, .n_inputs = 1,
    .device_need = SPN_NEED_EITHER, .max_batch = 1, .create = th_create, .process = th_probe_process,
    .destroy = th_destroy};

/* src -> gate -> sink (5 frames) and src2 -> probe (300 frames, 4 ms
 * apart); src, src2 and sink on the pool, gate and probe on cpu:0. */
static void th_run(int32_t device_threads, int timeout_ms, th_world_t *w) {
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->timeout_ms = timeout_ms;
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = "cpu:1";
  o.cpu_threads = 2;
  o.log_level = SPN_LOG_ERROR + 1;
  o.device_threads = device_threads;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&o, &rt, &err) != SPN_OK)
    fail_msg("spn_runtime_new: %s", err.msg);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  th_cfg_t gate = {.host = h, .w = w}, probe = {.host = h, .w = w};
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "threads");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->col = &col;
  src->count = 5;
  rt_spec_stage(&b, "gate", &th_kind_gate, h);
  b.stages[1].config = &gate;
  b.stages[1].device = (char *)"cpu:0";
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_cfg_t *src2 = rt_spec_stage(&b, "src2", &rt_kind_src, h);
  src2->count = 300;
  src2->gap_us = 4000;
  rt_spec_stage(&b, "probe", &th_kind_probe, h);
  b.stages[4].config = &probe;
  b.stages[4].device = (char *)"cpu:0";
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  rt_spec_edge(&b, 3, 4);
  spn_pipeline_t *pipe = NULL;
  if (spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err) != SPN_OK)
    fail_msg("pipeline: %s", err.msg);
  rt_done_t d;
  spn_job_callbacks_t cb = rt_callbacks(&d);
  spn_job_t *job = NULL;
  assert_int_equal(spn_job_start(pipe, NULL, &cb, &job, &err), SPN_OK);
  assert_int_equal(spn_job_wait(job, NULL), SPN_OK);
  char why[256] = "";
  if (!rt_col_check(&col, spn_job_id(job), 5, why, sizeof why)) /* every frame, either way */
    fail_msg("%s", why);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  rt_col_free(&col);
  spn_runtime_free(&rt);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}

static void test_stages_on_a_device_have_their_own_threads(void **st) {
  (void)st;
  th_world_t w;
  /* The default: probe runs while gate waits, on another thread. */
  th_run(SPN_DEVICE_THREADS_AUTO, 20000, &w);
  assert_true(w.gate_waited);
  assert_false(w.gate_timed_out);
  assert_false(pthread_equal(w.gate_thread, w.probe_thread));
  /* One thread per device: gate's wait holds probe, which sees no new
   * frame until the wait times out (what the default avoids). */
  th_run(SPN_DEVICE_THREADS_DEVICE, 300, &w);
  assert_true(w.gate_waited);
  assert_true(w.gate_timed_out);
  assert_true(pthread_equal(w.gate_thread, w.probe_thread));
  /* The environment chooses when the options leave it to it. */
  setenv("SPINDLE_DEVICE_THREADS", "device", 1);
  th_run(SPN_DEVICE_THREADS_AUTO, 300, &w);
  assert_true(w.gate_timed_out);
  setenv("SPINDLE_DEVICE_THREADS", "stage", 1);
  th_run(SPN_DEVICE_THREADS_AUTO, 20000, &w);
  assert_false(w.gate_timed_out);
  /* A value it does not know is refused, naming the variable. */
  setenv("SPINDLE_DEVICE_THREADS", "gpu", 1);
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = "cpu:1";
  o.log_level = SPN_LOG_ERROR + 1;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_ECONFIG);
  assert_null(rt);
  assert_non_null(strstr(err.msg, "SPINDLE_DEVICE_THREADS=\"gpu\""));
  unsetenv("SPINDLE_DEVICE_THREADS");
  o.device_threads = 7;
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "device_threads 7"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fanout_reorders_overtaken_frames),
      cmocka_unit_test(test_chain_keeps_a_job_on_one_device),
      cmocka_unit_test(test_fatal_xid_moves_fanout_work),
      cmocka_unit_test(test_fatal_xid_moves_chain_work),
      cmocka_unit_test(test_wire_pipeline_fails_instead_of_restarting),
      cmocka_unit_test(test_device_seconds_sum_device_stages),
      cmocka_unit_test(test_stages_on_a_device_have_their_own_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
