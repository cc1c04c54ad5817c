/* facedet.c — input tensors for and output decoding of RetinaFace, SCRFD and
 * YuNet face detectors.
 *
 * Each decoder follows its model's published post-processing step by step, in
 * float32 like the reference code (Pytorch_Retinaface detect.py, InsightFace
 * scrfd.py, OpenCV's FaceDetectorYN), including its score comparison (> or
 * >=), its NMS flavour (inclusive-pixel areas for RetinaFace and SCRFD,
 * integer rectangles for YuNet) and the coordinate space NMS runs in (image
 * pixels for RetinaFace and SCRFD, network input pixels for YuNet).
 *
 * Every output tensor's shape is checked against the anchors the geometry
 * implies before anything is read, so a model of another layout or input size
 * fails with a message naming the output instead of reading out of bounds.
 */
#include "facedet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FD_MAX_INPUT 8192

static const char *model_name(int32_t m) {
  switch (m) {
  case SPN_FACEDET_RETINAFACE: return "retinaface";
  case SPN_FACEDET_SCRFD: return "scrfd";
  case SPN_FACEDET_YUNET: return "yunet";
  default: return "unknown";
  }
}

/* ---------------------------------------------------------------------------
 * Geometry and preprocessing. */

int32_t spn_facedet_fit(int32_t img_w, int32_t img_h, int32_t in_w, int32_t in_h, int32_t fit,
                        spn_facedet_geom_t *g, spn_error_t *err) {
  if (!g || img_w <= 0 || img_h <= 0 || in_w <= 0 || in_h <= 0 || img_w > FD_MAX_INPUT * 4 ||
      img_h > FD_MAX_INPUT * 4 || in_w > FD_MAX_INPUT || in_h > FD_MAX_INPUT)
    return spn_error_set(err, SPN_EINVAL, "facedet: bad sizes image %dx%d input %dx%d", img_w, img_h, in_w, in_h);
  memset(g, 0, sizeof *g);
  g->in_w = in_w;
  g->in_h = in_h;
  g->img_w = img_w;
  g->img_h = img_h;
  switch (fit) {
  case SPN_FACEDET_FIT_NONE:
    if (img_w > in_w || img_h > in_h)
      return spn_error_set(err, SPN_EINVAL, "facedet: image %dx%d does not fit input %dx%d without resizing",
                           img_w, img_h, in_w, in_h);
    g->resized_w = img_w;
    g->resized_h = img_h;
    g->scale_x = g->scale_y = 1.0f;
    return SPN_OK;
  case SPN_FACEDET_FIT_STRETCH:
    g->resized_w = in_w;
    g->resized_h = in_h;
    g->scale_x = (float)in_w / (float)img_w;
    g->scale_y = (float)in_h / (float)img_h;
    return SPN_OK;
  case SPN_FACEDET_FIT_TOPLEFT: {
    /* scrfd.py: im_ratio = h / w vs model_ratio = in_h / in_w; the other
     * side is int()-truncated; det_scale = new_h / h for both axes. */
    double im_ratio = (double)img_h / img_w, model_ratio = (double)in_h / in_w;
    if (im_ratio > model_ratio) {
      g->resized_h = in_h;
      g->resized_w = (int32_t)(in_h / im_ratio);
    } else {
      g->resized_w = in_w;
      g->resized_h = (int32_t)(in_w * im_ratio);
    }
    if (g->resized_w < 1)
      g->resized_w = 1;
    if (g->resized_h < 1)
      g->resized_h = 1;
    g->scale_x = g->scale_y = (float)((double)g->resized_h / img_h);
    return SPN_OK;
  }
  default:
    return spn_error_set(err, SPN_EINVAL, "facedet: unknown fit mode %d", fit);
  }
}

void spn_facedet_yunet_input_size(int32_t img_w, int32_t img_h, int32_t *in_w, int32_t *in_h) {
  if (in_w)
    *in_w = (img_w - 1) / 32 * 32 + 32;
  if (in_h)
    *in_h = (img_h - 1) / 32 * 32 + 32;
}

