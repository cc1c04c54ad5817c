#!/usr/bin/env bash
# `spindle run`: every config in configs/ runs to success (exit 0, summary
# on stdout); a job that fails exits 1 naming the stage and why; config and
# usage errors exit 2. Skipped (77) in a build without the runtime.
#   test-cli-run.sh SPINDLE UTIL_STAGE_DIR SOURCE_ROOT
set -u
spindle=$(realpath "$1") util=$(realpath "$2") src=$(realpath "$3")
fail() { echo "FAIL: $*"; exit 1; }
export SPINDLE_PLUGIN_PATH=$util${SPINDLE_MEDIA_STAGE_DIR:+:$SPINDLE_MEDIA_STAGE_DIR}
# configs that need the media stages are skipped in builds without them
needs_missing() { [ -z "${SPINDLE_MEDIA_STAGE_DIR:-}" ] && grep -Eq 'kind = "(decode|encode)"' "$1"; }
# configs naming a model the user exports (Wav2Lip: not in the tree) are run by their own tests
model_missing() {
  local m
  for m in $(sed -n 's/^model *= *"\([^"]*\)".*/\1/p' "$1"); do [ -e "$(dirname "$1")/$m" ] || return 0; done
  return 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

"$spindle" run "$src/configs/synthetic.toml" >out.txt 2>err.txt
rc=$?
if grep -q 'not built in' err.txt; then
  echo "skip: this build has no runtime"
  exit 77
fi
[ $rc -eq 0 ] || fail "synthetic.toml: exit $rc: $(cat err.txt)"
grep -Eq '^synthetic: job [0-9]+ succeeded: 120 frames in ' out.txt || fail "summary: $(cat out.txt)"
# the per-stage lines: one per [[stage]] in config order, ms and share
[ "$(grep -Ec '^  stage (source|relay|sink) +[0-9]+\.[0-9] ms +[0-9]+\.[0-9]%$' out.txt)" = 3 ] ||
  fail "per-stage lines: $(cat out.txt)"

for c in "$src"/configs/*.toml; do
  needs_missing "$c" && continue
  model_missing "$c" && continue
  grep -q '^\[pipeline\]' "$c" || continue
  timeout 60 "$spindle" run "$c" --devices cpu:2 >out.txt 2>err.txt || fail "$c: exit $?: $(cat err.txt)"
done

# A job that fails: the sink expects one frame more than the source makes.
"$spindle" run "$src/configs/synthetic.toml" --set sink.expect_frames=121 >out.txt 2>err.txt
rc=$?
[ $rc -eq 1 ] || fail "failing job: exit $rc, want 1"
grep -q 'job [0-9]* failed' out.txt || fail "failure summary: $(cat out.txt)"
# printed once, by the stage (a JSON line when stderr is not a terminal)
grep -q '"level":"error","msg":"stage \\"sink\\".*end of stream after 120 frames, expected 121' err.txt ||
  fail "failure message: $(cat err.txt)"
[ "$(grep -c 'expected 121' err.txt)" -eq 1 ] || fail "the error is not printed exactly once: $(cat err.txt)"

# Ctrl-C cancels the job: exit 130, the summary says cancelled.
"$spindle" run "$src/configs/synthetic.toml" --set source.frames=100000000 --set sink.expect_frames=100000000 \
  >out.txt 2>err.txt &
pid=$!
sleep 1
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "interrupted run: exit $rc, want 130: $(cat err.txt)"
grep -q 'job [0-9]* cancelled' out.txt || fail "cancel summary: $(cat out.txt)"

# JSON summary.
"$spindle" run "$src/configs/synthetic.toml" --set source.frames=7 --set sink.expect_frames=7 --log-format json \
  >out.txt 2>err.txt || fail "json run: $(cat err.txt)"
python3 -c '
import json, sys
d = json.loads(open("out.txt").read().strip().splitlines()[-1])
assert d["pipeline"] == "synthetic" and d["status"] == "succeeded" and d["frames"] == 7, d
st = d["stages"]
assert [s["name"] for s in st] == ["source", "relay", "sink"], st
assert all(s["busy_ms"] >= 0 for s in st) and st[0]["busy_ms"] > 0, st
assert abs(sum(s["share"] for s in st) - 1) < 1e-3, st
assert all(abs(s["share"] - s["busy_ms"] / sum(t["busy_ms"] for t in st)) < 1e-3 for s in st), st
' || fail "json summary: $(cat out.txt)"

# Config and usage errors.
"$spindle" run "$src/configs/synthetic.toml" --set source.frames=lots >/dev/null 2>err.txt
[ $? -eq 2 ] || fail "bad --set should exit 2"
grep -q 'key "frames" must be an integer' err.txt || fail "bad --set message: $(cat err.txt)"
printf '[[stage]]\nname = "a"\nkind = "nope"\n' >bad.toml
"$spindle" run bad.toml >/dev/null 2>err.txt
[ $? -eq 2 ] || fail "unknown kind should exit 2"
grep -q 'bad.toml:3:8: stage "a": unknown stage kind "nope"' err.txt || fail "unknown kind message: $(cat err.txt)"
"$spindle" run >/dev/null 2>&1
[ $? -eq 2 ] || fail "no file should exit 2"
"$spindle" run "$src/configs/synthetic.toml" --log-format xml >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad --log-format should exit 2"
echo ok
