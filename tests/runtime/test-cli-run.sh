#!/usr/bin/env bash
# `spindle run`: every config in configs/ runs to success (exit 0, summary
# on stdout); a job that fails exits 1 naming the stage and why; config and
# usage errors exit 2. Skipped (77) in a build without the runtime. The
# summary's transfers (per edge, per stage, for the job) are checked byte
# for byte with the test stage `upload` of XFER_PLUGIN_DIR on cpu:2.
#   test-cli-run.sh SPINDLE UTIL_STAGE_DIR SOURCE_ROOT XFER_PLUGIN_DIR
set -u
spindle=$(realpath "$1") util=$(realpath "$2") src=$(realpath "$3") xfer=$(realpath "$4")
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

# A stage that does not stop when the job is cancelled (here: one call that
# sleeps 10 s; in life, a read that nothing interrupts): after 5 s the run
# says it waits for it; a second Ctrl-C quits at once.
cat >stuck.toml <<'EOT'
[pipeline]
name = "stuck"
[[stage]]
name = "source"
kind = "synth"
frames = 5
width = 8
height = 4
[[stage]]
name = "slow"
kind = "cost"
inputs = ["source"]
us = 10000000
sleep = true
[[stage]]
name = "sink"
kind = "check"
inputs = ["slow"]
expect_frames = 5
EOT
"$spindle" run stuck.toml >out.txt 2>err.txt &
pid=$!
sleep 1
kill -INT $pid
for _ in $(seq 80); do grep -q 'have not all stopped' err.txt && break; sleep 0.1; done
grep -q 'spindle run: the job was cancelled 5 s ago and its stages have not all stopped; waiting (Ctrl-C again quits at once)' err.txt ||
  fail "no word of the stage that does not stop: $(cat err.txt)"
t0=$(date +%s%N)
kill -INT $pid
wait $pid
rc=$?
took=$(( ($(date +%s%N) - t0) / 1000000 ))
[ $rc -eq 130 ] && [ $took -lt 2000 ] || fail "second Ctrl-C: exit $rc after $took ms, want 130 at once"
grep -q 'interrupted again: quitting without waiting for the stages' err.txt || fail "second Ctrl-C: $(cat err.txt)"

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

# Transfers: synth (host memory, 8x4 RGB: 96-byte frames) -> upload on
# emulated device cpu:1 (its own copies: 96 bytes host to device and 32
# back, per frame) -> check (host memory: the runtime copies each 96-byte
# device frame back on the edge). Per stage, per edge and for the job.
cat >xfer.toml <<'EOT'
[pipeline]
name = "xfer"
[[stage]]
name = "source"
kind = "synth"
frames = 6
width = 8
height = 4
[[stage]]
name = "up"
kind = "upload"
inputs = ["source"]
device = "cpu:1"
back = 32
[[stage]]
name = "sink"
kind = "check"
inputs = ["up"]
expect_frames = 6
verify_pattern = true
EOT
"$spindle" run xfer.toml --plugin-path "$xfer" --devices cpu:2 >out.txt 2>err.txt || fail "xfer run: $(cat err.txt)"
grep -Eq '^  stage up +[0-9.]+ ms +[0-9.]+%, stream [0-9.]+ ms, h2d 6 copies 576 bytes [0-9.]+ ms, d2h 6 copies 192 bytes [0-9.]+ ms$' \
  out.txt || fail "the stage's own copies: $(cat out.txt)"
grep -Eq '^  stage (source|sink) +[0-9.]+ ms +[0-9.]+%$' out.txt || fail "stages that copy nothing: $(cat out.txt)"
grep -Eq '^  edge  up.out -> sink.in: .*, d2h 6 copies 576 bytes [0-9.]+ ms$' out.txt ||
  fail "the edge's copies: $(cat out.txt)"
grep -Eq '^  transfers, h2d 6 copies 576 bytes [0-9.]+ ms, d2h 12 copies 768 bytes [0-9.]+ ms; 224.0 bytes per frame' \
  out.txt || fail "the job's transfers: $(cat out.txt)"
"$spindle" run xfer.toml --plugin-path "$xfer" --devices cpu:2 --log-format json >out.txt 2>err.txt ||
  fail "xfer json run: $(cat err.txt)"
