#!/usr/bin/env bash
# Transcode benchmark: `spindle run configs/transcode.toml` beside the ffmpeg
# CLI with the same settings, on the same generated clip, in the same run.
#   tests/bench/transcode-bench.sh BUILD_DIR [PRESET] [CRF] [SECONDS]
# Prints both wall times and the ratio spindle / ffmpeg (target <= 1.05).
# Not a test: it never fails on time.
set -euo pipefail
build=$(realpath "${1:?usage: transcode-bench.sh BUILD_DIR [PRESET] [CRF] [SECONDS]}")
preset=${2:-veryfast} crf=${3:-23} secs=${4:-10}
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ff="ffmpeg -nostdin -hide_banner -loglevel error -y"
$ff -f lavfi -i "testsrc2=size=1280x720:rate=25:duration=$secs" \
  -f lavfi -i "sine=frequency=440:sample_rate=48000:duration=$secs" -ac 2 \
  -c:v libx264 -preset ultrafast -crf 18 -pix_fmt yuv420p -c:a aac "$tmp/in.mp4"

now() { date +%s.%N; }
t0=$(now)
SPINDLE_PLUGIN_PATH="$build/stages/media" "$build/core/cli/spindle" run "$src/configs/transcode.toml" \
  --set decode.path="$tmp/in.mp4" --set encode.path="$tmp/spindle.mp4" --set encode.audio_path="$tmp/in.mp4" \
  --set encode.preset="$preset" --set encode.crf="$crf" >"$tmp/spindle.log" 2>&1
t1=$(now)
$ff -i "$tmp/in.mp4" -c:v libx264 -preset "$preset" -crf "$crf" -c:a aac "$tmp/ffmpeg.mp4"
t2=$(now)
frames() { ffprobe -v error -select_streams v -count_packets -show_entries stream=nb_read_packets -of csv=p=0 "$1"; }
python3 - "$t0" "$t1" "$t2" "$(frames "$tmp/spindle.mp4")" "$(frames "$tmp/ffmpeg.mp4")" \
  "$(stat -c %s "$tmp/spindle.mp4")" "$(stat -c %s "$tmp/ffmpeg.mp4")" "$preset" "$crf" "$secs" <<'PY'
import sys
t0, t1, t2 = map(float, sys.argv[1:4])
fs, ff, ss, fz = sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
preset, crf, secs = sys.argv[8:11]
a, b = t1 - t0, t2 - t1
print(f"transcode {secs} s 1280x720@25 + AAC, libx264 preset={preset} crf={crf}")
print(f"  spindle run transcode.toml : {a:7.2f} s  ({fs} frames, {ss/1e6:.2f} MB)")
print(f"  ffmpeg CLI                 : {b:7.2f} s  ({ff} frames, {fz/1e6:.2f} MB)")
print(f"  ratio spindle/ffmpeg       : {a/b:7.3f}  (target <= 1.05)")
PY
