#!/usr/bin/env python3
"""Write a random-weight ONNX model shaped like Wav2Lip (about 20 kB).

  make-w2l-model.py OUT.onnx [--seed N]
  make-w2l-model.py OUT.onnx --arch wav2lip [--width W]

--arch wav2lip writes the real Wav2Lip architecture instead (the engine's
conformance builder, tests/engine/models.py: Conv+BN+ReLU blocks with
residuals, ConvTranspose decoder, skip concatenations) at a reduced width,
laid out as tools/export/export.py exports it.

Inputs as tools/export/export.py names them: mel (N,1,80,16) and face
(N,6,96,96); output (N,3,96,96) in (0,1). A per-sample audio term
(GlobalAveragePool of Conv 1->6 over mel, broadcast over the face) is added
to the face, then Conv 6->8 3x3 -> Relu -> Conv 8->3 3x3 -> Sigmoid. Every output pixel depends
on the face crop around it and on its mel chunk, which is what the lipsync
tests need to see the mouth region change and the join by seq hold.
"""
import argparse
import sys

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:  # the caller maps this to a skip
    print(f"skip: {e}", file=sys.stderr)
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--arch", choices=["small", "wav2lip"], default="small")
    ap.add_argument("--width", type=float, default=0.0625)
    a = ap.parse_args()
    if a.arch == "wav2lip":
        import os
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
        import models
        m = models.wav2lip(width=a.width)
        m.graph.ClearField("input")
        m.graph.input.extend([helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["N", 1, 80, 16]),
                              helper.make_tensor_value_info("face", TensorProto.FLOAT, ["N", 6, 96, 96])])
        m.graph.ClearField("output")
        m.graph.output.extend([helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, 96, 96])])
        onnx.checker.check_model(m)
        onnx.save(m, a.out)
        return 0
    rng = np.random.default_rng(a.seed)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("wm", (6, 1, 3, 3), 0.5), init("bm", (6,), 0.1),
        init("w1", (8, 6, 3, 3), 0.4), init("b1", (8,), 0.1),
        init("w2", (3, 8, 3, 3), 0.4), init("b2", (3,), 0.1),
    ]
    # The audio term is added to the face before the convolutions: Spindle's
    # engine (as merged here) mis-computes a broadcast Add right after a Conv.
    nodes = [
        helper.make_node("Conv", ["mel", "wm", "bm"], ["cm"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["cm"], ["gm"]),  # (N,6,1,1)
        helper.make_node("Add", ["face", "gm"], ["fa"]),
        helper.make_node("Conv", ["fa", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["output"]),
    ]
    g = helper.make_graph(
        nodes, "wav2lip_shaped",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["N", 1, 80, 16]),
         helper.make_tensor_value_info("face", TensorProto.FLOAT, ["N", 6, 96, 96])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, 96, 96])],
        initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
