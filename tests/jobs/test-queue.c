/* test-queue.c — the durable job queue through its vtable, on both backends
 * (SQLite, and Redis on a redis-server this test starts on a free loopback
 * port with appendonly on): priorities, FIFO, idempotency keys, leases and
 * their expiry, backoff, dead-lettering, deadlines, cancel, transitions and
 * durability. Time is passed explicitly, so every expectation is computed
 * from the inputs — except Redis lease expiry, which is pending-entry idle
 * time on the server's clock and is tested with real (short) waits.
 * On Redis, every case ends by checking the waiting mirror KEDA scales on:
 * the lag of group "spindle" on P waiting equals the number of queued jobs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>
#include <sqlite3.h>

#include "jobs-internal.h"
#include "observe.h"
#include "redis-fixture.h"
#include "sqlite-files.h"

#define T0 1700000000000LL
#define SPEC "{\"pipeline\":\"copy\"}"
/* with outputs: a publication marker to track once it succeeds */
#define SPEC_OUT "{\"pipeline\":\"copy\",\"outputs\":{\"out\":\"/nowhere/x\"}}"

typedef struct fx {
  spn_queue_t q;
  const spn_queue_ops_t *o;
  server_t *srv;
  char prefix[32];
} fx_t;

static int setup_sqlite(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  spn_queue_config_t c = {.path = ":memory:", .backoff_base_ms = 1000, .backoff_max_ms = 8000, .seed = 42};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_queue_sqlite_open(&c, &f->q, &err), SPN_OK);
  f->o = f->q.ops;
  *state = f;
  return 0;
}

static int open_redis(fx_t *f, uint32_t lease_ms, spn_queue_t *q) {
  spn_queue_config_t c = {.backend = "redis", .url = f->srv->url, .prefix = f->prefix, .lease_ms = lease_ms,
                          .backoff_base_ms = 1000, .backoff_max_ms = 8000, .seed = 42};
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_queue_open(&c, q, &err);
  if (rc < 0)
    fprintf(stderr, "%s\n", err.msg);
  return rc;
}

static int setup_redis(void **state) {
  server_t *srv = *state;
  if (!srv || !srv->pid)
    return -1; /* no redis-server: the group was skipped */
  fx_t *f = calloc(1, sizeof *f);
  f->srv = srv;
  snprintf(f->prefix, sizeof f->prefix, "t%d:", ++srv->n);
  assert_int_equal(open_redis(f, 300, &f->q), SPN_OK);
  f->o = f->q.ops;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  server_t *srv = f->srv;
  spn_queue_free(&f->q);
  free(f);
  *state = srv;
  return 0;
}

/* Submit a new job of spec (not an idempotent repeat); its id. */
static int64_t submit_spec(fx_t *f, const char *spec, int32_t prio, const char *key, int64_t deadline,
                           uint32_t max_att, int64_t now) {
  spn_queue_submit_t s = {.spec_json = spec, .priority = prio, .idem_key = key,
                          .deadline_ms = deadline, .max_attempts = max_att};
  int64_t id = 0;
  bool existed = true;
  assert_int_equal(f->o->submit(f->q.impl, &s, now, &id, &existed, NULL), SPN_OK);
  assert_false(existed);
  return id;
}

static int64_t submit(fx_t *f, int32_t prio, const char *key, int64_t deadline, uint32_t max_att,
                      int64_t now) {
  return submit_spec(f, SPEC, prio, key, deadline, max_att, now);
}

/* Lease and return the id (0 when none is ready). */
static int64_t lease(fx_t *f, const char *owner, int64_t now, uint32_t *attempt) {
  spn_queue_job_t j;
  int32_t rc = f->o->lease(f->q.impl, owner, NULL, now, 1000, &j, NULL);
  if (rc == SPN_EAGAIN)
    return 0;
  assert_int_equal(rc, SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_RUNNING);
  assert_string_equal(j.lease_owner, owner);
  int64_t id = j.id;
  if (attempt)
    *attempt = j.attempts;
  spn__queue_job_clear(&j);
  return id;
}

static spn_queue_state_t state_of(fx_t *f, int64_t id) {
  spn_queue_job_t j;
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  spn_queue_state_t s = j.state;
  spn__queue_job_clear(&j);
  return s;
}

static int64_t queued(fx_t *f) {
  int64_t cnt[SPN_QSTATE_COUNT];
  assert_int_equal(f->o->counts(f->q.impl, cnt, NULL), SPN_OK);
  return cnt[SPN_QSTATE_QUEUED];
}

/* The mirror holds `want` tokens and that is the number of queued jobs. */
static void assert_waiting(fx_t *f, int64_t want) {
  assert_int_equal(queued(f), want);
  assert_int_equal(waiting_lag(f->srv, f->prefix), want);
}

/* Every Redis case leaves the waiting mirror equal to its queued jobs. */
static int teardown_redis(void **state) {
  fx_t *f = *state;
  bool ok = waiting_mirror_ok(f->srv, f->prefix, &f->q);
  teardown(state);
  return ok ? 0 : -1;
}

static void test_priorities_then_fifo(void **state) {
  fx_t *f = *state;
  int64_t a = submit(f, 0, NULL, 0, 1, T0);
  int64_t b = submit(f, 5, NULL, 0, 1, T0 + 1);
  int64_t c = submit(f, 0, NULL, 0, 1, T0 + 2);
  int64_t d = submit(f, -1, NULL, 0, 1, T0 + 3);
  int64_t e = submit(f, 5, NULL, 0, 1, T0 + 4);
  int64_t want[] = {b, e, a, c, d};
  for (size_t i = 0; i < 5; i++)
    assert_int_equal(lease(f, "w", T0 + 10, NULL), want[i]);
  assert_int_equal(lease(f, "w", T0 + 10, NULL), 0);
}

static void test_fifo_many(void **state) {
  fx_t *f = *state;
  int64_t ids[50];
  for (int i = 0; i < 50; i++)
    ids[i] = submit(f, 3, NULL, 0, 1, T0 + i);
  for (int i = 0; i < 50; i++)
    assert_int_equal(lease(f, "w", T0 + 100, NULL), ids[i]);
}

static void test_idempotency(void **state) {
  fx_t *f = *state;
  int64_t a = submit(f, 0, "k1", 0, 1, T0);
  spn_queue_submit_t s = {.spec_json = SPEC, .idem_key = "k1", .max_attempts = 1};
  int64_t id = 0;
  bool existed = false;
  /* Within 24 h: the same job. */
  assert_int_equal(f->o->submit(f->q.impl, &s, T0 + 23LL * 3600 * 1000, &id, &existed, NULL), SPN_OK);
  assert_true(existed);
  assert_int_equal(id, a);
  /* Another key: another job. */
  int64_t b = submit(f, 0, "k2", 0, 1, T0 + 5);
  assert_int_not_equal(a, b);
  /* After 24 h the key names a new job. */
  assert_int_equal(f->o->submit(f->q.impl, &s, T0 + 24LL * 3600 * 1000 + 1, &id, &existed, NULL), SPN_OK);
  assert_false(existed);
  assert_true(id != a && id != b);
}

static void test_lease_expiry_and_renew(void **state) {
  fx_t *f = *state;
  int64_t id = submit(f, 0, NULL, 0, 3, T0);
  uint32_t att;
  assert_int_equal(lease(f, "w1", T0, &att), id); /* lease until T0+1000 */
  assert_int_equal(att, 1);
  assert_int_equal(f->o->sweep(f->q.impl, T0 + 500, NULL, NULL, NULL), 0);
  assert_int_equal(f->o->renew(f->q.impl, id, 1, "w1", T0 + 900, 1000, NULL), SPN_OK);
  /* Someone else's renew changes nothing. */
  assert_int_equal(f->o->renew(f->q.impl, id, 1, "w2", T0 + 900, 1000, NULL), SPN_ESTATE);
  assert_int_equal(f->o->sweep(f->q.impl, T0 + 1500, NULL, NULL, NULL), 0);
  assert_int_equal(state_of(f, id), SPN_QSTATE_RUNNING);
  assert_int_equal(f->o->sweep(f->q.impl, T0 + 2000, NULL, NULL, NULL), 1);
  spn_queue_job_t j;
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_QUEUED);
  assert_null(j.lease_owner);
  /* first retry: backoff in [base/2, base] */
  assert_true(j.not_before_ms >= T0 + 2000 + 500 && j.not_before_ms <= T0 + 2000 + 1000);
  cJSON *errs = cJSON_Parse(j.errors_json);
  assert_int_equal(cJSON_GetArraySize(errs), 1);
  assert_non_null(strstr(cJSON_GetObjectItem(cJSON_GetArrayItem(errs, 0), "error")->valuestring, "lease expired"));
  cJSON_Delete(errs);
  int64_t nb = j.not_before_ms;
  spn__queue_job_clear(&j);
  /* The old holder's completion is stale now. */
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "w1", 1, 0, NULL, NULL, T0 + 2001, NULL), SPN_ESTATE);
  /* Not leasable before its backoff, leasable after, as attempt 2. */
  assert_int_equal(lease(f, "w2", nb - 1, NULL), 0);
  assert_int_equal(lease(f, "w2", nb, &att), id);
  assert_int_equal(att, 2);
  /* A stale completion records none of its warnings; the holder's are the job's. */
  const char *wn = "[\"faces: model \\\"x\\\" not found; using the built-in Haar cascade\"]";
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "w2", 1, 0, NULL, "[\"stale\"]", nb + 1, NULL), SPN_ESTATE);
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  assert_null(j.warnings_json);
  spn__queue_job_clear(&j);
  assert_int_equal(f->o->complete(f->q.impl, id, 2, "w2", 1.5, 0.25, NULL, wn, nb + 1, NULL), SPN_OK);
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_SUCCEEDED);
  assert_string_equal(j.warnings_json, wn);
  assert_true(j.compute_s == 1.5 && j.gpu_s == 0.25);
  assert_int_equal(j.t_state_ms[SPN_QSTATE_QUEUED], T0 + 2000);
  assert_int_equal(j.t_state_ms[SPN_QSTATE_RUNNING], nb);
  assert_int_equal(j.t_state_ms[SPN_QSTATE_SUCCEEDED], nb + 1);
  spn__queue_job_clear(&j);
}

static void test_backoff_bounds(void **state) {
  (void)state;
  uint64_t rng = 7;
  for (uint32_t att = 1; att <= 10; att++) {
    int64_t d = 100LL << (att - 1);
    if (d > 3000)
      d = 3000;
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < 2000; i++) {
      int64_t b = spn__backoff_ms(100, 3000, att, &rng);
      assert_true(b >= d - d / 2 && b <= d);
      lo = b < lo ? b : lo;
      hi = b > hi ? b : hi;
    }
    /* Jitter really spreads retries. */
    assert_true(hi - lo >= d / 4);
  }
}

