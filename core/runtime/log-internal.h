/* log-internal.h — the per-runtime logger.
 *
 * One logger per runtime (no process-wide state). A line is either one JSON
 * object ({"ts","level","msg","job_id","stage","device"}) or human text, chosen
 * at creation (AUTO: text when the fd is a TTY). Lines are written with one
 * write(2) each, so lines from different threads never interleave. */
#ifndef SPINDLE_LOG_INTERNAL_H
#define SPINDLE_LOG_INTERNAL_H

#include <stdarg.h>
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

#endif
