/* jobs-internal.h — the job service's private interfaces: the durable queue
 * vtable, the server and worker configuration, job specs in JSON, path
 * confinement and the job executor shared by in-process and remote workers.
 * Never installed. */
#ifndef SPINDLE_JOBS_INTERNAL_H
#define SPINDLE_JOBS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "spindle/jobs.h"
#include "spindle/status.h"

typedef struct cJSON cJSON;

/* ---- clock ---- */
int64_t spn__now_ms(void);  /* wall clock, ms since the epoch (persisted) */
double spn__mono_s(void);   /* monotonic seconds */
/* A duration for people: "42 s" under 2 min, "12 min" under 2 h, else "3 h". */
void spn__say_duration(double seconds, char *out, size_t n);

/* ---- transfers ---- */

/* Copies made for a job (docs/jobs.md, "Transfers"): bytes and host ns by
 * direction, indexed as spn_copy_dir_t (host to device, device to host,
 * device to device, host to host), summed over its attempts. */
typedef struct spn_job_xfer {
  uint64_t bytes[4];
  uint64_t ns[4];
} spn_job_xfer_t;

/* The JSON field names of the directions: "h2d", "d2h", "d2d", "h2h". */
extern const char *const spn__xfer_dir_names[4];
/* Add x to *acc (x may be NULL). */
void spn__xfer_add_to(spn_job_xfer_t *acc, const spn_job_xfer_t *x);
/* {"h2d": {"bytes": N, "ms": T}, ...} added to obj as `name` (DONE and FAIL
 * bodies, STATUS replies). Returns the new object or NULL (out of memory). */
cJSON *spn__xfer_to_json(cJSON *obj, const char *name, const spn_job_xfer_t *x);
/* Read what spn__xfer_to_json wrote (missing members read as 0; a member
 * that is not an object of non-negative numbers is refused). */
int32_t spn__xfer_from_json(const cJSON *o, spn_job_xfer_t *x, spn_error_t *err);

/* ---- durable queue ---- */

typedef struct spn_queue_job {
  int64_t id;
  spn_queue_state_t state;
  int32_t priority;
  uint32_t attempts; /* leases handed out so far; the current lease's token */
  uint32_t max_attempts;
  char *spec_json;   /* validated job spec (pipeline, inputs, outputs, params) */
  char *idem_key;    /* NULL when none */
  char *lease_owner; /* NULL unless running */
  char *reason;      /* why it failed/died/was cancelled, NULL otherwise */
  char *errors_json; /* JSON array of {attempt, at, error} */
  char *warnings_json; /* JSON array of strings: the succeeded attempt's warnings; NULL when none */
  int64_t created_ms, deadline_ms, not_before_ms, lease_until_ms;
  int64_t t_state_ms[SPN_QSTATE_COUNT]; /* last time it entered each state; 0 never */
  double compute_s, gpu_s;
  spn_job_xfer_t xfer; /* every attempt's copies, as reported */
  uint64_t progress_done, progress_total;
  bool cancel_requested;
  /* Segments (docs/jobs.md): a segment's parent job and its index (when
   * parent is set); a parent's count of segments not yet succeeded (it is not
   * leased, for its join, until that is 0). */
  int64_t parent;
  int32_t seg_index;
  uint32_t pending;
} spn_queue_job_t;

void spn__queue_job_clear(spn_queue_job_t *j);

typedef struct spn_queue_submit {
  const char *spec_json;
  int32_t priority;
  const char *idem_key; /* may be NULL */
  int64_t deadline_ms;  /* absolute; 0 = none */
  uint32_t max_attempts;
  int64_t parent;       /* a segment: its parent job; 0 = none */
  int32_t seg_index;    /* a segment: its index */
  uint32_t pending;     /* a parent: its segments, which must all succeed before it is leased */
  /* Not NULL: the job's files are checked against those of every job still
   * queued or running, in the write that stores the job (so two SUBMITs in
   * flight at once, through one gateway or two, cannot both pass). On a
   * clash submit stores nothing, fills *clash and returns SPN_EBUSY. A
   * segment (parent set) is neither checked nor recorded. */
  struct spn_queue_clash *clash;
} spn_queue_submit_t;

/* How a SUBMIT's file clashes with a job still queued or running: */
typedef enum spn_clash_kind {
  SPN_CLASH_OUTPUT = 1, /* an output that is that job's output: the last to finish would win */
  SPN_CLASH_READ,       /* an output that is that job's input: it would be replaced under it */
  SPN_CLASH_INPUT,      /* an input that is that job's output: read before or while it is written */
} spn_clash_kind_t;

typedef struct spn_queue_clash {
  spn_clash_kind_t kind;
  char path[4096]; /* as the spec says it */
  int64_t job;
  spn_queue_state_t state;
  bool stopping; /* cancelled, its run not stopped yet */
} spn_queue_clash_t;

/* Called for every job a sweep moved (lease expired, deadline passed). */
typedef void (*spn_queue_changed_cb)(void *user, int64_t id, spn_queue_state_t state);
typedef void (*spn_queue_list_cb)(void *user, const spn_queue_job_t *job);

