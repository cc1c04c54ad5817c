#!/usr/bin/env bash
# The out-of-tree CUDA example (plugins/cuda-example) as a third party builds
# it: install Spindle into a staging prefix, `make` the example with nvcc and
# `pkg-config spindle-plugin` only, check the installed spindle loads it.
# With `gpu`, also build cuda-example-compare against the installed
# spindle-harness.pc and run the stage on a GPU against its CPU twin.
#   test-cuda-example.sh BUILD_DIR SOURCE_ROOT [gpu]
# Exits 77 (skip) without nvcc, and in gpu mode without a CUDA device.
# SPINDLE_TEST_STAGED=DIR: use the install already staged in DIR (`meson
# install --destdir DIR` of this build, made where the build was configured)
# instead of installing here — for a GPU host whose meson cannot read the
# build directory.
set -u
build=$(realpath "$1") src=$(realpath "$2") mode=${3:-build}
fail() { echo "FAIL: $*"; exit 1; }
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$nvcc" ] || nvcc=$(command -v nvcc) || { echo "skip: no nvcc"; exit 77; }
unset SPINDLE_PLUGIN_PATH
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -n "${SPINDLE_TEST_STAGED:-}" ]; then
  cp -a "$SPINDLE_TEST_STAGED" "$tmp/dest" || fail "cannot copy the staged install $SPINDLE_TEST_STAGED"
else
  meson install -C "$build" --destdir "$tmp/dest" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
    fail "meson install: $(tail -5 "$tmp/install.log")"
fi
pc=$(find "$tmp/dest" -name spindle-plugin.pc | head -1)
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH} PKG_CONFIG_SYSROOT_DIR=$tmp/dest
[ "$(pkg-config --variable=cuda_major spindle-plugin)" != 0 ] || { echo "skip: this Spindle is built without CUDA"; exit 77; }
plugindir=$(pkg-config --variable=plugindir spindle-plugin)
case "$plugindir" in "$tmp/dest"*) ;; *) plugindir=$tmp/dest$plugindir ;; esac

cp -r "$src/plugins/cuda-example" "$tmp/ex"
make -s -C "$tmp/ex" NVCC="$nvcc" >"$tmp/make.log" 2>&1 || fail "make: $(cat "$tmp/make.log")"
so=$tmp/ex/libspindle-levels.so
nm -D --defined-only "$so" | grep -q ' T spindle_plugin_levels_desc$' || fail "descriptor not exported (C linkage)"
if nm -D --undefined-only "$so" | grep -q ' spn_'; then fail "plugin needs host symbols"; fi

bin=$(find "$tmp/dest" -path '*/bin/spindle' | head -1)
lib=$(dirname "$(find "$tmp/dest" -name 'libspindle.so.1' | head -1)")
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=$("$bin" plugins --plugin-path "$tmp/ex" levels) || fail "spindle plugins: $out"
grep -q '^levels$' <<<"$out" || fail "levels not listed: $out"
grep -q 'device   cpu or cuda' <<<"$out" || fail "levels should run on either device: $out"
"$bin" validate "$src/plugins/cuda-example/pipeline.toml" --plugin-path "$tmp/ex" --plugin-path "$plugindir" ||
  fail "validate the example pipeline"
# The CPU twin end to end through spindle run (any machine).
"$bin" run "$src/plugins/cuda-example/pipeline.toml" --plugin-path "$tmp/ex" --plugin-path "$plugindir" \
  --set levels.device=cpu >"$tmp/run.txt" 2>&1 || fail "spindle run on the CPU: $(cat "$tmp/run.txt")"

if [ "$mode" = gpu ]; then
  cuda=$(dirname "$(dirname "$nvcc")")
  cc -std=c11 -O2 -Wall -Wextra -o "$tmp/compare" "$src/tests/runtime/cuda-example-compare.c" \
    $(pkg-config --cflags --libs spindle-harness) -I"$cuda/include" -L"$cuda/lib64" -lcudart \
    >"$tmp/cc.log" 2>&1 || fail "building the comparison against spindle-harness.pc: $(cat "$tmp/cc.log")"
  "$tmp/compare" "$so"
  exit $?
fi
echo ok
