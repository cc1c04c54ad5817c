/* spindle/plugin.h — the stage plugin ABI, version 1.1.
 *
 * This is the only header a stage plugin includes. A plugin is a shared
 * object named `libspindle-<name>.so` that exports exactly one symbol the host
 * looks up: `const spn_plugin_desc_t *spindle_plugin_<name>_desc(void)`
 * (use SPN_PLUGIN_DEFINE). It never links against host symbols: everything
 * it needs from the host comes through the spn_host_api_t table handed to
 * init() and reachable from every stage callback with spn_stage_host(stage)
 * (ABI 1.1), and everything the host needs from it comes through the
 * descriptor and the stage kinds it registers.
 *
 * ABI rules (enforced by the loader, each refusal names the file and rule):
 *   - abi_major must equal the host's SPN_PLUGIN_ABI_MAJOR;
 *   - abi_minor must not be newer than the host's SPN_PLUGIN_ABI_MINOR;
 *   - the build signature (pointer size, CUDA major) must match the host's;
 *   - desc->name must equal the <name> in the file name;
 *   - struct_size must be at least the v1.0 size and no larger than the
 *     host knows (a larger struct comes from a newer header: refused);
 *   - reserved fields must be zero.
 * Every struct that crosses the boundary starts with uint32_t struct_size,
 * has an ..._INIT macro, and only ever grows at the end.
 *
 * Threads: init/fini run on the loading thread. A stage instance's callbacks
 * run on the executor that owns the instance (one CPU worker or one GPU
 * thread), one call at a time; different instances run concurrently. A
 * stage never blocks its executor on I/O it could avoid and never touches
 * global state: two pipelines in one process must not interfere.
 */
#ifndef SPINDLE_PLUGIN_H
#define SPINDLE_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"
#include "spindle/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPN_PLUGIN_ABI_MAJOR 1
#define SPN_PLUGIN_ABI_MINOR 1

/* CUDA major the plugin was built against; 0 when it uses no CUDA. A plugin
 * that uses CUDA defines SPN_PLUGIN_CUDA_MAJOR before including this header
 * (e.g. -DSPN_PLUGIN_CUDA_MAJOR=13). */
#ifndef SPN_PLUGIN_CUDA_MAJOR
#define SPN_PLUGIN_CUDA_MAJOR 0
#endif

/* ---- opaque handles (each has a user pointer reachable via the host) ---- */
typedef struct spn_plugin spn_plugin_t;         /* a loaded plugin, during init */
typedef struct spn_stage spn_stage_t;           /* one stage instance (replica); see spn_stage_host */
typedef struct spn_msg spn_msg_t;               /* a message: envelope + items */
typedef struct spn_buffer spn_buffer_t;         /* refcounted device-tagged memory */
typedef struct spn_model spn_model_t;           /* a model loaded on a device */

/* ---- messages ---------------------------------------------------------- */

enum spn_msg_flags {
  SPN_MSG_EOS = 1u << 0,  /* end of this job's stream on this edge (no items) */
  SPN_MSG_SKIP = 1u << 1, /* keeps the seq dense when a stage drops a frame */
  SPN_MSG_KEY = 1u << 2,  /* a frame a segment may start at */
};

/* The envelope every message carries. seq is dense per job and per edge
 * (0, 1, 2, ...): fan-in points re-order by it. pts is in seconds. */
typedef struct spn_envelope {
  uint32_t struct_size;
  uint32_t flags;      /* spn_msg_flags */
  uint64_t job_id;
  uint32_t stream;     /* e.g. 0 video, 1 audio; a stage's own convention */
  uint32_t reserved0;
  uint64_t seq;
  double pts;
  int64_t total;       /* expected number of seqs in this job, -1 unknown */
} spn_envelope_t;

/* An item of a message: a tensor (frame, mel chunk, ...) backed by a
 * buffer, or metadata (a typed POD blob such as face boxes). */
typedef enum spn_item_kind {
  SPN_ITEM_TENSOR = 1,
  SPN_ITEM_META = 2,
} spn_item_kind_t;

typedef struct spn_item {
  uint32_t struct_size;
  int32_t kind;              /* spn_item_kind_t */
  const char *name;          /* "frame", "faces", "mel", ... */
  spn_tensor_t tensor;       /* SPN_ITEM_TENSOR: view into `buffer` */
  spn_buffer_t *buffer;      /* SPN_ITEM_TENSOR: borrowed from the message */
  const void *meta;          /* SPN_ITEM_META: borrowed */
  size_t meta_size;
} spn_item_t;

/* Well-known metadata: face detections on a frame. Stages exchange it as an
 * SPN_ITEM_META named "faces" holding n spn_face_t back to back. */
typedef struct spn_face {
  float x0, y0, x1, y1;      /* box in frame pixels */
  float score;
  float landmarks[10];       /* 5 (x,y) points; all zero when absent */
  int32_t track_id;
  int32_t reserved;
} spn_face_t;

/* ---- configuration schema (data, not code) ----------------------------- */

