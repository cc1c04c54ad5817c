#!/usr/bin/env bash
# One call on a GPU host: the gpu suite, then the pipeline and engine
# benchmarks, everything a session measures, each step time-boxed and the
# whole held to a deadline, with its results under $OUT (at most 8 files come
# back from a device call). Run under the shared GPU tooling's `run`, from
# the project root, with .gpu/ (../shared/gpu/pack, then
# tools/gpu-repack.sh) and .bench/ (tools/prepare-gpu-bench.sh build-gpu
# --clips DIR, then `meson install -C build-gpu --destdir $PWD/.bench/stage`)
# carried:
#
#   bash .gpu/run -- bash tools/gpu-session.sh
#
# Environment (seconds unless said; 0 skips the step):
#   BUDGET  the whole script's deadline (default 560): a step gets at most
#           what is left of it, less 10 s to pack the results
#   TL      the gpu suite (default 150; 8 at a time, the serial ones after)
#   TN      the pipeline and stage tests again with SPINDLE_CUDA_NHWC=1 (40)
#   RUNS    benchmark runs, in order: pipeline runs PIPE:SIZE[:OPTS] and
#           engine runs engine:CONFIGS[:SECONDS]. A pipeline run's OPTS
#           is a comma list of: device (SPINDLE_DEVICE_THREADS=device: one
#           thread and stream for every stage on the GPU, the default is one
#           per stage), nhwc0 / nhwc1 (SPINDLE_CUDA_NHWC), nopeer (no Python
#           pipeline), fN (N frames; default the whole clip), tN (its time
#           box, default TP=90), blocking (CUDA_LAUNCH_BLOCKING=1).
#           A run that fails is run once more with blocking,nopeer to tell
#           an asynchronous error's launch (when time is left).
#           An engine run's CONFIGS is a '+'-list of engine-gpu-bench.py
#           configurations, SV its Spindle variants (fp16,fp16-nhwc).
#           x264:SIZE times libx264 alone: configs/transcode.toml (the
#           configs' preset, crf 20) on the upscaled output of the last
#           enhance run at SIZE, with NVDEC and with the CPU decoding: the
#           most frames/s any pipeline that encodes that output can reach
#           on this host.
#   DEVICES the pipeline runs' --devices (default cuda; cpu for a dry run of
#           this script on a build machine, with TL=0 TN=0, RUNS and
#           SPN_GPU_BUILD set)
# Files under $OUT: session.txt (every step's summary), suite.txt,
# suite-nhwc.txt, logs.tgz (each test's log, each pipeline run's logs,
# nvidia-smi dmon's utilisation a second),
# pgb.tgz (the pipeline runs' JSON), engine.txt.
set -u
export PYTHONUNBUFFERED=1
root=$PWD; b=$root/.bench
O=${OUT:-/tmp/spn-session}; mkdir -p "$O"
t0=$(date +%s); deadline=$((t0 + ${BUDGET:-560}))
say() { echo "=== $(date +%T) +$(($(date +%s) - t0))s $*" | tee -a "$O/session.txt"; }
# box N: N, or what is left before the deadline less 10 s, whichever is less
box() { local left=$((deadline - $(date +%s) - 10)); [ "$left" -lt "$1" ] && echo $left || echo "$1"; }
say start
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$O/session.txt"
if ls "$b"/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/spn-site "$b"/wheels/*.whl
  export PYTHONPATH=/tmp/spn-site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "${TL:-150}" != 0 ]; then
  say suite
  MODELS=$b/models SPINDLE_TEST_STAGED=$b/stage TEST_LIMIT=$(box "${TL:-150}") LOGS=/tmp/spn-gpu-logs \
    bash tools/gpu-host.sh --suite gpu --jobs 8 >"$O/suite.txt" 2>&1
  say "suite exit $?"; grep -E "^(OK|FAIL|SKIP|TIMEOUT)|passed" "$O/suite.txt" >>"$O/session.txt"
fi
if [ "${TN:-40}" != 0 ]; then
  say "pipeline and stage tests, fp16 channels-last"
  SPINDLE_CUDA_NHWC=1 TEST_LIMIT=$(box "${TN:-40}") LOGS=/tmp/spn-gpu-logs-nhwc bash tools/gpu-host.sh --name enhance-gpu \
    --name lipsync-pipeline-gpu --name lipsync-crop-gpu --name superres-gpu --name facedetect-gpu --jobs 5 \
    >"$O/suite-nhwc.txt" 2>&1
  say "exit $?"; grep -E "^(OK|FAIL|SKIP|TIMEOUT)|passed" "$O/suite-nhwc.txt" >>"$O/session.txt"
fi

export SPINDLE_MODEL_PATH=$b/models
# cuDNN's algorithm timings, kept across the runs of this session: each
# pipeline's first process times them, later ones read them (their "cold"
# runs then show the cache's effect)
export SPINDLE_CACHE_DIR=/tmp/spn-cudnn-cache
mkdir -p /tmp/pgbj
pipeline_run() { # PIPE SIZE OPTS
  local p=$1 size=$2 opts=$3 tag="$1-$2${3:+-${3//,/-}}" envs=() args=() tp=${TP:-90} o
  local c=/tmp/clips-$size
  mkdir -p $c; ln -sf "$b"/clips/speech.wav "$b"/clips/talking-head-${size}p.mp4 $c/
  local frames=${FRAMES:-0}
  for o in ${opts//,/ }; do
    case $o in
      device) envs+=(SPINDLE_DEVICE_THREADS=device) ;;
      nhwc0) envs+=(SPINDLE_CUDA_NHWC=0) ;;
      nhwc1) envs+=(SPINDLE_CUDA_NHWC=1) ;;
      blocking) envs+=(CUDA_LAUNCH_BLOCKING=1) ;;
      nopeer) args+=(--no-peer) ;;
      f*) frames=${o#f} ;;
      t*) tp=${o#t} ;;
    esac
  done
  [ "$p" = enhance ] && [ "$size" = 720 ] && args+=(--gpu-decode-both)
  # lipsync's Wav2Lip batch sizes on the GPU (the stage's debug lines)
  [ "$p" = lipsync ] && args+=(--log-level debug)
  local tb; tb=$(box "$tp")
  if [ "$tb" -lt 15 ]; then say "pipeline $tag: skipped (no time left)"; return 0; fi
  say "pipeline $tag (${envs[*]:-defaults}; ${tb} s)"
  env "${envs[@]}" timeout "$tb" python3 tests/bench/pipeline-gpu-bench.py --build "$SPN_GPU_BUILD" --clips $c \
    --devices "${DEVICES:-cuda}" --pipelines $p --frames "$frames" --repeat 2 "${args[@]}" --out /tmp/pgbj/$tag.json \
    --workdir /tmp/pgb/$tag >/tmp/pgb/$tag.txt 2>&1
  local rc=$?
  say "exit $rc"; grep -v "UserWarning\|x = x\[pos" /tmp/pgb/$tag.txt >>"$O/session.txt"
  if [ $rc != 0 ] || grep -q '"error"' /tmp/pgbj/$tag.json 2>/dev/null; then return 1; fi
}
engine_run() { # CONFIGS SECONDS
  local tb; tb=$(box "${2:-100}")
  if [ "$tb" -lt 20 ]; then say "engine $1: skipped (no time left)"; return 0; fi
  say "engine $1 (${tb} s)"
  timeout "$tb" python3 tests/bench/engine-gpu-bench.py "$SPN_GPU_BUILD" --only "${1//+/,}" \
    --spindle "${SV:-fp16,fp16-nhwc}" --iters 20 >>"$O/engine.txt" 2>&1
  say "engine exit $?"
}
x264_run() { # SIZE
  local src dev s e rc
  src=$(ls -t /tmp/pgb/enhance-$1*/enhance-$1p-spindle.mp4 2>/dev/null | head -1)
  if [ -z "$src" ]; then say "x264 $1: no enhance output at ${1}p to encode"; return 0; fi
  for dev in cuda cpu; do
    if [ "$(box 30)" -lt 15 ]; then say "x264 $1 on $dev: skipped (no time left)"; return 0; fi
    say "x264 alone: transcode of $src, decode on $dev"
    s=$(date +%s.%N)
    timeout "$(box 30)" "$SPN_GPU_BUILD"/core/cli/spindle run configs/transcode.toml --devices $dev \
      --set decode.path="$src" --set encode.path=/tmp/x264-$1-$dev.mp4 --set encode.crf=20 --log-format json \
      >/tmp/pgb/x264-$1-$dev.log 2>&1
    rc=$?; e=$(date +%s.%N)
    say "exit $rc, $(python3 -c "print(f'{$e - $s:.2f} s wall')"); $(grep -o '"frames":[0-9]*\|"elapsed_s":[0-9.]*\|"frames_per_s":[0-9.]*' /tmp/pgb/x264-$1-$dev.log | tail -3 | tr '\n' ' ')"
  done
}
mkdir -p /tmp/pgb
# GPU utilisation, a line a second, while the benchmarks run
(nvidia-smi dmon -s u -d 1 >/tmp/pgb/dmon.txt 2>&1 &)
# The default list: what the 2026-11-27 session left open (docs/gpu.md):
# enhance with one thread for the GPU stages (never run), lipsync both ways
# again, PyTorch's RRDBNet figures (torch.compile of it outlasts 60 s),
# Wav2Lip b128 once more, the 1080p peers; the deadline cuts the tail.
for r in ${RUNS-enhance:720 x264:720 lipsync:720 enhance:720:device,nopeer lipsync:720:device,nopeer engine:rrdbnet_x4_128:200 engine:wav2lip_b128:80 enhance:1080:f100,t100 lipsync:1080:f100,t100}; do
  IFS=: read -r p size opts <<<"$r"
  if [ "$p" = engine ]; then engine_run "$size" "${opts:-100}"; continue; fi
  if [ "$p" = x264 ]; then x264_run "$size"; continue; fi
  if ! pipeline_run "$p" "$size" "${opts:-}"; then
    case ${opts:-} in *blocking*) ;; *) pipeline_run "$p" "$size" "${opts:+$opts,}blocking,nopeer,t60" ;; esac
  fi
done
pkill -f "nvidia-smi dmon" 2>/dev/null
grep -v "W1\|UserWarning\|x = x\[pos" "$O/engine.txt" >>"$O/session.txt" 2>/dev/null

# What comes back: the logs (tests and pipeline runs, no media) and the JSON
find /tmp/pgb -name '*.log' -size -8M -o -name '*.txt' -size -8M 2>/dev/null | sed 's|^/tmp/||' >/tmp/pgb-logs.list
tar czf "$O/logs.tgz" -C /tmp $(cd /tmp && ls -d spn-gpu-logs spn-gpu-logs-nhwc 2>/dev/null) -T /tmp/pgb-logs.list 2>/dev/null
tar czf "$O/pgb.tgz" -C /tmp pgbj 2>/dev/null
say end
