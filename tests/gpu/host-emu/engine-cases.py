#!/usr/bin/env python3
"""The CUDA engine backend on the host (tests/gpu/host-emu/README) against the
CPU backend, on cases tests/engine/conformance.py does not have: batched
MatMul of two activations, Gemm's alpha/beta/C variants and transposes,
convolutions whose bias, ReLU and residual add cuDNN fuses (with and without a
bias, the residual being the input), depthwise dilated, ConvTranspose with
output_padding and dilation, Concat of constants, pooling with ceil_mode and
dilations, BatchNormalization not folded, 5-D Transpose and Resize, and a
small Wav2Lip-like chain (conv-relu-conv + residual add, concat,
convtranspose, sigmoid); Clip and Pad whose bound or fill value a node
computes.

Each case runs with `SPINDLE model run --repeat 3` on cpu and on cuda:0 (so
the CUDA side's second run is captured as a CUDA Graph and its third is the
replay, whose outputs are compared), and ONNX Runtime gives a reference for
the report. A case passes when the cuda:0 output matches the CPU backend's
within 1e-4 (fp32, tf32: the fakes compute in double) or 1e-2 (fp16),
measured as max|cuda - cpu| / max(1, max|cpu|). KNOWN_BUGS lists the cases
that fail because of a bug in the engine: they are reported XFAIL, and one
that passes (XPASS) fails the run so that it is taken off the list.

Clip and Pad whose bound or fill value a node computes must run on the CPU
fallback (ON_CPU): the CUDA backend reads those on the host. --nhwc sets
SPINDLE_CUDA_NHWC=1 for the cuda:0 runs (fp16 channels-last values, the
default); without it they run with SPINDLE_CUDA_NHWC=0 (the NCHW path).
At fp16 it also checks the default layout: mini_wav2lip with SPINDLE_CUDA_NHWC
unset and =1 plans its convolutions channels-last, with =0 it does not.

usage: engine-cases.py SPINDLE WORKDIR [--precision fp32|tf32|fp16] [--nhwc]
Exits 77 (skipped) when onnx/onnxruntime are not installed.
"""
import os
import re
import subprocess
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

KNOWN_BUGS = {}

# Cases whose named node must run on the CPU fallback (an operand it reads on
# the host is computed by a node on the GPU): run with the default fallback,
# which must say so, and compared like the rest.
ON_CPU = {"clip_min_from_a_node": "Clip", "pad_value_from_a_node": "Pad"}

rng = np.random.default_rng(5)


def r(*s):
    return rng.uniform(-1, 1, s).astype(np.float32)


cases = {}


def case(name, nodes, feeds, inits={}, opset=17):
    ins = [h.make_tensor_value_info(k, T.FLOAT, list(v.shape)) for k, v in feeds.items()]
    g = h.make_graph(nodes, name, ins, [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(v, k) for k, v in inits.items()])
    cases[name] = (h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), feeds)


