#!/usr/bin/env bash
# Format negotiation (ABI 1.1), end to end through `spindle validate` and
# `spindle run` with the real media stages:
#   - decode yuv420p feeding encode runs with NO conversion: the edge is
#     negotiated as yuv420p, no convert stage appears, every frame item is
#     passed without a copy, and the output is a valid 25-frame H.264 file;
#   - decode rgb24 feeding an encode that reads bgr24 is refused at
#     validation with the input reference's file:line:col and both stages;
#   - the same with convert = "auto" (on the stage, then on the edge) runs
#     through an inserted convert stage, and the colours survive (PSNR);
#   - facedetect (rgb24 only) behind a yuv420p decode is refused the same way.
# Skipped (77) without the media stages.
#   test-negotiate.sh SPINDLE MEDIA_STAGE_DIR VISION_STAGE_DIR
set -u
spindle=$(realpath "$1") media=${2:-} vision=${3:-}
fail() { echo "FAIL: $*"; exit 1; }
[ -n "$media" ] && [ -e "$media/libspindle-decode.so" ] && [ -e "$media/libspindle-convert.so" ] ||
  { echo "skip: no media stages"; exit 77; }
media=$(realpath "$media")
export SPINDLE_PLUGIN_PATH=$media
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
ffmpeg -v error -f lavfi -i testsrc=size=160x120:rate=25:duration=1 -c:v libx264 -preset ultrafast \
  -pix_fmt yuv420p in.mp4 || fail "ffmpeg in.mp4"

pipeline() { # DECODE_FORMAT ENCODE_FORMAT [EXTRA LINE FOR ENCODE] [INPUTS]
  cat <<EOT
[[stage]]
name = "decode"
kind = "decode"
path = "in.mp4"
pixel_format = "$1"
audio = false

[[stage]]
name = "encode"
kind = "encode"
inputs = ${4:-[\"decode.video\"]}
path = "out.mp4"
preset = "ultrafast"
crf = 10
pixel_format = "$2"
${3:-}
EOT
}

# 1. yuv420p -> encode: no conversion, no copy, a valid file.
pipeline yuv420p rgb24 >yuv.toml
"$spindle" validate yuv.toml >out.txt 2>err.txt || fail "validate yuv.toml: $(cat err.txt)"
"$spindle" run yuv.toml >out.txt 2>err.txt || fail "run yuv.toml: exit $?: $(tail -3 err.txt)"
grep -Eq 'job [0-9]+ succeeded: 25 frames' out.txt || fail "yuv summary: $(cat out.txt)"
grep -q 'convert@' out.txt && fail "yuv420p -> encode inserted a conversion: $(cat out.txt)"
grep -Fxq '  edge  decode.video -> encode.video: yuv420p, host memory; 25 messages, 25 items passed' out.txt ||
  fail "yuv edge line: $(cat out.txt)"
[ "$(ffprobe -v error -select_streams v -count_frames -show_entries stream=codec_name,pix_fmt,nb_read_frames,width,height \
  -of csv=p=0 out.mp4)" = "h264,160,120,yuv420p,25" ] || fail "out.mp4 is not 25 160x120 h264 frames"
rm -f out.mp4

# 2. rgb24 -> encode reading bgr24: refused with the input's position.
pipeline rgb24 bgr24 >bgr.toml
"$spindle" validate bgr.toml >out.txt 2>err.txt && fail "bgr.toml validated"
want='bgr.toml:11:11: stage "encode": input port "video" takes bgr24, bgrf32p, nv12, yuv420p frames, but stage "decode" ("decode.video") gives rgb24: no common pixel format (set convert = "auto" on the edge or the stage to insert a conversion)'
grep -Fq "$want" err.txt || fail "validate message: $(cat err.txt)"
"$spindle" run bgr.toml >out.txt 2>err.txt
rc=$?
[ $rc -eq 2 ] || fail "run bgr.toml: exit $rc, want 2"
grep -Fq "$want" err.txt || fail "run message: $(cat err.txt)"
[ -e out.mp4 ] && fail "a refused pipeline wrote out.mp4"

# 3. convert = "auto" on the stage, then on the edge: a conversion is
# inserted, and the picture keeps its colours.
pipeline rgb24 bgr24 'convert = "auto"' >auto.toml
pipeline rgb24 bgr24 '' '[{ from = "decode.video", convert = "auto" }]' >edge.toml
for c in auto edge; do
  "$spindle" run $c.toml >out.txt 2>err.txt || fail "run $c.toml: exit $?: $(tail -3 err.txt)"
  grep -Fq '  edge  decode.video -> convert@encode.video.in: rgb24, host memory, conversion; 25 messages' out.txt ||
    fail "$c: no conversion edge: $(cat out.txt)"
  grep -Fq '  edge  convert@encode.video.out -> encode.video: bgr24, host memory; 25 messages' out.txt ||
    fail "$c: converter output edge: $(cat out.txt)"
  psnr=$(ffmpeg -hide_banner -i out.mp4 -i in.mp4 -lavfi psnr -f null - 2>&1 | sed -n 's/.*average:\([0-9.inf]*\).*/\1/p')
  python3 -c "import sys; p = '$psnr'; sys.exit(0 if p and (p == 'inf' or float(p) > 30) else 1)" ||
    fail "$c: PSNR against the source is '$psnr' dB (channels swapped?)"
  rm -f out.mp4
done

# 4. bad values are named.
pipeline rgb24 bgr24 'convert = "always"' >badc.toml
"$spindle" validate badc.toml >out.txt 2>err.txt && fail "badc.toml validated"
grep -Fq 'badc.toml:16:11: stage "encode": convert "always" is not "auto" or "none"' err.txt || fail "bad convert: $(cat err.txt)"
pipeline rgb24 bgr24 '' '[{ from = "decode.video", conver = "auto" }]' >badk.toml
"$spindle" validate badk.toml >out.txt 2>err.txt && fail "badk.toml validated"
grep -Fq 'badk.toml:11:36: stage "encode": unknown key "conver" in an input (known: from, convert)' err.txt ||
  fail "bad edge key: $(cat err.txt)"

# 5. facedetect takes rgb24 only.
if [ -n "$vision" ] && [ -e "$vision/libspindle-vision.so" ]; then
  export SPINDLE_PLUGIN_PATH=$media:$(realpath "$vision")
  cat >faces.toml <<'EOT'
[[stage]]
name = "decode"
kind = "decode"
path = "in.mp4"
pixel_format = "yuv420p"

[[stage]]
name = "faces"
kind = "facedetect"
inputs = ["decode.video"]

[[stage]]
name = "sink"
kind = "metasink"
inputs = ["faces.faces"]
EOT
  "$spindle" validate faces.toml >out.txt 2>err.txt && fail "faces.toml validated"
  grep -Fq 'faces.toml:10:11: stage "faces": input port "video" takes rgb24 frames, but stage "decode" ("decode.video") gives yuv420p: no common pixel format' err.txt ||
    fail "facedetect message: $(cat err.txt)"
  sed -i 's/^inputs = \["decode.video"\]/inputs = ["decode.video"]\nconvert = "auto"/' faces.toml
  "$spindle" validate faces.toml >out.txt 2>err.txt || fail "faces.toml with convert: $(cat err.txt)"
fi
echo "ok"
