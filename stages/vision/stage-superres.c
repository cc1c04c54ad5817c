/* stage-superres.c — the `superres` stage kind of the vision plugin.
 *
 * Input port "video": messages with a tensor item "frame", (H,W,3) u8 RGB in
 * host memory. The frame becomes float RGB 0..1 (1,3,H,W), is cut into tiles
 * (tile.h) that the engine runs through the model (host->model_run), and the
 * stitched (1,3,sH,sW) result goes back to u8 (clamped, rounded) as the new
 * "frame" of an output message on port "video". Every other item travels
 * along; a "faces" item has its boxes and landmarks scaled by s so they still
 * point at the faces. Messages without a frame are forwarded untouched.
 *
 * With `region = "faces"` only the faces are run through the model: the
 * output frame is the input upscaled bilinearly (spn_image_resize), and each
 * box of the "faces" item, grown by `face_margin` of its width/height on each
 * side and clamped to the frame, is cut out, upscaled by the model (tiled),
 * and pasted over the bilinear frame with a feathered edge of `feather`
 * output pixels (spn_image_feather_mask + spn_image_paste). A frame without
 * faces is only upscaled bilinearly.
 *
 * The model is loaded once per instance in create() (the engine shares it
 * between instances on a device). With `model` empty the embedded
 * espcn-x2.onnx installed with Spindle is used. A bad frame or a failing
 * model run fails that frame's job only.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spindle/image.h"
#include "spindle/plugin.h"

#include "plugin-vision.h"
#include "tile.h"

#ifndef SPN_VISION_DEFAULT_SR_MODEL
#define SPN_VISION_DEFAULT_SR_MODEL "espcn-x2.onnx"
#endif

typedef struct sr_config {
  char *model;
  bool model_optional;
  int64_t scale;
  int64_t tile;
  int64_t tile_pad;
  char *region;
  double face_margin;
  double feather;
} sr_config_t;

static const spn_config_field_t k_schema[] = {
    {.key = "model", .type = SPN_CONFIG_PATH, .offset = offsetof(sr_config_t, model),
     .doc = "super-resolution ONNX model, float RGB 0..1 in and out: a file, or a model name from "
            "`spindle model list` (empty: the embedded espcn-x2)", .def_str = ""},
    {.key = "model_optional", .type = SPN_CONFIG_BOOL, .offset = offsetof(sr_config_t, model_optional),
     .doc = "a model name not fetched yet falls back to the embedded espcn-x2 (logged; scale must be 2)",
     .def_int = 0},
    {.key = "scale", .type = SPN_CONFIG_INT, .offset = offsetof(sr_config_t, scale),
     .doc = "the model's upscaling factor", .def_int = 2, .min = 1, .max = 8},
    {.key = "tile", .type = SPN_CONFIG_INT, .offset = offsetof(sr_config_t, tile),
     .doc = "tile side in input pixels", .def_int = 256, .min = 8, .max = 8192},
    {.key = "tile_pad", .type = SPN_CONFIG_INT, .offset = offsetof(sr_config_t, tile_pad),
     .doc = "context pixels around each tile (>= the model's receptive radius: no seams)", .def_int = 10, .min = 0,
     .max = 512},
    {.key = "region", .type = SPN_CONFIG_STRING, .offset = offsetof(sr_config_t, region),
     .doc = "what the model upscales: \"frame\" (all of it) or \"faces\" (the \"faces\" boxes; the rest bilinear)",
     .def_str = "frame"},
    {.key = "face_margin", .type = SPN_CONFIG_FLOAT, .offset = offsetof(sr_config_t, face_margin),
     .doc = "region = \"faces\": fraction of a box's width/height added on each side", .def_float = 0.25,
     .min = 0, .max = 4},
    {.key = "feather", .type = SPN_CONFIG_FLOAT, .offset = offsetof(sr_config_t, feather),
     .doc = "region = \"faces\": width in output pixels of the blended edge of a pasted face", .def_float = 8,
     .min = 0, .max = 256},
    {.key = NULL},
};

/* "any": plain video (decode, lipsync) or facedetect's "faces" stream, which is
 * the same frames with a "faces" item added (region = "faces" needs it). */