static void test_dead_letter(void **state) {
  fx_t *f = *state;
  int64_t id = submit(f, 0, NULL, 0, 3, T0);
  int64_t now = T0;
  const char *reasons[] = {"boom 1", "boom 2", "boom 3"};
  for (int i = 0; i < 3; i++) {
    uint32_t att;
    now += 100000; /* past any backoff (max 8 s) */
    assert_int_equal(lease(f, "w", now, &att), id);
    assert_int_equal(att, (uint32_t)i + 1);
    spn_queue_state_t st;
    assert_int_equal((f->o->fail)(f->q.impl, id, att, "w", reasons[i], SPN_FAIL_RETRY, 0.5, 0, NULL, now, &st, NULL), SPN_OK);
    assert_int_equal(st, i < 2 ? SPN_QSTATE_QUEUED : SPN_QSTATE_DEAD);
  }
  spn_queue_job_t j;
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_DEAD);
  assert_string_equal(j.reason, "boom 3");
  assert_true(j.compute_s == 1.5);
  cJSON *errs = cJSON_Parse(j.errors_json);
  assert_int_equal(cJSON_GetArraySize(errs), 3);
  for (int i = 0; i < 3; i++) {
    cJSON *e = cJSON_GetArrayItem(errs, i);
    assert_int_equal((int)cJSON_GetObjectItem(e, "attempt")->valuedouble, i + 1);
    assert_string_equal(cJSON_GetObjectItem(e, "error")->valuestring, reasons[i]);
  }
  cJSON_Delete(errs);
  spn__queue_job_clear(&j);
  assert_int_equal(lease(f, "w", now + 1000000, NULL), 0);
  /* A single-attempt job that fails is "failed", not "dead". */
  int64_t one = submit(f, 0, NULL, 0, 1, now);
  uint32_t att;
  assert_int_equal(lease(f, "w", now, &att), one);
  spn_queue_state_t st;
  assert_int_equal((f->o->fail)(f->q.impl, one, att, "w", "nope", SPN_FAIL_RETRY, 0, 0, NULL, now, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_FAILED);
  /* A failure no retry can mend (the job's media) ends the job "failed" at
   * its first attempt of three, with its error kept; a plain one retries. */
  int64_t bad = submit(f, 0, NULL, 0, 3, now);
  assert_int_equal(lease(f, "w", now, &att), bad);
  assert_int_equal((f->o->fail)(f->q.impl, bad, att, "w", "in.mp4: invalid data", SPN_FAIL_FINAL, 0, 0, NULL, now,
                                &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_FAILED);
  assert_int_equal((f->o->get)(f->q.impl, bad, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_FAILED);
  assert_int_equal(j.attempts, 1);
  assert_non_null(strstr(j.reason, "in.mp4: invalid data"));
  spn__queue_job_clear(&j);
  assert_int_equal(lease(f, "w", now + 1000000, NULL), 0);
  int64_t flaky = submit(f, 0, NULL, 0, 3, now);
  assert_int_equal(lease(f, "w", now, &att), flaky);
  assert_int_equal((f->o->fail)(f->q.impl, flaky, att, "w", "disk", SPN_FAIL_RETRY, 0, 0, NULL, now, &st, NULL),
                   SPN_OK);
  assert_int_equal(st, SPN_QSTATE_QUEUED);
}

typedef struct seen {
  int n;
  int64_t id[8];
  spn_queue_state_t st[8];
} seen_t;

static void seen_cb(void *user, int64_t id, spn_queue_state_t st) {
  seen_t *s = user;
  if (s->n < 8) {
    s->id[s->n] = id;
    s->st[s->n] = st;
  }
  s->n++;
}

static void test_deadline(void **state) {
  fx_t *f = *state;
  int64_t late = submit(f, 9, NULL, T0 + 1000, 3, T0);
  int64_t fine = submit(f, 0, NULL, 0, 3, T0);
  seen_t s = {0};
  assert_int_equal(f->o->sweep(f->q.impl, T0 + 999, seen_cb, &s, NULL), 0);
  /* Past the deadline it is never leased, even with the higher priority. */
  assert_int_equal(lease(f, "w", T0 + 1001, NULL), fine);
  assert_int_equal(f->o->sweep(f->q.impl, T0 + 1001, seen_cb, &s, NULL), 1);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.id[0], late);
  assert_int_equal(s.st[0], SPN_QSTATE_FAILED);
  spn_queue_job_t j;
  assert_int_equal(f->o->get(f->q.impl, late, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_FAILED);
  assert_non_null(strstr(j.reason, "deadline"));
  assert_int_equal(j.t_state_ms[SPN_QSTATE_FAILED], T0 + 1001);
  spn__queue_job_clear(&j);
}

static void test_cancel(void **state) {
  fx_t *f = *state;
  int64_t q = submit(f, 0, NULL, 0, 3, T0);
  int64_t r = submit(f, 0, NULL, 0, 3, T0);
  spn_queue_state_t st;
  /* Queued: cancelled at once and never leased. */
  assert_int_equal(f->o->cancel(f->q.impl, q, T0 + 1, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  uint32_t att;
  assert_int_equal(lease(f, "w", T0 + 2, &att), r);
  /* Running: a request; the worker's report then ends it cancelled, even if
   * it reports a plain failure (no retry after a cancel). */
  assert_int_equal(f->o->cancel(f->q.impl, r, T0 + 3, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_RUNNING);
  assert_int_equal(state_of(f, r), SPN_QSTATE_RUNNING);
  assert_int_equal((f->o->fail)(f->q.impl, r, att, "w", "stopped", SPN_FAIL_RETRY, 0, 0, NULL, T0 + 4, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  /* Terminal: refused. */
  assert_int_equal(f->o->cancel(f->q.impl, r, T0 + 5, &st, NULL), SPN_ESTATE);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  assert_int_equal(f->o->cancel(f->q.impl, 999, T0 + 5, &st, NULL), SPN_ENOENT);
  assert_int_equal(lease(f, "w", T0 + 100000, NULL), 0);
  submit(f, 0, NULL, 0, 3, T0 + 6);
  int64_t cnt[SPN_QSTATE_COUNT];
  assert_int_equal(f->o->counts(f->q.impl, cnt, NULL), SPN_OK);
  int64_t want[SPN_QSTATE_COUNT] = {[SPN_QSTATE_QUEUED] = 1, [SPN_QSTATE_CANCELLED] = 2};
  assert_memory_equal(cnt, want, sizeof want);
}

static void test_release_keeps_attempts(void **state) {
  fx_t *f = *state;
  int64_t id = submit(f, 0, NULL, 0, 1, T0);
  uint32_t att;
  assert_int_equal(lease(f, "g", T0, &att), id);
  assert_int_equal(f->o->release(f->q.impl, id, att, "other", "x", T0 + 1, NULL), SPN_ESTATE);
  assert_int_equal(f->o->release(f->q.impl, id, att, "g", "gateway shut down", T0 + 1, NULL), SPN_OK);
  assert_int_equal(state_of(f, id), SPN_QSTATE_QUEUED);
  /* leasable at once, and still as attempt 1 of 1 */
  assert_int_equal(lease(f, "g2", T0 + 2, &att), id);
  assert_int_equal(att, 1);
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "g2", 0, 0, NULL, NULL, T0 + 3, NULL), SPN_OK);
}

static void test_release_owner(void **state) {
  fx_t *f = *state;
  int64_t a = submit(f, 0, NULL, 0, 3, T0);
  int64_t b = submit(f, 0, NULL, 0, 3, T0);
  assert_int_equal(lease(f, "A", T0, NULL), a);
  assert_int_equal(lease(f, "B", T0, NULL), b);
  seen_t s = {0};
  assert_int_equal(f->o->release_owner(f->q.impl, "A", "worker A lost", T0 + 10, seen_cb, &s, NULL), 1);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.id[0], a);
  assert_int_equal(state_of(f, a), SPN_QSTATE_QUEUED);
  assert_int_equal(state_of(f, b), SPN_QSTATE_RUNNING);
}

static void test_group_commit_and_durability(void **state) {
  (void)state;
  char path[] = "/tmp/spn-queue-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  spn_queue_config_t c = {.path = path, .seed = 1};
  spn_queue_t q;
  assert_int_equal(spn_queue_sqlite_open(&c, &q, NULL), SPN_OK);
  assert_int_equal(q.ops->begin(q.impl, NULL), SPN_OK);
  int64_t ids[100];
  for (int i = 0; i < 100; i++) {
    spn_queue_submit_t s = {.spec_json = SPEC, .priority = i % 3, .max_attempts = 2};
    bool ex;
    assert_int_equal(q.ops->submit(q.impl, &s, T0 + i, &ids[i], &ex, NULL), SPN_OK);
  }
  assert_int_equal(q.ops->commit(q.impl, NULL), SPN_OK);
  spn_queue_free(&q);
  assert_int_equal(spn_queue_sqlite_open(&c, &q, NULL), SPN_OK);
  spn_queue_job_t j;
  for (int i = 0; i < 100; i++) {
    assert_int_equal(q.ops->get(q.impl, ids[i], &j, NULL), SPN_OK);
    assert_int_equal(j.priority, i % 3);
    assert_int_equal(j.state, SPN_QSTATE_QUEUED);
    assert_int_equal(j.t_state_ms[SPN_QSTATE_QUEUED], T0 + i);
    spn__queue_job_clear(&j);
  }
  spn_queue_free(&q);
  remove_sqlite_files(path);
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Redis: a lease is a pending entry; it expires when it stays idle (not
 * renewed) for the configured lease (300 ms here), on the server's clock. */
static void test_redis_lease_expiry_and_renew(void **state) {
  fx_t *f = *state;
  int64_t id = submit(f, 0, NULL, 0, 3, wall_ms());
  uint32_t att;
  assert_int_equal(lease(f, "w1", wall_ms(), &att), id);
  assert_int_equal(att, 1);
  assert_int_equal(f->o->sweep(f->q.impl, wall_ms(), NULL, NULL, NULL), 0);
  usleep(200000);
  assert_int_equal(f->o->renew(f->q.impl, id, 1, "w1", wall_ms(), 300, NULL), SPN_OK);
  assert_int_equal(f->o->renew(f->q.impl, id, 1, "w2", wall_ms(), 300, NULL), SPN_ESTATE);
  usleep(200000); /* 400 ms after the lease, 200 ms after the renew */
  assert_int_equal(f->o->sweep(f->q.impl, wall_ms(), NULL, NULL, NULL), 0);
  assert_int_equal(state_of(f, id), SPN_QSTATE_RUNNING);
  usleep(350000);
  int64_t now = wall_ms();
  seen_t s = {0};
  assert_int_equal(f->o->sweep(f->q.impl, now, seen_cb, &s, NULL), 1);
  assert_int_equal(s.id[0], id);
  assert_int_equal(s.st[0], SPN_QSTATE_QUEUED);
  spn_queue_job_t j;
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_QUEUED);
  assert_null(j.lease_owner);
  assert_true(j.not_before_ms >= now + 500 && j.not_before_ms <= now + 1000);
  cJSON *errs = cJSON_Parse(j.errors_json);
  assert_int_equal(cJSON_GetArraySize(errs), 1);
  assert_non_null(strstr(cJSON_GetObjectItem(cJSON_GetArrayItem(errs, 0), "error")->valuestring, "lease expired"));
  cJSON_Delete(errs);
  int64_t nb = j.not_before_ms;
  spn__queue_job_clear(&j);
  /* A second sweep finds nothing: the expired entry was acknowledged. */
  assert_int_equal(f->o->sweep(f->q.impl, now + 1, NULL, NULL, NULL), 0);
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "w1", 1, 0, NULL, NULL, now + 1, NULL), SPN_ESTATE);
  assert_int_equal(lease(f, "w2", nb - 1, NULL), 0);
  assert_int_equal(lease(f, "w2", nb, &att), id);
  assert_int_equal(att, 2);
  assert_int_equal(f->o->complete(f->q.impl, id, 2, "w2", 1.5, 0.25, NULL, NULL, nb + 1, NULL), SPN_OK);
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_SUCCEEDED);
  assert_true(j.compute_s == 1.5 && j.gpu_s == 0.25);
  assert_int_equal(j.t_state_ms[SPN_QSTATE_SUCCEEDED], nb + 1);
  spn__queue_job_clear(&j);
  /* A job with outputs whose publication marker was never confirmed
   * removed: a sweep one lease later hands it out (once) so the sweeper
   * removes the marker. Without outputs there is no marker to track. */
  int64_t id1 = submit_spec(f, SPEC_OUT, 0, NULL, 0, 1, nb);
  assert_int_equal(lease(f, "w3", nb, &att), id1);
  assert_int_equal(f->o->complete(f->q.impl, id1, att, "w3", 0, 0, NULL, NULL, nb + 1, NULL), SPN_OK);
  s = (seen_t){0};
  assert_int_equal(f->o->sweep(f->q.impl, nb + 100, seen_cb, &s, NULL), 0);
  assert_int_equal(f->o->sweep(f->q.impl, nb + 400, seen_cb, &s, NULL), 1);
  assert_int_equal(s.id[0], id1);
  assert_int_equal(s.st[0], SPN_QSTATE_SUCCEEDED);
  assert_int_equal(f->o->sweep(f->q.impl, nb + 500, NULL, NULL, NULL), 0);
  /* Confirmed at once: never handed out. */
  int64_t id2 = submit_spec(f, SPEC_OUT, 0, NULL, 0, 1, nb);
  assert_int_equal(lease(f, "w3", nb, &att), id2);
  assert_int_equal(f->o->complete(f->q.impl, id2, att, "w3", 0, 0, NULL, NULL, nb + 1, NULL), SPN_OK);
  assert_int_equal(f->o->unpublished(f->q.impl, id2, NULL), SPN_OK);
  assert_int_equal(f->o->sweep(f->q.impl, nb + 1000, NULL, NULL, NULL), 0);
}

/* Two handles on one Redis (two gateways, or a gateway and a worker): each
 * job is leased once, a job is readable from the other handle, and jobs
 * survive a reconnect. */
static void test_redis_shared_by_two_clients(void **state) {
  fx_t *f = *state;
  spn_queue_t q2;
  assert_int_equal(open_redis(f, 300, &q2), SPN_OK);
  int64_t ids[20];
  for (int i = 0; i < 20; i++)
    ids[i] = submit(f, 0, NULL, 0, 1, T0 + i);
  bool seen[20] = {0};
  for (int i = 0; i < 20; i++) {
    spn_queue_job_t j;
    spn_queue_t *q = i % 2 ? &q2 : &f->q;
    assert_int_equal(q->ops->lease(q->impl, i % 2 ? "B" : "A", NULL, T0 + 100, 1000, &j, NULL), SPN_OK);
    assert_true(j.id >= ids[0] && j.id <= ids[19]);
    assert_false(seen[j.id - ids[0]]);
    seen[j.id - ids[0]] = true;
    spn__queue_job_clear(&j);
  }
  spn_queue_job_t j;
  assert_int_equal(q2.ops->lease(q2.impl, "B", NULL, T0 + 100, 1000, &j, NULL), SPN_EAGAIN);
  assert_int_equal(q2.ops->progress(q2.impl, ids[3], 7, 9, NULL), SPN_OK);
  assert_int_equal(f->o->get(f->q.impl, ids[3], &j, NULL), SPN_OK);
  assert_int_equal(j.progress_done, 7);
  assert_int_equal(j.progress_total, 9);
  spn__queue_job_clear(&j);
  spn_queue_free(&q2);
  /* reconnect: same jobs */
  spn_queue_free(&f->q);
  assert_int_equal(open_redis(f, 300, &f->q), SPN_OK);
  f->o = f->q.ops;
  assert_int_equal(state_of(f, ids[0]), SPN_QSTATE_RUNNING);
  int64_t cnt[SPN_QSTATE_COUNT];
  assert_int_equal(f->o->counts(f->q.impl, cnt, NULL), SPN_OK);
  assert_int_equal(cnt[SPN_QSTATE_RUNNING], 20);
}

/* A group commit (begin ... commit) of many submissions: every one is
 * stored, ids are unique, and leases come in submission order (Redis
 * pipelines them and takes ids from reserved blocks). */
static void test_batch_submit_order(void **state) {
  fx_t *f = *state;
  int64_t ids[600];
  assert_int_equal(f->o->begin(f->q.impl, NULL), SPN_OK);
  for (int i = 0; i < 600; i++) {
    spn_queue_submit_t s = {.spec_json = SPEC, .priority = i % 2, .max_attempts = 1};
    bool ex = true;
    assert_int_equal(f->o->submit(f->q.impl, &s, T0 + i, &ids[i], &ex, NULL), SPN_OK);
    assert_false(ex);
    for (int k = 0; k < i; k++)
      assert_int_not_equal(ids[k], ids[i]);
  }
  assert_int_equal(f->o->commit(f->q.impl, NULL), SPN_OK);
  /* priority 1 (odd i) first, each band in submission order */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 1 - pass; i < 600; i += 2)
      assert_int_equal(lease(f, "w", T0 + 1000, NULL), ids[i]);
  assert_int_equal(lease(f, "w", T0 + 1000, NULL), 0);
}

