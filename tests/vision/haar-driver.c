/* haar-driver.c — runs spn_haar_detect on PGM images and prints the boxes as
 * JSON, one object per image: {"file": "...", "boxes": [[x,y,w,h], ...]}.
 * With --repeat N it also times N detections per image and prints
 * {"file": ..., "ms": per-detection milliseconds}. Used by
 * test-haar-opencv.py and tests/bench/haar-bench.py.
 *
 *   haar-driver CASCADE SCALE MIN_NEIGHBORS MIN_W MIN_H MAX_W MAX_H THREADS [--repeat N] IMAGE.pgm...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "haar.h"
#include "pgm.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  if (argc < 10) {
    fprintf(stderr, "usage: %s CASCADE SCALE MIN_NEIGHBORS MIN_W MIN_H MAX_W MAX_H THREADS [--repeat N] IMAGE...\n",
            argv[0]);
    return 2;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_haar_cascade_t *c = NULL;
  if (spn_haar_cascade_load(argv[1], &c, &err) != SPN_OK) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  spn_haar_params_t p = SPN_HAAR_PARAMS_INIT;
  p.scale_factor = atof(argv[2]);
  p.min_neighbors = atoi(argv[3]);
  p.min_w = atoi(argv[4]);
  p.min_h = atoi(argv[5]);
  p.max_w = atoi(argv[6]);
  p.max_h = atoi(argv[7]);
  p.threads = atoi(argv[8]);
  int first = 9, repeat = 0;
  if (strcmp(argv[9], "--repeat") == 0 && argc > 11) {
    repeat = atoi(argv[10]);
    first = 11;
  }
  int rc = 0;
  for (int i = first; i < argc; i++) {
    int32_t w, h;
    uint8_t *img = pgm_read(argv[i], &w, &h);
    if (!img) {
      fprintf(stderr, "%s: cannot read PGM\n", argv[i]);
      rc = 1;
      continue;
    }
    spn_rect_t *r = NULL;
    int32_t n = 0;
    if (repeat > 0) {
      /* One warm-up, then the timed runs. */
      if (spn_haar_detect(c, img, w, h, w, &p, &r, &n, &err) == SPN_OK)
        free(r);
      double t0 = now_ms();
      for (int k = 0; k < repeat; k++) {
        r = NULL;
        if (spn_haar_detect(c, img, w, h, w, &p, &r, &n, &err) != SPN_OK)
          break;
        free(r);
      }
      printf("{\"file\": \"%s\", \"ms\": %.4f}\n", argv[i], (now_ms() - t0) / repeat);
      free(img);
      continue;
    }
    if (spn_haar_detect(c, img, w, h, w, &p, &r, &n, &err) != SPN_OK) {
      fprintf(stderr, "%s: %s\n", argv[i], err.msg);
      rc = 1;
      free(img);
      continue;
    }
    printf("{\"file\": \"%s\", \"boxes\": [", argv[i]);
    for (int32_t k = 0; k < n; k++)
      printf("%s[%d, %d, %d, %d]", k ? ", " : "", r[k].x, r[k].y, r[k].w, r[k].h);
    printf("]}\n");
    free(r);
    free(img);
  }
  spn_haar_cascade_free(c);
  return rc;
}
