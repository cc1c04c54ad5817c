/* spindle/engine.h — load ONNX models once per device and run batches.
 *
 * An engine (spn_engine_t) is a registry of loaded models: loading the same
 * file (same canonical path) on the same device twice returns the same
 * refcounted model, so every stage instance on a device shares one copy of the
 * weights. There is no global state: two engines in one process are
 * independent.
 *
 * Devices are named "cpu", "cpu:N" (N emulated CPU devices share the host's
 * cores; the index only separates registries entries) and "cuda:N" (refused
 * with SPN_EUNSUPPORTED when libspindle is built without the CUDA engine
 * backend). A node the device's backend cannot run goes to the CPU (one
 * load-time log line names them) unless the model is loaded with fallback
 * "error", which refuses it naming the node and op.
 *
 * Running: spn_model_run() takes the inputs in the order the model declares
 * them (spn_model_input_index() maps a name to that position) and fills the
 * outputs in declared order. Output memory, per output tensor:
 *   - data == NULL: the engine allocates it and fills shape/ndim/dtype; the
 *     caller frees it with spn_model_output_free(). This is the usual way.
 *   - data != NULL: a caller buffer; dtype, ndim and shape must be set and
 *     must equal what the model produces for these inputs (else SPN_EINVAL,
 *     nothing written beyond the buffer).
 * Any batch size is accepted on a dynamic batch dimension. spn_model_run() is
 * safe to call concurrently from several threads on one model: weights are
 * shared read-only; the memory plan of each input shape is made once and
 * kept, and concurrent calls use separate arenas.
 * spn_model_run_on() also takes tensors in device memory and the caller's
 * stream, and then need not wait for the device.
 */
#ifndef SPINDLE_ENGINE_H
#define SPINDLE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"
#include "spindle/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_engine spn_engine_t;
typedef struct spn_model spn_model_t;

typedef struct spn_engine_opts {
  uint32_t struct_size; /* sizeof(spn_engine_opts_t) */
  int32_t threads;      /* CPU threads per run; 0 = all online cores */
  int32_t no_fusion;    /* 1: skip BatchNorm folding and post-op fusion */
  int32_t reserved[5];
} spn_engine_opts_t;

#define SPN_ENGINE_OPTS_INIT {.struct_size = sizeof(spn_engine_opts_t)}

/* Create an engine. opts may be NULL (defaults). Ownership: *out is the
 * caller's, freed with spn_engine_free. Thread: any. */
SPN_API int32_t spn_engine_new(const spn_engine_opts_t *opts, spn_engine_t **out, spn_error_t *err);

/* Free the engine and set *eng to NULL. Models still referenced stay valid
 * until their last release (they hold a reference on the engine's shared
 * backend state). A NULL *eng is ignored. Ownership: consumes *eng.
 * Thread: any, not concurrently with a load on the same engine. */
SPN_API void spn_engine_free(spn_engine_t **eng);

/* Free the models loaded for peers (spn_model_opts_t.peers) that no load
 * has taken; returns how many. Call when the loads that named the peers are
 * done (the runtime does after creating a pipeline). A later load on such a
 * device simply reads the file again. Ownership: none (the freed models
 * were the engine's). Thread: any. */
SPN_API int32_t spn_engine_trim(spn_engine_t *eng);

/* Load `path` on `device` ("cpu", "cpu:1", "cuda:0"), or take another
 * reference on the already loaded model with the same canonical path and
 * device. External-data files must lie in the model's folder. Errors name the
 * file and the node or tensor. Ownership: *out holds one reference, released
 * with spn_model_release. Thread: any: loads of different models run at
 * once; a second load of a model being loaded waits and shares it. */
SPN_API int32_t spn_engine_load(spn_engine_t *eng, const char *path, const char *device,
                                spn_model_t **out, spn_error_t *err);

/* Load a model from memory (not registered for sharing; external data is
 * refused). `name` is used in error messages. Ownership: *out holds one
 * reference (spn_model_release); data is borrowed for the call (the
 * weights are copied). Thread: any. */
SPN_API int32_t spn_engine_load_memory(spn_engine_t *eng, const void *data, size_t len,
                                       const char *name, const char *device, spn_model_t **out,
                                       spn_error_t *err);

