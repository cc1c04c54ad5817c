/* stage-facedetect.c — the `facedetect` stage kind of the vision plugin
 * (libspindle-vision.so): the embedded Haar-cascade detector, or a
 * RetinaFace / SCRFD / YuNet ONNX model run by the host's engine.
 *
 * Input port "video": messages carrying a tensor item "frame", (H,W,3) u8
 * RGB in host memory. Haar path: the frame is converted to grey exactly as
 * OpenCV's RGB2GRAY does (so boxes match cv2 on the same frame) and run
 * through the cascade; faces come largest first with score 1. Model path:
 * the frame is fitted and normalised for the detector (facedet.h), run once
 * through the engine, and the outputs decoded (threshold, NMS), best score
 * first, with five landmarks. Either way the boxes are tied to tracks and
 * smoothed over the job's last `smooth_window` frames (track.h) — landmarks
 * are the frame's own — and the message is forwarded on output port "faces"
 * with a metadata item "faces" holding n spn_face_t (plugin.h) back to back.
 * Messages without a frame (EOS, SKIP) are forwarded untouched.
 *
 * State: the cascade is loaded once per instance in create(); each job has
 * its own smoother (job_open/job_close), so two jobs or two pipelines never
 * share tracks. A bad frame fails only its job (host->fail_job), naming the
 * job, the seq and what was wrong.
 *
 * On a CUDA device (a build with CUDA; the kind runs on either side) the
 * frame is kept in that GPU's memory: a host frame is uploaded once and
 * replaces the message's item, so the GPU stages after this one receive it
 * in device memory; the model path fits and normalises it with a kernel
 * (spn_cuda_fit_normalize, the twin of spn_facedet_preprocess) and runs the
 * model on the device with its outputs left there; a kernel picks the
 * candidates above the threshold (cuda/kernels/detect.cu) and only they come
 * back, for the sort and NMS on the host (spn_facedet_select), as on the CPU.
 * With gpu_decode = false the outputs come back whole and are decoded on the
 * host. The Haar path copies the frame to the host for the cascade.
 *
 * The plugin links no host symbols: it uses only the host API table and the
 * header-inline helpers of spindle/status.h and spindle/tensor.h.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifdef SPN_VISION_CUDA
#include "detect.cuh"
#include "image.cuh"
#include "spindle/image.h"
#include "spindle/plugin-cuda.h"
#else
#include "spindle/plugin.h"
#endif

#include "facedet.h"
#include "haar.h"
#include "plugin-vision.h"
#include "track.h"

typedef struct fd_config {
  char *cascade;
  double scale_factor;
  int64_t min_neighbors;
  int64_t min_size;
  int64_t max_size;
  int64_t smooth_window;
  int64_t max_missed;
  int64_t max_faces;
  char *model;
  bool model_optional;
  char *detector;
  int64_t input_width;
  int64_t input_height;
  double score_threshold;
  double nms_threshold;
  int64_t top_k;
  bool gpu_decode;
} fd_config_t;

/* Where Debian's opencv-data (and older layouts) put the default cascade;
 * tried in order when `cascade` is empty. */
static const char *const k_default_cascades[] = {
    "/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml",
    "/usr/share/opencv/haarcascades/haarcascade_frontalface_default.xml",
    "/usr/local/share/opencv4/haarcascades/haarcascade_frontalface_default.xml",
    NULL,
};

static const spn_config_field_t k_schema[] = {
    {.key = "cascade", .type = SPN_CONFIG_PATH, .offset = offsetof(fd_config_t, cascade),
     .doc = "OpenCV Haar cascade XML (empty: opencv-data's haarcascade_frontalface_default.xml)", .def_str = ""},
    {.key = "scale_factor", .type = SPN_CONFIG_FLOAT, .offset = offsetof(fd_config_t, scale_factor),
     .doc = "pyramid step between detection scales", .def_float = 1.1, .min = 1.01, .max = 4.0},
    {.key = "min_neighbors", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, min_neighbors),
     .doc = "overlapping raw detections a face needs (more: fewer false faces)", .def_int = 3, .min = 0, .max = 100},
    {.key = "min_size", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, min_size),
     .doc = "smallest face side in pixels (0: the cascade window)", .def_int = 0, .min = 0, .max = 65536},
    {.key = "max_size", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, max_size),
     .doc = "largest face side in pixels (0: no limit)", .def_int = 0, .min = 0, .max = 65536},
    {.key = "smooth_window", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, smooth_window),
     .doc = "frames each face box is averaged over (Wav2Lip: 5)", .def_int = 5, .min = 1, .max = 64},
    {.key = "max_missed", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, max_missed),
     .doc = "frames a face may go undetected and keep its track", .def_int = 2, .min = 0, .max = 1000},
    {.key = "max_faces", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, max_faces),
     .doc = "report at most this many faces per frame, largest first (0: all)", .def_int = 0, .min = 0,
     .max = 4096},
    {.key = "model", .type = SPN_CONFIG_PATH, .offset = offsetof(fd_config_t, model),
     .doc = "ONNX face detector run by the engine: a file, or a model name from `spindle model list` "
            "(empty: the Haar cascade)", .def_str = ""},
    {.key = "model_optional", .type = SPN_CONFIG_BOOL, .offset = offsetof(fd_config_t, model_optional),
     .doc = "a model name not fetched yet falls back to the Haar cascade (logged) instead of failing",
     .def_int = 0},
    {.key = "detector", .type = SPN_CONFIG_STRING, .offset = offsetof(fd_config_t, detector),
     .doc = "the model's layout: retinaface, scrfd or yunet", .def_str = "retinaface"},
    {.key = "input_width", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, input_width),
     .doc = "model input width (0: the frame's for retinaface/yunet, 640 for scrfd)", .def_int = 0, .min = 0,
     .max = 8192},
    {.key = "input_height", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, input_height),
     .doc = "model input height (0: as input_width)", .def_int = 0, .min = 0, .max = 8192},
    {.key = "score_threshold", .type = SPN_CONFIG_FLOAT, .offset = offsetof(fd_config_t, score_threshold),
     .doc = "minimum face score (models)", .def_float = 0.5, .min = 0.0, .max = 1.0},
    {.key = "nms_threshold", .type = SPN_CONFIG_FLOAT, .offset = offsetof(fd_config_t, nms_threshold),
     .doc = "IoU above which the weaker of two boxes is dropped (models)", .def_float = 0.4, .min = 0.0, .max = 1.0},
    {.key = "top_k", .type = SPN_CONFIG_INT, .offset = offsetof(fd_config_t, top_k),
     .doc = "best candidates entering NMS (models)", .def_int = 5000, .min = 1, .max = 1000000},
    {.key = "gpu_decode", .type = SPN_CONFIG_BOOL, .offset = offsetof(fd_config_t, gpu_decode),
     .doc = "on a GPU, pick the candidates above score_threshold there and copy back only those (false: copy "
            "the model's whole outputs back and decode on the host)",
     .def_int = 1},
    {.key = NULL},
};