python3 -c '
import json
d = json.loads(open("out.txt").read().strip().splitlines()[-1])
assert d["status"] == "succeeded" and d["frames"] == 6, d
def figs(o):
    return {k: (o[k]["copies"], o[k]["bytes"]) for k in ("h2d", "d2h", "d2d", "h2h")}
st = {s["name"]: figs(s) for s in d["stages"]}
none = {"h2d": (0, 0), "d2h": (0, 0), "d2d": (0, 0), "h2h": (0, 0)}
assert st == {"source": none, "up": dict(none, h2d=(6, 576), d2h=(6, 192)), "sink": none}, st
ed = {(e["from"], e["to"]): figs(e) for e in d["edges"]}
assert ed == {("source", "up"): none, ("up", "sink"): dict(none, d2h=(6, 576))}, ed
t = d["transfers"]
assert figs(t) == dict(none, h2d=(6, 576), d2h=(12, 768)), t
assert t["bytes_per_frame"] == 224.0, t
assert all(t[k]["ms"] >= 0 for k in ("h2d", "d2h")), t
' || fail "json transfers: $(cat out.txt)"

# Stream time: a stage on a device (emulated cpu:1, whose events are the
# host's clock at their record) has every call timed, and its stream time
# is the time inside them: a stage sleeping 4 ms a frame for 50 frames
# shows 200 ms or more, no more than its busy time; stages on the CPU pool
# have none (text line without ", stream", no stream_ms member).
cat >stime.toml <<'EOT'
[pipeline]
name = "stime"
[[stage]]
name = "source"
kind = "synth"
frames = 50
width = 8
height = 4
[[stage]]
name = "relay"
kind = "cost"
inputs = ["source"]
device = "cpu:1"
us = 4000
sleep = true
[[stage]]
name = "sink"
kind = "check"
inputs = ["relay"]
expect_frames = 50
EOT
"$spindle" run stime.toml --devices cpu:2 --log-format json >out.txt 2>err.txt || fail "stream time run: $(cat err.txt)"
python3 -c '
import json
d = json.loads(open("out.txt").read().strip().splitlines()[-1])
st = {s["name"]: s for s in d["stages"]}
assert "stream_ms" not in st["source"] and "stream_ms" not in st["sink"], st
r = st["relay"]
assert 200 <= r["stream_ms"] <= r["busy_ms"] + 1, r
' || fail "stream time: $(cat out.txt)"

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
# --log-level: the least severe lines shown. faces.toml with no model
# fetched logs a warning (the Haar cascade stands in) and an info line (the
# metasink's count); debug adds the runtime's own lines.
"$spindle" run "$src/configs/synthetic.toml" --log-level loud >/dev/null 2>err.txt
[ $? -eq 2 ] && grep -q -- "--log-level 'loud': expected debug, info, warn or error" err.txt ||
  fail "bad --log-level: $(cat err.txt)"
if ! needs_missing "$src/configs/faces.toml"; then
  mkdir -p nomodels
  for lv in default debug info warn error; do
    args=()
    [ $lv = default ] || args=(--log-level $lv)
    SPINDLE_MODEL_PATH=$tmp/nomodels XDG_DATA_HOME=$tmp/nomodels HOME=$tmp/nomodels \
      "$spindle" run "$src/configs/faces.toml" --set decode.duration=0.2 --set out.path=faces.jsonl \
      "${args[@]}" >out.txt 2>err.txt || fail "faces.toml --log-level $lv: $(cat err.txt)"
    got=""
    for l in debug info warn; do grep -q "\"level\":\"$l\"" err.txt && got="$got $l"; done
    case $lv in
      debug) want=" debug info warn" ;;
      default | info) want=" info warn" ;;
      warn) want=" warn" ;;
      error) want="" ;;
    esac
    [ "$got" = "$want" ] || fail "--log-level $lv: levels shown '$got', want '$want': $(head -c 600 err.txt)"
  done
