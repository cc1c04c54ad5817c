/* ops-internal.h — helpers shared by the backend-neutral operator code
 * (ops-shape.c: load-time checks and shape inference) and the CPU backend's
 * C kernels (cpu-kernels.c). */
#ifndef SPN_OPS_INTERNAL_H
#define SPN_OPS_INTERNAL_H

#include <stdarg.h>
#include <string.h>

#include "engine-internal.h"

#define IN(k) (&r->v[n->in[k]])
#define OUT(k) (&r->v[n->out[k]])
#define PAR_MIN 32768

static inline bool has_in(const spn_node_t *n, int k) {
  return k < n->n_in && n->in[k] >= 0;
}

/* Saturating multiply: hostile shapes must not wrap around. */
static inline int64_t smul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static inline int64_t numel(const spn_rt_val_t *v) {
  int64_t x = 1;
  for (int i = 0; i < v->ndim; i++)
    x = smul(x, v->shape[i]);
  return x;
}

static inline int norm_axis(int64_t a, int ndim) {
  if (a < 0)
    a += ndim;
  return a < 0 || a >= ndim ? -1 : (int)a;
}

/* Report a run-time error through r->err; returns code. */
int32_t spn_op_fail(spn_run_t *r, int32_t code, const char *fmt, ...) SPN_PRINTF(3, 4);
/* Parameters computed from a node's (constant or shape-class) inputs, shared
 * by shape inference and the kernels. */
int32_t spn_op_infer_resize(spn_run_t *r, const spn_node_t *n, float *scales, int64_t *sizes);
int32_t spn_op_slice_params(spn_run_t *r, const spn_node_t *n, int64_t *start, int64_t *step,
                            int64_t *count);
int32_t spn_op_pad_params(spn_run_t *r, const spn_node_t *n, int64_t *pads, float *value);
/* Pad's mode attribute (checked by shape inference): constant, reflect, edge. */
typedef enum { SPN_PAD_CONSTANT = 0, SPN_PAD_REFLECT = 1, SPN_PAD_EDGE = 2 } spn_pad_mode_t;
spn_pad_mode_t spn_op_pad_mode(const spn_node_t *n);
int32_t spn_op_axes_of(spn_run_t *r, const spn_node_t *n, int64_t *axes, int *na);

#endif
