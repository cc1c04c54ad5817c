/* test-edge-copy.c — ABI 1.1 memory kinds on a real GPU (suite gpu; exits
 * 77 without one). A source writing device memory feeding a host-only sink
 * is copied device-to-host exactly once per message, after the source's
 * readiness event (the sink sees the source's bytes); a host source feeding
 * a sink that takes device memory is copied host-to-device once per message
 * and the sink reads the bytes back from the GPU. With two GPUs or more the
 * same runs across them (peer copies: device-to-device counters). On one
 * GPU, a source that writes device memory on its stream and emits it
 * without buffer_set_ready still reaches a sink on the same GPU (its own
 * thread and stream) with its bytes: the runtime marks the buffer ready at
 * emit (on the fake GPU's lazy streams, SPN_EMU_CUDA_LAZY, the sink would
 * otherwise read memory the source's stream has not written yet). Stream
 * time: a GPU sink that only queues work on its stream (never waits) has
 * every process call timed (spn_pipeline_stage_stream_time), 300 of them —
 * more than the runtime keeps unread, so on the lazy fake GPU, whose events
 * stay not ready until something waits, the oldest are waited for — with
 * a time above zero; the host source has none. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "debug-internal.h"
#include "gpu-skip.h"
#include "runtime-internal.h"

#define FRAME_BYTES 65536

typedef struct cfg {
  int64_t frames;
} cfg_t;

static const spn_config_field_t schema[] = {
    {.key = "frames", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(cfg_t, frames),
     .doc = "frames", .def_int = 8, .min = 0, .max = 1000},
    {0},
};

/* Test-only: the host table and counters of the test that runs (one at a
 * time in this process). */
static const spn_host_api_t *g_host;
static atomic_llong g_ok, g_bad, g_calls;
/* The run's stream time and timed calls, stage by stage (config order). */
static uint64_t g_stream_ns[2], g_stream_calls[2];

typedef struct sjob {
  uint64_t id;
  int64_t next, n;
} sjob_t;

static int32_t s_open(spn_stage_t *s, void *st, const spn_job_info_t *job, void **js, spn_error_t *e) {
  sjob_t *j = calloc(1, sizeof *j);
  j->n = ((const cfg_t *)job->config)->frames;
  j->id = job->job_id;
  *js = j;
  return SPN_OK;
}
static void s_close(spn_stage_t *s, void *st, void *js, bool ok) { free(js); }

/* A frame's bytes: never 0, which fresh memory holds. */
static int pattern(uint64_t seq) { return (int)((seq * 37 + 11) & 0xff); }

/* kind SPN_MEM_DEVICE + 100: device memory set on the stage's stream, no
 * buffer_set_ready (a plugin that forgot it). */
static int32_t gen(spn_stage_t *s, void *js, int32_t kind, spn_error_t *e) {
  sjob_t *j = js;
  const spn_host_api_t *h = g_host;
  if (j->next == j->n)
    return SPN_EOS;
  bool unready = kind == SPN_MEM_DEVICE + 100;
  if (unready)
    kind = SPN_MEM_DEVICE;
  spn_buffer_t *buf = NULL;
  int32_t rc = h->buffer_new_kind(s, FRAME_BYTES, kind, &buf, e);
  if (rc != SPN_OK)
    return rc;
  uint8_t *pat = malloc(FRAME_BYTES);
  memset(pat, pattern((uint64_t)j->next), FRAME_BYTES);
  if (unready) {
    if (cudaMemsetAsync(h->buffer_data(buf), pattern((uint64_t)j->next), FRAME_BYTES,
                        (cudaStream_t)h->stage_get_stream(s)) != cudaSuccess)
      rc = spn_error_set(e, SPN_EDEVICE, "cudaMemsetAsync failed");
  } else if (kind == SPN_MEM_DEVICE) {
    /* Device memory is written on the stage's stream, then marked ready. */
    if (cudaMemcpyAsync(h->buffer_data(buf), pat, FRAME_BYTES, cudaMemcpyHostToDevice,
                        (cudaStream_t)h->stage_get_stream(s)) != cudaSuccess)
      rc = spn_error_set(e, SPN_EDEVICE, "cudaMemcpyAsync failed");
    if (rc == SPN_OK)
      rc = h->buffer_set_ready(s, buf, e);
    if (rc == SPN_OK && !h->buffer_event(buf))
      rc = spn_error_set(e, SPN_EINTERNAL, "a GPU buffer marked ready has no event");
    cudaStreamSynchronize((cudaStream_t)h->stage_get_stream(s)); /* pat is freed next */
  } else {
    memcpy(h->buffer_data(buf), pat, FRAME_BYTES);
  }
  free(pat);
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = j->id, .seq = (uint64_t)j->next, .total = j->n};
  spn_tensor_t t = {.struct_size = sizeof t, .dtype = SPN_DTYPE_U8, .ndim = 1, .shape = {FRAME_BYTES}};
  spn_msg_t *m = NULL;
  if (rc == SPN_OK)
    rc = h->msg_new(s, &env, &m, e);
  if (rc == SPN_OK)
    rc = h->msg_add_tensor(m, "frame", &t, buf, e);
  h->buffer_unref(&buf);
  if (rc == SPN_OK)
    rc = h->emit(s, 0, &m, e);
  else
    h->msg_free(&m);
  j->next++;
  return rc;
}

