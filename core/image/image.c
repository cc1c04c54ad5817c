/* image.c — CPU frame operations (see spindle/image.h for the conventions).
 *
 * This is the numeric reference the CUDA kernels are tested against, so it
 * favours plain, exact arithmetic over speed: float math per pixel, explicit
 * rounding, no fixed-point shortcuts. Where a path is hot on the CPU too
 * (4:2:0 → RGB, every decoded frame), SIMD runs the very same float
 * operations, so it writes the same bytes as the scalar loop. It is linked
 * statically into stages (which may not call libspindle), so it uses only
 * header-inline helpers from spindle/status.h and reports every rejection
 * through spn_error_t.
 *
 * Invariants: functions never write outside the destination's planes; a
 * destination is fully written on SPN_OK; on error nothing is written.
 */
#include "spindle/image.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static const struct {
  const char *name;
  int32_t fmt;
} pixfmt_names[] = {
    {"rgb24", SPN_PIXFMT_RGB24},     {"bgr24", SPN_PIXFMT_BGR24},
    {"gray8", SPN_PIXFMT_GRAY8},     {"rgbf32p", SPN_PIXFMT_RGBF32P},
    {"bgrf32p", SPN_PIXFMT_BGRF32P}, {"nv12", SPN_PIXFMT_NV12},
    {"yuv420p", SPN_PIXFMT_YUV420P}, {"grayf32", SPN_PIXFMT_GRAYF32},
};

const char *spn_pixfmt_name(int32_t format) {
  for (size_t i = 0; i < sizeof pixfmt_names / sizeof pixfmt_names[0]; i++)
    if (pixfmt_names[i].fmt == format)
      return pixfmt_names[i].name;
  return "none";
}

int32_t spn_pixfmt_from_name(const char *name) {
  if (!name)
    return SPN_PIXFMT_NONE;
  for (size_t i = 0; i < sizeof pixfmt_names / sizeof pixfmt_names[0]; i++)
    if (strcmp(pixfmt_names[i].name, name) == 0)
      return pixfmt_names[i].fmt;
  return SPN_PIXFMT_NONE;
}

int32_t spn_pixfmt_planes(int32_t format) {
  switch (format) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24: case SPN_PIXFMT_GRAY8: case SPN_PIXFMT_GRAYF32:
    return 1;
  case SPN_PIXFMT_NV12: return 2;
  case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P: case SPN_PIXFMT_YUV420P: return 3;
  default: return 0;
  }
}

/* Bytes per element of plane p (an element is one pixel of that plane). */
static int32_t plane_elem_size(int32_t format, int32_t p) {
  switch (format) {
  case SPN_PIXFMT_RGB24: case SPN_PIXFMT_BGR24: return 3;
  case SPN_PIXFMT_GRAY8: case SPN_PIXFMT_YUV420P: return 1;
  case SPN_PIXFMT_NV12: return p == 0 ? 1 : 2;
  case SPN_PIXFMT_RGBF32P: case SPN_PIXFMT_BGRF32P: case SPN_PIXFMT_GRAYF32: return 4;
  default: return 0;
  }
}

void spn_pixfmt_plane_size(int32_t format, int32_t w, int32_t h, int32_t p, int32_t *pw,
                           int32_t *ph) {
  int sub = (format == SPN_PIXFMT_NV12 || format == SPN_PIXFMT_YUV420P) && p > 0;
  *pw = sub ? (w + 1) / 2 : w;
  *ph = sub ? (h + 1) / 2 : h;
}

size_t spn_pixfmt_tight_size(int32_t format, int32_t w, int32_t h) {
  size_t n = 0;
  for (int32_t p = 0; p < spn_pixfmt_planes(format); p++) {
    int32_t pw, ph;
    spn_pixfmt_plane_size(format, w, h, p, &pw, &ph);
    n += (size_t)pw * (size_t)ph * (size_t)plane_elem_size(format, p);
  }
  return n;
}

static int valid_size(int32_t w, int32_t h) {
  return w > 0 && h > 0 && w <= (1 << 16) && h <= (1 << 16);
}

int32_t spn_image_alloc(spn_image_t *img, int32_t width, int32_t height, int32_t format,
                        spn_error_t *err) {
  memset(img, 0, sizeof *img);
  int32_t np = spn_pixfmt_planes(format);
  if (np == 0)
    return spn_error_set(err, SPN_EINVAL, "image: unknown pixel format %d", (int)format);
  if (!valid_size(width, height))
    return spn_error_set(err, SPN_EINVAL, "image: invalid size %dx%d", (int)width, (int)height);
  size_t total = 0;
  size_t off[4];
  int64_t stride[4];
  for (int32_t p = 0; p < np; p++) {
    int32_t pw, ph;
    spn_pixfmt_plane_size(format, width, height, p, &pw, &ph);
    stride[p] = ((int64_t)pw * plane_elem_size(format, p) + 31) & ~(int64_t)31;
    off[p] = total;
    total += (size_t)stride[p] * (size_t)ph;
  }
  uint8_t *buf = aligned_alloc(32, total ? (total + 31) & ~(size_t)31 : 32);
  if (!buf)
    return spn_error_set(err, SPN_ENOMEM, "image: cannot allocate %zu bytes", total);
  memset(buf, 0, total);
  img->width = width;
  img->height = height;
  img->format = format;
  img->nplanes = np;
  for (int32_t p = 0; p < np; p++) {
    img->data[p] = buf + off[p];
    img->stride[p] = stride[p];
  }
  img->owned = buf;
  return SPN_OK;
}

void spn_image_release(spn_image_t *img) {
  if (!img)
    return;
  free(img->owned);
  memset(img, 0, sizeof *img);
}

int32_t spn_image_wrap(spn_image_t *img, void *data, int32_t width, int32_t height, int32_t format,
                       spn_error_t *err) {
  memset(img, 0, sizeof *img);
  int32_t np = spn_pixfmt_planes(format);
  if (np == 0)
    return spn_error_set(err, SPN_EINVAL, "image: unknown pixel format %d", (int)format);
  if (!valid_size(width, height) || !data)
    return spn_error_set(err, SPN_EINVAL, "image: invalid size %dx%d", (int)width, (int)height);
  uint8_t *p8 = data;
  img->width = width;
  img->height = height;
  img->format = format;
  img->nplanes = np;
  for (int32_t p = 0; p < np; p++) {
    int32_t pw, ph;
    spn_pixfmt_plane_size(format, width, height, p, &pw, &ph);
    img->data[p] = p8;
    img->stride[p] = (int64_t)pw * plane_elem_size(format, p);
    p8 += img->stride[p] * ph;
  }
  return SPN_OK;
}

