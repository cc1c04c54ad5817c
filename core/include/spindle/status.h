/* spindle/status.h — the one status enum, error records and assertions.
 *
 * Every fallible Spindle function returns an int32_t status: SPN_OK (0), a
 * non-negative flow code on the data path (SPN_EOS), or a negative error.
 * Details travel in an optional spn_error_t the caller passes in; nothing is
 * kept in process-wide state, so two pipelines (and two tests) never see each
 * other's errors.
 */
#ifndef SPINDLE_STATUS_H
#define SPINDLE_STATUS_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SPN_API __attribute__((visibility("default")))
#define SPN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define SPN_API
#define SPN_PRINTF(f, a)
#endif

/* XX(NAME, value, message). Append only: values are part of the ABI and of the
 * job protocol. */
#define SPN_STATUS_MAP(XX)                                                    \
  XX(OK, 0, "success")                                                        \
  XX(EOS, 1, "end of stream")                                                 \
  XX(EAGAIN, -1, "resource temporarily unavailable")                          \
  XX(ENOMEM, -2, "out of memory")                                             \
  XX(EINVAL, -3, "invalid argument")                                          \
  XX(ENOENT, -4, "no such file or entry")                                     \
  XX(EIO, -5, "input/output error")                                           \
  XX(EPARSE, -6, "parse error")                                               \
  XX(ECONFIG, -7, "invalid configuration")                                    \
  XX(EABI, -8, "plugin ABI mismatch")                                         \
  XX(EUNSUPPORTED, -9, "not supported")                                       \
  XX(EDEVICE, -10, "device error")                                            \
  XX(ETIMEDOUT, -11, "timed out")                                             \
  XX(ECANCELLED, -12, "cancelled")                                            \
  XX(EOVERFLOW, -13, "value out of range")                                    \
  XX(EEXIST, -14, "already exists")                                           \
  XX(ETYPE, -15, "type mismatch")                                             \
  XX(EMODEL, -16, "invalid model")                                            \
  XX(EMEDIA, -17, "invalid or unreadable media")                              \
  XX(EPROTO, -18, "protocol error")                                           \
  XX(EPERM, -19, "not permitted")                                             \
  XX(ESTATE, -20, "invalid state for this operation")                         \
  XX(EBUSY, -21, "resource busy")                                             \
  XX(ECUDA, -22, "CUDA error")                                                \
  XX(ETOOBIG, -23, "message or input too large")                              \
  XX(EINTERNAL, -24, "internal error")

typedef enum spn_status {
#define SPN__STATUS_ENUM(name, val, msg) SPN_##name = (val),
  SPN_STATUS_MAP(SPN__STATUS_ENUM)
#undef SPN__STATUS_ENUM
} spn_status_t;

/* Human message for a status ("out of memory"); never NULL.
 * Ownership: static string. Thread: any. */
SPN_API const char *spn_strerror(int32_t status);
/* Symbolic name ("SPN_ENOMEM"); never NULL. Ownership: static. Thread: any. */
SPN_API const char *spn_err_name(int32_t status);

/* An error record: the status, and a message that names the input and the
 * position ("pipeline.toml:12:7: duplicate key \"name\""). */
#define SPN_ERROR_MSG_MAX 1024
typedef struct spn_error {
  int32_t code;
  char msg[SPN_ERROR_MSG_MAX];
} spn_error_t;

#define SPN_ERROR_INIT {0, {0}}

/* Record `code` and a formatted message into *err (NULL is allowed and
 * ignored). Returns `code` so callers can `return spn_error_set(...)`.
 * Header-inline so plugins use them without linking host symbols.
 * Thread: any (err is the caller's). */
#include <stdio.h>
#include <string.h>
/* spn_error_vset: Ownership: err is the caller's; ap consumed as by vsnprintf. Thread: any. */
static inline int32_t spn_error_vset(spn_error_t *err, int32_t code, const char *fmt, va_list ap) {
  if (err) {
    err->code = code;
    if (fmt)
      vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    else
      err->msg[0] = '\0';
  }
  return code;
}
/* spn_error_set: Ownership: err is the caller's. Thread: any. */
static inline int32_t spn_error_set(spn_error_t *err, int32_t code, const char *fmt, ...) SPN_PRINTF(3, 4);
static inline int32_t spn_error_set(spn_error_t *err, int32_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  spn_error_vset(err, code, fmt, ap);
  va_end(ap);
  return code;
}
/* Prefix the existing message with "prefix: " (context on the way up).
 * Truncation is acceptable: the message is for people, the code is kept.
 * Ownership: err is the caller's. Thread: any. */
static inline int32_t spn_error_prefix(spn_error_t *err, const char *fmt, ...) SPN_PRINTF(2, 3);
static inline int32_t spn_error_prefix(spn_error_t *err, const char *fmt, ...) {
  if (!err)
    return SPN_OK;
  char prefix[256];
  char old[SPN_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, err->msg, sizeof old);
  size_t n = strlen(prefix);
  if (n + 2 >= sizeof err->msg)
    n = sizeof err->msg - 3;
  memcpy(err->msg, prefix, n);
  err->msg[n] = ':';
  err->msg[n + 1] = ' ';
  size_t room = sizeof err->msg - n - 3;
  const char *nul = (const char *)memchr(old, '\0', sizeof old);
  size_t ol = nul ? (size_t)(nul - old) : sizeof old - 1;
  if (ol > room)
    ol = room;
  memcpy(err->msg + n + 2, old, ol);
  err->msg[n + 2 + ol] = '\0';
  return err->code;
}
/* spn_error_clear: Ownership: err is the caller's. Thread: any. */
static inline void spn_error_clear(spn_error_t *err) {
  if (err) {
    err->code = SPN_OK;
    err->msg[0] = '\0';
  }
}

/* Programmer errors: abort with the expression and file:line. Never used for
 * bad input. Header-inline, like the error records: a plugin may assert
 * without linking a host symbol, and the library exports no spn__ name.
 * spn__assert_fail is SPN_ASSERT's helper, not an API of its own.
 * Ownership: none (does not return). Thread: any. */
#include <stdlib.h>
#if defined(__GNUC__)
__attribute__((noreturn, cold))
#endif
static inline void spn__assert_fail(const char *expr, const char *file, int line, const char *func) {
  fprintf(stderr, "spindle: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
  abort();
}
#define SPN_ASSERT(e) ((e) ? (void)0 : spn__assert_fail(#e, __FILE__, __LINE__, __func__))

#ifdef __cplusplus
}
#endif
#endif
