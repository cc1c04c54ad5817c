/* queue-sqlite.c — the durable job queue on embedded SQLite (WAL).
 *
 * One row per job in `jobs`, one row per state transition in `transitions`
 * (so every transition is timestamped and the history survives). Invariants:
 * - a job is leased only from `queued`, by the highest priority first and the
 *   lowest id (FIFO) within one priority, and only once its backoff
 *   (`not_before`) has passed and its deadline has not;
 * - `attempts` is incremented by every lease and is the lease token: a
 *   renew/complete/fail must present (id, attempt, owner) of the live lease,
 *   so a report from a worker that lost its lease changes nothing;
 * - a failure retries after exponential backoff with jitter until
 *   max_attempts, then the job is dead with every attempt's error kept in
 *   `errors` (a JSON array);
 * - an idempotency key maps to one job for 24 h (unique index; an older row
 *   gives up its key to the new job).
 * All calls come from one thread; begin/commit group several writes into one
 * transaction so one fsync covers many submissions.
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jobs-internal.h"

#define IDEM_WINDOW_MS (24LL * 3600 * 1000)

enum {
  ST_BEGIN,
  ST_COMMIT,
  ST_IDEM_FIND,
  ST_IDEM_CLEAR,
  ST_INSERT,
  ST_TRANS,
  ST_PICK,
  ST_LEASE,
  ST_RENEW,
  ST_PROGRESS,
  ST_COMPLETE,
  ST_GETLEASE,
  ST_REQUEUE,
  ST_DEAD,
  ST_CANCELLED,
  ST_CANCEL_Q,
  ST_CANCEL_R,
  ST_GET,
  ST_EXPIRED,
  ST_DEADLINE,
  ST_BY_OWNER,
  ST_COUNTS,
  ST_RELEASE,
  ST_STATE_TIMES,
  ST_PARENT_DONE,
  ST_PARENT_FAIL,
  ST_SIBLINGS_CANCEL,
  ST_CHILDREN_CANCEL_R,
  ST_CHILDREN,
  ST_XFER,
  ST_OUTPUTS_PUT,
  ST_INPUTS_PUT,
  ST_CLASH,
  ST_PURGE_PICK,
  ST_PURGE_TRANS,
  ST_PURGE_FILES_OUT,
  ST_PURGE_FILES_IN,
  ST_PURGE_JOBS,
  ST_COUNT
};

/* ?1, a job's spec, or an empty object when it is not JSON. */
#define SPEC_OR_EMPTY "CASE WHEN json_valid(?1) THEN ?1 ELSE '{}' END"

