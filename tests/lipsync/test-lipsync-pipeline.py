#!/usr/bin/env python3
"""configs/lipsync.toml end to end: decode → facedetect → lipsync (+ melspec)
→ superres → encode on the sample clip and speech, with a random-weight
Wav2Lip-shaped model generated here.

  test-lipsync-pipeline.py SPINDLE MAKE_MODEL_SCRIPT SOURCE_ROOT

Runs the first second of samples/media/talking-head.mp4 (25 frames, 320×320)
twice: through configs/lipsync.toml, and through the same config with the
face detector, melspec and lipsync taken out (decode → superres → encode). Both outputs are
read back with OpenCV: 25 frames of 640×640 each; the lip-synced one differs
from the baseline in one compact region (the face crop, ×2 by superres) and
agrees elsewhere up to the encoder's noise. Then a 30 fps video with an MP3
speech (other_rate). Exits 77 without cv2 or onnx.
"""
import os
import re
import subprocess
import sys
import tempfile

try:
    import cv2
    import numpy as np
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)


def read_video(path):
    cap = cv2.VideoCapture(path)
    frames = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f.astype(np.int16))
    cap.release()
    return frames


def main():
    spindle, script, src = sys.argv[1], sys.argv[2], sys.argv[3]
    config = os.path.join(src, "configs", "lipsync.toml")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "w2l.onnx")
        r = subprocess.run([sys.executable, script, model])
        if r.returncode == 77:
            print("skip: no onnx package")
            return 77
        assert r.returncode == 0
        # The baseline: the same file without the lipsync stage.
        text = open(config).read()
        base = re.sub(r'\[\[stage\]\]\nname = "lips"\n.*?(?=\[\[stage\]\])', "", text, flags=re.S)
        base = re.sub(r'\[\[stage\]\]\nname = "faces"\n.*?(?=\[\[stage\]\])', "", base, flags=re.S)
        base = base.replace('inputs = ["lips.video"]', 'inputs = ["decode.video"]')
        base = re.sub(r'\[\[stage\]\]\nname = "melspec"\n.*?(?=\[\[stage\]\])', "", base, flags=re.S)
        base = base.replace('speech = "melspec.path"\n', "")
        base, n = re.subn(r'(?m)^video = \["decode\.path", "melspec\.video"\].*$', 'video = "decode.path"', base)
        assert n == 1, base
        base, n = re.subn(r'(?m)^start = \["decode\.start", "melspec\.start"\].*$', 'start = "decode.start"', base)
        assert n == 1, base
        # its soundtrack's default input, speech, is gone with melspec
        base, n = re.subn(r'(?m)^soundtrack = \{ key = "encode\.audio_path", default = "speech" \}.*$',
                          'soundtrack = "encode.audio_path"', base)
        assert n == 1, base
        assert 'kind = "lipsync"' not in base and base.count("[[stage]]") == 3, base
        # Written beside the outputs, its relative paths made absolute.
        base_cfg = os.path.join(tmp, "baseline.toml")
        with open(base_cfg, "w") as fh:
            fh.write(base.replace('"../', '"' + os.path.join(os.path.abspath(src), "")))
        outs = {}
        for name, cfg, extra in (("synced", config, ["--set", f"lips.model={model}"]), ("base", base_cfg, [])):
            out = os.path.join(tmp, name + ".mp4")
            args = [spindle, "run", cfg, "--devices", "cpu", "--set", "decode.duration=1.0",
                    "--set", f"encode.path={out}"] + extra
            r = subprocess.run(args, capture_output=True, text=True, timeout=280)
            assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
            assert re.search(r"job \d+ succeeded: 25 frames", r.stdout), r.stdout
            outs[name] = read_video(out)
            # The soundtrack (speech.wav, 4 s) is cut where the 1 s of video ends.
            durs = {}
            for kind in ("v", "a"):
                p = subprocess.run(["ffprobe", "-v", "error", "-select_streams", kind, "-show_entries",
                                    "stream=duration", "-of", "csv=p=0", out], capture_output=True, text=True)
                assert p.returncode == 0 and p.stdout.strip(), f"{name}: no {kind} stream: {p.stderr}"
                durs[kind] = float(p.stdout.strip())
            assert abs(durs["v"] - 1.0) <= 0.04 and abs(durs["a"] - durs["v"]) <= 0.04, f"{name}: durations {durs}"
        a, b = outs["synced"], outs["base"]
        assert len(a) == 25 and len(b) == 25, (len(a), len(b))
        assert a[0].shape == (640, 640, 3), a[0].shape
        changed_frames = 0
        for i, (fa, fb) in enumerate(zip(a, b)):
            d = np.abs(fa - fb).max(axis=2)
            big = d > 40
            if big.sum() < 50:
                continue
            changed_frames += 1
            ys, xs = np.nonzero(big)
            # The box holding 98% of the changed pixels (a few stray encoder
            # differences elsewhere do not count): one face crop, ×2 by
            # superres, well under a quarter of the frame.
            y0, y1 = np.percentile(ys, [1, 99]).astype(int)
            x0, x1 = np.percentile(xs, [1, 99]).astype(int)
            area = (y1 - y0 + 1) * (x1 - x0 + 1)
            assert big.sum() < 0.15 * 640 * 640, f"frame {i}: {big.sum()} pixels changed"
            assert area < 640 * 640 / 4, f"frame {i}: changes spread over {x0}..{x1} x {y0}..{y1}"
            out = np.ones_like(big)
            out[max(0, y0 - 16):y1 + 17, max(0, x0 - 16):x1 + 17] = False
            assert d[out].mean() < 3.0, f"frame {i}: mean difference {d[out].mean():.2f} outside the face"
        assert changed_frames >= 15, f"only {changed_frames} of 25 frames show a redrawn mouth"
        print(f"ok: 25 frames 640x640; {changed_frames} with a redrawn face region")
        other_rate(spindle, config, model, src, tmp)
    return 0


