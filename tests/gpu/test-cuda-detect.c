/* test-cuda-detect.c — spn_cuda_facedet_candidates (cuda/kernels/detect.cu)
 * plus spn_facedet_select against spn_facedet_decode, its CPU twin, on
 * random raw outputs of RetinaFace, SCRFD (with and without keypoints) and
 * YuNet, for each fit of the input (as is, stretched, letterboxed).
 *
 * Scores are drawn on a grid of 1/64, so many candidates tie: the GPU's
 * rows come back in any order, and only sorting them by anchor gives the
 * CPU's order among equal scores — a wrong anchor index fails the test.
 * Boxes and landmarks within 1e-4 relative (CUDA's expf is within 2 ulp of
 * glibc's; everything else is the same arithmetic). Also: a list smaller
 * than the candidates reports the true count and writes only its capacity;
 * argument errors are refused before any launch.
 * Exits 77 without a CUDA device.
 *
 * Built a second time with SPN_TEST_DETECT_HOST (test cuda-detect-host, in
 * every CUDA build): the same cases through spn_cuda_facedet_candidates_host,
 * the kernel's code run on the host on host memory, so its indexing, layout
 * and batch split are checked on a machine without a GPU; there the rows
 * come in another order than the decoders', and the arithmetic is the
 * host's, so boxes match exactly. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "detect.cuh"
#include "facedet.h"
#include "gpu-skip.h"
#include "gpu-test.h"

/* Where the outputs and the list live: device memory and the kernel, or
 * host memory and the kernel's code run on the host. */
#ifdef SPN_TEST_DETECT_HOST
#define DEV_ALLOC(pp, n) assert_non_null(*(void **)(pp) = malloc(n))
#define DEV_FREE(p) free(p)
#define TO_DEV(dst, src, n) memcpy(dst, src, n)
#define FROM_DEV(dst, src, n) memcpy(dst, src, n)
#define DEV_SET(p, v, n) memset(p, v, n)
#define CANDIDATES(d, list, cap, e) spn_cuda_facedet_candidates_host(d, list, cap, e)
#define TOL 0.f
#else
#define DEV_ALLOC(pp, n) CU(cudaMalloc((void **)(pp), n))
#define DEV_FREE(p) CU(cudaFree(p))
#define TO_DEV(dst, src, n) CU(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice))
#define FROM_DEV(dst, src, n) CU(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost))
#define DEV_SET(p, v, n) CU(cudaMemset(p, v, n))
#define CANDIDATES(d, list, cap, e) spn_cuda_facedet_candidates(d, list, cap, 0, e)
#define TOL 1e-4f
#endif

typedef struct outputs {
  int32_t n;
  spn_facedet_output_t lay[SPN_FACEDET_MAX_OUTPUTS];
  float *host[SPN_FACEDET_MAX_OUTPUTS];
  float *dev[SPN_FACEDET_MAX_OUTPUTS];
  spn_tensor_t t[SPN_FACEDET_MAX_OUTPUTS];
} outputs_t;

/* Random outputs of the layout: scores on a 1/64 grid, about `hot` of them
 * above 0.5; box and landmark terms in a detector's range. */
static void make_outputs(int32_t model, int32_t n, const spn_facedet_geom_t *g, uint32_t seed, float hot,
                         outputs_t *o) {
  memset(o, 0, sizeof *o);
  o->n = n;
  CK(spn_facedet_layout(model, n, g, o->lay, &e_));
  for (int32_t i = 0; i < n; i++) {
    size_t cnt = (size_t)o->lay[i].rows * (size_t)o->lay[i].cols;
    o->host[i] = malloc(cnt * sizeof(float));
    assert_non_null(o->host[i]);
    const char *w = o->lay[i].what;
    int score = !strcmp(w, "conf") || !strcmp(w, "scores") || !strcmp(w, "cls") || !strcmp(w, "obj");
    for (size_t k = 0; k < cnt; k++) {
      float u = rng_unit(&seed);
      if (score)
        o->host[i][k] = rng_unit(&seed) < hot ? floorf((0.5f + 0.5f * u) * 64.f) / 64.f : floorf(u * 32.f) / 64.f;
      else if (!strcmp(w, "bbox") && model == SPN_FACEDET_SCRFD)
        o->host[i][k] = 4.f * u; /* distances to the sides, in strides */
      else
        o->host[i][k] = 2.f * u - 1.f;
    }
    o->t[i] = (spn_tensor_t)SPN_TENSOR_INIT;
    o->t[i].dtype = SPN_DTYPE_F32;
    o->t[i].ndim = 3;
    o->t[i].shape[0] = 1;
    o->t[i].shape[1] = o->lay[i].rows;
    o->t[i].shape[2] = o->lay[i].cols;
    o->t[i].data = o->host[i];
    DEV_ALLOC(&o->dev[i], cnt * sizeof(float));
    TO_DEV(o->dev[i], o->host[i], cnt * sizeof(float));
  }
}

