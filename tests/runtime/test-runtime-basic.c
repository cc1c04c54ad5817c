/* test-runtime-basic.c — end to end through inproc ZeroMQ edges:
 * source -> passthrough -> sink, two concurrent jobs, EOS, on_done, progress,
 * job_open/job_close on every instance; the device layer; messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rt-kinds.h"
#include "spindle/device.h"
#include <unistd.h>

static spn_runtime_t *new_rt(const char *devices) {
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = devices;
  o.log_level = SPN_LOG_WARN;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_runtime_new(&o, &rt, &err);
  if (rc != SPN_OK)
    fail_msg("spn_runtime_new: %s", err.msg);
  return rt;
}

static void test_chain_two_jobs(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu");
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "chain");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 5000;
  src->with_tensor = true;
  src->col = &col;
  rt_spec_stage(&b, "pass", &rt_kind_pass, h)->col = &col;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  b.stages[2].edge_capacity = 16;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err), SPN_OK);
  assert_string_equal(spn_pipeline_name(pipe), "chain");

  rt_done_t d[2];
  spn_job_t *jobs[2];
  for (int i = 0; i < 2; i++) {
    spn_job_callbacks_t cb = rt_callbacks(&d[i]);
    spn_job_params_t p = SPN_JOB_PARAMS_INIT;
    p.job_id = 100 + (uint64_t)i;
    assert_int_equal(spn_job_start(pipe, &p, &cb, &jobs[i], &err), SPN_OK);
  }
  for (int i = 0; i < 2; i++) {
    assert_int_equal(spn_job_wait(jobs[i], &err), SPN_OK);
    assert_int_equal(atomic_load(&d[i].calls), 1);
    assert_int_equal(atomic_load(&d[i].status), SPN_OK);
    assert_int_equal(atomic_load(&d[i].last_progress), 5000);
    char why[256] = "";
    if (!rt_col_check(&col, 100 + (uint64_t)i, 5000, why, sizeof why))
      fail_msg("%s", why);
    spn_job_free(&jobs[i]);
  }
  assert_int_equal(atomic_load(&col.tensor_bad), 0);
  /* Three instances opened and closed (ok) each job. */
  assert_int_equal(atomic_load(&col.opens), 6);
  assert_int_equal(atomic_load(&col.closes_ok), 6);
  assert_int_equal(atomic_load(&col.closes_fail), 0);
  uint32_t cap = 0;
  int64_t mx = spn__pipeline_max_in_flight(pipe, 2, &cap);
  assert_int_equal(cap, 16);
  assert_true(mx >= 1 && mx <= 16);
  spn_pipeline_free(&pipe);
  assert_null(pipe);
  /* A duplicate job id is refused while the first runs; after, it is free. */
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

static void test_job_id_in_use(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu");
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "dup");
  rt_cfg_t *src = rt_spec_stage(&b, "src", &rt_kind_src, h);
  src->count = 200;
  src->gap_us = 1000; /* long enough that the first job is still running */
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err), SPN_OK);
  rt_done_t d1, d2;
  spn_job_callbacks_t cb1 = rt_callbacks(&d1), cb2 = rt_callbacks(&d2);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = 7;
  spn_job_t *j1 = NULL, *j2 = NULL;
  assert_int_equal(spn_job_start(pipe, &p, &cb1, &j1, &err), SPN_OK);
  assert_int_equal(spn_job_start(pipe, &p, &cb2, &j2, &err), SPN_EEXIST);
  assert_non_null(strstr(err.msg, "job id 7"));
  assert_int_equal(spn_job_wait(j1, &err), SPN_OK);
  assert_int_equal(atomic_load(&d2.calls), 0); /* refused start: on_done never called */
  assert_int_equal(spn_job_id(j1), 7);
  spn_job_free(&j1);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

static void test_devices(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu:4");
  assert_int_equal(spn_runtime_device_count(rt), 4);
  assert_string_equal(spn_runtime_device_name(rt, 3), "cpu:3");
  assert_null(spn_runtime_device_name(rt, 4));
  spn_runtime_free(&rt);

  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  spn_error_t err = SPN_ERROR_INIT;
  o.devices = "cpu:0";
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "cpu:0"));
  o.devices = "tpu";
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "tpu"));
}

