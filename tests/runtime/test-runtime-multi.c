/* test-runtime-multi.c — independence: two pipelines in one runtime and two
 * runtimes in one process run at the same time without seeing each other's
 * jobs, frames, counters or failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rt-kinds.h"

typedef struct world {
  rt_spec_t b;
  rt_col_t col;
  spn_pipeline_t *pipe;
} world_t;

static void world_build(world_t *w, spn_runtime_t *rt, const char *name, int64_t count, bool fail) {
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_init(&w->col);
  rt_spec_init(&w->b, name);
  rt_cfg_t *src = rt_spec_stage(&w->b, "src", &rt_kind_src, h);
  src->count = count;
  src->col = &w->col;
  rt_cfg_t *pass = rt_spec_stage(&w->b, "pass", &rt_kind_pass, h);
  pass->col = &w->col;
  if (fail) {
    pass->fail_job = 1;
    pass->fail_seq = 10;
  }
  rt_spec_stage(&w->b, "sink", &rt_kind_sink, h)->col = &w->col;
  rt_spec_edge(&w->b, 0, 1);
  rt_spec_edge(&w->b, 1, 2);
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__pipeline_new_from_spec(rt, &w->b.spec, false, &w->pipe, &err) != SPN_OK)
    fail_msg("pipeline %s: %s", name, err.msg);
}

static spn_job_t *go(world_t *w, uint64_t id, rt_done_t *d) {
  spn_job_callbacks_t cb = rt_callbacks(d);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = id;
  spn_job_t *job = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_job_start(w->pipe, &p, &cb, &job, &err), SPN_OK);
  return job;
}

static void world_free(world_t *w) {
  spn_pipeline_free(&w->pipe);
  rt_col_free(&w->col);
}

/* Same job id (1) in both worlds: one fails at frame 10, the other, with a
 * different frame count, completes; nothing crosses over. */
static void check_pair(world_t *a, world_t *b) {
  rt_done_t da, db;
  spn_job_t *ja = go(a, 1, &da), *jb = go(b, 1, &db);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_job_wait(ja, &err), SPN_EMEDIA);
  assert_int_equal(spn_job_wait(jb, &err), SPN_OK);
  char why[256] = "";
  if (!rt_col_check(&b->col, 1, 3000, why, sizeof why))
    fail_msg("%s", why);
  pthread_mutex_lock(&a->col.mu);
  assert_true(rt_col_job(&a->col, 1)->n <= 10);
  pthread_mutex_unlock(&a->col.mu);
  /* Every instance that opened the failed job (lazily: the sink only if a
   * frame reached it before the failure) closed it with ok=false. */
  assert_int_equal(atomic_load(&a->col.opens), atomic_load(&a->col.closes_fail));
  assert_true(atomic_load(&a->col.closes_fail) >= 2);
  assert_int_equal(atomic_load(&b->col.closes_fail), 0);
  assert_int_equal(atomic_load(&b->col.closes_ok), 3);
  spn_job_free(&ja);
  spn_job_free(&jb);
}

static void test_two_pipelines_one_runtime(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu:2", 2);
  world_t a, b;
  world_build(&a, rt, "a", 2000, true);
  world_build(&b, rt, "b", 3000, false);
  check_pair(&a, &b);
  world_free(&a);
  world_free(&b);
  spn_runtime_free(&rt);
}

static void test_two_runtimes(void **st) {
  (void)st;
  spn_runtime_t *r1 = rt_new("cpu", 1), *r2 = rt_new("cpu:4", 2);
  world_t a, b;
  world_build(&a, r1, "a", 2000, true);
  world_build(&b, r2, "b", 3000, false);
  check_pair(&a, &b);
  world_free(&a);
  world_free(&b);
  spn_runtime_free(&r1);
  spn_runtime_free(&r2);
}

/* A runtime freed with pipelines and a job still running cleans up. */
static void test_runtime_free_with_work(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  world_t a;
  world_build(&a, rt, "a", 100000000, false);
  rt_done_t d;
  spn_job_t *j = go(&a, 1, &d);
  usleep(10000);
  spn_runtime_free(&rt); /* frees the pipeline, cancelling the job */
  assert_int_equal(atomic_load(&d.calls), 1);
  assert_int_equal(atomic_load(&d.status), SPN_ECANCELLED);
  spn_job_free(&j);
  rt_col_free(&a.col);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_pipelines_one_runtime),
      cmocka_unit_test(test_two_runtimes),
      cmocka_unit_test(test_runtime_free_with_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