static void free_outputs(outputs_t *o) {
  for (int32_t i = 0; i < o->n; i++) {
    free(o->host[i]);
    DEV_FREE(o->dev[i]);
  }
}

static spn_cuda_facedet_t describe(int32_t model, const outputs_t *o, const spn_facedet_geom_t *g, float thr) {
  spn_cuda_facedet_t d = {.model = model, .n_outputs = o->n};
  for (int32_t i = 0; i < o->n; i++)
    d.outputs[i] = o->dev[i];
  d.in_w = g->in_w;
  d.in_h = g->in_h;
  d.pad_x = g->pad_x;
  d.pad_y = g->pad_y;
  d.scale_x = g->scale_x;
  d.scale_y = g->scale_y;
  d.score_threshold = thr;
  return d;
}

/* Run the kernel with room for `cap` rows; returns the count it reported and
 * the rows it wrote (min(count, cap)), sorted as the stage sorts them. */
static int32_t run_kernel(const spn_cuda_facedet_t *d, int32_t cap, spn_cuda_facecand_t **rows) {
  size_t bytes = SPN_CUDA_FACECAND_HEADER + (size_t)cap * sizeof(spn_cuda_facecand_t);
  void *list = NULL;
  DEV_ALLOC(&list, bytes);
  DEV_SET(list, 0xff, bytes); /* the kernel must clear the count itself */
  CK(CANDIDATES(d, list, cap, &e_));
  uint8_t *host = malloc(bytes);
  assert_non_null(host);
  FROM_DEV(host, list, bytes);
  DEV_FREE(list);
  int32_t count;
  memcpy(&count, host, sizeof count);
  int32_t got = count < cap ? count : cap;
  *rows = malloc((size_t)(got > 0 ? got : 1) * sizeof **rows);
  assert_non_null(*rows);
  memcpy(*rows, host + SPN_CUDA_FACECAND_HEADER, (size_t)got * sizeof **rows);
  free(host);
  qsort(*rows, (size_t)got, sizeof **rows, spn_cuda_facecand_order);
  return count;
}

static int near(float a, float b) { return fabsf(a - b) <= TOL * fmaxf(1.f, fabsf(a)); }

static void compare_faces(const spn_detface_t *ref, int32_t nref, const spn_detface_t *got, int32_t ngot, int model,
                          int what) {
  if (ngot != nref)
    fail_msg("model %d case %d: %d faces on the GPU, %d on the CPU", model, what, ngot, nref);
  for (int32_t i = 0; i < nref; i++) {
    const float *a = &ref[i].x0, *b = &got[i].x0;
    for (int k = 0; k < 5; k++)
      if (!near(a[k], b[k]))
        fail_msg("model %d case %d face %d field %d: GPU %.9g CPU %.9g", model, what, i, k, b[k], a[k]);
    assert_int_equal(got[i].has_landmarks, ref[i].has_landmarks);
    for (int k = 0; k < 10 && ref[i].has_landmarks; k++)
      if (!near(ref[i].landmarks[k], got[i].landmarks[k]))
        fail_msg("model %d case %d face %d landmark %d: GPU %.9g CPU %.9g", model, what, i, k, got[i].landmarks[k],
                 ref[i].landmarks[k]);
  }
}