static int32_t check_image(const spn_image_t *img, const char *what, spn_error_t *err) {
  if (!img || spn_pixfmt_planes(img->format) == 0 || img->nplanes != spn_pixfmt_planes(img->format))
    return spn_error_set(err, SPN_EINVAL, "image: %s has an invalid format", what);
  if (!valid_size(img->width, img->height))
    return spn_error_set(err, SPN_EINVAL, "image: %s has invalid size %dx%d", what,
                         (int)img->width, (int)img->height);
  for (int32_t p = 0; p < img->nplanes; p++) {
    int32_t pw, ph;
    spn_pixfmt_plane_size(img->format, img->width, img->height, p, &pw, &ph);
    if (!img->data[p] || img->stride[p] < (int64_t)pw * plane_elem_size(img->format, p))
      return spn_error_set(err, SPN_EINVAL, "image: %s plane %d has no data or a short stride",
                           what, (int)p);
  }
  return SPN_OK;
}

int32_t spn_image_crop(const spn_image_t *src, int32_t x, int32_t y, int32_t w, int32_t h,
                       spn_image_t *view, spn_error_t *err) {
  int32_t rc = check_image(src, "crop source", err);
  if (rc)
    return rc;
  if (x < 0 || y < 0 || w <= 0 || h <= 0 || (int64_t)x + w > src->width ||
      (int64_t)y + h > src->height)
    return spn_error_set(err, SPN_EINVAL, "image: crop %dx%d+%d+%d outside the %dx%d image",
                         (int)w, (int)h, (int)x, (int)y, (int)src->width, (int)src->height);
  int sub = src->format == SPN_PIXFMT_NV12 || src->format == SPN_PIXFMT_YUV420P;
  if (sub && ((x | y) & 1))
    return spn_error_set(err, SPN_EINVAL, "image: crop of a 4:2:0 image needs an even origin (got %d,%d)",
                         (int)x, (int)y);
  *view = *src;
  view->owned = NULL;
  view->width = w;
  view->height = h;
  for (int32_t p = 0; p < src->nplanes; p++) {
    int32_t px = (sub && p > 0) ? x / 2 : x, py = (sub && p > 0) ? y / 2 : y;
    view->data[p] = src->data[p] + py * src->stride[p] + (int64_t)px * plane_elem_size(src->format, p);
  }
  return SPN_OK;
}

static int32_t check_same(const spn_image_t *a, const spn_image_t *b, const char *op, spn_error_t *err) {
  if (a->width != b->width || a->height != b->height)
    return spn_error_set(err, SPN_EINVAL, "image: %s needs equal sizes (%dx%d vs %dx%d)", op,
                         (int)a->width, (int)a->height, (int)b->width, (int)b->height);
  return SPN_OK;
}

int32_t spn_image_copy(const spn_image_t *src, spn_image_t *dst, spn_error_t *err) {
  int32_t rc;
  if ((rc = check_image(src, "copy source", err)) || (rc = check_image(dst, "copy destination", err)) ||
      (rc = check_same(src, dst, "copy", err)))
    return rc;
  if (src->format != dst->format)
    return spn_error_set(err, SPN_EINVAL, "image: copy between %s and %s", spn_pixfmt_name(src->format),
                         spn_pixfmt_name(dst->format));
  for (int32_t p = 0; p < src->nplanes; p++) {
    int32_t pw, ph;
    spn_pixfmt_plane_size(src->format, src->width, src->height, p, &pw, &ph);
    size_t row = (size_t)pw * plane_elem_size(src->format, p);
    for (int32_t yy = 0; yy < ph; yy++)
      memmove(dst->data[p] + yy * dst->stride[p], src->data[p] + yy * src->stride[p], row);
  }
  return SPN_OK;
}

/* ---- generic per-channel access for the "simple" formats ----
 * Packed u8 (RGB24/BGR24/GRAY8) and planar float (RGBF32P/BGRF32P/GRAYF32)
 * are handled by one code path each: a channel count and an accessor. */

static int is_u8_packed(int32_t f) {
  return f == SPN_PIXFMT_RGB24 || f == SPN_PIXFMT_BGR24 || f == SPN_PIXFMT_GRAY8;
}
static int is_float_planar(int32_t f) {
  return f == SPN_PIXFMT_RGBF32P || f == SPN_PIXFMT_BGRF32P || f == SPN_PIXFMT_GRAYF32;
}
static int channels_of(int32_t f) {
  return (f == SPN_PIXFMT_GRAY8 || f == SPN_PIXFMT_GRAYF32) ? 1 : 3;
}

static inline uint8_t sat_u8(float v) {
  /* round to nearest, ties away from zero, then saturate */
  if (!(v > 0.0f))
    return 0;
  if (v >= 254.5f)
    return 255;
  return (uint8_t)(v + 0.5f);
}

static inline float get_px(const spn_image_t *im, int c, int32_t x, int32_t y) {
  if (is_u8_packed(im->format))
    return (float)im->data[0][y * im->stride[0] + (int64_t)x * channels_of(im->format) + c];
  return ((const float *)(im->data[c] + y * im->stride[c]))[x];
}

static inline void put_px(spn_image_t *im, int c, int32_t x, int32_t y, float v) {
  if (is_u8_packed(im->format))
    im->data[0][y * im->stride[0] + (int64_t)x * channels_of(im->format) + c] = sat_u8(v);
  else
    ((float *)(im->data[c] + y * im->stride[c]))[x] = v;
}

/* ---- resize ---- */

/* Bilinear taps along one axis: for each destination index, the two source
 * indices (clamped to the image) and the weight of the second. Clamping the
 * indices is equivalent to OpenCV's "fx = 0 at the borders" rule. */
typedef struct {
  int32_t i0, i1;
  float w1;
} lin_tap_t;

