/* test-memfmt.c — ABI 1.1 memory kinds and formats, on the CPU.
 *
 *   - negotiation: the lowest format both ends allow is picked (whatever
 *     the config order), an output feeding several consumers gets one
 *     format they all take, a config narrows a port (port_caps), audio rate
 *     mismatches are refused, every refusal names file:line:col and both
 *     stages; kinds built against ABI 1.0 (struct_size of 1.0, no caps) load
 *     and are never refused;
 *   - the copy plan (spn__mem_plan) for every memory kind against every
 *     accepted set;
 *   - at run time on emulated devices (cpu:2): a source writing DEVICE
 *     memory feeding a host-only sink copies exactly once per message (D2H
 *     counter == messages, the bytes are the frames' bytes, the sink sees
 *     host memory with the source's bytes); feeding a sink that takes device
 *     memory on the same device passes every handle (0 copies);
 *   - the edge's memory in the figures follows placement, as the copies
 *     do: a source declaring device or host memory (a stage that gives
 *     device memory on a GPU only) gives host memory on cpu:N, handed over
 *     as it is and described as host memory; a consumer in the CPU pool
 *     taking either gets host memory.
 * Kinds are registered directly (no plugin files). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "debug-internal.h"
#include "runtime-internal.h"

/* ---- kinds --------------------------------------------------------------- */

typedef struct src_config {
  int64_t frames;
  char *format; /* narrows the output's pixel formats when not "" */
  int64_t rate;
  bool either; /* declares device or host memory and, off a GPU, gives host memory */
} src_config_t;

static const spn_config_field_t src_schema[] = {
    {.key = "frames", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(src_config_t, frames), .doc = "frames",
     .def_int = 8, .min = 0, .max = 1000},
    {.key = "format", .type = SPN_CONFIG_STRING, .offset = offsetof(src_config_t, format), .doc = "format",
     .def_str = ""},
    {.key = "rate", .type = SPN_CONFIG_INT, .offset = offsetof(src_config_t, rate), .doc = "rate", .def_int = 0,
     .min = 0, .max = 192000},
    {.key = "either", .type = SPN_CONFIG_BOOL, .offset = offsetof(src_config_t, either),
     .doc = "device or host memory (host off a GPU)", .def_int = 0},
    {0},
};

#define FRAME_BYTES 4096

typedef struct src_job {
  uint64_t id;
  int64_t next, n;
  int32_t mem_kind; /* what it writes */
} src_job_t;

static void src_note_port(spn_stage_t *s, const spn_host_api_t *h);

static int32_t src_open(spn_stage_t *s, void *st, const spn_job_info_t *job, void **js, spn_error_t *e) {
  src_job_t *j = calloc(1, sizeof *j);
  j->n = ((const src_config_t *)job->config)->frames;
  j->mem_kind = ((const src_config_t *)job->config)->either ? SPN_MEM_HOST : SPN_MEM_DEVICE;
  j->id = job->job_id;
  *js = j;
  src_note_port(s, st);
  return SPN_OK;
}

static void src_close(spn_stage_t *s, void *st, void *js, bool ok) { free(js); }


/* One frame per call in DEVICE memory of the instance's device (emulated
 * on cpu:N: host memory the runtime treats as device memory), or with
 * `either` in HOST memory, as a stage that gives device memory on a GPU
 * only does on cpu:N. */