/* Job lifecycle events, as the gateway's and the queue's counters name them
 * (docs/operations.md). failed: an attempt failed (the job is retried after a
 * backoff, or failed for good with one attempt allowed); dead: the last of
 * several attempts failed; released: handed back uncounted at shutdown;
 * deleted: an ended job removed from the queue by retention. */
enum {
  SPN_QEV_SUBMITTED,
  SPN_QEV_LEASED,
  SPN_QEV_SUCCEEDED,
  SPN_QEV_FAILED,
  SPN_QEV_DEAD,
  SPN_QEV_CANCELLED,
  SPN_QEV_RELEASED,
  SPN_QEV_DELETED, /* deleted by retention (queue.keep_ended_s) */
  SPN_QEV_COUNT
};

static inline const char *spn__queue_event_name(int ev) {
  static const char *const names[SPN_QEV_COUNT] = {"submitted", "leased",   "succeeded", "failed",
                                                   "dead",      "cancelled", "released", "deleted"};
  return ev >= 0 && ev < SPN_QEV_COUNT ? names[ev] : "?";
}

/* A queue's URL (redis://, unix://) where a gateway's endpoint is asked
 * for: said in the error, with the option that takes it. */
static inline bool spn__is_queue_url(const char *s) {
  return !strncmp(s, "redis://", 8) || !strncmp(s, "unix://", 7);
}

/* Worker presence: how often each process with workers says so
 * (ops.present), and how long after the last time a pipeline counts as
 * having no worker (three missed times). */
#define SPN_PRESENCE_MS 5000
#define SPN_PRESENCE_STALE_MS (3 * SPN_PRESENCE_MS)
/* A roster record not renewed for this long is removed (a worker that
 * stopped without draining is listed as gone until then), checked this
 * often by each gateway. */
#define SPN_ROSTER_KEEP_MS (10 * 60 * 1000)
#define SPN_ROSTER_PRUNE_MS (60 * 1000)
/* Retention: each gateway deletes ended jobs past keep_ended_s this often
 * (or every quarter of keep_ended_s when that is shorter, at least 1 s),
 * at most SPN_PURGE_BATCH a time (one short transaction or script); after a
 * full batch, again a second later, until it has caught up. */
#define SPN_PURGE_EVERY_MS (60 * 1000)
#define SPN_PURGE_AGAIN_MS 1000
#define SPN_PURGE_BATCH 500
/* A worker refused its name (name_taken) stops once the holder was heard
 * this many more times: a live holder is heard at every heartbeat (roster
 * renewal, on another gateway); a killed one at most once more. */
#define SPN_NAME_TAKEN_HEARD 3

/* A queue backend. Every call is made from one thread (the loop thread) and
 * takes `now` (ms since the epoch) so tests control time. Writes made
 * between begin and commit are one durable transaction (group commit); a
 * write outside begin/commit commits by itself. */
/* How a failed attempt ends (the queue's fail). */
typedef enum spn_fail_how {
  SPN_FAIL_RETRY = 0,     /* retried after backoff while attempts are left */
  SPN_FAIL_CANCELLED = 1, /* stopped for a cancel */
  SPN_FAIL_FINAL = 2,     /* a retry cannot help: the job fails now */
} spn_fail_how_t;
/* What ends an attempt that ended with status: cancelled; final for
 * SPN_EMEDIA (the job's media or its settings are invalid: every attempt,
 * on any worker, meets the same); retry for the rest (I/O, devices, a lost
 * worker). */
spn_fail_how_t spn__fail_how(int32_t status);
/* The words a final failure's reason ends with. */
#define SPN_FAIL_FINAL_NOTE " (not retried: another attempt would meet the same media error)"

