/* server-internal.h — the gateway's parts and the state they share.
 *
 *   server.c   life cycle and the loop callbacks (poll, timer, async, signals)
 *   gateway.c  client requests (SUBMIT, STATUS, WATCH, CANCEL, LIST, HELLO),
 *              the outbox and group commit, watchers
 *   sched.c    scheduling: leasing jobs to local slots and remote workers,
 *              finishing runs, renewing local leases
 *   remote.c   the remote-worker protocol (LEASE, HEARTBEAT, PROGRESS,
 *              DONE, FAIL) and losing a worker
 *   zap.c      CURVE allow-list (ZAP handler thread)
 *   http.c     /healthz, /readyz, /metrics
 *   slots.c    the job-running threads (shared with worker.c)
 *
 * Every function here runs on the loop thread unless it says otherwise.
 * Never installed. */
#ifndef SPINDLE_SERVER_INTERNAL_H
#define SPINDLE_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "jobs-internal.h"
#include "observe.h"
#include "proto-internal.h"

#define SPN_GW_BATCH_MAX 512
#define SPN_GW_TICK_MS 100

typedef struct spn_rworker {
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
  char owner[160]; /* "remote:<name>" */
  char instance[65]; /* the process's "instance" token ("" from a worker that sends none) */
  int64_t credit;
  double last_seen;
  bool alive;
  bool leased; /* sent LEASE to this gateway instance: its credit is known */
  bool draining; /* sent DRAIN: stops once its jobs end (then leaves the roster) */
  /* Reaped without draining (killed, host or network lost): when (wall ms;
   * 0 not gone) and its slots then. Kept SPN_ROSTER_KEEP_MS for WORKERS on
   * a queue without a roster (on Redis its roster record says so). */
  int64_t gone_at, gone_slots;
  char *pipelines; /* what its LEASE said it runs (spn__runner_pipelines' form); NULL: any */
} spn_rworker_t;

typedef struct spn_run {
  int64_t id;
  uint32_t attempt;
  int slot;        /* >= 0 local */
  int64_t worker;  /* index into workers when remote, -1 local */
  char owner[160];
  uint64_t done, total;
  double progress_at; /* last progress written to the queue (monotonic s) */
  bool no_outputs;    /* no publication marker to remove at the end */
  bool segmented;     /* a segment, or a segmented job's join: its end concerns another job */
} spn_run_t;

typedef struct spn_watcher {
  int64_t id;
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
  /* what the watcher was last told (polling a shared queue) */
  int32_t state;
  uint32_t attempts;
  uint64_t done;
  bool waiting;       /* its last event had "waiting" */
  char pipeline[129]; /* the job's ("": not known) */
} spn_watcher_t;

typedef struct spn_outmsg {
  struct spn_outmsg *next;
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
  char type[SPN_PROTO_TYPE_MAX + 1];
  cJSON *body;
  bool needs_commit; /* an acknowledgement of a durable write */
  int64_t req;
} spn_outmsg_t;

/* ZAP handler (zap.c). */
typedef struct spn_zap {
  void *zctx;
  const char *clients_dir, *workers_dir;
  spn__logger_t *log;
  pthread_t th;
  bool started;
  volatile int quit;
} spn_zap_t;

struct spn_server {
  const spn_server_config_t *cfg;
  const spn_job_runner_t *runner;
  char *pipelines; /* what runner runs, for its own slots' leases (NULL: any) */
  spn_queue_t q;
  spn__observe_t *obs; /* owned by q's wrapper (observe.c) */
  uv_loop_t loop;
  size_t nplanning; /* segmented SUBMITs being planned on the thread pool */
  uv_poll_t poll;
  uv_timer_t timer;
  uv_async_t async;
  uv_signal_t sigint, sigterm;
  void *zctx, *router;
  spn_zap_t zap;
  volatile int stopping;

  spn_slot_pool_t *pool;
  uint32_t nslots;
  char (*slot_owner)[64]; /* "local:<pid>:<slot>" */

