#!/usr/bin/env bash
# Make a packed CUDA build with FFmpeg (.gpu/, from the shared GPU tooling's
# `pack`) fit one transfer to a GPU host, with room for the benchmark's
# models and clips (tools/prepare-gpu-bench.sh): the pack's bundle is about
# 61 MiB, and the tree and everything carried may take 64 MiB together.
#   1. tools/gpu-slim.py replaces the libraries no GPU test calls (FFmpeg's
#      codec2, x265, AV1 encoders, librsvg and what only they need, ICU's
#      data) by stubs that keep their names and symbols (--no-slim: keep
#      them);
#   2. drops the CMake probe files of meson-private/;
#   3. recompresses with `xz -9e`;
# then prints what the working tree and .gpu/ add up to (about 36 MiB of
# bundle with the slimming, 58 without).
#
#   tools/gpu-repack.sh [--no-slim]    (from the project root, after `pack`)
#
# `.gpu/run` unpacks the result as before.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
b=$root/.gpu/bundle.tar.xz
[ -f "$b" ] || { echo "gpu-repack: no $b (run the shared GPU tooling's pack first)" >&2; exit 1; }
slim=1
[ "${1:-}" = --no-slim ] && slim=0
before=$(stat -c %s "$b")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
xz -dc "$b" | tar -C "$tmp" -xf -
[ $slim = 0 ] || python3 "$root/tools/gpu-slim.py" "$tmp"
rm -rf "$tmp/build/meson-private/__CMake_compiler_info__"
tar -C "$tmp" -cf - . | xz -T2 -9e > "$b.new"
mv "$b.new" "$b"
after=$(stat -c %s "$b")
# what travels: tracked files and untracked ones git does not ignore, plus .gpu/
tree=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
gpu=$(du -sb "$root/.gpu" | cut -f1)
total=$((tree + gpu))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu-repack: bundle $(mib "$before") -> $(mib "$after"); working tree $(mib "$tree") + .gpu $(mib "$gpu") = $(mib "$total")"
if [ "$total" -ge $((64 * 1048576)) ]; then
  echo "gpu-repack: still over 64 MiB: pack with --no-media for engine and kernel work" >&2
  exit 1
fi
