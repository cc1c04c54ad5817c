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
 * Unit suite; no GPU. */
#include <setjmp.h>
#include <stdarg.h>
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

static void a_new_shape_after_the_callers_stream_is_gone(void **state) {
  (void)state;
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
  pb_t pm = model(&g, 17);

  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  spn_engine_t *eng = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_new(&o, &eng, &err), SPN_OK);
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  mo.device = "cuda:0";
  mo.fallback = "error";
  spn_model_t *m = NULL;
  if (spn_engine_load_memory_opts(eng, pm.p, pm.n, "t.onnx", &mo, &m, &err))
    fail_msg("load: %s", err.msg);

  cudaStream_t st;
  assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  void *dx = NULL, *dy = NULL;
  assert_int_equal(cudaMalloc(&dx, 50 * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMalloc(&dy, 75 * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaMemset(dx, 0, 50 * sizeof(float)), cudaSuccess);
  spn_tensor_t din = image(dx, 1), dout = SPN_TENSOR_INIT;
  din.device_kind = SPN_DEVICE_CUDA;
  assert_int_equal(spn_model_output_shapes(m, &din, 1, &dout, 1, &err), SPN_OK);
  dout.data = dy;
  dout.device_kind = SPN_DEVICE_CUDA;
  if (spn_model_run_on(m, &din, 1, &dout, 1, st, &err))
    fail_msg("run_on: %s", err.msg);
  assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(st), cudaSuccess);

  float x[100] = {0};
  spn_tensor_t hin = image(x, 2), hout = SPN_TENSOR_INIT;
  if (spn_model_run(m, &hin, 1, &hout, 1, &err))
    fail_msg("a new shape after the caller's stream was destroyed: %s", err.msg);
  spn_model_output_free(&hout);
  spn_model_release(&m);
  spn_engine_free(&eng);
  cudaFree(dx);
  cudaFree(dy);
  free(pm.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_new_shape_after_the_callers_stream_is_gone),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
