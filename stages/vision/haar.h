/* haar.h — Haar-cascade object detector (Viola–Jones) reading OpenCV cascade files.
 *
 * The embedded default face detector of the facedetect stage. It reads the
 * cascade XML files OpenCV ships (the "opencv-cascade-classifier" format with
 * stages, weakClassifiers, internalNodes, leafValues and features/rects, and
 * the older "opencv-haar-classifier" format with trees) and reproduces the
 * semantics of OpenCV's CascadeClassifier::detectMultiScale: the image (not
 * the features) is scaled down per pyramid level with a bit-exact bilinear
 * resize, windows are variance-normalised, stages reject early, and the
 * candidates are merged like groupRectangles(minNeighbors, eps = 0.2).
 *
 * No global state: a cascade is immutable once loaded and may be shared by
 * any number of threads calling spn_haar_detect() at once.
 */
#ifndef SPN_VISION_HAAR_H
#define SPN_VISION_HAAR_H

#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_rect {
  int32_t x, y, w, h;
} spn_rect_t;

typedef struct spn_haar_cascade spn_haar_cascade_t;

/* Parse a cascade from an XML file. `*out` receives the cascade on success.
 * Errors (SPN_ENOENT, SPN_EPARSE, SPN_EUNSUPPORTED for LBP/HOG cascades) name
 * the file and, where known, the line.
 * Ownership: caller owns *out (spn_haar_cascade_free). Thread: any. */
int32_t spn_haar_cascade_load(const char *path, spn_haar_cascade_t **out, spn_error_t *err);

/* Same from a buffer; `name` labels the input in error messages.
 * Ownership: buffer borrowed; caller owns *out. Thread: any. */
int32_t spn_haar_cascade_load_memory(const char *xml, size_t len, const char *name,
                                     spn_haar_cascade_t **out, spn_error_t *err);

/* NULL is allowed. Thread: any, once no detect call uses it. */
void spn_haar_cascade_free(spn_haar_cascade_t *c);

/* Window size the cascade was trained for (24x24 for the frontal faces). */
void spn_haar_cascade_window(const spn_haar_cascade_t *c, int32_t *w, int32_t *h);

typedef struct spn_haar_params {
  double scale_factor;   /* > 1; pyramid step (OpenCV scaleFactor) */
  int32_t min_neighbors; /* groupRectangles threshold; 0 returns raw candidates */
  int32_t min_w, min_h;  /* smallest object size (0 = the window size) */
  int32_t max_w, max_h;  /* largest object size (0 = the image size) */
  int32_t threads;       /* worker threads for this call (<= 1: calling thread only) */
} spn_haar_params_t;

#define SPN_HAAR_PARAMS_INIT {.scale_factor = 1.1, .min_neighbors = 3, .threads = 1}

/* Detect objects in an 8-bit grayscale image (row pitch `stride` bytes).
 * On success *rects is a malloc'd array of *n boxes in image pixels (NULL when
 * *n == 0), in the order OpenCV's grouping yields them.
 * Errors: SPN_EINVAL (bad sizes or params), SPN_ENOMEM.
 * Ownership: image and cascade borrowed; caller frees *rects with free().
 * Thread: any; concurrent calls on one cascade are safe. */
int32_t spn_haar_detect(const spn_haar_cascade_t *c, const uint8_t *gray, int32_t width,
                        int32_t height, int32_t stride, const spn_haar_params_t *params,
                        spn_rect_t **rects, int32_t *n, spn_error_t *err);

/* OpenCV's groupRectangles(rects, group_threshold, eps) in place: clusters
 * similar rectangles, averages each cluster, drops clusters with no more than
 * group_threshold members and small clusters inside bigger ones. *n is updated.
 * Returns SPN_OK or SPN_ENOMEM. Thread: any. */
int32_t spn_haar_group_rectangles(spn_rect_t *rects, int32_t *n, int32_t group_threshold,
                                  double eps);

/* Bit-exact equivalent of cv::resize(..., INTER_LINEAR_EXACT) for 8-bit
 * single-channel images (8-bit fixed-point weights, two passes). Exposed for
 * tests. Returns SPN_OK, SPN_EINVAL or SPN_ENOMEM. Thread: any. */
int32_t spn_resize_linear_u8(const uint8_t *src, int32_t sw, int32_t sh, int32_t sstride,
                             uint8_t *dst, int32_t dw, int32_t dh, int32_t dstride);

#ifdef __cplusplus
}
#endif
#endif
