/* test-track.c — per-track box smoothing: association, moving average over up
 * to 5 frames, faces appearing and disappearing, bad input, and Wav2Lip's
 * offline smoothing rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include <cmocka.h>

#include "track.h"

static spn_box_t box(float x, float y, float s) {
  return (spn_box_t){x, y, x + s, y + s};
}

/* One face moving right 4 px a frame: frame k's output is the mean of the
 * last min(k+1, 5) boxes, i.e. x0 = 4 * (k - (h-1)/2) with h boxes. */
static void test_single_track_moving_average(void **state) {
  (void)state;
  spn_box_smoother_t *s = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_box_smoother_new(NULL, &s, &err), SPN_OK);
  int64_t id = 0;
  for (int k = 0; k < 12; k++) {
    spn_box_t d = box(100.f + 4.f * k, 50.f, 80.f);
    spn_tracked_box_t o;
    assert_int_equal(spn_box_smoother_update(s, &d, 1, &o, &err), SPN_OK);
    int h = k + 1 < 5 ? k + 1 : 5;
    assert_int_equal(o.history, h);
    if (k == 0)
      id = o.track_id;
    assert_true(o.track_id == id);
    float want = 100.f + 4.f * ((float)k - (float)(h - 1) / 2.f);
    assert_float_equal(o.box.x0, want, 1e-4);
    assert_float_equal(o.box.x1, want + 80.f, 1e-4);
    assert_float_equal(o.box.y0, 50.f, 1e-6);
  }
  assert_int_equal(spn_box_smoother_tracks(s), 1);
  spn_box_smoother_free(s);
}

/* Two faces: ids follow the boxes even when the detector lists them in a
 * different order; each track averages only its own boxes. */
static void test_two_tracks_follow_boxes(void **state) {
  (void)state;
  spn_box_smoother_t *s = NULL;
  assert_int_equal(spn_box_smoother_new(NULL, &s, NULL), SPN_OK);
  spn_box_t f0[2] = {box(10, 10, 50), box(300, 40, 60)};
  spn_tracked_box_t o0[2], o1[2];
  assert_int_equal(spn_box_smoother_update(s, f0, 2, o0, NULL), SPN_OK);
  assert_true(o0[0].track_id != o0[1].track_id);
  spn_box_t f1[2] = {box(306, 40, 60), box(12, 10, 50)}; /* swapped order, moved */
  assert_int_equal(spn_box_smoother_update(s, f1, 2, o1, NULL), SPN_OK);
  assert_true(o1[0].track_id == o0[1].track_id);
  assert_true(o1[1].track_id == o0[0].track_id);
  assert_float_equal(o1[0].box.x0, 303.f, 1e-4);
  assert_float_equal(o1[1].box.x0, 11.f, 1e-4);
  assert_int_equal(o1[0].history, 2);
  spn_box_smoother_free(s);
}

/* A face missing for max_missed frames keeps its track and history; missing
 * one frame longer, it comes back as a new track. A face appearing next to a
 * tracked one gets a new id and no borrowed history. */
static void test_disappear_and_reappear(void **state) {
  (void)state;
  spn_box_smoother_params_t p = SPN_BOX_SMOOTHER_PARAMS_INIT;
  p.max_missed = 2;
  spn_box_smoother_t *s = NULL;
  assert_int_equal(spn_box_smoother_new(&p, &s, NULL), SPN_OK);
  spn_box_t a = box(100, 100, 40);
  spn_tracked_box_t o;
  for (int k = 0; k < 3; k++)
    assert_int_equal(spn_box_smoother_update(s, &a, 1, &o, NULL), SPN_OK);
  int64_t id = o.track_id;
  assert_int_equal(o.history, 3);
  /* Gone for 2 frames: the track survives. */
  assert_int_equal(spn_box_smoother_update(s, NULL, 0, NULL, NULL), SPN_OK);
  assert_int_equal(spn_box_smoother_update(s, NULL, 0, NULL, NULL), SPN_OK);
  assert_int_equal(spn_box_smoother_tracks(s), 1);
  spn_box_t a2 = box(120, 100, 40); /* IoU with a = 20*40/(2*1600-800) = 1/3 */
  assert_int_equal(spn_box_smoother_update(s, &a2, 1, &o, NULL), SPN_OK);
  assert_true(o.track_id == id);
  assert_int_equal(o.history, 4);
  assert_float_equal(o.box.x0, (3 * 100.f + 120.f) / 4.f, 1e-4);
  /* A second face appears: new id, history 1, its own box. */
  spn_box_t two[2] = {a2, box(400, 300, 60)};
  spn_tracked_box_t o2[2];
  assert_int_equal(spn_box_smoother_update(s, two, 2, o2, NULL), SPN_OK);
  assert_true(o2[0].track_id == id);
  assert_true(o2[1].track_id != id);
  assert_int_equal(o2[1].history, 1);
  assert_float_equal(o2[1].box.x0, 400.f, 1e-6);
  /* Both gone for 3 frames: the tracks end. */
  for (int k = 0; k < 3; k++)
    assert_int_equal(spn_box_smoother_update(s, NULL, 0, NULL, NULL), SPN_OK);
  assert_int_equal(spn_box_smoother_tracks(s), 0);
  assert_int_equal(spn_box_smoother_update(s, &a2, 1, &o, NULL), SPN_OK);
  assert_true(o.track_id != id && o.track_id != o2[1].track_id);
  assert_int_equal(o.history, 1);
  assert_float_equal(o.box.x0, 120.f, 1e-6);
  spn_box_smoother_free(s);
}

