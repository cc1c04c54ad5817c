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
# the medians of wall time and of CPU time (user + system) are compared.
# Prints both and the ratios spindle/ffmpeg (target <= 1.05). Not a test:
# it never fails on time.
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

# timed CMD...: runs CMD, prints "wall_s cpu_s" (cpu: user + system of CMD
# and its children). On a shared machine the CPU time is the steadier figure.
timed() {
  python3 -c 'import resource, subprocess, sys, time
r0 = resource.getrusage(resource.RUSAGE_CHILDREN); t0 = time.monotonic()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
t1 = time.monotonic(); r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(f"{t1 - t0:.3f} {cpu:.3f}") if rc == 0 else sys.exit(f"{sys.argv[1]} failed: exit {rc}")' "$@"
}
spindle_cmd=(env SPINDLE_PLUGIN_PATH="$build/stages/media" "$build/core/cli/spindle" run "$src/configs/transcode.toml"
  --set decode.path="$tmp/in.mp4" --set encode.path="$tmp/spindle.mp4"
  --set encode.preset="$preset" --set encode.crf="$crf" --set encode.audio_bitrate=128000 --log-format text)
ffmpeg_cmd=($ff -i "$tmp/in.mp4" -c:v libx264 -preset "$preset" -crf "$crf" -pix_fmt yuv420p
  -c:a aac -b:a 128k -movflags +faststart "$tmp/ffmpeg.mp4")
ts=() tf=()
for ((i = 0; i < reps; i++)); do
  if ((i % 2 == 0)); then
    tf+=("$(timed "${ffmpeg_cmd[@]}")") ts+=("$(timed "${spindle_cmd[@]}" 2>"$tmp/spindle.log")")
  else
    ts+=("$(timed "${spindle_cmd[@]}" 2>"$tmp/spindle.log")") tf+=("$(timed "${ffmpeg_cmd[@]}")")
  fi
done
frames() { ffprobe -v error -select_streams v -count_packets -show_entries stream=nb_read_packets -of csv=p=0 "$1"; }
adur() { ffprobe -v error -select_streams a -show_entries stream=duration -of csv=p=0 "$1"; }
python3 - "$(printf '%s,' "${ts[@]}")" "$(printf '%s,' "${tf[@]}")" "$(frames "$tmp/spindle.mp4")" \
  "$(frames "$tmp/ffmpeg.mp4")" "$(stat -c %s "$tmp/spindle.mp4")" "$(stat -c %s "$tmp/ffmpeg.mp4")" \
  "$(adur "$tmp/spindle.mp4")" "$(adur "$tmp/ffmpeg.mp4")" "$preset" "$crf" "$secs" "$(nproc)" <<'PY'
import statistics, sys
def parse(s):
    runs = [tuple(map(float, r.split())) for r in s.split(",") if r.strip()]
    return [w for w, _ in runs], [c for _, c in runs]
sw, sc = parse(sys.argv[1])
fw, fc = parse(sys.argv[2])
fs, ff, ss, fz, sa, fa = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8]
preset, crf, secs, ncpu = sys.argv[9:13]
m = statistics.median
print(f"transcode {secs} s 1280x720@25 + AAC stereo, libx264 preset={preset} crf={crf}, aac 128k, {ncpu} CPUs")
for name, w, c, n, a, z in (("spindle run transcode.toml", sw, sc, fs, sa, ss), ("ffmpeg CLI", fw, fc, ff, fa, fz)):
    print(f"  {name:27s}: wall {m(w):6.2f} s (median of {' '.join(f'{x:.2f}' for x in w)}), "
          f"cpu {m(c):6.2f} s  ({n} frames, audio {a} s, {z/1e6:.2f} MB)")
print(f"  ratio spindle/ffmpeg       : wall {m(sw)/m(fw):6.3f}, cpu {m(sc)/m(fc):6.3f}  (target <= 1.05)")
PY