/* Submit `spec` with its files checked (spn_queue_submit_t.clash): the id,
 * or 0 with *c filled when it clashes (then nothing is stored: the number
 * of queued jobs is unchanged). */
static int64_t submit_checked(fx_t *f, const char *spec, const char *key, int64_t now, spn_queue_clash_t *c) {
  int64_t before[SPN_QSTATE_COUNT], after[SPN_QSTATE_COUNT];
  assert_int_equal(f->o->counts(f->q.impl, before, NULL), SPN_OK);
  spn_queue_submit_t s = {.spec_json = spec, .idem_key = key, .max_attempts = 1, .clash = c};
  int64_t id = -1;
  bool ex = false;
  memset(c, 0, sizeof *c);
  int32_t rc = f->o->submit(f->q.impl, &s, now, &id, &ex, NULL);
  if (rc == SPN_EBUSY) {
    assert_int_equal(f->o->counts(f->q.impl, after, NULL), SPN_OK);
    assert_int_equal(after[SPN_QSTATE_QUEUED], before[SPN_QSTATE_QUEUED]);
    return 0;
  }
  assert_int_equal(rc, SPN_OK);
  assert_true(id > 0);
  return id;
}

static void assert_clash(const spn_queue_clash_t *c, spn_clash_kind_t kind, const char *path, int64_t job,
                         spn_queue_state_t state, bool stopping) {
  assert_int_equal(c->kind, kind);
  assert_string_equal(c->path, path);
  assert_int_equal(c->job, job);
  assert_int_equal(c->state, state);
  assert_int_equal(c->stopping, stopping);
}

/* A job's files against those of the jobs queued or running, checked in the
 * write that stores it (what the gateway refuses a SUBMIT on): an output
 * that is another's output or input, an input that is another's output;
 * running and cancel-requested holders too; an ended job holds nothing; a
 * keyed repeat is its job, unchecked; a segment is neither checked nor
 * recorded; a submission pipelined in a batch is seen by the next one. */
static void test_file_clashes(void **state) {
  fx_t *f = *state;
  spn_queue_clash_t c;
  const char *xy = "{\"pipeline\":\"p\",\"outputs\":{\"a\":\"/o/x\",\"b\":\"/o/y\"}}";
  const char *x = "{\"pipeline\":\"p\",\"outputs\":{\"v\":\"/o/x\"}}";
  int64_t a = submit_checked(f, xy, NULL, T0, &c);
  assert_int_equal(submit_checked(f, x, NULL, T0 + 1, &c), 0);
  assert_clash(&c, SPN_CLASH_OUTPUT, "/o/x", a, SPN_QSTATE_QUEUED, false);
  /* another path, and a prefix of one, are free */
  assert_true(submit_checked(f, "{\"pipeline\":\"p\",\"outputs\":{\"v\":\"/o/z\"}}", NULL, T0 + 2, &c) > 0);
  assert_true(submit_checked(f, "{\"pipeline\":\"p\",\"outputs\":{\"v\":\"/o\"}}", NULL, T0 + 2, &c) > 0);
  /* an input that is a's output */
  assert_int_equal(submit_checked(f, "{\"pipeline\":\"p\",\"inputs\":{\"i\":\"/o/y\"}}", NULL, T0 + 3, &c), 0);
  assert_clash(&c, SPN_CLASH_INPUT, "/o/y", a, SPN_QSTATE_QUEUED, false);
  /* an output that is d's input; two readers of one file are fine */
  const char *rd = "{\"pipeline\":\"p\",\"inputs\":{\"i\":\"/i/x\"}}";
  int64_t d = submit_checked(f, rd, NULL, T0 + 4, &c);
  int64_t d2 = submit_checked(f, rd, NULL, T0 + 4, &c);
  assert_true(d > 0 && d2 > 0);
  assert_int_equal(submit_checked(f, "{\"pipeline\":\"p\",\"outputs\":{\"o\":\"/i/x\"}}", NULL, T0 + 5, &c), 0);
  assert_int_equal(c.kind, SPN_CLASH_READ);
  assert_true(c.job == d || c.job == d2);
  /* a runs, then is asked to stop: it still holds its files */
  uint32_t att = 0;
  assert_int_equal(lease(f, "w", T0 + 6, &att), a);
  assert_int_equal(submit_checked(f, x, NULL, T0 + 7, &c), 0);
  assert_clash(&c, SPN_CLASH_OUTPUT, "/o/x", a, SPN_QSTATE_RUNNING, false);
  spn_queue_state_t st;
  assert_int_equal(f->o->cancel(f->q.impl, a, T0 + 8, &st, NULL), SPN_OK);
  assert_int_equal(submit_checked(f, x, NULL, T0 + 9, &c), 0);
  assert_clash(&c, SPN_CLASH_OUTPUT, "/o/x", a, SPN_QSTATE_RUNNING, true);
  /* a has stopped: its files are free, and the next job takes /o/x over */
  assert_int_equal((f->o->fail)(f->q.impl, a, att, "w", "cancelled", SPN_FAIL_CANCELLED, 0, 0, NULL, T0 + 10, &st,
                              NULL), SPN_OK);
  int64_t b = submit_checked(f, x, NULL, T0 + 11, &c);
  assert_true(b > 0);
  assert_true(submit_checked(f, "{\"pipeline\":\"p\",\"inputs\":{\"i\":\"/o/y\"}}", NULL, T0 + 12, &c) > 0);
  assert_int_equal(submit_checked(f, xy, NULL, T0 + 13, &c), 0);
  assert_clash(&c, SPN_CLASH_OUTPUT, "/o/x", b, SPN_QSTATE_QUEUED, false);
  /* the readers of /i/x end (one cancelled while queued, one succeeded) */
  assert_int_equal(f->o->cancel(f->q.impl, d, T0 + 14, &st, NULL), SPN_OK);
  assert_int_equal(submit_checked(f, "{\"pipeline\":\"p\",\"outputs\":{\"o\":\"/i/x\"}}", NULL, T0 + 15, &c), 0);
  assert_clash(&c, SPN_CLASH_READ, "/i/x", d2, SPN_QSTATE_QUEUED, false);
  assert_int_equal(f->o->cancel(f->q.impl, d2, T0 + 16, &st, NULL), SPN_OK);
  assert_true(submit_checked(f, "{\"pipeline\":\"p\",\"outputs\":{\"o\":\"/i/x\"}}", NULL, T0 + 17, &c) > 0);
  /* a keyed repeat is its job, not a clash with itself */
  const char *k = "{\"pipeline\":\"p\",\"outputs\":{\"o\":\"/k/x\"}}";
  int64_t kj = submit_checked(f, k, "k9", T0 + 18, &c);
  spn_queue_submit_t ks = {.spec_json = k, .idem_key = "k9", .max_attempts = 1, .clash = &c};
  int64_t id = 0;
  bool ex = false;
  assert_int_equal(f->o->submit(f->q.impl, &ks, T0 + 19, &id, &ex, NULL), SPN_OK);
  assert_true(ex);
  assert_int_equal(id, kj);
  /* a segment is neither checked nor recorded */
  spn_queue_submit_t seg = {.spec_json = k, .max_attempts = 1, .parent = kj, .seg_index = 0, .clash = &c};
  assert_int_equal(f->o->submit(f->q.impl, &seg, T0 + 20, &id, &ex, NULL), SPN_OK);
  const char *sg = "{\"pipeline\":\"p\",\"outputs\":{\"o\":\"/s/x\"},\"inputs\":{\"i\":\"/s/y\"}}";
  seg.spec_json = sg;
  assert_int_equal(f->o->submit(f->q.impl, &seg, T0 + 20, &id, &ex, NULL), SPN_OK);
  assert_true(submit_checked(f, "{\"pipeline\":\"p\",\"outputs\":{\"o\":\"/s/x\",\"p\":\"/s/y\"}}", NULL, T0 + 21,
                             &c) > 0);
  /* in a batch (pipelined on Redis), the next submission sees the last */
  const char *z = "{\"pipeline\":\"p\",\"outputs\":{\"a\":\"/b/z\"}}";
  assert_int_equal(f->o->begin(f->q.impl, NULL), SPN_OK);
  spn_queue_submit_t plain = {.spec_json = "{\"pipeline\":\"p\"}", .max_attempts = 1, .clash = &c};
  assert_int_equal(f->o->submit(f->q.impl, &plain, T0 + 22, &id, &ex, NULL), SPN_OK);
  int64_t z1 = submit_checked(f, z, NULL, T0 + 22, &c);
  assert_true(z1 > 0);
  assert_int_equal(submit_checked(f, z, NULL, T0 + 22, &c), 0);
  assert_clash(&c, SPN_CLASH_OUTPUT, "/b/z", z1, SPN_QSTATE_QUEUED, false);
  assert_int_equal(f->o->commit(f->q.impl, NULL), SPN_OK);
  /* unchecked (no clash asked for): stored, and takes the path over */
  int64_t u = submit_spec(f, z, 0, NULL, 0, 1, T0 + 23);
  assert_int_equal(submit_checked(f, z, NULL, T0 + 24, &c), 0);
  assert_clash(&c, SPN_CLASH_OUTPUT, "/b/z", u, SPN_QSTATE_QUEUED, false);
  /* a spec without files, or not JSON, is stored and fails nothing */
  assert_true(submit_checked(f, "{\"pipeline\":\"p\"}", NULL, T0 + 25, &c) > 0);
  assert_true(submit_checked(f, "not json", NULL, T0 + 25, &c) > 0);
}