static const char *const sql_text[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_IDEM_FIND] = "SELECT id, created FROM jobs WHERE idem_key = ?1",
    [ST_IDEM_CLEAR] = "UPDATE jobs SET idem_key = NULL WHERE idem_key = ?1",
    [ST_INSERT] = "INSERT INTO jobs(spec, priority, state, max_attempts, idem_key, created, "
                  "deadline, not_before, parent, seg_index, pending) VALUES(?1, ?2, 0, ?3, ?4, ?5, ?6, 0, ?7, ?8, ?9)",
    [ST_TRANS] = "INSERT INTO transitions(job, at, state, note) VALUES(?1, ?2, ?3, ?4)",
    [ST_PICK] = "SELECT id FROM jobs WHERE state = 0 AND pending = 0 AND not_before <= ?1 AND "
                "(deadline = 0 OR deadline >= ?1) AND (?2 IS NULL OR "
                "instr(?2, char(10) || CASE WHEN json_valid(spec) THEN json_extract(spec, '$.pipeline') "
                "ELSE '' END || char(10)) > 0) "
                "ORDER BY priority DESC, id ASC LIMIT 1",
    [ST_LEASE] = "UPDATE jobs SET state = 1, attempts = attempts + 1, lease_owner = ?2, "
                 "lease_until = ?3, progress_done = 0, progress_total = 0 WHERE id = ?1",
    [ST_RENEW] = "UPDATE jobs SET lease_until = ?4 WHERE id = ?1 AND state = 1 AND "
                 "attempts = ?2 AND lease_owner = ?3",
    [ST_PROGRESS] = "UPDATE jobs SET progress_done = ?2, progress_total = ?3 WHERE id = ?1",
    [ST_COMPLETE] = "UPDATE jobs SET state = 2, lease_owner = NULL, compute_s = compute_s + ?4, "
                    "gpu_s = gpu_s + ?5, warnings = ?6, progress_total = max(progress_total, 1), "
                    "progress_done = max(progress_total, 1) WHERE id = ?1 AND state = 1 AND attempts = ?2 AND "
                    "lease_owner = ?3",
    [ST_GETLEASE] = "SELECT attempts, max_attempts, cancel_requested FROM jobs WHERE id = ?1 AND "
                    "state = 1 AND attempts = ?2 AND lease_owner = ?3",
    [ST_REQUEUE] = "UPDATE jobs SET state = 0, lease_owner = NULL, not_before = ?2, "
                   "compute_s = compute_s + ?3, gpu_s = gpu_s + ?4, "
                   "errors = json_insert(errors, '$[#]', json_object('attempt', attempts, "
                   "'at', ?5, 'error', ?6)) WHERE id = ?1",
    [ST_DEAD] = "UPDATE jobs SET state = ?7, lease_owner = NULL, reason = ?6, "
                "compute_s = compute_s + ?3, gpu_s = gpu_s + ?4, "
                "errors = json_insert(errors, '$[#]', json_object('attempt', attempts, "
                "'at', ?5, 'error', ?6)), not_before = ?2 WHERE id = ?1",
    [ST_CANCELLED] = "UPDATE jobs SET state = 4, lease_owner = NULL, reason = ?2, "
                     "compute_s = compute_s + ?3, gpu_s = gpu_s + ?4 WHERE id = ?1",
    [ST_CANCEL_Q] = "UPDATE jobs SET state = 4, reason = 'cancelled while queued' "
                    "WHERE id = ?1 AND state = 0",
    [ST_CANCEL_R] = "UPDATE jobs SET cancel_requested = 1 WHERE id = ?1 AND state = 1",
    [ST_GET] = "SELECT id, state, priority, attempts, max_attempts, spec, idem_key, lease_owner, "
               "reason, errors, created, deadline, not_before, lease_until, compute_s, gpu_s, "
               "progress_done, progress_total, cancel_requested, parent, seg_index, pending, h2d_bytes, d2h_bytes, "
               "d2d_bytes, h2h_bytes, h2d_ns, d2h_ns, d2d_ns, h2h_ns, warnings FROM jobs WHERE id = ?1",
    [ST_EXPIRED] = "SELECT id, attempts, lease_owner FROM jobs WHERE state = 1 AND lease_until < ?1",
    [ST_DEADLINE] = "SELECT id FROM jobs WHERE state = 0 AND deadline > 0 AND deadline < ?1",
    [ST_BY_OWNER] = "SELECT id, attempts FROM jobs WHERE state = 1 AND lease_owner = ?1",
    [ST_COUNTS] = "SELECT state, count(*) FROM jobs GROUP BY state",
    [ST_RELEASE] = "UPDATE jobs SET state = 0, attempts = attempts - 1, lease_owner = NULL, "
                   "not_before = 0 WHERE id = ?1 AND state = 1 AND attempts = ?2 AND lease_owner = ?3 "
                   "AND cancel_requested = 0",
    [ST_STATE_TIMES] = "SELECT state, max(at) FROM transitions WHERE job = ?1 GROUP BY state",
    /* Segments: a checkpoint lowers the parent's count of unfinished
     * segments in the transaction that records the segment succeeded. */
    [ST_PARENT_DONE] = "UPDATE jobs SET pending = pending - 1 WHERE id = ?1 AND pending > 0",
    [ST_PARENT_FAIL] = "UPDATE jobs SET state = 3, pending = 0, reason = ?2, "
                       "errors = json_insert(errors, '$[#]', json_object('attempt', attempts, 'at', ?3, 'error', ?2)) "
                       "WHERE id = ?1 AND state = 0",
    [ST_SIBLINGS_CANCEL] = "UPDATE jobs SET state = 4, reason = ?2 WHERE parent = ?1 AND state = 0",
    [ST_CHILDREN_CANCEL_R] = "UPDATE jobs SET cancel_requested = 1 WHERE parent = ?1 AND state = 1",
    [ST_CHILDREN] = "SELECT id FROM jobs WHERE parent = ?1 ORDER BY seg_index",
    /* An attempt's transfers, added in the transaction that ends it. */
    [ST_XFER] = "UPDATE jobs SET h2d_bytes = h2d_bytes + ?2, d2h_bytes = d2h_bytes + ?3, "
                "d2d_bytes = d2d_bytes + ?4, h2h_bytes = h2h_bytes + ?5, h2d_ns = h2d_ns + ?6, "
                "d2h_ns = d2h_ns + ?7, d2d_ns = d2d_ns + ?8, h2h_ns = h2h_ns + ?9 WHERE id = ?1",
    /* A job's output paths: each path's last job. */
    [ST_OUTPUTS_PUT] = "INSERT OR REPLACE INTO outputs(path, job) SELECT value, ?1 FROM "
                       "json_each(CASE WHEN json_valid(?2) THEN ?2 ELSE '{}' END, '$.outputs') WHERE type = 'text'",
    /* A job's input paths: every reader, the queued or running ones found
     * through the jobs' states. */
    [ST_INPUTS_PUT] = "INSERT INTO inputs(path, job) SELECT value, ?1 FROM "
                      "json_each(CASE WHEN json_valid(?2) THEN ?2 ELSE '{}' END, '$.inputs') WHERE type = 'text'",
    /* The first clash of a spec's files (spn_clash_kind_t) with a job
     * queued or running: the outputs in the spec's order, then the inputs.
     * Each branch walks the spec's few paths and looks each up by index
     * (CROSS JOIN keeps that order); one statement with no materialised
     * tables, a few µs (a form with common table expressions took ~80). */
    [ST_CLASH] = "SELECT k, p, job, state, cx FROM ("
                 "SELECT 1 AS k, e.value AS p, e.id AS n, j.id AS job, j.state AS state, j.cancel_requested AS cx "
                 "FROM json_each(" SPEC_OR_EMPTY ", '$.outputs') e CROSS JOIN outputs x ON x.path = e.value "
                 "CROSS JOIN jobs j ON j.id = x.job WHERE e.type = 'text' AND j.state IN (0, 1) "
                 "UNION ALL SELECT 2, e.value, e.id, j.id, j.state, j.cancel_requested "
                 "FROM json_each(" SPEC_OR_EMPTY ", '$.outputs') e CROSS JOIN inputs x ON x.path = e.value "
                 "CROSS JOIN jobs j ON j.id = x.job WHERE e.type = 'text' AND j.state IN (0, 1) "
                 "UNION ALL SELECT 3, e.value, e.id, j.id, j.state, j.cancel_requested "
                 "FROM json_each(" SPEC_OR_EMPTY ", '$.inputs') e CROSS JOIN outputs x ON x.path = e.value "
                 "CROSS JOIN jobs j ON j.id = x.job WHERE e.type = 'text' AND j.state IN (0, 1)"
                 ") ORDER BY k = 3, n, k, job LIMIT 1",
    /* Retention (ops.purge): the top-level jobs whose final transition is
     * older than ?1, oldest first, none of whose segments is queued or
     * running (the final transitions are found by their own index). Each is
     * then deleted with its segments, history and file records. */
    [ST_PURGE_PICK] = "SELECT t.job FROM transitions t CROSS JOIN jobs j ON j.id = t.job "
                      "WHERE t.state >= 2 AND t.at < ?1 AND j.state >= 2 AND j.parent = 0 "
                      "AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent = j.id AND c.parent > 0 AND c.state < 2) "
                      "ORDER BY t.at LIMIT ?2",
    [ST_PURGE_TRANS] = "DELETE FROM transitions WHERE job IN "
                       "(SELECT ?1 UNION ALL SELECT id FROM jobs WHERE parent = ?1 AND parent > 0)",
    [ST_PURGE_FILES_OUT] = "DELETE FROM outputs WHERE job = ?1",
    [ST_PURGE_FILES_IN] = "DELETE FROM inputs WHERE job = ?1",
    [ST_PURGE_JOBS] = "DELETE FROM jobs WHERE id IN (SELECT ?1 UNION ALL SELECT id FROM jobs WHERE parent = ?1 "
                      "AND parent > 0)",
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS jobs("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " spec TEXT NOT NULL,"
    " priority INTEGER NOT NULL DEFAULT 0,"
    " state INTEGER NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " max_attempts INTEGER NOT NULL,"
    " idem_key TEXT UNIQUE,"
    " created INTEGER NOT NULL,"
    " deadline INTEGER NOT NULL DEFAULT 0,"
    " not_before INTEGER NOT NULL DEFAULT 0,"
    " lease_owner TEXT,"
    " lease_until INTEGER NOT NULL DEFAULT 0,"
    " cancel_requested INTEGER NOT NULL DEFAULT 0,"
    " reason TEXT,"
    " errors TEXT NOT NULL DEFAULT '[]',"
    " compute_s REAL NOT NULL DEFAULT 0,"
    " gpu_s REAL NOT NULL DEFAULT 0,"
    " progress_done INTEGER NOT NULL DEFAULT 0,"
    " progress_total INTEGER NOT NULL DEFAULT 0,"
    " parent INTEGER NOT NULL DEFAULT 0,"
    " seg_index INTEGER NOT NULL DEFAULT 0,"
    " pending INTEGER NOT NULL DEFAULT 0,"
    " h2d_bytes INTEGER NOT NULL DEFAULT 0, d2h_bytes INTEGER NOT NULL DEFAULT 0,"
    " d2d_bytes INTEGER NOT NULL DEFAULT 0, h2h_bytes INTEGER NOT NULL DEFAULT 0,"
    " h2d_ns INTEGER NOT NULL DEFAULT 0, d2h_ns INTEGER NOT NULL DEFAULT 0,"
    " d2d_ns INTEGER NOT NULL DEFAULT 0, h2h_ns INTEGER NOT NULL DEFAULT 0,"
    " warnings TEXT);"
    "CREATE INDEX IF NOT EXISTS jobs_pick ON jobs(state, priority DESC, id);"
    "CREATE INDEX IF NOT EXISTS jobs_deadline ON jobs(deadline) WHERE state = 0 AND deadline > 0;"
    "CREATE INDEX IF NOT EXISTS jobs_lease ON jobs(lease_until) WHERE state = 1;"
    "CREATE TABLE IF NOT EXISTS transitions("
    " job INTEGER NOT NULL, at INTEGER NOT NULL, state INTEGER NOT NULL, note TEXT);"
    "CREATE INDEX IF NOT EXISTS transitions_job ON transitions(job);"
    /* added later; a queue file written before it starts with none */
    "CREATE TABLE IF NOT EXISTS outputs(path TEXT PRIMARY KEY, job INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS inputs(path TEXT NOT NULL, job INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS inputs_path ON inputs(path);"
    /* retention: the final transitions by time, a job's file records */
    "CREATE INDEX IF NOT EXISTS transitions_ended ON transitions(at) WHERE state >= 2;"
    "CREATE INDEX IF NOT EXISTS outputs_job ON outputs(job);"
    "CREATE INDEX IF NOT EXISTS inputs_job ON inputs(job);";

/* Columns added after the first release: a queue file written before them
 * gets them (ALTER fails harmlessly where they exist), then their index. */
static const char *const schema_added[] = {
    "ALTER TABLE jobs ADD COLUMN parent INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN seg_index INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN pending INTEGER NOT NULL DEFAULT 0",
    /* transfers (docs/jobs.md): a job that ended before them reads 0 */
    "ALTER TABLE jobs ADD COLUMN h2d_bytes INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN d2h_bytes INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN d2d_bytes INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN h2h_bytes INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN h2d_ns INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN d2h_ns INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN d2d_ns INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN h2h_ns INTEGER NOT NULL DEFAULT 0",
    /* the succeeded attempt's warnings (docs/jobs.md): NULL before them */
    "ALTER TABLE jobs ADD COLUMN warnings TEXT",
};
static const char schema_index[] = "CREATE INDEX IF NOT EXISTS jobs_parent ON jobs(parent) WHERE parent > 0;";

typedef struct sq {
  sqlite3 *db;
  /* WAL checkpoints run on their own thread and connection, so a commit on
   * the loop thread never pays for copying the WAL back into the database. */
  pthread_t ckpt_th;
  bool ckpt_started, ckpt_quit;
  pthread_mutex_t ckpt_mu;
  pthread_cond_t ckpt_cond;
  char *path;
  sqlite3_stmt *st[ST_COUNT];
  int in_txn;
  uint32_t backoff_base_ms, backoff_max_ms;
  uint64_t rng;
  /* Worker presence (ops.present), in memory: the one gateway of this
   * file knows every worker and says so again after a restart. */
  struct sq_seen {
    char *name;
    int64_t at;
  } *seen;
  size_t nseen;
  int64_t seen_any;
} sq_t;

static int32_t db_error(sq_t *q, spn_error_t *err, const char *what) {
  return spn_error_set(err, SPN_EIO, "job queue: %s: %s", what, sqlite3_errmsg(q->db));
}

static sqlite3_stmt *stmt(sq_t *q, int which) {
  sqlite3_stmt *s = q->st[which];
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  return s;
}

static void bind_text(sqlite3_stmt *s, int i, const char *t) {
  if (t)
    sqlite3_bind_text(s, i, t, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(s, i);
}

/* Run a statement that returns no rows; returns sqlite3_changes or <0. */
static int exec_stmt(sq_t *q, sqlite3_stmt *s, spn_error_t *err, const char *what) {
  int rc = sqlite3_step(s);
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    db_error(q, err, what);
    return -1;
  }
  return sqlite3_changes(q->db);
}

static int32_t record_transition(sq_t *q, int64_t id, int64_t at, spn_queue_state_t st,
                                 const char *note, spn_error_t *err) {
  sqlite3_stmt *s = stmt(q, ST_TRANS);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, at);
  sqlite3_bind_int(s, 3, (int)st);
  bind_text(s, 4, note);
  return exec_stmt(q, s, err, "recording a transition") < 0 ? SPN_EIO : SPN_OK;
}

