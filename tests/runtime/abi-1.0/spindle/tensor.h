/* spindle/tensor.h — a non-owning view of an n-dimensional array.
 *
 * The model engine reads and writes tensors; stages hand them to the engine
 * and receive them in messages. A tensor view owns nothing: the memory
 * belongs to whoever allocated it (a runtime buffer, the engine, the caller).
 * Crosses the plugin boundary: struct_size first, append only. */
#ifndef SPINDLE_TENSOR_H
#define SPINDLE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spn_dtype {
  SPN_DTYPE_INVALID = 0,
  SPN_DTYPE_F32 = 1,
  SPN_DTYPE_F16 = 2,
  SPN_DTYPE_BF16 = 3,
  SPN_DTYPE_U8 = 4,
  SPN_DTYPE_I8 = 5,
  SPN_DTYPE_I32 = 6,
  SPN_DTYPE_I64 = 7,
  SPN_DTYPE_BOOL = 8,
} spn_dtype_t;

#define SPN_TENSOR_MAX_DIMS 8

/* Where memory lives. kind 0 = host (CPU), 1 = CUDA device; index is the
 * runtime's device index within that kind. */
typedef enum spn_device_kind {
  SPN_DEVICE_CPU = 0,
  SPN_DEVICE_CUDA = 1,
} spn_device_kind_t;

typedef struct spn_tensor {
  uint32_t struct_size;
  int32_t dtype;                       /* spn_dtype_t */
  int32_t ndim;
  int32_t device_kind;                 /* spn_device_kind_t */
  int32_t device_index;
  int32_t reserved0;
  int64_t shape[SPN_TENSOR_MAX_DIMS];  /* (B,C,H,W) for images */
  void *data;                          /* contiguous, row-major */
  void *reserved[4];
} spn_tensor_t;

#define SPN_TENSOR_INIT {.struct_size = sizeof(spn_tensor_t)}

static inline size_t spn_dtype_size(int32_t dtype) {
  switch (dtype) {
  case SPN_DTYPE_F32: case SPN_DTYPE_I32: return 4;
  case SPN_DTYPE_F16: case SPN_DTYPE_BF16: return 2;
  case SPN_DTYPE_U8: case SPN_DTYPE_I8: case SPN_DTYPE_BOOL: return 1;
  case SPN_DTYPE_I64: return 8;
  default: return 0;
  }
}

/* Element count (product of the shape; 1 for a scalar). */
static inline int64_t spn_tensor_numel(const spn_tensor_t *t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; i++)
    n *= t->shape[i];
  return n;
}

static inline size_t spn_tensor_nbytes(const spn_tensor_t *t) {
  return (size_t)spn_tensor_numel(t) * spn_dtype_size(t->dtype);
}

#ifdef __cplusplus
}
#endif
#endif
