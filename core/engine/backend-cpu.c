/* backend-cpu.c — the CPU backend: oneDNN (cpu-dnnl.c) plus the C kernels
 * (cpu-kernels.c) behind the backend interface (backend.h).
 *
 * It runs every operator the engine knows, so it is both the numeric
 * reference and the fallback for nodes a device backend cannot run. Its
 * arena lives in the memory of a CPU device (spindle/device.h), which is
 * host memory, so it never copies. Per-node contexts (oneDNN primitives and
 * reordered weights, keyed by input shape) are built on first use under the
 * node's lock; per-run state is the oneDNN stream.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/device-internal.h"
#include "engine-internal.h"

typedef struct {
  void *dnnl; /* dnnl_engine_t */
  spn_device_t **devs;
  uint32_t n_devs;
} cpu_ctx_t;

void *spn_cpu_dnnl_engine(const spn_model_t *m) {
  return ((cpu_ctx_t *)m->shared->backends[SPN_BACKEND_CPU]->ctx)->dnnl;
}

static bool cpu_supports(spn_backend_t *b, const spn_model_t *m, const spn_node_t *n, char *why,
                         size_t why_n) {
  (void)b, (void)m, (void)n, (void)why, (void)why_n;
  return true; /* every operator spn_op_check accepts has a CPU kernel */
}

static void cpu_node_free(spn_backend_t *b, spn_node_t *n) {
  (void)b;
  spn_dnnl_node_free(n);
}

static int32_t cpu_compute(spn_backend_t *b, spn_run_t *r, int first, int last) {
  const spn_model_t *m = r->m;
  /* OpenMP (oneDNN's runtime in Debian, and our kernels) takes the thread
   * count from the calling thread; restore the caller's setting after. */
  int prev = omp_get_max_threads();
  if (prev != r->threads)
    omp_set_num_threads(r->threads);
  int32_t rc = SPN_OK;
  for (int i = first; i < last && !rc; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class || n->backend != b->slot)
      continue;
    if ((rc = spn_cpu_exec(r, n)))
      spn_error_prefix(r->err, "%s: node '%s' (%s)", m->path, n->name, n->op_name);
  }
  if (prev != r->threads)
    omp_set_num_threads(prev);
  return rc;
}

static int32_t cpu_run_end(spn_backend_t *b, spn_run_t *r, bool sync) {
  (void)b, (void)sync; /* CPU work is complete when compute returns */
  spn_dnnl_run_end(r);
  return SPN_OK;
}

static int32_t cpu_buf_alloc(spn_backend_t *b, size_t size, void **data, void **handle, spn_error_t *err) {
  spn_buffer_t *buf = NULL;
  int32_t rc = spn_buffer_type_alloc(b->buffer_type, size, &buf, err);
  if (rc)
    return rc;
  *data = spn_buffer_data(buf);
  *handle = buf;
  return SPN_OK;
}

static void cpu_buf_free(spn_backend_t *b, void *data, void *handle) {
  (void)b, (void)data;
  spn_buffer_t *buf = handle;
  spn_buffer_unref(&buf);
}

static void cpu_free(spn_backend_t *b) {
  cpu_ctx_t *c = b->ctx;
  if (c) {
    spn_dnnl_engine_free(c->dnnl);
    spn__devices_free(&c->devs, c->n_devs);
    free(c);
  }
  free(b);
}

static const spn_backend_iface_t cpu_iface = {
    .supports = cpu_supports,
    .node_free = cpu_node_free,
    .compute = cpu_compute,
    .run_end = cpu_run_end,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .free = cpu_free,
};

int32_t spn_backend_cpu_new(spn_backend_t **out, spn_error_t *err) {
  *out = NULL;
  spn_backend_t *b = calloc(1, sizeof *b);
  cpu_ctx_t *c = calloc(1, sizeof *c);
  if (!b || !c) {
    free(b);
    free(c);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  b->iface = &cpu_iface;
  b->ctx = c;
  snprintf(b->device, sizeof b->device, "cpu");
  b->device_kind = SPN_DEVICE_CPU;
  b->mem_kind = SPN_MEM_DEVICE;
  b->host_memory = true;
  b->slot = SPN_BACKEND_CPU;
  int32_t rc = spn__devices_open("cpu", NULL, 0, &c->devs, &c->n_devs, err);
  if (!rc)
    rc = spn_dnnl_engine_new(&c->dnnl, err);
  if (rc) {
    cpu_free(b);
    return rc;
  }
  b->buffer_type = spn_device_buffer_type(c->devs[0], SPN_MEM_DEVICE);
  *out = b;
  return SPN_OK;
}
