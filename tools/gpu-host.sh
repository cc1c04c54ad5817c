#!/usr/bin/env bash
# Run the `gpu` suite (and the GPU engine benchmark) on a GPU host that has the
# NVIDIA driver, CUDA 13, cuDNN 9 and Python with numpy/onnx/onnxruntime/torch,
# but none of Spindle's build dependencies, from a packed CUDA build (a
# `.gpu/` folder made by the pack script of the shared GPU tooling; see
# docs/gpu.md, "On a GPU host without the build dependencies").
#
#   bash .gpu/run -- bash tools/gpu-host.sh [runner args: --suite gpu --jobs 4 ...]
#
# Environment:
#   SPINDLE_TEST_STAGED  an install of the same build staged with
#                        `meson install --destdir DIR` on the build machine
#                        (cuda-example-gpu uses it: the host's meson, if any,
#                        cannot read the build directory)
#   WHEELS               a folder of wheels to install first (onnx2torch for
#                        the benchmark)
#   TEST_LIMIT           seconds for the tests (default 400), then killed
#                        with everything they started; 0: no tests, only BENCH
#   MODELS               a folder of fetched models (e.g. .bench/models from
#                        tools/prepare-gpu-bench.sh) put in the tests' model
#                        folder, so that the pipeline tests run RetinaFace and
#                        Real-ESRGAN on the GPU instead of their fallbacks
#   BENCH                a command run after the tests (e.g. the benchmark;
#                        pipeline-gpu-bench.py: docs/gpu.md, "Benchmarks")
#   LOGS                 where each test's log goes (default /tmp/spn-gpu-logs);
#                        all of them are also packed into $OUT/logs.tgz when
#                        OUT is set
set -u
export PYTHONUNBUFFERED=1
t=/tmp/spn-gpu
# The packed test list names the build machine's python3: where that path is
# missing here, put a launcher of this host's python3 there.
python3 - <<'PY'
import json, os, shutil
seen = set()
for f in ("/tmp/spn-gpu/tests.json", "/tmp/spn-gpu/benchmarks.json"):
    for t in json.load(open(f)):
        c = t["cmd"][0]
        if c in seen:
            continue
        seen.add(c)
        if not os.path.exists(c) and os.path.basename(c).startswith("python"):
            os.makedirs(os.path.dirname(c), exist_ok=True)
            with open(c, "w") as f:
                f.write("#!/bin/sh\nexec %s \"$@\"\n" % shutil.which("python3"))
            os.chmod(c, 0o755)
            print("python launcher:", c)
PY
logs=${LOGS:-/tmp/spn-gpu-logs}
export SPN_GPU_LOGS=$logs
mkdir -p "$logs" "$SPN_GPU_BUILD/meson-logs"
if [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/spn-site \
    "$WHEELS"/*.whl && export PYTHONPATH=/tmp/spn-site${PYTHONPATH:+:$PYTHONPATH}
fi
# The libraries are bundled, their pkg-config files are not: spindle.pc's
# private requirements only need to exist for --cflags/--libs.
mkdir -p /tmp/spn-pcstub
for p in libuv libzmq; do
  pkg-config --exists $p 2>/dev/null || printf 'Name: %s\nDescription: stub\nVersion: 1.0\n' $p >/tmp/spn-pcstub/$p.pc
done
export PKG_CONFIG_PATH=/tmp/spn-pcstub${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
# The tests' model folder (SPINDLE_MODEL_PATH in their environment).
if [ -n "${MODELS:-}" ] && [ -d "$MODELS" ]; then
  mkdir -p "$SPN_GPU_BUILD/test-models"
  cp "$MODELS"/*.onnx "$SPN_GPU_BUILD/test-models/" && echo "test models: $(ls "$MODELS")"
fi
# facedetect's fallback, the Haar cascade, comes with opencv-data on Debian;
# a GPU host often has OpenCV's wheel instead, which carries the same file.
hc=/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml
if [ ! -f $hc ]; then
  w=$(python3 -c 'import cv2, os; print(os.path.join(cv2.data.haarcascades, "haarcascade_frontalface_default.xml"))' 2>/dev/null)
  [ -n "$w" ] && [ -f "$w" ] && mkdir -p "$(dirname $hc)" 2>/dev/null && cp "$w" $hc 2>/dev/null &&
    echo "haar cascade: $hc from $w"
fi
# Tests meson runs alone (is_parallel: false: engine-cuda drives the GPU out
# of memory on purpose) run after the others, one at a time; the runner
# takes the two lists as two runs.
python3 - "$t/tests.json" <<'PY'
import json, sys
tests = json.load(open(sys.argv[1]))
json.dump([x for x in tests if x.get("is_parallel", True)], open("/tmp/spn-gpu/tests-par.json", "w"))
json.dump([x for x in tests if not x.get("is_parallel", True)], open("/tmp/spn-gpu/tests-ser.json", "w"))
json.dump([], open("/tmp/spn-gpu/none.json", "w"))
PY
rc=0
if [ "${TEST_LIMIT:-400}" != 0 ]; then
  # timeout signals its whole process group: the tests die with the runner
  timeout -s KILL "${TEST_LIMIT:-400}" bash -c '
    python3 .gpu/runner.py /tmp/spn-gpu/tests-par.json '"$t"'/benchmarks.json "$@"; a=$?
    python3 .gpu/runner.py /tmp/spn-gpu/tests-ser.json /tmp/spn-gpu/none.json "$@" --jobs 1; b=$?
    exit $(( a || b ))' runner "$@" || rc=$?
  echo "runner exit $rc"
fi
if [ -n "${BENCH:-}" ]; then
  set -o pipefail
  eval "$BENCH" 2>&1 | tee "$logs/bench.txt" || echo "bench exit $?"
  set +o pipefail
fi
[ -z "${OUT:-}" ] || tar czf "$OUT/logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"
exit $rc
