/* runtime-internal.h — structures of the runtime back end.
 *
 * Threads (see docs/architecture.md):
 *   - the loop thread (libuv) owns job bookkeeping: events reach it through
 *     rt->evq plus one uv_async_t; it never runs stage code;
 *   - executors (a CPU pool and one thread per device) run actors. An actor
 *     (struct spn_stage) is one stage replica, bound to one executor for its
 *     life; every field marked "executor" is touched only by that thread.
 * Fields marked "atomic" are shared; "loop" fields belong to the loop thread;
 * "const" fields are written before the actor's executor first sees it. */
#ifndef SPINDLE_RUNTIME_INTERNAL_H
#define SPINDLE_RUNTIME_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "device-internal.h"
#include "health-internal.h"
#include "log-internal.h"
#include "spec-internal.h"
#include "spindle/device.h"
#include "spindle/runtime.h"

typedef struct spn__executor spn__executor_t;
typedef struct spn__link spn__link_t;

/* ---- messages ----------------------------------------------------------- */

typedef struct spn__item {
  int32_t kind; /* spn_item_kind_t */
  char *name;
  spn_tensor_t tensor;  /* data is NULL: offset 0 of buffer */
  spn_buffer_t *buffer; /* own reference */
  void *meta;           /* own copy */
  size_t meta_size;
} spn__item_t;

struct spn_msg {
  spn_envelope_t env;
  /* The job attempt it belongs to (stamped when sent; 0 = unknown, after a
   * serialized edge): messages of an attempt that was aborted and restarted
   * are dropped on arrival (runtime.c, "restart"). */
  uint32_t attempt;
  uint32_t n_items, cap_items;
  spn__item_t *items;
  /* Non-zero only on a message spn_harness_msg_new made (its id there);
   * every message made otherwise (new, clone, deserialized) has 0, so an
   * output carrying an id is the pushed message itself (harness.c). */
  uint64_t harness_id;
};

int32_t spn__msg_new(const spn_envelope_t *env, spn_msg_t **out, spn_error_t *err);
void spn__msg_free(spn_msg_t **msg);
/* Shallow copy: same envelope, items share the buffers (new references). */
int32_t spn__msg_clone(const spn_msg_t *m, spn_msg_t **out, spn_error_t *err);

/* Framing for ipc/tcp edges (docs/architecture.md "Wire format"). */
int32_t spn__msg_serialize_append(const spn_msg_t *m, bool counted, uint8_t **buf, size_t *len, size_t *cap);
/* Parse one message at *pos; advances *pos. err names the byte offset. */
int32_t spn__msg_deserialize(const uint8_t *buf, size_t len, size_t *pos, spn_device_t *dev, spn_msg_t **out,
                             bool *counted, spn_error_t *err);

/* ---- copies ---------------------------------------------------------------- */

/* ABI 1.1: what crossed an edge or a stage copied (edge-mem.c). Directions
 * of copies, as spn_copy_dir_t. */
enum { SPN__COPY_H2D = 0, SPN__COPY_D2H = 1, SPN__COPY_D2D = 2, SPN__COPY_H2H = 3, SPN__COPY_DIRS = 4 };

/* Copies by direction: how many, their bytes, and the host wall time spent
 * issuing them (and, into host memory on an edge, waiting for them). */
typedef struct spn__xfer {
  atomic_ullong copies[SPN__COPY_DIRS];
  atomic_ullong bytes[SPN__COPY_DIRS];
  atomic_ullong ns[SPN__COPY_DIRS];
} spn__xfer_t;

/* Count one copy of `bytes` in direction d that took ns. Thread: any. */
static inline void spn__xfer_add(spn__xfer_t *x, int d, uint64_t bytes, uint64_t ns) {
  atomic_fetch_add_explicit(&x->copies[d], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&x->bytes[d], bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&x->ns[d], ns, memory_order_relaxed);
}
/* Add x's figures to out's (spn_transfer_stats_t of runtime.h). Thread: any. */
void spn__xfer_read(const spn__xfer_t *x, spn_transfer_stats_t *out);

