/* test-spec.c — pipeline TOML → spec: wiring, topological order, config
 * filling, overrides, per-job configs, and every refusal with the exact
 * file:line:col and stage name (positions counted by hand from the
 * configs below). Kinds are registered directly, no plugins needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "spec-internal.h"

/* ---- test kinds -------------------------------------------------------- */

typedef struct src_config {
  int64_t frames;
  double fps;
  bool loop;
  char *label;
  char *input;   /* PATH, per job */
  char *model;   /* PATH, required */
  char *side;    /* PATH, per job: a second file */
} src_config_t;

static const spn_config_field_t src_schema[] = {
    {.key = "frames", .type = SPN_CONFIG_INT, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(src_config_t, frames),
     .doc = "frames", .def_int = 10, .min = 0, .max = 1000},
    {.key = "fps", .type = SPN_CONFIG_FLOAT, .offset = offsetof(src_config_t, fps), .doc = "rate", .def_float = 25,
     .min = 1, .max = 240},
    {.key = "loop", .type = SPN_CONFIG_BOOL, .offset = offsetof(src_config_t, loop), .doc = "loop", .def_int = 1},
    {.key = "label", .type = SPN_CONFIG_STRING, .offset = offsetof(src_config_t, label), .doc = "label",
     .def_str = "none"},
    {.key = "input", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(src_config_t, input),
     .doc = "input file"},
    {.key = "model", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_REQUIRED, .offset = offsetof(src_config_t, model),
     .doc = "model file"},
    {.key = "side", .type = SPN_CONFIG_PATH, .flags = SPN_CONFIG_PER_JOB, .offset = offsetof(src_config_t, side),
     .doc = "a second file"},
    {0},
};

static int32_t gen(spn_stage_t *s, void *st, void *js, spn_error_t *e) { return SPN_EOS; }
static int32_t proc(spn_stage_t *s, void *st, spn_msg_t **m, void **js, size_t n, spn_error_t *e) { return SPN_OK; }

static const spn_port_t av_out[] = {{"video", "video"}, {"audio", "audio"}};
static const spn_port_t video_in[] = {{"in", "video"}};
static const spn_port_t video_out[] = {{"out", "video"}};
static const spn_port_t any_in[] = {{"in", "any"}};
static const spn_port_t audio_in[] = {{"in", "audio"}};
static const spn_port_t mux_in[] = {{"video", "video"}, {"audio", "audio"}};

static spn_stage_kind_t k_src, k_filter, k_sink, k_aud, k_mux;

static void init_kinds(void) {
  spn_stage_kind_t base = SPN_STAGE_KIND_INIT;
  k_src = base;
  k_src.name = "src";
  k_src.schema = src_schema;
  k_src.config_size = sizeof(src_config_t);
  k_src.outputs = av_out;
  k_src.n_outputs = 2;
  k_src.generate = gen;
  k_filter = base;
  k_filter.name = "filter";
  k_filter.inputs = video_in;
  k_filter.n_inputs = 1;
  k_filter.outputs = video_out;
  k_filter.n_outputs = 1;
  k_filter.process = proc;
  k_filter.device_need = SPN_NEED_EITHER;
  k_filter.max_batch = 8;
  k_filter.max_delay_ms = 4;
  k_sink = base;
  k_sink.name = "sink";
  k_sink.inputs = any_in;
  k_sink.n_inputs = 1;
  k_sink.process = proc;
  k_aud = k_sink;
  k_aud.name = "aud";
  k_aud.inputs = audio_in;
  k_mux = k_sink;
  k_mux.name = "mux";
  k_mux.inputs = mux_in;
  k_mux.n_inputs = 2;
}

static int setup(void **state) {
  init_kinds();
  spn__registry_t *reg = NULL;
  if (spn__registry_new(&reg, NULL) != SPN_OK)
    return -1;
  const spn_stage_kind_t *ks[] = {&k_src, &k_filter, &k_sink, &k_aud, &k_mux};
  for (size_t i = 0; i < 5; i++)
    if (spn__registry_add_kind(reg, ks[i], "test", NULL) != SPN_OK)
      return -1;
  *state = reg;
  return 0;
}

static int teardown(void **state) {
  spn__registry_t *reg = *state;
  spn__registry_free(&reg);
  return 0;
}

/* Parse `toml` as `name` and build a spec. */
static int32_t build(spn__registry_t *reg, const char *name, const char *toml, const char *const *ov, size_t n_ov,
                     spn__pipeline_spec_t **out, spn_error_t *err) {
  spn_toml_doc_t *doc = NULL;
  int32_t rc = spn_toml_parse(toml, strlen(toml), name, &doc, err);
  if (rc != SPN_OK)
    return rc;
  rc = spn__spec_from_toml(reg, doc, ov, n_ov, out, err);
  spn_toml_doc_free(&doc);
  return rc;
}

