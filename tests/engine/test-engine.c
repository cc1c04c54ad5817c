/* test-engine.c — the engine API against hand-built ONNX files.
 *
 * Models are written here byte by byte with a minimal protobuf writer, so the
 * tests can also write what no exporter would: bad lengths, huge dims,
 * cycles, missing initializers, wrong attribute types, external data that
 * escapes the model's folder. Numeric checks compare against results
 * computed here independently (a direct convolution loop, max(x, 0)). */
#include <malloc.h>
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>

#include <cmocka.h>

#include "spindle/engine.h"

#include "onnx-build.h"

/* A model: y = Relu(x), x of shape (N, 4). */
static pb_t relu_model(void) {
  pb_t g = {0};
  const char *in[] = {"x"}, *out[] = {"y"};
  node(&g, "Relu", "relu0", in, 1, out, 1, NULL, 0);
  pb_str(&g, 2, "g");
  int64_t d[] = {-1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  return model(&g, 17);
}

static char tmpdir[256];

static const char *write_file(const char *name, const void *d, size_t n) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(d, 1, n, f), n);
  fclose(f);
  return path;
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/spn-engine-test-XXXXXX");
  assert_non_null(mkdtemp(tmpdir));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static spn_engine_t *engine(int threads) {
  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  o.threads = threads;
  spn_engine_t *e = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_new(&o, &e, &err), SPN_OK);
  return e;
}

/* A built model loaded on the CPU of a one-thread engine (*e, freed by the
 * caller after the model); the bytes are freed. */
static spn_model_t *load_cpu(pb_t m, const char *name, spn_engine_t **e) {
  *e = engine(1);
  spn_model_t *mod = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_engine_load_memory(*e, m.p, m.n, name, "cpu", &mod, &err) != SPN_OK)
    fail_msg("%s: %s", name, err.msg);
  free(m.p);
  return mod;
}

/* An (n, c, h, w) float32 host tensor over x. */
static spn_tensor_t tensor4(float *x, int64_t n, int64_t c, int64_t h, int64_t w) {
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 4;
  t.shape[0] = n;
  t.shape[1] = c;
  t.shape[2] = h;
  t.shape[3] = w;
  t.data = x;
  return t;
}

/* Load bytes from memory and expect failure with `code` and `needle`. */
static void expect_load_error(pb_t *m, int32_t code, const char *needle) {
  spn_engine_t *e = engine(1);
  spn_model_t *mod = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = spn_engine_load_memory(e, m->p, m->n, "crafted.onnx", "cpu", &mod, &err);
  if (rc != code || !strstr(err.msg, needle))
    fail_msg("expected %d containing '%s', got %d: %s", code, needle, rc, err.msg);
  assert_null(mod);
  assert_non_null(strstr(err.msg, "crafted.onnx"));
  spn_engine_free(&e);
  free(m->p);
}

static void test_relu_runs_dynamic_batch(void **state) {
  (void)state;
  pb_t m = relu_model();
  const char *path = write_file("relu.onnx", m.p, m.n);
  free(m.p);
  spn_engine_t *e = engine(2);
  spn_model_t *mod = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_load(e, path, "cpu", &mod, &err), SPN_OK);
  assert_int_equal(spn_model_input_count(mod), 1);
  const char *name;
  int32_t dt, nd;
  int64_t sh[8];
  spn_model_input_info(mod, 0, &name, &dt, &nd, sh);
  assert_string_equal(name, "x");
  assert_int_equal(nd, 2);
  assert_int_equal(sh[0], -1);
  assert_int_equal(sh[1], 4);
  spn_model_output_info(mod, 0, &name, &dt, &nd, sh);
  assert_int_equal(dt, SPN_DTYPE_F32);
  assert_int_equal(sh[0], -1); /* inferred: moves with the batch */
  assert_int_equal(sh[1], 4);
  for (int batch = 1; batch <= 5; batch += 2) {
    float x[20];
    for (int i = 0; i < 4 * batch; i++)
      x[i] = (float)(i % 7) - 3.f;
    spn_tensor_t in = SPN_TENSOR_INIT, out = SPN_TENSOR_INIT;
    in.dtype = SPN_DTYPE_F32;
    in.ndim = 2;
    in.shape[0] = batch;
    in.shape[1] = 4;
    in.data = x;
    assert_int_equal(spn_model_run(mod, &in, 1, &out, 1, &err), SPN_OK);
    assert_int_equal(out.shape[0], batch);
    for (int i = 0; i < 4 * batch; i++)
      assert_true(((float *)out.data)[i] == (x[i] > 0 ? x[i] : 0.f));
    spn_model_output_free(&out);
    assert_null(out.data);
  }
  /* Wrong static dim and wrong dtype are caller errors. */
  float x[8] = {0};
  spn_tensor_t in = SPN_TENSOR_INIT, out = SPN_TENSOR_INIT;
  in.dtype = SPN_DTYPE_F32;
  in.ndim = 2;
  in.shape[0] = 2;
  in.shape[1] = 3;
  in.data = x;
  assert_int_equal(spn_model_run(mod, &in, 1, &out, 1, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "'x'"));
  in.shape[1] = 4;
  in.dtype = SPN_DTYPE_I32;
  assert_int_equal(spn_model_run(mod, &in, 1, &out, 1, &err), SPN_EINVAL);
  /* Caller-provided output buffer: used when it matches, refused otherwise. */
  in.dtype = SPN_DTYPE_F32;
  x[0] = 5;
  x[1] = -5;
  float y[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  out.dtype = SPN_DTYPE_F32;
  out.ndim = 2;
  out.shape[0] = 2;
  out.shape[1] = 4;
  out.data = y;
  assert_int_equal(spn_model_run(mod, &in, 1, &out, 1, &err), SPN_OK);
  assert_true(out.data == y);
  assert_true(y[0] == 5.f && y[1] == 0.f && y[7] == 0.f);
  out.shape[0] = 3;
  assert_int_equal(spn_model_run(mod, &in, 1, &out, 1, &err), SPN_EINVAL);
  spn_model_release(&mod);
  assert_null(mod);
  spn_engine_free(&e);
}

