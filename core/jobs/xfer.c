/* xfer.c — a job's transfers: the bytes and time of the copies made for it
 * (its pipeline's edges and its stages' own buffer_copy calls), by
 * direction, as they travel from the runner through the worker's DONE/FAIL
 * to the queue and out in STATUS (docs/jobs.md, "Transfers").
 *
 * On the wire and in STATUS a job's transfers are one object with a member
 * per direction, {"h2d": {"bytes": N, "ms": T}, ...}. Bytes are integers up
 * to 2^53 (exact in a JSON number); a remote worker's report is checked
 * like any other input: a member that is not an object of non-negative
 * numbers makes its transfers count as none (the gateway logs why and
 * still records the attempt's outcome), so a bad worker cannot write
 * garbage into a job's record, nor cost the job its result.
 */
#include <math.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "jobs-internal.h"

const char *const spn__xfer_dir_names[4] = {"h2d", "d2h", "d2d", "h2h"};

void spn__xfer_add_to(spn_job_xfer_t *acc, const spn_job_xfer_t *x) {
  for (int d = 0; x && d < 4; d++) {
    acc->bytes[d] += x->bytes[d];
    acc->ns[d] += x->ns[d];
  }
}

void spn_job_ctx_add_transfers(spn_job_ctx_t *ctx, const uint64_t bytes[4], const uint64_t ns[4]) {
  for (int d = 0; d < 4; d++) {
    ctx->xfer.bytes[d] += bytes ? bytes[d] : 0;
    ctx->xfer.ns[d] += ns ? ns[d] : 0;
  }
}

cJSON *spn__xfer_to_json(cJSON *obj, const char *name, const spn_job_xfer_t *x) {
  cJSON *o = cJSON_AddObjectToObject(obj, name);
  for (int d = 0; o && d < 4; d++) {
    cJSON *e = cJSON_AddObjectToObject(o, spn__xfer_dir_names[d]);
    if (!e || !cJSON_AddNumberToObject(e, "bytes", (double)x->bytes[d]) ||
        !cJSON_AddNumberToObject(e, "ms", (double)x->ns[d] / 1e6))
      return NULL;
  }
  return o;
}

/* A non-negative number up to max, a whole one where integer is set: bytes
 * up to 2^53, ms up to 10^12 (31 years: its ns still fit 64 bits). */
static bool good(const cJSON *v, double max, bool integer) {
  if (!cJSON_IsNumber(v))
    return false;
  double d = v->valuedouble;
  return isfinite(d) && d >= 0 && d <= max && (!integer || d == floor(d));
}

int32_t spn__xfer_from_json(const cJSON *o, spn_job_xfer_t *x, spn_error_t *err) {
  memset(x, 0, sizeof *x);
  if (!o)
    return SPN_OK; /* a worker from before transfers were reported */
  if (!cJSON_IsObject(o))
    return spn_error_set(err, SPN_EINVAL, "\"transfers\" is not an object");
  for (int d = 0; d < 4; d++) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, spn__xfer_dir_names[d]);
    if (!e)
      continue;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bytes"), *ms = cJSON_GetObjectItemCaseSensitive(e, "ms");
    if (!cJSON_IsObject(e) || (b && !good(b, 9007199254740992.0, true)) || (ms && !good(ms, 1e12, false)))
      return spn_error_set(err, SPN_EINVAL,
                           "\"transfers\".\"%s\" must be {\"bytes\": integer >= 0, \"ms\": number >= 0}",
                           spn__xfer_dir_names[d]);
    x->bytes[d] = b ? (uint64_t)b->valuedouble : 0;
    x->ns[d] = ms ? (uint64_t)llround(ms->valuedouble * 1e6) : 0;
  }
  return SPN_OK;
}