/* Build, expect refusal `code` with every needle in the message. */
static void expect_error(spn__registry_t *reg, const char *toml, const char *const *ov, size_t n_ov, int32_t code,
                         const char *n1, const char *n2, const char *n3) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = build(reg, "conf/pipe.toml", toml, ov, n_ov, &spec, &err);
  if (rc != code)
    fail_msg("expected %s, got %s: %s", spn_err_name(code), spn_err_name(rc), err.msg);
  assert_null(spec);
  const char *needles[] = {n1, n2, n3};
  for (size_t i = 0; i < 3; i++)
    if (needles[i] && !strstr(err.msg, needles[i]))
      fail_msg("expected \"%s\" in: %s", needles[i], err.msg);
}

/* A valid three-stage chain, written sink first. */
static const char *chain =
    "[pipeline]\n"                          /* 1 */
    "name = \"chain\"\n"                    /* 2 */
    "\n"                                    /* 3 */
    "[[stage]]\n"                           /* 4 */
    "name = \"out\"\n"                      /* 5 */
    "kind = \"sink\"\n"                     /* 6 */
    "inputs = [\"f\"]\n"                    /* 7 */
    "\n"                                    /* 8 */
    "[[stage]]\n"                           /* 9 */
    "name = \"f\"\n"                        /* 10 */
    "kind = \"filter\"\n"                   /* 11 */
    "inputs = [\"s.video\"]\n"              /* 12 */
    "device = \"cpu:2\"\n"                  /* 13 */
    "instances = { count = 3, devices = \"0,2\" }\n"
    "batching = { max_batch = 16 }\n"       /* 15 */
    "endpoint = \"ipc:///tmp/f\"\n"         /* 16 */
    "edge_capacity = 7\n"                   /* 17 */
    "\n"                                    /* 18 */
    "[[stage]]\n"                           /* 19 */
    "name = \"s\"\n"                        /* 20 */
    "kind = \"src\"\n"                      /* 21 */
    "frames = 30\n"                         /* 22 */
    "fps = 30\n"                            /* 23 */
    "model = \"models/m.onnx\"\n"           /* 24 */
    "input = \"/abs/in.mp4\"\n"             /* 25 */
    "\n"
    "[[stage]]\n"                           /* 27 */
    "name = \"a\"\n"
    "kind = \"aud\"\n"
    "inputs = { in = \"s.audio\" }\n";      /* 30 */

static void chain_is_wired_ordered_and_filled(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (build(*state, "conf/pipe.toml", chain, NULL, 0, &spec, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  assert_string_equal(spec->name, "chain");
  assert_string_equal(spec->file, "conf/pipe.toml");
  assert_int_equal(spec->n_stages, 4);
  /* Kahn's order, ties by file order: s is the only source; then f and a
   * are ready (f first in the file), then out. */
  const char *want[] = {"s", "f", "out", "a"};
  for (size_t i = 0; i < 4; i++)
    assert_string_equal(spec->stages[i].name, want[i]);
  assert_int_equal(spec->n_edges, 3);
  /* s.video -> f.in, f.out -> out.in, s.audio -> a.in, indexes after sorting */
  bool seen[3] = {false, false, false};
  for (size_t e = 0; e < spec->n_edges; e++) {
    spn__edge_spec_t x = spec->edges[e];
    assert_true(x.from_stage < x.to_stage);
    if (x.from_stage == 0 && x.from_port == 0 && x.to_stage == 1 && x.to_port == 0)
      seen[0] = true;
    if (x.from_stage == 1 && x.from_port == 0 && x.to_stage == 2 && x.to_port == 0)
      seen[1] = true;
    if (x.from_stage == 0 && x.from_port == 1 && x.to_stage == 3 && x.to_port == 0)
      seen[2] = true;
  }
  assert_true(seen[0] && seen[1] && seen[2]);

  const spn__stage_spec_t *s = &spec->stages[0], *f = &spec->stages[1], *o = &spec->stages[2];
  assert_ptr_equal(s->kind, spn__registry_find(*state, "src", NULL));
  assert_string_equal(s->where, "conf/pipe.toml:19:1");
  const src_config_t *c = s->config;
  assert_int_equal(c->frames, 30);
  assert_true(c->fps == 30.0); /* an integer accepted for a float */
  assert_true(c->loop);        /* default */
  assert_string_equal(c->label, "none");
  assert_string_equal(c->model, "conf/models/m.onnx"); /* relative to the config's folder */
  assert_string_equal(c->input, "/abs/in.mp4");

  assert_string_equal(f->device, "cpu:2");
  assert_int_equal(f->instances, 3);
  assert_string_equal(f->instance_devices, "0,2");
  assert_int_equal(f->max_batch, 16);
  assert_int_equal(f->max_delay_ms, 4); /* kind default kept */
  assert_string_equal(f->endpoint, "ipc:///tmp/f");
  assert_int_equal(f->edge_capacity, 7);

  assert_string_equal(o->device, "auto");
  assert_int_equal(o->instances, 1);
  assert_null(o->instance_devices);
  assert_int_equal(o->max_batch, 1);
  assert_null(o->endpoint);
  assert_int_equal(o->edge_capacity, 0);
  spn__spec_free(&spec);
  assert_null(spec);
}

static void name_defaults_to_the_file_stem(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  const char *t = "[[stage]]\nname = \"s\"\nkind = \"src\"\nmodel = \"m\"\n";
  assert_int_equal(build(*state, "a/b/fast.v2.toml", t, NULL, 0, &spec, &err), SPN_OK);
  assert_string_equal(spec->name, "fast.v2");
  assert_int_equal(spec->n_edges, 0);
  assert_string_equal(((src_config_t *)spec->stages[0].config)->model, "a/b/m");
  spn__spec_free(&spec);
}

/* A source "s" (model set) then what the test appends. */
#define SRC "[[stage]]\nname = \"s\"\nkind = \"src\"\nmodel = \"m\"\n" /* lines 1-4 */

static void unknown_kind(void **state) {
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"blur\"\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:7:8: stage \"x\"", "unknown stage kind \"blur\"", "known: src, filter, sink, aud, mux");
}

static void dangling_input(void **state) {
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"sink\"\ninputs = [\"decode.video\"]\n", NULL, 0,
               SPN_ECONFIG, "conf/pipe.toml:8:11: stage \"x\"", "input \"decode.video\" names no stage \"decode\"",
               NULL);
}

