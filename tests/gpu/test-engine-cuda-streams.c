/* test-engine-cuda-streams.c — the CUDA engine backend and the lifetime of
 * a caller's stream, on the fake CUDA libraries (tests/gpu/host-emu/README).
 *
 *  - a run on the caller's stream, the caller then destroys that stream, and
 *    the model runs a new shape on the backend's own stream: preparing that
 *    shape must not use the destroyed stream. It once did: exec_conv()
 *    leaves the cuDNN handle on the last run's stream (cudnnSetStream), and
 *    get_conv()'s cudnnFind*Algorithm, called by prepare_shape() before any
 *    cudnnSetStream of the new run, timed the algorithms on that stream;
 *    prepare_shape() now puts the handle on the backend's own stream first.
 *    The fake cuDNN refuses a destroyed stream
 *    (CUDNN_STATUS_EXECUTION_FAILED); on a GPU it is undefined.
 *  - graphs are captured on the backend's own stream, never on the caller's:
 *    a caller's stream is a stage's, which the device layer lists, and any
 *    thread freeing device memory records a fence on it that the free
 *    stream waits for; recorded into a capture, that fence pulls the free
 *    stream into the capture, which then ends unjoined (the fake models it:
 *    test-cuda-fakes.c). The third run of a shape replays its graph on the
 *    caller's stream, and reads its input then.
 * Unit suite; no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "../engine/onnx-build.h"
#include "spindle/engine.h"

static spn_tensor_t image(void *data, int64_t batch) {
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 4;
  t.shape[0] = batch;
  t.shape[1] = 2;
  t.shape[2] = 5;
  t.shape[3] = 5;
  t.data = data;
  return t;
}

int spn_emu_stream_captures(cudaStream_t s);  /* cuda-fake.cpp's test hooks */
long long spn_emu_graph_launches(void);

/* A one-Conv model (3 output channels, 2 input channels, 3x3, pad 1). */
static pb_t conv_model(void) {
  pb_t g = {0};
  const char *ci[] = {"x", "w"}, *co[] = {"y"};
  const int64_t ks[] = {3, 3}, pads[] = {1, 1, 1, 1};
  attr_t ca[] = {{.name = "kernel_shape", .type = 7, .n = 2, .ints = ks}, {.name = "pads", .type = 7, .n = 4, .ints = pads}};
  node(&g, "Conv", "conv0", ci, 2, co, 1, ca, 2);
  pb_str(&g, 2, "g");
  static float w[3 * 2 * 9];
  for (int i = 0; i < 3 * 2 * 9; i++)
    w[i] = (float)(i % 7) * 0.1f;
  int64_t wd[] = {3, 2, 3, 3}, d[] = {-1, 2, 5, 5};
  initializer(&g, "w", 4, wd, w, 3 * 2 * 9);
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  return model(&g, 17);
}

/* The model loaded on cuda:0, a caller's stream, device input and output
 * for a batch of 1. */
typedef struct conv_case {
  pb_t pm;
  spn_engine_t *eng;
  spn_model_t *m;
  cudaStream_t st; /* NULL once the test destroyed it */
  void *dx, *dy;
  spn_tensor_t din, dout;
} conv_case_t;

static void conv_case_open(conv_case_t *c) {
  memset(c, 0, sizeof *c);
  c->pm = conv_model();
  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_new(&o, &c->eng, &err), SPN_OK);
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  mo.device = "cuda:0";
  mo.fallback = "error";
  if (spn_engine_load_memory_opts(c->eng, c->pm.p, c->pm.n, "t.onnx", &mo, &c->m, &err))
    fail_msg("load: %s", err.msg);
  assert_int_equal(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaMalloc(&c->dx, 50 * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMalloc(&c->dy, 75 * sizeof(float)), cudaSuccess);
  c->din = image(c->dx, 1);
  c->din.device_kind = SPN_DEVICE_CUDA;
  c->dout = (spn_tensor_t)SPN_TENSOR_INIT;
  assert_int_equal(spn_model_output_shapes(c->m, &c->din, 1, &c->dout, 1, &err), SPN_OK);
  c->dout.data = c->dy;
  c->dout.device_kind = SPN_DEVICE_CUDA;
}

static void conv_case_close(conv_case_t *c) {
  spn_model_release(&c->m);
  spn_engine_free(&c->eng);
  if (c->st)
    cudaStreamDestroy(c->st);
  cudaFree(c->dx);
  cudaFree(c->dy);
  free(c->pm.p);
}

static void a_new_shape_after_the_callers_stream_is_gone(void **state) {
  (void)state;
  conv_case_t c;
  spn_error_t err = SPN_ERROR_INIT;
  conv_case_open(&c);
  assert_int_equal(cudaMemsetAsync(c.dx, 0, 50 * sizeof(float), c.st), cudaSuccess); /* c.st: non-blocking */
  if (spn_model_run_on(c.m, &c.din, 1, &c.dout, 1, c.st, &err))
    fail_msg("run_on: %s", err.msg);
  assert_int_equal(cudaStreamSynchronize(c.st), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(c.st), cudaSuccess);
  c.st = NULL;

  float x[100] = {0};
  spn_tensor_t hin = image(x, 2), hout = SPN_TENSOR_INIT;
  if (spn_model_run(c.m, &hin, 1, &hout, 1, &err))
    fail_msg("a new shape after the caller's stream was destroyed: %s", err.msg);
  spn_model_output_free(&hout);
  conv_case_close(&c);
}

static void graphs_are_captured_off_the_callers_stream(void **state) {
  (void)state;
  conv_case_t c;
  conv_case_open(&c);
  spn_model_t *m = c.m;
  spn_error_t err = SPN_ERROR_INIT;
  cudaStream_t st = c.st;
  void *dx = c.dx, *dy = c.dy;
  float x[50], y1[75], y3[75];
  long long launches = spn_emu_graph_launches();
  for (int run = 1; run <= 3; run++) {
    /* A different input each run: the replay must read run 3's. */
    for (int i = 0; i < 50; i++)
      x[i] = (float)((i * 7 + run * 3) % 11) * 0.25f;
    assert_int_equal(cudaMemcpyAsync(dx, x, sizeof x, cudaMemcpyHostToDevice, st), cudaSuccess);
    if (spn_model_run_on(m, &c.din, 1, &c.dout, 1, st, &err))
      fail_msg("run %d: %s", run, err.msg);
    assert_int_equal(cudaMemcpyAsync(run == 1 ? y1 : y3, dy, sizeof y1, cudaMemcpyDeviceToHost, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
  }
  assert_int_equal(spn_emu_stream_captures(st), 0);
  assert_true(spn_emu_graph_launches() > launches); /* run 3 replayed a graph */
  /* Run 3's input through the eager path (a new engine run on the host). */
  spn_tensor_t hin = image(x, 1), hout = SPN_TENSOR_INIT;
  if (spn_model_run(m, &hin, 1, &hout, 1, &err))
    fail_msg("host run: %s", err.msg);
  const float *ref = hout.data;
  bool differs = false;
  for (int i = 0; i < 75; i++) {
    assert_float_equal(y3[i], ref[i], 1e-5);
    differs |= y3[i] != y1[i];
  }
  assert_true(differs); /* the replay did not return run 1's result */
  spn_model_output_free(&hout);
  conv_case_close(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_new_shape_after_the_callers_stream_is_gone),
      cmocka_unit_test(graphs_are_captured_off_the_callers_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
