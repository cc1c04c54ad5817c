/* test-exec.c — running one job (core/jobs/exec.c): temporaries, the
 * publication marker, and the re-run of a job whose earlier attempt had
 * published (its lease was lost between the renames and the queue's record).
 * Such a re-run does not run the job again, and must report what the
 * publishing attempt reported: its progress, seconds, transfers and
 * warnings. Without them the job's record said "1 of 1" (the queue's value
 * for a job that never reported progress) and lost its warnings. And a job
 * whose output folder is not there on the worker fails before it runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jobs-internal.h"

enum { CHUNKS = 7 };

typedef struct runner_state {
  int runs;
} runner_state_t;

static int32_t chunks_run(void *data, const spn_job_spec_t *job, spn_job_ctx_t *ctx, spn_error_t *err) {
  runner_state_t *rs = data;
  rs->runs++;
  FILE *f = fopen(spn_job_ctx_output_tmp(ctx, 0), "w");
  if (!f)
    return spn_error_set(err, SPN_EIO, "cannot write");
  for (uint64_t i = 0; i <= CHUNKS; i++) {
    if (i)
      fprintf(f, "chunk %llu of job %lld\n", (unsigned long long)i, (long long)job->id);
    spn_job_ctx_progress(ctx, i, CHUNKS);
  }
  fclose(f);
  spn_job_ctx_warn(ctx, "audio is 0.4 s shorter than the video");
  spn_job_ctx_add_gpu_seconds(ctx, 0.25);
  spn_job_ctx_add_transfers(ctx, (const uint64_t[4]){1000, 2000, 0, 0}, (const uint64_t[4]){10, 20, 0, 0});
  return SPN_OK;
}

static bool chunks_has(void *data, const char *name) {
  (void)data;
  return !strcmp(name, "chunks");
}

typedef struct progress_seen {
  int calls;
  uint64_t done, total;
} progress_seen_t;

static void on_progress(void *user, uint64_t done, uint64_t total) {
  progress_seen_t *p = user;
  p->calls++;
  p->done = done;
  p->total = total;
}

typedef struct fixture {
  char dir[64];
  char out[128], marker[128];
  runner_state_t rs;
  spn_job_runner_t runner;
} fixture_t;

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/spn-exec-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->out, sizeof f->out, "%s/out.txt", f->dir);
  snprintf(f->marker, sizeof f->marker, "%s/.spn-42.published", f->dir);
  f->runner = (spn_job_runner_t){.data = &f->rs, .run = chunks_run, .has_pipeline = chunks_has};
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  free(f);
  return 0;
}

static void spec_of(fixture_t *f, uint32_t attempt, spn_job_spec_t *js) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "pipeline", "chunks");
  cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "outputs"), "out", f->out);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__job_spec_from_json(o, 42, attempt, js, &err), SPN_OK);
  cJSON_Delete(o);
}

static void execute(fixture_t *f, uint32_t attempt, progress_seen_t *seen, spn_exec_result_t *res) {
  spn_job_spec_t js;
  spec_of(f, attempt, &js);
  int cancel = 0;
  spn__job_execute(&f->runner, &js, &cancel, on_progress, seen, res);
  spn__job_spec_free(&js);
}

static void write_text(const char *path, const char *text) {
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Attempt 1 publishes and keeps its marker (the queue never recorded it);
 * attempt 2 finds the marker and reports attempt 1's figures. */
static void test_a_rerun_of_a_published_job_reports_what_published_it(void **state) {
  fixture_t *f = *state;
  progress_seen_t p1 = {0};
  spn_exec_result_t r1;
  execute(f, 1, &p1, &r1);
  assert_int_equal(r1.status, SPN_OK);
  assert_false(r1.published_before);
  assert_int_equal(f->rs.runs, 1);
  assert_true(exists(f->out));
  assert_true(exists(f->marker));
  assert_int_equal(p1.done, CHUNKS);
  assert_int_equal(p1.total, CHUNKS);

  progress_seen_t p2 = {0};
  spn_exec_result_t r2;
  execute(f, 2, &p2, &r2);
  assert_int_equal(r2.status, SPN_OK);
  assert_true(r2.published_before);
  assert_int_equal(f->rs.runs, 1); /* not run again */
  assert_int_equal(p2.calls, 1);
  assert_int_equal(p2.done, CHUNKS);
  assert_int_equal(p2.total, CHUNKS);
  assert_string_equal(r2.warnings, r1.warnings);
  assert_non_null(strstr(r2.warnings, "0.4 s shorter"));
  assert_true(r2.gpu_s == 0.25);
  assert_true(r2.compute_s >= 0 && r2.compute_s < r1.compute_s + 1e-5 && r2.compute_s > r1.compute_s - 1e-5);
  assert_int_equal(r2.xfer.bytes[0], 1000);
  assert_int_equal(r2.xfer.bytes[1], 2000);
  assert_int_equal(r2.xfer.ns[1], 20);
}

/* Attempt 1 was killed after writing `marker` with its temporary output
 * (`text`, at tmp) not yet renamed; attempt 2 runs and rolls forward. */
