/* test-mel.c — mel chunk indexing, parameter checks, and contexts created
 * and used from several threads at once (each must give the same result as
 * one context alone). The spectrogram values themselves are checked against
 * NumPy by test-mel.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "spindle/audio.h"

static void chunk_starts_by_hand(void **state) {
  (void)state;
  /* 25 fps: 3.2 columns per frame */
  assert_int_equal(spn_mel_chunk_start(0, 25, 1), 0);
  assert_int_equal(spn_mel_chunk_start(1, 25, 1), 3);
  assert_int_equal(spn_mel_chunk_start(5, 25, 1), 16);
  assert_int_equal(spn_mel_chunk_start(7, 25, 1), 22);
  /* 29.97 fps: 80 * 1001 / 30000 = 2.669.. per frame */
  assert_int_equal(spn_mel_chunk_start(1, 30000, 1001), 2);
  assert_int_equal(spn_mel_chunk_start(3, 30000, 1001), 8);
  /* copy out of a (2, 20) spectrogram whose value is 100*band + column */
  float mel[2 * 20], chunk[2 * 16];
  for (int m = 0; m < 2; m++)
    for (int c = 0; c < 20; c++)
      mel[m * 20 + c] = (float)(100 * m + c);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_mel_chunk(mel, 2, 20, 1, 25, 1, chunk, &err), SPN_OK);
  assert_float_equal(chunk[0], 3, 0);
  assert_float_equal(chunk[16 + 15], 118, 0);
  /* frame 2 starts at 6: 6 + 16 > 20, so the last 16 columns (4..19) */
  assert_int_equal(spn_mel_chunk(mel, 2, 20, 2, 25, 1, chunk, &err), SPN_OK);
  assert_float_equal(chunk[0], 4, 0);
  assert_float_equal(chunk[15], 19, 0);
  assert_int_equal(spn_mel_chunk(mel, 2, 10, 0, 25, 1, chunk, &err), SPN_EINVAL);
  assert_int_equal(spn_mel_chunk(mel, 2, 20, 0, 0, 1, chunk, &err), SPN_EINVAL);
}

static void bad_parameters_are_refused(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_mel_t *mel = NULL;
  spn_mel_params_t p = SPN_MEL_PARAMS_WAV2LIP;
  p.fmax = 9000.0f; /* above Nyquist at 16 kHz */
  assert_int_equal(spn_mel_new(&p, NULL, &mel, &err), SPN_EINVAL);
  assert_null(mel);
  assert_non_null(strstr(err.msg, "mel: invalid parameters"));
  assert_int_equal(spn_mel_new(NULL, NULL, &mel, &err), SPN_OK);
  assert_int_equal(spn_mel_frames(mel, 16000), 81);
  float x[300] = {0}, out[80 * 2];
  assert_int_equal(spn_mel_compute(mel, x, 300, out, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "too short"));
  spn_mel_free(&mel);
}

typedef struct {
  pthread_mutex_t *lock;
  const float *x;
  int64_t n;
  float *out;
  int32_t rc;
} job_t;

static void *worker(void *arg) {
  job_t *j = arg;
  spn_error_t err = SPN_ERROR_INIT;
  for (int k = 0; k < 5 && j->rc == SPN_OK; k++) {
    spn_mel_t *mel = NULL;
    j->rc = spn_mel_new(NULL, j->lock, &mel, &err);
    if (j->rc == SPN_OK)
      j->rc = spn_mel_compute(mel, j->x, j->n, j->out, &err);
    spn_mel_free(&mel);
  }
  return NULL;
}

static void contexts_in_threads_agree(void **state) {
  (void)state;
  const int64_t n = 16000;
  float *x = malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++)
    x[i] = 0.3f * sinf(2.0f * 3.14159265f * 440.0f * i / 16000.0f) + 0.01f * (float)((i * 7919) % 101 - 50) / 50.0f;
  spn_error_t err = SPN_ERROR_INIT;
  spn_mel_t *mel = NULL;
  assert_int_equal(spn_mel_new(NULL, NULL, &mel, &err), SPN_OK);
  int64_t frames = spn_mel_frames(mel, n);
  float *ref = malloc(sizeof(float) * 80 * frames);
  assert_int_equal(spn_mel_compute(mel, x, n, ref, &err), SPN_OK);
  spn_mel_free(&mel);
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  enum { T = 4 };
  pthread_t th[T];
  job_t jobs[T];
  for (int t = 0; t < T; t++) {
    jobs[t] = (job_t){t % 2 ? &lock : NULL, x, n, malloc(sizeof(float) * 80 * frames), SPN_OK};
    pthread_create(&th[t], NULL, worker, &jobs[t]);
  }
  for (int t = 0; t < T; t++) {
    pthread_join(th[t], NULL);
    assert_int_equal(jobs[t].rc, SPN_OK);
    assert_memory_equal(jobs[t].out, ref, sizeof(float) * 80 * frames);
    free(jobs[t].out);
  }
  free(ref);
  free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(chunk_starts_by_hand),
      cmocka_unit_test(bad_parameters_are_refused),
      cmocka_unit_test(contexts_in_threads_agree),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