static const spn_port_t k_inputs[] = {{.name = "video", .type = "video"}};
static const spn_port_t k_outputs[] = {{.name = "faces", .type = "faces"}};

#define FD_MAX_OUTPUTS 16

/* One message of a process() batch on its way through the stage. */
typedef struct fd_frame {
  int64_t idx;       /* the "frame" item; -1: the message has none */
  bool pending;      /* checked: waits for the detector */
  bool done;         /* detected: dets and n hold the frame's faces */
  const uint8_t *px; /* its pixels (device memory on a GPU instance's model path) */
  int32_t W, H;
  spn_detface_t *dets;
  int32_t n;
} fd_frame_t;

typedef struct fd_state {
  const spn_host_api_t *host;
  spn_stage_t *stage;
  spn_haar_cascade_t *cascade; /* Haar path */
  spn_model_t *model;          /* model path */
  int32_t detector;            /* spn_facedet_model_t */
  int32_t in_w, in_h;          /* configured input size, 0 = automatic */
  spn_facedet_params_t dparams;
  float *input;
  size_t input_cap;
  spn_detface_t *dets; /* Haar: detections of the current frame */
  bool batch_dyn;      /* the model takes a batch of frames (its first axis is dynamic) */
  fd_frame_t *frames;  /* process() scratch, one per message */
  fd_frame_t **group;  /* the frames of one engine run */
  size_t frames_cap;
  spn_haar_params_t params;
  spn_box_smoother_params_t smooth;
  int32_t max_faces;
  /* Per-frame scratch, reused across calls (one call at a time per instance). */
  uint8_t *gray;
  size_t gray_cap;
  spn_face_t *faces;
  spn_box_t *boxes;
  spn_tracked_box_t *tracked;
  int32_t faces_cap;
#ifdef SPN_VISION_CUDA
  spn_buffer_t *d_input; /* the model's input on a GPU instance */
  spn_buffer_t *h_frame; /* Haar on a GPU instance: the frame copied back (pinned) */
  spn_buffer_t *held;    /* Haar on a GPU instance: the host frame an upload replaced, until detected */
  bool gpu_decode;       /* model path: candidates picked on the GPU (detect.cuh) */
  spn_buffer_t *d_outs;  /* the model's outputs, in device memory */
  spn_buffer_t *d_cands; /* the candidate list (count, then rows) */
  spn_buffer_t *h_cands; /* its copy in pinned host memory */
  int32_t cand_cap;      /* rows d_cands and h_cands hold */
  int32_t cand_guess;    /* rows copied back with the count (the last frame's count, doubled) */
#endif
} fd_state_t;

typedef struct fd_job {
  uint64_t job_id;
  spn_box_smoother_t *smoother;
} fd_job_t;

/* Whether the model runs a batch of frames at once: one input (N,3,H,W)
 * and outputs (N,rows,cols), N dynamic in all of them (RetinaFace's usual
 * export). Otherwise frames go through it one by one. */
static bool model_takes_batch(const spn_host_api_t *h, const spn_model_t *m) {
  spn_tensor_t d = SPN_TENSOR_INIT;
  const char *name = NULL;
  int32_t nout = h->model_io_count(m, true);
  if (h->model_io_count(m, false) != 1 || h->model_io(m, false, 0, &name, &d) != SPN_OK || d.ndim != 4 ||
      d.shape[0] >= 0 || nout < 1 || nout > FD_MAX_OUTPUTS)
    return false;
  for (int32_t i = 0; i < nout; i++) {
    d = (spn_tensor_t)SPN_TENSOR_INIT;
    if (h->model_io(m, true, i, &name, &d) != SPN_OK || d.ndim != 3 || d.shape[0] >= 0)
      return false;
  }
  return true;
}