/* cv2.INTER_CUBIC's taps (Keys' kernel, A = -0.75) at the same source
 * positions as linear_taps, the four source indices clamped to the edge
 * (replicate), the weights computed in double and rounded to float once. */
typedef struct {
  int32_t i[4];
  float w[4];
} cub_tap_t;

static void cubic_taps(int32_t src_n, int32_t dst_n, cub_tap_t *taps) {
  const double A = -0.75;
  double scale = (double)src_n / dst_n;
  for (int32_t d = 0; d < dst_n; d++) {
    double s = (d + 0.5) * scale - 0.5;
    double f = floor(s), x = s - f, y = 1.0 - x;
    int32_t i = (int32_t)f;
    double w0 = ((A * (x + 1.0) - 5.0 * A) * (x + 1.0) + 8.0 * A) * (x + 1.0) - 4.0 * A;
    double w1 = ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    double w2 = ((A + 2.0) * y - (A + 3.0)) * y * y + 1.0;
    double w[4] = {w0, w1, w2, 1.0 - w0 - w1 - w2};
    for (int k = 0; k < 4; k++) {
      int32_t j = i - 1 + k;
      taps[d].i[k] = j < 0 ? 0 : (j > src_n - 1 ? src_n - 1 : j);
      taps[d].w[k] = (float)w[k];
    }
  }
}

/* Four taps in order, each product and sum rounded to float on its own. */
static inline float cubic_sum(const float w[4], float a, float b, float c, float d) {
  return w[0] * a + w[1] * b + w[2] * c + w[3] * d;
}

static void linear_taps(int32_t src_n, int32_t dst_n, lin_tap_t *taps) {
  double scale = (double)src_n / dst_n;
  for (int32_t d = 0; d < dst_n; d++) {
    double s = (d + 0.5) * scale - 0.5;
    double f = floor(s);
    int32_t i = (int32_t)f;
    float w = (float)(s - f);
    int32_t i0 = i < 0 ? 0 : (i > src_n - 1 ? src_n - 1 : i);
    int32_t i1 = i + 1 < 0 ? 0 : (i + 1 > src_n - 1 ? src_n - 1 : i + 1);
    taps[d] = (lin_tap_t){i0, i1, w};
  }
}

/* Area weights along one axis (shrinking): destination d covers the source
 * interval [d*scale, (d+1)*scale); each source pixel contributes its covered
 * length / scale. Stored as a CSR list. */
typedef struct {
  int32_t *start;  /* first entry of d in idx/w; start[dst_n] = total */
  int32_t *idx;
  float *w;
} area_taps_t;

static int area_taps(int32_t src_n, int32_t dst_n, area_taps_t *t) {
  double scale = (double)src_n / dst_n;
  int32_t max_per = (int32_t)ceil(scale) + 2;
  t->start = malloc(sizeof(int32_t) * (size_t)(dst_n + 1));
  t->idx = malloc(sizeof(int32_t) * (size_t)dst_n * (size_t)max_per);
  t->w = malloc(sizeof(float) * (size_t)dst_n * (size_t)max_per);
  if (!t->start || !t->idx || !t->w)
    return -1;
  int32_t k = 0;
  for (int32_t d = 0; d < dst_n; d++) {
    double a = d * scale, b = (d + 1) * scale;
    if (b > src_n)
      b = src_n;
    t->start[d] = k;
    for (int32_t s = (int32_t)floor(a); s < src_n && s < b; s++) {
      double lo = s > a ? s : a, hi = s + 1 < b ? s + 1 : b;
      double cover = hi - lo;
      if (cover <= 1e-9)
        continue;
      t->idx[k] = s;
      t->w[k] = (float)(cover / (b - a));
      k++;
    }
  }
  t->start[dst_n] = k;
  return 0;
}

static void area_taps_free(area_taps_t *t) {
  free(t->start);
  free(t->idx);
  free(t->w);
}

