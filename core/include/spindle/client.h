/* spindle/client.h — submit and follow Spindle jobs from C.
 *
 * libspindle-client speaks the job protocol (docs/protocol.md) to a gateway
 * (`spindle serve`) over one ZeroMQ DEALER socket. Calls are synchronous and
 * time-bounded by `timeout_ms`; a client handle is used by one thread at a
 * time. Build with `pkg-config --cflags --libs spindle-client`.
 *
 *   spn_client_t *c;
 *   spn_client_new("tcp://127.0.0.1:7700", NULL, &c, &err);
 *   spn_client_job_t *job = spn_client_job_new("copy");
 *   spn_client_job_input(job, "in", "/data/in.mp4");
 *   spn_client_job_output(job, "out", "/data/out.mp4");
 *   int64_t id;
 *   spn_client_submit(c, job, &id, NULL, &err);
 *   spn_client_watch(c, id, on_event, NULL, &final, &err);
 */
#ifndef SPINDLE_CLIENT_H
#define SPINDLE_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A job's state in the durable queue. The runtime's spn_job_state_t
 * (spindle/runtime.h) covers one run; the queue adds retries, so it also has
 * "dead" (retries exhausted). */
typedef enum spn_queue_state {
  SPN_QSTATE_QUEUED = 0,
  SPN_QSTATE_RUNNING = 1,
  SPN_QSTATE_SUCCEEDED = 2,
  SPN_QSTATE_FAILED = 3,
  SPN_QSTATE_CANCELLED = 4,
  SPN_QSTATE_DEAD = 5,
} spn_queue_state_t;
#define SPN_QSTATE_COUNT 6

/* "queued", "running", ...; NULL for an unknown value. Ownership: static. Thread: any. */
SPN_API const char *spn_queue_state_name(spn_queue_state_t s);
/* Parse a state name; -1 if unknown. Thread: any. Ownership: arguments borrowed. */
SPN_API int32_t spn_queue_state_parse(const char *name);
/* succeeded, failed, cancelled and dead are terminal. Ownership: none. Thread: any. */
static inline bool spn_queue_state_terminal(spn_queue_state_t s) { return s >= SPN_QSTATE_SUCCEEDED; }

typedef struct spn_client spn_client_t;
typedef struct spn_client_job spn_client_job_t;

typedef struct spn_client_options {
  uint32_t struct_size;   /* sizeof(spn_client_options_t) */
  int32_t timeout_ms;     /* per request; default 10000 */
  uint32_t max_msg_size;  /* default 1 MiB */
  /* CURVE: all three Z85 strings (40 chars) or all NULL. */
  const char *curve_server_key;
  const char *curve_public_key;
  const char *curve_secret_key;
} spn_client_options_t;

#define SPN_CLIENT_OPTIONS_INIT {sizeof(spn_client_options_t), 10000, 0, NULL, NULL, NULL}

/* A job's state as the gateway reports it (STATUS replies, WATCH events). */
typedef struct spn_client_status {
  int64_t id;
  spn_queue_state_t state;
  uint32_t attempts, max_attempts;
  uint64_t done, total; /* progress units (frames, chunks) */
  double compute_s, gpu_s;
  char pipeline[128];
  char reason[512];     /* why it failed, died or was cancelled */
} spn_client_status_t;

/* Connect (lazily; the first request waits for the gateway up to the
 * timeout). Ownership: caller owns *out (spn_client_free). Thread: any. */
SPN_API int32_t spn_client_new(const char *endpoint, const spn_client_options_t *opt,
                               spn_client_t **out, spn_error_t *err);
/* Close the socket, free the client and set *c to NULL (NULL is ignored).
 * Ownership: consumes *c. Thread: the client's (one thread at a time). */
SPN_API void spn_client_free(spn_client_t **c);

/* Job builder; NULL when out of memory. Ownership: caller owns the job
 * (spn_client_job_free); pipeline is copied. Thread: any. */
SPN_API spn_client_job_t *spn_client_job_new(const char *pipeline);
/* Free the job and set *job to NULL (NULL is ignored). Ownership: consumes
 * *job. Thread: any. */
SPN_API void spn_client_job_free(spn_client_job_t **job);
/* Setters: return SPN_OK or SPN_ENOMEM. Ownership: job borrowed; strings
 * are copied. Thread: any, one at a time per job. */
SPN_API int32_t spn_client_job_input(spn_client_job_t *job, const char *name, const char *path);
SPN_API int32_t spn_client_job_output(spn_client_job_t *job, const char *name, const char *path);
SPN_API int32_t spn_client_job_param(spn_client_job_t *job, const char *key, const char *value);
SPN_API void spn_client_job_priority(spn_client_job_t *job, int32_t priority);
SPN_API void spn_client_job_max_attempts(spn_client_job_t *job, uint32_t n);
/* Seconds from submission; a job still queued then fails.
 * Ownership: arguments borrowed. Thread: the client's (one thread at a time). */