static const spn_port_t k_inputs[] = {{.name = "video", .type = "any"}};
static const spn_port_t k_outputs[] = {{.name = "video", .type = "video"}};

typedef struct sr_state {
  const spn_host_api_t *host;
  spn_stage_t *stage;
  spn_model_t *model;
  spn_tile_params_t tp;
  float *in, *out; /* planar float frames, reused */
  size_t in_cap, out_cap;
  bool faces_only;   /* region = "faces" */
  double margin;     /* face_margin */
  float feather;     /* feather, output pixels */
} sr_state_t;

/* The embedded espcn-x2: installed under share/spindle/models, or the source
 * tree's copy when running from the build tree (not installed). */
static const char *embedded_model(void) {
#ifdef SPN_VISION_SOURCE_SR_MODEL
  if (access(SPN_VISION_DEFAULT_SR_MODEL, R_OK) != 0 && access(SPN_VISION_SOURCE_SR_MODEL, R_OK) == 0)
    return SPN_VISION_SOURCE_SR_MODEL;
#endif
  return SPN_VISION_DEFAULT_SR_MODEL;
}

static int32_t sr_create(spn_stage_t *stage, const void *config, void **state, spn_error_t *err) {
  const sr_config_t *cfg = config;
  const spn_host_api_t *host = spn_stage_host(stage);
  if (!host || !cfg)
    return spn_error_set(err, SPN_ESTATE, "superres: plugin not initialised");
  int32_t hc = vision_check_host(host, true, err);
  if (hc != SPN_OK)
    return hc;
  if (!host->model_load || !host->model_run)
    return spn_error_set(err, SPN_EUNSUPPORTED, "superres: the host has no model engine");
  bool faces_only = false;
  if (cfg->region && !strcmp(cfg->region, "faces"))
    faces_only = true;
  else if (cfg->region && cfg->region[0] && strcmp(cfg->region, "frame"))
    return spn_error_set(err, SPN_EINVAL, "superres %s: key \"region\" must be \"frame\" or \"faces\", not \"%s\"",
                         host->stage_get_name ? host->stage_get_name(stage) : "", cfg->region);
  sr_state_t *st = calloc(1, sizeof *st);
  if (!st)
    return spn_error_set(err, SPN_ENOMEM, "superres: out of memory");
  st->host = host;
  st->stage = stage;
  st->faces_only = faces_only;
  st->margin = cfg->face_margin;
  st->feather = (float)cfg->feather;
  char mpath[4096], hint[1024] = "";
  int32_t use = 0, rc = SPN_OK;
  if (cfg->model && cfg->model[0])
    use = vision_model_path(host, stage, "superres", cfg->model, cfg->model_optional, "the embedded espcn-x2",
                                 mpath, sizeof mpath, hint, sizeof hint);
  if (use == 0 && cfg->scale != 2)
    rc = spn_error_set(err, SPN_ECONFIG, "the embedded espcn-x2 upscales by 2, not %d (set scale = 2)",
                       (int)cfg->scale);
  else
    rc = host->model_load(stage, use ? mpath : embedded_model(), &st->model, err);
  if (rc != SPN_OK && hint[0])
    spn_error_prefix(err, "%s", hint);
  if (rc != SPN_OK) {
    spn_error_prefix(err, "superres %s", host->stage_get_name ? host->stage_get_name(stage) : "");
    free(st);
    return rc;
  }
  st->tp = (spn_tile_params_t){.tile = (int32_t)cfg->tile, .tile_pad = (int32_t)cfg->tile_pad,
                               .scale = (int32_t)cfg->scale, .channels = 3, .out_channels = 3};
  *state = st;
  return SPN_OK;
}

static void sr_destroy(spn_stage_t *stage, void *state) {
  sr_state_t *st = state;
  if (!st)
    return;
  if (st->model && st->host->model_release)
    st->host->model_release(stage, &st->model);
  free(st->in);
  free(st->out);
  free(st);
}