int32_t spn_image_resize(const spn_image_t *src, spn_image_t *dst, int32_t interp,
                         spn_error_t *err) {
  int32_t rc;
  if ((rc = check_image(src, "resize source", err)) || (rc = check_image(dst, "resize destination", err)))
    return rc;
  if (src->format != dst->format || !(is_u8_packed(src->format) || is_float_planar(src->format)))
    return spn_error_set(err, SPN_EUNSUPPORTED, "image: resize from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  if (interp != SPN_INTERP_BILINEAR && interp != SPN_INTERP_AREA && interp != SPN_INTERP_CUBIC)
    return spn_error_set(err, SPN_EINVAL, "image: unknown interpolation %d", (int)interp);
  int32_t sw = src->width, sh = src->height, dw = dst->width, dh = dst->height;
  int nc = channels_of(src->format);
  int area_x = interp == SPN_INTERP_AREA && dw < sw;
  int area_y = interp == SPN_INTERP_AREA && dh < sh, cubic = interp == SPN_INTERP_CUBIC;
  rc = SPN_OK;
  lin_tap_t *lx = malloc(sizeof *lx * (size_t)dw), *ly = malloc(sizeof *ly * (size_t)dh);
  cub_tap_t *cx = cubic ? malloc(sizeof *cx * (size_t)dw) : NULL, *cy = cubic ? malloc(sizeof *cy * (size_t)dh) : NULL;
  area_taps_t ax = {0}, ay = {0};
  /* horizontal pass result for one source row, all channels: (nc, dw) */
  float *rowbuf = malloc(sizeof(float) * (size_t)nc * (size_t)dw * (size_t)sh);
  if (!lx || !ly || !rowbuf || (cubic && (!cx || !cy)) || (area_x && area_taps(sw, dw, &ax)) ||
      (area_y && area_taps(sh, dh, &ay))) {
    rc = spn_error_set(err, SPN_ENOMEM, "image: out of memory resizing %dx%d to %dx%d", (int)sw,
                       (int)sh, (int)dw, (int)dh);
    goto out_free;
  }
  linear_taps(sw, dw, lx);
  linear_taps(sh, dh, ly);
  if (cubic) {
    cubic_taps(sw, dw, cx);
    cubic_taps(sh, dh, cy);
  }
  /* Horizontal pass over every source row (separable filter; the vertical
   * pass then combines rows). Full float precision between passes. */
  for (int32_t y = 0; y < sh; y++) {
    for (int c = 0; c < nc; c++) {
      float *out = rowbuf + ((size_t)y * nc + c) * dw;
      for (int32_t x = 0; x < dw; x++) {
        float v;
        if (area_x) {
          v = 0.0f;
          for (int32_t k = ax.start[x]; k < ax.start[x + 1]; k++)
            v += ax.w[k] * get_px(src, c, ax.idx[k], y);
        } else if (cubic) {
          const int32_t *i = cx[x].i;
          v = cubic_sum(cx[x].w, get_px(src, c, i[0], y), get_px(src, c, i[1], y), get_px(src, c, i[2], y),
                        get_px(src, c, i[3], y));
        } else {
          float a = get_px(src, c, lx[x].i0, y), b = get_px(src, c, lx[x].i1, y);
          v = a + (b - a) * lx[x].w1;
        }
        out[x] = v;
      }
    }
  }
  for (int32_t y = 0; y < dh; y++) {
    for (int c = 0; c < nc; c++) {
      for (int32_t x = 0; x < dw; x++) {
        float v;
        if (area_y) {
          v = 0.0f;
          for (int32_t k = ay.start[y]; k < ay.start[y + 1]; k++)
            v += ay.w[k] * rowbuf[((size_t)ay.idx[k] * nc + c) * dw + x];
        } else if (cubic) {
          const int32_t *i = cy[y].i;
          v = cubic_sum(cy[y].w, rowbuf[((size_t)i[0] * nc + c) * dw + x], rowbuf[((size_t)i[1] * nc + c) * dw + x],
                        rowbuf[((size_t)i[2] * nc + c) * dw + x], rowbuf[((size_t)i[3] * nc + c) * dw + x]);
        } else {
          float a = rowbuf[((size_t)ly[y].i0 * nc + c) * dw + x];
          float b = rowbuf[((size_t)ly[y].i1 * nc + c) * dw + x];
          v = a + (b - a) * ly[y].w1;
        }
        put_px(dst, c, x, y, v);
      }
    }
  }
out_free:
  area_taps_free(&ax);
  area_taps_free(&ay);
  free(rowbuf);
  free(lx);
  free(ly);
  free(cx);
  free(cy);
  return rc;
}

/* ---- colour ---- */

static inline void rgb_to_yuv(const spn_yuv_coeffs_t *k, float r, float g, float b, float *y, float *u, float *v) {
  *y = k->yoff + (k->to_y[0] * r + k->to_y[1] * g + k->to_y[2] * b) / 255.0f;
  *u = 128.0f + (k->to_u[0] * r + k->to_u[1] * g + k->to_u[2] * b) / 255.0f;
  *v = 128.0f + (k->to_v[0] * r + k->to_v[1] * g + k->to_v[2] * b) / 255.0f;
}

static inline void yuv_to_rgb(const spn_yuv_coeffs_t *k, float y, float u, float v, float *r, float *g, float *b) {
  float yy = k->ys * (y - k->yoff), cb = u - 128.0f, cr = v - 128.0f;
  *r = yy + k->rv * cr;
  *g = yy - k->gu * cb - k->gv * cr;
  *b = yy + k->bu * cb;
}

const char *spn_matrix_name(int32_t m) {
  switch (m) {
  case SPN_MATRIX_BT709: return "bt709";
  case 5: case SPN_MATRIX_BT601: return "bt601";
  case SPN_MATRIX_SMPTE240M: return "smpte240m";
  case SPN_MATRIX_BT2020: return "bt2020";
  default: return "unknown";
  }
}

int32_t spn_matrix_from_name(const char *name) {
  static const struct { const char *name; int32_t m; } names[] = {
      {"bt709", SPN_MATRIX_BT709},  {"bt601", SPN_MATRIX_BT601},       {"smpte170m", SPN_MATRIX_BT601},
      {"bt470bg", SPN_MATRIX_BT601}, {"smpte240m", SPN_MATRIX_SMPTE240M}, {"bt2020", SPN_MATRIX_BT2020},
      {"bt2020nc", SPN_MATRIX_BT2020}};
  for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i].name))
      return names[i].m;
  return 0;
}

/* Read/write one pixel's R,G,B of a packed u8 RGB/BGR image. */
static inline void rgb_get(const spn_image_t *im, int32_t x, int32_t y, float rgb[3]) {
  const uint8_t *p = im->data[0] + y * im->stride[0] + (int64_t)x * 3;
  int sw = im->format == SPN_PIXFMT_BGR24;
  rgb[0] = p[sw ? 2 : 0];
  rgb[1] = p[1];
  rgb[2] = p[sw ? 0 : 2];
}

static inline void rgb_put(spn_image_t *im, int32_t x, int32_t y, const float rgb[3]) {
  uint8_t *p = im->data[0] + y * im->stride[0] + (int64_t)x * 3;
  int sw = im->format == SPN_PIXFMT_BGR24;
  p[sw ? 2 : 0] = sat_u8(rgb[0]);
  p[1] = sat_u8(rgb[1]);
  p[sw ? 0 : 2] = sat_u8(rgb[2]);
}

/* Chroma sample (cx, cy) of a 4:2:0 image: pointers to Cb and Cr. */
static inline void chroma_ptrs(const spn_image_t *im, int32_t cx, int32_t cy, uint8_t **u, uint8_t **v) {
  if (im->format == SPN_PIXFMT_NV12) {
    uint8_t *p = im->data[1] + cy * im->stride[1] + (int64_t)cx * 2;
    *u = p;
    *v = p + 1;
  } else {
    *u = im->data[1] + cy * im->stride[1] + cx;
    *v = im->data[2] + cy * im->stride[2] + cx;
  }
}

static int is_yuv(int32_t f) {
  return f == SPN_PIXFMT_NV12 || f == SPN_PIXFMT_YUV420P;
}
static int is_rgb_u8(int32_t f) {
  return f == SPN_PIXFMT_RGB24 || f == SPN_PIXFMT_BGR24;
}

