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
#   TEST_LIMIT           seconds for the tests (default 400), then killed;
#                        0: no tests, only BENCH
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
rc=0
if [ "${TEST_LIMIT:-400}" != 0 ]; then
  timeout -s KILL "${TEST_LIMIT:-400}" python3 .gpu/runner.py $t/tests.json $t/benchmarks.json "$@" || rc=$?
  echo "runner exit $rc"
fi
if [ -n "${BENCH:-}" ]; then
  set -o pipefail
  eval "$BENCH" 2>&1 | tee "$logs/bench.txt" || echo "bench exit $?"
  set +o pipefail
fi
[ -z "${OUT:-}" ] || tar czf "$OUT/logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"
exit $rc