/* Writes outside an explicit begin/commit get their own transaction, so a
 * multi-statement change (state + transition row) is atomic either way. */
static int32_t auto_begin(sq_t *q, spn_error_t *err, int *opened) {
  *opened = 0;
  if (q->in_txn)
    return SPN_OK;
  if (exec_stmt(q, stmt(q, ST_BEGIN), err, "begin") < 0)
    return SPN_EIO;
  *opened = 1;
  return SPN_OK;
}

static int32_t auto_end(sq_t *q, int opened, int32_t rc, spn_error_t *err) {
  if (!opened)
    return rc;
  if (rc < 0) {
    sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
  }
  if (exec_stmt(q, stmt(q, ST_COMMIT), err, "commit") < 0) {
    sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
    return SPN_EIO;
  }
  return rc;
}

static int32_t sq_begin(void *qv, spn_error_t *err) {
  sq_t *q = qv;
  SPN_ASSERT(!q->in_txn);
  if (exec_stmt(q, stmt(q, ST_BEGIN), err, "begin") < 0)
    return SPN_EIO;
  q->in_txn = 1;
  return SPN_OK;
}

static int32_t sq_commit(void *qv, spn_error_t *err) {
  sq_t *q = qv;
  SPN_ASSERT(q->in_txn);
  q->in_txn = 0;
  if (exec_stmt(q, stmt(q, ST_COMMIT), err, "commit") < 0) {
    sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
    return SPN_EIO;
  }
  return SPN_OK;
}

/* The job an idempotency key names: 1 with *id that job while within the
 * window, 1 with *id 0 when the key is held but expired, 0 when no job has
 * it, -1 on a database error (err set). */
static int idem_find(sq_t *q, const char *key, int64_t now, int64_t *id, spn_error_t *err) {
  *id = 0;
  sqlite3_stmt *s = stmt(q, ST_IDEM_FIND);
  bind_text(s, 1, key);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW && now - sqlite3_column_int64(s, 1) < IDEM_WINDOW_MS)
    *id = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  if (r != SQLITE_ROW && r != SQLITE_DONE) {
    db_error(q, err, "idempotency lookup");
    return -1;
  }
  return r == SQLITE_ROW;
}

/* The first clash of a spec's files with a job queued or running (in the
 * submit's transaction): 1 with *c filled, 0 when none, -1 on a database
 * error (err set). */
static int clash_find(sq_t *q, const char *spec_json, spn_queue_clash_t *c, spn_error_t *err) {
  sqlite3_stmt *s = stmt(q, ST_CLASH);
  bind_text(s, 1, spec_json);
  int r = sqlite3_step(s);
  if (r == SQLITE_ROW) {
    const unsigned char *p = sqlite3_column_text(s, 1);
    *c = (spn_queue_clash_t){.kind = (spn_clash_kind_t)sqlite3_column_int(s, 0),
                             .job = sqlite3_column_int64(s, 2),
                             .state = (spn_queue_state_t)sqlite3_column_int(s, 3),
                             .stopping = sqlite3_column_int(s, 4) != 0};
    snprintf(c->path, sizeof c->path, "%s", p ? (const char *)p : "");
  }
  sqlite3_reset(s);
  if (r != SQLITE_ROW && r != SQLITE_DONE) {
    db_error(q, err, "checking a job's files");
    return -1;
  }
  return r == SQLITE_ROW;
}