static void test_registry_shares_models(void **state) {
  (void)state;
  pb_t m = relu_model();
  const char *p = write_file("shared.onnx", m.p, m.n);
  char path[512], alias[600];
  snprintf(path, sizeof path, "%s", p);
  snprintf(alias, sizeof alias, "%s/./shared.onnx", tmpdir);
  free(m.p);
  spn_engine_t *e = engine(1), *e2 = engine(1);
  spn_model_t *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_load(e, path, "cpu", &a, &err), SPN_OK);
  assert_int_equal(spn_engine_load(e, alias, "cpu", &b, &err), SPN_OK);
  assert_ptr_equal(a, b); /* same canonical path, same device */
  assert_int_equal(spn_engine_load(e, path, "cpu:1", &c, &err), SPN_OK);
  assert_ptr_not_equal(a, c);
  assert_int_equal(spn_engine_load(e2, path, "cpu", &d, &err), SPN_OK);
  assert_ptr_not_equal(a, d); /* engines are independent */
  spn_model_t *x = NULL;
  /* cuda:0: refused when the CUDA engine backend is not built, or when no
   * GPU is present; loaded (and released) on a machine with one. */
  int32_t crc = spn_engine_load(e, path, "cuda:0", &x, &err);
  if (crc == SPN_OK)
    spn_model_release(&x);
  else
    assert_true((crc == SPN_EUNSUPPORTED || crc == SPN_EDEVICE) && strstr(err.msg, "cuda:0"));
  assert_int_equal(spn_engine_load(e, path, "tpu", &x, &err), SPN_EINVAL);
  assert_int_equal(spn_engine_load(e, "/nonexistent/m.onnx", "cpu", &x, &err), SPN_ENOENT);
  spn_model_release(&a);
  /* b still valid after one release */
  assert_int_equal(spn_model_input_count(b), 1);
  spn_model_release(&b);
  spn_engine_free(&e);
  /* a model outlives its engine */
  assert_int_equal(spn_model_output_count(c), 1);
  spn_model_release(&c);
  spn_model_release(&d);
  spn_engine_free(&e2);
}

static void test_truncated_files_fail(void **state) {
  (void)state;
  pb_t m = relu_model();
  spn_engine_t *e = engine(1);
  for (size_t n = 0; n < m.n; n++) {
    spn_model_t *mod = NULL;
    spn_error_t err = SPN_ERROR_INIT;
    int32_t rc = spn_engine_load_memory(e, m.p, n, "cut.onnx", "cpu", &mod, &err);
    if (rc == SPN_OK)
      fail_msg("prefix of %zu/%zu bytes loaded", n, m.n);
    assert_non_null(strstr(err.msg, "cut.onnx"));
  }
  spn_engine_free(&e);
  free(m.p);
}

static void test_bad_length_fails(void **state) {
  (void)state;
  pb_t m = {0};
  pb_int(&m, 1, 8);
  pb_uv(&m, 7 << 3 | 2); /* graph, length far beyond the data */
  pb_uv(&m, UINT64_C(1) << 40);
  pb_raw(&m, "\x0a\x00", 2);
  expect_load_error(&m, SPN_EPARSE, "not a valid ONNX protobuf");
}