static int32_t src_gen(spn_stage_t *s, void *st, void *js, spn_error_t *e) {
  src_job_t *j = js;
  const spn_host_api_t *h = st;
  if (j->next == j->n)
    return SPN_EOS;
  spn_buffer_t *buf = NULL;
  int32_t rc = h->buffer_new_kind(s, FRAME_BYTES, j->mem_kind, &buf, e);
  if (rc != SPN_OK)
    return rc;
  memset(h->buffer_data(buf), (int)(j->next & 0xff), FRAME_BYTES);
  if ((rc = h->buffer_set_ready(s, buf, e)) != SPN_OK) {
    h->buffer_unref(&buf);
    return rc;
  }
  spn_envelope_t env = {.struct_size = sizeof env, .job_id = j->id, .seq = (uint64_t)j->next, .total = j->n};
  spn_msg_t *m = NULL;
  spn_tensor_t t = {.struct_size = sizeof t, .dtype = SPN_DTYPE_U8, .ndim = 1, .shape = {FRAME_BYTES}};
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

/* Sinks: check memory kind and bytes of every frame, count them. */
typedef struct sink_state {
  const spn_host_api_t *h;
  int32_t want_kind;
  atomic_llong *seen, *bad;
} sink_state_t;

static int32_t sink_proc(spn_stage_t *s, void *st, spn_msg_t **m, void **js, size_t n, spn_error_t *e) {
  sink_state_t *ss = st;
  for (size_t i = 0; i < n; i++) {
    spn_item_t it = {.struct_size = sizeof it};
    if (ss->h->msg_item(m[i], 0, &it) != SPN_OK || ss->h->buffer_mem_kind(it.buffer) != ss->want_kind ||
        ss->h->buffer_event(it.buffer) != NULL) {
      atomic_fetch_add(ss->bad, 1);
      continue;
    }
    const uint8_t *p = ss->h->buffer_data(it.buffer);
    uint8_t v = (uint8_t)(ss->h->msg_envelope(m[i])->seq & 0xff);
    bool ok = ss->h->buffer_size(it.buffer) == FRAME_BYTES;
    for (size_t k = 0; ok && k < FRAME_BYTES; k++)
      ok = p[k] == v;
    atomic_fetch_add(ok ? ss->seen : ss->bad, 1);
  }
  return SPN_OK;
}

typedef struct test_ctx {
  atomic_llong seen_host, bad_host, seen_dev, bad_dev;
  atomic_int port_mem; /* what stage_port_format told the source at job open (its video port), + 1 */
} test_ctx_t;

static int32_t src_create(spn_stage_t *s, const void *cfg, void **st, spn_error_t *e);
static int32_t hsink_create(spn_stage_t *s, const void *cfg, void **st, spn_error_t *e);
static int32_t dsink_create(spn_stage_t *s, const void *cfg, void **st, spn_error_t *e);
static void sink_destroy(spn_stage_t *s, void *st) { free(st); }

/* Test-only: the create callbacks find the host table and the counters of
 * the test that runs (one at a time in this process) here. */
static test_ctx_t *g_ctx;

/* What the host says the source's video port gives (placement included),
 * kept for the test (+ 1: 0 is "not asked"). */
static void src_note_port(spn_stage_t *s, const spn_host_api_t *h) {
  spn_port_format_t pf = {.struct_size = sizeof pf};
  spn_error_t e = SPN_ERROR_INIT;
  if (g_ctx && h->stage_port_format(s, true, 0, &pf, &e) == SPN_OK)
    atomic_store(&g_ctx->port_mem, pf.mem_kind + 1);
}
static const spn_host_api_t *g_host;

static int32_t src_create(spn_stage_t *s, const void *cfg, void **st, spn_error_t *e) {
  *st = (void *)g_host;
  return SPN_OK;
}

static int32_t sink_new(int32_t kind, atomic_llong *seen, atomic_llong *bad, void **st) {
  sink_state_t *ss = calloc(1, sizeof *ss);
  ss->h = g_host;
  ss->want_kind = kind;
  ss->seen = seen;
  ss->bad = bad;
  *st = ss;
  return SPN_OK;
}

static int32_t hsink_create(spn_stage_t *s, const void *cfg, void **st, spn_error_t *e) {
  return sink_new(SPN_MEM_HOST, &g_ctx->seen_host, &g_ctx->bad_host, st);
}

static int32_t dsink_create(spn_stage_t *s, const void *cfg, void **st, spn_error_t *e) {
  return sink_new(SPN_MEM_DEVICE, &g_ctx->seen_dev, &g_ctx->bad_dev, st);
}

static int32_t src_caps(const void *config, bool is_output, uint32_t port, spn_port_caps_t *caps, spn_error_t *err) {
  const src_config_t *c = config;
  if (is_output && port == 0 && c->format[0]) {
    if (!strcmp(c->format, "nv12"))
      caps->pixel_formats = SPN_FMTSET(SPN_PIX_NV12);
    else if (!strcmp(c->format, "rgb24"))
      caps->pixel_formats = SPN_FMTSET(SPN_PIX_RGB24);
    else
      return spn_error_set(err, SPN_ECONFIG, "format \"%s\" is not nv12 or rgb24", c->format);
  }
  if (is_output && port == 0 && c->either)
    caps->mem_kinds = SPN_MEMSET_DEVICE | SPN_MEMSET_HOST;
  if (is_output && port == 1)
    caps->sample_rate = (uint32_t)c->rate;
  return SPN_OK;
}

static const spn_port_t src_out[] = {{"video", "video"}, {"audio", "audio"}};
static const spn_port_t v_in[] = {{"in", "video"}};
static const spn_port_t a_in[] = {{"in", "audio"}};
static const spn_port_t any_in[] = {{"in", "any"}};

/* The source gives rgb24, nv12 or yuv420p (any memory); the sinks: */
static const spn_port_caps_t src_out_caps[] = {
    {.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SPN_MEMSET_DEVICE,
     .pixel_formats = SPN_FMTSET(SPN_PIX_YUV420P) | SPN_FMTSET(SPN_PIX_NV12) | SPN_FMTSET(SPN_PIX_RGB24)},
    {.struct_size = sizeof(spn_port_caps_t), .sample_formats = SPN_FMTSET(SPN_SAMPLE_F32)}};
static const spn_port_caps_t yuv_caps[] = {{.struct_size = sizeof(spn_port_caps_t),
                                            .pixel_formats = SPN_FMTSET(SPN_PIX_YUV420P) | SPN_FMTSET(SPN_PIX_NV12)}};
static const spn_port_caps_t rgb_caps[] = {{.struct_size = sizeof(spn_port_caps_t),
                                            .pixel_formats = SPN_FMTSET(SPN_PIX_RGB24) | SPN_FMTSET(SPN_PIX_BGR24)}};
static const spn_port_caps_t bgr_caps[] = {{.struct_size = sizeof(spn_port_caps_t),
                                            .pixel_formats = SPN_FMTSET(SPN_PIX_BGR24)}};
static const spn_port_caps_t dev_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SPN_MEMSET_DEVICE}};
static const spn_port_caps_t either_caps[] = {
    {.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SPN_MEMSET_DEVICE | SPN_MEMSET_HOST}};