/* Per-model load options (spn_engine_load_opts). */
typedef struct spn_model_opts {
  uint32_t struct_size;  /* sizeof(spn_model_opts_t) */
  const char *device;    /* "cpu" (NULL), "cpu:N", "cuda:N" */
  const char *precision; /* "fp32" (NULL), "tf32" or "fp16": device arithmetic; the CPU is always fp32 */
  const char *fallback;  /* "cpu" (NULL): nodes the device cannot run go to the CPU; "error": refuse */
  int32_t no_graphs;     /* 1: never replay runs as CUDA Graphs (debugging; also SPINDLE_NO_CUDA_GRAPHS=1) */
  /* Peers: other devices that will load the same file with the same options
   * soon (a stage's instances on the other GPUs). When this load reads the
   * file, it loads the model for each peer not loaded yet too, from the one
   * read: on CUDA devices with NCCL, the weights prepared on `device` are
   * broadcast to the peers (ncclBroadcast) instead of each peer converting
   * and uploading its own; without NCCL, or with peer_uploads = 1 (also
   * SPINDLE_NCCL_BROADCAST=0), or if the broadcast fails, each peer uploads
   * from the host. A later load on a peer takes that model; models loaded
   * for peers that no load has taken are freed by spn_engine_trim and with
   * the engine. A peer that cannot load is skipped: its own load reports
   * why. */
  int32_t n_peers;
  const char *const *peers;
  int32_t peer_uploads;
  int32_t reserved[3];
} spn_model_opts_t;

#define SPN_MODEL_OPTS_INIT {.struct_size = sizeof(spn_model_opts_t)}

/* spn_engine_load / spn_engine_load_memory with options (opts NULL: the
 * defaults). The registry shares a model only between loads with the same
 * device, precision and fallback. Ownership: *out holds one reference
 * (spn_model_release); opts and data borrowed for the call. Thread: any
 * (the registry is locked). */
SPN_API int32_t spn_engine_load_opts(spn_engine_t *eng, const char *path, const spn_model_opts_t *opts,
                                     spn_model_t **out, spn_error_t *err);
SPN_API int32_t spn_engine_load_memory_opts(spn_engine_t *eng, const void *data, size_t len,
                                            const char *name, const spn_model_opts_t *opts,
                                            spn_model_t **out, spn_error_t *err);

/* Drop one reference and set *model to NULL; the last one frees the model.
 * Ownership: consumes *model. Thread: any. */
SPN_API void spn_model_release(spn_model_t **model);

/* Inspection. Index i is in [0, count). shape[] receives up to
 * SPN_TENSOR_MAX_DIMS dims with -1 for a dynamic dimension.
 * Ownership: the strings are the model's and live as long as it; the other
 * outputs are the caller's, filled. Thread: any. */
SPN_API int32_t spn_model_input_count(const spn_model_t *m);
SPN_API int32_t spn_model_output_count(const spn_model_t *m);
SPN_API int32_t spn_model_input_info(const spn_model_t *m, int32_t i, const char **name,
                                     int32_t *dtype, int32_t *ndim, int64_t *shape);
SPN_API int32_t spn_model_output_info(const spn_model_t *m, int32_t i, const char **name,
                                      int32_t *dtype, int32_t *ndim, int64_t *shape);
/* Position of the input/output called `name`, or -1.
 * Ownership: name borrowed. Thread: any. */
SPN_API int32_t spn_model_input_index(const spn_model_t *m, const char *name);
SPN_API int32_t spn_model_output_index(const spn_model_t *m, const char *name);
/* Number of parameters (elements of float initializers as loaded).
 * Ownership: none. Thread: any. */
SPN_API int64_t spn_model_param_count(const spn_model_t *m);
/* Multiply-adds x2 per sample (batch 1) for Conv, ConvTranspose, MatMul,
 * Gemm; other operators are not counted. Ownership: none. Thread: any. */
SPN_API double spn_model_flops(const spn_model_t *m);
/* Operator histogram of the graph as loaded (before passes): entry i gives
 * the op name and node count; returns the number of distinct ops.
 * Ownership: *op is the model's (a static name). Thread: any. */
SPN_API int32_t spn_model_op_histogram(const spn_model_t *m, int32_t i, const char **op,
                                       int32_t *count);
/* Number of nodes that run after the graph passes (folding, fusion).
 * Ownership: none. Thread: any. */
SPN_API int32_t spn_model_node_count(const spn_model_t *m);
/* The device the model was loaded on ("cpu", "cuda:0").
 * Ownership: the model's, valid as long as it. Thread: any. */
SPN_API const char *spn_model_device(const spn_model_t *m);
/* Number of nodes placed on the CPU because the device cannot run them.
 * Ownership: none. Thread: any. */
