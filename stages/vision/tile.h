/* tile.h — tiled inference for super-resolution models (Real-ESRGAN style).
 *
 * Large frames do not fit a model's memory in one pass, so the image is cut
 * into tile x tile blocks; each block is extended by tile_pad pixels of real
 * image context on every side (clamped at the image edges), run through the
 * model, and only the output of the un-padded centre is written back. As long
 * as tile_pad covers the model's receptive-field radius the result equals the
 * untiled one: no seams.
 */
#ifndef SPN_VISION_TILE_H
#define SPN_VISION_TILE_H

#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Process one tile: `in` is (channels, h, w) float, `out` must receive
 * (out_channels, h * scale, w * scale). Return SPN_OK or an error (with err
 * filled), which stops the tiling. Thread: the caller's. */
typedef int32_t (*spn_tile_fn)(void *user, const float *in, int32_t channels, int32_t h, int32_t w, float *out,
                               spn_error_t *err);

typedef struct spn_tile_params {
  int32_t tile;         /* tile side in input pixels, >= 1 */
  int32_t tile_pad;     /* context added on each side, >= 0 */
  int32_t scale;        /* output pixels per input pixel, 1..16 */
  int32_t channels;     /* input channels */
  int32_t out_channels; /* output channels */
} spn_tile_params_t;

#define SPN_TILE_PARAMS_INIT {.tile = 256, .tile_pad = 10, .scale = 2, .channels = 3, .out_channels = 3}

/* The geometry of one tile, in input pixels: the tile [x0, x1) x [y0, y1)
 * and the block the model sees, [px0, px1) x [py0, py1) (the tile grown by
 * tile_pad, clamped to the image). spn_tile_run copies the block, runs the
 * model on it and keeps the part of its output that covers the tile; a
 * device twin does the same with its own copies. */
typedef struct spn_tile_rect {
  int32_t x0, y0, x1, y1;
  int32_t px0, py0, px1, py1;
} spn_tile_rect_t;

/* Check an image size and params as spn_tile_run does (SPN_EINVAL names
 * them). Thread: any. */
int32_t spn_tile_check(int32_t h, int32_t w, const spn_tile_params_t *params, spn_error_t *err);
/* Number of tiles of a checked (h, w, params), and tile k of them (row by
 * row, 0 <= k < count). Thread: any. */
int32_t spn_tile_count(int32_t h, int32_t w, const spn_tile_params_t *params);
void spn_tile_at(int32_t h, int32_t w, const spn_tile_params_t *params, int32_t k, spn_tile_rect_t *out);

/* Run `fn` over the tiles of `in` (channels, h, w) and assemble `out`
 * (out_channels, h * scale, w * scale). Tiles are visited row by row; border
 * tiles are smaller. Returns SPN_OK, SPN_EINVAL (bad params, fn never
 * called), SPN_ENOMEM, or the callback's error (out then partly written).
 * Ownership: in/out borrowed. Thread: the caller's. */
int32_t spn_tile_run(const float *in, int32_t h, int32_t w, const spn_tile_params_t *params, spn_tile_fn fn,
                     void *user, float *out, spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