typedef struct spn_queue_ops {
  const char *name;
  int32_t (*begin)(void *q, spn_error_t *err);
  int32_t (*commit)(void *q, spn_error_t *err);
  /* *existed is true when idem_key matched a job submitted within 24 h; *id
   * is then that job. */
  int32_t (*submit)(void *q, const spn_queue_submit_t *s, int64_t now, int64_t *id, bool *existed,
                    spn_error_t *err);
  /* Lease the next job: highest priority first, FIFO within one, skipping jobs
   * backing off or past their deadline. `pipelines`: NULL for a job of any
   * pipeline; else only jobs of the pipelines it lists (spn__pipeline_filter's
   * form: each name between newlines), the others left queued where they
   * are for a worker that runs them. SPN_EAGAIN when none. Fills *out
   * (caller clears it). */
  int32_t (*lease)(void *q, const char *owner, const char *pipelines, int64_t now, int64_t lease_ms,
                   spn_queue_job_t *out, spn_error_t *err);
  /* Extend a lease. SPN_ESTATE when (id, attempt, owner) no longer holds it;
   * SPN_ECANCELLED (lease still extended) when a cancel was requested and
   * the backend tells (Redis: the cancel may have come through another
   * gateway), so the holder stops the job. */
  int32_t (*renew)(void *q, int64_t id, uint32_t attempt, const char *owner, int64_t now,
                   int64_t lease_ms, spn_error_t *err);
  int32_t (*progress)(void *q, int64_t id, uint64_t done, uint64_t total, spn_error_t *err);
  /* running → succeeded. SPN_ESTATE when the lease is not held. The
   * attempt's compute_s, gpu_s and transfers (xfer; NULL = none) are added
   * to the job's in the same write, and its warnings (a JSON array of
   * strings; NULL or "" = none) recorded. */
  int32_t (*complete)(void *q, int64_t id, uint32_t attempt, const char *owner, double compute_s,
                      double gpu_s, const spn_job_xfer_t *xfer, const char *warnings, int64_t now,
                      spn_error_t *err);
  /* running → queued (retry after backoff) | dead (attempts exhausted) |
   * failed (how SPN_FAIL_FINAL, or one attempt allowed) | cancelled (how
   * SPN_FAIL_CANCELLED). *state gets the new state. Usage as for complete. */
  int32_t (*fail)(void *q, int64_t id, uint32_t attempt, const char *owner, const char *reason,
                  spn_fail_how_t how, double compute_s, double gpu_s, const spn_job_xfer_t *xfer, int64_t now,
                  spn_queue_state_t *state, spn_error_t *err);
  /* queued → cancelled at once; running → cancel requested (*state stays
   * running; the worker stops it); terminal → SPN_ESTATE. */
  int32_t (*cancel)(void *q, int64_t id, int64_t now, spn_queue_state_t *state, spn_error_t *err);
  /* Expired leases count as a failed attempt ("lease expired"); queued jobs
   * past their deadline fail; succeeded jobs whose marker removal was never
   * confirmed (see unpublished) come with SPN_QSTATE_SUCCEEDED. Returns the
   * number of jobs reported or an error. */
  int32_t (*sweep)(void *q, int64_t now, spn_queue_changed_cb cb, void *user, spn_error_t *err);
  /* Give a running job back without counting the attempt (the gateway is
   * shutting down and has stopped the thread that ran it). SPN_ESTATE when
   * the lease is not held. */
  int32_t (*release)(void *q, int64_t id, uint32_t attempt, const char *owner, const char *note,
                     int64_t now, spn_error_t *err);
  /* Fail every running job leased by `owner` (worker lost). */
  int32_t (*release_owner)(void *q, const char *owner, const char *reason, int64_t now,
                           spn_queue_changed_cb cb, void *user, spn_error_t *err);
  /* The publication marker of succeeded job `id` was removed. Until then a
   * backend shared by many processes hands the job to a later sweep (cb
   * with SPN_QSTATE_SUCCEEDED) so that sweeper removes it: the process that
   * completed it may have died first. NULL when the backend does not track
   * markers (SQLite: one process, and the marker goes right after commit). */
  int32_t (*unpublished)(void *q, int64_t id, spn_error_t *err);
  int32_t (*get)(void *q, int64_t id, spn_queue_job_t *out, spn_error_t *err);
  /* Jobs in `state` (-1: any), newest first, at most `limit`. */
  int32_t (*list)(void *q, int32_t state, uint32_t limit, spn_queue_list_cb cb, void *user,
                  spn_error_t *err);
  /* The segments of job `parent`, by index (docs/jobs.md, "Segments").
   * NULL when the backend has no segments: the gateway refuses segmented
   * jobs then. A segment that succeeds lowers its parent's `pending` in the
   * same transaction (so the checkpoint and the count are one write); one
   * that ends failed, dead or cancelled fails its parent (still waiting)
   * and cancels its queued siblings; cancelling a parent cancels its queued
   * segments and asks the running ones to stop. */
  int32_t (*children)(void *q, int64_t parent, spn_queue_list_cb cb, void *user, spn_error_t *err);
  /* Number of jobs in each state (metrics, autoscaling on queue depth). */
  int32_t (*counts)(void *q, int64_t out[SPN_QSTATE_COUNT], spn_error_t *err);
  /* The queue's own lifecycle counters (out[SPN_QEV_*]), whoever made each
   * move: every gateway and worker of a shared queue, since the queue was
   * made (spindle_queue_events_total). NULL when the backend keeps none
   * (SQLite: its one gateway makes every move and counts them itself). */
  int32_t (*events)(void *q, uint64_t out[SPN_QEV_COUNT], spn_error_t *err);
  /* Worker presence (docs/jobs.md, "A job that no worker runs"): every
   * process with workers says, every SPN_PRESENCE_MS, which pipelines they
   * run (spn__pipeline_filter's form; NULL: any pipeline), whether busy or
   * idle. seen: *at gets when a worker of `pipeline` (or of any) was last
   * said to be there, 0 never. The SQLite backend keeps this in memory (its
   * one gateway knows every worker); Redis keeps it for every gateway and
   * worker of the queue. */
  int32_t (*present)(void *q, const char *pipelines, int64_t now, spn_error_t *err);
  int32_t (*seen)(void *q, const char *pipeline, int64_t *at, spn_error_t *err);
  /* Retention (docs/jobs.md, "Retention"): delete up to `limit` top-level
   * jobs that ended (succeeded, failed, dead, cancelled) before `before`
   * (ms), oldest first, each with its segments, history and file records;
   * *removed gets how many. A job with a segment still queued or running,
   * or (Redis) whose publication marker is not known to be gone, is kept
   * for a later call. NULL when the backend keeps every job. */
  int32_t (*purge)(void *q, int64_t before, uint32_t limit, uint32_t *removed, spn_error_t *err);
  /* The roster (docs/jobs.md, "spindle workers"): one record per worker
   * process of a shared queue, so that any gateway can list every worker,
   * whoever it leases through. roster_put sets name[i] to record[i] (JSON,
   * with "at": ms), or removes name[i] when record[i] is NULL; roster_get
   * calls cb for each record (only for the one of `name`, when not NULL). NULL when the backend has no other processes
   * (SQLite: its one gateway knows its workers itself). */
  int32_t (*roster_put)(void *q, size_t n, const char *const *names, const char *const *records,
                        spn_error_t *err);
  int32_t (*roster_get)(void *q, const char *name, void (*cb)(void *user, const char *name, const char *record),
                        void *user, spn_error_t *err);
  void (*free)(void *q);
} spn_queue_ops_t;

