/* spindle/harness.h — test one stage on the real runtime.
 *
 * A stage author's unit test: load a plugin, run one of its stage kinds in
 * a real runtime (real executors, edges, batching, EOS and job failure
 * handling) between a feeder stage per input port and a collector stage per
 * output port, push messages into it and read what it emits. Link with
 * `pkg-config --cflags --libs spindle-harness` (the harness is part of
 * libspindle); the plugin under test is loaded exactly as `spindle run`
 * loads it, so it must not link against the harness either.
 *
 *   spn_harness_opts_t o = SPN_HARNESS_OPTS_INIT;
 *   o.plugin = "./libspindle-invert.so";
 *   o.kind = "invert";
 *   o.config = "threshold = 128";
 *   spn_harness_t *h;
 *   spn_harness_new(&o, &h, &err);
 *   spn_msg_t *m;
 *   spn_harness_msg_new(h, 0, &m, &err);                 // seq 0
 *   spn_harness_add_tensor(h, m, "frame", &t, pixels, &err);
 *   spn_harness_push(h, 1, 0, &m, &err);                 // job 1, input port 0
 *   spn_harness_run(h, &err);                            // every job to its end
 *   spn_harness_job_status(h, 1, &jerr);                 // SPN_OK, or why it failed
 *   const spn_msg_t *out = spn_harness_output(h, 1, 0, 0);  // job 1, port 0, first
 *   spn_harness_free(&h);
 *
 * A harness and everything it returns belong to one thread (the test's);
 * the stage itself runs on the runtime's executors as it would in a
 * pipeline. Two harnesses in one process share nothing.
 */
#ifndef SPINDLE_HARNESS_H
#define SPINDLE_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/plugin.h"
#include "spindle/runtime.h" /* spn_transfer_stats_t */
#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_harness spn_harness_t;

typedef struct spn_harness_opts {
  uint32_t struct_size;
  /* The plugin file (libspindle-<name>.so). NULL: the kind is looked up on
   * the plugin search path ($SPINDLE_PLUGIN_PATH, then the install dir). */
  const char *plugin;
  /* The stage kind to drive, as `kind = "..."` in a pipeline. */
  const char *kind;
  /* The rest of the stage's [[stage]] table as TOML lines (its config keys,
   * `batching = { max_batch = 4 }`, `device = "cpu"` ...). NULL = none. */
  const char *config;
  /* Runtime devices ("cpu", "cpu:2", "cuda:0"); NULL = "cpu". */
  const char *devices;
  /* Runtime log level (spn_log_level_t); logs go to stderr. */
  int32_t log_level;
} spn_harness_opts_t;

#define SPN_HARNESS_OPTS_INIT {.struct_size = sizeof(spn_harness_opts_t), .log_level = SPN_LOG_WARN}

/* Start a runtime, load the plugin and build the pipeline feeders → stage →
 * collectors. A bad config or kind fails here with the runtime's message
 * (file "harness", line and column of the generated table).
 * Ownership: caller owns *out (spn_harness_free). Thread: any. */
SPN_API int32_t spn_harness_new(const spn_harness_opts_t *opts, spn_harness_t **out, spn_error_t *err);
/* Stop the runtime and free everything, the collected messages included.
 * Sets *h to NULL; NULL and *h == NULL are accepted. Thread: the owner. Ownership: consumes *h, sets it to NULL. */
SPN_API void spn_harness_free(spn_harness_t **h);

/* The host API table the stage sees, to build messages and read the
 * collected ones (msg_add_meta, msg_item, msg_find, buffer_data ...).
 * Ownership: borrowed, valid while h lives. Thread: the owner. */
SPN_API const spn_host_api_t *spn_harness_host(const spn_harness_t *h);
/* Number of input and output ports of the kind under test. Thread: the owner. Ownership: none. */
SPN_API uint32_t spn_harness_input_count(const spn_harness_t *h);
SPN_API uint32_t spn_harness_output_count(const spn_harness_t *h);