/* ---- jobs ----------------------------------------------------------------- */

struct spn_job {
  atomic_int refs;
  spn_pipeline_t *pipe; /* const */
  uint64_t id;          /* const */
  int32_t priority;
  void **configs;       /* per stage; owned when config_owned[i] */
  bool *config_owned;
  spn_job_callbacks_t cb;
  atomic_int state;      /* spn_job_state_t */
  atomic_bool cancelled; /* spn_job_cancel was called */
  atomic_bool dead;      /* failing or cancelled: drop its messages */
  atomic_llong *stage_done; /* per stage: frames finished there (terminal stages) */
  atomic_llong total;    /* largest envelope total seen, -1 unknown */
  /* Multi-device (runtime.c "placement and quarantine"). */
  atomic_uint attempt;   /* current attempt, from 1; bumped by a restart */
  atomic_ullong dev_mask; /* device slots (bit slot % 64) the attempt touched */
  atomic_int pin;        /* chain placement: the attempt's device slot, -1 none yet */
  atomic_ullong device_ns; /* busy time on devices, every attempt */
  spn__xfer_t xfer;      /* copies made for it: its edges' and its stages' own (buffer_copy), every attempt */
  uint32_t restarts;     /* loop: restarts after a device was quarantined */
  spn__warns_t warns;    /* warnings its stages logged naming it (spn_job_warning) */
  /* loop */
  uint32_t acks, acks_needed, abort_acks, abort_acks_needed;
  bool aborting, finished_loop;
  int32_t status;
  char msg[SPN_ERROR_MSG_MAX];
  long long last_done;
  uint64_t t0_ns;
  spn_job_t *next_running; /* rt->running list (loop) */
  /* pipe->mu */
  spn_job_t *next_live;
  /* wait */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool finished;
};

void spn__job_unref(spn_job_t **job);

/* ---- actors ----------------------------------------------------------------- */

typedef struct spn__rx {
  spn_msg_t *msg;
  spn__link_t *link;
  struct spn__ajob *aj;
  bool counted;
  uint64_t t_ns; /* arrival, for max_delay */
} spn__rx_t;

typedef struct spn__heap {
  spn__rx_t *v;
  size_t n, cap;
} spn__heap_t;

/* A job as seen by one actor (executor). */
typedef struct spn__ajob {
  struct spn__ajob *next;
  spn_job_t *job; /* own reference */
  uint64_t id;
  void *job_state;
  bool opened, failed, generating;
  bool finish_done;    /* finish_job ran (or the source's generate ended) */
  bool open_tried;     /* job_open was called (opened: and succeeded) */
  uint32_t eos_got;
  uint32_t attempt;    /* the job's attempt this state belongs to */
  uint32_t n_ready;    /* its entries in the actor's ready FIFO */
  uint64_t *next_seq;  /* per input port (re-ordering ports) */
  spn__heap_t *heaps;  /* per input port (re-ordering ports) */
} spn__ajob_t;

typedef struct spn__link_stats {
  atomic_ullong messages;               /* data messages delivered */
  atomic_ullong items_passed;           /* tensor items handed over as they were */
  atomic_ullong copies[SPN__COPY_DIRS]; /* tensor items copied, per direction */
  atomic_ullong bytes[SPN__COPY_DIRS];
  atomic_ullong ns[SPN__COPY_DIRS];     /* host wall time issuing (and, into host memory, waiting for) them */
} spn__link_stats_t;