static int32_t fd_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const fd_config_t *cfg = config;
  const spn_host_api_t *host = spn_stage_host(stage);
  if (!host || !cfg)
    return spn_error_set(err, SPN_ESTATE, "facedetect: plugin not initialised");
  int32_t hc = vision_check_host(host, false, err);
  if (hc != SPN_OK)
    return hc;
  fd_state_t *st = calloc(1, sizeof *st);
  if (!st)
    return spn_error_set(err, SPN_ENOMEM, "facedetect: out of memory");
  st->host = host;
  st->stage = stage;
  int32_t rc = SPN_OK;
  char mpath[4096], hint[1024] = "";
  int32_t use_model = 0;
  if (cfg->model && cfg->model[0])
    use_model = vision_model_path(host, stage, "facedetect", cfg->model, cfg->model_optional,
                                       "the Haar cascade", mpath, sizeof mpath, hint, sizeof hint);
  if (use_model) {
    const char *d = cfg->detector ? cfg->detector : "";
    st->detector = !strcmp(d, "retinaface") ? SPN_FACEDET_RETINAFACE
                   : !strcmp(d, "scrfd")    ? SPN_FACEDET_SCRFD
                   : !strcmp(d, "yunet")    ? SPN_FACEDET_YUNET
                                            : 0;
    if (!st->detector)
      rc = spn_error_set(err, SPN_ECONFIG, "detector \"%s\" is not one of retinaface, scrfd, yunet", d);
    else if (!host->model_load || !host->model_run || !host->model_io_count)
      rc = spn_error_set(err, SPN_EUNSUPPORTED, "the host has no model engine");
    else
      rc = host->model_load(stage, mpath, &st->model, err);
    if (rc != SPN_OK && hint[0])
      spn_error_prefix(err, "%s", hint);
    st->in_w = (int32_t)cfg->input_width;
    st->in_h = (int32_t)(cfg->input_height ? cfg->input_height : cfg->input_width);
    if (rc == SPN_OK && st->detector == SPN_FACEDET_YUNET && (st->in_w % 32 || st->in_h % 32))
      rc = spn_error_set(err, SPN_ECONFIG, "yunet input %dx%d must be a multiple of 32", st->in_w, st->in_h);
    st->dparams = (spn_facedet_params_t)SPN_FACEDET_PARAMS_INIT;
    st->dparams.score_threshold = (float)cfg->score_threshold;
    st->dparams.nms_threshold = (float)cfg->nms_threshold;
    st->dparams.pre_nms_top_k = (int32_t)cfg->top_k;
    st->dparams.post_nms_top_k = 0;
    if (rc == SPN_OK)
      st->batch_dyn = model_takes_batch(host, st->model);
  } else if (cfg->cascade && cfg->cascade[0]) {
    rc = spn_haar_cascade_load(cfg->cascade, &st->cascade, err);
  } else {
    rc = SPN_ENOENT;
    for (const char *const *p = k_default_cascades; *p && rc == SPN_ENOENT; p++)
      rc = spn_haar_cascade_load(*p, &st->cascade, err);
    if (rc == SPN_ENOENT)
      spn_error_set(err, SPN_ENOENT,
                    "no Haar cascade found (install opencv-data or set `cascade` to a cascade XML file)");
  }
  if (rc != SPN_OK) {
    spn_error_prefix(err, "facedetect %s", host->stage_get_name ? host->stage_get_name(stage) : "");
    if (st->model && host->model_release)
      host->model_release(stage, &st->model);
    free(st);
    return rc;
  }
  st->params = (spn_haar_params_t)SPN_HAAR_PARAMS_INIT;
  st->params.scale_factor = cfg->scale_factor;
  st->params.min_neighbors = (int32_t)cfg->min_neighbors;
  st->params.min_w = st->params.min_h = (int32_t)cfg->min_size;
  st->params.max_w = st->params.max_h = (int32_t)cfg->max_size;
  st->params.threads = host->stage_get_threads ? host->stage_get_threads(stage) : 1;
  st->smooth = (spn_box_smoother_params_t)SPN_BOX_SMOOTHER_PARAMS_INIT;
  st->smooth.window = (int32_t)cfg->smooth_window;
  st->smooth.max_missed = (int32_t)cfg->max_missed;
  st->max_faces = (int32_t)cfg->max_faces;
#ifdef SPN_VISION_CUDA
  st->gpu_decode = cfg->gpu_decode;
#endif
  *state = st;
  return SPN_OK;
}

static void fd_destroy(spn_stage_t *stage, void *state) {
  fd_state_t *st = state;
  if (!st)
    return;
  spn_haar_cascade_free(st->cascade);
  if (st->model && st->host->model_release)
    st->host->model_release(stage, &st->model);
  free(st->input);
  free(st->dets);
  free(st->frames);
  free(st->group);
  free(st->gray);
  free(st->faces);
  free(st->boxes);
  free(st->tracked);
#ifdef SPN_VISION_CUDA
  if (st->d_input || st->d_outs || st->d_cands) /* queued work on them ends before they go back to the pool */
    cudaStreamSynchronize((cudaStream_t)st->host->stage_get_stream(stage));
  st->host->buffer_unref(&st->d_input);
  st->host->buffer_unref(&st->d_outs);
  st->host->buffer_unref(&st->d_cands);
  st->host->buffer_unref(&st->h_cands);
  st->host->buffer_unref(&st->h_frame);
  st->host->buffer_unref(&st->held);
#endif
  free(st);
}

static int32_t fd_job_open(spn_stage_t *stage, void *state, const spn_job_info_t *job, void **job_state,
                           spn_error_t *err) {
  (void)stage;
  fd_state_t *st = state;
  fd_job_t *j = calloc(1, sizeof *j);
  if (!j)
    return spn_error_set(err, SPN_ENOMEM, "facedetect: out of memory");
  j->job_id = job ? job->job_id : 0;
  int32_t rc = spn_box_smoother_new(&st->smooth, &j->smoother, err);
  if (rc != SPN_OK) {
    free(j);
    return rc;
  }
  *job_state = j;
  return SPN_OK;
}

static void fd_job_close(spn_stage_t *stage, void *state, void *job_state, bool ok) {
  (void)stage;
  (void)state;
  (void)ok;
  fd_job_t *j = job_state;
  if (!j)
    return;
  spn_box_smoother_free(j->smoother);
  free(j);
}

static int grow_faces(fd_state_t *st, int32_t n) {
  if (n <= st->faces_cap)
    return 0;
  int32_t cap = st->faces_cap ? st->faces_cap : 16;
  while (cap < n)
    cap *= 2;
  spn_face_t *f = realloc(st->faces, (size_t)cap * sizeof *f);
  if (f)
    st->faces = f;
  spn_box_t *b = realloc(st->boxes, (size_t)cap * sizeof *b);
  if (b)
    st->boxes = b;
  spn_tracked_box_t *t = realloc(st->tracked, (size_t)cap * sizeof *t);
  if (t)
    st->tracked = t;
  if (!f || !b || !t)
    return -1;
  st->faces_cap = cap;
  return 0;
}

static int area_desc(const void *a, const void *b) {
  const spn_rect_t *p = a, *q = b;
  int64_t ap = (int64_t)p->w * p->h, aq = (int64_t)q->w * q->h;
  if (ap != aq)
    return ap < aq ? 1 : -1;
  if (p->y != q->y)
    return p->y < q->y ? -1 : 1;
  return (p->x > q->x) - (p->x < q->x);
}

/* Haar path: grey conversion, cascade, largest face first. Fills st->dets
 * (score 1: a cascade accepts or rejects, it has no score). */