static const spn_port_caps_t rate_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .sample_rate = 16000}};

static spn_stage_kind_t k_src, k_yuv, k_rgb, k_bgr, k_old, k_hsink, k_dsink, k_esink, k_rate;

static spn_stage_kind_t sink_kind(const char *name, const spn_port_t *in, const spn_port_caps_t *caps) {
  spn_stage_kind_t k = SPN_STAGE_KIND_INIT;
  k.name = name;
  k.inputs = in;
  k.n_inputs = 1;
  k.device_need = SPN_NEED_EITHER;
  k.process = sink_proc;
  k.create = hsink_create;
  k.destroy = sink_destroy;
  k.input_caps = caps;
  return k;
}

static void init_kinds(void) {
  spn_stage_kind_t base = SPN_STAGE_KIND_INIT;
  k_src = base;
  k_src.name = "src";
  k_src.schema = src_schema;
  k_src.config_size = sizeof(src_config_t);
  k_src.outputs = src_out;
  k_src.n_outputs = 2;
  k_src.device_need = SPN_NEED_EITHER;
  k_src.create = src_create;
  k_src.job_open = src_open;
  k_src.job_close = src_close;
  k_src.generate = src_gen;
  k_src.output_caps = src_out_caps;
  k_src.port_caps = src_caps;
  k_yuv = sink_kind("yuv", v_in, yuv_caps);
  k_rgb = sink_kind("rgb", v_in, rgb_caps);
  k_bgr = sink_kind("bgr", v_in, bgr_caps);
  k_rate = sink_kind("rate16k", a_in, rate_caps);
  /* Built against ABI 1.0: its struct ends before the 1.1 block. */
  k_old = sink_kind("old", any_in, NULL);
  k_old.struct_size = (uint32_t)offsetof(spn_stage_kind_t, input_caps);
  k_hsink = sink_kind("hsink", any_in, NULL);
  k_hsink.struct_size = (uint32_t)offsetof(spn_stage_kind_t, input_caps);
  k_dsink = sink_kind("dsink", any_in, dev_caps);
  k_dsink.create = dsink_create;
  /* Takes either memory; in these tests it always gets host memory. */
  k_esink = sink_kind("esink", any_in, either_caps);
}