struct spn__link {
  uint32_t id; /* index in pipe->links (const) */
  uint32_t edge;        /* index in pipe->spec->edges (const) */
  uint32_t accept_mem;  /* SPN_MEMSET_* the consumer port takes (const; never 0) */
  spn__link_stats_t stats;
  spn_stage_t *from, *to;
  uint32_t from_port, to_port;
  uint32_t capacity;
  bool serialize;             /* consumer listens on ipc/tcp */
  atomic_llong in_flight;     /* counted messages sent, not yet released */
  atomic_llong max_in_flight; /* debug: largest in_flight seen */
  atomic_bool want_credit;    /* producer waits for credit */
  atomic_llong ctl_in_flight; /* uncounted control messages (EOS, SKIP) in transit */
  /* producer executor */
  void *sock;
  spn_msg_t **tx;
  bool *tx_counted;
  uint32_t n_tx;
};

typedef struct spn__out_edge {
  spn__link_t **links; /* one per consumer replica */
  uint32_t n_links;
  uint32_t rr;
  /* Where data messages go: the consumer replicas on the producer's own
   * device when there are any (chain per device), else all of `links`. */
  spn__link_t **targets;
  uint32_t n_targets;
  /* Chain placement with targets on several devices: each job is pinned to
   * one device (job->pin) and its data goes to that device's replicas. */
  bool pin;
  uint32_t pin_rr;
} spn__out_edge_t;

typedef struct spn__out_port {
  spn__out_edge_t *edges; /* one per consumer stage */
  uint32_t n_edges;
} spn__out_port_t;

typedef struct spn__stage_rt {
  uint32_t index;
  const spn__stage_spec_t *spec;
  const spn_stage_kind_t *kind;
  spn_stage_t **replicas;
  uint32_t n_replicas;
  uint32_t max_batch, max_delay_ms;
  bool terminal; /* no outgoing edge: acknowledges EOS to the job */
  _Atomic uint64_t busy_ns; /* wall time in process/generate/flush, all replicas, all jobs */
  /* Stream time (actor.c, "stream time"): device time between timed events
   * recorded on the instance's stream around those calls, and how many
   * calls were timed; 0 calls: not measured (no device, or it cannot time). */
  _Atomic uint64_t stream_ns, stream_calls;
  spn__xfer_t xfer;         /* copies its instances made themselves (host buffer_copy), all replicas, all jobs */
  /* spn_stage_stats_t's histograms (spn__stage_observe) */
  _Atomic uint64_t calls, call_ns, lat_b[SPN_STAGE_LATENCY_BUCKETS];
  _Atomic uint64_t batches, messages, batch_b[SPN_STAGE_BATCH_BUCKETS];
  /* The stage harness's copy of every host->progress of this stage, terminal
   * or not (harness.c); NULL outside the harness. Set before any job starts. */
  void (*progress_tap)(void *data, uint64_t job_id, int64_t done, int64_t total);
  void *progress_tap_data;
} spn__stage_rt_t;

/* Count one process (n >= 1 messages) or generate (n == 0) call of t0..now. */
void spn__stage_observe(spn__stage_rt_t *srt, uint64_t ns, uint32_t n);

/* Timed calls of a stage instance whose stream time is not read yet, at
 * most (actor.c, "stream time"). */
#define SPN__ST_PAIRS 64

