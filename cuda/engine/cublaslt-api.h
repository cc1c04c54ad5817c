/* cuda/engine/cublaslt-api.h — cuBLASLt, opened when the first CUDA engine
 * backend opens rather than when libspindle loads.
 *
 * libcublasLt is some 500 MB of code with over 400,000 relocations: linked
 * into libspindle it cost every process that loads the library (each
 * `spindle status`, a worker on a CPU-only node, a plugin's test) about
 * 0.2 s and 210 MB of resident memory before main, GPU or not. The
 * backend's few entry points are looked up here instead, once per backend
 * instance (a second GPU's backend, or the next one after the first
 * closed, costs a lookup, not a load: the library is never unloaded).
 *
 * Where the library comes from, first found wins:
 *   1. SPINDLE_CUBLASLT, a path or file name (a user's own cuBLAS);
 *   2. the process itself, when something it loaded already defines the
 *      entry points (an application that links cuBLASLt; the fakes of
 *      tests/gpu/host-emu) and their major version is the headers';
 *   3. libcublasLt.so.<major of the headers> through the dynamic loader
 *      (LD_LIBRARY_PATH, libspindle's run path, ld.so.cache);
 *   4. the same name beside the libcudart that is loaded (a toolkit's
 *      lib64 or a pip wheel's folder).
 * The signatures are the toolkit header's (__typeof__), so a call through
 * the table is checked as a direct call is. */
#ifndef SPN_CUDA_CUBLASLT_API_H
#define SPN_CUDA_CUBLASLT_API_H

#include <cublasLt.h>

#include "spindle/status.h"

typedef struct spn__lt_api {
  void *lib;          /* dlopen handle (NULL: the process's own symbols) */
  char from[256];     /* where the entry points were found, for messages */
  __typeof__(&cublasLtGetVersion) GetVersion;
  __typeof__(&cublasLtCreate) Create;
  __typeof__(&cublasLtDestroy) Destroy;
  __typeof__(&cublasLtMatmulDescCreate) MatmulDescCreate;
  __typeof__(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  __typeof__(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  __typeof__(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  __typeof__(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  __typeof__(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
  __typeof__(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  __typeof__(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  __typeof__(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  __typeof__(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  __typeof__(&cublasLtMatmul) Matmul;
} spn__lt_api_t;

/* Fills *api (every entry point found, major version checked) or fails with
 * SPN_ECUDA naming `who` (the device), each place tried and why.
 * Ownership: *api holds a library reference until spn__lt_api_close.
 * Thread: any. */
int32_t spn__lt_api_open(spn__lt_api_t *api, const char *who, spn_error_t *err);

/* Drops the reference; the table is zeroed. Safe on a zeroed table. The
 * library stays mapped (RTLD_NODELETE) for the next backend to find.
 * Thread: any, once no call through the table is running. */
void spn__lt_api_close(spn__lt_api_t *api);

#endif