/* The tile callback: one engine run per padded tile. */
static int32_t run_tile(void *user, const float *in, int32_t c, int32_t h, int32_t w, float *out, spn_error_t *err) {
  sr_state_t *st = user;
  spn_tensor_t ti = SPN_TENSOR_INIT, to = SPN_TENSOR_INIT;
  ti.dtype = to.dtype = SPN_DTYPE_F32;
  ti.ndim = to.ndim = 4;
  ti.shape[0] = to.shape[0] = 1;
  ti.shape[1] = to.shape[1] = c;
  ti.shape[2] = h;
  ti.shape[3] = w;
  to.shape[2] = (int64_t)h * st->tp.scale;
  to.shape[3] = (int64_t)w * st->tp.scale;
  ti.data = (void *)in;
  to.data = out;
  return st->host->model_run(st->stage, st->model, &ti, 1, &to, 1, err);
}

static int grow(float **p, size_t *cap, size_t n) {
  if (n <= *cap)
    return 0;
  float *q = realloc(*p, n * sizeof *q);
  if (!q)
    return -1;
  *p = q;
  *cap = n;
  return 0;
}

/* Run the model (tiled) on src (RGB24, w x h) into dst (RGB24, s*w x s*h). */
static int32_t model_upscale(sr_state_t *st, const spn_image_t *src, spn_image_t *dst, spn_error_t *err) {
  int32_t H = src->height, W = src->width, s = st->tp.scale;
  size_t n = (size_t)H * W, on = n * (size_t)s * s;
  if (grow(&st->in, &st->in_cap, 3 * n) || grow(&st->out, &st->out_cap, 3 * on))
    return spn_error_set(err, SPN_ENOMEM, "superres: out of memory");
  for (int32_t y = 0; y < H; y++) {
    const uint8_t *row = src->data[0] + y * src->stride[0];
    for (int32_t x = 0; x < W; x++)
      for (int c = 0; c < 3; c++)
        st->in[c * n + (size_t)y * W + x] = (float)row[3 * x + c] / 255.0f;
  }
  int32_t rc = spn_tile_run(st->in, H, W, &st->tp, run_tile, st, st->out, err);
  if (rc != SPN_OK)
    return rc;
  int32_t OW = W * s, OH = H * s;
  for (int32_t y = 0; y < OH; y++) {
    uint8_t *row = dst->data[0] + y * dst->stride[0];
    for (int32_t x = 0; x < OW; x++)
      for (int c = 0; c < 3; c++) {
        float v = st->out[c * on + (size_t)y * OW + x];
        v = v < 0.f ? 0.f : (v > 1.f ? 1.f : v);
        row[3 * x + c] = (uint8_t)(v * 255.0f + 0.5f);
      }
  }
  return SPN_OK;
}

/* region = "faces": upscale one face's box (grown by the margin, clamped) with
 * the model and paste it over dst with a feathered edge. Boxes that are not
 * finite or fall outside the frame are skipped. */
static int32_t paste_face(sr_state_t *st, const spn_image_t *src, spn_image_t *dst, const spn_face_t *f,
                          spn_error_t *err) {
  if (!isfinite(f->x0) || !isfinite(f->y0) || !isfinite(f->x1) || !isfinite(f->y1) || f->x1 <= f->x0 ||
      f->y1 <= f->y0)
    return SPN_OK;
  double mx = st->margin * (f->x1 - f->x0), my = st->margin * (f->y1 - f->y0);
  double fx0 = floor(f->x0 - mx), fy0 = floor(f->y0 - my), fx1 = ceil(f->x1 + mx), fy1 = ceil(f->y1 + my);
  int32_t x0 = fx0 < 0 ? 0 : (fx0 > src->width ? src->width : (int32_t)fx0);
  int32_t y0 = fy0 < 0 ? 0 : (fy0 > src->height ? src->height : (int32_t)fy0);
  int32_t x1 = fx1 < 0 ? 0 : (fx1 > src->width ? src->width : (int32_t)fx1);
  int32_t y1 = fy1 < 0 ? 0 : (fy1 > src->height ? src->height : (int32_t)fy1);
  if (x1 - x0 < 1 || y1 - y0 < 1)
    return SPN_OK;
  int32_t s = st->tp.scale, rc;
  spn_image_t crop = SPN_IMAGE_INIT, up = SPN_IMAGE_INIT, mask = SPN_IMAGE_INIT;
  if ((rc = spn_image_crop(src, x0, y0, x1 - x0, y1 - y0, &crop, err)) != SPN_OK)
    return rc;
  if ((rc = spn_image_alloc(&up, (x1 - x0) * s, (y1 - y0) * s, SPN_PIXFMT_RGB24, err)) != SPN_OK)
    return rc;
  if ((rc = spn_image_alloc(&mask, up.width, up.height, SPN_PIXFMT_GRAYF32, err)) != SPN_OK)
    goto out_up;
  if ((rc = model_upscale(st, &crop, &up, err)) == SPN_OK && (rc = spn_image_feather_mask(&mask, st->feather, err)) == SPN_OK)
    rc = spn_image_paste(dst, &up, x0 * s, y0 * s, &mask, err);
  spn_image_release(&mask);
out_up:
  spn_image_release(&up);
  return rc;
}