static uint32_t purge(fx_t *f, int64_t before, uint32_t limit) {
  uint32_t n = 99;
  assert_int_equal(f->o->purge(f->q.impl, before, limit, &n, NULL), SPN_OK);
  return n;
}

static bool exists(fx_t *f, int64_t id) {
  spn_queue_job_t j;
  int32_t rc = f->o->get(f->q.impl, id, &j, NULL);
  if (rc == SPN_OK)
    spn__queue_job_clear(&j);
  else
    assert_int_equal(rc, SPN_ENOENT);
  return rc == SPN_OK;
}

/* Retention (ops.purge): the jobs that ended before the time given go,
 * oldest first, a batch at most, with their segments; queued and running
 * jobs stay, and so does an ended job whose segment still runs; a deleted
 * job's idempotency key and file records go with it (the key names a new
 * job at once); list and counts no longer see it. */
static void test_purge(void **state) {
  fx_t *f = *state;
  const spn_job_xfer_t *nx = NULL;
  spn_queue_state_t st;
  uint32_t att;
  const char *fa = "{\"pipeline\":\"p\",\"inputs\":{\"i\":\"/r/in\"},\"outputs\":{\"o\":\"/r/a\"}}";
  int64_t a = submit_spec(f, fa, 0, "ka", 0, 1, T0);
  int64_t b = submit(f, 0, NULL, 0, 1, T0);
  int64_t c = submit(f, 0, NULL, 0, 1, T0);
  int64_t d = submit(f, 0, NULL, 0, 1, T0);
  int64_t e = submit(f, 0, NULL, 0, 1, T0);
  assert_int_equal(lease(f, "w", T0 + 1, &att), a);
  assert_int_equal(f->o->complete(f->q.impl, a, att, "w", 0, 0, nx, NULL, T0 + 10, NULL), SPN_OK);
  if (f->o->unpublished)
    assert_int_equal(f->o->unpublished(f->q.impl, a, NULL), SPN_OK);
  assert_int_equal(lease(f, "w", T0 + 11, &att), b);
  assert_int_equal((f->o->fail)(f->q.impl, b, att, "w", "bad", SPN_FAIL_FINAL, 0, 0, nx, T0 + 20, &st, NULL),
                   SPN_OK);
  assert_int_equal(f->o->cancel(f->q.impl, c, T0 + 30, &st, NULL), SPN_OK);
  assert_int_equal(lease(f, "w", T0 + 31, &att), d); /* d runs, e waits */
  assert_int_equal(purge(f, T0 + 5, 10), 0);
  assert_int_equal(purge(f, T0 + 15, 10), 1);
  assert_false(exists(f, a));
  assert_true(exists(f, b) && exists(f, c) && exists(f, d) && exists(f, e));
  /* a's key now names nothing: the same request is a new job */
  spn_queue_submit_t ks = {.spec_json = fa, .idem_key = "ka", .max_attempts = 1};
  int64_t id = 0;
  bool ex = true;
  assert_int_equal(f->o->submit(f->q.impl, &ks, T0 + 40, &id, &ex, NULL), SPN_OK);
  assert_false(ex);
  assert_true(id != a);
  /* oldest first, at most `limit` a call; the live jobs stay */
  assert_int_equal(purge(f, T0 + 1000, 1), 1);
  assert_false(exists(f, b));
  assert_true(exists(f, c));
  assert_int_equal(purge(f, T0 + 1000, 10), 1);
  assert_false(exists(f, c));
  assert_int_equal(purge(f, T0 + 1000, 10), 0);
  assert_true(exists(f, d) && exists(f, e) && exists(f, id));
  int64_t cnt[SPN_QSTATE_COUNT];
  assert_int_equal(f->o->counts(f->q.impl, cnt, NULL), SPN_OK);
  assert_int_equal(cnt[SPN_QSTATE_QUEUED], 2);
  assert_int_equal(cnt[SPN_QSTATE_RUNNING], 1);
  assert_int_equal(cnt[SPN_QSTATE_SUCCEEDED] + cnt[SPN_QSTATE_FAILED] + cnt[SPN_QSTATE_CANCELLED], 0);
  /* a segmented job goes with its segments, once none of them runs */
  assert_int_equal(f->o->cancel(f->q.impl, e, T0 + 41, &st, NULL), SPN_OK);
  assert_int_equal(f->o->cancel(f->q.impl, id, T0 + 41, &st, NULL), SPN_OK);
  spn_queue_submit_t ps = {.spec_json = SPEC, .max_attempts = 1, .pending = 2};
  int64_t p = 0;
  assert_int_equal(f->o->submit(f->q.impl, &ps, T0 + 50, &p, &ex, NULL), SPN_OK);
  int64_t k[2];
  for (int i = 0; i < 2; i++) {
    spn_queue_submit_t ks2 = {.spec_json = SPEC, .max_attempts = 1, .parent = p, .seg_index = i};
    assert_int_equal(f->o->submit(f->q.impl, &ks2, T0 + 50, &k[i], &ex, NULL), SPN_OK);
  }
  uint32_t a0, a1;
  assert_int_equal(lease(f, "w", T0 + 51, &a0), k[0]);
  assert_int_equal(f->o->complete(f->q.impl, k[0], a0, "w", 0, 0, nx, NULL, T0 + 52, NULL), SPN_OK);
  if (f->o->unpublished)
    assert_int_equal(f->o->unpublished(f->q.impl, k[0], NULL), SPN_OK);
  assert_int_equal(lease(f, "w", T0 + 53, &a1), k[1]);
  /* the job is cancelled while segment 1 runs: it has ended, its segment not */
  assert_int_equal(f->o->cancel(f->q.impl, p, T0 + 54, &st, NULL), SPN_OK);
  assert_int_equal(state_of(f, p), SPN_QSTATE_CANCELLED);
  assert_int_equal(purge(f, T0 + 1000, 10), 2); /* e and id; p waits for its segment */
  assert_true(exists(f, p) && exists(f, k[0]) && exists(f, k[1]));
  assert_int_equal((f->o->fail)(f->q.impl, k[1], a1, "w", "cancelled", SPN_FAIL_CANCELLED, 0, 0, nx, T0 + 55, &st,
                                NULL), SPN_OK);
  assert_int_equal(purge(f, T0 + 1000, 10), 1);
  assert_false(exists(f, p) || exists(f, k[0]) || exists(f, k[1]));
  assert_int_equal(f->o->counts(f->q.impl, cnt, NULL), SPN_OK);
  int64_t all = 0;
  for (int s = 0; s < SPN_QSTATE_COUNT; s++)
    all += cnt[s];
  assert_int_equal(all, 1); /* d, still running */
}

/* Redis: jobs that ended before the queue kept P ended (a queue written by
 * an earlier version) are found too: the purge script adds them first. */
