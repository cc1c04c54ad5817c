#!/usr/bin/env python3
"""GPU engine benchmark: Spindle's CUDA backend against PyTorch on the same GPU.

For each configuration it builds the full-size model with random weights
(tests/engine/models.py, the same generator engine-bench.py uses), saves it
as ONNX, and times in this one run, one after the other on the same input:

  spindle fp32 / tf32 / fp16   `engine-bench MODEL --device cuda:N --precision P`
                               (runs replayed as CUDA Graphs after the warm-up);
                               fp16 here is the NCHW path (SPINDLE_CUDA_NHWC=0)
  spindle fp16 no graphs       the same with SPINDLE_NO_CUDA_GRAPHS=1 (eager)
  spindle fp16 nhwc            fp16 with SPINDLE_CUDA_NHWC=1: activations kept
                               fp16 channels-last between convolutions (the
                               backend's default for fp16 models)
  torch eager fp32             the same ONNX graph converted to torch.nn modules
                               (onnx2torch: same weights), cudnn.benchmark,
                               channels_last
  torch eager fp16 autocast    the same, under torch.autocast(float16)
  torch.compile fp16 autocast  where torch.compile works for the graph

Configurations: Wav2Lip at batch 1, 32 and 128 (96x96 face, 80x16 mel),
RetinaFace MobileNet-0.25 at 640x640, SRVGGNetCompact x4 at 270x480 and
RRDBNet x4 at 128x128, batch 1 unless stated.

What is timed, the same way on both sides: "ms" is the median wall time of
one forward pass with the input already on the GPU and the output left there,
then a synchronise (Spindle: `engine-bench --device-io`, spn_model_run_on
on a stream then cudaStreamSynchronize; PyTorch: the module on CUDA tensors
then torch.cuda.synchronize()). "ms+copies" is the same with the input
copied from host memory and the output copied back (Spindle: spn_model_run
with host tensors). Throughput (samples/s) is batch / "ms".

usage: engine-gpu-bench.py BUILD_DIR [--device cuda:0] [--iters N]
                           [--only NAME[,NAME...]] [--workdir DIR] [--spindle LIST]
                           [--no-compile]
--only: configurations by exact name (wav2lip_b1) or by a part of their
names (wav2lip: all three batches), comma-separated.
--spindle: which Spindle variants, comma-separated among fp32, tf32, fp16,
fp16-nographs, fp16-nhwc (default: all). Each figure is printed as soon as
it is measured, torch.compile last: a time box that ends while it compiles
(RRDBNet's compilation takes minutes on 16 cores) keeps everything else;
--no-compile leaves it out.
Needs a CUDA GPU, torch (with CUDA) and onnx2torch; exits 77 (skipped)
without them.
"""
import argparse
import os
import re
import subprocess
import sys
import time

try:
    import numpy as np
    import onnx
    import torch
    from onnx2torch import convert
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
import models  # noqa: E402


def spindle_time(exe, path, feeds, work, name, device, precision, iters, graphs=True, device_io=False, nhwc=False):
    args = [exe, path, "--device", device, "--precision", precision, "--iters", str(iters), "--warmup", "5"]
    if device_io:
        args.append("--device-io")
    env = dict(os.environ)
    if not graphs:
        env["SPINDLE_NO_CUDA_GRAPHS"] = "1"
    env["SPINDLE_CUDA_NHWC"] = "1" if nhwc else "0"  # each variant says which, whatever the default
    for k, v in feeds.items():
        p = os.path.join(work, f"{name}_{k}.npy")
        np.save(p, v)
        args += ["--input", f"{k}={p}"]
    pr = subprocess.run(args, capture_output=True, text=True, env=env)
    if pr.returncode:
        return None, pr.stderr.strip().splitlines()[-1] if pr.stderr.strip() else f"exit {pr.returncode}"
    kv = dict(re.findall(r"(\w+)=([\d.e+-]+)", pr.stdout))
    return float(kv["median_ms"]), ""


