#!/usr/bin/env bash
# docs/plugins.md shows the two example stages in full, each fenced block
# preceded by a marker line naming it and the file it is:
#   <!-- sdk-example cpu: plugins/example/invert.c -->
#   <!-- sdk-example gpu: plugins/cuda-example/levels.cu -->
# The listings are what this test builds, not the files: each must be within
# the size promised (a CPU stage in 40 lines, a GPU stage in 80) and equal to
# its file (which the other tests build and run).
#   test-docs.sh cpu SOURCE_ROOT CC HARNESS_TEST
#     both listings extracted and counted; the CPU listing compiled with CC
#     against the SDK headers (core/include, -Werror) into libspindle-invert.so
#     and loaded through the stage harness on the real runtime by HARNESS_TEST
#     (test-abi10: frames inverted byte for byte, a non-u8 frame fails its job).
#   test-docs.sh gpu SOURCE_ROOT NVCC CUDA_MAJOR
#     the GPU listing compiled with nvcc into libspindle-levels.so exporting its
#     descriptor and needing nothing from libspindle; exits 77 (skip) when this
#     build has no CUDA (NVCC empty or missing).
set -u
mode=$1 src=$2
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The fenced block after the marker "<!-- sdk-example $1: ... -->" and the file it names.
example() {
  awk -v want="$1" '
    !on && $0 ~ "^<!-- sdk-example " want ": " { armed = 1; next }
    armed && !on && /^```/ { on = 1; next }
    on && /^```$/ { exit }
    on { print }' "$src/docs/plugins.md"
}
example_file() {
  sed -n "s|^<!-- sdk-example $1: \\([^ ]*\\) -->\$|\\1|p" "$src/docs/plugins.md" | head -1
}
extract() { # kind limit out: the listing into out, checked against the promise and its file
  local kind=$1 limit=$2 out=$3 file n
  file=$(example_file "$kind")
  [ -n "$file" ] || fail "docs/plugins.md has no '<!-- sdk-example $kind: FILE -->' marker"
  example "$kind" >"$out"
  n=$(wc -l <"$out")
  [ "$n" -gt 5 ] || fail "the $kind listing in docs/plugins.md is empty or cut ($n lines)"
  [ "$n" -le "$limit" ] || fail "the $kind listing in docs/plugins.md has $n lines (at most $limit)"
  diff -u "$src/$file" "$out" >"$tmp/diff.txt" ||
    fail "the $kind listing in docs/plugins.md is not $file: $(head -20 "$tmp/diff.txt")"
  echo "$kind listing: $n lines (at most $limit), same as $file"
}

case "$mode" in
cpu)
  cc=$3 harness_test=$4
  extract cpu 40 "$tmp/invert.c"
  extract gpu 80 "$tmp/levels.cu"
  # As docs/plugins.md says to build it, with only the SDK headers on the path.
  $cc -std=c11 -O2 -fPIC -fvisibility=hidden -shared -Wall -Wextra -Werror -Wno-unused-parameter \
    -I"$src/core/include" "$tmp/invert.c" -o "$tmp/libspindle-invert.so" >"$tmp/cc.log" 2>&1 ||
    fail "the CPU listing does not compile: $(cat "$tmp/cc.log")"
  nm -D --defined-only "$tmp/libspindle-invert.so" | grep -q ' T spindle_plugin_invert_desc$' ||
    fail "the CPU listing does not export spindle_plugin_invert_desc"
  if nm -D --undefined-only "$tmp/libspindle-invert.so" | grep -q ' spn_'; then
    fail "the CPU listing needs symbols from libspindle"
  fi
  "$harness_test" "$tmp/libspindle-invert.so" >"$tmp/run.txt" 2>&1 ||
    fail "the CPU listing through the stage harness: $(cat "$tmp/run.txt")"
  echo "cpu listing: built and run through the harness"
  ;;
gpu)
  nvcc=${3:-} major=${4:-0}
  extract gpu 80 "$tmp/levels.cu"
  if [ -z "$nvcc" ] || ! command -v "$nvcc" >/dev/null; then
    echo "skip: this build has no CUDA (the GPU listing is counted by the cpu mode)"
    exit 77
  fi
  "$nvcc" -std=c++17 -O2 -shared -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
    -Xcompiler -Wno-unused-parameter,-Wno-missing-field-initializers -I"$src/core/include" \
    -DSPN_PLUGIN_CUDA_MAJOR="$major" "$tmp/levels.cu" -o "$tmp/libspindle-levels.so" -lcudart \
    >"$tmp/nvcc.log" 2>&1 || fail "the GPU listing does not compile with nvcc: $(cat "$tmp/nvcc.log")"
  nm -D --defined-only "$tmp/libspindle-levels.so" | grep -q ' T spindle_plugin_levels_desc$' ||
    fail "the GPU listing does not export spindle_plugin_levels_desc (C linkage)"
  if nm -D --undefined-only "$tmp/libspindle-levels.so" | grep -q ' spn_'; then
    fail "the GPU listing needs symbols from libspindle"
  fi
  echo "gpu listing: built with $nvcc"
  ;;
*) fail "mode must be cpu or gpu, not $mode" ;;
esac
echo ok
