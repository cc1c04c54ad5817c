#!/usr/bin/env python3
"""Make the pipeline benchmark's clips where ffmpeg and espeak-ng are missing
(a GPU host): the same picture as tools/make-bench-clips.sh, drawn with
OpenCV, encoded by Spindle's own encoder (libx264 + AAC) from YUV4MPEG frames
on its standard input.

  make-bench-clips.py OUTDIR --build BUILD_DIR [--seconds 10] [--sizes 1280x720,1920x1080] [--crf 26]

Writes OUTDIR/speech.wav and OUTDIR/talking-head-<H>p.mp4 (25 fps, H.264
yuv420p + AAC 16 kHz mono), the names pipeline-gpu-bench.py reads. The
picture: scikit-image's astronaut (public domain), at the frame's height,
centred on a dark background, zooming by 0.08 % a frame towards the face
with a sideways pan, as the shell script's zoompan. The speech: the sample
clip's espeak-ng sentence (samples/media/speech.wav, 4 s), repeated to the
clip's length. Frames are drawn in a slightly different way from ffmpeg's
zoompan, so the two scripts' clips are alike, not equal.

Needs python3 with numpy, opencv and scikit-image, and a Spindle build with
the media stages (its FFmpeg libraries found, e.g. under .gpu/run).
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import wave

import cv2
import numpy as np

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FPS = 25

ENCODE_TOML = """# YUV4MPEG on stdin -> H.264 + the speech as AAC
[pipeline]
name = "bench-clip"
[[stage]]
name = "decode"
kind = "decode"
path = "pipe:0"
pixel_format = "rgb24"
audio = false
[[stage]]
name = "encode"
kind = "encode"
inputs = ["decode.video"]
path = "out.mp4"
codec = "libx264"
preset = "medium"
"""


def astronaut_rgb():
    try:
        import skimage.data
        return skimage.data.astronaut()
    except ImportError:
        for d in ("/usr/lib/python3/dist-packages/skimage/data",):
            p = os.path.join(d, "astronaut.png")
            if os.path.exists(p):
                return cv2.imread(p)[:, :, ::-1]
    sys.exit("make-bench-clips.py: needs scikit-image (its astronaut.png)")


def speech(out, seconds):
    with wave.open(os.path.join(SRC, "samples", "media", "speech.wav"), "rb") as f:
        params = f.getparams()
        pcm = f.readframes(f.getnframes())
    need = int(seconds * params.framerate) * params.sampwidth * params.nchannels
    data = (pcm * (need // len(pcm) + 1))[:need]
    with wave.open(out, "wb") as f:
        f.setparams(params)
        f.writeframes(data)


def frames(img_rgb, w, h, n):
    canvas = np.empty((h, w, 3), np.uint8)
    canvas[:] = (0x48, 0x38, 0x30)  # BGR of 0x303848
    sq = cv2.resize(img_rgb[:, :, ::-1], (h, h), interpolation=cv2.INTER_AREA)
    x0 = (w - h) // 2
    canvas[:, max(0, x0):x0 + h] = sq[:, max(0, -x0):max(0, -x0) + min(w, h)]
    for i in range(n):
        z = 1 + 0.0008 * i
        cw, ch = w / z, h / z
        x = min(max(0.0, (w - cw) / 2 + 0.02 * w * math.sin(i / 40)), w - cw)
        y = (h - ch) / 3
        m = np.float32([[z, 0, -z * x], [0, z, -z * y]])
        yield cv2.warpAffine(canvas, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--build", required=True)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--sizes", default="1280x720,1920x1080")
    ap.add_argument("--crf", type=int, default=26)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    wav = os.path.join(a.out, "speech.wav")
    speech(wav, a.seconds)
    img = astronaut_rgb()
    spindle = os.path.join(os.path.abspath(a.build), "core", "cli", "spindle")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "clip.toml")
        with open(cfg, "w") as f:
            f.write(ENCODE_TOML)
        for s in a.sizes.split(","):
            w, h = (int(v) for v in s.split("x"))
            out = os.path.join(os.path.abspath(a.out), f"talking-head-{h}p.mp4")
            p = subprocess.Popen([spindle, "run", cfg, "--devices", "cpu", "--set", f"encode.path={out}",
                                  "--set", f"encode.crf={a.crf}", "--set", f"encode.audio_path={os.path.abspath(wav)}"],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
            p.stdin.write(f"YUV4MPEG2 W{w} H{h} F{FPS}:1 Ip A1:1 C420jpeg\n".encode())
            for f in frames(img, w, h, int(round(a.seconds * FPS))):
                p.stdin.write(b"FRAME\n")
                p.stdin.write(memoryview(cv2.cvtColor(f, cv2.COLOR_BGR2YUV_I420)))
            p.stdin.close()
            if p.wait():
                sys.exit(f"make-bench-clips.py: spindle exited {p.returncode} for {out}")
            print(f"{out}: {os.path.getsize(out)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