static void rerun_after_a_kill(fixture_t *f, const char *text, const char *marker, char tmp[160],
                               progress_seen_t *p, spn_exec_result_t *r) {
  snprintf(tmp, 160, "%s/.out.spn-42-1.tmp.txt", f->dir);
  write_text(tmp, text);
  write_text(f->marker, marker);
  execute(f, 2, p, r);
  assert_int_equal(r->status, SPN_OK);
  assert_true(r->published_before);
}

/* A worker killed between the marker and its renames: the re-run renames
 * the killed attempt's temporary into place. A marker of the first format
 * (only "attempt N") still rolls forward, with nothing to report. */
static void test_a_rerun_finishes_the_renames_of_an_old_marker(void **state) {
  fixture_t *f = *state;
  char tmp[160];
  progress_seen_t p = {0};
  spn_exec_result_t r;
  rerun_after_a_kill(f, "from attempt 1\n", "attempt 1\n", tmp, &p, &r);
  assert_int_equal(f->rs.runs, 0);
  assert_int_equal(p.calls, 0);
  assert_string_equal(r.warnings, "");
  assert_false(exists(tmp));
  FILE *fp = fopen(f->out, "r");
  char line[64] = "";
  assert_non_null(fp);
  assert_non_null(fgets(line, sizeof line, fp));
  fclose(fp);
  assert_string_equal(line, "from attempt 1\n");
}

/* Fields of the report that do not parse are left out; the rest still
 * count. A report line that is not JSON reports nothing. */
static void test_a_damaged_report_is_left_out(void **state) {
  fixture_t *f = *state;
  char tmp[160];
  progress_seen_t p = {0};
  spn_exec_result_t r;
  rerun_after_a_kill(f, "x\n",
                     "attempt 1\n{\"done\":4,\"total\":9,\"compute_s\":-1,\"gpu_s\":\"2\","
                     "\"transfers\":{\"h2d\":{\"bytes\":-5}},\"warnings\":[\"a\",7]}\n",
                     tmp, &p, &r);
  assert_int_equal(p.calls, 1);
  assert_int_equal(p.done, 4);
  assert_int_equal(p.total, 9);
  assert_true(r.compute_s == 0 && r.gpu_s == 0);
  assert_int_equal(r.xfer.bytes[0], 0);
  assert_string_equal(r.warnings, "");

  unlink(f->out);
  p = (progress_seen_t){0};
  rerun_after_a_kill(f, "x\n", "attempt 1\nprogress 4 9\n", tmp, &p, &r);
  assert_int_equal(p.calls, 0);
  assert_true(r.compute_s == 0 && r.gpu_s == 0);
  assert_string_equal(r.warnings, "");
  assert_int_equal(f->rs.runs, 0);
}

/* A marker that names no attempt, or a later attempt than this one, is not
 * this job's publication: it is removed and the job runs. */
static void test_an_unusable_marker_runs_the_job(void **state) {
  fixture_t *f = *state;
  const char *bad[] = {"attempt x\nprogress 1 1\n", "attempt 5\n", "progress 7 7\n"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    write_text(f->marker, bad[i]);
    progress_seen_t p = {0};
    spn_exec_result_t r;
    execute(f, 2, &p, &r);
    assert_int_equal(r.status, SPN_OK);
    assert_false(r.published_before);
    assert_int_equal(f->rs.runs, (int)i + 1);
    assert_int_equal(p.done, CHUNKS);
    unlink(f->marker);
  }
}

/* An output whose folder is missing on the worker, or is a file: the job
 * fails before the runner runs, naming the output as submitted (not the
 * temporary), and leaves nothing; once the folder is there it runs. */
static void test_an_output_folder_missing_here_fails_before_the_run(void **state) {
  fixture_t *f = *state;
  char sub[96], want[256];
  snprintf(sub, sizeof sub, "%s/sub", f->dir);
  snprintf(f->out, sizeof f->out, "%s/out.txt", sub);
  const char *why[] = {"No such file or directory", "Not a directory"};
  for (int i = 0; i < 2; i++) {
    if (i == 1)
      write_text(sub, "a file where the folder should be\n");
    progress_seen_t p = {0};
    spn_exec_result_t r;
    execute(f, 1, &p, &r);
    assert_int_equal(r.status, SPN_ENOENT);
    snprintf(want, sizeof want, "job 42: output out=%s: directory: %s (on this worker)", f->out, why[i]);
    assert_string_equal(r.error, want);
    assert_int_equal(f->rs.runs, 0);
    assert_int_equal(p.calls, 0);
  }
  unlink(sub);
  assert_int_equal(mkdir(sub, 0755), 0);
  progress_seen_t p = {0};
  spn_exec_result_t r;
  execute(f, 1, &p, &r);
  assert_int_equal(r.status, SPN_OK);
  assert_int_equal(f->rs.runs, 1);
  assert_true(exists(f->out));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_a_rerun_of_a_published_job_reports_what_published_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_rerun_finishes_the_renames_of_an_old_marker, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_damaged_report_is_left_out, setup, teardown),
      cmocka_unit_test_setup_teardown(test_an_unusable_marker_runs_the_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_an_output_folder_missing_here_fails_before_the_run, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