static int32_t detect_haar(fd_state_t *st, const uint8_t *rgb, int32_t W, int32_t H, int32_t *n_out,
                           spn_error_t *err) {
  size_t need = (size_t)W * H;
  if (need > st->gray_cap) {
    uint8_t *g = realloc(st->gray, need);
    if (!g)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    st->gray = g;
    st->gray_cap = need;
  }
  /* cv::cvtColor RGB2GRAY of OpenCV 4.x, bit for bit: BT.601 weights in
   * 15-bit fixed point (checked against cv2 by test-facedetect-stage.py). */
  for (size_t i = 0; i < need; i++)
    st->gray[i] =
        (uint8_t)((rgb[3 * i] * 9798u + rgb[3 * i + 1] * 19235u + rgb[3 * i + 2] * 3735u + 16384u) >> 15);
  spn_rect_t *rects = NULL;
  int32_t n = 0;
  int32_t rc = spn_haar_detect(st->cascade, st->gray, W, H, W, &st->params, &rects, &n, err);
  if (rc != SPN_OK)
    return rc;
  if (n > 1)
    qsort(rects, (size_t)n, sizeof *rects, area_desc);
  if (st->max_faces > 0 && n > st->max_faces)
    n = st->max_faces;
  free(st->dets);
  st->dets = calloc((size_t)(n > 0 ? n : 1), sizeof *st->dets);
  if (!st->dets) {
    free(rects);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  for (int32_t i = 0; i < n; i++)
    st->dets[i] = (spn_detface_t){.x0 = (float)rects[i].x, .y0 = (float)rects[i].y,
                                  .x1 = (float)(rects[i].x + rects[i].w), .y1 = (float)(rects[i].y + rects[i].h),
                                  .score = 1.0f};
  free(rects);
  *n_out = n;
  return SPN_OK;
}

/* Model path: fit and preprocess for the detector, one engine run, decode.
 * Fills st->dets, best score first. */
#ifdef SPN_VISION_CUDA
static int32_t cu_ok(cudaError_t ce, const char *what, spn_error_t *err) {
  return spn_cuda_status(ce, NULL, what, err);
}

/* The model's input on the GPU: `rgb` is the frame in device memory; the
 * fitted, normalised input goes to image `slot` of d_input (kept across
 * calls; the caller grew it to the batch first). */
static int32_t preprocess_gpu(fd_state_t *st, const uint8_t *rgb, int32_t W, int32_t H, const spn_facedet_geom_t *g,
                              int32_t slot, spn_tensor_t *in, spn_error_t *err) {
  const spn_host_api_t *h = st->host;
  cudaStream_t stream = (cudaStream_t)h->stage_get_stream(st->stage);
  int32_t rc, kind = 0, index = 0;
  size_t plane3 = (size_t)3 * g->in_w * g->in_h;
  float *dst = (float *)h->buffer_data(st->d_input) + plane3 * (size_t)slot;
  float mean[3], inv_std[3];
  int32_t swap = 0;
  spn_image_t img;
  if (spn_facedet_norm(st->detector, 0, mean, inv_std, &swap) != SPN_OK)
    return spn_error_set(err, SPN_EINVAL, "unknown detector %d", st->detector);
  if ((rc = spn_image_wrap(&img, (void *)rgb, W, H, SPN_PIXFMT_RGB24, err)) != SPN_OK ||
      (rc = spn_cuda_fit_normalize(&img, dst, g->in_w, g->in_h, g->pad_x, g->pad_y, g->resized_w, g->resized_h,
                                   mean, inv_std, swap, stream, err)) != SPN_OK)
    return rc;
  h->stage_get_device(st->stage, &kind, &index);
  in->data = h->buffer_data(st->d_input);
  in->device_kind = SPN_DEVICE_CUDA;
  in->device_index = index;
  return SPN_OK;
}

_Static_assert((int)SPN_CUDA_FACEDET_RETINAFACE == (int)SPN_FACEDET_RETINAFACE &&
                   (int)SPN_CUDA_FACEDET_SCRFD == (int)SPN_FACEDET_SCRFD &&
                   (int)SPN_CUDA_FACEDET_YUNET == (int)SPN_FACEDET_YUNET,
               "detect.cuh's detector numbers are facedet.h's");
_Static_assert(offsetof(spn_cuda_facecand_t, score) == offsetof(spn_detface_t, score) &&
                   offsetof(spn_cuda_facecand_t, landmarks) == offsetof(spn_detface_t, landmarks),
               "a candidate row starts as a spn_detface_t");

/* Grow the candidate list (device) and its pinned copy to `rows` rows. */
static int32_t cands_grow(fd_state_t *st, int32_t rows, spn_error_t *err) {
  if (rows <= st->cand_cap)
    return SPN_OK;
  int32_t cap = st->cand_cap ? st->cand_cap : 1024, rc;
  while (cap < rows)
    cap *= 2;
  size_t bytes = SPN_CUDA_FACECAND_HEADER + (size_t)cap * sizeof(spn_cuda_facecand_t);
  st->cand_cap = 0;
  if ((rc = spn_cuda_scratch(st->stage, &st->d_cands, bytes, 0, err)) != SPN_OK)
    return rc;
  st->host->buffer_unref(&st->h_cands); /* every copy into it was waited for */
  if ((rc = st->host->buffer_new_kind(st->stage, bytes, SPN_MEM_PINNED, &st->h_cands, err)) != SPN_OK)
    return rc;
  st->cand_cap = cap;
  return SPN_OK;
}

/* Bytes [off, off+n) of the device list into its pinned copy, waited for;
 * counted for the stage and the job where the host counts copies. */
static int32_t cands_back(fd_state_t *st, uint64_t job_id, size_t off, size_t n, spn_error_t *err) {
  const spn_host_api_t *h = st->host;
  cudaStream_t stream = (cudaStream_t)h->stage_get_stream(st->stage);
  int32_t rc = SPN_HOST_HAS(h, buffer_copy)
                   ? h->buffer_copy(st->stage, job_id, st->h_cands, off, st->d_cands, off, n, err)
                   : cu_ok(cudaMemcpyAsync((uint8_t *)h->buffer_data(st->h_cands) + off,
                                           (const uint8_t *)h->buffer_data(st->d_cands) + off, n,
                                           cudaMemcpyDeviceToHost, stream),
                           "copying the face candidates back", err);
  return rc != SPN_OK ? rc : cu_ok(cudaStreamSynchronize(stream), "copying the face candidates back", err);
}

/* The model path's run and decode with the outputs left on the GPU, for a
 * batch of `k` images (the input holds `batch` >= k, the rest padding): the
 * candidates above the threshold are picked there (detect.cuh) and only
 * they come back — the count and the number of rows the last batch had,
 * doubled, in one copy; the rest, if any, in a second — then sort and NMS
 * run on the host per image (spn_facedet_select), as on the CPU. *host_path
 * is set (and nothing run) when the model's declared outputs are not the
 * layout's; the caller then takes the host path, whose decode names the
 * output. `job_id`: the job the copies are counted for (0: the stage only). */
static int32_t detect_gpu_decode(fd_state_t *st, uint64_t job_id, const spn_facedet_geom_t *g,
                                 const spn_tensor_t *in, int32_t nout, int32_t k, spn_detface_t **dets, int32_t *ns,
                                 bool *host_path, spn_error_t *err) {
  const spn_host_api_t *h = st->host;
  cudaStream_t stream = (cudaStream_t)h->stage_get_stream(st->stage);
  spn_facedet_output_t lay[SPN_FACEDET_MAX_OUTPUTS];
  spn_tensor_t outs[FD_MAX_OUTPUTS];
  int32_t rc, kind = 0, index = 0;
  int64_t batch = in->shape[0];
  *host_path = true;
  if (nout > SPN_FACEDET_MAX_OUTPUTS || spn_facedet_layout(st->detector, nout, g, lay, NULL) != SPN_OK)
    return SPN_OK;
  size_t total = 0;
  for (int32_t i = 0; i < nout; i++)
    total += (size_t)lay[i].rows * (size_t)lay[i].cols;
  if ((rc = spn_cuda_scratch(st->stage, &st->d_outs, total * (size_t)batch * sizeof(float), 0, err)) != SPN_OK)
    return rc;
  h->stage_get_device(st->stage, &kind, &index);
  float *base = h->buffer_data(st->d_outs);
  spn_cuda_facedet_t d = {.model = st->detector, .n_outputs = nout, .batch = k};
  size_t off = 0;
  for (int32_t i = 0; i < nout; i++) {
    spn_tensor_t desc = SPN_TENSOR_INIT;
    const char *name = NULL;
    if (h->model_io(st->model, true, i, &name, &desc) != SPN_OK || desc.dtype != SPN_DTYPE_F32 || desc.ndim < 2 ||
        desc.ndim > 3 || (batch > 1 && desc.ndim != 3))
      return SPN_OK;
    outs[i] = (spn_tensor_t)SPN_TENSOR_INIT;
    outs[i].dtype = SPN_DTYPE_F32;
    outs[i].ndim = desc.ndim;
    int32_t a = 0;
    if (desc.ndim == 3)
      outs[i].shape[a++] = batch;
    outs[i].shape[a++] = lay[i].rows;
    outs[i].shape[a] = lay[i].cols;
    outs[i].data = base + off;
    outs[i].device_kind = SPN_DEVICE_CUDA;
    outs[i].device_index = index;
    d.outputs[i] = base + off;
    off += (size_t)lay[i].rows * (size_t)lay[i].cols * (size_t)batch;
  }
  rc = h->model_run(st->stage, st->model, in, 1, outs, (size_t)nout, err);
  if (rc == SPN_EINVAL) /* the outputs are not the layout's shapes: the host path says which */
    return SPN_OK;
  if (rc != SPN_OK)
    return rc;
  *host_path = false;
  d.in_w = g->in_w;
  d.in_h = g->in_h;
  d.pad_x = g->pad_x;
  d.pad_y = g->pad_y;
  d.scale_x = g->scale_x;
  d.scale_y = g->scale_y;
  d.score_threshold = st->dparams.score_threshold;
  if (st->cand_guess < 64)
    st->cand_guess = 64;
  if ((rc = cands_grow(st, st->cand_guess, err)) != SPN_OK)
    return rc;
  const size_t row = sizeof(spn_cuda_facecand_t);
  int32_t found = 0;
  for (int pass = 0;; pass++) {
    if ((rc = spn_cuda_facedet_candidates(&d, h->buffer_data(st->d_cands), st->cand_cap, stream, err)) != SPN_OK)
      return rc;
    int32_t guess = st->cand_guess < st->cand_cap ? st->cand_guess : st->cand_cap;
    if ((rc = cands_back(st, job_id, 0, SPN_CUDA_FACECAND_HEADER + (size_t)guess * row, err)) != SPN_OK)
      return rc;
    memcpy(&found, h->buffer_data(st->h_cands), sizeof found);
    if (found >= 0 && found <= st->cand_cap) {
      if (found > guess && (rc = cands_back(st, job_id, SPN_CUDA_FACECAND_HEADER + (size_t)guess * row,
                                            (size_t)(found - guess) * row, err)) != SPN_OK)
        return rc;
      break;
    }
    if (found < 0 || pass) /* the outputs did not change between the two passes */
      return spn_error_set(err, SPN_ECUDA, "the GPU's candidate count is inconsistent (%d)", found);
    if ((rc = cands_grow(st, found, err)) != SPN_OK) /* more than the list holds: grow it, pick again */
      return rc;
  }
  st->cand_guess = found > st->cand_cap / 2 ? st->cand_cap : (found * 2 > 64 ? found * 2 : 64);
  spn_cuda_facecand_t *rows = (spn_cuda_facecand_t *)((uint8_t *)h->buffer_data(st->h_cands) + SPN_CUDA_FACECAND_HEADER);
  if (found > 1) /* per image, the CPU decoder's order: ties in score keep it */
    qsort(rows, (size_t)found, row, spn_cuda_facecand_order);
  spn_detface_t *c = malloc((size_t)(found > 0 ? found : 1) * sizeof *c);
  if (!c)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  for (int32_t i = 0; i < found; i++)
    memcpy(&c[i], &rows[i], sizeof c[i]);
  int32_t first = 0;
  for (int32_t im = 0; im < k && rc == SPN_OK; im++) {
    int32_t end = first;
    while (end < found && rows[end].image == im)
      end++;
    if (first < found && rows[first].image < im) { /* an image index outside the batch */
      rc = spn_error_set(err, SPN_ECUDA, "the GPU's candidate list is inconsistent");
      break;
    }
    rc = spn_facedet_select(st->detector, c + first, end - first, g, &st->dparams, &dets[im], &ns[im], err);
    first = end;
  }
  if (rc == SPN_OK && first != found)
    rc = spn_error_set(err, SPN_ECUDA, "the GPU's candidate list is inconsistent");
  free(c);
  return rc;
}
#endif

/* Fit, preprocess, one engine run and decode for k frames of one size (the
 * model path): sets each frame's dets and n. On a GPU the batch is padded to
 * a power of two, so the engine meets a few input shapes (each new one costs
 * a cuDNN algorithm search and a CUDA Graph capture). `job_id`: the job a
 * GPU copy is counted for (0: the stage only). On failure no frame keeps
 * detections. */
static int32_t detect_model(fd_state_t *st, fd_frame_t **fr, int32_t k, bool on_gpu, uint64_t job_id,
                            spn_error_t *err) {
  const spn_host_api_t *h = st->host;
  int32_t W = fr[0]->W, H = fr[0]->H;
  int32_t in_w = st->in_w, in_h = st->in_h, fit = SPN_FACEDET_FIT_STRETCH;
  if (st->detector == SPN_FACEDET_SCRFD) {
    fit = SPN_FACEDET_FIT_TOPLEFT;
    if (!in_w)
      in_w = in_h = 640;
  } else if (!in_w) {
    fit = SPN_FACEDET_FIT_NONE;
    if (st->detector == SPN_FACEDET_YUNET)
      spn_facedet_yunet_input_size(W, H, &in_w, &in_h);
    else {
      in_w = W;
      in_h = H;
    }
  }
  spn_facedet_geom_t g;
  int32_t rc = spn_facedet_fit(W, H, in_w, in_h, fit, &g, err);
  if (rc != SPN_OK)
    return rc;
  int32_t nout = h->model_io_count(st->model, true);
  if (nout < 1 || nout > FD_MAX_OUTPUTS)
    return spn_error_set(err, SPN_EMODEL, "face model has %d outputs", nout);
  int32_t batch = k;
  if (on_gpu)
    for (batch = 1; batch < k; batch *= 2)
      ;
  spn_tensor_t in = SPN_TENSOR_INIT, outs[FD_MAX_OUTPUTS];
  in.dtype = SPN_DTYPE_F32;
  in.ndim = 4;
  in.shape[0] = batch;
  in.shape[1] = 3;
  in.shape[2] = in_h;
  in.shape[3] = in_w;
  size_t plane3 = (size_t)3 * in_w * in_h;
  if (on_gpu) {
#ifdef SPN_VISION_CUDA
    if ((rc = spn_cuda_scratch(st->stage, &st->d_input, plane3 * (size_t)batch * sizeof(float), 0, err)) != SPN_OK)
      return rc;
    for (int32_t i = 0; i < k; i++)
      if ((rc = preprocess_gpu(st, fr[i]->px, W, H, &g, i, &in, err)) != SPN_OK)
        return rc;
#endif
  } else {
    size_t need = plane3 * (size_t)batch;
    if (need > st->input_cap) {
      float *p = realloc(st->input, need * sizeof *p);
      if (!p)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      st->input = p;
      st->input_cap = need;
    }
    for (int32_t i = 0; i < k; i++)
      if ((rc = spn_facedet_preprocess(st->detector, fr[i]->px, W * 3, 0, &g, st->input + plane3 * (size_t)i, err)) !=
          SPN_OK)
        return rc;
    in.data = st->input;
  }
  if (h->log)
    h->log(st->stage, job_id, SPN_LOG_DEBUG, "facedetect: %d frames of %dx%d in one run (batch %d)", k, W, H, batch);
  spn_detface_t **dets = calloc((size_t)k, sizeof *dets);
  int32_t *ns = calloc((size_t)k, sizeof *ns);
  if (!dets || !ns) {
    free(dets);
    free(ns);
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  }
  bool host_path = true;
#ifdef SPN_VISION_CUDA
  if (on_gpu && st->gpu_decode)
    rc = detect_gpu_decode(st, job_id, &g, &in, nout, k, dets, ns, &host_path, err);
#else
  (void)job_id;
#endif
  if (rc == SPN_OK && host_path) {
    for (int32_t i = 0; i < nout; i++)
      outs[i] = (spn_tensor_t)SPN_TENSOR_INIT; /* data NULL: the engine allocates */
    if ((rc = h->model_run(st->stage, st->model, &in, 1, outs, (size_t)nout, err)) == SPN_OK) {
      for (int32_t i = 0; i < k && rc == SPN_OK; i++) {
        spn_tensor_t views[FD_MAX_OUTPUTS];
        for (int32_t o = 0; o < nout && rc == SPN_OK; o++) {
          views[o] = outs[o];
          if (batch == 1)
            continue; /* as the model gave it: the decoder checks its shape */
          if (outs[o].ndim < 2 || outs[o].shape[0] != batch)
            rc = spn_error_set(err, SPN_EMODEL, "face model output %d does not have the batch of %d frames on its "
                               "first axis", o, batch);
          else {
            size_t per = (size_t)(spn_tensor_numel(&outs[o]) / batch);
            views[o].shape[0] = 1;
            views[o].data = (uint8_t *)outs[o].data + per * spn_dtype_size(outs[o].dtype) * (size_t)i;
          }
        }
        if (rc == SPN_OK)
          rc = spn_facedet_decode(st->detector, views, nout, &g, &st->dparams, &dets[i], &ns[i], err);
      }
      if (h->model_free_outputs)
        h->model_free_outputs(st->model, outs, (size_t)nout);
    }
  }
  for (int32_t i = 0; i < k; i++) {
    if (rc != SPN_OK) {
      free(dets[i]);
      continue;
    }
    fr[i]->dets = dets[i];
    fr[i]->n = st->max_faces > 0 && ns[i] > st->max_faces ? st->max_faces : ns[i];
    fr[i]->done = true;
  }
  free(dets);
  free(ns);
  return rc;
}

#ifdef SPN_VISION_CUDA
/* A GPU instance's frame: one in host memory is uploaded and replaces the
 * message's item (later GPU stages take it as it is); *px becomes the
 * device copy for the model path, or a host copy for the Haar path. */
static int32_t frame_on_gpu(fd_state_t *st, spn_msg_t *msg, int64_t idx, const spn_item_t *item, const uint8_t **px,
                            spn_error_t *err) {
  const spn_host_api_t *h = st->host;
  cudaStream_t stream = (cudaStream_t)h->stage_get_stream(st->stage);
  uint64_t job_id = h->msg_envelope(msg)->job_id;
  size_t n = spn_tensor_nbytes(&item->tensor);
  bool counted = SPN_HOST_HAS(h, buffer_copy) && item->buffer; /* the host counts the copy for stage and job */
  size_t src_off = counted ? (size_t)(*px - (const uint8_t *)h->buffer_data(item->buffer)) : 0;
  int32_t rc;
  h->buffer_unref(&st->held); /* (a frame that failed before detection) */
  if (item->tensor.device_kind != SPN_DEVICE_CUDA) {
    spn_buffer_t *buf = NULL;
    spn_tensor_t t = item->tensor;
    int32_t kind = 0, index = 0;
    if ((rc = h->buffer_new_kind(st->stage, n, SPN_MEM_DEVICE, &buf, err)) != SPN_OK)
      return rc;
    h->stage_get_device(st->stage, &kind, &index);
    t.data = h->buffer_data(buf);
    t.device_kind = SPN_DEVICE_CUDA;
    t.device_index = index;
    rc = counted ? h->buffer_copy(st->stage, job_id, buf, 0, item->buffer, src_off, n, err)
                 : cu_ok(cudaMemcpyAsync(t.data, *px, n, cudaMemcpyHostToDevice, stream), "uploading the frame", err);
    /* The host frame goes with the replaced item: the upload must have read
     * it first (the model waits for the stream soon after anyway). */
    if (rc == SPN_OK)
      rc = cu_ok(cudaStreamSynchronize(stream), "uploading the frame", err);
    if (rc == SPN_OK && !st->model && item->buffer) /* the cascade reads the host frame: keep it until then */
      st->held = h->buffer_ref(item->buffer);
    else if (rc == SPN_OK && !st->model)
      rc = spn_error_set(err, SPN_EINVAL, "the frame has no buffer");
    if (rc == SPN_OK && (rc = h->buffer_set_ready(st->stage, buf, err)) == SPN_OK)
      rc = h->msg_replace_tensor(msg, (size_t)idx, &t, buf, err);
    h->buffer_unref(&buf); /* the message holds its own reference */
    if (rc != SPN_OK)
      return rc;
    if (st->model)
      *px = t.data;
    return SPN_OK;
  }
  if (st->model)
    return SPN_OK;
  /* The cascade runs on the host: one copy of the device frame back. */
  if (st->h_frame && h->buffer_size(st->h_frame) < n)
    h->buffer_unref(&st->h_frame); /* the last copy into it was waited for */
  if (!st->h_frame && (rc = h->buffer_new_kind(st->stage, n, SPN_MEM_PINNED, &st->h_frame, err)) != SPN_OK)
    return rc;
  rc = counted ? h->buffer_copy(st->stage, job_id, st->h_frame, 0, item->buffer, src_off, n, err)
               : cu_ok(cudaMemcpyAsync(h->buffer_data(st->h_frame), *px, n, cudaMemcpyDeviceToHost, stream),
                       "copying the frame back", err);
  if (rc == SPN_OK)
    rc = cu_ok(cudaStreamSynchronize(stream), "copying the frame back", err);
  *px = h->buffer_data(st->h_frame);
  return rc;
}
#endif

/* Check one frame message's item and, on a GPU instance, bring the frame
 * there (frame_on_gpu). Fills fr's pixels and size. Returns SPN_OK, or an
 * error whose message says what was wrong with this job's frame. */
static int32_t frame_take(fd_state_t *st, spn_msg_t *msg, fd_frame_t *fr, bool on_gpu, unsigned long long seq,
                          spn_error_t *err) {
  const spn_host_api_t *h = st->host;
  spn_item_t item = {.struct_size = sizeof item};
  int32_t rc = h->msg_item(msg, (size_t)fr->idx, &item);
  if (rc != SPN_OK)
    return spn_error_set(err, rc, "facedetect: frame %llu: cannot read item \"frame\"", seq);
  const spn_tensor_t *t = &item.tensor;
  if (item.kind != SPN_ITEM_TENSOR || t->dtype != SPN_DTYPE_U8 || t->ndim != 3 || t->shape[2] != 3 ||
      (t->device_kind != SPN_DEVICE_CPU && !on_gpu) || !t->data || t->shape[0] < 1 || t->shape[1] < 1 ||
      t->shape[0] > 65536 || t->shape[1] > 65536)
    return spn_error_set(err, SPN_ETYPE, "facedetect: frame %llu: item \"frame\" must be a (H,W,3) u8 RGB tensor in %s",
                         seq, on_gpu ? "host or device memory" : "host memory");
  fr->H = (int32_t)t->shape[0];
  fr->W = (int32_t)t->shape[1];
  fr->px = t->data;
#ifdef SPN_VISION_CUDA
  if (on_gpu && (rc = frame_on_gpu(st, msg, fr->idx, &item, &fr->px, err)) != SPN_OK)
    return spn_error_prefix(err, "facedetect: frame %llu", seq);
#endif
  return SPN_OK;
}

/* Tie the frame's detections to tracks, smooth them and attach the "faces"
 * item. */
static int32_t frame_finish(fd_state_t *st, fd_job_t *job, spn_msg_t *msg, const fd_frame_t *fr, spn_error_t *err) {
  int32_t n = fr->n;
  if (grow_faces(st, n > 0 ? n : 1))
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  for (int32_t i = 0; i < n; i++)
    st->boxes[i] = (spn_box_t){fr->dets[i].x0, fr->dets[i].y0, fr->dets[i].x1, fr->dets[i].y1};
  int32_t rc = spn_box_smoother_update(job->smoother, st->boxes, n, st->tracked, err);
  if (rc != SPN_OK)
    return rc;
  for (int32_t i = 0; i < n; i++) {
    spn_face_t *f = &st->faces[i];
    memset(f, 0, sizeof *f);
    f->x0 = st->tracked[i].box.x0;
    f->y0 = st->tracked[i].box.y0;
    f->x1 = st->tracked[i].box.x1;
    f->y1 = st->tracked[i].box.y1;
    f->score = fr->dets[i].score;
    if (fr->dets[i].has_landmarks) /* this frame's, not smoothed */
      memcpy(f->landmarks, fr->dets[i].landmarks, sizeof f->landmarks);
    f->track_id = (int32_t)st->tracked[i].track_id;
  }
  return st->host->msg_add_meta(msg, "faces", st->faces, (size_t)n * sizeof(spn_face_t), err);
}

static unsigned long long msg_seq(const spn_host_api_t *h, const spn_msg_t *m) {
  const spn_envelope_t *env = h->msg_envelope(m);
  return env ? (unsigned long long)env->seq : 0ull;
}

static uint64_t msg_job(const spn_host_api_t *h, const spn_msg_t *m) {
  const spn_envelope_t *env = h->msg_envelope(m);
  return env ? env->job_id : 0;
}

/* Bad input fails its own job only; the rest of the batch goes on. */
static void fail_frame(fd_state_t *st, spn_msg_t **msg, int32_t rc, spn_error_t *jerr) {
  st->host->fail_job(st->stage, msg_job(st->host, *msg), rc, jerr->msg);
  st->host->msg_free(msg);
}

static int grow_frames(fd_state_t *st, size_t n) {
  if (n <= st->frames_cap)
    return 0;
  fd_frame_t *f = realloc(st->frames, n * sizeof *f);
  if (f)
    st->frames = f;
  fd_frame_t **g = realloc(st->group, n * sizeof *g);
  if (g)
    st->group = g;
  if (!f || !g)
    return -1;
  st->frames_cap = n;
  return 0;
}

/* A process() batch: every frame is checked (and on a GPU brought there)
 * first; the Haar path detects each at once, the model path runs the frames
 * of one size together (one engine run, when the model takes a batch); then
 * the messages are finished and emitted in their order. */
static int32_t fd_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                          spn_error_t *err) {
  fd_state_t *st = state;
  const spn_host_api_t *h = st->host;
  if (grow_frames(st, n))
    return spn_error_set(err, SPN_ENOMEM, "facedetect: out of memory");
  fd_frame_t *fr = st->frames;
  int32_t kind = SPN_DEVICE_CPU;
  h->stage_get_device(stage, &kind, NULL);
  bool on_gpu = kind == SPN_DEVICE_CUDA;
  for (size_t i = 0; i < n; i++) {
    fr[i] = (fd_frame_t){.idx = -1};
    if (!msgs[i] || (fr[i].idx = h->msg_find(msgs[i], "frame")) < 0)
      continue;
    spn_error_t jerr = SPN_ERROR_INIT;
    unsigned long long seq = msg_seq(h, msgs[i]);
    int32_t rc = frame_take(st, msgs[i], &fr[i], on_gpu, seq, &jerr);
    if (rc == SPN_OK && !st->model) { /* the cascade, now: the frame it reads is held for this one only */
      rc = detect_haar(st, fr[i].px, fr[i].W, fr[i].H, &fr[i].n, &jerr);
      fr[i].dets = st->dets;
      st->dets = NULL;
      fr[i].done = rc == SPN_OK;
      if (rc != SPN_OK)
        spn_error_prefix(&jerr, "facedetect: frame %llu", seq);
    } else if (rc == SPN_OK)
      fr[i].pending = true;
#ifdef SPN_VISION_CUDA
    h->buffer_unref(&st->held);
#endif
    if (rc != SPN_OK)
      fail_frame(st, &msgs[i], rc, &jerr);
  }
  for (size_t i = 0; i < n; i++) {
    if (!fr[i].pending)
      continue;
    /* The pending frames of this one's size (all of them where the model
     * takes a batch, else this one), detected together. */
    int32_t k = 0;
    uint64_t job = msg_job(h, msgs[i]);
    for (size_t j = i; j < n && (st->batch_dyn || k == 0); j++)
      if (fr[j].pending && fr[j].W == fr[i].W && fr[j].H == fr[i].H) {
        fr[j].pending = false;
        st->group[k++] = &fr[j];
        if (msg_job(h, msgs[j]) != job)
          job = 0; /* a mixed batch: its copies count for the stage only */
      }
    spn_error_t gerr = SPN_ERROR_INIT;
    int32_t rc = detect_model(st, st->group, k, on_gpu, job, &gerr);
    if (rc != SPN_OK)
      for (int32_t g = 0; g < k; g++) {
        size_t j = (size_t)(st->group[g] - fr); /* the message's place in the batch */
        spn_error_t jerr = SPN_ERROR_INIT;
        spn_error_set(&jerr, rc, "facedetect: frame %llu: %s", msg_seq(h, msgs[j]), gerr.msg);
        fail_frame(st, &msgs[j], rc, &jerr);
      }
  }
  int32_t out = SPN_OK;
  for (size_t i = 0; i < n; i++) {
    if (out == SPN_OK && msgs[i] && fr[i].done) {
      spn_error_t jerr = SPN_ERROR_INIT;
      int32_t rc = frame_finish(st, job_states[i], msgs[i], &fr[i], &jerr);
      if (rc != SPN_OK) {
        spn_error_prefix(&jerr, "facedetect: frame %llu", msg_seq(h, msgs[i]));
        fail_frame(st, &msgs[i], rc, &jerr);
      }
    }
    free(fr[i].dets);
    fr[i].dets = NULL;
    if (out == SPN_OK && msgs[i])
      out = h->emit(stage, 0, &msgs[i], err);
  }
  return out;
}

