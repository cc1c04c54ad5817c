/* facedet.h — pre- and post-processing for model-backed face detectors.
 *
 * Three common ONNX face detectors are supported; the engine runs the network,
 * this module turns an image into its input tensor and its raw outputs into
 * face boxes with landmarks:
 *
 *  - RetinaFace (the widespread Pytorch_Retinaface export): outputs
 *    loc (1,N,4), conf (1,N,2) (softmaxed), landms (1,N,10) over priors from
 *    min_sizes {16,32},{64,128},{256,512} at steps 8/16/32 (not clipped);
 *    boxes decode with variances 0.1/0.2; input BGR minus (104,117,123).
 *  - SCRFD (InsightFace): per stride 8/16/32 a score (N,1), a bbox distance
 *    (N,4) and optionally a keypoint distance (N,10) output, 2 anchors per
 *    location, all scores first, then boxes, then keypoints; distances are in
 *    stride units. Input RGB, (x - 127.5) / 128, letterboxed top-left.
 *  - YuNet (OpenCV's face_detection_yunet 2023): per stride 8/16/32 cls (N,1),
 *    obj (N,1), bbox (N,4), kps (N,10), in that order of groups; score =
 *    sqrt(clamp(cls) * clamp(obj)). Input BGR 0..255, padded to a multiple of 32.
 *
 * Boxes come back in original-image pixels through the letterbox geometry
 * used for the input. They are not clipped to the image (the references do
 * not clip either).
 */
#ifndef SPN_VISION_FACEDET_H
#define SPN_VISION_FACEDET_H

#include <stdint.h>

#include "spindle/status.h"
#include "spindle/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spn_facedet_model {
  SPN_FACEDET_RETINAFACE = 1,
  SPN_FACEDET_SCRFD = 2,
  SPN_FACEDET_YUNET = 3,
} spn_facedet_model_t;

typedef struct spn_detface {
  float x0, y0, x1, y1; /* box corners, original image pixels */
  float score;
  int32_t has_landmarks;
  float landmarks[10];  /* (x, y) x 5: eyes, nose, mouth corners */
} spn_detface_t;

/* Where the image sits in the network input: x_in = x_img * scale_x + pad_x. */
typedef struct spn_facedet_geom {
  int32_t in_w, in_h;        /* network input size */
  int32_t img_w, img_h;      /* original image size */
  int32_t resized_w, resized_h; /* size of the resized image inside the input */
  int32_t pad_x, pad_y;      /* its top-left corner in the input */
  float scale_x, scale_y;    /* input pixels per image pixel */
} spn_facedet_geom_t;

typedef enum spn_facedet_fit {
  SPN_FACEDET_FIT_NONE = 0,     /* image used as is, padded right/bottom (RetinaFace, YuNet) */
  SPN_FACEDET_FIT_STRETCH = 1,  /* resized to the input, aspect not kept */
  SPN_FACEDET_FIT_TOPLEFT = 2,  /* aspect kept, padded right/bottom (SCRFD) */
} spn_facedet_fit_t;

typedef struct spn_facedet_params {
  float score_threshold;   /* keep candidates scoring >= this */
  float nms_threshold;     /* suppress a box overlapping a better one by IoU > this */
  int32_t pre_nms_top_k;   /* best-k candidates entering NMS (0 = all) */
  int32_t post_nms_top_k;  /* best-k faces kept after NMS (0 = all) */
} spn_facedet_params_t;

#define SPN_FACEDET_PARAMS_INIT {.score_threshold = 0.5f, .nms_threshold = 0.4f, .pre_nms_top_k = 5000, .post_nms_top_k = 750}

/* Compute the geometry for fitting an img_w x img_h image into an in_w x in_h
 * input. With FIT_NONE the image must fit (in >= img). SCRFD's rule for
 * FIT_TOPLEFT: the limiting side fills the input, the other is truncated to
 * an integer, and both axes share the scale of the height.
 * Returns SPN_OK or SPN_EINVAL. Thread: any. */
int32_t spn_facedet_fit(int32_t img_w, int32_t img_h, int32_t in_w, int32_t in_h, int32_t fit,
                        spn_facedet_geom_t *geom, spn_error_t *err);

/* Input size YuNet needs for an image: each side rounded up to a multiple of 32. */
void spn_facedet_yunet_input_size(int32_t img_w, int32_t img_h, int32_t *in_w, int32_t *in_h);

