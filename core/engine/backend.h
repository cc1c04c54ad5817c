/* backend.h — the engine's backend interface, shaped like ggml-backend.
 *
 * A backend runs nodes on one device. It says which nodes it supports (op,
 * dtypes, attributes), prepares each node placed on it (its own per-node
 * context in n->bctx: weights converted and placed in its own buffers),
 * computes a range of nodes on the run's stream, allocates arena buffers of
 * the buffer type (spindle/device.h) it names, and copies between its
 * buffers and host memory.
 *
 * An engine holds one backend instance per device it has loaded models on:
 * slot 0 is always the CPU (oneDNN + the C kernels; the numeric reference
 * and the fallback), other slots are opened on demand by a factory that
 * claims the device prefix ("cuda" in cuda/engine/, or a test backend).
 *
 * The planner (plan.c) puts each live node on the model's device backend,
 * falls back to the CPU for the nodes that backend does not support (one
 * load-time log line naming them; fallback "error" refuses instead) and
 * records the values that cross between backends, which each run copies at
 * the boundary into an arena slot of the consuming backend. */
#ifndef SPN_ENGINE_BACKEND_H
#define SPN_ENGINE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/device.h"
#include "spindle/status.h"

#define SPN_MAX_BACKENDS 8
#define SPN_BACKEND_CPU 0

struct spn_model;
struct spn_node;
struct spn_run;
typedef struct spn_backend spn_backend_t;

typedef struct spn_backend_iface {
  /* Whether the backend runs node n of model m as it stands after the graph
   * passes (op, input dtypes, attributes, fused post-ops). When not, a short
   * reason goes to why. Thread: load. */
  bool (*supports)(spn_backend_t *b, const struct spn_model *m, const struct spn_node *n, char *why,
                   size_t why_n);
  /* Prepare node n placed here: set up n->bctx (weights converted and placed
   * in the backend's buffers). NULL: nothing to prepare. Thread: load. */
  int32_t (*prepare)(spn_backend_t *b, struct spn_model *m, struct spn_node *n, spn_error_t *err);
  /* Once per (model, input shapes), after shape inference (r->v holds the
   * shapes; no data yet): build what the nodes placed here need for these
   * shapes (descriptors, algorithms, tables) and set *scratch to the bytes
   * of scratch a node needs at most; the planner puts that much in the
   * backend's arena, at r->bws[slot] during runs. NULL: no scratch.
   * Thread: any run. */
  int32_t (*prepare_shape)(spn_backend_t *b, struct spn_run *r, size_t *scratch);
  /* Whether node n, prepared here, holds its own copy of the constant it
   * reads as input k (k >= n->n_in: post-op k - n->n_in's operand) and
   * never reads the model's host data of it again: not in prepare_shape,
   * not in compute. Once every live node reading a constant says so, the
   * engine frees that host data at the end of the load (a GPU model's
   * weights, uploaded at prepare, are then held once, on the GPU). NULL:
   * it reads them (the CPU). Thread: load. */
  bool (*owns_const)(spn_backend_t *b, const struct spn_model *m, const struct spn_node *n, int k);
  /* Free n->bctx. Thread: model destruction. */
  void (*node_free)(spn_backend_t *b, struct spn_node *n);
  /* Compute the nodes of [first, last) placed on this backend (others, dead
   * and shape-class nodes are skipped) in order, on the run's stream. Input
   * values are in this backend's memory (boundary copies are done). */
  int32_t (*compute)(spn_backend_t *b, struct spn_run *r, int first, int last);
  /* With sync true the run's work on this backend, copies included, is
   * complete on return. Called with sync at the end of every run (then it
   * also releases per-run state, r->brun[b->slot]) and, for a backend whose
   * memory is not host memory, mid-run after a copy to the host that the
   * CPU reads next (then the run goes on: keep what it still needs). At the
   * end of a run whose outputs are all in device memory, a device backend
   * is called with sync false: release per-run state without waiting. */
  int32_t (*run_end)(spn_backend_t *b, struct spn_run *r, bool sync);
  /* Arena and scratch buffers of the backend's buffer type. */
  int32_t (*buf_alloc)(spn_backend_t *b, size_t size, void **data, void **handle, spn_error_t *err);
  void (*buf_free)(spn_backend_t *b, void *data, void *handle);
  /* Copies between host memory and this backend's buffers, in run order.
   * Unused (NULL allowed) when host_memory is true. */
  int32_t (*to_host)(spn_backend_t *b, struct spn_run *r, void *dst, const void *src, size_t n);
  int32_t (*from_host)(spn_backend_t *b, struct spn_run *r, void *dst, const void *src, size_t n);
  /* Fences between runs on different streams sharing an arena (device
   * backends; NULL for host memory): record, on the run's stream, the point
   * its work has reached into *fence (created on first use); make the run's
   * stream wait for a fence without blocking the host; wait on the host for
   * a fence and free it (before its buffers are freed or pooled). */
  int32_t (*fence_record)(spn_backend_t *b, struct spn_run *r, void **fence);
  int32_t (*fence_wait)(spn_backend_t *b, struct spn_run *r, void *fence);
  void (*fence_free)(spn_backend_t *b, void *fence);
  /* Fill the device weights of models ms[1..n), each prepared on another
   * device of this backend's kind with weights_deferred set, from ms[0]'s,
   * prepared here (bs[i] is ms[i]'s backend; every model parsed from the
   * same file with the same options, so each prepares the same weights in
   * the same order). On error the deferred models must not run. NULL: not
   * supported (peers then upload their own). Thread: load. */
  int32_t (*replicate)(spn_backend_t *const *bs, struct spn_model *const *ms, int n, spn_error_t *err);
  /* Model m is going away: drop anything kept for it beyond its nodes
   * (captured graphs). NULL: nothing. Thread: model destruction. */
  void (*model_release)(spn_backend_t *b, const struct spn_model *m);
  /* Free the instance (after every model using it is gone). */
  void (*free)(spn_backend_t *b);
} spn_backend_iface_t;

struct spn_backend {
  const spn_backend_iface_t *iface;
  char device[32];     /* "cpu", "cuda:0", ... */
  int32_t device_kind; /* spn_device_kind_t */
  int32_t device_index; /* N of "prefix:N": tensors in its memory carry kind and index */
  int32_t mem_kind;    /* spn_mem_kind_t of the arena's buffer type */
  spn_buffer_type_t *buffer_type; /* where its arena lives (may be NULL for a test backend) */
  bool host_memory;    /* buffers are host memory: no copies to and from the CPU */
  int slot;            /* index in the engine's backend table */
  void *ctx;
};

/* Opens the backend instance of device "prefix:index". */
typedef struct spn_backend_factory {
  const char *prefix; /* "cuda" */
  int32_t (*open)(const struct spn_backend_factory *f, int index, spn_backend_t **out, spn_error_t *err);
  void *data;
} spn_backend_factory_t;

/* The CPU backend (backend-cpu.c). */
int32_t spn_backend_cpu_new(spn_backend_t **out, spn_error_t *err);

#endif
