/* roster.c — the roster of a shared queue's workers (docs/jobs.md,
 * "spindle workers"): what each worker process records about itself, and
 * how old records leave.
 *
 * Invariants:
 * - One record per worker process, under a name that says how it leases:
 *   "gateway:HOST:PID" (a gateway's own slots), "remote:NAME" (a worker of a
 *   gateway, recorded by that gateway), "worker:NAME" (a stateless worker on
 *   the queue). A later record of a name replaces the earlier one, so a
 *   remote worker that moved to another gateway stays one record.
 * - A record is renewed every SPN_PRESENCE_MS. One that stops cleanly
 *   removes its record; one that did not (killed, lost its network) is
 *   listed as gone until SPN_ROSTER_KEEP_MS after its last renewal, and
 *   any gateway removes it then.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jobs-internal.h"
#include "proto-internal.h"

void spn__worker_identity(const char *given, char name[128], char instance[17]) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (given) {
    snprintf(name, 128, "%s", given);
  } else {
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(name, 128, "%s:%d:%lx", host, (int)getpid(), (unsigned long)ts.tv_nsec);
  }
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) /* no entropy yet (early boot): */
    v = ((uint64_t)ts.tv_sec * 1000000007u) ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)getpid();
  snprintf(instance, 17, "%016llx", (unsigned long long)v);
}

typedef struct {
  const char *instance;
  int64_t now;
  bool other;
  spn_roster_other_t *out;
} other_ctx_t;

static void other_cb(void *user, const char *name, const char *record) {
  (void)name;
  other_ctx_t *c = user;
  cJSON *r = cJSON_Parse(record);
  const char *inst = spn__json_str(r, "instance"), *gw = spn__json_str(r, "gateway");
  const cJSON *since = cJSON_GetObjectItemCaseSensitive(r, "since");
  if (inst && strcmp(inst, c->instance)) {
    int st = spn__roster_state(r, c->now);
    c->other = true;
    snprintf(c->out->instance, sizeof c->out->instance, "%s", inst);
    snprintf(c->out->gateway, sizeof c->out->gateway, "%s", gw ? gw : "");
    c->out->at = spn__roster_at(r);
    c->out->since = cJSON_IsNumber(since) ? (int64_t)since->valuedouble : 0;
    c->out->live = st == SPN_ROSTER_LIVE || st == SPN_ROSTER_DRAINING;
  }
  cJSON_Delete(r);
}

bool spn__roster_other(const spn_queue_t *q, const char *name, const char *instance, int64_t now,
                       spn_roster_other_t *out) {
  *out = (spn_roster_other_t){0};
  other_ctx_t c = {.instance = instance, .now = now, .out = out};
  spn_error_t err = SPN_ERROR_INIT;
  return q->ops->roster_get && q->ops->roster_get(q->impl, name, other_cb, &c, &err) == SPN_OK && c.other;
}

cJSON *spn__pipeline_names_json(const char *filter) {
  if (!filter)
    return cJSON_CreateNull();
  cJSON *a = cJSON_CreateArray();
  size_t len = 0;
  for (const char *name = NULL; a && spn__pipeline_filter_next(filter, &name, &len);) {
    char one[129];
    snprintf(one, sizeof one, "%.*s", (int)(len < 128 ? len : 128), name);
    cJSON_AddItemToArray(a, cJSON_CreateString(one));
  }
  return a;
}

cJSON *spn__roster_json(const spn_roster_entry_t *e) {
  cJSON *r = cJSON_CreateObject();
  if (!r)
    return NULL;
  cJSON_AddStringToObject(r, "kind", e->kind);
  if (e->gateway)
    cJSON_AddStringToObject(r, "gateway", e->gateway);
  cJSON_AddNumberToObject(r, "slots", (double)e->slots);
  cJSON_AddNumberToObject(r, "running", (double)e->running);
  cJSON_AddBoolToObject(r, "draining", e->draining);
  cJSON_AddItemToObject(r, "pipelines", spn__pipeline_names_json(e->pipelines));
  if (e->instance && *e->instance)
    cJSON_AddStringToObject(r, "instance", e->instance);
  if (e->since > 0)
    cJSON_AddNumberToObject(r, "since", (double)e->since);
  return r;
}

char *spn__roster_record(const spn_roster_entry_t *e, int64_t now) {
  cJSON *r = spn__roster_json(e);
  if (!r)
    return NULL;
  cJSON_AddNumberToObject(r, "at", (double)now);
  char *out = cJSON_PrintUnformatted(r);
  cJSON_Delete(r);
  return out;
}

int64_t spn__roster_at(const cJSON *record) {
  const cJSON *at = cJSON_GetObjectItemCaseSensitive(record, "at");
  return cJSON_IsNumber(at) && at->valuedouble > 0 ? (int64_t)at->valuedouble : 0;
}

int spn__roster_state(const cJSON *record, int64_t now) {
  int64_t at = spn__roster_at(record);
  if (!at || at < now - SPN_ROSTER_KEEP_MS)
    return SPN_ROSTER_DUE;
  if (now - at > SPN_PRESENCE_STALE_MS)
    return SPN_ROSTER_GONE;
  return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(record, "draining")) ? SPN_ROSTER_DRAINING : SPN_ROSTER_LIVE;
}

typedef struct {
  int64_t now;
  char **names;
  size_t n, cap;
  bool oom;
} prune_t;

static void prune_cb(void *user, const char *name, const char *record) {
  prune_t *p = user;
  cJSON *r = cJSON_Parse(record);
  bool old = spn__roster_state(r, p->now) == SPN_ROSTER_DUE; /* unreadable records go too */
  cJSON_Delete(r);
  if (!old || p->oom)
    return;
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 16;
    char **grown = realloc(p->names, cap * sizeof *grown);
    if (!grown) {
      p->oom = true;
      return;
    }
    p->names = grown;
    p->cap = cap;
  }
  if (!(p->names[p->n] = strdup(name)))
    p->oom = true;
  else
    p->n++;
}

int32_t spn__roster_prune(const spn_queue_t *q, int64_t now, size_t *removed, spn_error_t *err) {
  *removed = 0;
  if (!q->ops->roster_get)
    return SPN_OK;
  prune_t p = {.now = now};
  int32_t rc = q->ops->roster_get(q->impl, NULL, prune_cb, &p, err);
  const char **none = p.n ? calloc(p.n, sizeof *none) : NULL;
  if (rc == SPN_OK && p.n && !none)
    rc = spn_error_set(err, SPN_ENOMEM, "roster: out of memory");
  if (rc == SPN_OK && p.n)
    rc = q->ops->roster_put(q->impl, p.n, (const char *const *)p.names, none, err);
  if (rc == SPN_OK)
    *removed = p.n;
  for (size_t i = 0; i < p.n; i++)
    free(p.names[i]);
  free(p.names);
  free(none);
  return rc;
}