typedef enum spn_config_type {
  SPN_CONFIG_STRING = 1, /* char* in the struct; host-owned, valid for the owner's life */
  SPN_CONFIG_INT = 2,    /* int64_t */
  SPN_CONFIG_FLOAT = 3,  /* double; integers are accepted */
  SPN_CONFIG_BOOL = 4,   /* bool */
  SPN_CONFIG_PATH = 5,   /* char*; relative paths resolved against the config file */
} spn_config_type_t;

enum spn_config_flags {
  SPN_CONFIG_REQUIRED = 1u << 0, /* no default: the config must set it */
  SPN_CONFIG_PER_JOB = 1u << 1,  /* may be overridden per job (inputs, outputs, params) */
};

/* One key of a stage's config table. The host parses the [[stage]] table,
 * rejects unknown keys, wrong types, missing required keys and values out of
 * [min, max] with file:line:col, and fills the stage's config struct at
 * `offset`. A schema is an array ending with an entry whose key is NULL. */
typedef struct spn_config_field {
  const char *key;
  int32_t type;          /* spn_config_type_t */
  uint32_t flags;        /* spn_config_flags */
  size_t offset;         /* offsetof(struct my_config, field) */
  const char *doc;       /* one line, shown by `spindle plugins` */
  const char *def_str;   /* default for STRING/PATH (NULL = none) */
  int64_t def_int;       /* default for INT and BOOL (0/1) */
  double def_float;      /* default for FLOAT */
  double min, max;       /* numeric range, checked when min < max */
} spn_config_field_t;

/* ---- ABI 1.1: memory kinds and formats ---------------------------------- */

/* Where a buffer's bytes live (the same values as spindle/device.h). */
#ifndef SPN_MEM_KIND_DEFINED
#define SPN_MEM_KIND_DEFINED
typedef enum spn_mem_kind {
  SPN_MEM_DEVICE = 0, /* the device's own memory (a GPU's; emulated on cpu:N) */
  SPN_MEM_HOST = 1,   /* pageable host memory */
  SPN_MEM_PINNED = 2, /* page-locked host memory (plain host memory on CPU) */
} spn_mem_kind_t;
#endif

/* Sets of memory kinds a port takes or gives: bits (1u << spn_mem_kind_t).
 * HOST in a set also admits PINNED (pinned memory is host memory); PINNED
 * alone asks for pinned memory. */
#define SPN_MEMSET(kind) (1u << (kind))
#define SPN_MEMSET_DEVICE SPN_MEMSET(SPN_MEM_DEVICE)
#define SPN_MEMSET_HOST SPN_MEMSET(SPN_MEM_HOST)
#define SPN_MEMSET_PINNED SPN_MEMSET(SPN_MEM_PINNED)

/* Pixel formats of "video" frames (the same values as spn_pixfmt_t of
 * spindle/image.h). Layouts: rgb24/bgr24 a (H,W,3) u8 tensor; rgbf32p /
 * bgrf32p a (3,H,W) f32 tensor; nv12/yuv420p the tight planes as one (N) u8
 * tensor beside an "image" meta item giving width, height and format. */
typedef enum spn_pixel_format {
  SPN_PIX_RGB24 = 1,
  SPN_PIX_BGR24 = 2,
  SPN_PIX_GRAY8 = 3,
  SPN_PIX_RGBF32P = 4,
  SPN_PIX_BGRF32P = 5,
  SPN_PIX_NV12 = 6,
  SPN_PIX_YUV420P = 7,
} spn_pixel_format_t;

/* Audio sample formats of "audio" items. */
typedef enum spn_sample_format {
  SPN_SAMPLE_F32 = 1,  /* interleaved f32, a (samples, channels) tensor */
  SPN_SAMPLE_S16 = 2,  /* interleaved s16 */
  SPN_SAMPLE_F32P = 3, /* planar f32, a (channels, samples) tensor */
} spn_sample_format_t;

/* Sets of formats: bit (1u << format). 0 means "any" (or not this medium). */
#define SPN_FMTSET(f) (1u << (f))

/* What one port takes (inputs) or can give (outputs). Every zero field means
 * "any", so a zeroed struct (or no table at all, as in ABI 1.0) is: host
 * memory, any format. On an output, several bits mean the stage can give
 * each of them; the runtime picks one per edge when the pipeline is built
 * and tells the stage with host->stage_port_format. Caps are per config,
 * not per placement: an output's DEVICE beside HOST or PINNED reads as
 * device memory where the stage is placed on a GPU and host memory
 * elsewhere (the edge's memory in spn_pipeline_edge_stats); copies follow
 * the memory each buffer is actually in. */
typedef struct spn_port_caps {
  uint32_t struct_size;
  uint32_t mem_kinds;      /* SPN_MEMSET_* bits; 0 = host memory */
  uint32_t pixel_formats;  /* SPN_FMTSET(spn_pixel_format_t) bits; 0 = any */
  uint32_t sample_formats; /* SPN_FMTSET(spn_sample_format_t) bits; 0 = any */
  uint32_t sample_rate;    /* Hz; 0 = any */
  uint32_t channels;       /* 0 = any */
  uint32_t reserved[2];
} spn_port_caps_t;

/* The format chosen for one edge (every field a single value; 0 = not
 * constrained: both ends take anything). */
