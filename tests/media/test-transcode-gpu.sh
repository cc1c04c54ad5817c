#!/usr/bin/env bash
# The decode and encode stages placed on a GPU (a CUDA build), under the real
# runtime, on the sample clip.
#   test-transcode-gpu.sh MODE SPINDLE MEDIA_STAGE_DIR SOURCE_ROOT
# MODE nogpu (unit, every CUDA build): on a host without a GPU, a decode or
#   an encode pinned to "cuda" fails before running, naming the config
#   position, the stage and the devices there are, and an encode with
#   hwaccel = "cuda" (NVENC from device frames) is refused because it is
#   placed on the CPU; on a GPU host it skips (77).
# MODE gpu (suite gpu): skips (77) without a GPU; else, with yuv420p frames
#   and encode.hwaccel = "none", the GPU run (NVDEC, NV12 repacked to yuv420p
#   on the GPU, frames kept on the device from decode to encode, one download
#   per frame for libx264) writes the same bytes as the CPU run, and so does
#   a GPU run with decode.hwaccel = "none" too (software decode + one
#   upload); each says how its frames came in one log line; an rgb24 run on
#   the GPU (device RGB converted to yuv420p on the GPU) writes the 100
#   frames. The summary's decode.video -> encode.video edge says what
#   crossed it: device memory with both stages on the GPU, host memory on
#   the CPU, and host memory where only one of them is on the GPU — decode
#   on the CPU handing host frames to a GPU encode as they are, decode on
#   the GPU having each frame copied down once — the same bytes each time.
#   Encode's default on the GPU (yuv420p and rgb24 frames): where
#   NVENC opens (checked at run time: the job's log line says which path it
#   took), the file is H.264 with 100 frames, PSNR >= 30 dB against the
#   source, and the stage downloaded nothing; where it does not (H100/H200
#   have no NVENC), one warning gives the reason, libx264 writes the 100
#   frames and each was downloaded once. hwaccel = "cuda" succeeds the same
#   way where NVENC opens, and elsewhere fails the job naming the stage and
#   leaves no file.
# SPINDLE_EMU_NVDEC=1 (the fake GPU's emulated decode stage): NVDEC is
#   emulated, software frames handed over as NVDEC's; the script checks
#   what it checks on a real GPU.
# SPINDLE_TEST_NO_NVDEC=1: the GPU has no NVDEC (tests/gpu/host-emu's fake
#   GPU); the first GPU run then takes the software decode + upload fallback,
#   and the fake's counts (SPN_EMU_CUDA_STATS) bound what each frame of the
#   GPU path costs in host time: allocations, host waits, copies.
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
  "$spindle" run "$cfg" --devices "$devs" --set decode.path="${CLIP:-$clip}" --set encode.path="$out.mp4" \
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
  run probe2 auto --set encode.device=cuda && fail "encode on cuda without a GPU ran"
  grep -q 'transcode.toml:[0-9]*:[0-9]*: stage "encode": device "cuda" is not available (runtime devices: auto)' \
    probe2.err || fail "encode on cuda without a GPU: $(cat probe2.err)"
  run probe3 auto --set encode.hwaccel=cuda
  rc=$?
  [ $rc = 2 ] || fail "encode with hwaccel = cuda and no GPU: exit $rc, want 2 (refused before running)"
  grep -q 'transcode.toml:[0-9]*:[0-9]*: stage "encode": create: hwaccel "cuda" (NVENC from device frames) needs the stage on a CUDA device; it is placed on the CPU' \
    probe3.err || fail "encode with hwaccel = cuda and no GPU: $(cat probe3.err)"
  [ ! -e probe3.mp4 ] || fail "probe3.mp4 written by a refused pipeline"
  exit 0
fi
[ $gpu = 1 ] || { echo "skip: no GPU"; exit 77; }
command -v ffprobe >/dev/null && command -v ffmpeg >/dev/null || { echo "skip: no ffmpeg/ffprobe"; exit 77; }

run cpu cpu || fail "cpu run: $(tail -3 cpu.err)"
run gpu cuda --set decode.device=cuda --set encode.device=cuda --set encode.hwaccel=none || fail "gpu run: $(tail -3 gpu.err)"
if [ "${SPINDLE_TEST_NO_NVDEC:-0}" = 1 ]; then
  # a GPU without NVDEC (the fake GPU of tests/gpu/host-emu: FFmpeg's CUDA
  # device needs the driver API): the documented fallback, one warning
  grep -q '"level":"warn".*decoding video in software and uploading each frame to the GPU (media cuda: ' gpu.err ||
    fail "gpu run without NVDEC: no warning saying software + upload: $(cat gpu.err)"