typedef struct norm {
  int32_t swap;        /* output channel c reads input channel 2 - c */
  float mean[3], inv_std[3];
} norm_t;

static int32_t model_norm(int32_t model, int32_t bgr, norm_t *n) {
  switch (model) {
  case SPN_FACEDET_RETINAFACE: /* BGR - (104, 117, 123) */
    *n = (norm_t){.swap = !bgr, .mean = {104.f, 117.f, 123.f}, .inv_std = {1.f, 1.f, 1.f}};
    return SPN_OK;
  case SPN_FACEDET_SCRFD: /* RGB, (x - 127.5) / 128 */
    *n = (norm_t){.swap = bgr, .mean = {127.5f, 127.5f, 127.5f}, .inv_std = {1.f / 128.f, 1.f / 128.f, 1.f / 128.f}};
    return SPN_OK;
  case SPN_FACEDET_YUNET: /* BGR, raw 0..255 */
    *n = (norm_t){.swap = !bgr, .mean = {0.f, 0.f, 0.f}, .inv_std = {1.f, 1.f, 1.f}};
    return SPN_OK;
  default:
    return SPN_EINVAL;
  }
}

int32_t spn_facedet_norm(int32_t model, int32_t bgr, float mean[3], float inv_std[3], int32_t *swap) {
  norm_t nm;
  if (model_norm(model, bgr, &nm) != SPN_OK)
    return SPN_EINVAL;
  memcpy(mean, nm.mean, sizeof nm.mean);
  memcpy(inv_std, nm.inv_std, sizeof nm.inv_std);
  *swap = nm.swap;
  return SPN_OK;
}

int32_t spn_facedet_preprocess(int32_t model, const uint8_t *img, int32_t stride, int32_t bgr,
                               const spn_facedet_geom_t *g, float *out, spn_error_t *err) {
  norm_t nm;
  if (model_norm(model, bgr, &nm) != SPN_OK)
    return spn_error_set(err, SPN_EINVAL, "facedet: unknown model %d", model);
  if (!img || !g || !out || stride < g->img_w * 3 || g->resized_w <= 0 || g->resized_h <= 0 ||
      g->pad_x < 0 || g->pad_y < 0 || g->pad_x + g->resized_w > g->in_w || g->pad_y + g->resized_h > g->in_h)
    return spn_error_set(err, SPN_EINVAL, "facedet: %s preprocess: bad image or geometry", model_name(model));
  size_t plane = (size_t)g->in_w * g->in_h;
  for (int c = 0; c < 3; c++) {
    float pad = (0.f - nm.mean[c]) * nm.inv_std[c];
    for (size_t i = 0; i < plane; i++)
      out[c * plane + i] = pad;
  }
  double sx = (double)g->img_w / g->resized_w, sy = (double)g->img_h / g->resized_h;
  for (int32_t y = 0; y < g->resized_h; y++) {
    double fy = (y + 0.5) * sy - 0.5;
    if (fy < 0)
      fy = 0;
    int32_t y0 = (int32_t)fy;
    if (y0 > g->img_h - 1)
      y0 = g->img_h - 1;
    int32_t y1 = y0 + 1 < g->img_h ? y0 + 1 : y0;
    float wy = (float)(fy - y0);
    if (y0 == g->img_h - 1)
      wy = 0.f;
    const uint8_t *r0 = img + (size_t)y0 * stride, *r1 = img + (size_t)y1 * stride;
    for (int32_t x = 0; x < g->resized_w; x++) {
      double fx = (x + 0.5) * sx - 0.5;
      if (fx < 0)
        fx = 0;
      int32_t x0 = (int32_t)fx;
      if (x0 > g->img_w - 1)
        x0 = g->img_w - 1;
      int32_t x1 = x0 + 1 < g->img_w ? x0 + 1 : x0;
      float wx = (float)(fx - x0);
      if (x0 == g->img_w - 1)
        wx = 0.f;
      size_t o = (size_t)(y + g->pad_y) * g->in_w + (size_t)(x + g->pad_x);
      for (int c = 0; c < 3; c++) {
        int ic = nm.swap ? 2 - c : c;
        float a = r0[3 * x0 + ic], b = r0[3 * x1 + ic], cc = r1[3 * x0 + ic], d = r1[3 * x1 + ic];
        float top = a + (b - a) * wx, bot = cc + (d - cc) * wx;
        float v = top + (bot - top) * wy;
        out[c * plane + o] = (v - nm.mean[c]) * nm.inv_std[c];
      }
    }
  }
  return SPN_OK;
}