typedef struct spn_port_format {
  uint32_t struct_size;
  int32_t mem_kind;        /* spn_mem_kind_t the consumer receives */
  int32_t pixel_format;    /* spn_pixel_format_t, 0 = any */
  int32_t sample_format;   /* spn_sample_format_t, 0 = any */
  uint32_t sample_rate;
  uint32_t channels;
  uint32_t reserved[2];
} spn_port_format_t;

/* ---- stage kinds -------------------------------------------------------- */

/* A port: a named input or output with an item type. Connected ports must
 * have equal types, or one of them is "any". Well-known types: "video"
 * (frames: a tensor item "frame" (H,W,3) u8 RGB, or what the consumer asked
 * for), "audio" (a tensor item "pcm"), "faces" (video + "faces" meta),
 * "mel", "any". */
typedef struct spn_port {
  const char *name;
  const char *type;
} spn_port_t;

typedef enum spn_device_need {
  SPN_NEED_CPU = 1,   /* runs on CPU executors only */
  SPN_NEED_CUDA = 2,  /* needs a CUDA device */
  SPN_NEED_EITHER = 3 /* runs on whichever device it is placed on */
} spn_device_need_t;

/* What a job looks like to a stage. */
typedef struct spn_job_info {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t job_id;
  const void *config;    /* the stage's config struct with this job's overrides */
  int32_t priority;
  int32_t reserved1;
} spn_job_info_t;

typedef struct spn_stage_kind {
  uint32_t struct_size;
  uint32_t reserved0;
  const char *name;                     /* the `kind = "..."` in pipeline TOML */
  const char *doc;                      /* one line */
  const spn_config_field_t *schema;     /* NULL-key terminated; may be NULL */
  size_t config_size;                   /* sizeof the config struct */
  const spn_port_t *inputs;             /* n_inputs entries; none for a source */
  uint32_t n_inputs;
  uint32_t n_outputs;
  const spn_port_t *outputs;            /* n_outputs entries; none for a sink */
  int32_t device_need;                  /* spn_device_need_t; 0 = SPN_NEED_CPU */
  uint32_t max_batch;                   /* default batching; 1 (or 0) = no batching */
  uint32_t max_delay_ms;
  uint32_t reserved1;

  /* Create an instance on `device` with its stage-level config. *state is
   * the instance's user pointer (spn_stage_get_data). Thread: executor. */
  int32_t (*create)(spn_stage_t *stage, const void *config, void **state, spn_error_t *err);
  /* Load models and warm up; may be slow. Called once per instance before
   * any job; the worker reports ready only after every preload. Optional. */
  int32_t (*preload)(spn_stage_t *stage, void *state, spn_error_t *err);
  /* A job starts flowing through this instance. *job_state is per job. A
   * failure fails that job only. Optional. */
  int32_t (*job_open)(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                      spn_error_t *err);
  /* Sources only (n_inputs == 0): produce the next messages of a job with
   * host->emit. Called again while output credit allows; return SPN_EOS when
   * the job's stream is complete (the host then sends EOS downstream). */
  int32_t (*generate)(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err);
  /* Process a batch: msgs[i] may belong to different jobs (job_states[i] is
   * the matching job state). Ownership: the messages are borrowed for the
   * call; emit new ones (host->msg_new_from) or forward one with
   * host->emit(..., &msgs[i]) which sets msgs[i] to NULL. A non-OK status
   * fails the jobs of the whole batch; per-job failure: host->fail_job. */
  int32_t (*process)(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                     spn_error_t *err);
  /* End of a job's stream on every input: emit what is left. Optional. */
  int32_t (*flush)(spn_stage_t *stage, void *state, void *job_state, spn_error_t *err);
  /* The job is over (finished, failed or cancelled): free job_state. On
   * failure/cancel `ok` is false and partial outputs must be removed. */
  void (*job_close)(spn_stage_t *stage, void *state, void *job_state, bool ok);
  void (*destroy)(spn_stage_t *stage, void *state);

  void *reserved[8];

  /* ABI 1.1: memory kinds and formats */
  /* Per-port capabilities: input_caps has n_inputs entries, output_caps
   * n_outputs (either may be NULL: host memory, any format). */
  const spn_port_caps_t *input_caps;
  const spn_port_caps_t *output_caps;
  /* Optional: narrow one port's caps by the stage's config (e.g. decode
   * gives only the pixel_format its config names). *caps holds the static
   * entry on entry. Called while a pipeline is validated, on the validating
   * thread: a pure function of the config. */
  int32_t (*port_caps)(const void *config, bool is_output, uint32_t port, spn_port_caps_t *caps, spn_error_t *err);

  /* ABI 1.1: spn_kind_flags (0 for a kind built before they existed) */
  uint32_t flags;
} spn_stage_kind_t;

/* What a stage kind asks of the runtime (spn_stage_kind_t.flags).
 * SPN_KIND_SEES_SKIPS: a kind with no outputs (a sink) also gets the SKIP
 * messages of its inputs in process — no items, SPN_MSG_SKIP set, in seq
 * order among the others — so it can tell a frame a stage dropped on purpose
 * from a lost one and keep its own count of the seqs. Without it a sink
 * never sees a SKIP (the gap is just absent), and a stage with outputs never
 * does either way: the runtime forwards SKIPs past it, keeping seqs dense. */
