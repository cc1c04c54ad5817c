#!/usr/bin/env python3
"""The lipsync stage against Wav2Lip's own pre/post-processing, in Python.

  test-lipsync-ref.py SPINDLE MAKE_MODEL_SCRIPT PLUGIN_DIR...

Runs `spindle run` on a pipeline of the test sources (lipsync-test-plugin.c)
→ lipsync (feather 0, i.e. Wav2Lip's hard paste) → filesink, and computes
the same frames the way Wav2Lip's inference script does, with OpenCV and
ONNX Runtime: crop frame[y1:y2, x1:x2] with the pads, cv2.resize to 96,
BGR, lower half masked, concatenated with the unmasked crop, / 255; the
network's output × 255 to u8, cv2.resize back to the crop, pasted. The two
may differ by OpenCV's fixed-point resize (±1 per resize) and by rounding
(Wav2Lip truncates the ×255, Spindle rounds; the reference here rounds);
anything else is a bug. Exits 77 without cv2, onnx or onnxruntime.
"""
import os
import subprocess
import sys
import tempfile

try:
    import cv2
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

W, H = 160, 120
BOX = (40, 30, 100, 80)  # lipsync-test-pattern.h
PADS = (0, 10, 0, 0)     # top, bottom, left, right (the stage's defaults)


def frame(seed, seq):
    y, x, c = np.meshgrid(np.arange(H), np.arange(W), np.arange(3), indexing="ij")
    return ((x * 3 + y * 5 + c * 70 + seed * 37 + seq * 11) % 256).astype(np.uint8)


def mel(seed, seq):
    b, s = np.meshgrid(np.arange(80), np.arange(16), indexing="ij")
    k = ((b * 7 + s * 3 + seed * 11 + seq * 5) % 21).astype(np.float32)
    j = np.float32((seed * 3 + seq) % 5)
    return (np.float32(-4.0) + k / np.float32(10.0) + np.float32(0.5) * j).astype(np.float32)


def reference(sess, seed, seq, has_face):
    f = frame(seed, seq)
    if not has_face:
        return f
    x1, y1 = max(0, BOX[0] - PADS[2]), max(0, BOX[1] - PADS[0])
    x2, y2 = min(W, BOX[2] + PADS[3]), min(H, BOX[3] + PADS[1])
    crop = f[y1:y2, x1:x2]
    face = cv2.resize(crop, (96, 96))[:, :, ::-1]  # RGB frame -> the BGR Wav2Lip was trained on
    masked = face.copy()
    masked[48:] = 0
    inp = np.concatenate((masked, face), axis=2).astype(np.float32) / 255.0
    inp = inp.transpose(2, 0, 1)[None]
    out = sess.run(None, {"face": inp, "mel": mel(seed, seq)[None, None]})[0]
    p = np.clip(np.floor(out[0].transpose(1, 2, 0) * 255.0 + 0.5), 0, 255).astype(np.uint8)[:, :, ::-1]
    p = cv2.resize(p, (x2 - x1, y2 - y1))
    f = f.copy()
    f[y1:y2, x1:x2] = p
    return f


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
            fh.write(f"""[pipeline]
name = "lipsync-ref"
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
model = "m.onnx"
feather = 0.0
[[stage]]
name = "sink"
kind = "filesink"
inputs = ["lips.video"]
""")
        out = os.path.join(tmp, "out.rgb")
        n, seed = 6, 3
        args = [spindle, "run", cfg, "--devices", "cpu", "--set", f"video.frames={n}", "--set", f"video.seed={seed}",
                "--set", f"mel.chunks={n}", "--set", f"mel.seed={seed}", "--set", f"sink.path={out}"]
        for d in plugin_dirs:
            args += ["--plugin-path", d]
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 0, f"spindle run: {r.returncode}\n{r.stdout}\n{r.stderr}"
        got = np.fromfile(out, dtype=np.uint8)
        assert got.size == n * H * W * 3, f"{got.size} bytes, want {n} frames"
        got = got.reshape(n, H, W, 3)
        sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        worst = 0
        for seq in range(n):
            want = reference(sess, seed, seq, seq % 4 != 3)
            d = np.abs(got[seq].astype(int) - want.astype(int))
            outside = np.ones((H, W), bool)
            outside[30:90, 40:100] = False
            assert d[outside].max() == 0, f"seq {seq}: pixels outside the crop changed"
            dc = d[30:90, 40:100]
            worst = max(worst, int(dc.max()))
            assert dc.max() <= 3 and dc.mean() < 0.3, f"seq {seq}: crop max {dc.max()}, mean {dc.mean():.3f} off Wav2Lip's"
            if seq % 4 != 3:
                assert (got[seq] != frame(seed, seq))[30:90, 40:100].mean() > 0.8, f"seq {seq}: crop not redrawn"
        print(f"ok: {n} frames; largest difference in the crop from the OpenCV/ONNX Runtime reference: {worst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
