/* test-queue-segments.c — segments in the job queue, on both backends
 * (SQLite, and Redis on a redis-server this test starts; docs/jobs.md,
 * "Segments"): a segmented job is not leased until every segment has
 * succeeded; each segment's success is its checkpoint, committed with the
 * segment's own state and counted once however many times it is reported;
 * a segment that ends failed or cancelled fails its job and cancels the
 * queued siblings; cancelling the job cancels its segments; the count
 * survives closing and reopening the queue, so a restarted gateway resumes
 * with only the unfinished segments. Time is passed explicitly, except
 * Redis lease expiry (pending-entry idle time on the server's clock: real,
 * short waits). On Redis each case ends with the waiting mirror (the KEDA
 * signal) equal to the queued jobs, segmented ones included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "jobs-internal.h"
#include "redis-fixture.h"
#include "sqlite-files.h"

#define T0 1700000000000LL
#define PARENT "{\"pipeline\":\"transcode\",\"segments\":{}}"
#define CHILD "{\"pipeline\":\"transcode\"}"
#define REDIS_LEASE_MS 300

typedef struct fx {
  spn_queue_t q;
  server_t *srv; /* NULL: SQLite */
  char prefix[32];
  char path[64];
} fx_t;

/* (Re)open the case's queue: the same file or the same Redis keys. */
static void reopen(fx_t *f) {
  spn_queue_config_t c = {.backoff_base_ms = 100, .backoff_max_ms = 100, .seed = 7};
  spn_error_t err = SPN_ERROR_INIT;
  if (f->srv) {
    c.backend = "redis";
    c.url = f->srv->url;
    c.prefix = f->prefix;
    c.lease_ms = REDIS_LEASE_MS;
  } else {
    c.path = f->path;
  }
  int32_t rc = spn_queue_open(&c, &f->q, &err);
  if (rc != SPN_OK)
    fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(rc, SPN_OK);
}

static int setup_sqlite(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  snprintf(f->path, sizeof f->path, "/tmp/spn-qseg-XXXXXX");
  int fd = mkstemp(f->path);
  assert_true(fd >= 0);
  close(fd);
  unlink(f->path);
  reopen(f);
  *state = f;
  return 0;
}

static int setup_redis(void **state) {
  server_t *srv = *state;
  if (!srv || !srv->pid)
    return -1; /* no redis-server: the group was skipped */
  fx_t *f = calloc(1, sizeof *f);
  f->srv = srv;
  snprintf(f->prefix, sizeof f->prefix, "seg%d:", ++srv->n);
  reopen(f);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  int rc = 0;
  if (f->srv) {
    if (!waiting_mirror_ok(f->srv, f->prefix, &f->q))
      rc = -1;
    *state = f->srv;
  } else {
    remove_sqlite_files(f->path);
    *state = NULL;
  }
  spn_queue_free(&f->q);
  free(f);
  return rc;
}

/* Let the leases taken so far expire: on Redis that is real idle time. */
static void leases_expire(fx_t *f) {
  if (f->srv)
    usleep((REDIS_LEASE_MS + 150) * 1000);
}

/* A job of n segments: parent id in *parent, segment ids in kids[]. */
static void submit_segmented(spn_queue_t *q, uint32_t n, uint32_t max_attempts, int64_t *parent, int64_t *kids) {
  spn_error_t err = SPN_ERROR_INIT;
  bool ex;
  spn_queue_submit_t p = {.spec_json = PARENT, .max_attempts = max_attempts, .pending = n};
  assert_int_equal(q->ops->submit(q->impl, &p, T0, parent, &ex, &err), SPN_OK);
  for (uint32_t k = 0; k < n; k++) {
    spn_queue_submit_t c = {.spec_json = CHILD, .max_attempts = max_attempts, .parent = *parent, .seg_index = (int32_t)k};
    assert_int_equal(q->ops->submit(q->impl, &c, T0, &kids[k], &ex, &err), SPN_OK);
  }
}

static int64_t lease(spn_queue_t *q, const char *owner, int64_t now, uint32_t *attempt) {
  spn_queue_job_t j;
  int32_t rc = q->ops->lease(q->impl, owner, NULL, now, 10000, &j, NULL);
  if (rc == SPN_EAGAIN)
    return 0;
  assert_int_equal(rc, SPN_OK);
  int64_t id = j.id;
  if (attempt)
    *attempt = j.attempts;
  spn__queue_job_clear(&j);
  return id;
}

