#!/usr/bin/env python3
"""Seeds for the demux+decode fuzzer, and its two runs.

  run-media-fuzz.py PROGRAM MAKE_CORRUPT SAMPLE replay
  run-media-fuzz.py PROGRAM MAKE_CORRUPT SAMPLE fuzz [SECONDS] [CORPUS_DIR]

Seeds: the sample clip, 60 damaged copies of it (make-corrupt-clips.py),
an MKV and a WebM/VP8 and a still PNG and JPEG made by the ffmpeg CLI.
`replay` runs PROGRAM (replay-media) over every seed once; `fuzz` runs the
libFuzzer binary for SECONDS (default 20) with CORPUS_DIR (default a
temporary folder) as its working corpus. Exit 77 without ffmpeg.
"""
import os
import shutil
import subprocess
import sys
import tempfile


def seeds(make_corrupt, sample, d):
    subprocess.run([sys.executable, make_corrupt, sample, d, "60", "--seed", "7"], check=True)
    os.unlink(os.path.join(d, "manifest.json"))
    ff = ["ffmpeg", "-nostdin", "-v", "error", "-y"]
    subprocess.run(ff + ["-i", sample, "-t", "0.5", "-c:v", "libx264", "-preset", "ultrafast", "-c:a", "aac",
                         os.path.join(d, "s.mkv")], check=True)
    subprocess.run(ff + ["-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=0.5", "-c:v", "libvpx",
                         os.path.join(d, "s.webm")], check=False)
    subprocess.run(ff + ["-f", "lavfi", "-i", "testsrc=size=64x48", "-frames:v", "1", os.path.join(d, "s.png")],
                   check=True)
    subprocess.run(ff + ["-f", "lavfi", "-i", "testsrc=size=64x48", "-frames:v", "1", os.path.join(d, "s.jpg")],
                   check=True)
    shutil.copy(sample, os.path.join(d, "sample.mp4"))
    # Inputs that once broke a rule (each named for what it broke) stay seeds.
    regress = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz-regress")
    for f in sorted(os.listdir(regress)):
        shutil.copy(os.path.join(regress, f), os.path.join(d, "regress-" + f))


def main():
    prog, make_corrupt, sample, mode = sys.argv[1:5]
    if not shutil.which("ffmpeg"):
        print("skip: no ffmpeg")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        sd = os.path.join(tmp, "seeds")
        seeds(make_corrupt, sample, sd)
        files = sorted(os.path.join(sd, f) for f in os.listdir(sd))
        if mode == "replay":
            return subprocess.run([prog] + files).returncode
        secs = sys.argv[5] if len(sys.argv) > 5 else "20"
        corpus = sys.argv[6] if len(sys.argv) > 6 else os.path.join(tmp, "corpus")
        os.makedirs(corpus, exist_ok=True)
        return subprocess.run([prog, f"-max_total_time={secs}", "-print_final_stats=1", "-rss_limit_mb=4096",
                               "-timeout=20", "-max_len=200000", corpus, sd]).returncode


if __name__ == "__main__":
    sys.exit(main())
