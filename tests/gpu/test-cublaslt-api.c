/* test-cublaslt-api.c — where the CUDA engine finds cuBLASLt
 * (cuda/engine/cublaslt-api.h), with the toolkit's real library and no GPU
 * (suite unit; built where the CUDA engine is). libspindle no longer links
 * cuBLASLt, so these are the checks that the lookup finds it, checks its
 * version, and fails with a message a user can act on. Nothing here calls
 * into cuBLASLt but cublasLtGetVersion, which needs no device. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/cublaslt-api.h"

#define ENV "SPINDLE_CUBLASLT"

/* The process itself must not define cuBLASLt (else the lookup takes its
 * own symbols and the library path goes untested): libspindle links none. */
static void process_has_no_cublaslt(void **s) {
  (void)s;
  assert_null(dlsym(RTLD_DEFAULT, "cublasLtCreate"));
}

static void finds_the_toolkit_library(void **s) {
  (void)s;
  unsetenv(ENV);
  spn__lt_api_t a;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn__lt_api_open(&a, "cuda:0", &err);
  assert_int_equal(rc, SPN_OK);
  assert_non_null(a.lib);
  assert_non_null(strstr(a.from, "libcublasLt.so."));
  assert_int_equal(a.GetVersion() / 10000, CUBLAS_VER_MAJOR);
  assert_non_null(a.Matmul);
  assert_non_null(a.MatmulAlgoGetHeuristic);
  /* the same library through its full path, as a user would give it */
  Dl_info info;
  assert_true(dladdr((void *)a.Matmul, &info) && info.dli_fname);
  char *path = strdup(info.dli_fname);
  spn__lt_api_close(&a);
  assert_null(a.lib);
  assert_null(a.Matmul);
  setenv(ENV, path, 1);
  assert_int_equal(spn__lt_api_open(&a, "cuda:0", &err), SPN_OK);
  assert_string_equal(a.from, path);
  spn__lt_api_close(&a);
  spn__lt_api_close(&a); /* twice: a zeroed table */
  unsetenv(ENV);
  free(path);
}

static void user_path_missing_is_named(void **s) {
  (void)s;
  setenv(ENV, "/nonexistent/libcublasLt.so.99", 1);
  spn__lt_api_t a;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__lt_api_open(&a, "cuda:3", &err), SPN_ECUDA);
  assert_non_null(strstr(err.msg, "cuda:3"));
  assert_non_null(strstr(err.msg, ENV "=/nonexistent/libcublasLt.so.99"));
  assert_null(a.lib);
  assert_null(a.Create);
  unsetenv(ENV);
}

/* A library that is not cuBLASLt: the first entry point missing is named,
 * and nothing falls back behind the user's back. */
static void user_path_wrong_library(void **s) {
  (void)s;
  setenv(ENV, "libz.so.1", 1);
  spn__lt_api_t a;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__lt_api_open(&a, "cuda:0", &err), SPN_ECUDA);
  assert_non_null(strstr(err.msg, "libz.so.1"));
  assert_true(strstr(err.msg, "no cublasLtGetVersion in it") || strstr(err.msg, "cannot open"));
  assert_null(a.lib);
  unsetenv(ENV);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(process_has_no_cublaslt),
      cmocka_unit_test(finds_the_toolkit_library),
      cmocka_unit_test(user_path_missing_is_named),
      cmocka_unit_test(user_path_wrong_library),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
