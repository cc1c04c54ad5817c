/* test-superres-gpu-body.c — superres's CUDA body (stages/vision/stage-superres.c
 * built with SPN_VISION_CUDA) against its CPU body, without a GPU.
 *
 * The stage's source is included here; the kernels it calls (image.cuh) are
 * replaced by their CPU references (spindle/image.h), the CUDA runtime calls
 * by fakes on host memory that refuse any 2-D copy or model tensor reaching
 * outside a live buffer, and the model by a nearest-neighbour upscaler (a
 * pointwise model: tiling and the crop's extra context cannot change its
 * output). So the GPU body's geometry — tiles cut (at one size, in batches of
 * tile_batch: 1, 4, 7, 64, 100: more than one tile kernel's SPN_CUDA_TILES)
 * and stitched by the tile kernels, the frame and tile pitches, a face's crop grown to a multiple of
 * 32 inside the frame, the part of it pasted, the scratch sizes — must give
 * the CPU body's bytes exactly: odd sizes, border tiles, faces at the frame's
 * edges and partly outside it, no faces.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#ifndef SPN_VISION_CUDA
#define SPN_VISION_CUDA 1
#endif
#include "stage-superres.c"

/* ---- fake buffers (tests/gpu/fake-gpu-host.h), CUDA runtime and kernels
 * (their CPU references) ------------------------------------------------- */

#include "fake-gpu-host.h"

static struct {
  int out_of_bounds;
  int model_runs;
  int tile_batch; /* the GPU body's tiles per model run */
} g;

/* Whether [p, p + n) lies inside one live buffer. */
static bool inside(const void *p, size_t n) { return fake_buffer_at(p, n) != NULL; }

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k, (void)s;
  if (width > dpitch || width > spitch || !height ||
      !inside(dst, (height - 1) * dpitch + width) || !inside(src, (height - 1) * spitch + width)) {
    g.out_of_bounds++;
    return cudaErrorInvalidValue;
  }
  for (size_t y = 0; y < height; y++)
    memcpy((char *)dst + y * dpitch, (const char *)src + y * spitch, width);
  return cudaSuccess;
}

/* The last byte of an image's plane p. */
static bool image_inside(const spn_image_t *im) {
  for (int32_t p = 0; p < im->nplanes; p++) {
    int32_t pw, ph;
    spn_pixfmt_plane_size(im->format, im->width, im->height, p, &pw, &ph);
    size_t row = (size_t)pw * (im->format == SPN_PIXFMT_RGB24 ? 3 : sizeof(float));
    if (!inside(im->data[p], (size_t)(ph - 1) * (size_t)im->stride[p] + row))
      return false;
  }
  return true;
}

#define CHECK_IMAGES(a, b)                         \
  do {                                             \
    if (!image_inside(a) || !image_inside(b)) {    \
      g.out_of_bounds++;                           \
      return spn_error_set(err, SPN_EINVAL, "out of bounds"); \
    }                                              \
  } while (0)

int32_t spn_cuda_resize_bilinear(const spn_image_t *src, spn_image_t *dst, cudaStream_t stream, spn_error_t *err) {
  (void)stream;
  CHECK_IMAGES(src, dst);
  return spn_image_resize(src, dst, SPN_INTERP_BILINEAR, err);
}
/* The tile kernels (image.cuh) as loops, every block and part read or
 * written checked to lie inside a live buffer. */