static void test_device_layer(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu:2");
  spn_device_t *d = spn__runtime_device(rt, 1);
  assert_non_null(d);
  assert_null(spn__runtime_device(rt, 2));
  assert_int_equal(spn_device_kind(d), SPN_DEVICE_CPU);
  assert_int_equal(spn_device_index(d), 1);
  assert_string_equal(spn_device_name(d), "cpu:1");
  spn_error_t err = SPN_ERROR_INIT;
  spn_buffer_t *a = NULL, *b = NULL;
  for (int k = SPN_MEM_DEVICE; k <= SPN_MEM_PINNED; k++) {
    spn_buffer_type_t *bt = spn_device_buffer_type(d, k);
    assert_non_null(bt);
    assert_true(spn_buffer_type_is_host(bt));
  }
  assert_null(spn_device_buffer_type(d, 7));
  assert_int_equal(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_DEVICE), 1000, &a, &err), SPN_OK);
  assert_int_equal(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_PINNED), 1000, &b, &err), SPN_OK);
  assert_int_equal(spn_buffer_size(a), 1000);
  assert_true(((uintptr_t)spn_buffer_data(a) & 63) == 0);
  assert_ptr_equal(spn_buffer_device(a), d);
  for (int i = 0; i < 1000; i++)
    ((unsigned char *)spn_buffer_data(a))[i] = (unsigned char)(i * 7);
  spn_stream_t *s = NULL;
  spn_event_t *ev = NULL;
  assert_int_equal(spn_stream_new(d, &s, &err), SPN_OK);
  assert_null(spn_stream_native(s));
  assert_int_equal(spn_event_new(d, &ev, &err), SPN_OK);
  assert_int_equal(spn_stream_copy(s, b, 10, a, 0, 990, &err), SPN_OK);
  assert_int_equal(spn_event_record(ev, s, &err), SPN_OK);
  assert_int_equal(spn_stream_wait_event(s, ev, &err), SPN_OK);
  assert_int_equal(spn_event_synchronize(ev, &err), SPN_OK);
  assert_int_equal(spn_stream_synchronize(s, &err), SPN_OK);
  for (int i = 0; i < 990; i++)
    assert_int_equal(((unsigned char *)spn_buffer_data(b))[10 + i], (unsigned char)(i * 7));
  /* Out of range copies are refused with the sizes in the message. */
  assert_int_equal(spn_stream_copy(s, b, 11, a, 0, 990, &err), SPN_EOVERFLOW);
  assert_non_null(strstr(err.msg, "990"));
  /* References: the buffer lives until the last one goes. */
  spn_buffer_t *c = spn_buffer_ref(a);
  spn_buffer_unref(&a);
  assert_null(a);
  assert_int_equal(((unsigned char *)spn_buffer_data(c))[3], 21);
  spn_buffer_unref(&c);
  spn_buffer_unref(&b);
  spn_buffer_unref(&b); /* NULL: no-op */
  spn_event_free(&ev);
  spn_stream_free(&s);
  spn_runtime_free(&rt);
}

