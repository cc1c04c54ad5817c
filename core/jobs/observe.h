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

#include "jobs-internal.h"
#include "log-internal.h"
#include "spindle/runtime.h"

typedef struct spn__observe spn__observe_t;

/* Replaces q's ops with the observing wrapper (q keeps working as before;
 * spn_queue_free frees both). who: "spindle serve" for the log lines.
 * *out is owned by the wrapper: valid until the queue is freed. */
int32_t spn__observe_attach(spn_queue_t *q, const char *who, spn__observe_t **out, spn_error_t *err);
spn__logger_t *spn__observe_logger(spn__observe_t *o);

/* Workers for spindle_workers. */
typedef struct spn__observe_workers {
  uint32_t local;
  size_t remote;
} spn__observe_workers_t;

/* The whole /metrics body (Prometheus text 0.0.4), malloc'd, NUL-ended;
 * NULL when out of memory or the queue cannot be read (err says why). */
char *spn__observe_render(spn__observe_t *o, const spn__observe_workers_t *w, spn_error_t *err);

/* spindle_queue_depth groups at most this many queued jobs per scrape
 * (spindle_jobs{state="queued"} always counts them all). */
#define SPN__OBSERVE_DEPTH_MAX 10000
/* Upper bounds (seconds) of the job duration histogram. */
#define SPN__OBSERVE_DURATION_BUCKETS 12

#endif