  spn_rworker_t *workers;
  size_t nworkers;
  size_t rr;
  spn_run_t *runs;
  size_t nruns, caprun;
  spn_watcher_t *watchers;
  size_t nwatchers, capwatch;

  spn__http_t *http; /* NULL without --http */
  bool in_batch, pumping;
  spn_outmsg_t *out, **out_tail;
  char **unpublish;        /* publication markers to remove after the commit */
  size_t nunpublish, capunpublish;
  volatile int draining;   /* SIGTERM: no new leases; exit when idle or at drain_until */
  double drain_until;
  double last_renew, last_sweep, last_presence, last_roster_prune;
  double next_purge; /* monotonic s of the next retention pass */
  char name[128];          /* "HOST:PID": its record in a shared queue's roster */
  int lock_fd;             /* SQLite: the flock that makes it the file's one gateway; -1 none */
  bool waiting_check;      /* presence recorded: tell watchers of queued jobs after dispatch */
  /* The last connection refused a worker name that another process holds
   * (name_taken): logged once per connection, not at every heartbeat. */
  unsigned char refused_ident[SPN_PROTO_IDENT_MAX];
  size_t refused_ident_len;
  /* Queue errors lately logged (spn__queue_log): a queue that does not
   * answer fails every call of every tick with the same words. */
  struct {
    uint64_t hash;
    double at;
  } qlog[8];
  double queue_failing; /* since when its calls fail (monotonic s; 0: they do not) */
  /* Start-up: ready (the stdout line, /readyz) once the queue has answered a
   * sweep; a Redis queue not there yet is waited for cfg->queue_wait_s from
   * started, then the gateway stops with fatal. */
  bool queue_answered;
  /* An in-process run was abandoned inside a stage's call: why ("" when
   * not). The slots take no more jobs; /healthz answers 503. */
  char wedged[SPN_ERROR_MSG_MAX];
  double started;
  int32_t fatal_rc;
  spn_error_t fatal;
  int64_t wake_at;
  bool handles_open;
};

/* A remote worker reaped without draining, SPN_ROSTER_KEEP_MS ago at most:
 * WORKERS lists it as gone, and its entry is not given to another worker. */
static inline bool spn__rworker_gone(const spn_rworker_t *w, int64_t now) {
  return !w->alive && w->gone_at && now - w->gone_at <= SPN_ROSTER_KEEP_MS;
}

/* ---- gateway.c ---- */
void spn__out_push(spn_server_t *s, const unsigned char *ident, size_t ilen, const char *type,
                   cJSON *body, bool needs_commit);
/* Log a queue error, unless the same line was logged in the last
 * SPN_QUEUE_LOG_S seconds. The next sweep that succeeds says that the
 * queue answers again. */
#define SPN_QUEUE_LOG_S 30.0
void spn__queue_log(spn_server_t *s, int32_t level, const char *fmt, ...) SPN_PRINTF(3, 4);
/* The same, also while the gateway waits for its queue at start-up (when
 * spn__queue_log says nothing). */
void spn__queue_log_now(spn_server_t *s, int32_t level, const char *fmt, ...) SPN_PRINTF(3, 4);
void spn__out_error(spn_server_t *s, const unsigned char *ident, size_t ilen, int64_t req,
                    const char *code, const char *msg);
/* Drop the outbox without sending (shutdown). */
void spn__out_discard(spn_server_t *s);
void spn__batch_begin(spn_server_t *s);
/* Commit the batch, then send the outbox (acknowledgements only if the
 * commit succeeded). */
void spn__batch_end(spn_server_t *s);
/* Tell every watcher of `id` where it is; terminal states end the watch. */
void spn__notify(spn_server_t *s, int64_t id);
void spn__notify_progress(spn_server_t *s, spn_run_t *r);
/* A shared queue (Redis) changes under other gateways and workers: send
 * watchers the changes of their jobs since they were last told. */
