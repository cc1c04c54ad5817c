/* queue-redis.c — the job queue on Redis (hiredis): any number of gateways
 * and `spindle worker --queue redis://...` processes on any number of hosts
 * share one queue.
 *
 * The data layout and every transition are in queue-redis.lua.h: each
 * transition is one Lua script, so it is atomic against every other client.
 * Invariants (the same as the SQLite backend's, queue-sqlite.c):
 * - a job is leased only from queued, highest priority first, FIFO within
 *   one, once its backoff has passed and not past its deadline;
 * - the attempt number is the lease token: renew/complete/fail must present
 *   (id, attempt, owner) of the live lease, so a report from a worker that
 *   lost its lease changes nothing;
 * - a lease is a pending entry of the consumer group "spindle" on the stream
 *   P run; a renew resets its idle time (XCLAIM), and a sweep by any client
 *   claims the entries idle longer than the lease (XAUTOCLAIM) and fails
 *   their attempt — so a worker or gateway killed at any moment loses
 *   nothing: its jobs come back after one lease time;
 * - an idempotency key maps to one job for 24 h (SET with a TTL);
 * - the lag of the group "spindle" on the stream P waiting equals the number
 *   of queued jobs (what KEDA scales on, 0 -> N): every script that moves a
 *   job into or out of queued adds or reads one token in the same script;
 *   drift (a queue written by a Spindle without the mirror, an old RDB) is
 *   repaired on connect and by every sweep.
 * Durability is Redis's: see docs/jobs.md ("Redis backend").
 *
 * One connection, used from one thread. A broken connection fails the call
 * in progress with SPN_EIO and is re-opened by the next call; a write whose
 * reply was lost is not repeated (an idempotency key makes a client's retry
 * safe).
 *
 * Group commit: between begin and commit, submissions without an
 * idempotency key are pipelined — sent at once, their replies read at the
 * next other call or at commit — so a batch of submissions costs one round
 * trip instead of one each. Their ids come from a block reserved with one
 * INCRBY; the FIFO rank is taken by the script, so order is still the order
 * in which Redis ran the submissions. A failed reply fails the commit, and
 * the gateway then tells every client of the batch that nothing was stored
 * (some may have been: a client retries with an idempotency key).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>

#include "jobs-internal.h"
#include "queue-redis.lua.h"

#define IDEM_WINDOW_MS (24LL * 3600 * 1000)
#define ARGS_MAX 24
#define ID_BLOCK 256

enum {
  SC_SUBMIT,
  SC_LEASE,
  SC_RENEW,
  SC_PROGRESS,
  SC_COMPLETE,
  SC_FAIL,
  SC_CANCEL,
  SC_SWEEP,
  SC_RELEASE,
  SC_RELEASE_OWNER,
  SC_LIST,
  SC_CHILDREN,
  SC_UNPUBLISHED,
  SC_WAITING_REPAIR,
  SC_PURGE,
  SC_COUNT
};

static const char *const script_body[SC_COUNT] = {
    [SC_SUBMIT] = RQ_LUA_PRELUDE RQ_LUA_SUBMIT,
    [SC_LEASE] = RQ_LUA_PRELUDE RQ_LUA_LEASE,
    [SC_RENEW] = RQ_LUA_PRELUDE RQ_LUA_RENEW,
    [SC_PROGRESS] = RQ_LUA_PRELUDE RQ_LUA_PROGRESS,
    [SC_COMPLETE] = RQ_LUA_PRELUDE RQ_LUA_COMPLETE,
    [SC_FAIL] = RQ_LUA_PRELUDE RQ_LUA_FAIL,
    [SC_CANCEL] = RQ_LUA_PRELUDE RQ_LUA_CANCEL,
    [SC_SWEEP] = RQ_LUA_PRELUDE RQ_LUA_SWEEP,
    [SC_RELEASE] = RQ_LUA_PRELUDE RQ_LUA_RELEASE,
    [SC_RELEASE_OWNER] = RQ_LUA_PRELUDE RQ_LUA_RELEASE_OWNER,
    [SC_LIST] = RQ_LUA_PRELUDE RQ_LUA_LIST,
    [SC_CHILDREN] = RQ_LUA_PRELUDE RQ_LUA_CHILDREN,
    [SC_UNPUBLISHED] = RQ_LUA_UNPUBLISHED,
    [SC_WAITING_REPAIR] = RQ_LUA_PRELUDE RQ_LUA_WAITING_REPAIR,
    [SC_PURGE] = RQ_LUA_PRELUDE RQ_LUA_PURGE,
};

typedef struct rq {
  redisContext *c;
  char *host, *unix_path, *user, *password;
  int port, db;
  char url[256]; /* for messages, without the password */
  char prefix[64];
  uint32_t backoff_base_ms, backoff_max_ms, lease_ms;
  uint64_t rng;
  char sha[SC_COUNT][41];
  bool loaded;
  bool in_batch;     /* between begin and commit */
  uint32_t pending;  /* pipelined submissions whose replies are unread */
  bool batch_failed; /* one of them failed */
  char batch_error[SPN_ERROR_MSG_MAX];
  int64_t id_next, id_end; /* reserved ids [id_next, id_end) */
  /* A connection attempt that failed is not made again before retry_at
   * (monotonic s; the wait doubles from RQ_RETRY_MIN_S to RQ_RETRY_MAX_S):
   * a Redis that does not answer costs a caller one timeout, not one per
   * call (a gateway's tick makes several), and the caller's loop goes on
   * (SIGTERM, watchers). down: the error of that attempt, which every call
   * until the next one returns. */
  double retry_at, retry_s;
  char down[SPN_ERROR_MSG_MAX];
  /* The last connection attempt got an error reply that does not pass by
   * waiting (a wrong password, a database Redis does not have, a server
   * without streams), not a silence, a refusal or a Redis still loading. */
  bool refused;
} rq_t;

#define RQ_TIMEOUT_S 5
#define RQ_RETRY_MIN_S 1.0
#define RQ_RETRY_MAX_S 4.0

/* Arguments of a script call (after P). */
typedef struct rargs {
  int n;
  const char *v[ARGS_MAX];
  size_t len[ARGS_MAX];
  char num[ARGS_MAX][32];
} rargs_t;

static redisReply *rq_eval(rq_t *q, int sc, rargs_t *a, const char *what, spn_error_t *err);

/* ---- connection ---- */

/* Error replies that pass by waiting: a Redis that loads its data after a
 * restart, a replica without its primary, a script that runs too long, a
 * failover under way. */