static int32_t gsrc_gen(spn_stage_t *s, void *st, void *js, spn_error_t *e) { return gen(s, js, SPN_MEM_DEVICE, e); }
static int32_t hsrc_gen(spn_stage_t *s, void *st, void *js, spn_error_t *e) { return gen(s, js, SPN_MEM_HOST, e); }
static int32_t usrc_gen(spn_stage_t *s, void *st, void *js, spn_error_t *e) {
  return gen(s, js, SPN_MEM_DEVICE + 100, e);
}

static void check(spn_stage_t *s, spn_msg_t *m, int32_t want_kind) {
  const spn_host_api_t *h = g_host;
  spn_item_t it = {.struct_size = sizeof it};
  int32_t dk = -1;
  if (h->msg_item(m, 0, &it) != SPN_OK || h->buffer_mem_kind(it.buffer) != want_kind) {
    atomic_fetch_add(&g_bad, 1);
    return;
  }
  h->buffer_device(it.buffer, &dk, NULL);
  uint8_t *p = malloc(FRAME_BYTES);
  if (want_kind == SPN_MEM_DEVICE) {
    cudaStreamSynchronize((cudaStream_t)h->stage_get_stream(s));
    if (dk != SPN_DEVICE_CUDA || cudaMemcpy(p, h->buffer_data(it.buffer), FRAME_BYTES, cudaMemcpyDeviceToHost) !=
                                     cudaSuccess) {
      free(p);
      atomic_fetch_add(&g_bad, 1);
      return;
    }
  } else {
    memcpy(p, h->buffer_data(it.buffer), FRAME_BYTES);
  }
  uint8_t v = (uint8_t)pattern(h->msg_envelope(m)->seq);
  bool ok = true;
  for (size_t k = 0; ok && k < FRAME_BYTES; k++)
    ok = p[k] == v;
  free(p);
  atomic_fetch_add(ok ? &g_ok : &g_bad, 1);
}

static int32_t hsink_proc(spn_stage_t *s, void *st, spn_msg_t **m, void **js, size_t n, spn_error_t *e) {
  for (size_t i = 0; i < n; i++)
    check(s, m[i], SPN_MEM_HOST);
  return SPN_OK;
}
static int32_t gsink_proc(spn_stage_t *s, void *st, spn_msg_t **m, void **js, size_t n, spn_error_t *e) {
  for (size_t i = 0; i < n; i++)
    check(s, m[i], SPN_MEM_DEVICE);
  return SPN_OK;
}

/* Queues work on its stream and never waits for it: a 1 MiB device buffer
 * of the job's, set once per message (nothing is freed on the way, which
 * would make the device layer order the free after the stream's work). */
static int32_t q_open(spn_stage_t *s, void *st, const spn_job_info_t *job, void **js, spn_error_t *e) {
  spn_buffer_t *buf = NULL;
  int32_t rc = g_host->buffer_new_kind(s, 1 << 20, SPN_MEM_DEVICE, &buf, e);
  *js = buf;
  return rc;
}
static void q_close(spn_stage_t *s, void *st, void *js, bool ok) {
  spn_buffer_t *buf = js;
  cudaStreamSynchronize((cudaStream_t)g_host->stage_get_stream(s));
  g_host->buffer_unref(&buf);
}
static int32_t qsink_proc(spn_stage_t *s, void *st, spn_msg_t **m, void **js, size_t n, spn_error_t *e) {
  const spn_host_api_t *h = g_host;
  atomic_fetch_add(&g_calls, 1);
  for (size_t i = 0; i < n; i++)
    if (cudaMemsetAsync(h->buffer_data(js[i]), 7, 1 << 20, (cudaStream_t)h->stage_get_stream(s)) != cudaSuccess)
      return spn_error_set(e, SPN_EDEVICE, "cudaMemsetAsync failed");
  return SPN_OK;
}

