#!/usr/bin/env bash
# The decode and encode stages under the real runtime: configs/transcode.toml
# turns the sample clip into a new MP4 (100 frames, audio kept); a missing
# input fails the job naming the file; a failed encode leaves no output.
#   test-transcode.sh SPINDLE MEDIA_STAGE_DIR SOURCE_ROOT
set -u
spindle=$(realpath "$1") media=$(realpath "$2") src=$(realpath "$3")
fail() { echo "FAIL: $*"; exit 1; }
command -v ffprobe >/dev/null || { echo "skip: no ffprobe"; exit 77; }
export SPINDLE_PLUGIN_PATH=$media
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
clip="$src/samples/media/talking-head.mp4"

"$spindle" run "$src/configs/transcode.toml" --set decode.path="$clip" --set encode.path=out.mp4 \
  --set encode.preset=ultrafast >out.txt 2>err.txt || fail "transcode: exit $?: $(tail -3 err.txt)"
grep -Eq 'job [0-9]+ succeeded: 100 frames' out.txt || fail "summary: $(cat out.txt)"
[ "$(ffprobe -v error -select_streams v -count_frames -show_entries stream=nb_read_frames -of csv=p=0 out.mp4)" = 100 ] ||
  fail "out.mp4 does not have 100 frames"
ffprobe -v error -select_streams a -show_entries stream=codec_name -of csv=p=0 out.mp4 | grep -qx aac ||
  fail "out.mp4 has no AAC audio"
[ -z "$(ls -A | grep -v -e '^out.mp4$' -e '^out.txt$' -e '^err.txt$')" ] || fail "stray files: $(ls -A)"
# FFmpeg's own log goes through Spindle's logger: nothing of x264's or the
# AAC encoder's statistics (FFmpeg info level = Spindle debug) at the default
# level, and no "Too many bits" (the AAC rate fits the 16 kHz mono source).
! grep -Eiq 'x264|kb/s|aac|too many bits|frame I:|mov,mp4' err.txt || fail "FFmpeg lines on stderr: $(cat err.txt)"
ffprobe -v error -select_streams a -show_entries stream=bit_rate -of csv=p=0 out.mp4 |
  python3 -c "import sys; b = int(sys.stdin.read()); sys.exit(0 if 40000 <= b <= 96000 else 1)" ||
  fail "AAC bit rate of a 16 kHz mono soundtrack is not 64 kbit/s"

# encode's hwaccel: "none" on the CPU writes what the default does; a value
# it does not know, and "cuda" (NVENC from device frames) on a stage placed
# on the CPU, are refused before anything runs, naming the config position
# and the stage.
"$spindle" run "$src/configs/transcode.toml" --set decode.path="$clip" --set encode.path=none.mp4 \
  --set encode.preset=ultrafast --set encode.hwaccel=none >out.txt 2>err.txt || fail "hwaccel none: exit $?: $(tail -3 err.txt)"
cmp -s out.mp4 none.mp4 || fail "encode.hwaccel = none on the CPU wrote other bytes than the default"
rm -f none.mp4
refused() { # WHAT PATTERN ARGS...: the pipeline is refused when it loads (exit 2), PATTERN in its errors
  local what=$1 pattern=$2 rc
  shift 2
  "$spindle" run "$src/configs/transcode.toml" "$@" --set decode.path="$clip" --set encode.path=bad.mp4 \
    >out.txt 2>err.txt
  rc=$?
  [ $rc -eq 2 ] || fail "$what: exit $rc, want 2"
  grep -q "$pattern" err.txt || fail "$what: $(cat err.txt)"
}
refused "encode.hwaccel = nvenc" \
  'transcode.toml:[0-9]*:[0-9]*: stage "encode": create: hwaccel "nvenc" is not default, none or cuda' \
  --set encode.hwaccel=nvenc
refused "encode.hwaccel = cuda on the CPU" \
  'transcode.toml:[0-9]*:[0-9]*: stage "encode": create: hwaccel "cuda" (NVENC from device frames) needs ' \
  --devices cpu --set encode.hwaccel=cuda