SPN_API void spn_client_job_deadline(spn_client_job_t *job, double seconds);
/* Seconds one attempt may run (client library 1.3): past them the attempt
 * is stopped and fails ("timed out after S s"), and is retried while
 * attempts are left. Without it the gateway's job_timeout_s applies (by
 * default none). The gateway refuses a value outside (0, 7 days].
 * Ownership: job borrowed. Thread: any, one at a time per job. */
SPN_API void spn_client_job_timeout(spn_client_job_t *job, double seconds);
SPN_API int32_t spn_client_job_idempotency_key(spn_client_job_t *job, const char *key);
/* Split a video job into n segments cut at its input's keyframes, or into
 * segments of about `seconds` each; they run as separate jobs on any worker
 * and are joined in order (docs/jobs.md, "Segments"). The gateway checks
 * the value (an integer >= 1; seconds > 0) and names the field.
 * Ownership: job borrowed. Thread: any, one at a time per job. */
SPN_API void spn_client_job_segments(spn_client_job_t *job, double n);
SPN_API void spn_client_job_segment_seconds(spn_client_job_t *job, double seconds);

/* Submit; *id gets the job id, *existed (may be NULL) whether the
 * idempotency key named an existing job. Errors: the gateway's message in
 * err (SPN_EPERM for a path outside the roots, SPN_EINVAL for a bad job,
 * SPN_ETIMEDOUT when the gateway does not answer). Ownership: job borrowed.
 * Thread: the client's (one thread at a time). */
SPN_API int32_t spn_client_submit(spn_client_t *c, const spn_client_job_t *job, int64_t *id,
                                  bool *existed, spn_error_t *err);
/* The job's state now, into *st; errors as for submit. Ownership: *st is
 * the caller's, filled. Thread: the client's (one thread at a time). */
SPN_API int32_t spn_client_status(spn_client_t *c, int64_t id, spn_client_status_t *st,
                                  spn_error_t *err);
/* Return non-zero to stop watching early. */
typedef int (*spn_client_event_cb)(void *user, const spn_client_status_t *ev);
/* Follow a job until it reaches a terminal state, calling cb (may be NULL)
 * for every event; *final gets the last one. Waits without a time limit
 * while events arrive (progress, state changes) and re-checks the status
 * when silent for timeout_ms. When the gateway does not answer that either
 * (it stopped or restarts; the job is in its queue and goes on), cb is
 * called again with the last status, and spn_client_unanswered_ms says for
 * how long; the watch goes on (and follows a restarted gateway) until cb
 * returns non-zero. With cb NULL it gives up after 60 timeout_ms without
 * an answer (10 min at the default): SPN_ETIMEDOUT, the message says what
 * the job was doing, *final gets the last status. Before 1.2 it gave up
 * after about 1000 such rounds, without calling cb.
 * Ownership: cb called on this thread during the call. Thread: the client's (one thread at a time). */
SPN_API int32_t spn_client_watch(spn_client_t *c, int64_t id, spn_client_event_cb cb, void *user,
                                 spn_client_status_t *final, spn_error_t *err);

/* Why job `id` waits, as the last status or watch event this client
 * received for it said: no worker that runs its pipeline has been seen
 * lately, so it stays queued until one asks for work ("waiting" in the
 * status; docs/jobs.md, "A job that no worker runs"). Copies the line into
 * out (n bytes, may be 0) and returns true; false when that status had none
 * (a queued job behind busy workers, a job that runs, or the last status
 * was of another job). Call it from a spn_client_watch callback to follow
 * the line as it comes and goes. Since 1.1.
 * Ownership: arguments borrowed; out is the caller's. Thread: the client's (one thread at a time). */
SPN_API bool spn_client_waiting(const spn_client_t *c, int64_t id, char *out, size_t n);

/* How long the gateway has not answered this client, in ms, once a wait
 * for it timed out (a call's, or a watch's); 0 while it answers. Since 1.2.
 * Ownership: c borrowed. Thread: the client's (one thread at a time). */
SPN_API int64_t spn_client_unanswered_ms(const spn_client_t *c);

/* Cancel: a queued job at once, a running one at its next batch boundary.
 * *state (may be NULL) gets the state after the request.
 * Ownership: arguments borrowed. Thread: the client's (one thread at a time). */
SPN_API int32_t spn_client_cancel(spn_client_t *c, int64_t id, spn_queue_state_t *state,
                                  spn_error_t *err);
/* List jobs in `state` (-1: all), newest first, at most `limit`.
 * Ownership: arguments borrowed. Thread: the client's (one thread at a time). */
SPN_API int32_t spn_client_list(spn_client_t *c, int32_t state, uint32_t limit,
                                spn_client_event_cb cb, void *user, spn_error_t *err);
/* Raw request: send TYPE with a JSON object body and wait for the reply
 * with the same "req". Ownership: caller frees *reply_json (free) and gets
 * the reply's type in reply_type (17 bytes). Thread: the client's (one thread at a time). */
SPN_API int32_t spn_client_request(spn_client_t *c, const char *type, const char *json_body,
                                   char reply_type[17], char **reply_json, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
