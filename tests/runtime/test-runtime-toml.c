/* test-runtime-toml.c — the runtime driven from TOML through the front end
 * and real plugins (stages/util): plugin search path, spn_pipeline_load(_string),
 * per-job overrides, a failing job, fan-out configs on emulated devices. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rt-kinds.h"

static spn_runtime_t *toml_rt(const char *devices) {
  const char *dir = getenv("SPINDLE_UTIL_STAGE_DIR");
  if (!dir)
    fail_msg("SPINDLE_UTIL_STAGE_DIR is not set");
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = devices;
  o.log_level = SPN_LOG_ERROR + 1;
  o.plugin_paths = &dir;
  o.n_plugin_paths = 1;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&o, &rt, &err) != SPN_OK)
    fail_msg("runtime: %s", err.msg);
  return rt;
}

static const char chain[] = "[pipeline]\n"
                            "name = \"chain\"\n"
                            "[[stage]]\n"
                            "name = \"source\"\n"
                            "kind = \"synth\"\n"
                            "frames = 50\n"
                            "width = 32\n"
                            "height = 16\n"
                            "[[stage]]\n"
                            "name = \"relay\"\n"
                            "kind = \"passthrough\"\n"
                            "inputs = [\"source\"]\n"
                            "instances = { count = 3, devices = \"all\" }\n"
                            "[[stage]]\n"
                            "name = \"sink\"\n"
                            "kind = \"check\"\n"
                            "inputs = [\"relay\"]\n"
                            "expect_frames = 50\n"
                            "verify_pattern = true\n";

static spn_job_t *go(spn_pipeline_t *pipe, const char *const *ov, size_t n, rt_done_t *d) {
  spn_job_callbacks_t cb = rt_callbacks(d);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.overrides = ov;
  p.n_overrides = n;
  spn_job_t *job = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_job_start(pipe, &p, &cb, &job, &err) != SPN_OK)
    fail_msg("job: %s", err.msg);
  return job;
}

static void test_string_and_per_job(void **st) {
  (void)st;
  spn_runtime_t *rt = toml_rt("cpu:2");
  spn_error_t err = SPN_ERROR_INIT;
  spn_pipeline_t *pipe = NULL;
  assert_int_equal(spn_pipeline_load_string(rt, chain, sizeof chain - 1, "chain.toml", NULL, 0, &pipe, &err), SPN_OK);
  assert_string_equal(spn_pipeline_name(pipe), "chain");
  assert_true(spn_runtime_kind_count(rt) >= 3);
  assert_int_equal(spn__pipeline_replicas(pipe, 1), 6);

  /* Three jobs at once: defaults, longer by per-job override, and one whose
   * sink expects more frames than its source makes (fails alone). */
  const char *const longer[] = {"source.frames=80", "sink.expect_frames=80"};
  const char *const wrong[] = {"source.frames=10"};
  rt_done_t d[3];
  spn_job_t *a = go(pipe, NULL, 0, &d[0]), *b = go(pipe, longer, 2, &d[1]), *c = go(pipe, wrong, 1, &d[2]);
  assert_int_equal(spn_job_wait(a, &err), SPN_OK);
  assert_int_equal(atomic_load(&d[0].last_progress), 50);
  assert_int_equal(spn_job_wait(b, &err), SPN_OK);
  assert_int_equal(atomic_load(&d[1].last_progress), 80);
  assert_true(spn_job_wait(c, &err) < 0);
  assert_non_null(strstr(err.msg, "stage \"sink\""));
  assert_int_equal(atomic_load(&d[2].calls), 1);
  spn_job_free(&a);
  spn_job_free(&b);
  spn_job_free(&c);

  /* A key that is not per-job is refused at start; on_done never runs. */
  const char *const bad[] = {"source.width=64"};
  rt_done_t dx;
  spn_job_callbacks_t cb = rt_callbacks(&dx);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.overrides = bad;
  p.n_overrides = 1;
  spn_job_t *x = NULL;
  assert_true(spn_job_start(pipe, &p, &cb, &x, &err) < 0);
  assert_null(x);
  assert_non_null(strstr(err.msg, "width"));
  assert_int_equal(atomic_load(&dx.calls), 0);
  spn_pipeline_free(&pipe);

  /* Refusals from the front end come back unchanged. */
  static const char broken[] = "[pipeline]\nname = \"x\"\n[[stage]]\nname = \"s\"\nkind = \"nope\"\n";
  assert_true(spn_pipeline_load_string(rt, broken, sizeof broken - 1, "broken.toml", NULL, 0, &pipe, &err) < 0);
  assert_null(pipe);
  assert_non_null(strstr(err.msg, "broken.toml:"));
  assert_non_null(strstr(err.msg, "nope"));
  spn_runtime_free(&rt);
}

/* Every shipped synthetic config runs on four emulated devices. */
static void test_configs(void **st) {
  (void)st;
  const char *root = getenv("SPINDLE_SOURCE_ROOT");
  if (!root)
    fail_msg("SPINDLE_SOURCE_ROOT is not set");
  const char *files[] = {"configs/synthetic.toml", "configs/synthetic-fanout.toml"};
  spn_runtime_t *rt = toml_rt("cpu:4");
  for (size_t i = 0; i < 2; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, files[i]);
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_pipeline_validate(rt, path, NULL, 0, &err), SPN_OK);
    spn_pipeline_t *pipe = NULL;
    if (spn_pipeline_load(rt, path, NULL, 0, &pipe, &err) != SPN_OK)
      fail_msg("%s: %s", files[i], err.msg);
    rt_done_t d;
    spn_job_t *job = go(pipe, NULL, 0, &d);
    if (spn_job_wait(job, &err) != SPN_OK)
      fail_msg("%s: %s", files[i], err.msg);
    spn_job_free(&job);
    spn_pipeline_free(&pipe);
  }
  spn_runtime_free(&rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_string_and_per_job),
      cmocka_unit_test(test_configs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
