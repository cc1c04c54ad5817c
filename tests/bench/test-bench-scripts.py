#!/usr/bin/env python3
"""The GPU session's benchmark scripts, run small on the CPU.

usage: test-bench-scripts.py SPINDLE_BUILD SOURCE_ROOT

A GPU host has no ffmpeg CLI: there tools/make-bench-clips.py makes the
clips and the Python pipeline of tests/bench/pipeline-gpu-bench.py encodes
through `spindle run` fed raw frames on its standard input. Both broke once
without a test noticing (a decode path of /dev/stdin, refused as a named
pipe after the last GPU session), which would have cost a GPU session its
Python figures. So: two clips of 0.6 s at 320x180 (big enough for the
Haar cascade to find the face), then both pipelines, 5 frames, both sides
on the CPU with that encoder, Spindle's runs at --log-level debug: every
side must finish with every frame, the Python side's file must hold them,
and lipsync's (only) must report the Wav2Lip batches of its last job.
Exits 77 when the scripts' Python packages (OpenCV, onnxruntime, onnx) or
scikit-image's astronaut picture are missing.
"""
import json
import os
import subprocess
import sys
import tempfile


def picture_missing():
    """make-bench-clips.py's picture: scikit-image's, imported or Debian's file."""
    try:
        import skimage.data  # noqa: F401
        return None
    except ImportError:
        pass
    if os.path.exists("/usr/lib/python3/dist-packages/skimage/data/astronaut.png"):
        return None
    return "no scikit-image astronaut.png (python3-skimage)"


def main():
    build, src = sys.argv[1], sys.argv[2]
    try:
        import cv2  # noqa: F401
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        print(f"skip: {e}")
        return 77
    tmp = tempfile.mkdtemp(prefix="spn-bench-scripts-")
    clips, work = os.path.join(tmp, "clips"), os.path.join(tmp, "work")
    if r_skip := picture_missing():
        print(f"skip: {r_skip}")
        return 77
    r = subprocess.run([sys.executable, os.path.join(src, "tools", "make-bench-clips.py"), clips, "--build", build,
                        "--seconds", "0.6", "--sizes", "320x180"], capture_output=True, text=True, timeout=300)
    print(r.stdout + r.stderr)
    if r.returncode != 0 or sorted(os.listdir(clips)) != ["speech.wav", "talking-head-180p.mp4"]:
        print(f"FAIL: make-bench-clips.py: exit {r.returncode}, made {os.listdir(clips) if os.path.isdir(clips) else []}")
        return 1
    out = os.path.join(tmp, "bench.json")
    r = subprocess.run([sys.executable, os.path.join(src, "tests", "bench", "pipeline-gpu-bench.py"), "--build", build,
                        "--clips", clips, "--devices", "cpu", "--frames", "5", "--encoder", "spindle", "--repeat", "2",
                        "--log-level", "debug",
                        "--out", out, "--workdir", work], capture_output=True, text=True, timeout=600)
    print(r.stdout[-6000:] + r.stderr[-6000:])
    if r.returncode != 0:
        print(f"FAIL: pipeline-gpu-bench.py: exit {r.returncode}")
        return 1
    got = json.load(open(out))
    bad = []
    if got.get("peer_encoder") != "spindle":
        bad.append(f"peer encoder {got.get('peer_encoder')}")
    names = sorted(x["pipeline"] for x in got["results"])
    if names != ["enhance", "lipsync"]:
        bad.append(f"pipelines {names}")
    for x in got["results"]:
        for side in ("spindle", "gpu_part", "python"):
            if (x.get(side) or {}).get("frames") != 5:
                bad.append(f"{x['pipeline']} {side}: {(x.get(side) or {}).get('frames')} frames, want 5")
        if not x.get("ratio"):
            bad.append(f"{x['pipeline']}: no ratio")
        # --log-level debug: the last job's Wav2Lip batches (lipsync only)
        lb = x["spindle"].get("lips_batches")
        if (x["pipeline"] == "lipsync") != bool(lb) or (lb and not 0 < sum(lb) <= 5):
            bad.append(f"{x['pipeline']}: Wav2Lip batches {lb}")
        cap = cv2.VideoCapture(os.path.join(work, f"{x['pipeline']}-180p-python.mp4"))
        n = 0
        while cap.read()[0]:
            n += 1
        if n != 5:
            bad.append(f"{x['pipeline']}: the Python side's file holds {n} frames, want 5")
    for b in bad:
        print("FAIL: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