static void test_huge_dims_fail(void **state) {
  (void)state;
  pb_t g = {0};
  float w[4] = {1, 2, 3, 4};
  int64_t dims[] = {INT64_C(1) << 40, 4};
  initializer(&g, "w", 2, dims, w, 4);
  const char *in[] = {"x", "w"}, *out[] = {"y"};
  node(&g, "Add", "add0", in, 2, out, 1, NULL, 0);
  int64_t d[] = {1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  pb_t m = model(&g, 17);
  expect_load_error(&m, SPN_EMODEL, "tensor 'w': dimension 0 has invalid size");

  /* Element count overflow through several large-but-legal dims. */
  pb_t g2 = {0};
  int64_t d2[] = {INT64_C(1) << 30, INT64_C(1) << 30, 16};
  initializer(&g2, "w", 3, d2, w, 4);
  node(&g2, "Add", "add0", in, 2, out, 1, NULL, 0);
  value_info(&g2, 11, "x", 2, d);
  value_info(&g2, 12, "y", -1, NULL);
  m = model(&g2, 17);
  expect_load_error(&m, SPN_ETOOBIG, "tensor 'w': too many elements");

  /* raw_data shorter than the shape says. */
  pb_t g3 = {0};
  int64_t d3[] = {2, 4};
  initializer(&g3, "w", 2, d3, w, 4);
  node(&g3, "Add", "add0", in, 2, out, 1, NULL, 0);
  value_info(&g3, 11, "x", 2, d);
  value_info(&g3, 12, "y", -1, NULL);
  m = model(&g3, 17);
  expect_load_error(&m, SPN_EMODEL, "raw_data has 16 bytes");
}

/* Empty tensors with huge other dims fold instantly (a fuzzer finding: the
 * Concat loop used to run over the 2^62 leading positions). */
static void test_empty_huge_constant_folds(void **state) {
  (void)state;
  pb_t g = {0};
  int64_t dims[] = {INT64_C(1) << 17, INT64_C(1) << 17, 0};
  initializer(&g, "w", 3, dims, NULL, 0);
  const char *in[] = {"w", "w"}, *out[] = {"y"};
  attr_t a = {.name = "axis", .type = 2, .i = 2};
  node(&g, "Concat", "cat", in, 2, out, 1, &a, 1);
  value_info(&g, 12, "y", -1, NULL);
  pb_t m = model(&g, 17);
  spn_engine_t *e = engine(1);
  spn_model_t *mod = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_load_memory(e, m.p, m.n, "empty.onnx", "cpu", &mod, &err), SPN_OK);
  spn_tensor_t y = SPN_TENSOR_INIT;
  assert_int_equal(spn_model_run(mod, NULL, 0, &y, 1, &err), SPN_OK);
  assert_int_equal(y.ndim, 3);
  assert_int_equal(y.shape[0], INT64_C(1) << 17);
  assert_int_equal(y.shape[2], 0);
  spn_model_output_free(&y);
  spn_model_release(&mod);
  spn_engine_free(&e);
  free(m.p);
}

static void test_cycle_fails(void **state) {
  (void)state;
  pb_t g = {0};
  const char *i1[] = {"x", "b"}, *o1[] = {"a"}, *i2[] = {"a"}, *o2[] = {"b"};
  node(&g, "Add", "first", i1, 2, o1, 1, NULL, 0);
  node(&g, "Relu", "second", i2, 1, o2, 1, NULL, 0);
  int64_t d[] = {1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "b", -1, NULL);
  pb_t m = model(&g, 17);
  expect_load_error(&m, SPN_EMODEL, "cycle through node");
}

