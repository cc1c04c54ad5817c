/* stage-convert.c — `convert`, pixel format conversion
 * (libspindle-convert.so).
 *
 * The runtime inserts it on an edge whose two ends share no pixel format
 * when the config allows it (convert = "auto" on the edge or the consuming
 * stage; docs/pipelines.md), configured with the format the consumer takes;
 * it may also be written in a config like any stage. Every message's
 * "frame" item is converted with spn-image (4:2:0 in the matrix and range
 * its "image" item gives, decode's reading of the file, else BT.601
 * limited; the same arithmetic as the CUDA kernels) and its "image" item
 * rewritten (the colour kept, so encode records it);
 * every other item is passed on by reference. Layouts as decode gives them:
 * rgb24/bgr24 (H,W,3) u8, rgbf32p/bgrf32p (3,H,W) f32 in [0,255], nv12 and
 * yuv420p the tight planes as one (N) u8 vector beside the "image" item.
 */
#include <stdlib.h>
#include <string.h>

#include "spindle/image.h"
#include "spindle/plugin.h"
#include "media-decode.h"


typedef struct convert_config {
  char *pixel_format;
} convert_config_t;

static const spn_config_field_t convert_schema[] = {
    {.key = "pixel_format", .type = SPN_CONFIG_STRING, .offset = offsetof(convert_config_t, pixel_format),
     .doc = "format to give: rgb24, bgr24, rgbf32p, bgrf32p, nv12, yuv420p", .def_str = "rgb24"},
    {0},
};

static const spn_port_t convert_inputs[] = {{.name = "in", .type = "video"}};
static const spn_port_t convert_outputs[] = {{.name = "out", .type = "video"}};

#define CONVERT_ALL                                                                                   \
  (SPN_FMTSET(SPN_PIX_RGB24) | SPN_FMTSET(SPN_PIX_BGR24) | SPN_FMTSET(SPN_PIX_RGBF32P) |               \
   SPN_FMTSET(SPN_PIX_BGRF32P) | SPN_FMTSET(SPN_PIX_NV12) | SPN_FMTSET(SPN_PIX_YUV420P))
static const spn_port_caps_t convert_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .pixel_formats = CONVERT_ALL}};

static bool format_ok(int32_t f) { return f > 0 && f < 32 && (CONVERT_ALL & SPN_FMTSET(f)); }

static int32_t convert_port_caps(const void *config, bool is_output, uint32_t port, spn_port_caps_t *caps,
                                 spn_error_t *err) {
  const convert_config_t *c = config;
  (void)port;
  if (!is_output)
    return SPN_OK;
  int32_t f = spn_pixfmt_from_name(c->pixel_format);
  if (!format_ok(f))
    return spn_error_set(err, SPN_ECONFIG, "pixel_format \"%s\" is not rgb24, bgr24, rgbf32p, bgrf32p, nv12 or yuv420p",
                         c->pixel_format);
  caps->pixel_formats = SPN_FMTSET(f);
  return SPN_OK;
}

static int32_t convert_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  spn_port_caps_t caps = {.struct_size = sizeof caps};
  spn_error_t e = SPN_ERROR_INIT;
  int32_t rc = convert_port_caps(config, true, 0, &caps, &e);
  if (rc != SPN_OK)
    return spn_error_set(err, rc, "stage \"%s\": %.900s", host->stage_get_name(stage), e.msg);
  *state = (void *)(intptr_t)spn_pixfmt_from_name(((const convert_config_t *)config)->pixel_format);
  return SPN_OK;
}

/* The frame's format: the "image" item's, else the tensor's layout with
 * the negotiated input format telling rgb from bgr. */