static void test_purge_old_queue(void **state) {
  fx_t *f = *state;
  uint32_t att;
  spn_queue_state_t st;
  int64_t ids[5];
  for (int i = 0; i < 5; i++)
    ids[i] = submit(f, 0, NULL, 0, 1, T0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(f->o->cancel(f->q.impl, ids[i], T0 + 10 + i, &st, NULL), SPN_OK);
  assert_int_equal(lease(f, "w", T0 + 20, &att), ids[4]);
  /* the fill had got past ids[0] when the queue was written (a cursor
   * left by an earlier pass): it goes on from there */
  freeReplyObject(redis_cmd(f->srv, "DEL %sended", f->prefix));
  freeReplyObject(redis_cmd(f->srv, "SET %sended_fill %lld", f->prefix, (long long)ids[0]));
  assert_int_equal(purge(f, T0 + 12, 10), 1); /* ids[1]; ids[0] was before the cursor */
  assert_true(exists(f, ids[0]) && !exists(f, ids[1]));
  /* from the start */
  freeReplyObject(redis_cmd(f->srv, "DEL %sended %sended_fill", f->prefix, f->prefix));
  assert_int_equal(purge(f, T0 + 12, 10), 1); /* ids[0], cancelled before T0 + 12 */
  assert_false(exists(f, ids[0]) || exists(f, ids[1]));
  assert_true(exists(f, ids[2]) && exists(f, ids[3]) && exists(f, ids[4]));
  assert_int_equal(purge(f, T0 + 100, 10), 2);
  assert_true(exists(f, ids[4]));
  redisReply *r = redis_cmd(f->srv, "GET %sended_fill", f->prefix);
  assert_true(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, "done"));
  freeReplyObject(r);
  /* a deleted job's records that name it go: its idempotency key, its
   * output's record, its place among its input's readers */
  const char *fa = "{\"pipeline\":\"p\",\"inputs\":{\"i\":\"/r/in\"},\"outputs\":{\"o\":\"/r/a\"}}";
  int64_t a = submit_spec(f, fa, 0, "ka", 0, 1, T0 + 200);
  assert_int_equal(f->o->cancel(f->q.impl, a, T0 + 201, &st, NULL), SPN_OK);
  assert_int_equal(purge(f, T0 + 300, 10), 1);
  r = redis_cmd(f->srv, "EXISTS %sidem:ka", f->prefix);
  assert_true(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
  freeReplyObject(r);
  r = redis_cmd(f->srv, "HEXISTS %soutputs /r/a", f->prefix);
  assert_true(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
  freeReplyObject(r);
  r = redis_cmd(f->srv, "SCARD %sreaders:/r/in", f->prefix);
  assert_true(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
  freeReplyObject(r);
}

/* A succeeded job's progress equals its total, also when it never reported
 * any (both backends). */
static void test_succeeded_progress_is_complete(void **state) {
  fx_t *f = *state;
  int64_t a = submit(f, 0, NULL, 0, 1, T0);
  int64_t b = submit(f, 0, NULL, 0, 1, T0);
  uint32_t att;
  assert_int_equal(lease(f, "w", T0, &att), a);
  assert_int_equal(f->o->progress(f->q.impl, a, 3, 10, NULL), SPN_OK);
  assert_int_equal(f->o->complete(f->q.impl, a, att, "w", 0, 0, NULL, NULL, T0 + 1, NULL), SPN_OK);
  assert_int_equal(lease(f, "w", T0, &att), b);
  assert_int_equal(f->o->complete(f->q.impl, b, att, "w", 0, 0, NULL, NULL, T0 + 1, NULL), SPN_OK);
  spn_queue_job_t j;
  assert_int_equal(f->o->get(f->q.impl, a, &j, NULL), SPN_OK);
  assert_int_equal(j.progress_done, 10);
  assert_int_equal(j.progress_total, 10);
  spn__queue_job_clear(&j);
  assert_int_equal(f->o->get(f->q.impl, b, &j, NULL), SPN_OK);
  assert_true(j.progress_total > 0);
  assert_int_equal(j.progress_done, j.progress_total);
  spn__queue_job_clear(&j);
}

/* An attempt's transfers are added to its job in the write that ends the
 * attempt: a failed attempt's and the succeeding one's sum up, a stale
 * report adds nothing, another job keeps its own (both backends). */
static void test_transfers_add_up_over_attempts(void **state) {
  fx_t *f = *state;
  int64_t a = submit(f, 0, NULL, 0, 3, T0);
  int64_t b = submit(f, 0, NULL, 0, 1, T0 + 1);
  uint32_t att;
  const spn_job_xfer_t x1 = {.bytes = {100, 200, 0, 1}, .ns = {1000, 2000, 0, 5}};
  const spn_job_xfer_t x2 = {.bytes = {10, 20, 1ull << 40, 0}, .ns = {1, 2, 3, 0}};
  assert_int_equal(lease(f, "w", T0 + 2, &att), a);
  spn_queue_state_t st;
  assert_int_equal((f->o->fail)(f->q.impl, a, att, "w", "flaky", SPN_FAIL_RETRY, 1, 0, &x1, T0 + 3, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_QUEUED);
  spn_queue_job_t j;
  assert_int_equal(f->o->get(f->q.impl, a, &j, NULL), SPN_OK);
  assert_memory_equal(&j.xfer, &x1, sizeof x1);
  int64_t nb = j.not_before_ms;
  spn__queue_job_clear(&j);
  assert_int_equal(lease(f, "w", T0 + 4, &att), b); /* a backs off */
  assert_int_equal(f->o->complete(f->q.impl, b, att, "w", 0, 0, NULL, NULL, T0 + 5, NULL), SPN_OK);
  assert_int_equal(lease(f, "w2", nb + 1, &att), a);
  assert_int_equal(att, 2);
  /* A stale report (the first attempt's) is refused and adds nothing. */
  /* ... and records no warnings; the holder's completion records its own. */
  const char *wn = "[\"decode: in.mp4: damaged input accepted\",\"sr: \u00e9 \\\"quoted\\\"\"]";
  assert_int_equal(f->o->complete(f->q.impl, a, 1, "w", 0, 0, &x2, "[\"stale\"]", nb + 2, NULL), SPN_ESTATE);
  assert_int_equal(f->o->complete(f->q.impl, a, att, "w2", 0, 0, &x2, wn, nb + 3, NULL), SPN_OK);
  assert_int_equal(f->o->get(f->q.impl, a, &j, NULL), SPN_OK);
  const spn_job_xfer_t sum = {.bytes = {110, 220, 1ull << 40, 1}, .ns = {1001, 2002, 3, 5}};
  assert_memory_equal(&j.xfer, &sum, sizeof sum);
  assert_string_equal(j.warnings_json, wn);
  spn__queue_job_clear(&j);
  assert_int_equal(f->o->get(f->q.impl, b, &j, NULL), SPN_OK);
  const spn_job_xfer_t none = {.bytes = {0}};
  assert_memory_equal(&j.xfer, &none, sizeof none);
  assert_null(j.warnings_json); /* completed with none */
  spn__queue_job_clear(&j);
}

/* A queue file written before transfers existed (no h2d_bytes ... columns)
 * opens, reads its jobs' transfers as 0, and records new ones. */
static void test_sqlite_file_from_before_transfers(void **state) {
  (void)state;
  char path[] = "/tmp/spn-xfer-queue-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  /* The jobs table as the release before transfers made it. */
  const char *old =
      "CREATE TABLE jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, spec TEXT NOT NULL, priority INTEGER NOT NULL "
      "DEFAULT 0, state INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL, "
      "idem_key TEXT UNIQUE, created INTEGER NOT NULL, deadline INTEGER NOT NULL DEFAULT 0, not_before INTEGER "
      "NOT NULL DEFAULT 0, lease_owner TEXT, lease_until INTEGER NOT NULL DEFAULT 0, cancel_requested INTEGER NOT "
      "NULL DEFAULT 0, reason TEXT, errors TEXT NOT NULL DEFAULT '[]', compute_s REAL NOT NULL DEFAULT 0, gpu_s "
      "REAL NOT NULL DEFAULT 0, progress_done INTEGER NOT NULL DEFAULT 0, progress_total INTEGER NOT NULL DEFAULT "
      "0, parent INTEGER NOT NULL DEFAULT 0, seg_index INTEGER NOT NULL DEFAULT 0, pending INTEGER NOT NULL "
      "DEFAULT 0);"
      "CREATE TABLE transitions(job INTEGER NOT NULL, at INTEGER NOT NULL, state INTEGER NOT NULL, note TEXT);"
      "INSERT INTO jobs(spec, state, max_attempts, created, compute_s) VALUES('" SPEC "', 2, 1, 1, 2.5);"
      "INSERT INTO jobs(spec, state, max_attempts, created) VALUES('" SPEC "', 0, 1, 1);";
  char *msg = NULL;
  if (sqlite3_exec(db, old, NULL, NULL, &msg) != SQLITE_OK)
    fail_msg("old schema: %s", msg);
  sqlite3_close(db);
  spn_queue_config_t c = {.path = path, .backoff_base_ms = 1000, .backoff_max_ms = 8000, .seed = 1};
  spn_queue_t q;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_queue_sqlite_open(&c, &q, &err) != SPN_OK)
    fail_msg("open the old file: %s", err.msg);
  spn_queue_job_t j;
  const spn_job_xfer_t none = {.bytes = {0}};
  assert_int_equal(q.ops->get(q.impl, 1, &j, NULL), SPN_OK);
  assert_true(j.state == SPN_QSTATE_SUCCEEDED && j.compute_s == 2.5);
  assert_memory_equal(&j.xfer, &none, sizeof none);
  spn__queue_job_clear(&j);
  /* jobs from before the outputs table hold no path; new ones do */
  spn_queue_clash_t cl;
  const char *o = "{\"pipeline\":\"p\",\"outputs\":{\"a\":\"/o\"}}";
  spn_queue_submit_t s = {.spec_json = o, .max_attempts = 1, .clash = &cl};
  int64_t id = 0;
  bool ex = false;
  assert_int_equal(q.ops->submit(q.impl, &s, T0, &id, &ex, NULL), SPN_OK);
  assert_int_equal(q.ops->submit(q.impl, &s, T0, &id, &ex, NULL), SPN_EBUSY);
  assert_int_equal(cl.job, 3);
  assert_int_equal(q.ops->lease(q.impl, "w", NULL, T0, 1000, &j, NULL), SPN_OK);
  assert_int_equal(j.id, 2);
  spn__queue_job_clear(&j);
  const spn_job_xfer_t x = {.bytes = {7, 8, 9, 10}, .ns = {11, 12, 13, 14}};
  assert_int_equal(q.ops->complete(q.impl, 2, 1, "w", 0, 0, &x, NULL, T0 + 1, NULL), SPN_OK);
  spn_queue_free(&q);
  /* And it is on disk: reopened, the figures are there. */
  assert_int_equal(spn_queue_sqlite_open(&c, &q, &err), SPN_OK);
  assert_int_equal(q.ops->get(q.impl, 2, &j, NULL), SPN_OK);
  assert_memory_equal(&j.xfer, &x, sizeof x);
  spn__queue_job_clear(&j);
  spn_queue_free(&q);
  remove_sqlite_files(path);
}

/* The waiting mirror (P waiting, group "spindle") that KEDA scales 0 -> N
 * on: its lag follows every way into and out of state queued. */
static void test_redis_waiting_lag_is_the_number_of_queued_jobs(void **state) {
  fx_t *f = *state;
  int64_t now = wall_ms();
  assert_waiting(f, 0);
  int64_t a = submit(f, 0, NULL, 0, 2, now);
  int64_t b = submit(f, 0, NULL, 0, 1, now);
  int64_t c = submit(f, 0, NULL, 0, 1, now);
  int64_t d = submit(f, 0, NULL, 0, 3, now);
  int64_t e = submit(f, 0, NULL, 0, 2, now);
  assert_waiting(f, 5);
  uint32_t att_a, att_b, att;
  assert_int_equal(lease(f, "w1", now, &att_a), a);
  assert_waiting(f, 4);
  assert_int_equal(lease(f, "w1", now, &att_b), b);
  assert_waiting(f, 3);
  /* cancel: a queued job leaves queued at once; a running one only asks */
  spn_queue_state_t st;
  assert_int_equal(f->o->cancel(f->q.impl, c, now, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  assert_waiting(f, 2);
  assert_int_equal(f->o->cancel(f->q.impl, b, now, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_RUNNING);
  assert_waiting(f, 2);
  /* a failed attempt with attempts left is queued again (backing off: still
   * waiting, and a worker must come to take it); a cancelled one is not */
  assert_int_equal((f->o->fail)(f->q.impl, a, att_a, "w1", "boom", SPN_FAIL_RETRY, 0, 0, NULL, now, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_QUEUED);
  assert_waiting(f, 3);
  assert_int_equal((f->o->fail)(f->q.impl, b, att_b, "w1", "stopped", SPN_FAIL_RETRY, 0, 0, NULL, now, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  assert_waiting(f, 3);
  /* a resubmission with the same idempotency key adds nothing */
  int64_t g = submit(f, 0, "key-g", 0, 1, now);
  assert_waiting(f, 4);
  spn_queue_submit_t sg = {.spec_json = SPEC, .idem_key = "key-g", .max_attempts = 1};
  int64_t id;
  bool existed = false;
  assert_int_equal(f->o->submit(f->q.impl, &sg, now, &id, &existed, NULL), SPN_OK);
  assert_true(existed);
  assert_int_equal(id, g);
  assert_waiting(f, 4);
  /* a draining worker hands its job back */
  assert_int_equal(lease(f, "w2", now, &att), d);
  assert_waiting(f, 3);
  assert_int_equal(f->o->release(f->q.impl, d, att, "w2", "draining", now, NULL), SPN_OK);
  assert_waiting(f, 4);
  /* an expired lease swept back (300 ms on the server's clock) */
  assert_int_equal(lease(f, "w2", now, &att), d);
  assert_waiting(f, 3);
  usleep(350000);
  seen_t s = {0};
  assert_int_equal(f->o->sweep(f->q.impl, wall_ms(), seen_cb, &s, NULL), 1);
  assert_int_equal(s.id[0], d);
  assert_int_equal(s.st[0], SPN_QSTATE_QUEUED);
  assert_waiting(f, 4);
  /* a lost worker's jobs re-queued */
  assert_int_equal(lease(f, "w3", wall_ms(), &att), e);
  assert_waiting(f, 3);
  assert_int_equal(f->o->release_owner(f->q.impl, "w3", "worker w3 lost", wall_ms(), NULL, NULL, NULL), 1);
  assert_waiting(f, 4);
  /* a queued job past its deadline fails in the sweep */
  now = wall_ms();
  int64_t h = submit(f, 0, NULL, now + 50, 1, now);
  assert_waiting(f, 5);
  assert_int_equal(f->o->sweep(f->q.impl, now + 100, NULL, NULL, NULL), 1);
  assert_int_equal(state_of(f, h), SPN_QSTATE_FAILED);
  assert_waiting(f, 4);
  /* pipelined submissions of a group commit */
  assert_int_equal(f->o->begin(f->q.impl, NULL), SPN_OK);
  for (int i = 0; i < 3; i++) {
    spn_queue_submit_t sb = {.spec_json = SPEC, .max_attempts = 1};
    assert_int_equal(f->o->submit(f->q.impl, &sb, now, &id, &existed, NULL), SPN_OK);
  }
  assert_int_equal(f->o->commit(f->q.impl, NULL), SPN_OK);
  assert_waiting(f, 7);
  /* everything leased (backoffs passed): lag 0, and the read tokens were
   * trimmed, so the stream does not grow with the jobs it has seen */
  for (int64_t left = 7; left > 0; left--) {
    assert_int_not_equal(lease(f, "w4", now + 3600 * 1000, NULL), 0);
    assert_waiting(f, left - 1);
  }
  assert_int_equal(lease(f, "w4", now + 3600 * 1000, NULL), 0);
  assert_waiting(f, 0);
  redisReply *r = redis_cmd(f->srv, "XLEN %swaiting", f->prefix);
  assert_true(r->type == REDIS_REPLY_INTEGER && r->integer <= 1);
  freeReplyObject(r);
}

/* Drift between the mirror and the queued jobs — junk tokens, the stream
 * deleted (a queue an older Spindle wrote has none), entries removed with
 * XDEL (Redis then reports no lag) — is repaired by the next sweep and on
 * connect; transitions keep working meanwhile. */
static void test_redis_waiting_mirror_is_repaired(void **state) {
  fx_t *f = *state;
  int64_t now = wall_ms();
  for (int i = 0; i < 4; i++)
    submit(f, 0, NULL, 0, 1, now);
  assert_waiting(f, 4);
  /* junk tokens: taken back by the sweep */
  for (int i = 0; i < 3; i++)
    freeReplyObject(redis_cmd(f->srv, "XADD %swaiting * t 1", f->prefix));
  assert_int_equal(waiting_lag(f->srv, f->prefix), 7);
  assert_int_equal(f->o->sweep(f->q.impl, now, NULL, NULL, NULL), 0);
  assert_waiting(f, 4);
  /* the stream deleted: a lease still works; a submission recreates the
   * stream without its group; the sweep rebuilds it */
  freeReplyObject(redis_cmd(f->srv, "DEL %swaiting", f->prefix));
  assert_int_equal(waiting_lag(f->srv, f->prefix), -2);
  assert_int_not_equal(lease(f, "w", now, NULL), 0);
  submit(f, 0, NULL, 0, 1, now);
  assert_int_equal(waiting_lag(f->srv, f->prefix), -2);
  assert_int_equal(f->o->sweep(f->q.impl, now, NULL, NULL, NULL), 0);
  assert_waiting(f, 4);
  /* the key overwritten with another type: transitions still go through
   * whole, the sweep rebuilds the stream */
  freeReplyObject(redis_cmd(f->srv, "SET %swaiting x", f->prefix));
  int64_t extra = submit(f, 0, NULL, 0, 1, now);
  spn_queue_state_t st;
  assert_int_equal(f->o->cancel(f->q.impl, extra, now, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  assert_int_equal(waiting_lag(f->srv, f->prefix), -2);
  assert_int_equal(f->o->sweep(f->q.impl, now, NULL, NULL, NULL), 0);
  assert_waiting(f, 4);
  /* tokens missing (an RDB older than the jobs): the sweep adds them */
  for (int i = 0; i < 2; i++)
    freeReplyObject(redis_cmd(f->srv, "XREADGROUP GROUP spindle x COUNT 1 NOACK STREAMS %swaiting >", f->prefix));
  assert_int_equal(waiting_lag(f->srv, f->prefix), 2);
  assert_int_equal(f->o->sweep(f->q.impl, now, NULL, NULL, NULL), 0);
  assert_waiting(f, 4);
  /* an unread entry removed with XDEL: Redis cannot say the lag; a new
   * connection rebuilds the stream before its first call */
  redisReply *r = redis_cmd(f->srv, "XADD %swaiting * t 1", f->prefix);
  assert_int_equal(r->type, REDIS_REPLY_STRING);
  freeReplyObject(redis_cmd(f->srv, "XDEL %swaiting %s", f->prefix, r->str));
  freeReplyObject(r);
  assert_int_equal(waiting_lag(f->srv, f->prefix), -1);
  spn_queue_free(&f->q);
  assert_int_equal(open_redis(f, 300, &f->q), SPN_OK);
  f->o = f->q.ops;
  assert_int_equal(waiting_lag(f->srv, f->prefix), 4);
  /* a queue written without the mirror: counted in on connect */
  freeReplyObject(redis_cmd(f->srv, "DEL %swaiting", f->prefix));
  spn_queue_free(&f->q);
  assert_int_equal(open_redis(f, 300, &f->q), SPN_OK);
  f->o = f->q.ops;
  assert_waiting(f, 4);
  for (int64_t left = 4; left > 0; left--) {
    assert_int_not_equal(lease(f, "w", now, NULL), 0);
    assert_waiting(f, left - 1);
  }
}

/* A mirror far off (here 25,000 junk tokens) comes right over several
 * sweeps, 10,000 tokens each, so no sweep holds Redis for long. */
static void test_redis_waiting_mirror_repaired_in_chunks(void **state) {
  fx_t *f = *state;
  int64_t now = wall_ms();
  for (int i = 0; i < 4; i++)
    submit(f, 0, NULL, 0, 1, now);
  assert_waiting(f, 4);
  char key[64];
  snprintf(key, sizeof key, "%swaiting", f->prefix);
  freeReplyObject(redis_cmd(f->srv, "EVAL %s 1 %s", "for i = 1, 25000 do redis.call('XADD', KEYS[1], '*', 't', 1) end", key));
  assert_int_equal(waiting_lag(f->srv, f->prefix), 25004);
  assert_int_equal(f->o->sweep(f->q.impl, now, NULL, NULL, NULL), 0);
  assert_int_equal(waiting_lag(f->srv, f->prefix), 15004);
  assert_int_equal(f->o->sweep(f->q.impl, now, NULL, NULL, NULL), 0);
  assert_int_equal(waiting_lag(f->srv, f->prefix), 5004);
  assert_int_equal(f->o->sweep(f->q.impl, now, NULL, NULL, NULL), 0);
  assert_waiting(f, 4);
}

static void test_redis_url_errors(void **state) {
  (void)state;
  const char *bad[] = {"http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://u:pw@h:1",
                       "redis://h:1/x", "unix://rel/path", "unix:///p?db=x"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    spn_queue_config_t c = {.backend = "redis", .url = bad[i]};
    spn_queue_t q;
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(spn_queue_open(&c, &q, &err), SPN_ECONFIG);
    assert_non_null(strstr(err.msg, "queue url"));
  }
  spn_queue_config_t c = {.backend = "mysql"};
  spn_queue_t q;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_queue_open(&c, &q, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "mysql"));
  /* Nobody listening: a clear error naming the URL, not a hang. */
  c = (spn_queue_config_t){.backend = "redis", .url = "redis://127.0.0.1:1"};
  assert_int_equal(spn_queue_open(&c, &q, &err), SPN_EIO);
  assert_non_null(strstr(err.msg, "redis://127.0.0.1:1"));
}

/* A run's warnings rendered for the queue: whole lines while they fit in
 * SPN_JOB_WARNINGS_MAX, then one line counting the rest; valid JSON. */
static void test_warnings_render(void **state) {
  (void)state;
  char out[SPN_JOB_WARNINGS_MAX];
  spn__warnings_render(NULL, out, sizeof out);
  assert_string_equal(out, "");
  cJSON *a = cJSON_CreateArray();
  spn__warnings_render(a, out, sizeof out);
  assert_string_equal(out, "");
  char line[128];
  for (int i = 0; i < 30; i++) {
    snprintf(line, sizeof line, "stage%02d: %090d", i, i);
    cJSON_AddItemToArray(a, cJSON_CreateString(line));
  }
  spn__warnings_render(a, out, sizeof out);
  assert_true(strlen(out) < sizeof out);
  cJSON *r = cJSON_Parse(out);
  assert_true(cJSON_IsArray(r));
  int n = cJSON_GetArraySize(r);
  assert_true(n > 10 && n < 30);
  for (int i = 0; i < n - 1; i++) { /* the first lines, whole and in order */
    snprintf(line, sizeof line, "stage%02d: %090d", i, i);
    assert_string_equal(cJSON_GetArrayItem(r, i)->valuestring, line);
  }
  char more[80];
  snprintf(more, sizeof more, "... %d more warnings: see the worker's log", 30 - (n - 1));
  assert_string_equal(cJSON_GetArrayItem(r, n - 1)->valuestring, more);
  cJSON_Delete(r);
  cJSON_Delete(a);
  /* one line longer than the whole room: only counted */
  a = cJSON_CreateArray();
  char *big = malloc(3000);
  memset(big, 'x', 2999);
  big[2999] = '\0';
  cJSON_AddItemToArray(a, cJSON_CreateString(big));
  free(big);
  spn__warnings_render(a, out, sizeof out);
  assert_string_equal(out, "[\"... 1 more warnings: see the worker's log\"]");
  cJSON_Delete(a);
}

/* Lease on another client of the queue; the id leased. */
static int64_t lease_on(spn_queue_t *q, const char *owner, int64_t now, int64_t lease_ms) {
  spn_queue_job_t j;
  assert_int_equal(q->ops->lease(q->impl, owner, NULL, now, lease_ms, &j, NULL), SPN_OK);
  int64_t id = j.id;
  spn__queue_job_clear(&j);
  return id;
}

/* Fail attempt att of id on client q; the state it moved to. */
static spn_queue_state_t fail_on(spn_queue_t *q, int64_t id, uint32_t att, const char *owner, int64_t now) {
  spn_queue_state_t st;
  assert_int_equal((q->ops->fail)(q->impl, id, att, owner, "boom", false, 0, 0, NULL, now, &st, NULL), SPN_OK);
  return st;
}

/* Standard error into a temporary file until stderr_end, which returns
 * what was written (malloc'd) and puts the old one back. */
typedef struct captured {
  char path[64];
  int saved;
} captured_t;

static void stderr_begin(captured_t *c) {
  snprintf(c->path, sizeof c->path, "/tmp/spn-queue-log-XXXXXX");
  int fd = mkstemp(c->path);
  assert_true(fd >= 0);
  fflush(stderr);
  c->saved = dup(STDERR_FILENO);
  assert_true(c->saved >= 0 && dup2(fd, STDERR_FILENO) >= 0);
  close(fd);
}

static char *stderr_end(captured_t *c) {
  fflush(stderr);
  dup2(c->saved, STDERR_FILENO);
  close(c->saved);
  FILE *fp = fopen(c->path, "rb");
  assert_non_null(fp);
  char *text = calloc(1, 1 << 16);
  assert_non_null(text);
  size_t n = fread(text, 1, (1 << 16) - 1, fp);
  text[n] = '\0';
  fclose(fp);
  unlink(c->path);
  return text;
}

/* A counter's value in a /metrics body (-1 when the sample is absent). */
static long long metric(const char *body, const char *family, const char *event) {
  char key[128];
  snprintf(key, sizeof key, "\n%s{event=\"%s\"} ", family, event);
  const char *p = strstr(body, key);
  return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* Every event of family in a /metrics body has the count want[SPN_QEV_*]. */
static void assert_events(const char *body, const char *family, const long long want[SPN_QEV_COUNT]) {
  for (int i = 0; i < SPN_QEV_COUNT; i++) {
    long long got = metric(body, family, spn__queue_event_name(i));
    if (got != want[i])
      fail_msg("%s{event=\"%s\"}: %lld, want %lld", family, spn__queue_event_name(i), got, want[i]);
  }
}

/* A gateway's /metrics: its own events and the queue's, each as `want`
 * (SQLite: the queue's count is the gateway's). */
static void assert_both_events(spn__observe_t *o, const long long want[SPN_QEV_COUNT]) {
  spn__observe_workers_t wk = {0};
  char *body = spn__observe_render(o, &wk, NULL, NULL);
  assert_non_null(body);
  assert_events(body, "spindle_job_events_total", want);
  assert_events(body, "spindle_queue_events_total", want);
  free(body);
}

/* The queue's event counters (P events) count every move, whichever client
 * made it; a gateway's (the observing wrapper's spindle_job_events_total)
 * only its own. A succeeded job a sweep hands over for its publication
 * marker is not a move: neither counts it again. */
static void test_redis_event_counters(void **state) {
  fx_t *f = *state;
  spn__observe_t *o = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  captured_t cap; /* the gateway's lifecycle lines (JSON: not a terminal) */
  stderr_begin(&cap);
  assert_int_equal(spn__observe_attach(&f->q, "test gateway", &o, &err), SPN_OK);
  f->o = f->q.ops;
  spn_queue_t w; /* a worker leasing straight from Redis */
  assert_int_equal(open_redis(f, 300, &w), SPN_OK);
  spn_queue_state_t st;
  int64_t a = submit(f, 0, NULL, 0, 2, T0);
  int64_t b = submit(f, 0, NULL, 0, 1, T0);
  int64_t c = submit_spec(f, SPEC_OUT, 0, "c", 0, 3, T0);
  spn_queue_submit_t again = {.spec_json = SPEC_OUT, .idem_key = "c", .max_attempts = 3};
  int64_t c2 = 0;
  bool existed = false;
  assert_int_equal(f->o->submit(f->q.impl, &again, T0, &c2, &existed, NULL), SPN_OK);
  assert_true(existed && c2 == c); /* the same job again: no submission */
  int64_t d = submit(f, 0, NULL, 0, 3, T0);
  int64_t e = submit(f, 0, NULL, 0, 3, T0);
  assert_int_equal(f->o->cancel(f->q.impl, d, T0 + 1, &st, NULL), SPN_OK);
  /* the worker: a fails (retried), b fails for good, c succeeds and the
   * worker dies before removing its marker */
  const int64_t t = T0 + 10;
  assert_int_equal(lease_on(&w, "W", t, 1000), a);
  assert_int_equal(fail_on(&w, a, 1, "W", t), SPN_QSTATE_QUEUED);
  assert_int_equal(lease_on(&w, "W", t, 1000), b);
  assert_int_equal(fail_on(&w, b, 1, "W", t), SPN_QSTATE_FAILED);
  assert_int_equal(lease_on(&w, "W", t, 1000), c);
  assert_int_equal(w.ops->complete(w.impl, c, 1, "W", 0, 0, NULL, NULL, t, NULL), SPN_OK);
  /* the gateway leases e and hands it back at shutdown */
  assert_int_equal(lease(f, "G", t, NULL), e);
  assert_int_equal(f->o->release(f->q.impl, e, 1, "G", "gateway shut down", t, NULL), SPN_OK);
  /* the worker again, past a's backoff: a dies, e succeeds */
  const int64_t t2 = T0 + 100000;
  assert_int_equal(lease_on(&w, "W", t2, 1000), a);
  assert_int_equal(fail_on(&w, a, 2, "W", t2), SPN_QSTATE_DEAD);
  assert_int_equal(lease_on(&w, "W", t2, 1000), e);
  assert_int_equal(w.ops->complete(w.impl, e, 1, "W", 0, 0, NULL, NULL, t2, NULL), SPN_OK);
  /* h: the worker's lease expires (300 ms of Redis time); the gateway's
   * sweep fails that attempt and hands it c, whose marker nobody removed */
  int64_t h = submit(f, 0, NULL, 0, 3, t2);
  assert_int_equal(lease_on(&w, "W2", t2, 300), h);
  usleep(450000);
  seen_t s = {0};
  assert_int_equal(f->o->sweep(f->q.impl, t2 + 100000, seen_cb, &s, NULL), 2);
  assert_int_equal(s.n, 2);
  assert_true((s.id[0] == h && s.st[0] == SPN_QSTATE_QUEUED && s.id[1] == c && s.st[1] == SPN_QSTATE_SUCCEEDED) ||
              (s.id[1] == h && s.st[1] == SPN_QSTATE_QUEUED && s.id[0] == c && s.st[0] == SPN_QSTATE_SUCCEEDED));
  assert_int_equal(state_of(f, h), SPN_QSTATE_QUEUED);
  /* The sweep's line for h names its attempt and pipeline, though this
   * gateway never leased it. */
  char *log = stderr_end(&cap);
  char want[96];
  snprintf(want, sizeof want, "\"job_id\":%lld,\"event\":\"failed\"", (long long)h);
  const char *line = strstr(log, want);
  const char *end = line ? strchr(line, '\n') : NULL;
  if (!line || !end)
    fail_msg("no failed line for job %lld in: %s", (long long)h, log);
  char one[512];
  snprintf(one, sizeof one, "%.*s", (int)(end - line), line);
  if (!strstr(one, "\"attempt\":1") || !strstr(one, "\"pipeline\":\"copy\""))
    fail_msg("the sweep's line lacks attempt 1 or pipeline copy: %s", one);
  free(log);

  spn__observe_workers_t wk = {0};
  char *body = spn__observe_render(o, &wk, NULL, &err);
  assert_non_null(body);
  /* submitted a b c d e h; leased a b c e (gateway) a e h; failed a's
   * first attempt, b, h's expired lease */
  /*                               submitted leased succeeded failed dead cancelled released deleted */
  assert_events(body, "spindle_queue_events_total", (long long[]){6, 7, 2, 3, 1, 1, 1, 0});
  /* the gateway's own: its submissions, d's cancel, e's lease and release,
   * h's failure in its sweep; not c's hand-over */
  assert_events(body, "spindle_job_events_total", (long long[]){6, 1, 0, 1, 0, 1, 1, 0});
  free(body);
  /* another client of the queue reads the same counters */
  uint64_t ev[SPN_QEV_COUNT];
  assert_int_equal(w.ops->events(w.impl, ev, NULL), SPN_OK);
  assert_int_equal(ev[SPN_QEV_SUBMITTED], 6);
  assert_int_equal(ev[SPN_QEV_LEASED], 7);
  assert_int_equal(ev[SPN_QEV_FAILED], 3);
  spn_queue_free(&w);
}

/* A gateway or worker records a removed publication marker through its
 * observing wrapper, so no sweep hands the job over again; on SQLite the
 * wrapper has no such call either (the marker goes after the commit). */
static void test_unpublished_through_the_wrapper(void **state) {
  fx_t *f = *state;
  bool redis = f->o->unpublished != NULL;
  spn__observe_t *o = NULL;
  assert_int_equal(spn__observe_attach(&f->q, "test worker", &o, NULL), SPN_OK);
  f->o = f->q.ops;
  assert_int_equal(f->o->unpublished != NULL, redis);
  if (!redis)
    return;
  int64_t id = submit_spec(f, SPEC_OUT, 0, NULL, 0, 1, T0);
  assert_int_equal(lease(f, "W", T0, NULL), id);
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "W", 0, 0, NULL, NULL, T0, NULL), SPN_OK);
  assert_int_equal(f->o->unpublished(f->q.impl, id, NULL), SPN_OK);
  seen_t s = {0};
  assert_int_equal(f->o->sweep(f->q.impl, T0 + 100000, seen_cb, &s, NULL), 0);
  assert_int_equal(s.n, 0);
}

/* Without counters of its own (SQLite: one gateway makes every move), the
 * queue's family is the gateway's count. */
static void test_sqlite_queue_events_are_the_gateways(void **state) {
  fx_t *f = *state;
  spn__observe_t *o = NULL;
  assert_null(f->o->events);
  assert_int_equal(spn__observe_attach(&f->q, "test gateway", &o, NULL), SPN_OK);
  f->o = f->q.ops;
  assert_null(f->o->events);
  int64_t a = submit(f, 0, NULL, 0, 1, T0);
  submit(f, 0, NULL, 0, 1, T0);
  assert_int_equal(lease(f, "G", T0, NULL), a);
  assert_int_equal(f->o->complete(f->q.impl, a, 1, "G", 0, 0, NULL, NULL, T0 + 1, NULL), SPN_OK);
  assert_both_events(o, (long long[SPN_QEV_COUNT]){[SPN_QEV_SUBMITTED] = 2, [SPN_QEV_LEASED] = 1,
                                                   [SPN_QEV_SUCCEEDED] = 1});
}

/* Retention is counted: the gateway's own count of the jobs it deleted,
 * and the queue's (Redis: in P events, for every gateway of it). */
static void test_purge_counted(void **state) {
  fx_t *f = *state;
  spn__observe_t *o = NULL;
  assert_int_equal(spn__observe_attach(&f->q, "test gateway", &o, NULL), SPN_OK);
  f->o = f->q.ops;
  spn_queue_state_t st;
  for (int i = 0; i < 3; i++) {
    int64_t id = submit(f, 0, NULL, 0, 1, T0);
    if (i < 2)
      assert_int_equal(f->o->cancel(f->q.impl, id, T0 + 1, &st, NULL), SPN_OK);
  }
  uint32_t n = 0;
  assert_int_equal(f->o->purge(f->q.impl, T0 + 10, 10, &n, NULL), SPN_OK);
  assert_int_equal(n, 2);
  assert_both_events(o, (long long[SPN_QEV_COUNT]){[SPN_QEV_SUBMITTED] = 3, [SPN_QEV_CANCELLED] = 2,
                                                   [SPN_QEV_DELETED] = 2});
}

/* Lease `owner` a job of the pipelines in filter ("\nname\n..."): its id,
 * 0 when none of them is ready. */
static int64_t lease_of(fx_t *f, const char *filter, int64_t now) {
  spn_queue_job_t j;
  int32_t rc = f->o->lease(f->q.impl, "w", filter, now, 1000, &j, NULL);
  if (rc == SPN_EAGAIN)
    return 0;
  assert_int_equal(rc, SPN_OK);
  int64_t id = j.id;
  spn__queue_job_clear(&j);
  return id;
}

/* A worker leases only jobs of the pipelines it runs, in priority then FIFO
 * order among them; the jobs it passes over stay queued, in their place, for
 * a worker that runs them. Names match whole ("trans" is not "transcode"). */
static void test_lease_by_pipeline(void **state) {
  fx_t *f = *state;
  int64_t a = submit_spec(f, "{\"pipeline\":\"enhance\"}", 5, NULL, 0, 1, T0);
  int64_t b = submit_spec(f, "{\"pipeline\":\"transcode\"}", 0, NULL, 0, 1, T0 + 1);
  int64_t c = submit_spec(f, "{\"pipeline\":\"enhance\"}", 0, NULL, 0, 1, T0 + 2);
  int64_t d = submit_spec(f, "{\"pipeline\":\"transcode\"}", 7, NULL, 0, 1, T0 + 3);
  assert_int_equal(lease_of(f, "\ntrans\n", T0 + 10), 0);
  assert_int_equal(lease_of(f, "\ncopy\nfail\n", T0 + 10), 0);
  assert_int_equal(lease_of(f, "\ncopy\ntranscode\n", T0 + 10), d);
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10), b);
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10), 0);
  assert_int_equal(queued(f), 2);
  assert_int_equal(state_of(f, a), SPN_QSTATE_QUEUED);
  /* "\n" lists no pipeline: nothing */
  assert_int_equal(lease_of(f, "\n", T0 + 10), 0);
  int64_t e = submit_spec(f, "{\"pipeline\":\"transcode\"}", 9, NULL, 0, 1, T0 + 4);
  /* any pipeline (NULL): the order of the whole queue */
  assert_int_equal(lease_of(f, NULL, T0 + 10), e);
  assert_int_equal(lease_of(f, "\nenhance\n", T0 + 10), a);
  assert_int_equal(lease_of(f, NULL, T0 + 10), c);
  assert_int_equal(queued(f), 0);
  /* a stored spec that is not JSON names no pipeline: a filtered lease
   * passes it over (no error), an unfiltered one takes it */
  int64_t g = submit_spec(f, "{\"pipeline\": \"transcode\"", 0, NULL, 0, 1, T0 + 5);
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10), 0);
  assert_int_equal(lease_of(f, NULL, T0 + 10), g);
}

static int64_t seen_at(fx_t *f, const char *pipeline) {
  int64_t at = -1;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(f->o->seen(f->q.impl, pipeline, &at, &err), SPN_OK);
  return at;
}

/* Worker presence: a pipeline no worker was said to run is never seen; each
 * pipeline keeps its own time; a worker of any pipeline counts for all of
 * them; a later time replaces an earlier one (several workers, one name). */
static void test_worker_presence(void **state) {
  fx_t *f = *state;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(seen_at(f, "enhance"), 0);
  assert_int_equal(f->o->present(f->q.impl, "\nenhance\nlipsync\n", T0, &err), SPN_OK);
  assert_int_equal(seen_at(f, "enhance"), T0);
  assert_int_equal(seen_at(f, "lipsync"), T0);
  assert_int_equal(seen_at(f, "transcode"), 0);
  assert_int_equal(seen_at(f, "enhance\nlipsync"), 0);
  assert_int_equal(seen_at(f, "lip"), 0);
  assert_int_equal(f->o->present(f->q.impl, "\nlipsync\n", T0 + 5000, &err), SPN_OK);
  assert_int_equal(seen_at(f, "lipsync"), T0 + 5000);
  assert_int_equal(seen_at(f, "enhance"), T0);
  /* "\n" lists none: nothing changes */
  assert_int_equal(f->o->present(f->q.impl, "\n", T0 + 6000, &err), SPN_OK);
  assert_int_equal(seen_at(f, "transcode"), 0);
  /* a worker of any pipeline */
  assert_int_equal(f->o->present(f->q.impl, NULL, T0 + 7000, &err), SPN_OK);
  assert_int_equal(seen_at(f, "transcode"), T0 + 7000);
  assert_int_equal(seen_at(f, "enhance"), T0 + 7000);
  assert_int_equal(f->o->present(f->q.impl, "\nenhance\n", T0 + 9000, &err), SPN_OK);
  assert_int_equal(seen_at(f, "enhance"), T0 + 9000);
  assert_int_equal(seen_at(f, "transcode"), T0 + 7000);
}

/* The roster (Redis): records set and removed in one call, read back
 * whole; a prune removes those not renewed for SPN_ROSTER_KEEP_MS and the
 * unreadable ones, and keeps the rest. */
typedef struct {
  char names[8][32], records[8][512];
  size_t n;
} roster_seen_t;

static void roster_collect(void *user, const char *name, const char *record) {
  roster_seen_t *r = user;
  assert_true(r->n < 8);
  snprintf(r->names[r->n], sizeof r->names[r->n], "%s", name);
  snprintf(r->records[r->n], sizeof r->records[r->n], "%s", record);
  r->n++;
}

static const char *roster_find(const roster_seen_t *r, const char *name) {
  for (size_t i = 0; i < r->n; i++)
    if (!strcmp(r->names[i], name))
      return r->records[i];
  return NULL;
}

static void test_redis_roster(void **state) {
  fx_t *f = *state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_roster_entry_t gw = {.kind = "local", .gateway = "gw:1", .slots = 4, .running = 1,
                           .pipelines = "\nenhance\nlipsync\n"};
  spn_roster_entry_t q = {.kind = "queue", .slots = 2, .draining = true, .pipelines = NULL,
                          .instance = "0123456789abcdef"};
  char *r1 = spn__roster_record(&gw, T0 + 100), *r2 = spn__roster_record(&q, T0);
  cJSON *j = cJSON_Parse(r1);
  assert_string_equal(cJSON_GetObjectItem(j, "kind")->valuestring, "local");
  assert_string_equal(cJSON_GetObjectItem(j, "gateway")->valuestring, "gw:1");
  assert_int_equal(cJSON_GetObjectItem(j, "slots")->valueint, 4);
  assert_int_equal(cJSON_GetObjectItem(j, "running")->valueint, 1);
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "draining")));
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "pipelines")), 2);
  assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "pipelines"), 1)->valuestring, "lipsync");
  assert_int_equal(spn__roster_at(j), T0 + 100);
  cJSON_Delete(j);
  j = cJSON_Parse(r2);
  assert_null(cJSON_GetObjectItem(j, "gateway"));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "pipelines"))); /* any */
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "draining")));
  assert_string_equal(cJSON_GetObjectItem(j, "instance")->valuestring, "0123456789abcdef");
  cJSON_Delete(j);
  j = cJSON_Parse(r1); /* no instance given: none recorded */
  assert_null(cJSON_GetObjectItem(j, "instance"));
  cJSON_Delete(j);
  const char *names[] = {"gateway:gw:1", "worker:q", "worker:old", "worker:junk"};
  char *r3 = spn__roster_record(&q, T0 - 1);
  const char *recs[] = {r1, r2, r3, "{not json"};
  assert_int_equal(f->o->roster_put(f->q.impl, 4, names, recs, &err), SPN_OK);
  roster_seen_t seen = {0};
  assert_int_equal(f->o->roster_get(f->q.impl, NULL, roster_collect, &seen, &err), SPN_OK);
  assert_int_equal(seen.n, 4);
  assert_string_equal(roster_find(&seen, "gateway:gw:1"), r1);
  assert_string_equal(roster_find(&seen, "worker:q"), r2);
  /* one call: a record replaced, another removed */
  const char *names2[] = {"worker:q", "gateway:gw:1"}, *recs2[] = {r1, NULL};
  assert_int_equal(f->o->roster_put(f->q.impl, 2, names2, recs2, &err), SPN_OK);
  memset(&seen, 0, sizeof seen);
  assert_int_equal(f->o->roster_get(f->q.impl, NULL, roster_collect, &seen, &err), SPN_OK);
  assert_int_equal(seen.n, 3);
  assert_null(roster_find(&seen, "gateway:gw:1"));
  assert_string_equal(roster_find(&seen, "worker:q"), r1);
  /* one name: its record only, none for a name without one */
  memset(&seen, 0, sizeof seen);
  assert_int_equal(f->o->roster_get(f->q.impl, "worker:q", roster_collect, &seen, &err), SPN_OK);
  assert_int_equal(seen.n, 1);
  assert_string_equal(roster_find(&seen, "worker:q"), r1);
  memset(&seen, 0, sizeof seen);
  assert_int_equal(f->o->roster_get(f->q.impl, "gateway:gw:1", roster_collect, &seen, &err), SPN_OK);
  assert_int_equal(seen.n, 0);
  /* due: worker:old (at T0 - 1) and the unreadable one; worker:q (T0 + 100) stays */
  size_t removed = 0;
  assert_int_equal(spn__roster_prune(&f->q, T0 + SPN_ROSTER_KEEP_MS, &removed, &err), SPN_OK);
  assert_int_equal(removed, 2);
  memset(&seen, 0, sizeof seen);
  assert_int_equal(f->o->roster_get(f->q.impl, NULL, roster_collect, &seen, &err), SPN_OK);
  assert_int_equal(seen.n, 1);
  assert_non_null(roster_find(&seen, "worker:q"));
  assert_int_equal(spn__roster_prune(&f->q, T0 + SPN_ROSTER_KEEP_MS + 100, &removed, &err), SPN_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(spn__roster_prune(&f->q, T0 + SPN_ROSTER_KEEP_MS + 101, &removed, &err), SPN_OK);
  assert_int_equal(removed, 1);
  cJSON_free(r1);
  cJSON_free(r2);
  cJSON_free(r3);
}