static int setup(void **state) {
  init_kinds();
  spn__registry_t *reg = NULL;
  if (spn__registry_new(&reg, NULL) != SPN_OK)
    return -1;
  const spn_stage_kind_t *all[] = {&k_src, &k_yuv, &k_rgb, &k_bgr, &k_old, &k_hsink, &k_dsink, &k_rate};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    spn_error_t err = SPN_ERROR_INIT;
    if (spn__registry_add_kind(reg, all[i], "test", &err) != SPN_OK) {
      print_error("add %s: %s\n", all[i]->name, err.msg);
      return -1;
    }
  }
  *state = reg;
  return 0;
}

static int teardown(void **state) {
  spn__registry_t *reg = *state;
  spn__registry_free(&reg);
  return 0;
}

static int32_t build(spn__registry_t *reg, const char *name, const char *toml, spn__pipeline_spec_t **out,
                     spn_error_t *err) {
  spn_toml_doc_t *doc = NULL;
  int32_t rc = spn_toml_parse(toml, strlen(toml), name, &doc, err);
  if (rc != SPN_OK)
    return rc;
  rc = spn__spec_from_toml(reg, doc, NULL, 0, out, err);
  spn_toml_doc_free(&doc);
  return rc;
}

static const spn__edge_spec_t *edge_to(const spn__pipeline_spec_t *spec, const char *to) {
  for (size_t e = 0; e < spec->n_edges; e++)
    if (!strcmp(spec->stages[spec->edges[e].to_stage].name, to))
      return &spec->edges[e];
  fail_msg("no edge into %s", to);
  return NULL;
}

/* ---- negotiation ---------------------------------------------------------- */

static void picks_lowest_common(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  /* yuv takes {nv12, yuv420p}: nv12 (6) before yuv420p (7); rgb takes rgb24. */
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\n"
                  "[[stage]]\nname = \"y\"\nkind = \"yuv\"\ninputs = [\"s.video\"]\n"
                  "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n";
  assert_int_equal(build(*state, "p.toml", t, &spec, &err), SPN_OK);
  const spn__edge_spec_t *e = edge_to(spec, "y");
  assert_int_equal(e->format.pixel_format, SPN_PIX_NV12);
  assert_int_equal(e->format.mem_kind, SPN_MEM_HOST); /* the consumer (no mem caps) takes host */
  assert_int_equal(e->mem_from, SPN_MEMSET_DEVICE);
  assert_int_equal(e->mem_to, SPN_MEMSET_HOST);
  assert_int_equal(edge_to(spec, "a")->format.sample_format, SPN_SAMPLE_F32);
  spn__spec_free(&spec);
  /* Two consumers of one output: one format they both take (rgb24). */
  const char *t2 = "[[stage]]\nname = \"s\"\nkind = \"src\"\n"
                   "[[stage]]\nname = \"r\"\nkind = \"rgb\"\ninputs = [\"s.video\"]\n"
                   "[[stage]]\nname = \"o\"\nkind = \"old\"\ninputs = [\"s.video\"]\n"
                   "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n";
  assert_int_equal(build(*state, "p.toml", t2, &spec, &err), SPN_OK);
  assert_int_equal(edge_to(spec, "r")->format.pixel_format, SPN_PIX_RGB24);
  assert_int_equal(edge_to(spec, "o")->format.pixel_format, SPN_PIX_RGB24);
  spn__spec_free(&spec);
}

