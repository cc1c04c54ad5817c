/* test-haar-load.c — cascade files that are wrong in one way each are
 * rejected with an error naming the input and the line; bad detect
 * arguments are rejected; a tiny hand-written cascade detects what it
 * should. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "haar.h"

/* A 6x6-window cascade, one stage, one stump. */
#define HEAD "<?xml version=\"1.0\"?>\n<opencv_storage>\n<cascade type_id=\"opencv-cascade-classifier\">\n" \
             "<stageType>BOOST</stageType>\n<featureType>HAAR</featureType>\n<height>6</height>\n<width>6</width>\n" \
             "<featureParams><maxCatCount>0</maxCatCount></featureParams>\n<stageNum>1</stageNum>\n"
#define STAGES(nodes, leaves) \
  "<stages><_><maxWeakCount>1</maxWeakCount><stageThreshold>0.5</stageThreshold><weakClassifiers>\n" \
  "<_><internalNodes>" nodes "</internalNodes><leafValues>" leaves "</leafValues></_>\n"      \
  "</weakClassifiers></_></stages>\n"
#define FEATURES(rects) "<features><_><rects>" rects "</rects><tilted>0</tilted></_></features>\n"
#define TAIL "</cascade>\n</opencv_storage>\n"

/* Feature: -1 x the whole window + 2 x its left half = left half minus right
 * half. Stump: value < 0.1 -> leaf -1 (below the stage threshold), else 1. */
static const char good[] = HEAD STAGES("0 -1 0 0.1", "-1. 1.") FEATURES("<_>0 0 6 6 -1.</_><_>0 0 3 6 2.</_>") TAIL;

static int32_t load(const char *xml, spn_error_t *err, spn_haar_cascade_t **c) {
  return spn_haar_cascade_load_memory(xml, strlen(xml), "test.xml", c, err);
}

static void expect_error(const char *xml, int32_t code, const char *needle) {
  spn_haar_cascade_t *c = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  int32_t rc = load(xml, &err, &c);
  if (rc != code || !strstr(err.msg, needle) || !strstr(err.msg, "test.xml"))
    print_error("got %d '%s', wanted %d with '%s'\n", rc, err.msg, code, needle);
  assert_int_equal(rc, code);
  assert_null(c);
  assert_non_null(strstr(err.msg, "test.xml"));
  assert_non_null(strstr(err.msg, needle));
}

static void test_good_cascade_detects_edges(void **state) {
  (void)state;
  spn_haar_cascade_t *c = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(load(good, &err, &c), SPN_OK);
  int32_t ww, wh;
  spn_haar_cascade_window(c, &ww, &wh);
  assert_int_equal(ww, 6);
  /* 40x20 image: bright columns 0..19, dark 20..39 (with a little texture
   * so windows have variance). Windows straddling the edge with bright on the
   * left pass; flat windows fail the variance test. */
  enum { W = 40, H = 20 };
  uint8_t img[W * H];
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++)
      img[y * W + x] = (uint8_t)((x < 20 ? 200 : 40) + ((x * 7 + y * 13) % 5));
  spn_haar_params_t p = SPN_HAAR_PARAMS_INIT;
  p.min_neighbors = 0;
  p.max_w = p.max_h = 6; /* one level: the original image */
  spn_rect_t *r = NULL;
  int32_t n = 0;
  assert_int_equal(spn_haar_detect(c, img, W, H, W, &p, &r, &n, &err), SPN_OK);
  assert_true(n > 0);
  for (int32_t i = 0; i < n; i++) {
    /* The edge (x = 20) lies inside the window, bright side left of it. */
    assert_int_equal(r[i].w, 6);
    assert_true(r[i].x >= 14 && r[i].x <= 19);
    assert_true(r[i].x % 2 == 0 && r[i].y % 2 == 0); /* step 2 at scale 1 */
  }
  free(r);
  /* Hits 2 px apart are not "similar" for a 6-px window (eps 0.2 allows
   * 1.2 px), so with min_neighbors 1 every lone hit is dropped. */
  p.min_neighbors = 1;
  assert_int_equal(spn_haar_detect(c, img, W, H, W, &p, &r, &n, &err), SPN_OK);
  assert_int_equal(n, 0);
  spn_haar_cascade_free(c);
}