static spn_queue_job_t get(spn_queue_t *q, int64_t id) {
  spn_queue_job_t j;
  assert_int_equal(q->ops->get(q->impl, id, &j, NULL), SPN_OK);
  return j;
}

static uint32_t pending(spn_queue_t *q, int64_t id) {
  spn_queue_job_t j = get(q, id);
  uint32_t p = j.pending;
  spn__queue_job_clear(&j);
  return p;
}

static spn_queue_state_t state_of(spn_queue_t *q, int64_t id) {
  spn_queue_job_t j = get(q, id);
  spn_queue_state_t s = j.state;
  spn__queue_job_clear(&j);
  return s;
}

typedef struct kids_seen {
  int64_t ids[8];
  int32_t idx[8];
  int n;
} kids_seen_t;

static void on_child(void *user, const spn_queue_job_t *j) {
  kids_seen_t *k = user;
  k->ids[k->n] = j->id;
  k->idx[k->n++] = j->seg_index;
}

static void test_parent_waits_for_every_segment_then_is_leased(void **state) {
  fx_t *f = *state;
  spn_queue_t q = f->q;
  int64_t parent, kids[3];
  submit_segmented(&q, 3, 2, &parent, kids);
  kids_seen_t seen = {0};
  assert_int_equal(q.ops->children(q.impl, parent, on_child, &seen, NULL), SPN_OK);
  assert_int_equal(seen.n, 3);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(seen.ids[k], kids[k]);
    assert_int_equal(seen.idx[k], k);
  }
  /* The parent was submitted first, but only its segments are leased. */
  uint32_t att[3];
  for (int k = 0; k < 3; k++)
    assert_int_equal(lease(&q, "w", T0 + 1, &att[k]), kids[k]);
  assert_int_equal(lease(&q, "w", T0 + 1, NULL), 0);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(q.ops->complete(q.impl, kids[k], att[k], "w", 1, 0, NULL, NULL, T0 + 2, NULL), SPN_OK);
    assert_int_equal(pending(&q, parent), 2 - k);
    assert_int_equal(lease(&q, "w", T0 + 3, NULL), k == 2 ? parent : 0);
  }
  assert_int_equal(state_of(&q, parent), SPN_QSTATE_RUNNING);
}

static void test_a_segment_finished_twice_is_committed_once(void **state) {
  fx_t *f = *state;
  spn_queue_t q = f->q;
  int64_t parent, kids[2];
  submit_segmented(&q, 2, 3, &parent, kids);
  uint32_t a1 = 0;
  assert_int_equal(lease(&q, "frozen", T0, &a1), kids[0]);
  /* Its worker froze: the lease expired and another worker ran it again. */
  leases_expire(f);
  assert_int_equal(q.ops->sweep(q.impl, T0 + 20000, NULL, NULL, NULL), 1);
  uint32_t a2 = 0;
  assert_int_equal(lease(&q, "w2", T0 + 30000, &a2), kids[0]);
  assert_int_equal(a2, 2);
  assert_int_equal(q.ops->complete(q.impl, kids[0], a2, "w2", 1, 0, NULL, NULL, T0 + 30001, NULL), SPN_OK);
  assert_int_equal(pending(&q, parent), 1);
  /* The frozen worker wakes up and reports the same segment done: refused,
   * and the count does not move. Nor does a second report of the live one. */
  assert_int_equal(q.ops->complete(q.impl, kids[0], a1, "frozen", 1, 0, NULL, NULL, T0 + 30002, NULL), SPN_ESTATE);
  assert_int_equal(q.ops->complete(q.impl, kids[0], a2, "w2", 1, 0, NULL, NULL, T0 + 30003, NULL), SPN_ESTATE);
  assert_int_equal(pending(&q, parent), 1);
  assert_int_equal(lease(&q, "w2", T0 + 30004, NULL), kids[1]);
}

