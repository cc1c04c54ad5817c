/* spindle/runtime.h — the host side: runtime, plugins, pipelines, jobs.
 *
 * What the `spindle` CLI, the job service and embedding applications use.
 * (Stage plugins use spindle/plugin.h only.)
 *
 * A runtime owns the control loop thread (libuv), the executors (a CPU worker
 * pool, and a thread per stage instance placed on a device: spn_device_threads_t),
 * the plugin registry and the model engine.
 * There is no process-wide state: any number of runtimes may live in one
 * process, and any number of pipelines in one runtime.
 */
#ifndef SPINDLE_RUNTIME_H
#define SPINDLE_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"
#include "spindle/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_runtime spn_runtime_t;
typedef struct spn_pipeline spn_pipeline_t;
typedef struct spn_job spn_job_t;
typedef struct spn_job_params spn_job_params_t;

typedef enum spn_log_format {
  SPN_LOG_FORMAT_AUTO = 0, /* text on a TTY, JSON otherwise */
  SPN_LOG_FORMAT_TEXT = 1,
  SPN_LOG_FORMAT_JSON = 2,
} spn_log_format_t;

typedef struct spn_runtime_opts {
  uint32_t struct_size;
  /* "auto" (every CUDA device, else the CPU), "cpu", "cpu:4" (four emulated
   * devices on the CPU), "cuda", "cuda:0,1". NULL = "auto". */
  const char *devices;
  /* Plugin directories searched in order: these (CLI flags), then
   * $SPINDLE_PLUGIN_PATH (colon separated), then [plugins] path in the
   * pipeline config, then the install directory. */
  const char *const *plugin_paths;
  size_t n_plugin_paths;
  uint32_t cpu_threads;        /* CPU executor pool size; 0 = number of cores */
  int32_t log_level;           /* spn_log_level_t */
  int32_t log_format;          /* spn_log_format_t */
  int log_fd;                  /* where logs go; -1 = stderr */
  /* Edge capacity (messages in flight per edge) unless a config says. */
  uint32_t edge_capacity;
  /* Threads on a device (a GPU, or an emulated cpu:N one): spn_device_threads_t.
   * SPN_DEVICE_THREADS_AUTO: $SPINDLE_DEVICE_THREADS ("stage" or "device"),
   * else per stage. */
  int32_t device_threads;
} spn_runtime_opts_t;

/* How stage instances placed on a device get threads and streams:
 *  - STAGE (the default): each instance has its own executor thread and its
 *    own stream on the device, so one stage's host work and waits (a
 *    decoder's, a download's) do not hold the others, and their GPU work
 *    overlaps; device buffers cross between them with readiness events.
 *  - DEVICE: every instance on the device shares the device's one thread
 *    and stream (Spindle's first placement; kept for comparison). */
typedef enum spn_device_threads {
  SPN_DEVICE_THREADS_AUTO = 0,
  SPN_DEVICE_THREADS_STAGE = 1,
  SPN_DEVICE_THREADS_DEVICE = 2,
} spn_device_threads_t;

#define SPN_RUNTIME_OPTS_INIT {.struct_size = sizeof(spn_runtime_opts_t), .log_level = SPN_LOG_INFO, .log_fd = -1}

/* Start a runtime: devices opened, loop thread running.
 * Ownership: caller owns *out (spn_runtime_free). Thread: any. */
SPN_API int32_t spn_runtime_new(const spn_runtime_opts_t *opts, spn_runtime_t **out, spn_error_t *err);
/* Stop and free; cancels running jobs and frees pipelines still alive.
 * Sets *rt to NULL. Thread: any but the runtime's own threads. Ownership: consumes *rt, sets it to NULL. */
SPN_API void spn_runtime_free(spn_runtime_t **rt);

/* Number of devices and a description ("cpu:2", "cuda:0 NVIDIA A10G").
 * Ownership: arguments borrowed. Thread: any. */
