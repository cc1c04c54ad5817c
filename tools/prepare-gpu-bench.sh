#!/usr/bin/env bash
# Gather, on the build machine, what tests/bench/pipeline-gpu-bench.py needs
# on a GPU host that has no network, no ffmpeg CLI and no onnx2torch, into
# .bench/ at the project root (ignored by git), and check that it travels
# with the packed build (.gpu/, ../shared/gpu/pack) in one transfer.
#
#   tools/prepare-gpu-bench.sh [BUILD_DIR] [--clips DIR] [--limit MIB]
#
#   .bench/models/   retinaface-mnet025.onnx and realesr-animevideov3-x2.onnx
#                    (fetched here with `spindle model fetch` when missing);
#                    on the host: SPINDLE_MODEL_PATH=$PWD/.bench/models
#   .bench/wheels/   onnx2torch (pure Python; its other needs, torch,
#                    torchvision, onnx and numpy, are on the host)
#   .bench/clips/    only with --clips DIR (clips made here by
#                    tools/make-bench-clips.sh); without it the host makes
#                    them with tools/make-bench-clips.py
#
# The total of the working tree, .gpu/ and .bench/ must stay under the
# transfer limit (--limit, default 64 MiB): when it does not, the
# Real-ESRGAN model is left out first (Spindle then uses its embedded
# espcn-x2, and the benchmark's Python side follows what Spindle logged),
# then the clips. Prints what it kept and the sizes.
set -euo pipefail
build=build; clips=""; limit=64
while [ $# -gt 0 ]; do
  case "$1" in
    --clips) clips=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    -*) echo "prepare-gpu-bench.sh: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
root=$(git rev-parse --show-toplevel)
cd "$root"
spindle=$(realpath "$build")/core/cli/spindle
[ -x "$spindle" ] || { echo "prepare-gpu-bench.sh: no $spindle (build first)" >&2; exit 1; }
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.bench/' "$exclude" 2>/dev/null || echo '/.bench/' >>"$exclude"
rm -rf .bench
mkdir -p .bench/models .bench/wheels
for m in retinaface-mnet025 realesr-animevideov3-x2; do
  p=$("$spindle" model path "$m" 2>/dev/null) || { "$spindle" model fetch "$m" >&2; p=$("$spindle" model path "$m"); }
  cp "$p" .bench/models/
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .bench/wheels onnx2torch==1.5.15
if [ -n "$clips" ]; then
  mkdir -p .bench/clips
  cp "$clips"/speech.wav "$clips"/talking-head-*p.mp4 .bench/clips/
fi

# What travels: tracked and untracked-not-ignored files, plus .gpu and .bench.
size() { # bytes of the tree and the carried folders
  local t
  t=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | grep -zv '^\.gpu/\|^\.bench/' \
       | xargs -0 -r stat -c %s 2>/dev/null \
       | awk '{s += $1} END {print s + 0}')
  echo $((t + $(du -sb .bench | cut -f1) + $( [ -d .gpu ] && du -sb .gpu | cut -f1 || echo 0)))
}
max=$((limit * 1048576))
[ -d .gpu ] || echo "prepare-gpu-bench.sh: warning: no .gpu/ yet (run ../shared/gpu/pack first): its size is not counted"
if [ "$(size)" -ge "$max" ]; then
  echo "over ${limit} MiB: leaving realesr-animevideov3-x2 out (Spindle and the peer use espcn-x2)"
  rm -f .bench/models/realesr-animevideov3-x2.onnx
fi
if [ "$(size)" -ge "$max" ] && [ -d .bench/clips ]; then
  echo "over ${limit} MiB: leaving the clips out (make them on the host with tools/make-bench-clips.py)"
  rm -rf .bench/clips
fi
find .bench -type f -printf '%8s  %p\n' | sort -k2
total=$(size)
echo "tree + .gpu + .bench: $((total / 1048576)) MiB of ${limit} MiB"
[ "$total" -lt "$max" ] || { echo "prepare-gpu-bench.sh: still over the limit" >&2; exit 1; }