static int32_t frame_format(spn_stage_t *stage, spn_msg_t *msg, const spn_tensor_t *t, int32_t *fmt, int32_t *w,
                            int32_t *h, spn_media_image_meta_t *colour, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int64_t mi = host->msg_find(msg, SPN_MEDIA_IMAGE_META);
  spn_item_t m = {.struct_size = sizeof m};
  if (mi >= 0 && host->msg_item(msg, (size_t)mi, &m) == SPN_OK && m.meta_size == sizeof(spn_media_image_meta_t)) {
    spn_media_image_meta_t im;
    memcpy(&im, m.meta, sizeof im);
    *colour = im; /* the samples' matrix and range, the source's primaries and transfer */
    *fmt = im.format;
    *w = im.width;
    *h = im.height;
  } else {
    spn_port_format_t pf = {.struct_size = sizeof pf};
    int32_t in = host->stage_port_format(stage, false, 0, &pf, err) == SPN_OK ? pf.pixel_format : 0;
    if (t->dtype == SPN_DTYPE_U8 && t->ndim == 3 && t->shape[2] == 3) {
      *fmt = in == SPN_PIX_BGR24 ? SPN_PIXFMT_BGR24 : SPN_PIXFMT_RGB24;
      *h = (int32_t)t->shape[0];
      *w = (int32_t)t->shape[1];
    } else if (t->dtype == SPN_DTYPE_F32 && t->ndim == 3 && t->shape[0] == 3) {
      *fmt = in == SPN_PIX_BGRF32P ? SPN_PIXFMT_BGRF32P : SPN_PIXFMT_RGBF32P;
      *h = (int32_t)t->shape[1];
      *w = (int32_t)t->shape[2];
    } else {
      return spn_error_set(err, SPN_ETYPE, "frame %llu: not (H,W,3) u8 nor (3,H,W) f32, and no \"image\" item",
                           (unsigned long long)host->msg_envelope(msg)->seq);
    }
  }
  if (!format_ok(*fmt) || *w < 1 || *h < 1 || *w > 16384 || *h > 16384)
    return spn_error_set(err, SPN_ETYPE, "frame %llu: cannot convert a %dx%d %s picture",
                         (unsigned long long)host->msg_envelope(msg)->seq, *w, *h, spn_pixfmt_name(*fmt));
  return SPN_OK;
}

static bool is_float(int32_t f) { return f == SPN_PIXFMT_RGBF32P || f == SPN_PIXFMT_BGRF32P; }

/* src -> dst through spn-image, 4:2:0 in colour *c; float formats go
 * through packed u8. */
static int32_t convert_image(const spn_image_t *src, spn_image_t *dst, const spn_colour_t *c, spn_error_t *err) {
  if (!is_float(src->format) && !is_float(dst->format))
    return spn_image_convert_colour(src, dst, c, err);
  spn_image_t mid = SPN_IMAGE_INIT, mid2 = SPN_IMAGE_INIT;
  int32_t rc = SPN_OK;
  const spn_image_t *u8 = src;
  if (is_float(src->format)) {
    int32_t packed = src->format == SPN_PIXFMT_BGRF32P ? SPN_PIXFMT_BGR24 : SPN_PIXFMT_RGB24;
    if ((rc = spn_image_alloc(&mid, src->width, src->height, packed, err)) == SPN_OK)
      rc = spn_image_from_float(src, &mid, NULL, NULL, err);
    u8 = &mid;
  }
  if (rc == SPN_OK && is_float(dst->format)) {
    int32_t packed = dst->format == SPN_PIXFMT_BGRF32P ? SPN_PIXFMT_BGR24 : SPN_PIXFMT_RGB24;
    if ((rc = spn_image_alloc(&mid2, src->width, src->height, packed, err)) == SPN_OK &&
        (rc = spn_image_convert_colour(u8, &mid2, c, err)) == SPN_OK)
      rc = spn_image_to_float(&mid2, dst, NULL, NULL, err);
  } else if (rc == SPN_OK) {
    rc = spn_image_convert_colour(u8, dst, c, err);
  }
  spn_image_release(&mid);
  spn_image_release(&mid2);
  return rc;
}

static size_t image_bytes(int32_t fmt, int32_t w, int32_t h) {
  size_t n = (size_t)w * (size_t)h, cw = (size_t)(w + 1) / 2, ch = (size_t)(h + 1) / 2;
  if (fmt == SPN_PIXFMT_NV12 || fmt == SPN_PIXFMT_YUV420P)
    return n + 2 * cw * ch;
  return is_float(fmt) ? 3 * n * sizeof(float) : 3 * n;
}