# a matrix encode has no name for is refused when the pipeline loads, naming it
refused "encode.colorspace = rec709" 'colorspace "rec709" is not bt601, bt709, bt2020 or smpte240m' \
  --set encode.colorspace=rec709
[ -z "$(ls -A | grep bad)" ] || fail "a refused pipeline left files: $(ls -A)"

# A 1 s segment of the 4 s clip: the soundtrack taken from the whole clip is
# cut where the pictures end (within one 25 fps frame), not muxed to 4 s.
"$spindle" run "$src/configs/transcode.toml" --set decode.path="$clip" --set encode.path=seg.mp4 \
  --set encode.preset=ultrafast --set decode.duration=1.0 >out.txt 2>err.txt ||
  fail "segment: exit $?: $(tail -3 err.txt)"
vdur=$(ffprobe -v error -select_streams v -show_entries stream=duration -of csv=p=0 seg.mp4)
adur=$(ffprobe -v error -select_streams a -show_entries stream=duration -of csv=p=0 seg.mp4)
python3 -c "import sys; v, a = float('$vdur'), float('$adur'); sys.exit(0 if abs(v - 1.0) <= 0.04 and abs(a - v) <= 0.04 else 1)" ||
  fail "segment: video $vdur s, audio $adur s (want both 1 s within a frame)"
rm -f seg.mp4

# Audio through the DAG stays in sync for a segment that starts after 0: a
# source whose only sound is a 1 kHz burst at 2.50-2.60 s, cut at 2.0 s,
# has the burst at 0.50 s. The frames go through as yuv420p and as nv12 (no
# RGB round trip) and match the source (PSNR).
ffmpeg -v error -f lavfi -i testsrc=size=160x120:rate=25:duration=4 \
  -f lavfi -i "aevalsrc='if(between(t,2.5,2.6),0.5*sin(2*PI*1000*t),0)':s=48000:d=4" \
  -c:v libx264 -preset ultrafast -pix_fmt yuv420p -c:a aac -shortest burst.mp4 || fail "ffmpeg burst.mp4"
for pf in yuv420p nv12; do
  "$spindle" run "$src/configs/transcode.toml" --set decode.path=burst.mp4 --set decode.pixel_format=$pf \
    --set decode.start=2.0 --set decode.duration=1.0 --set encode.path=b.mp4 --set encode.preset=ultrafast \
    --set encode.crf=10 >out.txt 2>err.txt || fail "burst $pf: exit $?: $(tail -3 err.txt)"
  grep -Eq 'job [0-9]+ succeeded: 25 frames' out.txt || fail "burst $pf summary: $(cat out.txt)"
  ffmpeg -v error -i b.mp4 -f f32le -ac 1 -ar 48000 - >b.f32 || fail "ffmpeg decode b.mp4"
  python3 - b.f32 <<'PY' || fail "burst $pf: the audio is out of sync"
import array, sys
a = array.array("f"); a.frombytes(open(sys.argv[1], "rb").read())
win = 480  # 10 ms
e = [sum(x * x for x in a[i:i + win]) for i in range(0, len(a) - win, win)]
peak = [i for i, v in enumerate(e) if v > max(e) * 0.25]
start = peak[0] * 0.01
print(f"burst at {start:.2f} s, audio {len(a) / 48000:.2f} s")
sys.exit(0 if abs(start - 0.50) <= 0.03 and abs(len(a) / 48000 - 1.0) <= 0.05 else 1)
PY
  # the pictures are the source's 2.0-3.0 s
  ffmpeg -v error -ss 2.0 -t 1.0 -i burst.mp4 -an -f rawvideo -pix_fmt yuv420p ref.yuv || fail "ffmpeg ref"
  psnr=$(ffmpeg -hide_banner -i b.mp4 -f rawvideo -pix_fmt yuv420p -s 160x120 -r 25 -i ref.yuv -lavfi psnr -f null - 2>&1 |
    sed -n 's/.*average:\([0-9.inf]*\).*/\1/p')
  python3 -c "import sys; p = '$psnr'; sys.exit(0 if p and (p == 'inf' or float(p) > 38) else 1)" ||
    fail "burst $pf: PSNR against the source is '$psnr' dB"
  rm -f b.mp4 b.f32 ref.yuv
