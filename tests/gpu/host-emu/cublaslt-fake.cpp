/* cublaslt-fake.cpp — the part of cuBLASLt the CUDA engine backend uses,
 * computed naively on the host (tests/gpu/host-emu/README). It defines the
 * real API's symbols (declared by the toolkit's cublasLt.h) and is linked
 * instead of libcublasLt.
 *
 * cuBLAS's column-major semantics, as documented:
 *  - a matrix layout is (type, rows, cols, ld): element (i, j) at j * ld + i
 *    (CUBLASLT_ORDER_COL, the default; ld >= rows) or i * ld + j (ORDER_ROW;
 *    ld >= cols); BATCH_COUNT matrices STRIDED_BATCH_OFFSET elements apart;
 *    types 32F and 16F (A and B alike; C and D alike);
 *  - D = alpha op(A) op(B) + beta C with op from TRANSA/TRANSB, op(A) m x k,
 *    op(B) k x n, C and D m x n (CUBLAS_STATUS_INVALID_VALUE otherwise), C
 *    not read when beta is 0, then the epilogue: BIAS adds a vector of m
 *    (one per row of D, in D's type unless BIAS_DATA_TYPE says otherwise),
 *    RELU_BIAS then clamps at 0, RELU clamps only; accumulation in double;
 *  - alpha and beta are host floats (scale type 32F, pointer mode host);
 *  - the heuristic returns one algorithm needing 8 KiB of workspace (none
 *    when the preference allows less); cublasLtMatmul with less workspace
 *    than that fails, and overwrites the workspace (NaN bytes) first;
 *  - A, B, C, D, the bias and the workspace must lie in device memory
 *    (cuda-fake.cpp's registry): CUBLAS_STATUS_INVALID_VALUE and a line on
 *    stderr otherwise;
 *  - attributes are checked for their size, as cuBLASLt does.
 * The work goes on the stream passed, so a captured graph replays it with the
 * descriptors as they were at the call. Not modelled: the algorithms, their
 * rounding, TF32. Test code only. */
#include <string.h>

#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "fake-internal.h"

namespace {

const size_t kWorkspace = 8192;

struct lt_desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t ta, tb;
  uint32_t epilogue;
  const void *bias;
  int32_t bias_type; /* -1: D's */
};

struct lt_layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch, order;
  int64_t stride;
};

struct lt_pref {
  uint64_t max_ws;
};

double ld_el(const void *p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_16F)
    return (double)(float)((const _Float16 *)p)[i];
  return (double)((const float *)p)[i];
}

void st_el(void *p, cudaDataType_t t, int64_t i, double v) {
  if (t == CUDA_R_16F)
    ((_Float16 *)p)[i] = (_Float16)(float)v;
  else
    ((float *)p)[i] = (float)v;
}

size_t el_size(cudaDataType_t t) { return t == CUDA_R_16F ? 2 : 4; }

int64_t at(const lt_layout &l, int64_t i, int64_t j) {
  return l.order == CUBLASLT_ORDER_ROW ? i * l.ld + j : j * l.ld + i;
}

/* Bytes from the first matrix's start to past the last batch's last element. */
size_t extent(const lt_layout &l) {
  int64_t last = at(l, (int64_t)l.rows - 1, (int64_t)l.cols - 1) + (int64_t)(l.batch - 1) * l.stride;
  return (size_t)(last + 1) * el_size(l.type);
}

bool on_device(const void *p, size_t n, const char *what) {
  if (spn_emu_is_device(p, n))
    return true;
  spn_emu_complain("cuBLASLt: %s at %p (%zu bytes) is not device memory", what, p, n);
  return false;
}

template <class T> cublasStatus_t set_attr(T *dst, const void *buf, size_t n) {
  if (n != sizeof *dst)
    return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(dst, buf, n);
  return CUBLAS_STATUS_SUCCESS;
}

/* The problem's dims (m, n, k) when A, B, C, D agree; false otherwise. */
bool dims(const lt_desc &d, const lt_layout &a, const lt_layout &b, const lt_layout &c, const lt_layout &dd,
          int64_t *m, int64_t *n, int64_t *k) {
  int64_t am = d.ta ? a.cols : a.rows, ak = d.ta ? a.rows : a.cols;
  int64_t bk = d.tb ? b.cols : b.rows, bn = d.tb ? b.rows : b.cols;
  if (ak != bk || c.rows != (uint64_t)am || c.cols != (uint64_t)bn || dd.rows != c.rows || dd.cols != c.cols)
    return false;
  if (a.type != b.type || c.type != dd.type || a.batch != b.batch || a.batch != dd.batch || c.batch != dd.batch)
    return false;
  *m = am, *n = bn, *k = ak;
  return true;
}

} // namespace

