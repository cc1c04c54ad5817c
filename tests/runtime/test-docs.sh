#!/usr/bin/env bash
# docs/plugins.md shows the two example stages in full: each listing must be
# the file the other tests build and run (plugins/example/invert.c,
# plugins/cuda-example/levels.cu), and within the promised size (a CPU stage
# in 40 lines, a GPU stage in 80).
#   test-docs.sh SOURCE_ROOT
set -u
src=$1
fail() { echo "FAIL: $*"; exit 1; }
block() { # the fenced block of language $1 in docs/plugins.md
  awk -v lang="$1" '$0 == "```" lang {on = 1; next} on && $0 == "```" {exit} on {print}' "$src/docs/plugins.md"
}
block c | head -c 100000 >/tmp/spn-docs-$$.c
trap 'rm -f /tmp/spn-docs-$$.*' EXIT
block cuda >/tmp/spn-docs-$$.cu
diff -u "$src/plugins/example/invert.c" /tmp/spn-docs-$$.c >/dev/null ||
  fail "the C listing in docs/plugins.md is not plugins/example/invert.c"
diff -u "$src/plugins/cuda-example/levels.cu" /tmp/spn-docs-$$.cu >/dev/null ||
  fail "the CUDA listing in docs/plugins.md is not plugins/cuda-example/levels.cu"
n=$(wc -l <"$src/plugins/example/invert.c"); [ "$n" -le 40 ] || fail "invert.c has $n lines (at most 40)"
n=$(wc -l <"$src/plugins/cuda-example/levels.cu"); [ "$n" -le 80 ] || fail "levels.cu has $n lines (at most 80)"
echo ok