typedef struct spn_queue {
  const spn_queue_ops_t *ops;
  void *impl;
} spn_queue_t;

/* True when no worker of `pipeline` has been there for SPN_PRESENCE_STALE_MS
 * (a queued job of it waits for one); *at (may be NULL) gets the last time
 * one was (0: never). False too when the queue cannot tell. */
bool spn__queue_unserved(const spn_queue_t *q, const char *pipeline, int64_t now, int64_t *at);

/* ---- roster (roster.c) ---- */

/* What a worker process records about itself in the roster (ops.roster_put). */
typedef struct spn_roster_entry {
  const char *kind;      /* "local" (a gateway's own slots), "remote", "queue" */
  const char *gateway;   /* the gateway it leases through, "HOST:PID"; NULL: none */
  int64_t slots, running;
  bool draining;
  const char *pipelines; /* spn__pipeline_filter's form; NULL: any */
  const char *instance;  /* the process's random token (worker names are one process each); NULL: none */
  int64_t since;         /* when the process started (ms); 0: not recorded */
} spn_roster_entry_t;

/* e as a JSON object (kind, gateway, slots, running, draining, pipelines,
 * instance, since):
 * a WORKERS row, and a record without its "at". Ownership: caller's. */
cJSON *spn__roster_json(const spn_roster_entry_t *e);
/* A worker process's name, and its "instance": `given` (--name) or
 * HOST:PID:NANOSECONDS, and 16 random hex digits, which tell two processes
 * of one name apart (docs/protocol.md, "Worker messages"). */
void spn__worker_identity(const char *given, char name[128], char instance[17]);
/* The record (JSON, "at": now) of e. Ownership: caller frees (cJSON_free). */
char *spn__roster_record(const spn_roster_entry_t *e, int64_t now);
/* A record's "at" (ms), 0 when it has none. */
int64_t spn__roster_at(const cJSON *record);
/* Where a record (parsed; NULL: unreadable) stands at `now`: due for
 * removal (unreadable, or not renewed for SPN_ROSTER_KEEP_MS), gone (not
 * renewed for SPN_PRESENCE_STALE_MS), draining or live. */
enum { SPN_ROSTER_LIVE, SPN_ROSTER_DRAINING, SPN_ROSTER_GONE, SPN_ROSTER_DUE };
int spn__roster_state(const cJSON *record, int64_t now);
/* The roster record of `name`, when a process of another instance wrote
 * it (a record without an instance is no one's in particular: false).
 * live: renewed within SPN_PRESENCE_STALE_MS (live or draining at now).
 * False too when the queue has no roster or it cannot be read: not a
 * reason to refuse anyone a name. */
typedef struct spn_roster_other {
  char instance[65], gateway[128]; /* gateway "": none (a stateless worker) */
  int64_t at, since;               /* since 0: not recorded */
  bool live;
} spn_roster_other_t;
bool spn__roster_other(const spn_queue_t *q, const char *name, const char *instance, int64_t now,
                       spn_roster_other_t *out);
/* Remove the records not renewed for SPN_ROSTER_KEEP_MS (*removed: how
 * many); nothing when the queue has no roster. */
int32_t spn__roster_prune(const spn_queue_t *q, int64_t now, size_t *removed, spn_error_t *err);
/* The names in a pipeline filter as a JSON array; null for NULL (any). */
cJSON *spn__pipeline_names_json(const char *filter);

typedef struct spn_queue_config {
  const char *backend;       /* "sqlite" (default) or "redis" */
  const char *path;          /* SQLite file; ":memory:" for tests */
  const char *url;           /* redis://HOST[:PORT][/DB] or unix:///PATH[?db=N] */
  const char *auth_file;     /* Redis: "PASSWORD" or "USER PASSWORD" on its first line */
  const char *prefix;        /* Redis key prefix (default "spindle:") */
  uint32_t lease_ms;         /* Redis: a lease idle this long expires (XAUTOCLAIM) */
  uint32_t backoff_base_ms;  /* first retry delay (before jitter) */
  uint32_t backoff_max_ms;   /* cap */
  uint64_t seed;             /* jitter PRNG seed; 0 = from time and pid */
  bool sync_full;            /* fsync every commit (default: WAL NORMAL) */
  /* Redis: a first connection that fails for a reason that passes by
   * waiting (refused, no answer, still loading) does not fail the open;
   * calls fail with that reason until Redis answers (retried at 1, 2, 4 s).
   * A refusal by Redis (password, database) still fails it. */
  bool connect_later;
} spn_queue_config_t;