else
  grep -q 'decoding video with NVDEC; frames stay on the GPU' gpu.err || fail "gpu run did not use NVDEC: $(cat gpu.err)"
fi
grep -q 'encoding video with libx264 on the host, one download per frame (hwaccel is none)' gpu.err ||
  fail "no line saying libx264 + download: $(cat gpu.err)"
grep -Eq 'job [0-9]+ succeeded: 100 frames' gpu.txt || fail "gpu summary: $(cat gpu.txt)"
# decode -> encode on one GPU: every frame handed over as it is, no copy,
# and the summary says they stayed in device memory
line=$(grep 'edge  decode.video -> encode.video' gpu.txt)
case "$line" in
*"100 messages, 100 items passed") ;;
*) fail "frames were copied between decode and encode: $line" ;;
esac
case "$line" in
*": yuv420p, device memory; "*) ;;
*) fail "decode -> encode on one GPU: the edge is not described as device memory: $line" ;;
esac
grep -Fxq '  edge  decode.video -> encode.video: yuv420p, host memory; 100 messages, 100 items passed' cpu.txt ||
  fail "cpu run: decode -> encode not host memory without copies: $(grep 'edge  decode.video' cpu.txt)"
# One stage on the GPU: decode on the CPU gives host frames, which a GPU
# encode takes as they are; decode on the GPU gives device frames, which a
# CPU encode gets copied down once each.
run c2g cuda --set decode.device=cpu --set encode.device=cuda --set encode.hwaccel=none ||
  fail "decode on the CPU, encode on the GPU: $(tail -3 c2g.err)"
grep -Fxq '  edge  decode.video -> encode.video: yuv420p, host memory; 100 messages, 100 items passed' c2g.txt ||
  fail "decode on the CPU, encode on the GPU: $(grep 'edge  decode.video' c2g.txt)"
cmp -s cpu.mp4 c2g.mp4 || fail "decode on the CPU, encode on the GPU wrote other bytes than the CPU run"
run g2c cuda --set decode.device=cuda --set encode.device=cpu ||
  fail "decode on the GPU, encode on the CPU: $(tail -3 g2c.err)"
line=$(grep 'edge  decode.video -> encode.video' g2c.txt)
if [ "${SPINDLE_TEST_NO_NVDEC:-0}" = 1 ]; then
  # no NVDEC: software decoding, which keeps the frames in host memory for
  # a consumer on the CPU (no upload, no download)
  [ "$line" = "  edge  decode.video -> encode.video: yuv420p, host memory; 100 messages, 100 items passed" ] ||
    fail "software decode on the GPU, encode on the CPU: not host frames passed as they are: $line"
else
  case "$line" in
  *": yuv420p, host memory; 100 messages, 0 items passed, d2h 100 copies "*) ;;
  *) fail "decode on the GPU, encode on the CPU: not one download per frame into host memory: $line" ;;
  esac
fi
cmp -s cpu.mp4 g2c.mp4 || fail "decode on the GPU, encode on the CPU wrote other bytes than the CPU run"
# Software decoding on the GPU for a consumer on the CPU: nothing crosses
# PCIe (the frames would be uploaded and copied straight back), one line
# says so.
run g2c-sw cuda --set decode.device=cuda --set encode.device=cpu --set decode.hwaccel=none ||
  fail "software decode on the GPU, encode on the CPU: $(tail -3 g2c-sw.err)"
grep -Fxq '  edge  decode.video -> encode.video: yuv420p, host memory; 100 messages, 100 items passed' g2c-sw.txt ||
  fail "software decode on the GPU, encode on the CPU: $(grep 'edge  decode.video' g2c-sw.txt)"
! grep -E '^  stage decode ' g2c-sw.txt | grep -q h2d || fail "software decode for a CPU consumer uploaded: $(grep -E '^  stage decode ' g2c-sw.txt)"
grep -q 'decoding video in software into host memory, as the stage it feeds runs on the CPU (hwaccel is none)' g2c-sw.err ||
  fail "software decode for a CPU consumer: no line saying so: $(cat g2c-sw.err)"
cmp -s cpu.mp4 g2c-sw.mp4 || fail "software decode on the GPU, encode on the CPU wrote other bytes than the CPU run"
cmp -s cpu.mp4 gpu.mp4 || fail "NVDEC + yuv420p on the GPU wrote other bytes than the CPU run"