void spn__gateway_poll_watchers(spn_server_t *s);
/* Tell the watchers of a queued job when its "waiting" starts or ends (a
 * pipeline's last worker left, or one came back): after the dispatch that
 * follows each presence record (spn__sched_presence: every SPN_PRESENCE_MS
 * and when a remote worker's LEASE changes what runs). */
void spn__gateway_watch_waiting(spn_server_t *s, int64_t now);
/* Route one received message. */
void spn__gateway_handle(spn_server_t *s, spn_pmsg_t *m);

/* ---- sched.c ---- */
spn_run_t *spn__run_find(spn_server_t *s, int64_t id);
void spn__run_remove(spn_server_t *s, int64_t id);
spn_run_t *spn__run_add(spn_server_t *s);
/* spn_queue_changed_cb for sweeps and lost workers (user = server). */
void spn__sched_changed(void *user, int64_t id, spn_queue_state_t st);
void spn__sched_finish(spn_server_t *s, int64_t id, uint32_t attempt, const char *owner,
                       const spn_exec_result_t *res);
/* Lease queued jobs to free local slots, then to remote workers with credit. */
void spn__sched_dispatch(spn_server_t *s);
/* Stop a running job wherever it runs. */
void spn__sched_cancel_run(spn_server_t *s, spn_run_t *r);
void spn__sched_renew_local(spn_server_t *s, int64_t now);
/* Record in the queue which pipelines this gateway's workers (its own slots
 * and its live remote workers) run (ops.present), and tell the queue's
 * failure to the log: every SPN_PRESENCE_MS, and at once when a remote
 * worker comes or changes what it runs. */
void spn__sched_presence(spn_server_t *s, int64_t now);
/* Its own slots' roster record, then each remote worker's (shared queues). */
void spn__sched_roster(spn_server_t *s, int64_t now);
/* What this gateway's own slots, and remote worker i, are now: their roster
 * record and their WORKERS row (a remote worker that has not sent LEASE yet
 * runs no pipeline it has named). */
spn_roster_entry_t spn__sched_local_entry(const spn_server_t *s);
spn_roster_entry_t spn__sched_remote_entry(const spn_server_t *s, size_t i);
/* Remove roster records: this gateway's own (it stops), or remote worker
 * `owner`'s (it drained and left). */
void spn__sched_roster_remove(spn_server_t *s, const char *owner);
/* The batch committed (ok) or not: remove the publication markers of the
 * jobs it recorded succeeded, or keep them for the re-run. */
void spn__sched_committed(spn_server_t *s, bool ok);
/* A run made progress: tell its watchers, and write it to the queue at most
 * once a second (so STATUS on another gateway sharing the queue sees it). */
void spn__sched_progress(spn_server_t *s, spn_run_t *r, uint64_t done, uint64_t total);
/* Job `id` changed state: if it is a segment, tell its parent's watchers
 * and drop its file when the parent can no longer be joined; if it is a
 * segmented job that ended, remove its segment files after the commit. */
void spn__segments_settle(spn_server_t *s, int64_t id);
/* Apply the slot pool's reports (progress, finished jobs). */
void spn__sched_reports(spn_server_t *s, spn_slot_report_t *r);

/* ---- remote.c ---- */
void spn__remote_msg(spn_server_t *s, spn_pmsg_t *m);
/* Workers that missed three heartbeats are lost: their jobs retry. */
void spn__remote_reap(spn_server_t *s, double mono, int64_t now);

/* ---- zap.c ---- */
/* Start the ZAP handler on z->zctx. Thread: any; the handler runs on its own. */
int32_t spn__zap_start(spn_zap_t *z, spn_error_t *err);
void spn__zap_stop(spn_zap_t *z);

/* ---- http.c ---- */
int32_t spn__http_start(spn_server_t *s, spn_error_t *err);
/* Close the listener and every open connection (so uv_run can return). */
void spn__http_stop(spn_server_t *s);

#endif