/* Open (creating if needed) a SQLite queue. Ownership: caller owns *out
 * (spn_queue_free). Thread: the one that will use it. */
int32_t spn_queue_sqlite_open(const spn_queue_config_t *cfg, spn_queue_t *out, spn_error_t *err);
/* Connect to a Redis queue (queue-redis.c); many processes may share it.
 * Ownership: caller owns *out. Thread: the one that will use it. */
int32_t spn_queue_redis_open(const spn_queue_config_t *cfg, spn_queue_t *out, spn_error_t *err);
/* Open the backend cfg->backend names. */
int32_t spn_queue_open(const spn_queue_config_t *cfg, spn_queue_t *out, spn_error_t *err);
void spn_queue_free(spn_queue_t *q);
/* Backoff before retry number `attempt` (1 = after the first failure):
 * base*2^(attempt-1) capped at max, then "equal jitter": half fixed, half
 * uniform random. Exposed for tests. */
int64_t spn__backoff_ms(uint32_t base_ms, uint32_t max_ms, uint32_t attempt, uint64_t *rng);

/* ---- job specs ---- */

/* Parse and validate a stored/leased spec (JSON object with pipeline,
 * inputs, outputs, params). Ownership: caller owns *out (spn__job_spec_free). */
int32_t spn__job_spec_from_json(const cJSON *obj, int64_t id, uint32_t attempt, spn_job_spec_t *out,
                                spn_error_t *err);
void spn__job_spec_free(spn_job_spec_t *spec);
/* Segment k's output file: hidden, beside the job's output `final`, named
 * after it, the parent job and k ("out.mp4" of job 7: ".out.spn-7-seg3.mp4";
 * the extension kept so the encoder picks the same container).
 * Ownership: caller frees. */
char *spn__segment_file(const char *final, int64_t parent, uint32_t k);
/* Job `id` (a segment, or a segmented job) has moved: hand fn every segment
 * file that can no longer be used — all of a segmented job's once it has
 * ended, joined or not (a failed or cancelled one never will be). fn takes
 * the path (malloc'd): the gateway unlinks after its batch commits, a
 * stateless worker at once (Redis commits each script). Returns the id of
 * the segmented job when `id` is one of its segments, else 0. */
int64_t spn__segments_spent(spn_queue_t *q, int64_t id, void (*fn)(void *user, char *path), void *user);
/* Whether job j is a segment or a segmented job (its join). */
bool spn__job_is_segmented(const spn_queue_job_t *j);
/* Whether a job's warnings (the JSON array its record keeps) say anything. */
bool spn__warnings_any(const char *warnings_json);
/* Whether one of segmented job id's segments has warnings: a join has none
 * of its own (its output is its segments', and its status lists their
 * warnings), so it counts as warned when one of them was. A queue error
 * reads as none. */
bool spn__segments_warned(const spn_queue_t *q, int64_t id);
#define SPN_SEGMENTS_MAX 10000

/* ---- path confinement ---- */

typedef struct spn_roots {
  size_t n;
  char **dirs; /* canonical (realpath) directories */
} spn_roots_t;

int32_t spn__roots_add(spn_roots_t *r, const char *dir, spn_error_t *err);
void spn__roots_free(spn_roots_t *r);
/* Canonicalise an input path: it must exist, be a regular file, and resolve
 * (symlinks followed) inside one of the roots. Ownership: caller owns *out. */
int32_t spn__confine_input(const spn_roots_t *r, const char *path, char **out, spn_error_t *err);
/* Canonicalise an output path: its directory must resolve inside a root,
 * the name may not be "." / ".." or an existing symlink or directory. */
int32_t spn__confine_output(const spn_roots_t *r, const char *path, char **out, spn_error_t *err);

/* ---- executing a job (both worker kinds) ---- */

typedef void (*spn_exec_progress_cb)(void *user, uint64_t done, uint64_t total);

struct spn_job_ctx {
  const spn_job_spec_t *job;
  char **tmp_paths;
  const volatile int *cancel_flag; /* set by the owner thread */
  double deadline;                 /* the job's timeout (monotonic s; 0: none) */
  spn_exec_progress_cb progress;
  void *progress_user;
  double gpu_s;
  spn_job_xfer_t xfer;
  double last_progress_s;
  uint64_t done, total; /* the last progress the runner reported, sent or coalesced */
  cJSON *warnings; /* spn_job_ctx_warn: an array, NULL until the first */
  /* The runner gave up waiting for a cancelled run that did not stop (a
   * stage stuck inside a call) and left it behind: why, for the job's error.
   * The process should take no more jobs (spn_exec_result_t.wedged). */
  bool wedged;
  char wedged_why[512];
};

enum { SPN_JOB_WARNINGS_MAX = 2048, SPN_JOB_TIMEOUT_MAX_S = 7 * 86400 };