SPN_API uint32_t spn_runtime_device_count(const spn_runtime_t *rt);
SPN_API const char *spn_runtime_device_name(const spn_runtime_t *rt, uint32_t i);
/* Quarantine (drain) device i: no new work is placed on it, and every
 * running job that touched it starts again on the usable devices (a new
 * attempt, from its first frame; at most 3 times per job). The runtime
 * calls it itself when NVML reports a fatal XID (48, 79, 94, 95, ...), an
 * uncorrectable ECC error or a GPU that fell off the bus; an operator may
 * call it to take a device out of service. A quarantined device stays so
 * for the runtime's life (recovery needs a GPU reset). The event is logged
 * (event "device_quarantined") and counted. Returns SPN_EINVAL for a bad
 * index, SPN_OK otherwise (also when it already was). Ownership: why is
 * borrowed (copied into the log). Thread: any. */
SPN_API int32_t spn_runtime_device_quarantine(spn_runtime_t *rt, uint32_t i, const char *why);
/* Whether device i takes work, and how many do: a device is usable unless
 * it was quarantined, or it is a GPU the health monitor marks unusable
 * (lost, fatal XID) before the runtime has quarantined it. /readyz is
 * false when none is. Ownership: none. Thread: any. */
SPN_API bool spn_runtime_device_usable(const spn_runtime_t *rt, uint32_t i);
SPN_API uint32_t spn_runtime_usable_device_count(const spn_runtime_t *rt);
/* Counters since start, for metrics: devices quarantined, and job attempts
 * restarted because a device they used was. Ownership: none. Thread: any. */
SPN_API uint64_t spn_runtime_quarantine_count(const spn_runtime_t *rt);
SPN_API uint64_t spn_runtime_job_restart_count(const spn_runtime_t *rt);
/* Log records at SPN_LOG_WARN or SPN_LOG_ERROR (level) since start, the
 * runtime's and its stages' (a model not fetched and replaced by a built-in
 * one is a warning), counted whatever the log level. Ownership: none.
 * Thread: any. */
SPN_API uint64_t spn_runtime_log_count(const spn_runtime_t *rt, int32_t level);
/* Bytes the runtime copied on pipeline edges with device i's streams
 * (i < spn_runtime_device_count), or with the host's (i == the count: the
 * CPU side of stages placed on no device), in direction dir
 * (spn_copy_dir_t: a host-to-device copy counts on the GPU it fills, a
 * device-to-host copy on the GPU it drains, a device-to-device copy on the
 * receiving GPU). 0 for other i or dir. Thread: any. Ownership: none. */
SPN_API uint64_t spn_runtime_device_bytes_copied(const spn_runtime_t *rt, uint32_t i, int32_t dir);

/* Load one plugin file, or every libspindle-*.so of the search path. A
 * refused plugin returns SPN_EABI (or another code) with a message that
 * names the file and the rule; spn_runtime_load_plugins keeps going past
 * refusals and reports the first in err. Thread: any. Ownership: arguments borrowed. */
SPN_API int32_t spn_runtime_load_plugin(spn_runtime_t *rt, const char *path, spn_error_t *err);
SPN_API int32_t spn_runtime_load_plugins(spn_runtime_t *rt, spn_error_t *err);

/* Registered stage kinds, for `spindle plugins`. Ownership: arguments borrowed. Thread: any. */
SPN_API size_t spn_runtime_kind_count(const spn_runtime_t *rt);
SPN_API const spn_stage_kind_t *spn_runtime_kind_at(const spn_runtime_t *rt, size_t i, const char **plugin_file);

/* ---- pipelines ---------------------------------------------------------- */

/* Parse, validate and build a pipeline from TOML: unknown kinds, unknown
 * or mistyped keys, missing required keys, dangling inputs, cycles and port
 * type mismatches are refused before anything runs, with
 * "file:line:col: stage "x": reason". `overrides` are "stage.key=value"
 * strings (CLI --set) applied before validation. Stage instances are
 * created and preloaded (models loaded) before this returns.
 * Ownership: caller owns *out (spn_pipeline_free). Thread: any. */
SPN_API int32_t spn_pipeline_load(spn_runtime_t *rt, const char *path, const char *const *overrides,
                                  size_t n_overrides, spn_pipeline_t **out, spn_error_t *err);