static void unknown_port(void **state) {
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"sink\"\ninputs = [\"s.depth\"]\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:8:11: stage \"x\"", "no output port \"depth\"", "(outputs: video, audio)");
  /* by-name form: the input port itself is unknown (position of the key) */
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"sink\"\ninputs = { inn = \"s.video\" }\n", NULL, 0,
               SPN_ECONFIG, "conf/pipe.toml:8:12: stage \"x\"", "kind \"sink\" has no input port \"inn\" (inputs: in)",
               NULL);
}

static void cycle(void **state) {
  const char *t = SRC
      "[[stage]]\nname = \"a\"\nkind = \"mux\"\ninputs = [\"b\", \"s.audio\"]\n"   /* 5-8 */
      "[[stage]]\nname = \"b\"\nkind = \"filter\"\ninputs = [\"c\"]\n"              /* 9-12 */
      "[[stage]]\nname = \"c\"\nkind = \"filter\"\ninputs = [\"b\"]\n";             /* 13-16 */
  /* mux has no outputs, so "a" cannot be in a loop: the loop is b <-> c.
   * The walk starts at the first unplaced stage (a), goes to its producer b,
   * then c, then b again. */
  expect_error(*state, t, NULL, 0, SPN_ECONFIG, "stage \"", "cycle in the pipeline: ", NULL);
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  build(*state, "conf/pipe.toml", t, NULL, 0, &spec, &err);
  bool bc = strstr(err.msg, "conf/pipe.toml:16:10: stage \"c\": cycle in the pipeline: c -> b -> c") != NULL;
  bool cb = strstr(err.msg, "conf/pipe.toml:12:10: stage \"b\": cycle in the pipeline: b -> c -> b") != NULL;
  if (!bc && !cb)
    fail_msg("cycle message: %s", err.msg);
  /* a stage feeding itself */
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"filter\"\ninputs = [\"x\"]\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:8:10: stage \"x\"", "cycle in the pipeline: x -> x", NULL);
}

static void type_mismatch(void **state) {
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"aud\"\ninputs = [\"s.video\"]\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:8:11: stage \"x\"", "input port \"in\" takes audio, but \"s.video\" gives video",
               "port type mismatch");
  /* "any" on either side connects */
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(build(*state, "p.toml", SRC "[[stage]]\nname = \"x\"\nkind = \"sink\"\ninputs = [\"s.audio\"]\n",
                         NULL, 0, &spec, &err),
                   SPN_OK);
  spn__spec_free(&spec);
}

static void missing_and_extra_inputs(void **state) {
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"mux\"\ninputs = [\"s.video\"]\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:8:10: stage \"x\"", "input port \"audio\" of kind \"mux\" is not connected", NULL);
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"sink\"\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:5:1: stage \"x\"", "input port \"in\" of kind \"sink\" is not connected", NULL);
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"sink\"\ninputs = [\"s.video\", \"s.audio\"]\n", NULL, 0,
               SPN_ECONFIG, "conf/pipe.toml:8:22: stage \"x\"", "has 1 input port(s) (in), inputs lists 2", NULL);
  expect_error(*state, SRC "[[stage]]\nname = \"x\"\nkind = \"sink\"\ninputs = \"s\"\n", NULL, 0, SPN_ETYPE,
               "conf/pipe.toml:8:10: stage \"x\"", "inputs must be an array", NULL);
  /* a sink cannot be an input */
  expect_error(*state, SRC "[[stage]]\nname = \"k\"\nkind = \"sink\"\ninputs = [\"s\"]\n"
                       "[[stage]]\nname = \"x\"\nkind = \"sink\"\ninputs = [\"k\"]\n",
               NULL, 0, SPN_ECONFIG, "conf/pipe.toml:12:11: stage \"x\"", "stage \"k\" (kind \"sink\") has no outputs",
               NULL);
}

