/* spindle/jobs.h — the job runner interface of the job service.
 *
 * The job service (gateway, durable queue, workers) does not know how a
 * pipeline runs. A worker hands each leased job to a runner: a `run` callback
 * that builds or reuses the pipeline named in the job, feeds the inputs and
 * writes each output to the temporary path the context gives it. The service
 * renames temporaries to their final names only after `run` returns SPN_OK, so
 * a failed, cancelled or retried job never leaves a half-written output and
 * never two.
 *
 * `run` is called on a worker thread, never on the loop thread; it may block.
 * It must poll spn_job_ctx_cancelled() between batches/chunks and return
 * SPN_ECANCELLED when it is set.
 *
 * Not installed: the runner interface, the job contexts and the test runner
 * live in the `spindle` program's job service (the static spindle-jobs
 * library), which no installed library exports; the encode plugin takes
 * spn_segment_api_t from here in the tree. The queue states that clients see
 * are in spindle/client.h (libspindle-client).
 */
#ifndef SPINDLE_JOBS_H
#define SPINDLE_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/client.h" /* spn_queue_state_t */
#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A named file: an input read by the pipeline or an output it produces. */
typedef struct spn_job_io {
  char *name;
  char *path; /* absolute, already confined to the configured roots */
} spn_job_io_t;

typedef struct spn_job_param {
  char *key;
  char *value;
} spn_job_param_t;

/* One leased job. Borrowed by the runner for the duration of `run`. */
typedef struct spn_job_spec {
  int64_t id;
  uint32_t attempt; /* 1 for the first run */
  char *pipeline;
  size_t n_inputs;
  spn_job_io_t *inputs;
  size_t n_outputs;
  spn_job_io_t *outputs; /* final paths; write to spn_job_ctx_output_tmp() */
  size_t n_params;
  spn_job_param_t *params;
  /* Set only on the join step of a segmented job (docs/jobs.md,
   * "Segments"): the segments' outputs in order and their n_segments + 1
   * boundaries in seconds. A runner given them joins the files into output
   * 0 instead of running the pipeline. */
  size_t n_segments;
  char **segment_files;
  double *segment_bounds;
  char *segment_source; /* the file the joined file's audio comes from: the cut input, or the soundtrack */
  bool segment_audio_cut; /* that audio stops where the joined video ends (a soundtrack an encoder muxes) */
  /* Seconds one attempt may run (0: no limit). Past it
   * spn_job_ctx_cancelled answers true, and the attempt that then stops
   * fails with SPN_ETIMEDOUT (retried while attempts are left). */
  double timeout_s;
} spn_job_spec_t;

/* The value of a param, or NULL. Ownership: borrowed from job. Thread: any. */
const char *spn_job_spec_param(const spn_job_spec_t *job, const char *key);

typedef struct spn_job_ctx spn_job_ctx_t;

/* Report progress: `done` of `total` units (frames, chunks). Cheap; may be
 * called per frame (events are coalesced). Thread: the runner's. Ownership: none. */
void spn_job_ctx_progress(spn_job_ctx_t *ctx, uint64_t done, uint64_t total);
/* True once the job was cancelled; the runner stops at the next batch
 * boundary and returns SPN_ECANCELLED. Thread: the runner's. Ownership: none. */
bool spn_job_ctx_cancelled(const spn_job_ctx_t *ctx);
/* The temporary path to write output i to (same directory as the final path,
 * so the final rename is atomic). NULL when i is out of range.
 * Ownership: borrowed from ctx. Thread: the runner's. */
const char *spn_job_ctx_output_tmp(const spn_job_ctx_t *ctx, size_t i);
/* Add seconds of accelerator time used by this job (recorded per job beside
 * its wall compute seconds). Thread: the runner's. Ownership: none. */
void spn_job_ctx_add_gpu_seconds(spn_job_ctx_t *ctx, double seconds);
/* Add copies made for this job, by direction (0 host to device, 1 device
 * to host, 2 device to device, 3 host to host: spn_copy_dir_t): bytes and
 * host nanoseconds (recorded with the job, summed over attempts, shown in
 * its status). Either array may be NULL. Thread: the runner's. Ownership:
 * arrays borrowed. */
void spn_job_ctx_add_transfers(spn_job_ctx_t *ctx, const uint64_t bytes[4], const uint64_t ns[4]);

/* Record a warning for the job (a damaged input accepted, a model replaced
 * by a built-in one): the job still succeeds, and its status lists the
 * warnings of the attempt that did. Thread: the runner's. Ownership: msg
 * borrowed (copied). */
void spn_job_ctx_warn(spn_job_ctx_t *ctx, const char *msg);

/* A runner. `run` returns SPN_OK (outputs complete), SPN_ECANCELLED (it saw
 * the cancel flag) or an error with err->msg naming the input and position;
 * errors are retried up to the job's max_attempts. `has_pipeline` says whether
 * the runner can run a pipeline (the gateway refuses jobs for others).
 * Thread: run on worker threads (several at once, one job each). */
struct spn_segment_plan;

typedef struct spn_job_runner {
  void *data;
  int32_t (*run)(void *data, const spn_job_spec_t *job, spn_job_ctx_t *ctx, spn_error_t *err);
  bool (*has_pipeline)(void *data, const char *name);
  /* Optional: whether the job could run (its inputs, outputs and params fit
   * the pipeline), checked by the gateway at submit so a job that never
   * could is refused at once instead of failing every attempt. Called on
   * the gateway's loop thread; must not block. NULL: no check. */
  int32_t (*check)(void *data, const spn_job_spec_t *job, spn_error_t *err);
  /* Optional: cut a video job into segments at its input's keyframes:
   * `segments` parts, or (segments 0) parts of about `seconds` each. Fills
   * *plan (spn_segment_plan_free) or fails with a message naming the
   * request field and the input. Called at submit on a thread of the
   * gateway's libuv pool, never its loop (it reads the input's packets, no
   * decoding, which takes as long as the file is big): it may block, and
   * may run beside `run` and other plans. NULL: the runner cannot split
   * jobs and the gateway refuses segmented ones. */
  int32_t (*segment_plan)(void *data, const spn_job_spec_t *job, uint32_t segments, double seconds,
                          struct spn_segment_plan *plan, spn_error_t *err);
} spn_job_runner_t;