static bool rq_reply_passes(const char *msg) {
  static const char *const codes[] = {"LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "READONLY", "CLUSTERDOWN"};
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
    size_t n = strlen(codes[i]);
    if (!strncmp(msg, codes[i], n) && (msg[n] == ' ' || msg[n] == '\0'))
      return true;
  }
  return false;
}

static int32_t rq_error(rq_t *q, spn_error_t *err, const char *what, const char *detail) {
  if (!strcmp(detail, strerror(EAGAIN))) /* hiredis's words for its timeout */
    return spn_error_set(err, SPN_EIO, "redis queue %s: %s: no answer within %d s", q->url, what, RQ_TIMEOUT_S);
  return spn_error_set(err, SPN_EIO, "redis queue %s: %s: %s", q->url, what, detail);
}

static void rq_drop(rq_t *q) {
  if (q->c)
    redisFree(q->c);
  q->c = NULL;
  q->loaded = false;
  if (q->pending) {
    q->pending = 0;
    q->batch_failed = true;
    snprintf(q->batch_error, sizeof q->batch_error, "redis queue %s: connection lost", q->url);
  }
}

/* Read the replies of pipelined submissions. */
static void rq_drain(rq_t *q) {
  while (q->pending && q->c) {
    redisReply *r = NULL;
    if (redisGetReply(q->c, (void **)&r) != REDIS_OK || !r) {
      snprintf(q->batch_error, sizeof q->batch_error, "redis queue %s: submitting: %s", q->url,
               q->c->errstr[0] ? q->c->errstr : "connection lost");
      q->batch_failed = true;
      rq_drop(q);
      return;
    }
    q->pending--;
    if (r->type == REDIS_REPLY_ERROR) {
      snprintf(q->batch_error, sizeof q->batch_error, "redis queue %s: submitting: %s", q->url, r->str);
      q->batch_failed = true;
    }
    freeReplyObject(r);
  }
}

/* A command on the open connection; NULL with *err set on failure (the
 * connection is dropped when it broke). */
static redisReply *rq_cmd(rq_t *q, int argc, const char **argv, const size_t *lens, const char *what,
                          spn_error_t *err) {
  rq_drain(q);
  if (!q->c) {
    rq_error(q, err, what, "connection lost");
    return NULL;
  }
  redisReply *r = redisCommandArgv(q->c, argc, argv, lens);
  if (!r) {
    rq_error(q, err, what, q->c->errstr[0] ? q->c->errstr : "connection lost");
    rq_drop(q);
    return NULL;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    q->refused = !rq_reply_passes(r->str);
    rq_error(q, err, what, r->str);
    freeReplyObject(r);
    return NULL;
  }
  return r;
}

static int32_t rq_simple(rq_t *q, const char *what, spn_error_t *err, int argc, ...) {
  const char *argv[8];
  size_t lens[8];
  va_list ap;
  va_start(ap, argc);
  for (int i = 0; i < argc && i < 8; i++) {
    argv[i] = va_arg(ap, const char *);
    lens[i] = strlen(argv[i]);
  }
  va_end(ap);
  redisReply *r = rq_cmd(q, argc, argv, lens, what, err);
  if (!r)
    return SPN_EIO;
  freeReplyObject(r);
  return SPN_OK;
}

static int32_t rq_load_scripts(rq_t *q, spn_error_t *err) {
  for (int i = 0; i < SC_COUNT; i++) {
    const char *argv[] = {"SCRIPT", "LOAD", script_body[i]};
    size_t lens[] = {6, 4, strlen(script_body[i])};
    redisReply *r = rq_cmd(q, 3, argv, lens, "loading its scripts", err);
    if (!r)
      return SPN_EIO;
    if (r->type != REDIS_REPLY_STRING || r->len != 40) {
      freeReplyObject(r);
      return rq_error(q, err, "loading its scripts", "unexpected reply to SCRIPT LOAD");
    }
    memcpy(q->sha[i], r->str, 40);
    q->sha[i][40] = '\0';
    freeReplyObject(r);
  }
  q->loaded = true;
  return SPN_OK;
}

static int32_t rq_connect_now(rq_t *q, spn_error_t *err);

static int32_t rq_connect(rq_t *q, spn_error_t *err) {
  if (q->c && !q->c->err && q->loaded)
    return SPN_OK;
  double mono = spn__mono_s();
  if (q->retry_at && mono < q->retry_at)
    return spn_error_set(err, SPN_EIO, "%s", q->down); /* the same words: callers can say it once */
  spn_error_t e = SPN_ERROR_INIT;
  int32_t rc = rq_connect_now(q, &e);
  if (rc < 0) {
    q->retry_s = q->retry_s ? q->retry_s * 2 : RQ_RETRY_MIN_S;
    if (q->retry_s > RQ_RETRY_MAX_S)
      q->retry_s = RQ_RETRY_MAX_S;
    q->retry_at = spn__mono_s() + q->retry_s;
    snprintf(q->down, sizeof q->down, "%s", e.msg);
    if (err)
      *err = e;
    return rc;
  }
  q->retry_at = q->retry_s = 0;
  return SPN_OK;
}

static int32_t rq_connect_now(rq_t *q, spn_error_t *err) {
  q->id_next = q->id_end = 0; /* a new server may have other ids */
  q->refused = false;
  rq_drop(q);
  struct timeval tv = {.tv_sec = RQ_TIMEOUT_S};
  q->c = q->unix_path ? redisConnectUnixWithTimeout(q->unix_path, tv)
                      : redisConnectWithTimeout(q->host, q->port, tv);
  if (!q->c)
    return spn_error_set(err, SPN_ENOMEM, "redis queue %s: out of memory", q->url);
  if (q->c->err) {
    int32_t rc = rq_error(q, err, "cannot connect", q->c->errstr);
    rq_drop(q);
    return rc;
  }
  redisSetTimeout(q->c, tv);
  int32_t rc = SPN_OK;
  if (q->password) {
    rc = q->user ? rq_simple(q, "AUTH (auth_file)", err, 3, "AUTH", q->user, q->password)
                 : rq_simple(q, "AUTH (auth_file)", err, 2, "AUTH", q->password);
  }
  if (rc == SPN_OK && q->db) {
    char db[16];
    snprintf(db, sizeof db, "%d", q->db);
    rc = rq_simple(q, "SELECT", err, 2, "SELECT", db);
  }
  /* The lease stream and the waiting mirror, each with its group;
   * BUSYGROUP means another client made it. */
  static const char *const streams[][2] = {{"run", "creating the lease group"},
                                           {"waiting", "creating the waiting mirror's group"}};
  for (size_t k = 0; rc == SPN_OK && k < sizeof streams / sizeof *streams; k++) {
    char stream[96];
    snprintf(stream, sizeof stream, "%s%s", q->prefix, streams[k][0]);
    const char *argv[] = {"XGROUP", "CREATE", stream, "spindle", "0", "MKSTREAM"};
    size_t lens[6];
    for (int i = 0; i < 6; i++)
      lens[i] = strlen(argv[i]);
    redisReply *r = redisCommandArgv(q->c, 6, argv, lens);
    if (!r)
      rc = rq_error(q, err, streams[k][1], q->c->errstr);
    else {
      if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0) {
        q->refused = !rq_reply_passes(r->str);
        rc = rq_error(q, err, streams[k][1], r->str);
      }
      freeReplyObject(r);
    }
  }
  if (rc == SPN_OK)
    rc = rq_load_scripts(q, err);
  if (rc == SPN_OK) {
    /* Count the queued jobs into the mirror (a queue an older Spindle
     * wrote has none). The scripts are loaded, so the connection counts as
     * open and rq_eval does not come back here. */
    rargs_t a = {0};
    redisReply *r = rq_eval(q, SC_WAITING_REPAIR, &a, "repairing the waiting mirror", err);
    if (r)
      freeReplyObject(r);
    else
      rc = SPN_EIO;
  }
  if (rc < 0)
    rq_drop(q);
  return rc;
}

