#!/usr/bin/env bash
# Make a packed CUDA build with FFmpeg (.gpu/, from the shared GPU tooling's
# `pack`) fit one transfer to a GPU host: recompress .gpu/bundle.tar.xz with
# `xz -9e` (the pack's level 6 leaves it at about 61 MiB, over the 64 MiB
# the tree and the bundle may take together; -9e takes it to about 58 MiB),
# then print what the working tree and .gpu/ add up to.
#
#   tools/gpu-repack.sh            (from the project root, after `pack`)
#
# The bundle's contents do not change; `.gpu/run` unpacks it as before.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
b=$root/.gpu/bundle.tar.xz
[ -f "$b" ] || { echo "gpu-repack: no $b (run the shared GPU tooling's pack first)" >&2; exit 1; }
before=$(stat -c %s "$b")
xz -dc "$b" | xz -T2 -9e > "$b.new"
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
