#!/usr/bin/env bash
# End-to-end pipeline benchmark on the sample clip (samples/media, 320x320,
# 100 frames, 25 fps): frames/s of configs/enhance.toml and of
# configs/lipsync.toml (with a random-weight, full-width Wav2Lip-shaped model
# from tests/lipsync/make-w2l-model.py --arch wav2lip), each with its stages'
# share of time from `spindle run --log-format json`. Peer, same run: the
# ffmpeg CLI doing the cheapest possible version of the same job (decode,
# bilinear 2x, libx264 at the configs' preset, AAC) — the ratio is what the
# models and the face work cost over a plain 2x transcode.
#   tests/bench/pipeline-bench.sh BUILD_DIR [DEVICES]     (DEVICES: --devices, default cpu)
# Needs ffmpeg and python3 with onnx (for the model). Not a test.
set -euo pipefail
build=$(realpath "${1:?usage: pipeline-bench.sh BUILD_DIR [DEVICES]}")
devices=${2:-cpu}
src=$(cd "$(dirname "$0")/../.." && pwd)
spindle=$build/core/cli/spindle
clip=$src/samples/media/talking-head.mp4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$src/tests/lipsync/make-w2l-model.py" "$tmp/w2l.onnx" --arch wav2lip --width 1.0 >/dev/null

now() { date +%s.%N; }
t0=$(now)
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$clip" -vf "scale=2*iw:2*ih:flags=bilinear" \
  -c:v libx264 -preset medium -crf 20 -c:a aac "$tmp/ffmpeg.mp4"
t1=$(now)
"$spindle" run "$src/configs/enhance.toml" --devices "$devices" --log-format json \
  --set encode.path="$tmp/enhance.mp4" >"$tmp/enhance.json" 2>"$tmp/enhance.log"
"$spindle" run "$src/configs/lipsync.toml" --devices "$devices" --log-format json \
  --set lips.model="$tmp/w2l.onnx" --set encode.path="$tmp/lipsync.mp4" >"$tmp/lipsync.json" 2>"$tmp/lipsync.log"
python3 - "$t0" "$t1" "$tmp" "$devices" <<'PY'
import json, sys
t0, t1, tmp, devices = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
peer = 100 / (t1 - t0)
print(f"sample clip 320x320, 100 frames; devices {devices}")
print(f"peer  ffmpeg decode + bilinear 2x + libx264 medium: {t1 - t0:6.2f} s  {peer:6.1f} frames/s")
for name in ("enhance", "lipsync"):
    d = json.loads(open(f"{tmp}/{name}.json").read().strip().splitlines()[-1])
    assert d["status"] == "succeeded", d
    fps = d["frames"] / d["elapsed_s"]
    print(f"{name:8s} {d['frames']} frames in {d['elapsed_s']:6.2f} s  {fps:6.1f} frames/s  "
          f"ratio to peer {fps / peer:.2f}")
    for s in d["stages"]:
        print(f"    {s['name']:10s} {s['busy_ms']:9.1f} ms  {100 * s['share']:5.1f}%")
PY
