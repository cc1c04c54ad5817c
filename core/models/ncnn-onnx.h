/* ncnn-onnx.h — convert an ncnn model (.param text + .bin weights) into an
 * ONNX model the engine (and ONNX Runtime) can run.
 *
 * Only the layer types of the super-resolution models Spindle fetches are
 * understood: Input, Split, Convolution (with its fused activation), ReLU
 * (and its leaky form), PReLU, PixelShuffle, Interp (nearest, bilinear,
 * bicubic by scale), BinaryOp, Eltwise and Concat. Any other layer is
 * refused by type, name, file and line; so is a .bin that is shorter or
 * longer than the .param says.
 *
 * The result is deterministic: the same .param/.bin always give the same
 * bytes, so a manifest can pin the converted file's sha256.
 *
 * The graph input is "input" (1,3,H,W) and the single graph output
 * "output"; weights become float32 initializers whatever their storage in
 * the .bin (fp32 or fp16).
 */
#ifndef SPINDLE_MODELS_NCNN_ONNX_H
#define SPINDLE_MODELS_NCNN_ONNX_H

#include <stddef.h>
#include <stdint.h>

/* Convert. On success *out is a malloc'd serialised ONNX ModelProto of
 * *out_len bytes (caller frees) and 0 is returned; on failure -1 with a
 * message "FILE:LINE: what" (or "FILE: what") in msg.
 * Ownership: caller owns *out. Thread: any. */
int spn_ncnn_to_onnx(const char *param_path, const char *bin_path, uint8_t **out, size_t *out_len, char *msg,
                     size_t msz);

#endif