/* A new, empty message with sequence number `seq` (its job is set by
 * spn_harness_push). Ownership: caller owns *out (push it or msg_free it).
 * Thread: the owner. */
SPN_API int32_t spn_harness_msg_new(spn_harness_t *h, uint64_t seq, spn_msg_t **out, spn_error_t *err);
/* Set the presentation time (seconds) of a message not yet pushed: 0 from
 * spn_harness_msg_new; stages that time their output by it (encode) need
 * it rising. Ownership: msg borrowed. Thread: the owner. */
SPN_API void spn_harness_msg_set_pts(spn_harness_t *h, spn_msg_t *msg, double pts);
/* Add a tensor item holding a copy of spn_tensor_nbytes(t) bytes at `data`
 * (host memory; t->data is ignored). Ownership: msg and data borrowed.
 * Thread: the owner. */
SPN_API int32_t spn_harness_add_tensor(spn_harness_t *h, spn_msg_t *msg, const char *name, const spn_tensor_t *t,
                                       const void *data, spn_error_t *err);

/* Queue *msg for job `job_id` (non-zero; the test picks it) on input port
 * `port`, after the ones already queued there; a job appears the first time
 * it is named. Messages go in when spn_harness_run starts the job, then EOS.
 * Ownership: consumes *msg (sets it to NULL), also on error. Thread: the owner. */
SPN_API int32_t spn_harness_push(spn_harness_t *h, uint64_t job_id, uint32_t port, spn_msg_t **msg, spn_error_t *err);
/* Queue a job with no messages (for a stage that is a source), or add a
 * per-job override "key=value" of one of the stage's per-job keys (a
 * decode's path, a filesink's output). Thread: the owner. Ownership: key_value borrowed (copied). */
SPN_API int32_t spn_harness_job_set(spn_harness_t *h, uint64_t job_id, const char *key_value, spn_error_t *err);

/* Start every queued job at once (so batches may mix jobs, as in a real
 * pipeline) and wait for all of them to end. Returns SPN_OK once they all
 * ended, whatever each job's outcome (see spn_harness_job_status); an error
 * only when a job could not be started (its overrides refused, ...). The
 * outputs of earlier runs are dropped first. Thread: the owner.
 * Ownership: the pushed messages are consumed by the jobs. */
SPN_API int32_t spn_harness_run(spn_harness_t *h, spn_error_t *err);

/* The last run's outcome for a job: SPN_OK, or its failure with the
 * message (which names the stage) in *err. SPN_ENOENT for a job that did
 * not run. Thread: the owner. Ownership: err receives a copy of the job's message. */
SPN_API int32_t spn_harness_job_status(const spn_harness_t *h, uint64_t job_id, spn_error_t *err);
/* Messages the stage emitted for a job on output port `port` in the last
 * run, in arrival order, and the i-th of them (NULL past the end). Tensors
 * are where the stage put them: a GPU stage's device tensors stay in device
 * memory (the item's tensor.device_kind tells; copy them to read them).
 * Ownership: borrowed until the next run or spn_harness_free. Thread: the owner. */
SPN_API size_t spn_harness_output_len(const spn_harness_t *h, uint64_t job_id, uint32_t port);
SPN_API const spn_msg_t *spn_harness_output(const spn_harness_t *h, uint64_t job_id, uint32_t port, size_t i);
/* True when the job's end of stream reached the collector of `port` (the
 * stage flushed and the runtime passed EOS on). Thread: the owner. Ownership: none. */
SPN_API bool spn_harness_output_eos(const spn_harness_t *h, uint64_t job_id, uint32_t port);

/* ---- SDK 1.1: envelope totals, failed jobs, progress, zero-copy ------------ */

/* Set the envelope's total (the messages the job will carry, as a source
 * such as synth writes on every message; -1 = unknown, what
 * spn_harness_msg_new sets) of a message not yet pushed.
 * Ownership: msg borrowed. Thread: the owner. */