static int32_t sq_submit(void *qv, const spn_queue_submit_t *sub, int64_t now, int64_t *id,
                         bool *existed, spn_error_t *err) {
  sq_t *q = qv;
  int opened;
  int32_t rc = auto_begin(q, err, &opened);
  if (rc < 0)
    return rc;
  *existed = false;
  if (sub->idem_key) {
    int64_t old = 0;
    int found = idem_find(q, sub->idem_key, now, &old, err);
    if (found < 0)
      return auto_end(q, opened, SPN_EIO, err);
    if (found && old) {
      *id = old;
      *existed = true;
      return auto_end(q, opened, SPN_OK, err);
    }
    if (found) {
      /* Expired key: the old job keeps its history but gives up the key. */
      sqlite3_stmt *s = stmt(q, ST_IDEM_CLEAR);
      bind_text(s, 1, sub->idem_key);
      if (exec_stmt(q, s, err, "clearing an expired idempotency key") < 0)
        return auto_end(q, opened, SPN_EIO, err);
    }
  }
  if (sub->clash && sub->parent == 0) {
    int found = clash_find(q, sub->spec_json, sub->clash, err);
    if (found)
      return auto_end(q, opened, found < 0 ? SPN_EIO : SPN_EBUSY, err);
  }
  sqlite3_stmt *s = stmt(q, ST_INSERT);
  bind_text(s, 1, sub->spec_json);
  sqlite3_bind_int(s, 2, sub->priority);
  sqlite3_bind_int(s, 3, (int)(sub->max_attempts ? sub->max_attempts : 1));
  bind_text(s, 4, sub->idem_key);
  sqlite3_bind_int64(s, 5, now);
  sqlite3_bind_int64(s, 6, sub->deadline_ms);
  sqlite3_bind_int64(s, 7, sub->parent);
  sqlite3_bind_int(s, 8, sub->seg_index);
  sqlite3_bind_int(s, 9, (int)sub->pending);
  if (exec_stmt(q, s, err, "inserting a job") < 0)
    return auto_end(q, opened, SPN_EIO, err);
  *id = sqlite3_last_insert_rowid(q->db);
  rc = record_transition(q, *id, now, SPN_QSTATE_QUEUED, "submitted", err);
  if (rc == SPN_OK && sub->parent == 0) {
    s = stmt(q, ST_OUTPUTS_PUT);
    sqlite3_bind_int64(s, 1, *id);
    bind_text(s, 2, sub->spec_json);
    if (exec_stmt(q, s, err, "recording a job's outputs") < 0)
      rc = SPN_EIO;
    s = stmt(q, ST_INPUTS_PUT);
    sqlite3_bind_int64(s, 1, *id);
    bind_text(s, 2, sub->spec_json);
    if (rc == SPN_OK && exec_stmt(q, s, err, "recording a job's inputs") < 0)
      rc = SPN_EIO;
  }
  return auto_end(q, opened, rc, err);
}

static char *dup_col(sqlite3_stmt *s, int i) {
  const unsigned char *t = sqlite3_column_text(s, i);
  return t ? strdup((const char *)t) : NULL;
}

static int32_t sq_get(void *qv, int64_t id, spn_queue_job_t *j, spn_error_t *err) {
  sq_t *q = qv;
  memset(j, 0, sizeof *j);
  sqlite3_stmt *s = stmt(q, ST_GET);
  sqlite3_bind_int64(s, 1, id);
  int r = sqlite3_step(s);
  if (r == SQLITE_DONE) {
    sqlite3_reset(s);
    return spn_error_set(err, SPN_ENOENT, "job %lld: no such job", (long long)id);
  }
  if (r != SQLITE_ROW) {
    sqlite3_reset(s);
    return db_error(q, err, "reading a job");
  }
  j->id = sqlite3_column_int64(s, 0);
  j->state = (spn_queue_state_t)sqlite3_column_int(s, 1);
  j->priority = sqlite3_column_int(s, 2);
  j->attempts = (uint32_t)sqlite3_column_int(s, 3);
  j->max_attempts = (uint32_t)sqlite3_column_int(s, 4);
  j->spec_json = dup_col(s, 5);
  j->idem_key = dup_col(s, 6);
  j->lease_owner = dup_col(s, 7);
  j->reason = dup_col(s, 8);
  j->errors_json = dup_col(s, 9);
  j->created_ms = sqlite3_column_int64(s, 10);
  j->deadline_ms = sqlite3_column_int64(s, 11);
  j->not_before_ms = sqlite3_column_int64(s, 12);
  j->lease_until_ms = sqlite3_column_int64(s, 13);
  j->compute_s = sqlite3_column_double(s, 14);
  j->gpu_s = sqlite3_column_double(s, 15);
  j->progress_done = (uint64_t)sqlite3_column_int64(s, 16);
  j->progress_total = (uint64_t)sqlite3_column_int64(s, 17);
  j->cancel_requested = sqlite3_column_int(s, 18) != 0;
  j->parent = sqlite3_column_int64(s, 19);
  j->seg_index = sqlite3_column_int(s, 20);
  j->pending = (uint32_t)sqlite3_column_int(s, 21);
  for (int d = 0; d < 4; d++) {
    j->xfer.bytes[d] = (uint64_t)sqlite3_column_int64(s, 22 + d);
    j->xfer.ns[d] = (uint64_t)sqlite3_column_int64(s, 26 + d);
  }
  j->warnings_json = sqlite3_column_type(s, 30) == SQLITE_NULL ? NULL : dup_col(s, 30);
  sqlite3_reset(s);
  if (!j->spec_json || !j->errors_json) {
    spn__queue_job_clear(j);
    return spn_error_set(err, SPN_ENOMEM, "job %lld: out of memory", (long long)id);
  }
  s = stmt(q, ST_STATE_TIMES);
  sqlite3_bind_int64(s, 1, id);
  while (sqlite3_step(s) == SQLITE_ROW) {
    int st = sqlite3_column_int(s, 0);
    if (st >= 0 && st < SPN_QSTATE_COUNT)
      j->t_state_ms[st] = sqlite3_column_int64(s, 1);
  }
  sqlite3_reset(s);
  return SPN_OK;
}

static int32_t sq_lease(void *qv, const char *owner, const char *pipelines, int64_t now, int64_t lease_ms,
                        spn_queue_job_t *out, spn_error_t *err) {
  sq_t *q = qv;
  sqlite3_stmt *s = stmt(q, ST_PICK);
  sqlite3_bind_int64(s, 1, now);
  if (pipelines)
    sqlite3_bind_text(s, 2, pipelines, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(s, 2);
  int r = sqlite3_step(s);
  if (r == SQLITE_DONE) {
    sqlite3_reset(s);
    return SPN_EAGAIN;
  }
  if (r != SQLITE_ROW) {
    sqlite3_reset(s);
    return db_error(q, err, "picking a job");
  }
  int64_t id = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  int opened;
  int32_t rc = auto_begin(q, err, &opened);
  if (rc < 0)
    return rc;
  s = stmt(q, ST_LEASE);
  sqlite3_bind_int64(s, 1, id);
  bind_text(s, 2, owner);
  sqlite3_bind_int64(s, 3, now + lease_ms);
  rc = exec_stmt(q, s, err, "leasing a job") < 0 ? SPN_EIO : SPN_OK;
  if (rc == SPN_OK)
    rc = record_transition(q, id, now, SPN_QSTATE_RUNNING, owner, err);
  rc = auto_end(q, opened, rc, err);
  if (rc < 0)
    return rc;
  return sq_get(q, id, out, err);
}

static int32_t sq_renew(void *qv, int64_t id, uint32_t attempt, const char *owner, int64_t now,
                        int64_t lease_ms, spn_error_t *err) {
  sq_t *q = qv;
  sqlite3_stmt *s = stmt(q, ST_RENEW);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int(s, 2, (int)attempt);
  bind_text(s, 3, owner);
  sqlite3_bind_int64(s, 4, now + lease_ms);
  int n = exec_stmt(q, s, err, "renewing a lease");
  if (n < 0)
    return SPN_EIO;
  if (n == 0)
    return spn_error_set(err, SPN_ESTATE, "job %lld: lease %u is not held by %s", (long long)id,
                         attempt, owner);
  return SPN_OK;
}

static int32_t sq_progress(void *qv, int64_t id, uint64_t done, uint64_t total, spn_error_t *err) {
  sq_t *q = qv;
  sqlite3_stmt *s = stmt(q, ST_PROGRESS);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, (sqlite3_int64)done);
  sqlite3_bind_int64(s, 3, (sqlite3_int64)total);
  return exec_stmt(q, s, err, "recording progress") < 0 ? SPN_EIO : SPN_OK;
}

/* The parent of job `id`, or 0. */
static int64_t parent_of(sq_t *q, int64_t id, int32_t *index) {
  spn_queue_job_t j;
  if (sq_get(q, id, &j, NULL) < 0)
    return 0;
  int64_t p = j.parent;
  if (index)
    *index = j.seg_index;
  spn__queue_job_clear(&j);
  return p;
}

