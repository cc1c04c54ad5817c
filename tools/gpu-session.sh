#!/usr/bin/env bash
# One call on a GPU host: the gpu suite, then the pipeline and engine
# benchmarks, everything a session measures, each step time-boxed, with its
# results under $OUT (at most 8 files come back from a device call). Run
# under the shared GPU tooling's `run`, from the project root, with .gpu/
# (../shared/gpu/pack, then tools/gpu-repack.sh) and .bench/
# (tools/prepare-gpu-bench.sh build-gpu --clips DIR, then
# `meson install -C build-gpu --destdir $PWD/.bench/stage`) carried:
#
#   bash .gpu/run -- bash tools/gpu-session.sh
#
# Environment (seconds unless said; 0 skips the step):
#   TL      the gpu suite (default 150; 8 at a time, the serial ones after)
#   TN      the pipeline and stage tests again with SPINDLE_CUDA_NHWC=1 (40)
#   TP      each pipeline benchmark run (90), PIPES (enhance lipsync) at
#           SIZES (720), FRAMES frames (0: the whole clip), PNHWC the
#           SPINDLE_CUDA_NHWC of Spindle's runs (default: unset); the
#           pipelines in CMPDT (lipsync) run again with
#           SPINDLE_DEVICE_THREADS=device (one thread and stream for every
#           stage on the GPU) to compare with the default (one per stage)
#   TE      the engine benchmark (170), ONLY its configurations (all), SV
#           its Spindle variants (fp16,fp16-nhwc)
# Files under $OUT: session.txt (every step's summary), suite.txt,
# suite-nhwc.txt, logs.tgz (each test's log), engine.txt, pgb-*.json
# (pgb-P-SIZE-device.json: the CMPDT runs).
set -u
export PYTHONUNBUFFERED=1
root=$PWD; b=$root/.bench
O=${OUT:-/tmp/spn-session}; mkdir -p "$O"
say() { echo "=== $(date +%T) $*" | tee -a "$O/session.txt"; }
say start
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$O/session.txt"
if ls "$b"/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/spn-site "$b"/wheels/*.whl
  export PYTHONPATH=/tmp/spn-site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "${TL:-150}" != 0 ]; then
  say suite
  MODELS=$b/models SPINDLE_TEST_STAGED=$b/stage TEST_LIMIT=${TL:-150} LOGS=/tmp/spn-gpu-logs \
    bash tools/gpu-host.sh --suite gpu --jobs 8 >"$O/suite.txt" 2>&1
  say "suite exit $?"; grep -E "^(OK|FAIL|SKIP)|passed" "$O/suite.txt" >>"$O/session.txt"
fi
if [ "${TN:-40}" != 0 ]; then
  say "pipeline and stage tests, fp16 channels-last"
  SPINDLE_CUDA_NHWC=1 TEST_LIMIT=${TN:-40} LOGS=/tmp/spn-gpu-logs-nhwc bash tools/gpu-host.sh --name enhance-gpu \
    --name lipsync-pipeline-gpu --name lipsync-crop-gpu --name superres-gpu --name facedetect-gpu --jobs 5 \
    >"$O/suite-nhwc.txt" 2>&1
  say "exit $?"; grep -E "^(OK|FAIL|SKIP)|passed" "$O/suite-nhwc.txt" >>"$O/session.txt"
fi
tar czf "$O/logs.tgz" -C /tmp $(cd /tmp && ls -d spn-gpu-logs spn-gpu-logs-nhwc 2>/dev/null) 2>/dev/null
if [ "${TP:-90}" != 0 ]; then
  export SPINDLE_MODEL_PATH=$b/models
  # cuDNN's algorithm timings, kept across the runs of this session: each
  # pipeline's first process times them, later ones read them (their
  # "cold" runs then show the cache's effect)
  export SPINDLE_CACHE_DIR=/tmp/spn-cudnn-cache
  for size in ${SIZES:-720}; do
    c=/tmp/clips-$size; mkdir -p $c
    ln -sf "$b"/clips/speech.wav "$b"/clips/talking-head-${size}p.mp4 $c/
    runs=""
    for p in ${PIPES:-enhance lipsync}; do runs="$runs $p:stage"; done
    for p in ${CMPDT-lipsync}; do runs="$runs $p:device"; done
    for r in $runs; do
      p=${r%%:*}; dt=${r#*:}; tag=$p-$size; [ "$dt" = device ] && tag=$tag-device
      say "pipeline $p ${size}p, SPINDLE_DEVICE_THREADS=$dt"
      extra=""; [ "$p" = enhance ] && extra=--gpu-decode-both
      env SPINDLE_DEVICE_THREADS=$dt ${PNHWC:+SPINDLE_CUDA_NHWC=$PNHWC} timeout "${TP:-90}" \
        python3 tests/bench/pipeline-gpu-bench.py --build "$SPN_GPU_BUILD" --clips $c --devices cuda --pipelines $p \
        --frames "${FRAMES:-0}" --repeat 2 $extra --out "$O/pgb-$tag.json" --workdir /tmp/pgb/$tag \
        >/tmp/pgb-$tag.txt 2>&1
      say "exit $?"; grep -v "UserWarning\|x = x\[pos" /tmp/pgb-$tag.txt >>"$O/session.txt"
    done
  done
fi
if [ "${TE:-170}" != 0 ]; then
  say engine
  timeout "${TE:-170}" python3 tests/bench/engine-gpu-bench.py "$SPN_GPU_BUILD" ${ONLY:+--only $ONLY} \
    --spindle "${SV:-fp16,fp16-nhwc}" --iters 20 >"$O/engine.txt" 2>&1
  say "engine exit $?"; grep -v "W1\|UserWarning\|x = x\[pos" "$O/engine.txt" >>"$O/session.txt"
fi
say end