/* How a job is cut (spn_job_runner_t.segment_plan). Segment k covers
 * [bounds[k], bounds[k+1]) seconds of the input; every bounds[k] with k <
 * count is a keyframe, bounds[count] is the end of the video. */
typedef struct spn_segment_plan {
  uint32_t count;
  double *bounds;          /* count + 1 entries, increasing; owned */
  char start_key[128];     /* the per-job "stage.key" that starts a segment ("decode.start") */
  char duration_key[128];  /* ... and the one that gives its length ("decode.duration") */
  char output[65];         /* the job output the segments are joined into */
  char input[65];          /* the job input that is cut */
  char audio[65];          /* the job input the joined file's audio comes from: the cut input (its
                            * audio through the pipeline), or the soundtrack an encoder muxes (its
                            * audio_path: given, or its default's file) */
  bool audio_cut;          /* that audio stops where the joined video ends (a soundtrack) */
} spn_segment_plan_t;

/* Free what the plan holds (bounds) and zero it, so a second call is
 * harmless. A plan is a value the caller keeps (embedded in its own
 * structs), not an object: it takes T *, not T **. Ownership: releases
 * plan->bounds; plan itself stays the caller's. Thread: any. */
void spn_segment_plan_free(spn_segment_plan_t *plan);

/* What the job service borrows from the media plugin to split and join
 * (stages/media/media-segment.c): the encode plugin exports a function
 * named SPN_SEGMENT_API_SYMBOL returning this table. */
typedef struct spn_segment_api {
  uint32_t struct_size;
  /* Presentation times (seconds after the video stream's start) of the
   * keyframes of `path`'s first video stream, ascending, and where its last
   * frame ends. Errors name the file. Ownership: caller frees *times. */
  int32_t (*keyframes)(const char *path, double **times, size_t *n, double *duration, spn_error_t *err);
  /* Join n segment outputs in order into `out`: video packets copied, each
   * part placed at its cut time (bounds: n + 1 seconds); when the parts
   * have audio, `audio_src`'s soundtrack is decoded whole and encoded once
   * in their audio format. Errors name the part or file. */
  int32_t (*join)(const char *const *parts, const double *bounds, size_t n, const char *audio_src, const char *out,
                  spn_error_t *err);
  /* Whether this plugin's encoders can write `path`: a container can be
   * picked from its name (errors name the path and what would do). The job
   * service asks at SUBMIT for each output bound to the path of one of
   * `encoders` (below). Newer than the two above: present when struct_size
   * covers it. */
  int32_t (*check_output)(const char *path, spn_error_t *err);
  /* The stage kinds of this plugin whose "path" is a media file they
   * write (NULL-terminated): the outputs check_output judges and the only
   * ones a segmented job's parts can be joined from. Newer than
   * check_output: present when struct_size covers it; NULL or absent: no
   * output is checked at submit and no job is split. */
  const char *const *encoders;
  /* join, with the soundtrack cut where the joined video ends (bounds[n]),
   * as the encoder cuts a soundtrack it muxes (audio_path); a shorter one
   * ends where it ends. Newer than encoders: present when struct_size
   * covers it. */
  int32_t (*join_cut)(const char *const *parts, const double *bounds, size_t n, const char *audio_src,
                      const char *out, spn_error_t *err);
} spn_segment_api_t;
#define SPN_SEGMENT_API_SYMBOL "spindle_segment_api"
typedef const spn_segment_api_t *(*spn_segment_api_fn)(void);

/* The built-in test runner. Pipelines:
 *   "copy"  copies input "in" (or the first input) to output "out" (or the
 *           first output) in chunks of `chunk_bytes`, sleeping
 *           `chunk_delay_ms` (param "chunk_delay_ms" overrides) before each
 *           chunk, reporting progress per chunk and honouring cancel between
 *           chunks.
 *   "fail"  fails with param "reason" (default "requested failure"); with
 *           param "succeed_at=N" it behaves like "copy" from attempt N on.
 *   "noop"  does nothing (dispatch overhead).
 * When `exec_log` is set every run appends "start ID ATTEMPT" and, on
 * success, "done ID ATTEMPT" lines to it (O_APPEND, shared by processes). */
typedef struct spn_test_runner_config {
  uint32_t chunk_bytes;
  uint32_t chunk_delay_ms;
  const char *exec_log;
} spn_test_runner_config_t;

/* Fill *out, a runner value the caller keeps, with the test runner.
 * Ownership: caller owns what *out holds (spn_test_runner_free); cfg is
 * borrowed (exec_log copied). Thread: any. */
int32_t spn_test_runner_new(const spn_test_runner_config_t *cfg, spn_job_runner_t *out,
                            spn_error_t *err);
/* Free what spn_test_runner_new put in *runner and zero it (a second call
 * is harmless). Like spn_segment_plan_free it releases a value's contents,
 * so it takes T *. Ownership: releases runner->data; runner stays the
 * caller's. Thread: any, once no job runs on it. */
void spn_test_runner_free(spn_job_runner_t *runner);

#ifdef __cplusplus
}
#endif
#endif