/* Build the upscaled message for one frame; *out receives it. */
static int32_t upscale(sr_state_t *st, spn_msg_t *msg, int64_t fidx, spn_msg_t **out, spn_error_t *err) {
  const spn_host_api_t *h = st->host;
  const spn_envelope_t *env = h->msg_envelope(msg);
  unsigned long long seq = env ? (unsigned long long)env->seq : 0ull;
  spn_item_t fr = {.struct_size = sizeof fr};
  int32_t rc = h->msg_item(msg, (size_t)fidx, &fr);
  if (rc != SPN_OK)
    return spn_error_set(err, rc, "superres: frame %llu: cannot read item \"frame\"", seq);
  const spn_tensor_t *t = &fr.tensor;
  if (fr.kind != SPN_ITEM_TENSOR || t->dtype != SPN_DTYPE_U8 || t->ndim != 3 || t->shape[2] != 3 ||
      t->device_kind != SPN_DEVICE_CPU || !t->data || t->shape[0] < 1 || t->shape[1] < 1 || t->shape[0] > 16384 ||
      t->shape[1] > 16384)
    return spn_error_set(err, SPN_ETYPE,
                         "superres: frame %llu: item \"frame\" must be a (H,W,3) u8 RGB tensor in host memory", seq);
  int32_t H = (int32_t)t->shape[0], W = (int32_t)t->shape[1], s = st->tp.scale;
  size_t on = (size_t)H * W * (size_t)s * s;
  spn_buffer_t *buf = NULL;
  spn_msg_t *m = NULL;
  if ((rc = h->buffer_new(st->stage, 3 * on, &buf, err)) != SPN_OK)
    return rc;
  uint8_t *o = h->buffer_data(buf);
  spn_image_t src = SPN_IMAGE_INIT, dst = SPN_IMAGE_INIT;
  if ((rc = spn_image_wrap(&src, t->data, W, H, SPN_PIXFMT_RGB24, err)) != SPN_OK ||
      (rc = spn_image_wrap(&dst, o, W * s, H * s, SPN_PIXFMT_RGB24, err)) != SPN_OK)
    goto out_buf;
  if (!st->faces_only) {
    rc = model_upscale(st, &src, &dst, err);
  } else {
    rc = spn_image_resize(&src, &dst, SPN_INTERP_BILINEAR, err);
    int64_t fi = h->msg_find(msg, "faces");
    spn_item_t fit = {.struct_size = sizeof fit};
    if (rc == SPN_OK && fi >= 0 && h->msg_item(msg, (size_t)fi, &fit) == SPN_OK && fit.meta &&
        fit.meta_size % sizeof(spn_face_t) == 0) {
      const spn_face_t *faces = fit.meta;
      for (size_t k = 0; rc == SPN_OK && k < fit.meta_size / sizeof(spn_face_t); k++)
        rc = paste_face(st, &src, &dst, &faces[k], err);
    }
  }
  if (rc != SPN_OK) {
    spn_error_prefix(err, "superres: frame %llu", seq);
    goto out_buf;
  }
  spn_tensor_t ot = SPN_TENSOR_INIT;
  ot.dtype = SPN_DTYPE_U8;
  ot.ndim = 3;
  ot.shape[0] = (int64_t)H * s;
  ot.shape[1] = (int64_t)W * s;
  ot.shape[2] = 3;
  if ((rc = h->msg_new_from(st->stage, msg, &m, err)) != SPN_OK)
    goto out_buf;
  if ((rc = h->msg_add_tensor(m, "frame", &ot, buf, err)) != SPN_OK)
    goto out_msg;
  /* Carry every other item; face coordinates follow the new size. */
  size_t count = h->msg_item_count(msg);
  for (size_t i = 0; i < count; i++) {
    if ((int64_t)i == fidx)
      continue;
    spn_item_t it = {.struct_size = sizeof it};
    if ((rc = h->msg_item(msg, i, &it)) != SPN_OK)
      goto out_msg;
    if (it.kind == SPN_ITEM_TENSOR) {
      rc = h->msg_add_tensor(m, it.name, &it.tensor, it.buffer, err);
    } else if (it.name && !strcmp(it.name, "faces") && it.meta_size % sizeof(spn_face_t) == 0) {
      size_t nf = it.meta_size / sizeof(spn_face_t);
      spn_face_t *f = nf ? malloc(it.meta_size) : NULL;
      if (nf && !f) {
        rc = spn_error_set(err, SPN_ENOMEM, "superres: out of memory");
        goto out_msg;
      }
      if (nf)
        memcpy(f, it.meta, it.meta_size);
      for (size_t k = 0; k < nf; k++) {
        f[k].x0 *= (float)s;
        f[k].y0 *= (float)s;
        f[k].x1 *= (float)s;
        f[k].y1 *= (float)s;
        for (int l = 0; l < 10; l++)
          f[k].landmarks[l] *= (float)s;
      }
      rc = h->msg_add_meta(m, it.name, f, it.meta_size, err);
      free(f);
    } else {
      rc = h->msg_add_meta(m, it.name, it.meta, it.meta_size, err);
    }
    if (rc != SPN_OK)
      goto out_msg;
  }
  h->buffer_unref(&buf); /* the message holds its own reference */
  *out = m;
  return SPN_OK;

out_msg:
  h->msg_free(&m);
out_buf:
  h->buffer_unref(&buf);
  return rc;
}