/* Before a command on the key P<suffix>: owed replies drained, connected
 * (or err), the key's name in key. */
static int32_t rq_keyed(rq_t *q, const char *suffix, char *key, size_t n, spn_error_t *err) {
  rq_drain(q);
  if (rq_connect(q, err) < 0)
    return SPN_EIO;
  snprintf(key, n, "%s%s", q->prefix, suffix);
  return SPN_OK;
}

/* ---- script calls ---- */

static void a_str(rargs_t *a, const char *s) {
  SPN_ASSERT(a->n < ARGS_MAX);
  a->v[a->n] = s ? s : "";
  a->len[a->n] = strlen(a->v[a->n]);
  a->n++;
}

static void a_i64(rargs_t *a, int64_t x) {
  snprintf(a->num[a->n], sizeof a->num[a->n], "%lld", (long long)x);
  a_str(a, a->num[a->n]);
}

static void a_dbl(rargs_t *a, double x) {
  snprintf(a->num[a->n], sizeof a->num[a->n], "%.17g", x);
  a_str(a, a->num[a->n]);
}

static double rq_rand(rq_t *q) {
  /* xorshift64*; the jitter of retries (same law as spn__backoff_ms) */
  q->rng ^= q->rng >> 12;
  q->rng ^= q->rng << 25;
  q->rng ^= q->rng >> 27;
  return (double)((q->rng * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

/* EVALSHA script 0 P args...; a NOSCRIPT (Redis restarted without its
 * script cache) reloads the scripts and runs again: nothing ran the first
 * time. */
static redisReply *rq_eval(rq_t *q, int sc, rargs_t *a, const char *what, spn_error_t *err) {
  rq_drain(q);
  if (rq_connect(q, err) < 0)
    return NULL;
  const char *argv[ARGS_MAX + 4];
  size_t lens[ARGS_MAX + 4];
  argv[0] = "EVALSHA";
  lens[0] = 7;
  argv[2] = "0";
  lens[2] = 1;
  argv[3] = q->prefix;
  lens[3] = strlen(q->prefix);
  for (int i = 0; i < a->n; i++) {
    argv[4 + i] = a->v[i];
    lens[4 + i] = a->len[i];
  }
  for (int tries = 0; tries < 2; tries++) {
    argv[1] = q->sha[sc];
    lens[1] = 40;
    redisReply *r = redisCommandArgv(q->c, 4 + a->n, argv, lens);
    if (!r) {
      rq_error(q, err, what, q->c->errstr[0] ? q->c->errstr : "connection lost");
      rq_drop(q);
      return NULL;
    }
    if (r->type != REDIS_REPLY_ERROR)
      return r;
    if (tries == 0 && !strncmp(r->str, "NOSCRIPT", 8)) {
      freeReplyObject(r);
      if (rq_load_scripts(q, err) < 0)
        return NULL;
      continue;
    }
    q->refused = !rq_reply_passes(r->str);
    rq_error(q, err, what, r->str);
    freeReplyObject(r);
    return NULL;
  }
  return NULL;
}

/* ---- jobs from hashes ---- */

static int64_t i64(const char *s) { return s ? strtoll(s, NULL, 10) : 0; }

static int32_t job_from_reply(const redisReply *r, spn_queue_job_t *j, spn_error_t *err) {
  memset(j, 0, sizeof *j);
  if (r->type != REDIS_REPLY_ARRAY || r->elements == 0)
    return spn_error_set(err, SPN_ENOENT, "job: no such job");
  for (size_t i = 0; i + 1 < r->elements; i += 2) {
    const char *k = r->element[i]->str, *v = r->element[i + 1]->str;
    if (!k || !v)
      continue;
    char **dst = NULL;
    if (!strcmp(k, "id"))
      j->id = i64(v);
    else if (!strcmp(k, "st"))
      j->state = (spn_queue_state_t)i64(v);
    else if (!strcmp(k, "pr"))
      j->priority = (int32_t)i64(v);
    else if (!strcmp(k, "att"))
      j->attempts = (uint32_t)i64(v);
    else if (!strcmp(k, "max"))
      j->max_attempts = (uint32_t)i64(v);
    else if (!strcmp(k, "spec"))
      dst = &j->spec_json;
    else if (!strcmp(k, "idem"))
      dst = &j->idem_key;
    else if (!strcmp(k, "own"))
      dst = &j->lease_owner;
    else if (!strcmp(k, "rsn"))
      dst = &j->reason;
    else if (!strcmp(k, "errs"))
      dst = &j->errors_json;
    else if (!strcmp(k, "wn"))
      dst = &j->warnings_json;
    else if (!strcmp(k, "cr"))
      j->created_ms = i64(v);
    else if (!strcmp(k, "dl"))
      j->deadline_ms = i64(v);
    else if (!strcmp(k, "nb"))
      j->not_before_ms = i64(v);
    else if (!strcmp(k, "lu"))
      j->lease_until_ms = i64(v);
    else if (!strcmp(k, "cs"))
      j->compute_s = strtod(v, NULL);
    else if (!strcmp(k, "gs"))
      j->gpu_s = strtod(v, NULL);
    else if (!strcmp(k, "pd"))
      j->progress_done = (uint64_t)i64(v);
    else if (!strcmp(k, "pt"))
      j->progress_total = (uint64_t)i64(v);
    else if (!strcmp(k, "cx"))
      j->cancel_requested = i64(v) != 0;
    else if (!strcmp(k, "par"))
      j->parent = i64(v);
    else if (!strcmp(k, "si"))
      j->seg_index = (int32_t)i64(v);
    else if (!strcmp(k, "pn"))
      j->pending = (uint32_t)i64(v);
    else if (k[0] == 'x' && (k[1] == 'b' || k[1] == 'n') && k[2] >= '0' && k[2] <= '3' && !k[3])
      (k[1] == 'b' ? j->xfer.bytes : j->xfer.ns)[k[2] - '0'] = (uint64_t)i64(v);
    else if (k[0] == 't' && k[1] >= '0' && k[1] < '0' + SPN_QSTATE_COUNT && !k[2])
      j->t_state_ms[k[1] - '0'] = i64(v);
    if (dst && !(*dst = strdup(v))) {
      spn__queue_job_clear(j);
      return spn_error_set(err, SPN_ENOMEM, "job queue: out of memory");
    }
  }
  if (!j->spec_json || !j->errors_json) {
    int64_t id = j->id;
    spn__queue_job_clear(j);
    return spn_error_set(err, SPN_EIO, "job %lld: incomplete record in Redis", (long long)id);
  }
  if (j->state == SPN_QSTATE_RUNNING && j->lease_owner && !j->lease_owner[0]) {
    free(j->lease_owner);
    j->lease_owner = NULL;
  }
  return SPN_OK;
}

/* ---- operations ---- */

static int32_t rq_begin(void *qv, spn_error_t *err) {
  rq_t *q = qv;
  (void)err;
  q->in_batch = true;
  return SPN_OK;
}

static int32_t rq_commit(void *qv, spn_error_t *err) {
  rq_t *q = qv;
  rq_drain(q);
  q->in_batch = false;
  bool failed = q->batch_failed;
  q->batch_failed = false;
  if (failed)
    return spn_error_set(err, SPN_EIO, "%s", q->batch_error);
  return SPN_OK;
}

/* Whether a spec names outputs; and (*files) any file at all. */
static bool has_outputs(const char *spec_json, bool *files) {
  cJSON *o = cJSON_Parse(spec_json);
  const cJSON *out = cJSON_GetObjectItemCaseSensitive(o, "outputs");
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "inputs");
  bool has = cJSON_IsObject(out) && out->child;
  if (files)
    *files = has || (cJSON_IsObject(in) && in->child);
  cJSON_Delete(o);
  return has;
}

/* Pipelined submission (in a batch, no idempotency key). */
static int32_t rq_submit_pipelined(rq_t *q, const spn_queue_submit_t *s, int64_t now, int64_t *id,
                                   spn_error_t *err) {
  if (q->id_next == q->id_end) {
    char key[96];
    if (rq_keyed(q, "seq", key, sizeof key, err) < 0)
      return SPN_EIO;
    const char *argv[] = {"INCRBY", key, "256"};
    size_t lens[] = {6, strlen(key), 3};
    redisReply *r = rq_cmd(q, 3, argv, lens, "reserving job ids", err);
    if (!r)
      return SPN_EIO;
    if (r->type != REDIS_REPLY_INTEGER) {
      freeReplyObject(r);
      return rq_error(q, err, "reserving job ids", "unexpected reply");
    }
    q->id_end = r->integer + 1;
    q->id_next = q->id_end - ID_BLOCK;
    freeReplyObject(r);
  }
  *id = q->id_next++;
  rargs_t a = {0};
  a_str(&a, s->spec_json);
  a_i64(&a, s->priority);
  a_str(&a, "");
  a_i64(&a, s->deadline_ms);
  a_i64(&a, s->max_attempts ? s->max_attempts : 1);
  a_i64(&a, now);
  a_i64(&a, IDEM_WINDOW_MS);
  a_i64(&a, *id);
  a_str(&a, has_outputs(s->spec_json, NULL) ? "1" : "0");
  a_i64(&a, s->parent);
  a_i64(&a, s->seg_index);
  a_i64(&a, s->pending);
  a_str(&a, "0");
  const char *argv[ARGS_MAX + 4] = {"EVALSHA", q->sha[SC_SUBMIT], "0", q->prefix};
  size_t lens[ARGS_MAX + 4] = {7, 40, 1, strlen(q->prefix)};
  for (int i = 0; i < a.n; i++) {
    argv[4 + i] = a.v[i];
    lens[4 + i] = a.len[i];
  }
  if (redisAppendCommandArgv(q->c, 4 + a.n, argv, lens) != REDIS_OK)
    return spn_error_set(err, SPN_ENOMEM, "redis queue: out of memory");
  q->pending++;
  /* Do not let a huge batch grow the output buffer without bound. */
  if (q->pending >= 1024)
    rq_drain(q);
  return SPN_OK;
}

static int32_t rq_submit(void *qv, const spn_queue_submit_t *s, int64_t now, int64_t *id, bool *existed,
                         spn_error_t *err) {
  rq_t *q = qv;
  bool files = false;
  bool outs = has_outputs(s->spec_json, &files);
  /* A job whose files are checked waits for the script's answer: a clash
   * is this SUBMIT's reply. */
  bool check = s->clash && s->parent == 0 && files;
  if (q->in_batch && !s->idem_key && !check && q->c && q->loaded && !q->c->err) {
    *existed = false;
    return rq_submit_pipelined(q, s, now, id, err);
  }
  rargs_t a = {0};
  a_str(&a, s->spec_json);
  a_i64(&a, s->priority);
  a_str(&a, s->idem_key);
  a_i64(&a, s->deadline_ms);
  a_i64(&a, s->max_attempts ? s->max_attempts : 1);
  a_i64(&a, now);
  a_i64(&a, IDEM_WINDOW_MS);
  a_str(&a, "");
  a_str(&a, outs ? "1" : "0");
  a_i64(&a, s->parent);
  a_i64(&a, s->seg_index);
  a_i64(&a, s->pending);
  a_str(&a, check ? "1" : "0");
  redisReply *r = rq_eval(q, SC_SUBMIT, &a, "submitting a job", err);
  if (!r)
    return SPN_EIO;
  int32_t rc = SPN_OK;
  redisReply **e = r->type == REDIS_REPLY_ARRAY ? r->element : NULL;
  if (e && r->elements == 2 && e[0]->type == REDIS_REPLY_INTEGER && e[1]->type == REDIS_REPLY_INTEGER) {
    *id = e[0]->integer;
    *existed = e[1]->integer != 0;
  } else if (check && e && r->elements == 7 && e[1]->type == REDIS_REPLY_INTEGER && e[1]->integer == 2 &&
             e[2]->type == REDIS_REPLY_INTEGER && e[3]->type == REDIS_REPLY_STRING &&
             e[4]->type == REDIS_REPLY_INTEGER && e[5]->type == REDIS_REPLY_INTEGER &&
             e[6]->type == REDIS_REPLY_INTEGER) {
    *s->clash = (spn_queue_clash_t){.kind = (spn_clash_kind_t)e[2]->integer, .job = e[4]->integer,
                                    .state = (spn_queue_state_t)e[5]->integer, .stopping = e[6]->integer != 0};
    snprintf(s->clash->path, sizeof s->clash->path, "%s", e[3]->str);
    rc = SPN_EBUSY;
  } else {
    rc = rq_error(q, err, "submitting a job", "unexpected reply");
  }
  freeReplyObject(r);
  return rc;
}

static int32_t rq_lease(void *qv, const char *owner, const char *pipelines, int64_t now, int64_t lease_ms,
                        spn_queue_job_t *out, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_str(&a, owner);
  a_i64(&a, now);
  a_i64(&a, lease_ms);
  a_str(&a, pipelines ? pipelines : "");
  redisReply *r = rq_eval(q, SC_LEASE, &a, "leasing a job", err);
  if (!r)
    return SPN_EIO;
  int32_t rc = r->type == REDIS_REPLY_NIL ? SPN_EAGAIN : job_from_reply(r, out, err);
  freeReplyObject(r);
  return rc;
}

static int32_t lease_int(rq_t *q, int sc, rargs_t *a, const char *what, int64_t *v, spn_error_t *err) {
  redisReply *r = rq_eval(q, sc, a, what, err);
  if (!r)
    return SPN_EIO;
  int32_t rc = SPN_OK;
  if (r->type == REDIS_REPLY_INTEGER)
    *v = r->integer;
  else
    rc = rq_error(q, err, what, "unexpected reply");
  freeReplyObject(r);
  return rc;
}

static int32_t not_held(spn_error_t *err, int64_t id, uint32_t attempt, const char *owner) {
  return spn_error_set(err, SPN_ESTATE, "job %lld: lease %u is not held by %s", (long long)id, attempt,
                       owner);
}

static int32_t rq_renew(void *qv, int64_t id, uint32_t attempt, const char *owner, int64_t now,
                        int64_t lease_ms, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, id);
  a_i64(&a, attempt);
  a_str(&a, owner);
  a_i64(&a, now);
  a_i64(&a, lease_ms);
  int64_t v = 0;
  int32_t rc = lease_int(q, SC_RENEW, &a, "renewing a lease", &v, err);
  if (rc == SPN_OK && v == 2)
    rc = spn_error_set(err, SPN_ECANCELLED, "job %lld: cancel requested", (long long)id);
  else if (rc == SPN_OK && v != 1)
    rc = not_held(err, id, attempt, owner);
  return rc;
}

static int32_t rq_progress(void *qv, int64_t id, uint64_t done, uint64_t total, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, id);
  a_i64(&a, (int64_t)done);
  a_i64(&a, (int64_t)total);
  int64_t v = 0;
  return lease_int(q, SC_PROGRESS, &a, "recording progress", &v, err);
}

