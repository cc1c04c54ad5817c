/* test-runtime-edges.c — the same pipeline over inproc, tcp and ipc edges
 * gives the same frames (serialized messages carry tensors and metadata);
 * garbage sent to a tcp mailbox is refused without harm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <zmq.h>

#include "rt-kinds.h"

/* Runs src -> pass (x replicas on cpu:2) -> sink with the given endpoints on
 * pass and sink; returns the collector's frames for two jobs. */
static void run_chain(const char *pass_ep, const char *sink_ep, uint32_t pass_instances) {
  spn_runtime_t *rt = rt_new("cpu:2", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "edges");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 2000;
  src->with_tensor = true;
  src->col = &col;
  rt_cfg_t *pass = rt_spec_stage(&b, "pass", &rt_kind_pass, h);
  pass->col = &col;
  pass->delay_us_max = pass_instances > 1 ? 100 : 0;
  b.stages[1].endpoint = (char *)pass_ep;
  b.stages[1].instances = pass_instances;
  b.stages[1].instance_devices = (char *)"all";
  b.stages[1].edge_capacity = 16;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[2].endpoint = (char *)sink_ep;
  b.stages[2].edge_capacity = 16;
  b.stages[2].max_batch = 4;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err) != SPN_OK)
    fail_msg("pipeline: %s", err.msg);
  rt_done_t d[2];
  spn_job_t *jobs[2];
  for (int i = 0; i < 2; i++) {
    spn_job_callbacks_t cb = rt_callbacks(&d[i]);
    spn_job_params_t p = SPN_JOB_PARAMS_INIT;
    p.job_id = 40 + (uint64_t)i;
    assert_int_equal(spn_job_start(pipe, &p, &cb, &jobs[i], &err), SPN_OK);
  }
  for (int i = 0; i < 2; i++) {
    assert_int_equal(spn_job_wait(jobs[i], &err), SPN_OK);
    char why[256] = "";
    if (!rt_col_check(&col, 40 + (uint64_t)i, 2000, why, sizeof why))
      fail_msg("%s (pass %s, sink %s)", why, pass_ep ? pass_ep : "inproc", sink_ep ? sink_ep : "inproc");
    spn_job_free(&jobs[i]);
  }
  /* The tensors and the metadata arrived intact (checked per frame). */
  assert_int_equal(atomic_load(&col.tensor_bad), 0);
  uint32_t cap = 0;
  assert_true(spn__pipeline_max_in_flight(pipe, 2, &cap) <= cap);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

static void test_inproc(void **st) {
  (void)st;
  run_chain(NULL, NULL, 1);
}