/* ---------------------------------------------------------------------------
 * NMS. */

static void int_rect(const spn_detface_t *f, float *x, float *y, float *w, float *h) {
  /* YuNet: Rect2i(int(x1), int(y1), int(w), int(h)) — C truncation. */
  *x = (float)(int32_t)f->x0;
  *y = (float)(int32_t)f->y0;
  *w = (float)(int32_t)(f->x1 - f->x0);
  *h = (float)(int32_t)(f->y1 - f->y0);
}

static float iou(const spn_detface_t *a, const spn_detface_t *b, int32_t mode) {
  if (mode == SPN_NMS_INT_RECT) {
    float ax, ay, aw, ah, bx, by, bw, bh;
    int_rect(a, &ax, &ay, &aw, &ah);
    int_rect(b, &bx, &by, &bw, &bh);
    float ix = fmaxf(ax, bx), iy = fmaxf(ay, by);
    float iw = fminf(ax + aw, bx + bw) - ix, ih = fminf(ay + ah, by + bh) - iy;
    if (iw <= 0 || ih <= 0)
      return 0.f;
    float inter = iw * ih;
    return inter / (aw * ah + bw * bh - inter);
  }
  float one = mode == SPN_NMS_PLUS_ONE ? 1.f : 0.f;
  float area_a = (a->x1 - a->x0 + one) * (a->y1 - a->y0 + one);
  float area_b = (b->x1 - b->x0 + one) * (b->y1 - b->y0 + one);
  float w = fmaxf(0.f, fminf(a->x1, b->x1) - fmaxf(a->x0, b->x0) + one);
  float h = fmaxf(0.f, fminf(a->y1, b->y1) - fmaxf(a->y0, b->y0) + one);
  float inter = w * h;
  return inter / (area_a + area_b - inter);
}

int32_t spn_facedet_nms(const spn_detface_t *f, int32_t n, float threshold, int32_t mode, int32_t *keep) {
  int32_t k = 0;
  for (int32_t i = 0; i < n; i++) {
    int ok = 1;
    for (int32_t j = 0; j < k && ok; j++)
      if (!(iou(&f[keep[j]], &f[i], mode) <= threshold))
        ok = 0;
    if (ok)
      keep[k++] = i;
  }
  return k;
}

/* ---------------------------------------------------------------------------
 * Decoding. */

static const int32_t k_strides[3] = {8, 16, 32};

typedef struct cands {
  spn_detface_t *v;
  int32_t n, cap;
} cands_t;

static int cands_push(cands_t *c, const spn_detface_t *f) {
  if (c->n == c->cap) {
    int32_t nc = c->cap ? c->cap * 2 : 256;
    spn_detface_t *q = realloc(c->v, (size_t)nc * sizeof *q);
    if (!q)
      return -1;
    c->v = q;
    c->cap = nc;
  }
  c->v[c->n++] = *f;
  return 0;
}

/* Check output `idx` is float32, CPU, batch 1 (if it has a batch axis) and
 * holds rows x cols values laid out as (..., rows, cols). */