/* 4:2:0 → RGB, one row. Chroma is upsampled bilinearly at the siting of
 * MPEG-2, H.264 and HEVC's default (chroma_sample_loc_type 0, "left"): a
 * chroma sample sits on the even luma columns and midway between its two
 * luma rows. So pixel (x, y) reads the chroma columns c0 = x/2 and c1 (c0 for
 * even x, c0 + 1 for odd x) of chroma row y/2 (weight 3/4) and of the row on
 * the far side of y's sample (y/2 - 1 for even y, y/2 + 1 for odd; weight
 * 1/4), edges repeated:
 *   C = (3 (C[y/2][c0] + C[y/2][c1]) + C[y2][c0] + C[y2][c1]) / 8
 * The sum is an integer and the division by 8 exact, so the chroma each
 * pixel gets is the same wherever it is computed (cuda/kernels/image.cu
 * computes it so); then yuv_to_rgb and sat_u8. The SSE2 part runs the same
 * float operations four pixels at a time (no fused multiply-add, the same
 * clamp and round), so it writes the scalar loop's bytes. */
enum { YUV_SPAN = 64 };

/* The Cb and Cr of pixels x0 .. x0 + n - 1 of row y (0..255, in steps of 1/8). */
static void chroma_span(const spn_image_t *im, int32_t y, int32_t x0, int32_t n, float *cb, float *cr) {
  int32_t cw = (im->width + 1) / 2, ch = (im->height + 1) / 2, cy = y / 2;
  int32_t cy2 = (y & 1) ? (cy + 1 < ch ? cy + 1 : cy) : (cy > 0 ? cy - 1 : 0);
  int nv12 = im->format == SPN_PIXFMT_NV12, step = nv12 ? 2 : 1;
  const uint8_t *u0 = im->data[1] + cy * im->stride[1], *u1 = im->data[1] + cy2 * im->stride[1];
  const uint8_t *v0 = nv12 ? u0 + 1 : im->data[2] + cy * im->stride[2];
  const uint8_t *v1 = nv12 ? u1 + 1 : im->data[2] + cy2 * im->stride[2];
  /* each chroma column's 3 · near row + far row (columns past the edge
   * repeat the last), then a pixel's sum is two of them: the same column
   * twice for an even pixel, it and the next for an odd one */
  int32_t j0 = x0 / 2, nj = (x0 + n - 1) / 2 + 2 - j0, j = 0;
  int32_t vu[YUV_SPAN / 2 + 8], vv[YUV_SPAN / 2 + 8];
#if defined(__SSE2__)
  if (!nv12) {
    const __m128i z = _mm_setzero_si128();
    for (; j + 8 <= nj && j0 + j + 8 <= cw; j += 8) {
      __m128i a0 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(u0 + j0 + j)), z);
      __m128i a1 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(u1 + j0 + j)), z);
      __m128i b0 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(v0 + j0 + j)), z);
      __m128i b1 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(v1 + j0 + j)), z);
      __m128i su = _mm_add_epi16(_mm_add_epi16(_mm_add_epi16(a0, a0), a0), a1);
      __m128i sv = _mm_add_epi16(_mm_add_epi16(_mm_add_epi16(b0, b0), b0), b1);
      _mm_storeu_si128((__m128i *)(vu + j), _mm_unpacklo_epi16(su, z));
      _mm_storeu_si128((__m128i *)(vu + j + 4), _mm_unpackhi_epi16(su, z));
      _mm_storeu_si128((__m128i *)(vv + j), _mm_unpacklo_epi16(sv, z));
      _mm_storeu_si128((__m128i *)(vv + j + 4), _mm_unpackhi_epi16(sv, z));
    }
  }
#endif
  for (; j < nj; j++) {
    int32_t c = j0 + j < cw ? j0 + j : cw - 1;
    int64_t a = (int64_t)c * step;
    vu[j] = 3 * u0[a] + u1[a];
    vv[j] = 3 * v0[a] + v1[a];
  }
  int32_t i = 0; /* (x0 is even: a span starts on a chroma column) */
#if defined(__SSE2__)
  const __m128 eighth = _mm_set1_ps(0.125f);
  for (; i + 8 <= n; i += 8) {
    int32_t jj = i / 2;
    __m128i a = _mm_loadu_si128((const __m128i *)(vu + jj)), an = _mm_loadu_si128((const __m128i *)(vu + jj + 1));
    __m128i b = _mm_loadu_si128((const __m128i *)(vv + jj)), bn = _mm_loadu_si128((const __m128i *)(vv + jj + 1));
    __m128 ue = _mm_mul_ps(_mm_cvtepi32_ps(_mm_add_epi32(a, a)), eighth);
    __m128 uo = _mm_mul_ps(_mm_cvtepi32_ps(_mm_add_epi32(a, an)), eighth);
    __m128 ve = _mm_mul_ps(_mm_cvtepi32_ps(_mm_add_epi32(b, b)), eighth);
    __m128 vo = _mm_mul_ps(_mm_cvtepi32_ps(_mm_add_epi32(b, bn)), eighth);
    _mm_storeu_ps(cb + i, _mm_unpacklo_ps(ue, uo));
    _mm_storeu_ps(cb + i + 4, _mm_unpackhi_ps(ue, uo));
    _mm_storeu_ps(cr + i, _mm_unpacklo_ps(ve, vo));
    _mm_storeu_ps(cr + i + 4, _mm_unpackhi_ps(ve, vo));
  }
#endif
  for (; i < n; i++) {
    int32_t c0 = (x0 + i) / 2 - j0, c1 = (x0 + i) & 1 ? c0 + 1 : c0;
    cb[i] = (float)(vu[c0] + vu[c1]) * 0.125f;
    cr[i] = (float)(vv[c0] + vv[c1]) * 0.125f;
  }
}

#if defined(__SSE2__)
/* Four u8 results: sat_u8 as max, min, + 0.5 and truncation. */
static inline __m128i sat_u8_x4(__m128 v) {
  return _mm_cvttps_epi32(_mm_add_ps(_mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(255.0f)),
                                     _mm_set1_ps(0.5f)));
}
#endif