enum spn_kind_flags {
  SPN_KIND_SEES_SKIPS = 1u << 0,
};

#define SPN_STAGE_KIND_INIT {.struct_size = sizeof(spn_stage_kind_t), .device_need = SPN_NEED_CPU, .max_batch = 1}

/* ABI 1.1: a stage kind initialiser that fills struct_size; list the other
 * members as designated initialisers:
 *
 *   static const spn_stage_kind_t kind = SPN_STAGE_KIND(.name = "invert",
 *       .inputs = in, .n_inputs = 1, .outputs = out, .n_outputs = 1,
 *       .process = invert_process);
 *
 * A 1.1 host reads device_need 0 as SPN_NEED_CPU and max_batch 0 as 1, so
 * they may be left out (a 1.0 host refuses such a kind, but it refuses a
 * 1.1 plugin anyway). */
#define SPN_STAGE_KIND(...) {.struct_size = sizeof(spn_stage_kind_t), __VA_ARGS__}

/* ---- the host API table ------------------------------------------------- */

typedef enum spn_log_level {
  SPN_LOG_DEBUG = 0,
  SPN_LOG_INFO = 1,
  SPN_LOG_WARN = 2,
  SPN_LOG_ERROR = 3,
} spn_log_level_t;

/* Functions the host offers plugins. struct_size first; append-only: a
 * plugin built against an older minor sees a prefix of it and must check
 * struct_size before using a member added later. Thread: any, unless said. */
