#!/usr/bin/env bash
# Weights read once and broadcast to the other GPUs at preload, on fake GPUs
# (tests/gpu/host-emu/README):
#   1. `spindle model load` on three fake GPUs: the broadcast way says so;
#      its bad arguments are refused (exit 2) and a missing GPU is named.
#   2. configs/enhance.toml with --devices cuda on two fake GPUs and the
#      superres stage on both: one instance reads the model and broadcasts it,
#      the other takes the broadcast copy, and the job succeeds.
#   test-peers.sh SPINDLE_EMU SPINDLE_EMU_PIPELINE PLUGIN_DIRS SOURCE_ROOT
set -u
emu=$(realpath "$1") pipe=$(realpath "$2") src=$(realpath "$4")
SPINDLE_PLUGIN_PATH=
IFS=: read -ra dirs <<<"$3"
for d in "${dirs[@]}"; do SPINDLE_PLUGIN_PATH+=${SPINDLE_PLUGIN_PATH:+:}$(realpath "$d"); done
export SPINDLE_PLUGIN_PATH
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
model=$src/models/espcn-x2.onnx

SPN_EMU_CUDA_DEVICES=3 "$emu" model load "$model" --devices cuda:0,cuda:1,cuda:2 --precision fp16 --repeat 1 >load.out 2>&1 ||
  { cat load.out; fail "spindle model load exited $?"; }
grep -q "^read once, weights broadcast .*read from the file; weights broadcast to 2 peers$" load.out ||
  { cat load.out; fail "the broadcast way did not broadcast"; }
grep -q "^read once, peers upload their own .*also parsed for 2 peers$" load.out ||
  { cat load.out; fail "the upload way did not load the peers"; }
SPN_EMU_CUDA_DEVICES=3 "$emu" model load "$model" >bad.out 2>&1
[ $? -eq 2 ] || fail "no --devices: want exit 2"
SPN_EMU_CUDA_DEVICES=3 "$emu" model load "$model" --devices cuda:0,cuda:7 >bad.out 2>&1
[ $? -eq 1 ] && grep -q "cuda:7" bad.out || { cat bad.out; fail "a missing GPU is not named"; }

SPN_EMU_CUDA_DEVICES=2 "$pipe" run "$src/configs/enhance.toml" --devices cuda \
  --set 'sr.instances={count = 1, devices = "all"}' --set decode.duration=0.12 --set encode.path="$tmp/out.mp4" \
  --log-format json >run.out 2>run.err || { tail -20 run.err; fail "the pipeline failed"; }
grep -q '"msg":"model [^"]*espcn-x2.onnx: read from the file; weights broadcast to 1 peer","stage":"sr"' run.err ||
  { grep model run.err; fail "no sr instance read the model and broadcast it"; }
grep -q '"msg":"model [^"]*espcn-x2.onnx: weights broadcast from cuda:[01]","stage":"sr"' run.err ||
  { grep model run.err; fail "no sr instance took the broadcast copy"; }
[ "$(grep -c '"msg":"model [^"]*espcn-x2.onnx: ' run.err)" -eq 2 ] || { grep model run.err; fail "want two sr loads"; }
grep -q '"status":"succeeded"' run.out || { cat run.out; fail "the job did not succeed"; }
echo "ok: weights broadcast at load and at a pipeline's preload"
