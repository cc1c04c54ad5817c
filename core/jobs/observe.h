/* observe.h — what the gateway tells operators: the job lifecycle log and
 * the Prometheus metrics.
 *
 * spn__observe_attach() wraps the server's queue: every transition the queue
 * makes (submit, lease, complete, fail, cancel, sweep, worker lost) passes
 * the wrapper, which logs one lifecycle line (event submitted, leased,
 * succeeded, retried, failed, dead, cancelled) and counts it. The scrape
 * (spn__observe_render) adds the live figures: jobs by state, queue depth
 * per pipeline and priority, workers, and per-GPU figures read from NVML
 * when it can be loaded. Loop thread only, like the queue. */
#ifndef SPINDLE_JOBS_OBSERVE_H
#define SPINDLE_JOBS_OBSERVE_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "jobs-internal.h"
#include "log-internal.h"
#include "spindle/runtime.h"

typedef struct spn__observe spn__observe_t;

/* Replaces q's ops with the observing wrapper (q keeps working as before;
 * spn_queue_free frees both). who: "spindle serve" for the log lines.
 * *out is owned by the wrapper: valid until the queue is freed. */
int32_t spn__observe_attach(spn_queue_t *q, const char *who, spn__observe_t **out, spn_error_t *err);
spn__logger_t *spn__observe_logger(spn__observe_t *o);

/* Workers for spindle_workers, and for spindle_queue_workers where the
 * queue has no roster (SQLite: this gateway's are all there are). */
typedef struct spn__observe_workers {
  uint32_t local;
  size_t remote;
  size_t remote_draining; /* of remote */
  size_t remote_gone;     /* lost without draining in the last SPN_ROSTER_KEEP_MS */
  bool draining;          /* this gateway */
} spn__observe_workers_t;

/* The whole /metrics body (Prometheus text 0.0.4), malloc'd, NUL-ended;
 * NULL when out of memory or the queue cannot be read (err says why).
 * runner (may be NULL) adds its families (spn__runner_metrics). */
char *spn__observe_render(spn__observe_t *o, const spn__observe_workers_t *w, const spn_job_runner_t *runner,
                          spn_error_t *err);

/* ---- Prometheus text, shared by the gateway, the worker and the runner ---- */

typedef struct spn__mbuf {
  char *p;
  size_t n, cap;
  bool oom;
} spn__mbuf_t;
void spn__mbuf_put(spn__mbuf_t *b, const char *fmt, ...) SPN_PRINTF(2, 3);
/* A label value with \\, " and newline escaped. */
void spn__mbuf_label(spn__mbuf_t *b, const char *v);
void spn__mbuf_family(spn__mbuf_t *b, const char *name, const char *type, const char *help);

/* The pipeline runner's families (runner-pipeline.c): load time per
 * pipeline, per-stage latency and batch-size histograms, bytes copied per
 * edge and direction, devices quarantined; nothing for another runner.
 * Thread: any. Bytes per device need the device of each edge's copies in
 * spn_edge_stats_t (today: per edge only). */
void spn__runner_metrics(const spn_job_runner_t *runner, spn__mbuf_t *b);
/* Devices the runner's runtime can use now; -1 when it has no runtime. */
int64_t spn__runner_usable_devices(const spn_job_runner_t *runner);

/* Readiness on devices, for /readyz of the gateway (with local slots) and the
 * worker: false (why says which) when the runner's runtime has devices but
 * none is usable. The one place to change when the device API does. */
bool spn__observe_devices_ready(const spn_job_runner_t *runner, char *why, size_t cap);

/* ---- HTTP (/healthz, /readyz, /metrics) ---- */

typedef struct spn__http_reply {
  int code;
  const char *ctype;
  char *body; /* malloc'd, NUL-ended; freed by the server */
} spn__http_reply_t;
/* Answer one GET of path. Thread: the server's loop thread (spn__http_open
 * with a loop) or libmicrohttpd's thread (without one). */
typedef void (*spn__http_handler_t)(void *user, const char *path, spn__http_reply_t *out);

/* An HTTP server on "HOST:PORT" (libmicrohttpd, http.c). With a loop, it is
 * driven on that loop and fn runs on the loop's thread; spn__http_close must
 * then be called on that thread and the loop run on so its handles close.
 * Without a loop, it serves from a thread of its own. log (may be NULL) takes
 * libmicrohttpd's messages at debug level. Ownership: caller owns *out and
 * frees it with spn__http_close. Thread: the loop's thread, or any. */
typedef struct spn__http spn__http_t;
int32_t spn__http_open(const char *addr, spn__http_handler_t fn, void *user, uv_loop_t *loop, spn__logger_t *log,
                       spn__http_t **out, spn_error_t *err);
void spn__http_close(spn__http_t **h);

/* ---- the worker's metrics and probes (spindle worker --http) ---- */

typedef struct spn__wobs spn__wobs_t;
/* Serves /healthz, /readyz, /metrics on http ("HOST:PORT") when not NULL.
 * runner is borrowed. Thread: any for every call below. */
int32_t spn__wobs_new(const spn_job_runner_t *runner, uint32_t slots, const char *http, spn__wobs_t **out,
                      spn_error_t *err);
/* A job of `pipeline` ended on this worker `seconds` after its lease:
 * outcome "succeeded", "failed" or "cancelled" by status; warned: it has
 * warnings (counted when it succeeded). */
void spn__wobs_job_end(spn__wobs_t *o, const char *pipeline, double seconds, int32_t status, bool warned);
void spn__wobs_busy(spn__wobs_t *o, int delta);
void spn__wobs_draining(spn__wobs_t *o);
/* A remote worker's gateway answers (up) or has not for a while: /readyz
 * and spindle_worker_gateway_up follow it. Not called: no gateway (a
 * stateless worker), neither shows one. */
void spn__wobs_gateway(spn__wobs_t *o, bool up);
/* A stateless worker waits for its queue at start-up (waiting) or has
 * heard it: /readyz answers 503 "waiting for the job queue" meanwhile. */
void spn__wobs_queue_wait(spn__wobs_t *o, bool waiting);
/* A run was abandoned inside a stage's call (spn_exec_result_t.wedged):
 * /healthz and /readyz answer 503 with why from then on (the process takes
 * no more jobs and should be restarted). */
void spn__wobs_wedged(spn__wobs_t *o, const char *why);
void spn__wobs_free(spn__wobs_t **o);

/* spindle_queue_depth groups at most this many queued jobs per scrape
 * (spindle_jobs{state="queued"} always counts them all). */
#define SPN__OBSERVE_DEPTH_MAX 10000
/* Upper bounds (seconds) of the job duration histogram. */
#define SPN__OBSERVE_DURATION_BUCKETS 12

#endif