/* An attempt's transfers as the scripts' last eight arguments (add_xfer):
 * bytes then ns by direction, clamped to what HINCRBY takes. */
static void a_xfer(rargs_t *a, const spn_job_xfer_t *x) {
  for (int i = 0; i < 8; i++) {
    uint64_t v = !x ? 0 : i < 4 ? x->bytes[i] : x->ns[i - 4];
    a_i64(a, v > INT64_MAX ? INT64_MAX : (int64_t)v);
  }
}

static int32_t rq_complete(void *qv, int64_t id, uint32_t attempt, const char *owner, double compute_s,
                           double gpu_s, const spn_job_xfer_t *xfer, const char *warnings, int64_t now,
                           spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, id);
  a_i64(&a, attempt);
  a_str(&a, owner);
  a_dbl(&a, compute_s);
  a_dbl(&a, gpu_s);
  a_i64(&a, now);
  a_xfer(&a, xfer);
  a_str(&a, warnings); /* NULL: "" */
  int64_t v = 0;
  int32_t rc = lease_int(q, SC_COMPLETE, &a, "completing a job", &v, err);
  if (rc == SPN_OK && v != 1)
    rc = not_held(err, id, attempt, owner);
  return rc;
}

static int32_t rq_fail(void *qv, int64_t id, uint32_t attempt, const char *owner, const char *reason,
                       spn_fail_how_t how, double compute_s, double gpu_s, const spn_job_xfer_t *xfer, int64_t now,
                       spn_queue_state_t *state, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, id);
  a_i64(&a, attempt);
  a_str(&a, owner);
  a_str(&a, reason ? reason : "failed");
  a_str(&a, how == SPN_FAIL_CANCELLED ? "1" : how == SPN_FAIL_FINAL ? "2" : "0");
  a_dbl(&a, compute_s);
  a_dbl(&a, gpu_s);
  a_i64(&a, now);
  a_dbl(&a, rq_rand(q));
  a_i64(&a, q->backoff_base_ms);
  a_i64(&a, q->backoff_max_ms);
  a_xfer(&a, xfer);
  int64_t v = 0;
  int32_t rc = lease_int(q, SC_FAIL, &a, "recording a failure", &v, err);
  if (rc == SPN_OK && v < 0)
    rc = not_held(err, id, attempt, owner);
  else if (rc == SPN_OK && state)
    *state = (spn_queue_state_t)v;
  return rc;
}