/* Segment `id` succeeded (its lease checked, so this runs once per
 * segment): one fewer for its parent to wait for. */
static int32_t segment_done(sq_t *q, int64_t id, spn_error_t *err) {
  int64_t p = parent_of(q, id, NULL);
  if (!p)
    return SPN_OK;
  sqlite3_stmt *s = stmt(q, ST_PARENT_DONE);
  sqlite3_bind_int64(s, 1, p);
  return exec_stmt(q, s, err, "checkpointing a segment") < 0 ? SPN_EIO : SPN_OK;
}

/* Segment `id` ended failed, dead or cancelled: its parent can never be
 * joined, so it fails (if still waiting) and its queued segments stop. */
static int32_t segment_failed(sq_t *q, int64_t id, spn_queue_state_t ns, const char *reason, int64_t now,
                              spn_error_t *err) {
  int32_t index = 0;
  int64_t p = parent_of(q, id, &index);
  if (!p)
    return SPN_OK;
  char msg[SPN_ERROR_MSG_MAX];
  snprintf(msg, sizeof msg, "segment %d (job %lld) %s: %s", (int)index, (long long)id, spn_queue_state_name(ns),
           reason ? reason : "");
  sqlite3_stmt *s = stmt(q, ST_PARENT_FAIL);
  sqlite3_bind_int64(s, 1, p);
  bind_text(s, 2, msg);
  sqlite3_bind_int64(s, 3, now);
  int n = exec_stmt(q, s, err, "failing a segmented job");
  if (n < 0)
    return SPN_EIO;
  if (n == 0)
    return SPN_OK; /* the parent already ended (cancelled, or an earlier segment failed) */
  int32_t rc = record_transition(q, p, now, SPN_QSTATE_FAILED, msg, err);
  if (rc < 0)
    return rc;
  s = stmt(q, ST_SIBLINGS_CANCEL);
  sqlite3_bind_int64(s, 1, p);
  bind_text(s, 2, "another segment of the job failed");
  return exec_stmt(q, s, err, "cancelling segments") < 0 ? SPN_EIO : SPN_OK;
}

/* Add an attempt's transfers to job id's (in the caller's transaction);
 * nothing to do for none. Counts above INT64_MAX are clamped there (SQLite
 * integers are signed; no job copies 8 EiB). */
static int32_t add_xfer(sq_t *q, int64_t id, const spn_job_xfer_t *x, spn_error_t *err) {
  bool any = false;
  for (int d = 0; x && d < 4; d++)
    any |= x->bytes[d] || x->ns[d];
  if (!any)
    return SPN_OK;
  sqlite3_stmt *s = stmt(q, ST_XFER);
  sqlite3_bind_int64(s, 1, id);
  for (int d = 0; d < 4; d++) {
    sqlite3_bind_int64(s, 2 + d, x->bytes[d] > INT64_MAX ? INT64_MAX : (int64_t)x->bytes[d]);
    sqlite3_bind_int64(s, 6 + d, x->ns[d] > INT64_MAX ? INT64_MAX : (int64_t)x->ns[d]);
  }
  return exec_stmt(q, s, err, "recording a job's transfers") < 0 ? SPN_EIO : SPN_OK;
}

static int32_t sq_complete(void *qv, int64_t id, uint32_t attempt, const char *owner,
                           double compute_s, double gpu_s, const spn_job_xfer_t *xfer, const char *warnings,
                           int64_t now, spn_error_t *err) {
  sq_t *q = qv;
  int opened;
  int32_t rc = auto_begin(q, err, &opened);
  if (rc < 0)
    return rc;
  sqlite3_stmt *s = stmt(q, ST_COMPLETE);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int(s, 2, (int)attempt);
  bind_text(s, 3, owner);
  sqlite3_bind_double(s, 4, compute_s);
  sqlite3_bind_double(s, 5, gpu_s);
  bind_text(s, 6, warnings && *warnings ? warnings : NULL);
  int n = exec_stmt(q, s, err, "completing a job");
  if (n < 0)
    rc = SPN_EIO;
  else if (n == 0)
    rc = spn_error_set(err, SPN_ESTATE, "job %lld: lease %u is not held by %s", (long long)id,
                       attempt, owner);
  else
    rc = record_transition(q, id, now, SPN_QSTATE_SUCCEEDED, owner, err);
  if (rc == SPN_OK)
    rc = add_xfer(q, id, xfer, err);
  if (rc == SPN_OK)
    rc = segment_done(q, id, err);
  return auto_end(q, opened, rc, err);
}

/* The failure path shared by worker reports, expired leases and lost
 * workers. The caller holds a transaction. */
static int32_t fail_locked(sq_t *q, int64_t id, uint32_t attempts, uint32_t max_attempts,
                           bool cancelled, bool final, const char *reason, double compute_s, double gpu_s,
                           int64_t now, spn_queue_state_t *state, spn_error_t *err) {
  sqlite3_stmt *s;
  spn_queue_state_t ns;
  if (cancelled) {
    s = stmt(q, ST_CANCELLED);
    sqlite3_bind_int64(s, 1, id);
    bind_text(s, 2, reason);
    sqlite3_bind_double(s, 3, compute_s);
    sqlite3_bind_double(s, 4, gpu_s);
    ns = SPN_QSTATE_CANCELLED;
  } else if (attempts < max_attempts && !final) {
    s = stmt(q, ST_REQUEUE);
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2,
                       now + spn__backoff_ms(q->backoff_base_ms, q->backoff_max_ms, attempts, &q->rng));
    sqlite3_bind_double(s, 3, compute_s);
    sqlite3_bind_double(s, 4, gpu_s);
    sqlite3_bind_int64(s, 5, now);
    bind_text(s, 6, reason);
    ns = SPN_QSTATE_QUEUED;
  } else {
    s = stmt(q, ST_DEAD);
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, 0);
    sqlite3_bind_double(s, 3, compute_s);
    sqlite3_bind_double(s, 4, gpu_s);
    sqlite3_bind_int64(s, 5, now);
    bind_text(s, 6, reason);
    /* One attempt only and it failed, or a failure no retry can mend:
     * "failed"; retries exhausted: "dead". */
    ns = max_attempts > 1 && !final ? SPN_QSTATE_DEAD : SPN_QSTATE_FAILED;
    sqlite3_bind_int(s, 7, (int)ns);
  }
  if (exec_stmt(q, s, err, "recording a failure") < 0)
    return SPN_EIO;
  if (state)
    *state = ns;
  int32_t rc = record_transition(q, id, now, ns, reason, err);
  if (rc == SPN_OK && ns != SPN_QSTATE_QUEUED)
    rc = segment_failed(q, id, ns, reason, now, err);
  return rc;
}

static int32_t sq_fail(void *qv, int64_t id, uint32_t attempt, const char *owner, const char *reason,
                       spn_fail_how_t how, double compute_s, double gpu_s, const spn_job_xfer_t *xfer, int64_t now,
                       spn_queue_state_t *state, spn_error_t *err) {
  sq_t *q = qv;
  int opened;
  int32_t rc = auto_begin(q, err, &opened);
  if (rc < 0)
    return rc;
  sqlite3_stmt *s = stmt(q, ST_GETLEASE);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int(s, 2, (int)attempt);
  bind_text(s, 3, owner);
  int r = sqlite3_step(s);
  if (r != SQLITE_ROW) {
    sqlite3_reset(s);
    rc = r == SQLITE_DONE ? spn_error_set(err, SPN_ESTATE, "job %lld: lease %u is not held by %s",
                                          (long long)id, attempt, owner)
                          : db_error(q, err, "reading a lease");
    return auto_end(q, opened, rc, err);
  }
  uint32_t attempts = (uint32_t)sqlite3_column_int(s, 0);
  uint32_t max_attempts = (uint32_t)sqlite3_column_int(s, 1);
  bool cancel_req = sqlite3_column_int(s, 2) != 0;
  sqlite3_reset(s);
  /* A job whose cancel was requested ends cancelled whatever the worker
   * says, so a cancel is never undone by a retry. */
  rc = add_xfer(q, id, xfer, err);
  if (rc == SPN_OK)
    rc = fail_locked(q, id, attempts, max_attempts, how == SPN_FAIL_CANCELLED || cancel_req, how == SPN_FAIL_FINAL,
                     reason, compute_s, gpu_s, now, state,
                     err);
  return auto_end(q, opened, rc, err);
}

