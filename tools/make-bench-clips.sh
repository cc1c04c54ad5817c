#!/usr/bin/env bash
# Make the clips of the pipeline benchmark (tests/bench/pipeline-gpu-bench.py):
# a talking head at 720p and 1080p, made like samples/media/make-sample.sh
# (the public-domain astronaut photograph, an espeak-ng sentence), but 16:9
# and longer. The clips are generated, never checked in.
#
#   tools/make-bench-clips.sh OUTDIR [--seconds S] [--sizes WxH,WxH...] [--crf N]
#
#     --seconds  length of every clip and of the speech (default 10)
#     --sizes    frame sizes (default 1280x720,1920x1080); a tiny one such as
#                160x90 makes a smoke-test set
#     --crf      x264 quality of the clips (default 26)
#
# Writes into OUTDIR: speech.wav (16 kHz mono s16, exactly S seconds) and one
# talking-head-<H>p.mp4 per size (25 fps, H.264 yuv420p + AAC 16 kHz mono, the
# speech as its audio track, faststart). The picture: the astronaut scaled to
# the frame's height and centred on a dark background, with a slow zoom
# towards the face and a gentle sideways pan, so every frame differs and the
# face stays about a fifth of the frame's height (150 pixels at 720p).
#
# Needs ffmpeg (libx264, aac), espeak-ng and Debian's python3-skimage. A GPU
# host usually has none of them: make the clips on the build machine and copy
# the folder over, or make them there with tools/make-bench-clips.py (OpenCV
# and Spindle's own encoder; see docs/gpu.md, "Benchmarks"). At the default
# CRF ten seconds are about 0.5 MB at 720p and 0.9 MB at 1080p.
set -euo pipefail
out=""; seconds=10; sizes=1280x720,1920x1080; crf=26
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --crf) crf=$2; shift 2 ;;
    -*) echo "make-bench-clips.sh: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: make-bench-clips.sh OUTDIR [--seconds S] [--sizes WxH,...] [--crf N]" >&2; exit 2; }
mkdir -p "$out"

img=""
for py in /usr/bin/python3 python3; do
  d="$("$py" -c 'import skimage.data, os; print(os.path.dirname(skimage.data.__file__))' 2>/dev/null || true)"
  if [ -n "$d" ] && [ -f "$d/astronaut.png" ]; then img="$d/astronaut.png"; break; fi
done
[ -n "$img" ] || { echo "make-bench-clips.sh: astronaut.png not found (install python3-skimage)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
text="Hello. This is Spindle. It reads a video, finds the face, and moves the lips to match this voice. \
Every frame of this clip goes through the face detector, the lip sync model and the super resolution model, \
and then back into a video file."
espeak-ng -v en-us -s 150 -w "$tmp/voice.wav" "$text"
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$tmp/voice.wav" \
  -af "apad=whole_dur=$seconds" -t "$seconds" -ar 16000 -ac 1 -c:a pcm_s16le -bitexact "$out/speech.wav"

IFS=, read -r -a list <<<"$sizes"
for s in "${list[@]}"; do
  w=${s%x*}; h=${s#*x}
  case "$w$h" in *[!0-9]*|"") echo "make-bench-clips.sh: bad size $s (WxH)" >&2; exit 2 ;; esac
  # scale/pad: the square photograph at the frame's height, centred; zoompan
  # (d=1: one output frame per looped input frame, `on` its number) zooms
  # from 1.0x by 0.08% a frame and pans by up to 2% of the width.
  ffmpeg -nostdin -hide_banner -loglevel error -y \
    -loop 1 -framerate 25 -i "$img" -i "$out/speech.wav" \
    -filter_complex "[0:v]scale=$h:$h,pad=$w:$h:(ow-iw)/2:0:color=0x303848,zoompan=z='1+0.0008*on':x='(iw-iw/zoom)/2+0.02*iw*sin(on/40)':y='(ih-ih/zoom)/3':d=1:s=${w}x${h}:fps=25,format=yuv420p[v]" \
    -map "[v]" -map 1:a -t "$seconds" \
    -c:v libx264 -preset medium -crf "$crf" -g 50 \
    -c:a aac -b:a 32k -ar 16000 -ac 1 \
    -movflags +faststart -fflags +bitexact -map_metadata -1 \
    "$out/talking-head-${h}p.mp4"
done
ls -l "$out"
