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
# A budget "key=N/run" is N per superres model run instead: with
# region = "faces" superres runs its model once a face region, and how many
# faces the detector finds in a frame is the picture's business (the Haar
# cascade finds the sample's second face in some frames and not others), so
# what a face costs is held per face. The runs are superres's own count
# ("frame N: K model runs" at debug level) over the frames added. And a
# graph's capture, once per shape of region (a face's region rounds its box
# up, so a new face size is a new shape), launches its operations as
# kernels: the operations of the graphs captured in the frames added
# (SPN_EMU_CUDA_TRACE's "captured a graph of N operations") are added to the
# kernel_launch budget, a one-time cost, not a frame's.
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
  # batch_size 1: what a batch costs shows in every frame (the shipped 128
  # would spread a wait a batch over 128 frames, and both runs here are one
  # batch)
  sets=(--set lips.model="$tmp/w2l.onnx" --set lips.batch_size=1)
fi
for k in 1 2; do
  f=$((k * n))
  # the sample is 25 frames/s: f frames are f / 25 s
  SPN_EMU_CUDA_TRACE=1 SPN_EMU_CUDA_STATS="$tmp/stats$k.txt" "$spindle" run "$src/configs/$name.toml" --devices cuda \
    --set decode.duration="$(awk -v f="$f" 'BEGIN { printf "%.3f", f / 25 }')" --set encode.path="$tmp/out$k.mp4" \
    --log-level debug "${sets[@]}" >"run$k.txt" 2>"run$k.err" || fail "$name.toml, $f frames: $(tail -3 "run$k.err")"
  grep -Eq "job [0-9]+ succeeded: $f frames" "run$k.txt" || fail "$name.toml: not $f frames: $(head -1 "run$k.txt")"
  [ -s "stats$k.txt" ] || fail "the fake GPU wrote no counts (SPN_EMU_CUDA_STATS)"
done
# superres's model runs in the frames the second run adds
runs() { grep -o 'superres: frame [0-9]*: [0-9]* model runs' "$1" | awk '{ s += $4 } END { print s + 0 }'; }
extra=$(($(runs run2.err) - $(runs run1.err)))
captured() { grep -o 'captured a graph of [0-9]* operations' "$1" | awk '{ s += $5 } END { print s + 0 }'; }
capt=$(($(captured run2.err) - $(captured run1.err)))
limits=""
for b in $budgets; do
  case $b in
  */run) limits+="${b%%=*}=$(awk -v v="${b#*=}" -v r="$extra" -v n="$n" 'BEGIN { sub("/run", "", v); printf "%.3f", v * r / n }') " ;;
  kernel_launch=*) limits+="kernel_launch=$(awk -v v="${b#*=}" -v c="$capt" -v n="$n" 'BEGIN { printf "%.3f", v + c / n }') " ;;
  *) limits+="$b " ;;
  esac
done
out=$(bash "$src/tests/gpu/host-emu/calls-per-frame.sh" stats1.txt stats2.txt "$n" "$limits")
rc=$?
echo "$name.toml, per frame on the fake GPU ($n and $((2 * n)) frames; superres ran its model $extra times in the $n added, $capt operations captured in graphs there): $(head -1 <<<"$out")"
[ $rc = 0 ] || fail "$name.toml on the GPU costs more host calls per frame than its budget: $(sed -n 's/^over: //p' <<<"$out")"
echo "ok: within $budgets (per frame: $limits)"