done

# Still images: a PNG and a JPEG decode as one-frame videos (as yuv420p and
# as rgb24, the layout a face detector takes); the frame matches the image.
ffmpeg -v error -f lavfi -i testsrc=size=96x64 -frames:v 1 still.png || fail "ffmpeg still.png"
ffmpeg -v error -f lavfi -i testsrc=size=96x64 -frames:v 1 -q:v 2 still.jpg || fail "ffmpeg still.jpg"
for img in still.png still.jpg; do
  for pf in yuv420p rgb24; do
    "$spindle" run "$src/configs/transcode.toml" --set decode.path=$img --set decode.pixel_format=$pf \
      --set encode.path=still.mp4 --set encode.crf=5 >out.txt 2>err.txt || fail "$img $pf: exit $?: $(tail -3 err.txt)"
    grep -Eq 'job [0-9]+ succeeded: 1 frame in ' out.txt || fail "$img $pf: $(cat out.txt)"
    [ "$(ffprobe -v error -select_streams v -count_frames -show_entries stream=nb_read_frames,width,height -of csv=p=0 still.mp4)" = "96,64,1" ] ||
      fail "$img $pf: not one 96x64 frame"
    psnr=$(ffmpeg -hide_banner -i still.mp4 -i $img -lavfi "[1]format=yuv420p[r];[0][r]psnr" -f null - 2>&1 |
      sed -n 's/.*average:\([0-9.inf]*\).*/\1/p')
    python3 -c "import sys; p = '$psnr'; sys.exit(0 if p and (p == 'inf' or float(p) > 30) else 1)" ||
      fail "$img $pf: PSNR against the image is '$psnr' dB"
    rm -f still.mp4
  done
done
# a truncated PNG fails naming the file
head -c 300 still.png >cut.png
"$spindle" run "$src/configs/transcode.toml" --set decode.path=cut.png --set encode.path=still.mp4 >out.txt 2>err.txt
[ $? -eq 1 ] && grep -q "\"level\":\"error\",\"msg\":\"stage .*cut.png: " err.txt || fail "truncated PNG: $(tail -3 err.txt)"

# A missing input fails the job and names the file.
"$spindle" run "$src/configs/transcode.toml" --set decode.path="$tmp/nope.mp4" --set encode.path=out2.mp4 \
  >out.txt 2>err.txt
rc=$?
[ $rc -eq 1 ] || fail "missing input: exit $rc, want 1"
grep -q "nope.mp4: no such file or directory" err.txt || fail "missing input message: $(cat err.txt)"
[ ! -e out2.mp4 ] || fail "out2.mp4 exists after a failed job"