/* A cancelled parent: its queued segments are cancelled, running ones asked
 * to stop (their workers see it at the next renew). */
static int32_t children_cancel(sq_t *q, int64_t parent, spn_error_t *err) {
  sqlite3_stmt *s = stmt(q, ST_SIBLINGS_CANCEL);
  sqlite3_bind_int64(s, 1, parent);
  bind_text(s, 2, "the job was cancelled");
  if (exec_stmt(q, s, err, "cancelling segments") < 0)
    return SPN_EIO;
  s = stmt(q, ST_CHILDREN_CANCEL_R);
  sqlite3_bind_int64(s, 1, parent);
  return exec_stmt(q, s, err, "cancelling segments") < 0 ? SPN_EIO : SPN_OK;
}

static int32_t sq_cancel(void *qv, int64_t id, int64_t now, spn_queue_state_t *state,
                         spn_error_t *err) {
  sq_t *q = qv;
  int opened;
  int32_t rc = auto_begin(q, err, &opened);
  if (rc < 0)
    return rc;
  sqlite3_stmt *s = stmt(q, ST_CANCEL_Q);
  sqlite3_bind_int64(s, 1, id);
  int n = exec_stmt(q, s, err, "cancelling a job");
  if (n < 0)
    return auto_end(q, opened, SPN_EIO, err);
  if (n == 1) {
    *state = SPN_QSTATE_CANCELLED;
    rc = record_transition(q, id, now, SPN_QSTATE_CANCELLED, "cancelled while queued", err);
    if (rc == SPN_OK)
      rc = children_cancel(q, id, err);
    if (rc == SPN_OK)
      rc = segment_failed(q, id, SPN_QSTATE_CANCELLED, "cancelled while queued", now, err);
    return auto_end(q, opened, rc, err);
  }
  s = stmt(q, ST_CANCEL_R);
  sqlite3_bind_int64(s, 1, id);
  n = exec_stmt(q, s, err, "cancelling a job");
  if (n < 0)
    return auto_end(q, opened, SPN_EIO, err);
  if (n == 1) {
    *state = SPN_QSTATE_RUNNING;
    return auto_end(q, opened, SPN_OK, err);
  }
  spn_queue_job_t j;
  rc = sq_get(q, id, &j, err);
  if (rc == SPN_OK) {
    *state = j.state;
    rc = spn_error_set(err, SPN_ESTATE, "job %lld: already %s", (long long)id,
                       spn_queue_state_name(j.state));
    spn__queue_job_clear(&j);
  }
  return auto_end(q, opened, rc, err);
}

static int32_t sq_release(void *qv, int64_t id, uint32_t attempt, const char *owner, const char *note,
                          int64_t now, spn_error_t *err) {
  sq_t *q = qv;
  int opened;
  int32_t rc = auto_begin(q, err, &opened);
  if (rc < 0)
    return rc;
  sqlite3_stmt *s = stmt(q, ST_RELEASE);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int(s, 2, (int)attempt);
  bind_text(s, 3, owner);
  int n = exec_stmt(q, s, err, "releasing a job");
  if (n < 0)
    rc = SPN_EIO;
  else if (n == 0)
    rc = spn_error_set(err, SPN_ESTATE, "job %lld: lease %u is not held by %s (or cancel requested)",
                       (long long)id, attempt, owner);
  else
    rc = record_transition(q, id, now, SPN_QSTATE_QUEUED, note, err);
  return auto_end(q, opened, rc, err);
}

typedef struct id_att {
  int64_t id;
  uint32_t attempts;
} id_att_t;

/* Collect (id, attempts) rows of a prepared select so the statements that
 * change them can run afterwards. */
static int32_t collect(sq_t *q, sqlite3_stmt *s, id_att_t **out, size_t *n, spn_error_t *err) {
  size_t cap = 0;
  *out = NULL;
  *n = 0;
  int r;
  while ((r = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      id_att_t *nv = realloc(*out, cap * sizeof *nv);
      if (!nv) {
        sqlite3_reset(s);
        free(*out);
        *out = NULL;
        return spn_error_set(err, SPN_ENOMEM, "job queue: out of memory");
      }
      *out = nv;
    }
    (*out)[*n].id = sqlite3_column_int64(s, 0);
    (*out)[*n].attempts = sqlite3_column_count(s) > 1 ? (uint32_t)sqlite3_column_int(s, 1) : 0;
    (*n)++;
  }
  sqlite3_reset(s);
  if (r != SQLITE_DONE) {
    free(*out);
    *out = NULL;
    return db_error(q, err, "scanning jobs");
  }
  return SPN_OK;
}

static int32_t fail_listed(sq_t *q, id_att_t *v, size_t n, const char *reason, int64_t now,
                           spn_queue_changed_cb cb, void *user, spn_error_t *err) {
  for (size_t i = 0; i < n; i++) {
    spn_queue_job_t j;
    int32_t rc = sq_get(q, v[i].id, &j, err);
    if (rc < 0)
      return rc;
    spn_queue_state_t ns;
    rc = fail_locked(q, j.id, j.attempts, j.max_attempts, j.cancel_requested, false,
                     j.cancel_requested ? "cancelled (worker lost)" : reason, 0, 0, now, &ns, err);
    spn__queue_job_clear(&j);
    if (rc < 0)
      return rc;
    if (cb)
      cb(user, v[i].id, ns);
  }
  return SPN_OK;
}

static int32_t sq_sweep(void *qv, int64_t now, spn_queue_changed_cb cb, void *user,
                        spn_error_t *err) {
  sq_t *q = qv;
  id_att_t *exp = NULL, *dl = NULL;
  size_t nexp = 0, ndl = 0;
  sqlite3_stmt *s = stmt(q, ST_EXPIRED);
  sqlite3_bind_int64(s, 1, now);
  int32_t rc = collect(q, s, &exp, &nexp, err);
  if (rc < 0)
    return rc;
  s = stmt(q, ST_DEADLINE);
  sqlite3_bind_int64(s, 1, now);
  rc = collect(q, s, &dl, &ndl, err);
  if (rc < 0)
    goto out_exp;
  if (nexp + ndl == 0)
    goto out_dl;
  int opened;
  rc = auto_begin(q, err, &opened);
  if (rc < 0)
    goto out_dl;
  rc = fail_listed(q, exp, nexp, "lease expired (worker lost or stalled)", now, cb, user, err);
  for (size_t i = 0; rc == SPN_OK && i < ndl; i++) {
    /* A queued job past its deadline fails now: it would be late anyway. */
    s = stmt(q, ST_DEAD);
    sqlite3_bind_int64(s, 1, dl[i].id);
    sqlite3_bind_int64(s, 2, 0);
    sqlite3_bind_double(s, 3, 0);
    sqlite3_bind_double(s, 4, 0);
    sqlite3_bind_int64(s, 5, now);
    bind_text(s, 6, "deadline passed while queued");
    sqlite3_bind_int(s, 7, SPN_QSTATE_FAILED);
    if (exec_stmt(q, s, err, "failing a job past its deadline") < 0)
      rc = SPN_EIO;
    else
      rc = record_transition(q, dl[i].id, now, SPN_QSTATE_FAILED, "deadline passed while queued", err);
    if (rc == SPN_OK && cb)
      cb(user, dl[i].id, SPN_QSTATE_FAILED);
  }
  rc = auto_end(q, opened, rc, err);
  if (rc == SPN_OK)
    rc = (int32_t)(nexp + ndl);
out_dl:
  free(dl);
out_exp:
  free(exp);
  return rc;
}

