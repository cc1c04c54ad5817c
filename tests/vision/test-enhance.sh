#!/usr/bin/env bash
# configs/enhance.toml end to end: `spindle run` with encode.path set writes an
# MP4 that ffprobe reads back with as many frames as the sample clip, twice its
# width and height, and an audio stream. Skipped (77) without ffprobe.
#   test-enhance.sh SPINDLE VISION_STAGE_DIR MEDIA_STAGE_DIR SOURCE_ROOT
set -u
spindle=$(realpath "$1") vision=$(realpath "$2") media=$(realpath "$3") src=$(realpath "$4")
fail() { echo "FAIL: $*"; exit 1; }
command -v ffprobe >/dev/null || { echo "skip: no ffprobe"; exit 77; }
export SPINDLE_PLUGIN_PATH=$vision:$media
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
probe() { ffprobe -v error -select_streams "$2" -count_frames \
  -show_entries stream=width,height,nb_read_frames -of csv=p=0 "$1"; }
clip=$src/samples/media/talking-head.mp4
IFS=, read -r iw ih in_frames <<<"$(probe "$clip" v:0)"
"$spindle" run "$src/configs/enhance.toml" --set encode.path="$tmp/out.mp4" >out.txt 2>err.txt ||
  fail "spindle run: exit $?: $(tail -5 err.txt)"
grep -Eq "^enhance: job [0-9]+ succeeded: $in_frames frames" out.txt || fail "summary: $(cat out.txt)"
[ -s "$tmp/out.mp4" ] || fail "no $tmp/out.mp4"
IFS=, read -r ow oh out_frames <<<"$(probe "$tmp/out.mp4" v:0)"
[ "$out_frames" = "$in_frames" ] || fail "frames: $out_frames, want $in_frames"
[ "$ow" = $((2 * iw)) ] && [ "$oh" = $((2 * ih)) ] || fail "size ${ow}x$oh, want $((2 * iw))x$((2 * ih))"
[ -n "$(ffprobe -v error -select_streams a -show_entries stream=codec_type -of csv=p=0 "$tmp/out.mp4")" ] ||
  fail "no audio stream"
ls "$tmp" | grep -qx enhanced.mp4 && fail "wrote enhanced.mp4 besides encode.path"
echo "ok: ${ow}x$oh, $out_frames frames, audio"