static void config_narrows_and_refusals_name_both(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  /* format = "nv12" narrows the source: the rgb sink cannot take it. */
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\nformat = \"nv12\"\n"
                  "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                  "[[stage]]\nname = \"r\"\nkind = \"rgb\"\n  inputs = [\"s.video\"]\n";
  assert_int_equal(build(*state, "n.toml", t, &spec, &err), SPN_ECONFIG);
  assert_null(spec);
  assert_string_equal(err.msg, "n.toml:12:13: stage \"r\": input port \"in\" takes rgb24, bgr24 frames, but stage \"s\" "
                               "(\"s.video\") gives nv12: no common pixel format (set convert = \"auto\" on the edge "
                               "or the stage to insert a conversion)");
  /* convert = "auto" with no "convert" kind loaded: refused, saying so. */
  const char *t2 = "[[stage]]\nname = \"s\"\nkind = \"src\"\nformat = \"nv12\"\n"
                   "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                   "[[stage]]\nname = \"r\"\nkind = \"rgb\"\ninputs = [{ from = \"s.video\", convert = \"auto\" }]\n";
  assert_int_equal(build(*state, "c.toml", t2, &spec, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "c.toml:12:20: stage \"r\": input port \"in\""));
  assert_non_null(strstr(err.msg, "convert = \"auto\" is set but no stage kind \"convert\" is loaded"));
  /* Two consumers whose sets do not meet: the second is named. */
  const char *t3 = "[[stage]]\nname = \"s\"\nkind = \"src\"\n"
                   "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                   "[[stage]]\nname = \"y\"\nkind = \"yuv\"\ninputs = [\"s.video\"]\n"
                   "[[stage]]\nname = \"b\"\nkind = \"bgr\"\ninputs = [\"s.video\"]\n";
  assert_int_equal(build(*state, "two.toml", t3, &spec, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "two.toml:15:11: stage \"b\": input port \"in\" takes bgr24 frames, but stage \"s\" "
                                  "(\"s.video\") gives nv12, yuv420p"));
  /* A bad config value in a port_caps callback is named with the stage. */
  const char *t4 = "[[stage]]\nname = \"s\"\nkind = \"src\"\nformat = \"gray\"\n"
                   "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                   "[[stage]]\nname = \"o\"\nkind = \"old\"\ninputs = [\"s.video\"]\n";
  assert_int_equal(build(*state, "f.toml", t4, &spec, &err), SPN_ECONFIG);
  assert_string_equal(err.msg, "f.toml:1:1: stage \"s\": output port \"video\": format \"gray\" is not nv12 or rgb24");
}

static void audio_mismatch(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\nrate = 48000\n"
                  "[[stage]]\nname = \"v\"\nkind = \"old\"\ninputs = [\"s.video\"]\n"
                  "[[stage]]\nname = \"m\"\nkind = \"rate16k\"\ninputs = [\"s.audio\"]\n";
  assert_int_equal(build(*state, "a.toml", t, &spec, &err), SPN_ECONFIG);
  assert_string_equal(err.msg, "a.toml:12:11: stage \"m\": input port \"in\" takes 16000 Hz audio, but stage \"s\" "
                               "(\"s.audio\") gives 48000 Hz (sample rate mismatch; audio is never converted "
                               "implicitly)");
  /* rate 0 = the file's: unknown at validation, not refused. */
  const char *t2 = "[[stage]]\nname = \"s\"\nkind = \"src\"\n"
                   "[[stage]]\nname = \"v\"\nkind = \"old\"\ninputs = [\"s.video\"]\n"
                   "[[stage]]\nname = \"m\"\nkind = \"rate16k\"\ninputs = [\"s.audio\"]\n";
  assert_int_equal(build(*state, "a.toml", t2, &spec, &err), SPN_OK);
  assert_int_equal(edge_to(spec, "m")->format.sample_rate, 16000);
  spn__spec_free(&spec);
}

static void old_kinds_are_unconstrained(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  /* An ABI 1.0 producer (no caps) feeding a 1.1 consumer: accepted. */
  static spn_stage_kind_t old_src; /* the registry keeps the pointer */
  old_src = k_src;
  old_src.name = "oldsrc";
  old_src.struct_size = (uint32_t)offsetof(spn_stage_kind_t, input_caps);
  old_src.output_caps = NULL;
  old_src.port_caps = NULL;
  assert_int_equal(spn__registry_add_kind(*state, &old_src, "test", &err), SPN_OK);
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"oldsrc\"\n"
                  "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                  "[[stage]]\nname = \"b\"\nkind = \"bgr\"\ninputs = [\"s.video\"]\n";
  assert_int_equal(build(*state, "o.toml", t, &spec, &err), SPN_OK);
  const spn__edge_spec_t *e = edge_to(spec, "b");
  assert_int_equal(e->format.pixel_format, SPN_PIX_BGR24); /* the consumer's only one */
  assert_int_equal(e->mem_from, SPN_MEMSET_HOST);
  spn_port_caps_t caps;
  assert_int_equal(spn__port_caps(&old_src, spec->stages[0].config, true, 0, &caps, &err), SPN_OK);
  assert_int_equal(caps.mem_kinds, SPN_MEMSET_HOST);
  assert_int_equal(caps.pixel_formats, 0);
  spn__spec_free(&spec);
}