static const spn_port_t out[] = {{"out", "any"}};
static const spn_port_t in[] = {{"in", "any"}};
static const spn_port_caps_t dev_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SPN_MEMSET_DEVICE}};
static spn_stage_kind_t k_gsrc, k_hsrc, k_hsink, k_gsink, k_usrc, k_qsink;

static void init_kinds(void) {
  spn_stage_kind_t b = SPN_STAGE_KIND_INIT;
  k_gsrc = b;
  k_gsrc.name = "gsrc";
  k_gsrc.schema = schema;
  k_gsrc.config_size = sizeof(cfg_t);
  k_gsrc.outputs = out;
  k_gsrc.n_outputs = 1;
  k_gsrc.device_need = SPN_NEED_CUDA;
  k_gsrc.job_open = s_open;
  k_gsrc.job_close = s_close;
  k_gsrc.generate = gsrc_gen;
  k_gsrc.output_caps = dev_caps;
  k_usrc = k_gsrc;
  k_usrc.name = "usrc";
  k_usrc.generate = usrc_gen;
  k_hsrc = k_gsrc;
  k_hsrc.name = "hsrc";
  k_hsrc.device_need = SPN_NEED_CPU;
  k_hsrc.generate = hsrc_gen;
  k_hsrc.output_caps = NULL;
  k_hsink = b;
  k_hsink.name = "hsink";
  k_hsink.inputs = in;
  k_hsink.n_inputs = 1;
  k_hsink.process = hsink_proc;
  k_gsink = k_hsink;
  k_gsink.name = "gsink";
  k_gsink.device_need = SPN_NEED_CUDA;
  k_gsink.process = gsink_proc;
  k_gsink.input_caps = dev_caps;
  k_qsink = k_gsink;
  k_qsink.name = "qsink";
  k_qsink.process = qsink_proc;
  k_qsink.job_open = q_open;
  k_qsink.job_close = q_close;
  k_qsink.input_caps = NULL; /* host frames as they are: no edge copy (which would wait on the stream) */
}

static void run(const char *toml, int64_t frames, spn_edge_stats_t *st) {
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = "cuda";
  o.log_level = SPN_LOG_ERROR + 1;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&o, &rt, &err) != SPN_OK)
    fail_msg("runtime: %s", err.msg);
  g_host = spn__runtime_host_api(rt);
  atomic_store(&g_ok, 0);
  atomic_store(&g_bad, 0);
  atomic_store(&g_calls, 0);
  const spn_stage_kind_t *all[] = {&k_gsrc, &k_hsrc, &k_hsink, &k_gsink, &k_usrc, &k_qsink};
  for (size_t i = 0; i < 6; i++)
    if (spn__registry_add_kind(rt->reg, all[i], "test", &err) != SPN_OK)
      fail_msg("kind: %s", err.msg);
  spn_pipeline_t *pipe = NULL;
  if (spn_pipeline_load_string(rt, toml, strlen(toml), "gpu.toml", NULL, 0, &pipe, &err) != SPN_OK)
    fail_msg("load: %s", err.msg);
  char ov[64];
  snprintf(ov, sizeof ov, "s.frames=%lld", (long long)frames);
  const char *ovs[] = {ov};
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.overrides = ovs;
  p.n_overrides = 1;
  spn_job_callbacks_t cb = {0};
  spn_job_t *job = NULL;
  if (spn_job_start(pipe, &p, &cb, &job, &err) != SPN_OK || spn_job_wait(job, &err) != SPN_OK)
    fail_msg("job: %s", err.msg);
  assert_int_equal(spn_pipeline_edge_count(pipe), 1);
  assert_int_equal(spn_pipeline_edge_stats(pipe, 0, st), SPN_OK);
  st->from_stage = st->to_stage = st->from_port = st->to_port = st->format = NULL; /* freed below */
  for (size_t i = 0; i < 2; i++)
    assert_non_null(spn_pipeline_stage_stream_time(pipe, i, &g_stream_ns[i], &g_stream_calls[i]));
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
}

