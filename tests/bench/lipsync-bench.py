#!/usr/bin/env python3
"""Lip-sync throughput: the lipsync stage end to end beside ONNX Runtime
running the bare network on the same number of faces, in the same run.

  lipsync-bench.py BUILD_DIR [--width 0.25] [--frames 256] [--batch 32]

Spindle: `spindle run` of one job of --frames frames from the test sources
(tests/lipsync; every 4th frame has no face) through lipsync with
batch_size = --batch, timed as a whole (process start, model load, the
engine's runs, pre/post-processing, paste, file writes). Peer: ONNX Runtime
(CPU, default threads) on the network alone, the same number of faces in
batches of --batch, inputs prepared beforehand. The ratio is Spindle's
faces/s over ONNX Runtime's: what the whole stage keeps of the
bare network's speed. Needs onnx, onnxruntime; not a test.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lipsync")
    spindle = os.path.join(a.build, "core", "cli", "spindle")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "w2l.onnx")
        subprocess.run([sys.executable, os.path.join(src, "make-w2l-model.py"), model, "--arch", "wav2lip",
                        "--width", str(a.width)], check=True)
        cfg = os.path.join(tmp, "p.toml")
        with open(cfg, "w") as fh:
            fh.write(f"""[pipeline]
name = "lipsync-bench"
[[stage]]
name = "video"
kind = "lt_faces"
[[stage]]
name = "mel"
kind = "lt_mel"
[[stage]]
name = "lips"
kind = "lipsync"
inputs = {{ video = "video.faces", mel = "mel.mel" }}
model = "w2l.onnx"
batch_size = {a.batch}
batching = {{ max_batch = {2 * a.batch}, max_delay_ms = 20 }}
[[stage]]
name = "sink"
kind = "filesink"
inputs = ["lips.video"]
""")
        n = a.frames
        faces = sum(1 for i in range(n) if i % 4 != 3)
        args = [spindle, "run", cfg, "--devices", "cpu", "--set", f"video.frames={n}", "--set", f"mel.chunks={n}",
                "--set", f"sink.path={os.path.join(tmp, 'out.rgb')}"]
        for d in (os.path.join(a.build, "stages", "util"), os.path.join(a.build, "stages", "lipsync"),
                  os.path.join(a.build, "tests", "lipsync")):
            args += ["--plugin-path", d]
        t0 = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        t_sp = time.perf_counter() - t0

        sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        face = rng.random((a.batch, 6, 96, 96), dtype=np.float32)
        mel = rng.random((a.batch, 1, 80, 16), dtype=np.float32) - 4
        sess.run(None, {"face": face[:1], "mel": mel[:1]})  # warm up
        t0 = time.perf_counter()
        left = faces
        while left > 0:
            b = min(left, a.batch)
            sess.run(None, {"face": face[:b], "mel": mel[:b]})
            left -= b
        t_ort = time.perf_counter() - t0
    sp, ref = faces / t_sp, faces / t_ort
    print(f"Wav2Lip width {a.width}, {n} frames ({faces} faces, 160x120), batch {a.batch}")
    print(f"spindle lipsync pipeline (whole run)   {sp:9.1f} faces/s  ({t_sp:.2f} s)")
    print(f"onnxruntime, network only (same run)   {ref:9.1f} faces/s  ({t_ort:.2f} s)")
    print(f"ratio spindle / onnxruntime            {sp / ref:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