/* ABI 1.1 formats: packed RGB frames only (a decode in another format is
 * refused at validation, or converted where convert = "auto"). */
#ifdef SPN_VISION_CUDA
/* On a GPU instance frames may already be in its memory (a GPU decode). */
#define FD_MEM_KINDS (SPN_MEMSET_HOST | SPN_MEMSET_DEVICE)
#else
#define FD_MEM_KINDS SPN_MEMSET_HOST
#endif
static const spn_port_caps_t k_input_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .mem_kinds = FD_MEM_KINDS,
                                                .pixel_formats = SPN_FMTSET(SPN_PIX_RGB24)}};
static const spn_port_caps_t k_output_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .mem_kinds = FD_MEM_KINDS}};

static const spn_stage_kind_t k_facedetect = {
    .struct_size = sizeof(spn_stage_kind_t),
    .name = "facedetect",
    .doc = "find faces in video frames (Haar cascade), track and smooth their boxes",
    .schema = k_schema,
    .config_size = sizeof(fd_config_t),
    .inputs = k_inputs,
    .n_inputs = 1,
    .n_outputs = 1,
    .outputs = k_outputs,
#ifdef SPN_VISION_CUDA
    .device_need = SPN_NEED_EITHER,
#else
    .device_need = SPN_NEED_CPU,
#endif
    .max_batch = 16, /* frames per engine run when the model takes a batch (Wav2Lip's inference.py: 16) */
    .max_delay_ms = 5,
    .create = fd_create,
    .job_open = fd_job_open,
    .process = fd_process,
    .job_close = fd_job_close,
    .destroy = fd_destroy,
    .input_caps = k_input_caps,
    .output_caps = k_output_caps,
};

const spn_stage_kind_t *vision_facedetect_kind(void) {
  return &k_facedetect;
}
