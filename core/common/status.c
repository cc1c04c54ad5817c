/* status.c — status names and messages, error records, assertions.
 *
 * The tables come from SPN_STATUS_MAP so a new code cannot be added to the
 * enum without a name and a message. Error records are caller-owned: nothing
 * here touches shared state, so any thread may use them. */
#include "spindle/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *spn_strerror(int32_t status) {
  switch (status) {
#define SPN__STATUS_MSG(name, val, msg) case (val): return (msg);
    SPN_STATUS_MAP(SPN__STATUS_MSG)
#undef SPN__STATUS_MSG
  }
  return "unknown status";
}

const char *spn_err_name(int32_t status) {
  switch (status) {
#define SPN__STATUS_NAME(name, val, msg) case (val): return "SPN_" #name;
    SPN_STATUS_MAP(SPN__STATUS_NAME)
#undef SPN__STATUS_NAME
  }
  return "SPN_UNKNOWN";
}

int32_t spn_error_vset(spn_error_t *err, int32_t code, const char *fmt, va_list ap) {
  if (err) {
    err->code = code;
    if (fmt)
      vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    else
      snprintf(err->msg, sizeof err->msg, "%s", spn_strerror(code));
  }
  return code;
}

int32_t spn_error_set(spn_error_t *err, int32_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  spn_error_vset(err, code, fmt, ap);
  va_end(ap);
  return code;
}

int32_t spn_error_prefix(spn_error_t *err, const char *fmt, ...) {
  if (!err)
    return SPN_OK;
  char prefix[SPN_ERROR_MSG_MAX];
  char old[SPN_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, err->msg, sizeof old);
  /* Truncation is acceptable: the message is for people, the code is kept. */
  snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
  return err->code;
}

void spn_error_clear(spn_error_t *err) {
  if (err) {
    err->code = SPN_OK;
    err->msg[0] = '\0';
  }
}

void spn__assert_fail(const char *expr, const char *file, int line, const char *func) {
  fprintf(stderr, "spindle: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
  abort();
}