int32_t spn_cuda_tiles_cut(const spn_image_t *src, const spn_cuda_tiles_t *t, int32_t P, int32_t Q, float scale,
                           float *dst, cudaStream_t stream, spn_error_t *err) {
  (void)stream;
  CHECK_IMAGES(src, src);
  assert_int_equal(src->format, SPN_PIXFMT_RGB24);
  assert_true(t->n >= 1 && t->n <= SPN_CUDA_TILES);
  size_t plane = (size_t)P * Q;
  if (!inside(dst, (size_t)t->n * 3 * plane * sizeof *dst)) {
    g.out_of_bounds++;
    return spn_error_set(err, SPN_EINVAL, "tiles out of bounds");
  }
  for (int32_t i = 0; i < t->n; i++) {
    if (t->bx[i] < 0 || t->by[i] < 0 || t->bx[i] + Q > src->width || t->by[i] + P > src->height) {
      g.out_of_bounds++;
      return spn_error_set(err, SPN_EINVAL, "block out of the frame");
    }
    for (int c = 0; c < 3; c++)
      for (int32_t y = 0; y < P; y++)
        for (int32_t x = 0; x < Q; x++)
          dst[((size_t)i * 3 + c) * plane + (size_t)y * Q + x] =
              (float)src->data[0][(t->by[i] + y) * src->stride[0] + (t->bx[i] + x) * 3 + c] * scale;
  }
  return SPN_OK;
}
int32_t spn_cuda_tiles_stitch(const float *src, int32_t P, int32_t Q, int32_t s, const spn_cuda_tiles_t *t,
                              spn_image_t *dst, cudaStream_t stream, spn_error_t *err) {
  (void)stream;
  CHECK_IMAGES(dst, dst);
  assert_int_equal(dst->format, SPN_PIXFMT_RGB24);
  size_t oq = (size_t)Q * s, oplane = (size_t)P * s * oq;
  if (!inside(src, (size_t)t->n * 3 * oplane * sizeof *src)) {
    g.out_of_bounds++;
    return spn_error_set(err, SPN_EINVAL, "tile outputs out of bounds");
  }
  for (int32_t i = 0; i < t->n; i++) {
    if (t->x0[i] < t->bx[i] || t->y0[i] < t->by[i] || t->x1[i] > t->bx[i] + Q || t->y1[i] > t->by[i] + P ||
        t->x1[i] * s > dst->width || t->y1[i] * s > dst->height) {
      g.out_of_bounds++;
      return spn_error_set(err, SPN_EINVAL, "tile part out of bounds");
    }
    for (int32_t Y = t->y0[i] * s; Y < t->y1[i] * s; Y++)
      for (int32_t X = t->x0[i] * s; X < t->x1[i] * s; X++)
        for (int c = 0; c < 3; c++) {
          float v = src[((size_t)i * 3 + c) * oplane + (size_t)(Y - t->by[i] * s) * oq + (size_t)(X - t->bx[i] * s)];
          v *= 255.0f;
          v = v > 0.0f ? (v < 255.0f ? v : 255.0f) : 0.0f;
          dst->data[0][Y * dst->stride[0] + X * 3 + c] = (uint8_t)(v + 0.5f);
        }
  }
  return SPN_OK;
}
int32_t spn_cuda_paste(spn_image_t *dst, const spn_image_t *src, int32_t x, int32_t y, const spn_image_t *mask,
                       cudaStream_t stream, spn_error_t *err) {
  (void)stream;
  CHECK_IMAGES(src, dst);
  if (mask && !image_inside(mask)) {
    g.out_of_bounds++;
    return spn_error_set(err, SPN_EINVAL, "mask out of bounds");
  }
  return spn_image_paste(dst, src, x, y, mask, err);
}
int32_t spn_cuda_feather_mask(spn_image_t *mask, float feather, cudaStream_t stream, spn_error_t *err) {
  (void)stream;
  CHECK_IMAGES(mask, mask);
  return spn_image_feather_mask(mask, feather, err);
}

/* The rest of the vision plugin the stage's file refers to. */
int32_t vision_check_host(const spn_host_api_t *h, bool superres, spn_error_t *err) {
  (void)h, (void)superres, (void)err;
  return SPN_OK;
}
int32_t vision_model_path(const spn_host_api_t *h, spn_stage_t *stage, const char *kind, const char *value,
                          bool optional, const char *builtin, char *out, size_t outsz, char *hint, size_t hintsz) {
  (void)h, (void)stage, (void)kind, (void)value, (void)optional, (void)builtin, (void)out, (void)outsz, (void)hint,
      (void)hintsz;
  return 0;
}

/* ---- fake host --------------------------------------------------------------- */

struct spn_msg {
  spn_envelope_t env;
  const spn_face_t *faces;
  size_t n_faces;
};

