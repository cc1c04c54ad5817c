/* test-device-health.c — the GPU health monitor against a fake
 * libnvidia-ml (fake-nvml.c), so it runs without a GPU or CUDA (suite unit).
 *
 * XIDs are classified (fatal to the GPU or only to a context); without NVML
 * the poller reports nothing but injected XIDs still drive its state.
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

#include "health-internal.h"

static void xid_classification(void **state) {
  (void)state;
  /* fatal to the GPU: ECC double bit, fell off the bus, uncontained ECC, GSP */
  const unsigned long long fatal[] = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120};
  for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++)
    if (!spn__xid_fatal(fatal[i]))
      fail_msg("XID %llu should be fatal", fatal[i]);
  /* application faults: the context dies, the GPU is fine */
  const unsigned long long app[] = {0, 13, 31, 43, 45, 68, 109};
  for (size_t i = 0; i < sizeof app / sizeof *app; i++)
    if (spn__xid_fatal(app[i]))
      fail_msg("XID %llu should not be fatal", app[i]);
}

static void health_state_follows_xids(void **state) {
  (void)state;
  const char *ids[2] = {"0000:01:00.0", "0000:02:00.0"};
  spn__nvml_health_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  /* No NVML: a poller that reports nothing. */
  assert_int_equal(spn__nvml_health_new("libspindle-no-such-nvml.so", ids, 2, &h, &err), SPN_OK);
  assert_non_null(h);
  assert_false(spn__nvml_health_available(h));
  assert_int_equal(spn__nvml_health_poll(h), 0);
  unsigned long long xid = 99;
  assert_int_equal(spn__nvml_health_state(h, 0, &xid), SPN__NVML_HEALTHY);
  assert_int_equal(xid, 0);
  spn__nvml_health_inject_xid(h, 1, 13); /* app fault: still healthy */
  assert_int_equal(spn__nvml_health_state(h, 1, &xid), SPN__NVML_HEALTHY);
  assert_int_equal(xid, 13);
  spn__nvml_health_inject_xid(h, 1, 79);
  assert_int_equal(spn__nvml_health_state(h, 1, &xid), SPN__NVML_XID_FATAL);
  assert_int_equal(xid, 79);
  spn__nvml_health_inject_xid(h, 1, 13); /* a later harmless XID does not heal it */
  assert_int_equal(spn__nvml_health_state(h, 1, NULL), SPN__NVML_XID_FATAL);
  assert_int_equal(spn__nvml_health_state(h, 0, NULL), SPN__NVML_HEALTHY);
  assert_int_equal(spn__nvml_health_state(h, 7, NULL), SPN__NVML_HEALTHY); /* out of range */
  spn__nvml_health_free(&h);
  assert_null(h);
}

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
  spn__nvml_health_t *h = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__nvml_health_new(lib, ids, 3, &h, &err), SPN_OK);
  assert_true(spn__nvml_health_available(h));
  assert_int_equal(inits(), 1);
  assert_true(registered(1) && registered(2));
  assert_false(registered(3));
  assert_int_equal(spn__nvml_health_poll(h), 0);

  /* an application fault on bus 01 (device 1): noted, not fatal */
  push_xid(1, 31);
  assert_int_equal(spn__nvml_health_poll(h), 0);
  unsigned long long xid = 0;
  assert_int_equal(spn__nvml_health_state(h, 1, &xid), SPN__NVML_HEALTHY);
  assert_int_equal(xid, 31);

  /* two fatal XIDs on bus 01 and one harmless on bus 02 in one poll */
  push_xid(1, 48);
  push_xid(2, 13);
  push_xid(1, 79);
  assert_int_equal(spn__nvml_health_poll(h), 1);
  assert_int_equal(spn__nvml_health_state(h, 1, &xid), SPN__NVML_XID_FATAL);
  assert_int_equal(xid, 79);
  assert_int_equal(spn__nvml_health_state(h, 0, &xid), SPN__NVML_HEALTHY);
  assert_int_equal(xid, 13);
  assert_int_equal(spn__nvml_health_poll(h), 0); /* reported once */

  /* bus 02 falls off the bus */
  set_lost(2);
  assert_int_equal(spn__nvml_health_poll(h), 1);
  assert_int_equal(spn__nvml_health_state(h, 0, NULL), SPN__NVML_LOST);
  assert_int_equal(spn__nvml_health_poll(h), 0);
  assert_int_equal(spn__nvml_health_state(h, 2, NULL), SPN__NVML_HEALTHY);

  spn__nvml_health_free(&h);
  assert_null(h);
  assert_int_equal(inits(), 0);
  dlclose(ctl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(xid_classification),
      cmocka_unit_test(health_state_follows_xids),
      cmocka_unit_test(health_follows_nvml),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
