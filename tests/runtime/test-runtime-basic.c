/* test-runtime-basic.c — end to end through inproc ZeroMQ edges:
 * source -> passthrough -> sink, two concurrent jobs, EOS, on_done, progress,
 * job_open/job_close on every instance; the device layer; messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rt-kinds.h"
#include "spindle/device.h"

static spn_runtime_t *new_rt(const char *devices) {
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = devices;
  o.log_level = SPN_LOG_WARN;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_runtime_new(&o, &rt, &err);
  if (rc != SPN_OK)
    fail_msg("spn_runtime_new: %s", err.msg);
  return rt;
}

static void test_chain_two_jobs(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu");
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "chain");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 5000;
  src->with_tensor = true;
  src->col = &col;
  rt_spec_stage(&b, "pass", &rt_kind_pass, h)->col = &col;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[2].edge_capacity = 16;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err), SPN_OK);
  assert_string_equal(spn_pipeline_name(pipe), "chain");

  rt_done_t d[2];
  spn_job_t *jobs[2];
  for (int i = 0; i < 2; i++) {
    spn_job_callbacks_t cb = rt_callbacks(&d[i]);
    spn_job_params_t p = SPN_JOB_PARAMS_INIT;
    p.job_id = 100 + (uint64_t)i;
    assert_int_equal(spn_job_start(pipe, &p, &cb, &jobs[i], &err), SPN_OK);
  }
  for (int i = 0; i < 2; i++) {
    assert_int_equal(spn_job_wait(jobs[i], &err), SPN_OK);
    assert_int_equal(atomic_load(&d[i].calls), 1);
    assert_int_equal(atomic_load(&d[i].status), SPN_OK);
    assert_int_equal(atomic_load(&d[i].last_progress), 5000);
    char why[256] = "";
    if (!rt_col_check(&col, 100 + (uint64_t)i, 5000, why, sizeof why))
      fail_msg("%s", why);
    spn_job_free(&jobs[i]);
  }
  assert_int_equal(atomic_load(&col.tensor_bad), 0);
  /* Three instances opened and closed (ok) each job. */
  assert_int_equal(atomic_load(&col.opens), 6);
  assert_int_equal(atomic_load(&col.closes_ok), 6);
  assert_int_equal(atomic_load(&col.closes_fail), 0);
  uint32_t cap = 0;
  int64_t mx = spn__pipeline_max_in_flight(pipe, 2, &cap);
  assert_int_equal(cap, 16);
  assert_true(mx >= 1 && mx <= 16);
  spn_pipeline_free(&pipe);
  assert_null(pipe);
  /* A duplicate job id is refused while the first runs; after, it is free. */
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

static void test_job_id_in_use(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu");
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "dup");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 200;
  src->gap_us = 1000; /* long enough that the first job is still running */
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err), SPN_OK);
  rt_done_t d1, d2;
  spn_job_callbacks_t cb1 = rt_callbacks(&d1), cb2 = rt_callbacks(&d2);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = 7;
  spn_job_t *j1 = NULL, *j2 = NULL;
  assert_int_equal(spn_job_start(pipe, &p, &cb1, &j1, &err), SPN_OK);
  assert_int_equal(spn_job_start(pipe, &p, &cb2, &j2, &err), SPN_EEXIST);
  assert_non_null(strstr(err.msg, "job id 7"));
  assert_int_equal(spn_job_wait(j1, &err), SPN_OK);
  assert_int_equal(atomic_load(&d2.calls), 0); /* refused start: on_done never called */
  assert_int_equal(spn_job_id(j1), 7);
  spn_job_free(&j1);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

static void test_devices(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu:4");
  assert_int_equal(spn_runtime_device_count(rt), 4);
  assert_string_equal(spn_runtime_device_name(rt, 3), "cpu:3");
  assert_null(spn_runtime_device_name(rt, 4));
  spn_runtime_free(&rt);

  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  spn_error_t err = SPN_ERROR_INIT;
  o.devices = "cpu:0";
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "cpu:0"));
  o.devices = "tpu";
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "tpu"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chain_two_jobs),
      cmocka_unit_test(test_job_id_in_use),
      cmocka_unit_test(test_devices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