typedef struct spn_host_api {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t reserved0;

  /* During init only: register a stage kind. The kind struct and every
   * string and table it points to must stay valid until fini.
   * Ownership: kind borrowed (not copied) until fini. Thread: init's. */
  int32_t (*register_kind)(spn_plugin_t *plugin, const spn_stage_kind_t *kind, spn_error_t *err);
  /* The plugin's user pointer, returned to fini. Ownership: data stays the
   * plugin's (fini frees it). Thread: init's. */
  void (*plugin_set_data)(spn_plugin_t *plugin, void *data);

  /* Stage instances. */
  /* The instance's user pointer (what create returned). Ownership: the
   * plugin's. Thread: any. */
  void *(*stage_get_data)(spn_stage_t *stage);
  /* The instance's name, from the config. Ownership: borrowed for the
   * instance's life. Thread: any. */
  const char *(*stage_get_name)(spn_stage_t *stage);
  /* The device the instance is placed on. Ownership: none (kind and index
   * written). Thread: any. */
  void (*stage_get_device)(spn_stage_t *stage, int32_t *kind, int32_t *index);
  /* The stream the instance's GPU work goes on (a cudaStream_t), or NULL on
   * CPU: the instance's own (another instance's work may run beside it;
   * device buffers it emits carry buffer_set_ready's event for that). With
   * SPINDLE_DEVICE_THREADS=device, one stream shared by every instance on
   * the device. Ownership: borrowed, the runtime's, for the instance's life.
   * Thread: any; queue work on it from the stage's callbacks. */
  void *(*stage_get_stream)(spn_stage_t *stage);
  /* Thread count a CPU stage may use for its kernels. Ownership: none.
   * Thread: any. */
  int32_t (*stage_get_threads)(spn_stage_t *stage);
  /* Log with the job and stage attached (job_id 0 = none). Ownership: fmt
   * and arguments borrowed (formatted at once). Thread: any. */
  void (*log)(spn_stage_t *stage, uint64_t job_id, int32_t level, const char *fmt, ...) SPN_PRINTF(4, 5);
  /* Report progress of a job at this stage (done of total units); only a
   * stage that ends the pipeline is counted. Ownership: none. Thread: any. */
  void (*progress)(spn_stage_t *stage, uint64_t job_id, int64_t done, int64_t total);
  /* Fail one job with a message (it naming the input and position); the
   * other jobs in a batch go on. The host calls job_close(ok=false).
   * Ownership: msg borrowed (copied). Thread: stage (inside one of the
   * instance's callbacks). */
  void (*fail_job)(spn_stage_t *stage, uint64_t job_id, int32_t status, const char *msg);
  /* True once the job was cancelled; stages check between batches.
   * Ownership: none. Thread: stage. */
  bool (*job_cancelled)(spn_stage_t *stage, uint64_t job_id);

  /* Buffers: refcounted memory on the instance's device (or host). */
  /* A buffer of `size` bytes on the instance's device (host memory on the
   * CPU). Ownership: caller owns one reference (buffer_unref).
   * Thread: stage (the instance's executor, where a GPU's context is). */
  int32_t (*buffer_new)(spn_stage_t *stage, size_t size, spn_buffer_t **out, spn_error_t *err);
  /* Its memory and size. Ownership: borrowed, valid while a reference is
   * held. Thread: any. */
  void *(*buffer_data)(spn_buffer_t *buf);
  size_t (*buffer_size)(const spn_buffer_t *buf);
  /* A new reference; returns buf. Ownership: caller owns one more reference
   * (buffer_unref). Thread: any. */
  spn_buffer_t *(*buffer_ref)(spn_buffer_t *buf);
  /* Drop a reference and set *buf to NULL; the last one frees. Ownership:
   * consumes *buf. Thread: any. */
  void (*buffer_unref)(spn_buffer_t **buf);

  /* Messages. msg_new_from copies the envelope of `from` (job, seq, pts).
   * Ownership: caller owns *out (emit or msg_free); env and from borrowed.
   * Thread: any. */
  int32_t (*msg_new)(spn_stage_t *stage, const spn_envelope_t *env, spn_msg_t **out, spn_error_t *err);
  int32_t (*msg_new_from)(spn_stage_t *stage, const spn_msg_t *from, spn_msg_t **out, spn_error_t *err);
  /* Free a message (its buffer references dropped) and set *msg to NULL.
   * Ownership: consumes *msg. Thread: any. */
  void (*msg_free)(spn_msg_t **msg);
  /* The envelope and the item count. Ownership: borrowed from msg.
   * Thread: any. */
  const spn_envelope_t *(*msg_envelope)(const spn_msg_t *msg);
  size_t (*msg_item_count)(const spn_msg_t *msg);
  /* Fills *item (struct_size set by the caller) with a borrowed view.
   * Ownership: the view is borrowed from msg, valid until msg changes or
   * goes. Thread: any. */
  int32_t (*msg_item)(const spn_msg_t *msg, size_t i, spn_item_t *item);
  /* Index of the first item with that name, or -1. Ownership: name
   * borrowed. Thread: any. */
  int64_t (*msg_find)(const spn_msg_t *msg, const char *name);
  /* Add a tensor item; takes a new reference to `buf` (the caller keeps
   * its own). `t` describes the data inside buf (t->data ignored: offset
   * 0 of the buffer). Ownership: name and t copied; buf gains a
   * reference. Thread: any (one thread at a time per message). */
  int32_t (*msg_add_tensor)(spn_msg_t *msg, const char *name, const spn_tensor_t *t, spn_buffer_t *buf,
                            spn_error_t *err);
  /* Add a metadata item; the bytes are copied. Ownership: name and data
   * borrowed (copied). Thread: any (one thread at a time per message). */
  int32_t (*msg_add_meta)(spn_msg_t *msg, const char *name, const void *data, size_t size, spn_error_t *err);
  /* Send on output port `port`. Consumes *msg (sets it to NULL), also on
   * error. May wait for credit (back-pressure) between batches; never drops.
   * Ownership: consumes *msg. Thread: stage (inside one of the instance's
   * callbacks). */
  int32_t (*emit)(spn_stage_t *stage, uint32_t port, spn_msg_t **msg, spn_error_t *err);

  /* Models (the engine): loaded once per (file, device), shared by every
   * instance on that device. Call from create/preload. Ownership: *out
   * holds one reference (model_release); path borrowed. Thread: stage
   * (create or preload). */
  int32_t (*model_load)(spn_stage_t *stage, const char *path, spn_model_t **out, spn_error_t *err);
  /* Drop the reference and set *model to NULL. Ownership: consumes *model.
   * Thread: any. */
  void (*model_release)(spn_stage_t *stage, spn_model_t **model);
  /* Inputs (is_output false) and outputs: name, dtype, shape (-1 dynamic).
   * Ownership: *name is the model's, valid as long as it; *desc the
   * caller's, filled. Thread: any. */
  int32_t (*model_io_count)(const spn_model_t *model, bool is_output);
  int32_t (*model_io)(const spn_model_t *model, bool is_output, int32_t i, const char **name, spn_tensor_t *desc);
  /* Run a batch. Inputs are views on the instance's device. Outputs: the
   * caller fills dtype/ndim/shape, or leaves data NULL and the engine
   * allocates it; such outputs are freed with model_free_outputs. Safe to
   * call concurrently from several instances sharing a model. On a CUDA
   * device the model runs at the stage's `precision` on the instance's
   * stream (stage_get_stream); tensors may be host memory or device memory
   * of that GPU (device_kind CUDA); with every output in device memory the
   * call returns without waiting for the GPU (queue more work on the
   * stream, buffer_set_ready before emitting). The copies of host tensors
   * a GPU run makes are counted as the stage's transfers (buffer_copy).
   * Ownership: inputs borrowed for the call; engine-allocated outputs are
   * the caller's. Thread: stage. */
  int32_t (*model_run)(spn_stage_t *stage, spn_model_t *model, const spn_tensor_t *inputs, size_t n_in,
                       spn_tensor_t *outputs, size_t n_out, spn_error_t *err);
  /* Free the data model_run allocated in outputs[0..n_out) and set each
   * data to NULL. Ownership: consumes those data; the tensors stay the
   * caller's. Thread: any. */
  void (*model_free_outputs)(spn_model_t *model, spn_tensor_t *outputs, size_t n_out);

  void *reserved[16];

  /* ABI 1.1: host access and helpers */
  /* A new message with msg's envelope (flags included) and the same items:
   * tensor items share msg's buffers (a new reference each, no copy), meta
   * items are copied. Ownership: caller owns *out (emit or msg_free); msg
   * is borrowed. Thread: stage. */
  int32_t (*msg_clone)(spn_stage_t *stage, const spn_msg_t *msg, spn_msg_t **out, spn_error_t *err);
  /* Make item i (a tensor item) view `buf` as `t` (t->data ignored: offset 0
   * of buf); its name stays. Takes a new reference to buf (the caller keeps
   * its own) and drops the item's old one. SPN_EINVAL for a meta item or i
   * out of range, SPN_EOVERFLOW when t does not fit buf; msg is unchanged
   * then. Ownership: msg borrowed (the caller's). Thread: stage. */
  int32_t (*msg_replace_tensor)(spn_msg_t *msg, size_t i, const spn_tensor_t *t, spn_buffer_t *buf,
                                spn_error_t *err);
  /* Make item i (a meta item) hold a copy of `size` bytes at `data`; its
   * name stays. SPN_EINVAL for a tensor item or i out of range (msg is
   * unchanged then). Ownership: data borrowed (copied). Thread: stage. */
  int32_t (*msg_replace_meta)(spn_msg_t *msg, size_t i, const void *data, size_t size, spn_error_t *err);
  /* ABI 1.1: memory kinds and formats */
  /* A buffer of `mem_kind` (spn_mem_kind_t) on the instance's device (host
   * memory for HOST/PINNED; cpu:N emulates DEVICE memory with host memory
   * the runtime treats as device memory). Ownership: caller owns one
   * reference. Thread: the instance's executor. */
  int32_t (*buffer_new_kind)(spn_stage_t *stage, size_t size, int32_t mem_kind, spn_buffer_t **out,
                             spn_error_t *err);
  /* The buffer's memory kind (spn_mem_kind_t) and its device (kind is a
   * spn_device_kind_t: 0 CPU, 1 CUDA). Ownership: none. Thread: any. */
  int32_t (*buffer_mem_kind)(const spn_buffer_t *buf);
  void (*buffer_device)(const spn_buffer_t *buf, int32_t *kind, int32_t *index);
  /* Readiness: buffer_set_ready marks the point the stage's stream has
   * reached as the moment buf's contents are complete (call it after
   * queueing the work that writes buf, before emitting it). buffer_event
   * is that event's native handle (a cudaEvent_t), NULL when the buffer is
   * complete already (always on the CPU). The runtime orders every copy
   * and every consumer on another stream after it (the next stage on the
   * same GPU has its own stream). A buffer of the stage's GPU emitted
   * without one is marked ready at emit, on the instance's stream.
   * Ownership: buf
   * borrowed; the event is the buffer's. Thread: executor. */
  int32_t (*buffer_set_ready)(spn_stage_t *stage, spn_buffer_t *buf, spn_error_t *err);
  void *(*buffer_event)(const spn_buffer_t *buf);
  /* The format negotiated for a port of this instance's stage (is_output:
   * an output port, else an input). mem_kind is the memory the edge's
   * consumer receives given where both stages were placed (what the run
   * summary names): an output declaring device and host memory reads host
   * memory where its consumer runs in the CPU pool, or where the stage
   * itself is not on a GPU. An output feeding several edges of different
   * formats reports the first edge's. Ownership: *out the caller's,
   * filled. Thread: any. */
  int32_t (*stage_port_format)(spn_stage_t *stage, bool is_output, uint32_t port, spn_port_format_t *out,
                               spn_error_t *err);
  /* ABI 1.1: counted copies (check SPN_HOST_HAS(host, buffer_copy): an
   * earlier 1.1 host has no such member) */
  /* Copy n bytes from src at src_off to dst at dst_off, for job `job_id`
   * (the envelope's job_id of the message the copy serves; 0 = no job, e.g.
   * in preload). Any two buffers, of any memory kinds and devices: an
   * upload, a download, a peer copy. The copy is queued on the instance's
   * stream after src's readiness event (buffer_set_ready), so work the
   * stage queues after it on that stream sees the data, as with
   * cudaMemcpyAsync; on an instance without a stream (the CPU pool) it is
   * complete when this returns. It is counted by direction (from the two
   * memory kinds, as the runtime counts its edge copies: host or pinned to
   * device is host to device, ...) for the stage (spn_pipeline_stage_transfers,
   * `spindle run`'s summary, the metrics) and for the job (its status), so
   * the accounting of what crossed PCIe includes the stage's own uploads.
   * SPN_EINVAL for a NULL buffer or a range outside either buffer (nothing
   * is copied or counted then). Ownership: dst and src borrowed; keep both
   * referenced until the stream has passed the copy. Thread: stage (inside
   * one of the instance's callbacks, on its executor). */
  int32_t (*buffer_copy)(spn_stage_t *stage, uint64_t job_id, spn_buffer_t *dst, size_t dst_off, spn_buffer_t *src,
                         size_t src_off, size_t n, spn_error_t *err);
} spn_host_api_t;

