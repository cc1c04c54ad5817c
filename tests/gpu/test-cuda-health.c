/* test-cuda-health.c — the GPU health monitor's NVML path against a fake
 * libnvidia-ml (fake-nvml.c), so it runs without a GPU (suite unit).
 *
 * Checks that devices are matched by PCI bus id and registered for critical
 * XIDs, that a poll drains queued events and flags only fatal XIDs, that a
 * lost GPU is flagged, that a poll reports each device once, that unknown
 * bus ids are ignored, and that NVML is shut down as often as it was
 * initialised. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <cmocka.h>

#include "cuda-internal.h"

static void health_follows_nvml(void **state) {
  (void)state;
  const char *lib = getenv("SPINDLE_FAKE_NVML");
  assert_non_null(lib);
  void *ctl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(ctl);
  void (*push_xid)(int, unsigned long long) = (void (*)(int, unsigned long long))dlsym(ctl, "fake_nvml_push_xid");
  void (*set_lost)(int) = (void (*)(int))dlsym(ctl, "fake_nvml_set_lost");
  int (*inits)(void) = (int (*)(void))dlsym(ctl, "fake_nvml_inits");
  int (*registered)(int) = (int (*)(int))dlsym(ctl, "fake_nvml_registered");
  assert_true(push_xid && set_lost && inits && registered);

  /* runtime devices 0..2 are the GPUs at bus 02, 01 and an unknown one */
  const char *ids[3] = {"0000:02:00.0", "0000:01:00.0", "0000:09:00.0"};
  spn__cuda_health_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__cuda_health_new(lib, ids, 3, &h, &err), SPN_OK);
  assert_true(spn__cuda_health_available(h));
  assert_int_equal(inits(), 1);
  assert_true(registered(1) && registered(2));
  assert_false(registered(3));
  assert_int_equal(spn__cuda_health_poll(h), 0);

  /* an application fault on bus 01 (device 1): noted, not fatal */
  push_xid(1, 31);
  assert_int_equal(spn__cuda_health_poll(h), 0);
  unsigned long long xid = 0;
  assert_int_equal(spn__cuda_health_state(h, 1, &xid), SPN__CUDA_HEALTHY);
  assert_int_equal(xid, 31);

  /* two fatal XIDs on bus 01 and one harmless on bus 02 in one poll */
  push_xid(1, 48);
  push_xid(2, 13);
  push_xid(1, 79);
  assert_int_equal(spn__cuda_health_poll(h), 1);
  assert_int_equal(spn__cuda_health_state(h, 1, &xid), SPN__CUDA_XID_FATAL);
  assert_int_equal(xid, 79);
  assert_int_equal(spn__cuda_health_state(h, 0, &xid), SPN__CUDA_HEALTHY);
  assert_int_equal(xid, 13);
  assert_int_equal(spn__cuda_health_poll(h), 0); /* reported once */

  /* bus 02 falls off the bus */
  set_lost(2);
  assert_int_equal(spn__cuda_health_poll(h), 1);
  assert_int_equal(spn__cuda_health_state(h, 0, NULL), SPN__CUDA_LOST);
  assert_int_equal(spn__cuda_health_poll(h), 0);
  assert_int_equal(spn__cuda_health_state(h, 2, NULL), SPN__CUDA_HEALTHY);

  spn__cuda_health_free(&h);
  assert_null(h);
  assert_int_equal(inits(), 0);
  dlclose(ctl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(health_follows_nvml),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