static void test_missing_initializer_fails(void **state) {
  (void)state;
  pb_t g = {0};
  const char *in[] = {"x", "weights_not_there"}, *out[] = {"y"};
  node(&g, "Mul", "mul0", in, 2, out, 1, NULL, 0);
  int64_t d[] = {1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  pb_t m = model(&g, 17);
  expect_load_error(&m, SPN_EMODEL, "node 'mul0' (Mul): input 'weights_not_there' is not");
}

static void test_dangling_output_fails(void **state) {
  (void)state;
  pb_t g = {0};
  const char *in[] = {"x"}, *out[] = {"y"};
  node(&g, "Relu", "r", in, 1, out, 1, NULL, 0);
  int64_t d[] = {1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "nobody_makes_me", -1, NULL);
  pb_t m = model(&g, 17);
  expect_load_error(&m, SPN_EMODEL, "graph output 'nobody_makes_me' is not produced");
}

static void test_wrong_attribute_type_fails(void **state) {
  (void)state;
  pb_t g = {0};
  const char *in[] = {"x"}, *out[] = {"y"};
  attr_t a = {.name = "alpha", .type = 2, .i = 3};
  node(&g, "LeakyRelu", "lr", in, 1, out, 1, &a, 1);
  int64_t d[] = {1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  pb_t m = model(&g, 17);
  expect_load_error(&m, SPN_ETYPE, "node 'lr' (LeakyRelu): attribute 'alpha' has type int, expected float");
}

static void test_unsupported_op_and_attribute(void **state) {
  (void)state;
  pb_t g = {0};
  const char *in[] = {"x"}, *out[] = {"y"};
  node(&g, "NonMaxSuppression", "nms7", in, 1, out, 1, NULL, 0);
  int64_t d[] = {1, 4};
  value_info(&g, 11, "x", 2, d);
  value_info(&g, 12, "y", -1, NULL);
  pb_t m = model(&g, 17);
  expect_load_error(&m, SPN_EUNSUPPORTED, "node 'nms7' (#0): unsupported operator 'NonMaxSuppression'");

  /* the engine's internal operators are not a file's to name */
  pb_t gi = {0};
  const char *in4[] = {"x", "x", "x", "x"};
  attr_t bs = {.name = "blocksize", .type = 2, .i = 2};
  node(&gi, "spindle:PhaseInterleave", "pi", in4, 4, out, 1, &bs, 1);
  int64_t d4[] = {1, 2, 3, 3};
  value_info(&gi, 11, "x", 4, d4);
  value_info(&gi, 12, "y", -1, NULL);
  m = model(&gi, 17);
  expect_load_error(&m, SPN_EUNSUPPORTED, "node 'pi' (#0): unsupported operator 'spindle:PhaseInterleave'");

  pb_t g2 = {0};
  attr_t a = {.name = "mode", .type = 3, .s = "lanczos"};
  node(&g2, "Resize", "rs", in, 1, out, 1, &a, 1);
  value_info(&g2, 11, "x", 2, d);
  value_info(&g2, 12, "y", -1, NULL);
  m = model(&g2, 17);
  expect_load_error(&m, SPN_EUNSUPPORTED, "node 'rs' (Resize): mode 'lanczos' is not supported");

  pb_t g3 = {0};
  attr_t b = {.name = "frobnicate", .type = 2, .i = 1};
  node(&g3, "Relu", "r", in, 1, out, 1, &b, 1);
  value_info(&g3, 11, "x", 2, d);
  value_info(&g3, 12, "y", -1, NULL);
  m = model(&g3, 17);
  expect_load_error(&m, SPN_EUNSUPPORTED, "node 'r' (Relu): unsupported attribute 'frobnicate'");

  pb_t g4 = {0};
  node(&g4, "Relu", "r", in, 1, out, 1, NULL, 0);
  value_info(&g4, 11, "x", 2, d);
  value_info(&g4, 12, "y", -1, NULL);
  m = model(&g4, 9);
  expect_load_error(&m, SPN_EUNSUPPORTED, "opset 9 is not supported");
}

/* Add with a weight held in external data. */
static pb_t external_model(const char *location) {
  pb_t g = {0}, t = {0}, kv = {0};
  pb_int(&t, 1, 4);
  pb_int(&t, 2, 1);
  pb_str(&t, 8, "w");
  pb_str(&kv, 1, "location");
  pb_str(&kv, 2, location);
  pb_msg(&t, 13, &kv);
  pb_str(&kv, 1, "offset");
  pb_str(&kv, 2, "8");
  pb_msg(&t, 13, &kv);
  pb_str(&kv, 1, "length");
  pb_str(&kv, 2, "16");
  pb_msg(&t, 13, &kv);
  pb_int(&t, 14, 1);
  pb_msg(&g, 5, &t);
  const char *in[] = {"x", "w"}, *out[] = {"y"};
  node(&g, "Add", "add0", in, 2, out, 1, NULL, 0);
  int64_t d[] = {4};
  value_info(&g, 11, "x", 1, d);
  value_info(&g, 12, "y", -1, NULL);
  return model(&g, 17);
}

static void test_external_data(void **state) {
  (void)state;
  float blob[6] = {99, 99, 10, 20, 30, 40}; /* offset 8 skips the first two */
  write_file("weights.bin", blob, sizeof blob);
  pb_t m = external_model("weights.bin");
  char path[512];
  snprintf(path, sizeof path, "%s", write_file("ext.onnx", m.p, m.n));
  free(m.p);
  spn_engine_t *e = engine(1);
  spn_model_t *mod = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_load(e, path, "cpu", &mod, &err), SPN_OK);
  assert_int_equal(spn_model_param_count(mod), 4);
  float x[4] = {1, 2, 3, 4};
  spn_tensor_t in = SPN_TENSOR_INIT, out = SPN_TENSOR_INIT;
  in.dtype = SPN_DTYPE_F32;
  in.ndim = 1;
  in.shape[0] = 4;
  in.data = x;
  assert_int_equal(spn_model_run(mod, &in, 1, &out, 1, &err), SPN_OK);
  const float *y = out.data;
  assert_true(y[0] == 11 && y[1] == 22 && y[2] == 33 && y[3] == 44);
  spn_model_output_free(&out);
  spn_model_release(&mod);

  /* Escaping the folder, absolute paths and missing files are refused. */
  const char *bad[] = {"../weights.bin", "/etc/passwd", "sub/../../x.bin", "missing.bin"};
  const int32_t codes[] = {SPN_EPERM, SPN_EPERM, SPN_EPERM, SPN_ENOENT};
  for (int i = 0; i < 4; i++) {
    pb_t b = external_model(bad[i]);
    snprintf(path, sizeof path, "%s", write_file("bad.onnx", b.p, b.n));
    free(b.p);
    assert_int_equal(spn_engine_load(e, path, "cpu", &mod, &err), codes[i]);
    assert_non_null(strstr(err.msg, "tensor 'w'"));
    assert_null(mod);
  }
  /* From memory, external data has no folder to come from. */
  pb_t b = external_model("weights.bin");
  assert_int_equal(spn_engine_load_memory(e, b.p, b.n, "mem.onnx", "cpu", &mod, &err), SPN_EPERM);
  free(b.p);
  /* A symlink inside the folder pointing outside is refused too. */
  char link[600];
  snprintf(link, sizeof link, "%s/evil.bin", tmpdir);
  assert_int_equal(symlink("/etc/hostname", link), 0);
  b = external_model("evil.bin");
  snprintf(path, sizeof path, "%s", write_file("evil.onnx", b.p, b.n));
  free(b.p);
  assert_int_equal(spn_engine_load(e, path, "cpu", &mod, &err), SPN_EPERM);
  spn_engine_free(&e);
}

/* ---- convolution: numeric check and concurrent runs ---- */

enum { CI = 3, CO = 5, H = 9, W = 8, K = 3 };
static float conv_w[CO * CI * K * K], conv_b[CO];

/* The convolution's nodes and initializers, without inputs and outputs. */
static pb_t conv_model_graph(void) {
  for (int i = 0; i < CO * CI * K * K; i++)
    conv_w[i] = (float)((i * 37) % 17 - 8) / 16.f;
  for (int i = 0; i < CO; i++)
    conv_b[i] = (float)i / 4.f - 0.5f;
  pb_t g = {0};
  int64_t wd[] = {CO, CI, K, K}, bd[] = {CO};
  initializer(&g, "w", 4, wd, conv_w, CO * CI * K * K);
  initializer(&g, "b", 1, bd, conv_b, CO);
  const char *in[] = {"x", "w", "b"}, *out[] = {"c"}, *in2[] = {"c"}, *out2[] = {"y"};
  int64_t pads[] = {1, 0, 2, 1}, strides[] = {2, 1};
  attr_t a[] = {{.name = "pads", .type = 7, .n = 4, .ints = pads},
                {.name = "strides", .type = 7, .n = 2, .ints = strides}};
  node(&g, "Conv", "conv0", in, 3, out, 1, a, 2);
  node(&g, "Relu", "relu0", in2, 1, out2, 1, NULL, 0); /* fused as a post-op */
  return g;
}

static pb_t conv_model(void) {
  pb_t g = conv_model_graph();
  int64_t d[] = {-1, CI, H, W};
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  return model(&g, 13);
}

/* Direct convolution, written independently of the engine. */
static void conv_ref(const float *x, int n, float *y, int *oh, int *ow) {
  int pt = 1, pl = 0, pb = 2, pr = 1, sh = 2, sw = 1;
  *oh = (H + pt + pb - K) / sh + 1;
  *ow = (W + pl + pr - K) / sw + 1;
  for (int b = 0; b < n; b++)
    for (int o = 0; o < CO; o++)
      for (int i = 0; i < *oh; i++)
        for (int j = 0; j < *ow; j++) {
          double s = conv_b[o];
          for (int c = 0; c < CI; c++)
            for (int ki = 0; ki < K; ki++)
              for (int kj = 0; kj < K; kj++) {
                int yy = i * sh - pt + ki, xx = j * sw - pl + kj;
                if (yy >= 0 && yy < H && xx >= 0 && xx < W)
                  s += (double)conv_w[((o * CI + c) * K + ki) * K + kj] * x[((b * CI + c) * H + yy) * W + xx];
              }
          y[((b * CO + o) * *oh + i) * *ow + j] = s > 0 ? (float)s : 0.f;
        }
}

typedef struct {
  spn_model_t *m;
  int batch, iters, failures;
} worker_t;

static void *worker(void *p) {
  worker_t *w = p;
  int n = w->batch;
  float *x = malloc(sizeof(float) * (size_t)(n * CI * H * W));
  float *ref = malloc(sizeof(float) * (size_t)(n * CO * H * W));
  for (int i = 0; i < n * CI * H * W; i++)
    x[i] = (float)((i * 7 + n) % 13) / 6.f - 1.f;
  int oh, ow;
  conv_ref(x, n, ref, &oh, &ow);
  for (int it = 0; it < w->iters; it++) {
    spn_tensor_t in = tensor4(x, n, CI, H, W), out = SPN_TENSOR_INIT;
    spn_error_t err = SPN_ERROR_INIT;
    if (spn_model_run(w->m, &in, 1, &out, 1, &err) != SPN_OK || out.shape[2] != oh || out.shape[3] != ow) {
      w->failures++;
      continue;
    }
    const float *y = out.data;
    for (int i = 0; i < n * CO * oh * ow; i++)
      if (y[i] - ref[i] > 1e-4f || ref[i] - y[i] > 1e-4f) {
        w->failures++;
        break;
      }
    spn_model_output_free(&out);
  }
  free(x);
  free(ref);
  return NULL;
}

static void test_conv_matches_reference_concurrently(void **state) {
  (void)state;
  spn_engine_t *e = NULL;
  spn_model_t *mod = load_cpu(conv_model(), "conv.onnx", &e);
  assert_int_equal(spn_model_node_count(mod), 1); /* Relu fused into Conv */
  /* FLOPs per sample: 2 * CO * oh * ow * CI * K * K */
  int oh = (H + 3 - K) / 2 + 1, ow = (W + 1 - K) + 1;
  assert_true(spn_model_flops(mod) == 2.0 * CO * oh * ow * CI * K * K);
  assert_int_equal(spn_model_param_count(mod), CO * CI * K * K + CO);
  worker_t w[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker_t){.m = mod, .batch = 1 + i, .iters = 20};
    assert_int_equal(pthread_create(&t[i], NULL, worker, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(w[i].failures, 0);
  }
  spn_model_release(&mod);
  spn_engine_free(&e);
}

/* ---- profile: each node timed on its own ---- */

/* conv0 (+ its Relu, fused) -> tr0 (Transpose) -> sig0 (Sigmoid): three
 * nodes run. */
static pb_t chain_model(void) {
  pb_t g = conv_model_graph();
  const char *in3[] = {"y"}, *out3[] = {"t"}, *in4[] = {"t"}, *out4[] = {"z"};
  int64_t perm[] = {0, 1, 3, 2};
  attr_t a[] = {{.name = "perm", .type = 7, .n = 4, .ints = perm}};
  node(&g, "Transpose", "tr0", in3, 1, out3, 1, a, 1);
  node(&g, "Sigmoid", "sig0", in4, 1, out4, 1, NULL, 0);
  int64_t d[] = {-1, CI, H, W};
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "z", -1, NULL);
  return model(&g, 13);
}

static void test_profile_times_each_node(void **state) {
  (void)state;
  spn_engine_t *e = NULL;
  spn_model_t *mod = load_cpu(chain_model(), "chain.onnx", &e);
  spn_error_t err = SPN_ERROR_INIT;
  float x[2 * CI * H * W];
  for (int i = 0; i < 2 * CI * H * W; i++)
    x[i] = (float)((i * 5) % 11) / 5.f - 1.f;
  spn_tensor_t in = tensor4(x, 2, CI, H, W), ref = SPN_TENSOR_INIT, got = SPN_TENSOR_INIT;
  assert_int_equal(spn_model_run(mod, &in, 1, &ref, 1, &err), SPN_OK);
  spn_node_time_t t[4];
  memset(t, 0xab, sizeof t);
  int32_t n = -1;
  assert_int_equal(spn_model_profile(mod, &in, 1, &got, 1, t, 4, &n, &err), SPN_OK);
  assert_int_equal(n, 3);
  const char *ops[] = {"Conv", "Transpose", "Sigmoid"}, *names[] = {"conv0", "tr0", "sig0"};
  for (int i = 0; i < 3; i++) {
    assert_string_equal(t[i].op, ops[i]);
    assert_string_equal(t[i].name, names[i]);
    assert_string_equal(t[i].device, "cpu");
    assert_int_equal(t[i].fused, i == 0); /* the Relu */
    assert_true(t[i].ms >= 0 && t[i].ms < 60e3);
    if (i)
      assert_true(t[i].index > t[i - 1].index);
  }
  /* the outputs are the run's, bit for bit */
  assert_int_equal(got.ndim, ref.ndim);
  assert_memory_equal(got.shape, ref.shape, sizeof got.shape);
  assert_memory_equal(got.data, ref.data, (size_t)(2 * CO * 5 * 7) * sizeof(float));
  spn_model_output_free(&got);
  /* fewer slots than nodes: the count still says 3, nothing past max */
  memset(t, 0xab, sizeof t);
  assert_int_equal(spn_model_profile(mod, &in, 1, &got, 1, t, 1, &n, &err), SPN_OK);
  assert_int_equal(n, 3);
  assert_string_equal(t[0].name, "conv0");
  unsigned char junk[sizeof t[1]];
  memset(junk, 0xab, sizeof junk);
  assert_memory_equal(&t[1], junk, sizeof junk);
  spn_model_output_free(&got);
  assert_int_equal(spn_model_profile(mod, &in, 1, &got, 1, NULL, 0, &n, &err), SPN_OK);
  assert_int_equal(n, 3);
  spn_model_output_free(&got);
  /* caller errors */
  assert_int_equal(spn_model_profile(mod, &in, 1, &got, 1, t, 4, NULL, &err), SPN_EINVAL);
  assert_int_equal(spn_model_profile(mod, &in, 1, &got, 1, NULL, 2, &n, &err), SPN_EINVAL);
  in.shape[1] = CI + 1; /* as spn_model_run: the input named */
  assert_int_not_equal(spn_model_profile(mod, &in, 1, &got, 1, t, 4, &n, &err), SPN_OK);
  assert_non_null(strstr(err.msg, "'x'"));
  spn_model_output_free(&ref);
  spn_model_release(&mod);
  spn_engine_free(&e);
}

/* ---- strided ConvTranspose on the CPU: a Conv per output phase ---- */

enum { TC = 6, TO = 4, TH = 5, TW = 7 };
static float tw[TC * TO * 9], tb[TO], tw2[TO * TO * 9];

/* Wav2Lip's decoder layer shape: ConvTranspose 3x3, stride 2, pads 1,
 * output_padding 1, bias, then Relu; group g (1: rewritten, 2: not). With
 * `tail`, a 3x3 Conv (pads 1) reads the Relu's output, as Wav2Lip's
 * residual blocks do, so the rewrite's last node writes channels-last. */
static pb_t convt_model(int g, bool tail) {
  for (int i = 0; i < TC * TO * 9; i++)
    tw[i] = (float)((i * 29) % 23 - 11) / 16.f;
  for (int i = 0; i < TO; i++)
    tb[i] = (float)i / 3.f - 0.6f;
  for (int i = 0; i < TO * TO * 9; i++)
    tw2[i] = (float)((i * 17) % 13 - 6) / 8.f;
  pb_t m = {0};
  int64_t wd[] = {TC, TO / g, 3, 3}, bd[] = {TO}, w2d[] = {TO, TO, 3, 3};
  initializer(&m, "w", 4, wd, tw, TC * TO / g * 9);
  initializer(&m, "b", 1, bd, tb, TO);
  if (tail)
    initializer(&m, "w2", 4, w2d, tw2, TO * TO * 9);
  const char *in[] = {"x", "w", "b"}, *out[] = {"c"}, *in2[] = {"c"}, *out2[] = {tail ? "r" : "y"};
  const char *in3[] = {"r", "w2"}, *out3[] = {"y"};
  int64_t pads[] = {1, 1, 1, 1}, strides[] = {2, 2}, opad[] = {1, 1};
  attr_t a[] = {{.name = "pads", .type = 7, .n = 4, .ints = pads},
                {.name = "strides", .type = 7, .n = 2, .ints = strides},
                {.name = "output_padding", .type = 7, .n = 2, .ints = opad},
                {.name = "group", .type = 2, .i = g}};
  node(&m, "ConvTranspose", "up0", in, 3, out, 1, a, 4);
  node(&m, "Relu", "relu0", in2, 1, out2, 1, NULL, 0);
  if (tail)
    node(&m, "Conv", "tail0", in3, 2, out3, 1, a, 1);
  int64_t d[] = {-1, TC, TH, TW};
  value_info(&m, 11, "x", 4, d);
  value_info(&m, 12, "y", -1, NULL);
  return model(&m, 13);
}

/* The transposed convolution by its definition (scatter each input pixel
 * through the kernel), written independently of the engine; with `tail`,
 * then the 3x3 Conv. */
static void convt_ref(const float *x, int n, int g, bool tail, float *y) {
  int oh = 2 * TH, ow = 2 * TW, cig = TC / g, cog = TO / g;
  for (int b = 0; b < n; b++)
    for (int o = 0; o < TO; o++)
      for (int i = 0; i < oh * ow; i++)
        y[(b * TO + o) * oh * ow + i] = tb[o];
  for (int b = 0; b < n; b++)
    for (int c = 0; c < TC; c++)
      for (int i = 0; i < TH; i++)
        for (int j = 0; j < TW; j++)
          for (int oo = 0; oo < cog; oo++)
            for (int ki = 0; ki < 3; ki++)
              for (int kj = 0; kj < 3; kj++) {
                int yy = i * 2 - 1 + ki, xx = j * 2 - 1 + kj, o = (c / cig) * cog + oo;
                if (yy >= 0 && yy < oh && xx >= 0 && xx < ow)
                  y[((b * TO + o) * oh + yy) * ow + xx] += x[((b * TC + c) * TH + i) * TW + j] * tw[((c * cog + oo) * 3 + ki) * 3 + kj];
              }
  for (int i = 0; i < n * TO * oh * ow; i++)
    y[i] = y[i] > 0 ? y[i] : 0.f;
  if (!tail)
    return;
  float *r = malloc((size_t)n * TO * oh * ow * sizeof(float));
  assert_non_null(r);
  memcpy(r, y, (size_t)n * TO * oh * ow * sizeof(float));
  for (int b = 0; b < n; b++)
    for (int o = 0; o < TO; o++)
      for (int yy = 0; yy < oh; yy++)
        for (int xx = 0; xx < ow; xx++) {
          float acc = 0.f;
          for (int c = 0; c < TO; c++)
            for (int ki = 0; ki < 3; ki++)
              for (int kj = 0; kj < 3; kj++) {
                int sy = yy - 1 + ki, sx = xx - 1 + kj;
                if (sy >= 0 && sy < oh && sx >= 0 && sx < ow)
                  acc += r[((b * TO + c) * oh + sy) * ow + sx] * tw2[((o * TO + c) * 3 + ki) * 3 + kj];
              }
          y[((b * TO + o) * oh + yy) * ow + xx] = acc;
        }
  free(r);
}

/* The forms a strided ConvTranspose takes on the CPU, each against the
 * reference: a Conv per output phase (the Relu fused into each) and a
 * PhaseInterleave, its output NCHW (the model's output) or channels-last
 * (read by a Conv); SPINDLE_SUBPIXEL=window: one Conv over the common
 * window and a DepthToSpace; grouped: not rewritten. */
static void test_strided_convtranspose_runs_as_conv(void **state) {
  (void)state;
  static const struct { int g; bool tail, window; } cases[] = {
      {1, false, false}, {1, true, false}, {1, false, true}, {1, true, true}, {2, false, false}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int g = cases[k].g;
    bool tail = cases[k].tail;
    if (cases[k].window)
      setenv("SPINDLE_SUBPIXEL", "window", 1);
    spn_engine_t *e = NULL;
    spn_model_t *mod = load_cpu(convt_model(g, tail), "convt.onnx", &e);
    unsetenv("SPINDLE_SUBPIXEL");
    spn_error_t err = SPN_ERROR_INIT;
    static float x[3 * TC * TH * TW], ref[3 * TO * 4 * TH * TW];
    for (int i = 0; i < 3 * TC * TH * TW; i++)
      x[i] = (float)((i * 13) % 19) / 9.f - 1.f;
    convt_ref(x, 3, g, tail, ref);
    spn_tensor_t in = tensor4(x, 3, TC, TH, TW), out = SPN_TENSOR_INIT;
    spn_node_time_t t[8];
    int32_t n = 0;
    assert_int_equal(spn_model_profile(mod, &in, 1, &out, 1, t, 8, &n, &err), SPN_OK);
    int body = n - tail;
    if (g == 2) { /* grouped: as it is */
      assert_int_equal(body, 1);
      assert_string_equal(t[0].op, "ConvTranspose");
    } else if (cases[k].window) { /* the Conv of the four phases, then the shuffle */
      assert_int_equal(body, 2);
      assert_string_equal(t[0].op, "Conv");
      assert_int_equal(t[0].fused, 1);
      assert_string_equal(t[1].op, "DepthToSpace");
    } else { /* four Convs, then the interleave */
      assert_int_equal(body, 5);
      for (int i = 0; i < 4; i++) {
        assert_string_equal(t[i].op, "Conv");
        assert_int_equal(t[i].fused, 1);
      }
      assert_string_equal(t[4].op, "spindle:PhaseInterleave");
    }
    if (tail)
      assert_string_equal(t[n - 1].op, "Conv");
    assert_int_equal(out.shape[2], 2 * TH);
    assert_int_equal(out.shape[3], 2 * TW);
    const float *y = out.data;
    for (int i = 0; i < 3 * TO * 4 * TH * TW; i++)
      if (!(fabsf(y[i] - ref[i]) <= 1e-4f * (1.f + fabsf(ref[i]))))
        fail_msg("case %zu: element %d: engine %g, reference %g", k, i, (double)y[i], (double)ref[i]);
    spn_model_output_free(&out);
    spn_model_release(&mod);
    spn_engine_free(&e);
  }
}

/* Bytes the C heap holds for the program (glibc). */
static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/* Weights a load-time pass replaced are given back: a ConvTranspose of
 * 2.4 MB of weights becomes four phase Convs holding the same 2.4 MB, and
 * the load keeps one copy, not two. */
static void test_replaced_weights_freed(void **state) {
  (void)state;
#if defined(__SANITIZE_ADDRESS__)
  skip(); /* the sanitizer's allocator does not report through mallinfo2 */
#endif
  enum { C = 256 };
  size_t wbytes = (size_t)C * C * 9 * sizeof(float);
  float *w = malloc(wbytes);
  assert_non_null(w);
  for (int i = 0; i < C * C * 9; i++)
    w[i] = (float)((i * 31) % 29 - 14) / 64.f;
  pb_t g = {0};
  int64_t wd[] = {C, C, 3, 3};
  initializer(&g, "w", 4, wd, w, C * C * 9);
  free(w);
  const char *in[] = {"x", "w"}, *out[] = {"y"};
  int64_t pads[] = {1, 1, 1, 1}, strides[] = {2, 2}, opad[] = {1, 1};
  attr_t a[] = {{.name = "pads", .type = 7, .n = 4, .ints = pads},
                {.name = "strides", .type = 7, .n = 2, .ints = strides},
                {.name = "output_padding", .type = 7, .n = 2, .ints = opad}};
  node(&g, "ConvTranspose", "up", in, 2, out, 1, a, 3);
  int64_t d[] = {-1, C, 4, 4};
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  pb_t m = model(&g, 13);
  spn_engine_t *e = engine(1);
  spn_model_t *mod = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  size_t before = heap_in_use();
  if (spn_engine_load_memory(e, m.p, m.n, "convt-big.onnx", "cpu", &mod, &err) != SPN_OK)
    fail_msg("%s", err.msg);
  size_t grown = heap_in_use() - before;
  if (grown < wbytes || grown > wbytes * 3 / 2)
    fail_msg("the load holds %zu bytes for %zu bytes of weights (expected one copy)", grown, wbytes);
  free(m.p);
  spn_model_release(&mod);
  spn_engine_free(&e);
}

/* Flip bytes of a valid model: every load must end in success or a clean
 * error (the sanitizer build checks "clean"). */
static void test_mutated_models_never_crash(void **state) {
  (void)state;
  /* a Conv with a fused Relu; a strided ConvTranspose and a Conv after it
   * (the load rewrites it into phase convolutions: its strides, pads and
   * output padding mutated reach that rewrite) */
  pb_t seeds[] = {conv_model(), convt_model(1, true)};
  spn_engine_t *e = engine(1);
  uint32_t seed = 12345;
  for (size_t sm = 0; sm < sizeof seeds / sizeof seeds[0]; sm++) {
    pb_t m = seeds[sm];
    uint8_t *buf = malloc(m.n);
    assert_non_null(buf);
    int loaded = 0;
    for (int it = 0; it < 3000; it++) {
      memcpy(buf, m.p, m.n);
      int flips = 1 + it % 4;
      for (int f = 0; f < flips; f++) {
        seed = seed * 1103515245u + 12345u;
        size_t pos = (seed >> 8) % m.n;
        seed = seed * 1103515245u + 12345u;
        buf[pos] = (uint8_t)(seed >> 16);
      }
      spn_model_t *mod = NULL;
      spn_error_t err = SPN_ERROR_INIT;
      if (spn_engine_load_memory(e, buf, m.n, "mut.onnx", "cpu", &mod, &err) == SPN_OK) {
        loaded++;
        spn_model_release(&mod);
      } else {
        assert_true(err.msg[0] != '\0');
      }
    }
    assert_true(loaded > 0 && loaded < 3000);
    free(buf);
    free(m.p);
  }
  spn_engine_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relu_runs_dynamic_batch),
      cmocka_unit_test(test_registry_shares_models),
      cmocka_unit_test(test_truncated_files_fail),
      cmocka_unit_test(test_bad_length_fails),
      cmocka_unit_test(test_huge_dims_fail),
      cmocka_unit_test(test_empty_huge_constant_folds),
      cmocka_unit_test(test_cycle_fails),
      cmocka_unit_test(test_missing_initializer_fails),
      cmocka_unit_test(test_dangling_output_fails),
      cmocka_unit_test(test_wrong_attribute_type_fails),
      cmocka_unit_test(test_unsupported_op_and_attribute),
      cmocka_unit_test(test_external_data),
      cmocka_unit_test(test_conv_matches_reference_concurrently),
      cmocka_unit_test(test_profile_times_each_node),
      cmocka_unit_test(test_strided_convtranspose_runs_as_conv),
      cmocka_unit_test(test_replaced_weights_freed),
      cmocka_unit_test(test_mutated_models_never_crash),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