static int32_t h_buffer_new_kind(spn_stage_t *s, size_t n, int32_t kind, spn_buffer_t **out, spn_error_t *err) {
  (void)s, (void)kind, (void)err;
  *out = fake_buffer(n, 0xcd, true); /* garbage: anything not written shows */
  return SPN_OK;
}
static const char *h_stage_get_name(spn_stage_t *s) {
  (void)s;
  return "sr";
}
static const spn_envelope_t *h_msg_envelope(const spn_msg_t *m) { return &m->env; }
static int64_t h_msg_find(const spn_msg_t *m, const char *name) { return m->faces && !strcmp(name, "faces") ? 0 : -1; }
static int32_t h_msg_item(const spn_msg_t *m, size_t i, spn_item_t *it) {
  if (i != 0 || !m->faces)
    return SPN_EINVAL;
  it->kind = SPN_ITEM_META;
  it->name = "faces";
  it->meta = m->faces;
  it->meta_size = m->n_faces * sizeof *m->faces;
  return SPN_OK;
}
static void h_model_release(spn_stage_t *s, spn_model_t **m) {
  (void)s;
  *m = NULL;
}
/* Nearest-neighbour x s on (n,3,h,w) float. */
static int32_t h_model_run(spn_stage_t *s, spn_model_t *m, const spn_tensor_t *in, size_t n_in, spn_tensor_t *out,
                           size_t n_out, spn_error_t *err) {
  (void)s;
  sr_state_t *st = (sr_state_t *)(void *)m;
  assert_int_equal(n_in, 1);
  assert_int_equal(n_out, 1);
  int64_t n = in->shape[0], h = in->shape[2], w = in->shape[3], sc = st->tp.scale;
  assert_true(n >= 1);
  assert_int_equal(out->shape[0], n);
  assert_int_equal(out->shape[2], h * sc);
  assert_int_equal(out->shape[3], w * sc);
  if (in->device_kind == SPN_DEVICE_CUDA &&
      (!inside(in->data, spn_tensor_nbytes(in)) || !inside(out->data, spn_tensor_nbytes(out)))) {
    g.out_of_bounds++;
    return spn_error_set(err, SPN_EINVAL, "model tensor out of bounds");
  }
  g.model_runs++;
  const float *ip = in->data;
  float *op = out->data;
  for (int64_t c = 0; c < 3 * n; c++) /* batch items and channels alike */
    for (int64_t y = 0; y < h * sc; y++)
      for (int64_t x = 0; x < w * sc; x++)
        op[(c * h * sc + y) * w * sc + x] = ip[(c * h + y / sc) * w + x / sc];
  return SPN_OK;
}

static spn_host_api_t g_host;
static struct {
  spn_stage_head_t head;
} g_stage;
#define STAGE ((spn_stage_t *)(void *)&g_stage)

static int setup(void **state) {
  (void)state;
  memset(&g, 0, sizeof g);
  fake_reset();
  memset(&g_host, 0, sizeof g_host);
  g_host.struct_size = sizeof g_host;
  g_host.stage_get_device = h_stage_get_device;
  g_host.stage_get_name = h_stage_get_name;
  g_host.stage_get_stream = h_stage_get_stream;
  g_host.log = h_log;
  g_host.buffer_new_kind = h_buffer_new_kind;
  g_host.buffer_data = h_buffer_data;
  g_host.buffer_size = h_buffer_size;
  g_host.buffer_unref = h_buffer_unref;
  g_host.msg_envelope = h_msg_envelope;
  g_host.msg_find = h_msg_find;
  g_host.msg_item = h_msg_item;
  g_host.model_release = h_model_release;
  g_host.model_run = h_model_run;
  g_stage.head.struct_size = sizeof g_stage.head;
  g_stage.head.host = &g_host;
  return 0;
}

