#!/usr/bin/env bash
# What one frame costs in host calls on the fake GPU, against a budget.
#   calls-per-frame.sh STATS_A STATS_B FRAMES "KEY=MAX ..."
# STATS_A and STATS_B: files holding the SPN_EMU_CUDA_STATS line (README,
# "Counting what a frame costs"; the last "pid=..." line of each, other
# lines ignored) of a run and of the same run with FRAMES frames more.
# Prints every counter's difference over FRAMES on one line (KEY=VALUE ...);
# exits 1, after a second line naming them, when a KEY of the budget is
# over its MAX or not counted.
set -u
[ $# -eq 4 ] || { echo "usage: calls-per-frame.sh STATS_A STATS_B FRAMES BUDGETS" >&2; exit 2; }
per_frame=$(awk -v n="$3" '
  !/^pid=/ { next }
  NR == FNR { for (i = 2; i <= NF; i++) { split($i, kv, "="); a[kv[1]] = kv[2] } next }
  { m = 0; for (i = 2; i <= NF; i++) { split($i, kv, "="); keys[++m] = kv[1]; b[kv[1]] = kv[2] } }
  END { for (i = 1; i <= m; i++) printf "%s=%.2f ", keys[i], (b[keys[i]] - a[keys[i]]) / n }' "$1" "$2")
echo "$per_frame"
over=$(awk -v s="$per_frame" -v lim="$4" 'BEGIN {
  n = split(s, kv, " "); for (i = 1; i <= n; i++) { split(kv[i], x, "="); have[x[1]] = x[2] }
  m = split(lim, lv, " ")
  for (i = 1; i <= m; i++) {
    split(lv[i], y, "=")
    if (!(y[1] in have)) { printf "%s (not counted) ", y[1]; continue }
    if (have[y[1]] > y[2] + 0.001) printf "%s=%s (budget %s) ", y[1], have[y[1]], y[2]
  }
}')
[ -z "$over" ] || { echo "over: $over"; exit 1; }