/* SQLite has no roster: its one gateway lists its workers itself. */
static void test_sqlite_has_no_roster(void **state) {
  fx_t *f = *state;
  assert_null(f->o->roster_put);
  assert_null(f->o->roster_get);
  size_t removed = 7;
  assert_int_equal(spn__roster_prune(&f->q, T0, &removed, NULL), SPN_OK);
  assert_int_equal(removed, 0);
}

/* A queue written before the pipelines' ready sets were kept (or by such a
 * version during a rolling upgrade): its jobs have no field pl and are in
 * no pipeline's set, so a filtered lease finds none of them until the
 * sweep (or the next connect) rebuilds the sets from P ready; then each
 * goes to a worker of its pipeline. */
static void test_redis_lease_by_pipeline_of_an_older_queue(void **state) {
  fx_t *f = *state;
  int64_t a = submit_spec(f, "{\"pipeline\":\"enhance\"}", 0, NULL, 0, 1, T0);
  int64_t b = submit_spec(f, "{\"pipeline\":\"transcode\"}", 0, NULL, 0, 1, T0 + 1);
  for (int64_t id = a; id <= b; id++) {
    redisReply *r = redis_cmd(f->srv, "HDEL %sjob:%lld pl", f->prefix, (long long)id);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
  }
  redisReply *r = redis_cmd(f->srv, "DEL %sready:enhance %sready:transcode %spls", f->prefix, f->prefix, f->prefix);
  assert_int_equal(r->integer, 3);
  freeReplyObject(r);
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10), 0);
  assert_true(f->o->sweep(f->q.impl, T0 + 10, NULL, NULL, NULL) >= 0);
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10), b);
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10), 0);
  assert_int_equal(lease_of(f, "\nenhance\n", T0 + 10), a);
  /* the sets emptied with P ready */
  r = redis_cmd(f->srv, "EXISTS %sready:enhance %sready:transcode", f->prefix, f->prefix);
  assert_int_equal(r->integer, 0);
  freeReplyObject(r);
}

