/* test-runtime-flow.c — data flow semantics of the back end:
 * fan-out to four emulated devices and back in order, SKIP, bounded edges
 * under a slow sink and over a million frames, cross-job batching with
 * max_delay, failure of one job, cancel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rt-kinds.h"

static spn_pipeline_t *build(spn_runtime_t *rt, rt_spec_t *b) {
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__pipeline_new_from_spec(rt, &b->spec, false, &pipe, &err) != SPN_OK)
    fail_msg("pipeline: %s", err.msg);
  return pipe;
}

static spn_job_t *start(spn_pipeline_t *pipe, uint64_t id, rt_done_t *d) {
  spn_job_callbacks_t cb = rt_callbacks(d);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = id;
  spn_job_t *job = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_job_start(pipe, &p, &cb, &job, &err) != SPN_OK)
    fail_msg("job start: %s", err.msg);
  return job;
}

/* src (CPU pool) -> pass on every one of 4 emulated devices x instances,
 * with random per-frame delays so frames overtake each other -> sink. */
static void fanout(int instances, int64_t skip_every) {
  spn_runtime_t *rt = rt_new("cpu:4", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "fanout");
  b.spec.placement = SPN__PLACE_FANOUT; /* one job's frames spread over the devices */
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 3000;
  src->with_tensor = true;
  src->col = &col;
  rt_cfg_t *pass = rt_spec_stage(&b, "pass", &rt_kind_pass, h);
  pass->delay_us_max = 300;
  pass->col = &col;
  pass->skip_every = skip_every;
  b.stages[1].instances = (uint32_t)instances;
  b.stages[1].instance_devices = (char *)"all";
  b.stages[1].edge_capacity = 8;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[2].edge_capacity = 8;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = build(rt, &b);
  assert_int_equal(spn__pipeline_replicas(pipe, 1), 4 * (uint32_t)instances);

  rt_done_t d[2];
  spn_job_t *jobs[2] = {start(pipe, 1, &d[0]), start(pipe, 2, &d[1])};
  for (int i = 0; i < 2; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_job_wait(jobs[i], &err), SPN_OK);
    assert_int_equal(atomic_load(&d[i].calls), 1);
    /* Progress counts SKIPs too: every seq of the job is accounted for. */
    assert_int_equal(atomic_load(&d[i].last_progress), 3000);
    char why[256] = "";
    if (!rt_col_check_skip(&col, (uint64_t)i + 1, 3000, skip_every, why, sizeof why))
      fail_msg("%s", why);
    spn_job_free(&jobs[i]);
  }
  assert_int_equal(atomic_load(&col.tensor_bad), 0);
  /* Every replica saw both jobs (EOS reaches all of them). */
  assert_int_equal(atomic_load(&col.opens), 2 * (1 + 4 * instances + 1));
  assert_int_equal(atomic_load(&col.closes_ok), 2 * (1 + 4 * instances + 1));
  /* Work really spread over the replicas and came back re-ordered: frames
   * were processed by several threads with random delays. */
  assert_true(spn__pipeline_reordered(pipe, 2) > 0);
  /* The source is on the CPU pool: its frames spread over the devices. */
  pthread_mutex_lock(&col.mu);
  for (uint64_t j = 1; j <= 2; j++)
    assert_true(__builtin_popcount(rt_col_job(&col, j)->dev_mask) > 1);
  pthread_mutex_unlock(&col.mu);
  uint32_t cap = 0;
  assert_true(spn__pipeline_max_in_flight(pipe, 2, &cap) <= cap);
  assert_true(spn__pipeline_max_in_flight(pipe, 1, &cap) <= cap);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

static void test_fanout_4_devices(void **st) {
  (void)st;
  fanout(1, 0);
}

static void test_fanout_8_replicas(void **st) {
  (void)st;
  fanout(2, 0);
}

static void test_fanout_skip(void **st) {
  (void)st;
  fanout(1, 7);
}

/* The sink is slower than the source: the edge fills to its bound and no
 * further, and the source is held back (not the frames dropped). */
