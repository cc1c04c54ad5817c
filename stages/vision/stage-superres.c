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
 *
 * On a CUDA device (a build with CUDA; the kind runs on either side) the
 * same steps run on the GPU, on the instance's stream, with the frame in
 * device memory from start to end: to_float, the tiles (cut and stitched
 * with 2-D device copies along the same spn_tile_at geometry), the model
 * (the engine's CUDA backend at the stage's `precision`, device tensors in
 * and out), back to u8, and for region = "faces" the bilinear frame, the
 * feather mask and the paste as kernels (cuda/kernels/image.cuh, the twins
 * of spindle/image.h). One difference, for speed: a face's crop is grown
 * to a multiple of 32 pixels a side (within the frame) before the model
 * sees it, so that the engine meets a few input shapes instead of one per
 * frame (each new shape costs a cuDNN algorithm search); only the face's
 * own box is pasted, so the extra pixels are context, not output.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spindle/image.h"
#ifdef SPN_VISION_CUDA
#include "image.cuh"
#include "spindle/plugin-cuda.h"
#else
#include "spindle/plugin.h"
#endif

#include "model-path.h"
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
  int64_t tile_batch;
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
    {.key = "tile_batch", .type = SPN_CONFIG_INT, .offset = offsetof(sr_config_t, tile_batch),
     .doc = "on a GPU: tiles per model run (the frame's tiles, each cut at one size, run as one batch; 1: a run "
            "per tile; models with a fixed batch of 1 run a tile at a time)",
     .def_int = 16, .min = 1, .max = 256},
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
  spn_stage_t *stage; /* for the tile callback */
  spn_model_t *model;
  spn_tile_params_t tp;
  float *in, *out; /* planar float frames, reused */
  size_t in_cap, out_cap;
  bool faces_only;   /* region = "faces" */
  double margin;     /* face_margin */
  float feather;     /* feather, output pixels */
  int32_t runs;      /* engine runs for the current frame (logged at debug) */
  int32_t tile_batch; /* tiles per run on a GPU: tile_batch, or 1 for a model of batch 1 */
#ifdef SPN_VISION_CUDA
  /* device scratch on a GPU instance: planar float frame in and out, one
   * tile in and out, a face's upscaled crop, its mask */
  spn_buffer_t *d_tin, *d_tout, *d_up, *d_mask;
  int32_t dev_index; /* the runtime's index of the instance's GPU */
#endif
} sr_state_t;

/* The embedded espcn-x2: installed under share/spindle/models (where the
 * install was built for, or beside the running program when the install was
 * moved: spn_models_install_file), or the source tree's copy when running
 * from the build tree (not installed). buf holds the first. */
static const char *embedded_model(char *buf, size_t bufsz) {
  if (spn_models_install_file("espcn-x2.onnx", buf, bufsz) == 0)
    return buf;
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
  st->stage = stage;
  st->faces_only = faces_only;
  st->margin = cfg->face_margin;
  st->feather = (float)cfg->feather;
  char mpath[4096], hint[1024] = "", epath[4096], builtin[4200];
  const char *embedded = embedded_model(epath, sizeof epath);
  snprintf(builtin, sizeof builtin, "the embedded espcn-x2 (%s)", embedded);
  int32_t use = 0, rc = SPN_OK;
  if (cfg->model && cfg->model[0])
    use = vision_model_path(host, stage, "superres", cfg->model, cfg->model_optional, builtin, mpath,
                            sizeof mpath, hint, sizeof hint);
  if (use == 0 && cfg->scale != 2)
    rc = spn_error_set(err, SPN_ECONFIG, "the embedded espcn-x2 upscales by 2, not %d (set scale = 2)",
                       (int)cfg->scale);
  else
    rc = host->model_load(stage, use ? mpath : embedded, &st->model, err);
  if (rc != SPN_OK && hint[0])
    spn_error_prefix(err, "%s", hint);
  if (rc != SPN_OK) {
    spn_error_prefix(err, "superres %s", host->stage_get_name ? host->stage_get_name(stage) : "");
    free(st);
    return rc;
  }
  st->tp = (spn_tile_params_t){.tile = (int32_t)cfg->tile, .tile_pad = (int32_t)cfg->tile_pad,
                               .scale = (int32_t)cfg->scale, .channels = 3, .out_channels = 3};
  /* A batch of tiles needs a model whose input batch is not fixed. */
  st->tile_batch = (int32_t)cfg->tile_batch;
  spn_tensor_t in0 = SPN_TENSOR_INIT;
  const char *in_name = NULL;
  if (host->model_io_count && host->model_io &&
      (host->model_io_count(st->model, false) != 1 || host->model_io(st->model, false, 0, &in_name, &in0) != SPN_OK ||
       in0.ndim != 4 || in0.shape[0] >= 0))
    st->tile_batch = 1;
  *state = st;
  return SPN_OK;
}