/* Fill `out` (1,3,in_h,in_w) float32 with the model's input: resize (bilinear,
 * half-pixel centres, edge clamp) into the geometry's rectangle, channel order
 * and normalisation of the model, padding with what a black pixel becomes.
 * `img` is 8-bit interleaved, 3 channels, `bgr` says its order.
 * Returns SPN_OK or SPN_EINVAL.
 * Ownership: all borrowed; out has in_w*in_h*3 floats. Thread: any. */
int32_t spn_facedet_preprocess(int32_t model, const uint8_t *img, int32_t stride, int32_t bgr,
                               const spn_facedet_geom_t *geom, float *out, spn_error_t *err);

/* The normalisation spn_facedet_preprocess applies for a model: output
 * channel c is (image channel (swap ? 2 - c : c) - mean[c]) * inv_std[c].
 * For a device twin. Returns SPN_OK or SPN_EINVAL (unknown model).
 * Thread: any. */
int32_t spn_facedet_norm(int32_t model, int32_t bgr, float mean[3], float inv_std[3], int32_t *swap);

/* Decode raw outputs into faces: threshold, pre-NMS top-k by score, greedy
 * NMS, post-NMS top-k, map to image pixels. `outputs` are in the model's
 * output order (see above): RetinaFace 3, SCRFD 6 or 9, YuNet 12 tensors,
 * float32 on the CPU, batch 1; shapes are checked against the geometry and an
 * error names the offending output. On success *faces is malloc'd (NULL when
 * *n == 0), best score first.
 * Ownership: tensors borrowed; caller frees *faces. Thread: any. */
int32_t spn_facedet_decode(int32_t model, const spn_tensor_t *outputs, int32_t noutputs,
                           const spn_facedet_geom_t *geom, const spn_facedet_params_t *params,
                           spn_detface_t **faces, int32_t *n, spn_error_t *err);

/* The most outputs a supported detector has (YuNet: 12). */
#define SPN_FACEDET_MAX_OUTPUTS 12

/* One raw output of a detector: (..., rows, cols) float32 values. */
typedef struct spn_facedet_output {
  int64_t rows, cols;
  const char *what; /* its name in the reference code: "loc", "scores", ... (static) */
} spn_facedet_output_t;

/* The outputs a detector must give for the geometry's input size, in the
 * model's output order: fills outs[0..noutputs). A wrong output count (or a
 * YuNet input not a multiple of 32) is an error naming what was expected.
 * For callers that provide the output buffers themselves (a device run).
 * Ownership: outs is the caller's, SPN_FACEDET_MAX_OUTPUTS entries.
 * Thread: any. */
int32_t spn_facedet_layout(int32_t model, int32_t noutputs, const spn_facedet_geom_t *geom,
                           spn_facedet_output_t *outs, spn_error_t *err);

/* The second half of spn_facedet_decode: the candidates (boxes above the
 * threshold, in decode order: by output level, then row, column and anchor,
 * as the decoders visit them; boxes in image pixels, except YuNet's, in
 * input pixels) sorted by score, pre-NMS top-k, NMS, post-NMS top-k, mapped
 * to image pixels. For candidates decoded elsewhere (on a GPU). On success
 * *faces is malloc'd (NULL when *n == 0), best score first.
 * Ownership: cands borrowed; caller frees *faces. Thread: any. */
int32_t spn_facedet_select(int32_t model, const spn_detface_t *cands, int32_t ncands, const spn_facedet_geom_t *geom,
                           const spn_facedet_params_t *params, spn_detface_t **faces, int32_t *n, spn_error_t *err);

typedef enum spn_nms_mode {
  SPN_NMS_PLAIN = 0,    /* float boxes, width = x1 - x0 */
  SPN_NMS_PLUS_ONE = 1, /* float boxes, width = x1 - x0 + 1 (RetinaFace, SCRFD reference code) */
  SPN_NMS_INT_RECT = 2, /* boxes truncated to integer (x, y, w, h) first (OpenCV NMSBoxes in YuNet) */
} spn_nms_mode_t;

/* Greedy NMS over boxes sorted by descending score: keeps a box unless its
 * IoU with an already kept box exceeds `threshold`. Writes kept indices to
 * keep[] (capacity n), returns their count. Thread: any. */
int32_t spn_facedet_nms(const spn_detface_t *sorted, int32_t n, float threshold, int32_t mode, int32_t *keep);

#ifdef __cplusplus
}
#endif
#endif