static void test_slow_sink_bounded(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "slow");
  rt_spec_stage(&b, "src", &rt_kind_src, h)->count = 400;
  rt_cfg_t *sink = rt_spec_stage(&b, "sink", &rt_kind_sink, h);
  sink->col = &col;
  sink->delay_us_max = 500;
  b.stages[1].edge_capacity = 4;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = build(rt, &b);
  rt_done_t d;
  spn_job_t *job = start(pipe, 9, &d);
  assert_int_equal(spn_job_wait(job, NULL), SPN_OK);
  char why[256] = "";
  if (!rt_col_check(&col, 9, 400, why, sizeof why))
    fail_msg("%s", why);
  uint32_t cap = 0;
  int64_t mx = spn__pipeline_max_in_flight(pipe, 1, &cap);
  assert_int_equal(cap, 4);
  assert_int_equal(mx, 4); /* filled to the bound, never past it */
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* A million frames through a bounded edge: the bound holds throughout. */
static void test_million_bounded(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "million");
  rt_spec_stage(&b, "src", &rt_kind_src, h)->count = 1000000;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[1].edge_capacity = 32;
  b.stages[1].max_batch = 8;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = build(rt, &b);
  rt_done_t d;
  spn_job_t *job = start(pipe, 1, &d);
  assert_int_equal(spn_job_wait(job, NULL), SPN_OK);
  assert_int_equal(atomic_load(&col.processed), 1000000);
  char why[256] = "";
  if (!rt_col_check(&col, 1, 1000000, why, sizeof why))
    fail_msg("%s", why);
  uint32_t cap = 0;
  int64_t mx = spn__pipeline_max_in_flight(pipe, 1, &cap);
  assert_int_equal(cap, 32);
  assert_true(mx >= 1);
  assert_true(mx <= 32);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* Two jobs' frames arrive within max_delay: one process call gets both. */
static void test_cross_job_batching(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "batch");
  rt_spec_stage(&b, "src", &rt_kind_src, h)->count = 3;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[1].max_batch = 16;
  b.stages[1].max_delay_ms = 200;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = build(rt, &b);
  rt_done_t d[2];
  spn_job_t *j1 = start(pipe, 1, &d[0]), *j2 = start(pipe, 2, &d[1]);
  assert_int_equal(spn_job_wait(j1, NULL), SPN_OK);
  assert_int_equal(spn_job_wait(j2, NULL), SPN_OK);
  char why[256] = "";
  for (uint64_t j = 1; j <= 2; j++)
    if (!rt_col_check(&col, j, 3, why, sizeof why))
      fail_msg("%s", why);
  /* 6 frames, under max_batch, all within the delay: one call, both jobs. */
  assert_int_equal(col.calls, 1);
  assert_int_equal(col.max_batch, 6);
  assert_int_equal(col.mixed_batches, 1);
  spn_job_free(&j1);
  spn_job_free(&j2);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* A lone frame waits max_delay_ms for company, and not much longer. */
static void test_max_delay(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "delay");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 2;
  src->gap_us = 400000; /* the second frame comes long after the delay */
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[1].max_batch = 8;
  b.stages[1].max_delay_ms = 80;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = build(rt, &b);
  rt_done_t d;
  uint64_t t0 = rt_now_ns();
  spn_job_t *job = start(pipe, 1, &d);
  assert_int_equal(spn_job_wait(job, NULL), SPN_OK);
  double waited_ms = (double)(atomic_load(&col.first_call_ns) - t0) / 1e6;
  assert_true(waited_ms >= 79.0);
  assert_true(waited_ms < 300.0);
  /* The second frame was alone too, and EOS then ended the job: 2 calls. */
  assert_int_equal(col.calls, 2);
  assert_int_equal(col.max_batch, 1);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* A stage fails one job: that job ends with the stage's message, every
 * instance closes it with ok=false, and the other job completes. */