static void yuv420_row_to_rgb(const spn_yuv_coeffs_t *k, const spn_image_t *src, spn_image_t *dst, int32_t y) {
  float cb[YUV_SPAN], cr[YUV_SPAN];
  const uint8_t *ly = src->data[0] + y * src->stride[0];
  uint8_t *out = dst->data[0] + y * dst->stride[0];
  int bgr = dst->format == SPN_PIXFMT_BGR24;
#if defined(__SSE2__)
  const __m128 yoff = _mm_set1_ps(k->yoff), ys = _mm_set1_ps(k->ys), rv = _mm_set1_ps(k->rv);
  const __m128 gu = _mm_set1_ps(k->gu), gv = _mm_set1_ps(k->gv), bu = _mm_set1_ps(k->bu), c0 = _mm_set1_ps(128.0f);
  const __m128i zero = _mm_setzero_si128();
#endif
  for (int32_t x0 = 0; x0 < src->width; x0 += YUV_SPAN) {
    int32_t n = src->width - x0 < YUV_SPAN ? src->width - x0 : YUV_SPAN, i = 0;
    chroma_span(src, y, x0, n, cb, cr);
#if defined(__SSE2__)
    for (; i + 4 <= n; i += 4) {
      int32_t y4;
      memcpy(&y4, ly + x0 + i, 4);
      __m128i yi = _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(y4), zero), zero);
      __m128 yy = _mm_mul_ps(ys, _mm_sub_ps(_mm_cvtepi32_ps(yi), yoff));
      __m128 u = _mm_sub_ps(_mm_loadu_ps(cb + i), c0), v = _mm_sub_ps(_mm_loadu_ps(cr + i), c0);
      int32_t r[4], g[4], b[4];
      _mm_storeu_si128((__m128i *)r, sat_u8_x4(_mm_add_ps(yy, _mm_mul_ps(rv, v))));
      _mm_storeu_si128((__m128i *)g, sat_u8_x4(_mm_sub_ps(_mm_sub_ps(yy, _mm_mul_ps(gu, u)), _mm_mul_ps(gv, v))));
      _mm_storeu_si128((__m128i *)b, sat_u8_x4(_mm_add_ps(yy, _mm_mul_ps(bu, u))));
      const int32_t *first = bgr ? b : r, *last = bgr ? r : b;
      uint8_t *p = out + (int64_t)(x0 + i) * 3;
      for (int j = 0; j < 4; j++, p += 3) {
        p[0] = (uint8_t)first[j];
        p[1] = (uint8_t)g[j];
        p[2] = (uint8_t)last[j];
      }
    }
#endif
    for (; i < n; i++) {
      float rgb[3];
      yuv_to_rgb(k, ly[x0 + i], cb[i], cr[i], &rgb[0], &rgb[1], &rgb[2]);
      rgb_put(dst, x0 + i, y, rgb);
    }
  }
}

int32_t spn_image_convert(const spn_image_t *src, spn_image_t *dst, spn_error_t *err) {
  return spn_image_convert_colour(src, dst, NULL, err);
}

int32_t spn_image_convert_colour(const spn_image_t *src, spn_image_t *dst, const spn_colour_t *c,
                                 spn_error_t *err) {
  int32_t rc;
  spn_yuv_coeffs_t k = {0};
  if ((rc = check_image(src, "convert source", err)) || (rc = check_image(dst, "convert destination", err)) ||
      (rc = check_same(src, dst, "convert", err)) || (rc = spn_colour_coeffs(c, &k, err)))
    return rc;
  int32_t w = src->width, h = src->height, sf = src->format, df = dst->format;
  if (sf == df)
    return spn_image_copy(src, dst, err);
  if (is_rgb_u8(sf) && is_rgb_u8(df)) {
    float rgb[3];
    for (int32_t y = 0; y < h; y++)
      for (int32_t x = 0; x < w; x++) {
        rgb_get(src, x, y, rgb);
        rgb_put(dst, x, y, rgb);
      }
    return SPN_OK;
  }
  if (is_rgb_u8(sf) && df == SPN_PIXFMT_GRAY8) {
    float rgb[3];
    for (int32_t y = 0; y < h; y++)
      for (int32_t x = 0; x < w; x++) {
        rgb_get(src, x, y, rgb);
        dst->data[0][y * dst->stride[0] + x] = sat_u8(0.299f * rgb[0] + 0.587f * rgb[1] + 0.114f * rgb[2]);
      }
    return SPN_OK;
  }
  if (is_rgb_u8(sf) && is_yuv(df)) {
    float rgb[3], yv, u, v;
    for (int32_t y = 0; y < h; y++)
      for (int32_t x = 0; x < w; x++) {
        rgb_get(src, x, y, rgb);
        rgb_to_yuv(&k, rgb[0], rgb[1], rgb[2], &yv, &u, &v);
        dst->data[0][y * dst->stride[0] + x] = sat_u8(yv);
      }
    for (int32_t cy = 0; cy < (h + 1) / 2; cy++)
      for (int32_t cx = 0; cx < (w + 1) / 2; cx++) {
        float su = 0, sv = 0;
        int n = 0;
        for (int32_t y = 2 * cy; y < 2 * cy + 2 && y < h; y++)
          for (int32_t x = 2 * cx; x < 2 * cx + 2 && x < w; x++) {
            rgb_get(src, x, y, rgb);
            rgb_to_yuv(&k, rgb[0], rgb[1], rgb[2], &yv, &u, &v);
            su += u;
            sv += v;
            n++;
          }
        uint8_t *pu, *pv;
        chroma_ptrs(dst, cx, cy, &pu, &pv);
        *pu = sat_u8(su / (float)n);
        *pv = sat_u8(sv / (float)n);
      }
    return SPN_OK;
  }
  if (is_yuv(sf) && is_rgb_u8(df)) {
    for (int32_t y = 0; y < h; y++)
      yuv420_row_to_rgb(&k, src, dst, y);
    return SPN_OK;
  }
  if (is_yuv(sf) && is_yuv(df)) {
    for (int32_t y = 0; y < h; y++)
      memcpy(dst->data[0] + y * dst->stride[0], src->data[0] + y * src->stride[0], (size_t)w);
    for (int32_t cy = 0; cy < (h + 1) / 2; cy++)
      for (int32_t cx = 0; cx < (w + 1) / 2; cx++) {
        uint8_t *su, *sv, *du, *dv;
        chroma_ptrs(src, cx, cy, &su, &sv);
        chroma_ptrs(dst, cx, cy, &du, &dv);
        *du = *su;
        *dv = *sv;
      }
    return SPN_OK;
  }
  return spn_error_set(err, SPN_EUNSUPPORTED, "image: conversion from %s to %s is not supported",
                       spn_pixfmt_name(sf), spn_pixfmt_name(df));
}