/* True when `host` (a table handed to this plugin) has member m: a member
 * added in a later minor is only there when the table is large enough. */
#define SPN_HOST_HAS(host, m) \
  ((host)->struct_size >= offsetof(spn_host_api_t, m) + sizeof(((spn_host_api_t *)0)->m) && (host)->m)

/* ---- ABI 1.1: the host in every callback -------------------------------- */

/* Every spn_stage_t a 1.1 host hands a plugin begins with this prefix;
 * the rest of the instance is private. Plugins read it only through
 * spn_stage_host. */
typedef struct spn_stage_head {
  uint32_t struct_size;          /* sizeof(spn_stage_head_t) of the host */
  uint32_t reserved0;
  const spn_host_api_t *host;    /* the complete host table */
} spn_stage_head_t;

/* The host API table, from any stage callback (create, process, ...):
 * no plugin needs to keep the table init got in a static. Ownership:
 * borrowed, valid while the plugin is loaded. Thread: any. */
static inline const spn_host_api_t *spn_stage_host(spn_stage_t *stage) {
  return ((const spn_stage_head_t *)(const void *)stage)->host;
}

/* ---- ABI 1.1: the frame filter helper ------------------------------------ */

/* A stage that maps one frame to one frame writes only the mapping: the
 * helper finds the tensor item, allocates the output on the instance's
 * device, calls the mapping, and emits a copy of the message (its envelope
 * and other items kept) whose item now holds the output. Messages without
 * the item are forwarded as they are; a mapping that fails fails that
 * message's job only (its err message is the job's error). */
