#!/usr/bin/env bash
# The decode and encode stages placed on a GPU (a CUDA build), under the real
# runtime, on the sample clip.
#   test-transcode-gpu.sh MODE SPINDLE MEDIA_STAGE_DIR SOURCE_ROOT
# MODE nogpu (unit, every CUDA build): on a host without a GPU, a decode
#   pinned to "cuda" fails before running, naming the config position, the
#   stage and the devices there are; on a GPU host it skips (77).
# MODE gpu (suite gpu): skips (77) without a GPU; else, with yuv420p frames,
#   the GPU run (NVDEC, NV12 repacked to yuv420p on the GPU, frames kept on
#   the device from decode to encode, one download per frame) writes the
#   same bytes as the CPU run, and so does a GPU run with hwaccel = "none"
#   (software decode + one upload); each says how its frames came in one log
#   line; an rgb24 run on the GPU (device RGB converted to yuv420p on the
#   GPU) writes the 100 frames.
set -u
mode=$1 spindle=$(realpath "$2") media=$(realpath "$3") src=$(realpath "$4")
fail() { echo "FAIL: $*"; exit 1; }
export SPINDLE_PLUGIN_PATH=$media
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cfg="$src/configs/transcode.toml"
clip="$src/samples/media/talking-head.mp4"
run() { # OUT DEVICES [--set ...]: stdout in OUT.txt, stderr in OUT.err
  local out=$1 devs=$2
  shift 2
  "$spindle" run "$cfg" --devices "$devs" --set decode.path="$clip" --set encode.path="$out.mp4" \
    --set encode.preset=ultrafast "$@" >"$out.txt" 2>"$out.err"
}

if run probe auto --set decode.device=cuda; then
  gpu=1
else
  grep -q 'stage "decode": device "cuda" is not available (runtime devices: auto)' probe.err ||
    fail "decode on cuda without a GPU: $(cat probe.err)"
  grep -q 'transcode.toml:[0-9]*:[0-9]*: stage "decode"' probe.err || fail "no config position: $(cat probe.err)"
  gpu=0
fi
if [ "$mode" = nogpu ]; then
  [ $gpu = 0 ] || { echo "skip: a GPU is here (the gpu suite's transcode-gpu runs)"; exit 77; }
  exit 0
fi
[ $gpu = 1 ] || { echo "skip: no GPU"; exit 77; }

run cpu cpu || fail "cpu run: $(tail -3 cpu.err)"
run gpu cuda --set decode.device=cuda --set encode.device=cuda || fail "gpu run: $(tail -3 gpu.err)"
grep -q 'decoding video with NVDEC; frames stay on the GPU' gpu.err || fail "gpu run did not use NVDEC: $(cat gpu.err)"
grep -Eq 'job [0-9]+ succeeded: 100 frames' gpu.txt || fail "gpu summary: $(cat gpu.txt)"
# decode -> encode on one GPU: every frame handed over as it is, no copy
line=$(grep 'edge  decode.video -> encode.video' gpu.txt)
case "$line" in
*"100 messages, 100 items passed") ;;
*) fail "frames were copied between decode and encode: $line" ;;
esac
cmp -s cpu.mp4 gpu.mp4 || fail "NVDEC + yuv420p on the GPU wrote other bytes than the CPU run"

run none cuda --set decode.device=cuda --set encode.device=cuda --set decode.hwaccel=none ||
  fail "hwaccel none on the GPU: $(tail -3 none.err)"
grep -q 'decoding video in software and uploading each frame to the GPU (hwaccel is none)' none.err ||
  fail "no line saying software + upload: $(cat none.err)"
cmp -s cpu.mp4 none.mp4 || fail "software decode + upload wrote other bytes than the CPU run"

run rgb cuda --set decode.device=cuda --set encode.device=cuda --set decode.pixel_format=rgb24 ||
  fail "rgb24 on the GPU: $(tail -3 rgb.err)"
grep -Eq 'job [0-9]+ succeeded: 100 frames' rgb.txt || fail "rgb24 summary: $(cat rgb.txt)"
echo "ok: gpu and hwaccel=none runs equal the CPU run; rgb24 on the GPU wrote $(stat -c %s rgb.mp4) bytes"