static int32_t rq_cancel(void *qv, int64_t id, int64_t now, spn_queue_state_t *state, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, id);
  a_i64(&a, now);
  int64_t v = 0;
  int32_t rc = lease_int(q, SC_CANCEL, &a, "cancelling a job", &v, err);
  if (rc < 0)
    return rc;
  if (v == -1)
    return spn_error_set(err, SPN_ENOENT, "job %lld: no such job", (long long)id);
  if (v <= -2) {
    *state = (spn_queue_state_t)(-2 - v);
    return spn_error_set(err, SPN_ESTATE, "job %lld: already %s", (long long)id,
                         spn_queue_state_name(*state));
  }
  *state = (spn_queue_state_t)v;
  return SPN_OK;
}

static int32_t moved(rq_t *q, redisReply *r, const char *what, spn_queue_changed_cb cb, void *user,
                     spn_error_t *err) {
  if (r->type != REDIS_REPLY_ARRAY) {
    freeReplyObject(r);
    return rq_error(q, err, what, "unexpected reply");
  }
  int32_t n = 0;
  for (size_t i = 0; i + 1 < r->elements; i += 2, n++)
    if (cb)
      cb(user, r->element[i]->integer, (spn_queue_state_t)r->element[i + 1]->integer);
  freeReplyObject(r);
  return n;
}