static long long redis_int(fx_t *f, const char *fmt, const char *a, const char *b) {
  redisReply *r = redis_cmd(f->srv, fmt, a, b);
  assert_non_null(r);
  long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  freeReplyObject(r);
  return v;
}

static long long sets_size(fx_t *f) {
  return redis_int(f, "ZCARD %sready:enhance", f->prefix, "") + redis_int(f, "ZCARD %sready:transcode", f->prefix, "");
}

/* The same repair on a big queue: no sweep repairs more than 1000 entries
 * (REPAIR_CHUNK), so none holds Redis for long; the sweeps that follow go
 * on where the last stopped, add every job to its pipeline's set, then drop
 * the entries whose job is not queued; once the sets add up, a sweep does
 * nothing more. */
static void test_redis_ready_repair_in_chunks(void **state) {
  fx_t *f = *state;
  int64_t first = 0;
  for (int i = 0; i < 2500; i++) {
    int64_t id = submit_spec(f, i % 5 < 3 ? "{\"pipeline\":\"enhance\"}" : "{\"pipeline\":\"transcode\"}", 0,
                             NULL, 0, 1, T0 + i);
    first = first ? first : id;
  }
  redisReply *r = redis_cmd(f->srv, "DEL %sready:enhance %sready:transcode", f->prefix, f->prefix);
  assert_int_equal(r->integer, 2);
  freeReplyObject(r);
  /* an entry whose job is not queued (what an older version's lease leaves) */
  r = redis_cmd(f->srv, "ZADD %sready:transcode -1 999999", f->prefix);
  freeReplyObject(r);
  assert_int_equal(sets_size(f), 1);
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10000), 0); /* the stale entry: skipped, removed */
  r = redis_cmd(f->srv, "ZADD %sready:transcode -1 999999", f->prefix);
  freeReplyObject(r);
  int sweeps = 0;
  long long after[3];
  do {
    assert_true(f->o->sweep(f->q.impl, T0 + 10000, NULL, NULL, NULL) >= 0);
    if (sweeps < 3)
      after[sweeps] = sets_size(f);
    sweeps++;
  } while (redis_int(f, "EXISTS %srepair", f->prefix, "") == 1 && sweeps < 50);
  assert_int_equal(after[0], 1001);
  assert_int_equal(after[1], 2001);
  assert_int_equal(after[2], 2501);
  /* 3 to add, then enhance (1500 entries) in 2 and transcode (1001) in 2 */
  assert_in_range(sweeps, 6, 9);
  assert_int_equal(sets_size(f), 2500);
  assert_int_equal(redis_int(f, "ZSCORE %sready:transcode 999999", f->prefix, ""), -1);
  /* added up: the next sweep starts no repair */
  assert_true(f->o->sweep(f->q.impl, T0 + 10000, NULL, NULL, NULL) >= 0);
  assert_int_equal(redis_int(f, "EXISTS %srepair", f->prefix, ""), 0);
  /* and a filtered lease finds the first transcode job (the 4th submitted) */
  assert_int_equal(lease_of(f, "\ntranscode\n", T0 + 10000), first + 3);
}

