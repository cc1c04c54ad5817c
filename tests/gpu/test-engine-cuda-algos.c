/* test-engine-cuda-algos.c — the CUDA engine backend's convolution
 * algorithm cache, on the fake CUDA libraries (tests/gpu/host-emu/README),
 * which count cuDNN's algorithm timings (cudnnFind*):
 *  - two convolutions of one shape in a model are timed once;
 *  - a new engine (as a new process would) reads the choice from the cache
 *    file and times nothing, with the same output; a new shape is timed
 *    and added to the file;
 *  - lines it cannot read are skipped, and a cached algorithm cuDNN no
 *    longer gives a workspace is timed again; a file without the cache's
 *    first line is not read;
 *  - SPINDLE_CUDNN_CACHE=0: no file is read or written (the process still
 *    times a problem once).
 * Unit suite; no GPU. */
#include <glob.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../engine/onnx-build.h"
#include "spindle/engine.h"

long long spn_emu_cudnn_finds(void); /* cudnn-fake.cpp's test hook */

/* x (N,2,5,5) -> Conv 3x3 pad 1 -> Conv 3x3 pad 1 (the same problem twice). */
static pb_t two_convs(void) {
  pb_t g = {0};
  const char *c0i[] = {"x", "w0"}, *c0o[] = {"h"}, *c1i[] = {"h", "w1"}, *c1o[] = {"y"};
  const int64_t ks[] = {3, 3}, pads[] = {1, 1, 1, 1};
  attr_t ca[] = {{.name = "kernel_shape", .type = 7, .n = 2, .ints = ks}, {.name = "pads", .type = 7, .n = 4, .ints = pads}};
  node(&g, "Conv", "conv0", c0i, 2, c0o, 1, ca, 2);
  node(&g, "Conv", "conv1", c1i, 2, c1o, 1, ca, 2);
  pb_str(&g, 2, "g");
  static float w0[2 * 2 * 9], w1[2 * 2 * 9];
  for (int i = 0; i < 2 * 2 * 9; i++) {
    w0[i] = (float)(i % 5) * 0.1f - 0.2f;
    w1[i] = (float)(i % 3) * 0.2f - 0.1f;
  }
  int64_t wd[] = {2, 2, 3, 3}, d[] = {-1, 2, 5, 5};
  initializer(&g, "w0", 4, wd, w0, 2 * 2 * 9);
  initializer(&g, "w1", 4, wd, w1, 2 * 2 * 9);
  value_info(&g, 11, "x", 4, d);
  value_info(&g, 12, "y", -1, NULL);
  return model(&g, 17);
}

/* A new engine (a new backend: the cache file read again) runs the model
 * on cuda:0 at batch n; returns the timings it asked for, out[] the output. */
static long long run_fresh(const pb_t *pm, int n, float *out) {
  spn_engine_opts_t o = SPN_ENGINE_OPTS_INIT;
  spn_engine_t *eng = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_engine_new(&o, &eng, &err), SPN_OK);
  spn_model_opts_t mo = SPN_MODEL_OPTS_INIT;
  mo.device = "cuda:0";
  mo.fallback = "error";
  spn_model_t *m = NULL;
  if (spn_engine_load_memory_opts(eng, pm->p, pm->n, "algos.onnx", &mo, &m, &err))
    fail_msg("load: %s", err.msg);
  float x[2 * 50];
  for (int i = 0; i < n * 50; i++)
    x[i] = (float)((i * 7) % 13) * 0.1f;
  spn_tensor_t in = SPN_TENSOR_INIT, res = SPN_TENSOR_INIT;
  in.dtype = SPN_DTYPE_F32;
  in.ndim = 4;
  in.shape[0] = n;
  in.shape[1] = 2;
  in.shape[2] = in.shape[3] = 5;
  in.data = x;
  long long before = spn_emu_cudnn_finds();
  if (spn_model_run(m, &in, 1, &res, 1, &err))
    fail_msg("run: %s", err.msg);
  long long finds = spn_emu_cudnn_finds() - before;
  memcpy(out, res.data, (size_t)n * 50 * sizeof(float));
  spn_model_output_free(&res);
  spn_model_release(&m);
  spn_engine_free(&eng);
  return finds;
}

static int lines_of(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF)
    n += c == '\n';
  fclose(f);
  return n;
}

/* The one cache file in dir. */
static void cache_file(char *path, size_t size, const char *dir) {
  char pat[600];
  snprintf(pat, sizeof pat, "%s/cudnn-algos-*.txt", dir);
  glob_t g;
  assert_int_equal(glob(pat, 0, NULL, &g), 0);
  assert_int_equal(g.gl_pathc, 1);
  snprintf(path, size, "%s", g.gl_pathv[0]);
  globfree(&g);
}

static void algorithms_are_timed_once_and_kept(void **state) {
  (void)state;
  char dir[] = "/tmp/spn-algos-XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("SPINDLE_CACHE_DIR", dir, 1);
  unsetenv("SPINDLE_CUDNN_CACHE");
  pb_t pm = two_convs();
  float a[100], b[100];

  /* One problem, two nodes: timed once, written once. */
  assert_int_equal(run_fresh(&pm, 1, a), 1);
  char path[512];
  cache_file(path, sizeof path, dir);
  assert_non_null(strstr(path, "-cudnn")); /* the GPU model and cuDNN version name it */
  assert_int_equal(lines_of(path), 2); /* its first line, one choice */

  /* A new engine reads it: nothing timed, the same result. */
  assert_int_equal(run_fresh(&pm, 1, b), 0);
  assert_memory_equal(a, b, 50 * sizeof(float));
  /* A new shape is a new problem. */
  assert_int_equal(run_fresh(&pm, 2, b), 1);
  assert_int_equal(lines_of(path), 3);

  /* Rewritten: a line it cannot read, and batch 1's problem with an
   * algorithm the fake cuDNN gives no workspace (0, implicit GEMM): timed
   * again, and the result is still right. */
  char key[400] = "";
  FILE *f = fopen(path, "r");
  char line[512];
  assert_non_null(fgets(line, sizeof line, f)); /* the first line */
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  assert_int_equal(sscanf(line, "%399s", key), 1);
  f = fopen(path, "w");
  fprintf(f, "spindle cudnn algorithms 1\nnot a line of the cache\n%s 0 0 0\n", key);
  fclose(f);
  assert_int_equal(run_fresh(&pm, 1, b), 1);
  assert_memory_equal(a, b, 50 * sizeof(float));

  /* Not the cache's file (another format): not read (timed again), and
   * replaced by the cache. */
  f = fopen(path, "w");
  fprintf(f, "%s 1 0 0\n", key);
  fclose(f);
  assert_int_equal(run_fresh(&pm, 1, b), 1);
  assert_int_equal(lines_of(path), 2);
  assert_int_equal(run_fresh(&pm, 1, b), 0);

  /* Off: timed in the process, nothing read or written. */
  unlink(path);
  setenv("SPINDLE_CUDNN_CACHE", "0", 1);
  assert_int_equal(run_fresh(&pm, 1, b), 1);
  assert_int_equal(lines_of(path), -1);
  unsetenv("SPINDLE_CUDNN_CACHE");
  unsetenv("SPINDLE_CACHE_DIR");
  rmdir(dir);
  free(pm.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(algorithms_are_timed_once_and_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