if [ "${SPINDLE_TEST_NO_NVDEC:-0}" = 1 ]; then
  # What a frame costs in host time on the GPU path (the fake GPU counts
  # it, tests/gpu/host-emu/README): the difference between 50 and 100
  # frames of decode -> encode on the GPU, over 50. At most one device
  # allocation (decode's frame), three host waits (that allocation, the
  # software decode's upload, encode's wait for the previous frame's
  # download), two copies (the upload and the download), none from or to
  # pageable memory, no pinned allocation. A stage that starts waiting for
  # the GPU on each frame, or allocating, fails here.
  for d in 2 4; do
    SPN_EMU_CUDA_STATS="$tmp/stats$d.txt" run stats$d cuda --set decode.device=cuda --set encode.device=cuda \
      --set encode.hwaccel=none --set decode.duration=$d || fail "gpu run of $d s: $(tail -3 stats$d.err)"
    [ -s "stats$d.txt" ] || fail "the fake GPU wrote no counts (SPN_EMU_CUDA_STATS)"
  done
  grep -Eq 'job [0-9]+ succeeded: 50 frames' stats2.txt && grep -Eq 'job [0-9]+ succeeded: 100 frames' stats4.txt ||
    fail "the 2 s and 4 s runs did not write 50 and 100 frames"
  budget="device_alloc=1 host_sync=3 copy_async=2 copy_async_pageable=0 pinned_alloc=0"
  out=$(bash "$src/tests/gpu/host-emu/calls-per-frame.sh" stats2.txt stats4.txt 50 "$budget")
  rc=$?
  per_frame=$(head -1 <<<"$out")
  echo "per frame on the fake GPU: $per_frame"
  [ $rc = 0 ] || fail "decode -> encode on the GPU costs more host time per frame than it did: $per_frame (at most $budget)"
fi

run none cuda --set decode.device=cuda --set encode.device=cuda --set decode.hwaccel=none --set encode.hwaccel=none ||
  fail "hwaccel none on the GPU: $(tail -3 none.err)"
grep -q 'decoding video in software and uploading each frame to the GPU (hwaccel is none)' none.err ||
  fail "no line saying software + upload: $(cat none.err)"
cmp -s cpu.mp4 none.mp4 || fail "software decode + upload wrote other bytes than the CPU run"
# ... and each frame's upload is the decode stage's counted copy (what
# crossed PCIe shows in the stage's and the job's transfers).
decode_line() { grep -E '^  stage decode ' "$1"; }
decode_line none.txt | grep -q 'h2d 100 copies' || fail "software decode: not one counted upload per frame: $(decode_line none.txt)"

# A phone video (rotation metadata: stored 320x240, upright 240x320) and a
# 10-bit HEVC one. On the GPU the turn is made there, on the frames NVDEC
# gives or after the software path's upload (of the frame as stored), and
# NVDEC's 10-bit samples are rounded to 8 bits there; the log line says so.
# The turn moves bytes: the file equals the CPU run's. 10-bit: the CPU
# path rounds the samples to 8 bits as the GPU does (HEVC decoding is
# bit-exact, so NVDEC's samples are the software decoder's), so the file
# equals the CPU run's too, through NVDEC or not.
rot="$src/samples/media/talking-head-rot90.mp4" deep="$src/samples/media/talking-head-hevc10.mp4"
both="--set decode.device=cuda --set encode.device=cuda --set encode.hwaccel=none"
CLIP=$rot run rot-cpu cpu || fail "rotated clip on the CPU: $(tail -3 rot-cpu.err)"
CLIP=$rot run rot-gpu cuda $both || fail "rotated clip on the GPU: $(tail -3 rot-gpu.err)"
grep -q 'talking-head-rot90.mp4: decoding video .*; turned 270 degrees clockwise on the GPU' rot-gpu.err ||
  fail "rotated clip on the GPU: no line saying the turn is made on the GPU: $(cat rot-gpu.err)"
cmp -s rot-cpu.mp4 rot-gpu.mp4 || fail "rotated clip: the GPU run wrote other bytes than the CPU run"
wh() { ffprobe -v error -select_streams v -show_entries stream=width,height -of csv=p=0 "$1"; }
[ "$(wh rot-gpu.mp4)" = 240,320 ] || fail "rotated clip on the GPU: $(wh rot-gpu.mp4), not 240,320 (upright)"
decode_line rot-gpu.txt | grep -q 'h2d 100 copies 11520000 bytes' || [ "${SPINDLE_TEST_NO_NVDEC:-0}" = 0 ] ||
  fail "rotated clip, software path: not one upload of the stored frame each: $(decode_line rot-gpu.txt)"
