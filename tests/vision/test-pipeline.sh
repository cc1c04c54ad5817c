#!/usr/bin/env bash
# The vision plugin under the real runtime: `spindle run` loads
# libspindle-vision.so from the plugin path and runs synth -> facedetect ->
# check; every frame must arrive whole, in order and with its pattern intact
# (the stage adds a "faces" item and forwards the frame). A cascade that does
# not exist fails the run naming the file. Skipped (77) in a build without the
# runtime or without opencv-data's cascade.
#   test-pipeline.sh SPINDLE VISION_STAGE_DIR UTIL_STAGE_DIR
set -u
spindle=$(realpath "$1") vision=$(realpath "$2") util=$(realpath "$3")
fail() { echo "FAIL: $*"; exit 1; }
export SPINDLE_PLUGIN_PATH=$vision:$util
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cascade=/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml
[ -f "$cascade" ] || { echo "skip: $cascade missing (opencv-data)"; exit 77; }

cat >fd.toml <<TOML
[pipeline]
name = "fd"

[[stage]]
name = "source"
kind = "synth"
frames = 40
width = 320
height = 240
fps = 30.0

[[stage]]
name = "faces"
kind = "facedetect"
inputs = ["source.video"]
cascade = "$cascade"

[[stage]]
name = "sink"
kind = "check"
inputs = ["faces"]
expect_frames = 40
verify_pattern = true
TOML

"$spindle" run fd.toml >out.txt 2>err.txt
rc=$?
if grep -q 'not built in' err.txt; then
  echo "skip: this build has no runtime"
  exit 77
fi
[ $rc -eq 0 ] || fail "fd.toml: exit $rc: $(cat err.txt)"
grep -Eq '^fd: job [0-9]+ succeeded: 40 frames in ' out.txt || fail "summary: $(cat out.txt)"
echo "ok   synth -> facedetect -> check: $(cat out.txt)"

"$spindle" run fd.toml --set faces.cascade="$tmp/missing.xml" >out.txt 2>err.txt
rc=$?
[ $rc -ne 0 ] || fail "a missing cascade must fail the run"
grep -q "missing.xml" err.txt || fail "the error names the cascade: $(cat err.txt)"
echo "ok   a missing cascade fails naming it: $(head -c 300 err.txt)"
echo "pipeline: 2 passed, 0 failed"