static void device_to_host(void **state) {
  spn_edge_stats_t st;
  run("[[stage]]\nname = \"s\"\nkind = \"gsrc\"\ninstances = { count = 1, devices = \"0\" }\n"
      "[[stage]]\nname = \"k\"\nkind = \"hsink\"\ninputs = [\"s\"]\n",
      24, &st);
  assert_int_equal(st.messages, 24);
  assert_int_equal(st.copies[SPN_COPY_D2H], 24);
  assert_int_equal(st.bytes[SPN_COPY_D2H], 24 * FRAME_BYTES);
  assert_int_equal(st.copies[SPN_COPY_H2D] + st.copies[SPN_COPY_D2D] + st.copies[SPN_COPY_H2H], 0);
  assert_int_equal(atomic_load(&g_ok), 24);
  assert_int_equal(atomic_load(&g_bad), 0);
}

static void host_to_device(void **state) {
  spn_edge_stats_t st;
  run("[[stage]]\nname = \"s\"\nkind = \"hsrc\"\n"
      "[[stage]]\nname = \"k\"\nkind = \"gsink\"\ninputs = [\"s\"]\ninstances = { count = 1, devices = \"0\" }\n",
      24, &st);
  assert_int_equal(st.messages, 24);
  assert_int_equal(st.copies[SPN_COPY_H2D], 24);
  assert_int_equal(st.copies[SPN_COPY_D2H] + st.copies[SPN_COPY_D2D] + st.copies[SPN_COPY_H2H], 0);
  assert_int_equal(atomic_load(&g_ok), 24);
  assert_int_equal(atomic_load(&g_bad), 0);
}

static void same_gpu_without_set_ready(void **state) {
  spn_edge_stats_t st;
  run("[[stage]]\nname = \"s\"\nkind = \"usrc\"\ninstances = { count = 1, devices = \"0\" }\n"
      "[[stage]]\nname = \"k\"\nkind = \"gsink\"\ninputs = [\"s\"]\ninstances = { count = 1, devices = \"0\" }\n",
      1, &st);
  assert_int_equal(st.messages, 1);
  assert_int_equal(st.items_passed, 1); /* handed over as it is */
  assert_int_equal(st.copies[SPN_COPY_H2D] + st.copies[SPN_COPY_D2H] + st.copies[SPN_COPY_D2D], 0);
  assert_int_equal(atomic_load(&g_bad), 0);
  assert_int_equal(atomic_load(&g_ok), 1);
}

static void stream_time(void **state) {
  spn_edge_stats_t st;
  run("[[stage]]\nname = \"s\"\nkind = \"hsrc\"\n"
      "[[stage]]\nname = \"k\"\nkind = \"qsink\"\ninputs = [\"s\"]\ninstances = { count = 1, devices = \"0\" }\n",
      300, &st);
  assert_int_equal(st.messages, 300);
  assert_int_equal(g_stream_calls[0], 0); /* on the CPU pool: not measured */
  assert_int_equal(g_stream_ns[0], 0);
  assert_int_equal(g_stream_calls[1], atomic_load(&g_calls));
  assert_true(g_stream_calls[1] > SPN__ST_PAIRS);
  assert_true(g_stream_ns[1] > 0);
}

static void across_gpus(void **state) {
  if (spn_test_gpu_count() < 2)
    skip();
  spn_edge_stats_t st;
  run("[[stage]]\nname = \"s\"\nkind = \"gsrc\"\ninstances = { count = 1, devices = \"0\" }\n"
      "[[stage]]\nname = \"k\"\nkind = \"gsink\"\ninputs = [\"s\"]\ninstances = { count = 1, devices = \"1\" }\n",
      24, &st);
  assert_int_equal(st.copies[SPN_COPY_D2D], 24);
  assert_int_equal(st.items_passed, 0);
  assert_int_equal(atomic_load(&g_ok), 24);
}

int main(void) {
  SPN_TEST_REQUIRE_GPU();
  init_kinds();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_to_host),
      cmocka_unit_test(host_to_device),
      cmocka_unit_test(same_gpu_without_set_ready),
      cmocka_unit_test(stream_time),
      cmocka_unit_test(across_gpus),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