/* A job in a pipeline's set but not in P ready: an older version put it
 * back to wait its backoff (P delayed) without touching the set. A
 * filtered lease must not take it before its time; it drops the entry,
 * and the job is leased once its backoff is over. */
static void test_redis_filtered_lease_skips_a_job_not_ready(void **state) {
  fx_t *f = *state;
  int64_t a = submit_spec(f, "{\"pipeline\":\"enhance\"}", 0, NULL, 0, 2, T0);
  char id[24];
  snprintf(id, sizeof id, "%lld", (long long)a);
  assert_int_equal(redis_int(f, "ZREM %sready %s", f->prefix, id), 1);
  redisReply *r = redis_cmd(f->srv, "ZADD %sdelayed %lld %s", f->prefix, (long long)(T0 + 5000), id);
  freeReplyObject(r);
  assert_int_equal(lease_of(f, "\nenhance\n", T0 + 10), 0);
  assert_int_equal(redis_int(f, "ZCARD %sready:enhance", f->prefix, ""), 0);
  assert_int_equal(state_of(f, a), SPN_QSTATE_QUEUED);
  assert_int_equal(lease_of(f, "\nenhance\n", T0 + 5000), a);
}

#define SQ(t) cmocka_unit_test_setup_teardown(t, setup_sqlite, teardown)
#define RD(t) cmocka_unit_test_setup_teardown(t, setup_redis, teardown_redis)

int main(void) {
  const struct CMUnitTest sqlite_tests[] = {
      SQ(test_priorities_then_fifo),
      SQ(test_fifo_many),
      SQ(test_idempotency),
      SQ(test_lease_expiry_and_renew),
      cmocka_unit_test(test_backoff_bounds),
      cmocka_unit_test(test_warnings_render),
      SQ(test_dead_letter),
      SQ(test_deadline),
      SQ(test_cancel),
      SQ(test_release_owner),
      SQ(test_release_keeps_attempts),
      SQ(test_succeeded_progress_is_complete),
      SQ(test_batch_submit_order),
      SQ(test_transfers_add_up_over_attempts),
      cmocka_unit_test(test_sqlite_file_from_before_transfers),
      cmocka_unit_test(test_group_commit_and_durability),
      cmocka_unit_test(test_redis_url_errors),
      SQ(test_sqlite_queue_events_are_the_gateways),
      SQ(test_unpublished_through_the_wrapper),
      SQ(test_lease_by_pipeline),
      SQ(test_worker_presence),
      SQ(test_sqlite_has_no_roster),
      SQ(test_file_clashes),
      SQ(test_purge),
      SQ(test_purge_counted),
  };
  /* The same cases on Redis (lease expiry in real time). */
  const struct CMUnitTest redis_tests[] = {
      RD(test_priorities_then_fifo),
      RD(test_fifo_many),
      RD(test_idempotency),
      RD(test_redis_lease_expiry_and_renew),
      RD(test_dead_letter),
      RD(test_deadline),
      RD(test_cancel),
      RD(test_release_owner),
      RD(test_release_keeps_attempts),
      RD(test_succeeded_progress_is_complete),
      RD(test_batch_submit_order),
      RD(test_transfers_add_up_over_attempts),
      RD(test_redis_shared_by_two_clients),
      RD(test_redis_waiting_lag_is_the_number_of_queued_jobs),
      RD(test_redis_waiting_mirror_is_repaired),
      RD(test_redis_waiting_mirror_repaired_in_chunks),
      RD(test_redis_event_counters),
      RD(test_unpublished_through_the_wrapper),
      RD(test_lease_by_pipeline),
      RD(test_redis_lease_by_pipeline_of_an_older_queue),
      RD(test_worker_presence),
      RD(test_redis_roster),
      RD(test_redis_ready_repair_in_chunks),
      RD(test_redis_filtered_lease_skips_a_job_not_ready),
      RD(test_file_clashes),
      RD(test_purge),
      RD(test_purge_old_queue),
      RD(test_purge_counted),
  };
  int rc = cmocka_run_group_tests_name("sqlite", sqlite_tests, NULL, NULL);
  rc += cmocka_run_group_tests_name("redis", redis_tests, redis_up, redis_down);
  return rc;
}
