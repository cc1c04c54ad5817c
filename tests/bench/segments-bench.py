#!/usr/bin/env python3
"""Segmented vs whole: one video transcode job, on 1 and on 2 remote worker
processes (`spindle worker --slots 1` each, against one gateway with no
in-process workers), run whole and cut into segments, side by side in the
same run with the same clip, pipeline and settings.

usage: segments-bench.py SPINDLE [--seconds 60] [--size 640x360] [--segments 6] [--runs 3]

Prints per configuration the median wall time of `spindle submit --wait`
(submit to joined file), the speed-up of segmented over whole on the same
worker count, and the join's own time (the segmented job's compute seconds:
the join is its only run). Not a test; never gates anything.
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("segments", os.path.join(SRC, "tests", "jobs", "test-segments.py"))
seg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seg)
mj = seg.mj


def run_job(ep, clip, out, extra):
    t = time.monotonic()
    r = mj.cli("submit", "transcode", "--input", f"video={clip}", "--output", f"video={out}", *extra, "--wait",
               "--connect", ep, timeout=3600, check_rc=0)
    wall = time.monotonic() - t
    st = mj.status(ep, int(r.stdout.split()[0]))
    os.unlink(out)
    return wall, st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("spindle")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--segments", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    mj.SPINDLE, mj.SRC = os.path.abspath(a.spindle), SRC
    tmp = tempfile.mkdtemp(prefix="spn-segments-bench-")
    try:
        clip = f"{tmp}/in.mp4"
        seg.make_clip(clip, seconds=a.seconds, size=a.size)
        cfg = seg.server_config(tmp)
        os.mkdir(f"{tmp}/out")
        print(f"clip: {a.seconds} s {a.size} 25 fps H.264 + AAC, keyframe every 2 s; pipeline: transcode "
              f"(libx264 veryfast); {a.runs} runs each, median; load before: {os.getloadavg()[0]:.2f} "
              f"on {os.cpu_count()} CPUs")
        print(f"{'workers':>7} {'whole s':>9} {'segmented s':>12} {'speed-up':>9} {'join s':>7} {'segments':>8}")
        for nw in (1, 2):
            p, ep = mj.start_serve(tmp, cfg, "--workers", "0", log=f"serve-{nw}.log")
            ws = [subprocess.Popen([mj.SPINDLE, "worker", "--connect", ep, "--config", cfg, "--name", f"w{i}",
                                    "--slots", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
                  for i in range(nw)]
            mj.PROCS.extend(ws)
            run_job(ep, clip, f"{tmp}/out/warm.mp4", [])  # every worker's pipeline warm
            whole, segd, join = [], [], []
            for _ in range(a.runs):
                whole.append(run_job(ep, clip, f"{tmp}/out/w.mp4", [])[0])
                w, st = run_job(ep, clip, f"{tmp}/out/s.mp4", ["--segments", str(a.segments)])
                segd.append(w)
                join.append(st["compute_s"])
            mw, ms = statistics.median(whole), statistics.median(segd)
            print(f"{nw:>7} {mw:>9.2f} {ms:>12.2f} {mw / ms:>8.2f}x {statistics.median(join):>7.2f} "
                  f"{a.segments:>8}")
            for pr in [p, *ws]:
                pr.send_signal(signal.SIGTERM)
                pr.wait(30)
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        for pr in mj.PROCS:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