/* The message half of the host table, as a plugin sees it. */
static void test_messages(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu");
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  assert_int_equal(h->struct_size, sizeof(spn_host_api_t));
  assert_int_equal(h->abi_major, SPN_PLUGIN_ABI_MAJOR);
  spn_error_t err = SPN_ERROR_INIT;
  spn_envelope_t env = {.struct_size = sizeof env, .flags = SPN_MSG_KEY, .job_id = 5, .stream = 1, .seq = 42,
                        .pts = 1.5, .total = 100};
  spn_msg_t *m = NULL, *m2 = NULL;
  assert_int_equal(h->msg_new(NULL, &env, &m, &err), SPN_OK);
  spn_buffer_t *buf = NULL;
  spn_device_t *d = spn__runtime_device(rt, 0);
  assert_int_equal(spn_buffer_type_alloc(spn_device_buffer_type(d, SPN_MEM_HOST), 24, &buf, &err), SPN_OK);
  float *f = h->buffer_data(buf);
  for (int i = 0; i < 6; i++)
    f[i] = (float)i + 0.5f;
  spn_tensor_t t = {.struct_size = sizeof t, .dtype = SPN_DTYPE_F32, .ndim = 2, .shape = {2, 3}};
  assert_int_equal(h->msg_add_tensor(m, "frame", &t, buf, &err), SPN_OK);
  spn_tensor_t big = {.struct_size = sizeof big, .dtype = SPN_DTYPE_F32, .ndim = 2, .shape = {3, 3}};
  assert_int_equal(h->msg_add_tensor(m, "big", &big, buf, &err), SPN_EOVERFLOW);
  assert_non_null(strstr(err.msg, "big"));
  spn_tensor_t bad = {.struct_size = sizeof bad, .dtype = 99, .ndim = 1, .shape = {1}};
  assert_int_equal(h->msg_add_tensor(m, "bad", &bad, buf, &err), SPN_EINVAL);
  h->buffer_unref(&buf); /* the message keeps its own reference */
  spn_face_t faces[2] = {{.x0 = 1, .y0 = 2, .x1 = 3, .y1 = 4, .score = 0.9f, .track_id = 7},
                         {.x0 = 5, .score = 0.5f, .track_id = 8}};
  assert_int_equal(h->msg_add_meta(m, "faces", faces, sizeof faces, &err), SPN_OK);
  faces[0].score = 0; /* copied: the message does not see this */
  assert_int_equal(h->msg_item_count(m), 2);
  assert_int_equal(h->msg_find(m, "faces"), 1);
  assert_int_equal(h->msg_find(m, "nope"), -1);
  spn_item_t it = {.struct_size = sizeof it};
  assert_int_equal(h->msg_item(m, 0, &it), SPN_OK);
  assert_int_equal(it.kind, SPN_ITEM_TENSOR);
  assert_string_equal(it.name, "frame");
  assert_int_equal(it.tensor.shape[1], 3);
  assert_true(((const float *)it.tensor.data)[5] == 5.5f);
  assert_int_equal(h->buffer_size(it.buffer), 24);
  assert_int_equal(h->msg_item(m, 1, &it), SPN_OK);
  assert_int_equal(it.meta_size, sizeof faces);
  assert_true(((const spn_face_t *)it.meta)[0].score == 0.9f);
  assert_int_equal(h->msg_item(m, 2, &it), SPN_EINVAL);
  spn_item_t small = {.struct_size = 8};
  assert_int_equal(h->msg_item(m, 0, &small), SPN_EABI);
  /* msg_new_from copies the envelope, never EOS/SKIP, and no items. */
  assert_int_equal(h->msg_new_from(NULL, m, &m2, &err), SPN_OK);
  const spn_envelope_t *e2 = h->msg_envelope(m2);
  assert_int_equal(e2->job_id, 5);
  assert_int_equal(e2->seq, 42);
  assert_int_equal(e2->stream, 1);
  assert_int_equal(e2->total, 100);
  assert_true(e2->pts == 1.5);
  assert_int_equal(e2->flags, SPN_MSG_KEY);
  assert_int_equal(h->msg_item_count(m2), 0);
  h->msg_free(&m);
  h->msg_free(&m2);
  assert_null(m);
  h->msg_free(&m); /* NULL: no-op */
  spn_runtime_free(&rt);
}

/* Logs: one JSON object per line with the job, stage and device. */
static void test_json_log(void **st) {
  (void)st;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = "cpu:2";
  o.log_level = SPN_LOG_WARN;
  o.log_format = SPN_LOG_FORMAT_JSON;
  o.log_fd = fds[1];
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_runtime_new(&o, &rt, &err), SPN_OK);
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "log");
  rt_spec_stage(&b, "src", &rt_kind_src, h)->count = 50;
  rt_cfg_t *pass = rt_spec_stage(&b, "dec\"ode", &rt_kind_pass, h);
  pass->fail_job = 77;
  pass->fail_seq = 3;
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = NULL;
  assert_int_equal(spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err), SPN_OK);
  rt_done_t d;
  spn_job_callbacks_t cb = rt_callbacks(&d);
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.job_id = 77;
  spn_job_t *job = NULL;
  assert_int_equal(spn_job_start(pipe, &p, &cb, &job, &err), SPN_OK);
  assert_int_equal(spn_job_wait(job, &err), SPN_EMEDIA);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  close(fds[1]);
  char text[8192];
  ssize_t n = read(fds[0], text, sizeof text - 1);
  close(fds[0]);
  assert_true(n > 0);
  text[n] = '\0';
  /* The failure line: escaped stage name, job, device, level. */
  char *line = strstr(text, "{\"ts\":");
  assert_non_null(line);
  assert_non_null(strstr(line, "\"level\":\"error\""));
  assert_non_null(strstr(line, "\"job_id\":77"));
  assert_non_null(strstr(line, "\"stage\":\"dec\\\"ode\""));
  assert_non_null(strstr(line, "\"device\":\"cpu:0\""));
  assert_non_null(strstr(line, "frame is corrupt"));
  char *nl = strchr(line, '\n');
  assert_non_null(nl);
  assert_int_equal(nl[-1], '}');
  rt_col_free(&col);
}

