#!/usr/bin/env bash
# Install what is missing (tools/deps.sh), build Spindle and run its whole
# test suite.
#   tools/test.sh [--werror] [--sanitize] [extra meson setup args]
# --sanitize builds into build-asan with ASan/UBSan.
# SPINDLE_NO_INSTALL=1 skips the installs (the packages must be there).
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
    *) args+=("$a") ;;
  esac
done
if [ -d "$builddir" ]; then
  meson setup --reconfigure "$builddir" "${args[@]}" >/dev/null
else
  meson setup "$builddir" "${args[@]}" >/dev/null
fi
ninja -C "$builddir"
meson test -C "$builddir" --print-errorlogs --no-suite gpu --no-suite fuzz