extern "C" {

/* The headers' version: cublaslt-api.c checks the major of what it found. */
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  *h = (cublasLtHandle_t) new char[1];
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete[] (char *)h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t scale) {
  if (scale != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = (cublasLtMatmulDesc_t) new lt_desc{ct, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, -1};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete (lt_desc *)d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t dp, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t n) {
  lt_desc *d = (lt_desc *)dp;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA: return set_attr(&d->ta, buf, n);
  case CUBLASLT_MATMUL_DESC_TRANSB: return set_attr(&d->tb, buf, n);
  case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(&d->epilogue, buf, n);
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(&d->bias, buf, n);
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_attr(&d->bias_type, buf, n);
  default:
    spn_emu_complain("cuBLASLt: matmul attribute %d not emulated", (int)attr);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (type != CUDA_R_32F && type != CUDA_R_16F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < (int64_t)rows || rows == 0 || cols == 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  *l = (cublasLtMatrixLayout_t) new lt_layout{type, rows, cols, ld, 1, CUBLASLT_ORDER_COL, 0};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete (lt_layout *)l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t lp, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t n) {
  lt_layout *l = (lt_layout *)lp;
  switch (attr) {
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_attr(&l->batch, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set_attr(&l->stride, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_attr(&l->order, buf, n);
  default:
    spn_emu_complain("cuBLASLt: layout attribute %d not emulated", (int)attr);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = (cublasLtMatmulPreference_t) new lt_pref{0};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete (lt_pref *)p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t n) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
    return set_attr(&((lt_pref *)p)->max_ws, buf, n);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t dp, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t p, int req,
                                              cublasLtMatmulHeuristicResult_t *res, int *got) {
  (void)h;
  int64_t m, n, k;
  if (!dims(*(lt_desc *)dp, *(lt_layout *)a, *(lt_layout *)b, *(lt_layout *)c, *(lt_layout *)d, &m, &n, &k))
    return CUBLAS_STATUS_INVALID_VALUE;
  *got = 0;
  if (req < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  memset(res, 0, sizeof *res);
  size_t ws = ((lt_pref *)p)->max_ws >= kWorkspace ? kWorkspace : 0;
  res->algo.data[0] = ws;
  res->workspaceSize = ws;
  res->state = CUBLAS_STATUS_SUCCESS;
  res->wavesCount = 1.f;
  *got = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t dp, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t al, const void *B, cublasLtMatrixLayout_t bl, const void *beta,
                              const void *C, cublasLtMatrixLayout_t cl, void *D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsn, cudaStream_t s) {
  (void)h;
  lt_desc d = *(lt_desc *)dp;
  lt_layout la = *(lt_layout *)al, lb = *(lt_layout *)bl, lc = *(lt_layout *)cl, ldd = *(lt_layout *)dl;
  int64_t m, n, k;
  if (!dims(d, la, lb, lc, ldd, &m, &n, &k))
    return CUBLAS_STATUS_INVALID_VALUE;
  size_t need = algo ? (size_t)algo->data[0] : 0;
  if (wsn < need) {
    spn_emu_complain("cuBLASLt: %zu workspace bytes given, the algorithm needs %zu", wsn, need);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  float a = *(const float *)alpha, b = *(const float *)beta;
  bool bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
  bool relu = d.epilogue == CUBLASLT_EPILOGUE_RELU || d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
  if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !bias && !relu)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  cudaDataType_t bt = d.bias_type >= 0 ? (cudaDataType_t)d.bias_type : ldd.type;
  if ((need && !on_device(ws, need, "the workspace")) || !on_device(A, extent(la), "A") ||
      !on_device(B, extent(lb), "B") || (b != 0.f && !on_device(C, extent(lc), "C")) ||
      !on_device(D, extent(ldd), "D") || (bias && !on_device(d.bias, (size_t)m * el_size(bt), "the bias")))
    return CUBLAS_STATUS_INVALID_VALUE;
  spn_emu_stream_do(s, [=] {
    if (need)
      memset(ws, 0xff, need);
    std::vector<double> out((size_t)(m * n));
    for (int32_t q = 0; q < ldd.batch; q++) {
      const char *pa = (const char *)A + (size_t)(q * la.stride) * el_size(la.type);
      const char *pb = (const char *)B + (size_t)(q * lb.stride) * el_size(lb.type);
      const char *pc = (const char *)C + (size_t)(q * lc.stride) * el_size(lc.type);
      char *pd = (char *)D + (size_t)(q * ldd.stride) * el_size(ldd.type);
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double acc = 0;
          for (int64_t l = 0; l < k; l++) {
            double x = ld_el(pa, la.type, d.ta ? at(la, l, i) : at(la, i, l));
            double y = ld_el(pb, lb.type, d.tb ? at(lb, j, l) : at(lb, l, j));
            acc += x * y;
          }
          double v = a * acc;
          if (b != 0.f)
            v += b * ld_el(pc, lc.type, at(lc, i, j));
          if (bias)
            v += ld_el(d.bias, bt, i);
          if (relu && v < 0)
            v = 0;
          out[(size_t)(j * m + i)] = v;
        }
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
          st_el(pd, ldd.type, at(ldd, i, j), out[(size_t)(j * m + i)]);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