static int32_t check_out(int32_t model, const spn_tensor_t *outs, int32_t idx, int64_t rows, int64_t cols,
                         const char *what, spn_error_t *err) {
  const spn_tensor_t *t = &outs[idx];
  if (t->dtype != SPN_DTYPE_F32 || t->device_kind != SPN_DEVICE_CPU || !t->data)
    return spn_error_set(err, SPN_ETYPE, "facedet: %s output %d (%s) must be float32 in host memory",
                         model_name(model), idx, what);
  int ok = t->ndim >= 1 && t->ndim <= 3 && spn_tensor_numel(t) == rows * cols && t->shape[t->ndim - 1] == cols;
  if (ok && t->ndim == 3 && t->shape[0] != 1)
    ok = 0;
  if (!ok) {
    char shape[96] = "";
    size_t o = 0;
    for (int32_t d = 0; d < t->ndim && d < SPN_TENSOR_MAX_DIMS && o < sizeof shape - 24; d++)
      o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    return spn_error_set(err, SPN_EMODEL, "facedet: %s output %d (%s) has shape (%s); expected (1,%lld,%lld)",
                         model_name(model), idx, what, shape, (long long)rows, (long long)cols);
  }
  return SPN_OK;
}

int32_t spn_facedet_layout(int32_t model, int32_t noutputs, const spn_facedet_geom_t *g,
                           spn_facedet_output_t *outs, spn_error_t *err) {
  if (!g || !outs)
    return spn_error_set(err, SPN_EINVAL, "facedet: NULL argument");
  switch (model) {
  case SPN_FACEDET_RETINAFACE: {
    if (noutputs != 3)
      return spn_error_set(err, SPN_EMODEL, "facedet: retinaface needs 3 outputs (loc, conf, landms), got %d",
                           noutputs);
    int64_t N = 0;
    for (int k = 0; k < 3; k++)
      N += (int64_t)((g->in_h + k_strides[k] - 1) / k_strides[k]) * ((g->in_w + k_strides[k] - 1) / k_strides[k]) *
           2;
    outs[0] = (spn_facedet_output_t){N, 4, "loc"};
    outs[1] = (spn_facedet_output_t){N, 2, "conf"};
    outs[2] = (spn_facedet_output_t){N, 10, "landms"};
    return SPN_OK;
  }
  case SPN_FACEDET_SCRFD:
    if (noutputs != 6 && noutputs != 9)
      return spn_error_set(
          err, SPN_EMODEL,
          "facedet: scrfd needs 6 or 9 outputs (scores, boxes[, keypoints] per stride 8/16/32), got %d", noutputs);
    for (int k = 0; k < 3; k++) {
      int64_t N = (int64_t)(g->in_h / k_strides[k]) * (g->in_w / k_strides[k]) * 2;
      outs[k] = (spn_facedet_output_t){N, 1, "scores"};
      outs[3 + k] = (spn_facedet_output_t){N, 4, "bbox"};
      if (noutputs == 9)
        outs[6 + k] = (spn_facedet_output_t){N, 10, "kps"};
    }
    return SPN_OK;
  case SPN_FACEDET_YUNET:
    if (noutputs != 12)
      return spn_error_set(err, SPN_EMODEL, "facedet: yunet needs 12 outputs (cls, obj, bbox, kps per stride), got %d",
                           noutputs);
    if (g->in_w % 32 || g->in_h % 32)
      return spn_error_set(err, SPN_EINVAL, "facedet: yunet input %dx%d must be a multiple of 32", g->in_w, g->in_h);
    for (int k = 0; k < 3; k++) {
      int64_t N = (int64_t)(g->in_h / k_strides[k]) * (g->in_w / k_strides[k]);
      outs[k] = (spn_facedet_output_t){N, 1, "cls"};
      outs[3 + k] = (spn_facedet_output_t){N, 1, "obj"};
      outs[6 + k] = (spn_facedet_output_t){N, 4, "bbox"};
      outs[9 + k] = (spn_facedet_output_t){N, 10, "kps"};
    }
    return SPN_OK;
  default:
    return spn_error_set(err, SPN_EINVAL, "facedet: unknown model %d", model);
  }
}

static void to_image(const spn_facedet_geom_t *g, spn_detface_t *f) {
  f->x0 = (f->x0 - (float)g->pad_x) / g->scale_x;
  f->x1 = (f->x1 - (float)g->pad_x) / g->scale_x;
  f->y0 = (f->y0 - (float)g->pad_y) / g->scale_y;
  f->y1 = (f->y1 - (float)g->pad_y) / g->scale_y;
  if (f->has_landmarks)
    for (int k = 0; k < 5; k++) {
      f->landmarks[2 * k] = (f->landmarks[2 * k] - (float)g->pad_x) / g->scale_x;
      f->landmarks[2 * k + 1] = (f->landmarks[2 * k + 1] - (float)g->pad_y) / g->scale_y;
    }
}