struct spn_stage {
  spn_stage_head_t head;     /* const; first: the public prefix spn_stage_host reads (plugin.h) */
  spn_pipeline_t *pipe;      /* const */
  spn__stage_rt_t *srt;      /* const */
  uint32_t replica;          /* const */
  uint32_t index;            /* in pipe->actors */
  spn__executor_t *ex;       /* const */
  spn__executor_t *own_ex;   /* const; its own thread on its device (rt->stage_threads), else NULL */
  spn_device_t *device;      /* const; NULL = CPU pool (host memory) */
  int32_t dev_slot;          /* const; index of device in rt->devices, -1 = CPU pool */
  char device_name[64];
  char endpoint[256];        /* where the mailbox listens */
  bool serialized_in;        /* mailbox is ipc/tcp */
  spn__out_port_t *out;      /* n_outputs of the kind */
  uint32_t n_out;
  uint32_t *links_in;        /* per input port: number of links */
  bool *reorder;             /* per input port */
  uint32_t n_in;
  uint32_t eos_expected;
  bool is_source;
  /* executor */
  void *state;
  bool created;
  void *sock;                /* PULL mailbox */
  spn__ajob_t *jobs;
  spn__ajob_t *gen_cursor;
  spn__rx_t *ready;          /* FIFO ring */
  size_t r_head, r_n, r_cap;
  uint64_t first_ready_ns;
  size_t n_finishing;        /* jobs whose every EOS has arrived */
  spn_msg_t **b_msgs;        /* batch scratch */
  void **b_states;
  spn__rx_t *b_rx;
  uint32_t b_cap;
  uint64_t retry_ns;         /* source asked to be called later */
  spn__ajob_t *cur_job;      /* job whose callback runs (generate/flush) */
  uint8_t *ser_buf;          /* serialization scratch */
  atomic_llong reordered;    /* debug: messages that arrived ahead of their turn */
  /* spn__now_ns() when its current call (job_open, process, generate,
   * flush) began; 0 between calls. Read by any thread
   * (spn_pipeline_stage_in_call): a stage stuck inside a call. */
  _Atomic uint64_t call_since_ns;
  spn_stream_t *copy_stream; /* executor: edge copies when the executor has no stream of its own */
  size_t ser_cap;
  /* executor: stream time (actor.c): pairs of timed events in a ring, the
   * oldest st_n from st_head not read yet, st_last the newest recorded;
   * st_timed once a call was timed since the last job's end; st_off once
   * timing failed */
  spn_event_t *st_ev[2 * SPN__ST_PAIRS];
  uint32_t st_head, st_n, st_last;
  bool st_timed, st_off;
};

/* ---- executors ---------------------------------------------------------------- */

typedef enum spn__cmd_type {
  SPN__CMD_CREATE = 1, /* create + bind + preload an actor */
  SPN__CMD_CONNECT,    /* connect its output links */
  SPN__CMD_START_JOB,  /* a source starts generating a job */
  SPN__CMD_ABORT_JOB,  /* drop a job: job_close(ok=false), ack the loop */
  SPN__CMD_DESTROY,    /* destroy the actor, close its sockets */
  SPN__CMD_STOP,       /* end the executor thread */
} spn__cmd_type_t;

typedef struct spn__barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint32_t remaining;
  int32_t status;
  spn_error_t err;
} spn__barrier_t;

typedef struct spn__cmd {
  struct spn__cmd *next;
  int32_t type;
  spn_stage_t *actor;
  spn_job_t *job; /* own reference */
  spn__barrier_t *barrier;
  bool generate;  /* START_JOB: this source replica generates the job */
} spn__cmd_t;

struct spn__executor {
  spn_runtime_t *rt;
  uint32_t index;
  char name[64];
  spn_device_t *device; /* NULL for pool threads */
  spn_stream_t *stream; /* the device's work stream, created on this thread */
  pthread_t thread;
  pthread_mutex_t mu;
  spn__cmd_t *head, *tail; /* mu */
  int efd;
  atomic_bool signalled;
  /* executor */
  spn_stage_t **actors;
  uint32_t n_actors, cap_actors;
};

/* name: NULL for the device's (or the pool thread's) own. */
int32_t spn__executor_start(spn_runtime_t *rt, spn__executor_t *ex, uint32_t index, spn_device_t *dev,
                            const char *name, spn_error_t *err);
void spn__executor_stop(spn__executor_t *ex);
/* Queue a command (takes ownership of cmd). Thread: any. */
void spn__executor_post(spn__executor_t *ex, spn__cmd_t *cmd);
/* Make the executor look at its actors again (credit came back). Thread: any. */
void spn__executor_wake(spn__executor_t *ex);