typedef struct spn_frame_filter {
  const char *item;     /* the tensor item to map; NULL = "frame" */
  /* The output's dtype and shape from the input's (out starts as a copy of
   * *in); a refusal here fails the message's job. `msg` is the input
   * message (borrowed), for its envelope and other items. Optional: NULL =
   * same as the input. */
  int32_t (*shape)(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *in, spn_tensor_t *out,
                   spn_error_t *err);
  /* The mapping on the CPU: in->data and out->data are host pointers; out
   * has the shape above. */
  int32_t (*cpu)(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *in, spn_tensor_t *out,
                 spn_error_t *err);
  /* The mapping on a CUDA device (see spindle/plugin-cuda.h): in->data and
   * out->data are device pointers, `stream` the instance's cudaStream_t;
   * queue the work on it and return (do not synchronize). */
  int32_t (*cuda)(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *in, spn_tensor_t *out,
                  void *stream, spn_error_t *err);
  /* Adjust the output message (a copy of msg holding the new item) before
   * it is emitted, e.g. rescale coordinates with msg_replace_meta.
   * Optional. */
  int32_t (*finish)(spn_stage_t *stage, void *state, const spn_msg_t *msg, spn_msg_t *out, spn_error_t *err);
} spn_frame_filter_t;

/* One message through the filter, the input pointer already resolved
 * (`in` holds it): shared by the CPU and CUDA drivers. On a GPU the body's
 * work is queued, not done: an output buffer that is not emitted (the frame
 * failed after its body ran) is handed to *keep instead of being released,
 * for the caller to release once the stream has passed it (the pool may
 * hand released memory to another stream at once); the input's buffer is
 * the caller's to keep alive likewise (the input message is freed here).
 * Ownership: consumes *msgp (emitted as a copy, or freed); *keep (NULL on
 * the CPU) receives at most one reference. Thread: stage. */
static inline int32_t spn__frame_filter_one(spn_stage_t *stage, void *state, spn_msg_t **msgp, size_t idx,
                                            const spn_tensor_t *in, bool on_cuda, const spn_frame_filter_t *f,
                                            spn_buffer_t **keep, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_tensor_t out = *in;
  spn_buffer_t *buf = NULL;
  spn_msg_t *m = NULL;
  spn_error_t ferr = SPN_ERROR_INIT;
  int32_t rc = f->shape ? f->shape(stage, state, *msgp, in, &out, &ferr) : SPN_OK;
  if (rc == SPN_OK && (rc = host->buffer_new(stage, spn_tensor_nbytes(&out), &buf, err)) != SPN_OK)
    return rc; /* out of memory: the batch fails */
  if (rc == SPN_OK) {
    out.data = host->buffer_data(buf);
    rc = on_cuda ? f->cuda(stage, state, *msgp, in, &out, host->stage_get_stream(stage), &ferr)
                 : f->cpu(stage, state, *msgp, in, &out, &ferr);
    /* The kernels are queued, not done: consumers on other streams (an
     * edge copy to the host, another GPU) wait for this point. */
    if (rc == SPN_OK && on_cuda && (rc = host->buffer_set_ready(stage, buf, err)) != SPN_OK) {
      if (keep) /* the stream may still write it */
        *keep = buf;
      else
        host->buffer_unref(&buf);
      return rc;
    }
  }
  if (rc == SPN_OK && (rc = host->msg_clone(stage, *msgp, &m, err)) == SPN_OK &&
      (rc = host->msg_replace_tensor(m, idx, &out, buf, err)) == SPN_OK && f->finish)
    rc = f->finish(stage, state, *msgp, m, &ferr);
  if (rc != SPN_OK && on_cuda && keep && buf) {
    *keep = buf; /* not emitted, and the stream may still write it */
    buf = NULL;
  }
  host->buffer_unref(&buf); /* m holds its own reference */
  if (rc != SPN_OK) { /* this frame was refused: its job fails, the batch goes on */
    const char *why = ferr.msg[0] ? ferr.msg : err && err->msg[0] ? err->msg : "frame filter failed";
    host->fail_job(stage, host->msg_envelope(*msgp)->job_id, rc, why);
    host->msg_free(&m);
    host->msg_free(msgp);
    return SPN_OK;
  }
  host->msg_free(msgp); /* done with the input: its memory goes now, not after the batch */
  return host->emit(stage, 0, &m, err);
}

