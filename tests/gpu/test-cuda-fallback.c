/* test-cuda-fallback.c — the CUDA backend as seen from a machine without a
 * GPU (or with one): runs in every CUDA build, suite unit.
 *
 * With no device, devices "auto" must fall back to the CPU and "cuda" /
 * "cuda:0" must fail with SPN_EDEVICE and a message naming the spec and
 * saying no CUDA device is available. With devices present, "auto" must open
 * CUDA devices and a bad ordinal must be refused naming it. (The health
 * monitor, which needs no CUDA, is tested in tests/runtime/test-device-health.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "cuda-internal.h"
#include "spindle/runtime.h"

#define assert_has(hay, needle)                                                  \
  do {                                                                           \
    if (!strstr((hay), (needle)))                                                \
      fail_msg("expected \"%s\" in message: %s", (needle), (hay));               \
  } while (0)

static int gpu_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

static int32_t open_rt(const char *devices, spn_runtime_t **rt, spn_error_t *err) {
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = devices;
  o.cpu_threads = 1;
  o.log_level = SPN_LOG_ERROR;
  return spn_runtime_new(&o, rt, err);
}

static void auto_picks_cuda_or_falls_back_to_cpu(void **state) {
  (void)state;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = open_rt("auto", &rt, &err);
  if (rc != SPN_OK)
    fail_msg("auto: %s", err.msg);
  int n = gpu_count();
  if (n == 0) {
    assert_int_equal(spn_runtime_device_count(rt), 1);
    assert_string_equal(spn_runtime_device_name(rt, 0), "cpu:0");
  } else {
    assert_int_equal(spn_runtime_device_count(rt), (uint32_t)n);
    assert_memory_equal(spn_runtime_device_name(rt, 0), "cuda:0 ", 7);
  }
  spn_runtime_free(&rt);
}

static void cuda_without_a_device_fails_clearly(void **state) {
  (void)state;
  if (gpu_count() > 0)
    skip();
  const char *specs[] = {"cuda", "cuda:0", "cuda:0,1"};
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    spn_runtime_t *rt = NULL;
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = open_rt(specs[i], &rt, &err);
    assert_int_equal(rc, SPN_EDEVICE);
    assert_null(rt);
    char quoted[32];
    snprintf(quoted, sizeof quoted, "\"%s\"", specs[i]);
    assert_has(err.msg, quoted);
    assert_has(err.msg, "no CUDA device available");
  }
}

static void bad_ordinals_are_refused(void **state) {
  (void)state;
  int n = gpu_count();
  if (n == 0)
    skip();
  char spec[32];
  snprintf(spec, sizeof spec, "cuda:%d", n);
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(open_rt(spec, &rt, &err), SPN_EDEVICE);
  assert_has(err.msg, "does not exist");
  assert_int_equal(open_rt("cuda:0,x", &rt, &err), SPN_ECONFIG);
  assert_has(err.msg, "offset 2");
  assert_int_equal(open_rt("cuda:0,0", &rt, &err), SPN_ECONFIG);
  assert_has(err.msg, "listed twice");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(auto_picks_cuda_or_falls_back_to_cpu),
      cmocka_unit_test(cuda_without_a_device_fails_clearly),
      cmocka_unit_test(bad_ordinals_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
