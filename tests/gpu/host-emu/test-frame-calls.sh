#!/usr/bin/env bash
# What one frame of a shipped GPU pipeline costs in host calls, counted by
# the fake GPU (SPN_EMU_CUDA_STATS, README "Counting what a frame costs"):
# configs/NAME.toml on cuda for N and 2N frames, the difference over N,
# against a budget per kind of call. On a GPU each of these calls costs the
# stage's thread host time (a wait, an allocation through the pool, an
# enqueue that takes the context's lock), so a stage that starts copying
# per tile, waiting per frame or allocating per item fails here, whatever
# its output.
#   test-frame-calls.sh NAME SPINDLE_EMU_PIPELINE SOURCE_ROOT
#     [BUDGETS: "key=N ..." per frame; keys of the fake's line]
# SPINDLE_PLUGIN_PATH: the emulated plugins. FRAMES: N (default 3).
set -u
name=$1 spindle=$(realpath "$2") src=$(realpath "$3") budgets=$4
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
n=${FRAMES:-3}
sets=()
if [ "$name" = lipsync ]; then
  python3 "$src/tests/lipsync/make-w2l-model.py" w2l.onnx --arch wav2lip --width 0.25 >/dev/null ||
    { echo "skip: could not make the Wav2Lip-shaped model (no onnx package?)"; exit 77; }
  sets=(--set lips.model="$tmp/w2l.onnx")
fi
for k in 1 2; do
  f=$((k * n))
  # the sample is 25 frames/s: f frames are f / 25 s
  SPN_EMU_CUDA_STATS="$tmp/stats$k.txt" "$spindle" run "$src/configs/$name.toml" --devices cuda \
    --set decode.duration="$(awk -v f="$f" 'BEGIN { printf "%.3f", f / 25 }')" --set encode.path="$tmp/out$k.mp4" \
    "${sets[@]}" >"run$k.txt" 2>"run$k.err" || fail "$name.toml, $f frames: $(tail -3 "run$k.err")"
  grep -Eq "job [0-9]+ succeeded: $f frames" "run$k.txt" || fail "$name.toml: not $f frames: $(head -1 "run$k.txt")"
  [ -s "stats$k.txt" ] || fail "the fake GPU wrote no counts (SPN_EMU_CUDA_STATS)"
done
per_frame=$(awk -v n="$n" '
  function val(line, key,   m) { return match(line, " " key "=[0-9]+") ? substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 2) : -1 }
  NR == FNR { a = $0; next } { b = $0 }
  END {
    k = split("device_alloc device_free pinned_alloc host_sync query copy_blocking copy_async copy_async_pageable kernel_launch graph_launch event_record stream_wait", keys, " ")
    for (i = 1; i <= k; i++) printf "%s=%.2f ", keys[i], (val(b, keys[i]) - val(a, keys[i])) / n
  }' stats1.txt stats2.txt)
echo "$name.toml, per frame on the fake GPU ($n and $((2 * n)) frames): $per_frame"
over=$(awk -v s="$per_frame" -v lim="$budgets" 'BEGIN {
  n = split(s, kv, " "); for (i = 1; i <= n; i++) { split(kv[i], x, "="); have[x[1]] = x[2] }
  m = split(lim, lv, " ")
  for (i = 1; i <= m; i++) {
    split(lv[i], y, "=")
    if (!(y[1] in have)) { printf "%s (not counted) ", y[1]; continue }
    if (have[y[1]] > y[2] + 0.001) printf "%s=%s (budget %s) ", y[1], have[y[1]], y[2]
  }
}')
[ -z "$over" ] || fail "$name.toml on the GPU costs more host calls per frame than its budget: $over"
echo "ok: within $budgets"
