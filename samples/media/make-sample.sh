#!/usr/bin/env bash
# Make the sample talking-head clip used by the media and lipsync examples.
#   samples/media/make-sample.sh [OUTDIR]    (default: this folder)
# Needs: ffmpeg (libx264, aac), espeak-ng, and Debian's python3-skimage for
# the public-domain astronaut.png (NASA photograph shipped in scikit-image).
# Writes speech.wav (16 kHz mono s16, espeak-ng) and talking-head.mp4
# (320x320, 25 fps, H.264 + AAC, the speech as its audio track), and from it
# talking-head-rot90.mp4 (a phone video: 320x240 stored, rotation metadata
# turning it upright to 240x320) and talking-head-hevc10.mp4 (HEVC Main 10,
# yuv420p10le, no audio; also needs libx265).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
mkdir -p "$out"

# scikit-image's data folder, asked of the interpreter that has it (Debian's
# python3-skimage is only visible to /usr/bin/python3), then of any python3.
img=""
for py in /usr/bin/python3 python3; do
  d="$("$py" -c 'import skimage.data, os; print(os.path.dirname(skimage.data.__file__))' 2>/dev/null || true)"
  if [ -n "$d" ] && [ -f "$d/astronaut.png" ]; then img="$d/astronaut.png"; break; fi
done
if [ -z "$img" ]; then
  echo "make-sample.sh: astronaut.png not found (install python3-skimage)" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

text="Hello. This is Spindle. It reads a video, finds the face, and moves the lips to match this voice."
espeak-ng -v en-us -s 165 -w "$tmp/voice.wav" "$text"
# 16 kHz mono, trimmed or padded with silence to exactly 4 seconds.
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$tmp/voice.wav" \
  -af "apad=whole_dur=4" -t 4 -ar 16000 -ac 1 -c:a pcm_s16le -bitexact "$out/speech.wav"

# 4 s at 25 fps: a slow zoom from 1.0x to 1.12x towards the face with a
# gentle sideways pan, so every frame differs. zoompan: d=1 emits one frame
# per (looped) input frame; `on` is the output frame number.
ffmpeg -nostdin -hide_banner -loglevel error -y \
  -loop 1 -framerate 25 -i "$img" -i "$out/speech.wav" \
  -filter_complex "[0:v]zoompan=z='1+0.0012*on':x='96+20*sin(on/30)':y='40':d=1:s=320x320:fps=25,format=yuv420p[v]" \
  -map "[v]" -map 1:a -t 4 \
  -c:v libx264 -preset medium -crf 26 -g 50 \
  -c:a aac -b:a 64k \
  -movflags +faststart -fflags +bitexact -map_metadata -1 \
  "$out/talking-head.mp4"
# A phone video: a 320x240 crop, then the rotation tag set on a stream copy
# (FFmpeg 5.1 writes the tag as the display matrix only when not encoding).
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$out/talking-head.mp4" \
  -vf crop=320:240:0:40 -c:v libx264 -preset slow -crf 26 -pix_fmt yuv420p -c:a copy "$tmp/crop.mp4"
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$tmp/crop.mp4" -c copy -metadata:s:v:0 rotate=90 \
  -movflags +faststart "$out/talking-head-rot90.mp4"
# 10-bit HEVC, as phones record HDR: NVDEC decodes it into P010.
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$out/talking-head.mp4" -an \
  -c:v libx265 -pix_fmt yuv420p10le -preset fast -crf 30 -x265-params log-level=error -tag:v hvc1 \
  -movflags +faststart "$out/talking-head-hevc10.mp4"
# The same stream tagged HDR (HLG, BT.2020), the tags set in the bitstream
# on a stream copy: NVDEC's P010 pictures of it are tone-mapped on the GPU.
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$out/talking-head-hevc10.mp4" -c copy \
  -bsf:v hevc_metadata=colour_primaries=9:transfer_characteristics=18:matrix_coefficients=9:video_full_range_flag=0 \
  -tag:v hvc1 -movflags +faststart "$out/talking-head-hlg.mp4"
# The same H.264 stream with 4:3 pixels (sample aspect ratio in the stream
# and the container, on a stream copy): shown at 426x320.
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$out/talking-head.mp4" -an -c:v copy \
  -bsf:v h264_metadata=sample_aspect_ratio=4/3 -aspect 4:3 -movflags +faststart "$out/talking-head-wide.mp4"
ls -l "$out/speech.wav" "$out/talking-head.mp4" "$out/talking-head-rot90.mp4" "$out/talking-head-hevc10.mp4" \
  "$out/talking-head-hlg.mp4" "$out/talking-head-wide.mp4"