for pf in rgb24 rgbf32p; do # float frames: the same turn on 4-byte planes; encode on the CPU
  CLIP=$rot run rot-$pf-cpu cpu --set decode.pixel_format=$pf || fail "rotated $pf on the CPU: $(tail -3 rot-$pf-cpu.err)"
  CLIP=$rot run rot-$pf-gpu cuda --set decode.device=cuda --set encode.device=cpu --set decode.pixel_format=$pf ||
    fail "rotated $pf, decode on the GPU: $(tail -3 rot-$pf-gpu.err)"
  if [ "${SPINDLE_TEST_NO_NVDEC:-0}" = 1 ]; then
    cmp -s rot-$pf-cpu.mp4 rot-$pf-gpu.mp4 || fail "rotated $pf: the GPU's turn wrote other bytes than the CPU's"
  else
    [ "$(wh rot-$pf-gpu.mp4)" = 240,320 ] || fail "rotated $pf on the GPU: $(wh rot-$pf-gpu.mp4), not 240,320"
  fi
done
CLIP=$deep run deep-cpu cpu || fail "10-bit clip on the CPU: $(tail -3 deep-cpu.err)"
CLIP=$deep run deep-gpu cuda $both || fail "10-bit clip on the GPU: $(tail -3 deep-gpu.err)"
grep -Eq 'job [0-9]+ succeeded: 100 frames' deep-gpu.txt || fail "10-bit clip on the GPU: $(cat deep-gpu.txt)"
if [ "${SPINDLE_TEST_NO_NVDEC:-0}" != 1 ]; then
  grep -q 'decoding video with NVDEC; frames stay on the GPU; samples above 8 bits rounded to 8 on the GPU' \
    deep-gpu.err || fail "10-bit clip: NVDEC's frames did not stay on the GPU: $(cat deep-gpu.err)"
fi
cmp -s deep-cpu.mp4 deep-gpu.mp4 || fail "10-bit clip: the GPU run wrote other bytes than the CPU run"

# A BT.709 full-range file (as phones write, saying so) read on the GPU in
# its matrix and range, as on the CPU: its 4:2:0 samples go through with
# its tags (the same bytes as the CPU run); rgb24 frames are converted
# back with encode's colorspace on the GPU (BT.601, recorded as
# smpte170m): decode's conversion is the same on both (spn-image's and its
# twin), encode's differs by rounding (the GPU's 2x2 mean against the CPU
# run's swscale): 52.1 dB after libx264 on the fake GPU; the bound is 48.
ffmpeg -v error -f lavfi -i smptebars=s=160x120:r=25:d=0.4 -vf scale=out_color_matrix=bt709:out_range=pc,format=yuv420p \
  -colorspace bt709 -color_primaries bt709 -color_trc bt709 -color_range pc -c:v ffv1 bars709.mkv || fail "ffmpeg bars709"
tags() { ffprobe -v error -select_streams v -show_entries stream=color_range,color_space,color_transfer,color_primaries \
  -of csv=p=0 "$1"; }
# (and the chroma's siting: the 2x2 mean of a conversion from RGB, on either device, is "center")
siting() { ffprobe -v error -select_streams v -show_entries stream=chroma_location -of csv=p=0 "$1"; }
for pf in yuv420p rgb24; do
  want=pc,bt709,bt709,bt709 sited=left
  [ $pf = rgb24 ] && want=tv,smpte170m,unknown,unknown sited=center
  CLIP=$tmp/bars709.mkv run c709-$pf-cpu cpu --set decode.pixel_format=$pf || fail "BT.709 $pf on the CPU: $(tail -3 c709-$pf-cpu.err)"
  CLIP=$tmp/bars709.mkv run c709-$pf-gpu cuda $both --set decode.pixel_format=$pf ||
    fail "BT.709 $pf on the GPU: $(tail -3 c709-$pf-gpu.err)"
  for d in cpu gpu; do
    [ "$(tags c709-$pf-$d.mp4)" = $want ] || fail "BT.709 $pf on the $d: tags $(tags c709-$pf-$d.mp4), want $want"
    [ "$(siting c709-$pf-$d.mp4)" = $sited ] || fail "BT.709 $pf on the $d: chroma $(siting c709-$pf-$d.mp4), want $sited"
  done
  if [ $pf = yuv420p ]; then
    cmp -s c709-$pf-cpu.mp4 c709-$pf-gpu.mp4 || fail "BT.709 yuv420p: the GPU run wrote other bytes than the CPU run"
  else
    p=$(ffmpeg -hide_banner -i c709-$pf-gpu.mp4 -i c709-$pf-cpu.mp4 -lavfi psnr -f null - 2>&1 |
      sed -n 's/.*average:\([0-9.inf]*\).*/\1/p')
    python3 -c "import sys; p = '$p'; sys.exit(0 if p and (p == 'inf' or float(p) >= 48) else 1)" ||
      fail "BT.709 rgb24: the GPU run's pictures are $p dB from the CPU run's (want >= 48)"
    echo "# BT.709 full-range rgb24 on the GPU: $p dB from the CPU run"
  fi