static int32_t sr_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                          spn_error_t *err) {
  (void)job_states;
  sr_state_t *st = state;
  const spn_host_api_t *h = st->host;
  for (size_t i = 0; i < n; i++) {
    if (!msgs[i])
      continue;
    int64_t idx = h->msg_find(msgs[i], "frame");
    if (idx >= 0) {
      spn_msg_t *up = NULL;
      spn_error_t jerr = SPN_ERROR_INIT;
      int32_t rc = upscale(st, msgs[i], idx, &up, &jerr);
      if (rc != SPN_OK) {
        const spn_envelope_t *env = h->msg_envelope(msgs[i]);
        h->fail_job(stage, env ? env->job_id : 0, rc, jerr.msg);
        h->msg_free(&msgs[i]);
        continue;
      }
      h->msg_free(&msgs[i]);
      msgs[i] = up;
    }
    int32_t rc = h->emit(stage, 0, &msgs[i], err);
    if (rc != SPN_OK)
      return rc;
  }
  return SPN_OK;
}

static const spn_stage_kind_t k_superres = {
    .struct_size = sizeof(spn_stage_kind_t),
    .name = "superres",
    .doc = "upscale video frames with a super-resolution model, tile by tile",
    .schema = k_schema,
    .config_size = sizeof(sr_config_t),
    .inputs = k_inputs,
    .n_inputs = 1,
    .n_outputs = 1,
    .outputs = k_outputs,
    .device_need = SPN_NEED_CPU,
    .max_batch = 1,
    .create = sr_create,
    .process = sr_process,
    .destroy = sr_destroy,
};

const spn_stage_kind_t *vision_superres_kind(void) {
  return &k_superres;
}