static void gpu_matches_cpu(void **state) {
  (void)state;
  /* image size, input size, fit */
  const int32_t fits[][5] = {{320, 240, 320, 240, SPN_FACEDET_FIT_NONE},
                             {300, 200, 320, 224, SPN_FACEDET_FIT_NONE},
                             {640, 360, 256, 192, SPN_FACEDET_FIT_STRETCH},
                             {640, 360, 320, 320, SPN_FACEDET_FIT_TOPLEFT}};
  const int32_t models[][2] = {{SPN_FACEDET_RETINAFACE, 3}, {SPN_FACEDET_SCRFD, 6}, {SPN_FACEDET_SCRFD, 9},
                               {SPN_FACEDET_YUNET, 12}};
  uint32_t seed = 11;
  int compared = 0;
  for (size_t m = 0; m < sizeof models / sizeof *models; m++)
    for (size_t f = 0; f < sizeof fits / sizeof *fits; f++) {
      int32_t model = models[m][0];
      spn_facedet_geom_t g;
      CK(spn_facedet_fit(fits[f][0], fits[f][1], fits[f][2], fits[f][3], fits[f][4], &g, &e_));
      if (model == SPN_FACEDET_YUNET && (g.in_w % 32 || g.in_h % 32))
        continue;
      outputs_t o;
      make_outputs(model, models[m][1], &g, seed++, model == SPN_FACEDET_YUNET ? 0.3f : 0.02f, &o);
      spn_facedet_params_t p = SPN_FACEDET_PARAMS_INIT;
      p.pre_nms_top_k = 40; /* cut inside a run of equal scores */
      spn_detface_t *ref = NULL, *got = NULL;
      int32_t nref = 0, ngot = 0;
      CK(spn_facedet_decode(model, o.t, o.n, &g, &p, &ref, &nref, &e_));
      spn_cuda_facedet_t d = describe(model, &o, &g, p.score_threshold);
      spn_cuda_facecand_t *rows = NULL;
      int32_t count = run_kernel(&d, 1 << 16, &rows);
      assert_true(count > 0 && count < (1 << 16));
      spn_detface_t *c = malloc((size_t)count * sizeof *c);
      assert_non_null(c);
      for (int32_t i = 0; i < count; i++) {
        memcpy(&c[i], &rows[i], sizeof c[i]);
        assert_true(rows[i].image == 0 && (i == 0 || rows[i].anchor > rows[i - 1].anchor));
      }
      CK(spn_facedet_select(model, c, count, &g, &p, &got, &ngot, &e_));
      assert_true(nref > 0);
      compare_faces(ref, nref, got, ngot, model, (int)f);
      compared += nref;
      free(c);
      free(rows);
      free(ref);
      free(got);
      free_outputs(&o);
    }
  assert_true(compared > 100);
}

/* Three images in one launch (batch = 3, each output holding the three back
 * to back): split by the rows' image, each image's faces are the CPU's for
 * that image alone. */
static void batch_matches_per_image(void **state) {
  (void)state;
  const int32_t models[][2] = {{SPN_FACEDET_RETINAFACE, 3}, {SPN_FACEDET_SCRFD, 9}, {SPN_FACEDET_YUNET, 12}};
  enum { B = 3 };
  for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
    int32_t model = models[m][0], nout = models[m][1];
    spn_facedet_geom_t g;
    CK(spn_facedet_fit(320, 224, 320, 224, SPN_FACEDET_FIT_NONE, &g, &e_));
    outputs_t o[B];
    for (int b = 0; b < B; b++)
      make_outputs(model, nout, &g, 100u + (uint32_t)(7 * b + m), model == SPN_FACEDET_YUNET ? 0.3f : 0.02f, &o[b]);
    spn_cuda_facedet_t d = describe(model, &o[0], &g, 0.5f);
    d.batch = B;
    float *cat[SPN_FACEDET_MAX_OUTPUTS];
    for (int32_t i = 0; i < nout; i++) {
      size_t cnt = (size_t)o[0].lay[i].rows * (size_t)o[0].lay[i].cols;
      DEV_ALLOC(&cat[i], cnt * B * sizeof(float));
      for (int b = 0; b < B; b++)
        TO_DEV(cat[i] + cnt * b, o[b].host[i], cnt * sizeof(float));
      d.outputs[i] = cat[i];
    }
    spn_cuda_facecand_t *rows = NULL;
    int32_t count = run_kernel(&d, 1 << 16, &rows);
    spn_facedet_params_t p = SPN_FACEDET_PARAMS_INIT;
    int32_t first = 0;
    for (int b = 0; b < B; b++) {
      int32_t end = first;
      while (end < count && rows[end].image == b)
        end++;
      assert_true(end > first);
      spn_detface_t *c = malloc((size_t)(end - first) * sizeof *c), *ref = NULL, *got = NULL;
      assert_non_null(c);
      for (int32_t i = first; i < end; i++)
        memcpy(&c[i - first], &rows[i], sizeof *c);
      int32_t nref = 0, ngot = 0;
      CK(spn_facedet_decode(model, o[b].t, nout, &g, &p, &ref, &nref, &e_));
      CK(spn_facedet_select(model, c, end - first, &g, &p, &got, &ngot, &e_));
      assert_true(nref > 0);
      compare_faces(ref, nref, got, ngot, model, 100 + b);
      free(c);
      free(ref);
      free(got);
      first = end;
    }
    assert_int_equal(first, count); /* every row belongs to one of the three */
    free(rows);
    for (int32_t i = 0; i < nout; i++)
      DEV_FREE(cat[i]);
    for (int b = 0; b < B; b++)
      free_outputs(&o[b]);
  }
}

