/* status.c — status names and messages (records and assertions are
 * header-inline in spindle/status.h).
 *
 * The tables come from SPN_STATUS_MAP so a new code cannot be added to the
 * enum without a name and a message. Error records (status.h, inline) are
 * caller-owned: nothing here touches shared state, so any thread may use them. */
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
