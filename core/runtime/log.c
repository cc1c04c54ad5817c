/* log.c — structured logging for one runtime.
 *
 * Each runtime owns a logger: level, format and destination are per runtime,
 * never global, so two runtimes in one process log independently. A record
 * is formatted into a stack buffer and written with a single write(2): POSIX
 * keeps such writes to a pipe or file whole, so lines never interleave and
 * no lock is needed. JSON lines escape every control character; long messages
 * are truncated, never split. */
#include "log-internal.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "spindle/runtime.h"

struct spn__logger {
  int32_t level;
  int32_t json;
  int fd;
  /* spn__log_hold: the holding thread's marker (NULL when not held) and
   * the lines it logged since; only the holding thread touches held. */
  _Atomic(const char *) holder;
  char *held;
  size_t nheld, capheld;
  /* Records logged at warn and error, whatever the level filter: metrics
   * (spindle_log_messages_total) count what went wrong even where the log
   * is quiet. */
  _Atomic uint64_t warns, errors;
};

/* Identifies the calling thread by an address of its own: never written,
 * so no state is shared through it. */
static _Thread_local const char thread_marker;

/* Held lines beyond this are written at once (a burst of errors must not
 * grow the buffer without bound). */
#define HELD_MAX 65536

int32_t spn__logger_new(int32_t level, int32_t format, int fd, spn__logger_t **out) {
  spn__logger_t *lg = calloc(1, sizeof *lg);
  if (!lg)
    return SPN_ENOMEM;
  lg->level = level;
  lg->fd = fd < 0 ? STDERR_FILENO : fd;
  if (format == SPN_LOG_FORMAT_AUTO)
    lg->json = !isatty(lg->fd);
  else
    lg->json = format == SPN_LOG_FORMAT_JSON;
  *out = lg;
  return SPN_OK;
}

void spn__logger_free(spn__logger_t **lg) {
  if (!lg || !*lg)
    return;
  free((*lg)->held);
  free(*lg);
  *lg = NULL;
}

int32_t spn__logger_level(const spn__logger_t *lg) { return lg->level; }

static const char *level_name(int32_t level) {
  switch (level) {
  case SPN_LOG_DEBUG: return "debug";
  case SPN_LOG_INFO: return "info";
  case SPN_LOG_WARN: return "warn";
  default: return "error";
  }
}

/* Append `s` JSON-escaped to buf[*n..cap); keeps room for the closing text. */
static void json_str(char *buf, size_t *n, size_t cap, const char *s) {
  size_t i = *n;
  if (i + 1 < cap)
    buf[i++] = '"';
  for (; s && *s && i + 8 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      buf[i++] = '\\';
      buf[i++] = (char)c;
    } else if (c == '\n') {
      buf[i++] = '\\';
      buf[i++] = 'n';
    } else if (c < 0x20) {
      i += (size_t)snprintf(buf + i, cap - i, "\\u%04x", c);
    } else {
      buf[i++] = (char)c;
    }
  }
  if (i + 1 < cap)
    buf[i++] = '"';
  *n = i;
}

bool spn__logger_json(const spn__logger_t *lg) { return lg && lg->json; }

/* Append ,"key":"value" (JSON) when value is set. */
static void json_field(char *line, size_t *n, size_t cap, const char *key, const char *value) {
  if (!value || *n + strlen(key) + 16 >= cap)
    return;
  *n += (size_t)snprintf(line + *n, cap - *n, ",\"%s\":", key);
  json_str(line, n, cap - 4, value);
}

static void write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return;
    p += w;
    n -= (size_t)w;
  }
}

/* Writes the held lines in pieces of whole lines of at most PIPE_BUF bytes
 * (POSIX keeps such writes to a pipe whole, so another thread's line never
 * lands inside one of ours). */
static void flush_held(spn__logger_t *lg) {
  size_t off = 0;
  while (off < lg->nheld) {
    size_t end = off;
    while (end < lg->nheld) {
      const char *nl = memchr(lg->held + end, '\n', lg->nheld - end);
      size_t after = nl ? (size_t)(nl - lg->held) + 1 : lg->nheld;
      if (after - off > PIPE_BUF && end > off)
        break; /* this line goes in the next piece */
      end = after;
    }
    write_all(lg->fd, lg->held + off, end - off);
    off = end;
  }
  lg->nheld = 0;
}

/* Appends one line to the held lines (writing them first when full, so the
 * order stays); false when it must be written now. */
static bool hold_line(spn__logger_t *lg, const char *line, size_t n) {
  if (lg->nheld + n > HELD_MAX)
    flush_held(lg);
  if (lg->nheld + n > lg->capheld) {
    size_t cap = lg->capheld ? lg->capheld * 2 : 4096;
    while (cap < lg->nheld + n)
      cap *= 2;
    char *nb = realloc(lg->held, cap);
    if (!nb) {
      flush_held(lg);
      return false;
    }
    lg->held = nb;
    lg->capheld = cap;
  }
  memcpy(lg->held + lg->nheld, line, n);
  lg->nheld += n;
  return true;
}

void spn__log_hold(spn__logger_t *lg) {
  const char *none = NULL;
  if (lg)
    atomic_compare_exchange_strong(&lg->holder, &none, &thread_marker);
}

void spn__log_release(spn__logger_t *lg) {
  if (!lg || atomic_load(&lg->holder) != &thread_marker)
    return;
  flush_held(lg);
  atomic_store(&lg->holder, NULL);
}

uint64_t spn__logger_count(const spn__logger_t *lg, int32_t level) {
  if (!lg)
    return 0;
  return level == SPN_LOG_WARN ? atomic_load(&lg->warns) : level == SPN_LOG_ERROR ? atomic_load(&lg->errors) : 0;
}