static int32_t rq_sweep(void *qv, int64_t now, spn_queue_changed_cb cb, void *user, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, now);
  a_i64(&a, q->lease_ms);
  a_dbl(&a, rq_rand(q));
  a_i64(&a, q->backoff_base_ms);
  a_i64(&a, q->backoff_max_ms);
  redisReply *r = rq_eval(q, SC_SWEEP, &a, "sweeping leases and deadlines", err);
  return r ? moved(q, r, "sweeping", cb, user, err) : SPN_EIO;
}

static int32_t rq_release(void *qv, int64_t id, uint32_t attempt, const char *owner, const char *note,
                          int64_t now, spn_error_t *err) {
  rq_t *q = qv;
  (void)note;
  rargs_t a = {0};
  a_i64(&a, id);
  a_i64(&a, attempt);
  a_str(&a, owner);
  a_i64(&a, now);
  int64_t v = 0;
  int32_t rc = lease_int(q, SC_RELEASE, &a, "releasing a job", &v, err);
  if (rc == SPN_OK && v != 1)
    rc = spn_error_set(err, SPN_ESTATE, "job %lld: lease %u is not held by %s (or cancel requested)",
                       (long long)id, attempt, owner);
  return rc;
}

static int32_t rq_release_owner(void *qv, const char *owner, const char *reason, int64_t now,
                                spn_queue_changed_cb cb, void *user, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_str(&a, owner);
  a_str(&a, reason);
  a_i64(&a, now);
  a_dbl(&a, rq_rand(q));
  a_i64(&a, q->backoff_base_ms);
  a_i64(&a, q->backoff_max_ms);
  redisReply *r = rq_eval(q, SC_RELEASE_OWNER, &a, "re-queueing a lost worker's jobs", err);
  return r ? moved(q, r, "re-queueing", cb, user, err) : SPN_EIO;
}

static int32_t rq_unpublished(void *qv, int64_t id, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, id);
  int64_t v = 0;
  return lease_int(q, SC_UNPUBLISHED, &a, "recording a removed marker", &v, err);
}

static int32_t rq_get(void *qv, int64_t id, spn_queue_job_t *out, spn_error_t *err) {
  rq_t *q = qv;
  rq_drain(q);
  if (rq_connect(q, err) < 0)
    return SPN_EIO;
  char key[128];
  snprintf(key, sizeof key, "%sjob:%lld", q->prefix, (long long)id);
  const char *argv[] = {"HGETALL", key};
  size_t lens[] = {7, strlen(key)};
  redisReply *r = rq_cmd(q, 2, argv, lens, "reading a job", err);
  if (!r)
    return SPN_EIO;
  int32_t rc = job_from_reply(r, out, err);
  freeReplyObject(r);
  if (rc == SPN_ENOENT)
    rc = spn_error_set(err, SPN_ENOENT, "job %lld: no such job", (long long)id);
  return rc;
}

static int32_t rq_list(void *qv, int32_t state, uint32_t limit, spn_queue_list_cb cb, void *user,
                       spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, state);
  a_i64(&a, limit);
  redisReply *r = rq_eval(q, SC_LIST, &a, "listing jobs", err);
  if (!r)
    return SPN_EIO;
  int32_t rc = SPN_OK;
  for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
    spn_queue_job_t j;
    if (job_from_reply(r->element[i], &j, NULL) < 0)
      continue; /* deleted between the scan and the read */
    cb(user, &j);
    spn__queue_job_clear(&j);
  }
  freeReplyObject(r);
  return rc;
}

static int32_t rq_children(void *qv, int64_t parent, spn_queue_list_cb cb, void *user, spn_error_t *err) {
  rq_t *q = qv;
  rargs_t a = {0};
  a_i64(&a, parent);
  redisReply *r = rq_eval(q, SC_CHILDREN, &a, "listing a job's segments", err);
  if (!r)
    return SPN_EIO;
  for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
    spn_queue_job_t j;
    if (job_from_reply(r->element[i], &j, NULL) < 0)
      continue;
    cb(user, &j);
    spn__queue_job_clear(&j);
  }
  freeReplyObject(r);
  return SPN_OK;
}

static int32_t rq_counts(void *qv, int64_t out[SPN_QSTATE_COUNT], spn_error_t *err) {
  rq_t *q = qv;
  rq_drain(q);
  if (rq_connect(q, err) < 0)
    return SPN_EIO;
  char keys[SPN_QSTATE_COUNT][96];
  for (int i = 0; i < SPN_QSTATE_COUNT; i++) {
    snprintf(keys[i], sizeof keys[i], "%sst:%d", q->prefix, i);
    const char *argv[] = {"ZCARD", keys[i]};
    size_t lens[] = {5, strlen(keys[i])};
    redisAppendCommandArgv(q->c, 2, argv, lens);
  }
  int32_t rc = SPN_OK;
  for (int i = 0; i < SPN_QSTATE_COUNT; i++) {
    redisReply *r = NULL;
    if (redisGetReply(q->c, (void **)&r) != REDIS_OK || !r) {
      rc = rq_error(q, err, "counting jobs", q->c->errstr[0] ? q->c->errstr : "connection lost");
      rq_drop(q);
      return rc;
    }
    out[i] = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    if (r->type == REDIS_REPLY_ERROR)
      rc = rq_error(q, err, "counting jobs", r->str);
    freeReplyObject(r);
  }
  return rc;
}

/* HGETALL of P<suffix>: cb for each field and value (both strings). */
static int32_t rq_hgetall(rq_t *q, const char *suffix, const char *what,
                          void (*cb)(void *user, const char *field, const char *value), void *user,
                          spn_error_t *err) {
  char key[96];
  if (rq_keyed(q, suffix, key, sizeof key, err) < 0)
    return SPN_EIO;
  const char *argv[] = {"HGETALL", key};
  size_t lens[] = {7, strlen(key)};
  redisReply *r = rq_cmd(q, 2, argv, lens, what, err);
  if (!r)
    return SPN_EIO;
  for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
    const redisReply *k = r->element[i], *v = r->element[i + 1];
    if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING)
      cb(user, k->str, v->str);
  }
  freeReplyObject(r);
  return SPN_OK;
}