/* ---- the copy plan ------------------------------------------------------- */

static void mem_plan(void **state) {
  (void)state;
  /* Host ports: host and pinned pass, device memory is copied to host. */
  assert_int_equal(spn__mem_plan(SPN_MEMSET_HOST, SPN_MEM_HOST, false, false), -1);
  assert_int_equal(spn__mem_plan(SPN_MEMSET_HOST, SPN_MEM_PINNED, false, true), -1);
  assert_int_equal(spn__mem_plan(SPN_MEMSET_HOST, SPN_MEM_DEVICE, true, true), SPN_MEM_HOST);
  assert_int_equal(spn__mem_plan(0, SPN_MEM_DEVICE, true, false), SPN_MEM_HOST); /* 0: ABI 1.0 = host */
  /* Pinned only: pageable host memory is copied into pinned. */
  assert_int_equal(spn__mem_plan(SPN_MEMSET_PINNED, SPN_MEM_HOST, true, true), SPN_MEM_PINNED);
  assert_int_equal(spn__mem_plan(SPN_MEMSET_PINNED, SPN_MEM_PINNED, false, true), -1);
  /* Device ports: same device passes, another device or host is copied. */
  assert_int_equal(spn__mem_plan(SPN_MEMSET_DEVICE, SPN_MEM_DEVICE, true, true), -1);
  assert_int_equal(spn__mem_plan(SPN_MEMSET_DEVICE, SPN_MEM_DEVICE, false, true), SPN_MEM_DEVICE);
  assert_int_equal(spn__mem_plan(SPN_MEMSET_DEVICE, SPN_MEM_HOST, true, true), SPN_MEM_DEVICE);
  /* Either: device memory elsewhere lands in device memory here. */
  assert_int_equal(spn__mem_plan(SPN_MEMSET_DEVICE | SPN_MEMSET_HOST, SPN_MEM_DEVICE, false, true), SPN_MEM_DEVICE);
  assert_int_equal(spn__mem_plan(SPN_MEMSET_DEVICE | SPN_MEMSET_HOST, SPN_MEM_HOST, false, true), -1);
  /* A pool consumer (no device) taking either gets host memory. */
  assert_int_equal(spn__mem_plan(SPN_MEMSET_DEVICE | SPN_MEMSET_HOST, SPN_MEM_DEVICE, false, false), SPN_MEM_HOST);
}

/* ---- copies at run time on emulated devices ------------------------------ */

/* Edge figures with their names copied out (they are borrowed from the
 * pipeline, which is freed before the test looks). */
typedef struct edge_rec {
  spn_edge_stats_t st;
  char from[32], to[32];
  uint64_t dev[3][4]; /* spn_runtime_device_bytes_copied: cpu:0, cpu:1, host (in rec[0]) */
} edge_rec_t;