static void duplicate_names(void **state) {
  expect_error(*state, SRC "\n[[stage]]\nname = \"s\"\nkind = \"sink\"\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:7:8: stage \"s\"", "duplicate stage name (first defined at conf/pipe.toml:1:1)", NULL);
  expect_error(*state, "[[stage]]\nname = \"a.b\"\nkind = \"src\"\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:8",
               "name must be a string of letters", NULL);
  expect_error(*state, "[[stage]]\nkind = \"src\"\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:1:1",
               "[[stage]] #1 has no name", NULL);
  expect_error(*state, "[[stage]]\nname = \"q\"\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:1:1: stage \"q\"",
               "no kind", NULL);
}

static void unknown_key(void **state) {
  expect_error(*state, SRC "  framez = 3\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:3: stage \"s\"",
               "unknown key \"framez\" for kind \"src\"", "its keys: frames, fps, loop, label, input, model");
  expect_error(*state, SRC "batching = { max_batch = 2, delay = 3 }\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:5:29: stage \"s\"", "unknown key \"delay\" in batching", NULL);
  expect_error(*state, SRC "instances = { count = 2, where = 3 }\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:5:26: stage \"s\"", "unknown key \"where\" in instances", NULL);
  expect_error(*state, "[pipeline]\nname = \"p\"\nversion = 2\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:3:1",
               "unknown key \"version\" in [pipeline]", NULL);
  expect_error(*state, "stages = 1\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:1:1", "unknown top-level key \"stages\"",
               NULL);
}

static void wrong_types(void **state) {
  expect_error(*state, SRC "frames = \"ten\"\n", NULL, 0, SPN_ETYPE, "conf/pipe.toml:5:10: stage \"s\"",
               "key \"frames\" must be an integer, got string", NULL);
  expect_error(*state, SRC "frames = 2.5\n", NULL, 0, SPN_ETYPE, "conf/pipe.toml:5:10", "got float", NULL);
  expect_error(*state, SRC "loop = 1\n", NULL, 0, SPN_ETYPE, "conf/pipe.toml:5:8: stage \"s\"",
               "key \"loop\" must be a boolean, got integer", NULL);
  expect_error(*state, SRC "label = 3\n", NULL, 0, SPN_ETYPE, "conf/pipe.toml:5:9", "must be a string", NULL);
  expect_error(*state, SRC "device = 1\n", NULL, 0, SPN_ETYPE, "conf/pipe.toml:5:10: stage \"s\"",
               "key \"device\" must be a string, got integer", NULL);
  expect_error(*state, SRC "device = \"tpu\"\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:10: stage \"s\"",
               "device \"tpu\" is not auto", NULL);
  expect_error(*state, SRC "device = \"cuda:0\"\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:10: stage \"s\"",
               "kind \"src\" runs on cpu only", NULL);
  expect_error(*state, SRC "endpoint = \"http://x\"\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:12",
               "must start with inproc://, ipc:// or tcp://", NULL);
  expect_error(*state, SRC "batching = 4\n", NULL, 0, SPN_ETYPE, "conf/pipe.toml:5:12: stage \"s\"",
               "batching must be a table", NULL);
}

static void missing_required_key(void **state) {
  expect_error(*state, "\n[[stage]]\nname = \"s\"\nkind = \"src\"\n", NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:2:1: stage \"s\"", "missing required key \"model\" (model file)", NULL);
}

static void out_of_range(void **state) {
  expect_error(*state, SRC "frames = 1001\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:10: stage \"s\"",
               "key \"frames\" = 1001 is out of range [0, 1000]", NULL);
  expect_error(*state, SRC "fps = 0.5\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:7: stage \"s\"",
               "key \"fps\" = 0.5 is out of range [1, 240]", NULL);
  expect_error(*state, SRC "fps = nan\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:7", "out of range", NULL);
  expect_error(*state, SRC "instances = 0\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:13: stage \"s\"",
               "\"instances\" = 0 is out of range [1, 1024]", NULL);
  expect_error(*state, SRC "edge_capacity = 0\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:5:17", "out of range", NULL);
}