case("matmul_4d_batched", [h.make_node("MatMul", ["a", "b"], ["y"])], {"a": r(2, 3, 4, 5), "b": r(2, 3, 5, 6)})
case("matmul_3d_x_2d_const", [h.make_node("MatMul", ["a", "w"], ["y"])], {"a": r(2, 3, 5)}, {"w": r(5, 4)})
case("gemm_alpha_bias", [h.make_node("Gemm", ["a", "w", "c"], ["y"], alpha=0.5)], {"a": r(3, 5)}, {"w": r(5, 4), "c": r(4)})
case("gemm_alpha_bias_relu", [h.make_node("Gemm", ["a", "w", "c"], ["g"], alpha=0.5, transB=1), h.make_node("Relu", ["g"], ["y"])], {"a": r(3, 5)}, {"w": r(4, 5), "c": r(4)})
case("gemm_beta_half", [h.make_node("Gemm", ["a", "w", "c"], ["y"], beta=0.5)], {"a": r(3, 5)}, {"w": r(5, 4), "c": r(4)})
case("gemm_c_2d", [h.make_node("Gemm", ["a", "w", "c"], ["y"], beta=2.0)], {"a": r(3, 5)}, {"w": r(5, 4), "c": r(3, 4)})
case("gemm_c_input", [h.make_node("Gemm", ["a", "w", "c"], ["y"])], {"a": r(3, 5), "c": r(4)}, {"w": r(5, 4)})
case("gemm_c_input_1x1", [h.make_node("Gemm", ["a", "w", "c"], ["y"])], {"a": r(3, 5), "c": r(1, 1)}, {"w": r(5, 4)})
case("gemm_transA_transB", [h.make_node("Gemm", ["a", "w"], ["y"], transA=1, transB=1)], {"a": r(5, 3)}, {"w": r(4, 5)})
case("gemm_two_inputs", [h.make_node("Gemm", ["a", "b"], ["y"], transB=1)], {"a": r(3, 5), "b": r(4, 5)})
case("conv_add_relu_fused", [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Add", ["c", "z"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
     {"x": r(2, 3, 6, 5), "z": r(2, 4, 6, 5)}, {"w": r(4, 3, 3, 3), "b": r(4)})
case("conv_add_relu_fused_nobias", [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Add", ["z", "c"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
     {"x": r(2, 3, 6, 5), "z": r(2, 4, 6, 5)}, {"w": r(4, 3, 3, 3)})
case("conv_relu_nobias", [h.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2]), h.make_node("Relu", ["c"], ["y"])], {"x": r(1, 3, 7, 7)}, {"w": r(5, 3, 3, 3)})
case("conv_add_input_relu_residual_is_x", [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Add", ["c", "x"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
     {"x": r(2, 4, 5, 5)}, {"w": r(4, 4, 3, 3), "b": r(4)})
case("depthwise_relu", [h.make_node("Conv", ["x", "w", "b"], ["c"], group=6, pads=[2, 2, 2, 2], dilations=[2, 2]), h.make_node("Relu", ["c"], ["y"])], {"x": r(1, 6, 8, 7)}, {"w": r(6, 1, 3, 3), "b": r(6)})
case("convtranspose_outpad_dil", [h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 0], dilations=[2, 1])], {"x": r(1, 4, 5, 4)}, {"w": r(4, 3, 3, 3), "b": r(3)})
case("convtranspose_relu_sigmoid", [h.make_node("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2]), h.make_node("Sigmoid", ["c"], ["y"])], {"x": r(2, 4, 3, 3)}, {"w": r(4, 2, 2, 2)})
case("concat9_const_last", [h.make_node("Relu", [f"x{i}"], [f"r{i}"]) for i in range(9)] + [h.make_node("Concat", [f"r{i}" for i in range(9)] + ["k"], ["y"], axis=1)],
     {f"x{i}": r(1, 2, 3, 3) for i in range(9)}, {"k": r(1, 2, 3, 3)})
case("concat_const_first", [h.make_node("Concat", ["k", "x"], ["y"], axis=1)], {"x": r(2, 2, 3, 3)}, {"k": r(2, 1, 3, 3)})
case("avgpool_ceil_include_pad", [h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)], {"x": r(1, 2, 6, 6)})
case("avgpool_ceil_exclude_pad", [h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)], {"x": r(1, 2, 6, 6)})
case("maxpool_dilated", [h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1])], {"x": r(1, 2, 6, 7)})
case("bn_standalone", [h.make_node("Relu", ["x"], ["q"]), h.make_node("BatchNormalization", ["q", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)], {"x": r(2, 3, 4, 4)},
     {"s": r(3), "bb": r(3), "m": r(3), "v": np.abs(r(3)) + 0.5})
case("prelu_full", [h.make_node("PRelu", ["x", "s"], ["y"])], {"x": r(2, 3, 4, 4)}, {"s": r(3, 4, 4)})
case("softmax_axis2_4d", [h.make_node("Softmax", ["x"], ["y"], axis=2)], {"x": r(2, 3, 4, 5)})
case("transpose_5d", [h.make_node("Transpose", ["x"], ["y"], perm=[0, 3, 1, 4, 2])], {"x": r(2, 3, 4, 5, 2)})
case("resize_linear_3d", [h.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear")], {"x": r(1, 2, 3, 4, 5)}, {"sc": np.array([1, 1, 2, 1.5, 2], np.float32)})
case("resize_nearest_down", [h.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")], {"x": r(1, 2, 8, 9)}, {"sc": np.array([1, 1, 0.5, 0.34], np.float32)})
case("d2s_then_conv", [h.make_node("DepthToSpace", ["x"], ["d"], blocksize=2), h.make_node("Conv", ["d", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": r(1, 8, 3, 3)}, {"w": r(3, 2, 3, 3)})
case("clip_min_from_a_node", [h.make_node("Relu", ["lo"], ["l2"]), h.make_node("Clip", ["x", "l2"], ["y"])],
     {"x": r(2, 3), "lo": np.array(0.25, np.float32)})
case("pad_value_from_a_node", [h.make_node("Relu", ["v"], ["v2"]), h.make_node("Pad", ["x", "p", "v2"], ["y"])],
     {"x": r(1, 2, 2, 3), "v": np.array(0.5, np.float32)}, {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)})
case("mini_wav2lip", [
    h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
    h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), h.make_node("Add", ["c2", "r1"], ["s2"]), h.make_node("Relu", ["s2"], ["r2"]),
    h.make_node("Concat", ["r2", "a"], ["cat"], axis=1),
    h.make_node("ConvTranspose", ["cat", "wt", "bt"], ["up"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), h.make_node("Relu", ["up"], ["ru"]),
    h.make_node("Conv", ["ru", "w3", "b3"], ["c3"]), h.make_node("Sigmoid", ["c3"], ["y"])],
    {"x": r(2, 3, 8, 8), "a": r(2, 4, 8, 8)},
    {"w1": r(8, 3, 3, 3) * 0.5, "b1": r(8), "w2": r(8, 8, 3, 3) * 0.3, "b2": r(8), "wt": r(12, 6, 3, 3) * 0.3, "bt": r(6), "w3": r(3, 6, 1, 1), "b3": r(3)})


def run(spindle, path, out, device, precision, args, on_cpu=None, env=None):
    """The output y of one `model run`, or an error message, and what the run
    logged. on_cpu: the op the run must report on the CPU fallback (else
    nothing may fall back)."""
    fb = [] if on_cpu else ["--fallback", "error"]
    pr = subprocess.run([spindle, "model", "run", path, "--output-dir", out, "--device", device,
                         "--precision", precision, "--repeat", "3"] + fb + args,
                        capture_output=True, text=True, timeout=300, env=env)
    if pr.returncode:
        return None, f"exit {pr.returncode}: " + pr.stderr.strip().replace("\n", " | "), pr.stderr
    if on_cpu and not re.search(r"run on the CPU.*\(" + on_cpu + r"\)", pr.stderr):
        return None, f"{on_cpu} did not fall back to the CPU: " + pr.stderr.strip().replace("\n", " | "), pr.stderr
    return np.load(os.path.join(out, "y.npy")), None, pr.stderr


def rel(a, ref):
    return float(np.max(np.abs(a - ref)) / max(1.0, float(np.max(np.abs(ref))))) if ref.size else 0.0


def main():
    args = sys.argv[1:]
    prec = "fp32"
    env = dict(os.environ)
    env["SPINDLE_CUDA_NHWC"] = "0"  # fp16 channels-last is the default: without --nhwc, the NCHW path
    if "--nhwc" in args:
        args.remove("--nhwc")
        env["SPINDLE_CUDA_NHWC"] = "1"
    if "--precision" in args:
        i = args.index("--precision")
        prec = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__)
        return 2
    spindle, work = args
    tol = 1e-2 if prec == "fp16" else 1e-4
    failed = xfail = 0
    for name, (m, feeds) in cases.items():
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "model.onnx")
        onnx.save(m, p)
        ref = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        ins = []
        for k, v in feeds.items():
            np.save(os.path.join(d, k + ".npy"), v)
            ins += ["--input", f"{k}={os.path.join(d, k + '.npy')}"]
        cpu, cpu_err, _ = run(spindle, p, os.path.join(d, "cpu"), "cpu", "fp32", ins)
        gpu, gpu_err, _ = run(spindle, p, os.path.join(d, "cuda"), "cuda:0", prec, ins, ON_CPU.get(name), env)
        if cpu_err or gpu_err:
            ok, msg = False, f"cpu: {cpu_err or 'ok'}; cuda:0: {gpu_err or 'ok'}"
        elif cpu.shape != gpu.shape:
            ok, msg = False, f"shapes: cpu {cpu.shape}, cuda:0 {gpu.shape}"
        else:
            e = rel(gpu, cpu)
            ok = e <= tol
            msg = f"cuda:0 vs cpu {e:.2e} (tolerance {tol:g}); vs ONNX Runtime: cpu {rel(cpu, ref):.2e}, cuda:0 {rel(gpu, ref):.2e}"
        if name in KNOWN_BUGS:
            if ok:
                failed += 1
                print(f"XPASS {name}: {msg} -- take it off KNOWN_BUGS")
            else:
                xfail += 1
                print(f"XFAIL {name}: {msg} [{KNOWN_BUGS[name]}]")
            continue
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}")
    if prec == "fp16":
        failed += not layout_default(spindle, work)
    print(f"{len(cases) - failed - xfail} passed, {xfail} known bugs, {failed} failed")
    return 1 if failed else 0


def layout_default(spindle, work):
    """fp16 channels-last is the default: mini_wav2lip at fp16 with
    SPINDLE_CUDA_NHWC unset and =1 plans its convolutions channels-last (the
    load-time line says so), with =0 it does not."""
    d = os.path.join(work, "mini_wav2lip")
    p = os.path.join(d, "model.onnx")
    ins = []
    for k in cases["mini_wav2lip"][1]:
        ins += ["--input", f"{k}={os.path.join(d, k + '.npy')}"]
    ok = True
    for val, want in ((None, True), ("1", True), ("0", False)):
        env = dict(os.environ)
        env.pop("SPINDLE_CUDA_NHWC", None)
        if val is not None:
            env["SPINDLE_CUDA_NHWC"] = val
        _, why, log = run(spindle, p, os.path.join(d, f"layout-{val}"), "cuda:0", "fp16", ins, env=env)
        said = re.search(r"fp16 channels-last: (\d+) of (\d+) convolutions", log)
        got = bool(said) and said.group(1) != "0"
        good = why is None and got == want
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} layout, SPINDLE_CUDA_NHWC {'unset' if val is None else '=' + val}: "
              f"{said.group(0) if said else 'no channels-last line'}{'' if why is None else ' (' + why[-300:] + ')'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
