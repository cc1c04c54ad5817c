/* test-status.c — the status table and error records. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "spindle/status.h"

static void names_and_messages_cover_every_code(void **state) {
  (void)state;
#define CHECK(name, val, msg)                                        \
  assert_string_equal(spn_err_name(val), "SPN_" #name);              \
  assert_string_equal(spn_strerror(val), msg);
  SPN_STATUS_MAP(CHECK)
#undef CHECK
  assert_string_equal(spn_err_name(-9999), "SPN_UNKNOWN");
  assert_string_equal(spn_strerror(-9999), "unknown status");
}

static void error_set_and_prefix(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_error_set(&err, SPN_EPARSE, "line %d: bad", 12), SPN_EPARSE);
  assert_int_equal(err.code, SPN_EPARSE);
  assert_string_equal(err.msg, "line 12: bad");
  spn_error_prefix(&err, "%s", "pipeline.toml");
  assert_string_equal(err.msg, "pipeline.toml: line 12: bad");
  spn_error_clear(&err);
  assert_int_equal(err.code, SPN_OK);
  assert_string_equal(err.msg, "");
  /* A NULL record is accepted and the code still comes back. */
  assert_int_equal(spn_error_set(NULL, SPN_EIO, "x"), SPN_EIO);
}

static void long_messages_are_truncated_not_overflowed(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  char big[4096];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  spn_error_set(&err, SPN_EINVAL, "%s", big);
  assert_int_equal(strlen(err.msg), SPN_ERROR_MSG_MAX - 1);
  spn_error_prefix(&err, "p");
  assert_int_equal(strlen(err.msg), SPN_ERROR_MSG_MAX - 1);
  assert_memory_equal(err.msg, "p: aaa", 6);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names_and_messages_cover_every_code),
      cmocka_unit_test(error_set_and_prefix),
      cmocka_unit_test(long_messages_are_truncated_not_overflowed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