/* A list too small for the candidates: the count is the true number, the
 * rows written are `cap` of them, each a real candidate. */
static void short_list_reports_the_count(void **state) {
  (void)state;
  spn_facedet_geom_t g;
  CK(spn_facedet_fit(320, 240, 320, 240, SPN_FACEDET_FIT_NONE, &g, &e_));
  outputs_t o;
  make_outputs(SPN_FACEDET_RETINAFACE, 3, &g, 99, 0.05f, &o);
  int32_t above = 0;
  for (int64_t a = 0; a < o.lay[1].rows; a++)
    above += o.host[1][2 * a + 1] > 0.5f;
  spn_cuda_facedet_t d = describe(SPN_FACEDET_RETINAFACE, &o, &g, 0.5f);
  spn_cuda_facecand_t *rows = NULL;
  assert_true(above > 40);
  assert_int_equal(run_kernel(&d, 16, &rows), above);
  for (int i = 0; i < 16; i++) {
    assert_true(rows[i].anchor >= 0 && rows[i].anchor < o.lay[1].rows);
    assert_true(rows[i].score == o.host[1][2 * (int64_t)rows[i].anchor + 1]);
  }
  free(rows);
  spn_cuda_facedet_t none = d;
  none.score_threshold = 2.f; /* nothing passes: the count is cleared to 0 */
  assert_int_equal(run_kernel(&none, 16, &rows), 0);
  free(rows);
  free_outputs(&o);
}

static void bad_arguments_are_refused(void **state) {
  (void)state;
  spn_error_t e = SPN_ERROR_INIT;
  float dummy;
  spn_cuda_facedet_t d = {.model = SPN_CUDA_FACEDET_RETINAFACE, .n_outputs = 3, .in_w = 64, .in_h = 64,
                          .scale_x = 1, .scale_y = 1, .score_threshold = 0.5f};
  d.outputs[0] = d.outputs[1] = d.outputs[2] = &dummy;
  assert_int_equal(CANDIDATES(&d, NULL, 4, &e), SPN_EINVAL);
  spn_cuda_facedet_t bad = d;
  bad.n_outputs = 4;
  assert_int_equal(CANDIDATES(&bad, &dummy, 4, &e), SPN_EINVAL);
  assert_non_null(strstr(e.msg, "4 outputs"));
  bad = d;
  bad.outputs[2] = NULL;
  assert_int_equal(CANDIDATES(&bad, &dummy, 4, &e), SPN_EINVAL);
  bad = d;
  bad.model = 7;
  assert_int_equal(CANDIDATES(&bad, &dummy, 4, &e), SPN_EINVAL);
  bad = d;
  bad.scale_x = 0;
  assert_int_equal(CANDIDATES(&bad, &dummy, 4, &e), SPN_EINVAL);
}

int main(void) {
#ifndef SPN_TEST_DETECT_HOST
  SPN_TEST_REQUIRE_GPU();
#endif
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gpu_matches_cpu),
      cmocka_unit_test(batch_matches_per_image),
      cmocka_unit_test(short_list_reports_the_count),
      cmocka_unit_test(bad_arguments_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