/* Render a JSON array of strings into out (size SPN_JOB_WARNINGS_MAX): the
 * lines that fit, then "... N more warnings: see the worker's log" when
 * some did not; "" for NULL or an empty array. */
void spn__warnings_render(const cJSON *arr, char *out, size_t size);

typedef struct spn_exec_result {
  int32_t status;   /* SPN_OK, SPN_ECANCELLED or an error */
  char error[SPN_ERROR_MSG_MAX];
  double compute_s; /* wall seconds in run() */
  double gpu_s;
  spn_job_xfer_t xfer; /* copies the runner reported (spn_job_ctx_add_transfers) */
  /* What the runner reported with spn_job_ctx_warn: a JSON array of
   * strings, "" when none; lines that do not fit are left out and counted
   * in a last "... N more" line. */
  char warnings[SPN_JOB_WARNINGS_MAX];
  bool published_before; /* an earlier attempt had published; not run again */
  /* The run was abandoned, still inside a stage's call (spn_job_ctx_t.wedged):
   * the process's pipelines are stuck; its owner takes no more jobs. */
  bool wedged;
} spn_exec_result_t;

/* A finished attempt's figures as fields of object b: compute_s, gpu_s,
 * transfers and, for a succeeded one with any, warnings. The body of a
 * remote worker's DONE / FAIL (worker.c) and the report in a publication
 * marker (exec.c) are both this. */
void spn__exec_report_to_json(cJSON *b, const spn_exec_result_t *res);
/* Read them back into res. A field that is malformed counts as none: seconds
 * that are not a finite number >= 0 without a word; transfers and warnings
 * flagged in the result (SPN_REPORT_BAD_*), with transfers' reason in err. */
enum { SPN_REPORT_BAD_TRANSFERS = 1, SPN_REPORT_BAD_WARNINGS = 2 };
uint32_t spn__exec_report_from_json(const cJSON *b, spn_exec_result_t *res, spn_error_t *err);

/* Run one job: derive temporary output names, call the runner, rename the
 * temporaries to the final paths on success, remove them otherwise.
 * Thread: a worker thread. */
/* The publication marker of a job (exec.c: exactly-once publication), or
 * NULL for a job without outputs. Remove it once the queue has recorded the
 * job succeeded. Ownership: caller frees. */
char *spn__publish_marker(const spn_job_spec_t *job);
/* The marker path of a job stored in the queue (its spec), or NULL.
 * Ownership: caller frees. */
char *spn__publish_marker_of(spn_queue_t *q, int64_t id);
/* Remove the marker of succeeded job `id` and tell the queue. */
void spn__unpublish(spn_queue_t *q, int64_t id);
void spn__job_execute(const spn_job_runner_t *runner, const spn_job_spec_t *job,
                      const volatile int *cancel_flag, spn_exec_progress_cb progress, void *user,
                      spn_exec_result_t *res);

/* ---- the slot pool (slots.c): job-running threads ---- */

/* A pool of threads, each running one job at a time through
 * spn__job_execute; shared by the gateway's in-process workers and by
 * `spindle worker`. Every call but the wake callback is made from one owner
 * thread (the loop thread). */
typedef struct spn_slot_pool spn_slot_pool_t;

enum { SPN_SLOT_PROGRESS = 0, SPN_SLOT_FINISHED = 1 };

typedef struct spn_slot_report {
  struct spn_slot_report *next;
  int kind; /* SPN_SLOT_PROGRESS or SPN_SLOT_FINISHED */
  uint32_t slot;
  int64_t id;
  uint32_t attempt;
  uint64_t done, total;
  spn_exec_result_t res;
} spn_slot_report_t;

/* Called by a slot thread after it queued a report. Thread: a slot thread. */
typedef void (*spn_slot_wake_cb)(void *user);

/* Start n threads. wake may be NULL (the owner polls spn__slot_pool_take).
 * Ownership: caller owns *out; runner borrowed. */
int32_t spn__slot_pool_new(uint32_t n, const spn_job_runner_t *runner, spn_slot_wake_cb wake,
                           void *user, spn_slot_pool_t **out, spn_error_t *err);
/* Cancel every running job and join the threads (idempotent). */
void spn__slot_pool_stop(spn_slot_pool_t *p);
void spn__slot_pool_free(spn_slot_pool_t **p);
uint32_t spn__slot_pool_size(const spn_slot_pool_t *p);
/* Index of a slot not busy, or -1. */
int32_t spn__slot_pool_idle(const spn_slot_pool_t *p);
uint32_t spn__slot_pool_idle_count(const spn_slot_pool_t *p);
/* Hand a job to an idle slot; the slot is busy until spn__slot_pool_set_idle.
 * Ownership: consumes *spec (zeroed). */
void spn__slot_pool_assign(spn_slot_pool_t *p, uint32_t idx, spn_job_spec_t *spec);
void spn__slot_pool_cancel(spn_slot_pool_t *p, uint32_t idx);
/* Cancel the slot running (id, attempt); attempt 0: any attempt. */
void spn__slot_pool_cancel_job(spn_slot_pool_t *p, int64_t id, uint32_t attempt);
/* The owner read the slot's "finished" report: it may be assigned again. */
void spn__slot_pool_set_idle(spn_slot_pool_t *p, uint32_t idx);
/* The job a slot's thread holds now, if any. Thread: owner. */
bool spn__slot_pool_running(spn_slot_pool_t *p, uint32_t idx, int64_t *id, uint32_t *attempt);
/* Take every queued report, oldest first. Ownership: caller owns the list
 * (spn__slot_reports_free). */