/* Destination channel c of a planar float RGB/BGR image holds which RGB index. */
static inline int float_chan_rgb(int32_t f, int c) {
  return f == SPN_PIXFMT_BGRF32P ? 2 - c : c;
}

int32_t spn_image_to_float(const spn_image_t *src, spn_image_t *dst, const float mean[3],
                           const float scale[3], spn_error_t *err) {
  int32_t rc;
  if ((rc = check_image(src, "to_float source", err)) || (rc = check_image(dst, "to_float destination", err)) ||
      (rc = check_same(src, dst, "to_float", err)))
    return rc;
  if (!is_rgb_u8(src->format) || (dst->format != SPN_PIXFMT_RGBF32P && dst->format != SPN_PIXFMT_BGRF32P))
    return spn_error_set(err, SPN_EUNSUPPORTED, "image: to_float from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  float rgb[3];
  for (int32_t y = 0; y < src->height; y++)
    for (int32_t x = 0; x < src->width; x++) {
      rgb_get(src, x, y, rgb);
      for (int c = 0; c < 3; c++) {
        float m = mean ? mean[c] : 0.0f, s = scale ? scale[c] : 1.0f;
        ((float *)(dst->data[c] + y * dst->stride[c]))[x] = (rgb[float_chan_rgb(dst->format, c)] - m) * s;
      }
    }
  return SPN_OK;
}

int32_t spn_image_from_float(const spn_image_t *src, spn_image_t *dst, const float mean[3],
                             const float scale[3], spn_error_t *err) {
  int32_t rc;
  if ((rc = check_image(src, "from_float source", err)) ||
      (rc = check_image(dst, "from_float destination", err)) || (rc = check_same(src, dst, "from_float", err)))
    return rc;
  if (!is_rgb_u8(dst->format) || (src->format != SPN_PIXFMT_RGBF32P && src->format != SPN_PIXFMT_BGRF32P))
    return spn_error_set(err, SPN_EUNSUPPORTED, "image: from_float from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  for (int c = 0; c < 3; c++)
    if (scale && scale[c] == 0.0f)
      return spn_error_set(err, SPN_EINVAL, "image: from_float with a zero scale");
  float rgb[3];
  for (int32_t y = 0; y < src->height; y++)
    for (int32_t x = 0; x < src->width; x++) {
      for (int c = 0; c < 3; c++) {
        float m = mean ? mean[c] : 0.0f, s = scale ? scale[c] : 1.0f;
        float v = ((const float *)(src->data[c] + y * src->stride[c]))[x];
        rgb[float_chan_rgb(src->format, c)] = v / s + m;
      }
      rgb_put(dst, x, y, rgb);
    }
  return SPN_OK;
}

/* ---- affine warp ---- */

int32_t spn_affine_invert(const double m[6], double inv[6], spn_error_t *err) {
  double det = m[0] * m[4] - m[1] * m[3];
  if (fabs(det) < 1e-12)
    return spn_error_set(err, SPN_EINVAL, "image: affine matrix is singular (det %g)", det);
  double a = m[4] / det, b = -m[1] / det, d = -m[3] / det, e = m[0] / det;
  inv[0] = a;
  inv[1] = b;
  inv[2] = -(a * m[2] + b * m[5]);
  inv[3] = d;
  inv[4] = e;
  inv[5] = -(d * m[2] + e * m[5]);
  return SPN_OK;
}

int32_t spn_image_warp_affine(const spn_image_t *src, spn_image_t *dst, const double m[6],
                              uint32_t flags, int32_t border, const double border_value[4],
                              spn_error_t *err) {
  int32_t rc;
  if ((rc = check_image(src, "warp source", err)) || (rc = check_image(dst, "warp destination", err)))
    return rc;
  if (src->format != dst->format || !(is_u8_packed(src->format) || is_float_planar(src->format)))
    return spn_error_set(err, SPN_EUNSUPPORTED, "image: warp from %s to %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  if (border != SPN_BORDER_CONSTANT && border != SPN_BORDER_REPLICATE)
    return spn_error_set(err, SPN_EINVAL, "image: unknown border mode %d", (int)border);
  double im[6];
  if (flags & SPN_WARP_INVERSE_MAP)
    memcpy(im, m, sizeof im);
  else if ((rc = spn_affine_invert(m, im, err)))
    return rc;
  int nc = channels_of(src->format);
  int32_t sw = src->width, sh = src->height;
  for (int32_t y = 0; y < dst->height; y++)
    for (int32_t x = 0; x < dst->width; x++) {
      double sx = im[0] * x + im[1] * y + im[2];
      double sy = im[3] * x + im[4] * y + im[5];
      double fx0 = floor(sx), fy0 = floor(sy);
      float wx = (float)(sx - fx0), wy = (float)(sy - fy0);
      /* Keep far-away coordinates in int range; they are outside anyway. */
      if (fx0 < -4.0 || fx0 > sw + 4.0)
        fx0 = fx0 < 0 ? -4.0 : sw + 4.0;
      if (fy0 < -4.0 || fy0 > sh + 4.0)
        fy0 = fy0 < 0 ? -4.0 : sh + 4.0;
      int32_t x0 = (int32_t)fx0, y0 = (int32_t)fy0;
      for (int c = 0; c < nc; c++) {
        float tap[4];
        for (int k = 0; k < 4; k++) {
          int32_t tx = x0 + (k & 1), ty = y0 + (k >> 1);
          if (tx < 0 || ty < 0 || tx >= sw || ty >= sh) {
            if (border == SPN_BORDER_CONSTANT) {
              tap[k] = border_value ? (float)border_value[c] : 0.0f;
              continue;
            }
            tx = tx < 0 ? 0 : (tx >= sw ? sw - 1 : tx);
            ty = ty < 0 ? 0 : (ty >= sh ? sh - 1 : ty);
          }
          tap[k] = get_px(src, c, tx, ty);
        }
        float top = tap[0] + (tap[1] - tap[0]) * wx;
        float bot = tap[2] + (tap[3] - tap[2]) * wx;
        put_px(dst, c, x, y, top + (bot - top) * wy);
      }
    }
  return SPN_OK;
}

/* ---- masks and paste ---- */

int32_t spn_image_feather_mask(spn_image_t *mask, float feather, spn_error_t *err) {
  int32_t rc = check_image(mask, "mask", err);
  if (rc)
    return rc;
  if (mask->format != SPN_PIXFMT_GRAYF32)
    return spn_error_set(err, SPN_EINVAL, "image: a mask must be grayf32, not %s", spn_pixfmt_name(mask->format));
  int32_t w = mask->width, h = mask->height;
  for (int32_t y = 0; y < h; y++) {
    float dy = fminf(y + 0.5f, h - y - 0.5f);
    float ay = feather > 0 ? fminf(fmaxf(dy / feather, 0.0f), 1.0f) : 1.0f;
    float *row = (float *)(mask->data[0] + y * mask->stride[0]);
    for (int32_t x = 0; x < w; x++) {
      float dx = fminf(x + 0.5f, w - x - 0.5f);
      float ax = feather > 0 ? fminf(fmaxf(dx / feather, 0.0f), 1.0f) : 1.0f;
      row[x] = ax * ay;
    }
  }
  return SPN_OK;
}

int32_t spn_image_paste(spn_image_t *dst, const spn_image_t *src, int32_t x, int32_t y,
                        const spn_image_t *mask, spn_error_t *err) {
  int32_t rc;
  if ((rc = check_image(src, "paste source", err)) || (rc = check_image(dst, "paste destination", err)))
    return rc;
  int ok = (is_u8_packed(src->format) && is_u8_packed(dst->format)) ||
           (is_float_planar(src->format) && is_float_planar(dst->format));
  if (!ok || channels_of(src->format) != channels_of(dst->format))
    return spn_error_set(err, SPN_EUNSUPPORTED, "image: paste of %s onto %s is not supported",
                         spn_pixfmt_name(src->format), spn_pixfmt_name(dst->format));
  if (mask) {
    if ((rc = check_image(mask, "paste mask", err)))
      return rc;
    if (mask->format != SPN_PIXFMT_GRAYF32 || mask->width != src->width || mask->height != src->height)
      return spn_error_set(err, SPN_EINVAL, "image: paste mask must be grayf32 %dx%d", (int)src->width,
                           (int)src->height);
  }
  /* RGB <-> BGR pastes swap channels so colours stay right. */
  int swap = (src->format == SPN_PIXFMT_RGB24 && dst->format == SPN_PIXFMT_BGR24) ||
             (src->format == SPN_PIXFMT_BGR24 && dst->format == SPN_PIXFMT_RGB24) ||
             (src->format == SPN_PIXFMT_RGBF32P && dst->format == SPN_PIXFMT_BGRF32P) ||
             (src->format == SPN_PIXFMT_BGRF32P && dst->format == SPN_PIXFMT_RGBF32P);
  int nc = channels_of(src->format);
  for (int32_t sy = 0; sy < src->height; sy++) {
    int64_t dy = (int64_t)y + sy;
    if (dy < 0 || dy >= dst->height)
      continue;
    for (int32_t sx = 0; sx < src->width; sx++) {
      int64_t dx = (int64_t)x + sx;
      if (dx < 0 || dx >= dst->width)
        continue;
      float a = mask ? ((const float *)(mask->data[0] + sy * mask->stride[0]))[sx] : 1.0f;
      a = fminf(fmaxf(a, 0.0f), 1.0f);
      for (int c = 0; c < nc; c++) {
        int dc = swap ? 2 - c : c;
        float s = get_px(src, c, sx, sy), d = get_px(dst, dc, (int32_t)dx, (int32_t)dy);
        put_px(dst, dc, (int32_t)dx, (int32_t)dy, a * s + (1.0f - a) * d);
      }
    }
  }
  return SPN_OK;
}

/* ---- rotation ---- */

int32_t spn_image_rotate(const spn_image_t *src, spn_image_t *dst, int32_t degrees_cw,
                         spn_error_t *err) {
  int32_t rc;
  if ((rc = check_image(src, "rotate source", err)) || (rc = check_image(dst, "rotate destination", err)))
    return rc;
  int32_t deg = ((degrees_cw % 360) + 360) % 360;
  if (deg % 90)
    return spn_error_set(err, SPN_EINVAL, "image: rotation by %d degrees (only multiples of 90)", (int)degrees_cw);
  if (src->format != dst->format)
    return spn_error_set(err, SPN_EINVAL, "image: rotate between %s and %s", spn_pixfmt_name(src->format),
                         spn_pixfmt_name(dst->format));
  int quarter = deg == 90 || deg == 270;
  int32_t ew = quarter ? src->height : src->width, eh = quarter ? src->width : src->height;
  if (dst->width != ew || dst->height != eh)
    return spn_error_set(err, SPN_EINVAL, "image: rotate by %d needs a %dx%d destination", (int)deg, (int)ew,
                         (int)eh);
  if (deg == 0)
    return spn_image_copy(src, dst, err);
  if (quarter && is_yuv(src->format) && ((src->width | src->height) & 1))
    return spn_error_set(err, SPN_EINVAL, "image: rotating 4:2:0 by %d needs even sizes", (int)deg);
  for (int32_t p = 0; p < src->nplanes; p++) {
    int32_t pw, ph;
    spn_pixfmt_plane_size(src->format, src->width, src->height, p, &pw, &ph);
    int32_t es = plane_elem_size(src->format, p);
    for (int32_t y = 0; y < ph; y++)
      for (int32_t x = 0; x < pw; x++) {
        int32_t nx, ny;
        if (deg == 90) {
          nx = ph - 1 - y;
          ny = x;
        } else if (deg == 180) {
          nx = pw - 1 - x;
          ny = ph - 1 - y;
        } else {
          nx = y;
          ny = pw - 1 - x;
        }
        memcpy(dst->data[p] + ny * dst->stride[p] + (int64_t)nx * es,
               src->data[p] + y * src->stride[p] + (int64_t)x * es, (size_t)es);
      }
  }
  return SPN_OK;
}