/* The process callback of a CPU frame filter: call it from your process
 *
 *   static int32_t my_process(spn_stage_t *s, void *st, spn_msg_t **msgs, void **js, size_t n,
 *                             spn_error_t *err) {
 *     return spn_frame_filter_process(s, st, msgs, n, &my_filter, err);
 *   }
 *
 * Ownership: consumes msgs[0..n) (each is emitted, replaced or freed, and
 * set to NULL). Thread: stage. */
static inline int32_t spn_frame_filter_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, size_t n,
                                               const spn_frame_filter_t *f, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  for (size_t i = 0; i < n; i++) {
    int64_t idx = host->msg_find(msgs[i], f->item ? f->item : "frame");
    spn_item_t it;
    memset(&it, 0, sizeof it); /* (no designated initialisers: C++ includes this too) */
    it.struct_size = sizeof it;
    int32_t rc;
    if (idx < 0 || host->msg_item(msgs[i], (size_t)idx, &it) != SPN_OK || it.kind != SPN_ITEM_TENSOR) {
      rc = host->emit(stage, 0, &msgs[i], err); /* nothing to map: forwarded */
    } else if (it.tensor.device_kind != SPN_DEVICE_CPU) {
      char msg[160];
      snprintf(msg, sizeof msg, "%s: item \"%s\" is in device memory; this filter runs on the CPU only",
               host->stage_get_name(stage), it.name);
      host->fail_job(stage, host->msg_envelope(msgs[i])->job_id, SPN_EUNSUPPORTED, msg);
      host->msg_free(&msgs[i]);
      rc = SPN_OK;
    } else {
      it.tensor.data = host->buffer_data(it.buffer);
      rc = spn__frame_filter_one(stage, state, &msgs[i], (size_t)idx, &it.tensor, false, f, NULL, err);
    }
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

/* ---- the descriptor ----------------------------------------------------- */

typedef struct spn_plugin_desc {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t sig_pointer_size;  /* sizeof(void *) of the build */
  uint32_t sig_cuda_major;    /* SPN_PLUGIN_CUDA_MAJOR of the build */
  uint32_t reserved0;
  const char *name;           /* must equal <name> in libspindle-<name>.so */
  const char *version;
  const char *license;
  /* Register stage kinds with host->register_kind. A non-OK status refuses
   * the plugin (its message is shown with the file name). */
  int32_t (*init)(const spn_host_api_t *host, spn_plugin_t *plugin, spn_error_t *err);
  /* Undo init; `data` is what plugin_set_data stored. Optional. */
  void (*fini)(void *data);
  void *reserved[8];
} spn_plugin_desc_t;

#define SPN_PLUGIN_DESC_INIT                                                  \
  {.struct_size = sizeof(spn_plugin_desc_t), .abi_major = SPN_PLUGIN_ABI_MAJOR, \
   .abi_minor = SPN_PLUGIN_ABI_MINOR, .sig_pointer_size = sizeof(void *),       \
   .sig_cuda_major = SPN_PLUGIN_CUDA_MAJOR}

/* The descriptor function has C linkage also when the plugin is C++ or
 * CUDA (nvcc): the loader looks it up by its C name. */
#ifdef __cplusplus
#define SPN__EXTERN_C extern "C"
#else
#define SPN__EXTERN_C
#endif
#if defined(__GNUC__)
#define SPN_PLUGIN_EXPORT SPN__EXTERN_C __attribute__((visibility("default")))
#else
#define SPN_PLUGIN_EXPORT SPN__EXTERN_C
#endif

/* Define the descriptor function for plugin NAME (an identifier: lowercase
 * letters, digits, underscores; the file is libspindle-NAME.so):
 *
 *   SPN_PLUGIN_DEFINE(mystage, .version = "1.0", .license = "MIT",
 *                     .init = my_init)
 */
#define SPN_PLUGIN_DEFINE(NAME, ...)                                          \
  SPN_PLUGIN_EXPORT const spn_plugin_desc_t *spindle_plugin_##NAME##_desc(void); \
  SPN_PLUGIN_EXPORT const spn_plugin_desc_t *spindle_plugin_##NAME##_desc(void) { \
    static const spn_plugin_desc_t desc = {                                   \
        .struct_size = sizeof(spn_plugin_desc_t),                             \
        .abi_major = SPN_PLUGIN_ABI_MAJOR,                                    \
        .abi_minor = SPN_PLUGIN_ABI_MINOR,                                    \
        .sig_pointer_size = sizeof(void *),                                   \
        .sig_cuda_major = SPN_PLUGIN_CUDA_MAJOR,                              \
        .name = #NAME,                                                        \
        __VA_ARGS__};                                                         \
    return &desc;                                                             \
  }

#ifdef __cplusplus
}
#endif
#endif