static int32_t try_build(spn_runtime_t *rt, rt_spec_t *b, spn_error_t *err) {
  spn_pipeline_t *pipe = NULL;
  int32_t rc = spn__pipeline_new_from_spec(rt, &b->spec, false, &pipe, err);
  if (rc == SPN_OK)
    spn_pipeline_free(&pipe);
  return rc;
}

/* Bad pipelines are refused before any job, naming the stage and where it
 * is; nothing is left behind (ASan checks the tear-down). */
static void test_build_errors(void **st) {
  (void)st;
  spn_runtime_t *rt = new_rt("cpu:2");
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  spn_error_t err = SPN_ERROR_INIT;
  rt_spec_t b;

  rt_spec_init(&b, "e1"); /* create fails on one of two replicas' stage */
  rt_spec_stage(&b, "src", &rt_kind_src, h);
  rt_spec_stage(&b, "cam", &rt_kind_pass, h)->fail_create = SPN_EDEVICE;
  b.stages[1].instance_devices = (char *)"all";
  rt_spec_stage(&b, "sink", &rt_kind_sink, h);
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  assert_int_equal(try_build(rt, &b, &err), SPN_EDEVICE);
  assert_non_null(strstr(err.msg, "test:2:1: stage \"cam\": create"));
  assert_non_null(strstr(err.msg, "cannot open the camera"));

  b.cfgs[1].fail_create = 0; /* preload fails */
  b.cfgs[1].fail_preload = SPN_EMODEL;
  assert_int_equal(try_build(rt, &b, &err), SPN_EMODEL);
  assert_non_null(strstr(err.msg, "stage \"cam\": preload on cpu:"));
  assert_non_null(strstr(err.msg, "weights are corrupt"));

  b.cfgs[1].fail_preload = 0; /* the model file does not exist */
  b.cfgs[1].model = "models/retinaface.onnx";
  assert_int_equal(try_build(rt, &b, &err), SPN_ENOENT);
  assert_non_null(strstr(err.msg, "stage \"cam\""));
  assert_non_null(strstr(err.msg, "retinaface.onnx"));
  b.cfgs[1].model = NULL;

  b.stages[1].instance_devices = (char *)"0,5"; /* no device 5 */
  assert_int_equal(try_build(rt, &b, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "device 5"));
  b.stages[1].instance_devices = (char *)"zero";
  assert_int_equal(try_build(rt, &b, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "\"zero\""));
  b.stages[1].instance_devices = NULL;
  b.stages[1].device = (char *)"cuda:0";
  assert_int_equal(try_build(rt, &b, &err), SPN_EDEVICE);
  assert_non_null(strstr(err.msg, "cuda:0"));
  b.stages[1].device = (char *)"cpu:1"; /* fine: the second emulated device */
  assert_int_equal(try_build(rt, &b, &err), SPN_OK);
  b.stages[1].device = (char *)"gpu";
  assert_int_equal(try_build(rt, &b, &err), SPN_ECONFIG);
  b.stages[1].device = (char *)"auto";

  b.stages[2].endpoint = (char *)"udp://x"; /* not a transport we speak */
  assert_int_equal(try_build(rt, &b, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "udp://x"));
  b.stages[2].endpoint = NULL;

  b.spec.n_edges = 1; /* the sink's input is left unconnected */
  assert_int_equal(try_build(rt, &b, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "stage \"sink\": input \"out\" is not connected"));
  b.spec.n_edges = 2;
  b.edges[1].to_port = 3; /* no such port */
  assert_int_equal(try_build(rt, &b, &err), SPN_ECONFIG);
  b.edges[1].to_port = 0;
  b.spec.n_stages = 0;
  assert_int_equal(try_build(rt, &b, &err), SPN_ECONFIG);
  b.spec.n_stages = 3;
  assert_int_equal(try_build(rt, &b, &err), SPN_OK);

  /* Without the front end or a plugin, TOML entry points say why. */
  spn_pipeline_t *pipe = NULL;
  assert_true(spn_pipeline_load(rt, "no-such-file.toml", NULL, 0, &pipe, &err) < 0);
  assert_null(pipe);
  assert_non_null(strstr(err.msg, "no-such-file.toml"));
  spn_runtime_free(&rt);
}

typedef struct warn_lines {
  char v[24][512];
  size_t n;
} warn_lines_t;