# An encoder this FFmpeg does not have, or one that is not a video encoder,
# is refused when the pipeline loads (exit 2, naming the stage and the
# line), not at each job's first frame; nothing at the path.
for bad in "no_such_codec:video encoder 'no_such_codec' is not available in this FFmpeg" \
           "aac:'aac' is not a video encoder"; do
  codec=${bad%%:*} want=${bad#*:}
  "$spindle" run "$src/configs/transcode.toml" --set decode.path="$clip" --set encode.path=out3.mp4 \
    --set encode.codec="$codec" >out.txt 2>err.txt
  rc=$?
  [ $rc -eq 2 ] || fail "codec $codec: exit $rc, want 2"
  grep -q "transcode.toml:[0-9]*:[0-9]*: stage \"encode\": create: codec: $want" err.txt ||
    fail "codec $codec: $(cat err.txt)"
  [ ! -s out.txt ] || fail "codec $codec: a job ran: $(cat out.txt)"
  [ -z "$(ls -A | grep out3)" ] || fail "codec $codec: out3 files left: $(ls -A)"
done

# An output that can never be written (its folder does not exist; a name no
# container is known for) fails the job when it opens, before any frame is
# decoded, naming the path; nothing is left anywhere.
for bad in "$tmp/no-such-dir/out4.mp4:cannot create a temporary file beside it: No such file or directory" \
           "out4.nosuchext:cannot pick a container from this file name"; do
  path=${bad%%:*} want=${bad#*:}
  "$spindle" run "$src/configs/transcode.toml" --set decode.path="$clip" --set encode.path="$path" >out.txt 2>err.txt
  rc=$?
  [ $rc -eq 1 ] || fail "output $path: exit $rc, want 1"
  grep -Eq 'job [0-9]+ failed: 0 frames in ' out.txt || fail "output $path: not failed at 0 frames: $(cat out.txt)"
  grep -q 'edge  decode.video -> encode.video: .*; 0 messages' out.txt ||
    fail "output $path: frames were decoded for a job that could not be written: $(grep 'edge ' out.txt)"
  grep -qF "$path: $want" err.txt || fail "output $path: message: $(cat err.txt)"
  [ -z "$(ls -A | grep out4)" ] || fail "output $path: files left: $(ls -A)"
done

# Damaged media fails the job with a message naming the file and what is
# wrong; never a short success. The first third of the clip (its index is at
# the front, so it opens) is truncated.
python3 -c "import sys; d = open(sys.argv[1], 'rb').read(); open('third.mp4', 'wb').write(d[:len(d) // 3])" "$clip"
"$spindle" run "$src/configs/transcode.toml" --set decode.path=third.mp4 --set encode.path=t.mp4 \
  --set encode.audio_path= --set encode.preset=ultrafast >out.txt 2>err.txt
rc=$?
[ $rc -eq 1 ] || fail "truncated input: exit $rc, want 1: $(cat out.txt)"
grep -Eq 'third.mp4: truncated: video ends at 1\.[0-9]+ s of 4\.00 s' err.txt || fail "truncated message: $(tail -3 err.txt)"
# FFmpeg's detail about the damage is a log line of stage decode, JSON like
# every other line when logs are JSON
"$spindle" run "$src/configs/transcode.toml" --set decode.path=third.mp4 --set encode.path=t.mp4 \
  --set encode.audio_path= --log-format json >out.txt 2>err.txt
python3 - err.txt <<'PY' || fail "JSON log: $(cat err.txt)"
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip() and not l.startswith(("spindle run:", "  stage"))]
recs = [json.loads(l) for l in lines]  # every log line is JSON
ff = [r for r in recs if r.get("stage") == "decode" and "third.mp4: h264: " in r["msg"]]
assert ff and all(r["level"] == "warn" for r in ff), recs
PY
[ ! -e t.mp4 ] || fail "t.mp4 exists after a failed job"
# ... and tolerate_errors accepts it explicitly, with a warning saying so
"$spindle" run "$src/configs/transcode.toml" --set decode.path=third.mp4 --set decode.tolerate_errors=true \
  --set encode.path=t.mp4 --set encode.audio_path= --set encode.preset=ultrafast >out.txt 2>err.txt ||
  fail "tolerate_errors: exit $?: $(tail -3 err.txt)"
grep -q 'third.mp4: damaged input accepted (tolerate_errors).*truncated' err.txt || fail "no warning: $(tail -3 err.txt)"
n=$(ffprobe -v error -select_streams v -count_frames -show_entries stream=nb_read_frames -of csv=p=0 t.mp4)
[ "$n" -gt 10 ] && [ "$n" -lt 100 ] || fail "tolerated truncated input gave $n frames"
rm -f t.mp4
# a segment that starts after the end
"$spindle" run "$src/configs/transcode.toml" --set decode.path="$clip" --set decode.start=9 \
  --set encode.path=t.mp4 --set encode.preset=ultrafast >out.txt 2>err.txt
[ $? -eq 1 ] && grep -q 'talking-head.mp4: segment starts at 9.00 s, after the end of the video (4.00 s)' err.txt ||
  fail "segment past the end: $(tail -3 err.txt)"
# not media at all, an empty file, a file without video
head -c 20000 /dev/urandom >noise.mp4
: >empty.mp4
ffmpeg -v error -i "$clip" -vn -c:a copy sound.m4a || fail "ffmpeg"
for f in noise.mp4 empty.mp4 sound.m4a; do
  "$spindle" run "$src/configs/transcode.toml" --set decode.path=$f --set encode.path=t.mp4 \
    --set encode.audio_path= >out.txt 2>err.txt
  rc=$?
  [ $rc -eq 1 ] || fail "$f: exit $rc, want 1"
  # the error is printed once, by the stage: a JSON error line naming the file
  grep -q "\"level\":\"error\",\"msg\":\"stage .*$f: " err.txt ||
    fail "$f: message does not name the file: $(tail -3 err.txt)"
done
grep -q "sound.m4a: no video stream" err.txt || fail "no-video message: $(tail -2 err.txt)"

# A stream whose frame size changes mid-way (a damaged SPS; found by the
# fuzzer) fails the job naming the file and both sizes, and writes nothing.
"$spindle" run "$src/configs/transcode.toml" --set decode.path="$src/tests/media/fuzz-regress/size-change.mkv" \
  --set encode.path=sc.mp4 >out.txt 2>err.txt
rc=$?
[ $rc -eq 1 ] || fail "size change: exit $rc, want 1"
grep -q "size-change.mkv: video frame at .* is 320x1, the stream is 64x48" err.txt ||
  fail "size change message: $(grep -i error err.txt | tail -2)"
[ ! -e sc.mp4 ] || fail "sc.mp4 exists after a failed job"
[ ! -e t.mp4 ] || fail "t.mp4 exists after failed jobs"

# The input's own file as the output (a typo, or "in place"): refused before
# anything runs, exit 2, however the path is spelled, and the input is kept.
cp "$clip" own.mp4
ln own.mp4 own-hard.mp4
ln -s own.mp4 own-link.mp4
sum=$(md5sum <own.mp4)
for o in own.mp4 "$tmp/./own.mp4" own-hard.mp4 own-link.mp4; do
  "$spindle" run "$src/configs/transcode.toml" --set decode.path=own.mp4 --set encode.path="$o" >out.txt 2>err.txt
  rc=$?
  [ $rc -eq 2 ] || fail "output $o = the input: exit $rc, want 2: $(tail -2 err.txt)"
  grep -q "output \"video\" (encode.path = .*$o) is the file of input \"video\" (decode.path = .*own.mp4): a job never writes over its own input" err.txt ||
    fail "output $o = the input: $(tail -2 err.txt)"
done
[ "$(md5sum <own.mp4)" = "$sum" ] || fail "the input changed"

# HDR (an iPhone's HLG, 10-bit BT.2020): transcode's 4:2:0 frames keep the
# file's tags, so the output is still HDR; read as RGB, it is tone-mapped to
# SDR BT.709 (written as any RGB: BT.601 matrix, recorded), one line says so.
ffmpeg -v error -f lavfi -i testsrc2=s=64x48:r=25:d=0.2 -vf format=yuv420p10le -c:v libx265 \
  -x265-params log-level=error -color_primaries bt2020 -color_trc arib-std-b67 -colorspace bt2020nc hlg.mp4 ||
  fail "ffmpeg hlg.mp4"
tags() { ffprobe -v error -select_streams v -show_entries stream=color_space,color_transfer,color_primaries \
  -of csv=p=0 "$1"; }
for pf in yuv420p rgb24; do
  "$spindle" run "$src/configs/transcode.toml" --set decode.path=hlg.mp4 --set encode.path=hlg-$pf.mp4 \
    --set decode.pixel_format=$pf >out.txt 2>err.txt || fail "HDR $pf: exit $?: $(tail -3 err.txt)"
  said=$(grep -c 'hlg.mp4: HDR video (HLG transfer, bt2020 primaries) tone-mapped to SDR BT.709' err.txt)
  if [ $pf = yuv420p ]; then
    [ "$(tags hlg-$pf.mp4)" = bt2020nc,arib-std-b67,bt2020 ] || fail "HDR yuv420p: tags $(tags hlg-$pf.mp4)"
    [ "$said" = 0 ] || fail "HDR yuv420p (tags kept): tone-mapped? $(cat err.txt)"
  else
    [ "$(tags hlg-$pf.mp4)" = smpte170m,unknown,unknown ] || fail "HDR rgb24: tags $(tags hlg-$pf.mp4)"
    [ "$said" = 1 ] || fail "HDR rgb24: $said lines saying it was tone-mapped, want 1: $(cat err.txt)"
  fi
done
echo ok