/* Same from a TOML string; `name` is used in messages.
 * Ownership: caller owns *out (spn_pipeline_free); toml borrowed. Thread: any but the runtime's own. */
SPN_API int32_t spn_pipeline_load_string(spn_runtime_t *rt, const char *toml, size_t len, const char *name,
                                         const char *const *overrides, size_t n_overrides,
                                         spn_pipeline_t **out, spn_error_t *err);
/* Validate only (no instances, no models): for `spindle validate`.
 * Ownership: borrowed. Thread: any but the runtime's own. */
SPN_API int32_t spn_pipeline_validate(spn_runtime_t *rt, const char *path, const char *const *overrides,
                                      size_t n_overrides, spn_error_t *err);
/* Job bindings: the names a job uses for its files and params, each bound
 * to a per-job stage key by the pipeline config:
 *   [pipeline.inputs]  video = "decode.path"
 *   [pipeline.outputs] video = "encode.path"
 *   [pipeline.params]  frames = "source.frames"
 * An input or a param may set several keys (video = ["decode.path",
 * "melspec.video"]): it is then one binding per key, of the same name, in
 * the config's order. They are validated at load (the stage exists, the key
 * is SPN_CONFIG_PER_JOB; inputs and outputs bind string or path keys; no
 * key is bound twice). */
typedef enum spn_binding_kind {
  SPN_BINDING_INPUT = 0,
  SPN_BINDING_OUTPUT = 1,
  SPN_BINDING_PARAM = 2,
} spn_binding_kind_t;

/* Number of bindings of that kind. Thread: any. Ownership: arguments borrowed. */
SPN_API size_t spn_pipeline_binding_count(const spn_pipeline_t *pipe, spn_binding_kind_t kind);
/* The i-th binding of that kind: returns its name and sets *target to
 * "stage.key"; NULL when i is out of range. Ownership: borrowed from pipe. Thread: any. */
SPN_API const char *spn_pipeline_binding_at(const spn_pipeline_t *pipe, spn_binding_kind_t kind, size_t i,
                                            const char **target);
/* An optional input's default ([pipeline.inputs] name = { key = "stage.key",
 * default = "video" }): the name of the input whose file it takes when a
 * job does not give it; NULL when a job must give it (or i is out of
 * range). Ownership: borrowed from pipe. Thread: any. */
SPN_API const char *spn_pipeline_binding_default(const spn_pipeline_t *pipe, spn_binding_kind_t kind, size_t i);
/* The type and flags (SPN_CONFIG_PER_JOB, ...) of the key a "stage.key"
 * target names; SPN_ENOENT when the pipeline has no such stage or its
 * kind no such key. Thread: any. Ownership: arguments borrowed. */
SPN_API int32_t spn_pipeline_key_type(const spn_pipeline_t *pipe, const char *target, spn_config_type_t *type,
                                      uint32_t *flags);
/* Check a job's overrides as spn_job_start would (unknown stage or key, a
 * key that is not per job, a wrong type or range) without starting it.
 * Thread: any. Ownership: arguments borrowed. */
SPN_API int32_t spn_pipeline_check_job(const spn_pipeline_t *pipe, const spn_job_params_t *params,
                                       spn_error_t *err);
/* Waits for the pipeline's jobs to end (cancelling them) and frees it.
 * Thread: any but the runtime's own (not from on_done or a stage). Ownership: consumes *pipe, sets it to NULL. */
SPN_API void spn_pipeline_free(spn_pipeline_t **pipe);
/* The [pipeline] name ("" when the config gives none). Ownership: borrowed
 * from pipe, valid for its life. Thread: any. */
SPN_API const char *spn_pipeline_name(const spn_pipeline_t *pipe);

/* Warnings the pipeline's stages logged outside any job, from the load on
 * (a model the config marks optional replaced by a built-in one), kept and
 * cut as spn_job_warning's. Ownership: buf is the caller's. Thread: any. */
SPN_API uint64_t spn_pipeline_warning_count(const spn_pipeline_t *pipe);
SPN_API int32_t spn_pipeline_warning(const spn_pipeline_t *pipe, size_t i, char *buf, size_t size);