void spn__log_fv(spn__logger_t *lg, int32_t level, const spn__log_fields_t *f, const char *fmt, va_list ap) {
  if (lg && level == SPN_LOG_WARN)
    atomic_fetch_add(&lg->warns, 1);
  else if (lg && level >= SPN_LOG_ERROR)
    atomic_fetch_add(&lg->errors, 1);
  if (!lg || level < lg->level)
    return;
  static const spn__log_fields_t none = SPN__LOG_FIELDS_INIT;
  if (!f)
    f = &none;
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[64];
  snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)(ts.tv_nsec / 1000000) % 1000);
  char line[2048];
  size_t n = 0, cap = sizeof line - 2;
  if (lg->json) {
    n += (size_t)snprintf(line, cap, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":", when, level_name(level));
    json_str(line, &n, cap - 192, msg);
    if (f->job_id)
      n += (size_t)snprintf(line + n, cap - n, ",\"job_id\":%llu", (unsigned long long)f->job_id);
    json_field(line, &n, cap, "stage", f->stage);
    json_field(line, &n, cap, "device", f->device);
    json_field(line, &n, cap, "event", f->event);
    json_field(line, &n, cap, "pipeline", f->pipeline);
    json_field(line, &n, cap, "worker", f->worker);
    if (f->attempt >= 0 && n + 24 < cap)
      n += (size_t)snprintf(line + n, cap - n, ",\"attempt\":%d", (int)f->attempt);
    if (f->duration_ms >= 0 && n + 40 < cap)
      n += (size_t)snprintf(line + n, cap - n, ",\"duration_ms\":%lld", (long long)f->duration_ms);
    if (n < cap)
      line[n++] = '}';
  } else {
    n += (size_t)snprintf(line, cap, "%s %-5s", when, level_name(level));
    if (f->stage && n < cap)
      n += (size_t)snprintf(line + n, cap - n, " [%s%s%s]", f->stage, f->device ? "@" : "",
                            f->device ? f->device : "");
    else if (f->device && n < cap)
      n += (size_t)snprintf(line + n, cap - n, " [%s]", f->device);
    if (f->job_id && n < cap)
      n += (size_t)snprintf(line + n, cap - n, " job %llu:", (unsigned long long)f->job_id);
    if (n < cap)
      n += (size_t)snprintf(line + n, cap - n, " %s", msg);
    if (f->attempt >= 0 && n < cap)
      n += (size_t)snprintf(line + n, cap - n, " (attempt %d)", (int)f->attempt);
    if (f->duration_ms >= 0 && n < cap)
      n += (size_t)snprintf(line + n, cap - n, " [%lld ms]", (long long)f->duration_ms);
  }
  if (n > cap)
    n = cap;
  line[n++] = '\n';
  if (atomic_load_explicit(&lg->holder, memory_order_relaxed) == &thread_marker && hold_line(lg, line, n))
    return;
  write_all(lg->fd, line, n);
}

void spn__log_f(spn__logger_t *lg, int32_t level, const spn__log_fields_t *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  spn__log_fv(lg, level, f, fmt, ap);
  va_end(ap);
}

void spn__logv(spn__logger_t *lg, int32_t level, uint64_t job_id, const char *stage, const char *device,
               const char *fmt, va_list ap) {
  spn__log_fields_t f = SPN__LOG_FIELDS_INIT;
  f.job_id = job_id;
  f.stage = stage;
  f.device = device;
  spn__log_fv(lg, level, &f, fmt, ap);
}

void spn__log(spn__logger_t *lg, int32_t level, uint64_t job_id, const char *stage, const char *device,
              const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  spn__logv(lg, level, job_id, stage, device, fmt, ap);
  va_end(ap);
}

/* ---- warnings kept for readers ---- */

void spn__warns_init(spn__warns_t *w) {
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->mu, NULL);
}

void spn__warns_destroy(spn__warns_t *w) {
  for (uint32_t i = 0; i < w->n_kept; i++)
    free(w->kept[i]);
  w->n_kept = 0;
  pthread_mutex_destroy(&w->mu);
}

void spn__warns_addv(spn__warns_t *w, const char *stage, const char *fmt, va_list ap) {
  char *line = NULL;
  pthread_mutex_lock(&w->mu);
  bool keep = w->n_kept < SPN__WARNS_KEEP;
  w->n_total++;
  pthread_mutex_unlock(&w->mu);
  if (!keep)
    return;
  line = malloc(SPN__WARN_MAX);
  if (!line)
    return; /* counted; the line itself is lost */
  int n = stage && *stage ? snprintf(line, SPN__WARN_MAX, "%s: ", stage) : 0;
  if (n < 0 || n >= SPN__WARN_MAX)
    n = 0;
  vsnprintf(line + n, SPN__WARN_MAX - (size_t)n, fmt, ap);
  pthread_mutex_lock(&w->mu);
  if (w->n_kept < SPN__WARNS_KEEP) {
    w->kept[w->n_kept++] = line;
    line = NULL;
  }
  pthread_mutex_unlock(&w->mu);
  free(line); /* another thread took the last place meanwhile */
}

uint64_t spn__warns_count(spn__warns_t *w) {
  pthread_mutex_lock(&w->mu);
  uint64_t n = w->n_total;
  pthread_mutex_unlock(&w->mu);
  return n;
}

int32_t spn__warns_get(spn__warns_t *w, size_t i, char *buf, size_t size) {
  int32_t rc = SPN_EINVAL;
  pthread_mutex_lock(&w->mu);
  if (i < w->n_kept) {
    if (buf && size)
      snprintf(buf, size, "%s", w->kept[i]);
    rc = SPN_OK;
  }
  pthread_mutex_unlock(&w->mu);
  return rc;
}