/* Actor work, on its executor. */
int32_t spn__actor_create(spn_stage_t *a, spn_error_t *err);
int32_t spn__actor_connect(spn_stage_t *a, spn_error_t *err);
void spn__actor_start_job(spn_stage_t *a, spn_job_t *job, bool generate);
void spn__actor_abort_job(spn_stage_t *a, spn_job_t *job);
void spn__actor_destroy(spn_stage_t *a);
/* Run what is ready; *deadline_ns gets the next time it wants to run
 * (UINT64_MAX none). Returns true if it did anything. */
bool spn__actor_step(spn_stage_t *a, uint64_t now_ns, uint64_t *deadline_ns);

/* ABI 1.1 (edge-mem.c): put every tensor item of a message arriving on link
 * l where the consumer port takes it — one copy per item whose memory kind
 * or device the port does not take, after the producer's readiness event,
 * on the consumer's stream; counted in l->stats and in job->xfer (the
 * message's job). Executor of a. */
int32_t spn__edge_place(spn_stage_t *a, spn__link_t *l, spn_msg_t *m, spn_job_t *job, spn_error_t *err);
void spn__edge_place_done(spn_stage_t *a);

void spn__barrier_init(spn__barrier_t *b, uint32_t n);
void spn__barrier_done(spn__barrier_t *b, int32_t status, const spn_error_t *err);
int32_t spn__barrier_wait(spn__barrier_t *b, spn_error_t *err);
void spn__barrier_destroy(spn__barrier_t *b);

/* ---- pipelines and the runtime ---------------------------------------------- */

struct spn_pipeline {
  spn_runtime_t *rt;
  spn__pipeline_spec_t *spec;
  bool owns_spec;
  int32_t placement; /* spn__placement_t (const) */
  bool wire;         /* some edge is serialized (ipc/tcp): no in-runtime restart (const) */
  uint64_t id;
  spn__stage_rt_t *stages;
  uint32_t n_stages;
  spn_stage_t **actors;
  uint32_t n_actors;
  spn__link_t **links;
  uint32_t n_links;
  uint32_t n_terminal; /* terminal actors: EOS acks a job needs */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  spn_job_t *live; /* jobs not yet finished */
  uint32_t n_live;
  spn__warns_t warns; /* warnings its stages logged outside any job (spn_pipeline_warning) */
  spn_pipeline_t *next; /* rt->pipes */
};

/* Job for an id among the pipeline's live jobs, with a new reference, or NULL.
 * Thread: any. */
spn_job_t *spn__pipeline_find_job(spn_pipeline_t *pipe, uint64_t id);

typedef enum spn__ev_type {
  SPN__EV_JOB_START = 1,
  SPN__EV_JOB_ACK,    /* a terminal actor finished the job */
  SPN__EV_JOB_FAIL,   /* status + msg */
  SPN__EV_JOB_CANCEL,
  SPN__EV_ABORT_ACK,  /* an actor handled ABORT_JOB */
  SPN__EV_PROGRESS,   /* a stage reported progress */
  SPN__EV_DEVICE_DOWN, /* device slot `status` was quarantined: restart its jobs */
  SPN__EV_HEALTH_START, /* poll rt->health every `status` ms */
} spn__ev_type_t;

typedef struct spn__event {
  struct spn__event *next;
  int32_t type;
  spn_job_t *job; /* own reference */
  int32_t status;
  int64_t done, total;
  char msg[];
} spn__event_t;