spn_slot_report_t *spn__slot_pool_take(spn_slot_pool_t *p);
void spn__slot_reports_free(spn_slot_report_t *r);

/* ---- the pipeline runner (runner-pipeline.c) ---- */

/* A pipeline the server or a worker loads at start-up ([[pipeline]] of the
 * server config). */
typedef struct spn_pipeline_def {
  char *name;   /* the name jobs use; NULL: the config's [pipeline] name */
  char *config; /* pipeline TOML, resolved against the server config's folder */
  char where[256]; /* "file:line:col" of the [[pipeline]] table, for messages */
} spn_pipeline_def_t;

/* struct spn_runtime is declared in spindle/runtime.h. */
typedef struct spn_runtime spn_runtime_t;
typedef struct spn_pipeline spn_pipeline_t;

/* Load every def into `rt` (borrowed; must outlive the runner): stage
 * instances created and models preloaded before this returns. Jobs for
 * other pipelines go to `fallback` (copied; may be NULL). A pipeline that
 * fails to load fails the whole call with its file:line:col message.
 * Ownership: caller owns *out (spn_pipeline_runner_free, before the
 * runtime). Thread: any; run is called on worker threads. */
int32_t spn_pipeline_runner_new(spn_runtime_t *rt, const spn_pipeline_def_t *defs, size_t n,
                                const spn_job_runner_t *fallback, spn_job_runner_t *out, spn_error_t *err);
void spn_pipeline_runner_free(spn_job_runner_t *runner);
/* The per-job overrides ("stage.key=value") a job's inputs, outputs and
 * params make on pipe, as the runner makes them: each input and output sets
 * every key its binding names (an input's default takes another input's
 * file), each param its binding's keys, or the one it names as stage.key
 * (a number or a boolean). Outputs are set to their paths as given (the
 * runner's temporary paths are its own). An input or output the job does
 * not give keeps the pipeline's value (an optional input whose default is
 * given takes that file). Errors (SPN_EINVAL) name the
 * input, output or param; `spindle run --input` uses it. Ownership: *ov is
 * the caller's (each string and the array: free). Thread: any. */
int32_t spn__pipeline_job_overrides(const spn_pipeline_t *pipe, const spn_job_spec_t *job, char ***ov, size_t *n,
                                    spn_error_t *err);
/* A run asked to stop (cancel, timeout, drain) that has not ended after
 * `seconds` (0: wait for ever) is abandoned: the runner returns, naming the
 * stage still inside a call, and marks itself wedged. Thread: before jobs run. */
void spn__pipeline_runner_set_cancel_grace(spn_job_runner_t *runner, double seconds);
/* A run was abandoned: a stage's thread is stuck in a call, so the runtime
 * cannot be freed (spn_pipeline_runner_free and the runtime's free would
 * wait for it for ever); the process should exit without. Thread: any. */
bool spn__pipeline_runner_wedged(const spn_job_runner_t *runner);

/* Which pipelines a worker runs, for the queue's lease (spn_queue_ops_t):
 * "\nname\nname\n", each name between newlines. spn__pipeline_filter_add
 * appends one (false: out of memory, or a name that cannot be listed: empty
 * or with a newline). spn__runner_pipelines: the filter of what `runner`
 * runs (its pipelines and its fallback's), or NULL when that is not known
 * (a runner not made here) or cannot be listed: lease jobs of any pipeline.
 * spn__runner_pipelines_add appends those names to *filter (false: not
 * known or cannot be listed); spn__pipeline_runner_names is the part of it
 * for a pipeline runner (false when runner is not one). Ownership: the
 * caller frees the filter. */
bool spn__pipeline_filter_add(char **filter, const char *name);
/* The filter's names in order: start with *name NULL; each call sets *name
 * (not terminated: *len bytes) to the next one; false after the last. */
bool spn__pipeline_filter_next(const char *filter, const char **name, size_t *len);
/* "copy, fail, noop, transcode" ("any" for NULL) into out, for log lines. */
void spn__pipeline_filter_describe(const char *filter, char *out, size_t n);
char *spn__runner_pipelines(const spn_job_runner_t *runner);
bool spn__runner_pipelines_add(const spn_job_runner_t *runner, char **filter);
bool spn__pipeline_runner_names(const spn_job_runner_t *runner, char **filter);

/* ---- server ---- */