done

# An HDR (HLG) clip and one of 4:3 pixels as rgb24: on the GPU, NVDEC's
# frames are tone-mapped to SDR and resampled to square pixels there (the
# log line says so; not on a GPU without NVDEC, which decodes in software);
# either way the output has the CPU run's size, frames and tags (no HDR
# transfer), and pictures near the CPU run's: with NVDEC emulated on the
# fake GPU (transcode-gpu-host-nvdec, the GPU path's exact arithmetic),
# 41.9 dB for the HLG clip and 41.8 dB for the wide one, after libx264 on
# both sides (the decoded frames are equal: what differs is encode's
# conversion, the GPU's 2x2 mean against swscale, amplified by libx264);
# the bound is 38 dB (without the tone map the HLG clip's frames are 18 dB
# off).
for c in hlg:HDR_tone-mapped_on_the_GPU wide:resampled_to_square_pixels_on_the_GPU; do
  name=${c%%:*} says=$(printf '%s' "${c#*:}" | tr _ ' ')
  CLIP=$src/samples/media/talking-head-$name.mp4 run $name-cpu cpu --set decode.pixel_format=rgb24 ||
    fail "$name clip on the CPU: $(tail -3 $name-cpu.err)"
  CLIP=$src/samples/media/talking-head-$name.mp4 run $name-gpu cuda $both --set decode.pixel_format=rgb24 ||
    fail "$name clip on the GPU: $(tail -3 $name-gpu.err)"
  if [ "${SPINDLE_TEST_NO_NVDEC:-0}" != 1 ]; then
    grep -q "decoding video with NVDEC; frames stay on the GPU.*; $says" $name-gpu.err ||
      fail "$name clip: NVDEC's frames were not $says: $(cat $name-gpu.err)"
  fi
  for d in cpu gpu; do
    grep -Eq 'job [0-9]+ succeeded: 100 frames' $name-$d.txt || fail "$name clip on the $d: $(cat $name-$d.txt)"
    size=$(ffprobe -v error -select_streams v -show_entries stream=width,height,sample_aspect_ratio -of csv=p=0 \
      $name-$d.mp4)
    want=320,320,1:1
    [ $name = wide ] && want=426,320,1:1
    [ "$size" = $want ] || fail "$name clip on the $d: $size, want $want"
  done
  # (RGB is written in encode's colorspace; the HDR transfer is not carried to an SDR file)
  [ "$(tags $name-gpu.mp4)" = tv,smpte170m,unknown,unknown ] || fail "$name on the GPU: tags $(tags $name-gpu.mp4)"
  [ "$(tags $name-cpu.mp4)" = tv,smpte170m,unknown,unknown ] || fail "$name on the CPU: tags $(tags $name-cpu.mp4)"
  p=$(ffmpeg -hide_banner -i $name-gpu.mp4 -i $name-cpu.mp4 -lavfi psnr -f null - 2>&1 |
    sed -n 's/.*average:\([0-9.inf]*\).*/\1/p')
  python3 -c "import sys; p = '$p'; sys.exit(0 if p and (p == 'inf' or float(p) >= 38) else 1)" ||
    fail "$name clip: the GPU run's pictures are $p dB from the CPU run's (want >= 38)"
  echo "# $name clip as rgb24 on the GPU: $p dB from the CPU run"
done

run rgb cuda --set decode.device=cuda --set encode.device=cuda --set decode.pixel_format=rgb24 \
  --set encode.hwaccel=none || fail "rgb24 on the GPU: $(tail -3 rgb.err)"