static void run_edges(const char *toml, int64_t frames, edge_rec_t *rec, test_ctx_t *ctx) {
  spn_edge_stats_t st[2];
  spn_runtime_opts_t o = SPN_RUNTIME_OPTS_INIT;
  o.devices = "cpu:2";
  o.log_level = SPN_LOG_ERROR + 1;
  spn_runtime_t *rt = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&o, &rt, &err) != SPN_OK)
    fail_msg("runtime: %s", err.msg);
  g_host = spn__runtime_host_api(rt);
  g_ctx = ctx;
  const spn_stage_kind_t *all[] = {&k_src, &k_old, &k_hsink, &k_dsink, &k_esink};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (spn__registry_add_kind(rt->reg, all[i], "test", &err) != SPN_OK)
      fail_msg("kind: %s", err.msg);
  spn_pipeline_t *pipe = NULL;
  if (spn_pipeline_load_string(rt, toml, strlen(toml), "mem.toml", NULL, 0, &pipe, &err) != SPN_OK)
    fail_msg("load: %s", err.msg);
  char ov[64];
  snprintf(ov, sizeof ov, "s.frames=%lld", (long long)frames);
  const char *ovs[] = {ov};
  spn_job_params_t p = SPN_JOB_PARAMS_INIT;
  p.overrides = ovs;
  p.n_overrides = 1;
  spn_job_t *job = NULL;
  spn_job_callbacks_t cb = {0};
  if (spn_job_start(pipe, &p, &cb, &job, &err) != SPN_OK)
    fail_msg("start: %s", err.msg);
  if (spn_job_wait(job, &err) != SPN_OK)
    fail_msg("job: %s", err.msg);
  assert_int_equal(spn_pipeline_edge_count(pipe), 2);
  for (size_t i = 0; i < 2; i++)
    assert_int_equal(spn_pipeline_edge_stats(pipe, i, &st[i]), SPN_OK);
  assert_int_equal(spn_pipeline_edge_stats(pipe, 2, &st[0]), SPN_EINVAL);
  assert_int_equal(spn_pipeline_edge_stats(pipe, 0, &st[0]), SPN_OK);
  for (size_t i = 0; i < 2; i++) {
    rec[i].st = st[i];
    snprintf(rec[i].from, sizeof rec[i].from, "%s", st[i].from_stage);
    snprintf(rec[i].to, sizeof rec[i].to, "%s", st[i].to_stage);
    rec[i].st.from_stage = rec[i].st.to_stage = rec[i].st.from_port = rec[i].st.to_port = rec[i].st.format = NULL;
  }
  assert_int_equal(spn_runtime_device_count(rt), 2);
  for (uint32_t d = 0; d < 3; d++)
    for (int k = 0; k < 4; k++)
      rec[0].dev[d][k] = spn_runtime_device_bytes_copied(rt, d, k);
  assert_int_equal(spn_runtime_device_bytes_copied(rt, 3, 0), 0);
  assert_int_equal(spn_runtime_device_bytes_copied(rt, 0, 4), 0);
  spn_job_free(&job);
  spn_pipeline_free(&pipe);
  spn_runtime_free(&rt);
}

/* Of run_edges' two records, the edge into stage `to`. */
static const edge_rec_t *edge_into(const edge_rec_t rec[2], const char *to) {
  const edge_rec_t *r = !strcmp(rec[0].to, to) ? &rec[0] : &rec[1];
  assert_string_equal(r->to, to);
  return r;
}

static void device_to_host_copies_once(void **state) {
  (void)state;
  test_ctx_t ctx = {0};
  edge_rec_t st[2];
  /* s (device memory, on cpu:0 and cpu:1) -> h (ABI 1.0 sink: host) */
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\ninstances = { count = 1, devices = \"0\" }\n"
                  "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                  "[[stage]]\nname = \"h\"\nkind = \"hsink\"\ninputs = [\"s.video\"]\n";
  run_edges(t, 37, st, &ctx);
  const edge_rec_t *r = edge_into(st, "h");
  const spn_edge_stats_t *e = &r->st;
  assert_string_equal(r->from, "s");
  assert_int_equal(e->messages, 37);
  assert_int_equal(e->copies[SPN_COPY_D2H], 37);
  assert_int_equal(e->bytes[SPN_COPY_D2H], 37 * FRAME_BYTES);
  assert_int_equal(e->copies[SPN_COPY_H2D] + e->copies[SPN_COPY_D2D] + e->copies[SPN_COPY_H2H], 0);
  assert_int_equal(e->items_passed, 0);
  assert_int_equal(e->mem_kind, SPN_MEM_HOST);
  /* By device: the device-to-host copies drained the source's device
   * (cpu:0, where its one replica runs); nothing else was copied. */
  assert_int_equal(st[0].dev[0][SPN_COPY_D2H], 37 * FRAME_BYTES);
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < 4; k++)
      if (d || k != SPN_COPY_D2H)
        assert_int_equal(st[0].dev[d][k], 0);
  assert_int_equal(atomic_load(&ctx.seen_host), 37);
  assert_int_equal(atomic_load(&ctx.bad_host), 0);
}

