/* cuda/engine/cublaslt-api.c — cuBLASLt's entry points, looked up on first
 * use (cublaslt-api.h says why and where from). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cublaslt-api.h"

#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)
#define LT_SONAME "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR)

/* Every entry point from `lib` (RTLD_DEFAULT: the process), or false with
 * the first one missing in `why`. */
static bool lt_resolve(spn__lt_api_t *a, void *lib, char *why, size_t cap) {
#define LT_SYM(field, name)                                   \
  do {                                                        \
    *(void **)&a->field = dlsym(lib, name);                   \
    if (!a->field) {                                          \
      snprintf(why, cap, "no %s in it", name);                \
      return false;                                           \
    }                                                         \
  } while (0)
  LT_SYM(GetVersion, "cublasLtGetVersion");
  LT_SYM(Create, "cublasLtCreate");
  LT_SYM(Destroy, "cublasLtDestroy");
  LT_SYM(MatmulDescCreate, "cublasLtMatmulDescCreate");
  LT_SYM(MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  LT_SYM(MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  LT_SYM(MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  LT_SYM(MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  LT_SYM(MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  LT_SYM(MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  LT_SYM(MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  LT_SYM(MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  LT_SYM(MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  LT_SYM(Matmul, "cublasLtMatmul");
#undef LT_SYM
  size_t v = a->GetVersion();
  if (v / 10000 != CUBLAS_VER_MAJOR) {
    snprintf(why, cap, "version %zu.%zu.%zu, built for %d.x", v / 10000, v / 100 % 100, v % 100, CUBLAS_VER_MAJOR);
    return false;
  }
  return true;
}

/* dlopen `path` and resolve; on failure the reason is appended to `tried`. */
static bool lt_try(spn__lt_api_t *a, const char *path, char *tried, size_t cap) {
  char why[256];
  /* never unloaded: CUDA libraries keep state that outlives a dlclose, and
   * loading 500 MB again for the next backend is what this file avoids */
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!lib) {
    const char *e = dlerror();
    snprintf(why, sizeof why, "%s", e ? e : "not found");
  } else if (lt_resolve(a, lib, why, sizeof why)) {
    a->lib = lib;
    snprintf(a->from, sizeof a->from, "%s", path);
    return true;
  } else {
    dlclose(lib);
  }
  size_t n = strlen(tried);
  snprintf(tried + n, cap - n, "%s%s (%s)", n ? "; " : "", path, why);
  return false;
}

int32_t spn__lt_api_open(spn__lt_api_t *api, const char *who, spn_error_t *err) {
  memset(api, 0, sizeof *api);
  char tried[1024] = "";
  const char *user = getenv("SPINDLE_CUBLASLT");
  if (user && *user) {
    /* the user's choice is the only one tried: falling back would hide it */
    if (lt_try(api, user, tried, sizeof tried))
      return SPN_OK;
    memset(api, 0, sizeof *api);
    return spn_error_set(err, SPN_ECUDA, "%s: cannot use cuBLASLt from SPINDLE_CUBLASLT=%s", who, tried);
  }
  char why[256];
  if (dlsym(RTLD_DEFAULT, "cublasLtCreate")) {
    if (lt_resolve(api, RTLD_DEFAULT, why, sizeof why)) {
      snprintf(api->from, sizeof api->from, "the process");
      return SPN_OK;
    }
    memset(api, 0, sizeof *api);
    snprintf(tried, sizeof tried, "the process's own cuBLASLt (%s)", why);
  }
  if (lt_try(api, LT_SONAME, tried, sizeof tried))
    return SPN_OK;
  /* beside the CUDA runtime this library runs on */
  Dl_info info;
  if (dladdr((void *)&cudaGetDeviceCount, &info) && info.dli_fname) {
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash) {
      char path[512];
      int dir = (int)(slash - info.dli_fname);
      if (snprintf(path, sizeof path, "%.*s/%s", dir, info.dli_fname, LT_SONAME) < (int)sizeof path &&
          lt_try(api, path, tried, sizeof tried))
        return SPN_OK;
    }
  }
  memset(api, 0, sizeof *api);
  return spn_error_set(err, SPN_ECUDA,
                       "%s: cannot load cuBLASLt %d.x, which the CUDA engine needs for MatMul and Gemm: tried %s; "
                       "install the CUDA toolkit's cuBLAS (or the nvidia-cublas wheel) or set SPINDLE_CUBLASLT "
                       "to its library",
                       who, CUBLAS_VER_MAJOR, tried);
}

void spn__lt_api_close(spn__lt_api_t *api) {
  if (api->lib)
    dlclose(api->lib);
  memset(api, 0, sizeof *api);
}
