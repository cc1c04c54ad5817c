#!/usr/bin/env bash
# Transcode benchmark: `spindle run configs/transcode.toml` beside the ffmpeg
# CLI with identical settings, on the same generated clip, in the same run.
#   tests/bench/transcode-bench.sh BUILD_DIR [PRESET] [CRF] [SECONDS] [REPS]
# The clip: SECONDS of 1280x720@25 testsrc2 + a 48 kHz stereo sine (AAC).
# Both sides: libx264 at PRESET/CRF, yuv420p, x264 and decoder threads left
# to their defaults (auto on both: the ffmpeg CLI and spindle's decode and
# encode both pass thread count 0), AAC at 128 kbit/s, MP4 with the index
# moved to the front (+faststart, spindle's default). Spindle's frames stay
# yuv420p from decoder to encoder and its audio goes through the DAG.
# The two runs alternate REPS times (default 3, ffmpeg first in odd rounds);
# the median of each is compared. Prints both and the ratio spindle/ffmpeg
# (target <= 1.05). Not a test: it never fails on time.
set -euo pipefail
build=$(realpath "${1:?usage: transcode-bench.sh BUILD_DIR [PRESET] [CRF] [SECONDS] [REPS]}")
preset=${2:-veryfast} crf=${3:-23} secs=${4:-10} reps=${5:-3}
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ff="ffmpeg -nostdin -hide_banner -loglevel error -y"
$ff -f lavfi -i "testsrc2=size=1280x720:rate=25:duration=$secs" \
  -f lavfi -i "sine=frequency=440:sample_rate=48000:duration=$secs" -ac 2 \
  -c:v libx264 -preset ultrafast -crf 18 -pix_fmt yuv420p -c:a aac "$tmp/in.mp4"

now() { date +%s.%N; }
run_spindle() {
  SPINDLE_PLUGIN_PATH="$build/stages/media" "$build/core/cli/spindle" run "$src/configs/transcode.toml" \
    --set decode.path="$tmp/in.mp4" --set encode.path="$tmp/spindle.mp4" \
    --set encode.preset="$preset" --set encode.crf="$crf" --set encode.audio_bitrate=128000 \
    >"$tmp/spindle.log" 2>&1
}
run_ffmpeg() {
  $ff -i "$tmp/in.mp4" -c:v libx264 -preset "$preset" -crf "$crf" -pix_fmt yuv420p \
    -c:a aac -b:a 128k -movflags +faststart "$tmp/ffmpeg.mp4"
}
ts=() tf=()
for ((i = 0; i < reps; i++)); do
  if ((i % 2 == 0)); then
    t0=$(now); run_ffmpeg; t1=$(now); run_spindle; t2=$(now)
    tf+=("$(awk "BEGIN{print $t1 - $t0}")") ts+=("$(awk "BEGIN{print $t2 - $t1}")")
  else
    t0=$(now); run_spindle; t1=$(now); run_ffmpeg; t2=$(now)
    ts+=("$(awk "BEGIN{print $t1 - $t0}")") tf+=("$(awk "BEGIN{print $t2 - $t1}")")
  fi
done
frames() { ffprobe -v error -select_streams v -count_packets -show_entries stream=nb_read_packets -of csv=p=0 "$1"; }
adur() { ffprobe -v error -select_streams a -show_entries stream=duration -of csv=p=0 "$1"; }
python3 - "${ts[*]}" "${tf[*]}" "$(frames "$tmp/spindle.mp4")" "$(frames "$tmp/ffmpeg.mp4")" \
  "$(stat -c %s "$tmp/spindle.mp4")" "$(stat -c %s "$tmp/ffmpeg.mp4")" "$(adur "$tmp/spindle.mp4")" \
  "$(adur "$tmp/ffmpeg.mp4")" "$preset" "$crf" "$secs" "$(nproc)" <<'PY'
import statistics, sys
ts = [float(x) for x in sys.argv[1].split()]
tf = [float(x) for x in sys.argv[2].split()]
fs, ff, ss, fz, sa, fa = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8]
preset, crf, secs, ncpu = sys.argv[9:13]
a, b = statistics.median(ts), statistics.median(tf)
print(f"transcode {secs} s 1280x720@25 + AAC stereo, libx264 preset={preset} crf={crf}, aac 128k, {ncpu} CPUs")
print(f"  spindle run transcode.toml : {a:7.2f} s median of {' '.join(f'{x:.2f}' for x in ts)}"
      f"  ({fs} frames, audio {sa} s, {ss/1e6:.2f} MB)")
print(f"  ffmpeg CLI                 : {b:7.2f} s median of {' '.join(f'{x:.2f}' for x in tf)}"
      f"  ({ff} frames, audio {fa} s, {fz/1e6:.2f} MB)")
print(f"  ratio spindle/ffmpeg       : {a/b:7.3f}  (target <= 1.05)")
PY