static void same_device_passes_handles(void **state) {
  (void)state;
  test_ctx_t ctx = {0};
  edge_rec_t st[2];
  /* One replica of each per device (cpu:0, cpu:1): chain per device, the
   * sink takes device memory: every handle passes, nothing is copied. */
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\n"
                  "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                  "[[stage]]\nname = \"d\"\nkind = \"dsink\"\ninputs = [\"s.video\"]\n";
  run_edges(t, 20, st, &ctx);
  const edge_rec_t *r = edge_into(st, "d");
  const spn_edge_stats_t *e = &r->st;
  assert_int_equal(e->mem_kind, SPN_MEM_DEVICE);
  assert_int_equal(atomic_load(&ctx.port_mem), SPN_MEM_DEVICE + 1); /* stage_port_format agrees */
  for (int d = 0; d < 4; d++)
    assert_int_equal(e->copies[d], 0);
  /* one job: the source replica it ran on emitted 20 frames */
  assert_int_equal(e->messages, 20);
  assert_int_equal(e->items_passed, 20);
  assert_int_equal(atomic_load(&ctx.seen_dev), 20);
  assert_int_equal(atomic_load(&ctx.bad_dev), 0);
}

static void either_source_off_gpu_gives_host(void **state) {
  (void)state;
  test_ctx_t ctx = {0};
  edge_rec_t st[2];
  /* s declares device or host memory and writes host memory on cpu:0; the
   * sink takes either: every handle passes, and the figures say host
   * memory (the sets alone would say device). */
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\neither = true\n"
                  "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                  "[[stage]]\nname = \"e\"\nkind = \"esink\"\ninputs = [\"s.video\"]\n";
  run_edges(t, 12, st, &ctx);
  const edge_rec_t *r = edge_into(st, "e");
  const spn_edge_stats_t *e = &r->st;
  assert_int_equal(e->mem_kind, SPN_MEM_HOST);
  /* and so does stage_port_format, which the source reads at job open */
  assert_int_equal(atomic_load(&ctx.port_mem), SPN_MEM_HOST + 1);
  for (int d = 0; d < 4; d++)
    assert_int_equal(e->copies[d], 0);
  assert_int_equal(e->items_passed, 12);
  assert_int_equal(atomic_load(&ctx.seen_host), 12);
  assert_int_equal(atomic_load(&ctx.bad_host), 0);
}

static void pool_consumer_gets_host(void **state) {
  (void)state;
  test_ctx_t ctx = {0};
  edge_rec_t st[2];
  /* s writes device memory on cpu:0; the sink takes either but runs in the
   * CPU pool: each frame is copied to host memory, and the figures say so. */
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\n"
                  "[[stage]]\nname = \"a\"\nkind = \"old\"\ninputs = [\"s.audio\"]\n"
                  "[[stage]]\nname = \"e\"\nkind = \"esink\"\ndevice = \"cpu\"\ninputs = [\"s.video\"]\n";
  run_edges(t, 9, st, &ctx);
  const edge_rec_t *r = edge_into(st, "e");
  const spn_edge_stats_t *e = &r->st;
  assert_int_equal(e->mem_kind, SPN_MEM_HOST);
  /* stage_port_format tells the source so (a source that can give host
   * memory can then skip the copy, as decode does) */
  assert_int_equal(atomic_load(&ctx.port_mem), SPN_MEM_HOST + 1);
  assert_int_equal(e->copies[SPN_COPY_D2H], 9);
  assert_int_equal(e->copies[SPN_COPY_H2D] + e->copies[SPN_COPY_D2D] + e->copies[SPN_COPY_H2H], 0);
  assert_int_equal(atomic_load(&ctx.seen_host), 9);
  assert_int_equal(atomic_load(&ctx.bad_host), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(picks_lowest_common),
      cmocka_unit_test(config_narrows_and_refusals_name_both),
      cmocka_unit_test(audio_mismatch),
      cmocka_unit_test(old_kinds_are_unconstrained),
      cmocka_unit_test(mem_plan),
      cmocka_unit_test(device_to_host_copies_once),
      cmocka_unit_test(same_device_passes_handles),
      cmocka_unit_test(either_source_off_gpu_gives_host),
      cmocka_unit_test(pool_consumer_gets_host),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