/* Per-stage time: the number of [[stage]]s, and for stage i (config order) its
 * name and *busy_ns, the wall time its instances have spent inside the kind's
 * process/generate/flush callbacks since the pipeline was loaded, summed over
 * replicas and jobs (so it may exceed elapsed time when instances run in
 * parallel; it includes time a callback waits to emit into a full mailbox).
 * Returns NULL when i is out of range. Thread: any; the figures are read
 * atomically while jobs run. Ownership: arguments borrowed. */
SPN_API size_t spn_pipeline_stage_count(const spn_pipeline_t *pipe);
SPN_API const char *spn_pipeline_stage_time(const spn_pipeline_t *pipe, size_t i, uint64_t *busy_ns);
/* Whether stage i (0 ..< spn_pipeline_stage_count) is inside one of its
 * calls (job_open, process, generate, flush) now: returns its name (NULL
 * when i is out of range) and sets *seconds to how long the longest current
 * call of its instances has run (0: none is in a call). A job service uses
 * it to name the stage that did not stop after a cancel. Thread: any.
 * Ownership: arguments borrowed; the name is pipe's. */
SPN_API const char *spn_pipeline_stage_in_call(const spn_pipeline_t *pipe, size_t i, double *seconds);
/* The name of stage i's kind ("encode_av"), NULL when i is out of range.
 * Thread: any. Ownership: pipe's. */
SPN_API const char *spn_pipeline_stage_kind(const spn_pipeline_t *pipe, size_t i);
/* Stage i's stream time: for instances placed on a device, the device time
 * their stream spent on the work queued by each process/generate/flush
 * call, from a timed event recorded on the stream before the call to one
 * after it, summed over replicas and jobs (*stream_ns), and how many calls
 * were timed (*timed_calls; 0: not measured — the stage runs on the CPU
 * pool, or its device cannot time). On a GPU, busy time is what a stage
 * costs the host and stream time what it costs the GPU; the stream time
 * also holds what the stream waited for the host to queue work during the
 * call, and the time other streams' work shared the GPU with it. A pair is
 * read once complete, at the latest when the job ends. Returns NULL when i
 * is out of range. Thread: any. Ownership: arguments borrowed. */
SPN_API const char *spn_pipeline_stage_stream_time(const spn_pipeline_t *pipe, size_t i, uint64_t *stream_ns,
                                                   uint64_t *timed_calls);

/* Per-edge traffic (ABI 1.1 memory kinds and formats): one entry per edge
 * of the validated pipeline, conversions the runtime inserted included.
 * Copies are counted per direction: host to device, device to host,
 * device to device (peer copies between GPUs; emulated on cpu:N) and host
 * to host (pageable <-> pinned). ns is host wall time spent issuing the
 * copies, plus waiting for those into host memory. */
typedef enum spn_copy_dir { SPN_COPY_H2D = 0, SPN_COPY_D2H = 1, SPN_COPY_D2D = 2, SPN_COPY_H2H = 3 } spn_copy_dir_t;

typedef struct spn_edge_stats {
  const char *from_stage, *from_port; /* borrowed for the pipeline's life */
  const char *to_stage, *to_port;
  int32_t pixel_format;   /* negotiated spn_pixel_format_t of plugin.h, 0 = not constrained */
  const char *format;     /* its name ("yuv420p"), "any" when not constrained */
  int32_t mem_kind;       /* spn_mem_kind_t the consumer takes */
  bool converted;         /* the consumer is a conversion the runtime inserted (convert = "auto") */
  uint64_t messages;      /* data messages delivered */
  uint64_t items_passed;  /* tensor items handed over without a copy */
  uint64_t copies[4];     /* tensor items copied, by spn_copy_dir_t */
  uint64_t bytes[4];
  uint64_t ns[4];
} spn_edge_stats_t;

/* Number of edges, and edge i's figures (read atomically while jobs run).
 * Returns SPN_EINVAL when i is out of range. Ownership: *out is the
 * caller's, filled; its strings are borrowed for the pipeline's life.
 * Thread: any. */