static int32_t sq_release_owner(void *qv, const char *owner, const char *reason, int64_t now,
                                spn_queue_changed_cb cb, void *user, spn_error_t *err) {
  sq_t *q = qv;
  id_att_t *v = NULL;
  size_t n = 0;
  sqlite3_stmt *s = stmt(q, ST_BY_OWNER);
  bind_text(s, 1, owner);
  int32_t rc = collect(q, s, &v, &n, err);
  if (rc < 0 || n == 0)
    return rc;
  int opened;
  rc = auto_begin(q, err, &opened);
  if (rc == SPN_OK) {
    rc = fail_listed(q, v, n, reason, now, cb, user, err);
    rc = auto_end(q, opened, rc, err);
  }
  free(v);
  return rc < 0 ? rc : (int32_t)n;
}

static int32_t sq_list(void *qv, int32_t state, uint32_t limit, spn_queue_list_cb cb, void *user,
                       spn_error_t *err) {
  sq_t *q = qv;
  sqlite3_stmt *s;
  const char *sql = state >= 0 ? "SELECT id FROM jobs WHERE state = ?1 ORDER BY id DESC LIMIT ?2"
                               : "SELECT id FROM jobs ORDER BY id DESC LIMIT ?2";
  if (sqlite3_prepare_v2(q->db, sql, -1, &s, NULL) != SQLITE_OK)
    return db_error(q, err, "listing jobs");
  if (state >= 0)
    sqlite3_bind_int(s, 1, state);
  sqlite3_bind_int64(s, 2, limit);
  id_att_t *v = NULL;
  size_t n = 0;
  int32_t rc = collect(q, s, &v, &n, err);
  sqlite3_finalize(s);
  for (size_t i = 0; rc == SPN_OK && i < n; i++) {
    spn_queue_job_t j;
    rc = sq_get(q, v[i].id, &j, err);
    if (rc == SPN_OK) {
      cb(user, &j);
      spn__queue_job_clear(&j);
    }
  }
  free(v);
  return rc;
}

static int32_t sq_children(void *qv, int64_t parent, spn_queue_list_cb cb, void *user, spn_error_t *err) {
  sq_t *q = qv;
  sqlite3_stmt *s = stmt(q, ST_CHILDREN);
  sqlite3_bind_int64(s, 1, parent);
  id_att_t *v = NULL;
  size_t n = 0;
  int32_t rc = collect(q, s, &v, &n, err);
  for (size_t i = 0; rc == SPN_OK && i < n; i++) {
    spn_queue_job_t j;
    rc = sq_get(q, v[i].id, &j, err);
    if (rc == SPN_OK) {
      cb(user, &j);
      spn__queue_job_clear(&j);
    }
  }
  free(v);
  return rc;
}

static int32_t sq_counts(void *qv, int64_t out[SPN_QSTATE_COUNT], spn_error_t *err) {
  sq_t *q = qv;
  memset(out, 0, sizeof(int64_t) * SPN_QSTATE_COUNT);
  sqlite3_stmt *s = stmt(q, ST_COUNTS);
  int r;
  while ((r = sqlite3_step(s)) == SQLITE_ROW) {
    int st = sqlite3_column_int(s, 0);
    if (st >= 0 && st < SPN_QSTATE_COUNT)
      out[st] = sqlite3_column_int64(s, 1);
  }
  sqlite3_reset(s);
  return r == SQLITE_DONE ? SPN_OK : db_error(q, err, "counting jobs");
}

static void *ckpt_main(void *arg) {
  sq_t *q = arg;
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(q->path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
    sqlite3_close(db);
    return NULL;
  }
  sqlite3_busy_timeout(db, 100);
  pthread_mutex_lock(&q->ckpt_mu);
  while (!q->ckpt_quit) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&q->ckpt_cond, &q->ckpt_mu, &ts);
    if (q->ckpt_quit)
      break;
    pthread_mutex_unlock(&q->ckpt_mu);
    /* PASSIVE never blocks the writer; it copies what it can. */
    sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    pthread_mutex_lock(&q->ckpt_mu);
  }
  pthread_mutex_unlock(&q->ckpt_mu);
  sqlite3_close(db);
  return NULL;
}

/* A name appears once; at most SQ_SEEN_MAX of them (the gateway passes
 * only pipelines it has), the oldest replaced beyond that. */
#define SQ_SEEN_MAX 4096

static int32_t sq_present(void *qv, const char *pipelines, int64_t now, spn_error_t *err) {
  sq_t *q = qv;
  if (!pipelines) {
    q->seen_any = now;
    return SPN_OK;
  }
  size_t len = 0;
  for (const char *name = NULL; spn__pipeline_filter_next(pipelines, &name, &len);) {
    size_t i = 0, oldest = 0;
    for (; i < q->nseen && (strlen(q->seen[i].name) != len || memcmp(q->seen[i].name, name, len)); i++)
      oldest = q->seen[i].at < q->seen[oldest].at ? i : oldest;
    if (i == q->nseen) {
      if (q->nseen < SQ_SEEN_MAX) {
        struct sq_seen *grown = realloc(q->seen, (q->nseen + 1) * sizeof *q->seen);
        if (!grown)
          return spn_error_set(err, SPN_ENOMEM, "job queue: out of memory");
        q->seen = grown;
      } else {
        i = oldest;
      }
      char *copy = strndup(name, len);
      if (!copy)
        return spn_error_set(err, SPN_ENOMEM, "job queue: out of memory");
      if (i == q->nseen)
        q->nseen++;
      else
        free(q->seen[i].name);
      q->seen[i].name = copy;
    }
    q->seen[i].at = now;
  }
  return SPN_OK;
}

static int32_t sq_seen(void *qv, const char *pipeline, int64_t *at, spn_error_t *err) {
  (void)err;
  sq_t *q = qv;
  *at = q->seen_any;
  for (size_t i = 0; i < q->nseen; i++)
    if (!strcmp(q->seen[i].name, pipeline) && q->seen[i].at > *at)
      *at = q->seen[i].at;
  return SPN_OK;
}

/* Retention: up to `limit` top-level jobs that ended before `before`, each
 * with its segments, transitions and file records, in one transaction. */
static int32_t sq_purge(void *qv, int64_t before, uint32_t limit, uint32_t *removed, spn_error_t *err) {
  sq_t *q = qv;
  *removed = 0;
  int64_t *ids = calloc(limit ? limit : 1, sizeof *ids);
  if (!ids)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  sqlite3_stmt *s = stmt(q, ST_PURGE_PICK);
  sqlite3_bind_int64(s, 1, before);
  sqlite3_bind_int64(s, 2, limit);
  uint32_t n = 0;
  int r;
  while (n < limit && (r = sqlite3_step(s)) == SQLITE_ROW)
    ids[n++] = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  if (n < limit && r != SQLITE_DONE) {
    free(ids);
    return db_error(q, err, "finding the jobs past their retention");
  }
  int opened;
  int32_t rc = n ? auto_begin(q, err, &opened) : SPN_OK;
  if (rc < 0 || !n) {
    free(ids);
    return rc;
  }
  static const int del[] = {ST_PURGE_TRANS, ST_PURGE_FILES_OUT, ST_PURGE_FILES_IN, ST_PURGE_JOBS};
  for (uint32_t i = 0; rc == SPN_OK && i < n; i++) {
    int changed = 0;
    for (size_t k = 0; rc == SPN_OK && k < sizeof del / sizeof *del; k++) {
      s = stmt(q, del[k]);
      sqlite3_bind_int64(s, 1, ids[i]);
      int c = exec_stmt(q, s, err, "deleting a job past its retention");
      if (c < 0)
        rc = SPN_EIO;
      else if (del[k] == ST_PURGE_JOBS)
        changed = c;
    }
    *removed += changed > 0;
  }
  free(ids);
  if (rc < 0)
    *removed = 0;
  return auto_end(q, opened, rc, err);
}