grep -Eq 'job [0-9]+ succeeded: 100 frames' rgb.txt || fail "rgb24 summary: $(cat rgb.txt)"

frames() { ffprobe -v error -select_streams v -count_frames -show_entries stream=nb_read_frames -of csv=p=0 "$1"; }
vcodec() { ffprobe -v error -select_streams v -show_entries stream=codec_name -of csv=p=0 "$1"; }
psnr() { # OUT.mp4: average PSNR (dB) of its pictures against the sample's
  ffmpeg -hide_banner -i "$1" -i "$clip" -lavfi "[0:v]format=yuv420p[a];[1:v]format=yuv420p[b];[a][b]psnr" -f null - 2>&1 |
    sed -n 's/.*average:\([0-9.inf]*\).*/\1/p'
}
# The encode stage's own counted copies are on its summary line ("d2h N
# copies"); NVENC must have none, the host path one per frame.
encode_line() { grep -E '^  stage encode ' "$1"; }
nvenc=unknown
for pf in yuv420p rgb24; do
  out=nv-$pf
  run $out cuda --set decode.device=cuda --set encode.device=cuda --set decode.pixel_format=$pf ||
    fail "default encode on the GPU ($pf): $(tail -3 $out.err)"
  grep -Eq 'job [0-9]+ succeeded: 100 frames' $out.txt || fail "default encode ($pf) summary: $(cat $out.txt)"
  [ "$(frames $out.mp4)" = 100 ] || fail "default encode ($pf): $out.mp4 does not have 100 frames"
  if grep -q 'encoding video with h264_nvenc from device frames; frames stay on the GPU' $out.err; then
    nvenc=yes
    [ "$(vcodec $out.mp4)" = h264 ] || fail "NVENC ($pf) wrote $(vcodec $out.mp4), not h264"
    p=$(psnr $out.mp4)
    python3 -c "import sys; p = '$p'; sys.exit(0 if p and (p == 'inf' or float(p) >= 30) else 1)" ||
      fail "NVENC ($pf): PSNR against the source is '$p' dB (want >= 30)"
    ! encode_line $out.txt | grep -q d2h || fail "NVENC ($pf) downloaded frames: $(encode_line $out.txt)"
    echo "# NVENC from device $pf frames: PSNR $p dB"
  else
    nvenc=no
    line=$(grep 'encoding video with libx264 on the host, one download per frame (' $out.err) ||
      fail "default encode ($pf): no line saying NVENC or why not: $(cat $out.err)"
    [ "$(printf '%s\n' "$line" | wc -l)" = 1 ] || fail "default encode ($pf): more than one line says why: $line"
    printf '%s\n' "$line" | grep -q '"level":"warn"' || fail "default encode ($pf): the fallback is not a warning: $line"
    ! grep -v 'encoding video with libx264 on the host' $out.err | grep -q nvenc ||
      fail "default encode ($pf): FFmpeg's NVENC lines in the log besides the one line: $(cat $out.err)"
    encode_line $out.txt | grep -q 'd2h 100 copies' || fail "fallback ($pf): not one download per frame: $(encode_line $out.txt)"
    echo "# NVENC not here ($pf): $line"
  fi
done

run cu cuda --set decode.device=cuda --set encode.device=cuda --set encode.hwaccel=cuda
rc=$?
if [ $nvenc = yes ]; then
  [ $rc = 0 ] || fail "hwaccel = cuda with NVENC here: exit $rc: $(tail -3 cu.err)"
  [ "$(frames cu.mp4)" = 100 ] && [ "$(vcodec cu.mp4)" = h264 ] || fail "hwaccel = cuda: not 100 h264 frames"
else
  [ $rc = 1 ] || fail "hwaccel = cuda without NVENC: exit $rc, want 1 (the job fails)"
  # stderr is JSON lines here (not a TTY): the quotes in msg are escaped
  grep -q '"level":"error","msg":"stage \\"encode\\" .*: cu.mp4: NVENC cannot encode from device frames (hwaccel = \\"cuda\\"): ' cu.err ||
    fail "hwaccel = cuda without NVENC: the error does not name the stage and the cause: $(cat cu.err)"
  [ -z "$(ls -A | grep '^cu\.mp4')" ] || fail "hwaccel = cuda without NVENC left files: $(ls -A | grep cu.mp4)"
fi
echo "ok: gpu and hwaccel=none runs equal the CPU run; rgb24 on the GPU wrote $(stat -c %s rgb.mp4) bytes; NVENC: $nvenc"
