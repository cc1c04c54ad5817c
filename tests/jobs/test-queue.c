/* test-queue.c — the durable job queue (SQLite backend) through its vtable:
 * priorities, FIFO, idempotency keys, leases and their expiry, backoff,
 * dead-lettering, deadlines, cancel, transitions and durability. Time is
 * passed explicitly, so every expectation is computed from the inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "jobs-internal.h"

#define T0 1700000000000LL
#define SPEC "{\"pipeline\":\"copy\"}"

typedef struct fx {
  spn_queue_t q;
  const spn_queue_ops_t *o;
} fx_t;

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  spn_queue_config_t c = {.path = ":memory:", .backoff_base_ms = 1000, .backoff_max_ms = 8000, .seed = 42};
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_queue_sqlite_open(&c, &f->q, &err), SPN_OK);
  f->o = f->q.ops;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  spn_queue_free(&f->q);
  free(f);
  return 0;
}

static int64_t submit(fx_t *f, int32_t prio, const char *key, int64_t deadline, uint32_t max_att,
                      int64_t now) {
  spn_queue_submit_t s = {.spec_json = SPEC, .priority = prio, .idem_key = key,
                          .deadline_ms = deadline, .max_attempts = max_att};
  int64_t id = 0;
  bool existed = true;
  assert_int_equal(f->o->submit(f->q.impl, &s, now, &id, &existed, NULL), SPN_OK);
  assert_false(existed);
  return id;
}

/* Lease and return the id (0 when none is ready). */
static int64_t lease(fx_t *f, const char *owner, int64_t now, uint32_t *attempt) {
  spn_queue_job_t j;
  int32_t rc = f->o->lease(f->q.impl, owner, now, 1000, &j, NULL);
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
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "w1", 1, 0, T0 + 2001, NULL), SPN_ESTATE);
  /* Not leasable before its backoff, leasable after, as attempt 2. */
  assert_int_equal(lease(f, "w2", nb - 1, NULL), 0);
  assert_int_equal(lease(f, "w2", nb, &att), id);
  assert_int_equal(att, 2);
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "w2", 1, 0, nb + 1, NULL), SPN_ESTATE);
  assert_int_equal(f->o->complete(f->q.impl, id, 2, "w2", 1.5, 0.25, nb + 1, NULL), SPN_OK);
  assert_int_equal(f->o->get(f->q.impl, id, &j, NULL), SPN_OK);
  assert_int_equal(j.state, SPN_QSTATE_SUCCEEDED);
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
    assert_int_equal((f->o->fail)(f->q.impl, id, att, "w", reasons[i], false, 0.5, 0, now, &st, NULL), SPN_OK);
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
  assert_int_equal((f->o->fail)(f->q.impl, one, att, "w", "nope", false, 0, 0, now, &st, NULL), SPN_OK);
  assert_int_equal(st, SPN_QSTATE_FAILED);
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
  assert_int_equal((f->o->fail)(f->q.impl, r, att, "w", "stopped", false, 0, 0, T0 + 4, &st, NULL), SPN_OK);
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
  assert_int_equal(f->o->complete(f->q.impl, id, 1, "g2", 0, 0, T0 + 3, NULL), SPN_OK);
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
  char aux[64];
  unlink(path);
  snprintf(aux, sizeof aux, "%s-wal", path);
  unlink(aux);
  snprintf(aux, sizeof aux, "%s-shm", path);
  unlink(aux);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_priorities_then_fifo, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fifo_many, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lease_expiry_and_renew, setup, teardown),
      cmocka_unit_test(test_backoff_bounds),
      cmocka_unit_test_setup_teardown(test_dead_letter, setup, teardown),
      cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_release_owner, setup, teardown),
      cmocka_unit_test_setup_teardown(test_release_keeps_attempts, setup, teardown),
      cmocka_unit_test(test_group_commit_and_durability),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