typedef struct spn_server_config {
  char *bind;            /* "tcp://127.0.0.1:7700" */
  char *db_path;         /* queue file */
  char *queue_backend;   /* "sqlite" (default) or "redis" */
  char *queue_url;       /* Redis URL */
  char *queue_auth_file; /* Redis AUTH from this file */
  char *queue_prefix;    /* Redis key prefix */
  uint32_t drain_grace_s; /* SIGTERM: running jobs get this long to finish */
  /* Redis: a queue that does not answer at start-up is waited for this long
   * (not ready meanwhile), then the gateway stops; 0: it stops at once. */
  uint32_t queue_wait_s;
  uint32_t workers;      /* in-process worker threads */
  uint32_t lease_ms;     /* lease length; renewed by heartbeats */
  uint32_t heartbeat_ms; /* remote worker heartbeat; dead after 3 missed */
  uint32_t max_attempts; /* default per job */
  uint32_t job_timeout_s; /* default time one attempt of a job may run (0: no limit) */
  uint32_t keep_ended_s;  /* an ended job is deleted this long after it ended (0: kept for ever) */
  /* a cancelled or timed-out attempt still running after this long is
   * abandoned and the in-process workers stop (0: wait for ever) */
  uint32_t cancel_grace_s;
  uint32_t backoff_base_ms, backoff_max_ms;
  uint32_t max_msg_size; /* ZMQ_MAXMSGSIZE on every socket */
  uint32_t max_priority; /* |priority| limit */
  bool sync_full;
  spn_roots_t input_roots, output_roots;
  char **pipelines;      /* pipelines that must be available before ready */
  size_t n_pipelines;
  spn_pipeline_def_t *pipeline_defs; /* [[pipeline]]: loaded at start-up */
  size_t n_pipeline_defs;
  char *devices;         /* runtime devices ("auto", "cpu", "cpu:4", "cuda:0") */
  /* CURVE: when curve_secret is set the gateway is a CURVE server and only
   * clients whose public key is a file in curve_clients_dir get in. */
  char *curve_secret;    /* Z85, 40 chars */
  char *curve_key_file;  /* file with a "secret=" line (spindle keygen); read into curve_secret */
  char *curve_clients_dir;
  char *curve_workers_dir; /* when set, only these keys may act as workers */
  /* test runner settings (until the pipeline runtime is plugged in) */
  uint32_t chunk_bytes, chunk_delay_ms;
  char *exec_log;
  /* "host:port" of the HTTP endpoint (/healthz, /readyz, /metrics); NULL: none */
  char *http;
  /* print the bound endpoint to this fd when listening (-1: no) */
  int ready_fd;
} spn_server_config_t;

void spn_server_config_defaults(spn_server_config_t *c);
void spn_server_config_clear(spn_server_config_t *c);
/* Load a TOML server config on top of the defaults. Errors name file:line. */
int32_t spn_server_config_load(spn_server_config_t *c, const char *path, spn_error_t *err);
/* A command-line flag's value for the numeric key section.key: inside the
 * range the config file allows ("--lease-ms 5: outside [100, 3600000], the
 * range of queue.lease_ms"). Keys without a range (or unknown) pass. */
int32_t spn_server_config_check_flag(const char *section, const char *key, const char *flag, uint32_t value,
                                     spn_error_t *err);
/* The same for a field of c set by a flag (found by its place in c). */
int32_t spn_server_config_check_field(const spn_server_config_t *c, const uint32_t *field, const char *flag,
                                      spn_error_t *err);

typedef struct spn_server spn_server_t;

/* Ownership: caller owns *out; runner is borrowed and must outlive it.
 * Thread: the one that calls spn_server_run. */
int32_t spn_server_new(const spn_server_config_t *cfg, const spn_job_runner_t *runner,
                       spn_server_t **out, spn_error_t *err);
/* Run the loop until SIGINT/SIGTERM or spn_server_stop. */
int32_t spn_server_run(spn_server_t *s, spn_error_t *err);
/* Thread: any. */
void spn_server_stop(spn_server_t *s);
void spn_server_free(spn_server_t **s);

/* ---- remote worker ---- */

typedef struct spn_worker_config {
  const char *connect;     /* gateway endpoint */
  const char *name;        /* NULL: host:pid:random */
  uint32_t slots;          /* jobs at once */
  uint32_t heartbeat_ms;
  uint32_t max_msg_size;
  const char *curve_server; /* gateway public key (Z85) or NULL */
  const char *curve_public, *curve_secret;
  const volatile int *stop; /* set (e.g. by SIGTERM) to drain and stop */
  const volatile int *stop_now; /* set (SIGINT, a second SIGTERM) to stop at once; may be NULL */
  uint32_t drain_grace_s;   /* draining: running jobs get this long to finish */
  /* Lease straight from this queue (spn_queue_worker_run); NULL: a gateway. */
  const spn_queue_config_t *queue;
  uint32_t queue_wait_s; /* the queue not answering at start-up: wait this long (0: fail at once) */
  uint32_t lease_ms;
  const char *http; /* "HOST:PORT": serve /healthz, /readyz, /metrics; NULL: none */
} spn_worker_config_t;

/* Run until *cfg->stop is set. Thread: the caller's. */
int32_t spn_worker_run(const spn_worker_config_t *cfg, const spn_job_runner_t *runner,
                       spn_error_t *err);
/* A stateless worker on a shared queue (queue-worker.c): leases from
 * cfg->queue itself. Runs until *cfg->stop (drain) or *cfg->stop_now.
 * Thread: the caller's. */
int32_t spn_queue_worker_run(const spn_worker_config_t *cfg, const spn_job_runner_t *runner,
                             spn_error_t *err);

#endif