fi
# Two outputs of a job on one file (the second rename would silently win):
# refused with exit 2 naming both, by name or through a link; apart, it runs.
cat >two.toml <<'EOF2'
[pipeline]
name = "two"
[pipeline.outputs]
first = "a.path"
second = "b.path"
[[stage]]
name = "src"
kind = "synth"
frames = 3
[[stage]]
name = "split"
kind = "tee"
inputs = ["src"]
[[stage]]
name = "a"
kind = "filesink"
inputs = ["split.out0"]
[[stage]]
name = "b"
kind = "filesink"
inputs = ["split.out1"]
EOF2
"$spindle" run two.toml --set a.path=one.bin --set b.path=two.bin >/dev/null 2>err.txt ||
  fail "two outputs apart: $(cat err.txt)"
ln -s one.bin one-link.bin
for b in one.bin ./one.bin one-link.bin; do
  "$spindle" run two.toml --set a.path=one.bin --set b.path=$b >/dev/null 2>err.txt
  rc=$?
  [ $rc -eq 2 ] || fail "two outputs on one file ($b): exit $rc: $(cat err.txt)"
  grep -q "outputs \"first\" (a.path) and \"second\" (b.path) are one file" err.txt ||
    fail "two outputs on one file ($b): $(cat err.txt)"
done

# --timeout: a run past it is cancelled, fails (exit 1, "timed out") and
# publishes nothing; a stage that does not return from its call after the
# cancel is named and spindle run quits after --cancel-grace (before, it
# waited for ever). hang: the test stage of XFER_PLUGIN_DIR, stuck at seq `at`.
cat >hang.toml <<'EOF2'
[pipeline]
name = "hang"
[[stage]]
name = "source"
kind = "synth"
frames = 100000000
width = 8
height = 8
[[stage]]
name = "stuck"
kind = "hang"
inputs = ["source"]
at = -1
[[stage]]
name = "sink"
kind = "filesink"
inputs = ["stuck"]
path = "long.raw"
EOF2
timeout 60 "$spindle" run hang.toml --plugin-path "$xfer" --timeout 0.5 >out.txt 2>err.txt
rc=$?
[ $rc -eq 1 ] || fail "--timeout 0.5: exit $rc: $(cat err.txt)"
grep -q 'past --timeout 0.5 s: cancelling it' err.txt || fail "--timeout 0.5: $(cat err.txt)"
grep -Eq '^hang: job [0-9]+ timed out: ' out.txt || fail "--timeout 0.5 summary: $(cat out.txt)"
[ ! -e long.raw ] || fail "a timed-out run published its output"
timeout 60 "$spindle" run hang.toml --plugin-path "$xfer" --timeout 0.5 --log-format json >out.txt 2>err.txt
rc=$?
[ $rc -eq 1 ] && python3 -c '
import json, sys
s = json.loads(open("out.txt").read().splitlines()[-1])
sys.exit(not (s["status"] == "timed_out" and s["error"].startswith("timed out: cancelled after --timeout 0.5 s")))
' || fail "--timeout 0.5, JSON summary: exit $rc: $(cat out.txt)"
t0=$SECONDS
ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" timeout 60 "$spindle" run hang.toml --plugin-path "$xfer" \
  --set source.frames=10 --set stuck.at=3 --timeout 1 --cancel-grace 2 >out.txt 2>err.txt
rc=$?
[ $rc -eq 1 ] || fail "stuck stage, --timeout 1 --cancel-grace 2: exit $rc after $((SECONDS - t0)) s: $(cat err.txt)"
grep -q 'stage "stuck" has been inside one call for [0-9]* s and did not stop within --cancel-grace 2 s' err.txt ||
  fail "stuck stage: $(cat err.txt)"
[ ! -e long.raw ] || fail "a stuck run published its output"
"$spindle" run hang.toml --plugin-path "$xfer" --set source.frames=10 --timeout 30 >out.txt 2>err.txt ||
  fail "a run within --timeout: $(cat err.txt)"
cmp -s long.raw /dev/null && fail "a run within --timeout wrote nothing"
for bad in "--timeout 0" "--timeout -1" "--timeout nan" "--timeout 1e9" "--cancel-grace -1" "--cancel-grace x"; do
  "$spindle" run hang.toml $bad >out.txt 2>err.txt
  rc=$?
  [ $rc -eq 2 ] && grep -q "spindle run: ${bad% *} '${bad#* }': expected seconds in " err.txt ||
    fail "$bad: exit $rc: $(cat err.txt)"
done
echo ok