static void test_malformed_cascades(void **state) {
  (void)state;
  expect_error("<opencv_storage><cascade>", SPN_EPARSE, "not well-formed XML");
  expect_error("<?xml version=\"1.0\"?><other/>", SPN_EPARSE, "<opencv_storage>");
  expect_error("<opencv_storage><cascade><x/></cascade></opencv_storage>", SPN_EPARSE, "not a cascade");
  /* LBP is refused as unsupported, not misread. */
  {
    static const char lbp[] = "<opencv_storage><cascade><stageType>BOOST</stageType><featureType>LBP</featureType>"
                              "</cascade></opencv_storage>";
    expect_error(lbp, SPN_EUNSUPPORTED, "HAAR");
  }
  expect_error(HEAD STAGES("0 -1 5 0.1", "-1. 1.") FEATURES("<_>0 0 6 6 -1.</_><_>0 0 3 6 2.</_>") TAIL,
               SPN_EPARSE, "feature index out of range");
  expect_error(HEAD STAGES("0 -1 0 0.1", "-1.") FEATURES("<_>0 0 6 6 -1.</_><_>0 0 3 6 2.</_>") TAIL, SPN_EPARSE,
               "leafValues");
  expect_error(HEAD STAGES("0 -1 0", "-1. 1.") FEATURES("<_>0 0 6 6 -1.</_><_>0 0 3 6 2.</_>") TAIL, SPN_EPARSE,
               "4 numbers per node");
  expect_error(HEAD STAGES("0 -1 0 0.1", "-1. 1.") FEATURES("<_>0 0 7 6 -1.</_><_>0 0 3 6 2.</_>") TAIL, SPN_EPARSE,
               "outside the detection window");
  expect_error(HEAD STAGES("0 -1 0 0.1", "-1. 1.") FEATURES("<_>0 0 6 6 -1.</_><_>0 0 3 six 2.</_>") TAIL,
               SPN_EPARSE, "x y width height weight");
  /* A child pointing back at its own node would loop forever: refused. */
  expect_error(HEAD STAGES("1 -1 0 0.1 1 -2 0 0.2", "-1. 1. 0.5") FEATURES("<_>0 0 6 6 -1.</_><_>0 0 3 6 2.</_>") TAIL, SPN_EPARSE,
               "child index out of range");
  /* The message carries the line of the offending element. */
  {
    spn_haar_cascade_t *c = NULL;
    spn_error_t err = SPN_ERROR_INIT;
    assert_int_equal(load(HEAD "<stages><_><stageThreshold>zero</stageThreshold></_></stages>"
                               FEATURES("<_>0 0 6 6 -1.</_><_>0 0 3 6 2.</_>") TAIL, &err, &c),
                     SPN_EPARSE);
    assert_non_null(strstr(err.msg, "test.xml:10:"));
    assert_non_null(strstr(err.msg, "stageThreshold"));
  }
}

static void test_files_and_arguments(void **state) {
  (void)state;
  spn_haar_cascade_t *c = NULL;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_haar_cascade_load("/nonexistent/cascade.xml", &c, &err), SPN_ENOENT);
  assert_non_null(strstr(err.msg, "/nonexistent/cascade.xml"));
  assert_int_equal(load(good, &err, &c), SPN_OK);
  uint8_t img[64] = {0};
  spn_rect_t *r = NULL;
  int32_t n = 0;
  spn_haar_params_t p = SPN_HAAR_PARAMS_INIT;
  p.scale_factor = 1.0;
  assert_int_equal(spn_haar_detect(c, img, 8, 8, 8, &p, &r, &n, &err), SPN_EINVAL);
  assert_non_null(strstr(err.msg, "scale_factor"));
  p.scale_factor = 1.1;
  assert_int_equal(spn_haar_detect(c, img, 8, 8, 4, &p, &r, &n, &err), SPN_EINVAL);
  /* Smaller than the window: no faces, no error. */
  assert_int_equal(spn_haar_detect(c, img, 4, 4, 4, &p, &r, &n, &err), SPN_OK);
  assert_int_equal(n, 0);
  assert_null(r);
  /* Flat image: no variance, no detections. */
  assert_int_equal(spn_haar_detect(c, img, 8, 8, 8, &p, &r, &n, &err), SPN_OK);
  assert_int_equal(n, 0);
  spn_haar_cascade_free(c);
}

/* groupRectangles: a cluster of 3 similar boxes survives min_neighbors 2, a
 * lone box does not, and a small cluster inside a big one is dropped. */
static void test_group_rectangles(void **state) {
  (void)state;
  spn_rect_t r[] = {{100, 100, 50, 50}, {102, 101, 50, 50}, {99, 103, 52, 52}, {300, 300, 40, 40},
                    {10, 10, 200, 200}, {12, 10, 200, 200}, {11, 12, 198, 198}, {10, 11, 200, 200},
                    {60, 60, 20, 20},   {61, 60, 20, 20},   {60, 61, 20, 20}};
  int32_t n = (int32_t)(sizeof r / sizeof r[0]);
  assert_int_equal(spn_haar_group_rectangles(r, &n, 2, 0.2), SPN_OK);
  /* Cluster 1 (3 boxes, inside the 4-box cluster, 4 > max(3, 3)) is dropped as
   * well as the lone box; the 20-px cluster (3) is inside too and dropped. */
  assert_int_equal(n, 1);
  assert_int_equal(r[0].x, 11); /* (10+12+11+10)/4 = 10.75 -> 11 */
  assert_int_equal(r[0].y, 11); /* (10+10+12+11)/4 = 10.75 */
  assert_int_equal(r[0].w, 200); /* 798/4 = 199.5 -> 200 (round half to even) */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_cascade_detects_edges),
      cmocka_unit_test(test_malformed_cascades),
      cmocka_unit_test(test_files_and_arguments),
      cmocka_unit_test(test_group_rectangles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