static int32_t decode_retinaface(const spn_tensor_t *o, int32_t no, const spn_facedet_geom_t *g,
                                 const spn_facedet_params_t *p, cands_t *cs, spn_error_t *err) {
  static const int32_t min_sizes[3][2] = {{16, 32}, {64, 128}, {256, 512}};
  (void)no;
  const float *loc = o[0].data, *conf = o[1].data, *lm = o[2].data;
  float W = (float)g->in_w, H = (float)g->in_h;
  int64_t a = 0;
  for (int k = 0; k < 3; k++) {
    int32_t step = k_strides[k];
    int32_t fh = (g->in_h + step - 1) / step, fw = (g->in_w + step - 1) / step;
    for (int32_t i = 0; i < fh; i++)
      for (int32_t j = 0; j < fw; j++)
        for (int m = 0; m < 2; m++, a++) {
          float score = conf[2 * a + 1];
          if (!(score > p->score_threshold)) /* detect.py: scores > threshold */
            continue;
          /* The prior, computed in double and stored as float like the
           * reference PriorBox. */
          float pw = (float)((double)min_sizes[k][m] / g->in_w), ph = (float)((double)min_sizes[k][m] / g->in_h);
          float pcx = (float)((j + 0.5) * step / g->in_w), pcy = (float)((i + 0.5) * step / g->in_h);
          const float *l = loc + 4 * a;
          float cx = pcx + l[0] * 0.1f * pw, cy = pcy + l[1] * 0.1f * ph;
          float bw = pw * expf(l[2] * 0.2f), bh = ph * expf(l[3] * 0.2f);
          float x0 = cx - bw / 2, y0 = cy - bh / 2;
          spn_detface_t f = {.score = score, .has_landmarks = 1};
          f.x0 = x0 * W;
          f.y0 = y0 * H;
          f.x1 = (bw + x0) * W;
          f.y1 = (bh + y0) * H;
          const float *q = lm + 10 * a;
          for (int t = 0; t < 5; t++) {
            f.landmarks[2 * t] = (pcx + q[2 * t] * 0.1f * pw) * W;
            f.landmarks[2 * t + 1] = (pcy + q[2 * t + 1] * 0.1f * ph) * H;
          }
          to_image(g, &f);
          if (cands_push(cs, &f))
            return spn_error_set(err, SPN_ENOMEM, "facedet: out of memory");
        }
  }
  return SPN_OK;
}

static int32_t decode_scrfd(const spn_tensor_t *o, int32_t no, const spn_facedet_geom_t *g,
                            const spn_facedet_params_t *p, cands_t *cs, spn_error_t *err) {
  int has_kps = no == 9;
  for (int k = 0; k < 3; k++) {
    int32_t s = k_strides[k];
    int32_t fh = g->in_h / s, fw = g->in_w / s;
    const float *sc = o[k].data, *bb = o[3 + k].data, *kp = has_kps ? o[6 + k].data : NULL;
    float fs = (float)s;
    int64_t a = 0;
    for (int32_t y = 0; y < fh; y++)
      for (int32_t x = 0; x < fw; x++)
        for (int m = 0; m < 2; m++, a++) {
          if (!(sc[a] >= p->score_threshold)) /* scrfd.py: scores >= threshold */
            continue;
          float cx = (float)x * fs, cy = (float)y * fs;
          const float *d = bb + 4 * a;
          spn_detface_t f = {.score = sc[a], .has_landmarks = has_kps};
          f.x0 = cx - d[0] * fs;
          f.y0 = cy - d[1] * fs;
          f.x1 = cx + d[2] * fs;
          f.y1 = cy + d[3] * fs;
          if (kp)
            for (int t = 0; t < 5; t++) {
              f.landmarks[2 * t] = cx + kp[10 * a + 2 * t] * fs;
              f.landmarks[2 * t + 1] = cy + kp[10 * a + 2 * t + 1] * fs;
            }
          to_image(g, &f);
          if (cands_push(cs, &f))
            return spn_error_set(err, SPN_ENOMEM, "facedet: out of memory");
        }
  }
  return SPN_OK;
}