static void event_count(void *user, const char *field, const char *value) {
  uint64_t *out = user;
  for (int e = 0; e < SPN_QEV_COUNT; e++)
    if (!strcmp(field, spn__queue_event_name(e)))
      out[e] = strtoull(value, NULL, 10);
}

static int32_t rq_events(void *qv, uint64_t out[SPN_QEV_COUNT], spn_error_t *err) {
  memset(out, 0, SPN_QEV_COUNT * sizeof *out);
  return rq_hgetall(qv, "events", "reading the event counters", event_count, out, err);
}

/* Worker presence: P seen, a hash of pipeline name -> ms; "\n" (no
 * pipeline's name) stands for a worker of any pipeline. */
static int32_t rq_present(void *qv, const char *pipelines, int64_t now, spn_error_t *err) {
  rq_t *q = qv;
  rq_drain(q);
  if (rq_connect(q, err) < 0)
    return SPN_EIO;
  size_t n = 1, len = 0;
  for (const char *name = NULL; spn__pipeline_filter_next(pipelines, &name, &len);)
    n++;
  char key[96], at[24];
  snprintf(key, sizeof key, "%sseen", q->prefix);
  snprintf(at, sizeof at, "%lld", (long long)now);
  const char **argv = malloc((2 + 2 * n) * sizeof *argv);
  size_t *lens = malloc((2 + 2 * n) * sizeof *lens);
  if (!argv || !lens) {
    free(argv);
    free(lens);
    return spn_error_set(err, SPN_ENOMEM, "redis queue: out of memory");
  }
  int argc = 0;
  argv[argc] = "HSET", lens[argc++] = 4;
  argv[argc] = key, lens[argc++] = strlen(key);
  if (!pipelines) {
    argv[argc] = "\n", lens[argc++] = 1;
    argv[argc] = at, lens[argc++] = strlen(at);
  }
  for (const char *name = NULL; spn__pipeline_filter_next(pipelines, &name, &len);) {
    argv[argc] = name, lens[argc++] = len;
    argv[argc] = at, lens[argc++] = strlen(at);
  }
  redisReply *r = argc > 2 ? rq_cmd(q, argc, argv, lens, "recording its workers", err) : NULL;
  int32_t rc = argc > 2 && !r ? SPN_EIO : SPN_OK;
  freeReplyObject(r);
  free(argv);
  free(lens);
  return rc;
}

static int32_t rq_seen(void *qv, const char *pipeline, int64_t *at, spn_error_t *err) {
  rq_t *q = qv;
  *at = 0;
  char key[96];
  if (rq_keyed(q, "seen", key, sizeof key, err) < 0)
    return SPN_EIO;
  const char *argv[] = {"HMGET", key, pipeline, "\n"};
  size_t lens[] = {5, strlen(key), strlen(pipeline), 1};
  redisReply *r = rq_cmd(q, 4, argv, lens, "reading which workers are there", err);
  if (!r)
    return SPN_EIO;
  for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
    long long v = r->element[i]->type == REDIS_REPLY_STRING ? strtoll(r->element[i]->str, NULL, 10) : 0;
    *at = v > *at ? v : *at;
  }
  freeReplyObject(r);
  return SPN_OK;
}

static int32_t rq_purge(void *qv, int64_t before, uint32_t limit, uint32_t *removed, spn_error_t *err) {
  rargs_t a = {0};
  a_i64(&a, before);
  a_i64(&a, limit);
  int64_t n = 0;
  int32_t rc = lease_int(qv, SC_PURGE, &a, "deleting the jobs past their retention", &n, err);
  *removed = rc == SPN_OK && n > 0 ? (uint32_t)n : 0;
  return rc;
}

/* The roster: P workers, a hash of worker name -> its record (JSON). One
 * HSET for the records given, one HDEL for the names without one. */
static int32_t rq_roster_put(void *qv, size_t n, const char *const *names, const char *const *records,
                             spn_error_t *err) {
  rq_t *q = qv;
  char key[96];
  if (rq_keyed(q, "workers", key, sizeof key, err) < 0)
    return SPN_EIO;
  const char **argv = malloc((2 + 2 * n) * sizeof *argv);
  size_t *lens = malloc((2 + 2 * n) * sizeof *lens);
  int32_t rc = SPN_OK;
  if (!argv || !lens)
    rc = spn_error_set(err, SPN_ENOMEM, "redis queue: out of memory");
  for (int del = 0; rc == SPN_OK && del < 2; del++) {
    int argc = 0;
    argv[argc] = del ? "HDEL" : "HSET", lens[argc++] = 4;
    argv[argc] = key, lens[argc++] = strlen(key);
    for (size_t i = 0; i < n; i++) {
      if ((records[i] == NULL) != (del != 0))
        continue;
      argv[argc] = names[i], lens[argc++] = strlen(names[i]);
      if (!del)
        argv[argc] = records[i], lens[argc++] = strlen(records[i]);
    }
    if (argc == 2)
      continue;
    redisReply *r = rq_cmd(q, argc, argv, lens, del ? "removing workers from the roster" : "recording its workers",
                           err);
    rc = r ? SPN_OK : SPN_EIO;
    freeReplyObject(r);
  }
  free(argv);
  free(lens);
  return rc;
}

static int32_t rq_roster_get(void *qv, const char *name,
                             void (*cb)(void *user, const char *name, const char *record), void *user,
                             spn_error_t *err) {
  if (!name)
    return rq_hgetall(qv, "workers", "reading the roster of workers", cb, user, err);
  rq_t *q = qv;
  char key[96];
  if (rq_keyed(q, "workers", key, sizeof key, err) < 0)
    return SPN_EIO;
  const char *argv[] = {"HGET", key, name};
  size_t lens[] = {4, strlen(key), strlen(name)};
  redisReply *r = rq_cmd(q, 3, argv, lens, "reading the roster of workers", err);
  if (!r)
    return SPN_EIO;
  if (r->type == REDIS_REPLY_STRING)
    cb(user, name, r->str);
  freeReplyObject(r);
  return SPN_OK;
}

static void rq_free(void *qv) {
  rq_t *q = qv;
  rq_drop(q);
  free(q->host);
  free(q->unix_path);
  free(q->user);
  if (q->password)
    memset(q->password, 0, strlen(q->password));
  free(q->password);
  free(q);
}

static const spn_queue_ops_t rq_ops = {
    .name = "redis",
    .begin = rq_begin,
    .commit = rq_commit,
    .submit = rq_submit,
    .purge = rq_purge,
    .lease = rq_lease,
    .renew = rq_renew,
    .progress = rq_progress,
    .complete = rq_complete,
    .fail = rq_fail,
    .cancel = rq_cancel,
    .sweep = rq_sweep,
    .release = rq_release,
    .release_owner = rq_release_owner,
    .unpublished = rq_unpublished,
    .get = rq_get,
    .list = rq_list,
    .children = rq_children,
    .counts = rq_counts,
    .events = rq_events,
    .present = rq_present,
    .seen = rq_seen,
    .roster_put = rq_roster_put,
    .roster_get = rq_roster_get,
    .free = rq_free,
};