SPN_API void spn_harness_msg_set_total(spn_harness_t *h, spn_msg_t *msg, int64_t total);

/* Make a message not yet pushed (and with no items) the SKIP of its seq,
 * as a stage upstream sends when it drops that frame (SPN_MSG_SKIP): a kind
 * with outputs never sees it (the runtime forwards it), a sink only with
 * SPN_KIND_SEES_SKIPS. Ownership: msg borrowed. Thread: the owner. */
SPN_API void spn_harness_msg_set_skip(spn_harness_t *h, spn_msg_t *msg);

/* The id spn_harness_msg_new gave msg (1, 2, ... unique in h), or 0 for a
 * message the stage or the runtime made (msg_new, msg_new_from, msg_clone,
 * a copy over an edge). Read it before pushing: an output with that id is
 * the pushed message itself, forwarded without a copy.
 * Ownership: msg borrowed. Thread: the owner. */
SPN_API uint64_t spn_harness_msg_id(const spn_harness_t *h, const spn_msg_t *msg);

/* References held on buf now (messages' items, the test's own). To see
 * whether an output shares a pushed buffer, take a reference on it before
 * pushing (host->buffer_ref on the item's buffer: it then cannot be freed
 * and its address reused), compare after the run and release it with
 * host->buffer_unref before spn_harness_free. A collected message whose
 * buffer has no other holder shows 1: the stage kept no reference.
 * Ownership: buf borrowed. Thread: the owner. */
SPN_API int32_t spn_harness_buffer_refs(const spn_harness_t *h, const spn_buffer_t *buf);

/* End job `job_id` as failed in the next run instead of ending its stream,
 * as when another stage of a pipeline fails it: once every message pushed
 * for it was fed and the stage has processed them all, the harness fails
 * the job with `status` (an error, < 0) and `msg` (NULL: spn_strerror). The
 * stage gets no flush but job_close(ok=false) (if it opened the job, which
 * its first message does); spn_harness_job_status then returns `status`
 * with a message containing `msg`, and no end of stream reaches the
 * outputs. Only for a kind with inputs (the feeders fail the job): a
 * source gets SPN_EUNSUPPORTED. Ownership: msg borrowed (copied).
 * Thread: the owner. */
SPN_API int32_t spn_harness_job_fail(spn_harness_t *h, uint64_t job_id, int32_t status, const char *msg,
                                     spn_error_t *err);

/* The last progress the stage reported for the job in the last run
 * (host->progress: done of total units) in *done and *total, and true;
 * false when it reported none. The runtime passes a stage's reports on to
 * on_progress only when the stage is a pipeline's sink; the harness shows
 * every stage's. Ownership: done and total written (either may be NULL).
 * Thread: the owner. */
SPN_API bool spn_harness_job_progress(const spn_harness_t *h, uint64_t job_id, int64_t *done, int64_t *total);

/* What was copied for job `job_id` in the last run (spn_job_transfers at
 * its end): the runtime's copies on the edges into and out of the stage
 * (e.g. device memory it emitted, copied to the host for the collector)
 * plus the stage's own host->buffer_copy calls naming the job. SPN_ENOENT
 * when the job did not run. Ownership: *out is the caller's, filled whole.
 * Thread: the owner. */
SPN_API int32_t spn_harness_job_transfers(const spn_harness_t *h, uint64_t job_id, spn_transfer_stats_t *out,
                                          spn_error_t *err);
/* The stage's own copies (host->buffer_copy, every job and job id 0 too)
 * since the harness was made, all runs together
 * (spn_pipeline_stage_transfers). Ownership: *out is the caller's, filled
 * whole. Thread: the owner. */
SPN_API int32_t spn_harness_stage_transfers(const spn_harness_t *h, spn_transfer_stats_t *out, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