static float clamp01(float v) {
  return v < 0.f ? 0.f : (v > 1.f ? 1.f : v);
}

/* Candidates stay in input pixels: OpenCV runs NMS there. */
static int32_t decode_yunet(const spn_tensor_t *o, int32_t no, const spn_facedet_geom_t *g,
                            const spn_facedet_params_t *p, cands_t *cs, spn_error_t *err) {
  (void)no;
  for (int k = 0; k < 3; k++) {
    int32_t s = k_strides[k];
    int32_t rows = g->in_h / s, cols = g->in_w / s;
    const float *cls = o[k].data, *obj = o[3 + k].data, *bb = o[6 + k].data, *kp = o[9 + k].data;
    float fs = (float)s;
    for (int32_t r = 0; r < rows; r++)
      for (int32_t c = 0; c < cols; c++) {
        size_t i = (size_t)r * cols + c;
        float score = sqrtf(clamp01(cls[i]) * clamp01(obj[i]));
        /* FaceDetectorYN keeps >= threshold, then NMSBoxes keeps > threshold. */
        if (!(score > p->score_threshold))
          continue;
        const float *d = bb + 4 * i;
        float cx = ((float)c + d[0]) * fs, cy = ((float)r + d[1]) * fs;
        float w = expf(d[2]) * fs, h = expf(d[3]) * fs;
        spn_detface_t f = {.score = score, .has_landmarks = 1};
        f.x0 = cx - w / 2.f;
        f.y0 = cy - h / 2.f;
        f.x1 = f.x0 + w;
        f.y1 = f.y0 + h;
        for (int t = 0; t < 5; t++) {
          f.landmarks[2 * t] = (kp[10 * i + 2 * t] + (float)c) * fs;
          f.landmarks[2 * t + 1] = (kp[10 * i + 2 * t + 1] + (float)r) * fs;
        }
        if (cands_push(cs, &f))
          return spn_error_set(err, SPN_ENOMEM, "facedet: out of memory");
      }
  }
  return SPN_OK;
}

static int32_t check_params(const spn_facedet_geom_t *g, const spn_facedet_params_t *P, spn_error_t *err) {
  if (g->in_w <= 0 || g->in_h <= 0 || g->in_w > FD_MAX_INPUT || g->in_h > FD_MAX_INPUT || !(g->scale_x > 0) ||
      !(g->scale_y > 0))
    return spn_error_set(err, SPN_EINVAL, "facedet: bad geometry (input %dx%d)", g->in_w, g->in_h);
  if (!(P->nms_threshold >= 0.f && P->nms_threshold <= 1.f) || P->pre_nms_top_k < 0 || P->post_nms_top_k < 0)
    return spn_error_set(err, SPN_EINVAL, "facedet: nms_threshold must be in [0, 1] and top-k >= 0");
  return SPN_OK;
}

typedef struct order {
  float score;
  int32_t idx;
} order_t;

/* Descending score; equal scores keep their decode order. */
static int order_cmp(const void *a, const void *b) {
  const order_t *p = a, *q = b;
  if (p->score != q->score)
    return p->score < q->score ? 1 : -1;
  return (p->idx > q->idx) - (p->idx < q->idx);
}