/* ---- opening ---- */

/* redis://[USER@]HOST[:PORT][/DB] or unix:///PATH[?db=N]. A password in the
 * URL is refused: it would show in `ps` and in logs; use auth_file. */
static int32_t parse_url(rq_t *q, const char *url, spn_error_t *err) {
  const char *what = "expected redis://HOST[:PORT][/DB] or unix:///PATH[?db=N]";
  if (!strncmp(url, "unix://", 7)) {
    const char *p = url + 7;
    if (*p != '/')
      return spn_error_set(err, SPN_ECONFIG, "queue url \"%s\": %s", url, what);
    const char *qm = strchr(p, '?');
    size_t n = qm ? (size_t)(qm - p) : strlen(p);
    if (!(q->unix_path = strndup(p, n)))
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    if (qm) {
      char *end;
      if (strncmp(qm, "?db=", 4) != 0 || (q->db = (int)strtol(qm + 4, &end, 10)) < 0 || *end ||
          end == qm + 4)
        return spn_error_set(err, SPN_ECONFIG, "queue url \"%s\": %s", url, what);
    }
    return SPN_OK;
  }
  if (strncmp(url, "redis://", 8) != 0)
    return spn_error_set(err, SPN_ECONFIG, "queue url \"%s\": %s%s", url, what,
                         strncmp(url, "tcp://", 6) && strncmp(url, "ipc://", 6)
                             ? ""
                             : " (a gateway's endpoint: spindle worker --connect, spindle submit --connect)");
  const char *p = url + 8;
  const char *at = strchr(p, '@');
  const char *slash = strchr(p, '/');
  if (at && (!slash || at < slash)) {
    if (memchr(p, ':', (size_t)(at - p)))
      return spn_error_set(err, SPN_ECONFIG,
                           "queue url \"%.*s...\": a password in the URL is refused; put it in the "
                           "file named by [queue] auth_file",
                           (int)(p - url), url);
    if (at > p && !(q->user = strndup(p, (size_t)(at - p))))
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    p = at + 1;
  }
  const char *end_host = slash ? slash : p + strlen(p);
  const char *colon = memchr(p, ':', (size_t)(end_host - p));
  const char *host_end = colon ? colon : end_host;
  if (host_end == p)
    return spn_error_set(err, SPN_ECONFIG, "queue url \"%s\": %s", url, what);
  if (!(q->host = strndup(p, (size_t)(host_end - p))))
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  q->port = 6379;
  if (colon) {
    char *e;
    long port = strtol(colon + 1, &e, 10);
    if (e != end_host || port < 1 || port > 65535)
      return spn_error_set(err, SPN_ECONFIG, "queue url \"%s\": port must be 1-65535", url);
    q->port = (int)port;
  }
  if (slash && slash[1]) {
    char *e;
    long db = strtol(slash + 1, &e, 10);
    if (*e || db < 0 || db > 100000)
      return spn_error_set(err, SPN_ECONFIG, "queue url \"%s\": database must be a number", url);
    q->db = (int)db;
  }
  return SPN_OK;
}

/* The auth file holds "PASSWORD" or "USER PASSWORD" on its first line. */
static int32_t read_auth(rq_t *q, const char *path, spn_error_t *err) {
  FILE *f = fopen(path, "r");
  if (!f)
    return spn_error_set(err, SPN_ECONFIG, "queue auth_file %s: %s", path, strerror(errno));
  char line[1024];
  bool got = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  if (!got)
    return spn_error_set(err, SPN_ECONFIG, "queue auth_file %s: empty", path);
  line[strcspn(line, "\r\n")] = '\0';
  char *sp = strchr(line, ' ');
  int32_t rc = SPN_OK;
  if (!line[0])
    rc = spn_error_set(err, SPN_ECONFIG, "queue auth_file %s: the first line is empty", path);
  else if (sp) {
    *sp = '\0';
    free(q->user);
    if (!(q->user = strdup(line)) || !(q->password = strdup(sp + 1)))
      rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
  } else if (!(q->password = strdup(line)))
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
  memset(line, 0, sizeof line);
  return rc;
}

int32_t spn_queue_redis_open(const spn_queue_config_t *cfg, spn_queue_t *out, spn_error_t *err) {
  out->ops = NULL;
  out->impl = NULL;
  rq_t *q = calloc(1, sizeof *q);
  if (!q)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  int32_t rc;
  const char *url = cfg->url ? cfg->url : "redis://127.0.0.1:6379";
  if ((rc = parse_url(q, url, err)) < 0)
    goto fail;
  if (q->unix_path)
    snprintf(q->url, sizeof q->url, "unix://%s", q->unix_path);
  else
    snprintf(q->url, sizeof q->url, "redis://%s:%d/%d", q->host, q->port, q->db);
  if (cfg->auth_file && (rc = read_auth(q, cfg->auth_file, err)) < 0)
    goto fail;
  const char *prefix = cfg->prefix ? cfg->prefix : "spindle:";
  if (strlen(prefix) > 40) {
    rc = spn_error_set(err, SPN_ECONFIG, "queue prefix \"%s\": at most 40 bytes", prefix);
    goto fail;
  }
  snprintf(q->prefix, sizeof q->prefix, "%s", prefix);
  q->backoff_base_ms = cfg->backoff_base_ms ? cfg->backoff_base_ms : 1000;
  q->backoff_max_ms = cfg->backoff_max_ms ? cfg->backoff_max_ms : 60000;
  q->lease_ms = cfg->lease_ms ? cfg->lease_ms : 3000;
  q->rng = cfg->seed;
  if (!q->rng) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    q->rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)getpid() ^ (uint64_t)ts.tv_sec;
  }
  q->rng |= 1;
  /* connect_later: a Redis that is not there yet (refused, silent, still
   * loading) is connected to by the first call after it answers; one that
   * answers with a refusal (password, database, version) fails the open. */
  spn_error_t e = SPN_ERROR_INIT;
  if ((rc = rq_connect(q, &e)) < 0 && (!cfg->connect_later || q->refused)) {
    if (err)
      *err = e;
    goto fail;
  }
  out->ops = &rq_ops;
  out->impl = q;
  return SPN_OK;
fail:
  rq_free(q);
  return rc;
}
