/* test-log.c — the per-runtime logger: JSON lines, and the hold a loop puts
 * on its lines while it sends replies (spn__log_hold / spn__log_release). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log-internal.h"
#include "spindle/runtime.h"

typedef struct fixture {
  int fds[2];
  spn__logger_t *lg;
} fixture_t;

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(pipe(f->fds), 0);
  /* Big enough for every test's lines, so no write blocks. */
  fcntl(f->fds[1], F_SETPIPE_SZ, 1 << 20);
  fcntl(f->fds[0], F_SETFL, O_NONBLOCK);
  assert_int_equal(spn__logger_new(SPN_LOG_DEBUG, SPN_LOG_FORMAT_JSON, f->fds[1], &f->lg), SPN_OK);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  spn__logger_free(&f->lg);
  assert_null(f->lg);
  close(f->fds[0]);
  close(f->fds[1]);
  free(f);
  return 0;
}

/* Everything written so far (NUL-terminated; caller frees). */
static char *drain(fixture_t *f) {
  size_t cap = 1 << 21, n = 0;
  char *buf = malloc(cap + 1);
  assert_non_null(buf);
  for (;;) {
    ssize_t r = read(f->fds[0], buf + n, cap - n);
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  buf[n] = 0;
  return buf;
}

/* The "msg" of every line, in order; asserts that each line is one JSON
 * object. Returns the number of lines. */
static size_t messages(char *text, char msgs[][64], size_t max) {
  size_t k = 0;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    cJSON *o = cJSON_Parse(line);
    assert_non_null(o);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "msg");
    assert_true(cJSON_IsString(m));
    if (k < max)
      snprintf(msgs[k], 64, "%s", m->valuestring);
    k++;
    cJSON_Delete(o);
  }
  return k;
}

static void test_json_fields(void **state) {
  fixture_t *f = *state;
  spn__log_fields_t lf = SPN__LOG_FIELDS_INIT;
  lf.job_id = 42;
  lf.event = "submitted";
  lf.attempt = 2;
  spn__log_f(f->lg, SPN_LOG_INFO, &lf, "quote \" and\nnewline");
  char *text = drain(f);
  cJSON *o = cJSON_Parse(text);
  assert_non_null(o);
  assert_string_equal(cJSON_GetObjectItem(o, "msg")->valuestring, "quote \" and\nnewline");
  assert_int_equal(cJSON_GetObjectItem(o, "job_id")->valuedouble, 42);
  assert_string_equal(cJSON_GetObjectItem(o, "event")->valuestring, "submitted");
  assert_int_equal(cJSON_GetObjectItem(o, "attempt")->valuedouble, 2);
  assert_null(cJSON_GetObjectItem(o, "duration_ms"));
  cJSON_Delete(o);
  free(text);
}

static void test_hold_defers_until_release(void **state) {
  fixture_t *f = *state;
  spn__log_hold(f->lg);
  spn__log_f(f->lg, SPN_LOG_INFO, NULL, "first");
  spn__log_f(f->lg, SPN_LOG_ERROR, NULL, "second");
  char *text = drain(f);
  assert_string_equal(text, ""); /* nothing written while held */
  free(text);
  spn__log_release(f->lg);
  text = drain(f);
  char msgs[4][64];
  assert_int_equal(messages(text, msgs, 4), 2);
  assert_string_equal(msgs[0], "first");
  assert_string_equal(msgs[1], "second");
  free(text);
  /* Released: the next line goes out at once. */
  spn__log_f(f->lg, SPN_LOG_INFO, NULL, "third");
  text = drain(f);
  assert_int_equal(messages(text, msgs, 4), 1);
  assert_string_equal(msgs[0], "third");
  free(text);
  /* A release without a hold, and a second hold by the same thread, change
   * nothing. */
  spn__log_release(f->lg);
  spn__log_hold(f->lg);
  spn__log_hold(f->lg);
  spn__log_f(f->lg, SPN_LOG_INFO, NULL, "fourth");
  spn__log_release(f->lg);
  text = drain(f);
  assert_int_equal(messages(text, msgs, 4), 1);
  free(text);
}

static void *other_thread(void *arg) {
  fixture_t *f = arg;
  spn__log_f(f->lg, SPN_LOG_INFO, NULL, "from another thread");
  /* Not the holder: neither takes nor ends the hold. */
  spn__log_hold(f->lg);
  spn__log_release(f->lg);
  return NULL;
}

static void test_other_threads_not_held(void **state) {
  fixture_t *f = *state;
  spn__log_hold(f->lg);
  spn__log_f(f->lg, SPN_LOG_INFO, NULL, "held");
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_thread, f), 0);
  pthread_join(t, NULL);
  char *text = drain(f);
  char msgs[4][64];
  assert_int_equal(messages(text, msgs, 4), 1);
  assert_string_equal(msgs[0], "from another thread");
  free(text);
  spn__log_release(f->lg);
  text = drain(f);
  assert_int_equal(messages(text, msgs, 4), 1);
  assert_string_equal(msgs[0], "held");
  free(text);
}

/* More than the hold keeps (64 KiB): what is held is written early, and
 * every line still arrives whole, in order, exactly once. */
static void test_hold_overflow_and_whole_lines(void **state) {
  fixture_t *f = *state;
  enum { N = 2000 };
  char pad[301];
  memset(pad, 'x', 300);
  pad[300] = 0;
  spn__log_hold(f->lg);
  for (int i = 0; i < N; i++)
    spn__log_f(f->lg, SPN_LOG_INFO, NULL, "%05d %s", i, pad);
  char *early = drain(f);
  size_t early_len = strlen(early);
  assert_true(early_len > 0); /* beyond 64 KiB: not held */
  spn__log_release(f->lg);
  char *late = drain(f);
  char *all = malloc(early_len + strlen(late) + 1);
  assert_non_null(all);
  strcpy(all, early);
  strcat(all, late);
  static char msgs[N][64];
  assert_int_equal(messages(all, msgs, N), N);
  for (int i = 0; i < N; i++)
    assert_int_equal(atoi(msgs[i]), i);
  free(early);
  free(late);
  free(all);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_json_fields, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hold_defers_until_release, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_threads_not_held, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hold_overflow_and_whole_lines, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