SPN_API int32_t spn_model_fallback_count(const spn_model_t *m);
/* Where the model's weights came from, one line for logs: "read from the
 * file" (with the peers' outcome when it loaded peers too, or why their
 * broadcast failed), "weights broadcast from cuda:0" (NCCL on GPUs),
 * "parsed from the file read for cuda:0", "loaded from memory"
 * (spn_model_opts_t.peers). Ownership: the model's, valid as long as it.
 * Thread: any. */
SPN_API const char *spn_model_origin(const spn_model_t *m);

/* Run the model. See the header comment for the output allocation rule.
 * inputs: n_in == spn_model_input_count, host memory, dtype as declared.
 * Ownership: inputs borrowed for the call; an output the engine allocates
 * (data NULL on entry) is the caller's (spn_model_output_free), a caller
 * buffer stays the caller's. Thread: any, concurrently on one model. */
SPN_API int32_t spn_model_run(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in,
                              spn_tensor_t *outputs, int32_t n_out, spn_error_t *err);

/* Run with tensors in host or device memory, on the caller's stream.
 *   - An input whose device_kind/device_index name the model's device
 *     ("cuda:N": SPN_DEVICE_CUDA, N) is device memory, used in place (if a
 *     node that fell back to the CPU reads it, it is first copied to the
 *     host). Host inputs work as in spn_model_run. Any other device is
 *     SPN_EINVAL.
 *   - An output with the model's device_kind/device_index is the caller's
 *     device buffer (data must be set; dtype/ndim/shape must equal what the
 *     model produces: spn_model_output_shapes() tells), written in place.
 *     Host outputs follow spn_model_run's rule.
 *   - stream: the caller's native stream (a cudaStream_t for "cuda:N"), or
 *     NULL for the backend's own. The run is enqueued on it after the work
 *     already there. When every output is in device memory the call returns
 *     without waiting for the device: the outputs are ready, and the inputs
 *     may be reused, once the stream's work up to here is done (record an
 *     event or synchronise the stream). With any host output it waits, as
 *     spn_model_run does.
 * On a CPU model, device tensors are refused and stream is ignored.
 * Ownership: as spn_model_run; device tensors and stream stay the caller's
 * and must outlive the enqueued work. Thread: any, concurrently on one
 * model (one stream per thread). */
SPN_API int32_t spn_model_run_on(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in,
                                 spn_tensor_t *outputs, int32_t n_out, void *stream, spn_error_t *err);

/* The dtype, ndim and shape every output would have for these inputs (only
 * their shapes, dtypes and, for device tensors, device are read; no data is
 * touched): fills outputs[i] except data and device. Ownership: inputs
 * borrowed; outputs are the caller's, filled. Thread: any. */
SPN_API int32_t spn_model_output_shapes(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in,
                                        spn_tensor_t *outputs, int32_t n_out, spn_error_t *err);

/* One node's time in a profiled run (spn_model_profile). */
typedef struct spn_node_time {
  const char *op;     /* its ONNX operator ("Conv") */
  const char *name;   /* its name in the file (or one made from its position) */
  const char *device; /* the backend that ran it: "cpu", "cuda:0", ... */
  int32_t fused;      /* operators fused into it (activations, a residual Add, ...) */
  int32_t index;      /* its position among the model's nodes */
  double ms;          /* wall time from queueing it, with the copies of its inputs
                         from another backend, until its device was done */
} spn_node_time_t;

/* spn_model_run, node by node: each node's work (a device's included) is
 * waited for before the next one starts, and timed; nothing is replayed as
 * a CUDA Graph. The times add up to more than a normal run takes (every
 * wait, and no overlap): read them as each node's share, to see where a
 * model's time goes. times[0 .. min(max, *n_times)) get the nodes run, in
 * order; *n_times is how many ran (more than max: the rest are not
 * recorded). Outputs as spn_model_run (host memory). The strings live as
 * long as the model. Ownership: as spn_model_run; times the caller's.
 * Thread: any, concurrently on one model. */
SPN_API int32_t spn_model_profile(spn_model_t *m, const spn_tensor_t *inputs, int32_t n_in, spn_tensor_t *outputs,
                                  int32_t n_out, spn_node_time_t *times, int32_t max, int32_t *n_times,
                                  spn_error_t *err);

/* Free an output the engine allocated in spn_model_run and set data NULL.
 * Caller-provided buffers must not be passed here. It takes the tensor, not
 * a T **: the tensor is the caller's value (often an array element), and
 * only its data goes; t->data is set to NULL, so a second call is harmless.
 * Ownership: consumes t->data; t stays the caller's. Thread: any. */
SPN_API void spn_model_output_free(spn_tensor_t *t);

#ifdef __cplusplus
}
#endif
#endif
