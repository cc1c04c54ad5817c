/* test-cuda-fallback.c — the CUDA backend as seen from a machine without a
 * GPU (or with one): runs in every CUDA build, suite unit.
 *
 * With no device, devices "auto" must fall back to the CPU and "cuda" /
 * "cuda:0" must fail with SPN_EDEVICE and a message naming the spec and
 * saying no CUDA device is available. With devices present, "auto" must open
 * CUDA devices and a bad ordinal must be refused naming it. Also covers the
 * health monitor's XID classification and state machine, which need no GPU. */
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

static void xid_classification(void **state) {
  (void)state;
  /* fatal to the GPU: ECC double bit, fell off the bus, uncontained ECC, GSP */
  const unsigned long long fatal[] = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120};
  for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++)
    if (!spn__cuda_xid_fatal(fatal[i]))
      fail_msg("XID %llu should be fatal", fatal[i]);
  /* application faults: the context dies, the GPU is fine */
  const unsigned long long app[] = {0, 13, 31, 43, 45, 68, 109};
  for (size_t i = 0; i < sizeof app / sizeof *app; i++)
    if (spn__cuda_xid_fatal(app[i]))
      fail_msg("XID %llu should not be fatal", app[i]);
}

static void health_state_follows_xids(void **state) {
  (void)state;
  const char *ids[2] = {"0000:01:00.0", "0000:02:00.0"};
  spn__cuda_health_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  /* No NVML: a poller that reports nothing (test-cuda-health covers NVML). */
  assert_int_equal(spn__cuda_health_new("libspindle-no-such-nvml.so", ids, 2, &h, &err), SPN_OK);
  assert_non_null(h);
  assert_false(spn__cuda_health_available(h));
  assert_int_equal(spn__cuda_health_poll(h), 0);
  unsigned long long xid = 99;
  assert_int_equal(spn__cuda_health_state(h, 0, &xid), SPN__CUDA_HEALTHY);
  assert_int_equal(xid, 0);
  spn__cuda_health_inject_xid(h, 1, 13); /* app fault: still healthy */
  assert_int_equal(spn__cuda_health_state(h, 1, &xid), SPN__CUDA_HEALTHY);
  assert_int_equal(xid, 13);
  spn__cuda_health_inject_xid(h, 1, 79);
  assert_int_equal(spn__cuda_health_state(h, 1, &xid), SPN__CUDA_XID_FATAL);
  assert_int_equal(xid, 79);
  spn__cuda_health_inject_xid(h, 1, 13); /* a later harmless XID does not heal it */
  assert_int_equal(spn__cuda_health_state(h, 1, NULL), SPN__CUDA_XID_FATAL);
  assert_int_equal(spn__cuda_health_state(h, 0, NULL), SPN__CUDA_HEALTHY);
  assert_int_equal(spn__cuda_health_state(h, 7, NULL), SPN__CUDA_HEALTHY); /* out of range */
  spn__cuda_health_free(&h);
  assert_null(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(auto_picks_cuda_or_falls_back_to_cpu),
      cmocka_unit_test(cuda_without_a_device_fails_clearly),
      cmocka_unit_test(bad_ordinals_are_refused),
      cmocka_unit_test(xid_classification),
      cmocka_unit_test(health_state_follows_xids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