static void sq_free(void *qv) {
  sq_t *q = qv;
  if (!q)
    return;
  for (size_t i = 0; i < q->nseen; i++)
    free(q->seen[i].name);
  free(q->seen);
  if (q->ckpt_started) {
    pthread_mutex_lock(&q->ckpt_mu);
    q->ckpt_quit = true;
    pthread_cond_signal(&q->ckpt_cond);
    pthread_mutex_unlock(&q->ckpt_mu);
    pthread_join(q->ckpt_th, NULL);
  }
  pthread_mutex_destroy(&q->ckpt_mu);
  pthread_cond_destroy(&q->ckpt_cond);
  free(q->path);
  for (int i = 0; i < ST_COUNT; i++)
    sqlite3_finalize(q->st[i]);
  sqlite3_close(q->db);
  free(q);
}

static const spn_queue_ops_t sqlite_ops = {
    .name = "sqlite",
    .begin = sq_begin,
    .commit = sq_commit,
    .submit = sq_submit,
    .purge = sq_purge,
    .lease = sq_lease,
    .renew = sq_renew,
    .progress = sq_progress,
    .complete = sq_complete,
    .fail = sq_fail,
    .cancel = sq_cancel,
    .sweep = sq_sweep,
    .release = sq_release,
    .release_owner = sq_release_owner,
    .get = sq_get,
    .list = sq_list,
    .children = sq_children,
    .counts = sq_counts,
    .present = sq_present,
    .seen = sq_seen,
    .free = sq_free,
};

int32_t spn_queue_sqlite_open(const spn_queue_config_t *cfg, spn_queue_t *out, spn_error_t *err) {
  sq_t *q = calloc(1, sizeof *q);
  if (!q)
    return spn_error_set(err, SPN_ENOMEM, "job queue: out of memory");
  pthread_mutex_init(&q->ckpt_mu, NULL);
  pthread_cond_init(&q->ckpt_cond, NULL);
  int32_t rc;
  if (sqlite3_open_v2(cfg->path, &q->db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      NULL) != SQLITE_OK) {
    rc = spn_error_set(err, SPN_EIO, "job queue %s: %s", cfg->path,
                       q->db ? sqlite3_errmsg(q->db) : "cannot open");
    goto out_free;
  }
  sqlite3_busy_timeout(q->db, 5000);
  char pragmas[160];
  snprintf(pragmas, sizeof pragmas,
           "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s; PRAGMA foreign_keys=OFF;",
           cfg->sync_full ? "FULL" : "NORMAL");
  char *msg = NULL;
  if (sqlite3_exec(q->db, pragmas, NULL, NULL, &msg) != SQLITE_OK ||
      sqlite3_exec(q->db, schema, NULL, NULL, &msg) != SQLITE_OK) {
    rc = spn_error_set(err, SPN_EIO, "job queue %s: %s", cfg->path, msg ? msg : "schema");
    sqlite3_free(msg);
    goto out_free;
  }
  for (size_t i = 0; i < sizeof schema_added / sizeof *schema_added; i++)
    sqlite3_exec(q->db, schema_added[i], NULL, NULL, NULL);
  if (sqlite3_exec(q->db, schema_index, NULL, NULL, &msg) != SQLITE_OK) {
    rc = spn_error_set(err, SPN_EIO, "job queue %s: %s", cfg->path, msg ? msg : "schema");
    sqlite3_free(msg);
    goto out_free;
  }
  for (int i = 0; i < ST_COUNT; i++) {
    if (sqlite3_prepare_v3(q->db, sql_text[i], -1, SQLITE_PREPARE_PERSISTENT, &q->st[i], NULL) !=
        SQLITE_OK) {
      rc = spn_error_set(err, SPN_EINTERNAL, "job queue %s: preparing statement %d: %s", cfg->path,
                         i, sqlite3_errmsg(q->db));
      goto out_free;
    }
  }
  q->backoff_base_ms = cfg->backoff_base_ms ? cfg->backoff_base_ms : 1000;
  q->backoff_max_ms = cfg->backoff_max_ms ? cfg->backoff_max_ms : 60000;
  q->rng = cfg->seed ? cfg->seed
                     : ((uint64_t)spn__now_ms() << 16) ^ (uint64_t)getpid() ^ 0x9E3779B97F4A7C15ULL;
  if (strcmp(cfg->path, ":memory:") != 0) {
    if (!(q->path = strdup(cfg->path))) {
      rc = spn_error_set(err, SPN_ENOMEM, "job queue: out of memory");
      goto out_free;
    }
    sqlite3_exec(q->db, "PRAGMA wal_autocheckpoint=0;", NULL, NULL, NULL);
    if (pthread_create(&q->ckpt_th, NULL, ckpt_main, q) == 0)
      q->ckpt_started = true;
    else
      sqlite3_exec(q->db, "PRAGMA wal_autocheckpoint=1000;", NULL, NULL, NULL);
  }
  out->ops = &sqlite_ops;
  out->impl = q;
  return SPN_OK;
out_free:
  sq_free(q);
  return rc;
}

bool spn__queue_unserved(const spn_queue_t *q, const char *pipeline, int64_t now, int64_t *at) {
  int64_t t = 0;
  bool none = q->ops->seen(q->impl, pipeline, &t, NULL) == SPN_OK && now - t > SPN_PRESENCE_STALE_MS;
  if (at)
    *at = t;
  return none;
}

void spn_queue_free(spn_queue_t *q) {
  if (q && q->ops) {
    q->ops->free(q->impl);
    q->ops = NULL;
    q->impl = NULL;
  }
}

static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s ? *s : 0x2545F4914F6CDD1DULL;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *s = x;
  return x;
}

int32_t spn_queue_open(const spn_queue_config_t *cfg, spn_queue_t *out, spn_error_t *err) {
  if (!cfg->backend || !strcmp(cfg->backend, "sqlite"))
    return spn_queue_sqlite_open(cfg, out, err);
  if (!strcmp(cfg->backend, "redis"))
    return spn_queue_redis_open(cfg, out, err);
  return spn_error_set(err, SPN_ECONFIG, "queue backend \"%s\": expected \"sqlite\" or \"redis\"",
                       cfg->backend);
}

int64_t spn__backoff_ms(uint32_t base_ms, uint32_t max_ms, uint32_t attempt, uint64_t *rng) {
  uint64_t d = base_ms;
  for (uint32_t i = 1; i < attempt && d < max_ms; i++)
    d *= 2;
  if (d > max_ms)
    d = max_ms;
  uint64_t half = d / 2;
  return (int64_t)(d - half + (half ? xorshift(rng) % (half + 1) : 0));
}

void spn__queue_job_clear(spn_queue_job_t *j) {
  free(j->spec_json);
  free(j->idem_key);
  free(j->lease_owner);
  free(j->reason);
  free(j->errors_json);
  free(j->warnings_json);
  memset(j, 0, sizeof *j);
}