SPN_API size_t spn_pipeline_edge_count(const spn_pipeline_t *pipe);
SPN_API int32_t spn_pipeline_edge_stats(const spn_pipeline_t *pipe, size_t i, spn_edge_stats_t *out);
/* Copies a stage made itself (host->buffer_copy of plugin.h: uploads,
 * downloads and peer copies inside its callbacks), and the copies made for
 * one job (see spn_job_transfers): by spn_copy_dir_t, how many, their bytes
 * and ns, the host wall time spent issuing them (a copy queued on a GPU
 * stream is not waited for; on an edge, one into host memory is). */
typedef struct spn_transfer_stats {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t copies[4];
  uint64_t bytes[4];
  uint64_t ns[4];
} spn_transfer_stats_t;

#define SPN_TRANSFER_STATS_INIT {.struct_size = sizeof(spn_transfer_stats_t)}

/* Stage i's own copies (config order), summed over replicas and jobs since
 * the pipeline was loaded: what its instances copied with buffer_copy, not
 * what the runtime copied on its input edges (spn_pipeline_edge_stats).
 * Returns the stage's name, NULL when i is out of range (*out untouched).
 * Ownership: *out is the caller's, filled whole (struct_size included);
 * the name is borrowed for the pipeline's life. Thread: any (read
 * atomically while jobs run). */
SPN_API const char *spn_pipeline_stage_transfers(const spn_pipeline_t *pipe, size_t i, spn_transfer_stats_t *out);
/* Per-stage histograms since the pipeline was loaded, summed over replicas
 * and jobs: the wall time of each process/generate call (latency_bucket[k]
 * counts calls that took at most spn_stage_latency_bounds_s[k]; the last
 * bucket is +Inf), and the number of messages handed to each process call
 * (batch_bucket[k]: at most 2^k messages; the last is +Inf). Counts are per
 * bucket, not cumulative. Returns the stage's name, NULL when i is out of
 * range. Thread: any (read atomically while jobs run). */
#define SPN_STAGE_LATENCY_BUCKETS 12
#define SPN_STAGE_BATCH_BUCKETS 9
SPN_API extern const double spn_stage_latency_bounds_s[SPN_STAGE_LATENCY_BUCKETS - 1];
typedef struct spn_stage_stats {
  uint32_t struct_size;
  uint64_t calls;    /* process + generate calls */
  uint64_t call_ns;  /* their summed wall time */
  uint64_t latency_bucket[SPN_STAGE_LATENCY_BUCKETS];
  bool processes;    /* the stage's kind takes messages (has process): not a pure source */
  uint64_t batches;  /* process calls */
  uint64_t messages; /* messages handed to them */
  uint64_t batch_bucket[SPN_STAGE_BATCH_BUCKETS];
} spn_stage_stats_t;
/* Stage i's histograms (see above) into *out (the whole struct is written,
 * struct_size included). Ownership: *out is the caller's, filled; the returned name is
 * borrowed for the pipeline's life. Thread: any. */
SPN_API const char *spn_pipeline_stage_stats(const spn_pipeline_t *pipe, size_t i, spn_stage_stats_t *out);

/* ---- jobs --------------------------------------------------------------- */

typedef enum spn_job_state {
  SPN_JOB_QUEUED = 0,
  SPN_JOB_RUNNING = 1,
  SPN_JOB_SUCCEEDED = 2,
  SPN_JOB_FAILED = 3,
  SPN_JOB_CANCELLED = 4,
} spn_job_state_t;

typedef struct spn_job_progress {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t job_id;
  int64_t done;        /* units (frames) finished at the pipeline's sinks */
  int64_t total;       /* -1 when unknown */
  double elapsed_s;
} spn_job_progress_t;

typedef struct spn_job_callbacks {
  uint32_t struct_size;
  void *data;
  /* Called from a runtime thread; must not block. Optional. */
  void (*on_progress)(void *data, const spn_job_progress_t *p);
  /* Called exactly once when the job ends, from a runtime thread. status is
   * SPN_OK, SPN_ECANCELLED or the error; msg names the input and stage. */
  void (*on_done)(void *data, uint64_t job_id, int32_t status, const char *msg);
} spn_job_callbacks_t;