static void test_tcp(void **st) {
  (void)st;
  run_chain("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 1);
}

static void test_tcp_fanout(void **st) {
  (void)st;
  run_chain("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 2);
}

static void test_ipc(void **st) {
  (void)st;
  const char *tmp = getenv("TMPDIR");
  char a[256], b[256];
  snprintf(a, sizeof a, "ipc://%s/spindle-test-%d-pass", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  snprintf(b, sizeof b, "ipc://%s/spindle-test-%d-sink", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  run_chain(a, b, 2);
  /* The socket files are gone with the pipeline. */
  char path[300];
  for (int r = 0; r < 4; r++) {
    snprintf(path, sizeof path, "%s.%d", a + 6, r);
    assert_int_equal(access(path, F_OK), -1);
  }
  assert_int_equal(access(b + 6, F_OK), -1);
}

/* Garbage on a tcp mailbox: logged and dropped; the job still succeeds. */
static void test_garbage_frame(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "garbage");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 300;
  src->gap_us = 500;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  /* A fixed port from the dynamic range derived from the pid. */
  char ep[64];
  snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", 20000 + (int)(getpid() % 20000));
  b.stages[1].endpoint = ep;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err) != SPN_OK) {
    rt_col_free(&col);
    spn_runtime_free(&rt);
    skip(); /* port taken by someone else */
  }
  rt_done_t d;
  spn_job_callbacks_t cb = rt_callbacks(&d);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = 3;
  spn_job_t *job = NULL;
  assert_int_equal(spn_job_start(pipe, &p, &cb, &job, &err), SPN_OK);
  void *ctx = zmq_ctx_new();
  void *s = zmq_socket(ctx, ZMQ_PUSH);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  assert_int_equal(zmq_connect(s, ep), 0);
  /* too short; bad magic; right magic, link out of range; a wire frame for
   * link 0 whose message is truncated (claims 5 items, has none) */
  uint32_t bad1[4] = {0x12345678, 0, 1, 0};
  uint32_t bad2[4] = {0x31574e53u, 999, 1, 0};
  uint8_t bad3[16 + 12] = {0};
  uint32_t hdr3[4] = {0x31574e53u, 0, 1, 0};
  memcpy(bad3, hdr3, sizeof hdr3);
  zmq_send(s, "x", 1, 0);
  zmq_send(s, bad1, sizeof bad1, 0);
  zmq_send(s, bad2, sizeof bad2, 0);
  zmq_send(s, bad3, sizeof bad3, 0);
  zmq_close(s);
  zmq_ctx_term(ctx);
  assert_int_equal(spn_job_wait(job, &err), SPN_OK);
  char why[256] = "";
  if (!rt_col_check(&col, 3, 300, why, sizeof why))
    fail_msg("%s", why);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

/* Append v's bytes (the documented little-endian wire format). */
#define PUT(buf, n, v)                  \
  do {                                  \
    memcpy((buf) + (n), &(v), sizeof(v)); \
    (n) += sizeof(v);                   \
  } while (0)

/* A well-formed wire frame for link 0 holding one message of job `job` with
 * a tensor and a meta item, built from the format in docs/architecture.md. */
static size_t wire_frame(uint8_t *buf, uint64_t job) {
  size_t n = 0;
  uint32_t magic = 0x31574e53u, link = 0, count = 1, reserved = 0;
  PUT(buf, n, magic);
  PUT(buf, n, link);
  PUT(buf, n, count);
  PUT(buf, n, reserved);
  uint32_t flags = 0, counted = 0, stream = 0, n_items = 2;
  uint64_t seq = 0;
  double pts = 0;
  int64_t total = 1;
  PUT(buf, n, flags);
  PUT(buf, n, counted);
  PUT(buf, n, job);
  PUT(buf, n, stream);
  PUT(buf, n, seq);
  PUT(buf, n, pts);
  PUT(buf, n, total);
  PUT(buf, n, n_items);
  uint32_t kind = SPN_ITEM_TENSOR, nlen = 5;
  PUT(buf, n, kind);
  PUT(buf, n, nlen);
  memcpy(buf + n, "frame", 5);
  n += 5;
  int32_t dtype = SPN_DTYPE_U8, ndim = 2;
  int64_t d0 = 4, d1 = 4;
  uint64_t nbytes = 16;
  PUT(buf, n, dtype);
  PUT(buf, n, ndim);
  PUT(buf, n, d0);
  PUT(buf, n, d1);
  PUT(buf, n, nbytes);
  memset(buf + n, 7, 16);
  n += 16;
  kind = SPN_ITEM_META;
  nlen = 1;
  PUT(buf, n, kind);
  PUT(buf, n, nlen);
  buf[n++] = 'n';
  uint64_t msize = 8, val = 0;
  PUT(buf, n, msize);
  PUT(buf, n, val);
  return n;
}

/* Thousands of mutated frames (bytes replaced, frames cut short or grown)
 * at a tcp mailbox while a job runs: none crashes the runtime or leaks
 * (ASan), the job in flight is untouched, and the pipeline runs the next. */
static void test_wire_fuzz(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "fuzz");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 200;
  src->gap_us = 2000;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  char ep[64];
  snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", 20000 + (int)((getpid() + 7919) % 20000));
  b.stages[1].endpoint = ep;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err) != SPN_OK) {
    rt_col_free(&col);
    spn_runtime_free(&rt);
    skip();
  }
  const uint64_t real = 0x1234567890abcdefull; /* no mutation of 999 reaches it */
  rt_done_t d;
  spn_job_callbacks_t cb = rt_callbacks(&d);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = real;
  spn_job_t *job = NULL;
  assert_int_equal(spn_job_start(pipe, &p, &cb, &job, &err), SPN_OK);
  void *ctx = zmq_ctx_new();
  void *s = zmq_socket(ctx, ZMQ_PUSH);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  assert_int_equal(zmq_connect(s, ep), 0);
  uint8_t good[256], buf[512];
  size_t n = wire_frame(good, 999);
  unsigned seed = 12345;
  for (int i = 0; i < 3000; i++) {
    memcpy(buf, good, n);
    size_t len = n;
    int edits = 1 + (int)(rand_r(&seed) % 3);
    for (int e = 0; e < edits; e++)
      buf[rand_r(&seed) % len] = (uint8_t)rand_r(&seed);
    switch (rand_r(&seed) % 4) {
    case 0:
      len = rand_r(&seed) % len; /* cut short */
      break;
    case 1:
      for (size_t k = len; k < len + 64; k++)
        buf[k] = (uint8_t)rand_r(&seed);
      len += rand_r(&seed) % 64; /* trailing bytes */
      break;
    default:
      break;
    }
    zmq_send(s, buf, len, 0);
  }
  zmq_send(s, good, n, 0); /* and a valid one for a job that does not exist */
  zmq_close(s);
  zmq_ctx_term(ctx);
  assert_int_equal(spn_job_wait(job, &err), SPN_OK);
  char why[256] = "";
  if (!rt_col_check(&col, real, 200, why, sizeof why))
    fail_msg("%s", why);
  spn_job_free(&job);
  src->gap_us = 0;
  p.job_id = 5;
  assert_int_equal(spn_job_start(pipe, &p, &cb, &job, &err), SPN_OK);
  assert_int_equal(spn_job_wait(job, &err), SPN_OK);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_inproc),
      cmocka_unit_test(test_tcp),
      cmocka_unit_test(test_tcp_fanout),
      cmocka_unit_test(test_ipc),
      cmocka_unit_test(test_garbage_frame),
      cmocka_unit_test(test_wire_fuzz),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