static void collect_line(void *user, const char *line) {
  warn_lines_t *w = user;
  assert_true(w->n < 24);
  snprintf(w->v[w->n++], sizeof w->v[0], "%s", line);
}

/* Warnings the stages log are kept for the job they name (spn_job_warning)
 * or, naming none, for the pipeline (spn_pipeline_warning), whatever the
 * log level; info lines are not; each job gets its own; 16 are kept and
 * all are counted. */
static void test_warnings(void **st) {
  (void)st;
  spn_runtime_t *rt = rt_new("cpu", 2); /* logs nothing */
  const spn_host_api_t *h = spn__runtime_host_api(rt);
  rt_col_t col;
  rt_col_init(&col);
  rt_spec_t b;
  rt_spec_init(&b, "warn");
  rt_spec_stage(&b, "src", &rt_kind_src, h)->count = 40;
  rt_cfg_t *pass = rt_spec_stage(&b, "fix", &rt_kind_pass, h);
  pass->warn_preload = true;
  pass->warn_every = 2; /* 20 of 40 frames */
  rt_spec_stage(&b, "sink", &rt_kind_sink, h)->col = &col;
  rt_spec_edge(&b, 0, 1);
  rt_spec_edge(&b, 1, 2);
  spn_pipeline_t *pipe = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn__pipeline_new_from_spec(rt, &b.spec, false, &pipe, &err), SPN_OK);
  char line[512];
  assert_int_equal(spn_pipeline_warning_count(pipe), 1);
  assert_int_equal(spn_pipeline_warning(pipe, 0, line, sizeof line), SPN_OK);
  assert_string_equal(line, "fix: model \"w.onnx\" not found; using the built-in one");
  assert_int_equal(spn_pipeline_warning(pipe, 1, line, sizeof line), SPN_EINVAL);
  rt_done_t d[2];
  spn_job_t *jobs[2];
  for (int i = 0; i < 2; i++) {
    spn_job_callbacks_t cb = rt_callbacks(&d[i]);
    spn_job_params_t p = SPN_JOB_PARAMS_INIT;
    p.job_id = 7 + (uint64_t)i;
    assert_int_equal(spn_job_start(pipe, &p, &cb, &jobs[i], &err), SPN_OK);
  }
  for (int i = 0; i < 2; i++) {
    assert_int_equal(spn_job_wait(jobs[i], &err), SPN_OK);
    assert_int_equal(spn_job_warning_count(jobs[i]), 20);
    for (size_t k = 0; k < 16; k++) {
      assert_int_equal(spn_job_warning(jobs[i], k, line, sizeof line), SPN_OK);
      /* its own frames only, in order (one instance) */
      char want[128];
      snprintf(want, sizeof want, "fix: frame %zu of job %d is damaged; accepted", 2 * k, 7 + i);
      assert_string_equal(line, want);
    }
    assert_int_equal(spn_job_warning(jobs[i], 16, line, sizeof line), SPN_EINVAL);
    /* all of them, as a job status lists them: the pipeline's, the job's
     * kept ones, then the count of the rest */
    warn_lines_t all = {0};
    spn_job_warnings_each(jobs[i], "the test's log", collect_line, &all);
    assert_int_equal(all.n, 1 + 16 + 1);
    assert_string_equal(all.v[0], "fix: model \"w.onnx\" not found; using the built-in one");
    for (size_t k = 0; k < 16; k++) {
      assert_int_equal(spn_job_warning(jobs[i], k, line, sizeof line), SPN_OK);
      assert_string_equal(all.v[1 + k], line);
    }
    assert_string_equal(all.v[17], "... 4 more warnings: see the test's log");
    /* cut to the caller's buffer */
    char small[8];
    assert_int_equal(spn_job_warning(jobs[i], 0, small, sizeof small), SPN_OK);
    assert_string_equal(small, "fix: fr");
    spn_job_free(&jobs[i]);
  }
  /* the jobs' warnings are not the pipeline's */
  assert_int_equal(spn_pipeline_warning_count(pipe), 1);
  assert_int_equal(spn_job_warning_count(NULL), 0);
  assert_int_equal(spn_job_warning(NULL, 0, line, sizeof line), SPN_EINVAL);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
  rt_col_free(&col);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chain_two_jobs),
      cmocka_unit_test(test_job_id_in_use),
      cmocka_unit_test(test_devices),
      cmocka_unit_test(test_device_layer),
      cmocka_unit_test(test_messages),
      cmocka_unit_test(test_json_log),
      cmocka_unit_test(test_warnings),
      cmocka_unit_test(test_build_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