/* One frame through both bodies; the outputs must be the same bytes. */
static void both(int32_t W, int32_t H, int32_t scale, int32_t tile, int32_t pad, bool faces_only,
                 const spn_face_t *faces, size_t nf) {
  sr_state_t *st = calloc(1, sizeof *st);
  assert_non_null(st);
  st->stage = STAGE;
  st->model = (spn_model_t *)(void *)st; /* the fake model reads the scale from it */
  st->tp = (spn_tile_params_t){.tile = tile, .tile_pad = pad, .scale = scale, .channels = 3, .out_channels = 3};
  st->faces_only = faces_only;
  st->tile_batch = g.tile_batch;
  st->margin = 0.25;
  st->feather = 4.0f;
  spn_msg_t msg = {.env = {.struct_size = sizeof msg.env, .job_id = 1, .seq = 7}, .faces = faces, .n_faces = nf};
  spn_tensor_t t = SPN_TENSOR_INIT, o = SPN_TENSOR_INIT;
  t.dtype = SPN_DTYPE_U8;
  t.ndim = 3;
  t.shape[0] = H, t.shape[1] = W, t.shape[2] = 3;
  spn_error_t err = SPN_ERROR_INIT;
  o = t;
  assert_int_equal(sr_shape(STAGE, st, &msg, &t, &o, &err), SPN_OK);
  size_t in_n = spn_tensor_nbytes(&t), out_n = spn_tensor_nbytes(&o);
  /* the frame: a pattern with edges everywhere */
  spn_buffer_t *din = fake_buffer(in_n, 0xcd, true), *dout = fake_buffer(out_n, 0xcd, true);
  uint32_t seed = (uint32_t)(W * 31 + H);
  for (size_t i = 0; i < in_n; i++) {
    seed = seed * 1664525u + 1013904223u;
    din->data[i] = (uint8_t)(seed >> 24);
  }
  unsigned char *cpu_out = malloc(out_n);
  assert_non_null(cpu_out);
  spn_tensor_t tc = t, oc = o;
  tc.data = din->data;
  oc.data = cpu_out;
  g.model_runs = 0;
  assert_int_equal(sr_frame(STAGE, st, &msg, &tc, &oc, &err), SPN_OK);
  int cpu_runs = g.model_runs;
  g.model_runs = 0;
  spn_tensor_t tg = t, og = o;
  tg.data = din->data;
  tg.device_kind = og.device_kind = SPN_DEVICE_CUDA;
  og.data = dout->data;
  int32_t rc = sr_frame_cuda(STAGE, st, &msg, &tg, &og, NULL, &err);
  if (rc != SPN_OK)
    fail_msg("sr_frame_cuda %dx%d: %s", W, H, err.msg);
  assert_int_equal(g.out_of_bounds, 0);
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < out_n; i++)
    if (cpu_out[i] != dout->data[i] && !diff++)
      first = i;
  if (diff)
    fail_msg("%dx%d x%d tile %d pad %d %s: %zu bytes differ, the first at pixel (%zu, %zu)", W, H, scale, tile, pad,
             faces_only ? "faces" : "frame", diff, first / 3 % ((size_t)W * scale), first / 3 / ((size_t)W * scale));
  if (!faces_only) /* the same tiles, tile_batch at a time */
    assert_int_equal(g.model_runs, (cpu_runs + g.tile_batch - 1) / g.tile_batch);
  sr_destroy(STAGE, st);
  h_buffer_unref(&din);
  h_buffer_unref(&dout);
  free(cpu_out);
  assert_true(fake_none_live()); /* the scratch went with the instance */
}

static void frame_tiles_match_the_cpu_on_odd_sizes_and_border_tiles(void **state) {
  (void)state;
  /* a run per tile; batches with a short last one (15 tiles by 4: 4+4+4+3,
   * by 7: 7+7+1; 12 by 7: 7+5); all tiles in one run; 247 tiles by 64 and
   * by 100 (100 + 100 + 47: a batch cut and stitched by two tile kernels,
   * 64 + 36) */
  const int batches[] = {1, 4, 7, 64, 100};
  for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
    g.tile_batch = batches[i];
    fake_reset(); /* every buffer of the last round is gone (both() checks it); room for this round's */
    both(67, 45, 2, 16, 3, false, NULL, 0);
    both(67, 45, 3, 20, 0, false, NULL, 0);
    both(33, 17, 2, 64, 8, false, NULL, 0); /* one tile, pad beyond the frame */
    both(1, 1, 4, 8, 2, false, NULL, 0);
    both(150, 100, 2, 8, 2, false, NULL, 0);
  }
}

static void faces_match_the_cpu_at_the_edges_partly_outside_and_absent(void **state) {
  (void)state;
  g.tile_batch = 16;
  const spn_face_t faces[] = {
      {.x0 = 30, .y0 = 20, .x1 = 50, .y1 = 44},   /* inside */
      {.x0 = 140, .y0 = 90, .x1 = 151, .y1 = 99}, /* touching the right and bottom edges */
      {.x0 = -6, .y0 = -3, .x1 = 9, .y1 = 12},    /* partly outside the top left */
      {.x0 = 70, .y0 = 5, .x1 = 70.5f, .y1 = 5.5f}, /* tiny */
      {.x0 = 500, .y0 = 500, .x1 = 510, .y1 = 510}, /* outside: skipped */
  };
  both(151, 99, 2, 24, 4, true, faces, sizeof faces / sizeof *faces);
  both(151, 99, 3, 256, 10, true, faces, 2);
  both(20, 13, 2, 16, 2, true, faces + 2, 1); /* a frame narrower than 32 px */
  both(151, 99, 2, 24, 4, true, NULL, 0);     /* no faces: the bilinear frame */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(frame_tiles_match_the_cpu_on_odd_sizes_and_border_tiles, setup, NULL),
      cmocka_unit_test_setup_teardown(faces_match_the_cpu_at_the_edges_partly_outside_and_absent, setup, NULL),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