static void overrides_apply_before_validation(void **state) {
  const char *ov[] = {"s.frames=99", "s.label=hello", "s.fps = 60.5", "s.loop=false", "s.model=rel/m.onnx",
                      "s.device=cpu:1", "s.batching={ max_batch = 4 }"};
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  /* model is required and missing in the file: --set provides it */
  if (build(*state, "conf/pipe.toml", "[[stage]]\nname = \"s\"\nkind = \"src\"\nframes = 5\n", ov, 7, &spec, &err) !=
      SPN_OK)
    fail_msg("%s", err.msg);
  const src_config_t *c = spec->stages[0].config;
  assert_int_equal(c->frames, 99);
  assert_string_equal(c->label, "hello"); /* a bare word is a string */
  assert_true(c->fps == 60.5);
  assert_false(c->loop);
  assert_string_equal(c->model, "rel/m.onnx"); /* as typed: relative to the cwd */
  assert_string_equal(spec->stages[0].device, "cpu:1");
  assert_int_equal(spec->stages[0].max_batch, 4);
  spn__spec_free(&spec);
}

static void bad_overrides(void **state) {
  const char *a[] = {"q.frames=1"};
  expect_error(*state, SRC, a, 1, SPN_ECONFIG, "--set \"q.frames=1\": stage \"q\"", "no such stage", NULL);
  const char *b[] = {"s.frames=ten"};
  expect_error(*state, SRC, b, 1, SPN_ETYPE, "--set \"s.frames=ten\": stage \"s\"",
               "key \"frames\" must be an integer, got string", NULL);
  const char *c[] = {"s.nope=1"};
  expect_error(*state, SRC, c, 1, SPN_ECONFIG, "--set \"s.nope=1\": stage \"s\"", "unknown key \"nope\"", NULL);
  const char *d[] = {"frames=1"};
  expect_error(*state, SRC, d, 1, SPN_ECONFIG, "--set \"frames=1\"", "expected stage.key=value", NULL);
  const char *e[] = {"s.frames=5000"};
  expect_error(*state, SRC, e, 1, SPN_ECONFIG, "--set \"s.frames=5000\": stage \"s\"", "out of range [0, 1000]", NULL);
  const char *f[] = {"s.kind=sink"};
  expect_error(*state, SRC, f, 1, SPN_ECONFIG, "--set \"s.kind=sink\": stage \"s\"", "cannot be overridden", NULL);
  /* text that would inject a second key stays one string */
  const char *g[] = {"s.label=x\nframes = 7"};
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(build(*state, "p.toml", SRC, g, 1, &spec, &err), SPN_OK);
  assert_string_equal(((src_config_t *)spec->stages[0].config)->label, "x\nframes = 7");
  assert_int_equal(((src_config_t *)spec->stages[0].config)->frames, 10);
  spn__spec_free(&spec);
}

/* precision: the GPU arithmetic of a stage's models; auto unless set, by
 * the file or by --set, and a bad value is named with its place. */