struct spn_job_params {
  uint32_t struct_size;
  uint64_t job_id;              /* 0 = assigned by the runtime */
  int32_t priority;             /* higher first */
  /* Per-job overrides "stage.key=value" of SPN_CONFIG_PER_JOB keys (input
   * and output paths, params). Others are refused. */
  const char *const *overrides;
  size_t n_overrides;
};

#define SPN_JOB_PARAMS_INIT {.struct_size = sizeof(spn_job_params_t)}

/* Start a job on a loaded pipeline. If this returns an error, on_done is
 * never called (libuv's rule). Ownership: caller owns *out and releases it
 * with spn_job_free after on_done (or to detach). Thread: any. */
SPN_API int32_t spn_job_start(spn_pipeline_t *pipe, const spn_job_params_t *params,
                              const spn_job_callbacks_t *cb, spn_job_t **out, spn_error_t *err);
/* Request cancellation; stages stop between batches, partial outputs are
 * removed, on_done gets SPN_ECANCELLED. Thread: any. Ownership: borrowed. */
SPN_API void spn_job_cancel(spn_job_t *job);
/* Block until the job ends; returns its status and copies its message.
 * Thread: any but the runtime's own (not from on_done or a stage).
 * Ownership: borrowed; err receives a copy of the job's message. */
SPN_API int32_t spn_job_wait(spn_job_t *job, spn_error_t *err);
/* The job's id (assigned at start). Ownership: none. Thread: any. */
SPN_API uint64_t spn_job_id(const spn_job_t *job);
/* Device-seconds of the job so far: the time its stage instances placed on
 * devices (GPUs, or emulated cpu:N devices) spent in process/generate/flush
 * for it, summed over stages, devices and attempts (a batch's time is split
 * evenly among its frames). CPU-pool stages are not counted.
 * Ownership: none. Thread: any. */
SPN_API double spn_job_device_seconds(const spn_job_t *job);
/* Copies made for the job so far, every attempt: those the runtime made on
 * the pipeline's edges for its messages, plus those its stages made with
 * buffer_copy naming its id. Figures as in spn_transfer_stats_t. A NULL job
 * gives zeros. Ownership: *out is the caller's, filled whole (struct_size
 * included). Thread: any (read atomically while the job runs). */
SPN_API void spn_job_transfers(const spn_job_t *job, spn_transfer_stats_t *out);
/* Times the job was restarted after a device it used was quarantined.
 * Ownership: none. Thread: any. */
SPN_API uint32_t spn_job_restarts(const spn_job_t *job);
/* Warnings the job's stages logged naming it (SPN_LOG_WARN and above,
 * whatever the log level): damaged input accepted, a codec or decoder
 * replaced, ... spn_job_warning_count is how many there were; the first 16
 * are kept, each "STAGE: message" cut at 400 bytes, and spn_job_warning
 * copies kept line i into buf (cut to size), SPN_EINVAL when i is not
 * kept. Warnings a stage logs outside any job (a model replaced by a
 * built-in one at load) are the pipeline's: spn_pipeline_warning.
 * Ownership: buf is the caller's. Thread: any (on_done included). */
SPN_API uint64_t spn_job_warning_count(const spn_job_t *job);
SPN_API int32_t spn_job_warning(const spn_job_t *job, size_t i, char *buf, size_t size);
/* Every warning that concerns the job, in order: its pipeline's
 * (spn_pipeline_warning), then its own (spn_job_warning), each line handed
 * to fn; where a source logged more lines than it kept, "... N more
 * warnings: see WHERE" follows its lines. What a job status or a run's
 * summary lists. Ownership: arguments borrowed. Thread: any. */
SPN_API void spn_job_warnings_each(const spn_job_t *job, const char *where,
                                   void (*fn)(void *user, const char *line), void *user);
/* Drop the caller's handle and set *job to NULL; a job still running goes
 * on (detached) and on_done is still called. Ownership: consumes *job.
 * Thread: any, on_done included. */
SPN_API void spn_job_free(spn_job_t **job);

#ifdef __cplusplus
}
#endif
#endif
