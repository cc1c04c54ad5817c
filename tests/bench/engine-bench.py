#!/usr/bin/env python3
"""Engine benchmark: Spindle vs ONNX Runtime on full-size models.

Generates full-size Wav2Lip, RetinaFace-MobileNet0.25, SRVGGNetCompact (x4v3)
and (optionally) RRDBNet with random weights (tests/engine/models.py), then
for each configuration runs the C program `engine-bench` (Spindle) and ONNX
Runtime on the same .onnx file, the same input and the same thread count,
one after the other in this run, and prints latency, throughput, the ratio
(ours / ORT time; < 1 means Spindle is faster) and achieved GFLOP/s against
the machine's fp32 peak.

Peak = cores x SIMD fp32 lanes (16 with avx512f, 8 with avx2, 4 otherwise)
x 2 FMA units x 2 flops x base clock (from /proc/cpuinfo; turbo ignored).

With --baseline OTHER_BUILD_DIR the peer is another build of Spindle instead
of ONNX Runtime (to check a change for speed regressions): the two
engine-bench programs run alternately, --rounds times each, on the same file
and input, and the table gives the median of their medians.

usage: engine-bench.py BUILD_DIR [--threads N] [--iters N] [--only NAME] [--workdir DIR]
                       [--baseline OTHER_BUILD_DIR [--rounds N]]
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
import tomllib

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
import models  # noqa: E402


def cpu_peak(threads):
    flags, mhz = "", 0.0
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags") and not flags:
                flags = line
            if line.startswith("cpu MHz") and not mhz:
                mhz = float(line.split(":")[1])
    lanes = 16 if " avx512f" in flags else 8 if " avx2" in flags else 4
    return threads * lanes * 2 * 2 * mhz / 1e3, lanes, mhz


def model_flops(path, feeds):
    """FLOPs of Conv/ConvTranspose/MatMul/Gemm for these input shapes (ONNX
    shape inference with the inputs' concrete shapes)."""
    m = onnx.load(path)
    for i in m.graph.input:
        if i.name in feeds:
            for d, n in zip(i.type.tensor_type.shape.dim, feeds[i.name].shape):
                d.ClearField("dim_param")
                d.dim_value = n
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    shapes = {}
    for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        shapes[v.name] = dims
    for t in m.graph.initializer:
        shapes[t.name] = list(t.dims)
    total = 0.0
    for n in m.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            continue
        w = shapes.get(n.input[1])
        src = shapes.get(n.input[0])
        out = shapes.get(n.output[0])
        if not w or not out or None in out or None in w:
            continue
        if n.op_type == "Conv":
            total += 2.0 * np.prod(out) * np.prod(w[1:])
        elif n.op_type == "ConvTranspose":
            total += 2.0 * np.prod(src) * np.prod(w[1:])
        else:
            total += 2.0 * np.prod(out) * (src[-1] if src else 0)
    return total


def ort_time(path, feeds, threads, warmup, iters):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        s.run(None, feeds)
    ts = []
    for _ in range(iters):
        a = time.perf_counter()
        s.run(None, feeds)
        ts.append((time.perf_counter() - a) * 1e3)
    ts.sort()
    return ts[0], ts[len(ts) // 2]


def fetched_model(build, model, work):
    """The stored file of a pretrained model: looked up by name in
    BUILD/test-real-models (where tools/test.sh fetches) and then as `spindle
    model path` finds it; an ncnn model not stored is converted from the
    originals tools/test.sh fetched (BUILD/test-real-models/realesrgan-ncnn),
    and must then have the manifest's sha256. None when there is neither."""
    spindle = os.path.join(build, "core", "cli", "spindle")
    real = os.path.join(build, "test-real-models")
    env = dict(os.environ, SPINDLE_MODEL_PATH=":".join(p for p in (real, os.environ.get("SPINDLE_MODEL_PATH")) if p))
    pr = subprocess.run([spindle, "model", "path", model], capture_output=True, text=True, env=env)
    if pr.returncode == 0:
        return pr.stdout.strip()
    param = os.path.join(real, "realesrgan-ncnn", model + ".param")
    if not os.path.exists(param):
        return None
    out = os.path.join(work, model + ".onnx")
    pr = subprocess.run([spindle, "model", "convert-ncnn", param, param[:-6] + ".bin", out],
                        capture_output=True, text=True)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    with open(os.path.join(src, "models", "manifest.toml"), "rb") as f:
        want = tomllib.load(f)[model]["sha256"]
    if pr.returncode:
        raise SystemExit(f"{model}: converting {param} failed: {pr.stderr.strip()}")
    with open(out, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != want:
            raise SystemExit(f"{model}: {param} converts to another file than the manifest's")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    work = a.workdir or os.path.join(a.build, "bench-engine")
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(a.build, "tests", "bench", "engine-bench")
    rng = np.random.default_rng(0)
    f = lambda *s: rng.uniform(0, 1, s).astype(np.float32)
    configs = [
        ("wav2lip_b1", lambda: models.wav2lip(1.0), lambda: {"mel": f(1, 1, 80, 16), "face": f(1, 6, 96, 96)}),
        ("wav2lip_b32", lambda: models.wav2lip(1.0), lambda: {"mel": f(32, 1, 80, 16), "face": f(32, 6, 96, 96)}),
        ("retinaface_mnet025_640", lambda: models.retinaface(), lambda: {"input": f(1, 3, 640, 640)}),
        ("srvggnet_x4v3_256", lambda: models.srvgg(64, 32, 4), lambda: {"input": f(1, 3, 256, 256)}),
        ("rrdbnet_x4_64", lambda: models.rrdbnet(64, 32, 23), lambda: {"input": f(1, 3, 64, 64)}),
        # The pretrained models `spindle model fetch` stores, as they come (run when fetched).
        ("fetched:retinaface-mnet025_640", None, lambda: {"input": f(1, 3, 640, 640) * 255 - 117}),
        ("fetched:realesr-animevideov3-x2_256", None, lambda: {"input": f(1, 3, 256, 256)}),
        ("fetched:realesrgan-x4plus_64", None, lambda: {"input": f(1, 3, 64, 64)}),
    ]
    peak, lanes, mhz = cpu_peak(a.threads)
    print(f"machine: {a.threads} threads, {lanes} fp32 lanes, {mhz:.0f} MHz -> fp32 peak {peak:.0f} GFLOP/s")
    peer = "base" if a.baseline else "ORT"
    print(f"{'model':26} {'ours ms':>9} {peer + ' ms':>9} {'ratio':>6} {'ours/s':>8} {peer + '/s':>8} {'GFLOP/s':>8} {'%peak':>6}")
    for name, mk, feeds_fn in configs:
        if a.only and a.only not in name:
            continue
        base = name.rsplit("_b", 1)[0] if name.startswith("wav2lip") else name
        path = os.path.join(work, base + ".onnx")
        if mk is None:
            path = fetched_model(a.build, name[8:].rsplit("_", 1)[0], work)
            if path is None:
                print(f"{name}: not fetched (spindle model fetch {name[8:].rsplit('_', 1)[0]}); skipped")
                continue
            name = name[8:]
        elif not os.path.exists(path):
            onnx.save(mk(), path)
        feeds = feeds_fn()
        args = [exe, path, "--threads", str(a.threads), "--iters", str(a.iters), "--warmup", "2"]
        for k, v in feeds.items():
            p = os.path.join(work, f"{name.replace(':', '_')}_{k}.npy")
            np.save(p, v)
            args += ["--input", f"{k}={p}"]
        def one(prog):
            pr = subprocess.run([prog] + args[1:], capture_output=True, text=True)
            if pr.returncode:
                raise RuntimeError(pr.stderr.strip())
            return dict(re.findall(r"(\w+)=([\d.e+-]+)", pr.stdout))
        try:
            if a.baseline:
                peer_exe = os.path.join(a.baseline, "tests", "bench", "engine-bench")
                mine, theirs = [], []
                for _ in range(a.rounds):
                    kv = one(exe)
                    mine.append(float(kv["median_ms"]))
                    theirs.append(float(one(peer_exe)["median_ms"]))
                ours, ort_med = sorted(mine)[len(mine) // 2], sorted(theirs)[len(theirs) // 2]
            else:
                kv = one(exe)
                ours = float(kv["median_ms"])
        except RuntimeError as e:
            print(f"{name}: engine-bench failed: {e}")
            continue
        batch = int(kv["batch"])
        flops = model_flops(path, feeds)
        if not a.baseline:
            _, ort_med = ort_time(path, feeds, a.threads, 2, a.iters)
        gf = flops / ours / 1e6
        print(f"{name:26} {ours:9.2f} {ort_med:9.2f} {ours / ort_med:6.2f} {batch * 1e3 / ours:8.1f} "
              f"{batch * 1e3 / ort_med:8.1f} {gf:8.1f} {100 * gf / peak:5.1f}%", flush=True)


if __name__ == "__main__":
    main()