static void precision_key(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (build(*state, "p.toml", "[[stage]]\nname = \"s\"\nkind = \"src\"\nmodel = \"m\"\nprecision = \"fp16\"\n", NULL, 0,
            &spec, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(spec->stages[0].precision, SPN__PREC_FP16);
  assert_string_equal(spn__precision_name(spec->stages[0].precision), "fp16");
  spn__spec_free(&spec);
  const char *ov[] = {"s.precision=fp32"};
  if (build(*state, "p.toml", SRC, ov, 1, &spec, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(spec->stages[0].precision, SPN__PREC_FP32);
  spn__spec_free(&spec);
  if (build(*state, "p.toml", SRC, NULL, 0, &spec, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(spec->stages[0].precision, SPN__PREC_AUTO);
  assert_string_equal(spn__precision_name(SPN__PREC_AUTO), "tf32"); /* auto on a GPU */
  spn__spec_free(&spec);
  expect_error(*state, "[[stage]]\nname = \"s\"\nkind = \"src\"\nmodel = \"m\"\nprecision = \"half\"\n", NULL, 0,
               SPN_ECONFIG, "conf/pipe.toml:5", "precision \"half\" is not auto, fp32, tf32 or fp16", NULL);
  expect_error(*state, "[[stage]]\nname = \"s\"\nkind = \"src\"\nmodel = \"m\"\nprecision = 16\n", NULL, 0, SPN_ETYPE,
               "conf/pipe.toml:5", "precision", NULL);
  const char *bad[] = {"s.precision=int8"};
  expect_error(*state, SRC, bad, 1, SPN_ECONFIG, "--set \"s.precision=int8\"", "is not auto, fp32, tf32 or fp16", NULL);
}

/* A path key holding a URL or a protocol ("https://...", FFmpeg's
 * "pipe:0") is kept as typed; a relative file name, even one with a colon
 * after one letter or a digit, is joined to the config's folder. */
static void url_paths_are_kept(void **state) {
  const struct { const char *typed, *want; } cases[] = {
      {"pipe:0", "pipe:0"},
      {"https://cdn.example/clip.mp4", "https://cdn.example/clip.mp4"},
      {"rtsp://cam/1", "rtsp://cam/1"},
      {"clips/a.mp4", "conf/clips/a.mp4"},
      {"c:a.mp4", "conf/c:a.mp4"},
      {"2x:a.mp4", "conf/2x:a.mp4"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char toml[256];
    snprintf(toml, sizeof toml, SRC "input = \"%s\"\n", cases[i].typed);
    spn__pipeline_spec_t *spec = NULL;
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(build(*state, "conf/pipe.toml", toml, NULL, 0, &spec, &err), SPN_OK);
    assert_string_equal(((const src_config_t *)spec->stages[0].config)->input, cases[i].want);
    spn__spec_free(&spec);
  }
}

static void plugin_paths_resolve_against_the_config(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(build(*state, "conf/pipe.toml", "[plugins]\npath = [\"plug\", \"/opt/p\"]\n" SRC, NULL, 0, &spec, &err),
                   SPN_OK);
  assert_int_equal(spec->n_plugin_paths, 2);
  assert_string_equal(spec->plugin_paths[0], "conf/plug");
  assert_string_equal(spec->plugin_paths[1], "/opt/p");
  spn__spec_free(&spec);
  expect_error(*state, "[plugins]\npath = 3\n" SRC, NULL, 0, SPN_ETYPE, "conf/pipe.toml:2:8", "path entries", NULL);
}

static void empty_pipeline_is_refused(void **state) {
  expect_error(*state, "[pipeline]\nname = \"p\"\n", NULL, 0, SPN_ECONFIG, "conf/pipe.toml:1:1", "has no [[stage]]",
               NULL);
}

/* [pipeline.inputs/outputs/params]: read, and every target checked. */
static void job_bindings(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(build(*state, "conf/pipe.toml",
                         "[pipeline.inputs]\nvideo = \"s.input\"\n[pipeline.params]\nn = \"s.frames\"\n" SRC, NULL, 0,
                         &spec, &err),
                   SPN_OK);
  assert_int_equal(spec->n_bindings, 2);
  assert_int_equal(spec->bindings[0].kind, SPN_BINDING_INPUT);
  assert_string_equal(spec->bindings[0].name, "video");
  assert_string_equal(spec->bindings[0].target, "s.input");
  assert_string_equal(spec->bindings[0].where, "conf/pipe.toml:2:9");
  assert_int_equal(spec->bindings[1].kind, SPN_BINDING_PARAM);
  assert_string_equal(spec->bindings[1].target, "s.frames");
  spn__spec_free(&spec);
  /* line 2 is the binding, SRC follows on lines 3-6 */
  expect_error(*state, "[pipeline.outputs]\nv = \"nope.input\"\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:5",
               "[pipeline.outputs] v", "has no stage \"nope\"");
  expect_error(*state, "[pipeline.params]\nv = \"s.fps\"\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:5",
               "key \"fps\" is set per pipeline, not per job", NULL);
  expect_error(*state, "[pipeline.inputs]\nv = \"s.frames\"\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:5",
               "key \"frames\" is not a string or path", NULL);
  expect_error(*state, "[pipeline.params]\nv = \"s.nope\"\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:5",
               "unknown key \"nope\" for kind \"src\"", NULL);
  /* an optional input: { key, default = another input a job must give } */
  assert_int_equal(build(*state, "conf/pipe.toml",
                         "[pipeline.inputs]\nvideo = \"s.input\"\nalt = { key = \"s.side\", default = \"video\" }\n"
                         SRC, NULL, 0, &spec, &err),
                   SPN_OK);
  assert_int_equal(spec->n_bindings, 2);
  assert_null(spec->bindings[0].fallback);
  assert_string_equal(spec->bindings[1].target, "s.side");
  assert_string_equal(spec->bindings[1].fallback, "video");
  spn__spec_free(&spec);
  expect_error(*state, "[pipeline.inputs]\nalt = { key = \"s.side\", default = \"vid\" }\n" SRC, NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:2:15", "[pipeline.inputs] alt: default \"vid\" is not another input", NULL);
  expect_error(*state, "[pipeline.inputs]\nalt = { key = \"s.side\", default = \"alt\" }\n" SRC, NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:2:15", "default \"alt\" is not another input", NULL);
  expect_error(*state,
               "[pipeline.inputs]\nv = { key = \"s.input\", default = \"w\" }\nw = { key = \"s.side\", default = \"v\" }\n"
               SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:13", "default \"w\" has a default of its own", NULL);
  expect_error(*state, "[pipeline.inputs]\nalt = { key = \"s.side\", fallback = \"v\" }\n" SRC, NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:2:", "unknown key \"fallback\" (known: key, default)", NULL);
  expect_error(*state, "[pipeline.inputs]\nalt = { default = \"v\" }\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:7",
               "[pipeline.inputs] alt: no key = \"stage.key\"", NULL);
  expect_error(*state, "[pipeline.outputs]\nalt = { key = \"s.side\", default = \"v\" }\n" SRC, NULL, 0, SPN_ETYPE,
               "conf/pipe.toml:2:7", "[pipeline.outputs] alt must be a string \"stage.key\"", NULL);
  /* a param naming a file would bypass the checks a job's inputs and
   * outputs get (the job service's roots); one key bound twice would let
   * a param replace an input's file */
  expect_error(*state, "[pipeline.params]\nv = \"s.input\"\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:5",
               "[pipeline.params] v: stage \"s\": key \"input\" is a path: bind files in [pipeline.inputs] or "
               "[pipeline.outputs]",
               NULL);
  expect_error(*state, "[pipeline.inputs]\nv = \"s.input\"\n[pipeline.outputs]\nw = \"s.input\"\n" SRC, NULL, 0,
               SPN_ECONFIG, "conf/pipe.toml:4:5",
               "[pipeline.outputs] w: \"s.input\" is bound already, by [pipeline.inputs] v", NULL);
  expect_error(*state, "[pipeline.params]\nn = \"s.frames\"\nm = \"s.frames\"\n" SRC, NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:3:5", "[pipeline.params] m: \"s.frames\" is bound already, by [pipeline.params] n", NULL);
  expect_error(*state, "[pipeline.params]\nv = \"frames\"\n" SRC, NULL, 0, SPN_ETYPE, "conf/pipe.toml:2:5",
               "must be a string \"stage.key\"", NULL);
  expect_error(*state, "[pipeline.params]\nv = 3\n" SRC, NULL, 0, SPN_ETYPE, "conf/pipe.toml:2:5", NULL, NULL);
  expect_error(*state, "[pipeline]\ninputs = 3\n" SRC, NULL, 0, SPN_ETYPE, "conf/pipe.toml:2:10",
               "[pipeline.inputs] must be a table", NULL);
}

/* An input (or a param) may set several keys: one file read by two stages
 * (lipsync's video: decode.path and melspec.video); one binding per key,
 * all of the input's name, its default shared. */
static void job_bindings_with_several_keys(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(build(*state, "conf/pipe.toml",
                         "[pipeline.inputs]\nvideo = [\"s.input\", \"s.side\"]\n[pipeline.params]\nn = [\"s.frames\"]\n"
                         SRC, NULL, 0, &spec, &err),
                   SPN_OK);
  assert_int_equal(spec->n_bindings, 3);
  assert_string_equal(spec->bindings[0].name, "video");
  assert_string_equal(spec->bindings[0].target, "s.input");
  assert_false(spec->bindings[0].also);
  assert_string_equal(spec->bindings[1].name, "video");
  assert_string_equal(spec->bindings[1].target, "s.side");
  assert_true(spec->bindings[1].also);
  assert_string_equal(spec->bindings[1].where, "conf/pipe.toml:2:21");
  assert_int_equal(spec->bindings[2].kind, SPN_BINDING_PARAM);
  spn__spec_free(&spec);
  assert_int_equal(build(*state, "conf/pipe.toml",
                         "[pipeline.inputs]\nvideo = \"s.input\"\nalt = { key = [\"s.side\"], default = \"video\" }\n" SRC,
                         NULL, 0, &spec, &err),
                   SPN_OK);
  assert_string_equal(spec->bindings[1].fallback, "video");
  spn__spec_free(&spec);
  expect_error(*state, "[pipeline.inputs]\nv = []\n" SRC, NULL, 0, SPN_ECONFIG, "conf/pipe.toml:2:5",
               "[pipeline.inputs] v binds no key", NULL);
  expect_error(*state, "[pipeline.inputs]\nv = [\"s.input\", 3]\n" SRC, NULL, 0, SPN_ETYPE, "conf/pipe.toml:2:17",
               "[pipeline.inputs] v must be a string \"stage.key\" or a list of them", NULL);
  expect_error(*state, "[pipeline.inputs]\nv = [\"s.input\", \"s.input\"]\n" SRC, NULL, 0, SPN_ECONFIG,
               "conf/pipe.toml:2:17", "[pipeline.inputs] v: \"s.input\" is bound already, by [pipeline.inputs] v",
               NULL);
  /* an output is written by one stage */
  expect_error(*state, "[pipeline.outputs]\nw = [\"s.input\", \"s.side\"]\n" SRC, NULL, 0, SPN_ETYPE,
               "conf/pipe.toml:2:5", "[pipeline.outputs] w must be a string \"stage.key\"", NULL);
  /* a default is another input, not one of the input's own keys */
  expect_error(*state, "[pipeline.inputs]\nv = { key = [\"s.input\", \"s.side\"], default = \"v\" }\n" SRC, NULL, 0,
               SPN_ECONFIG, "conf/pipe.toml:2:", "default \"v\" is not another input", NULL);
}

static void job_configs(void **state) {
  spn__pipeline_spec_t *spec = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(build(*state, "conf/pipe.toml", chain, NULL, 0, &spec, &err), SPN_OK);
  /* stage 0 is "s" */
  const char *ov[] = {"s.frames=3", "s.input=clips/a.mp4", "f.unused_here=1"};
  void *cfg = NULL;
  /* f has no key "unused_here": refused even though the call is for s */
  assert_int_equal(spn__spec_job_config(spec, 0, ov, 3, &cfg, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "job override \"f.unused_here=1\": stage \"f\": unknown key"));
  assert_null(cfg);
  assert_int_equal(spn__spec_job_config(spec, 0, ov, 2, &cfg, &err), SPN_OK);
  const src_config_t *c = cfg;
  assert_int_equal(c->frames, 3);
  assert_string_equal(c->input, "clips/a.mp4");
  assert_string_equal(c->model, "conf/models/m.onnx");
  /* the pipeline's own config is untouched */
  assert_int_equal(((src_config_t *)spec->stages[0].config)->frames, 30);
  assert_string_equal(((src_config_t *)spec->stages[0].config)->input, "/abs/in.mp4");
  spn__config_free(spec->stages[0].kind, &cfg);
  assert_null(cfg);
  /* overrides for other stages are checked but not applied */
  assert_int_equal(spn__spec_job_config(spec, 1, ov, 2, &cfg, &err), SPN_OK);
  spn__config_free(spec->stages[1].kind, &cfg);

  const char *not_per_job[] = {"s.fps=50"};
  assert_int_equal(spn__spec_job_config(spec, 0, not_per_job, 1, &cfg, &err), SPN_EPERM);
  assert_non_null(strstr(err.msg, "stage \"s\": key \"fps\" is set per pipeline, not per job"));
  const char *no_stage[] = {"zz.frames=1"};
  assert_int_equal(spn__spec_job_config(spec, 0, no_stage, 1, &cfg, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "has no stage \"zz\""));
  const char *bad_value[] = {"s.frames=-4"};
  assert_int_equal(spn__spec_job_config(spec, 3, bad_value, 1, &cfg, &err), SPN_ECONFIG);
  assert_non_null(strstr(err.msg, "out of range"));
  assert_null(cfg);
  spn__spec_free(&spec);
}

static void two_specs_share_nothing(void **state) {
  spn__pipeline_spec_t *a = NULL, *b = NULL;
  assert_int_equal(build(*state, "conf/pipe.toml", chain, NULL, 0, &a, NULL), SPN_OK);
  const char *ov[] = {"s.frames=7"};
  assert_int_equal(build(*state, "conf/pipe.toml", chain, ov, 1, &b, NULL), SPN_OK);
  assert_int_equal(((src_config_t *)a->stages[0].config)->frames, 30);
  assert_int_equal(((src_config_t *)b->stages[0].config)->frames, 7);
  spn__spec_free(&a);
  assert_int_equal(((src_config_t *)b->stages[0].config)->frames, 7);
  spn__spec_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(chain_is_wired_ordered_and_filled, setup, teardown),
      cmocka_unit_test_setup_teardown(name_defaults_to_the_file_stem, setup, teardown),
      cmocka_unit_test_setup_teardown(unknown_kind, setup, teardown),
      cmocka_unit_test_setup_teardown(dangling_input, setup, teardown),
      cmocka_unit_test_setup_teardown(unknown_port, setup, teardown),
      cmocka_unit_test_setup_teardown(cycle, setup, teardown),
      cmocka_unit_test_setup_teardown(type_mismatch, setup, teardown),
      cmocka_unit_test_setup_teardown(missing_and_extra_inputs, setup, teardown),
      cmocka_unit_test_setup_teardown(duplicate_names, setup, teardown),
      cmocka_unit_test_setup_teardown(unknown_key, setup, teardown),
      cmocka_unit_test_setup_teardown(wrong_types, setup, teardown),
      cmocka_unit_test_setup_teardown(missing_required_key, setup, teardown),
      cmocka_unit_test_setup_teardown(out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(overrides_apply_before_validation, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_overrides, setup, teardown),
      cmocka_unit_test_setup_teardown(url_paths_are_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(plugin_paths_resolve_against_the_config, setup, teardown),
      cmocka_unit_test_setup_teardown(empty_pipeline_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(job_bindings_with_several_keys, setup, teardown),
      cmocka_unit_test_setup_teardown(job_configs, setup, teardown),
      cmocka_unit_test_setup_teardown(job_bindings, setup, teardown),
      cmocka_unit_test_setup_teardown(two_specs_share_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(precision_key, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