static int32_t convert_one(spn_stage_t *stage, int32_t target, spn_msg_t *in, spn_msg_t **out, spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  int64_t fi = host->msg_find(in, "frame");
  spn_item_t fr = {.struct_size = sizeof fr};
  if (fi < 0 || host->msg_item(in, (size_t)fi, &fr) != SPN_OK || fr.kind != SPN_ITEM_TENSOR)
    return spn_error_set(err, SPN_ETYPE, "frame %llu: no \"frame\" tensor item",
                         (unsigned long long)host->msg_envelope(in)->seq);
  int32_t fmt = 0, w = 0, h = 0, rc;
  /* no "image" item (RGB from a model): BT.601 limited, spn_image_convert's */
  spn_media_image_meta_t im = {.matrix = SPN_MATRIX_BT601, .primaries = 2, .transfer = 2};
  if ((rc = frame_format(stage, in, &fr.tensor, &fmt, &w, &h, &im, err)) != SPN_OK)
    return rc;
  spn_colour_t colour = {im.matrix ? im.matrix : SPN_MATRIX_BT601, im.full_range};
  if (spn_tensor_nbytes(&fr.tensor) != image_bytes(fmt, w, h) || fr.tensor.device_kind != SPN_DEVICE_CPU)
    return spn_error_set(err, SPN_ETYPE, "frame %llu: %zu bytes (on device kind %d) do not hold a %dx%d %s picture",
                         (unsigned long long)host->msg_envelope(in)->seq, spn_tensor_nbytes(&fr.tensor),
                         fr.tensor.device_kind, w, h, spn_pixfmt_name(fmt));
  spn_tensor_t t = {.struct_size = sizeof t, .dtype = is_float(target) ? SPN_DTYPE_F32 : SPN_DTYPE_U8};
  if (target == SPN_PIXFMT_NV12 || target == SPN_PIXFMT_YUV420P) {
    t.ndim = 1;
    t.shape[0] = (int64_t)image_bytes(target, w, h);
  } else if (is_float(target)) {
    t.ndim = 3;
    t.shape[0] = 3;
    t.shape[1] = h;
    t.shape[2] = w;
  } else {
    t.ndim = 3;
    t.shape[0] = h;
    t.shape[1] = w;
    t.shape[2] = 3;
  }
  spn_buffer_t *buf = NULL;
  if ((rc = host->buffer_new(stage, spn_tensor_nbytes(&t), &buf, err)) != SPN_OK)
    return rc;
  spn_image_t src = SPN_IMAGE_INIT, dst = SPN_IMAGE_INIT;
  if ((rc = spn_image_wrap(&src, host->buffer_data(fr.buffer), w, h, fmt, err)) == SPN_OK &&
      (rc = spn_image_wrap(&dst, host->buffer_data(buf), w, h, target, err)) == SPN_OK &&
      (rc = convert_image(&src, &dst, &colour, err)) == SPN_OK &&
      (rc = host->msg_new_from(stage, in, out, err)) == SPN_OK)
    rc = host->msg_add_tensor(*out, "frame", &t, buf, err);
  /* Every other item goes on by reference; "image" says the new format. */
  for (size_t i = 0; rc == SPN_OK && i < host->msg_item_count(in); i++) {
    spn_item_t it = {.struct_size = sizeof it};
    if ((rc = host->msg_item(in, i, &it)) != SPN_OK || !strcmp(it.name, "frame"))
      continue;
    if (it.kind == SPN_ITEM_TENSOR) {
      rc = host->msg_add_tensor(*out, it.name, &it.tensor, it.buffer, err);
    } else if (!strcmp(it.name, SPN_MEDIA_IMAGE_META)) {
      continue;
    } else {
      rc = host->msg_add_meta(*out, it.name, it.meta, it.meta_size, err);
    }
  }
  if (rc == SPN_OK) {
    im.width = w;
    im.height = h;
    im.format = target;
    im.matrix = colour.matrix;
    rc = host->msg_add_meta(*out, SPN_MEDIA_IMAGE_META, &im, sizeof im, err);
  }
  host->buffer_unref(&buf);
  if (rc != SPN_OK)
    host->msg_free(out);
  return rc;
}

static int32_t convert_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                               spn_error_t *err) {
  const spn_host_api_t *host = spn_stage_host(stage);
  (void)job_states;
  int32_t target = (int32_t)(intptr_t)state;
  for (size_t i = 0; i < n; i++) {
    spn_msg_t *out = NULL;
    spn_error_t e = SPN_ERROR_INIT;
    int32_t rc = convert_one(stage, target, msgs[i], &out, &e);
    if (rc != SPN_OK) {
      host->fail_job(stage, host->msg_envelope(msgs[i])->job_id, rc, e.msg);
      continue;
    }
    if ((rc = host->emit(stage, 0, &out, err)) != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static int32_t convert_init(const spn_host_api_t *h, spn_plugin_t *plugin, spn_error_t *err) {
  if (h->struct_size < offsetof(spn_host_api_t, stage_port_format) + sizeof h->stage_port_format)
    return spn_error_set(err, SPN_EABI, "needs a host with ABI 1.1 formats (stage_port_format)");
  static const spn_stage_kind_t kind = {
      .struct_size = sizeof(spn_stage_kind_t),
      .name = "convert",
      .doc = "converts frames to another pixel format (inserted by convert = \"auto\")",
      .schema = convert_schema,
      .config_size = sizeof(convert_config_t),
      .inputs = convert_inputs,
      .n_inputs = 1,
      .outputs = convert_outputs,
      .n_outputs = 1,
      .device_need = SPN_NEED_CPU,
      .max_batch = 1,
      .create = convert_create,
      .process = convert_process,
      .input_caps = convert_caps,
      .output_caps = convert_caps,
      .port_caps = convert_port_caps,
  };
  return h->register_kind(plugin, &kind, err);
}

SPN_PLUGIN_DEFINE(convert, .version = "1.0", .license = "Apache-2.0", .init = convert_init)
