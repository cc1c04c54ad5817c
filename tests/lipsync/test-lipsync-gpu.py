#!/usr/bin/env python3
"""The lipsync stage on a GPU against the same stage on the CPU (suite gpu).

  test-lipsync-gpu.py SPINDLE MAKE_MODEL_SCRIPT PLUGIN_DIR...

The pipeline of test-lipsync-ref.py (test sources → lipsync → filesink) runs
with --devices cpu and with --devices cuda at precision fp32: the lipsync
stage takes its GPU body (frames uploaded once, crops prepared and pasted by
kernels, the model on the CUDA backend). The issue's bar: within 2 levels
inside the crop, identical outside; the GPU body ran (every frame leaves it
in device memory: the edge to the CPU sink copies each one down) and every
frame came out.

The mel chunks are cut from one spectrogram (lt_mel's mode "windows"), which
the source also sends whole with seq 0 in mode "spectrogram", as melspec
does. On the GPU the spectrogram goes up once and the chunks are cut there:
the stage's own host-to-device bytes are its frames' uploads plus the
spectrogram, not plus 5120 bytes a synced frame; without it ("windows") the
chunks go up with their batches, as before, and the output is the same byte
for byte. Exits 77 without a CUDA device or without onnx.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

W, H = 160, 120


def main():
    spindle, script, plugin_dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m.onnx")
        r = subprocess.run([sys.executable, script, model])
        if r.returncode == 77:
            print("skip: no onnx package")
            return 77
        assert r.returncode == 0, "model generation failed"
        cfg = os.path.join(tmp, "p.toml")
        with open(cfg, "w") as fh:
            fh.write("""[pipeline]
name = "lipsync-gpu"
[[stage]]
name = "video"
kind = "lt_faces"
[[stage]]
name = "mel"
kind = "lt_mel"
[[stage]]
name = "lips"
kind = "lipsync"
inputs = { video = "video.faces", mel = "mel.mel" }
model = "m.onnx"
batch_size = 5
precision = "fp32"
[[stage]]
name = "sink"
kind = "filesink"
inputs = ["lips.video"]
""")
        n, seed = 12, 5
        outs, lips = {}, {}
        # first = 3: a job cut at a start (melspec's start, a segment): its
        # chunks are the spectrogram's from chunk 3, which goes whole with
        # that index
        for dev, mode, first in (("cuda", "spectrogram", 0), ("cuda", "windows", 0), ("cpu", "spectrogram", 0),
                                 ("cuda", "spectrogram", 3), ("cuda", "windows", 3), ("cpu", "spectrogram", 3)):
            mode = mode if not first else f"{mode}@{first}"
            out = os.path.join(tmp, f"{dev}-{mode}.rgb")
            args = [spindle, "run", cfg, "--devices", dev, "--set", f"video.frames={n}", "--set", f"video.seed={seed}",
                    "--set", f"mel.chunks={n}", "--set", f"mel.seed={seed}", "--set", f"mel.mode={mode.split('@')[0]}",
                    "--set", f"mel.first={first}", "--set", f"sink.path={out}", "--log-format", "json"]
            for d in plugin_dirs:
                args += ["--plugin-path", d]
            r = subprocess.run(args, capture_output=True, text=True)
            if dev == "cuda" and r.returncode != 0 and "no CUDA device" in r.stderr:
                print("skip: no CUDA device here")
                return 77
            assert r.returncode == 0, f"spindle run --devices {dev}: {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
            assert "left aside" not in r.stderr, f"{dev} {mode}: lipsync refused the spectrogram: {r.stderr[-2000:]}"
            if dev == "cuda":
                # frames leave lipsync in device memory: the edge to the CPU sink copies each one down
                summary = json.loads(r.stdout.strip().splitlines()[-1])
                edge = [e for e in summary["edges"] if e["from"] == "lips" and e["to"] == "sink"]
                assert edge and edge[0]["d2h"]["copies"] == n, f"lipsync did not run on a GPU: {edge}"
                lips[mode] = [s for s in summary["stages"] if s["name"] == "lips"][0]["h2d"]
            got = np.fromfile(out, dtype=np.uint8)
            assert got.size == n * H * W * 3, f"{dev}: {got.size} bytes, want {n} frames"
            outs[(dev, mode)] = got.reshape(n, H, W, 3).astype(int)
        # What lipsync itself uploaded: every frame (the test source's are in
        # host memory), and the mel input of its synced frames (those with a
        # face: every 4th has none). With the spectrogram: it, once; without:
        # one 80x16 chunk each.
        frames_up, synced = n * H * W * 3, sum(1 for i in range(n) if i % 4 != 3)
        for sfx, first in (("", 0), ("@3", 3)):
            cols = int((first + n - 1) * (80.0 / 25.0)) + 15  # lipsync-test-pattern.h's lt_spec_cols
            want = {"spectrogram" + sfx: frames_up + 80 * cols * 4, "windows" + sfx: frames_up + synced * 80 * 16 * 4}
            for mode, w in want.items():
                assert lips[mode]["bytes"] == w, f"{mode}: lipsync uploaded {lips[mode]}, want {w} bytes"
            sp = "spectrogram" + sfx
            assert lips[sp]["copies"] == n + 1, f"{sp}: {lips[sp]}, want {n + 1} copies"
            print(f"ok{sfx}: lipsync's uploads: {lips[sp]['bytes'] - frames_up} mel bytes with the spectrogram, "
                  f"{lips['windows' + sfx]['bytes'] - frames_up} with the chunks, besides {frames_up} of frames")
            same = outs[("cuda", sp)] == outs[("cuda", "windows" + sfx)]
            assert same.all(), f"cuda{sfx}: the chunks cut on the GPU gave other bytes than the uploaded ones " \
                f"({(~same).sum()})"
            d = np.abs(outs[("cuda", sp)] - outs[("cpu", sp)])
            outside = np.ones((n, H, W), bool)
            outside[:, 30:90, 40:100] = False  # the crop of lipsync-test-pattern.h's box with the default pads
            assert d[outside].max() == 0, f"{sfx}: pixels outside the crop differ (max {d[outside].max()})"
            inside = d[:, 30:90, 40:100]
            assert inside.max() <= 2, f"{sfx}: inside the crop: max difference {inside.max()} > 2 levels"
            print(f"ok{sfx}: {n} frames; inside the crop max {inside.max()}, mean {inside.mean():.4f}; "
                  f"outside identical")
        # the cut job's frames are synced with other chunks than the uncut one's
        assert (outs[("cpu", "spectrogram@3")] != outs[("cpu", "spectrogram")]).any(), "first = 3 changed nothing"
    return 0


if __name__ == "__main__":
    sys.exit(main())