def other_rate(spindle, config, model, src, tmp):
    """A 30 fps video and an MP3 speech, by the job's names (--input): the
    chunks follow the video's rate (the input `video` sets melspec.video
    too), the speech is read through FFmpeg and muxed as the soundtrack.
    Setting decode.path alone leaves melspec on the sample's 25 fps: the
    run warns that the speech drifts from the video."""
    media = os.path.join(src, "samples", "media")
    clip, mp3 = os.path.join(tmp, "th30.mp4"), os.path.join(tmp, "speech.mp3")
    for args in (["-i", os.path.join(media, "talking-head.mp4"), "-t", "2", "-vf", "fps=30", "-an", "-c:v", "libx264",
                  "-preset", "ultrafast", clip],
                 ["-i", os.path.join(media, "speech.wav"), "-c:a", "libmp3lame", "-b:a", "48k", mp3]):
        subprocess.run(["ffmpeg", "-v", "error", "-y"] + args, check=True)
    out = os.path.join(tmp, "o30.mp4")
    base = [spindle, "run", config, "--devices", "cpu", "--set", f"lips.model={model}", "--log-level", "debug"]
    r = subprocess.run(base + ["--input", f"video={clip}", "--input", f"speech={mp3}", "--output", f"video={out}"],
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert re.search(r"job \d+ succeeded: 60 frames", r.stdout), r.stdout
    assert "mel chunks at 30.000 fps, the rate of " + clip in r.stderr, r.stderr[-3000:]
    assert "out of step" not in r.stdout + r.stderr, r.stdout
    p = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_type,duration,avg_frame_rate", "-of",
                        "csv=p=0", out], capture_output=True, text=True, check=True)
    kinds = {line.split(",")[0]: line.split(",")[1:] for line in p.stdout.split()}
    assert "audio" in kinds and abs(float(kinds["audio"][1]) - 2.0) <= 0.05, p.stdout  # the MP3, cut at the video's end
    # the file keeps the video's rate: 30 fps, 60 frames in 2 s (a nominal 25
    # made the last frame 1/25 s long)
    assert kinds["video"][0] == "30/1" and abs(float(kinds["video"][1]) - 2.0) <= 0.002, p.stdout
    # decode.path set alone: melspec still reads the sample's 25 fps
    r = subprocess.run(base + ["--set", f"decode.path={clip}", "--set", f"melspec.path={mp3}", "--set",
                               f"encode.path={out}"], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert re.search(r"warning: lips: the speech is out of step with the video: frame \d+ .*chunks at 25 fps, the "
                     r"video at about 30 fps\), so the lips lead the speech", r.stdout), r.stdout
    print("ok: 30 fps video with an MP3 speech by --input: chunks at 30 fps; by --set decode.path alone: warned")


if __name__ == "__main__":
    sys.exit(main())
