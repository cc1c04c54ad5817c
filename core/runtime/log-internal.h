/* log-internal.h — the per-runtime logger.
 *
 * One logger per runtime, gateway or worker (no process-wide state). A line is
 * either one JSON object ({"ts","level","msg","job_id","stage","device",
 * "event","attempt","duration_ms","worker","pipeline"}, absent fields left
 * out) or human text, chosen at creation (AUTO: text when the fd is a TTY).
 * Lines are written with one write(2) each, so lines from different threads
 * never interleave. */
#ifndef SPINDLE_LOG_INTERNAL_H
#define SPINDLE_LOG_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

typedef struct spn__logger spn__logger_t;

/* fd -1 = stderr. format: spn_log_format_t. Ownership: caller owns *out.
 * Thread: any. */
int32_t spn__logger_new(int32_t level, int32_t format, int fd, spn__logger_t **out);
void spn__logger_free(spn__logger_t **lg);
/* stage and device may be NULL; job_id 0 = none. Thread: any. */
void spn__log(spn__logger_t *lg, int32_t level, uint64_t job_id, const char *stage, const char *device,
              const char *fmt, ...) SPN_PRINTF(6, 7);
void spn__logv(spn__logger_t *lg, int32_t level, uint64_t job_id, const char *stage, const char *device,
               const char *fmt, va_list ap) SPN_PRINTF(6, 0);
int32_t spn__logger_level(const spn__logger_t *lg);
/* Records logged at SPN_LOG_WARN or SPN_LOG_ERROR since the logger was made,
 * filtered out or not (0 for other levels). Thread: any. */
uint64_t spn__logger_count(const spn__logger_t *lg, int32_t level);
/* True when the logger writes JSON lines. */
bool spn__logger_json(const spn__logger_t *lg);

/* Hold: from spn__log_hold until spn__log_release, lines the calling thread
 * logs are kept and written together at the release (up to 64 KiB; beyond
 * that, and lines of other threads, are written at once). A loop uses it to
 * send its replies before it spends time on their log lines. A hold by one
 * thread makes spn__log_hold of another a no-op. Thread: any; release only
 * acts in the thread that holds. */
void spn__log_hold(spn__logger_t *lg);
void spn__log_release(spn__logger_t *lg);

/* The structured fields of one line. job_id 0, NULL strings and negative
 * numbers are left out. event names a job lifecycle step (submitted, leased,
 * succeeded, failed, retried, dead, cancelled, ...). */
typedef struct spn__log_fields {
  uint64_t job_id;
  const char *stage, *device, *event, *worker, *pipeline;
  int32_t attempt;
  int64_t duration_ms;
} spn__log_fields_t;
#define SPN__LOG_FIELDS_INIT {.attempt = -1, .duration_ms = -1}

/* f may be NULL. Thread: any. */
void spn__log_f(spn__logger_t *lg, int32_t level, const spn__log_fields_t *f, const char *fmt, ...)
    SPN_PRINTF(4, 5);
void spn__log_fv(spn__logger_t *lg, int32_t level, const spn__log_fields_t *f, const char *fmt, va_list ap)
    SPN_PRINTF(4, 0);

/* Warnings kept for a reader (spn_job_warning, spn_pipeline_warning): the
 * first SPN__WARNS_KEEP lines a job's or a pipeline's stages logged at
 * SPN_LOG_WARN or above, each "STAGE: message" cut at SPN__WARN_MAX bytes,
 * and how many there were in all. Whatever the log level. */
#define SPN__WARNS_KEEP 16
#define SPN__WARN_MAX 400
typedef struct spn__warns {
  pthread_mutex_t mu;
  char *kept[SPN__WARNS_KEEP];
  uint32_t n_kept;
  uint64_t n_total;
} spn__warns_t;

void spn__warns_init(spn__warns_t *w);
void spn__warns_destroy(spn__warns_t *w); /* frees the kept lines */
/* Thread: any. stage may be NULL. */
void spn__warns_addv(spn__warns_t *w, const char *stage, const char *fmt, va_list ap) SPN_PRINTF(3, 0);
uint64_t spn__warns_count(spn__warns_t *w);
/* Copy line i into buf (cut to size); SPN_EINVAL when i is not kept. */
int32_t spn__warns_get(spn__warns_t *w, size_t i, char *buf, size_t size);

#endif