def torch_time(fn, iters):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - a) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def torch_variants(path, feeds, dev, iters, compile_too=True):
    """(variant, (ms with GPU-resident input, ms with host copies in and out) or error), each as soon as it
    is measured: a time box that ends during torch.compile (minutes for RRDBNet) keeps the eager figures"""
    torch.backends.cudnn.benchmark = True
    net = convert(onnx.load(path)).to(dev).eval().to(memory_format=torch.channels_last)
    host = [torch.from_numpy(v) for v in feeds.values()]
    gpu = [t.to(dev).contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t.to(dev) for t in host]

    def run(module, amp, inputs):
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            return module(*inputs)

    def with_copies(module, amp):
        ins = [t.to(dev, non_blocking=False) for t in host]
        r = run(module, amp, ins)
        rs = r if isinstance(r, (tuple, list)) else [r]
        return [x.float().cpu() for x in rs]

    for name, module, amp in (("torch eager fp32", net, False), ("torch eager fp16 autocast", net, True)):
        try:
            yield name, (torch_time(lambda: run(module, amp, gpu), iters),
                         torch_time(lambda: with_copies(module, amp), iters))
        except Exception as e:  # report and go on
            yield name, f"{type(e).__name__}: {e}"
    if not compile_too:
        yield "torch.compile fp16 autocast", "not run (--no-compile)"
        return
    try:
        comp = torch.compile(net)
        yield "torch.compile fp16 autocast", (torch_time(lambda: run(comp, True, gpu), iters),
                                              torch_time(lambda: with_copies(comp, True), iters))
    except Exception as e:
        yield "torch.compile fp16 autocast", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--only")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--spindle", default="fp32,tf32,fp16,fp16-nographs,fp16-nhwc")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave torch.compile out (its compilation of RRDBNet takes minutes)")
    a = ap.parse_args()
    variants = {"fp32": ("fp32", True, False), "tf32": ("tf32", True, False), "fp16": ("fp16", True, False),
                "fp16-nographs": ("fp16", False, False), "fp16-nhwc": ("fp16", True, True)}
    wanted = [v.strip() for v in a.spindle.split(",") if v.strip()]
    for v in wanted:
        if v not in variants:
            ap.error(f"--spindle: unknown variant {v!r} (known: {', '.join(variants)})")
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return 77
    dev = torch.device(a.device)
    work = a.workdir or os.path.join(a.build, "bench-engine-gpu")
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(a.build, "tests", "bench", "engine-bench")
    rng = np.random.default_rng(0)
    f = lambda *s: rng.uniform(0, 1, s).astype(np.float32)
    configs = [
        ("wav2lip_b1", "wav2lip", lambda: models.wav2lip(1.0), lambda: {"mel": f(1, 1, 80, 16), "face": f(1, 6, 96, 96)}, 1),
        ("wav2lip_b32", "wav2lip", lambda: models.wav2lip(1.0), lambda: {"mel": f(32, 1, 80, 16), "face": f(32, 6, 96, 96)}, 32),
        ("wav2lip_b128", "wav2lip", lambda: models.wav2lip(1.0), lambda: {"mel": f(128, 1, 80, 16), "face": f(128, 6, 96, 96)}, 128),
        ("retinaface_mnet025_640", "retinaface", lambda: models.retinaface(), lambda: {"input": f(1, 3, 640, 640)}, 1),
        ("srvggnet_x4_270x480", "srvgg", lambda: models.srvgg(64, 32, 4), lambda: {"input": f(1, 3, 270, 480)}, 1),
        ("rrdbnet_x4_128", "rrdbnet", lambda: models.rrdbnet(64, 32, 23), lambda: {"input": f(1, 3, 128, 128)}, 1),
    ]
    names = {c[0] for c in configs}  # --only: exact names, or substrings of them
    print(f"GPU: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'config':24} {'variant':30} {'ms':>9} {'ms+copies':>10} {'samples/s':>10}")
    for name, base, mk, feeds_fn, batch in configs:
        if a.only and not any(o == name or (o not in names and o in name) for o in a.only.split(",")):
            continue
        path = os.path.join(work, base + ".onnx")
        if not os.path.exists(path):
            onnx.save(mk(), path)
        feeds = feeds_fn()
        for v in wanted:
            prec, graphs, nhwc = variants[v]
            label = "spindle " + prec + ("" if graphs else " no graphs") + (" nhwc" if nhwc else "")
            dms, why = spindle_time(exe, path, feeds, work, name, a.device, prec, a.iters, graphs, True, nhwc)
            ms, why2 = spindle_time(exe, path, feeds, work, name, a.device, prec, a.iters, graphs, False, nhwc)
            if dms is None or ms is None:
                print(f"{name:24} {label:30} failed: {why or why2}")
            else:
                print(f"{name:24} {label:30} {dms:9.3f} {ms:10.3f} {batch * 1e3 / dms:10.1f}")
            sys.stdout.flush()
        for variant, res in torch_variants(path, feeds, dev, a.iters, not a.no_compile):
            if isinstance(res, str):
                print(f"{name:24} {variant:30} failed: {res}")
            else:
                print(f"{name:24} {variant:30} {res[0]:9.3f} {res[1]:10.3f} {batch * 1e3 / res[0]:10.1f}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