static void sr_destroy(spn_stage_t *stage, void *state) {
  sr_state_t *st = state;
  if (!st)
    return;
  if (st->model && spn_stage_host(st->stage)->model_release)
    spn_stage_host(st->stage)->model_release(stage, &st->model);
  free(st->in);
  free(st->out);
#ifdef SPN_VISION_CUDA
  const spn_host_api_t *h = spn_stage_host(st->stage);
  spn_buffer_t **bufs[] = {&st->d_tin, &st->d_tout, &st->d_up, &st->d_mask};
  if (st->d_tin || st->d_up) /* work queued on them ends before they go back to the pool */
    cudaStreamSynchronize((cudaStream_t)h->stage_get_stream(st->stage));
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    h->buffer_unref(bufs[i]);
#endif
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
  st->runs++;
  return spn_stage_host(st->stage)->model_run(st->stage, st->model, &ti, 1, &to, 1, err);
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

/* The boxes of msg's "faces" item; NULL and 0 when it has none. */
static const spn_face_t *msg_faces(const spn_host_api_t *h, const spn_msg_t *msg, size_t *n) {
  int64_t fi = h->msg_find(msg, "faces");
  spn_item_t fit = {.struct_size = sizeof fit};
  *n = 0;
  if (fi < 0 || h->msg_item(msg, (size_t)fi, &fit) != SPN_OK || !fit.meta || fit.meta_size % sizeof(spn_face_t))
    return NULL;
  *n = fit.meta_size / sizeof(spn_face_t);
  return fit.meta;
}

/* region = "faces": the box of a face grown by the margin and clamped to
 * the frame, [x0, x1) x [y0, y1). False for a box that is not finite or
 * falls outside the frame (the face is skipped). */
static bool face_box(const sr_state_t *st, const spn_image_t *src, const spn_face_t *f, int32_t *x0, int32_t *y0,
                     int32_t *x1, int32_t *y1) {
  if (!isfinite(f->x0) || !isfinite(f->y0) || !isfinite(f->x1) || !isfinite(f->y1) || f->x1 <= f->x0 ||
      f->y1 <= f->y0)
    return false;
  double mx = st->margin * (f->x1 - f->x0), my = st->margin * (f->y1 - f->y0);
  double fx0 = floor(f->x0 - mx), fy0 = floor(f->y0 - my), fx1 = ceil(f->x1 + mx), fy1 = ceil(f->y1 + my);
  *x0 = fx0 < 0 ? 0 : (fx0 > src->width ? src->width : (int32_t)fx0);
  *y0 = fy0 < 0 ? 0 : (fy0 > src->height ? src->height : (int32_t)fy0);
  *x1 = fx1 < 0 ? 0 : (fx1 > src->width ? src->width : (int32_t)fx1);
  *y1 = fy1 < 0 ? 0 : (fy1 > src->height ? src->height : (int32_t)fy1);
  return *x1 - *x0 >= 1 && *y1 - *y0 >= 1;
}

/* Upscale one face's box with the model and paste it over dst with a
 * feathered edge. */
static int32_t paste_face(sr_state_t *st, const spn_image_t *src, spn_image_t *dst, const spn_face_t *f,
                          spn_error_t *err) {
  int32_t x0, y0, x1, y1;
  if (!face_box(st, src, f, &x0, &y0, &x1, &y1))
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

#ifdef SPN_VISION_CUDA
/* ---- the GPU twin ------------------------------------------------------- */

/* Device scratch, with a quarter to spare: face crops vary in size. */
static int32_t scratch(sr_state_t *st, spn_buffer_t **b, size_t n, spn_error_t *err) {
  return spn_cuda_scratch(st->stage, b, n, n / 4, err);
}

static spn_tensor_t dev_tensor(const sr_state_t *st, void *data, int64_t n, int64_t h, int64_t w) {
  spn_tensor_t t = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_F32;
  t.ndim = 4;
  t.shape[0] = n;
  t.shape[1] = 3;
  t.shape[2] = h;
  t.shape[3] = w;
  t.data = data;
  t.device_kind = SPN_DEVICE_CUDA;
  t.device_index = st->dev_index;
  return t;
}

/* Tile k of an H x W frame, and the top-left corner (*by, *bx) of the
 * P x Q block the model sees for it: at the padded block's corner, moved in
 * where that would reach past the frame's bottom or right edge. */
static void gpu_block_at(int32_t H, int32_t W, const spn_tile_params_t *tp, int64_t P, int64_t Q, int32_t k,
                         spn_tile_rect_t *r, int64_t *by, int64_t *bx) {
  spn_tile_at(H, W, tp, k, r);
  *by = r->py0 + P > H ? H - P : r->py0;
  *bx = r->px0 + Q > W ? W - Q : r->px0;
}

/* Tiles k .. k + n - 1 (n <= SPN_CUDA_TILES) with their blocks, for the
 * cut and stitch kernels. */
static void tiles_of(int32_t H, int32_t W, const spn_tile_params_t *tp, int64_t P, int64_t Q, int32_t k, int32_t n,
                     spn_cuda_tiles_t *t) {
  t->n = n;
  for (int32_t i = 0; i < n; i++) {
    spn_tile_rect_t r;
    int64_t by, bx;
    gpu_block_at(H, W, tp, P, Q, k + i, &r, &by, &bx);
    t->bx[i] = (int32_t)bx;
    t->by[i] = (int32_t)by;
    t->x0[i] = r.x0;
    t->y0[i] = r.y0;
    t->x1[i] = r.x1;
    t->y1[i] = r.y1;
  }
}

/* model_upscale on the GPU: src and dst are RGB24 views of device memory
 * (any pitch), dst s times src's size. Everything is queued on `stream`.
 * The tiles are spn_tile_at's, but each block the model sees is cut at one
 * size, P x Q (tile + 2 tile_pad, or the frame's side where that is
 * smaller), placed to hold the tile's padded block and to stay inside the
 * frame: it gives the tile at least tile_pad pixels of context wherever
 * the CPU's block does, and the frame's own edge where that is, so with
 * tile_pad >= the model's receptive radius each output pixel is the one the
 * CPU computes. Same-size blocks make a batch: up to tile_batch tiles per
 * engine run (one shape per frame size, so one CUDA Graph), instead of a
 * run and a shape per tile. A batch's blocks are cut from the u8 frame
 * straight into the model's float input, and each tile's part of the output
 * written straight to dst as u8, by one kernel each per SPN_CUDA_TILES
 * tiles (image.cuh): no float copy of the frame, no copy per tile. */
static int32_t gpu_upscale(sr_state_t *st, const spn_image_t *src, spn_image_t *dst, cudaStream_t stream,
                           spn_error_t *err) {
  const spn_host_api_t *h = spn_stage_host(st->stage);
  const spn_tile_params_t *tp = &st->tp;
  int32_t H = src->height, W = src->width, s = tp->scale, rc;
  if ((rc = spn_tile_check(H, W, tp, err)) != SPN_OK)
    return rc;
  int64_t P = (int64_t)tp->tile + 2 * (int64_t)tp->tile_pad, Q = P;
  P = P > H ? H : P;
  Q = Q > W ? W : Q;
  int32_t nt = spn_tile_count(H, W, tp), nb = st->tile_batch < nt ? st->tile_batch : nt;
  if (nb < 1)
    nb = 1;
  size_t tsz = 3 * (size_t)(P * Q), osz = tsz * (size_t)s * s;
  if ((rc = scratch(st, &st->d_tin, (size_t)nb * tsz * sizeof(float), err)) != SPN_OK ||
      (rc = scratch(st, &st->d_tout, (size_t)nb * osz * sizeof(float), err)) != SPN_OK)
    return rc;
  float *tin = h->buffer_data(st->d_tin), *tout = h->buffer_data(st->d_tout);
  spn_cuda_tiles_t tl;
  for (int32_t k0 = 0; k0 < nt && rc == SPN_OK; k0 += nb) {
    int32_t b = nt - k0 < nb ? nt - k0 : nb;
    /* cut: tile k0 + i's block into batch item i */
    for (int32_t c0 = 0; c0 < b && rc == SPN_OK; c0 += SPN_CUDA_TILES) {
      tiles_of(H, W, tp, P, Q, k0 + c0, b - c0 < SPN_CUDA_TILES ? b - c0 : SPN_CUDA_TILES, &tl);
      rc = spn_cuda_tiles_cut(src, &tl, (int32_t)P, (int32_t)Q, 1.0f / 255.0f, tin + (size_t)c0 * tsz, stream, err);
    }
    spn_tensor_t ti = dev_tensor(st, tin, b, P, Q), to = dev_tensor(st, tout, b, P * s, Q * s);
    st->runs++;
    if (rc == SPN_OK)
      rc = h->model_run(st->stage, st->model, &ti, 1, &to, 1, err);
    /* stitch: the part of item i's output that covers tile k0 + i */
    for (int32_t c0 = 0; c0 < b && rc == SPN_OK; c0 += SPN_CUDA_TILES) {
      tiles_of(H, W, tp, P, Q, k0 + c0, b - c0 < SPN_CUDA_TILES ? b - c0 : SPN_CUDA_TILES, &tl);
      rc = spn_cuda_tiles_stitch(tout + (size_t)c0 * osz, (int32_t)P, (int32_t)Q, s, &tl, dst, stream, err);
    }
    if (rc != SPN_OK) {
      spn_tile_rect_t r;
      spn_tile_at(H, W, tp, k0, &r);
      return b > 1 ? spn_error_prefix(err, "tiles %d..%d of %d (the first at (%d, %d))", k0, k0 + b - 1, nt, r.x0, r.y0)
                   : spn_error_prefix(err, "tile at (%d, %d)", r.x0, r.y0);
    }
  }
  return rc;
}

/* Grow [*a, *b) to a multiple of q pixels (or the whole [0, limit)),
 * keeping it centred where the frame allows. */
static void grow_to_multiple(int32_t *a, int32_t *b, int32_t limit, int32_t q) {
  int32_t len = *b - *a, want = (len + q - 1) / q * q;
  if (want > limit)
    want = limit;
  *a -= (want - len) / 2;
  if (*a < 0)
    *a = 0;
  if (*a + want > limit)
    *a = limit - want;
  *b = *a + want;
}

static int32_t gpu_paste_face(sr_state_t *st, const spn_image_t *src, spn_image_t *dst, const spn_face_t *f,
                              cudaStream_t stream, spn_error_t *err) {
  int32_t x0, y0, x1, y1;
  if (!face_box(st, src, f, &x0, &y0, &x1, &y1))
    return SPN_OK;
  int32_t mx0 = x0, my0 = y0, mx1 = x1, my1 = y1, s = st->tp.scale, rc;
  grow_to_multiple(&mx0, &mx1, src->width, 32);
  grow_to_multiple(&my0, &my1, src->height, 32);
  const spn_host_api_t *h = spn_stage_host(st->stage);
  size_t upn = (size_t)(mx1 - mx0) * s * (size_t)(my1 - my0) * s;
  spn_image_t crop, up, face, mask;
  if ((rc = scratch(st, &st->d_up, upn * 3, err)) != SPN_OK ||
      (rc = scratch(st, &st->d_mask, upn * sizeof(float), err)) != SPN_OK ||
      (rc = spn_image_crop(src, mx0, my0, mx1 - mx0, my1 - my0, &crop, err)) != SPN_OK ||
      (rc = spn_image_wrap(&up, h->buffer_data(st->d_up), (mx1 - mx0) * s, (my1 - my0) * s, SPN_PIXFMT_RGB24,
                           err)) != SPN_OK ||
      (rc = spn_image_crop(&up, (x0 - mx0) * s, (y0 - my0) * s, (x1 - x0) * s, (y1 - y0) * s, &face, err)) !=
          SPN_OK ||
      (rc = spn_image_wrap(&mask, h->buffer_data(st->d_mask), face.width, face.height, SPN_PIXFMT_GRAYF32, err)) !=
          SPN_OK)
    return rc;
  if ((rc = gpu_upscale(st, &crop, &up, stream, err)) != SPN_OK ||
      (rc = spn_cuda_feather_mask(&mask, st->feather, stream, err)) != SPN_OK)
    return rc;
  return spn_cuda_paste(dst, &face, x0 * s, y0 * s, &mask, stream, err);
}

/* The frame filter's CUDA body: `t` and `out` are device tensors of the
 * instance's GPU; nothing waits for the GPU here. */
static int32_t sr_frame_cuda(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *t,
                             spn_tensor_t *out, void *stream_p, spn_error_t *err) {
  sr_state_t *st = state;
  const spn_host_api_t *h = spn_stage_host(stage);
  cudaStream_t stream = (cudaStream_t)stream_p;
  int32_t H = (int32_t)t->shape[0], W = (int32_t)t->shape[1], s = st->tp.scale, rc, kind = 0;
  h->stage_get_device(stage, &kind, &st->dev_index);
  spn_image_t src, dst;
  st->runs = 0;
  if ((rc = spn_image_wrap(&src, t->data, W, H, SPN_PIXFMT_RGB24, err)) != SPN_OK ||
      (rc = spn_image_wrap(&dst, out->data, W * s, H * s, SPN_PIXFMT_RGB24, err)) != SPN_OK)
    return rc;
  if (!st->faces_only) {
    rc = gpu_upscale(st, &src, &dst, stream, err);
  } else {
    rc = spn_cuda_resize_bilinear(&src, &dst, stream, err);
    size_t nf = 0;
    const spn_face_t *faces = msg_faces(h, msg, &nf);
    for (size_t k = 0; rc == SPN_OK && k < nf; k++)
      rc = gpu_paste_face(st, &src, &dst, &faces[k], stream, err);
  }
  if (rc != SPN_OK)
    spn_error_prefix(err, "superres: frame %llu on the GPU", (unsigned long long)h->msg_envelope(msg)->seq);
  else
    h->log(stage, h->msg_envelope(msg)->job_id, SPN_LOG_DEBUG, "superres: frame %llu: %d model runs on the GPU",
           (unsigned long long)h->msg_envelope(msg)->seq, st->runs);
  return rc;
}
#endif

/* The frame filter's three steps (plugin.h's spn_frame_filter_t does the
 * messages and buffers): the output size, the upscale, and the face boxes
 * of the output message, which follow the new size. */
static int32_t sr_shape(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *t,
                        spn_tensor_t *out, spn_error_t *err) {
  sr_state_t *st = state;
  unsigned long long seq = (unsigned long long)spn_stage_host(stage)->msg_envelope(msg)->seq;
  if (t->dtype != SPN_DTYPE_U8 || t->ndim != 3 || t->shape[2] != 3 || t->shape[0] < 1 || t->shape[1] < 1 ||
      t->shape[0] > 16384 || t->shape[1] > 16384)
    return spn_error_set(err, SPN_ETYPE,
                         "superres: frame %llu: item \"frame\" must be a (H,W,3) u8 RGB tensor (dtype %d, %d axes)",
                         seq, (int)t->dtype, (int)t->ndim);
  out->shape[0] = t->shape[0] * st->tp.scale;
  out->shape[1] = t->shape[1] * st->tp.scale;
  return SPN_OK;
}

static int32_t sr_frame(spn_stage_t *stage, void *state, const spn_msg_t *msg, const spn_tensor_t *t,
                        spn_tensor_t *out, spn_error_t *err) {
  sr_state_t *st = state;
  const spn_host_api_t *h = spn_stage_host(stage);
  int32_t H = (int32_t)t->shape[0], W = (int32_t)t->shape[1], s = st->tp.scale, rc;
  spn_image_t src = SPN_IMAGE_INIT, dst = SPN_IMAGE_INIT;
  st->runs = 0;
  if ((rc = spn_image_wrap(&src, t->data, W, H, SPN_PIXFMT_RGB24, err)) != SPN_OK ||
      (rc = spn_image_wrap(&dst, out->data, W * s, H * s, SPN_PIXFMT_RGB24, err)) != SPN_OK)
    return rc;
  if (!st->faces_only) {
    rc = model_upscale(st, &src, &dst, err);
  } else {
    rc = spn_image_resize(&src, &dst, SPN_INTERP_BILINEAR, err);
    size_t nf = 0;
    const spn_face_t *faces = msg_faces(h, msg, &nf);
    for (size_t k = 0; rc == SPN_OK && k < nf; k++)
      rc = paste_face(st, &src, &dst, &faces[k], err);
  }
  if (rc != SPN_OK)
    spn_error_prefix(err, "superres: frame %llu", (unsigned long long)h->msg_envelope(msg)->seq);
  else /* how much of the frame the model saw: the tiles of the frame or of its faces */
    h->log(stage, h->msg_envelope(msg)->job_id, SPN_LOG_DEBUG, "superres: frame %llu: %d model runs",
           (unsigned long long)h->msg_envelope(msg)->seq, st->runs);
  return rc;
}

static int32_t sr_finish(spn_stage_t *stage, void *state, const spn_msg_t *msg, spn_msg_t *out, spn_error_t *err) {
  const spn_host_api_t *h = spn_stage_host(stage);
  float s = (float)((sr_state_t *)state)->tp.scale;
  int64_t fi = h->msg_find(out, "faces");
  spn_item_t it = {.struct_size = sizeof it};
  if (fi < 0 || h->msg_item(out, (size_t)fi, &it) != SPN_OK || it.kind != SPN_ITEM_META || !it.meta_size ||
      it.meta_size % sizeof(spn_face_t))
    return SPN_OK;
  spn_face_t *f = malloc(it.meta_size);
  if (!f)
    return spn_error_set(err, SPN_ENOMEM, "superres: out of memory");
  memcpy(f, it.meta, it.meta_size);
  for (size_t k = 0; k < it.meta_size / sizeof(spn_face_t); k++) {
    f[k].x0 *= s, f[k].y0 *= s, f[k].x1 *= s, f[k].y1 *= s;
    for (int l = 0; l < 10; l++)
      f[k].landmarks[l] *= s;
  }
  int32_t rc = h->msg_replace_meta(out, (size_t)fi, f, it.meta_size, err);
  free(f);
  return rc;
}

#ifdef SPN_VISION_CUDA
static const spn_frame_filter_t sr_filter = {
    .shape = sr_shape, .cpu = sr_frame, .cuda = sr_frame_cuda, .finish = sr_finish};
#else
static const spn_frame_filter_t sr_filter = {.shape = sr_shape, .cpu = sr_frame, .finish = sr_finish};
#endif

static int32_t sr_process(spn_stage_t *stage, void *state, spn_msg_t **msgs, void **job_states, size_t n,
                          spn_error_t *err) {
  (void)job_states;
#ifdef SPN_VISION_CUDA
  return spn_frame_filter_process_cuda(stage, state, msgs, n, &sr_filter, err);
#else
  return spn_frame_filter_process(stage, state, msgs, n, &sr_filter, err);
#endif
}

/* Frames in host memory, or on a GPU instance in that GPU's memory (no copy
 * between a GPU producer and this stage). */
#ifdef SPN_VISION_CUDA
#define SR_MEM_KINDS (SPN_MEMSET_HOST | SPN_MEMSET_DEVICE)
#else
#define SR_MEM_KINDS SPN_MEMSET_HOST
#endif
static const spn_port_caps_t k_mem_caps[] = {{.struct_size = sizeof(spn_port_caps_t), .mem_kinds = SR_MEM_KINDS}};

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
#ifdef SPN_VISION_CUDA
    .device_need = SPN_NEED_EITHER,
#else
    .device_need = SPN_NEED_CPU,
#endif
    .input_caps = k_mem_caps,
    .output_caps = k_mem_caps,
    .max_batch = 1,
    .create = sr_create,
    .process = sr_process,
    .destroy = sr_destroy,
};

const spn_stage_kind_t *vision_superres_kind(void) {
  return &k_superres;
}