static void test_a_dead_segment_fails_its_job_and_stops_the_queued_ones(void **state) {
  fx_t *f = *state;
  spn_queue_t q = f->q;
  int64_t parent, kids[3];
  submit_segmented(&q, 3, 1, &parent, kids);
  uint32_t a = 0;
  assert_int_equal(lease(&q, "w", T0, &a), kids[0]);
  spn_queue_state_t st;
  assert_int_equal((q.ops->fail)(q.impl, kids[0], a, "w", "in.mp4: corrupt", false, 0, 0, NULL, T0 + 1, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_FAILED);
  spn_queue_job_t p = get(&q, parent);
  assert_int_equal(p.state, SPN_QSTATE_FAILED);
  assert_non_null(strstr(p.reason, "segment 0"));
  assert_non_null(strstr(p.reason, "in.mp4: corrupt"));
  spn__queue_job_clear(&p);
  assert_int_equal(state_of(&q, kids[1]), SPN_QSTATE_CANCELLED);
  assert_int_equal(state_of(&q, kids[2]), SPN_QSTATE_CANCELLED);
  assert_int_equal(lease(&q, "w", T0 + 2, NULL), 0);
}

static void test_a_retried_segment_does_not_fail_its_job(void **state) {
  fx_t *f = *state;
  spn_queue_t q = f->q;
  int64_t parent, kids[2];
  submit_segmented(&q, 2, 2, &parent, kids);
  uint32_t a = 0;
  assert_int_equal(lease(&q, "w", T0, &a), kids[0]);
  spn_queue_state_t st;
  assert_int_equal((q.ops->fail)(q.impl, kids[0], a, "w", "flaky", false, 0, 0, NULL, T0 + 1, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_QUEUED);
  assert_int_equal(state_of(&q, parent), SPN_QSTATE_QUEUED);
  assert_int_equal(pending(&q, parent), 2);
}

static void test_cancelling_the_job_cancels_its_segments(void **state) {
  fx_t *f = *state;
  spn_queue_t q = f->q;
  int64_t parent, kids[2];
  submit_segmented(&q, 2, 1, &parent, kids);
  uint32_t a = 0;
  assert_int_equal(lease(&q, "w", T0, &a), kids[0]);
  spn_queue_state_t st;
  assert_int_equal(q.ops->cancel(q.impl, parent, T0 + 1, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  assert_int_equal(state_of(&q, kids[1]), SPN_QSTATE_CANCELLED);
  /* the running one is asked to stop: its renew says so and it ends cancelled */
  spn_queue_job_t k = get(&q, kids[0]);
  assert_true(k.cancel_requested);
  spn__queue_job_clear(&k);
  assert_int_equal((q.ops->fail)(q.impl, kids[0], a, "w", "stopped", false, 0, 0, NULL, T0 + 2, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_CANCELLED);
  assert_int_equal(state_of(&q, parent), SPN_QSTATE_CANCELLED);
}

static void test_checkpoints_survive_a_restart(void **state) {
  fx_t *f = *state;
  int64_t parent, kids[3];
  submit_segmented(&f->q, 3, 2, &parent, kids);
  uint32_t a0 = 0, a1 = 0;
  assert_int_equal(lease(&f->q, "w", T0, &a0), kids[0]);
  assert_int_equal(lease(&f->q, "w", T0, &a1), kids[1]);
  assert_int_equal(f->q.ops->complete(f->q.impl, kids[0], a0, "w", 1, 0, NULL, NULL, T0 + 1, NULL), SPN_OK);
  spn_queue_free(&f->q); /* the gateway dies with segment 1 running */
  reopen(f);
  assert_int_equal(pending(&f->q, parent), 2);
  assert_int_equal(state_of(&f->q, kids[0]), SPN_QSTATE_SUCCEEDED);
  /* the lost lease expires; segment 1 runs again, segment 0 never */
  leases_expire(f);
  assert_int_equal(f->q.ops->sweep(f->q.impl, T0 + 20000, NULL, NULL, NULL), 1);
  uint32_t att;
  assert_int_equal(lease(&f->q, "w", T0 + 30000, &att), kids[1]);
  assert_int_equal(att, 2);
  assert_int_equal(lease(&f->q, "w", T0 + 30000, &att), kids[2]);
  assert_int_equal(lease(&f->q, "w", T0 + 30000, NULL), 0);
}

#define SQ(t) cmocka_unit_test_setup_teardown(t, setup_sqlite, teardown)
#define RD(t) cmocka_unit_test_setup_teardown(t, setup_redis, teardown)
#define CASES(X)                                                                                              \
  X(test_parent_waits_for_every_segment_then_is_leased), X(test_a_segment_finished_twice_is_committed_once),    \
      X(test_a_dead_segment_fails_its_job_and_stops_the_queued_ones),                                          \
      X(test_a_retried_segment_does_not_fail_its_job), X(test_cancelling_the_job_cancels_its_segments),         \
      X(test_checkpoints_survive_a_restart)

int main(void) {
  const struct CMUnitTest sqlite_tests[] = {CASES(SQ)};
  const struct CMUnitTest redis_tests[] = {CASES(RD)};
  int rc = cmocka_run_group_tests_name("sqlite", sqlite_tests, NULL, NULL);
  rc += cmocka_run_group_tests_name("redis", redis_tests, redis_up, redis_down);
  return rc;
}