int32_t spn_facedet_decode(int32_t model, const spn_tensor_t *outputs, int32_t noutputs,
                           const spn_facedet_geom_t *g, const spn_facedet_params_t *params, spn_detface_t **faces,
                           int32_t *n, spn_error_t *err) {
  if (!faces || !n || !g || (!outputs && noutputs > 0))
    return spn_error_set(err, SPN_EINVAL, "facedet: NULL argument");
  *faces = NULL;
  *n = 0;
  spn_facedet_params_t P = SPN_FACEDET_PARAMS_INIT;
  if (params)
    P = *params;
  int32_t rc;
  if ((rc = check_params(g, &P, err)) != SPN_OK)
    return rc;
  spn_facedet_output_t lay[SPN_FACEDET_MAX_OUTPUTS];
  if ((rc = spn_facedet_layout(model, noutputs, g, lay, err)) != SPN_OK)
    return rc;
  for (int32_t i = 0; i < noutputs; i++)
    if ((rc = check_out(model, outputs, i, lay[i].rows, lay[i].cols, lay[i].what, err)) != SPN_OK)
      return rc;
  cands_t cs = {0};
  switch (model) {
  case SPN_FACEDET_RETINAFACE: rc = decode_retinaface(outputs, noutputs, g, &P, &cs, err); break;
  case SPN_FACEDET_SCRFD: rc = decode_scrfd(outputs, noutputs, g, &P, &cs, err); break;
  default: rc = decode_yunet(outputs, noutputs, g, &P, &cs, err); break;
  }
  if (rc == SPN_OK && cs.n > 0)
    rc = spn_facedet_select(model, cs.v, cs.n, g, &P, faces, n, err);
  free(cs.v);
  return rc;
}

int32_t spn_facedet_select(int32_t model, const spn_detface_t *cands, int32_t ncands, const spn_facedet_geom_t *g,
                           const spn_facedet_params_t *params, spn_detface_t **faces, int32_t *n, spn_error_t *err) {
  if (!faces || !n || !g || (!cands && ncands > 0) || ncands < 0)
    return spn_error_set(err, SPN_EINVAL, "facedet: NULL argument");
  *faces = NULL;
  *n = 0;
  spn_facedet_params_t P = SPN_FACEDET_PARAMS_INIT;
  if (params)
    P = *params;
  int32_t rc, mode;
  if ((rc = check_params(g, &P, err)) != SPN_OK)
    return rc;
  switch (model) {
  case SPN_FACEDET_RETINAFACE:
  case SPN_FACEDET_SCRFD: mode = SPN_NMS_PLUS_ONE; break;
  case SPN_FACEDET_YUNET: mode = SPN_NMS_INT_RECT; break;
  default: return spn_error_set(err, SPN_EINVAL, "facedet: unknown model %d", model);
  }
  if (ncands == 0)
    return SPN_OK;
  /* Stable order for equal scores: sort (score, decode index). */
  order_t *ord = malloc((size_t)ncands * sizeof *ord);
  spn_detface_t *sorted = malloc((size_t)ncands * sizeof *sorted);
  int32_t m = ncands;
  if (P.pre_nms_top_k > 0 && m > P.pre_nms_top_k)
    m = P.pre_nms_top_k;
  int32_t *keep = malloc((size_t)m * sizeof *keep);
  if (!ord || !sorted || !keep) {
    rc = spn_error_set(err, SPN_ENOMEM, "facedet: out of memory");
    goto out;
  }
  for (int32_t i = 0; i < ncands; i++)
    ord[i] = (order_t){cands[i].score, i};
  qsort(ord, (size_t)ncands, sizeof *ord, order_cmp);
  for (int32_t i = 0; i < ncands; i++)
    sorted[i] = cands[ord[i].idx];
  int32_t k = spn_facedet_nms(sorted, m, P.nms_threshold, mode, keep);
  if (P.post_nms_top_k > 0 && k > P.post_nms_top_k)
    k = P.post_nms_top_k;
  spn_detface_t *res = malloc((size_t)(k > 0 ? k : 1) * sizeof *res);
  if (!res) {
    rc = spn_error_set(err, SPN_ENOMEM, "facedet: out of memory");
    goto out;
  }
  for (int32_t i = 0; i < k; i++) {
    res[i] = sorted[keep[i]];
    if (model == SPN_FACEDET_YUNET)
      to_image(g, &res[i]);
  }
  if (k > 0)
    *faces = res;
  else
    free(res);
  *n = k;
out:
  free(ord);
  free(sorted);
  free(keep);
  return rc;
}