struct spn_runtime {
  spn_runtime_opts_t opts;
  char *devices_spec;
  char **plugin_paths; /* copy of opts.plugin_paths */
  size_t n_plugin_paths;
  spn__logger_t *log;
  spn_device_t **devices;
  uint32_t n_devices;
  spn_device_t **host_devs; /* one CPU device: host memory for pool actors */
  spn_device_t *host_dev;
  spn__executor_t *pool; /* CPU pool */
  uint32_t n_pool;
  spn__executor_t *dev_ex; /* one per device (the instances' with device_threads DEVICE) */
  bool stage_threads;      /* device_threads resolved: each instance on a device has its own (const) */
  atomic_uint pool_rr;
  void *zctx;
  spn__registry_t *reg;
  const spn_host_api_t *host; /* static: plugins may keep the pointer */
  atomic_ullong next_job_id;
  atomic_ullong next_pipe_id;
  uint32_t edge_capacity;
  /* loop */
  uv_loop_t loop;
  uv_async_t async;
  uv_timer_t timer;
  uv_timer_t health_timer;          /* polls health */
  /* NVML health poller (device-health.c); its device i is runtime device
   * health_slot[i]. NULL without NVML or without devices it knows. Set
   * before the loop polls it, never replaced while it does. */
  spn__nvml_health_t *health;
  uint32_t *health_slot;
  /* Quarantine: a drained device takes no new work (pick_link skips it). */
  atomic_bool *dev_down;         /* per device slot */
  atomic_uint n_down;
  atomic_ullong quarantines;     /* devices drained since start */
  atomic_ullong job_restarts;    /* job attempts restarted after a quarantine */
  pthread_t loop_thread;
  bool loop_started;
  pthread_mutex_t evmu;
  spn__event_t *ev_head, *ev_tail; /* evmu */
  bool stopping;                   /* evmu */
  spn_job_t *running;              /* loop */
  pthread_mutex_t pmu;
  spn_pipeline_t *pipes; /* pmu */
  /* The model engine, created on the first model load (host-model.c). */
  pthread_mutex_t engmu;
  struct spn_engine *engine; /* engmu */
};

/* Post an event to the loop thread (takes ownership). Thread: any. */
void spn__loop_post(spn_runtime_t *rt, spn__event_t *ev);
spn__event_t *spn__event_new(int32_t type, spn_job_t *job, int32_t status, const char *msg);
void spn__loop_job_started(spn_runtime_t *rt, spn_job_t *job);
void spn__loop_handle(spn_runtime_t *rt, spn__event_t *ev);
void spn__loop_progress_tick(spn_runtime_t *rt);

/* The memory kind the consumer of edge `es` of `pipe` receives, from the
 * negotiated sets and where the two stages were placed (pipeline.c); what
 * spn_pipeline_edge_stats and host->stage_port_format report. */
int32_t spn__edge_mem_kind(const spn_pipeline_t *pipe, const spn__edge_spec_t *es);

/* The host table handed to plugins: one static table for every runtime
 * (plugins keep the pointer in a static; entries find their runtime through
 * the stage handle). */
const spn_host_api_t *spn__host_api(void);
/* model_* entries of it (host-model.c). */
int32_t spn__host_model_load(spn_stage_t *s, const char *path, spn_model_t **out, spn_error_t *err);
void spn__host_model_release(spn_stage_t *s, spn_model_t **model);
int32_t spn__host_model_io_count(const spn_model_t *model, bool is_output);
int32_t spn__host_model_io(const spn_model_t *model, bool is_output, int32_t i, const char **name, spn_tensor_t *desc);
int32_t spn__host_model_run(spn_stage_t *s, spn_model_t *model, const spn_tensor_t *in, size_t n_in,
                            spn_tensor_t *out, size_t n_out, spn_error_t *err);
void spn__host_model_free_outputs(spn_model_t *model, spn_tensor_t *outputs, size_t n_out);

uint64_t spn__now_ns(void);

/* Is device slot `slot` drained? (-1, the CPU pool, never is.) Thread: any. */
static inline bool spn__slot_down(const spn_runtime_t *rt, int32_t slot) {
  return slot >= 0 && atomic_load_explicit(&rt->dev_down[slot], memory_order_relaxed);
}
static inline uint64_t spn__slot_bit(int32_t slot) { return slot < 0 ? 0 : 1ull << (slot % 64); }
/* True on the runtime's loop or executor threads, where waiting for a job
 * or a pipeline would wait for ourselves. */
bool spn__runtime_own_thread(const spn_runtime_t *rt);

#endif