static void failing(int32_t status_from_process) {
  spn_runtime_t *rt = rt_new("cpu:2", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "fail");
  rt_spec_stage(&b, "src", &rt_kind_src, h)->count = 2000;
  b.cfgs[0].col = &col;
  rt_cfg_t *pass = rt_spec_stage(&b, "decode", &rt_kind_pass, h);
  pass->col = &col;
  pass->fail_job = 11;
  pass->fail_seq = 500;
  pass->fail_status = status_from_process;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = build(rt, &b);
  rt_done_t d1, d2;
  spn_job_t *bad = start(pipe, 11, &d1), *good = start(pipe, 12, &d2);
  spn_error_t err = SPN_ERROR_INIT;
  int32_t want = status_from_process ? status_from_process : SPN_EMEDIA;
  assert_int_equal(spn_job_wait(bad, &err), want);
  assert_non_null(strstr(err.msg, "stage \"decode\""));
  assert_non_null(strstr(err.msg, "corrupt"));
  assert_int_equal(spn_job_wait(good, NULL), SPN_OK);
  assert_int_equal(atomic_load(&d1.calls), 1);
  assert_int_equal(atomic_load(&d1.status), want);
  assert_int_equal(atomic_load(&d2.calls), 1);
  char why[256] = "";
  if (!rt_col_check(&col, 12, 2000, why, sizeof why))
    fail_msg("%s", why);
  pthread_mutex_lock(&col.mu);
  rt_job_rec_t *r = rt_col_job(&col, 11);
  assert_true(r->n <= 500);     /* nothing at or after the bad frame arrived */
  assert_int_equal(r->flushes, 0); /* and the failed job was never flushed */
  pthread_mutex_unlock(&col.mu);
  /* Job 12 closed ok on all three instances; every instance that opened job
   * 11 (lazily, on its first message) closed it with ok=false. */
  assert_int_equal(atomic_load(&col.closes_ok), 3);
  assert_int_equal(atomic_load(&col.opens), 3 + atomic_load(&col.closes_fail));
  assert_true(atomic_load(&col.closes_fail) >= 2);
  spn_job_free(&bad);
  spn_job_free(&good);
  /* The pipeline still runs jobs. */
  rt_done_t d3;
  spn_job_t *again = start(pipe, 13, &d3);
  assert_int_equal(spn_job_wait(again, NULL), SPN_OK);
  spn_job_free(&again);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

static void test_fail_job_call(void **st) {
  (void)st;
  failing(0);
}

static void test_fail_process_status(void **st) {
  (void)st;
  failing(SPN_EMEDIA);
}

static void test_cancel(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "cancel");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 1000000;
  src->gap_us = 1000;
  src->col = &col;
  rt_spec_stage(&b, "pass", &rt_kind_pass, h)->col = &col;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = build(rt, &b);
  rt_done_t d;
  spn_job_t *job = start(pipe, 5, &d);
  while (atomic_load(&col.processed) < 20)
    usleep(1000);
  spn_job_cancel(job);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_job_wait(job, &err), SPN_ECANCELLED);
  assert_non_null(strstr(err.msg, "cancelled"));
  assert_int_equal(atomic_load(&d.calls), 1);
  assert_int_equal(atomic_load(&col.closes_fail), 3);
  assert_int_equal(atomic_load(&col.closes_ok), 0);
  long long at_cancel = atomic_load(&col.processed);
  usleep(20000);
  assert_int_equal(atomic_load(&col.processed), at_cancel); /* nothing runs for it any more */
  spn_job_cancel(job); /* after the end: harmless */
  spn_job_free(&job);
  /* Cancel before the job ever ran: still exactly one on_done. */
  src->gap_us = 0;
  rt_done_t d2;
  spn_job_t *j2 = start(pipe, 6, &d2);
  spn_job_cancel(j2);
  int32_t st2 = spn_job_wait(j2, NULL);
  assert_true(st2 == SPN_ECANCELLED || st2 == SPN_OK);
  assert_int_equal(atomic_load(&d2.calls), 1);
  spn_job_free(&j2);
  /* Freeing a pipeline with a running job cancels it. */
  rt_done_t d3;
  spn_job_t *j3 = start(pipe, 7, &d3);
  spn_pipeline_free(&pipe);
  assert_int_equal(atomic_load(&d3.calls), 1);
  spn_job_free(&j3);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* A source serves the higher-priority job first. */
static void test_priority(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "prio");
  rt_spec_stage(&b, "src", &rt_kind_src, h)->count = 500;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[1].edge_capacity = 4;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = build(rt, &b);
  spn_job_t *jobs[3];
  rt_done_t d[3];
  int32_t prio[3] = {0, 10, 0};
  for (int i = 0; i < 3; i++) {
    spn_job_callbacks_t cb = rt_callbacks(&d[i]);
    spn_job_params_t p = SPN_JOB_PARAMS_INIT;
    p.job_id = 21 + (uint64_t)i;
    p.priority = prio[i];
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_job_start(pipe, &p, &cb, &jobs[i], &err), SPN_OK);
  }
  for (int i = 0; i < 3; i++)
    assert_int_equal(spn_job_wait(jobs[i], NULL), SPN_OK);
  char why[256] = "";
  for (uint64_t j = 21; j <= 23; j++)
    if (!rt_col_check(&col, j, 500, why, sizeof why))
      fail_msg("%s", why);
  pthread_mutex_lock(&col.mu);
  rt_job_rec_t *hi = rt_col_job(&col, 22), *lo2 = rt_col_job(&col, 23);
  /* Job 21 may have run alone for a while; once 22 is there it has the
   * source to itself: nothing of 23 (started after 22, same priority as 21)
   * arrives before the last frame of 22. */
  assert_true(lo2->first_idx > hi->last_idx);
  pthread_mutex_unlock(&col.mu);
  for (int i = 0; i < 3; i++)
    spn_job_free(&jobs[i]);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* A replicated source: each job is generated by exactly one replica (no
 * duplicates), the others only end it; jobs spread over the replicas. */