/* A box that moved too far (IoU below threshold) starts a new track. */
static void test_low_iou_starts_new_track(void **state) {
  (void)state;
  spn_box_smoother_t *s = NULL;
  assert_int_equal(spn_box_smoother_new(NULL, &s, NULL), SPN_OK);
  spn_box_t a = box(0, 0, 100), b = box(80, 0, 100); /* IoU 20/180 < 0.3 */
  spn_tracked_box_t oa, ob;
  assert_int_equal(spn_box_smoother_update(s, &a, 1, &oa, NULL), SPN_OK);
  assert_int_equal(spn_box_smoother_update(s, &b, 1, &ob, NULL), SPN_OK);
  assert_true(oa.track_id != ob.track_id);
  assert_int_equal(ob.history, 1);
  spn_box_smoother_free(s);
}

/* Bad boxes and params fail without changing the state. */
static void test_bad_input(void **state) {
  (void)state;
  spn_box_smoother_params_t p = SPN_BOX_SMOOTHER_PARAMS_INIT;
  spn_box_smoother_t *s = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  p.window = 0;
  assert_int_equal(spn_box_smoother_new(&p, &s, &err), SPN_EINVAL);
  assert_null(s);
  assert_non_null(strstr(err.msg, "window"));
  assert_int_equal(spn_box_smoother_new(NULL, &s, &err), SPN_OK);
  spn_box_t a = box(10, 10, 20);
  spn_tracked_box_t o[2];
  assert_int_equal(spn_box_smoother_update(s, &a, 1, o, &err), SPN_OK);
  spn_box_t bad[2] = {box(10, 10, 20), {5, 5, 1, 9}};
  assert_int_equal(spn_box_smoother_update(s, bad, 2, o, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "detection 1"));
  assert_int_equal(spn_box_smoother_tracks(s), 1);
  assert_int_equal(spn_box_smoother_update(s, &a, 1, o, &err), SPN_OK);
  assert_int_equal(o[0].history, 2); /* the failed frame left no trace */
  spn_box_smoother_free(s);
}

/* Wav2Lip's get_smoothened_boxes, values worked out by hand from its code
 * (forward window, in place, Python slice boxes[n-T:] at the tail). */
static void test_wav2lip_sequence(void **state) {
  (void)state;
  spn_box_t seq[7];
  for (int i = 0; i < 7; i++)
    seq[i] = (spn_box_t){10.f * i, 0, 10.f * i + 5, 5};
  assert_int_equal(spn_box_smooth_sequence(seq, 7, 5), SPN_OK);
  const float want[7] = {20.f, 30.f, 40.f, 44.f, 46.8f, 48.16f, 47.792f};
  for (int i = 0; i < 7; i++) {
    assert_float_equal(seq[i].x0, want[i], 1e-4);
    assert_float_equal(seq[i].x1, want[i] + 5.f, 1e-4);
  }
  spn_box_t shortseq[3] = {{0, 0, 1, 1}, {10, 0, 11, 1}, {20, 0, 21, 1}};
  assert_int_equal(spn_box_smooth_sequence(shortseq, 3, 5), SPN_OK);
  assert_float_equal(shortseq[0].x0, 15.f, 1e-5);
  assert_float_equal(shortseq[1].x0, 15.f, 1e-5);
  assert_float_equal(shortseq[2].x0, 17.5f, 1e-5);
  assert_int_equal(spn_box_smooth_sequence(shortseq, 3, 0), SPN_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_single_track_moving_average),
      cmocka_unit_test(test_two_tracks_follow_boxes),
      cmocka_unit_test(test_disappear_and_reappear),
      cmocka_unit_test(test_low_iou_starts_new_track),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_wav2lip_sequence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
