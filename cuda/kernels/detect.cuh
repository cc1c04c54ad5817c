/* cuda/kernels/detect.cuh — the face detectors' candidate selection on the
 * GPU: the device twin of the first half of spn_facedet_decode
 * (stages/vision/facedet.c), for RetinaFace, SCRFD and YuNet.
 *
 * A detector's raw outputs are large (RetinaFace at 1280×720: 16 floats for
 * each of 37,840 anchors, 2.4 MB) and nearly all of it is below the score
 * threshold. The kernel reads them where the model wrote them, decodes only
 * the anchors above the threshold, and appends each as one row to a small
 * device list; the stage copies back the count and those rows (tens of rows
 * per face, 72 bytes each) and runs the sort and NMS on the host
 * (spn_facedet_select), as the CPU path does.
 *
 * The arithmetic is the CPU decoder's, operation by operation, with the
 * explicit-rounding intrinsics so nvcc cannot fuse a multiply and an add the
 * CPU does not; only expf differs (CUDA's is within 2 ulp of glibc's). Rows
 * come in no particular order: each carries its anchor's decode index, and
 * sorting by it gives the CPU decoder's candidate order.
 *
 * The list in device memory: SPN_CUDA_FACECAND_HEADER bytes whose first
 * int32 is the number of candidates found (it can exceed `cap`: only the
 * first `cap` found are written — grow the list and run again), then `cap`
 * rows of spn_cuda_facecand_t.
 * Ownership: all memory borrowed. Thread: any that has made the stream's
 * device current. */
#ifndef SPINDLE_CUDA_KERNELS_DETECT_CUH
#define SPINDLE_CUDA_KERNELS_DETECT_CUH

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Detector layouts (the values of spn_facedet_model_t). */
enum {
  SPN_CUDA_FACEDET_RETINAFACE = 1,
  SPN_CUDA_FACEDET_SCRFD = 2,
  SPN_CUDA_FACEDET_YUNET = 3,
};

#define SPN_CUDA_FACEDET_MAX_OUTPUTS 12
#define SPN_CUDA_FACECAND_HEADER 16

/* One candidate: spn_detface_t's fields in its order, then the image of the
 * batch and the anchor's index in that image's decode order. */
typedef struct spn_cuda_facecand {
  float x0, y0, x1, y1;
  float score;
  int32_t has_landmarks;
  float landmarks[10];
  int32_t image;
  int32_t anchor;
} spn_cuda_facecand_t;

/* qsort order of a list's rows that gives each image's candidates in the
 * CPU decoder's order (by image, then anchor): what spn_facedet_select needs
 * for ties in score to break as on the CPU. */
static inline int spn_cuda_facecand_order(const void *a, const void *b) {
  const spn_cuda_facecand_t *p = (const spn_cuda_facecand_t *)a, *q = (const spn_cuda_facecand_t *)b;
  if (p->image != q->image)
    return p->image < q->image ? -1 : 1;
  return (p->anchor > q->anchor) - (p->anchor < q->anchor);
}

/* The outputs and the geometry (spn_facedet_geom_t's fields). */
typedef struct spn_cuda_facedet {
  int32_t model;                                       /* SPN_CUDA_FACEDET_* */
  int32_t n_outputs;                                   /* 3; 6 or 9; 12 */
  int32_t batch;                                       /* images (0 counts as 1) */
  const float *outputs[SPN_CUDA_FACEDET_MAX_OUTPUTS];  /* device, in the model's output order, (batch, rows, cols) */
  int32_t in_w, in_h;                                  /* network input */
  int32_t pad_x, pad_y;
  float scale_x, scale_y;
  float score_threshold;
} spn_cuda_facedet_t;

/* Zero the list's count and append the candidates of the batch's images
 * (all of one geometry). Each output holds `batch` images back to back, each
 * of the size spn_facedet_layout gives for the geometry (the caller
 * allocated them so). Launches on `stream` and returns.
 * Errors: SPN_EINVAL (model, output count, sizes, cap < 0) before any launch;
 * SPN_ECUDA for a failed launch. */
int32_t spn_cuda_facedet_candidates(const spn_cuda_facedet_t *det, void *list, int32_t cap, cudaStream_t stream,
                                    spn_error_t *err);

/* The kernel's code run on the host, one anchor after another, on host
 * copies of the outputs and a host list: for tests of its decoding on a
 * machine without a GPU. Same arguments, checks and results (rows in
 * another order). Thread: any. */
int32_t spn_cuda_facedet_candidates_host(const spn_cuda_facedet_t *det, void *list, int32_t cap, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