static void test_replicated_source(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu:2", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "src2");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 700;
  src->col = &col;
  b.stages[0].instance_devices = (char *)"all";
  rt_spec_stage(&b, "pass", &rt_kind_pass, h)->col = &col;
  b.stages[1].instance_devices = (char *)"all";
  b.stages[1].instances = 2;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = build(rt, &b);
  assert_int_equal(spn__pipeline_replicas(pipe, 0), 2);
  assert_int_equal(spn__pipeline_replicas(pipe, 1), 4);
  spn_job_t *jobs[4];
  rt_done_t d[4];
  for (int i = 0; i < 4; i++)
    jobs[i] = start(pipe, 60 + (uint64_t)i, &d[i]);
  char why[256] = "";
  for (int i = 0; i < 4; i++) {
    assert_int_equal(spn_job_wait(jobs[i], NULL), SPN_OK);
    if (!rt_col_check(&col, 60 + (uint64_t)i, 700, why, sizeof why))
      fail_msg("%s", why);
    spn_job_free(&jobs[i]);
  }
  /* Each job opened and closed on its source replica, the sink, and the
   * pass replicas of its device that got any of its frames: one or both
   * (emit's round-robin runs over every job a source interleaves, so two
   * jobs alternating frame by frame can each stay on one replica). Chain
   * per device keeps each job on the device of the source replica that
   * generated it (below). */
  int opens = atomic_load(&col.opens);
  assert_in_range(opens, 12, 16);
  assert_int_equal(atomic_load(&col.closes_ok), opens);
  pthread_mutex_lock(&col.mu);
  for (uint64_t j = 60; j < 64; j++)
    assert_int_equal(rt_col_job(&col, j)->dev_mask, 1u << (j % 2));
  pthread_mutex_unlock(&col.mu);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* One output feeding two stages: each gets every frame (a shallow copy that
 * shares the tensor's buffer), in order; progress counts a frame once it is
 * done at both sinks, so it ends at the job's total, not twice that. */
static void test_broadcast_two_sinks(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t c1, c2;
  rt_col_init(&c1);
  rt_col_init(&c2);
  rt_spec_t b;
  rt_spec_init(&b, "tee");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 300;
  src->with_tensor = true;
  rt_spec_stage(&b, "a", &rt_kind_sink, h)->col = &c1;
  rt_cfg_t *slow = rt_spec_stage(&b, "b", &rt_kind_sink, h);
  slow->col = &c2;
  slow->delay_us_max = 200;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 0, 2);
  spn_pipeline_t *pipe = build(rt, &b);
  rt_done_t d;
  spn_job_t *job = start(pipe, 3, &d);
  assert_int_equal(spn_job_wait(job, NULL), SPN_OK);
  char why[256] = "";
  if (!rt_col_check(&c1, 3, 300, why, sizeof why) || !rt_col_check(&c2, 3, 300, why, sizeof why))
    fail_msg("%s", why);
  assert_int_equal(atomic_load(&c1.tensor_bad) + atomic_load(&c2.tensor_bad), 0);
  assert_int_equal(atomic_load(&d.last_progress), 300);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&c1);
  rt_col_free(&c2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fanout_4_devices),
      cmocka_unit_test(test_fanout_8_replicas),
      cmocka_unit_test(test_fanout_skip),
      cmocka_unit_test(test_slow_sink_bounded),
      cmocka_unit_test(test_million_bounded),
      cmocka_unit_test(test_cross_job_batching),
      cmocka_unit_test(test_max_delay),
      cmocka_unit_test(test_fail_job_call),
      cmocka_unit_test(test_fail_process_status),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_priority),
      cmocka_unit_test(test_replicated_source),
      cmocka_unit_test(test_broadcast_two_sinks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
